/* SPDX-License-Identifier: MIT */
/*
 * check_gpu_retrieval - the retrieval kernels of cuda/kernels/ (kvt_kernels.h) against the CPU
 * engine on a real GPU: collision votes equal the definition (cnt_i = sum_b tab[b][cid_b,i]) and
 * the candidate list equals kvt_paris_select() exactly, over random inputs with many ties.
 * Built when cuda/kernels/ and daemon/engine/paris.h are in the tree. Exits 77 without a device.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_kernels.h"
#include "paris.h"

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
	printf("check_gpu_retrieval: %d cases, %s\n", cases,
	       bad ? "FAILED"
		   : "votes and "
		     "candidates equal the CPU engine");
	return bad;
}
