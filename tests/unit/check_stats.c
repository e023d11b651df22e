/* SPDX-License-Identifier: MIT */
/*
 * check_stats - the BLOCKS document (daemon/stats.c) over a real pool and prefix store: every
 * field of kvt_ctl.h's schema with the store's counts, and the namespace filter a peer that is
 * not privileged gets (its uid's scope, the shared scope when it is in it, nobody else's).
 */
#define _GNU_SOURCE
#include <check.h>
#include <json-c/json.h>
#include <string.h>

#include "config.h"
#include "kvt_ctl.h"
#include "kvt_test.h"
#include "kvtd.h"
#include "prefix.h"
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

static Suite *
stats_suite(void)
{
	Suite *s = suite_create("stats");
	TCase *tc = tcase_create("blocks");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, t_blocks_all);
	tcase_add_test(tc, t_blocks_filtered);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	return kvt_check_run(stats_suite());
}
