/* SPDX-License-Identifier: MIT */
/*
 * Clients of one kvtierd cannot reach each other, nor starve each other:
 *  - sequence and buffer ids are the session's own: another session naming them gets -ENOENT
 *    from every opcode and from SEQ_OPEN's buffer fields, and the same id numbers in two
 *    sessions name two sequences whose rows never mix;
 *  - on one poller, a NOP submitted behind another client's deep queue of heavy FETCHes
 *    completes after a few of them, not after the queue (sessions take turns of
 *    poller_slice_us): counted in completed FETCHes, never timed.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvtier.h"
#include "kvt_test.h"

enum { L = 2, H = 2, D = 64, NTOK = 512 };
#define ROW (H * D)
#define TOK (L * 2 * ROW)

static struct kvtd_proc Dm;

struct owner {
	struct kvt_client *c;
	struct kvt_buf *stage;
	uint32_t seq;
	float *ref;
};

static void
owner_open(struct owner *o, float base)
{
	struct kvt_opts opts = {.size = sizeof(opts), .name = "owner"};
	struct kvt_seq_params p = {.size = sizeof(p)};

	ck_assert_int_eq(kvt_connect(Dm.sock, &opts, &o->c), 0);
	ck_assert_int_eq(kvt_buf_alloc(o->c, (uint64_t)L * 2 * NTOK * ROW * 4, &o->stage), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 64;
	p.hbm_frac = 1.0f;
	p.sinks = 4;
	p.window = 16;
	p.ret_update = 16;
	p.stage_buf_id = kvt_buf_id(o->stage);
	p.stage_slots = NTOK;
	p.stage_slot_stride = ROW * 4;
	p.stage_kv_stride = (uint64_t)NTOK * ROW * 4;
	p.stage_layer_stride = 2ull * NTOK * ROW * 4;
	ck_assert_int_eq(kvt_seq_open(o->c, &p, &o->seq), 0);
	o->ref = malloc(sizeof(float) * TOK * NTOK);
	for (uint64_t i = 0; i < (uint64_t)TOK * NTOK; i++)
		o->ref[i] = base + (float)(i % 1000) / 1000.0f;
	ck_assert_int_eq(kvt_append(o->c, o->seq, o->ref, sizeof(float) * TOK * NTOK, NTOK, NULL),
			 NTOK);
}

static void
owner_close(struct owner *o)
{
	kvt_disconnect(o->c);
	free(o->ref);
}

/* One raw op on @c with the given fields (payload zeroed, at the arena's start). */
static int
op(struct kvt_client *c, uint8_t opcode, uint32_t seq, uint16_t op_flags, uint32_t count,
   uint32_t arena_len, uint64_t arg0, uint64_t arg1, uint32_t arg2)
{
	struct kvt_sqe *e = kvt_get_sqe(c);
	struct kvt_cqe cqe;

	ck_assert_ptr_nonnull(e);
	memset(kvt_arena(c, NULL), 0, 65536);
	e->opcode = opcode;
	e->seq = seq;
	e->op_flags = op_flags;
	e->count = count;
	e->arena_len = arena_len;
	e->arg0 = arg0;
	e->arg1 = arg1;
	e->arg2 = arg2;
	e->user_data = 77;
	ck_assert_int_eq(kvt_submit(c), 1);
	ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
	ck_assert_uint_eq(cqe.user_data, 77);
	return cqe.res;
}

START_TEST(t_ids_are_per_session)
{
	struct owner a, b;
	struct kvt_client *x;
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = 1,
				   .kv_heads = 1,
				   .head_dim = 8,
				   .delta = 1,
				   .hbm_frac = 1.0f};
	struct kvt_seq_stat st;
	uint32_t pos[NTOK], id;

	owner_open(&a, 1.0f);
	/* a session with no sequence and no buffer, naming a's */
	ck_assert_int_eq(kvt_connect(Dm.sock, NULL, &x), 0);
	ck_assert_int_eq(op(x, KVT_OP_SEQ_STAT, a.seq, 0, 0, sizeof(st), 0, 0, 0), -ENOENT);
	ck_assert_int_eq(op(x, KVT_OP_APPEND, a.seq, 0, 1, TOK * 4, 0, 0, 0), -ENOENT);
	ck_assert_int_eq(op(x, KVT_OP_SCORE_ADD, a.seq, 0, 1, 4, 0, 0, 0), -ENOENT);
	ck_assert_int_eq(op(x, KVT_OP_RETIER, a.seq, 0, 0, 4096, 0, 0, 0), -ENOENT);
	ck_assert_int_eq(op(x, KVT_OP_FETCH, a.seq, KVT_FETCH_F_T1, 0, NTOK * 4, 0, L, 0), -ENOENT);
	ck_assert_int_eq(op(x, KVT_OP_TOPK, a.seq, 0, 4, H * D * 4, 0, 8192, 8192), -ENOENT);
	ck_assert_int_eq(op(x, KVT_OP_SEQ_CLOSE, a.seq, 0, 0, 0, 0, 0, 0), -ENOENT);
	p.stage_buf_id = kvt_buf_id(a.stage); /* a's buffer id: not x's */
	p.stage_slots = 1;
	p.stage_slot_stride = 32;
	ck_assert_int_eq(kvt_seq_open(x, &p, &id), -ENOENT);
	p.stage_buf_id = 0;
	p.t0_buf_id = kvt_buf_id(a.stage);
	p.t0_slots = 1;
	p.t0_slot_stride = 32;
	ck_assert_int_eq(kvt_seq_open(x, &p, &id), -ENOENT);
	kvt_disconnect(x);
	/* a's sequence is whole and still a's */
	ck_assert_int_eq(kvt_seq_stat(a.c, a.seq, &st), 0);
	ck_assert_uint_eq(st.n_tokens, NTOK);

	/* the same id numbers in another session name that session's own sequence and rows */
	owner_open(&b, 5.0f);
	ck_assert_uint_eq(b.seq, a.seq);
	ck_assert_uint_eq(kvt_buf_id(b.stage), kvt_buf_id(a.stage));
	ck_assert_int_eq(kvt_fetch(b.c, b.seq, KVT_FETCH_F_T1, 0, L, 0, pos, NTOK), NTOK);
	ck_assert_int_eq(kvt_fetch(a.c, a.seq, KVT_FETCH_F_T1, 0, L, 0, pos, NTOK), NTOK);
	for (uint32_t i = 0; i < NTOK; i++)
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				uint64_t at = ((uint64_t)(l * 2 + kv) * NTOK + i) * ROW,
					 want = (uint64_t)i * TOK + (l * 2 + kv) * ROW;

				ck_assert(!memcmp((float *)kvt_buf_ptr(a.stage) + at, a.ref + want,
						  ROW * 4));
				ck_assert(!memcmp((float *)kvt_buf_ptr(b.stage) + at, b.ref + want,
						  ROW * 4));
			}
	owner_close(&b);
	owner_close(&a);
}
END_TEST

static int
cmp_uint(const void *a, const void *b)
{
	return (int)*(const unsigned *)a - (int)*(const unsigned *)b;
}

/*
 * A deep queue of whole-sequence FETCHes from one client, then a NOP from another, both on the
 * one poller. Once b's NOP is back, a's completed FETCHes are counted: at least as many as the
 * poller did before the NOP (it goes on meanwhile), so a FIFO poller always shows the whole
 * queue. b sleeps for its CQE, so this thread runs as soon as it is posted; a round where it
 * still runs late counts high, hence the median of the rounds.
 */
START_TEST(t_no_starvation)
{
	enum { QUEUE = 48, ROUNDS = 11 };
	struct owner a;
	struct kvt_client *b;
	struct kvt_cqe cqe;
	unsigned done[ROUNDS];

	owner_open(&a, 1.0f); /* the default ring: 256 SQEs */
	ck_assert_int_eq(kvt_connect(Dm.sock, NULL, &b), 0);
	for (int round = 0; round < ROUNDS; round++) {
		struct kvt_sqe *e;

		for (int i = 0; i < QUEUE; i++) {
			e = kvt_get_sqe(a.c);
			ck_assert_ptr_nonnull(e);
			e->opcode = KVT_OP_FETCH;
			e->seq = a.seq;
			e->op_flags = KVT_FETCH_F_T1;
			e->arena_len = NTOK * 4; /* room for the positions */
			e->arg1 = L;
			e->user_data = i;
		}
		ck_assert_int_eq(kvt_submit(a.c), QUEUE);
		ck_assert_int_eq(kvt_nop(b), 0);
		done[round] = 0;
		while (kvt_peek_cqe(a.c, &cqe) == 0) {
			ck_assert_int_eq(cqe.res, NTOK);
			done[round]++;
		}
		while (kvt_inflight(a.c)) {
			ck_assert_int_eq(kvt_wait_cqe(a.c, &cqe), 0);
			ck_assert_int_eq(cqe.res, NTOK);
		}
	}
	qsort(done, ROUNDS, sizeof(done[0]), cmp_uint);
	fprintf(stderr,
		"no starvation: a NOP behind %d queued FETCHes of %d rows x %d layers completed "
		"after %u of them (median of %d; %u to %u)\n",
		QUEUE, NTOK, L, done[ROUNDS / 2], ROUNDS, done[0], done[ROUNDS - 1]);
	/* FIFO over sessions would serve the whole queue first, every time */
	ck_assert_uint_lt(done[ROUNDS / 2], QUEUE / 2);
	kvt_disconnect(b);
	owner_close(&a);
}
END_TEST

static void
up(void)
{
	static const char *const extra[] = {"--pollers", "1", NULL};

	daemon_start(&Dm, extra);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

KVT_CHECK_MAIN("isolation", 120, up, down, t_ids_are_per_session, t_no_starvation)
