/* SPDX-License-Identifier: MIT */
/*
 * kvtd.h - struct kvtd owns one instance of every daemon subsystem; it is passed explicitly,
 * there is no daemon-wide global (log level aside, see log.h).
 *
 * Ownership and locking in one place:
 * - The main thread (loop.c) owns connections, the listening socket and session lifetimes.
 * - A poller owns the sessions assigned to it; its mutex guards their sequences and buffer
 *   tables. The main thread takes it to register buffers, to read stats and to detach a session
 *   before freeing it, so a session is never freed while a poller is draining it.
 * - The pool has its own mutex (pool.h). Counters are atomics.
 */
#ifndef KVTD_H
#define KVTD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "opstats.h"
#include "pool.h"
#include "prefix.h"

struct kvt_dev;
struct kvtd_poller;
struct kvtd_conn;
struct kvtd_metrics;
struct kvtd_spill;
struct io_uring;

struct kvtd_uid {
	uid_t uid;
	unsigned sessions; /* 0: entry free */
	struct kvtd_acct acct;
	const char *limit_key;	 /* the setting acct.limit comes from (refusals name it) */
	struct kvtd_cls_use cls; /* the pool classes its sessions use (classes_per_uid) */
};

struct kvtd_counters {
	_Atomic uint64_t ops;
	_Atomic uint64_t errors;
	_Atomic uint64_t refused_einval;
	_Atomic uint64_t refused_auth;
	_Atomic uint64_t refused_hello_timeout;
	_Atomic uint64_t refused_limit;
	_Atomic uint64_t sessions_total;
	_Atomic uint64_t ring_corrupt;
};

struct kvtd {
	struct kvtd_config cfg;
	struct kvt_dev *dev;
	struct kvtd_pool pool;
	struct kvtd_prefix prefix; /* shared prefix blocks, over the pool (prefix.h) */
	struct kvtd_spill *spill;  /* [spill] store (spill.h), NULL when not configured */
	struct kvtd_poller **pollers;
	unsigned n_pollers;
	struct kvtd_counters cnt;
	uint64_t start_ns;
	struct kvtd_op_stats opst_ended; /* main thread: of the sessions that ended (opstats.h) */

	/* main thread only */
	struct io_uring *ring;
	int listen_fd, signal_fd, timer_fd;
	int lock_fd;	/* flock on "<socket>.lock": one daemon per socket path */
	dev_t sock_dev; /* the socket file bound, so exit unlinks that one only */
	ino_t sock_ino;
	int metrics_fd;		      /* HTTP /metrics (metrics_http.c), -1 when off */
	unsigned metrics_port;	      /* the port it listens on */
	struct kvtd_metrics *metrics; /* its scrapers (metrics_http.c) */
	int stopping;
	struct kvtd_conn *conns;
	unsigned n_conns;  /* bounded by cfg.max_connections */
	int listen_armed;  /* a poll on listen_fd is in flight */
	int listen_paused; /* not accepting: LISTEN_FULL or LISTEN_NOFD (listen.h) */
	unsigned rearm;	   /* 1 << SRC_*: fixed sources whose poll awaits room in the SQ (loop.c) */
	unsigned n_sessions;
	uint32_t next_session_id;
	struct kvtd_uid *uids; /* n_uids entries; accounts updated under the pool lock */
	unsigned n_uids;       /* cfg.max_sessions, or more: a restart keeps every session's uid */

	/* restart (restart.c) */
	char exe[4096]; /* the binary started, re-executed by a restart */
	int exe_fd;	/* that binary, opened at start: a failed restart's fallback (restart.c) */
	int watch_fd;	/* started by a restart: the pipe to the old process's watcher, -1 */
	int watch_ack_fd; /* under systemd: its end means the watcher handed the main pid back */
	char **argv;	  /* its arguments, without --restore-fd */
	int argc;
	int restart_pending;	     /* SIGUSR2 or RESTART seen: restart at the next turn */
	void *restart_conn;	     /* the connection that asked (loop.c), NULL for SIGUSR2 */
	uint64_t restart_req_id;     /* its request id */
	uint32_t restarts;	     /* restarts since the first start */
	uint64_t restart_started_ns; /* when the last restart began (CLOCK_MONOTONIC) */
	char restart_why[384];	     /* why the last restart was refused, for its asker */
	char *fell_back;	     /* started as a fallback: why the new binary failed (owned) */
	int restoring;		     /* started by a restart: its sessions come from an image */
	uint64_t metrics_retry_ns;   /* after a restart, the next try of a failed metrics bind */
	uint64_t metrics_backoff_ns; /* and the wait after it (doubles up to a minute) */
};

uint64_t kvtd_now_ns(void);
/* Main thread: queues a poll for @events on @fd, completing with @user_data, on d->ring. A full SQ
 * is submitted once to make room. Returns 0, or -EBUSY when the SQ stays full (the kernel holds
 * back completions): the caller tries again at a later turn of the loop. */
int kvtd_ring_poll(struct kvtd *d, int fd, unsigned events, uint64_t user_data);

#endif
