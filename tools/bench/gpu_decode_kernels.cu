/* SPDX-License-Identifier: MIT */
/*
 * gpu_decode_kernels.cu - decode attention over HBM rows plus staged rows, its split combine,
 * and the MLP's SiLU gate (gpu_decode_kernels.h). f16 storage, f32 math.
 *
 * kvtb_attn_partial: each warp walks its block's rows four at a time (four K loads in flight
 * before the dot products), lanes holding head_dim / 32 dims (4 at head_dim 128, one 8-byte
 * load per row), dot products reduced with shuffles, online softmax per query head; the four
 * warps merge through shared memory. The K/V rows are read once for the whole GQA group.
 */
#include <cuda_fp16.h>
#include <math_constants.h>

#include "gpu_decode_kernels.h"

struct kvtb_h4 {
	__half2 a, b;
};

__device__ static inline void
load4(const __half *row, unsigned d, bool on, float out[4])
{
	if (!on) {
		out[0] = out[1] = out[2] = out[3] = 0.f;
		return;
	}
	kvtb_h4 h = *(const kvtb_h4 *)(row + d);
	float2 x = __half22float2(h.a), y = __half22float2(h.b);

	out[0] = x.x;
	out[1] = x.y;
	out[2] = y.x;
	out[3] = y.y;
}

extern "C" __global__ void
__launch_bounds__(KVTB_ATTN_THREADS)
    kvtb_attn_partial(const __half *q, const __half *k0, const __half *v0, uint32_t n0,
		      const __half *ks, const __half *vs, uint32_t ns, uint32_t kv_heads,
		      uint32_t group, uint32_t hd, float scale, uint32_t chunk, float *part)
{
	const unsigned h = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
	const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32,
		       nw = KVTB_ATTN_THREADS / 32;
	const unsigned d = lane * 4;
	const bool on = d < hd;
	const uint64_t rs = (uint64_t)kv_heads * hd; /* row stride, elements */
	const uint32_t n = n0 + ns, lo = split * chunk, hi = min(n, lo + chunk);
	float qv[KVTB_MAX_GROUP][4], m[KVTB_MAX_GROUP], s[KVTB_MAX_GROUP], acc[KVTB_MAX_GROUP][4];
	__shared__ float sm[KVTB_ATTN_THREADS / 32][KVTB_MAX_GROUP][KVTB_MAX_HD + 2];

	for (unsigned g = 0; g < group; g++) {
		load4(q + (uint64_t)(h * group + g) * hd, d, on, qv[g]);
		m[g] = -CUDART_INF_F;
		s[g] = 0.f;
		acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.f;
	}
	for (uint32_t p0 = lo + warp * 4; p0 < hi; p0 += nw * 4) {
		float kk[4][4];

#pragma unroll
		for (int j = 0; j < 4; j++) {
			uint32_t p = p0 + j;
			const __half *kr = p < n0 ? k0 + p * rs : ks + (uint64_t)(p - n0) * rs;

			load4(kr + h * hd, d, on && p < hi, kk[j]);
		}
#pragma unroll
		for (int j = 0; j < 4; j++) {
			uint32_t p = p0 + j;
			const __half *vr = p < n0 ? v0 + p * rs : vs + (uint64_t)(p - n0) * rs;
			float vv[4];

			if (p >= hi)
				break;
			load4(vr + h * hd, d, on, vv);
			for (unsigned g = 0; g < group; g++) {
				float x = qv[g][0] * kk[j][0] + qv[g][1] * kk[j][1] +
					  qv[g][2] * kk[j][2] + qv[g][3] * kk[j][3];

				for (int o = 16; o; o /= 2)
					x += __shfl_xor_sync(0xffffffffu, x, o);
				x *= scale;
				float mn = fmaxf(m[g], x), a = __expf(m[g] - mn),
				      b = __expf(x - mn);

				s[g] = s[g] * a + b;
				for (int i = 0; i < 4; i++)
					acc[g][i] = acc[g][i] * a + b * vv[i];
				m[g] = mn;
			}
		}
	}
	for (unsigned g = 0; g < group; g++) {
		if (lane == 0) {
			sm[warp][g][0] = m[g];
			sm[warp][g][1] = s[g];
		}
		if (on)
			for (int i = 0; i < 4; i++)
				sm[warp][g][2 + d + i] = acc[g][i];
	}
	__syncthreads();
	/* Merge the warps: thread t handles (g, dim) pairs. */
	for (unsigned t = threadIdx.x; t < group * (hd + 2); t += blockDim.x) {
		unsigned g = t / (hd + 2), c = t % (hd + 2);
		float M = -CUDART_INF_F, v = 0.f;

		for (unsigned w = 0; w < nw; w++)
			M = fmaxf(M, sm[w][g][0]);
		if (c == 0) {
			v = M;
		} else {
			for (unsigned w = 0; w < nw; w++) {
				float e =
				    sm[w][g][0] == -CUDART_INF_F ? 0.f : __expf(sm[w][g][0] - M);

				v += e * sm[w][g][c];
			}
		}
		part[((uint64_t)(h * group + g) * nsplit + split) * (hd + 2) + c] = v;
	}
}

extern "C" __global__ void
kvtb_attn_combine(const float *part, uint32_t nsplit, uint32_t hd, __half *out)
{
	const unsigned qh = blockIdx.x, c = threadIdx.x;
	const float *p = part + (uint64_t)qh * nsplit * (hd + 2);
	float M = -CUDART_INF_F, S = 0.f, A = 0.f;

	if (c >= hd)
		return;
	for (uint32_t i = 0; i < nsplit; i++)
		M = fmaxf(M, p[i * (hd + 2)]);
	for (uint32_t i = 0; i < nsplit; i++) {
		float m = p[i * (hd + 2)], e = m == -CUDART_INF_F ? 0.f : __expf(m - M);

		S += e * p[i * (hd + 2) + 1];
		A += e * p[i * (hd + 2) + 2 + c];
	}
	out[(uint64_t)qh * hd + c] = __float2half(S > 0.f ? A / S : 0.f);
}

extern "C" __global__ void
kvtb_silu_mul(const __half *gu, uint32_t n, __half *out)
{
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += gridDim.x * blockDim.x) {
		float g = __half2float(gu[i]), u = __half2float(gu[n + i]);

		out[i] = __float2half(g / (1.f + __expf(-g)) * u);
	}
}
