/* SPDX-License-Identifier: MIT */
/*
 * simd.h - runtime choice of the SIMD level used by engine kernels.
 *
 * Kernels are written once per level with __attribute__((target("..."))) and pick their variant
 * through kvt_simd_level(). Levels are ordered: a machine at KVT_SIMD_AVX512 can run every lower
 * level. Tests and benchmarks cap the level with kvt_simd_cap() to compare variants; variants
 * that claim exactness must produce identical bytes at every level.
 */
#ifndef KVT_ENGINE_SIMD_H
#define KVT_ENGINE_SIMD_H

#include <stddef.h>
#include <stdint.h>

enum kvt_simd {
	KVT_SIMD_SCALAR = 0,
	KVT_SIMD_AVX2 = 1,   /* AVX2 + FMA (+ F16C, POPCNT, BMI1) */
	KVT_SIMD_AVX512 = 2, /* AVX-512 F, BW, VL, VBMI (Ice Lake, Zen 4 and later) + AVX2's */
};

/* The level in force: the best the CPU supports, lowered by kvt_simd_cap(). Thread-safe. */
enum kvt_simd kvt_simd_level(void);

/* Caps the level at @max (never raises it above what the CPU has). Returns the level in force.
 * Not meant to race with running kernels: call it at start-up or between benchmark phases. */
enum kvt_simd kvt_simd_cap(enum kvt_simd max);

/* "scalar", "avx2" or "avx512". */
const char *kvt_simd_name(enum kvt_simd level);

/* Parses a name as kvt_simd_name() prints it. Returns the level or -EINVAL. */
int kvt_simd_parse(const char *name);

/*
 * kvt_simd_dot_rows - ret[i] = <row_i, x> for @n rows, row i at @rows + i * @stride bytes, each
 * @dim values of @dtype (KVT_DTYPE_F16, _BF16 or _F32, proto/kvt_abi.h); @x is @dim f32.
 * @dim: a multiple of 16 (64 and 128 are what the engine uses).
 * The arithmetic is fixed, so every SIMD level gives the same bits: 16 lane sums, lane l the
 * fused multiply-adds (one rounding each) of elements l, l + 16, l + 32, ... in that order from
 * 0; then s_l = acc_l + acc_(l+8) for l < 8 and ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)).
 * It is the order of an AVX2 scan with two 8-lane FMA accumulators, which the AVX-512 level
 * runs as one 16-lane accumulator, several rows at a time. Rows further apart than one row's
 * bytes are prefetched a few rows ahead (a strided layout defeats the hardware prefetcher).
 * An unknown @dtype scores 0. Thread-safe.
 */
void kvt_simd_dot_rows(const void *rows, size_t stride, uint32_t n, unsigned int dtype,
		       const float *x, unsigned int dim, float *ret);

#endif /* KVT_ENGINE_SIMD_H */
