/* SPDX-License-Identifier: MIT */
/*
 * kv_kvtier.h - the KV cache of kvtier-llm managed by kvtierd through libkvtier.
 *
 * The backend opens one session and one f32 sequence (geometry of the model) with a T0 region
 * and a staging region, both host-backend device buffers (sealed memfds shared with kvtierd).
 * Per step (kv.h's protocol), through libkvtier's tiering driver (kvtier.h, kvt_driver_*):
 *   begin(p)  RETIER when the Δ free T0 slots handed out by the last RETIER are used up, and
 *             at the end of the prompt (p == prompt_len; before it every slot is free);
 *             after each RETIER, one FETCH T1|T2 of all layers into the staging region.
 *             Between two RETIERs the T1/T2 sets do not change (new tokens go to T0), so the
 *             staged rows stay valid.
 *   view(l)   T0 slots (read in place) merged with the staged rows, ordered by position.
 *   append(p) the token's rows go into the step's T0 slot.
 *   score()   APPEND (KVT_APPEND_F_T0) and SCORE_ADD, dense over [pos[0], p] with 0 at
 *             evicted positions, queued per step and submitted together before each RETIER
 *             (the daemon applies the same per-step ops in the same order).
 * Attention over that view is the same arithmetic as over the local backend's view of the
 * same positions, so with nothing evicted or quantized (policy full, or tiered with evict 0
 * and t2 0, at any hbm_frac) the logits are bit-identical to the local backend's.
 *
 * Prefix sharing (opts.share_ns, docs/prefix.md): the backend joins the namespace named by the
 * model's identity, chains the prompt's block keys, LOOKUPs them with KVT_LOOKUP_F_PIN and opens
 * the sequence from the matched blocks: it starts at n = matched tokens, their rows shared in T1
 * (staged by one FETCH when the sequence opens, then tiered like any other row), and the forward
 * pass computes only the rest of the prompt. At least one prompt token is always left to compute
 * (its logits give the first generated token). Once the whole prompt is appended (begin(prompt_len)
 * or kv_kvtier_publish()), the prompt's full blocks are PUBLISHed for the next process.
 *
 * Every kvtier error is returned as is (-ECONNRESET when the daemon is gone); after one, the
 * backend refuses further steps with the same error.
 */
#ifndef KVT_LLM_KV_KVTIER_H
#define KVT_LLM_KV_KVTIER_H

#include <stddef.h>
#include <stdint.h>

#include "kv.h"
#include "kvtier.h"

struct kv_kvtier_opts {
	const char *socket; /* NULL: $KVTIER_SOCKET, else KVT_DEFAULT_SOCKET */
	const char *name;   /* session label for kvtierctl; NULL: the program name */
	uint8_t policy;	    /* KVT_POLICY_* */
	float hbm_frac, evict_frac, t2_frac;
	uint32_t t2_flags; /* KVT_T2_F_* (KVT_T2_F_KEY_CHANNEL: per-channel int8 keys) */
	uint32_t delta;	   /* re-tier period (>= 1) */
	uint32_t sinks;
	uint32_t window;
	uint32_t prompt_len; /* protected prompt; also: RETIER when position prompt_len starts */
	uint32_t max_tokens; /* positions the sequence will hold at most (prompt + generated) */
	uint32_t spin_us;    /* libkvtier spin before sleeping on a completion */
	/* prefix sharing: NULL share_ns = none */
	const char *share_ns;	/* namespace name, the model's identity (< KVT_NS_NAME_LEN) */
	uint32_t block_tokens;	/* tokens per block; 0: KVT_BLOCK_TOKENS_DEFAULT */
	const uint32_t *prompt; /* prompt_len token ids, read by kv_kvtier_create() only */
};

/* Defaults of docs/tiering.md: tiered, Δ 64, 4 sinks, window 128, hbm 0.5, evict 0.03. */
void kv_kvtier_opts_default(struct kv_kvtier_opts *o);

/*
 * kv_kvtier_create() - connect to kvtierd and open the sequence.
 *
 * The T0 region is the HBM budget: ceil(hbm_frac * max_tokens) slots, at least the protected
 * set (max(sinks, prompt_len) + window), plus Δ slots for the appends between two RETIERs
 * (policy full: max_tokens + Δ; streaming: the protected set + Δ). The staging region has
 * max_tokens rows per layer. Appends past max_tokens fail with -ENOSPC.
 * On failure, a reason goes to @err (the daemon's message when it gave one).
 * Returns 0, -EINVAL (bad options), or libkvtier's error (-ENOENT/-ECONNREFUSED: no daemon).
 */
int kv_kvtier_create(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
		     const struct kv_kvtier_opts *o, struct kv_backend **ret_kv, char *err,
		     size_t errlen);

/* What prefix sharing did (all zero without share_ns, but open_s). */
struct kv_kvtier_share {
	uint32_t block_tokens;	 /* in effect */
	uint32_t prompt_blocks;	 /* full blocks of the prompt */
	uint32_t matched_tokens; /* positions the sequence opened with: shared rows */
	int published;		 /* leading blocks the namespace holds after PUBLISH, -1: not yet */
	uint32_t published_new;	 /* of them, this sequence's rows (the others were there) */
	int publish_err;	 /* -ENOSPC: the daemon's prefix cache was full of blocks in use */
	double open_s;		 /* block keys, LOOKUP and SEQ_OPEN (SEQ_OPEN alone without) */
};
void kv_kvtier_share_info(const struct kv_backend *kv, struct kv_kvtier_share *ret);

/*
 * kv_kvtier_publish() - PUBLISH the prompt's full blocks now, if sharing and not done yet (the
 * backend does it itself when the first generated token's step begins). Every prompt token must
 * have been appended. -ENOSPC is not an error here (kept in publish_err: nothing published).
 * Returns 0 or libkvtier's error.
 */
int kv_kvtier_publish(struct kv_backend *kv);

/* SEQ_STAT of the backend's sequence. Returns 0 or libkvtier's error. */
int kv_kvtier_stat(struct kv_backend *kv, struct kvt_seq_stat *ret_stat);

/* Client-side counters, for profiling: RETIERs, FETCHes, rows staged in total, and seconds
 * spent in RETIER, FETCH, queueing APPEND (with the row copy into the T0 slot), queueing
 * SCORE_ADD, submitting the queue and waiting for its completions, and building views. */
struct kv_kvtier_counters {
	uint64_t retiers, fetches, rows_staged, appends, score_adds;
	double retier_s, fetch_s, append_s, score_s, reap_s, view_s;
};
void kv_kvtier_counters(const struct kv_backend *kv, struct kv_kvtier_counters *ret);

/* Session id, as kvtierctl shows it, and the sequence id. */
uint32_t kv_kvtier_session(const struct kv_backend *kv);
uint32_t kv_kvtier_seq(const struct kv_backend *kv);

/* Policy names "tiered", "h2o", "streaming", "full" <-> KVT_POLICY_*; -1 / NULL if unknown. */
int kv_kvtier_policy(const char *name);
const char *kv_kvtier_policy_name(int policy);

#endif /* KVT_LLM_KV_KVTIER_H */
