/* SPDX-License-Identifier: MIT */
/*
 * bench.h - kvtier-bench ring: a table of named measurements, each reporting some of
 * p50/p99 latency (ns), throughput (ops/s) and CPU use (% of one CPU).
 *
 * A measurement is one function filling struct bench_result; main.c lists them in a table
 * (struct bench_row) that drives the run, the text table and the --json object, whose keys are
 * "<row key>_p50_ns", "_p99_ns", "_ops_per_s", "_cpu_pct". The harnesses below do the timing:
 * CLOCK_MONOTONIC only (no rdtsc: the VMs we run on do not promise an invariant TSC), untimed
 * warm-up, many timed iterations per repetition, and every reported number is the median over
 * repetitions of that repetition's statistic. Nothing is pinned to a CPU.
 *
 * Everything returns 0 or -errno. Single-threaded; the round-trip harness forks one child.
 */
#ifndef KVT_BENCH_H
#define KVT_BENCH_H

#include <stdint.h>
#include <sys/types.h>

struct bench_opts {
	unsigned int iters;    /* timed operations (or batches) per repetition */
	unsigned int reps;     /* repetitions; reported values are medians over them */
	unsigned int warmup;   /* untimed operations before the first repetition */
	pid_t cpu_pid;	       /* idle row: process to watch, 0 = a kvtierd of its own */
	double cpu_interval_s; /* idle row: seconds to watch it */
};

/* Fields a row reports; the others stay NAN. */
#define BENCH_F_P50 (1u << 0)
#define BENCH_F_P99 (1u << 1)
#define BENCH_F_OPS (1u << 2)
#define BENCH_F_CPU (1u << 3)

struct bench_result {
	double p50_ns;	  /* median over reps of each rep's 50th percentile */
	double p99_ns;	  /* median over reps of each rep's 99th percentile */
	double ops_per_s; /* median over reps */
	double cpu_pct;	  /* percent of one CPU */
};

/* One timed operation (or batch) on @ctx: 0 or -errno. */
typedef int (*bench_op_fn)(void *ctx);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t bench_now_ns(void);

/*
 * bench_latency() - call @op o->warmup times untimed, then o->reps x o->iters times, timing each
 * call alone; store the medians over reps of the per-rep p50 and p99 in @ret. Exactly
 * warmup + reps * iters calls are made unless one fails. Each sample includes one
 * clock_gettime() (the "clock" row measures that floor).
 * Returns 0, the first error of @op, or -ENOMEM.
 */
int bench_latency(const struct bench_opts *o, bench_op_fn op, void *ctx, struct bench_result *ret);

/* One sample that times itself: 0 or -errno, and the nanoseconds that count in @ret_ns. */
typedef int (*bench_sample_fn)(void *ctx, uint64_t *ret_ns);

/* bench_latency() for operations that time only part of themselves (set-up excluded). */
int bench_latency_sampled(const struct bench_opts *o, bench_sample_fn op, void *ctx,
			  struct bench_result *ret);

/*
 * bench_throughput() - call @batch o->warmup / @ops_per_call times untimed, then per rep time
 * o->iters calls together; each call does @ops_per_call operations. Stores the median over reps
 * of ops/s in @ret->ops_per_s.
 * Returns 0, the first error of @batch, or -ENOMEM.
 */
int bench_throughput(const struct bench_opts *o, bench_op_fn batch, unsigned int ops_per_call,
		     void *ctx, struct bench_result *ret);

/*
 * A round trip between this process and a forked peer. @after_fork runs once in each process
 * right after fork (drop the other side's descriptors so a dead peer gives EOF); @ping makes one
 * round trip from the parent; @pong answers one in the child. Ping and pong each see their own
 * copy of the context, as fork left it.
 */
struct bench_peer {
	void (*after_fork)(void *ctx, int is_child); /* may be NULL */
	bench_op_fn ping;
	bench_op_fn pong;
};

/*
 * bench_roundtrip() - fork a child that answers exactly warmup + reps * iters pongs (it dies with
 * the parent: PR_SET_PDEATHSIG), time the parent's pings with bench_latency(), reap the child.
 * Returns 0, the first ping error, -ECHILD when the child failed, or -errno from fork().
 */
int bench_roundtrip(const struct bench_opts *o, const struct bench_peer *peer, void *ctx,
		    struct bench_result *ret);

/* Peer-to-peer baselines (peers.c), each one row. */
int bench_clock(const struct bench_opts *o, struct bench_result *ret);
int bench_pingpong(const struct bench_opts *o, struct bench_result *ret);
int bench_socket(const struct bench_opts *o, struct bench_result *ret);
int bench_eventfd(const struct bench_opts *o, struct bench_result *ret);
int bench_uring_batch32(const struct bench_opts *o, struct bench_result *ret);

/* bench_proc_cpu_ticks() is in tools/bench/daemon.h. */

/*
 * bench_proc_cpu() - CPU use of @pid over the next @interval_s seconds (this call sleeps), as
 * percent of one CPU: 100 = one core busy all the time. Resolution is one clock tick (usually
 * 10 ms) over the interval, so watch for several seconds to see a mostly idle process.
 * Returns 0 or the errors of bench_proc_cpu_ticks().
 */
int bench_proc_cpu(pid_t pid, double interval_s, double *ret_pct);

/* kvtier rows (kvtier.c): each starts its own kvtierd ($KVTIERD, or the one beside this
 * program, or the build tree's) on a private socket. */
int bench_kvtier_spin(const struct bench_opts *o, struct bench_result *ret);
int bench_kvtier_sleep(const struct bench_opts *o, struct bench_result *ret);
int bench_kvtier_batch32(const struct bench_opts *o, struct bench_result *ret);
/* CPU of an idle kvtierd with one connected client (or of --cpu-pid when given). */
int bench_kvtier_idle(const struct bench_opts *o, struct bench_result *ret);
/* NOP round trip while another client keeps FETCHes queued on the same poller (neighbor.c):
 * with the daemon's default poller_slice_us, and with turns off (--poller-slice-us 0). */
int bench_kvtier_neighbor(const struct bench_opts *o, struct bench_result *ret);
int bench_kvtier_neighbor_noslice(const struct bench_opts *o, struct bench_result *ret);

#endif /* KVT_BENCH_H */
