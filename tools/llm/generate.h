/* SPDX-License-Identifier: MIT */
/*
 * generate.h - prompts, sampling and the generation loop on top of model.h and tokenizer.h.
 */
#ifndef KVT_LLM_GENERATE_H
#define KVT_LLM_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "tokenizer.h"

#define LLM_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

/* The system turn SmolLM2-Instruct's chat template inserts when the chat has none. */
#define LLM_DEFAULT_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

/*
 * llm_default_model_path() - where tools/fetch-model.sh puts the model:
 * $KVT_MODEL if set, else ${KVT_MODEL_DIR:-$HOME/.cache/kvtier/models}/LLM_MODEL_FILE.
 * Returns 0 or -ENAMETOOLONG / -ENOENT (no HOME and no KVT_MODEL_DIR).
 */
int llm_default_model_path(char *buf, size_t len);

/*
 * llm_chat_prompt() - append the ChatML prompt of the model's template for one user turn:
 *   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n
 *   <|im_start|>assistant\n
 * @system NULL uses LLM_DEFAULT_SYSTEM, as the template does; "" leaves the system turn out.
 * Text is encoded without special-token parsing, so a user cannot inject control tokens.
 * Returns 0, -ENOTSUP (the vocabulary has no <|im_start|>/<|im_end|>), -ENOMEM.
 */
int llm_chat_prompt(const struct llm_tok *t, const char *system, const char *user,
		    struct llm_ids *ids);

/* Plain prompt: bos first when the file asks for it (tokenizer.ggml.add_bos_token). */
int llm_plain_prompt(const struct llm_tok *t, const struct gguf_file *f, const char *text,
		     struct llm_ids *ids);

struct llm_sampler {
	float temp;  /* <= 0: greedy */
	float top_p; /* (0, 1]; 1 = no nucleus cut */
	uint64_t rng;
	uint32_t n_vocab;
	uint32_t *idx; /* scratch */
	float *prob;
};

/* Returns 0, -EINVAL (top_p outside (0, 1]), -ENOMEM. */
int llm_sampler_init(struct llm_sampler *s, uint32_t n_vocab, float temp, float top_p,
		     uint64_t seed);
void llm_sampler_fini(struct llm_sampler *s);

/*
 * Greedy: argmax, lowest id on ties. Otherwise softmax(logits / temp), keep the smallest set of
 * most likely tokens whose mass reaches top_p, draw from it with a xorshift64* generator seeded
 * by splitmix64(seed): the same seed gives the same tokens.
 */
uint32_t llm_sample(struct llm_sampler *s, const float *logits);

struct llm_gen_stats {
	uint32_t prompt_tokens;
	uint32_t gen_tokens;
	double prefill_s;
	double first_token_s;  /* from the start of the prefill to the first token sampled */
	uint32_t decode_steps; /* model steps run on generated tokens */
	double decode_s;       /* time from the end of the prompt to the end */
	bool stopped;	       /* an end-of-generation token ended it (not the token budget) */
};

/*
 * llm_generate() - feed @prompt (@n_prompt ids) through @c, then sample up to @max_tokens ids
 * into @out (end-of-generation tokens are not kept), calling @on_token (may be NULL) for each.
 * Returns 0 or a negative errno from llm_step().
 */
int llm_generate(struct llm_ctx *c, const struct llm_tok *t, const uint32_t *prompt,
		 size_t n_prompt, uint32_t max_tokens, struct llm_sampler *s,
		 void (*on_token)(void *arg, uint32_t id), void *arg, struct llm_ids *out,
		 struct llm_gen_stats *st);

#endif /* KVT_LLM_GENERATE_H */
