/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench-retrieval - recall@k and single-thread time per (layer, head) query of the ParisKV
 * index against an exact fp16 scan and FAISS baselines, on synthetic key sets (gen.h).
 *
 * Methods:
 *   kvtier       ParisKV, the reference ratio schedule (docs/retrieval.md 3.6)
 *   kvtier-wide  the same index searched with rho_cand 0.2, rho_col 0.5 (a tuned schedule)
 *   kvtier-refine what kvtierd runs by default: refine 4k on the refine schedule, and a zone
 *                short enough (kvt_paris_exact_covers()) scored whole and exactly; keys are
 *                read as fp16 rows, the same array the exact peer scans
 *   kvtier-refine-index  the same with the index path forced (KVT_PARIS_EXACT_NEVER)
 *   kvtier-refine-spec  refine 4k on the spec's ratios (0.1, 0.2): what refine alone buys
 *   exact        fp16 keys, full scan with a size-k heap (F16C when the CPU has it)
 *   faiss-flat   IndexFlatIP;  faiss-ivfpq  IndexIVFPQ trained on the first 10 % (the prefill)
 *   faiss-hnsw   IndexHNSWFlat
 *   hnswlib      hnswlib's HNSW (M 32, efC 200) in its inner-product space, SIMD kernels built
 *                for this CPU: the graph peer at full speed (Debian's FAISS runs scalar
 *                distance code)
 *   hnswlib-l2   the same over the exact MIPS-to-L2 reduction: neither way wins everywhere
 * Ground truth is the exact f32 inner-product top-k (double accumulation). Recall is the mean
 * over the queries and its 5th percentile (p5: the worst queries a mean hides). Times are
 * medians over the queries (wall time, or the thread's CPU time with --cpu-time); build times
 * are wall time of one build. Nothing here is a pass/fail test.
 * The index pages come from one mapping advised for transparent huge pages, as kvtierd's pool
 * backs them (--no-thp: one aligned_alloc per page). --stages adds a per-stage breakdown of
 * kvtier's search on stderr.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h> /* mmap, munmap */
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <json-c/json.h>

#include "../llm/kvdump.h"
#include "gen.h"
#include "kvt_cli.h"
#include "paris.h"
#include "quant.h" /* kvt_f16_to_f32 */
#include "simd.h"
#include "sketch.h"
#include "srht.h"
#include "thp.h"
#ifdef KVT_HAVE_FAISS
#include "faiss_peer.h"
#endif
#ifdef KVT_HAVE_HNSWLIB
#include "hnswlib_peer.h"
#endif

#define DMAX 128
/* Key dimension of the running case: DMAX for the synthetic sets, the model's head_dim for real
 * keys (64 for SmolLM2, which is what kvtierd indexes for it). A multiple of 16. */
static int D = DMAX;
#define KMAX 200
#define NK   3
static const uint32_t ks[NK] = {64, 100, 200};

struct row {
	const char *data;
	uint32_t n, k;
	const char *method;
	char param[112]; /* the knob setting, e.g. "rho_cand 0.30 rho_col 0.70 refine 400" */
	double recall, recall_p5, us, build_s;
};

static struct row rows[1024];
static int nrows;
/* HNSW builds above this many keys are skipped: Debian's libfaiss uses its scalar reference
 * distance code, so one-thread HNSW construction takes about 165 s at 32K keys and grows
 * faster than linearly; the default keeps the full run near half an hour. */
static uint32_t hnsw_max = 32768;
static bool no_faiss; /* --no-faiss: kvtier and exact only (FAISS IVFPQ at 1M builds for ~6 min) */
static bool no_thp;   /* --no-thp: index pages from aligned_alloc, not a THP mapping */
static bool stages;   /* --stages: time each stage of the search */
static bool sweep;    /* --sweep: recall-time curves, k = 100, every method's knob swept */
/* --peers: peers run, a bit each: flat, ivfpq, hnsw (enum fpeer_kind order), then hnswlib in
 * its inner-product space and over the MIPS-to-L2 reduction */
static unsigned int peers = 31;
#define PEER_HNSWLIB	(1u << 3)
#define PEER_HNSWLIB_L2 (1u << 4)
#define HNSWLIB_M	32
#define HNSWLIB_EFC	200
static unsigned int build_threads = 1; /* --build-threads: hnswlib's construction threads */
/* hnswlib builds above this many keys are skipped: 1M keys took 6-14 minutes on two threads
 * (each way), so the default full run stops it below that */
static uint32_t hnswlib_max = 262144;

/* Index pages carved from one mapping advised MADV_HUGEPAGE, as kvtierd's pool backs them. */
struct arena {
	uint8_t *base;
	size_t size, used;
};

static void *
arena_get(void *ctx, size_t len)
{
	struct arena *a = ctx;
	void *p;

	len = (len + 4095) & ~(size_t)4095;
	if (a->used + len > a->size)
		return NULL;
	p = a->base + a->used;
	a->used += len;
	return p;
}

static void
arena_put(void *ctx, void *page, size_t len)
{
	(void)ctx;
	(void)page;
	(void)len; /* the mapping goes at once, in arena_fini() */
}

static int
arena_init(struct arena *a, size_t size)
{
	a->used = 0;
	a->base = bench_thp_map(size, &a->size);
	return a->base ? 0 : -ENOMEM;
}

static void
arena_fini(struct arena *a)
{
	if (a->base)
		munmap(a->base, a->size);
	a->base = NULL;
}

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * The clock of per-query times: wall time, or with --cpu-time the thread's CPU time, which on a
 * shared host leaves out the time other processes hold the core (FAISS runs its one OpenMP
 * thread on the calling thread). Builds are always wall time.
 */
static clockid_t qclock = CLOCK_MONOTONIC;

static double
qnow(void)
{
	struct timespec ts;

	clock_gettime(qclock, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double
median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* |got ∩ truth[0..k)| / k; @got may hold -1 (FAISS pads) */
static double
recall_of(const int64_t *got, const uint32_t *truth, uint32_t k)
{
	uint32_t hit = 0;

	for (uint32_t i = 0; i < k; i++)
		for (uint32_t j = 0; j < k; j++)
			if (got[i] == (int64_t)truth[j]) {
				hit++;
				break;
			}
	return (double)hit / k;
}

/*
 * The 5th percentile of @nq per-query recalls (nearest rank: the ceil(nq / 20)-th worst), so
 * that a mean does not hide the queries a method fails. Sorts @rec.
 */
static double
p5(double *rec, uint32_t nq)
{
	uint32_t r = (nq + 19) / 20;

	qsort(rec, nq, sizeof(*rec), cmp_double);
	return rec[r ? r - 1 : 0];
}

/* @rec: the @nq per-query recalls (sorted here); the row holds their mean and p5 */
static void
add_row(const char *data, uint32_t n, uint32_t k, const char *method, const char *param,
	double *rec, uint32_t nq, double us, double build_s)
{
	double recall = 0.0, low;

	for (uint32_t i = 0; i < nq; i++)
		recall += rec[i];
	recall /= nq;
	low = p5(rec, nq);
	if (nrows < (int)(sizeof(rows) / sizeof(rows[0]))) {
		struct row *w = &rows[nrows++];

		*w = (struct row){data, n, k, method, "", recall, low, us, build_s};
		snprintf(w->param, sizeof(w->param), "%s", param);
	}
	fprintf(stderr,
		"  %-11s n=%-8u k=%-4u %-18s recall %.3f p5 %.3f  %10.1f us/query  build %.2f s"
		"  [%s]\n",
		data, n, k, method, recall, low, us, build_s, param);
}

/* ---- size-k heap (min at root), shared by the exact scan and ground truth ---- */

struct heap {
	uint32_t n, k;
	float s[KMAX];
	uint32_t id[KMAX];
};

static void
heap_push(struct heap *h, float s, uint32_t id)
{
	uint32_t at;

	if (h->n < h->k) {
		at = h->n++;
		while (at && h->s[(at - 1) / 2] > s) {
			h->s[at] = h->s[(at - 1) / 2];
			h->id[at] = h->id[(at - 1) / 2];
			at = (at - 1) / 2;
		}
		h->s[at] = s;
		h->id[at] = id;
		return;
	}
	if (s <= h->s[0])
		return;
	at = 0;
	for (;;) {
		uint32_t l = 2 * at + 1, r = l + 1, m = at;
		float ms = s;

		if (l < h->n && h->s[l] < ms) {
			m = l;
			ms = h->s[l];
		}
		if (r < h->n && h->s[r] < ms)
			m = r;
		if (m == at)
			break;
		h->s[at] = h->s[m];
		h->id[at] = h->id[m];
		at = m;
	}
	h->s[at] = s;
	h->id[at] = id;
}

/* Sorted best-first ids out of a heap (destroys it). */
static void
heap_drain(struct heap *h, uint32_t *ret)
{
	uint32_t m = h->n;
	float s[KMAX];
	uint32_t id[KMAX], ord[KMAX];

	memcpy(s, h->s, m * sizeof(float));
	memcpy(id, h->id, m * sizeof(uint32_t));
	for (uint32_t i = 0; i < m; i++)
		ord[i] = i;
	/* insertion sort by score desc, id asc: k <= 200 */
	for (uint32_t i = 1; i < m; i++) {
		uint32_t o = ord[i], j = i;

		while (j && (s[ord[j - 1]] < s[o] ||
			     (s[ord[j - 1]] == s[o] && id[ord[j - 1]] > id[o]))) {
			ord[j] = ord[j - 1];
			j--;
		}
		ord[j] = o;
	}
	for (uint32_t i = 0; i < m; i++)
		ret[i] = id[ord[i]];
}

static void
ground_truth(const float *keys, uint32_t n, const float *q, uint32_t *ret)
{
	struct heap h = {.k = KMAX};

	for (uint32_t i = 0; i < n; i++) {
		double acc = 0.0;

		for (int j = 0; j < D; j++)
			acc += (double)keys[(size_t)i * D + j] * q[j];
		heap_push(&h, (float)acc, i);
	}
	heap_drain(&h, ret);
}

/* ---- exact fp16 scan ---- */

#if defined(__x86_64__)
__attribute__((target("f16c"))) static void
to_f16_f16c(const float *x, size_t n, uint16_t *ret)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(ret + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
								       _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		ret[i] = (uint16_t)_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}
#endif

static void
to_f16(const float *x, size_t n, uint16_t *ret)
{
#if defined(__x86_64__)
	if (kvt_simd_level() >= KVT_SIMD_AVX2) { /* F16C included */
		to_f16_f16c(x, n, ret);
		return;
	}
#endif
	for (size_t i = 0; i < n; i++)
		ret[i] = kvt_f32_to_f16(x[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) static void
exact_scan(const uint16_t *kh, uint32_t n, const float *q, uint32_t k, uint32_t *ret)
{
	struct heap h = {.k = k};
	__m256 qv[DMAX / 8];

	for (int b = 0; b < D / 8; b++)
		qv[b] = _mm256_loadu_ps(q + 8 * b);
	for (uint32_t i = 0; i < n; i++) {
		const uint16_t *r = kh + (size_t)i * D;
		__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
		__m128 x;

		for (int b = 0; b < D / 8; b += 2) {
			a0 = _mm256_fmadd_ps(
			    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8 * b))), qv[b],
			    a0);
			a1 = _mm256_fmadd_ps(
			    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8 * b + 8))),
			    qv[b + 1], a1);
		}
		a0 = _mm256_add_ps(a0, a1);
		x = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
		x = _mm_add_ps(x, _mm_movehl_ps(x, x));
		x = _mm_add_ss(x, _mm_movehdup_ps(x));
		heap_push(&h, _mm_cvtss_f32(x), i);
	}
	heap_drain(&h, ret);
}
#endif

/* ---- kvtier variants ---- */

/* Search settings measured on one index; rho 0 means the spec's schedule. */
static const struct variant {
	const char *name;
	double rho_cand, rho_col;
	uint32_t refine_x; /* refine = refine_x * k (0: off) */
	uint32_t exact;	   /* KVT_PARIS_EXACT_* */
	int sketch;	   /* 1: the int8 sketch (sketch.h) over the f16 rows, 2: over f32 rows */
	uint32_t fast_x;   /* with sketch: the fast path, fast = fast_x * k rescored (0: off) */
	uint32_t probe_pm; /* with fast_x: probe this many thousandths of the zone (>= fast) */
} var[] = {
    {"kvtier", 0.0, 0.0, 0, 0, false, 0, 0},
    {"kvtier-c05", 0.05, 0.20, 0, 0, false, 0,
     0}, /* the adaptive-k variants' rho_cand at N >= 30K (3.6) */
    {"kvtier-wide", 0.2, 0.5, 0, 0, false, 0, 0},
    {"kvtier-refine", 0.0, 0.0, 4, KVT_PARIS_EXACT_AUTO, false, 0, 0}, /* kvtierd's default */
    {"kvtier-refine-index", 0.0, 0.0, 4, KVT_PARIS_EXACT_NEVER, false, 0, 0},
    {"kvtier-refine-spec", 0.10, 0.20, 4, KVT_PARIS_EXACT_NEVER, false, 0,
     0},							      /* refine, spec's ratios */
    {"kvtier-sketch", 0.0, 0.0, 4, KVT_PARIS_EXACT_AUTO, true, 0, 0}, /* exact, int8 sketch */
    {"kvtier-fast", 0.0, 0.0, 0, 0, true, 16, 0}, /* KVT_TOPK_F_FAST: 2-bit level, 16k rescored */
};
#define NVAR ((int)(sizeof(var) / sizeof(var[0])))

/* --sweep: kvtier's knobs, k = 100. Estimate only (the spec's pipeline at other ratios), and
 * with refine 4k; (0.10, 0.20) is the spec's schedule at N >= 30K, (0.30, 0.70) kvtierd's. */
static struct variant sweep_var[64] = {
    {"kvtier-estimate", 0.05, 0.20, 0, 0, false, 0, 0},
    {"kvtier-estimate", 0.10, 0.20, 0, 0, false, 0, 0},
    {"kvtier-estimate", 0.15, 0.35, 0, 0, false, 0, 0},
    {"kvtier-estimate", 0.20, 0.50, 0, 0, false, 0, 0},
    {"kvtier-estimate", 0.30, 0.70, 0, 0, false, 0, 0},
    {"kvtier-estimate", 0.50, 0.70, 0, 0, false, 0, 0},
    {"kvtier-default", 0.0, 0.0, 4, KVT_PARIS_EXACT_AUTO, false, 0, 0}, /* kvtierd's TOPK */
    {"kvtier-exact", 0.0, 0.0, 4, KVT_PARIS_EXACT_ALWAYS, false, 0,
     0},							       /* the engine's exact scan */
    {"kvtier-sketch", 0.0, 0.0, 4, KVT_PARIS_EXACT_AUTO, true, 0, 0},  /* exact, int8 sketch */
    {"kvtier-sketch-f32", 0.0, 0.0, 4, KVT_PARIS_EXACT_AUTO, 2, 0, 0}, /* the same over f32 keys */
    {"kvtier-fast", 0.0, 0.0, 0, 0, true, 1, 0}, /* the fast path: C = fast_x * k rescored */
    {"kvtier-fast", 0.0, 0.0, 0, 0, true, 2, 0},
    {"kvtier-fast", 0.0, 0.0, 0, 0, true, 3, 0},
    {"kvtier-fast", 0.0, 0.0, 0, 0, true, 4, 0},
    {"kvtier-fast", 0.0, 0.0, 0, 0, true, 6, 0},
    {"kvtier-fast", 0.0, 0.0, 0, 0, true, 8, 0},
    {"kvtier-fast", 0.0, 0.0, 0, 0, true, 12, 0},
    {"kvtier-fast", 0.0, 0.0, 0, 0, true, 16, 0},
    /* probing: only the groups (64 keys, 16 at D = 64) whose means best match the query, the best C
     * of their keys (2-bit estimates; int8 at head_dim 64) scored exactly */
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 5},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 5},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 5},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 10},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 10},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 10},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 20},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 20},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 20},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 30},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 30},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 30},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 50},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 50},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 50},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 70},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 70},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 70},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 100},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 100},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 100},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 150},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 150},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 150},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 200},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 200},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 200},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 1, 300},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 2, 300},
    {"kvtier-probe", 0.0, 0.0, 0, 0, true, 4, 300},
    {"kvtier-refine", 0.10, 0.20, 4, KVT_PARIS_EXACT_NEVER, false, 0, 0},
    {"kvtier-refine", 0.20, 0.50, 4, KVT_PARIS_EXACT_NEVER, false, 0, 0},
    {"kvtier-refine", 0.30, 0.70, 4, KVT_PARIS_EXACT_NEVER, false, 0, 0},
    {"kvtier-refine", 0.40, 0.70, 4, KVT_PARIS_EXACT_NEVER, false, 0, 0},
    {"kvtier-refine", 0.50, 0.70, 4, KVT_PARIS_EXACT_NEVER, false, 0, 0},
    {"kvtier-refine", 0.70, 1.00, 4, KVT_PARIS_EXACT_NEVER, false, 0, 0},
};
static int NSWEEP = 54;
#define NSWEEP_FIXED 48 /* the entries before the index-path ratios --knob replaces */
#define SWEEP_K	     100

/*
 * The refine stage's key accessor. The benchmark holds the raw f32 keys [n][D] and their fp16
 * copy [n][D] (what the exact peer scans, and the precision kvtierd holds f16 models' keys
 * at); the search reads the fp16 rows directly (one run of all n), the f32 keys only through
 * get, which it does not call while rows answers.
 */
struct key_store {
	const float *f32;
	const uint16_t *f16;
	uint32_t n;
};

static const float *
raw_key(void *ctx, uint32_t idx, float *tmp)
{
	(void)tmp;
	return ((const struct key_store *)ctx)->f32 + (size_t)idx * D;
}

static void
raw_key_prefetch(void *ctx, uint32_t idx)
{
	const char *k = (const char *)raw_key(ctx, idx, NULL);

	for (size_t off = 0; off < D * sizeof(float); off += 64)
		__builtin_prefetch(k + off);
}

/* The row the search will read through f16_rows (what kvtierd's accessor prefetches). */
static void
f16_row_prefetch(void *ctx, uint32_t idx)
{
	const struct key_store *ks = ctx;
	const char *row = (const char *)(ks->f16 + (size_t)idx * D);

	for (size_t off = 0; off < D * sizeof(uint16_t); off += 64)
		__builtin_prefetch(row + off);
}

static const void *
f16_rows(void *ctx, uint32_t idx, uint32_t *ret_run)
{
	const struct key_store *ks = ctx;

	*ret_run = ks->n - idx;
	return ks->f16 + (size_t)idx * D;
}

static const void *
f32_rows(void *ctx, uint32_t idx, uint32_t *ret_run)
{
	const struct key_store *ks = ctx;

	*ret_run = ks->n - idx;
	return ks->f32 + (size_t)idx * D;
}

/* ---- --stages: where a search spends its time ---- */

/*
 * The spec's pipeline (k = 100, the reference schedule) stage by stage through the public calls,
 * medians over the queries, on stderr. The result is checked against kvt_paris_search(), so the
 * breakdown describes the search the table measures.
 */
static void
print_stages(const char *name, const struct kvt_paris_index *ix, const struct kvt_srht *srht,
	     const float *qs, uint32_t nq)
{
	enum { ST_TAB, ST_VOTES, ST_SELECT, ST_RERANK, ST_TOPK, ST_N };
	static const char *const st_name[ST_N] = {"query+tables", "votes", "select", "rerank",
						  "top-k"};
	const uint32_t k = 100, n = ix->n;
	double rho_cand, rho_col, *t[ST_N], tot = 0.0;
	struct kvt_paris_scratch scr = {0};
	struct kvt_paris_search_opts so = {.k = k};
	uint32_t c, *cand = malloc(n * sizeof(*cand)), got[100], ref[100];
	float *sc = malloc(n * sizeof(*sc)), gs[100], rs[100];
	uint8_t *votes = aligned_alloc(64, kvt_paris_votes_len(ix));
	uint32_t hist[KVT_PARIS_MAX_VOTE + 1];
	static uint8_t tab[KVT_PARIS_MAX_BLK][256];

	for (int i = 0; i < ST_N; i++)
		t[i] = calloc(nq, sizeof(double));
	kvt_paris_schedule(n, &rho_cand, &rho_col);
	c = (uint32_t)ceil((double)n * rho_cand);
	if (c >= n || c < k || !cand || !sc || !votes) {
		fprintf(stderr, "%s n=%u: --stages needs n > 10 k and memory\n", name, n);
		goto out;
	}
	for (uint32_t qi = 0; qi < nq; qi++) {
		struct kvt_paris_query pq, unit;
		double a = qnow(), b;
		uint32_t nc;

		kvt_paris_query_prep(srht, qs + (size_t)qi * D, &pq);
		kvt_paris_vote_tables(ix, &pq, rho_col, tab);
		b = qnow();
		t[ST_TAB][qi] = b - a;
		kvt_paris_votes(ix, (const uint8_t(*)[256])tab, votes, hist);
		a = qnow();
		t[ST_VOTES][qi] = a - b;
		nc = kvt_paris_select(votes, n, c, hist, cand);
		b = qnow();
		t[ST_SELECT][qi] = b - a;
		/* the search ranks the unit query's estimates and scales the k it returns */
		unit = pq;
		unit.norm = 1.0f;
		kvt_paris_rerank(ix, &unit, cand, nc, sc);
		a = qnow();
		t[ST_RERANK][qi] = a - b;
		kvt_paris_topk_select(cand, sc, nc, k, got, gs);
		for (uint32_t i = 0; i < k; i++)
			if (gs[i] != 0.0f)
				gs[i] = (float)(gs[i] * pq.dnorm);
		t[ST_TOPK][qi] = qnow() - a;
		if (kvt_paris_search(ix, &pq, &so, &scr, ref, rs) != (int)k ||
		    memcmp(got, ref, sizeof(got)) || memcmp(gs, rs, sizeof(gs))) {
			fprintf(stderr, "%s n=%u: staged pipeline differs from kvt_paris_search\n",
				name, n);
			goto out;
		}
	}
	fprintf(stderr, "%s n=%u stages (spec schedule, k 100, %u candidates, median us):", name, n,
		c);
	for (int i = 0; i < ST_N; i++) {
		double m = median(t[i], (int)nq) * 1e6;

		tot += m;
		fprintf(stderr, " %s %.0f", st_name[i], m);
	}
	fprintf(stderr, " (sum %.0f)\n", tot);
out:
	for (int i = 0; i < ST_N; i++)
		free(t[i]);
	kvt_paris_scratch_fini(&scr);
	free(cand);
	free(sc);
	free(votes);
}

/* HNSW's efSearch points, both graph peers */
static const unsigned int hnsw_ef[] = {16, 32, 64, 128, 256, 512, 1024, 2048};
#define HNSW_NEF (sizeof(hnsw_ef) / sizeof(hnsw_ef[0]))

#ifdef KVT_HAVE_FAISS
/* ---- --sweep: a FAISS peer's knob ---- */

#define IVF_REFINE_MAX 16 /* ivfpq-refine: 16k PQ candidates rescored exactly */

/*
 * One peer's recall-time curve at k = SWEEP_K: IVFPQ over nprobe 1, 2, 4 .. nlist, and again
 * with the IVF_REFINE_MAX * k best PQ candidates rescored exactly from the f32 keys (what
 * IndexRefineFlat does: IVFPQ alone tops out at its PQ code's recall); HNSW over efSearch
 * 16 .. 1024; flat at its one point. Returns 0 or a negative errno.
 */
static int
peer_sweep(struct fpeer *p, enum fpeer_kind kind, const char *method, const char *name,
	   const float *keys, uint32_t n, const float *qs, uint32_t nq, const uint32_t *truth,
	   double *rec, double *lat, double build)
{
	const unsigned int *ef = hnsw_ef;
	const uint32_t k = SWEEP_K, kr = IVF_REFINE_MAX * SWEEP_K;
	int64_t *ids = malloc(kr * sizeof(*ids)), top[SWEEP_K];
	uint32_t *cid = malloc(kr * sizeof(*cid)), got[SWEEP_K];
	float *cs = malloc(kr * sizeof(*cs)), gs[SWEEP_K];
	unsigned int knob = 1, kmax = fpeer_knob_max(p);
	int r = -ENOMEM;

	if (!ids || !cid || !cs)
		goto out;
	for (unsigned int step = 0;; step++) {
		if (kind == FPEER_IVFPQ && knob > kmax)
			break;
		if (kind == FPEER_HNSW && step == HNSW_NEF)
			break;
		if (kind == FPEER_FLAT && step == 1)
			break;
		if (kind != FPEER_FLAT) {
			r = fpeer_knob(p, kind == FPEER_HNSW ? ef[step] : knob);
			if (r < 0)
				goto out;
		}
		for (int refine = 0; refine < (kind == FPEER_IVFPQ ? 2 : 1); refine++) {
			char param[80];

			for (uint32_t qi = 0; qi < nq; qi++) {
				const float *q = qs + (size_t)qi * D;
				double t0 = qnow();
				uint32_t m = 0;

				r = fpeer_search(p, q, refine ? kr : k, refine ? ids : top);
				if (r < 0)
					goto out;
				if (refine) {
					for (uint32_t i = 0; i < kr; i++) {
						const float *key = keys + (size_t)ids[i] * D;
						float s = 0.0f;

						if (ids[i] < 0)
							continue;
						for (int j = 0; j < D; j++)
							s += key[j] * q[j];
						cid[m] = (uint32_t)ids[i];
						cs[m++] = s;
					}
					kvt_paris_topk_select(cid, cs, m, m < k ? m : k, got, gs);
					for (uint32_t i = 0; i < k; i++)
						top[i] = i < m ? (int64_t)got[i] : -1;
				}
				lat[qi] = qnow() - t0;
				rec[qi] = recall_of(top, truth + (size_t)qi * KMAX, k);
			}
			snprintf(param, sizeof(param), "%s%s", fpeer_describe(p),
				 refine ? ", 16k rescored exactly" : "");
			add_row(name, n, k, refine ? "faiss-ivfpq-refine" : method, param, rec, nq,
				median(lat, nq) * 1e6, build);
		}
		knob *= 2;
	}
	r = 0;
out:
	free(ids);
	free(cid);
	free(cs);
	return r;
}
#endif

#ifdef KVT_HAVE_HNSWLIB
/*
 * hnswlib over @keys: one row per efSearch (hnsw_ef; with --sweep only k = SWEEP_K, otherwise
 * every k of ks[] at efSearch 256). Returns 0 or a negative errno.
 */
static int
hnswlib_case(const char *name, const float *keys, uint32_t n, const float *qs, uint32_t nq,
	     const uint32_t *truth, double *rec, double *lat, bool l2)
{
	const char *method = l2 ? "hnswlib-l2" : "hnswlib";
	struct hpeer *p;
	int64_t ids[KMAX];
	double t0, build;
	int r;

	fprintf(stderr, "%s n=%u: building %s (%u threads)\n", name, n, method, build_threads);
	t0 = now();
	r = hpeer_build(keys, n, (unsigned int)D, HNSWLIB_M, HNSWLIB_EFC, build_threads, l2, &p);
	build = now() - t0;
	if (r < 0)
		return r;
	fprintf(stderr, "  %s: %s, %.1f s\n", method, hpeer_describe(p), build);
	for (unsigned int step = 0; step < (sweep ? HNSW_NEF : NK); step++) {
		unsigned int ef = sweep ? hnsw_ef[step] : 256;
		uint32_t k = sweep ? SWEEP_K : ks[step];
		char param[80];

		/* efSearch below k is k: one point for all of those */
		if (sweep && step + 1 < HNSW_NEF && hnsw_ef[step + 1] <= k)
			continue;
		for (uint32_t qi = 0; qi < nq; qi++) {
			t0 = qnow();
			r = hpeer_search(p, qs + (size_t)qi * D, k, ef, ids);
			lat[qi] = qnow() - t0;
			if (r < 0)
				goto out;
			rec[qi] = recall_of(ids, truth + (size_t)qi * KMAX, k);
		}
		snprintf(param, sizeof(param), "%s efS %u", hpeer_describe(p), ef < k ? k : ef);
		add_row(name, n, k, method, param, rec, nq, median(lat, nq) * 1e6, build);
	}
out:
	hpeer_free(p);
	return r;
}
#endif

/* ---- one (data set, n) ---- */

/* Every method on @keys [n][D] and @qs [nq][D]; rows are named @name. */
static int
run_case(const char *name, const float *keys, uint32_t n, const float *qs, uint32_t nq)
{
	uint32_t *truth = malloc((size_t)nq * KMAX * sizeof(uint32_t));
	double *lat = malloc(nq * sizeof(double)), *rec = malloc(nq * sizeof(double));
	uint16_t *kh = malloc((size_t)n * D * sizeof(uint16_t));
	int64_t ids[KMAX];
	uint32_t got[KMAX];
	float sc[KMAX];
	double t0, build, build_f16;
	int r = -ENOMEM;

	if (!truth || !lat || !rec || !kh)
		goto out;
	fprintf(stderr, "%s n=%u: ground truth for %u queries\n", name, n, nq);
	for (uint32_t qi = 0; qi < nq; qi++)
		ground_truth(keys, n, qs + (size_t)qi * D, truth + (size_t)qi * KMAX);
	t0 = now();
	to_f16(keys, (size_t)n * D, kh);
	build_f16 = now() - t0;

	/* kvtier */
	{
		struct kvt_srht srht;
		struct kvt_paris_index ix;
		struct kvt_paris_scratch scr = {0};
		/* the accessor only reads: ctx is void * for other callers' state */
		struct key_store kst = {keys, kh, n};
		const struct kvt_paris_keys kacc = {.get = raw_key,
						    .ctx = &kst,
						    .prefetch = f16_row_prefetch,
						    .rows = f16_rows,
						    .dtype = KVT_DTYPE_F16,
						    .stride = (size_t)D * sizeof(uint16_t)};
		struct arena ar = {0}, sar = {0};
		const struct kvt_paris_alloc alloc = {arena_get, arena_put, &ar};
		const struct kvt_paris_alloc salloc = {arena_get, arena_put, &sar};
		/* f32 keys as the rows (a model kvtierd holds in f32): exact against the f32 truth
		 */
		const struct kvt_paris_keys kacc32 = {.get = raw_key,
						      .ctx = &kst,
						      .prefetch = raw_key_prefetch,
						      .rows = f32_rows,
						      .dtype = KVT_DTYPE_F32,
						      .stride = (size_t)D * sizeof(float)};
		struct kvt_sketch sk, sk32;
		double build_sk;

		kvt_srht_init(&srht, D, KVT_SRHT_SEED);
		if (!no_thp) {
			size_t pages = (n + KVT_PARIS_PAGE_KEYS - 1) / KVT_PARIS_PAGE_KEYS;

			r = arena_init(
			    &ar, pages * ((kvt_paris_page_bytes(D, KVT_PARIS_PAGE_KEYS) + 4095) &
					  ~(size_t)4095));
			if (r >= 0)
				r = arena_init(
				    &sar, pages * ((kvt_sketch_page_bytes(D, KVT_PARIS_PAGE_KEYS) +
						    4095) &
						   ~(size_t)4095));
			if (r < 0) {
				arena_fini(&ar);
				goto out;
			}
		}
		kvt_paris_index_init(&ix, D, 0, no_thp ? NULL : &alloc);
		kvt_sketch_init(&sk, (unsigned int)D, 0, no_thp ? NULL : &salloc);
		kvt_sketch_init(&sk32, (unsigned int)D, 0, NULL);
		t0 = now();
		r = kvt_paris_index_reserve(&ix, n);
		if (r >= 0)
			r = kvt_paris_index_append(&ix, &srht, keys, D, n);
		build = now() - t0;
		t0 = now();
		if (r >= 0)
			r = kvt_sketch_reserve(&sk, n);
		if (r >= 0) /* from the fp16 rows: what the exact stage reads */
			r = kvt_sketch_append(&sk, kh, (size_t)D * sizeof(uint16_t), KVT_DTYPE_F16,
					      n);
		build_sk = now() - t0;
		if (r >= 0)
			r = kvt_sketch_reserve(&sk32, n);
		if (r >= 0)
			r = kvt_sketch_append(&sk32, keys, (size_t)D * sizeof(float), KVT_DTYPE_F32,
					      n);
		if (r < 0) {
			kvt_paris_index_fini(&ix);
			kvt_sketch_fini(&sk);
			kvt_sketch_fini(&sk32);
			arena_fini(&ar);
			arena_fini(&sar);
			goto out;
		}
		if (stages)
			print_stages(name, &ix, &srht, qs, nq);
		for (int v = 0; v < (sweep ? NSWEEP : NVAR); v++) {
			const struct variant *vr = sweep ? &sweep_var[v] : &var[v];

			for (int ki = 0; ki < NK; ki++) {
				struct kvt_paris_search_opts so = {
				    .k = ks[ki],
				    .rho_cand = vr->rho_cand,
				    .rho_col = vr->rho_col,
				    .refine = vr->refine_x * ks[ki],
				    .keys = !vr->refine_x && !vr->fast_x ? NULL
					    : vr->sketch == 2		 ? &kacc32
									 : &kacc,
				    .exact = vr->exact,
				    .sketch = vr->sketch == 2 ? &sk32
					      : vr->sketch    ? &sk
							      : NULL,
				    .fast = vr->fast_x * ks[ki],
				};
				uint64_t probe = (uint64_t)vr->probe_pm * n / 1000;
				double *read = NULL;
				char param[112];

				if (sweep && ks[ki] != SWEEP_K)
					continue;
				if (vr->sketch && !vr->fast_x)
					read = calloc(nq, sizeof(*read));
				if (vr->sketch && !vr->fast_x && !read) {
					r = -ENOMEM;
					break;
				}
				if (vr->probe_pm)
					so.probe = probe > so.fast ? (uint32_t)probe : so.fast;
				if (vr->probe_pm)
					snprintf(
					    param, sizeof(param),
					    "best groups with %u keys (%.1f %% of the zone), %s, "
					    "%uk rescored%s",
					    so.probe, 100.0 * so.probe / n,
					    D == 64 ? "int8-ranked" : "2-bit-ranked", vr->fast_x,
					    !kvt_paris_fast_pays(n, so.fast)
						? " (short zone: the exact path)"
						: "");
				else if (vr->fast_x)
					snprintf(param, sizeof(param),
						 "2-bit level, %uk rescored%s", vr->fast_x,
						 !kvt_paris_fast_pays(n, vr->fast_x * ks[ki])
						     ? " (short zone: the exact path)"
						     : " (fp16 rows)");
				else if (vr->refine_x && vr->exact == KVT_PARIS_EXACT_ALWAYS)
					snprintf(param, sizeof(param), "every key, fp16 rows");
				else if (vr->refine_x && vr->exact == KVT_PARIS_EXACT_AUTO)
					snprintf(param, sizeof(param),
						 "refine schedule, refine 4k, %s",
						 kvt_paris_exact_covers(n, (unsigned int)D,
									4 * ks[ki], &kacc)
						     ? "exact (zone covered)"
						     : "index");
				else if (vr->rho_cand > 0.0)
					snprintf(param, sizeof(param),
						 "rho_cand %.2f rho_col %.2f%s", vr->rho_cand,
						 vr->rho_col, vr->refine_x ? " refine 4k" : "");
				else
					snprintf(param, sizeof(param), "%s schedule%s",
						 vr->refine_x ? "refine" : "spec",
						 vr->refine_x ? ", refine 4k" : "");
				for (uint32_t qi = 0; qi < nq; qi++) {
					struct kvt_paris_query pq;

					t0 = qnow();
					kvt_paris_query_prep(&srht, qs + (size_t)qi * D, &pq);
					r = kvt_paris_search(&ix, &pq, &so, &scr, got, sc);
					lat[qi] = qnow() - t0;
					if (r < 0)
						break;
					for (uint32_t i = 0; i < ks[ki]; i++)
						ids[i] = got[i];
					rec[qi] = recall_of(ids, truth + (size_t)qi * KMAX, ks[ki]);
					if (read) { /* untimed: how many rows the bound let through
						     */
						uint32_t nread = 0;

						r = kvt_sketch_topk(so.sketch, &ix, &pq, ks[ki],
								    so.keys, NULL, &scr, got, sc,
								    &nread);
						read[qi] = nread;
						if (r < 0)
							break;
					}
				}
				if (read && r >= 0)
					snprintf(param, sizeof(param),
						 "int8 sketch, exact over %s rows, %.0f rows read "
						 "(median)",
						 vr->sketch == 2 ? "f32" : "f16", median(read, nq));
				free(read);
				if (r < 0)
					break;
				add_row(name, n, ks[ki], vr->name, param, rec, nq,
					median(lat, nq) * 1e6,
					vr->sketch ? build + build_sk : build);
			}
		}
		kvt_paris_scratch_fini(&scr);
		kvt_paris_index_fini(&ix);
		kvt_sketch_fini(&sk);
		kvt_sketch_fini(&sk32);
		arena_fini(&ar);
		arena_fini(&sar);
		if (r < 0)
			goto out;
	}

#if defined(__x86_64__)
	/* exact fp16 scan */
	if (kvt_simd_level() >= KVT_SIMD_AVX2) { /* F16C included */
		build = build_f16;
		for (int ki = 0; ki < NK; ki++) {
			if (sweep && ks[ki] != SWEEP_K)
				continue;
			for (uint32_t qi = 0; qi < nq; qi++) {
				t0 = qnow();
				exact_scan(kh, n, qs + (size_t)qi * D, ks[ki], got);
				lat[qi] = qnow() - t0;
				for (uint32_t i = 0; i < ks[ki]; i++)
					ids[i] = got[i];
				rec[qi] = recall_of(ids, truth + (size_t)qi * KMAX, ks[ki]);
			}
			add_row(name, n, ks[ki], "exact", "fp16 scan", rec, nq,
				median(lat, nq) * 1e6, build);
		}
	}
#endif

#ifdef KVT_HAVE_FAISS
	if (!no_faiss) {
		static const char *const fname[3] = {"faiss-flat", "faiss-ivfpq", "faiss-hnsw"};

		for (int kind = 0; kind < 3; kind++) {
			struct fpeer *p;

			if (!(peers & 1u << kind))
				continue;
			if (kind == FPEER_HNSW && n > hnsw_max) {
				fprintf(stderr, "%s n=%u: skipping %s above --hnsw-max %u\n", name,
					n, fname[kind], hnsw_max);
				continue;
			}
			/* PQ's 256 centroids per sub-quantizer need 256 training keys (n / 10) */
			if (kind == FPEER_IVFPQ && n / 10 < 256) {
				fprintf(stderr, "%s n=%u: skipping %s below 2560 keys\n", name, n,
					fname[kind]);
				continue;
			}
			fprintf(stderr, "%s n=%u: building %s\n", name, n, fname[kind]);
			t0 = now();
			r = fpeer_build((enum fpeer_kind)kind, keys, n, D, n / 10, &p);
			build = now() - t0;
			if (r < 0)
				goto out;
			fprintf(stderr, "  %s: %s\n", fname[kind], fpeer_describe(p));
			if (sweep) {
				r = peer_sweep(p, (enum fpeer_kind)kind, fname[kind], name, keys, n,
					       qs, nq, truth, rec, lat, build);
				fpeer_free(p);
				if (r < 0)
					goto out;
				continue;
			}
			for (int ki = 0; ki < NK; ki++) {
				for (uint32_t qi = 0; qi < nq; qi++) {
					t0 = qnow();
					r = fpeer_search(p, qs + (size_t)qi * D, ks[ki], ids);
					lat[qi] = qnow() - t0;
					if (r < 0)
						break;
					rec[qi] = recall_of(ids, truth + (size_t)qi * KMAX, ks[ki]);
				}
				if (r < 0)
					break;
				add_row(name, n, ks[ki], fname[kind], fpeer_describe(p), rec, nq,
					median(lat, nq) * 1e6, build);
			}
			fpeer_free(p);
			if (r < 0)
				goto out;
		}
	}
#endif
#ifdef KVT_HAVE_HNSWLIB
	for (int l2 = 0; l2 < 2; l2++) {
		if (!(peers & (l2 ? PEER_HNSWLIB_L2 : PEER_HNSWLIB)))
			continue;
		if (n > hnswlib_max) {
			fprintf(stderr, "%s n=%u: skipping hnswlib%s above --hnswlib-max %u\n",
				name, n, l2 ? "-l2" : "", hnswlib_max);
			continue;
		}
		r = hnswlib_case(name, keys, n, qs, nq, truth, rec, lat, l2);
		if (r < 0)
			goto out;
	}
#endif
	r = 0;
out:
	free(truth);
	free(lat);
	free(rec);
	free(kh);
	return r;
}

/* ---- --crossover: the whole-zone exact scan against the index path ---- */

/*
 * Where the engine's exact scan (KVT_PARIS_EXACT_ALWAYS: every key as an fp16 row through
 * kvt_simd_dot_rows()) stops being cheaper than its index path (KVT_PARIS_EXACT_NEVER: the
 * refine schedule, refine 4k), per head_dim: for D = 64 and 128, N = 4K, 8K, .. @nmax keys of
 * the outlier set (prefixes of one generated set, one index appended to as N grows), median
 * µs per query at k = 100 of both and of the AVX2 exact peer, the three timed in turn on each
 * query. The index path's recall is counted against the exact scan's result. Rows: data
 * "crossover-d64" / "crossover-d128", methods kvtier-exact, kvtier-index, exact.
 */
static int
run_crossover(uint32_t nmax, uint32_t nq)
{
	static const char *const dname[2] = {"crossover-d64", "crossover-d128"};
	const uint32_t k = 100;
	double *lat[4], *rec = malloc(nq * sizeof(double));
	int r = -ENOMEM;

	for (int m = 0; m < 4; m++)
		lat[m] = malloc(nq * sizeof(double));
	for (int di = 0; di < 2 && rec && lat[0] && lat[1] && lat[2] && lat[3]; di++) {
		float *keys = NULL, *qs = NULL;
		uint16_t *kh = NULL;
		struct kvt_srht srht;
		struct kvt_paris_index ix;
		struct kvt_paris_scratch scr = {0};
		struct arena ar = {0}, sar = {0};
		const struct kvt_paris_alloc alloc = {arena_get, arena_put, &ar};
		const struct kvt_paris_alloc salloc = {arena_get, arena_put, &sar};
		struct kvt_sketch sk = {0};
		struct key_store kst;
		struct kvt_paris_keys kacc;
		size_t pages = (nmax + KVT_PARIS_PAGE_KEYS - 1) / KVT_PARIS_PAGE_KEYS;

		D = di ? 128 : 64;
		r = -ENOMEM;
		keys = malloc((size_t)nmax * D * sizeof(float));
		qs = malloc((size_t)nq * D * sizeof(float));
		kh = malloc((size_t)nmax * D * sizeof(uint16_t));
		if (!keys || !qs || !kh ||
		    arena_init(&ar, pages * ((kvt_paris_page_bytes(D, KVT_PARIS_PAGE_KEYS) + 4095) &
					     ~(size_t)4095)) < 0 ||
		    arena_init(&sar,
			       pages * ((kvt_sketch_page_bytes(D, KVT_PARIS_PAGE_KEYS) + 4095) &
					~(size_t)4095)) < 0)
			goto next;
		r = gen_make(GEN_OUTLIER, nmax, D, nq, 1, keys, qs);
		if (r < 0)
			goto next;
		to_f16(keys, (size_t)nmax * D, kh);
		kvt_srht_init(&srht, D, KVT_SRHT_SEED);
		kvt_paris_index_init(&ix, D, 0, &alloc);
		r = kvt_paris_index_reserve(&ix, nmax);
		kvt_sketch_init(&sk, (unsigned int)D, 0, &salloc);
		if (r >= 0)
			r = kvt_sketch_reserve(&sk, nmax);
		kst = (struct key_store){keys, kh, 0};
		kacc = (struct kvt_paris_keys){.get = raw_key,
					       .ctx = &kst,
					       .prefetch = raw_key_prefetch,
					       .rows = f16_rows,
					       .dtype = KVT_DTYPE_F16,
					       .stride = (size_t)D * sizeof(uint16_t)};
		for (uint32_t n = 4096; r >= 0 && n <= nmax; n *= 2) {
			struct kvt_paris_search_opts so = {.k = k, .refine = 4 * k, .keys = &kacc};
			char param[80];

			r = kvt_paris_index_append(&ix, &srht, keys + (size_t)ix.n * D, D,
						   n - ix.n);
			if (r >= 0)
				r = kvt_sketch_append(&sk, kh + (size_t)sk.n * D,
						      (size_t)D * sizeof(uint16_t), KVT_DTYPE_F16,
						      n - sk.n);
			if (r < 0)
				break;
			kst.n = n;
			for (uint32_t qi = 0; qi < nq; qi++) {
				const float *q = qs + (size_t)qi * D;
				uint32_t ref[100], got[100];
				int64_t ids[100];
				float sc[100];
				struct kvt_paris_query pq;
				double t0 = qnow();

				kvt_paris_query_prep(&srht, q, &pq);
				so.exact = KVT_PARIS_EXACT_ALWAYS;
				r = kvt_paris_search(&ix, &pq, &so, &scr, ref, sc);
				lat[0][qi] = qnow() - t0;
				t0 = qnow();
				kvt_paris_query_prep(&srht, q, &pq);
				so.exact = KVT_PARIS_EXACT_NEVER;
				if (r >= 0)
					r = kvt_paris_search(&ix, &pq, &so, &scr, got, sc);
				lat[1][qi] = qnow() - t0;
				if (r < 0)
					break;
				for (uint32_t i = 0; i < k; i++)
					ids[i] = got[i];
				rec[qi] = recall_of(ids, ref, k);
				t0 = qnow();
				kvt_paris_query_prep(&srht, q, &pq);
				so.exact = KVT_PARIS_EXACT_AUTO;
				so.sketch = &sk;
				r = kvt_paris_search(&ix, &pq, &so, &scr, got, sc);
				so.sketch = NULL;
				lat[3][qi] = qnow() - t0;
				if (r < 0)
					break;
				if (memcmp(got, ref, sizeof(ref))) { /* exact: the scan's list */
					fprintf(stderr,
						"crossover: sketch result differs at n=%u\n", n);
					r = -EPROTO;
					break;
				}
#if defined(__x86_64__)
				t0 = qnow();
				if (kvt_simd_level() >= KVT_SIMD_AVX2)
					exact_scan(kh, n, q, k, got);
				lat[2][qi] = qnow() - t0;
#else
				lat[2][qi] = 0.0;
#endif
			}
			if (r < 0)
				break;
			snprintf(param, sizeof(param), "N*D %llu, every key, fp16 rows",
				 (unsigned long long)n * D);
			{
				double one[1] = {1.0}, m0 = median(lat[0], nq) * 1e6;
				double m1 = median(lat[1], nq) * 1e6, m2 = median(lat[2], nq) * 1e6;
				double m3 = median(lat[3], nq) * 1e6;

				add_row(dname[di], n, k, "kvtier-exact", param, one, 1, m0, 0.0);
				snprintf(param, sizeof(param),
					 "N*D %llu, refine schedule, refine 4k, %.2fx exact's time",
					 (unsigned long long)n * D, m1 / m0);
				add_row(dname[di], n, k, "kvtier-index", param, rec, nq, m1, 0.0);
				snprintf(param, sizeof(param), "N*D %llu, fp16 scan (AVX2)",
					 (unsigned long long)n * D);
				add_row(dname[di], n, k, "exact", param, one, 1, m2, 0.0);
				snprintf(param, sizeof(param),
					 "N*D %llu, int8 sketch, exact, %.2fx exact's time",
					 (unsigned long long)n * D, m3 / m0);
				add_row(dname[di], n, k, "kvtier-sketch", param, one, 1, m3, 0.0);
			}
		}
		kvt_paris_scratch_fini(&scr);
		kvt_paris_index_fini(&ix);
		kvt_sketch_fini(&sk);
	next:
		arena_fini(&ar);
		arena_fini(&sar);
		free(keys);
		free(qs);
		free(kh);
		if (r < 0)
			break;
	}
	for (int m = 0; m < 4; m++)
		free(lat[m]);
	free(rec);
	D = DMAX;
	return r < 0 ? r : 0;
}

/* ---- real keys: a kvtier-llm --dump-kv file (tools/llm/kvdump.h) ---- */

#define REAL_MAX_HEADS 16

struct real_head {
	uint32_t layer, kv_head;
	char name[24]; /* "real/l15h0": rows point at it */
};

static struct real_head real_heads[REAL_MAX_HEADS];
static uint32_t n_real_heads;

/* "L.H" (layer, kv head) for --real-head; 0 or -EINVAL */
static int
parse_real_head(const char *s)
{
	unsigned int l, h;
	int used = 0;

	if (n_real_heads == REAL_MAX_HEADS || sscanf(s, "%u.%u%n", &l, &h, &used) != 2 || s[used])
		return -EINVAL;
	real_heads[n_real_heads++] = (struct real_head){.layer = l, .kv_head = h};
	return 0;
}

/*
 * One (layer, kv head) of the dump is one key set: the keys of every token of every sequence
 * pooled (n = the dump's token count), at the model's head_dim; the cache one head of kvtierd
 * indexes, with several sequences in a row to reach a useful n. Queries: @nq tokens spread
 * evenly over the dump (the last of each nq-th slice), each through one of the query heads
 * that read this kv head (cycling through the GQA group), searched against the whole pool.
 */
static int
run_real(const char *path, uint32_t nq)
{
	const struct llm_kvdump_hdr *h;
	struct stat st;
	uint8_t *map = MAP_FAILED;
	float *keys = NULL, *qs = NULL;
	const char *why;
	uint32_t n, group;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		r = -errno;
		fprintf(stderr, "kvtier-bench-retrieval: --keys %s: %s\n", path, strerror(-r));
		goto out;
	}
	if ((uint64_t)st.st_size >= sizeof(*h))
		map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		r = (uint64_t)st.st_size < sizeof(*h) ? -EINVAL : -errno;
		fprintf(stderr, "kvtier-bench-retrieval: --keys %s: %s\n", path,
			r == -EINVAL ? "shorter than a dump header" : strerror(-r));
		goto out;
	}
	h = (const struct llm_kvdump_hdr *)map;
	why = llm_kvdump_hdr_check(h, (uint64_t)st.st_size);
	r = -EINVAL;
	if (why) {
		fprintf(stderr, "kvtier-bench-retrieval: --keys %s: %s\n", path, why);
		goto out;
	}
	if (h->head_dim % 16 || h->head_dim > DMAX || h->n_tokens < 256 ||
	    h->n_tokens > (1u << 26)) {
		fprintf(stderr,
			"kvtier-bench-retrieval: --keys %s: head_dim %u and %llu tokens; the "
			"benchmark needs head_dim a multiple of 16 up to %d and 256 .. 2^26 tokens "
			"(make a longer dump: tools/make-real-keys.sh)\n",
			path, h->head_dim, (unsigned long long)h->n_tokens, DMAX);
		goto out;
	}
	n = (uint32_t)h->n_tokens;
	group = h->q_heads / h->kv_heads;
	if (!n_real_heads) {
		/* an early, a middle and the last layer, kv head 0 */
		real_heads[n_real_heads++] = (struct real_head){.layer = 1 % h->layers};
		real_heads[n_real_heads++] = (struct real_head){.layer = h->layers / 2};
		real_heads[n_real_heads++] = (struct real_head){.layer = h->layers - 1};
	}
	for (uint32_t i = 0; i < n_real_heads; i++)
		if (real_heads[i].layer >= h->layers || real_heads[i].kv_head >= h->kv_heads) {
			fprintf(stderr,
				"kvtier-bench-retrieval: --real-head %u.%u: the dump has layers "
				"0..%u and kv heads 0..%u\n",
				real_heads[i].layer, real_heads[i].kv_head, h->layers - 1,
				h->kv_heads - 1);
			goto out;
		}
	D = (int)h->head_dim;
	r = -ENOMEM;
	keys = malloc((size_t)n * D * sizeof(float));
	qs = malloc((size_t)nq * D * sizeof(float));
	if (!keys || !qs)
		goto out;
	fprintf(stderr,
		"real: %s: %llu tokens in %u sequences, %u layers, %u kv heads, %u query heads, "
		"head_dim %u\n",
		path, (unsigned long long)h->n_tokens, h->n_seqs, h->layers, h->kv_heads,
		h->q_heads, h->head_dim);
	for (uint32_t hi = 0; hi < n_real_heads; hi++) {
		struct real_head *rh = &real_heads[hi];
		const size_t kn = (size_t)h->kv_heads * D, qn = (size_t)h->q_heads * D;

		snprintf(rh->name, sizeof(rh->name), "real/l%uh%u", rh->layer, rh->kv_head);
		for (uint32_t t = 0; t < n; t++) {
			const uint16_t *k =
			    (const uint16_t *)(map + h->hdr_bytes + (size_t)t * h->rec_bytes + 8) +
			    rh->layer * kn + (size_t)rh->kv_head * D;

			for (int j = 0; j < D; j++)
				keys[(size_t)t * D + j] = kvt_f16_to_f32(k[j]);
		}
		for (uint32_t qi = 0; qi < nq; qi++) {
			uint64_t t = ((uint64_t)(qi + 1) * n) / nq - 1;
			uint32_t qh = rh->kv_head * group + qi % group;
			const uint16_t *q =
			    (const uint16_t *)(map + h->hdr_bytes + t * h->rec_bytes + 8) +
			    h->layers * kn + rh->layer * qn + (size_t)qh * D;

			for (int j = 0; j < D; j++)
				qs[(size_t)qi * D + j] = kvt_f16_to_f32(q[j]);
		}
		r = run_case(rh->name, keys, n, qs, nq);
		if (r < 0)
			goto out;
	}
	r = 0;
out:
	if (map != MAP_FAILED)
		munmap(map, (size_t)st.st_size);
	if (fd >= 0)
		close(fd);
	free(keys);
	free(qs);
	D = DMAX;
	return r;
}

static int
run_synthetic(enum gen_set set, uint32_t n, uint32_t nq)
{
	float *keys = malloc((size_t)n * DMAX * sizeof(float));
	float *qs = malloc((size_t)nq * DMAX * sizeof(float));
	int r = -ENOMEM;

	if (!keys || !qs)
		goto out;
	D = DMAX;
	fprintf(stderr, "%s n=%u: generating\n", gen_name(set), n);
	r = gen_make(set, n, D, nq, 1, keys, qs);
	if (r >= 0)
		r = run_case(gen_name(set), keys, n, qs, nq);
out:
	free(keys);
	free(qs);
	return r;
}

static void
print_json(void)
{
	json_object *root = json_object_new_object(), *arr = json_object_new_array();

	for (int i = 0; i < nrows; i++) {
		json_object *o = json_object_new_object();

		json_object_object_add(o, "data", json_object_new_string(rows[i].data));
		json_object_object_add(o, "n", json_object_new_int64(rows[i].n));
		json_object_object_add(o, "k", json_object_new_int64(rows[i].k));
		json_object_object_add(o, "method", json_object_new_string(rows[i].method));
		json_object_object_add(o, "param", json_object_new_string(rows[i].param));
		json_object_object_add(o, "recall", json_object_new_double(rows[i].recall));
		json_object_object_add(o, "recall_p5", json_object_new_double(rows[i].recall_p5));
		json_object_object_add(o, "us_per_query", json_object_new_double(rows[i].us));
		json_object_object_add(o, "build_s", json_object_new_double(rows[i].build_s));
		json_object_array_add(arr, o);
	}
	json_object_object_add(root, "rows", arr);
	printf("%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN));
	json_object_put(root);
}

static void
print_table(void)
{
	printf("%-11s %8s %4s %-18s %7s %7s %12s %9s\n", "data", "n", "k", "method", "recall", "p5",
	       "us/query", "build_s");
	for (int i = 0; i < nrows; i++)
		printf("%-11s %8u %4u %-18s %7.3f %7.3f %12.1f %9.2f\n", rows[i].data, rows[i].n,
		       rows[i].k, rows[i].method, rows[i].recall, rows[i].recall_p5, rows[i].us,
		       rows[i].build_s);
}

/* The options main() reads; the ones that steer the measurements set the globals above. */
struct retr_opts {
	int json, quick, no_faiss, no_thp, stages, sweep, cpu_time;
	uint32_t nq, size, crossover, hnsw_max, hnswlib_max, build_threads;
	unsigned int data_mask; /* 1 << GEN_OUTLIER | 1 << GEN_DRIFT | 1 << 2 (real) */
	const char *keys_path;
	int knobs; /* a --knob was given: the built-in index-path points are gone */
};

static int
opt_simd(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	int r = kvt_simd_parse(arg);

	if (r < 0) {
		fprintf(stderr, "%s: --%s wants scalar, avx2 or avx512, got '%s'\n", cli->prog,
			d->name, arg);
		return -EINVAL;
	}
	kvt_simd_cap((enum kvt_simd)r);
	return 0;
}

static int
opt_data(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	struct retr_opts *ro = o;

	if (!strcmp(arg, "outlier"))
		ro->data_mask |= 1u << GEN_OUTLIER;
	else if (!strcmp(arg, "drift"))
		ro->data_mask |= 1u << GEN_DRIFT;
	else if (!strcmp(arg, "real"))
		ro->data_mask |= 1u << 2;
	else {
		fprintf(stderr, "%s: --%s wants outlier, drift or real, got '%s'\n", cli->prog,
			d->name, arg);
		return -EINVAL;
	}
	return 0;
}

static int
opt_real_head(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	if (parse_real_head(arg) < 0) {
		fprintf(stderr,
			"%s: --%s wants LAYER.KVHEAD (e.g. 15.0), at most %d times, got '%s'\n",
			cli->prog, d->name, REAL_MAX_HEADS, arg);
		return -EINVAL;
	}
	return 0;
}

static int
opt_knob(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	const int cap = (int)(sizeof(sweep_var) / sizeof(sweep_var[0]));
	struct retr_opts *ro = o;
	double rc, rl;
	int used = 0;

	if (!ro->knobs)
		NSWEEP = NSWEEP_FIXED;
	ro->knobs = 1;
	if (sscanf(arg, "%lf:%lf%n", &rc, &rl, &used) != 2 || arg[used] ||
	    !(rc > 0.0 && rc <= 1.0 && rl > 0.0 && rl <= 1.0) || NSWEEP == cap) {
		fprintf(stderr,
			"%s: --%s wants RHO_CAND:RHO_COL, both in (0, 1] (e.g. 0.4:0.7), at most "
			"%d times, got '%s'\n",
			cli->prog, d->name, cap - NSWEEP_FIXED, arg);
		return -EINVAL;
	}
	sweep_var[NSWEEP++] =
	    (struct variant){"kvtier-refine", rc, rl, 4, KVT_PARIS_EXACT_NEVER, false, 0, 0};
	return 0;
}

static int
opt_peers(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	char buf[64], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", arg);
	peers = 0;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (!strcmp(t, "flat"))
			peers |= 1u << 0;
		else if (!strcmp(t, "ivfpq"))
			peers |= 1u << 1;
		else if (!strcmp(t, "hnsw"))
			peers |= 1u << 2;
		else if (!strcmp(t, "hnswlib"))
			peers |= PEER_HNSWLIB;
		else if (!strcmp(t, "hnswlib-l2"))
			peers |= PEER_HNSWLIB_L2;
		else {
			fprintf(stderr,
				"%s: --%s wants a list of flat, ivfpq, hnsw, hnswlib and "
				"hnswlib-l2, got '%s'\n",
				cli->prog, d->name, arg);
			return -EINVAL;
		}
	}
	return 0;
}

#define OFF(m) offsetof(struct retr_opts, m)

static const struct kvt_cli_opt retr_opts[] = {
    {"json", 0, NULL, "print {\"rows\":[...]} on stdout instead of a table", .apply = kvt_cli_flag,
     .off = OFF(json)},
    {"quick", 0, NULL, "N = 32K and 128K only (the full run adds 1M)", .apply = kvt_cli_flag,
     .off = OFF(quick)},
    {"queries", 0, "N", "queries per case (default 32)", .apply = kvt_cli_u32, .off = OFF(nq),
     .min = 1, .max = 10000},
    {"hnsw-max", 0, "N", "skip faiss-hnsw above N keys (default 32768)", .apply = kvt_cli_u32,
     .off = OFF(hnsw_max), .max = UINT32_MAX},
    {"size", 0, "N", "only this key count (any N >= 256)", .apply = kvt_cli_u32, .off = OFF(size),
     .min = 256, .max = 1u << 26},
    {"no-faiss", 0, NULL, "skip the FAISS methods", .apply = kvt_cli_flag, .off = OFF(no_faiss)},
    {"no-thp", 0, NULL, "index pages from malloc, not a huge-page mapping", .apply = kvt_cli_flag,
     .off = OFF(no_thp)},
    {"stages", 0, NULL, "also print where kvtier's search spends its time (stderr)",
     .apply = kvt_cli_flag, .off = OFF(stages)},
    {"sweep", 0, NULL,
     "recall-time curves at k = 100: kvtier's ratios with and without\n"
     "refine, the fast path's C, the probe (0.5-30 % of the zone x C),\n"
     "IVFPQ nprobe (alone and + exact rescoring), HNSW efSearch",
     .apply = kvt_cli_flag, .off = OFF(sweep)},
    {"simd", 0, "L",
     "cap the engine's SIMD level at L: scalar, avx2 or avx512 (default:\nthe best the CPU has)",
     .apply = opt_simd},
    {"data", 0, "SET",
     "only this data set: outlier, drift or real (repeatable); default\n"
     "outlier and drift, and real when --keys is given",
     .apply = opt_data},
    {"keys", 0, "FILE",
     "the real set: a kvtier-llm --dump-kv file (tools/make-real-keys.sh),\n"
     "measured at the n it holds (--size and --quick do not apply)",
     .apply = kvt_cli_str, .off = OFF(keys_path)},
    {"real-head", 0, "L.H",
     "layer L, kv head H of the dump (repeatable, up to 16; default\n"
     "layers 1, L/2 and the last, kv head 0)",
     .apply = opt_real_head},
    {"knob", 0, "RC:RCOL",
     "with --sweep: kvtier's index-path points at rho_cand RC and rho_col\n"
     "RCOL with refine 4k (repeatable; replaces the built-in list)",
     .apply = opt_knob},
    {"peers", 0, "LIST",
     "peers to run (comma-separated: flat, ivfpq, hnsw (FAISS), hnswlib,\n"
     "hnswlib-l2; default all)",
     .apply = opt_peers},
    {"build-threads", 0, "N",
     "threads inserting into hnswlib's graph (default 1; queries always\nrun on one)",
     .apply = kvt_cli_u32, .off = OFF(build_threads), .min = 1, .max = 256},
    {"hnswlib-max", 0, "N", "skip hnswlib above N keys (default 262144)", .apply = kvt_cli_u32,
     .off = OFF(hnswlib_max), .max = UINT32_MAX},
    {"crossover", 0, "N",
     "only the exact-scan / index-path crossover, D = 64 and 128, N = 4K\n"
     ".. N (doubling), outlier set (the default queries: 32)",
     .apply = kvt_cli_u32, .off = OFF(crossover), .min = 4096, .max = 1u << 24},
    {"cpu-time", 0, NULL,
     "per-query times as the thread's CPU time, not wall time (a shared\n"
     "host's other processes then do not count; builds stay wall time)",
     .apply = kvt_cli_flag, .off = OFF(cpu_time)},
    {"help", 'h', NULL, "this text", .apply = kvt_cli_help},
    {NULL},
};

static const struct kvt_cli retr_cli = {
    .prog = "kvtier-bench-retrieval",
    .intro = "usage: kvtier-bench-retrieval [options]   (kvtier-bench retrieval [options])\n"
	     "Recall@k and single-thread time per query of kvtier's retrieval index against\n"
	     "an exact fp16 scan, FAISS and hnswlib (docs/bench-retrieval.md).\n\n",
    .opts = retr_opts,
};

int
main(int argc, char **argv)
{
	struct retr_opts o = {.nq = 32,
			      .hnsw_max = hnsw_max,
			      .hnswlib_max = hnswlib_max,
			      .build_threads = build_threads};
	const char *keys_path;
	unsigned int data_mask;
	uint32_t sizes[3] = {32768, 131072, 1048576}, nsizes = 3;
	uint32_t nq, crossover;
	bool json;
	double t0 = now();
	int r;

	if (kvt_cli_parse(&retr_cli, argc, argv, &o, NULL) < 0) {
		fprintf(stderr, "Try 'kvtier-bench-retrieval --help'.\n");
		return 2;
	}
	if (optind < argc) {
		fprintf(stderr, "kvtier-bench-retrieval: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	json = o.json;
	nq = o.nq;
	crossover = o.crossover;
	keys_path = o.keys_path;
	data_mask = o.data_mask;
	if (o.size) {
		sizes[0] = o.size;
		nsizes = 1;
	}
	hnsw_max = o.hnsw_max;
	hnswlib_max = o.hnswlib_max;
	build_threads = o.build_threads;
	no_faiss = o.no_faiss;
	no_thp = o.no_thp;
	stages = o.stages;
	sweep = o.sweep;
	if (o.cpu_time)
		qclock = CLOCK_THREAD_CPUTIME_ID;
#ifndef KVT_HAVE_FAISS
	fprintf(stderr, "note: built without FAISS; only kvtier and exact are measured\n");
#endif
	fprintf(stderr, "kvtier-bench-retrieval: 1 thread, D = %d (synthetic sets), simd %s\n", D,
		kvt_simd_name(kvt_simd_level()));
	if (!data_mask)
		data_mask = 1u << GEN_OUTLIER | 1u << GEN_DRIFT | (keys_path ? 1u << 2 : 0);
	if ((data_mask & 1u << 2) && !keys_path) {
		fprintf(stderr, "kvtier-bench-retrieval: --data real needs --keys FILE (make one "
				"with tools/make-real-keys.sh)\n");
		return 2;
	}
	if (crossover) {
		r = run_crossover(crossover, nq);
		if (r < 0) {
			fprintf(stderr, "kvtier-bench-retrieval: --crossover failed: %s\n",
				strerror(-r));
			return 1;
		}
		if (json)
			print_json();
		else
			print_table();
		return 0;
	}
	if (o.quick && nsizes == 3)
		nsizes = 2;
	for (uint32_t si = 0; si < nsizes; si++) {
		for (int set = GEN_OUTLIER; set <= GEN_DRIFT; set++) {
			if (!(data_mask & 1u << set))
				continue;
			r = run_synthetic((enum gen_set)set, sizes[si], nq);
			if (r < 0) {
				fprintf(stderr, "kvtier-bench-retrieval: %s n=%u failed: %s\n",
					gen_name((enum gen_set)set), sizes[si], strerror(-r));
				return 1;
			}
		}
	}
	if (data_mask & 1u << 2) {
		r = run_real(keys_path, nq);
		if (r < 0) {
			fprintf(stderr, "kvtier-bench-retrieval: real keys %s failed: %s\n",
				keys_path, strerror(-r));
			return 1;
		}
	}
	if (json)
		print_json();
	else
		print_table();
	fprintf(stderr, "total %.1f s\n", now() - t0);
	return 0;
}
