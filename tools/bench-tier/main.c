/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench-tier - benchmarks of the tiering engine (docs/bench-tier.md):
 *   1. re-tier time (kvt_tier_plan + kvt_tier_commit) at n = 32K, 128K, 1M against a baseline
 *      of std::nth_element + std::sort of the selected part, on the same inputs, with the
 *      baseline's decision checked against the engine's;
 *   2. bytes copied by differential prefetch against re-copying all of T0 every epoch, on a
 *      synthetic long decode trace whose attention revisits old tokens unpredictably;
 *   3. int8 quantize / dequantize throughput against memcpy of the same bytes;
 *   4. gather of 256-byte rows (ascending, as FETCH lists are, and in random order) against a
 *      streaming read of the same bytes;
 *   5. random 2 KiB row gathers from each backing the pool can have, side by side: anonymous
 *      THP memory (the pool before it became a memfd for restarts), the memfd as kvtierd maps
 *      it (THP where shmem_enabled allows, else 4 KiB pages), and a hugetlb memfd when enough
 *      huge pages are reserved.
 * Every figure is the median of --reps repetitions. Single-threaded.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

#include "bench_tier.h"
#include "thp.h"
#include "kvt_abi.h"
#include "kvt_cli.h"
#include "quant.h"
#include "simd.h"
#include "tier.h"

static uint64_t rng_state = 0xbe7c4;

static uint64_t
rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double
unif(void)
{
	return ((double)(rnd() >> 11) + 0.5) / 9007199254740992.0;
}

static double
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double
median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *
xalloc(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);

	if (!p) {
		fprintf(stderr, "kvtier-bench-tier: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	memset(p, 0, n); /* fault every page in before timing */
	return p;
}

/* @n bytes as kvtierd's pool backs the rows FETCH gathers from (thp.h), faulted in. */
static void *
xalloc_thp(size_t n, size_t *ret_len)
{
	void *p = bench_thp_map(n, ret_len);

	if (!p) {
		fprintf(stderr, "kvtier-bench-tier: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	memset(p, 0, n);
	return p;
}

/* ---- 1. re-tier time -------------------------------------------------------------------- */

#define DELTA 64

struct retier_result {
	uint32_t n;
	double ours_us, base_us, speedup; /* speedup: median of per-repetition ratios */
};

/* The benchmarked sequence: tiered, a protected prompt of @prompt_len, half of it in T0. */
static struct kvt_seq_params
bench_params(uint32_t prompt_len, uint32_t t0_slots)
{
	return (struct kvt_seq_params){
	    .size = sizeof(struct kvt_seq_params),
	    .policy = KVT_POLICY_TIERED,
	    .score_mode = KVT_SCORE_SUM,
	    .protect_prompt = 1,
	    .delta = DELTA,
	    .sinks = 4,
	    .window = 128,
	    .prompt_len = prompt_len,
	    .hbm_frac = 0.5f,
	    .evict_frac = 0.03f,
	    .t2_frac = 0.0f,
	    .t0_buf_id = 1,
	    .t0_slots = t0_slots,
	};
}

static void
bench_retier(uint32_t n, int reps, struct retier_result *res)
{
	uint32_t cap = n + (uint32_t)(reps + 2) * DELTA, t0_slots = cap / 2 + 4 * DELTA;
	struct kvt_seq_params p = bench_params(512, t0_slots);
	struct kvt_tier_cfg cfg;
	struct kvt_tier_seq s;
	struct kvt_tier_plan plan;
	const char *why = "";
	size_t seq_sz = kvt_tier_seq_bytes(cap, t0_slots),
	       ws_sz = kvt_tier_ws_bytes(cap, t0_slots, DELTA);
	void *mem = xalloc(seq_sz), *ws = xalloc(ws_sz);
	float *add = xalloc((size_t)cap * 4);
	uint8_t *want = xalloc(cap);
	double *t_ours = calloc(reps, sizeof(double)), *t_base = calloc(reps, sizeof(double));
	double *ratio = calloc(reps, sizeof(double));
	uint32_t i;

	if (kvt_tier_cfg_init(&p, &cfg, &why) < 0 ||
	    kvt_tier_seq_init(&s, mem, seq_sz, cap, t0_slots) < 0) {
		fprintf(stderr, "kvtier-bench-tier: bad setup: %s\n", why);
		exit(1);
	}
	/* n tokens in the pool with heavy-tailed cumulative scores, then a first re-tier */
	kvt_tier_append(&s, n, NULL);
	for (i = 0; i < n; i++)
		add[i] = (float)(-log(unif()) * -log(unif()));
	kvt_tier_score_add(&s, 0, n, add);
	kvt_tier_retier(&cfg, &s, ws, ws_sz, &plan);

	for (int r = 0; r < reps; r++) {
		struct baseline_in in;
		double t;

		/* one epoch: delta appends into the free slots, delta steps of attention */
		kvt_tier_append(&s, plan.n_free, plan.free_slot);
		for (i = 0; i < s.n; i++)
			add[i] = (float)(-log(unif()) * 0.02);
		kvt_tier_score_add(&s, 0, s.n, add);

		in = (struct baseline_in){.n = s.n,
					  .t0_slots = t0_slots,
					  .delta = DELTA,
					  .sinks = p.sinks,
					  .window = p.window,
					  .prompt_len = p.prompt_len,
					  .protect_prompt = 1,
					  .evicted = s.count[KVT_T3],
					  .hbm_frac = p.hbm_frac,
					  .evict_frac = p.evict_frac,
					  .score = s.score,
					  .tier = s.tier};
		t = now_us();
		baseline_retier(&in, want);
		t_base[r] = now_us() - t;

		t = now_us();
		if (kvt_tier_plan(&cfg, &s, ws, ws_sz, &plan) < 0 ||
		    kvt_tier_commit(&s, &plan) < 0) {
			fprintf(stderr, "kvtier-bench-tier: retier failed\n");
			exit(1);
		}
		t_ours[r] = now_us() - t;
		ratio[r] = t_base[r] / t_ours[r];
		for (i = 0; i < s.n; i++)
			if ((s.tier[i] & KVT_TIER_MASK) != want[i]) {
				fprintf(stderr,
					"kvtier-bench-tier: baseline and engine disagree at "
					"n=%u pos %u (%u vs %u)\n",
					s.n, i, s.tier[i], want[i]);
				exit(1);
			}
	}
	res->n = n;
	res->ours_us = median(t_ours, reps);
	res->base_us = median(t_base, reps);
	res->speedup = median(ratio, reps);
	free(ratio);
	free(mem);
	free(ws);
	free(add);
	free(want);
	free(t_ours);
	free(t_base);
}

/* ---- 2. differential prefetch on a decode trace ----------------------------------------- */

/* 7B-class geometry: 32 layers, 8 KV heads, head_dim 128, f16: 128 KiB per token. */
#define TRACE_TOKEN_BYTES (32ull * 2 * 8 * 128 * 2)
#define TRACE_PROMPT	  512
#define TRACE_STEPS	  16384
#define TRACE_ANCHORS	  8

struct trace_result {
	uint64_t diff_bytes, full_bytes;
	uint32_t epochs, n_final;
};

static void
bench_trace(struct trace_result *res)
{
	const uint32_t cap = TRACE_PROMPT + TRACE_STEPS, t0_slots = cap / 2 + 2 * DELTA;
	struct kvt_seq_params p = bench_params(TRACE_PROMPT, t0_slots);
	struct kvt_tier_cfg cfg;
	struct kvt_tier_seq s;
	struct kvt_tier_plan plan;
	size_t seq_sz = kvt_tier_seq_bytes(cap, t0_slots),
	       ws_sz = kvt_tier_ws_bytes(cap, t0_slots, DELTA);
	void *mem = xalloc(seq_sz), *ws = xalloc(ws_sz);
	float *acc = xalloc((size_t)cap * 4);
	uint32_t anchor[TRACE_ANCHORS], i, used = 0;
	const char *why = "";

	if (kvt_tier_cfg_init(&p, &cfg, &why) < 0 ||
	    kvt_tier_seq_init(&s, mem, seq_sz, cap, t0_slots) < 0) {
		fprintf(stderr, "kvtier-bench-tier: bad trace setup: %s\n", why);
		exit(1);
	}
	memset(res, 0, sizeof(*res));
	rng_state = 0x7ace; /* the trace is the same whatever ran before it */
	kvt_tier_append(&s, TRACE_PROMPT, NULL);
	for (i = 0; i < TRACE_ANCHORS; i++)
		anchor[i] = (uint32_t)(rnd() % TRACE_PROMPT);
	kvt_tier_retier(&cfg, &s, ws, ws_sz, &plan);
	res->diff_bytes += plan.n_promote * TRACE_TOKEN_BYTES;
	res->full_bytes += plan.count[KVT_T0] * TRACE_TOKEN_BYTES;
	res->epochs++;

	for (uint32_t step = 0; step < TRACE_STEPS; step++) {
		uint32_t n;

		kvt_tier_append(&s, 1, &plan.free_slot[used++]);
		n = s.n;
		/*
		 * Attention of this step: 0.2 on the sinks, 0.4 on the recent tokens (decaying),
		 * 0.3 on a few anchors and their neighbours; an anchor jumps to a uniformly random
		 * old token with probability 1/16 per step (unpredictable revisits). The last 0.1
		 * is spread as noise over all tokens once per epoch below.
		 */
		for (i = 0; i < 4; i++)
			acc[i] += 0.05f;
		for (i = 0; i < 64 && i < n; i++)
			acc[n - 1 - i] +=
			    0.4f * (1.0f - expf(-1.0f / 16.0f)) * expf(-(float)i / 16.0f);
		if (rnd() % 16 == 0)
			anchor[rnd() % TRACE_ANCHORS] = (uint32_t)(rnd() % n);
		for (i = 0; i < TRACE_ANCHORS; i++) {
			uint32_t a = anchor[i];

			acc[a] += 0.3f / TRACE_ANCHORS * 0.6f;
			if (a > 0)
				acc[a - 1] += 0.3f / TRACE_ANCHORS * 0.2f;
			if (a + 1 < n)
				acc[a + 1] += 0.3f / TRACE_ANCHORS * 0.2f;
		}
		if (used == DELTA) {
			for (i = 0; i < n; i++)
				acc[i] += (float)(0.1 * DELTA / n * -log(unif()));
			kvt_tier_score_add(&s, 0, n, acc);
			memset(acc, 0, (size_t)n * 4);
			kvt_tier_retier(&cfg, &s, ws, ws_sz, &plan);
			/* differential: only promotions are copied. Full: every T0 token but the
			 * delta the client itself wrote into T0 this epoch. */
			res->diff_bytes += plan.n_promote * TRACE_TOKEN_BYTES;
			res->full_bytes += (plan.count[KVT_T0] - DELTA) * TRACE_TOKEN_BYTES;
			res->epochs++;
			used = 0;
		}
	}
	res->n_final = s.n;
	free(mem);
	free(ws);
	free(acc);
}

/* ---- 3. quantize / dequantize vs memcpy ------------------------------------------------- */

#define Q_HEADS	    8
#define Q_DIM	    128
#define Q_ROW_BYTES (Q_HEADS * Q_DIM * 2) /* f16 */
#define Q_BYTES	    (128u << 20)	  /* 4x the L3 of the test machine */

/*
 * Ratios are medians of per-repetition ratios (each repetition times the kernels back to back),
 * which keeps them steady on a machine shared with other work; GB/s are medians of each kernel.
 */
struct quant_result {
	double quant_gbps, dequant_gbps, memcpy_gbps, quant_ratio, dequant_ratio;
};

static void
bench_quant(int reps, struct quant_result *res)
{
	const size_t rows = Q_BYTES / Q_ROW_BYTES;
	uint16_t *src = xalloc(Q_BYTES), *dst = xalloc(Q_BYTES), *cpy = xalloc(Q_BYTES);
	int8_t *codes = xalloc(Q_BYTES / 2);
	float *scales = xalloc(rows * Q_HEADS * 4);
	double *tq = calloc(reps, sizeof(double)), *td = calloc(reps, sizeof(double));
	double *tm = calloc(reps, sizeof(double)), *rq = calloc(reps, sizeof(double));
	double *rd = calloc(reps, sizeof(double));

	for (size_t i = 0; i < Q_BYTES / 2; i++)
		src[i] = kvt_f32_to_f16((float)((unif() - 0.5) * 4.0));
	for (int r = 0; r < reps; r++) {
		double t = now_us();

		memcpy(cpy, src, Q_BYTES);
		tm[r] = now_us() - t;
		t = now_us();
		kvt_quant_rows(KVT_DTYPE_F16, Q_HEADS, Q_DIM, src, Q_ROW_BYTES, rows, codes,
			       scales);
		tq[r] = now_us() - t;
		t = now_us();
		kvt_dequant_rows(KVT_DTYPE_F16, Q_HEADS, Q_DIM, codes, scales, rows, dst,
				 Q_ROW_BYTES);
		td[r] = now_us() - t;
		rq[r] = tm[r] / tq[r];
		rd[r] = tm[r] / td[r];
	}
	/* GB/s of row-dtype bytes: what the tier moves, and what memcpy would move instead */
	res->memcpy_gbps = Q_BYTES / median(tm, reps) / 1e3;
	res->quant_gbps = Q_BYTES / median(tq, reps) / 1e3;
	res->dequant_gbps = Q_BYTES / median(td, reps) / 1e3;
	res->quant_ratio = median(rq, reps);
	res->dequant_ratio = median(rd, reps);
	if (cpy[12345] != src[12345])
		fprintf(stderr, "kvtier-bench-tier: memcpy check failed\n");
	free(src);
	free(dst);
	free(cpy);
	free(codes);
	free(scales);
	free(tq);
	free(td);
	free(tm);
	free(rq);
	free(rd);
}

/* ---- 4. gather of 256-byte rows vs streaming read --------------------------------------- */

#define G_ROW	    256
#define G_SRC_BYTES (256ull << 20)
#define G_OUT_BYTES (64ull << 20)

struct gather_result {
	double gather_gbps, random_gbps, read_gbps, copy_gbps;
	double gather_ratio, random_ratio, copy_ratio;
};

static uint64_t
stream_read(const uint64_t *p, size_t words)
{
	uint64_t a = 0, b = 0, c = 0, d = 0;

	for (size_t i = 0; i + 4 <= words; i += 4) {
		a += p[i];
		b += p[i + 1];
		c += p[i + 2];
		d += p[i + 3];
	}
	return a ^ b ^ c ^ d;
}

static void
bench_gather(int reps, struct gather_result *res)
{
	const size_t nsrc = G_SRC_BYTES / G_ROW, nidx = G_OUT_BYTES / G_ROW;
	/* the rows live in the pool (THP-backed, like the source here); the staging region is a
	 * client buffer (a memfd mapping: small pages) */
	size_t src_len;
	unsigned char *src = xalloc_thp(G_SRC_BYTES, &src_len), *dst = xalloc(G_OUT_BYTES);
	uint32_t *idx = xalloc(nidx * 4);
	double *tg = calloc(reps, sizeof(double)), *tr = calloc(reps, sizeof(double));
	double *tx = calloc(reps, sizeof(double)), *tc = calloc(reps, sizeof(double));
	double *ra = calloc(reps, sizeof(double)), *rx = calloc(reps, sizeof(double));
	double *rc = calloc(reps, sizeof(double));
	volatile uint64_t sink = 0;

	for (size_t i = 0; i < G_SRC_BYTES; i += 64)
		src[i] = (unsigned char)i;
	for (int r = 0; r < reps; r++) {
		double t;
		/* the read covers a region the gathers did not just touch */
		const uint64_t *rd =
		    (const uint64_t *)(src + (r % 2 ? 0 : G_SRC_BYTES - G_OUT_BYTES));

		/* FETCH-shaped: a random quarter of the rows, in ascending order (T1 lists are
		 * ascending positions) */
		for (size_t i = 0, k = 0; i < nsrc && k < nidx; i++)
			if (rnd() % (nsrc - i) < nidx - k)
				idx[k++] = (uint32_t)i;
		t = now_us();
		kvt_gather_rows(dst, src, G_ROW, idx, nidx, G_ROW);
		tg[r] = now_us() - t;
		/* worst case: uniformly random order */
		for (size_t i = 0; i < nidx; i++)
			idx[i] = (uint32_t)(rnd() % nsrc);
		t = now_us();
		kvt_gather_rows(dst, src, G_ROW, idx, nidx, G_ROW);
		tx[r] = now_us() - t;
		t = now_us();
		sink ^= stream_read(rd, G_OUT_BYTES / 8);
		tr[r] = now_us() - t;
		/* context: a read+write of the same bytes cannot beat a contiguous memcpy */
		t = now_us();
		memcpy(dst, rd, G_OUT_BYTES);
		tc[r] = now_us() - t;
		ra[r] = tr[r] / tg[r];
		rx[r] = tr[r] / tx[r];
		rc[r] = tr[r] / tc[r];
	}
	(void)sink;
	res->gather_gbps = G_OUT_BYTES / median(tg, reps) / 1e3;
	res->random_gbps = G_OUT_BYTES / median(tx, reps) / 1e3;
	res->read_gbps = G_OUT_BYTES / median(tr, reps) / 1e3;
	res->copy_gbps = G_OUT_BYTES / median(tc, reps) / 1e3;
	res->gather_ratio = median(ra, reps);
	res->random_ratio = median(rx, reps);
	res->copy_ratio = median(rc, reps);
	munmap(src, src_len);
	free(dst);
	free(idx);
	free(tg);
	free(tr);
	free(tx);
	free(tc);
	free(ra);
	free(rx);
	free(rc);
}

/* ---- driver ----------------------------------------------------------------------------- */

/* ---- 5. random 2 KiB row gathers by pool backing --------------------------------------- */

#define B_ROW 2048
enum { B_ANON_THP, B_MEMFD, B_HUGETLB, B__COUNT };

struct backing_result {
	double gbps[B__COUNT];	  /* 0: that backing could not be had here */
	double vs_anon[B__COUNT]; /* median of per-repetition ratios to anonymous THP */
	int shmem_thp;		  /* shmem_enabled lets the memfd have THP */
};

static int
shmem_thp_allowed(void)
{
	char line[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");

	if (!f)
		return 0;
	if (!fgets(line, sizeof(line), f))
		line[0] = '\0';
	fclose(f);
	return !strstr(line, "[never]") && !strstr(line, "[deny]");
}

/* G_SRC_BYTES backed as kvtierd's pool would be with @b, faulted in, or NULL. */
static unsigned char *
backing_map(int b, size_t *ret_len)
{
	unsigned char *p;
	int fd;

	if (b == B_ANON_THP) {
		p = bench_thp_map(G_SRC_BYTES, ret_len);
	} else {
		fd = memfd_create("kvtier-bench-pool",
				  MFD_CLOEXEC | (b == B_HUGETLB ? MFD_HUGETLB : 0));
		if (fd < 0)
			return NULL;
		*ret_len = G_SRC_BYTES;
		p = ftruncate(fd, G_SRC_BYTES) < 0
			? MAP_FAILED
			: mmap(NULL, G_SRC_BYTES, PROT_READ | PROT_WRITE,
			       MAP_SHARED | (b == B_HUGETLB ? 0 : MAP_NORESERVE), fd, 0);
		close(fd);
		if (p == MAP_FAILED)
			return NULL; /* hugetlb: too few huge pages reserved */
		if (b == B_MEMFD)
			madvise(p, G_SRC_BYTES, MADV_HUGEPAGE);
	}
	if (!p)
		return NULL;
	for (size_t i = 0; i < G_SRC_BYTES; i += 64)
		p[i] = (unsigned char)i;
	return p;
}

static void
bench_backings(int reps, struct backing_result *res)
{
	const size_t nsrc = G_SRC_BYTES / B_ROW, nidx = G_OUT_BYTES / B_ROW;
	unsigned char *src[B__COUNT], *dst = xalloc(G_OUT_BYTES);
	uint32_t *idx = xalloc(nidx * 4);
	double *t[B__COUNT], *ratio[B__COUNT];
	size_t len[B__COUNT];

	memset(res, 0, sizeof(*res));
	res->shmem_thp = shmem_thp_allowed();
	for (int b = 0; b < B__COUNT; b++) {
		src[b] = backing_map(b, &len[b]);
		t[b] = calloc(reps, sizeof(double));
		ratio[b] = calloc(reps, sizeof(double));
	}
	/* Interleaved: each repetition gathers the same random rows from every backing, so a
	 * noisy moment hits all of them and the ratios hold. */
	for (int r = 0; r < reps; r++) {
		for (size_t i = 0; i < nidx; i++)
			idx[i] = (uint32_t)(rnd() % nsrc);
		for (int b = 0; b < B__COUNT; b++) {
			double t0;

			if (!src[b])
				continue;
			t0 = now_us();
			kvt_gather_rows(dst, src[b], B_ROW, idx, nidx, B_ROW);
			t[b][r] = now_us() - t0;
			ratio[b][r] = t[B_ANON_THP][r] / t[b][r];
		}
	}
	for (int b = 0; b < B__COUNT; b++) {
		if (src[b]) {
			res->gbps[b] = G_OUT_BYTES / median(t[b], reps) / 1e3;
			res->vs_anon[b] = median(ratio[b], reps);
			munmap(src[b], len[b]);
		}
		free(t[b]);
		free(ratio[b]);
	}
	free(dst);
	free(idx);
}

/* The tool's options. */
struct tier_opts {
	int json;
	int reps;
	int no_step;
};

#define OFF(m) offsetof(struct tier_opts, m)

static const struct kvt_cli_opt tier_opts[] = {
    {"json", 0, NULL, "print one JSON object instead of the table", .apply = kvt_cli_flag,
     .off = OFF(json)},
    {"no-step", 0, NULL,
     "skip the end-to-end decode step (it starts a kvtierd with a 4 GiB\n"
     "pool and fills a 32K-token, 32-layer sequence)",
     .apply = kvt_cli_flag, .off = OFF(no_step)},
    {"reps", 0, "N", "repetitions per figure, medians reported (default 9, min 3)",
     .apply = kvt_cli_int, .off = OFF(reps), .min = 3, .max = 100000},
    {"help", 'h', NULL, "this text", .apply = kvt_cli_help},
    {NULL},
};

static const struct kvt_cli tier_cli = {
    .prog = "kvtier-bench tier",
    .intro = "usage: kvtier-bench tier [options]\n"
	     "The tiering engine: re-tier time, differential prefetch bytes, int8 quantize and\n"
	     "row gather throughput, the pool's backings, and a decode step through kvtierd\n"
	     "(docs/bench-tier.md).\n\n",
    .opts = tier_opts,
};

static const char *
verdict(double v, double target)
{
	return v >= target ? "ok" : "BELOW TARGET";
}

int
main(int argc, char **argv)
{
	static const uint32_t sizes[] = {32u << 10, 128u << 10, 1u << 20};
	struct retier_result rt[3];
	struct trace_result tr;
	struct quant_result q;
	struct gather_result g;
	struct backing_result bk;
	struct tier_opts o = {.reps = 9};
	int json, reps, do_step, step_err = 0;
	struct step_result st = {0};
	double pf_ratio;

	if (kvt_cli_parse(&tier_cli, argc, argv, &o, NULL) < 0) {
		fprintf(stderr, "Try 'kvtier-bench tier --help'.\n");
		return 2;
	}
	if (optind < argc) {
		fprintf(stderr, "kvtier-bench tier: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	json = o.json;
	reps = o.reps;
	do_step = !o.no_step;
	for (int i = 0; i < 3; i++)
		bench_retier(sizes[i], reps, &rt[i]);
	bench_trace(&tr);
	bench_quant(reps, &q);
	bench_gather(reps, &g);
	bench_backings(reps, &bk);
	if (do_step)
		step_err = bench_step(32u << 10, 128, &st);
	pf_ratio = tr.diff_bytes ? (double)tr.full_bytes / tr.diff_bytes : INFINITY;

	if (json) {
		printf("{\"simd\":\"%s\",\"reps\":%d", kvt_simd_name(kvt_simd_level()), reps);
		printf(",\"retier_us_32k\":%.1f,\"nth_sort_us_32k\":%.1f", rt[0].ours_us,
		       rt[0].base_us);
		printf(",\"retier_us_128k\":%.1f,\"nth_sort_us_128k\":%.1f", rt[1].ours_us,
		       rt[1].base_us);
		printf(",\"retier_us_1m\":%.1f,\"nth_sort_us_1m\":%.1f", rt[2].ours_us,
		       rt[2].base_us);
		printf(",\"retier_speedup_1m\":%.2f", rt[2].speedup);
		printf(",\"diff_prefetch_bytes\":%llu,\"full_prefetch_bytes\":%llu",
		       (unsigned long long)tr.diff_bytes, (unsigned long long)tr.full_bytes);
		printf(",\"prefetch_ratio\":%.2f,\"trace_epochs\":%u,\"trace_tokens\":%u", pf_ratio,
		       tr.epochs, tr.n_final);
		printf(",\"quant_gbps\":%.2f,\"dequant_gbps\":%.2f,\"memcpy_gbps\":%.2f",
		       q.quant_gbps, q.dequant_gbps, q.memcpy_gbps);
		printf(",\"quant_vs_memcpy\":%.2f,\"dequant_vs_memcpy\":%.2f", q.quant_ratio,
		       q.dequant_ratio);
		printf(",\"gather_gbps\":%.2f,\"gather_random_gbps\":%.2f,\"read_gbps\":%.2f",
		       g.gather_gbps, g.random_gbps, g.read_gbps);
		printf(",\"gather_vs_read\":%.2f,\"gather_random_vs_read\":%.2f", g.gather_ratio,
		       g.random_ratio);
		printf(",\"copy_64m_gbps\":%.2f,\"copy_vs_read\":%.2f", g.copy_gbps, g.copy_ratio);
		printf(",\"shmem_thp\":%s,\"gather2k_anon_thp_gbps\":%.2f",
		       bk.shmem_thp ? "true" : "false", bk.gbps[B_ANON_THP]);
		printf(",\"gather2k_memfd_gbps\":%.2f,\"gather2k_memfd_vs_anon_thp\":%.2f",
		       bk.gbps[B_MEMFD], bk.vs_anon[B_MEMFD]);
		if (bk.gbps[B_HUGETLB] > 0)
			printf(
			    ",\"gather2k_hugetlb_gbps\":%.2f,\"gather2k_hugetlb_vs_anon_thp\":%.2f",
			    bk.gbps[B_HUGETLB], bk.vs_anon[B_HUGETLB]);
		if (do_step && !step_err)
			printf(",\"step_us_32k\":%.1f,\"step_nofetch_us_32k\":%.1f,"
			       "\"fetch_us_32k\":%.1f,\"retier_daemon_us_32k\":%.1f,"
			       "\"step_t1_rows\":%llu",
			       st.step_us, st.step_nofetch_us, st.fetch_us, st.retier_us,
			       (unsigned long long)st.t1);
		printf("}\n");
		return step_err ? 1 : 0;
	}
	printf("kvtier-bench tier: medians of %d repetitions, SIMD level %s\n\n", reps,
	       kvt_simd_name(kvt_simd_level()));
	printf("re-tier (plan + commit) vs nth_element + sort of the selected part\n");
	printf("  %8s %12s %14s %8s\n", "n", "retier_us", "nth_sort_us", "speedup");
	for (int i = 0; i < 3; i++)
		printf("  %8u %12.1f %14.1f %7.2fx%s\n", rt[i].n, rt[i].ours_us, rt[i].base_us,
		       rt[i].speedup,
		       i == 2 ? (rt[i].speedup >= 2.0 ? "  (target >= 2x: ok)"
						      : "  (target >= 2x: BELOW TARGET)")
			      : "");
	printf("\nprefetch bytes, decode trace of %u tokens, %u epochs, 128 KiB/token\n",
	       tr.n_final, tr.epochs);
	printf("  differential %14llu\n  full T0      %14llu\n  ratio        %13.1fx  (target >= "
	       "5x: %s)\n",
	       (unsigned long long)tr.diff_bytes, (unsigned long long)tr.full_bytes, pf_ratio,
	       verdict(pf_ratio, 5.0));
	printf("\nint8 rows (f16, 8 heads x 128), %u MiB, GB/s of f16 bytes\n", Q_BYTES >> 20);
	printf("  memcpy     %7.2f\n", q.memcpy_gbps);
	printf("  quantize   %7.2f  %.2fx memcpy (target >= 0.7x: %s)\n", q.quant_gbps,
	       q.quant_ratio, verdict(q.quant_ratio, 0.7));
	printf("  dequantize %7.2f  %.2fx memcpy (target >= 0.8x: %s)\n", q.dequant_gbps,
	       q.dequant_ratio, verdict(q.dequant_ratio, 0.8));
	printf("\ngather of 256-byte rows, %llu MiB out of %llu MiB\n", G_OUT_BYTES >> 20,
	       G_SRC_BYTES >> 20);
	printf("  stream read            %7.2f GB/s\n", g.read_gbps);
	printf("  memcpy, same bytes     %7.2f GB/s  %.2fx read (a read+write bound)\n",
	       g.copy_gbps, g.copy_ratio);
	printf("  gather, ascending rows %7.2f GB/s  %.2fx read (target >= 0.5x: %s)\n",
	       g.gather_gbps, g.gather_ratio, verdict(g.gather_ratio, 0.5));
	printf("  gather, random order   %7.2f GB/s  %.2fx read (worst case, same target: %s)\n",
	       g.random_gbps, g.random_ratio, verdict(g.random_ratio, 0.5));
	printf("\nrandom 2 KiB row gathers by pool backing, %llu MiB out of %llu MiB\n",
	       G_OUT_BYTES >> 20, G_SRC_BYTES >> 20);
	printf("  anonymous THP (before restarts)  %7.2f GB/s\n", bk.gbps[B_ANON_THP]);
	printf("  memfd, %-25s %7.2f GB/s  %.2fx anonymous THP\n",
	       bk.shmem_thp ? "THP (shmem_enabled)" : "4 KiB (shmem_enabled)", bk.gbps[B_MEMFD],
	       bk.vs_anon[B_MEMFD]);
	if (bk.gbps[B_HUGETLB] > 0)
		printf("  memfd, hugetlb                   %7.2f GB/s  %.2fx anonymous THP\n",
		       bk.gbps[B_HUGETLB], bk.vs_anon[B_HUGETLB]);
	else
		printf("  memfd, hugetlb                   - (too few huge pages reserved)\n");
	if (!do_step)
		return 0;
	if (step_err) {
		printf("\ndecode step through kvtierd: failed: %s\n", strerror(-step_err));
		return 1;
	}
	printf("\ndecode step through kvtierd (host backend), 32 layers x 8 kv heads x 128, f16,\n"
	       "%u tokens (T0 %llu, T1 %llu), daemon CPU per step, %u steps\n",
	       st.n, (unsigned long long)st.t0, (unsigned long long)st.t1, st.steps);
	printf("  APPEND + SCORE_ADD (n floats) + RETIER every 64         %10.0f us\n",
	       st.step_nofetch_us);
	printf("  FETCH of every T1 row, one op per layer (memcpy here)   %10.0f us\n",
	       st.fetch_us);
	printf("  step_us_32k (sum)                                       %10.0f us\n", st.step_us);
	printf("  one RETIER of the whole sequence                        %10.0f us\n",
	       st.retier_us);
	return 0;
}
