/* SPDX-License-Identifier: MIT */
/*
 * The kvtier rows: NOP round trips and batches through libkvtier against a real kvtierd that
 * this benchmark starts (private socket, small pool), and that daemon's CPU while idle.
 *
 * spin:  the poller spins (spin_us = 1 s, longer than any gap here) and the client spins on the
 *        CQ: the no-syscall data path, compared with the raw shared-memory ping-pong.
 * sleep: spin_us = 0 on both sides: every NOP rings the SQ doorbell and the daemon rings the CQ
 *        doorbell; compared with a Unix socket echo.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "daemon.h"
#include "kvtier.h"

static int
nop_op(void *ctx)
{
	return kvt_nop(ctx);
}

static int
batch32_op(void *ctx)
{
	struct kvt_client *c = ctx;
	struct kvt_cqe cqe;
	int r;

	for (int i = 0; i < 32; i++) {
		struct kvt_sqe *e = kvt_get_sqe(c);

		if (!e)
			return -EBUSY;
		e->opcode = KVT_OP_NOP;
		e->user_data = (uint64_t)i;
	}
	r = kvt_submit(c);
	if (r < 0)
		return r;
	for (int i = 0; i < 32; i++) {
		r = kvt_wait_cqe(c, &cqe);
		if (r < 0)
			return r;
		if (cqe.res < 0)
			return cqe.res;
	}
	return 0;
}

enum mode { MODE_SPIN, MODE_SLEEP, MODE_BATCH };

static int
run_mode(const struct bench_opts *o, enum mode m, struct bench_result *ret)
{
	struct kvt_opts opts = {.size = sizeof(opts),
				.name = "kvtier-bench",
				.spin_us = m == MODE_SLEEP ? 0 : 1000000,
				.sq_entries = 64};
	struct bench_daemon d;
	struct kvt_client *c;
	int r;

	r = bench_daemon_start(&d, (const char *const[]){"--pool-size", "16M", "--spin-us",
							 m == MODE_SLEEP ? "0" : "1000000", NULL});
	if (r < 0)
		return r;
	r = kvt_connect(d.sock, &opts, &c);
	if (r == 0) {
		if (m == MODE_BATCH) {
			struct bench_opts bo = *o;

			bo.iters = o->iters / 32 ? o->iters / 32 : 1;
			bo.warmup = o->warmup / 32;
			r = bench_throughput(&bo, batch32_op, 32, c, ret);
		} else {
			r = bench_latency(o, nop_op, c, ret);
		}
		kvt_disconnect(c);
	}
	bench_daemon_stop(&d);
	return r;
}

int
bench_kvtier_spin(const struct bench_opts *o, struct bench_result *ret)
{
	return run_mode(o, MODE_SPIN, ret);
}

int
bench_kvtier_sleep(const struct bench_opts *o, struct bench_result *ret)
{
	return run_mode(o, MODE_SLEEP, ret);
}

int
bench_kvtier_batch32(const struct bench_opts *o, struct bench_result *ret)
{
	return run_mode(o, MODE_BATCH, ret);
}

/* A daemon with default settings and one connected, idle client: what does it cost? */
int
bench_kvtier_idle(const struct bench_opts *o, struct bench_result *ret)
{
	struct kvt_opts opts = {.size = sizeof(opts), .name = "idle"};
	struct bench_daemon d;
	struct kvt_client *c;
	int r;

	if (o->cpu_pid > 0)
		return bench_proc_cpu(o->cpu_pid, o->cpu_interval_s, &ret->cpu_pct);
	r = bench_daemon_start(&d, (const char *const[]){"--pool-size", "16M", NULL});
	if (r < 0)
		return r;
	r = kvt_connect(d.sock, &opts, &c);
	if (r == 0) {
		r = kvt_nop(c); /* wake it once, then leave it alone */
		usleep(100000);
		if (r >= 0)
			r = bench_proc_cpu(d.pid, o->cpu_interval_s, &ret->cpu_pct);
		kvt_disconnect(c);
	}
	bench_daemon_stop(&d);
	return r;
}
