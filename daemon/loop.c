/* SPDX-License-Identifier: MIT */
/*
 * loop.c - the main thread's io_uring loop: one-shot polls on the listener, the signalfd, the
 * timerfd, the /metrics listener and every connection, each re-armed after its event; the
 * timer's deadlines (hello_timeout_ms, admin_idle_timeout_ms) and watchdog; SIGHUP (reload),
 * SIGUSR2 (restart in place), SIGTERM/SIGINT (stop); and the hooks a restart uses to walk,
 * re-adopt and answer the connections (conn.h). Admission is listen.c's, messages are ctl.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <json-c/json.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "conn.h"
#include "ctl.h"
#include "kvtd.h"
#include "listen.h"
#include "log.h"
#include "loop.h"
#include "metrics_http.h"
#include "poller.h"
#include "restart.h"
#include "session.h"

/* user_data of the fixed sources after the listener's (listen.h). */
enum { SRC_SIGNAL = KVTD_SRC_LISTEN + 1, SRC_TIMER, SRC_METRICS };

static void arm_src(struct kvtd *d, unsigned src);

/* A metrics bind that failed after a restart: tried again, each wait twice the last (to a
 * minute), each failure logged by kvtd_metrics_init(). */
static void
metrics_retry(struct kvtd *d, uint64_t now)
{
	if (kvtd_metrics_init(d) == 0) {
		d->metrics_retry_ns = 0;
		if (d->metrics_fd >= 0)
			arm_src(d, SRC_METRICS);
		return;
	}
	if (d->metrics_backoff_ns < 60000000000ULL)
		d->metrics_backoff_ns *= 2;
	d->metrics_retry_ns = now + d->metrics_backoff_ns;
}

static void
on_timer(struct kvtd *d)
{
	uint64_t now = kvtd_now_ns(), ticks;

	if (read(d->timer_fd, &ticks, sizeof(ticks)) < 0)
		return;
	sd_notify(0, "WATCHDOG=1");
	/* A connection silent past its deadline is shut down; its armed poll then reports the
	 * hangup and the normal close path frees it. */
	for (struct kvtd_conn *c = d->conns; c; c = c->next) {
		if (c->state == CONN_SESSION || !c->deadline_ns || now <= c->deadline_ns)
			continue;
		if (c->state == CONN_ADMIN) {
			log_debug("pid %d: admin connection idle for %u ms: closing", (int)c->pid,
				  d->cfg.admin_idle_timeout_ms);
			kvtd_conn_error(
			    c->fd, 0, -ETIMEDOUT,
			    "admin connection idle for %u ms (admin_idle_timeout_ms): closed",
			    d->cfg.admin_idle_timeout_ms);
		} else if (c->state == CONN_REFUSED && c->refused == -EUSERS) {
			kvtd_conn_error(
			    c->fd, 0, -EUSERS,
			    "uid %u holds %u control connections, connections_per_uid is %u",
			    (unsigned)c->uid, c->uid_conns, d->cfg.connections_per_uid);
		} else if (c->state == CONN_REFUSED) {
			kvtd_conn_error(c->fd, 0, -EACCES, "uid %u is not allowed to use kvtierd",
					(unsigned)c->uid);
		} else {
			atomic_fetch_add(&d->cnt.refused_hello_timeout, 1);
			log_info("pid %d said nothing in %u ms: closing", (int)c->pid,
				 d->cfg.hello_timeout_ms);
			kvtd_conn_error(c->fd, 0, -ETIMEDOUT, "no HELLO within %u ms",
					d->cfg.hello_timeout_ms);
		}
		shutdown(c->fd, SHUT_RDWR);
		c->deadline_ns = 0;
	}
	if (d->listen_paused == LISTEN_NOFD) /* descriptors may have freed outside our conns */
		kvtd_listen_resume(d);
	if (d->metrics_retry_ns && now >= d->metrics_retry_ns)
		metrics_retry(d, now);
	kvtd_metrics_tick(d, now);
}

static void
on_signal(struct kvtd *d)
{
	struct signalfd_siginfo si;
	char err[512];

	while (read(d->signal_fd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			sd_notify(0, "RELOADING=1");
			if (kvtd_config_reload(&d->cfg, err, sizeof(err)) < 0) {
				log_err("reload: %s (keeping the running settings)", err);
			} else {
				for (unsigned i = 0; i < d->n_pollers; i++)
					atomic_store(&d->pollers[i]->spin_us, d->cfg.spin_us);
				log_notice("reloaded %s", d->cfg.config_path);
			}
			sd_notify(0, "READY=1");
		} else if (si.ssi_signo == SIGUSR2) {
			log_notice("SIGUSR2: restarting in place");
			if (!d->restart_pending) /* a RESTART asked first: it gets the answer */
				d->restart_conn = NULL;
			d->restart_pending = 1;
		} else {
			log_notice("signal %u: stopping", si.ssi_signo);
			d->stopping = 1;
		}
	}
}

int
kvtd_loop_listen(struct kvtd *d)
{
	d->listen_fd = d->signal_fd = d->timer_fd = d->metrics_fd = d->lock_fd = -1;
	return kvtd_listen_open(d);
}

/* The signals the main loop reads from its signalfd. */
static void
loop_sigset(sigset_t *ret_mask)
{
	sigemptyset(ret_mask);
	sigaddset(ret_mask, SIGTERM);
	sigaddset(ret_mask, SIGINT);
	sigaddset(ret_mask, SIGHUP);
	sigaddset(ret_mask, SIGUSR2);
}

void
kvtd_loop_block_signals(void)
{
	sigset_t mask;

	loop_sigset(&mask);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
}

/* What kvtd_loop_init() set up, closed and reset: safe on a half-built or finished loop. */
static void
loop_release(struct kvtd *d)
{
	if (d->ring) {
		io_uring_queue_exit(d->ring);
		free(d->ring);
		d->ring = NULL;
	}
	if (d->signal_fd >= 0)
		close(d->signal_fd);
	if (d->timer_fd >= 0)
		close(d->timer_fd);
	d->signal_fd = d->timer_fd = -1;
	kvtd_metrics_fini(d);
	free(d->uids);
	d->uids = NULL;
	d->n_uids = 0;
	d->rearm = 0;
}

static const char *
src_name(unsigned src)
{
	return src == SRC_SIGNAL ? "signal" : src == SRC_TIMER ? "timer" : "metrics";
}

static int
src_fd(const struct kvtd *d, unsigned src)
{
	return src == SRC_SIGNAL ? d->signal_fd : src == SRC_TIMER ? d->timer_fd : d->metrics_fd;
}

/*
 * Polls fixed source @src again. The SQ may have no room (io_uring_submit() refused, -EBUSY
 * while completions overflow): the source is then retried at the next turn of the loop, which
 * waits with a timeout meanwhile, so that a signal or the timer is never left unwatched.
 */
static void
arm_src(struct kvtd *d, unsigned src)
{
	int r = kvtd_listen_poll(d, src_fd(d, src), src);

	if (r == 0) {
		d->rearm &= ~(1u << src);
		return;
	}
	if (!(d->rearm & (1u << src)))
		log_err("polling the %s fd: %s: retrying", src_name(src), strerror(-r));
	d->rearm |= 1u << src;
}

int
kvtd_loop_init(struct kvtd *d)
{
	unsigned tick_ms = (d->cfg.hello_timeout_ms < d->cfg.admin_idle_timeout_ms
				? d->cfg.hello_timeout_ms
				: d->cfg.admin_idle_timeout_ms) /
			   4;
	struct itimerspec its = {0};
	sigset_t mask;
	int r;

	loop_sigset(&mask);
	d->signal_fd = d->timer_fd = d->metrics_fd = -1;
	d->signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (d->signal_fd < 0) {
		r = -errno;
		log_err("signalfd: %s", strerror(-r));
		goto err;
	}
	if (tick_ms < 50)
		tick_ms = 50;
	if (tick_ms > 1000)
		tick_ms = 1000;
	d->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (d->timer_fd < 0) {
		r = -errno;
		log_err("timerfd_create: %s", strerror(-r));
		goto err;
	}
	its.it_interval.tv_sec = tick_ms / 1000;
	its.it_interval.tv_nsec = (long)(tick_ms % 1000) * 1000000;
	its.it_value = its.it_interval;
	timerfd_settime(d->timer_fd, 0, &its, NULL);
	d->ring = calloc(1, sizeof(*d->ring));
	if (!d->ring) {
		r = -ENOMEM;
		goto err;
	}
	r = io_uring_queue_init(256, d->ring, 0);
	if (r < 0) {
		free(d->ring);
		d->ring = NULL;
		log_err("io_uring_queue_init: %s", strerror(-r));
		goto err;
	}
	r = kvtd_metrics_init(d); /* logged */
	if (r < 0 && d->restoring) {
		/* Never fatal to the sessions a restart carries: /metrics comes back later. */
		log_warn("metrics_listen %s: serving without /metrics for now, trying again",
			 d->cfg.metrics_listen);
		d->metrics_backoff_ns = 1000000000ULL;
		d->metrics_retry_ns = kvtd_now_ns() + d->metrics_backoff_ns;
		r = 0;
	}
	if (r < 0)
		goto err;
	d->n_uids = d->cfg.max_sessions;
	d->uids = calloc(d->n_uids, sizeof(*d->uids));
	if (!d->uids) {
		r = -ENOMEM;
		goto err;
	}
	d->listen_armed = kvtd_listen_poll(d, d->listen_fd, KVTD_SRC_LISTEN) == 0;
	d->listen_paused = d->listen_armed ? 0 : LISTEN_NOFD; /* else the timer arms it */
	/* An empty SQ of 256 entries takes these; if not, the loop retries them (arm_src()). */
	arm_src(d, SRC_SIGNAL);
	arm_src(d, SRC_TIMER);
	if (d->metrics_fd >= 0)
		arm_src(d, SRC_METRICS);
	log_notice("listening on %s (mode %04o%s%s)", d->cfg.socket_path, d->cfg.socket_mode,
		   d->cfg.socket_group[0] ? ", group " : "", d->cfg.socket_group);
	return 0;

err:
	loop_release(d); /* the listener stays: kvtd_loop_fini() is its undo */
	return r;
}

int
kvtd_loop_run(struct kvtd *d)
{
	while (!d->stopping) {
		struct io_uring_cqe *cqe;
		uint64_t ud;
		int res, r;

		for (unsigned src = SRC_SIGNAL; d->rearm && src <= SRC_METRICS; src++)
			if (d->rearm & (1u << src))
				arm_src(d, src);
		io_uring_submit(d->ring);
		if (d->rearm) {
			/* a source waits for room in the SQ: come back soon to retry it */
			struct __kernel_timespec ts = {.tv_nsec = 10 * 1000000};

			r = io_uring_wait_cqe_timeout(d->ring, &cqe, &ts);
			if (r == -ETIME)
				continue;
		} else {
			r = io_uring_wait_cqe(d->ring, &cqe);
		}
		if (r == -EINTR)
			continue;
		if (r < 0) {
			log_err("io_uring_wait_cqe: %s", strerror(-r));
			return r;
		}
		ud = io_uring_cqe_get_data64(cqe);
		res = cqe->res;
		io_uring_cqe_seen(d->ring, cqe);
		switch (ud) {
		case KVTD_SRC_LISTEN:
			d->listen_armed = 0;
			kvtd_listen_accept(d); /* re-arms the poll, unless it pauses the listener */
			break;
		case SRC_SIGNAL:
			on_signal(d);
			arm_src(d, SRC_SIGNAL);
			break;
		case SRC_TIMER:
			on_timer(d);
			arm_src(d, SRC_TIMER);
			break;
		case SRC_METRICS:
			kvtd_metrics_serve(d);
			arm_src(d, SRC_METRICS);
			break;
		default: {
			struct kvtd_conn *c = (struct kvtd_conn *)(uintptr_t)ud;

			if (kvtd_metrics_owns(ud)) {
				kvtd_metrics_event(d, ud, res);
				break;
			}

			if (res < 0 || kvtd_ctl_ready(d, c, res) < 0 ||
			    (res & (POLLHUP | POLLRDHUP))) {
				kvtd_conn_close(d, c);
			} else if ((r = kvtd_listen_poll(d, c->fd, ud)) < 0) {
				/* unwatched, it would hang: its peer reconnects */
				log_warn(
				    "connection of pid %d: cannot poll it again (%s): closing it",
				    (int)c->pid, strerror(-r));
				kvtd_conn_close(d, c);
			}
		}
		}
		if (d->restart_pending) {
			/* the asker, unless it hung up in this turn (kvtd_conn_close() forgets it)
			 */
			void *asker = d->restart_conn;

			d->restart_pending = 0;
			r = kvtd_restart(d); /* returns only when the restart failed */
			d->restart_conn = NULL;
			if (!asker && r == -EOPNOTSUPP) {
				/* systemctl reload sends SIGUSR2: where a restart in place cannot
				 * be done, it still re-reads the configuration, as SIGHUP does */
				log_notice("SIGUSR2: reloading the configuration instead");
				kill(getpid(), SIGHUP);
			}
			if (asker) {
				char msg[512];

				if (d->restart_why[0])
					snprintf(msg, sizeof(msg),
						 "restart refused: %s (kvtierd keeps running, "
						 "every session kept)",
						 d->restart_why);
				else
					snprintf(msg, sizeof(msg),
						 "restart failed: %s (kvtierd keeps running; "
						 "see its log)",
						 strerror(-r));
				kvtd_loop_reply(d, asker, d->restart_req_id, r, msg);
			}
		}
	}
	return 0;
}

void
kvtd_loop_fini(struct kvtd *d)
{
	while (d->conns)
		kvtd_conn_close(d, d->conns);
	kvtd_listen_close(d);
	loop_release(d);
}

int
kvtd_loop_conns(struct kvtd *d, int (*fn)(void *ctx, const struct kvtd_conn_info *ci), void *ctx)
{
	for (struct kvtd_conn *c = d->conns; c; c = c->next) {
		struct kvtd_conn_info ci = {c->fd,  c->state,	   c->pid, c->uid,
					    c->gid, c->privileged, c->s,   c};
		int r;

		if (!c->deadline_ns && c->state != CONN_SESSION)
			continue; /* being closed */
		if (c->s && c->s->broken)
			continue;
		r = fn(ctx, &ci);
		if (r)
			return r;
	}
	return 0;
}

int
kvtd_loop_adopt(struct kvtd *d, const struct kvtd_conn_info *ci, void **ret_conn)
{
	uint64_t now = kvtd_now_ns();
	struct kvtd_conn *c;
	int r;

	if (ci->state < CONN_NEW || ci->state > CONN_ADMIN ||
	    (ci->state == CONN_SESSION) != !!ci->s)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = ci->fd;
	c->state = ci->state;
	c->pid = ci->pid;
	c->uid = ci->uid;
	c->gid = ci->gid;
	c->privileged = ci->privileged;
	if (ci->state == CONN_ADMIN)
		c->deadline_ns = now + (uint64_t)d->cfg.admin_idle_timeout_ms * 1000000;
	else if (ci->state != CONN_SESSION)
		c->deadline_ns = now + (uint64_t)d->cfg.hello_timeout_ms * 1000000;
	if (ci->s) {
		/* Kept even past a lowered limit: a restart does not end sessions. */
		c->uid_ent = kvtd_uid_get(d, c->uid);
		if (!c->uid_ent) {
			free(c);
			return -EUSERS;
		}
		c->uid_ent->sessions++;
		/* what the restore claimed was charged to the session only: the uid's share. Under
		 * the pool lock, as every account: sessions adopted before this one already run
		 * on pollers and charge the same uid. */
		pthread_mutex_lock(&d->pool.lock);
		c->uid_ent->acct.bytes += ci->s->acct.bytes;
		pthread_mutex_unlock(&d->pool.lock);
		/* and its pool classes, counted among the uid's (classes_per_uid) */
		kvtd_session_uid_join(ci->s, c->uid_ent);
		ci->s->sock = c->fd;
		r = kvtd_poller_attach(d, ci->s);
		if (r < 0) {
			pthread_mutex_lock(&d->pool.lock);
			c->uid_ent->acct.bytes -= ci->s->acct.bytes;
			pthread_mutex_unlock(&d->pool.lock);
			kvtd_session_uid_leave(ci->s);
			c->uid_ent->sessions--;
			free(c);
			return r;
		}
		c->s = ci->s;
		d->n_sessions++;
	}
	if (kvtd_listen_poll(d, c->fd, (uint64_t)(uintptr_t)c) < 0) {
		if (c->s) {
			kvtd_poller_detach(c->s);
			c->uid_ent->acct.bytes -= c->s->acct.bytes;
			kvtd_session_uid_leave(c->s);
			c->uid_ent->sessions--;
			d->n_sessions--;
		}
		free(c);
		return -EBUSY;
	}
	c->next = d->conns;
	if (d->conns)
		d->conns->prev = c;
	d->conns = c;
	d->n_conns++;
	*ret_conn = c;
	return 0;
}

void
kvtd_loop_reply(struct kvtd *d, void *conn, uint64_t id, int err, const char *text)
{
	struct kvtd_conn *c = conn;

	if (err < 0) {
		kvtd_conn_error(c->fd, id, err, "%s", text);
		return;
	}
	kvtd_ctl_reply_json(c, id, json_tokener_parse(text));
}
