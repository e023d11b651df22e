/* SPDX-License-Identifier: MIT */
/*
 * kv_kvtier.c - kv_backend over kvtierd (see kv_kvtier.h for the protocol and its contract).
 *
 * The tiering loop is libkvtier's driver (kvtier.h, "tiering driver"): begin() is its
 * step_begin (RETIER and FETCH when due, one T0 slot for the step's token), append() copies
 * the token's rows into that slot, score() is its step_end (the queued APPEND and SCORE_ADD).
 * What stays here is the kv_backend face: the two regions, the per-layer row pointers of the
 * driver's view, prefix sharing's keys and PUBLISH, and the tool's counters.
 * Regions, both [layer][K,V][slot|row][kv_head][head_dim] f32, as check_tier.c lays them out:
 *   T0:	t0_slots slots per (layer, K|V)
 *   staging:	max_tokens rows per (layer, K|V)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_kvtier.h"

struct kv_kvtier {
	struct kv_backend kv; /* first: the ops get a kv_backend pointer */
	struct kv_kvtier_opts o;
	struct kvt_client *c;
	struct kvt_buf *t0, *stage;
	struct kvt_driver *d;
	uint32_t t0_slots, stage_slots, row; /* row: floats per (token, layer, K|V) */
	int err;			     /* sticky: the first kvtier error */
	float *t0_base, *stage_base;
	const uint32_t *slot; /* the step's T0 slot, from begin() */
	uint32_t vn;	      /* view entries before the step's own token */
	const uint32_t *vpos, *vloc;
	const float **kp, **vp;
	struct kv_kvtier_counters cnt;
	/* prefix sharing */
	uint32_t ns;		    /* the namespace's id in this session, 0: none */
	uint32_t prefix_blocks;	    /* matched by LOOKUP: the sequence opens from them */
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

static int
fail(struct kv_kvtier *kk, int err)
{
	if (!kk->err)
		kk->err = err;
	return err;
}

static int
kvtier_begin(struct kv_backend *kv, uint32_t pos)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	int r;

	if (kk->err)
		return kk->err;
	if (pos != kv->n)
		return -EINVAL;
	if (pos >= kk->o.max_tokens)
		return -ENOSPC;
	/* The prompt is all in: offer its blocks before the first generated token's step. */
	if (pos == kk->o.prompt_len && kk->o.share_ns && kk->sh.published < 0) {
		r = kv_kvtier_publish(kv);
		if (r < 0)
			return r;
	}
	r = kvt_driver_step_begin(kk->d, 1, &kk->slot);
	if (r < 0)
		return fail(kk, r);
	kk->vn = kvt_driver_view(kk->d, &kk->vpos, &kk->vloc) - 1;
	return 0;
}

/* The step's view at @layer: the driver's entries but the step's own token, rows read in place. */
static int
kvtier_view(struct kv_backend *kv, uint32_t layer, struct kv_view *ret_view)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	/* Offsets, in floats, of (layer, K) and of V from it in each region. */
	size_t t0_l = 2 * (size_t)kk->t0_slots * kk->row * layer;
	size_t t0_v = (size_t)kk->t0_slots * kk->row;
	size_t st_l = 2 * (size_t)kk->stage_slots * kk->row * layer;
	size_t st_v = (size_t)kk->stage_slots * kk->row;
	const float *t0, *sg;
	double t0s = now_s();

	if (kk->err)
		return kk->err;
	if (layer >= kv->layers)
		return -EINVAL;
	t0 = kk->t0_base + t0_l;
	sg = kk->stage_base + st_l;
	for (uint32_t i = 0; i < kk->vn; i++) {
		uint32_t l = kk->vloc[i];
		const float *b = l < kk->t0_slots ? t0 + (size_t)l * kk->row
						  : sg + (size_t)(l - kk->t0_slots) * kk->row;

		kk->kp[i] = b;
		kk->vp[i] = b + (l < kk->t0_slots ? t0_v : st_v);
	}
	ret_view->n = kk->vn;
	ret_view->pos = kk->vpos;
	ret_view->k = kk->kp;
	ret_view->v = kk->vp;
	kk->cnt.view_s += now_s() - t0s;
	return 0;
}

static int
kvtier_append(struct kv_backend *kv, uint32_t pos, const float *rows)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	size_t t0_v = (size_t)kk->t0_slots * kk->row;
	float *b = kk->t0_base + (size_t)*kk->slot * kk->row;
	double t0 = now_s();

	if (kk->err)
		return kk->err;
	if (pos != kv->n || !kk->slot)
		return -EINVAL;
	for (uint32_t l = 0; l < kv->layers; l++, b += 2 * t0_v) {
		memcpy(b, rows + kv_row_off(kv, l, 0), kk->row * sizeof(float));
		memcpy(b + t0_v, rows + kv_row_off(kv, l, 1), kk->row * sizeof(float));
	}
	kk->cnt.append_s += now_s() - t0;
	kk->cnt.appends++;
	kv->n++;
	return 0;
}

/* The step's weights: @pos must be the view's positions then the step's own (kv.h). */
static int
kvtier_score(struct kv_backend *kv, uint32_t n, const uint32_t *pos, const float *w)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	double t0 = now_s();
	int r;

	if (kk->err)
		return kk->err;
	if (!kk->slot || n != kk->vn + 1 || (n && memcmp(pos, kk->vpos, (size_t)n * 4)))
		return -EINVAL;
	r = kvt_driver_step_end(kk->d, w, n);
	if (r < 0)
		return fail(kk, r);
	kk->slot = NULL;
	kk->cnt.score_adds++;
	kk->cnt.score_s += now_s() - t0;
	return 0;
}

static void
kvtier_destroy(struct kv_backend *kv)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;

	/* After a lost daemon these fail at once; disconnect frees everything anyway. */
	kvt_driver_close(kk->d);
	kvt_disconnect(kk->c);
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

/*
 * Joins the namespace, LOOKUPs (and pins) the prompt's leading blocks, which the driver opens the
 * sequence from: kv.n starts at the matched tokens. At most (prompt_len - 1) / block_tokens blocks
 * are looked up, so at least the last prompt token is computed here (its logits are needed).
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
	kk->prefix_blocks = m;
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
	struct kvt_driver_opts dopts = {.size = sizeof(dopts)};
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
	kk->stage_slots = o->max_tokens;
	kk->kp = malloc(sizeof(*kk->kp) * o->max_tokens);
	kk->vp = malloc(sizeof(*kk->vp) * o->max_tokens);
	if (!kk->kp || !kk->vp) {
		r = -ENOMEM;
		goto err_free;
	}
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
	what = "T0 slots";
	r = kvt_driver_t0_slots(&p);
	if (r < 0)
		goto err_free;
	kk->t0_slots = (uint32_t)r;

	what = "cannot connect to kvtierd";
	r = kvt_connect(o->socket, &co, &kk->c);
	if (r < 0)
		goto err_free;
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
		if (r < 0)
			goto err_free;
	}
	dopts.ns = kk->ns;
	dopts.prefix_blocks = kk->prefix_blocks;
	what = "SEQ_OPEN";
	r = kvt_driver_open(kk->c, &p, &dopts, &kk->d);
	kk->sh.open_s = now_s() - t_open;
	if (r < 0)
		goto err_free;
	*ret_kv = &kk->kv;
	return 0;

err_free:
	if (errlen)
		snprintf(err, errlen, "%s: %s%s%s", what, kvt_strerror(r),
			 *kvt_last_error() ? ": " : "", kvt_last_error());
	kvtier_destroy(&kk->kv);
	return r;
}

int
kv_kvtier_stat(struct kv_backend *kv, struct kvt_seq_stat *ret_stat)
{
	struct kv_kvtier *kk = (struct kv_kvtier *)kv;
	int r = kvt_driver_flush(kk->d);

	return r < 0 ? fail(kk, r) : kvt_seq_stat(kk->c, kvt_driver_seq(kk->d), ret_stat);
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
	r = kvt_driver_flush(kk->d);
	if (r < 0)
		return fail(kk, r);
	r = kk->sh.prompt_blocks
		? kvt_publish(kk->c, kvt_driver_seq(kk->d), kk->keys, kk->sh.prompt_blocks, &n_new)
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
	const struct kv_kvtier *kk = (const struct kv_kvtier *)kv;
	struct kvt_driver_stats st = {.size = sizeof(st)};

	*ret = kk->cnt;
	if (kvt_driver_stats(kk->d, &st) < 0)
		return;
	ret->retiers = st.retiers;
	ret->fetches = st.fetches;
	ret->rows_staged = st.rows_staged;
	ret->retier_s = (double)st.retier_ns * 1e-9;
	ret->fetch_s = (double)st.fetch_ns * 1e-9;
	ret->reap_s = (double)st.reap_ns * 1e-9;
}

uint32_t
kv_kvtier_session(const struct kv_backend *kv)
{
	return kvt_session_id(((const struct kv_kvtier *)kv)->c);
}

uint32_t
kv_kvtier_seq(const struct kv_backend *kv)
{
	return kvt_driver_seq(((const struct kv_kvtier *)kv)->d);
}
