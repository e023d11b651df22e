/* SPDX-License-Identifier: MIT */
/*
 * kv.h - where the model's KV cache lives: the seam between the forward pass and kvtier.
 *
 * Row layout. A token's cache rows are one block of f32:
 *	[layer][K,V][kv_head][head_dim]
 * i.e. token_floats = layers * 2 * kv_heads * head_dim. A run of tokens laid end to end is
 * exactly kvtier's APPEND arena layout [token][layer][K,V][head][dim] with dtype KVT_DTYPE_F32
 * (proto/kvt_abi.h), so a kvtier backend can copy the block into the arena unchanged.
 *
 * One decode step at position p (prefill runs the same step once per prompt token):
 *   1. begin(p)                  before layer 0. A tiered backend re-tiers (RETIER, every Δ
 *                                steps) and stages what it needs here or lazily in view().
 *   2. for each layer l:
 *        view(l) -> positions < p the token may attend to at layer l, with their K and V rows,
 *                   in strictly increasing position order. The step's own K/V are not in the
 *                   backend yet: the forward pass attends to view(l) followed by itself (position
 *                   p, always last), so the order "by position" holds for the whole sum.
 *   3. append(p, rows)           the step's rows for all layers (token_floats). The backend must
 *                                make position p visible to the views of later steps.
 *   4. score(n, pos, w)          attention weights of this step, averaged over all layers and all
 *                                query heads, for the n positions attended (the view's positions,
 *                                then p); sum(w) == 1 up to rounding. For SCORE_ADD.
 *
 * Why the order matters: softmax and the weighted V sum are computed in view order, so two
 * backends that return the same positions with the same rows produce bit-identical logits no
 * matter where the rows are stored (T0 slot, staging row, host array). That is the property a
 * kvtier backend must keep token for token (tests/llm/check_llm_model.c checks it with a backend
 * that stores rows scattered).
 *
 * Contract for view(): within one step, every layer's view holds the same positions (tiering is
 * per token, not per layer); the forward pass checks this and fails the step with -EPROTO. The
 * arrays and rows it points to stay valid until the next view() or append() call on the backend.
 *
 * Mapping onto kvtier (see docs/llm.md):
 *   append  -> APPEND: op_flags 0, count 1 (or batched), arena = the token block.
 *   score   -> SCORE_ADD: arg0 = pos[0], count = p - pos[0] + 1, a dense vector with w at the
 *              attended positions and 0 at the holes (evicted positions).
 *   begin   -> RETIER every Δ appended tokens (and after prefill).
 *   view(l) -> T0 slot rows (no copy) merged with the T1/T2 rows FETCH staged for layer l (the
 *              CQE's position list says which staging row is which position), sorted by position.
 * Errors are -errno; the step fails with the backend's error.
 */
#ifndef KVT_LLM_KV_H
#define KVT_LLM_KV_H

#include <stdint.h>

struct kv_backend;

/* What the forward pass may attend to at one layer. */
struct kv_view {
	uint32_t n;	       /* entries */
	const uint32_t *pos;   /* n positions, strictly increasing, all < the step's position */
	const float *const *k; /* k[i]: kv_heads * head_dim floats (K of pos[i] at this layer) */
	const float *const *v; /* v[i]: likewise for V */
};

struct kv_backend_ops {
	/* Start of the step that computes position @pos. Optional (NULL). */
	int (*begin)(struct kv_backend *kv, uint32_t pos);
	/* Rows visible at @layer for the current step, ordered by position. */
	int (*view)(struct kv_backend *kv, uint32_t layer, struct kv_view *ret_view);
	/* Appends position @pos (== the count appended so far); @rows: token_floats floats. */
	int (*append)(struct kv_backend *kv, uint32_t pos, const float *rows);
	/* Attention weights of the step, see above. Optional (NULL). @pos[n-1] is the step. */
	int (*score)(struct kv_backend *kv, uint32_t n, const uint32_t *pos, const float *w);
	/* Frees the backend. */
	void (*destroy)(struct kv_backend *kv);
};

struct kv_backend {
	const struct kv_backend_ops *ops;
	uint32_t layers;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t token_floats; /* layers * 2 * kv_heads * head_dim */
	uint32_t n;	       /* positions appended so far; the next step computes position n */
};

/* Offset, in floats, of (layer, K=0|V=1) inside a token block. */
static inline uint32_t
kv_row_off(const struct kv_backend *kv, uint32_t layer, uint32_t kvsel)
{
	return (layer * 2 + kvsel) * kv->kv_heads * kv->head_dim;
}

/*
 * kv_local_create() - the in-process backend: every row stays in one growing host array laid
 * out [token][layer][K,V][head][dim]; views show every appended position. It keeps the
 * cumulative score per position as kvtier's score[] does (score += w), readable through
 * kv_local_scores(). @max_tokens caps the cache (append gives -ENOSPC past it); 0 = no cap.
 * Returns 0, -EINVAL (zero geometry), -ENOMEM.
 */
int kv_local_create(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, uint32_t max_tokens,
		    struct kv_backend **ret_kv);

/* Cumulative scores of positions [0, kv->n) of a backend made by kv_local_create(). */
const float *kv_local_scores(const struct kv_backend *kv);

static inline void
kv_destroy(struct kv_backend *kv)
{
	if (kv)
		kv->ops->destroy(kv);
}

#endif /* KVT_LLM_KV_H */
