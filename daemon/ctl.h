/* SPDX-License-Identifier: MIT */
/*
 * ctl.h - the control messages of a connection (ctl.c): read, checked and answered on the main
 * thread. Above listen.c (admission, HELLO), below loop.c (which polls the connections).
 */
#ifndef KVTD_CTL_H
#define KVTD_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_object;
struct kvtd;
struct kvtd_conn;

/* What a request needs of its connection (struct kvtd_ctl_def.needs). */
enum {
	KVTD_CTL_NEEDS_NONE,
	KVTD_CTL_NEEDS_NEW,	/* nothing said yet (HELLO): -EALREADY otherwise */
	KVTD_CTL_NEEDS_SESSION, /* a session, HELLO said: -ENOTCONN otherwise */
};

/*
 * struct kvtd_ctl_def - one control request type: everything checked before its handler runs,
 * for every type alike, in this order: @admin (not a check: the connection becomes an admin one
 * and its idle clock restarts), @needs, @admin_only (-EPERM for a peer that is not root,
 * kvtierd's uid or in admin_gids), the length (-EINVAL outside [@min_len, @max_len], header
 * included). Each refusal is ERROR with the errno and a message naming the type; a connection
 * that has said nothing valid yet is closed after it. @fn then checks the payload's own fields
 * and answers; it returns < 0 to close the connection. Main thread.
 */
struct kvtd_ctl_def {
	const char *name; /* as in KVT_CTL_<name> */
	uint32_t min_len, max_len;
	uint8_t needs; /* KVTD_CTL_NEEDS_* */
	bool admin;
	bool admin_only;
	int (*fn)(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd);
};

/* The row of request @type, or NULL: not a request the daemon serves (-EINVAL). */
const struct kvtd_ctl_def *kvtd_ctl_def(uint32_t type);

/* @c is readable or hung up: reads and answers every message it holds. Returns 0, or < 0 when
 * the connection is to be closed (EOF, a read error, or a refusal on a connection that has
 * not said a valid first message). */
int kvtd_ctl_ready(struct kvtd *d, struct kvtd_conn *c, int revents);
/* Sends @o (its reference is taken) as the JSON reply to request @id, or ERROR -E2BIG when the
 * text exceeds a message. */
void kvtd_ctl_reply_json(struct kvtd_conn *c, uint64_t id, struct json_object *o);

#endif
