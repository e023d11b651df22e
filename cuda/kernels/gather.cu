// SPDX-License-Identifier: MIT
// UVA row gather (docs/retrieval.md 7, the UVA gather, generalised): one warp per output row reads
// the source row straight from pinned host memory in 16-byte units, so a batch of scattered
// rows is one launch instead of one memcpy per row. The int8 variants dequantise on the fly
// with the source row's f32 scale (the T2 tier), writing f16 or bf16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kvt_kernels.h"
#include "kvt_kernels_int.cuh"

__global__ void
gather_copy(const uint8_t *src, size_t sstride, const uint32_t *__restrict__ idx, uint32_t nrows,
	    uint8_t *dst, size_t dstride, uint32_t bytes)
{
	uint32_t r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;

	if (r >= nrows)
		return;
	{
		const uint4 *s = (const uint4 *)(src + (size_t)idx[r] * sstride);
		uint4 *d = (uint4 *)(dst + (size_t)r * dstride);

		for (uint32_t j = threadIdx.x % 32; j < bytes / 16; j += 32)
			d[j] = s[j];
	}
}

template <bool BF16>
__global__ void
gather_i8(const int8_t *src, size_t sstride, const float *scale, const uint32_t *__restrict__ idx,
	  uint32_t nrows, uint8_t *dst, size_t dstride, uint32_t elems)
{
	uint32_t r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;

	if (r >= nrows)
		return;
	{
		uint32_t row = idx[r];
		const uint2 *s = (const uint2 *)(src + (size_t)row * sstride); // 8 int8 per load
		float sc = scale[row];

		for (uint32_t j = threadIdx.x % 32; j < elems / 8; j += 32) {
			uint2 v = s[j];
			const int8_t *b = (const int8_t *)&v;

			if (BF16) {
				__nv_bfloat16 *d =
				    (__nv_bfloat16 *)(dst + (size_t)r * dstride) + 8 * j;

				for (int e = 0; e < 8; e++)
					d[e] = __float2bfloat16((float)b[e] * sc);
			} else {
				__half *d = (__half *)(dst + (size_t)r * dstride) + 8 * j;

				for (int e = 0; e < 8; e++)
					d[e] = __float2half((float)b[e] * sc);
			}
		}
	}
}

extern "C" int
kvt_k_gather(const void *h_src, size_t src_stride, const float *h_scale, const uint32_t *d_idx,
	     uint32_t nrows, void *d_dst, size_t dst_stride, uint32_t elems, enum kvt_k_row fmt,
	     void *stream)
{
	cudaStream_t s = (cudaStream_t)stream;
	uint32_t blocks = (nrows + 7) / 8; // 8 warps per block, one row each

	if (!nrows || !h_src || !d_dst || !d_idx)
		return -EINVAL;
	switch (fmt) {
	case KVT_K_ROW_COPY:
		if (elems % 16 || src_stride % 16 || dst_stride % 16 ||
		    ((uintptr_t)h_src | (uintptr_t)d_dst) % 16)
			return -EINVAL;
		gather_copy<<<blocks, 256, 0, s>>>((const uint8_t *)h_src, src_stride, d_idx, nrows,
						   (uint8_t *)d_dst, dst_stride, elems);
		break;
	case KVT_K_ROW_I8_TO_F16:
	case KVT_K_ROW_I8_TO_BF16:
		if (!h_scale || elems % 8 || src_stride % 8 || dst_stride % 16 ||
		    (uintptr_t)h_src % 8 || (uintptr_t)d_dst % 16)
			return -EINVAL;
		if (fmt == KVT_K_ROW_I8_TO_BF16)
			gather_i8<true><<<blocks, 256, 0, s>>>((const int8_t *)h_src, src_stride,
							       h_scale, d_idx, nrows,
							       (uint8_t *)d_dst, dst_stride, elems);
		else
			gather_i8<false><<<blocks, 256, 0, s>>>(
			    (const int8_t *)h_src, src_stride, h_scale, d_idx, nrows,
			    (uint8_t *)d_dst, dst_stride, elems);
		break;
	default:
		return -EINVAL;
	}
	return kvt_k_launch_status();
}
