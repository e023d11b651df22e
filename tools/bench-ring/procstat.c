/* SPDX-License-Identifier: MIT */
/*
 * procstat.c - CPU time of another process from /proc/PID/stat, for the daemon idle check.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "daemon.h"

int
bench_proc_cpu(pid_t pid, double interval_s, double *ret_pct)
{
	struct timespec ts = {.tv_sec = (time_t)interval_s,
			      .tv_nsec = (long)((interval_s - (time_t)interval_s) * 1e9)};
	uint64_t a, b, t0, t1;
	long hz = sysconf(_SC_CLK_TCK);
	int err;

	if (hz <= 0)
		return -EINVAL;
	err = bench_proc_cpu_ticks(pid, &a);
	if (err < 0)
		return err;
	t0 = bench_now_ns();
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	err = bench_proc_cpu_ticks(pid, &b);
	if (err < 0)
		return err;
	t1 = bench_now_ns();
	*ret_pct = (double)(b - a) / (double)hz * 100.0 / ((double)(t1 - t0) / 1e9);
	return 0;
}
