/* SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "gguf.h"
#include "llm_quant.h"
#include "simd.h"

float
llm_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	uint32_t bits;
	float f;

	if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13); /* inf, NaN (payload kept) */
	} else if (exp == 0) {
		if (!man) {
			bits = sign;
		} else {
			/* Subnormal half: value = man * 2^-24, exact in f32. */
			f = (float)man * 0x1p-24f;
			memcpy(&bits, &f, 4);
			bits |= sign;
		}
	} else {
		bits = sign | ((exp + 112) << 23) | (man << 13);
	}
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t
llm_f32_to_f16(float f)
{
	uint32_t x, sign, exp, man;

	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000;
	exp = (x >> 23) & 0xff;
	man = x & 0x7fffff;
	if (exp == 0xff)
		return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
	if (exp > 142) /* >= 2^16: overflow to inf */
		return (uint16_t)(sign | 0x7c00);
	if (exp >= 113) {
		/* Normal half: round the 13 dropped bits to nearest even; a carry may bump exp. */
		uint32_t h = ((exp - 112) << 10) | (man >> 13);
		uint32_t rest = man & 0x1fff;

		if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
			h++;
		return (uint16_t)(sign | h); /* h == 0x7c00 after a carry is inf, as it should */
	}
	if (exp < 102) /* below half the smallest subnormal */
		return (uint16_t)sign;
	/* Subnormal half: shift the full mantissa, round to nearest even. */
	man |= 0x800000;
	{
		uint32_t shift = 126 - exp; /* 14..24 */
		uint32_t h = man >> shift;
		uint32_t rest = man & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);

		if (rest > half || (rest == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
}

bool
llm_type_supported(uint32_t type)
{
	switch (type) {
	case GGML_TYPE_F32:
	case GGML_TYPE_F16:
	case GGML_TYPE_Q4_0:
	case GGML_TYPE_Q4_1:
	case GGML_TYPE_Q8_0:
		return true;
	default:
		return false;
	}
}

size_t
llm_row_bytes(uint32_t type, size_t n)
{
	uint32_t bs = ggml_blck_size(type);

	return bs ? n / bs * ggml_type_size(type) : 0;
}

void
llm_dequant_row(uint32_t type, const void *src, float *dst, size_t n)
{
	switch (type) {
	case GGML_TYPE_F32:
		memcpy(dst, src, n * sizeof(float));
		break;
	case GGML_TYPE_F16: {
		const uint8_t *p = src;

		for (size_t i = 0; i < n; i++) {
			uint16_t h;

			memcpy(&h, p + 2 * i, 2);
			dst[i] = llm_f16_to_f32(h);
		}
		break;
	}
	case GGML_TYPE_Q4_0: {
		const struct block_q4_0 *b = src;

		for (size_t i = 0; i < n / QK; i++, b++, dst += QK) {
			float d = llm_f16_to_f32(b->d);

			for (int j = 0; j < QK / 2; j++) {
				dst[j] = d * (float)((b->qs[j] & 15) - 8);
				dst[j + QK / 2] = d * (float)((b->qs[j] >> 4) - 8);
			}
		}
		break;
	}
	case GGML_TYPE_Q4_1: {
		const struct block_q4_1 *b = src;

		for (size_t i = 0; i < n / QK; i++, b++, dst += QK) {
			float d = llm_f16_to_f32(b->d), m = llm_f16_to_f32(b->m);

			for (int j = 0; j < QK / 2; j++) {
				dst[j] = d * (float)(b->qs[j] & 15) + m;
				dst[j + QK / 2] = d * (float)(b->qs[j] >> 4) + m;
			}
		}
		break;
	}
	case GGML_TYPE_Q8_0: {
		const struct block_q8_0 *b = src;

		for (size_t i = 0; i < n / QK; i++, b++, dst += QK) {
			float d = llm_f16_to_f32(b->d);

			for (int j = 0; j < QK; j++)
				dst[j] = d * (float)b->qs[j];
		}
		break;
	}
	default:
		memset(dst, 0, n * sizeof(float));
		break;
	}
}

/* ---- scalar products: per block, sum q*x then scale, as the AVX2 code does ---------------- */

static float
dot_f32_scalar(const float *w, const float *x, size_t n)
{
	float s = 0.0f;

	for (size_t i = 0; i < n; i++)
		s += w[i] * x[i];
	return s;
}

static float
dot_f16_scalar(const uint8_t *w, const float *x, size_t n)
{
	float s = 0.0f;

	for (size_t i = 0; i < n; i++) {
		uint16_t h;

		memcpy(&h, w + 2 * i, 2);
		s += llm_f16_to_f32(h) * x[i];
	}
	return s;
}

static float
dot_q4_0_scalar(const struct block_q4_0 *b, const float *x, size_t n)
{
	float s = 0.0f;

	for (size_t i = 0; i < n / QK; i++, b++, x += QK) {
		float t = 0.0f;

		for (int j = 0; j < QK / 2; j++)
			t += (float)((b->qs[j] & 15) - 8) * x[j] +
			     (float)((b->qs[j] >> 4) - 8) * x[j + 16];
		s += llm_f16_to_f32(b->d) * t;
	}
	return s;
}

static float
dot_q4_1_scalar(const struct block_q4_1 *b, const float *x, size_t n)
{
	float s = 0.0f;

	for (size_t i = 0; i < n / QK; i++, b++, x += QK) {
		float t = 0.0f, sx = 0.0f;

		for (int j = 0; j < QK / 2; j++) {
			t += (float)(b->qs[j] & 15) * x[j] + (float)(b->qs[j] >> 4) * x[j + 16];
			sx += x[j] + x[j + 16];
		}
		s += llm_f16_to_f32(b->d) * t + llm_f16_to_f32(b->m) * sx;
	}
	return s;
}

static float
dot_q8_0_scalar(const struct block_q8_0 *b, const float *x, size_t n)
{
	float s = 0.0f;

	for (size_t i = 0; i < n / QK; i++, b++, x += QK) {
		float t = 0.0f;

		for (int j = 0; j < QK; j++)
			t += (float)b->qs[j] * x[j];
		s += llm_f16_to_f32(b->d) * t;
	}
	return s;
}

/* ---- AVX2 + FMA (+ F16C for the scales) -------------------------------------------------- */
#if defined(__x86_64__)
#define AVX2_FN __attribute__((target("avx2,fma,f16c")))

AVX2_FN static inline float
hsum256(__m256 v)
{
	__m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);

	lo = _mm_add_ps(lo, hi);
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

AVX2_FN static inline float
f16_avx(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* 8 unsigned bytes at @p to 8 floats. */
AVX2_FN static inline __m256
u8x8_ps(__m128i v)
{
	return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}

AVX2_FN static float
dot_f32_avx2(const float *w, const float *x, size_t n)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
	size_t i = 0;
	float s;

	for (; i + 16 <= n; i += 16) {
		a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
		a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
	}
	s = hsum256(_mm256_add_ps(a0, a1));
	for (; i < n; i++)
		s += w[i] * x[i];
	return s;
}

AVX2_FN static float
dot_f16_avx2(const uint8_t *w, const float *x, size_t n)
{
	__m256 a = _mm256_setzero_ps();
	size_t i = 0;
	float s;

	for (; i + 8 <= n; i += 8) {
		__m256 wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i)));

		a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), a);
	}
	s = hsum256(a);
	for (; i < n; i++) {
		uint16_t h;

		memcpy(&h, w + 2 * i, 2);
		s += f16_avx(h) * x[i];
	}
	return s;
}

/*
 * For the 4-bit formats: the 16 bytes hold elements j (low nibble) and j + 16 (high nibble), so
 * the low nibbles of bytes 0..7 and 8..15 pair with x[0..7], x[8..15], the high ones with
 * x[16..23], x[24..31].
 */
AVX2_FN static inline __m256
q4_block_dot(const uint8_t *qs, const float *x, __m256 bias, __m256 *ret_sx)
{
	const __m128i mask = _mm_set1_epi8(15);
	__m128i raw = _mm_loadu_si128((const __m128i *)qs);
	__m128i lo = _mm_and_si128(raw, mask);
	__m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
	__m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
	__m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
	__m256 t;

	t = _mm256_mul_ps(_mm256_add_ps(u8x8_ps(lo), bias), x0);
	t = _mm256_fmadd_ps(_mm256_add_ps(u8x8_ps(_mm_srli_si128(lo, 8)), bias), x1, t);
	t = _mm256_fmadd_ps(_mm256_add_ps(u8x8_ps(hi), bias), x2, t);
	t = _mm256_fmadd_ps(_mm256_add_ps(u8x8_ps(_mm_srli_si128(hi, 8)), bias), x3, t);
	if (ret_sx)
		*ret_sx = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
	return t;
}

AVX2_FN static float
dot_q4_0_avx2(const struct block_q4_0 *b, const float *x, size_t n)
{
	const __m256 bias = _mm256_set1_ps(-8.0f);
	__m256 acc = _mm256_setzero_ps();

	for (size_t i = 0; i < n / QK; i++, b++, x += QK) {
		__m256 t = q4_block_dot(b->qs, x, bias, NULL);

		acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_avx(b->d)), t, acc);
	}
	return hsum256(acc);
}

AVX2_FN static float
dot_q4_1_avx2(const struct block_q4_1 *b, const float *x, size_t n)
{
	const __m256 zero = _mm256_setzero_ps();
	__m256 acc = _mm256_setzero_ps();

	for (size_t i = 0; i < n / QK; i++, b++, x += QK) {
		__m256 sx, t = q4_block_dot(b->qs, x, zero, &sx);

		acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_avx(b->d)), t, acc);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_avx(b->m)), sx, acc);
	}
	return hsum256(acc);
}

AVX2_FN static float
dot_q8_0_avx2(const struct block_q8_0 *b, const float *x, size_t n)
{
	__m256 acc = _mm256_setzero_ps();

	for (size_t i = 0; i < n / QK; i++, b++, x += QK) {
		__m256i q = _mm256_loadu_si256((const __m256i *)b->qs);
		__m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
		__m256 t;

		t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), _mm256_loadu_ps(x));
		t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))),
				    _mm256_loadu_ps(x + 8), t);
		t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)),
				    _mm256_loadu_ps(x + 16), t);
		t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))),
				    _mm256_loadu_ps(x + 24), t);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_avx(b->d)), t, acc);
	}
	return hsum256(acc);
}
#endif /* __x86_64__ */

/* kvt_simd's AVX2 level includes F16C, which the f16 rows need. */
static int
simd_for_quant(void)
{
	return kvt_simd_level() >= KVT_SIMD_AVX2 ? KVT_SIMD_AVX2 : KVT_SIMD_SCALAR;
}

float
llm_dot(int simd, uint32_t type, const void *row, const float *x, size_t n)
{
#if defined(__x86_64__)
	if (simd >= KVT_SIMD_AVX2) {
		switch (type) {
		case GGML_TYPE_F32:
			return dot_f32_avx2(row, x, n);
		case GGML_TYPE_F16:
			return dot_f16_avx2(row, x, n);
		case GGML_TYPE_Q4_0:
			return dot_q4_0_avx2(row, x, n);
		case GGML_TYPE_Q4_1:
			return dot_q4_1_avx2(row, x, n);
		case GGML_TYPE_Q8_0:
			return dot_q8_0_avx2(row, x, n);
		}
	}
#endif
	switch (type) {
	case GGML_TYPE_F32:
		return dot_f32_scalar(row, x, n);
	case GGML_TYPE_F16:
		return dot_f16_scalar(row, x, n);
	case GGML_TYPE_Q4_0:
		return dot_q4_0_scalar(row, x, n);
	case GGML_TYPE_Q4_1:
		return dot_q4_1_scalar(row, x, n);
	case GGML_TYPE_Q8_0:
		return dot_q8_0_scalar(row, x, n);
	}
	return NAN;
}

void
llm_matvec(const struct llm_mat *w, const float *x, float *y, uint32_t r0, uint32_t r1)
{
	int simd = simd_for_quant();

	for (uint32_t r = r0; r < r1; r++)
		y[r] = llm_dot(simd, w->type, w->data + (size_t)r * w->row_bytes, x, w->cols);
}
