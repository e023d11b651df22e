/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

struct kv_local {
	struct kv_backend kv; /* first: the ops get a kv_backend pointer */
	uint32_t max_tokens;
	uint32_t cap;  /* tokens the arrays below have room for */
	float *rows;   /* cap * token_floats */
	float *score;  /* cap */
	uint32_t *pos; /* cap: 0, 1, 2, ... shared by every view */
	const float **kp;
	const float **vp;
};

/* Grows the arrays geometrically; the views' pointers are rebuilt on each view() anyway. */
static int
local_reserve(struct kv_local *lk, uint32_t need)
{
	uint32_t cap = lk->cap ? lk->cap : 64;
	void *p;

	if (need <= lk->cap)
		return 0;
	while (cap < need)
		cap = cap > UINT32_MAX / 2 ? need : cap * 2;
	if (lk->max_tokens && cap > lk->max_tokens)
		cap = lk->max_tokens;
	p = realloc(lk->rows, (size_t)cap * lk->kv.token_floats * sizeof(float));
	if (!p)
		return -ENOMEM;
	lk->rows = p;
	p = realloc(lk->score, (size_t)cap * sizeof(float));
	if (!p)
		return -ENOMEM;
	lk->score = p;
	p = realloc(lk->pos, (size_t)cap * sizeof(uint32_t));
	if (!p)
		return -ENOMEM;
	lk->pos = p;
	p = realloc(lk->kp, (size_t)cap * sizeof(*lk->kp));
	if (!p)
		return -ENOMEM;
	lk->kp = p;
	p = realloc(lk->vp, (size_t)cap * sizeof(*lk->vp));
	if (!p)
		return -ENOMEM;
	lk->vp = p;
	for (uint32_t i = lk->cap; i < cap; i++) {
		lk->pos[i] = i;
		lk->score[i] = 0.0f;
	}
	lk->cap = cap;
	return 0;
}

static int
local_view(struct kv_backend *kv, uint32_t layer, struct kv_view *ret_view)
{
	struct kv_local *lk = (struct kv_local *)kv;
	uint32_t koff = kv_row_off(kv, layer, 0), voff = kv_row_off(kv, layer, 1);

	if (layer >= kv->layers)
		return -EINVAL;
	for (uint32_t i = 0; i < kv->n; i++) {
		const float *t = lk->rows + (size_t)i * kv->token_floats;

		lk->kp[i] = t + koff;
		lk->vp[i] = t + voff;
	}
	ret_view->n = kv->n;
	ret_view->pos = lk->pos;
	ret_view->k = lk->kp;
	ret_view->v = lk->vp;
	return 0;
}

static int
local_append(struct kv_backend *kv, uint32_t pos, const float *rows)
{
	struct kv_local *lk = (struct kv_local *)kv;
	int ret;

	if (pos != kv->n)
		return -EINVAL;
	if (lk->max_tokens && kv->n >= lk->max_tokens)
		return -ENOSPC;
	ret = local_reserve(lk, kv->n + 1);
	if (ret < 0)
		return ret;
	memcpy(lk->rows + (size_t)pos * kv->token_floats, rows, kv->token_floats * sizeof(float));
	kv->n++;
	return 0;
}

static int
local_score(struct kv_backend *kv, uint32_t n, const uint32_t *pos, const float *w)
{
	struct kv_local *lk = (struct kv_local *)kv;

	for (uint32_t i = 0; i < n; i++) {
		if (pos[i] >= kv->n)
			return -EINVAL;
		lk->score[pos[i]] += w[i];
	}
	return 0;
}

static void
local_destroy(struct kv_backend *kv)
{
	struct kv_local *lk = (struct kv_local *)kv;

	free(lk->rows);
	free(lk->score);
	free(lk->pos);
	free(lk->kp);
	free(lk->vp);
	free(lk);
}

static const struct kv_backend_ops local_ops = {
    .begin = NULL,
    .view = local_view,
    .append = local_append,
    .score = local_score,
    .destroy = local_destroy,
};

int
kv_local_create(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, uint32_t max_tokens,
		struct kv_backend **ret_kv)
{
	struct kv_local *lk;
	uint64_t tf = (uint64_t)layers * 2 * kv_heads * head_dim;

	if (!layers || !kv_heads || !head_dim || tf > UINT32_MAX / sizeof(float))
		return -EINVAL;
	lk = calloc(1, sizeof(*lk));
	if (!lk)
		return -ENOMEM;
	lk->kv.ops = &local_ops;
	lk->kv.layers = layers;
	lk->kv.kv_heads = kv_heads;
	lk->kv.head_dim = head_dim;
	lk->kv.token_floats = (uint32_t)tf;
	lk->max_tokens = max_tokens;
	*ret_kv = &lk->kv;
	return 0;
}

const float *
kv_local_scores(const struct kv_backend *kv)
{
	return ((const struct kv_local *)kv)->score;
}
