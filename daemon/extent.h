/* SPDX-License-Identifier: MIT */
/*
 * extent.h - the spill store's space: a binary buddy allocator over fixed units (4 KiB in the
 * store, spill.h), handing out extents of an exact number of units (docs/spill.md).
 *
 * Guarantees:
 * - An extent is one contiguous run of units; two live extents never overlap.
 * - An extent of n units starts at a multiple of 2^ceil(log2 n) (the buddy block it was cut
 *   from), so a power-of-two extent is naturally aligned.
 * - Exact sizes: a request of n units takes the smallest buddy block that holds it and gives its
 *   tail back at once (as Linux's alloc_pages_exact() does), so no unit is lost to rounding.
 * - First fit: the lowest-addressed free block of the smallest order that holds the request, so
 *   allocations pack towards the start and large blocks stay whole at the end.
 * - Freeing coalesces buddies greedily: once every extent is freed the space is one set of
 *   maximal aligned blocks again, exactly as after init (tested).
 * - Cost: alloc and free are O(log n) bitmap updates, each O(log64 n): the free blocks of each
 *   order are a bitmap with a summary level per 64 words. Memory: about 2 bits a unit.
 * - Not thread-safe: one owner (the spill store's).
 */
#ifndef KVTD_EXTENT_H
#define KVTD_EXTENT_H

#include <stdint.h>

#define KVTD_EXT_MAX_ORDER 40 /* 2^40 units: far past any device */
#define KVTD_EXT_LEVELS	   8  /* summary levels of a bitmap: 64^8 bits */

struct kvtd_ext_bitmap {
	unsigned levels;		 /* 1 + summary levels, the last one word */
	uint64_t *lv[KVTD_EXT_LEVELS];	 /* lv[0]: one bit a block; lv[l + 1]: a word of lv[l] */
	uint64_t words[KVTD_EXT_LEVELS]; /* words of each level */
};

struct kvtd_ext_alloc {
	uint64_t n_units;
	uint64_t free_units;
	unsigned max_order; /* the largest block: 2^max_order <= n_units */
	struct kvtd_ext_bitmap order[KVTD_EXT_MAX_ORDER + 1];
};

/* Sets up @a over @n_units free units (1 to 2^40). Returns 0, -EINVAL or -ENOMEM. */
int kvtd_ext_init(struct kvtd_ext_alloc *a, uint64_t n_units);
/* Frees @a's bitmaps; accepts a zeroed or half-built @a. */
void kvtd_ext_fini(struct kvtd_ext_alloc *a);

/*
 * kvtd_ext_alloc() - an extent of exactly @n units, first unit in @ret_unit.
 * Returns 0, -EINVAL (@n is 0) or -ENOSPC (no free run of @n units on a buddy boundary; the
 * free total may still exceed @n: that is fragmentation, see kvtd_ext_largest()).
 */
int kvtd_ext_alloc(struct kvtd_ext_alloc *a, uint64_t n, uint64_t *ret_unit);
/*
 * kvtd_ext_free() - gives back @n units at @unit, as kvtd_ext_alloc() returned them (or any run
 * of allocated units: the store frees exactly what it allocated). Returns 0, or -EINVAL when the
 * run leaves the space or any of its units is already free (nothing is changed then).
 */
int kvtd_ext_free(struct kvtd_ext_alloc *a, uint64_t unit, uint64_t n);
/* The largest free block, in units (an extent that size is sure to be allocatable). */
uint64_t kvtd_ext_largest(const struct kvtd_ext_alloc *a);
/* 1 when @unit is free. */
int kvtd_ext_is_free(const struct kvtd_ext_alloc *a, uint64_t unit);

#endif
