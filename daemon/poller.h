/* SPDX-License-Identifier: MIT */
/*
 * poller.h - threads that drain session rings. A poller spins while there is work and for
 * spin_us after the last of it, then sets NEED_WAKEUP on its sessions' SQs and sleeps on their
 * doorbells (epoll), so a busy client pays no syscall and an idle daemon burns no CPU.
 *
 * Published SQEs do not keep a poller awake by themselves: a session whose next entry is not
 * stamped yet, or whose CQ the client has not reaped, can only be unblocked by its client, so it
 * is parked (the poller sleeps as for an idle one) until its doorbell rings. A client that makes
 * room in a full CQ while SQEs wait must therefore ring the doorbell when NEED_WAKEUP is set, as
 * after a submit. An entry left unstamped for KVTD_STAMP_TIMEOUT_MS drops its session (-EPROTO):
 * a producer stores the stamp before the tail, so no correct client is ever in that state.
 */
#ifndef KVTD_POLLER_H
#define KVTD_POLLER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "scratch.h"

#define KVTD_STAMP_TIMEOUT_MS 2000

struct kvtd;
struct kvtd_session;
struct kvtd_stall;

struct kvtd_poller {
	struct kvtd *d;
	unsigned idx;
	pthread_t thread;
	pthread_mutex_t lock; /* guards sessions[] and their sequence/buffer state */
	struct kvtd_session **sessions;
	struct kvtd_stall *stalls; /* parallel to sessions[]: when each got stuck unstamped */
	unsigned n_sessions, cap;
	int epfd;
	int wake_efd; /* kicks the poller out of its sleep (new session, stop) */
	_Atomic int stop;
	_Atomic unsigned spin_us;
	int asleep;		  /* in epoll_wait; written with the lock held */
	_Atomic unsigned waiters; /* threads queued for the lock (kvtd_poller_lock()) */
	_Atomic uint64_t sleeps;
	struct kvtd_scratch scr; /* for the ops of its sessions (lock held) */
};

/* Any thread but the poller's own: take / release the poller's lock. */
void kvtd_poller_lock(struct kvtd_poller *p);
void kvtd_poller_unlock(struct kvtd_poller *p);

int kvtd_pollers_start(struct kvtd *d);
void kvtd_pollers_stop(struct kvtd *d);

/* Main thread: hand a session to the least-loaded poller. Returns 0 or -ENOMEM. */
int kvtd_poller_attach(struct kvtd *d, struct kvtd_session *s);
/* Main thread: take the session back; on return no poller touches it. */
void kvtd_poller_detach(struct kvtd_session *s);

#endif
