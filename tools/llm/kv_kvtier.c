/* SPDX-License-Identifier: MIT */
/*
 * kv_kvtier.c - kv_backend over kvtierd (see kv_kvtier.h for the protocol and its contract).
 *
 * Client-side state, the mirror of what RETIER tells us:
 *   slot_pos[t0_slots]	position held by each T0 slot, -1 when free
 *   where[max_tokens]	where each position's rows are for the current epoch: a T0 slot (>= 0),
 *			a staging row (WHERE_STAGE(row)), or nowhere (WHERE_NONE: evicted)
 *   free_slots[]	the Δ free slots the last RETIER handed out; appends take them in order
 * Regions, both [layer][K,V][slot|row][kv_head][head_dim] f32, as check_tier.c lays them out:
 *   T0:	t0_slots slots per (layer, K|V)
 *   staging:	max_tokens rows per (layer, K|V)
 *
 * APPEND and SCORE_ADD are queued, not submitted: each step queues its APPEND (count 1, its
 * slot) then its SCORE_ADD (that step's weights, unchanged), and the queue goes to the daemon
 * in one submit before the next RETIER (every Δ steps), SEQ_STAT or SEQ_CLOSE, or earlier
 * when the SQ or the arena is full. The daemon runs a session's SQEs in ring order, so it
 * applies exactly the per-step sequence of ops and its score[] sums the same f32 values in the
 * same order as with one round trip per op: tiering decisions are the same. What it saves is
 * a doorbell per step: on a loaded 2-core machine, waking the poller each step cost about
 * 3 ms per token (the submitting thread is preempted), blocking round trips about 0.8 ms.
 * Payloads sit in the arena, bump-allocated (64-byte aligned) until the queue is reaped.
 * Everything else (RETIER, FETCH, SEQ_STAT) is a blocking call made with nothing in flight.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_kvtier.h"

#define WHERE_NONE	  (-1)
#define WHERE_STAGE(row)  (-2 - (int32_t)(row))
#define WHERE_IS_STAGE(w) ((w) <= -2)
#define WHERE_ROW(w)	  ((uint32_t)(-2 - (w)))

/* user_data of the queued ops (the blocking wrappers count up from 1). */
#define UD_APPEND (1ull << 63) /* | position */
#define UD_SCORE  ((1ull << 63) | (1ull << 62))

struct kv_kvtier {
	struct kv_backend kv; /* first: the ops get a kv_backend pointer */
	struct kv_kvtier_opts o;
	struct kvt_client *c;
	struct kvt_buf *t0, *stage;
	uint32_t seq;
	uint32_t t0_slots, stage_slots, row; /* row: floats per (token, layer, K|V) */
	int err;			     /* sticky: the first kvtier error */
	float *t0_base, *stage_base;
	int32_t *slot_pos;
	int32_t *where;
	uint32_t *free_slots, n_free, next_free;
	uint32_t *staged; /* positions of the staging rows, from the last FETCH */
	uint32_t n_staged;
	uint8_t *rbuf; /* RETIER output */
	size_t rbuf_len;
	float *arena; /* the session's arena */
	uint64_t arena_size;
	uint32_t inflight;   /* queued or submitted ops, not reaped */
	uint64_t arena_used; /* bytes of the arena their payloads use */
	/* the current step's view: entries by position, rebuilt at layer 0 */
	uint32_t vn;
	int view_dirty;
	uint32_t *vpos;
	const float **v0; /* layer-0 K row of each entry */
	uint8_t *vin_t0;  /* entry is a T0 slot (else a staging row) */
	const float **kp, **vp;
	struct kv_kvtier_counters cnt;
	/* prefix sharing */
	uint32_t ns;		    /* the namespace's id in this session, 0: none */
	struct kvt_block_key *keys; /* of the prompt's full blocks */
	struct kv_kvtier_share sh;
};

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void
kv_kvtier_opts_default(struct kv_kvtier_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->policy = KVT_POLICY_TIERED;
	o->hbm_frac = 0.5f;
	o->evict_frac = 0.03f;
	o->delta = 64;
	o->sinks = 4;
	o->window = 128;
	o->max_tokens = 2048;
	o->spin_us = 20;
}

static const char *const policy_names[KVT_POLICY__COUNT] = {
    [KVT_POLICY_TIERED] = "tiered",
    [KVT_POLICY_H2O] = "h2o",
    [KVT_POLICY_STREAMING] = "streaming",
    [KVT_POLICY_FULL] = "full",
};

int
kv_kvtier_policy(const char *name)
{
	for (int i = 0; i < KVT_POLICY__COUNT; i++)
		if (!strcmp(name, policy_names[i]))
			return i;
	return -1;
}

const char *
kv_kvtier_policy_name(int policy)
{
	return policy >= 0 && policy < KVT_POLICY__COUNT ? policy_names[policy] : NULL;
}

static inline float *
t0_row(struct kv_kvtier *kk, uint32_t slot, uint32_t layer, uint32_t kvsel)
{
	return kk->t0_base + (((size_t)layer * 2 + kvsel) * kk->t0_slots + slot) * kk->row;
}

static inline float *
stage_row(struct kv_kvtier *kk, uint32_t r, uint32_t layer, uint32_t kvsel)
{
	return kk->stage_base + (((size_t)layer * 2 + kvsel) * kk->stage_slots + r) * kk->row;
}

static int
fail(struct kv_kvtier *kk, int err)
{
	if (!kk->err)
		kk->err = err;
	return err;
}

/* Submits whatever is queued and reaps every queued op, checking its result. */
static int
reap(struct kv_kvtier *kk)
{
	double t0 = now_s();
	int r;

	if (!kk->inflight)
		return 0;
	r = kvt_submit(kk->c);
	if (r < 0)
		return fail(kk, r);
	while (kk->inflight) {
		struct kvt_cqe cqe;

		r = kvt_wait_cqe(kk->c, &cqe);
		if (r < 0)
			return fail(kk, r);
		kk->inflight--;
		if (cqe.user_data == UD_SCORE) {
			if (cqe.res < 0)
				return fail(kk, cqe.res);
		} else if ((cqe.user_data & ~(uint64_t)UINT32_MAX) == UD_APPEND) {
			/* The new n is the appended position + 1. */
			if (cqe.res < 0)
				return fail(kk, cqe.res);
			if ((uint64_t)cqe.res != (cqe.user_data & UINT32_MAX) + 1)
				return fail(kk, -EPROTO);
		} else {
			return fail(kk, -EPROTO);
		}
	}
	kk->arena_used = 0;
	kk->cnt.reap_s += now_s() - t0;
	return 0;
}

/*
 * An SQE for a queued op whose payload of @len bytes goes to the arena at *@ret_off; reaps the
 * queue first when the SQ, the CQ or the arena is full. NULL with kk->err set on failure.
 */
static struct kvt_sqe *
queue_op(struct kv_kvtier *kk, uint64_t len, uint64_t *ret_off)
{
	uint64_t need = (len + 63) & ~63ull;
	struct kvt_sqe *e;

	if (need > kk->arena_size) {
		fail(kk, -E2BIG);
		return NULL;
	}
	if (kk->arena_used + need > kk->arena_size && reap(kk) < 0)
		return NULL;
	e = kvt_get_sqe(kk->c);
	if (!e && kk->inflight) {
		if (reap(kk) < 0)
			return NULL;
		e = kvt_get_sqe(kk->c);
	}
	if (!e) {
		fail(kk, -ECONNRESET); /* nothing in flight: only a dead session refuses */
		return NULL;
	}
	*ret_off = kk->arena_used;
	kk->arena_used += need;
	kk->inflight++;
	return e;
}

/*
 * RETIER, follow the slot changes, take the new free slots, then FETCH every T1/T2 row of all
 * layers and rebuild where[]. Checks that what we can see is exactly the n - T3 live positions,
 * each in one place: a daemon that broke that would silently change the model's output.
 */
static int
retier(struct kv_kvtier *kk)
{
	const struct kvt_retier_result *res = (const void *)kk->rbuf;
	const struct kvt_slot_change *ch;
	const uint32_t *fs;
	uint32_t n = kk->kv.n, seen = 0;
	double t0 = now_s(), t1;
	int r;

	r = reap(kk);
	if (r < 0)
		return r;
	r = kvt_retier(kk->c, kk->seq, kk->rbuf, kk->rbuf_len);
	if (r < 0)
		return fail(kk, r);
	if ((size_t)r < sizeof(*res) || res->size != sizeof(*res) || res->n_tokens != n ||
	    (size_t)r != sizeof(*res) + (size_t)res->n_changes * 8 + (size_t)res->n_free * 4 ||
	    res->n_free == 0 || res->n_free > kk->t0_slots)
		return fail(kk, -EPROTO);
	ch = (const void *)(kk->rbuf + sizeof(*res));
	fs = (const void *)(ch + res->n_changes);
	for (uint32_t i = 0; i < res->n_changes; i++) {
		if (ch[i].slot >= kk->t0_slots || ch[i].pos >= (int32_t)n || ch[i].pos < -1)
			return fail(kk, -EPROTO);
		kk->slot_pos[ch[i].slot] = ch[i].pos;
	}
	for (uint32_t i = 0; i < res->n_free; i++) {
		if (fs[i] >= kk->t0_slots || kk->slot_pos[fs[i]] != -1)
			return fail(kk, -EPROTO);
		kk->free_slots[i] = fs[i];
	}
	kk->n_free = res->n_free;
	kk->next_free = 0;
	kk->cnt.retiers++;
	t1 = now_s();
	kk->cnt.retier_s += t1 - t0;

	kk->n_staged = 0;
	if (res->tier_count[1] + res->tier_count[2]) {
		r = kvt_fetch(kk->c, kk->seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, kk->kv.layers, 0,
			      kk->staged, kk->stage_slots);
		if (r < 0)
			return fail(kk, r);
		kk->n_staged = (uint32_t)r;
		kk->cnt.fetches++;
		kk->cnt.rows_staged += (uint64_t)r;
	}
	kk->cnt.fetch_s += now_s() - t1;

	for (uint32_t p = 0; p < n; p++)
		kk->where[p] = WHERE_NONE;
	for (uint32_t i = 0; i < kk->n_staged; i++) {
		if (kk->staged[i] >= n || kk->where[kk->staged[i]] != WHERE_NONE)
			return fail(kk, -EPROTO);
		kk->where[kk->staged[i]] = WHERE_STAGE(i);
		seen++;
	}
	for (uint32_t s = 0; s < kk->t0_slots; s++) {
		int32_t p = kk->slot_pos[s];

		if (p < 0)
			continue;
		if (kk->where[p] != WHERE_NONE)
			return fail(kk, -EPROTO); /* in T0 twice, or in T0 and staged */
		kk->where[p] = (int32_t)s;
		seen++;
	}
	if (seen != n - res->tier_count[3])
		return fail(kk, -EPROTO);
	kk->view_dirty = 1;
	return 0;
}

static int
kvtier_begin(struct kv_backend *kv, uint32_t pos)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;

	if (kk->err)
		return kk->err;
	if (pos != kv->n)
		return -EINVAL;
	/* The prompt is all in: offer its blocks before the first generated token's step. */
	if (pos == kk->o.prompt_len && kk->o.share_ns && kk->sh.published < 0) {
		int r = kv_kvtier_publish(kv);

		if (r < 0)
			return r;
	}
	/* First step (n = 0: hands out the first slots), slots used up (every Δ appends), and
	 * the end of the prompt, as the spec asks. */
	if (pos == 0 || kk->next_free == kk->n_free || (pos == kk->o.prompt_len))
		return retier(kk);
	return 0;
}

/* Entries of the step's view, by position: where[] scanned once per step. */
static void
build_view(struct kv_kvtier *kk)
{
	uint32_t m = 0;

	for (uint32_t p = 0; p < kk->kv.n; p++) {
		int32_t w = kk->where[p];

		if (w == WHERE_NONE)
			continue;
		kk->vpos[m] = p;
		if (WHERE_IS_STAGE(w)) {
			kk->v0[m] = stage_row(kk, WHERE_ROW(w), 0, 0);
			kk->vin_t0[m] = 0;
		} else {
			kk->v0[m] = t0_row(kk, (uint32_t)w, 0, 0);
			kk->vin_t0[m] = 1;
		}
		m++;
	}
	kk->vn = m;
	kk->view_dirty = 0;
}

static int
kvtier_view(struct kv_backend *kv, uint32_t layer, struct kv_view *ret_view)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	/* Offsets, in floats, from a layer-0 K row to the same slot's (layer, K|V) rows. */
	size_t t0_l = 2 * (size_t)kk->t0_slots * kk->row, t0_v = (size_t)kk->t0_slots * kk->row;
	size_t st_l = 2 * (size_t)kk->stage_slots * kk->row;
	size_t st_v = (size_t)kk->stage_slots * kk->row;
	double t0 = now_s();

	if (kk->err)
		return kk->err;
	if (layer >= kv->layers)
		return -EINVAL;
	if (layer == 0 || kk->view_dirty)
		build_view(kk);
	for (uint32_t i = 0; i < kk->vn; i++) {
		const float *b = kk->v0[i];

		if (kk->vin_t0[i]) {
			kk->kp[i] = b + layer * t0_l;
			kk->vp[i] = b + layer * t0_l + t0_v;
		} else {
			kk->kp[i] = b + layer * st_l;
			kk->vp[i] = b + layer * st_l + st_v;
		}
	}
	ret_view->n = kk->vn;
	ret_view->pos = kk->vpos;
	ret_view->k = kk->kp;
	ret_view->v = kk->vp;
	kk->cnt.view_s += now_s() - t0;
	return 0;
}

static int
kvtier_append(struct kv_backend *kv, uint32_t pos, const float *rows)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	struct kvt_sqe *e;
	uint64_t off;
	uint32_t slot;
	double t0 = now_s();

	if (kk->err)
		return kk->err;
	if (pos != kv->n)
		return -EINVAL;
	if (pos >= kk->o.max_tokens)
		return -ENOSPC;
	if (kk->next_free == kk->n_free)
		return fail(kk, -EPROTO); /* begin() re-tiers before the slots run out */
	slot = kk->free_slots[kk->next_free];
	for (uint32_t l = 0; l < kv->layers; l++) {
		memcpy(t0_row(kk, slot, l, 0), rows + kv_row_off(kv, l, 0),
		       kk->row * sizeof(float));
		memcpy(t0_row(kk, slot, l, 1), rows + kv_row_off(kv, l, 1),
		       kk->row * sizeof(float));
	}
	e = queue_op(kk, sizeof(slot), &off);
	if (!e)
		return kk->err;
	memcpy((char *)kk->arena + off, &slot, sizeof(slot));
	e->opcode = KVT_OP_APPEND;
	e->op_flags = KVT_APPEND_F_T0;
	e->seq = kk->seq;
	e->user_data = UD_APPEND | pos;
	e->arena_off = off;
	e->arena_len = sizeof(slot);
	e->count = 1;
	kk->cnt.append_s += now_s() - t0;
	kk->cnt.appends++;
	kk->next_free++;
	kk->slot_pos[slot] = (int32_t)pos;
	kk->where[pos] = (int32_t)slot;
	kv->n++;
	kk->view_dirty = 1;
	return 0;
}

static int
kvtier_score(struct kv_backend *kv, uint32_t n, const uint32_t *pos, const float *w)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	struct kvt_sqe *e;
	uint32_t first, len;
	uint64_t off;
	double t0 = now_s();
	float *dense;

	if (kk->err)
		return kk->err;
	if (!n)
		return 0;
	first = pos[0];
	if (pos[n - 1] >= kv->n || first > pos[n - 1])
		return -EINVAL;
	len = pos[n - 1] - first + 1;
	e = queue_op(kk, (uint64_t)len * sizeof(float), &off);
	if (!e)
		return kk->err;
	dense = (float *)((char *)kk->arena + off);
	memset(dense, 0, (size_t)len * sizeof(float));
	for (uint32_t i = 0; i < n; i++) {
		if (pos[i] < first || pos[i] - first >= len)
			return fail(kk, -EINVAL); /* not increasing: the SQE is already taken */
		/* Rounding can leave a weight at -0 or a denormal; SCORE_ADD wants >= 0. */
		dense[pos[i] - first] = w[i] > 0.0f ? w[i] : 0.0f;
	}
	e->opcode = KVT_OP_SCORE_ADD;
	e->seq = kk->seq;
	e->user_data = UD_SCORE;
	e->arena_off = off;
	e->arena_len = len * sizeof(float);
	e->count = len;
	e->arg0 = first;
	kk->cnt.score_adds++;
	kk->cnt.score_s += now_s() - t0;
	return 0;
}

static void
kvtier_destroy(struct kv_backend *kv)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;

	if (kk->c) {
		/* After a lost daemon these fail at once; disconnect frees everything anyway. */
		if (kk->seq && !kk->err && reap(kk) == 0)
			kvt_seq_close(kk->c, kk->seq);
		kvt_disconnect(kk->c);
	}
	free(kk->slot_pos);
	free(kk->where);
	free(kk->free_slots);
	free(kk->staged);
	free(kk->rbuf);
	free(kk->vpos);
	free(kk->v0);
	free(kk->vin_t0);
	free(kk->kp);
	free(kk->vp);
	free(kk->keys);
	free(kk);
}

static const struct kv_backend_ops kvtier_ops = {
    .begin = kvtier_begin,
    .view = kvtier_view,
    .append = kvtier_append,
    .score = kvtier_score,
    .destroy = kvtier_destroy,
};

/* T0 slots for the options: the HBM budget at max_tokens (see kv_kvtier.h). */
static uint32_t
t0_slots_for(const struct kv_kvtier_opts *o)
{
	uint32_t prot = (o->sinks > o->prompt_len ? o->sinks : o->prompt_len) + o->window;
	uint64_t budget;

	switch (o->policy) {
	case KVT_POLICY_FULL:
		budget = o->max_tokens;
		break;
	case KVT_POLICY_STREAMING:
		budget = prot;
		break;
	default:
		budget = (uint64_t)ceil((double)o->hbm_frac * o->max_tokens);
		break;
	}
	if (budget > o->max_tokens)
		budget = o->max_tokens;
	/* kvtierd wants the protected set to fit with Δ slots free, even in a short sequence. */
	if (budget < prot)
		budget = prot;
	return (uint32_t)budget + o->delta;
}

/*
 * Joins the namespace, LOOKUPs (and pins) the prompt's leading blocks, opens the sequence from
 * them: kv.n starts at the matched tokens. At most (prompt_len - 1) / block_tokens blocks are
 * looked up, so at least the last prompt token is computed here (its logits are needed).
 */
static int
open_shared(struct kv_kvtier *kk, const struct kvt_seq_params *p, const uint32_t *prompt,
	    const char **ret_what)
{
	const struct kv_kvtier_opts *o = &kk->o;
	struct kvt_ns_params np = {.size = sizeof(np)};
	uint32_t bt = o->block_tokens ? o->block_tokens : KVT_BLOCK_TOKENS_DEFAULT, nb, m;
	int r;

	np.layers = p->layers;
	np.kv_heads = p->kv_heads;
	np.head_dim = p->head_dim;
	np.dtype = p->dtype;
	np.block_tokens = bt;
	snprintf(np.name, sizeof(np.name), "%s", o->share_ns);
	*ret_what = "NS_OPEN";
	r = kvt_ns_open(kk->c, &np, &kk->ns);
	if (r < 0)
		return r;
	nb = o->prompt_len / bt;
	kk->keys = malloc(sizeof(*kk->keys) * (nb ? nb : 1));
	if (!kk->keys)
		return -ENOMEM;
	*ret_what = "block keys";
	r = kvt_block_keys(&np, NULL, prompt, o->prompt_len, kk->keys, nb);
	if (r < 0)
		return r;
	if ((uint32_t)r != nb)
		return -EPROTO;
	m = (o->prompt_len - 1) / bt;
	*ret_what = "LOOKUP";
	r = m ? kvt_lookup(kk->c, kk->ns, kk->keys, m, KVT_LOOKUP_F_PIN) : 0;
	if (r < 0)
		return r;
	if ((uint32_t)r > m)
		return -EPROTO;
	m = (uint32_t)r;
	*ret_what = "SEQ_OPEN";
	r = kvt_seq_open_prefix(kk->c, p, kk->ns, m, &kk->seq);
	if (r < 0)
		return r;
	kk->kv.n = m * bt;
	kk->sh.block_tokens = bt;
	kk->sh.prompt_blocks = nb;
	kk->sh.matched_tokens = m * bt;
	return 0;
}

int
kv_kvtier_create(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
		 const struct kv_kvtier_opts *o, struct kv_backend **ret_kv, char *err,
		 size_t errlen)
{
	struct kvt_opts co = {.size = sizeof(co), .spin_us = o->spin_us, .name = o->name};
	struct kvt_seq_params p = {.size = sizeof(p)};
	struct kv_kvtier *kk;
	uint64_t row = (uint64_t)kv_heads * head_dim, tf = (uint64_t)layers * 2 * row;
	const char *what = "out of memory";
	double t_open;
	int r;

	if (errlen)
		err[0] = '\0';
	if (!layers || layers > KVT_MAX_LAYERS || !kv_heads || kv_heads > KVT_MAX_KV_HEADS ||
	    !head_dim || head_dim > KVT_MAX_HEAD_DIM || !o->delta || !o->max_tokens ||
	    o->max_tokens > (1u << 24) || o->policy >= KVT_POLICY__COUNT) {
		snprintf(err, errlen, "bad geometry or options");
		return -EINVAL;
	}
	if (o->share_ns &&
	    (!o->prompt || !o->prompt_len || o->prompt_len > o->max_tokens || !*o->share_ns ||
	     strlen(o->share_ns) >= KVT_NS_NAME_LEN || o->block_tokens > KVT_BLOCK_TOKENS_MAX)) {
		snprintf(err, errlen,
			 "prefix sharing needs the prompt's tokens, a namespace name of 1..%d "
			 "characters and block_tokens <= %d",
			 KVT_NS_NAME_LEN - 1, KVT_BLOCK_TOKENS_MAX);
		return -EINVAL;
	}
	kk = calloc(1, sizeof(*kk));
	if (!kk)
		return -ENOMEM;
	kk->kv.ops = &kvtier_ops;
	kk->kv.layers = layers;
	kk->kv.kv_heads = kv_heads;
	kk->kv.head_dim = head_dim;
	kk->kv.token_floats = (uint32_t)tf;
	kk->o = *o;
	kk->o.prompt = NULL; /* not kept: read only here */
	kk->sh.published = -1;
	kk->row = (uint32_t)row;
	kk->t0_slots = t0_slots_for(o);
	kk->stage_slots = o->max_tokens;
	kk->rbuf_len = KVT_RETIER_OUT_SIZE(kk->t0_slots);
	kk->slot_pos = malloc(sizeof(*kk->slot_pos) * kk->t0_slots);
	kk->free_slots = malloc(sizeof(*kk->free_slots) * kk->t0_slots);
	kk->rbuf = malloc(kk->rbuf_len);
	kk->where = malloc(sizeof(*kk->where) * o->max_tokens);
	kk->staged = malloc(sizeof(*kk->staged) * o->max_tokens);
	kk->vpos = malloc(sizeof(*kk->vpos) * o->max_tokens);
	kk->v0 = malloc(sizeof(*kk->v0) * o->max_tokens);
	kk->vin_t0 = malloc(o->max_tokens);
	kk->kp = malloc(sizeof(*kk->kp) * o->max_tokens);
	kk->vp = malloc(sizeof(*kk->vp) * o->max_tokens);
	if (!kk->slot_pos || !kk->free_slots || !kk->rbuf || !kk->where || !kk->staged ||
	    !kk->vpos || !kk->v0 || !kk->vin_t0 || !kk->kp || !kk->vp) {
		r = -ENOMEM;
		goto err_free;
	}
	for (uint32_t s = 0; s < kk->t0_slots; s++)
		kk->slot_pos[s] = -1;

	what = "cannot connect to kvtierd";
	r = kvt_connect(o->socket, &co, &kk->c);
	if (r < 0)
		goto err_free;
	kk->arena = kvt_arena(kk->c, &kk->arena_size);
	what = "cannot allocate the T0 region";
	r = kvt_buf_alloc(kk->c, (uint64_t)layers * 2 * kk->t0_slots * row * 4, &kk->t0);
	if (r < 0)
		goto err_free;
	what = "cannot allocate the staging region";
	r = kvt_buf_alloc(kk->c, (uint64_t)layers * 2 * kk->stage_slots * row * 4, &kk->stage);
	if (r < 0)
		goto err_free;
	kk->t0_base = kvt_buf_ptr(kk->t0);
	kk->stage_base = kvt_buf_ptr(kk->stage);

	p.layers = (uint16_t)layers;
	p.kv_heads = (uint16_t)kv_heads;
	p.head_dim = (uint16_t)head_dim;
	p.dtype = KVT_DTYPE_F32;
	p.policy = o->policy;
	p.score_mode = KVT_SCORE_SUM;
	p.protect_prompt = 1;
	p.delta = o->delta;
	p.sinks = o->sinks;
	p.window = o->window;
	p.prompt_len = o->prompt_len;
	p.hbm_frac = o->hbm_frac;
	p.evict_frac = o->evict_frac;
	p.t2_frac = o->t2_frac;
	p.t2_flags = o->t2_flags;
	p.max_tokens = o->max_tokens;
	p.t0_buf_id = kvt_buf_id(kk->t0);
	p.t0_slots = kk->t0_slots;
	p.t0_base_off = 0;
	p.t0_slot_stride = row * 4;
	p.t0_kv_stride = (uint64_t)kk->t0_slots * row * 4;
	p.t0_layer_stride = 2 * p.t0_kv_stride;
	p.stage_buf_id = kvt_buf_id(kk->stage);
	p.stage_slots = kk->stage_slots;
	p.stage_base_off = 0;
	p.stage_slot_stride = row * 4;
	p.stage_kv_stride = (uint64_t)kk->stage_slots * row * 4;
	p.stage_layer_stride = 2 * p.stage_kv_stride;
	t_open = now_s();
	if (o->share_ns) {
		r = open_shared(kk, &p, o->prompt, &what);
	} else {
		what = "SEQ_OPEN";
		r = kvt_seq_open(kk->c, &p, &kk->seq);
	}
	kk->sh.open_s = now_s() - t_open;
	if (r < 0)
		goto err_free;
	*ret_kv = &kk->kv;
	return 0;

err_free:
	if (errlen)
		snprintf(err, errlen, "%s: %s%s%s", what, kvt_strerror(r),
			 *kvt_last_error() ? ": " : "", kvt_last_error());
	kk->seq = 0;
	kvtier_destroy(&kk->kv);
	return r;
}

int
kv_kvtier_stat(struct kv_backend *kv, struct kvt_seq_stat *ret_stat)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	int r = reap(kk);

	return r < 0 ? r : kvt_seq_stat(kk->c, kk->seq, ret_stat);
}

void
kv_kvtier_share_info(const struct kv_backend *kv, struct kv_kvtier_share *ret)
{
	*ret = ((const struct kv_kvtier *)kv)->sh;
}

int
kv_kvtier_publish(struct kv_backend *kv)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	uint32_t n_new = 0;
	int r;

	if (kk->err)
		return kk->err;
	if (!kk->o.share_ns || kk->sh.published >= 0)
		return 0;
	if (kv->n < kk->o.prompt_len)
		return -EINVAL;
	r = reap(kk);
	if (r < 0)
		return r;
	r = kk->sh.prompt_blocks
		? kvt_publish(kk->c, kk->seq, kk->keys, kk->sh.prompt_blocks, &n_new)
		: 0;
	if (r == -ENOSPC) {
		/* the daemon's prefix cache is full of blocks in use: this run goes on unshared */
		kk->sh.publish_err = r;
		r = 0;
	}
	if (r < 0)
		return fail(kk, r);
	kk->sh.published = r;
	kk->sh.published_new = n_new;
	return 0;
}

void
kv_kvtier_counters(const struct kv_backend *kv, struct kv_kvtier_counters *ret)
{
	*ret = ((const struct kv_kvtier *)kv)->cnt;
}

uint32_t
kv_kvtier_session(const struct kv_backend *kv)
{
	return kvt_session_id(((const struct kv_kvtier *)kv)->c);
}

uint32_t
kv_kvtier_seq(const struct kv_backend *kv)
{
	return ((const struct kv_kvtier *)kv)->seq;
}
