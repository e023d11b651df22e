/* SPDX-License-Identifier: MIT */
/*
 * rows.cu - the device layer's batch copy: one launch moves a whole batch of rows, each thread
 * block copying rows (grid-stride over the batch), 16 bytes per thread and step when the row
 * is 16-byte aligned on both sides, else byte by byte. Sources and destinations are device
 * memory or pinned host memory read and written through UVA, so a batch of scattered pool rows
 * crosses PCIe in one kernel instead of one DMA per row. An int8 row (T2) crosses as int8 and is
 * dequantized here, 8 elements per thread and step (one 8-byte load), so it moves half the bytes
 * of its f16 form. Built into a fatbin and embedded (rows_fatbin.c); dev_cuda.c loads it with
 * cudaLibraryLoadData().
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "rows.h"

__device__ static inline void
put(unsigned char *t, uint64_t e, float x, uint32_t out)
{
	if (out == KVT_ROW_OUT_BF16)
		((__nv_bfloat16 *)t)[e] = __float2bfloat16(x);
	else
		((__half *)t)[e] = __float2half(x);
}

__device__ static void
dequant_row(const struct kvt_row_desc &row)
{
	const signed char *s = (const signed char *)row.src;
	const float *sc = (const float *)row.scale;
	unsigned char *t = (unsigned char *)row.dst;

	if (((row.src | row.len) & 7) == 0 && row.group % 8 == 0) {
		/* 8 codes per load, all under one scale (a group is a multiple of 8). */
		for (uint64_t i = threadIdx.x; i < row.len / 8; i += blockDim.x) {
			uint2 v = ((const uint2 *)s)[i];
			const signed char *b = (const signed char *)&v;
			float f = sc[i * 8 / row.group];

			for (int j = 0; j < 8; j++)
				put(t, i * 8 + j, (float)b[j] * f, row.out);
		}
	} else {
		for (uint64_t e = threadIdx.x; e < row.len; e += blockDim.x)
			put(t, e, (float)s[e] * sc[e / row.group], row.out);
	}
}

extern "C" __global__ void __launch_bounds__(256)
    kvt_rows_copy(const struct kvt_row_desc *d, unsigned n)
{
	for (unsigned r = blockIdx.x; r < n; r += gridDim.x) {
		const struct kvt_row_desc row = d[r];
		const unsigned char *s = (const unsigned char *)row.src;
		unsigned char *t = (unsigned char *)row.dst;

		if (row.scale) {
			dequant_row(row);
		} else if (((row.src | row.dst | row.len) & 15) == 0) {
			const uint4 *s4 = (const uint4 *)s;
			uint4 *t4 = (uint4 *)t;

			for (uint64_t i = threadIdx.x; i < row.len / 16; i += blockDim.x)
				t4[i] = s4[i];
		} else {
			for (uint64_t i = threadIdx.x; i < row.len; i += blockDim.x)
				t[i] = s[i];
		}
	}
}
