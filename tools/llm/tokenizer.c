/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE /* qsort_r */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unicode/uchar.h>

#include "tokenizer.h"

/* Open-addressing hash maps, sized to a power of two >= 2n at load and never grown. */
struct str_slot {
	const char *ptr; /* NULL = empty */
	uint32_t len;
	uint32_t id;
};

struct pair_slot {
	uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
	uint32_t rank;
	uint32_t merged;
};

struct llm_tok {
	uint32_t n_vocab;
	const struct gguf_str *text; /* in the GGUF map */
	int32_t *type;
	struct str_slot *vocab;
	uint32_t vocab_mask;
	struct pair_slot *merges;
	uint32_t merges_mask;
	uint32_t *specials; /* control / user-defined ids, longest text first */
	uint32_t n_specials;
	int bos, eos;
	bool digits_split;	/* pre-tokenizer splits \p{N} one by one */
	uint16_t byte_cp[256];	/* byte -> GPT-2 byte-level code point */
	int16_t cp_byte[512];	/* code point (< 512) -> byte, -1 = none */
	uint32_t byte_tok[256]; /* id of the single-byte token, UINT32_MAX if absent */
};

int
llm_ids_push(struct llm_ids *ids, uint32_t id)
{
	if (ids->n == ids->cap) {
		size_t cap = ids->cap ? ids->cap * 2 : 64;
		uint32_t *v = realloc(ids->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		ids->v = v;
		ids->cap = cap;
	}
	ids->v[ids->n++] = id;
	return 0;
}

void
llm_ids_free(struct llm_ids *ids)
{
	free(ids->v);
	ids->v = NULL;
	ids->n = ids->cap = 0;
}

static uint64_t
hash_bytes(const char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)p[i];
		h *= 0x100000001b3ull;
	}
	return h ^ (h >> 29);
}

static uint64_t
hash_u64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

static uint32_t
pow2_at_least(uint64_t n)
{
	uint32_t c = 16;

	while (c < n)
		c <<= 1;
	return c;
}

static int
vocab_lookup(const struct llm_tok *t, const char *p, size_t n)
{
	for (uint32_t i = (uint32_t)hash_bytes(p, n) & t->vocab_mask;;
	     i = (i + 1) & t->vocab_mask) {
		const struct str_slot *s = &t->vocab[i];

		if (!s->ptr)
			return -ENOENT;
		if (s->len == n && !memcmp(s->ptr, p, n))
			return (int)s->id;
	}
}

static const struct pair_slot *
merge_lookup(const struct llm_tok *t, uint32_t a, uint32_t b)
{
	uint64_t key = ((uint64_t)a << 32 | b) + 1;

	for (uint32_t i = (uint32_t)hash_u64(key) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
		const struct pair_slot *s = &t->merges[i];

		if (!s->key)
			return NULL;
		if (s->key == key)
			return s;
	}
}

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the rest to 256 + k. */
static void
init_byte_map(struct llm_tok *t)
{
	uint32_t next = 256;

	for (int i = 0; i < 512; i++)
		t->cp_byte[i] = -1;
	for (int b = 0; b < 256; b++) {
		bool keep =
		    (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);

		t->byte_cp[b] = (uint16_t)(keep ? (uint32_t)b : next++);
		t->cp_byte[t->byte_cp[b]] = (int16_t)b;
	}
}

static size_t
put_utf8(char *out, uint32_t cp)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/*
 * Decodes one UTF-8 sequence at @p (@n bytes left) into *@cp and returns its length. Invalid or
 * truncated input yields one byte with cp = 0xFFFD, so every byte still reaches the byte-level
 * BPE unchanged.
 */
static size_t
get_utf8(const uint8_t *p, size_t n, uint32_t *cp)
{
	uint32_t c = p[0], len, min;

	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	if ((c & 0xe0) == 0xc0) {
		len = 2, min = 0x80, c &= 0x1f;
	} else if ((c & 0xf0) == 0xe0) {
		len = 3, min = 0x800, c &= 0x0f;
	} else if ((c & 0xf8) == 0xf0) {
		len = 4, min = 0x10000, c &= 0x07;
	} else {
		goto bad;
	}
	if (len > n)
		goto bad;
	for (uint32_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			goto bad;
		c = (c << 6) | (p[i] & 0x3f);
	}
	if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		goto bad;
	*cp = c;
	return len;
bad:
	*cp = 0xfffd;
	return 1;
}

static int
cmp_special_len(const void *a, const void *b, void *arg)
{
	const struct llm_tok *t = arg;
	uint64_t la = t->text[*(const uint32_t *)a].len, lb = t->text[*(const uint32_t *)b].len;

	return la < lb ? 1 : la > lb ? -1 : 0;
}

int
llm_tok_load(const struct gguf_file *f, struct llm_tok **ret_tok, char *err, size_t errlen)
{
	const struct gguf_kv *tokens, *types = NULL, *merges;
	struct gguf_str model, pre;
	uint64_t n, n_types = 0, n_merges;
	struct llm_tok *t;
	uint32_t v;
	int ret;

	if (gguf_get_str(f, "tokenizer.ggml.model", &model) < 0) {
		snprintf(err, errlen, "metadata tokenizer.ggml.model is missing");
		return -EINVAL;
	}
	if (!gguf_str_eq(model, "gpt2")) {
		snprintf(err, errlen,
			 "tokenizer '%.*s' is not supported (only gpt2 byte-level BPE)",
			 (int)model.len, model.ptr);
		return -ENOTSUP;
	}
	if (gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &n, &tokens) < 0 || !n ||
	    n > INT32_MAX) {
		snprintf(err, errlen, "metadata tokenizer.ggml.tokens is missing or not strings");
		return -EINVAL;
	}
	if (gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &n_merges, &merges) < 0) {
		snprintf(err, errlen, "metadata tokenizer.ggml.merges is missing or not strings");
		return -EINVAL;
	}
	if (gguf_find_kv(f, "tokenizer.ggml.token_type") &&
	    (gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &n_types, &types) < 0 ||
	     n_types != n)) {
		snprintf(err, errlen, "metadata tokenizer.ggml.token_type is not %llu i32",
			 (unsigned long long)n);
		return -EINVAL;
	}

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->n_vocab = (uint32_t)n;
	t->text = tokens->val.arr.strs;
	t->bos = t->eos = -ENOENT;
	if (!gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &v) && v < n)
		t->bos = (int)v;
	if (!gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &v) && v < n)
		t->eos = (int)v;
	t->digits_split = !gguf_get_str(f, "tokenizer.ggml.pre", &pre) &&
			  (gguf_str_eq(pre, "smollm") || gguf_str_eq(pre, "starcoder") ||
			   gguf_str_eq(pre, "refact") || gguf_str_eq(pre, "codeshell"));
	init_byte_map(t);

	ret = -ENOMEM;
	t->type = malloc(n * sizeof(*t->type));
	t->specials = malloc(n * sizeof(*t->specials));
	t->vocab_mask = pow2_at_least(2 * n) - 1;
	t->vocab = calloc((size_t)t->vocab_mask + 1, sizeof(*t->vocab));
	t->merges_mask = pow2_at_least(2 * n_merges) - 1;
	t->merges = calloc((size_t)t->merges_mask + 1, sizeof(*t->merges));
	if (!t->type || !t->specials || !t->vocab || !t->merges)
		goto err_free;

	for (uint32_t id = 0; id < n; id++) {
		const struct gguf_str *s = &t->text[id];
		uint32_t i;

		t->type[id] = types ? (int32_t)gguf_arr_int(&types->val, id) : LLM_TOK_NORMAL;
		if (t->type[id] == LLM_TOK_CONTROL || t->type[id] == LLM_TOK_USER_DEFINED)
			if (s->len)
				t->specials[t->n_specials++] = id;
		if (s->len > UINT32_MAX)
			continue;
		/* First id wins on duplicate texts, as in llama.cpp's token_to_id map. */
		for (i = (uint32_t)hash_bytes(s->ptr, s->len) & t->vocab_mask; t->vocab[i].ptr;
		     i = (i + 1) & t->vocab_mask)
			if (t->vocab[i].len == s->len && !memcmp(t->vocab[i].ptr, s->ptr, s->len))
				break;
		if (!t->vocab[i].ptr) {
			t->vocab[i].ptr = s->ptr ? s->ptr : "";
			t->vocab[i].len = (uint32_t)s->len;
			t->vocab[i].id = id;
		}
	}
	qsort_r(t->specials, t->n_specials, sizeof(*t->specials), cmp_special_len, t);

	for (int b = 0; b < 256; b++) {
		char buf[4];
		size_t l = put_utf8(buf, t->byte_cp[b]);
		int id = vocab_lookup(t, buf, l);

		t->byte_tok[b] = id < 0 ? UINT32_MAX : (uint32_t)id;
	}

	/* Merge "A B" (rank r) becomes (id(A), id(B)) -> (r, id(AB)). Tokens never hold a raw
	 * space (byte-level BPE maps it to U+0120), so the first space is the separator. */
	for (uint64_t r = 0; r < n_merges; r++) {
		const struct gguf_str *s = &merges->val.arr.strs[r];
		const char *sp = s->len ? memchr(s->ptr, ' ', s->len) : NULL;
		char buf[512];
		int a, b, ab;
		size_t la, lb;
		uint64_t key;
		uint32_t i;

		if (!sp) {
			snprintf(err, errlen, "merge %llu has no space", (unsigned long long)r);
			ret = -EINVAL;
			goto err_free;
		}
		la = (size_t)(sp - s->ptr);
		lb = s->len - la - 1;
		if (la + lb > sizeof(buf))
			continue;
		a = vocab_lookup(t, s->ptr, la);
		b = vocab_lookup(t, sp + 1, lb);
		memcpy(buf, s->ptr, la);
		memcpy(buf + la, sp + 1, lb);
		ab = vocab_lookup(t, buf, la + lb);
		if (a < 0 || b < 0 || ab < 0)
			continue; /* a merge whose result is not in the vocab can never apply */
		key = ((uint64_t)a << 32 | (uint32_t)b) + 1;
		for (i = (uint32_t)hash_u64(key) & t->merges_mask; t->merges[i].key;
		     i = (i + 1) & t->merges_mask)
			if (t->merges[i].key == key)
				break;
		if (!t->merges[i].key) {
			t->merges[i].key = key;
			t->merges[i].rank = (uint32_t)r;
			t->merges[i].merged = (uint32_t)ab;
		}
	}
	*ret_tok = t;
	return 0;

err_free:
	if (ret == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	llm_tok_free(t);
	return ret;
}

void
llm_tok_free(struct llm_tok *t)
{
	if (!t)
		return;
	free(t->type);
	free(t->specials);
	free(t->vocab);
	free(t->merges);
	free(t);
}

/* ---- pre-tokenizer ----------------------------------------------------------------------- */

enum cls { C_L, C_N, C_S, C_O }; /* letter, number, white space, other */

static enum cls
classify(uint32_t cp)
{
	uint32_t mask = U_GET_GC_MASK((UChar32)cp);

	if (mask & U_GC_L_MASK)
		return C_L;
	if (mask & U_GC_N_MASK)
		return C_N;
	if (u_isUWhiteSpace((UChar32)cp))
		return C_S;
	return C_O;
}

struct cpv {
	uint32_t cp;
	uint32_t off; /* byte offset of the code point in the text */
	uint8_t cls;
};

/* BPE over one pre-token's bytes; appends the resulting ids. */
static int
bpe_piece(const struct llm_tok *t, const uint8_t *p, size_t n, struct llm_ids *ids)
{
	uint32_t stack_sym[64], *sym = stack_sym;
	size_t ns = 0;
	int ret = 0;

	if (n > 64) {
		sym = malloc(n * sizeof(*sym));
		if (!sym)
			return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		sym[ns++] = t->byte_tok[p[i]];
	/* Repeatedly merge the adjacent pair of lowest rank (leftmost on ties), as GPT-2 does. */
	for (;;) {
		const struct pair_slot *best = NULL;
		size_t at = 0;

		for (size_t i = 0; i + 1 < ns; i++) {
			const struct pair_slot *s;

			if (sym[i] == UINT32_MAX || sym[i + 1] == UINT32_MAX)
				continue;
			s = merge_lookup(t, sym[i], sym[i + 1]);
			if (s && (!best || s->rank < best->rank)) {
				best = s;
				at = i;
			}
		}
		if (!best)
			break;
		sym[at] = best->merged;
		memmove(sym + at + 1, sym + at + 2, (ns - at - 2) * sizeof(*sym));
		ns--;
	}
	for (size_t i = 0; i < ns && !ret; i++)
		if (sym[i] != UINT32_MAX)
			ret = llm_ids_push(ids, sym[i]);
	if (sym != stack_sym)
		free(sym);
	return ret;
}

/*
 * The GPT-2 pattern over code points [s, e): returns the end of the pre-token starting at s.
 * Alternatives are tried in the pattern's order; each is greedy like the regex.
 */
static size_t
gpt2_match(const struct cpv *c, size_t s, size_t e)
{
	size_t i = s, j;

	if (c[s].cp == '\'' && s + 1 < e) {
		uint32_t a = c[s + 1].cp, b = s + 2 < e ? c[s + 2].cp : 0;

		if (a == 's' || a == 't' || a == 'm' || a == 'd')
			return s + 2;
		if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
			return s + 3;
	}
	/* " ?X+" for X in letters, numbers, other: the optional space binds to the run after it. */
	j = (c[i].cp == ' ' && i + 1 < e) ? i + 1 : i;
	if (c[j].cls != C_S) {
		enum cls k = c[j].cls;

		while (j < e && c[j].cls == k)
			j++;
		return j;
	}
	/* \s+(?!\S): the whitespace run, minus its last char when a non-space follows... */
	for (j = i; j < e && c[j].cls == C_S; j++)
		;
	if (j < e && j - i > 1)
		return j - 1;
	/* ...or \s+ when that leaves nothing (a single space char before a non-space). */
	return j;
}

static int
pretokenize(const struct llm_tok *t, const char *text, size_t len, struct llm_ids *ids)
{
	struct cpv *c;
	size_t n = 0, i = 0;
	int ret = 0;

	if (!len)
		return 0;
	c = malloc((len + 1) * sizeof(*c));
	if (!c)
		return -ENOMEM;
	while (i < len) {
		uint32_t cp;
		size_t l = get_utf8((const uint8_t *)text + i, len - i, &cp);

		c[n].cp = cp;
		c[n].off = (uint32_t)i;
		c[n].cls = (uint8_t)classify(cp);
		n++;
		i += l;
	}
	c[n].off = (uint32_t)len;

	for (size_t s = 0; s < n && !ret;) {
		size_t e = n;

		/* The "\p{N}" split: a digit is a piece; a non-digit run ends at the next digit. */
		if (t->digits_split) {
			if (c[s].cls == C_N) {
				e = s + 1;
			} else {
				for (e = s; e < n && c[e].cls != C_N; e++)
					;
			}
		}
		for (size_t p = s; p < e && !ret;) {
			size_t q = gpt2_match(c, p, e);

			ret = bpe_piece(t, (const uint8_t *)text + c[p].off, c[q].off - c[p].off,
					ids);
			p = q;
		}
		s = e;
	}
	free(c);
	return ret;
}

int
llm_tok_encode(const struct llm_tok *t, const char *text, size_t len, bool special,
	       struct llm_ids *ids)
{
	size_t start = 0, i = 0;
	int ret;

	if (!special)
		return pretokenize(t, text, len, ids);
	while (i < len) {
		uint32_t hit = UINT32_MAX;

		for (uint32_t k = 0; k < t->n_specials; k++) {
			const struct gguf_str *s = &t->text[t->specials[k]];

			if (s->len <= len - i && !memcmp(text + i, s->ptr, s->len)) {
				hit = t->specials[k]; /* longest first: the first hit wins */
				break;
			}
		}
		if (hit == UINT32_MAX) {
			i++;
			continue;
		}
		ret = pretokenize(t, text + start, i - start, ids);
		if (ret < 0)
			return ret;
		ret = llm_ids_push(ids, hit);
		if (ret < 0)
			return ret;
		i += t->text[hit].len;
		start = i;
	}
	return pretokenize(t, text + start, len - start, ids);
}

int
llm_tok_piece(const struct llm_tok *t, uint32_t id, bool special, char *buf, size_t cap)
{
	const struct gguf_str *s;
	size_t out = 0;

	if (id >= t->n_vocab)
		return -EINVAL;
	s = &t->text[id];
	if (t->type[id] == LLM_TOK_CONTROL) {
		if (!special)
			return 0;
		if (cap)
			memcpy(buf, s->ptr, s->len < cap ? s->len : cap);
		return (int)s->len;
	}
	if (t->type[id] == LLM_TOK_USER_DEFINED) {
		if (cap)
			memcpy(buf, s->ptr, s->len < cap ? s->len : cap);
		return (int)s->len;
	}
	for (size_t i = 0; i < s->len;) {
		uint32_t cp;
		size_t l = get_utf8((const uint8_t *)s->ptr + i, s->len - i, &cp);
		int b = cp < 512 ? t->cp_byte[cp] : -1;

		if (b >= 0) {
			if (out < cap)
				buf[out] = (char)b;
			out++;
		} else {
			/* Not a byte-level code point: copy its bytes through. */
			for (size_t k = 0; k < l; k++, out++)
				if (out < cap)
					buf[out] = s->ptr[i + k];
		}
		i += l;
	}
	return (int)out;
}

char *
llm_tok_decode(const struct llm_tok *t, const uint32_t *ids, size_t n, bool special)
{
	size_t len = 0, cap = 256;
	char *s = malloc(cap);

	if (!s)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		int k = llm_tok_piece(t, ids[i], special, s + len, cap - len - 1);

		if (k < 0)
			continue;
		if ((size_t)k >= cap - len - 1) {
			char *p;

			while ((size_t)k >= cap - len - 1)
				cap *= 2;
			p = realloc(s, cap);
			if (!p) {
				free(s);
				return NULL;
			}
			s = p;
			k = llm_tok_piece(t, ids[i], special, s + len, cap - len - 1);
		}
		len += (size_t)k;
	}
	s[len] = '\0';
	return s;
}

int
llm_tok_find(const struct llm_tok *t, const char *text)
{
	return vocab_lookup(t, text, strlen(text));
}

uint32_t
llm_tok_n_vocab(const struct llm_tok *t)
{
	return t->n_vocab;
}

int
llm_tok_type(const struct llm_tok *t, uint32_t id)
{
	return id < t->n_vocab ? t->type[id] : -EINVAL;
}

int
llm_tok_bos(const struct llm_tok *t)
{
	return t->bos;
}

int
llm_tok_eos(const struct llm_tok *t)
{
	return t->eos;
}

bool
llm_tok_is_eog(const struct llm_tok *t, uint32_t id)
{
	static const char *const eog[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>",
					  "</s>"};

	if ((int)id == t->eos)
		return true;
	if (id >= t->n_vocab || t->type[id] != LLM_TOK_CONTROL)
		return false;
	for (size_t i = 0; i < sizeof(eog) / sizeof(eog[0]); i++)
		if (gguf_str_eq(t->text[id], eog[i]))
			return true;
	return false;
}
