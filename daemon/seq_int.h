/* SPDX-License-Identifier: MIT */
/*
 * seq_int.h - what the sequence files share, not for use outside them:
 *   seq.c       open/close, append, score, slot reservation, restore
 *   seq_t2.c    the int8 (T2) slot layout: quantize, key-scale blocks, dequantize
 *   seq_copy.c  RETIER and FETCH: rows to the device in batches
 *   seq_topk.c  retrieval: index pages, encoding keys, TOPK
 *
 * Pool slot of a position: a T1 slot (token_bytes, the rows as appended) or, once quantized, a
 * T2 slot (q_bytes) of int8 codes [2L][H*D] (row r = 2 * layer + K|V) and then
 *   - by default: f32 scales [2L][H], one per (layer, K|V, head);
 *   - with KVT_T2_F_KEY_CHANNEL: f32 value scales [L][H], then a pointer to the key-scale block
 *     the position was quantized in: a pool slot holding a reference count and f32 scales
 *     [L][H*D], one per (layer, channel), shared by up to KVT_T2_KEY_BLOCK positions and freed
 *     with the last of them.
 * The hierarchy is inclusive: a T0 position keeps its pool slot, so demotion never copies.
 */
#ifndef KVTD_SEQ_INT_H
#define KVTD_SEQ_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kvt_dev.h"
#include "quant.h"
#include "scratch.h"
#include "seq.h"

#define COPY_BATCH 256 /* rows per device copy call */

_Static_assert(KVT_T2_KEY_BLOCK == KVT_QUANT_KEY_BLOCK, "per-channel key block");

/* The buffers of x->scr (struct kvtd_scratch): what an op needs for its own duration. */
enum {
	SCR_BATCH,	 /* struct row_batch and its dequantized rows (seq_batch_start()) */
	SCR_QUANT_SLOTS, /* struct quant_room's slot lists */
	SCR_QUANT_TMP,	 /* struct quant_room's key rows and codes */
	SCR_QUERY,	 /* TOPK's private copy of the query */
};
_Static_assert(SCR_QUERY < KVTD_SCRATCH_BUFS, "scratch buffers");

/* A block of per-channel key scales (KVT_T2_F_KEY_CHANNEL). */
struct kblk {
	uint32_t refs; /* T2 slots pointing here */
	uint32_t pad;
	float scale[]; /* [L][H*D] */
};

static inline bool
key_channel(const struct kvtd_seq *q)
{
	return q->p.t2_flags & KVT_T2_F_KEY_CHANNEL;
}

static inline uint64_t
kblk_bytes(const struct kvt_seq_params *p)
{
	return sizeof(struct kblk) + (uint64_t)p->layers * p->kv_heads * p->head_dim * 4;
}

static inline struct kblk *
t2_kblk(const struct kvtd_seq *q, const uint8_t *slot)
{
	struct kblk *b;

	memcpy(&b, slot + q->q_bytes - sizeof(b), sizeof(b));
	return b;
}

/* Device address of (slot, layer, kv) in a strided region. */
static inline uint64_t
t0_off(const struct kvt_seq_params *p, uint32_t slot, uint32_t l, uint32_t kv)
{
	return p->t0_base_off + l * p->t0_layer_stride + kv * p->t0_kv_stride +
	       slot * p->t0_slot_stride;
}

static inline uint64_t
stage_off(const struct kvt_seq_params *p, uint32_t row, uint32_t l, uint32_t kv)
{
	return p->stage_base_off + l * p->stage_layer_stride + kv * p->stage_kv_stride +
	       row * p->stage_slot_stride;
}

/* seq.c */
int seq_ensure_ws(struct kvtd_seq *q);
/* Session buffer @id with a reference taken, once checked to hold a region of the sequence's
 * layers at @base with these strides and @slots rows; else NULL and *@ret_err (-ENOENT: not
 * registered, -ERANGE: too small), the reason set. */
struct kvt_dev_buf *seq_region_get(const struct kvtd_seq_ctx *x, uint32_t id, uint64_t base,
				   const struct kvt_seq_params *p, uint64_t layer_stride,
				   uint64_t kv_stride, uint32_t slots, uint64_t slot_stride,
				   uint64_t row_bytes, int *ret_err);
/* Return the pool slots of @n positions (T1 or T2 each, by their tier flag). */
void seq_free_positions(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint32_t *pos,
			uint32_t n);
/* Release the T1 slots @slots (at most COPY_BATCH) that positions @pos held: the sequence's own
 * go back to the pool, a shared block's lose this position's reference. */
void seq_t1_release(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint32_t *pos,
		    void *const *slots, uint32_t n);

/* seq_t2.c */
/*
 * Codes and scales of row r (2 * layer + K|V) of a T2 slot. *ret_channel is true when the
 * scales are per channel (H * D of them, a key under KVT_T2_F_KEY_CHANNEL), else per head (H).
 */
const int8_t *seq_t2_row(const struct kvtd_seq *q, const uint8_t *slot, uint32_t r,
			 const float **ret_scales, bool *ret_channel);
/* Dequantizes heads h0 .. h0 + nh - 1 of T2 row r into @dst (@dtype). */
void seq_t2_dequant(const struct kvtd_seq *q, const uint8_t *slot, uint32_t r, uint32_t h0,
		    uint32_t nh, int dtype, void *dst);
/* Drops a T2 slot's reference to its key-scale block, freeing the block with the last one. */
void seq_kblk_put(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint8_t *slot);
/*
 * Room for quantizing @n positions, taken before anything moves: their T2 slots and, with
 * per-channel keys, ceil(n / KVT_T2_KEY_BLOCK) key-scale blocks (@kb) and the row scratch (@tmp:
 * a block of key rows, then their codes). All or nothing.
 */
struct quant_room {
	void **qs, **kb;
	uint8_t *tmp;
	uint32_t n, nkb;
};
int seq_quant_room_get(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint32_t n,
		       struct quant_room *qr);
/* Gives back what seq_quant_room_get() took and seq_quantize_positions() did not use. */
void seq_quant_room_put(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, struct quant_room *qr,
			bool used);
/* T1 -> T2: quantize each position's rows into its int8 slot (from @qr) and give back its
 * full-precision slot. */
void seq_quantize_positions(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint32_t *pos,
			    struct quant_room *qr);
/*
 * The key-scale blocks of a restored sequence: a T2 slot holds the block's address in the old
 * process, which becomes an offset (claimed once per block) and then the new address. Every
 * block's reference count must equal the T2 slots that name it.
 */
int seq_restore_kblks(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint64_t old_base);

/* seq_copy.c */
/*
 * Copy rows to the device in batches. @dst(i, l, kv) gives each row's buffer offset; rows of
 * T2 positions are dequantized into a staging area first (one per batch entry).
 */
struct row_batch {
	const struct kvtd_seq_ctx *x;
	struct kvt_dev_buf *buf;
	struct kvt_dev_copy rows[COPY_BATCH];
	uint8_t *tmp; /* COPY_BATCH rows */
	unsigned n;
	bool last_t1; /* rows[n - 1] reads a T1 pool slot: a following row may extend it */
	uint64_t bytes, bytes_t2; /* rows added; of them, dequantized from T2 */
};
/* An empty batch of rows to @buf in x->scr (valid until the op's next seq_batch_start()).
 * Returns NULL when out of memory. */
struct row_batch *seq_batch_start(const struct kvtd_seq_ctx *x, const struct kvtd_seq *q,
				  struct kvt_dev_buf *buf);
int seq_batch_flush(struct row_batch *b);
/* Queue the row (@pos, @l, @kv) to @dst_off. A T1 row that continues the previous one on both
 * sides (the same slot's next row to the next bytes of the buffer: K then V of a layer, where
 * the region keeps them adjacent) extends that copy instead of taking an entry. */
int seq_batch_add(struct row_batch *b, const struct kvtd_seq *q, uint32_t pos, uint32_t l,
		  uint32_t kv, uint64_t dst_off);

/* seq_topk.c */
int seq_retrieval_init(const struct kvtd_seq_ctx *x, struct kvtd_seq *q);
/* After an append: encode the keys that left the dense window (every U tokens). */
int seq_retrieval_flush(struct kvtd_seq *q);
/* The stored keys of positions @pos[0..n) changed (quantized to int8 with their tier flag set,
 * or their slots replaced): their sketch entries follow, where a retrieval zone holds them. */
void seq_retrieval_rekey(struct kvtd_seq *q, const uint32_t *pos, uint32_t n);

#endif
