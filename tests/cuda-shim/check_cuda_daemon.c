/* SPDX-License-Identifier: MIT */
/*
 * check_cuda_daemon - the production kvtierd on its CUDA backend and real client processes,
 * both running on the fake CUDA runtime (LD_PRELOAD of libkvt_cudashim, set by ctest): rows go
 * from a cudaMalloc T0 region to the pool and back into a cudaMalloc staging region bit for bit;
 * every IPC handle the daemon opens is closed exactly once, across repeated registrations,
 * unregistration, and a client killed with SIGKILL. The daemon's CUDA calls are read from its
 * shim log (KVT_SHIM_LOG).
 */
#define _GNU_SOURCE
#include <check.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

#define L     2
#define D     64
#define SLOTS 8
#define STEPS 8
#define ROW   (D * 4) /* one head, f32 */

static struct kvtd_proc Dm;
static char shim_log[200];

static void
start(void)
{
	static const char *const extra[] = {"--backend", "cuda", NULL};

	snprintf(shim_log, sizeof(shim_log), "/tmp/kvt-shim-log-%d", (int)getpid());
	unlink(shim_log);
	setenv("KVT_SHIM_LOG", shim_log, 1); /* read by the shim in the exec'd daemon */
	daemon_start(&Dm, extra);
	unsetenv("KVT_SHIM_LOG");
}

/* Lines of the daemon's shim log containing @needle. */
static unsigned
log_count(const char *needle)
{
	char line[512];
	unsigned n = 0;
	FILE *f = fopen(shim_log, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

static int
wait_log(const char *needle, unsigned want)
{
	for (int i = 0; i < 500; i++) {
		if (log_count(needle) >= want)
			return 1;
		usleep(10000);
	}
	return 0;
}

static void
stop(void)
{
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

START_TEST(cuda_daemon_append_fetch_bit_exact)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_seq_params p = {.size = sizeof(p)};
	size_t t0_len = (size_t)L * 2 * SLOTS * ROW, st_len = (size_t)L * 2 * STEPS * ROW;
	struct kvt_buf *t0, *st;
	struct kvt_client *c;
	uint8_t *t0p, *stp;
	uint32_t seq, slots[2] = {2, 0}, list[2] = {1, 0};
	void *ev = NULL;

	start();
	{
		struct json_object *s = admin_request(Dm.sock, KVT_CTL_STATUS);

		ck_assert_ptr_nonnull(s);
		ck_assert_str_eq(json_object_get_string(json_object_object_get(s, "backend")),
				 "cuda:0 kvt-shim GPU 0");
		json_object_put(s);
	}
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	ck_assert_int_eq(cudaMalloc((void **)&t0p, t0_len), cudaSuccess);
	ck_assert_int_eq(cudaMalloc((void **)&stp, st_len), cudaSuccess);
	ck_assert_int_eq(kvt_buf_register_cuda(c, t0p, t0_len, &t0), 0);
	ck_assert_int_eq(kvt_buf_register_cuda(c, stp, st_len, &st), 0);
	ck_assert_ptr_eq(kvt_buf_ptr(t0), t0p);
	/* A range that passes the allocation's end (inside it is fine: check_cuda_client). */
	ck_assert_int_eq(kvt_buf_register_cuda(c, t0p + 64, t0_len, &t0), -EINVAL);
	ck_assert_int_eq(kvt_event_get_cuda(c, 0, &ev), 0);
	ck_assert_ptr_nonnull(ev);
	cudaEventDestroy(ev);
	p.layers = L;
	p.kv_heads = 1;
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
	p.stage_slots = STEPS;
	p.stage_slot_stride = ROW;
	p.stage_kv_stride = (uint64_t)STEPS * ROW;
	p.stage_layer_stride = 2ull * STEPS * ROW;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	for (size_t i = 0; i < t0_len; i++)
		t0p[i] = (uint8_t)(i * 131 + 7);
	ck_assert_int_eq(kvt_append_t0(c, seq, slots, 2), 2);
	/* Positions 1 then 0 (slots 0 and 2) into staging rows 0 and 1 of every layer. */
	ck_assert_int_eq(kvt_fetch(c, seq, KVT_FETCH_F_LIST, 0, L, 0, list, 2), 2);
	/* The CQE does not wait for the copies: a stream ordered after them, then the rows. */
	{
		cudaStream_t s;

		ck_assert_int_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
		ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
		ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
		cudaStreamDestroy(s);
	}
	for (unsigned l = 0; l < L; l++)
		for (unsigned kv = 0; kv < 2; kv++)
			for (unsigned r = 0; r < 2; r++) {
				uint32_t slot = slots[list[r]];

				ck_assert_mem_eq(stp + l * p.stage_layer_stride +
						     kv * p.stage_kv_stride + r * ROW,
						 t0p + l * p.t0_layer_stride + kv * p.t0_kv_stride +
						     slot * ROW,
						 ROW);
			}
	/* The daemon moved the rows with launches, never with a copy per row. */
	ck_assert_uint_ge(log_count("cudaLaunchKernel kvt_rows_copy"), 2);
	ck_assert_uint_eq(log_count("cudaMemcpyAsync"), 0);
	kvt_disconnect(c);
	ck_assert(wait_log("cudaIpcCloseMemHandle", 2));
	cudaFree(t0p);
	cudaFree(stp);
	stop();
	ck_assert_uint_eq(log_count("cudaIpcOpenMemHandle"), 2);
	ck_assert_uint_eq(log_count("cudaIpcCloseMemHandle"), 2);
	unlink(shim_log);
}
END_TEST

/*
 * A serving engine's paged cache on the device, each layer a cudaMalloc of its own laid out
 * [K|V][block][token in block][row] (vLLM's FlashAttention layout): kvt_fetch_rows() puts a
 * sequence's two blocks into blocks 3 and 1 of every layer's cache, one call per layer into
 * that layer's registration (FETCH's buf_id and KVT_FETCH_F_ROWS, ABI 1.6), bit for bit, with
 * the other blocks untouched, through row-copy launches; every IPC handle is closed once.
 */
#define NB 4 /* blocks in the cache */
#define BS 4 /* tokens per block */
START_TEST(cuda_daemon_fetch_rows_into_layer_caches)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_seq_params p = {.size = sizeof(p)};
	size_t layer_len = 2ull * NB * BS * ROW;
	static float rows_in[2 * BS][L][2][D];
	uint32_t pos[2 * BS], row[2 * BS], seq;
	struct kvt_buf *lb[L];
	struct kvt_client *c;
	uint8_t *cache[L];
	cudaStream_t s;

	start();
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	for (unsigned l = 0; l < L; l++) {
		ck_assert_int_eq(cudaMalloc((void **)&cache[l], layer_len), cudaSuccess);
		memset(cache[l], 0, layer_len);
		ck_assert_int_eq(kvt_buf_register_cuda(c, cache[l], layer_len, &lb[l]), 0);
	}
	p.layers = L;
	p.kv_heads = 1;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 2;
	p.hbm_frac = 1.0f;
	p.stage_buf_id = kvt_buf_id(lb[0]); /* the layout: one layer's cache */
	p.stage_slots = NB * BS;
	p.stage_slot_stride = ROW;
	p.stage_kv_stride = (uint64_t)NB * BS * ROW;
	p.stage_layer_stride = 0;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	for (unsigned t = 0; t < 2 * BS; t++)
		for (unsigned l = 0; l < L; l++)
			for (unsigned kv = 0; kv < 2; kv++)
				for (unsigned d = 0; d < D; d++)
					rows_in[t][l][kv][d] =
					    (float)(t * 1000 + l * 100 + kv * 10) +
					    (float)d / 64.0f;
	ck_assert_int_eq(kvt_append(c, seq, rows_in, sizeof(rows_in), 2 * BS, NULL), 2 * BS);
	/* the sequence's block 0 goes to cache block 3, its block 1 to cache block 1 */
	for (unsigned i = 0; i < 2 * BS; i++) {
		pos[i] = i;
		row[i] = (i < BS ? 3 : 1) * BS + i % BS;
	}
	for (unsigned l = 0; l < L; l++)
		ck_assert_int_eq(kvt_fetch_rows(c, seq, l, 1, lb[l], pos, row, 2 * BS), 2 * BS);
	ck_assert_int_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
	ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
	cudaStreamDestroy(s);
	for (unsigned l = 0; l < L; l++)
		for (unsigned kv = 0; kv < 2; kv++) {
			const uint8_t *plane = cache[l] + kv * p.stage_kv_stride;

			for (unsigned i = 0; i < 2 * BS; i++)
				ck_assert_msg(
				    !memcmp(plane + (uint64_t)row[i] * ROW, rows_in[i][l][kv], ROW),
				    "layer %u kv %u position %u at row %u", l, kv, i, row[i]);
			for (unsigned b = 0; b < NB; b += 2) /* blocks 0 and 2: never written */
				for (size_t k = 0; k < (size_t)BS * ROW; k++)
					ck_assert_uint_eq(plane[(size_t)b * BS * ROW + k], 0);
		}
	ck_assert_uint_ge(log_count("cudaLaunchKernel kvt_rows_copy"), L);
	/* a buffer one row too small for the layout is refused, and nothing moves */
	{
		struct kvt_buf *small;
		uint8_t *sp;

		ck_assert_int_eq(cudaMalloc((void **)&sp, layer_len - ROW), cudaSuccess);
		ck_assert_int_eq(kvt_buf_register_cuda(c, sp, layer_len - ROW, &small), 0);
		ck_assert_int_eq(kvt_fetch_rows(c, seq, 0, 1, small, pos, row, 2 * BS), -ERANGE);
		ck_assert_int_eq(kvt_buf_free(c, small), 0);
		cudaFree(sp);
	}
	kvt_disconnect(c);
	ck_assert(wait_log("cudaIpcCloseMemHandle", L + 1));
	for (unsigned l = 0; l < L; l++)
		cudaFree(cache[l]);
	stop();
	ck_assert_uint_eq(log_count("cudaIpcOpenMemHandle"), L + 1);
	ck_assert_uint_eq(log_count("cudaIpcCloseMemHandle"), L + 1);
	unlink(shim_log);
}
END_TEST

/*
 * FETCH of T2 rows: on the CUDA backend the codes cross as int8 and the row kernel dequantizes
 * them; the staged bytes equal those of a host-backend daemon (CPU dequantization) fed the same
 * rows, for per-head scales and for per-channel key scales, f16 and bf16.
 */
#define T2_N 40
#define T2_H 2

/* Stage every T1/T2 row of a sequence fed deterministic rows, on @sock; the staged bytes go to
 * @out, the positions to @pos. @cuda: device buffers (else host buffers). */
static int
t2_fetch(const char *sock, int cuda, int dtype, uint32_t t2_flags, uint8_t *out, uint32_t *pos)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_seq_params p = {.size = sizeof(p)};
	uint64_t row = (uint64_t)T2_H * D * 2, tok = (uint64_t)L * 2 * row;
	uint64_t t0_len = (uint64_t)L * 2 * 16 * row, st_len = (uint64_t)L * 2 * T2_N * row;
	struct kvt_buf *t0, *st;
	struct kvt_client *c;
	uint8_t *rows = malloc(T2_N * tok), *t0p = NULL, *stp = NULL, res[4096];
	cudaStream_t s;
	int m;

	ck_assert_int_eq(kvt_connect(sock, &o, &c), 0);
	if (cuda) {
		ck_assert_int_eq(cudaMalloc((void **)&t0p, t0_len), cudaSuccess);
		ck_assert_int_eq(cudaMalloc((void **)&stp, st_len), cudaSuccess);
		ck_assert_int_eq(kvt_buf_register_cuda(c, t0p, t0_len, &t0), 0);
		ck_assert_int_eq(kvt_buf_register_cuda(c, stp, st_len, &st), 0);
	} else {
		ck_assert_int_eq(kvt_buf_alloc(c, t0_len, &t0), 0);
		ck_assert_int_eq(kvt_buf_alloc(c, st_len, &st), 0);
		stp = kvt_buf_ptr(st);
	}
	memset(stp, 0, st_len);
	p.layers = L;
	p.kv_heads = T2_H;
	p.head_dim = D;
	p.dtype = (uint8_t)dtype;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 2;
	p.hbm_frac = 0.2f;
	p.t2_frac = 0.5f;
	p.t2_flags = t2_flags;
	p.t0_buf_id = kvt_buf_id(t0);
	p.t0_slots = 16;
	p.t0_slot_stride = row;
	p.t0_kv_stride = 16 * row;
	p.t0_layer_stride = 32 * row;
	p.stage_buf_id = kvt_buf_id(st);
	p.stage_slots = T2_N;
	p.stage_slot_stride = row;
	p.stage_kv_stride = T2_N * row;
	p.stage_layer_stride = 2 * T2_N * row;
	ck_assert_int_eq(kvt_seq_open(c, &p, (uint32_t *)&m), 0);
	/* Values of a few bits' mantissa, exact in f16 and bf16, with per-channel outliers. */
	for (uint64_t i = 0; i < T2_N * tok / 2; i++) {
		float x = (float)((int)((i * 2654435761u) >> 20 & 255) - 128) / 32.0f *
			  ((i % D) == 3 ? 8.0f : 1.0f);
		uint32_t u;
		uint16_t h;

		memcpy(&u, &x, 4);
		if (dtype == KVT_DTYPE_BF16) {
			h = (uint16_t)(u >> 16);
		} else {
			_Float16 f = (_Float16)x;

			memcpy(&h, &f, 2);
		}
		memcpy(rows + 2 * i, &h, 2);
	}
	ck_assert_int_eq(kvt_append(c, (uint32_t)m, rows, T2_N * tok, T2_N, NULL), T2_N);
	ck_assert_int_gt(kvt_retier(c, (uint32_t)m, res, sizeof(res)), 0);
	ck_assert_uint_gt(((struct kvt_retier_result *)res)->tier_count[2], 0); /* T2 */
	m = kvt_fetch(c, (uint32_t)m, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, L, 0, pos, T2_N);
	ck_assert_int_gt(m, 0);
	if (cuda) {
		/* The reply does not wait for the copies: order a stream after them. */
		ck_assert_int_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
		ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
		ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
		cudaStreamDestroy(s);
	}
	memcpy(out, stp, st_len);
	kvt_disconnect(c);
	if (cuda) {
		cudaFree(t0p);
		cudaFree(stp);
	}
	free(rows);
	return m;
}

START_TEST(cuda_daemon_t2_fetch_equals_host)
{
	static const char *const host_args[] = {"--backend", "host", NULL};
	uint64_t st_len = (uint64_t)L * 2 * T2_N * T2_H * D * 2;
	uint8_t *a = malloc(st_len), *b = malloc(st_len);
	uint32_t pa[T2_N], pb[T2_N];
	struct kvtd_proc H;
	int na, nb;

	start();
	daemon_start(&H, host_args);
	for (int k = 0; k < 4; k++) {
		int dtype = k & 1 ? KVT_DTYPE_BF16 : KVT_DTYPE_F16;
		uint32_t fl = k & 2 ? KVT_T2_F_KEY_CHANNEL : 0;
		unsigned before = log_count(" int8");

		na = t2_fetch(Dm.sock, 1, dtype, fl, a, pa);
		nb = t2_fetch(H.sock, 0, dtype, fl, b, pb);
		ck_assert_int_eq(na, nb);
		ck_assert_mem_eq(pa, pb, (size_t)na * 4);
		ck_assert_mem_eq(a, b, st_len);
		/* The CUDA daemon moved int8 rows to the row kernel. */
		ck_assert_uint_gt(log_count(" int8"), before);
	}
	ck_assert_int_eq(daemon_stop(&H), 0);
	stop();
	unlink(shim_log);
	free(a);
	free(b);
}
END_TEST

/* Lines of the daemon's shim log that name a call that waits for the device. */
static unsigned
device_waits(void)
{
	return log_count("cudaStreamSynchronize") + log_count("cudaEventSynchronize") +
	       log_count("cudaDeviceSynchronize");
}

/* Row content of position @pos, (layer, K|V) @r: distinct per position and row, f32. */
static void
pos_rows(uint8_t *tok, uint32_t pos)
{
	for (unsigned r = 0; r < 2 * L; r++)
		for (unsigned i = 0; i < D; i++) {
			float v = (float)(pos * 1000 + r * 10) + (float)i / 128.0f;

			memcpy(tok + r * ROW + 4 * i, &v, 4);
		}
}

/*
 * A FETCH's CQE comes without the daemon waiting for its copies (the device here is slow: the
 * shim runs the daemon's queued work 500 ms late), and the pool keeps the slots those copies
 * read until they ran: the fetched positions are evicted by the next RETIER and new tokens are
 * appended at once, into slots a LIFO free list would hand back first. The staged rows are
 * still the fetched positions' once the client's stream has waited on the session event, whose
 * first use (EVENT_GET after the FETCH) covers the copies already queued.
 */
START_TEST(cuda_daemon_fetch_does_not_wait_and_slots_wait_for_it)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_seq_params p = {.size = sizeof(p)};
	size_t t0_len = (size_t)L * 2 * SLOTS * ROW, st_len = (size_t)L * 2 * STEPS * ROW;
	uint8_t toks[4 * 2 * L * ROW], res[4096], *t0p, *stp, want[ROW];
	uint32_t seq, pos[STEPS];
	struct kvt_buf *t0, *st;
	struct kvt_client *c;
	cudaStream_t s;
	unsigned waits;
	int m;

	setenv("KVT_SHIM_DELAY_MS", "500", 1);
	start();
	unsetenv("KVT_SHIM_DELAY_MS");
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	ck_assert_int_eq(cudaMalloc((void **)&t0p, t0_len), cudaSuccess);
	ck_assert_int_eq(cudaMalloc((void **)&stp, st_len), cudaSuccess);
	ck_assert_int_eq(kvt_buf_register_cuda(c, t0p, t0_len, &t0), 0);
	ck_assert_int_eq(kvt_buf_register_cuda(c, stp, st_len, &st), 0);
	memset(stp, 0, st_len);
	p.layers = L;
	p.kv_heads = 1;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 2;
	p.hbm_frac = 0.25f;
	p.evict_frac = 0.5f;
	p.t0_buf_id = kvt_buf_id(t0);
	p.t0_slots = SLOTS;
	p.t0_slot_stride = ROW;
	p.t0_kv_stride = (uint64_t)SLOTS * ROW;
	p.t0_layer_stride = 2ull * SLOTS * ROW;
	p.stage_buf_id = kvt_buf_id(st);
	p.stage_slots = STEPS;
	p.stage_slot_stride = ROW;
	p.stage_kv_stride = (uint64_t)STEPS * ROW;
	p.stage_layer_stride = 2ull * STEPS * ROW;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	for (uint32_t b = 0; b < 2; b++) {
		for (uint32_t i = 0; i < 4; i++)
			pos_rows(toks + i * 2 * L * ROW, 4 * b + i);
		ck_assert_int_eq(kvt_append(c, seq, toks, sizeof(toks), 4, NULL), 4 * b + 4);
	}
	/* n = 8: 4 evicted, 2 in T0, 2 in T1. */
	ck_assert_int_gt(kvt_retier(c, seq, res, sizeof(res)), 0);
	ck_assert_uint_eq(((struct kvt_retier_result *)res)->tier_count[1], 2);
	waits = device_waits();
	m = kvt_fetch(c, seq, KVT_FETCH_F_T1, 0, L, 0, pos, STEPS);
	ck_assert_int_eq(m, 2);
	ck_assert_uint_eq(device_waits(), waits); /* the reply did not wait for the copies */
	/* The fetched positions are evicted (n = 12: 6 evicted), their slots freed, and new
	 * tokens appended into the pool at once. */
	for (uint32_t i = 0; i < 4; i++)
		pos_rows(toks + i * 2 * L * ROW, 8 + i);
	ck_assert_int_eq(kvt_append(c, seq, toks, sizeof(toks), 4, NULL), 12);
	ck_assert_int_gt(kvt_retier(c, seq, res, sizeof(res)), 0);
	ck_assert_uint_eq(((struct kvt_retier_result *)res)->tier_count[3], 6);
	for (uint32_t i = 0; i < 4; i++)
		pos_rows(toks + i * 2 * L * ROW, 12 + i);
	ck_assert_int_eq(kvt_append(c, seq, toks, sizeof(toks), 4, NULL), 16);
	ck_assert_int_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
	ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
	for (int r = 0; r < m; r++)
		for (unsigned l = 0; l < L; l++)
			for (unsigned kv = 0; kv < 2; kv++) {
				uint8_t tok[2 * L * ROW];

				pos_rows(tok, pos[r]);
				memcpy(want, tok + (2 * l + kv) * ROW, ROW);
				ck_assert_mem_eq(stp + l * p.stage_layer_stride +
						     kv * p.stage_kv_stride + r * ROW,
						 want, ROW);
			}
	cudaStreamDestroy(s);
	kvt_disconnect(c);
	cudaFree(t0p);
	cudaFree(stp);
	stop();
	unlink(shim_log);
}
END_TEST

/* A client that registers one allocation @times times, reports its IPC id, then waits. */
static pid_t
client_spawn(int times, int unregister, char *ret_id, size_t idlen)
{
	int up[2];
	pid_t pid;

	ck_assert_int_eq(pipe(up), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvt_opts o = {.size = sizeof(o)};
		struct kvt_client *c;
		struct kvt_buf *b[4];
		cudaIpcMemHandle_t h;
		char id[64];
		struct {
			int64_t magic;
			int32_t pid, fd;
			uint64_t size, serial;
		} m;
		void *p;

		close(up[0]);
		if (kvt_connect(Dm.sock, &o, &c) || cudaMalloc(&p, 1 << 20) ||
		    cudaIpcGetMemHandle(&h, p))
			_exit(1);
		memcpy(&m, h.reserved, sizeof(m));
		snprintf(id, sizeof(id), "id=%d.%llu", (int)m.pid, (unsigned long long)m.serial);
		for (int i = 0; i < times; i++)
			if (kvt_buf_register_cuda(c, p, 1 << 20, &b[i]))
				_exit(2);
		if (unregister)
			for (int i = 0; i < times; i++)
				if (kvt_buf_free(c, b[i]))
					_exit(3);
		if (write(up[1], id, sizeof(id)) != sizeof(id))
			_exit(4);
		pause();
		_exit(0);
	}
	close(up[1]);
	ck_assert_int_eq(read(up[0], ret_id, idlen), (ssize_t)idlen);
	close(up[0]);
	return pid;
}

START_TEST(cuda_daemon_ipc_closed_once)
{
	char a[64], b[64], want[128];
	pid_t pa, pb;
	int st;

	start();
	/* A: three registrations of one allocation, then killed with its buffers registered. */
	pa = client_spawn(3, 0, a, sizeof(a));
	/* B: two registrations, both unregistered, still connected. */
	pb = client_spawn(2, 1, b, sizeof(b));
	snprintf(want, sizeof(want), "cudaIpcOpenMemHandle %s", a);
	ck_assert_uint_eq(log_count(want), 1);
	snprintf(want, sizeof(want), "cudaIpcOpenMemHandle %s", b);
	ck_assert_uint_eq(log_count(want), 1);
	snprintf(want, sizeof(want), "cudaIpcCloseMemHandle %s", b);
	ck_assert_uint_eq(log_count(want), 1);
	kill(pa, SIGKILL);
	waitpid(pa, &st, 0);
	snprintf(want, sizeof(want), "cudaIpcCloseMemHandle %s", a);
	ck_assert(wait_log(want, 1));
	ck_assert(daemon_alive(&Dm));
	kill(pb, SIGKILL);
	waitpid(pb, &st, 0);
	stop();
	snprintf(want, sizeof(want), "cudaIpcCloseMemHandle %s", a);
	ck_assert_uint_eq(log_count(want), 1);
	snprintf(want, sizeof(want), "cudaIpcCloseMemHandle %s", b);
	ck_assert_uint_eq(log_count(want), 1);
	ck_assert_uint_eq(log_count("cudaIpcOpenMemHandle"), 2);
	ck_assert_uint_eq(log_count("cudaIpcCloseMemHandle"), 2);
	/* The pool was pinned at start and unpinned at stop. */
	ck_assert_uint_eq(log_count("cudaHostRegister"), 1);
	ck_assert_uint_eq(log_count("cudaHostUnregister"), 1);
	unlink(shim_log);
}
END_TEST

/*
 * A client killed with SIGKILL while its FETCH's copies are still queued (a device 500 ms
 * slow): the session's teardown frees the slots the copies read (quarantined) and drops the
 * staging buffer's IPC mapping only after the streams drained: the shim sees no memory
 * released under a queued copy, the mapping is closed once, and the daemon serves on.
 */
START_TEST(cuda_daemon_kill9_with_copies_queued)
{
	int up[2], st;
	char b;
	pid_t pid;

	setenv("KVT_SHIM_DELAY_MS", "500", 1);
	start();
	unsetenv("KVT_SHIM_DELAY_MS");
	ck_assert_int_eq(pipe(up), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvt_opts o = {.size = sizeof(o)};
		struct kvt_seq_params p = {.size = sizeof(p)};
		size_t st_len = (size_t)L * 2 * STEPS * ROW;
		uint8_t toks[4 * 2 * L * ROW];
		uint32_t seq, pos[STEPS];
		struct kvt_buf *sb;
		struct kvt_client *c;
		void *stp;

		close(up[0]);
		if (kvt_connect(Dm.sock, &o, &c) || cudaMalloc(&stp, st_len) ||
		    kvt_buf_register_cuda(c, stp, st_len, &sb))
			_exit(1);
		p.layers = L;
		p.kv_heads = 1;
		p.head_dim = D;
		p.dtype = KVT_DTYPE_F32;
		p.policy = KVT_POLICY_FULL;
		p.delta = 1;
		p.stage_buf_id = kvt_buf_id(sb);
		p.stage_slots = STEPS;
		p.stage_slot_stride = ROW;
		p.stage_kv_stride = (uint64_t)STEPS * ROW;
		p.stage_layer_stride = 2ull * STEPS * ROW;
		memset(toks, 0x5a, sizeof(toks));
		if (kvt_seq_open(c, &p, &seq) ||
		    kvt_append(c, seq, toks, sizeof(toks), 4, NULL) != 4 ||
		    kvt_fetch(c, seq, KVT_FETCH_F_T1, 0, L, 0, pos, STEPS) != 4)
			_exit(2);
		if (write(up[1], "r", 1) != 1)
			_exit(3);
		pause();
		_exit(0);
	}
	close(up[1]);
	ck_assert_int_eq(read(up[0], &b, 1), 1);
	close(up[0]);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	ck_assert(wait_log("cudaIpcCloseMemHandle", 1));
	ck_assert(daemon_alive(&Dm));
	{
		struct kvt_opts o = {.size = sizeof(o)};
		struct kvt_client *c;

		ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
		ck_assert_int_eq(kvt_nop(c), 0);
		kvt_disconnect(c);
	}
	stop();
	ck_assert_uint_eq(log_count("hazard"), 0);
	ck_assert_uint_eq(log_count("illegal address"), 0);
	ck_assert_uint_eq(log_count("cudaIpcCloseMemHandle"), 1);
	unlink(shim_log);
}
END_TEST

/* A host buffer on the CUDA backend fails alone, with a message that says what to do: the
 * session goes on and a CUDA buffer registers after it. */
START_TEST(cuda_daemon_host_buffer_refused)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_buf *hb = NULL, *db = NULL;
	struct kvt_client *c;
	void *p;

	start();
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_buf_alloc(c, 1 << 20, &hb), -EOPNOTSUPP);
	ck_assert_ptr_null(hb);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "CUDA backend"));
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "--backend host"));
	ck_assert_int_eq(cudaMalloc(&p, 1 << 20), cudaSuccess);
	ck_assert_int_eq(kvt_buf_register_cuda(c, p, 1 << 20, &db), 0);
	ck_assert_int_eq(kvt_buf_free(c, db), 0);
	ck_assert_int_eq(cudaFree(p), cudaSuccess);
	kvt_disconnect(c);
	ck_assert(daemon_alive(&Dm));
	stop();
	unlink(shim_log);
}
END_TEST

/* Restart in place is refused on the CUDA backend (its registrations and IPC mappings do not
 * cross an exec): RESTART is -EOPNOTSUPP with a reason, SIGUSR2 re-reads the configuration
 * instead, and the session and its rows go on in the same process. */
START_TEST(cuda_daemon_restart_refused)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_ctl_hdr h = {.type = KVT_CTL_RESTART, .len = sizeof(h), .id = 9};
	struct kvt_ctl_error e;
	struct json_object *st;
	struct kvt_client *c;
	int fd;

	start();
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	fd = ctl_raw_connect(Dm.sock);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(send(fd, &h, sizeof(h), 0), sizeof(h));
	ck_assert_int_ge(ctl_raw_recv(fd, &e, sizeof(e), 10000), (ssize_t)sizeof(e.hdr));
	ck_assert_uint_eq(e.hdr.type, KVT_CTL_ERROR);
	ck_assert_uint_eq(e.hdr.id, 9);
	ck_assert_int_eq(e.err, -EOPNOTSUPP);
	close(fd);
	ck_assert_int_eq(kill(Dm.pid, SIGUSR2), 0);
	{
		int seen = 0;

		for (int i = 0; i < 500 && !seen; i++) {
			char line[512];
			FILE *f = fopen(Dm.log, "r");

			while (f && !seen && fgets(line, sizeof(line), f))
				seen = strstr(line, "reloading the configuration instead") != NULL;
			if (f)
				fclose(f);
			if (!seen)
				usleep(10000);
		}
		ck_assert_msg(seen, "SIGUSR2 on the CUDA backend did not fall back to a reload");
	}
	ck_assert_int_eq(kvt_nop(c), 0); /* same session, same process */
	st = admin_request(Dm.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(st);
	ck_assert_int_eq(json_get_i64(st, "restarts"), 0);
	ck_assert_int_eq(json_get_i64(st, "sessions"), 1);
	json_object_put(st);
	kvt_disconnect(c);
	ck_assert(daemon_alive(&Dm));
	stop();
	unlink(shim_log);
}
END_TEST

KVT_CHECK_MAIN("cuda_daemon", 60, NULL, NULL, cuda_daemon_append_fetch_bit_exact,
	       cuda_daemon_t2_fetch_equals_host,
	       cuda_daemon_fetch_does_not_wait_and_slots_wait_for_it,
	       cuda_daemon_kill9_with_copies_queued, cuda_daemon_ipc_closed_once,
	       cuda_daemon_host_buffer_refused, cuda_daemon_restart_refused,
	       cuda_daemon_fetch_rows_into_layer_caches)
