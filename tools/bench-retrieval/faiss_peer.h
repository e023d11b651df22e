/* SPDX-License-Identifier: MIT */
/*
 * faiss_peer.h - the C face of the FAISS baselines (faiss_peer.cpp), so the benchmark stays C.
 * All functions run single-threaded (OpenMP capped at 1 thread at build) and catch every C++
 * exception, turning it into an error code.
 */
#ifndef KVT_BENCH_FAISS_PEER_H
#define KVT_BENCH_FAISS_PEER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum fpeer_kind {
	FPEER_FLAT = 0,	 /* IndexFlatIP */
	FPEER_IVFPQ = 1, /* IndexIVFPQ, inner product, trained on the first ntrain keys */
	FPEER_HNSW = 2,	 /* IndexHNSWFlat, inner product */
};

struct fpeer;

/*
 * fpeer_build - build an index over @n keys of @d floats.
 * @ntrain: keys used for training (IVFPQ only): the first ntrain of @keys.
 * Returns 0, or -EINVAL (unknown kind), -EIO (FAISS threw; message on stderr), -ENOMEM.
 */
int fpeer_build(enum fpeer_kind kind, const float *keys, size_t n, unsigned int d, size_t ntrain,
		struct fpeer **ret_peer);

/*
 * fpeer_search - top @k of one query, ids into @ret_ids (k entries, -1 padded by FAISS).
 * Returns 0 or -EIO.
 */
int fpeer_search(struct fpeer *p, const float *q, unsigned int k, int64_t *ret_ids);

/*
 * fpeer_knob - the search-time knob: IVFPQ nprobe (clamped to nlist), HNSW efSearch.
 * Returns the value set, or -EINVAL (a flat index has none). fpeer_describe() follows it.
 */
int fpeer_knob(struct fpeer *p, unsigned int value);

/* fpeer_knob_max - the largest useful knob value: IVFPQ nlist; 0 for HNSW and flat. */
unsigned int fpeer_knob_max(const struct fpeer *p);

/* fpeer_describe - one line naming the index parameters (static storage per peer). */
const char *fpeer_describe(const struct fpeer *p);

/* fpeer_free - NULL-safe. */
void fpeer_free(struct fpeer *p);

#ifdef __cplusplus
}
#endif

#endif /* KVT_BENCH_FAISS_PEER_H */
