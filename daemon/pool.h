/* SPDX-License-Identifier: MIT */
/*
 * pool.h - the daemon's pinned host pool.
 *
 * One region allocated, NUMA-bound, touched and locked once at start, carved into chunks
 * (2 MiB by default). A chunk serves one slot size (a "class"); slots are handed out from
 * per-chunk free lists, so allocation and free are O(1) and a chunk whose slots are all free goes
 * back to the pool for any class. Every slot is charged to an account (a session and its uid);
 * limits give -EDQUOT, an empty pool -ENOMEM.
 *
 * Thread safety: all functions may be called from any thread (one mutex; callers batch).
 *
 * The region is pool_region.c, the slab allocator pool.c (pool_int.h says what they share).
 */
#ifndef KVTD_POOL_H
#define KVTD_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#define KVTD_POOL_MAX_CLASSES 64

struct kvtd_config;
struct kvt_dev;

/* Bytes charged to one holder, with an optional limit (0 = none). Owned by the caller, updated
 * under the pool lock. */
struct kvtd_acct {
	uint64_t bytes;
	uint64_t limit;
};

/* The pool classes one holder's (a uid's) sequences use: a reference count per class, and how
 * many distinct classes it may use (0: no limit). Owned by the caller, updated under the pool
 * lock. */
struct kvtd_cls_use {
	uint32_t refs[KVTD_POOL_MAX_CLASSES];
	unsigned held; /* classes with refs > 0 */
	unsigned limit;
};

struct kvtd_pool_chunk;

struct kvtd_pool_class {
	uint32_t slot_size; /* 0: unused class */
	uint32_t slots_per_chunk;
	uint32_t refs;			 /* sequences using this class */
	struct kvtd_pool_chunk *partial; /* chunks with a free slot */
	uint64_t chunks;
};

struct kvtd_pool {
	pthread_mutex_t lock;
	uint8_t *base;
	uint64_t size;
	uint64_t chunk_size;
	uint32_t n_chunks;
	uint32_t free_chunks;
	struct kvtd_pool_chunk *chunks;	   /* metadata, private memory */
	struct kvtd_pool_chunk *free_list; /* unassigned chunks */
	struct kvtd_pool_class classes[KVTD_POOL_MAX_CLASSES];
	uint64_t used_bytes; /* slot bytes handed out */
	uint64_t refused_quota, refused_nomem;
	const char *backing; /* "hugetlb", "thp", "shmem" (4 KiB pages) or "cuda-host-alloc" */
	unsigned page_kib;   /* the page size rows sit on: huge for hugetlb and thp, else 4 */
	int numa_node;	     /* -1: not bound */
	int locked;
	struct kvt_dev *dev; /* registered with, NULL in unit tests */
	int dev_alloc;	     /* base came from kvt_dev_host_alloc(): the device layer frees it */
	int fd;		     /* the memfd behind base (a restart passes it on); -1 with dev_alloc */
	int hugetlb;	     /* fd is a MFD_HUGETLB memfd */
	uint8_t **claimed;   /* per chunk, between the first claim and kvtd_pool_claim_done() */
	/* Called, without the lock, before an allocation is refused -ENOMEM: frees what it can
	 * of memory held only as a cache (daemon/prefix.c); the allocation is retried once. */
	void (*reclaim)(void *ctx, uint64_t bytes);
	void *reclaim_ctx;
	/* Called, without the lock, before a class is refused -ENOSPC: lets go of one class held
	 * only as a cache (unreferenced prefix blocks of a namespace no one has open); returns 0
	 * when there was none. kvtd_pool_class_get() retries after each. Same ctx. */
	int (*reclaim_class)(void *ctx);
	/* Slots freed while a queued device copy may still read or write them: given back to
	 * their chunks once kvt_dev_fence_done() reaches the fence they were freed under. */
	struct kvtd_pool_quar *quar;
	uint32_t n_quar, cap_quar;
	uint64_t quar_bytes;
	pthread_t populate_tid; /* kvtd_pool_populate() */
	int populating;
	_Atomic int populate_stop;
};

/*
 * kvtd_pool_init() - map, bind, touch, lock and register the pool. What the host cannot back is
 * refused before the mapping is touched, with a message saying what to change.
 * Returns 0, -ENOMEM (size above MemAvailable without cfg->overcommit, too few free hugetlb
 * pages, mmap or populate failed), -EPERM (mlock refused or size above RLIMIT_MEMLOCK without
 * CAP_IPC_LOCK: raise LimitMEMLOCK or grant CAP_IPC_LOCK), -EINVAL (size not a multiple of the
 * chunk size, or of the huge page size with hugetlb), -EOPNOTSUPP (hugetlb without kernel
 * support), or a device error.
 */
int kvtd_pool_init(struct kvtd_pool *pool, const struct kvtd_config *cfg, struct kvt_dev *dev);
void kvtd_pool_fini(struct kvtd_pool *pool);

/*
 * kvtd_pool_adopt() - a restart: map the pool memfd @fd of @size bytes (chunks of @chunk_size,
 * MFD_HUGETLB when @hugetlb) that the previous process filled, instead of a new one. Its bytes
 * are kept; binding, locking and registration are done again as kvtd_pool_init() does. Every
 * chunk starts free: the slots still in use are declared with kvtd_pool_claim(), then
 * kvtd_pool_claim_done() rebuilds the free lists, before any kvtd_pool_alloc().
 * Returns 0, -EINVAL (@fd not a memfd of @size bytes, @size not a multiple of @chunk_size),
 * -ENOMEM, -EPERM, or a device error (as kvtd_pool_init()). @fd is owned by the pool on
 * success.
 */
int kvtd_pool_adopt(struct kvtd_pool *pool, const struct kvtd_config *cfg, struct kvt_dev *dev,
		    int fd, uint64_t size, uint64_t chunk_size, int hugetlb);

/*
 * kvtd_pool_claim() - mark the slot at byte offset @off of the pool as handed out in class @cls
 * (restore after a restart), charged to both accounts (@acct2 may be NULL; limits are not
 * checked: the slot was allowed before). Only before kvtd_pool_claim_done().
 * Returns 0 and the slot's address in @ret_slot, -EINVAL (offset outside the pool or not on a
 * slot boundary of @cls, or in a chunk already serving another class), -EEXIST (claimed twice),
 * -ENOMEM.
 */
int kvtd_pool_claim(struct kvtd_pool *pool, int cls, uint64_t off, struct kvtd_acct *acct,
		    struct kvtd_acct *acct2, void **ret_slot);
/* Builds the free lists of the chunks claims touched (unclaimed slots are free). */
void kvtd_pool_claim_done(struct kvtd_pool *pool);
/* After an adopt, once serving: map every page from a thread (joined by kvtd_pool_fini()). */
void kvtd_pool_populate(struct kvtd_pool *pool);

/*
 * kvtd_pool_class_get() - find or create the class of @slot_size bytes (rounded up to 64).
 * When every class is taken, the reclaim_class hook frees what it can first.
 * Returns the class index, -E2BIG (slot larger than a chunk), -ENOSPC (no free class).
 */
int kvtd_pool_class_get(struct kvtd_pool *pool, uint64_t slot_size);
void kvtd_pool_class_put(struct kvtd_pool *pool, int cls);
/*
 * kvtd_pool_class_get_for() - kvtd_pool_class_get(), the class counted in @use (NULL: none);
 * -EDQUOT when @use would hold more than use->limit distinct classes (nothing taken).
 * kvtd_pool_class_put_for() gives the reference back to the same @use.
 */
int kvtd_pool_class_get_for(struct kvtd_pool *pool, uint64_t slot_size, struct kvtd_cls_use *use);
void kvtd_pool_class_put_for(struct kvtd_pool *pool, int cls, struct kvtd_cls_use *use);
/* Counts (@add > 0) in @use, or takes out of it (@add < 0), classes @cls[0..n) the caller
 * already holds references to (kvtd_pool_class_get_for() with another @use, or none), past
 * use->limit too: a restored session's classes join its uid's. Pool references are unchanged;
 * a negative entry of @cls is skipped. */
void kvtd_pool_class_use(struct kvtd_pool *pool, const int *cls, unsigned n,
			 struct kvtd_cls_use *use, int add);
/* Classes in use in all (slot_size set), and of them @use's (NULL: 0), read under the lock. */
void kvtd_pool_class_count(struct kvtd_pool *pool, const struct kvtd_cls_use *use,
			   unsigned *ret_used, unsigned *ret_held);

/*
 * kvtd_pool_alloc() - @n slots of class @cls into @ret_slots, charged to both accounts (@acct2
 * may be NULL). All or nothing. Returns 0, -EDQUOT (an account's limit), -ENOMEM (pool empty).
 */
int kvtd_pool_alloc(struct kvtd_pool *pool, int cls, unsigned n, struct kvtd_acct *acct,
		    struct kvtd_acct *acct2, void **ret_slots);
/*
 * kvtd_pool_free() - returns @n slots of class @cls and uncharges the same accounts at once.
 * When the device layer still has copies queued (kvt_dev_fence() ahead of kvt_dev_fence_done())
 * the slots are quarantined, not handed out again until those copies have completed:
 * kvtd_pool_alloc() and kvtd_pool_reclaim_fenced() give them back, and an allocation that would
 * fail first waits for the oldest quarantined fence.
 */
void kvtd_pool_free(struct kvtd_pool *pool, int cls, unsigned n, struct kvtd_acct *acct,
		    struct kvtd_acct *acct2, void *const *slots);

/*
 * kvtd_pool_recharge() - move the charge of @n slots of class @cls from (@from, @from2) to
 * (@to, @to2), any of them NULL; the slots stay where they are. Returns 0 or -EDQUOT (a limit
 * of @to or @to2: nothing moved).
 */
int kvtd_pool_recharge(struct kvtd_pool *pool, int cls, unsigned n, struct kvtd_acct *from,
		       struct kvtd_acct *from2, struct kvtd_acct *to, struct kvtd_acct *to2);

/* Gives back the quarantined slots whose copies have completed (never blocks); how many. */
unsigned kvtd_pool_reclaim_fenced(struct kvtd_pool *pool);

/* Slot bytes a class hands out per slot (after rounding). */
uint64_t kvtd_pool_slot_size(const struct kvtd_pool *pool, int cls);

/* @acct as it stands, read under the pool lock (other threads charge a uid's account). */
struct kvtd_acct kvtd_pool_acct_read(struct kvtd_pool *pool, const struct kvtd_acct *acct);

struct kvtd_pool_usage {
	uint64_t size, used, free_bytes, chunks_free, chunks, classes;
	uint64_t refused_quota, refused_nomem;
};
void kvtd_pool_usage(struct kvtd_pool *pool, struct kvtd_pool_usage *ret);

#endif
