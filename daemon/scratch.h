/* SPDX-License-Identifier: MIT */
/*
 * scratch.h - the per-op working memory: owned by whoever runs ops (poller.h, session.h), used by
 * the op handlers (seq*.c), so that none of them needs the others' headers for it.
 */
#ifndef KVTD_SCRATCH_H
#define KVTD_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

/*
 * struct kvtd_scratch - the per-op working memory of whoever runs ops (a poller; a session no
 * poller has yet): row batches, quantization room, a private copy of a query. Each of
 * KVTD_SCRATCH_BUFS buffers grows to the largest size asked of it and is kept, so that ops in
 * steady state allocate nothing. One thread at a time (the poller's, lock held).
 */
#define KVTD_SCRATCH_BUFS 4
struct kvtd_scratch {
	void *buf[KVTD_SCRATCH_BUFS];
	size_t size[KVTD_SCRATCH_BUFS];
	uint64_t grows; /* allocations made so far: flat once every buffer is large enough */
};

/* Buffer @i, at least @size bytes, 64-byte aligned; what it held before is not kept. Returns
 * NULL when out of memory (the buffer stays as it was). */
void *kvtd_scratch_get(struct kvtd_scratch *sc, unsigned i, size_t size);
/* Frees every buffer; @sc can be used again (it grows anew). */
void kvtd_scratch_fini(struct kvtd_scratch *sc);

#endif
