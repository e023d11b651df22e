/* SPDX-License-Identifier: MIT */
/*
 * The ring helpers: index arithmetic across u32 wrap-around, and a producer/consumer pair on two
 * threads moving 200,000 entries through a small ring in order, each exactly once.
 */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_ring.h"
#include "kvt_test.h"

START_TEST(t_arith_wraps)
{
	ck_assert_uint_eq(kvt_ring_ready(UINT32_MAX - 1, 2), 4);
	ck_assert_uint_eq(kvt_ring_space(8, UINT32_MAX - 1, 2), 4);
	ck_assert_uint_eq(kvt_ring_space(8, 5, 5), 8);
	ck_assert_uint_eq(kvt_ring_ready(5, 5), 0);
}
END_TEST

START_TEST(t_flags)
{
	struct kvt_ring_hdr r;

	memset(&r, 0, sizeof(r));
	ck_assert(!kvt_ring_needs_wakeup(&r));
	kvt_ring_set_flags(&r, KVT_RING_NEED_WAKEUP);
	ck_assert(kvt_ring_needs_wakeup(&r));
	kvt_ring_set_flags(&r, 0);
	ck_assert(!kvt_ring_needs_wakeup(&r));
}
END_TEST

enum { ENTRIES = 16, COUNT = 200000 };

struct spsc {
	struct kvt_ring_hdr hdr;
	uint64_t slots[ENTRIES];
	uint32_t start;
};

static void *
producer(void *arg)
{
	struct spsc *q = arg;
	uint32_t tail = q->start;

	for (uint64_t v = 0; v < COUNT; v++) {
		while (kvt_ring_space(ENTRIES, kvt_ring_load_head(&q->hdr), tail) == 0)
			sched_yield(); /* the VM may have one core for both threads */
		q->slots[tail & (ENTRIES - 1)] = v * 7 + 1;
		kvt_ring_store_tail(&q->hdr, ++tail);
	}
	return NULL;
}

static void
run_spsc(uint32_t start)
{
	struct spsc *q = aligned_alloc(64, (sizeof(*q) + 63) & ~(size_t)63);
	uint32_t head = start;
	pthread_t th;

	memset(q, 0, sizeof(*q));
	q->start = start;
	q->hdr.prod_tail = q->hdr.cons_head = start; /* exercise wrap-around */
	q->hdr.entries = ENTRIES;
	ck_assert_int_eq(pthread_create(&th, NULL, producer, q), 0);
	for (uint64_t v = 0; v < COUNT; v++) {
		uint32_t tail;

		while ((tail = kvt_ring_load_tail(&q->hdr)) == head)
			sched_yield();
		ck_assert_uint_le(kvt_ring_ready(head, tail), ENTRIES);
		ck_assert_uint_eq(q->slots[head & (ENTRIES - 1)], v * 7 + 1);
		kvt_ring_store_head(&q->hdr, ++head);
	}
	pthread_join(th, NULL);
	free(q);
}

START_TEST(t_spsc_in_order)
{
	run_spsc(0);
}
END_TEST

START_TEST(t_spsc_wrap)
{
	run_spsc(UINT32_MAX - 100);
}
END_TEST

KVT_CHECK_MAIN("ring", 60, NULL, NULL, t_arith_wraps, t_flags, t_spsc_in_order, t_spsc_wrap)
