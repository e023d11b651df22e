/* SPDX-License-Identifier: MIT */
/*
 * kvtier_driver.c - the client's tiering loop for one sequence (kvtier.h, "tiering driver").
 *
 * State, the mirror of what RETIER and FETCH said:
 *   slot_pos[t0_slots]	position held by each T0 slot, -1 when free
 *   loc[max_tokens]	where each position's rows are: a T0 slot, t0_slots + a staging row, or
 *			LOC_NONE (evicted, or not appended yet)
 *   free_slots[]	the slots the last RETIER handed out (all of them before the first);
 *			passes take them in order from next_free
 *   vpos[], vloc[]	the view: live positions ascending, then the open pass's new tokens;
 *			rebuilt from loc[] at each RETIER, grown by each pass
 *
 * Queued ops' payloads sit in the arena, bump-allocated (64-byte aligned) until the queue is
 * reaped; blocking calls (RETIER, FETCH, SEQ_STAT, SEQ_CLOSE) are made with nothing in flight,
 * as the blocking wrappers use the arena's start.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier.h"
#include "kvtier_int.h"

#define KVT_EXPORT __attribute__((visibility("default")))

#define LOC_NONE UINT32_MAX

/* user_data of the queued ops: the kind, and the n the pass reached (what APPEND answers). */
#define UD_APPEND (1ull << 63)
#define UD_SCORE  ((1ull << 63) | (1ull << 62))
#define UD_KIND	  ((1ull << 63) | (1ull << 62))

/* First version of struct kvt_driver_stats: every field up to reap_ns. */
#define STATS_SIZE_V1 sizeof(struct kvt_driver_stats)

struct kvt_driver {
	struct kvt_client *c;
	uint32_t seq;
	uint32_t layers;
	uint32_t t0_slots, stage_slots, max_tokens, prompt_len;
	uint32_t n;				 /* positions appended, queued included */
	uint32_t q;				 /* the open pass's tokens, 0: none open */
	uint32_t vn;				 /* view entries before the open pass */
	int err;				 /* sticky: the first failure */
	char why[256];				 /* its reason, for kvt_last_error() */
	int32_t *slot_pos;			 /* [t0_slots] */
	uint32_t *loc;				 /* [max_tokens] */
	uint32_t *free_slots, n_free, next_free; /* [t0_slots] */
	uint32_t *staged;			 /* [stage_slots]: positions of the staging rows */
	uint32_t *vpos, *vloc;			 /* [max_tokens] */
	uint8_t *rbuf;				 /* RETIER output */
	uint64_t rbuf_len;
	uint8_t *arena;
	uint64_t arena_size, arena_used;
	uint32_t inflight; /* queued or submitted ops, not reaped */
	struct kvt_driver_stats st;
};

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Records the driver's first failure with its reason (the sticky error every call returns). */
__attribute__((format(printf, 3, 4))) static int
fail(struct kvt_driver *d, int err, const char *fmt, ...)
{
	va_list ap;

	if (!d->err) {
		d->err = err;
		va_start(ap, fmt);
		vsnprintf(d->why, sizeof(d->why), fmt, ap);
		va_end(ap);
	}
	kvtc_set_error("%s", d->why);
	return d->err;
}

/* A refusal that leaves the driver usable. */
__attribute__((format(printf, 2, 3))) static int
refuse(int err, const char *fmt, ...)
{
	char buf[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	kvtc_set_error("%s", buf);
	return err;
}

/* The sticky error, its reason set again for this thread. */
static int
sticky(const struct kvt_driver *d)
{
	kvtc_set_error("%s", d->why);
	return d->err;
}

KVT_EXPORT int
kvt_driver_t0_slots(const struct kvt_seq_params *p)
{
	uint32_t head, prot;
	uint64_t budget, ts;

	if (!p || !p->delta || !p->max_tokens || p->max_tokens > (1u << 24) ||
	    p->prompt_len > p->max_tokens || p->policy > KVT_POLICY_FULL)
		return -EINVAL;
	head = p->protect_prompt && p->prompt_len > p->sinks ? p->prompt_len : p->sinks;
	prot = head + p->window;
	switch (p->policy) {
	case KVT_POLICY_FULL:
		budget = p->max_tokens;
		break;
	case KVT_POLICY_STREAMING:
		budget = prot;
		break;
	default:
		budget = (uint64_t)ceil((double)p->hbm_frac * p->max_tokens);
		break;
	}
	if (budget > p->max_tokens)
		budget = p->max_tokens;
	/* kvtierd wants the protected set to fit with Δ slots free, even in a short sequence. */
	if (budget < prot)
		budget = prot;
	ts = budget + p->delta;
	if (ts < p->prompt_len)
		ts = p->prompt_len;
	return ts > INT32_MAX ? -EINVAL : (int)ts;
}

static const char *
op_name(uint64_t ud)
{
	return (ud & UD_KIND) == UD_SCORE ? "SCORE_ADD" : "APPEND";
}

/* Submits whatever is queued and reaps every queued op, checking its result. */
static int
reap(struct kvt_driver *d)
{
	uint64_t t0;
	int r;

	if (!d->inflight)
		return 0;
	t0 = now_ns();
	r = kvt_submit(d->c);
	if (r < 0)
		return fail(d, r, "submitting the queued APPEND and SCORE_ADD: %s",
			    kvt_strerror(r));
	d->st.submits++;
	while (d->inflight) {
		struct kvt_cqe cqe;
		uint64_t kind, at;
		char why[KVT_OP_ERR_MSG_LEN];

		r = kvt_wait_cqe(d->c, &cqe);
		if (r < 0)
			return fail(d, r, "waiting for the queued ops: %s", kvt_strerror(r));
		d->inflight--;
		kind = cqe.user_data & UD_KIND;
		at = cqe.user_data & UINT32_MAX;
		if (kind != UD_APPEND && kind != UD_SCORE)
			return fail(d, -EPROTO,
				    "a completion the driver did not queue (user_data %#llx)",
				    (unsigned long long)cqe.user_data);
		if (cqe.res < 0) {
			if (kvt_op_error(d->c, cqe.user_data, why, sizeof(why)) < 0)
				snprintf(why, sizeof(why), "%s", kvt_strerror(cqe.res));
			return fail(
			    d, cqe.res,
			    "kvtierd refused the queued %s of the pass ending at n=%llu: %s",
			    op_name(cqe.user_data), (unsigned long long)at, why);
		}
		if (kind == UD_APPEND && (uint64_t)cqe.res != at)
			return fail(d, -EPROTO,
				    "kvtierd answered n=%d to the APPEND that reaches n=%llu",
				    cqe.res, (unsigned long long)at);
	}
	d->arena_used = 0;
	d->st.reap_ns += now_ns() - t0;
	return 0;
}

/*
 * An SQE for a queued op whose payload of @len bytes goes to the arena at *@ret_off; reaps the
 * queue first when the SQ, the CQ or the arena is full. NULL with the sticky error set on
 * failure.
 */
static struct kvt_sqe *
queue_op(struct kvt_driver *d, uint64_t len, uint64_t *ret_off)
{
	uint64_t need = (len + 63) & ~63ull;
	struct kvt_sqe *e;

	if (need > d->arena_size) {
		fail(d, -E2BIG, "a %llu-byte payload is larger than the %llu-byte arena",
		     (unsigned long long)len, (unsigned long long)d->arena_size);
		return NULL;
	}
	if (d->arena_used + need > d->arena_size && reap(d) < 0)
		return NULL;
	e = kvt_get_sqe(d->c);
	if (!e && d->inflight) {
		if (reap(d) < 0)
			return NULL;
		e = kvt_get_sqe(d->c);
	}
	if (!e) {
		/* nothing in flight: only a dead session refuses */
		fail(d, -ECONNRESET, "the session refuses entries: %s", kvt_strerror(-ECONNRESET));
		return NULL;
	}
	*ret_off = d->arena_used;
	d->arena_used += need;
	d->inflight++;
	return e;
}

/* The view from loc[]: live positions ascending (a linear scan of the n positions). */
static uint32_t
rebuild_view(struct kvt_driver *d)
{
	uint32_t m = 0;

	for (uint32_t p = 0; p < d->n; p++) {
		if (d->loc[p] == LOC_NONE)
			continue;
		d->vpos[m] = p;
		d->vloc[m] = d->loc[p];
		m++;
	}
	d->vn = m;
	return m;
}

/*
 * FETCH every T1|T2 position (all layers) into the staging rows from row 0; marks them in loc[]
 * after checking they are ascending, below n and nowhere else. Returns the rows staged.
 */
static int
stage(struct kvt_driver *d, unsigned flags)
{
	uint64_t t0 = now_ns();
	uint32_t prev = 0;
	int r;

	r = kvt_fetch(d->c, d->seq, flags, 0, d->layers, 0, d->staged, d->stage_slots);
	if (r < 0)
		return fail(d, r, "%s", kvt_last_error());
	for (uint32_t i = 0; i < (uint32_t)r; i++) {
		uint32_t p = d->staged[i];

		if (p >= d->n || (i && p <= prev) || d->loc[p] != LOC_NONE)
			return fail(
			    d, -EPROTO,
			    "FETCH staged position %u (row %u) out of order, past n=%u or twice", p,
			    i, d->n);
		d->loc[p] = d->t0_slots + i;
		prev = p;
	}
	d->st.fetches++;
	d->st.rows_staged += (uint64_t)r;
	d->st.fetch_ns += now_ns() - t0;
	return r;
}

/*
 * RETIER, follow the slot changes, take the new free slots, FETCH every T1/T2 row of all layers,
 * rebuild loc[] and the view. Checks that what can be seen is exactly the n - T3 live positions,
 * each in one place.
 */
static int
retier(struct kvt_driver *d)
{
	const struct kvt_retier_result *res = (const void *)d->rbuf;
	const struct kvt_slot_change *ch;
	const uint32_t *fs;
	uint32_t n = d->n, seen = 0, staged = 0;
	uint64_t t0 = now_ns();
	int r;

	r = reap(d);
	if (r < 0)
		return r;
	r = kvt_retier(d->c, d->seq, d->rbuf, d->rbuf_len);
	if (r < 0)
		return fail(d, r, "%s", kvt_last_error());
	if ((size_t)r < sizeof(*res) || res->size != sizeof(*res) || res->n_tokens != n ||
	    (uint64_t)r !=
		sizeof(*res) + (uint64_t)res->n_changes * 8 + (uint64_t)res->n_free * 4 ||
	    res->n_free == 0 || res->n_free > d->t0_slots || res->tier_count[3] > n)
		return fail(d, -EPROTO,
			    "RETIER answered %d bytes, n=%llu, %u free slots at n=%u (t0_slots %u)",
			    r, (unsigned long long)res->n_tokens, res->n_free, n, d->t0_slots);
	ch = (const void *)(d->rbuf + sizeof(*res));
	fs = (const void *)(ch + res->n_changes);
	/* Demotions come first (pos -1), so a slot freed and refilled ends with its new position.
	 */
	for (uint32_t i = 0; i < res->n_changes; i++) {
		if (ch[i].slot >= d->t0_slots || ch[i].pos >= (int32_t)n || ch[i].pos < -1)
			return fail(d, -EPROTO,
				    "RETIER's slot change %u (slot %u, pos %d) out of range", i,
				    ch[i].slot, ch[i].pos);
		d->slot_pos[ch[i].slot] = ch[i].pos;
	}
	for (uint32_t i = 0; i < res->n_free; i++) {
		if (fs[i] >= d->t0_slots || d->slot_pos[fs[i]] != -1)
			return fail(d, -EPROTO, "RETIER handed out slot %u, which is not free",
				    fs[i]);
		d->free_slots[i] = fs[i];
	}
	d->n_free = res->n_free;
	d->next_free = 0;
	memcpy(d->st.tier_count, res->tier_count, sizeof(d->st.tier_count));
	d->st.retiers++;
	d->st.last_retier_n = n;
	if (res->tier_count[3] && !d->st.first_evict_n)
		d->st.first_evict_n = n;
	d->st.retier_ns += now_ns() - t0;

	for (uint32_t p = 0; p < n; p++)
		d->loc[p] = LOC_NONE;
	if (res->tier_count[1] + res->tier_count[2]) {
		r = stage(d, KVT_FETCH_F_T1 | KVT_FETCH_F_T2);
		if (r < 0)
			return r;
		staged = (uint32_t)r;
	}
	for (uint32_t s = 0; s < d->t0_slots; s++) {
		int32_t p = d->slot_pos[s];

		if (p < 0)
			continue;
		if (d->loc[p] != LOC_NONE)
			return fail(d, -EPROTO,
				    "position %d is in T0 slot %u and in slot or row %u", p, s,
				    d->loc[p]);
		d->loc[p] = s;
		seen++;
	}
	if (rebuild_view(d) != n - res->tier_count[3] || seen + staged != d->vn)
		return fail(d, -EPROTO, "%u positions are visible, %llu are live (n=%u)", d->vn,
			    (unsigned long long)(n - res->tier_count[3]), n);
	return 0;
}

KVT_EXPORT int
kvt_driver_open(struct kvt_client *c, const struct kvt_seq_params *p,
		const struct kvt_driver_opts *opts, struct kvt_driver **ret_drv)
{
	struct kvt_driver_opts o = {.size = sizeof(o)};
	struct kvt_driver *d;
	struct kvt_seq_stat ss;
	int r;

	if (!c || !p || !ret_drv)
		return refuse(-EINVAL, "kvt_driver_open: NULL client, parameters or result");
	if (opts) {
		if (opts->size < sizeof(o) || opts->flags || opts->reserved[0] ||
		    opts->reserved[1] || (opts->prefix_blocks && !opts->ns))
			return refuse(-EINVAL,
				      "kvt_driver_open: bad options (size %u, flags %#x, "
				      "reserved not zero, or prefix_blocks without ns)",
				      opts->size, opts->flags);
		o = *opts;
	}
	if (!p->t0_buf_id || !p->stage_buf_id || !p->stage_slots || !p->delta ||
	    p->t0_slots <= p->delta || !p->layers || !p->max_tokens || p->max_tokens > (1u << 24))
		return refuse(
		    -EINVAL,
		    "kvt_driver_open: the driver needs a T0 region of more than delta "
		    "slots, a staging region and max_tokens in 1..2^24 (t0_buf_id %u, "
		    "t0_slots %u, delta %u, stage_buf_id %u, stage_slots %u, max_tokens %u)",
		    p->t0_buf_id, p->t0_slots, p->delta, p->stage_buf_id, p->stage_slots,
		    p->max_tokens);
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->c = c;
	d->layers = p->layers;
	d->t0_slots = p->t0_slots;
	d->stage_slots = p->stage_slots;
	d->max_tokens = p->max_tokens;
	d->prompt_len = p->prompt_len;
	d->rbuf_len = KVT_RETIER_OUT_SIZE(d->t0_slots);
	d->slot_pos = malloc(sizeof(*d->slot_pos) * d->t0_slots);
	d->free_slots = malloc(sizeof(*d->free_slots) * d->t0_slots);
	d->loc = malloc(sizeof(*d->loc) * d->max_tokens);
	d->staged = malloc(sizeof(*d->staged) * d->stage_slots);
	d->vpos = malloc(sizeof(*d->vpos) * d->max_tokens);
	d->vloc = malloc(sizeof(*d->vloc) * d->max_tokens);
	d->rbuf = malloc(d->rbuf_len);
	if (!d->slot_pos || !d->free_slots || !d->loc || !d->staged || !d->vpos || !d->vloc ||
	    !d->rbuf) {
		r = -ENOMEM;
		goto err_free;
	}
	/* Before the first RETIER every slot is free, handed out in order. */
	for (uint32_t s = 0; s < d->t0_slots; s++) {
		d->slot_pos[s] = -1;
		d->free_slots[s] = s;
	}
	d->n_free = d->t0_slots;
	for (uint32_t i = 0; i < d->max_tokens; i++)
		d->loc[i] = LOC_NONE;
	d->arena = kvt_arena(c, &d->arena_size);

	r = o.ns ? kvt_seq_open_prefix(c, p, o.ns, o.prefix_blocks, &d->seq)
		 : kvt_seq_open(c, p, &d->seq);
	if (r < 0)
		goto err_free;
	d->st.seq = d->seq;
	if (o.prefix_blocks) {
		/* The shared positions, all T1: staged now, they are the first view. */
		r = kvt_seq_stat(c, d->seq, &ss);
		if (r < 0)
			goto err_close;
		if (!ss.n_tokens || ss.n_tokens > d->max_tokens ||
		    ss.tier_count[1] != ss.n_tokens) {
			r = refuse(-EPROTO,
				   "a sequence opened from %u blocks holds %llu positions, %llu "
				   "of them T1 (max_tokens %u)",
				   o.prefix_blocks, (unsigned long long)ss.n_tokens,
				   (unsigned long long)ss.tier_count[1], d->max_tokens);
			goto err_close;
		}
		d->n = (uint32_t)ss.n_tokens;
		r = stage(d, KVT_FETCH_F_T1);
		if (r >= 0 && (uint32_t)r != d->n)
			r = fail(d, -EPROTO, "FETCH staged %d of the %u shared positions", r, d->n);
		if (r < 0)
			goto err_close;
		rebuild_view(d);
		d->st.prefix_tokens = d->n;
	}
	*ret_drv = d;
	return 0;

err_close:
	kvt_seq_close(c, d->seq);
	if (d->err)
		kvtc_set_error("%s", d->why);
err_free:
	d->seq = 0;
	kvt_driver_close(d);
	return r;
}

KVT_EXPORT int
kvt_driver_step_begin(struct kvt_driver *d, uint32_t q, const uint32_t **ret_slots)
{
	uint32_t *take;
	int rebuilt = 0, r;

	if (!d)
		return refuse(-EINVAL, "kvt_driver_step_begin: NULL driver");
	if (d->err)
		return sticky(d);
	if (d->q)
		return refuse(-EBUSY,
			      "kvt_driver_step_begin: the pass at n=%u is not ended "
			      "(kvt_driver_step_end())",
			      d->n);
	if (!q)
		return refuse(-EINVAL, "kvt_driver_step_begin: a pass of 0 tokens");
	if ((uint64_t)d->n + q > d->max_tokens)
		return refuse(-ENOSPC,
			      "%u + %u tokens exceed max_tokens=%u; open the sequence with "
			      "a larger max_tokens",
			      d->n, q, d->max_tokens);
	/* Re-tier when the handed-out slots are used up, and when the prompt is in. */
	if (d->n > 0 && (d->next_free + q > d->n_free || d->n == d->prompt_len)) {
		r = retier(d);
		if (r < 0)
			return r;
		rebuilt = 1;
	}
	if (d->next_free + q > d->n_free) {
		/*
		 * A pass longer than the free slots RETIER handed out (the prompt, or a long
		 * continuation): any slot free now will do, lowest first, after those.
		 */
		uint32_t have = d->n_free - d->next_free, k = d->n_free;

		for (uint32_t i = d->next_free; i < d->n_free; i++)
			d->slot_pos[d->free_slots[i]] = -2; /* handed out already */
		for (uint32_t s = 0; s < d->t0_slots && k < d->next_free + q; s++)
			if (d->slot_pos[s] == -1)
				d->free_slots[k++] = s;
		for (uint32_t i = d->next_free; i < d->n_free; i++)
			d->slot_pos[d->free_slots[i]] = -1;
		if (k < d->next_free + q)
			return refuse(
			    -ENOSPC,
			    "a pass of %u tokens needs %u free T0 slots, %u are free; raise "
			    "max_tokens or hbm_frac, or feed the tokens in shorter passes",
			    q, q, have + (k - d->n_free));
		d->n_free = d->next_free + q;
	}
	take = d->free_slots + d->next_free;
	for (uint32_t i = 0; i < q; i++) {
		uint32_t p = d->n + i;

		d->slot_pos[take[i]] = (int32_t)p;
		d->loc[p] = take[i];
		d->vpos[d->vn + i] = p;
		d->vloc[d->vn + i] = take[i];
	}
	d->q = q;
	if (ret_slots)
		*ret_slots = take;
	return rebuilt;
}

KVT_EXPORT uint32_t
kvt_driver_view(const struct kvt_driver *d, const uint32_t **ret_pos, const uint32_t **ret_loc)
{
	if (!d)
		return 0;
	if (ret_pos)
		*ret_pos = d->vpos;
	if (ret_loc)
		*ret_loc = d->vloc;
	return d->vn + d->q;
}

KVT_EXPORT int
kvt_driver_step_end(struct kvt_driver *d, const float *w, uint32_t nw)
{
	uint32_t m, first, len, end;
	struct kvt_sqe *e;
	uint64_t off;
	float *dense;

	if (!d)
		return refuse(-EINVAL, "kvt_driver_step_end: NULL driver");
	if (d->err)
		return sticky(d);
	m = d->vn + d->q;
	if (!d->q)
		return refuse(-EINVAL, "kvt_driver_step_end: no pass begun");
	if (w && nw != m)
		return refuse(-EINVAL, "kvt_driver_step_end: %u weights for a view of %u entries",
			      nw, m);
	for (uint32_t i = 0; w && i < nw; i++)
		if (!(w[i] >= 0.0f && w[i] <= 1e30f))
			return refuse(-EINVAL,
				      "kvt_driver_step_end: weight %u (position %u) is %g: "
				      "weights are finite and >= 0",
				      i, d->vpos[i], (double)w[i]);
	end = d->n + d->q;

	e = queue_op(d, (uint64_t)d->q * 4, &off);
	if (!e)
		return d->err;
	memcpy(d->arena + off, d->free_slots + d->next_free, (size_t)d->q * 4);
	kvt_prep_append_t0(e, d->seq, off, d->q);
	e->user_data = UD_APPEND | end;

	if (w) {
		first = d->vpos[0];
		len = end - first;
		e = queue_op(d, (uint64_t)len * 4, &off);
		if (!e)
			return d->err;
		dense = (float *)(void *)(d->arena + off);
		if (len == m) {
			/* no holes: the view is every position from first on; + 0 turns -0 into 0
			 */
			for (uint32_t i = 0; i < m; i++)
				dense[i] = w[i] + 0.0f;
		} else {
			memset(dense, 0, (size_t)len * 4);
			for (uint32_t i = 0; i < m; i++)
				dense[d->vpos[i] - first] = w[i] + 0.0f;
		}
		kvt_prep_score_add(e, d->seq, first, off, len);
		e->user_data = UD_SCORE | end;
		d->st.score_adds++;
	}
	d->next_free += d->q;
	d->vn = m;
	d->n = end;
	d->q = 0;
	d->st.steps++;
	return 0;
}

KVT_EXPORT int
kvt_driver_flush(struct kvt_driver *d)
{
	if (!d)
		return refuse(-EINVAL, "kvt_driver_flush: NULL driver");
	if (d->err)
		return sticky(d);
	if (d->q)
		return refuse(-EBUSY, "kvt_driver_flush: inside the pass at n=%u", d->n);
	return reap(d);
}

KVT_EXPORT int
kvt_driver_stats(const struct kvt_driver *d, struct kvt_driver_stats *ret)
{
	uint32_t size;

	if (!d || !ret || ret->size < STATS_SIZE_V1)
		return -EINVAL;
	size = ret->size;
	*ret = d->st;
	ret->size = size;
	ret->n = d->n;
	ret->view = d->vn + d->q;
	ret->t0_slots = d->t0_slots;
	ret->stage_slots = d->stage_slots;
	return 0;
}

KVT_EXPORT uint32_t
kvt_driver_seq(const struct kvt_driver *d)
{
	return d ? d->seq : 0;
}

KVT_EXPORT int
kvt_driver_close(struct kvt_driver *d)
{
	int r = 0;

	if (!d)
		return 0;
	if (d->err) {
		r = d->err;
	} else if (d->seq) {
		/* An open pass's rows are not the caller's promise yet: its ops were never queued.
		 */
		r = reap(d);
		if (r == 0)
			r = kvt_seq_close(d->c, d->seq);
	}
	free(d->slot_pos);
	free(d->free_slots);
	free(d->loc);
	free(d->staged);
	free(d->vpos);
	free(d->vloc);
	free(d->rbuf);
	free(d);
	return r;
}
