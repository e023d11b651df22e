/* SPDX-License-Identifier: MIT */
/*
 * rows.cu - the device layer's batch copy: one launch moves a whole batch of rows, each thread
 * block copying rows (grid-stride over the batch), 16 bytes per thread and step when the row
 * is 16-byte aligned on both sides, else byte by byte. Sources and destinations are device
 * memory or pinned host memory read and written through UVA, so a batch of scattered pool rows
 * crosses PCIe in one kernel instead of one DMA per row. Built into a fatbin and embedded
 * (rows_fatbin.c); dev_cuda.c loads it with cudaLibraryLoadData().
 */
#include "rows.h"

extern "C" __global__ void __launch_bounds__(256)
    kvt_rows_copy(const struct kvt_row_desc *d, unsigned n)
{
	for (unsigned r = blockIdx.x; r < n; r += gridDim.x) {
		const struct kvt_row_desc row = d[r];
		const unsigned char *s = (const unsigned char *)row.src;
		unsigned char *t = (unsigned char *)row.dst;

		if (((row.src | row.dst | row.len) & 15) == 0) {
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
