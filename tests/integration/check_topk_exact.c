/* SPDX-License-Identifier: MIT */
/*
 * TOPK's scores through a real kvtierd are the exact inner products it promises (kvt_abi.h,
 * KVT_OP_TOPK): without KVT_TOPK_F_ESTIMATE every returned score is <key at that position, the
 * mean of the kv head's query heads> in f32, for every returned position, down to float
 * rounding. A refine stage that rescored all but one candidate would leave that one at its
 * 4-bit estimate; with k up to the whole retrieval zone every candidate is returned, so no
 * candidate can hide. With KVT_TOPK_F_UNION the score is the product with one of the group's
 * query heads.
 *
 * The tolerance is the rounding of the daemon's f32 arithmetic, derived, not chosen: the mean
 * of G query values summed in order, then divided, is off by at most (G + 1) u sum_j |q_j| / G
 * per element (u = 2^-24); the dot product over D elements summed in 8 lanes of D / 8 terms,
 * then a 3-level pairwise reduction, is off by at most (D / 8 + 4) u sum_i |k_i| |qbar_i| (one
 * rounding per product, one per addition along each term's path; an FMA only removes
 * roundings). The reference is computed in double from the same f32 inputs, exactly enough.
 * Twice the sum of both bounds is allowed. The 4-bit estimates are off by percents.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvtier.h"
#include "kvt_test.h"

enum { L = 2, H = 2, QH = 4, G = QH / H, D = 64, S = 4, W = 16, U = 16 };
#define ROW	(H * D)
#define TOK	(L * 2 * ROW)
#define MAX_TOK 20480
#define U_ROUND (1.0 / 16777216.0) /* 2^-24, the unit roundoff of f32 */

static struct kvtd_proc Dm;

struct fixture {
	struct kvt_client *c;
	uint32_t seq, n;
	uint64_t rng;
	float *ref; /* [MAX_TOK][TOK] */
};

static void
fixture_open(struct fixture *f)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};

	memset(f, 0, sizeof(*f));
	f->rng = 2026;
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &f->c), 0);
	p.layers = L;
	p.kv_heads = H;
	p.q_heads = QH;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 64;
	p.sinks = S;
	p.window = W;
	p.hbm_frac = 1.0f;
	p.ret_update = U;
	ck_assert_int_eq(kvt_seq_open(f->c, &p, &f->seq), 0);
	f->ref = malloc(sizeof(float) * TOK * MAX_TOK);
	ck_assert_ptr_nonnull(f->ref);
	/* Keys with outlier channels, as real keys have: the estimates are then visibly off. */
	for (uint64_t i = 0; i < (uint64_t)TOK * MAX_TOK; i++)
		f->ref[i] = kvt_test_lcg_gauss(&f->rng) * (i % D == 3 || i % D == 17 ? 5.0f : 1.0f);
}

static void
fixture_close(struct fixture *f)
{
	kvt_disconnect(f->c);
	free(f->ref);
}

/* Appends tokens up to @n; returns the retrieval zone's size (keys that left the window,
 * encoded U at a time). */
static uint32_t
grow_to(struct fixture *f, uint32_t n)
{
	ck_assert_uint_le(n, MAX_TOK);
	while (f->n < n) { /* 2048 tokens (4 MiB) at a time: the arena's size bounds one APPEND */
		uint32_t m = n - f->n < 2048 ? n - f->n : 2048;

		ck_assert_int_eq(kvt_append(f->c, f->seq, f->ref + (uint64_t)f->n * TOK,
					    (uint64_t)m * TOK * 4, m, NULL),
				 f->n + m);
		f->n += m;
	}
	return U * ((n - S - W) / U);
}

static const float *
key(const struct fixture *f, uint32_t pos, uint32_t layer, uint32_t h)
{
	return f->ref + (uint64_t)pos * TOK + 2 * layer * ROW + h * D;
}

/* Exact <k, q> in double and the f32 rounding bound of the daemon's computation of it, for the
 * group mean of @nq query heads starting at @q. */
static double
exact_dot(const float *k, const float *q, unsigned nq, double *ret_tol)
{
	double dot = 0, mag = 0;

	for (int i = 0; i < D; i++) {
		double mean = 0, abs_sum = 0;

		for (unsigned j = 0; j < nq; j++) {
			mean += q[j * D + i];
			abs_sum += fabs(q[j * D + i]);
		}
		mean /= nq;
		dot += (double)k[i] * mean;
		mag += fabs((double)k[i]) * (fabs(mean) * (D / 8 + 4) + abs_sum / nq * (nq + 1)) *
		       U_ROUND;
	}
	*ret_tol = 2 * mag + 1e-30;
	return dot;
}

/*
 * One TOPK of @k on @layer: the counts, positions and the exact score of every returned
 * position (one of the group's heads with @flags KVT_TOPK_F_UNION). Returns the worst
 * |score - exact| / tolerance seen.
 */
static double
topk_check(struct fixture *f, uint32_t zone, uint32_t layer, uint32_t k, unsigned flags)
{
	static float q[QH * D];
	static uint8_t out[H * 4 + H * MAX_TOK * G * 8];
	const uint32_t stride = flags & KVT_TOPK_F_UNION ? k * G : k;
	const uint32_t *n = (const void *)out, *pos = n + H;
	const float *score = (const float *)(pos + H * stride);
	double worst = 0;
	int r;

	for (int i = 0; i < QH * D; i++)
		q[i] = kvt_test_lcg_gauss(&f->rng);
	r = kvt_topk(f->c, f->seq, layer, k, flags, q, QH * D, out, sizeof(out));
	ck_assert_msg(r == (int)stride, "TOPK k %u: %d (%s)", k, r, kvt_strerror(r));
	for (uint32_t h = 0; h < H; h++) {
		uint8_t seen[MAX_TOK] = {0};

		/* nothing evicted: k of them, or the union of the group's k each */
		if (flags & KVT_TOPK_F_UNION)
			ck_assert(n[h] >= k && n[h] <= stride);
		else
			ck_assert_uint_eq(n[h], k);
		for (uint32_t j = 0; j < n[h]; j++) {
			uint32_t p = pos[h * stride + j];
			float got = score[h * stride + j];
			double tol, e, best = INFINITY;

			ck_assert_uint_ge(p, S);
			ck_assert_uint_lt(p, S + zone);
			ck_assert_msg(!seen[p], "position %u returned twice", p);
			seen[p] = 1;
			if (!(flags & KVT_TOPK_F_UNION)) {
				e = exact_dot(key(f, p, layer, h), q + h * G * D, G, &tol);
				best = fabs(got - e) / tol;
				ck_assert_msg(best <= 1.0,
					      "layer %u head %u k %u: position %u (rank %u) scored "
					      "%.9g, exact %.9g (tolerance %.3g)",
					      layer, h, k, p, j, got, e, tol);
			} else {
				for (uint32_t g = 0; g < G; g++) {
					e = exact_dot(key(f, p, layer, h), q + (h * G + g) * D, 1,
						      &tol);
					best = fmin(best, fabs(got - e) / tol);
				}
				ck_assert_msg(best <= 1.0,
					      "union: position %u scored %.9g, no query head of "
					      "the group gives that",
					      p, got);
			}
			worst = fmax(worst, best);
			if (j && !(flags & KVT_TOPK_F_UNION))
				ck_assert(score[h * stride + j - 1] >= got);
		}
	}
	return worst;
}

/* A zone of 64 keys, then of 2016: every k from 1 to the whole zone. */
START_TEST(t_scores_exact)
{
	static const uint32_t sizes[] = {S + W + 64, 2048};
	struct fixture f;
	double worst = 0;
	unsigned checked = 0;

	fixture_open(&f);
	for (unsigned z = 0; z < 2; z++) {
		uint32_t zone = grow_to(&f, sizes[z]);
		const uint32_t ks[] = {1,	 2,	   7,	zone / 8, zone / 4, zone / 4 + 1,
				       zone / 2, zone - 1, zone};

		for (unsigned i = 0; i < sizeof(ks) / sizeof(ks[0]); i++)
			for (uint32_t layer = 0; layer < L; layer++) {
				worst = fmax(worst, topk_check(&f, zone, layer, ks[i], 0));
				checked += H * ks[i];
			}
	}
	fprintf(stderr, "TOPK exact scores: %u checked, worst error %.3g of the tolerance\n",
		checked, worst);
	fixture_close(&f);
}
END_TEST

START_TEST(t_union_scores_exact)
{
	struct fixture f;
	uint32_t zone;

	fixture_open(&f);
	zone = grow_to(&f, 512);
	for (uint32_t k = 1; k <= zone; k = k * 3 + 1)
		topk_check(&f, zone, k % L, k, KVT_TOPK_F_UNION);
	topk_check(&f, zone, 1, zone, KVT_TOPK_F_UNION);
	fixture_close(&f);
}
END_TEST

static int
cmp_desc(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

/*
 * Past the refine stage's reach (a zone of 20448 keys: past 16K the index path estimates only a
 * share of them and rescores 4k = 400), while the zone's key rows (5 MiB of f32) fit
 * KVT_PARIS_EXACT_BYTES: the daemon scores every key from the pool, so the positions are
 * exactly the true top k for every query.
 */
START_TEST(t_whole_zone_exact)
{
	enum { K = 100, QUERIES = 12 };
	static double all[MAX_TOK];
	struct fixture f;
	uint32_t zone;

	fixture_open(&f);
	zone = grow_to(&f, MAX_TOK);
	for (int t = 0; t < QUERIES; t++) {
		static float q[QH * D];
		static uint8_t out[H * 4 + H * K * 8];
		const uint32_t *n = (const void *)out, *pos = n + H;
		uint32_t layer = (uint32_t)t % L;

		for (int i = 0; i < QH * D; i++)
			q[i] = kvt_test_lcg_gauss(&f.rng);
		ck_assert_int_eq(kvt_topk(f.c, f.seq, layer, K, 0, q, QH * D, out, sizeof(out)), K);
		for (uint32_t h = 0; h < H; h++) {
			double tol, kth;

			for (uint32_t p = 0; p < zone; p++)
				all[p] =
				    exact_dot(key(&f, S + p, layer, h), q + h * G * D, G, &tol);
			qsort(all, zone, sizeof(all[0]), cmp_desc);
			kth = all[K - 1];
			ck_assert_uint_eq(n[h], K);
			for (uint32_t j = 0; j < K; j++) {
				double e = exact_dot(key(&f, pos[h * K + j], layer, h),
						     q + h * G * D, G, &tol);

				ck_assert_msg(e >= kth - tol,
					      "query %d head %u: position %u (%.9g) is not in the "
					      "top %d (the %dth is %.9g)",
					      t, h, pos[h * K + j], e, K, K, kth);
			}
		}
	}
	fixture_close(&f);
}
END_TEST

static void
up(void)
{
	const char *const extra[] = {"--pool-size", "192M", NULL};

	daemon_start(&Dm, extra);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

KVT_CHECK_MAIN("topk_exact", 120, up, down, t_scores_exact, t_union_scores_exact,
	       t_whole_zone_exact)
