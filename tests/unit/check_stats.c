/* SPDX-License-Identifier: MIT */
/*
 * check_stats - the BLOCKS document (daemon/stats.c) over a real pool and prefix store: every
 * field of kvt_ctl.h's schema with the store's counts, and the namespace filter a peer that is
 * not privileged gets (its uid's scope, the shared scope when it is in it, nobody else's).
 * STATUS's "spill" over a real spill store on a file with O_DIRECT ($KVT_SPILL_TEST_DIR,
 * /var/tmp, /tmp or the working directory, as check_spill): allocations, refusals, completed
 * and failed I/O of each cause and a drop, every count in the document and in the metrics.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>

#include "config.h"
#include "kvt_ctl.h"
#include "kvt_direct.h"
#include "kvt_test.h"
#include "kvtd.h"
#include "metrics_format.h"
#include "prefix.h"
#include "spill.h"
#include "stats.h"

#define BT 4 /* tokens per block */

static struct kvtd D;
static struct kvtd_acct A; /* the publishing sequence's account */
static struct kvtd_pns *mine, *theirs, *common;
static struct kvtd_pblock *blk[2];

static struct kvtd_pns *
open_ns(const char *name, uint64_t scope)
{
	struct kvt_ns_params p = {.size = sizeof(p),
				  .layers = 2,
				  .kv_heads = 1,
				  .head_dim = 64,
				  .dtype = KVT_DTYPE_F32,
				  .block_tokens = BT};
	struct kvtd_pns *ns;
	const char *why;

	strcpy(p.name, name);
	ck_assert_int_eq(kvtd_prefix_ns_check(&p, &why), 0);
	ck_assert_int_eq(kvtd_prefix_ns_open(&D.prefix, &p, scope, &ns), 0);
	return ns;
}

static struct kvt_block_key
key(uint64_t i)
{
	return (struct kvt_block_key){.lo = i * 0x9e3779b97f4a7c15ull, .hi = ~i};
}

/* uid 1000 publishes two blocks and looks three keys up (two found); uid 2000 and the shared
 * scope each have an empty namespace. */
static void
setup(void)
{
	struct kvt_block_key keys[3] = {key(1), key(2), key(3)};
	struct kvtd_config cfg;

	memset(&D, 0, sizeof(D));
	memset(&A, 0, sizeof(A));
	kvtd_config_defaults(&cfg);
	cfg.pool_size = 8ull << 20;
	cfg.lock = 0;
	cfg.numa_node = -1;
	ck_assert_int_eq(kvtd_pool_init(&D.pool, &cfg, NULL), 0);
	ck_assert_int_eq(kvtd_prefix_init(&D.prefix, &D.pool, 1 << 20), 0);
	mine = open_ns("model-a", 1000 + 1);
	theirs = open_ns("model-b", 2000 + 1);
	common = open_ns("model-c", 0);
	for (int b = 0; b < 2; b++) {
		void *slots[BT];

		ck_assert_int_eq(kvtd_pool_alloc(&D.pool, mine->cls, BT, &A, NULL, slots), 0);
		ck_assert_int_eq(
		    kvtd_prefix_publish(&D.prefix, mine, &keys[b], slots, &A, NULL, &blk[b]), 1);
	}
	ck_assert_uint_eq(kvtd_prefix_lookup(&D.prefix, mine, keys, 3, NULL, 0), 2);
}

static void
teardown(void)
{
	for (int b = 0; b < 2; b++)
		kvtd_prefix_put(&D.prefix, (struct kvtd_pblock *[]){blk[b], blk[b], blk[b], blk[b]},
				BT);
	kvtd_prefix_ns_close(&D.prefix, mine);
	kvtd_prefix_ns_close(&D.prefix, theirs);
	kvtd_prefix_ns_close(&D.prefix, common);
	kvtd_prefix_fini(&D.prefix);
	kvtd_pool_fini(&D.pool);
}

static int64_t
i64(struct json_object *o, const char *key)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, key, &v), "no \"%s\"", key);
	ck_assert_msg(json_object_is_type(v, json_type_int), "\"%s\" is no integer", key);
	return json_object_get_int64(v);
}

static const char *
str(struct json_object *o, const char *key)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, key, &v), "no \"%s\"", key);
	ck_assert_msg(json_object_is_type(v, json_type_string), "\"%s\" is no string", key);
	return json_object_get_string(v);
}

static struct json_object *
namespaces(struct json_object *doc)
{
	struct json_object *a;

	ck_assert(json_object_object_get_ex(doc, "namespaces", &a));
	ck_assert(json_object_is_type(a, json_type_array));
	return a;
}

/* The namespace named @name in @doc, or NULL. */
static struct json_object *
ns_named(struct json_object *doc, const char *name)
{
	struct json_object *a = namespaces(doc);

	for (size_t i = 0; i < json_object_array_length(a); i++)
		if (!strcmp(str(json_object_array_get_idx(a, i), "name"), name))
			return json_object_array_get_idx(a, i);
	return NULL;
}

/* The store's totals, the same whoever asks. */
static void
check_totals(struct json_object *doc)
{
	uint64_t block_bytes = BT * kvtd_pool_slot_size(&D.pool, mine->cls);

	ck_assert_int_eq(i64(doc, "schema"), KVT_CTL_SCHEMA);
	ck_assert_int_eq(i64(doc, "budget_bytes"), 1 << 20);
	ck_assert_int_eq(i64(doc, "bytes"), 2 * block_bytes);
	ck_assert_int_eq(i64(doc, "blocks"), 2);
	ck_assert_int_eq(i64(doc, "referenced"), 2);
	ck_assert_int_eq(i64(doc, "lookups"), 1);
	ck_assert_int_eq(i64(doc, "hit_blocks"), 2);
	ck_assert_int_eq(i64(doc, "miss_blocks"), 1);
	ck_assert_int_eq(i64(doc, "published"), 2);
	ck_assert_int_eq(i64(doc, "deduped"), 0);
	ck_assert_int_eq(i64(doc, "evicted"), 0);
	ck_assert_int_eq(i64(doc, "refused_budget"), 0);
}

START_TEST(t_blocks_all)
{
	struct json_object *doc = kvtd_stats_blocks(&D, NULL, 0), *a, *s;

	check_totals(doc);
	ck_assert_uint_eq(json_object_array_length(namespaces(doc)), 3);
	a = ns_named(doc, "model-a");
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(i64(a, "id"), mine->id);
	ck_assert_str_eq(str(a, "scope"), "uid");
	ck_assert_int_eq(i64(a, "uid"), 1000);
	ck_assert_int_eq(i64(a, "layers"), 2);
	ck_assert_int_eq(i64(a, "kv_heads"), 1);
	ck_assert_int_eq(i64(a, "head_dim"), 64);
	ck_assert_str_eq(str(a, "dtype"), "f32");
	ck_assert_int_eq(i64(a, "block_tokens"), BT);
	ck_assert_int_eq(i64(a, "blocks"), 2);
	ck_assert_int_eq(i64(a, "referenced"), 2);
	ck_assert_int_eq(i64(a, "bytes"), i64(doc, "bytes")); /* all of the store's */
	ck_assert_int_eq(i64(a, "handles"), 1);
	ck_assert_int_eq(i64(a, "lookups"), 1);
	ck_assert_int_eq(i64(a, "hit_blocks"), 2);
	ck_assert_int_eq(i64(a, "miss_blocks"), 1);
	ck_assert_int_eq(i64(a, "published"), 2);
	ck_assert_int_eq(i64(a, "deduped"), 0);
	ck_assert_int_eq(i64(a, "evicted"), 0);
	ck_assert_int_eq(i64(ns_named(doc, "model-b"), "uid"), 2000);
	ck_assert_int_eq(i64(ns_named(doc, "model-b"), "blocks"), 0);
	s = ns_named(doc, "model-c");
	ck_assert_str_eq(str(s, "scope"), "shared");
	ck_assert(!json_object_object_get_ex(s, "uid", NULL));
	json_object_put(doc);
}
END_TEST

/* uid 1000 outside the shared scope sees its own namespace only; inside it, the shared one too;
 * uid 2000's model name never reaches it. */
START_TEST(t_blocks_filtered)
{
	uint64_t scopes[2] = {1000 + 1, 0};
	struct json_object *doc = kvtd_stats_blocks(&D, scopes, 1);

	check_totals(doc);
	ck_assert_uint_eq(json_object_array_length(namespaces(doc)), 1);
	ck_assert_ptr_nonnull(ns_named(doc, "model-a"));
	ck_assert_ptr_null(strstr(json_object_to_json_string(doc), "model-b"));
	json_object_put(doc);

	doc = kvtd_stats_blocks(&D, scopes, 2);
	ck_assert_uint_eq(json_object_array_length(namespaces(doc)), 2);
	ck_assert_ptr_nonnull(ns_named(doc, "model-a"));
	ck_assert_ptr_nonnull(ns_named(doc, "model-c"));
	ck_assert_ptr_null(ns_named(doc, "model-b"));
	json_object_put(doc);

	/* a uid with no namespace: totals, an empty list */
	scopes[0] = 3000 + 1;
	doc = kvtd_stats_blocks(&D, scopes, 1);
	check_totals(doc);
	ck_assert_uint_eq(json_object_array_length(namespaces(doc)), 0);
	json_object_put(doc);
}
END_TEST

/* Queues one request (@inject: a fault for it, or 0) and waits for its result. */
static int
one_io(struct kvtd_spill *s, int op, kvtd_spill_ext e, void *buf, uint64_t len, int inject)
{
	struct kvtd_spill_cqe c;
	int n;

	if (inject)
		ck_assert_int_eq(kvtd_spill_inject(s, (unsigned)op, inject, 1), 0);
	if (op == KVTD_SPILL_OP_WRITE)
		ck_assert_int_eq(kvtd_spill_write(s, e, buf, len, 7), 0);
	else
		ck_assert_int_eq(kvtd_spill_read(s, e, buf, len, 7), 0);
	while ((n = kvtd_spill_reap(s, &c, 1)) == 0)
		ck_assert_int_eq(kvtd_spill_wait(s), 0);
	ck_assert_int_eq(n, 1);
	ck_assert_uint_eq(c.cookie, 7);
	return c.res;
}

static struct json_object *
obj(struct json_object *o, const char *key)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, key, &v), "no \"%s\"", key);
	ck_assert_msg(json_object_is_type(v, json_type_object), "\"%s\" is no object", key);
	return v;
}

START_TEST(t_spill_status)
{
	char dir[512], path[600], *text = NULL;
	struct kvtd_spill_params p = {path, 16ull << 20, 8, 4ull << 20, 0, 4242};
	struct kvtd_spill *s = NULL;
	size_t tlen = 0;
	size_t arena_len = 4u << 20;
	uint8_t *arena =
	    mmap(NULL, arena_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct iovec iov = {arena, arena_len};
	kvtd_spill_ext a[3], b, r, x;
	struct kvtd_spill_dropped d;
	struct json_object *doc, *u, *st;
	struct kvtd_prom_input in = {0};
	char err[512] = "";
	uid_t me = 1001, nobody = 3000;
	FILE *f;

	ck_assert_msg(kvt_test_direct_dir(dir, sizeof(dir)),
		      "no directory here supports O_DIRECT (tried $KVT_SPILL_TEST_DIR, /var/tmp, "
		      "/tmp, .): set KVT_SPILL_TEST_DIR to one on ext4 or xfs");
	ck_assert_ptr_ne(arena, MAP_FAILED);
	snprintf(path, sizeof(path), "%s/kvt-stats-spill-%d.dat", dir, (int)getpid());
	unlink(path);
	ck_assert_msg(kvtd_spill_open(&p, &s, err, sizeof(err)) == 0, "%s", err);
	unlink(path); /* open, the file lives on; a failed test leaves no store behind */
	ck_assert_int_eq(kvtd_spill_register_buffers(s, &iov, 1), 0);

	/* uid 1000: 3 MiB of its 4 MiB share, then refused; uid 1001: 8 KiB; root: 2 MiB;
	 * nothing of 16 MiB fits once 5 MiB and 8 KiB are held: refused for room */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(kvtd_spill_alloc(s, 1000, 1u << 20, 5 + i, 0, &a[i]), 0);
	ck_assert_int_eq(kvtd_spill_alloc(s, 1000, 2u << 20, 1, 0, &x), -EDQUOT);
	ck_assert_int_eq(kvtd_spill_alloc(s, 1001, 8192, 1, 0, &b), 0);
	ck_assert_int_eq(kvtd_spill_alloc(s, 0, 2u << 20, 9, 0, &r), 0);
	ck_assert_int_eq(kvtd_spill_alloc(s, 0, 16u << 20, 1, 0, &x), -ENOSPC);
	/* two writes land and one read; one request fails of each cause */
	ck_assert_int_eq(one_io(s, KVTD_SPILL_OP_WRITE, a[0], arena, 1u << 20, 0), 1 << 20);
	ck_assert_int_eq(one_io(s, KVTD_SPILL_OP_WRITE, a[1], arena, 4096, 0), 4096);
	ck_assert_int_eq(one_io(s, KVTD_SPILL_OP_READ, a[0], arena, 1u << 20, 0), 1 << 20);
	ck_assert_int_eq(one_io(s, KVTD_SPILL_OP_WRITE, a[2], arena, 4096, -EIO), -EIO);
	ck_assert_int_eq(one_io(s, KVTD_SPILL_OP_WRITE, r, arena, 4096, -ENOSPC), -ENOSPC);
	ck_assert_int_eq(one_io(s, KVTD_SPILL_OP_READ, a[1], arena, 4096, KVTD_SPILL_FAULT_SHORT),
			 -EIO);
	/* the least important extent (uid 1001's) dropped: T3 */
	ck_assert_int_eq(kvtd_spill_evict_lowest(s, &d), 0);
	ck_assert_uint_eq(d.uid, 1001);

	doc = kvtd_stats_spill(path, s, NULL);
	ck_assert_ptr_nonnull(doc);
	ck_assert_str_eq(str(doc, "path"), path);
	ck_assert_str_eq(str(doc, "kind"), "file");
	ck_assert_int_eq(i64(doc, "size"), 16 << 20);
	ck_assert_int_eq(i64(doc, "used"), 5 << 20);
	ck_assert_int_eq(i64(doc, "free"), 11 << 20);
	ck_assert_int_eq(i64(doc, "largest_free"), 8 << 20);
	ck_assert_int_eq(i64(doc, "extents"), 4);
	ck_assert_int_eq(i64(doc, "queue_depth"), 8);
	ck_assert_int_eq(i64(doc, "in_flight"), 0);
	ck_assert_int_eq(i64(doc, "uid_share"), 4 << 20);
	ck_assert(json_object_object_get_ex(doc, "uids", &u));
	ck_assert_uint_eq(json_object_array_length(u), 2); /* most first; 1001 holds nothing now */
	ck_assert_int_eq(i64(json_object_array_get_idx(u, 0), "uid"), 1000);
	ck_assert_int_eq(i64(json_object_array_get_idx(u, 0), "bytes"), 3 << 20);
	ck_assert_int_eq(i64(json_object_array_get_idx(u, 1), "uid"), 0);
	ck_assert_int_eq(i64(json_object_array_get_idx(u, 1), "bytes"), 2 << 20);
	ck_assert_int_eq(i64(obj(doc, "io"), "reads"), 1);
	ck_assert_int_eq(i64(obj(doc, "io"), "writes"), 2);
	ck_assert_int_eq(i64(obj(doc, "io"), "read_bytes"), 1 << 20);
	ck_assert_int_eq(i64(obj(doc, "io"), "write_bytes"), (1 << 20) + 4096);
	ck_assert_int_eq(i64(obj(doc, "io"), "read_errors"), 1);
	ck_assert_int_eq(i64(obj(doc, "io"), "write_errors"), 2);
	ck_assert_int_eq(i64(obj(doc, "errors"), "eio"), 1);
	ck_assert_int_eq(i64(obj(doc, "errors"), "enospc"), 1);
	ck_assert_int_eq(i64(obj(doc, "errors"), "short"), 1);
	ck_assert_int_eq(i64(obj(doc, "errors"), "other"), 0);
	ck_assert_int_eq(i64(obj(doc, "refused"), "quota"), 1);
	ck_assert_int_eq(i64(obj(doc, "refused"), "nospc"), 1);
	ck_assert_int_eq(i64(obj(doc, "dropped"), "extents"), 1);
	ck_assert_int_eq(i64(obj(doc, "dropped"), "bytes"), 8192);

	/* the same counts as metrics, from a STATUS document holding it */
	st = json_object_new_object();
	json_object_object_add(st, "spill", doc);
	in.status = st;
	f = open_memstream(&text, &tlen);
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(kvtd_prom_text(f, &in), 0);
	ck_assert_int_eq(fclose(f), 0);
	{
		char info[700];
		const char *want[] = {
		    info,
		    "\nkvtier_spill_size_bytes 16777216\n",
		    "\nkvtier_spill_used_bytes 5242880\n",
		    "\nkvtier_spill_free_bytes 11534336\n",
		    "\nkvtier_spill_extents 4\n",
		    "\nkvtier_spill_uid_share_bytes 4194304\n",
		    "\nkvtier_spill_reads_total 1\n",
		    "\nkvtier_spill_writes_total 2\n",
		    "\nkvtier_spill_read_bytes_total 1048576\n",
		    "\nkvtier_spill_write_bytes_total 1052672\n",
		    "\nkvtier_spill_errors_total{kind=\"eio\"} 1\n",
		    "\nkvtier_spill_errors_total{kind=\"enospc\"} 1\n",
		    "\nkvtier_spill_errors_total{kind=\"short\"} 1\n",
		    "\nkvtier_spill_errors_total{kind=\"other\"} 0\n",
		    "\nkvtier_spill_refused_total{reason=\"quota\"} 1\n",
		    "\nkvtier_spill_dropped_extents_total 1\n",
		    "\nkvtier_spill_dropped_bytes_total 8192\n",
		    "\nkvtier_spill_uid_bytes{uid=\"1000\"} 3145728\n",
		    "\nkvtier_spill_uid_bytes{uid=\"0\"} 2097152\n",
		};

		snprintf(info, sizeof(info), "\nkvtier_spill_info{path=\"%s\",kind=\"file\"} 1\n",
			 path);
		for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
			ck_assert_msg(strstr(text, want[i]), "missing %s in:\n%s", want[i], text);
	}
	free(text);
	json_object_put(st);

	/* a peer that is not privileged sees its own uid's use only, and the store's totals */
	doc = kvtd_stats_spill(path, s, &(uid_t){1000});
	ck_assert(json_object_object_get_ex(doc, "uids", &u));
	ck_assert_uint_eq(json_object_array_length(u), 1);
	ck_assert_int_eq(i64(json_object_array_get_idx(u, 0), "uid"), 1000);
	ck_assert_int_eq(i64(doc, "used"), 5 << 20);
	json_object_put(doc);
	doc = kvtd_stats_spill(path, s, &me); /* dropped: holds nothing */
	ck_assert(json_object_object_get_ex(doc, "uids", &u));
	ck_assert_uint_eq(json_object_array_length(u), 0);
	json_object_put(doc);
	doc = kvtd_stats_spill(path, s, &nobody);
	ck_assert(json_object_object_get_ex(doc, "uids", &u));
	ck_assert_uint_eq(json_object_array_length(u), 0);
	json_object_put(doc);

	kvtd_spill_close(s);
	munmap(arena, arena_len);
}
END_TEST

static Suite *
stats_suite(void)
{
	Suite *s = suite_create("stats");
	TCase *tc = tcase_create("blocks"), *sp = tcase_create("spill");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, t_blocks_all);
	tcase_add_test(tc, t_blocks_filtered);
	suite_add_tcase(s, tc);
	tcase_set_timeout(sp, 60);
	tcase_add_test(sp, t_spill_status);
	suite_add_tcase(s, sp);
	return s;
}

int
main(void)
{
	return kvt_check_run(stats_suite());
}
