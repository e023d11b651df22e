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
#include "select.h"  /* kvt_score_key */
#include "simd.h"
#include "sketch.h"

#define SK_CHUNK 16 /* keys whose integer dot products are formed before their bounds are read */
/* The 2-bit level: one byte per 4 dims (4 sign bits, then 4 magnitude bits) */
#define SB_DIMS	       4
#define SB_BLOCKS(dim) ((dim) / SB_DIMS)
#define SB_MAX_BLOCKS  (KVT_SRHT_MAX_DIM / SB_DIMS)
#define SB_TAB_MAX     31 /* |table entry|: four sum in an int8 */

size_t
kvt_sketch_int8_bytes(unsigned int dim, unsigned int page_keys)
{
	return (size_t)page_keys * (dim + 2 * sizeof(float));
}

#define SB_GROUP	    64
#define SK_GROUP_BYTES(dim) ((size_t)(dim) + 2 * sizeof(float))

/*
 * Keys a group-level summary covers: 64 at D = 128, 16 at D = 64. Real head_dim-64 keys cluster
 * in shorter runs, so shorter groups hold more of the top k there; at D = 128 four times the
 * summaries would cost more to score than the 2-bit scan they save (the measurements:
 * docs/retrieval.md, "Probing"). A power of two dividing SB_GROUP and every page.
 */
static inline uint32_t
sk_gkeys(unsigned int dim)
{
	return dim == 64 ? 16 : 64;
}

#define SK_GROUPS(dim, page_keys) ((page_keys) / sk_gkeys(dim))

/* rounded up to a cache line: pages come from aligned_alloc(64, ...) by default, which wants a
 * multiple of the alignment (the group level alone is D + 8 bytes a group) */
size_t
kvt_sketch_page_bytes(unsigned int dim, unsigned int page_keys)
{
	size_t b = kvt_sketch_int8_bytes(dim, page_keys) +
		   (size_t)page_keys * (SB_BLOCKS(dim) + sizeof(float)) + dim * sizeof(float) +
		   SK_GROUPS(dim, page_keys) * SK_GROUP_BYTES(dim);

	return (b + 63) & ~(size_t)63;
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

/* the 2-bit level: codes [D/4][P], f [P], the centre [D] */
static inline uint8_t *
sk_bits(const struct kvt_sketch *sk, uint32_t p)
{
	return (uint8_t *)(sk_tol(sk, p) + sk->page_keys);
}

static inline float *
sk_fac(const struct kvt_sketch *sk, uint32_t p)
{
	return (float *)(sk_bits(sk, p) + (size_t)sk->page_keys * SB_BLOCKS(sk->dim));
}

static inline float *
sk_centre(const struct kvt_sketch *sk, uint32_t p)
{
	return sk_fac(sk, p) + sk->page_keys;
}

/* the group level: per group the int8 codes [G][D], scale [G] and flag [G] of its mean */
static inline uint8_t *
sk_gcodes(const struct kvt_sketch *sk, uint32_t p)
{
	return (uint8_t *)(sk_centre(sk, p) + sk->dim);
}

static inline float *
sk_gscale(const struct kvt_sketch *sk, uint32_t p)
{
	return (float *)(sk_gcodes(sk, p) + (size_t)SK_GROUPS(sk->dim, sk->page_keys) * sk->dim);
}

static inline float *
sk_gflag(const struct kvt_sketch *sk, uint32_t p)
{
	return sk_gscale(sk, p) + SK_GROUPS(sk->dim, sk->page_keys);
}

int
kvt_sketch_init(struct kvt_sketch *sk, unsigned int dim, unsigned int page_keys,
		const struct kvt_paris_alloc *alloc)
{
	struct kvt_paris_alloc a;
	uint32_t pk, shift;

	if (dim != 64 && dim != 128)
		return -EINVAL;
	if (kvt_paris_pages_setup(page_keys, alloc, &pk, &shift, &a) < 0)
		return -EINVAL;
	memset(sk, 0, sizeof(*sk));
	sk->dim = dim;
	sk->page_keys = pk;
	sk->page_shift = shift;
	sk->page_bytes = kvt_sketch_page_bytes(dim, pk);
	sk->alloc = a;
	return kvt_srht_init(&sk->rot, dim, KVT_SRHT_SEED);
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
	memset(&sk->gacc, 0, sizeof(sk->gacc));
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

/* ---- the 2-bit level ------------------------------------------------------------------------- */

static bool
finite_key(const float *v, unsigned int dim)
{
	for (unsigned int j = 0; j < dim; j++)
		if (!isfinite(v[j]))
			return false;
	return true;
}

/* Lane sums of |y| and y^2 (lane l: dims l, l + 8, ..., added in that order), then the large
 * dims' |y| and the code bytes for threshold h: the scalar form of what the AVX2 pair does with
 * one register per sum, to the same bits. */
static void
sign_sums_scalar(const float *y, unsigned int dim, float *s1, float *s2)
{
	for (unsigned int j = 0; j < dim; j += 8)
		for (unsigned int l = 0; l < 8; l++) {
			s1[l] += fabsf(y[j + l]);
			s2[l] += y[j + l] * y[j + l];
		}
}

static void
sign_bytes_scalar(const float *y, unsigned int dim, float h, float *sl, uint8_t *bits,
		  size_t stride)
{
	for (unsigned int j = 0; j < dim; j += 8)
		for (unsigned int l = 0; l < 8; l++) {
			float a = fabsf(y[j + l]);

			/* not a ?: select, which compiled to a branch mispredicted half the time */
			sl[l] += a * (float)(a > h);
		}
	for (unsigned int b = 0; b < SB_BLOCKS(dim); b++) {
		const float *yb = y + SB_DIMS * b;
		unsigned int byte = 0;

		for (unsigned int j = 0; j < SB_DIMS; j++)
			byte |= (unsigned int)(yb[j] >= 0.0f) << j |
				(unsigned int)(fabsf(yb[j]) > h) << (4 + j);
		bits[b * stride] = (uint8_t)byte;
	}
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static void
sign_sums_avx2(const float *y, unsigned int dim, float *s1, float *s2)
{
	const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256 a1 = _mm256_loadu_ps(s1), a2 = _mm256_loadu_ps(s2);

	for (unsigned int j = 0; j < dim; j += 8) {
		__m256 v = _mm256_loadu_ps(y + j);

		a1 = _mm256_add_ps(a1, _mm256_and_ps(v, abs));
		a2 = _mm256_add_ps(a2, _mm256_mul_ps(v, v));
	}
	_mm256_storeu_ps(s1, a1);
	_mm256_storeu_ps(s2, a2);
}

__attribute__((target("avx2"))) static void
sign_bytes_avx2(const float *y, unsigned int dim, float h, float *sl, uint8_t *bits, size_t stride)
{
	const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)),
		     vh = _mm256_set1_ps(h), zero = _mm256_setzero_ps();
	__m256 al = _mm256_loadu_ps(sl);

	for (unsigned int j = 0; j < dim; j += 8) {
		__m256 v = _mm256_loadu_ps(y + j), a = _mm256_and_ps(v, abs);
		__m256 big = _mm256_cmp_ps(a, vh, _CMP_GT_OQ);
		unsigned int sg =
		    (unsigned int)_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_GE_OQ));
		unsigned int lg = (unsigned int)_mm256_movemask_ps(big);

		al = _mm256_add_ps(al, _mm256_and_ps(a, big));
		bits[(j / 4) * stride] = (uint8_t)((sg & 15) | (lg & 15) << 4);
		bits[(j / 4 + 1) * stride] = (uint8_t)(sg >> 4 | (lg >> 4) << 4);
	}
	_mm256_storeu_ps(sl, al);
}
#endif

/*
 * The 2-bit code of y = R (v - centre) into byte b * @stride of @bits for b < dim / 4: per dim
 * a level l_j = sign(y_j) (1 + 2 [|y_j| > h]), h = 0.8453 mean |y| (a gaussian's median |y|:
 * about half the dims are large); byte b holds the signs of dims 4b .. 4b + 3 in bits 0-3
 * (1: y >= 0) and their large flags in bits 4-7. f = |y|^2 / <y, l> (RaBitQ's rescaling of a
 * quantized direction). The rotation gives the same bits at every level (srht.h), and so do
 * the sums here: 8 lanes of f32, each added in dim order, then the lanes in order. A key
 * whose difference is not finite gets f = +inf: its estimate is +inf, it is always a
 * candidate (as the int8 level always reads it).
 */
static void
encode_sign(const struct kvt_sketch *sk, const float *v, const float *centre, uint8_t *bits,
	    size_t stride, float *ret_f)
{
	float y[KVT_SRHT_MAX_DIM], s1[8] = {0}, s2[8] = {0}, sl[8] = {0}, h, a1 = 0, a2 = 0, al = 0;
	bool avx2 = false;

	for (unsigned int j = 0; j < sk->dim; j++)
		y[j] = v[j] - centre[j];
	if (!finite_key(y, sk->dim)) {
		for (unsigned int b = 0; b < SB_BLOCKS(sk->dim); b++)
			bits[b * stride] = 0;
		*ret_f = INFINITY;
		return;
	}
	kvt_srht_apply(&sk->rot, y, y);
#if defined(__x86_64__)
	avx2 = kvt_simd_level() >= KVT_SIMD_AVX2;
	if (avx2)
		sign_sums_avx2(y, sk->dim, s1, s2);
#endif
	if (!avx2)
		sign_sums_scalar(y, sk->dim, s1, s2);
	for (unsigned int l = 0; l < 8; l++) {
		a1 += s1[l];
		a2 += s2[l];
	}
	h = 0.8453f * a1 / (float)sk->dim;
#if defined(__x86_64__)
	if (avx2)
		sign_bytes_avx2(y, sk->dim, h, sl, bits, stride);
#endif
	if (!avx2)
		sign_bytes_scalar(y, sk->dim, h, sl, bits, stride);
	for (unsigned int l = 0; l < 8; l++)
		al += sl[l];
	/* <y, l> = sum |y| + 2 sum of the large |y| */
	al = a1 + 2.0f * al;
	*ret_f = al > 0.0f ? a2 / al : 0.0f;
}

/* The centre of page @p, opened now: the mean of the finite keys of page p - 1 (csum), or for
 * page 0 that of the finite keys among @count rows from @rows. */
static void
open_page(struct kvt_sketch *sk, uint32_t p, const void *rows, size_t stride, unsigned int dtype,
	  uint32_t count)
{
	float *c = sk_centre(sk, p);

	if (p == 0) {
		float v[KVT_SRHT_MAX_DIM];

		memset(sk->csum, 0, sizeof(sk->csum));
		sk->ccount = 0;
		for (uint32_t i = 0; i < count && i < sk->page_keys; i++) {
			row_to_f32((const uint8_t *)rows + i * stride, dtype, sk->dim, v);
			if (!finite_key(v, sk->dim))
				continue;
			for (unsigned int j = 0; j < sk->dim; j++)
				sk->csum[j] += v[j];
			sk->ccount++;
		}
	}
	for (unsigned int j = 0; j < sk->dim; j++)
		c[j] = sk->ccount ? (float)(sk->csum[j] / sk->ccount) : 0.0f;
	memset(sk->csum, 0, sizeof(sk->csum));
	sk->ccount = 0;
}

/*
 * The group level: per group of sk_gkeys() keys the mean of its keys' int8 values (what the sketch
 * holds, so a group's summary depends on its keys alone, not on how they were appended or
 * re-encoded), int8-encoded as a key is. A group holding a key that is not finite gets the flag
 * +inf: its score is +inf and it is always scanned (its keys' bounds are). A probing search ranks
 * the groups by <mean, x> and scans only the best (kvt_sketch_topk_fast(), probe).
 */
static void
group_add(const struct kvt_sketch *sk, uint32_t i, struct kvt_sketch_gacc *a)
{
	uint32_t p = i >> sk->page_shift, off = i & (sk->page_keys - 1);
	const uint8_t *c = sk_codes(sk, p) + (size_t)off * sk->dim;
	const double s = sk_scale(sk, p)[off];

	if (sk_tol(sk, p)[off] == INFINITY) {
		a->bad = true;
		return;
	}
	for (unsigned int j = 0; j < sk->dim; j++)
		a->sum[j] += s * ((int)c[j] - 128);
	a->count++;
}

static void
group_put(struct kvt_sketch *sk, uint32_t g, const struct kvt_sketch_gacc *a)
{
	const uint32_t gpp = SK_GROUPS(sk->dim, sk->page_keys), p = g / gpp, j = g % gpp;
	float m[KVT_SRHT_MAX_DIM], tol;

	for (unsigned int d = 0; d < sk->dim; d++)
		m[d] = a->count ? (float)(a->sum[d] / a->count) : 0.0f;
	encode(m, sk->dim, sk_gcodes(sk, p) + (size_t)j * sk->dim, &sk_gscale(sk, p)[j], &tol);
	sk_gflag(sk, p)[j] = a->bad ? INFINITY : 0.0f;
}

static void
encode_key(struct kvt_sketch *sk, uint32_t i, const float *v)
{
	uint32_t p = i >> sk->page_shift, off = i & (sk->page_keys - 1);

	encode(v, sk->dim, sk_codes(sk, p) + (size_t)off * sk->dim, &sk_scale(sk, p)[off],
	       &sk_tol(sk, p)[off]);
	encode_sign(sk, v, sk_centre(sk, p), sk_bits(sk, p) + off, sk->page_keys,
		    &sk_fac(sk, p)[off]);
}

int
kvt_sketch_append(struct kvt_sketch *sk, const void *rows, size_t stride, unsigned int dtype,
		  uint32_t count)
{
	const uint32_t gk = sk_gkeys(sk->dim);
	float v[KVT_SRHT_MAX_DIM];

	if (dtype != KVT_DTYPE_F16 && dtype != KVT_DTYPE_BF16 && dtype != KVT_DTYPE_F32)
		return -EINVAL;
	if ((uint64_t)sk->n + count > (uint64_t)sk->npages << sk->page_shift)
		return -ENOSPC;
	for (uint32_t i = 0; i < count; i++) {
		const uint8_t *row = (const uint8_t *)rows + i * stride;
		uint32_t at = sk->n + i;

		if (!(at & (sk->page_keys - 1)))
			open_page(sk, at >> sk->page_shift, row, stride, dtype, count - i);
		row_to_f32(row, dtype, sk->dim, v);
		encode_key(sk, at, v);
		if (finite_key(v, sk->dim)) {
			for (unsigned int j = 0; j < sk->dim; j++)
				sk->csum[j] += v[j];
			sk->ccount++;
		}
		/* the group being filled: its summary after every append, its sums reset when full
		 */
		group_add(sk, at, &sk->gacc);
		if (!((at + 1) & (gk - 1)) || i + 1 == count)
			group_put(sk, at / gk, &sk->gacc);
		if (!((at + 1) & (gk - 1)))
			memset(&sk->gacc, 0, sizeof(sk->gacc));
	}
	sk->n += count;
	return (int)sk->n;
}

int
kvt_sketch_set(struct kvt_sketch *sk, uint32_t i, const float *key)
{
	const uint32_t gk = sk_gkeys(sk->dim), g = i / gk,
		       end = (g + 1) * gk < sk->n ? (g + 1) * gk : sk->n;
	struct kvt_sketch_gacc a = {.count = 0};

	if (i >= sk->n)
		return -ERANGE;
	encode_key(sk, i, key);
	/* the group's sums again, in key order: what appending these values would have made */
	for (uint32_t t = g * gk; t < end; t++)
		group_add(sk, t, &a);
	group_put(sk, g, &a);
	if (end & (gk - 1)) /* the group being filled */
		sk->gacc = a;
	return 0;
}

int
kvt_sketch_sign_code(const struct kvt_sketch *sk, uint32_t i, const float *key, uint8_t *ret_bits,
		     float *ret_f, const float **ret_centre)
{
	uint32_t p = i >> sk->page_shift, off = i & (sk->page_keys - 1);

	if (i >= sk->n)
		return -ERANGE;
	*ret_centre = sk_centre(sk, p);
	if (key) {
		encode_sign(sk, key, sk_centre(sk, p), ret_bits, 1, ret_f);
		return 0;
	}
	for (unsigned int b = 0; b < SB_BLOCKS(sk->dim); b++)
		ret_bits[b] = sk_bits(sk, p)[(size_t)b * sk->page_keys + off];
	*ret_f = sk_fac(sk, p)[off];
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
/* The integer sums of 8 keys, AVX2: 16-lane products. Inlined with @dim a constant, as
 * vnni_sums() is, so the sums stay in registers. */
__attribute__((target("avx2"), always_inline)) static inline void
avx2_sums(const uint8_t *codes, unsigned int dim, const struct sk_query *xq, __m256i *acc)
{
	const __m256i off = _mm256_set1_epi16(128);

#pragma GCC unroll 8
	for (int r = 0; r < 8; r++) {
		const uint8_t *c = codes + (size_t)r * dim;

		acc[r] = _mm256_setzero_si256();
		for (unsigned int j = 0; j < dim; j += 16) {
			__m256i cw = _mm256_sub_epi16(
			    _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(c + j))), off);
			__m256i xw = _mm256_load_si256((const __m256i *)(xq->xq + j));

			acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(cw, xw));
		}
	}
}

/* 8 keys at a time: avx2_sums(), then three hadds and a lane swap for 8 sums. */
__attribute__((target("avx2"))) static uint32_t
chunk_avx2(const uint8_t *codes, unsigned int dim, const struct sk_query *xq, const float *scale,
	   const float *tol, uint32_t cnt, float bar, float *ub)
{
	uint32_t mask = 0, i = 0;

	for (; i + 8 <= cnt; i += 8) {
		const uint8_t *c = codes + (size_t)i * dim;
		__m256i acc[8], h01, h23, h45, h67, lo, hi, sum;
		__m256 e, u;

		if (dim == 64) /* the sketch's dims: 64 or 128 */
			avx2_sums(c, 64, xq, acc);
		else
			avx2_sums(c, 128, xq, acc);
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
 * The integer sums of 16 keys, AVX-512 VNNI: per 64 dims one load of the offset codes and two
 * u8 x s8 dot products (vpdpbusd), one per query digit. Inlined with @dim a constant (64 or
 * 128, the sketch's dims) the loops unroll and the 16 sums stay in registers; with a variable
 * one the compiler kept them on the stack, and the kernel took twice as long at dim 64.
 */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) static inline void
vnni_sums(const uint8_t *codes, unsigned int dim, const struct sk_query *xq, __m512i *acc)
{
#pragma GCC unroll 16
	for (int r = 0; r < 16; r++) {
		const uint8_t *c = codes + (size_t)r * dim;
		__m512i ah = _mm512_setzero_si512(), al = _mm512_setzero_si512();

#pragma GCC unroll 2
		for (unsigned int j = 0; j < dim; j += 64) {
			__m512i cv = _mm512_loadu_si512(c + j);

			ah = _mm512_dpbusd_epi32(ah, cv, _mm512_load_si512(xq->h + j));
			al = _mm512_dpbusd_epi32(al, cv, _mm512_load_si512(xq->l + j));
		}
		acc[r] = _mm512_add_epi32(_mm512_slli_epi32(ah, 7), al);
	}
}

/* 16 keys, AVX-512 VNNI: vnni_sums(), then a transpose-and-add tree for 16 sums. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static uint32_t
chunk_vnni(const uint8_t *codes, unsigned int dim, const struct sk_query *xq, const float *scale,
	   const float *tol, uint32_t cnt, float bar, float *ub)
{
	__m512i acc[16], g[4], h0, h1, sum;
	__m512 e, u;

	if (cnt < 16)
		return chunk_scalar(codes, dim, xq, scale, tol, cnt, bar, ub);
	if (dim == 64) /* the sketch's dims: 64 or 128 */
		vnni_sums(codes, 64, xq, acc);
	else
		vnni_sums(codes, 128, xq, acc);
#pragma GCC unroll 4
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

/* ---- the fast path: the 2-bit level's best C, scored exactly --------------------------------- */

/*
 * The rotated unit query y' = R x as tables: for block b (dims 4b .. 4b + 3) and code byte c,
 * tab[b][c] = round(s * sum_j l_j(c) y'_j), l_j(c) = (bit j of c ? 1 : -1) (bit 4 + j ? 3 : 1),
 * with one scale s = 31 / max_b 3 sum_j |y'_j|, so four entries sum in a signed byte (the
 * kernel widens once per four blocks) and a key's D / 4 entries in an int16. The estimate of
 * key i is then f_i * (acc_i / s) + <m_p, x>. (Five-bit tables lose nothing measurable next to
 * the 2-bit codes' error: docs/retrieval.md, "The fast path".) The sums are formed in fixed
 * point (y'_j s with SB_FRAC fraction bits): integer sums are exact in any order, so every SIMD
 * level builds the same tables, and the AVX-512 builder does 16 entries an instruction (the
 * scalar loop's 8,192 entries at D = 128 were a tenth of a search at 128K keys).
 */
#define SB_FRAC 16

struct sb_query {
	int8_t tab[SB_MAX_BLOCKS][256] __attribute__((aligned(64)));
	float inv_s;
	/* a probing search's int8 query and kernel (the group means' scores, the keys' estimates)
	 */
	struct sk_query xq;
	chunk_fn chunk;
};

/* round(t / 2^SB_FRAC), halves away from zero, clamped to +-SB_TAB_MAX */
static inline int8_t
sb_entry(int32_t t)
{
	int32_t a = ((t < 0 ? -t : t) + (1 << (SB_FRAC - 1))) >> SB_FRAC;

	a = a > SB_TAB_MAX ? SB_TAB_MAX : a;
	return (int8_t)(t < 0 ? -a : a);
}

static void
sb_tab_scalar(const int32_t *yb, int8_t *tab)
{
	/* for each magnitude nibble, the 16 sign patterns as subset sums */
	for (unsigned int m = 0; m < 16; m++) {
		int32_t t[16], l[SB_DIMS];

		t[0] = 0;
		for (unsigned int j = 0; j < SB_DIMS; j++) {
			l[j] = (m >> j & 1 ? 3 : 1) * yb[j];
			t[0] -= l[j];
		}
		for (unsigned int c = 1; c < 16; c++)
			t[c] = t[c & (c - 1)] + 2 * l[__builtin_ctz(c)];
		for (unsigned int c = 0; c < 16; c++)
			tab[16 * m + c] = sb_entry(t[c]);
	}
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void
sb_tab_avx512(const int32_t *yb, int8_t *tab)
{
	/* lane c: bit j of c set in mask j */
	static const __mmask16 bit[SB_DIMS] = {0xaaaa, 0xcccc, 0xf0f0, 0xff00};
	const __m512i zero = _mm512_setzero_si512(), lim = _mm512_set1_epi32(SB_TAB_MAX),
		      half = _mm512_set1_epi32(1 << (SB_FRAC - 1));

	for (unsigned int m = 0; m < 16; m++) {
		__m512i t = zero, a;

		for (unsigned int j = 0; j < SB_DIMS; j++) {
			int32_t l = (m >> j & 1 ? 3 : 1) * yb[j];

			t = _mm512_add_epi32(t,
					     _mm512_mask_blend_epi32(bit[j], _mm512_set1_epi32(-l),
								     _mm512_set1_epi32(l)));
		}
		a = _mm512_srli_epi32(_mm512_add_epi32(_mm512_abs_epi32(t), half), SB_FRAC);
		a = _mm512_min_epi32(a, lim);
		a = _mm512_mask_sub_epi32(a, _mm512_cmplt_epi32_mask(t, zero), zero, a);
		_mm_store_si128((__m128i *)(tab + 16 * m), _mm512_cvtepi32_epi8(a));
	}
}
#endif

static void
sb_query_prep(const struct kvt_sketch *sk, const float *x, struct sb_query *ret)
{
	float y[KVT_SRHT_MAX_DIM], m = 0.0f, s;
	int32_t yi[KVT_SRHT_MAX_DIM];
#if defined(__x86_64__)
	const bool wide = kvt_simd_level() == KVT_SIMD_AVX512;
#endif

	kvt_srht_apply(&sk->rot, x, y);
	for (unsigned int b = 0; b < SB_BLOCKS(sk->dim); b++) {
		float a = 0.0f;

		for (unsigned int j = 0; j < SB_DIMS; j++)
			a += 3.0f * fabsf(y[SB_DIMS * b + j]);
		m = a > m ? a : m;
	}
	s = m > 0.0f ? (float)SB_TAB_MAX / m : 0.0f;
	ret->inv_s = m > 0.0f ? m / (float)SB_TAB_MAX : 0.0f;
	for (unsigned int j = 0; j < sk->dim; j++) { /* |v| <= 31 / 3 * 2^16 < 2^24: whole floats */
		float v = y[j] * s * (float)(1 << SB_FRAC);

		yi[j] = (int32_t)(v + (v < 0.0f ? -0.5f : 0.5f)); /* half away from zero, no libm */
	}
	for (unsigned int b = 0; b < SB_BLOCKS(sk->dim); b++) {
#if defined(__x86_64__)
		if (wide) {
			sb_tab_avx512(yi + SB_DIMS * b, ret->tab[b]);
			continue;
		}
#endif
		sb_tab_scalar(yi + SB_DIMS * b, ret->tab[b]);
	}
}

/*
 * One group of @cnt (<= 64) keys at @off of a page: estimates into @est and the mask of those
 * above @bar (sb_group_int8(): at or above; it serves probing searches alone, which list every
 * key while the bar is -inf and after that test est > bar of each). The integer sums are exact and
 * the rest is one multiply and one fused multiply-add per key, so every level gives the same bits.
 */
typedef uint64_t (*sb_group_fn)(const struct kvt_sketch *sk, uint32_t p, uint32_t off, uint32_t cnt,
				const struct sb_query *bq, float cp, float bar, float *est);

static uint64_t
sb_group_scalar(const struct kvt_sketch *sk, uint32_t p, uint32_t off, uint32_t cnt,
		const struct sb_query *bq, float cp, float bar, float *est)
{
	const uint8_t *bits = sk_bits(sk, p) + off;
	const float *fac = sk_fac(sk, p) + off;
	int32_t acc[64] = {0};
	uint64_t pass = 0;

	/* a block's codes for every key, then the next block's: each row read in order. Key by key
	 * (a key's blocks lie page_keys bytes apart) took about three times as long
	 * (docs/retrieval.md, "The fast path"). */
	for (unsigned int b = 0; b < SB_BLOCKS(sk->dim); b++) {
		const uint8_t *row = bits + (size_t)b * sk->page_keys;
		const int8_t *t = bq->tab[b];

		for (uint32_t i = 0; i < cnt; i++)
			acc[i] += t[row[i]];
	}
	for (uint32_t i = 0; i < cnt; i++) {
		est[i] =
		    fac[i] == INFINITY ? INFINITY : fmaf((float)acc[i], fac[i] * bq->inv_s, cp);
		pass |= (uint64_t)(est[i] > bar) << i;
	}
	return pass;
}

#if defined(__x86_64__)
/* As the vote pass (paris.c): vpermi2b looks a 256-entry byte table up for 64 keys in ~4
 * instructions; the bytes are summed as int16. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static uint64_t
sb_group_avx512(const struct kvt_sketch *sk, uint32_t p, uint32_t off, uint32_t cnt,
		const struct sb_query *bq, float cp, float bar, float *est)
{
	const uint8_t *bits = sk_bits(sk, p) + off;
	const float *fac = sk_fac(sk, p) + off;
	__m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
	const __m512 inv = _mm512_set1_ps(bq->inv_s), c = _mm512_set1_ps(cp),
		     vb = _mm512_set1_ps(bar), inf = _mm512_set1_ps(INFINITY);
	uint64_t pass = 0;

	/* a page holds a multiple of 64 keys: a short last group reads zeroed bytes; D / 4 is a
	 * multiple of 4, and four entries of at most 31 sum in a byte */
	for (unsigned int b = 0; b < SB_BLOCKS(sk->dim); b += 4) {
		__m512i v = _mm512_setzero_si512();

		for (unsigned int u = b; u < b + 4; u++) {
			const int8_t *t = bq->tab[u];
			__m512i id = _mm512_loadu_si512(bits + (size_t)u * sk->page_keys);
			__m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(t), id,
							      _mm512_load_si512(t + 64));
			__m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(t + 128), id,
							      _mm512_load_si512(t + 192));

			v = _mm512_add_epi8(
			    v, _mm512_mask_blend_epi8(_mm512_movepi8_mask(id), lo, hi));
		}
		a0 = _mm512_add_epi16(a0, _mm512_cvtepi8_epi16(_mm512_castsi512_si256(v)));
		a1 = _mm512_add_epi16(a1, _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(v, 1)));
	}
	for (unsigned int g = 0; g < 4; g++) {
		__m512i a = g < 2 ? a0 : a1;
		__m256i h = g & 1 ? _mm512_extracti64x4_epi64(a, 1) : _mm512_castsi512_si256(a);
		__m512 f = _mm512_loadu_ps(fac + 16 * g);
		__m512 e = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(h)),
					   _mm512_mul_ps(f, inv), c);

		e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(f, inf, _CMP_EQ_OQ), inf);
		_mm512_storeu_ps(est + 16 * g, e);
		pass |= (uint64_t)_mm512_cmp_ps_mask(e, vb, _CMP_GT_OQ) << (16 * g);
	}
	return cnt < 64 ? pass & ((1ull << cnt) - 1) : pass;
}
#endif

/*
 * The same for a probing search, from the int8 level: estimates e = s_x s <x^, c> (the bound's
 * centre, within its tolerance t of the exact score; t of a key that is not finite is +inf, and
 * so is its estimate). Used at head_dim 64 only, where the 2-bit code is 16 bytes and ranks
 * poorly: on real keys this way at C = k finds as much as the 2-bit level at C = 8k in half the
 * time (docs/retrieval.md, "Probing"). At 128 the 2-bit level reaches the probe's ceiling at C =
 * 2-4k, and the int8 codes (D + 8 bytes a key against D / 4 + 4) cost more than those rows save.
 */
static uint64_t
sb_group_int8(const struct kvt_sketch *sk, uint32_t p, uint32_t off, uint32_t cnt,
	      const struct sb_query *bq, float cp, float bar, float *est)
{
	static const float zero[SK_CHUNK];
	const float *tol = sk_tol(sk, p) + off;
	const uint32_t gk = sk_gkeys(sk->dim);
	uint64_t pass = 0, inf = 0;
	bool flagged = false;

	(void)cp;
	for (uint32_t c = 0; c < cnt; c += SK_CHUNK) {
		const uint32_t m = cnt - c < SK_CHUNK ? cnt - c : SK_CHUNK;

		/* est >= bar: the caller asks est > bar of the keys it lists */
		pass |=
		    (uint64_t)bq->chunk(sk_codes(sk, p) + (size_t)(off + c) * sk->dim, sk->dim,
					&bq->xq, sk_scale(sk, p) + off + c, zero, m, bar, est + c)
		    << c;
	}
	/* keys that are not finite (their estimates +inf), looked for only where a group's flag
	 * says one of them is */
	for (uint32_t g = off / gk; g <= (off + cnt - 1) / gk; g++)
		flagged |= sk_gflag(sk, p)[g] == INFINITY;
	if (flagged)
		for (uint32_t i = 0; i < cnt; i++)
			inf |= (uint64_t)(tol[i] == INFINITY) << i;
	for (pass |= inf; inf; inf &= inf - 1)
		est[__builtin_ctzll(inf)] = INFINITY;
	return pass;
}

static sb_group_fn
sb_group_kernel(void)
{
#if defined(__x86_64__)
	if (kvt_simd_level() == KVT_SIMD_AVX512) /* F, BW, VBMI */
		return sb_group_avx512;
#endif
	return sb_group_scalar;
}

/* A candidate as one u64, larger is better: the estimate's order-preserving key (select.h),
 * then the lower index (~idx), so ties go to the lower index and keys are distinct. */
static inline uint64_t
cand_key(float est, uint32_t idx)
{
	return (uint64_t)kvt_score_key(est) << 32 | (uint32_t)~idx;
}

/* The estimate back from a key (kvt_score_key() inverted; estimates are never NaN). */
static inline float
est_of(uint64_t key)
{
	uint32_t u = (uint32_t)(key >> 32);
	float f;

	u = (u & 0x80000000u) ? u & 0x7fffffffu : ~u;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static int
cmp_key_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x > y ? -1 : x < y;
}

/*
 * The @c largest of @n distinct keys to the front, in no order; returns the position of the
 * smallest of them (1 <= c <= n). Quickselect with median-of-three pivots and a branch-free
 * partition (the swap is unconditional, the store index advances by the comparison): the
 * comparisons are unpredictable by nature, and a mispredicted branch per key cost more than
 * the whole scan did. Keys and queries are the client's, so the order they come in may be
 * chosen to defeat the pivots: after 48 rounds the rest is sorted (O(n log n) at worst).
 */
static uint32_t
cand_keep(uint64_t *a, uint32_t n, uint32_t c)
{
	uint32_t lo = 0, hi = n;

	for (unsigned int round = 0;; round++) {
		uint32_t mid = lo + (hi - lo) / 2, last = hi - 1, st = lo;
		uint64_t pv, x;

		if (hi - lo <= 1)
			return lo;
		if (round == 48) {
			qsort(a + lo, hi - lo, sizeof(*a), cmp_key_desc);
			return c - 1;
		}
		if (a[mid] > a[lo]) {
			x = a[mid];
			a[mid] = a[lo];
			a[lo] = x;
		}
		if (a[last] > a[lo]) {
			x = a[last];
			a[last] = a[lo];
			a[lo] = x;
		}
		if (a[mid] > a[last]) {
			x = a[mid];
			a[mid] = a[last];
			a[last] = x;
		}
		pv = a[last]; /* the median of three */
		for (uint32_t t = lo; t < last; t++) {
			x = a[t];
			a[t] = a[st];
			a[st] = x;
			st += x > pv;
		}
		a[last] = a[st];
		a[st] = pv;
		/* [lo, st) beat the pivot, now at st */
		if (st + 1 == c)
			return st;
		if (st + 1 > c)
			hi = st;
		else
			lo = st + 1;
	}
}

/* The page centre's product with the query: the estimate's constant for page @p. */
static float
centre_dot(const struct kvt_sketch *sk, uint32_t p, const float *x)
{
	const float *centre = sk_centre(sk, p);
	float cp = 0.0f;

	for (unsigned int j = 0; j < sk->dim; j++)
		cp += centre[j] * x[j];
	return cp;
}

/* keys in the group at @off of the page at key @base (the last page may be part full) */
static inline uint32_t
group_len(const struct kvt_sketch *sk, uint32_t base, uint32_t off)
{
	uint32_t cnt = sk->n - base < sk->page_keys ? sk->n - base : sk->page_keys;

	return cnt - off < SB_GROUP ? cnt - off : SB_GROUP;
}

#define SB_SAMPLE_RANK 64 /* about the sample's rank whose estimate is the first bar */
#define SB_SAMPLE_MAX  128
#define SB_SAMPLE_OVER 4 /* live keys above the first bar, in C (expected) */

/*
 * A first bar from a sample: whole groups spread evenly over the zone, about
 * SB_SAMPLE_RANK * n / (4C) keys, whose 4C * sampled / n-th best estimate about 4C live keys
 * beat (4C, not nearer C: the best keys come in runs, a passage on one topic, so a sample of
 * whole groups misjudges the tail; at 2C one drift-set query in ten found fewer than C above
 * the bar and scanned again). Without it the bar starts at -inf and rises only as keys are
 * listed, so a zone whose best keys come last (a drifting context: later keys resemble the
 * query) lists and reselects most of them (C = 16k at 128K drift-set keys: 12 % faster with
 * the sample). Returns -inf where the sample would be more than a 32nd of the zone or holds
 * too few live keys.
 */
static float
sample_bar(const struct kvt_sketch *sk, const struct kvt_paris_index *ix,
	   const struct kvt_paris_drop *drop, const struct sb_query *bq, const float *x,
	   uint32_t cand, sb_group_fn group)
{
	const uint32_t ngroups = (sk->n + SB_GROUP - 1) / SB_GROUP;
	const uint64_t over = SB_SAMPLE_OVER * (uint64_t)cand;
	uint64_t want = ((uint64_t)SB_SAMPLE_RANK * sk->n / over + SB_GROUP - 1) / SB_GROUP, rank;
	float h[SB_SAMPLE_MAX], est[SB_GROUP], cp = 0.0f;
	uint32_t hn = 0, cp_page = UINT32_MAX;

	/* a small C lists few keys anyway: a sample of more than a 32nd of the zone cost more than
	 * it saved (C = k at 128K keys: 8 % slower with a sixteenth) */
	if (!want || want > ngroups / 32)
		return -INFINITY;
	rank = (over * want * SB_GROUP + sk->n / 2) / sk->n;
	rank = rank < 1 ? 1 : rank > SB_SAMPLE_MAX ? SB_SAMPLE_MAX : rank;
	for (uint64_t s = 0; s < want; s++) {
		/* groups never straddle pages: a page is a multiple of SB_GROUP keys */
		const uint32_t g = (uint32_t)(s * ngroups / want), key0 = g * SB_GROUP;
		const uint32_t p = key0 >> sk->page_shift, base = p << sk->page_shift;
		const uint32_t off = key0 - base, m = group_len(sk, base, off);
		uint64_t live = m < 64 ? (1ull << m) - 1 : ~0ull;

		if (p != cp_page) {
			cp = centre_dot(sk, p, x);
			cp_page = p;
		}
		/* once the heap is full only keys above its least can enter */
		live &= group(sk, p, off, m, bq, cp, hn == rank ? h[0] : -INFINITY, est) |
			(hn == rank ? 0 : ~0ull);
		if (ix->ndead)
			live &= ~ix->dead[key0 / 64];
		for (; live; live &= live - 1) {
			uint32_t i = (uint32_t)__builtin_ctzll(live);

			if (drop && drop->dropped(drop->ctx, key0 + i))
				continue;
			bar_push(h, &hn, (uint32_t)rank, est[i]);
		}
	}
	/* dropped keys thin the sample and the zone alike: still about 4C live keys beat it */
	return hn == rank ? h[0] : -INFINITY;
}

/*
 * Announce the unit of @u keys at @key0 that a probing search reads next (its int8 codes and
 * scales at D = 64, else its 2-bit columns and f): probed units are scattered, so the hardware
 * prefetcher, which follows a stream, does not see them coming. At 16 keys a unit the int8
 * pass over 10 % of 131K real keys took twice as long without it.
 */
static void
unit_prefetch(const struct kvt_sketch *sk, uint32_t key0, uint32_t u)
{
	const uint32_t p = key0 >> sk->page_shift, off = key0 & (sk->page_keys - 1);

	if (sk->dim == 64) {
		const uint8_t *c = sk_codes(sk, p) + (size_t)off * sk->dim;

		for (size_t b = 0; b < (size_t)u * sk->dim; b += 64)
			__builtin_prefetch(c + b);
		__builtin_prefetch(sk_scale(sk, p) + off);
		__builtin_prefetch(sk_tol(sk, p) + off);
		return;
	}
	for (unsigned int b = 0; b < SB_BLOCKS(sk->dim); b++)
		__builtin_prefetch(sk_bits(sk, p) + (size_t)b * sk->page_keys + off);
	__builtin_prefetch(sk_fac(sk, p) + off);
}

/*
 * The candidate stage: the @cand best live keys by estimate (ties to the lower index) as
 * cand_key()s in scr->sk_cand, in no order; returns how many (min(cand, live keys)).
 * With @gmap only the groups it marks are scanned (a probing search), else every group.
 * A first bar from sample_bar() (@sample) lists only keys above it; should fewer than @cand
 * beat it, the zone is scanned again from -inf, so the set never depends on the sample.
 */
static uint32_t
fast_cands(const struct kvt_sketch *sk, const struct kvt_paris_index *ix, const float *x,
	   uint32_t cand, const struct kvt_paris_drop *drop, struct kvt_paris_scratch *scr,
	   const struct sb_query *bq, bool sample, const uint64_t *gmap)
{
	const sb_group_fn group = gmap && sk->dim == 64 ? sb_group_int8 : sb_group_kernel();
	/* a unit: a 2-bit kernel call, or with @gmap a summarised group */
	const uint32_t u = gmap ? sk_gkeys(sk->dim) : SB_GROUP, nunits = (sk->n + u - 1) / u;
	float est[SB_GROUP],
	    first = sample && !gmap ? sample_bar(sk, ix, drop, bq, x, cand, group) : -INFINITY;

	for (;;) {
		/* before the first selection every key above the first bar is listed */
		float bar = first, cp = 0.0f;
		bool kept = false;
		uint32_t hn = 0, cp_page = UINT32_MAX;

		for (uint32_t w = 0; w < (nunits + 63) / 64; w++) {
			uint64_t gw = gmap ? gmap[w] : ~0ull;

			if (w == nunits / 64) /* the last word: units past n are not there */
				gw &= (1ull << (nunits % 64)) - 1;
			for (; gw; gw &= gw - 1) {
				/* units never straddle pages: a page is a multiple of 64 keys */
				const uint32_t key0 = (w * 64 + (uint32_t)__builtin_ctzll(gw)) * u;
				const uint32_t p = key0 >> sk->page_shift,
					       base = p << sk->page_shift;
				const uint32_t off = key0 - base,
					       m = sk->n - key0 < u ? sk->n - key0 : u;
				const uint64_t rest = gw & (gw - 1);
				uint64_t pass;

				if (gmap && rest) /* the next unit of this word */
					unit_prefetch(
					    sk, (w * 64 + (uint32_t)__builtin_ctzll(rest)) * u, u);
				if (p != cp_page && group != sb_group_int8) { /* int8: no centre */
					cp = centre_dot(sk, p, x);
					cp_page = p;
				}
				pass = group(sk, p, off, m, bq, cp, bar, est);
				if (bar == -INFINITY) /* an infinite estimate is not above -inf */
					pass = m < 64 ? (1ull << m) - 1 : ~0ull;
				if (ix->ndead) /* a unit lies inside one bitmap word */
					pass &= ~(ix->dead[key0 / 64] >> (key0 % 64));
				for (; pass; pass &= pass - 1) {
					uint32_t i = (uint32_t)__builtin_ctzll(pass),
						 key = key0 + i;

					/* after one, only above the C-th best (later keys lose
					 * ties) */
					if (kept && !(est[i] > bar))
						continue;
					if (drop && drop->dropped(drop->ctx, key))
						continue;
					scr->sk_cand[hn++] = cand_key(est[i], key);
					if (hn == 2 * cand) {
						uint32_t s = cand_keep(scr->sk_cand, hn, cand);

						/* the C-th best estimate: a later key must pass it
						 */
						bar = est_of(scr->sk_cand[s]);
						hn = cand;
						kept = true;
					}
				}
			}
		}
		if (hn >= cand || first == -INFINITY) {
			if (hn > cand)
				cand_keep(scr->sk_cand, hn, cand);
			return hn < cand ? hn : cand;
		}
		first = -INFINITY; /* the sample's bar was too high */
	}
}

/* live keys of the summarised group at key @key0 */
static inline uint32_t
group_live(const struct kvt_sketch *sk, const struct kvt_paris_index *ix, uint32_t key0)
{
	const uint32_t gk = sk_gkeys(sk->dim), m = sk->n - key0 < gk ? sk->n - key0 : gk;
	uint64_t live = m < 64 ? (1ull << m) - 1 : ~0ull;

	if (!ix->ndead) /* the common case, and no popcount: the engine's baseline has none */
		return m;
	live &= ~(ix->dead[key0 / 64] >> (key0 % 64));
	return (uint32_t)__builtin_popcountll(live);
}

#define PG_SAMPLE 256 /* group scores in the sample that sets probe_groups()' first bar */

/*
 * A first bar for probe_groups(): of PG_SAMPLE scores spread evenly over the @ngroups in @ub,
 * the one at rank r + 3 sqrt(r) + 4, r the @want groups' share of the sample (three standard
 * deviations of a sampled count above it), so the groups at or above it hold the @want best but
 * for bad luck or a chosen order; -inf where that rank is half the sample or more (listing every
 * group then costs little more).
 */
static float
probe_bar(const float *ub, uint32_t ngroups, uint32_t want)
{
	const uint32_t stride = ngroups / PG_SAMPLE;
	const float r = (float)want * PG_SAMPLE / (float)ngroups;
	const uint32_t rank = (uint32_t)(r + 3.0f * sqrtf(r)) + 4;
	uint64_t smp[PG_SAMPLE];

	if (!stride || rank >= PG_SAMPLE / 2)
		return -INFINITY;
	for (uint32_t j = 0; j < PG_SAMPLE; j++)
		smp[j] = cand_key(ub[(size_t)j * stride], j);
	return est_of(smp[cand_keep(smp, PG_SAMPLE, rank)]);
}

/*
 * A probing search's groups: every group with a live key scored by its mean's int8 estimate
 * <mean, x> (+inf for a group with a key that is not finite), and the best taken until they hold
 * @probe live keys or none is left; their bits set in scr->sk_gmap. The groups' scores come
 * from the int8 kernels of the exact stage, 16 groups a call, into a row of floats; only those
 * at or above a sampled bar are listed and selected among (a tenth of 8K groups: listing and
 * selecting all of them took as long as scoring them), and should those hold fewer than @probe
 * live keys, all are.
 */
static void
probe_groups(const struct kvt_sketch *sk, const struct kvt_paris_index *ix, uint32_t probe,
	     struct kvt_paris_scratch *scr, const struct sb_query *bq)
{
	const uint32_t gk = sk_gkeys(sk->dim), ngroups = (sk->n + gk - 1) / gk,
		       gpp = SK_GROUPS(sk->dim, sk->page_keys);
	uint64_t *a = scr->sk_grp;
	float *ub = (float *)(scr->sk_grp + scr->sk_grp_cap), bar;
	/* both powers of two: a step never straddles a page */
	const uint32_t step = gpp < SK_CHUNK ? gpp : SK_CHUNK;
	uint32_t m, taken = 0, live = 0;

	for (uint32_t g0 = 0; g0 < ngroups; g0 += step) {
		const uint32_t p = g0 / gpp, j = g0 % gpp;
		const uint32_t cnt = ngroups - g0 < step ? ngroups - g0 : step;

		bq->chunk(sk_gcodes(sk, p) + (size_t)j * sk->dim, sk->dim, &bq->xq,
			  sk_gscale(sk, p) + j, sk_gflag(sk, p) + j, cnt, -INFINITY, ub + g0);
	}
	bar = probe_bar(ub, ngroups, (probe + gk - 1) / gk);
	for (;;) {
		uint32_t held = 0;

		m = 0;
		for (uint32_t g = 0; g < ngroups; g++) {
			uint32_t n = ub[g] >= bar ? group_live(sk, ix, g * gk) : 0;

			if (n)
				a[m++] = cand_key(ub[g], g);
			held += n;
		}
		/* every group left out scores below every group listed */
		if (held >= probe || bar == -INFINITY)
			break;
		bar = -INFINITY;
	}
	memset(scr->sk_gmap, 0, (ngroups + 63) / 64 * sizeof(uint64_t));
	/* the best groups first; more while they hold fewer than @probe live keys */
	while (live < probe && taken < m) {
		uint32_t want = (probe - live + gk - 1) / gk;

		if (want < m - taken)
			cand_keep(a + taken, m - taken, want);
		else
			want = m - taken;
		for (uint32_t i = taken; i < taken + want; i++) {
			uint32_t g = ~(uint32_t)a[i];

			scr->sk_gmap[g / 64] |= 1ull << (g % 64);
			live += group_live(sk, ix, g * gk);
		}
		taken += want;
	}
}

/* Scratch for @cand candidates: ref_idx / ref_score, 2C listed keys, the query tables; with
 * @probe the groups' scores and map. */
static int
fast_reserve(const struct kvt_sketch *sk, struct kvt_paris_scratch *scr, uint32_t cand, bool probe)
{
	const size_t ngroups = (sk->n + sk_gkeys(sk->dim) - 1) / sk_gkeys(sk->dim);
	int r = grow(&scr->ref_idx, &scr->ref_score, &scr->ref_cap, cand ? cand : 1);

	if (r < 0)
		return r;
	/* up to 2C listed between selections: amortised O(1) a listing, no heap */
	if (scr->sk_cand_cap < 2 * (size_t)cand) {
		uint64_t *c = realloc(scr->sk_cand, 2 * (size_t)cand * sizeof(*c));

		if (!c)
			return -ENOMEM;
		scr->sk_cand = c;
		scr->sk_cand_cap = 2 * (size_t)cand;
	}
	if (!scr->sk_tab) {
		scr->sk_tab = aligned_alloc(64, sizeof(struct sb_query));
		if (!scr->sk_tab)
			return -ENOMEM;
	}
	if (probe && scr->sk_grp_cap < ngroups) {
		uint64_t *g = realloc(scr->sk_grp, ngroups * (sizeof(*g) + sizeof(float)));

		if (!g)
			return -ENOMEM;
		scr->sk_grp = g;
		scr->sk_grp_cap = ngroups;
	}
	if (probe && scr->sk_gmap_cap < (ngroups + 63) / 64) {
		uint64_t *g = realloc(scr->sk_gmap, (ngroups + 63) / 64 * sizeof(*g));

		if (!g)
			return -ENOMEM;
		scr->sk_gmap = g;
		scr->sk_gmap_cap = (ngroups + 63) / 64;
	}
	return 0;
}

/*
 * The candidate stage with its scratch: min(cand, live) candidates into scr->ref_idx. With
 * @probe (>= cand; at D = 128 below the live count), from the best groups holding @probe live
 * keys; should they give fewer than C (keys @drop names), from the whole zone.
 */
static int
fast_stage(const struct kvt_sketch *sk, const struct kvt_paris_index *ix, const float *x,
	   uint32_t cand, uint32_t probe, const struct kvt_paris_drop *drop, bool sample,
	   struct kvt_paris_scratch *scr)
{
	uint32_t live = kvt_paris_index_live(ix), hn = 0;
	struct sb_query *bq;
	int r;

	cand = cand > live ? live : cand;
	/* a probe of every live key is the whole zone, but at head_dim 64 still ranked by the int8
	 * level (the 2-bit one ranks poorly there): only at 128 does the whole-zone path rank alike
	 */
	if (probe >= live) /* (and no larger: the group counts below stay far from overflow) */
		probe = sk->dim == 64 ? live : 0;
	r = fast_reserve(sk, scr, cand, probe);
	if (r < 0)
		return r;
	bq = scr->sk_tab;
	/* at head_dim 64 a probe ranks its keys with the int8 level: no 2-bit tables unless it
	 * falls short */
	if (!cand || !probe || sk->dim != 64)
		sb_query_prep(sk, x, bq);
	if (cand && probe) {
		sk_query_prep(x, sk->dim, &bq->xq);
		bq->chunk = chunk_kernel(sk->dim);
		probe_groups(sk, ix, probe, scr, bq);
		hn = fast_cands(sk, ix, x, cand, drop, scr, bq, false, scr->sk_gmap);
	}
	if (cand && hn < cand) {
		if (probe && sk->dim == 64)
			sb_query_prep(sk, x, bq);
		hn = fast_cands(sk, ix, x, cand, drop, scr, bq, sample, NULL);
	}
	for (uint32_t i = 0; i < hn; i++)
		scr->ref_idx[i] = ~(uint32_t)scr->sk_cand[i];
	return (int)hn;
}

int
kvt_sketch_fast_cands(const struct kvt_sketch *sk, const struct kvt_paris_index *ix, const float *x,
		      uint32_t cand, uint32_t probe, const struct kvt_paris_drop *drop, bool sample,
		      struct kvt_paris_scratch *scr, uint32_t *ret_idx)
{
	int hn;

	if (sk->n != ix->n || ix->dim != sk->dim || !cand || (probe && probe < cand))
		return -EINVAL;
	hn = fast_stage(sk, ix, x, cand, probe, drop, sample, scr);
	if (hn > 0)
		memcpy(ret_idx, scr->ref_idx, (size_t)hn * sizeof(*ret_idx));
	return hn;
}

int
kvt_sketch_topk_fast(const struct kvt_sketch *sk, const struct kvt_paris_index *ix,
		     const struct kvt_paris_query *q, uint32_t k, uint32_t cand, uint32_t probe,
		     const struct kvt_paris_keys *keys, const struct kvt_paris_drop *drop,
		     struct kvt_paris_scratch *scr, uint32_t *ret_idx, float *ret_score,
		     uint32_t *ret_read)
{
	uint32_t hn;
	int r;

	if (sk->n != ix->n || q->dim != sk->dim || ix->dim != sk->dim || !k || cand < k ||
	    (probe && probe < cand) || !keys || !keys->get)
		return -EINVAL;
	r = fast_stage(sk, ix, q->x, cand, probe, drop, true, scr);
	if (r < 0)
		return r;
	hn = (uint32_t)r;
	r = kvt_paris_score_list(q, keys, scr->ref_idx, hn, scr->key_tmp, scr->ref_score);
	if (r < 0)
		return r;
	if (ret_read)
		*ret_read = hn;
	if (k > hn)
		k = hn;
	if (k)
		kvt_paris_topk_select(scr->ref_idx, scr->ref_score, hn, k, ret_idx, ret_score);
	return (int)k;
}
