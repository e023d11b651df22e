/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvt_version.h"
#include "kvtd.h"
#include "poller.h"
#include "seq.h"
#include "session.h"
#include "spill.h"
#include "stats.h"

static const char *const dtype_names[] = {"f16", "bf16", "f32"};
static const char *const policy_names[] = {"tiered", "h2o", "streaming", "full"};

#define ADD(o, k, v) json_object_object_add((o), (k), (v))
#define U64(v)	     json_object_new_uint64((uint64_t)(v))

static struct json_object *
tiers_array(const uint64_t t[4])
{
	struct json_object *a = json_object_new_array();

	for (int i = 0; i < 4; i++)
		json_object_array_add(a, U64(t[i]));
	return a;
}

void
kvtd_stats_for_each_session(struct kvtd *d, void (*fn)(struct kvtd_session *, void *), void *arg)
{
	for (unsigned i = 0; i < d->n_pollers; i++) {
		struct kvtd_poller *p = d->pollers[i];

		kvtd_poller_lock(p);
		for (unsigned j = 0; j < p->n_sessions; j++)
			fn(p->sessions[j], arg);
		kvtd_poller_unlock(p);
	}
}

struct totals {
	uint64_t ops, errors, seqs, tiers[4];
};

static void
sum_session(struct kvtd_session *s, void *arg)
{
	struct totals *t = arg;

	t->ops += s->ops;
	t->errors += s->errors;
	t->seqs += s->n_seqs;
	for (unsigned i = 0; i < s->max_seqs; i++)
		if (s->seqs[i])
			for (int k = 0; k < 4; k++)
				t->tiers[k] += s->seqs[i]->ts.count[k];
}

struct json_object *
kvtd_stats_spill(const char *path, const struct kvtd_spill *s, const uid_t *only_uid)
{
	struct json_object *o = json_object_new_object(), *a = json_object_new_array(), *g;
	struct kvtd_spill_uid uids[KVTD_STATS_SPILL_UIDS];
	struct kvtd_spill_stats st;
	unsigned n;

	if (!o || !a) {
		json_object_put(o);
		json_object_put(a);
		return NULL;
	}
	kvtd_spill_get_stats(s, &st);
	ADD(o, "path", json_object_new_string(path));
	ADD(o, "kind", json_object_new_string(st.block_device ? "block device" : "file"));
	ADD(o, "size", U64(st.size));
	ADD(o, "used", U64(st.used));
	ADD(o, "free", U64(st.free));
	ADD(o, "largest_free", U64(st.largest_free));
	ADD(o, "extents", U64(st.extents));
	ADD(o, "queue_depth", U64(st.queue_depth));
	ADD(o, "in_flight", U64(st.in_flight));
	ADD(o, "uid_share", U64(st.uid_share));
	if (only_uid) {
		uids[0] = (struct kvtd_spill_uid){*only_uid, kvtd_spill_uid_bytes(s, *only_uid)};
		n = uids[0].bytes != 0;
	} else {
		n = kvtd_spill_uids(s, uids, KVTD_STATS_SPILL_UIDS);
		n = n < KVTD_STATS_SPILL_UIDS ? n : KVTD_STATS_SPILL_UIDS;
	}
	for (unsigned i = 0; i < n; i++) {
		struct json_object *u = json_object_new_object();

		ADD(u, "uid", U64(uids[i].uid));
		ADD(u, "bytes", U64(uids[i].bytes));
		json_object_array_add(a, u);
	}
	ADD(o, "uids", a);
	g = json_object_new_object();
	ADD(g, "reads", U64(st.reads));
	ADD(g, "writes", U64(st.writes));
	ADD(g, "read_bytes", U64(st.read_bytes));
	ADD(g, "write_bytes", U64(st.write_bytes));
	ADD(g, "read_errors", U64(st.read_errors));
	ADD(g, "write_errors", U64(st.write_errors));
	ADD(o, "io", g);
	g = json_object_new_object();
	ADD(g, "eio", U64(st.eio_errors));
	ADD(g, "enospc", U64(st.nospc_errors));
	ADD(g, "short", U64(st.short_io));
	ADD(g, "other", U64(st.other_errors));
	ADD(o, "errors", g);
	g = json_object_new_object();
	ADD(g, "nospc", U64(st.refused_nospc));
	ADD(g, "quota", U64(st.refused_quota));
	ADD(o, "refused", g);
	g = json_object_new_object();
	ADD(g, "extents", U64(st.dropped));
	ADD(g, "bytes", U64(st.dropped_bytes));
	ADD(o, "dropped", g);
	return o;
}

struct json_object *
kvtd_stats_status(struct kvtd *d, const uid_t *only_uid)
{
	struct json_object *o = json_object_new_object(), *pool, *abi, *ref;
	struct kvtd_pool_usage u;
	struct totals t = {0};

	kvtd_stats_for_each_session(d, sum_session, &t);
	kvtd_pool_usage(&d->pool, &u);
	ADD(o, "schema", json_object_new_int(KVT_CTL_SCHEMA));
	ADD(o, "version", json_object_new_string(KVT_VERSION));
	abi = json_object_new_object();
	ADD(abi, "major", json_object_new_int(KVT_ABI_MAJOR));
	ADD(abi, "minor", json_object_new_int(KVT_ABI_MINOR));
	ADD(o, "abi", abi);
	ADD(o, "backend", json_object_new_string(kvt_dev_name(d->dev)));
	if (d->metrics_fd >= 0) {
		char url[96];

		snprintf(url, sizeof(url), "http://%.*s:%u/metrics",
			 (int)(strrchr(d->cfg.metrics_listen, ':') - d->cfg.metrics_listen),
			 d->cfg.metrics_listen, d->metrics_port);
		ADD(o, "metrics_url", json_object_new_string(url));
	}
	ADD(o, "pid", json_object_new_int(getpid()));
	ADD(o, "uptime_s", json_object_new_double((kvtd_now_ns() - d->start_ns) / 1e9));
	ADD(o, "restarts", json_object_new_int64(d->restarts));
	ADD(o, "pollers", json_object_new_int((int)d->n_pollers));
	pool = json_object_new_object();
	ADD(pool, "size", U64(u.size));
	ADD(pool, "used", U64(u.used));
	ADD(pool, "free", U64(u.free_bytes));
	ADD(pool, "chunk_size", U64(d->pool.chunk_size));
	ADD(pool, "chunks", U64(u.chunks));
	ADD(pool, "chunks_free", U64(u.chunks_free));
	ADD(pool, "classes", U64(u.classes));
	ADD(pool, "backing", json_object_new_string(d->pool.backing));
	ADD(pool, "page_kib", json_object_new_int64(d->pool.page_kib));
	ADD(pool, "numa_node", json_object_new_int(d->pool.numa_node));
	ADD(pool, "locked", json_object_new_boolean(d->pool.locked));
	ADD(o, "pool", pool);
	ADD(o, "sessions", U64(d->n_sessions));
	ADD(o, "seqs", U64(t.seqs));
	ADD(o, "ops", U64(t.ops + atomic_load(&d->cnt.ops)));
	ADD(o, "errors", U64(t.errors + atomic_load(&d->cnt.errors)));
	ref = json_object_new_object();
	ADD(ref, "quota", U64(u.refused_quota)); /* read under the pool lock */
	ADD(ref, "nomem", U64(u.refused_nomem));
	ADD(ref, "einval", U64(atomic_load(&d->cnt.refused_einval)));
	ADD(ref, "auth", U64(atomic_load(&d->cnt.refused_auth)));
	ADD(ref, "hello_timeout", U64(atomic_load(&d->cnt.refused_hello_timeout)));
	ADD(ref, "limit", U64(atomic_load(&d->cnt.refused_limit)));
	ADD(ref, "ring_corrupt", U64(atomic_load(&d->cnt.ring_corrupt)));
	ADD(o, "refused", ref);
	ADD(o, "tiers", tiers_array(t.tiers));
	if (d->spill) /* null on allocation failure */
		ADD(o, "spill", kvtd_stats_spill(d->cfg.spill_path, d->spill, only_uid));
	return o;
}

static void
add_client(struct kvtd_session *s, void *arg)
{
	struct json_object *c = json_object_new_object();

	ADD(c, "session", U64(s->id));
	ADD(c, "pid", json_object_new_int(s->pid));
	ADD(c, "uid", U64(s->uid));
	ADD(c, "gid", U64(s->gid));
	ADD(c, "name", json_object_new_string(s->name));
	ADD(c, "seqs", U64(s->n_seqs));
	ADD(c, "pool_bytes", U64(s->acct.bytes));
	ADD(c, "ops", U64(s->ops));
	ADD(c, "errors", U64(s->errors));
	ADD(c, "sq_entries", U64(s->sq_entries));
	ADD(c, "arena_size", U64(s->arena_size));
	ADD(c, "uptime_s", json_object_new_double((kvtd_now_ns() - s->start_ns) / 1e9));
	json_object_array_add(arg, c);
}

struct json_object *
kvtd_stats_clients(struct kvtd *d)
{
	struct json_object *o = json_object_new_object(), *a = json_object_new_array();

	kvtd_stats_for_each_session(d, add_client, a);
	ADD(o, "schema", json_object_new_int(KVT_CTL_SCHEMA));
	ADD(o, "clients", a);
	return o;
}

static void
add_seqs(struct kvtd_session *s, void *arg)
{
	for (unsigned i = 0; i < s->max_seqs; i++) {
		struct kvtd_seq *q = s->seqs[i];
		struct json_object *c;

		if (!q)
			continue;
		c = json_object_new_object();
		ADD(c, "session", U64(s->id));
		ADD(c, "seq", U64(q->id));
		ADD(c, "tokens", U64(q->ts.n));
		ADD(c, "layers", U64(q->p.layers));
		ADD(c, "kv_heads", U64(q->p.kv_heads));
		ADD(c, "head_dim", U64(q->p.head_dim));
		ADD(c, "dtype", json_object_new_string(dtype_names[q->p.dtype]));
		ADD(c, "policy", json_object_new_string(policy_names[q->p.policy]));
		ADD(c, "t2_keys",
		    json_object_new_string(q->p.t2_flags & KVT_T2_F_KEY_CHANNEL ? "channel"
										: "head"));
		{
			uint64_t t[4] = {q->ts.count[0], q->ts.count[1], q->ts.count[2],
					 q->ts.count[3]};

			ADD(c, "tiers", tiers_array(t));
		}
		ADD(c, "evicted_ratio",
		    json_object_new_double(q->ts.n ? (double)q->ts.count[KVT_T3] / q->ts.n : 0.0));
		ADD(c, "pool_bytes", U64(kvtd_seq_pool_bytes(&s->d->pool, q)));
		json_object_array_add(arg, c);
	}
}

struct json_object *
kvtd_stats_seqs(struct kvtd *d)
{
	struct json_object *o = json_object_new_object(), *a = json_object_new_array();

	kvtd_stats_for_each_session(d, add_seqs, a);
	ADD(o, "schema", json_object_new_int(KVT_CTL_SCHEMA));
	ADD(o, "seqs", a);
	return o;
}

struct blocks_view {
	struct kvtd *d;
	const uint64_t *scopes; /* NULL: every namespace */
	unsigned n_scopes;
	struct json_object *arr;
};

static bool
scope_listed(const struct blocks_view *v, uint64_t scope)
{
	if (!v->scopes)
		return true;
	for (unsigned i = 0; i < v->n_scopes; i++)
		if (v->scopes[i] == scope)
			return true;
	return false;
}

/* Under the store's lock: reads the namespace, touches nothing else but the pool's class table
 * (fixed while a namespace holds its class). */
static void
add_ns(const struct kvtd_pns *ns, void *arg)
{
	struct blocks_view *v = arg;
	struct json_object *o;

	if (!scope_listed(v, ns->scope))
		return;
	o = json_object_new_object();
	ADD(o, "id", U64(ns->id));
	ADD(o, "name",
	    json_object_new_string_len(ns->p.name, (int)strnlen(ns->p.name, sizeof(ns->p.name))));
	if (ns->scope) {
		ADD(o, "scope", json_object_new_string("uid"));
		ADD(o, "uid", U64(ns->scope - 1));
	} else {
		ADD(o, "scope", json_object_new_string("shared"));
	}
	ADD(o, "layers", U64(ns->p.layers));
	ADD(o, "kv_heads", U64(ns->p.kv_heads));
	ADD(o, "head_dim", U64(ns->p.head_dim));
	ADD(o, "dtype", json_object_new_string(ns->p.dtype < 3 ? dtype_names[ns->p.dtype] : "?"));
	ADD(o, "block_tokens", U64(ns->p.block_tokens));
	ADD(o, "blocks", U64(ns->blocks));
	ADD(o, "referenced", U64(ns->referenced));
	ADD(o, "bytes",
	    U64(ns->blocks * ns->p.block_tokens * kvtd_pool_slot_size(&v->d->pool, ns->cls)));
	ADD(o, "handles", U64(ns->handles));
	ADD(o, "lookups", U64(ns->lookups));
	ADD(o, "hit_blocks", U64(ns->hit_blocks));
	ADD(o, "miss_blocks", U64(ns->miss_blocks));
	ADD(o, "published", U64(ns->published));
	ADD(o, "deduped", U64(ns->deduped));
	ADD(o, "evicted", U64(ns->evicted));
	json_object_array_add(v->arr, o);
}

struct json_object *
kvtd_stats_blocks(struct kvtd *d, const uint64_t *scopes, unsigned n_scopes)
{
	struct json_object *o = json_object_new_object();
	struct blocks_view v = {d, scopes, n_scopes, json_object_new_array()};
	struct kvtd_prefix_stats st;

	kvtd_prefix_stats(&d->prefix, &st);
	ADD(o, "schema", json_object_new_int(KVT_CTL_SCHEMA));
	ADD(o, "budget_bytes", U64(st.budget));
	ADD(o, "bytes", U64(st.bytes));
	ADD(o, "blocks", U64(st.blocks));
	ADD(o, "referenced", U64(st.referenced));
	ADD(o, "lookups", U64(st.lookups));
	ADD(o, "hit_blocks", U64(st.hit_blocks));
	ADD(o, "miss_blocks", U64(st.miss_blocks));
	ADD(o, "published", U64(st.published));
	ADD(o, "deduped", U64(st.deduped));
	ADD(o, "evicted", U64(st.evicted));
	ADD(o, "refused_budget", U64(st.refused_budget));
	if (!scopes || n_scopes)
		kvtd_prefix_ns_each(&d->prefix, add_ns, &v);
	ADD(o, "namespaces", v.arr);
	return o;
}
