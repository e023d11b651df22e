/* SPDX-License-Identifier: MIT */
/*
 * gen.h - synthetic per-head key and query sets for the retrieval benchmark.
 *
 * Both sets model what post-RoPE keys of real models show and what makes retrieval hard:
 *   - anisotropy: per-channel scales drawn log-normal (sigma 0.6);
 *   - outlier channels: 4 channels with a large mean (6..12) and 3x scale, shared by all keys,
 *     which after normalisation pushes every key toward one direction (skewed centroid use);
 *   - content: a fraction of the keys (4 %) carries one of 64 latent topic directions with a
 *     random strength; a query is a topic direction plus its own anisotropic noise and a small
 *     component on the outlier channels. The true top-k is mostly (not only) keys of the query's
 *     topic, with a continuous spread of scores, as attention to relevant tokens is.
 * "outlier" uses one profile for all keys. "drift" draws the first 10 % of keys (the prefill)
 * from one profile and the rest from another (other outlier channels, scales and topics);
 * queries use the later profile's topics, so methods trained on the prefill see stale data.
 * Everything is seeded: the same (name, n, d, seed) always gives the same floats.
 */
#ifndef KVT_BENCH_GEN_H
#define KVT_BENCH_GEN_H

#include <stddef.h>
#include <stdint.h>

enum gen_set {
	GEN_OUTLIER = 0,
	GEN_DRIFT = 1,
};

/*
 * gen_make - fill @keys [n][d] and @queries [nq][d].
 * Returns 0, or -EINVAL for d > 128 or d not a multiple of 8.
 */
int gen_make(enum gen_set set, uint32_t n, unsigned int d, uint32_t nq, uint64_t seed, float *keys,
	     float *queries);

/* gen_name - "outlier" or "drift". */
const char *gen_name(enum gen_set set);

#endif /* KVT_BENCH_GEN_H */
