/* SPDX-License-Identifier: MIT */
/*
 * seq.h - per-sequence state: geometry, the pool slot of every position (full precision for
 * T1, int8 for T2), and the tier state of engine/tier.h (scores, tiers, T0 slot map).
 * The functions take the sequence and a struct kvtd_seq_ctx, never the session: the session
 * (session.c) keeps the table of sequences and builds the context. Implemented in seq.c,
 * seq_t2.c, seq_copy.c and seq_topk.c (seq_int.h says what each holds). Poller lock held for
 * everything here.
 */
#ifndef KVTD_SEQ_H
#define KVTD_SEQ_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvt_abi.h"
#include "paris_seq.h"
#include "tier.h"

struct kvt_dev;
struct kvt_dev_buf;
struct kvt_dev_event;
struct kvtd_acct;
struct kvtd_pool;
struct kvtd_prefix;
struct kvtd_pns;
struct kvtd_pblock;
struct kvtd_scratch;

/* Why the op being run was refused: ops.c prefixes the opcode's name and hands it to the client
 * (struct kvt_op_err). */
struct kvtd_why {
	int set; /* msg holds the reason of the op being run */
	char msg[KVT_OP_ERR_MSG_LEN];
};

/* Formats @fmt into @w, marks it set and returns @r. Only on the error path. */
int kvtd_why_vset(struct kvtd_why *w, int r, const char *fmt, va_list ap);

/*
 * struct kvtd_seq_ctx - what a sequence operation needs besides the sequence: its owner's
 * resources, narrowed to what the sequence layer touches. The owner (a session, or a test)
 * keeps the table of sequences; nothing here reaches back into it.
 * @pool: where every slot and index page comes from.
 * @dev: the device backend the copies go through.
 * @acct, @uid_acct: the accounts charged for pool bytes (@uid_acct may be NULL).
 * @uid_cls: where the pool classes a sequence takes are counted (classes_per_uid), NULL: none.
 * @event: recorded after each op's device copies (NULL: none asked for).
 * @scr: per-op scratch (the poller's): row batches, quantization room, query copies.
 * @bufs, @n_bufs: the owner's registered buffers (index = buf id - 1) for SEQ_OPEN's regions.
 * @why: where a refusal's reason goes (kvtd_seq_fail()).
 * @prefix: the shared block store (a sequence's shared rows go back there), NULL: none.
 * @owner_id: the session id, for logs.
 * @no_sketch: [retrieval] sketch = no: sequences created now get a retrieval index without the
 *	int8 sketch (each keeps what it got, across restarts too); false, the zero value: with.
 */
struct kvtd_seq_ctx {
	struct kvtd_pool *pool;
	struct kvt_dev *dev;
	struct kvtd_acct *acct, *uid_acct;
	struct kvtd_cls_use *uid_cls; /* the uid's pool classes (NULL: not counted) */
	struct kvt_dev_event *event;
	struct kvtd_scratch *scr;
	struct kvt_dev_buf *const *bufs;
	unsigned n_bufs;
	uint32_t owner_id;
	struct kvtd_why *why;
	struct kvtd_prefix *prefix;
	bool no_sketch;
};

/* kvtd_seq_fail() - state why the op is refused, printf-style, into @x->why; returns @r so a
 * function can `return kvtd_seq_fail(x, -EINVAL, "...")`. */
int kvtd_seq_fail(const struct kvtd_seq_ctx *x, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

struct kvtd_seq {
	uint32_t id;
	struct kvt_seq_params p;
	struct kvt_tier_cfg cfg;
	struct kvt_tier_seq ts; /* over ts_mem */
	void *ts_mem;
	size_t ts_size;
	void *ws; /* RETIER workspace and FETCH list, grown with n */
	size_t ws_size;
	uint64_t row_bytes;   /* H * D * elem: one (token, layer, K|V) */
	uint64_t token_bytes; /* L * 2 * row_bytes: one T1 pool slot */
	uint64_t q_bytes;     /* one T2 pool slot (layouts in seq.c) */
	int cls, cls_q;	      /* pool classes of T1 and T2 slots */
	/* KVT_T2_F_KEY_CHANNEL: blocks of per-channel key scales shared by T2 slots */
	int cls_kb;	 /* pool class of a key-scale block */
	uint64_t n_kblk; /* key-scale blocks alive */
	void **slot;	 /* [ts.cap] pool slot per position (T1 or T2 by KVT_TIER_F_INT8) */
	/* prefix blocks (prefix.h): the namespace it may publish in, and per position the block
	 * whose T1 slot it references (NULL: its own slot); blk is allocated with ns */
	struct kvtd_pns *ns;
	struct kvtd_pblock **blk; /* [ts.cap] */
	uint64_t n_shared;	  /* positions referencing a block */
	struct kvt_dev_buf *t0_buf, *stage_buf;
	uint64_t bytes_in, bytes_out;
	/* by tier, for metrics (not in SEQ_STAT, not kept across a restart): of bytes_out, the
	 * rows that came from T2 (dequantized); the int8 bytes quantization wrote into T2 */
	uint64_t bytes_out_t2, bytes_quant;
	double score_total;
	/* retrieval (TOPK), when ret_update > 0 */
	struct kvt_paris_seq *paris;
	struct kvt_paris_scratch scr;
	/* the owner's context, for the index page allocator (paris calls back without one) */
	const struct kvtd_seq_ctx *owner;
	int cls_pg;		      /* pool class of index pages */
	struct kvtd_cls_use *cls_use; /* where its classes are counted (the creator's uid_cls) */
	int cls_sk;	    /* pool class of sketch pages (cls_pg's where sizes match), -1: none */
	uint64_t ret_bytes; /* pool bytes of its index and sketch pages */
	bool no_sketch;	    /* opened without the sketch ([retrieval] sketch = no), for life */
	float *keybuf;	    /* f32 keys being encoded, U tokens */
	uint32_t *topk_pos;
	float *topk_score;
	uint32_t topk_cap;
};

/* kvtd_seq_check() - SEQ_OPEN's parameter checks alone (the reason in @x->why). Returns 0 or
 * -EINVAL. */
int kvtd_seq_check(const struct kvtd_seq_ctx *x, const struct kvt_seq_params *p);

/* kvtd_seq_class_get() - the pool class of slots of @bytes for @q, counted in q->cls_use;
 * a refusal (-EDQUOT: classes_per_uid, -ENOSPC: every class taken) states its cause in @x->why.
 * kvtd_seq_class_put() gives it back. */
int kvtd_seq_class_get(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint64_t bytes);
void kvtd_seq_class_put(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, int cls);

/*
 * kvtd_seq_create() - validate @p (already copied out of the arena) and create a sequence, its
 * id left 0 for the owner to assign. Returns 0, -EINVAL (bad field, reason in @x->why), -ENOENT
 * (buffer id not registered), -ERANGE (region outside its buffer), -E2BIG (a token slot larger
 * than a pool chunk), -ENOSPC (no pool class left), -ENOMEM.
 */
int kvtd_seq_create(const struct kvtd_seq_ctx *x, const struct kvt_seq_params *p,
		    struct kvtd_seq **ret_q);
/* Frees the sequence's slots, index pages and buffer references. NULL is fine. */
void kvtd_seq_destroy(const struct kvtd_seq_ctx *x, struct kvtd_seq *q);

/*
 * kvtd_seq_join() - put the new sequence @q (n = 0) in namespace @ns (a handle more on it) and
 * start it with the @nblk blocks @blks: their positions become T1 rows referencing the blocks'
 * slots (no copy, no charge). Returns the new n, -EINVAL (@ns's geometry is not @q's), -ENOSPC
 * (past max_tokens), -ENOMEM. On failure @q is as it was.
 */
int64_t kvtd_seq_join(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, struct kvtd_pns *ns,
		      struct kvtd_pblock *const *blks, uint32_t nblk);

/*
 * kvtd_seq_publish() - PUBLISH the first @nkeys blocks of @q under @keys (shared memory: each
 * read once). Returns how many leading blocks the namespace holds for @q; @ret_new, @ret_found:
 * of them, newly published and found already there. -ENOSPC: none, the prefix budget is full
 * of referenced blocks; -EINVAL: no namespace, or keys past n.
 */
int kvtd_seq_publish(const struct kvtd_seq_ctx *x, struct kvtd_seq *q,
		     const struct kvt_block_key *keys, uint32_t nkeys, uint32_t *ret_new,
		     uint32_t *ret_found);

/* APPEND from rows in memory laid out [token][layer][K,V][row]. Returns the new n or -errno. */
int64_t kvtd_seq_append_rows(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint8_t *rows,
			     uint32_t ntok);
/* APPEND from free T0 slots @slots of the T0 region. Returns the new n, -EINVAL (slot out of
 * range or named twice), -EBUSY (slot holds a live token), -E2BIG (more than 256 tokens). */
int64_t kvtd_seq_append_t0(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const uint32_t *slots,
			   uint32_t ntok);

/* SCORE_ADD. Returns 0, -EINVAL (range past n, a value negative, NaN or infinite). */
int kvtd_seq_score_add(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, uint64_t first,
		       uint32_t count, const float *v);

/* Pool bytes the sequence holds (T1 and T2 slots, key-scale blocks). */
uint64_t kvtd_seq_pool_bytes(const struct kvtd_pool *pool, const struct kvtd_seq *q);

/* RETIER: result written to @out (@out_len bytes). Returns bytes written or -errno. */
int kvtd_seq_retier(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, void *out, uint64_t out_len,
		    uint32_t *ret_changes);

/* A FETCH (see KVT_FETCH_F_* in kvt_abi.h). */
struct kvtd_fetch {
	unsigned flags; /* KVT_FETCH_F_* */
	uint32_t layer0, nlayers;
	uint32_t stage_row;   /* the first staging row written (0 with F_ROWS) */
	uint32_t buf_id;      /* 0: the sequence's staging region; else this session buffer,
			       * laid out as that region */
	uint32_t *list;	      /* the arena: positions in (F_LIST) or out */
	uint32_t list_cap;    /* entries @list has room for */
	uint32_t count;	      /* F_LIST: the positions listed */
	const uint32_t *rows; /* F_ROWS: each listed position's staging row (the arena) */
};

/* FETCH: rows staged per (layer, K|V) or -errno. What @f points to may be client memory: it is
 * copied before it is checked. */
int kvtd_seq_fetch(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const struct kvtd_fetch *f);

/* TOPK (kvt_abi.h) for request @r, which ops.c checked (kvtd_topk_req_check(): mode, flags,
 * probe, k > 0, reserved fields; its offsets are not read here). @query: r->query_len bytes in
 * the arena; @out: r->out_len bytes in the arena. Checks what depends on the sequence (layer,
 * query length, k against the zone, output and staging room). Returns the stride or -errno;
 * @ret_n: the retrieval keys N. */
int kvtd_seq_topk(const struct kvtd_seq_ctx *x, struct kvtd_seq *q, const struct kvt_topk_req *r,
		  const float *query, void *out, uint64_t *ret_n);

/*
 * A sequence as a restart hands it over (restart.c): its SEQ_OPEN parameters, the tier state of
 * its @n positions, and each position's pool slot as an offset into the pool plus one (0: none,
 * an evicted position). @old_base is where the previous process mapped the pool (key-scale
 * block addresses are relative to it).
 */
struct kvtd_seq_image {
	uint32_t n, gen;
	const float *score;
	const uint8_t *tier;
	const int32_t *pos_slot;
	const uint64_t *slot_off;
	uint64_t old_base;
	uint64_t bytes_in, bytes_out;
	double score_total;
	/* prefix blocks: the namespace (NULL: none) and per position 0 (its own slot) or the
	 * index + 1 in @blocks of the block whose slot it references (slot_off is that slot) */
	struct kvtd_pns *ns;
	const uint32_t *blk_idx;
	struct kvtd_pblock *const *blocks;
	uint32_t n_blocks;
	bool no_sketch; /* the sequence had no retrieval sketch: it keeps none */
};

/*
 * kvtd_seq_restore() - re-create a sequence from @img: parameters checked as SEQ_OPEN does, tier
 * state by kvt_tier_seq_restore(), every slot claimed back from the pool (kvtd_pool_claim(),
 * before kvtd_pool_claim_done()). No retrieval state yet: see kvtd_seq_restore_retrieval().
 * Returns 0, -EINVAL (the image contradicts itself or the pool), -EEXIST (a slot claimed twice),
 * or a SEQ_OPEN error. On failure what was claimed is not given back (the caller abandons the
 * pool, see restart.c) and *@ret_q is untouched.
 */
int kvtd_seq_restore(const struct kvtd_seq_ctx *x, const struct kvt_seq_params *p,
		     const struct kvtd_seq_image *img, struct kvtd_seq **ret_q);
/* After kvtd_pool_claim_done(): rebuild the retrieval index by encoding again, in order, the
 * keys that had been encoded. Returns 0 or -errno. */
int kvtd_seq_restore_retrieval(const struct kvtd_seq_ctx *x, struct kvtd_seq *q);

#endif
