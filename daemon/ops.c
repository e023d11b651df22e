/* SPDX-License-Identifier: MIT */
/*
 * ops.c - the data-path handlers. The SQE is a private copy, but the arena is still shared: a
 * payload that steers control flow (sequence parameters, slot lists) is copied before it is
 * checked; bulk data (rows, scores) is read once and its content cannot hurt the daemon.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "kvtd.h"
#include "ops.h"
#include "seq.h"
#include "session.h"

/* Overflow-safe check that [off, off + len) lies in the arena, with an alignment. */
static void *
arena_range(struct kvtd_session *s, uint64_t off, uint64_t len, unsigned align)
{
	if (off > s->arena_size || len > s->arena_size - off || (off & (align - 1)))
		return NULL;
	return s->arena + off;
}

/* Fields an opcode does not use must be zero (so they can be given meaning later). */
static int
unused_zero(const struct kvt_sqe *e, int arena, int count, int args, int buf)
{
	if (!arena && (e->arena_off || e->arena_len))
		return 0;
	if (!count && e->count)
		return 0;
	if (!args && (e->arg0 || e->arg1 || e->arg2))
		return 0;
	if (!buf && e->buf_id)
		return 0;
	return 1;
}

static int
op_seq_open(struct kvtd_session *s, const struct kvt_sqe *e)
{
	struct kvt_seq_params p;
	const void *src;

	if (e->seq || e->op_flags || !unused_zero(e, 1, 0, 0, 0) || e->arena_len < sizeof(p))
		return -EINVAL;
	src = arena_range(s, e->arena_off, e->arena_len, 8);
	if (!src)
		return -EINVAL;
	memcpy(&p, src, sizeof(p));
	return kvtd_seq_open(s, &p);
}

static int
op_append(struct kvtd_session *s, const struct kvt_sqe *e, struct kvtd_seq *q, struct kvt_cqe *c)
{
	uint64_t first = q->ts.n, len;
	const void *src;
	int64_t r;

	if (!e->count || (e->op_flags & ~KVT_APPEND_F_T0) || !unused_zero(e, 1, 1, 0, 0))
		return -EINVAL;
	if (e->op_flags & KVT_APPEND_F_T0) {
		len = (uint64_t)e->count * sizeof(uint32_t);
		if (e->arena_len != len)
			return -EINVAL;
		src = arena_range(s, e->arena_off, len, 4);
		if (!src)
			return -EINVAL;
		r = kvtd_seq_append_t0(s, q, src, e->count);
	} else {
		len = (uint64_t)e->count * q->token_bytes;
		if (e->arena_len != len)
			return -EINVAL;
		src = arena_range(s, e->arena_off, len, 1);
		if (!src)
			return -EINVAL;
		r = kvtd_seq_append_rows(s, q, src, e->count);
	}
	if (r < 0)
		return (int)r;
	c->aux[0] = first;
	return r > INT32_MAX ? INT32_MAX : (int)r;
}

static int
op_score_add(struct kvtd_session *s, const struct kvt_sqe *e, struct kvtd_seq *q)
{
	const float *v;

	if (e->op_flags || !e->count || e->arg1 || e->arg2 || e->buf_id)
		return -EINVAL;
	if (e->arena_len != (uint64_t)e->count * sizeof(float))
		return -EINVAL;
	v = arena_range(s, e->arena_off, e->arena_len, 4);
	if (!v)
		return -EINVAL;
	return kvtd_seq_score_add(q, e->arg0, e->count, v);
}

static int
op_retier(struct kvtd_session *s, const struct kvt_sqe *e, struct kvtd_seq *q, struct kvt_cqe *c)
{
	uint32_t changes = 0;
	void *out;
	int r;

	if (e->op_flags || !unused_zero(e, 1, 0, 0, 0))
		return -EINVAL;
	out = arena_range(s, e->arena_off, e->arena_len, 8);
	if (!out)
		return -EINVAL;
	r = kvtd_seq_retier(s, q, out, e->arena_len, &changes);
	c->aux[0] = changes;
	return r;
}

static int
op_fetch(struct kvtd_session *s, const struct kvt_sqe *e, struct kvtd_seq *q)
{
	void *list;

	if (e->buf_id || e->arg0 > UINT32_MAX || e->arg1 > UINT32_MAX || (e->arena_len & 3))
		return -EINVAL;
	if ((e->op_flags & KVT_FETCH_F_LIST) ? e->arena_len != (uint64_t)e->count * 4
					     : e->count != 0)
		return -EINVAL;
	list = arena_range(s, e->arena_off, e->arena_len, 4);
	if (!list)
		return -EINVAL;
	return kvtd_seq_fetch(s, q, e->op_flags, (uint32_t)e->arg0, (uint32_t)e->arg1, e->arg2,
			      list, e->arena_len / 4, e->count);
}

static int
op_topk(struct kvtd_session *s, const struct kvt_sqe *e, struct kvtd_seq *q, struct kvt_cqe *c)
{
	const float *query;
	void *out;
	uint64_t n = 0;
	int r;

	if (e->buf_id || e->arg0 > UINT32_MAX || (e->arena_len & 3))
		return -EINVAL;
	query = arena_range(s, e->arena_off, e->arena_len, 4);
	out = arena_range(s, e->arg1, e->arg2, 8);
	if (!query || !out)
		return -EINVAL;
	r = kvtd_seq_topk(s, q, (uint32_t)e->arg0, e->count, e->op_flags, query, e->arena_len / 4,
			  out, e->arg2, &n);
	c->aux[0] = n;
	return r;
}

static int
op_seq_stat(struct kvtd_session *s, const struct kvt_sqe *e, struct kvtd_seq *q)
{
	struct kvt_seq_stat st;
	void *dst;

	if (e->op_flags || !unused_zero(e, 1, 0, 0, 0) || e->arena_len < sizeof(st))
		return -EINVAL;
	dst = arena_range(s, e->arena_off, sizeof(st), 8);
	if (!dst)
		return -EINVAL;
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	st.seq = q->id;
	st.n_tokens = q->ts.n;
	for (int t = 0; t < 4; t++)
		st.tier_count[t] = q->ts.count[t];
	st.pool_bytes = kvtd_seq_pool_bytes(s, q);
	st.bytes_in = q->bytes_in;
	st.bytes_out = q->bytes_out;
	st.score_total = q->score_total;
	memcpy(dst, &st, sizeof(st));
	return sizeof(st);
}

void
kvtd_op_run(struct kvtd_session *s, const struct kvt_sqe *e, struct kvt_cqe *c)
{
	struct kvtd_seq *q = NULL;
	int r;

	c->res = 0;
	c->aux[0] = c->aux[1] = 0;
	if (e->flags & ~KVT_SQE_F_ALL || e->reserved) {
		r = -EINVAL;
		goto out;
	}
	switch (e->opcode) {
	case KVT_OP_NOP:
		r = (e->seq || e->op_flags || !unused_zero(e, 0, 0, 0, 0)) ? -EINVAL : 0;
		goto out;
	case KVT_OP_SEQ_OPEN:
		r = op_seq_open(s, e);
		goto out;
	case KVT_OP_SEQ_CLOSE:
	case KVT_OP_APPEND:
	case KVT_OP_SCORE_ADD:
	case KVT_OP_RETIER:
	case KVT_OP_FETCH:
	case KVT_OP_TOPK:
	case KVT_OP_SEQ_STAT:
		break;
	default:
		r = -EINVAL;
		goto out;
	}
	/* Every remaining opcode names an open sequence. Out of range is -EINVAL; a valid id with
	 * no open sequence behind it is -ENOENT. */
	if (!e->seq || e->seq > s->max_seqs) {
		r = -EINVAL;
		goto out;
	}
	q = kvtd_seq_get(s, e->seq);
	if (!q) {
		r = -ENOENT;
		goto out;
	}
	switch (e->opcode) {
	case KVT_OP_SEQ_CLOSE:
		r = (e->op_flags || !unused_zero(e, 0, 0, 0, 0)) ? -EINVAL
								 : kvtd_seq_close(s, e->seq);
		break;
	case KVT_OP_APPEND:
		r = op_append(s, e, q, c);
		break;
	case KVT_OP_SCORE_ADD:
		r = op_score_add(s, e, q);
		break;
	case KVT_OP_RETIER:
		r = op_retier(s, e, q, c);
		break;
	case KVT_OP_FETCH:
		r = op_fetch(s, e, q);
		break;
	case KVT_OP_TOPK:
		r = op_topk(s, e, q, c);
		break;
	default: /* KVT_OP_SEQ_STAT */
		r = op_seq_stat(s, e, q);
		break;
	}
out:
	c->res = r;
	/* Per-session counters only: the hot path touches no shared cache line. The daemon
	 * totals fold them in when a session ends (session.c). */
	s->ops++;
	if (r < 0) {
		s->errors++;
		if (r == -EINVAL)
			atomic_fetch_add_explicit(&s->d->cnt.refused_einval, 1,
						  memory_order_relaxed);
	}
}
