/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "gen.h"

#define MAX_TOPICS 512
#define SALIENT	   0.10 /* fraction of keys in topic passages */
#define TOPIC_AMP  24.0f

struct rng {
	uint64_t s;
};

static double
urand(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return ((z >> 11) + 0.5) * 0x1.0p-53;
}

static float
grand(struct rng *r)
{
	return (float)(sqrt(-2.0 * log(urand(r))) * cos(6.283185307179586 * urand(r)));
}

struct profile {
	float kmean[128], kscale[128];
	float qmean[128], qscale[128];
	float topic[MAX_TOPICS][128]; /* unit directions */
};

static void
make_profile(struct rng *r, unsigned int d, unsigned int topics, struct profile *p)
{
	for (unsigned int i = 0; i < d; i++) {
		p->kmean[i] = 0.0f;
		p->qmean[i] = 0.0f;
		p->kscale[i] = expf(0.6f * grand(r));
		p->qscale[i] = 0.3f * expf(0.6f * grand(r));
	}
	for (int o = 0; o < 4; o++) {
		unsigned int c = (unsigned int)(urand(r) * d);
		float sg = urand(r) < 0.5 ? -1.0f : 1.0f;

		p->kmean[c] = sg * 6.0f * (1.0f + (float)urand(r));
		p->kscale[c] *= 3.0f;
		p->qmean[c] = sg * 1.0f;
	}
	for (unsigned int t = 0; t < topics; t++) {
		float nrm = 0.0f;

		for (unsigned int i = 0; i < d; i++) {
			p->topic[t][i] = grand(r);
			nrm += p->topic[t][i] * p->topic[t][i];
		}
		for (unsigned int i = 0; i < d; i++)
			p->topic[t][i] /= sqrtf(nrm);
	}
}

/* Passage state: keys come in runs; a run is a topic passage with probability SALIENT. */
struct passage {
	uint32_t left; /* keys left in the current run */
	int topic;     /* -1: background run */
};

static void
draw_key(struct rng *r, const struct profile *p, unsigned int d, unsigned int topics,
	 struct passage *ps, float *k)
{
	if (!ps->left) {
		ps->left = 32 + (uint32_t)(urand(r) * 224);
		ps->topic = urand(r) < SALIENT ? (int)(urand(r) * topics) : -1;
	}
	ps->left--;
	for (unsigned int i = 0; i < d; i++)
		k[i] = p->kmean[i] + p->kscale[i] * grand(r);
	if (ps->topic >= 0) {
		float a = TOPIC_AMP * (0.25f + 0.75f * (float)urand(r));

		for (unsigned int i = 0; i < d; i++)
			k[i] += a * p->topic[ps->topic][i];
	}
}

static void
draw_query(struct rng *r, const struct profile *p, unsigned int d, unsigned int topics, float *q)
{
	int t = (int)(urand(r) * topics);

	for (unsigned int i = 0; i < d; i++)
		q[i] = p->qmean[i] + p->qscale[i] * grand(r) + 6.0f * p->topic[t][i];
}

int
gen_make(enum gen_set set, uint32_t n, unsigned int d, uint32_t nq, uint64_t seed, float *keys,
	 float *queries)
{
	struct rng r = {seed * 0x2545f4914f6cdd1dull + (uint64_t)set};
	struct profile *pa, *pb;
	struct passage ps = {0, -1};
	uint32_t shift = set == GEN_DRIFT ? n / 10 : n;
	/* about 200 topic keys per topic at any n, so a query's topic has more than k keys */
	unsigned int topics = n / 2048 < 16 ? 16 : n / 2048 > MAX_TOPICS ? MAX_TOPICS : n / 2048;

	if (d > 128 || d % 8)
		return -EINVAL;
	pa = malloc(sizeof(*pa));
	pb = malloc(sizeof(*pb));
	if (!pa || !pb) {
		free(pa);
		free(pb);
		return -ENOMEM;
	}
	make_profile(&r, d, topics, pa);
	make_profile(&r, d, topics, pb);
	for (uint32_t i = 0; i < n; i++)
		draw_key(&r, i < shift ? pa : pb, d, topics, &ps, keys + (size_t)i * d);
	for (uint32_t i = 0; i < nq; i++)
		draw_query(&r, set == GEN_DRIFT ? pb : pa, d, topics, queries + (size_t)i * d);
	free(pa);
	free(pb);
	return 0;
}

const char *
gen_name(enum gen_set set)
{
	return set == GEN_DRIFT ? "drift" : "outlier";
}
