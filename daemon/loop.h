/* SPDX-License-Identifier: MIT */
/*
 * loop.h - the main thread: control socket, connections and their messages, signals and the
 * periodic timer, all driven by one io_uring (poll requests; the handlers then do plain
 * non-blocking syscalls).
 */
#ifndef KVTD_LOOP_H
#define KVTD_LOOP_H

struct kvtd;

/* First of all at start, before the pool is allocated: locks "<socket>.lock", removes a stale
 * socket (nobody listening) and nothing else, binds and listens. Returns 0 or -errno (logged):
 * -EADDRINUSE another kvtierd holds the socket, -EEXIST something that is not a socket is at
 * the path. kvtd_loop_fini() undoes it. */
int kvtd_loop_listen(struct kvtd *d);
/* Prepares the ring, signalfd, timerfd and metrics listener, then serves the bound socket.
 * Returns 0 or -errno (logged). */
int kvtd_loop_init(struct kvtd *d);
/* Runs until SIGTERM/SIGINT. Returns 0 or -errno. */
int kvtd_loop_run(struct kvtd *d);
/* Closes every connection (ending its session), the socket (and unlinks it, if the path still
 * names the one bound) and the ring. Fine after kvtd_loop_listen() alone. */
void kvtd_loop_fini(struct kvtd *d);

#endif
