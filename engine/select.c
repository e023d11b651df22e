/* SPDX-License-Identifier: MIT */
/*
 * Radix select over u32 keys. The first pass histograms a 16-bit digit over all keys (an 8-bit
 * one for small inputs, where clearing 64K counters would cost more than the pass); the next
 * pass copies the survivors of the chosen bucket while histogramming their next 8-bit digit, and
 * so on over the shrinking survivor set. At most two passes read the whole input; the rest read
 * only survivors. No recursion, no data-dependent worst case beyond 4 passes.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "select.h"

/* Below this many keys, the first digit is 8 bits wide instead of 16. */
#define SELECT_SMALL 16384u

size_t
kvt_select_scratch_bytes(size_t n)
{
	size_t per = 2 * sizeof(uint32_t);

	if (n > (SIZE_MAX - 4 * KVT_SELECT_HIST - 64) / per)
		return SIZE_MAX;
	return (n * per + 4 * KVT_SELECT_HIST + 63) & ~(size_t)63;
}

/* Finds the bucket holding rank *k; moves *k to the rank inside that bucket. */
static unsigned
hist_find(const uint32_t *hist, unsigned nb, size_t *k, size_t *less)
{
	size_t cum = 0;
	unsigned b;

	for (b = 0; b < nb - 1; b++) {
		if (cum + hist[b] > *k)
			break;
		cum += hist[b];
	}
	*k -= cum;
	*less += cum;
	return b;
}

uint32_t
kvt_select_kth(const uint32_t *keys, size_t n, size_t k, uint32_t *surv, uint32_t *hist,
	       size_t *ret_less)
{
	unsigned bits = n >= SELECT_SMALL ? 16 : 8;
	unsigned shift = 32 - bits;
	size_t less = 0, i, m;
	uint32_t v, b;

	memset(hist, 0, sizeof(*hist) << bits);
	for (i = 0; i < n; i++)
		hist[keys[i] >> shift]++;
	b = hist_find(hist, 1u << bits, &k, &less);
	v = b << shift;
	if (hist[b] == 1) {
		for (i = 0; i < n; i++)
			if (keys[i] >> shift == b)
				break;
		v = keys[i];
		goto out;
	}

	/* Survivors of the first digit, with the histogram of their next digit. */
	memset(hist, 0, 256 * sizeof(*hist));
	m = 0;
	for (i = 0; i < n; i++) {
		uint32_t x = keys[i];

		if (x >> shift == b) {
			surv[m++] = x;
			hist[(x >> (shift - 8)) & 0xff]++;
		}
	}
	shift -= 8;
	for (;;) {
		size_t j = 0;

		b = hist_find(hist, 256, &k, &less);
		v |= b << shift;
		if (shift == 0)
			break;
		if (hist[b] == 1) {
			for (i = 0; i < m; i++)
				if (((surv[i] >> shift) & 0xff) == b)
					break;
			v = surv[i];
			break;
		}
		memset(hist, 0, 256 * sizeof(*hist));
		for (i = 0; i < m; i++) {
			uint32_t x = surv[i];

			if (((x >> shift) & 0xff) == b) {
				surv[j++] = x;
				hist[(x >> (shift - 8)) & 0xff]++;
			}
		}
		m = j;
		shift -= 8;
	}
out:
	if (ret_less)
		*ret_less = less;
	return v;
}

/*
 * Shared body of top and bottom. In combined (score, position) order, the selection is the rank
 * range [lo, lo + m). Scores give the key v of the boundary rank and L = #{key < v}; tied
 * candidates (key == v) take ranks L.. in ascending position order, so the boundary rank's ties
 * are resolved on positions: directly when @cand is ascending, else with a second radix select
 * over the tied positions.
 */
static int
select_range(const float *score, const uint32_t *cand, size_t ncand, size_t m, int top,
	     void *scratch, size_t scratch_size, uint32_t *ret_out)
{
	uint32_t *keys = scratch, *surv, *hist;
	size_t i, o, lo, bound, less, ties, tie_lo, tie_hi;
	int ascending = 1;
	uint32_t v, pt;

	if (m > ncand || m > INT_MAX || (ncand && (!score || !cand || !scratch)) || (m && !ret_out))
		return -EINVAL;
	if (scratch_size < kvt_select_scratch_bytes(ncand) || ((uintptr_t)scratch & 3))
		return -EINVAL;
	if (m == 0)
		return 0;
	if (m == ncand) {
		memcpy(ret_out, cand, m * sizeof(*cand));
		return (int)m;
	}
	surv = keys + ncand;
	hist = surv + ncand;

	for (i = 0; i < ncand; i++) {
		keys[i] = kvt_score_key(score[cand[i]]);
		if (i && cand[i] <= cand[i - 1])
			ascending = 0;
	}
	/* bottom: ranks [0, m), boundary rank m-1; top: ranks [ncand-m, ncand), boundary ncand-m */
	lo = top ? ncand - m : 0;
	bound = top ? lo : m - 1;
	v = kvt_select_kth(keys, ncand, bound, surv, hist, &less);

	/* Ties of v hold ranks less..less+ties-1; we take the tied ranks [tie_lo, tie_hi). */
	ties = 0;
	for (i = 0; i < ncand; i++)
		ties += keys[i] == v;
	tie_lo = (top ? bound : less) - less;
	tie_hi = (top ? less + ties : m) - less;

	o = 0;
	if (ascending) {
		size_t t = 0;

		for (i = 0; i < ncand; i++) {
			uint32_t x = keys[i];

			if (x == v) {
				if (t >= tie_lo && t < tie_hi)
					ret_out[o++] = cand[i];
				t++;
			} else if (top ? x > v : x < v) {
				ret_out[o++] = cand[i];
			}
		}
		return (int)o;
	}

	/* Unordered candidates: find the position bounding the taken ties. @keys is reused for the
	 * tied positions, so the output pass recomputes keys from the scores. */
	{
		size_t t = 0;

		for (i = 0; i < ncand; i++)
			if (keys[i] == v)
				keys[t++] = cand[i];
		pt = kvt_select_kth(keys, t, top ? tie_lo : tie_hi - 1, surv, hist, NULL);
	}
	for (i = 0; i < ncand; i++) {
		uint32_t x = kvt_score_key(score[cand[i]]);

		if (x == v) {
			if (top ? cand[i] >= pt : cand[i] <= pt)
				ret_out[o++] = cand[i];
		} else if (top ? x > v : x < v) {
			ret_out[o++] = cand[i];
		}
	}
	return (int)o;
}

int
kvt_select_top(const float *score, const uint32_t *cand, size_t ncand, size_t m, void *scratch,
	       size_t scratch_size, uint32_t *ret_out)
{
	return select_range(score, cand, ncand, m, 1, scratch, scratch_size, ret_out);
}

int
kvt_select_bottom(const float *score, const uint32_t *cand, size_t ncand, size_t m, void *scratch,
		  size_t scratch_size, uint32_t *ret_out)
{
	return select_range(score, cand, ncand, m, 0, scratch, scratch_size, ret_out);
}
