/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

/* xorshift64*: small, fast, reproducible across platforms. */
static uint64_t
rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1Dull;
}

static float
rng_unit(uint64_t *s)
{
	return (float)((rng_next(s) >> 11) * (1.0 / 9007199254740992.0));
}

static float
rng_gauss(uint64_t *s)
{
	float u = rng_unit(s), v = rng_unit(s);

	return sqrtf(-2.0f * logf(u + 1e-12f)) * cosf(6.2831853f * v);
}

int
sim_trace_init(struct sim_trace *tr, uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
	       uint64_t seed)
{
	uint64_t per = (uint64_t)layers * kv_heads;

	memset(tr, 0, sizeof(*tr));
	tr->layers = layers;
	tr->kv_heads = kv_heads;
	tr->head_dim = head_dim;
	tr->topics = 256;
	tr->run_len = 48;
	tr->strength = 3.0f;
	tr->noise = 1.0f;
	tr->p_revisit = 0.7f;
	tr->rng = seed * 0x9E3779B97F4A7C15ull + 1;
	tr->dirs = malloc(sizeof(float) * tr->topics * per * head_dim);
	if (!tr->dirs)
		return -ENOMEM;
	for (uint64_t i = 0; i < tr->topics * per; i++) {
		float *d = tr->dirs + i * head_dim, n = 0;

		for (uint32_t j = 0; j < head_dim; j++) {
			d[j] = rng_gauss(&tr->rng);
			n += d[j] * d[j];
		}
		n = 1.0f / sqrtf(n);
		for (uint32_t j = 0; j < head_dim; j++)
			d[j] *= n;
	}
	return 0;
}

void
sim_trace_fini(struct sim_trace *tr)
{
	free(tr->dirs);
}

void
sim_trace_token(struct sim_trace *tr, float *rows)
{
	uint32_t hd = tr->head_dim, H = tr->kv_heads;
	float scale = sqrtf((float)hd);

	if (tr->t && tr->t % tr->run_len == 0) {
		tr->cur_topic = (tr->cur_topic + 1) % tr->topics;
		if (tr->cur_topic > tr->max_topic)
			tr->max_topic = tr->cur_topic;
	}
	for (uint32_t l = 0; l < tr->layers; l++)
		for (uint32_t h = 0; h < H; h++) {
			const float *d =
			    tr->dirs + (((uint64_t)tr->cur_topic * tr->layers + l) * H + h) * hd;
			float *k = rows + ((uint64_t)(2 * l) * H + h) * hd;
			float *v = rows + ((uint64_t)(2 * l + 1) * H + h) * hd;

			/* keys ~ strength * direction + noise, in units of 1/sqrt(d) per dim */
			for (uint32_t j = 0; j < hd; j++) {
				k[j] = tr->strength * d[j] * scale / 4 +
				       tr->noise * rng_gauss(&tr->rng) / 4;
				v[j] = rng_gauss(&tr->rng);
			}
		}
	tr->t++;
}

void
sim_trace_query(struct sim_trace *tr, float *q)
{
	uint32_t hd = tr->head_dim, H = tr->kv_heads, topic = tr->cur_topic;
	float scale = sqrtf((float)hd);

	if (rng_unit(&tr->rng) < tr->p_revisit)
		topic = (uint32_t)(rng_next(&tr->rng) % (tr->max_topic + 1));
	for (uint32_t l = 0; l < tr->layers; l++)
		for (uint32_t h = 0; h < H; h++) {
			const float *d =
			    tr->dirs + (((uint64_t)topic * tr->layers + l) * H + h) * hd;
			float *o = q + ((uint64_t)l * H + h) * hd;

			for (uint32_t j = 0; j < hd; j++)
				o[j] = tr->strength * d[j] * scale / 4 + rng_gauss(&tr->rng) / 8;
		}
}
