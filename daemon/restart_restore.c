/* SPDX-License-Identifier: MIT */
/*
 * restart_restore.c - restart in place (restart.h), the new process's side: the listening
 * socket, the pool, then every connection, session, buffer, sequence and prefix block rebuilt
 * from the image's records (restart_image.h). All or none before any is served: when one cannot
 * be restored the sessions go back to the old binary through the watcher (restart.c), or, with
 * no watcher, are all dropped and the daemon starts with an empty pool.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "conn.h"
#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvt_ring.h"
#include "kvt_version.h"
#include "kvtd.h"
#include "log.h"
#include "poller.h"
#include "restart.h"
#include "restart_image.h"
#include "restart_int.h"
#include "seq.h"
#include "session.h"

void
kvtd_restart_drop_inherited(void)
{
	kvtd_restart_reaper_start();
	DIR *dir = opendir("/proc/self/fd");
	int fds[1024], n = 0;
	struct dirent *e;

	if (!dir)
		return;
	while ((e = readdir(dir)) && n < 1024) {
		int fd = atoi(e->d_name);

		if (fd > 2 && fd != dirfd(dir))
			fds[n++] = fd;
	}
	closedir(dir);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	if (n == 1024)
		kvtd_restart_drop_inherited();
}

static int
fd_valid(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

int
kvtd_restart_listener(struct kvtd *d, const struct kvtd_image *img)
{
	d->listen_fd = d->signal_fd = d->timer_fd = d->metrics_fd = d->lock_fd = -1;
	d->restoring = 1;
	if (!fd_valid(img->d.listen_fd) || !fd_valid(img->d.lock_fd)) {
		log_err("restart: the listening socket or its lock did not cross the exec");
		return -EBADF;
	}
	d->listen_fd = img->d.listen_fd;
	d->lock_fd = img->d.lock_fd;
	d->sock_dev = (dev_t)img->d.sock_dev;
	d->sock_ino = (ino_t)img->d.sock_ino;
	fcntl(d->listen_fd, F_SETFD, FD_CLOEXEC);
	fcntl(d->lock_fd, F_SETFD, FD_CLOEXEC);
	return 0;
}

int
kvtd_restart_pool(struct kvtd *d, const struct kvtd_image *img)
{
	int r;

	if (!fd_valid(img->d.pool_fd))
		return -EBADF;
	fcntl(img->d.pool_fd, F_SETFD, FD_CLOEXEC);
	if (img->d.pool_size != d->cfg.pool_size)
		log_warn("restart: keeping the pool of %llu MiB (the configuration now says %llu "
			 "MiB: a new size takes a full restart)",
			 (unsigned long long)(img->d.pool_size >> 20),
			 (unsigned long long)(d->cfg.pool_size >> 20));
	r = kvtd_pool_adopt(&d->pool, &d->cfg, d->dev, img->d.pool_fd, img->d.pool_size,
			    img->d.chunk_size, (int)img->d.pool_hugetlb);
	if (r < 0)
		close(img->d.pool_fd);
	return r;
}

/* Closes what a record still owns (the restore gave up on it). */
static void
conn_drop_fds(struct img_conn *c)
{
	for (unsigned i = c->bufs_done; i < c->s.n_bufs; i++)
		close(c->bufs[i].fd);
	c->bufs_done = c->s.n_bufs;
	if (c->f.has_session && !c->fds_owned) {
		close(c->s.memfd);
		close(c->s.sq_efd);
		close(c->s.cq_efd);
		c->fds_owned = 1;
	}
}

/* A configuration read again may have lowered buffers_per_session or seqs_per_session: the
 * session keeps the ids it has (new ones obey the new limits). */
static int
grow_tables(struct kvtd_session *s, const struct img_conn *c)
{
	uint32_t nb = 0, nq = 0;

	for (uint32_t i = 0; i < c->s.n_bufs; i++)
		nb = c->bufs[i].id > nb ? c->bufs[i].id : nb;
	for (uint32_t i = 0; i < c->s.n_seqs; i++)
		nq = c->seqs[i].f.id > nq ? c->seqs[i].f.id : nq;
	if (nb > 65536 || nq > 65536)
		return -EBADMSG;
	if (nb > s->max_bufs) {
		void *p = realloc(s->bufs, nb * sizeof(*s->bufs));

		if (!p)
			return -ENOMEM;
		s->bufs = p;
		memset(s->bufs + s->max_bufs, 0, (nb - s->max_bufs) * sizeof(*s->bufs));
		log_warn("restart: session %u keeps %u buffer ids (buffers_per_session is %u now)",
			 s->id, nb, s->max_bufs);
		s->max_bufs = nb;
	}
	if (nq > s->max_seqs) {
		void *p = realloc(s->seqs, nq * sizeof(*s->seqs));

		if (!p)
			return -ENOMEM;
		s->seqs = p;
		memset(s->seqs + s->max_seqs, 0, (nq - s->max_seqs) * sizeof(*s->seqs));
		log_warn("restart: session %u keeps %u sequence ids (seqs_per_session is %u now)",
			 s->id, nq, s->max_seqs);
		s->max_seqs = nq;
	}
	return 0;
}

/* The namespace restored with @id (prefix_restore() gave each image namespace its id), in
 * O(1): a session's handles are found without a walk of every namespace. */
static struct kvtd_pns *
ns_by_id(const struct kvtd_image *img, uint32_t id)
{
	return img->px_store ? kvtd_prefix_ns_by_id(img->px_store, id) : NULL;
}

/* The prefix store's namespaces and blocks, slots claimed for the store (no reference yet). */
static int
prefix_restore(struct kvtd *d, struct kvtd_image *img)
{
	struct kvtd_prefix *px = &d->prefix;
	int r;

	img->px_store = px;
	for (uint32_t i = 0; i < img->px.n_ns; i++) {
		r = kvtd_prefix_restore_ns(px, &img->ns[i].f.p, img->ns[i].f.scope, img->ns[i].f.id,
					   img->ns[i].f.cnt, &img->ns[i].ns);
		if (r < 0)
			return r;
	}
	for (uint32_t i = 0; i < img->px.n_blk; i++) {
		uint64_t off[KVT_BLOCK_TOKENS_MAX];
		uint32_t bt = img->ns[img->blk[i].f.ns].f.p.block_tokens;

		memcpy(off, img->blk[i].off, (size_t)bt * 8); /* unaligned in the image */
		r = kvtd_prefix_restore_block(px, img->ns[img->blk[i].f.ns].ns, &img->blk[i].f.key,
					      off, &img->blocks[i]);
		if (r < 0)
			return r;
	}
	px->lookups = img->px.cnt[0];
	px->hit_blocks = img->px.cnt[1];
	px->miss_blocks = img->px.cnt[2];
	px->published = img->px.cnt[3];
	px->deduped = img->px.cnt[4];
	px->evicted = img->px.cnt[5];
	px->refused_budget = img->px.cnt[6];
	return 0;
}

/* A session rebuilt from @c: region, doorbells, indices, buffers, sequences (slots claimed). */
static int
session_restore(struct kvtd *d, struct kvtd_image *img, struct img_conn *c)
{
	struct kvtd_session *s;
	int r;

	if (!c->s.id || !fd_valid(c->s.memfd) || !fd_valid(c->s.sq_efd) || !fd_valid(c->s.cq_efd))
		return -EBADMSG;
	r = kvtd_session_adopt(d, c->s.memfd, c->s.sq_efd, c->s.cq_efd, c->s.sq_entries,
			       c->s.cq_entries, c->s.arena_size, &s);
	if (r < 0)
		return r;
	c->sess = s;
	c->fds_owned = 1;
	fcntl(s->memfd, F_SETFD, FD_CLOEXEC);
	fcntl(s->sq_efd, F_SETFD, FD_CLOEXEC);
	fcntl(s->cq_efd, F_SETFD, FD_CLOEXEC);
	s->id = c->s.id;
	s->pid = c->f.pid;
	s->uid = c->f.uid;
	s->gid = c->f.gid;
	memcpy(s->name, c->s.name, sizeof(s->name));
	s->start_ns = c->s.start_ns;
	s->sq_head = c->s.sq_head;
	s->cq_tail = c->s.cq_tail;
	s->cq_head_seen = c->s.cq_head_seen;
	s->op_err_gen = c->s.op_err_gen; /* the op error record's sequence goes on where it was */
	s->ops = c->s.ops;
	s->errors = c->s.errors;
	r = grow_tables(s, c);
	if (r < 0)
		return r;
	/* The private CQ view must be one the drain could have left. */
	if (kvt_ring_space(s->cq_entries, s->cq_head_seen, s->cq_tail) > s->cq_entries)
		return -EBADMSG;
	for (; c->bufs_done < c->s.n_bufs; c->bufs_done++) {
		struct img_buf_f *b = &c->bufs[c->bufs_done];
		struct kvt_dev_import imp = {
		    .kind = KVT_BUF_HOST_MEMFD, .fd = b->fd, .size = b->size};
		struct kvt_dev_buf *buf;

		if (!b->id || b->id > s->max_bufs || s->bufs[b->id - 1]) {
			r = -EBADMSG;
		} else {
			r = kvt_dev_buf_import(d->dev, &imp, &buf);
			if (r == 0)
				s->bufs[b->id - 1] = buf;
		}
		close(b->fd); /* the import keeps its own */
		if (r < 0)
			return r;
	}
	s->prefix_scope = c->v2.prefix_scope;
	for (int i = 0; i < KVT_MAX_NS; i++) {
		struct img_nsh *ih = &c->nsh[i];
		struct kvtd_ns_handle *h = &s->ns[i];

		if (!ih->f.ns_id)
			continue;
		h->ns = ns_by_id(img, ih->f.ns_id);
		if (!h->ns)
			return -EBADMSG;
		kvtd_prefix_ns_hold(&d->prefix, h->ns);
		/* its row size's class, counted among the uid's when the session joins it */
		r = kvtd_pool_class_get_for(&d->pool, h->ns->token_bytes, NULL);
		if (r < 0)
			return r;
		h->uid_cls = r + 1;
		h->pins = calloc(ih->f.n_pins ? ih->f.n_pins : 1, sizeof(*h->pins));
		if (!h->pins)
			return -ENOMEM;
		h->cap_pins = ih->f.n_pins;
		/* the pin array is the session's memory, charged as a LOOKUP charges it (the uid's
		 * share follows with the session's bytes in kvtd_loop_adopt()); never refused */
		h->pins_bytes = (uint64_t)h->cap_pins * sizeof(*h->pins);
		pthread_mutex_lock(&d->pool.lock);
		s->acct.bytes += h->pins_bytes;
		pthread_mutex_unlock(&d->pool.lock);
		for (uint32_t k = 0; k < ih->f.n_pins; k++) {
			if (ih->pins[k] >= img->px.n_blk || img->blocks[ih->pins[k]]->ns != h->ns)
				return -EBADMSG;
			h->pins[k] = img->blocks[ih->pins[k]];
			kvtd_prefix_ref(&d->prefix, h->pins[k], 1);
			h->n_pins++;
		}
	}
	for (uint32_t i = 0; i < c->s.n_seqs; i++) {
		const struct img_seq *q = &c->seqs[i];
		struct kvtd_seq_image si = {.n = q->f.n,
					    .gen = q->f.gen,
					    .score = q->score,
					    .tier = q->tier,
					    .pos_slot = q->pos_slot,
					    .slot_off = q->slot_off,
					    .old_base = img->d.pool_base,
					    .bytes_in = q->f.bytes_in,
					    .bytes_out = q->f.bytes_out,
					    .score_total = q->f.score_total,
					    .no_sketch = q->v2.flags & IMG_SEQ_F_NO_SKETCH};

		if (q->v2.ns_id) {
			si.ns = ns_by_id(img, q->v2.ns_id);
			if (!si.ns)
				return -EBADMSG;
			si.blk_idx = q->blk_idx;
			si.blocks = img->blocks;
			si.n_blocks = img->px.n_blk;
		}
		r = kvtd_session_seq_restore(s, &q->f.p, q->f.id, &si);
		if (r < 0) {
			log_err("restart: session %u seq %u: %s", s->id, q->f.id, strerror(-r));
			return r;
		}
	}
	return 0;
}

/* Frees a session whose restore is being abandoned, without touching the pool: the pool is
 * made again from scratch afterwards. */
static void
session_abandon(struct kvtd_session *s)
{
	for (unsigned i = 0; i < s->max_seqs; i++)
		if (s->seqs[i]) {
			s->seqs[i]->ts.n = 0; /* no slot goes back */
			s->seqs[i]->n_kblk = 0;
		}
	kvtd_session_destroy(s);
}

static void
reply_asker(struct kvtd *d, void *conn, uint64_t id, unsigned sessions, unsigned seqs,
	    double pause_ms)
{
	char text[256];

	snprintf(text, sizeof(text),
		 "{\"schema\":%d,\"restarted\":true,\"pid\":%d,\"restarts\":%u,\"sessions\":%u,"
		 "\"seqs\":%u,\"pause_ms\":%.3f,\"version\":\"%s\"}",
		 KVT_CTL_SCHEMA, (int)getpid(), d->restarts, sessions, seqs, pause_ms, KVT_VERSION);
	kvtd_loop_reply(d, conn, id, 0, text);
}

int
kvtd_restart_sessions(struct kvtd *d, struct kvtd_image *img)
{
	unsigned n_sessions = 0, n_seqs = 0;
	void *asker = NULL;
	double pause_ms;
	uint32_t i;
	int r = 0;

	kvtd_restart_reaper_start();
	/* One uid entry per session at most: a lowered max_sessions must not leave a restored
	 * session's uid without one (new sessions obey it: kvtd_listen_hello() in listen.c). */
	if (kvtd_image_sessions(img) > d->n_uids) {
		unsigned n = kvtd_image_sessions(img);
		struct kvtd_uid *u = realloc(d->uids, (size_t)n * sizeof(*u));

		if (u) {
			memset(u + d->n_uids, 0, (size_t)(n - d->n_uids) * sizeof(*u));
			d->uids = u;
			d->n_uids = n;
		}
	}
	d->next_session_id = img->d.next_session_id;
	d->restarts = img->d.restarts - (d->fell_back ? 1 : 0); /* counted by the old process */
	d->start_ns = img->d.start_ns;
	d->restart_started_ns = img->d.restart_started_ns;
	atomic_store(&d->cnt.ops, img->d.cnt[0]);
	atomic_store(&d->cnt.errors, img->d.cnt[1]);
	atomic_store(&d->cnt.refused_einval, img->d.cnt[2]);
	atomic_store(&d->cnt.refused_auth, img->d.cnt[3]);
	atomic_store(&d->cnt.refused_hello_timeout, img->d.cnt[4]);
	atomic_store(&d->cnt.refused_limit, img->d.cnt[5]);
	atomic_store(&d->cnt.sessions_total, img->d.cnt[6]);
	atomic_store(&d->cnt.ring_corrupt, img->d.cnt[7]);

	/* 1: the prefix store, then sessions and their slots, nothing visible yet */
	r = prefix_restore(d, img);
	if (r < 0)
		log_err("restart: the prefix store cannot be restored: %s", strerror(-r));
	for (i = 0; i < img->nc.n_conns && r == 0; i++) {
		struct img_conn *c = &img->conns[i];

		if (!fd_valid(c->f.fd)) {
			r = -EBADMSG;
			break;
		}
		fcntl(c->f.fd, F_SETFD, FD_CLOEXEC);
		if (!c->f.has_session)
			continue;
		r = session_restore(d, img, c);
		if (r < 0)
			log_err("restart: session %u (pid %d '%s') cannot be restored: %s", c->s.id,
				(int)c->f.pid, c->s.name, strerror(-r));
	}
	kvtd_pool_claim_done(&d->pool);
	/* 2: retrieval indexes, which allocate pages from the pool */
	for (i = 0; i < img->nc.n_conns && r == 0; i++) {
		struct kvtd_session *s = img->conns[i].sess;

		uint64_t limit;

		if (!s)
			continue;
		/* Charged, but never held to a limit lowered by this restart: an account over
		 * its new limit is only refused new work. No poller runs s yet. */
		limit = s->acct.limit;
		s->acct.limit = 0;
		for (unsigned k = 0; k < s->max_seqs && r == 0; k++)
			if (s->seqs[k]) {
				r = kvtd_seq_restore_retrieval(kvtd_session_ctx(s), s->seqs[k]);
				if (r < 0)
					log_err(
					    "restart: session %u seq %u: rebuilding its retrieval "
					    "index: %s",
					    s->id, k + 1, strerror(-r));
			}
		s->acct.limit = limit;
	}
	if (r < 0) {
		char why[160];

		snprintf(why, sizeof(why), "could not restore the sessions: %s", strerror(-r));
		kvtd_restart_give_up(d, why); /* with a watcher, the old binary takes them back */
		goto err_abandon;
	}
	/* Nothing shared has changed so far: from here on the sessions are served. */
	kvtd_restart_took_over(d);
	/* 3: serve them; adopting prepends, so the last first keeps the list's order */
	for (i = img->nc.n_conns; i-- > 0;) {
		struct img_conn *c = &img->conns[i];
		struct kvtd_conn_info ci = {c->f.fd,  c->f.state,      c->f.pid, c->f.uid,
					    c->f.gid, c->f.privileged, c->sess,	 NULL};
		void *conn;

		r = kvtd_loop_adopt(d, &ci, &conn);
		if (r < 0) {
			log_err("restart: connection of pid %d cannot be served again: %s: closing "
				"it",
				(int)c->f.pid, strerror(-r));
			if (c->sess)
				kvtd_session_destroy(c->sess);
			c->sess = NULL;
			close(c->f.fd);
			r = 0;
			continue;
		}
		if (c->f.asker)
			asker = conn;
		if (c->sess) {
			n_sessions++;
			n_seqs += c->sess->n_seqs;
		}
	}
	/* A poller asleep since before its sessions came may have doorbells already rung. */
	for (unsigned p = 0; p < d->n_pollers; p++)
		eventfd_write(d->pollers[p]->wake_efd, 1);
	pause_ms = (double)(kvtd_now_ns() - img->d.restart_started_ns) / 1e6;
	if (d->fell_back) {
		char msg[640];

		snprintf(msg, sizeof(msg),
			 "restart failed: %s; the previous binary took back %u session(s), pid %d",
			 d->fell_back, n_sessions, (int)getpid());
		log_err(
		    "restart failed after the exec: %s; the previous binary (this process, pid "
		    "%d) took every session back: %u session(s), %u sequence(s), paused %.1f ms",
		    d->fell_back, (int)getpid(), n_sessions, n_seqs, pause_ms);
		if (asker)
			kvtd_loop_reply(d, asker, img->d.restart_req_id, -ECANCELED, msg);
		return 0;
	}
	log_notice("restart %u: serving again, %u session(s) and %u sequence(s) kept "
		   "(image of kvtierd %s), paused %.1f ms",
		   d->restarts, n_sessions, n_seqs, img->version, pause_ms);
	if (asker)
		reply_asker(d, asker, img->d.restart_req_id, n_sessions, n_seqs, pause_ms);
	return 0;

err_abandon:
	log_err("restart: dropping every session of the previous process (their clients see "
		"the connection reset) and starting with an empty pool");
	for (i = 0; i < img->nc.n_conns; i++) {
		struct img_conn *c = &img->conns[i];

		if (c->sess)
			session_abandon(c->sess);
		c->sess = NULL;
		conn_drop_fds(c);
		if (fd_valid(c->f.fd))
			close(c->f.fd);
	}
	kvtd_prefix_abandon(&d->prefix);
	kvtd_pool_fini(&d->pool);
	{
		int e = kvtd_pool_init(&d->pool, &d->cfg, d->dev);

		if (e == 0)
			e = kvtd_prefix_init(&d->prefix, &d->pool,
					     kvtd_config_prefix_bytes(&d->cfg));
		if (e == 0)
			kvtd_prefix_limits(&d->prefix, d->cfg.prefix_namespaces_per_uid,
					   d->cfg.pool_bytes_per_uid);
		if (e < 0)
			return e;
	}
	return r;
}
