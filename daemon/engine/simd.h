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

#endif /* KVT_ENGINE_SIMD_H */
