/* SPDX-License-Identifier: MIT */
/*
 * step.c - daemon CPU per decode step, end to end through a kvtierd this benchmark starts.
 *
 * A 32-layer, 8-kv-head, D = 128, f16 sequence is filled to 32K tokens (APPEND from the arena,
 * then one RETIER that fills T0 to hbm_frac), then decoded for one or more epochs the way a
 * client does: each step writes the token into a free T0 slot and APPENDs it, SCORE_ADDs a
 * dense weight vector over every position, and every delta steps RETIERs; FETCH of the T1 rows
 * of every layer (one op per layer) is timed in a loop of its own and added. The daemon's own
 * CPU time (utime + stime from /proc) divided by the steps is step_us.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_tier.h"
#include "daemon.h"
#include "kvtier.h"

enum { SL = 32, SH = 8, SD = 128, SDELTA = 64 };
#define SROW ((uint64_t)SH * SD * 2) /* f16 bytes of one (token, layer, K|V) */
#define STOK (SL * 2 * SROW)

struct stepper {
	struct bench_daemon d;
	struct kvt_client *c;
	struct kvt_buf *t0, *stage;
	uint32_t seq, t0_slots, n;
	uint32_t *free_slots, n_free, next_free;
	uint8_t *rbuf;
	size_t rbuf_len;
	uint32_t *pos;
	float *w;
};

static double
cpu_us(pid_t pid)
{
	uint64_t t;

	if (bench_proc_cpu_ticks(pid, &t) < 0)
		return NAN;
	return (double)t * 1e6 / (double)sysconf(_SC_CLK_TCK);
}

static int
retier(struct stepper *S)
{
	const struct kvt_retier_result *res = (const void *)S->rbuf;
	int r = kvt_retier(S->c, S->seq, S->rbuf, S->rbuf_len);

	if (r < 0)
		return r;
	memcpy(S->free_slots,
	       S->rbuf + sizeof(*res) + res->n_changes * sizeof(struct kvt_slot_change),
	       res->n_free * sizeof(uint32_t));
	S->n_free = res->n_free;
	S->next_free = 0;
	return 0;
}

static int
decode_step(struct stepper *S)
{
	uint32_t slot;
	int r;

	if (S->next_free == S->n_free && (r = retier(S)) < 0)
		return r;
	slot = S->free_slots[S->next_free++];
	r = (int)kvt_append_t0(S->c, S->seq, &slot, 1);
	if (r < 0)
		return r;
	S->n++;
	for (uint32_t i = 0; i < S->n; i++)
		S->w[i] = 1.0f / (float)S->n;
	r = kvt_score_add(S->c, S->seq, 0, S->w, S->n);
	return r < 0 ? r : 0;
}

int
bench_step(uint32_t n0, uint32_t steps, struct step_result *ret)
{
	struct kvt_opts o = {.size = sizeof(o), .name = "bench-step", .arena_size = 64 << 20};
	struct kvt_seq_params p = {.size = sizeof(p)};
	char pool[32];
	struct stepper S = {0};
	uint8_t *rows = NULL;
	double c0, c1;
	int r;

	memset(ret, 0, sizeof(*ret));
	snprintf(pool, sizeof(pool), "%lluM",
		 (unsigned long long)(((uint64_t)(n0 + steps + 64) * STOK >> 20) + 64));
	r = bench_daemon_start(&S.d, (const char *const[]){"--pool-size", pool, NULL});
	if (r < 0)
		return r;
	r = kvt_connect(S.d.sock, &o, &S.c);
	if (r < 0)
		goto out_daemon;
	S.t0_slots = n0 / 2 + 4 * SDELTA;
	r = kvt_buf_alloc(S.c, (uint64_t)S.t0_slots * STOK, &S.t0);
	if (r == 0) /* one layer at a time: every layer stages into the same rows */
		r = kvt_buf_alloc(S.c, (uint64_t)(n0 + steps) * 2 * SROW, &S.stage);
	if (r < 0)
		goto out_client;
	p.layers = SL;
	p.kv_heads = SH;
	p.head_dim = SD;
	p.dtype = KVT_DTYPE_F16;
	p.policy = KVT_POLICY_TIERED;
	p.delta = SDELTA;
	p.sinks = 4;
	p.window = 128;
	p.hbm_frac = 0.5f;
	p.evict_frac = 0.03f;
	p.t0_buf_id = kvt_buf_id(S.t0);
	p.t0_slots = S.t0_slots;
	p.t0_slot_stride = SROW;
	p.t0_kv_stride = (uint64_t)S.t0_slots * SROW;
	p.t0_layer_stride = 2 * p.t0_kv_stride;
	p.stage_buf_id = kvt_buf_id(S.stage);
	p.stage_slots = n0 + steps;
	p.stage_slot_stride = SROW;
	p.stage_kv_stride = (uint64_t)(n0 + steps) * SROW;
	p.stage_layer_stride = 0;
	r = kvt_seq_open(S.c, &p, &S.seq);
	if (r < 0)
		goto out_client;
	S.rbuf_len = KVT_RETIER_OUT_SIZE(S.t0_slots);
	S.rbuf = malloc(S.rbuf_len);
	S.free_slots = malloc(sizeof(uint32_t) * S.t0_slots);
	S.pos = malloc(sizeof(uint32_t) * (n0 + steps));
	S.w = malloc(sizeof(float) * (n0 + steps));
	rows = malloc(64 * STOK);
	if (!S.rbuf || !S.free_slots || !S.pos || !S.w || !rows) {
		r = -ENOMEM;
		goto out_free;
	}
	for (uint64_t i = 0; i < 64 * STOK; i++)
		rows[i] = (uint8_t)(i * 7);
	/* Prefill: 32K tokens into the pool, then scores and the first re-tier. */
	for (uint32_t t = 0; t < n0 && r >= 0; t += 64)
		r = (int)kvt_append(S.c, S.seq, rows, 64 * STOK, 64, NULL);
	S.n = n0;
	for (uint32_t i = 0; i < S.n; i++)
		S.w[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
	if (r >= 0)
		r = kvt_score_add(S.c, S.seq, 0, S.w, S.n);
	if (r >= 0)
		r = retier(&S);
	if (r < 0)
		goto out_free;

	/* Decode without FETCH: APPEND, SCORE_ADD over every position, RETIER every delta. */
	c0 = cpu_us(S.d.pid);
	for (uint32_t t = 0; t < steps && r >= 0; t++)
		r = decode_step(&S);
	c1 = cpu_us(S.d.pid);
	if (r < 0)
		goto out_free;
	ret->step_nofetch_us = (c1 - c0) / steps;
	ret->n = S.n;
	ret->steps = steps;
	/* FETCH of every T1 row, one op per layer, as a step does before each layer's attention.
	 * On the host backend this is memcpy of ~2 GB per step at 32K tokens, so a few steps. */
	c0 = cpu_us(S.d.pid);
	for (int i = 0; i < 4 && r >= 0; i++)
		for (uint32_t l = 0; l < SL && r >= 0; l++)
			r = kvt_fetch(S.c, S.seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, l, 1, 0, S.pos,
				      S.n);
	c1 = cpu_us(S.d.pid);
	ret->fetch_us = (c1 - c0) / 4;
	ret->step_us = ret->step_nofetch_us + ret->fetch_us;
	/* RETIER alone, on the full sequence (256 of them: /proc counts 10 ms ticks). */
	c0 = cpu_us(S.d.pid);
	for (int i = 0; i < 256 && r >= 0; i++)
		r = retier(&S);
	c1 = cpu_us(S.d.pid);
	ret->retier_us = (c1 - c0) / 256;
	{
		struct kvt_seq_stat st;

		if (r >= 0)
			r = kvt_seq_stat(S.c, S.seq, &st);
		if (r >= 0) {
			ret->t1 = st.tier_count[1];
			ret->t0 = st.tier_count[0];
		}
	}
out_free:
	free(rows);
	free(S.rbuf);
	free(S.free_slots);
	free(S.pos);
	free(S.w);
out_client:
	kvt_disconnect(S.c);
out_daemon:
	bench_daemon_stop(&S.d);
	return r < 0 ? r : 0;
}
