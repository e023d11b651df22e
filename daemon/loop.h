/* SPDX-License-Identifier: MIT */
/*
 * loop.h - the main thread: control socket, connections and their messages, signals and the
 * periodic timer, all driven by one io_uring (poll requests; the handlers then do plain
 * non-blocking syscalls).
 */
#ifndef KVTD_LOOP_H
#define KVTD_LOOP_H

#include <stdint.h>
#include <sys/types.h>

struct kvtd;
struct kvtd_session;

/* Blocks, in the calling thread and so in every thread it starts afterwards, the signals the
 * main loop takes through its signalfd (SIGTERM, SIGINT, SIGHUP, SIGUSR2). Call it before any
 * thread is started: one that starts earlier could take them and die of the default action. */
void kvtd_loop_block_signals(void);
/* First of all at start, before the pool is allocated: locks "<socket>.lock", removes a stale
 * socket (nobody listening) and nothing else, binds and listens. Returns 0 or -errno (logged):
 * -EADDRINUSE another kvtierd holds the socket, -EEXIST something that is not a socket is at
 * the path. kvtd_loop_fini() undoes it. */
int kvtd_loop_listen(struct kvtd *d);
/* Prepares the ring, signalfd, timerfd and metrics listener, then serves the bound socket.
 * Returns 0 or -errno (logged); on failure what it set up is closed again, and the bound socket
 * is left for kvtd_loop_fini(). */
int kvtd_loop_init(struct kvtd *d);
/* Runs until SIGTERM/SIGINT. Returns 0 or -errno. */
int kvtd_loop_run(struct kvtd *d);
/* Closes every connection (ending its session), the socket (and unlinks it, if the path still
 * names the one bound) and the ring. Fine after kvtd_loop_listen() alone, after a failed
 * kvtd_loop_init(), and again after itself. */
void kvtd_loop_fini(struct kvtd *d);

/* A control connection as a restart carries it across exec (restart.c). */
struct kvtd_conn_info {
	int fd;
	int state; /* loop.c's CONN_* */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	int privileged;
	struct kvtd_session *s; /* CONN_SESSION only */
	void *conn;		/* loop.c's handle (compared with d->restart_conn) */
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
