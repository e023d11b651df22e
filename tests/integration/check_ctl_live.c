/* SPDX-License-Identifier: MIT */
/*
 * kvtierctl against a real kvtierd: what an operator sees matches what clients hold.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

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
	static char out[1 << 20]; /* metrics --json: 75 KB with 13 opcodes */
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
	ck_assert_int_eq(json_get_i64(json_object_array_get_idx(a, 0), "tokens"), 10);
	json_object_put(j);

	/* every document says its schema */
	ck_assert_int_eq(ctl("status --json", out, sizeof(out)), 0);
	j = json_tokener_parse(out);
	ck_assert_int_eq(json_get_i64(j, "schema"), KVT_CTL_SCHEMA);
	json_object_put(j);
	ck_assert_int_eq(ctl("clients --json", out, sizeof(out)), 0);
	j = json_tokener_parse(out);
	ck_assert_int_eq(json_get_i64(j, "schema"), KVT_CTL_SCHEMA);
	json_object_put(j);

	/* the daemon's text, printed as it comes: per client name, per-session only on request */
	ck_assert_int_eq(ctl("metrics", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "# TYPE kvtier_op_duration_seconds histogram\n"));
	ck_assert_ptr_nonnull(strstr(out, "kvtier_op_total{op=\"append\"} 1\n"));
	ck_assert_ptr_nonnull(strstr(out, "kvtier_op_total{op=\"seq_open\"} 1\n"));
	ck_assert_ptr_nonnull(strstr(out, "kvtier_client_sessions{client=\"ctl-live\"} 1\n"));
	ck_assert_ptr_nonnull(
	    strstr(out, "kvtier_pool_bytes_total{op=\"append\",direction=\"in\"} 2560\n"));
	ck_assert_ptr_nonnull(strstr(out, "process_open_fds "));
	ck_assert_ptr_null(strstr(out, "kvtier_session_"));
	ck_assert_ptr_null(strstr(out, "kvtier_seq_"));
	ck_assert_int_eq(ctl("metrics --sessions", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "kvtier_session_info{"));
	ck_assert_ptr_nonnull(strstr(out, "kvtier_seq_tokens{session=\""));

	/* --json: the same families as a document */
	ck_assert_int_eq(ctl("metrics --json", out, sizeof(out)), 0);
	j = json_tokener_parse(out);
	ck_assert_ptr_nonnull(j);
	ck_assert_int_eq(json_get_i64(j, "schema"), KVT_CTL_SCHEMA);
	ck_assert(json_object_object_get_ex(j, "metrics", &a));
	{
		bool seen = false;

		for (size_t i = 0; i < json_object_array_length(a); i++) {
			struct json_object *f = json_object_array_get_idx(a, i), *v;

			ck_assert(json_object_object_get_ex(f, "name", &v));
			if (!strcmp(json_object_get_string(v), "kvtier_client_sessions"))
				seen = true;
			ck_assert_str_ne(json_object_get_string(v), "kvtier_session_info");
		}
		ck_assert(seen);
	}
	json_object_put(j);

	/* a hostile METRICS request fails alone, with a reason */
	{
		struct kvt_ctl_metrics m = {
		    .hdr = {.type = KVT_CTL_METRICS, .len = sizeof(m), .id = 7}, .flags = 1u << 9};
		struct kvt_ctl_hdr h = {.type = KVT_CTL_METRICS, .len = sizeof(h), .id = 8};
		union {
			struct kvt_ctl_error e;
			char raw[KVT_CTL_MAX_MSG];
		} *r = malloc(sizeof(*r));
		int fd = ctl_raw_connect(D.sock);

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(send(fd, &m, sizeof(m), 0), (ssize_t)sizeof(m));
		ck_assert_int_ge(ctl_raw_recv(fd, r, sizeof(*r), 5000), (ssize_t)sizeof(r->e));
		ck_assert_uint_eq(r->e.hdr.type, KVT_CTL_ERROR);
		ck_assert_int_eq(r->e.err, -EINVAL);
		ck_assert_ptr_nonnull(strstr(r->e.msg, "flags"));
		/* header only: too short */
		ck_assert_int_eq(send(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
		ck_assert_int_ge(ctl_raw_recv(fd, r, sizeof(*r), 5000), (ssize_t)sizeof(r->e));
		ck_assert_int_eq(r->e.err, -EINVAL);
		/* the same connection then gets its metrics */
		m.flags = 0;
		m.hdr.id = 9;
		ck_assert_int_eq(send(fd, &m, sizeof(m), 0), (ssize_t)sizeof(m));
		ck_assert_int_gt(ctl_raw_recv(fd, r, sizeof(*r), 5000), (ssize_t)sizeof(r->e.hdr));
		ck_assert_uint_eq(r->e.hdr.type, KVT_CTL_TEXT);
		ck_assert_uint_eq(r->e.hdr.id, 9);
		ck_assert_ptr_nonnull(strstr(r->raw + sizeof(r->e.hdr), "# HELP kvtier_"));
		close(fd);
		free(r);
	}

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

/* What kvtierd logs at start, debug included, names no source file (a person reads it): on a
 * machine without a GPU, --backend auto's probe says why in words. */
START_TEST(t_log_no_source_paths)
{
	static const char *const extra[] = {"--backend", "auto", NULL};
	struct kvtd_proc d;
	char log[16384];
	size_t n;
	FILE *f;

	memset(&d, 0, sizeof(d));
	daemon_start(&d, extra);
	f = fopen(d.log, "r");
	ck_assert_ptr_nonnull(f);
	n = fread(log, 1, sizeof(log) - 1, f);
	fclose(f);
	log[n] = '\0';
	ck_assert_int_eq(daemon_stop(&d), 0);
	ck_assert_msg(strstr(log, "ready"), "log: %s", log);
	ck_assert_msg(!strstr(log, ".c:") && !strstr(log, ".cu:") && !strstr(log, ".h:"),
		      "a source path in the log: %s", log);
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

	tcase_add_checked_fixture(tc, up, down);
	tcase_add_test(tc, t_status_clients_seqs);
	tcase_add_test(tc, t_daemon_cli);
	tcase_add_test(tc, t_log_no_source_paths);
	suite_add_tcase(s, tc);
	tc = tcase_create("notify");
	tcase_add_test(tc, t_sd_notify);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
