/* SPDX-License-Identifier: MIT */
/*
 * TOPK after heavy eviction, through a real kvtierd: RETIER drops the evicted keys from the
 * retrieval index, so every kv head still returns k positions while at least k live keys remain,
 * none of them evicted, on the refine and the estimate path, per kv head and per query head.
 */
#define _GNU_SOURCE
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvtier.h"
#include "kvt_test.h"

enum { L = 1, H = 2, QH = 4, D = 64, S = 4, W = 64, U = 32, N_TOK = 4096, K = 64 };
#define ROW   (H * D)
#define TOK   (L * 2 * ROW)
#define EVICT 0.95f
/* RETIER evicts floor(EVICT * N_TOK) of the positions between the sinks and the window, lowest
 * score first and the older first on ties: everything before FIRST_LIVE. */
#define FIRST_LIVE (S + (uint32_t)(EVICT * N_TOK))
/* the retrieval zone: U * floor((N_TOK - S - W) / U) keys from S on */
#define ZONE_END (S + U * ((N_TOK - S - W) / U))

static struct kvtd_proc Dm;

/*
 * 95 % evicted, the oldest first: 109 live keys in a zone of 4000. The index used to keep the
 * evicted keys as candidates and drop them afterwards, so a search's 1200-2000 candidates held
 * only some 30-55 live keys and a head returned fewer than k = 64; now they are out of the zone.
 */
START_TEST(t_evicted_count)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	static float keys[(size_t)TOK * N_TOK], w[N_TOK], q[QH * D];
	static uint8_t out[H * 4 + H * 2 * K * 8], rt[1 << 16];
	const uint32_t *n = (const void *)out, *pos = n + H;
	struct kvt_seq_stat st;
	struct kvt_client *c;
	uint64_t rng = 5;
	uint32_t seq;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	p.layers = L;
	p.kv_heads = H;
	p.q_heads = QH;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.evict_frac = EVICT;
	p.hbm_frac = 1.0f - EVICT;
	p.delta = 64;
	p.sinks = S;
	p.window = W;
	p.ret_update = U;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	for (size_t i = 0; i < (size_t)TOK * N_TOK; i++)
		keys[i] = kvt_test_lcg_gauss(&rng) * (i % D == 3 ? 6.0f : 1.0f);
	for (uint32_t t = 0; t < N_TOK; t += 256)
		ck_assert_int_eq(
		    kvt_append(c, seq, keys + (size_t)t * TOK, 256ull * TOK * 4, 256, NULL),
		    t + 256);
	for (uint32_t i = 0; i < N_TOK; i++) /* the newest tenth matter */
		w[i] = i < N_TOK - N_TOK / 10 ? 0.0f : 1.0f;
	ck_assert_int_eq(kvt_score_add(c, seq, 0, w, N_TOK), 0);
	ck_assert_int_gt(kvt_retier(c, seq, rt, sizeof(rt)), 0);
	ck_assert_int_eq(kvt_seq_stat(c, seq, &st), 0);
	ck_assert_uint_eq(st.tier_count[3], FIRST_LIVE - S);

	/* the zero query, then a random one; refine and estimate; GQA mean and union */
	for (int trial = 0; trial < 2; trial++) {
		for (int i = 0; i < QH * D; i++)
			q[i] = trial ? kvt_test_lcg_gauss(&rng) : 0.0f;
		for (unsigned flags = 0; flags < 4; flags++) {
			unsigned f = (flags & 1 ? KVT_TOPK_F_ESTIMATE : 0) |
				     (flags & 2 ? KVT_TOPK_F_UNION : 0);
			int stride = kvt_topk(c, seq, 0, K, f, q, QH * D, out, sizeof(out));

			ck_assert_msg(stride >= K, "trial %d flags %#x: %s", trial, f,
				      kvt_strerror(stride));
			for (uint32_t h = 0; h < H; h++) {
				ck_assert_msg(n[h] >= K, "trial %d flags %#x head %u: %u of %d",
					      trial, f, h, n[h], K);
				for (uint32_t j = 0; j < n[h]; j++) {
					uint32_t ps = pos[h * stride + j];

					ck_assert_uint_ge(ps, FIRST_LIVE);
					ck_assert_uint_lt(ps, ZONE_END);
				}
			}
		}
	}
	kvt_disconnect(c);
}
END_TEST

static void
up(void)
{
	const char *extra[] = {"--pool-size", "256M", NULL};

	daemon_start(&Dm, extra);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

KVT_CHECK_MAIN("topk_evict", 120, up, down, t_evicted_count)
