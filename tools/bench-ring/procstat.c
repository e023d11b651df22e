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

int
bench_proc_cpu_ticks(pid_t pid, uint64_t *ret_ticks)
{
	char path[64], buf[1024], *p;
	unsigned long long utime, stime;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? -ESRCH : -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	/*
	 * Field 2, comm, is in parentheses and may itself hold spaces and ')': the fields after it
	 * start after the last ')'. From there: state ppid pgrp session tty_nr tpgid flags minflt
	 * cminflt majflt cmajflt utime stime (proc(5) fields 3..15).
	 */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
			 &stime) != 2)
		return -EPROTO;
	*ret_ticks = utime + stime;
	return 0;
}

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
