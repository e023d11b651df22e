/* SPDX-License-Identifier: MIT */
/*
 * quant.h - int8 rows for the T2 tier, and the row gather used by FETCH and promotions.
 *
 * A row is one (token, layer, K or V): @heads * @head_dim elements of the sequence dtype
 * (KVT_DTYPE_F16, _BF16 or _F32, see proto/kvt_abi.h).
 *
 * Two encodings, both symmetric int8 with codes in [-127, 127] and f32 scales:
 *   - per head [default, paper-like]: one scale per (row, head), i.e. per (token, layer, K|V,
 *     head); scale = max|x| / 127 over the head's @head_dim elements.
 *   - per channel, for keys (KIVI-style, keys have outlier channels): one scale per element
 *     index c of the row, shared by a block of rows; scale[c] = max over the block of |x[r][c]|
 *     / 127. The block is the set of rows passed in one call; the daemon quantizes keys in blocks
 *     of KVT_QUANT_KEY_BLOCK tokens of the same (layer, K), taken in position order from one
 *     RETIER's T1->T2 list (the last block of a list may be shorter). Values stay per head.
 *
 * Code: q = rint(x * (127 / amax)) in f32 with the default round-to-nearest-even mode;
 * dequantized value: (float)q * scale, rounded to nearest-even into the row dtype.
 * Special cases, identical on every SIMD level:
 *   - amax < 2^-100 (zero or denormal-sized group): scale 0, codes 0 (dequantizes to +0).
 *   - a group holding Inf or NaN: scale NaN (0x7fc00000), codes 0, so the damage stays visible
 *     (the whole group dequantizes to NaN) instead of being silently clamped.
 *
 * Exactness: the scalar and the AVX2 variants perform the same IEEE operations per element, so
 * codes, scales and dequantized rows are bit-identical across kvt_simd_level() values (tested).
 * The AVX2 variant of the f16 paths also needs F16C, which every AVX2 CPU has and kvt_simd's
 * AVX2 level includes. There is no AVX-512 variant: at KVT_SIMD_AVX512 the AVX2 code runs.
 *
 * All functions are pure (no allocation, no locks, no I/O) and thread-safe as long as concurrent
 * calls do not write the same buffers. Buffers may be unaligned; they must not overlap.
 */
#ifndef KVT_ENGINE_QUANT_H
#define KVT_ENGINE_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "half.h" /* the scalar conversions, part of this interface */

enum kvt_qmode {
	KVT_QUANT_HEAD = 0,    /* one scale per (row, head) [default] */
	KVT_QUANT_CHANNEL = 1, /* keys: one scale per channel per block of rows */
};

/* Tokens per per-channel key block (KIVI uses groups of 32 to 128 tokens). */
#define KVT_QUANT_KEY_BLOCK 32

/* Groups whose max |x| is below this are stored as zero. */
#define KVT_QUANT_TINY 0x1p-100f

/*
 * kvt_quant_rows - quantize @nrows rows, one scale per (row, head).
 * @dtype:	KVT_DTYPE_* of the source rows.
 * @heads:	heads per row, >= 1.
 * @head_dim:	elements per head, >= 1.
 * @src:	first source row.
 * @src_stride:	bytes between source rows (>= row bytes).
 * @nrows:	rows to quantize (0 is a no-op).
 * @codes:	output, @nrows * @heads * @head_dim int8, rows contiguous.
 * @scales:	output, @nrows * @heads f32, rows contiguous.
 * Return: 0, or -EINVAL (bad dtype, zero heads/head_dim, NULL buffer with nrows > 0, stride
 * smaller than a row).
 */
int kvt_quant_rows(int dtype, uint32_t heads, uint32_t head_dim, const void *src, size_t src_stride,
		   size_t nrows, int8_t *codes, float *scales);

/*
 * kvt_dequant_rows - inverse of kvt_quant_rows(), into rows of @dtype.
 * @codes, @scales: as written by kvt_quant_rows() for @nrows rows.
 * @dst:	first destination row.
 * @dst_stride:	bytes between destination rows (>= row bytes).
 * Return: 0, or -EINVAL as kvt_quant_rows().
 */
int kvt_dequant_rows(int dtype, uint32_t heads, uint32_t head_dim, const int8_t *codes,
		     const float *scales, size_t nrows, void *dst, size_t dst_stride);

/*
 * kvt_quant_block_ch - quantize a block of @nrows rows with one scale per channel.
 * @elems:	elements per row (heads * head_dim), >= 1.
 * @src, @src_stride, @nrows: as kvt_quant_rows(); @nrows is the block (see header comment).
 * @codes:	output, @nrows * @elems int8, rows contiguous.
 * @scales:	output, @elems f32 (one per channel, for the whole block).
 * Return: 0, or -EINVAL as kvt_quant_rows().
 */
int kvt_quant_block_ch(int dtype, uint32_t elems, const void *src, size_t src_stride, size_t nrows,
		       int8_t *codes, float *scales);

/*
 * kvt_dequant_block_ch - inverse of kvt_quant_block_ch(), into rows of @dtype.
 * Return: 0, or -EINVAL as kvt_quant_rows().
 */
int kvt_dequant_block_ch(int dtype, uint32_t elems, const int8_t *codes, const float *scales,
			 size_t nrows, void *dst, size_t dst_stride);

/*
 * kvt_gather_rows - copy rows @base + @idx[i] * @stride (i < @n) to @dst + i * @row_bytes.
 * Used to stage T1 rows (FETCH) and to batch promotions. Runs of consecutive indices are copied
 * as one block when @stride == @row_bytes; 256-byte rows (e.g. 128 f16 elements) take an AVX2
 * path with software prefetch of rows a few indices ahead, for any stride, and streaming
 * (non-temporal) stores when the output is 1 MiB or more and @dst is 32-byte aligned (the
 * gathered rows then are not left in the cache). Indices are not bounds-checked: the
 * caller (the daemon, after validating the positions) guarantees every row lies in its buffer.
 * Return: 0, or -EINVAL (NULL buffer with n > 0, row_bytes 0, stride < row_bytes).
 */
int kvt_gather_rows(void *dst, const void *base, size_t stride, const uint32_t *idx, size_t n,
		    size_t row_bytes);

/*
 * kvt_to_f32 - widen @n elements of @dtype at @src to f32 at @dst: exact, the same values as
 * the scalar conversions of half.h (NaNs come out quiet), with F16C/AVX2 when the CPU has them.
 * Return: 0, or -EINVAL (bad dtype, NULL buffer with n > 0).
 */
int kvt_to_f32(int dtype, const void *src, size_t n, float *dst);

#endif /* KVT_ENGINE_QUANT_H */
