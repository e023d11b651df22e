// SPDX-License-Identifier: MIT
//
// Baseline re-tier for the benchmark: the same tier decision as kvt_tier_plan() for the tiered
// policy without int8 (the benchmarked configuration), made the textbook way: pack candidates as
// (score key << 32 | position), std::nth_element for the eviction boundary, std::nth_element
// for the T0 boundary, std::sort of the selected T0 part (ranked heavy hitters), then a pass
// writing every position's target tier. Only the STL; the result is compared with the engine's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bench_tier.h"

extern "C" void
baseline_retier(const struct baseline_in *in, uint8_t *out_tier)
{
	const uint32_t n = in->n;
	uint32_t head = in->sinks, pre, wst, np = 0, e_new, t0c, t0_tot, e_tgt;
	uint32_t cap0 = in->t0_slots - in->delta;
	std::vector<uint64_t> k;

	if (in->protect_prompt && in->prompt_len > head)
		head = in->prompt_len;
	pre = std::min(head, n);
	wst = n > in->window ? n - in->window : 0;
	wst = std::max(wst, pre);
	k.reserve(n);
	for (uint32_t i = 0; i < n; i++) {
		bool prot = i < pre || i >= wst;

		out_tier[i] = in->tier[i] & 3;
		if ((in->tier[i] & 3) == 3)
			continue;
		if (prot) {
			np++;
			out_tier[i] = 0;
			continue;
		}
		float f = in->score[i];
		uint32_t u;

		std::memcpy(&u, &f, 4);
		if ((u & 0x7fffffffu) > 0x7f800000u)
			u = 0;
		else {
			if (u == 0x80000000u)
				u = 0;
			u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
		}
		k.push_back((uint64_t)u << 32 | i);
	}
	const uint32_t nc = (uint32_t)k.size();

	e_tgt = (uint32_t)std::floor((double)in->evict_frac * n);
	e_new = std::min(e_tgt > in->evicted ? e_tgt - in->evicted : 0u, nc);
	t0_tot = std::min<uint32_t>((uint32_t)std::ceil((double)in->hbm_frac * n), n);
	t0_tot = std::min(std::max(t0_tot, np), cap0);
	t0c = std::min(t0_tot > np ? t0_tot - np : 0u, nc - e_new);

	if (e_new > 0 && e_new < nc)
		std::nth_element(k.begin(), k.begin() + e_new, k.end());
	if (t0c > 0 && t0c < nc - e_new)
		std::nth_element(k.begin() + e_new, k.end() - t0c, k.end());
	std::sort(k.end() - t0c, k.end());
	for (uint32_t i = 0; i < nc; i++) {
		uint32_t pos = (uint32_t)k[i];

		out_tier[pos] = i < e_new ? 3 : i >= nc - t0c ? 0 : 1;
	}
}
