/* SPDX-License-Identifier: MIT */
/*
 * daemon.h - benchmarks that measure kvtier end to end start their own kvtierd on a private
 * socket (kvt_bench_common, shared by the kvtier-bench-* programs).
 */
#ifndef KVT_BENCH_DAEMON_H
#define KVT_BENCH_DAEMON_H

#include <stdint.h>
#include <sys/types.h>

struct bench_daemon {
	pid_t pid;
	char dir[64];
	char sock[96];
};

/*
 * bench_daemon_start() - run kvtierd ($KVTIERD, else the one installed beside this program,
 * else the build tree's) with --config /dev/null, a private socket, --lock no and @args
 * (NULL-terminated extra flags), and wait until its socket answers (pool pinning can take
 * seconds). Returns 0, -ECHILD (it exited), -ETIMEDOUT, or -errno.
 */
int bench_daemon_start(struct bench_daemon *d, const char *const *args);
/* SIGTERM, wait, remove the private directory. */
void bench_daemon_stop(struct bench_daemon *d);

/* User + system CPU ticks (sysconf(_SC_CLK_TCK) per second) of @pid so far. Returns 0,
 * -ESRCH (no such process), -EPROTO (unreadable /proc/PID/stat). */
int bench_proc_cpu_ticks(pid_t pid, uint64_t *ret_ticks);

#endif
