/* SPDX-License-Identifier: MIT */
/*
 * seq_t2.c - the int8 (T2) slot layout (seq_int.h): quantizing positions out of their T1 slots,
 * the per-channel key-scale blocks they share, dequantizing a row back, and restoring the blocks
 * after a restart.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "seq_int.h"

/*
 * Codes and scales of row r (2 * layer + K|V) of a T2 slot. *ret_channel is true when the
 * scales are per channel (H * D of them, a key under KVT_T2_F_KEY_CHANNEL), else per head (H).
 */
const int8_t *
seq_t2_row(const struct kvtd_seq *q, const uint8_t *slot, uint32_t r, const float **ret_scales,
	   bool *ret_channel)
{
	uint64_t H = q->p.kv_heads, n = H * q->p.head_dim, codes = 2 * (uint64_t)q->p.layers * n;

	*ret_channel = key_channel(q) && !(r & 1);
	if (!key_channel(q))
		*ret_scales = (const float *)(slot + codes) + r * H;
	else if (r & 1)
		*ret_scales = (const float *)(slot + codes) + (r / 2) * H;
	else
		*ret_scales = t2_kblk(q, slot)->scale + (r / 2) * n;
	return (const int8_t *)slot + r * n;
}

/* Dequantizes heads h0 .. h0 + nh - 1 of T2 row r into @dst (@dtype). */
void
seq_t2_dequant(const struct kvtd_seq *q, const uint8_t *slot, uint32_t r, uint32_t h0, uint32_t nh,
	       int dtype, void *dst)
{
	uint32_t D = q->p.head_dim;
	const float *sc;
	bool ch;
	const int8_t *codes = seq_t2_row(q, slot, r, &sc, &ch) + (uint64_t)h0 * D;

	if (ch)
		kvt_dequant_block_ch(dtype, nh * D, codes, sc + (uint64_t)h0 * D, 1, dst,
				     (uint64_t)nh * D * kvt_dtype_size(dtype));
	else
		kvt_dequant_rows(dtype, nh, D, codes, sc + h0, 1, dst,
				 (uint64_t)nh * D * kvt_dtype_size(dtype));
}

int
seq_quant_room_get(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint32_t n,
		   struct quant_room *qr)
{
	uint64_t HD = (uint64_t)q->p.kv_heads * q->p.head_dim;
	int r;

	memset(qr, 0, sizeof(*qr));
	if (!n)
		return 0;
	qr->n = n;
	qr->nkb = key_channel(q) ? (n + KVT_T2_KEY_BLOCK - 1) / KVT_T2_KEY_BLOCK : 0;
	qr->qs = kvtd_scratch_get(x->scr, SCR_QUANT_SLOTS, ((size_t)n + qr->nkb) * sizeof(void *));
	if (qr->nkb)
		qr->tmp =
		    kvtd_scratch_get(x->scr, SCR_QUANT_TMP, KVT_T2_KEY_BLOCK * (q->row_bytes + HD));
	if (!qr->qs || (qr->nkb && !qr->tmp)) {
		r = -ENOMEM;
		goto err;
	}
	qr->kb = qr->qs + n;
	r = kvtd_pool_alloc(x->pool, q->cls_q, n, x->acct, x->uid_acct, qr->qs);
	if (r < 0)
		goto err;
	if (qr->nkb) {
		r = kvtd_pool_alloc(x->pool, q->cls_kb, qr->nkb, x->acct, x->uid_acct, qr->kb);
		if (r < 0) {
			kvtd_pool_free(x->pool, q->cls_q, n, x->acct, x->uid_acct, qr->qs);
			goto err;
		}
	}
	return 0;
err:
	memset(qr, 0, sizeof(*qr));
	return r;
}

/* Gives back what seq_quant_room_get() took and seq_quantize_positions() did not use. */
void
seq_quant_room_put(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, struct quant_room *qr,
		   bool used)
{
	if (!used && qr->n) {
		kvtd_pool_free(x->pool, q->cls_q, qr->n, x->acct, x->uid_acct, qr->qs);
		if (qr->nkb)
			kvtd_pool_free(x->pool, q->cls_kb, qr->nkb, x->acct, x->uid_acct, qr->kb);
	}
	memset(qr, 0, sizeof(*qr)); /* the lists stay in the scratch */
}

/* Keys of positions pos[0..m) into the key-scale block @b and their T2 slots (channel mode). */
static void
quantize_key_block(struct kvtd_seq *q, const uint32_t *pos, void *const *qs, uint32_t m,
		   struct kblk *b, uint8_t *tmp)
{
	uint64_t HD = (uint64_t)q->p.kv_heads * q->p.head_dim;
	int8_t *codes = (int8_t *)(tmp + KVT_T2_KEY_BLOCK * q->row_bytes);

	b->refs = m;
	for (uint32_t l = 0; l < q->p.layers; l++) {
		for (uint32_t i = 0; i < m; i++)
			memcpy(tmp + i * q->row_bytes,
			       (const uint8_t *)q->slot[pos[i]] + 2 * l * q->row_bytes,
			       q->row_bytes);
		kvt_quant_block_ch(q->p.dtype, (uint32_t)HD, tmp, q->row_bytes, m, codes,
				   b->scale + l * HD);
		for (uint32_t i = 0; i < m; i++)
			memcpy((int8_t *)qs[i] + 2 * l * HD, codes + i * HD, HD);
	}
}

/* T1 -> T2: quantize each position's rows into its int8 slot (from @qr) and give back its
 * full-precision slot. */
void
seq_quantize_positions(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint32_t *pos,
		       struct quant_room *qr)
{
	uint32_t H = q->p.kv_heads, D = q->p.head_dim, L = q->p.layers, n = qr->n;
	uint64_t HD = (uint64_t)H * D;
	void **qs = qr->qs;

	if (!key_channel(q)) {
		for (uint32_t i = 0; i < n; i++)
			kvt_quant_rows(q->p.dtype, H, D, q->slot[pos[i]], q->row_bytes, 2u * L,
				       qs[i], (float *)((int8_t *)qs[i] + 2 * L * HD));
	} else {
		for (uint32_t i = 0; i < n; i += KVT_T2_KEY_BLOCK) {
			uint32_t m = n - i < KVT_T2_KEY_BLOCK ? n - i : KVT_T2_KEY_BLOCK;
			struct kblk *b = qr->kb[i / KVT_T2_KEY_BLOCK];

			quantize_key_block(q, pos + i, qs + i, m, b, qr->tmp);
			for (uint32_t j = i; j < i + m; j++) {
				const uint8_t *old = q->slot[pos[j]];
				int8_t *c = qs[j];
				float *vs = (float *)(c + 2 * L * HD);

				for (uint32_t l = 0; l < L; l++)
					kvt_quant_rows(
					    q->p.dtype, H, D, old + (2 * l + 1) * q->row_bytes,
					    q->row_bytes, 1, c + (2 * l + 1) * HD, vs + l * H);
				memcpy(c + q->q_bytes - sizeof(b), &b, sizeof(b));
			}
		}
		q->n_kblk += qr->nkb;
	}
	for (uint32_t i = 0; i < n; i++) {
		void *old = q->slot[pos[i]];

		q->slot[pos[i]] = qs[i];
		qs[i] = old;
	}
	/* a shared row stays the block's: this sequence only drops its reference (COW) */
	for (uint32_t done = 0; done < n; done += COPY_BATCH)
		seq_t1_release(x, q, pos + done, qs + done,
			       n - done < COPY_BATCH ? n - done : COPY_BATCH);
	q->bytes_quant += (uint64_t)n * q->q_bytes;
}

/* Drops a T2 slot's reference to its key-scale block, freeing the block with the last one. */
void
seq_kblk_put(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint8_t *slot)
{
	struct kblk *b = t2_kblk(q, slot);
	void *v = b;

	if (--b->refs)
		return;
	kvtd_pool_free(x->pool, q->cls_kb, 1, x->acct, x->uid_acct, &v);
	q->n_kblk--;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * The key-scale blocks of a restored sequence: a T2 slot holds the block's address in the old
 * process, which becomes an offset (claimed once per block) and then the new address. Every
 * block's reference count must equal the T2 slots that name it.
 */
int
seq_restore_kblks(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint64_t old_base)
{
	struct kvtd_pool *pool = x->pool;
	uint64_t *offs, n = 0, kb = kvtd_pool_slot_size(pool, q->cls_kb);
	int r = 0;

	if (!q->ts.n_int8)
		return 0;
	offs = malloc(q->ts.n_int8 * sizeof(*offs));
	if (!offs)
		return -ENOMEM;
	for (uint32_t i = 0; i < q->ts.n; i++) {
		uint8_t *slot = q->slot[i];
		uintptr_t a;

		if (!(q->ts.tier[i] & KVT_TIER_F_INT8))
			continue;
		memcpy(&a, slot + q->q_bytes - sizeof(a), sizeof(a));
		if (a < old_base || a - old_base >= pool->size || (a - old_base) % 64) {
			r = -EINVAL;
			goto out;
		}
		offs[n++] = a - old_base;
	}
	qsort(offs, n, sizeof(*offs), cmp_u64);
	for (uint64_t i = 0; i < n;) {
		uint64_t j = i;
		struct kblk *b;
		void *p;

		while (j < n && offs[j] == offs[i])
			j++;
		r = kvtd_pool_claim(pool, q->cls_kb, offs[i], x->acct, x->uid_acct, &p);
		if (r < 0)
			goto out;
		b = p;
		q->n_kblk++;
		if (b->refs != j - i || kb < kblk_bytes(&q->p)) {
			r = -EINVAL;
			goto out;
		}
		i = j;
	}
	for (uint32_t i = 0; i < q->ts.n; i++) {
		uint8_t *slot = q->slot[i];
		uintptr_t a;

		if (!(q->ts.tier[i] & KVT_TIER_F_INT8))
			continue;
		memcpy(&a, slot + q->q_bytes - sizeof(a), sizeof(a));
		a = (uintptr_t)pool->base + (a - old_base);
		memcpy(slot + q->q_bytes - sizeof(a), &a, sizeof(a));
	}
out:
	free(offs);
	return r;
}
