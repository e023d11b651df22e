/* SPDX-License-Identifier: MIT */
/*
 * ctl_fmt.c - daemon JSON documents to tables (see ctl_fmt.h).
 *
 * The documents come from the daemon, and part of them from its clients (a session's name is
 * whatever the client put in HELLO), so strings are treated as untrusted: control characters are
 * replaced before they reach a terminal.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_fmt.h"
#include "kvt_json_text.h"

#define CELL_MAX 72 /* a session name is at most 31 bytes, a namespace's 63 (KVT_NS_NAME_LEN) */

static struct json_object *
get(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!o || !json_object_is_type(o, json_type_object))
		return NULL;
	if (!json_object_object_get_ex(o, key, &v))
		return NULL;
	return v;
}

/* A JSON number (or boolean) as a double; false for anything else, null included. */
static bool
as_num(struct json_object *v, double *ret)
{
	switch (json_object_get_type(v)) {
	case json_type_int:
	case json_type_double:
		*ret = json_object_get_double(v);
		return true;
	case json_type_boolean:
		*ret = json_object_get_boolean(v) ? 1 : 0;
		return true;
	default:
		return false;
	}
}

/* Copy @s into @buf, replacing control characters so a client cannot drive the terminal. */
static void
safe_copy(char *buf, size_t len, const char *s)
{
	size_t i;

	if (!len)
		return;
	for (i = 0; s[i] && i + 1 < len; i++)
		buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
	buf[i] = '\0';
}

void
kvtctl_fmt_bytes(char *buf, size_t len, double bytes)
{
	static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
	unsigned int u = 0;

	if (bytes < 1024) {
		snprintf(buf, len, "%.0f B", bytes);
		return;
	}
	bytes /= 1024;
	while (bytes >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		bytes /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f %s", bytes, units[u]);
}

void
kvtctl_fmt_duration(char *buf, size_t len, double s)
{
	uint64_t t;

	if (!(s >= 0)) {
		snprintf(buf, len, "-");
		return;
	}
	if (s < 60) {
		snprintf(buf, len, "%.1fs", s);
		return;
	}
	t = (uint64_t)s;
	if (t < 3600)
		snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", t / 60, t % 60);
	else if (t < 86400)
		snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", t / 3600, t % 3600 / 60);
	else
		snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", t / 86400, t % 86400 / 3600);
}

/* snprintf at *@off into @buf, never past its end: output that does not fit is cut. */
static void __attribute__((format(printf, 4, 5)))
append(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*off + 1 >= len)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *off, len - *off, fmt, ap);
	va_end(ap);
	if (n > 0)
		*off = *off + (size_t)n < len ? *off + (size_t)n : len - 1;
}

static int
finish(FILE *out)
{
	if (fflush(out) || ferror(out))
		return -EIO;
	return 0;
}

/* ---- tables ---- */

enum col_kind {
	COL_INT,   /* integer, right-aligned */
	COL_STR,   /* string, left-aligned */
	COL_BYTES, /* byte count, human units */
	COL_SECS,  /* seconds, human duration */
	COL_PCT,   /* ratio 0..1 shown as a percentage */
	COL_TIER,  /* element @idx of the row's "tiers" array */
	COL_SCOPE, /* a namespace's "scope": "uid N" or "shared" */
	COL_MIB,   /* byte count in MiB, one decimal */
	COL_HITS,  /* "hit_blocks" / ("hit_blocks" + "miss_blocks") as a percentage */
};

struct col {
	const char *head;
	const char *key;
	enum col_kind kind;
	unsigned int idx;
};

/* Found blocks over blocks looked up; false before any lookup (no rate to show). */
static bool
hit_rate(struct json_object *o, double *ret)
{
	double hit, miss;

	if (!as_num(get(o, "hit_blocks"), &hit) || !as_num(get(o, "miss_blocks"), &miss) ||
	    !(hit + miss > 0))
		return false;
	*ret = hit / (hit + miss);
	return true;
}

static void
render_cell(char *buf, const struct col *c, struct json_object *row)
{
	struct json_object *v = get(row, c->key);
	const char *s;
	double d;

	if (c->kind == COL_TIER) {
		v = json_object_is_type(v, json_type_array) && c->idx < json_object_array_length(v)
			? json_object_array_get_idx(v, c->idx)
			: NULL;
	}
	switch (c->kind) {
	case COL_SCOPE: {
		char uid[32];

		s = kvt_json_str(v);
		if (s && !strcmp(s, "uid") &&
		    kvt_json_num_text(get(row, "uid"), uid, sizeof(uid))) {
			snprintf(buf, CELL_MAX, "uid %s", uid);
			return;
		}
		if (s) {
			safe_copy(buf, CELL_MAX, s);
			return;
		}
		break;
	}
	case COL_MIB:
		if (as_num(v, &d)) {
			snprintf(buf, CELL_MAX, "%.1f", d / (1 << 20));
			return;
		}
		break;
	case COL_HITS:
		if (hit_rate(row, &d)) {
			snprintf(buf, CELL_MAX, "%.1f%%", d * 100);
			return;
		}
		break;
	case COL_STR:
		s = kvt_json_str(v);
		if (s) {
			safe_copy(buf, CELL_MAX, s);
			return;
		}
		break;
	case COL_INT:
	case COL_TIER:
		if (json_object_is_type(v, json_type_double) && as_num(v, &d)) {
			snprintf(buf, CELL_MAX, "%.0f", d);
			return;
		}
		if (kvt_json_num_text(v, buf, CELL_MAX))
			return;
		break;
	case COL_BYTES:
		if (as_num(v, &d)) {
			kvtctl_fmt_bytes(buf, CELL_MAX, d);
			return;
		}
		break;
	case COL_SECS:
		if (as_num(v, &d)) {
			kvtctl_fmt_duration(buf, CELL_MAX, d);
			return;
		}
		break;
	case COL_PCT:
		if (as_num(v, &d)) {
			snprintf(buf, CELL_MAX, "%.1f%%", d * 100);
			return;
		}
		break;
	}
	snprintf(buf, CELL_MAX, "-");
}

static void
print_row(FILE *out, const struct col *cols, size_t ncols, const size_t *width,
	  char (*cells)[CELL_MAX])
{
	size_t c;

	for (c = 0; c < ncols; c++) {
		bool last = c + 1 == ncols;

		bool text = cols[c].kind == COL_STR || cols[c].kind == COL_SCOPE;

		if (text && last)
			fprintf(out, "%s", cells[c]);
		else if (text)
			fprintf(out, "%-*s", (int)width[c], cells[c]);
		else
			fprintf(out, "%*s", (int)width[c], cells[c]);
		fputs(last ? "\n" : "  ", out);
	}
}

/*
 * Print the array @key of @doc as a table with a header row. Numeric columns are right-aligned
 * under right-aligned headers, strings left-aligned; widths fit the widest cell.
 */
static int
print_table(FILE *out, struct json_object *doc, const char *key, const struct col *cols,
	    size_t ncols, const char *none)
{
	struct json_object *arr;
	char(*cells)[CELL_MAX];
	size_t width[16], n, r, c;

	if (!json_object_is_type(doc, json_type_object) || ncols > 16)
		return -EINVAL;
	arr = get(doc, key);
	if (arr && !json_object_is_type(arr, json_type_array))
		return -EINVAL;
	n = arr ? json_object_array_length(arr) : 0;
	if (!n) {
		fprintf(out, "%s\n", none);
		return finish(out);
	}

	cells = calloc((n + 1) * ncols, sizeof(*cells));
	if (!cells)
		return -ENOMEM;
	for (c = 0; c < ncols; c++) {
		snprintf(cells[c], CELL_MAX, "%s", cols[c].head);
		width[c] = strlen(cols[c].head);
	}
	for (r = 0; r < n; r++) {
		struct json_object *row = json_object_array_get_idx(arr, r);

		for (c = 0; c < ncols; c++) {
			char *cell = cells[(r + 1) * ncols + c];

			render_cell(cell, &cols[c], row);
			if (strlen(cell) > width[c])
				width[c] = strlen(cell);
		}
	}
	for (r = 0; r <= n; r++)
		print_row(out, cols, ncols, width, &cells[r * ncols]);
	free(cells);
	return finish(out);
}

int
kvtctl_fmt_clients(FILE *out, struct json_object *doc)
{
	static const struct col cols[] = {
	    {"SESSION", "session", COL_INT, 0},	 {"PID", "pid", COL_INT, 0},
	    {"UID", "uid", COL_INT, 0},		 {"GID", "gid", COL_INT, 0},
	    {"SEQS", "seqs", COL_INT, 0},	 {"POOL", "pool_bytes", COL_BYTES, 0},
	    {"OPS", "ops", COL_INT, 0},		 {"ERRORS", "errors", COL_INT, 0},
	    {"SQ", "sq_entries", COL_INT, 0},	 {"ARENA", "arena_size", COL_BYTES, 0},
	    {"UPTIME", "uptime_s", COL_SECS, 0}, {"NAME", "name", COL_STR, 0},
	};

	return print_table(out, doc, "clients", cols, sizeof(cols) / sizeof(cols[0]),
			   "no clients connected");
}

int
kvtctl_fmt_seqs(FILE *out, struct json_object *doc)
{
	static const struct col cols[] = {
	    {"SESSION", "session", COL_INT, 0},	  {"SEQ", "seq", COL_INT, 0},
	    {"TOKENS", "tokens", COL_INT, 0},	  {"LAYERS", "layers", COL_INT, 0},
	    {"HEADS", "kv_heads", COL_INT, 0},	  {"DIM", "head_dim", COL_INT, 0},
	    {"DTYPE", "dtype", COL_STR, 0},	  {"POLICY", "policy", COL_STR, 0},
	    {"T2KEYS", "t2_keys", COL_STR, 0},	  {"T0", "tiers", COL_TIER, 0},
	    {"T1", "tiers", COL_TIER, 1},	  {"T2", "tiers", COL_TIER, 2},
	    {"T3", "tiers", COL_TIER, 3},	  {"EVICTED", "evicted_ratio", COL_PCT, 0},
	    {"POOL", "pool_bytes", COL_BYTES, 0},
	};

	return print_table(out, doc, "seqs", cols, sizeof(cols) / sizeof(cols[0]),
			   "no open sequences");
}

/* The store's totals under the table: one line, "-" for what the daemon left out. */
static int
blocks_totals(FILE *out, struct json_object *doc)
{
	static const char *const keys[] = {"published", "deduped", "evicted", "refused_budget"};
	char blocks[32], ref[32], used[32], budget[48], num[32], rate[32];
	double d;

	if (!kvt_json_num_text(get(doc, "blocks"), blocks, sizeof(blocks)))
		snprintf(blocks, sizeof(blocks), "-");
	if (!kvt_json_num_text(get(doc, "referenced"), ref, sizeof(ref)))
		snprintf(ref, sizeof(ref), "-");
	if (as_num(get(doc, "bytes"), &d))
		kvtctl_fmt_bytes(used, sizeof(used), d);
	else
		snprintf(used, sizeof(used), "-");
	if (!as_num(get(doc, "budget_bytes"), &d)) {
		snprintf(budget, sizeof(budget), " of - budget");
	} else if (d > 0) {
		kvtctl_fmt_bytes(num, sizeof(num), d);
		snprintf(budget, sizeof(budget), " of %s budget", num);
	} else {
		snprintf(budget, sizeof(budget), ", budget 0 (sharing off)");
	}
	if (hit_rate(doc, &d))
		snprintf(rate, sizeof(rate), "%.1f%%", d * 100);
	else
		snprintf(rate, sizeof(rate), "-");
	fprintf(out, "total  %s blocks (%s referenced), %s%s, hit rate %s", blocks, ref, used,
		budget, rate);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (!kvt_json_num_text(get(doc, keys[i]), num, sizeof(num)))
			snprintf(num, sizeof(num), "-");
		fprintf(out, "%s%s %s", i ? ", " : "\n       ", i == 3 ? "refused" : keys[i], num);
	}
	fputc('\n', out);
	return finish(out);
}

int
kvtctl_fmt_blocks(FILE *out, struct json_object *doc)
{
	static const struct col cols[] = {
	    {"ID", "id", COL_INT, 0},
	    {"NAME", "name", COL_STR, 0},
	    {"SCOPE", "scope", COL_SCOPE, 0},
	    {"BLOCKS", "blocks", COL_INT, 0},
	    {"REF", "referenced", COL_INT, 0},
	    {"MiB", "bytes", COL_MIB, 0},
	    {"HITRATE", "hit_blocks", COL_HITS, 0},
	    {"PUBLISHED", "published", COL_INT, 0},
	    {"EVICTED", "evicted", COL_INT, 0},
	};
	int r = print_table(out, doc, "namespaces", cols, sizeof(cols) / sizeof(cols[0]),
			    "no prefix namespaces");

	return r < 0 ? r : blocks_totals(out, doc);
}

/* ---- status ---- */

#define KEY_WIDTH 14

static void
kv_line(FILE *out, const char *key, const char *value)
{
	fprintf(out, "%-*s %s\n", KEY_WIDTH, key, value);
}

static void
kv_num(FILE *out, const char *key, struct json_object *v)
{
	char buf[64];

	kv_line(out, key, kvt_json_num_text(v, buf, sizeof(buf)) ? buf : "-");
}

static void
kv_str(FILE *out, const char *key, struct json_object *v)
{
	char buf[128];

	if (kvt_json_str(v)) {
		safe_copy(buf, sizeof(buf), kvt_json_str(v));
		kv_line(out, key, buf);
	} else {
		kv_line(out, key, "-");
	}
}

static void
kv_bytes(FILE *out, const char *key, struct json_object *v)
{
	char buf[64];
	double d;

	if (as_num(v, &d))
		kvtctl_fmt_bytes(buf, sizeof(buf), d);
	else
		snprintf(buf, sizeof(buf), "-");
	kv_line(out, key, buf);
}

/* "key1 N, key2 N, ..." for an object of counters, in the daemon's order. */
static void
kv_counters(FILE *out, const char *key, struct json_object *obj)
{
	char line[512], num[64], name[48];
	size_t off = 0;

	line[0] = '\0';
	if (json_object_is_type(obj, json_type_object)) {
		json_object_object_foreach(obj, k, v)
		{
			safe_copy(name, sizeof(name), k);
			if (!kvt_json_num_text(v, num, sizeof(num)))
				snprintf(num, sizeof(num), "-");
			append(line, sizeof(line), &off, "%s%s %s", off ? ", " : "", name, num);
		}
	}
	kv_line(out, key, line[0] ? line : "-");
}

static void
kv_tiers(FILE *out, const char *key, struct json_object *arr)
{
	char line[256], num[64];
	size_t i, n, off = 0;

	line[0] = '\0';
	n = json_object_is_type(arr, json_type_array) ? json_object_array_length(arr) : 0;
	for (i = 0; i < n && i < 8; i++) {
		if (!kvt_json_num_text(json_object_array_get_idx(arr, i), num, sizeof(num)))
			snprintf(num, sizeof(num), "-");
		append(line, sizeof(line), &off, "%sT%zu %s", off ? "  " : "", i, num);
	}
	kv_line(out, key, line[0] ? line : "-");
}

int
kvtctl_fmt_status(FILE *out, struct json_object *st)
{
	struct json_object *abi, *pool, *v;
	char buf[128], b1[32], b2[32];
	double a, b;

	if (!json_object_is_type(st, json_type_object))
		return -EINVAL;
	abi = get(st, "abi");
	pool = get(st, "pool");

	kv_str(out, "version", get(st, "version"));
	if (as_num(get(abi, "major"), &a) && as_num(get(abi, "minor"), &b))
		snprintf(buf, sizeof(buf), "%.0f.%.0f", a, b);
	else
		snprintf(buf, sizeof(buf), "-");
	kv_line(out, "abi", buf);
	kv_str(out, "backend", get(st, "backend"));
	if (get(st, "metrics_url")) /* only when the daemon serves it */
		kv_str(out, "metrics", get(st, "metrics_url"));
	kv_num(out, "pid", get(st, "pid"));
	if (as_num(get(st, "uptime_s"), &a))
		kvtctl_fmt_duration(buf, sizeof(buf), a);
	else
		snprintf(buf, sizeof(buf), "-");
	kv_line(out, "uptime", buf);
	kv_num(out, "pollers", get(st, "pollers"));

	kv_bytes(out, "pool size", get(pool, "size"));
	if (as_num(get(pool, "used"), &a)) {
		kvtctl_fmt_bytes(b1, sizeof(b1), a);
		if (as_num(get(pool, "size"), &b) && b > 0)
			snprintf(buf, sizeof(buf), "%s (%.1f%%)", b1, 100 * a / b);
		else
			snprintf(buf, sizeof(buf), "%s", b1);
		kv_line(out, "pool used", buf);
	} else {
		kv_line(out, "pool used", "-");
	}
	kv_bytes(out, "pool free", get(pool, "free"));
	if (!kvt_json_num_text(get(pool, "chunks_free"), b1, sizeof(b1)))
		snprintf(b1, sizeof(b1), "-");
	if (as_num(get(pool, "chunk_size"), &a))
		kvtctl_fmt_bytes(b2, sizeof(b2), a);
	else
		snprintf(b2, sizeof(b2), "-");
	snprintf(buf, sizeof(buf), "%s free, %s each", b1, b2);
	kv_line(out, "pool chunks", buf);
	kv_num(out, "pool classes", get(pool, "classes"));
	kv_str(out, "pool backing", get(pool, "backing"));
	if (as_num(get(pool, "page_kib"), &a)) {
		/* What the backing costs: on 4 KiB pages a random row gather misses the TLB. */
		snprintf(buf, sizeof(buf), "%.0f KiB%s", a,
			 a <= 4
			     ? " (no huge pages: row gathers miss the TLB; kvtierd.conf(5) hugetlb)"
			     : "");
		kv_line(out, "pool pages", buf);
	}
	v = get(pool, "numa_node");
	if (as_num(v, &a) && a < 0)
		kv_line(out, "pool numa", "any");
	else
		kv_num(out, "pool numa", v);
	v = get(pool, "locked");
	kv_line(out, "pool locked",
		json_object_is_type(v, json_type_boolean)
		    ? (json_object_get_boolean(v) ? "yes" : "no")
		    : "-");

	kv_num(out, "sessions", get(st, "sessions"));
	kv_num(out, "seqs", get(st, "seqs"));
	kv_num(out, "ops", get(st, "ops"));
	kv_num(out, "errors", get(st, "errors"));
	kv_counters(out, "refused", get(st, "refused"));
	kv_tiers(out, "tiers", get(st, "tiers"));
	return finish(out);
}
