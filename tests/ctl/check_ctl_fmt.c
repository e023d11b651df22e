/* SPDX-License-Identifier: MIT */
/*
 * check_ctl_fmt.c - kvtierctl's formatters (tools/kvtierctl/ctl_fmt.c) on canned documents of the
 * shapes kvtierd sends: full documents print exactly as expected, missing keys print "-" or leave
 * the metric out, wrong shapes are refused, and the Prometheus text is well formed.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_fmt.h"

static const char status_json[] =
    "{\"version\":\"0.1.0\",\"abi\":{\"major\":1,\"minor\":0},\"backend\":\"host\",\"pid\":123,"
    "\"uptime_s\":12.5,\"pollers\":1,\"pool\":{\"size\":4294967296,\"used\":1073741824,"
    "\"free\":3221225472,\"chunk_size\":2097152,\"chunks_free\":1536,\"classes\":3,"
    "\"backing\":\"thp\",\"numa_node\":-1,\"locked\":true},\"sessions\":2,\"seqs\":1,"
    "\"ops\":1000,\"errors\":2,\"refused\":{\"quota\":0,\"nomem\":1,\"einval\":0,\"auth\":0,"
    "\"hello_timeout\":3},\"tiers\":[100,200,300,10]}";

static const char clients_json[] =
    "{\"clients\":[{\"session\":1,\"pid\":123,\"uid\":0,\"gid\":0,\"name\":\"sim-0\",\"seqs\":1,"
    "\"pool_bytes\":123456789,\"ops\":500,\"errors\":0,\"sq_entries\":256,"
    "\"arena_size\":1048576,\"uptime_s\":1.5},"
    "{\"session\":2,\"pid\":99,\"uid\":1000,\"gid\":1000,\"name\":\"a\\\"b\\\\c\\nd\\u001b\","
    "\"seqs\":0,\"pool_bytes\":0,\"ops\":5,\"errors\":1,\"sq_entries\":1024,"
    "\"arena_size\":16777216,\"uptime_s\":4000}]}";

static const char seqs_json[] =
    "{\"seqs\":[{\"session\":1,\"seq\":7,\"n\":1000,\"layers\":32,\"kv_heads\":8,\"head_dim\":128,"
    "\"dtype\":\"f16\",\"policy\":\"tiered\",\"t2_keys\":\"channel\",\"tiers\":[500,400,70,30],"
    "\"evicted_ratio\":0.03,"
    "\"pool_bytes\":123456789}]}";

struct capture {
	char *buf;
	size_t len;
	FILE *f;
};

static void
cap_open(struct capture *c)
{
	c->buf = NULL;
	c->len = 0;
	c->f = open_memstream(&c->buf, &c->len);
	ck_assert_ptr_nonnull(c->f);
}

/* Close the stream and return its text; the caller frees it. */
static char *
cap_close(struct capture *c)
{
	ck_assert_int_eq(fclose(c->f), 0);
	return c->buf;
}

static struct json_object *
parse(const char *text)
{
	struct json_object *o = json_tokener_parse(text);

	ck_assert_ptr_nonnull(o);
	return o;
}

/* Run @fmt on @text and return what it printed; asserts it returned @want. */
static char *
run(int (*fmt)(FILE *, struct json_object *), const char *text, int want)
{
	struct json_object *o = parse(text);
	struct capture c;

	cap_open(&c);
	ck_assert_int_eq(fmt(c.f, o), want);
	json_object_put(o);
	return cap_close(&c);
}

static char *
run_metrics(const char *st, const char *cl, const char *sq)
{
	struct json_object *s = st ? parse(st) : NULL, *c = cl ? parse(cl) : NULL,
			   *q = sq ? parse(sq) : NULL;
	struct capture cap;

	cap_open(&cap);
	ck_assert_int_eq(kvtctl_fmt_metrics(cap.f, s, c, q), 0);
	json_object_put(s);
	json_object_put(c);
	json_object_put(q);
	return cap_close(&cap);
}

START_TEST(test_status_full)
{
	char *out = run(kvtctl_fmt_status, status_json, 0);

	ck_assert_str_eq(out, "version        0.1.0\n"
			      "abi            1.0\n"
			      "backend        host\n"
			      "pid            123\n"
			      "uptime         12.5s\n"
			      "pollers        1\n"
			      "pool size      4.0 GiB\n"
			      "pool used      1.0 GiB (25.0%)\n"
			      "pool free      3.0 GiB\n"
			      "pool chunks    1536 free, 2.0 MiB each\n"
			      "pool classes   3\n"
			      "pool backing   thp\n"
			      "pool numa      any\n"
			      "pool locked    yes\n"
			      "sessions       2\n"
			      "seqs           1\n"
			      "ops            1000\n"
			      "errors         2\n"
			      "refused        quota 0, nomem 1, einval 0, auth 0, hello_timeout 3\n"
			      "tiers          T0 100  T1 200  T2 300  T3 10\n");
	free(out);
}
END_TEST

START_TEST(test_status_missing_keys)
{
	/* An empty object, and one whose values have the wrong types: every line says "-". */
	static const char *const docs[] = {
	    "{}",
	    "{\"version\":1,\"abi\":\"1.0\",\"pid\":\"x\",\"pool\":[],\"refused\":3,\"tiers\":{}}",
	};
	unsigned int i;

	for (i = 0; i < 2; i++) {
		char *out = run(kvtctl_fmt_status, docs[i], 0), *line;
		unsigned int lines = 0;

		for (line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
			size_t n = strlen(line);

			ck_assert_msg((n >= 2 && !strcmp(line + n - 2, " -")) ||
					  strstr(line, "- free, - each"),
				      "line '%s' of doc %u", line, i);
			lines++;
		}
		ck_assert_uint_eq(lines, 20);
		free(out);
	}
}
END_TEST

START_TEST(test_status_numa_bound)
{
	char *out = run(kvtctl_fmt_status, "{\"pool\":{\"numa_node\":1,\"locked\":false}}", 0);

	ck_assert_ptr_nonnull(strstr(out, "pool numa      1\n"));
	ck_assert_ptr_nonnull(strstr(out, "pool locked    no\n"));
	free(out);
}
END_TEST

START_TEST(test_not_objects)
{
	struct json_object *arr = parse("[1,2]");
	struct capture c;

	cap_open(&c);
	ck_assert_int_eq(kvtctl_fmt_status(c.f, arr), -EINVAL);
	ck_assert_int_eq(kvtctl_fmt_clients(c.f, arr), -EINVAL);
	ck_assert_int_eq(kvtctl_fmt_seqs(c.f, arr), -EINVAL);
	ck_assert_int_eq(kvtctl_fmt_metrics(c.f, arr, NULL, NULL), -EINVAL);
	ck_assert_int_eq(kvtctl_fmt_metrics(c.f, NULL, arr, NULL), -EINVAL);
	ck_assert_int_eq(kvtctl_fmt_status(c.f, NULL), -EINVAL);
	free(cap_close(&c));
	json_object_put(arr);

	free(run(kvtctl_fmt_clients, "{\"clients\":{}}", -EINVAL));
	free(run(kvtctl_fmt_seqs, "{\"seqs\":3}", -EINVAL));
}
END_TEST

START_TEST(test_clients_table)
{
	char *out = run(kvtctl_fmt_clients, clients_json, 0);

	/* Control characters from a client's HELLO name never reach the terminal. */
	ck_assert_str_eq(
	    out,
	    "SESSION  PID   UID   GID  SEQS       POOL  OPS  ERRORS    SQ     ARENA  UPTIME  NAME\n"
	    "      1  123     0     0     1  117.7 MiB  500       0   256   1.0 MiB    1.5s  "
	    "sim-0\n"
	    "      2   99  1000  1000     0        0 B    5       1  1024  16.0 MiB   1h06m  "
	    "a\"b\\c?d?\n");
	free(out);
}
END_TEST

START_TEST(test_clients_empty_and_partial)
{
	char *out;

	out = run(kvtctl_fmt_clients, "{\"clients\":[]}", 0);
	ck_assert_str_eq(out, "no clients connected\n");
	free(out);
	out = run(kvtctl_fmt_clients, "{}", 0);
	ck_assert_str_eq(out, "no clients connected\n");
	free(out);

	/* A row with only a session id, and a row that is not an object: dashes, same widths. */
	out = run(kvtctl_fmt_clients, "{\"clients\":[{\"session\":12},5]}", 0);
	ck_assert_str_eq(
	    out, "SESSION  PID  UID  GID  SEQS  POOL  OPS  ERRORS  SQ  ARENA  UPTIME  NAME\n"
		 "     12    -    -    -     -     -    -       -   -      -       -  -\n"
		 "      -    -    -    -     -     -    -       -   -      -       -  -\n");
	free(out);
}
END_TEST

START_TEST(test_seqs_table)
{
	char *out = run(kvtctl_fmt_seqs, seqs_json, 0);

	ck_assert_str_eq(
	    out, "SESSION  SEQ  TOKENS  LAYERS  HEADS  DIM  DTYPE  POLICY  T2KEYS    T0   T1  "
		 "T2  T3  EVICTED       POOL\n"
		 "      1    7    1000      32      8  128  f16    tiered  channel  500  400  "
		 "70  30     3.0%  117.7 MiB\n");
	free(out);

	out = run(kvtctl_fmt_seqs, "{\"seqs\":[{\"session\":1,\"seq\":2,\"tiers\":[9]}]}", 0);
	ck_assert_ptr_nonnull(strstr(out, "  9   -   -   -  "));
	free(out);

	out = run(kvtctl_fmt_seqs, "{\"seqs\":[]}", 0);
	ck_assert_str_eq(out, "no open sequences\n");
	free(out);
}
END_TEST

START_TEST(test_units)
{
	char b[32];

	kvtctl_fmt_bytes(b, sizeof(b), 0);
	ck_assert_str_eq(b, "0 B");
	kvtctl_fmt_bytes(b, sizeof(b), 1023);
	ck_assert_str_eq(b, "1023 B");
	kvtctl_fmt_bytes(b, sizeof(b), 1536);
	ck_assert_str_eq(b, "1.5 KiB");
	kvtctl_fmt_bytes(b, sizeof(b), 2097152);
	ck_assert_str_eq(b, "2.0 MiB");
	kvtctl_fmt_bytes(b, sizeof(b), 3.0 * (1ull << 40));
	ck_assert_str_eq(b, "3.0 TiB");
	kvtctl_fmt_duration(b, sizeof(b), 0.25);
	ck_assert_str_eq(b, "0.2s");
	kvtctl_fmt_duration(b, sizeof(b), 187);
	ck_assert_str_eq(b, "3m07s");
	kvtctl_fmt_duration(b, sizeof(b), 7500);
	ck_assert_str_eq(b, "2h05m");
	kvtctl_fmt_duration(b, sizeof(b), 3 * 86400 + 7200);
	ck_assert_str_eq(b, "3d02h");
	kvtctl_fmt_duration(b, sizeof(b), -1);
	ck_assert_str_eq(b, "-");
}
END_TEST

/*
 * Check the exposition format rules a scraper relies on: every sample's family was announced
 * by "# HELP" then "# TYPE" just before its first sample, each family is announced once and its
 * samples are contiguous, counters end in _total, and every sample line is NAME[{...}] VALUE.
 * Returns the number of samples.
 */
static unsigned int
check_exposition(char *text)
{
	char fams[64][64], cur[64] = "", help[64] = "";
	unsigned int nfams = 0, samples = 0, i;
	char *line, *save;

	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[64], type[16], *end;
		size_t n;

		if (!strncmp(line, "# HELP ", 7)) {
			ck_assert_int_eq(sscanf(line, "# HELP %63s", help), 1);
			ck_assert_msg(strlen(line) > 8 + strlen(help), "HELP without text: %s",
				      line);
			continue;
		}
		if (!strncmp(line, "# TYPE ", 7)) {
			ck_assert_int_eq(sscanf(line, "# TYPE %63s %15s", name, type), 2);
			ck_assert_str_eq(name, help);
			for (i = 0; i < nfams; i++)
				ck_assert_msg(strcmp(fams[i], name), "family %s twice", name);
			ck_assert_uint_lt(nfams, 64);
			strcpy(fams[nfams++], name);
			strcpy(cur, name);
			n = strlen(name);
			if (!strcmp(type, "counter"))
				ck_assert_str_eq(name + n - 6, "_total");
			else
				ck_assert_str_eq(type, "gauge");
			help[0] = '\0';
			continue;
		}
		ck_assert_msg(line[0] != '#', "stray comment %s", line);
		n = strcspn(line, "{ ");
		ck_assert_msg(n == strlen(cur) && !strncmp(line, cur, n),
			      "sample '%s' outside its family '%s'", line, cur);
		if (line[n] == '{') {
			end = strrchr(line, '}');
			ck_assert_ptr_nonnull(end);
			ck_assert_int_eq(end[1], ' ');
			n = end - line + 1;
		}
		ck_assert_int_eq(line[n], ' ');
		strtod(line + n + 1, &end);
		ck_assert_msg(end != line + n + 1 && !*end, "bad value in '%s'", line);
		samples++;
	}
	return samples;
}

START_TEST(test_metrics_full)
{
	char *out = run_metrics(status_json, clients_json, seqs_json);
	static const char *const want[] = {
	    "kvtier_build_info{version=\"0.1.0\",abi=\"1.0\",backend=\"host\"} 1\n",
	    "kvtier_uptime_seconds 12.5\n",
	    "kvtier_pool_size_bytes 4294967296\n",
	    "kvtier_pool_used_bytes 1073741824\n",
	    "kvtier_pool_numa_node -1\n",
	    "kvtier_pool_locked 1\n",
	    "kvtier_pool_info{backing=\"thp\"} 1\n",
	    "kvtier_ops_total 1000\n",
	    "kvtier_errors_total 2\n",
	    "# TYPE kvtier_refused_total counter\n",
	    "kvtier_refused_total{reason=\"nomem\"} 1\n",
	    "kvtier_refused_total{reason=\"hello_timeout\"} 3\n",
	    "kvtier_tier_tokens{tier=\"t3\"} 10\n",
	    "kvtier_session_info{session=\"1\",pid=\"123\",uid=\"0\",gid=\"0\",name=\"sim-0\"} 1\n",
	    /* label escaping: backslash, quote and newline */
	    "kvtier_session_info{session=\"2\",pid=\"99\",uid=\"1000\",gid=\"1000\","
	    "name=\"a\\\"b\\\\c\\nd\x1b\"} 1\n",
	    "kvtier_session_pool_bytes{session=\"1\"} 123456789\n",
	    "kvtier_session_ops_total{session=\"2\"} 5\n",
	    "kvtier_session_uptime_seconds{session=\"1\"} 1.5\n",
	    "kvtier_seq_info{session=\"1\",seq=\"7\",layers=\"32\",kv_heads=\"8\",head_dim=\"128\","
	    "dtype=\"f16\",policy=\"tiered\",t2_keys=\"channel\"} 1\n",
	    "kvtier_seq_tokens{session=\"1\",seq=\"7\"} 1000\n",
	    "kvtier_seq_evicted_ratio{session=\"1\",seq=\"7\"} 0.03\n",
	    "kvtier_seq_tier_tokens{session=\"1\",seq=\"7\",tier=\"t0\"} 500\n",
	    "kvtier_seq_tier_tokens{session=\"1\",seq=\"7\",tier=\"t3\"} 30\n",
	    "kvtier_seq_pool_bytes{session=\"1\",seq=\"7\"} 123456789\n",
	};
	unsigned int i;

	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_assert_msg(strstr(out, want[i]), "missing: %s", want[i]);
	/* 14 status scalars + build + pool info + 5 refused + 4 tiers; 2 x 8 session; 1 x 8 seq */
	ck_assert_uint_eq(check_exposition(out), 14 + 2 + 5 + 4 + 16 + 8);
	free(out);
}
END_TEST

START_TEST(test_metrics_partial)
{
	char *out;

	/* Nothing known: no family at all, not even HELP lines. */
	out = run_metrics("{}", "{}", "{}");
	ck_assert_str_eq(out, "");
	free(out);
	out = run_metrics(NULL, NULL, NULL);
	ck_assert_str_eq(out, "");
	free(out);

	/* Rows without ids are skipped; missing values leave only their own family out. */
	out = run_metrics("{\"ops\":5,\"pool\":{\"size\":10}}",
			  "{\"clients\":[{\"pid\":1,\"ops\":3},{\"session\":4}]}",
			  "{\"seqs\":[{\"session\":4,\"n\":9},{\"seq\":1,\"n\":2}]}");
	ck_assert_ptr_nonnull(strstr(out, "kvtier_ops_total 5\n"));
	ck_assert_ptr_nonnull(strstr(out, "kvtier_pool_size_bytes 10\n"));
	ck_assert_ptr_null(strstr(out, "kvtier_pool_used_bytes"));
	ck_assert_ptr_null(strstr(out, "kvtier_build_info"));
	ck_assert_ptr_nonnull(strstr(out, "kvtier_session_info{session=\"4\"} 1\n"));
	ck_assert_ptr_null(strstr(out, "kvtier_session_ops_total"));
	ck_assert_ptr_null(strstr(out, "kvtier_seq_"));
	ck_assert_uint_eq(check_exposition(out), 3);
	free(out);
}
END_TEST

static Suite *
ctl_fmt_suite(void)
{
	Suite *s = suite_create("ctl_fmt");
	TCase *tc = tcase_create("fmt");

	tcase_add_test(tc, test_status_full);
	tcase_add_test(tc, test_status_missing_keys);
	tcase_add_test(tc, test_status_numa_bound);
	tcase_add_test(tc, test_not_objects);
	tcase_add_test(tc, test_clients_table);
	tcase_add_test(tc, test_clients_empty_and_partial);
	tcase_add_test(tc, test_seqs_table);
	tcase_add_test(tc, test_units);
	tcase_add_test(tc, test_metrics_full);
	tcase_add_test(tc, test_metrics_partial);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	SRunner *sr = srunner_create(ctl_fmt_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
