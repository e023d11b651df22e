/* SPDX-License-Identifier: MIT */
/*
 * RETIER's output bound: KVT_RETIER_OUT_SIZE(t0_slots) bytes always hold the reply, under the
 * churn that makes it largest (small T0, no window, re-tiering every other token with scores that
 * reshuffle the top set, so most slots are demoted and refilled in one RETIER). The bound the
 * header used to give, 72 + 12 bytes a slot, is exceeded here.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvtier.h"
#include "kvt_test.h"

enum { L = 1, H = 1, D = 8, SLOTS = 8, DELTA = 2, STEPS = 150 };

static struct kvtd_proc Dm;

static uint32_t
rnd(uint64_t *s)
{
	return (uint32_t)(kvt_test_lcg(s) >> 33);
}

static void
run(uint8_t policy, float hbm, uint64_t *ret_max)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_seq_params p = {.size = sizeof(p)};
	uint8_t out[KVT_RETIER_OUT_SIZE(SLOTS)];
	const struct kvt_retier_result *res = (const void *)out;
	uint32_t free_slots[SLOTS], n_free = 0, next = 0;
	float w[STEPS];
	struct kvt_client *c;
	struct kvt_buf *t0;
	uint64_t rng = 7;
	uint32_t seq;
	int r;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_buf_alloc(c, (size_t)SLOTS * 2 * D * 4, &t0), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = policy;
	p.delta = DELTA;
	p.hbm_frac = hbm;
	p.t0_buf_id = kvt_buf_id(t0);
	p.t0_slots = SLOTS;
	p.t0_slot_stride = D * 4;
	p.t0_kv_stride = (uint64_t)SLOTS * D * 4;
	p.t0_layer_stride = 2ull * SLOTS * D * 4;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	for (uint32_t n = 0; n < STEPS; n++) {
		if (next == n_free) {
			r = kvt_retier(c, seq, out, sizeof(out));
			ck_assert_msg(r > 0, "RETIER at n = %u: %s", n, kvt_strerror(r));
			if ((uint64_t)r > *ret_max)
				*ret_max = (uint64_t)r;
			n_free = res->n_free;
			memcpy(free_slots,
			       out + sizeof(*res) + res->n_changes * sizeof(struct kvt_slot_change),
			       n_free * sizeof(uint32_t));
			next = 0;
			ck_assert_uint_gt(n_free, 0);
		}
		ck_assert_int_eq(kvt_append_t0(c, seq, &free_slots[next++], 1), n + 1);
		/* A new favourite set every step, weighted 1.5^n so that it outweighs every earlier
		 * one: each RETIER demotes most of T0 and promotes others. */
		memset(w, 0, sizeof(w));
		for (uint32_t i = 0; i < SLOTS; i++)
			w[rnd(&rng) % (n + 1)] = powf(1.5f, (float)n);
		ck_assert_int_eq(kvt_score_add(c, seq, 0, w, n + 1), 0);
	}
	kvt_disconnect(c);
}

START_TEST(t_retier_out_size_holds)
{
	static const uint8_t policies[] = {KVT_POLICY_TIERED, KVT_POLICY_H2O, KVT_POLICY_FULL};
	uint64_t max = 0;

	for (unsigned i = 0; i < sizeof(policies); i++)
		for (float hbm = 0.25f; hbm <= 1.0f; hbm += 0.25f)
			run(policies[i], hbm, &max);
	/* The churn reached past the old 12-bytes-a-slot bound: the test exercises the case. */
	ck_assert_uint_gt(max, sizeof(struct kvt_retier_result) + 12 * SLOTS);
	ck_assert_uint_le(max, KVT_RETIER_OUT_SIZE(SLOTS));
}
END_TEST

static void
up(void)
{
	daemon_start(&Dm, NULL);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

KVT_CHECK_MAIN("retier_size", 120, up, down, t_retier_out_size_holds)
