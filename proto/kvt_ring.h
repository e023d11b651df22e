/* SPDX-License-Identifier: MIT */
/*
 * kvt_ring.h - the only code that touches shared ring indices.
 *
 * Both rings are single-producer single-consumer with free-running u32 indices. The producer
 * writes the entry, then publishes prod_tail with a release store; the consumer reads prod_tail
 * with an acquire load, reads the entry, then publishes cons_head with a release store, which the
 * producer's acquire load of cons_head pairs with before it reuses the slot.
 *
 * Busy consumers poll the stamp of the next entry rather than prod_tail (see kvt_ring_stamp()):
 * the tail line then stays in the producer's cache and only entry lines cross between cores.
 *
 * Wakeup (io_uring SQPOLL style): a consumer about to sleep sets NEED_WAKEUP, issues a full fence
 * and re-reads prod_tail; a producer publishes prod_tail, issues a full fence and reads flags.
 * The two fences order store-then-load on both sides (Dekker), so at least one side sees the
 * other: either the consumer sees the new tail and does not sleep, or the producer sees
 * NEED_WAKEUP and rings the doorbell.
 */
#ifndef KVT_RING_H
#define KVT_RING_H

#include <stdatomic.h>
#include <stdint.h>

#include "kvt_abi.h"

#define KVT__ATOMIC(p) ((_Atomic uint32_t *)(p))

/* Producer: read own tail (no other writer, relaxed is enough). */
static inline uint32_t
kvt_ring_prod_tail_relaxed(const struct kvt_ring_hdr *r)
{
	return atomic_load_explicit(KVT__ATOMIC(&r->prod_tail), memory_order_relaxed);
}

/* Producer: publish entries up to @tail. Pairs with kvt_ring_load_tail() (acquire). */
static inline void
kvt_ring_store_tail(struct kvt_ring_hdr *r, uint32_t tail)
{
	atomic_store_explicit(KVT__ATOMIC(&r->prod_tail), tail, memory_order_release);
}

/* Consumer: see published entries. Pairs with kvt_ring_store_tail() (release). */
static inline uint32_t
kvt_ring_load_tail(const struct kvt_ring_hdr *r)
{
	return atomic_load_explicit(KVT__ATOMIC(&r->prod_tail), memory_order_acquire);
}

/* Consumer: release consumed slots. Pairs with kvt_ring_load_head() (acquire). */
static inline void
kvt_ring_store_head(struct kvt_ring_hdr *r, uint32_t head)
{
	atomic_store_explicit(KVT__ATOMIC(&r->cons_head), head, memory_order_release);
}

/* Producer: see freed slots. Pairs with kvt_ring_store_head() (release). */
static inline uint32_t
kvt_ring_load_head(const struct kvt_ring_hdr *r)
{
	return atomic_load_explicit(KVT__ATOMIC(&r->cons_head), memory_order_acquire);
}

/* Consumer: set or clear KVT_RING_NEED_WAKEUP. A consumer that sets it must then call
 * kvt_ring_fence() and re-check kvt_ring_load_tail() before sleeping. */
static inline void
kvt_ring_set_flags(struct kvt_ring_hdr *r, uint32_t flags)
{
	atomic_store_explicit(KVT__ATOMIC(&r->flags), flags, memory_order_relaxed);
}

/* Producer: after kvt_ring_store_tail() and kvt_ring_fence(), does the consumer need a kick? */
static inline int
kvt_ring_needs_wakeup(const struct kvt_ring_hdr *r)
{
	return (atomic_load_explicit(KVT__ATOMIC(&r->flags), memory_order_relaxed) &
		KVT_RING_NEED_WAKEUP) != 0;
}

/* Full fence ordering a store to one index before a load of the other (see top comment). */
static inline void
kvt_ring_fence(void)
{
	atomic_thread_fence(memory_order_seq_cst);
}

/*
 * Entry stamps (struct kvt_sqe.stamp, struct kvt_cqe.stamp): the producer stores
 * kvt_ring_stamp(index) last, with release, after filling the entry; the consumer's acquire load
 * seeing that value makes the entry's other fields visible. Stamps of the previous lap (index -
 * entries + 1) and of a zeroed ring (0) never equal the expected one.
 */
static inline uint32_t
kvt_ring_stamp(uint32_t index)
{
	return index + 1;
}

/* Producer: publish one filled entry. Pairs with kvt_ring_load_stamp() (acquire). */
static inline void
kvt_ring_store_stamp(uint32_t *stamp, uint32_t index)
{
	atomic_store_explicit(KVT__ATOMIC(stamp), kvt_ring_stamp(index), memory_order_release);
}

/* Consumer: is the entry at @index published? Pairs with kvt_ring_store_stamp() (release). */
static inline int
kvt_ring_load_stamp(const uint32_t *stamp, uint32_t index)
{
	return atomic_load_explicit(KVT__ATOMIC(stamp), memory_order_acquire) ==
	       kvt_ring_stamp(index);
}

/*
 * The op error record (struct kvt_op_err) is a sequence lock with one writer, the daemon:
 * kvt_op_err_begin() makes gen odd, the record is filled, kvt_op_err_end() makes it even with
 * release, all before the CQE of that op is published (whose release store orders the record
 * before the CQE for a reader that acquired the CQE). A reader: g = kvt_op_err_read_begin()
 * (acquire), copy, then kvt_op_err_read_retry(g) says whether the copy may be torn (gen odd or
 * changed; the acquire fence orders the copy before the re-read of gen).
 */
static inline void
kvt_op_err_begin(struct kvt_op_err *e, uint32_t *gen)
{
	*gen += 1; /* the writer keeps gen privately: it never trusts the shared copy */
	atomic_store_explicit(KVT__ATOMIC(&e->gen), *gen, memory_order_relaxed);
	atomic_thread_fence(memory_order_release); /* gen odd before the fields change */
}

/* Writer: the record is whole. Pairs with kvt_op_err_read_begin() (acquire). */
static inline void
kvt_op_err_end(struct kvt_op_err *e, uint32_t *gen)
{
	*gen += 1;
	atomic_store_explicit(KVT__ATOMIC(&e->gen), *gen, memory_order_release);
}

/* Reader: gen before the copy. Pairs with kvt_op_err_end() (release). */
static inline uint32_t
kvt_op_err_read_begin(const struct kvt_op_err *e)
{
	return atomic_load_explicit(KVT__ATOMIC(&e->gen), memory_order_acquire);
}

/* Reader: non-zero when the copy taken since kvt_op_err_read_begin() returned @gen is unusable
 * (written meanwhile). Pairs with kvt_op_err_begin()'s release fence. */
static inline int
kvt_op_err_read_retry(const struct kvt_op_err *e, uint32_t gen)
{
	atomic_thread_fence(memory_order_acquire);
	return (gen & 1) || atomic_load_explicit(KVT__ATOMIC(&e->gen), memory_order_relaxed) != gen;
}

/* Entries the consumer may read, given its private head and the loaded tail. */
static inline uint32_t
kvt_ring_ready(uint32_t head, uint32_t tail)
{
	return tail - head;
}

/* Slots the producer may fill. */
static inline uint32_t
kvt_ring_space(uint32_t entries, uint32_t head, uint32_t tail)
{
	return entries - (tail - head);
}

#endif /* KVT_RING_H */
