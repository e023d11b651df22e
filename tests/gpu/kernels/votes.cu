// SPDX-License-Identifier: MIT
// Collision votes (docs/retrieval.md 3.4): one thread per key, the [B][256] vote table in shared
// memory. Ids are read as one byte per block; consecutive threads read consecutive bytes of a
// block row, so loads coalesce.
#include "kvt_kernels.h"
#include "kvt_kernels_int.cuh"

__global__ void
votes_kernel(const uint8_t *__restrict__ cid, uint32_t n, size_t stride, uint32_t nblk,
	     const uint8_t *__restrict__ tab, uint8_t *__restrict__ votes)
{
	__shared__ uint8_t st[16 * 256];

	for (uint32_t i = threadIdx.x; i < nblk * 256; i += blockDim.x)
		st[i] = tab[i];
	__syncthreads();
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += gridDim.x * blockDim.x) {
		uint32_t v = 0;

		for (uint32_t b = 0; b < nblk; b++)
			v += st[b * 256 + cid[b * stride + i]];
		votes[i] = (uint8_t)v;
	}
}

extern "C" int
kvt_k_votes(const uint8_t *d_cid, uint32_t n, size_t cid_stride, uint32_t nblk,
	    const uint8_t *d_tab, uint8_t *d_votes, void *stream)
{
	uint32_t blocks;

	if ((nblk != 8 && nblk != 16) || cid_stride < n || !n)
		return -EINVAL;
	blocks = (n + 255) / 256;
	if (blocks > 4096)
		blocks = 4096;
	votes_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(d_cid, n, cid_stride, nblk, d_tab,
							       d_votes);
	return kvt_k_launch_status();
}
