/* SPDX-License-Identifier: MIT */
/*
 * paris.h - ParisKV retrieval index for one (sequence, layer, kv head) (docs/retrieval.md).
 *
 * Keys are normalised, rotated with the shared SRHT (srht.h) and split into B = D/8 blocks of 8
 * dims. Per key and block the index stores:
 *   - a centroid id byte: the block's sign bits, bit j = [y_j >= 0], LSB = first dim (section 2);
 *   - four code bytes: per dim a nibble (sign << 3) | t, t the 3-bit Lloyd-Max magnitude index of
 *     |u_j| for u = y_b / |y_b| (Beta(1/2, 7/2) levels); byte j holds dim 2j in the low nibble and
 *     dim 2j+1 in the high nibble, so the 4 bytes read as a little-endian u32 hold dim j in bits
 *     [4j, 4j+4) (section 7);
 *   - a calibration weight w_b = |k| * r_b / alpha_b as f32 (section 4);
 * and per block a histogram of centroid ids (u32 [B][256]) over the live keys.
 *
 * Dropped keys (evicted tokens, kvt_paris_index_drop()) keep their codes and index but leave
 * the histograms, vote 0 and are never candidates: a search ranks the live keys as an index of
 * only those would (tier budgets and C from the live count) and returns min(k, live) of them.
 *
 * A search ranks the 256 centroids of every block by flip cost against the rotated query, gives
 * each key a 6-tier collision vote (0..6 per block, 0..6B in all) from the key-mass prefix of its
 * centroid's rank, keeps the C keys with the most votes (counting pass over 0..96, ties to the
 * lower index), estimates <k, q> for them from the 4-bit codes (RSQ-IP) and returns the top k.
 *
 * Exact refine (optional, off by default; NOT part of ParisKV): with opts.refine = R > 0 the R
 * candidates with the best RSQ-IP estimates are rescored with the exact inner product of the
 * full-precision key, read through a caller-supplied accessor (struct kvt_paris_keys), and the
 * top k by exact score is returned, with exact scores. The paper keeps only the 4-bit codes for
 * the retrieval zone (the full keys live on the GPU or nowhere); kvtier can afford this stage
 * because the daemon holds every key row at full precision (or int8) in host DDR anyway. Its
 * cost is R key reads of 4 * dim bytes and R dot products: about 4k of them at R = 4k, small
 * next to the C = rho_cand * n rerank. It removes the estimator error at the cut (the 4-bit
 * estimate of *all* keys tops out near 0.95 recall@100 on the benchmark sets); it cannot bring
 * back true top-k keys the vote left out of the candidate set.
 *
 * Storage: keys live in pages of page_keys keys obtained from a caller-supplied allocator (the
 * daemon will hand out pool pages). Inside a page, centroid ids are subspace-major [B][P]
 * because the vote scan streams them block by block; then come P key records of codes [B][4]
 * followed by weights [B] f32, because the rerank touches a scattered candidate set: one record
 * is two adjacent cache lines in one 4 KiB page (D = 128) instead of lines in two distant places.
 *
 * Thread safety: an index has one writer. Searches only read it, so any number of threads may
 * search one index concurrently, each with its own struct kvt_paris_scratch, as long as no
 * append or reserve runs at the same time.
 */
#ifndef KVT_ENGINE_PARIS_H
#define KVT_ENGINE_PARIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvt_abi.h" /* KVT_DTYPE_*, the element types of struct kvt_paris_keys' rows */
#include "srht.h"

#define KVT_PARIS_M	    8			   /* dims per block */
#define KVT_PARIS_MAX_BLK   (KVT_SRHT_MAX_DIM / 8) /* 16 */
#define KVT_PARIS_TIERS	    6
#define KVT_PARIS_MAX_VOTE  (KVT_PARIS_TIERS * KVT_PARIS_MAX_BLK) /* 96 */
#define KVT_PARIS_PAGE_KEYS 4096u				  /* default keys per page */
/* With refine on, a zone of at most this many live keys is scored whole (exact top-k): its
 * exact dot products cost about what its vote, rerank and refine stages do (under 2x at 2048),
 * and the estimate's recall with R = 4k is lowest on short zones (0.93 at 1.6K keys). */
#define KVT_PARIS_REFINE_ALL 2048u

/* Lloyd-Max levels for |u_1|, u uniform on S^7 (u_1^2 ~ Beta(1/2, 7/2)), f32 (section 4). */
extern const float kvt_paris_theta[7];
extern const float kvt_paris_level[8];

/*
 * struct kvt_paris_alloc - where index pages come from.
 * @page_get: returns @len bytes aligned to 64, or NULL. Contents need not be zeroed.
 * @page_put: gives back a page from @page_get with the same @len.
 * @ctx: passed through.
 * Called only from kvt_paris_index_reserve() and kvt_paris_index_fini(), on the writer's thread.
 */
struct kvt_paris_alloc {
	void *(*page_get)(void *ctx, size_t len);
	void (*page_put)(void *ctx, void *page, size_t len);
	void *ctx;
};

/* Pages from aligned_alloc()/free(): what a NULL allocator means for the index and the sketch. */
extern const struct kvt_paris_alloc kvt_paris_alloc_heap;

/*
 * kvt_paris_pages_setup - the page geometry every page store here (the index, the sketch) takes:
 * @page_keys 0 means KVT_PARIS_PAGE_KEYS, else a power of two in [64, 2^20]; @alloc NULL means
 * kvt_paris_alloc_heap, else both callbacks are set. Returns 0 with *ret_page_keys,
 * *ret_page_shift (its log2) and *ret_alloc written, or -EINVAL with nothing written.
 */
int kvt_paris_pages_setup(unsigned int page_keys, const struct kvt_paris_alloc *alloc,
			  uint32_t *ret_page_keys, uint32_t *ret_page_shift,
			  struct kvt_paris_alloc *ret_alloc);

/* struct kvt_paris_index - see the top of this file. Fields are read-only outside paris.c. */
struct kvt_paris_index {
	uint32_t dim;	     /* 64 or 128 */
	uint32_t nblk;	     /* dim / 8 */
	uint32_t page_keys;  /* keys per page, a power of two >= 64 */
	uint32_t page_shift; /* log2(page_keys) */
	uint32_t n;	     /* encoded keys (the retrieval zone length N) */
	uint32_t npages;     /* pages held: capacity = npages * page_keys */
	uint32_t max_pages;  /* slots in @pages */
	size_t page_bytes;
	void **pages;
	struct kvt_paris_alloc alloc;
	uint64_t *dead;			       /* capacity bits: key i dropped */
	uint32_t ndead;			       /* dropped keys among the n */
	uint32_t hist[KVT_PARIS_MAX_BLK][256]; /* centroid id counts of the live keys */
};

/*
 * kvt_paris_index_init - make an empty index.
 * @dim: head_dim, 64 or 128.
 * @page_keys: keys per page, power of two in [64, 1 << 20]; 0 means KVT_PARIS_PAGE_KEYS.
 * @alloc: page allocator, copied; NULL means aligned_alloc()/free().
 * Returns 0, or -EINVAL for a bad @dim or @page_keys. No memory is allocated until reserve.
 */
int kvt_paris_index_init(struct kvt_paris_index *ix, unsigned int dim, unsigned int page_keys,
			 const struct kvt_paris_alloc *alloc);

/* kvt_paris_index_fini - give back every page. Accepts a zeroed or half-built index. */
void kvt_paris_index_fini(struct kvt_paris_index *ix);

/* kvt_paris_page_bytes - bytes of one page for @dim and @page_keys (9 * (dim / 8) * page_keys). */
size_t kvt_paris_page_bytes(unsigned int dim, unsigned int page_keys);

/*
 * kvt_paris_index_reserve - make room for at least @nkeys keys in all, taking pages from the
 * allocator (and growing the dropped-key bitmap, so that a drop never allocates). Capacity
 * never shrinks.
 * Returns the capacity in keys, or -ENOMEM (allocator or page table failure; the index keeps the
 * pages it already had), -EOVERFLOW when @nkeys passes 2^31.
 */
int kvt_paris_index_reserve(struct kvt_paris_index *ix, uint32_t nkeys);

/*
 * kvt_paris_index_append - encode @count keys and append them as retrieval indices
 * n .. n + count - 1 (the flush of section 6), updating the histograms.
 * @srht: the rotation, same dim as the index; must be the same for every call on this index.
 * @keys: @count keys of dim f32 each, key i at keys + i * @stride (in floats, >= dim).
 * Returns the new key count, or -EINVAL (dim mismatch, @stride < dim), -ENOSPC (capacity short:
 * call kvt_paris_index_reserve() first; nothing is appended).
 */
int kvt_paris_index_append(struct kvt_paris_index *ix, const struct kvt_srht *srht,
			   const float *keys, size_t stride, uint32_t count);

/*
 * kvt_paris_encode_key - encode one key (exposed for tests and for a device encoder to compare).
 * @key: dim floats. @ret_cid: B bytes. @ret_code: 4B bytes (layout above). @ret_w: B floats.
 * Thread-safe.
 */
void kvt_paris_encode_key(const struct kvt_srht *srht, const float *key, uint8_t *ret_cid,
			  uint8_t *ret_code, float *ret_w);

/*
 * kvt_paris_index_drop - drop key @i (its token was evicted): it leaves the histograms, votes
 * 0, and no search returns or reads it. Final: a dropped key stays dropped.
 * Returns 1 when the key was live, 0 when it was already dropped, -ERANGE for @i >= n.
 * Never allocates; one writer, as append.
 */
int kvt_paris_index_drop(struct kvt_paris_index *ix, uint32_t i);

/* kvt_paris_index_live - keys not dropped: n - ndead. */
static inline uint32_t
kvt_paris_index_live(const struct kvt_paris_index *ix)
{
	return ix->n - ix->ndead;
}

/*
 * kvt_paris_key_codes - pointers to key @i's stored bytes (i < n).
 * Returns 0 with @ret_cid (B bytes, stride page_keys between blocks), @ret_code (4B bytes) and
 * @ret_w (B floats), or -ERANGE for i >= n.
 */
int kvt_paris_key_codes(const struct kvt_paris_index *ix, uint32_t i, const uint8_t **ret_cid,
			const uint8_t **ret_code, const float **ret_w);

/*
 * kvt_paris_schedule - the (rho_cand, rho_col) pair of section 3.6 for a zone of @n keys
 * (doubles, as the reference evaluates the tier budgets in double):
 * < 5000: (0.50, 0.50); < 10000: (0.25, 0.30); < 30000: (0.20, 0.25); else (0.10, 0.20).
 */
void kvt_paris_schedule(uint32_t n, double *ret_rho_cand, double *ret_rho_col);

/*
 * kvt_paris_schedule_refine - the ratios a search with the exact refine stage uses by default
 * (kvtier's choice, not the paper's): (1.00, 1.00) up to 16384 keys, (0.50, 0.70) below 256K,
 * (0.70, 1.00) from 256K on. Why: refine removes the estimator error but cannot add keys the
 * vote left out, so the candidate share sets the recall, and the target is the worst queries,
 * not the mean: the 5th-percentile per-query recall@100 (p5) must stay >= 0.9, at the least
 * time. Time is not monotone in the share: up to 16K keys the vote tables' fixed cost is most
 * of the search, and a dense candidate set is reranked almost in index order (streamed), a
 * sparse one at scattered records. Measured single-threaded (CPU time, 100 queries, outlier /
 * drift sets, D = 128; BENCHMARKS.md, retrieval), p5 and us per query:
 *   8K:   (1.00, 1.00) 1.00 / 1.00 in 211 / 152;  (0.50, 0.70) 0.90 / 0.86 in 254 / 247
 *   32K:  (0.50, 0.70) 0.95 / 0.93 in 356 / 358;  (0.40, 0.70) 0.93 / 0.88;
 *         (0.70, 1.00) 0.99 / 0.98 in 441 / 435
 *   128K: (0.50, 0.70) 0.96 / 0.94 in 1254 / 1140; (0.40, 0.70) 0.92 / 0.91 in 1117 / 994;
 *         (0.70, 1.00) 0.99 / 0.99 in 1418 / 1416; the former (0.30, 0.70) 0.87 / 0.85
 *   1M:   (0.70, 1.00) 0.99 / 0.99 in 12305 / 11892; (0.50, 0.70) 0.98 / 0.96 in 15090 /
 *         12285; (0.40, 0.70) 0.95 / 0.93 in 13110 / 11934; the former 0.91 / 0.86
 * (0.40, 0.70) is 10-15 % cheaper at 128K but leaves p5 at the bound; 64K after drift gave
 * 0.90 with (0.50, 0.70). On real SmolLM2 keys (head_dim 64, 8K) (1.00, 1.00) gave p5 1.00 in
 * 105-111 us where (0.50, 0.70) gave 0.83-0.92 in 207-221. Given its key rows the engine scans
 * zones up to 32 MiB exactly instead (KVT_PARIS_EXACT_BYTES). @dim is not used.
 */
void kvt_paris_schedule_refine(uint32_t n, unsigned int dim, double *ret_rho_cand,
			       double *ret_rho_col);

/* struct kvt_paris_query - one prepared query (kvt_paris_query_prep()). */
struct kvt_paris_query {
	uint32_t dim;
	float norm;		   /* |q| rounded to f32 (+inf past FLT_MAX) */
	double dnorm;		   /* |q|, finite for any finite q */
	float y[KVT_SRHT_MAX_DIM]; /* SRHT(q / |q|) (0 for q = 0) */
	float x[KVT_SRHT_MAX_DIM]; /* q / |q| unrotated: the exact refine stage's <k, q / |q|> */
};

/*
 * kvt_paris_query_prep - normalise and rotate @q (dim floats) into @ret_q. |q| is accumulated
 * in double, so any finite @q (1e-30 or 1e19 per element alike) gives the same unit query up to
 * @q's own rounding, and a search the same positions. (The spec divides by max(|q|, 1e-8); the
 * floor only scaled the estimates, which kvt_paris_search() now forms for the unit query.) The
 * arithmetic is the same at every SIMD level, so votes do not depend on it. Thread-safe.
 */
void kvt_paris_query_prep(const struct kvt_srht *srht, const float *q,
			  struct kvt_paris_query *ret_q);

/*
 * kvt_paris_vote_tables - per block and centroid the collision vote omega_b(c) in 0..6
 * (section 3.1-3.3). Centroids are ranked by ascending flip cost sum_{j flipped} |y_j| (the top
 * centroid is the query's sign pattern), ties broken by the smaller flip mask; tier budgets
 * T_t = ceil(live * rho_col * r_t), r = (.05, .15, .30, .50, .75, 1), evaluated in double, live
 * the keys not dropped (n when none is).
 * @rho_col: in (0, 1].
 * @ret_tab: [nblk][256] bytes.
 * Returns 0, or -EINVAL for a bad @rho_col or dim mismatch. Thread-safe against searches.
 */
int kvt_paris_vote_tables(const struct kvt_paris_index *ix, const struct kvt_paris_query *q,
			  double rho_col, uint8_t (*ret_tab)[256]);

/*
 * kvt_paris_votes - cnt_i = sum_b tab[b][cid_i,b] for every key, dispatched on
 * kvt_simd_level(); every level gives the same bytes.
 * Dropped keys vote 0.
 * @ret_votes: at least kvt_paris_votes_len(ix) bytes; entries >= n are scratch.
 * @ret_hist: NULL, or KVT_PARIS_MAX_VOTE + 1 counts of each vote over the n keys, dropped ones
 *	left out (for kvt_paris_select(); counted in the same pass, while the votes are in
 *	cache).
 */
void kvt_paris_votes(const struct kvt_paris_index *ix, const uint8_t (*tab)[256],
		     uint8_t *ret_votes, uint32_t *ret_hist);

/* kvt_paris_votes_len - bytes a vote array needs: n rounded up to a multiple of 64. */
size_t kvt_paris_votes_len(const struct kvt_paris_index *ix);

/*
 * kvt_paris_select - the @c keys with the most votes, in ascending index order. Ties at the cut
 * go to the lower indices, so the set is fully determined; every SIMD level gives the same list.
 * @votes: @n entries in 0..KVT_PARIS_MAX_VOTE (the array may be longer, see kvt_paris_votes_len).
 * @hist: the votes' histogram from kvt_paris_votes(), or NULL to count it here.
 * @ret_cand: @c entries. Returns min(c, n). Thread-safe.
 */
uint32_t kvt_paris_select(const uint8_t *votes, uint32_t n, uint32_t c, const uint32_t *hist,
			  uint32_t *ret_cand);

/*
 * kvt_paris_rerank - RSQ-IP estimates s_i = |q| sum_b w_b sum_j y_j (2 sigma_j - 1) a[t_j] for
 * @nc candidates (indices < n), dispatched on kvt_simd_level(), |q| being q->norm in f32.
 * Variants may differ in the last bits (summation order). @ret_score: @nc floats. Thread-safe.
 */
void kvt_paris_rerank(const struct kvt_paris_index *ix, const struct kvt_paris_query *q,
		      const uint32_t *cand, uint32_t nc, float *ret_score);

/*
 * kvt_paris_topk_select - the @k best (score desc, index asc; NaN after every number) of @n
 * (index, score) pairs, sorted that way; @idx NULL means index i for score i. @k <= @n.
 * Thread-safe.
 */
void kvt_paris_topk_select(const uint32_t *idx, const float *score, uint32_t n, uint32_t k,
			   uint32_t *ret_idx, float *ret_score);

struct kvt_paris_query;
struct kvt_paris_keys;

/*
 * kvt_paris_score_list - the exact scores <key, q->x> of the @nr keys listed in @idx into
 * @ret_score, in list order, as the refine forms them: runs of consecutive indices through
 * @keys->rows where it offers them, else one by one through @keys->get (with its prefetch
 * announced ahead). @tmp: q->dim floats for get. Returns 0 or -EIO (get returned NULL).
 */
int kvt_paris_score_list(const struct kvt_paris_query *q, const struct kvt_paris_keys *keys,
			 const uint32_t *idx, uint32_t nr, float *tmp, float *ret_score);

/*
 * struct kvt_paris_keys - read access to the full-precision keys behind an index, for the exact
 * refine stage (see the top of this file; kvtier's addition, not ParisKV's).
 * @get: returns the dim f32 values of the key at retrieval index @idx (< n): the key that was
 *	appended as index @idx, at whatever precision the caller holds it (f16, bf16 and int8
 *	rows converted to f32). It may return a pointer into the caller's own storage, or fill
 *	@tmp (dim floats, part of the search's scratch, no alignment promised) and return @tmp. The
 *	result is read before the next call, so it need only stay valid until then. Returning NULL
 *	means the key cannot be read: the search fails with -EIO.
 *	Called on the searching thread, for distinct indices: opts.refine of them in
 *	descending estimated-score order, or, when the whole zone is scored exactly, every live
 *	key in ascending index order (only those @rows does not cover, when it is set). It
 *	must not modify the index.
 * @prefetch: NULL, or a hint that @get will soon be called for @idx (the search announces
 *	keys a few calls ahead, so their cache misses overlap; a scattered key read is a miss
 *	per cache line). It must not fail or block.
 * @ctx: passed through.
 * @rows: NULL, or direct access to the keys as the caller stores them, which lets a search
 *	score them with kvt_simd_dot_rows() (no per-key call, no conversion pass) and makes
 *	the whole-zone exact search cheap enough to be the default on short zones
 *	(kvt_paris_exact_covers(): up to KVT_PARIS_EXACT_BYTES of rows). Returns key @idx's
 *	row (@dim values of @dtype) and sets *@ret_run to how many keys idx, idx + 1, ... lie
 *	at @stride bytes from each other from there (>= 1; a search reads no more than it
 *	needs, and never a dropped key's row), or returns NULL: read key @idx through @get
 *	instead. Called on the searching thread, in the order @get would be (ascending index
 *	order when the whole zone is scored); the rows must stay valid for the rest of the
 *	search. @prefetch, when set, announces the refine's scattered keys for @rows too.
 * @dtype: KVT_DTYPE_F16, _BF16 or _F32 (proto/kvt_abi.h), the rows' element type.
 * @stride: bytes from one key's row to the next within a run.
 */
struct kvt_paris_keys {
	const float *(*get)(void *ctx, uint32_t idx, float *tmp);
	void *ctx;
	void (*prefetch)(void *ctx, uint32_t idx);
	const void *(*rows)(void *ctx, uint32_t idx, uint32_t *ret_run);
	unsigned int dtype;
	size_t stride;
};

/*
 * KVT_PARIS_EXACT_BYTES - with the refine stage on and @rows access to the keys, a zone of
 * N live keys of head_dim D is scored whole (exact top-k, no votes) when its N * D key values
 * take at most this many bytes as stored: N * D * 2 for f16 and bf16 rows (N * D <= 16M: up
 * to 128K keys at D = 128, 256K at D = 64), N * D * 4 for f32. The scan reads every key value,
 * the index path about 40 % as many bytes (votes, 70 % of the 4-bit records, 4k keys) but
 * spends more instructions on each. Measured single-threaded on a 32 MiB-L3 EPYC (Zen 4,
 * `kvtier-bench-retrieval --crossover 1048576 --cpu-time`, the two timed in turn on every
 * query; BENCHMARKS.md, retrieval): the index path with the refine schedule took 1.5-5.4x the
 * scan's time up to 16 MiB of rows, 1.0-1.3x at 32 MiB (128K keys at D = 128, 256K at D = 64),
 * and from there to 1M keys 1.1-1.3x in the interleaved runs but 0.8-1.0x in sequential ones:
 * past 32 MiB the scan streams from DRAM and the two are within this host's noise, while the
 * scan reads 2.5x the bytes, which TOPKs sharing memory bandwidth would pay. So the bound is a
 * byte count, the same at both dims, where the scan stops being clearly the cheaper.
 */
#define KVT_PARIS_EXACT_BYTES (32u << 20)

/*
 * KVT_PARIS_SKETCH_BYTES - given a sketch (opts.sketch), a search scans the rows themselves
 * while the zone's live rows take at most this many bytes, and goes through the sketch past it
 * (or always, without @rows). Both are exact. The sketch reads D + 8 bytes a key against the
 * rows' 2D and forms its products with AVX-512 VNNI, but adds the bound and the row reads of
 * about k + (keys near the cut), so from cache the two are even; once the rows stream from
 * DRAM it wins. Measured single-threaded (`kvtier-bench-retrieval --crossover 1048576
 * --cpu-time`, BENCHMARKS.md), sketch / scan time: D = 128: 0.86-1.03 from 4K to 64K keys (1 to
 * 16 MiB of f16 rows), 0.60-0.67 from 128K to 1M; D = 64: 0.75-1.01 up to 128K keys (16 MiB),
 * 0.74-0.85 from 256K to 1M. Below the bound the two are even, and the scan leaves the sketch's
 * pages out of the cache.
 */
#define KVT_PARIS_SKETCH_BYTES (16u << 20)

/*
 * KVT_PARIS_FAST_MIN - opts.fast takes the fast path only on a zone of more than this many
 * times fast live keys; a shorter one gets the exact answer (as with refine = fast), which
 * costs no more there. The fast path reads D / 4 + 4 bytes of every key and C = fast rows at
 * random, the exact one D + 8 bytes or the 2D of a row from cache, and a row read at random
 * costs about what scanning 20-40 keys does. Measured single-threaded at k = 100
 * (BENCHMARKS.md, retrieval) at n = 41 C: 0.6-0.75x the exact time (8K keys, C = 200: 29-51
 * against 39-67 us; 32K keys, C = 800: 135-143 against 214-224); the 1-bit code this level
 * replaced, at C = 1600, took 198-271 us on 32K keys against 221-394.
 */
#define KVT_PARIS_FAST_MIN 32u

/* kvt_paris_fast_pays - whether opts.fast = @fast takes the fast path on @live keys (above). */
static inline bool
kvt_paris_fast_pays(uint32_t live, uint32_t fast)
{
	return (uint64_t)fast * KVT_PARIS_FAST_MIN < live;
}

/* kvt_paris_sketch_pays - whether a search with a sketch over @live keys reads it (above). */
bool kvt_paris_sketch_pays(uint32_t live, unsigned int dim, const struct kvt_paris_keys *keys);

/* opts.exact: whether a search with refine scores the whole zone exactly. */
enum {
	KVT_PARIS_EXACT_AUTO = 0,   /* kvt_paris_exact_covers() decides */
	KVT_PARIS_EXACT_ALWAYS = 1, /* every live key, exactly (benchmarks, tests) */
	KVT_PARIS_EXACT_NEVER = 2,  /* only when the refine budget covers the zone */
};

/*
 * kvt_paris_exact_covers - whether a search with refine budget @refine (> 0) over @live keys
 * of head_dim @dim scores every live key exactly by default (KVT_PARIS_EXACT_AUTO): when the
 * budget covers the zone, when @live <= KVT_PARIS_REFINE_ALL, or when @keys offers @rows and
 * @live * @dim values of its @dtype take at most KVT_PARIS_EXACT_BYTES.
 */
bool kvt_paris_exact_covers(uint32_t live, unsigned int dim, uint32_t refine,
			    const struct kvt_paris_keys *keys);

/*
 * struct kvt_paris_scratch - per-thread working memory of a search. Zero it before first use;
 * kvt_paris_search() grows it with malloc as needed. Not shareable between concurrent searches.
 */
struct kvt_paris_scratch {
	uint8_t *votes;
	uint32_t *cand;
	float *score;
	uint32_t *ref_idx; /* refine stage: the R best estimates, then rescored */
	float *ref_score;
	size_t votes_cap; /* bytes */
	size_t cand_cap;  /* entries */
	size_t ref_cap;	  /* entries */
	uint8_t tab[KVT_PARIS_MAX_BLK][256];
	uint32_t hist[KVT_PARIS_MAX_VOTE + 1]; /* of the votes */
	float key_tmp[KVT_SRHT_MAX_DIM];       /* struct kvt_paris_keys' @tmp */
	/* the sketch's search (sketch.h): keys rescored and their exact scores, a bar heap */
	uint32_t *sk_idx;
	float *sk_score;
	float *sk_bar;
	size_t sk_cap;	   /* entries of sk_idx, sk_score */
	size_t sk_bar_cap; /* entries of sk_bar */
	uint64_t *sk_cand; /* the fast path's candidate keys (sketch.c) */
	size_t sk_cand_cap;
	void *sk_tab;	   /* the fast path's query tables (sketch.c), 64-byte aligned */
	uint64_t *sk_grp;  /* a probing search's groups by score, then their scores as f32 */
	size_t sk_grp_cap; /* groups (sketch.c) */
	uint64_t *sk_gmap; /* the groups it scans, one bit each */
	size_t sk_gmap_cap;
};

/* kvt_paris_scratch_fini - free the scratch buffers; the struct may be reused after. NULL-safe. */
void kvt_paris_scratch_fini(struct kvt_paris_scratch *s);

/*
 * struct kvt_paris_search_opts - knobs of one search. Zero-initialise, then set what is needed:
 * refine = 0 (with keys unused) is the spec's pipeline, bit for bit.
 */
/*
 * struct kvt_paris_drop - a caller's own test for keys it no longer has, checked for every
 * candidate: a search never returns or reads them. Such keys still compete for the candidate
 * set, so fewer than k results can come back: drop them from the index
 * (kvt_paris_index_drop()) to keep the count and the recall; this is the backstop.
 * @dropped: true when key @idx is dropped; called on the searching thread for each candidate.
 */
struct kvt_paris_drop {
	bool (*dropped)(void *ctx, uint32_t idx);
	void *ctx;
};

struct kvt_sketch; /* sketch.h */

struct kvt_paris_search_opts {
	uint32_t k;	 /* results wanted, 1 .. n */
	double rho_cand; /* candidate ratio in (0, 1]; 0 = schedule */
	double rho_col;	 /* collision budget ratio in (0, 1]; 0 = schedule */
	uint32_t refine; /* 0: off; else >= k: rescore this many best estimates exactly */
	const struct kvt_paris_keys *keys; /* the full keys; required when refine > 0 */
	const struct kvt_paris_drop *drop; /* NULL: every key is live */
	uint32_t exact; /* KVT_PARIS_EXACT_*: with refine, when to score the whole zone */
	/* NULL, or the zone's int8 sketch (sketch.h, encoding the same n keys as @keys holds
	 * them): with refine and exact not KVT_PARIS_EXACT_NEVER the search is the exact top-k
	 * at any zone length, through kvt_sketch_topk() where kvt_paris_sketch_pays(), reading
	 * rows only for the keys whose bound reaches the k-th exact score, else by the scan */
	const struct kvt_sketch *sketch;
	/* 0, or with @sketch and @keys (refine not needed): the fast path, the top k by exact
	 * score of the @fast (>= k) live keys the sketch's 2-bit level ranks highest
	 * (kvt_sketch_topk_fast()): not exact, fast rows read instead of every key's codes */
	uint32_t fast;
	/* 0, or with @fast (>= fast): the candidates come only from the groups (sketch.h) whose
	 * means best match the query, enough to hold this many live keys (sketch.h, "probe") */
	uint32_t probe;
};

/*
 * kvt_paris_search - top-k retrieval-zone indices of one prepared query.
 * n below counts the live keys. C = max(ceil(n * rho_cand), 4k, R') clamped to n, where R' is 0
 * without refine, n when the whole zone is scored exactly (opts->exact: by default
 * kvt_paris_exact_covers()), else refine. (The reference
 * takes min(k, C) results when C < k; we widen C instead so a caller always gets k rows, and to
 * 4k so that the estimate still chooses among more keys than it returns; the candidate stage
 * never cuts below the refine budget.) A ratio left at 0 comes from kvt_paris_schedule(), or
 * from kvt_paris_schedule_refine() when refine is on.
 * With opts->refine > 0, the R' candidates with the best estimates (score desc, index asc) get
 * the exact score <key, q / |q|> from @opts->keys in kvt_simd_dot_rows()'s f32 arithmetic
 * (the same bits at every SIMD level, through @rows or @get alike), and the result is their
 * top k by that score. When R' >= n every key is scored exactly (no votes, no estimates): the
 * result is the exact top-k, ties to the lower index. With opts->sketch (refine on, exact not
 * KVT_PARIS_EXACT_NEVER) a zone kvt_paris_sketch_pays() for is answered by kvt_sketch_topk()
 * instead: the same exact top-k, at any n.
 * Keys dropped from the index (kvt_paris_index_drop()) are not candidates: the ratios apply to
 * the live count, and min(k, live) results come back. opts->drop is a further filter: the
 * candidates it names leave the set before the rerank (the set is not refilled).
 * @ret_idx, @ret_score: k entries, score descending (ties: index ascending); scores estimate
 * <key, q> (not divided by sqrt(d)), or are that exact product with refine. Both are ranked
 * for the unit query q / |q| and go out multiplied by |q| (q->dnorm) in double and rounded to
 * f32: positions do not depend on the query's scale, a score is never NaN for finite keys and
 * query, and it saturates to +-inf where <key, q> passes FLT_MAX.
 * With opts->fast (and a sketch) the candidates are instead the opts->fast live keys of the
 * best 2-bit estimates, all scored exactly, on a zone of more than KVT_PARIS_FAST_MIN *
 * fast live keys; a shorter zone gets the exact top-k (as refine = fast would).
 * Returns the number of results (min(k, live), or fewer with opts->drop), or -EINVAL (k == 0,
 * a ratio outside (0, 1], dim mismatch, 0 < refine < k, 0 < fast < k, fast without a sketch,
 * keys or keys->get, refine without keys or keys->get, an
 * opts->exact past KVT_PARIS_EXACT_NEVER, keys->rows with a dtype not F16, BF16 or F32),
 * -ERANGE (k > n keys appended, which includes an empty index), -ENOMEM (scratch growth), -EIO
 * (keys->get returned NULL). Thread-safe per the file comment, as long as keys->get is.
 */
int kvt_paris_search(const struct kvt_paris_index *ix, const struct kvt_paris_query *q,
		     const struct kvt_paris_search_opts *opts, struct kvt_paris_scratch *scr,
		     uint32_t *ret_idx, float *ret_score);

#endif /* KVT_ENGINE_PARIS_H */
