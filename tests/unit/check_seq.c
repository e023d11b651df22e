/* SPDX-License-Identifier: MIT */
/*
 * The sequence layer (daemon/seq*.c) on its own: a real pool, the host device backend, client
 * buffers as sealed memfds mapped here too, and a struct kvtd_seq_ctx, with no session, ring or
 * daemon. What a test reads back is what a client would find in its staging buffer.
 *
 * The program links with malloc, calloc, realloc, aligned_alloc and posix_memalign wrapped
 * (tests/CMakeLists.txt): every allocation the daemon's code makes goes through the counters
 * below, so a test can say that RETIER, FETCH and TOPK allocate nothing once warm.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvt_test.h"
#include "poller.h"
#include "pool.h"
#include "prefix.h"
#include "seq.h"

/* ---- allocation counters (the wrapped symbols) ------------------------------------------- */

/* kvtd_seq_topk() with the knobs of TOPK's SQE form (ops.c turns a request into this). */
static int
seq_topk(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint32_t layer, uint32_t k,
	 unsigned flags, uint32_t probe, const float *query, uint64_t q_len, void *out,
	 uint64_t out_len, uint64_t *ret_n)
{
	struct kvt_topk_req r = {
	    .size = sizeof(r),
	    .mode = probe			    ? KVT_TOPK_PROBE
		    : (flags & KVT_TOPK_F_FAST)	    ? KVT_TOPK_FAST
		    : (flags & KVT_TOPK_F_ESTIMATE) ? KVT_TOPK_ESTIMATE
						    : KVT_TOPK_EXACT,
	    .flags = flags & (KVT_TOPK_F_UNION | KVT_TOPK_F_FETCH),
	    .layer = layer,
	    .k = k,
	    .probe = probe,
	    .query_len = (uint32_t)(q_len * sizeof(float)),
	    .out_len = (uint32_t)out_len,
	};

	return kvtd_seq_topk(x, q, &r, query, out, ret_n);
}

static uint64_t n_alloc;

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__real_aligned_alloc(size_t align, size_t size);
int __real_posix_memalign(void **p, size_t align, size_t size);

void *
__wrap_malloc(size_t size)
{
	n_alloc++;
	return __real_malloc(size);
}

void *
__wrap_calloc(size_t n, size_t size)
{
	n_alloc++;
	return __real_calloc(n, size);
}

void *
__wrap_realloc(void *p, size_t size)
{
	n_alloc++;
	return __real_realloc(p, size);
}

void *
__wrap_aligned_alloc(size_t align, size_t size)
{
	n_alloc++;
	return __real_aligned_alloc(align, size);
}

int
__wrap_posix_memalign(void **p, size_t align, size_t size)
{
	n_alloc++;
	return __real_posix_memalign(p, align, size);
}

/* ---- fixture: pool, device, two client buffers, the context ------------------------------ */

enum { L = 2, H = 2, D = 64, ROW = H * D * 4, TOK = L * 2 * ROW, NMAX = 512, T0 = 64 };

struct cbuf {
	int fd;
	uint8_t *map;
	uint64_t size;
	struct kvt_dev_buf *buf;
};

static struct kvtd_config Cfg;
static struct kvtd_pool Pool;
static struct kvt_dev *Dev;
static struct kvtd_acct Acct;
static struct kvtd_scratch Scr;
static struct kvtd_why Why;
static struct cbuf Stage, T0buf; /* buffer ids 1 and 2 */
static struct kvt_dev_buf *Bufs[2];
static struct kvtd_seq_ctx X;
static uint8_t *Rows; /* [NMAX][TOK]: what was appended */
static uint64_t Rng;

static void
cbuf_make(struct cbuf *b, uint64_t size)
{
	struct kvt_dev_import imp = {.kind = KVT_BUF_HOST_MEMFD, .size = size};

	b->size = size;
	b->fd = memfd_create("check-seq", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_ge(b->fd, 0);
	ck_assert_int_eq(ftruncate(b->fd, (off_t)size), 0);
	ck_assert_int_eq(fcntl(b->fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	b->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
	ck_assert(b->map != MAP_FAILED);
	imp.fd = b->fd;
	ck_assert_int_eq(kvt_dev_buf_import(Dev, &imp, &b->buf), 0);
}

static void
cbuf_free(struct cbuf *b)
{
	kvt_dev_buf_put(b->buf);
	munmap(b->map, b->size);
	close(b->fd);
}

static void
setup(void)
{
	kvtd_config_defaults(&Cfg);
	Cfg.pool_size = 32ull << 20;
	Cfg.lock = 0;
	Cfg.numa_node = -1;
	ck_assert_int_eq(kvtd_pool_init(&Pool, &Cfg, NULL), 0);
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_HOST, &Dev), 0);
	/* staging: [layer][K|V][NMAX rows]; T0: [layer][K|V][T0 slots] */
	cbuf_make(&Stage, (uint64_t)L * 2 * NMAX * ROW);
	cbuf_make(&T0buf, (uint64_t)L * 2 * T0 * ROW);
	Bufs[0] = Stage.buf;
	Bufs[1] = T0buf.buf;
	memset(&Acct, 0, sizeof(Acct));
	memset(&Scr, 0, sizeof(Scr));
	memset(&Why, 0, sizeof(Why));
	X = (struct kvtd_seq_ctx){.pool = &Pool,
				  .dev = Dev,
				  .acct = &Acct,
				  .scr = &Scr,
				  .bufs = Bufs,
				  .n_bufs = 2,
				  .owner_id = 1,
				  .why = &Why};
	Rows = malloc((size_t)NMAX * TOK);
	ck_assert_ptr_nonnull(Rows);
	Rng = 2026;
	for (size_t i = 0; i < (size_t)NMAX * TOK / 4; i++)
		((float *)Rows)[i] = kvt_test_lcg_gauss(&Rng);
}

static void
teardown(void)
{
	free(Rows);
	kvtd_scratch_fini(&Scr);
	cbuf_free(&Stage);
	cbuf_free(&T0buf);
	kvt_dev_close(Dev);
	kvtd_pool_fini(&Pool);
}

/* f32 rows, staging region 1 laid out [layer][K|V][row], no tiering beyond what @p adds. */
static struct kvt_seq_params
params(void)
{
	struct kvt_seq_params p = {.size = sizeof(p)};

	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 8;
	p.hbm_frac = 1.0f;
	p.stage_buf_id = 1;
	p.stage_slots = NMAX;
	p.stage_slot_stride = ROW;
	p.stage_kv_stride = (uint64_t)NMAX * ROW;
	p.stage_layer_stride = 2ull * NMAX * ROW;
	return p;
}

/* The T0 region (buffer 2) and a tiered policy: @t2 of the positions int8. */
static void
params_tiered(struct kvt_seq_params *p, float hbm, float t2)
{
	p->policy = KVT_POLICY_TIERED;
	p->hbm_frac = hbm;
	p->t2_frac = t2;
	p->t0_buf_id = 2;
	p->t0_slots = T0;
	p->t0_slot_stride = ROW;
	p->t0_kv_stride = (uint64_t)T0 * ROW;
	p->t0_layer_stride = 2ull * T0 * ROW;
}

static struct kvtd_seq *
open_seq(const struct kvt_seq_params *p)
{
	struct kvtd_seq *q = NULL;
	int r = kvtd_seq_create(&X, p, &q);

	ck_assert_msg(r == 0, "kvtd_seq_create: %d (%s)", r, Why.set ? Why.msg : "");
	q->id = 1;
	return q;
}

static void
append(struct kvtd_seq *q, uint32_t n)
{
	uint64_t first = q->ts.n;

	ck_assert_int_eq(kvtd_seq_append_rows(&X, q, Rows + first * TOK, n), first + n);
}

/* FETCH into the sequence's staging region (struct kvtd_fetch without F_ROWS or buf_id). */
static int
fetch(struct kvtd_seq *q, unsigned flags, uint32_t layer0, uint32_t nlayers, uint32_t stage_row,
      uint32_t *list, uint32_t list_cap, uint32_t count)
{
	struct kvtd_fetch f = {.flags = flags,
			       .layer0 = layer0,
			       .nlayers = nlayers,
			       .stage_row = stage_row,
			       .list = list,
			       .list_cap = list_cap,
			       .count = count};

	return kvtd_seq_fetch(&X, q, &f);
}

/* Row (layer l, K|V kv) of staging row i, and of appended position pos. */
static const float *
staged(uint32_t i, uint32_t l, uint32_t kv)
{
	return (const float *)(Stage.map + (uint64_t)l * 2 * NMAX * ROW +
			       kv * (uint64_t)NMAX * ROW + (uint64_t)i * ROW);
}

static const float *
appended(uint32_t pos, uint32_t l, uint32_t kv)
{
	return (const float *)(Rows + (uint64_t)pos * TOK + (2 * l + kv) * (uint64_t)ROW);
}

/* ---- tests ------------------------------------------------------------------------------- */

/* T1 rows come back from FETCH bit for bit, in position order, every layer. */
START_TEST(t_append_fetch_t1)
{
	struct kvt_seq_params p = params();
	static uint32_t list[NMAX];
	struct kvtd_seq *q = open_seq(&p);
	int m;

	append(q, 100);
	append(q, 57);
	ck_assert_uint_eq(q->bytes_in, 157ull * TOK);
	memset(Stage.map, 0xa5, Stage.size);
	m = fetch(q, KVT_FETCH_F_T1, 0, L, 0, list, NMAX, 0);
	ck_assert_int_eq(m, 157);
	for (uint32_t i = 0; i < 157; i++) {
		ck_assert_uint_eq(list[i], i);
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				ck_assert_msg(!memcmp(staged(i, l, kv), appended(i, l, kv), ROW),
					      "position %u layer %u kv %u differs", i, l, kv);
	}
	ck_assert_uint_eq(q->bytes_out, 157ull * TOK);
	/* F_LIST, one layer, from staging row 5: exactly the rows named, nothing else */
	memset(Stage.map, 0, Stage.size);
	list[0] = 150;
	list[1] = 3;
	m = fetch(q, KVT_FETCH_F_LIST, 1, 1, 5, list, 2, 2);
	ck_assert_int_eq(m, 2);
	ck_assert(!memcmp(staged(5, 1, 0), appended(150, 1, 0), ROW));
	ck_assert(!memcmp(staged(6, 1, 1), appended(3, 1, 1), ROW));
	ck_assert_float_eq(staged(5, 0, 0)[0], 0.0f);
	kvtd_seq_destroy(&X, q);
	ck_assert_uint_eq(Acct.bytes, 0);
	ck_assert_uint_eq(Pool.used_bytes, 0);
}
END_TEST

/*
 * RETIER quantizes the coldest positions to int8; FETCH gives them back dequantized within half
 * a quantization step (scale = the head's absmax / 127, docs: tiering spec), the T1 ones bit for
 * bit, and the T0 region holds the promoted positions' rows exactly.
 */
START_TEST(t_retier_int8_fetch)
{
	struct kvt_seq_params p = params();
	static uint8_t out[KVT_RETIER_OUT_SIZE(T0)];
	static uint32_t list[NMAX];
	static float score[300];
	const struct kvt_retier_result *res = (const void *)out;
	const struct kvt_slot_change *ch = (const void *)(res + 1);
	uint32_t changes = 0, n_t2 = 0;
	struct kvtd_seq *q;
	int r, m;

	params_tiered(&p, 0.1f, 0.5f);
	q = open_seq(&p);
	append(q, 300);
	for (int i = 0; i < 300; i++)
		score[i] = (float)(kvt_test_lcg(&Rng) >> 40) / 16777216.0f;
	ck_assert_int_eq(kvtd_seq_score_add(&X, q, 0, 300, score), 0);
	r = kvtd_seq_retier(&X, q, out, sizeof(out), &changes);
	ck_assert_msg(r > 0, "retier: %d (%s)", r, Why.msg);
	ck_assert_uint_eq(res->n_tokens, 300);
	ck_assert_uint_ge(q->ts.n_int8, 100); /* t2_frac 0.5 of 300, less what T0 keeps */
	ck_assert_uint_eq(q->bytes_quant, (uint64_t)q->ts.n_int8 * q->q_bytes);
	/* promoted positions: their rows are in the T0 slot named */
	for (uint32_t i = 0; i < changes; i++) {
		if (ch[i].pos < 0)
			continue;
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				ck_assert(!memcmp(T0buf.map + l * p.t0_layer_stride +
						      kv * p.t0_kv_stride +
						      (uint64_t)ch[i].slot * p.t0_slot_stride,
						  appended((uint32_t)ch[i].pos, l, kv), ROW));
	}
	m = fetch(q, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, L, 0, list, NMAX, 0);
	ck_assert_int_gt(m, 0);
	for (int i = 0; i < m; i++) {
		uint32_t pos = list[i];

		if (!(q->ts.tier[pos] & KVT_TIER_F_INT8)) {
			for (uint32_t l = 0; l < L; l++)
				for (uint32_t kv = 0; kv < 2; kv++)
					ck_assert(
					    !memcmp(staged(i, l, kv), appended(pos, l, kv), ROW));
			continue;
		}
		n_t2++;
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < H; h++) {
					const float *a = appended(pos, l, kv) + h * D;
					const float *b = staged(i, l, kv) + h * D;
					float amax = 0, tol;

					for (int j = 0; j < D; j++)
						amax = fmaxf(amax, fabsf(a[j]));
					tol = amax / 127.0f * 0.5f * 1.0001f;
					for (int j = 0; j < D; j++)
						ck_assert_msg(fabsf(a[j] - b[j]) <= tol,
							      "pos %u l %u kv %u h %u [%d]: %g vs "
							      "%g (tolerance %g)",
							      pos, l, kv, h, j, a[j], b[j], tol);
				}
	}
	ck_assert_uint_eq(n_t2, q->ts.n_int8);
	ck_assert_uint_eq(q->bytes_out_t2, (uint64_t)n_t2 * TOK);
	kvtd_seq_destroy(&X, q);
	ck_assert_uint_eq(Acct.bytes, 0);
	ck_assert_uint_eq(Pool.used_bytes, 0);
}
END_TEST

/*
 * A region that keeps each row's K and V adjacent, [layer][row][K|V] as a paged-cache block
 * lays them out: FETCH copies each T1 position's K and V as one run from its slot, and T1 and
 * T2 rows land where the strides say (T1 bit for bit, T2 within half a step), nothing before.
 */
START_TEST(t_fetch_kv_adjacent)
{
	struct kvt_seq_params p = params();
	static uint8_t out[KVT_RETIER_OUT_SIZE(T0)];
	static uint32_t list[NMAX];
	static float score[300];
	uint32_t changes = 0, n_t1 = 0, n_t2 = 0;
	struct kvtd_seq *q;
	int m;

	params_tiered(&p, 0.1f, 0.5f);
	p.stage_slot_stride = 2 * ROW;
	p.stage_kv_stride = ROW;
	p.stage_layer_stride = 2ull * NMAX * ROW;
	q = open_seq(&p);
	append(q, 300);
	for (int i = 0; i < 300; i++)
		score[i] = (float)(kvt_test_lcg(&Rng) >> 40) / 16777216.0f;
	ck_assert_int_eq(kvtd_seq_score_add(&X, q, 0, 300, score), 0);
	ck_assert_int_gt(kvtd_seq_retier(&X, q, out, sizeof(out), &changes), 0);
	memset(Stage.map, 0xa5, Stage.size);
	m = fetch(q, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, L, 3, list, NMAX, 0);
	ck_assert_int_gt(m, 0);
	for (int i = 0; i < m; i++) {
		bool t2 = q->ts.tier[list[i]] & KVT_TIER_F_INT8;

		t2 ? n_t2++ : n_t1++;
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				const float *a = appended(list[i], l, kv);
				const float *b =
				    (const float *)(Stage.map + l * p.stage_layer_stride +
						    (3ull + i) * p.stage_slot_stride +
						    kv * p.stage_kv_stride);

				for (uint32_t h = 0; h < H; h++) {
					float amax = 0, tol;

					for (int j = 0; j < D; j++)
						amax = fmaxf(amax, fabsf(a[h * D + j]));
					tol = t2 ? amax / 127.0f * 0.5f * 1.0001f : 0.0f;
					for (int j = 0; j < D; j++)
						ck_assert_msg(fabsf(a[h * D + j] - b[h * D + j]) <=
								  tol,
							      "row %d (pos %u, %s) l %u kv %u h %u "
							      "[%d]: %g vs %g",
							      i, list[i], t2 ? "T2" : "T1", l, kv,
							      h, j, a[h * D + j], b[h * D + j]);
				}
			}
	}
	ck_assert_uint_gt(n_t1, 0);
	ck_assert_uint_gt(n_t2, 0);
	/* the rows before staging row 3 are untouched */
	for (uint32_t l = 0; l < L; l++)
		ck_assert_uint_eq(Stage.map[l * p.stage_layer_stride + 3 * p.stage_slot_stride - 1],
				  0xa5);
	kvtd_seq_destroy(&X, q);
}
END_TEST

/*
 * FETCH with F_ROWS into another registered buffer (ABI 1.6): each listed position lands at the
 * row listed for it, in buffer 2, laid out as the sequence's staging region; the region itself
 * is untouched. Rows past the region, F_ROWS without F_LIST, a stage_row with F_ROWS, a buffer
 * not registered and one too small for the layout are refused, with nothing staged.
 */
START_TEST(t_fetch_rows_to_buffer)
{
	struct kvt_seq_params p = params();
	static uint32_t list[2 * NMAX];
	const uint32_t pos[4] = {10, 99, 0, 57}, rows[4] = {T0 - 1, 0, 17, 18};
	struct kvtd_fetch f = {.flags = KVT_FETCH_F_LIST | KVT_FETCH_F_ROWS,
			       .nlayers = L,
			       .buf_id = 2,
			       .list = list,
			       .list_cap = 4,
			       .count = 4,
			       .rows = list + 4};
	struct kvtd_seq *q, *big;

	/* a T0-slot region: it fits buffer 2 (the T0 buffer) as well as buffer 1 */
	p.stage_slots = T0;
	p.stage_kv_stride = (uint64_t)T0 * ROW;
	p.stage_layer_stride = 2ull * T0 * ROW;
	q = open_seq(&p);
	append(q, 100);
	memcpy(list, pos, sizeof(pos));
	memcpy(list + 4, rows, sizeof(rows));
	memset(Stage.map, 0xa5, Stage.size);
	memset(T0buf.map, 0, T0buf.size);
	ck_assert_int_eq(kvtd_seq_fetch(&X, q, &f), 4);
	for (uint32_t i = 0; i < 4; i++)
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				ck_assert_msg(!memcmp(T0buf.map + l * p.stage_layer_stride +
							  kv * p.stage_kv_stride +
							  (uint64_t)rows[i] * ROW,
						      appended(pos[i], l, kv), ROW),
					      "position %u at row %u, layer %u kv %u", pos[i],
					      rows[i], l, kv);
	ck_assert_uint_eq(Stage.map[0], 0xa5);
	ck_assert_uint_eq(Stage.map[Stage.size - 1], 0xa5);
	/* one layer, into the sequence's own region (buf_id 0) */
	f.buf_id = 0;
	f.layer0 = 1;
	f.nlayers = 1;
	ck_assert_int_eq(kvtd_seq_fetch(&X, q, &f), 4);
	ck_assert(!memcmp(Stage.map + p.stage_layer_stride + p.stage_kv_stride + 17ull * ROW,
			  appended(0, 1, 1), ROW));
	ck_assert_uint_eq(Stage.map[17ull * ROW], 0xa5); /* layer 0 not staged */

	memset(T0buf.map, 0, T0buf.size);
	f.buf_id = 2;
	f.layer0 = 0;
	f.nlayers = L;
	list[4 + 2] = T0; /* a row past the region */
	ck_assert_int_eq(kvtd_seq_fetch(&X, q, &f), -EINVAL);
	ck_assert_msg(strstr(Why.msg, "staging row 64 (entry 2)"), "%s", Why.msg);
	list[4 + 2] = 17;
	f.flags = KVT_FETCH_F_ROWS;
	ck_assert_int_eq(kvtd_seq_fetch(&X, q, &f), -EINVAL);
	f.flags = KVT_FETCH_F_LIST | KVT_FETCH_F_ROWS;
	f.stage_row = 1;
	ck_assert_int_eq(kvtd_seq_fetch(&X, q, &f), -EINVAL);
	ck_assert_msg(strstr(Why.msg, "F_ROWS"), "%s", Why.msg);
	f.stage_row = 0;
	f.buf_id = 3;
	ck_assert_int_eq(kvtd_seq_fetch(&X, q, &f), -ENOENT);
	ck_assert_msg(strstr(Why.msg, "buffer 3 is not registered"), "%s", Why.msg);
	for (size_t i = 0; i < T0buf.size; i++)
		ck_assert_msg(!T0buf.map[i], "byte %zu written by a refused FETCH", i);
	/* a sequence whose region (NMAX rows) does not fit buffer 2 */
	p = params();
	big = open_seq(&p);
	append(big, 8);
	for (uint32_t i = 0; i < 4; i++)
		list[i] = list[4 + i] = i;
	f.buf_id = 2;
	ck_assert_int_eq(kvtd_seq_fetch(&X, big, &f), -ERANGE);
	ck_assert_msg(strstr(Why.msg, "runs past"), "%s", Why.msg);
	kvtd_seq_destroy(&X, big);
	kvtd_seq_destroy(&X, q);
	ck_assert_uint_eq(Acct.bytes, 0);
}
END_TEST

/* SCORE_ADD refuses the whole add (nothing changes) for a bad value or range, with a reason. */
START_TEST(t_score_add_invalid)
{
	struct kvt_seq_params p = params();
	struct kvtd_seq *q = open_seq(&p);
	const float bad[] = {NAN, -1.0f, INFINITY, 2e30f, -1e-30f};
	float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	append(q, 8);
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v[5] = bad[i];
		Why.set = 0;
		ck_assert_int_eq(kvtd_seq_score_add(&X, q, 0, 8, v), -EINVAL);
		ck_assert(Why.set);
		ck_assert_ptr_nonnull(strstr(Why.msg, "value 5"));
		ck_assert(q->score_total == 0.0);
	}
	v[5] = 6;
	Why.set = 0;
	ck_assert_int_eq(kvtd_seq_score_add(&X, q, 1, 8, v), -EINVAL); /* 1..+8 passes n = 8 */
	ck_assert_ptr_nonnull(strstr(Why.msg, "pass the sequence's 8 tokens"));
	ck_assert_int_eq(kvtd_seq_score_add(&X, q, 9, 0, v), -EINVAL);
	ck_assert_int_eq(kvtd_seq_score_add(&X, q, UINT64_MAX, 1, v), -EINVAL);
	ck_assert(q->score_total == 0.0);
	ck_assert_int_eq(kvtd_seq_score_add(&X, q, 0, 8, v), 0);
	ck_assert(q->score_total == 36.0);
	ck_assert_int_eq(kvtd_seq_score_add(&X, q, 8, 0, v), 0); /* empty, at the end */
	kvtd_seq_destroy(&X, q);
}
END_TEST

/* SEQ_OPEN's checks: each bad field alone is refused with its errno and a reason, and a refused
 * open leaves no pool class or buffer reference behind. */
START_TEST(t_open_invalid)
{
	static const struct {
		const char *why;
		int err;
		size_t off, len;
		uint64_t val;
	} cases[] = {
#define F(field) offsetof(struct kvt_seq_params, field), sizeof(((struct kvt_seq_params *)0)->field)
	    {"smaller than struct", -EINVAL, F(size), 8},
	    {"reserved", -EINVAL, F(reserved0), 1},
	    {"unknown t2_flags", -EINVAL, F(t2_flags), 0x80},
	    {"layers", -EINVAL, F(layers), 0},
	    {"layers", -EINVAL, F(layers), KVT_MAX_LAYERS + 1},
	    {"kv_heads", -EINVAL, F(kv_heads), 0},
	    {"head_dim", -EINVAL, F(head_dim), KVT_MAX_HEAD_DIM + 1},
	    {"dtype", -EINVAL, F(dtype), KVT_DTYPE__COUNT},
	    {"stage_slots", -EINVAL, F(stage_slots), 0},
	    {"t0_slots without", -EINVAL, F(t0_slots), 4},
	    {"q_heads", -EINVAL, F(q_heads), 3},
	    {"head_dim 64 or 128", -EINVAL, F(ret_update), 16}, /* with head_dim 32, below */
	    {"delta", -EINVAL, F(delta), 0},
	    {"policy", -EINVAL, F(policy), KVT_POLICY__COUNT},
	    {"not registered", -ENOENT, F(stage_buf_id), 3},
	    {"runs past", -ERANGE, F(stage_slots), NMAX + 1},
#undef F
	};

	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct kvt_seq_params p = params();
		struct kvtd_seq *q = (void *)1;
		uint64_t v = cases[i].val;
		int r;

		if (cases[i].off == offsetof(struct kvt_seq_params, ret_update))
			p.head_dim = 32;
		memcpy((uint8_t *)&p + cases[i].off, &v, cases[i].len); /* little endian */
		Why.set = 0;
		r = kvtd_seq_create(&X, &p, &q);
		ck_assert_msg(r == cases[i].err, "case %u (%s): %d", i, cases[i].why, r);
		ck_assert_ptr_eq(q, (void *)1); /* untouched on failure */
		ck_assert_msg(Why.set && strstr(Why.msg, cases[i].why), "case %u: reason '%s'", i,
			      Why.set ? Why.msg : "");
	}
	/* nothing left behind: no class holds a reference, the buffer only its own */
	for (int c = 0; c < KVTD_POOL_MAX_CLASSES; c++)
		ck_assert_uint_eq(Pool.classes[c].refs, 0);
	ck_assert_uint_eq(Pool.used_bytes, 0);
}
END_TEST

/*
 * An account at its limit refuses APPEND with -EDQUOT and keeps nothing of it; RETIER, which
 * needs int8 slots on top, refuses before it moves anything (all or nothing).
 */
START_TEST(t_quota)
{
	struct kvt_seq_params p = params();
	static uint8_t out[KVT_RETIER_OUT_SIZE(T0)];
	struct kvtd_seq *q;
	uint64_t bytes, slot;
	uint32_t changes, n_t0;

	params_tiered(&p, 0.1f, 0.5f);
	q = open_seq(&p);
	slot = kvtd_pool_slot_size(&Pool, q->cls);
	Acct.limit = 40 * slot;
	ck_assert_int_eq(kvtd_seq_append_rows(&X, q, Rows, 41), -EDQUOT);
	ck_assert_uint_eq(q->ts.n, 0);
	ck_assert_uint_eq(Acct.bytes, 0);
	ck_assert_uint_eq(Pool.used_bytes, 0);
	append(q, 40);
	bytes = Acct.bytes;
	ck_assert_uint_eq(bytes, 40 * slot);
	ck_assert_int_eq(kvtd_seq_append_rows(&X, q, Rows, 1), -EDQUOT);
	ck_assert_uint_eq(q->ts.n, 40);
	ck_assert_uint_eq(Acct.bytes, bytes);
	ck_assert_uint_eq(Pool.used_bytes, bytes);
	/* RETIER wants int8 slots while every T1 slot is still held: refused, nothing moved */
	n_t0 = q->ts.count[KVT_T0];
	ck_assert_int_eq(kvtd_seq_retier(&X, q, out, sizeof(out), &changes), -EDQUOT);
	ck_assert_uint_eq(q->ts.n_int8, 0);
	ck_assert_uint_eq(q->ts.count[KVT_T0], n_t0);
	ck_assert_uint_eq(Acct.bytes, bytes);
	ck_assert_uint_eq(Pool.used_bytes, bytes);
	Acct.limit = 0;
	ck_assert_int_gt(kvtd_seq_retier(&X, q, out, sizeof(out), &changes), 0);
	ck_assert_uint_gt(q->ts.n_int8, 0);
	kvtd_seq_destroy(&X, q);
	ck_assert_uint_eq(Acct.bytes, 0);
	ck_assert_uint_eq(Pool.used_bytes, 0);
}
END_TEST

enum { S = 4, W = 16, U = 16 };

/* The retrieval sequence of the TOPK tests: sinks S, window W, encoded U at a time. */
static struct kvtd_seq *
open_retrieval(uint32_t n, uint32_t *ret_zone)
{
	struct kvt_seq_params p = params();
	struct kvtd_seq *q;

	p.sinks = S;
	p.window = W;
	p.ret_update = U;
	q = open_seq(&p);
	append(q, n);
	*ret_zone = U * ((n - S - W) / U);
	return q;
}

/* With refine covering every key in retrieval (4k >= N), TOPK is exact: per kv head, the k
 * positions of the largest <key, query>, and their scores. */
START_TEST(t_topk_exact)
{
	static float qv[H * D];
	static uint8_t out[H * 4 + H * 64 * 8];
	const uint32_t k = 16, *cnt = (const void *)out, *pos = cnt + H;
	const float *score = (const float *)(pos + H * k);
	uint32_t zone;
	uint64_t n = 0;
	struct kvtd_seq *q = open_retrieval(S + W + 64, &zone);
	int r;

	ck_assert_uint_eq(zone, 64);
	for (int i = 0; i < H * D; i++)
		qv[i] = kvt_test_lcg_gauss(&Rng);
	for (uint32_t layer = 0; layer < L; layer++) {
		r = seq_topk(&X, q, layer, k, 0, 0, qv, H * D, out, sizeof(out), &n);
		ck_assert_msg(r == (int)k, "topk: %d (%s)", r, Why.msg);
		ck_assert_uint_eq(n, zone);
		for (uint32_t h = 0; h < H; h++) {
			double exact[64], kth = -INFINITY;
			uint32_t above = 0;

			ck_assert_uint_eq(cnt[h], k);
			for (uint32_t i = 0; i < zone; i++) {
				const float *key = appended(S + i, layer, 0) + h * D;

				exact[i] = 0;
				for (int j = 0; j < D; j++)
					exact[i] += (double)key[j] * qv[h * D + j];
			}
			/* the k-th largest exact score */
			for (uint32_t i = 0; i < zone; i++) {
				uint32_t greater = 0;

				for (uint32_t j = 0; j < zone; j++)
					greater += exact[j] > exact[i];
				if (greater == k - 1)
					kth = exact[i];
			}
			for (uint32_t i = 0; i < k; i++) {
				uint32_t p = pos[h * k + i];

				ck_assert_uint_ge(p, S);
				ck_assert_uint_lt(p, S + zone);
				ck_assert_msg(
				    exact[p - S] >= kth - 1e-4,
				    "layer %u head %u: position %u (%g) is not in the top %u "
				    "(k-th %g)",
				    layer, h, p, exact[p - S], k, kth);
				ck_assert(fabs(score[h * k + i] - exact[p - S]) < 1e-3);
				for (uint32_t j = 0; j < i; j++)
					ck_assert_uint_ne(pos[h * k + j], p);
			}
			for (uint32_t i = 0; i < zone; i++)
				above += exact[i] >= kth;
			ck_assert_uint_eq(above, k);
		}
	}
	/* what TOPK refuses, with a reason (k = 0, mode, flags and probe: ops.c, check_topk) */
	ck_assert_int_eq(seq_topk(&X, q, L, k, 0, 0, qv, H * D, out, sizeof(out), &n), -EINVAL);
	ck_assert_int_eq(seq_topk(&X, q, 0, k, 0, 0, qv, H * D - 1, out, sizeof(out), &n), -EINVAL);
	ck_assert_int_eq(seq_topk(&X, q, 0, zone + 1, 0, 0, qv, H * D, out, sizeof(out), &n),
			 -ERANGE);
	ck_assert_int_eq(seq_topk(&X, q, 0, k, 0, 0, qv, H * D, out, 8, &n), -ENOSPC);
	qv[7] = NAN;
	Why.set = 0;
	ck_assert_int_eq(seq_topk(&X, q, 0, k, 0, 0, qv, H * D, out, sizeof(out), &n), -EINVAL);
	ck_assert_ptr_nonnull(strstr(Why.msg, "query value 7"));
	kvtd_seq_destroy(&X, q);
	ck_assert_uint_eq(Acct.bytes, 0);
	ck_assert_uint_eq(Pool.used_bytes, 0);
}
END_TEST

/* Pool bytes of the sequence's retrieval pages: every index and sketch page, by class. */
static uint64_t
retrieval_bytes(const struct kvtd_seq *q)
{
	uint64_t b = 0;

	for (uint32_t i = 0; i < (uint32_t)L * H; i++)
		b += q->paris->ix[i].npages * kvtd_pool_slot_size(&Pool, q->cls_pg) +
		     (q->paris->sk ? q->paris->sk[i].npages * kvtd_pool_slot_size(&Pool, q->cls_sk)
				   : 0);
	return b;
}

/*
 * [retrieval] sketch = no (the context's no_sketch at SEQ_OPEN): the sequence keeps it for life,
 * has no sketch and no sketch class, the account holds its rows and index pages only (at
 * head_dim 64 a sketch page is as large as an index page: with one the charge would double),
 * RETIER's int8 keys need no re-encoding, and TOPK is still the exact top-k of the keys as
 * FETCH stages them (a zone this short is scanned whole). A sequence opened once the setting
 * is back on has its sketch.
 */
START_TEST(t_no_sketch)
{
	struct kvt_seq_params p = params();
	static uint8_t out[KVT_RETIER_OUT_SIZE(T0)];
	static uint8_t tout[H * 4 + H * 16 * 8];
	static uint32_t list[NMAX];
	static float score[NMAX], qv[H * D];
	const uint32_t k = 16, *cnt = (const void *)tout, *pos = cnt + H;
	uint32_t changes, zone, n_int8 = 0;
	uint64_t n, ix_bytes = 0;
	struct kvtd_seq *q, *q2;

	params_tiered(&p, 0.1f, 0.6f);
	p.sinks = S;
	p.window = W;
	p.ret_update = U;
	X.no_sketch = true;
	q = open_seq(&p);
	X.no_sketch = false; /* the sequence keeps what it was opened with */
	append(q, 400);
	zone = (uint32_t)kvt_paris_seq_len(q->paris, 0);
	ck_assert_uint_eq(zone, U * ((400 - S - W) / U));
	ck_assert(q->no_sketch);
	ck_assert_ptr_null(q->paris->sk);
	ck_assert_int_eq(q->cls_sk, -1);
	for (uint32_t i = 0; i < (uint32_t)L * H; i++) {
		ck_assert_uint_eq(q->paris->ix[i].n, zone);
		ix_bytes += q->paris->ix[i].npages * kvtd_pool_slot_size(&Pool, q->cls_pg);
	}
	ck_assert_uint_gt(ix_bytes, 0);
	/* the sequence's pool bytes (SEQ_STAT) count its index pages */
	ck_assert_uint_eq(q->ret_bytes, ix_bytes);
	ck_assert_uint_eq(Acct.bytes, kvtd_seq_pool_bytes(&Pool, q));
	ck_assert_uint_eq(Pool.used_bytes, Acct.bytes);

	/* a third of the zone or more to int8: nothing to re-encode, and TOPK reads it as FETCH
	 * stages it, dequantized */
	for (uint32_t i = 0; i < 400; i++)
		score[i] = (float)(kvt_test_lcg(&Rng) >> 40) / 16777216.0f;
	ck_assert_int_eq(kvtd_seq_score_add(&X, q, 0, 400, score), 0);
	ck_assert_int_gt(kvtd_seq_retier(&X, q, out, sizeof(out), &changes), 0);
	for (uint32_t i = 0; i < zone; i++)
		n_int8 += (q->ts.tier[S + i] & KVT_TIER_F_INT8) != 0;
	ck_assert_uint_gt(n_int8, zone / 4);
	for (uint32_t i = 0; i < zone; i++)
		list[i] = S + i;
	ck_assert_int_eq(fetch(q, KVT_FETCH_F_LIST, 0, L, 0, list, NMAX, zone), (int)zone);
	for (int i = 0; i < H * D; i++)
		qv[i] = kvt_test_lcg_gauss(&Rng);
	for (uint32_t l = 0; l < L; l++) {
		int r = seq_topk(&X, q, l, k, 0, 0, qv, H * D, tout, sizeof(tout), &n);

		ck_assert_msg(r == (int)k, "topk: %d (%s)", r, Why.msg);
		for (uint32_t h = 0; h < H; h++) {
			uint32_t above = 0;
			double kth = INFINITY;

			ck_assert_uint_eq(cnt[h], k);
			for (uint32_t i = 0; i < k; i++) {
				const float *key = staged(pos[h * k + i] - S, l, 0) + h * D;
				double e = 0;

				ck_assert_uint_ge(pos[h * k + i], S);
				ck_assert_uint_lt(pos[h * k + i], S + zone);
				for (int j = 0; j < D; j++)
					e += (double)key[j] * qv[h * D + j];
				kth = e < kth ? e : kth;
			}
			/* no key outside the answer scores above its lowest */
			for (uint32_t i = 0; i < zone; i++) {
				const float *key = staged(i, l, 0) + h * D;
				double e = 0;

				for (int j = 0; j < D; j++)
					e += (double)key[j] * qv[h * D + j];
				above += e > kth + 1e-4;
			}
			ck_assert_uint_lt(above, k);
		}
	}
	/* opened with the setting on: a sketch, charged like the index */
	q2 = open_retrieval(S + W + 64, &zone);
	ck_assert(!q2->no_sketch);
	ck_assert_ptr_nonnull(q2->paris->sk);
	ck_assert_uint_eq(q2->paris->sk[0].n, zone);
	kvtd_seq_destroy(&X, q2);
	kvtd_seq_destroy(&X, q);
	ck_assert_uint_eq(Acct.bytes, 0);
	ck_assert_uint_eq(Pool.used_bytes, 0);
}
END_TEST

/*
 * @got against a sketch built from @zone f32 key rows at @rows + i * @stride bytes (what the
 * exact stage reads): the int8 level byte for byte; the 2-bit level key by key, as encoding
 * those values against @got's page centres gives (the centres depend on how the keys came in
 * batches, sketch.h).
 */
static void
sketch_same(const struct kvt_sketch *got, const uint8_t *rows, size_t stride, uint32_t zone)
{
	struct kvt_sketch want;
	size_t int8 = kvt_sketch_int8_bytes(D, got->page_keys);

	ck_assert_uint_eq(got->n, zone);
	ck_assert_int_eq(kvt_sketch_init(&want, D, got->page_keys, NULL), 0);
	ck_assert_int_ge(kvt_sketch_reserve(&want, zone), (int)zone);
	ck_assert_int_eq(kvt_sketch_append(&want, rows, stride, KVT_DTYPE_F32, zone), (int)zone);
	ck_assert_uint_eq(want.npages, got->npages);
	for (uint32_t pg = 0; pg < got->npages; pg++)
		ck_assert_msg(!memcmp(want.pages[pg], got->pages[pg], int8),
			      "page %u: the int8 sketch is not that of the keys TOPK reads", pg);
	for (uint32_t i = 0; i < zone; i++) {
		uint8_t bg[D / 4], bw[D / 4];
		float fg, fw;
		const float *c;

		ck_assert_int_eq(kvt_sketch_sign_code(got, i, NULL, bg, &fg, &c), 0);
		ck_assert_int_eq(
		    kvt_sketch_sign_code(got, i, (const float *)(rows + i * stride), bw, &fw, &c),
		    0);
		ck_assert_msg(!memcmp(bg, bw, sizeof(bg)) && fg == fw,
			      "key %u: the 2-bit level is not that of the key TOPK reads", i);
	}
	kvt_sketch_fini(&want);
}

/*
 * The sketch of every (layer, kv head) encodes exactly the keys TOPK's exact stage reads: the
 * rows as appended, and after RETIER quantized positions of the zone to int8 (per head or per
 * channel scales) their dequantized values, which FETCH stages too. Compared byte for byte
 * with a sketch built from the staged rows. Its pages are charged to the account like the
 * index's, and given back with the sequence.
 */
START_TEST(t_sketch_follows_int8)
{
	static const uint32_t t2_flags[] = {0, KVT_T2_F_KEY_CHANNEL};

	for (unsigned m = 0; m < 2; m++) {
		struct kvt_seq_params p = params();
		static uint8_t out[KVT_RETIER_OUT_SIZE(T0)];
		static uint32_t list[NMAX];
		static float score[NMAX];
		uint32_t changes, zone, n_int8 = 0;
		struct kvtd_seq *q;

		params_tiered(&p, 0.1f, 0.6f);
		p.sinks = S;
		p.window = W;
		p.ret_update = U;
		p.t2_flags = t2_flags[m];
		q = open_seq(&p);
		append(q, 400);
		zone = (uint32_t)kvt_paris_seq_len(q->paris, 0);
		ck_assert_uint_eq(zone, U * ((400 - S - W) / U));
		ck_assert_uint_gt(retrieval_bytes(q), 0);
		ck_assert_uint_eq(q->ret_bytes, retrieval_bytes(q));
		ck_assert_uint_eq(Acct.bytes, kvtd_seq_pool_bytes(&Pool, q));
		for (uint32_t i = 0; i < 400; i++)
			score[i] = (float)(kvt_test_lcg(&Rng) >> 40) / 16777216.0f;
		ck_assert_int_eq(kvtd_seq_score_add(&X, q, 0, 400, score), 0);
		ck_assert_int_gt(kvtd_seq_retier(&X, q, out, sizeof(out), &changes), 0);
		for (uint32_t i = 0; i < zone; i++)
			n_int8 += (q->ts.tier[S + i] & KVT_TIER_F_INT8) != 0;
		ck_assert_uint_gt(n_int8, zone / 4);
		/* what the exact stage reads: the rows FETCH stages, T2 ones dequantized */
		for (uint32_t i = 0; i < zone; i++)
			list[i] = S + i;
		ck_assert_int_eq(fetch(q, KVT_FETCH_F_LIST, 0, L, 0, list, NMAX, zone), (int)zone);
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t h = 0; h < H; h++)
				sketch_same(&q->paris->sk[l * H + h],
					    (const uint8_t *)(staged(0, l, 0) + h * D), ROW, zone);
		kvtd_seq_destroy(&X, q);
		ck_assert_uint_eq(Acct.bytes, 0);
		ck_assert_uint_eq(Pool.used_bytes, 0);
	}
}
END_TEST

/* The sketch of (layer, kv head) @i of @q against one built from zone key rows at @k0 + pos *
 * TOK bytes for position pos. */
static void
sketch_is(const struct kvtd_seq *q, uint32_t l, uint32_t h, const uint8_t *k0, uint32_t zone)
{
	sketch_same(&q->paris->sk[l * H + h], k0 + (uint64_t)S * TOK + (2 * l * H + h) * D * 4, TOK,
		    zone);
}

/*
 * PUBLISH of blocks the namespace already holds points the sequence's positions at the
 * block's rows, which TOPK reads from then on: where those differ from the sequence's own
 * (another run of the model, or a client's wrong key), its sketch follows them.
 */
START_TEST(t_sketch_follows_publish)
{
	enum { BT = 16, NB = 12, NTOK = 200 };
	struct kvt_ns_params np = {.size = sizeof(np),
				   .layers = L,
				   .kv_heads = H,
				   .head_dim = D,
				   .dtype = KVT_DTYPE_F32,
				   .block_tokens = BT};
	static struct kvtd_prefix px;
	struct kvt_block_key keys[NB];
	struct kvt_seq_params p = params();
	struct kvtd_seq *qa, *qb;
	struct kvtd_pns *ns;
	uint32_t nn, nf, zone = U * ((NTOK - S - W) / U);
	const char *why;

	strcpy(np.name, "check-seq");
	ck_assert_int_eq(kvtd_prefix_init(&px, &Pool, 8ull << 20), 0);
	X.prefix = &px;
	ck_assert_int_eq(kvtd_prefix_ns_check(&np, &why), 0);
	ck_assert_int_eq(kvtd_prefix_ns_open(&px, &np, 1, &ns), 0);
	for (uint32_t b = 0; b < NB; b++)
		keys[b] = (struct kvt_block_key){.lo = b + 1, .hi = 7};
	p.sinks = S;
	p.window = W;
	p.ret_update = U;
	qa = open_seq(&p);
	qb = open_seq(&p);
	ck_assert_int_eq(kvtd_seq_join(&X, qa, ns, NULL, 0), 0);
	ck_assert_int_eq(kvtd_seq_join(&X, qb, ns, NULL, 0), 0);
	/* the same blocks, other rows */
	ck_assert_int_eq(kvtd_seq_append_rows(&X, qa, Rows, NTOK), NTOK);
	ck_assert_int_eq(kvtd_seq_append_rows(&X, qb, Rows + (uint64_t)NTOK * TOK, NTOK), NTOK);
	ck_assert_uint_le(S + zone, NB * BT); /* the blocks cover the zone */
	ck_assert_int_eq(kvtd_seq_publish(&X, qa, keys, NB, &nn, &nf), NB);
	ck_assert_uint_eq(nn, NB);
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t h = 0; h < H; h++)
			sketch_is(qb, l, h, Rows + (uint64_t)NTOK * TOK, zone);
	ck_assert_int_eq(kvtd_seq_publish(&X, qb, keys, NB, &nn, &nf), NB);
	ck_assert_uint_eq(nf, NB);
	ck_assert_ptr_eq(qb->slot[S], qa->slot[S]);
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t h = 0; h < H; h++) {
			sketch_is(qa, l, h, Rows, zone);
			sketch_is(qb, l, h, Rows, zone);
		}
	kvtd_seq_destroy(&X, qa);
	kvtd_seq_destroy(&X, qb);
	kvtd_prefix_ns_close(&px, ns);
	kvtd_prefix_fini(&px);
	X.prefix = NULL;
	ck_assert_uint_eq(Pool.used_bytes, 0);
}
END_TEST

/*
 * An APPEND whose flush cannot have all its index and sketch pages (the account's limit, reached
 * at the second head) fails, and leaves every head's index and sketch as they were; the next
 * APPEND with room encodes the backlog too, every head alike, and TOPK answers over all of it.
 */
START_TEST(t_flush_no_room)
{
	static float qv[H * D];
	static uint8_t out[H * 4 + H * 8 * 8];
	struct kvt_seq_params p = params();
	struct kvtd_seq *q;
	uint64_t slot, n;
	int r;

	p.sinks = S;
	p.window = W;
	p.ret_update = U;
	q = open_seq(&p);
	slot = kvtd_pool_slot_size(&Pool, q->cls);
	/* room for the rows of the first tokens and for head 0's first index and sketch pages:
	 * head 1's index page is the one that cannot be had */
	Acct.limit = 100 * slot + kvtd_pool_slot_size(&Pool, q->cls_pg) +
		     kvtd_pool_slot_size(&Pool, q->cls_sk);
	r = kvtd_seq_append_rows(&X, q, Rows, 100);
	ck_assert_int_lt(r, 0);
	ck_assert_uint_eq(q->ts.n, 100);
	for (uint32_t i = 0; i < (uint32_t)L * H; i++) {
		ck_assert_uint_eq(q->paris->ix[i].n, 0);
		ck_assert_uint_eq(q->paris->sk[i].n, 0);
	}
	Acct.limit = 0;
	append(q, 50);
	for (uint32_t i = 0; i < (uint32_t)L * H; i++) {
		ck_assert_uint_eq(q->paris->ix[i].n, U * ((150 - S - W) / U));
		ck_assert_uint_eq(q->paris->sk[i].n, q->paris->ix[i].n);
	}
	for (int i = 0; i < H * D; i++)
		qv[i] = kvt_test_lcg_gauss(&Rng);
	ck_assert_int_eq(seq_topk(&X, q, 1, 8, 0, 0, qv, H * D, out, sizeof(out), &n), 8);
	ck_assert_uint_eq(n, U * ((150 - S - W) / U));
	kvtd_seq_destroy(&X, q);
	ck_assert_uint_eq(Acct.bytes, 0);
	ck_assert_uint_eq(Pool.used_bytes, 0);
}
END_TEST

/*
 * Once each op has run once, RETIER (quantizing and promoting) and FETCH of T1 and T2 rows
 * allocate nothing while the sequence grows, and TOPK with F_FETCH nothing at a fixed length:
 * their batches, quantization room and query copy live in the scratch, which stops growing.
 * (A growing retrieval index grows the index's own per-sequence search scratch, engine/paris.c.)
 */
START_TEST(t_steady_no_alloc)
{
	struct kvt_seq_params p = params();
	static uint8_t out[KVT_RETIER_OUT_SIZE(T0)];
	static uint8_t tout[H * 4 + H * 16 * 8];
	static uint32_t list[NMAX];
	static float score[NMAX], qv[H * D];
	uint64_t grows = 0, allocs = 0, n, quant0 = 0;
	uint32_t changes;
	struct kvtd_seq *q;

	params_tiered(&p, 0.1f, 0.5f);
	p.sinks = S;
	p.window = W;
	p.ret_update = U;
	q = open_seq(&p);
	append(q, 400);
	for (int i = 0; i < H * D; i++)
		qv[i] = kvt_test_lcg_gauss(&Rng);
	for (int round = 0; round < 14; round++) {
		const int growing = round < 9; /* then a fixed length */
		uint64_t a0, a1, a2;
		int r1, r2, r3;

		if (growing)
			append(q, 8);		       /* more positions to quantize */
		for (uint32_t i = 0; i < q->ts.n; i++) /* new scores: other positions are hot */
			score[i] = (float)(kvt_test_lcg(&Rng) >> 40) / 16777216.0f * (round + 1);
		ck_assert_int_eq(kvtd_seq_score_add(&X, q, 0, (uint32_t)q->ts.n, score), 0);
		if (round == 3) { /* warm: from here on nothing may allocate */
			grows = Scr.grows;
			quant0 = q->bytes_quant;
		}
		/* Check allocates in its asserts: nothing between the counter reads */
		a0 = n_alloc;
		r1 = kvtd_seq_retier(&X, q, out, sizeof(out), &changes);
		r2 = fetch(q, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, L, 0, list, NMAX, 0);
		a1 = n_alloc;
		r3 = seq_topk(&X, q, 1, 16, KVT_TOPK_F_FETCH, 0, qv, H * D, tout, sizeof(tout), &n);
		a2 = n_alloc;
		ck_assert_int_gt(r1, 0);
		ck_assert_int_gt(r2, 0);
		ck_assert_int_eq(r3, 16);
		if (round >= 3)
			allocs += a1 - a0;
		if (round >= 10) /* one TOPK at the final length grew the search scratch */
			allocs += a2 - a1;
	}
	ck_assert_uint_gt(grows, 0);		   /* the scratch was used ... */
	ck_assert_uint_eq(Scr.grows, grows);	   /* ... and stopped growing */
	ck_assert_uint_eq(allocs, 0);		   /* nothing else allocated either */
	ck_assert_uint_gt(q->bytes_quant, quant0); /* RETIER kept quantizing while warm */
	kvtd_seq_destroy(&X, q);
	ck_assert_uint_eq(Pool.used_bytes, 0);
}
END_TEST

KVT_CHECK_MAIN("seq", 60, setup, teardown, t_append_fetch_t1, t_retier_int8_fetch,
	       t_fetch_kv_adjacent, t_fetch_rows_to_buffer, t_score_add_invalid, t_open_invalid,
	       t_quota, t_topk_exact, t_steady_no_alloc, t_sketch_follows_int8,
	       t_sketch_follows_publish, t_flush_no_room, t_no_sketch)
