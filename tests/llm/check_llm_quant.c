/* SPDX-License-Identifier: MIT */
/*
 * Weight formats: f16 conversion on every half, dequantization of Q4_0 / Q4_1 / Q8_0 / F16 / F32
 * blocks against the ggml formulas written out here element by element, and the scalar and AVX2
 * dot products against a double-precision dot of the dequantized row.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "llm_quant.h"
#include "simd.h"
#include "kvt_test.h"

START_TEST(test_f16_all)
{
	for (uint32_t h = 0; h < 65536; h++) {
		float f = llm_f16_to_f32((uint16_t)h);
		uint32_t exp = (h >> 10) & 31, man = h & 1023;

		if (exp == 31 && man) {
			ck_assert(isnan(f));
			continue;
		}
		/* Reference value: (-1)^s * 2^(e-15) * (1 + m/1024), or the subnormal form. */
		{
			double ref =
			    exp ? ldexp(1.0 + man / 1024.0, (int)exp - 15) : ldexp(man, -24);

			if (exp == 31)
				ref = INFINITY;
			if (h & 0x8000)
				ref = -ref;
			ck_assert_msg((double)f == ref, "half 0x%04x: %g != %g", h, f, ref);
		}
		ck_assert_uint_eq(llm_f32_to_f16(f), h);
	}
	/* Rounding: halfway cases go to even, overflow to inf, tiny to zero. */
	ck_assert_uint_eq(llm_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	ck_assert_uint_eq(llm_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
	ck_assert_uint_eq(llm_f32_to_f16(70000.0f), 0x7c00);
	ck_assert_uint_eq(llm_f32_to_f16(-1e-10f), 0x8000);
}
END_TEST

/* Deterministic pseudo-random bytes and floats. */
static uint32_t rng_state = 12345;

static uint32_t
rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 17;
	rng_state ^= rng_state << 5;
	return rng_state;
}

static float
rndf(void)
{
	return (float)(rnd() % 20001) / 10000.0f - 1.0f;
}

#define NB 12 /* blocks per test row */
#define N  (NB * QK)

START_TEST(test_dequant_known_blocks)
{
	struct block_q4_0 q40 = {.d = llm_f32_to_f16(0.5f)};
	struct block_q4_1 q41 = {.d = llm_f32_to_f16(2.0f), .m = llm_f32_to_f16(-3.0f)};
	struct block_q8_0 q80 = {.d = llm_f32_to_f16(0.25f)};
	float out[QK];

	for (int j = 0; j < 16; j++) {
		q40.qs[j] = (uint8_t)(j | (15 - j) << 4);
		q41.qs[j] = (uint8_t)(j | (15 - j) << 4);
	}
	for (int j = 0; j < QK; j++)
		q80.qs[j] = (int8_t)(j * 8 - 128);

	llm_dequant_row(GGML_TYPE_Q4_0, &q40, out, QK);
	for (int j = 0; j < 16; j++) {
		ck_assert(out[j] == 0.5f * (float)(j - 8));
		ck_assert(out[j + 16] == 0.5f * (float)(15 - j - 8));
	}
	llm_dequant_row(GGML_TYPE_Q4_1, &q41, out, QK);
	for (int j = 0; j < 16; j++) {
		ck_assert(out[j] == 2.0f * (float)j - 3.0f);
		ck_assert(out[j + 16] == 2.0f * (float)(15 - j) - 3.0f);
	}
	llm_dequant_row(GGML_TYPE_Q8_0, &q80, out, QK);
	for (int j = 0; j < QK; j++)
		ck_assert(out[j] == 0.25f * (float)(j * 8 - 128));
}
END_TEST

/* Random rows of each type, as bytes; scales are kept in a sane range. */
static void
fill_row(uint32_t type, void *row)
{
	switch (type) {
	case GGML_TYPE_F32:
		for (int i = 0; i < N; i++)
			((float *)row)[i] = rndf();
		break;
	case GGML_TYPE_F16:
		for (int i = 0; i < N; i++) {
			uint16_t h = llm_f32_to_f16(rndf());

			memcpy((uint8_t *)row + 2 * i, &h, 2);
		}
		break;
	case GGML_TYPE_Q4_0:
		for (int b = 0; b < NB; b++) {
			struct block_q4_0 *q = (struct block_q4_0 *)row + b;

			q->d = llm_f32_to_f16(rndf() * 0.1f);
			for (int j = 0; j < 16; j++)
				q->qs[j] = (uint8_t)rnd();
		}
		break;
	case GGML_TYPE_Q4_1:
		for (int b = 0; b < NB; b++) {
			struct block_q4_1 *q = (struct block_q4_1 *)row + b;

			q->d = llm_f32_to_f16(rndf() * 0.1f);
			q->m = llm_f32_to_f16(rndf());
			for (int j = 0; j < 16; j++)
				q->qs[j] = (uint8_t)rnd();
		}
		break;
	case GGML_TYPE_Q8_0:
		for (int b = 0; b < NB; b++) {
			struct block_q8_0 *q = (struct block_q8_0 *)row + b;

			q->d = llm_f32_to_f16(rndf() * 0.01f);
			for (int j = 0; j < QK; j++)
				q->qs[j] = (int8_t)rnd();
		}
		break;
	}
}

/* The ggml formulas, element by element, independent of llm_dequant_row's loops. */
static float
ref_elem(uint32_t type, const void *row, int i)
{
	int b = i / QK, j = i % QK;

	switch (type) {
	case GGML_TYPE_F32:
		return ((const float *)row)[i];
	case GGML_TYPE_F16: {
		uint16_t h;

		memcpy(&h, (const uint8_t *)row + 2 * i, 2);
		return llm_f16_to_f32(h);
	}
	case GGML_TYPE_Q4_0: {
		const struct block_q4_0 *q = (const struct block_q4_0 *)row + b;
		int v = j < 16 ? q->qs[j] & 15 : q->qs[j - 16] >> 4;

		return llm_f16_to_f32(q->d) * (float)(v - 8);
	}
	case GGML_TYPE_Q4_1: {
		const struct block_q4_1 *q = (const struct block_q4_1 *)row + b;
		int v = j < 16 ? q->qs[j] & 15 : q->qs[j - 16] >> 4;

		return llm_f16_to_f32(q->d) * (float)v + llm_f16_to_f32(q->m);
	}
	case GGML_TYPE_Q8_0: {
		const struct block_q8_0 *q = (const struct block_q8_0 *)row + b;

		return llm_f16_to_f32(q->d) * (float)q->qs[j];
	}
	}
	return NAN;
}

static const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
				 GGML_TYPE_Q8_0};

START_TEST(test_dequant_and_dot)
{
	uint32_t type = types[_i];
	uint8_t row[N * 4];
	float x[N], deq[N];

	ck_assert(llm_type_supported(type));
	ck_assert_uint_eq(llm_row_bytes(type, N),
			  (size_t)N / ggml_blck_size(type) * ggml_type_size(type));
	for (int trial = 0; trial < 50; trial++) {
		double ref = 0.0, mag = 0.0;

		fill_row(type, row);
		for (int i = 0; i < N; i++)
			x[i] = rndf();
		llm_dequant_row(type, row, deq, N);
		for (int i = 0; i < N; i++) {
			ck_assert_msg(deq[i] == ref_elem(type, row, i), "%s element %d",
				      ggml_type_name(type), i);
			ref += (double)deq[i] * x[i];
			mag += fabs((double)deq[i] * x[i]);
		}
		/* f32 accumulation in a different order: agree to a few ulps of the magnitude. */
		for (int simd = KVT_SIMD_SCALAR;
		     simd <= (int)kvt_simd_level() && simd <= KVT_SIMD_AVX2; simd++) {
			float d = llm_dot(simd, type, row, x, N);

			ck_assert_msg(fabs(d - ref) <= 1e-5 * mag + 1e-6, "%s simd %d: %g vs %g",
				      ggml_type_name(type), simd, d, ref);
		}
	}
}
END_TEST

START_TEST(test_matvec_rows)
{
	struct llm_mat w = {.type = GGML_TYPE_Q4_1, .rows = 7, .cols = N};
	uint8_t *data = malloc(7 * llm_row_bytes(GGML_TYPE_Q4_1, N));
	float x[N], y[7], y2[7];

	w.row_bytes = llm_row_bytes(GGML_TYPE_Q4_1, N);
	for (int r = 0; r < 7; r++)
		fill_row(GGML_TYPE_Q4_1, data + r * w.row_bytes);
	w.data = data;
	for (int i = 0; i < N; i++)
		x[i] = rndf();
	/* A split into row ranges gives the same bits as one call: rows are independent. */
	llm_matvec(&w, x, y, 0, 7);
	llm_matvec(&w, x, y2, 0, 3);
	llm_matvec(&w, x, y2, 3, 7);
	ck_assert_mem_eq(y, y2, sizeof(y));
	for (int r = 0; r < 7; r++)
		ck_assert(y[r] == llm_dot(kvt_simd_level() >= KVT_SIMD_AVX2 ? KVT_SIMD_AVX2 : 0,
					  GGML_TYPE_Q4_1, data + r * w.row_bytes, x, N));
	free(data);
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("llm_quant");
	TCase *tc = tcase_create("quant");

	tcase_add_test(tc, test_f16_all);
	tcase_add_test(tc, test_dequant_known_blocks);
	tcase_add_loop_test(tc, test_dequant_and_dot, 0, sizeof(types) / sizeof(types[0]));
	tcase_add_test(tc, test_matvec_rows);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
