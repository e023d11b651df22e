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

#endif
