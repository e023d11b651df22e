/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.h - the GPT-2 style byte-level BPE tokenizer stored in GGUF metadata
 * (tokenizer.ggml.model = "gpt2": tokens, token_type, merges).
 *
 * Encoding, as llama.cpp and Hugging Face tokenizers do it for SmolLM2 (pre-tokenizer "smollm"):
 *   1. optionally split out control tokens written literally in the text ("<|im_start|>");
 *   2. pre-tokenize: every \p{N} code point is its own piece, then the GPT-2 pattern
 *      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      (hand-written matcher; Unicode categories and White_Space from ICU);
 *   3. map each byte of a piece to its GPT-2 "byte-level" code point and merge pairs by rank.
 * Other pre-tokenizer names fall back to plain GPT-2 splitting (no digit split) with a warning
 * flag the caller can read; they are not exercised.
 *
 * A byte with no byte-level token in the vocabulary (SmolLM2 has none for 0xC0, 0xC1,
 * 0xF5..0xFF and a few C0 controls) cannot be encoded and is dropped.
 *
 * Decoding maps the byte-level code points back to bytes; a piece may end inside a UTF-8
 * sequence, so print pieces as bytes, or decode whole sequences.
 */
#ifndef KVT_LLM_TOKENIZER_H
#define KVT_LLM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

struct llm_tok;

/* A growable id array. */
struct llm_ids {
	uint32_t *v;
	size_t n;
	size_t cap;
};

int llm_ids_push(struct llm_ids *ids, uint32_t id);
void llm_ids_free(struct llm_ids *ids);

enum llm_tok_type {
	LLM_TOK_NORMAL = 1,
	LLM_TOK_UNKNOWN = 2,
	LLM_TOK_CONTROL = 3,
	LLM_TOK_USER_DEFINED = 4,
	LLM_TOK_UNUSED = 5,
	LLM_TOK_BYTE = 6,
};

/*
 * llm_tok_load() - build the tokenizer from @f's metadata (the strings stay in @f's map, which
 * must outlive the tokenizer). Returns 0, -ENOTSUP (not a gpt2 tokenizer), -EINVAL (missing or
 * inconsistent arrays), -ENOMEM; a reason goes to @err.
 */
int llm_tok_load(const struct gguf_file *f, struct llm_tok **ret_tok, char *err, size_t errlen);
void llm_tok_free(struct llm_tok *t);

/*
 * llm_tok_encode() - append the ids of @len bytes of @text to @ids. With @special, control and
 * user-defined token strings in the text become those tokens; without, they are plain text.
 * Returns 0 or -ENOMEM.
 */
int llm_tok_encode(const struct llm_tok *t, const char *text, size_t len, bool special,
		   struct llm_ids *ids);

/*
 * llm_tok_piece() - the bytes of token @id (not NUL-terminated) into @buf of @cap bytes.
 * Control tokens give their text only with @special, else nothing.
 * Returns the byte count (which may exceed @cap: then @buf holds a prefix), or -EINVAL.
 */
int llm_tok_piece(const struct llm_tok *t, uint32_t id, bool special, char *buf, size_t cap);

/* Decodes @n ids into a malloc'ed NUL-terminated string; NULL on -ENOMEM. */
char *llm_tok_decode(const struct llm_tok *t, const uint32_t *ids, size_t n, bool special);

/* The id of the token whose text is @text exactly, or -ENOENT. */
int llm_tok_find(const struct llm_tok *t, const char *text);

uint32_t llm_tok_n_vocab(const struct llm_tok *t);
int llm_tok_type(const struct llm_tok *t, uint32_t id);
/* -ENOENT when the file names none. */
int llm_tok_bos(const struct llm_tok *t);
int llm_tok_eos(const struct llm_tok *t);
/* True when generation should stop at @id: eos, or any other control token (e.g. <|endoftext|>). */
bool llm_tok_is_eog(const struct llm_tok *t, uint32_t id);

#endif /* KVT_LLM_TOKENIZER_H */
