/* SPDX-License-Identifier: MIT */
/*
 * paris_seq.h - the ParisKV retrieval state of one sequence: one index and one int8 sketch
 * (sketch.h) per (layer, kv head), the shared rotation, the zone sizes, and the TOPK operation
 * over them.
 *
 * How a daemon drives it (TOPK op and flushes):
 *   1. SEQ_OPEN: kvt_paris_seq_init() with the geometry, zone sizes, the persisted rotation,
 *      the pool's page allocator and whether to keep sketches (KVT_PARIS_SEQ_F_NO_SKETCH).
 *   2. After every APPEND (prefill or decode): for each layer, kvt_paris_zone_flush(prompt_len,
 *      T, kvt_paris_seq_len(layer)) gives the positions that just left the dense window; pass
 *      their keys (post-RoPE, f32) to kvt_paris_seq_append().
 *   3. TOPK: if kvt_paris_zone_dense_only() the client attends densely; otherwise
 *      kvt_paris_seq_topk() returns, per kv head, absolute positions (S + retrieval index) and
 *      estimated <k, q> scores; the client attends sink + dense window + these positions.
 *   4. When the stored value of an encoded key changes (a row quantized to int8, read back
 *      dequantized): kvt_paris_seq_sketch_set() with the value the keys accessor now returns.
 *
 * Thread safety: one writer (init, append, drop, sketch_set, fini); topk only reads, so
 * concurrent topk calls are safe with separate scratch, but not concurrently with a write on the
 * same layer.
 */
#ifndef KVT_ENGINE_PARIS_SEQ_H
#define KVT_ENGINE_PARIS_SEQ_H

#include <stddef.h>
#include <stdint.h>

#include "paris.h"
#include "paris_zone.h"
#include "sketch.h"

/* struct kvt_paris_geom - sequence geometry. q_heads must be a multiple of kv_heads. */
struct kvt_paris_geom {
	uint32_t layers;
	uint32_t q_heads;
	uint32_t kv_heads;
	uint32_t head_dim; /* 64 or 128, equal to the rotation's dim */
};

struct kvt_paris_seq {
	struct kvt_paris_geom g;
	struct kvt_paris_zone_cfg zone;
	struct kvt_srht srht;
	struct kvt_paris_index *ix; /* [layers][kv_heads] */
	/* [layers][kv_heads]: the keys of ix[i] as the keys accessor returns them, so that a TOPK
	 * with refine is exact past what the rows scan covers (kvt_paris_search()'s opts.sketch);
	 * NULL with KVT_PARIS_SEQ_F_NO_SKETCH */
	struct kvt_sketch *sk;
};

/* Flags of kvt_paris_seq_init(). */
#define KVT_PARIS_SEQ_F_NO_SKETCH (1u << 0) /* no sketches: about half the pages, not exact */
#define KVT_PARIS_SEQ_F_ALL	  KVT_PARIS_SEQ_F_NO_SKETCH

/* Flags of struct kvt_paris_topk_opts. */
#define KVT_PARIS_F_UNION (1u << 0) /* per query head top-k, merged per kv head (max score) */
#define KVT_PARIS_F_ALL	  KVT_PARIS_F_UNION

/*
 * struct kvt_paris_seq_keys - the full-precision keys of the sequence, for the exact refine
 * stage (kvtier's addition to ParisKV, see paris.h: the daemon holds every key row in its pool).
 * @get: returns the head_dim f32 values of the key of (@layer, kv head @head) at absolute
 *	position @pos (S + retrieval index, a position that kvt_paris_seq_append() encoded), as
 *	struct kvt_paris_keys' get: into caller storage or into @tmp (head_dim floats), valid
 *	until the next call; NULL fails the TOPK with -EIO.
 * @ctx: passed through.
 * @prefetch: NULL, or as struct kvt_paris_keys' prefetch, for the same (layer, head, pos).
 */
struct kvt_paris_seq_keys {
	const float *(*get)(void *ctx, uint32_t layer, uint32_t head, uint32_t pos, float *tmp);
	void *ctx;
	void (*prefetch)(void *ctx, uint32_t layer, uint32_t head, uint32_t pos);
};

/*
 * struct kvt_paris_seq_rows - optional direct access to the stored key rows, as struct
 * kvt_paris_keys' @rows, @dtype and @stride (paris.h): @rows returns the row of (@layer, kv
 * head @head) at absolute position @pos and in *@ret_run how many positions pos, pos + 1, ...
 * of the same layer and head lie @stride bytes apart from there, or NULL (then @get is used).
 * With it a zone short enough (kvt_paris_exact_covers()) is scored whole and exactly, and
 * the refine reads rows without a conversion pass. @ctx: passed through.
 */
struct kvt_paris_seq_rows {
	const void *(*rows)(void *ctx, uint32_t layer, uint32_t head, uint32_t pos,
			    uint32_t *ret_run);
	void *ctx;
	unsigned int dtype; /* KVT_DTYPE_F16, _BF16 or _F32 */
	size_t stride;
};

/* struct kvt_paris_topk_opts - one TOPK request. Zero-initialise; refine 0 is the spec. */
struct kvt_paris_topk_opts {
	uint32_t k;	 /* per kv head (per query head with KVT_PARIS_F_UNION), 1 .. N */
	uint32_t flags;	 /* KVT_PARIS_F_* */
	double rho_cand; /* 0: schedule (section 3.6; the refine schedule with refine) */
	double rho_col;	 /* 0: schedule */
	uint32_t refine; /* 0: off; else >= k: exact rescoring of this many best estimates per
			    search (per query head with KVT_PARIS_F_UNION) */
	const struct kvt_paris_seq_keys *keys; /* required when refine > 0 */
	const struct kvt_paris_seq_rows *rows; /* NULL, or the rows behind keys (with refine) */
	/* 0, or >= k with keys: the fast path (paris.h, opts.fast), this many keys of the best
	 * 2-bit estimates scored exactly per search; a sequence without sketches
	 * (KVT_PARIS_SEQ_F_NO_SKETCH) takes the refine path instead (set refine too) */
	uint32_t fast;
	/* 0, or >= fast: probe (paris.h, opts.probe), only the best groups holding this
	 * many live keys are scanned */
	uint32_t probe;
	uint32_t exact; /* KVT_PARIS_EXACT_* (paris.h): when refine scores a whole zone */
	/* NULL, or positions dropped since they were encoded (evicted): never returned */
	bool (*dropped)(void *ctx, uint32_t pos);
	void *drop_ctx;
};

/*
 * kvt_paris_seq_init - set up empty indexes and sketches for every (layer, kv head).
 * @srht: the persisted rotation, copied; its dim must equal @g->head_dim.
 * @page_keys, @alloc: as kvt_paris_index_init(); sketch pages come from @alloc too, with @len
 *	kvt_sketch_page_bytes(head_dim, page_keys) (at most kvt_paris_page_bytes() for the dims
 *	allowed, equal at 64), index pages with kvt_paris_page_bytes(head_dim, page_keys).
 * @flags: 0, or KVT_PARIS_SEQ_F_NO_SKETCH: indexes only (seq->sk NULL), no sketch page is ever
 *	asked of @alloc; a TOPK with refine then scans the rows up to KVT_PARIS_EXACT_BYTES and
 *	past that rescores the best estimates (not exact), as kvt_paris_search() without a sketch.
 * Returns 0, or -EINVAL (zero or inconsistent geometry, bad zone cfg, dim mismatch, unknown
 * flags), -ENOMEM.
 */
int kvt_paris_seq_init(struct kvt_paris_seq *seq, const struct kvt_paris_geom *g,
		       const struct kvt_paris_zone_cfg *zone, const struct kvt_srht *srht,
		       unsigned int page_keys, const struct kvt_paris_alloc *alloc,
		       unsigned int flags);

/* kvt_paris_seq_fini - free everything. Accepts a zeroed or half-built seq. */
void kvt_paris_seq_fini(struct kvt_paris_seq *seq);

/*
 * kvt_paris_seq_len - retrieval keys encoded for @layer (equal for all its heads).
 * Returns the count, or -ERANGE for a bad layer.
 */
int kvt_paris_seq_len(const struct kvt_paris_seq *seq, uint32_t layer);

/*
 * kvt_paris_seq_index - the index of (@layer, @head), for inspection.
 * Returns 0, or -ERANGE for a bad layer or head.
 */
int kvt_paris_seq_index(const struct kvt_paris_seq *seq, uint32_t layer, uint32_t head,
			const struct kvt_paris_index **ret_ix);

/*
 * kvt_paris_seq_append - encode the keys of absolute positions @pos .. @pos + @count - 1 of
 * @layer into every kv head's index and sketch (if it has sketches), reserving pages as needed.
 * @keys: [count][kv_heads][head_dim] f32, token t at keys + t * @token_stride (floats): the
 *	values the refine stage will read for them (struct kvt_paris_seq_keys' get), which the
 *	sketch must encode exactly.
 * Returns the new key count of the layer, or -ERANGE (bad layer), -EINVAL (@pos is not
 * S + kvt_paris_seq_len(layer): flushes must be contiguous; @token_stride < kv_heads*head_dim),
 * -ENOMEM. All or nothing: on -ENOMEM no key is appended anywhere (pages reserved so far are
 * kept for the next try), so the same call may be repeated.
 */
int kvt_paris_seq_append(struct kvt_paris_seq *seq, uint32_t layer, uint32_t pos, uint32_t count,
			 const float *keys, size_t token_stride);

/*
 * kvt_paris_seq_drop - absolute position @pos was evicted: drop it from the index of every
 * (layer, kv head) whose retrieval zone holds it (kvt_paris_index_drop()), so that TOPK ranks
 * only live keys and returns min(k, live) per head. A position outside every zone (sink, dense
 * window, not yet flushed) is left alone: drop it again once it is flushed.
 * Returns the number of layers it was newly dropped from (0 when none). Never allocates.
 */
int kvt_paris_seq_drop(struct kvt_paris_seq *seq, uint32_t pos);

/*
 * kvt_paris_seq_sketch_set - the stored value of the key of (@layer, kv head @head) at absolute
 * position @pos changed (its row was quantized to int8): re-encode its sketch entry from @key,
 * head_dim f32, exactly what struct kvt_paris_seq_keys' get returns for it from now on. A
 * TOPK's exactness through the sketch rests on this. The index's 4-bit codes are left as they
 * are (they only rank candidates). Without sketches (KVT_PARIS_SEQ_F_NO_SKETCH) there is nothing
 * to encode: 0 after the same checks. Returns 0, or -ERANGE (bad layer or head, @pos outside the
 * layer's encoded retrieval zone: not encoded yet, so the flush will read the new value).
 * Never allocates; one writer, as append.
 */
int kvt_paris_seq_sketch_set(struct kvt_paris_seq *seq, uint32_t layer, uint32_t head, uint32_t pos,
			     const float *key);

/* kvt_paris_seq_topk_stride - entries per kv head in topk outputs: k, or k * q_heads/kv_heads
 * with KVT_PARIS_F_UNION. */
uint32_t kvt_paris_seq_topk_stride(const struct kvt_paris_seq *seq,
				   const struct kvt_paris_topk_opts *opts);

/*
 * kvt_paris_seq_topk - the TOPK op: for each kv head h of @layer, the retrieval-zone positions
 * most likely to matter to query @q.
 * @q: [q_heads][head_dim] f32 (post-RoPE); @q_len: its length in floats, must be
 *     q_heads * head_dim. Query heads h*g .. h*g+g-1 (g = q_heads / kv_heads) belong to kv head
 *     h; by default their mean is the retrieval query (section 1).
 * @scr: per-thread scratch (zeroed before first use, freed with kvt_paris_scratch_fini()).
 * @ret_pos, @ret_score: [kv_heads][stride] with stride = kvt_paris_seq_topk_stride(); absolute
 *     positions (S + retrieval index) and estimated <k, q_h> in descending score order (exact
 *     <k, q_h> in f32 with refine; q_h is the GQA mean without KVT_PARIS_F_UNION). With
 *     refine and opts->exact not KVT_PARIS_EXACT_NEVER the positions are the exact top-k of
 *     the keys as opts->keys returns them at any zone length: the rows scanned, or past
 *     KVT_PARIS_SKETCH_BYTES of rows (always without opts->rows) bounded through the sketch.
 *     Without sketches (KVT_PARIS_SEQ_F_NO_SKETCH) only while the rows scan covers the zone
 *     (kvt_paris_exact_covers()); beyond, the refine of the best estimates (paris.h).
 * @ret_count: [kv_heads] entries used: min(k, live keys) (kvt_paris_seq_drop()), or with
 *     KVT_PARIS_F_UNION the size of the union (that .. stride); fewer (down to 0) where
 *     opts->dropped names positions the index still holds live.
 * Returns the number of kv heads, or -ERANGE (bad layer, k > N, N == 0), -EINVAL (k == 0,
 * @q_len wrong, unknown flags, ratio outside [0, 1], 0 < refine < k, 0 < fast < k, refine or fast
 * without keys or keys->get), -ENOMEM, -EIO (keys->get returned NULL). Outputs are undefined on
 * failure.
 */
int kvt_paris_seq_topk(const struct kvt_paris_seq *seq, uint32_t layer, const float *q,
		       size_t q_len, const struct kvt_paris_topk_opts *opts,
		       struct kvt_paris_scratch *scr, uint32_t *ret_pos, float *ret_score,
		       uint32_t *ret_count);

#endif /* KVT_ENGINE_PARIS_SEQ_H */
