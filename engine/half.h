/* SPDX-License-Identifier: MIT */
/*
 * half.h - f16 and bf16 to and from f32, one value at a time. Its own header so that the vector
 * kernels in quant.c and simd.c both use it without depending on each other.
 */
#ifndef KVT_ENGINE_HALF_H
#define KVT_ENGINE_HALF_H

#include <stdint.h>

/* Scalar conversions, exported for tests and for reference code (round-to-nearest-even). */
float kvt_f16_to_f32(uint16_t h);
uint16_t kvt_f32_to_f16(float f);
float kvt_bf16_to_f32(uint16_t h);
uint16_t kvt_f32_to_bf16(float f);

#endif /* KVT_ENGINE_HALF_H */
