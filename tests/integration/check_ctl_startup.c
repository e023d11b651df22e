/* SPDX-License-Identifier: MIT */
/*
 * kvtierd's start and exit against an operator's mistakes: whatever sits at --socket that is
 * not a stale socket is refused and left alone, exit removes only the socket the daemon made,
 * --config naming a directory is refused, and a second daemon on a socket a live one holds
 * refuses before it allocates and pins its pool.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_test.h"

/* The whole log of a daemon, NUL-terminated (static). */
static const char *
read_log(const char *path)
{
	static char buf[65536];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;

	if (fd >= 0)
		close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

static void
write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static void
assert_file_holds(const char *path, const char *text)
{
	char buf[256];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	ck_assert_msg(fd >= 0, "%s is gone", path);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	ck_assert_int_ge(n, 0);
	buf[n] = '\0';
	ck_assert_str_eq(buf, text);
}

static void
cleanup(struct kvtd_proc *p)
{
	unlink(p->sock);
	unlink(p->log);
	ck_assert_int_eq(rmdir(p->dir), 0); /* nothing else left behind (a lock file, say) */
}

START_TEST(t_socket_path_regular_file)
{
	struct kvtd_proc p;
	const char *log;
	int st;

	daemon_prepare(&p);
	write_file(p.sock, "precious\n");
	daemon_spawn(&p, NULL);
	st = daemon_wait(&p, 20000);
	ck_assert_msg(st > 0, "kvtierd exit status %d with a regular file at --socket", st);
	assert_file_holds(p.sock, "precious\n");
	log = read_log(p.log);
	ck_assert_msg(strstr(log, p.sock) && strstr(log, "not a socket"),
		      "the refusal does not name %s: %s", p.sock, log);
	cleanup(&p);
}
END_TEST

START_TEST(t_socket_path_stale_socket)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvtd_proc p;
	struct stat st;
	int fd;

	/* What a crashed daemon leaves: a socket file nobody listens on. */
	daemon_prepare(&p);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", p.sock);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(fd);
	ck_assert_int_eq(lstat(p.sock, &st), 0);
	ck_assert(S_ISSOCK(st.st_mode));

	/* daemon_start() without its mkdtemp: wait for the daemon to answer */
	daemon_spawn(&p, NULL);
	for (int i = 0; i < 500; i++) {
		struct json_object *o = admin_request(p.sock, KVT_CTL_STATUS);

		if (o) {
			json_object_put(o);
			break;
		}
		ck_assert_msg(daemon_alive(&p), "kvtierd refused a stale socket: %s",
			      read_log(p.log));
		usleep(10000);
	}
	setenv("KVT_TEST_KEEP_LOG", "1", 1);
	ck_assert_int_eq(daemon_stop(&p), 0);
	unsetenv("KVT_TEST_KEEP_LOG");
	ck_assert_msg(access(p.sock, F_OK) < 0, "kvtierd left its socket behind");
	cleanup(&p);
}
END_TEST

START_TEST(t_exit_unlinks_only_own_socket)
{
	struct kvtd_proc p;

	daemon_start(&p, NULL);
	/* The path now names something else: the daemon's exit must leave it. */
	ck_assert_int_eq(unlink(p.sock), 0);
	write_file(p.sock, "someone else's\n");
	setenv("KVT_TEST_KEEP_LOG", "1", 1);
	ck_assert_int_eq(daemon_stop(&p), 0);
	unsetenv("KVT_TEST_KEEP_LOG");
	assert_file_holds(p.sock, "someone else's\n");
	cleanup(&p);
}
END_TEST

START_TEST(t_config_directory)
{
	struct kvtd_proc p;
	const char *extra[] = {"--config", NULL, NULL};
	const char *log;

	daemon_prepare(&p);
	extra[1] = p.dir;
	daemon_spawn(&p, extra);
	ck_assert_int_eq(daemon_wait(&p, 20000), 2);
	log = read_log(p.log);
	ck_assert_msg(strstr(log, p.dir) && strstr(log, "directory"),
		      "the refusal does not say %s is a directory: %s", p.dir, log);
	ck_assert_int_ne(access(p.sock, F_OK), 0);
	cleanup(&p);
}
END_TEST

START_TEST(t_second_daemon_refuses_before_pool)
{
	struct kvtd_proc a, b;
	struct json_object *o;
	const char *log;

	daemon_start(&a, NULL);
	b = a;
	snprintf(b.log, sizeof(b.log), "%s/second.log", a.dir);
	daemon_spawn(&b, NULL);
	ck_assert_int_eq(daemon_wait(&b, 20000), 1);
	log = read_log(b.log);
	ck_assert_msg(strstr(log, "another kvtierd") && strstr(log, a.sock),
		      "second daemon's log does not name the live one on %s: %s", a.sock, log);
	ck_assert_msg(!strstr(log, "pool:"), "second daemon set up its pool first: %s", log);
	unlink(b.log);
	/* the first one kept its socket and serves */
	o = admin_request(a.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(o);
	json_object_put(o);
	ck_assert_int_eq(daemon_stop(&a), 0);
}
END_TEST

KVT_CHECK_MAIN("ctl_startup", 60, NULL, NULL, t_socket_path_regular_file,
	       t_socket_path_stale_socket, t_exit_unlinks_only_own_socket, t_config_directory,
	       t_second_daemon_refuses_before_pool)
