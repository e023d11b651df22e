/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvt_ring.h"
#include "kvtd.h"
#include "log.h"
#include "ops.h"
#include "poller.h"
#include "session.h"

static void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static void
set_need_wakeup(struct kvtd_poller *p, uint32_t flags)
{
	for (unsigned i = 0; i < p->n_sessions; i++)
		kvt_ring_set_flags(p->sessions[i]->sq, flags);
}

struct kvtd_stall {
	uint32_t head;	   /* the SQ index found unstamped */
	uint64_t since_ns; /* when; 0: not stuck */
};

enum session_state { SESSION_IDLE, SESSION_READY, SESSION_CQ_FULL, SESSION_UNSTAMPED };

/*
 * Published SQEs alone do not make a session ready: the entry at the head must carry its stamp
 * and the CQ must have room. Without either only the client can unblock it, so the poller may
 * sleep (park it) rather than spin on it.
 */
static enum session_state
session_state(struct kvtd_session *s)
{
	uint32_t cq_head;

	if (!kvtd_session_pending(s))
		return SESSION_IDLE;
	if (!kvt_ring_load_stamp(&s->sqes[s->sq_head & (s->sq_entries - 1)].stamp, s->sq_head))
		return SESSION_UNSTAMPED;
	cq_head = kvt_ring_load_head(s->cq);
	if (kvt_ring_space(s->cq_entries, cq_head, s->cq_tail) == 0)
		return SESSION_CQ_FULL;
	return SESSION_READY; /* a corrupt CQ head too: the drain reports it */
}

/*
 * Returns how many sessions can make progress; drops those whose head entry stayed unstamped
 * for KVTD_STAMP_TIMEOUT_MS, and sets *ret_timeout_ms to the next such deadline (-1: none).
 * Before sleeping this is the re-check after NEED_WAKEUP is set (kvt_ring.h).
 */
static unsigned
poller_scan(struct kvtd_poller *p, int *ret_timeout_ms)
{
	const uint64_t limit_ns = (uint64_t)KVTD_STAMP_TIMEOUT_MS * 1000000;
	uint64_t now = 0, left_ms;
	unsigned ready = 0;
	int timeout = -1;

	for (unsigned i = 0; i < p->n_sessions; i++) {
		struct kvtd_session *s = p->sessions[i];
		struct kvtd_stall *st = &p->stalls[i];
		char why[160];

		switch (session_state(s)) {
		case SESSION_READY:
			ready++;
			/* fallthrough */
		case SESSION_IDLE:
		case SESSION_CQ_FULL:
			st->since_ns = 0;
			continue;
		case SESSION_UNSTAMPED:
			break;
		}
		if (!now)
			now = kvtd_now_ns();
		if (!st->since_ns || st->head != s->sq_head) {
			st->head = s->sq_head;
			st->since_ns = now;
		}
		if (now - st->since_ns >= limit_ns) {
			snprintf(why, sizeof(why),
				 "SQ entry %u published (prod_tail) but not stamped within %u ms; "
				 "store the stamp before the tail",
				 s->sq_head, KVTD_STAMP_TIMEOUT_MS);
			kvtd_session_break(s, why);
			st->since_ns = 0;
			continue;
		}
		left_ms = (limit_ns - (now - st->since_ns) + 999999) / 1000000;
		if (timeout < 0 || left_ms < (uint64_t)timeout)
			timeout = (int)left_ms;
	}
	*ret_timeout_ms = timeout;
	return ready;
}

/*
 * The poller keeps its lock while it works and spins, so the hot loop takes no lock at all.
 * Another thread that needs the lock announces itself in p->waiters (kvtd_poller_lock()); the
 * poller checks that word each turn, steps aside until the waiter holds the lock, and queues up
 * behind it.
 */
static void
yield_to_waiters(struct kvtd_poller *p)
{
	if (!atomic_load_explicit(&p->waiters, memory_order_relaxed))
		return;
	pthread_mutex_unlock(&p->lock);
	while (atomic_load_explicit(&p->waiters, memory_order_acquire))
		cpu_relax();
	pthread_mutex_lock(&p->lock);
}

static void *
poller_main(void *arg)
{
	struct kvtd_poller *p = arg;
	const uint64_t slice_ns = (uint64_t)p->d->cfg.poller_slice_us * 1000;
	uint64_t last_work = 0;
	struct epoll_event ev[32];

	pthread_mutex_lock(&p->lock);
	unsigned idle_turns = 0, busy_turns = 0;

	while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
		unsigned work = 0;
		int timeout;

		yield_to_waiters(p);
		/* Sessions sharing the poller take turns of poller_slice_us: one client's
		 * deep queue of heavy ops (FETCH, TOPK) delays another's ops by one turn, not by
		 * the whole queue. Alone, a session drains without reading the clock. */
		for (unsigned i = 0; i < p->n_sessions; i++)
			work +=
			    kvtd_session_drain(p->sessions[i], p->n_sessions > 1 ? slice_ns : 0);
		if (work) {
			idle_turns = 0;
			/* Busy with others, the poller still drops an unstamped session in time. */
			if (!(++busy_turns & 4095))
				poller_scan(p, &timeout);
			continue;
		}
		/* Spinning: read the clock only every 32 idle turns; it costs more than a turn. */
		if (idle_turns++ == 0)
			last_work = kvtd_now_ns();
		if ((idle_turns & 31) ||
		    kvtd_now_ns() - last_work <
			(uint64_t)atomic_load_explicit(&p->spin_us, memory_order_relaxed) * 1000) {
			cpu_relax();
			continue;
		}
		idle_turns = 0;
		/* Pool slots freed while device copies still read them go back once those copies
		 * are done (an event query, no wait); allocations take them back too. */
		kvtd_pool_reclaim_fenced(&p->d->pool);
		/* Going to sleep: announce it, then look once more (pairs with the client's
		 * store-tail, fence, read-flags in kvt_submit()). Parked sessions do not keep
		 * the poller up; the timeout is the next unstamped entry's deadline. */
		set_need_wakeup(p, KVT_RING_NEED_WAKEUP);
		kvt_ring_fence();
		if (!poller_scan(p, &timeout)) {
			int n;

			p->asleep = 1;
			pthread_mutex_unlock(&p->lock);
			n = epoll_wait(p->epfd, ev, 32, timeout);
			atomic_fetch_add_explicit(&p->sleeps, 1, memory_order_relaxed);
			for (int i = 0; i < n; i++) {
				eventfd_t v;

				eventfd_read(ev[i].data.fd,
					     &v); /* non-blocking: resets the count */
			}
			pthread_mutex_lock(&p->lock);
			p->asleep = 0;
		}
		set_need_wakeup(p, 0);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

void
kvtd_poller_lock(struct kvtd_poller *p)
{
	atomic_fetch_add_explicit(&p->waiters, 1, memory_order_relaxed);
	pthread_mutex_lock(&p->lock);
	atomic_fetch_sub_explicit(&p->waiters, 1, memory_order_release);
}

void
kvtd_poller_unlock(struct kvtd_poller *p)
{
	pthread_mutex_unlock(&p->lock);
}

static void
poller_free(struct kvtd_poller *p)
{
	if (!p)
		return;
	if (p->epfd >= 0)
		close(p->epfd);
	if (p->wake_efd >= 0)
		close(p->wake_efd);
	pthread_mutex_destroy(&p->lock);
	kvtd_scratch_fini(&p->scr);
	free(p->sessions);
	free(p->stalls);
	free(p);
}

int
kvtd_pollers_start(struct kvtd *d)
{
	struct epoll_event ev = {.events = EPOLLIN};
	int r;

	d->pollers = calloc(d->cfg.pollers, sizeof(*d->pollers));
	if (!d->pollers)
		return -ENOMEM;
	for (unsigned i = 0; i < d->cfg.pollers; i++) {
		struct kvtd_poller *p = calloc(1, sizeof(*p));

		if (!p)
			return -ENOMEM;
		p->d = d;
		p->idx = i;
		p->spin_us = d->cfg.spin_us;
		pthread_mutex_init(&p->lock, NULL);
		p->epfd = epoll_create1(EPOLL_CLOEXEC);
		p->wake_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (p->epfd < 0 || p->wake_efd < 0) {
			r = -errno;
			poller_free(p);
			return r;
		}
		ev.data.fd = p->wake_efd;
		epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->wake_efd, &ev);
		r = -pthread_create(&p->thread, NULL, poller_main, p);
		if (r < 0) {
			poller_free(p);
			return r;
		}
		pthread_setname_np(p->thread, "kvtd-poller");
		d->pollers[d->n_pollers++] = p;
	}
	return 0;
}

void
kvtd_pollers_stop(struct kvtd *d)
{
	for (unsigned i = 0; i < d->n_pollers; i++) {
		struct kvtd_poller *p = d->pollers[i];

		atomic_store(&p->stop, 1);
		eventfd_write(p->wake_efd, 1);
		pthread_join(p->thread, NULL);
		poller_free(p);
	}
	free(d->pollers);
	d->pollers = NULL;
	d->n_pollers = 0;
}

int
kvtd_poller_attach(struct kvtd *d, struct kvtd_session *s)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = s->sq_efd};
	struct kvtd_poller *p = d->pollers[0];
	int r = 0;

	for (unsigned i = 1; i < d->n_pollers; i++)
		if (d->pollers[i]->n_sessions < p->n_sessions)
			p = d->pollers[i];
	kvtd_poller_lock(p);
	if (p->n_sessions == p->cap) {
		unsigned cap = p->cap ? p->cap * 2 : 8;
		void *n = realloc(p->sessions, cap * sizeof(*p->sessions));

		if (!n) {
			r = -ENOMEM;
			goto out;
		}
		p->sessions = n;
		n = realloc(p->stalls, cap * sizeof(*p->stalls));
		if (!n) {
			r = -ENOMEM; /* sessions[] grew: harmless, a later attach grows both */
			goto out;
		}
		p->stalls = n;
		p->cap = cap;
	}
	if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, s->sq_efd, &ev) < 0) {
		r = -errno;
		goto out;
	}
	/* NEED_WAKEUP must say what the poller is doing now: left set while it spins, every
	 * submit would pay a doorbell syscall (a 4x slower round trip, measured). */
	kvt_ring_set_flags(s->sq, p->asleep ? KVT_RING_NEED_WAKEUP : 0);
	p->stalls[p->n_sessions].since_ns = 0;
	p->sessions[p->n_sessions++] = s;
	s->poller = p;
	s->poller_scr = &p->scr;
out:
	kvtd_poller_unlock(p);
	return r;
}

void
kvtd_poller_detach(struct kvtd_session *s)
{
	struct kvtd_poller *p = s->poller;

	if (!p)
		return;
	kvtd_poller_lock(p);
	for (unsigned i = 0; i < p->n_sessions; i++)
		if (p->sessions[i] == s) {
			p->sessions[i] = p->sessions[--p->n_sessions];
			p->stalls[i] = p->stalls[p->n_sessions];
			break;
		}
	epoll_ctl(p->epfd, EPOLL_CTL_DEL, s->sq_efd, NULL);
	kvtd_poller_unlock(p);
	s->poller = NULL;
	s->poller_scr = NULL;
}
