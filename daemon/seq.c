/* SPDX-License-Identifier: MIT */
/*
 * seq.c - sequences: the daemon side of SEQ_OPEN, APPEND and SCORE_ADD, the pool slot of every
 * position (reserved before rows land, given back by tier) and a sequence's restore. The tier
 * engine (engine/tier.h) decides; the files beside this one move rows (seq_int.h says which).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_dev.h"
#include "log.h"
#include "pool.h"
#include "prefix.h"
#include "seq_int.h"

int
kvtd_why_vset(struct kvtd_why *w, int r, const char *fmt, va_list ap)
{
	vsnprintf(w->msg, sizeof(w->msg), fmt, ap);
	w->set = 1;
	return r;
}

int
kvtd_seq_fail(const struct kvtd_seq_ctx *x, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvtd_why_vset(x->why, r, fmt, ap);
	va_end(ap);
	return r;
}

int
kvtd_seq_class_get(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint64_t bytes)
{
	int r = kvtd_pool_class_get_for(x->pool, bytes, q->cls_use);
	unsigned used, held;

	if (r != -EDQUOT && r != -ENOSPC)
		return r;
	kvtd_pool_class_count(x->pool, q->cls_use, &used, &held);
	if (r == -EDQUOT)
		return kvtd_seq_fail(x, r,
				     "classes_per_uid: this uid's sequences and namespaces use %u "
				     "pool classes (row sizes), at most %u; slots of %llu bytes "
				     "would be another: close a sequence of another geometry",
				     held, q->cls_use->limit, (unsigned long long)bytes);
	return kvtd_seq_fail(x, r,
			     "no pool class left for slots of %llu bytes: %u of %u in use (%u by "
			     "this uid), none held only by cached prefix blocks",
			     (unsigned long long)bytes, used, KVTD_POOL_MAX_CLASSES, held);
}

void
kvtd_seq_class_put(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, int cls)
{
	kvtd_pool_class_put_for(x->pool, cls, q->cls_use);
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

struct kvt_dev_buf *
seq_region_get(const struct kvtd_seq_ctx *x, uint32_t id, uint64_t base,
	       const struct kvt_seq_params *p, uint64_t layer_stride, uint64_t kv_stride,
	       uint32_t slots, uint64_t slot_stride, uint64_t row_bytes, int *ret_err)
{
	struct kvt_dev_buf *b = id && id <= x->n_bufs ? x->bufs[id - 1] : NULL;

	if (!b) {
		*ret_err =
		    kvtd_seq_fail(x, -ENOENT, "buffer %u is not registered by this session", id);
		return NULL;
	}
	if (!region_fits(kvt_dev_buf_size(b), base, p->layers, layer_stride, kv_stride, slots,
			 slot_stride, row_bytes)) {
		*ret_err = kvtd_seq_fail(
		    x, -ERANGE, "the layout (%u slots) in buffer %u runs past its %llu bytes",
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
	if (q->blk) {
		struct kvtd_pblock **blk = realloc(q->blk, cap * sizeof(*q->blk));

		if (!blk) {
			free(mem);
			return -ENOMEM;
		}
		q->blk = blk;
		memset(q->blk + q->ts.cap, 0, (cap - q->ts.cap) * sizeof(*q->blk));
	}
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

int
seq_ensure_ws(struct kvtd_seq *q)
{
	size_t need = kvt_tier_ws_bytes(q->ts.n, q->cfg.t0_slots, q->cfg.delta);
	/* FETCH keeps its private position list and staging rows there too. */
	size_t list = 2 * (size_t)q->ts.n * sizeof(uint32_t) + 64;
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

static int
seq_params_ok(const struct kvtd_seq_ctx *x, const struct kvt_seq_params *p)
{
	const char *why;
	int r;

	r = params_check(p, &why);
	if (r == 0) {
		/* The engine reads t0_slots only when there is a T0 region. */
		r = kvt_tier_validate(p, &why);
	}
	if (r < 0)
		kvtd_seq_fail(x, r, "%s", why);
	return r;
}

/* SEQ_OPEN up to the retrieval state: validated, classes taken, no id yet. */
static int
seq_new(const struct kvtd_seq_ctx *x, const struct kvt_seq_params *p, struct kvtd_seq **ret_q)
{
	struct kvt_seq_params pp = *p;
	struct kvtd_seq *q;
	const char *why;
	int r;

	r = seq_params_ok(x, p);
	if (r < 0)
		return r;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->p = pp;
	q->p.size = sizeof(pp);
	q->cls = q->cls_q = q->cls_pg = q->cls_sk = q->cls_kb = -1;
	q->cls_use = x->uid_cls;
	q->no_sketch = x->no_sketch;
	kvt_tier_cfg_init(&pp, &q->cfg, &why);
	q->row_bytes = (uint64_t)p->kv_heads * p->head_dim * kvt_dtype_size(p->dtype);
	q->token_bytes = (uint64_t)p->layers * 2 * q->row_bytes;
	if (key_channel(q)) /* codes, value scales, key-scale block pointer */
		q->q_bytes = (uint64_t)p->layers * p->kv_heads * (2 * p->head_dim + sizeof(float)) +
			     sizeof(struct kblk *);
	else
		q->q_bytes = (uint64_t)p->layers * 2 * p->kv_heads * (p->head_dim + sizeof(float));
	if (p->t0_buf_id) {
		q->t0_buf = seq_region_get(x, p->t0_buf_id, p->t0_base_off, p, p->t0_layer_stride,
					   p->t0_kv_stride, p->t0_slots, p->t0_slot_stride,
					   q->row_bytes, &r);
		if (!q->t0_buf)
			goto err_free;
	}
	if (p->stage_buf_id) {
		q->stage_buf = seq_region_get(
		    x, p->stage_buf_id, p->stage_base_off, p, p->stage_layer_stride,
		    p->stage_kv_stride, p->stage_slots, p->stage_slot_stride, q->row_bytes, &r);
		if (!q->stage_buf)
			goto err_free;
	}
	r = kvtd_seq_class_get(x, q, q->token_bytes);
	if (r < 0)
		goto err_free;
	q->cls = r;
	r = kvtd_seq_class_get(x, q, q->q_bytes);
	if (r < 0)
		goto err_free;
	q->cls_q = r;
	if (key_channel(q)) {
		r = kvtd_seq_class_get(x, q, kblk_bytes(p));
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
	kvtd_seq_destroy(x, q);
	return r;
}

int
kvtd_seq_check(const struct kvtd_seq_ctx *x, const struct kvt_seq_params *p)
{
	return seq_params_ok(x, p);
}

int
kvtd_seq_create(const struct kvtd_seq_ctx *x, const struct kvt_seq_params *p,
		struct kvtd_seq **ret_q)
{
	struct kvtd_seq *q;
	int r;

	r = seq_new(x, p, &q);
	if (r < 0)
		return r;
	if (p->ret_update) {
		r = seq_retrieval_init(x, q);
		if (r < 0) {
			kvtd_seq_destroy(x, q);
			return r;
		}
	}
	*ret_q = q;
	return 0;
}

/* Return the pool slots of @n positions (T1 or T2 each, by their tier flag). */
void
seq_free_positions(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint32_t *pos,
		   uint32_t n)
{
	void *b1[COPY_BATCH], *b2[COPY_BATCH];
	uint32_t p1[COPY_BATCH];
	unsigned n1 = 0, n2 = 0;

	for (uint32_t i = 0; i < n; i++) {
		void *p = q->slot[pos[i]];

		if (!p)
			continue;
		if (q->ts.tier[pos[i]] & KVT_TIER_F_INT8) {
			if (key_channel(q))
				seq_kblk_put(x, q, p);
			b2[n2++] = p;
		} else {
			p1[n1] = pos[i];
			b1[n1++] = p;
		}
		q->slot[pos[i]] = NULL;
		if (n1 == COPY_BATCH || n2 == COPY_BATCH || i + 1 == n) {
			seq_t1_release(x, q, p1, b1, n1);
			kvtd_pool_free(x->pool, q->cls_q, n2, x->acct, x->uid_acct, b2);
			n1 = n2 = 0;
		}
	}
	seq_t1_release(x, q, p1, b1, n1);
	kvtd_pool_free(x->pool, q->cls_q, n2, x->acct, x->uid_acct, b2);
}

void
seq_t1_release(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint32_t *pos,
	       void *const *slots, uint32_t n)
{
	struct kvtd_pblock *put[COPY_BATCH];
	void *own[COPY_BATCH];
	unsigned n_put = 0, n_own = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct kvtd_pblock *b = q->blk ? q->blk[pos[i]] : NULL;

		if (b) {
			put[n_put++] = b;
			q->blk[pos[i]] = NULL;
		} else {
			own[n_own++] = slots[i];
		}
	}
	if (n_put) {
		kvtd_prefix_put(x->prefix, put, n_put);
		q->n_shared -= n_put;
	}
	kvtd_pool_free(x->pool, q->cls, n_own, x->acct, x->uid_acct, own);
}

void
kvtd_seq_destroy(const struct kvtd_seq_ctx *x, struct kvtd_seq *q)
{
	if (!q)
		return;
	for (uint32_t i = 0; q->slot && i < q->ts.n;) {
		uint32_t batch[COPY_BATCH], k = 0;

		for (; i < q->ts.n && k < COPY_BATCH; i++)
			batch[k++] = i;
		seq_free_positions(x, q, batch, k);
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
		kvtd_seq_class_put(x, q, q->cls_pg);
	if (q->cls_sk >= 0)
		kvtd_seq_class_put(x, q, q->cls_sk);
	if (q->cls >= 0)
		kvtd_seq_class_put(x, q, q->cls);
	if (q->cls_q >= 0)
		kvtd_seq_class_put(x, q, q->cls_q);
	if (q->cls_kb >= 0)
		kvtd_seq_class_put(x, q, q->cls_kb);
	kvt_dev_buf_put(q->t0_buf);
	kvt_dev_buf_put(q->stage_buf);
	if (q->ns)
		kvtd_prefix_ns_close(x->prefix, q->ns);
	free(q->blk);
	free(q->slot);
	free(q->ts_mem);
	free(q->ws);
	free(q);
}

uint64_t
kvtd_seq_pool_bytes(const struct kvtd_pool *pool, const struct kvtd_seq *q)
{
	uint64_t live = q->ts.n - q->ts.count[KVT_T3];

	/* shared rows are the prefix store's, charged there */
	return (live - q->ts.n_int8 - q->n_shared) * kvtd_pool_slot_size(pool, q->cls) +
	       (uint64_t)q->ts.n_int8 * kvtd_pool_slot_size(pool, q->cls_q) +
	       (q->n_kblk ? q->n_kblk * kvtd_pool_slot_size(pool, q->cls_kb) : 0) + q->ret_bytes;
}

/* Reserve pool slots for @ntok new positions (q->slot[n..n+ntok)). */
static int
seq_reserve(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint32_t ntok)
{
	int r = seq_ensure_cap(q, (uint64_t)q->ts.n + ntok);

	if (r < 0)
		return r;
	return kvtd_pool_alloc(x->pool, q->cls, ntok, x->acct, x->uid_acct, q->slot + q->ts.n);
}

static void
seq_unreserve(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint32_t ntok)
{
	kvtd_pool_free(x->pool, q->cls, ntok, x->acct, x->uid_acct, q->slot + q->ts.n);
	memset(q->slot + q->ts.n, 0, ntok * sizeof(void *));
}

int64_t
kvtd_seq_append_rows(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint8_t *rows,
		     uint32_t ntok)
{
	int r = seq_reserve(x, q, ntok);

	if (r < 0)
		return r;
	for (uint32_t i = 0; i < ntok; i++)
		memcpy(q->slot[q->ts.n + i], rows + (uint64_t)i * q->token_bytes, q->token_bytes);
	r = kvt_tier_append(&q->ts, ntok, NULL);
	if (r < 0) {
		seq_unreserve(x, q, ntok);
		return r;
	}
	q->bytes_in += (uint64_t)ntok * q->token_bytes;
	r = seq_retrieval_flush(q);
	return r < 0 ? r : (int64_t)q->ts.n;
}

/* ---- prefix blocks (prefix.h) ------------------------------------------------------------ */

int64_t
kvtd_seq_join(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, struct kvtd_pns *ns,
	      struct kvtd_pblock *const *blks, uint32_t nblk)
{
	const struct kvt_ns_params *np = &ns->p;
	uint64_t ntok = (uint64_t)nblk * np->block_tokens;
	int r;

	if (np->layers != q->p.layers || np->kv_heads != q->p.kv_heads ||
	    np->head_dim != q->p.head_dim || np->dtype != q->p.dtype)
		return kvtd_seq_fail(x, -EINVAL,
				     "namespace \"%s\" holds rows of %u layers x %u kv heads x %u "
				     "dims (dtype %u); this sequence's are %u x %u x %u (dtype %u)",
				     np->name, np->layers, np->kv_heads, np->head_dim, np->dtype,
				     q->p.layers, q->p.kv_heads, q->p.head_dim, q->p.dtype);
	q->blk = calloc(q->ts.cap, sizeof(*q->blk));
	if (!q->blk)
		return -ENOMEM;
	r = seq_ensure_cap(q, ntok ? ntok : 1);
	if (r == 0 && ntok)
		r = kvt_tier_append(&q->ts, (uint32_t)ntok, NULL);
	if (r < 0) {
		free(q->blk);
		q->blk = NULL;
		return r == -ENOSPC
			   ? kvtd_seq_fail(x, r, "%u blocks of %u tokens pass max_tokens %u", nblk,
					   np->block_tokens, q->p.max_tokens)
			   : r;
	}
	for (uint32_t b = 0; b < nblk; b++) {
		kvtd_prefix_ref(x->prefix, blks[b], np->block_tokens);
		for (uint32_t t = 0; t < np->block_tokens; t++) {
			uint64_t pos = (uint64_t)b * np->block_tokens + t;

			q->slot[pos] = blks[b]->slot[t];
			q->blk[pos] = blks[b];
		}
	}
	q->n_shared = ntok;
	kvtd_prefix_ns_hold(x->prefix, ns);
	q->ns = ns;
	r = seq_retrieval_flush(q);
	return r < 0 ? r : (int64_t)q->ts.n;
}

/* Block @b of @q: -1 not publishable (a position evicted or int8), 0 the sequence's own rows,
 * 1 already the rows of the one block with key @k. */
static int
block_state(const struct kvtd_seq *q, uint32_t b, const struct kvt_block_key *k)
{
	uint32_t bt = q->ns->p.block_tokens;
	struct kvtd_pblock *first = q->blk[(uint64_t)b * bt];

	for (uint32_t t = 0; t < bt; t++) {
		uint64_t pos = (uint64_t)b * bt + t;
		uint8_t tier = q->ts.tier[pos];

		if ((tier & 3) == KVT_T3 || (tier & KVT_TIER_F_INT8) || q->blk[pos] != first)
			return -1;
	}
	if (!first)
		return 0;
	return first->key.lo == k->lo && first->key.hi == k->hi ? 1 : -1;
}

int
kvtd_seq_publish(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const struct kvt_block_key *keys,
		 uint32_t nkeys, uint32_t *ret_new, uint32_t *ret_found)
{
	uint32_t bt, b, n_new = 0, n_found = 0;
	int r = 0;

	*ret_new = *ret_found = 0;
	if (!q->ns)
		return kvtd_seq_fail(x, -EINVAL,
				     "sequence %u was opened without a namespace (SEQ_OPEN's ns)",
				     q->id);
	bt = q->ns->p.block_tokens;
	if ((uint64_t)nkeys * bt > q->ts.n)
		return kvtd_seq_fail(x, -EINVAL,
				     "%u blocks of %u tokens pass the sequence's %u tokens", nkeys,
				     bt, q->ts.n);
	for (b = 0; b < nkeys; b++) {
		struct kvt_block_key k;
		struct kvtd_pblock *blk;
		void **slots = q->slot + (uint64_t)b * bt;
		int st;

		memcpy(&k, &keys[b], sizeof(k)); /* shared memory: read once */
		st = block_state(q, b, &k);
		if (st < 0)
			break;
		if (st == 1) {
			n_found++;
			continue;
		}
		r = kvtd_prefix_publish(x->prefix, q->ns, &k, slots, x->acct, x->uid_acct, &blk);
		if (r < 0)
			break;
		if (r == 0) {
			/* already there: the block's rows replace this sequence's copy */
			kvtd_pool_free(x->pool, q->cls, bt, x->acct, x->uid_acct, slots);
			memcpy(slots, blk->slot, bt * sizeof(void *));
			/* equal rows only as far as the key is honest, or the model deterministic:
			 * TOPK reads the block's now, so must the sketch */
			for (uint32_t t = 0; t < bt; t++) {
				uint32_t pos = b * bt + t;

				seq_retrieval_rekey(q, &pos, 1);
			}
			n_found++;
		} else {
			n_new++;
		}
		for (uint32_t t = 0; t < bt; t++)
			q->blk[(uint64_t)b * bt + t] = blk;
		q->n_shared += bt;
	}
	*ret_new = n_new;
	*ret_found = n_found;
	if (!b && r < 0)
		return r == -ENOSPC ? kvtd_seq_fail(x, r,
						    "the prefix cache (prefix cache_bytes) is full "
						    "of blocks in use")
				    : r;
	return (int)b;
}

int64_t
kvtd_seq_append_t0(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint32_t *slots,
		   uint32_t ntok)
{
	const struct kvt_seq_params *p = &q->p;
	struct kvt_dev_copy rows[COPY_BATCH];
	uint32_t slot_copy[256];
	unsigned nr = 0;
	int r;

	if (!q->t0_buf)
		return kvtd_seq_fail(x, -EINVAL,
				     "F_T0 on a sequence with no T0 region (t0_buf_id 0)");
	if (ntok > 256)
		return kvtd_seq_fail(x, -E2BIG, "ntok %u: at most 256 tokens from T0 at once",
				     ntok);
	/* The arena is shared: read each slot id once, then validate the private copy. */
	memcpy(slot_copy, slots, ntok * sizeof(uint32_t));
	for (uint32_t i = 0; i < ntok; i++) {
		if (slot_copy[i] >= p->t0_slots)
			return kvtd_seq_fail(x, -EINVAL, "T0 slot %u out of range (t0_slots %u)",
					     slot_copy[i], p->t0_slots);
		for (uint32_t j = 0; j < i; j++)
			if (slot_copy[j] == slot_copy[i])
				return kvtd_seq_fail(x, -EINVAL, "T0 slot %u listed twice",
						     slot_copy[i]);
		if (q->ts.slot_pos[slot_copy[i]] >= 0)
			return kvtd_seq_fail(x, -EBUSY, "T0 slot %u still holds position %d",
					     slot_copy[i], (int)q->ts.slot_pos[slot_copy[i]]);
	}
	r = seq_reserve(x, q, ntok);
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
					r = kvt_dev_copy_d2h(x->dev, q->t0_buf, rows, nr);
					if (r < 0)
						goto err;
					nr = 0;
				}
			}
	}
	r = nr ? kvt_dev_copy_d2h(x->dev, q->t0_buf, rows, nr) : 0;
	if (r == 0)
		r = kvt_dev_sync(x->dev);
	if (r == 0)
		r = kvt_dev_event_record(x->dev, x->event);
	if (r == 0)
		r = kvt_tier_append(&q->ts, ntok, slot_copy);
	if (r < 0)
		goto err;
	q->bytes_in += (uint64_t)ntok * q->token_bytes;
	r = seq_retrieval_flush(q);
	return r < 0 ? r : (int64_t)q->ts.n;
err:
	seq_unreserve(x, q, ntok);
	return r;
}

int
kvtd_seq_score_add(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint64_t first, uint32_t count,
		   const float *v)
{
	float copy[1024];
	double sum = 0;
	int r;

	if (first > q->ts.n || count > q->ts.n - first)
		return kvtd_seq_fail(x, -EINVAL,
				     "positions %llu..+%u pass the sequence's %llu tokens",
				     (unsigned long long)first, count, (unsigned long long)q->ts.n);
	/* Check values first (the whole add is refused, nothing changes), from a private copy
	 * so what is checked is what is added. */
	for (uint32_t done = 0; done < count;) {
		uint32_t k = count - done < 1024 ? count - done : 1024;

		memcpy(copy, v + done, k * sizeof(float));
		for (uint32_t i = 0; i < k; i++)
			if (!(copy[i] >= 0.0f) || copy[i] > 1e30f)
				return kvtd_seq_fail(x, -EINVAL,
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

int
kvtd_seq_restore(const struct kvtd_seq_ctx *x, const struct kvt_seq_params *p,
		 const struct kvtd_seq_image *img, struct kvtd_seq **ret_q)
{
	struct kvt_tier_seq ts;
	struct kvtd_seq *q;
	int r;

	if (p->max_tokens && img->n > p->max_tokens)
		return -EINVAL;
	r = seq_new(x, p, &q);
	if (r < 0)
		return r;
	q->no_sketch = img->no_sketch; /* what it had, whatever the config says now */
	if (img->n) {
		r = seq_ensure_cap(q, img->n);
		if (r < 0)
			goto err_abandon;
	}
	r = kvt_tier_seq_restore(&ts, q->ts_mem, q->ts_size, q->ts.cap, q->cfg.t0_slots, img->n,
				 img->gen, img->score, img->tier, img->pos_slot);
	if (r < 0)
		goto err_abandon;
	q->ts = ts;
	if (img->ns) {
		q->blk = calloc(q->ts.cap, sizeof(*q->blk));
		if (!q->blk) {
			r = -ENOMEM;
			goto err_abandon;
		}
		kvtd_prefix_ns_hold(x->prefix, img->ns);
		q->ns = img->ns;
	}
	/* Each live position claims its pool slot back (T1 or T2 by its tier), or references its
	 * shared block's; only evicted positions have none. */
	for (uint32_t i = 0; i < img->n; i++) {
		uint8_t t = img->tier[i];
		int cls = (t & KVT_TIER_F_INT8) ? q->cls_q : q->cls;

		if (img->blk_idx && img->blk_idx[i]) {
			struct kvtd_pblock *b;
			uint32_t bt;

			if (!q->ns || img->blk_idx[i] > img->n_blocks ||
			    (t & KVT_TIER_MASK) == KVT_T3 || (t & KVT_TIER_F_INT8) ||
			    !img->slot_off[i]) {
				r = -EINVAL;
				goto err_abandon;
			}
			b = img->blocks[img->blk_idx[i] - 1];
			bt = q->ns->p.block_tokens;
			if (b->ns != q->ns ||
			    (uint8_t *)b->slot[i % bt] != x->pool->base + img->slot_off[i] - 1) {
				r = -EINVAL;
				goto err_abandon;
			}
			q->slot[i] = b->slot[i % bt];
			q->blk[i] = b;
			q->n_shared++;
			kvtd_prefix_ref(x->prefix, b, 1);
			continue;
		}

		if ((t & KVT_TIER_MASK) == KVT_T3) {
			if (img->slot_off[i]) {
				r = -EINVAL;
				goto err_abandon;
			}
			continue;
		}
		if (!img->slot_off[i]) {
			r = -EINVAL;
			goto err_abandon;
		}
		r = kvtd_pool_claim(x->pool, cls, img->slot_off[i] - 1, x->acct, x->uid_acct,
				    &q->slot[i]);
		if (r < 0)
			goto err_abandon;
	}
	if (key_channel(q)) {
		r = seq_restore_kblks(x, q, img->old_base);
		if (r < 0)
			goto err_abandon;
	}
	q->bytes_in = img->bytes_in;
	q->bytes_out = img->bytes_out;
	q->score_total = img->score_total;
	*ret_q = q;
	return 0;

err_abandon:
	/* No slot goes back: the pool is made again from scratch (restart.c). */
	q->ts.n = 0;
	q->n_kblk = 0;
	kvtd_seq_destroy(x, q);
	return r;
}
