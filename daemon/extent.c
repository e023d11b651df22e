/* SPDX-License-Identifier: MIT */
/*
 * The buddy allocator of extent.h. A free block of order k at index i covers units
 * [i << k, (i + 1) << k); it is a set bit i in order[k]. The free space is always a set of such
 * blocks, disjoint, none with its buddy free at the same order (freeing merges them), so a unit
 * is free exactly when one of its ancestors is a set bit.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "extent.h"

static int
bm_init(struct kvtd_ext_bitmap *b, uint64_t bits)
{
	uint64_t words = bits ? (bits + 63) / 64 : 1;

	b->levels = 0;
	for (;;) {
		if (b->levels == KVTD_EXT_LEVELS)
			return -EINVAL;
		b->lv[b->levels] = calloc(words, sizeof(uint64_t));
		if (!b->lv[b->levels])
			return -ENOMEM;
		b->words[b->levels++] = words;
		if (words == 1)
			return 0;
		words = (words + 63) / 64;
	}
}

static void
bm_fini(struct kvtd_ext_bitmap *b)
{
	for (unsigned l = 0; l < KVTD_EXT_LEVELS; l++)
		free(b->lv[l]);
	memset(b, 0, sizeof(*b));
}

static int
bm_test(const struct kvtd_ext_bitmap *b, uint64_t i)
{
	return (b->lv[0][i / 64] >> (i % 64)) & 1;
}

/* A word going from zero to non-zero is a bit set one level up, and so on. */
static void
bm_set(struct kvtd_ext_bitmap *b, uint64_t i)
{
	for (unsigned l = 0; l < b->levels; l++, i /= 64) {
		uint64_t was = b->lv[l][i / 64];

		b->lv[l][i / 64] = was | (1ull << (i % 64));
		if (was)
			return;
	}
}

static void
bm_clear(struct kvtd_ext_bitmap *b, uint64_t i)
{
	for (unsigned l = 0; l < b->levels; l++, i /= 64) {
		b->lv[l][i / 64] &= ~(1ull << (i % 64));
		if (b->lv[l][i / 64])
			return;
	}
}

/* The lowest set bit, or -1: down from the top word, one word a level. */
static int64_t
bm_first(const struct kvtd_ext_bitmap *b)
{
	uint64_t i = 0;

	if (!b->lv[b->levels - 1][0])
		return -1;
	for (unsigned l = b->levels; l-- > 0;)
		i = i * 64 + (uint64_t)__builtin_ctzll(b->lv[l][i]);
	return (int64_t)i;
}

/* Any bit set in [lo, hi). */
static int
bm_any(const struct kvtd_ext_bitmap *b, uint64_t lo, uint64_t hi)
{
	while (lo < hi) {
		uint64_t w = b->lv[0][lo / 64] >> (lo % 64);
		uint64_t span = 64 - lo % 64;

		if (hi - lo < span)
			w &= (1ull << (hi - lo)) - 1;
		if (w)
			return 1;
		lo += span;
	}
	return 0;
}

int
kvtd_ext_init(struct kvtd_ext_alloc *a, uint64_t n_units)
{
	int r;

	memset(a, 0, sizeof(*a));
	if (!n_units || n_units > (1ull << KVTD_EXT_MAX_ORDER))
		return -EINVAL;
	a->n_units = n_units;
	a->max_order = 63 - (unsigned)__builtin_clzll(n_units);
	for (unsigned k = 0; k <= a->max_order; k++) {
		r = bm_init(&a->order[k], (n_units + (1ull << k) - 1) >> k);
		if (r < 0) {
			kvtd_ext_fini(a);
			return r;
		}
	}
	return kvtd_ext_free(a, 0, n_units);
}

void
kvtd_ext_fini(struct kvtd_ext_alloc *a)
{
	for (unsigned k = 0; k <= KVTD_EXT_MAX_ORDER; k++)
		bm_fini(&a->order[k]);
	a->n_units = a->free_units = 0;
}

static void
free_block(struct kvtd_ext_alloc *a, uint64_t i, unsigned k)
{
	while (k < a->max_order && bm_test(&a->order[k], i ^ 1)) {
		bm_clear(&a->order[k], i ^ 1);
		i >>= 1;
		k++;
	}
	bm_set(&a->order[k], i);
}

/* The largest block that starts at @unit and fits in @n units: its order. */
static unsigned
piece_order(const struct kvtd_ext_alloc *a, uint64_t unit, uint64_t n)
{
	unsigned k = 63 - (unsigned)__builtin_clzll(n);

	if (unit && (unsigned)__builtin_ctzll(unit) < k)
		k = (unsigned)__builtin_ctzll(unit);
	return k < a->max_order ? k : a->max_order;
}

/* 1 when a unit of the block (i, k) is free: a free ancestor, or a free block inside it. */
static int
block_touches_free(const struct kvtd_ext_alloc *a, uint64_t i, unsigned k)
{
	for (unsigned j = k; j <= a->max_order; j++)
		if (bm_test(&a->order[j], i >> (j - k)))
			return 1;
	for (unsigned j = 0; j < k; j++)
		if (bm_any(&a->order[j], i << (k - j), (i + 1) << (k - j)))
			return 1;
	return 0;
}

int
kvtd_ext_free(struct kvtd_ext_alloc *a, uint64_t unit, uint64_t n)
{
	uint64_t u, left;

	if (!n || unit >= a->n_units || n > a->n_units - unit)
		return -EINVAL;
	/* init frees everything once: no unit is allocated to check against */
	if (a->free_units || a->n_units != n)
		for (u = unit, left = n; left;) {
			unsigned k = piece_order(a, u, left);

			if (block_touches_free(a, u >> k, k))
				return -EINVAL;
			u += 1ull << k;
			left -= 1ull << k;
		}
	for (u = unit, left = n; left;) {
		unsigned k = piece_order(a, u, left);

		free_block(a, u >> k, k);
		u += 1ull << k;
		left -= 1ull << k;
	}
	a->free_units += n;
	return 0;
}

int
kvtd_ext_alloc(struct kvtd_ext_alloc *a, uint64_t n, uint64_t *ret_unit)
{
	unsigned k, j;
	int64_t i = -1;
	uint64_t unit;

	if (!n)
		return -EINVAL;
	if (n > a->free_units)
		return -ENOSPC;
	k = n == 1 ? 0 : 64 - (unsigned)__builtin_clzll(n - 1);
	if (k > a->max_order)
		return -ENOSPC;
	for (j = k; j <= a->max_order; j++)
		if ((i = bm_first(&a->order[j])) >= 0)
			break;
	if (i < 0)
		return -ENOSPC;
	bm_clear(&a->order[j], (uint64_t)i);
	/* split down to order k, keeping the lower half: its upper halves become free blocks */
	while (j > k) {
		j--;
		i *= 2;
		bm_set(&a->order[j], (uint64_t)i + 1);
	}
	unit = (uint64_t)i << k;
	a->free_units -= 1ull << k;
	/* the tail past n goes back at once (counted back in by kvtd_ext_free()) */
	if ((1ull << k) > n)
		kvtd_ext_free(a, unit + n, (1ull << k) - n);
	*ret_unit = unit;
	return 0;
}

uint64_t
kvtd_ext_largest(const struct kvtd_ext_alloc *a)
{
	for (unsigned k = a->max_order + 1; k-- > 0;)
		if (a->order[k].levels && bm_first(&a->order[k]) >= 0)
			return 1ull << k;
	return 0;
}

int
kvtd_ext_is_free(const struct kvtd_ext_alloc *a, uint64_t unit)
{
	if (unit >= a->n_units)
		return 0;
	for (unsigned k = 0; k <= a->max_order; k++)
		if (bm_test(&a->order[k], unit >> k))
			return 1;
	return 0;
}
