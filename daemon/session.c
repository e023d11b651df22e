/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvt_ring.h"
#include "kvtd.h"
#include "log.h"
#include "ops.h"
#include "prefix.h"
#include "seq.h"
#include "session.h"

static uint64_t
align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

/*
 * Lay out and initialise the region: header, SQ ring + entries, CQ ring + entries, op error
 * record, arena. The error record sits in the slack before the page-aligned arena, so most
 * geometries keep the arena where ABI 1.0 put it.
 */
static void
region_init(struct kvtd_session *s, uint32_t sq_entries, uint32_t cq_entries, uint64_t arena_off,
	    uint64_t arena_size)
{
	struct kvt_region_hdr *h = (struct kvt_region_hdr *)s->region;

	h->magic = KVT_REGION_MAGIC;
	h->abi_major = KVT_ABI_MAJOR;
	h->abi_minor = KVT_ABI_MINOR;
	h->hdr_size = sizeof(*h);
	h->features = KVT_FEAT_ALL;
	h->region_size = s->region_size;
	h->sq_ring_off = align_up(sizeof(*h), 64);
	h->sq_entries_off = h->sq_ring_off + sizeof(struct kvt_ring_hdr);
	h->cq_ring_off =
	    align_up(h->sq_entries_off + (uint64_t)sq_entries * sizeof(struct kvt_sqe), 64);
	h->cq_entries_off = h->cq_ring_off + sizeof(struct kvt_ring_hdr);
	h->err_off =
	    align_up(h->cq_entries_off + (uint64_t)cq_entries * sizeof(struct kvt_cqe), 64);
	h->arena_off = arena_off;
	h->arena_size = arena_size;
	h->sq_entries = sq_entries;
	h->cq_entries = cq_entries;
	h->session_id = s->id;

	s->sq = (struct kvt_ring_hdr *)(s->region + h->sq_ring_off);
	s->sqes = (struct kvt_sqe *)(s->region + h->sq_entries_off);
	s->cq = (struct kvt_ring_hdr *)(s->region + h->cq_ring_off);
	s->cqes = (struct kvt_cqe *)(s->region + h->cq_entries_off);
	s->op_err = (struct kvt_op_err *)(s->region + h->err_off);
	s->arena = s->region + arena_off;
	s->arena_size = arena_size;
	s->sq_entries = sq_entries;
	s->cq_entries = cq_entries;
	s->sq->entries = sq_entries;
	s->cq->entries = cq_entries;
	/* The poller starts asleep: the client's first submit must ring the doorbell. */
	kvt_ring_set_flags(s->sq, KVT_RING_NEED_WAKEUP);
}

/* Where the arena starts and how large the region is, for these ring and arena sizes. */
static uint64_t
region_layout(uint32_t sq_entries, uint32_t cq_entries, uint64_t arena_size,
	      uint64_t *ret_arena_off)
{
	uint64_t arena_off;

	arena_off =
	    align_up(align_up(sizeof(struct kvt_region_hdr), 64) + sizeof(struct kvt_ring_hdr) +
			 (uint64_t)sq_entries * sizeof(struct kvt_sqe),
		     64);
	arena_off = align_up(arena_off + sizeof(struct kvt_ring_hdr) +
				 (uint64_t)cq_entries * sizeof(struct kvt_cqe),
			     64);
	arena_off = align_up(arena_off + sizeof(struct kvt_op_err), 4096);
	*ret_arena_off = arena_off;
	return align_up(arena_off + arena_size, 4096);
}

/* The session's private base structure (tables sized by the config), no region or fds yet. */
static struct kvtd_session *
session_alloc(struct kvtd *d)
{
	struct kvtd_session *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->d = d;
	s->memfd = s->sq_efd = s->cq_efd = -1;
	s->region = MAP_FAILED;
	s->start_ns = kvtd_now_ns();
	s->time_rng = (uint32_t)s->start_ns | 1; /* any non-zero seed */
	s->time_gap = 1;
	s->max_bufs = d->cfg.buffers_per_session;
	s->max_seqs = d->cfg.seqs_per_session;
	s->acct.limit = d->cfg.pool_bytes_per_session;
	s->bufs = calloc(s->max_bufs, sizeof(*s->bufs));
	s->seqs = calloc(s->max_seqs, sizeof(*s->seqs));
	if (!s->bufs || !s->seqs) {
		kvtd_session_destroy(s);
		return NULL;
	}
	return s;
}

int
kvtd_session_adopt(struct kvtd *d, int memfd, int sq_efd, int cq_efd, uint32_t sq_entries,
		   uint32_t cq_entries, uint64_t arena_size, struct kvtd_session **ret_s)
{
	struct kvtd_session *s;
	uint64_t arena_off, size;
	struct stat st;
	int seals;

	if (!sq_entries || (sq_entries & (sq_entries - 1)) || !cq_entries ||
	    (cq_entries & (cq_entries - 1)) || sq_entries > (1u << 20) || cq_entries > (1u << 21) ||
	    arena_size > (1ull << 40))
		return -EINVAL;
	size = region_layout(sq_entries, cq_entries, arena_size, &arena_off);
	seals = fcntl(memfd, F_GET_SEALS);
	if (fstat(memfd, &st) < 0 || (uint64_t)st.st_size != size || seals < 0 ||
	    (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
		return -EINVAL;
	s = session_alloc(d);
	if (!s)
		return -ENOMEM;
	s->region_size = size;
	s->region = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (s->region == MAP_FAILED) {
		int r = -errno;

		kvtd_session_destroy(s);
		return r;
	}
	/* The header and ring geometry are rewritten with the values they had (the client may
	 * have scribbled on them; it reads them only at connect). */
	region_init(s, sq_entries, cq_entries, arena_off, arena_size);
	s->memfd = memfd;
	s->sq_efd = sq_efd;
	s->cq_efd = cq_efd;
	*ret_s = s;
	return 0;
}

int
kvtd_session_create(struct kvtd *d, uint32_t sq_entries, uint32_t cq_entries, uint64_t arena_size,
		    struct kvtd_session **ret_s)
{
	struct kvtd_session *s;
	uint64_t arena_off;
	int r;

	s = session_alloc(d);
	if (!s)
		return -ENOMEM;

	s->region_size = region_layout(sq_entries, cq_entries, arena_size, &arena_off);

	s->memfd = memfd_create("kvtier-session", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (s->memfd < 0) {
		r = -errno;
		goto err_free;
	}
	if (ftruncate(s->memfd, (off_t)s->region_size) < 0) {
		r = -errno;
		goto err_free;
	}
	s->region = mmap(NULL, s->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd, 0);
	if (s->region == MAP_FAILED) {
		r = -errno;
		goto err_free;
	}
	region_init(s, sq_entries, cq_entries, arena_off, arena_size);
	/* Sealed before it is sent: the client can never resize what the daemon maps. */
	if (fcntl(s->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		goto err_free;
	}
	s->sq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->cq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->sq_efd < 0 || s->cq_efd < 0) {
		r = -errno;
		goto err_free;
	}
	*ret_s = s;
	return 0;

err_free:
	kvtd_session_destroy(s);
	return r;
}

void
kvtd_session_destroy(struct kvtd_session *s)
{
	if (!s)
		return;
	for (unsigned i = 0; s->seqs && i < s->max_seqs; i++)
		kvtd_seq_destroy(kvtd_session_ctx(s), s->seqs[i]);
	for (uint64_t i = 1; i <= KVT_MAX_NS; i++)
		kvtd_session_ns_close(s, i);
	for (unsigned i = 0; s->bufs && i < s->max_bufs; i++)
		kvt_dev_buf_put(s->bufs[i]);
	kvt_dev_event_destroy(s->d->dev, s->dev_event);
	if (s->region != MAP_FAILED)
		munmap(s->region, s->region_size);
	if (s->memfd >= 0)
		close(s->memfd);
	if (s->sq_efd >= 0)
		close(s->sq_efd);
	if (s->cq_efd >= 0)
		close(s->cq_efd);
	kvtd_scratch_fini(&s->scr);
	free(s->bufs);
	free(s->seqs);
	free(s);
}

/* Every class reference the session's sequences and namespace handles hold, into @cls (room
 * for 5 a sequence and KVT_MAX_NS); returns the count. */
static unsigned
session_classes(const struct kvtd_session *s, int *cls)
{
	unsigned n = 0;

	for (unsigned i = 0; i < s->max_seqs; i++) {
		const struct kvtd_seq *q = s->seqs[i];

		if (!q)
			continue;
		cls[n++] = q->cls;
		cls[n++] = q->cls_q;
		cls[n++] = q->cls_kb;
		cls[n++] = q->cls_pg;
		cls[n++] = q->cls_sk;
	}
	for (int i = 0; i < KVT_MAX_NS; i++)
		if (s->ns[i].ns && s->ns[i].uid_cls)
			cls[n++] = s->ns[i].uid_cls - 1;
	return n;
}

static void
session_uid_cls(struct kvtd_session *s, struct kvtd_cls_use *use, int add)
{
	int *cls = malloc(((size_t)s->max_seqs * 5 + KVT_MAX_NS) * sizeof(*cls));

	if (!cls) { /* counted one at a time, without the array */
		for (unsigned i = 0; i < s->max_seqs; i++) {
			struct kvtd_seq *q = s->seqs[i];
			int c[5];

			if (!q)
				continue;
			c[0] = q->cls, c[1] = q->cls_q, c[2] = q->cls_kb, c[3] = q->cls_pg;
			c[4] = q->cls_sk;
			kvtd_pool_class_use(&s->d->pool, c, 5, use, add);
			q->cls_use = add > 0 ? use : NULL;
		}
		for (int i = 0; i < KVT_MAX_NS; i++)
			if (s->ns[i].ns && s->ns[i].uid_cls) {
				int c = s->ns[i].uid_cls - 1;

				kvtd_pool_class_use(&s->d->pool, &c, 1, use, add);
			}
		return;
	}
	kvtd_pool_class_use(&s->d->pool, cls, session_classes(s, cls), use, add);
	for (unsigned i = 0; i < s->max_seqs; i++)
		if (s->seqs[i])
			s->seqs[i]->cls_use = add > 0 ? use : NULL;
	free(cls);
}

void
kvtd_session_uid_join(struct kvtd_session *s, struct kvtd_uid *u)
{
	s->uid_ent = u;
	session_uid_cls(s, &u->cls, 1);
}

void
kvtd_session_uid_leave(struct kvtd_session *s)
{
	if (!s->uid_ent)
		return;
	session_uid_cls(s, &s->uid_ent->cls, -1);
	s->uid_ent = NULL;
}

const struct kvtd_seq_ctx *
kvtd_session_ctx(struct kvtd_session *s)
{
	struct kvtd_seq_ctx *x = &s->ctx;

	x->pool = &s->d->pool;
	x->dev = s->d->dev;
	x->acct = &s->acct;
	x->uid_acct = s->uid_ent ? &s->uid_ent->acct : NULL;
	x->uid_cls = s->uid_ent ? &s->uid_ent->cls : NULL;
	x->event = s->dev_event;
	x->scr = s->poller ? &s->poller->scr : &s->scr;
	x->bufs = s->bufs;
	x->n_bufs = s->max_bufs;
	x->owner_id = s->id;
	x->why = &s->why;
	x->prefix = &s->d->prefix;
	x->no_sketch = !s->d->cfg.retrieval_sketch;
	return x;
}

/* ---- prefix blocks ------------------------------------------------------------------------ */

int
kvtd_session_ns_open(struct kvtd_session *s, const struct kvt_ns_params *np)
{
	const struct kvtd_seq_ctx *x = kvtd_session_ctx(s);
	const char *why;
	unsigned i;
	int r;

	r = kvtd_prefix_ns_check(np, &why);
	if (r < 0)
		return kvtd_seq_fail(x, r, "%s", why);
	for (i = 0; i < KVT_MAX_NS && s->ns[i].ns; i++)
		;
	if (i == KVT_MAX_NS)
		return kvtd_seq_fail(
		    x, -EMFILE, "%u namespaces open, the session's limit: close one", KVT_MAX_NS);
	r = kvtd_prefix_ns_open(&s->d->prefix, np, s->prefix_scope, &s->ns[i].ns);
	if (r == -ENOSPC) {
		unsigned used, held;

		kvtd_pool_class_count(&s->d->pool, x->uid_cls, &used, &held);
		return kvtd_seq_fail(x, r,
				     "no pool class left for its row size: %u of %u in use (%u by "
				     "this uid), none held only by cached prefix blocks",
				     used, KVTD_POOL_MAX_CLASSES, held);
	}
	if (r == -EDQUOT)
		return kvtd_seq_fail(
		    x, r,
		    "a new namespace past the %u this uid (or the shared scope) may "
		    "hold ([prefix] namespaces_per_uid), or past %u in all: close "
		    "namespaces or let their blocks go",
		    s->d->cfg.prefix_namespaces_per_uid, KVTD_PREFIX_MAX_NS);
	if (r < 0)
		return r;
	/* The namespace's class counts among the uid's (classes_per_uid) while it is open. */
	r = kvtd_pool_class_get_for(&s->d->pool, s->ns[i].ns->token_bytes, x->uid_cls);
	if (r < 0) {
		unsigned used, held;

		kvtd_prefix_ns_close(&s->d->prefix, s->ns[i].ns);
		s->ns[i].ns = NULL;
		if (r != -EDQUOT)
			return r;
		kvtd_pool_class_count(&s->d->pool, x->uid_cls, &used, &held);
		return kvtd_seq_fail(x, r,
				     "classes_per_uid: this uid's sequences and namespaces use %u "
				     "pool classes (row sizes), at most %u; this namespace's would "
				     "be another: close one of another geometry",
				     held, x->uid_cls->limit);
	}
	s->ns[i].uid_cls = r + 1;
	return (int)i + 1;
}

struct kvtd_ns_handle *
kvtd_session_ns(struct kvtd_session *s, uint64_t id)
{
	if (!id || id > KVT_MAX_NS || !s->ns[id - 1].ns)
		return NULL;
	return &s->ns[id - 1];
}

static void
pins_drop(struct kvtd_session *s, struct kvtd_ns_handle *h)
{
	kvtd_prefix_put(&s->d->prefix, h->pins, h->n_pins);
	h->n_pins = 0;
}

/* Charges (@delta > 0) or uncharges the session's pin arrays to its account and its uid's, as
 * pool bytes are (the pool's lock guards both): -EDQUOT past either limit. */
static int
pins_charge(struct kvtd_session *s, struct kvtd_ns_handle *h, int64_t delta)
{
	struct kvtd_acct *a = &s->acct, *u = s->uid_ent ? &s->uid_ent->acct : NULL;
	struct kvtd_pool *pool = &s->d->pool;
	int r = 0;

	pthread_mutex_lock(&pool->lock);
	if (delta > 0 && ((a->limit && a->bytes + (uint64_t)delta > a->limit) ||
			  (u && u->limit && u->bytes + (uint64_t)delta > u->limit))) {
		r = -EDQUOT;
	} else {
		a->bytes += (uint64_t)delta;
		if (u)
			u->bytes += (uint64_t)delta;
		h->pins_bytes += (uint64_t)delta;
	}
	pthread_mutex_unlock(&pool->lock);
	return r;
}

int
kvtd_session_ns_close(struct kvtd_session *s, uint64_t id)
{
	struct kvtd_ns_handle *h = kvtd_session_ns(s, id);

	if (!h)
		return -ENOENT;
	pins_drop(s, h);
	pins_charge(s, h, -(int64_t)h->pins_bytes);
	free(h->pins);
	if (h->uid_cls)
		kvtd_pool_class_put_for(&s->d->pool, h->uid_cls - 1,
					s->uid_ent ? &s->uid_ent->cls : NULL);
	kvtd_prefix_ns_close(&s->d->prefix, h->ns);
	memset(h, 0, sizeof(*h));
	return 0;
}

int
kvtd_session_lookup(struct kvtd_session *s, struct kvtd_ns_handle *h,
		    const struct kvt_block_key *keys, uint32_t n, int pin)
{
	uint64_t want, had;
	uint32_t m;
	int r;

	if (!pin)
		return (int)kvtd_prefix_lookup(&s->d->prefix, h->ns, keys, n, NULL, 0);
	/* Room for what matches, not for what was asked: the key count is the client's, and a
	 * match is at most what the namespace holds (prefix.h). The pinning pass stops there
	 * (sooner if some went meanwhile). The array is the session's memory: charged to it
	 * (one a restart restored, at the first LOOKUP after). */
	m = kvtd_prefix_match(&s->d->prefix, h->ns, keys, n);
	want = (uint64_t)(m > h->cap_pins ? m : h->cap_pins) * sizeof(*h->pins);
	had = h->pins_bytes;
	if (want > h->pins_bytes) {
		r = pins_charge(s, h, (int64_t)(want - h->pins_bytes));
		if (r < 0)
			return kvtd_seq_fail(kvtd_session_ctx(s), r,
					     "pinning %u blocks needs %llu bytes more than the "
					     "session's or uid's pool quota has left",
					     m, (unsigned long long)(want - h->pins_bytes));
	}
	if (m > h->cap_pins) {
		struct kvtd_pblock **p = realloc(h->pins, m * sizeof(*p));

		if (!p) {
			pins_charge(s, h, -(int64_t)(h->pins_bytes - had));
			return -ENOMEM;
		}
		h->pins = p;
		h->cap_pins = m;
	}
	pins_drop(s, h);
	h->n_pins = kvtd_prefix_lookup(&s->d->prefix, h->ns, keys, n, h->pins, m);
	return (int)h->n_pins;
}

struct kvtd_seq *
kvtd_session_seq(struct kvtd_session *s, uint32_t id)
{
	if (!id || id > s->max_seqs)
		return NULL;
	return s->seqs[id - 1];
}

int
kvtd_session_seq_open(struct kvtd_session *s, const struct kvt_seq_params *p,
		      struct kvtd_ns_handle *h, uint32_t prefix_blocks, uint64_t *ret_n)
{
	const struct kvtd_seq_ctx *x = kvtd_session_ctx(s);
	struct kvtd_seq *q;
	unsigned idx;
	int64_t n = 0;
	int r;

	r = kvtd_seq_check(x, p);
	if (r < 0)
		return r;
	if (s->n_seqs >= s->max_seqs)
		return kvtd_seq_fail(
		    x, -EMFILE, "%u sequences open, the session's limit: close one", s->n_seqs);
	if (h && prefix_blocks > h->n_pins)
		return kvtd_seq_fail(x, -EINVAL,
				     "prefix_blocks %u, but the last pinning LOOKUP on this "
				     "namespace holds %u",
				     prefix_blocks, h->n_pins);
	r = kvtd_seq_create(x, p, &q);
	if (r < 0)
		return r;
	if (h) {
		n = kvtd_seq_join(x, q, h->ns, h->pins, prefix_blocks);
		if (n < 0) {
			kvtd_seq_destroy(x, q);
			return (int)n;
		}
	}
	*ret_n = (uint64_t)n;
	for (idx = 0; idx < s->max_seqs && s->seqs[idx]; idx++)
		;
	q->id = idx + 1;
	s->seqs[idx] = q;
	s->n_seqs++;
	return (int)q->id;
}

int
kvtd_session_seq_close(struct kvtd_session *s, uint32_t id)
{
	struct kvtd_seq *q = kvtd_session_seq(s, id);

	if (!q)
		return -ENOENT;
	s->seqs[id - 1] = NULL;
	s->n_seqs--;
	kvtd_seq_destroy(kvtd_session_ctx(s), q);
	return 0;
}

int
kvtd_session_seq_restore(struct kvtd_session *s, const struct kvt_seq_params *p, uint32_t id,
			 const struct kvtd_seq_image *img)
{
	struct kvtd_seq *q;
	int r;

	if (!id || id > s->max_seqs || s->seqs[id - 1])
		return -EINVAL;
	r = kvtd_seq_restore(kvtd_session_ctx(s), p, img, &q);
	if (r < 0)
		return r;
	q->id = id;
	s->seqs[id - 1] = q;
	s->n_seqs++;
	return 0;
}

int
kvtd_session_buf_register(struct kvtd_session *s, struct kvt_dev_buf *buf)
{
	for (unsigned i = 0; i < s->max_bufs; i++)
		if (!s->bufs[i]) {
			s->bufs[i] = buf;
			return (int)i + 1;
		}
	return -EMFILE;
}

struct kvt_dev_buf *
kvtd_session_buf(struct kvtd_session *s, uint32_t buf_id)
{
	if (!buf_id || buf_id > s->max_bufs)
		return NULL;
	return s->bufs[buf_id - 1];
}

int
kvtd_session_buf_unregister(struct kvtd_session *s, uint32_t buf_id)
{
	struct kvt_dev_buf *buf = kvtd_session_buf(s, buf_id);

	if (!buf)
		return -ENOENT;
	for (unsigned i = 0; i < s->max_seqs; i++) {
		struct kvtd_seq *q = s->seqs[i];

		if (q && (q->t0_buf == buf || q->stage_buf == buf))
			return -EBUSY;
	}
	s->bufs[buf_id - 1] = NULL;
	kvt_dev_buf_put(buf);
	return 0;
}

/* Ring corruption: tell the client why over its socket, then shut the socket so the main loop
 * sees the hangup and tears the session down. Other sessions never notice. */
void
kvtd_session_break(struct kvtd_session *s, const char *why)
{
	struct kvt_ctl_error e;

	if (s->broken)
		return;
	s->broken = 1;
	atomic_fetch_add_explicit(&s->d->cnt.ring_corrupt, 1, memory_order_relaxed);
	kvtd_log_f(KVTD_LOG_WARNING, &(struct kvtd_log_fields){.session = s->id, .pid = s->pid},
		   "session %u (pid %d): %s: dropping the session", s->id, (int)s->pid, why);
	memset(&e, 0, sizeof(e));
	e.hdr.type = KVT_CTL_ERROR;
	e.hdr.len = sizeof(e);
	e.err = -EPROTO;
	snprintf(e.msg, sizeof(e.msg), "kvtierd: %s", why);
	send(s->sock, &e, sizeof(e), MSG_DONTWAIT | MSG_NOSIGNAL);
	shutdown(s->sock, SHUT_RDWR);
}

int
kvtd_session_pending(struct kvtd_session *s)
{
	uint32_t tail;

	if (s->broken)
		return 0;
	tail = kvt_ring_load_tail(s->sq);
	/* Checked here, on the way to sleep, because busy draining never reads the tail. The drain
	 * follows stamps, and a producer stamps its entries before it publishes the tail: one
	 * preempted in between leaves the tail up to sq_entries behind our head. That is a submit
	 * in progress (its tail store, fence and NEED_WAKEUP check are still to come), not a
	 * corrupt ring. */
	if (kvt_ring_ready(s->sq_head, tail) > s->sq_entries) {
		if (kvt_ring_ready(tail, s->sq_head) <= s->sq_entries)
			return 0;
		kvtd_session_break(s, "SQ tail out of range (ring corrupt)");
		return 0;
	}
	return tail != s->sq_head;
}

/* Whether to time the next op: every op after a random gap of 1 to 2 * KVTD_OP_TIME_SAMPLE - 1
 * ops (xorshift32), so on average one in KVTD_OP_TIME_SAMPLE, never in step with a client's
 * periodic pattern of ops. The common case is a decrement. */
static inline int
time_this_op(struct kvtd_session *s)
{
	uint32_t x;

	if (--s->time_gap)
		return 0;
	x = s->time_rng;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	s->time_rng = x;
	s->time_gap = 1 + x % (2 * KVTD_OP_TIME_SAMPLE - 1);
	return 1;
}

unsigned
kvtd_session_drain(struct kvtd_session *s, uint64_t slice_ns)
{
	uint32_t space, n = 0;
	uint64_t t0 = 0, now = 0; /* now: the last op's end when it was read, else 0 */

	if (s->broken)
		return 0;
	/* The client's CQ head lives on a line the client writes: read it only when our copy says
	 * the CQ may be full, saving a cache-line transfer per op. */
	space = kvt_ring_space(s->cq_entries, s->cq_head_seen, s->cq_tail);
	if (space < s->sq_entries) {
		s->cq_head_seen = kvt_ring_load_head(s->cq);
		space = kvt_ring_space(s->cq_entries, s->cq_head_seen, s->cq_tail);
		if (space > s->cq_entries) {
			kvtd_session_break(s, "CQ head out of range (ring corrupt)");
			return 0;
		}
	}
	/* A full CQ leaves SQEs queued: libkvtier never has more in flight than the CQ holds. */
	while (n < space) {
		struct kvt_sqe *slot = &s->sqes[s->sq_head & (s->sq_entries - 1)];
		struct kvt_cqe *out = &s->cqes[s->cq_tail & (s->cq_entries - 1)];
		struct kvt_sqe sqe;
		struct kvt_cqe cqe;
		uint64_t start = 0;

		if (!kvt_ring_load_stamp(&slot->stamp, s->sq_head))
			break;
		/* A clock read costs about as much as a NOP: alone on its poller a session times
		 * a random 1/KVTD_OP_TIME_SAMPLE of its ops. Sharing it, the slice reads the clock
		 * after every op anyway, and every op is timed: the previous op's end is this
		 * one's start. */
		if (slice_ns) {
			if (!n)
				t0 = now = kvtd_now_ns();
			else if (now - t0 >= slice_ns)
				break; /* the rest next round, after the other sessions */
			start = now;
		} else if (time_this_op(s)) {
			start = now ? now : kvtd_now_ns();
		}
		/* Copy once: the client may rewrite the entry while we work on it. */
		memcpy(&sqe, slot, sizeof(sqe));
		cqe.user_data = sqe.user_data;
		now = kvtd_op_run(s, &sqe, &cqe, start);
		/* Every field but the stamp, then the stamp: the client may be polling it. */
		out->user_data = cqe.user_data;
		out->res = cqe.res;
		out->aux[0] = cqe.aux[0];
		out->aux[1] = cqe.aux[1];
		kvt_ring_store_stamp(&out->stamp, s->cq_tail);
		s->sq_head++;
		s->cq_tail++;
		n++;
	}
	if (!n)
		return 0;
	kvt_ring_store_head(s->sq, s->sq_head);
	kvt_ring_store_tail(s->cq, s->cq_tail);
	kvt_ring_fence();
	if (kvt_ring_needs_wakeup(s->cq))
		eventfd_write(s->cq_efd, 1);
	return n;
}
