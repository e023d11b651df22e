/* SPDX-License-Identifier: MIT */
/* The spill store's extent allocator (daemon/extent.h): exact sizes, alignment, coalescing,
 * fragmentation and exhaustion, and a random run against a plain array of units. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "extent.h"
#include "kvt_test.h"

START_TEST(t_exact_and_aligned)
{
	struct kvtd_ext_alloc a;
	uint64_t u, v, w;

	ck_assert_int_eq(kvtd_ext_init(&a, 1000), 0);
	ck_assert_uint_eq(a.free_units, 1000);
	ck_assert_uint_eq(kvtd_ext_largest(&a), 512);
	/* 768 units (a 3 MiB block of 4 KiB units) come from a 1024 block: 1000 units have none */
	ck_assert_int_eq(kvtd_ext_alloc(&a, 768, &u), -ENOSPC);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 512, &u), 0);
	/* 488 free units, in blocks of 256, 128, 64, 32 and 8: 488 needs a 512 block */
	ck_assert_uint_eq(a.free_units, 488);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 488, &v), -ENOSPC);
	ck_assert_uint_eq(kvtd_ext_largest(&a), 256);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 256, &v), 0);
	ck_assert_uint_eq(v, 512);
	kvtd_ext_fini(&a);
	/* from a 1024 block the 256 tail comes back at once */
	ck_assert_int_eq(kvtd_ext_init(&a, 1024), 0);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 768, &u), 0);
	ck_assert_uint_eq(u, 0);
	ck_assert_uint_eq(a.free_units, 256);
	ck_assert(kvtd_ext_is_free(&a, 768));
	ck_assert(!kvtd_ext_is_free(&a, 767));
	/* the freed tail serves the next request: first fit, lowest address */
	ck_assert_int_eq(kvtd_ext_alloc(&a, 3, &v), 0);
	ck_assert_uint_eq(v, 768);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 1, &w), 0);
	ck_assert_uint_eq(w, 771);
	ck_assert_int_eq(kvtd_ext_free(&a, u, 768), 0);
	ck_assert_int_eq(kvtd_ext_free(&a, v, 3), 0);
	ck_assert_int_eq(kvtd_ext_free(&a, w, 1), 0);
	/* all back as one block */
	ck_assert_uint_eq(kvtd_ext_largest(&a), 1024);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 1024, &u), 0);
	ck_assert_uint_eq(u, 0);
	kvtd_ext_fini(&a);
}
END_TEST

START_TEST(t_bad_free)
{
	struct kvtd_ext_alloc a;
	uint64_t u;

	ck_assert_int_eq(kvtd_ext_init(&a, 64), 0);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 8, &u), 0);
	ck_assert_int_eq(kvtd_ext_free(&a, u, 8), 0);
	ck_assert_int_eq(kvtd_ext_free(&a, u, 8), -EINVAL); /* twice */
	ck_assert_int_eq(kvtd_ext_alloc(&a, 8, &u), 0);
	ck_assert_int_eq(kvtd_ext_free(&a, u, 9), -EINVAL); /* one unit too many: left alone */
	ck_assert_uint_eq(a.free_units, 56);
	ck_assert_int_eq(kvtd_ext_free(&a, 60, 8), -EINVAL); /* out of the space */
	ck_assert_int_eq(kvtd_ext_free(&a, 0, 0), -EINVAL);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 0, &u), -EINVAL);
	ck_assert_int_eq(kvtd_ext_free(&a, 0, 8), 0);
	ck_assert_uint_eq(a.free_units, 64);
	kvtd_ext_fini(&a);
	ck_assert_int_eq(kvtd_ext_init(&a, 0), -EINVAL);
	ck_assert_int_eq(kvtd_ext_init(&a, (1ull << KVTD_EXT_MAX_ORDER) + 1), -EINVAL);
}
END_TEST

START_TEST(t_fragmentation_and_exhaustion)
{
	struct kvtd_ext_alloc a;
	enum { N = 4096 };
	uint64_t u[N];

	ck_assert_int_eq(kvtd_ext_init(&a, N), 0);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(kvtd_ext_alloc(&a, 1, &u[i]), 0);
		ck_assert_uint_eq(u[i], (uint64_t)i); /* first fit packs them */
	}
	ck_assert_int_eq(kvtd_ext_alloc(&a, 1, &u[0]), -ENOSPC);
	/* every other unit free: half the space, and not one run of 2 */
	for (int i = 0; i < N; i += 2)
		ck_assert_int_eq(kvtd_ext_free(&a, u[i], 1), 0);
	ck_assert_uint_eq(a.free_units, N / 2);
	ck_assert_uint_eq(kvtd_ext_largest(&a), 1);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 2, &u[0]), -ENOSPC);
	/* the rest frees, and the buddies merge back into one block */
	for (int i = 1; i < N; i += 2)
		ck_assert_int_eq(kvtd_ext_free(&a, u[i], 1), 0);
	ck_assert_uint_eq(kvtd_ext_largest(&a), N);
	ck_assert_int_eq(kvtd_ext_alloc(&a, N, &u[0]), 0);
	kvtd_ext_fini(&a);
}
END_TEST

/* Random sizes and frees against an array of units: no overlap, the count agrees, and all
 * freed the space is whole again, over a size that is no power of two. */
START_TEST(t_random_against_model)
{
	enum { N = 100003, LIVE = 512 };
	struct kvtd_ext_alloc a;
	uint8_t *used = calloc(N, 1);
	uint64_t start[LIVE], len[LIVE], s = 29, used_n = 0, u;
	int nospc = 0;

	memset(len, 0, sizeof(len));
	ck_assert_ptr_nonnull(used);
	ck_assert_int_eq(kvtd_ext_init(&a, N), 0);
	for (int it = 0; it < 50000; it++) {
		int slot = (int)(kvt_test_splitmix(&s) % LIVE);

		if (len[slot]) {
			ck_assert_int_eq(kvtd_ext_free(&a, start[slot], len[slot]), 0);
			for (uint64_t i = 0; i < len[slot]; i++)
				used[start[slot] + i] = 0;
			used_n -= len[slot];
			len[slot] = 0;
			continue;
		}
		/* mostly rows' pages, some blocks */
		uint64_t n = kvt_test_splitmix(&s) % 8 ? 1 + kvt_test_splitmix(&s) % 4
						       : 1 + kvt_test_splitmix(&s) % 1024;
		int r = kvtd_ext_alloc(&a, n, &u);

		if (r == -ENOSPC) {
			nospc++;
			continue;
		}
		ck_assert_int_eq(r, 0);
		ck_assert_uint_le(u + n, N);
		ck_assert_uint_eq(u % (1ull << (n == 1 ? 0 : 64 - __builtin_clzll(n - 1))), 0);
		for (uint64_t i = 0; i < n; i++) {
			ck_assert_msg(!used[u + i], "unit %llu handed out twice",
				      (unsigned long long)(u + i));
			used[u + i] = 1;
		}
		start[slot] = u;
		len[slot] = n;
		used_n += n;
		ck_assert_uint_eq(a.free_units, N - used_n);
		if (it % 997 == 0)
			for (uint64_t i = 0; i < N; i += 7)
				ck_assert_int_eq(kvtd_ext_is_free(&a, i), !used[i]);
	}
	for (int slot = 0; slot < LIVE; slot++)
		if (len[slot])
			ck_assert_int_eq(kvtd_ext_free(&a, start[slot], len[slot]), 0);
	ck_assert_uint_eq(a.free_units, N);
	ck_assert_uint_eq(kvtd_ext_largest(&a), 65536);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 65536, &u), 0);
	ck_assert_int_eq(kvtd_ext_alloc(&a, 32768, &u), 0);
	ck_assert_uint_eq(u, 65536);
	kvtd_ext_fini(&a);
	free(used);
	(void)nospc;
}
END_TEST

KVT_CHECK_MAIN("extent", 60, NULL, NULL, t_exact_and_aligned, t_bad_free,
	       t_fragmentation_and_exhaustion, t_random_against_model)
