/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "half.h"    /* kvt_f16_to_f32 */
#include "kvt_abi.h" /* KVT_DTYPE_* */
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

/* ---- exact inner products of stored rows (kvt_simd_dot_rows) --------------------------------- */

#define DOT_PREFETCH 8 /* rows ahead, for strided rows */

static inline float
dot_elem(const uint8_t *r, unsigned int dtype, unsigned int j)
{
	uint16_t h;
	uint32_t u;
	float f;

	switch (dtype) {
	case KVT_DTYPE_F16:
		memcpy(&h, r + 2 * j, 2);
		return kvt_f16_to_f32(h);
	case KVT_DTYPE_BF16:
		memcpy(&h, r + 2 * j, 2);
		u = (uint32_t)h << 16;
		memcpy(&f, &u, 4);
		return f;
	default:
		memcpy(&f, r + 4 * j, 4);
		return f;
	}
}

/* The reference arithmetic (see simd.h); fmaf is one rounding, as the vector FMAs are. */
static void
dot_scalar(const uint8_t *rows, size_t stride, uint32_t n, unsigned int dtype, const float *x,
	   unsigned int dim, float *ret)
{
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *r = rows + i * stride;
		float acc[16] = {0}, s[8];

		for (unsigned int j = 0; j < dim; j += 16)
			for (unsigned int l = 0; l < 16; l++)
				acc[l] = fmaf(dot_elem(r, dtype, j + l), x[j + l], acc[l]);
		for (unsigned int l = 0; l < 8; l++)
			s[l] = acc[l] + acc[l + 8];
		ret[i] = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
	}
}

#if defined(__x86_64__)
/* ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) of the 8 lanes of @s */
__attribute__((target("avx2,fma"))) static inline float
hsum8(__m256 s)
{
	__m128 v = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));

	v = _mm_add_ps(v, _mm_movehl_ps(v, v));
	v = _mm_add_ss(v, _mm_movehdup_ps(v));
	return _mm_cvtss_f32(v);
}

/* 8 values of @dtype at @p as f32 */
__attribute__((target("avx2,fma,f16c"))) static inline __m256
load8(const uint8_t *p, unsigned int dtype)
{
	if (dtype == KVT_DTYPE_F16)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
	if (dtype == KVT_DTYPE_BF16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(
		    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
	return _mm256_loadu_ps((const float *)p);
}

static inline void
dot_prefetch(const uint8_t *r, size_t len)
{
	for (size_t off = 0; off < len; off += 64)
		__builtin_prefetch(r + off);
}

/*
 * One row at a time, two 8-lane accumulators (lanes 0-7 and 8-15 of the 16). Rows in turn rather
 * than interleaved: the next row's independent FMA chain overlaps this one's anyway, and a
 * single sequential stream is what the hardware prefetcher follows best (measured: 2 and 4 rows
 * at a time were 15-30 % slower streaming 64 MiB of f16 rows, no faster from cache).
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
dot_avx2_t(const uint8_t *rows, size_t stride, uint32_t n, const unsigned int dtype, const float *x,
	   unsigned int dim, float *ret)
{
	const unsigned int es = dtype == KVT_DTYPE_F32 ? 4 : 2;
	const size_t len = (size_t)dim * es;
	const bool pf = stride > len;

	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *r = rows + i * stride;
		__m256 a = _mm256_setzero_ps(), b = a;

		if (pf && i + DOT_PREFETCH < n)
			dot_prefetch(r + DOT_PREFETCH * stride, len);
		for (unsigned int j = 0; j < dim; j += 16) {
			a = _mm256_fmadd_ps(load8(r + j * es, dtype), _mm256_loadu_ps(x + j), a);
			b = _mm256_fmadd_ps(load8(r + (j + 8) * es, dtype),
					    _mm256_loadu_ps(x + j + 8), b);
		}
		ret[i] = hsum8(_mm256_add_ps(a, b));
	}
}

/* One instance per element type, so that no type test is left in the loop. */
__attribute__((target("avx2,fma,f16c"))) static void
dot_avx2(const uint8_t *rows, size_t stride, uint32_t n, unsigned int dtype, const float *x,
	 unsigned int dim, float *ret)
{
	if (dtype == KVT_DTYPE_F16)
		dot_avx2_t(rows, stride, n, KVT_DTYPE_F16, x, dim, ret);
	else if (dtype == KVT_DTYPE_BF16)
		dot_avx2_t(rows, stride, n, KVT_DTYPE_BF16, x, dim, ret);
	else
		dot_avx2_t(rows, stride, n, KVT_DTYPE_F32, x, dim, ret);
}

/* 16 values of @dtype at @p as f32 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) static inline __m512
load16(const uint8_t *p, unsigned int dtype)
{
	if (dtype == KVT_DTYPE_F16)
		return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
	if (dtype == KVT_DTYPE_BF16)
		return _mm512_castsi512_ps(_mm512_slli_epi32(
		    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
	return _mm512_loadu_ps((const float *)p);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) static inline float
hsum16(__m512 a)
{
	/* the upper 8 lanes through the AVX512F extract (the level does not promise DQ) */
	return hsum8(
	    _mm256_add_ps(_mm512_castps512_ps256(a),
			  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
}

/* One row at a time, one 16-lane accumulator (see dot_avx2() for why not several rows). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) static inline void
dot_avx512_t(const uint8_t *rows, size_t stride, uint32_t n, const unsigned int dtype,
	     const float *x, unsigned int dim, float *ret)
{
	const unsigned int es = dtype == KVT_DTYPE_F32 ? 4 : 2, nb = dim / 16;
	const size_t len = (size_t)dim * es;
	const bool pf = stride > len;
	__m512 xv[8];

	if (dim > 128) { /* more than the 8 query registers */
		dot_avx2(rows, stride, n, dtype, x, dim, ret);
		return;
	}
	for (unsigned int b = 0; b < nb; b++)
		xv[b] = _mm512_loadu_ps(x + 16 * b);
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *r = rows + i * stride;
		__m512 a = _mm512_setzero_ps();

		if (pf && i + DOT_PREFETCH < n)
			dot_prefetch(r + DOT_PREFETCH * stride, len);
		for (unsigned int b = 0; b < nb; b++)
			a = _mm512_fmadd_ps(load16(r + (size_t)b * 16 * es, dtype), xv[b], a);
		ret[i] = hsum16(a);
	}
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) static void
dot_avx512(const uint8_t *rows, size_t stride, uint32_t n, unsigned int dtype, const float *x,
	   unsigned int dim, float *ret)
{
	if (dtype == KVT_DTYPE_F16)
		dot_avx512_t(rows, stride, n, KVT_DTYPE_F16, x, dim, ret);
	else if (dtype == KVT_DTYPE_BF16)
		dot_avx512_t(rows, stride, n, KVT_DTYPE_BF16, x, dim, ret);
	else
		dot_avx512_t(rows, stride, n, KVT_DTYPE_F32, x, dim, ret);
}
#endif

void
kvt_simd_dot_rows(const void *rows, size_t stride, uint32_t n, unsigned int dtype, const float *x,
		  unsigned int dim, float *ret)
{
	if (dtype != KVT_DTYPE_F16 && dtype != KVT_DTYPE_BF16 && dtype != KVT_DTYPE_F32) {
		memset(ret, 0, (size_t)n * sizeof(*ret));
		return;
	}
#if defined(__x86_64__)
	switch (kvt_simd_level()) {
	case KVT_SIMD_AVX512:
		dot_avx512(rows, stride, n, dtype, x, dim, ret);
		return;
	case KVT_SIMD_AVX2:
		dot_avx2(rows, stride, n, dtype, x, dim, ret);
		return;
	default:
		break;
	}
#endif
	dot_scalar(rows, stride, n, dtype, x, dim, ret);
}
