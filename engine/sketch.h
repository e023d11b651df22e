/* SPDX-License-Identifier: MIT */
/*
 * sketch.h - an int8 sketch of a retrieval zone's keys: the exact top-k for about half the
 * bytes of an fp16 scan (docs/retrieval.md, "The exact top-k from the int8 sketch").
 *
 * Per key the sketch holds D codes c = round(v / s) in [-127, 127], stored as bytes c + 128, with
 * s = max_j |v_j| / 127 (v the key as the caller stores it, converted to f32), the scale s and a
 * tolerance t (both f32): D + 8 bytes against the 2D of an fp16 row. A unit query x is
 * quantised once to integers x^ (|x^_j| <= 16256, scale s_x); the estimate
 * e = s_x * s * sum_j x^_j c_j is an integer dot product (with AVX-512 VNNI, the offset codes
 * times the query's two signed byte digits, x^ = 128 h + l), and
 *
 *	|fl(<x, v>) - e| <= t
 *
 * for any such query, where fl(<x, v>) is the f32 inner product kvt_simd_dot_rows() computes
 * for the stored row. t is fixed at encoding:
 *
 *	t = [ (1 + 2^-20) r + E b + (gamma_D + 8u)(b + r) ] (1 + 2^-20)
 *
 * with r = |v - s c| (the key's own rounding residual, computed in double), b = |s c|,
 * E = 3.2e-5 sqrt(D) >= |x - s_x x^| for any unit x (half an integer step per element), u = 2^-24
 * and gamma_D = D u / (1 - D u) (the f32 dot product's, the estimate's and the interval ends'
 * own rounding). Cauchy-Schwarz on the two residuals gives the bound; nothing in it is
 * statistical. An int16 query would make E smaller still; r dominates t either way.
 *
 * The search (kvt_sketch_topk(), through kvt_paris_search() with opts.sketch) streams the
 * codes and bounds every key's exact score to [e - t, e + t]; a key whose upper end stays under
 * the k-th largest lower end cannot be in the top k, and of the rest it reads rows only while
 * their upper ends reach the k-th exact score found (three steps, in sketch.c). So the result
 * is the exact top-k, the same as scoring every row, while it reads D + 8 bytes of every key
 * instead of 2D (4D for f32 rows) and rows for about k keys plus those within 2t of the cut.
 *
 * A second, coarser level serves the fast path (kvt_sketch_topk_fast(), opts.fast): per key
 * two bits a dim of y = R (v - m_p) (R the SRHT of srht.h, m_p a centre fixed per page): the
 * sign, and whether |y_j| passes h = 0.8453 mean |y| (a gaussian's median), giving the level
 * l_j = sign(y_j) (1 + 2 [|y_j| > h]); and f = |y|^2 / <y, l>, D / 4 + 4 bytes. For a unit
 * query x, <v, x> = <y, R x> + <m_p, x> and
 *
 *	<v, x> ~ f * <l, R x> + <m_p, x>
 *
 * (RaBitQ's estimator for a quantized direction). Nothing bounds it; its use is to choose the C
 * keys to score exactly (C >= k), which makes the result the exact top-k of those C, close to
 * the true one for C of 8-16 k (BENCHMARKS.md). Centring matters: keys share large common
 * components (the outlier channels of post-RoPE keys) whose signs carry no information; the
 * magnitude bit matters more on real keys (SmolLM2, head_dim 64: the top 100 within the best
 * 1,600 by estimate for 0.79 of them with signs alone, 0.98 with the second bit; a numpy model
 * before the code). m_p is the mean of page p - 1's finite keys as appended, and for page 0
 * that of the finite keys among the first append's (so a sketch rebuilt in other batches may
 * differ in page 0's codes, never in the int8 level). kvt_sketch_set() re-encodes a key
 * against its page's centre.
 *
 * Storage: pages of page_keys keys from the caller's allocator (struct kvt_paris_alloc): codes
 * [P][D] (bytes c + 128), scales [P], tolerances [P] (the int8 level, the first
 * kvt_sketch_int8_bytes() bytes), then the 2-bit codes [D/4][P] (byte b of key i at b * P + i:
 * bit j the sign of dim 4b + j, bit 4 + j its magnitude), f [P] and the centre m_p [D] (f32),
 * then the group level: per group of G consecutive keys (64 at D = 128, 16 at 64) the int8
 * codes [P/G][D] of the mean of its keys' int8 values, their scales [P/G] and a flag [P/G]
 * (+inf: the group holds a key that is not finite). A probing search (kvt_sketch_topk_fast()
 * with probe) ranks the groups by their means and reads only the best (sketch.c, "probing").
 * One writer; searches only read.
 */
#ifndef KVT_ENGINE_SKETCH_H
#define KVT_ENGINE_SKETCH_H

#include <stdint.h>

#include "paris.h"
#include "srht.h"

/* sums of a group's int8 values (sketch.c, the group level): the group being filled */
struct kvt_sketch_gacc {
	double sum[KVT_SRHT_MAX_DIM];
	uint32_t count; /* finite keys summed */
	bool bad;	/* a key not finite */
};

struct kvt_sketch {
	uint32_t dim;	     /* 64 or 128 */
	uint32_t page_keys;  /* keys per page, a power of two >= 64 */
	uint32_t page_shift; /* log2(page_keys) */
	uint32_t n;	     /* keys encoded: index i is the caller's key i */
	uint32_t npages;
	uint32_t max_pages;
	size_t page_bytes;
	void **pages;
	struct kvt_paris_alloc alloc;
	struct kvt_srht rot; /* the 2-bit level's rotation (KVT_SRHT_SEED) */
	/* the finite keys appended to the page being filled: the next page's centre */
	double csum[KVT_SRHT_MAX_DIM];
	uint32_t ccount;
	struct kvt_sketch_gacc gacc;
};

/*
 * kvt_sketch_init - an empty sketch. @dim: 64 or 128 (the rotation's).
 * @page_keys: a power of two in [64, 1 << 20]; 0 means KVT_PARIS_PAGE_KEYS. @alloc: copied,
 * NULL means aligned_alloc()/free(). Returns 0 or -EINVAL. Allocates nothing.
 */
int kvt_sketch_init(struct kvt_sketch *sk, unsigned int dim, unsigned int page_keys,
		    const struct kvt_paris_alloc *alloc);

/* kvt_sketch_fini - give back every page. Accepts a zeroed sketch. */
void kvt_sketch_fini(struct kvt_sketch *sk);

/* kvt_sketch_page_bytes - bytes of one page: page_keys * (5 dim / 4 + 12) + 4 dim, plus
 * (dim + 8) for each group (page_keys / 64 at dim 128, page_keys / 16 at 64), rounded up to a
 * multiple of 64. */
size_t kvt_sketch_page_bytes(unsigned int dim, unsigned int page_keys);

/* kvt_sketch_int8_bytes - the int8 level's bytes at the start of each page:
 * page_keys * (dim + 8). */
size_t kvt_sketch_int8_bytes(unsigned int dim, unsigned int page_keys);

/* kvt_sketch_reserve - room for @nkeys keys in all. Returns the capacity, -ENOMEM or
 * -EOVERFLOW (past 2^31 keys); on failure the sketch keeps what it had. */
int kvt_sketch_reserve(struct kvt_sketch *sk, uint32_t nkeys);

/*
 * kvt_sketch_append - encode @count keys as indices n .. n + count - 1, key i at @rows + i *
 * @stride bytes, @dim values of @dtype (KVT_DTYPE_F16, _BF16 or _F32): the values the exact
 * stage will read for these keys. A key with an infinite or NaN element gets t = +inf (always
 * read). Returns the new count, -EINVAL (bad @dtype) or -ENOSPC (reserve first; nothing is
 * appended).
 */
int kvt_sketch_append(struct kvt_sketch *sk, const void *rows, size_t stride, unsigned int dtype,
		      uint32_t count);

/*
 * kvt_sketch_set - re-encode key @i (< n) from @key (@dim f32): its stored value changed (a
 * row quantised to int8 is read back dequantised). The bound holds only while the sketch
 * encodes what the exact stage reads. Returns 0 or -ERANGE.
 */
int kvt_sketch_set(struct kvt_sketch *sk, uint32_t i, const float *key);

/*
 * kvt_sketch_sign_code - key @i's 2-bit code as the sketch holds it: @ret_bits (dim / 4 bytes,
 * layout above), *@ret_f and the page's centre (*@ret_centre, dim floats).
 * With @key (dim f32) not NULL, what encoding @key against that centre gives instead (for
 * tests: a sketch must hold the encoding of the value the exact stage reads).
 * Returns 0 or -ERANGE (i >= n).
 */
int kvt_sketch_sign_code(const struct kvt_sketch *sk, uint32_t i, const float *key,
			 uint8_t *ret_bits, float *ret_f, const float **ret_centre);

/*
 * kvt_sketch_topk - the exact top-k of the live keys of @ix (dropped ones, and those @drop
 * names, never read) for the unit query @q->x, scores as kvt_simd_dot_rows() computes them
 * from @keys (rows or get), ties to the lower index: what scoring every row would give.
 * @sk must encode the same @ix->n keys. Uses @scr's cand / score, ref_idx / ref_score and sk_*
 * arrays, grown with malloc only past the largest lists a search has needed before.
 * Returns the number of results (min(k, keys left)), -EINVAL (n mismatch, dim mismatch),
 * -ENOMEM or -EIO (keys->get returned NULL). Scores are for the unit query.
 * Counts the rows it read in *@ret_read when that is not NULL.
 */
int kvt_sketch_topk(const struct kvt_sketch *sk, const struct kvt_paris_index *ix,
		    const struct kvt_paris_query *q, uint32_t k, const struct kvt_paris_keys *keys,
		    const struct kvt_paris_drop *drop, struct kvt_paris_scratch *scr,
		    uint32_t *ret_idx, float *ret_score, uint32_t *ret_read);

/*
 * kvt_sketch_topk_fast - the top-k by exact score of the @cand live keys of @ix (dropped ones
 * and those @drop names left out) with the highest 2-bit estimates (ties to the lower
 * index): C rows read instead of every key's D + 8 bytes, not the exact top-k. @cand >= k;
 * with @cand >= the live keys every key is scored, which is the exact top-k. Scores, order and
 * the rest as kvt_sketch_topk(); *@ret_read counts the rows read (min(cand, live)).
 * @probe 0: every live key is estimated. Else (>= cand; at D = 128 one of every live key is 0):
 * only the keys of the best groups are, every group with a live key ranked by its mean's int8
 * estimate (a group holding a key that is not finite first) and the best taken until they
 * hold @probe live keys; at D = 64 their keys are ranked by the int8 level's estimate (the
 * 2-bit code is 16 bytes there), at 128 by the 2-bit level. Should they give fewer than @cand
 * candidates (keys @drop names), the whole zone is estimated. Not the exact top-k of the zone:
 * its recall is the share of that top-k inside the probed groups.
 * Uses @scr's ref_idx / ref_score (the candidates), cand / score and sk_* arrays.
 * Returns the number of results (min(k, candidates)), -EINVAL (n or dim mismatch, k == 0,
 * cand < k, 0 < probe < cand), -ENOMEM or -EIO.
 */
int kvt_sketch_topk_fast(const struct kvt_sketch *sk, const struct kvt_paris_index *ix,
			 const struct kvt_paris_query *q, uint32_t k, uint32_t cand, uint32_t probe,
			 const struct kvt_paris_keys *keys, const struct kvt_paris_drop *drop,
			 struct kvt_paris_scratch *scr, uint32_t *ret_idx, float *ret_score,
			 uint32_t *ret_read);

/*
 * kvt_sketch_fast_cands - kvt_sketch_topk_fast()'s candidate stage alone: the min(@cand, live)
 * live keys with the highest 2-bit estimates for the query @x (dim floats, as prepared for
 * the index: kvt_paris_query.x), ties to the lower index, into @ret_idx in no order; with
 * @probe, of the probed groups' keys (as kvt_sketch_topk_fast()). @sample false starts the bar
 * at -inf instead of from a sample of the zone (the set is the same either way; tests hold
 * the two against each other; a probe never samples). Uses @scr as the fast path does.
 * Returns the count, -EINVAL (n or dim mismatch, cand == 0, 0 < probe < cand) or -ENOMEM.
 */
int kvt_sketch_fast_cands(const struct kvt_sketch *sk, const struct kvt_paris_index *ix,
			  const float *x, uint32_t cand, uint32_t probe,
			  const struct kvt_paris_drop *drop, bool sample,
			  struct kvt_paris_scratch *scr, uint32_t *ret_idx);

#endif /* KVT_ENGINE_SKETCH_H */
