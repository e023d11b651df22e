/* SPDX-License-Identifier: MIT */
/*
 * check_sketch - the int8 sketch (engine/sketch.h): its bound holds for every key and
 * query, so its top-k is the exact top-k of the rows (the list a full scan gives, ties to the
 * lower index) at every SIMD level, with dropped keys, non-finite keys, any query scale and
 * keys whose stored value changed; and it reads few rows doing so. Its 2-bit level's fast path
 * (kvt_sketch_topk_fast()) is the exact top-k when it scores every key, the same at every
 * level, finds what it is for, and keeps the edges (dropped, infinite and changed keys).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_abi.h"
#include "kvt_test.h"
#include "paris.h"
#include "quant.h"
#include "simd.h"
#include "sketch.h"
#include "srht.h"

#define MAXD 128

/* One zone: f32 keys (what get returns), their f16 rows, an index and a sketch of the rows. */
struct zone {
	unsigned int dim;
	uint32_t n;
	float *f32;
	uint16_t *f16;
	bool use_rows; /* offer rows (f16) or only get (f32) */
	struct kvt_srht srht;
	struct kvt_paris_index ix;
	struct kvt_sketch sk;
	struct kvt_paris_keys keys;
};

static const float *
z_get(void *ctx, uint32_t idx, float *tmp)
{
	const struct zone *z = ctx;

	(void)tmp;
	return z->f32 + (size_t)idx * z->dim;
}

static const void *
z_rows(void *ctx, uint32_t idx, uint32_t *ret_run)
{
	const struct zone *z = ctx;

	*ret_run = z->n - idx;
	return z->f16 + (size_t)idx * z->dim;
}

/* Keys with outlier channels (a few dims 10-30x the rest) and per-key scales over 1e-3..1e2 (inside
 * f16). */
static void
gen_keys(float *k, uint32_t n, unsigned int dim, uint64_t seed)
{
	for (uint32_t i = 0; i < n; i++) {
		float s = powf(10.0f, (float)(kvt_test_splitmix(&seed) % 6) - 3.0f) *
			  (i % 3 ? 1.0f : 0.01f);

		for (unsigned int j = 0; j < dim; j++) {
			float ch = j % 17 == 3 ? 25.0f : j % 29 == 5 ? 10.0f : 1.0f;

			k[(size_t)i * dim + j] = s * ch * kvt_test_lcg_gauss(&seed);
		}
	}
}

/* Build a zone over @keys (n x dim f32); rows are their f16 roundings, get returns those too
 * when @use_rows is false (so both read the same values). */
static void
zone_make(struct zone *z, const float *keys, uint32_t n, unsigned int dim, bool use_rows,
	  unsigned int page_keys)
{
	memset(z, 0, sizeof(*z));
	z->dim = dim;
	z->n = n;
	z->use_rows = use_rows;
	z->f32 = malloc((size_t)n * dim * sizeof(float));
	z->f16 = malloc((size_t)n * dim * sizeof(uint16_t));
	ck_assert(z->f32 && z->f16);
	for (size_t i = 0; i < (size_t)n * dim; i++) {
		z->f16[i] = kvt_f32_to_f16(keys[i]);
		z->f32[i] = kvt_f16_to_f32(z->f16[i]);
	}
	ck_assert_int_eq(kvt_srht_init(&z->srht, dim, KVT_SRHT_SEED), 0);
	ck_assert_int_eq(kvt_paris_index_init(&z->ix, dim, page_keys, NULL), 0);
	ck_assert_int_ge(kvt_paris_index_reserve(&z->ix, n), (int)n);
	ck_assert_int_eq(kvt_paris_index_append(&z->ix, &z->srht, z->f32, dim, n), (int)n);
	ck_assert_int_eq(kvt_sketch_init(&z->sk, dim, page_keys, NULL), 0);
	ck_assert_int_ge(kvt_sketch_reserve(&z->sk, n), (int)n);
	if (use_rows)
		ck_assert_int_eq(
		    kvt_sketch_append(&z->sk, z->f16, dim * sizeof(uint16_t), KVT_DTYPE_F16, n),
		    (int)n);
	else
		ck_assert_int_eq(
		    kvt_sketch_append(&z->sk, z->f32, dim * sizeof(float), KVT_DTYPE_F32, n),
		    (int)n);
	z->keys = (struct kvt_paris_keys){.get = z_get,
					  .ctx = z,
					  .rows = use_rows ? z_rows : NULL,
					  .dtype = KVT_DTYPE_F16,
					  .stride = dim * sizeof(uint16_t)};
}

static void
zone_free(struct zone *z)
{
	kvt_sketch_fini(&z->sk);
	kvt_paris_index_fini(&z->ix);
	free(z->f32);
	free(z->f16);
}

/* The exact top-k by a full scan of what the search reads, live keys only (@skip: also out). */
static uint32_t
brute(const struct zone *z, const struct kvt_paris_query *q, uint32_t k, const uint8_t *skip,
      uint32_t *ret_idx, float *ret_score)
{
	float *s = malloc(z->n * sizeof(float));
	uint32_t *idx = malloc(z->n * sizeof(uint32_t)), m = 0;

	ck_assert(s && idx);
	for (uint32_t i = 0; i < z->n; i++) {
		float d;

		if (z->ix.ndead && (z->ix.dead[i / 64] >> (i % 64) & 1))
			continue;
		if (skip && skip[i])
			continue;
		if (z->use_rows)
			kvt_simd_dot_rows(z->f16 + (size_t)i * z->dim, 0, 1, KVT_DTYPE_F16, q->x,
					  z->dim, &d);
		else
			kvt_simd_dot_rows(z->f32 + (size_t)i * z->dim, 0, 1, KVT_DTYPE_F32, q->x,
					  z->dim, &d);
		idx[m] = i;
		s[m++] = d;
	}
	if (k > m)
		k = m;
	if (k)
		kvt_paris_topk_select(idx, s, m, k, ret_idx, ret_score);
	free(s);
	free(idx);
	return k;
}

/* The sketch's answer equals the scan's, index for index and bit for bit. */
static uint32_t
check_same(struct zone *z, const float *qv, uint32_t k, const struct kvt_paris_drop *drop,
	   const uint8_t *skip, struct kvt_paris_scratch *scr)
{
	uint32_t gi[512], bi[512], nread = 0;
	float gs[512], bs[512];
	struct kvt_paris_query q;
	int got;
	uint32_t want;

	ck_assert_uint_le(k, 512);
	kvt_paris_query_prep(&z->srht, qv, &q);
	got = kvt_sketch_topk(&z->sk, &z->ix, &q, k, &z->keys, drop, scr, gi, gs, &nread);
	want = brute(z, &q, k, skip, bi, bs);
	ck_assert_int_eq(got, (int)want);
	for (uint32_t i = 0; i < want; i++) {
		ck_assert_msg(gi[i] == bi[i], "rank %u: sketch %u (%.9g), scan %u (%.9g)", i, gi[i],
			      (double)gs[i], bi[i], (double)bs[i]);
		ck_assert_msg(memcmp(&gs[i], &bs[i], sizeof(float)) == 0 ||
				  (isnan(gs[i]) && isnan(bs[i])),
			      "rank %u: score %.9g vs %.9g", i, (double)gs[i], (double)bs[i]);
	}
	return nread;
}

/* Queries: gaussian, aligned with one key, concentrated on one dim, and a key's negation. */
static void
make_query(float *qv, unsigned int dim, const struct zone *z, uint32_t t, uint64_t *seed)
{
	for (unsigned int j = 0; j < dim; j++)
		qv[j] = kvt_test_lcg_gauss(seed);
	if (t % 4 == 1)
		memcpy(qv, z->f32 + (size_t)(t * 7919 % z->n) * dim, dim * sizeof(float));
	if (t % 4 == 2)
		for (unsigned int j = 0; j < dim; j++)
			qv[j] = j == t % dim ? 1.0f : 1e-3f * qv[j];
	if (t % 4 == 3)
		for (unsigned int j = 0; j < dim; j++)
			qv[j] = -z->f32[(size_t)(t * 104729 % z->n) * dim + j];
}

/* Exact at every SIMD level, both dims, rows or get, page tails not a multiple of 16. */
START_TEST(test_exact_every_level)
{
	static const unsigned int dims[2] = {64, 128};
	const uint32_t n = 5003, k = 100;
	uint64_t seed = 11;

	for (int di = 0; di < 2; di++) {
		unsigned int dim = dims[di];
		float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
		struct kvt_paris_scratch scr = {0};

		ck_assert(keys);
		gen_keys(keys, n, dim, 100 + di);
		for (int rows = 0; rows < 2; rows++) {
			struct zone z;

			zone_make(&z, keys, n, dim, rows, 1024);
			for (int lv = KVT_SIMD_SCALAR; lv <= KVT_SIMD_AVX512; lv++) {
				uint32_t reads = 0;

				if (kvt_simd_cap((enum kvt_simd)lv) != (enum kvt_simd)lv)
					continue;
				for (uint32_t t = 0; t < 24; t++) {
					make_query(qv, dim, &z, t, &seed);
					reads +=
					    check_same(&z, qv, t % 3 ? k : 1 + t, NULL, NULL, &scr);
				}
				/* the point of the bound: far fewer rows than keys */
				ck_assert_msg(reads < 24 * n / 4, "read %u rows of %u", reads,
					      24 * n);
			}
			kvt_simd_cap(KVT_SIMD_AVX512);
			zone_free(&z);
		}
		kvt_paris_scratch_fini(&scr);
		free(keys);
	}
}
END_TEST

/* Many equal keys: the scan's tie order (lower index first) comes back. */
START_TEST(test_ties)
{
	const unsigned int dim = 64;
	const uint32_t n = 3000;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	struct kvt_paris_scratch scr = {0};
	uint64_t seed = 5;
	struct zone z;

	ck_assert(keys);
	gen_keys(keys, 40, dim, 3);
	for (uint32_t i = 40; i < n; i++) /* 40 distinct keys, repeated */
		memcpy(keys + (size_t)i * dim, keys + (size_t)(i % 40) * dim, dim * sizeof(float));
	zone_make(&z, keys, n, dim, true, 0);
	for (uint32_t t = 0; t < 8; t++) {
		make_query(qv, dim, &z, t, &seed);
		check_same(&z, qv, 200, NULL, NULL, &scr);
	}
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

static bool
drop_every_third(void *ctx, uint32_t idx)
{
	(void)ctx;
	return idx % 3 == 0;
}

/* Dropped keys and a caller's drop filter are never read or returned; min(k, live) come back. */
START_TEST(test_dropped)
{
	const unsigned int dim = 128;
	const uint32_t n = 4096;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	uint8_t *skip = calloc(n, 1);
	struct kvt_paris_scratch scr = {0};
	const struct kvt_paris_drop drop = {drop_every_third, NULL};
	uint64_t seed = 9;
	struct zone z;

	ck_assert(keys && skip);
	gen_keys(keys, n, dim, 21);
	zone_make(&z, keys, n, dim, true, 512);
	for (uint32_t i = 0; i < n; i++) /* 99 % dropped, the best keys first */
		if (i % 100)
			ck_assert_int_eq(kvt_paris_index_drop(&z.ix, i), 1);
	for (uint32_t t = 0; t < 8; t++) {
		make_query(qv, dim, &z, t, &seed);
		ck_assert_uint_le(check_same(&z, qv, 100, NULL, NULL, &scr), 41);
	}
	for (uint32_t i = 0; i < n; i++)
		skip[i] = i % 3 == 0;
	for (uint32_t t = 0; t < 4; t++) { /* 41 live, 27 of them not filtered: 27 results */
		make_query(qv, dim, &z, t, &seed);
		check_same(&z, qv, 100, &drop, skip, &scr);
	}
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(skip);
	free(keys);
}
END_TEST

/* A key with inf or NaN is always read (its bound is infinite) and ranks as the scan ranks it. */
START_TEST(test_nonfinite_keys)
{
	const unsigned int dim = 64;
	const uint32_t n = 2048;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	struct kvt_paris_scratch scr = {0};
	uint64_t seed = 2;
	struct zone z;

	ck_assert(keys);
	gen_keys(keys, n, dim, 8);
	keys[(size_t)17 * dim + 3] = INFINITY;
	keys[(size_t)900 * dim + 0] = NAN;
	keys[(size_t)901 * dim + 5] = -INFINITY;
	zone_make(&z, keys, n, dim, false, 0);
	for (uint32_t t = 0; t < 8; t++) {
		make_query(qv, dim, &z, t, &seed);
		check_same(&z, qv, 50, NULL, NULL, &scr);
	}
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

/* Through kvt_paris_search(): positions do not depend on the query's scale (1e-30 .. 1e19). */
START_TEST(test_query_scale)
{
	const unsigned int dim = 128;
	const uint32_t n = 6000, k = 64;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD], qs[MAXD];
	struct kvt_paris_scratch scr = {0};
	uint64_t seed = 4;
	struct zone z;

	ck_assert(keys);
	gen_keys(keys, n, dim, 31);
	zone_make(&z, keys, n, dim, false, 0); /* no rows: kvt_paris_sketch_pays() always */
	for (uint32_t t = 0; t < 6; t++) {
		static const float scale[3] = {1.0f, 1e19f, 1e-30f};
		uint32_t first[64];

		make_query(qv, dim, &z, t, &seed);
		for (int si = 0; si < 3; si++) {
			struct kvt_paris_search_opts so = {
			    .k = k, .refine = 4 * k, .keys = &z.keys, .sketch = &z.sk};
			struct kvt_paris_query q;
			uint32_t got[64];
			float sc[64];

			for (unsigned int j = 0; j < dim; j++)
				qs[j] = qv[j] * scale[si];
			kvt_paris_query_prep(&z.srht, qs, &q);
			ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, got, sc), (int)k);
			for (uint32_t i = 0; i < k; i++)
				ck_assert(!isnan(sc[i]));
			if (!si)
				memcpy(first, got, sizeof(first));
			else
				ck_assert_mem_eq(first, got, sizeof(first));
		}
		check_same(&z, qv, k, NULL, NULL, &scr);
	}
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

/* A key whose stored value changed must be re-encoded: without kvt_sketch_set() the bound is
 * about the old value and the changed key, now the best, is missed; with it the answer is the
 * scan's again. */
START_TEST(test_set_after_change)
{
	const unsigned int dim = 64;
	const uint32_t n = 4000;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	struct kvt_paris_scratch scr = {0};
	struct kvt_paris_query q;
	uint32_t gi[20];
	float gs[20];
	uint64_t seed = 77;
	struct zone z;

	ck_assert(keys);
	gen_keys(keys, n, dim, 12);
	zone_make(&z, keys, n, dim, false, 0);
	make_query(qv, dim, &z, 0, &seed);
	kvt_paris_query_prep(&z.srht, qv, &q);
	/* key 1234 becomes a large multiple of the query: the best score by far */
	for (unsigned int j = 0; j < dim; j++)
		z.f32[(size_t)1234 * dim + j] = 1e8f * q.x[j];
	ck_assert_int_eq(kvt_sketch_topk(&z.sk, &z.ix, &q, 20, &z.keys, NULL, &scr, gi, gs, NULL),
			 20);
	for (uint32_t i = 0; i < 20; i++)
		ck_assert_uint_ne(gi[i], 1234); /* stale: the old value's bound kept it out */
	ck_assert_int_eq(kvt_sketch_set(&z.sk, 1234, z.f32 + (size_t)1234 * dim), 0);
	ck_assert_int_eq(kvt_sketch_set(&z.sk, n, z.f32), -ERANGE);
	check_same(&z, qv, 20, NULL, NULL, &scr);
	ck_assert_int_eq(kvt_sketch_topk(&z.sk, &z.ix, &q, 20, &z.keys, NULL, &scr, gi, gs, NULL),
			 20);
	ck_assert_uint_eq(gi[0], 1234);
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

/*
 * The bound itself, read off the stored pages (layout in sketch.h): for adversarial keys (one
 * huge element, subnormal values, mixed magnitudes) and queries, |fl(<x, v>) - e| <= t, e formed
 * as the search forms it from the int16 query.
 */
START_TEST(test_bound_holds)
{
	const unsigned int dim = 128;
	const uint32_t n = 2048;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	uint64_t seed = 99;
	struct zone z;

	ck_assert(keys);
	gen_keys(keys, n, dim, 41);
	for (uint32_t i = 0; i < n; i += 7) /* one element dominating */
		keys[(size_t)i * dim + i % dim] = 3e4f;
	for (uint32_t i = 3; i < n; i += 11) /* subnormal in f16 */
		for (unsigned int j = 0; j < dim; j++)
			keys[(size_t)i * dim + j] = 1e-7f * kvt_test_lcg_gauss(&seed);
	zone_make(&z, keys, n, dim, true, 256);
	for (uint32_t t = 0; t < 16; t++) {
		struct kvt_paris_query q;
		int16_t xq[MAXD];
		float xm = 0.0f, sx;

		make_query(qv, dim, &z, t, &seed);
		kvt_paris_query_prep(&z.srht, qv, &q);
		for (unsigned int j = 0; j < dim; j++)
			xm = fmaxf(xm, fabsf(q.x[j]));
		sx = xm / 16256.0f; /* the search's integer query range */
		for (unsigned int j = 0; j < dim; j++)
			xq[j] = (int16_t)lrintf(q.x[j] / sx);
		for (uint32_t i = 0; i < n; i++) {
			const uint8_t *pg = z.sk.pages[i >> z.sk.page_shift];
			uint32_t off = i & (z.sk.page_keys - 1);
			const uint8_t *c = pg + (size_t)off * dim; /* offset by 128 */
			const float *scale = (const float *)(pg + (size_t)z.sk.page_keys * dim);
			const float *tol = scale + z.sk.page_keys;
			int32_t acc = 0;
			float d, e;

			for (unsigned int j = 0; j < dim; j++)
				acc += ((int32_t)c[j] - 128) * xq[j];
			e = (sx * scale[off]) * (float)acc;
			kvt_simd_dot_rows(z.f16 + (size_t)i * dim, 0, 1, KVT_DTYPE_F16, q.x, dim,
					  &d);
			ck_assert_msg(fabs((double)d - (double)e) <= (double)tol[off],
				      "key %u: exact %.9g estimate %.9g tolerance %.9g", i,
				      (double)d, (double)e, (double)tol[off]);
		}
	}
	zone_free(&z);
	free(keys);
}
END_TEST

/* A key encodes to the same bytes at every SIMD level: zero, subnormal, huge, non-finite and
 * ordinary keys alike; and a subnormal key's residual is not lost to underflow (its bound
 * holds: it is the whole key). */
START_TEST(test_encode_every_level)
{
	const unsigned int dim = 128;
	const uint32_t n = 256;
	float *keys = malloc((size_t)n * dim * sizeof(float));
	struct kvt_sketch ref, sk;
	uint64_t seed = 13;

	ck_assert(keys);
	gen_keys(keys, n, dim, 17);
	memset(keys, 0, dim * sizeof(float));	 /* key 0: zero */
	for (unsigned int j = 0; j < dim; j++) { /* key 1: subnormal f32 */
		keys[dim + j] = 1e-40f * kvt_test_lcg_gauss(&seed);
		keys[2 * dim + j] = j == 7 ? 3e38f : 1.0f; /* key 2: one huge element */
	}
	keys[3 * dim + 5] = INFINITY; /* key 3 */
	keys[4 * dim + 9] = NAN;      /* key 4 */
	keys[5 * dim] = 1e-45f;	      /* key 5: one denormal, the rest zero */
	memset(keys + 5 * dim + 1, 0, (dim - 1) * sizeof(float));
	for (int lv = KVT_SIMD_SCALAR; lv <= KVT_SIMD_AVX512; lv++) {
		struct kvt_sketch *t = lv == KVT_SIMD_SCALAR ? &ref : &sk;

		if (kvt_simd_cap((enum kvt_simd)lv) != (enum kvt_simd)lv)
			continue;
		ck_assert_int_eq(kvt_sketch_init(t, dim, 256, NULL), 0);
		ck_assert_int_ge(kvt_sketch_reserve(t, n), (int)n);
		ck_assert_int_eq(kvt_sketch_append(t, keys, dim * sizeof(float), KVT_DTYPE_F32, n),
				 (int)n);
		if (t == &sk) {
			ck_assert_msg(memcmp(ref.pages[0], sk.pages[0], ref.page_bytes) == 0,
				      "level %s encodes differently", kvt_simd_name(lv));
			kvt_sketch_fini(&sk);
		}
	}
	kvt_simd_cap(KVT_SIMD_AVX512);
	{
		const float *scale = (const float *)((const uint8_t *)ref.pages[0] + 256 * dim);
		const float *tol = scale + 256;
		double norm = 0.0;

		for (unsigned int j = 0; j < dim; j++)
			norm += (double)keys[dim + j] * keys[dim + j];
		ck_assert(tol[0] == 0.0f);		   /* a zero key is exact */
		ck_assert(tol[1] >= (float)sqrt(norm));	   /* subnormal: all residual */
		ck_assert(tol[1] > 0.0f && tol[5] > 0.0f); /* not lost to underflow */
		ck_assert(isinf(tol[3]) && isinf(tol[4])); /* always read */
		ck_assert(tol[2] < INFINITY && scale[2] > 0.0f);
	}
	kvt_sketch_fini(&ref);
	free(keys);
}
END_TEST

static const float *
get_fails(void *ctx, uint32_t idx, float *tmp)
{
	(void)ctx;
	(void)idx;
	(void)tmp;
	return NULL;
}

/* A key the caller cannot read (get returns NULL) fails the search with -EIO, through the engine
 * and alone; the same zone answers again once its keys can be read. */
START_TEST(test_unreadable_key)
{
	const unsigned int dim = 64;
	const uint32_t n = 2048;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	struct kvt_paris_scratch scr = {0};
	struct kvt_paris_query q;
	uint32_t gi[16];
	float gs[16];
	uint64_t seed = 3;
	struct zone z;

	ck_assert(keys);
	gen_keys(keys, n, dim, 5);
	zone_make(&z, keys, n, dim, false, 0);
	make_query(qv, dim, &z, 0, &seed);
	kvt_paris_query_prep(&z.srht, qv, &q);
	z.keys.get = get_fails;
	ck_assert_int_eq(kvt_sketch_topk(&z.sk, &z.ix, &q, 16, &z.keys, NULL, &scr, gi, gs, NULL),
			 -EIO);
	{
		struct kvt_paris_search_opts so = {
		    .k = 16, .refine = 64, .keys = &z.keys, .sketch = &z.sk};

		ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, gi, gs), -EIO);
	}
	/* the fast path reads its candidates' keys too: fails alone, with -EIO */
	ck_assert_int_eq(
	    kvt_sketch_topk_fast(&z.sk, &z.ix, &q, 16, 16, 0, &z.keys, NULL, &scr, gi, gs, NULL),
	    -EIO);
	z.keys.get = z_get;
	check_same(&z, qv, 16, NULL, NULL, &scr);
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

/* ---- the fast path (kvt_sketch_topk_fast()): the 2-bit level chooses whom to score ---------- */

/* The fast path's answer: @got results, returned as the exact scores of the keys they name. */
static int
fast(struct zone *z, const float *qv, uint32_t k, uint32_t cand, const struct kvt_paris_drop *drop,
     struct kvt_paris_scratch *scr, uint32_t *gi, float *gs)
{
	struct kvt_paris_query q;
	uint32_t nread = 0;
	int r;

	kvt_paris_query_prep(&z->srht, qv, &q);
	r = kvt_sketch_topk_fast(&z->sk, &z->ix, &q, k, cand, 0, &z->keys, drop, scr, gi, gs,
				 &nread);
	if (r >= 0)
		ck_assert_uint_le(nread, cand);
	return r;
}

/* With C >= the live keys every key is scored: the exact top-k, the scan's list, at every
 * level, both dims, rows or get, with dropped keys and a drop filter. */
START_TEST(test_fast_all_is_exact)
{
	static const unsigned int dims[2] = {64, 128};
	const uint32_t n = 3001;
	uint64_t seed = 41;

	for (int di = 0; di < 2; di++) {
		unsigned int dim = dims[di];
		float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
		uint8_t *skip = calloc(n, 1);
		struct kvt_paris_scratch scr = {0};
		const struct kvt_paris_drop drop = {drop_every_third, NULL};

		ck_assert(keys && skip);
		gen_keys(keys, n, dim, 300 + di);
		for (int rows = 0; rows < 2; rows++) {
			struct zone z;

			zone_make(&z, keys, n, dim, rows, 512);
			for (uint32_t i = 0; i < n; i += 7) /* a seventh dropped */
				ck_assert_int_eq(kvt_paris_index_drop(&z.ix, i), 1);
			for (int lv = KVT_SIMD_SCALAR; lv <= KVT_SIMD_AVX512; lv++) {
				if (kvt_simd_cap((enum kvt_simd)lv) != (enum kvt_simd)lv)
					continue;
				for (uint32_t t = 0; t < 8; t++) {
					uint32_t gi[100], bi[100];
					float gs[100], bs[100];
					struct kvt_paris_query q;
					int got, want;

					make_query(qv, dim, &z, t, &seed);
					kvt_paris_query_prep(&z.srht, qv, &q);
					for (uint32_t i = 0; i < n; i++)
						skip[i] = t % 2 && i % 3 == 0;
					got = fast(&z, qv, 100, n, t % 2 ? &drop : NULL, &scr, gi,
						   gs);
					want = (int)brute(&z, &q, 100, skip, bi, bs);
					ck_assert_int_eq(got, want);
					ck_assert_mem_eq(gi, bi, (size_t)want * sizeof(uint32_t));
					ck_assert_mem_eq(gs, bs, (size_t)want * sizeof(float));
				}
			}
			kvt_simd_cap(KVT_SIMD_AVX512);
			zone_free(&z);
		}
		kvt_paris_scratch_fini(&scr);
		free(skip);
		free(keys);
	}
}
END_TEST

/* The 2-bit level's estimates are integers and one fused multiply-add: every level chooses the
 * same candidates, so returns the same list. */
START_TEST(test_fast_levels_agree)
{
	const unsigned int dim = 128;
	const uint32_t n = 6007, k = 50;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	struct kvt_paris_scratch scr = {0};
	uint64_t seed = 13;
	struct zone z;

	ck_assert(keys);
	gen_keys(keys, n, dim, 77);
	zone_make(&z, keys, n, dim, true, 1024);
	for (uint32_t t = 0; t < 12; t++) {
		uint32_t g0[50], g1[50];
		float s0[50], s1[50];

		make_query(qv, dim, &z, t, &seed);
		kvt_simd_cap(KVT_SIMD_SCALAR);
		ck_assert_int_eq(fast(&z, qv, k, 4 * k, NULL, &scr, g0, s0), (int)k);
		kvt_simd_cap(KVT_SIMD_AVX512);
		ck_assert_int_eq(fast(&z, qv, k, 4 * k, NULL, &scr, g1, s1), (int)k);
		ck_assert_mem_eq(g0, g1, sizeof(g0));
		ck_assert_mem_eq(s0, s1, sizeof(s0));
	}
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

/*
 * What the level is for: keys that share a large common component (outlier channels, a mean
 * 40x the spread) and 24 planted keys near the query, spread over the pages. With C = 4k the
 * fast path returns all 24 first; it cannot when the signs carry the common component (no
 * centring) or the estimate's sign is wrong.
 */
START_TEST(test_fast_finds_planted)
{
	const unsigned int dim = 64;
	const uint32_t n = 20000, k = 24;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD], mean[MAXD];
	struct kvt_paris_scratch scr = {0};
	uint64_t seed = 99;
	struct zone z;

	ck_assert(keys);
	for (unsigned int j = 0; j < dim; j++)
		mean[j] = 40.0f * kvt_test_lcg_gauss(&seed);
	for (uint32_t i = 0; i < n; i++)
		for (unsigned int j = 0; j < dim; j++)
			keys[(size_t)i * dim + j] = mean[j] + kvt_test_lcg_gauss(&seed);
	for (uint32_t t = 0; t < 6; t++) {
		uint32_t gi[24], planted[24];
		float gs[24];

		for (unsigned int j = 0; j < dim; j++)
			qv[j] = kvt_test_lcg_gauss(&seed);
		if (t)
			zone_free(&z);
		for (uint32_t p = 0; p < k; p++) { /* mean + 3 sigma along the query, + noise */
			float qn = 0.0f;

			planted[p] = (p * 7919u + t * 104729u) % n;
			for (unsigned int j = 0; j < dim; j++)
				qn += qv[j] * qv[j];
			for (unsigned int j = 0; j < dim; j++)
				keys[(size_t)planted[p] * dim + j] =
				    mean[j] + 3.0f * qv[j] / sqrtf(qn) * sqrtf((float)dim) / 2.0f +
				    0.3f * kvt_test_lcg_gauss(&seed);
		}
		zone_make(&z, keys, n, dim, true, 4096);
		ck_assert_int_eq(fast(&z, qv, k, 4 * k, NULL, &scr, gi, gs), (int)k);
		for (uint32_t p = 0; p < k; p++) {
			bool found = false;

			for (uint32_t i = 0; i < k; i++)
				found |= gi[i] == planted[p];
			ck_assert_msg(found, "query %u: planted key %u not returned", t,
				      planted[p]);
		}
		for (uint32_t p = 0; p < k; p++) /* back to ordinary keys */
			for (unsigned int j = 0; j < dim; j++)
				keys[(size_t)planted[p] * dim + j] =
				    mean[j] + kvt_test_lcg_gauss(&seed);
	}
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

/* At 99 % dropped, min(k, live) results, none dropped; an infinite key is always a candidate
 * (as the int8 level always reads it); a changed key is found once kvt_sketch_set() re-encodes
 * it, and the stored sign code is then that of the new value. */
START_TEST(test_fast_edges)
{
	const unsigned int dim = 128;
	const uint32_t n = 8192;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	struct kvt_paris_scratch scr = {0};
	struct kvt_paris_query q;
	uint32_t gi[100];
	float gs[100], f0, f1;
	uint8_t b0[32], b1[32];
	const float *c;
	uint64_t seed = 3;
	struct zone z;
	int r;

	ck_assert(keys);
	gen_keys(keys, n, dim, 5);
	keys[(size_t)5000 * dim + 9] = INFINITY;
	zone_make(&z, keys, n, dim, false, 0);
	for (unsigned int j = 0; j < dim; j++)
		qv[j] = j == 9 ? 1.0f : 0.01f * kvt_test_lcg_gauss(&seed);
	ck_assert_int_eq(fast(&z, qv, 10, 10, NULL, &scr, gi, gs), 10);
	ck_assert_uint_eq(gi[0], 5000);
	ck_assert(gs[0] == INFINITY);

	/* a changed key: the best by far once re-encoded */
	make_query(qv, dim, &z, 0, &seed);
	kvt_paris_query_prep(&z.srht, qv, &q);
	for (unsigned int j = 0; j < dim; j++)
		z.f32[(size_t)777 * dim + j] = 1e6f * q.x[j];
	ck_assert_int_eq(kvt_sketch_set(&z.sk, 777, z.f32 + (size_t)777 * dim), 0);
	ck_assert_int_eq(kvt_sketch_sign_code(&z.sk, 777, NULL, b0, &f0, &c), 0);
	ck_assert_int_eq(kvt_sketch_sign_code(&z.sk, 777, z.f32 + (size_t)777 * dim, b1, &f1, &c),
			 0);
	ck_assert_mem_eq(b0, b1, sizeof(b0));
	ck_assert(f0 == f1 && f0 > 0.0f);
	ck_assert_int_eq(kvt_sketch_sign_code(&z.sk, n, NULL, b0, &f0, &c), -ERANGE);
	ck_assert_int_eq(fast(&z, qv, 10, 40, NULL, &scr, gi, gs), 10);
	ck_assert_uint_eq(gi[0], 777);

	for (uint32_t i = 0; i < n; i++) /* 82 live of 8192 */
		if (i % 100)
			ck_assert_int_eq(kvt_paris_index_drop(&z.ix, i), 1);
	for (uint32_t t = 0; t < 4; t++) {
		make_query(qv, dim, &z, t, &seed);
		r = fast(&z, qv, 100, 200, NULL, &scr, gi, gs);
		ck_assert_int_eq(r, 82);
		for (int i = 0; i < r; i++)
			ck_assert_uint_eq(gi[i] % 100, 0);
	}
	ck_assert_int_eq(fast(&z, qv, 100, 99, NULL, &scr, gi, gs), -EINVAL);
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* The candidate set with and without the sampled first bar, sorted: they must be equal. */
static void
cands_agree(struct zone *z, const float *qv, uint32_t cand, const struct kvt_paris_drop *drop,
	    struct kvt_paris_scratch *scr, uint32_t *a, uint32_t *b, uint32_t want)
{
	struct kvt_paris_query q;
	int na, nb;

	kvt_paris_query_prep(&z->srht, qv, &q);
	na = kvt_sketch_fast_cands(&z->sk, &z->ix, q.x, cand, 0, drop, true, scr, a);
	nb = kvt_sketch_fast_cands(&z->sk, &z->ix, q.x, cand, 0, drop, false, scr, b);
	ck_assert_int_eq(na, (int)want);
	ck_assert_int_eq(nb, (int)want);
	qsort(a, want, sizeof(*a), cmp_u32);
	qsort(b, want, sizeof(*b), cmp_u32);
	ck_assert_mem_eq(a, b, want * sizeof(*a));
}

/*
 * The first bar comes from a sample of the zone; the candidates may not depend on it. A
 * drifting zone (later keys ever closer to the query: the order that made the bar start at
 * -inf costly), every level, both dims, dropped keys and a drop filter, C from 50 to 3,000
 * (sampled from 777 on).
 */
START_TEST(test_fast_sample_same_set)
{
	static const unsigned int dims[2] = {64, 128};
	static const uint32_t cands[4] = {50, 200, 777, 3000};
	const uint32_t n = 60000;
	const struct kvt_paris_drop drop = {drop_every_third, NULL};
	uint32_t *a = malloc(3000 * sizeof(*a)), *b = malloc(3000 * sizeof(*b));
	uint64_t seed = 5;

	ck_assert(a && b);
	for (int di = 0; di < 2; di++) {
		const unsigned int dim = dims[di];
		float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD], u[MAXD];
		struct kvt_paris_scratch scr = {0};
		struct zone z;

		ck_assert(keys);
		for (unsigned int j = 0; j < dim; j++)
			u[j] = kvt_test_lcg_gauss(&seed);
		for (uint32_t i = 0; i < n; i++)
			for (unsigned int j = 0; j < dim; j++)
				keys[(size_t)i * dim + j] =
				    kvt_test_lcg_gauss(&seed) + 3.0f * (float)i / (float)n * u[j];
		zone_make(&z, keys, n, dim, true, 1024);
		for (uint32_t i = 0; i < n; i += 11)
			ck_assert_int_eq(kvt_paris_index_drop(&z.ix, i), 1);
		for (int lv = KVT_SIMD_SCALAR; lv <= KVT_SIMD_AVX512; lv++) {
			if (kvt_simd_cap((enum kvt_simd)lv) != (enum kvt_simd)lv)
				continue;
			for (uint32_t t = 0; t < 8; t++) {
				for (unsigned int j = 0; j < dim; j++)
					qv[j] = u[j] + 0.5f * kvt_test_lcg_gauss(&seed);
				cands_agree(&z, qv, cands[t % 4], t % 2 ? &drop : NULL, &scr, a, b,
					    cands[t % 4]);
			}
		}
		kvt_simd_cap(KVT_SIMD_AVX512);
		zone_free(&z);
		kvt_paris_scratch_fini(&scr);
		free(keys);
	}
	free(a);
	free(b);
}
END_TEST

/*
 * A sample that overrates the zone: the first group (which every sample holds) is the 64 best
 * keys and nothing else comes near, and the sample (10 groups for C = 1,000 of 40,000 keys)
 * ranks its 64th best as the bar, which only those 64 pass. The zone must be scanned again
 * from -inf (fails without the rescan: 63 candidates).
 */
START_TEST(test_fast_sample_too_high)
{
	const unsigned int dim = 128;
	const uint32_t n = 40000;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	static uint32_t a[1000], b[1000];
	struct kvt_paris_scratch scr = {0};
	uint64_t seed = 8;
	struct zone z;

	ck_assert(keys);
	for (unsigned int j = 0; j < dim; j++)
		qv[j] = kvt_test_lcg_gauss(&seed);
	for (uint32_t i = 0; i < n; i++)
		for (unsigned int j = 0; j < dim; j++)
			keys[(size_t)i * dim + j] =
			    kvt_test_lcg_gauss(&seed) + (i < 64 ? 2.0f * qv[j] : 0.0f);
	zone_make(&z, keys, n, dim, true, 1024);
	cands_agree(&z, qv, 1000, NULL, &scr, a, b, 1000);
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

/* ---- probing (kvt_sketch_topk_fast() with probe): only the best groups are scanned -------- */

#define PG 64 /* keys a group */

/* kvt_sketch_fast_cands() with @probe, sorted */
static int
probe_cands(const struct kvt_sketch *sk, const struct zone *z, const float *qv, uint32_t cand,
	    uint32_t probe, const struct kvt_paris_drop *drop, struct kvt_paris_scratch *scr,
	    uint32_t *ret)
{
	struct kvt_paris_query q;
	int r;

	kvt_paris_query_prep(&z->srht, qv, &q);
	r = kvt_sketch_fast_cands(sk, &z->ix, q.x, cand, probe, drop, false, scr, ret);
	if (r > 0)
		qsort(ret, (size_t)r, sizeof(*ret), cmp_u32);
	return r;
}

/* whether every one of @n keys lies in group @g */
static bool
all_in_group(const uint32_t *idx, int n, uint32_t g)
{
	for (int i = 0; i < n; i++)
		if (idx[i] / PG != g)
			return false;
	return true;
}

static bool
drop_group_150(void *ctx, uint32_t idx)
{
	(void)ctx;
	return idx / PG == 150;
}

/*
 * Groups are ranked by their means (64-key groups at dim 128, 16-key ones at 64): with two
 * planted 64-key runs (37 far ahead of 150) a probe of 64 keys scans run 37 alone, of 128 both,
 * at every level, both dims, pages of 64 and of 1,024 keys; the answer is then the exact top-k of
 * what was scanned. Evicted keys do not count toward the probe (a dead group is passed over, a
 * half-dead one needs a second), a drop filter that empties the probed groups falls back to the
 * whole zone, and a group with a key that is not finite is always scanned.
 */
START_TEST(test_probe_groups)
{
	static const unsigned int dims[2] = {64, 128};
	static const unsigned int pages[2] = {64, 1024};
	const uint32_t n = 200 * PG, k = 10;
	const struct kvt_paris_drop drop150 = {drop_group_150, NULL};
	static uint32_t a[256], b[256], c0[64], bi[16];
	uint64_t seed = 77;

	for (int di = 0; di < 4; di++) {
		const unsigned int dim = dims[di % 2];
		float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD], qr[MAXD], u[MAXD],
		      bs[16];
		struct kvt_paris_scratch scr = {0};
		struct kvt_paris_query q;
		uint32_t gi[16];
		float gs[16];
		struct zone z;
		int r;

		ck_assert(keys);
		for (unsigned int j = 0; j < dim; j++)
			u[j] = kvt_test_lcg_gauss(&seed);
		for (uint32_t i = 0; i < n; i++)
			for (unsigned int j = 0; j < dim; j++)
				keys[(size_t)i * dim + j] =
				    kvt_test_lcg_gauss(&seed) + (i / PG == 37	 ? 3.0f
								 : i / PG == 150 ? 1.5f
										 : 0.0f) *
								    u[j];
		zone_make(&z, keys, n, dim, true, pages[di / 2]);
		for (unsigned int j = 0; j < dim; j++) {
			qv[j] = u[j] + 0.3f * kvt_test_lcg_gauss(&seed);
			qr[j] = kvt_test_lcg_gauss(&seed);
		}
		kvt_paris_query_prep(&z.srht, qv, &q);
		for (int lv = KVT_SIMD_SCALAR; lv <= KVT_SIMD_AVX512; lv++) {
			if (kvt_simd_cap((enum kvt_simd)lv) != (enum kvt_simd)lv)
				continue;
			/* a query no group stands out for: 50 of three groups' keys, ranked by the
			 * 2-bit level (the int8 one at dim 64), the same set at every level */
			ck_assert_int_eq(probe_cands(&z.sk, &z, qr, 50, 3 * PG, NULL, &scr,
						     lv == KVT_SIMD_SCALAR ? c0 : a),
					 50);
			if (lv != KVT_SIMD_SCALAR)
				ck_assert_mem_eq(a, c0, 50 * sizeof(*a));
			ck_assert_int_eq(probe_cands(&z.sk, &z, qv, PG, PG, NULL, &scr, a), PG);
			ck_assert(all_in_group(a, PG, 37));
			ck_assert_int_eq(probe_cands(&z.sk, &z, qv, 2 * PG, 2 * PG, NULL, &scr, a),
					 2 * PG);
			ck_assert(all_in_group(a, PG, 37) && all_in_group(a + PG, PG, 150));
			/* C = the probe: every scanned key scored, the exact top-k */
			ck_assert_uint_eq(brute(&z, &q, k, NULL, bi, bs), k);
			ck_assert_int_eq(kvt_sketch_topk_fast(&z.sk, &z.ix, &q, k, PG, PG, &z.keys,
							      NULL, &scr, gi, gs, NULL),
					 (int)k);
			ck_assert_mem_eq(gi, bi, k * sizeof(*gi));
		}
		kvt_simd_cap(KVT_SIMD_AVX512);
		/* a probe that covers every key ranks them as one of every group does (at dim 64
		 * the int8 level, not the 2-bit level the whole-zone path uses) */
		ck_assert_int_eq(probe_cands(&z.sk, &z, qr, 50, n, NULL, &scr, a), 50);
		ck_assert_int_eq(probe_cands(&z.sk, &z, qr, 50, n - 1, NULL, &scr, b), 50);
		ck_assert_mem_eq(a, b, 50 * sizeof(*a));
		/* and so does the largest probe an SQE carries (no overflow in the group count) */
		ck_assert_int_eq(probe_cands(&z.sk, &z, qr, 50, UINT32_MAX, NULL, &scr, b), 50);
		ck_assert_mem_eq(a, b, 50 * sizeof(*a));
		/* group 37 evicted: 150 is scanned, and the answer is the live keys' top-k */
		for (uint32_t i = 37 * PG; i < 38 * PG; i++)
			ck_assert_int_eq(kvt_paris_index_drop(&z.ix, i), 1);
		ck_assert_uint_eq(brute(&z, &q, k, NULL, bi, bs), k);
		ck_assert_int_eq(kvt_sketch_topk_fast(&z.sk, &z.ix, &q, k, PG, PG, &z.keys, NULL,
						      &scr, gi, gs, NULL),
				 (int)k);
		ck_assert_mem_eq(gi, bi, k * sizeof(*gi));
		/* half of 150 evicted too: its 32 live keys and a second group's */
		for (uint32_t i = 150 * PG; i < 151 * PG; i += 2)
			ck_assert_int_eq(kvt_paris_index_drop(&z.ix, i), 1);
		ck_assert_int_eq(probe_cands(&z.sk, &z, qv, PG, PG, NULL, &scr, a), PG);
		r = 0;
		for (int i = 0; i < PG; i++)
			r += a[i] / PG == 150;
		ck_assert_int_eq(r, PG / 2);
		/* a filter that drops 150's live keys: the probed groups (150 and one more) give
		 * 64 of the 65 asked for, so the whole zone answers (64 without the fallback) */
		r = probe_cands(&z.sk, &z, qv, PG + 1, PG + 1, &drop150, &scr, a);
		ck_assert_int_eq(r, PG + 1);
		for (int i = 0; i < r; i++)
			ck_assert(a[i] / PG != 150 && a[i] / PG != 37);
		/* a key that is not finite makes its group's score +inf: scanned first */
		z.f32[(size_t)5 * PG * dim + 3] = INFINITY;
		ck_assert_int_eq(kvt_sketch_set(&z.sk, 5 * PG, z.f32 + (size_t)5 * PG * dim), 0);
		ck_assert_int_eq(probe_cands(&z.sk, &z, qv, 16, 16, NULL, &scr, b), 16);
		ck_assert(all_in_group(b, 16, 5));
		/* and that key's estimate is +inf: the best of its group's */
		ck_assert_int_eq(probe_cands(&z.sk, &z, qv, 1, 16, NULL, &scr, b), 1);
		ck_assert_uint_eq(b[0], 5 * PG);
		zone_free(&z);
		kvt_paris_scratch_fini(&scr);
		free(keys);
	}
}
END_TEST

/*
 * The groups' first bar comes from a sample of every (n / 256)-th group's score; keys ordered so
 * that the sampled groups are the best ones put few groups above it. A probe of 50 groups then
 * lists too few live keys at the bar and lists them all again: the 50 best groups are probed,
 * every one a sampled one. Fails without the second listing (32 groups probed).
 */
START_TEST(test_probe_bar_defeated)
{
	const unsigned int dim = 64, gk = 16;
	const uint32_t ngroups = 800, n = ngroups * gk, stride = ngroups / 256, want = 50;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	static uint32_t a[50 * 16];
	struct kvt_paris_scratch scr = {0};
	uint32_t probed = 0;
	uint64_t seed = 5;
	struct zone z;

	ck_assert(keys);
	for (unsigned int j = 0; j < dim; j++)
		qv[j] = kvt_test_lcg_gauss(&seed);
	for (uint32_t i = 0; i < n; i++) {
		const uint32_t g = i / gk;
		const bool sampled = g % stride == 0 && g / stride < 256;

		for (unsigned int j = 0; j < dim; j++)
			keys[(size_t)i * dim + j] =
			    kvt_test_lcg_gauss(&seed) + (sampled ? 1.5f * qv[j] : 0.0f);
	}
	zone_make(&z, keys, n, dim, true, 1024);
	ck_assert_int_eq(probe_cands(&z.sk, &z, qv, want * gk, want * gk, NULL, &scr, a),
			 (int)(want * gk));
	for (uint32_t g = 0; g < ngroups; g++) {
		const bool on = scr.sk_gmap[g / 64] >> (g % 64) & 1;

		probed += on;
		ck_assert(!on || (g % stride == 0 && g / stride < 256));
	}
	ck_assert_uint_eq(probed, want);
	for (uint32_t i = 0; i < want * gk; i++)
		ck_assert_uint_eq(a[i] / gk % stride, 0);
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

/*
 * A group's summary depends on its keys alone: appended in one batch or one key at a time
 * (a part-full last group included), or re-encoded later (kvt_sketch_set()), a group ranks as
 * the keys it holds now say. Fails if set() leaves the summary as appended: group 90, changed
 * to match the query, would not be scanned.
 */
static void
summary_follows_keys(unsigned int dim)
{
	const uint32_t n = 100 * PG + 20;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD], v[MAXD];
	static uint32_t a[2 * PG], b[2 * PG];
	struct kvt_paris_scratch scr = {0};
	struct kvt_sketch one;
	uint64_t seed = 91;
	struct zone z;

	ck_assert(keys);
	for (unsigned int j = 0; j < dim; j++)
		qv[j] = kvt_test_lcg_gauss(&seed);
	for (uint32_t i = 0; i < n; i++) /* the part-full last group matches the query */
		for (unsigned int j = 0; j < dim; j++)
			keys[(size_t)i * dim + j] =
			    kvt_test_lcg_gauss(&seed) + (i >= 100 * PG ? 2.0f * qv[j] : 0.0f);
	zone_make(&z, keys, n, dim, true, 1024);
	ck_assert_int_eq(kvt_sketch_init(&one, dim, 1024, NULL), 0);
	ck_assert_int_ge(kvt_sketch_reserve(&one, n), (int)n);
	for (uint32_t i = 0; i < n; i++)
		ck_assert_int_eq(kvt_sketch_append(&one, z.f16 + (size_t)i * dim,
						   dim * sizeof(uint16_t), KVT_DTYPE_F16, 1),
				 (int)i + 1);
	ck_assert_int_eq(probe_cands(&z.sk, &z, qv, 20, 20, NULL, &scr, a), 20);
	ck_assert_int_eq(probe_cands(&one, &z, qv, 20, 20, NULL, &scr, b), 20);
	ck_assert(all_in_group(a, 20, 100));
	ck_assert_mem_eq(a, b, sizeof(a[0]) * 20);
	/* group 90 changed after the fact to match the query better still */
	for (uint32_t i = 90 * PG; i < 91 * PG; i++) {
		for (unsigned int j = 0; j < dim; j++)
			v[j] = kvt_test_lcg_gauss(&seed) + 4.0f * qv[j];
		ck_assert_int_eq(kvt_sketch_set(&z.sk, i, v), 0);
		ck_assert_int_eq(kvt_sketch_set(&one, i, v), 0);
	}
	ck_assert_int_eq(probe_cands(&z.sk, &z, qv, PG, PG, NULL, &scr, a), PG);
	ck_assert_int_eq(probe_cands(&one, &z, qv, PG, PG, NULL, &scr, b), PG);
	ck_assert(all_in_group(a, PG, 90));
	ck_assert_mem_eq(a, b, PG * sizeof(a[0]));
	/* and the part-full group after a change inside it: still its keys' mean */
	for (unsigned int j = 0; j < dim; j++)
		v[j] = -100.0f * qv[j];
	for (uint32_t i = 100 * PG; i < n; i++) {
		ck_assert_int_eq(kvt_sketch_set(&z.sk, i, v), 0);
		ck_assert_int_eq(kvt_sketch_set(&one, i, v), 0);
	}
	ck_assert_int_eq(probe_cands(&z.sk, &z, qv, PG + 20, PG + 20, NULL, &scr, a), PG + 20);
	for (int i = 0; i < PG + 20; i++)
		ck_assert_uint_lt(a[i], 100 * PG);
	kvt_sketch_fini(&one);
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}

START_TEST(test_probe_summary_follows_keys)
{
	summary_follows_keys(128);
	summary_follows_keys(64);
}
END_TEST

/* Through kvt_paris_search(): opts.fast takes the fast path on a zone of more than
 * KVT_PARIS_FAST_MIN * fast keys, and on a shorter one returns the exact top-k. */
START_TEST(test_fast_search_routes)
{
	const unsigned int dim = 128;
	const uint32_t n = 3001, k = 50;
	float *keys = malloc((size_t)n * dim * sizeof(float)), qv[MAXD];
	struct kvt_paris_scratch scr = {0};
	uint64_t seed = 61;
	struct zone z;
	uint32_t differ = 0;

	ck_assert(keys);
	gen_keys(keys, n, dim, 404);
	zone_make(&z, keys, n, dim, true, 512);
	for (uint32_t t = 0; t < 12; t++) {
		struct kvt_paris_search_opts so = {.k = k, .keys = &z.keys, .sketch = &z.sk};
		struct kvt_paris_query q;
		uint32_t gi[50], fi[50], bi[50];
		float gs[50], fs[50], bs[50];

		make_query(qv, dim, &z, t, &seed);
		kvt_paris_query_prep(&z.srht, qv, &q);
		ck_assert_uint_eq(brute(&z, &q, k, NULL, bi, bs), k);
		/* 3001 keys > 32 * 50: the fast path, as kvt_sketch_topk_fast() gives it */
		so.fast = k;
		ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, gi, gs), (int)k);
		ck_assert_int_eq(kvt_sketch_topk_fast(&z.sk, &z.ix, &q, k, k, 0, &z.keys, NULL,
						      &scr, fi, fs, NULL),
				 (int)k);
		ck_assert_mem_eq(gi, fi, sizeof(gi));
		differ += memcmp(gi, bi, sizeof(gi)) != 0;
		/* 3001 keys <= 32 * 100: the exact top-k */
		so.fast = 2 * k;
		ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, gi, gs), (int)k);
		ck_assert_mem_eq(gi, bi, sizeof(gi));
	}
	ck_assert_uint_gt(differ, 0); /* C = k: the fast path is not the exact top-k */
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
	free(keys);
}
END_TEST

/* The 2-bit code itself: a key built as centre + R^-1 y for a chosen y encodes y's signs and
 * which dims pass 0.8453 mean |y|, and f = |y|^2 / <y, l>. */
START_TEST(test_fast_code_layout)
{
	const unsigned int dim = 64;
	float keys[64 * 64], y[64], v[64], f;
	uint8_t bits[16];
	const float *c;
	double num = 0, den = 0;
	uint64_t seed = 8;
	struct zone z;

	for (unsigned int i = 0; i < 64 * dim; i++)
		keys[i] = kvt_test_lcg_gauss(&seed);
	zone_make(&z, keys, 64, dim, false, 64);
	for (unsigned int j = 0; j < dim; j++) { /* |y| 2 on a third of the dims, 0.5 elsewhere */
		y[j] = (j % 3 ? 0.5f : 2.0f) * (j % 2 ? 1.0f : -1.0f);
		num += (double)y[j] * y[j];
		den += fabs(y[j]) * (j % 3 ? 1.0 : 3.0);
	}
	ck_assert_int_eq(kvt_sketch_sign_code(&z.sk, 5, NULL, bits, &f, &c), 0);
	kvt_srht_inverse(&z.sk.rot, y, v);
	for (unsigned int j = 0; j < dim; j++)
		v[j] += c[j];
	ck_assert_int_eq(kvt_sketch_sign_code(&z.sk, 5, v, bits, &f, &c), 0);
	for (unsigned int b = 0; b < dim / 4; b++)
		for (unsigned int j = 0; j < 4; j++) {
			unsigned int d = 4 * b + j;

			ck_assert_uint_eq(bits[b] >> j & 1, d % 2);	       /* y >= 0 */
			ck_assert_uint_eq(bits[b] >> (4 + j) & 1, d % 3 == 0); /* |y| large */
		}
	ck_assert_double_eq_tol(f, num / den, 1e-4);
	zone_free(&z);
}
END_TEST

/* A page is a multiple of 64 bytes at every size: the default allocator is aligned_alloc(64),
 * which wants one (ASan refused 45,088 bytes for 256 keys at dim 128 once the group level made
 * pages end off a cache line). */
START_TEST(test_page_bytes)
{
	for (unsigned int dim = 64; dim <= 128; dim += 64)
		for (unsigned int pk = 64; pk <= 1u << 20; pk *= 2) {
			size_t b = kvt_sketch_page_bytes(dim, pk);

			ck_assert_uint_eq(b % 64, 0);
			ck_assert_uint_ge(b, kvt_sketch_int8_bytes(dim, pk) +
						 (size_t)pk * (dim / 4 + 4) + 4 * dim +
						 pk / (dim == 64 ? 16 : 64) * (dim + 8));
			ck_assert_uint_lt(b, kvt_sketch_int8_bytes(dim, pk) +
						 (size_t)pk * (dim / 4 + 4) + 4 * dim +
						 pk / (dim == 64 ? 16 : 64) * (dim + 8) + 64);
		}
}
END_TEST

START_TEST(test_bad_args)
{
	struct kvt_sketch sk;
	struct zone z;
	float keys[64 * 64] = {0};
	struct kvt_paris_scratch scr = {0};
	struct kvt_paris_query q;
	struct kvt_paris_alloc half_alloc = {0};
	uint32_t gi[4];
	float gs[4];

	ck_assert_int_eq(kvt_sketch_init(&sk, 48, 0, NULL), -EINVAL);
	ck_assert_int_eq(kvt_sketch_init(&sk, 64, 100, NULL), -EINVAL);
	ck_assert_int_eq(kvt_sketch_init(&sk, 64, 32, NULL), -EINVAL);
	/* an allocator must give pages back as well as hand them out */
	half_alloc.page_get = kvt_paris_alloc_heap.page_get;
	ck_assert_int_eq(kvt_sketch_init(&sk, 64, 64, &half_alloc), -EINVAL);
	ck_assert_int_eq(kvt_sketch_init(&sk, 64, 64, NULL), 0);
	ck_assert_int_eq(kvt_sketch_append(&sk, keys, 64 * 4, KVT_DTYPE_F32, 1), -ENOSPC);
	ck_assert_int_ge(kvt_sketch_reserve(&sk, 64), 64);
	ck_assert_int_eq(kvt_sketch_append(&sk, keys, 64 * 4, 99, 1), -EINVAL);
	kvt_sketch_fini(&sk);
	/* a sketch of another length than the index is refused */
	zone_make(&z, keys, 64, 64, true, 64);
	z.sk.n--;
	kvt_paris_query_prep(&z.srht, keys, &q);
	ck_assert_int_eq(kvt_sketch_topk(&z.sk, &z.ix, &q, 4, &z.keys, NULL, &scr, gi, gs, NULL),
			 -EINVAL);
	ck_assert_int_eq(
	    kvt_sketch_topk_fast(&z.sk, &z.ix, &q, 4, 8, 0, &z.keys, NULL, &scr, gi, gs, NULL),
	    -EINVAL);
	ck_assert_int_eq(kvt_sketch_fast_cands(&z.sk, &z.ix, q.x, 4, 0, NULL, true, &scr, gi),
			 -EINVAL);
	z.sk.n++;
	/* no candidates asked for; all 64 asked for with 60 dropped: the 4 live ones */
	ck_assert_int_eq(kvt_sketch_fast_cands(&z.sk, &z.ix, q.x, 0, 0, NULL, true, &scr, gi),
			 -EINVAL);
	for (uint32_t i = 4; i < 64; i++)
		ck_assert_int_eq(kvt_paris_index_drop(&z.ix, i), 1);
	ck_assert_int_eq(kvt_sketch_fast_cands(&z.sk, &z.ix, q.x, 64, 0, NULL, false, &scr, gi), 4);
	for (uint32_t i = 0; i < 4; i++)
		ck_assert_uint_lt(gi[i], 4);
	/* a probe below C is refused; one that covers the live keys scans them all */
	ck_assert_int_eq(kvt_sketch_fast_cands(&z.sk, &z.ix, q.x, 8, 7, NULL, false, &scr, gi),
			 -EINVAL);
	ck_assert_int_eq(
	    kvt_sketch_topk_fast(&z.sk, &z.ix, &q, 4, 8, 7, &z.keys, NULL, &scr, gi, gs, NULL),
	    -EINVAL);
	ck_assert_int_eq(kvt_sketch_fast_cands(&z.sk, &z.ix, q.x, 4, 4, NULL, false, &scr, gi), 4);
	for (uint32_t i = 0; i < 4; i++)
		ck_assert_uint_lt(gi[i], 4);
	{ /* opts.fast: at least k, and a sketch and keys to score with */
		struct kvt_paris_search_opts so = {
		    .k = 4, .fast = 3, .keys = &z.keys, .sketch = &z.sk};

		ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, gi, gs), -EINVAL);
		so.fast = 8;
		so.sketch = NULL;
		ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, gi, gs), -EINVAL);
		so.sketch = &z.sk;
		so.keys = NULL;
		ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, gi, gs), -EINVAL);
		ck_assert_int_eq(
		    kvt_sketch_topk_fast(&z.sk, &z.ix, &q, 4, 8, 0, NULL, NULL, &scr, gi, gs, NULL),
		    -EINVAL);
		so.keys = &z.keys; /* and then it answers */
		ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, gi, gs), 4);
		/* opts.probe: only with fast, and at least fast */
		so.probe = 7;
		ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, gi, gs), -EINVAL);
		so.fast = 0;
		so.probe = 64;
		ck_assert_int_eq(kvt_paris_search(&z.ix, &q, &so, &scr, gi, gs), -EINVAL);
	}
	/* a zero query scores every key 0: the first k by index */
	ck_assert_int_eq(kvt_sketch_topk(&z.sk, &z.ix, &q, 4, &z.keys, NULL, &scr, gi, gs, NULL),
			 4);
	for (uint32_t i = 0; i < 4; i++)
		ck_assert_uint_eq(gi[i], i);
	zone_free(&z);
	kvt_paris_scratch_fini(&scr);
}
END_TEST

KVT_CHECK_MAIN("sketch", 300, NULL, NULL, test_exact_every_level, test_ties, test_dropped,
	       test_nonfinite_keys, test_query_scale, test_set_after_change, test_bound_holds,
	       test_encode_every_level, test_unreadable_key, test_fast_all_is_exact,
	       test_fast_levels_agree, test_fast_finds_planted, test_fast_edges,
	       test_fast_sample_same_set, test_fast_sample_too_high, test_probe_groups,
	       test_probe_bar_defeated, test_probe_summary_follows_keys, test_fast_search_routes,
	       test_fast_code_layout, test_page_bytes, test_bad_args)
