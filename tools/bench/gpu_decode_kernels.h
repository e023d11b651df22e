/* SPDX-License-Identifier: MIT */
/*
 * gpu_decode_kernels.h - the device kernels of kvtier-bench gpu-decode (gpu_decode_kernels.cu),
 * shared by the benchmark (which launches them from an embedded fatbin) and the CUDA test shim
 * (which runs their host equivalents under the same names). C and CUDA both read it.
 *
 * Attention is split-K decode attention over two row sets of one layer, both laid out
 * [row][kv_head][head_dim] f16: the rows kept in HBM (T0 slots, @n0 of them) and the rows kvtier
 * staged for this step (@ns). Grid (kv_heads, nsplit), 128 threads: block (h, s) covers rows
 * [s * chunk, (s + 1) * chunk) of the n0 + ns, for the @group query heads of kv head h, and writes
 * per query head and split a partial (max, sum, acc[head_dim]) in f32; the combine kernel (grid
 * q_heads, head_dim threads) merges the splits into out[q_head][head_dim] f16.
 */
#ifndef KVTB_GPU_DECODE_KERNELS_H
#define KVTB_GPU_DECODE_KERNELS_H

#include <stdint.h>

#define KVTB_ATTN_PARTIAL "kvtb_attn_partial"
#define KVTB_ATTN_COMBINE "kvtb_attn_combine"
#define KVTB_SILU_MUL	  "kvtb_silu_mul"
#define KVTB_MAX_GROUP	  8   /* query heads per kv head */
#define KVTB_MAX_HD	  128 /* head_dim, a multiple of 4 */
#define KVTB_ATTN_THREADS 128

/* Bytes of partials: per query head and split, head_dim + 2 floats. */
#define KVTB_PART_FLOATS(q_heads, nsplit, hd) ((uint64_t)(q_heads) * (nsplit) * ((hd) + 2))

/*
 * Kernel arguments, in order (the void *args[] of cudaLaunchKernel):
 * kvtb_attn_partial(const f16 *q, const f16 *k0, const f16 *v0, uint32_t n0, const f16 *ks,
 *                   const f16 *vs, uint32_t ns, uint32_t kv_heads, uint32_t group, uint32_t hd,
 *                   float scale, uint32_t chunk, float *part)
 *   q: [kv_heads * group][hd]; part: KVTB_PART_FLOATS(kv_heads * group, gridDim.y, hd),
 *   [q_head][split][m, s, acc[hd]].
 * kvtb_attn_combine(const float *part, uint32_t nsplit, uint32_t hd, f16 *out)
 *   out: [q_heads][hd], q_heads = gridDim.x.
 * kvtb_silu_mul(const f16 *gate_up, uint32_t n, f16 *out)
 *   out[i] = silu(gate_up[i]) * gate_up[n + i], i < n.
 */

/* The fatbin holding them, generated at build time and loaded with cudaLibraryLoadData(). */
extern const unsigned char kvtb_gpu_decode_fatbin[];
extern const unsigned long kvtb_gpu_decode_fatbin_size;

#endif
