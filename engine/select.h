/* SPDX-License-Identifier: MIT */
/*
 * select.h - O(n) top-m / bottom-m selection of f32 scores (radix select, never a full sort).
 *
 * Rank order (docs/tiering.md, re-tiering step 2): a candidate ranks higher when its score is
 * higher; on equal scores the older token (lower position) ranks lower. Every candidate has a
 * distinct position, so this is a strict total order and the selected set is unique: any
 * correct implementation (a sort included) picks exactly the same positions.
 *
 * Scores are ranked through kvt_score_key(), an order-preserving map of the f32 bits to u32:
 *   - NaN (any sign or payload) maps to 0, below -inf: a NaN score ranks lowest of all, and NaN
 *     scores tie with each other (so the older one ranks lower). A NaN can only come from a
 *     client bug, and putting it at one end keeps the ranking deterministic.
 *   - -0.0 and +0.0 map to the same key (they compare equal as floats, so they tie).
 *   - every other float keeps its IEEE order.
 *
 * All functions are pure: no allocation, no locks, no I/O. They are thread-safe as long as
 * concurrent calls do not share output or scratch buffers.
 */
#ifndef KVT_ENGINE_SELECT_H
#define KVT_ENGINE_SELECT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Counters in the radix histogram: the first pass uses a 16-bit digit. */
#define KVT_SELECT_HIST 65536u

/*
 * kvt_score_key - order-preserving u32 key of an f32 score (see the header comment for NaN and
 * signed zero). a < b as floats implies key(a) < key(b); a == b implies key(a) == key(b).
 */
static inline uint32_t
kvt_score_key(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return 0; /* NaN */
	if (u == 0x80000000u)
		u = 0; /* -0.0 ranks as +0.0 */
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/*
 * kvt_select_scratch_bytes - bytes of scratch kvt_select_kth(), kvt_select_top() and
 * kvt_select_bottom() need for @n candidates: 4*n (keys) + 4*n (survivors) + 4*KVT_SELECT_HIST,
 * rounded up to 64. Never fails; saturates at SIZE_MAX on overflow.
 */
size_t kvt_select_scratch_bytes(size_t n);

/*
 * kvt_select_kth - the key of rank @k (0-based, ascending) among @keys[0..@n).
 * @keys:	the keys (any u32 values; duplicates allowed). Not modified.
 * @n:		number of keys, >= 1.
 * @k:		rank wanted, < @n.
 * @surv:	scratch of @n u32 (survivors of each radix pass).
 * @hist:	scratch of KVT_SELECT_HIST u32.
 * @ret_less:	if not NULL, set to the number of keys strictly below the result.
 * Return: the key v such that #{keys < v} <= k < #{keys <= v}. Caller guarantees n >= 1 and
 * k < n (checked by the wrappers below). Time O(n): at most two passes over @keys plus passes
 * over shrinking survivor sets; no sort.
 */
uint32_t kvt_select_kth(const uint32_t *keys, size_t n, size_t k, uint32_t *surv, uint32_t *hist,
			size_t *ret_less);

/*
 * kvt_select_top - the @m highest-ranked candidates.
 * @score:	scores indexed by position.
 * @cand:	candidate positions, distinct, any order, each < 2^32 - 1.
 * @ncand:	number of candidates.
 * @m:		how many to select, <= @ncand.
 * @scratch:	kvt_select_scratch_bytes(@ncand) bytes, 4-byte aligned.
 * @scratch_size: its size in bytes.
 * @ret_out:	room for @m positions; receives the selected positions in the order they appear
 *		in @cand (so ascending when @cand is ascending).
 * Return: @m, or -EINVAL (m > ncand, m > INT_MAX, NULL pointer with a nonzero count, scratch
 *	   too small).
 * @ret_out is untouched on failure.
 */
int kvt_select_top(const float *score, const uint32_t *cand, size_t ncand, size_t m, void *scratch,
		   size_t scratch_size, uint32_t *ret_out);

/*
 * kvt_select_bottom - the @m lowest-ranked candidates. Parameters, return and errors as
 * kvt_select_top().
 */
int kvt_select_bottom(const float *score, const uint32_t *cand, size_t ncand, size_t m,
		      void *scratch, size_t scratch_size, uint32_t *ret_out);

#endif /* KVT_ENGINE_SELECT_H */
