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
#include "kvt_ctl.h"
#include "kvt_json_text.h"

#define CELL_MAX 72 /* a session name is at most 31 bytes, a namespace's 63 (KVT_NS_NAME_LEN) */

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

	if (!as_num(kvt_json_get(o, "hit_blocks"), &hit) ||
	    !as_num(kvt_json_get(o, "miss_blocks"), &miss) || !(hit + miss > 0))
		return false;
	*ret = hit / (hit + miss);
	return true;
}

static void
render_cell(char *buf, const struct col *c, struct json_object *row)
{
	struct json_object *v = kvt_json_get(row, c->key);
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
		    kvt_json_num_text(kvt_json_get(row, "uid"), uid, sizeof(uid))) {
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
	arr = kvt_json_get(doc, key);
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

/* A column of kvt_ctl.h's tables (KVT_CTL_*_COLS), the one description of them. */
#define COL_ROW(head_, key_, kind_, idx_) {head_, key_, COL_##kind_, idx_},

int
kvtctl_fmt_clients(FILE *out, struct json_object *doc)
{
	static const struct col cols[] = {KVT_CTL_CLIENTS_COLS(COL_ROW)};

	return print_table(out, doc, "clients", cols, sizeof(cols) / sizeof(cols[0]),
			   "no clients connected");
}

int
kvtctl_fmt_seqs(FILE *out, struct json_object *doc)
{
	static const struct col cols[] = {KVT_CTL_SEQS_COLS(COL_ROW)};

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

	if (!kvt_json_num_text(kvt_json_get(doc, "blocks"), blocks, sizeof(blocks)))
		snprintf(blocks, sizeof(blocks), "-");
	if (!kvt_json_num_text(kvt_json_get(doc, "referenced"), ref, sizeof(ref)))
		snprintf(ref, sizeof(ref), "-");
	if (as_num(kvt_json_get(doc, "bytes"), &d))
		kvtctl_fmt_bytes(used, sizeof(used), d);
	else
		snprintf(used, sizeof(used), "-");
	if (!as_num(kvt_json_get(doc, "budget_bytes"), &d)) {
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
		if (!kvt_json_num_text(kvt_json_get(doc, keys[i]), num, sizeof(num)))
			snprintf(num, sizeof(num), "-");
		fprintf(out, "%s%s %s", i ? ", " : "\n       ", i == 3 ? "refused" : keys[i], num);
	}
	fputc('\n', out);
	return finish(out);
}

int
kvtctl_fmt_blocks(FILE *out, struct json_object *doc)
{
	static const struct col cols[] = {KVT_CTL_BLOCKS_COLS(COL_ROW)};
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

/* A STATUS line's kind (KVT_CTL_STATUS_LINES in kvt_ctl.h). */
enum line_kind {
	LINE_STR,
	LINE_NUM,
	LINE_BYTES,
	LINE_SECS,
	LINE_OPTSTR,
	LINE_ABI,
	LINE_USED,
	LINE_CHUNKS,
	LINE_PAGES,
	LINE_NUMA,
	LINE_YESNO,
	LINE_COUNTERS,
	LINE_TIERS,
	LINE_UIDS,
};

struct status_line {
	const char *label;
	const char *path; /* "pool.size": keys of nested objects */
	enum line_kind kind;
};

/*
 * The value at @path ("a.b") in @o, or NULL; *@ret_parent: the object holding it. *@ret_absent:
 * a segment marked optional ("a?.b") is not an object in @o (the line is left out).
 */
static struct json_object *
get_path(struct json_object *o, const char *path, struct json_object **ret_parent, bool *ret_absent)
{
	char key[64];
	const char *dot;

	*ret_absent = false;
	while ((dot = strchr(path, '.'))) {
		size_t n = (size_t)(dot - path);
		bool opt = n && path[n - 1] == '?';

		snprintf(key, sizeof(key), "%.*s", (int)(n - opt), path);
		o = kvt_json_get(o, key);
		if (opt && !json_object_is_type(o, json_type_object))
			*ret_absent = true;
		path = dot + 1;
	}
	*ret_parent = o;
	return kvt_json_get(o, path);
}

/* "uid N BYTES, ...; share BYTES" of an array of {"uid", "bytes"} and @parent's "uid_share". */
static void
kv_uids(FILE *out, const char *key, struct json_object *arr, struct json_object *parent)
{
	char line[512], num[64], b[32];
	size_t i, n, off = 0;
	double d;

	if (!json_object_is_type(arr, json_type_array)) {
		kv_line(out, key, "-");
		return;
	}
	line[0] = '\0';
	n = json_object_array_length(arr);
	for (i = 0; i < n; i++) {
		struct json_object *u = json_object_array_get_idx(arr, i);

		if (!kvt_json_num_text(kvt_json_get(u, "uid"), num, sizeof(num)))
			snprintf(num, sizeof(num), "-");
		if (as_num(kvt_json_get(u, "bytes"), &d))
			kvtctl_fmt_bytes(b, sizeof(b), d);
		else
			snprintf(b, sizeof(b), "-");
		append(line, sizeof(line), &off, "%suid %s %s", off ? ", " : "", num, b);
	}
	if (!n)
		append(line, sizeof(line), &off, "none");
	if (!as_num(kvt_json_get(parent, "uid_share"), &d)) {
		snprintf(b, sizeof(b), "-");
	} else if (d > 0) {
		kvtctl_fmt_bytes(b, sizeof(b), d);
	} else {
		append(line, sizeof(line), &off, "; no share");
		kv_line(out, key, line);
		return;
	}
	append(line, sizeof(line), &off, "; share %s", b);
	kv_line(out, key, line);
}

static void
status_line(FILE *out, const struct status_line *l, struct json_object *st)
{
	bool absent;
	struct json_object *parent, *v = get_path(st, l->path, &parent, &absent);
	char buf[128], b1[32], b2[32];
	double a, b;

	if (absent) /* an optional section the daemon did not send */
		return;
	switch (l->kind) {
	case LINE_OPTSTR:
		if (!v) /* only when the daemon has it */
			return;
		/* fall through */
	case LINE_STR:
		kv_str(out, l->label, v);
		return;
	case LINE_NUM:
		kv_num(out, l->label, v);
		return;
	case LINE_BYTES:
		kv_bytes(out, l->label, v);
		return;
	case LINE_SECS:
		if (as_num(v, &a))
			kvtctl_fmt_duration(buf, sizeof(buf), a);
		else
			snprintf(buf, sizeof(buf), "-");
		break;
	case LINE_ABI:
		if (as_num(kvt_json_get(v, "major"), &a) && as_num(kvt_json_get(v, "minor"), &b))
			snprintf(buf, sizeof(buf), "%.0f.%.0f", a, b);
		else
			snprintf(buf, sizeof(buf), "-");
		break;
	case LINE_USED:
		if (!as_num(v, &a)) {
			snprintf(buf, sizeof(buf), "-");
			break;
		}
		kvtctl_fmt_bytes(b1, sizeof(b1), a);
		if (as_num(kvt_json_get(parent, "size"), &b) && b > 0)
			snprintf(buf, sizeof(buf), "%s (%.1f%%)", b1, 100 * a / b);
		else
			snprintf(buf, sizeof(buf), "%s", b1);
		break;
	case LINE_CHUNKS:
		if (!kvt_json_num_text(kvt_json_get(v, "chunks_free"), b1, sizeof(b1)))
			snprintf(b1, sizeof(b1), "-");
		if (as_num(kvt_json_get(v, "chunk_size"), &a))
			kvtctl_fmt_bytes(b2, sizeof(b2), a);
		else
			snprintf(b2, sizeof(b2), "-");
		snprintf(buf, sizeof(buf), "%s free, %s each", b1, b2);
		break;
	case LINE_PAGES:
		if (!as_num(v, &a))
			return;
		/* What the backing costs: on 4 KiB pages a random row gather misses the TLB. */
		snprintf(buf, sizeof(buf), "%.0f KiB%s", a,
			 a <= 4
			     ? " (no huge pages: row gathers miss the TLB; kvtierd.conf(5) hugetlb)"
			     : "");
		break;
	case LINE_NUMA:
		if (as_num(v, &a) && a < 0)
			kv_line(out, l->label, "any");
		else
			kv_num(out, l->label, v);
		return;
	case LINE_YESNO:
		kv_line(out, l->label,
			json_object_is_type(v, json_type_boolean)
			    ? (json_object_get_boolean(v) ? "yes" : "no")
			    : "-");
		return;
	case LINE_COUNTERS:
		kv_counters(out, l->label, v);
		return;
	case LINE_TIERS:
		kv_tiers(out, l->label, v);
		return;
	case LINE_UIDS:
		kv_uids(out, l->label, v, parent);
		return;
	}
	kv_line(out, l->label, buf);
}

#define STATUS_ROW(label_, path_, kind_) {label_, path_, LINE_##kind_},

int
kvtctl_fmt_status(FILE *out, struct json_object *st)
{
	static const struct status_line lines[] = {KVT_CTL_STATUS_LINES(STATUS_ROW)};

	if (!json_object_is_type(st, json_type_object))
		return -EINVAL;
	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
		status_line(out, &lines[i], st);
	return finish(out);
}
