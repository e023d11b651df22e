/* SPDX-License-Identifier: MIT */
/*
 * restart.h - restart in place without losing a row.
 *
 * `kvtierctl restart` (RESTART, admin only) or SIGUSR2 re-executes the binary kvtierd was started
 * from (so an upgraded one is picked up), same pid, with the original arguments plus
 * `--restore-fd N`. Everything a session lives on crosses the exec as open descriptors: the
 * listening socket and its lock, each connection socket, each session's region memfd and
 * doorbells, each host buffer's memfd, and the pool (a memfd, pool.c). Clients keep their
 * connection, rings and mappings and see a pause, not a reconnect.
 *
 * Before the exec the main thread takes every poller's lock (the op in progress finishes; SQEs
 * not yet drained stay in the rings for the next process) and writes the rest of the state into
 * an image, a memfd: daemon counters and ids; per connection its peer and state; per session
 * its private ring indices, buffers and sequences; per sequence its parameters, tier state and
 * the pool offset of every position's slot; the prefix store's namespaces and blocks (their
 * slots' offsets), each session's namespace handles and pins, each sequence's namespace and the
 * block each shared position references. The new process maps the pool again, claims those
 * slots back (kvtd_pool_claim()), rebuilds the retrieval indexes by encoding the same keys
 * again, and serves the same connections.
 *
 * The image (restart_image.h, which describes its records once for the writer and the reader)
 * starts with a fixed header (magic, image version, daemon version, size, checksum).
 * An image the new process does not understand, or a short or corrupt one, is refused with a
 * log line saying why, and every descriptor it inherited is closed: the old sessions end
 * (clients see ECONNRESET) and the daemon starts empty, rather than guess.
 *
 * Not carried: the CUDA backend's registrations, IPC mappings and events (restart is refused
 * there, -EOPNOTSUPP, and the daemon keeps running), the /metrics listener (opened again).
 *
 * The fallback: a new process that fails before it takes the sessions over (a binary that exits
 * or crashes at start, a configuration or image it refuses, a restore that fails, or no verdict
 * within KVTD_TAKEOVER_S) never costs a session. Before the exec the old process clones a
 * watcher (the teardown child) that keeps a copy of every carried descriptor, the image and the
 * old binary (opened at start, so a binary since replaced on disk is still the one run). The new
 * process is handed a pipe (KVTD_WATCH_ENV) on which it writes 'R' once it has restored
 * everything and before any session is served (the point of no return: until then it has
 * changed nothing a client or the image depends on), or 'F' and a reason before it exits. On
 * 'R' the watcher lets go; on 'F', or the pipe's end without a verdict (the process died), it
 * executes the old binary from its descriptor with the same image and KVTD_FALLBACK_ENV set to
 * the reason: that process restores every session (at the watcher's pid), answers the RESTART
 * with -ECANCELED naming the cause, and logs it. A new binary whose pre-flight did not say it
 * writes the verdict (an older kvtierd) is watched only for dying: no verdict in time lets go.
 * Under systemd (NotifyAccess=main) the watcher is the main pid from before the exec until it
 * lets go: the old process hands it over (MAINPID=, then a barrier), and the watcher hands it
 * back to the restarted pid before it lets go, which the new process, serving already, waits
 * for (the end of a second pipe) before its READY=1. The death of a failed new process is then not
 * the main process's, and a fallback is the main pid already.
 */
#ifndef KVTD_RESTART_H
#define KVTD_RESTART_H

#include <stddef.h>
#include <stdint.h>

struct kvtd;
struct kvtd_image;

/* At start, before the options are parsed: removes a trailing "--restore-fd N" from argv and
 * returns N, or -1 when absent. */
int kvtd_restart_take_fd(int *argc, char **argv);
/* At start, before the options are parsed: removes a trailing "--check-restart" from argv and
 * returns 1, or 0 when absent. With it, kvtierd only reads its configuration and, when a
 * restart in place into this binary could go ahead, prints KVTD_RESTART_READY and the image
 * version it reads, exiting 0 (kvtd_restart()'s pre-flight). */
int kvtd_restart_take_check(int *argc, char **argv);
#define KVTD_RESTART_READY "kvtierd-restart-ready image"
/* After the image version on the readiness line: this binary writes the takeover verdict. */
#define KVTD_RESTART_VERDICT "verdict"
#define KVTD_WATCH_ENV	     "KVTIERD_RESTART_WATCH"	/* the verdict pipe's descriptor */
#define KVTD_FALLBACK_ENV    "KVTIERD_RESTART_FALLBACK" /* why the new binary failed */
#define KVTD_TAKEOVER_S	     120 /* the longest a new process may take to take over */
/* At start: the verdict pipe named in KVTD_WATCH_ENV (close-on-exec from here on), or -1, with
 * the pipe whose end says the watcher handed systemd's main pid back (*ret_ack, -1: none), and
 * the fallback reason in KVTD_FALLBACK_ENV (a copy, or NULL); both variables are removed. */
int kvtd_restart_take_watch(int *ret_ack);
char *kvtd_restart_take_fallback(void);
/* A process started by a restart with a watcher that cannot take over: writes 'F' and @why to
 * the watcher and exits, so the old binary takes over with every session. Returns (having
 * done nothing) when there is no watcher. */
void kvtd_restart_give_up(struct kvtd *d, const char *why);
/* A process started by a restart, under systemd, before its READY=1: waits (10 s at most) until
 * the watcher has handed the main pid back. Returns at once otherwise. */
void kvtd_restart_await_main(struct kvtd *d);
/* At start: remember the binary (/proc/self/exe) and the arguments to execute again. */
void kvtd_restart_record(struct kvtd *d, int argc, char **argv);

/*
 * kvtd_restart() - main thread: quiesce, write the image, exec. Returns only when the restart
 * could not happen (the daemon then serves on as before): -EOPNOTSUPP (CUDA backend, or a pool
 * that is not a memfd), -ENOMEM, or the failing call's -errno (logged).
 */
int kvtd_restart(struct kvtd *d);

/* A refused image: closes every descriptor above stderr that the exec left open, so the old
 * sessions' clients see their connection end. Only at start, before anything is opened. */
void kvtd_restart_drop_inherited(void);

/* Restore, in this order: the listening socket (instead of kvtd_loop_listen()), the pool
 * (instead of kvtd_pool_init()), then, after kvtd_loop_init() and kvtd_pollers_start(), the
 * connections and sessions. The last one drops every old session when any of them cannot be
 * restored (logged) and returns that error; the daemon then serves with an empty pool. */
int kvtd_restart_listener(struct kvtd *d, const struct kvtd_image *img);
int kvtd_restart_pool(struct kvtd *d, const struct kvtd_image *img);
int kvtd_restart_sessions(struct kvtd *d, struct kvtd_image *img);

#endif
