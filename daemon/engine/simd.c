/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "simd.h"

/* -1 until first use; the detected level is cached because __builtin_cpu_supports is not free. */
static _Atomic int simd_hw = -1;
static _Atomic int simd_cap = KVT_SIMD_AVX512;

static int
simd_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
	    __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("bmi"))
		return KVT_SIMD_AVX512;
	/* every AVX2 CPU has POPCNT and BMI1 too; the AVX2 kernels may use them */
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("bmi"))
		return KVT_SIMD_AVX2;
#endif
	return KVT_SIMD_SCALAR;
}

enum kvt_simd
kvt_simd_level(void)
{
	int hw = atomic_load_explicit(&simd_hw, memory_order_relaxed);
	int cap = atomic_load_explicit(&simd_cap, memory_order_relaxed);

	if (hw < 0) {
		hw = simd_detect();
		atomic_store_explicit(&simd_hw, hw, memory_order_relaxed);
	}
	return (enum kvt_simd)(hw < cap ? hw : cap);
}

enum kvt_simd
kvt_simd_cap(enum kvt_simd max)
{
	atomic_store_explicit(&simd_cap, (int)max, memory_order_relaxed);
	return kvt_simd_level();
}

const char *
kvt_simd_name(enum kvt_simd level)
{
	switch (level) {
	case KVT_SIMD_AVX512:
		return "avx512";
	case KVT_SIMD_AVX2:
		return "avx2";
	default:
		return "scalar";
	}
}

int
kvt_simd_parse(const char *name)
{
	if (!strcmp(name, "scalar"))
		return KVT_SIMD_SCALAR;
	if (!strcmp(name, "avx2"))
		return KVT_SIMD_AVX2;
	if (!strcmp(name, "avx512"))
		return KVT_SIMD_AVX512;
	return -EINVAL;
}
