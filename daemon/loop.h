/* SPDX-License-Identifier: MIT */
/*
 * loop.h - the main thread: control socket, connections and their messages, signals and the
 * periodic timer, all driven by one io_uring (poll requests; the handlers then do plain
 * non-blocking syscalls).
 */
#ifndef KVTD_LOOP_H
#define KVTD_LOOP_H

struct kvtd;

/* Binds the control socket and prepares the ring, signalfd and timerfd. Returns 0 or -errno
 * (logged). -EADDRINUSE: another kvtierd answers on the socket. */
int kvtd_loop_init(struct kvtd *d);
/* Runs until SIGTERM/SIGINT. Returns 0 or -errno. */
int kvtd_loop_run(struct kvtd *d);
/* Closes every connection (ending its session), the socket (and unlinks it) and the ring. */
void kvtd_loop_fini(struct kvtd *d);

#endif
