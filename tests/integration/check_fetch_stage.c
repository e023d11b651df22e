/* SPDX-License-Identifier: MIT */
/*
 * FETCH's staging row through a real kvtierd: rows land at stage_row + i and nowhere else. The
 * staging buffer is filled with a sentinel pattern first; after a FETCH at stage_row = R > 0,
 * the rows below R, the rows after the staged ones and the layers not asked for still hold the
 * sentinel, and rows R.. hold the appended rows of the positions in the order FETCH reports them
 * (KVT_FETCH_F_T1: ascending; KVT_FETCH_F_LIST: the order given). A FETCH that does not fit
 * stages nothing at all.
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

enum { L = 3, H = 2, D = 16, NTOK = 40, STAGE = 64 };
#define ROW	 (H * D)       /* floats per (token, layer, K|V) */
#define TOK	 (L * 2 * ROW) /* floats per token */
#define SENTINEL 0xa5

static struct kvtd_proc Dm;

struct fixture {
	struct kvt_client *c;
	struct kvt_buf *stage;
	uint32_t seq;
	float ref[NTOK * TOK];
};

static float *
srow(struct fixture *f, uint32_t row, uint32_t l, uint32_t kv)
{
	return (float *)kvt_buf_ptr(f->stage) + ((size_t)(l * 2 + kv) * STAGE + row) * ROW;
}

static void
fill_sentinel(struct fixture *f)
{
	memset(kvt_buf_ptr(f->stage), SENTINEL, kvt_buf_size(f->stage));
}

static int
is_sentinel(const float *row)
{
	const uint8_t *b = (const uint8_t *)row;

	for (size_t i = 0; i < ROW * sizeof(float); i++)
		if (b[i] != SENTINEL)
			return 0;
	return 1;
}

/* Pool-only sequence (no T0 region): every appended position is T1. */
static void
fixture_open(struct fixture *f)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	uint64_t s = 0x1234567;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &f->c), 0);
	ck_assert_int_eq(kvt_buf_alloc(f->c, (size_t)L * 2 * STAGE * ROW * 4, &f->stage), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 16;
	p.stage_buf_id = kvt_buf_id(f->stage);
	p.stage_slots = STAGE;
	p.stage_slot_stride = ROW * 4;
	p.stage_kv_stride = (uint64_t)STAGE * ROW * 4;
	p.stage_layer_stride = 2ull * STAGE * ROW * 4;
	ck_assert_int_eq(kvt_seq_open(f->c, &p, &f->seq), 0);
	for (int i = 0; i < NTOK * TOK; i++) {
		f->ref[i] = (float)((kvt_test_lcg(&s) >> 40) & 0xffff) / 65536.0f - 0.5f;
	}
	ck_assert_int_eq(kvt_append(f->c, f->seq, f->ref, sizeof(f->ref), NTOK, NULL), NTOK);
}

static void
fixture_close(struct fixture *f)
{
	ck_assert_int_eq(kvt_seq_close(f->c, f->seq), 0);
	kvt_disconnect(f->c);
}

/*
 * Every staging row: the sentinel outside [row0, row0 + m) x [layer0, layer0 + nl), the
 * appended row of pos[i] at row0 + i inside.
 */
static void
check_stage(struct fixture *f, uint32_t row0, uint32_t m, uint32_t layer0, uint32_t nl,
	    const uint32_t *pos)
{
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t r = 0; r < STAGE; r++) {
				const float *got = srow(f, r, l, kv);

				if (l < layer0 || l >= layer0 + nl || r < row0 || r >= row0 + m) {
					ck_assert_msg(
					    is_sentinel(got),
					    "staging row %u (layer %u, %s) overwritten; "
					    "FETCH staged rows [%u, %u) of layers [%u, %u)",
					    r, l, kv ? "V" : "K", row0, row0 + m, layer0,
					    layer0 + nl);
					continue;
				}
				ck_assert_msg(!memcmp(got,
						      f->ref + (size_t)pos[r - row0] * TOK +
							  (l * 2 + kv) * ROW,
						      ROW * sizeof(float)),
					      "staging row %u (layer %u, %s) is not position %u", r,
					      l, kv ? "V" : "K", pos[r - row0]);
			}
}

START_TEST(t_stage_row_t1)
{
	static const uint32_t rows[] = {1, 7, STAGE - NTOK};
	struct fixture f;
	uint32_t pos[NTOK];

	fixture_open(&f);
	for (unsigned i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		fill_sentinel(&f);
		memset(pos, 0xff, sizeof(pos));
		ck_assert_int_eq(kvt_fetch(f.c, f.seq, KVT_FETCH_F_T1, 1, 2, rows[i], pos, NTOK),
				 NTOK);
		for (uint32_t j = 0; j < NTOK; j++)
			ck_assert_uint_eq(pos[j], j); /* every position, ascending */
		check_stage(&f, rows[i], NTOK, 1, 2, pos);
	}
	/* one row too far: -ENOSPC and nothing staged */
	fill_sentinel(&f);
	ck_assert_int_eq(kvt_fetch(f.c, f.seq, KVT_FETCH_F_T1, 0, L, STAGE - NTOK + 1, pos, NTOK),
			 -ENOSPC);
	check_stage(&f, 0, 0, 0, 0, pos);
	fixture_close(&f);
}
END_TEST

START_TEST(t_stage_row_list)
{
	uint32_t list[] = {33, 2, 17, 39, 0, 5, 5, 21};
	const uint32_t m = sizeof(list) / sizeof(list[0]);
	struct fixture f;

	fixture_open(&f);
	for (uint32_t row0 = 1; row0 + m <= STAGE; row0 += 9) {
		uint32_t copy[sizeof(list) / sizeof(list[0])];

		fill_sentinel(&f);
		memcpy(copy, list, sizeof(list));
		ck_assert_int_eq(
		    kvt_fetch(f.c, f.seq, KVT_FETCH_F_LIST, row0 % L, 1, row0, copy, m), (int)m);
		check_stage(&f, row0, m, row0 % L, 1, list);
	}
	/* the last row exactly, then one past it */
	fill_sentinel(&f);
	ck_assert_int_eq(kvt_fetch(f.c, f.seq, KVT_FETCH_F_LIST, 0, L, STAGE - 1, list, 1), 1);
	check_stage(&f, STAGE - 1, 1, 0, L, list);
	fill_sentinel(&f);
	ck_assert_int_eq(kvt_fetch(f.c, f.seq, KVT_FETCH_F_LIST, 0, L, STAGE - 1, list, 2),
			 -ENOSPC);
	ck_assert_int_eq(kvt_fetch(f.c, f.seq, KVT_FETCH_F_LIST, 0, L, STAGE, list, 1), -ENOSPC);
	check_stage(&f, 0, 0, 0, 0, list);
	fixture_close(&f);
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

KVT_CHECK_MAIN("fetch_stage", 60, up, down, t_stage_row_t1, t_stage_row_list)
