/* SPDX-License-Identifier: MIT */
/*
 * paris.c - one ParisKV index (a layer and kv head's retrieval keys) and the search over it,
 * as docs/retrieval.md describes: keys are rotated (srht.c), given a sign-pattern centroid id per
 * block and 4-bit RSQ-IP codes, in pages from the caller's allocator; a query builds vote tables,
 * every live key gets a vote count, a histogram cut keeps the candidates, the 4-bit estimates
 * rerank them, and an optional exact refine rescores the best from the full-precision keys.
 * Each hot loop has a scalar version and AVX2 / AVX-512 ones chosen at run time (simd.h); the
 * unit tests hold the SIMD paths equal to the scalar ones.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "paris.h"
#include "paris_int.h"
#include "simd.h"

const float kvt_paris_theta[7] = {
    0.08420966f, 0.16964098f, 0.25757120f, 0.34969834f, 0.44844857f, 0.55829565f, 0.68999742f,
};

const float kvt_paris_level[8] = {
    0.04192810f, 0.12649122f, 0.21279074f, 0.30235165f,
    0.39704504f, 0.49985211f, 0.61673919f, 0.76325565f,
};

/* Cumulative tier fractions of the collision budget (section 3.2). */
static const double tier_frac[KVT_PARIS_TIERS] = {0.05, 0.15, 0.30, 0.50, 0.75, 1.00};

static void *
default_page_get(void *ctx, size_t len)
{
	(void)ctx;
	return aligned_alloc(64, (len + 63) & ~(size_t)63);
}

static void
default_page_put(void *ctx, void *page, size_t len)
{
	(void)ctx;
	(void)len;
	free(page);
}

const struct kvt_paris_alloc kvt_paris_alloc_heap = {default_page_get, default_page_put, NULL};

/* ---- index pages: layout of a page's centroid ids, codes and weights ------------------------- */

size_t
kvt_paris_page_bytes(unsigned int dim, unsigned int page_keys)
{
	return (size_t)9 * (dim / KVT_PARIS_M) * page_keys;
}

/*
 * Page layout: cid [B][P] | P records of codes [4B] + weights [B] f32. The vote pass streams the
 * ids block by block; the rerank reads one record per candidate, so a key's codes and weights
 * share adjacent cache lines and one 4 KiB page. Every part starts 64-aligned because P is a
 * multiple of 64, and records (8B bytes) are 64-aligned for B = 16 and 32-aligned for B = 8.
 */
static inline uint8_t *
page_cid(const struct kvt_paris_index *ix, uint32_t p)
{
	return ix->pages[p];
}

static inline uint8_t *
key_code(const struct kvt_paris_index *ix, uint32_t p, uint32_t off)
{
	return (uint8_t *)ix->pages[p] + (size_t)ix->nblk * (ix->page_keys + (size_t)8 * off);
}

static inline float *
key_w(const struct kvt_paris_index *ix, uint32_t p, uint32_t off)
{
	return (float *)(key_code(ix, p, off) + (size_t)4 * ix->nblk);
}

/* ---- the index: init, growth, encoding and appending keys, dropping evicted ones ------------- */

int
kvt_paris_pages_setup(unsigned int page_keys, const struct kvt_paris_alloc *alloc,
		      uint32_t *ret_page_keys, uint32_t *ret_page_shift,
		      struct kvt_paris_alloc *ret_alloc)
{
	if (!page_keys)
		page_keys = KVT_PARIS_PAGE_KEYS;
	if (page_keys < 64 || page_keys > (1u << 20) || (page_keys & (page_keys - 1)))
		return -EINVAL;
	if (alloc && (!alloc->page_get || !alloc->page_put))
		return -EINVAL;
	*ret_page_keys = page_keys;
	*ret_page_shift = (uint32_t)__builtin_ctz(page_keys);
	*ret_alloc = alloc ? *alloc : kvt_paris_alloc_heap;
	return 0;
}

int
kvt_paris_index_init(struct kvt_paris_index *ix, unsigned int dim, unsigned int page_keys,
		     const struct kvt_paris_alloc *alloc)
{
	struct kvt_paris_alloc a;
	uint32_t pk, shift;

	if (dim != 64 && dim != 128)
		return -EINVAL;
	if (kvt_paris_pages_setup(page_keys, alloc, &pk, &shift, &a) < 0)
		return -EINVAL;
	memset(ix, 0, sizeof(*ix));
	ix->dim = dim;
	ix->nblk = dim / KVT_PARIS_M;
	ix->page_keys = pk;
	ix->page_shift = shift;
	ix->page_bytes = kvt_paris_page_bytes(dim, pk);
	ix->alloc = a;
	return 0;
}

void
kvt_paris_index_fini(struct kvt_paris_index *ix)
{
	if (!ix)
		return;
	for (uint32_t p = 0; p < ix->npages; p++)
		ix->alloc.page_put(ix->alloc.ctx, ix->pages[p], ix->page_bytes);
	free(ix->pages);
	free(ix->dead);
	ix->pages = NULL;
	ix->dead = NULL;
	ix->npages = ix->max_pages = 0;
	ix->n = ix->ndead = 0;
}

int
kvt_paris_index_reserve(struct kvt_paris_index *ix, uint32_t nkeys)
{
	uint32_t want;

	if (nkeys > (1u << 31))
		return -EOVERFLOW;
	want = (uint32_t)(((uint64_t)nkeys + ix->page_keys - 1) >> ix->page_shift);
	if (want > ix->max_pages) {
		uint32_t m = ix->max_pages ? ix->max_pages : 4;
		uint64_t *nd;
		void **np;

		while (m < want)
			m *= 2;
		np = realloc(ix->pages, m * sizeof(*np));
		if (!np)
			return -ENOMEM;
		ix->pages = np;
		/* the dropped-key bitmap covers every page slot: a drop never allocates */
		nd = realloc(ix->dead, ((size_t)m << ix->page_shift) / 64 * sizeof(*nd));
		if (!nd)
			return -ENOMEM;
		memset(nd + ((size_t)ix->max_pages << ix->page_shift) / 64, 0,
		       ((size_t)(m - ix->max_pages) << ix->page_shift) / 64 * sizeof(*nd));
		ix->dead = nd;
		ix->max_pages = m;
	}
	while (ix->npages < want) {
		void *pg = ix->alloc.page_get(ix->alloc.ctx, ix->page_bytes);

		if (!pg)
			return -ENOMEM;
		/* The vote scan reads centroid ids past n up to a multiple of 64: keep them
		 * defined. */
		memset(pg, 0, (size_t)ix->nblk * ix->page_keys);
		ix->pages[ix->npages++] = pg;
	}
	return (int)((uint64_t)ix->npages << ix->page_shift > (1u << 31)
			 ? (1u << 31)
			 : (uint64_t)ix->npages << ix->page_shift);
}

void
kvt_paris_encode_key(const struct kvt_srht *srht, const float *key, uint8_t *ret_cid,
		     uint8_t *ret_code, float *ret_w)
{
	unsigned int d = srht->dim, nb = d / KVT_PARIS_M;
	float y[KVT_SRHT_MAX_DIM] = {0}, nrm, den;
	double nrm2 = 0.0; /* f32 squares overflow from 1.8e19 and underflow below 1e-19 */

	for (unsigned int i = 0; i < d; i++)
		nrm2 += (double)key[i] * key[i];
	nrm = (float)sqrt(nrm2);
	den = fmaxf(nrm, 1e-8f);
	for (unsigned int i = 0; i < d; i++)
		y[i] = key[i] / den;
	kvt_srht_apply(srht, y, y);

	for (unsigned int b = 0; b < nb; b++) {
		const float *yb = y + KVT_PARIS_M * b;
		float r2 = 0.0f, r, rden, alpha = 0.0f;
		uint32_t word = 0, id = 0;

		for (unsigned int j = 0; j < KVT_PARIS_M; j++)
			r2 += yb[j] * yb[j];
		r = sqrtf(r2);
		rden = fmaxf(r, 1e-8f);
		for (unsigned int j = 0; j < KVT_PARIS_M; j++) {
			float au = fabsf(yb[j] / rden);
			uint32_t s = yb[j] >= 0.0f; /* an exact zero counts as positive */
			uint32_t t = 0;

			/* bucketize(right=False): a value equal to a threshold stays in the lower
			 * bin */
			for (unsigned int l = 0; l < 7; l++)
				t += kvt_paris_theta[l] < au;
			id |= s << j;
			word |= ((s << 3) | t) << (4 * j);
			alpha += kvt_paris_level[t] * au;
		}
		alpha = fmaxf(alpha, 1e-6f);
		ret_cid[b] = (uint8_t)id;
		ret_code[4 * b + 0] = (uint8_t)word;
		ret_code[4 * b + 1] = (uint8_t)(word >> 8);
		ret_code[4 * b + 2] = (uint8_t)(word >> 16);
		ret_code[4 * b + 3] = (uint8_t)(word >> 24);
		ret_w[b] = nrm * r / alpha;
	}
}

int
kvt_paris_index_append(struct kvt_paris_index *ix, const struct kvt_srht *srht, const float *keys,
		       size_t stride, uint32_t count)
{
	uint32_t nb = ix->nblk, P = ix->page_keys;

	if (srht->dim != ix->dim || stride < ix->dim)
		return -EINVAL;
	if ((uint64_t)ix->n + count > ((uint64_t)ix->npages << ix->page_shift) ||
	    (uint64_t)ix->n + count > (1u << 31))
		return -ENOSPC;
	for (uint32_t i = 0; i < count; i++) {
		uint32_t at = ix->n + i, p = at >> ix->page_shift, off = at & (P - 1);
		uint8_t cid[KVT_PARIS_MAX_BLK];
		uint8_t *cb = page_cid(ix, p);

		kvt_paris_encode_key(srht, keys + (size_t)i * stride, cid, key_code(ix, p, off),
				     key_w(ix, p, off));
		for (uint32_t b = 0; b < nb; b++) {
			cb[(size_t)b * P + off] = cid[b];
			ix->hist[b][cid[b]]++;
		}
	}
	ix->n += count;
	return (int)ix->n;
}

int
kvt_paris_index_drop(struct kvt_paris_index *ix, uint32_t i)
{
	uint32_t p = i >> ix->page_shift, off = i & (ix->page_keys - 1);
	const uint8_t *cid;

	if (i >= ix->n)
		return -ERANGE;
	if (ix->dead[i / 64] >> (i % 64) & 1)
		return 0;
	ix->dead[i / 64] |= 1ull << (i % 64);
	ix->ndead++;
	cid = page_cid(ix, p) + off;
	for (uint32_t b = 0; b < ix->nblk; b++)
		ix->hist[b][cid[(size_t)b * ix->page_keys]]--;
	return 1;
}

static inline bool
key_dead(const struct kvt_paris_index *ix, uint32_t i)
{
	return ix->dead[i / 64] >> (i % 64) & 1;
}

int
kvt_paris_key_codes(const struct kvt_paris_index *ix, uint32_t i, const uint8_t **ret_cid,
		    const uint8_t **ret_code, const float **ret_w)
{
	uint32_t p = i >> ix->page_shift, off = i & (ix->page_keys - 1);

	if (i >= ix->n)
		return -ERANGE;
	*ret_cid = page_cid(ix, p) + off;
	*ret_code = key_code(ix, p, off);
	*ret_w = key_w(ix, p, off);
	return 0;
}

/* ---- ratio schedules and query preparation (rotation, norm in double) ------------------------ */

void
kvt_paris_schedule(uint32_t n, double *ret_rho_cand, double *ret_rho_col)
{
	if (n < 5000) {
		*ret_rho_cand = 0.50;
		*ret_rho_col = 0.50;
	} else if (n < 10000) {
		*ret_rho_cand = 0.25;
		*ret_rho_col = 0.30;
	} else if (n < 30000) {
		*ret_rho_cand = 0.20;
		*ret_rho_col = 0.25;
	} else {
		*ret_rho_cand = 0.10;
		*ret_rho_col = 0.20;
	}
}

void
kvt_paris_schedule_refine(uint32_t n, unsigned int dim, double *ret_rho_cand, double *ret_rho_col)
{
	(void)dim; /* measured at 64 and 128 alike */
	/* Up to 16K keys every key gets an estimate: no vote tables, whose fixed cost is most of
	 * a short zone's search. From 256K on a dense candidate set: the rerank then streams its
	 * records almost in order, so (0.70, 1.00) costs what (0.40-0.50, 0.70) does there. */
	if (n <= 16384) {
		*ret_rho_cand = 1.0;
		*ret_rho_col = 1.0;
		return;
	}
	kvt_paris_schedule(n, ret_rho_cand, ret_rho_col);
	*ret_rho_cand = fmax(*ret_rho_cand, n < 262144 ? 0.50 : 0.70);
	*ret_rho_col = fmax(*ret_rho_col, n < 262144 ? 0.70 : 1.00);
}

void
kvt_paris_query_prep(const struct kvt_srht *srht, const float *q, struct kvt_paris_query *ret_q)
{
	unsigned int d = srht->dim;
	double nrm2 = 0.0;

	/* In double: the square of any finite float, and a sum of 128 of them, neither overflows
	 * nor underflows, so the unit query is the same at every scale (up to the input's own
	 * rounding). */
	for (unsigned int i = 0; i < d; i++)
		nrm2 += (double)q[i] * q[i];
	ret_q->dim = d;
	ret_q->dnorm = sqrt(nrm2);
	ret_q->norm = (float)ret_q->dnorm;
	for (unsigned int i = 0; i < d; i++)
		ret_q->x[i] = ret_q->dnorm > 0.0 ? (float)(q[i] / ret_q->dnorm) : 0.0f;
	kvt_srht_apply(srht, ret_q->x, ret_q->y);
}

/* ---- vote tables and the vote pass (scalar, AVX2, AVX-512 VBMI) ------------------------------ */

/*
 * The first @limit (<= 256) of the 256 flip masks of a block ranked by cost, cost(x) = sum of
 * |y_j| over the bits j of x, ascending, ties to the lower mask. Built as sorted subset sums:
 * the list for bits 0..j-1, merged with itself plus |y_j| (each entry with bit j set), for
 * j = 0..7, instead of a sort. On equal costs the first list goes first, and its masks are the
 * lower ones (they lack bit j). Sums are formed adding the dims in increasing j; where rounding
 * makes two sums of the second list equal, they keep the order of the sums they came from. The
 * first m entries of a merge depend only on the first m of its input, so every list can stop at
 * @limit and the prefix is the same as the full ranking's. Returns min(limit, 256).
 */
static uint32_t
rank_masks(const float *ay, uint32_t limit, uint8_t *ret_order)
{
	float c1[256], c2[256];
	uint8_t o2[256];
	float *cs = c1, *cd = c2;
	uint8_t *os = ret_order, *od = o2;
	uint32_t len = 1;

	cs[0] = 0.0f;
	os[0] = 0;
	for (unsigned int j = 0; j < KVT_PARIS_M; j++) {
		const float a = ay[j];
		const uint8_t bit = (uint8_t)(1u << j);
		uint32_t i = 0, k = 0, o = 0, out = 2 * len < limit ? 2 * len : limit;

		while (o < out && i < len && k < len) {
			float ck = cs[k] + a;

			if (!(ck < cs[i])) {
				cd[o] = cs[i];
				od[o++] = os[i++];
			} else {
				cd[o] = ck;
				od[o++] = os[k++] | bit;
			}
		}
		for (; o < out && i < len; i++, o++) {
			cd[o] = cs[i];
			od[o] = os[i];
		}
		for (; o < out && k < len; k++, o++) {
			cd[o] = cs[k] + a;
			od[o] = os[k] | bit;
		}
		len = out;
		float *ct = cs;
		uint8_t *ot = os;

		cs = cd;
		cd = ct;
		os = od;
		od = ot;
	}
	/* eight merges: the order is back in the caller's array */
	return len;
}

int
kvt_paris_vote_tables(const struct kvt_paris_index *ix, const struct kvt_paris_query *q,
		      double rho_col, uint8_t (*ret_tab)[256])
{
	double budget[KVT_PARIS_TIERS];

	if (q->dim != ix->dim || !(rho_col > 0.0 && rho_col <= 1.0))
		return -EINVAL;
	for (int t = 0; t < KVT_PARIS_TIERS; t++)
		budget[t] = ceil(((double)kvt_paris_index_live(ix) * rho_col) * tier_frac[t]);

	for (uint32_t b = 0; b < ix->nblk; b++) {
		const float *yb = q->y + KVT_PARIS_M * b;
		float ay[KVT_PARIS_M];
		uint8_t order[256];
		uint32_t top = 0;

		for (unsigned int j = 0; j < KVT_PARIS_M; j++) {
			top |= (uint32_t)(yb[j] >= 0.0f) << j;
			ay[j] = fabsf(yb[j]);
		}
		/*
		 * Mask x flips the dims of x away from the top centroid (the sign pattern). Past
		 * the last budget every centroid votes 0, and the budget is usually reached within
		 * the first few dozen centroids: rank 64 first, all 256 only when that falls short.
		 */
		memset(ret_tab[b], 0, 256);
		for (uint32_t limit = 64;; limit = 256) {
			uint32_t m = rank_masks(ay, limit, order);
			uint64_t prefix = 0;
			int passed = 0; /* tiers whose budget the prefix has reached */

			for (uint32_t p = 0; p < m; p++) {
				uint32_t c = order[p] ^ top;

				/* budgets ascend: the tiers the prefix has passed only grow */
				while (passed < KVT_PARIS_TIERS &&
				       !((double)prefix < budget[passed]))
					passed++;
				if (passed == KVT_PARIS_TIERS)
					break; /* this one and the rest vote 0 */
				ret_tab[b][c] = (uint8_t)(KVT_PARIS_TIERS - passed);
				prefix += ix->hist[b][c];
			}
			if (passed == KVT_PARIS_TIERS || m == 256)
				break;
		}
	}
	return 0;
}

size_t
kvt_paris_votes_len(const struct kvt_paris_index *ix)
{
	return ((size_t)ix->n + 63) & ~(size_t)63;
}

/* Counts votes[0..n) into @hist (KVT_PARIS_MAX_VOTE + 1 entries, added to). Four sub-histograms
 * break the store-to-load dependency on equal consecutive votes. */
static void
hist_add(const uint8_t *votes, uint32_t n, uint32_t *hist)
{
	uint32_t h[4][KVT_PARIS_MAX_VOTE + 1] = {{0}};
	uint32_t i = 0;

	for (; i + 4 <= n; i += 4) {
		h[0][votes[i]]++;
		h[1][votes[i + 1]]++;
		h[2][votes[i + 2]]++;
		h[3][votes[i + 3]]++;
	}
	for (; i < n; i++)
		h[0][votes[i]]++;
	for (int v = 0; v <= KVT_PARIS_MAX_VOTE; v++)
		hist[v] += h[0][v] + h[1][v] + h[2][v] + h[3][v];
}

/*
 * Dropped keys of the page at @base (@valid keys) vote 0, before the page's votes are counted:
 * every dropped key lands in bin 0, which kvt_paris_votes() then takes them out of. Whole
 * words of 64 dropped keys (evicted runs) go at once.
 */
static void
votes_mask(const struct kvt_paris_index *ix, uint32_t base, uint32_t valid, uint8_t *votes)
{
	for (uint32_t w = base / 64; w < (base + valid + 63) / 64; w++) {
		uint64_t m = ix->dead[w];

		if (m == ~0ull) {
			memset(votes + (size_t)w * 64, 0, 64);
			continue;
		}
		for (; m; m &= m - 1)
			votes[(size_t)w * 64 + (uint32_t)__builtin_ctzll(m)] = 0;
	}
}

static void
votes_scalar(const struct kvt_paris_index *ix, const uint8_t (*tab)[256], uint8_t *ret_votes,
	     uint32_t *ret_hist)
{
	uint32_t P = ix->page_keys, nb = ix->nblk;

	for (uint32_t p = 0; (uint64_t)p << ix->page_shift < ix->n; p++) {
		uint32_t base = p << ix->page_shift, cnt = ix->n - base, valid;
		const uint8_t *cid = page_cid(ix, p);

		valid = cnt > P ? P : cnt;
		cnt = cnt > P ? P : (cnt + 63) & ~63u;
		for (uint32_t i = 0; i < cnt; i++) {
			uint32_t v = 0;

			for (uint32_t b = 0; b < nb; b++)
				v += tab[b][cid[(size_t)b * P + i]];
			ret_votes[base + i] = (uint8_t)v;
		}
		if (ix->ndead)
			votes_mask(ix, base, valid, ret_votes);
		if (ret_hist)
			hist_add(ret_votes + base, valid, ret_hist);
	}
}

#if defined(__x86_64__)
/*
 * A 256-entry byte table cannot be looked up with vpshufb, but omega is only 3 bits: store it as
 * three 256-bit bitsets per block (bit p of omega_b(c) at bit c of plane p). For 32 ids, byte
 * h = c >> 3 of a plane comes from two 16-byte vpshufb lookups: the low half indexed by h + 0x70
 * and the high half by h - 0x10, so the half that does not hold byte h sees bit 7 set and gives
 * 0, and an OR joins them. Bit c & 7 is then tested against a vpshufb-made mask, and each plane
 * counts its hits in its own accumulator (0 - hits), weighted at the end. All integer, so the
 * result equals the scalar sum. @NB is a constant at each call, so the block loop unrolls and
 * the 6 * NB half-tables stay in registers or one load away.
 */
#define KVT_VOTE_PREFETCH 384 /* bytes ahead in each block's id stream */

/* 0xff where bit (id & 7) of byte (id >> 3) of the plane is set; @bm = 1 << (id & 7) */
__attribute__((target("avx2"), always_inline)) static inline __m256i
plane_hit(__m256i lo, __m256i hi, __m256i il, __m256i ih, __m256i bm)
{
	__m256i by = _mm256_or_si256(_mm256_shuffle_epi8(lo, il), _mm256_shuffle_epi8(hi, ih));

	return _mm256_cmpeq_epi8(_mm256_and_si256(by, bm), bm);
}

__attribute__((target("avx2,fma"), always_inline)) static inline void
votes_avx2_nb(const struct kvt_paris_index *ix, const uint8_t (*tab)[256], uint8_t *ret_votes,
	      uint32_t *ret_hist, const uint32_t NB)
{
	uint32_t P = ix->page_keys;
	__m256i plo[KVT_PARIS_MAX_BLK][3], phi[KVT_PARIS_MAX_BLK][3];
	const __m256i bits = _mm256_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 0, 0, 0, 0, 0, 0, 0, 0,
					      1, 2, 4, 8, 16, 32, 64, -128, 0, 0, 0, 0, 0, 0, 0, 0);
	const __m256i m7 = _mm256_set1_epi8(7), m31 = _mm256_set1_epi8(31);
	const __m256i o70 = _mm256_set1_epi8(0x70), o10 = _mm256_set1_epi8(0x10);

	for (uint32_t b = 0; b < NB; b++) {
		for (int pl = 0; pl < 3; pl++) {
			uint8_t set[32] = {0};

			for (unsigned int c = 0; c < 256; c++)
				if ((tab[b][c] >> pl) & 1)
					set[c >> 3] |= (uint8_t)(1u << (c & 7));
			plo[b][pl] =
			    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)set));
			phi[b][pl] = _mm256_broadcastsi128_si256(
			    _mm_loadu_si128((const __m128i *)(set + 16)));
		}
	}
	for (uint32_t p = 0; (uint64_t)p << ix->page_shift < ix->n; p++) {
		uint32_t base = p << ix->page_shift, cnt = ix->n - base, valid;
		const uint8_t *cid = page_cid(ix, p);

		valid = cnt > P ? P : cnt;
		cnt = cnt > P ? P : (cnt + 63) & ~63u;
		for (uint32_t i = 0; i < cnt; i += 32) {
			__m256i a1 = _mm256_setzero_si256(), a2 = a1, a4 = a1;

#pragma GCC unroll 16
			for (uint32_t b = 0; b < NB; b++) {
				const uint8_t *src = cid + (size_t)b * P + i;
				__m256i id = _mm256_loadu_si256((const __m256i *)src);
				__m256i bm = _mm256_shuffle_epi8(bits, _mm256_and_si256(id, m7));
				__m256i h = _mm256_and_si256(_mm256_srli_epi16(id, 3), m31);
				__m256i il = _mm256_add_epi8(h, o70), ih = _mm256_sub_epi8(h, o10);

				/* 16 short streams, one per block, each in its own 4 KiB page:
				 * too many for the hardware prefetcher to follow */
				if (!(i & 63) && i + KVT_VOTE_PREFETCH < cnt)
					_mm_prefetch((const char *)src + KVT_VOTE_PREFETCH,
						     _MM_HINT_T0);
				a1 = _mm256_sub_epi8(a1,
						     plane_hit(plo[b][0], phi[b][0], il, ih, bm));
				a2 = _mm256_sub_epi8(a2,
						     plane_hit(plo[b][1], phi[b][1], il, ih, bm));
				a4 = _mm256_sub_epi8(a4,
						     plane_hit(plo[b][2], phi[b][2], il, ih, bm));
			}
			a2 = _mm256_add_epi8(a2, a2);
			a4 = _mm256_add_epi8(a4, a4);
			a4 = _mm256_add_epi8(a4, a4);
			_mm256_storeu_si256((__m256i *)(ret_votes + base + i),
					    _mm256_add_epi8(_mm256_add_epi8(a1, a2), a4));
		}
		/* counted while the page's votes are in L1; scalar work beside a vector-bound loop
		 */
		if (ix->ndead)
			votes_mask(ix, base, valid, ret_votes);
		if (ret_hist)
			hist_add(ret_votes + base, valid, ret_hist);
	}
}

__attribute__((target("avx2,fma"))) static void
votes_avx2(const struct kvt_paris_index *ix, const uint8_t (*tab)[256], uint8_t *ret_votes,
	   uint32_t *ret_hist)
{
	if (ix->nblk == 16)
		votes_avx2_nb(ix, tab, ret_votes, ret_hist, 16);
	else
		votes_avx2_nb(ix, tab, ret_votes, ret_hist, 8);
}

/*
 * AVX-512 VBMI holds a 256-entry byte table in four registers: vpermi2b looks up the low 7 bits
 * of 64 ids in two of them at once, the other two give the entries with bit 7 set, and the ids'
 * sign bits pick between the halves. One lookup is then ~4 instructions for 64 keys, where the
 * AVX2 bitset planes take ~24 for 32; the sum is the same byte as the scalar one.
 */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void
votes_avx512(const struct kvt_paris_index *ix, const uint8_t (*tab)[256], uint8_t *ret_votes,
	     uint32_t *ret_hist)
{
	uint32_t P = ix->page_keys, nb = ix->nblk;

	for (uint32_t p = 0; (uint64_t)p << ix->page_shift < ix->n; p++) {
		uint32_t base = p << ix->page_shift, cnt = ix->n - base, valid;
		const uint8_t *cid = page_cid(ix, p);

		valid = cnt > P ? P : cnt;
		cnt = cnt > P ? P : (cnt + 63) & ~63u;
		for (uint32_t i = 0; i < cnt; i += 64) {
			__m512i acc = _mm512_setzero_si512();

			for (uint32_t b = 0; b < nb; b++) {
				const uint8_t *src = cid + (size_t)b * P + i, *t = tab[b];
				__m512i id = _mm512_loadu_si512(src);
				__m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512(t), id,
								      _mm512_loadu_si512(t + 64));
				__m512i hi = _mm512_permutex2var_epi8(
				    _mm512_loadu_si512(t + 128), id, _mm512_loadu_si512(t + 192));

				if (i + KVT_VOTE_PREFETCH < cnt)
					_mm_prefetch((const char *)src + KVT_VOTE_PREFETCH,
						     _MM_HINT_T0);
				acc = _mm512_add_epi8(
				    acc, _mm512_mask_blend_epi8(_mm512_movepi8_mask(id), lo, hi));
			}
			_mm512_storeu_si512(ret_votes + base + i, acc);
		}
		if (ix->ndead)
			votes_mask(ix, base, valid, ret_votes);
		if (ret_hist)
			hist_add(ret_votes + base, valid, ret_hist);
	}
}
#endif

void
kvt_paris_votes(const struct kvt_paris_index *ix, const uint8_t (*tab)[256], uint8_t *ret_votes,
		uint32_t *ret_hist)
{
	if (ret_hist)
		memset(ret_hist, 0, (KVT_PARIS_MAX_VOTE + 1) * sizeof(*ret_hist));
#if defined(__x86_64__)
	if (kvt_simd_level() >= KVT_SIMD_AVX512)
		votes_avx512(ix, tab, ret_votes, ret_hist);
	else if (kvt_simd_level() >= KVT_SIMD_AVX2)
		votes_avx2(ix, tab, ret_votes, ret_hist);
	else
#endif
		votes_scalar(ix, tab, ret_votes, ret_hist);
	if (ret_hist) /* every dropped key voted 0 */
		ret_hist[0] -= ix->ndead;
}

/* ---- candidate selection: the histogram cut and the emit of survivors ------------------------ */

/* The cut vote tau and how many keys voting exactly tau are taken (the lowest-index ones). */
static void
select_cut(const uint32_t *hist, uint32_t c, uint32_t *ret_tau, uint32_t *ret_eq)
{
	uint32_t cum = 0, tau = 0;

	for (int v = KVT_PARIS_MAX_VOTE; v >= 0; v--) {
		if (cum + hist[v] >= c) {
			tau = (uint32_t)v;
			break;
		}
		cum += hist[v];
	}
	*ret_tau = tau;
	*ret_eq = c - cum;
}

static uint32_t
select_emit_scalar(const uint8_t *votes, uint32_t from, uint32_t n, uint32_t tau, uint32_t *eq,
		   uint32_t *out, uint32_t o)
{
	for (uint32_t i = from; i < n; i++) {
		if (votes[i] > tau) {
			out[o++] = i;
		} else if (votes[i] == tau && *eq) {
			out[o++] = i;
			(*eq)--;
		}
	}
	return o;
}

#if defined(__x86_64__)
/* byte j of emit_lut[m]: the position of the j-th set bit of m (left-packing 8 lanes) */
static uint64_t emit_lut[256];

__attribute__((constructor)) static void
emit_lut_init(void)
{
	for (unsigned int m = 0; m < 256; m++) {
		uint64_t v = 0;
		unsigned int j = 0;

		for (unsigned int b = 0; b < 8; b++)
			if (m >> b & 1)
				v |= (uint64_t)b << (8 * j++);
		emit_lut[m] = v;
	}
}

/*
 * The selected positions of 32 votes go out 8 at a time without a branch per position: the
 * lookup table left-packs the 8 lane numbers of a mask byte, and all 8 are stored (the ones past
 * the popcount are overwritten next). That writes up to 7 entries past the last one kept, so it
 * runs while 32 more fit in @out; the scalar loop finishes.
 */
__attribute__((target("avx2,fma,popcnt,bmi"))) static uint32_t
select_emit_avx2(const uint8_t *votes, uint32_t n, uint32_t c, uint32_t tau, uint32_t eq,
		 uint32_t *out)
{
	const __m256i t = _mm256_set1_epi8((char)tau);
	uint32_t o = 0, i = 0;

	for (; i + 32 <= n && o + 32 <= c; i += 32) {
		__m256i v = _mm256_loadu_si256((const __m256i *)(votes + i));
		/* votes are <= 96, so the signed byte compare is exact */
		uint32_t mgt = (uint32_t)_mm256_movemask_epi8(_mm256_cmpgt_epi8(v, t));
		uint32_t meq = eq ? (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, t)) : 0;
		uint32_t m;

		if (meq) {
			uint32_t pc = (uint32_t)__builtin_popcount(meq);

			if (pc > eq) {
				uint32_t keep = 0;

				for (uint32_t k = 0; k < eq; k++) {
					keep |= meq & -meq;
					meq &= meq - 1;
				}
				meq = keep;
				pc = eq;
			}
			eq -= pc;
		}
		m = mgt | meq;
		for (uint32_t g = 0; g < 32 && m >> g; g += 8) {
			uint32_t mb = (m >> g) & 0xff;
			__m256i lane =
			    _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)emit_lut[mb]));

			_mm256_storeu_si256(
			    (__m256i *)(out + o),
			    _mm256_add_epi32(lane, _mm256_set1_epi32((int)(i + g))));
			o += (uint32_t)__builtin_popcount(mb);
		}
	}
	return select_emit_scalar(votes, i, n, tau, &eq, out, o);
}
#endif

uint32_t
kvt_paris_select(const uint8_t *votes, uint32_t n, uint32_t c, const uint32_t *hist,
		 uint32_t *ret_cand)
{
	uint32_t own[KVT_PARIS_MAX_VOTE + 1] = {0};
	uint32_t tau, eq;

	if (c >= n) {
		for (uint32_t i = 0; i < n; i++)
			ret_cand[i] = i;
		return n;
	}
	if (!c)
		return 0;
	if (!hist) {
		hist_add(votes, n, own);
		hist = own;
	}
	select_cut(hist, c, &tau, &eq);
#if defined(__x86_64__)
	if (kvt_simd_level() >= KVT_SIMD_AVX2)
		return select_emit_avx2(votes, n, c, tau, eq, ret_cand);
#endif
	return select_emit_scalar(votes, 0, n, tau, &eq, ret_cand, 0);
}

/*
 * kvt_paris_select() over the live keys of @ix: @hist leaves the dropped ones out and they vote
 * 0, so they can only be reached when the cut falls at vote 0, where they are skipped. With
 * c >= live (no votes taken), every live key.
 */
uint32_t
kvt_paris_select_live(const struct kvt_paris_index *ix, const uint8_t *votes, uint32_t c,
		      const uint32_t *hist, uint32_t *ret_cand)
{
	uint32_t n = ix->n, live = kvt_paris_index_live(ix), tau, eq, o = 0;

	if (!ix->ndead)
		return kvt_paris_select(votes, n, c, hist, ret_cand);
	if (c >= live) {
		for (uint32_t i = 0; i < n; i++)
			if (!key_dead(ix, i))
				ret_cand[o++] = i;
		return o;
	}
	select_cut(hist, c, &tau, &eq);
	if (tau)
		return kvt_paris_select(votes, n, c, hist, ret_cand);
	for (uint32_t i = 0; i < n; i++) {
		if (votes[i]) {
			ret_cand[o++] = i;
		} else if (eq && !key_dead(ix, i)) {
			ret_cand[o++] = i;
			eq--;
		}
	}
	return o;
}

/* ---- rerank: 4-bit RSQ-IP estimates of the candidates (scalar, AVX2, AVX-512) ---------------- */

static void
rerank_scalar(const struct kvt_paris_index *ix, const struct kvt_paris_query *q, float norm,
	      const uint32_t *cand, uint32_t nc, float *ret_score)
{
	uint32_t nb = ix->nblk;

	for (uint32_t k = 0; k < nc; k++) {
		uint32_t i = cand[k], p = i >> ix->page_shift, off = i & (ix->page_keys - 1);
		const uint8_t *code = key_code(ix, p, off);
		const float *w = key_w(ix, p, off);
		float s = 0.0f;

		for (uint32_t b = 0; b < nb; b++) {
			uint32_t word = (uint32_t)code[4 * b] | (uint32_t)code[4 * b + 1] << 8 |
					(uint32_t)code[4 * b + 2] << 16 |
					(uint32_t)code[4 * b + 3] << 24;
			float acc = 0.0f;

			for (unsigned int j = 0; j < KVT_PARIS_M; j++) {
				uint32_t nib = (word >> (4 * j)) & 15;
				float v = kvt_paris_level[nib & 7] * q->y[KVT_PARIS_M * b + j];

				acc += (nib & 8) ? v : -v;
			}
			s += w[b] * acc;
		}
		ret_score[k] = norm * s;
	}
}

#if defined(__x86_64__)
#define KVT_RERANK_PREFETCH 16 /* candidates ahead: ~2 cache lines each, scattered */

/* The records of candidates k .. k + 3 (the tail repeats one), and a prefetch of those
 * KVT_RERANK_PREFETCH further on: a record is 8 * NB bytes at a multiple of that, one or two
 * lines. */
static inline __attribute__((always_inline)) void
rerank_next4(const struct kvt_paris_index *ix, const uint32_t *cand, uint32_t k, uint32_t nc,
	     const uint32_t NB, const uint8_t **ret_rec)
{
	for (uint32_t j = 0; j < 4; j++) {
		uint32_t i = cand[k + j < nc ? k + j : k];

		ret_rec[j] = key_code(ix, i >> ix->page_shift, i & (ix->page_keys - 1));
		if (k + KVT_RERANK_PREFETCH + j < nc) {
			uint32_t f = cand[k + KVT_RERANK_PREFETCH + j];
			const char *rf = (const char *)key_code(ix, f >> ix->page_shift,
								f & (ix->page_keys - 1));

			_mm_prefetch(rf, _MM_HINT_T0);
			if (NB == 16)
				_mm_prefetch(rf + 64, _MM_HINT_T0);
		}
	}
}

/* Four records' lane sums to four scores (three vhaddps and an add), stored at k (fewer at the
 * tail). */
__attribute__((target("avx2,fma"), always_inline)) static inline void
rerank_store4(__m256 *a, float norm, uint32_t k, uint32_t nc, float *ret_score)
{
	__m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
	__m128 r = _mm_mul_ps(_mm_set1_ps(norm),
			      _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));

	if (k + 4 <= nc) {
		_mm_storeu_ps(ret_score + k, r);
	} else {
		float t[4];

		_mm_storeu_ps(t, r);
		memcpy(ret_score + k, t, (nc - k) * sizeof(float));
	}
}

/*
 * Two blocks per AVX2 register: vpmovzxbd widens their 8 code bytes to 8 lanes, byte m of a block
 * holding dim 2m in its low nibble and dim 2m + 1 in its high one. So the low nibbles meet the
 * even dims of the (pre-split) query and the high nibbles the odd ones; vpermps picks the level
 * with the nibble's low 3 bits and the inverted sign bit, moved to bit 31, gives the float sign.
 * Returns the 8 lane sums of w_b * <v_b, y_b> for one key record.
 */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256
rerank_rec(const uint8_t *code, const __m256 *qe, const __m256 *qo, const __m256i *wsel,
	   const uint32_t NB)
{
	const __m256i m8 = _mm256_set1_epi32(8);
	const __m256 lev = _mm256_loadu_ps(kvt_paris_level);
	const float *w = (const float *)(code + 4 * NB);
	__m256 acc = _mm256_setzero_ps();

#pragma GCC unroll 8
	for (uint32_t pr = 0; pr < NB / 2; pr++) {
		__m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(code + 8 * pr)));
		__m256i xo = _mm256_srli_epi32(x, 4);
		__m256 se = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_andnot_si256(x, m8), 28));
		__m256 so = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_andnot_si256(xo, m8), 28));
		__m256 ve = _mm256_xor_ps(_mm256_permutevar8x32_ps(lev, x), se);
		__m256 vo = _mm256_xor_ps(_mm256_permutevar8x32_ps(lev, xo), so);
		__m256 wv =
		    _mm256_permutevar8x32_ps(_mm256_loadu_ps(w + 8 * (pr / 4)), wsel[pr % 4]);

		acc = _mm256_fmadd_ps(_mm256_fmadd_ps(ve, qe[pr], _mm256_mul_ps(vo, qo[pr])), wv,
				      acc);
	}
	return acc;
}

/* Candidates go four at a time: four independent FMA chains, and one transposing reduction
 * (three vhaddps and an add) for the four sums instead of four horizontal sums. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
rerank_avx2_nb(const struct kvt_paris_index *ix, const struct kvt_paris_query *q, float norm,
	       const uint32_t *cand, uint32_t nc, float *ret_score, const uint32_t NB)
{
	__m256 qe[KVT_PARIS_MAX_BLK / 2], qo[KVT_PARIS_MAX_BLK / 2];
	__m256i wsel[4];
	uint32_t k = 0;

	for (uint32_t pr = 0; pr < NB / 2; pr++) {
		float e[8], o[8];

		for (unsigned int l = 0; l < 8; l++) {
			const float *y = q->y + KVT_PARIS_M * (2 * pr + l / 4) + 2 * (l % 4);

			e[l] = y[0];
			o[l] = y[1];
		}
		qe[pr] = _mm256_loadu_ps(e);
		qo[pr] = _mm256_loadu_ps(o);
	}
	for (int pr = 0; pr < 4; pr++)
		wsel[pr] = _mm256_setr_epi32(2 * pr, 2 * pr, 2 * pr, 2 * pr, 2 * pr + 1, 2 * pr + 1,
					     2 * pr + 1, 2 * pr + 1);
	for (; k < nc; k += 4) {
		const uint8_t *rec[4];
		__m256 a[4];

		rerank_next4(ix, cand, k, nc, NB, rec);
		for (uint32_t j = 0; j < 4; j++)
			a[j] = rerank_rec(rec[j], qe, qo, wsel, NB);
		rerank_store4(a, norm, k, nc, ret_score);
	}
}

__attribute__((target("avx2,fma"))) static void
rerank_avx2(const struct kvt_paris_index *ix, const struct kvt_paris_query *q, float norm,
	    const uint32_t *cand, uint32_t nc, float *ret_score)
{
	if (ix->nblk == 16)
		rerank_avx2_nb(ix, q, norm, cand, nc, ret_score, 16);
	else
		rerank_avx2_nb(ix, q, norm, cand, nc, ret_score, 8);
}

/*
 * The AVX2 scheme with four blocks per register: vpmovzxbd widens 16 code bytes to 16 lanes and
 * vpermps over a 16-entry copy of the levels ignores the sign bit in the index. Each record's 16
 * lane sums fold to 8 and go through the AVX2 reduction, four candidates at a time.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"), always_inline)) static inline __m256
rerank_rec512(const uint8_t *code, const __m512 *qe, const __m512 *qo, const __m512 lev,
	      const __m512i *wsel, const uint32_t NB)
{
	const __m512i m8 = _mm512_set1_epi32(8);
	const float *w = (const float *)(code + 4 * NB);
	/* the record's NB weights: 16 floats, or 8 and nothing read past them */
	const __m512 wall =
	    NB == 16 ? _mm512_loadu_ps(w) : _mm512_castps256_ps512(_mm256_loadu_ps(w));
	__m512 acc = _mm512_setzero_ps();

#pragma GCC unroll 4
	for (uint32_t r = 0; r < NB / 4; r++) {
		__m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(code + 16 * r)));
		__m512i xo = _mm512_srli_epi32(x, 4);
		__m512i se = _mm512_slli_epi32(_mm512_andnot_si512(x, m8), 28);
		__m512i so = _mm512_slli_epi32(_mm512_andnot_si512(xo, m8), 28);
		/* integer xor: the float one is AVX-512 DQ */
		__m512 ve = _mm512_castsi512_ps(
		    _mm512_xor_si512(_mm512_castps_si512(_mm512_permutexvar_ps(x, lev)), se));
		__m512 vo = _mm512_castsi512_ps(
		    _mm512_xor_si512(_mm512_castps_si512(_mm512_permutexvar_ps(xo, lev)), so));
		__m512 wv = _mm512_permutexvar_ps(wsel[r], wall);

		acc =
		    _mm512_fmadd_ps(_mm512_fmadd_ps(ve, qe[r], _mm512_mul_ps(vo, qo[r])), wv, acc);
	}
	return _mm256_add_ps(_mm512_castps512_ps256(acc),
			     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"), always_inline)) static inline void
rerank_avx512_nb(const struct kvt_paris_index *ix, const struct kvt_paris_query *q, float norm,
		 const uint32_t *cand, uint32_t nc, float *ret_score, const uint32_t NB)
{
	__m512 qe[KVT_PARIS_MAX_BLK / 4], qo[KVT_PARIS_MAX_BLK / 4], lev;
	__m512i wsel[KVT_PARIS_MAX_BLK / 4];
	float l16[16];

	for (unsigned int l = 0; l < 16; l++)
		l16[l] = kvt_paris_level[l & 7];
	lev = _mm512_loadu_ps(l16);
	for (uint32_t r = 0; r < NB / 4; r++) {
		float e[16], o[16];
		int32_t ws[16];

		for (unsigned int l = 0; l < 16; l++) {
			const float *y = q->y + KVT_PARIS_M * (4 * r + l / 4) + 2 * (l % 4);

			e[l] = y[0];
			o[l] = y[1];
			ws[l] = (int32_t)(4 * r + l / 4);
		}
		qe[r] = _mm512_loadu_ps(e);
		qo[r] = _mm512_loadu_ps(o);
		wsel[r] = _mm512_loadu_si512(ws);
	}
	for (uint32_t k = 0; k < nc; k += 4) {
		const uint8_t *rec[4];
		__m256 a[4];

		rerank_next4(ix, cand, k, nc, NB, rec);
		for (uint32_t j = 0; j < 4; j++)
			a[j] = rerank_rec512(rec[j], qe, qo, lev, wsel, NB);
		rerank_store4(a, norm, k, nc, ret_score);
	}
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) static void
rerank_avx512(const struct kvt_paris_index *ix, const struct kvt_paris_query *q, float norm,
	      const uint32_t *cand, uint32_t nc, float *ret_score)
{
	if (ix->nblk == 16)
		rerank_avx512_nb(ix, q, norm, cand, nc, ret_score, 16);
	else
		rerank_avx512_nb(ix, q, norm, cand, nc, ret_score, 8);
}
#endif

/* The estimates for a query of norm @norm: the search passes 1 and ranks the unit query's
 * estimates, which neither overflow nor underflow whatever the query's scale. */
void
kvt_paris_rerank_norm(const struct kvt_paris_index *ix, const struct kvt_paris_query *q, float norm,
		      const uint32_t *cand, uint32_t nc, float *ret_score)
{
#if defined(__x86_64__)
	if (kvt_simd_level() >= KVT_SIMD_AVX512) {
		rerank_avx512(ix, q, norm, cand, nc, ret_score);
		return;
	}
	if (kvt_simd_level() >= KVT_SIMD_AVX2) {
		rerank_avx2(ix, q, norm, cand, nc, ret_score);
		return;
	}
#endif
	rerank_scalar(ix, q, norm, cand, nc, ret_score);
}

void
kvt_paris_rerank(const struct kvt_paris_index *ix, const struct kvt_paris_query *q,
		 const uint32_t *cand, uint32_t nc, float *ret_score)
{
	kvt_paris_rerank_norm(ix, q, q->norm, cand, nc, ret_score);
}

/* ---- top-k of scored positions: partial sort and heap ---------------------------------------- */

/*
 * (score, index) as one integer that sorts ascending in the order top-k wants: higher score
 * first, then lower index. -0 and +0 are one score; NaN ranks after every number.
 */
static inline uint64_t
rank_key(float s, uint32_t idx)
{
	uint32_t u;

	if (!(s == s)) {
		u = 0;
	} else {
		s += 0.0f; /* -0 -> +0 */
		memcpy(&u, &s, sizeof(u));
		u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending with the float */
	}
	return (uint64_t)~u << 32 | idx;
}

static inline float
rank_score(uint64_t key)
{
	uint32_t u = ~(uint32_t)(key >> 32);
	float s;

	u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
	memcpy(&s, &u, sizeof(s));
	return s;
}

/* a ranks before b: higher score, then lower index (NaN last) */
static inline bool
better(float sa, uint32_t ia, float sb, uint32_t ib)
{
	return rank_key(sa, ia) < rank_key(sb, ib);
}

/* Min-heap on "better": the root is the worst of the kept entries. */
static void
heap_down(uint32_t *hi, float *hs, uint32_t n, uint32_t at)
{
	for (;;) {
		uint32_t l = 2 * at + 1, r = l + 1, w = at;

		if (l < n && better(hs[w], hi[w], hs[l], hi[l]))
			w = l;
		if (r < n && better(hs[w], hi[w], hs[r], hi[r]))
			w = r;
		if (w == at)
			return;
		uint32_t ti = hi[at];
		float ts = hs[at];

		hi[at] = hi[w];
		hs[at] = hs[w];
		hi[w] = ti;
		hs[w] = ts;
		at = w;
	}
}

/*
 * Sorts the @need smallest of @n keys into a[0..need), ascending; the rest is left in any order.
 * Quicksort that only descends into parts holding some of the first @need: O(n + need log need)
 * expected.
 */
static void
psort_keys(uint64_t *a, uint32_t n, uint32_t need)
{
	while (n > 16 && need) {
		uint32_t mid = (n - 1) / 2, i, j;
		uint64_t p, t;

		/* median of three, which also leaves sentinels at both ends */
		if (a[mid] < a[0])
			t = a[0], a[0] = a[mid], a[mid] = t;
		if (a[n - 1] < a[0])
			t = a[0], a[0] = a[n - 1], a[n - 1] = t;
		if (a[n - 1] < a[mid])
			t = a[mid], a[mid] = a[n - 1], a[n - 1] = t;
		p = a[mid];
		i = 0;
		j = n - 1;
		for (;;) { /* Hoare: a[0..j] <= p <= a[j+1..n), 0 <= j < n - 1 */
			while (a[i] < p)
				i++;
			while (a[j] > p)
				j--;
			if (i >= j)
				break;
			t = a[i], a[i] = a[j], a[j] = t;
			i++;
			j--;
		}
		if (j + 1 >= need) {
			n = j + 1; /* the first need are all on the left */
			continue;
		}
		/* the left is needed whole, the right in part: recurse into the smaller, so the
		 * stack stays O(log n) whatever the data */
		if (j + 1 <= n - (j + 1)) {
			psort_keys(a, j + 1, j + 1);
			a += j + 1;
			n -= j + 1;
			need -= j + 1;
		} else {
			psort_keys(a + j + 1, n - (j + 1), need - (j + 1));
			n = j + 1;
			need = j + 1;
		}
	}
	for (uint32_t i = 1; i < n; i++) { /* insertion sort of the short rest */
		uint64_t v = a[i];
		uint32_t j = i;

		for (; j && a[j - 1] > v; j--)
			a[j] = a[j - 1];
		a[j] = v;
	}
}

/*
 * A floor for the k-th best of @n scores, from a strided sample of 1024 to 2047: the r-th best
 * sample, r about twice the sample's expected share of the top k plus a margin, so that
 * usually at least k scores clear it and about 2k + n / 64 do. -INFINITY when the sample
 * says nothing useful (small n, or not enough numbers in the sample); the caller checks that k
 * scores cleared it. The sample is selected, not streamed through a heap: scores that rise with
 * the index (newer keys) would replace a heap's root at nearly every step.
 */
static float
score_floor(const float *score, uint32_t n, uint32_t k)
{
	uint32_t stride, m, r, used = 0;
	uint64_t key[2048]; /* m < 2048: stride is n / 1024 rounded down */

	if (n < 1024 || (uint64_t)k * 16 > n)
		return -INFINITY;
	stride = n / 1024;
	m = n / stride;
	r = (uint32_t)((uint64_t)2 * k * m / n) + 16;
	if (r > 128)
		return -INFINITY;
	for (uint32_t i = 0; i < m; i++) {
		float v = score[(size_t)i * stride];

		if (v == v) /* NaN: no order */
			key[used++] = rank_key(v, 0);
	}
	if (used < r)
		return -INFINITY;
	psort_keys(key, used, r);
	return rank_score(key[r - 1]);
}

/* idx[i], or i itself for idx == NULL (scores of a whole zone in index order) */
static inline uint32_t
idx_at(const uint32_t *idx, uint32_t i)
{
	return idx ? idx[i] : i;
}

/* A size-k heap over all n; returns how many it holds (min(n, k)), not yet sorted. */
static uint32_t
topk_heap(const uint32_t *idx, const float *score, uint32_t n, uint32_t k, uint32_t *ret_idx,
	  float *ret_score)
{
	uint32_t m = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (m < k) {
			ret_idx[m] = idx_at(idx, i);
			ret_score[m] = score[i];
			m++;
			if (m == k)
				for (uint32_t j = k / 2; j-- > 0;)
					heap_down(ret_idx, ret_score, k, j);
		} else if (better(score[i], idx_at(idx, i), ret_score[0], ret_idx[0])) {
			ret_idx[0] = idx_at(idx, i);
			ret_score[0] = score[i];
			heap_down(ret_idx, ret_score, k, 0);
		}
	}
	return m;
}

/*
 * The positions of the scores at or above @floor into @pos (@cap entries). Returns how many, or
 * UINT32_MAX when they do not fit.
 */
static uint32_t
topk_gather_scalar(const float *score, uint32_t n, float floor, uint64_t *pos, uint32_t cap)
{
	uint32_t m = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (m == cap)
			return UINT32_MAX;
		pos[m] = i;
		m += score[i] >= floor; /* branch-free: a few percent pass */
	}
	return m;
}

#if defined(__x86_64__)
/* Eight scores a compare; the few groups with a pass give their positions bit by bit. */
__attribute__((target("avx2,bmi"))) static uint32_t
topk_gather_avx2(const float *score, uint32_t n, float floor, uint64_t *pos, uint32_t cap)
{
	const __m256 f = _mm256_set1_ps(floor);
	uint32_t m = 0, i = 0;

	for (; i + 8 <= n; i += 8) {
		uint32_t mask = (uint32_t)_mm256_movemask_ps(
		    _mm256_cmp_ps(_mm256_loadu_ps(score + i), f, _CMP_GE_OQ));

		if (!mask)
			continue;
		if (cap - m < 8)
			return UINT32_MAX;
		for (; mask; mask &= mask - 1)
			pos[m++] = i + (uint32_t)__builtin_ctz(mask);
	}
	for (; i < n; i++) {
		if (!(score[i] >= floor))
			continue;
		if (m == cap)
			return UINT32_MAX;
		pos[m++] = i;
	}
	return m;
}
#endif

static uint32_t
topk_gather(const float *score, uint32_t n, float floor, uint64_t *pos, uint32_t cap)
{
#if defined(__x86_64__)
	if (kvt_simd_level() >= KVT_SIMD_AVX2)
		return topk_gather_avx2(score, n, floor, pos, cap);
#endif
	return topk_gather_scalar(score, n, floor, pos, cap);
}

#define KVT_TOPK_STACK 2048 /* keys gathered on the stack; more go to the heap */

/* kvt_paris_topk_select(), and @idx NULL for the identity (index i at position i) */
static void
topk_select(const uint32_t *idx, const float *score, uint32_t n, uint32_t k, uint32_t *ret_idx,
	    float *ret_score)
{
	uint64_t stack[KVT_TOPK_STACK], *buf = stack;
	uint32_t m = 0, cap;
	float floor;

	if (!k)
		return;
	/*
	 * The scores at or above a sampled floor (every one of the top k when k of them clear it:
	 * about 2k + n / 64 of them) are gathered as sortable keys and partly sorted. When the
	 * floor says nothing, lets fewer than k through or more than twice its estimate, a heap
	 * over all n does the job.
	 */
	floor = score_floor(score, n, k);
	if (floor > -INFINITY) {
		cap = 4 * k + n / 32;
		if (cap > n)
			cap = n;
		if (cap > KVT_TOPK_STACK)
			buf = malloc((size_t)cap * sizeof(*buf));
		m = buf ? topk_gather(score, n, floor, buf, cap) : UINT32_MAX;
		if (m != UINT32_MAX && m >= k) {
			for (uint32_t j = 0; j < m; j++) /* positions become sortable keys */
				buf[j] = rank_key(score[buf[j]], idx_at(idx, (uint32_t)buf[j]));
			psort_keys(buf, m, k);
			for (uint32_t j = 0; j < k; j++) {
				ret_idx[j] = (uint32_t)buf[j];
				ret_score[j] = rank_score(buf[j]);
			}
			if (buf != stack)
				free(buf);
			return;
		}
		if (buf != stack)
			free(buf);
	}
	m = topk_heap(idx, score, n, k, ret_idx, ret_score);
	if (m < k)
		for (uint32_t j = m / 2; j-- > 0;)
			heap_down(ret_idx, ret_score, m, j);
	/* heap sort: repeatedly move the worst to the end, leaving best-first order */
	for (uint32_t end = m; end > 1; end--) {
		uint32_t ti = ret_idx[0];
		float ts = ret_score[0];

		ret_idx[0] = ret_idx[end - 1];
		ret_score[0] = ret_score[end - 1];
		ret_idx[end - 1] = ti;
		ret_score[end - 1] = ts;
		heap_down(ret_idx, ret_score, end - 1, 0);
	}
}

void
kvt_paris_topk_select(const uint32_t *idx, const float *score, uint32_t n, uint32_t k,
		      uint32_t *ret_idx, float *ret_score)
{
	topk_select(idx, score, n, k, ret_idx, ret_score);
}

/* ---- scratch, the exact refine and the search pipeline --------------------------------------- */

void
kvt_paris_scratch_fini(struct kvt_paris_scratch *s)
{
	if (!s)
		return;
	free(s->votes);
	free(s->cand);
	free(s->score);
	free(s->ref_idx);
	free(s->ref_score);
	s->votes = NULL;
	s->cand = NULL;
	s->score = NULL;
	s->ref_idx = NULL;
	s->ref_score = NULL;
	s->votes_cap = s->cand_cap = s->ref_cap = 0;
	free(s->sk_idx);
	free(s->sk_score);
	free(s->sk_bar);
	s->sk_idx = NULL;
	s->sk_score = NULL;
	s->sk_bar = NULL;
	s->sk_cap = s->sk_bar_cap = 0;
	free(s->sk_cand);
	s->sk_cand = NULL;
	s->sk_cand_cap = 0;
	free(s->sk_tab);
	s->sk_tab = NULL;
	free(s->sk_grp);
	s->sk_grp = NULL;
	s->sk_grp_cap = 0;
	free(s->sk_gmap);
	s->sk_gmap = NULL;
	s->sk_gmap_cap = 0;
}

int
kvt_paris_scratch_reserve(struct kvt_paris_scratch *s, size_t votes, size_t cand, size_t ref)
{
	if (ref > s->ref_cap) {
		uint32_t *c = malloc(ref * sizeof(*c));
		float *f = malloc(ref * sizeof(*f));

		if (!c || !f) {
			free(c);
			free(f);
			return -ENOMEM;
		}
		free(s->ref_idx);
		free(s->ref_score);
		s->ref_idx = c;
		s->ref_score = f;
		s->ref_cap = ref;
	}
	if (votes > s->votes_cap) {
		uint8_t *v = aligned_alloc(64, (votes + 63) & ~(size_t)63);

		if (!v)
			return -ENOMEM;
		free(s->votes);
		s->votes = v;
		s->votes_cap = votes;
	}
	if (cand > s->cand_cap) {
		uint32_t *c = malloc(cand * sizeof(*c));
		float *f = malloc(cand * sizeof(*f));

		if (!c || !f) {
			free(c);
			free(f);
			return -ENOMEM;
		}
		free(s->cand);
		free(s->score);
		s->cand = c;
		s->score = f;
		s->cand_cap = cand;
	}
	return 0;
}

#define KVT_REFINE_PREFETCH 8 /* keys announced ahead of the exact rescoring */

bool
kvt_paris_exact_covers(uint32_t live, unsigned int dim, uint32_t refine,
		       const struct kvt_paris_keys *keys)
{
	if (refine >= live || live <= KVT_PARIS_REFINE_ALL)
		return true;
	return keys && keys->rows &&
	       (uint64_t)live * dim * (keys->dtype == KVT_DTYPE_F32 ? 4 : 2) <=
		   KVT_PARIS_EXACT_BYTES;
}

bool
kvt_paris_sketch_pays(uint32_t live, unsigned int dim, const struct kvt_paris_keys *keys)
{
	return !keys->rows || (uint64_t)live * dim * (keys->dtype == KVT_DTYPE_F32 ? 4 : 2) >
				  KVT_PARIS_SKETCH_BYTES;
}

/*
 * Exact scores of the @nr keys listed in @idx into @ret_score, in list order. Consecutive
 * indices are read as runs of @rows where the caller offers them (one kvt_simd_dot_rows() call
 * per run); other keys one by one through @get, announced KVT_REFINE_PREFETCH ahead to
 * @prefetch. Returns 0 or -EIO.
 */
int
kvt_paris_score_list(const struct kvt_paris_query *q, const struct kvt_paris_keys *keys,
		     const uint32_t *idx, uint32_t nr, float *tmp, float *ret_score)
{
	if (keys->rows) {
		/* the refine's keys are scattered: announce them ahead, as for get */
		if (keys->prefetch)
			for (uint32_t i = 0; i < nr && i < KVT_REFINE_PREFETCH; i++)
				keys->prefetch(keys->ctx, idx[i]);
		for (uint32_t i = 0; i < nr;) {
			uint32_t run = 0, len = 1;
			const void *row;

			if (keys->prefetch && i + KVT_REFINE_PREFETCH < nr)
				keys->prefetch(keys->ctx, idx[i + KVT_REFINE_PREFETCH]);
			row = keys->rows(keys->ctx, idx[i], &run);

			if (!row) {
				row = keys->get(keys->ctx, idx[i], tmp);
				if (!row)
					return -EIO;
				kvt_simd_dot_rows(row, 0, 1, KVT_DTYPE_F32, q->x, q->dim,
						  &ret_score[i++]);
				continue;
			}
			/* as far as the listed indices stay consecutive, within the run */
			while (len < run && i + len < nr && idx[i + len] == idx[i] + len)
				len++;
			kvt_simd_dot_rows(row, keys->stride, len, keys->dtype, q->x, q->dim,
					  &ret_score[i]);
			i += len;
		}
		return 0;
	}
	if (keys->prefetch)
		for (uint32_t i = 0; i < nr && i < KVT_REFINE_PREFETCH; i++)
			keys->prefetch(keys->ctx, idx[i]);
	for (uint32_t i = 0; i < nr; i++) {
		const float *key;

		if (keys->prefetch && i + KVT_REFINE_PREFETCH < nr)
			keys->prefetch(keys->ctx, idx[i + KVT_REFINE_PREFETCH]);
		key = keys->get(keys->ctx, idx[i], tmp);
		if (!key)
			return -EIO;
		kvt_simd_dot_rows(key, 0, 1, KVT_DTYPE_F32, q->x, q->dim, &ret_score[i]);
	}
	return 0;
}
