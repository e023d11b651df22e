/* SPDX-License-Identifier: MIT */
/*
 * eval.h - kvtier-llm --eval: what each tiering policy and budget costs the real model.
 *
 * For each prompt, the full-cache greedy continuation (local backend, end-of-generation tokens
 * masked so every continuation has the same length) is generated once. Then every configuration
 * runs through kvtierd teacher-forced on that continuation: the same tokens are fed, and at each
 * generated position we count whether the configuration's argmax (same masking) equals the
 * full-cache token (agreement), and add -log p(token) under its full softmax (perplexity of the
 * continuation). Last, decode speed: greedy generation with the local backend and with kvtier
 * (tiered, hbm 0.5, evict 0.03, Δ 64, window 128), alternated, medians.
 */
#ifndef KVT_LLM_EVAL_H
#define KVT_LLM_EVAL_H

#include <stdint.h>

#include "model.h"
#include "tokenizer.h"

struct llm_eval_opts {
	const char *socket;    /* kvtierd */
	uint32_t threads;      /* model threads per process */
	uint32_t jobs;	       /* processes running configurations side by side (>= 1) */
	uint32_t prompts;      /* first N of the built-in prompts */
	uint32_t tokens;       /* generated (teacher-forced) tokens per prompt */
	uint32_t delta;	       /* Δ of every configuration */
	uint32_t window;       /* recent window of every configuration */
	uint32_t speed_tokens; /* tokens per speed run */
	uint32_t speed_reps;   /* speed runs per backend */
	int json;
	int verbose; /* progress on stderr */
};

/* Defaults: full (10 prompts x 512 tokens) or quick (3 x 96). */
void llm_eval_opts_default(struct llm_eval_opts *o, int quick);

/* Built-in prompts (chat turns asking for long answers). */
extern const char *const llm_eval_prompts[];
extern const uint32_t llm_eval_n_prompts;

/*
 * llm_eval_run() - run the evaluation and print the table (or one JSON object) on stdout.
 * Returns 0, or a negative errno (a failed configuration is an error: no partial report).
 */
int llm_eval_run(const struct llm_model *m, const struct llm_tok *tok,
		 const struct llm_eval_opts *o);

#endif /* KVT_LLM_EVAL_H */
