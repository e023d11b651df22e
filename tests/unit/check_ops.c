/* SPDX-License-Identifier: MIT */
/*
 * SQE validation, driven through a real session region and kvtd_session_drain() without the
 * socket: what the poller does, minus the threads.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_ring.h"
#include "kvtd.h"
#include "session.h"
#include "kvt_test.h"

static struct kvtd D;
static struct kvtd_session *S;

static void
setup(void)
{
	memset(&D, 0, sizeof(D));
	kvtd_config_defaults(&D.cfg);
	D.cfg.pool_size = 8ull << 20;
	D.cfg.lock = 0;
	D.cfg.numa_node = -1;
	ck_assert_int_eq(kvtd_pool_init(&D.pool, &D.cfg, NULL), 0);
	ck_assert_int_eq(kvtd_session_create(&D, 8, 16, 1 << 20, &S), 0);
	S->sock = -1;
}

static void
teardown(void)
{
	kvtd_session_destroy(S);
	kvtd_pool_fini(&D.pool);
}

/* Submits one SQE and drains; returns the CQE's res. */
static int
run(const struct kvt_sqe *e, struct kvt_cqe *ret)
{
	uint32_t tail = kvt_ring_prod_tail_relaxed(S->sq);
	struct kvt_cqe cqe;
	uint32_t head = kvt_ring_load_head(S->cq);

	S->sqes[tail & (S->sq_entries - 1)] = *e;
	kvt_ring_store_stamp(&S->sqes[tail & (S->sq_entries - 1)].stamp, tail);
	kvt_ring_store_tail(S->sq, tail + 1);
	ck_assert_uint_eq(kvtd_session_drain(S, 0), 1);
	ck_assert_uint_eq(kvt_ring_load_tail(S->cq), head + 1);
	cqe = S->cqes[head & (S->cq_entries - 1)];
	kvt_ring_store_head(S->cq, head + 1);
	ck_assert_uint_eq(cqe.user_data, e->user_data);
	if (ret)
		*ret = cqe;
	return cqe.res;
}

static uint32_t
open_seq(void)
{
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = 2,
				   .kv_heads = 1,
				   .head_dim = 32,
				   .dtype = KVT_DTYPE_F32,
				   .delta = 16,
				   .hbm_frac = 0.5f};
	struct kvt_sqe e = {.opcode = KVT_OP_SEQ_OPEN, .arena_len = sizeof(p), .user_data = 9};
	int r;

	memcpy(S->arena, &p, sizeof(p));
	r = run(&e, NULL);
	ck_assert_int_gt(r, 0);
	return (uint32_t)r;
}

START_TEST(t_nop_and_unknown)
{
	struct kvt_sqe e = {.opcode = KVT_OP_NOP, .user_data = 42};

	ck_assert_int_eq(run(&e, NULL), 0);
	for (unsigned op = KVT_OP__COUNT; op < 256; op++) {
		e.opcode = (uint8_t)op;
		ck_assert_int_eq(run(&e, NULL), -EINVAL);
	}
	/* TOPK names a sequence: seq 0 is out of range */
	e.opcode = KVT_OP_TOPK;
	ck_assert_int_eq(run(&e, NULL), -EINVAL);
}
END_TEST

START_TEST(t_every_unused_field_checked)
{
	struct kvt_sqe base = {.opcode = KVT_OP_NOP};
	size_t off;

	/* Set each byte of the SQE in turn (but opcode and user_data): NOP must refuse it. */
	for (off = 1; off < sizeof(base); off++) {
		struct kvt_sqe e = base;

		if ((off >= offsetof(struct kvt_sqe, user_data) &&
		     off < offsetof(struct kvt_sqe, user_data) + 8) ||
		    (off >= offsetof(struct kvt_sqe, stamp) &&
		     off < offsetof(struct kvt_sqe, stamp) + 4))
			continue;
		((uint8_t *)&e)[off] = 1;
		ck_assert_msg(run(&e, NULL) == -EINVAL, "byte %zu accepted", off);
	}
}
END_TEST

START_TEST(t_arena_bounds)
{
	uint32_t seq = open_seq();
	struct kvt_sqe e = {.opcode = KVT_OP_APPEND, .seq = seq, .count = 1};
	uint64_t tok = 2 * 2 * 32 * 4;

	e.arena_len = (uint32_t)tok;
	e.arena_off = S->arena_size - tok + 1; /* one byte past the end */
	ck_assert_int_eq(run(&e, NULL), -EINVAL);
	e.arena_off = UINT64_MAX - 10; /* offset + length wraps */
	ck_assert_int_eq(run(&e, NULL), -EINVAL);
	e.arena_off = S->arena_size - tok; /* exactly at the end: fine */
	ck_assert_int_eq(run(&e, NULL), 1);
	/* scores must be 4-byte aligned */
	e = (struct kvt_sqe){
	    .opcode = KVT_OP_SCORE_ADD, .seq = seq, .count = 1, .arena_off = 2, .arena_len = 4};
	ck_assert_int_eq(run(&e, NULL), -EINVAL);
	e.arena_off = 4;
	memset(S->arena + 4, 0, 4);
	ck_assert_int_eq(run(&e, NULL), 0);
}
END_TEST

START_TEST(t_seq_ids)
{
	struct kvt_sqe e = {.opcode = KVT_OP_SEQ_CLOSE};
	uint32_t seq;

	e.seq = 0;
	ck_assert_int_eq(run(&e, NULL), -EINVAL);
	e.seq = S->max_seqs + 1;
	ck_assert_int_eq(run(&e, NULL), -EINVAL);
	e.seq = UINT32_MAX;
	ck_assert_int_eq(run(&e, NULL), -EINVAL);
	seq = open_seq();
	e.seq = seq;
	ck_assert_int_eq(run(&e, NULL), 0);
	ck_assert_int_eq(run(&e, NULL), -ENOENT);
}
END_TEST

static void
put_nop(uint32_t idx)
{
	struct kvt_sqe *e = &S->sqes[idx & (S->sq_entries - 1)];

	*e = (struct kvt_sqe){.opcode = KVT_OP_NOP};
	kvt_ring_store_stamp(&e->stamp, idx);
}

START_TEST(t_cq_full_leaves_sqes)
{
	uint32_t tail = kvt_ring_prod_tail_relaxed(S->sq), cq_head = kvt_ring_load_head(S->cq);

	/* 12 completions the client has not reaped yet (CQ of 16)... */
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 4; i++)
			put_nop(tail + i);
		tail += 4;
		kvt_ring_store_tail(S->sq, tail);
		ck_assert_uint_eq(kvtd_session_drain(S, 0), 4);
	}
	/* ...then 8 more SQEs: only 4 fit, the rest wait in the SQ. */
	for (int i = 0; i < 8; i++)
		put_nop(tail + i);
	tail += 8;
	kvt_ring_store_tail(S->sq, tail);
	ck_assert_uint_eq(kvtd_session_drain(S, 0), 4);
	ck_assert_uint_eq(kvtd_session_drain(S, 0), 0);
	kvt_ring_store_head(S->cq, cq_head + 16); /* the client reaps everything */
	ck_assert_uint_eq(kvtd_session_drain(S, 0), 4);
}
END_TEST

START_TEST(t_unstamped_entries_wait)
{
	/* An entry published by the tail alone is not taken until its stamp says so. */
	S->sqes[0] = (struct kvt_sqe){.opcode = KVT_OP_NOP};
	kvt_ring_store_tail(S->sq, 1);
	ck_assert_uint_eq(kvtd_session_drain(S, 0), 0);
	ck_assert(kvtd_session_pending(S));
	kvt_ring_store_stamp(&S->sqes[0].stamp, 0);
	ck_assert_uint_eq(kvtd_session_drain(S, 0), 1);
	ck_assert(!kvtd_session_pending(S));
}
END_TEST

START_TEST(t_garbage_tail_breaks_session)
{
	kvt_ring_store_tail(S->sq, 1000);
	ck_assert(!kvtd_session_pending(S));
	ck_assert(S->broken);
	ck_assert_uint_eq(kvtd_session_drain(S, 0), 0);
}
END_TEST

START_TEST(t_slice_ends_a_turn)
{
	uint32_t tail = kvt_ring_prod_tail_relaxed(S->sq);
	struct kvt_cqe *cq = S->cqes;

	for (int i = 0; i < 4; i++)
		put_nop(tail + i);
	kvt_ring_store_tail(S->sq, tail + 4);
	/* A turn always runs its first op; past the slice it stops before the next one, and
	 * what is left is there for the next turn, in order. */
	ck_assert_uint_eq(kvtd_session_drain(S, 1), 1);
	ck_assert(kvtd_session_pending(S));
	ck_assert_uint_eq(kvtd_session_drain(S, 1), 1);
	ck_assert_uint_eq(kvtd_session_drain(S, 0), 2); /* no slice: all that is left */
	ck_assert(!kvtd_session_pending(S));
	for (uint32_t i = 0; i < 4; i++)
		ck_assert_uint_eq(cq[(tail + i) & (S->cq_entries - 1)].stamp, tail + i + 1);
}
END_TEST

/* Runs @n NOPs through kvtd_session_drain(@slice_ns), 4 per turn, reaping as it goes. */
static void
drain_nops(unsigned n, uint64_t slice_ns)
{
	uint32_t tail = kvt_ring_prod_tail_relaxed(S->sq), head = kvt_ring_load_head(S->cq);

	for (unsigned done = 0; done < n; done += 4) {
		for (int i = 0; i < 4; i++)
			put_nop(tail + i);
		tail += 4;
		kvt_ring_store_tail(S->sq, tail);
		while (kvtd_session_pending(S))
			ck_assert_uint_gt(kvtd_session_drain(S, slice_ns), 0);
		head += 4;
		kvt_ring_store_head(S->cq, head);
	}
}

START_TEST(t_op_timing)
{
	const struct kvtd_op_stats *st = &S->opst;
	uint64_t in_buckets = 0;

	/* Alone on its poller (no slice) a session counts every op but times a sample: gaps
	 * between timed ops are 1 to 2 * KVTD_OP_TIME_SAMPLE - 1 ops, random. */
	drain_nops(4000, 0);
	ck_assert_uint_eq(st->count[KVT_OP_NOP], 4000);
	ck_assert_uint_eq(st->errors[KVT_OP_NOP], 0);
	ck_assert_uint_ge(st->timed[KVT_OP_NOP], 4000 / (2 * KVTD_OP_TIME_SAMPLE - 1));
	ck_assert_uint_le(st->timed[KVT_OP_NOP], 4000 / 4); /* a sample, not every op */
	for (unsigned b = 0; b <= KVTD_LAT_BUCKETS; b++)
		in_buckets += st->bucket[KVT_OP_NOP][b];
	ck_assert_uint_eq(in_buckets, st->timed[KVT_OP_NOP]);
	/* Sharing a poller (a slice), the clock is read after every op anyway: all are timed. */
	memset(&S->opst, 0, sizeof(S->opst));
	drain_nops(400, 1000000000);
	ck_assert_uint_eq(st->count[KVT_OP_NOP], 400);
	ck_assert_uint_eq(st->timed[KVT_OP_NOP], 400);
}
END_TEST

KVT_CHECK_MAIN("ops", 0, setup, teardown, t_nop_and_unknown, t_every_unused_field_checked,
	       t_arena_bounds, t_seq_ids, t_cq_full_leaves_sqes, t_unstamped_entries_wait,
	       t_garbage_tail_breaks_session, t_slice_ends_a_turn, t_op_timing)
