/* SPDX-License-Identifier: MIT */
/*
 * tier.h - per-sequence re-tiering (docs/tiering.md): which positions live in T0 (device
 * slots), T1 (pool, full precision), T2 (pool, int8) or T3 (evicted), and the plan of data moves
 * that gets a sequence from its current placement to the new one.
 *
 * The engine owns no memory and does no I/O. A sequence's state is a struct kvt_tier_seq over
 * one caller-provided block (kvt_tier_seq_bytes()); a re-tier needs a caller-provided workspace
 * (kvt_tier_ws_bytes()) that also holds the returned plan. Functions are thread-safe as long as
 * no two calls touch the same sequence or workspace at once (the daemon runs each sequence on
 * one poller thread).
 *
 * How the daemon drives it:
 *   SEQ_OPEN:  kvt_tier_cfg_init() (-EINVAL + reason for bad params), then kvt_tier_seq_init().
 *   APPEND:    kvt_tier_append() (slots from the client's T0 region, or none: pool only).
 *   SCORE_ADD: kvt_tier_score_add().
 *   RETIER:    kvt_tier_plan() -> allocate T2 pool slots for plan.quant_pos (may fail: abort,
 *              nothing changed) -> quantize them (kvt_quant_*) and free their T1 slots -> copy
 *              plan.promote_pos[i] into T0 slot plan.promote_slot[i] (first n_promote_t1 from
 *              T1 rows, the rest dequantized from T2 rows), one batch, all layers -> free the
 *              pool slots of plan.evict_pos -> kvt_tier_commit(). Demotions need no copy: the
 *              pool already holds every T0 row (inclusive hierarchy). Reply with the slot-map
 *              changes (demote_slot[i] -> -1, then promote_slot[i] -> promote_pos[i]), the
 *              free_slot[] list for the next appends, count[] and evicted_ratio.
 *   FETCH:     kvt_tier_positions() gives the T1 or T2 positions in ascending order without
 *              copying (kept up to date by commit and append); kvt_tier_fetch_list() merges
 *              both. Stage rows with kvt_gather_rows() / kvt_dequant_rows() in that order and
 *              return the list so the client can map staging rows to positions.
 */
#ifndef KVT_ENGINE_TIER_H
#define KVT_ENGINE_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "kvt_abi.h"

/* Values of a tier[] byte: the tier in the low 2 bits, plus KVT_TIER_F_INT8. */
enum { KVT_T0 = 0, KVT_T1 = 1, KVT_T2 = 2, KVT_T3 = 3 };
#define KVT_TIER_MASK 0x3u
/*
 * The pool copy of the position is int8 (it was quantized). Quantization is final, like
 * eviction: the full-precision row is gone, so such a position is T2 or, when promoted, T0
 * holding a dequantized row, and goes back to T2 (never T1) when demoted.
 */
#define KVT_TIER_F_INT8 0x4u

/* Largest sequence capacity: positions and slots must fit in int32_t. */
#define KVT_TIER_MAX_CAP 0x7fffffffu

/*
 * struct kvt_tier_cfg - validated, normalized tiering parameters (from struct kvt_seq_params).
 * @t0_slots is 0 when the sequence has no T0 region (t0_buf_id == 0): pool-only mode, where
 * every kept position is T1 or T2 and there are no slots to hand out.
 */
struct kvt_tier_cfg {
	uint8_t policy;	    /* KVT_POLICY_* */
	uint8_t score_mode; /* KVT_SCORE_* */
	uint8_t protect_prompt;
	uint32_t delta;
	uint32_t sinks;
	uint32_t window;
	uint32_t prompt_len;
	uint32_t t0_slots;
	float hbm_frac;
	float evict_frac;
	float t2_frac;
};

/*
 * struct kvt_tier_seq - one sequence's tier state. All arrays live in the block given to
 * kvt_tier_seq_init(); read them freely, change them only through this API.
 */
struct kvt_tier_seq {
	uint32_t n;	   /* tokens appended */
	uint32_t cap;	   /* capacity of the per-position arrays */
	uint32_t t0_slots; /* slots in slot_pos (0: pool-only) */
	uint32_t gen;	   /* bumped by every append and commit; plans carry it */
	float *score;	   /* [cap] cumulative attention (SCORE_ADD) */
	uint8_t *tier;	   /* [cap] KVT_T* | KVT_TIER_F_INT8 */
	int32_t *pos_slot; /* [cap] T0 slot of a position, -1 when not in T0 */
	int32_t *slot_pos; /* [t0_slots] position in a slot, -1 when free */
	uint32_t *list;	   /* [cap + 2] T1 positions ascending at the front, T2 near the back */
	uint32_t count[4]; /* positions per tier */
	uint32_t n_int8;   /* live positions whose pool copy is int8 (T2, or T0 with F_INT8) */
};

/*
 * struct kvt_tier_plan - result of kvt_tier_plan(). The arrays point into the workspace and stay
 * valid until the workspace is reused. All position lists are ascending.
 */
struct kvt_tier_plan {
	uint32_t n;		/* n the plan was computed for */
	uint32_t gen;		/* kvt_tier_seq.gen it was computed from */
	uint32_t n_demote;	/* T0 -> T1/T2/T3: free the slot, no copy */
	uint32_t *demote_slot;	/* [n_demote] */
	uint32_t *demote_pos;	/* [n_demote] */
	uint32_t n_promote;	/* T1/T2 -> T0: copy the row into the slot */
	uint32_t n_promote_t1;	/* the first n_promote_t1 are from T1, the rest from T2 (int8) */
	uint32_t *promote_pos;	/* [n_promote], each part ascending */
	uint32_t *promote_slot; /* [n_promote] */
	uint32_t n_quant;	/* T1 pool row -> T2 (quantize, free the T1 slot); may be T0 too */
	uint32_t *quant_pos;	/* [n_quant] */
	uint32_t n_evict;	/* newly evicted: free every pool slot (T0 slots are in demote) */
	uint32_t *evict_pos;	/* [n_evict] */
	uint32_t n_free;	/* min(delta, free slots) after the plan; delta unless pool-only */
	uint32_t *free_slot;	/* [n_free] lowest free slots, ascending: the next appends' slots */
	uint32_t count[4];	/* positions per tier after the plan */
	float evicted_ratio;	/* count[KVT_T3] / n, 0 when n == 0 */
};

/*
 * kvt_tier_validate - check the tiering fields of SEQ_OPEN parameters.
 * @p:		parameters (only the tiering fields and the T0 slot count are looked at; the
 *		geometry, buffer ids and layouts are the daemon's to check).
 * @ret_reason:	if not NULL, set on failure to a static string naming the problem.
 * Return: 0, or -EINVAL for: unknown policy or score_mode; protect_prompt not 0/1; delta 0;
 * hbm_frac, evict_frac or t2_frac NaN or outside [0, 1]; for the tiered policy, budgets that
 * add up to more than n (hbm_frac + evict_frac + t2_frac > 1); t0_slots 0 with a T0 buffer;
 * and, with a T0 region: delta or window larger than t0_slots, or a protected set
 * (max(sinks, protected prompt) + window) that cannot stay in T0 with delta slots free.
 * Thread-safe.
 */
int kvt_tier_validate(const struct kvt_seq_params *p, const char **ret_reason);

/*
 * kvt_tier_cfg_init - validate @p (kvt_tier_validate()) and fill @ret_cfg.
 * Return: 0, or -EINVAL (see kvt_tier_validate(); @ret_reason as there). @ret_cfg is untouched
 * on failure. Thread-safe.
 */
int kvt_tier_cfg_init(const struct kvt_seq_params *p, struct kvt_tier_cfg *ret_cfg,
		      const char **ret_reason);

/*
 * kvt_tier_seq_bytes - bytes of the block for a sequence of capacity @cap and @t0_slots slots:
 * 13 bytes per position plus 4 per slot, plus a few bytes of spare and alignment. Returns 0 if @cap
 * or @t0_slots exceed KVT_TIER_MAX_CAP. Thread-safe.
 */
size_t kvt_tier_seq_bytes(uint32_t cap, uint32_t t0_slots);

/*
 * kvt_tier_seq_init - set up an empty sequence (n = 0, every slot free) in @mem.
 * @s:		the sequence to initialize.
 * @mem:	block of @mem_size >= kvt_tier_seq_bytes(@cap, @t0_slots) bytes, 8-byte aligned,
 *		owned by the caller and kept for the sequence's lifetime.
 * @cap:	positions the sequence can hold, 1..KVT_TIER_MAX_CAP.
 * @t0_slots:	the cfg's t0_slots.
 * Return: 0, or -EINVAL (NULL, bad alignment, block too small, bad cap).
 */
int kvt_tier_seq_init(struct kvt_tier_seq *s, void *mem, size_t mem_size, uint32_t cap,
		      uint32_t t0_slots);

/*
 * kvt_tier_seq_move - copy the state of @src into a new, larger block (to grow the capacity).
 * @dst:	sequence to set up in @mem, as kvt_tier_seq_init() with @cap >= src->n and the
 *		same t0_slots.
 * Return: 0, or -EINVAL as kvt_tier_seq_init() or when @cap < src->n. @src is not modified
 * and may be freed afterwards; @dst is untouched on failure. Plans made from @src are stale.
 */
int kvt_tier_seq_move(struct kvt_tier_seq *dst, void *mem, size_t mem_size, uint32_t cap,
		      const struct kvt_tier_seq *src);

/*
 * kvt_tier_seq_restore - rebuild a sequence from its saved per-position state (a daemon restart
 * hands over score[], tier[] and pos_slot[] of its n positions, and gen). Nothing else is taken
 * on trust: slot_pos, the counts, n_int8 and the FETCH lists are derived again, and the input is
 * checked as a state the API could have reached.
 * @s, @mem, @mem_size, @cap, @t0_slots: as kvt_tier_seq_init(), with @n <= @cap.
 * @score: [n] finite and >= 0. @tier: [n] KVT_T0, KVT_T1, KVT_T3, or KVT_T0 / KVT_T2 with
 * KVT_TIER_F_INT8. @pos_slot: [n] the slot (< t0_slots, each used once) of a T0 position, -1
 * for any other.
 * Return: 0, or -EINVAL (bad arguments or a state that breaks one of those rules). @s is
 * untouched on failure.
 */
int kvt_tier_seq_restore(struct kvt_tier_seq *s, void *mem, size_t mem_size, uint32_t cap,
			 uint32_t t0_slots, uint32_t n, uint32_t gen, const float *score,
			 const uint8_t *tier, const int32_t *pos_slot);

/*
 * kvt_tier_append - append @count tokens at positions n..n+count-1, score 0.
 * @slots:	NULL: the rows went to the pool only, the tokens are T1. Else @count distinct
 *		free T0 slots (normally taken from the last plan's free_slot list): the tokens are
 *		T0 in those slots.
 * Return: the first appended position, or -ENOSPC (n + count > cap: grow with
 * kvt_tier_seq_move()), -EINVAL (slot out of range, @count 0), -EBUSY (slot in use or named
 * twice). Nothing changes on failure.
 */
int kvt_tier_append(struct kvt_tier_seq *s, uint32_t count, const uint32_t *slots);

/*
 * kvt_tier_score_add - score[first + i] += val[i] for i < @count (SCORE_ADD).
 * Return: 0, or -EINVAL (first + count > n, NULL with count > 0, or a value that is NaN or
 * infinite: scores must stay finite, so the whole call is refused). Nothing changes on failure.
 */
int kvt_tier_score_add(struct kvt_tier_seq *s, uint32_t first, uint32_t count, const float *val);

/*
 * kvt_tier_ws_bytes - workspace bytes kvt_tier_plan() needs for @n positions: 20 bytes per
 * position, 17 per slot, 4 per delta, plus a 256 KiB radix histogram (about 20 MiB at n = 1M).
 * Returns 0 if @n or @t0_slots exceed KVT_TIER_MAX_CAP. Thread-safe.
 */
size_t kvt_tier_ws_bytes(uint32_t n, uint32_t t0_slots, uint32_t delta);

/*
 * kvt_tier_plan - compute the re-tiering plan of @s (docs/tiering.md, RETIER) without changing
 * it.
 * @cfg:	the sequence's configuration (its t0_slots must equal s->t0_slots).
 * @s:		the sequence; not modified.
 * @ws:		workspace of @ws_size >= kvt_tier_ws_bytes(s->n, cfg->t0_slots, cfg->delta)
 *		bytes, 8-byte aligned; holds the plan's arrays afterwards.
 * @ret_plan:	the plan.
 *
 * Ranking: candidates are the positions outside the protected set P (sinks, the prompt when
 * protected, the last @window positions) that are not evicted, ranked by score (score / (n - i)
 * in mean mode), ties broken by position (older ranks lower), with O(n) radix selection.
 * Budgets, with n the current token count and T0 capped at t0_slots - delta:
 *   tiered:    T3 grows to floor(evict_frac*n) with the lowest candidates (never shrinks);
 *              T0 = P + the highest candidates up to ceil(hbm_frac*n) in total; the int8 set
 *              grows to floor(t2_frac*n) with the lowest of the rest; the rest is T1.
 *   h2o:       T0 as tiered, every other candidate evicted.
 *   streaming: T0 = P, every candidate evicted.
 *   full:      T0 = P + the highest candidates up to the cap, the rest T1 (nothing evicted).
 * Eviction is applied first, so the T0 and int8 budgets only see what survives it. Positions
 * already in T0 that stay in T0 keep their slot; promotions fill the lowest free slots after
 * the demotions, then free_slot lists the next delta free slots.
 * Return: 0, or -EINVAL (NULL, t0_slots mismatch, workspace too small or misaligned, or a cfg
 * not from kvt_tier_cfg_init() whose delta or protected set does not fit in t0_slots). O(n)
 * time; no allocation.
 */
int kvt_tier_plan(const struct kvt_tier_cfg *cfg, const struct kvt_tier_seq *s, void *ws,
		  size_t ws_size, struct kvt_tier_plan *ret_plan);

/*
 * kvt_tier_commit - apply @plan to @s once its data moves are done: slot maps, tier bytes,
 * counts and the T1/T2 position lists.
 * Return: 0, or -ESTALE (the sequence changed since the plan: n or gen differ), -EINVAL (NULL).
 * Nothing changes on failure.
 */
int kvt_tier_commit(struct kvt_tier_seq *s, const struct kvt_tier_plan *plan);

/*
 * kvt_tier_retier - kvt_tier_plan() then kvt_tier_commit(), for callers that move no data
 * (tests, simulations, benchmarks). Return and errors as those two.
 */
int kvt_tier_retier(const struct kvt_tier_cfg *cfg, struct kvt_tier_seq *s, void *ws,
		    size_t ws_size, struct kvt_tier_plan *ret_plan);

/*
 * kvt_tier_positions - the positions now in @tier (KVT_T1 or KVT_T2), ascending, without copy.
 * @ret_pos:	set to the list (valid until the next append, commit or move).
 * Return: the count, or -EINVAL (other tier, NULL).
 */
int kvt_tier_positions(const struct kvt_tier_seq *s, int tier, const uint32_t **ret_pos);

/*
 * kvt_tier_fetch_list - the positions in the tiers of @tier_mask ((1 << KVT_T1) and/or
 * (1 << KVT_T2)), merged in ascending order, into @ret_pos.
 * @cap:	room in @ret_pos.
 * Return: the count, or -EINVAL (bad mask, NULL), -ENOBUFS (more than @cap positions; nothing
 * written).
 */
int kvt_tier_fetch_list(const struct kvt_tier_seq *s, unsigned tier_mask, uint32_t cap,
			uint32_t *ret_pos);

#endif /* KVT_ENGINE_TIER_H */
