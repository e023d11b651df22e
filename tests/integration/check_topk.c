/* SPDX-License-Identifier: MIT */
/*
 * TOPK through a real kvtierd: keys leave the dense window every U tokens and are encoded; a
 * query retrieves the keys an exact inner-product search would, mostly (recall measured against
 * exact top-k); staged rows are the appended rows; bad requests fail alone.
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

enum { L = 2, H = 2, QH = 4, D = 64, S = 4, W = 64, U = 32, N_TOK = 4096, K = 64 };
#define ROW (H * D)
#define TOK (L * 2 * ROW)

static struct kvtd_proc Dm;

struct fixture {
	struct kvt_client *c;
	struct kvt_buf *stage;
	uint32_t seq;
	float *ref;
};

static void
open_seq_p(struct fixture *f, int retrieval, uint8_t policy, float evict)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	uint64_t rng = 99;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &f->c), 0);
	ck_assert_int_eq(kvt_buf_alloc(f->c, (uint64_t)L * 2 * H * K * ROW * 4, &f->stage), 0);
	p.layers = L;
	p.kv_heads = H;
	p.q_heads = QH;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = policy;
	p.evict_frac = evict;
	p.delta = 64;
	p.sinks = S;
	p.window = W;
	p.hbm_frac = 1.0f - evict;
	p.ret_update = retrieval ? U : 0;
	p.stage_buf_id = kvt_buf_id(f->stage);
	p.stage_slots = H * K;
	p.stage_slot_stride = ROW * 4;
	p.stage_kv_stride = (uint64_t)H * K * ROW * 4;
	p.stage_layer_stride = 2 * p.stage_kv_stride;
	ck_assert_int_eq(kvt_seq_open(f->c, &p, &f->seq), 0);
	f->ref = malloc(sizeof(float) * TOK * N_TOK);
	/* Anisotropic keys with two outlier channels, as real keys have. */
	for (uint64_t i = 0; i < (uint64_t)TOK * N_TOK; i++) {
		uint32_t d = i % D;

		f->ref[i] =
		    kvt_test_lcg_gauss(&rng) * (d == 3 || d == 17 ? 6.0f : 1.0f + (d % 8) * 0.1f);
	}
	for (uint32_t t = 0; t < N_TOK; t += 256)
		ck_assert_int_eq(kvt_append(f->c, f->seq, f->ref + (uint64_t)t * TOK,
					    256ull * TOK * 4, 256, NULL),
				 t + 256);
}

static void
open_seq(struct fixture *f, int retrieval)
{
	open_seq_p(f, retrieval, KVT_POLICY_FULL, 0.0f);
}

static void
close_seq(struct fixture *f)
{
	kvt_disconnect(f->c);
	free(f->ref);
}

/* Every query head near layer @layer's key of @target (its kv head's), plus @noise. */
static void
query_near(const struct fixture *f, uint32_t layer, uint32_t target, float noise, uint64_t *rng,
	   float *q)
{
	for (int h = 0; h < QH; h++)
		for (int d = 0; d < D; d++)
			q[h * D + d] = f->ref[(uint64_t)target * TOK + 2 * layer * ROW +
					      (h / (QH / H)) * D + d] +
				       noise * kvt_test_lcg_gauss(rng);
}

/* Exact <key, mean of kv head h's query heads> over the @nret retrieval-zone keys. */
static void
exact_ip(const struct fixture *f, uint32_t layer, uint32_t h, const float *q, uint32_t nret,
	 float *ip)
{
	float qbar[D];

	for (int d = 0; d < D; d++)
		qbar[d] = (q[(2 * h) * D + d] + q[(2 * h + 1) * D + d]) / 2;
	for (uint32_t i = 0; i < nret; i++) {
		const float *k = f->ref + (uint64_t)(S + i) * TOK + 2 * layer * ROW + h * D;

		ip[i] = 0;
		for (int d = 0; d < D; d++)
			ip[i] += k[d] * qbar[d];
	}
}

START_TEST(t_recall_and_fetch)
{
	struct fixture f;
	static float q[QH * D];
	static uint8_t out[H * 4 + H * K * 8];
	uint32_t nret, found = 0, total = 0;
	uint64_t rng = 7;
	int stride;

	open_seq(&f, 1);
	/* N = U * floor((T - S - W) / U) with no prompt */
	nret = U * ((N_TOK - S - W) / U);
	for (int trial = 0; trial < 8; trial++) {
		uint32_t layer = trial % L;
		const uint32_t *n = (const void *)out, *pos = n + H;
		const float *score = (const float *)(pos + H * K);

		/* A query near a random retrieval-zone key of head 0, plus noise. */
		uint32_t target = S + (uint32_t)(kvt_test_lcg_gauss(&rng) * 1e6f) % nret;

		query_near(&f, layer, target, 0.3f, &rng, q);
		stride =
		    kvt_topk(f.c, f.seq, layer, K, KVT_TOPK_F_FETCH, q, QH * D, out, sizeof(out));
		ck_assert_int_eq(stride, K);
		for (uint32_t h = 0; h < H; h++) {
			static float ip[N_TOK];
			float kth;
			uint32_t better;

			ck_assert_uint_eq(n[h], K);
			/* exact: <k, mean of the group's queries>, over the retrieval zone */
			exact_ip(&f, layer, h, q, nret, ip);
			for (uint32_t j = 0; j < K; j++) {
				uint32_t p = pos[h * K + j];

				ck_assert_uint_ge(p, S);
				ck_assert_uint_lt(p, S + nret);
				/* staged row = the appended row of that position */
				ck_assert(
				    !memcmp((float *)kvt_buf_ptr(f.stage) +
						((uint64_t)(layer * 2) * H * K + h * K + j) * ROW,
					    f.ref + (uint64_t)p * TOK + 2 * layer * ROW, ROW * 4));
			}
			/* kvtierd refines 4K candidates exactly: the scores are <k, qbar> */
			for (uint32_t j = 0; j < K; j++) {
				float e = ip[pos[h * K + j] - S];

				ck_assert_msg(fabsf(score[h * K + j] - e) <=
						  1e-3f * (1.0f + fabsf(e)),
					      "score %g exact %g", score[h * K + j], e);
			}
			/* recall@K: how many returned keys are in the exact top K */
			for (uint32_t j = 0; j < K; j++) {
				kth = ip[pos[h * K + j] - S];
				better = 0;
				for (uint32_t i = 0; i < nret; i++)
					better += ip[i] > kth;
				found += better < K;
				total++;
			}
		}
	}
	fprintf(stderr, "TOPK recall@%d through kvtierd: %.3f\n", K, (double)found / total);
	/* 0.948 with the spec's pipeline alone, 1.000 with the exact refine stage */
	ck_assert_msg((double)found / total >= 0.95, "recall %.3f", (double)found / total);
	close_seq(&f);
}
END_TEST

/* KVT_TOPK_F_ESTIMATE: the spec's pipeline; positions from the zone, scores estimated. */
START_TEST(t_estimate)
{
	struct fixture f;
	static float q[QH * D];
	static uint8_t out[H * 4 + H * K * 8];
	uint32_t nret, found = 0, total = 0, inexact = 0;
	uint64_t rng = 9;
	double err2 = 0, norm2 = 0;

	open_seq(&f, 1);
	nret = U * ((N_TOK - S - W) / U);
	for (int trial = 0; trial < 8; trial++) {
		uint32_t layer = trial % L,
			 target = S + (uint32_t)(kvt_test_lcg_gauss(&rng) * 1e6f) % nret;
		const uint32_t *n = (const void *)out, *pos = n + H;
		const float *score = (const float *)(pos + H * K);

		query_near(&f, layer, target, 0.3f, &rng, q);
		ck_assert_int_eq(kvt_topk(f.c, f.seq, layer, K, KVT_TOPK_F_ESTIMATE, q, QH * D, out,
					  sizeof(out)),
				 K);
		for (uint32_t h = 0; h < H; h++) {
			static float ip[N_TOK];

			ck_assert_uint_eq(n[h], K);
			exact_ip(&f, layer, h, q, nret, ip);
			for (uint32_t j = 0; j < K; j++) {
				uint32_t p = pos[h * K + j], better = 0;
				float e;

				ck_assert_uint_ge(p, S);
				ck_assert_uint_lt(p, S + nret);
				if (j)
					ck_assert(score[h * K + j - 1] >= score[h * K + j]);
				e = ip[p - S];
				inexact += score[h * K + j] != e;
				err2 += (double)(score[h * K + j] - e) * (score[h * K + j] - e);
				norm2 += (double)e * e;
				for (uint32_t i = 0; i < nret; i++)
					better += ip[i] > e;
				found += better < K;
				total++;
			}
		}
	}
	fprintf(stderr, "TOPK estimate: recall@%d %.3f, score relative L2 error %.3f\n", K,
		(double)found / total, sqrt(err2 / norm2));
	ck_assert_msg((double)found / total >= 0.85, "recall %.3f", (double)found / total);
	ck_assert_uint_gt(inexact, total / 2); /* estimates, not the exact products */
	ck_assert(sqrt(err2 / norm2) < 0.25);
	close_seq(&f);
}
END_TEST

START_TEST(t_bad_topk)
{
	struct fixture f, g;
	static float q[QH * D];
	static uint8_t out[H * 4 + H * K * 8], small[16];

	open_seq(&f, 1);
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, 0, 0, q, QH * D, out, sizeof(out)), -EINVAL);
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, 100000, 0, q, QH * D, out, sizeof(out)), -ERANGE);
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, 0, q, QH * D - 1, out, sizeof(out)), -EINVAL);
	ck_assert_int_eq(kvt_topk(f.c, f.seq, L, K, 0, q, QH * D, out, sizeof(out)), -EINVAL);
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, 0x80, q, QH * D, out, sizeof(out)), -EINVAL);
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, 1u << 4, q, QH * D, out, sizeof(out)), -EINVAL);
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, KVT_TOPK_F_FAST | KVT_TOPK_F_ESTIMATE, q,
				  QH * D, out, sizeof(out)),
			 -EINVAL);
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, 0, q, QH * D, small, sizeof(small)), -ENOSPC);
	/* a query that is not a vector of numbers */
	q[7] = NAN;
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, 0, q, QH * D, out, sizeof(out)), -EINVAL);
	q[7] = INFINITY;
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, 0, q, QH * D, out, sizeof(out)), -EINVAL);
	q[7] = 0.0f;
	/* staging holds H*K rows: the union of per-query-head lists needs twice that */
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, KVT_TOPK_F_UNION | KVT_TOPK_F_FETCH, q, QH * D,
				  out, sizeof(out)),
			 -ENOSPC);
	ck_assert_int_eq(kvt_topk(f.c, f.seq, 0, K, 0, q, QH * D, out, sizeof(out)), K);
	close_seq(&f);
	/* a sequence opened without retrieval */
	open_seq(&g, 0);
	ck_assert_int_eq(kvt_topk(g.c, g.seq, 0, K, 0, q, QH * D, out, sizeof(out)), -EINVAL);
	close_seq(&g);
}
END_TEST

/*
 * Keys evicted (T3) after they were encoded are gone: TOPK never returns them, with or without
 * FETCH (which has no row to stage for them). Found by this test: the daemon staged from the
 * freed slot.
 */
START_TEST(t_evicted)
{
	struct fixture f;
	static float q[QH * D], w[N_TOK];
	static uint8_t out[H * 4 + H * K * 8], rt[1 << 16];
	const uint32_t *n = (const void *)out, *pos = n + H;
	struct kvt_seq_stat st;
	uint64_t rng = 11;

	open_seq_p(&f, 1, KVT_POLICY_TIERED, 0.5f);
	/* the first half of the tokens never mattered: RETIER evicts them */
	for (uint32_t i = 0; i < N_TOK; i++)
		w[i] = i < N_TOK / 2 ? 0.0f : 1.0f;
	ck_assert_int_eq(kvt_score_add(f.c, f.seq, 0, w, N_TOK), 0);
	ck_assert_int_gt(kvt_retier(f.c, f.seq, rt, sizeof(rt)), 0);
	ck_assert_int_eq(kvt_seq_stat(f.c, f.seq, &st), 0);
	ck_assert_uint_ge(st.tier_count[3], N_TOK / 2 - S);
	/* a query aimed at an evicted key, then one at a live key, then the zero query (every
	 * score ties, so the lowest indices, all evicted, would come first) */
	for (int trial = 0; trial < 3; trial++) {
		uint32_t target = trial == 0 ? S + 100 : N_TOK / 2 + 300;
		int r;

		if (trial == 2)
			memset(q, 0, sizeof(q));
		else
			query_near(&f, 0, target, 0.1f, &rng, q);
		/* plain, FETCH, ESTIMATE, both */
		for (unsigned flags = 0; flags <= (KVT_TOPK_F_FETCH | KVT_TOPK_F_ESTIMATE);
		     flags += KVT_TOPK_F_FETCH) {
			r = kvt_topk(f.c, f.seq, 0, K, flags, q, QH * D, out, sizeof(out));
			ck_assert_msg(r == K, "trial %d flags %u: %s", trial, flags,
				      kvt_strerror(r));
			for (uint32_t h = 0; h < H; h++) {
				ck_assert_uint_le(n[h], K);
				for (uint32_t j = 0; j < n[h]; j++)
					ck_assert_msg(
					    pos[h * K + j] < S || pos[h * K + j] >= N_TOK / 2,
					    "evicted position %u returned", pos[h * K + j]);
				if (trial == 1) /* a live target is found */
					ck_assert_uint_eq(n[h], K);
			}
		}
	}
	close_seq(&f);
}
END_TEST

/* One raw SQE, as a client that writes the ring itself: its CQE res, and the daemon's reason
 * in @msg when it refused it. */
static int
raw_op(struct kvt_client *c, const struct kvt_sqe *tmpl, char *msg, size_t len)
{
	static uint64_t ud = 1000;
	struct kvt_sqe *e = kvt_get_sqe(c);
	struct kvt_cqe cqe;

	ck_assert_ptr_nonnull(e);
	memcpy(e, tmpl, sizeof(*e));
	e->user_data = ++ud;
	ck_assert_int_eq(kvt_submit(c), 1);
	ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
	ck_assert_uint_eq(cqe.user_data, ud);
	msg[0] = '\0';
	if (cqe.res < 0)
		ck_assert_int_eq(kvt_op_error(c, ud, msg, len), 0);
	return cqe.res;
}

/* A request in the arena at offset 0 (its query at 128, output at 2048): the SQE to send. */
static void
req_sqe(struct kvt_client *c, uint32_t seq, const struct kvt_topk_req *r, size_t len,
	struct kvt_sqe *e)
{
	uint8_t *arena = kvt_arena(c, NULL);

	memset(arena, 0, 128);
	memcpy(arena, r, len < sizeof(*r) ? len : sizeof(*r));
	memset(e, 0, sizeof(*e));
	kvt_prep_topk(e, seq, 0);
	e->arena_len = (uint32_t)len;
}

#define REFUSED(res_, frag_)                                                                       \
	do {                                                                                       \
		int r_ = raw_op(f.c, &e, msg, sizeof(msg));                                        \
		ck_assert_msg(r_ == (res_), "%s: res %d", frag_, r_);                              \
		ck_assert_msg(strstr(msg, frag_), "reason '%s' lacks '%s'", msg, frag_);           \
	} while (0)

/*
 * ABI 1.5: struct kvt_topk_req carries the mode and every knob; the SQE form of ABI 1.0-1.4
 * is still accepted and gives the same answer for the same knobs; each malformed request is
 * refused alone with its reason, and the next one is served.
 */
START_TEST(t_topk_req)
{
	static const struct {
		uint32_t mode, probe;
		unsigned sqe_flags;
	} modes[] = {
	    {KVT_TOPK_EXACT, 0, 0},
	    {KVT_TOPK_ESTIMATE, 0, KVT_TOPK_F_ESTIMATE},
	    {KVT_TOPK_FAST, 0, KVT_TOPK_F_FAST},
	    {KVT_TOPK_PROBE, 512, KVT_TOPK_F_FAST},
	};
	const uint32_t qlen = QH * D * 4, olen = H * 4 + H * K * 8;
	static float q[QH * D];
	static uint8_t a[H * 4 + H * K * 8], b[H * 4 + H * K * 8];
	struct kvt_topk_req r = {.size = sizeof(r),
				 .layer = 1,
				 .k = K,
				 .query_off = 128,
				 .query_len = qlen,
				 .out_off = 2048,
				 .out_len = olen};
	struct fixture f;
	struct kvt_sqe e;
	uint8_t *arena;
	uint64_t rng = 5;
	char msg[KVT_OP_ERR_MSG_LEN];

	open_seq(&f, 1);
	arena = kvt_arena(f.c, NULL);
	query_near(&f, 1, 2000, 0.1f, &rng, q);
	for (unsigned m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		memcpy(arena + 128, q, qlen); /* kvt_topk_run() below uses the arena too */
		/* the request form */
		r.mode = modes[m].mode;
		r.probe = modes[m].probe;
		req_sqe(f.c, f.seq, &r, sizeof(r), &e);
		ck_assert_int_eq(raw_op(f.c, &e, msg, sizeof(msg)), K);
		memcpy(a, arena + 2048, olen);
		/* the SQE form, the same knobs */
		memset(arena + 2048, 0, olen);
		kvt_prep_rw(&e, KVT_OP_TOPK, f.seq, modes[m].sqe_flags, 128, qlen, K, 1, 2048,
			    olen);
		e.probe = modes[m].probe;
		ck_assert_int_eq(raw_op(f.c, &e, msg, sizeof(msg)), K);
		ck_assert_msg(!memcmp(a, arena + 2048, olen), "mode %u: the two forms differ", m);
		/* the blocking call */
		ck_assert_int_eq(kvt_topk_run(f.c, f.seq, &r, q, b), K);
		ck_assert_msg(!memcmp(a, b, olen), "mode %u: kvt_topk_run differs", m);
	}
	r.mode = KVT_TOPK_EXACT;
	r.probe = 0;
	memcpy(arena + 128, q, qlen);

	/* the request form's refusals */
	r.mode = KVT_TOPK__MODES;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "mode 4 unknown");
	r.mode = KVT_TOPK_EXACT;
	r.probe = 64;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "probe 64 with mode EXACT");
	r.mode = KVT_TOPK_PROBE;
	r.probe = 0;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "KVT_TOPK_PROBE needs");
	r.mode = KVT_TOPK_EXACT;
	r.flags = KVT_TOPK_F_FAST;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "request flags 0x8");
	r.flags = 0;
	r.reserved[1] = 3;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "reserved[1] is 0x3");
	r.reserved[1] = 0;
	r.k = 0;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "k is 0");
	r.k = K;
	r.layer = L;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "layer 2 out of range");
	r.layer = 1;
	r.out_off = 2044;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "not 8-byte aligned");
	r.out_off = 2048;
	r.query_len = qlen - 4;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "needs q_heads x head_dim");
	r.query_len = qlen;
	r.size = 32;
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "request size 32");
	r.size = 72; /* longer than arena_len */
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	REFUSED(-EINVAL, "request size 72");
	/* a newer client's request: a longer struct is fine while its extra bytes are zero */
	req_sqe(f.c, f.seq, &r, 72, &e);
	ck_assert_int_eq(raw_op(f.c, &e, msg, sizeof(msg)), K);
	arena[70] = 1;
	REFUSED(-E2BIG, "request byte 70 is not zero");
	r.size = sizeof(r);
	req_sqe(f.c, f.seq, &r, 40, &e); /* arena_len under the struct */
	REFUSED(-EINVAL, "arena_len 40 is shorter");
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	e.k = K; /* a knob in the SQE as well */
	REFUSED(-EINVAL, "the request carries them");
	req_sqe(f.c, f.seq, &r, sizeof(r), &e);
	e.op_flags |= KVT_TOPK_F_FAST;
	REFUSED(-EINVAL, "op_flags must be KVT_TOPK_F_REQ alone");

	/* the SQE form's refusals, as ABI 1.4 made them */
	kvt_prep_rw(&e, KVT_OP_TOPK, f.seq, KVT_TOPK_F_FAST | KVT_TOPK_F_ESTIMATE, 128, qlen, K, 1,
		    2048, olen);
	REFUSED(-EINVAL, "exclude each other");
	kvt_prep_rw(&e, KVT_OP_TOPK, f.seq, 0, 128, qlen, K, 1, 2048, olen);
	e.probe = 64;
	REFUSED(-EINVAL, "probe 64 without KVT_TOPK_F_FAST");
	kvt_prep_rw(&e, KVT_OP_TOPK, f.seq, 0, 128, qlen, 0, 1, 2048, olen);
	REFUSED(-EINVAL, "k is 0");
	kvt_prep_rw(&e, KVT_OP_TOPK, f.seq, 0, 128, qlen, K, 1ull << 32, 2048, olen);
	REFUSED(-EINVAL, "layer 4294967296 out of range");

	/* the blocking call checks its own argument; the session still serves */
	r.size = 8;
	ck_assert_int_eq(kvt_topk_run(f.c, f.seq, &r, q, b), -EINVAL);
	r.size = sizeof(r);
	ck_assert_int_eq(kvt_topk_run(f.c, f.seq, &r, q, b), K);
	close_seq(&f);
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

KVT_CHECK_MAIN("topk", 120, up, down, t_recall_and_fetch, t_estimate, t_evicted, t_bad_topk,
	       t_topk_req)
