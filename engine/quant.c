/* SPDX-License-Identifier: MIT */
/*
 * int8 quantization and row gather. Each kernel has a scalar variant and an AVX2 variant; the
 * AVX2 one performs the same IEEE f32 operation per element (one multiply, one round-to-nearest
 * conversion), so its output bytes equal the scalar ones. Per-group maxima are taken on the
 * magnitude bits as unsigned integers, which orders finite values like fabsf() does and puts
 * Inf and NaN above every finite value, with no NaN-propagation differences between fmaxf()
 * and vmaxps.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kvt_abi.h"
#include "quant.h"
#include "simd.h"

#define QNAN_BITS 0x7fc00000u

static inline uint32_t
f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float
u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* ---- scalar element access ------------------------------------------------------------- */

static inline float
ld1(int dtype, const char *row, size_t i)
{
	uint16_t h;
	float f;

	switch (dtype) {
	case KVT_DTYPE_F16:
		memcpy(&h, row + 2 * i, 2);
		return kvt_f16_to_f32(h);
	case KVT_DTYPE_BF16:
		memcpy(&h, row + 2 * i, 2);
		return kvt_bf16_to_f32(h);
	default:
		memcpy(&f, row + 4 * i, 4);
		return f;
	}
}

static inline void
st1(int dtype, char *row, size_t i, float f)
{
	uint16_t h;

	switch (dtype) {
	case KVT_DTYPE_F16:
		h = kvt_f32_to_f16(f);
		memcpy(row + 2 * i, &h, 2);
		break;
	case KVT_DTYPE_BF16:
		h = kvt_f32_to_bf16(f);
		memcpy(row + 2 * i, &h, 2);
		break;
	default:
		memcpy(row + 4 * i, &f, 4);
		break;
	}
}

/* Group parameters from the max magnitude bits. Returns 1 when the codes must be forced to 0
 * (tiny or non-finite group), 0 when codes are rint(x * inv). */
static inline int
qparams(uint32_t amax_bits, float *scale, float *inv)
{
	float amax = u2f(amax_bits);

	if (amax_bits >= 0x7f800000u) {
		*scale = u2f(QNAN_BITS);
		*inv = 0.0f;
		return 1;
	}
	if (amax < KVT_QUANT_TINY) {
		*scale = 0.0f;
		*inv = 0.0f;
		return 1;
	}
	*scale = amax / 127.0f;
	*inv = 127.0f / amax;
	return 0;
}

static inline int8_t
qcode(float x, float inv)
{
	long q = lrintf(x * inv); /* |x * inv| <= 127 * (1 + 2^-23): never outside [-127, 127] */

	if (q > 127)
		q = 127;
	if (q < -127)
		q = -127;
	return (int8_t)q;
}

static int
check_args(int dtype, size_t elems, size_t nrows, const void *a, const void *b, const void *c,
	   size_t stride)
{
	if (dtype < 0 || dtype >= KVT_DTYPE__COUNT || elems == 0)
		return -EINVAL;
	if (nrows && (!a || !b || !c || stride < elems * kvt_dtype_size((uint32_t)dtype)))
		return -EINVAL;
	return 0;
}

static void
quant_rows_scalar(int dtype, uint32_t heads, uint32_t hd, const char *src, size_t stride,
		  size_t nrows, int8_t *codes, float *scales)
{
	for (size_t r = 0; r < nrows; r++, src += stride) {
		for (uint32_t h = 0; h < heads; h++, codes += hd, scales++) {
			size_t base = (size_t)h * hd;
			uint32_t m = 0;
			float inv;

			for (uint32_t j = 0; j < hd; j++) {
				uint32_t b = f2u(ld1(dtype, src, base + j)) & 0x7fffffffu;

				m = b > m ? b : m;
			}
			if (qparams(m, scales, &inv)) {
				memset(codes, 0, hd);
				continue;
			}
			for (uint32_t j = 0; j < hd; j++)
				codes[j] = qcode(ld1(dtype, src, base + j), inv);
		}
	}
}

static void
dequant_rows_scalar(int dtype, uint32_t heads, uint32_t hd, const int8_t *codes,
		    const float *scales, size_t nrows, char *dst, size_t stride)
{
	for (size_t r = 0; r < nrows; r++, dst += stride)
		for (uint32_t h = 0; h < heads; h++, codes += hd, scales++)
			for (uint32_t j = 0; j < hd; j++)
				st1(dtype, dst, (size_t)h * hd + j, (float)codes[j] * *scales);
}

/* Channels per chunk of the per-channel kernels: bounds the stack arrays. */
#define CH_CHUNK 256

static void
quant_ch_scalar(int dtype, uint32_t elems, const char *src, size_t stride, size_t nrows,
		int8_t *codes, float *scales)
{
	uint32_t amax[CH_CHUNK];
	float inv[CH_CHUNK];
	uint8_t zero[CH_CHUNK];

	for (uint32_t c0 = 0; c0 < elems; c0 += CH_CHUNK) {
		uint32_t cn = elems - c0 < CH_CHUNK ? elems - c0 : CH_CHUNK;

		memset(amax, 0, sizeof(amax));
		for (size_t r = 0; r < nrows; r++)
			for (uint32_t c = 0; c < cn; c++) {
				uint32_t b =
				    f2u(ld1(dtype, src + r * stride, c0 + c)) & 0x7fffffffu;

				amax[c] = b > amax[c] ? b : amax[c];
			}
		for (uint32_t c = 0; c < cn; c++)
			zero[c] = (uint8_t)qparams(amax[c], &scales[c0 + c], &inv[c]);
		for (size_t r = 0; r < nrows; r++)
			for (uint32_t c = 0; c < cn; c++)
				codes[r * elems + c0 + c] =
				    zero[c] ? 0
					    : qcode(ld1(dtype, src + r * stride, c0 + c), inv[c]);
	}
}

static void
dequant_ch_scalar(int dtype, uint32_t elems, const int8_t *codes, const float *scales, size_t nrows,
		  char *dst, size_t stride)
{
	for (size_t r = 0; r < nrows; r++, dst += stride, codes += elems)
		for (uint32_t c = 0; c < elems; c++)
			st1(dtype, dst, c, (float)codes[c] * scales[c]);
}

/* ---- AVX2 ----------------------------------------------------------------------------- */

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma,f16c")))

static int
avx2_ok(void)
{
	return kvt_simd_level() >= KVT_SIMD_AVX2; /* the level includes F16C */
}

/* 8 elements of @dtype at @p, widened to f32 (exact). */
static inline AVX2 __m256
ld8(int dtype, const char *p)
{
	switch (dtype) {
	case KVT_DTYPE_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
	case KVT_DTYPE_BF16:
		return _mm256_castsi256_ps(_mm256_slli_epi32(
		    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
	default:
		return _mm256_loadu_ps((const float *)p);
	}
}

/* Stores 8 f32 as @dtype, rounding to nearest-even like kvt_f32_to_f16/bf16(). */
static inline AVX2 void
st8(int dtype, char *p, __m256 v)
{
	switch (dtype) {
	case KVT_DTYPE_F16:
		_mm_storeu_si128((__m128i *)p,
				 _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
		break;
	case KVT_DTYPE_BF16: {
		__m256i u = _mm256_castps_si256(v);
		__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
		__m256i r = _mm256_srli_epi32(
		    _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
		__m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
		__m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
		__m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
		__m256i w = _mm256_blendv_epi8(r, q, nan);
		__m256i p16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0xd8);

		_mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(p16));
		break;
	}
	default:
		_mm256_storeu_ps((float *)p, v);
		break;
	}
}

static inline AVX2 uint32_t
hmax_epu32(__m256i v)
{
	__m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));

	m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
	m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
	return (uint32_t)_mm_cvtsi128_si32(m);
}

/* 8 codes from 8 f32 already multiplied by inv: cvtps2dq rounds to nearest-even like lrintf. */
static inline AVX2 void
st8_codes(int8_t *q, __m256 v)
{
	__m256i i = _mm256_cvtps_epi32(v);
	__m128i p = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));

	_mm_storel_epi64((__m128i *)q, _mm_packs_epi16(p, p));
}

/* 32 codes from 4 x 8 f32 already multiplied by inv, one 32-byte store. The two packs work
 * per 128-bit lane; the dword permute restores element order. Saturation never triggers
 * (|v| <= 127.x), so the bytes equal four st8_codes(). */
static inline AVX2 void
st32_codes(int8_t *q, __m256 a, __m256 b, __m256 c, __m256 d)
{
	__m256i ab = _mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b));
	__m256i cd = _mm256_packs_epi32(_mm256_cvtps_epi32(c), _mm256_cvtps_epi32(d));
	__m256i x = _mm256_packs_epi16(ab, cd);

	x = _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	_mm256_storeu_si256((__m256i *)q, x);
}

static inline AVX2 __m256
ld8_codes(const int8_t *q)
{
	return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

static AVX2 void
quant_rows_avx2(int dtype, uint32_t heads, uint32_t hd, const char *src, size_t stride,
		size_t nrows, int8_t *codes, float *scales)
{
	const size_t esz = kvt_dtype_size((uint32_t)dtype);
	const __m256i absm = _mm256_set1_epi32(0x7fffffff);
	const uint32_t hd8 = hd & ~7u;

	for (size_t r = 0; r < nrows; r++, src += stride) {
		for (uint32_t h = 0; h < heads; h++, codes += hd, scales++) {
			const char *hp = src + (size_t)h * hd * esz;
			__m256i mx = _mm256_setzero_si256();
			uint32_t m, j;
			float inv;
			__m256 vinv;

			for (j = 0; j < hd8; j += 8)
				mx = _mm256_max_epu32(
				    mx, _mm256_and_si256(
					    _mm256_castps_si256(ld8(dtype, hp + j * esz)), absm));
			m = hmax_epu32(mx);
			for (; j < hd; j++) {
				uint32_t b = f2u(ld1(dtype, hp, j)) & 0x7fffffffu;

				m = b > m ? b : m;
			}
			if (qparams(m, scales, &inv)) {
				memset(codes, 0, hd);
				continue;
			}
			vinv = _mm256_set1_ps(inv);
			for (j = 0; j + 32 <= hd; j += 32)
				st32_codes(codes + j, _mm256_mul_ps(ld8(dtype, hp + j * esz), vinv),
					   _mm256_mul_ps(ld8(dtype, hp + (j + 8) * esz), vinv),
					   _mm256_mul_ps(ld8(dtype, hp + (j + 16) * esz), vinv),
					   _mm256_mul_ps(ld8(dtype, hp + (j + 24) * esz), vinv));
			for (; j < hd8; j += 8)
				st8_codes(codes + j, _mm256_mul_ps(ld8(dtype, hp + j * esz), vinv));
			for (; j < hd; j++)
				codes[j] = qcode(ld1(dtype, hp, j), inv);
		}
	}
}

static AVX2 void
dequant_rows_avx2(int dtype, uint32_t heads, uint32_t hd, const int8_t *codes, const float *scales,
		  size_t nrows, char *dst, size_t stride)
{
	const size_t esz = kvt_dtype_size((uint32_t)dtype);
	const uint32_t hd8 = hd & ~7u;

	for (size_t r = 0; r < nrows; r++, dst += stride) {
		for (uint32_t h = 0; h < heads; h++, codes += hd, scales++) {
			char *hp = dst + (size_t)h * hd * esz;
			__m256 s = _mm256_set1_ps(*scales);
			uint32_t j;

			for (j = 0; j < hd8; j += 8)
				st8(dtype, hp + j * esz, _mm256_mul_ps(ld8_codes(codes + j), s));
			for (; j < hd; j++)
				st1(dtype, hp, j, (float)codes[j] * *scales);
		}
	}
}

static AVX2 void
quant_ch_avx2(int dtype, uint32_t elems, const char *src, size_t stride, size_t nrows,
	      int8_t *codes, float *scales)
{
	const size_t esz = kvt_dtype_size((uint32_t)dtype);
	const __m256i absm = _mm256_set1_epi32(0x7fffffff);
	uint32_t amax[CH_CHUNK] __attribute__((aligned(32)));
	float inv[CH_CHUNK] __attribute__((aligned(32)));
	uint32_t keep[CH_CHUNK] __attribute__((aligned(32)));
	uint8_t zero[CH_CHUNK];

	for (uint32_t c0 = 0; c0 < elems; c0 += CH_CHUNK) {
		uint32_t cn = elems - c0 < CH_CHUNK ? elems - c0 : CH_CHUNK, cn8 = cn & ~7u, c;

		memset(amax, 0, sizeof(amax));
		for (size_t r = 0; r < nrows; r++) {
			const char *rp = src + r * stride + (size_t)c0 * esz;

			for (c = 0; c < cn8; c += 8) {
				__m256i a = _mm256_and_si256(
				    _mm256_castps_si256(ld8(dtype, rp + c * esz)), absm);
				__m256i *pm = (__m256i *)&amax[c];

				_mm256_store_si256(pm, _mm256_max_epu32(_mm256_load_si256(pm), a));
			}
			for (; c < cn; c++) {
				uint32_t b = f2u(ld1(dtype, rp, c)) & 0x7fffffffu;

				amax[c] = b > amax[c] ? b : amax[c];
			}
		}
		for (c = 0; c < cn; c++) {
			zero[c] = (uint8_t)qparams(amax[c], &scales[c0 + c], &inv[c]);
			keep[c] = zero[c] ? 0 : 0xffffffffu;
		}
		for (size_t r = 0; r < nrows; r++) {
			const char *rp = src + r * stride + (size_t)c0 * esz;
			int8_t *q = codes + r * elems + c0;

			/* A zeroed channel may hold Inf/NaN, and NaN * 0 is NaN: mask the product
			 * to +0 instead, which codes to 0 like the scalar branch. */
			for (c = 0; c < cn8; c += 8) {
				__m256 v = _mm256_mul_ps(ld8(dtype, rp + c * esz),
							 _mm256_load_ps(&inv[c]));

				v = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_load_si256(
							 (const __m256i *)&keep[c])));
				st8_codes(q + c, v);
			}
			for (; c < cn; c++)
				q[c] = zero[c] ? 0 : qcode(ld1(dtype, rp, c), inv[c]);
		}
	}
}

static AVX2 void
dequant_ch_avx2(int dtype, uint32_t elems, const int8_t *codes, const float *scales, size_t nrows,
		char *dst, size_t stride)
{
	const size_t esz = kvt_dtype_size((uint32_t)dtype);
	const uint32_t e8 = elems & ~7u;

	for (size_t r = 0; r < nrows; r++, dst += stride, codes += elems) {
		uint32_t c;

		for (c = 0; c < e8; c += 8)
			st8(dtype, dst + c * esz,
			    _mm256_mul_ps(ld8_codes(codes + c), _mm256_loadu_ps(scales + c)));
		for (; c < elems; c++)
			st1(dtype, dst, c, (float)codes[c] * scales[c]);
	}
}

/*
 * 256-byte rows: 8 x 32-byte moves, prefetching the row PF_DIST indices ahead into L2 (the L2
 * tracks more outstanding misses than L1, which is what random rows are limited by). Large
 * gathers into a 32-byte aligned destination use streaming stores: the destination is a
 * staging region consumed by the device or another process, and skipping the read-for-
 * ownership of each destination line saves a third of the memory traffic.
 */
#define PF_DIST		16
#define GATHER_NT_BYTES (1u << 20)

static AVX2 void
gather256_avx2(char *dst, const char *base, size_t stride, const uint32_t *idx, size_t n)
{
	const int nt = n * 256 >= GATHER_NT_BYTES && !((uintptr_t)dst & 31);

	for (size_t i = 0; i < n; i++, dst += 256) {
		const char *s = base + (size_t)idx[i] * stride;
		__m256i v[8];

		if (i + PF_DIST < n) {
			const char *p = base + (size_t)idx[i + PF_DIST] * stride;

			_mm_prefetch(p, _MM_HINT_T1);
			_mm_prefetch(p + 64, _MM_HINT_T1);
			_mm_prefetch(p + 128, _MM_HINT_T1);
			_mm_prefetch(p + 192, _MM_HINT_T1);
		}
		for (int j = 0; j < 8; j++)
			v[j] = _mm256_loadu_si256((const __m256i *)(s + 32 * j));
		if (nt)
			for (int j = 0; j < 8; j++)
				_mm256_stream_si256((__m256i *)(dst + 32 * j), v[j]);
		else
			for (int j = 0; j < 8; j++)
				_mm256_storeu_si256((__m256i *)(dst + 32 * j), v[j]);
	}
	if (nt)
		_mm_sfence(); /* streaming stores are weakly ordered: publish before returning */
}

/* 8 at a time; the tail element by element */
static AVX2 void
to_f32_avx2(int dtype, const char *src, size_t n, float *dst)
{
	size_t es = kvt_dtype_size((uint32_t)dtype), i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, ld8(dtype, src + i * es));
	for (; i < n; i++)
		dst[i] = ld1(dtype, src, i);
}

#else
static int
avx2_ok(void)
{
	return 0;
}
#endif /* __x86_64__ */

/* ---- public entry points --------------------------------------------------------------- */

int
kvt_to_f32(int dtype, const void *src, size_t n, float *dst)
{
	if (dtype < 0 || dtype >= KVT_DTYPE__COUNT || (n && (!src || !dst)))
		return -EINVAL;
#if defined(__x86_64__)
	if (avx2_ok()) {
		to_f32_avx2(dtype, src, n, dst);
		return 0;
	}
#endif
	for (size_t i = 0; i < n; i++)
		dst[i] = ld1(dtype, src, i);
	return 0;
}

int
kvt_quant_rows(int dtype, uint32_t heads, uint32_t head_dim, const void *src, size_t src_stride,
	       size_t nrows, int8_t *codes, float *scales)
{
	int r = check_args(dtype, (size_t)heads * head_dim, nrows, src, codes, scales, src_stride);

	if (r < 0 || !head_dim)
		return r < 0 ? r : -EINVAL;
#if defined(__x86_64__)
	if (avx2_ok()) {
		quant_rows_avx2(dtype, heads, head_dim, src, src_stride, nrows, codes, scales);
		return 0;
	}
#endif
	quant_rows_scalar(dtype, heads, head_dim, src, src_stride, nrows, codes, scales);
	return 0;
}

int
kvt_dequant_rows(int dtype, uint32_t heads, uint32_t head_dim, const int8_t *codes,
		 const float *scales, size_t nrows, void *dst, size_t dst_stride)
{
	int r = check_args(dtype, (size_t)heads * head_dim, nrows, dst, codes, scales, dst_stride);

	if (r < 0 || !head_dim)
		return r < 0 ? r : -EINVAL;
#if defined(__x86_64__)
	if (avx2_ok()) {
		dequant_rows_avx2(dtype, heads, head_dim, codes, scales, nrows, dst, dst_stride);
		return 0;
	}
#endif
	dequant_rows_scalar(dtype, heads, head_dim, codes, scales, nrows, dst, dst_stride);
	return 0;
}

int
kvt_quant_block_ch(int dtype, uint32_t elems, const void *src, size_t src_stride, size_t nrows,
		   int8_t *codes, float *scales)
{
	int r = check_args(dtype, elems, nrows, src, codes, scales, src_stride);

	if (r < 0)
		return r;
#if defined(__x86_64__)
	if (avx2_ok()) {
		quant_ch_avx2(dtype, elems, src, src_stride, nrows, codes, scales);
		return 0;
	}
#endif
	quant_ch_scalar(dtype, elems, src, src_stride, nrows, codes, scales);
	return 0;
}

int
kvt_dequant_block_ch(int dtype, uint32_t elems, const int8_t *codes, const float *scales,
		     size_t nrows, void *dst, size_t dst_stride)
{
	int r = check_args(dtype, elems, nrows, dst, codes, scales, dst_stride);

	if (r < 0)
		return r;
#if defined(__x86_64__)
	if (avx2_ok()) {
		dequant_ch_avx2(dtype, elems, codes, scales, nrows, dst, dst_stride);
		return 0;
	}
#endif
	dequant_ch_scalar(dtype, elems, codes, scales, nrows, dst, dst_stride);
	return 0;
}

int
kvt_gather_rows(void *dst, const void *base, size_t stride, const uint32_t *idx, size_t n,
		size_t row_bytes)
{
	char *d = dst;
	const char *b = base;
	size_t i = 0;

	if (!row_bytes || stride < row_bytes || (n && (!dst || !base || !idx)))
		return -EINVAL;
		/* 256-byte rows go through the AVX2 mover even when runs are consecutive: per-row
		 * 32-byte moves with prefetch run at memcpy speed and keep the prefetch distance
		 * across runs. */
#if defined(__x86_64__)
	if (row_bytes == 256 && kvt_simd_level() >= KVT_SIMD_AVX2) {
		gather256_avx2(d, b, stride, idx, n);
		return 0;
	}
#endif
	while (i < n) {
		size_t run = 1;

		/* Consecutive rows of a dense array are one block. */
		if (stride == row_bytes)
			while (i + run < n && idx[i + run] == idx[i] + run)
				run++;
		memcpy(d, b + (size_t)idx[i] * stride, run * row_bytes);
		d += run * row_bytes;
		i += run;
	}
	return 0;
}
