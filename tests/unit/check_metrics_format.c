/* SPDX-License-Identifier: MIT */
/*
 * check_metrics_format.c - kvtierd's metrics formatter (daemon/metrics_format.c) on canned
 * documents and counter snapshots: full input prints exactly the expected samples, missing keys
 * leave only their metric out, wrong shapes are refused, the text follows the exposition format
 * (families announced once, contiguous, counters _total, histograms cumulative up to +Inf =
 * _count), and the JSON document holds the same families and samples as the text.
 */
#include <check.h>
#include <errno.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_ctl.h"
#include "metrics_format.h"
#include "kvt_ctl_docs.h"
#include "kvt_test.h"

static const char status_json[] =
    "{\"version\":\"0.1.0\",\"abi\":{\"major\":1,\"minor\":0},\"backend\":\"host\",\"pid\":123,"
    "\"uptime_s\":12.5,\"pollers\":1,\"pool\":{\"size\":4294967296,\"used\":1073741824,"
    "\"free\":3221225472,\"chunk_size\":2097152,\"chunks_free\":1536,\"classes\":3,"
    "\"backing\":\"thp\",\"numa_node\":-1,\"locked\":true},\"sessions\":2,\"seqs\":1,"
    "\"ops\":1000,\"errors\":2,\"refused\":{\"quota\":0,\"nomem\":1,\"einval\":0,\"auth\":0,"
    "\"hello_timeout\":3},\"tiers\":[100,200,300,10]}";

/* A BLOCKS document: its totals become the prefix families, its namespaces nothing. */
static const char blocks_json[] =
    "{\"schema\":1,\"budget_bytes\":1073741824,\"bytes\":50331648,\"blocks\":48,"
    "\"referenced\":40,\"lookups\":10,\"hit_blocks\":30,\"miss_blocks\":10,\"published\":50,"
    "\"deduped\":4,\"evicted\":2,\"refused_budget\":1,\"namespaces\":[{\"id\":1,"
    "\"name\":\"secret-model\",\"scope\":\"uid\",\"uid\":1000,\"blocks\":48}]}";

static struct json_object *
parse(const char *text)
{
	struct json_object *o = json_tokener_parse(text);

	ck_assert_ptr_nonnull(o);
	return o;
}

static char *
run_text(const struct kvtd_prom_input *in, int want)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(kvtd_prom_text(f, in), want);
	ck_assert_int_eq(fclose(f), 0);
	return buf;
}

static char *
run_metrics(const char *st, const char *cl, const char *sq)
{
	struct kvtd_prom_input in = {
	    .status = st ? parse(st) : NULL,
	    .clients = cl ? parse(cl) : NULL,
	    .seqs = sq ? parse(sq) : NULL,
	};
	char *out = run_text(&in, 0);

	json_object_put(in.status);
	json_object_put(in.clients);
	json_object_put(in.seqs);
	return out;
}

/*
 * Check the exposition format rules a scraper relies on: every sample's family was announced
 * by "# HELP" then "# TYPE" just before its first sample, each family is announced once and its
 * samples are contiguous, counters end in _total, and every sample line is NAME[{...}] VALUE.
 * Returns the number of samples.
 */
static unsigned int
check_exposition(char *text)
{
	char fams[128][64], cur[64] = "", help[64] = "";
	unsigned int nfams = 0, samples = 0, i;
	bool hist = false;
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
			ck_assert_uint_lt(nfams, 128);
			strcpy(fams[nfams++], name);
			strcpy(cur, name);
			n = strlen(name);
			if (!strcmp(type, "counter"))
				ck_assert_str_eq(name + n - 6, "_total");
			else if (strcmp(type, "histogram"))
				ck_assert_str_eq(type, "gauge");
			hist = !strcmp(type, "histogram");
			help[0] = '\0';
			continue;
		}
		ck_assert_msg(line[0] != '#', "stray comment %s", line);
		n = strcspn(line, "{ ");
		ck_assert_msg(n >= strlen(cur) && !strncmp(line, cur, strlen(cur)),
			      "sample '%s' outside its family '%s'", line, cur);
		if (hist)
			ck_assert_msg(!strncmp(line + strlen(cur), "_bucket{", 8) ||
					  !strncmp(line + strlen(cur), "_sum", n - strlen(cur)) ||
					  !strncmp(line + strlen(cur), "_count", n - strlen(cur)),
				      "histogram sample '%s'", line);
		else
			ck_assert_msg(n == strlen(cur), "sample '%s' outside its family '%s'", line,
				      cur);
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
			  "{\"seqs\":[{\"session\":4,\"tokens\":9},{\"seq\":1,\"tokens\":2}]}");
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

START_TEST(test_not_objects)
{
	struct json_object *arr = parse("[1,2]"), *doc = NULL;
	struct kvtd_prom_input a = {.status = arr}, b = {.clients = arr}, c = {.seqs = arr};

	free(run_text(&a, -EINVAL));
	free(run_text(&b, -EINVAL));
	free(run_text(&c, -EINVAL));
	ck_assert_int_eq(kvtd_prom_json(&a, &doc), -EINVAL);
	ck_assert_ptr_null(doc);
	json_object_put(arr);
}
END_TEST

START_TEST(test_lat_bucket)
{
	ck_assert_uint_eq(kvtd_lat_bucket(0), 0);
	ck_assert_uint_eq(kvtd_lat_bucket(1000), 0); /* 1 us: le 1e-06 */
	ck_assert_uint_eq(kvtd_lat_bucket(1001), 1); /* just over: le 2e-06 */
	ck_assert_uint_eq(kvtd_lat_bucket(2000), 1);
	ck_assert_uint_eq(kvtd_lat_bucket(3000), 2);	 /* le 4e-06 */
	ck_assert_uint_eq(kvtd_lat_bucket(1000000), 10); /* 1 ms: le 1.024e-3 */
	ck_assert_uint_eq(kvtd_lat_bucket((1ull << (KVTD_LAT_BUCKETS - 1)) * 1000),
			  KVTD_LAT_BUCKETS - 1);
	ck_assert_uint_eq(kvtd_lat_bucket((1ull << (KVTD_LAT_BUCKETS - 1)) * 1000 + 1000),
			  KVTD_LAT_BUCKETS);
	ck_assert_uint_eq(kvtd_lat_bucket(UINT64_MAX), KVTD_LAT_BUCKETS);
}
END_TEST

static void
timed_op(struct kvtd_op_stats *st, unsigned opcode, int res, uint64_t ns)
{
	kvtd_op_stats_add(st, opcode, res);
	kvtd_op_stats_time(st, opcode, ns);
}

/* Two clients, one name shared by two sessions; ops of three kinds, one APPEND not timed. */
static void
snap_fill(struct kvtd_prom_snap *sn, struct kvtd_prom_client *cl)
{
	struct kvtd_op_stats a = {0}, b = {0};

	memset(sn, 0, sizeof(*sn));
	timed_op(&a, KVT_OP_APPEND, 0, 500);		    /* le 1e-06 */
	timed_op(&a, KVT_OP_APPEND, 0, 3000);		    /* le 4e-06 */
	kvtd_op_stats_add(&a, KVT_OP_APPEND, 0);	    /* counted, not timed */
	timed_op(&a, KVT_OP_TOPK, -EINVAL, 2000000);	    /* le 0.002048 */
	timed_op(&b, KVT_OP_RETIER, 0, 20ull * 1000000000); /* past the last bucket */
	timed_op(&b, 200, -EINVAL, 100);		    /* not an opcode */
	a.bytes_in[KVT_OP_APPEND] = 4096;
	b.bytes_out[KVT_OP_FETCH] = 512;
	kvtd_op_stats_fold(&sn->ops, &a);
	kvtd_op_stats_fold(&sn->ops, &b);
	memset(cl, 0, 2 * sizeof(*cl));
	snprintf(cl[0].name, sizeof(cl[0].name), "vllm");
	cl[0].sessions = 2;
	cl[0].ops = 7;
	cl[0].sq_backlog = 3;
	cl[0].bytes_in = 4096;
	snprintf(cl[1].name, sizeof(cl[1].name), "a\"b\\c\nd");
	cl[1].sessions = 1;
	cl[1].cq_backlog = 5;
	sn->clients = cl;
	sn->n_clients = 2;
	sn->proc.valid = true;
	sn->proc.cpu_seconds = 1.5;
	sn->proc.rss_bytes = 1 << 20;
	sn->proc.open_fds = 9;
	sn->proc.max_fds = 1024;
	sn->proc.start_time_seconds = 1700000000;
}

START_TEST(test_metrics_snapshot)
{
	struct kvtd_prom_client cl[2];
	struct kvtd_prom_snap sn;
	struct kvtd_prom_input in = {.snap = &sn};
	static const char *const want[] = {
	    "# TYPE kvtier_op_total counter\n",
	    "kvtier_op_total{op=\"nop\"} 0\n",	  /* every opcode, traffic or not */
	    "kvtier_op_total{op=\"append\"} 3\n", /* every op counted, */
	    "kvtier_op_total{op=\"seq_stat\"} 0\n",
	    "kvtier_op_total{op=\"unknown\"} 1\n",
	    "kvtier_op_errors_total{op=\"topk\"} 1\n",
	    "# TYPE kvtier_op_duration_seconds histogram\n",
	    "kvtier_op_duration_seconds_bucket{op=\"append\",le=\"1e-06\"} 1\n",
	    "kvtier_op_duration_seconds_bucket{op=\"append\",le=\"2e-06\"} 1\n",
	    "kvtier_op_duration_seconds_bucket{op=\"append\",le=\"4e-06\"} 2\n",
	    "kvtier_op_duration_seconds_bucket{op=\"append\",le=\"+Inf\"} 2\n",
	    "kvtier_op_duration_seconds_sum{op=\"append\"} 3.5e-06\n",
	    "kvtier_op_duration_seconds_count{op=\"append\"} 2\n", /* the timed ones */
	    "kvtier_op_duration_seconds_bucket{op=\"topk\",le=\"0.001024\"} 0\n",
	    "kvtier_op_duration_seconds_bucket{op=\"topk\",le=\"0.002048\"} 1\n",
	    "kvtier_op_duration_seconds_bucket{op=\"retier\",le=\"8.388608\"} 0\n",
	    "kvtier_op_duration_seconds_bucket{op=\"retier\",le=\"+Inf\"} 1\n",
	    "kvtier_op_duration_seconds_sum{op=\"retier\"} 20\n",
	    "kvtier_pool_bytes_total{op=\"append\",direction=\"in\"} 4096\n",
	    "kvtier_pool_bytes_total{op=\"fetch\",direction=\"out\"} 512\n",
	    "kvtier_pool_bytes_total{op=\"retier\",direction=\"out\"} 0\n",
	    "kvtier_client_sessions{client=\"vllm\"} 2\n",
	    "kvtier_client_sessions{client=\"a\\\"b\\\\c\\nd\"} 1\n",
	    "kvtier_client_ops_total{client=\"vllm\"} 7\n",
	    "kvtier_client_sq_backlog{client=\"vllm\"} 3\n",
	    "kvtier_client_cq_backlog{client=\"a\\\"b\\\\c\\nd\"} 5\n",
	    "kvtier_client_pool_bytes_total{client=\"vllm\",direction=\"in\"} 4096\n",
	    "process_cpu_seconds_total 1.5\n",
	    "process_resident_memory_bytes 1048576\n",
	    "process_open_fds 9\n",
	    "process_max_fds 1024\n",
	    "process_start_time_seconds 1700000000\n",
	};
	char *out;
	unsigned i;

	snap_fill(&sn, cl);
	out = run_text(&in, 0);
	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_assert_msg(strstr(out, want[i]), "missing: %s", want[i]);
	/* no per-session family without the documents that carry them */
	ck_assert_ptr_null(strstr(out, "kvtier_session_"));
	ck_assert_ptr_null(strstr(out, "kvtier_seq_"));
	/* every opcode and "unknown" x (op, errors, 24 + 1 buckets, sum, count) + every opcode x 2
	 * bytes + 4 tier flows; 2 clients x 7 + 2 x 2 bytes; 6 process */
	ck_assert_uint_eq(check_exposition(out),
			  (KVT_OP__COUNT + 1) * 29 + KVT_OP__COUNT * 2 + 4 + 2 * 7 + 4 + 6);
	free(out);
}
END_TEST

START_TEST(test_metrics_proc)
{
	struct kvtd_prom_proc p;

	kvtd_prom_proc(&p);
	ck_assert(p.valid);
	ck_assert_uint_gt(p.rss_bytes, 0);
	ck_assert_uint_ge(p.vsz_bytes, p.rss_bytes);
	ck_assert_uint_ge(p.open_fds, 3); /* stdin, stdout, stderr */
	ck_assert_uint_ge(p.max_fds, p.open_fds);
	ck_assert(p.start_time_seconds > 1e9);
	ck_assert(p.cpu_seconds >= 0);
}
END_TEST

/* Count the samples of the JSON document, checking each family's shape. */
static unsigned
json_samples(struct json_object *doc)
{
	struct json_object *fams, *v;
	unsigned n = 0;
	size_t i, j;

	ck_assert(json_object_object_get_ex(doc, "schema", &v));
	ck_assert_int_eq(json_object_get_int(v), KVT_CTL_SCHEMA);
	ck_assert(json_object_object_get_ex(doc, "metrics", &fams));
	for (i = 0; i < json_object_array_length(fams); i++) {
		struct json_object *f = json_object_array_get_idx(fams, i), *s;

		ck_assert(json_object_object_get_ex(f, "name", &v));
		ck_assert(json_object_object_get_ex(f, "type", &v));
		ck_assert(json_object_object_get_ex(f, "help", &v));
		ck_assert(json_object_object_get_ex(f, "samples", &s));
		ck_assert_uint_gt(json_object_array_length(s), 0);
		for (j = 0; j < json_object_array_length(s); j++) {
			struct json_object *e = json_object_array_get_idx(s, j);

			ck_assert(json_object_object_get_ex(e, "labels", &v));
			ck_assert(json_object_is_type(v, json_type_object));
			ck_assert(json_object_object_get_ex(e, "value", &v));
			ck_assert(json_object_is_type(v, json_type_int) ||
				  json_object_is_type(v, json_type_double));
			n++;
		}
	}
	return n;
}

START_TEST(test_metrics_json)
{
	struct kvtd_prom_client cl[2];
	struct kvtd_prom_snap sn;
	struct kvtd_prom_input in = {.snap = &sn};
	struct json_object *doc = NULL, *fams, *f, *s, *e, *v;
	char *out;

	snap_fill(&sn, cl);
	in.status = parse(status_json);
	in.clients = parse(clients_json);
	in.seqs = parse(seqs_json);
	out = run_text(&in, 0);
	ck_assert_int_eq(kvtd_prom_json(&in, &doc), 0);
	/* the same samples as the text */
	ck_assert_uint_eq(json_samples(doc), check_exposition(out));
	free(out);
	/* a labelled sample, and a histogram's suffix */
	ck_assert(json_object_object_get_ex(doc, "metrics", &fams));
	for (size_t i = 0; i < json_object_array_length(fams); i++) {
		f = json_object_array_get_idx(fams, i);
		json_object_object_get_ex(f, "name", &v);
		if (strcmp(json_object_get_string(v), "kvtier_op_duration_seconds"))
			continue;
		json_object_object_get_ex(f, "type", &v);
		ck_assert_str_eq(json_object_get_string(v), "histogram");
		json_object_object_get_ex(f, "samples", &s);
		e = json_object_array_get_idx(s, 0);
		ck_assert(json_object_object_get_ex(e, "suffix", &v));
		ck_assert_str_eq(json_object_get_string(v), "_bucket");
		ck_assert(json_object_object_get_ex(e, "labels", &v));
		ck_assert(json_object_object_get_ex(v, "op", &v));
		ck_assert_str_eq(json_object_get_string(v), "nop");
	}
	json_object_put(doc);
	json_object_put(in.status);
	json_object_put(in.clients);
	json_object_put(in.seqs);
}
END_TEST

START_TEST(test_metrics_prefix)
{
	struct kvtd_prom_input in = {.blocks = parse(blocks_json)};
	static const char *const want[] = {
	    "# TYPE kvtier_prefix_blocks gauge\n",
	    "kvtier_prefix_blocks 48\n",
	    "# TYPE kvtier_prefix_referenced_blocks gauge\n",
	    "kvtier_prefix_referenced_blocks 40\n",
	    "kvtier_prefix_bytes 50331648\n",
	    "kvtier_prefix_budget_bytes 1073741824\n",
	    "# TYPE kvtier_prefix_lookups_total counter\n",
	    "kvtier_prefix_lookups_total 10\n",
	    "kvtier_prefix_hits_total 30\n",
	    "kvtier_prefix_misses_total 10\n",
	    "kvtier_prefix_published_total 50\n",
	    "kvtier_prefix_deduped_total 4\n",
	    "kvtier_prefix_evicted_total 2\n",
	    "# TYPE kvtier_prefix_refused_total counter\n",
	    "kvtier_prefix_refused_total 1\n",
	};
	struct json_object *doc = NULL;
	char *out = run_text(&in, 0);

	for (unsigned i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_assert_msg(strstr(out, want[i]), "missing: %s", want[i]);
	/* one store, no labels: a namespace's name never becomes a label */
	ck_assert_ptr_null(strstr(out, "secret-model"));
	ck_assert_uint_eq(check_exposition(out), 11);
	ck_assert_int_eq(kvtd_prom_json(&in, &doc), 0);
	ck_assert_uint_eq(json_samples(doc), 11);
	json_object_put(doc);
	free(out);
	json_object_put(in.blocks);

	/* a key the daemon left out leaves its family out; a document that is no object fails */
	in.blocks = parse("{\"blocks\":3}");
	out = run_text(&in, 0);
	ck_assert_uint_eq(check_exposition(out), 1);
	ck_assert_ptr_null(strstr(out, "kvtier_prefix_hits_total"));
	free(out);
	json_object_put(in.blocks);
	in.blocks = parse("[1]");
	free(run_text(&in, -EINVAL));
	json_object_put(in.blocks);
}
END_TEST

/* STATUS with a spill store: its families, with values no daemon can reach through the wire yet
 * (nothing spills), and a path that needs escaping. */
static const char spill_status_json[] =
    "{\"ops\":1,\"spill\":{\"path\":\"/srv/spill \\\"a\\\"\",\"kind\":\"block device\","
    "\"size\":68719476736,\"used\":62277025792,\"free\":6442450944,\"largest_free\":1073741824,"
    "\"extents\":1500,\"queue_depth\":64,\"in_flight\":3,\"uid_share\":34359738368,"
    "\"uids\":[{\"uid\":1000,\"bytes\":34359738368},{\"uid\":0,\"bytes\":27917287424},"
    "{\"bytes\":5},{\"uid\":7}],"
    "\"io\":{\"reads\":40,\"writes\":50,\"read_bytes\":163840,\"write_bytes\":204800,"
    "\"read_errors\":2,\"write_errors\":4},"
    "\"errors\":{\"eio\":3,\"enospc\":1,\"short\":2,\"other\":0},"
    "\"refused\":{\"nospc\":6,\"quota\":7},\"dropped\":{\"extents\":8,\"bytes\":32768}}}";

START_TEST(test_metrics_spill)
{
	struct kvtd_prom_input in = {.status = parse(spill_status_json)};
	static const char *const want[] = {
	    "# TYPE kvtier_spill_info gauge\n",
	    "kvtier_spill_info{path=\"/srv/spill \\\"a\\\"\",kind=\"block device\"} 1\n",
	    "# TYPE kvtier_spill_size_bytes gauge\nkvtier_spill_size_bytes 68719476736\n",
	    "# TYPE kvtier_spill_used_bytes gauge\nkvtier_spill_used_bytes 62277025792\n",
	    "kvtier_spill_free_bytes 6442450944\n",
	    "kvtier_spill_largest_free_bytes 1073741824\n",
	    "# TYPE kvtier_spill_extents gauge\nkvtier_spill_extents 1500\n",
	    "kvtier_spill_in_flight 3\n",
	    "kvtier_spill_queue_depth 64\n",
	    "kvtier_spill_uid_share_bytes 34359738368\n",
	    "# TYPE kvtier_spill_reads_total counter\nkvtier_spill_reads_total 40\n",
	    "kvtier_spill_writes_total 50\n",
	    "# TYPE kvtier_spill_read_bytes_total counter\nkvtier_spill_read_bytes_total 163840\n",
	    "kvtier_spill_write_bytes_total 204800\n",
	    "# TYPE kvtier_spill_errors_total counter\n",
	    "kvtier_spill_errors_total{kind=\"eio\"} 3\n",
	    "kvtier_spill_errors_total{kind=\"enospc\"} 1\n",
	    "kvtier_spill_errors_total{kind=\"short\"} 2\n",
	    "kvtier_spill_errors_total{kind=\"other\"} 0\n",
	    "kvtier_spill_refused_total{reason=\"nospc\"} 6\n",
	    "kvtier_spill_refused_total{reason=\"quota\"} 7\n",
	    "# TYPE kvtier_spill_dropped_extents_total counter\n",
	    "kvtier_spill_dropped_extents_total 8\n",
	    "kvtier_spill_dropped_bytes_total 32768\n",
	    "# TYPE kvtier_spill_uid_bytes gauge\n",
	    "kvtier_spill_uid_bytes{uid=\"1000\"} 34359738368\n",
	    "kvtier_spill_uid_bytes{uid=\"0\"} 27917287424\n",
	};
	struct json_object *doc = NULL;
	char *out = run_text(&in, 0);

	for (unsigned i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_assert_msg(strstr(out, want[i]), "missing: %s", want[i]);
	/* a uid row without a uid or without bytes has no sample */
	ck_assert_ptr_null(strstr(out, "kvtier_spill_uid_bytes{uid=\"7\"}"));
	ck_assert_ptr_null(strstr(out, "} 5\n"));
	/* ops + info + 14 scalars + 4 errors + 2 refused + 2 uids */
	ck_assert_uint_eq(check_exposition(out), 1 + 1 + 14 + 4 + 2 + 2);
	free(out);
	ck_assert_int_eq(kvtd_prom_json(&in, &doc), 0);
	ck_assert_uint_eq(json_samples(doc), 1 + 1 + 14 + 4 + 2 + 2);
	json_object_put(doc);
	json_object_put(in.status);

	/* no store (no "spill", or not an object): no spill family, not even its HELP */
	for (unsigned i = 0; i < 2; i++) {
		in.status = parse(i ? "{\"ops\":1,\"spill\":[1]}" : status_json);
		out = run_text(&in, 0);
		ck_assert_ptr_null(strstr(out, "kvtier_spill_"));
		free(out);
		json_object_put(in.status);
	}
	/* a store's keys the daemon left out leave only their own families out */
	in.status = parse("{\"spill\":{\"size\":4096,\"errors\":{\"eio\":2}}}");
	out = run_text(&in, 0);
	ck_assert_ptr_nonnull(strstr(out, "kvtier_spill_size_bytes 4096\n"));
	ck_assert_ptr_nonnull(strstr(out, "kvtier_spill_errors_total{kind=\"eio\"} 2\n"));
	ck_assert_ptr_null(strstr(out, "kvtier_spill_info"));
	ck_assert_ptr_null(strstr(out, "kvtier_spill_used_bytes"));
	ck_assert_uint_eq(check_exposition(out), 2);
	free(out);
	json_object_put(in.status);
}
END_TEST

static Suite *
prom_suite(void)
{
	Suite *s = suite_create("prom");
	TCase *tc = tcase_create("prom");

	tcase_add_test(tc, test_not_objects);
	tcase_add_test(tc, test_lat_bucket);
	tcase_add_test(tc, test_metrics_full);
	tcase_add_test(tc, test_metrics_partial);
	tcase_add_test(tc, test_metrics_snapshot);
	tcase_add_test(tc, test_metrics_proc);
	tcase_add_test(tc, test_metrics_json);
	tcase_add_test(tc, test_metrics_prefix);
	tcase_add_test(tc, test_metrics_spill);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	return kvt_check_run(prom_suite());
}
