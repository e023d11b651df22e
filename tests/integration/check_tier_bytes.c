/* SPDX-License-Identifier: MIT */
/*
 * kvtier_tier_bytes_total{from, to}: the bytes that move between tiers, as an operator reads
 * them, equal what the ops moved: APPEND's rows into T1, RETIER's int8 rows into T2, FETCH's
 * rows from T1 and from T2 (dequantized) to the device.
 */
#define _GNU_SOURCE
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"
#include "kvt_test.h"
#include "kvtier.h"

enum { L = 2, H = 1, D = 16, N = 64, ROW = H * D * 4, TOKEN = L * 2 * ROW };

static struct kvtd_proc Dm;

/* The value of the sample @series ("name{labels}") in kvtierctl metrics' output, -1 if none. */
static int64_t
metric(const char *series)
{
	char cmd[512], line[1024];
	int64_t v = -1;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "%s --socket %s metrics", getenv("KVTIERCTL"), Dm.sock);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	while (fgets(line, sizeof(line), p))
		if (!strncmp(line, series, strlen(series)) && line[strlen(series)] == ' ')
			v = strtoll(line + strlen(series) + 1, NULL, 10);
	ck_assert_int_eq(WEXITSTATUS(pclose(p)), 0);
	return v;
}

START_TEST(t_tier_bytes)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_seq_params p = {.size = sizeof(p)};
	static float rows[N * TOKEN / 4], w[N];
	static uint8_t out[4096];
	uint32_t pos[N], seq;
	struct kvt_seq_stat st;
	struct kvt_client *c;
	struct kvt_buf *stage;
	uint64_t rng = 11;
	int n1, n2;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_buf_alloc(c, (size_t)L * 2 * N * ROW, &stage), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 8;
	p.t2_frac = 0.25f;
	p.stage_buf_id = kvt_buf_id(stage);
	p.stage_slots = N;
	p.stage_slot_stride = ROW;
	p.stage_kv_stride = (uint64_t)N * ROW;
	p.stage_layer_stride = 2ull * N * ROW;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		rows[i] = kvt_test_lcg_gauss(&rng);
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), N, NULL), N);
	for (int i = 0; i < N; i++)
		w[i] = (float)(i % 7);
	ck_assert_int_eq(kvt_score_add(c, seq, 0, w, N), 0);
	ck_assert_int_gt(kvt_retier(c, seq, out, sizeof(out)), 0);
	ck_assert_int_eq(kvt_seq_stat(c, seq, &st), 0);
	ck_assert_uint_gt(st.tier_count[2], 0);
	n1 = kvt_fetch(c, seq, KVT_FETCH_F_T1, 0, L, 0, pos, N);
	n2 = kvt_fetch(c, seq, KVT_FETCH_F_T2, 0, L, 0, pos, N);
	ck_assert_int_eq(n1, (int)st.tier_count[1]);
	ck_assert_int_eq(n2, (int)st.tier_count[2]);

	ck_assert_int_eq(metric("kvtier_tier_bytes_total{from=\"client\",to=\"t1\"}"), N * TOKEN);
	/* int8 rows: more than a byte per element, less than the f32 row they replace */
	ck_assert_int_gt(metric("kvtier_tier_bytes_total{from=\"t1\",to=\"t2\"}"),
			 (int64_t)st.tier_count[2] * TOKEN / 4);
	ck_assert_int_lt(metric("kvtier_tier_bytes_total{from=\"t1\",to=\"t2\"}"),
			 (int64_t)st.tier_count[2] * TOKEN);
	ck_assert_int_eq(metric("kvtier_tier_bytes_total{from=\"t1\",to=\"device\"}"),
			 (int64_t)n1 * L * 2 * ROW);
	ck_assert_int_eq(metric("kvtier_tier_bytes_total{from=\"t2\",to=\"device\"}"),
			 (int64_t)n2 * L * 2 * ROW);
	kvt_disconnect(c);
	/* Folded into the daemon's totals when the session ends: nothing lost. */
	ck_assert_int_eq(metric("kvtier_tier_bytes_total{from=\"client\",to=\"t1\"}"), N * TOKEN);
	ck_assert_int_eq(metric("kvtier_tier_bytes_total{from=\"t2\",to=\"device\"}"),
			 (int64_t)n2 * L * 2 * ROW);
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

KVT_CHECK_MAIN("tier_bytes", 120, up, down, t_tier_bytes)
