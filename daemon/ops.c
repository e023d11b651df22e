/* SPDX-License-Identifier: MIT */
/*
 * ops.c - the data path: the SQ consumer (kvtd_session_drain()), one handler per opcode and one
 * table row (kvtd_op_defs) naming the SQE fields, flags and sequence it needs; kvtd_op_run()
 * checks those for every opcode alike.
 * To add an opcode: its number and payload in proto/kvt_abi.h, a kvt_prep_*() in kvtier.h,
 * one row and one handler here, its semantics in the subsystem it acts on (seq*.c, session.c),
 * a line in libkvtier.3. libkvtier exports the prep helper by itself (client/ffi.c); the Python
 * mirror follows by rerunning tools/gen-pyabi.py (the pyabi_current test says when).
 *
 * The SQE is a private copy, but the arena is still shared: a payload that steers control flow
 * (sequence parameters, slot lists) is copied before it is checked; bulk data (rows, scores) is
 * read once and its content cannot hurt the daemon.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>

#include "kvt_ring.h"
#include "kvtd.h"
#include "log.h"
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

int
kvtd_op_fail(struct kvtd_session *s, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvtd_why_vset(&s->why, r, fmt, ap);
	va_end(ap);
	return r;
}

/* The reason for an arena_range() that failed. */
static int
arena_fail(struct kvtd_session *s, uint64_t off, uint64_t len, unsigned align)
{
	return kvtd_op_fail(
	    s, -EINVAL,
	    "payload (arena_off %llu, %llu bytes) is not %u-byte aligned inside the "
	    "%llu-byte arena",
	    (unsigned long long)off, (unsigned long long)len, align,
	    (unsigned long long)s->arena_size);
}

static int
op_nop(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
       struct kvtd_seq *q, struct kvt_cqe *c)
{
	return 0;
}

static int
op_seq_open(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	    struct kvtd_seq *q, struct kvt_cqe *c)
{
	struct kvt_seq_params p;
	struct kvtd_ns_handle *h = NULL;
	const void *src;
	uint64_t n = 0;
	int r;

	if (e->arena_len < sizeof(p))
		return kvtd_op_fail(
		    s, -EINVAL, "arena_len %u is shorter than struct kvt_seq_params (%zu bytes)",
		    e->arena_len, sizeof(p));
	src = arena_range(s, e->arena_off, e->arena_len, 8);
	if (!src)
		return arena_fail(s, e->arena_off, e->arena_len, 8);
	memcpy(&p, src, sizeof(p));
	if (e->ns && !(h = kvtd_session_ns(s, e->ns)))
		return kvtd_op_fail(s, -EINVAL, "ns %llu is not a namespace NS_OPEN returned",
				    (unsigned long long)e->ns);
	if (!h && e->prefix_blocks)
		return kvtd_op_fail(s, -EINVAL, "prefix_blocks %u without a namespace (ns 0)",
				    e->prefix_blocks);
	r = kvtd_session_seq_open(s, &p, h, e->prefix_blocks, &n);
	c->aux[0] = n;
	return r;
}

static int
op_append(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	  struct kvtd_seq *q, struct kvt_cqe *c)
{
	uint64_t first = q->ts.n, len;
	const void *src;
	int64_t r;

	if (!e->ntok)
		return kvtd_op_fail(s, -EINVAL, "ntok is 0: append at least one token");
	if (e->op_flags & KVT_APPEND_F_T0) {
		len = (uint64_t)e->ntok * sizeof(uint32_t);
		if (e->arena_len != len)
			return kvtd_op_fail(
			    s, -EINVAL, "arena_len %u must be ntok (%u) x 4 bytes of T0 slot ids",
			    e->arena_len, e->ntok);
		src = arena_range(s, e->arena_off, len, 4);
		if (!src)
			return arena_fail(s, e->arena_off, len, 4);
		r = kvtd_seq_append_t0(x, q, src, e->ntok);
	} else {
		len = (uint64_t)e->ntok * q->token_bytes;
		if (e->arena_len != len)
			return kvtd_op_fail(
			    s, -EINVAL,
			    "arena_len %u must be ntok (%u) x %llu bytes (a token's "
			    "rows for sequence %u)",
			    e->arena_len, e->ntok, (unsigned long long)q->token_bytes, q->id);
		src = arena_range(s, e->arena_off, len, 1);
		if (!src)
			return arena_fail(s, e->arena_off, len, 1);
		r = kvtd_seq_append_rows(x, q, src, e->ntok);
	}
	if (r < 0)
		return (int)r;
	c->aux[0] = first;
	return r > INT32_MAX ? INT32_MAX : (int)r;
}

static int
op_score_add(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	     struct kvtd_seq *q, struct kvt_cqe *c)
{
	const float *v;

	if (!e->npos || e->arena_len != (uint64_t)e->npos * sizeof(float))
		return kvtd_op_fail(s, -EINVAL,
				    "arena_len %u must be npos (%u) x 4 bytes of f32, npos > 0",
				    e->arena_len, e->npos);
	v = arena_range(s, e->arena_off, e->arena_len, 4);
	if (!v)
		return arena_fail(s, e->arena_off, e->arena_len, 4);
	return kvtd_seq_score_add(x, q, e->first_pos, e->npos, v);
}

static int
op_retier(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	  struct kvtd_seq *q, struct kvt_cqe *c)
{
	uint32_t changes = 0;
	void *out;
	int r;

	out = arena_range(s, e->arena_off, e->arena_len, 8);
	if (!out)
		return arena_fail(s, e->arena_off, e->arena_len, 8);
	r = kvtd_seq_retier(x, q, out, e->arena_len, &changes);
	c->aux[0] = changes;
	return r;
}

static int
op_fetch(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	 struct kvtd_seq *q, struct kvt_cqe *c)
{
	/* u32 positions, and with F_ROWS as many u32 staging rows after them */
	uint64_t per = (e->op_flags & KVT_FETCH_F_ROWS) ? 8 : 4;
	struct kvtd_fetch f;
	uint32_t *list;

	if (e->layer0 > UINT32_MAX || e->nlayers > UINT32_MAX)
		return kvtd_op_fail(s, -EINVAL, "layer0 %llu or nlayers %llu is not a layer count",
				    (unsigned long long)e->layer0, (unsigned long long)e->nlayers);
	if (e->arena_len & 3)
		return kvtd_op_fail(s, -EINVAL,
				    "arena_len %u is not a multiple of 4 (u32 positions)",
				    e->arena_len);
	if ((e->op_flags & KVT_FETCH_F_LIST) ? e->arena_len != (uint64_t)e->npos * per
					     : e->npos != 0)
		return kvtd_op_fail(
		    s, -EINVAL,
		    !(e->op_flags & KVT_FETCH_F_LIST)
			? "arena_len %u, npos %u: npos must be 0 without F_LIST"
		    : per == 8 ? "arena_len %u must be npos (%u) x 8 bytes with F_ROWS (u32 "
				 "positions, then their u32 staging rows)"
			       : "arena_len %u must be npos (%u) x 4 bytes with F_LIST",
		    e->arena_len, e->npos);
	list = arena_range(s, e->arena_off, e->arena_len, 4);
	if (!list)
		return arena_fail(s, e->arena_off, e->arena_len, 4);
	f = (struct kvtd_fetch){
	    .flags = e->op_flags,
	    .layer0 = (uint32_t)e->layer0,
	    .nlayers = (uint32_t)e->nlayers,
	    .stage_row = e->stage_row,
	    .buf_id = e->buf_id,
	    .list = list,
	    .list_cap = (uint32_t)(e->arena_len / per),
	    .count = e->npos,
	    .rows = (e->op_flags & KVT_FETCH_F_ROWS) ? list + e->npos : NULL,
	};
	return kvtd_seq_fetch(x, q, &f);
}

/* The SQE fields TOPK's SQE form uses and its request form must leave zero. */
#define TOPK_SQE_FORM_FLAGS                                                                        \
	(KVT_TOPK_F_UNION | KVT_TOPK_F_FETCH | KVT_TOPK_F_ESTIMATE | KVT_TOPK_F_FAST)

/*
 * TOPK's request, from either form (kvt_abi.h), into @r: the one place its shape is checked
 * (what depends on the sequence is kvtd_seq_topk()'s). The request form is copied out of the
 * arena once, then read only from the copy.
 */
static int
topk_req_get(struct kvtd_session *s, const struct kvt_sqe *e, struct kvt_topk_req *r)
{
	static const char *const modes[] = {"EXACT", "ESTIMATE", "FAST", "PROBE"};
	const uint8_t *src;

	memset(r, 0, sizeof(*r));
	if (!(e->op_flags & KVT_TOPK_F_REQ)) {
		/* ABI 1.0-1.4: the knobs in the SQE, the mode in op_flags */
		if ((e->op_flags & KVT_TOPK_F_ESTIMATE) && (e->op_flags & KVT_TOPK_F_FAST))
			return kvtd_op_fail(s, -EINVAL,
					    "op_flags KVT_TOPK_F_ESTIMATE and KVT_TOPK_F_FAST "
					    "exclude each other (pick one, or send a kvt_topk_req "
					    "with its mode)");
		if (e->probe && !(e->op_flags & KVT_TOPK_F_FAST))
			return kvtd_op_fail(s, -EINVAL,
					    "probe %u without KVT_TOPK_F_FAST (the probe picks the "
					    "keys the fast path scans: set both, or probe 0)",
					    e->probe);
		if (e->layer > UINT32_MAX)
			return kvtd_op_fail(s, -EINVAL, "layer %llu out of range",
					    (unsigned long long)e->layer);
		r->size = sizeof(*r);
		r->mode = e->probe			      ? KVT_TOPK_PROBE
			  : e->op_flags & KVT_TOPK_F_FAST     ? KVT_TOPK_FAST
			  : e->op_flags & KVT_TOPK_F_ESTIMATE ? KVT_TOPK_ESTIMATE
							      : KVT_TOPK_EXACT;
		r->flags = e->op_flags & (KVT_TOPK_F_UNION | KVT_TOPK_F_FETCH);
		r->layer = (uint32_t)e->layer;
		r->k = e->k;
		r->probe = e->probe;
		r->query_off = e->arena_off;
		r->query_len = e->arena_len;
		r->out_off = e->out_off;
		r->out_len = e->out_len;
	} else {
		if (e->op_flags & TOPK_SQE_FORM_FLAGS)
			return kvtd_op_fail(
			    s, -EINVAL,
			    "op_flags %#x: with KVT_TOPK_F_REQ the request carries "
			    "the flags and mode, op_flags must be KVT_TOPK_F_REQ alone",
			    e->op_flags);
		if (e->count || e->arg0 || e->arg1 || e->arg2 || e->arg3)
			return kvtd_op_fail(
			    s, -EINVAL,
			    "SQE k/layer/out_off/out_len/probe set with "
			    "KVT_TOPK_F_REQ: the request carries them, they must be 0");
		if (e->arena_len < KVT_TOPK_REQ_SIZE0)
			return kvtd_op_fail(
			    s, -EINVAL,
			    "arena_len %u is shorter than struct kvt_topk_req (%u bytes)",
			    e->arena_len, KVT_TOPK_REQ_SIZE0);
		src = arena_range(s, e->arena_off, e->arena_len, 8);
		if (!src)
			return arena_fail(s, e->arena_off, e->arena_len, 8);
		memcpy(r, src, sizeof(*r));
		if (r->size < KVT_TOPK_REQ_SIZE0 || r->size > e->arena_len)
			return kvtd_op_fail(s, -EINVAL,
					    "request size %u: must be at least %u and at most "
					    "arena_len %u (set it to sizeof(struct kvt_topk_req))",
					    r->size, KVT_TOPK_REQ_SIZE0, e->arena_len);
		/* A newer client's fields this kvtierd does not know: harmless only as zero. */
		for (uint32_t i = sizeof(*r); i < r->size; i++)
			if (src[i])
				return kvtd_op_fail(
				    s, -E2BIG,
				    "request byte %u is not zero: a field of a newer ABI than this "
				    "kvtierd's %u.%u (size %u, it knows %zu bytes)",
				    i, KVT_ABI_MAJOR, KVT_ABI_MINOR, r->size, sizeof(*r));
		for (unsigned i = 0; i < sizeof(r->reserved) / sizeof(r->reserved[0]); i++)
			if (r->reserved[i])
				return kvtd_op_fail(s, -EINVAL,
						    "request reserved[%u] is %#llx, must be 0", i,
						    (unsigned long long)r->reserved[i]);
		if (r->mode >= KVT_TOPK__MODES)
			return kvtd_op_fail(
			    s, -EINVAL,
			    "mode %u unknown (KVT_TOPK_EXACT 0, ESTIMATE 1, FAST 2, "
			    "PROBE 3)",
			    r->mode);
		if (r->flags & ~(KVT_TOPK_F_UNION | KVT_TOPK_F_FETCH))
			return kvtd_op_fail(s, -EINVAL,
					    "request flags %#x: only KVT_TOPK_F_UNION and "
					    "KVT_TOPK_F_FETCH are flags (the mode field picks the "
					    "scoring)",
					    r->flags);
		if ((r->mode == KVT_TOPK_PROBE) != (r->probe != 0))
			return kvtd_op_fail(s, -EINVAL,
					    r->probe
						? "probe %u with mode %s: only KVT_TOPK_PROBE "
						  "scans a probe (set the mode, or probe 0)"
						: "probe %u with mode %s: KVT_TOPK_PROBE needs "
						  "the live keys to scan, > 0",
					    r->probe, modes[r->mode]);
	}
	if (!r->k)
		return kvtd_op_fail(s, -EINVAL, "k is 0: ask for at least one position");
	if (r->query_len & 3)
		return kvtd_op_fail(s, -EINVAL, "query_len %u is not a multiple of 4 (f32 query)",
				    r->query_len);
	if (!arena_range(s, r->query_off, r->query_len, 4))
		return arena_fail(s, r->query_off, r->query_len, 4);
	if (!arena_range(s, r->out_off, r->out_len, 8))
		return kvtd_op_fail(
		    s, -EINVAL,
		    "output (out_off %llu, out_len %u) is not 8-byte aligned inside "
		    "the %llu-byte arena",
		    (unsigned long long)r->out_off, r->out_len, (unsigned long long)s->arena_size);
	return 0;
}

static int
op_topk(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	struct kvtd_seq *q, struct kvt_cqe *c)
{
	struct kvt_topk_req req;
	uint64_t n = 0;
	int r;

	r = topk_req_get(s, e, &req);
	if (r < 0)
		return r;
	r = kvtd_seq_topk(x, q, &req, (const float *)(s->arena + req.query_off),
			  s->arena + req.out_off, &n);
	c->aux[0] = n;
	return r;
}

static int
op_seq_close(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	     struct kvtd_seq *q, struct kvt_cqe *c)
{
	return kvtd_session_seq_close(s, q->id);
}

static int
op_seq_stat(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	    struct kvtd_seq *q, struct kvt_cqe *c)
{
	struct kvt_seq_stat st;
	void *dst;

	if (e->arena_len < sizeof(st))
		return kvtd_op_fail(s, -EINVAL,
				    "arena_len %u is shorter than struct kvt_seq_stat (%zu bytes)",
				    e->arena_len, sizeof(st));
	dst = arena_range(s, e->arena_off, sizeof(st), 8);
	if (!dst)
		return arena_fail(s, e->arena_off, sizeof(st), 8);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	st.seq = q->id;
	st.n_tokens = q->ts.n;
	for (int t = 0; t < 4; t++)
		st.tier_count[t] = q->ts.count[t];
	st.pool_bytes = kvtd_seq_pool_bytes(x->pool, q);
	st.bytes_in = q->bytes_in;
	st.bytes_out = q->bytes_out;
	st.score_total = q->score_total;
	memcpy(dst, &st, sizeof(st));
	return sizeof(st);
}

static int
op_ns_open(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	   struct kvtd_seq *q, struct kvt_cqe *c)
{
	struct kvt_ns_params np;
	const void *src;
	int r;

	if (e->arena_len < sizeof(np))
		return kvtd_op_fail(s, -EINVAL,
				    "arena_len %u is shorter than struct kvt_ns_params (%zu bytes)",
				    e->arena_len, sizeof(np));
	src = arena_range(s, e->arena_off, e->arena_len, 8);
	if (!src)
		return arena_fail(s, e->arena_off, e->arena_len, 8);
	memcpy(&np, src, sizeof(np));
	r = kvtd_session_ns_open(s, &np);
	if (r > 0)
		c->aux[0] = kvtd_session_ns(s, (uint64_t)r)->ns->p.block_tokens;
	return r;
}

/* The handle SQE field ns names, or NULL with the refusal's reason stated. */
static struct kvtd_ns_handle *
ns_get(struct kvtd_session *s, const struct kvt_sqe *e)
{
	struct kvtd_ns_handle *h = kvtd_session_ns(s, e->ns);

	if (!h)
		kvtd_op_fail(s, -EINVAL, "ns %llu is not a namespace NS_OPEN returned (1..%u)",
			     (unsigned long long)e->ns, KVT_MAX_NS);
	return h;
}

static int
op_ns_close(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	    struct kvtd_seq *q, struct kvt_cqe *c)
{
	return ns_get(s, e) ? kvtd_session_ns_close(s, e->ns) : -EINVAL;
}

/* The @nkeys block keys LOOKUP and PUBLISH carry, or NULL with the reason stated. */
static const struct kvt_block_key *
keys_get(struct kvtd_session *s, const struct kvt_sqe *e)
{
	uint64_t len = (uint64_t)e->nkeys * sizeof(struct kvt_block_key);
	const struct kvt_block_key *k;

	if (!e->nkeys || e->arena_len != len) {
		kvtd_op_fail(s, -EINVAL, "arena_len %u must be nkeys (%u) x 16 bytes, nkeys > 0",
			     e->arena_len, e->nkeys);
		return NULL;
	}
	k = arena_range(s, e->arena_off, len, 8);
	if (!k)
		arena_fail(s, e->arena_off, len, 8);
	return k;
}

static int
op_lookup(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	  struct kvtd_seq *q, struct kvt_cqe *c)
{
	struct kvtd_ns_handle *h = ns_get(s, e);
	const struct kvt_block_key *keys;
	int r;

	if (!h)
		return -EINVAL;
	keys = keys_get(s, e);
	if (!keys)
		return -EINVAL;
	r = kvtd_session_lookup(s, h, keys, e->nkeys, e->op_flags & KVT_LOOKUP_F_PIN);
	if (r > 0)
		c->aux[0] = (uint64_t)r * h->ns->p.block_tokens;
	return r;
}

static int
op_publish(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
	   struct kvtd_seq *q, struct kvt_cqe *c)
{
	const struct kvt_block_key *keys = keys_get(s, e);
	uint32_t n_new, n_found;
	int r;

	if (!keys)
		return -EINVAL;
	r = kvtd_seq_publish(x, q, keys, e->nkeys, &n_new, &n_found);
	c->aux[0] = n_new;
	c->aux[1] = n_found;
	return r;
}

/* SQE fields an opcode reads (struct kvtd_op_def.fields); every other one must be zero. */
enum {
	F_ARENA = 1 << 0, /* arena_off, arena_len */
	F_COUNT = 1 << 1,
	F_ARG0 = 1 << 2,
	F_ARG1 = 1 << 3,
	F_ARG2 = 1 << 4,
	F_BUF = 1 << 5,
	F_ARG3 = 1 << 6,
};

/* An SQE as four 16-byte vectors, for checking every field at once (kvtd_op_def.zero). */
typedef uint64_t kvtd_u64x2 __attribute__((vector_size(16)));
union kvtd_sqe_words {
	struct kvt_sqe sqe;
	kvtd_u64x2 v[sizeof(struct kvt_sqe) / 16];
};
_Static_assert(sizeof(union kvtd_sqe_words) == sizeof(struct kvt_sqe), "kvtd_sqe_words");

/* The SQE bits an opcode requires to be zero: undefined SQE flags and op_flags, seq where it
 * names no sequence, every field outside @f. The stamp and user_data are never checked. */
#define ZERO_MASK(fl_, opf_, seq_)                                                                 \
	{                                                                                          \
		.sqe = {.flags = (uint8_t)~KVT_SQE_F_ALL,                                          \
			.op_flags = (uint16_t) ~(opf_),                                            \
			.seq = (seq_) ? 0 : UINT32_MAX,                                            \
			.arena_off = (fl_)&F_ARENA ? 0 : UINT64_MAX,                               \
			.arena_len = (fl_)&F_ARENA ? 0 : UINT32_MAX,                               \
			.count = (fl_)&F_COUNT ? 0 : UINT32_MAX,                                   \
			.arg0 = (fl_)&F_ARG0 ? 0 : UINT64_MAX,                                     \
			.arg1 = (fl_)&F_ARG1 ? 0 : UINT64_MAX,                                     \
			.arg2 = (fl_)&F_ARG2 ? 0 : UINT32_MAX,                                     \
			.buf_id = (fl_)&F_BUF ? 0 : UINT32_MAX,                                    \
			.arg3 = (fl_)&F_ARG3 ? 0 : UINT32_MAX }                                    \
	}

/*
 * struct kvtd_op_def - everything the dispatcher checks before an opcode's handler runs.
 * @fields: F_* the opcode reads; the others must be zero, so they can take a meaning later.
 * @op_flags: the KVT_<OP>_F_* bits it accepts.
 * @needs_seq: it names an open sequence (out of range: -EINVAL, not open: -ENOENT); if not,
 *	seq must be 0 and the handler gets q == NULL and x == NULL.
 * @run: validates what only the opcode knows (lengths, ranges) and acts. Returns the CQE res;
 *	may set c->aux.
 * @zero: the three above as one mask of the bits that must be zero, checked in a few
 *	instructions per op (OP() derives it; nothing to keep in step by hand).
 */
struct kvtd_op_def {
	const char *name;
	uint8_t fields;
	uint16_t op_flags;
	bool needs_seq;
	int (*run)(struct kvtd_session *s, const struct kvtd_seq_ctx *x, const struct kvt_sqe *e,
		   struct kvtd_seq *q, struct kvt_cqe *c);
	union kvtd_sqe_words zero;
};

#define OP(name_, fl_, opf_, seq_, run_)                                                           \
	{                                                                                          \
		.name = (name_), .fields = (fl_), .op_flags = (opf_), .needs_seq = (seq_),         \
		.run = (run_), .zero = ZERO_MASK(fl_, opf_, seq_)                                  \
	}

static const struct kvtd_op_def kvtd_op_defs[] = {
    [KVT_OP_NOP] = OP("nop", 0, 0, false, op_nop),
    [KVT_OP_SEQ_OPEN] = OP("seq_open", F_ARENA | F_COUNT | F_ARG0, 0, false, op_seq_open),
    [KVT_OP_SEQ_CLOSE] = OP("seq_close", 0, 0, true, op_seq_close),
    [KVT_OP_APPEND] = OP("append", F_ARENA | F_COUNT, KVT_APPEND_F_T0, true, op_append),
    [KVT_OP_SCORE_ADD] = OP("score_add", F_ARENA | F_COUNT | F_ARG0, 0, true, op_score_add),
    [KVT_OP_RETIER] = OP("retier", F_ARENA, 0, true, op_retier),
    [KVT_OP_FETCH] =
	OP("fetch", F_ARENA | F_COUNT | F_ARG0 | F_ARG1 | F_ARG2 | F_BUF,
	   KVT_FETCH_F_T1 | KVT_FETCH_F_T2 | KVT_FETCH_F_LIST | KVT_FETCH_F_ROWS, true, op_fetch),
    [KVT_OP_TOPK] = OP("topk", F_ARENA | F_COUNT | F_ARG0 | F_ARG1 | F_ARG2 | F_ARG3,
		       TOPK_SQE_FORM_FLAGS | KVT_TOPK_F_REQ, true, op_topk),
    [KVT_OP_SEQ_STAT] = OP("seq_stat", F_ARENA, 0, true, op_seq_stat),
    [KVT_OP_NS_OPEN] = OP("ns_open", F_ARENA, 0, false, op_ns_open),
    [KVT_OP_NS_CLOSE] = OP("ns_close", F_ARG0, 0, false, op_ns_close),
    [KVT_OP_LOOKUP] = OP("lookup", F_ARENA | F_COUNT | F_ARG0, KVT_LOOKUP_F_PIN, false, op_lookup),
    [KVT_OP_PUBLISH] = OP("publish", F_ARENA | F_COUNT, 0, true, op_publish),
};
_Static_assert(sizeof(kvtd_op_defs) / sizeof(kvtd_op_defs[0]) == KVT_OP__COUNT,
	       "one kvtd_op_defs row per opcode");

const char *
kvtd_op_name(unsigned opcode)
{
	return opcode < KVT_OP__COUNT && kvtd_op_defs[opcode].name ? kvtd_op_defs[opcode].name
								   : "unknown";
}

/* No bit of @e that @def requires to be zero is set: four vector ANDs and ORs. */
static inline bool
sqe_zero_ok(const struct kvt_sqe *e, const struct kvtd_op_def *def)
{
	const kvtd_u64x2 *m = def->zero.v;
	kvtd_u64x2 v0, v1, v2, v3, acc;

	memcpy(&v0, (const char *)e, 16);
	memcpy(&v1, (const char *)e + 16, 16);
	memcpy(&v2, (const char *)e + 32, 16);
	memcpy(&v3, (const char *)e + 48, 16);
	acc = (v0 & m[0]) | (v1 & m[1]) | (v2 & m[2]) | (v3 & m[3]);
	return !(acc[0] | acc[1]);
}

/* The first field outside @fields that is not zero, or NULL: the refusal's reason, computed only
 * once unused_zero() failed. Generic names: kvt_abi.h gives each its per-opcode aliases. */
static const char *
unused_nonzero(const struct kvt_sqe *e, unsigned fields, uint64_t *ret_val)
{
	const struct {
		unsigned bit;
		const char *name;
		uint64_t val;
	} f[] = {
	    {F_ARENA, "arena_off", e->arena_off},
	    {F_ARENA, "arena_len", e->arena_len},
	    {F_COUNT, "count", e->count},
	    {F_ARG0, "arg0", e->arg0},
	    {F_ARG1, "arg1", e->arg1},
	    {F_ARG2, "arg2", e->arg2},
	    {F_BUF, "buf_id", e->buf_id},
	    {F_ARG3, "arg3", e->arg3},
	};

	for (unsigned i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		if (!(fields & f[i].bit) && f[i].val) {
			*ret_val = f[i].val;
			return f[i].name;
		}
	return NULL;
}

/* The room left under an account's limit (0 past it). */
static uint64_t
acct_room(const struct kvtd_acct *a)
{
	return a->bytes < a->limit ? a->limit - a->bytes : 0;
}

/*
 * The reason of an -EDQUOT or -ENOMEM no handler explained (the pool's refusals): the limit in
 * play, its value and what the session and its uid hold, read under the pool lock.
 */
static void
why_pool(struct kvtd_session *s, int r)
{
	struct kvtd_pool *pool = s->ctx.pool;
	struct kvtd_acct sa = kvtd_pool_acct_read(pool, &s->acct), ua = {0, 0};
	unsigned uid = s->uid_ent ? (unsigned)s->uid_ent->uid : 0;
	const char *key = s->uid_ent ? s->uid_ent->limit_key : "pool_bytes_per_uid";
	struct kvtd_pool_usage u;

	if (s->uid_ent)
		ua = kvtd_pool_acct_read(pool, &s->uid_ent->acct);
	if (r == -EDQUOT && ua.limit && (!sa.limit || acct_room(&ua) <= acct_room(&sa))) {
		kvtd_op_fail(
		    s, r, "%s: uid %u may hold %llu pool bytes and holds %llu (this session %llu)",
		    key, uid, (unsigned long long)ua.limit, (unsigned long long)ua.bytes,
		    (unsigned long long)sa.bytes);
	} else if (r == -EDQUOT && sa.limit) {
		kvtd_op_fail(
		    s, r,
		    "pool_bytes_per_session: a session may hold %llu pool bytes and this one "
		    "holds %llu (uid %u %llu)",
		    (unsigned long long)sa.limit, (unsigned long long)sa.bytes, uid,
		    (unsigned long long)ua.bytes);
	} else if (r == -ENOMEM) {
		kvtd_pool_usage(pool, &u);
		/* with a chunk free the pool could have served it: malloc failed */
		kvtd_op_fail(s, r,
			     "%s: %llu bytes, %llu in use, %llu of %llu chunks free; this session "
			     "holds %llu, uid %u %llu (%s %llu, 0: none)",
			     u.chunks_free ? "out of memory, the pool" : "pool full",
			     (unsigned long long)u.size, (unsigned long long)u.used,
			     (unsigned long long)u.chunks_free, (unsigned long long)u.chunks,
			     (unsigned long long)sa.bytes, uid, (unsigned long long)ua.bytes, key,
			     (unsigned long long)ua.limit);
	}
}

/*
 * A refused op: the reason (the handler's, else strerror) goes to the debug log and to the
 * session's shared error record, before the caller posts the CQE, whose release store then
 * publishes the record too. Only on the error path; the record is written, never read.
 */
static __attribute__((cold, noinline)) void
op_refused(struct kvtd_session *s, const struct kvt_sqe *e, int r)
{
	const char *name = kvtd_op_name(e->opcode);
	char op[24];
	unsigned i;

	if (e->opcode < KVT_OP__COUNT)
		for (i = 0; name[i] && i < sizeof(op) - 1; i++)
			op[i] = (char)toupper((unsigned char)name[i]);
	else
		i = (unsigned)snprintf(op, sizeof(op), "OPCODE %u", e->opcode);
	op[i] = '\0';
	if (!s->why.set && (r == -EDQUOT || r == -ENOMEM) && s->ctx.pool)
		why_pool(s, r);
	if (!s->why.set)
		snprintf(s->why.msg, sizeof(s->why.msg), "%s", strerror(-r));
	/* The journal gets SESSION=, PID=, SEQ= and OP= with it (log.h). */
	kvtd_log_f(
	    KVTD_LOG_DEBUG,
	    &(struct kvtd_log_fields){.session = s->id, .pid = s->pid, .seq = e->seq, .op = name},
	    "session %u (pid %d): %s refused (seq %u, user_data %#llx): %s: %s", s->id, (int)s->pid,
	    op, e->seq, (unsigned long long)e->user_data, strerror(-r), s->why.msg);
	if (s->op_err) {
		struct kvt_op_err *x = s->op_err;

		kvt_op_err_begin(x, &s->op_err_gen);
		x->res = r;
		x->user_data = e->user_data;
		x->opcode = e->opcode;
		memset(x->reserved0, 0, sizeof(x->reserved0));
		x->seq = e->seq;
		x->reserved[0] = 0;
		/* Long reasons are cut (precision: the cut is meant, not a warning). */
		snprintf(x->msg, sizeof(x->msg), "%s: %.*s", op,
			 (int)(sizeof(x->msg) - 3 - strlen(op)), s->why.msg);
		kvt_op_err_end(x, &s->op_err_gen);
	}
}

/*
 * Why kvtd_op_run() refused @e before its handler: the checks every opcode shares, in order,
 * each with its reason. Cold and out of line, so the hot path stays a few compares.
 */
static __attribute__((cold, noinline)) int
op_check_fail(struct kvtd_session *s, const struct kvt_sqe *e)
{
	const struct kvtd_op_def *def;
	const char *field;
	uint64_t val = 0;

	if (e->opcode >= KVT_OP__COUNT)
		return kvtd_op_fail(s, -EINVAL,
				    "unknown opcode %u (this kvtierd knows 0..%u, ABI %u.%u)",
				    e->opcode, KVT_OP__COUNT - 1, KVT_ABI_MAJOR, KVT_ABI_MINOR);
	if (e->flags & ~KVT_SQE_F_ALL)
		return kvtd_op_fail(s, -EINVAL, "SQE flags %#x: none is defined, flags must be 0",
				    e->flags);
	def = &kvtd_op_defs[e->opcode];
	if (def->needs_seq) {
		/* Out of range is -EINVAL; a valid id with no open sequence behind it, -ENOENT. */
		if (!e->seq || e->seq > s->max_seqs)
			return kvtd_op_fail(
			    s, -EINVAL,
			    "seq %u out of range (ids are 1..%u: the id SEQ_OPEN returned)", e->seq,
			    s->max_seqs);
		if (!kvtd_session_seq(s, e->seq))
			return kvtd_op_fail(s, -ENOENT,
					    "seq %u is not open (closed, or never opened)", e->seq);
	} else if (e->seq) {
		return kvtd_op_fail(s, -EINVAL,
				    "seq is %u, must be 0: this opcode names no sequence", e->seq);
	}
	if (e->op_flags & ~def->op_flags)
		return kvtd_op_fail(s, -EINVAL,
				    "op_flags %#x has bits %#x this opcode does not define",
				    e->op_flags, e->op_flags & ~def->op_flags);
	field = unused_nonzero(e, def->fields, &val);
	return kvtd_op_fail(s, -EINVAL,
			    "field %s is %#llx, but this opcode does not use it: it must be 0",
			    field ? field : "?", (unsigned long long)val);
}

/* An op on sequence @q (not SEQ_CLOSE, which frees it): its handler, then the bytes it moved
 * by direction and flow (kvtier_tier_bytes_total). Out of line: a NOP needs none of it. */
static __attribute__((noinline)) int
op_run_seq(struct kvtd_session *s, const struct kvtd_op_def *def, const struct kvt_sqe *e,
	   struct kvtd_seq *q, struct kvt_cqe *c)
{
	uint64_t in = q->bytes_in, out = q->bytes_out, out_t2 = q->bytes_out_t2;
	uint64_t quant = q->bytes_quant;
	int r = def->run(s, kvtd_session_ctx(s), e, q, c);

	in = q->bytes_in - in;
	out = q->bytes_out - out;
	out_t2 = q->bytes_out_t2 - out_t2;
	s->opst.bytes_in[e->opcode] += in;
	s->opst.bytes_out[e->opcode] += out;
	s->opst.flow_bytes[KVTD_FLOW_CLIENT_T1] += in;
	s->opst.flow_bytes[KVTD_FLOW_T1_T2] += q->bytes_quant - quant;
	s->opst.flow_bytes[KVTD_FLOW_T1_DEVICE] += out - out_t2;
	s->opst.flow_bytes[KVTD_FLOW_T2_DEVICE] += out_t2;
	return r;
}

uint64_t
kvtd_op_run(struct kvtd_session *s, const struct kvt_sqe *e, struct kvt_cqe *c, uint64_t start_ns)
{
	const struct kvtd_op_def *def = &kvtd_op_defs[e->opcode < KVT_OP__COUNT ? e->opcode : 0];
	struct kvtd_seq *q = NULL;
	uint64_t end_ns = 0;
	int r;

	c->res = 0;
	c->aux[0] = c->aux[1] = 0;
	s->why.set = 0; /* a reason stated outside an op (a restore) must not explain this one */
	if (def->needs_seq)
		q = kvtd_session_seq(s, e->seq);
	/* Every check the opcodes share, as plain compares; op_check_fail() says which failed. */
	if (__builtin_expect(
		e->opcode >= KVT_OP__COUNT || !sqe_zero_ok(e, def) || (def->needs_seq && !q), 0)) {
		r = op_check_fail(s, e);
	} else if (q && e->opcode != KVT_OP_SEQ_CLOSE) { /* SEQ_CLOSE frees q */
		r = op_run_seq(s, def, e, q, c);
	} else {
		/* The sequence context only for ops that name a sequence: the others never read
		 * it, and building it costs a NOP a good part of its time. */
		r = def->run(s, q ? kvtd_session_ctx(s) : NULL, e, q, c);
	}
	c->res = r;
	/* Per-session counters only: the hot path touches no shared cache line. The daemon
	 * totals fold them in when a session ends (listen.c). */
	kvtd_op_stats_add(&s->opst, e->opcode, r);
	if (start_ns) {
		end_ns = kvtd_now_ns();
		kvtd_op_stats_time(&s->opst, e->opcode, end_ns - start_ns);
	}
	s->ops++;
	if (__builtin_expect(r < 0, 0)) {
		s->errors++;
		if (r == -EINVAL)
			atomic_fetch_add_explicit(&s->d->cnt.refused_einval, 1,
						  memory_order_relaxed);
		op_refused(s, e, r);
	}
	return end_ns;
}

/* Whether to time the next op: every op after a random gap of 1 to 2 * KVTD_OP_TIME_SAMPLE - 1
 * ops (xorshift32), so on average one in KVTD_OP_TIME_SAMPLE, never in step with a client's
 * periodic pattern of ops. The common case is a decrement. */
static inline int
time_this_op(struct kvtd_session *s)
{
	uint32_t x;

	if (--s->time_gap)
		return 0;
	x = s->time_rng;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	s->time_rng = x;
	s->time_gap = 1 + x % (2 * KVTD_OP_TIME_SAMPLE - 1);
	return 1;
}

unsigned
kvtd_session_drain(struct kvtd_session *s, uint64_t slice_ns)
{
	uint32_t space, n = 0;
	uint64_t t0 = 0, now = 0; /* now: the last op's end when it was read, else 0 */

	if (s->broken)
		return 0;
	/* The client's CQ head lives on a line the client writes: read it only when our copy says
	 * the CQ may be full, saving a cache-line transfer per op. */
	space = kvt_ring_space(s->cq_entries, s->cq_head_seen, s->cq_tail);
	if (space < s->sq_entries) {
		s->cq_head_seen = kvt_ring_load_head(s->cq);
		space = kvt_ring_space(s->cq_entries, s->cq_head_seen, s->cq_tail);
		if (space > s->cq_entries) {
			kvtd_session_break(s, "CQ head out of range (ring corrupt)");
			return 0;
		}
	}
	/* A full CQ leaves SQEs queued: libkvtier never has more in flight than the CQ holds. */
	while (n < space) {
		struct kvt_sqe *slot = &s->sqes[s->sq_head & (s->sq_entries - 1)];
		struct kvt_cqe *out = &s->cqes[s->cq_tail & (s->cq_entries - 1)];
		struct kvt_sqe sqe;
		struct kvt_cqe cqe;
		uint64_t start = 0;

		if (!kvt_ring_load_stamp(&slot->stamp, s->sq_head))
			break;
		/* A clock read costs about as much as a NOP: alone on its poller a session times
		 * a random 1/KVTD_OP_TIME_SAMPLE of its ops. Sharing it, the slice reads the clock
		 * after every op anyway, and every op is timed: the previous op's end is this
		 * one's start. */
		if (slice_ns) {
			if (!n)
				t0 = now = kvtd_now_ns();
			else if (now - t0 >= slice_ns)
				break; /* the rest next round, after the other sessions */
			start = now;
		} else if (time_this_op(s)) {
			start = now ? now : kvtd_now_ns();
		}
		/* Copy once: the client may rewrite the entry while we work on it. */
		memcpy(&sqe, slot, sizeof(sqe));
		cqe.user_data = sqe.user_data;
		now = kvtd_op_run(s, &sqe, &cqe, start);
		/* Every field but the stamp, then the stamp: the client may be polling it. */
		out->user_data = cqe.user_data;
		out->res = cqe.res;
		out->aux[0] = cqe.aux[0];
		out->aux[1] = cqe.aux[1];
		kvt_ring_store_stamp(&out->stamp, s->cq_tail);
		s->sq_head++;
		s->cq_tail++;
		n++;
	}
	if (!n)
		return 0;
	kvt_ring_store_head(s->sq, s->sq_head);
	kvt_ring_store_tail(s->cq, s->cq_tail);
	kvt_ring_fence();
	if (kvt_ring_needs_wakeup(s->cq))
		eventfd_write(s->cq_efd, 1);
	return n;
}
