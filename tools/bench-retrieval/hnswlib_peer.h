/* SPDX-License-Identifier: MIT */
/*
 * hnswlib_peer.h - the C face of the hnswlib baseline (hnswlib_peer.cpp). hnswlib is a
 * header-only HNSW whose inner-product kernels are compiled here for the build machine's SIMD
 * (-march=native), the peer FAISS's Debian build cannot be: its distance code is scalar.
 * Searches run on the calling thread; builds may use several (hpeer_build's @threads).
 * Every C++ exception becomes an error code.
 */
#ifndef KVT_BENCH_HNSWLIB_PEER_H
#define KVT_BENCH_HNSWLIB_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct hpeer;

/*
 * hpeer_build - an HNSW graph for inner-product search over @n keys of @d floats, @m links a
 * node (2m on layer 0), construction beam @efc, inserted by @threads threads (1: in key order).
 * @l2 false: hnswlib's inner-product space (1 - <q, k>, not a metric: small keys are rarely
 * anyone's neighbour); true: the exact MIPS-to-L2 reduction, keys [k, sqrt(M - |k|^2)] with
 * M = max |k|^2 and queries [q, 0], whose L2 order is the inner-product order.
 * Returns 0, or -EINVAL (n, d, m, efc or threads zero), -ENOMEM, -EIO (hnswlib threw; message
 * on stderr).
 */
int hpeer_build(const float *keys, size_t n, unsigned int d, unsigned int m, unsigned int efc,
		unsigned int threads, bool l2, struct hpeer **ret_peer);

/*
 * hpeer_search - top @k of one query with search beam max(@ef, @k), ids into @ret_ids best
 * first (-1 padded). Returns 0 or -EIO.
 */
int hpeer_search(struct hpeer *p, const float *q, unsigned int k, unsigned int ef,
		 int64_t *ret_ids);

/* hpeer_describe - one line naming the graph's parameters (static storage per peer). */
const char *hpeer_describe(const struct hpeer *p);

/* hpeer_free - NULL-safe. */
void hpeer_free(struct hpeer *p);

#ifdef __cplusplus
}
#endif

#endif /* KVT_BENCH_HNSWLIB_PEER_H */
