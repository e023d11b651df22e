/* SPDX-License-Identifier: MIT */
/* Unit tests for engine/quant: conversions, int8 codes, SIMD exactness, row gather. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kvt_abi.h"
#include "quant.h"
#include "simd.h"

#include "test_req.h"
#include "kvt_test.h"

static uint64_t rng_state = 0x9a7;

static uint64_t
rnd(void)
{
	return kvt_test_splitmix(&rng_state);
}

/* Standard normal-ish value (sum of uniforms), enough for test data. */
static float
gauss(void)
{
	double s = 0;

	for (int i = 0; i < 4; i++)
		s += (double)(rnd() >> 11) / 9007199254740992.0;
	return (float)((s - 2.0) * 1.7320508);
}

static uint32_t
f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float
u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static void
put(int dtype, void *row, size_t i, float f)
{
	uint16_t h;

	if (dtype == KVT_DTYPE_F32) {
		memcpy((char *)row + 4 * i, &f, 4);
		return;
	}
	h = dtype == KVT_DTYPE_F16 ? kvt_f32_to_f16(f) : kvt_f32_to_bf16(f);
	memcpy((char *)row + 2 * i, &h, 2);
}

static float
get(int dtype, const void *row, size_t i)
{
	uint16_t h;
	float f;

	if (dtype == KVT_DTYPE_F32) {
		memcpy(&f, (const char *)row + 4 * i, 4);
		return f;
	}
	memcpy(&h, (const char *)row + 2 * i, 2);
	return dtype == KVT_DTYPE_F16 ? kvt_f16_to_f32(h) : kvt_bf16_to_f32(h);
}

static int
have_avx2(void)
{
	kvt_simd_cap(KVT_SIMD_AVX512);
	return kvt_simd_level() >= KVT_SIMD_AVX2;
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t
hw_f32_to_f16(float f)
{
	return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("f16c"))) static float
hw_f16_to_f32(uint16_t h)
{
	return _cvtsh_ss(h);
}
#endif

START_TEST(test_f16_vs_f16c)
{
#if defined(__x86_64__)
	if (kvt_simd_level() < KVT_SIMD_AVX2) { /* the AVX2 level includes F16C */
		printf("check_quant: no F16C, conversion test skipped\n");
		return;
	}
	for (uint32_t h = 0; h < 65536; h++)
		REQ_EQ(f2u(kvt_f16_to_f32((uint16_t)h)), f2u(hw_f16_to_f32((uint16_t)h)));
	/* every f32 exponent with random mantissas, plus neighbourhoods of the boundaries */
	for (uint32_t e = 0; e < 256; e++)
		for (int t = 0; t < 2000; t++) {
			uint32_t u = e << 23 | (uint32_t)(rnd() & 0x807fffffu);
			float f = u2f(u);

			REQ_MSG(kvt_f32_to_f16(f) == hw_f32_to_f16(f), "f32 %08x", u);
		}
	{
		const uint32_t edge[] = {0x477ff000, 0x477fefff, 0x477fe000, 0x38800000, 0x387fffff,
					 0x33000000, 0x33000001, 0x32ffffff, 0x7f800000, 0x7fc00000,
					 0x7f800001, 0xffc00000, 0x00000001, 0x80000000};

		for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++)
			for (int d = -3; d <= 3; d++) {
				float f = u2f(edge[i] + (uint32_t)d);

				REQ_MSG(kvt_f32_to_f16(f) == hw_f32_to_f16(f), "f32 %08x",
					edge[i] + (uint32_t)d);
			}
	}
#endif
}
END_TEST

START_TEST(test_bf16)
{
	REQ_EQ(kvt_f32_to_bf16(1.0f), 0x3f80);
	REQ_EQ(kvt_f32_to_bf16(u2f(0x3f808000)), 0x3f80); /* tie -> even */
	REQ_EQ(kvt_f32_to_bf16(u2f(0x3f818000)), 0x3f82); /* tie -> even */
	REQ_EQ(kvt_f32_to_bf16(u2f(0x3f808001)), 0x3f81);
	REQ_EQ(kvt_f32_to_bf16(u2f(0x7f7fffff)), 0x7f80); /* rounds to Inf */
	REQ_EQ(kvt_f32_to_bf16(NAN) & 0x7fc0, 0x7fc0);
	for (uint32_t h = 0; h < 65536; h++) {
		uint32_t e = (h >> 7) & 0xff, m = h & 0x7f;

		if (e == 0xff && m && !(m & 0x40))
			continue; /* signalling NaN: comes back quiet */
		REQ_EQ(kvt_f32_to_bf16(kvt_bf16_to_f32((uint16_t)h)), h);
	}
}
END_TEST

/* Rows for the exactness test: gaussian, with some groups zero, tiny, huge, Inf and NaN. */
static void
fill_rows(int dtype, void *rows, size_t nrows, uint32_t elems, uint32_t hd)
{
	size_t esz = kvt_dtype_size((uint32_t)dtype);

	for (size_t r = 0; r < nrows; r++)
		for (uint32_t c = 0; c < elems; c++) {
			float v = gauss() * (c % 17 == 3 ? 20.0f : 1.0f);
			uint32_t g = (uint32_t)((r * 7 + c / hd) % 11);

			if (g == 1)
				v = 0.0f;
			else if (g == 2)
				v *= 1e-38f;
			else if (g == 3 && c % hd == hd / 2)
				v = (r & 1) ? INFINITY : NAN;
			else if (g == 4)
				v *= dtype == KVT_DTYPE_F16 ? 3000.0f : 1e30f;
			put(dtype, (char *)rows + (r * elems) * esz, c, v);
		}
}

START_TEST(test_simd_exact)
{
	const uint32_t hds[] = {1, 7, 8, 64, 128, 130};
	const uint32_t heads[] = {1, 3};
	const size_t nrows = 37;

	if (!have_avx2()) {
		printf("check_quant: no AVX2, scalar/AVX2 comparison skipped\n");
		return;
	}
	for (int dtype = 0; dtype < KVT_DTYPE__COUNT; dtype++)
		for (size_t hi = 0; hi < 2; hi++)
			for (size_t di = 0; di < sizeof(hds) / sizeof(hds[0]); di++) {
				uint32_t H = heads[hi], D = hds[di], E = H * D;
				size_t esz = kvt_dtype_size((uint32_t)dtype), rb = E * esz;
				char *rows = malloc(nrows * rb);
				int8_t *c[2];
				float *s[2], *sc[2];
				char *d[2];

				fill_rows(dtype, rows, nrows, E, D);
				for (int lv = 0; lv < 2; lv++) {
					c[lv] = malloc(nrows * E);
					s[lv] = malloc(nrows * H * 4);
					sc[lv] = malloc(E * 4);
					d[lv] = malloc(nrows * rb);
					kvt_simd_cap(lv ? KVT_SIMD_AVX2 : KVT_SIMD_SCALAR);
					REQ_EQ(kvt_simd_level(),
					       lv ? KVT_SIMD_AVX2 : KVT_SIMD_SCALAR);
					REQ_EQ(kvt_quant_rows(dtype, H, D, rows, rb, nrows, c[lv],
							      s[lv]),
					       0);
					REQ_EQ(kvt_dequant_rows(dtype, H, D, c[lv], s[lv], nrows,
								d[lv], rb),
					       0);
				}
				REQ_MSG(!memcmp(c[0], c[1], nrows * E), "head codes dt=%d D=%u",
					dtype, D);
				REQ_MSG(!memcmp(s[0], s[1], nrows * H * 4), "head scales");
				REQ_MSG(!memcmp(d[0], d[1], nrows * rb), "head dequant");
				for (int lv = 0; lv < 2; lv++) {
					kvt_simd_cap(lv ? KVT_SIMD_AVX2 : KVT_SIMD_SCALAR);
					REQ_EQ(kvt_quant_block_ch(dtype, E, rows, rb, nrows, c[lv],
								  sc[lv]),
					       0);
					REQ_EQ(kvt_dequant_block_ch(dtype, E, c[lv], sc[lv], nrows,
								    d[lv], rb),
					       0);
				}
				REQ_MSG(!memcmp(c[0], c[1], nrows * E), "channel codes");
				REQ_MSG(!memcmp(sc[0], sc[1], E * 4), "channel scales");
				REQ_MSG(!memcmp(d[0], d[1], nrows * rb), "channel dequant");
				for (int lv = 0; lv < 2; lv++) {
					free(c[lv]);
					free(s[lv]);
					free(sc[lv]);
					free(d[lv]);
				}
				free(rows);
			}
	kvt_simd_cap(KVT_SIMD_AVX512);
}
END_TEST

/* Per element: |x - deq| <= scale / 2 plus the rounding into the dtype. */
START_TEST(test_error_bound)
{
	const uint32_t H = 4, D = 64, E = H * D;
	const size_t nrows = 50;
	float *rows = malloc(nrows * E * 4), *back = malloc(nrows * E * 4), *scales;
	int8_t *codes = malloc(nrows * E);

	scales = malloc(nrows * H * 4);
	for (size_t i = 0; i < nrows * E; i++)
		rows[i] = gauss() * 3.0f;
	rows[5] = 0.0f;
	REQ_EQ(kvt_quant_rows(KVT_DTYPE_F32, H, D, rows, E * 4, nrows, codes, scales), 0);
	REQ_EQ(kvt_dequant_rows(KVT_DTYPE_F32, H, D, codes, scales, nrows, back, E * 4), 0);
	for (size_t r = 0; r < nrows; r++)
		for (uint32_t c = 0; c < E; c++) {
			float x = rows[r * E + c], y = back[r * E + c], s = scales[r * H + c / D];

			REQ(codes[r * E + c] >= -127 && codes[r * E + c] <= 127);
			REQ_MSG(fabsf(x - y) <= 0.5f * s * 1.0001f, "r=%zu c=%u x=%g y=%g s=%g", r,
				c, x, y, s);
		}
	/* the largest magnitude of each group maps to +-127 */
	for (size_t r = 0; r < nrows; r++)
		for (uint32_t h = 0; h < H; h++) {
			int mx = 0;

			for (uint32_t j = 0; j < D; j++)
				mx = abs(codes[r * E + h * D + j]) > mx
					 ? abs(codes[r * E + h * D + j])
					 : mx;
			REQ_EQ(mx, 127);
		}
	/* f16 rows: the dequantized value is also rounded to f16 (relative 2^-11) */
	{
		uint16_t *h = malloc(nrows * E * 2), *hb = malloc(nrows * E * 2);

		for (size_t i = 0; i < nrows * E; i++)
			put(KVT_DTYPE_F16, h, i, rows[i]);
		REQ_EQ(kvt_quant_rows(KVT_DTYPE_F16, H, D, h, E * 2, nrows, codes, scales), 0);
		REQ_EQ(kvt_dequant_rows(KVT_DTYPE_F16, H, D, codes, scales, nrows, hb, E * 2), 0);
		for (size_t i = 0; i < nrows * E; i++) {
			float x = get(KVT_DTYPE_F16, h, i), y = get(KVT_DTYPE_F16, hb, i);
			float s = scales[i / D];

			REQ(fabsf(x - y) <= 0.5f * s * 1.0001f + fabsf(y) * 0x1p-11f);
		}
		free(h);
		free(hb);
	}
	free(rows);
	free(back);
	free(scales);
	free(codes);
}
END_TEST

/* Keys with outlier channels: per-channel scales must beat per-head scales (KIVI's point). */
START_TEST(test_channel_outliers)
{
	const uint32_t H = 2, D = 64, E = H * D;
	const size_t nrows = KVT_QUANT_KEY_BLOCK;
	float rows[KVT_QUANT_KEY_BLOCK * 128], back[KVT_QUANT_KEY_BLOCK * 128];
	float hs[KVT_QUANT_KEY_BLOCK * 2], cs[128];
	int8_t codes[KVT_QUANT_KEY_BLOCK * 128];
	double eh = 0, ec = 0, ref = 0;

	for (size_t r = 0; r < nrows; r++)
		for (uint32_t c = 0; c < E; c++)
			rows[r * E + c] =
			    gauss() * (c % 32 == 5 ? 40.0f : 1.0f) + (c % 32 == 5 ? 60.0f : 0.0f);
	REQ_EQ(kvt_quant_rows(KVT_DTYPE_F32, H, D, rows, E * 4, nrows, codes, hs), 0);
	REQ_EQ(kvt_dequant_rows(KVT_DTYPE_F32, H, D, codes, hs, nrows, back, E * 4), 0);
	for (size_t i = 0; i < nrows * E; i++) {
		eh += (double)(rows[i] - back[i]) * (rows[i] - back[i]);
		ref += (double)rows[i] * rows[i];
	}
	REQ_EQ(kvt_quant_block_ch(KVT_DTYPE_F32, E, rows, E * 4, nrows, codes, cs), 0);
	REQ_EQ(kvt_dequant_block_ch(KVT_DTYPE_F32, E, codes, cs, nrows, back, E * 4), 0);
	for (size_t i = 0; i < nrows * E; i++)
		ec += (double)(rows[i] - back[i]) * (rows[i] - back[i]);
	printf("check_quant: outlier keys, relative L2 error per-head %.3e, per-channel %.3e\n",
	       sqrt(eh / ref), sqrt(ec / ref));
	REQ(ec < eh);
	REQ(sqrt(ec / ref) < 1e-2);
}
END_TEST

START_TEST(test_special_groups)
{
	float row[16] = {0}, back[16];
	int8_t codes[16];
	float scales[2];

	/* zero group, then a group with a NaN */
	for (int i = 8; i < 16; i++)
		row[i] = (float)i;
	row[12] = NAN;
	REQ_EQ(kvt_quant_rows(KVT_DTYPE_F32, 2, 8, row, 64, 1, codes, scales), 0);
	REQ(scales[0] == 0.0f);
	REQ(isnan(scales[1]));
	for (int i = 0; i < 16; i++)
		REQ_EQ(codes[i], 0);
	REQ_EQ(kvt_dequant_rows(KVT_DTYPE_F32, 2, 8, codes, scales, 1, back, 64), 0);
	for (int i = 0; i < 8; i++)
		REQ(back[i] == 0.0f && !signbit(back[i]));
	for (int i = 8; i < 16; i++)
		REQ(isnan(back[i]));
}
END_TEST

START_TEST(test_gather)
{
	const size_t sizes[] = {256, 48, 4096, 3};
	const size_t nsrc = 2000, nidx = 5000; /* 256-byte rows: > 1 MiB, streaming stores */
	uint32_t *idx = malloc(nidx * 4);

	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
		for (int dense = 0; dense < 2; dense++)
			for (int lv = 0; lv < 2; lv++) {
				size_t rb = sizes[si], stride = dense ? rb : rb + 64;
				unsigned char *src = malloc(nsrc * stride),
					      *dst = malloc(nidx * rb);

				if (lv && !have_avx2())
					continue;
				kvt_simd_cap(lv ? KVT_SIMD_AVX2 : KVT_SIMD_SCALAR);
				for (size_t i = 0; i < nsrc * stride; i++)
					src[i] = (unsigned char)rnd();
				for (size_t i = 0; i < nidx; i++)
					/* runs of consecutive rows mixed with random ones */
					idx[i] = (i % 10 < 4 && i) ? (idx[i - 1] + 1) % nsrc
								   : (uint32_t)(rnd() % nsrc);
				REQ_EQ(kvt_gather_rows(dst, src, stride, idx, nidx, rb), 0);
				for (size_t i = 0; i < nidx; i++)
					REQ(!memcmp(dst + i * rb, src + idx[i] * stride, rb));
				free(src);
				free(dst);
			}
	kvt_simd_cap(KVT_SIMD_AVX512);
	free(idx);
}
END_TEST

/* kvt_to_f32: every f16 and bf16 bit pattern, unaligned, a tail of 3, at both SIMD levels, gives
 * the scalar conversion's bits; f32 is copied as is. */
START_TEST(test_to_f32)
{
	const size_t n = 65536 + 3;
	uint16_t *h = malloc((n + 1) * sizeof(*h));
	float *out = malloc((n + 1) * sizeof(*out));

	for (size_t i = 0; i < n; i++)
		h[i + 1] = (uint16_t)i;
	for (int lv = 0; lv < 2; lv++) {
		kvt_simd_cap(lv ? KVT_SIMD_AVX2 : KVT_SIMD_SCALAR);
		ck_assert_int_eq(kvt_to_f32(KVT_DTYPE_F16, h + 1, n, out + 1), 0);
		for (size_t i = 0; i < n; i++) {
			float want = kvt_f16_to_f32(h[i + 1]);

			ck_assert_mem_eq(&out[i + 1], &want, sizeof(want));
		}
		ck_assert_int_eq(kvt_to_f32(KVT_DTYPE_BF16, h + 1, n, out + 1), 0);
		for (size_t i = 0; i < n; i++) {
			float want = kvt_bf16_to_f32(h[i + 1]);

			ck_assert_mem_eq(&out[i + 1], &want, sizeof(want));
		}
		ck_assert_int_eq(kvt_to_f32(KVT_DTYPE_F32, h + 1, 7, out + 1), 0);
		ck_assert_mem_eq(out + 1, h + 1, 7 * sizeof(float));
	}
	kvt_simd_cap(KVT_SIMD_AVX512);
	ck_assert_int_eq(kvt_to_f32(KVT_DTYPE__COUNT, h, 1, out), -EINVAL);
	ck_assert_int_eq(kvt_to_f32(KVT_DTYPE_F16, NULL, 1, out), -EINVAL);
	ck_assert_int_eq(kvt_to_f32(KVT_DTYPE_F16, NULL, 0, NULL), 0);
	free(h);
	free(out);
}
END_TEST

START_TEST(test_errors)
{
	float row[8] = {0}, sc[1];
	int8_t codes[8];
	uint32_t idx[1] = {0};

	REQ_EQ(kvt_quant_rows(7, 1, 8, row, 32, 1, codes, sc), -EINVAL);
	REQ_EQ(kvt_quant_rows(KVT_DTYPE_F32, 1, 0, row, 32, 1, codes, sc), -EINVAL);
	REQ_EQ(kvt_quant_rows(KVT_DTYPE_F32, 1, 8, row, 16, 1, codes, sc), -EINVAL);
	REQ_EQ(kvt_quant_rows(KVT_DTYPE_F32, 1, 8, NULL, 32, 1, codes, sc), -EINVAL);
	REQ_EQ(kvt_quant_rows(KVT_DTYPE_F32, 1, 8, NULL, 32, 0, NULL, NULL), 0);
	REQ_EQ(kvt_dequant_rows(KVT_DTYPE_F16, 1, 8, codes, sc, 1, row, 8), -EINVAL);
	REQ_EQ(kvt_quant_block_ch(KVT_DTYPE_F32, 0, row, 32, 1, codes, sc), -EINVAL);
	REQ_EQ(kvt_dequant_block_ch(-1, 8, codes, sc, 1, row, 32), -EINVAL);
	REQ_EQ(kvt_gather_rows(row, row, 4, idx, 1, 0), -EINVAL);
	REQ_EQ(kvt_gather_rows(row, row, 4, idx, 1, 8), -EINVAL);
	REQ_EQ(kvt_gather_rows(NULL, row, 8, idx, 1, 8), -EINVAL);
}
END_TEST

KVT_CHECK_MAIN("quant", 60, NULL, NULL, test_f16_vs_f16c, test_bf16, test_simd_exact,
	       test_error_bound, test_channel_outliers, test_special_groups, test_gather,
	       test_to_f32, test_errors)
