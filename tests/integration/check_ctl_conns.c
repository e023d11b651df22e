/* SPDX-License-Identifier: MIT */
/*
 * Control connections are a bounded resource: idle admin connections time out, at most
 * max_connections are served at once (the rest wait in the listen backlog), and a daemon out of
 * file descriptors neither spins on its readable listener nor stops serving once descriptors
 * free up. CPU use is read from the main thread's ticks in /proc (bounded generously), never
 * from the wall clock.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvt_test.h"

/* A spinning main thread takes up to 100 ticks a second (less on a loaded machine: 27 a second
 * was seen); an idle one a few in all, sanitizers included. */
#define SPIN_TICKS 20

static struct kvtd_proc D;
static uint8_t buf[KVT_CTL_MAX_MSG];

/* Starts kvtierd with @conf as its config file (written into its runtime directory). */
static void
start_with_config(const char *conf)
{
	daemon_start_conf(&D, conf, 0, NULL);
}

static void
stop(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

/* utime + stime of the daemon's main thread (the control loop), in clock ticks. */
static long
main_thread_ticks(void)
{
	char path[64], line[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)D.pid, (int)D.pid);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
	fclose(f);
	p = strrchr(line, ')'); /* the name may hold spaces */
	ck_assert_ptr_nonnull(p);
	/* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime */
	ck_assert_int_eq(
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
	return (long)(ut + st);
}

static int
open_fds(pid_t pid)
{
	char cmd[96];
	FILE *f;
	int n = -1;

	snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)pid);
	f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fscanf(f, "%d", &n), 1);
	pclose(f);
	return n;
}

static void
send_hdr(int fd, uint32_t type, uint64_t id)
{
	struct kvt_ctl_hdr h = {.type = type, .len = sizeof(h), .id = id};

	ck_assert_int_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
}

/* A raw HELLO with default sizes; returns the reply type (0 when none came in @timeout_ms). */
static uint32_t
raw_hello(int timeout_ms)
{
	struct kvt_ctl_hello h;
	int fd = ctl_raw_connect(D.sock);
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	memset(&h, 0, sizeof(h));
	h.hdr.type = KVT_CTL_HELLO;
	h.hdr.len = sizeof(h);
	h.hdr.id = 4242;
	h.abi_major = KVT_ABI_MAJOR;
	h.abi_minor = KVT_ABI_MINOR;
	snprintf(h.name, sizeof(h.name), "after-flood");
	ck_assert_int_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
	n = ctl_raw_recv(fd, buf, sizeof(buf), timeout_ms);
	close(fd);
	return n >= (ssize_t)sizeof(struct kvt_ctl_hdr) ? ((struct kvt_ctl_hdr *)buf)->type : 0;
}

/* Reads one reply to a STATUS sent with @id: 1 for the JSON answer, 0 for anything else. */
static int
status_answered(int fd, uint64_t id, int timeout_ms)
{
	ssize_t n = ctl_raw_recv(fd, buf, sizeof(buf), timeout_ms);
	const struct kvt_ctl_hdr *h = (const void *)buf;

	return n >= (ssize_t)sizeof(*h) && h->type == KVT_CTL_JSON && h->id == id;
}

START_TEST(t_admin_idle_timeout)
{
	struct kvt_ctl_error *e = (void *)buf;
	ssize_t n;
	int fd;

	start_with_config("[daemon]\nadmin_idle_timeout_ms = 300\n");
	fd = ctl_raw_connect(D.sock);
	ck_assert_int_ge(fd, 0);
	send_hdr(fd, KVT_CTL_STATUS, 1);
	ck_assert(status_answered(fd, 1, 5000));
	/* then silence: the daemon says why and closes */
	n = ctl_raw_recv(fd, buf, sizeof(buf), 10000);
	ck_assert_int_eq(n, (ssize_t)sizeof(*e));
	ck_assert_uint_eq(e->hdr.type, KVT_CTL_ERROR);
	ck_assert_int_eq(e->err, -ETIMEDOUT);
	ck_assert_ptr_nonnull(strstr(e->msg, "idle"));
	ck_assert_int_eq(ctl_raw_recv(fd, buf, sizeof(buf), 10000), 0);
	close(fd);
	stop();
}
END_TEST

/* Runs "kvtierctl --timeout 1 status"; returns its exit status, output in @out. */
static int
ctl_status(char *out, size_t len)
{
	char cmd[512];
	size_t n = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "timeout 30 %s --socket %s --timeout 1 status 2>&1",
		 getenv("KVTIERCTL"), D.sock);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	while (n + 1 < len && fgets(out + n, (int)(len - n), p))
		n += strlen(out + n);
	out[n] = '\0';
	return WEXITSTATUS(pclose(p));
}

START_TEST(t_max_connections)
{
	enum { MAX = 4 };
	int fds[MAX], extra;
	char out[4096];
	long t0;

	start_with_config("[daemon]\nadmin_idle_timeout_ms = 600000\n"
			  "[limits]\nmax_connections = 4\n");
	for (int i = 0; i < MAX; i++) {
		fds[i] = ctl_raw_connect(D.sock);
		ck_assert_int_ge(fds[i], 0);
		send_hdr(fds[i], KVT_CTL_STATUS, 10 + i);
		ck_assert(status_answered(fds[i], 10 + i, 5000));
	}
	/* One more waits in the backlog, unserved, and the loop does not spin over it. */
	t0 = main_thread_ticks();
	extra = ctl_raw_connect(D.sock);
	ck_assert_int_ge(extra, 0);
	send_hdr(extra, KVT_CTL_STATUS, 99);
	ck_assert_msg(!status_answered(extra, 99, 1500), "a 5th connection served at max 4");
	/* kvtierctl meanwhile gives up after its --timeout, with a message */
	ck_assert_int_ne(ctl_status(out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "timed out"), "kvtierctl said: %s", out);
	ck_assert_int_lt(main_thread_ticks() - t0, SPIN_TICKS);
	/* a slot frees: the waiting one is served */
	close(fds[0]);
	ck_assert(status_answered(extra, 99, 10000));
	close(extra);
	for (int i = 1; i < MAX; i++)
		close(fds[i]);
	ck_assert_uint_eq(raw_hello(10000), KVT_CTL_WELCOME);
	ck_assert_int_eq(ctl_status(out, sizeof(out)), 0);
	stop();
}
END_TEST

START_TEST(t_emfile)
{
	enum { N = 40 };
	struct rlimit rl;
	int fds[N], base, answered = 0;
	long t0, ticks;

	start_with_config("[daemon]\nadmin_idle_timeout_ms = 1000\nhello_timeout_ms = 1000\n");
	/* Room for a dozen connections: the rest meet EMFILE at accept. */
	base = open_fds(D.pid);
	ck_assert_int_gt(base, 0);
	ck_assert_int_eq(prlimit(D.pid, RLIMIT_NOFILE, NULL, &rl), 0);
	rl.rlim_cur = (rlim_t)base + 12;
	ck_assert_int_eq(prlimit(D.pid, RLIMIT_NOFILE, &rl, NULL), 0);

	t0 = main_thread_ticks();
	for (int i = 0; i < N; i++) {
		fds[i] = ctl_raw_connect(D.sock);
		ck_assert_int_ge(fds[i], 0);
		send_hdr(fds[i], KVT_CTL_STATUS, 100 + i);
	}
	usleep(3000 * 1000); /* time for a spinning loop to show in its ticks */
	ticks = main_thread_ticks() - t0;
	ck_assert_msg(ticks < SPIN_TICKS, "main loop used %ld ticks out of descriptors", ticks);
	/* As idle ones time out, every waiting request is answered, in a bounded time, while
	 * this side keeps every connection open. */
	for (int i = 0; i < N; i++)
		answered += status_answered(fds[i], 100 + i, 30000);
	for (int i = 0; i < N; i++)
		close(fds[i]);
	ck_assert_int_eq(answered, N);
	ck_assert_uint_eq(raw_hello(30000), KVT_CTL_WELCOME);
	printf("check_ctl_conns: %d fds at start, %d connections at limit %d: main loop %ld "
	       "ticks\n",
	       base, N, base + 12, ticks);
	stop();
}
END_TEST

KVT_CHECK_MAIN("ctl_conns", 120, NULL, NULL, t_admin_idle_timeout, t_max_connections, t_emfile)
