/* SPDX-License-Identifier: MIT */
/* Shared between main.c and the C++ baseline (baseline.cpp). */
#ifndef KVT_BENCH_TIER_H
#define KVT_BENCH_TIER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Inputs of one baseline re-tier: the tiered policy's parameters and the sequence arrays. */
struct baseline_in {
	uint32_t n, t0_slots, delta, sinks, window, prompt_len, protect_prompt, evicted;
	float hbm_frac, evict_frac;
	const float *score;
	const uint8_t *tier;
};

/* Writes the target tier (0..3, no int8 flag) of every position to @out_tier[n]. */
void baseline_retier(const struct baseline_in *in, uint8_t *out_tier);

/* step.c: daemon CPU per decode step through a real kvtierd. */
struct step_result {
	uint32_t n, steps;
	uint64_t t0, t1;
	double step_us;		/* step_nofetch_us + fetch_us */
	double step_nofetch_us; /* APPEND, SCORE_ADD over n, RETIER every 64 */
	double fetch_us;	/* FETCH of the T1 rows, one op per layer, all layers */
	double retier_us;	/* one RETIER of the whole sequence */
};
int bench_step(uint32_t n0, uint32_t steps, struct step_result *ret);

#ifdef __cplusplus
}
#endif

#endif /* KVT_BENCH_TIER_H */
