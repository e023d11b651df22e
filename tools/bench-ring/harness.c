/* SPDX-License-Identifier: MIT */
/*
 * harness.c - timing loops and statistics shared by every row (see bench.h).
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

uint64_t
bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile @p (0..1] of @n sorted samples. */
static uint64_t
percentile(const uint64_t *sorted, size_t n, double p)
{
	size_t rank = (size_t)ceil(p * (double)n);

	return sorted[rank ? rank - 1 : 0];
}

/* Median of @n values (sorts them): the middle one, or the mean of the two middle ones. */
static double
median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int
bench_latency_sampled(const struct bench_opts *o, bench_sample_fn op, void *ctx,
		      struct bench_result *ret)
{
	uint64_t *s, ns;
	double *p50, *p99;
	unsigned int i, r;
	int err = -ENOMEM;

	s = calloc(o->iters, sizeof(*s));
	p50 = calloc(o->reps, sizeof(*p50));
	p99 = calloc(o->reps, sizeof(*p99));
	if (!s || !p50 || !p99)
		goto out;
	for (i = 0; i < o->warmup; i++) {
		err = op(ctx, &ns);
		if (err < 0)
			goto out;
	}
	for (r = 0; r < o->reps; r++) {
		for (i = 0; i < o->iters; i++) {
			err = op(ctx, &s[i]);
			if (err < 0)
				goto out;
		}
		qsort(s, o->iters, sizeof(*s), cmp_u64);
		p50[r] = (double)percentile(s, o->iters, 0.50);
		p99[r] = (double)percentile(s, o->iters, 0.99);
	}
	ret->p50_ns = median(p50, o->reps);
	ret->p99_ns = median(p99, o->reps);
	err = 0;
out:
	free(s);
	free(p50);
	free(p99);
	return err;
}

struct timed_call {
	bench_op_fn op;
	void *ctx;
};

static int
timed_call(void *arg, uint64_t *ret_ns)
{
	const struct timed_call *t = arg;
	uint64_t t0 = bench_now_ns();
	int err = t->op(t->ctx);

	*ret_ns = bench_now_ns() - t0;
	return err;
}

int
bench_latency(const struct bench_opts *o, bench_op_fn op, void *ctx, struct bench_result *ret)
{
	struct timed_call t = {op, ctx};

	return bench_latency_sampled(o, timed_call, &t, ret);
}

int
bench_throughput(const struct bench_opts *o, bench_op_fn batch, unsigned int ops_per_call,
		 void *ctx, struct bench_result *ret)
{
	double *rate;
	unsigned int i, r;
	int err;

	rate = calloc(o->reps, sizeof(*rate));
	if (!rate)
		return -ENOMEM;
	for (i = 0; i < o->warmup / ops_per_call; i++) {
		err = batch(ctx);
		if (err < 0)
			goto out;
	}
	for (r = 0; r < o->reps; r++) {
		uint64_t t0 = bench_now_ns(), dt;

		for (i = 0; i < o->iters; i++) {
			err = batch(ctx);
			if (err < 0)
				goto out;
		}
		dt = bench_now_ns() - t0;
		rate[r] = (double)o->iters * ops_per_call * 1e9 / (double)(dt ? dt : 1);
	}
	ret->ops_per_s = median(rate, o->reps);
	err = 0;
out:
	free(rate);
	return err;
}

int
bench_roundtrip(const struct bench_opts *o, const struct bench_peer *peer, void *ctx,
		struct bench_result *ret)
{
	uint64_t total = o->warmup + (uint64_t)o->reps * o->iters, i;
	pid_t parent = getpid(), pid;
	int err, st;

	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		/* Never outlive the parent: a spinning orphan would eat a core forever. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		if (peer->after_fork)
			peer->after_fork(ctx, 1);
		for (i = 0; i < total; i++)
			if (peer->pong(ctx) < 0)
				_exit(1);
		_exit(0);
	}
	if (peer->after_fork)
		peer->after_fork(ctx, 0);
	err = bench_latency(o, peer->ping, ctx, ret);
	if (err < 0)
		kill(pid, SIGKILL);
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR)
			return err < 0 ? err : -errno;
	}
	if (err == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
		err = -ECHILD;
	return err;
}
