/* SPDX-License-Identifier: MIT */
/*
 * The main loop's start-up undoes itself: kvtd_loop_init() that fails part way (its /metrics
 * port taken) closes what it had opened (signalfd, timerfd, ring) and leaves the bound control
 * socket to kvtd_loop_fini(), which removes it and its lock file; fini twice is harmless.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvt_test.h"
#include "kvtd.h"
#include "loop.h"

/* Descriptors open in this process. */
static int
open_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(dir);
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n - 1; /* the directory's own */
}

START_TEST(t_init_failure_undoes_itself)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	char dir[64], lock[128];
	struct kvtd d;
	int taken, before, listening;

	/* a port someone else listens on */
	taken = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(taken, 0);
	ck_assert_int_eq(bind(taken, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(taken, 1), 0);
	ck_assert_int_eq(getsockname(taken, (struct sockaddr *)&sa, &len), 0);

	memset(&d, 0, sizeof(d));
	kvtd_config_defaults(&d.cfg);
	kvt_test_tmpdir(dir, sizeof(dir), "loop");
	snprintf(d.cfg.socket_path, sizeof(d.cfg.socket_path), "%s/kvtierd.sock", dir);
	snprintf(lock, sizeof(lock), "%s.lock", d.cfg.socket_path);
	snprintf(d.cfg.metrics_listen, sizeof(d.cfg.metrics_listen), "127.0.0.1:%u",
		 (unsigned)ntohs(sa.sin_port));
	before = open_fds();
	ck_assert_int_eq(kvtd_loop_listen(&d), 0);
	listening = open_fds();
	ck_assert_int_eq(access(d.cfg.socket_path, F_OK), 0);

	ck_assert_int_eq(kvtd_loop_init(&d), -EADDRINUSE);
	ck_assert_int_eq(open_fds(), listening); /* signalfd, timerfd, ring: closed */
	ck_assert_ptr_null(d.ring);
	ck_assert_int_eq(d.signal_fd, -1);
	ck_assert_int_eq(d.timer_fd, -1);
	ck_assert_int_eq(d.metrics_fd, -1);
	ck_assert_int_eq(access(d.cfg.socket_path, F_OK), 0); /* still the caller's */

	kvtd_loop_fini(&d);
	ck_assert_int_eq(open_fds(), before);
	ck_assert_int_ne(access(d.cfg.socket_path, F_OK), 0);
	ck_assert_int_ne(access(lock, F_OK), 0);
	kvtd_loop_fini(&d); /* twice: nothing left to close, nothing closed twice */
	ck_assert_int_eq(open_fds(), before);
	ck_assert_int_eq(fcntl(taken, F_GETFD), FD_CLOEXEC); /* not closed by mistake */
	close(taken);
	ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* The whole start-up and a clean undo, metrics on: nothing is left open or on disk. */
START_TEST(t_init_fini)
{
	struct kvtd d;
	char dir[64];
	int before;

	memset(&d, 0, sizeof(d));
	kvtd_config_defaults(&d.cfg);
	kvt_test_tmpdir(dir, sizeof(dir), "loop");
	snprintf(d.cfg.socket_path, sizeof(d.cfg.socket_path), "%s/kvtierd.sock", dir);
	snprintf(d.cfg.metrics_listen, sizeof(d.cfg.metrics_listen), "127.0.0.1:0");
	before = open_fds();
	ck_assert_int_eq(kvtd_loop_listen(&d), 0);
	ck_assert_int_eq(kvtd_loop_init(&d), 0);
	ck_assert_int_ge(d.signal_fd, 0);
	ck_assert_int_ge(d.metrics_fd, 0);
	kvtd_loop_fini(&d);
	kvtd_loop_fini(&d);
	ck_assert_int_eq(open_fds(), before);
	ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

KVT_CHECK_MAIN("loop", 30, NULL, NULL, t_init_failure_undoes_itself, t_init_fini)
