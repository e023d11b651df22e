/* SPDX-License-Identifier: MIT */
/*
 * kvtierd started by hand on a socket whose directory does not exist (the unit's
 * /run/kvtier, before systemd or tmpfiles made it) exits at once with a message that names
 * the directory and says what makes it, not a bare "No such file or directory".
 */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_test.h"

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

START_TEST(t_socket_dir_missing)
{
	char missing[sizeof(((struct kvtd_proc *)0)->dir) + 16];
	struct kvtd_proc p;
	const char *log;
	struct stat st;
	int status;

	daemon_prepare(&p);
	snprintf(missing, sizeof(missing), "%s/kvtier", p.dir);
	snprintf(p.sock, sizeof(p.sock), "%s/kvtierd.sock", missing);
	daemon_spawn(&p, NULL);
	status = daemon_wait(&p, 20000);
	ck_assert_msg(status > 0 && status < 128, "kvtierd exit status %d without %s", status,
		      missing);
	log = read_log(p.log);
	ck_assert_msg(strstr(log, missing) && strstr(log, "does not exist"),
		      "the error does not say that %s is missing: %s", missing, log);
	/* what to do: the unit (RuntimeDirectory=), tmpfiles, or another --socket */
	ck_assert_msg(strstr(log, "systemctl start kvtierd") && strstr(log, "systemd-tmpfiles") &&
			  strstr(log, "--socket"),
		      "the error does not say what creates %s: %s", missing, log);
	/* the daemon must not create the directory itself (its owner and mode are the unit's) */
	ck_assert_int_lt(stat(missing, &st), 0);
	unlink(p.log);
	ck_assert_int_eq(rmdir(p.dir), 0);
}
END_TEST

KVT_CHECK_MAIN("socket_dir", 0, NULL, NULL, t_socket_dir_missing)
