/* SPDX-License-Identifier: MIT */
/*
 * check_prefix - the prefix block store (daemon/prefix.c) over a real pool: namespaces match
 * only on every identity field and scope, LOOKUP counts leading blocks and pins, PUBLISH moves
 * the charge to the store and deduplicates, the LRU frees only unreferenced blocks (for the
 * budget and for the pool's reclaim hook), and a random interleaving keeps the books exact.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kvt_test.h"
#include "pool.h"
#include "prefix.h"

#define BT 4 /* tokens per block in these tests */

static struct kvtd_pool P;
static struct kvtd_prefix X;

static void
setup(void)
{
	struct kvtd_config cfg;

	kvtd_config_defaults(&cfg);
	cfg.pool_size = 8ull << 20; /* 4 chunks of 2 MiB */
	cfg.lock = 0;
	cfg.numa_node = -1;
	ck_assert_int_eq(kvtd_pool_init(&P, &cfg, NULL), 0);
}

static void
teardown(void)
{
	struct kvtd_pool_usage u;

	kvtd_prefix_fini(&X);
	kvtd_pool_usage(&P, &u);
	ck_assert_uint_eq(u.used, 0); /* every block's slots went back */
	kvtd_pool_fini(&P);
}

/* 2 layers x 2 x 1 head x 64 f32 = 1 KiB a token. */
static struct kvt_ns_params
nsp(const char *name)
{
	struct kvt_ns_params p = {.size = sizeof(p),
				  .layers = 2,
				  .kv_heads = 1,
				  .head_dim = 64,
				  .dtype = KVT_DTYPE_F32,
				  .block_tokens = BT};

	strcpy(p.name, name);
	return p;
}

static struct kvt_block_key
key(uint64_t i)
{
	return (struct kvt_block_key){.lo = i * 0x9e3779b97f4a7c15ull, .hi = ~i};
}

/* BT slots of @ns's class charged to @a, each filled with @fill. */
static void
rows(struct kvtd_pns *ns, struct kvtd_acct *a, int fill, void **slots)
{
	ck_assert_int_eq(kvtd_pool_alloc(&P, ns->cls, BT, a, NULL, slots), 0);
	for (int i = 0; i < BT; i++)
		memset(slots[i], fill, ns->token_bytes);
}

static struct kvtd_pns *
open_ns(const char *name, uint64_t scope)
{
	struct kvt_ns_params p = nsp(name);
	struct kvtd_pns *ns;
	const char *why;

	ck_assert_int_eq(kvtd_prefix_ns_check(&p, &why), 0);
	ck_assert_int_eq(kvtd_prefix_ns_open(&X, &p, scope, &ns), 0);
	return ns;
}

/* Each case breaks one field; every one is refused with a reason. */
START_TEST(t_ns_check)
{
	const char *why;
	struct kvt_ns_params p = nsp("m");

	ck_assert_int_eq(kvtd_prefix_ns_check(&p, &why), 0);
	ck_assert_ptr_null(why);
	for (int c = 0; c < 12; c++) {
		p = nsp("m");
		switch (c) {
		case 0:
			p.size = 8;
			break;
		case 1:
			p.layers = 0;
			break;
		case 2:
			p.layers = KVT_MAX_LAYERS + 1;
			break;
		case 3:
			p.kv_heads = 0;
			break;
		case 4:
			p.head_dim = KVT_MAX_HEAD_DIM + 1;
			break;
		case 5:
			p.dtype = KVT_DTYPE__COUNT;
			break;
		case 6:
			p.block_tokens = KVT_BLOCK_TOKENS_MAX + 1;
			break;
		case 7:
			p.flags = 1;
			break;
		case 8:
			p.reserved[2] = 1;
			break;
		case 9:
			p.name[0] = '\0';
			break;
		case 10:
			memset(p.name, 'a', sizeof(p.name));
			break; /* no NUL */
		case 11:
			p.name[0] = '\n';
			break;
		}
		ck_assert_msg(kvtd_prefix_ns_check(&p, &why) == -EINVAL && why, "case %d", c);
	}
}
END_TEST

/* A namespace is the same only for the same name, geometry, dtype, block size and scope. */
START_TEST(t_ns_identity)
{
	struct kvt_ns_params p = nsp("llama"), q;
	struct kvtd_pns *a, *b, *c;
	struct kvtd_pblock *blk;
	struct kvt_block_key k = key(1);
	struct kvtd_acct acct = {0};
	void *s[BT];

	ck_assert_int_eq(kvtd_prefix_init(&X, &P, 1 << 20), 0);
	a = open_ns("llama", 1001);
	b = open_ns("llama", 1001);
	ck_assert_ptr_eq(a, b);
	ck_assert_uint_eq(a->handles, 2);
	rows(a, &acct, 7, s);
	ck_assert_int_eq(kvtd_prefix_publish(&X, a, &k, s, &acct, NULL, &blk), 1);
	for (int c2 = 0; c2 < 6; c2++) {
		q = p;
		uint64_t scope = 1001;
		switch (c2) {
		case 0:
			scope = 1002;
			break; /* another uid */
		case 1:
			scope = 0;
			break; /* the shared scope */
		case 2:
			strcpy(q.name, "llamb");
			break;
		case 3:
			q.head_dim = 128;
			break;
		case 4:
			q.dtype = KVT_DTYPE_F16;
			break;
		case 5:
			q.block_tokens = BT * 2;
			break;
		}
		ck_assert_int_eq(kvtd_prefix_ns_open(&X, &q, scope, &c), 0);
		ck_assert_ptr_ne(c, a);
		/* the same key never hits across namespaces */
		ck_assert_uint_eq(kvtd_prefix_lookup(&X, c, &k, 1, NULL, 0), 0);
		kvtd_prefix_ns_close(&X, c);
	}
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, a, &k, 1, NULL, 0), 1);
	/* block_tokens 0 is the default */
	q = p;
	q.block_tokens = 0;
	ck_assert_int_eq(kvtd_prefix_ns_open(&X, &q, 1001, &c), 0);
	ck_assert_uint_eq(c->p.block_tokens, KVT_BLOCK_TOKENS_DEFAULT);
	kvtd_prefix_ns_close(&X, c);
	kvtd_prefix_put(&X, (struct kvtd_pblock *[]){blk, blk, blk, blk}, BT);
	kvtd_prefix_ns_close(&X, a);
	kvtd_prefix_ns_close(&X, b);
	/* no handle, but a cached block: the namespace lives on for later sessions */
	ck_assert_ptr_nonnull(X.ns_list);
	ck_assert_uint_eq(X.n_blocks, 1);
}
END_TEST

/* PUBLISH references the rows (no copy), moves their charge to the store, deduplicates; LOOKUP
 * counts leading blocks only and pins. */
START_TEST(t_publish_lookup)
{
	struct kvtd_acct acct = {0};
	struct kvtd_pns *ns;
	struct kvtd_pblock *b[3], *pins[4], *d;
	struct kvt_block_key k[4] = {key(1), key(2), key(3), key(4)};
	void *s[3][BT], *dup[BT];
	uint64_t bb, before;

	ck_assert_int_eq(kvtd_prefix_init(&X, &P, 1 << 20), 0);
	ns = open_ns("m", 5);
	bb = BT * kvtd_pool_slot_size(&P, ns->cls);
	for (int i = 0; i < 3; i++) {
		rows(ns, &acct, 10 + i, s[i]);
		ck_assert_int_eq(kvtd_prefix_publish(&X, ns, &k[i], s[i], &acct, NULL, &b[i]), 1);
		ck_assert_ptr_eq(b[i]->slot[0], s[i][0]); /* referenced, not copied */
		ck_assert_uint_eq(b[i]->refs, BT);
	}
	ck_assert_uint_eq(acct.bytes, 0);
	ck_assert_uint_eq(X.acct.bytes, 3 * bb);
	/* leading blocks only: a gap stops the count */
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, ns, k, 4, NULL, 0), 3);
	ck_assert_uint_eq(
	    kvtd_prefix_lookup(&X, ns, (struct kvt_block_key[]){k[0], k[3], k[1]}, 3, NULL, 0), 1);
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, ns, &k[3], 1, NULL, 0), 0);
	/* pins only as many as there is room for, the hits counted all the same */
	before = X.hit_blocks;
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, ns, k, 4, pins, 2), 2);
	ck_assert_uint_eq(X.hit_blocks, before + 3);
	ck_assert_uint_eq(b[2]->refs, BT);
	kvtd_prefix_put(&X, pins, 2);
	ck_assert_uint_eq(kvtd_prefix_match(&X, ns, k, 4), 3);
	ck_assert_uint_eq(X.hit_blocks, before + 3); /* a match counts nothing */
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, ns, k, 4, pins, 4), 3);
	for (int i = 0; i < 3; i++) {
		ck_assert_ptr_eq(pins[i], b[i]);
		ck_assert_uint_eq(b[i]->refs, BT + 1);
	}
	/* the same key again: the existing block, the caller keeps (and frees) its rows */
	rows(ns, &acct, 99, dup);
	ck_assert_int_eq(kvtd_prefix_publish(&X, ns, &k[0], dup, &acct, NULL, &d), 0);
	ck_assert_ptr_eq(d, b[0]);
	ck_assert_uint_eq(b[0]->refs, 2 * BT + 1);
	ck_assert_uint_eq(((uint8_t *)b[0]->slot[0])[0], 10);
	kvtd_pool_free(&P, ns->cls, BT, &acct, NULL, dup);
	ck_assert_uint_eq(acct.bytes, 0);
	ck_assert_uint_eq(X.deduped, 1);
	ck_assert_uint_eq(X.hit_blocks, 3 + 1 + 0 + 3 + 3);
	kvtd_prefix_put(&X, pins, 3);
	for (int i = 0; i < 3; i++)
		for (int t = 0; t < BT; t++)
			kvtd_prefix_put(&X, &b[i], 1);
	for (int t = 0; t < BT; t++)
		kvtd_prefix_put(&X, &b[0], 1);
	ck_assert_uint_eq(X.n_referenced, 0);
	ck_assert_uint_eq(ns->referenced, 0);
	kvtd_prefix_ns_close(&X, ns);
}
END_TEST

/* The budget evicts unreferenced blocks oldest first, never a referenced one; full of
 * referenced blocks, PUBLISH is -ENOSPC and changes nothing. */
START_TEST(t_budget_lru)
{
	struct kvtd_acct acct = {0};
	struct kvtd_pns *ns;
	struct kvtd_pblock *b[3];
	struct kvt_block_key k[3] = {key(1), key(2), key(3)};
	void *s[3][BT];
	uint64_t bb, before;
	int i;

	bb = BT * 1024; /* 2 x 2 x 64 x f32: a 1 KiB slot a token */
	ck_assert_int_eq(kvtd_prefix_init(&X, &P, 2 * bb), 0); /* room for two blocks */
	ns = open_ns("m", 5);
	for (i = 0; i < 2; i++) {
		rows(ns, &acct, i, s[i]);
		ck_assert_int_eq(kvtd_prefix_publish(&X, ns, &k[i], s[i], &acct, NULL, &b[i]), 1);
	}
	/* both referenced: a third is refused, nothing moves */
	rows(ns, &acct, 2, s[2]);
	before = acct.bytes;
	ck_assert_int_eq(kvtd_prefix_publish(&X, ns, &k[2], s[2], &acct, NULL, &b[2]), -ENOSPC);
	ck_assert_uint_eq(acct.bytes, before);
	ck_assert_uint_eq(X.n_blocks, 2);
	ck_assert_uint_eq(X.refused_budget, 1);
	/* release block 0 then block 1 (0 is the older); a lookup of 0 makes it the younger */
	for (int t = 0; t < BT; t++)
		kvtd_prefix_put(&X, (struct kvtd_pblock *[]){b[0], b[1]}, 2);
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, ns, &k[0], 1, NULL, 0), 1);
	ck_assert_int_eq(kvtd_prefix_publish(&X, ns, &k[2], s[2], &acct, NULL, &b[2]), 1);
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, ns, &k[1], 1, NULL, 0), 0); /* 1 went */
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, ns, &k[0], 1, NULL, 0), 1); /* 0 stayed */
	ck_assert_uint_eq(X.evicted, 1);
	ck_assert_uint_eq(X.acct.bytes, 2 * bb);
	for (int t = 0; t < BT; t++)
		kvtd_prefix_put(&X, &b[2], 1);
	kvtd_prefix_ns_close(&X, ns);
}
END_TEST

/* The pool's reclaim hook: an allocation the pool cannot serve first evicts unreferenced
 * blocks, and never a referenced one. */
START_TEST(t_pool_reclaim)
{
	struct kvtd_acct acct = {0};
	struct kvtd_pns *ns;
	struct kvtd_pblock *b[2];
	struct kvt_block_key k[2] = {key(1), key(2)};
	void *s[2][BT], **fill;
	unsigned n_fill, cap = (8u << 20) / 1024;
	int cls;

	ck_assert_int_eq(kvtd_prefix_init(&X, &P, 8ull << 20), 0);
	ns = open_ns("m", 5);
	for (int i = 0; i < 2; i++) {
		rows(ns, &acct, i, s[i]);
		ck_assert_int_eq(kvtd_prefix_publish(&X, ns, &k[i], s[i], &acct, NULL, &b[i]), 1);
	}
	for (int t = 0; t < BT; t++)
		kvtd_prefix_put(&X, &b[0], 1); /* 0 cached, 1 referenced */
	/* fill the rest of the pool with slots of the same class */
	cls = kvtd_pool_class_get(&P, 1024);
	fill = calloc(cap, sizeof(*fill));
	for (n_fill = 0; n_fill < cap; n_fill++)
		if (kvtd_pool_alloc(&P, cls, 1, NULL, NULL, &fill[n_fill]) < 0)
			break;
	/* the allocations went on past the free slots: block 0's BT slots were reclaimed */
	ck_assert_uint_eq(n_fill, cap - BT);
	ck_assert_uint_eq(X.evicted, 1);
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, ns, &k[0], 1, NULL, 0), 0);
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, ns, &k[1], 1, NULL, 0), 1); /* 1 stayed */
	ck_assert_uint_eq(((uint8_t *)b[1]->slot[BT - 1])[0], 1);	     /* untouched */
	kvtd_pool_free(&P, cls, n_fill, NULL, NULL, fill);
	kvtd_pool_class_put(&P, cls);
	free(fill);
	for (int t = 0; t < BT; t++)
		kvtd_prefix_put(&X, &b[1], 1);
	kvtd_prefix_ns_close(&X, ns);
}
END_TEST

/* Random publishes, lookups with pins, releases and reclaims against a model: the store's
 * books (bytes, blocks, referenced) always match, only unreferenced blocks ever go, and once
 * everything is released and reclaimed the pool is empty. */
START_TEST(t_random)
{
	enum { NK = 24, STEPS = 4000 };
	struct kvtd_acct acct = {0};
	struct kvtd_pns *ns[2];
	struct kvtd_pblock **held = calloc(STEPS * BT, sizeof(*held));
	unsigned n_held = 0;
	uint64_t rng = 12345, bb = BT * 1024;

	ck_assert_int_eq(kvtd_prefix_init(&X, &P, 10 * bb), 0);
	ns[0] = open_ns("a", 1);
	ns[1] = open_ns("b", 1);
	for (int step = 0; step < STEPS; step++) {
		struct kvtd_pns *n = ns[kvt_test_xorshift(&rng) & 1];
		struct kvt_block_key k = key(kvt_test_xorshift(&rng) % NK);
		struct kvtd_pblock *b, *pins[3];
		void *s[BT];
		unsigned op = kvt_test_xorshift(&rng) % 4;
		int r;

		if (op == 0 && n_held + BT <= STEPS * BT) {
			rows(n, &acct, 1, s);
			r = kvtd_prefix_publish(&X, n, &k, s, &acct, NULL, &b);
			ck_assert(r == 0 || r == 1 || r == -ENOSPC);
			if (r != 1)
				kvtd_pool_free(&P, n->cls, BT, &acct, NULL, s);
			if (r >= 0)
				for (int t = 0; t < BT; t++)
					held[n_held++] = b;
		} else if (op == 1) {
			struct kvt_block_key ks[3] = {k, key(kvt_test_xorshift(&rng) % NK),
						      key(kvt_test_xorshift(&rng) % NK)};
			uint32_t m = kvtd_prefix_lookup(&X, n, ks, 3, pins, 3);

			for (uint32_t i = 0; i < m; i++)
				held[n_held++] = pins[i];
		} else if (op == 2 && n_held) {
			unsigned i = (unsigned)(kvt_test_xorshift(&rng) % n_held);

			kvtd_prefix_put(&X, &held[i], 1);
			held[i] = held[--n_held];
		} else if (op == 3) {
			kvtd_prefix_reclaim(&X, bb * (kvt_test_xorshift(&rng) % 3));
		}
		ck_assert_uint_eq(acct.bytes, 0);
		ck_assert_uint_eq(X.acct.bytes, X.n_blocks * bb);
		ck_assert_uint_le(X.acct.bytes, 10 * bb);
		ck_assert_uint_eq(X.n_blocks, ns[0]->blocks + ns[1]->blocks);
		ck_assert_uint_eq(X.n_referenced, ns[0]->referenced + ns[1]->referenced);
	}
	/* every held reference still points at a live block */
	for (unsigned i = 0; i < n_held; i++)
		ck_assert_uint_gt(held[i]->refs, 0);
	kvtd_prefix_put(&X, held, n_held);
	ck_assert_uint_eq(X.n_referenced, 0);
	kvtd_prefix_reclaim(&X, UINT64_MAX);
	ck_assert_uint_eq(X.n_blocks, 0);
	ck_assert_uint_eq(X.acct.bytes, 0);
	kvtd_prefix_ns_close(&X, ns[0]);
	kvtd_prefix_ns_close(&X, ns[1]);
	ck_assert_ptr_null(X.ns_list);
	free(held);
}
END_TEST

/* Per scope: namespaces_per_uid refuses one more (-EDQUOT) in that scope only, a namespace that
 * goes frees its place; ids are found in O(1) and a restore refuses an id or identity twice;
 * a lookup repeating one key matches no more than the namespace holds. */
START_TEST(t_scope_limits)
{
	struct kvt_ns_params p = nsp("x");
	struct kvtd_acct acct = {0};
	struct kvtd_pns *a, *b, *c, *r;
	struct kvtd_pblock *blk, *pins[64];
	struct kvt_block_key k = key(9), many[64];
	uint64_t cnt[6] = {0};
	uint32_t id;
	void *s[BT];

	ck_assert_int_eq(kvtd_prefix_init(&X, &P, 1 << 20), 0);
	kvtd_prefix_limits(&X, 2, 0);
	a = open_ns("a", 5);
	b = open_ns("b", 5);
	ck_assert_int_eq(kvtd_prefix_ns_open(&X, &p, 5, &c), -EDQUOT);
	c = open_ns("x", 6);		      /* another scope */
	ck_assert_ptr_eq(open_ns("a", 5), a); /* joining is free */
	kvtd_prefix_ns_close(&X, a);
	id = b->id;
	ck_assert_ptr_eq(kvtd_prefix_ns_by_id(&X, id), b);
	kvtd_prefix_ns_close(&X, b);
	ck_assert_ptr_null(kvtd_prefix_ns_by_id(&X, id));
	ck_assert_int_eq(kvtd_prefix_ns_open(&X, &p, 5, &b), 0);
	/* a restore: the limit does not apply, an id or an identity twice is a contradiction */
	p = nsp("r");
	ck_assert_int_eq(kvtd_prefix_restore_ns(&X, &p, 5, 1000, cnt, &r), 0);
	ck_assert_ptr_eq(kvtd_prefix_ns_by_id(&X, 1000), r);
	p = nsp("r2");
	ck_assert_int_eq(kvtd_prefix_restore_ns(&X, &p, 5, 1000, cnt, &r), -EINVAL);
	p = nsp("r");
	ck_assert_int_eq(kvtd_prefix_restore_ns(&X, &p, 5, 1001, cnt, &r), -EINVAL);
	/* one block; 64 copies of its key match 1, pinning or not */
	rows(a, &acct, 1, s);
	ck_assert_int_eq(kvtd_prefix_publish(&X, a, &k, s, &acct, NULL, &blk), 1);
	for (int i = 0; i < 64; i++)
		many[i] = k;
	ck_assert_uint_eq(kvtd_prefix_match(&X, a, many, 64), 1);
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, a, many, 64, NULL, 0), 1);
	ck_assert_uint_eq(kvtd_prefix_lookup(&X, a, many, 64, pins, 64), 1);
	ck_assert_uint_eq(blk->refs, BT + 1);
	kvtd_prefix_put(&X, pins, 1);
	for (int t = 0; t < BT; t++)
		kvtd_prefix_put(&X, &blk, 1);
	kvtd_prefix_ns_close(&X, a);
	kvtd_prefix_ns_close(&X, b);
	kvtd_prefix_ns_close(&X, c);
}
END_TEST

/* The scope a peer's sessions get: the shared one (0) for a uid in share_uids or a peer with
 * any of its groups, primary or supplementary, in share_gids; its uid's own (uid + 1) otherwise,
 * root included. */
START_TEST(t_scope_of_peer)
{
	struct kvtd_config cfg;
	gid_t own[] = {1000}, supp[] = {1000, 7, 4242}, supp_only[] = {1000, 4243, 4242};

	memset(&cfg, 0, sizeof(cfg));
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 1000, own, 1), 1001); /* nothing shared */
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 0, own, 1), 1);
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 1000, supp, 3), 1001);
	cfg.prefix_share_uids[0] = 2000;
	cfg.prefix_share_uids[1] = 2001;
	cfg.n_prefix_share_uids = 2;
	cfg.prefix_share_gids[0] = 4242;
	cfg.n_prefix_share_gids = 1;
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 2001, own, 1), 0);	/* by uid, second entry */
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 1000, own, 1), 1001); /* no listed group */
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 1000, supp, 3), 0);	/* a supplementary one */
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 1000, supp_only, 3), 0);
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 1000, supp, 2), 1001); /* only n_gids read */
	own[0] = 4242;							 /* the primary one */
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 1000, own, 1), 0);
	ck_assert_uint_eq(kvtd_prefix_scope(&cfg, 0xfffffffeu, NULL, 0), 0xffffffffull);
}
END_TEST

KVT_CHECK_MAIN("prefix", 0, setup, teardown, t_scope_limits, t_ns_check, t_ns_identity,
	       t_publish_lookup, t_budget_lru, t_pool_reclaim, t_random, t_scope_of_peer)
