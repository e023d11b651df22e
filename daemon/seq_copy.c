/* SPDX-License-Identifier: MIT */
/*
 * seq_copy.c - rows from pool slots to a device region: RETIER (quantize, evict, refill promoted
 * T0 slots) and FETCH (rows staged by tier or by list), in batches of COPY_BATCH rows, T2 rows
 * dequantized on the way.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "kvt_dev.h"
#include "log.h"
#include "pool.h"
#include "seq_int.h"

/* Rows of one position for (l, kv), from its pool slot: a pointer into a T1 slot, or the row
 * dequantized from a T2 slot into @tmp. */
static const void *
pos_row(const struct kvtd_seq *q, uint32_t pos, uint32_t l, uint32_t kv, void *tmp)
{
	const uint8_t *slot = q->slot[pos];
	uint32_t r = 2 * l + kv;

	if (!(q->ts.tier[pos] & KVT_TIER_F_INT8))
		return slot + r * q->row_bytes;
	seq_t2_dequant(q, slot, r, 0, q->p.kv_heads, q->p.dtype, tmp);
	return tmp;
}

struct row_batch *
seq_batch_start(const struct kvtd_seq_ctx *x, const struct kvtd_seq *q, struct kvt_dev_buf *buf)
{
	size_t head = (sizeof(struct row_batch) + 63) & ~(size_t)63;
	struct row_batch *b = kvtd_scratch_get(x->scr, SCR_BATCH, head + COPY_BATCH * q->row_bytes);

	if (!b)
		return NULL;
	b->x = x;
	b->buf = buf;
	b->tmp = (uint8_t *)b + head;
	b->n = 0;
	b->last_t1 = false;
	b->bytes = b->bytes_t2 = 0;
	return b;
}

/*
 * Queues the batch's copies without waiting for them (CUDA: they run after the call returns).
 * What they read stays put until they have run: pool slots freed meanwhile are quarantined
 * until the copies' fence completes (pool.h), and rows from the dequantization scratch went
 * through the device layer's bounce buffer before the call returned.
 */
static int
batch_submit(struct row_batch *b)
{
	int r = !b->n ? 0
		: kvt_dev_dequant_ok(b->x->dev)
		    ? kvt_dev_copy_h2d_q8(b->x->dev, b->buf, b->rows, b->n)
		    : kvt_dev_copy_h2d(b->x->dev, b->buf, b->rows, b->n);

	b->n = 0;
	b->last_t1 = false;
	return r;
}

/* The op's last batch: queued, then the session's event recorded after all of the op's copies,
 * so the CQE can be posted at once and the client's stream waits on the event instead. */
int
seq_batch_flush(struct row_batch *b)
{
	int r = batch_submit(b);

	return r < 0 ? r : kvt_dev_event_record(b->x->dev, b->x->event);
}

int
seq_batch_add(struct row_batch *b, const struct kvtd_seq *q, uint32_t pos, uint32_t l, uint32_t kv,
	      uint64_t dst_off)
{
	struct kvt_dev_copy *c = &b->rows[b->n];
	bool t1 = !(q->ts.tier[pos] & KVT_TIER_F_INT8);

	if (t1 && b->last_t1) {
		struct kvt_dev_copy *prev = c - 1;
		const uint8_t *src = (const uint8_t *)q->slot[pos] + (2 * l + kv) * q->row_bytes;

		if ((const uint8_t *)prev->host + prev->len == src &&
		    prev->buf_off + prev->len == dst_off) {
			prev->len += q->row_bytes;
			b->bytes += q->row_bytes;
			return 0;
		}
	}
	b->last_t1 = t1;
	c->buf_off = dst_off;
	c->scale = NULL;
	if ((q->ts.tier[pos] & KVT_TIER_F_INT8) && kvt_dev_dequant_ok(b->x->dev) &&
	    (q->p.dtype == KVT_DTYPE_F16 || q->p.dtype == KVT_DTYPE_BF16)) {
		/* T2 on the CUDA backend: the codes cross as int8 (half the bytes) and the row
		 * kernel dequantizes them with the row's scales, read from the pool slot (or the
		 * key-scale block) when the batch runs. */
		bool ch;

		c->host = (void *)seq_t2_row(q, q->slot[pos], 2 * l + kv, &c->scale, &ch);
		c->len = (uint64_t)q->p.kv_heads * q->p.head_dim;
		c->group = ch ? 1 : q->p.head_dim;
		c->dtype = q->p.dtype;
	} else {
		c->host = (void *)pos_row(q, pos, l, kv, b->tmp + b->n * q->row_bytes);
		c->len = q->row_bytes;
	}
	b->bytes += q->row_bytes;
	if (q->ts.tier[pos] & KVT_TIER_F_INT8)
		b->bytes_t2 += q->row_bytes;
	return ++b->n == COPY_BATCH ? batch_submit(b) : 0;
}

int
kvtd_seq_retier(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, void *out, uint64_t out_len,
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
		return kvtd_seq_fail(x, -ENOSPC,
				     "the output needs %llu bytes, arena_len is %llu "
				     "(KVT_RETIER_OUT_SIZE(t0_slots) always fits)",
				     (unsigned long long)need, (unsigned long long)out_len);
	/* Pool room for the int8 rows first, all or nothing: the only step that may fail for
	 * want of memory, taken before anything is moved. */
	r = seq_quant_room_get(x, q, plan.n_quant, &qr);
	if (r < 0)
		return r;
	if (plan.n_promote) {
		b = seq_batch_start(x, q, q->t0_buf);
		if (!b) {
			r = -ENOMEM;
			goto err_qs;
		}
		/* Only newly promoted positions are copied, every layer, in batches. */
		for (uint32_t i = 0; i < plan.n_promote && r == 0; i++)
			for (uint32_t l = 0; l < q->p.layers && r == 0; l++)
				for (uint32_t kv = 0; kv < 2 && r == 0; kv++)
					r = seq_batch_add(
					    b, q, plan.promote_pos[i], l, kv,
					    t0_off(&q->p, plan.promote_slot[i], l, kv));
		if (r == 0)
			r = seq_batch_flush(b);
		q->bytes_out += b->bytes;
		q->bytes_out_t2 += b->bytes_t2;
		if (r < 0) {
			/* The T0 slots being refilled are in an unknown state now; the plan is
			 * dropped and the client must treat its T0 region as lost. */
			log_err("session %u seq %u: promotion copy failed: %s", x->owner_id, q->id,
				strerror(-r));
			goto err_qs;
		}
	}
	seq_quantize_positions(x, q, plan.quant_pos, &qr);
	seq_quant_room_put(x, q, &qr, true);
	seq_free_positions(x, q, plan.evict_pos, plan.n_evict);
	/* Evicted keys leave the retrieval index, so that TOPK ranks only live keys and returns
	 * min(k, live) per head (topk_dropped() stays as the backstop). */
	for (uint32_t i = 0; q->paris && i < plan.n_evict; i++)
		kvt_paris_seq_drop(q->paris, plan.evict_pos[i]);
	r = kvt_tier_commit(&q->ts, &plan);
	if (r < 0)
		return r;
	/* tier flags set: TOPK reads the quantized keys dequantized, and so must the sketch */
	seq_retrieval_rekey(q, plan.quant_pos, plan.n_quant);

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
	seq_quant_room_put(x, q, &qr, false);
	return r;
}

int
kvtd_seq_fetch(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const struct kvtd_fetch *f)
{
	const struct kvt_seq_params *p = &q->p;
	unsigned flags = f->flags;
	uint32_t layer0 = f->layer0, nlayers = f->nlayers, stage_row = f->stage_row;
	uint32_t *list = f->list, list_cap = f->list_cap, count = f->count;
	struct kvt_dev_buf *buf;
	struct row_batch *b;
	uint32_t *pos, *dst = NULL, m;
	int r;

	if (!q->stage_buf)
		return kvtd_seq_fail(x, -EINVAL,
				     "sequence %u has no staging region (open the "
				     "sequence with stage_buf_id)",
				     q->id);
	if (!nlayers || layer0 >= p->layers || nlayers > p->layers - layer0)
		return kvtd_seq_fail(x, -EINVAL, "layers %u..+%u outside the sequence's %u layers",
				     layer0, nlayers, p->layers);
	if (!flags ||
	    flags & ~(KVT_FETCH_F_T1 | KVT_FETCH_F_T2 | KVT_FETCH_F_LIST | KVT_FETCH_F_ROWS) ||
	    ((flags & KVT_FETCH_F_LIST) && (flags & ~(KVT_FETCH_F_LIST | KVT_FETCH_F_ROWS))) ||
	    ((flags & KVT_FETCH_F_ROWS) && !(flags & KVT_FETCH_F_LIST)))
		return kvtd_seq_fail(x, -EINVAL,
				     "op_flags %#x: give F_T1 and/or F_T2, or F_LIST "
				     "(alone or with F_ROWS)",
				     flags);
	if ((flags & KVT_FETCH_F_ROWS) && stage_row)
		return kvtd_seq_fail(x, -EINVAL,
				     "stage_row %u with F_ROWS: each position's staging row is "
				     "listed; give 0",
				     stage_row);
	r = seq_ensure_ws(q);
	if (r < 0)
		return r;
	pos = q->ws; /* private: positions are validated here and used to index q->slot */
	if (flags & KVT_FETCH_F_LIST) {
		if (!count || count > q->ts.n || count > list_cap)
			return kvtd_seq_fail(x, -EINVAL, "npos %u: F_LIST needs 1..%llu positions",
					     count, (unsigned long long)q->ts.n);
		memcpy(pos, list, count * sizeof(uint32_t));
		if (flags & KVT_FETCH_F_ROWS) {
			dst = pos + q->ts.n; /* private too: validated, then used as offsets */
			memcpy(dst, f->rows, count * sizeof(uint32_t));
			for (uint32_t i = 0; i < count; i++)
				if (dst[i] >= p->stage_slots)
					return kvtd_seq_fail(x, -EINVAL,
							     "staging row %u (entry %u) >= the "
							     "region's %u rows",
							     dst[i], i, p->stage_slots);
		}
		for (uint32_t i = 0; i < count; i++) {
			if (pos[i] >= q->ts.n)
				return kvtd_seq_fail(x, -EINVAL,
						     "position %u (entry %u) >= the %llu tokens",
						     pos[i], i, (unsigned long long)q->ts.n);
			if ((q->ts.tier[pos[i]] & KVT_TIER_MASK) == KVT_T3)
				return kvtd_seq_fail(x, -ENOENT, "position %u was evicted", pos[i]);
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
			return kvtd_seq_fail(x, -ENOSPC, "%u positions, the arena holds %u", m,
					     list_cap);
	}
	if (!dst && (stage_row > p->stage_slots || m > p->stage_slots - stage_row))
		return kvtd_seq_fail(x, -ENOSPC, "%u rows from staging row %u pass its %u rows", m,
				     stage_row, p->stage_slots);
	buf = q->stage_buf;
	if (f->buf_id) {
		/* Another registered buffer, in the region's layout: checked to hold it, and held
		 * until the copies are queued (the device layer drains a buffer's copies before
		 * its last reference goes). */
		buf = seq_region_get(x, f->buf_id, p->stage_base_off, p, p->stage_layer_stride,
				     p->stage_kv_stride, p->stage_slots, p->stage_slot_stride,
				     q->row_bytes, &r);
		if (!buf)
			return r;
	}
	b = seq_batch_start(x, q, buf);
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	r = 0;
	/* In the region's order: where it keeps a row's K and V adjacent (a paged-cache block
	 * layout), K then V of each position, so each pair is one copy from its slot; else each
	 * of K and V as a run of positions. */
	bool kv_inner = p->stage_kv_stride == q->row_bytes;

	for (uint32_t l = layer0; l < layer0 + nlayers && r == 0; l++)
		for (uint32_t o = 0; o < 2 * m && r == 0; o++) {
			uint32_t i = kv_inner ? o / 2 : o % m, kv = kv_inner ? o % 2 : o / m;

			r = seq_batch_add(b, q, pos[i], l, kv,
					  stage_off(p, dst ? dst[i] : stage_row + i, l, kv));
		}
	if (r == 0)
		r = seq_batch_flush(b);
	q->bytes_out += b->bytes;
	q->bytes_out_t2 += b->bytes_t2;
	if (r == 0 && !(flags & KVT_FETCH_F_LIST))
		memcpy(list, pos, m * sizeof(uint32_t));
out:
	if (f->buf_id)
		kvt_dev_buf_put(buf);
	return r < 0 ? r : (int)m;
}
