/* SPDX-License-Identifier: MIT */
/*
 * srht.h - the fixed random rotation used by ParisKV retrieval (docs/retrieval.md section 1).
 *
 * y = (1/sqrt(d)) * H_d * (D (.) x), with H_d the Sylvester Hadamard matrix
 * (H[i][j] = (-1)^popcount(i & j)) and D a fixed +-1 diagonal. The transform is orthonormal, so
 * <y_k, y_q> = <k, q>. One round, no subsampling, d in {64, 128}.
 *
 * The diagonal is data-independent but must never change for an index that has encoded keys:
 * keys and queries must be rotated by the same D. It is drawn from a fixed-seed generator
 * (splitmix64) and can be saved and loaded as d signed bytes, so a daemon can persist it next to
 * the codes it produced.
 *
 * The AVX2 and scalar variants perform the same butterflies in the same order without FMA, so
 * they give bit-identical outputs; encodings do not depend on the SIMD level.
 */
#ifndef KVT_ENGINE_SRHT_H
#define KVT_ENGINE_SRHT_H

#include <stddef.h>
#include <stdint.h>

#define KVT_SRHT_MAX_DIM 128
#define KVT_SRHT_SEED	 42u /* seed of the default diagonal */

/*
 * struct kvt_srht - one rotation. Plain data: copy it freely; read-only once built, so any number
 * of threads may apply it concurrently.
 */
struct kvt_srht {
	uint32_t dim;		      /* 64 or 128 */
	float scale;		      /* 1/sqrt(dim) */
	float sign[KVT_SRHT_MAX_DIM]; /* the diagonal, +1.0f or -1.0f; [dim, MAX) unused */
};

/*
 * kvt_srht_init - build the rotation for @dim from @seed.
 * @s: rotation to fill.
 * @dim: 64 or 128.
 * @seed: generator seed; KVT_SRHT_SEED gives the project default. The same (dim, seed) always
 *        gives the same signs on every platform.
 * Returns 0, or -EINVAL for another @dim (then @s is untouched). Thread-safe (touches only @s).
 */
int kvt_srht_init(struct kvt_srht *s, unsigned int dim, uint64_t seed);

/*
 * kvt_srht_save - serialise the diagonal as @s->dim signed bytes, +1 (0x01) or -1 (0xff), in
 * dimension order.
 * @buf, @len: destination; @len must be at least @s->dim.
 * Returns the number of bytes written (@s->dim), or -ENOSPC when @len is short. Thread-safe.
 */
int kvt_srht_save(const struct kvt_srht *s, uint8_t *buf, size_t len);

/*
 * kvt_srht_load - rebuild a rotation from bytes written by kvt_srht_save().
 * @buf, @len: exactly 64 or 128 bytes, each 0x01 or 0xff.
 * @ret_s: filled on success, untouched on failure.
 * Returns 0, or -EINVAL for another length or any other byte value. Thread-safe.
 */
int kvt_srht_load(const uint8_t *buf, size_t len, struct kvt_srht *ret_s);

/*
 * kvt_srht_apply - y = (1/sqrt(d)) H (D (.) x), dispatched on kvt_simd_level().
 * @x: @s->dim floats. @ret_y: @s->dim floats; may equal @x (in place), must not overlap otherwise.
 * Thread-safe.
 */
void kvt_srht_apply(const struct kvt_srht *s, const float *x, float *ret_y);

/*
 * kvt_srht_inverse - x = D (.) ((1/sqrt(d)) H y), the exact inverse (H is symmetric and
 * H H = d I). Same aliasing rules and thread safety as kvt_srht_apply().
 */
void kvt_srht_inverse(const struct kvt_srht *s, const float *y, float *ret_x);

/*
 * kvt_fwht_scalar, kvt_fwht_avx2 - the unnormalised in-place Walsh-Hadamard transform
 * x <- H x on @dim floats (64 or 128), exposed so tests can compare the variants. The AVX2 one
 * must only be called when kvt_simd_level() >= KVT_SIMD_AVX2. Thread-safe.
 */
void kvt_fwht_scalar(float *x, unsigned int dim);
void kvt_fwht_avx2(float *x, unsigned int dim);

#endif /* KVT_ENGINE_SRHT_H */
