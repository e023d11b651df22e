/* SPDX-License-Identifier: MIT */
/* Unit tests for engine/select: radix selection against a sort-based reference. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "select.h"

#include "test_req.h"
#include "kvt_test.h"

static uint64_t rng_state;

static uint64_t
rnd(void)
{
	return kvt_test_splitmix(&rng_state);
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Reference: full sort on (score key, position), take an end. Output sorted by position. */
static void
ref_select(const float *score, const uint32_t *cand, size_t ncand, size_t m, int top, uint32_t *out)
{
	uint64_t *k = malloc(ncand * sizeof(*k) + 1);
	size_t i;

	for (i = 0; i < ncand; i++)
		k[i] = (uint64_t)kvt_score_key(score[cand[i]]) << 32 | cand[i];
	qsort(k, ncand, sizeof(*k), cmp_u64);
	for (i = 0; i < m; i++)
		out[i] = (uint32_t)(top ? k[ncand - m + i] : k[i]);
	qsort(out, m, sizeof(*out), cmp_u32);
	free(k);
}

enum { DIST_UNIFORM, DIST_FEW, DIST_SAME, DIST_SPECIAL, DIST__COUNT };

static float
gen_score(int dist)
{
	static const float special[] = {0.0f, -0.0f, 1.0f,   -1.0f,   INFINITY, -INFINITY,
					NAN,  -NAN,  1e-40f, -1e-40f, 3.5f,	3.5f};

	switch (dist) {
	case DIST_UNIFORM:
		return (float)(rnd() >> 40) / (float)(1u << 24);
	case DIST_FEW:
		return (float)(rnd() % 7);
	case DIST_SAME:
		return 0.25f;
	default:
		return special[rnd() % (sizeof(special) / sizeof(special[0]))];
	}
}

/* Runs both directions for one candidate set and compares with the reference. */
static void
check_one(const float *score, uint32_t *cand, size_t ncand, size_t m)
{
	size_t sz = kvt_select_scratch_bytes(ncand);
	void *scratch = aligned_alloc(64, sz);
	uint32_t *got = malloc((m + 1) * sizeof(*got)), *want = malloc((m + 1) * sizeof(*want));
	int top, r;

	ck_assert_ptr_nonnull(scratch);
	for (top = 0; top < 2; top++) {
		r = top ? kvt_select_top(score, cand, ncand, m, scratch, sz, got)
			: kvt_select_bottom(score, cand, ncand, m, scratch, sz, got);
		REQ_EQ(r, (int)m);
		qsort(got, m, sizeof(*got), cmp_u32);
		ref_select(score, cand, ncand, m, top, want);
		REQ_MSG(!memcmp(got, want, m * sizeof(*got)),
			"top=%d ncand=%zu m=%zu differs from the sort reference", top, ncand, m);
	}
	free(scratch);
	free(got);
	free(want);
}

static void
shuffle(uint32_t *a, size_t n)
{
	for (size_t i = n; i > 1; i--) {
		size_t j = rnd() % i;
		uint32_t t = a[i - 1];

		a[i - 1] = a[j];
		a[j] = t;
	}
}

START_TEST(test_key_order)
{
	const float v[] = {-INFINITY, -3.0f, -1e-40f, 0.0f, 1e-40f, 2.0f, INFINITY};
	size_t i;

	for (i = 1; i < sizeof(v) / sizeof(v[0]); i++)
		REQ_LT(kvt_score_key(v[i - 1]), kvt_score_key(v[i]));
	REQ_EQ(kvt_score_key(-0.0f), kvt_score_key(0.0f));
	REQ_EQ(kvt_score_key(NAN), 0);
	REQ_EQ(kvt_score_key(-NAN), 0);
	REQ_LT(kvt_score_key(NAN), kvt_score_key(-INFINITY));
}
END_TEST

START_TEST(test_kth)
{
	static uint32_t keys[70000], sorted[70000], surv[70000], hist[KVT_SELECT_HIST];
	const size_t sizes[] = {1, 2, 3, 255, 256, 1000, 16383, 16384, 70000};

	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		size_t n = sizes[si];

		for (int dist = 0; dist < 4; dist++) {
			for (size_t i = 0; i < n; i++)
				keys[i] = dist == 0   ? (uint32_t)rnd()
					  : dist == 1 ? (uint32_t)(rnd() % 5) << 30
					  : dist == 2 ? 0x80000000u
						      : (uint32_t)(rnd() % 3) * 0x01010101u;
			memcpy(sorted, keys, n * sizeof(*keys));
			qsort(sorted, n, sizeof(*sorted), cmp_u32);
			for (int t = 0; t < 8; t++) {
				size_t k = t == 0   ? 0
					   : t == 1 ? n - 1
						    : rnd() % n,
				       less, want_less = 0;
				uint32_t v = kvt_select_kth(keys, n, k, surv, hist, &less);

				REQ_EQ(v, sorted[k]);
				while (want_less < n && sorted[want_less] < v)
					want_less++;
				REQ_EQ(less, want_less);
			}
		}
	}
}
END_TEST

START_TEST(test_random_vs_sort)
{
	const size_t sizes[] = {1, 2, 5, 64, 1000, 20000, 40000};

	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		size_t n = sizes[si];
		float *score = malloc(2 * n * sizeof(*score));
		uint32_t *cand = malloc(n * sizeof(*cand));

		for (int dist = 0; dist < DIST__COUNT; dist++) {
			for (size_t i = 0; i < 2 * n; i++)
				score[i] = gen_score(dist);
			/* every other position is a candidate, ascending then shuffled */
			for (size_t i = 0; i < n; i++)
				cand[i] = (uint32_t)(2 * i + (rnd() & 1));
			for (int order = 0; order < 2; order++) {
				const size_t ms[] = {0, 1, n / 3, n / 2, n - 1, n, rnd() % (n + 1)};

				if (order)
					shuffle(cand, n);
				for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++)
					check_one(score, cand, n, ms[mi]);
			}
		}
		free(score);
		free(cand);
	}
}
END_TEST

START_TEST(test_one_million)
{
	const size_t n = 1u << 20;
	float *score = malloc(n * sizeof(*score));
	uint32_t *cand = malloc(n * sizeof(*cand));

	/* heavy-tailed, with ties: cumulative-attention-like values on a coarse grid */
	for (size_t i = 0; i < n; i++) {
		double u = (double)(rnd() >> 11) / 9007199254740992.0;

		score[i] = (float)(floor(-log(1.0 - u) * 64.0) / 64.0);
		cand[i] = (uint32_t)i;
	}
	check_one(score, cand, n, n / 2);
	check_one(score, cand, n, n / 33);
	free(score);
	free(cand);
}
END_TEST

START_TEST(test_ties_go_to_older)
{
	float score[6] = {1, 1, 1, 1, 1, 1};
	uint32_t cand[6] = {5, 3, 1, 0, 2, 4}, out[6];
	size_t sz = kvt_select_scratch_bytes(6);
	void *scratch = aligned_alloc(64, sz);

	/* equal scores: the older (lower) positions rank lower */
	REQ_EQ(kvt_select_bottom(score, cand, 6, 2, scratch, sz, out), 2);
	qsort(out, 2, sizeof(*out), cmp_u32);
	REQ_EQ(out[0], 0);
	REQ_EQ(out[1], 1);
	REQ_EQ(kvt_select_top(score, cand, 6, 2, scratch, sz, out), 2);
	qsort(out, 2, sizeof(*out), cmp_u32);
	REQ_EQ(out[0], 4);
	REQ_EQ(out[1], 5);
	/* NaN ranks below everything */
	score[4] = NAN;
	REQ_EQ(kvt_select_bottom(score, cand, 6, 1, scratch, sz, out), 1);
	REQ_EQ(out[0], 4);
	free(scratch);
}
END_TEST

START_TEST(test_errors)
{
	float score[4] = {0};
	uint32_t cand[4] = {0, 1, 2, 3}, out[4];
	size_t sz = kvt_select_scratch_bytes(4);
	void *scratch = aligned_alloc(64, sz);

	REQ_EQ(kvt_select_top(score, cand, 4, 5, scratch, sz, out), -EINVAL);
	REQ_EQ(kvt_select_top(score, cand, 4, 2, scratch, sz - 1, out), -EINVAL);
	REQ_EQ(kvt_select_bottom(NULL, cand, 4, 2, scratch, sz, out), -EINVAL);
	REQ_EQ(kvt_select_bottom(score, cand, 4, 2, scratch, sz, NULL), -EINVAL);
	REQ_EQ(kvt_select_bottom(score, cand, 0, 0, scratch, sz, out), 0);
	free(scratch);
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("select");
	TCase *tc = tcase_create("core");

	rng_state = 0x5eed;
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_key_order);
	tcase_add_test(tc, test_kth);
	tcase_add_test(tc, test_random_vs_sort);
	tcase_add_test(tc, test_one_million);
	tcase_add_test(tc, test_ties_go_to_older);
	tcase_add_test(tc, test_errors);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
