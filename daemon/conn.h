/* SPDX-License-Identifier: MIT */
/*
 * conn.h - the control connections as a restart in place sees them: what the main loop
 * (loop.c, which implements these) lets restart.c read and hand back. Its own header so that the
 * loop, which starts a restart (kvtd_restart()), and the restart, which walks and re-adopts the
 * loop's connections, each include the other's interface without including each other.
 */
#ifndef KVTD_CONN_H
#define KVTD_CONN_H

#include <stdint.h>
#include <sys/types.h>

struct kvtd;
struct kvtd_session;

/* A control connection as a restart carries it across exec (restart.c). */
struct kvtd_conn_info {
	int fd;
	int state; /* listen.h's CONN_* */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	int privileged;
	struct kvtd_session *s; /* CONN_SESSION only */
	void *conn;		/* a struct kvtd_conn (listen.h) (compared with d->restart_conn) */
};

/* Calls @fn for every open connection but those being closed or whose session broke (they
 * are left to close with the old process). Stops at the first non-zero return, returned. */
int kvtd_loop_conns(struct kvtd *d, int (*fn)(void *ctx, const struct kvtd_conn_info *ci),
		    void *ctx);
/* After kvtd_loop_init() in a restarted daemon: serve @ci again (its session, if any, is
 * attached to a poller and its uid account rebuilt). Returns 0, -EINVAL (unknown state, or a
 * session without one), -EUSERS (a limit of the new configuration), -ENOMEM. @ret_conn: the
 * new handle. On failure nothing is kept and @ci's fd and session are the caller's. */
int kvtd_loop_adopt(struct kvtd *d, const struct kvtd_conn_info *ci, void **ret_conn);
/* Sends a JSON reply (NUL-terminated @text) for request @id on a connection. */
void kvtd_loop_reply(struct kvtd *d, void *conn, uint64_t id, int err, const char *text);

#endif
