/* SPDX-License-Identifier: MIT */
/*
 * paris_search.c - kvt_paris_search() (paris.h): the one entry that chooses, per query, between
 * the index's own pipeline (paris.c: votes, candidates, estimates, exact refine) and the
 * sketch's exact or fast top-k (sketch.c). It sits above both, so that the sketch, built on the
 * index's types and selection, and the index never include each other.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kvt_abi.h"
#include "paris.h"
#include "paris_int.h"
#include "simd.h"
#include "sketch.h"

/*
 * Every key of a zone with no dropped key, scored exactly in index order straight into the
 * scratch (no candidate list), runs of @rows at a time, then its top k. Returns 0 or -EIO.
 */
static int
exact_zone(const struct kvt_paris_index *ix, const struct kvt_paris_query *q,
	   const struct kvt_paris_keys *keys, uint32_t k, struct kvt_paris_scratch *scr,
	   uint32_t *ret_idx, float *ret_score)
{
	const uint32_t n = ix->n;

	for (uint32_t i = 0; i < n;) {
		uint32_t run = 0;
		const void *row = keys->rows(keys->ctx, i, &run);

		if (!row) {
			row = keys->get(keys->ctx, i, scr->key_tmp);
			if (!row)
				return -EIO;
			kvt_simd_dot_rows(row, 0, 1, KVT_DTYPE_F32, q->x, q->dim,
					  &scr->ref_score[i++]);
			continue;
		}
		if (run < 1)
			run = 1;
		if (run > n - i)
			run = n - i;
		kvt_simd_dot_rows(row, keys->stride, run, keys->dtype, q->x, q->dim,
				  &scr->ref_score[i]);
		i += run;
	}
	kvt_paris_topk_select(NULL, scr->ref_score, n, k, ret_idx, ret_score);
	return 0;
}

/*
 * The exact refine stage: the @nr best of the @nc estimated candidates in @scr (cand, score)
 * are rescored from the full keys and the top k of those goes out; with @nr == @nc every
 * candidate is, and the estimates are not read. Returns 0 or -EIO.
 */
static int
refine_exact(const struct kvt_paris_query *q, const struct kvt_paris_keys *keys, uint32_t nc,
	     uint32_t nr, uint32_t k, struct kvt_paris_scratch *scr, uint32_t *ret_idx,
	     float *ret_score)
{
	int r;

	if (nr < nc)
		kvt_paris_topk_select(scr->cand, scr->score, nc, nr, scr->ref_idx, scr->ref_score);
	else /* every candidate is rescored: no estimates needed, index order */
		memcpy(scr->ref_idx, scr->cand, (size_t)nc * sizeof(*scr->cand));
	r = kvt_paris_score_list(q, keys, scr->ref_idx, nr, scr->key_tmp, scr->ref_score);
	if (r < 0)
		return r;
	kvt_paris_topk_select(scr->ref_idx, scr->ref_score, nr, k, ret_idx, ret_score);
	return 0;
}

int
kvt_paris_search(const struct kvt_paris_index *ix, const struct kvt_paris_query *q,
		 const struct kvt_paris_search_opts *opts, struct kvt_paris_scratch *scr,
		 uint32_t *ret_idx, float *ret_score)
{
	struct kvt_paris_search_opts fo;
	double rho_cand, rho_col, cd;
	uint32_t n = ix->n, k = opts->k, c, nc, nr = 0;
	int r;

	if (!k || q->dim != ix->dim)
		return -EINVAL;
	if (opts->refine && (opts->refine < k || !opts->keys || !opts->keys->get))
		return -EINVAL;
	if (opts->exact > KVT_PARIS_EXACT_NEVER)
		return -EINVAL;
	if (opts->fast && (opts->fast < k || !opts->sketch || !opts->keys || !opts->keys->get))
		return -EINVAL;
	if (opts->probe && (!opts->fast || opts->probe < opts->fast))
		return -EINVAL;
	if ((opts->refine || opts->fast) && opts->keys->rows &&
	    opts->keys->dtype != KVT_DTYPE_F16 && opts->keys->dtype != KVT_DTYPE_BF16 &&
	    opts->keys->dtype != KVT_DTYPE_F32)
		return -EINVAL;
	if (opts->rho_cand < 0.0 || opts->rho_cand > 1.0 || opts->rho_col < 0.0 ||
	    opts->rho_col > 1.0 || isnan(opts->rho_cand) || isnan(opts->rho_col))
		return -EINVAL;
	if (k > n)
		return -ERANGE;
	/* Dropped keys are out of the zone: ratios, budgets and C apply to the live ones. */
	n = kvt_paris_index_live(ix);
	if (k > n)
		k = n;
	if (!k)
		return 0;
	if (opts->fast && !kvt_paris_fast_pays(n, opts->fast)) {
		/* a short zone: the exact answer costs no more than the fast one */
		fo = *opts;
		fo.fast = 0;
		fo.probe = 0;
		fo.refine = opts->fast;
		fo.exact = KVT_PARIS_EXACT_AUTO;
		opts = &fo;
	}
	if (opts->refine)
		kvt_paris_schedule_refine(n, ix->dim, &rho_cand, &rho_col);
	else
		kvt_paris_schedule(n, &rho_cand, &rho_col);
	if (opts->rho_cand > 0.0)
		rho_cand = opts->rho_cand;
	if (opts->rho_col > 0.0)
		rho_col = opts->rho_col;
	cd = ceil((double)n * rho_cand);
	c = cd >= (double)n ? n : (uint32_t)cd;
	/* at least 4k candidates (or all): on a short zone C = k would leave the estimate no
	 * choice, the vote alone would pick the result */
	if ((uint64_t)c < 4ull * k)
		c = 4ull * k < n ? 4 * k : n;
	/*
	 * The candidate stage never cuts below the refine budget, and a short zone is read
	 * whole: when the budget covers the zone, every key is scored exactly and the result is
	 * the exact top-k.
	 */
	if (opts->refine) {
		bool all = opts->exact == KVT_PARIS_EXACT_ALWAYS || opts->refine >= n ||
			   (opts->exact == KVT_PARIS_EXACT_AUTO &&
			    kvt_paris_exact_covers(n, ix->dim, opts->refine, opts->keys));

		nr = all ? n : opts->refine;
		if (c < nr)
			c = nr;
	}

	/* The fast path: the sketch's 2-bit level chooses whom to score exactly. */
	if (opts->fast) {
		r = kvt_sketch_topk_fast(opts->sketch, ix, q, k, opts->fast, opts->probe,
					 opts->keys, opts->drop, scr, ret_idx, ret_score, NULL);
		if (r < 0)
			return r;
		k = (uint32_t)r;
		goto out;
	}
	/* The exact top-k from the sketch: every live key bounded, rows read for the few that
	 * can reach the k-th exact score (sketch.h). */
	if (opts->refine && opts->sketch && opts->exact != KVT_PARIS_EXACT_NEVER &&
	    kvt_paris_sketch_pays(n, ix->dim, opts->keys)) {
		r = kvt_sketch_topk(opts->sketch, ix, q, k, opts->keys, opts->drop, scr, ret_idx,
				    ret_score, NULL);
		if (r < 0)
			return r;
		k = (uint32_t)r;
		goto out;
	}
	/* The whole zone, exactly, with nothing to leave out: no candidate list at all. */
	if (nr == n && !ix->ndead && !opts->drop && opts->keys->rows) {
		r = kvt_paris_scratch_reserve(scr, 0, 0, n);
		if (r < 0)
			return r;
		r = exact_zone(ix, q, opts->keys, k, scr, ret_idx, ret_score);
		if (r < 0)
			return r;
		goto out;
	}
	r = kvt_paris_scratch_reserve(scr, c < n ? kvt_paris_votes_len(ix) : 0, c, nr);
	if (r < 0)
		return r;
	if (c < n) {
		r = kvt_paris_vote_tables(ix, q, rho_col, scr->tab);
		if (r < 0)
			return r;
		kvt_paris_votes(ix, (const uint8_t(*)[256])scr->tab, scr->votes, scr->hist);
	}
	nc = kvt_paris_select_live(ix, scr->votes, c, c < n ? scr->hist : NULL, scr->cand);
	if (opts->drop) {
		uint32_t live = 0;

		for (uint32_t i = 0; i < nc; i++)
			if (!opts->drop->dropped(opts->drop->ctx, scr->cand[i]))
				scr->cand[live++] = scr->cand[i];
		nc = live;
		if (k > nc)
			k = nc;
		if (nr > nc)
			nr = nc;
		if (!k)
			return 0;
	}
	if (!nr || nr < nc)
		kvt_paris_rerank_norm(ix, q, 1.0f, scr->cand, nc, scr->score);
	if (nr) {
		r = refine_exact(q, opts->keys, nc, nr, k, scr, ret_idx, ret_score);
		if (r < 0)
			return r;
	} else {
		kvt_paris_topk_select(scr->cand, scr->score, nc, k, ret_idx, ret_score);
	}
out:
	/* Ranked on the unit query; the scores go out for q itself. A finite score times a
	 * finite norm is never NaN (it saturates to +-inf past FLT_MAX). */
	for (uint32_t i = 0; i < k; i++)
		if (ret_score[i] != 0.0f)
			ret_score[i] = (float)(ret_score[i] * q->dnorm);
	return (int)k;
}
