/* SPDX-License-Identifier: MIT */
/*
 * The neighbor rows: one client's NOP round trip just after another client of the same kvtierd
 * (one poller, so both sessions share it) queued HOG_DEPTH FETCHes, each copying 16 MiB of T1
 * rows on the host backend (a few ms). With the daemon's default poller_slice_us the sessions
 * take turns and the NOP waits for about one FETCH; with --poller-slice-us 0 the poller drains
 * the hog's whole queue before it looks at the NOP. Both rows start their own daemon.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "daemon.h"
#include "kvtier.h"

#define HOG_DEPTH  16	/* FETCHes the hog keeps in flight */
#define HOG_TOKENS 4096 /* one layer, 8 kv heads x 128, f16: 4 KiB a token, 16 MiB in T1 */
#define HOG_HEADS  8
#define HOG_DIM	   128
#define HOG_ROW	   (HOG_HEADS * HOG_DIM * 2) /* one K or V row of one token */

struct hog {
	struct kvt_client *c;
	struct kvt_buf *stage;
	uint32_t seq;
};

static int
hog_open(struct hog *h, const char *sock)
{
	struct kvt_opts o = {.size = sizeof(o), .name = "hog", .sq_entries = 64};
	struct kvt_seq_params p = {.size = sizeof(p)};
	uint8_t *rows;
	int r;

	r = kvt_connect(sock, &o, &h->c);
	if (r < 0)
		return r;
	r = kvt_buf_alloc(h->c, (uint64_t)HOG_TOKENS * 2 * HOG_ROW, &h->stage);
	if (r < 0)
		return r;
	p.layers = 1;
	p.kv_heads = HOG_HEADS;
	p.head_dim = HOG_DIM;
	p.dtype = KVT_DTYPE_F16;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 64;
	p.hbm_frac = 0.5f;
	p.stage_buf_id = kvt_buf_id(h->stage);
	p.stage_slots = HOG_TOKENS;
	p.stage_slot_stride = HOG_ROW;
	p.stage_kv_stride = (uint64_t)HOG_TOKENS * HOG_ROW;
	r = kvt_seq_open(h->c, &p, &h->seq);
	if (r < 0)
		return r;
	rows = calloc(256, 2 * HOG_ROW);
	if (!rows)
		return -ENOMEM;
	/* no T0 region: every appended token lands in T1, in the pool */
	for (uint32_t t = 0; t < HOG_TOKENS && r >= 0; t += 256)
		r = (int)kvt_append(h->c, h->seq, rows, 256ull * 2 * HOG_ROW, 256, NULL);
	free(rows);
	return r < 0 ? r : 0;
}

/* Queues HOG_DEPTH FETCHes of every T1 row in one submit. */
static int
hog_submit(struct hog *h)
{
	for (unsigned i = 0; i < HOG_DEPTH; i++) {
		struct kvt_sqe *e = kvt_get_sqe(h->c);

		if (!e)
			return -EBUSY;
		e->opcode = KVT_OP_FETCH;
		e->seq = h->seq;
		e->op_flags = KVT_FETCH_F_T1;
		e->arena_len = HOG_TOKENS * sizeof(uint32_t); /* positions, overwritten */
		e->arg1 = 1;				      /* layers [0, 1) */
	}
	return kvt_submit(h->c);
}

static int
hog_reap(struct hog *h)
{
	struct kvt_cqe cqe;

	for (unsigned i = 0; i < HOG_DEPTH; i++) {
		int r = kvt_wait_cqe(h->c, &cqe);

		if (r < 0)
			return r;
		if (cqe.res < 0)
			return cqe.res;
	}
	return 0;
}

struct pair {
	struct hog *h;
	struct kvt_client *c;
};

/*
 * One sample: the hog queues HOG_DEPTH FETCHes, then the other client's NOP round trip is
 * timed, then the hog's completions are reaped. Both clients run from this one thread, so the
 * NOP always arrives behind a full queue: the figure is how long a neighbour's queue holds an
 * op back, not how the threads happened to be scheduled.
 */
static int
nop_behind_hog(void *arg, uint64_t *ret_ns)
{
	struct pair *p = arg;
	uint64_t t0;
	int r;

	r = hog_submit(p->h);
	t0 = bench_now_ns();
	if (r >= 0)
		r = kvt_nop(p->c);
	*ret_ns = bench_now_ns() - t0;
	if (r >= 0)
		r = hog_reap(p->h);
	return r < 0 ? r : 0;
}

static int
run(const struct bench_opts *o, const char *slice_us, struct bench_result *ret)
{
	struct kvt_opts opts = {.size = sizeof(opts), .name = "neighbor"};
	struct bench_opts bo = *o;
	struct bench_daemon d;
	struct hog h = {0};
	struct pair p = {&h, NULL};
	int r;

	/* each sample waits for FETCHes of a few ms: 32 per repetition */
	bo.iters = 32;
	bo.warmup = 2;
	/* NULL: the daemon's default turn */
	r = bench_daemon_start(&d, (const char *const[]){"--pool-size", "64M",
							 slice_us ? "--poller-slice-us" : NULL,
							 slice_us, NULL});
	if (r < 0)
		return r;
	r = hog_open(&h, d.sock);
	if (r == 0)
		r = kvt_connect(d.sock, &opts, &p.c);
	if (r == 0)
		r = bench_latency_sampled(&bo, nop_behind_hog, &p, ret);
	kvt_disconnect(p.c);
	kvt_disconnect(h.c);
	bench_daemon_stop(&d);
	return r;
}

int
bench_kvtier_neighbor(const struct bench_opts *o, struct bench_result *ret)
{
	return run(o, NULL, ret);
}

int
bench_kvtier_neighbor_noslice(const struct bench_opts *o, struct bench_result *ret)
{
	return run(o, "0", ret);
}
