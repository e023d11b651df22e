/* SPDX-License-Identifier: MIT */
/* Unit tests for engine/srht.c: the fixed +-1 diagonal and the Walsh-Hadamard rotation. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "srht.h"
#include "test_req.h"
#include "kvt_test.h"

START_TEST(test_init_dims)
{
	struct kvt_srht s;

	ck_assert_int_eq(kvt_srht_init(&s, 64, KVT_SRHT_SEED), 0);
	ck_assert_uint_eq(s.dim, 64);
	ck_assert_int_eq(kvt_srht_init(&s, 128, KVT_SRHT_SEED), 0);
	ck_assert_uint_eq(s.dim, 128);
	s.dim = 7;
	ck_assert_int_eq(kvt_srht_init(&s, 96, 1), -EINVAL);
	ck_assert_int_eq(kvt_srht_init(&s, 0, 1), -EINVAL);
	ck_assert_int_eq(kvt_srht_init(&s, 256, 1), -EINVAL);
	ck_assert_uint_eq(s.dim, 7); /* untouched on failure */
}
END_TEST

START_TEST(test_signs_fixed)
{
	struct kvt_srht a, b, c;
	int plus = 0, diff = 0;

	kvt_srht_init(&a, 128, KVT_SRHT_SEED);
	kvt_srht_init(&b, 128, KVT_SRHT_SEED);
	kvt_srht_init(&c, 128, KVT_SRHT_SEED + 1);
	ck_assert_mem_eq(a.sign, b.sign, sizeof(a.sign));
	for (int i = 0; i < 128; i++) {
		ck_assert(a.sign[i] == 1.0f || a.sign[i] == -1.0f);
		plus += a.sign[i] > 0;
		diff += a.sign[i] != c.sign[i];
	}
	/* a fair +-1 draw: far from all-equal, and another seed gives another diagonal */
	ck_assert_int_gt(plus, 40);
	ck_assert_int_lt(plus, 88);
	ck_assert_int_gt(diff, 30);
}
END_TEST

/* The transform must equal its dense definition (1/sqrt d) sum_j (-1)^popcount(i&j) D_j x_j. */
START_TEST(test_matches_definition)
{
	static const unsigned int dims[] = {64, 128};

	test_rng_state = 11;
	for (int di = 0; di < 2; di++) {
		unsigned int d = dims[di];
		struct kvt_srht s;
		float x[128], y[128];

		kvt_srht_init(&s, d, KVT_SRHT_SEED);
		for (unsigned int i = 0; i < d; i++)
			x[i] = test_grand();
		kvt_srht_apply(&s, x, y);
		for (unsigned int i = 0; i < d; i++) {
			double ref = 0.0;

			for (unsigned int j = 0; j < d; j++)
				ref +=
				    (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) * s.sign[j] * x[j];
			ref /= sqrt((double)d);
			ck_assert_double_eq_tol(y[i], ref, 1e-5);
		}
	}
}
END_TEST

START_TEST(test_orthonormal)
{
	static const unsigned int dims[] = {64, 128};

	for (int di = 0; di < 2; di++) {
		unsigned int d = dims[di];
		static float col[128][128];
		struct kvt_srht s;

		kvt_srht_init(&s, d, KVT_SRHT_SEED);
		for (unsigned int j = 0; j < d; j++) {
			float e[128] = {0};

			e[j] = 1.0f;
			kvt_srht_apply(&s, e, col[j]);
		}
		for (unsigned int a = 0; a < d; a++) {
			for (unsigned int b = 0; b < d; b++) {
				double g = 0.0;

				for (unsigned int i = 0; i < d; i++)
					g += (double)col[a][i] * col[b][i];
				ck_assert_double_eq_tol(g, a == b ? 1.0 : 0.0, 1e-6);
			}
		}
	}
}
END_TEST

START_TEST(test_round_trip)
{
	struct kvt_srht s;
	float x[128], y[128], z[128];

	test_rng_state = 12;
	kvt_srht_init(&s, 128, KVT_SRHT_SEED);
	for (int rep = 0; rep < 100; rep++) {
		double nx = 0.0, ny = 0.0;

		for (int i = 0; i < 128; i++)
			x[i] = 10.0f * test_grand();
		kvt_srht_apply(&s, x, y);
		kvt_srht_inverse(&s, y, z);
		for (int i = 0; i < 128; i++) {
			ck_assert_float_eq_tol(z[i], x[i], 1e-4f * (1.0f + fabsf(x[i])));
			nx += (double)x[i] * x[i];
			ny += (double)y[i] * y[i];
		}
		ck_assert_double_eq_tol(sqrt(ny), sqrt(nx), 1e-5 * sqrt(nx));
		/* in place gives the same bytes */
		memcpy(z, x, sizeof(x));
		kvt_srht_apply(&s, z, z);
		ck_assert_mem_eq(z, y, sizeof(y));
	}
}
END_TEST

START_TEST(test_simd_bit_identical)
{
	test_rng_state = 13;
	if (kvt_simd_level() < KVT_SIMD_AVX2)
		return; /* nothing to compare on this CPU */
	for (int rep = 0; rep < 200; rep++) {
		unsigned int d = rep & 1 ? 64 : 128;
		float a[128], b[128];

		for (unsigned int i = 0; i < d; i++)
			a[i] = b[i] = test_grand() * (rep % 7 == 0 ? 1e6f : 1.0f);
		kvt_fwht_scalar(a, d);
		kvt_fwht_avx2(b, d);
		ck_assert_mem_eq(a, b, d * sizeof(float));
	}
}
END_TEST

START_TEST(test_save_load)
{
	struct kvt_srht s, t;
	uint8_t buf[128], small[63];

	kvt_srht_init(&s, 128, 77);
	ck_assert_int_eq(kvt_srht_save(&s, small, sizeof(small)), -ENOSPC);
	ck_assert_int_eq(kvt_srht_save(&s, buf, sizeof(buf)), 128);
	for (int i = 0; i < 128; i++)
		ck_assert(buf[i] == 0x01 || buf[i] == 0xff);
	ck_assert_int_eq(kvt_srht_load(buf, 128, &t), 0);
	ck_assert_uint_eq(t.dim, 128);
	ck_assert_mem_eq(s.sign, t.sign, sizeof(s.sign));
	ck_assert(s.scale == t.scale);

	kvt_srht_init(&s, 64, 78);
	ck_assert_int_eq(kvt_srht_save(&s, buf, sizeof(buf)), 64);
	ck_assert_int_eq(kvt_srht_load(buf, 64, &t), 0);
	ck_assert_mem_eq(s.sign, t.sign, 64 * sizeof(float));

	memset(&t, 0x5a, sizeof(t));
	ck_assert_int_eq(kvt_srht_load(buf, 100, &t), -EINVAL);
	buf[5] = 0x00;
	ck_assert_int_eq(kvt_srht_load(buf, 64, &t), -EINVAL);
	ck_assert_uint_eq(t.dim, 0x5a5a5a5a); /* untouched on failure */
}
END_TEST

static Suite *
srht_suite(void)
{
	Suite *s = suite_create("srht");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_init_dims);
	tcase_add_test(tc, test_signs_fixed);
	tcase_add_test(tc, test_matches_definition);
	tcase_add_test(tc, test_orthonormal);
	tcase_add_test(tc, test_round_trip);
	tcase_add_test(tc, test_simd_bit_identical);
	tcase_add_test(tc, test_save_load);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	return kvt_check_run(srht_suite());
}
