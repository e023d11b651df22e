/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "paris_seq.h"

int
kvt_paris_seq_init(struct kvt_paris_seq *seq, const struct kvt_paris_geom *g,
		   const struct kvt_paris_zone_cfg *zone, const struct kvt_srht *srht,
		   unsigned int page_keys, const struct kvt_paris_alloc *alloc, unsigned int flags)
{
	const bool sketch = !(flags & KVT_PARIS_SEQ_F_NO_SKETCH);
	size_t nix;
	int r;

	memset(seq, 0, sizeof(*seq));
	if (!g->layers || !g->kv_heads || !g->q_heads || g->q_heads % g->kv_heads ||
	    g->head_dim != srht->dim || kvt_paris_zone_check(zone) < 0 ||
	    (flags & ~KVT_PARIS_SEQ_F_ALL))
		return -EINVAL;
	if ((uint64_t)g->layers * g->kv_heads > 1u << 20)
		return -EINVAL;
	nix = (size_t)g->layers * g->kv_heads;
	seq->ix = calloc(nix, sizeof(*seq->ix));
	if (sketch)
		seq->sk = calloc(nix, sizeof(*seq->sk));
	if (!seq->ix || (sketch && !seq->sk)) {
		r = -ENOMEM;
		goto err_fini;
	}
	seq->g = *g;
	seq->zone = *zone;
	seq->srht = *srht;
	for (size_t i = 0; i < nix; i++) {
		r = kvt_paris_index_init(&seq->ix[i], g->head_dim, page_keys, alloc);
		if (r < 0)
			goto err_fini;
		if (!sketch)
			continue;
		r = kvt_sketch_init(&seq->sk[i], g->head_dim, page_keys, alloc);
		if (r < 0)
			goto err_fini;
	}
	return 0;

err_fini:
	kvt_paris_seq_fini(seq);
	return r;
}

void
kvt_paris_seq_fini(struct kvt_paris_seq *seq)
{
	if (!seq)
		return;
	/* init zeroes the arrays, so a half-built seq holds only zeroed entries past the last
	 * one set up, which both finis accept */
	for (size_t i = 0; seq->ix && i < (size_t)seq->g.layers * seq->g.kv_heads; i++)
		kvt_paris_index_fini(&seq->ix[i]);
	for (size_t i = 0; seq->sk && i < (size_t)seq->g.layers * seq->g.kv_heads; i++)
		kvt_sketch_fini(&seq->sk[i]);
	free(seq->ix);
	free(seq->sk);
	seq->ix = NULL;
	seq->sk = NULL;
}

int
kvt_paris_seq_len(const struct kvt_paris_seq *seq, uint32_t layer)
{
	if (layer >= seq->g.layers)
		return -ERANGE;
	return (int)seq->ix[(size_t)layer * seq->g.kv_heads].n;
}

int
kvt_paris_seq_index(const struct kvt_paris_seq *seq, uint32_t layer, uint32_t head,
		    const struct kvt_paris_index **ret_ix)
{
	if (layer >= seq->g.layers || head >= seq->g.kv_heads)
		return -ERANGE;
	*ret_ix = &seq->ix[(size_t)layer * seq->g.kv_heads + head];
	return 0;
}

int
kvt_paris_seq_append(struct kvt_paris_seq *seq, uint32_t layer, uint32_t pos, uint32_t count,
		     const float *keys, size_t token_stride)
{
	struct kvt_paris_index *row;
	struct kvt_sketch *sk;
	uint32_t hkv = seq->g.kv_heads, d = seq->g.head_dim;
	int r = 0;

	if (layer >= seq->g.layers)
		return -ERANGE;
	row = &seq->ix[(size_t)layer * hkv];
	sk = seq->sk ? &seq->sk[(size_t)layer * hkv] : NULL;
	if ((uint64_t)pos != (uint64_t)seq->zone.sink + row[0].n || token_stride < (size_t)hkv * d)
		return -EINVAL;
	if ((uint64_t)row[0].n + count > (1u << 31))
		return -EINVAL;
	/* Every page first: once they are all there no append can fail, so the heads' indexes
	 * and sketches stay the same length (a search checks it) and a failed flush can be
	 * retried. */
	for (uint32_t h = 0; h < hkv; h++) {
		r = kvt_paris_index_reserve(&row[h], row[h].n + count);
		if (r < 0)
			return r;
		r = sk ? kvt_sketch_reserve(&sk[h], sk[h].n + count) : 0;
		if (r < 0)
			return r;
	}
	for (uint32_t h = 0; h < hkv; h++) {
		r = kvt_paris_index_append(&row[h], &seq->srht, keys + (size_t)h * d, token_stride,
					   count);
		if (r < 0)
			return r;
		if (!sk)
			continue;
		/* f32 values: the sketch encodes exactly the keys the caller's get returns */
		r = kvt_sketch_append(&sk[h], keys + (size_t)h * d, token_stride * sizeof(float),
				      KVT_DTYPE_F32, count);
		if (r < 0)
			return r;
	}
	return (int)row[0].n;
}

int
kvt_paris_seq_sketch_set(struct kvt_paris_seq *seq, uint32_t layer, uint32_t head, uint32_t pos,
			 const float *key)
{
	size_t i = (size_t)layer * seq->g.kv_heads + head;

	if (layer >= seq->g.layers || head >= seq->g.kv_heads || pos < seq->zone.sink ||
	    pos - seq->zone.sink >= seq->ix[i].n)
		return -ERANGE;
	if (!seq->sk)
		return 0; /* no sketch: the refine reads the new value itself */
	return kvt_sketch_set(&seq->sk[i], pos - seq->zone.sink, key);
}

int
kvt_paris_seq_drop(struct kvt_paris_seq *seq, uint32_t pos)
{
	uint32_t hkv = seq->g.kv_heads;
	int dropped = 0;

	if (pos < seq->zone.sink)
		return 0;
	for (uint32_t l = 0; l < seq->g.layers; l++) {
		struct kvt_paris_index *row = &seq->ix[(size_t)l * hkv];
		int r = 0;

		if (pos - seq->zone.sink >= row[0].n)
			continue;
		for (uint32_t h = 0; h < hkv; h++)
			r |= kvt_paris_index_drop(&row[h], pos - seq->zone.sink) > 0;
		dropped += r;
	}
	return dropped;
}

uint32_t
kvt_paris_seq_topk_stride(const struct kvt_paris_seq *seq, const struct kvt_paris_topk_opts *opts)
{
	if (opts->flags & KVT_PARIS_F_UNION)
		return opts->k * (seq->g.q_heads / seq->g.kv_heads);
	return opts->k;
}

static int
cmp_idx(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;

	return (x[0] > y[0]) - (x[0] < y[0]);
}

static int
cmp_score_desc(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	float fx, fy;

	memcpy(&fx, &x[1], sizeof(fx));
	memcpy(&fy, &y[1], sizeof(fy));
	if (fx != fy)
		return fx < fy ? 1 : -1;
	return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Merges g sorted per-query-head lists (pos, score) in place into their union, keeping the
 * highest score of a position, best first. Pairs are packed as two u32 so qsort can move them. */
static uint32_t
union_merge(uint32_t *pos, float *score, uint32_t total)
{
	uint32_t(*pair)[2] = malloc((size_t)total * sizeof(*pair));
	uint32_t m = 0;

	if (!pair)
		return 0;
	for (uint32_t i = 0; i < total; i++) {
		pair[i][0] = pos[i];
		memcpy(&pair[i][1], &score[i], sizeof(float));
	}
	qsort(pair, total, sizeof(*pair), cmp_idx);
	for (uint32_t i = 0; i < total; i++) {
		if (m && pair[m - 1][0] == pair[i][0]) {
			float a, b;

			memcpy(&a, &pair[m - 1][1], sizeof(a));
			memcpy(&b, &pair[i][1], sizeof(b));
			if (b > a)
				pair[m - 1][1] = pair[i][1];
			continue;
		}
		pair[m][0] = pair[i][0];
		pair[m][1] = pair[i][1];
		m++;
	}
	qsort(pair, m, sizeof(*pair), cmp_score_desc);
	for (uint32_t i = 0; i < m; i++) {
		pos[i] = pair[i][0];
		memcpy(&score[i], &pair[i][1], sizeof(float));
	}
	free(pair);
	return m;
}

/* Adapts the sequence's key accessor to one index: retrieval index -> absolute position. */
struct head_keys {
	const struct kvt_paris_seq_keys *keys;
	uint32_t layer, head, sink;
	const struct kvt_paris_seq_rows *rows;
};

static const float *
head_key_get(void *ctx, uint32_t idx, float *tmp)
{
	const struct head_keys *hk = ctx;

	return hk->keys->get(hk->keys->ctx, hk->layer, hk->head, hk->sink + idx, tmp);
}

/* Adapts the caller's drop test (absolute positions) to one index. */
struct head_drop {
	const struct kvt_paris_topk_opts *opts;
	uint32_t sink;
};

static bool
head_dropped(void *ctx, uint32_t idx)
{
	const struct head_drop *hd = ctx;

	return hd->opts->dropped(hd->opts->drop_ctx, hd->sink + idx);
}

static void
head_key_prefetch(void *ctx, uint32_t idx)
{
	const struct head_keys *hk = ctx;

	hk->keys->prefetch(hk->keys->ctx, hk->layer, hk->head, hk->sink + idx);
}

static const void *
head_key_rows(void *ctx, uint32_t idx, uint32_t *ret_run)
{
	const struct head_keys *hk = ctx;

	return hk->rows->rows(hk->rows->ctx, hk->layer, hk->head, hk->sink + idx, ret_run);
}

int
kvt_paris_seq_topk(const struct kvt_paris_seq *seq, uint32_t layer, const float *q, size_t q_len,
		   const struct kvt_paris_topk_opts *opts, struct kvt_paris_scratch *scr,
		   uint32_t *ret_pos, float *ret_score, uint32_t *ret_count)
{
	uint32_t hkv = seq->g.kv_heads, d = seq->g.head_dim, grp = seq->g.q_heads / hkv;
	uint32_t stride = kvt_paris_seq_topk_stride(seq, opts), k = opts->k;
	struct head_keys hk = {opts->keys, layer, 0, seq->zone.sink, opts->rows};
	const bool rows = opts->rows && opts->rows->rows;
	const struct kvt_paris_keys ik = {
	    .get = head_key_get,
	    .ctx = &hk,
	    .prefetch = opts->keys && opts->keys->prefetch ? head_key_prefetch : NULL,
	    .rows = rows ? head_key_rows : NULL,
	    .dtype = rows ? opts->rows->dtype : 0,
	    .stride = rows ? opts->rows->stride : 0};
	struct kvt_paris_search_opts so = {.k = k,
					   .rho_cand = opts->rho_cand,
					   .rho_col = opts->rho_col,
					   .refine = opts->refine,
					   .keys = opts->refine || opts->fast ? &ik : NULL,
					   .exact = opts->exact};
	const struct head_drop hd = {opts, seq->zone.sink};
	const struct kvt_paris_drop drop = {head_dropped, (void *)&hd};
	const struct kvt_paris_index *row;
	struct kvt_paris_query pq;
	int r;

	if (layer >= seq->g.layers)
		return -ERANGE;
	if (!k || q_len != (size_t)seq->g.q_heads * d || (opts->flags & ~KVT_PARIS_F_ALL))
		return -EINVAL;
	if (opts->refine && (opts->refine < k || !opts->keys || !opts->keys->get))
		return -EINVAL;
	if (opts->fast && (opts->fast < k || !opts->keys || !opts->keys->get))
		return -EINVAL;
	if (opts->probe && (!opts->fast || opts->probe < opts->fast))
		return -EINVAL;
	row = &seq->ix[(size_t)layer * hkv];
	if (k > row[0].n)
		return -ERANGE;
	if (opts->dropped)
		so.drop = &drop;

	for (uint32_t h = 0; h < hkv; h++) {
		const float *qh = q + (size_t)h * grp * d;
		uint32_t *op = ret_pos + (size_t)h * stride;
		float *os = ret_score + (size_t)h * stride;

		hk.head = h;
		/* the exact top-k past what the rows scan covers (paris.h, opts.sketch) */
		so.sketch = (opts->refine || opts->fast) && seq->sk
				? &seq->sk[(size_t)layer * hkv + h]
				: NULL;
		/* the fast path needs the sketch's 2-bit level; without one, refine as asked */
		so.fast = so.sketch ? opts->fast : 0;
		so.probe = so.sketch ? opts->probe : 0;
		if (opts->flags & KVT_PARIS_F_UNION) {
			uint32_t tot = 0; /* the lists, back to back */

			for (uint32_t j = 0; j < grp; j++) {
				kvt_paris_query_prep(&seq->srht, qh + (size_t)j * d, &pq);
				r = kvt_paris_search(&row[h], &pq, &so, scr, op + tot, os + tot);
				if (r < 0)
					return r;
				tot += (uint32_t)r;
			}
			ret_count[h] = grp > 1 && tot ? union_merge(op, os, tot) : tot;
			if (tot && !ret_count[h])
				return -ENOMEM;
		} else {
			double sum[KVT_SRHT_MAX_DIM] = {0};
			float mean[KVT_SRHT_MAX_DIM];

			/* GQA: the group's queries are averaged into one retrieval query, summed
			 * in double: an f32 sum of finite queries can overflow */
			for (uint32_t j = 0; j < grp; j++)
				for (uint32_t i = 0; i < d; i++)
					sum[i] += qh[(size_t)j * d + i];
			for (uint32_t i = 0; i < d; i++)
				mean[i] = (float)(sum[i] / grp);
			kvt_paris_query_prep(&seq->srht, mean, &pq);
			r = kvt_paris_search(&row[h], &pq, &so, scr, op, os);
			if (r < 0)
				return r;
			ret_count[h] = (uint32_t)r;
		}
		for (uint32_t i = 0; i < ret_count[h]; i++)
			op[i] += seq->zone.sink;
	}
	return (int)hkv;
}
