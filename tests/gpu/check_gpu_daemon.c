/* SPDX-License-Identifier: MIT */
/*
 * check_gpu_daemon - on a real GPU: two kvtierd processes, one on the CUDA backend and one on
 * the host backend, driven by this process with the same decode workload (append from T0
 * slots, scores, RETIER with promotions, demotions and int8 rows, FETCH of T1/T2 and of position
 * lists). The CUDA side's T0 and staging regions are cudaMalloc memory shared with the daemon by
 * CUDA IPC (two processes); after every step they must equal the host side's byte for byte, and
 * every RETIER answer must be identical. Also: the session event orders a stream after a FETCH;
 * libkvtier's driver-API side on the real driver (a T0 region inside an allocation, a staging
 * region from kvt_buf_alloc_cuda(), kvt_cuda_stream_wait() on a runtime stream).
 * Exits 77 without a device.
 */
#define _GNU_SOURCE
#include <check.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvtier.h"

#define L      4
#define H      2
#define D      64
#define ROW    (H * D * 4) /* f32 */
#define SLOTS  32
#define STAGE  512
#define TOKENS 300

struct side {
	struct kvtd_proc d;
	int cuda;
	struct kvt_client *c;
	struct kvt_buf *t0, *st;
	uint8_t *t0p, *stp; /* host mapping, or device pointer */
	uint32_t seq;
};

static size_t t0_len = (size_t)L * 2 * SLOTS * ROW, st_len = (size_t)L * 2 * STAGE * ROW;

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void
side_open(struct side *k, int cuda)
{
	static const char *const host[] = {"--backend", "host", NULL};
	static const char *const dev[] = {"--backend", "cuda", NULL};
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};

	memset(k, 0, sizeof(*k));
	k->cuda = cuda;
	daemon_start(&k->d, cuda ? dev : host);
	ck_assert_int_eq(kvt_connect(k->d.sock, &o, &k->c), 0);
	if (cuda) {
		ck_assert_int_eq(cudaMalloc((void **)&k->t0p, t0_len), cudaSuccess);
		ck_assert_int_eq(cudaMalloc((void **)&k->stp, st_len), cudaSuccess);
		ck_assert_int_eq(cudaMemset(k->stp, 0, st_len), cudaSuccess);
		ck_assert_int_eq(kvt_buf_register_cuda(k->c, k->t0p, t0_len, &k->t0), 0);
		ck_assert_int_eq(kvt_buf_register_cuda(k->c, k->stp, st_len, &k->st), 0);
	} else {
		ck_assert_int_eq(kvt_buf_alloc(k->c, t0_len, &k->t0), 0);
		ck_assert_int_eq(kvt_buf_alloc(k->c, st_len, &k->st), 0);
		k->t0p = kvt_buf_ptr(k->t0);
		k->stp = kvt_buf_ptr(k->st);
	}
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 8;
	p.sinks = 4;
	p.window = 8;
	p.hbm_frac = 0.2f;
	p.evict_frac = 0.0f;
	p.t2_frac = 0.4f;
	p.t0_buf_id = kvt_buf_id(k->t0);
	p.t0_slots = SLOTS;
	p.t0_slot_stride = ROW;
	p.t0_kv_stride = (uint64_t)SLOTS * ROW;
	p.t0_layer_stride = 2ull * SLOTS * ROW;
	p.stage_buf_id = kvt_buf_id(k->st);
	p.stage_slots = STAGE;
	p.stage_slot_stride = ROW;
	p.stage_kv_stride = (uint64_t)STAGE * ROW;
	p.stage_layer_stride = 2ull * STAGE * ROW;
	ck_assert_int_eq(kvt_seq_open(k->c, &p, &k->seq), 0);
}

static void
side_close(struct side *k)
{
	ck_assert_int_eq(kvt_seq_close(k->c, k->seq), 0);
	kvt_disconnect(k->c);
	if (k->cuda) {
		cudaFree(k->t0p);
		cudaFree(k->stp);
	}
	ck_assert_int_eq(daemon_stop(&k->d), 0);
}

/* kvtierd posts CQEs without waiting for its copies: the legacy default stream (the one
 * cudaMemcpy uses) waits on the session's event before touching a region it writes. */
static void
after_daemon(struct side *k)
{
	ck_assert_int_eq(kvt_cuda_stream_wait(k->c, NULL), 0);
}

static void
put(struct side *k, size_t off, const void *src, size_t len)
{
	if (k->cuda) {
		after_daemon(k);
		ck_assert_int_eq(cudaMemcpy(k->t0p + off, src, len, cudaMemcpyHostToDevice),
				 cudaSuccess);
	} else {
		memcpy(k->t0p + off, src, len);
	}
}

/* Both sides' region (T0 or staging) equal, byte for byte. */
static void
same_region(struct side *h, struct side *g, int stage, const char *when)
{
	size_t len = stage ? st_len : t0_len;
	uint8_t *got = malloc(len);

	ck_assert_ptr_nonnull(got);
	after_daemon(g);
	ck_assert_int_eq(cudaMemcpy(got, stage ? g->stp : g->t0p, len, cudaMemcpyDeviceToHost),
			 cudaSuccess);
	ck_assert_msg(!memcmp(got, stage ? h->stp : h->t0p, len), "%s region differs %s",
		      stage ? "staging" : "T0", when);
	free(got);
}

START_TEST(gpu_matches_host_backend)
{
	static uint8_t out_h[SLOTS * 16 + 256], out_g[SLOTS * 16 + 256];
	static uint32_t pos_h[STAGE], pos_g[STAGE];
	static float w[TOKENS];
	uint8_t row[ROW];
	struct side h, g;
	uint32_t free_slots[SLOTS], n_free = 0, next = 0;
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	char when[64];
	int r;

	side_open(&h, 0);
	side_open(&g, 1);
	for (uint32_t n = 0; n <= TOKENS; n++) {
		if (next == n_free) {
			const struct kvt_retier_result *res = (const void *)out_h;
			int rg;

			r = kvt_retier(h.c, h.seq, out_h, sizeof(out_h));
			rg = kvt_retier(g.c, g.seq, out_g, sizeof(out_g));
			ck_assert_int_gt(r, 0);
			ck_assert_int_eq(r, rg);
			ck_assert(!memcmp(out_h, out_g, (size_t)r));
			memcpy(free_slots, out_h + sizeof(*res) + res->n_changes * 8,
			       res->n_free * 4);
			n_free = res->n_free;
			next = 0;
			snprintf(when, sizeof(when), "after RETIER at n=%u", n);
			same_region(&h, &g, 0, when); /* promotions wrote T0 slots */
		}
		if (n == TOKENS)
			break;
		{
			uint32_t slot = free_slots[next++];

			for (uint32_t l = 0; l < L; l++)
				for (uint32_t kv = 0; kv < 2; kv++) {
					size_t off =
					    (size_t)(2 * l * SLOTS + kv * SLOTS + slot) * ROW;

					for (int i = 0; i < ROW / 4; i++) {
						float f = (float)(int)(rnd(&rng) % 20001 - 10000) /
							  1000.0f;

						memcpy(row + 4 * i, &f, 4);
					}
					put(&h, off, row, ROW);
					put(&g, off, row, ROW);
				}
			ck_assert_int_eq(kvt_append_t0(h.c, h.seq, &slot, 1), n + 1);
			ck_assert_int_eq(kvt_append_t0(g.c, g.seq, &slot, 1), n + 1);
		}
		for (uint32_t i = 0; i <= n; i++) {
			float x = (float)(rnd(&rng) % 1000) / 1000.0f;

			w[i] = x > 0.9f ? 1.0f : x * x * 0.01f;
		}
		ck_assert_int_eq(kvt_score_add(h.c, h.seq, 0, w, n + 1), 0);
		ck_assert_int_eq(kvt_score_add(g.c, g.seq, 0, w, n + 1), 0);
		if (n % 50 == 49) {
			/* Every T1 and T2 row (T2 dequantized) into staging, all layers. */
			r = kvt_fetch(h.c, h.seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, L, 0, pos_h,
				      STAGE);
			ck_assert_int_ge(r, 0);
			ck_assert_int_eq(kvt_fetch(g.c, g.seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0,
						   L, 0, pos_g, STAGE),
					 r);
			ck_assert(!memcmp(pos_h, pos_g, (size_t)r * 4));
			/* A scattered position list on top, layers 1..2, staging row 3 on. */
			for (uint32_t i = 0; i < 16; i++)
				pos_h[i] = pos_g[i] = (uint32_t)(rnd(&rng) % (n + 1));
			ck_assert_int_eq(
			    kvt_fetch(h.c, h.seq, KVT_FETCH_F_LIST, 1, 2, 3, pos_h, 16), 16);
			ck_assert_int_eq(
			    kvt_fetch(g.c, g.seq, KVT_FETCH_F_LIST, 1, 2, 3, pos_g, 16), 16);
			snprintf(when, sizeof(when), "after FETCH at n=%u", n);
			same_region(&h, &g, 1, when);
		}
	}
	side_close(&g);
	side_close(&h);
}
END_TEST

START_TEST(gpu_session_event_orders_stream)
{
	struct side g;
	cudaStream_t s;
	void *ev = NULL;
	uint32_t slot = 0, pos = 0;
	uint8_t row[ROW], *back;

	side_open(&g, 1);
	ck_assert_int_eq(kvt_event_get_cuda(g.c, 0, &ev), 0);
	{
		uint8_t out[SLOTS * 16 + 256];
		const struct kvt_retier_result *res = (const void *)out;

		ck_assert_int_gt(kvt_retier(g.c, g.seq, out, sizeof(out)), 0);
		ck_assert_uint_gt(res->n_free, 0);
		memcpy(&slot, out + sizeof(*res) + res->n_changes * 8, 4); /* first free slot */
	}
	memset(row, 0x3c, sizeof(row));
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			put(&g, (size_t)(2 * l * SLOTS + kv * SLOTS + slot) * ROW, row, ROW);
	ck_assert_int_eq(kvt_append_t0(g.c, g.seq, &slot, 1), 1);
	ck_assert_int_eq(kvt_fetch(g.c, g.seq, KVT_FETCH_F_LIST, 0, 1, 7, &pos, 1), 1);
	/* The stream waits on the daemon's event, then reads the staged row. */
	ck_assert_int_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(cudaStreamWaitEvent(s, (cudaEvent_t)ev, 0), cudaSuccess);
	ck_assert_int_eq(cudaMallocHost((void **)&back, ROW), cudaSuccess);
	ck_assert_int_eq(cudaMemcpyAsync(back, g.stp + 7 * ROW, ROW, cudaMemcpyDeviceToHost, s),
			 cudaSuccess);
	ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
	ck_assert_mem_eq(back, row, ROW);
	cudaFreeHost(back);
	cudaStreamDestroy(s);
	cudaEventDestroy((cudaEvent_t)ev);
	side_close(&g);
}
END_TEST

/* libkvtier reaches CUDA through the driver it dlopens, next to this process's runtime: T0 at
 * an offset inside a cudaMalloc allocation, staging allocated by libkvtier, the stream ordered
 * by kvt_cuda_stream_wait(); the staged row is read on that stream. */
START_TEST(gpu_client_driver_api)
{
	static const char *const dev[] = {"--backend", "cuda", NULL};
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_seq_params p = {.size = sizeof(p)};
	size_t pad = 1 << 16;
	uint8_t row[ROW], *a, *back, *guard;
	struct kvtd_proc d;
	struct kvt_client *c;
	struct kvt_buf *t0, *st;
	uint32_t seq, slot = 2, pos = 0;
	cudaStream_t s;

	daemon_start(&d, dev);
	ck_assert_int_eq(kvt_connect(d.sock, &o, &c), 0);
	ck_assert_int_eq(cudaMalloc((void **)&a, pad + t0_len + pad), cudaSuccess);
	ck_assert_int_eq(cudaMemset(a, 0x5a, pad + t0_len + pad), cudaSuccess);
	ck_assert_int_eq(kvt_buf_register_cuda(c, a + pad, t0_len, &t0), 0);
	ck_assert_uint_eq(kvt_buf_offset(t0), pad);
	ck_assert_int_eq(kvt_buf_alloc_cuda(c, 0, st_len, &st), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 2;
	p.window = 2;
	p.hbm_frac = 0.5f;
	p.t0_buf_id = kvt_buf_id(t0);
	p.t0_slots = SLOTS;
	p.t0_slot_stride = ROW;
	p.t0_kv_stride = (uint64_t)SLOTS * ROW;
	p.t0_layer_stride = 2ull * SLOTS * ROW;
	p.stage_buf_id = kvt_buf_id(st);
	p.stage_slots = STAGE;
	p.stage_slot_stride = ROW;
	p.stage_kv_stride = (uint64_t)STAGE * ROW;
	p.stage_layer_stride = 2ull * STAGE * ROW;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	for (int i = 0; i < ROW; i++)
		row[i] = (uint8_t)(i * 29 + 1);
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			ck_assert_int_eq(
			    cudaMemcpy(a + pad + (size_t)(2 * l * SLOTS + kv * SLOTS + slot) * ROW,
				       row, ROW, cudaMemcpyHostToDevice),
			    cudaSuccess);
	ck_assert_int_eq(kvt_append_t0(c, seq, &slot, 1), 1);
	ck_assert_int_eq(kvt_fetch(c, seq, KVT_FETCH_F_LIST, 0, 1, 7, &pos, 1), 1);
	ck_assert_int_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
	ck_assert_int_eq(cudaMallocHost((void **)&back, ROW), cudaSuccess);
	ck_assert_int_eq(cudaMemcpyAsync(back, (uint8_t *)kvt_buf_ptr(st) + 7 * ROW, ROW,
					 cudaMemcpyDeviceToHost, s),
			 cudaSuccess);
	ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
	ck_assert_mem_eq(back, row, ROW);
	/* The bytes around the T0 region are as they were: the daemon wrote nothing there. */
	guard = malloc(pad);
	ck_assert_int_eq(cudaMemcpy(guard, a, pad, cudaMemcpyDeviceToHost), cudaSuccess);
	for (size_t i = 0; i < pad; i++)
		ck_assert_uint_eq(guard[i], 0x5a);
	free(guard);
	cudaFreeHost(back);
	cudaStreamDestroy(s);
	ck_assert_int_eq(kvt_seq_close(c, seq), 0);
	ck_assert_int_eq(kvt_buf_free(c, st), 0);
	ck_assert_int_eq(kvt_buf_free(c, t0), 0);
	kvt_disconnect(c);
	cudaFree(a);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/*
 * A serving engine's paged cache on the device, each layer a cudaMalloc of its own laid out
 * [K|V][block][token in block][heads][dim] (vLLM's FlashAttention layout): kvt_fetch_rows()
 * (ABI 1.6) puts a sequence's blocks into scattered cache blocks of every layer, one call per
 * layer into that layer's registration; the cache then holds the appended rows bit for bit and
 * nothing else.
 */
#define PC_NB 64 /* cache blocks */
#define PC_BS 16 /* tokens per block */
#define PC_N  5	 /* the sequence's blocks */
START_TEST(gpu_fetch_rows_paged_cache)
{
	static const char *const dev[] = {"--backend", "cuda", NULL};
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	size_t layer_len = 2ull * PC_NB * PC_BS * ROW, n = (size_t)PC_N * PC_BS;
	const uint32_t blocks[PC_N] = {17, 3, 63, 40, 4};
	uint32_t pos[PC_N * PC_BS], row[PC_N * PC_BS], seq;
	float *rows_in = malloc(n * L * 2 * H * D * sizeof(float));
	uint8_t *got = calloc(1, layer_len), *want = calloc(1, layer_len);
	struct kvt_buf *lb[L];
	uint8_t *cache[L];
	struct kvtd_proc d;
	struct kvt_client *c;
	uint64_t rs = 99;

	ck_assert(rows_in && got && want);
	daemon_start(&d, dev);
	ck_assert_int_eq(kvt_connect(d.sock, &o, &c), 0);
	for (unsigned l = 0; l < L; l++) {
		ck_assert_int_eq(cudaMalloc((void **)&cache[l], layer_len), cudaSuccess);
		ck_assert_int_eq(cudaMemset(cache[l], 0, layer_len), cudaSuccess);
		ck_assert_int_eq(kvt_buf_register_cuda(c, cache[l], layer_len, &lb[l]), 0);
	}
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 8;
	p.hbm_frac = 1.0f;
	p.stage_buf_id = kvt_buf_id(lb[0]);
	p.stage_slots = PC_NB * PC_BS;
	p.stage_slot_stride = ROW;
	p.stage_kv_stride = (uint64_t)PC_NB * PC_BS * ROW;
	p.stage_layer_stride = 0;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	for (size_t i = 0; i < n * L * 2 * H * D; i++)
		rows_in[i] = (float)(int64_t)(rnd(&rs) % 2000001) / 1000.0f - 1000.0f;
	ck_assert_int_eq(kvt_append(c, seq, rows_in, n * L * 2 * ROW, (uint32_t)n, NULL),
			 (int64_t)n);
	for (uint32_t i = 0; i < n; i++) {
		pos[i] = i;
		row[i] = blocks[i / PC_BS] * PC_BS + i % PC_BS;
	}
	for (unsigned l = 0; l < L; l++)
		ck_assert_int_eq(kvt_fetch_rows(c, seq, l, 1, lb[l], pos, row, (uint32_t)n),
				 (int)n);
	ck_assert_int_eq(kvt_cuda_stream_wait(c, NULL), 0);
	for (unsigned l = 0; l < L; l++) {
		memset(want, 0, layer_len);
		for (size_t i = 0; i < n; i++)
			for (unsigned kv = 0; kv < 2; kv++)
				memcpy(want + kv * p.stage_kv_stride + (uint64_t)row[i] * ROW,
				       rows_in + ((i * L + l) * 2 + kv) * H * D, ROW);
		ck_assert_int_eq(cudaMemcpy(got, cache[l], layer_len, cudaMemcpyDeviceToHost),
				 cudaSuccess);
		ck_assert_msg(!memcmp(got, want, layer_len), "layer %u's cache differs", l);
	}
	ck_assert_int_eq(kvt_seq_close(c, seq), 0);
	kvt_disconnect(c);
	for (unsigned l = 0; l < L; l++)
		cudaFree(cache[l]);
	ck_assert_int_eq(daemon_stop(&d), 0);
	free(rows_in);
	free(got);
	free(want);
}
END_TEST

int
main(void)
{
	Suite *su = suite_create("gpu_daemon");
	TCase *t = tcase_create("daemon");
	SRunner *sr;
	int n = 0, failed;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("check_gpu_daemon: no CUDA device\n");
		return 77;
	}
	tcase_set_timeout(t, 240);
	tcase_add_test(t, gpu_matches_host_backend);
	tcase_add_test(t, gpu_session_event_orders_stream);
	tcase_add_test(t, gpu_client_driver_api);
	tcase_add_test(t, gpu_fetch_rows_paged_cache);
	suite_add_tcase(su, t);
	sr = srunner_create(su);
	/* No fork: a CUDA context does not survive fork(); each test uses its own daemons. */
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
