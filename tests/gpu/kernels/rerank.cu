// SPDX-License-Identifier: MIT
// RSQ-IP rerank (docs/retrieval.md 4): one thread per candidate. Each thread reads its key's
// codes (4 bytes per block, dim j of the block in bits [4j, 4j+4)) and weights; the rotated
// query sits in shared memory and the 8 Lloyd-Max levels in constant memory. f32 throughout
// (the reference accumulates in bf16).
#include "kvt_kernels.h"
#include "kvt_kernels_int.cuh"

// Same f32 values as kvt_paris_level[] in engine/paris.c.
__constant__ float c_level[8] = {
    0.04192810f, 0.12649122f, 0.21279074f, 0.30235165f,
    0.39704504f, 0.49985211f, 0.61673919f, 0.76325565f,
};

__global__ void
rerank_kernel(const uint8_t *__restrict__ code, const float *__restrict__ w, uint32_t nblk,
	      const uint32_t *__restrict__ cand, uint32_t nc, const float *__restrict__ qy,
	      float qnorm, float *__restrict__ score)
{
	__shared__ float sq[128];
	uint32_t k = blockIdx.x * blockDim.x + threadIdx.x;

	for (uint32_t i = threadIdx.x; i < nblk * 8; i += blockDim.x)
		sq[i] = qy[i];
	__syncthreads();
	if (k >= nc)
		return;
	{
		uint32_t i = cand[k];
		const uint32_t *cw = (const uint32_t *)(code + (size_t)i * 4 * nblk);
		const float *wk = w + (size_t)i * nblk;
		float s = 0.0f;

		for (uint32_t b = 0; b < nblk; b++) {
			uint32_t word = __ldg(cw + b);
			float acc = 0.0f;

#pragma unroll
			for (int j = 0; j < 8; j++) {
				uint32_t nib = (word >> (4 * j)) & 15;
				float v = c_level[nib & 7] * sq[8 * b + j];

				acc += (nib & 8) ? v : -v;
			}
			s += __ldg(wk + b) * acc;
		}
		score[k] = qnorm * s;
	}
}

extern "C" int
kvt_k_rerank(const uint8_t *d_code, const float *d_w, uint32_t nblk, const uint32_t *d_cand,
	     uint32_t nc, const float *d_qy, float qnorm, float *d_score, void *stream)
{
	if ((nblk != 8 && nblk != 16) || !nc)
		return -EINVAL;
	rerank_kernel<<<(nc + 127) / 128, 128, 0, (cudaStream_t)stream>>>(d_code, d_w, nblk, d_cand,
									  nc, d_qy, qnorm, d_score);
	return kvt_k_launch_status();
}
