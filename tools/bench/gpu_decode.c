/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench gpu-decode - a Llama-shaped decode step on the device with random weights, with
 * every KV row in HBM and with kvtier (T0 slots in HBM, the rest staged per layer through
 * kvtierd's FETCH), beside the physical bound max(compute step, staged bytes / pinned H2D
 * bandwidth).
 *
 * One step, per layer: QKV projection, attention (gpu_decode_kernels.cu) over the layer's rows,
 * output projection, gate/up projection, SiLU gate, down projection; projections are cuBLAS
 * GEMVs (f16 in, f32 compute). Norms, RoPE, residuals and the new token's own K/V append are
 * left out: they are a few microseconds per layer and change neither the bytes nor the bound.
 *
 * With kvtier the sequence's rows are appended once, RETIER puts ceil(hbm_frac * ctx) of them in
 * T0 slots (the device region attention reads directly), and each step stages the T1/T2 rows of
 * every layer: layer l+1's FETCH is in flight while layer l computes, into the other half of a
 * double-buffered staging region (the pattern client/include/kvtier.h documents). The compute
 * stream waits for a staged layer on the device (kvt_cuda_stream_wait() on a side stream, an
 * event per layer), never on the CPU; the CPU waits only before it reuses a staging half, for
 * the attention that last read it, while the layer before runs.
 *
 * Output: one JSON object, "rows" holding for each (ctx, hbm_frac) ctx, hbm_frac, tok_s_hbm,
 * tok_s_kvtier, tok_s_bound, h2d_gbps (and the times behind them). --check compares the device's
 * attention and GEMV with a CPU reference, and kvtier's staged attention with the all-in-HBM
 * one over the same rows, and fails when they differ.
 */
#define _GNU_SOURCE
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "kvt_cli.h"
#include "gpu_decode_kernels.h"
#include "kvtier.h"

typedef _Float16 f16;

#define CK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "gpu-decode: %s failed: %s (%s)\n", #call,                 \
				cudaGetErrorName(e_), cudaGetErrorString(e_));                     \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)
#define CB(call)                                                                                   \
	do {                                                                                       \
		cublasStatus_t s_ = (call);                                                        \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
			fprintf(stderr, "gpu-decode: %s failed: cuBLAS status %d\n", #call,        \
				(int)s_);                                                          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)
#define KV(call)                                                                                   \
	do {                                                                                       \
		long long r_ = (long long)(call);                                                  \
		if (r_ < 0) {                                                                      \
			fprintf(stderr, "gpu-decode: %s failed: %s (%s)\n", #call,                 \
				kvt_strerror((int)r_), kvt_last_error());                          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

struct opts {
	uint32_t layers, q_heads, kv_heads, head_dim, hidden, ffn;
	uint32_t ctx[8], n_ctx;
	float hbm[8];
	unsigned n_hbm;
	float t2_frac;
	unsigned steps, warmup;
	int check, no_kvtier;
	const char *socket;
};

/* The model on the device: weights per layer, activations, kernels. */
struct model {
	struct opts o;
	uint32_t qkv_dim, q_dim, row_elems; /* row: one position's K (or V) of one layer */
	f16 **wqkv, **wo, **wgu, **wd;
	f16 *x, *qkv, *attn, *o_out, *gu, *act;
	float *part;
	uint32_t part_splits;
	cublasHandle_t blas;
	cudaStream_t s, aux;
	cudaLibrary_t lib;
	cudaKernel_t k_partial, k_combine, k_silu;
};

/* The kvtierd this run started, stopped on every exit: an error path too (its stdout is ours,
 * and a caller reading it to the end would wait for it). */
static struct bench_daemon *own_daemon;

static void
stop_own_daemon(void)
{
	if (own_daemon && own_daemon->pid > 0)
		bench_daemon_stop(own_daemon);
	own_daemon = NULL;
}

static double
now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Deterministic row content: element i of position @pos's K (kv 0) or V (kv 1), any layer. */
static f16
row_val(uint64_t pos, unsigned kv, uint32_t i)
{
	uint64_t x = pos * 0x9e3779b97f4a7c15ull ^ (kv + 1) * 0xbf58476d1ce4e5b9ull ^ i;

	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 29;
	return (f16)(((double)(x >> 11) / (double)(1ull << 53)) * 2.0 - 1.0);
}

static f16 *
dev_alloc(uint64_t n_elems)
{
	void *p;

	CK(cudaMalloc(&p, n_elems * sizeof(f16)));
	return p;
}

/* @n random f16 in [-a, a) on the device, from a host block reused for large tensors. */
static void
dev_fill_random(f16 *d, uint64_t n, float a, uint64_t seed)
{
	static f16 *blk;
	const uint64_t B = 1u << 22;

	if (!blk) {
		blk = malloc(B * sizeof(f16));
		if (!blk)
			exit(1);
	}
	for (uint64_t i = 0; i < B && i < n; i++)
		blk[i] = (f16)(a * (float)row_val(seed, 2, (uint32_t)i));
	for (uint64_t done = 0; done < n; done += B)
		CK(cudaMemcpy(d + done, blk, (n - done < B ? n - done : B) * sizeof(f16),
			      cudaMemcpyHostToDevice));
}

/* y[m] = W[m][k] x[k] (W row-major, as cuBLAS's column-major k x m transposed). */
static void
gemv(struct model *m, const f16 *w, const f16 *x, f16 *y, int rows, int cols)
{
	const float one = 1.f, zero = 0.f;

	CB(cublasGemmEx(m->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, 1, cols, &one, w, CUDA_R_16F, cols,
			x, CUDA_R_16F, cols, &zero, y, CUDA_R_16F, rows, CUBLAS_COMPUTE_32F,
			CUBLAS_GEMM_DEFAULT));
}

static uint32_t
splits_for(uint32_t n)
{
	uint32_t s = (n + 255) / 256;

	return s < 1 ? 1 : s > 1024 ? 1024 : s;
}

/* Attention of the current q over @n0 rows at (k0, v0) and @ns rows at (ks, vs) into m->attn. */
static void
attention(struct model *m, const f16 *k0, const f16 *v0, uint32_t n0, const f16 *ks, const f16 *vs,
	  uint32_t ns)
{
	const struct opts *o = &m->o;
	uint32_t n = n0 + ns, nsplit = splits_for(n), chunk = (n + nsplit - 1) / nsplit;
	uint32_t group = o->q_heads / o->kv_heads, hd = o->head_dim, kvh = o->kv_heads;
	float scale = 1.f / sqrtf((float)hd);
	const f16 *q = m->qkv;
	void *a[13] = {&q,   &k0,    &v0, &n0,	  &ks,	  &vs,	   &ns,
		       &kvh, &group, &hd, &scale, &chunk, &m->part};
	void *b[4] = {&m->part, &nsplit, &hd, &m->attn};

	CK(cudaLaunchKernel((const void *)m->k_partial, (dim3){kvh, nsplit, 1},
			    (dim3){KVTB_ATTN_THREADS, 1, 1}, a, 0, m->s));
	CK(cudaLaunchKernel((const void *)m->k_combine, (dim3){o->q_heads, 1, 1}, (dim3){hd, 1, 1},
			    b, 0, m->s));
}

static void
layer_qkv(struct model *m, uint32_t l)
{
	gemv(m, m->wqkv[l], m->x, m->qkv, (int)m->qkv_dim, (int)m->o.hidden);
}

static void
layer_rest(struct model *m, uint32_t l)
{
	uint32_t n = m->o.ffn;
	void *a[3] = {&m->gu, &n, &m->act};

	gemv(m, m->wo[l], m->attn, m->o_out, (int)m->o.hidden, (int)m->q_dim);
	gemv(m, m->wgu[l], m->o_out, m->gu, (int)(2 * m->o.ffn), (int)m->o.hidden);
	CK(cudaLaunchKernel((const void *)m->k_silu,
			    (dim3){(n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024, 1, 1},
			    (dim3){256, 1, 1}, a, 0, m->s));
	gemv(m, m->wd[l], m->act, m->x, (int)m->o.hidden, (int)m->o.ffn);
}

static void
model_init(struct model *m, const struct opts *o)
{
	const struct opts *p = o;
	uint32_t L = p->layers, max_ctx = 0;

	memset(m, 0, sizeof(*m));
	m->o = *o;
	m->q_dim = p->q_heads * p->head_dim;
	m->qkv_dim = (p->q_heads + 2 * p->kv_heads) * p->head_dim;
	m->row_elems = p->kv_heads * p->head_dim;
	CK(cudaSetDevice(0));
	CK(cudaStreamCreateWithFlags(&m->s, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&m->aux, cudaStreamNonBlocking));
	CB(cublasCreate_v2(&m->blas));
	CB(cublasSetStream_v2(m->blas, m->s));
	CK(cudaLibraryLoadData(&m->lib, kvtb_gpu_decode_fatbin, NULL, NULL, 0, NULL, NULL, 0));
	CK(cudaLibraryGetKernel(&m->k_partial, m->lib, KVTB_ATTN_PARTIAL));
	CK(cudaLibraryGetKernel(&m->k_combine, m->lib, KVTB_ATTN_COMBINE));
	CK(cudaLibraryGetKernel(&m->k_silu, m->lib, KVTB_SILU_MUL));
	m->wqkv = calloc(L, sizeof(f16 *));
	m->wo = calloc(L, sizeof(f16 *));
	m->wgu = calloc(L, sizeof(f16 *));
	m->wd = calloc(L, sizeof(f16 *));
	for (uint32_t l = 0; l < L; l++) {
		/* Scaled by 1/sqrt(fan-in) so activations stay O(1) through the layers. */
		m->wqkv[l] = dev_alloc((uint64_t)m->qkv_dim * p->hidden);
		dev_fill_random(m->wqkv[l], (uint64_t)m->qkv_dim * p->hidden,
				1.f / sqrtf((float)p->hidden), 10 + l);
		m->wo[l] = dev_alloc((uint64_t)p->hidden * m->q_dim);
		dev_fill_random(m->wo[l], (uint64_t)p->hidden * m->q_dim,
				1.f / sqrtf((float)m->q_dim), 1000 + l);
		m->wgu[l] = dev_alloc(2ull * p->ffn * p->hidden);
		dev_fill_random(m->wgu[l], 2ull * p->ffn * p->hidden, 1.f / sqrtf((float)p->hidden),
				2000 + l);
		m->wd[l] = dev_alloc((uint64_t)p->hidden * p->ffn);
		dev_fill_random(m->wd[l], (uint64_t)p->hidden * p->ffn, 1.f / sqrtf((float)p->ffn),
				3000 + l);
	}
	m->x = dev_alloc(p->hidden);
	dev_fill_random(m->x, p->hidden, 1.f, 7);
	m->qkv = dev_alloc(m->qkv_dim);
	m->attn = dev_alloc(m->q_dim);
	m->o_out = dev_alloc(p->hidden);
	m->gu = dev_alloc(2ull * p->ffn);
	m->act = dev_alloc(p->ffn);
	for (unsigned i = 0; i < p->n_ctx; i++)
		max_ctx = p->ctx[i] > max_ctx ? p->ctx[i] : max_ctx;
	m->part_splits = splits_for(max_ctx);
	CK(cudaMalloc((void **)&m->part,
		      KVTB_PART_FLOATS(p->q_heads, m->part_splits, p->head_dim) * sizeof(float)));
}

/* ---- all rows in HBM ------------------------------------------------------------------------ */

struct hbm_kv {
	f16 **k, **v; /* per layer, [ctx][kv_heads][head_dim] */
	uint32_t ctx;
};

static void
hbm_kv_init(struct model *m, struct hbm_kv *h, uint32_t ctx)
{
	uint64_t n = (uint64_t)ctx * m->row_elems;
	f16 *host = malloc(n * sizeof(f16));

	if (!host)
		exit(1);
	h->ctx = ctx;
	h->k = calloc(m->o.layers, sizeof(f16 *));
	h->v = calloc(m->o.layers, sizeof(f16 *));
	for (unsigned kv = 0; kv < 2; kv++) {
		for (uint64_t p = 0; p < ctx; p++)
			for (uint32_t i = 0; i < m->row_elems; i++)
				host[p * m->row_elems + i] = row_val(p, kv, i);
		/* A copy per layer: one buffer for all would sit in L2 at small contexts. */
		for (uint32_t l = 0; l < m->o.layers; l++) {
			f16 *d = dev_alloc(n);

			CK(cudaMemcpy(d, host, n * sizeof(f16), cudaMemcpyHostToDevice));
			(kv ? h->v : h->k)[l] = d;
		}
	}
	free(host);
}

static void
hbm_kv_fini(struct model *m, struct hbm_kv *h)
{
	for (uint32_t l = 0; l < m->o.layers; l++) {
		CK(cudaFree(h->k[l]));
		CK(cudaFree(h->v[l]));
	}
	free(h->k);
	free(h->v);
}

static void
step_hbm(struct model *m, const struct hbm_kv *h)
{
	for (uint32_t l = 0; l < m->o.layers; l++) {
		layer_qkv(m, l);
		attention(m, h->k[l], h->v[l], h->ctx, NULL, NULL, 0);
		layer_rest(m, l);
	}
}

/* ---- kvtier --------------------------------------------------------------------------------- */

struct tiered {
	struct kvt_client *c;
	struct kvt_buf *t0, *stage;
	uint32_t seq, ctx, n0, ns, t0_slots;
	f16 *t0_ptr, *stage_ptr;
	uint64_t t0_layer, t0_kv, st_kv, st_half; /* element strides */
	uint32_t *pos;				  /* FETCH's position list (n1 + n2 entries) */
	cudaEvent_t staged[2], read[2];		  /* per staging half */
	uint64_t layer_no;			  /* layers staged so far, over all steps */
	uint64_t fetch_bytes;
};

static void
tiered_open(struct model *m, struct tiered *t, struct kvt_client *c, uint32_t ctx, float hbm,
	    float t2)
{
	const struct opts *o = &m->o;
	uint64_t row_bytes = (uint64_t)m->row_elems * sizeof(f16), arena_size;
	uint64_t tok_bytes = (uint64_t)o->layers * 2 * row_bytes;
	uint32_t t0_tot = (uint32_t)ceil((double)hbm * ctx), chunk;
	struct kvt_seq_params p = {.size = sizeof(p)};
	uint8_t *arena = kvt_arena(c, &arena_size), *tok;
	uint64_t out_size;
	struct kvt_retier_result res;
	void *out;

	memset(t, 0, sizeof(*t));
	t->c = c;
	t->ctx = ctx;
	t->t0_slots = t0_tot + 1; /* delta 1: one slot kept free for the next append */
	t->n0 = t0_tot;
	KV(kvt_buf_alloc_cuda(c, 0, (uint64_t)t->t0_slots * tok_bytes, &t->t0));
	t->t0_ptr = kvt_buf_ptr(t->t0);
	t->t0_kv = (uint64_t)t->t0_slots * m->row_elems;
	t->t0_layer = 2 * t->t0_kv;
	p.layers = (uint16_t)o->layers;
	p.kv_heads = (uint16_t)o->kv_heads;
	p.head_dim = (uint16_t)o->head_dim;
	p.dtype = KVT_DTYPE_F16;
	p.policy = KVT_POLICY_TIERED;
	p.q_heads = (uint16_t)o->q_heads;
	p.delta = 1;
	p.hbm_frac = hbm;
	p.t2_frac = t2;
	p.t0_buf_id = kvt_buf_id(t->t0);
	p.t0_slots = t->t0_slots;
	p.t0_slot_stride = row_bytes;
	p.t0_kv_stride = t->t0_kv * sizeof(f16);
	p.t0_layer_stride = t->t0_layer * sizeof(f16);
	/* Staging: two halves of ctx - t0_tot rows each, for K and V; every layer uses the same
	 * rows (layer stride 0), the half alternating from one staged layer to the next. */
	t->ns = ctx - t0_tot;
	if (t->ns) {
		uint32_t rows = 2 * t->ns;

		KV(kvt_buf_alloc_cuda(c, 0, 2ull * rows * row_bytes, &t->stage));
		t->stage_ptr = kvt_buf_ptr(t->stage);
		t->st_kv = (uint64_t)rows * m->row_elems;
		t->st_half = (uint64_t)t->ns * m->row_elems;
		p.stage_buf_id = kvt_buf_id(t->stage);
		p.stage_slots = rows;
		p.stage_slot_stride = row_bytes;
		p.stage_kv_stride = t->st_kv * sizeof(f16);
		p.stage_layer_stride = 0;
	}
	KV(kvt_seq_open(c, &p, &t->seq));
	/* The rows, [token][layer][K,V][head][dim], the same for every layer (as in HBM). */
	chunk = (uint32_t)((arena_size / 2) / tok_bytes);
	if (!chunk) {
		fprintf(stderr, "gpu-decode: one token (%llu bytes) does not fit the arena\n",
			(unsigned long long)tok_bytes);
		exit(1);
	}
	tok = malloc(chunk * tok_bytes);
	if (!tok)
		exit(1);
	for (uint32_t first = 0; first < ctx; first += chunk) {
		uint32_t nt = ctx - first < chunk ? ctx - first : chunk;

		for (uint32_t i = 0; i < nt; i++) {
			uint8_t *t0k = tok + i * tok_bytes;

			/* Layer 0's K and V, then the same bytes for every other layer. */
			for (unsigned kv = 0; kv < 2; kv++)
				for (uint32_t e = 0; e < m->row_elems; e++)
					((f16 *)(t0k + kv * row_bytes))[e] =
					    row_val(first + i, kv, e);
			for (uint32_t l = 1; l < o->layers; l++)
				memcpy(t0k + 2 * l * row_bytes, t0k, 2 * row_bytes);
		}
		KV(kvt_append(c, t->seq, tok, (uint64_t)nt * tok_bytes, nt, NULL));
	}
	free(tok);
	(void)arena;
	out_size = KVT_RETIER_OUT_SIZE(t->t0_slots);
	out = malloc(out_size);
	KV(kvt_retier(c, t->seq, out, out_size));
	memcpy(&res, out, sizeof(res));
	free(out);
	if (res.tier_count[0] != t0_tot || res.tier_count[1] + res.tier_count[2] != t->ns) {
		fprintf(stderr,
			"gpu-decode: RETIER placed %llu rows in T0 and %llu in T1/T2, expected %u "
			"and %u\n",
			(unsigned long long)res.tier_count[0],
			(unsigned long long)(res.tier_count[1] + res.tier_count[2]), t0_tot, t->ns);
		exit(1);
	}
	t->pos = malloc(((size_t)t->ns + 1) * sizeof(uint32_t));
	for (int i = 0; i < 2; i++) {
		CK(cudaEventCreateWithFlags(&t->staged[i], cudaEventDisableTiming));
		CK(cudaEventCreateWithFlags(&t->read[i], cudaEventDisableTiming));
	}
}

static void
tiered_close(struct tiered *t)
{
	CK(cudaDeviceSynchronize());
	KV(kvt_seq_close(t->c, t->seq));
	KV(kvt_buf_free(t->c, t->t0));
	KV(kvt_buf_free(t->c, t->stage));
	for (int i = 0; i < 2; i++) {
		CK(cudaEventDestroy(t->staged[i]));
		CK(cudaEventDestroy(t->read[i]));
	}
	free(t->pos);
}

/*
 * Stage layer @l into staging half layer_no % 2: wait (CPU) until the attention that last read
 * that half is done, FETCH, then, without waiting for the copies, make staged[half] complete
 * after them (kvt_cuda_stream_wait() on the side stream, then a record there).
 */
static void
tiered_stage(struct model *m, struct tiered *t, uint32_t l)
{
	unsigned half = t->layer_no % 2;
	int r;

	if (t->layer_no >= 2)
		CK(cudaEventSynchronize(t->read[half]));
	r = kvt_fetch(t->c, t->seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, l, 1, half * t->ns, t->pos,
		      t->ns);
	if (r != (int)t->ns) {
		fprintf(stderr, "gpu-decode: FETCH of layer %u staged %d rows, expected %u: %s\n",
			l, r, t->ns, r < 0 ? kvt_last_error() : "");
		exit(1);
	}
	KV(kvt_cuda_stream_wait(t->c, m->aux));
	CK(cudaEventRecord(t->staged[half], m->aux));
	t->fetch_bytes += 2ull * t->ns * m->row_elems * sizeof(f16);
	t->layer_no++;
}

/* One decode step; the FETCH of the next step's layer 0 is queued during this step's last. */
static void
step_tiered(struct model *m, struct tiered *t, int first_step)
{
	uint32_t L = m->o.layers;

	if (!t->ns) {
		for (uint32_t l = 0; l < L; l++) {
			layer_qkv(m, l);
			attention(m, t->t0_ptr + l * t->t0_layer,
				  t->t0_ptr + l * t->t0_layer + t->t0_kv, t->n0, NULL, NULL, 0);
			layer_rest(m, l);
		}
		return;
	}
	if (first_step)
		tiered_stage(m, t, 0);
	for (uint32_t l = 0; l < L; l++) {
		unsigned half = (t->layer_no - 1) % 2; /* layer l's, staged last */
		const f16 *ks = t->stage_ptr + half * t->st_half, *vs = ks + t->st_kv;

		layer_qkv(m, l);
		CK(cudaStreamWaitEvent(m->s, t->staged[half], 0));
		attention(m, t->t0_ptr + l * t->t0_layer, t->t0_ptr + l * t->t0_layer + t->t0_kv,
			  t->n0, ks, vs, t->ns);
		CK(cudaEventRecord(t->read[half], m->s));
		layer_rest(m, l);
		/* Layer l is queued: stage the next one (this step's or the next step's layer 0).
		 */
		tiered_stage(m, t, l + 1 < L ? l + 1 : 0);
	}
}

/* ---- checks -----------------------------------------------------------------------------------
 */

static double
f16_max_diff(const f16 *a, const f16 *b, uint64_t n)
{
	double d = 0;

	for (uint64_t i = 0; i < n; i++) {
		double x = fabs((double)a[i] - (double)b[i]);

		if (!(x <= d))
			d = isnan(x) ? INFINITY : x;
	}
	return d;
}

/* The device's attention of layer 0 over the HBM rows against a CPU reference in double. */
static double
check_attention(struct model *m, const struct hbm_kv *h)
{
	const struct opts *o = &m->o;
	uint32_t hd = o->head_dim, group = o->q_heads / o->kv_heads, n = h->ctx;
	f16 *q = malloc(m->q_dim * sizeof(f16)), *got = malloc(m->q_dim * sizeof(f16)),
	    *want = malloc(m->q_dim * sizeof(f16));
	double *sc = malloc(n * sizeof(double)), err;

	layer_qkv(m, 0);
	attention(m, h->k[0], h->v[0], n, NULL, NULL, 0);
	CK(cudaStreamSynchronize(m->s));
	CK(cudaMemcpy(q, m->qkv, m->q_dim * sizeof(f16), cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(got, m->attn, m->q_dim * sizeof(f16), cudaMemcpyDeviceToHost));
	for (uint32_t qh = 0; qh < o->q_heads; qh++) {
		uint32_t kh = qh / group;
		double mx = -INFINITY, sum = 0;

		for (uint32_t p = 0; p < n; p++) {
			double x = 0;

			for (uint32_t d = 0; d < hd; d++)
				x += (double)q[qh * hd + d] * (double)row_val(p, 0, kh * hd + d);
			sc[p] = x / sqrt((double)hd);
			mx = sc[p] > mx ? sc[p] : mx;
		}
		for (uint32_t p = 0; p < n; p++)
			sum += sc[p] = exp(sc[p] - mx);
		for (uint32_t d = 0; d < hd; d++) {
			double a = 0;

			for (uint32_t p = 0; p < n; p++)
				a += sc[p] * (double)row_val(p, 1, kh * hd + d);
			want[qh * hd + d] = (f16)(a / sum);
		}
	}
	err = f16_max_diff(got, want, m->q_dim);
	free(q);
	free(got);
	free(want);
	free(sc);
	return err;
}

/* cuBLAS's QKV projection of layer 0 against a CPU reference. */
static double
check_gemv(struct model *m)
{
	const struct opts *o = &m->o;
	uint64_t nw = (uint64_t)m->qkv_dim * o->hidden;
	f16 *w = malloc(nw * sizeof(f16)), *x = malloc(o->hidden * sizeof(f16)),
	    *y = malloc(m->qkv_dim * sizeof(f16)), *want = malloc(m->qkv_dim * sizeof(f16));
	double err;

	layer_qkv(m, 0);
	CK(cudaStreamSynchronize(m->s));
	CK(cudaMemcpy(w, m->wqkv[0], nw * sizeof(f16), cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(x, m->x, o->hidden * sizeof(f16), cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(y, m->qkv, m->qkv_dim * sizeof(f16), cudaMemcpyDeviceToHost));
	for (uint32_t i = 0; i < m->qkv_dim; i++) {
		double a = 0;

		for (uint32_t k = 0; k < o->hidden; k++)
			a += (double)w[(uint64_t)i * o->hidden + k] * (double)x[k];
		want[i] = (f16)a;
	}
	err = f16_max_diff(y, want, m->qkv_dim);
	free(w);
	free(x);
	free(y);
	free(want);
	return err;
}

/* Every layer's attention with kvtier's rows (T0 slots + staged) against the HBM rows' one. */
static double
check_tiered(struct model *m, struct tiered *t, const struct hbm_kv *h)
{
	f16 *a = malloc(m->q_dim * sizeof(f16)), *b = malloc(m->q_dim * sizeof(f16));
	double err = 0;

	for (uint32_t l = 0; l < m->o.layers; l++) {
		unsigned half = t->layer_no % 2;
		double e;

		layer_qkv(m, l);
		if (t->ns) {
			tiered_stage(m, t, l);
			CK(cudaStreamWaitEvent(m->s, t->staged[half], 0));
		}
		attention(m, t->t0_ptr + l * t->t0_layer, t->t0_ptr + l * t->t0_layer + t->t0_kv,
			  t->n0, t->stage_ptr + half * t->st_half,
			  t->stage_ptr + half * t->st_half + t->st_kv, t->ns);
		CK(cudaEventRecord(t->read[half], m->s));
		CK(cudaStreamSynchronize(m->s));
		CK(cudaMemcpy(a, m->attn, m->q_dim * sizeof(f16), cudaMemcpyDeviceToHost));
		attention(m, h->k[l], h->v[l], h->ctx, NULL, NULL, 0);
		CK(cudaStreamSynchronize(m->s));
		CK(cudaMemcpy(b, m->attn, m->q_dim * sizeof(f16), cudaMemcpyDeviceToHost));
		e = f16_max_diff(a, b, m->q_dim);
		err = e > err ? e : err;
	}
	free(a);
	free(b);
	return err;
}

/* ---- measurement ------------------------------------------------------------------------------
 */

static double
h2d_gbps(void)
{
	const size_t len = 256u << 20;
	void *h, *d;
	double t0, t;
	int reps = 8;

	CK(cudaHostAlloc(&h, len, cudaHostAllocPortable));
	memset(h, 1, len);
	CK(cudaMalloc(&d, len));
	CK(cudaMemcpy(d, h, len, cudaMemcpyHostToDevice)); /* warm */
	t0 = now_s();
	for (int i = 0; i < reps; i++)
		CK(cudaMemcpy(d, h, len, cudaMemcpyHostToDevice));
	t = now_s() - t0;
	CK(cudaFree(d));
	CK(cudaFreeHost(h));
	return (double)len * reps / t / 1e9;
}

static double
time_steps(struct model *m, const struct hbm_kv *h, struct tiered *t)
{
	const struct opts *o = &m->o;
	double t0;

	for (unsigned i = 0; i < o->warmup; i++) {
		if (t)
			step_tiered(m, t, i == 0);
		else
			step_hbm(m, h);
	}
	CK(cudaStreamSynchronize(m->s));
	t0 = now_s();
	for (unsigned i = 0; i < o->steps; i++) {
		if (t)
			step_tiered(m, t, o->warmup == 0 && i == 0);
		else
			step_hbm(m, h);
	}
	CK(cudaStreamSynchronize(m->s));
	return (now_s() - t0) / o->steps;
}

static int
parse_list_u32(const char *s, uint32_t *out, unsigned cap)
{
	unsigned n = 0;
	char *e;

	while (*s && n < cap) {
		unsigned long v = strtoul(s, &e, 10);

		if (e == s || !v)
			return -1;
		if (*e == 'K' || *e == 'k')
			v *= 1024, e++;
		out[n++] = (uint32_t)v;
		if (*e != ',' && *e)
			return -1;
		s = *e ? e + 1 : e;
	}
	return (int)n;
}

static int
parse_list_f(const char *s, float *out, unsigned cap)
{
	unsigned n = 0;
	char *e;

	while (*s && n < cap) {
		float v = strtof(s, &e);

		if (e == s || !(v >= 0.f && v <= 1.f))
			return -1;
		out[n++] = v;
		if (*e != ',' && *e)
			return -1;
		s = *e ? e + 1 : e;
	}
	return (int)n;
}

static int
opt_ctx(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	struct opts *p = o;
	int r = parse_list_u32(arg, p->ctx, 8);

	if (r <= 0) {
		fprintf(stderr, "gpu-decode: bad list '%s' for --ctx\n", arg);
		return -EINVAL;
	}
	p->n_ctx = (unsigned)r;
	return 0;
}

static int
opt_hbm(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	struct opts *p = o;
	int r = parse_list_f(arg, p->hbm, 8);

	if (r <= 0) {
		fprintf(stderr, "gpu-decode: bad list '%s' for --hbm\n", arg);
		return -EINVAL;
	}
	p->n_hbm = (unsigned)r;
	return 0;
}

#define OFF(m)	  offsetof(struct opts, m)
#define SHAPE_MAX (1u << 20)

static const struct kvt_cli_opt gd_opts[] = {
    {"layers", 0, "N", "model shape: layers (default 32; the defaults are an 8B Llama)",
     .apply = kvt_cli_u32, .off = OFF(layers), .min = 1, .max = SHAPE_MAX},
    {"q-heads", 0, "N", "query heads (default 32)", .apply = kvt_cli_u32, .off = OFF(q_heads),
     .min = 1, .max = SHAPE_MAX},
    {"kv-heads", 0, "N", "KV heads (default 8)", .apply = kvt_cli_u32, .off = OFF(kv_heads),
     .min = 1, .max = SHAPE_MAX},
    {"head-dim", 0, "N", "head dimension (default 128)", .apply = kvt_cli_u32, .off = OFF(head_dim),
     .min = 1, .max = SHAPE_MAX},
    {"hidden", 0, "N", "hidden size (default 4096)", .apply = kvt_cli_u32, .off = OFF(hidden),
     .min = 1, .max = SHAPE_MAX},
    {"ffn", 0, "N", "FFN size (default 14336)", .apply = kvt_cli_u32, .off = OFF(ffn), .min = 1,
     .max = SHAPE_MAX},
    {"ctx", 0, "LIST", "contexts, e.g. 8K,32K,128K (default)", .apply = opt_ctx},
    {"hbm", 0, "LIST", "shares of rows in HBM (T0), default 0.3,0.5,0.7", .apply = opt_hbm},
    {"t2", 0, "F", "share of rows kept int8 in the pool (T2), default 0", .apply = kvt_cli_float,
     .off = OFF(t2_frac), .max = 1},
    {"steps", 0, "N", "timed decode steps per point (default 20)", .apply = kvt_cli_u32,
     .off = OFF(steps), .min = 1, .max = SHAPE_MAX},
    {"warmup", 0, "N", "untimed steps before them (default 3)", .apply = kvt_cli_u32,
     .off = OFF(warmup), .max = SHAPE_MAX},
    {"socket", 0, "PATH", "use this kvtierd (CUDA backend); default: start one",
     .apply = kvt_cli_str, .off = OFF(socket)},
    {"no-kvtier", 0, NULL, "all-in-HBM and the bound only", .apply = kvt_cli_flag,
     .off = OFF(no_kvtier)},
    {"check", 0, NULL,
     "compare attention and GEMV with a CPU reference and kvtier's\nstaged attention with the "
     "all-in-HBM one; exit 1 if they differ",
     .apply = kvt_cli_flag, .off = OFF(check)},
    {"help", 'h', NULL, "this text", .apply = kvt_cli_help},
    {NULL},
};

static const struct kvt_cli gd_cli = {
    .prog = "gpu-decode",
    .intro = "usage: kvtier-bench gpu-decode [options]\n",
    .opts = gd_opts,
};

int
main(int argc, char **argv)
{
	struct opts o = {.layers = 32,
			 .q_heads = 32,
			 .kv_heads = 8,
			 .head_dim = 128,
			 .hidden = 4096,
			 .ffn = 14336,
			 .ctx = {8192, 32768, 131072},
			 .n_ctx = 3,
			 .hbm = {0.3f, 0.5f, 0.7f},
			 .n_hbm = 3,
			 .steps = 20,
			 .warmup = 3};
	struct bench_daemon d = {0};
	struct kvt_client *c = NULL;
	struct model m;
	struct cudaDeviceProp prop;
	double bw, worst = 0;
	int r, bad = 0, first = 1;

	if (kvt_cli_parse(&gd_cli, argc, argv, &o, NULL) < 0) {
		fprintf(stderr, "Try 'kvtier-bench gpu-decode --help'.\n");
		return 2;
	}
	if (!o.layers || !o.kv_heads || !o.q_heads || o.q_heads % o.kv_heads ||
	    o.q_heads / o.kv_heads > KVTB_MAX_GROUP || !o.head_dim || o.head_dim % 4 ||
	    o.head_dim > KVTB_MAX_HD || !o.hidden || !o.ffn || !o.steps ||
	    !(o.t2_frac >= 0.f && o.t2_frac <= 1.f)) {
		fprintf(stderr,
			"gpu-decode: bad shape: q_heads a multiple of kv_heads (at most %d "
			"per kv head), head_dim a multiple of 4 up to %d, steps > 0, t2 in "
			"[0, 1]\n",
			KVTB_MAX_GROUP, KVTB_MAX_HD);
		return 2;
	}
	model_init(&m, &o);
	CK(cudaGetDeviceProperties(&prop, 0));
	bw = h2d_gbps();
	if (!o.no_kvtier) {
		uint64_t tok = (uint64_t)o.layers * 2 * m.row_elems * sizeof(f16), need = 0;
		struct kvt_opts co = {.size = sizeof(co), .arena_size = 64ull << 20};
		char pool[32];
		const char *args[] = {"--backend", "cuda", "--pool-size", pool, NULL};

		for (unsigned i = 0; i < o.n_ctx; i++)
			need = (uint64_t)o.ctx[i] * tok > need ? (uint64_t)o.ctx[i] * tok : need;
		/* The whole sequence lives in the pool; 2 MiB chunks, 10% and 64 MiB slack. */
		need = ((need + need / 10) >> 20) + 64;
		snprintf(pool, sizeof(pool), "%lluM", (unsigned long long)(need + (need & 1)));
		if (!o.socket) {
			r = bench_daemon_start(&d, args);
			if (r < 0) {
				fprintf(stderr, "gpu-decode: cannot start kvtierd: %s\n",
					strerror(-r));
				return 1;
			}
			own_daemon = &d;
			atexit(stop_own_daemon);
		}
		KV(kvt_connect(o.socket ? o.socket : d.sock, &co, &c));
	}
	printf("{\"bench\": \"gpu-decode\", \"device\": \"%s\", \"model\": {\"layers\": %u, "
	       "\"q_heads\": %u, \"kv_heads\": %u, \"head_dim\": %u, \"hidden\": %u, \"ffn\": %u, "
	       "\"dtype\": \"f16\"}, \"steps\": %u, \"h2d_gbps\": %.2f, \"rows\": [",
	       prop.name, o.layers, o.q_heads, o.kv_heads, o.head_dim, o.hidden, o.ffn, o.steps,
	       bw);
	for (unsigned ci = 0; ci < o.n_ctx; ci++) {
		struct hbm_kv h;
		double t_hbm;

		hbm_kv_init(&m, &h, o.ctx[ci]);
		if (o.check) {
			double ea = check_attention(&m, &h), eg = check_gemv(&m);

			fprintf(stderr, "gpu-decode: ctx %u: attention max |err| %.3g, GEMV %.3g\n",
				o.ctx[ci], ea, eg);
			worst = ea > worst ? ea : worst;
			bad |= !(ea <= 2e-2) || !(eg <= 2e-2 * sqrt((double)o.hidden));
		}
		t_hbm = time_steps(&m, &h, NULL);
		for (unsigned hi = 0; hi < o.n_hbm; hi++) {
			struct tiered t;
			double t_kv = 0, staged, t_xfer, t_bound;

			staged =
			    (double)(o.ctx[ci] - (uint32_t)ceil((double)o.hbm[hi] * o.ctx[ci])) *
			    o.layers * 2 * m.row_elems * sizeof(f16);
			t_xfer = staged / (bw * 1e9);
			t_bound = t_hbm > t_xfer ? t_hbm : t_xfer;
			if (!o.no_kvtier) {
				tiered_open(&m, &t, c, o.ctx[ci], o.hbm[hi], o.t2_frac);
				if (o.check) {
					double e = check_tiered(&m, &t, &h);

					fprintf(stderr,
						"gpu-decode: ctx %u hbm %.2f: staged attention vs "
						"HBM max |diff| %.3g\n",
						o.ctx[ci], o.hbm[hi], e);
					bad |= !(e <= 2e-2);
					/* A fresh pipeline for the timing. */
					t.layer_no = 0;
				}
				t_kv = time_steps(&m, NULL, &t);
				tiered_close(&t);
			}
			printf("%s\n  {\"ctx\": %u, \"hbm_frac\": %.2f, \"tok_s_hbm\": %.2f, "
			       "\"tok_s_kvtier\": %.2f, \"tok_s_bound\": %.2f, \"h2d_gbps\": %.2f, "
			       "\"step_ms_hbm\": %.3f, \"step_ms_kvtier\": %.3f, \"transfer_ms\": "
			       "%.3f, \"staged_bytes_per_step\": %.0f, \"kvtier_vs_bound\": %.3f, "
			       "\"kvtier_vs_hbm\": %.3f}",
			       first ? "" : ",", o.ctx[ci], o.hbm[hi], 1 / t_hbm,
			       t_kv > 0 ? 1 / t_kv : 0.0, 1 / t_bound, bw, t_hbm * 1e3, t_kv * 1e3,
			       t_xfer * 1e3, staged, t_kv > 0 ? t_kv / t_bound : 0.0,
			       t_kv > 0 ? t_hbm / t_kv : 0.0);
			first = 0;
			fflush(stdout);
		}
		hbm_kv_fini(&m, &h);
	}
	printf("\n]}\n");
	if (c)
		kvt_disconnect(c);
	stop_own_daemon();
	if (o.check)
		fprintf(stderr, "gpu-decode: check %s\n", bad ? "FAILED" : "passed");
	(void)worst;
	return bad ? 1 : 0;
}
