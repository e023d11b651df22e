/* SPDX-License-Identifier: MIT */
/*
 * llm_quant.h - ggml weight formats: dequantization and quantized matrix-vector products.
 *
 * Supported weight types: F32, F16, Q4_0, Q4_1, Q8_0 (SmolLM2-135M-Instruct.Q4_1.gguf uses F32
 * norms, Q4_1 projections and a Q8_0 token embedding). Blocks as ggml lays them out:
 *   Q4_0: { f16 d; u8 qs[16]; }          x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4)
 * - 8) Q4_1: { f16 d; f16 m; u8 qs[16]; }   x[j] = d * (qs[j] & 15) + m,   x[j+16] = d * (qs[j] >>
 * 4) + m Q8_0: { f16 d; i8 qs[32]; }          x[j] = d * qs[j]
 *
 * Products dequantize each 32-element block on the fly and accumulate in f32; the activation is
 * never quantized. The AVX2 variants (selected at run time through kvt_simd_level()) sum in a
 * different order than the scalar ones, so results agree to rounding, not bit for bit; within one
 * level a row's dot product is computed by one thread in a fixed order, so outputs do not depend
 * on the thread count.
 */
#ifndef KVT_LLM_QUANT_H
#define KVT_LLM_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QK 32 /* elements per block of the 32-element formats */

struct block_q4_0 {
	uint16_t d;
	uint8_t qs[QK / 2];
};
_Static_assert(sizeof(struct block_q4_0) == 18, "block_q4_0 layout");

struct block_q4_1 {
	uint16_t d;
	uint16_t m;
	uint8_t qs[QK / 2];
};
_Static_assert(sizeof(struct block_q4_1) == 20, "block_q4_1 layout");

struct block_q8_0 {
	uint16_t d;
	int8_t qs[QK];
};
_Static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 layout");

/* IEEE half <-> single, exact for every half (subnormals, inf, NaN); rounding to nearest even. */
float llm_f16_to_f32(uint16_t h);
uint16_t llm_f32_to_f16(float f);

/* True when llm_dequant_row() and llm_matvec() handle @type. */
bool llm_type_supported(uint32_t type);

/* Bytes of one row of @n elements of @type (n a multiple of the block size). */
size_t llm_row_bytes(uint32_t type, size_t n);

/* Dequantizes @n elements (a multiple of the block size) of @type at @src into @dst. Scalar. */
void llm_dequant_row(uint32_t type, const void *src, float *dst, size_t n);

/*
 * A row-major weight matrix: @rows rows of @cols elements of @type, @row_bytes apart. Rows are
 * the outputs, so y = W x has @rows elements.
 */
struct llm_mat {
	uint32_t type;
	uint32_t rows;
	uint32_t cols;
	size_t row_bytes;
	const uint8_t *data;
};

/* One row's dot product with @x (cols elements). @simd: a kvt_simd level (scalar if 0). */
float llm_dot(int simd, uint32_t type, const void *row, const float *x, size_t n);

/* y[r] = W[r] . x for r in [r0, r1). Uses the level kvt_simd_level() reports. */
void llm_matvec(const struct llm_mat *w, const float *x, float *y, uint32_t r0, uint32_t r1);

#endif /* KVT_LLM_QUANT_H */
