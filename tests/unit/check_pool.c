/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "pool.h"
#include "kvt_test.h"

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

/* The pool is a memfd: another mapping of it sees the same bytes (what a restart maps). */
START_TEST(t_memfd_shared)
{
	int cls = kvtd_pool_class_get(&P, 4096);
	void *slot;
	uint8_t *other;

	ck_assert_int_ge(P.fd, 0);
	ck_assert_int_eq(kvtd_pool_alloc(&P, cls, 1, NULL, NULL, &slot), 0);
	memset(slot, 0x5a, 4096);
	other = mmap(NULL, P.size, PROT_READ, MAP_SHARED, P.fd, 0);
	ck_assert(other != MAP_FAILED);
	ck_assert_uint_eq(other[(uint8_t *)slot - P.base + 4095], 0x5a);
	munmap(other, P.size);
	kvtd_pool_free(&P, cls, 1, NULL, NULL, &slot);
	kvtd_pool_class_put(&P, cls);
}
END_TEST

/*
 * A restart: a second pool adopts the first one's memfd and claims the live slots back. Their
 * bytes are there, the accounts and usage match, a slot cannot be claimed twice or into a chunk
 * of another class, and what the new pool hands out afterwards is exactly the free room: every
 * hole and every untouched slot, never a live one.
 */
START_TEST(t_claim_rebuild)
{
	enum { N = 800, NB = 40 };
	struct kvtd_config cfg;
	struct kvtd_pool Q;
	struct kvtd_acct a1 = {0}, a2 = {0};
	int ca = kvtd_pool_class_get(&P, 3000), cb = kvtd_pool_class_get(&P, 40000), qa, qb, fd;
	void **sa = calloc(N, sizeof(void *)), *sb[NB], **fresh = calloc(4096, sizeof(void *));
	uint64_t *off_a = calloc(N, 8), off_b[NB], used_before;
	unsigned na = 0, nb = 0, live_a = 0, nf = 0;
	struct kvtd_pool_usage u;
	void *p;

	/* Interleaved allocations and frees leave holes in the chunks of both classes. */
	ck_assert_int_eq(kvtd_pool_alloc(&P, ca, N, &a1, NULL, sa), 0);
	ck_assert_int_eq(kvtd_pool_alloc(&P, cb, NB, &a2, NULL, sb), 0);
	for (unsigned i = 0; i < N; i += 3)
		kvtd_pool_free(&P, ca, 1, &a1, NULL, &sa[i]), sa[i] = NULL;
	for (unsigned i = 0; i < NB; i += 2)
		kvtd_pool_free(&P, cb, 1, &a2, NULL, &sb[i]), sb[i] = NULL;
	for (unsigned i = 0; i < N; i++)
		if (sa[i]) {
			memset(sa[i], (int)(i % 200 + 1), 3000);
			off_a[na++] = (uint64_t)((uint8_t *)sa[i] - P.base);
		}
	for (unsigned i = 0; i < NB; i++)
		if (sb[i]) {
			memset(sb[i], (int)(i + 100), 40000);
			off_b[nb++] = (uint64_t)((uint8_t *)sb[i] - P.base);
		}
	live_a = na;
	used_before = P.used_bytes;

	kvtd_config_defaults(&cfg);
	cfg.pool_size = P.size;
	cfg.lock = 0;
	cfg.numa_node = -1;
	fd = dup(P.fd);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(kvtd_pool_adopt(&Q, &cfg, NULL, fd, P.size - 4096, P.chunk_size, 0),
			 -EINVAL);
	ck_assert_int_eq(kvtd_pool_adopt(&Q, &cfg, NULL, fd, P.size, P.chunk_size, 0), 0);
	qa = kvtd_pool_class_get(&Q, 3000);
	qb = kvtd_pool_class_get(&Q, 40000);
	memset(&a1, 0, sizeof(a1));
	memset(&a2, 0, sizeof(a2));
	for (unsigned i = 0; i < na; i++) {
		ck_assert_int_eq(kvtd_pool_claim(&Q, qa, off_a[i], &a1, NULL, &p), 0);
		ck_assert_ptr_eq(p, Q.base + off_a[i]);
	}
	for (unsigned i = 0; i < nb; i++)
		ck_assert_int_eq(kvtd_pool_claim(&Q, qb, off_b[i], &a2, NULL, &p), 0);
	ck_assert_int_eq(kvtd_pool_claim(&Q, qa, off_a[0], &a1, NULL, &p), -EEXIST);
	ck_assert_int_eq(kvtd_pool_claim(&Q, qb, off_a[0] - off_a[0] % 40000, &a2, NULL, &p),
			 -EINVAL); /* a chunk of class a */
	ck_assert_int_eq(kvtd_pool_claim(&Q, qa, off_a[0] + 64, &a1, NULL, &p), -EINVAL);
	ck_assert_int_eq(kvtd_pool_claim(&Q, qa, Q.size, &a1, NULL, &p), -EINVAL);
	kvtd_pool_claim_done(&Q);
	ck_assert_uint_eq(Q.used_bytes, used_before);
	ck_assert_uint_eq(a1.bytes, (uint64_t)live_a * kvtd_pool_slot_size(&Q, qa));
	ck_assert_uint_eq(a2.bytes, (uint64_t)nb * kvtd_pool_slot_size(&Q, qb));
	for (unsigned i = 0; i < na; i++) {
		uint8_t *b = Q.base + off_a[i];

		ck_assert_uint_eq(b[0], b[2999]);
		ck_assert_uint_ne(b[0], 0);
	}
	/* Fill the rest with class a: nothing overlaps a live slot, and the room is all used. */
	kvtd_pool_usage(&Q, &u);
	while (nf < 4096 && kvtd_pool_alloc(&Q, qa, 1, NULL, NULL, &fresh[nf]) == 0)
		nf++;
	ck_assert_uint_lt(nf, 4096);
	{
		/* every 64-byte unit of the pool: owned by a live slot? */
		uint8_t *live = calloc(Q.size / 64, 1);
		unsigned overlaps = 0;

		for (unsigned j = 0; j < na; j++)
			memset(live + off_a[j] / 64, 1, 3008 / 64);
		for (unsigned j = 0; j < nb; j++)
			memset(live + off_b[j] / 64, 1, 40000 / 64);
		for (unsigned i = 0; i < nf; i++) {
			uint64_t o = (uint64_t)((uint8_t *)fresh[i] - Q.base);

			for (uint64_t k = o / 64; k < (o + 3008) / 64; k++)
				overlaps += live[k];
			memset(fresh[i], 0, 3008);
		}
		ck_assert_uint_eq(overlaps, 0);
		free(live);
	}
	for (unsigned i = 0; i < na; i++)
		ck_assert_uint_ne(Q.base[off_a[i]], 0); /* live rows untouched by the fill */
	{
		uint64_t slots_a = Q.chunk_size / kvtd_pool_slot_size(&Q, qa);
		uint64_t chunks_b = 0, expect;

		/* Chunks of class b stay b; every other chunk fills up with a. */
		for (uint32_t c = 0; c < Q.n_chunks; c++)
			for (unsigned j = 0; j < nb; j++)
				if (off_b[j] / Q.chunk_size == c) {
					chunks_b++;
					break;
				}
		expect = (Q.n_chunks - chunks_b) * slots_a - live_a;
		ck_assert_uint_eq(nf, expect);
	}
	kvtd_pool_free(&Q, qa, nf, NULL, NULL, fresh);
	for (unsigned i = 0; i < na; i++) {
		p = Q.base + off_a[i];
		kvtd_pool_free(&Q, qa, 1, &a1, NULL, &p);
	}
	for (unsigned i = 0; i < nb; i++) {
		p = Q.base + off_b[i];
		kvtd_pool_free(&Q, qb, 1, &a2, NULL, &p);
	}
	kvtd_pool_usage(&Q, &u);
	ck_assert_uint_eq(u.used, 0);
	ck_assert_uint_eq(u.chunks_free, Q.n_chunks);
	kvtd_pool_class_put(&Q, qa);
	kvtd_pool_class_put(&Q, qb);
	kvtd_pool_fini(&Q);
	/* P's own bookkeeping still holds its slots: give them back for teardown's sake. */
	for (unsigned i = 0; i < N; i++)
		if (sa[i])
			kvtd_pool_free(&P, ca, 1, NULL, NULL, &sa[i]);
	for (unsigned i = 0; i < NB; i++)
		if (sb[i])
			kvtd_pool_free(&P, cb, 1, NULL, NULL, &sb[i]);
	kvtd_pool_class_put(&P, ca);
	kvtd_pool_class_put(&P, cb);
	free(sa);
	free(off_a);
	free(fresh);
}
END_TEST

/* A /proc/meminfo field, or -1. */
static long long
meminfo(const char *key)
{
	char line[256];
	long long v = -1;
	FILE *f = fopen("/proc/meminfo", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, strlen(key)) && line[strlen(key)] == ':')
			v = atoll(line + strlen(key) + 1);
	fclose(f);
	return v;
}

/* hugetlb = auto: reserved huge pages back the pool exactly when enough are free for it;
 * otherwise it starts on THP or 4 KiB pages, and says which. */
static void
auto_pool(uint64_t size, int want_hugetlb)
{
	struct kvtd_config cfg;
	struct kvtd_pool p;

	kvtd_config_defaults(&cfg);
	ck_assert_int_eq(cfg.hugetlb, KVTD_HUGETLB_AUTO);
	cfg.pool_size = size;
	cfg.lock = 0;
	cfg.numa_node = -1;
	ck_assert_int_eq(kvtd_pool_init(&p, &cfg, NULL), 0);
	ck_assert_int_eq(p.hugetlb, want_hugetlb);
	if (want_hugetlb) {
		ck_assert_str_eq(p.backing, "hugetlb");
		ck_assert_uint_eq(p.page_kib, (unsigned)meminfo("Hugepagesize"));
	} else {
		ck_assert_msg(!strcmp(p.backing, "thp") || !strcmp(p.backing, "shmem"), "%s",
			      p.backing);
		ck_assert_uint_eq(p.page_kib, !strcmp(p.backing, "thp") ? 2048 : 4);
	}
	kvtd_pool_fini(&p);
}

START_TEST(t_hugetlb_auto)
{
	long long hp_kb = meminfo("Hugepagesize");
	long long free_hp = meminfo("HugePages_Free") - meminfo("HugePages_Rsvd");
	uint64_t hp = hp_kb > 0 ? (uint64_t)hp_kb << 10 : 2ull << 20;

	ck_assert_int_ge(meminfo("HugePages_Free"), 0);
	/* A pool of 4 huge pages (or 8 MiB): hugetlb exactly when 4 are free. */
	auto_pool(hp < (2ull << 20) ? 8ull << 20 : 4 * hp, hp_kb == 2048 && free_hp >= 4);
	/* One page more than every free one: never hugetlb (only where that stays small). */
	if (hp_kb == 2048 && free_hp < 64)
		auto_pool((uint64_t)(free_hp + 1) * hp, 0);
}
END_TEST

KVT_CHECK_MAIN("pool", 0, setup, teardown, t_classes, t_alloc_free_distinct, t_all_or_nothing,
	       t_chunks_return_across_classes, t_reuse_after_free, t_quota, t_bad_init,
	       t_memfd_shared, t_claim_rebuild, t_hugetlb_auto)
