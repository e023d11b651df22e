/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_dev.h"
#include "kvtd.h"
#include "log.h"
#include "seq.h"
#include "session.h"

static int
frac_ok(float f)
{
	return f >= 0.0f && f <= 1.0f; /* false for NaN too */
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

static int
params_check(const struct kvt_seq_params *p, const char **why)
{
	const uint64_t *res = p->reserved;

	*why = NULL;
	if (p->size < sizeof(*p))
		*why = "size smaller than struct kvt_seq_params";
	else if (p->reserved0 || res[0] || res[1] || res[2] || res[3])
		*why = "reserved field not zero";
	else if (!p->layers || p->layers > KVT_MAX_LAYERS)
		*why = "layers out of range";
	else if (!p->kv_heads || p->kv_heads > KVT_MAX_KV_HEADS)
		*why = "kv_heads out of range";
	else if (!p->head_dim || p->head_dim > KVT_MAX_HEAD_DIM)
		*why = "head_dim out of range";
	else if (p->dtype >= KVT_DTYPE__COUNT)
		*why = "unknown dtype";
	else if (p->policy >= KVT_POLICY__COUNT)
		*why = "unknown policy";
	else if (p->score_mode >= KVT_SCORE__COUNT)
		*why = "unknown score_mode";
	else if (p->protect_prompt > 1)
		*why = "protect_prompt must be 0 or 1";
	else if (!p->delta)
		*why = "delta must be >= 1";
	else if (!frac_ok(p->hbm_frac) || !frac_ok(p->evict_frac) || !frac_ok(p->t2_frac))
		*why = "hbm_frac, evict_frac and t2_frac must lie in [0, 1]";
	else if (p->t0_buf_id && !p->t0_slots)
		*why = "t0_slots must be > 0 with a T0 region";
	else if (p->t0_buf_id && p->window > p->t0_slots)
		*why = "window larger than t0_slots";
	else if (p->t0_buf_id && p->delta >= p->t0_slots)
		*why = "delta must be smaller than t0_slots";
	else if (p->stage_buf_id && !p->stage_slots)
		*why = "stage_slots must be > 0 with a staging region";
	return *why ? -EINVAL : 0;
}

int
kvtd_seq_open(struct kvtd_session *s, const struct kvt_seq_params *p)
{
	struct kvtd *d = s->d;
	struct kvtd_seq *q;
	const char *why;
	unsigned idx;
	int r;

	r = params_check(p, &why);
	if (r < 0) {
		log_debug("session %u: SEQ_OPEN refused: %s", s->id, why);
		return r;
	}
	if (s->n_seqs >= s->max_seqs)
		return -EMFILE;
	for (idx = 0; idx < s->max_seqs && s->seqs[idx]; idx++)
		;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->p = *p;
	q->p.size = sizeof(*p);
	q->row_bytes = (uint64_t)p->kv_heads * p->head_dim * kvt_dtype_size(p->dtype);
	q->token_bytes = (uint64_t)p->layers * 2 * q->row_bytes;
	q->cls = -1;

	if (p->t0_buf_id) {
		q->t0_buf = kvtd_session_buf(s, p->t0_buf_id);
		if (!q->t0_buf) {
			r = -ENOENT;
			goto err_free;
		}
		if (!region_fits(kvt_dev_buf_size(q->t0_buf), p->t0_base_off, p->layers,
				 p->t0_layer_stride, p->t0_kv_stride, p->t0_slots,
				 p->t0_slot_stride, q->row_bytes)) {
			q->t0_buf = NULL;
			r = -ERANGE;
			goto err_free;
		}
		kvt_dev_buf_get(q->t0_buf);
		q->slot_pos = malloc(sizeof(*q->slot_pos) * p->t0_slots);
		if (!q->slot_pos) {
			r = -ENOMEM;
			goto err_free;
		}
		for (uint32_t i = 0; i < p->t0_slots; i++)
			q->slot_pos[i] = -1;
	}
	if (p->stage_buf_id) {
		q->stage_buf = kvtd_session_buf(s, p->stage_buf_id);
		if (!q->stage_buf) {
			r = -ENOENT;
			goto err_free;
		}
		if (!region_fits(kvt_dev_buf_size(q->stage_buf), p->stage_base_off, p->layers,
				 p->stage_layer_stride, p->stage_kv_stride, p->stage_slots,
				 p->stage_slot_stride, q->row_bytes)) {
			q->stage_buf = NULL;
			r = -ERANGE;
			goto err_free;
		}
		kvt_dev_buf_get(q->stage_buf);
	}
	r = kvtd_pool_class_get(&d->pool, q->token_bytes);
	if (r < 0)
		goto err_free;
	q->cls = r;
	q->id = idx + 1;
	s->seqs[idx] = q;
	s->n_seqs++;
	return (int)q->id;

err_free:
	kvtd_seq_destroy(s, q);
	return r;
}

void
kvtd_seq_destroy(struct kvtd_session *s, struct kvtd_seq *q)
{
	struct kvtd *d = s->d;
	uint64_t i = 0;

	if (!q)
		return;
	/* Return slots in batches: one pool lock round trip per batch, not per token. */
	while (i < q->n) {
		void *batch[256];
		unsigned k = 0;

		for (; i < q->n && k < 256; i++)
			if (q->slot[i])
				batch[k++] = q->slot[i];
		kvtd_pool_free(&d->pool, q->cls, k, &s->acct, s->uid_ent ? &s->uid_ent->acct : NULL,
			       batch);
	}
	if (q->cls >= 0)
		kvtd_pool_class_put(&d->pool, q->cls);
	kvt_dev_buf_put(q->t0_buf);
	kvt_dev_buf_put(q->stage_buf);
	free(q->slot);
	free(q->score);
	free(q->tier);
	free(q->slot_pos);
	free(q->pos_slot);
	free(q);
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

static int
seq_grow(struct kvtd_seq *q, uint64_t need)
{
	uint64_t cap = q->cap ? q->cap : 1024;
	void *p;

	if (need <= q->cap)
		return 0;
	if (q->p.max_tokens && need > q->p.max_tokens)
		return -ENOSPC;
	while (cap < need)
		cap *= 2;
#define GROW(field)                                                      \
	do {                                                             \
		p = realloc(q->field, cap * sizeof(*q->field));          \
		if (!p)                                                  \
			return -ENOMEM;                                  \
		q->field = p;                                            \
		memset(q->field + q->cap, 0, (cap - q->cap) * sizeof(*q->field)); \
	} while (0)
	GROW(slot);
	GROW(score);
	GROW(tier);
	GROW(pos_slot);
#undef GROW
	q->cap = cap;
	return 0;
}

/* Reserve pool slots and per-position state for @ntok new positions. */
static int
seq_reserve(struct kvtd_session *s, struct kvtd_seq *q, uint32_t ntok)
{
	int r = seq_grow(q, q->n + ntok);

	if (r < 0)
		return r;
	return kvtd_pool_alloc(&s->d->pool, q->cls, ntok, &s->acct,
			       s->uid_ent ? &s->uid_ent->acct : NULL, q->slot + q->n);
}

static void
seq_commit(struct kvtd_seq *q, uint32_t ntok, const uint32_t *t0_slots)
{
	for (uint32_t i = 0; i < ntok; i++) {
		uint64_t pos = q->n + i;

		q->score[pos] = 0.0f;
		q->pos_slot[pos] = -1;
		q->tier[pos] = KVTD_T1;
		if (t0_slots) {
			int32_t old = q->slot_pos[t0_slots[i]];

			/* The client reused a slot: its previous token keeps its pool copy (T1). */
			if (old >= 0) {
				q->pos_slot[old] = -1;
				q->tier[old] = KVTD_T1;
				q->tier_count[KVTD_T0]--;
				q->tier_count[KVTD_T1]++;
			}
			q->slot_pos[t0_slots[i]] = (int32_t)pos;
			q->pos_slot[pos] = t0_slots[i];
			q->tier[pos] = KVTD_T0;
		}
		q->tier_count[q->tier[pos]]++;
	}
	q->n += ntok;
	q->bytes_in += (uint64_t)ntok * q->token_bytes;
}

int64_t
kvtd_seq_append_rows(struct kvtd_session *s, struct kvtd_seq *q, const uint8_t *rows,
		     uint32_t ntok)
{
	int r = seq_reserve(s, q, ntok);

	if (r < 0)
		return r;
	for (uint32_t i = 0; i < ntok; i++)
		memcpy(q->slot[q->n + i], rows + (uint64_t)i * q->token_bytes, q->token_bytes);
	seq_commit(q, ntok, NULL);
	return (int64_t)q->n;
}

int64_t
kvtd_seq_append_t0(struct kvtd_session *s, struct kvtd_seq *q, const uint32_t *slots,
		   uint32_t ntok)
{
	const struct kvt_seq_params *p = &q->p;
	struct kvt_dev_copy rows[256];
	uint32_t slot_copy[256];
	unsigned nr = 0;
	int r;

	if (!q->t0_buf)
		return -EINVAL;
	if (ntok > 256)
		return -E2BIG;
	/* The arena is shared: read each slot id once, then validate the private copy. */
	memcpy(slot_copy, slots, ntok * sizeof(uint32_t));
	for (uint32_t i = 0; i < ntok; i++) {
		if (slot_copy[i] >= p->t0_slots)
			return -EINVAL;
		for (uint32_t j = 0; j < i; j++)
			if (slot_copy[j] == slot_copy[i])
				return -EINVAL;
	}
	r = seq_reserve(s, q, ntok);
	if (r < 0)
		return r;
	/* One device batch per up to 256 rows: never one copy call per row on CUDA. */
	for (uint32_t i = 0; i < ntok; i++) {
		uint8_t *dst = q->slot[q->n + i];

		for (uint32_t l = 0; l < p->layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				rows[nr].buf_off = p->t0_base_off + l * p->t0_layer_stride +
						   kv * p->t0_kv_stride +
						   slot_copy[i] * p->t0_slot_stride;
				rows[nr].host = dst + (2 * l + kv) * q->row_bytes;
				rows[nr].len = q->row_bytes;
				if (++nr == 256) {
					r = kvt_dev_copy_d2h(s->d->dev, q->t0_buf, rows, nr);
					if (r < 0)
						goto err_free;
					nr = 0;
				}
			}
	}
	if (nr) {
		r = kvt_dev_copy_d2h(s->d->dev, q->t0_buf, rows, nr);
		if (r < 0)
			goto err_free;
	}
	r = kvt_dev_sync(s->d->dev);
	if (r < 0)
		goto err_free;
	seq_commit(q, ntok, slot_copy);
	return (int64_t)q->n;

err_free:
	kvtd_pool_free(&s->d->pool, q->cls, ntok, &s->acct, s->uid_ent ? &s->uid_ent->acct : NULL,
		       q->slot + q->n);
	memset(q->slot + q->n, 0, ntok * sizeof(void *));
	return r;
}
