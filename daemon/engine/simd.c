/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "simd.h"

/* -1 until first use; the detected level is cached because __builtin_cpu_supports is not free. */
static _Atomic int simd_hw = -1;
static _Atomic int simd_cap = KVT_SIMD_AVX512;

#if defined(__x86_64__) || defined(__i386__)
/* F16C (CPUID.1:ECX bit 29): not every compiler's __builtin_cpu_supports knows its name. */
static bool
has_f16c(void)
{
	unsigned a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static int
simd_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_cpu_init();
	if (!has_f16c()) /* every AVX2 CPU has it; the AVX2 kernels convert f16 with it */
		return KVT_SIMD_SCALAR;
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
