// SPDX-License-Identifier: MIT
// Final top-k (k <= 1024) in one thread block: a 4-pass 8-bit radix select on order-preserving
// u32 images of the scores finds the k-th largest key T, the block emits every score above T
// and fills with scores equal to T, then a bitonic sort in shared memory orders the k results
// by (score desc, index asc).
#include "kvt_kernels.h"
#include "kvt_kernels_int.cuh"

#define TK_THREADS 1024
#define TK_MAX	   1024

// Monotone map float -> u32: larger floats give larger images.
__device__ static inline uint32_t
ordered(float f)
{
	uint32_t u = __float_as_uint(f);

	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void
topk_kernel(const uint32_t *__restrict__ idx, const float *__restrict__ score, uint32_t n,
	    uint32_t k, uint32_t *ret_idx, float *ret_score)
{
	__shared__ uint32_t hist[256];
	__shared__ uint32_t prefix, mask, want, nout, neq;
	__shared__ float ss[TK_MAX];
	__shared__ uint32_t si[TK_MAX];

	if (!threadIdx.x) {
		prefix = 0;
		mask = 0;
		want = k; // rank (1-based, from the top) of T among keys matching the prefix
		nout = 0;
		neq = 0;
	}
	__syncthreads();
	for (int shift = 24; shift >= 0; shift -= 8) {
		for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x)
			hist[i] = 0;
		__syncthreads();
		for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
			uint32_t u = ordered(score[i]);

			if ((u & mask) == prefix)
				atomicAdd(&hist[(u >> shift) & 255], 1u);
		}
		__syncthreads();
		if (!threadIdx.x) {
			uint32_t cum = 0;

			for (int b = 255; b >= 0; b--) {
				if (cum + hist[b] >= want) {
					prefix |= (uint32_t)b << shift;
					mask |= 255u << shift;
					want -= cum;
					break;
				}
				cum += hist[b];
			}
		}
		__syncthreads();
	}
	// prefix is now T's image; want = how many keys equal to T are needed
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
		uint32_t u = ordered(score[i]);

		if (u > prefix) {
			uint32_t at = atomicAdd(&nout, 1u);

			ss[at] = score[i];
			si[at] = idx[i];
		} else if (u == prefix && atomicAdd(&neq, 1u) < want) {
			uint32_t at = atomicAdd(&nout, 1u);

			ss[at] = score[i];
			si[at] = idx[i];
		}
	}
	__syncthreads();
	// pad to a power of two with sentinels that sort last
	uint32_t m = 1;

	while (m < k)
		m <<= 1;
	for (uint32_t i = k + threadIdx.x; i < m; i += blockDim.x) {
		ss[i] = -INFINITY;
		si[i] = 0xffffffffu;
	}
	__syncthreads();
	for (uint32_t size = 2; size <= m; size <<= 1) {
		for (uint32_t stride = size >> 1; stride; stride >>= 1) {
			for (uint32_t i = threadIdx.x; i < m; i += blockDim.x) {
				uint32_t j = i ^ stride;

				if (j > i) {
					bool desc = (i & size) == 0;
					// "a before b": higher score, then lower index
					bool j_first =
					    ss[j] > ss[i] || (ss[j] == ss[i] && si[j] < si[i]);

					if (j_first == desc) {
						float tf = ss[i];
						uint32_t ti = si[i];

						ss[i] = ss[j];
						si[i] = si[j];
						ss[j] = tf;
						si[j] = ti;
					}
				}
			}
			__syncthreads();
		}
	}
	for (uint32_t i = threadIdx.x; i < k; i += blockDim.x) {
		ret_idx[i] = si[i];
		ret_score[i] = ss[i];
	}
}

extern "C" int
kvt_k_topk(const uint32_t *d_idx, const float *d_score, uint32_t n, uint32_t k, uint32_t *d_ret_idx,
	   float *d_ret_score, void *stream)
{
	if (!k || k > TK_MAX || k > n)
		return -EINVAL;
	topk_kernel<<<1, TK_THREADS, 0, (cudaStream_t)stream>>>(d_idx, d_score, n, k, d_ret_idx,
								d_ret_score);
	return kvt_k_launch_status();
}
