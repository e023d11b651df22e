/* SPDX-License-Identifier: MIT */
/*
 * ctl.h - the control messages of a connection (ctl.c): read, checked and answered on the main
 * thread. Above listen.c (admission, HELLO), below loop.c (which polls the connections).
 */
#ifndef KVTD_CTL_H
#define KVTD_CTL_H

#include <stdint.h>

struct json_object;
struct kvtd;
struct kvtd_conn;

/* @c is readable or hung up: reads and answers every message it holds. Returns 0, or < 0 when
 * the connection is to be closed (EOF, a read error, or a refusal on a connection that has
 * not said a valid first message). */
int kvtd_ctl_ready(struct kvtd *d, struct kvtd_conn *c, int revents);
/* Sends @o (its reference is taken) as the JSON reply to request @id, or ERROR -E2BIG when the
 * text exceeds a message. */
void kvtd_ctl_reply_json(struct kvtd_conn *c, uint64_t id, struct json_object *o);

#endif
