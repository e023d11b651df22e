/* SPDX-License-Identifier: MIT */
/*
 * kvdump.h - the key/query dump of a real decode (kvtier-llm --dump-kv FILE), read by
 * kvtier-bench-retrieval --data real --keys FILE.
 *
 * File layout (little-endian, what x86-64 and arm64 write natively):
 *	struct llm_kvdump_hdr				64 bytes
 *	n_tokens records of rec_bytes each, in decode order:
 *		uint32_t seq				run (sequence) index, 0 .. n_seqs - 1
 *		uint32_t pos				position inside that sequence
 *		uint16_t k[layers][kv_heads][head_dim]	post-RoPE keys, IEEE half
 *		uint16_t q[layers][q_heads][head_dim]	post-RoPE queries, IEEE half
 * rec_bytes = 8 + 2 * layers * (kv_heads + q_heads) * head_dim. Query head h reads kv head
 * h / (q_heads / kv_heads) (GQA), so the keys a query of head h scores are k[.][h / group].
 * Every prompt token and every generated token has a record: the keys are exactly the rows the
 * KV cache holds, the queries those the attention used at that step.
 *
 * Appending: a run on an existing file checks the geometry and continues it as sequence
 * n_seqs. The header's counts are rewritten after each sequence ends, so a run killed midway
 * leaves a valid file of the sequences that completed (the partial tail is cut on the next open).
 */
#ifndef KVT_LLM_KVDUMP_H
#define KVT_LLM_KVDUMP_H

#include <stddef.h>
#include <stdint.h>

#define LLM_KVDUMP_MAGIC   "KVTKQDMP" /* 8 bytes, no NUL */
#define LLM_KVDUMP_VERSION 1u
#define LLM_KVDUMP_F16	   0u /* dtype: KVT_DTYPE_F16's value (proto/kvt_abi.h) */

struct llm_kvdump_hdr {
	char magic[8];	    /* LLM_KVDUMP_MAGIC */
	uint32_t version;   /* LLM_KVDUMP_VERSION */
	uint32_t hdr_bytes; /* sizeof(struct llm_kvdump_hdr): records start here */
	uint32_t layers;
	uint32_t kv_heads;
	uint32_t q_heads; /* a multiple of kv_heads */
	uint32_t head_dim;
	uint32_t dtype;	      /* LLM_KVDUMP_F16 */
	uint32_t rec_bytes;   /* bytes per token record, see above */
	uint64_t n_tokens;    /* records in the file */
	uint32_t n_seqs;      /* sequences (runs or prompts) */
	uint32_t reserved[3]; /* zero */
};
_Static_assert(sizeof(struct llm_kvdump_hdr) == 64, "llm_kvdump_hdr layout");

static inline uint64_t
llm_kvdump_rec_bytes(uint32_t layers, uint32_t kv_heads, uint32_t q_heads, uint32_t head_dim)
{
	return 8 + 2 * (uint64_t)layers * (kv_heads + q_heads) * head_dim;
}

/*
 * llm_kvdump_hdr_check() - whether @h describes a dump this code reads, and a file of
 * @file_bytes bytes holds all its records. Returns NULL or a reason a person can act on.
 */
static inline const char *
llm_kvdump_hdr_check(const struct llm_kvdump_hdr *h, uint64_t file_bytes)
{
	if (file_bytes < sizeof(*h) || __builtin_memcmp(h->magic, LLM_KVDUMP_MAGIC, 8))
		return "not a kvtier-llm --dump-kv file (bad magic)";
	if (h->version != LLM_KVDUMP_VERSION || h->hdr_bytes != sizeof(*h))
		return "unsupported dump version (remake it with this kvtier-llm)";
	if (h->dtype != LLM_KVDUMP_F16)
		return "unsupported dtype (only f16 dumps exist)";
	if (!h->layers || !h->kv_heads || !h->q_heads || !h->head_dim || h->layers > 1024 ||
	    h->q_heads > 1024 || h->head_dim > 1024 || h->q_heads % h->kv_heads)
		return "bad geometry (layers, heads or head_dim zero, too large, or q_heads not a "
		       "multiple of kv_heads)";
	if (h->rec_bytes != llm_kvdump_rec_bytes(h->layers, h->kv_heads, h->q_heads, h->head_dim))
		return "record size does not match the geometry";
	if (h->reserved[0] || h->reserved[1] || h->reserved[2])
		return "reserved header fields are not zero";
	if (h->n_tokens > (file_bytes - sizeof(*h)) / h->rec_bytes)
		return "file shorter than its token count (truncated copy?)";
	return NULL;
}

struct llm_kvdump;
struct llm_config;

/*
 * llm_kvdump_open() - open (creating it if absent) the dump at @path for a model of geometry
 * @cfg and start a new sequence in it. An existing file must hold the same geometry; a tail
 * past its counted records (a killed run) is cut off. On failure a reason goes to @err.
 * Returns 0, -EINVAL (not a dump, or another geometry), -ENOMEM, or an open/read/write error.
 */
int llm_kvdump_open(const char *path, const struct llm_config *cfg, struct llm_kvdump **ret_d,
		    char *err, size_t errlen);

/* Records layer @layer's post-RoPE queries @q (q_heads * head_dim) and keys @k (kv_heads *
 * head_dim) of the current token. */
void llm_kvdump_layer(struct llm_kvdump *d, uint32_t layer, const float *q, const float *k);

/* Writes the current token's record (position @pos). Returns 0 or a write error. */
int llm_kvdump_token(struct llm_kvdump *d, uint32_t pos);

/*
 * llm_kvdump_close() - count the sequence in the header and close. NULL is a no-op.
 * Returns 0 or a write error (the sequence's records are then not counted).
 */
int llm_kvdump_close(struct llm_kvdump *d);

/* Closes without counting the sequence (a failed run): the next open cuts its records off. */
void llm_kvdump_discard(struct llm_kvdump *d);

#endif /* KVT_LLM_KVDUMP_H */
