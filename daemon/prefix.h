/* SPDX-License-Identifier: MIT */
/*
 * prefix.h - the prefix block store: content-addressed blocks of T1 pool rows that sequences of
 * any session share (docs/prefix.md).
 *
 * A namespace (struct kvtd_pns) is one model's rows in one scope: the same name, geometry,
 * dtype and block size, and the same uid (or the shared scope of prefix_share_uids/gids). A
 * block (struct kvtd_pblock) holds the T1 pool slots of block_tokens consecutive tokens under a
 * 128-bit key that names the whole prefix up to it; the client chains the keys
 * (kvt_block_keys()), the store only matches them.
 *
 * References: every sequence position whose slot is a block's, and every pin a LOOKUP holds,
 * is one reference. A block with none stays cached, on an LRU, until the pool needs room
 * (pool.h's reclaim hook) or a PUBLISH needs budget. Block slots are charged to the store's
 * own account, whose limit is prefix_cache_bytes: a shared block costs no client's quota, and a
 * publisher that dies leaves nothing its readers need. Each scope (a uid, or the shared scope)
 * has a share of that budget (kvtd_prefix_limits(): pool_bytes_per_uid), so that publishing is
 * no way around a uid's quota.
 *
 * Locking: one mutex, taken inside a poller's lock and outside the pool's (it frees into the
 * pool); never held while calling kvtd_pool_alloc() (whose reclaim hook takes it).
 */
#ifndef KVTD_PREFIX_H
#define KVTD_PREFIX_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvt_abi.h"
#include "pool.h"

struct kvtd_config;
struct kvtd_pscope;

struct kvtd_pns {
	struct kvtd_pns *next, *prev; /* the store's list, in creation order */
	struct kvtd_pns *hnext;	      /* chain of the (scope, params) table */
	struct kvtd_pns *inext;	      /* chain of the id table */
	struct kvtd_pscope *sc;	      /* its scope's share */
	uint64_t scope;		      /* uid + 1, or 0: the shared scope */
	struct kvt_ns_params p;
	uint64_t token_bytes;	     /* one T1 slot: layers * 2 * kv_heads * head_dim * elem */
	int cls;		     /* their pool class */
	uint32_t id;		     /* for listings: stable while it lives */
	uint32_t img_idx;	     /* its index in a restart image (restart.c) */
	uint32_t handles;	     /* sessions' NS_OPENs on it */
	uint64_t blocks, referenced; /* held; of them with a reference */
	uint64_t lookups, hit_blocks, miss_blocks, published, deduped, evicted;
};

struct kvtd_pblock {
	struct kvt_block_key key;
	struct kvtd_pns *ns;
	struct kvtd_pblock *hnext;		   /* hash chain */
	struct kvtd_pblock *lru_prev, *lru_next;   /* on the LRU while refs == 0 */
	struct kvtd_pblock *slru_prev, *slru_next; /* and on its scope's LRU */
	uint64_t refs;
	uint32_t img_idx; /* its index in a restart image (restart.c) */
	void *slot[];	  /* ns->p.block_tokens T1 pool slots */
};

struct kvtd_prefix {
	pthread_mutex_t lock;
	struct kvtd_pool *pool;
	struct kvtd_acct acct; /* every block's slots; limit: prefix_cache_bytes */
	struct kvtd_pblock **tab;
	uint64_t tab_mask;
	uint64_t n_blocks, n_referenced;
	struct kvtd_pblock *lru_head, *lru_tail; /* unreferenced, least recently used first */
	struct kvtd_pns *ns_list, *ns_tail;	 /* oldest first */
	struct kvtd_pns **ns_tab, **id_tab;	 /* by (scope, params), by id */
	uint64_t ns_mask;			 /* both tables' */
	uint64_t n_ns;
	struct kvtd_pscope **sc_tab; /* scopes with a namespace */
	uint64_t sc_mask, n_sc;
	uint32_t ns_per_scope;	  /* 0: no limit (but KVTD_PREFIX_MAX_NS) */
	uint64_t bytes_per_scope; /* 0: no limit beyond the budget */
	uint32_t next_ns_id;
	uint64_t seed; /* keys come from clients: the table's hash is keyed */
	uint64_t lookups, hit_blocks, miss_blocks, published, deduped, evicted, refused_budget;
};

/* A scope's share of the store (a uid's, or the shared scope's). */
struct kvtd_pscope {
	struct kvtd_pscope *hnext;
	uint64_t scope;
	uint64_t n_ns;				 /* namespaces; the entry is freed at 0 */
	uint64_t bytes;				 /* slot bytes of its blocks, referenced or not */
	struct kvtd_pblock *lru_head, *lru_tail; /* its unreferenced blocks, oldest first */
};

/* The most namespaces the store holds at once: what a restart image carries (restart.c). */
#define KVTD_PREFIX_MAX_NS (1u << 20)
/* The most keys one LOOKUP examines: a poller's turn stays short whatever the key count. */
#define KVTD_PREFIX_LOOKUP_MAX 65536u

/* Totals, for SEQS-like listings and metrics. */
struct kvtd_prefix_stats {
	uint64_t namespaces, blocks, referenced, bytes, budget;
	uint64_t lookups, hit_blocks, miss_blocks, published, deduped, evicted, refused_budget;
};

/* @budget: prefix_cache_bytes (0: no sharing, every PUBLISH is -ENOSPC). Installs the pool's
 * reclaim hook. Returns 0 or -ENOMEM. */
int kvtd_prefix_init(struct kvtd_prefix *px, struct kvtd_pool *pool, uint64_t budget);
/*
 * kvtd_prefix_limits() - each scope (a uid, or the shared scope) may hold at most @ns_per_scope
 * namespaces (0: no limit but KVTD_PREFIX_MAX_NS) and @bytes_per_scope slot bytes of blocks
 * (0: no limit but the budget). Applies to NS_OPEN and PUBLISH from now on; what a scope holds
 * already stays.
 */
void kvtd_prefix_limits(struct kvtd_prefix *px, uint32_t ns_per_scope, uint64_t bytes_per_scope);
/* Frees every block; no sequence may reference one any more. */
void kvtd_prefix_fini(struct kvtd_prefix *px);

/*
 * kvtd_prefix_scope() - the scope a peer's sessions get at HELLO, and whose namespaces BLOCKS
 * shows it beside its uid's own: 0, the shared scope, when @uid is in prefix share_uids or one of
 * @gids (the peer's primary and supplementary groups, @n_gids of them) in prefix share_gids;
 * otherwise the uid's own, @uid + 1. The peer's credentials come from the socket, never from a
 * message, so there is nothing to refuse.
 */
uint64_t kvtd_prefix_scope(const struct kvtd_config *cfg, uid_t uid, const gid_t *gids,
			   size_t n_gids);

/* Checks NS_OPEN's payload (copied out of the arena); @ret_why: the reason on -EINVAL. */
int kvtd_prefix_ns_check(const struct kvt_ns_params *np, const char **ret_why);

/*
 * kvtd_prefix_ns_open() - the namespace of @np (checked) in @scope, created if new; one handle
 * more on it, in O(1). Returns 0, -ENOSPC (no pool class for its slot size), -EDQUOT (a new
 * namespace past its scope's limit, or past KVTD_PREFIX_MAX_NS in all), -ENOMEM.
 */
int kvtd_prefix_ns_open(struct kvtd_prefix *px, const struct kvt_ns_params *np, uint64_t scope,
			struct kvtd_pns **ret_ns);
/* One handle more on a namespace already open (a sequence in it holds one). */
void kvtd_prefix_ns_hold(struct kvtd_prefix *px, struct kvtd_pns *ns);
/* One handle less; a namespace with no handle and no block is freed. */
void kvtd_prefix_ns_close(struct kvtd_prefix *px, struct kvtd_pns *ns);

/*
 * kvtd_prefix_lookup() - how many of @keys, in order, @ns holds (@keys may be shared memory:
 * each is read once). With @pins (room for @cap), one reference is taken on each of the first
 * @cap blocks matched, stored there, and their count returned instead. At most
 * KVTD_PREFIX_LOOKUP_MAX keys, and no more than @ns holds blocks, are examined (a longer
 * match of a key chain would repeat a block): the count never exceeds either.
 */
uint32_t kvtd_prefix_lookup(struct kvtd_prefix *px, struct kvtd_pns *ns,
			    const struct kvt_block_key *keys, uint32_t n, struct kvtd_pblock **pins,
			    uint32_t cap);

/* How many of @keys lead in @ns, as kvtd_prefix_lookup() counts them, but touching nothing
 * (no counter, no LRU order): to size a pinning lookup. */
uint32_t kvtd_prefix_match(struct kvtd_prefix *px, struct kvtd_pns *ns,
			   const struct kvt_block_key *keys, uint32_t n);

/* @count references more on @b (it must hold one already, e.g. a pin). */
void kvtd_prefix_ref(struct kvtd_prefix *px, struct kvtd_pblock *b, uint64_t count);
/* One reference less on each of @blks (repeats allowed). */
void kvtd_prefix_put(struct kvtd_prefix *px, struct kvtd_pblock *const *blks, unsigned n);

/*
 * kvtd_prefix_publish() - offer the block @key of @ns whose rows are @slots (block_tokens T1
 * slots of class ns->cls, charged to @from and @from2), with block_tokens references for the
 * publishing sequence's positions.
 * Returns 1: published, the block owns @slots and their charge moved to the store; 0: @ns
 * already holds @key, *@ret_blk has block_tokens references more and @slots are still the
 * caller's (to free, pointing its positions at (*ret_blk)->slot); -ENOSPC: the budget, or the
 * share of @ns's scope (kvtd_prefix_limits()), is full of referenced blocks (nothing changed);
 * -ENOMEM. Unreferenced blocks are evicted first: the scope's own for its share.
 */
int kvtd_prefix_publish(struct kvtd_prefix *px, struct kvtd_pns *ns,
			const struct kvt_block_key *key, void *const *slots, struct kvtd_acct *from,
			struct kvtd_acct *from2, struct kvtd_pblock **ret_blk);

/* Evicts unreferenced blocks, least recently used first, until @bytes are freed or none is
 * left. Returns the bytes freed. */
uint64_t kvtd_prefix_reclaim(struct kvtd_prefix *px, uint64_t bytes);

void kvtd_prefix_stats(struct kvtd_prefix *px, struct kvtd_prefix_stats *ret);

/* Calls @fn for each namespace, lock held (@fn must not call back into the store). */
void kvtd_prefix_ns_each(struct kvtd_prefix *px, void (*fn)(const struct kvtd_pns *ns, void *arg),
			 void *arg);

/*
 * Restart (restart.c), before kvtd_pool_claim_done(): kvtd_prefix_restore_ns() re-creates
 * namespace @np of @scope with id @id (O(1), scope limits not applied) and counters @cnt (lookups,
 * hit_blocks, miss_blocks, published, deduped, evicted) and no handle; kvtd_prefix_restore_block()
 * re-creates block
 * @key of @ns over the slots at pool offsets @off (block_tokens of them), claimed back for the
 * store, unreferenced until the sessions and sequences restored take their references.
 * Return 0, -EINVAL (a contradiction: bad params, a key twice), -EEXIST (a slot claimed
 * twice), -ENOMEM. kvtd_prefix_abandon(): a restore given up: forget every namespace and
 * block without giving a slot back (the pool is made again from scratch), as _fini() does
 * otherwise; kvtd_prefix_init() makes the store again.
 */
int kvtd_prefix_restore_ns(struct kvtd_prefix *px, const struct kvt_ns_params *np, uint64_t scope,
			   uint32_t id, const uint64_t cnt[6], struct kvtd_pns **ret_ns);
int kvtd_prefix_restore_block(struct kvtd_prefix *px, struct kvtd_pns *ns,
			      const struct kvt_block_key *key, const uint64_t *off,
			      struct kvtd_pblock **ret_blk);
void kvtd_prefix_abandon(struct kvtd_prefix *px);
/* The namespace of id @id, or NULL; O(1). Takes no lock: the store's lock held, or a restore
 * (nothing else runs). */
struct kvtd_pns *kvtd_prefix_ns_by_id(struct kvtd_prefix *px, uint32_t id);

#endif
