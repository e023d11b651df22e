/* SPDX-License-Identifier: MIT */
/*
 * kvt_abi.h - the daemon <-> client data-path contract.
 *
 * Everything here lives in shared memory that both sides map, so it uses fixed-width types
 * only, carries explicit reserved fields that must be zero, and is pinned by static assertions.
 * It compiles as C11 and as C++11 (KVT_STATIC_ASSERT picks the spelling).
 * Readers locate every part of the shared region through the offsets in struct kvt_region_hdr,
 * never through sizeof(), so later minor versions can grow parts without breaking old peers.
 *
 * The daemon treats the whole region as hostile input: it keeps private ring indices, copies an
 * SQE once before looking at it and validates every field (see daemon/ops.c).
 */
#ifndef KVT_ABI_H
#define KVT_ABI_H

#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define KVT_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define KVT_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define KVT_ABI_MAJOR 1 /* bumped only on incompatible change */
#define KVT_ABI_MINOR                                                                              \
	6 /* bumped on compatible additions (1: kvt_region_hdr.err_off, 2: prefix blocks,          \
	     3: KVT_TOPK_F_FAST, 4: TOPK's probe, 5: struct kvt_topk_req, 6: FETCH's buf_id and    \
	     KVT_FETCH_F_ROWS) */

/* The control socket kvtierd listens on and clients connect to unless told otherwise; the one
 * definition (kvtier.h, kvtierd's config and kvtierctl take it from here). */
#define KVT_DEFAULT_SOCKET "/run/kvtier/kvtierd.sock"

#define KVT_REGION_MAGIC 0x3152454954564b00ull /* "\0KVTIER1" little-endian */

/* Region feature bits (kvt_region_hdr.features). */
#define KVT_FEAT_NEED_WAKEUP (1ull << 0) /* doorbells are written only on NEED_WAKEUP */
#define KVT_FEAT_ALL	     KVT_FEAT_NEED_WAKEUP

/* Ring flags (kvt_ring_hdr.flags), set and cleared by the consumer only. */
#define KVT_RING_NEED_WAKEUP (1u << 0)

/*
 * struct kvt_ring_hdr - indices of one single-producer single-consumer ring.
 *
 * Indices are free-running u32: the entry of index i is at i & (entries - 1). Each index sits on
 * its own cache line because a different side writes it.
 */
struct kvt_ring_hdr {
	uint32_t prod_tail;    /* written by the producer only */
	uint32_t pad0[15];     /* own cache line */
	uint32_t cons_head;    /* written by the consumer only */
	uint32_t pad1[15];     /* own cache line */
	uint32_t flags;	       /* KVT_RING_*, written by the consumer only */
	uint32_t entries;      /* power of two, fixed at creation */
	uint32_t reserved[14]; /* zero */
};
KVT_STATIC_ASSERT(sizeof(struct kvt_ring_hdr) == 192, "kvt_ring_hdr ABI");
KVT_STATIC_ASSERT(offsetof(struct kvt_ring_hdr, prod_tail) == 0, "kvt_ring_hdr prod_tail");
KVT_STATIC_ASSERT(offsetof(struct kvt_ring_hdr, cons_head) == 64, "kvt_ring_hdr cons_head");
KVT_STATIC_ASSERT(offsetof(struct kvt_ring_hdr, flags) == 128, "kvt_ring_hdr flags");

/*
 * struct kvt_region_hdr - first bytes of every session's shared region.
 *
 * Created and sealed (shrink, grow, seal) by the daemon before it is sent to the client. All
 * offsets are bytes from the start of the region and 64-byte aligned.
 */
struct kvt_region_hdr {
	uint64_t magic;		 /* KVT_REGION_MAGIC */
	uint16_t abi_major;	 /* KVT_ABI_MAJOR of the daemon */
	uint16_t abi_minor;	 /* KVT_ABI_MINOR of the daemon */
	uint32_t hdr_size;	 /* sizeof(struct kvt_region_hdr) of the daemon */
	uint64_t features;	 /* KVT_FEAT_* */
	uint64_t region_size;	 /* bytes, whole region */
	uint64_t sq_ring_off;	 /* struct kvt_ring_hdr of the submission queue */
	uint64_t sq_entries_off; /* sq_entries x struct kvt_sqe */
	uint64_t cq_ring_off;	 /* struct kvt_ring_hdr of the completion queue */
	uint64_t cq_entries_off; /* cq_entries x struct kvt_cqe */
	uint64_t arena_off;	 /* client-managed payload space */
	uint64_t arena_size;
	uint32_t sq_entries; /* power of two */
	uint32_t cq_entries; /* power of two, >= sq_entries */
	uint32_t session_id;
	uint32_t reserved0;
	uint64_t err_off;     /* struct kvt_op_err, since ABI 1.1; 0: the daemon keeps none */
	uint64_t reserved[3]; /* zero */
};
KVT_STATIC_ASSERT(sizeof(struct kvt_region_hdr) == 128, "kvt_region_hdr ABI");
KVT_STATIC_ASSERT(offsetof(struct kvt_region_hdr, err_off) == 96, "kvt_region_hdr err_off");

#define KVT_OP_ERR_MSG_LEN 224 /* bytes of kvt_op_err.msg, NUL included */

/*
 * struct kvt_op_err - why the session's most recent refused op was refused (ABI 1.1), at
 * kvt_region_hdr.err_off. Written by the daemon only, before it posts that op's CQE; the
 * daemon never reads it back, so a client scribbling on it harms only its own reading.
 *
 * @gen is a sequence count (kvt_ring.h: kvt_op_err_begin/end, kvt_op_err_read_begin/retry):
 * odd while the daemon writes, bumped to the next even value (release) when the record is
 * whole. A reader that saw the CQE (acquire) sees at least that op's record; it takes a copy
 * and keeps it if @gen was even and unchanged around the copy and @user_data is its op's (a
 * later refusal may have replaced it).
 */
struct kvt_op_err {
	uint32_t gen;	    /* even: record complete; odd: being written */
	int32_t res;	    /* the CQE res: a negative errno */
	uint64_t user_data; /* the refused SQE's user_data */
	uint8_t opcode;	    /* the refused SQE's opcode (as submitted, even if unknown) */
	uint8_t reserved0[3];
	uint32_t seq;		      /* the refused SQE's seq */
	uint64_t reserved[1];	      /* zero */
	char msg[KVT_OP_ERR_MSG_LEN]; /* "OPNAME: what was wrong", NUL-terminated */
};
KVT_STATIC_ASSERT(sizeof(struct kvt_op_err) == 256, "kvt_op_err ABI");
KVT_STATIC_ASSERT(offsetof(struct kvt_op_err, msg) == 32, "kvt_op_err msg");

/* Opcodes. Numbers are part of the ABI (docs/design.md); never reuse one. */
enum {
	KVT_OP_NOP = 0,
	KVT_OP_SEQ_OPEN = 1,
	KVT_OP_SEQ_CLOSE = 2,
	KVT_OP_APPEND = 3,
	KVT_OP_SCORE_ADD = 4,
	KVT_OP_RETIER = 5,
	KVT_OP_FETCH = 6,
	KVT_OP_TOPK = 7,
	KVT_OP_SEQ_STAT = 8,
	KVT_OP_NS_OPEN = 9, /* ABI 1.2: prefix blocks */
	KVT_OP_NS_CLOSE = 10,
	KVT_OP_LOOKUP = 11,
	KVT_OP_PUBLISH = 12,
	KVT_OP__COUNT
};

/* SQE flags (kvt_sqe.flags): none defined yet; any set bit is -EINVAL. */
#define KVT_SQE_F_ALL 0u

/*
 * struct kvt_sqe - one submission, 64 bytes.
 *
 * @seq names a sequence opened by this session (the CQE of SEQ_OPEN gives it). Arena payloads are
 * named by (arena_off, arena_len). The per-opcode fields have a name for each opcode that uses
 * them (anonymous unions, as in io_uring's SQE) and a generic one (count, arg0..arg2) for code
 * that treats every opcode alike; libkvtier's kvt_prep_*() helpers fill them. Every field not
 * used by an opcode must be zero.
 *
 * @stamp makes an entry self-announcing: the producer fills the entry, then stores
 * stamp = (its free-running ring index) + 1 with release semantics, then advances prod_tail. A
 * spinning consumer polls the stamp of the entry at its head instead of the tail, so a busy
 * round trip moves two cache lines (the SQE, the CQE), as a bare ping-pong does; prod_tail
 * still serves the sleep/wakeup handshake and occupancy checks (kvt_ring.h).
 */
struct kvt_sqe {
	uint8_t opcode;	    /* KVT_OP_* */
	uint8_t flags;	    /* KVT_SQE_F_* */
	uint16_t op_flags;  /* per-opcode flags, KVT_<OP>_F_* */
	uint32_t seq;	    /* sequence id, or 0 where unused */
	uint64_t user_data; /* returned untouched in the CQE */
	uint64_t arena_off; /* payload in the arena (input or output, per opcode) */
	uint32_t arena_len;
	union {
		uint32_t count; /* generic name */
		uint32_t ntok;	/* APPEND: tokens appended */
		uint32_t npos;	/* SCORE_ADD: values; FETCH with KVT_FETCH_F_LIST: positions */
		uint32_t k;	/* TOPK: results per kv head (per query head with F_UNION) */
		uint32_t nkeys; /* LOOKUP, PUBLISH: block keys in the arena */
		uint32_t prefix_blocks; /* SEQ_OPEN: blocks pinned on @ns it starts with */
	};
	union {
		uint64_t arg0;	    /* generic name */
		uint64_t first_pos; /* SCORE_ADD: position of the first value */
		uint64_t layer0;    /* FETCH: first layer staged */
		uint64_t layer;	    /* TOPK: the layer searched */
		uint64_t ns;	    /* SEQ_OPEN, NS_CLOSE, LOOKUP: a namespace NS_OPEN returned */
	};
	union {
		uint64_t arg1;	  /* generic name */
		uint64_t nlayers; /* FETCH: layers staged */
		uint64_t out_off; /* TOPK: arena offset of the output, 8-byte aligned */
	};
	union {
		uint32_t arg2;	    /* generic name */
		uint32_t stage_row; /* FETCH: first staging row written */
		uint32_t out_len;   /* TOPK: output length in bytes */
	};
	uint32_t buf_id; /* FETCH: the buffer staged into (0: the staging region) */
	uint32_t stamp;	 /* ring index + 1, stored last (release) by the producer */
	union {
		uint32_t arg3;	   /* generic name: zero unless the opcode reads it (ABI 1.4) */
		uint32_t probe;	   /* TOPK's SQE form with KVT_TOPK_F_FAST: keys to scan */
		uint32_t reserved; /* its name before ABI 1.4 */
	};
};
KVT_STATIC_ASSERT(sizeof(struct kvt_sqe) == 64, "kvt_sqe ABI");
KVT_STATIC_ASSERT(offsetof(struct kvt_sqe, arena_off) == 16, "kvt_sqe arena_off");
KVT_STATIC_ASSERT(offsetof(struct kvt_sqe, count) == 28 && offsetof(struct kvt_sqe, k) == 28,
		  "kvt_sqe count");
KVT_STATIC_ASSERT(offsetof(struct kvt_sqe, arg3) == 60 && offsetof(struct kvt_sqe, probe) == 60,
		  "kvt_sqe arg3");
KVT_STATIC_ASSERT(offsetof(struct kvt_sqe, arg0) == 32 && offsetof(struct kvt_sqe, layer) == 32,
		  "kvt_sqe arg0");
KVT_STATIC_ASSERT(offsetof(struct kvt_sqe, arg1) == 40 && offsetof(struct kvt_sqe, out_off) == 40,
		  "kvt_sqe arg1");
KVT_STATIC_ASSERT(offsetof(struct kvt_sqe, arg2) == 48 && offsetof(struct kvt_sqe, out_len) == 48,
		  "kvt_sqe arg2");
KVT_STATIC_ASSERT(offsetof(struct kvt_sqe, buf_id) == 52, "kvt_sqe buf_id");
KVT_STATIC_ASSERT(offsetof(struct kvt_sqe, stamp) == 56, "kvt_sqe stamp");

/*
 * struct kvt_cqe - one completion, 32 bytes. @res is >= 0 on success (meaning per opcode) or a
 * negative errno. @aux carries small per-opcode results so most ops need no arena output.
 */
struct kvt_cqe {
	uint64_t user_data;
	int32_t res;
	uint32_t stamp; /* ring index + 1, stored last (release) by the daemon */
	uint64_t aux[2];
};
KVT_STATIC_ASSERT(sizeof(struct kvt_cqe) == 32, "kvt_cqe ABI");

/* ---- per-opcode payloads ---------------------------------------------------------------- */

enum { KVT_DTYPE_F16 = 0, KVT_DTYPE_BF16 = 1, KVT_DTYPE_F32 = 2, KVT_DTYPE__COUNT };
enum {
	KVT_POLICY_TIERED = 0,
	KVT_POLICY_H2O = 1,
	KVT_POLICY_STREAMING = 2,
	KVT_POLICY_FULL = 3,
	KVT_POLICY__COUNT
};
enum { KVT_SCORE_SUM = 0, KVT_SCORE_MEAN = 1, KVT_SCORE__COUNT };

#define KVT_MAX_LAYERS	 256
#define KVT_MAX_KV_HEADS 64
#define KVT_MAX_HEAD_DIM 256

/*
 * struct kvt_seq_params - SEQ_OPEN payload, in the arena at (arena_off, arena_len >= size).
 * CQE res: the new sequence id (> 0). Errors: -EINVAL (bad field), -EMFILE (too many sequences),
 * -ENOENT (t0_buf_id not registered), -ERANGE (T0 layout outside the buffer).
 * Prefix blocks (ABI 1.2): SQE @ns names the namespace (NS_OPEN) whose blocks the sequence may
 * PUBLISH, 0 = none; it must have the sequence's layers, kv_heads, head_dim and dtype. With
 * @prefix_blocks > 0 the sequence starts with the first prefix_blocks blocks that the last
 * LOOKUP with KVT_LOOKUP_F_PIN pinned on @ns: prefix_blocks * block_tokens positions in T1 whose
 * rows are the shared blocks' (no copy). CQE aux[0]: the sequence's n.
 */
struct kvt_seq_params {
	uint32_t size;		/* sizeof(struct kvt_seq_params) as the client knows it */
	uint16_t layers;	/* 1..KVT_MAX_LAYERS */
	uint16_t kv_heads;	/* 1..KVT_MAX_KV_HEADS */
	uint16_t head_dim;	/* 1..KVT_MAX_HEAD_DIM */
	uint8_t dtype;		/* KVT_DTYPE_* */
	uint8_t policy;		/* KVT_POLICY_* */
	uint8_t score_mode;	/* KVT_SCORE_* */
	uint8_t protect_prompt; /* 0 or 1 */
	uint16_t q_heads; /* query heads for TOPK (GQA), a multiple of kv_heads; 0 = kv_heads */
	uint32_t delta;	  /* re-tier period, tokens, >= 1 */
	uint32_t sinks;
	uint32_t window;
	uint32_t prompt_len;
	float hbm_frac;	     /* [0, 1] */
	float evict_frac;    /* [0, 1] */
	float t2_frac;	     /* [0, 1] */
	uint32_t max_tokens; /* capacity hint, 0 = unlimited (quota still applies) */
	/* T0 region: 0 = none (the client keeps no device copy, pool only) */
	uint32_t t0_buf_id;
	uint32_t t0_slots;
	uint64_t t0_base_off;	  /* byte offset of (slot 0, layer 0, K) in the buffer */
	uint64_t t0_slot_stride;  /* bytes between slots */
	uint64_t t0_layer_stride; /* bytes between layers */
	uint64_t t0_kv_stride;	  /* bytes between K and V */
	/* staging region for FETCH / TOPK: 0 = none */
	uint32_t stage_buf_id;
	uint32_t stage_slots; /* rows per layer */
	uint64_t stage_base_off;
	uint64_t stage_slot_stride;
	uint64_t stage_layer_stride;
	uint64_t stage_kv_stride;
	/* Retrieval (TOPK, docs/retrieval.md): sink S = sinks, dense window W = window, update
	 * buffer U. Keys leaving the dense window are encoded every U tokens. 0: no TOPK. */
	uint32_t ret_update;
	uint32_t ret_flags;   /* zero */
	uint32_t t2_flags;    /* KVT_T2_F_* */
	uint32_t reserved0;   /* zero */
	uint64_t reserved[2]; /* zero */
};
KVT_STATIC_ASSERT(sizeof(struct kvt_seq_params) == 160, "kvt_seq_params ABI");

/*
 * T2 (int8) encodings, kvt_seq_params.t2_flags. By default every (token, layer, K|V, head) has
 * its own f32 scale. KVT_T2_F_KEY_CHANNEL gives keys one scale per channel (element of the row)
 * shared by a block of up to KVT_T2_KEY_BLOCK positions that one RETIER quantizes, in position
 * order (KIVI-style: keys have outlier channels, which a per-head scale spreads over the whole
 * head). Values keep per-head scales.
 */
#define KVT_T2_F_KEY_CHANNEL (1u << 0)
#define KVT_T2_KEY_BLOCK     32

/*
 * APPEND: @ntok tokens are appended at positions n..n+ntok-1.
 *   op_flags 0: rows come from the arena, layout [token][layer][K,V][head][dim], arena_len must be
 *               exactly ntok * token_bytes.
 *   KVT_APPEND_F_T0: rows come from the sequence's T0 region; the arena holds ntok u32 slot ids.
 * CQE res: the new n.  aux[0]: first position appended.
 */
#define KVT_APPEND_F_T0 (1u << 0)

/*
 * SCORE_ADD: the arena holds @npos f32 values; score[first_pos + i] += value[i]. first_pos + npos
 * must not pass n. CQE res: 0.
 */

/*
 * RETIER: recompute the sequence's tiers (docs/tiering.md) and move the data: demotions free
 * T0 slots without copying, promotions copy rows into the client's T0 slots (all layers, one
 * batch), T1 -> T2 quantizes, evictions free pool slots. Output, in the arena at arena_off
 * (arena_len must hold it all, else -ENOSPC and nothing changes): struct kvt_retier_result,
 * then n_changes struct kvt_slot_change (demotions first), then n_free u32 slot ids, the free
 * slots the client writes its next tokens into. CQE res: bytes written; aux[0]: n_changes.
 * Errors: -ENOMEM / -EDQUOT (no pool room for int8 rows: nothing changed).
 * KVT_RETIER_OUT_SIZE(t0_slots) bytes always hold the output.
 */
struct kvt_slot_change {
	uint32_t slot;
	int32_t pos; /* position now in the slot, -1: the slot is free */
};
KVT_STATIC_ASSERT(sizeof(struct kvt_slot_change) == 8, "kvt_slot_change ABI");

struct kvt_retier_result {
	uint32_t size;	    /* sizeof(struct kvt_retier_result) */
	uint32_t n_changes; /* struct kvt_slot_change entries that follow */
	uint32_t n_free;    /* u32 free slot ids after the changes */
	float evicted_ratio;
	uint64_t n_tokens;
	uint64_t tier_count[4];
	uint64_t reserved[2];
};
KVT_STATIC_ASSERT(sizeof(struct kvt_retier_result) == 72, "kvt_retier_result ABI");

/*
 * Bytes that always hold a RETIER output. With d demotions, p promotions and f free slots
 * before, the output is 8 (d + p) + 4 (f + d - p) bytes past the header; p <= f + d and
 * d <= t0_slots - f make the worst case every slot demoted and refilled: 16 bytes a slot.
 */
#define KVT_RETIER_OUT_SIZE(t0_slots)                                                              \
	(sizeof(struct kvt_retier_result) + (uint64_t)(t0_slots)*2 * sizeof(struct kvt_slot_change))

/*
 * FETCH: stage rows of layers [layer0, layer0 + nlayers) into the staging region, starting at
 * staging row stage_row: row i of layer l, K or V, lands at stage_base_off + l *
 * stage_layer_stride + kv * stage_kv_stride + (stage_row + i) * stage_slot_stride.
 *   KVT_FETCH_F_T1 and/or KVT_FETCH_F_T2: every T1 and/or T2 position, ascending (T2 rows
 *     dequantized); their positions are written to the arena (u32 each).
 *   KVT_FETCH_F_LIST: the @npos positions the arena holds, in that order (any live tier).
 *   KVT_FETCH_F_ROWS (ABI 1.6, with F_LIST): the arena holds @npos u32 staging rows after the
 *     positions (arena_len = 8 npos); position i lands at row rows[i] instead of stage_row + i
 *     (stage_row 0). A paged cache's blocks, wherever they are.
 * buf_id (ABI 1.6): 0, the sequence's staging region; else a buffer this session registered,
 *   written in the staging region's layout (base offset, strides, stage_slots rows) instead,
 *   which must fit in it: one region per layer where a serving engine allocates each layer's
 *   cache on its own (the sequence still needs a staging region, which sets the layout).
 * CQE res: rows staged per (layer, K|V). Errors: -ENOSPC (staging region or arena too small:
 * nothing staged), -EINVAL (no staging region, layers out of range, a position >= n, a row
 * >= stage_slots), -ENOENT (a listed position was evicted; buf_id not registered), -ERANGE
 * (buf_id too small for the layout).
 */
#define KVT_FETCH_F_T1	 (1u << 0)
#define KVT_FETCH_F_T2	 (1u << 1)
#define KVT_FETCH_F_LIST (1u << 2)
#define KVT_FETCH_F_ROWS (1u << 3)

/*
 * TOPK: the positions most likely to matter to a query, per kv head (ParisKV retrieval over the
 * keys that left the dense window, docs/retrieval.md). Needs ret_update > 0 and head_dim 64 or
 * 128.
 *
 * The request (ABI 1.5): SQE op_flags KVT_TOPK_F_REQ, (arena_off, arena_len) a struct
 * kvt_topk_req in the arena (8-byte aligned), every other SQE field but seq zero. The daemon
 * copies the request once, then checks it: @size at least KVT_TOPK_REQ_SIZE0 and at most
 * arena_len; bytes past the struct this kvtierd knows must be zero (else -E2BIG: a field it
 * cannot honour), fields a shorter @size leaves out read as zero.
 *
 * The SQE form (ABI 1.0-1.4, still accepted): op_flags KVT_TOPK_F_UNION, _FETCH, _ESTIMATE
 * (mode ESTIMATE), _FAST (mode FAST; with the SQE's probe > 0, mode PROBE); the query at
 * (arena_off, arena_len), k in count, the layer in arg0, out_off in arg1, out_len in arg2.
 * ESTIMATE with FAST, or probe without FAST, is -EINVAL.
 *
 * The query: q_heads * head_dim f32 (post-RoPE), finite, 4-byte aligned. The output at out_off
 * (8-byte aligned), out_len bytes, KVT_TOPK_OUT_SIZE(kv_heads, stride): u32 n[kv_heads], then
 * u32 pos[kv_heads][stride], then f32 score[kv_heads][stride], stride = k, or
 * k * q_heads / kv_heads with KVT_TOPK_F_UNION; positions absolute, in descending score;
 * n[h] <= stride, fewer when positions evicted since they were encoded (never returned) leave
 * fewer live candidates. Positions do not depend on the query's scale.
 *
 * Modes (kvt_topk_req.mode):
 *   KVT_TOPK_EXACT: the exact top-k at any zone length; scores are the exact <key, q> in f32
 *     (q: the group's mean query, or the query head with KVT_TOPK_F_UNION), int8 (T2) keys
 *     dequantized.
 *   KVT_TOPK_ESTIMATE: ParisKV's own pipeline (its ratio schedule, no exact refine): not the
 *     exact top-k; scores are the 4-bit RSQ-IP estimates.
 *   KVT_TOPK_FAST: the sketch's 2-bit level ranks every live key and the KVT_TOPK_FAST_X * k
 *     best are scored exactly: positions are those keys' exact top-k (not always the zone's),
 *     scores exact; a zone of at most 512 k keys gets the exact top-k. A sequence opened with
 *     [retrieval] sketch = no answers as KVT_TOPK_EXACT.
 *   KVT_TOPK_PROBE: sublinear, @probe > 0 live keys to scan. The keys come in groups of
 *     consecutive positions (64 at head_dim 128, 16 at 64), each summarised by its mean; only
 *     the groups whose means score best are scanned until they hold @probe live keys, and
 *     their C best keys by estimate are scored exactly (C = KVT_TOPK_PROBE_X * k by the 2-bit
 *     level at head_dim 128, C = k by the int8 level at 64; a probe under C counts as C).
 *     Positions are those keys' exact top-k, scores exact: every true top-k key outside the
 *     probed groups is missed. Groups with no live key are passed over; a group holding a
 *     non-finite key is always scanned.
 *   Recall and time of each mode: docs/retrieval.md and BENCHMARKS.md (measurements, not
 *   guarantees).
 * Flags (kvt_topk_req.flags):
 *   KVT_TOPK_F_UNION: one search per query head, k results each, merged per kv head.
 *   KVT_TOPK_F_FETCH: also stage the rows (all heads) of those positions for this layer into the
 *     staging region, kv head h's i-th position at staging row h * stride + i.
 * CQE res: stride. aux[0]: retrieval keys N. Errors: -EINVAL (k = 0, query length, a query
 * value NaN or infinite, flags, mode, probe with a mode other than PROBE or 0 with it, layer
 * out of range, no retrieval, a reserved field not zero), -E2BIG (a request longer than this
 * kvtierd knows with a non-zero byte past it), -ERANGE (k larger than the retrieval zone, or
 * nothing encoded yet: attend densely), -ENOSPC (output or staging too small).
 */
#define KVT_TOPK_F_UNION    (1u << 0)
#define KVT_TOPK_F_FETCH    (1u << 1)
#define KVT_TOPK_F_ESTIMATE (1u << 2) /* SQE form only: mode KVT_TOPK_ESTIMATE */
#define KVT_TOPK_F_FAST	    (1u << 3) /* SQE form only: mode KVT_TOPK_FAST (ABI 1.3) */
#define KVT_TOPK_F_REQ	    (1u << 4) /* SQE op_flags: the arena holds a kvt_topk_req (ABI 1.5) */
#define KVT_TOPK_FAST_X	    16u	      /* KVT_TOPK_FAST scores this many keys per result */
#define KVT_TOPK_PROBE_X    4u	      /* ... KVT_TOPK_PROBE at head_dim 128 (ABI 1.4) */

/* TOPK modes (kvt_topk_req.mode): which keys are scored, see TOPK above. */
enum kvt_topk_mode {
	KVT_TOPK_EXACT = 0,
	KVT_TOPK_ESTIMATE = 1,
	KVT_TOPK_FAST = 2,
	KVT_TOPK_PROBE = 3,
	KVT_TOPK__MODES
};

/*
 * struct kvt_topk_req - one TOPK request, in the arena (ABI 1.5). Later minor versions may
 * append fields: a client sets @size to the sizeof() it was built with, and a field past an
 * older daemon's struct must be zero for that daemon to accept the request.
 */
struct kvt_topk_req {
	uint32_t size;	      /* sizeof(struct kvt_topk_req) as the client knows it */
	uint32_t mode;	      /* enum kvt_topk_mode */
	uint32_t flags;	      /* KVT_TOPK_F_UNION, KVT_TOPK_F_FETCH */
	uint32_t layer;	      /* 0..layers - 1 */
	uint32_t k;	      /* results per kv head (per query head with KVT_TOPK_F_UNION), > 0 */
	uint32_t probe;	      /* KVT_TOPK_PROBE: live keys to scan, > 0; otherwise zero */
	uint64_t query_off;   /* arena offset of the query, 4-byte aligned */
	uint32_t query_len;   /* bytes: q_heads * head_dim * 4 */
	uint32_t out_len;     /* bytes of the output, KVT_TOPK_OUT_SIZE() */
	uint64_t out_off;     /* arena offset of the output, 8-byte aligned */
	uint64_t reserved[2]; /* zero */
};
KVT_STATIC_ASSERT(sizeof(struct kvt_topk_req) == 64, "kvt_topk_req ABI");
KVT_STATIC_ASSERT(offsetof(struct kvt_topk_req, query_off) == 24, "kvt_topk_req query_off");
KVT_STATIC_ASSERT(offsetof(struct kvt_topk_req, out_off) == 40, "kvt_topk_req out_off");

/* The shortest struct kvt_topk_req a kvtierd accepts: the ABI 1.5 one. */
#define KVT_TOPK_REQ_SIZE0 64u

/* TOPK output bytes: n[kv_heads], pos[kv_heads][stride], score[kv_heads][stride]. */
#define KVT_TOPK_OUT_SIZE(kv_heads, stride)                                                        \
	((uint64_t)(kv_heads)*4 + (uint64_t)(kv_heads) * (stride)*8)

/* ---- prefix blocks (ABI 1.2, docs/prefix.md) -------------------------------------------- */
/*
 * Sequences that begin with the same tokens (a system prompt, a few-shot preamble, a document)
 * share the rows of those tokens through a namespace's content-addressed blocks. A block is the
 * rows (all layers, K and V) of block_tokens consecutive tokens; its key names the whole prefix
 * up to its end (kvt_block_keys() in kvtier.h chains them). Blocks are shared only inside a
 * namespace: the same name, geometry and dtype, and the same uid unless kvtierd's
 * prefix_share_uids / prefix_share_gids put the client in the shared scope.
 */
#define KVT_NS_NAME_LEN		 64
#define KVT_BLOCK_TOKENS_DEFAULT 16
#define KVT_BLOCK_TOKENS_MAX	 1024
#define KVT_MAX_NS		 16 /* namespaces open per session */

/*
 * struct kvt_ns_params - NS_OPEN payload, in the arena at (arena_off, arena_len >= size).
 * CQE res: the namespace id (1..KVT_MAX_NS) for SEQ_OPEN, LOOKUP and NS_CLOSE;
 * aux[0]: block_tokens in effect. Errors: -EINVAL (a field, a name that is empty, not
 * NUL-terminated or not printable ASCII), -EMFILE (KVT_MAX_NS open), -ENOMEM.
 */
struct kvt_ns_params {
	uint32_t size;	       /* sizeof(struct kvt_ns_params) as the client knows it */
	uint16_t layers;       /* as the sequences that will use it */
	uint16_t kv_heads;     /* "" */
	uint16_t head_dim;     /* "" */
	uint8_t dtype;	       /* "" */
	uint8_t reserved0;     /* zero */
	uint32_t block_tokens; /* tokens per block, 1..KVT_BLOCK_TOKENS_MAX; 0: the default 16 */
	uint32_t flags;	       /* zero */
	uint32_t reserved[3];  /* zero */
	char name[KVT_NS_NAME_LEN]; /* the model's identity (e.g. its file's digest), printable
				       ASCII, NUL-terminated, not empty */
};
KVT_STATIC_ASSERT(sizeof(struct kvt_ns_params) == 96, "kvt_ns_params ABI");
KVT_STATIC_ASSERT(offsetof(struct kvt_ns_params, name) == 32, "kvt_ns_params name");

/* A block key: 128 bits (XXH3-128 in kvt_block_keys()). */
struct kvt_block_key {
	uint64_t lo, hi;
};
KVT_STATIC_ASSERT(sizeof(struct kvt_block_key) == 16, "kvt_block_key ABI");

/*
 * NS_CLOSE: @ns. Drops the namespace's pins; its blocks stay cached. CQE res: 0.
 *
 * LOOKUP: the arena holds @nkeys struct kvt_block_key of one prefix, in order (8-byte aligned).
 * CQE res: how many leading blocks namespace @ns holds; aux[0]: the tokens they hold.
 *   KVT_LOOKUP_F_PIN: also pin those blocks for SEQ_OPEN (its SQE's prefix_blocks),
 *   replacing the namespace's earlier pins; pins last until the next pinning LOOKUP, NS_CLOSE
 *   or the session's end. Several sequences may open from one pinning LOOKUP.
 *   At most 65536 keys, and no more than the namespace holds blocks, are examined: res never
 *   exceeds either. The pins (8 bytes each) count against the session's and uid's pool quota
 *   (-EDQUOT).
 *
 * PUBLISH: offer the first @nkeys full blocks of sequence @seq (opened with a namespace) to its
 * namespace; the arena holds their keys, in order. A block's rows are the sequence's own pool
 * rows, referenced, not copied; a block the namespace already holds replaces the sequence's
 * private rows (they are freed). Publishing stops at the first block with a position that is
 * evicted or int8 (T2), or when prefix_cache_bytes is full of referenced blocks.
 * CQE res: the leading blocks the namespace now holds for this sequence; aux[0]: of them,
 * newly published; aux[1]: found already published. Errors: -EINVAL (no namespace, keys past the
 * sequence's n), -ENOSPC (nothing published: the prefix cache is full of referenced blocks).
 *
 * Shared rows are copy-on-write: RETIER may promote them (copied into the client's T0 slots as
 * any row), quantize or evict them for one sequence; that changes only that sequence's view.
 */
#define KVT_LOOKUP_F_PIN (1u << 0)

/*
 * struct kvt_seq_stat - SEQ_STAT output, written to the arena at arena_off (arena_len >= size).
 * CQE res: bytes written.
 */
struct kvt_seq_stat {
	uint32_t size;
	uint32_t seq;
	uint64_t n_tokens;
	uint64_t tier_count[4]; /* T0, T1, T2, T3 */
	uint64_t pool_bytes; /* pool bytes it holds: own rows, key-scale blocks, retrieval pages */
	uint64_t bytes_in;   /* bytes appended into the pool */
	uint64_t bytes_out;  /* bytes copied from the pool to device buffers */
	double score_total;  /* sum of all SCORE_ADD values */
	uint64_t reserved[4];
};
KVT_STATIC_ASSERT(sizeof(struct kvt_seq_stat) == 112, "kvt_seq_stat ABI");

static inline uint32_t
kvt_dtype_size(uint32_t dtype)
{
	return dtype == KVT_DTYPE_F32 ? 4 : 2;
}

#endif /* KVT_ABI_H */
