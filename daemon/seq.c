/* SPDX-License-Identifier: MIT */
/*
 * seq.c - sequences: the daemon side of APPEND, SCORE_ADD, RETIER and FETCH. The tier engine
 * (engine/tier.h) decides; this file owns the pool slots and moves the rows.
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
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_dev.h"
#include "kvtd.h"
#include "log.h"
#include "ops.h"
#include "quant.h"
#include "seq.h"
#include "session.h"

#define COPY_BATCH 256 /* rows per device copy call */

_Static_assert(KVT_T2_KEY_BLOCK == KVT_QUANT_KEY_BLOCK, "per-channel key block");

/* A block of per-channel key scales (KVT_T2_F_KEY_CHANNEL). */
struct kblk {
	uint32_t refs; /* T2 slots pointing here */
	uint32_t pad;
	float scale[]; /* [L][H*D] */
};

static bool
key_channel(const struct kvtd_seq *q)
{
	return q->p.t2_flags & KVT_T2_F_KEY_CHANNEL;
}

static uint64_t
kblk_bytes(const struct kvt_seq_params *p)
{
	return sizeof(struct kblk) + (uint64_t)p->layers * p->kv_heads * p->head_dim * 4;
}

static struct kblk *
t2_kblk(const struct kvtd_seq *q, const uint8_t *slot)
{
	struct kblk *b;

	memcpy(&b, slot + q->q_bytes - sizeof(b), sizeof(b));
	return b;
}

/*
 * Codes and scales of row r (2 * layer + K|V) of a T2 slot. *ret_channel is true when the
 * scales are per channel (H * D of them, a key under KVT_T2_F_KEY_CHANNEL), else per head (H).
 */
static const int8_t *
t2_row(const struct kvtd_seq *q, const uint8_t *slot, uint32_t r, const float **ret_scales,
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
static void
t2_dequant(const struct kvtd_seq *q, const uint8_t *slot, uint32_t r, uint32_t h0, uint32_t nh,
	   int dtype, void *dst)
{
	uint32_t D = q->p.head_dim;
	const float *sc;
	bool ch;
	const int8_t *codes = t2_row(q, slot, r, &sc, &ch) + (uint64_t)h0 * D;

	if (ch)
		kvt_dequant_block_ch(dtype, nh * D, codes, sc + (uint64_t)h0 * D, 1, dst,
				     (uint64_t)nh * D * kvt_dtype_size(dtype));
	else
		kvt_dequant_rows(dtype, nh, D, codes, sc + h0, 1, dst,
				 (uint64_t)nh * D * kvt_dtype_size(dtype));
}

static struct kvtd_acct *
uid_acct(struct kvtd_session *s)
{
	return s->uid_ent ? &s->uid_ent->acct : NULL;
}

/*
 * The last byte a strided region touches, checked for overflow: base + (layers-1)*layer_stride
 * + kv_stride + (slots-1)*slot_stride + row_bytes must fit in the buffer.
 */
static int
region_fits(uint64_t buf_size, uint64_t base, uint64_t layers, uint64_t layer_stride,
	    uint64_t kv_stride, uint64_t slots, uint64_t slot_stride, uint64_t row_bytes)
{
	uint64_t a, b, end;

	if (!slots)
		return 0;
	if (__builtin_mul_overflow(layers - 1, layer_stride, &a) ||
	    __builtin_mul_overflow(slots - 1, slot_stride, &b) ||
	    __builtin_add_overflow(base, a, &end) || __builtin_add_overflow(end, b, &end) ||
	    __builtin_add_overflow(end, kv_stride, &end) ||
	    __builtin_add_overflow(end, row_bytes, &end))
		return 0;
	return end <= buf_size;
}

/* Geometry and layout; the tiering fields are the engine's to check (kvt_tier_cfg_init()). */
static int
params_check(const struct kvt_seq_params *p, const char **why)
{
	const uint64_t *res = p->reserved;

	*why = NULL;
	if (p->size < sizeof(*p))
		*why = "size smaller than struct kvt_seq_params";
	else if (res[0] || res[1] || p->reserved0 || p->ret_flags)
		*why = "reserved field not zero";
	else if (p->t2_flags & ~KVT_T2_F_KEY_CHANNEL)
		*why = "unknown t2_flags";
	else if (!p->layers || p->layers > KVT_MAX_LAYERS)
		*why = "layers out of range";
	else if (!p->kv_heads || p->kv_heads > KVT_MAX_KV_HEADS)
		*why = "kv_heads out of range";
	else if (!p->head_dim || p->head_dim > KVT_MAX_HEAD_DIM)
		*why = "head_dim out of range";
	else if (p->dtype >= KVT_DTYPE__COUNT)
		*why = "unknown dtype";
	else if (p->stage_buf_id && !p->stage_slots)
		*why = "stage_slots must be > 0 with a staging region";
	else if (!p->t0_buf_id && p->t0_slots)
		*why = "t0_slots without a T0 region";
	else if (p->q_heads % p->kv_heads || p->q_heads > 8 * KVT_MAX_KV_HEADS)
		*why = "q_heads must be a multiple of kv_heads";
	else if (p->ret_update && p->head_dim != 64 && p->head_dim != 128)
		*why = "retrieval (ret_update > 0) needs head_dim 64 or 128";
	return *why ? -EINVAL : 0;
}

static struct kvt_dev_buf *
region_get(struct kvtd_session *s, uint32_t id, uint64_t base, const struct kvt_seq_params *p,
	   uint64_t layer_stride, uint64_t kv_stride, uint32_t slots, uint64_t slot_stride,
	   uint64_t row_bytes, int *ret_err)
{
	struct kvt_dev_buf *b = kvtd_session_buf(s, id);

	if (!b) {
		*ret_err =
		    kvtd_op_fail(s, -ENOENT, "buffer %u is not registered by this session", id);
		return NULL;
	}
	if (!region_fits(kvt_dev_buf_size(b), base, p->layers, layer_stride, kv_stride, slots,
			 slot_stride, row_bytes)) {
		*ret_err = kvtd_op_fail(
		    s, -ERANGE, "the layout (%u slots) in buffer %u runs past its %llu bytes",
		    slots, id, (unsigned long long)kvt_dev_buf_size(b));
		return NULL;
	}
	kvt_dev_buf_get(b);
	return b;
}

/* Grow the per-position state to hold @need positions. */
static int
seq_ensure_cap(struct kvtd_seq *q, uint64_t need)
{
	struct kvt_tier_seq nts;
	uint64_t cap = q->ts.cap ? q->ts.cap : 1024;
	size_t size;
	void *mem, *slot;
	int r;

	if (need <= q->ts.cap && q->ts_mem)
		return 0;
	if (need > KVT_TIER_MAX_CAP || (q->p.max_tokens && need > q->p.max_tokens))
		return -ENOSPC;
	while (cap < need)
		cap *= 2;
	if (q->p.max_tokens && cap > q->p.max_tokens)
		cap = q->p.max_tokens;
	if (cap > KVT_TIER_MAX_CAP)
		cap = KVT_TIER_MAX_CAP;
	size = kvt_tier_seq_bytes((uint32_t)cap, q->cfg.t0_slots);
	mem = malloc(size);
	slot = realloc(q->slot, cap * sizeof(*q->slot));
	if (!mem || !slot) {
		free(mem);
		if (slot)
			q->slot = slot;
		return -ENOMEM;
	}
	q->slot = slot;
	memset(q->slot + q->ts.cap, 0, (cap - q->ts.cap) * sizeof(*q->slot));
	if (q->ts_mem)
		r = kvt_tier_seq_move(&nts, mem, size, (uint32_t)cap, &q->ts);
	else
		r = kvt_tier_seq_init(&nts, mem, size, (uint32_t)cap, q->cfg.t0_slots);
	if (r < 0) {
		free(mem);
		return r;
	}
	free(q->ts_mem);
	q->ts_mem = mem;
	q->ts_size = size;
	q->ts = nts;
	return 0;
}

static int
seq_ensure_ws(struct kvtd_seq *q)
{
	size_t need = kvt_tier_ws_bytes(q->ts.n, q->cfg.t0_slots, q->cfg.delta);
	/* FETCH keeps its private position list there too. */
	size_t list = (size_t)q->ts.n * sizeof(uint32_t) + 64;
	void *ws;

	if (list > need)
		need = list;
	if (need <= q->ws_size)
		return 0;
	need += need / 2;
	ws = malloc(need);
	if (!ws)
		return -ENOMEM;
	free(q->ws);
	q->ws = ws;
	q->ws_size = need;
	return 0;
}

/* Index pages come from the pool, charged to the session like rows. */
static void *
page_get(void *ctx, size_t len)
{
	struct kvtd_seq *q = ctx;
	struct kvtd_session *s = q->owner;
	void *p;

	if (kvtd_pool_alloc(&s->d->pool, q->cls_pg, 1, &s->acct,
			    s->uid_ent ? &s->uid_ent->acct : NULL, &p) < 0)
		return NULL;
	return p;
}

static void
page_put(void *ctx, void *page, size_t len)
{
	struct kvtd_seq *q = ctx;
	struct kvtd_session *s = q->owner;

	kvtd_pool_free(&s->d->pool, q->cls_pg, 1, &s->acct, s->uid_ent ? &s->uid_ent->acct : NULL,
		       &page);
}

static int
retrieval_init(struct kvtd_session *s, struct kvtd_seq *q)
{
	const struct kvt_seq_params *p = &q->p;
	struct kvt_paris_geom g = {p->layers, p->q_heads ? p->q_heads : p->kv_heads, p->kv_heads,
				   p->head_dim};
	struct kvt_paris_zone_cfg z = {p->sinks, p->window, p->ret_update, 0};
	struct kvt_paris_alloc a = {page_get, page_put, q};
	unsigned page_keys = KVT_PARIS_PAGE_KEYS;
	struct kvt_srht rot;
	int r;

	/* A page must fit in one pool chunk. */
	while (page_keys > 64 &&
	       kvt_paris_page_bytes(p->head_dim, page_keys) > s->d->pool.chunk_size)
		page_keys /= 2;
	r = kvtd_pool_class_get(&s->d->pool, kvt_paris_page_bytes(p->head_dim, page_keys));
	if (r < 0)
		return r;
	q->cls_pg = r;
	q->owner = s;
	/* The rotation is a pure function of (dim, seed): every daemon and restart agrees. */
	r = kvt_srht_init(&rot, p->head_dim, KVT_SRHT_SEED);
	if (r < 0)
		return r;
	q->paris = calloc(1, sizeof(*q->paris));
	q->keybuf = malloc(sizeof(float) * p->kv_heads * p->head_dim * 256);
	if (!q->paris || !q->keybuf)
		return -ENOMEM;
	r = kvt_paris_seq_init(q->paris, &g, &z, &rot, page_keys, &a);
	if (r < 0) {
		free(q->paris);
		q->paris = NULL;
	}
	return r;
}

/*
 * The key of (pos, layer), kv heads h0 .. h0 + nh - 1, as f32 ([nh][head_dim]), whatever the
 * pool holds (full precision, or int8 dequantized).
 */
static void
key_f32(const struct kvtd_seq *q, uint32_t pos, uint32_t l, uint32_t h0, uint32_t nh, float *out)
{
	uint32_t D = q->p.head_dim, m = nh * D;
	const uint8_t *slot = q->slot[pos];
	const void *row;

	if (!slot) { /* evicted before it left the dense window: it can never be retrieved */
		memset(out, 0, m * sizeof(float));
		return;
	}
	if (q->ts.tier[pos] & KVT_TIER_F_INT8) {
		t2_dequant(q, slot, 2 * l, h0, nh, KVT_DTYPE_F32, out);
		return;
	}
	row = slot + (uint64_t)2 * l * q->row_bytes;
	kvt_to_f32(q->p.dtype, (const uint8_t *)row + (uint64_t)h0 * D * kvt_dtype_size(q->p.dtype),
		   m, out);
}

/* TOPK's exact refine stage reads one head's key at a time (struct kvt_paris_seq_keys). */
static const float *
topk_key(void *ctx, uint32_t layer, uint32_t head, uint32_t pos, float *tmp)
{
	const struct kvtd_seq *q = ctx;

	if (pos >= q->ts.n)
		return NULL;
	key_f32(q, pos, layer, head, 1, tmp);
	return tmp;
}

/* TOPK never returns a position evicted (slot freed) after it was encoded. */
static bool
topk_dropped(void *ctx, uint32_t pos)
{
	const struct kvtd_seq *q = ctx;

	return pos >= q->ts.n || !q->slot[pos];
}

/* The cache lines topk_key() will read for (layer, head, pos): its row in the pool slot. */
static void
topk_key_prefetch(void *ctx, uint32_t layer, uint32_t head, uint32_t pos)
{
	const struct kvtd_seq *q = ctx;
	uint64_t D = q->p.head_dim, len = D * kvt_dtype_size(q->p.dtype);
	const uint8_t *slot, *row;

	if (pos >= q->ts.n || !(slot = q->slot[pos]))
		return;
	if (q->ts.tier[pos] & KVT_TIER_F_INT8) {
		const float *sc;
		bool ch;

		row = (const uint8_t *)(t2_row(q, slot, 2 * layer, &sc, &ch) + head * D);
		len = D;
	} else {
		row = slot + 2ull * layer * q->row_bytes + head * len;
	}
	for (uint64_t off = 0; off < len; off += 64)
		__builtin_prefetch(row + off);
}

/* After an append: encode the keys that left the dense window (every U tokens). */
static int
retrieval_flush(struct kvtd_seq *q)
{
	uint32_t n = (uint32_t)q->p.kv_heads * q->p.head_dim, T = q->ts.n;

	if (!q->paris || T < q->p.prompt_len)
		return 0;
	for (uint32_t l = 0; l < q->p.layers; l++) {
		uint32_t pos, count;
		int r = kvt_paris_seq_len(q->paris, l);

		if (r < 0)
			return r;
		r = kvt_paris_zone_flush(&q->paris->zone, q->p.prompt_len, T, (uint32_t)r, &pos,
					 &count);
		if (r < 0)
			return r;
		while (count) {
			uint32_t k = count < 256 ? count : 256;

			for (uint32_t i = 0; i < k; i++)
				key_f32(q, pos + i, l, 0, q->p.kv_heads,
					q->keybuf + (uint64_t)i * n);
			r = kvt_paris_seq_append(q->paris, l, pos, k, q->keybuf, n);
			if (r < 0)
				return r;
			/* evicted while still dense: encoded as zeros, dropped at once */
			for (uint32_t i = 0; i < k; i++)
				if (!q->slot[pos + i])
					kvt_paris_seq_drop(q->paris, pos + i);
			pos += k;
			count -= k;
		}
	}
	return 0;
}

static int
seq_params_ok(struct kvtd_session *s, const struct kvt_seq_params *p)
{
	const char *why;
	int r;

	r = params_check(p, &why);
	if (r == 0) {
		/* The engine reads t0_slots only when there is a T0 region. */
		r = kvt_tier_validate(p, &why);
	}
	if (r < 0)
		kvtd_op_fail(s, r, "%s", why);
	return r;
}

/* SEQ_OPEN up to the retrieval state: validated, classes taken, not yet in s->seqs. */
static int
seq_new(struct kvtd_session *s, const struct kvt_seq_params *p, struct kvtd_seq **ret_q)
{
	struct kvtd *d = s->d;
	struct kvt_seq_params pp = *p;
	struct kvtd_seq *q;
	const char *why;
	int r;

	r = seq_params_ok(s, p);
	if (r < 0)
		return r;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->p = pp;
	q->p.size = sizeof(pp);
	q->cls = q->cls_q = q->cls_pg = q->cls_kb = -1;
	kvt_tier_cfg_init(&pp, &q->cfg, &why);
	q->row_bytes = (uint64_t)p->kv_heads * p->head_dim * kvt_dtype_size(p->dtype);
	q->token_bytes = (uint64_t)p->layers * 2 * q->row_bytes;
	if (key_channel(q)) /* codes, value scales, key-scale block pointer */
		q->q_bytes = (uint64_t)p->layers * p->kv_heads * (2 * p->head_dim + sizeof(float)) +
			     sizeof(struct kblk *);
	else
		q->q_bytes = (uint64_t)p->layers * 2 * p->kv_heads * (p->head_dim + sizeof(float));
	if (p->t0_buf_id) {
		q->t0_buf =
		    region_get(s, p->t0_buf_id, p->t0_base_off, p, p->t0_layer_stride,
			       p->t0_kv_stride, p->t0_slots, p->t0_slot_stride, q->row_bytes, &r);
		if (!q->t0_buf)
			goto err_free;
	}
	if (p->stage_buf_id) {
		q->stage_buf = region_get(s, p->stage_buf_id, p->stage_base_off, p,
					  p->stage_layer_stride, p->stage_kv_stride, p->stage_slots,
					  p->stage_slot_stride, q->row_bytes, &r);
		if (!q->stage_buf)
			goto err_free;
	}
	r = kvtd_pool_class_get(&d->pool, q->token_bytes);
	if (r < 0)
		goto err_free;
	q->cls = r;
	r = kvtd_pool_class_get(&d->pool, q->q_bytes);
	if (r < 0)
		goto err_free;
	q->cls_q = r;
	if (key_channel(q)) {
		r = kvtd_pool_class_get(&d->pool, kblk_bytes(p));
		if (r < 0)
			goto err_free;
		q->cls_kb = r;
	}
	r = seq_ensure_cap(q, 1);
	if (r < 0)
		goto err_free;
	*ret_q = q;
	return 0;

err_free:
	kvtd_seq_destroy(s, q);
	return r;
}

int
kvtd_seq_open(struct kvtd_session *s, const struct kvt_seq_params *p)
{
	struct kvtd_seq *q;
	unsigned idx;
	int r;

	r = seq_params_ok(s, p);
	if (r < 0)
		return r;
	if (s->n_seqs >= s->max_seqs)
		return kvtd_op_fail(s, -EMFILE, "%u sequences open, the session's limit: close one",
				    s->n_seqs);
	r = seq_new(s, p, &q);
	if (r < 0)
		return r;
	if (p->ret_update) {
		r = retrieval_init(s, q);
		if (r < 0) {
			kvtd_seq_destroy(s, q);
			return r;
		}
	}
	for (idx = 0; idx < s->max_seqs && s->seqs[idx]; idx++)
		;
	q->id = idx + 1;
	s->seqs[idx] = q;
	s->n_seqs++;
	return (int)q->id;
}

/* Drops a T2 slot's reference to its key-scale block, freeing the block with the last one. */
static void
kblk_put(struct kvtd_session *s, struct kvtd_seq *q, const uint8_t *slot)
{
	struct kblk *b = t2_kblk(q, slot);
	void *v = b;

	if (--b->refs)
		return;
	kvtd_pool_free(&s->d->pool, q->cls_kb, 1, &s->acct, uid_acct(s), &v);
	q->n_kblk--;
}

/* Return the pool slots of @n positions (T1 or T2 each, by their tier flag). */
static void
free_positions(struct kvtd_session *s, struct kvtd_seq *q, const uint32_t *pos, uint32_t n)
{
	void *b1[COPY_BATCH], *b2[COPY_BATCH];
	unsigned n1 = 0, n2 = 0;

	for (uint32_t i = 0; i < n; i++) {
		void *p = q->slot[pos[i]];

		if (!p)
			continue;
		if (q->ts.tier[pos[i]] & KVT_TIER_F_INT8) {
			if (key_channel(q))
				kblk_put(s, q, p);
			b2[n2++] = p;
		} else {
			b1[n1++] = p;
		}
		q->slot[pos[i]] = NULL;
		if (n1 == COPY_BATCH || n2 == COPY_BATCH || i + 1 == n) {
			kvtd_pool_free(&s->d->pool, q->cls, n1, &s->acct, uid_acct(s), b1);
			kvtd_pool_free(&s->d->pool, q->cls_q, n2, &s->acct, uid_acct(s), b2);
			n1 = n2 = 0;
		}
	}
	kvtd_pool_free(&s->d->pool, q->cls, n1, &s->acct, uid_acct(s), b1);
	kvtd_pool_free(&s->d->pool, q->cls_q, n2, &s->acct, uid_acct(s), b2);
}

void
kvtd_seq_destroy(struct kvtd_session *s, struct kvtd_seq *q)
{
	if (!q)
		return;
	for (uint32_t i = 0; q->slot && i < q->ts.n;) {
		uint32_t batch[COPY_BATCH], k = 0;

		for (; i < q->ts.n && k < COPY_BATCH; i++)
			batch[k++] = i;
		free_positions(s, q, batch, k);
	}
	if (q->paris) {
		kvt_paris_seq_fini(q->paris);
		free(q->paris);
	}
	kvt_paris_scratch_fini(&q->scr);
	free(q->keybuf);
	free(q->topk_pos);
	free(q->topk_score);
	if (q->cls_pg >= 0)
		kvtd_pool_class_put(&s->d->pool, q->cls_pg);
	if (q->cls >= 0)
		kvtd_pool_class_put(&s->d->pool, q->cls);
	if (q->cls_q >= 0)
		kvtd_pool_class_put(&s->d->pool, q->cls_q);
	if (q->cls_kb >= 0)
		kvtd_pool_class_put(&s->d->pool, q->cls_kb);
	kvt_dev_buf_put(q->t0_buf);
	kvt_dev_buf_put(q->stage_buf);
	free(q->slot);
	free(q->ts_mem);
	free(q->ws);
	free(q);
}

uint64_t
kvtd_seq_pool_bytes(struct kvtd_session *s, const struct kvtd_seq *q)
{
	uint64_t live = q->ts.n - q->ts.count[KVT_T3];

	return (live - q->ts.n_int8) * kvtd_pool_slot_size(&s->d->pool, q->cls) +
	       (uint64_t)q->ts.n_int8 * kvtd_pool_slot_size(&s->d->pool, q->cls_q) +
	       (q->n_kblk ? q->n_kblk * kvtd_pool_slot_size(&s->d->pool, q->cls_kb) : 0);
}

struct kvtd_seq *
kvtd_seq_get(struct kvtd_session *s, uint32_t id)
{
	if (!id || id > s->max_seqs)
		return NULL;
	return s->seqs[id - 1];
}

int
kvtd_seq_close(struct kvtd_session *s, uint32_t id)
{
	struct kvtd_seq *q = kvtd_seq_get(s, id);

	if (!q)
		return -ENOENT;
	s->seqs[id - 1] = NULL;
	s->n_seqs--;
	kvtd_seq_destroy(s, q);
	return 0;
}

/* Reserve pool slots for @ntok new positions (q->slot[n..n+ntok)). */
static int
seq_reserve(struct kvtd_session *s, struct kvtd_seq *q, uint32_t ntok)
{
	int r = seq_ensure_cap(q, (uint64_t)q->ts.n + ntok);

	if (r < 0)
		return r;
	return kvtd_pool_alloc(&s->d->pool, q->cls, ntok, &s->acct, uid_acct(s), q->slot + q->ts.n);
}

static void
seq_unreserve(struct kvtd_session *s, struct kvtd_seq *q, uint32_t ntok)
{
	kvtd_pool_free(&s->d->pool, q->cls, ntok, &s->acct, uid_acct(s), q->slot + q->ts.n);
	memset(q->slot + q->ts.n, 0, ntok * sizeof(void *));
}

int64_t
kvtd_seq_append_rows(struct kvtd_session *s, struct kvtd_seq *q, const uint8_t *rows, uint32_t ntok)
{
	int r = seq_reserve(s, q, ntok);

	if (r < 0)
		return r;
	for (uint32_t i = 0; i < ntok; i++)
		memcpy(q->slot[q->ts.n + i], rows + (uint64_t)i * q->token_bytes, q->token_bytes);
	r = kvt_tier_append(&q->ts, ntok, NULL);
	if (r < 0) {
		seq_unreserve(s, q, ntok);
		return r;
	}
	q->bytes_in += (uint64_t)ntok * q->token_bytes;
	r = retrieval_flush(q);
	return r < 0 ? r : (int64_t)q->ts.n;
}

/* Device address of (slot, layer, kv) in a strided region. */
static uint64_t
t0_off(const struct kvt_seq_params *p, uint32_t slot, uint32_t l, uint32_t kv)
{
	return p->t0_base_off + l * p->t0_layer_stride + kv * p->t0_kv_stride +
	       slot * p->t0_slot_stride;
}

static uint64_t
stage_off(const struct kvt_seq_params *p, uint32_t row, uint32_t l, uint32_t kv)
{
	return p->stage_base_off + l * p->stage_layer_stride + kv * p->stage_kv_stride +
	       row * p->stage_slot_stride;
}

int64_t
kvtd_seq_append_t0(struct kvtd_session *s, struct kvtd_seq *q, const uint32_t *slots, uint32_t ntok)
{
	const struct kvt_seq_params *p = &q->p;
	struct kvt_dev_copy rows[COPY_BATCH];
	uint32_t slot_copy[256];
	unsigned nr = 0;
	int r;

	if (!q->t0_buf)
		return kvtd_op_fail(s, -EINVAL,
				    "F_T0 on a sequence with no T0 region (t0_buf_id 0)");
	if (ntok > 256)
		return kvtd_op_fail(s, -E2BIG, "ntok %u: at most 256 tokens from T0 at once", ntok);
	/* The arena is shared: read each slot id once, then validate the private copy. */
	memcpy(slot_copy, slots, ntok * sizeof(uint32_t));
	for (uint32_t i = 0; i < ntok; i++) {
		if (slot_copy[i] >= p->t0_slots)
			return kvtd_op_fail(s, -EINVAL, "T0 slot %u out of range (t0_slots %u)",
					    slot_copy[i], p->t0_slots);
		for (uint32_t j = 0; j < i; j++)
			if (slot_copy[j] == slot_copy[i])
				return kvtd_op_fail(s, -EINVAL, "T0 slot %u listed twice",
						    slot_copy[i]);
		if (q->ts.slot_pos[slot_copy[i]] >= 0)
			return kvtd_op_fail(s, -EBUSY, "T0 slot %u still holds position %d",
					    slot_copy[i], (int)q->ts.slot_pos[slot_copy[i]]);
	}
	r = seq_reserve(s, q, ntok);
	if (r < 0)
		return r;
	/* One device batch per COPY_BATCH rows: never one copy call per row on CUDA. */
	for (uint32_t i = 0; i < ntok; i++) {
		uint8_t *dst = q->slot[q->ts.n + i];

		for (uint32_t l = 0; l < p->layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				rows[nr].buf_off = t0_off(p, slot_copy[i], l, kv);
				rows[nr].host = dst + (2 * l + kv) * q->row_bytes;
				rows[nr].len = q->row_bytes;
				if (++nr == COPY_BATCH) {
					r = kvt_dev_copy_d2h(s->d->dev, q->t0_buf, rows, nr);
					if (r < 0)
						goto err;
					nr = 0;
				}
			}
	}
	r = nr ? kvt_dev_copy_d2h(s->d->dev, q->t0_buf, rows, nr) : 0;
	if (r == 0)
		r = kvt_dev_sync(s->d->dev);
	if (r == 0)
		r = kvt_dev_event_record(s->d->dev, s->dev_event);
	if (r == 0)
		r = kvt_tier_append(&q->ts, ntok, slot_copy);
	if (r < 0)
		goto err;
	q->bytes_in += (uint64_t)ntok * q->token_bytes;
	r = retrieval_flush(q);
	return r < 0 ? r : (int64_t)q->ts.n;
err:
	seq_unreserve(s, q, ntok);
	return r;
}

int
kvtd_seq_score_add(struct kvtd_session *s, struct kvtd_seq *q, uint64_t first, uint32_t count,
		   const float *v)
{
	float copy[1024];
	double sum = 0;
	int r;

	if (first > q->ts.n || count > q->ts.n - first)
		return kvtd_op_fail(s, -EINVAL,
				    "positions %llu..+%u pass the sequence's %llu tokens",
				    (unsigned long long)first, count, (unsigned long long)q->ts.n);
	/* Check values first (the whole add is refused, nothing changes), from a private copy
	 * so what is checked is what is added. */
	for (uint32_t done = 0; done < count;) {
		uint32_t k = count - done < 1024 ? count - done : 1024;

		memcpy(copy, v + done, k * sizeof(float));
		for (uint32_t i = 0; i < k; i++)
			if (!(copy[i] >= 0.0f) || copy[i] > 1e30f)
				return kvtd_op_fail(s, -EINVAL,
						    "value %u is %g: scores must be finite, >= 0 "
						    "and <= 1e30",
						    done + i, (double)copy[i]);
		done += k;
	}
	for (uint32_t done = 0; done < count;) {
		uint32_t k = count - done < 1024 ? count - done : 1024;

		memcpy(copy, v + done, k * sizeof(float));
		for (uint32_t i = 0; i < k; i++) {
			if (!(copy[i] >= 0.0f) || copy[i] > 1e30f)
				copy[i] = 0.0f; /* changed under us since the check: ignore it */
			sum += copy[i];
		}
		r = kvt_tier_score_add(&q->ts, (uint32_t)(first + done), k, copy);
		if (r < 0)
			return r;
		done += k;
	}
	q->score_total += sum;
	return 0;
}

/* Rows of one position for (l, kv), from its pool slot: a pointer into a T1 slot, or the row
 * dequantized from a T2 slot into @tmp. */
static const void *
pos_row(const struct kvtd_seq *q, uint32_t pos, uint32_t l, uint32_t kv, void *tmp)
{
	const uint8_t *slot = q->slot[pos];
	uint32_t r = 2 * l + kv;

	if (!(q->ts.tier[pos] & KVT_TIER_F_INT8))
		return slot + r * q->row_bytes;
	t2_dequant(q, slot, r, 0, q->p.kv_heads, q->p.dtype, tmp);
	return tmp;
}

/*
 * Copy rows to the device in batches. @dst(i, l, kv) gives each row's buffer offset; rows of
 * T2 positions are dequantized into a staging area first (one per batch entry).
 */
struct row_batch {
	struct kvtd_session *s;
	struct kvt_dev_buf *buf;
	struct kvt_dev_copy rows[COPY_BATCH];
	uint8_t *tmp; /* COPY_BATCH rows */
	unsigned n;
	uint64_t bytes, bytes_t2; /* rows added; of them, dequantized from T2 */
};

static int
batch_flush(struct row_batch *b)
{
	int r = b->n ? kvt_dev_copy_h2d(b->s->d->dev, b->buf, b->rows, b->n) : 0;

	/* The host rows (and dequantized temporaries) must stay put until the copy is done. */
	if (r == 0 && b->n)
		r = kvt_dev_sync(b->s->d->dev);
	if (r == 0 && b->n)
		r = kvt_dev_event_record(b->s->d->dev, b->s->dev_event);
	b->n = 0;
	return r;
}

static int
batch_add(struct row_batch *b, const struct kvtd_seq *q, uint32_t pos, uint32_t l, uint32_t kv,
	  uint64_t dst_off)
{
	b->rows[b->n].host = (void *)pos_row(q, pos, l, kv, b->tmp + b->n * q->row_bytes);
	b->rows[b->n].buf_off = dst_off;
	b->rows[b->n].len = q->row_bytes;
	b->bytes += q->row_bytes;
	if (q->ts.tier[pos] & KVT_TIER_F_INT8)
		b->bytes_t2 += q->row_bytes;
	return ++b->n == COPY_BATCH ? batch_flush(b) : 0;
}

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

static int
quant_room_get(struct kvtd_session *s, struct kvtd_seq *q, uint32_t n, struct quant_room *qr)
{
	uint64_t HD = (uint64_t)q->p.kv_heads * q->p.head_dim;
	int r;

	memset(qr, 0, sizeof(*qr));
	if (!n)
		return 0;
	qr->n = n;
	qr->nkb = key_channel(q) ? (n + KVT_T2_KEY_BLOCK - 1) / KVT_T2_KEY_BLOCK : 0;
	qr->qs = malloc(((size_t)n + qr->nkb) * sizeof(void *));
	if (qr->nkb)
		qr->tmp = malloc(KVT_T2_KEY_BLOCK * (q->row_bytes + HD));
	if (!qr->qs || (qr->nkb && !qr->tmp)) {
		r = -ENOMEM;
		goto err;
	}
	qr->kb = qr->qs + n;
	r = kvtd_pool_alloc(&s->d->pool, q->cls_q, n, &s->acct, uid_acct(s), qr->qs);
	if (r < 0)
		goto err;
	if (qr->nkb) {
		r = kvtd_pool_alloc(&s->d->pool, q->cls_kb, qr->nkb, &s->acct, uid_acct(s), qr->kb);
		if (r < 0) {
			kvtd_pool_free(&s->d->pool, q->cls_q, n, &s->acct, uid_acct(s), qr->qs);
			goto err;
		}
	}
	return 0;
err:
	free(qr->qs);
	free(qr->tmp);
	memset(qr, 0, sizeof(*qr));
	return r;
}

/* Gives back what quant_room_get() took and quantize_positions() did not use. */
static void
quant_room_put(struct kvtd_session *s, struct kvtd_seq *q, struct quant_room *qr, bool used)
{
	if (!used && qr->n) {
		kvtd_pool_free(&s->d->pool, q->cls_q, qr->n, &s->acct, uid_acct(s), qr->qs);
		if (qr->nkb)
			kvtd_pool_free(&s->d->pool, q->cls_kb, qr->nkb, &s->acct, uid_acct(s),
				       qr->kb);
	}
	free(qr->qs);
	free(qr->tmp);
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
static void
quantize_positions(struct kvtd_session *s, struct kvtd_seq *q, const uint32_t *pos,
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
	for (uint32_t done = 0; done < n; done += COPY_BATCH)
		kvtd_pool_free(&s->d->pool, q->cls, n - done < COPY_BATCH ? n - done : COPY_BATCH,
			       &s->acct, uid_acct(s), qs + done);
	q->bytes_quant += (uint64_t)n * q->q_bytes;
}

int
kvtd_seq_retier(struct kvtd_session *s, struct kvtd_seq *q, void *out, uint64_t out_len,
		uint32_t *ret_changes)
{
	struct kvt_retier_result res;
	struct kvt_tier_plan plan;
	struct row_batch *b = NULL;
	struct quant_room qr;
	uint64_t need;
	uint8_t *o = out;
	int r;

	r = seq_ensure_ws(q);
	if (r < 0)
		return r;
	r = kvt_tier_plan(&q->cfg, &q->ts, q->ws, q->ws_size, &plan);
	if (r < 0)
		return r;
	need = sizeof(res) + (uint64_t)(plan.n_demote + plan.n_promote) * 8 + plan.n_free * 4ull;
	if (need > out_len)
		return kvtd_op_fail(s, -ENOSPC,
				    "the output needs %llu bytes, arena_len is %llu "
				    "(KVT_RETIER_OUT_SIZE(t0_slots) always fits)",
				    (unsigned long long)need, (unsigned long long)out_len);
	/* Pool room for the int8 rows first, all or nothing: the only step that may fail for
	 * want of memory, taken before anything is moved. */
	r = quant_room_get(s, q, plan.n_quant, &qr);
	if (r < 0)
		return r;
	if (plan.n_promote) {
		b = malloc(sizeof(*b));
		if (b)
			b->tmp = malloc(COPY_BATCH * q->row_bytes);
		if (!b || !b->tmp) {
			free(b);
			r = -ENOMEM;
			goto err_qs;
		}
		b->s = s;
		b->buf = q->t0_buf;
		b->n = 0;
		b->bytes = b->bytes_t2 = 0;
		/* Only newly promoted positions are copied, every layer, in batches. */
		for (uint32_t i = 0; i < plan.n_promote && r == 0; i++)
			for (uint32_t l = 0; l < q->p.layers && r == 0; l++)
				for (uint32_t kv = 0; kv < 2 && r == 0; kv++)
					r = batch_add(b, q, plan.promote_pos[i], l, kv,
						      t0_off(&q->p, plan.promote_slot[i], l, kv));
		if (r == 0)
			r = batch_flush(b);
		q->bytes_out += b->bytes;
		q->bytes_out_t2 += b->bytes_t2;
		free(b->tmp);
		free(b);
		if (r < 0) {
			/* The T0 slots being refilled are in an unknown state now; the plan is
			 * dropped and the client must treat its T0 region as lost. */
			log_err("session %u seq %u: promotion copy failed: %s", s->id, q->id,
				strerror(-r));
			goto err_qs;
		}
	}
	quantize_positions(s, q, plan.quant_pos, &qr);
	quant_room_put(s, q, &qr, true);
	free_positions(s, q, plan.evict_pos, plan.n_evict);
	/* Evicted keys leave the retrieval index, so that TOPK ranks only live keys and returns
	 * min(k, live) per head (topk_dropped() stays as the backstop). */
	for (uint32_t i = 0; q->paris && i < plan.n_evict; i++)
		kvt_paris_seq_drop(q->paris, plan.evict_pos[i]);
	r = kvt_tier_commit(&q->ts, &plan);
	if (r < 0)
		return r;

	memset(&res, 0, sizeof(res));
	res.size = sizeof(res);
	res.n_changes = plan.n_demote + plan.n_promote;
	res.n_free = plan.n_free;
	res.evicted_ratio = plan.evicted_ratio;
	res.n_tokens = q->ts.n;
	for (int t = 0; t < 4; t++)
		res.tier_count[t] = q->ts.count[t];
	memcpy(o, &res, sizeof(res));
	o += sizeof(res);
	for (uint32_t i = 0; i < plan.n_demote; i++, o += 8) {
		struct kvt_slot_change c = {plan.demote_slot[i], -1};

		memcpy(o, &c, sizeof(c));
	}
	for (uint32_t i = 0; i < plan.n_promote; i++, o += 8) {
		struct kvt_slot_change c = {plan.promote_slot[i], (int32_t)plan.promote_pos[i]};

		memcpy(o, &c, sizeof(c));
	}
	memcpy(o, plan.free_slot, plan.n_free * sizeof(uint32_t));
	*ret_changes = res.n_changes;
	return (int)need;

err_qs:
	quant_room_put(s, q, &qr, false);
	return r;
}

int
kvtd_seq_fetch(struct kvtd_session *s, struct kvtd_seq *q, unsigned flags, uint32_t layer0,
	       uint32_t nlayers, uint32_t stage_row, uint32_t *list, uint32_t list_cap,
	       uint32_t count)
{
	const struct kvt_seq_params *p = &q->p;
	struct row_batch *b;
	uint32_t *pos, m;
	int r;

	if (!q->stage_buf)
		return kvtd_op_fail(s, -EINVAL,
				    "sequence %u has no staging region (open the "
				    "sequence with stage_buf_id)",
				    q->id);
	if (!nlayers || layer0 >= p->layers || nlayers > p->layers - layer0)
		return kvtd_op_fail(s, -EINVAL, "layers %u..+%u outside the sequence's %u layers",
				    layer0, nlayers, p->layers);
	if (!flags || flags & ~(KVT_FETCH_F_T1 | KVT_FETCH_F_T2 | KVT_FETCH_F_LIST) ||
	    ((flags & KVT_FETCH_F_LIST) && flags != KVT_FETCH_F_LIST))
		return kvtd_op_fail(s, -EINVAL,
				    "op_flags %#x: give F_T1 and/or F_T2, or F_LIST "
				    "alone",
				    flags);
	r = seq_ensure_ws(q);
	if (r < 0)
		return r;
	pos = q->ws; /* private: positions are validated here and used to index q->slot */
	if (flags & KVT_FETCH_F_LIST) {
		if (!count || count > q->ts.n || count > list_cap)
			return kvtd_op_fail(s, -EINVAL, "npos %u: F_LIST needs 1..%llu positions",
					    count, (unsigned long long)q->ts.n);
		memcpy(pos, list, count * sizeof(uint32_t));
		for (uint32_t i = 0; i < count; i++) {
			if (pos[i] >= q->ts.n)
				return kvtd_op_fail(s, -EINVAL,
						    "position %u (entry %u) >= the %llu tokens",
						    pos[i], i, (unsigned long long)q->ts.n);
			if ((q->ts.tier[pos[i]] & KVT_TIER_MASK) == KVT_T3)
				return kvtd_op_fail(s, -ENOENT, "position %u was evicted", pos[i]);
		}
		m = count;
	} else {
		unsigned mask = ((flags & KVT_FETCH_F_T1) ? 1u << KVT_T1 : 0) |
				((flags & KVT_FETCH_F_T2) ? 1u << KVT_T2 : 0);

		r = kvt_tier_fetch_list(&q->ts, mask, q->ts.n, pos);
		if (r < 0)
			return r;
		m = (uint32_t)r;
		if (m > list_cap)
			return kvtd_op_fail(s, -ENOSPC, "%u positions, the arena holds %u", m,
					    list_cap);
	}
	if (stage_row > p->stage_slots || m > p->stage_slots - stage_row)
		return kvtd_op_fail(s, -ENOSPC, "%u rows from staging row %u pass its %u rows", m,
				    stage_row, p->stage_slots);
	b = malloc(sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->tmp = malloc(COPY_BATCH * q->row_bytes);
	if (!b->tmp) {
		free(b);
		return -ENOMEM;
	}
	b->s = s;
	b->buf = q->stage_buf;
	b->n = 0;
	b->bytes = b->bytes_t2 = 0;
	r = 0;
	for (uint32_t l = layer0; l < layer0 + nlayers && r == 0; l++)
		for (uint32_t kv = 0; kv < 2 && r == 0; kv++)
			for (uint32_t i = 0; i < m && r == 0; i++)
				r = batch_add(b, q, pos[i], l, kv,
					      stage_off(p, stage_row + i, l, kv));
	if (r == 0)
		r = batch_flush(b);
	q->bytes_out += b->bytes;
	q->bytes_out_t2 += b->bytes_t2;
	free(b->tmp);
	free(b);
	if (r < 0)
		return r;
	if (!(flags & KVT_FETCH_F_LIST))
		memcpy(list, pos, m * sizeof(uint32_t));
	return (int)m;
}

int
kvtd_seq_topk(struct kvtd_session *s, struct kvtd_seq *q, uint32_t layer, uint32_t k,
	      unsigned flags, const float *query, uint64_t q_len, void *out, uint64_t out_len,
	      uint64_t *ret_n)
{
	const struct kvt_seq_params *p = &q->p;
	/* Exact refine of the 4k best estimates from the pool's keys (paris_seq.h): recall@100
	 * 0.97-0.98 instead of 0.81-0.84 on the benchmark sets (docs/bench-retrieval.md). */
	const struct kvt_paris_seq_keys keys = {topk_key, q, topk_key_prefetch};
	struct kvt_paris_topk_opts opts = {.k = k,
					   .refine = k > UINT32_MAX / 4 ? UINT32_MAX : 4 * k,
					   .keys = &keys,
					   .dropped = topk_dropped,
					   .drop_ctx = q};
	uint32_t H = p->kv_heads, qh = p->q_heads ? p->q_heads : H, stride,
		 counts[KVT_MAX_KV_HEADS];
	uint64_t need;
	float *qbuf;
	int r;

	if (!q->paris)
		return kvtd_op_fail(s, -EINVAL,
				    "sequence %u has no retrieval (open it with "
				    "ret_update > 0)",
				    q->id);
	if (layer >= p->layers || !k ||
	    (flags & ~(KVT_TOPK_F_UNION | KVT_TOPK_F_FETCH | KVT_TOPK_F_ESTIMATE)))
		return kvtd_op_fail(s, -EINVAL,
				    "layer %u (of %u), k %u (must be > 0), op_flags %#x", layer,
				    p->layers, k, flags);
	if (q_len != (uint64_t)qh * p->head_dim)
		return kvtd_op_fail(s, -EINVAL, "query of %llu f32, needs q_heads x head_dim = %u",
				    (unsigned long long)q_len, qh * p->head_dim);
	if (flags & KVT_TOPK_F_ESTIMATE)
		opts.refine = 0; /* the spec's pipeline and schedule, estimated scores */
	if (flags & KVT_TOPK_F_UNION)
		opts.flags = KVT_PARIS_F_UNION;
	r = kvt_paris_seq_len(q->paris, layer);
	if (r < 0)
		return r;
	*ret_n = (uint64_t)r;
	if (k > (uint32_t)r)
		return kvtd_op_fail(s, -ERANGE,
				    "k %u > the %d keys in retrieval at layer %u "
				    "(attend densely)",
				    k, r, layer);
	/* With KVT_TOPK_F_UNION the stride is k * q_heads / kv_heads: keep it (and every size
	 * derived from it) far from u32 overflow; no arena could hold such an answer anyway. */
	if ((flags & KVT_TOPK_F_UNION) && (uint64_t)k * (qh / H) > (1u << 24))
		return -ENOSPC;
	stride = kvt_paris_seq_topk_stride(q->paris, &opts);
	need = (uint64_t)H * 4 + (uint64_t)H * stride * 8;
	if (need > out_len)
		return kvtd_op_fail(s, -ENOSPC, "out_len %llu, the output needs %llu bytes",
				    (unsigned long long)out_len, (unsigned long long)need);
	if ((flags & KVT_TOPK_F_FETCH) && !q->stage_buf)
		return kvtd_op_fail(s, -EINVAL, "F_FETCH on sequence %u with no staging region",
				    q->id);
	if ((flags & KVT_TOPK_F_FETCH) && (uint64_t)H * stride > p->stage_slots)
		return kvtd_op_fail(s, -ENOSPC, "F_FETCH needs %llu staging rows, there are %u",
				    (unsigned long long)H * stride, p->stage_slots);
	if ((uint64_t)H * stride > q->topk_cap) {
		free(q->topk_pos);
		free(q->topk_score);
		q->topk_cap = H * stride;
		q->topk_pos = malloc(sizeof(uint32_t) * q->topk_cap);
		q->topk_score = malloc(sizeof(float) * q->topk_cap);
		if (!q->topk_pos || !q->topk_score) {
			q->topk_cap = 0;
			return -ENOMEM;
		}
	}
	/* A private copy of the query: the arena is shared. */
	qbuf = malloc(q_len * sizeof(float));
	if (!qbuf)
		return -ENOMEM;
	memcpy(qbuf, query, q_len * sizeof(float));
	for (uint64_t i = 0; i < q_len; i++)
		if (!isfinite(qbuf[i])) {
			free(qbuf);
			return kvtd_op_fail(s, -EINVAL, "query value %llu is NaN or infinite",
					    (unsigned long long)i);
		}
	r = kvt_paris_seq_topk(q->paris, layer, qbuf, q_len, &opts, &q->scr, q->topk_pos,
			       q->topk_score, counts);
	free(qbuf);
	if (r < 0)
		return r;
	if (flags & KVT_TOPK_F_FETCH) {
		struct row_batch *b = malloc(sizeof(*b));

		if (!b || !(b->tmp = malloc(COPY_BATCH * q->row_bytes))) {
			free(b);
			return -ENOMEM;
		}
		b->s = s;
		b->buf = q->stage_buf;
		b->n = 0;
		b->bytes = b->bytes_t2 = 0;
		r = 0;
		for (uint32_t h = 0; h < H && r == 0; h++)
			for (uint32_t i = 0; i < counts[h] && r == 0; i++)
				for (uint32_t kv = 0; kv < 2 && r == 0; kv++)
					r = batch_add(b, q, q->topk_pos[h * stride + i], layer, kv,
						      stage_off(p, h * stride + i, layer, kv));
		if (r == 0)
			r = batch_flush(b);
		q->bytes_out += b->bytes;
		q->bytes_out_t2 += b->bytes_t2;
		free(b->tmp);
		free(b);
		if (r < 0)
			return r;
	}
	memcpy(out, counts, H * sizeof(uint32_t));
	memcpy((uint8_t *)out + H * 4, q->topk_pos, (size_t)H * stride * 4);
	memcpy((uint8_t *)out + H * 4 + (size_t)H * stride * 4, q->topk_score,
	       (size_t)H * stride * 4);
	return (int)stride;
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
static int
restore_kblks(struct kvtd_session *s, struct kvtd_seq *q, uint64_t old_base)
{
	struct kvtd_pool *pool = &s->d->pool;
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
		r = kvtd_pool_claim(pool, q->cls_kb, offs[i], &s->acct, uid_acct(s), &p);
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

int
kvtd_seq_restore(struct kvtd_session *s, const struct kvt_seq_params *p, uint32_t id,
		 const struct kvtd_seq_image *img)
{
	struct kvt_tier_seq ts;
	struct kvtd_seq *q;
	int r;

	if (!id || id > s->max_seqs || s->seqs[id - 1] || (p->max_tokens && img->n > p->max_tokens))
		return -EINVAL;
	r = seq_new(s, p, &q);
	if (r < 0)
		return r;
	q->id = id;
	s->seqs[id - 1] = q;
	s->n_seqs++;
	if (img->n) {
		r = seq_ensure_cap(q, img->n);
		if (r < 0)
			return r;
	}
	r = kvt_tier_seq_restore(&ts, q->ts_mem, q->ts_size, q->ts.cap, q->cfg.t0_slots, img->n,
				 img->gen, img->score, img->tier, img->pos_slot);
	if (r < 0)
		return r;
	q->ts = ts;
	/* Each live position claims its pool slot back (T1 or T2 by its tier); only evicted
	 * positions have none. */
	for (uint32_t i = 0; i < img->n; i++) {
		uint8_t t = img->tier[i];
		int cls = (t & KVT_TIER_F_INT8) ? q->cls_q : q->cls;

		if ((t & KVT_TIER_MASK) == KVT_T3) {
			if (img->slot_off[i])
				return -EINVAL;
			continue;
		}
		if (!img->slot_off[i])
			return -EINVAL;
		r = kvtd_pool_claim(&s->d->pool, cls, img->slot_off[i] - 1, &s->acct, uid_acct(s),
				    &q->slot[i]);
		if (r < 0)
			return r;
	}
	if (key_channel(q)) {
		r = restore_kblks(s, q, img->old_base);
		if (r < 0)
			return r;
	}
	q->bytes_in = img->bytes_in;
	q->bytes_out = img->bytes_out;
	q->score_total = img->score_total;
	return 0;
}

int
kvtd_seq_restore_retrieval(struct kvtd_session *s, struct kvtd_seq *q)
{
	int r;

	if (!q->p.ret_update)
		return 0;
	r = retrieval_init(s, q);
	if (r < 0)
		return r;
	/* The keys of every position that had left the dense window, encoded again from the pool
	 * in position order; evicted ones are dropped as they were. */
	return retrieval_flush(q);
}
