/* SPDX-License-Identifier: MIT */
/*
 * rows.h - private to dev/: the row-copy kernel's descriptor, shared by rows.cu (the kernel),
 * dev_cuda.c (which fills descriptors in pinned host memory the kernel reads through UVA) and
 * the test shim (which runs the kernel's effect on the host). C and CUDA both read it.
 */
#ifndef KVT_ROWS_H
#define KVT_ROWS_H

#include <stdint.h>

/* Name of the kernel inside the embedded fatbin (extern "C", so unmangled). */
#define KVT_ROWS_KERNEL "kvt_rows_copy"

/*
 * One row: @len bytes from @src to @dst, both addresses the device can use (device memory, or
 * pinned host memory mapped through UVA). With @scale non-zero the row is int8 and dequantized
 * on the way: @len int8 elements at @src, element e written to @dst as @out (KVT_ROW_OUT_*) of
 * code * scale[e / group], @scale the device address of the f32 scales.
 */
struct kvt_row_desc {
	uint64_t src;
	uint64_t dst;
	uint64_t len;
	uint64_t scale;
	uint32_t group;
	uint32_t out;
};

enum { KVT_ROW_OUT_F16 = 0, KVT_ROW_OUT_BF16 = 1 };

/* The fatbin holding kvt_rows_copy(const struct kvt_row_desc *d, unsigned n), generated from
 * rows.cu at build time (rows_fatbin.c), loaded with cudaLibraryLoadData(). */
extern const unsigned char kvt_rows_fatbin[];
extern const unsigned long kvt_rows_fatbin_size;

#endif /* KVT_ROWS_H */
