/* SPDX-License-Identifier: MIT */
/*
 * paris_zone.h - sink / retrieval / dense-window bookkeeping of ParisKV (docs/retrieval.md s. 6).
 *
 * A sequence of total length T (tokens written so far, the current one included) whose prompt
 * had L tokens splits by absolute position into
 *   sink      [0, S)
 *   retrieval [S, S + N)     keys encoded in the per-head indexes, retrieval index i = pos - S
 *   dense     [S + N, T)     the local window W plus an update buffer of 0 .. U-1 tokens
 * with N a pure function of (S, W, U, L, T):
 *   L >= S + W:  N = (L - S - W) + U * floor((T - L) / U)
 *   L <  S + W:  N = 0 while T < S + W, else U * floor((T - S - W) / U)
 * Prefill encodes [S, L - W) at once; afterwards every U-th decode token triggers a flush that
 * encodes the U oldest dense tokens. Because N depends only on these numbers, the daemon's TOPK
 * op and a client agree on every zone without exchanging state. All functions are pure and
 * thread-safe.
 */
#ifndef KVT_ENGINE_PARIS_ZONE_H
#define KVT_ENGINE_PARIS_ZONE_H

#include <stdbool.h>
#include <stdint.h>

/* struct kvt_paris_zone_cfg - zone sizes; the reference decode defaults are 4 / 512 / 128 / 2000.
 */
struct kvt_paris_zone_cfg {
	uint32_t sink;		 /* S */
	uint32_t local;		 /* W */
	uint32_t update;	 /* U, >= 1 */
	uint32_t full_threshold; /* T below this: dense attention only (section 5) */
};

enum kvt_paris_zone {
	KVT_PARIS_ZONE_SINK = 0,
	KVT_PARIS_ZONE_RETRIEVAL = 1,
	KVT_PARIS_ZONE_DENSE = 2,
};

/* struct kvt_paris_zones - the split at one length (kvt_paris_zone_at()). */
struct kvt_paris_zones {
	uint32_t total;	      /* T */
	uint32_t sink_end;    /* min(S, T) */
	uint32_t ret_len;     /* N; the retrieval zone is [sink_end, sink_end + N) */
	uint32_t dense_begin; /* S + N (or T when T <= S) */
	uint32_t buffered;    /* dense tokens beyond the local window: 0 .. U-1 once T >= S + W */
};

/* kvt_paris_zone_check - returns 0, or -EINVAL when update is 0 or S + W overflows u32. */
int kvt_paris_zone_check(const struct kvt_paris_zone_cfg *cfg);

/*
 * kvt_paris_zone_at - the split of a sequence with prompt length @prefill at length @total.
 * Returns 0 and fills @ret_z, or -EINVAL (bad cfg, @total < @prefill).
 */
int kvt_paris_zone_at(const struct kvt_paris_zone_cfg *cfg, uint32_t prefill, uint32_t total,
		      struct kvt_paris_zones *ret_z);

/*
 * kvt_paris_zone_of - which zone absolute position @pos is in at length @total.
 * Returns a KVT_PARIS_ZONE_* value, or -EINVAL (as kvt_paris_zone_at), -ERANGE (@pos >= @total).
 */
int kvt_paris_zone_of(const struct kvt_paris_zone_cfg *cfg, uint32_t prefill, uint32_t total,
		      uint32_t pos);

/*
 * kvt_paris_zone_flush - what to encode now. @encoded keys of the retrieval zone are already in
 * the indexes (retrieval indices 0 .. encoded-1); at length @total the zone holds N.
 * @ret_pos: first absolute position to encode (S + encoded). @ret_count: N - encoded (0 when no
 * flush is due). Both untouched on failure.
 * Returns 0, or -EINVAL (as kvt_paris_zone_at, or @encoded > N: the caller went ahead of the
 * schedule).
 */
int kvt_paris_zone_flush(const struct kvt_paris_zone_cfg *cfg, uint32_t prefill, uint32_t total,
			 uint32_t encoded, uint32_t *ret_pos, uint32_t *ret_count);

/*
 * kvt_paris_zone_dense_only - true when the step should use full attention instead of
 * retrieval: T < max(full_threshold, S + W + 2k) or N == 0 (section 5). @k: the final top-k.
 * A bad cfg or @total < @prefill also answers true (nothing can be retrieved).
 */
bool kvt_paris_zone_dense_only(const struct kvt_paris_zone_cfg *cfg, uint32_t prefill,
			       uint32_t total, uint32_t k);

#endif /* KVT_ENGINE_PARIS_ZONE_H */
