/* SPDX-License-Identifier: MIT */
/*
 * kv_kvtier.h - the KV cache of kvtier-llm managed by kvtierd through libkvtier.
 *
 * The backend opens one session and one f32 sequence (geometry of the model) with a T0 region
 * and a staging region, both host-backend device buffers (sealed memfds shared with kvtierd).
 * Per step (kv.h's protocol):
 *   begin(p)  RETIER when the Δ free T0 slots handed out by the last RETIER are used up, and
 *             at the end of the prompt (p == prompt_len); after each RETIER, one FETCH
 *             T1|T2 of all layers into the staging region. Between two RETIERs the T1/T2 sets
 *             do not change (new tokens go to T0), so the staged rows stay valid.
 *   view(l)   T0 slots (read in place) merged with the staged rows, ordered by position.
 *   append(p) the token's rows go into the next free T0 slot, then APPEND (KVT_APPEND_F_T0).
 *   score()   SCORE_ADD, dense over [pos[0], p] with 0 at evicted positions.
 *   APPEND and SCORE_ADD are queued per step and submitted together before each RETIER (the
 *   daemon applies the same per-step ops in the same order; see kv_kvtier.c).
 * Attention over that view is the same arithmetic as over the local backend's view of the
 * same positions, so with nothing evicted or quantized (policy full, or tiered with evict 0
 * and t2 0, at any hbm_frac) the logits are bit-identical to the local backend's.
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
