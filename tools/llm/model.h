/* SPDX-License-Identifier: MIT */
/*
 * model.h - a Llama-architecture decoder over GGUF weights, on the CPU.
 *
 * Per layer: x += Wo * attn(RoPE(Wq * rms(x)), RoPE(Wk * rms(x)), Wv * rms(x)), then
 * x += Wdown * (silu(Wgate * rms(x)) * (Wup * rms(x))); logits = Wout * rms(x), where Wout is
 * output.weight or, when the file has none, the token embedding (tied embeddings).
 *
 * RoPE: GGUF files of arch "llama" are converted with the Q and K weights permuted
 * (convert_hf_to_gguf.py undoes the Hugging Face rotate_half layout), so llama.cpp applies its
 * "normal" rotation (LLAMA_ROPE_TYPE_NORM): adjacent pairs (x[2i], x[2i+1]) rotated by
 * pos * base^(-2i/rope_dim). We do the same. GQA: query head h reads kv head h / (heads/kv_heads).
 *
 * The KV cache sits behind struct kv_backend (kv.h). Steps are one token at a time (prefill is a
 * loop of steps), which keeps the per-step APPEND/SCORE_ADD protocol the same for prompt and
 * generation.
 */
#ifndef KVT_LLM_MODEL_H
#define KVT_LLM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kv.h"
#include "llm_quant.h"

/* Largest head dimension accepted; kvtier's limit (KVT_MAX_HEAD_DIM in proto/kvt_abi.h). */
#define KVT_LLM_MAX_HEAD_DIM 256

struct llm_config {
	uint32_t n_layer;
	uint32_t n_embd;
	uint32_t n_head;
	uint32_t n_head_kv;
	uint32_t head_dim;
	uint32_t rope_dim; /* rotated dims per head (<= head_dim) */
	uint32_t n_ff;
	uint32_t n_vocab;
	uint32_t n_ctx_train;
	float rope_base;
	float rms_eps;
};

struct llm_layer {
	float *attn_norm; /* n_embd, dequantized copies (owned) */
	float *ffn_norm;
	struct llm_mat wq, wk, wv, wo, gate, up, down;
};

struct llm_model {
	struct gguf_file *gguf;
	struct llm_config cfg;
	struct llm_mat tok_embd; /* n_vocab rows of n_embd */
	struct llm_mat output;	 /* output.weight, or tok_embd when tied */
	int tied;
	float *out_norm;
	struct llm_layer *layers;
};

/*
 * llm_model_load() - open the GGUF at @path and bind a llama model to its tensors (no copy of
 * the matrices: they stay in the map). On failure, a reason goes to @err.
 * Returns 0, -ENOENT (no such file), -EINVAL (not a usable llama GGUF), -ENOTSUP (arch or
 * tensor type), -ENOMEM, or an open/mmap error.
 */
int llm_model_load(const char *path, struct llm_model **ret_model, char *err, size_t errlen);
void llm_model_free(struct llm_model *m);

struct llm_pool;
struct llm_kvdump;

/*
 * A running sequence: scratch buffers, the thread pool and the KV backend. Not thread-safe;
 * one context per sequence.
 */
struct llm_ctx {
	const struct llm_model *m;
	struct kv_backend *kv; /* borrowed */
	struct llm_pool *pool;
	uint32_t n_threads;
	/* scratch */
	float *x, *xb, *xb2, *q, *hb, *hb2, *logits;
	float *tok;	   /* this step's K/V block, kv->token_floats */
	float *att;	   /* n_head * att_cap attention weights */
	float *att_mean;   /* att_cap: this step's weights averaged over layers and heads */
	uint32_t *att_pos; /* att_cap: positions of att_mean */
	uint32_t att_cap;
	float *rope_cos, *rope_sin; /* rope_dim / 2, for the current position */
	/* per-step view of the current layer, shared with the workers */
	struct kv_view view;
	uint32_t cur_pos;
	uint32_t cur_layer;
	float *cur_x; /* input of the running matvec job */
	const struct llm_mat *job_mats[3];
	float *job_outs[3];
	uint32_t job_n;
	struct llm_kvdump *dump; /* optional, borrowed: gets each step's post-RoPE Q and K */
};

/*
 * llm_ctx_create() - bind @kv (geometry must match the model: layers, kv_heads, head_dim) with
 * @n_threads threads (1 = no threads). Returns 0, -EINVAL, -ENOMEM, or a pthread error.
 */
int llm_ctx_create(const struct llm_model *m, struct kv_backend *kv, uint32_t n_threads,
		   struct llm_ctx **ret_ctx);
void llm_ctx_free(struct llm_ctx *c);

/*
 * llm_step() - run @token at position kv->n through the model; on success *@ret_logits points
 * to n_vocab logits valid until the next step, and the token's rows are appended to the backend.
 * Returns 0, -EINVAL (token out of range), -EPROTO (the backend broke the view contract), the
 * backend's error, or the dump's write error (c->dump).
 */
int llm_step(struct llm_ctx *c, uint32_t token, const float **ret_logits);

#endif /* KVT_LLM_MODEL_H */
