/* SPDX-License-Identifier: MIT */
/*
 * check_gpu_retrieval - the kernels of tests/gpu/kernels/ (kvt_kernels.h) against the CPU engine on
 * a real GPU: collision votes equal the definition (cnt_i = sum_b tab[b][cid_b,i]) and the
 * candidate list equals kvt_paris_select() exactly, over random inputs with many ties; RSQ-IP
 * rerank scores of a real index equal kvt_paris_rerank() to float rounding; top-k equals
 * kvt_paris_topk_select() (scores exactly, indices too where the k-th score is not tied).
 * Row gathers and int8 dequantization are the device layer's row kernel (dev/rows.cu), checked
 * through the daemon by check_gpu_daemon. Exits 77 without a device.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_kernels.h"
#include "paris.h"
#include "quant.h"
#include "srht.h"

#define CK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
				cudaGetErrorName(e_));                                             \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static uint64_t rng = 88172645463325252ull;

static uint32_t
rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}

static int
one_case(uint32_t n, uint32_t nblk, uint32_t c)
{
	size_t stride = n + (rnd() % 64);
	uint8_t *cid = malloc(nblk * stride), tab[16][256], *votes = malloc(n), *gv = malloc(n);
	uint32_t *cand = malloc(c * 4), *gc = malloc(c * 4), m;
	uint8_t *d_cid, *d_tab, *d_votes;
	uint32_t *d_cand;
	void *d_work;
	int bad = 0;

	for (size_t i = 0; i < nblk * stride; i++)
		cid[i] = (uint8_t)rnd();
	for (uint32_t b = 0; b < nblk; b++)
		for (int j = 0; j < 256; j++)
			tab[b][j] =
			    (uint8_t)(rnd() % 7 < 2 ? rnd() % 7 : 0); /* sparse: many ties */
	for (uint32_t i = 0; i < n; i++) {
		unsigned s = 0;

		for (uint32_t b = 0; b < nblk; b++)
			s += tab[b][cid[b * stride + i]];
		votes[i] = (uint8_t)s;
	}
	m = kvt_paris_select(votes, n, c, NULL, cand);
	CK(cudaMalloc((void **)&d_cid, nblk * stride));
	CK(cudaMalloc((void **)&d_tab, nblk * 256));
	CK(cudaMalloc((void **)&d_votes, n));
	CK(cudaMalloc((void **)&d_cand, c * 4));
	CK(cudaMalloc(&d_work, kvt_k_select_work_bytes(n)));
	CK(cudaMemcpy(d_cid, cid, nblk * stride, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(d_tab, tab, nblk * 256, cudaMemcpyHostToDevice));
	if (kvt_k_votes(d_cid, n, stride, nblk, d_tab, d_votes, NULL) ||
	    kvt_k_select(d_votes, n, c, d_work, d_cand, NULL)) {
		fprintf(stderr, "launch failed: %s\n", cudaGetErrorName(cudaGetLastError()));
		exit(1);
	}
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(gv, d_votes, n, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(gc, d_cand, c * 4, cudaMemcpyDeviceToHost));
	if (memcmp(gv, votes, n)) {
		fprintf(stderr, "votes differ (n %u, blocks %u)\n", n, nblk);
		bad = 1;
	} else if (m != c || memcmp(gc, cand, c * 4)) {
		fprintf(stderr, "candidates differ (n %u, blocks %u, c %u, cpu %u)\n", n, nblk, c,
			m);
		bad = 1;
	}
	cudaFree(d_cid);
	cudaFree(d_tab);
	cudaFree(d_votes);
	cudaFree(d_cand);
	cudaFree(d_work);
	free(cid);
	free(votes);
	free(gv);
	free(cand);
	free(gc);
	return bad;
}

/* uniform in [-1, 1) */
static float
frnd(void)
{
	return (float)rnd() / 2147483648.0f - 1.0f;
}

/* RSQ-IP scores of @nc candidates of a real @n-key index, GPU against kvt_paris_rerank(). */
static int
rerank_case(uint32_t n, unsigned int dim, uint32_t nc)
{
	uint32_t nblk = dim / 8, *cand = malloc(nc * 4), *d_cand;
	float *keys = malloc((size_t)n * dim * 4), q[128], *cpu = malloc(nc * 4),
	      *gpu = malloc(nc * 4), *w = malloc((size_t)n * nblk * 4), *d_w, *d_qy, *d_score;
	uint8_t *code = malloc((size_t)n * 4 * nblk), *d_code;
	struct kvt_paris_index ix;
	struct kvt_paris_query pq;
	struct kvt_srht srht;
	int bad = 0;

	for (size_t i = 0; i < (size_t)n * dim; i++)
		keys[i] = frnd() * (i % dim == 3 ? 8.0f : 1.0f); /* one outlier channel */
	for (unsigned int j = 0; j < dim; j++)
		q[j] = frnd();
	if (kvt_srht_init(&srht, dim, KVT_SRHT_SEED) || kvt_paris_index_init(&ix, dim, 0, NULL) ||
	    kvt_paris_index_reserve(&ix, n) < (int)n ||
	    kvt_paris_index_append(&ix, &srht, keys, dim, n) != (int)n) {
		fprintf(stderr, "rerank: index build failed\n");
		exit(1);
	}
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *cid, *c;
		const float *wi;

		kvt_paris_key_codes(&ix, i, &cid, &c, &wi);
		memcpy(code + (size_t)i * 4 * nblk, c, 4 * nblk);
		memcpy(w + (size_t)i * nblk, wi, nblk * 4);
	}
	for (uint32_t i = 0; i < nc; i++)
		cand[i] = rnd() % n;
	kvt_paris_query_prep(&srht, q, &pq);
	kvt_paris_rerank(&ix, &pq, cand, nc, cpu);
	CK(cudaMalloc((void **)&d_code, (size_t)n * 4 * nblk));
	CK(cudaMalloc((void **)&d_w, (size_t)n * nblk * 4));
	CK(cudaMalloc((void **)&d_cand, nc * 4));
	CK(cudaMalloc((void **)&d_qy, dim * 4));
	CK(cudaMalloc((void **)&d_score, nc * 4));
	CK(cudaMemcpy(d_code, code, (size_t)n * 4 * nblk, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(d_w, w, (size_t)n * nblk * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(d_cand, cand, nc * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(d_qy, pq.y, dim * 4, cudaMemcpyHostToDevice));
	if (kvt_k_rerank(d_code, d_w, nblk, d_cand, nc, d_qy, pq.norm, d_score, NULL)) {
		fprintf(stderr, "rerank launch failed: %s\n", cudaGetErrorName(cudaGetLastError()));
		exit(1);
	}
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(gpu, d_score, nc * 4, cudaMemcpyDeviceToHost));
	for (uint32_t i = 0; i < nc && !bad; i++)
		if (!(fabsf(gpu[i] - cpu[i]) <= 1e-4f * (1.0f + fabsf(cpu[i])))) {
			fprintf(stderr,
				"rerank differs (n %u, dim %u): cand %u key %u gpu %.7g cpu %.7g\n",
				n, dim, i, cand[i], gpu[i], cpu[i]);
			bad = 1;
		}
	cudaFree(d_code);
	cudaFree(d_w);
	cudaFree(d_cand);
	cudaFree(d_qy);
	cudaFree(d_score);
	kvt_paris_index_fini(&ix);
	free(keys);
	free(cand);
	free(cpu);
	free(gpu);
	free(w);
	free(code);
	return bad;
}

/* Top-k of @n scores (@levels > 0: only that many distinct values, so many ties). */
static int
topk_case(uint32_t n, uint32_t k, uint32_t levels)
{
	uint32_t *idx = malloc(n * 4), *ci = malloc(k * 4), *gi = malloc(k * 4), *d_idx, *d_ri;
	float *sc = malloc(n * 4), *cs = malloc(k * 4), *gs = malloc(k * 4), *d_sc, *d_rs;
	int bad = 0;

	for (uint32_t i = 0; i < n; i++) {
		idx[i] = rnd() % (4 * n); /* carried along, not the position */
		sc[i] = levels ? (float)(rnd() % levels) : frnd() + (float)i * 1e-6f;
	}
	kvt_paris_topk_select(idx, sc, n, k, ci, cs);
	CK(cudaMalloc((void **)&d_idx, n * 4));
	CK(cudaMalloc((void **)&d_sc, n * 4));
	CK(cudaMalloc((void **)&d_ri, k * 4));
	CK(cudaMalloc((void **)&d_rs, k * 4));
	CK(cudaMemcpy(d_idx, idx, n * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(d_sc, sc, n * 4, cudaMemcpyHostToDevice));
	if (kvt_k_topk(d_idx, d_sc, n, k, d_ri, d_rs, NULL)) {
		fprintf(stderr, "topk launch failed: %s\n", cudaGetErrorName(cudaGetLastError()));
		exit(1);
	}
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(gi, d_ri, k * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(gs, d_rs, k * 4, cudaMemcpyDeviceToHost));
	for (uint32_t j = 0; j < k && !bad; j++) {
		/* which of the entries tied with the k-th are kept is the kernel's choice */
		int tied = cs[j] == cs[k - 1];

		if (gs[j] != cs[j] || (!tied && gi[j] != ci[j]) ||
		    (j && gs[j] == gs[j - 1] && gi[j] <= gi[j - 1])) {
			fprintf(stderr,
				"topk differs (n %u, k %u, levels %u) at %u: gpu %u/%g cpu %u/%g\n",
				n, k, levels, j, gi[j], gs[j], ci[j], cs[j]);
			bad = 1;
		}
	}
	cudaFree(d_idx);
	cudaFree(d_sc);
	cudaFree(d_ri);
	cudaFree(d_rs);
	free(idx);
	free(ci);
	free(gi);
	free(sc);
	free(cs);
	free(gs);
	return bad;
}

int
main(void)
{
	static const uint32_t ns[] = {2, 17, 1000, 4096, 65537, 1u << 20};
	int n = 0, bad = 0, cases = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("check_gpu_retrieval: no CUDA device\n");
		return 77;
	}
	for (unsigned i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
		for (uint32_t nblk = 8; nblk <= 16; nblk += 8)
			for (int k = 0; k < 3; k++) {
				uint32_t c = k == 0 ? 1 : k == 1 ? ns[i] / 2 : ns[i] - 1;

				if (c < 1 || c >= ns[i])
					continue;
				bad |= one_case(ns[i], nblk, c);
				cases++;
			}
	for (unsigned int dim = 64; dim <= 128; dim += 64) {
		bad |= rerank_case(1000, dim, 1);
		bad |= rerank_case(20000, dim, 3277);
		cases += 2;
	}
	bad |= topk_case(3277, 100, 0);
	bad |= topk_case(100000, 1024, 0);
	bad |= topk_case(1024, 1024, 0);
	bad |= topk_case(50000, 200, 7); /* heavy ties */
	bad |= topk_case(1, 1, 0);
	cases += 5;
	printf("check_gpu_retrieval: %d cases, %s\n", cases,
	       bad ? "FAILED" : "votes, candidates, rerank scores and top-k equal the CPU engine");
	return bad;
}
