/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "simd.h"
#include "srht.h"

/* splitmix64: tiny, well-mixed and fully specified, so the default diagonal is the same on
 * every platform and libc (unlike rand()). */
static uint64_t
splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int
kvt_srht_init(struct kvt_srht *s, unsigned int dim, uint64_t seed)
{
	uint64_t st = seed;

	if (dim != 64 && dim != 128)
		return -EINVAL;
	memset(s, 0, sizeof(*s));
	s->dim = dim;
	s->scale = 1.0f / sqrtf((float)dim);
	for (unsigned int i = 0; i < dim; i++)
		s->sign[i] = (splitmix64(&st) >> 63) ? -1.0f : 1.0f;
	return 0;
}

int
kvt_srht_save(const struct kvt_srht *s, uint8_t *buf, size_t len)
{
	if (len < s->dim)
		return -ENOSPC;
	for (unsigned int i = 0; i < s->dim; i++)
		buf[i] = s->sign[i] < 0.0f ? 0xff : 0x01;
	return (int)s->dim;
}

int
kvt_srht_load(const uint8_t *buf, size_t len, struct kvt_srht *ret_s)
{
	struct kvt_srht s;

	if (len != 64 && len != 128)
		return -EINVAL;
	memset(&s, 0, sizeof(s));
	s.dim = (uint32_t)len;
	s.scale = 1.0f / sqrtf((float)len);
	for (size_t i = 0; i < len; i++) {
		if (buf[i] == 0x01)
			s.sign[i] = 1.0f;
		else if (buf[i] == 0xff)
			s.sign[i] = -1.0f;
		else
			return -EINVAL;
	}
	*ret_s = s;
	return 0;
}

void
kvt_fwht_scalar(float *x, unsigned int dim)
{
	for (unsigned int h = 1; h < dim; h <<= 1) {
		for (unsigned int i = 0; i < dim; i += 2 * h) {
			for (unsigned int j = i; j < i + h; j++) {
				float a = x[j], b = x[j + h];

				x[j] = a + b;
				x[j + h] = a - b;
			}
		}
	}
}

#if defined(__x86_64__)
/*
 * Same butterflies as kvt_fwht_scalar(): for a pair (a at j, b at j + h) the low slot gets a + b
 * and the high slot a - b. IEEE addition is commutative, so computing b + a in a permuted lane is
 * bit-identical; subtraction is always formed as a - b. No FMA is involved.
 */
__attribute__((target("avx2,fma"))) void
kvt_fwht_avx2(float *x, unsigned int dim)
{
	__m256 v[KVT_SRHT_MAX_DIM / 8];
	unsigned int nv = dim / 8;

	for (unsigned int i = 0; i < nv; i++) {
		__m256 t = _mm256_loadu_ps(x + 8 * i), sw, sum, dif;

		/* h = 1: pairs (0,1) (2,3) ... */
		sw = _mm256_permute_ps(t, 0xb1);
		sum = _mm256_add_ps(t, sw);
		dif = _mm256_sub_ps(sw, t); /* high lane: a - b with a = swapped low */
		t = _mm256_blend_ps(sum, dif, 0xaa);
		/* h = 2: pairs (0,2) (1,3) ... */
		sw = _mm256_permute_ps(t, 0x4e);
		sum = _mm256_add_ps(t, sw);
		dif = _mm256_sub_ps(sw, t);
		t = _mm256_blend_ps(sum, dif, 0xcc);
		/* h = 4: pairs (0,4) ... across 128-bit halves */
		sw = _mm256_permute2f128_ps(t, t, 0x01);
		sum = _mm256_add_ps(t, sw);
		dif = _mm256_sub_ps(sw, t);
		v[i] = _mm256_blend_ps(sum, dif, 0xf0);
	}
	for (unsigned int hv = 1; hv < nv; hv <<= 1) {
		for (unsigned int i = 0; i < nv; i += 2 * hv) {
			for (unsigned int j = i; j < i + hv; j++) {
				__m256 a = v[j], b = v[j + hv];

				v[j] = _mm256_add_ps(a, b);
				v[j + hv] = _mm256_sub_ps(a, b);
			}
		}
	}
	for (unsigned int i = 0; i < nv; i++)
		_mm256_storeu_ps(x + 8 * i, v[i]);
}
#else
void
kvt_fwht_avx2(float *x, unsigned int dim)
{
	kvt_fwht_scalar(x, dim);
}
#endif

static void
fwht(float *x, unsigned int dim)
{
	if (kvt_simd_level() >= KVT_SIMD_AVX2)
		kvt_fwht_avx2(x, dim);
	else
		kvt_fwht_scalar(x, dim);
}

void
kvt_srht_apply(const struct kvt_srht *s, const float *x, float *ret_y)
{
	unsigned int d = s->dim;

	/* Multiplying by +-1 and by the scale are exact-order operations shared by all variants. */
	for (unsigned int i = 0; i < d; i++)
		ret_y[i] = x[i] * s->sign[i];
	fwht(ret_y, d);
	for (unsigned int i = 0; i < d; i++)
		ret_y[i] *= s->scale;
}

void
kvt_srht_inverse(const struct kvt_srht *s, const float *y, float *ret_x)
{
	unsigned int d = s->dim;

	if (ret_x != y)
		memcpy(ret_x, y, d * sizeof(float));
	fwht(ret_x, d);
	for (unsigned int i = 0; i < d; i++)
		ret_x[i] = ret_x[i] * s->scale * s->sign[i];
}
