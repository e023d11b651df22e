/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench-ring - what a round trip and a queue operation cost, kvtier's ring next to the
 * peers it replaces (run as "kvtier-bench ring"). A benchmark, never a test: it reports numbers
 * and asserts nothing about them.
 *
 * Rows run in table order, one at a time. To add a measurement, write
 *	int bench_<name>(const struct bench_opts *o, struct bench_result *ret);
 * (bench_latency()/bench_throughput() do the timing), and add a row below with its JSON key
 * prefix and the fields it fills.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "bench.h"
#include "kvt_cli.h"

struct bench_row {
	const char *key;     /* JSON key prefix, and the name --only takes */
	const char *label;   /* table label */
	unsigned int fields; /* BENCH_F_* it reports */
	int (*run)(const struct bench_opts *o, struct bench_result *ret);
	bool (*enabled)(const struct bench_opts *o); /* NULL: always */
};

static const struct bench_row rows[] = {
    {"clock", "clock_gettime pair (timer floor)", BENCH_F_P50 | BENCH_F_P99, bench_clock, NULL},
    {"pingpong", "shm cache-line ping-pong, 2 procs", BENCH_F_P50 | BENCH_F_P99, bench_pingpong,
     NULL},
    {"socket", "unix socketpair echo 8-64 B, 2 procs", BENCH_F_P50 | BENCH_F_P99, bench_socket,
     NULL},
    {"eventfd", "eventfd ping-pong, 2 procs", BENCH_F_P50 | BENCH_F_P99, bench_eventfd, NULL},
    {"uring_batch32", "io_uring NOP, batch 32", BENCH_F_OPS, bench_uring_batch32, NULL},
    {"spin", "kvtier NOP round trip, spin mode", BENCH_F_P50 | BENCH_F_P99, bench_kvtier_spin,
     NULL},
    {"sleep", "kvtier NOP round trip, sleep mode", BENCH_F_P50 | BENCH_F_P99, bench_kvtier_sleep,
     NULL},
    {"batch32", "kvtier NOP, batch 32, spin mode", BENCH_F_OPS, bench_kvtier_batch32, NULL},
    {"idle", "idle kvtierd CPU (or --cpu-pid)", BENCH_F_CPU, bench_kvtier_idle, NULL},
    {"neighbor", "kvtier NOP behind 16 queued FETCHes", BENCH_F_P50 | BENCH_F_P99,
     bench_kvtier_neighbor, NULL},
    {"neighbor_noslice", "the same, poller_slice_us = 0", BENCH_F_P50 | BENCH_F_P99,
     bench_kvtier_neighbor_noslice, NULL},
};
#define NROWS (sizeof(rows) / sizeof(rows[0]))

struct outcome {
	bool ran;
	int err;
	struct bench_result res;
};

/* Is @key in the comma-separated @list (NULL: every key is)? */
static bool
selected(const char *list, const char *key)
{
	size_t n = strlen(key);
	const char *p;

	if (!list)
		return true;
	for (p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (!strncmp(p, key, n) && (p[n] == ',' || p[n] == '\0'))
			return true;
	return false;
}

static void
cell(char *buf, size_t len, bool want, double v, const char *fmt)
{
	if (want && !isnan(v))
		snprintf(buf, len, fmt, v);
	else
		snprintf(buf, len, "-");
}

static int
row_index(const char *key)
{
	for (unsigned int i = 0; i < NROWS; i++)
		if (!strcmp(rows[i].key, key))
			return (int)i;
	return -1;
}

static double
row_value(const struct outcome *out, const char *key, unsigned int field)
{
	int i = row_index(key);

	if (i < 0 || !out[i].ran || out[i].err < 0)
		return NAN;
	return field == BENCH_F_P50 ? out[i].res.p50_ns : out[i].res.ops_per_s;
}

/* The targets, as ratios within this run. */
struct ratio {
	const char *name;
	const char *target;
	double value;
};
#define NRATIOS 4

static void
ratios(const struct outcome *out, struct ratio *rt)
{
	rt[0] = (struct ratio){"spin_vs_pingpong", "<= 1.25",
			       row_value(out, "spin", BENCH_F_P50) /
				   row_value(out, "pingpong", BENCH_F_P50)};
	rt[1] = (struct ratio){"sleep_vs_socket", "<= 0.75",
			       row_value(out, "sleep", BENCH_F_P50) /
				   row_value(out, "socket", BENCH_F_P50)};
	rt[2] = (struct ratio){"batch32_vs_uring", ">= 3",
			       row_value(out, "batch32", BENCH_F_OPS) /
				   row_value(out, "uring_batch32", BENCH_F_OPS)};
	rt[3] = (struct ratio){"neighbor_vs_noslice", "< 1",
			       row_value(out, "neighbor", BENCH_F_P50) /
				   row_value(out, "neighbor_noslice", BENCH_F_P50)};
}

static void
print_table(const struct bench_opts *o, const struct outcome *out)
{
	char a[32], b[32], c[32], d[32];
	unsigned int i;

	printf("kvtier-bench ring: %u reps x %u iterations (+%u warm-up), medians over reps\n\n",
	       o->reps, o->iters, o->warmup);
	printf("%-16s %-38s %10s %10s %14s %8s\n", "key", "measurement", "p50 ns", "p99 ns",
	       "ops/s", "cpu %");
	for (i = 0; i < NROWS; i++) {
		const struct bench_row *r = &rows[i];

		if (!out[i].ran)
			continue;
		if (out[i].err < 0) {
			printf("%-16s %-38s failed: %s\n", r->key, r->label, strerror(-out[i].err));
			continue;
		}
		cell(a, sizeof(a), r->fields & BENCH_F_P50, out[i].res.p50_ns, "%.0f");
		cell(b, sizeof(b), r->fields & BENCH_F_P99, out[i].res.p99_ns, "%.0f");
		cell(c, sizeof(c), r->fields & BENCH_F_OPS, out[i].res.ops_per_s, "%.0f");
		cell(d, sizeof(d), r->fields & BENCH_F_CPU, out[i].res.cpu_pct, "%.2f");
		printf("%-16s %-38s %10s %10s %14s %8s\n", r->key, r->label, a, b, c, d);
	}
	{
		struct ratio rt[NRATIOS];

		ratios(out, rt);
		printf("\n");
		for (i = 0; i < NRATIOS; i++)
			if (!isnan(rt[i].value))
				printf("%-18s %6.2f   (target %s)\n", rt[i].name, rt[i].value,
				       rt[i].target);
	}
}

static void
json_field(struct json_object *obj, const char *key, const char *suffix, bool want, double v,
	   bool integer)
{
	char name[64];

	if (!want)
		return;
	snprintf(name, sizeof(name), "%s_%s", key, suffix);
	if (isnan(v))
		json_object_object_add(obj, name, NULL);
	else if (integer)
		json_object_object_add(obj, name, json_object_new_int64(llround(v)));
	else {
		char text[32];

		/* two decimals are all a tick-based CPU figure carries */
		snprintf(text, sizeof(text), "%.2f", v);
		json_object_object_add(obj, name, json_object_new_double_s(v, text));
	}
}

/*
 * One object: the run's parameters, then "<key>_p50_ns", "<key>_p99_ns" (integers),
 * "<key>_ops_per_s" (integer), "<key>_cpu_pct" (number) for the rows that ran; a failed row's
 * fields are null and its error is in "errors": {"<key>": "message"}.
 */
static int
print_json(const struct bench_opts *o, const struct outcome *out)
{
	struct json_object *obj = json_object_new_object(), *errs = NULL;
	unsigned int i;

	if (!obj)
		return -ENOMEM;
	json_object_object_add(obj, "bench", json_object_new_string("ring"));
	json_object_object_add(obj, "iters", json_object_new_int64(o->iters));
	json_object_object_add(obj, "reps", json_object_new_int64(o->reps));
	json_object_object_add(obj, "warmup", json_object_new_int64(o->warmup));
	for (i = 0; i < NROWS; i++) {
		const struct bench_row *r = &rows[i];
		struct bench_result res = out[i].res;

		if (!out[i].ran)
			continue;
		if (out[i].err < 0) {
			res.p50_ns = res.p99_ns = res.ops_per_s = res.cpu_pct = NAN;
			if (!errs)
				errs = json_object_new_object();
			json_object_object_add(errs, r->key,
					       json_object_new_string(strerror(-out[i].err)));
		}
		json_field(obj, r->key, "p50_ns", r->fields & BENCH_F_P50, res.p50_ns, true);
		json_field(obj, r->key, "p99_ns", r->fields & BENCH_F_P99, res.p99_ns, true);
		json_field(obj, r->key, "ops_per_s", r->fields & BENCH_F_OPS, res.ops_per_s, true);
		json_field(obj, r->key, "cpu_pct", r->fields & BENCH_F_CPU, res.cpu_pct, false);
	}
	if (errs)
		json_object_object_add(obj, "errors", errs);
	{
		struct ratio rt[NRATIOS];

		ratios(out, rt);
		for (i = 0; i < NRATIOS; i++)
			if (!isnan(rt[i].value))
				json_object_object_add(obj, rt[i].name,
						       json_object_new_double(rt[i].value));
	}
	puts(
	    json_object_to_json_string_ext(obj, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED));
	json_object_put(obj);
	return 0;
}

/* The tool's options: the measurements' and the run's own. */
struct ring_opts {
	struct bench_opts b;
	const char *only;
	int json;
};

/* --cpu-interval: seconds, more than 0 and at most an hour. */
static int
opt_interval(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	struct ring_opts *ro = o;
	char *end;
	double v;

	errno = 0;
	v = strtod(arg, &end);
	if (errno || end == arg || *end || !(v > 0) || v > 3600) {
		fprintf(stderr, "%s: --%s wants seconds in (0, 3600], got '%s'\n", cli->prog,
			d->name, arg);
		return -EINVAL;
	}
	ro->b.cpu_interval_s = v;
	return 0;
}

#define OFF(m) offsetof(struct ring_opts, m)
#define N_MAX  100000000

_Static_assert(sizeof(unsigned int) == sizeof(uint32_t) && sizeof(pid_t) == sizeof(uint32_t),
	       "kvt_cli_u32() sets the iteration counts and the pid");

static const struct kvt_cli_opt ring_opts[] = {
    {"iters", 0, "N", "timed operations per repetition (default 50000)",
     .heading = "Options:", .apply = kvt_cli_u32, .off = OFF(b.iters), .min = 1, .max = N_MAX},
    {"reps", 0, "N", "repetitions (default 5)", .apply = kvt_cli_u32, .off = OFF(b.reps), .min = 1,
     .max = N_MAX},
    {"warmup", 0, "N", "untimed operations first (default 5000)", .apply = kvt_cli_u32,
     .off = OFF(b.warmup), .max = N_MAX},
    {"only", 0, "KEY[,KEY]", "run only these rows", .apply = kvt_cli_str, .off = OFF(only)},
    {"cpu-pid", 0, "PID", "add the idle row: CPU use of PID (e.g. kvtierd)", .apply = kvt_cli_u32,
     .off = OFF(b.cpu_pid), .min = 1, .max = N_MAX},
    {"cpu-interval", 0, "S", "seconds to watch it (default 5)", .apply = opt_interval},
    {"json", 0, NULL, "print one JSON object instead of the table", .apply = kvt_cli_flag,
     .off = OFF(json)},
    {"help", 'h', NULL, "this text", .apply = kvt_cli_help},
    {NULL},
};

int
main(int argc, char **argv)
{
	static char rows_text[NROWS * 64 + 16];
	struct kvt_cli cli = {
	    .prog = "kvtier-bench ring",
	    .intro = "usage: kvtier-bench ring [OPTIONS]\n"
		     "\n"
		     "Round-trip latency (p50/p99 ns) and queue throughput (ops/s) of kvtier's "
		     "peers:\n"
		     "shared-memory ping-pong, Unix socket echo, eventfd ping-pong, io_uring "
		     "NOPs.\n"
		     "Each number is the median over --reps repetitions.\n",
	    .outro = rows_text,
	    .opts = ring_opts,
	};
	struct ring_opts ro = {
	    .b = {.iters = 50000, .reps = 5, .warmup = 5000, .cpu_interval_s = 5}};
	const struct bench_opts *o = &ro.b;
	struct outcome out[NROWS];
	const char *only;
	bool failed = false;
	unsigned int i;
	size_t at;

	/* the rows --only takes, below the options */
	at = (size_t)snprintf(rows_text, sizeof(rows_text), "Rows:\n");
	for (i = 0; i < NROWS && at < sizeof(rows_text); i++)
		at += (size_t)snprintf(rows_text + at, sizeof(rows_text) - at, "  %-14s %s\n",
				       rows[i].key, rows[i].label);
	if (kvt_cli_parse(&cli, argc, argv, &ro, NULL) < 0) {
		fprintf(stderr, "Try 'kvtier-bench ring --help'.\n");
		return 2;
	}
	if (optind != argc) {
		fprintf(stderr, "kvtier-bench ring: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	only = ro.only;
	if (only) {
		for (i = 0; i < NROWS; i++)
			if (selected(only, rows[i].key))
				break;
		if (i == NROWS) {
			fprintf(stderr, "kvtier-bench ring: --only matches no row\n");
			return 2;
		}
	}

	for (i = 0; i < NROWS; i++) {
		out[i].ran =
		    selected(only, rows[i].key) && (!rows[i].enabled || rows[i].enabled(o));
		out[i].err = 0;
		out[i].res = (struct bench_result){NAN, NAN, NAN, NAN};
		if (!out[i].ran)
			continue;
		if (!ro.json)
			fprintf(stderr, "running %s...\n", rows[i].key);
		out[i].err = rows[i].run(o, &out[i].res);
		failed |= out[i].err < 0;
	}
	if (ro.json)
		print_json(o, out);
	else
		print_table(o, out);
	return failed ? 1 : 0;
}
