/* SPDX-License-Identifier: MIT */
/*
 * check_log.c - daemon logging (daemon/log.c): the journal entry a message becomes (priority,
 * identifier, the structured SESSION/PID/SEQ/OP fields a call site sets, the message), when
 * stderr counts as the journal's stream ($JOURNAL_STREAM naming fd 2), and the stderr line
 * format used everywhere else. Sending to journald itself is libsystemd's sd_journal_sendv(),
 * not exercised here: this machine runs no journald to receive it.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "kvt_test.h"

/* The iovecs as "A|B|C". */
static void
join(const struct iovec *iov, int n, char *out, size_t len)
{
	size_t off = 0;

	out[0] = '\0';
	for (int i = 0; i < n; i++)
		off += (size_t)snprintf(out + off, len - off, "%s%.*s", i ? "|" : "",
					(int)iov[i].iov_len, (const char *)iov[i].iov_base);
}

START_TEST(test_journal_fields)
{
	struct kvtd_log_fields f = {.session = 3, .pid = 4242, .seq = 7, .op = "fetch"};
	struct kvtd_log_fields some = {.session = 9};
	struct iovec iov[8];
	char buf[512], s[1024];
	int n;

	n = kvtd_log_journal_fields(KVTD_LOG_WARNING, &f, "refused: no staging", buf, sizeof(buf),
				    iov, 8);
	ck_assert_int_eq(n, 7);
	join(iov, n, s, sizeof(s));
	ck_assert_str_eq(s, "PRIORITY=4|SYSLOG_IDENTIFIER=kvtierd|SESSION=3|PID=4242|SEQ=7|"
			    "OP=fetch|MESSAGE=refused: no staging");
	/* only what is set */
	n = kvtd_log_journal_fields(KVTD_LOG_INFO, &some, "ended", buf, sizeof(buf), iov, 8);
	join(iov, n, s, sizeof(s));
	ck_assert_str_eq(s, "PRIORITY=6|SYSLOG_IDENTIFIER=kvtierd|SESSION=9|MESSAGE=ended");
	n = kvtd_log_journal_fields(KVTD_LOG_ERR, NULL, "x", buf, sizeof(buf), iov, 8);
	join(iov, n, s, sizeof(s));
	ck_assert_str_eq(s, "PRIORITY=3|SYSLOG_IDENTIFIER=kvtierd|MESSAGE=x");
	/* an opcode name from a hostile source could hold a newline: a field value may (the
	 * native protocol carries it), the iovec keeps its exact length */
	f.op = "a\nb";
	n = kvtd_log_journal_fields(KVTD_LOG_ERR, &f, "m", buf, sizeof(buf), iov, 8);
	ck_assert_int_eq(iov[5].iov_len, strlen("OP=a\nb"));
}
END_TEST

START_TEST(test_journal_fields_small)
{
	struct kvtd_log_fields f = {.session = 3, .pid = 4242, .seq = 7, .op = "fetch"};
	char msg[600], buf[128];
	struct iovec iov[8];
	int n;

	/* too few iovecs or bytes for the fields: refused, nothing half-built is sent */
	ck_assert_int_eq(kvtd_log_journal_fields(6, &f, "m", buf, sizeof(buf), iov, 3), -ENOSPC);
	ck_assert_int_eq(kvtd_log_journal_fields(6, &f, "m", buf, 40, iov, 8), -ENOSPC);
	/* a long message is cut to fit, after the fields */
	memset(msg, 'x', sizeof(msg) - 1);
	msg[sizeof(msg) - 1] = '\0';
	n = kvtd_log_journal_fields(6, &f, msg, buf, sizeof(buf), iov, 8);
	ck_assert_int_eq(n, 7);
	ck_assert_int_eq(strncmp(iov[6].iov_base, "MESSAGE=xxx", 11), 0);
	ck_assert((char *)iov[6].iov_base + iov[6].iov_len <= buf + sizeof(buf) - 1);
}
END_TEST

START_TEST(test_stderr_is_journal)
{
	char path[] = "/tmp/kvt-log-XXXXXX", env[64];
	int fd = mkstemp(path);
	struct stat st;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(dup2(fd, 2), 2);
	ck_assert_int_eq(fstat(fd, &st), 0);
	unsetenv("JOURNAL_STREAM");
	ck_assert_int_eq(kvtd_log_stderr_is_journal(), 0);
	snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	setenv("JOURNAL_STREAM", env, 1);
	ck_assert_int_eq(kvtd_log_stderr_is_journal(), 1);
	/* another file: stderr was redirected after systemd set the variable */
	snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino + 1);
	setenv("JOURNAL_STREAM", env, 1);
	ck_assert_int_eq(kvtd_log_stderr_is_journal(), 0);
	setenv("JOURNAL_STREAM", "garbage", 1);
	ck_assert_int_eq(kvtd_log_stderr_is_journal(), 0);
	snprintf(env, sizeof(env), "%llu:%llux", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	setenv("JOURNAL_STREAM", env, 1);
	ck_assert_int_eq(kvtd_log_stderr_is_journal(), 0);
	close(fd);
	unlink(path);
}
END_TEST

/* Outside systemd: one "<level>message" line per call on stderr, fields not in the text. */
START_TEST(test_stderr_lines)
{
	struct kvtd_log_fields f = {.session = 3, .pid = 42, .seq = 1, .op = "append"};
	char path[] = "/tmp/kvt-log-XXXXXX", got[256];
	int fd = mkstemp(path);
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	unsetenv("JOURNAL_STREAM");
	ck_assert_int_eq(dup2(fd, 2), 2);
	kvtd_log_set_level(KVTD_LOG_INFO);
	kvtd_log(KVTD_LOG_NOTICE, "plain %d", 1);
	kvtd_log_f(KVTD_LOG_WARNING, &f, "session %u: with fields", 3u);
	kvtd_log_f(KVTD_LOG_DEBUG, &f, "below the level");
	fflush(stderr);
	n = pread(fd, got, sizeof(got) - 1, 0);
	ck_assert_int_ge(n, 0);
	got[n] = '\0';
	ck_assert_str_eq(got, "<5>plain 1\n<4>session 3: with fields\n");
	close(fd);
	unlink(path);
}
END_TEST

static Suite *
log_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("log");

	tcase_add_test(tc, test_journal_fields);
	tcase_add_test(tc, test_journal_fields_small);
	tcase_add_test(tc, test_stderr_is_journal);
	tcase_add_test(tc, test_stderr_lines);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	return kvt_check_run(log_suite());
}
