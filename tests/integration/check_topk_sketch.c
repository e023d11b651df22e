/* SPDX-License-Identifier: MIT */
/*
 * TOPK through a real kvtierd on a retrieval zone past KVT_PARIS_EXACT_BYTES (69,888 keys of
 * 128 f32: 34 MiB of rows, where the engine would otherwise estimate and rescore 4k): the
 * positions are the exact top k, through the int8 sketch, for every query; and still after
 * RETIER quantized half the zone to int8 (per-channel key scales), against the keys as FETCH
 * stages them, dequantized, which is what the exact stage reads; and after a restart in place,
 * which encodes the zone again from the pool. The sketch's pages are charged to the pool and
 * all given back. With [retrieval] sketch = no a sequence has no sketch pages, for life (a
 * restart in place under a config saying yes keeps it so), and TOPK on the same zone rescores
 * the index's best estimates: high recall, not the exact top k for every query.
 * KVT_TOPK_F_FAST (the sketch's sign level choosing 16k keys to score) returns nearly the exact
 * top k with exact scores; without a sketch the default path answers it.
 *
 * The reference is computed in double from the same f32 values, with the daemon's f32
 * rounding as the tolerance (check_topk_exact.c derives it): a returned position must score
 * at least the true k-th less that.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

enum { H = 1, QH = 2, G = QH / H, D = 128, S = 4, W = 64, U = 64, N_TOK = 70000, K = 100 };
enum { STAGE = 4096 };	  /* staging rows: FETCH F_LIST 4096 positions at a time */
#define ROW	(H * D)	  /* floats per (token, K|V) */
#define TOK	(2 * ROW) /* one layer */
#define ZONE	(U * ((N_TOK - S - W) / U))
#define U_ROUND (1.0 / 16777216.0)

static struct kvtd_proc Dm;

struct fixture {
	struct kvt_client *c;
	struct kvt_buf *stage;
	uint32_t seq;
	uint64_t rng;
	float *ref; /* [N_TOK][TOK]: as appended */
	float *key; /* [ZONE][D]: zone keys as the daemon holds them (dequantized once int8) */
	/* 0: every TOPK must be the exact top k; 1: count the positions that are not */
	int lenient;
	uint32_t missed, returned;
};

static void
fixture_open(struct fixture *f)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};

	memset(f, 0, sizeof(*f));
	f->rng = 4242;
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &f->c), 0);
	ck_assert_int_eq(kvt_buf_alloc(f->c, 2ull * STAGE * ROW * 4, &f->stage), 0);
	p.layers = 1;
	p.kv_heads = H;
	p.q_heads = QH;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 64;
	p.sinks = S;
	p.window = W;
	p.hbm_frac = 0.0f;
	p.t2_frac = 0.5f;
	p.t2_flags = KVT_T2_F_KEY_CHANNEL;
	p.ret_update = U;
	p.stage_buf_id = kvt_buf_id(f->stage);
	p.stage_slots = STAGE;
	p.stage_slot_stride = ROW * 4;
	p.stage_kv_stride = (uint64_t)STAGE * ROW * 4;
	p.stage_layer_stride = 2 * p.stage_kv_stride;
	ck_assert_int_eq(kvt_seq_open(f->c, &p, &f->seq), 0);
	f->ref = malloc(sizeof(float) * TOK * N_TOK);
	f->key = malloc(sizeof(float) * D * ZONE);
	ck_assert(f->ref && f->key);
	/* keys with outlier channels and per-token scales, as real keys have */
	for (uint64_t t = 0; t < N_TOK; t++)
		for (uint32_t i = 0; i < TOK; i++)
			f->ref[t * TOK + i] = kvt_test_lcg_gauss(&f->rng) *
					      (i % 37 == 5 ? 6.0f : 1.0f) * (1.0f + (t % 5) * 0.2f);
	for (uint32_t t = 0; t < N_TOK;) { /* 4096 tokens (4 MiB) an APPEND: the arena's size */
		uint32_t m = N_TOK - t < 4096 ? N_TOK - t : 4096;

		ck_assert_int_eq(kvt_append(f->c, f->seq, f->ref + (uint64_t)t * TOK,
					    (uint64_t)m * TOK * 4, m, NULL),
				 t + m);
		t += m;
	}
	for (uint32_t i = 0; i < ZONE; i++)
		memcpy(f->key + (uint64_t)i * D, f->ref + (uint64_t)(S + i) * TOK, D * 4);
}

static void
fixture_close(struct fixture *f)
{
	kvt_disconnect(f->c);
	free(f->ref);
	free(f->key);
}

/* <k, mean of the group's query heads> in double, and the daemon's f32 rounding bound of it. */
static double
exact_dot(const float *k, const float *q, double *ret_tol)
{
	double dot = 0, mag = 0;

	for (int i = 0; i < D; i++) {
		double mean = 0, abs_sum = 0;

		for (unsigned j = 0; j < G; j++) {
			mean += q[j * D + i];
			abs_sum += fabs(q[j * D + i]);
		}
		mean /= G;
		dot += (double)k[i] * mean;
		mag += fabs((double)k[i]) * (fabs(mean) * (D / 8 + 4) + abs_sum / G * (G + 1)) *
		       U_ROUND;
	}
	*ret_tol = 2 * mag + 1e-30;
	return dot;
}

static int
cmp_desc(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

/* One TOPK of @q (op_flags @flags): every returned position scores at least the true k-th
 * (over f->key) less the rounding, with its exact score, and none twice. Returns how many
 * returned positions @mark names. */
static uint32_t
topk_exact(struct fixture *f, const float *q, const uint8_t *mark, unsigned flags)
{
	static double all[ZONE];
	static uint8_t out[H * 4 + H * K * 8];
	static uint8_t seen[ZONE];
	const uint32_t *n = (const void *)out, *pos = n + H;
	const float *score = (const float *)(pos + H * K);
	uint32_t marked = 0;
	double tol, kth;
	int r;

	r = kvt_topk(f->c, f->seq, 0, K, flags, q, QH * D, out, sizeof(out));
	ck_assert_msg(r == K, "TOPK: %d (%s)", r, kvt_strerror(r));
	ck_assert_uint_eq(n[0], K);
	for (uint32_t i = 0; i < ZONE; i++)
		all[i] = exact_dot(f->key + (uint64_t)i * D, q, &tol);
	qsort(all, ZONE, sizeof(all[0]), cmp_desc);
	kth = all[K - 1];
	memset(seen, 0, sizeof(seen));
	for (uint32_t j = 0; j < K; j++) {
		uint32_t p = pos[j];
		double e;

		ck_assert_uint_ge(p, S);
		ck_assert_uint_lt(p, S + ZONE);
		ck_assert_msg(!seen[p - S], "position %u returned twice", p);
		seen[p - S] = 1;
		e = exact_dot(f->key + (uint64_t)(p - S) * D, q, &tol);
		ck_assert_msg(fabs(score[j] - e) <= tol + 1e-6 * fabs(e),
			      "position %u: score %.9g, exact %.9g", p, (double)score[j], e);
		ck_assert_msg(f->lenient || e >= kth - tol,
			      "position %u (%.9g) is not in the top %d (the %dth is %.9g)", p, e, K,
			      K, kth);
		f->missed += e < kth - tol;
		f->returned++;
		marked += mark && mark[p - S];
	}
	return marked;
}

/* A random query, or every query head near the key of zone index @near (when < ZONE). */
static void
query(struct fixture *f, uint32_t near, float *q)
{
	for (int i = 0; i < QH * D; i++)
		q[i] = (near < ZONE ? f->key[(uint64_t)near * D + i % D] : 0.0f) +
		       kvt_test_lcg_gauss(&f->rng) * (near < ZONE ? 0.5f : 1.0f);
}

static void
write_conf(const char *path, const char *sketch)
{
	FILE *c = fopen(path, "w");

	ck_assert_ptr_nonnull(c);
	fprintf(c, "[retrieval]\nsketch = %s\n", sketch);
	ck_assert_int_eq(fclose(c), 0);
}

static void
restart(struct kvtd_proc *d)
{
	struct json_object *o = admin_request(d->sock, KVT_CTL_RESTART), *v;

	ck_assert_msg(o, "no reply to RESTART (log %s)", d->log);
	ck_assert_msg(json_object_object_get_ex(o, "restarted", &v) && json_object_get_boolean(v),
		      "RESTART: %s", json_object_to_json_string(o));
	json_object_put(o);
	ck_assert(daemon_alive(d));
}

START_TEST(t_exact_past_the_scan)
{
	static uint8_t out[1 << 16];
	static uint8_t int8[ZONE];
	static float score[N_TOK], q[QH * D];
	struct kvt_seq_stat st;
	int64_t used0 = pool_used(Dm.sock);
	struct fixture f;
	uint32_t n_int8 = 0, hits = 0;

	fixture_open(&f);
	ck_assert_int_eq(kvt_seq_stat(f.c, f.seq, &st), 0);
	ck_assert_uint_eq(st.n_tokens, N_TOK);
	/* the pool holds the rows (1 KiB slots) and per kv head ceil(ZONE / 4096) index pages
	 * (9 * 16 bytes a key) and as many sketch pages (128 + 8 bytes a key, 32 + 4 for the
	 * 2-bit level, its centre, and D + 8 bytes for each 64-key group's mean) */
	ck_assert_int_eq(pool_used(Dm.sock) - used0,
			 (int64_t)N_TOK * TOK * 4 + (int64_t)H * ((ZONE + 4095) / 4096) *
							(4096 * (9 * 16 + D + 8 + D / 4 + 4) +
							 4 * D + 4096 / 64 * (D + 8)));
	/* and SEQ_STAT's pool_bytes counts them all: the sequence holds all of it */
	ck_assert_uint_eq(st.pool_bytes, (uint64_t)(pool_used(Dm.sock) - used0));
	for (int t = 0; t < 8; t++) {
		query(&f, t < 4 ? ZONE : (uint32_t)(kvt_test_lcg(&f.rng) % ZONE), q);
		topk_exact(&f, q, NULL, 0);
	}

	/* the older half is cold: RETIER quantizes it */
	for (uint32_t i = 0; i < N_TOK; i++)
		score[i] = i < N_TOK / 2 ? 0.0f : 1.0f;
	ck_assert_int_eq(kvt_score_add(f.c, f.seq, 0, score, N_TOK), 0);
	ck_assert_int_gt(kvt_retier(f.c, f.seq, out, sizeof(out)), 0);
	ck_assert_int_eq(kvt_seq_stat(f.c, f.seq, &st), 0);
	ck_assert_uint_gt(st.tier_count[2], ZONE / 4);
	ck_assert_uint_eq(st.tier_count[3], 0);
	/* the zone's keys as the daemon holds them now: FETCH stages T2 rows dequantized */
	for (uint32_t i = 0; i < ZONE; i += STAGE) {
		static uint32_t list[STAGE];
		uint32_t m = ZONE - i < STAGE ? ZONE - i : STAGE;

		for (uint32_t j = 0; j < m; j++)
			list[j] = S + i + j;
		ck_assert_int_eq(kvt_fetch(f.c, f.seq, KVT_FETCH_F_LIST, 0, 1, 0, list, m), (int)m);
		for (uint32_t j = 0; j < m; j++) {
			const float *k = (const float *)kvt_buf_ptr(f.stage) + (uint64_t)j * ROW;
			float *mine = f.key + (uint64_t)(i + j) * D;

			int8[i + j] = memcmp(k, mine, D * 4) != 0;
			n_int8 += int8[i + j];
			memcpy(mine, k, D * 4);
		}
	}
	ck_assert_uint_gt(n_int8, ZONE / 4);
	/* random queries, then queries aimed at int8 keys: the int8 keys they find are ranked by
	 * their dequantized values */
	for (int t = 0; t < 12; t++) {
		uint32_t near = ZONE;

		if (t >= 4)
			do
				near = (uint32_t)(kvt_test_lcg(&f.rng) % ZONE);
			while (!int8[near]);
		query(&f, near, q);
		hits += topk_exact(&f, q, int8, 0);
	}
	fprintf(stderr, "TOPK over %u keys (%u int8): %u int8 positions among the results\n", ZONE,
		n_int8, hits);
	ck_assert_uint_gt(hits, 0);
	/* a restart in place encodes the zone again from the pool: still exact */
	restart(&Dm);
	for (int t = 0; t < 6; t++) {
		uint32_t near = ZONE;

		if (t >= 2)
			do
				near = (uint32_t)(kvt_test_lcg(&f.rng) % ZONE);
			while (!int8[near]);
		query(&f, near, q);
		topk_exact(&f, q, int8, 0);
	}
	/* KVT_TOPK_F_FAST: the 16k keys of the best sign-level estimates scored exactly (the sign
	 * level re-encoded from the pool by the restart, int8 keys as they dequantize): nearly
	 * the exact top k, exact scores; not with KVT_TOPK_F_ESTIMATE */
	f.lenient = 1;
	f.missed = f.returned = 0;
	for (int t = 0; t < 8; t++) {
		query(&f, t < 4 ? ZONE : (uint32_t)(kvt_test_lcg(&f.rng) % ZONE), q);
		topk_exact(&f, q, NULL, KVT_TOPK_F_FAST);
	}
	fprintf(stderr, "KVT_TOPK_F_FAST: %u of %u positions returned not in the top %d\n",
		f.missed, f.returned, K);
	ck_assert_uint_le(f.missed, f.returned / 50); /* 7 of 800 here (isotropic keys) */
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, KVT_TOPK_F_FAST | KVT_TOPK_F_ESTIMATE, q,
				  QH * D, out, sizeof(out)),
			 -EINVAL);
	f.lenient = 0;
	/* rows, int8 rows, key-scale blocks, index and sketch pages: all given back */
	ck_assert_int_eq(kvt_seq_close(f.c, f.seq), 0);
	ck_assert_int_eq(pool_used(Dm.sock), used0);
	fixture_close(&f);
}
END_TEST

/* Starts @d with the config file @conf (in its runtime dir) saying [retrieval] sketch = @sketch.
 */
static void
start_with_sketch(struct kvtd_proc *d, char *conf, size_t len, const char *sketch)
{
	const char *const extra[] = {"--pool-size", "512M", "--config", conf, NULL};

	daemon_prepare(d);
	snprintf(conf, len, "%s/kvtierd.conf", d->dir);
	write_conf(conf, sketch);
	daemon_spawn(d, extra);
	daemon_wait_ready(d);
}

/*
 * [retrieval] sketch = no: the same zone, the same queries as t_exact_past_the_scan. The pool
 * holds the rows and the index pages, no sketch page; TOPK goes through the index path (the
 * rows are past the 32 MiB scan), which finds nearly all of the top 100 but not all of them
 * for every query. A restart in place under a config now saying yes keeps the sequence
 * without a sketch (its pool bytes do not move, the same positions are missed), while a
 * sequence opened after it has one.
 */
START_TEST(t_no_sketch_index_path)
{
	static float q[8][QH * D];
	char conf[160];
	struct fixture f;
	struct kvt_seq_stat st;
	struct kvt_seq_params p = {.size = sizeof(p)};
	const uint32_t n_small = S + W + 2 * U;
	int64_t used0, used1;
	uint32_t small_seq, missed;

	/* this test's daemon reads a config file */
	ck_assert_int_eq(daemon_stop(&Dm), 0);
	start_with_sketch(&Dm, conf, sizeof(conf), "no");
	used0 = pool_used(Dm.sock);
	fixture_open(&f);
	f.lenient = 1;
	ck_assert_int_eq(kvt_seq_stat(f.c, f.seq, &st), 0);
	ck_assert_uint_eq(st.n_tokens, N_TOK);
	used1 = pool_used(Dm.sock);
	ck_assert_int_eq(used1 - used0, (int64_t)N_TOK * TOK * 4 +
					    (int64_t)H * ((ZONE + 4095) / 4096) * 4096 * 9 * 16);
	for (int t = 0; t < 8; t++) {
		query(&f, t < 4 ? ZONE : (uint32_t)(kvt_test_lcg(&f.rng) % ZONE), q[t]);
		topk_exact(&f, q[t], NULL, 0);
	}
	fprintf(stderr, "without the sketch: %u of %u positions returned not in the top %d\n",
		f.missed, f.returned, K);
	ck_assert_uint_gt(f.missed, 0);
	ck_assert_uint_le(f.missed, f.returned / 50); /* recall@100 0.98 or better */
	missed = f.missed;
	/* KVT_TOPK_F_FAST needs the sketch: without one the same path answers */
	f.missed = f.returned = 0;
	for (int t = 0; t < 8; t++)
		topk_exact(&f, q[t], NULL, KVT_TOPK_F_FAST);
	ck_assert_uint_eq(f.missed, missed);

	/* the config says yes now; a restart in place leaves this sequence as it was opened */
	write_conf(conf, "yes");
	restart(&Dm);
	ck_assert_int_eq(pool_used(Dm.sock), used1);
	f.missed = f.returned = 0;
	for (int t = 0; t < 8; t++)
		topk_exact(&f, q[t], NULL, 0);
	ck_assert_uint_eq(f.missed, missed);

	/* ... and a sequence opened now has its sketch: one index page and one sketch page */
	p.layers = 1;
	p.kv_heads = H;
	p.q_heads = QH;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 64;
	p.hbm_frac = 1.0f;
	p.sinks = S;
	p.window = W;
	p.ret_update = U;
	ck_assert_int_eq(kvt_seq_open(f.c, &p, &small_seq), 0);
	ck_assert_int_eq(
	    kvt_append(f.c, small_seq, f.ref, (uint64_t)n_small * TOK * 4, n_small, NULL), n_small);
	ck_assert_int_eq(pool_used(Dm.sock) - used1,
			 (int64_t)n_small * TOK * 4 +
			     (4096 * (9 * 16 + D + 8 + D / 4 + 4) + 4 * D + 4096 / 64 * (D + 8)));
	ck_assert_int_eq(kvt_seq_close(f.c, small_seq), 0);
	ck_assert_int_eq(kvt_seq_close(f.c, f.seq), 0);
	ck_assert_int_eq(pool_used(Dm.sock), used0);
	fixture_close(&f);
}
END_TEST

static void
up(void)
{
	const char *const extra[] = {"--pool-size", "512M", NULL};

	daemon_start(&Dm, extra);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

KVT_CHECK_MAIN("topk_sketch", 300, up, down, t_exact_past_the_scan, t_no_sketch_index_path)
