/* SPDX-License-Identifier: MIT */
/*
 * paris_int.h - the stages of the index's search pipeline (paris.c) that kvt_paris_search()
 * (paris_search.c) strings together. Not for other modules: paris.h is the interface.
 */
#ifndef KVT_ENGINE_PARIS_INT_H
#define KVT_ENGINE_PARIS_INT_H

#include <stddef.h>
#include <stdint.h>

#include "paris.h"

/*
 * kvt_paris_select() over the live keys of @ix: @hist leaves the dropped ones out and they vote
 * 0, so they can only be reached when the cut falls at vote 0, where they are skipped. With
 * c >= live (no votes taken), every live key.
 */
uint32_t kvt_paris_select_live(const struct kvt_paris_index *ix, const uint8_t *votes, uint32_t c,
			       const uint32_t *hist, uint32_t *ret_cand);
/* The estimates for a query of norm @norm: the search passes 1 and ranks the unit query's
 * estimates, which neither overflow nor underflow whatever the query's scale. */
void kvt_paris_rerank_norm(const struct kvt_paris_index *ix, const struct kvt_paris_query *q,
			   float norm, const uint32_t *cand, uint32_t nc, float *ret_score);
/* Grows @s's buffers to hold @votes vote bytes, @cand candidates and @ref refined keys (what
 * they held is not kept). Returns 0 or -ENOMEM (@s still valid, to grow again or free). */
int kvt_paris_scratch_reserve(struct kvt_paris_scratch *s, size_t votes, size_t cand, size_t ref);

#endif /* KVT_ENGINE_PARIS_INT_H */
