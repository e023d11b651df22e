/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE /* qsort_r */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "generate.h"

int
llm_default_model_path(char *buf, size_t len)
{
	const char *p = getenv("KVT_MODEL"), *dir = getenv("KVT_MODEL_DIR"), *home;
	int n;

	if (p && *p) {
		n = snprintf(buf, len, "%s", p);
	} else if (dir && *dir) {
		n = snprintf(buf, len, "%s/%s", dir, LLM_MODEL_FILE);
	} else {
		home = getenv("HOME");
		if (!home || !*home)
			return -ENOENT;
		n = snprintf(buf, len, "%s/.cache/kvtier/models/%s", home, LLM_MODEL_FILE);
	}
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int
push_text(const struct llm_tok *t, const char *s, struct llm_ids *ids)
{
	return llm_tok_encode(t, s, strlen(s), false, ids);
}

int
llm_chat_prompt(const struct llm_tok *t, const char *system, const char *user, struct llm_ids *ids)
{
	int start = llm_tok_find(t, "<|im_start|>"), end = llm_tok_find(t, "<|im_end|>");
	int ret = 0;

	if (start < 0 || end < 0)
		return -ENOTSUP;
	if (!system)
		system = LLM_DEFAULT_SYSTEM;
	if (*system) {
		if ((ret = llm_ids_push(ids, (uint32_t)start)) < 0 ||
		    (ret = push_text(t, "system\n", ids)) < 0 ||
		    (ret = push_text(t, system, ids)) < 0 ||
		    (ret = llm_ids_push(ids, (uint32_t)end)) < 0 ||
		    (ret = push_text(t, "\n", ids)) < 0)
			return ret;
	}
	if ((ret = llm_ids_push(ids, (uint32_t)start)) < 0 ||
	    (ret = push_text(t, "user\n", ids)) < 0 || (ret = push_text(t, user, ids)) < 0 ||
	    (ret = llm_ids_push(ids, (uint32_t)end)) < 0 || (ret = push_text(t, "\n", ids)) < 0 ||
	    (ret = llm_ids_push(ids, (uint32_t)start)) < 0 ||
	    (ret = push_text(t, "assistant\n", ids)) < 0)
		return ret;
	return 0;
}

int
llm_plain_prompt(const struct llm_tok *t, const struct gguf_file *f, const char *text,
		 struct llm_ids *ids)
{
	bool add_bos = false;
	int ret;

	gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos);
	if (add_bos && llm_tok_bos(t) >= 0) {
		ret = llm_ids_push(ids, (uint32_t)llm_tok_bos(t));
		if (ret < 0)
			return ret;
	}
	return push_text(t, text, ids);
}

static uint64_t
splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* xorshift64*: a uniform float in [0, 1) from the top 24 bits. */
static float
rng_f32(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return (float)((*s * 0x2545f4914f6cdd1dull) >> 40) * 0x1p-24f;
}

int
llm_sampler_init(struct llm_sampler *s, uint32_t n_vocab, float temp, float top_p, uint64_t seed)
{
	uint64_t x = seed;

	if (!(top_p > 0.0f && top_p <= 1.0f) || !n_vocab)
		return -EINVAL;
	memset(s, 0, sizeof(*s));
	s->temp = temp;
	s->top_p = top_p;
	s->n_vocab = n_vocab;
	s->rng = splitmix64(&x);
	if (!s->rng)
		s->rng = 1; /* xorshift state must not be zero */
	s->idx = malloc(n_vocab * sizeof(*s->idx));
	s->prob = malloc(n_vocab * sizeof(*s->prob));
	if (!s->idx || !s->prob) {
		llm_sampler_fini(s);
		return -ENOMEM;
	}
	return 0;
}

void
llm_sampler_fini(struct llm_sampler *s)
{
	free(s->idx);
	free(s->prob);
	s->idx = NULL;
	s->prob = NULL;
}

static int
cmp_prob_desc(const void *a, const void *b, void *arg)
{
	const float *p = arg;
	uint32_t ia = *(const uint32_t *)a, ib = *(const uint32_t *)b;

	if (p[ia] != p[ib])
		return p[ia] > p[ib] ? -1 : 1;
	return ia < ib
		   ? -1
		   : (ia > ib ? 1 : 0); /* ties by id: a total order, so the sort is reproducible */
}

uint32_t
llm_sample(struct llm_sampler *s, const float *logits)
{
	uint32_t n = s->n_vocab, best = 0, m = 0;
	float max = logits[0], sum = 0.0f, cut, cum = 0.0f, r;

	for (uint32_t i = 1; i < n; i++)
		if (logits[i] > max) {
			max = logits[i];
			best = i;
		}
	if (s->temp <= 0.0f)
		return best;

	for (uint32_t i = 0; i < n; i++) {
		s->prob[i] = expf((logits[i] - max) / s->temp);
		sum += s->prob[i];
	}
	for (uint32_t i = 0; i < n; i++)
		s->prob[i] /= sum;
	/*
	 * Tokens below (1 - top_p) / (n - 1) cannot be in the nucleus (the others would already
	 * reach top_p), so only the rest is sorted.
	 */
	cut = s->top_p < 1.0f ? (1.0f - s->top_p) / (float)(n - 1) : 0.0f;
	for (uint32_t i = 0; i < n; i++)
		if (s->prob[i] >= cut)
			s->idx[m++] = i;
	qsort_r(s->idx, m, sizeof(*s->idx), cmp_prob_desc, s->prob);
	{
		uint32_t last = m - 1;

		for (uint32_t i = 0; i < m; i++) {
			cum += s->prob[s->idx[i]];
			if (cum >= s->top_p) {
				last = i;
				break;
			}
		}
		m = last + 1;
	}
	r = rng_f32(&s->rng) * cum;
	for (uint32_t i = 0; i < m; i++) {
		r -= s->prob[s->idx[i]];
		if (r < 0.0f)
			return s->idx[i];
	}
	return s->idx[m - 1];
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int
llm_generate(struct llm_ctx *c, const struct llm_tok *t, const uint32_t *prompt, size_t n_prompt,
	     uint32_t max_tokens, struct llm_sampler *s, void (*on_token)(void *arg, uint32_t id),
	     void *arg, struct llm_ids *out, struct llm_gen_stats *st)
{
	const float *logits = NULL;
	double t0, t1;
	uint32_t id;
	int ret;

	memset(st, 0, sizeof(*st));
	if (!n_prompt)
		return -EINVAL;
	t0 = now_s();
	for (size_t i = 0; i < n_prompt; i++) {
		ret = llm_step(c, prompt[i], &logits);
		if (ret < 0)
			return ret;
	}
	t1 = now_s();
	st->prompt_tokens = (uint32_t)n_prompt;
	st->prefill_s = t1 - t0;

	for (uint32_t g = 0; g < max_tokens; g++) {
		id = llm_sample(s, logits);
		if (!g)
			st->first_token_s = now_s() - t0;
		if (llm_tok_is_eog(t, id)) {
			st->stopped = true;
			break;
		}
		ret = llm_ids_push(out, id);
		if (ret < 0)
			return ret;
		st->gen_tokens++;
		if (on_token)
			on_token(arg, id);
		if (g + 1 == max_tokens)
			break;
		ret = llm_step(c, id, &logits);
		if (ret < 0)
			return ret;
		st->decode_steps++;
	}
	st->decode_s = now_s() - t1;
	return 0;
}
