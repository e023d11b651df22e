/* SPDX-License-Identifier: MIT */
/*
 * check_ctl_cli.c - kvtierctl as a user meets it without a daemon: exit 1 with a message that
 * says kvtierd is not running (no socket file, or a stale socket nothing listens on), exit 2 on
 * bad usage, exit 0 for --help and --version. The binary runs as a real child process.
 */
#define _GNU_SOURCE /* pipe2 */
#include <check.h>
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
#include "kvt_test.h"
#include "kvt_version.h"

#ifndef KVTIERCTL_PATH
#error "KVTIERCTL_PATH must name the kvtierctl binary"
#endif

struct result {
	int status; /* exit code, or -1 when killed by a signal */
	char out[8192];
	char err[8192];
};

static void
slurp(int fd, char *buf, size_t len)
{
	size_t off = 0;
	ssize_t n;

	while (off + 1 < len && (n = read(fd, buf + off, len - 1 - off)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		ck_assert_int_ge(n, 0);
		off += n;
	}
	buf[off] = '\0';
}

/*
 * Run kvtierctl with @args (NULL-terminated, argv[0] excluded). @env_socket, when not NULL,
 * becomes KVTIER_SOCKET in the child; otherwise KVTIER_SOCKET is removed so the default path is
 * not taken from the test's environment. Both outputs are small, so reading stdout to EOF and
 * then stderr cannot block the child on a full pipe.
 */
static void
run(const char *const *args, const char *env_socket, struct result *res)
{
	const char *argv[16] = {"kvtierctl"};
	int out[2], err[2], st;
	unsigned int i;
	pid_t pid;

	for (i = 0; args[i]; i++) {
		ck_assert_uint_lt(i + 2, 16);
		argv[i + 1] = args[i];
	}
	ck_assert_int_eq(pipe2(out, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(err, O_CLOEXEC), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(out[1], STDOUT_FILENO);
		dup2(err[1], STDERR_FILENO);
		if (env_socket)
			setenv("KVTIER_SOCKET", env_socket, 1);
		else
			unsetenv("KVTIER_SOCKET");
		execv(KVTIERCTL_PATH, (char *const *)argv);
		_exit(127);
	}
	close(out[1]);
	close(err[1]);
	slurp(out[0], res->out, sizeof(res->out));
	slurp(err[0], res->err, sizeof(res->err));
	close(out[0]);
	close(err[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	res->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	ck_assert_int_ne(res->status, 127);
}

/* Short enough that tmpdir + "/kvtierd.sock" fits in sun_path (108 bytes). */
static char tmpdir[80];

static void
setup(void)
{
	const char *base = getenv("TMPDIR");
	int n;

	if (!base || strlen(base) > 40)
		base = "/tmp";
	n = snprintf(tmpdir, sizeof(tmpdir), "%s/kvtierctl-test-XXXXXX", base);
	ck_assert_int_lt(n, (int)sizeof(tmpdir));
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void
teardown(void)
{
	char path[PATH_MAX + 32];

	snprintf(path, sizeof(path), "%s/kvtierd.sock", tmpdir);
	unlink(path);
	rmdir(tmpdir);
}

START_TEST(test_no_socket_file)
{
	static const char *const cmds[] = {"status", "clients", "seqs", "metrics", "top", "blocks"};
	char path[PATH_MAX + 32], want[PATH_MAX + 64];
	struct result r;
	unsigned int i;

	snprintf(path, sizeof(path), "%s/kvtierd.sock", tmpdir);
	snprintf(want, sizeof(want), "(no socket at %s)", path);
	for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		const char *args[] = {"--socket", path, cmds[i], "--count", "1", NULL};

		run(i == 4 ? args : (const char *[]){"--socket", path, cmds[i], NULL}, NULL, &r);
		ck_assert_int_eq(r.status, 1);
		ck_assert_msg(strstr(r.err, "kvtierctl: kvtierd is not running"), "%s", r.err);
		ck_assert_msg(strstr(r.err, want), "%s", r.err);
		ck_assert_msg(strstr(r.err, "systemctl start kvtierd"), "%s", r.err);
		ck_assert_str_eq(r.out, "");
	}
}
END_TEST

/* A socket file left by a daemon that died: bound, never listening, so connect() is refused. */
START_TEST(test_stale_socket)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char want[PATH_MAX + 64];
	struct result r;
	int fd;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/kvtierd.sock", tmpdir);
	fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);

	run((const char *[]){"status", "--socket", sa.sun_path, NULL}, NULL, &r);
	ck_assert_int_eq(r.status, 1);
	snprintf(want, sizeof(want), "kvtierd is not running (nothing listens on %s)", sa.sun_path);
	ck_assert_msg(strstr(r.err, want), "%s", r.err);

	/* KVTIER_SOCKET is the default when --socket is not given... */
	run((const char *[]){"clients", NULL}, sa.sun_path, &r);
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, want), "%s", r.err);

	/* ...and --socket wins over it. */
	run((const char *[]){"-s", sa.sun_path, "seqs", NULL}, "/nonexistent/kvtierd.sock", &r);
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, want), "%s", r.err);
	close(fd);
}
END_TEST

START_TEST(test_default_path)
{
	struct result r;

	/* Without --socket and KVTIER_SOCKET the default is named in the message whatever it finds.
	 */
	run((const char *[]){"status", "--timeout", "1", NULL}, NULL, &r);
	ck_assert_msg(strstr(r.err, "/run/kvtier/kvtierd.sock") || r.status == 0, "%s", r.err);
}
END_TEST

START_TEST(test_bad_usage)
{
	const char *const *const cases[] = {
	    (const char *[]){"--bogus", "status", NULL},
	    (const char *[]){"-x", "status", NULL},
	    (const char *[]){"status", "--socket", NULL},
	    (const char *[]){NULL},
	    (const char *[]){"frobnicate", NULL},
	    (const char *[]){"status", "clients", NULL},
	    (const char *[]){"--timeout", "0", "status", NULL},
	    (const char *[]){"--timeout", "abc", "status", NULL},
	    (const char *[]){"--interval", "-1", "top", NULL},
	    (const char *[]){"--count", "1x", "top", NULL},
	    (const char *[]){"--socket", "", "status", NULL},
	};
	struct result r;
	unsigned int i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		run(cases[i], "/nonexistent/kvtierd.sock", &r);
		ck_assert_msg(r.status == 2, "case %u: exit %d, stderr %s", i, r.status, r.err);
		ck_assert_msg(!strncmp(r.err, "kvtierctl: ", 11), "case %u: %s", i, r.err);
	}
}
END_TEST

START_TEST(test_help_version)
{
	struct result r;

	run((const char *[]){"--help", NULL}, NULL, &r);
	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "usage: kvtierctl"));
	ck_assert_ptr_nonnull(strstr(r.out, "metrics"));
	ck_assert_str_eq(r.err, "");

	run((const char *[]){"-V", NULL}, NULL, &r);
	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "kvtierctl " KVT_VERSION " (ABI "));
}
END_TEST

static Suite *
ctl_cli_suite(void)
{
	Suite *s = suite_create("ctl_cli");
	TCase *tc = tcase_create("cli");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_no_socket_file);
	tcase_add_test(tc, test_stale_socket);
	tcase_add_test(tc, test_default_path);
	tcase_add_test(tc, test_bad_usage);
	tcase_add_test(tc, test_help_version);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	return kvt_check_run(ctl_cli_suite());
}
