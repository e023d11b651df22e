/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"

static const char *
kvtierd_path(void)
{
	static char buf[PATH_MAX];
	const char *env = getenv("KVTIERD");
	ssize_t n;

	if (env && *env)
		return env;
	n = readlink("/proc/self/exe", buf, sizeof(buf) - 16);
	if (n > 0) {
		buf[n] = '\0';
		strcpy(strrchr(buf, '/') + 1, "kvtierd");
		if (access(buf, X_OK) == 0)
			return buf;
	}
	return KVT_KVTIERD_BUILD_PATH;
}

int
bench_daemon_start(struct bench_daemon *d, const char *const *args)
{
	const char *argv[32];
	int n = 0;

	snprintf(d->dir, sizeof(d->dir), "/tmp/kvt-bench-XXXXXX");
	if (!mkdtemp(d->dir))
		return -errno;
	snprintf(d->sock, sizeof(d->sock), "%s/kvtierd.sock", d->dir);
	argv[n++] = kvtierd_path();
	argv[n++] = "--config";
	argv[n++] = "/dev/null";
	argv[n++] = "--socket";
	argv[n++] = d->sock;
	argv[n++] = "--lock";
	argv[n++] = "no";
	argv[n++] = "--log-level";
	argv[n++] = "warning";
	argv[n++] = "--backend"; /* the benchmarks' buffers are host memfds, GPU or not */
	argv[n++] = "host";
	for (int i = 0; args && args[i] && n < 31; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0) {
		execv(argv[0], (char *const *)argv);
		fprintf(stderr, "kvtier-bench: cannot run %s: %s (set KVTIERD)\n", argv[0],
			strerror(errno));
		_exit(127);
	}
	for (int i = 0; i < 6000; i++) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), ok;

		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->sock);
		ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		close(fd);
		if (ok)
			return 0;
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid)
			return -ECHILD;
		usleep(10000);
	}
	return -ETIMEDOUT;
}

void
bench_daemon_stop(struct bench_daemon *d)
{
	kill(d->pid, SIGTERM);
	waitpid(d->pid, NULL, 0);
	rmdir(d->dir);
}

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
