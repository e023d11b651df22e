/* SPDX-License-Identifier: MIT */
/*
 * seq.h - per-sequence state: geometry, the pool slot of every position, cumulative scores,
 * tiers and the T0 slot map. Poller lock held for everything here.
 */
#ifndef KVTD_SEQ_H
#define KVTD_SEQ_H

#include <stdint.h>

#include "kvt_abi.h"

struct kvtd_session;
struct kvt_dev_buf;

enum { KVTD_T0 = 0, KVTD_T1 = 1, KVTD_T2 = 2, KVTD_T3 = 3 };

struct kvtd_seq {
	uint32_t id;
	struct kvt_seq_params p;
	uint64_t row_bytes;   /* H * D * elem: one (token, layer, K|V) */
	uint64_t token_bytes; /* L * 2 * row_bytes: one pool slot */
	int cls;	      /* pool class of token slots */
	uint64_t n;	      /* positions appended */
	uint64_t cap;	      /* allocated length of the per-position arrays */
	void **slot;	      /* pool slot per position, NULL once evicted */
	float *score;
	uint8_t *tier;
	int32_t *slot_pos;    /* T0 slot -> position, -1 free; t0_slots entries */
	int64_t *pos_slot;    /* position -> T0 slot, -1 none */
	struct kvt_dev_buf *t0_buf, *stage_buf;
	uint64_t tier_count[4];
	uint64_t bytes_in, bytes_out;
	double score_total;
};

/*
 * kvtd_seq_open() - validate @p (already copied out of the arena) and create a sequence.
 * Returns the id (> 0), -EINVAL (bad field, with the reason logged at debug level), -EMFILE
 * (seqs_per_session reached), -ENOENT (buffer id not registered), -ERANGE (region outside its
 * buffer), -E2BIG (a token slot larger than a pool chunk), -ENOSPC (no pool class left), -ENOMEM.
 */
int kvtd_seq_open(struct kvtd_session *s, const struct kvt_seq_params *p);
/* Frees the sequence's slots and buffer references. Returns 0 or -ENOENT. */
int kvtd_seq_close(struct kvtd_session *s, uint32_t id);
void kvtd_seq_destroy(struct kvtd_session *s, struct kvtd_seq *q);
/* NULL when @id names no open sequence. */
struct kvtd_seq *kvtd_seq_get(struct kvtd_session *s, uint32_t id);

/* APPEND from rows in memory laid out [token][layer][K,V][row]. Returns the new n or -errno. */
int64_t kvtd_seq_append_rows(struct kvtd_session *s, struct kvtd_seq *q, const uint8_t *rows,
			     uint32_t ntok);
/* APPEND from the T0 region at @slots. Returns the new n or -errno (-EINVAL bad slot). */
int64_t kvtd_seq_append_t0(struct kvtd_session *s, struct kvtd_seq *q, const uint32_t *slots,
			   uint32_t ntok);

#endif
