/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "pool.h"

static struct kvtd_pool P;

static void
setup(void)
{
	struct kvtd_config cfg;

	kvtd_config_defaults(&cfg);
	cfg.pool_size = 8ull << 20; /* 4 chunks of 2 MiB */
	cfg.lock = 0;
	cfg.numa_node = -1;
	ck_assert_int_eq(kvtd_pool_init(&P, &cfg, NULL), 0);
}

static void
teardown(void)
{
	kvtd_pool_fini(&P);
}

START_TEST(t_classes)
{
	int a = kvtd_pool_class_get(&P, 1000), b = kvtd_pool_class_get(&P, 1024);

	ck_assert_int_ge(a, 0);
	ck_assert_int_eq(a, b); /* both round to 1024 */
	ck_assert_uint_eq(kvtd_pool_slot_size(&P, a), 1024);
	ck_assert_int_eq(kvtd_pool_class_get(&P, (2 << 20) + 1), -E2BIG);
	ck_assert_int_eq(kvtd_pool_class_get(&P, 0), -E2BIG);
	kvtd_pool_class_put(&P, a);
	kvtd_pool_class_put(&P, b);
}
END_TEST

START_TEST(t_alloc_free_distinct)
{
	int cls = kvtd_pool_class_get(&P, 4096);
	enum { N = 2048 }; /* 8 MiB / 4 KiB: the whole pool */
	void **s = calloc(N, sizeof(void *));
	struct kvtd_pool_usage u;
	void *extra;

	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, N, NULL, NULL, s), 0);
	/* Every slot distinct, inside the pool, aligned to its size, and writable. */
	for (int i = 0; i < N; i++) {
		ck_assert((uint8_t *)s[i] >= P.base && (uint8_t *)s[i] + 4096 <= P.base + P.size);
		ck_assert_uint_eq(((uint8_t *)s[i] - P.base) % 4096, 0);
		memset(s[i], i & 0xff, 4096);
	}
	for (int i = 0; i < N; i++)
		ck_assert_uint_eq(((uint8_t *)s[i])[4095], i & 0xff);
	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 1, NULL, NULL, &extra), -ENOMEM);
	kvtd_pool_usage(&P, &u);
	ck_assert_uint_eq(u.used, 8u << 20);
	ck_assert_uint_eq(u.chunks_free, 0);
	kvtd_pool_free(&P, cls, N, NULL, NULL, s);
	kvtd_pool_usage(&P, &u);
	ck_assert_uint_eq(u.used, 0);
	ck_assert_uint_eq(u.chunks_free, 4);
	kvtd_pool_class_put(&P, cls);
	free(s);
}
END_TEST

START_TEST(t_all_or_nothing)
{
	int cls = kvtd_pool_class_get(&P, 1 << 20); /* 2 per chunk, 8 in the pool */
	void *s[9];
	struct kvtd_pool_usage u;

	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 9, NULL, NULL, s), -ENOMEM);
	kvtd_pool_usage(&P, &u);
	ck_assert_uint_eq(u.used, 0); /* the 8 that fit were given back */
	ck_assert_uint_eq(u.chunks_free, 4);
	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 8, NULL, NULL, s), 0);
	kvtd_pool_free(&P, cls, 8, NULL, NULL, s);
	kvtd_pool_class_put(&P, cls);
}
END_TEST

START_TEST(t_chunks_return_across_classes)
{
	int a = kvtd_pool_class_get(&P, 64 << 10), b = kvtd_pool_class_get(&P, 128 << 10);
	void *sa[128], *sb[64];

	/* Fill the pool with class a, free it, then class b must get all of it. */
	ck_assert_int_eq(kvtd_pool_alloc(&P, a, 128, NULL, NULL, sa), 0);
	ck_assert_int_eq(kvtd_pool_alloc(&P, b, 1, NULL, NULL, sb), -ENOMEM);
	/* Free in a scattered order: chunks return only when wholly free. */
	for (int i = 0; i < 128; i += 2)
		kvtd_pool_free(&P, a, 1, NULL, NULL, &sa[i]);
	ck_assert_int_eq(kvtd_pool_alloc(&P, b, 1, NULL, NULL, sb), -ENOMEM);
	for (int i = 1; i < 128; i += 2)
		kvtd_pool_free(&P, a, 1, NULL, NULL, &sa[i]);
	ck_assert_int_eq(kvtd_pool_alloc(&P, b, 64, NULL, NULL, sb), 0);
	kvtd_pool_free(&P, b, 64, NULL, NULL, sb);
	kvtd_pool_class_put(&P, a);
	kvtd_pool_class_put(&P, b);
}
END_TEST

START_TEST(t_reuse_after_free)
{
	int cls = kvtd_pool_class_get(&P, 512);
	void *s[10], *again;

	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 10, NULL, NULL, s), 0);
	kvtd_pool_free(&P, cls, 1, NULL, NULL, &s[4]);
	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 1, NULL, NULL, &again), 0);
	ck_assert_ptr_eq(again, s[4]); /* the freed slot is handed out first */
	s[4] = again;
	kvtd_pool_free(&P, cls, 10, NULL, NULL, s);
	kvtd_pool_class_put(&P, cls);
}
END_TEST

START_TEST(t_quota)
{
	struct kvtd_acct sess = {.limit = 64 << 10}, uid = {.limit = 96 << 10};
	struct kvtd_acct sess2 = {.limit = 0};
	int cls = kvtd_pool_class_get(&P, 16 << 10);
	void *s[8];

	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 4, &sess, &uid, s), 0);
	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 1, &sess, &uid, s + 4), -EDQUOT);
	ck_assert_uint_eq(sess.bytes, 64 << 10);
	/* another session of the same uid: its own limit is fine, the uid's is not */
	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 2, &sess2, &uid, s + 4), 0);
	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 1, &sess2, &uid, s + 6), -EDQUOT);
	ck_assert_uint_eq(P.refused_quota, 2);
	kvtd_pool_free(&P, cls, 4, &sess, &uid, s);
	kvtd_pool_free(&P, cls, 2, &sess2, &uid, s + 4);
	ck_assert_uint_eq(sess.bytes, 0);
	ck_assert_uint_eq(uid.bytes, 0);
	kvtd_pool_class_put(&P, cls);
}
END_TEST

START_TEST(t_bad_init)
{
	struct kvtd_config cfg;
	struct kvtd_pool p;

	kvtd_config_defaults(&cfg);
	cfg.pool_size = (8ull << 20) + 4096; /* not a multiple of the chunk */
	cfg.lock = 0;
	ck_assert_int_eq(kvtd_pool_init(&p, &cfg, NULL), -EINVAL);
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("pool");
	TCase *tc = tcase_create("pool");
	SRunner *sr;
	int failed;

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, t_classes);
	tcase_add_test(tc, t_alloc_free_distinct);
	tcase_add_test(tc, t_all_or_nothing);
	tcase_add_test(tc, t_chunks_return_across_classes);
	tcase_add_test(tc, t_reuse_after_free);
	tcase_add_test(tc, t_quota);
	tcase_add_test(tc, t_bad_init);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
