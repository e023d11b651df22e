/* SPDX-License-Identifier: MIT */
/*
 * The 16-bit float formats one value at a time: exact widening, round-to-nearest-even narrowing.
 * The reference the vector kernels (quant.c, simd.c) are tested against.
 */
#include <stdint.h>
#include <string.h>

#include "half.h"

static inline uint32_t
f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float
u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

float
kvt_f16_to_f32(uint16_t h)
{
	uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;

	if (e == 0) {
		if (m == 0)
			return u2f(s);
		e = 113; /* normalize the subnormal: value m * 2^-24 */
		while (!(m & 0x400u)) {
			m <<= 1;
			e--;
		}
		return u2f(s | e << 23 | (m & 0x3ffu) << 13);
	}
	if (e == 31) /* Inf, or NaN made quiet as F16C does */
		return u2f(s | 0x7f800000u | m << 13 | (m ? 0x400000u : 0));
	return u2f(s | (e + 112) << 23 | m << 13);
}

uint16_t
kvt_f32_to_f16(float f)
{
	uint32_t u = f2u(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;

	if (a > 0x7f800000u) /* NaN: quiet, top payload bits kept (F16C behaviour) */
		return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477ff000u) /* >= 65520 rounds to Inf */
		return (uint16_t)(s | 0x7c00u);
	if (a >= 0x38800000u) { /* normal half */
		uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);

		return (uint16_t)(s | r >> 13);
	}
	if (a <= 0x33000000u) /* <= 2^-25: rounds to (signed) zero */
		return (uint16_t)s;
	{
		uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, sh = 126 - e;
		uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);

		if (rem > half || (rem == half && (q & 1u)))
			q++;
		return (uint16_t)(s | q);
	}
}

float
kvt_bf16_to_f32(uint16_t h)
{
	return u2f((uint32_t)h << 16);
}

uint16_t
kvt_f32_to_bf16(float f)
{
	uint32_t u = f2u(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
