/* SPDX-License-Identifier: MIT */
/*
 * pool.c - the slab allocator inside the pool's region (pool_region.c maps it; pool_int.h):
 * chunks of pool->chunk_size bytes, each serving one size class while any of its slots is out,
 * slots handed out by a bump index and then from a free list threaded through the returned
 * slots themselves, and every slot charged to one or two accounts.
 *
 * Guarantees (all under pool->lock; the hooks and device waits run outside it):
 *   - kvtd_pool_alloc() and kvtd_pool_free() are O(1) per slot; an allocation is all or
 *     nothing, refused -EDQUOT (an account's limit, nothing charged) or -ENOMEM (no slot once
 *     the quarantine and the reclaim hook have given back what they can).
 *   - A chunk whose last slot comes back returns to the free list for any class, and a class
 *     with no chunk and no reference is free for another slot size.
 *   - A slot freed while a queued device copy may still read or write it is not handed out
 *     again before kvt_dev_fence_done() passes that copy's fence (the quarantine).
 *   - The metadata lives in private memory, outside the region; the free lists live in the free
 *     slots, so after a restart kvtd_pool_claim() and kvtd_pool_claim_done() rebuild them from
 *     the slots in use alone.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_dev.h"
#include "log.h"
#include "pool_int.h"

/* A slot freed under a fence (kvtd_pool_free()). */
struct kvtd_pool_quar {
	void *slot;
	int32_t cls;
	uint64_t fence;
};

struct kvtd_pool_chunk {
	struct kvtd_pool_chunk *next, *prev; /* free_list or its class's partial list */
	int32_t cls;			     /* -1: free chunk */
	uint32_t used;			     /* slots handed out */
	uint32_t bump;			     /* slots never handed out start here */
	uint32_t free_head;		     /* 1 + index of a returned slot, 0 = none */
};

static uint32_t
chunk_index(const struct kvtd_pool *pool, const void *p)
{
	return (uint32_t)(((const uint8_t *)p - pool->base) / pool->chunk_size);
}

static uint8_t *
chunk_base(const struct kvtd_pool *pool, const struct kvtd_pool_chunk *c)
{
	return pool->base + (uint64_t)(c - pool->chunks) * pool->chunk_size;
}

static void
list_del(struct kvtd_pool_chunk **head, struct kvtd_pool_chunk *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		*head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->next = c->prev = NULL;
}

static void
list_add(struct kvtd_pool_chunk **head, struct kvtd_pool_chunk *c)
{
	c->prev = NULL;
	c->next = *head;
	if (*head)
		(*head)->prev = c;
	*head = c;
}

int
pool_slab_init(struct kvtd_pool *pool)
{
	pool->chunks = calloc(pool->n_chunks, sizeof(*pool->chunks));
	if (!pool->chunks)
		return -ENOMEM;
	for (uint32_t i = pool->n_chunks; i-- > 0;) {
		pool->chunks[i].cls = -1;
		list_add(&pool->free_list, &pool->chunks[i]);
	}
	pool->free_chunks = pool->n_chunks;
	return 0;
}

void
pool_slab_fini(struct kvtd_pool *pool)
{
	if (pool->n_quar)
		kvt_dev_sync(pool->dev); /* the quarantine dies with the pool, after its copies */
	free(pool->quar);
	pool->quar = NULL;
	pool->n_quar = pool->cap_quar = 0;
	if (pool->claimed) {
		for (uint32_t i = 0; i < pool->n_chunks; i++)
			free(pool->claimed[i]);
		free(pool->claimed);
		pool->claimed = NULL;
	}
	free(pool->chunks);
	pool->chunks = NULL;
}

/* Finds or creates the class (locked); -ENOSPC when none is free. */
static int
class_find(struct kvtd_pool *pool, uint64_t slot_size)
{
	int free_cls = -1;

	for (int i = 0; i < KVTD_POOL_MAX_CLASSES; i++) {
		struct kvtd_pool_class *c = &pool->classes[i];

		if (c->slot_size == slot_size)
			return i;
		if (!c->refs && !c->chunks && free_cls < 0)
			free_cls = i;
	}
	if (free_cls >= 0) {
		struct kvtd_pool_class *c = &pool->classes[free_cls];

		c->slot_size = (uint32_t)slot_size;
		c->slots_per_chunk = (uint32_t)(pool->chunk_size / slot_size);
		c->refs = 0;
	}
	return free_cls >= 0 ? free_cls : -ENOSPC;
}

int
kvtd_pool_class_get_for(struct kvtd_pool *pool, uint64_t slot_size, struct kvtd_cls_use *use)
{
	int r;

	slot_size = (slot_size + 63) & ~63ull;
	if (!slot_size || slot_size > pool->chunk_size)
		return -E2BIG;
	pthread_mutex_lock(&pool->lock);
	for (;;) {
		r = class_find(pool, slot_size);
		if (r != -ENOSPC || !pool->reclaim_class)
			break;
		/* Classes held only by cached blocks give way. Outside the lock: the hook frees
		 * through this pool. */
		pthread_mutex_unlock(&pool->lock);
		if (!pool->reclaim_class(pool->reclaim_ctx)) {
			pthread_mutex_lock(&pool->lock);
			break;
		}
		pthread_mutex_lock(&pool->lock);
	}
	if (r >= 0 && use && !use->refs[r] && use->limit && use->held >= use->limit) {
		if (!pool->classes[r].refs && !pool->classes[r].chunks)
			pool->classes[r].slot_size = 0; /* created for this call alone */
		r = -EDQUOT;
	} else if (r >= 0) {
		pool->classes[r].refs++;
		if (use && !use->refs[r]++)
			use->held++;
	}
	pthread_mutex_unlock(&pool->lock);
	return r;
}

int
kvtd_pool_class_get(struct kvtd_pool *pool, uint64_t slot_size)
{
	return kvtd_pool_class_get_for(pool, slot_size, NULL);
}

void
kvtd_pool_class_put_for(struct kvtd_pool *pool, int cls, struct kvtd_cls_use *use)
{
	pthread_mutex_lock(&pool->lock);
	if (use && use->refs[cls] && !--use->refs[cls])
		use->held--;
	if (!--pool->classes[cls].refs && !pool->classes[cls].chunks)
		pool->classes[cls].slot_size = 0;
	pthread_mutex_unlock(&pool->lock);
}

void
kvtd_pool_class_put(struct kvtd_pool *pool, int cls)
{
	kvtd_pool_class_put_for(pool, cls, NULL);
}

void
kvtd_pool_class_use(struct kvtd_pool *pool, const int *cls, unsigned n, struct kvtd_cls_use *use,
		    int add)
{
	pthread_mutex_lock(&pool->lock);
	for (unsigned i = 0; i < n; i++) {
		int c = cls[i];

		if (c < 0 || c >= KVTD_POOL_MAX_CLASSES)
			continue;
		if (add > 0 && !use->refs[c]++)
			use->held++;
		else if (add < 0 && use->refs[c] && !--use->refs[c])
			use->held--;
	}
	pthread_mutex_unlock(&pool->lock);
}

void
kvtd_pool_class_count(struct kvtd_pool *pool, const struct kvtd_cls_use *use, unsigned *ret_used,
		      unsigned *ret_held)
{
	unsigned n = 0;

	pthread_mutex_lock(&pool->lock);
	for (int i = 0; i < KVTD_POOL_MAX_CLASSES; i++)
		n += pool->classes[i].slot_size != 0;
	*ret_used = n;
	*ret_held = use ? use->held : 0;
	pthread_mutex_unlock(&pool->lock);
}

uint64_t
kvtd_pool_slot_size(const struct kvtd_pool *pool, int cls)
{
	return pool->classes[cls].slot_size;
}

static void *
slot_take(struct kvtd_pool *pool, struct kvtd_pool_class *c, int cls)
{
	struct kvtd_pool_chunk *ch = c->partial;
	uint8_t *p;

	if (!ch) {
		ch = pool->free_list;
		if (!ch)
			return NULL;
		list_del(&pool->free_list, ch);
		pool->free_chunks--;
		ch->cls = cls;
		ch->used = ch->bump = ch->free_head = 0;
		c->chunks++;
		list_add(&c->partial, ch);
	}
	if (ch->free_head) {
		p = chunk_base(pool, ch) + (uint64_t)(ch->free_head - 1) * c->slot_size;
		memcpy(&ch->free_head, p, sizeof(uint32_t));
	} else {
		p = chunk_base(pool, ch) + (uint64_t)ch->bump++ * c->slot_size;
	}
	if (++ch->used == c->slots_per_chunk)
		list_del(&c->partial, ch);
	return p;
}

static void
slot_give(struct kvtd_pool *pool, struct kvtd_pool_class *c, void *p)
{
	struct kvtd_pool_chunk *ch = &pool->chunks[chunk_index(pool, p)];
	uint32_t idx = (uint32_t)(((uint8_t *)p - chunk_base(pool, ch)) / c->slot_size);

	if (ch->used-- == c->slots_per_chunk)
		list_add(&c->partial, ch);
	if (!ch->used) {
		/* Whole chunk free again: give it back for any class. */
		list_del(&c->partial, ch);
		ch->cls = -1;
		c->chunks--;
		list_add(&pool->free_list, ch);
		pool->free_chunks++;
		return;
	}
	memcpy(p, &ch->free_head, sizeof(uint32_t));
	ch->free_head = idx + 1;
}

/* Lock held: slots whose fence is <= @done go back to their chunks. */
static unsigned
quar_release(struct kvtd_pool *pool, uint64_t done)
{
	unsigned k = 0, n = 0;

	for (uint32_t i = 0; i < pool->n_quar; i++) {
		struct kvtd_pool_quar *q = &pool->quar[i];
		struct kvtd_pool_class *c = &pool->classes[q->cls];

		if (q->fence > done) {
			pool->quar[k++] = *q;
			continue;
		}
		slot_give(pool, c, q->slot);
		pool->used_bytes -= c->slot_size;
		pool->quar_bytes -= c->slot_size;
		if (!c->refs && !c->chunks)
			c->slot_size = 0;
		n++;
	}
	pool->n_quar = k;
	return n;
}

unsigned
kvtd_pool_reclaim_fenced(struct kvtd_pool *pool)
{
	uint64_t done;
	unsigned n;

	pthread_mutex_lock(&pool->lock);
	n = pool->n_quar;
	pthread_mutex_unlock(&pool->lock);
	if (!n || !pool->dev)
		return 0;
	done = kvt_dev_fence_done(pool->dev); /* outside the pool lock: it queries events */
	pthread_mutex_lock(&pool->lock);
	n = quar_release(pool, done);
	pthread_mutex_unlock(&pool->lock);
	return n;
}

/* Lock held on entry and exit (dropped while waiting): wait for the oldest quarantined fence and
 * give back what completed. 0 when something came back, else -ENOMEM. */
static int
quar_wait_oldest(struct kvtd_pool *pool)
{
	uint64_t f = UINT64_MAX;
	int r;

	for (uint32_t i = 0; i < pool->n_quar; i++)
		if (pool->quar[i].fence < f)
			f = pool->quar[i].fence;
	if (f == UINT64_MAX)
		return -ENOMEM;
	pthread_mutex_unlock(&pool->lock);
	r = kvt_dev_fence_wait(pool->dev, f);
	pthread_mutex_lock(&pool->lock);
	if (r < 0) {
		log_err("pool: waiting for device copies to free quarantined slots: %s",
			strerror(-r));
		return -ENOMEM;
	}
	return quar_release(pool, f) ? 0 : -ENOMEM;
}

static int
acct_fits(const struct kvtd_acct *a, uint64_t bytes)
{
	return !a || !a->limit || a->bytes + bytes <= a->limit;
}

int
kvtd_pool_alloc(struct kvtd_pool *pool, int cls, unsigned n, struct kvtd_acct *acct,
		struct kvtd_acct *acct2, void **ret_slots)
{
	struct kvtd_pool_class *c = &pool->classes[cls];
	uint64_t bytes = (uint64_t)n * c->slot_size;
	bool reclaimed = false;
	unsigned i;

	kvtd_pool_reclaim_fenced(pool);
	pthread_mutex_lock(&pool->lock);
again:
	if (!acct_fits(acct, bytes) || !acct_fits(acct2, bytes)) {
		pool->refused_quota++;
		pthread_mutex_unlock(&pool->lock);
		return -EDQUOT;
	}
	for (i = 0; i < n; i++) {
		ret_slots[i] = slot_take(pool, c, cls);
		if (!ret_slots[i])
			break;
	}
	if (i < n) {
		while (i-- > 0)
			slot_give(pool, c, ret_slots[i]);
		/* Slots waiting for device copies come back before anything is refused. */
		if (pool->n_quar && quar_wait_oldest(pool) == 0)
			goto again;
		/* Cached memory the pool can take back (unreferenced prefix blocks) goes before
		 * a refusal. Outside the lock: the reclaimer frees through this pool. */
		if (pool->reclaim && !reclaimed) {
			pthread_mutex_unlock(&pool->lock);
			pool->reclaim(pool->reclaim_ctx, bytes);
			reclaimed = true;
			pthread_mutex_lock(&pool->lock);
			goto again;
		}
		pool->refused_nomem++;
		pthread_mutex_unlock(&pool->lock);
		return -ENOMEM;
	}
	if (acct)
		acct->bytes += bytes;
	if (acct2)
		acct2->bytes += bytes;
	pool->used_bytes += bytes;
	pthread_mutex_unlock(&pool->lock);
	return 0;
}

void
kvtd_pool_free(struct kvtd_pool *pool, int cls, unsigned n, struct kvtd_acct *acct,
	       struct kvtd_acct *acct2, void *const *slots)
{
	struct kvtd_pool_class *c = &pool->classes[cls];
	uint64_t bytes = (uint64_t)n * c->slot_size, fence = 0;

	if (!n)
		return;
	/* A copy queued before this free may still read (FETCH) or write the slots. */
	if (pool->dev) {
		fence = kvt_dev_fence(pool->dev);
		if (fence && kvt_dev_fence_done(pool->dev) >= fence)
			fence = 0;
	}
	pthread_mutex_lock(&pool->lock);
	if (fence && pool->n_quar + n > pool->cap_quar) {
		uint32_t cap = pool->cap_quar ? pool->cap_quar : 1024;
		struct kvtd_pool_quar *q;

		while (cap < pool->n_quar + n)
			cap *= 2;
		q = realloc(pool->quar, cap * sizeof(*q));
		if (q) {
			pool->quar = q;
			pool->cap_quar = cap;
		} else {
			/* No room to remember them: wait for the copies instead. */
			pthread_mutex_unlock(&pool->lock);
			if (kvt_dev_fence_wait(pool->dev, fence) < 0)
				log_err("pool: freeing slots after a failed device copy");
			fence = 0;
			pthread_mutex_lock(&pool->lock);
		}
	}
	for (unsigned i = 0; i < n; i++) {
		if (fence)
			pool->quar[pool->n_quar++] = (struct kvtd_pool_quar){slots[i], cls, fence};
		else
			slot_give(pool, c, slots[i]);
	}
	if (acct)
		acct->bytes -= bytes;
	if (acct2)
		acct2->bytes -= bytes;
	if (fence)
		pool->quar_bytes += bytes;
	else
		pool->used_bytes -= bytes;
	if (!c->refs && !c->chunks)
		c->slot_size = 0;
	pthread_mutex_unlock(&pool->lock);
}

struct kvtd_acct
kvtd_pool_acct_read(struct kvtd_pool *pool, const struct kvtd_acct *acct)
{
	struct kvtd_acct a;

	pthread_mutex_lock(&pool->lock);
	a = *acct;
	pthread_mutex_unlock(&pool->lock);
	return a;
}

int
kvtd_pool_recharge(struct kvtd_pool *pool, int cls, unsigned n, struct kvtd_acct *from,
		   struct kvtd_acct *from2, struct kvtd_acct *to, struct kvtd_acct *to2)
{
	uint64_t bytes = (uint64_t)n * pool->classes[cls].slot_size;
	int r = 0;

	pthread_mutex_lock(&pool->lock);
	if (!acct_fits(to, bytes) || !acct_fits(to2, bytes)) {
		r = -EDQUOT;
	} else {
		if (from)
			from->bytes -= bytes;
		if (from2)
			from2->bytes -= bytes;
		if (to)
			to->bytes += bytes;
		if (to2)
			to2->bytes += bytes;
	}
	pthread_mutex_unlock(&pool->lock);
	return r;
}

void
kvtd_pool_usage(struct kvtd_pool *pool, struct kvtd_pool_usage *ret)
{
	kvtd_pool_reclaim_fenced(pool);
	pthread_mutex_lock(&pool->lock);
	ret->size = pool->size;
	ret->used = pool->used_bytes;
	ret->free_bytes = pool->size - pool->used_bytes;
	ret->chunks = pool->n_chunks;
	ret->chunks_free = pool->free_chunks;
	ret->refused_quota = pool->refused_quota;
	ret->refused_nomem = pool->refused_nomem;
	ret->classes = 0;
	for (int i = 0; i < KVTD_POOL_MAX_CLASSES; i++)
		ret->classes += pool->classes[i].slot_size != 0;
	pthread_mutex_unlock(&pool->lock);
}

int
kvtd_pool_claim(struct kvtd_pool *pool, int cls, uint64_t off, struct kvtd_acct *acct,
		struct kvtd_acct *acct2, void **ret_slot)
{
	struct kvtd_pool_class *c;
	struct kvtd_pool_chunk *ch;
	uint32_t ci, idx;
	uint8_t *bits;
	int r = 0;

	if (cls < 0 || cls >= KVTD_POOL_MAX_CLASSES || off >= pool->size)
		return -EINVAL;
	c = &pool->classes[cls];
	ci = (uint32_t)(off / pool->chunk_size);
	if (!c->slot_size || (off % pool->chunk_size) % c->slot_size)
		return -EINVAL;
	idx = (uint32_t)((off % pool->chunk_size) / c->slot_size);
	if (idx >= c->slots_per_chunk)
		return -EINVAL;
	pthread_mutex_lock(&pool->lock);
	if (!pool->claimed) {
		pool->claimed = calloc(pool->n_chunks, sizeof(*pool->claimed));
		if (!pool->claimed) {
			r = -ENOMEM;
			goto out;
		}
	}
	ch = &pool->chunks[ci];
	if (ch->cls >= 0 && ch->cls != cls) {
		r = -EINVAL;
		goto out;
	}
	if (!pool->claimed[ci]) {
		pool->claimed[ci] = calloc((c->slots_per_chunk + 7) / 8, 1);
		if (!pool->claimed[ci]) {
			r = -ENOMEM;
			goto out;
		}
	}
	bits = pool->claimed[ci];
	if (bits[idx / 8] & (1u << (idx % 8))) {
		r = -EEXIST;
		goto out;
	}
	if (ch->cls < 0) {
		list_del(&pool->free_list, ch);
		pool->free_chunks--;
		ch->cls = cls;
		ch->used = ch->bump = ch->free_head = 0;
		c->chunks++;
	}
	bits[idx / 8] |= (uint8_t)(1u << (idx % 8));
	ch->used++;
	if (idx >= ch->bump)
		ch->bump = idx + 1;
	if (acct)
		acct->bytes += c->slot_size;
	if (acct2)
		acct2->bytes += c->slot_size;
	pool->used_bytes += c->slot_size;
	*ret_slot = pool->base + off;
out:
	pthread_mutex_unlock(&pool->lock);
	return r;
}

void
kvtd_pool_claim_done(struct kvtd_pool *pool)
{
	pthread_mutex_lock(&pool->lock);
	for (uint32_t ci = 0; pool->claimed && ci < pool->n_chunks; ci++) {
		struct kvtd_pool_chunk *ch = &pool->chunks[ci];
		uint8_t *bits = pool->claimed[ci];
		struct kvtd_pool_class *c;

		if (!bits)
			continue;
		c = &pool->classes[ch->cls];
		/* The holes below the bump are free: chained through the slots themselves, lowest
		 * first, as slot_give() leaves them. */
		for (uint32_t idx = ch->bump; idx-- > 0;) {
			uint8_t *p;

			if (bits[idx / 8] & (1u << (idx % 8)))
				continue;
			p = chunk_base(pool, ch) + (uint64_t)idx * c->slot_size;
			memcpy(p, &ch->free_head, sizeof(uint32_t));
			ch->free_head = idx + 1;
		}
		if (ch->used < c->slots_per_chunk)
			list_add(&c->partial, ch);
		free(bits);
	}
	free(pool->claimed);
	pool->claimed = NULL;
	pthread_mutex_unlock(&pool->lock);
}
