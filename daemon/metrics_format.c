/* SPDX-License-Identifier: MIT */
/*
 * metrics_format.c - metrics as Prometheus text and as JSON (see metrics_format.h).
 *
 * Part of the documents comes from clients (a session's name is whatever the client put in
 * HELLO), so label values are escaped, and a name is only ever a label value, never part of a
 * metric name.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kvt_ctl.h"
#include "kvt_json_text.h"
#include "kvt_ring.h"
#include "kvtd.h"
#include "metrics_format.h"
#include "ops.h"
#include "poller.h"
#include "session.h"
#include "stats.h"

/* ---- reading the documents ---- */

static bool
is_num(struct json_object *v)
{
	return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double) ||
	       json_object_is_type(v, json_type_boolean);
}

/* ---- the two outputs ---- */

struct sink {
	FILE *out;		 /* text, or NULL */
	struct json_object *arr; /* JSON families, or NULL */
	int err;
};

struct label {
	const char *name;
	const char *value; /* NULL: label left out */
};

struct fam {
	struct sink *k;
	const char *name;
	const char *type; /* "counter", "gauge" or "histogram" */
	const char *help;
	struct json_object *samples; /* JSON: this family's, once started */
};

#define FAM(k_, n, t, h)                                                                           \
	{                                                                                          \
		.k = (k_), .name = (n), .type = (t), .help = (h), .samples = NULL                  \
	}

static void
escape_label(FILE *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\')
			fputs("\\\\", out);
		else if (*s == '"')
			fputs("\\\"", out);
		else if (*s == '\n')
			fputs("\\n", out);
		else
			fputc(*s, out);
	}
}

static void
start(struct fam *f)
{
	struct json_object *o;

	if (f->k->out) {
		fprintf(f->k->out, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name,
			f->type);
		f->samples = (struct json_object *)f; /* started; never dereferenced */
		return;
	}
	o = json_object_new_object();
	f->samples = json_object_new_array();
	json_object_object_add(o, "name", json_object_new_string(f->name));
	json_object_object_add(o, "type", json_object_new_string(f->type));
	json_object_object_add(o, "help", json_object_new_string(f->help));
	json_object_object_add(o, "samples", f->samples);
	json_object_array_add(f->k->arr, o);
}

/*
 * One sample of value @v (borrowed), @suffix after the family name (histograms), or NULL. The
 * family's HELP and TYPE go out before its first sample, so a family the daemon has nothing for
 * does not appear, and no family is split (callers emit one family at a time, as the format
 * requires all samples of a family to be contiguous).
 */
static void
sample_v(struct fam *f, const char *suffix, const struct label *l, size_t nl, struct json_object *v)
{
	char buf[64];
	bool first = true;
	size_t i;

	if (!kvt_json_num_text(v, buf, sizeof(buf)))
		return;
	if (!f->samples)
		start(f);
	if (f->k->out) {
		FILE *out = f->k->out;

		fprintf(out, "%s%s", f->name, suffix ? suffix : "");
		for (i = 0; i < nl; i++) {
			if (!l[i].value)
				continue;
			fprintf(out, "%s%s=\"", first ? "{" : ",", l[i].name);
			escape_label(out, l[i].value);
			fputc('"', out);
			first = false;
		}
		if (!first)
			fputc('}', out);
		fprintf(out, " %s\n", buf);
	} else {
		struct json_object *s = json_object_new_object(), *lo = json_object_new_object();

		for (i = 0; i < nl; i++)
			if (l[i].value)
				json_object_object_add(lo, l[i].name,
						       json_object_new_string(l[i].value));
		json_object_object_add(s, "labels", lo);
		if (suffix)
			json_object_object_add(s, "suffix", json_object_new_string(suffix));
		/* a boolean is a 0/1 gauge in the text; the same number here */
		json_object_object_add(s, "value",
				       json_object_is_type(v, json_type_boolean)
					   ? json_object_new_int(json_object_get_boolean(v))
					   : json_object_get(v));
		json_object_array_add(f->samples, s);
	}
}

static void
sample_u64(struct fam *f, const char *suffix, const struct label *l, size_t nl, uint64_t x)
{
	struct json_object *v = json_object_new_uint64(x);

	sample_v(f, suffix, l, nl, v);
	json_object_put(v);
}

static void
sample_dbl(struct fam *f, const char *suffix, const struct label *l, size_t nl, double x)
{
	struct json_object *v = json_object_new_double(x);

	sample_v(f, suffix, l, nl, v);
	json_object_put(v);
}

/* ---- from the STATUS document ---- */

struct scalar {
	const char *name;
	const char *type;
	const char *help;
	const char *key;
	const char *subkey; /* NULL: top level */
};

static const struct scalar status_scalars[] = {
    {"kvtier_uptime_seconds", "gauge", "Seconds since kvtierd started.", "uptime_s", NULL},
    {"kvtier_restarts_total", "counter", "Restarts in place since kvtierd first started.",
     "restarts", NULL},
    {"kvtier_pollers", "gauge", "Poller threads draining session rings.", "pollers", NULL},
    {"kvtier_pool_size_bytes", "gauge", "Bytes in the pinned DDR pool.", "pool", "size"},
    {"kvtier_pool_used_bytes", "gauge", "Pool bytes holding slots.", "pool", "used"},
    {"kvtier_pool_free_bytes", "gauge", "Pool bytes free.", "pool", "free"},
    {"kvtier_pool_chunk_size_bytes", "gauge", "Bytes per pool chunk.", "pool", "chunk_size"},
    {"kvtier_pool_chunks_free", "gauge", "Pool chunks not serving any slot class.", "pool",
     "chunks_free"},
    {"kvtier_pool_classes", "gauge", "Slot size classes in use.", "pool", "classes"},
    {"kvtier_pool_numa_node", "gauge", "NUMA node the pool is bound to, -1 for none.", "pool",
     "numa_node"},
    {"kvtier_pool_locked", "gauge", "1 when the pool is pinned in RAM.", "pool", "locked"},
    {"kvtier_sessions", "gauge", "Connected sessions.", "sessions", NULL},
    {"kvtier_seqs", "gauge", "Open sequences.", "seqs", NULL},
    {"kvtier_ops_total", "counter", "Ops completed.", "ops", NULL},
    {"kvtier_errors_total", "counter", "Ops completed with an error.", "errors", NULL},
};

static void
fams_status(struct sink *k, struct json_object *st)
{
	struct json_object *abi = kvt_json_get(st, "abi"), *refused, *tiers;
	char abibuf[48];
	size_t i;

	{
		struct fam f =
		    FAM(k, "kvtier_build_info", "gauge",
			"Constant 1, labelled with the daemon's version, ABI and backend.");
		struct label l[] = {
		    {"version", kvt_json_str(kvt_json_get(st, "version"))},
		    {"abi", NULL},
		    {"backend", kvt_json_str(kvt_json_get(st, "backend"))},
		};

		if (is_num(kvt_json_get(abi, "major")) && is_num(kvt_json_get(abi, "minor"))) {
			snprintf(abibuf, sizeof(abibuf), "%.0f.%.0f",
				 json_object_get_double(kvt_json_get(abi, "major")),
				 json_object_get_double(kvt_json_get(abi, "minor")));
			l[1].value = abibuf;
		}
		if (l[0].value || l[1].value || l[2].value)
			sample_u64(&f, NULL, l, 3, 1);
	}
	for (i = 0; i < sizeof(status_scalars) / sizeof(status_scalars[0]); i++) {
		const struct scalar *s = &status_scalars[i];
		struct fam f = FAM(k, s->name, s->type, s->help);
		struct json_object *v = kvt_json_get(st, s->key);

		sample_v(&f, NULL, NULL, 0, s->subkey ? kvt_json_get(v, s->subkey) : v);
	}
	{
		struct fam f = FAM(k, "kvtier_pool_info", "gauge",
				   "Constant 1, labelled with the pool's backing memory.");
		struct label l = {"backing",
				  kvt_json_str(kvt_json_get(kvt_json_get(st, "pool"), "backing"))};

		if (l.value)
			sample_u64(&f, NULL, &l, 1, 1);
	}

	refused = kvt_json_get(st, "refused");
	if (json_object_is_type(refused, json_type_object)) {
		struct fam f =
		    FAM(k, "kvtier_refused_total", "counter", "Requests refused, by reason.");

		json_object_object_foreach(refused, key, v)
		{
			struct label l = {"reason", key};

			sample_v(&f, NULL, &l, 1, v);
		}
	}

	tiers = kvt_json_get(st, "tiers");
	if (json_object_is_type(tiers, json_type_array)) {
		struct fam f = FAM(k, "kvtier_tier_tokens", "gauge",
				   "Tokens per tier over all sequences (t3 = evicted).");

		for (i = 0; i < json_object_array_length(tiers); i++) {
			char t[24];
			struct label l = {"tier", t};

			snprintf(t, sizeof(t), "t%zu", i);
			sample_v(&f, NULL, &l, 1, json_object_array_get_idx(tiers, i));
		}
	}
}

/* ---- from STATUS's "spill": the spill store, when [spill] is configured ---- */

static const struct scalar spill_scalars[] = {
    {"kvtier_spill_size_bytes", "gauge", "Bytes in the spill store.", "size", NULL},
    {"kvtier_spill_used_bytes", "gauge", "Spill store bytes held by extents.", "used", NULL},
    {"kvtier_spill_free_bytes", "gauge", "Spill store bytes free.", "free", NULL},
    {"kvtier_spill_largest_free_bytes", "gauge",
     "Bytes of the largest extent the spill store can allocate now.", "largest_free", NULL},
    {"kvtier_spill_extents", "gauge", "Extents held in the spill store.", "extents", NULL},
    {"kvtier_spill_in_flight", "gauge", "Spill store reads and writes in flight.", "in_flight",
     NULL},
    {"kvtier_spill_queue_depth", "gauge",
     "Spill store requests that may be in flight ([spill] queue_depth).", "queue_depth", NULL},
    {"kvtier_spill_uid_share_bytes", "gauge",
     "Spill store bytes one uid may hold ([spill] uid_share); 0: no limit.", "uid_share", NULL},
    {"kvtier_spill_reads_total", "counter", "Spill store reads completed without error.", "io",
     "reads"},
    {"kvtier_spill_writes_total", "counter", "Spill store writes completed without error.", "io",
     "writes"},
    {"kvtier_spill_read_bytes_total", "counter", "Bytes of spill store reads completed.", "io",
     "read_bytes"},
    {"kvtier_spill_write_bytes_total", "counter", "Bytes of spill store writes completed.", "io",
     "write_bytes"},
    {"kvtier_spill_dropped_extents_total", "counter",
     "Spill store extents dropped, least important first, to make room (their data is lost: "
     "T3).",
     "dropped", "extents"},
    {"kvtier_spill_dropped_bytes_total", "counter", "Bytes of the spill store extents dropped.",
     "dropped", "bytes"},
};

/* The samples of @obj's members as one family labelled @label, in the document's order. */
static void
fam_by_key(struct sink *k, const char *name, const char *type, const char *help, const char *label,
	   struct json_object *obj)
{
	struct fam f = FAM(k, name, type, help);

	if (!json_object_is_type(obj, json_type_object))
		return;
	json_object_object_foreach(obj, key, v)
	{
		struct label l = {label, key};

		sample_v(&f, NULL, &l, 1, v);
	}
}

static void
fams_spill(struct sink *k, struct json_object *sp)
{
	struct json_object *uids = kvt_json_get(sp, "uids");

	if (!json_object_is_type(sp, json_type_object))
		return;
	{
		struct fam f = FAM(k, "kvtier_spill_info", "gauge",
				   "Constant 1, labelled with the spill store's path and kind.");
		struct label l[] = {{"path", kvt_json_str(kvt_json_get(sp, "path"))},
				    {"kind", kvt_json_str(kvt_json_get(sp, "kind"))}};

		if (l[0].value || l[1].value)
			sample_u64(&f, NULL, l, 2, 1);
	}
	for (size_t i = 0; i < sizeof(spill_scalars) / sizeof(spill_scalars[0]); i++) {
		const struct scalar *s = &spill_scalars[i];
		struct fam f = FAM(k, s->name, s->type, s->help);
		struct json_object *v = kvt_json_get(sp, s->key);

		sample_v(&f, NULL, NULL, 0, s->subkey ? kvt_json_get(v, s->subkey) : v);
	}
	fam_by_key(k, "kvtier_spill_errors_total", "counter",
		   "Spill store reads and writes failed, by cause: eio (the device's I/O error), "
		   "enospc, short (a transfer shorter than asked), other.",
		   "kind", kvt_json_get(sp, "errors"));
	fam_by_key(k, "kvtier_spill_refused_total", "counter",
		   "Spill store allocations refused: nospc (no room left), quota (past the uid's "
		   "share).",
		   "reason", kvt_json_get(sp, "refused"));
	if (json_object_is_type(uids, json_type_array)) {
		struct fam f = FAM(k, "kvtier_spill_uid_bytes", "gauge",
				   "Spill store bytes a uid holds (the uids holding the most).");

		for (size_t i = 0; i < json_object_array_length(uids); i++) {
			struct json_object *u = json_object_array_get_idx(uids, i);
			char id[32];
			struct label l = {"uid", id};

			if (kvt_json_num_text(kvt_json_get(u, "uid"), id, sizeof(id)))
				sample_v(&f, NULL, &l, 1, kvt_json_get(u, "bytes"));
		}
	}
}

/* ---- from the BLOCKS document: the prefix store's totals (no label: one store) ---- */

static const struct scalar prefix_scalars[] = {
    {"kvtier_prefix_blocks", "gauge", "Prefix blocks held, referenced or cached.", "blocks", NULL},
    {"kvtier_prefix_referenced_blocks", "gauge",
     "Prefix blocks a sequence or a LOOKUP pin references (never evicted).", "referenced", NULL},
    {"kvtier_prefix_bytes", "gauge", "Pool bytes prefix blocks hold.", "bytes", NULL},
    {"kvtier_prefix_budget_bytes", "gauge",
     "Pool bytes prefix blocks may hold ([prefix] cache_bytes; 0: no sharing).", "budget_bytes",
     NULL},
    {"kvtier_prefix_lookups_total", "counter", "LOOKUPs of prefix blocks.", "lookups", NULL},
    {"kvtier_prefix_hits_total", "counter", "Blocks LOOKUPs found (leading blocks held).",
     "hit_blocks", NULL},
    {"kvtier_prefix_misses_total", "counter", "Block keys LOOKUPs did not find.", "miss_blocks",
     NULL},
    {"kvtier_prefix_published_total", "counter", "Blocks PUBLISH added to a namespace.",
     "published", NULL},
    {"kvtier_prefix_deduped_total", "counter",
     "Blocks PUBLISH offered that the namespace already held (the sequence's rows freed).",
     "deduped", NULL},
    {"kvtier_prefix_evicted_total", "counter",
     "Unreferenced prefix blocks evicted for pool room or budget.", "evicted", NULL},
    {"kvtier_prefix_refused_total", "counter",
     "PUBLISHes refused because the budget was full of referenced blocks.", "refused_budget", NULL},
};

static void
fams_prefix(struct sink *k, struct json_object *blocks)
{
	for (size_t i = 0; i < sizeof(prefix_scalars) / sizeof(prefix_scalars[0]); i++) {
		const struct scalar *s = &prefix_scalars[i];
		struct fam f = FAM(k, s->name, s->type, s->help);

		sample_v(&f, NULL, NULL, 0, kvt_json_get(blocks, s->key));
	}
}

/* ---- per session and per sequence (KVT_CTL_METRICS_F_SESSIONS) ---- */

struct per {
	const char *name;
	const char *type;
	const char *help;
	const char *key;
};

static const struct per session_fams[] = {
    {"kvtier_session_seqs", "gauge", "Open sequences of the session.", "seqs"},
    {"kvtier_session_pool_bytes", "gauge", "Pool bytes charged to the session.", "pool_bytes"},
    {"kvtier_session_ops_total", "counter", "Ops of the session completed.", "ops"},
    {"kvtier_session_errors_total", "counter", "Ops of the session completed with an error.",
     "errors"},
    {"kvtier_session_sq_entries", "gauge", "Submission queue entries of the session.",
     "sq_entries"},
    {"kvtier_session_arena_bytes", "gauge", "Arena bytes of the session.", "arena_size"},
    {"kvtier_session_uptime_seconds", "gauge", "Seconds since the session connected.", "uptime_s"},
};

static const struct per seq_fams[] = {
    {"kvtier_seq_tokens", "gauge", "Tokens appended to the sequence.", "tokens"},
    {"kvtier_seq_evicted_ratio", "gauge", "Fraction of the sequence's tokens evicted (T3).",
     "evicted_ratio"},
    {"kvtier_seq_pool_bytes", "gauge", "Pool bytes held by the sequence.", "pool_bytes"},
};

/* Integer id of @row under @key as label text; false when absent (the row is then skipped). */
static bool
id_text(struct json_object *row, const char *key, char *buf, size_t len)
{
	return json_object_is_type(kvt_json_get(row, key), json_type_int) &&
	       kvt_json_num_text(kvt_json_get(row, key), buf, len);
}

static const char *
opt_num(struct json_object *v, char *buf, size_t len)
{
	return kvt_json_num_text(v, buf, len) ? buf : NULL;
}

static void
fams_sessions(struct sink *k, struct json_object *doc)
{
	struct json_object *arr = kvt_json_get(doc, "clients");
	char sess[32], pid[32], uid[32], gid[32];
	size_t i, r, n;

	if (!json_object_is_type(arr, json_type_array))
		return;
	n = json_object_array_length(arr);
	{
		struct fam f =
		    FAM(k, "kvtier_session_info", "gauge",
			"Constant 1, labelled with the session's peer credentials and name.");

		for (r = 0; r < n; r++) {
			struct json_object *row = json_object_array_get_idx(arr, r);
			struct label l[] = {
			    {"session", sess},
			    {"pid", opt_num(kvt_json_get(row, "pid"), pid, sizeof(pid))},
			    {"uid", opt_num(kvt_json_get(row, "uid"), uid, sizeof(uid))},
			    {"gid", opt_num(kvt_json_get(row, "gid"), gid, sizeof(gid))},
			    {"name", kvt_json_str(kvt_json_get(row, "name"))},
			};

			if (id_text(row, "session", sess, sizeof(sess)))
				sample_u64(&f, NULL, l, 5, 1);
		}
	}
	for (i = 0; i < sizeof(session_fams) / sizeof(session_fams[0]); i++) {
		struct fam f =
		    FAM(k, session_fams[i].name, session_fams[i].type, session_fams[i].help);

		for (r = 0; r < n; r++) {
			struct json_object *row = json_object_array_get_idx(arr, r);
			struct label l = {"session", sess};

			if (id_text(row, "session", sess, sizeof(sess)))
				sample_v(&f, NULL, &l, 1, kvt_json_get(row, session_fams[i].key));
		}
	}
}

static void
fams_seqs(struct sink *k, struct json_object *doc)
{
	struct json_object *arr = kvt_json_get(doc, "seqs");
	char sess[32], seq[32], layers[32], heads[32], dim[32];
	size_t i, r, n, t;

	if (!json_object_is_type(arr, json_type_array))
		return;
	n = json_object_array_length(arr);
	{
		struct fam f = FAM(k, "kvtier_seq_info", "gauge",
				   "Constant 1, labelled with the sequence's geometry, policy and "
				   "int8 key scaling.");

		for (r = 0; r < n; r++) {
			struct json_object *row = json_object_array_get_idx(arr, r);
			struct label l[] = {
			    {"session", sess},
			    {"seq", seq},
			    {"layers",
			     opt_num(kvt_json_get(row, "layers"), layers, sizeof(layers))},
			    {"kv_heads",
			     opt_num(kvt_json_get(row, "kv_heads"), heads, sizeof(heads))},
			    {"head_dim", opt_num(kvt_json_get(row, "head_dim"), dim, sizeof(dim))},
			    {"dtype", kvt_json_str(kvt_json_get(row, "dtype"))},
			    {"policy", kvt_json_str(kvt_json_get(row, "policy"))},
			    {"t2_keys", kvt_json_str(kvt_json_get(row, "t2_keys"))},
			};

			if (id_text(row, "session", sess, sizeof(sess)) &&
			    id_text(row, "seq", seq, sizeof(seq)))
				sample_u64(&f, NULL, l, 8, 1);
		}
	}
	for (i = 0; i < sizeof(seq_fams) / sizeof(seq_fams[0]); i++) {
		struct fam f = FAM(k, seq_fams[i].name, seq_fams[i].type, seq_fams[i].help);

		for (r = 0; r < n; r++) {
			struct json_object *row = json_object_array_get_idx(arr, r);
			struct label l[] = {{"session", sess}, {"seq", seq}};

			if (id_text(row, "session", sess, sizeof(sess)) &&
			    id_text(row, "seq", seq, sizeof(seq)))
				sample_v(&f, NULL, l, 2, kvt_json_get(row, seq_fams[i].key));
		}
	}
	{
		struct fam f = FAM(k, "kvtier_seq_tier_tokens", "gauge",
				   "Tokens of the sequence per tier (t3 = evicted).");

		for (r = 0; r < n; r++) {
			struct json_object *row = json_object_array_get_idx(arr, r);
			struct json_object *tiers = kvt_json_get(row, "tiers");
			char tier[24];
			struct label l[] = {{"session", sess}, {"seq", seq}, {"tier", tier}};

			if (!id_text(row, "session", sess, sizeof(sess)) ||
			    !id_text(row, "seq", seq, sizeof(seq)) ||
			    !json_object_is_type(tiers, json_type_array))
				continue;
			for (t = 0; t < json_object_array_length(tiers); t++) {
				snprintf(tier, sizeof(tier), "t%zu", t);
				sample_v(&f, NULL, l, 3, json_object_array_get_idx(tiers, t));
			}
		}
	}
}

/* ---- from the counter snapshot ---- */

static void
fams_ops(struct sink *k, const struct kvtd_op_stats *st)
{
	unsigned o, b;

	/* Every opcode of the table always, so the label set does not depend on traffic; the
	 * "unknown" row only once a client sent an opcode outside it. */
#define EACH_OP                                                                                    \
	for (o = 0; o < KVTD_OP_SLOTS; o++)                                                        \
		if (o < KVT_OP__COUNT || st->count[o])
	{
		struct fam f = FAM(k, "kvtier_op_total", "counter", "Ops completed, by opcode.");

		EACH_OP
		{
			struct label l = {"op", kvtd_op_name(o)};

			sample_u64(&f, NULL, &l, 1, st->count[o]);
		}
	}
	{
		struct fam f = FAM(k, "kvtier_op_errors_total", "counter",
				   "Ops completed with an error, by opcode.");

		EACH_OP
		{
			struct label l = {"op", kvtd_op_name(o)};

			sample_u64(&f, NULL, &l, 1, st->errors[o]);
		}
	}
	{
		struct fam f = FAM(k, "kvtier_op_duration_seconds", "histogram",
				   "Time from taking an op off the ring to its completion, by "
				   "opcode (retier: re-tiering, topk: top-k retrieval); a random "
				   "sample of the ops (_count <= kvtier_op_total).");

		EACH_OP
		{
			char le[32];
			struct label l[] = {{"op", kvtd_op_name(o)}, {"le", le}};
			uint64_t cum = 0;

			for (b = 0; b < KVTD_LAT_BUCKETS; b++) {
				cum += st->bucket[o][b];
				snprintf(le, sizeof(le), "%.9g", (double)(1ull << b) * 1e-6);
				sample_u64(&f, "_bucket", l, 2, cum);
			}
			snprintf(le, sizeof(le), "+Inf");
			sample_u64(&f, "_bucket", l, 2, st->timed[o]);
			sample_dbl(&f, "_sum", l, 1, st->sum_ns[o] / 1e9);
			sample_u64(&f, "_count", l, 1, st->timed[o]);
		}
	}
#undef EACH_OP
	{
		struct fam f = FAM(k, "kvtier_pool_bytes_total", "counter",
				   "Row bytes moved by ops: in = into the pool (append), out = out "
				   "of it (retier: promotions to T0; fetch, topk: to staging).");

		for (o = 0; o < KVT_OP__COUNT; o++) {
			struct label in[] = {{"op", kvtd_op_name(o)}, {"direction", "in"}};
			struct label out[] = {{"op", kvtd_op_name(o)}, {"direction", "out"}};

			sample_u64(&f, NULL, in, 2, st->bytes_in[o]);
			sample_u64(&f, NULL, out, 2, st->bytes_out[o]);
		}
	}
	{
		static const char *const flow[KVTD_FLOW__COUNT][2] = {
		    [KVTD_FLOW_CLIENT_T1] = {"client", "t1"},
		    [KVTD_FLOW_T1_T2] = {"t1", "t2"},
		    [KVTD_FLOW_T1_DEVICE] = {"t1", "device"},
		    [KVTD_FLOW_T2_DEVICE] = {"t2", "device"},
		};
		struct fam f =
		    FAM(k, "kvtier_tier_bytes_total", "counter",
			"Row bytes moved between tiers: client rows into T1 (append), T1 "
			"rows quantized into T2 (int8 bytes), T1 and T2 rows copied to the "
			"device (T0 promotions, staging; T2 dequantized, at full width).");

		for (unsigned i = 0; i < KVTD_FLOW__COUNT; i++) {
			struct label l[] = {{"from", flow[i][0]}, {"to", flow[i][1]}};

			sample_u64(&f, NULL, l, 2, st->flow_bytes[i]);
		}
	}
}

struct cfam {
	const char *name;
	const char *type;
	const char *help;
	size_t off;
};

#define CF(n, t, h, m)                                                                             \
	{                                                                                          \
		n, t, h, offsetof(struct kvtd_prom_client, m)                                      \
	}
static const struct cfam client_fams[] = {
    CF("kvtier_client_seqs", "gauge", "Open sequences of the client's sessions.", seqs),
    CF("kvtier_client_pool_bytes", "gauge", "Pool bytes charged to the client's sessions.",
       pool_bytes),
    CF("kvtier_client_ops_total", "counter",
       "Ops completed for the client's connected sessions (drops when one ends).", ops),
    CF("kvtier_client_errors_total", "counter",
       "Ops of the client's connected sessions completed with an error.", errors),
    CF("kvtier_client_sq_backlog", "gauge",
       "Entries the client submitted that the daemon has not taken yet.", sq_backlog),
    CF("kvtier_client_cq_backlog", "gauge",
       "Completions posted that the client has not reaped yet.", cq_backlog),
};
#undef CF

static void
fams_clients(struct sink *k, const struct kvtd_prom_snap *sn)
{
	unsigned i, c;

	{
		struct fam f = FAM(k, "kvtier_client_sessions", "gauge",
				   "Connected sessions, by client name (kvt_opts.name).");

		for (c = 0; c < sn->n_clients; c++) {
			struct label l = {"client", sn->clients[c].name};

			sample_u64(&f, NULL, &l, 1, sn->clients[c].sessions);
		}
	}
	for (i = 0; i < sizeof(client_fams) / sizeof(client_fams[0]); i++) {
		struct fam f =
		    FAM(k, client_fams[i].name, client_fams[i].type, client_fams[i].help);

		for (c = 0; c < sn->n_clients; c++) {
			struct label l = {"client", sn->clients[c].name};
			uint64_t v;

			memcpy(&v, (const char *)&sn->clients[c] + client_fams[i].off, sizeof(v));
			sample_u64(&f, NULL, &l, 1, v);
		}
	}
	{
		struct fam f = FAM(k, "kvtier_client_pool_bytes_total", "counter",
				   "Bytes the client's connected sessions moved to (in) and from "
				   "(out) the pool.");

		for (c = 0; c < sn->n_clients; c++) {
			struct label in[] = {{"client", sn->clients[c].name}, {"direction", "in"}};
			struct label out[] = {{"client", sn->clients[c].name},
					      {"direction", "out"}};

			sample_u64(&f, NULL, in, 2, sn->clients[c].bytes_in);
			sample_u64(&f, NULL, out, 2, sn->clients[c].bytes_out);
		}
	}
}

static void
fams_proc(struct sink *k, const struct kvtd_prom_proc *p)
{
	static const struct {
		const char *name, *type, *help;
	} h[] = {
	    {"process_cpu_seconds_total", "counter", "User and system CPU time spent, seconds."},
	    {"process_resident_memory_bytes", "gauge", "Resident memory size in bytes."},
	    {"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes."},
	    {"process_open_fds", "gauge", "Open file descriptors."},
	    {"process_max_fds", "gauge", "Limit on open file descriptors (RLIMIT_NOFILE)."},
	    {"process_start_time_seconds", "gauge",
	     "Start time of the process since the epoch, seconds."},
	};
	struct fam f[] = {
	    FAM(k, h[0].name, h[0].type, h[0].help), FAM(k, h[1].name, h[1].type, h[1].help),
	    FAM(k, h[2].name, h[2].type, h[2].help), FAM(k, h[3].name, h[3].type, h[3].help),
	    FAM(k, h[4].name, h[4].type, h[4].help), FAM(k, h[5].name, h[5].type, h[5].help),
	};

	if (!p->valid)
		return;
	sample_dbl(&f[0], NULL, NULL, 0, p->cpu_seconds);
	sample_u64(&f[1], NULL, NULL, 0, p->rss_bytes);
	sample_u64(&f[2], NULL, NULL, 0, p->vsz_bytes);
	sample_u64(&f[3], NULL, NULL, 0, p->open_fds);
	sample_u64(&f[4], NULL, NULL, 0, p->max_fds);
	sample_dbl(&f[5], NULL, NULL, 0, p->start_time_seconds);
}

static int
render(struct sink *k, const struct kvtd_prom_input *in)
{
	if ((in->status && !json_object_is_type(in->status, json_type_object)) ||
	    (in->clients && !json_object_is_type(in->clients, json_type_object)) ||
	    (in->seqs && !json_object_is_type(in->seqs, json_type_object)) ||
	    (in->blocks && !json_object_is_type(in->blocks, json_type_object)))
		return -EINVAL;
	if (in->status) {
		fams_status(k, in->status);
		fams_spill(k, kvt_json_get(in->status, "spill"));
	}
	if (in->blocks)
		fams_prefix(k, in->blocks);
	if (in->snap) {
		fams_ops(k, &in->snap->ops);
		fams_clients(k, in->snap);
		fams_proc(k, &in->snap->proc);
	}
	if (in->clients)
		fams_sessions(k, in->clients);
	if (in->seqs)
		fams_seqs(k, in->seqs);
	return 0;
}

int
kvtd_prom_text(FILE *out, const struct kvtd_prom_input *in)
{
	struct sink k = {.out = out};
	int r = render(&k, in);

	if (r < 0)
		return r;
	if (fflush(out) || ferror(out))
		return -EIO;
	return 0;
}

int
kvtd_prom_json(const struct kvtd_prom_input *in, struct json_object **ret_doc)
{
	struct json_object *doc = json_object_new_object();
	struct sink k = {.arr = json_object_new_array()};
	int r;

	if (!doc || !k.arr) {
		json_object_put(doc);
		json_object_put(k.arr);
		return -ENOMEM;
	}
	json_object_object_add(doc, "schema", json_object_new_int(KVT_CTL_SCHEMA));
	json_object_object_add(doc, "metrics", k.arr);
	r = render(&k, in);
	if (r < 0) {
		json_object_put(doc);
		return r;
	}
	*ret_doc = doc;
	return 0;
}

/* ---- gathering ---- */

void
kvtd_prom_proc(struct kvtd_prom_proc *ret)
{
	unsigned long long utime, stime, start, vsize;
	long long rss;
	long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
	char buf[1024], *p;
	double btime = 0;
	struct rlimit rl;
	struct dirent *de;
	FILE *f;
	DIR *dir;
	size_t n;

	memset(ret, 0, sizeof(*ret));
	f = fopen("/proc/self/stat", "re");
	if (!f)
		return;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* the command name may hold spaces and parentheses: fields follow the last ')' */
	p = strrchr(buf, ')');
	if (!p || tck <= 0 ||
	    sscanf(p + 2,
		   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d "
		   "%llu %llu %lld",
		   &utime, &stime, &start, &vsize, &rss) != 5)
		return;
	f = fopen("/proc/stat", "re");
	if (f) {
		while (fgets(buf, sizeof(buf), f))
			if (sscanf(buf, "btime %lf", &btime) == 1)
				break;
		fclose(f);
	}
	ret->cpu_seconds = (double)(utime + stime) / (double)tck;
	ret->start_time_seconds = btime + (double)start / (double)tck;
	ret->vsz_bytes = vsize;
	ret->rss_bytes = rss > 0 ? (uint64_t)rss * (uint64_t)page : 0;
	dir = opendir("/proc/self/fd");
	if (dir) {
		while ((de = readdir(dir)))
			if (de->d_name[0] != '.')
				ret->open_fds++;
		closedir(dir);
		ret->open_fds--; /* the directory's own descriptor */
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		ret->max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
	ret->valid = true;
}

struct gather {
	struct kvtd_prom_snap *sn;
	unsigned cap;
	const uid_t *only_uid;
	int err;
};

static void
gather_session(struct kvtd_session *s, void *arg)
{
	struct gather *g = arg;
	struct kvtd_prom_snap *sn = g->sn;
	struct kvtd_prom_client *c = NULL;
	uint32_t ready;
	unsigned i;

	kvtd_op_stats_fold(&sn->ops, &s->opst);
	if (g->only_uid && s->uid != *g->only_uid)
		return;
	for (i = 0; i < sn->n_clients; i++)
		if (!strncmp(sn->clients[i].name, s->name, sizeof(s->name)))
			c = &sn->clients[i];
	if (!c) {
		if (sn->n_clients == g->cap) {
			unsigned cap = g->cap ? 2 * g->cap : 16;
			void *p = realloc(sn->clients, cap * sizeof(*sn->clients));

			if (!p) {
				g->err = -ENOMEM;
				return;
			}
			sn->clients = p;
			g->cap = cap;
		}
		c = &sn->clients[sn->n_clients++];
		memset(c, 0, sizeof(*c));
		snprintf(c->name, sizeof(c->name), "%.*s", (int)sizeof(s->name) - 1, s->name);
	}
	c->sessions++;
	c->seqs += s->n_seqs;
	c->pool_bytes += s->acct.bytes;
	c->ops += s->ops;
	c->errors += s->errors;
	for (i = 0; i < KVTD_OP_SLOTS; i++) {
		c->bytes_in += s->opst.bytes_in[i];
		c->bytes_out += s->opst.bytes_out[i];
	}
	/* the tail is the client's to write: a value past the ring is an update in flight or a
	 * broken client, shown as 0 rather than as a huge backlog */
	ready = kvt_ring_ready(s->sq_head, kvt_ring_load_tail(s->sq));
	c->sq_backlog += ready <= s->sq_entries ? ready : 0;
	c->cq_backlog +=
	    s->cq_tail - s->cq_head_seen <= s->cq_entries ? s->cq_tail - s->cq_head_seen : 0;
}

/* Keep only the rows of @doc[@key] whose "session" is in @sn's visible set (@ids). */
static void
keep_sessions(struct json_object *doc, const char *key, const uint64_t *ids, size_t n)
{
	struct json_object *all = kvt_json_get(doc, key), *own;
	size_t i, j;

	if (!json_object_is_type(all, json_type_array))
		return;
	own = json_object_new_array();
	for (i = 0; i < json_object_array_length(all); i++) {
		struct json_object *e = json_object_array_get_idx(all, i);
		uint64_t sid = json_object_get_uint64(kvt_json_get(e, "session"));

		for (j = 0; j < n; j++)
			if (ids[j] == sid) {
				json_object_array_add(own, json_object_get(e));
				break;
			}
	}
	json_object_object_add(doc, key, own);
}

static void
collect_ids(struct kvtd_session *s, void *arg)
{
	struct {
		uint64_t *ids;
		size_t n, cap;
		uid_t uid;
	} *v = arg;

	if (s->uid == v->uid && v->n < v->cap)
		v->ids[v->n++] = s->id;
}

int
kvtd_prom_render(struct kvtd *d, uint32_t flags, const uid_t *only_uid, char **ret_text,
		 size_t *ret_len, struct json_object **ret_doc)
{
	struct kvtd_prom_snap sn = {0};
	struct gather g = {.sn = &sn, .only_uid = only_uid};
	struct kvtd_prom_input in = {.snap = &sn};
	int r = 0;

	kvtd_stats_for_each_session(d, gather_session, &g);
	kvtd_op_stats_fold(&sn.ops, &d->opst_ended);
	kvtd_prom_proc(&sn.proc);
	in.status = kvtd_stats_status(d, only_uid);
	/* the totals only: an empty scope list leaves every namespace out */
	in.blocks = kvtd_stats_blocks(d, (const uint64_t[]){0}, 0);
	if (flags & KVT_CTL_METRICS_F_SESSIONS) {
		in.clients = kvtd_stats_clients(d);
		in.seqs = kvtd_stats_seqs(d);
		if (only_uid) {
			struct {
				uint64_t *ids;
				size_t n, cap;
				uid_t uid;
			} v = {calloc(d->n_sessions + 1, sizeof(uint64_t)), 0, d->n_sessions,
			       *only_uid};

			if (!v.ids) {
				r = -ENOMEM;
				goto out;
			}
			kvtd_stats_for_each_session(d, collect_ids, &v);
			keep_sessions(in.clients, "clients", v.ids, v.n);
			keep_sessions(in.seqs, "seqs", v.ids, v.n);
			free(v.ids);
		}
	}
	if (g.err || !in.status || !in.blocks) {
		r = -ENOMEM;
		goto out;
	}
	if (flags & KVT_CTL_METRICS_F_JSON) {
		r = kvtd_prom_json(&in, ret_doc);
	} else {
		char *text = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&text, &len);

		if (!f) {
			r = -ENOMEM;
			goto out;
		}
		r = kvtd_prom_text(f, &in);
		if (fclose(f) != 0 && r == 0)
			r = -EIO;
		if (r < 0) {
			free(text);
			goto out;
		}
		*ret_text = text;
		*ret_len = len;
	}
out:
	json_object_put(in.status);
	json_object_put(in.blocks);
	json_object_put(in.clients);
	json_object_put(in.seqs);
	free(sn.clients);
	return r;
}
