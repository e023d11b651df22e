/* SPDX-License-Identifier: MIT */
/*
 * sketch.c - the int8 key sketch and the exact top-k it bounds (sketch.h).
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kvt_abi.h" /* KVT_DTYPE_* */
#include "quant.h"   /* kvt_f16_to_f32, kvt_bf16_to_f32 */
#include "simd.h"
#include "sketch.h"

#define SK_CHUNK 16 /* keys whose integer dot products are formed before their bounds are read */

size_t
kvt_sketch_page_bytes(unsigned int dim, unsigned int page_keys)
{
	return (size_t)page_keys * (dim + 2 * sizeof(float));
}

static inline uint8_t *
sk_codes(const struct kvt_sketch *sk, uint32_t p)
{
	return sk->pages[p];
}

static inline float *
sk_scale(const struct kvt_sketch *sk, uint32_t p)
{
	return (float *)((uint8_t *)sk->pages[p] + (size_t)sk->page_keys * sk->dim);
}

static inline float *
sk_tol(const struct kvt_sketch *sk, uint32_t p)
{
	return sk_scale(sk, p) + sk->page_keys;
}

int
kvt_sketch_init(struct kvt_sketch *sk, unsigned int dim, unsigned int page_keys,
		const struct kvt_paris_alloc *alloc)
{
	if (!dim || dim % 32 || dim > KVT_SRHT_MAX_DIM)
		return -EINVAL;
	if (!page_keys)
		page_keys = KVT_PARIS_PAGE_KEYS;
	if (page_keys < 64 || page_keys > (1u << 20) || (page_keys & (page_keys - 1)))
		return -EINVAL;
	if (alloc && (!alloc->page_get || !alloc->page_put))
		return -EINVAL;
	memset(sk, 0, sizeof(*sk));
	sk->dim = dim;
	sk->page_keys = page_keys;
	sk->page_shift = (uint32_t)__builtin_ctz(page_keys);
	sk->page_bytes = kvt_sketch_page_bytes(dim, page_keys);
	sk->alloc = alloc ? *alloc : kvt_paris_alloc_heap;
	return 0;
}

void
kvt_sketch_fini(struct kvt_sketch *sk)
{
	if (!sk)
		return;
	for (uint32_t p = 0; p < sk->npages; p++)
		sk->alloc.page_put(sk->alloc.ctx, sk->pages[p], sk->page_bytes);
	free(sk->pages);
	sk->pages = NULL;
	sk->npages = sk->max_pages = 0;
	sk->n = 0;
}

int
kvt_sketch_reserve(struct kvt_sketch *sk, uint32_t nkeys)
{
	uint32_t want;

	if (nkeys > (1u << 31))
		return -EOVERFLOW;
	want = (uint32_t)(((uint64_t)nkeys + sk->page_keys - 1) >> sk->page_shift);
	if (want > sk->max_pages) {
		uint32_t m = sk->max_pages ? sk->max_pages : 4;
		void **np;

		while (m < want)
			m *= 2;
		np = realloc(sk->pages, m * sizeof(*np));
		if (!np)
			return -ENOMEM;
		sk->pages = np;
		sk->max_pages = m;
	}
	while (sk->npages < want) {
		void *pg = sk->alloc.page_get(sk->alloc.ctx, sk->page_bytes);

		if (!pg)
			return -ENOMEM;
		/* a search reads whole chunks: keys past n stay defined (and skipped) */
		memset(pg, 0, sk->page_bytes);
		sk->pages[sk->npages++] = pg;
	}
	return (int)((uint64_t)sk->npages << sk->page_shift > (1u << 31)
			 ? (1u << 31)
			 : (uint64_t)sk->npages << sk->page_shift);
}

/* The query's integer range: |x^_j| <= 127 * 128, so x^ = 128 h + l with h and l signed bytes
 * (the VNNI kernel's two digits). */
#define SK_QMAX 16256
/* An upper bound of |x - s_x x^| per element for a unit query x (sketch.h): half a step of a
 * scale of at most (1 + 2^-20) / SK_QMAX, widened for the division's rounding. */
#define SK_QSTEP 3.2e-5

/*
 * Encoding one key: codes c_j = round(v_j * 127 / m) clamped to [-127, 127] (f32, ties to
 * even), m = max_j |v_j|; the residual r^2 = sum_j (v_j - s c_j)^2 and b^2 = sum_j (s c_j)^2 in
 * double (no underflow for any f32 key), element j into lane j mod 16, fused multiply-adds,
 * the 16 lanes summed in order. Every level runs exactly these operations, so a key encodes to
 * the same bytes at every level (check_sketch).
 */
#define SK_LANES 16

/* The tolerance from the two sums (sketch.h), rounded up to f32. */
static float
tolerance(const double *r2, const double *b2, unsigned int dim)
{
	const double u = 0x1p-24, slack = 1.0 + 0x1p-20;
	const double gamma = dim * u / (1.0 - dim * u);
	double rs = 0.0, bs = 0.0, r, b, t;
	float tf;

	for (int l = 0; l < SK_LANES; l++) {
		rs += r2[l];
		bs += b2[l];
	}
	r = sqrt(rs);
	b = sqrt(bs);
	t = (slack * r + SK_QSTEP * sqrt((double)dim) * b + (gamma + 8.0 * u) * (b + r)) * slack;
	tf = (float)t;
	if ((double)tf < t)
		tf = nextafterf(tf, INFINITY);
	return tf;
}

/* A key the codes cannot describe: non-finite (always read), or too small for a finite step
 * (codes 0, scale 0: the whole key is residual). */
static void
encode_zero(const float *v, unsigned int dim, bool finite, uint8_t *code, float *ret_scale,
	    float *ret_tol)
{
	double r2[SK_LANES] = {0}, b2[SK_LANES] = {0};

	memset(code, 128, dim);
	*ret_scale = 0.0f;
	if (!finite) {
		*ret_tol = INFINITY;
		return;
	}
	for (unsigned int j = 0; j < dim; j++)
		r2[j % SK_LANES] = fma((double)v[j], (double)v[j], r2[j % SK_LANES]);
	*ret_tol = tolerance(r2, b2, dim);
}

/* The scale and its inverse for max |v| = @m, or false when the key takes encode_zero(). */
static bool
scale_of(float m, float *ret_s, float *ret_inv)
{
	*ret_s = m / 127.0f;
	*ret_inv = 127.0f / m;
	return *ret_s > 0.0f && *ret_inv < INFINITY;
}

static void
encode_scalar(const float *v, unsigned int dim, uint8_t *code, float *ret_scale, float *ret_tol)
{
	double r2[SK_LANES] = {0}, b2[SK_LANES] = {0};
	float m = 0.0f, s, inv;

	for (unsigned int j = 0; j < dim; j++) {
		if (!isfinite(v[j])) {
			encode_zero(v, dim, false, code, ret_scale, ret_tol);
			return;
		}
		m = fmaxf(m, fabsf(v[j]));
	}
	if (!scale_of(m, &s, &inv)) {
		encode_zero(v, dim, true, code, ret_scale, ret_tol);
		return;
	}
	for (unsigned int j = 0; j < dim; j++) {
		float c = fminf(fmaxf(nearbyintf(v[j] * inv), -127.0f), 127.0f);
		double sc = (double)s * (double)c, d = (double)v[j] - sc;

		code[j] = (uint8_t)((int)c + 128); /* stored offset: 1 .. 255 */
		r2[j % SK_LANES] = fma(d, d, r2[j % SK_LANES]);
		b2[j % SK_LANES] = fma(sc, sc, b2[j % SK_LANES]);
	}
	*ret_scale = s;
	*ret_tol = tolerance(r2, b2, dim);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void
encode_avx2(const float *v, unsigned int dim, uint8_t *code, float *ret_scale, float *ret_tol)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256 vmax = _mm256_setzero_ps(), vnan = _mm256_setzero_ps(), vinv, lo, hi;
	__m256d r2[4], b2[4], vs;
	double r2l[SK_LANES], b2l[SK_LANES];
	float mm[8], nn[8], m = 0.0f, nan = 0.0f, s, inv;

	for (unsigned int j = 0; j < dim; j += 8) {
		__m256 x = _mm256_loadu_ps(v + j);

		vmax = _mm256_max_ps(vmax, _mm256_and_ps(x, absmask));
		vnan = _mm256_add_ps(vnan, _mm256_sub_ps(x, x)); /* NaN once any is inf or NaN */
	}
	_mm256_storeu_ps(mm, vmax);
	_mm256_storeu_ps(nn, vnan);
	for (int l = 0; l < 8; l++) {
		m = fmaxf(m, mm[l]);
		nan += nn[l];
	}
	if (nan != 0.0f) {
		encode_zero(v, dim, false, code, ret_scale, ret_tol);
		return;
	}
	if (!scale_of(m, &s, &inv)) {
		encode_zero(v, dim, true, code, ret_scale, ret_tol);
		return;
	}
	vinv = _mm256_set1_ps(inv);
	lo = _mm256_set1_ps(-127.0f);
	hi = _mm256_set1_ps(127.0f);
	vs = _mm256_set1_pd((double)s);
	for (int l = 0; l < 4; l++)
		r2[l] = b2[l] = _mm256_setzero_pd();
	for (unsigned int j = 0; j < dim; j += 16) {
		for (int h = 0; h < 2;
		     h++) { /* elements j + 8h .. j + 8h + 7: lanes 8h .. 8h + 7 */
			__m256 x = _mm256_loadu_ps(v + j + 8 * h);
			__m256 c =
			    _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_mul_ps(x, vinv),
									_MM_FROUND_TO_NEAREST_INT |
									    _MM_FROUND_NO_EXC),
							lo),
					  hi);
			__m256i ci =
			    _mm256_add_epi32(_mm256_cvtps_epi32(c), _mm256_set1_epi32(128));
			int32_t cb[8];

			_mm256_storeu_si256((__m256i *)cb, ci);
			for (int l = 0; l < 8; l++)
				code[j + 8 * h + l] = (uint8_t)cb[l];
			for (int q = 0; q < 2; q++) {
				__m128 xq =
				    q ? _mm256_extractf128_ps(x, 1) : _mm256_castps256_ps128(x);
				__m128 cq =
				    q ? _mm256_extractf128_ps(c, 1) : _mm256_castps256_ps128(c);
				__m256d sc = _mm256_mul_pd(vs, _mm256_cvtps_pd(cq));
				__m256d d = _mm256_sub_pd(_mm256_cvtps_pd(xq), sc);

				r2[2 * h + q] = _mm256_fmadd_pd(d, d, r2[2 * h + q]);
				b2[2 * h + q] = _mm256_fmadd_pd(sc, sc, b2[2 * h + q]);
			}
		}
	}
	for (int l = 0; l < 4; l++) {
		_mm256_storeu_pd(r2l + 4 * l, r2[l]);
		_mm256_storeu_pd(b2l + 4 * l, b2[l]);
	}
	*ret_scale = s;
	*ret_tol = tolerance(r2l, b2l, dim);
}

__attribute__((target("avx512f"))) static void
encode_avx512(const float *v, unsigned int dim, uint8_t *code, float *ret_scale, float *ret_tol)
{
	__m512 vmax = _mm512_setzero_ps(), vnan = _mm512_setzero_ps(), vinv, lo, hi;
	__m512d r2[2], b2[2], vs;
	double r2l[SK_LANES], b2l[SK_LANES];
	float mm[16], nn[16], m = 0.0f, nan = 0.0f, s, inv;

	for (unsigned int j = 0; j < dim; j += 16) {
		__m512 x = _mm512_loadu_ps(v + j);

		vmax = _mm512_max_ps(vmax, _mm512_abs_ps(x));
		vnan = _mm512_add_ps(vnan, _mm512_sub_ps(x, x)); /* NaN once any is inf or NaN */
	}
	_mm512_storeu_ps(mm, vmax);
	_mm512_storeu_ps(nn, vnan);
	for (int l = 0; l < 16; l++) {
		m = fmaxf(m, mm[l]);
		nan += nn[l];
	}
	if (nan != 0.0f) {
		encode_zero(v, dim, false, code, ret_scale, ret_tol);
		return;
	}
	if (!scale_of(m, &s, &inv)) {
		encode_zero(v, dim, true, code, ret_scale, ret_tol);
		return;
	}
	vinv = _mm512_set1_ps(inv);
	lo = _mm512_set1_ps(-127.0f);
	hi = _mm512_set1_ps(127.0f);
	vs = _mm512_set1_pd((double)s);
	r2[0] = r2[1] = b2[0] = b2[1] = _mm512_setzero_pd();
	for (unsigned int j = 0; j < dim; j += 16) {
		__m512 x = _mm512_loadu_ps(v + j);
		__m512 c =
		    _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(x, vinv),
								     _MM_FROUND_TO_NEAREST_INT |
									 _MM_FROUND_NO_EXC),
						lo),
				  hi);

		_mm_storeu_si128((__m128i *)(code + j),
				 _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(c),
								       _mm512_set1_epi32(128))));
		for (int q = 0; q < 2; q++) {
			__m256 xq =
			    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), q));
			__m256 cq =
			    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(c), q));
			__m512d sc = _mm512_mul_pd(vs, _mm512_cvtps_pd(cq));
			__m512d d = _mm512_sub_pd(_mm512_cvtps_pd(xq), sc);

			r2[q] = _mm512_fmadd_pd(d, d, r2[q]);
			b2[q] = _mm512_fmadd_pd(sc, sc, b2[q]);
		}
	}
	for (int q = 0; q < 2; q++) {
		_mm512_storeu_pd(r2l + 8 * q, r2[q]);
		_mm512_storeu_pd(b2l + 8 * q, b2[q]);
	}
	*ret_scale = s;
	*ret_tol = tolerance(r2l, b2l, dim);
}
#endif

/* Codes, scale and tolerance of one key of @dim f32 values (sketch.h gives the bound). */
static void
encode(const float *v, unsigned int dim, uint8_t *code, float *ret_scale, float *ret_tol)
{
#if defined(__x86_64__)
	switch (kvt_simd_level()) {
	case KVT_SIMD_AVX512:
		encode_avx512(v, dim, code, ret_scale, ret_tol);
		return;
	case KVT_SIMD_AVX2:
		encode_avx2(v, dim, code, ret_scale, ret_tol);
		return;
	default:
		break;
	}
#endif
	encode_scalar(v, dim, code, ret_scale, ret_tol);
}

static void
row_to_f32(const void *row, unsigned int dtype, unsigned int dim, float *ret)
{
	const uint16_t *h = row;

	switch (dtype) {
	case KVT_DTYPE_F16:
		for (unsigned int j = 0; j < dim; j++)
			ret[j] = kvt_f16_to_f32(h[j]);
		break;
	case KVT_DTYPE_BF16:
		for (unsigned int j = 0; j < dim; j++)
			ret[j] = kvt_bf16_to_f32(h[j]);
		break;
	default:
		memcpy(ret, row, dim * sizeof(*ret));
		break;
	}
}

int
kvt_sketch_append(struct kvt_sketch *sk, const void *rows, size_t stride, unsigned int dtype,
		  uint32_t count)
{
	float v[KVT_SRHT_MAX_DIM];

	if (dtype != KVT_DTYPE_F16 && dtype != KVT_DTYPE_BF16 && dtype != KVT_DTYPE_F32)
		return -EINVAL;
	if ((uint64_t)sk->n + count > (uint64_t)sk->npages << sk->page_shift)
		return -ENOSPC;
	for (uint32_t i = 0; i < count; i++) {
		uint32_t at = sk->n + i, p = at >> sk->page_shift, off = at & (sk->page_keys - 1);

		row_to_f32((const uint8_t *)rows + i * stride, dtype, sk->dim, v);
		encode(v, sk->dim, sk_codes(sk, p) + (size_t)off * sk->dim, &sk_scale(sk, p)[off],
		       &sk_tol(sk, p)[off]);
	}
	sk->n += count;
	return (int)sk->n;
}

int
kvt_sketch_set(struct kvt_sketch *sk, uint32_t i, const float *key)
{
	uint32_t p = i >> sk->page_shift, off = i & (sk->page_keys - 1);

	if (i >= sk->n)
		return -ERANGE;
	encode(key, sk->dim, sk_codes(sk, p) + (size_t)off * sk->dim, &sk_scale(sk, p)[off],
	       &sk_tol(sk, p)[off]);
	return 0;
}

/* ---- the bound of every key of a chunk: integer dot products, exact at every level ----------- */

/*
 * The query in integers: x^ (|x^_j| <= SK_QMAX) of scale sx, its digits h and l (x^ = 128 h + l,
 * l in [-64, 63]) and 128 sum_j x^_j, which the offset codes c + 128 add to every product.
 */
struct sk_query {
	int16_t xq[KVT_SRHT_MAX_DIM] __attribute__((aligned(64)));
	int8_t h[KVT_SRHT_MAX_DIM] __attribute__((aligned(64)));
	int8_t l[KVT_SRHT_MAX_DIM] __attribute__((aligned(64)));
	int32_t bias; /* 128 sum_j x^_j */
	float sx;
};

static void
sk_query_prep(const float *x, unsigned int dim, struct sk_query *ret)
{
	float xm = 0.0f;

	ret->bias = 0;
	for (unsigned int j = 0; j < dim; j++)
		xm = fmaxf(xm, fabsf(x[j]));
	ret->sx = xm / (float)SK_QMAX;
	for (unsigned int j = 0; j < dim; j++) {
		long v = ret->sx > 0.0f ? lrintf(x[j] / ret->sx) : 0;
		int32_t lo;

		v = v > SK_QMAX ? SK_QMAX : v < -SK_QMAX ? -SK_QMAX : v;
		ret->xq[j] = (int16_t)v;
		lo = (int32_t)(((v + 64) & 127) - 64);
		ret->l[j] = (int8_t)lo;
		ret->h[j] = (int8_t)((v - lo) / 128);
		ret->bias += 128 * (int32_t)v;
	}
}

/*
 * For @cnt keys (codes [cnt][dim], scales, tolerances) and the prepared query:
 * ub[i] = (sx * scale[i]) * (float)<x^, code_i> + tol[i], the most key i can score. Returns the
 * mask of the keys whose ub reaches @bar. The dot products are exact integers; the f32
 * arithmetic after them is the same at every level.
 */
static uint32_t
chunk_scalar(const uint8_t *codes, unsigned int dim, const struct sk_query *xq, const float *scale,
	     const float *tol, uint32_t cnt, float bar, float *ub)
{
	uint32_t mask = 0;

	for (uint32_t i = 0; i < cnt; i++) {
		const uint8_t *c = codes + (size_t)i * dim;
		int32_t acc = 0;
		float e;

		for (unsigned int j = 0; j < dim; j++)
			acc += ((int32_t)c[j] - 128) * xq->xq[j];
		e = (xq->sx * scale[i]) * (float)acc;
		ub[i] = e + tol[i];
		mask |= (uint32_t)(ub[i] >= bar) << i;
	}
	return mask;
}

#if defined(__x86_64__)
/* 8 keys at a time: per key 16-lane products, then three hadds and a lane swap for 8 sums. */
__attribute__((target("avx2"))) static uint32_t
chunk_avx2(const uint8_t *codes, unsigned int dim, const struct sk_query *xq, const float *scale,
	   const float *tol, uint32_t cnt, float bar, float *ub)
{
	const __m256i off = _mm256_set1_epi16(128);
	uint32_t mask = 0, i = 0;

	for (; i + 8 <= cnt; i += 8) {
		__m256i acc[8], h01, h23, h45, h67, lo, hi, sum;
		__m256 e, u;

		for (int r = 0; r < 8; r++) {
			const uint8_t *c = codes + (size_t)(i + r) * dim;

			acc[r] = _mm256_setzero_si256();
			for (unsigned int j = 0; j < dim; j += 16) {
				__m256i cw = _mm256_sub_epi16(
				    _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(c + j))),
				    off);
				__m256i xw = _mm256_load_si256((const __m256i *)(xq->xq + j));

				acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(cw, xw));
			}
		}
		h01 = _mm256_hadd_epi32(acc[0], acc[1]);
		h23 = _mm256_hadd_epi32(acc[2], acc[3]);
		h45 = _mm256_hadd_epi32(acc[4], acc[5]);
		h67 = _mm256_hadd_epi32(acc[6], acc[7]);
		lo = _mm256_hadd_epi32(h01, h23); /* keys 0-3, per 128-bit half */
		hi = _mm256_hadd_epi32(h45, h67); /* keys 4-7 */
		sum = _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
				       _mm256_permute2x128_si256(lo, hi, 0x31));
		e = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(xq->sx), _mm256_loadu_ps(scale + i)),
				  _mm256_cvtepi32_ps(sum));
		u = _mm256_add_ps(e, _mm256_loadu_ps(tol + i));
		_mm256_storeu_ps(ub + i, u);
		mask |=
		    (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(u, _mm256_set1_ps(bar), _CMP_GE_OQ))
		    << i;
	}
	if (i < cnt)
		mask |= chunk_scalar(codes + (size_t)i * dim, dim, xq, scale + i, tol + i, cnt - i,
				     bar, ub + i)
			<< i;
	return mask;
}

/*
 * 16 keys, AVX-512 VNNI: per 64 dims one load of the offset codes and two u8 x s8 dot products
 * (vpdpbusd), one per query digit; then a transpose-and-add tree for 16 sums.
 */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static uint32_t
chunk_vnni(const uint8_t *codes, unsigned int dim, const struct sk_query *xq, const float *scale,
	   const float *tol, uint32_t cnt, float bar, float *ub)
{
	__m512i acc[16], g[4], h0, h1, sum;
	__m512 e, u;

	if (cnt < 16)
		return chunk_scalar(codes, dim, xq, scale, tol, cnt, bar, ub);
	for (int r = 0; r < 16; r++) {
		const uint8_t *c = codes + (size_t)r * dim;
		__m512i ah = _mm512_setzero_si512(), al = _mm512_setzero_si512();

		for (unsigned int j = 0; j < dim; j += 64) {
			__m512i cv = _mm512_loadu_si512(c + j);

			ah = _mm512_dpbusd_epi32(ah, cv, _mm512_load_si512(xq->h + j));
			al = _mm512_dpbusd_epi32(al, cv, _mm512_load_si512(xq->l + j));
		}
		acc[r] = _mm512_add_epi32(_mm512_slli_epi32(ah, 7), al);
	}
	for (int q = 0; q < 4; q++) { /* per 128-bit lane: the partial sums of keys 4q .. 4q+3 */
		__m512i *a = acc + 4 * q;
		__m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]),
					       _mm512_unpackhi_epi32(a[0], a[1]));
		__m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]),
					       _mm512_unpackhi_epi32(a[2], a[3]));

		g[q] = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23),
					_mm512_unpackhi_epi64(s01, s23));
	}
	h0 = _mm512_add_epi32(_mm512_shuffle_i32x4(g[0], g[1], _MM_SHUFFLE(1, 0, 1, 0)),
			      _mm512_shuffle_i32x4(g[0], g[1], _MM_SHUFFLE(3, 2, 3, 2)));
	h1 = _mm512_add_epi32(_mm512_shuffle_i32x4(g[2], g[3], _MM_SHUFFLE(1, 0, 1, 0)),
			      _mm512_shuffle_i32x4(g[2], g[3], _MM_SHUFFLE(3, 2, 3, 2)));
	sum = _mm512_add_epi32(_mm512_shuffle_i32x4(h0, h1, _MM_SHUFFLE(2, 0, 2, 0)),
			       _mm512_shuffle_i32x4(h0, h1, _MM_SHUFFLE(3, 1, 3, 1)));
	sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(xq->bias));
	e = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(xq->sx), _mm512_loadu_ps(scale)),
			  _mm512_cvtepi32_ps(sum));
	u = _mm512_add_ps(e, _mm512_loadu_ps(tol));
	_mm512_storeu_ps(ub, u);
	return _mm512_cmp_ps_mask(u, _mm512_set1_ps(bar), _CMP_GE_OQ);
}

static bool
has_vnni(void)
{
	static _Atomic int v = -1; /* every thread computes the same value */
	int x = atomic_load_explicit(&v, memory_order_relaxed);

	if (x < 0) {
		__builtin_cpu_init();
		x = __builtin_cpu_supports("avx512vnni") ? 1 : 0;
		atomic_store_explicit(&v, x, memory_order_relaxed);
	}
	return x;
}
#endif

typedef uint32_t (*chunk_fn)(const uint8_t *codes, unsigned int dim, const struct sk_query *xq,
			     const float *scale, const float *tol, uint32_t cnt, float bar,
			     float *ub);

/* The VNNI kernel where the CPU has it (and dim is a multiple of 64), else AVX2, else scalar:
 * chosen once per search. */
static chunk_fn
chunk_kernel(unsigned int dim)
{
#if defined(__x86_64__)
	enum kvt_simd level = kvt_simd_level();

	if (level == KVT_SIMD_AVX512 && dim % 64 == 0 && has_vnni())
		return chunk_vnni;
	if (level >= KVT_SIMD_AVX2)
		return chunk_avx2;
#endif
	(void)dim;
	return chunk_scalar;
}

/* ---- the search ------------------------------------------------------------------------------ */

/* The exact score of key @i as kvt_simd_dot_rows() forms it (through rows, else get). */
static int
exact_one(const struct kvt_paris_keys *keys, const float *x, unsigned int dim, uint32_t i,
	  float *tmp, float *ret)
{
	uint32_t run = 0;
	const void *row = keys->rows ? keys->rows(keys->ctx, i, &run) : NULL;

	if (row) {
		kvt_simd_dot_rows(row, keys->stride, 1, keys->dtype, x, dim, ret);
		return 0;
	}
	row = keys->get(keys->ctx, i, tmp);
	if (!row)
		return -EIO;
	kvt_simd_dot_rows(row, 0, 1, KVT_DTYPE_F32, x, dim, ret);
	return 0;
}

/* Min-heap of the k largest values pushed: its root is a bar that k keys reach. */
static void
bar_push(float *h, uint32_t *hn, uint32_t k, float d)
{
	uint32_t at;

	if (*hn < k) {
		at = (*hn)++;
		while (at && h[(at - 1) / 2] > d) {
			h[at] = h[(at - 1) / 2];
			at = (at - 1) / 2;
		}
		h[at] = d;
		return;
	}
	if (!(d > h[0])) /* NaN never raises the bar */
		return;
	at = 0;
	for (;;) {
		uint32_t l = 2 * at + 1, m = at;

		if (l < k && h[l] < d)
			m = l;
		if (l + 1 < k && h[l + 1] < (m == at ? d : h[l]))
			m = l + 1;
		if (m == at)
			break;
		h[at] = h[m];
		at = m;
	}
	h[at] = d;
}

static int
grow(uint32_t **idx, float **score, size_t *cap, size_t need)
{
	size_t c = *cap ? *cap : 1024;
	uint32_t *ni;
	float *ns;

	if (need <= *cap)
		return 0;
	while (c < need)
		c *= 2;
	ni = realloc(*idx, c * sizeof(*ni));
	if (!ni)
		return -ENOMEM;
	*idx = ni;
	ns = realloc(*score, c * sizeof(*ns));
	if (!ns)
		return -ENOMEM;
	*score = ns;
	*cap = c;
	return 0;
}

/* Key @key's exact score into the rescored list and the exact bar. */
static int
rescore(const struct kvt_paris_keys *keys, const float *x, unsigned int dim, uint32_t key,
	struct kvt_paris_scratch *scr, uint32_t *nr, uint32_t *hn, uint32_t k)
{
	float d;
	int r = exact_one(keys, x, dim, key, scr->key_tmp, &d);

	if (r < 0)
		return r;
	r = grow(&scr->sk_idx, &scr->sk_score, &scr->sk_cap, *nr + 1);
	if (r < 0)
		return r;
	scr->sk_idx[*nr] = key;
	scr->sk_score[(*nr)++] = d;
	if (d == d) /* a NaN ranks last: it never sets the bar */
		bar_push(scr->sk_bar, hn, k, d);
	return 0;
}

/*
 * Three steps, none of which reads a row it could do without:
 *  1. the codes of every live key give an interval [e - t, e + t] around its exact score; the
 *     k-th largest lower end L so far is a bar k keys reach, so a key whose upper end stays
 *     under the final L is out. The keys above the running L are listed (with their upper
 *     ends), which is a superset of those above the final one.
 *  2. the k listed keys with the highest upper ends are rescored: the k-th of their exact
 *     scores is a bar T >= L.
 *  3. the other listed keys whose upper end reaches T are rescored in index order (T rising
 *     as they come), and the top k of all the rescored is the answer.
 */
int
kvt_sketch_topk(const struct kvt_sketch *sk, const struct kvt_paris_index *ix,
		const struct kvt_paris_query *q, uint32_t k, const struct kvt_paris_keys *keys,
		const struct kvt_paris_drop *drop, struct kvt_paris_scratch *scr, uint32_t *ret_idx,
		float *ret_score, uint32_t *ret_read)
{
	const unsigned int dim = sk->dim;
	const chunk_fn chunk = chunk_kernel(sk->dim);
	struct sk_query xq;
	float ub[SK_CHUNK];
	float bar = -INFINITY;
	uint32_t ns = 0, nr = 0, hn = 0, nsel;
	int r;

	if (sk->n != ix->n || q->dim != dim || ix->dim != dim || !k || !keys || !keys->get)
		return -EINVAL;
	r = grow(&scr->cand, &scr->score, &scr->cand_cap, k);
	if (r >= 0)
		r = grow(&scr->ref_idx, &scr->ref_score, &scr->ref_cap, 4 * (size_t)k);
	if (r >= 0 && scr->sk_bar_cap < k) {
		float *b = realloc(scr->sk_bar, k * sizeof(*b));

		if (!b)
			return -ENOMEM;
		scr->sk_bar = b;
		scr->sk_bar_cap = k;
	}
	if (r < 0)
		return r;

	sk_query_prep(q->x, dim, &xq);

	/* 1: every key's bound; list those above the running bar of lower ends */
	for (uint32_t p = 0; p < sk->npages && ((uint64_t)p << sk->page_shift) < sk->n; p++) {
		const uint32_t base = p << sk->page_shift;
		const uint32_t cnt = sk->n - base < sk->page_keys ? sk->n - base : sk->page_keys;
		const uint8_t *codes = sk_codes(sk, p);
		const float *scale = sk_scale(sk, p), *tol = sk_tol(sk, p);

		for (uint32_t off = 0; off < cnt; off += SK_CHUNK) {
			uint32_t m = cnt - off < SK_CHUNK ? cnt - off : SK_CHUNK;
			uint32_t pass = chunk(codes + (size_t)off * dim, dim, &xq, scale + off,
					      tol + off, m, bar, ub);

			for (; pass; pass &= pass - 1) {
				uint32_t i = (uint32_t)__builtin_ctz(pass), key = base + off + i;
				float lb;

				if (!(ub[i] >= bar)) /* the bar rose inside this chunk */
					continue;
				if (ix->ndead && (ix->dead[key / 64] >> (key % 64) & 1))
					continue;
				if (drop && drop->dropped(drop->ctx, key))
					continue;
				r = grow(&scr->ref_idx, &scr->ref_score, &scr->ref_cap, ns + 1);
				if (r < 0)
					return r;
				scr->ref_idx[ns] = key;
				scr->ref_score[ns++] = ub[i];
				/* the lower end; an infinite tolerance gives NaN: no bar */
				lb = ub[i] - 2.0f * tol[off + i];
				if (lb == lb)
					bar_push(scr->sk_bar, &hn, k, lb);
				if (hn == k)
					bar = scr->sk_bar[0];
			}
		}
	}
	{ /* the listed keys above the final bar */
		uint32_t w = 0;

		for (uint32_t i = 0; i < ns; i++)
			if (scr->ref_score[i] >= bar) {
				scr->ref_idx[w] = scr->ref_idx[i];
				scr->ref_score[w++] = scr->ref_score[i];
			}
		ns = w;
	}

	/* 2: the k highest upper ends, exactly (their list positions, then marked done) */
	nsel = k < ns ? k : ns;
	hn = 0;
	bar = -INFINITY;
	if (nsel) {
		kvt_paris_topk_select(NULL, scr->ref_score, ns, nsel, scr->cand, scr->score);
		for (uint32_t i = 0; i < nsel; i++) {
			r = rescore(keys, q->x, dim, scr->ref_idx[scr->cand[i]], scr, &nr, &hn, k);
			if (r < 0)
				return r;
		}
		for (uint32_t i = 0; i < nsel; i++)
			scr->ref_score[scr->cand[i]] = -INFINITY;
		if (hn == k)
			bar = scr->sk_bar[0];
	}

	/* 3: the rest that can still reach the k-th exact score */
	for (uint32_t i = 0; i < ns; i++) {
		if (!(scr->ref_score[i] >= bar) || scr->ref_score[i] == -INFINITY)
			continue;
		r = rescore(keys, q->x, dim, scr->ref_idx[i], scr, &nr, &hn, k);
		if (r < 0)
			return r;
		if (hn == k)
			bar = scr->sk_bar[0];
	}
	if (ret_read)
		*ret_read = nr;
	if (k > nr)
		k = nr;
	if (k)
		kvt_paris_topk_select(scr->sk_idx, scr->sk_score, nr, k, ret_idx, ret_score);
	return (int)k;
}
