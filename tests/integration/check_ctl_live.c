/* SPDX-License-Identifier: MIT */
/*
 * kvtierctl against a real kvtierd: what an operator sees matches what clients hold.
 */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvtier.h"

static struct kvtd_proc D;

/* Runs kvtierctl with @args; returns its exit status, output in @out. */
static int
ctl(const char *args, char *out, size_t len)
{
	char cmd[512];
	size_t n = 0;
	FILE *p;
	int st;

	snprintf(cmd, sizeof(cmd), "%s --socket %s %s 2>&1", getenv("KVTIERCTL"), D.sock, args);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	while (n + 1 < len && fgets(out + n, (int)(len - n), p))
		n += strlen(out + n);
	out[n] = '\0';
	st = pclose(p);
	return WEXITSTATUS(st);
}

START_TEST(t_status_clients_seqs)
{
	static char out[65536];
	struct kvt_opts o = {.size = sizeof(o), .name = "ctl-live"};
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = 2,
				   .kv_heads = 1,
				   .head_dim = 16,
				   .dtype = KVT_DTYPE_F32,
				   .delta = 8,
				   .hbm_frac = 0.5f};
	struct json_object *j, *a;
	struct kvt_client *c;
	float rows[2 * 2 * 16 * 10] = {0};
	uint32_t seq;

	ck_assert_int_eq(kvt_connect(D.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), 10, NULL), 10);

	ck_assert_int_eq(ctl("status --json", out, sizeof(out)), 0);
	j = json_tokener_parse(out);
	ck_assert_ptr_nonnull(j);
	ck_assert_int_eq(json_get_i64(j, "sessions"), 1);
	ck_assert_int_eq(json_get_i64(j, "seqs"), 1);
	ck_assert_int_eq(json_get_i64(j, "pool.size"), 64 << 20);
	ck_assert_int_gt(json_get_i64(j, "pool.used"), 0);
	json_object_put(j);

	ck_assert_int_eq(ctl("clients", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "ctl-live"));

	ck_assert_int_eq(ctl("seqs --json", out, sizeof(out)), 0);
	j = json_tokener_parse(out);
	ck_assert(json_object_object_get_ex(j, "seqs", &a));
	ck_assert_int_eq(json_object_array_length(a), 1);
	ck_assert_int_eq(json_get_i64(json_object_array_get_idx(a, 0), "n"), 10);
	json_object_put(j);

	ck_assert_int_eq(ctl("metrics", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "kvtier_"));

	kvt_disconnect(c);
	ck_assert_int_eq(ctl("status --json", out, sizeof(out)), 0);
	j = json_tokener_parse(out);
	for (int i = 0; i < 100 && json_get_i64(j, "sessions") != 0; i++) {
		json_object_put(j);
		usleep(10000);
		ck_assert_int_eq(ctl("status --json", out, sizeof(out)), 0);
		j = json_tokener_parse(out);
	}
	ck_assert_int_eq(json_get_i64(j, "sessions"), 0);
	ck_assert_int_eq(json_get_i64(j, "pool.used"), 0);
	json_object_put(j);
}
END_TEST

/* kvtierd itself: bad flags and config stop it with exit 2 and a message, before anything. */
START_TEST(t_daemon_cli)
{
	static const struct {
		const char *args, *want;
		int status;
	} cases[] = {
	    {"--pool-size 1x", "bad value '1x' for --pool-size", 2},
	    {"--bogus", "unknown or incomplete option", 2},
	    {"--config /nonexistent.conf", "cannot open config /nonexistent.conf", 2},
	    {"--backend tpu", "bad value 'tpu' for --backend", 2},
	    {"--version", "kvtierd ", 0},
	    {"--help", "usage: kvtierd", 0},
	};

	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char cmd[512], out[4096];
		size_t n = 0;
		FILE *p;
		int st;

		snprintf(cmd, sizeof(cmd), "%s %s 2>&1", getenv("KVTIERD"), cases[i].args);
		p = popen(cmd, "r");
		ck_assert_ptr_nonnull(p);
		while (n + 1 < sizeof(out) && fgets(out + n, (int)(sizeof(out) - n), p))
			n += strlen(out + n);
		out[n] = '\0';
		st = pclose(p);
		ck_assert_msg(WEXITSTATUS(st) == cases[i].status, "%s: exit %d", cases[i].args,
			      WEXITSTATUS(st));
		ck_assert_msg(strstr(out, cases[i].want), "%s: said '%s'", cases[i].args, out);
	}
}
END_TEST

/* systemd's notification protocol: READY=1 once serving, WATCHDOG=1 from the loop, STOPPING=1. */
START_TEST(t_sd_notify)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {5, 0};
	struct kvtd_proc d;
	char buf[512], seen[4096] = "";
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	const char *extra[] = {"--hello-timeout-ms", "200", NULL}; /* 50 ms ticks */

	snprintf(sa.sun_path, sizeof(sa.sun_path), "/tmp/kvt-notify-%d.sock", (int)getpid());
	unlink(sa.sun_path);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setenv("NOTIFY_SOCKET", sa.sun_path, 1);
	daemon_start(&d, extra);
	unsetenv("NOTIFY_SOCKET");
	while (!strstr(seen, "WATCHDOG=1")) {
		ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);

		ck_assert_int_gt(n, 0);
		buf[n] = '\0';
		strncat(seen, buf, sizeof(seen) - strlen(seen) - 2);
		strcat(seen, "\n");
	}
	ck_assert_ptr_nonnull(strstr(seen, "READY=1"));
	ck_assert_int_eq(daemon_stop(&d), 0);
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);

		ck_assert_int_gt(n, 0);
		buf[n] = '\0';
		if (strstr(buf, "STOPPING=1"))
			break;
	}
	close(fd);
	unlink(sa.sun_path);
}
END_TEST

static void
up(void)
{
	daemon_start(&D, NULL);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

int
main(void)
{
	Suite *s = suite_create("ctl-live");
	TCase *tc = tcase_create("ctl-live");
	SRunner *sr;
	int failed;

	tcase_add_checked_fixture(tc, up, down);
	tcase_add_test(tc, t_status_clients_seqs);
	tcase_add_test(tc, t_daemon_cli);
	suite_add_tcase(s, tc);
	tc = tcase_create("notify");
	tcase_add_test(tc, t_sd_notify);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
