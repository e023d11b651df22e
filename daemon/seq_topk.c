/* SPDX-License-Identifier: MIT */
/*
 * seq_topk.c - retrieval (ret_update > 0): the PARIS index and int8 sketch of a sequence
 * (engine/paris_seq.h), their pages from the pool, keys encoded as they leave the dense window
 * and encoded again in the sketch when their stored value changes, TOPK exact from the pool's
 * keys, and both rebuilt after a restart. A sequence opened with [retrieval] sketch = no
 * (q->no_sketch, kept for life and across restarts) has the index alone: TOPK past
 * KVT_PARIS_EXACT_BYTES of rows then rescores the best estimates.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "seq_int.h"

/* The class of an index page or a sketch page, told apart by size (the same class where the
 * two sizes are equal, at head_dim 64; no sketch class without sketches). */
static int
page_cls(const struct kvtd_seq *q, size_t len)
{
	return q->cls_sk >= 0 &&
		       ((len + 63) & ~(size_t)63) == kvtd_pool_slot_size(q->owner->pool, q->cls_sk)
		   ? q->cls_sk
		   : q->cls_pg;
}

/* Index and sketch pages come from the pool, charged to the owner's accounts like rows. */
static void *
page_get(void *ctx, size_t len)
{
	struct kvtd_seq *q = ctx;
	const struct kvtd_seq_ctx *x = q->owner;
	const int cls = page_cls(q, len);
	void *p;

	if (kvtd_pool_alloc(x->pool, cls, 1, x->acct, x->uid_acct, &p) < 0)
		return NULL;
	q->ret_bytes += kvtd_pool_slot_size(x->pool, cls);
	return p;
}

static void
page_put(void *ctx, void *page, size_t len)
{
	struct kvtd_seq *q = ctx;
	const struct kvtd_seq_ctx *x = q->owner;
	const int cls = page_cls(q, len);

	kvtd_pool_free(x->pool, cls, 1, x->acct, x->uid_acct, &page);
	q->ret_bytes -= kvtd_pool_slot_size(x->pool, cls);
}

int
seq_retrieval_init(const struct kvtd_seq_ctx *x, struct kvtd_seq *q)
{
	const struct kvt_seq_params *p = &q->p;
	struct kvt_paris_geom g = {p->layers, p->q_heads ? p->q_heads : p->kv_heads, p->kv_heads,
				   p->head_dim};
	struct kvt_paris_zone_cfg z = {p->sinks, p->window, p->ret_update, 0};
	struct kvt_paris_alloc a = {page_get, page_put, q};
	unsigned page_keys = KVT_PARIS_PAGE_KEYS;
	struct kvt_srht rot;
	int r;

	/* A page must fit in one pool chunk: an index page (9D / 8 bytes a key) and, larger,
	 * a sketch page (5D / 4 + 12 a key and the centre). */
	while (page_keys > 64 &&
	       (kvt_paris_page_bytes(p->head_dim, page_keys) > x->pool->chunk_size ||
		(!q->no_sketch &&
		 kvt_sketch_page_bytes(p->head_dim, page_keys) > x->pool->chunk_size)))
		page_keys /= 2;
	r = kvtd_seq_class_get(x, q, kvt_paris_page_bytes(p->head_dim, page_keys));
	if (r < 0)
		return r;
	q->cls_pg = r;
	if (!q->no_sketch) {
		r = kvtd_seq_class_get(x, q, kvt_sketch_page_bytes(p->head_dim, page_keys));
		if (r < 0)
			return r;
		q->cls_sk = r;
	}
	q->owner = x;
	/* The rotation is a pure function of (dim, seed): every daemon and restart agrees. */
	r = kvt_srht_init(&rot, p->head_dim, KVT_SRHT_SEED);
	if (r < 0)
		return r;
	q->paris = calloc(1, sizeof(*q->paris));
	q->keybuf = malloc(sizeof(float) * p->kv_heads * p->head_dim * 256);
	if (!q->paris || !q->keybuf)
		return -ENOMEM;
	r = kvt_paris_seq_init(q->paris, &g, &z, &rot, page_keys, &a,
			       q->no_sketch ? KVT_PARIS_SEQ_F_NO_SKETCH : 0);
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
		seq_t2_dequant(q, slot, 2 * l, h0, nh, KVT_DTYPE_F32, out);
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

/* Direct access to the key rows in the pool for the exact scan (struct kvt_paris_seq_rows). */
struct topk_rows_ctx {
	const struct kvtd_seq *q;
	uint64_t stride; /* bytes between T1 slots of one chunk: the slot size */
};

static bool
row_direct(const struct kvtd_seq *q, uint32_t pos)
{
	return q->slot[pos] && !(q->ts.tier[pos] & KVT_TIER_F_INT8);
}

/* The key row of (layer, head) at @pos in its T1 slot, and how many positions from @pos on lie
 * a slot apart (slots allocated together sit side by side in a chunk); NULL for an evicted or
 * int8 position, which the engine reads through topk_key() instead. */
static const void *
topk_rows(void *ctx, uint32_t layer, uint32_t head, uint32_t pos, uint32_t *ret_run)
{
	const struct topk_rows_ctx *rc = ctx;
	const struct kvtd_seq *q = rc->q;
	uint32_t run = 1;

	if (pos >= q->ts.n || !row_direct(q, pos))
		return NULL;
	while (pos + run < q->ts.n && row_direct(q, pos + run) &&
	       (const uint8_t *)q->slot[pos + run] ==
		   (const uint8_t *)q->slot[pos + run - 1] + rc->stride)
		run++;
	*ret_run = run;
	return (const uint8_t *)q->slot[pos] + 2ull * layer * q->row_bytes +
	       (uint64_t)head * q->p.head_dim * kvt_dtype_size(q->p.dtype);
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

		row = (const uint8_t *)(seq_t2_row(q, slot, 2 * layer, &sc, &ch) + head * D);
		len = D;
	} else {
		row = slot + 2ull * layer * q->row_bytes + head * len;
	}
	for (uint64_t off = 0; off < len; off += 64)
		__builtin_prefetch(row + off);
}

/* After an append: encode the keys that left the dense window (every U tokens). */
int
seq_retrieval_flush(struct kvtd_seq *q)
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

/*
 * TOPK past what the rows scan covers goes through the sketch, which is exact only while it
 * encodes the values topk_key() returns: a key quantized to int8 after it was encoded is read
 * dequantized from then on, so its entry is encoded again from that (key_f32(), the same
 * conversion topk_key() makes, head by head as it reads them).
 */
void
seq_retrieval_rekey(struct kvtd_seq *q, const uint32_t *pos, uint32_t n)
{
	float key[KVT_SRHT_MAX_DIM];
	uint32_t S;

	if (!q->paris || !q->paris->sk) /* no sketch: the refine reads keys as they are now */
		return;
	S = q->paris->zone.sink;
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < q->p.layers; l++) {
			/* not encoded yet: its flush reads the new value */
			if (pos[i] < S || pos[i] - S >= (uint32_t)kvt_paris_seq_len(q->paris, l))
				continue;
			for (uint32_t h = 0; h < q->p.kv_heads; h++) {
				key_f32(q, pos[i], l, h, 1, key);
				kvt_paris_seq_sketch_set(q->paris, l, h, pos[i], key);
			}
		}
}

int
kvtd_seq_topk(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const struct kvt_topk_req *req,
	      const float *query, void *out, uint64_t *ret_n)
{
	const struct kvt_seq_params *p = &q->p;
	const uint32_t layer = req->layer, k = req->k, flags = req->flags, probe = req->probe;
	const uint64_t q_len = req->query_len / sizeof(float), out_len = req->out_len;
	/* Exact refine of the 4k best estimates from the pool's keys (paris_seq.h; why 4k:
	 * docs/retrieval.md, "Final selection"). */
	const struct kvt_paris_seq_keys keys = {topk_key, q, topk_key_prefetch};
	/* ... or, for a zone small enough (KVT_PARIS_EXACT_BYTES), every key scored exactly
	 * straight from the pool's rows */
	struct topk_rows_ctx rc = {q, kvtd_pool_slot_size(x->pool, q->cls)};
	const struct kvt_paris_seq_rows rows = {topk_rows, &rc, q->p.dtype, rc.stride};
	struct kvt_paris_topk_opts opts = {.k = k,
					   .refine = k > UINT32_MAX / 4 ? UINT32_MAX : 4 * k,
					   .keys = &keys,
					   .rows = &rows,
					   .dropped = topk_dropped,
					   .drop_ctx = q};
	uint32_t H = p->kv_heads, qh = p->q_heads ? p->q_heads : H, stride,
		 counts[KVT_MAX_KV_HEADS];
	uint64_t need;
	float *qbuf;
	int r;

	if (!q->paris)
		return kvtd_seq_fail(x, -EINVAL,
				     "sequence %u has no retrieval (open it with "
				     "ret_update > 0)",
				     q->id);
	if (layer >= p->layers)
		return kvtd_seq_fail(x, -EINVAL, "layer %u out of range (sequence %u has %u)",
				     layer, q->id, p->layers);
	if (req->query_len != (uint64_t)qh * p->head_dim * sizeof(float))
		return kvtd_seq_fail(x, -EINVAL,
				     "query of %u bytes, needs q_heads x head_dim = %u f32 (%u "
				     "bytes)",
				     req->query_len, qh * p->head_dim,
				     qh * p->head_dim * (unsigned)sizeof(float));
	switch (req->mode) {
	case KVT_TOPK_EXACT:
		break;
	case KVT_TOPK_ESTIMATE:
		opts.refine = 0; /* the spec's pipeline and schedule, estimated scores */
		break;
	case KVT_TOPK_FAST:
		/* the sketch's 2-bit level picks 16k keys to score exactly (engine/sketch.h);
		 * without sketches ([retrieval] sketch = no) the default path serves it */
		opts.fast = k > UINT32_MAX / KVT_TOPK_FAST_X ? UINT32_MAX : KVT_TOPK_FAST_X * k;
		break;
	case KVT_TOPK_PROBE: {
		/* the best groups holding @probe live keys, their C best estimates scored
		 * (engine/sketch.h): C = 4k by the 2-bit level at head_dim 128; k by the int8
		 * level at 64, where more rows found no more (docs/retrieval.md, "Probing"). A
		 * probe under C counts as C. */
		uint32_t per = p->head_dim == 64 ? 1 : KVT_TOPK_PROBE_X; /* keys scored a result */

		opts.fast = k > UINT32_MAX / per ? UINT32_MAX : per * k;
		opts.probe = probe > opts.fast ? probe : opts.fast;
		break;
	}
	default: /* ops.c refused it: only a caller that skipped kvtd_topk_req_check() */
		return kvtd_seq_fail(x, -EINVAL, "mode %u unknown", req->mode);
	}
	if (flags & KVT_TOPK_F_UNION)
		opts.flags = KVT_PARIS_F_UNION;
	r = kvt_paris_seq_len(q->paris, layer);
	if (r < 0)
		return r;
	*ret_n = (uint64_t)r;
	if (k > (uint32_t)r)
		return kvtd_seq_fail(x, -ERANGE,
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
		return kvtd_seq_fail(x, -ENOSPC, "out_len %llu, the output needs %llu bytes",
				     (unsigned long long)out_len, (unsigned long long)need);
	if ((flags & KVT_TOPK_F_FETCH) && !q->stage_buf)
		return kvtd_seq_fail(x, -EINVAL, "F_FETCH on sequence %u with no staging region",
				     q->id);
	if ((flags & KVT_TOPK_F_FETCH) && (uint64_t)H * stride > p->stage_slots)
		return kvtd_seq_fail(x, -ENOSPC, "F_FETCH needs %llu staging rows, there are %u",
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
	qbuf = kvtd_scratch_get(x->scr, SCR_QUERY, q_len * sizeof(float));
	if (!qbuf)
		return -ENOMEM;
	memcpy(qbuf, query, q_len * sizeof(float));
	for (uint64_t i = 0; i < q_len; i++)
		if (!isfinite(qbuf[i]))
			return kvtd_seq_fail(x, -EINVAL, "query value %llu is NaN or infinite",
					     (unsigned long long)i);
	r = kvt_paris_seq_topk(q->paris, layer, qbuf, q_len, &opts, &q->scr, q->topk_pos,
			       q->topk_score, counts);
	if (r < 0)
		return r;
	if (flags & KVT_TOPK_F_FETCH) {
		struct row_batch *b = seq_batch_start(x, q, q->stage_buf);

		if (!b)
			return -ENOMEM;
		r = 0;
		for (uint32_t h = 0; h < H && r == 0; h++)
			for (uint32_t i = 0; i < counts[h] && r == 0; i++)
				for (uint32_t kv = 0; kv < 2 && r == 0; kv++)
					r = seq_batch_add(b, q, q->topk_pos[h * stride + i], layer,
							  kv,
							  stage_off(p, h * stride + i, layer, kv));
		if (r == 0)
			r = seq_batch_flush(b);
		q->bytes_out += b->bytes;
		q->bytes_out_t2 += b->bytes_t2;
		if (r < 0)
			return r;
	}
	memcpy(out, counts, H * sizeof(uint32_t));
	memcpy((uint8_t *)out + H * 4, q->topk_pos, (size_t)H * stride * 4);
	memcpy((uint8_t *)out + H * 4 + (size_t)H * stride * 4, q->topk_score,
	       (size_t)H * stride * 4);
	return (int)stride;
}

int
kvtd_seq_restore_retrieval(const struct kvtd_seq_ctx *x, struct kvtd_seq *q)
{
	int r;

	if (!q->p.ret_update)
		return 0;
	r = seq_retrieval_init(x, q);
	if (r < 0)
		return r;
	/* The keys of every position that had left the dense window, encoded again from the pool
	 * in position order; evicted ones are dropped as they were. */
	return seq_retrieval_flush(q);
}
