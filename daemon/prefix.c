/* SPDX-License-Identifier: MIT */
/*
 * prefix.c - the prefix block store (prefix.h): namespaces, a keyed hash table of blocks, their
 * references and the LRU of unreferenced ones, and the budget they live under.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "config.h"
#include "prefix.h"

#define TAB_INIT    1024
#define NS_TAB_INIT 64

static uint64_t
blk_hash(const struct kvtd_prefix *px, const struct kvtd_pns *ns, const struct kvt_block_key *k)
{
	return XXH3_64bits_withSeed(k, sizeof(*k), px->seed ^ ((uint64_t)ns->id << 32));
}

static bool
key_eq(const struct kvt_block_key *a, const struct kvt_block_key *b)
{
	return a->lo == b->lo && a->hi == b->hi;
}

static uint64_t
blk_bytes(const struct kvtd_prefix *px, const struct kvtd_pns *ns)
{
	return (uint64_t)ns->p.block_tokens * kvtd_pool_slot_size(px->pool, ns->cls);
}

/* ---- LRU (unreferenced blocks, oldest at the head) ---------------------------------------- */

static void
lru_push(struct kvtd_prefix *px, struct kvtd_pblock *b)
{
	struct kvtd_pscope *sc = b->ns->sc;

	b->slru_next = NULL;
	b->slru_prev = sc->lru_tail;
	if (sc->lru_tail)
		sc->lru_tail->slru_next = b;
	else
		sc->lru_head = b;
	sc->lru_tail = b;
	b->lru_next = NULL;
	b->lru_prev = px->lru_tail;
	if (px->lru_tail)
		px->lru_tail->lru_next = b;
	else
		px->lru_head = b;
	px->lru_tail = b;
}

static void
lru_unlink(struct kvtd_prefix *px, struct kvtd_pblock *b)
{
	struct kvtd_pscope *sc = b->ns->sc;

	if (b->slru_prev)
		b->slru_prev->slru_next = b->slru_next;
	else
		sc->lru_head = b->slru_next;
	if (b->slru_next)
		b->slru_next->slru_prev = b->slru_prev;
	else
		sc->lru_tail = b->slru_prev;
	b->slru_prev = b->slru_next = NULL;
	if (b->lru_prev)
		b->lru_prev->lru_next = b->lru_next;
	else
		px->lru_head = b->lru_next;
	if (b->lru_next)
		b->lru_next->lru_prev = b->lru_prev;
	else
		px->lru_tail = b->lru_prev;
	b->lru_prev = b->lru_next = NULL;
}

/* ---- references --------------------------------------------------------------------------- */

static void
ref_locked(struct kvtd_prefix *px, struct kvtd_pblock *b, uint64_t count)
{
	if (!b->refs) {
		lru_unlink(px, b);
		px->n_referenced++;
		b->ns->referenced++;
	}
	b->refs += count;
}

static void
put_locked(struct kvtd_prefix *px, struct kvtd_pblock *b)
{
	if (--b->refs)
		return;
	px->n_referenced--;
	b->ns->referenced--;
	lru_push(px, b);
}

void
kvtd_prefix_ref(struct kvtd_prefix *px, struct kvtd_pblock *b, uint64_t count)
{
	pthread_mutex_lock(&px->lock);
	ref_locked(px, b, count);
	pthread_mutex_unlock(&px->lock);
}

void
kvtd_prefix_put(struct kvtd_prefix *px, struct kvtd_pblock *const *blks, unsigned n)
{
	if (!n)
		return;
	pthread_mutex_lock(&px->lock);
	for (unsigned i = 0; i < n; i++)
		put_locked(px, blks[i]);
	pthread_mutex_unlock(&px->lock);
}

/* ---- namespaces --------------------------------------------------------------------------- */

int
kvtd_prefix_ns_check(const struct kvt_ns_params *np, const char **ret_why)
{
	size_t len = strnlen(np->name, sizeof(np->name));

	*ret_why = NULL;
	if (np->size < sizeof(*np))
		*ret_why = "size is smaller than struct kvt_ns_params";
	else if (np->reserved0 || np->flags || np->reserved[0] || np->reserved[1] ||
		 np->reserved[2])
		*ret_why = "flags and reserved fields must be 0";
	else if (!np->layers || np->layers > KVT_MAX_LAYERS)
		*ret_why = "layers must be 1..256";
	else if (!np->kv_heads || np->kv_heads > KVT_MAX_KV_HEADS)
		*ret_why = "kv_heads must be 1..64";
	else if (!np->head_dim || np->head_dim > KVT_MAX_HEAD_DIM)
		*ret_why = "head_dim must be 1..256";
	else if (np->dtype >= KVT_DTYPE__COUNT)
		*ret_why = "dtype is not a KVT_DTYPE_*";
	else if (np->block_tokens > KVT_BLOCK_TOKENS_MAX)
		*ret_why = "block_tokens must be 0 (the default 16) or 1..1024";
	else if (!len || len == sizeof(np->name))
		*ret_why = "name must be 1..63 characters, NUL-terminated";
	for (size_t i = 0; !*ret_why && i < len; i++)
		if (np->name[i] < 0x20 || np->name[i] > 0x7e)
			*ret_why = "name must be printable ASCII";
	return *ret_why ? -EINVAL : 0;
}

/* @np checked: a copy with the defaults filled in and the bytes past the name zeroed, so that
 * namespaces compare with memcmp. */
static void
ns_norm(const struct kvt_ns_params *np, struct kvt_ns_params *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->size = sizeof(*ret);
	ret->layers = np->layers;
	ret->kv_heads = np->kv_heads;
	ret->head_dim = np->head_dim;
	ret->dtype = np->dtype;
	ret->block_tokens = np->block_tokens ? np->block_tokens : KVT_BLOCK_TOKENS_DEFAULT;
	memcpy(ret->name, np->name, strnlen(np->name, sizeof(np->name)));
}

static uint64_t
ns_hash(const struct kvtd_prefix *px, uint64_t scope, const struct kvt_ns_params *norm)
{
	return XXH3_64bits_withSeed(norm, sizeof(*norm), px->seed ^ scope);
}

static uint64_t
id_hash(const struct kvtd_prefix *px, uint32_t id)
{
	return XXH3_64bits_withSeed(&id, sizeof(id), px->seed);
}

static uint64_t
sc_hash(const struct kvtd_prefix *px, uint64_t scope)
{
	return XXH3_64bits_withSeed(&scope, sizeof(scope), ~px->seed);
}

/* Both namespace tables doubled when namespaces outnumber buckets; a failed grow keeps them. */
static void
ns_tab_grow(struct kvtd_prefix *px)
{
	uint64_t n = (px->ns_mask + 1) * 2;
	struct kvtd_pns **t, **it;

	if (px->n_ns <= px->ns_mask + 1)
		return;
	t = calloc(n, sizeof(*t));
	it = calloc(n, sizeof(*it));
	if (!t || !it) {
		free(t);
		free(it);
		return;
	}
	for (struct kvtd_pns *ns = px->ns_list; ns; ns = ns->next) {
		uint64_t h = ns_hash(px, ns->scope, &ns->p) & (n - 1);
		uint64_t hi = id_hash(px, ns->id) & (n - 1);

		ns->hnext = t[h];
		t[h] = ns;
		ns->inext = it[hi];
		it[hi] = ns;
	}
	free(px->ns_tab);
	free(px->id_tab);
	px->ns_tab = t;
	px->id_tab = it;
	px->ns_mask = n - 1;
}

static void
sc_tab_grow(struct kvtd_prefix *px)
{
	uint64_t n = (px->sc_mask + 1) * 2;
	struct kvtd_pscope **t;

	if (px->n_sc <= px->sc_mask + 1)
		return;
	t = calloc(n, sizeof(*t));
	if (!t)
		return;
	for (uint64_t i = 0; i <= px->sc_mask; i++)
		for (struct kvtd_pscope *sc = px->sc_tab[i], *next; sc; sc = next) {
			uint64_t h = sc_hash(px, sc->scope) & (n - 1);

			next = sc->hnext;
			sc->hnext = t[h];
			t[h] = sc;
		}
	free(px->sc_tab);
	px->sc_tab = t;
	px->sc_mask = n - 1;
}

/* The share of @scope, created empty if new (NULL: out of memory). */
static struct kvtd_pscope *
sc_get(struct kvtd_prefix *px, uint64_t scope)
{
	struct kvtd_pscope **pp = &px->sc_tab[sc_hash(px, scope) & px->sc_mask], *sc;

	for (sc = *pp; sc; sc = sc->hnext)
		if (sc->scope == scope)
			return sc;
	sc = calloc(1, sizeof(*sc));
	if (!sc)
		return NULL;
	sc->scope = scope;
	sc->hnext = *pp;
	*pp = sc;
	px->n_sc++;
	sc_tab_grow(px);
	return sc;
}

static void
sc_maybe_free(struct kvtd_prefix *px, struct kvtd_pscope *sc)
{
	struct kvtd_pscope **pp = &px->sc_tab[sc_hash(px, sc->scope) & px->sc_mask];

	if (sc->n_ns)
		return;
	while (*pp != sc)
		pp = &(*pp)->hnext;
	*pp = sc->hnext;
	px->n_sc--;
	free(sc);
}

/* Out of the list and both tables, the class and the scope's count given back, freed. */
static void
ns_free(struct kvtd_prefix *px, struct kvtd_pns *ns)
{
	struct kvtd_pns **pp = &px->ns_tab[ns_hash(px, ns->scope, &ns->p) & px->ns_mask];

	while (*pp != ns)
		pp = &(*pp)->hnext;
	*pp = ns->hnext;
	for (pp = &px->id_tab[id_hash(px, ns->id) & px->ns_mask]; *pp != ns; pp = &(*pp)->inext)
		;
	*pp = ns->inext;
	if (ns->prev)
		ns->prev->next = ns->next;
	else
		px->ns_list = ns->next;
	if (ns->next)
		ns->next->prev = ns->prev;
	else
		px->ns_tail = ns->prev;
	px->n_ns--;
	ns->sc->n_ns--;
	sc_maybe_free(px, ns->sc);
	kvtd_pool_class_put(px->pool, ns->cls);
	free(ns);
}

static void
ns_maybe_free(struct kvtd_prefix *px, struct kvtd_pns *ns)
{
	if (!ns->handles && !ns->blocks)
		ns_free(px, ns);
}

static struct kvtd_pns *
ns_find(struct kvtd_prefix *px, uint64_t scope, const struct kvt_ns_params *norm)
{
	struct kvtd_pns *ns = px->ns_tab[ns_hash(px, scope, norm) & px->ns_mask];

	for (; ns; ns = ns->hnext)
		if (ns->scope == scope && !memcmp(&ns->p, norm, sizeof(*norm)))
			return ns;
	return NULL;
}

struct kvtd_pns *
kvtd_prefix_ns_by_id(struct kvtd_prefix *px, uint32_t id)
{
	struct kvtd_pns *ns = px->id_tab[id_hash(px, id) & px->ns_mask];

	for (; ns; ns = ns->inext)
		if (ns->id == id)
			return ns;
	return NULL;
}

/* A new namespace @norm of @scope with id @id, no handle; @limit: the scope's limit applies.
 * Lock held. */
static int
ns_create(struct kvtd_prefix *px, const struct kvt_ns_params *norm, uint64_t scope, uint32_t id,
	  bool limit, struct kvtd_pns **ret_ns)
{
	uint64_t tb = (uint64_t)norm->layers * 2 * norm->kv_heads * norm->head_dim *
		      kvt_dtype_size(norm->dtype);
	struct kvtd_pscope *sc;
	struct kvtd_pns *ns;
	uint64_t h;
	int cls;

	if (px->n_ns >= KVTD_PREFIX_MAX_NS)
		return -EDQUOT;
	sc = sc_get(px, scope);
	if (!sc)
		return -ENOMEM;
	if (limit && px->ns_per_scope && sc->n_ns >= px->ns_per_scope) {
		sc_maybe_free(px, sc);
		return -EDQUOT;
	}
	cls = kvtd_pool_class_get(px->pool, tb);
	if (cls < 0) {
		sc_maybe_free(px, sc);
		return cls == -E2BIG ? -ENOSPC : cls;
	}
	ns = calloc(1, sizeof(*ns));
	if (!ns) {
		kvtd_pool_class_put(px->pool, cls);
		sc_maybe_free(px, sc);
		return -ENOMEM;
	}
	ns->scope = scope;
	ns->sc = sc;
	ns->p = *norm;
	ns->token_bytes = tb;
	ns->cls = cls;
	ns->id = id;
	h = ns_hash(px, scope, norm) & px->ns_mask;
	ns->hnext = px->ns_tab[h];
	px->ns_tab[h] = ns;
	h = id_hash(px, id) & px->ns_mask;
	ns->inext = px->id_tab[h];
	px->id_tab[h] = ns;
	ns->prev = px->ns_tail;
	if (px->ns_tail)
		px->ns_tail->next = ns;
	else
		px->ns_list = ns;
	px->ns_tail = ns;
	px->n_ns++;
	sc->n_ns++;
	ns_tab_grow(px);
	*ret_ns = ns;
	return 0;
}

int
kvtd_prefix_ns_open(struct kvtd_prefix *px, const struct kvt_ns_params *np, uint64_t scope,
		    struct kvtd_pns **ret_ns)
{
	struct kvt_ns_params norm;
	struct kvtd_pns *ns;
	int r;

	ns_norm(np, &norm);
	pthread_mutex_lock(&px->lock);
	ns = ns_find(px, scope, &norm);
	if (!ns) {
		/* an id no namespace holds: after 2^32 openings ids wrap past restored ones */
		do
			px->next_ns_id++;
		while (!px->next_ns_id || kvtd_prefix_ns_by_id(px, px->next_ns_id));
		r = ns_create(px, &norm, scope, px->next_ns_id, true, &ns);
		if (r < 0) {
			pthread_mutex_unlock(&px->lock);
			return r;
		}
	}
	ns->handles++;
	pthread_mutex_unlock(&px->lock);
	*ret_ns = ns;
	return 0;
}

void
kvtd_prefix_ns_hold(struct kvtd_prefix *px, struct kvtd_pns *ns)
{
	pthread_mutex_lock(&px->lock);
	ns->handles++;
	pthread_mutex_unlock(&px->lock);
}

void
kvtd_prefix_ns_close(struct kvtd_prefix *px, struct kvtd_pns *ns)
{
	pthread_mutex_lock(&px->lock);
	ns->handles--;
	ns_maybe_free(px, ns);
	pthread_mutex_unlock(&px->lock);
}

/* ---- the table ---------------------------------------------------------------------------- */

static struct kvtd_pblock *
find(struct kvtd_prefix *px, struct kvtd_pns *ns, const struct kvt_block_key *k)
{
	struct kvtd_pblock *b = px->tab[blk_hash(px, ns, k) & px->tab_mask];

	for (; b; b = b->hnext)
		if (b->ns == ns && key_eq(&b->key, k))
			return b;
	return NULL;
}

/* Doubles the table when blocks outnumber buckets; a failed grow keeps the old one. */
static void
maybe_grow(struct kvtd_prefix *px)
{
	uint64_t n = (px->tab_mask + 1) * 2;
	struct kvtd_pblock **t;

	if (px->n_blocks <= px->tab_mask + 1)
		return;
	t = calloc(n, sizeof(*t));
	if (!t)
		return;
	for (uint64_t i = 0; i <= px->tab_mask; i++)
		for (struct kvtd_pblock *b = px->tab[i], *next; b; b = next) {
			uint64_t h = blk_hash(px, b->ns, &b->key) & (n - 1);

			next = b->hnext;
			b->hnext = t[h];
			t[h] = b;
		}
	free(px->tab);
	px->tab = t;
	px->tab_mask = n - 1;
}

static void
evict(struct kvtd_prefix *px, struct kvtd_pblock *b)
{
	struct kvtd_pns *ns = b->ns;
	struct kvtd_pblock **pp = &px->tab[blk_hash(px, ns, &b->key) & px->tab_mask];

	while (*pp != b)
		pp = &(*pp)->hnext;
	*pp = b->hnext;
	lru_unlink(px, b);
	kvtd_pool_free(px->pool, ns->cls, ns->p.block_tokens, &px->acct, NULL, b->slot);
	ns->sc->bytes -= blk_bytes(px, ns);
	px->n_blocks--;
	px->evicted++;
	ns->blocks--;
	ns->evicted++;
	free(b);
	ns_maybe_free(px, ns);
}

static uint64_t
reclaim_locked(struct kvtd_prefix *px, uint64_t bytes)
{
	uint64_t freed = 0;

	while (freed < bytes && px->lru_head) {
		struct kvtd_pblock *b = px->lru_head;

		freed += blk_bytes(px, b->ns);
		evict(px, b);
	}
	return freed;
}

uint64_t
kvtd_prefix_reclaim(struct kvtd_prefix *px, uint64_t bytes)
{
	uint64_t freed;

	pthread_mutex_lock(&px->lock);
	freed = reclaim_locked(px, bytes);
	pthread_mutex_unlock(&px->lock);
	return freed;
}

static void
pool_reclaim(void *ctx, uint64_t bytes)
{
	kvtd_prefix_reclaim(ctx, bytes);
}

/*
 * pool.h's reclaim_class hook: under class pressure, the namespace no session has open and none
 * of whose blocks is referenced that holds the least recently used block loses its blocks; it
 * then goes, and its pool class with it unless something else uses that size. Returns 1 when
 * one went, 0 when no namespace was held only as a cache. The store's lock is recursive: NS_OPEN
 * takes a class while holding it.
 */
static int
pool_reclaim_class(void *ctx)
{
	struct kvtd_prefix *px = ctx;
	struct kvtd_pns *ns = NULL;

	pthread_mutex_lock(&px->lock);
	for (struct kvtd_pblock *b = px->lru_head; b && !ns; b = b->lru_next)
		if (!b->ns->handles && !b->ns->referenced)
			ns = b->ns;
	if (ns) {
		uint64_t left = ns->blocks; /* all on the LRU: none is referenced */

		for (struct kvtd_pblock *b = px->lru_head, *next; b && left; b = next) {
			next = b->lru_next;
			if (b->ns == ns) {
				left--;
				evict(px, b); /* the last one frees ns */
			}
		}
	}
	pthread_mutex_unlock(&px->lock);
	return ns != NULL;
}

/* The keys a lookup examines: a chain of keys names each block once, so a match longer than
 * the namespace's blocks repeats one (a client's trick to pin one block without end); and the
 * poller's turn is bounded whatever the key count. Lock held. */
static uint32_t
lookup_bound(const struct kvtd_pns *ns, uint32_t n)
{
	if (n > KVTD_PREFIX_LOOKUP_MAX)
		n = KVTD_PREFIX_LOOKUP_MAX;
	return n > ns->blocks ? (uint32_t)ns->blocks : n;
}

uint32_t
kvtd_prefix_match(struct kvtd_prefix *px, struct kvtd_pns *ns, const struct kvt_block_key *keys,
		  uint32_t n)
{
	uint32_t i;

	pthread_mutex_lock(&px->lock);
	n = lookup_bound(ns, n);
	for (i = 0; i < n; i++) {
		struct kvt_block_key k;

		memcpy(&k, &keys[i], sizeof(k));
		if (!find(px, ns, &k))
			break;
	}
	pthread_mutex_unlock(&px->lock);
	return i;
}

uint32_t
kvtd_prefix_lookup(struct kvtd_prefix *px, struct kvtd_pns *ns, const struct kvt_block_key *keys,
		   uint32_t n, struct kvtd_pblock **pins, uint32_t cap)
{
	uint32_t i, lim;

	pthread_mutex_lock(&px->lock);
	lim = lookup_bound(ns, n);
	for (i = 0; i < lim; i++) {
		struct kvt_block_key k;
		struct kvtd_pblock *b;

		memcpy(&k, &keys[i], sizeof(k));
		b = find(px, ns, &k);
		if (!b)
			break;
		if (pins && i < cap) {
			ref_locked(px, b, 1);
			pins[i] = b;
		} else if (!b->refs) {
			lru_unlink(px, b); /* a hit is a use: to the young end */
			lru_push(px, b);
		}
	}
	px->lookups++;
	px->hit_blocks += i;
	px->miss_blocks += n - i;
	ns->lookups++;
	ns->hit_blocks += i;
	ns->miss_blocks += n - i;
	pthread_mutex_unlock(&px->lock);
	return pins && i > cap ? cap : i;
}

int
kvtd_prefix_publish(struct kvtd_prefix *px, struct kvtd_pns *ns, const struct kvt_block_key *key,
		    void *const *slots, struct kvtd_acct *from, struct kvtd_acct *from2,
		    struct kvtd_pblock **ret_blk)
{
	uint32_t bt = ns->p.block_tokens;
	struct kvt_block_key k;
	struct kvtd_pblock *b;
	uint64_t h;
	int r;

	memcpy(&k, key, sizeof(k));
	pthread_mutex_lock(&px->lock);
	b = find(px, ns, &k);
	if (b) {
		ref_locked(px, b, bt);
		px->deduped++;
		ns->deduped++;
		pthread_mutex_unlock(&px->lock);
		*ret_blk = b;
		return 0;
	}
	b = malloc(sizeof(*b) + bt * sizeof(void *));
	if (!b) {
		pthread_mutex_unlock(&px->lock);
		return -ENOMEM;
	}
	/* Unreferenced blocks go before a refusal: the budget, and a scope's share of it, are
	 * for what is in use. The scope's own blocks make room in its share. */
	r = 0;
	while (px->bytes_per_scope && ns->sc->bytes + blk_bytes(px, ns) > px->bytes_per_scope) {
		if (!ns->sc->lru_head) {
			r = -EDQUOT;
			break;
		}
		evict(px, ns->sc->lru_head);
	}
	while (!r) {
		r = kvtd_pool_recharge(px->pool, ns->cls, bt, from, from2, &px->acct, NULL);
		if (r != -EDQUOT || !px->lru_head)
			break;
		evict(px, px->lru_head);
		r = 0;
	}
	if (r < 0) {
		px->refused_budget++;
		pthread_mutex_unlock(&px->lock);
		free(b);
		return -ENOSPC;
	}
	b->key = k;
	b->ns = ns;
	b->refs = bt;
	b->lru_prev = b->lru_next = NULL;
	b->slru_prev = b->slru_next = NULL;
	ns->sc->bytes += blk_bytes(px, ns);
	memcpy(b->slot, slots, bt * sizeof(void *));
	h = blk_hash(px, ns, &k) & px->tab_mask;
	b->hnext = px->tab[h];
	px->tab[h] = b;
	px->n_blocks++;
	px->n_referenced++;
	px->published++;
	ns->blocks++;
	ns->referenced++;
	ns->published++;
	maybe_grow(px);
	pthread_mutex_unlock(&px->lock);
	*ret_blk = b;
	return 1;
}

/* Frees every block and namespace, and the store; @give_back: the blocks' slots go back to the
 * pool (else they are forgotten: the pool is being made again). */
static void
store_free(struct kvtd_prefix *px, bool give_back)
{
	if (!px->tab)
		return;
	if (px->pool->reclaim_ctx == px) {
		px->pool->reclaim = NULL;
		px->pool->reclaim_class = NULL;
	}
	for (uint64_t i = 0; i <= px->tab_mask; i++)
		while (px->tab[i]) {
			struct kvtd_pblock *b = px->tab[i];

			if (!give_back) {
				px->tab[i] = b->hnext;
				free(b);
				continue;
			}
			if (b->refs) { /* unreachable once every sequence is gone */
				b->refs = 0;
				px->n_referenced--;
				b->ns->referenced--;
				lru_push(px, b);
			}
			evict(px, b);
		}
	while (px->ns_list)
		ns_free(px, px->ns_list);
	free(px->tab);
	free(px->ns_tab);
	free(px->id_tab);
	free(px->sc_tab);
	px->tab = NULL;
	pthread_mutex_destroy(&px->lock);
}

/* ---- restart ------------------------------------------------------------------------------ */

int
kvtd_prefix_restore_ns(struct kvtd_prefix *px, const struct kvt_ns_params *np, uint64_t scope,
		       uint32_t id, const uint64_t cnt[6], struct kvtd_pns **ret_ns)
{
	struct kvt_ns_params norm;
	struct kvtd_pns *ns;
	const char *why;
	int r;

	if (!id || kvtd_prefix_ns_check(np, &why) < 0 || kvtd_prefix_ns_by_id(px, id))
		return -EINVAL;
	ns_norm(np, &norm);
	if (ns_find(px, scope, &norm)) /* the same identity twice */
		return -EINVAL;
	r = ns_create(px, &norm, scope, id, false, &ns);
	if (r < 0)
		return r == -EDQUOT ? -EINVAL : r;
	if (id > px->next_ns_id)
		px->next_ns_id = id;
	ns->lookups = cnt[0];
	ns->hit_blocks = cnt[1];
	ns->miss_blocks = cnt[2];
	ns->published = cnt[3];
	ns->deduped = cnt[4];
	ns->evicted = cnt[5];
	*ret_ns = ns;
	return 0;
}

int
kvtd_prefix_restore_block(struct kvtd_prefix *px, struct kvtd_pns *ns,
			  const struct kvt_block_key *key, const uint64_t *off,
			  struct kvtd_pblock **ret_blk)
{
	uint32_t bt = ns->p.block_tokens;
	struct kvtd_pblock *b;
	uint64_t h;
	int r;

	if (find(px, ns, key))
		return -EINVAL;
	b = calloc(1, sizeof(*b) + bt * sizeof(void *));
	if (!b)
		return -ENOMEM;
	for (uint32_t t = 0; t < bt; t++) {
		r = kvtd_pool_claim(px->pool, ns->cls, off[t], &px->acct, NULL, &b->slot[t]);
		if (r < 0) {
			free(b); /* claimed slots stay claimed: the caller abandons the restore */
			return r;
		}
	}
	b->key = *key;
	b->ns = ns;
	h = blk_hash(px, ns, key) & px->tab_mask;
	b->hnext = px->tab[h];
	px->tab[h] = b;
	px->n_blocks++;
	ns->blocks++;
	ns->sc->bytes += blk_bytes(px, ns);
	lru_push(px, b);
	maybe_grow(px);
	*ret_blk = b;
	return 0;
}

void
kvtd_prefix_abandon(struct kvtd_prefix *px)
{
	store_free(px, false);
}

/* ---- the store ---------------------------------------------------------------------------- */

int
kvtd_prefix_init(struct kvtd_prefix *px, struct kvtd_pool *pool, uint64_t budget)
{
	memset(px, 0, sizeof(*px));
	px->tab = calloc(TAB_INIT, sizeof(*px->tab));
	px->ns_tab = calloc(NS_TAB_INIT, sizeof(*px->ns_tab));
	px->id_tab = calloc(NS_TAB_INIT, sizeof(*px->id_tab));
	px->sc_tab = calloc(NS_TAB_INIT, sizeof(*px->sc_tab));
	if (!px->tab || !px->ns_tab || !px->id_tab || !px->sc_tab) {
		free(px->tab);
		free(px->ns_tab);
		free(px->id_tab);
		free(px->sc_tab);
		px->tab = NULL;
		return -ENOMEM;
	}
	px->tab_mask = TAB_INIT - 1;
	px->ns_mask = px->sc_mask = NS_TAB_INIT - 1;
	px->pool = pool;
	/* A limit of 0 means "none" to the pool: a budget of 0 is kept as 1 byte, which no
	 * block fits. */
	px->acct.limit = budget ? budget : 1;
	if (getrandom(&px->seed, sizeof(px->seed), 0) != sizeof(px->seed))
		px->seed = (uint64_t)(uintptr_t)px ^ 0x9e3779b97f4a7c15ull;
	{
		pthread_mutexattr_t a;

		pthread_mutexattr_init(&a);
		pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE); /* pool_reclaim_class() */
		pthread_mutex_init(&px->lock, &a);
		pthread_mutexattr_destroy(&a);
	}
	pool->reclaim_ctx = px;
	pool->reclaim = pool_reclaim;
	pool->reclaim_class = pool_reclaim_class;
	return 0;
}

void
kvtd_prefix_limits(struct kvtd_prefix *px, uint32_t ns_per_scope, uint64_t bytes_per_scope)
{
	pthread_mutex_lock(&px->lock);
	px->ns_per_scope = ns_per_scope;
	px->bytes_per_scope = bytes_per_scope;
	pthread_mutex_unlock(&px->lock);
}

uint64_t
kvtd_prefix_scope(const struct kvtd_config *cfg, uid_t uid, const gid_t *gids, size_t n_gids)
{
	for (unsigned i = 0; i < cfg->n_prefix_share_uids; i++)
		if (cfg->prefix_share_uids[i] == uid)
			return 0;
	for (size_t i = 0; i < n_gids; i++)
		for (unsigned j = 0; j < cfg->n_prefix_share_gids; j++)
			if (cfg->prefix_share_gids[j] == gids[i])
				return 0;
	return (uint64_t)uid + 1;
}

void
kvtd_prefix_fini(struct kvtd_prefix *px)
{
	store_free(px, true);
}

void
kvtd_prefix_stats(struct kvtd_prefix *px, struct kvtd_prefix_stats *ret)
{
	pthread_mutex_lock(&px->lock);
	memset(ret, 0, sizeof(*ret));
	ret->namespaces = px->n_ns;
	ret->blocks = px->n_blocks;
	ret->referenced = px->n_referenced;
	ret->bytes = px->acct.bytes;
	ret->budget = px->acct.limit > 1 ? px->acct.limit : 0;
	ret->lookups = px->lookups;
	ret->hit_blocks = px->hit_blocks;
	ret->miss_blocks = px->miss_blocks;
	ret->published = px->published;
	ret->deduped = px->deduped;
	ret->evicted = px->evicted;
	ret->refused_budget = px->refused_budget;
	pthread_mutex_unlock(&px->lock);
}

void
kvtd_prefix_ns_each(struct kvtd_prefix *px, void (*fn)(const struct kvtd_pns *ns, void *arg),
		    void *arg)
{
	pthread_mutex_lock(&px->lock);
	for (struct kvtd_pns *ns = px->ns_list; ns; ns = ns->next)
		fn(ns, arg);
	pthread_mutex_unlock(&px->lock);
}
