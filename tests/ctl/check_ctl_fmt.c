/* SPDX-License-Identifier: MIT */
/*
 * check_ctl_fmt.c - kvtierctl's formatters (tools/kvtierctl/ctl_fmt.c) on canned documents of the
 * shapes kvtierd sends: full documents print exactly as expected, missing keys print "-", wrong
 * shapes are refused. (The Prometheus text is the daemon's: tests/unit/check_metrics_format.c.)
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_fmt.h"
#include "kvt_ctl_docs.h"
#include "kvt_test.h"

static const char status_json[] =
    "{\"version\":\"0.1.0\",\"abi\":{\"major\":1,\"minor\":0},\"backend\":\"host\",\"pid\":123,"
    "\"uptime_s\":12.5,\"pollers\":1,\"pool\":{\"size\":4294967296,\"used\":1073741824,"
    "\"free\":3221225472,\"chunk_size\":2097152,\"chunks_free\":1536,\"classes\":3,"
    "\"backing\":\"thp\",\"page_kib\":2048,\"numa_node\":-1,\"locked\":true},\"sessions\":2,"
    "\"seqs\":1,"
    "\"ops\":1000,\"errors\":2,\"refused\":{\"quota\":0,\"nomem\":1,\"einval\":0,\"auth\":0,"
    "\"hello_timeout\":3},\"tiers\":[100,200,300,10]}";

static const char blocks_json[] =
    "{\"schema\":1,\"budget_bytes\":1073741824,\"bytes\":50331648,\"blocks\":48,"
    "\"referenced\":40,\"lookups\":10,\"hit_blocks\":30,\"miss_blocks\":10,\"published\":50,"
    "\"deduped\":4,\"evicted\":2,\"refused_budget\":1,\"namespaces\":["
    "{\"id\":1,\"name\":\"smollm2-135m\",\"scope\":\"uid\",\"uid\":1000,\"layers\":30,"
    "\"kv_heads\":3,\"head_dim\":64,\"dtype\":\"f16\",\"block_tokens\":16,\"blocks\":32,"
    "\"referenced\":32,\"bytes\":33554432,\"handles\":2,\"lookups\":10,\"hit_blocks\":30,"
    "\"miss_blocks\":10,\"published\":34,\"deduped\":4,\"evicted\":2},"
    "{\"id\":2,\"name\":\"llama\\u001b[2J\",\"scope\":\"shared\",\"layers\":2,"
    "\"kv_heads\":1,\"head_dim\":16,\"dtype\":\"f32\",\"block_tokens\":16,\"blocks\":16,"
    "\"referenced\":8,\"bytes\":16777216,\"handles\":1,\"lookups\":0,\"hit_blocks\":0,"
    "\"miss_blocks\":0,\"published\":16,\"deduped\":0,\"evicted\":0}]}";

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
			      "pool pages     2048 KiB\n"
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

START_TEST(test_status_spill)
{
	/* A store configured: its lines after the tiers, with counts the wire cannot reach yet
	 * (nothing spills) */
	static const char doc[] =
	    "{\"tiers\":[1,2,3,4],\"spill\":{\"path\":\"/var/lib/kvtier/spill\\u001b\","
	    "\"kind\":\"file\",\"size\":68719476736,\"used\":17179869184,\"free\":51539607552,"
	    "\"largest_free\":34359738368,\"extents\":1500,\"queue_depth\":64,\"in_flight\":0,"
	    "\"uid_share\":34359738368,\"uids\":[{\"uid\":1000,\"bytes\":16106127360},"
	    "{\"uid\":0,\"bytes\":1073741824},{\"bytes\":5}],"
	    "\"io\":{\"reads\":40,\"writes\":50,\"read_bytes\":163840,\"write_bytes\":204800,"
	    "\"read_errors\":2,\"write_errors\":4},"
	    "\"errors\":{\"eio\":3,\"enospc\":1,\"short\":2,\"other\":0},"
	    "\"refused\":{\"nospc\":6,\"quota\":7},\"dropped\":{\"extents\":8,\"bytes\":32768}}}";
	char *out = run(kvtctl_fmt_status, doc, 0);

	ck_assert_msg(strstr(out, "tiers          T0 1  T1 2  T2 3  T3 4\n"
				  "spill path     /var/lib/kvtier/spill?\n"
				  "spill kind     file\n"
				  "spill size     64.0 GiB\n"
				  "spill used     16.0 GiB (25.0%)\n"
				  "spill free     48.0 GiB\n"
				  "spill extents  1500\n"
				  "spill uids     uid 1000 15.0 GiB, uid 0 1.0 GiB, uid - 5 B; "
				  "share 32.0 GiB\n"
				  "spill io       reads 40, writes 50, read_bytes 163840, "
				  "write_bytes 204800, read_errors 2, write_errors 4\n"
				  "spill errors   eio 3, enospc 1, short 2, other 0\n"
				  "spill refused  nospc 6, quota 7\n"
				  "spill dropped  extents 8, bytes 32768\n"),
		      "%s", out);
	free(out);

	/* no share, no uid holding space; keys missing or of the wrong type print "-" */
	out = run(kvtctl_fmt_status,
		  "{\"spill\":{\"uid_share\":0,\"uids\":[],\"size\":\"x\",\"errors\":3}}", 0);
	ck_assert_ptr_nonnull(strstr(out, "spill uids     none; no share\n"));
	ck_assert_ptr_nonnull(strstr(out, "spill size     -\n"));
	ck_assert_ptr_nonnull(strstr(out, "spill path     -\n"));
	ck_assert_ptr_nonnull(strstr(out, "spill errors   -\n"));
	free(out);
	out = run(kvtctl_fmt_status, "{\"spill\":{\"uids\":{}}}", 0);
	ck_assert_ptr_nonnull(strstr(out, "spill uids     -\n"));
	free(out);
	out = run(kvtctl_fmt_status, "{\"spill\":{\"uids\":[{\"uid\":1,\"bytes\":4096}]}}", 0);
	ck_assert_ptr_nonnull(strstr(out, "spill uids     uid 1 4.0 KiB; share -\n"));
	free(out);

	/* no store: no spill line at all (an older daemon, or none configured) */
	for (int i = 0; i < 2; i++) {
		out = run(kvtctl_fmt_status, i ? "{\"spill\":3}" : status_json, 0);
		ck_assert_ptr_null(strstr(out, "spill"));
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

START_TEST(test_blocks_table)
{
	char *out = run(kvtctl_fmt_blocks, blocks_json, 0);

	/* a client names its namespace: its escape sequence reaches the terminal as '?' */
	ck_assert_str_eq(
	    out, "ID  NAME          SCOPE     BLOCKS  REF   MiB  HITRATE  PUBLISHED  EVICTED\n"
		 " 1  smollm2-135m  uid 1000      32   32  32.0    75.0%         34        2\n"
		 " 2  llama?[2J     shared        16    8  16.0        -         16        0\n"
		 "total  48 blocks (40 referenced), 48.0 MiB of 1.0 GiB budget, hit rate 75.0%\n"
		 "       published 50, deduped 4, evicted 2, refused 1\n");
	free(out);

	/* an empty store: the note and the totals; a budget of 0 says sharing is off */
	out = run(kvtctl_fmt_blocks,
		  "{\"budget_bytes\":0,\"bytes\":0,\"blocks\":0,\"referenced\":0,"
		  "\"lookups\":0,\"hit_blocks\":0,\"miss_blocks\":0,\"published\":0,"
		  "\"deduped\":0,\"evicted\":0,\"refused_budget\":0,\"namespaces\":[]}",
		  0);
	ck_assert_str_eq(out,
			 "no prefix namespaces\n"
			 "total  0 blocks (0 referenced), 0 B, budget 0 (sharing off), hit rate -\n"
			 "       published 0, deduped 0, evicted 0, refused 0\n");
	free(out);

	/* missing keys print "-" */
	out = run(kvtctl_fmt_blocks, "{\"namespaces\":[{\"id\":3,\"scope\":\"uid\"}]}", 0);
	ck_assert_str_eq(out, "ID  NAME  SCOPE  BLOCKS  REF  MiB  HITRATE  PUBLISHED  EVICTED\n"
			      " 3  -     uid         -    -    -        -          -        -\n"
			      "total  - blocks (- referenced), - of - budget, hit rate -\n"
			      "       published -, deduped -, evicted -, refused -\n");
	free(out);

	free(run(kvtctl_fmt_blocks, "{\"namespaces\":{}}", -EINVAL));
	free(run(kvtctl_fmt_blocks, "[]", -EINVAL));
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

static Suite *
ctl_fmt_suite(void)
{
	Suite *s = suite_create("ctl_fmt");
	TCase *tc = tcase_create("fmt");

	tcase_add_test(tc, test_status_full);
	tcase_add_test(tc, test_status_missing_keys);
	tcase_add_test(tc, test_status_numa_bound);
	tcase_add_test(tc, test_status_spill);
	tcase_add_test(tc, test_not_objects);
	tcase_add_test(tc, test_clients_table);
	tcase_add_test(tc, test_clients_empty_and_partial);
	tcase_add_test(tc, test_seqs_table);
	tcase_add_test(tc, test_blocks_table);
	tcase_add_test(tc, test_units);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	return kvt_check_run(ctl_fmt_suite());
}
