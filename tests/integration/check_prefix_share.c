/* SPDX-License-Identifier: MIT */
/*
 * Prefix blocks through a real kvtierd: a sequence publishes its first blocks, a second client
 * looks them up, opens a sequence from them and reads the publisher's rows bit for bit while
 * holding none of them itself; the rows outlive their publisher (SIGKILLed); another namespace
 * (name, geometry, uid) never hits; shared rows are copy-on-write (one reader quantizing or
 * evicting them changes nothing for the others); a second publisher of the same prefix gives up
 * its own copy; malformed NS_OPEN / LOOKUP / PUBLISH / SEQ_OPEN fail alone; random SQEs of the
 * four opcodes leave the daemon serving and the pool empty once everyone has gone.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_test.h"
#include "kvtier.h"

enum { L = 2, H = 2, D = 16, BT = 8, NBLK = 4, NTOK = NBLK * BT + 5, STAGE = 64 };
#define ROW	  (H * D)	/* floats per (token, layer, K|V) */
#define TOK	  (L * 2 * ROW) /* floats per token */
#define TOK_BYTES (TOK * 4)	/* one pool slot */

static struct kvtd_proc Dm;

struct client {
	struct kvt_client *c;
	struct kvt_buf *stage;
	uint32_t ns;
};

static void
start(void)
{
	daemon_start(&Dm, NULL);
}

/* A daemon another uid can reach (directory 0711, socket 0666), with @conf appended. */
static void
start_conf(const char *conf)
{
	daemon_start_conf(&Dm, conf, DAEMON_SHARED, NULL);
}

static void
stop(void)
{
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

static struct kvt_ns_params
nsp(const char *name)
{
	struct kvt_ns_params np = {.size = sizeof(np),
				   .layers = L,
				   .kv_heads = H,
				   .head_dim = D,
				   .dtype = KVT_DTYPE_F32,
				   .block_tokens = BT};

	snprintf(np.name, sizeof(np.name), "%s", name);
	return np;
}

static struct kvt_seq_params
seqp(const struct client *cl)
{
	struct kvt_seq_params p = {.size = sizeof(p)};

	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 4;
	p.hbm_frac = 0;
	p.t2_frac = 0;
	p.stage_buf_id = kvt_buf_id(cl->stage);
	p.stage_slots = STAGE;
	p.stage_slot_stride = ROW * 4;
	p.stage_kv_stride = (uint64_t)STAGE * ROW * 4;
	p.stage_layer_stride = 2ull * STAGE * ROW * 4;
	return p;
}

static void
client_open(struct client *cl, const char *ns_name)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_ns_params np = nsp(ns_name);

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &cl->c), 0);
	ck_assert_int_eq(kvt_buf_alloc(cl->c, (size_t)L * 2 * STAGE * ROW * 4, &cl->stage), 0);
	ck_assert_int_eq(kvt_ns_open(cl->c, &np, &cl->ns), 0);
	ck_assert_uint_gt(cl->ns, 0);
}

/* The rows of token @t: a pattern every client computes alike (the "model"). */
static void
token_rows(uint32_t t, float *out)
{
	uint64_t s = 1000 + t;

	for (int i = 0; i < TOK; i++)
		out[i] = kvt_test_lcg_gauss(&s);
}

static void
tokens_of(uint32_t *tok, uint32_t n, uint32_t salt)
{
	for (uint32_t i = 0; i < n; i++)
		tok[i] = 100 + i + salt;
}

static void
append_range(struct client *cl, uint32_t seq, uint32_t from, uint32_t to)
{
	static float rows[NTOK * TOK];

	for (uint32_t t = from; t < to; t++)
		token_rows(t, rows + (size_t)(t - from) * TOK);
	ck_assert_int_eq(
	    kvt_append(cl->c, seq, rows, (uint64_t)(to - from) * TOK_BYTES, to - from, NULL), to);
}

/* A sequence of @cl in its namespace, tokens [0, @ntok) appended and its first NBLK blocks
 * published under @keys; its id. */
static uint32_t
publish_prompt(struct client *cl, const struct kvt_block_key *keys, uint32_t ntok)
{
	struct kvt_seq_params p = seqp(cl);
	uint32_t seq, n_new;

	ck_assert_int_eq(kvt_seq_open_prefix(cl->c, &p, cl->ns, 0, &seq), 0);
	append_range(cl, seq, 0, ntok);
	ck_assert_int_eq(kvt_publish(cl->c, seq, keys, NBLK, &n_new), NBLK);
	return seq;
}

/* FETCH every T1 position of layer @l and compare with token_rows(): returns how many. */
static int
check_rows(struct client *cl, uint32_t seq, uint32_t n)
{
	uint32_t pos[STAGE];
	float ref[TOK];
	int r = kvt_fetch(cl->c, seq, KVT_FETCH_F_T1, 0, L, 0, pos, STAGE);

	ck_assert_int_ge(r, 0);
	for (int i = 0; i < r; i++) {
		token_rows(pos[i], ref);
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				const float *got = (const float *)kvt_buf_ptr(cl->stage) +
						   ((size_t)(l * 2 + kv) * STAGE + i) * ROW;

				ck_assert_msg(!memcmp(got, ref + (l * 2 + kv) * ROW, ROW * 4),
					      "seq %u position %u layer %u %s differs", seq, pos[i],
					      l, kv ? "V" : "K");
			}
	}
	(void)n;
	return r;
}

static uint64_t
seq_pool_bytes(struct client *cl, uint32_t seq)
{
	struct kvt_seq_stat st;

	ck_assert_int_eq(kvt_seq_stat(cl->c, seq, &st), 0);
	return st.pool_bytes;
}

/* A publishes NBLK blocks; B opens from them and reads A's rows with none of its own. */
START_TEST(t_share)
{
	struct client a, b;
	struct kvt_ns_params np = nsp("model-a");
	struct kvt_block_key keys[NBLK + 1];
	struct kvt_seq_params p;
	uint32_t tok[NTOK], sa, sb, n_new = 99;
	int64_t used_a;

	start();
	client_open(&a, "model-a");
	client_open(&b, "model-a");
	tokens_of(tok, NTOK, 0);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK + 1), NBLK);
	/* nothing cached yet */
	ck_assert_int_eq(kvt_lookup(b.c, b.ns, keys, NBLK, KVT_LOOKUP_F_PIN), 0);
	p = seqp(&a);
	ck_assert_int_eq(kvt_seq_open_prefix(a.c, &p, a.ns, 0, &sa), 0);
	append_range(&a, sa, 0, NTOK);
	used_a = pool_used(Dm.sock);
	ck_assert_uint_eq(seq_pool_bytes(&a, sa), (uint64_t)NTOK * TOK_BYTES);
	ck_assert_int_eq(kvt_publish(a.c, sa, keys, NBLK, &n_new), NBLK);
	ck_assert_uint_eq(n_new, NBLK);
	/* published rows are the store's now, not charged to A; the pool holds the same bytes */
	ck_assert_uint_eq(seq_pool_bytes(&a, sa), (uint64_t)(NTOK - NBLK * BT) * TOK_BYTES);
	ck_assert_int_eq(pool_used(Dm.sock), used_a);
	/* publishing again finds them all, changes nothing */
	ck_assert_int_eq(kvt_publish(a.c, sa, keys, NBLK, &n_new), NBLK);
	ck_assert_uint_eq(n_new, 0);

	ck_assert_int_eq(kvt_lookup(b.c, b.ns, keys, NBLK, KVT_LOOKUP_F_PIN), NBLK);
	p = seqp(&b);
	ck_assert_int_eq(kvt_seq_open_prefix(b.c, &p, b.ns, NBLK, &sb), 0);
	ck_assert_uint_eq(seq_pool_bytes(&b, sb), 0);
	ck_assert_int_eq(pool_used(Dm.sock), used_a); /* no copy */
	ck_assert_int_eq(check_rows(&b, sb, NBLK * BT), NBLK * BT);
	/* B goes on past the prefix with rows of its own */
	append_range(&b, sb, NBLK * BT, NTOK);
	ck_assert_int_eq(check_rows(&b, sb, NTOK), NTOK);
	ck_assert_uint_eq(seq_pool_bytes(&b, sb), (uint64_t)(NTOK - NBLK * BT) * TOK_BYTES);
	/* a partial prefix: the keys of a longer prompt match as far as they agree */
	tok[BT * 2 + 3] = 7; /* differs inside block 2 */
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	ck_assert_int_eq(kvt_lookup(b.c, b.ns, keys, NBLK, 0), 2);

	kvt_disconnect(a.c);
	kvt_disconnect(b.c);
	/* every sequence gone: the blocks stay cached (the store's), the rest is freed */
	ck_assert_int_eq(pool_used(Dm.sock), (int64_t)NBLK * BT * TOK_BYTES);
	stop();
}
END_TEST

/* The rows outlive their publisher: SIGKILLed while a reader references them. */
START_TEST(t_publisher_killed)
{
	struct kvt_ns_params np = nsp("model-k");
	struct kvt_block_key keys[NBLK];
	struct client b;
	struct kvt_seq_params p;
	uint32_t tok[NTOK], sb;
	int fd[2], st;
	char ok;
	pid_t pid;

	start();
	tokens_of(tok, NTOK, 3);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	ck_assert_int_eq(pipe(fd), 0);
	pid = fork();
	if (pid == 0) {
		struct client a;
		uint32_t sa;

		client_open(&a, "model-k");
		p = seqp(&a);
		if (kvt_seq_open_prefix(a.c, &p, a.ns, 0, &sa) < 0)
			_exit(1);
		append_range(&a, sa, 0, NTOK);
		if (kvt_publish(a.c, sa, keys, NBLK, NULL) != NBLK)
			_exit(2);
		(void)!write(fd[1], "y", 1);
		pause(); /* killed here, its session and sequence open */
		_exit(3);
	}
	close(fd[1]);
	ck_assert_int_eq(read(fd[0], &ok, 1), 1);
	client_open(&b, "model-k");
	ck_assert_int_eq(kvt_lookup(b.c, b.ns, keys, NBLK, KVT_LOOKUP_F_PIN), NBLK);
	p = seqp(&b);
	ck_assert_int_eq(kvt_seq_open_prefix(b.c, &p, b.ns, NBLK, &sb), 0);
	kill(pid, SIGKILL);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	/* the daemon drops the publisher's session; wait until its private rows are freed */
	for (int i = 0; i < 500 && pool_used(Dm.sock) != (int64_t)NBLK * BT * TOK_BYTES; i++)
		usleep(10000);
	ck_assert_int_eq(pool_used(Dm.sock), (int64_t)NBLK * BT * TOK_BYTES);
	ck_assert_int_eq(check_rows(&b, sb, NBLK * BT), NBLK * BT);
	/* and a newcomer still finds them */
	ck_assert_int_eq(kvt_lookup(b.c, b.ns, keys, NBLK, 0), NBLK);
	kvt_disconnect(b.c);
	close(fd[0]);
	stop();
}
END_TEST

/* Blocks are shared only inside one namespace: name, geometry and uid. */
START_TEST(t_namespaces)
{
	struct kvt_ns_params np = nsp("model-a"), other;
	struct kvt_block_key keys[NBLK];
	struct client a, b;
	uint32_t tok[NTOK], ns2;

	start();
	client_open(&a, "model-a");
	tokens_of(tok, NTOK, 0);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	publish_prompt(&a, keys, NTOK);
	/* the same keys, sent in namespaces that differ in one field each: never a hit */
	client_open(&b, "model-b");
	ck_assert_int_eq(kvt_lookup(b.c, b.ns, keys, NBLK, 0), 0);
	other = np;
	other.head_dim = 32;
	ck_assert_int_eq(kvt_ns_open(b.c, &other, &ns2), 0);
	ck_assert_int_eq(kvt_lookup(b.c, ns2, keys, NBLK, 0), 0);
	other = np;
	other.dtype = KVT_DTYPE_F16;
	ck_assert_int_eq(kvt_ns_open(b.c, &other, &ns2), 0);
	ck_assert_int_eq(kvt_lookup(b.c, ns2, keys, NBLK, 0), 0);
	/* and the right one hits */
	ck_assert_int_eq(kvt_ns_open(b.c, &np, &ns2), 0);
	ck_assert_int_eq(kvt_lookup(b.c, ns2, keys, NBLK, 0), NBLK);
	/* the keys differ per namespace too, so a client cannot even name another's block */
	{
		struct kvt_block_key k2[NBLK];

		ck_assert_int_eq(kvt_block_keys(&other, NULL, tok, NTOK, k2, NBLK), NBLK);
		ck_assert(memcmp(k2, keys, sizeof(keys)) != 0);
	}
	kvt_disconnect(a.c);
	kvt_disconnect(b.c);
	stop();
}
END_TEST

/* Publishes NBLK blocks of "model-a" as this uid, then asks a child running as uid 65534 how
 * many it finds with the same name, geometry and keys. */
static int
other_uid_hits(void)
{
	struct kvt_ns_params np = nsp("model-a");
	struct kvt_block_key keys[NBLK];
	struct client a;
	uint32_t tok[NTOK];
	pid_t pid;
	int st;

	ck_assert_msg(geteuid() == 0, "needs root: it connects as uid 65534 too");
	client_open(&a, "model-a");
	tokens_of(tok, NTOK, 0);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	publish_prompt(&a, keys, NTOK);
	pid = fork();
	if (pid == 0) {
		struct client c;
		int r;

		if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
			_exit(100);
		client_open(&c, "model-a");
		r = kvt_lookup(c.c, c.ns, keys, NBLK, 0);
		_exit(r < 0 ? 101 : r);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) <= NBLK, "child status %d", st);
	kvt_disconnect(a.c);
	return WEXITSTATUS(st);
}

/* By default a namespace is one uid's; share_uids / share_gids make one scope of several. */
START_TEST(t_uid_scope)
{
	start_conf("");
	ck_assert_int_eq(other_uid_hits(), 0);
	stop();
	start_conf("[prefix]\nshare_uids = 0, 65534\n");
	ck_assert_int_eq(other_uid_hits(), NBLK);
	stop();
	start_conf("[prefix]\nshare_uids = 0\n"); /* only one side listed: two scopes */
	ck_assert_int_eq(other_uid_hits(), 0);
	stop();
}
END_TEST

/* A and B read one shared prefix. B quantizes all of it (T2) and then evicts it: A's rows stay
 * bit-exact full precision, the blocks stay referenced by A, and B's int8 rows are its own. */
START_TEST(t_copy_on_write)
{
	struct kvt_ns_params np = nsp("model-c");
	struct kvt_block_key keys[NBLK];
	struct kvt_seq_params p;
	struct client a, b;
	uint32_t tok[NTOK], sa, sb;
	struct kvt_seq_stat st;
	uint8_t out[4096];

	start();
	client_open(&a, "model-c");
	client_open(&b, "model-c");
	tokens_of(tok, NTOK, 5);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	sa = publish_prompt(&a, keys, NBLK * BT);
	ck_assert_int_eq(kvt_lookup(b.c, b.ns, keys, NBLK, KVT_LOOKUP_F_PIN), NBLK);
	/* B: everything but a sink and a window goes to int8 */
	p = seqp(&b);
	p.policy = KVT_POLICY_TIERED;
	p.t2_frac = 1.0f;
	p.sinks = 1;
	p.window = 2;
	ck_assert_int_eq(kvt_seq_open_prefix(b.c, &p, b.ns, NBLK, &sb), 0);
	append_range(&b, sb, NBLK * BT, NBLK * BT + 4);
	ck_assert_int_gt(kvt_retier(b.c, sb, out, sizeof(out)), 0);
	ck_assert_int_eq(kvt_seq_stat(b.c, sb, &st), 0);
	ck_assert_uint_gt(st.tier_count[2], 0);
	/* A still reads exact rows, all of them full precision */
	ck_assert_int_eq(check_rows(&a, sa, NBLK * BT), NBLK * BT);
	ck_assert_int_eq(kvt_seq_stat(a.c, sa, &st), 0);
	ck_assert_uint_eq(st.tier_count[1], NBLK * BT);
	/* B closes: the blocks are A's alone; A closes: they are cached, nothing else is held */
	ck_assert_int_eq(kvt_seq_close(b.c, sb), 0);
	ck_assert_int_eq(check_rows(&a, sa, NBLK * BT), NBLK * BT);
	ck_assert_int_eq(kvt_seq_close(a.c, sa), 0);
	ck_assert_int_eq(pool_used(Dm.sock), (int64_t)NBLK * BT * TOK_BYTES);
	kvt_disconnect(a.c);
	kvt_disconnect(b.c);
	stop();
}
END_TEST

/* Two processes compute the same prompt without knowing of each other: the second to publish
 * gives up its own copy for the published blocks; pool bytes drop to one copy. */
START_TEST(t_dedupe)
{
	struct kvt_ns_params np = nsp("model-d");
	struct kvt_block_key keys[NBLK];
	struct kvt_seq_params p;
	struct client a, b;
	uint32_t tok[NTOK], sa, sb, n_new;

	start();
	client_open(&a, "model-d");
	client_open(&b, "model-d");
	tokens_of(tok, NTOK, 9);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	p = seqp(&a);
	ck_assert_int_eq(kvt_seq_open_prefix(a.c, &p, a.ns, 0, &sa), 0);
	ck_assert_int_eq(kvt_seq_open_prefix(b.c, &p, b.ns, 0, &sb), 0);
	append_range(&a, sa, 0, NBLK * BT);
	append_range(&b, sb, 0, NBLK * BT);
	ck_assert_int_eq(pool_used(Dm.sock), 2 * (int64_t)NBLK * BT * TOK_BYTES);
	ck_assert_int_eq(kvt_publish(a.c, sa, keys, NBLK, &n_new), NBLK);
	ck_assert_uint_eq(n_new, NBLK);
	ck_assert_int_eq(kvt_publish(b.c, sb, keys, NBLK, &n_new), NBLK);
	ck_assert_uint_eq(n_new, 0);
	ck_assert_int_eq(pool_used(Dm.sock), (int64_t)NBLK * BT * TOK_BYTES);
	ck_assert_uint_eq(seq_pool_bytes(&b, sb), 0);
	ck_assert_int_eq(check_rows(&b, sb, NBLK * BT), NBLK * BT);
	kvt_disconnect(a.c);
	kvt_disconnect(b.c);
	stop();
}
END_TEST

/* One raw SQE; its CQE's res (and aux[0] into *aux when not NULL). */
static int
raw_op(struct kvt_client *c, const struct kvt_sqe *in, uint64_t *aux)
{
	struct kvt_sqe *e = kvt_get_sqe(c);
	struct kvt_cqe cqe;

	ck_assert_ptr_nonnull(e);
	*e = *in;
	e->user_data = 42;
	ck_assert_int_eq(kvt_submit(c), 1);
	ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
	if (aux)
		*aux = cqe.aux[0];
	return cqe.res;
}

/* Malformed NS_OPEN, LOOKUP, PUBLISH and SEQ_OPEN fail alone, each with a reason. */
START_TEST(t_bad_input)
{
	struct kvt_ns_params np = nsp("model-e"), bad;
	struct kvt_block_key keys[NBLK];
	struct kvt_seq_params p;
	struct client a;
	uint32_t tok[NTOK], sa, s_plain, ns;
	uint64_t arena_size;
	uint8_t *arena;
	struct kvt_sqe e;
	char why[256];

	start();
	client_open(&a, "model-e");
	arena = kvt_arena(a.c, &arena_size);
	tokens_of(tok, NTOK, 0);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	/* NS_OPEN: a name without NUL, and too many namespaces */
	bad = np;
	memset(bad.name, 'x', sizeof(bad.name));
	memcpy(arena, &bad, sizeof(bad));
	kvt_prep_ns_open(&e, 0);
	ck_assert_int_eq(raw_op(a.c, &e, NULL), -EINVAL);
	ck_assert_int_eq(kvt_op_error(a.c, 42, why, sizeof(why)), 0);
	ck_assert_msg(strstr(why, "name"), "%s", why);
	ck_assert_int_eq(kvt_block_keys(&bad, NULL, tok, NTOK, keys, NBLK), -EINVAL);
	for (int i = 1; i < KVT_MAX_NS; i++)
		ck_assert_int_eq(kvt_ns_open(a.c, &np, &ns), 0);
	ck_assert_int_eq(kvt_ns_open(a.c, &np, &ns), -EMFILE);
	ck_assert_int_eq(kvt_ns_close(a.c, KVT_MAX_NS), 0);
	ck_assert_int_eq(kvt_ns_close(a.c, KVT_MAX_NS), -EINVAL);
	/* LOOKUP: no such namespace, no keys, a length that is not nkeys x 16, misaligned */
	ck_assert_int_eq(kvt_lookup(a.c, 99, keys, NBLK, 0), -EINVAL);
	ck_assert_int_eq(kvt_lookup(a.c, 0, keys, NBLK, 0), -EINVAL);
	memcpy(arena, keys, sizeof(keys));
	kvt_prep_lookup(&e, a.ns, 0, 0, NBLK);
	e.arena_len -= 1;
	ck_assert_int_eq(raw_op(a.c, &e, NULL), -EINVAL);
	kvt_prep_lookup(&e, a.ns, 0, 4, NBLK);
	ck_assert_int_eq(raw_op(a.c, &e, NULL), -EINVAL);
	kvt_prep_lookup(&e, a.ns, 0, arena_size - 16, 2); /* runs past the arena */
	ck_assert_int_eq(raw_op(a.c, &e, NULL), -EINVAL);
	kvt_prep_lookup(&e, a.ns, 0x8, 0, NBLK); /* unknown flag */
	ck_assert_int_eq(raw_op(a.c, &e, NULL), -EINVAL);
	/* SEQ_OPEN: more prefix blocks than pinned; a namespace of another geometry */
	p = seqp(&a);
	ck_assert_int_eq(kvt_seq_open_prefix(a.c, &p, a.ns, 1, &sa), -EINVAL);
	ck_assert_int_eq(kvt_seq_open_prefix(a.c, &p, KVT_MAX_NS, 0, &sa), -EINVAL);
	bad = np;
	bad.layers = L + 1;
	ck_assert_int_eq(kvt_ns_open(a.c, &bad, &ns), 0);
	ck_assert_int_eq(kvt_seq_open_prefix(a.c, &p, ns, 0, &sa), -EINVAL);
	ck_assert_msg(strstr(kvt_last_error(), "layers"), "%s", kvt_last_error());
	/* PUBLISH: a sequence without a namespace; more blocks than tokens */
	ck_assert_int_eq(kvt_seq_open(a.c, &p, &s_plain), 0);
	append_range(&a, s_plain, 0, NBLK * BT);
	ck_assert_int_eq(kvt_publish(a.c, s_plain, keys, NBLK, NULL), -EINVAL);
	ck_assert_int_eq(kvt_seq_open_prefix(a.c, &p, a.ns, 0, &sa), 0);
	append_range(&a, sa, 0, BT);
	ck_assert_int_eq(kvt_publish(a.c, sa, keys, NBLK, NULL), -EINVAL);
	ck_assert_int_eq(kvt_publish(a.c, sa, keys, 1, NULL), 1);
	/* the session still works after all that */
	ck_assert_int_eq(kvt_nop(a.c), 0);
	kvt_disconnect(a.c);
	for (int i = 0; i < 500 && pool_used(Dm.sock) != BT * TOK_BYTES; i++)
		usleep(10000);
	ck_assert_int_eq(pool_used(Dm.sock), BT * TOK_BYTES); /* the one published block */
	stop();
}
END_TEST

/* Random SQEs of the four opcodes (and SEQ_OPEN with random ns / prefix_blocks) from a client
 * that also uses them properly: the daemon keeps serving, and once everyone is gone and the
 * cache is reclaimed nothing is left. */
START_TEST(t_fuzz)
{
	static const uint8_t ops[] = {KVT_OP_NS_OPEN, KVT_OP_NS_CLOSE, KVT_OP_LOOKUP,
				      KVT_OP_PUBLISH, KVT_OP_SEQ_OPEN};
	struct kvt_ns_params np = nsp("model-f");
	struct kvt_block_key keys[NBLK];
	struct kvt_seq_params p;
	struct client a;
	uint32_t tok[NTOK], sa;
	uint64_t rng = 99, arena_size;
	uint8_t *arena;

	start();
	client_open(&a, "model-f");
	arena = kvt_arena(a.c, &arena_size);
	tokens_of(tok, NTOK, 0);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	p = seqp(&a);
	ck_assert_int_eq(kvt_seq_open_prefix(a.c, &p, a.ns, 0, &sa), 0);
	append_range(&a, sa, 0, NTOK);
	for (int i = 0; i < 3000; i++) {
		struct kvt_sqe e;
		uint64_t r = kvt_test_xorshift(&rng);
		int res;

		memset(&e, 0, sizeof(e));
		e.opcode = ops[r % sizeof(ops)];
		r = kvt_test_xorshift(&rng);
		e.op_flags = (r & 1) ? (uint16_t)(r >> 1 & 3) : 0;
		e.seq = (r & 4) ? (uint32_t)(r >> 8 & 7) : 0;
		e.arena_off = (r & 8) ? (r >> 16 & 0xff) * 8 : 0;
		e.arena_len = (r & 16) ? (uint32_t)(r >> 24 & 0x3ff) : NBLK * 16;
		e.count = (uint32_t)(kvt_test_xorshift(&rng) % (NBLK + 3));
		e.arg0 = kvt_test_xorshift(&rng) % (KVT_MAX_NS + 3);
		/* the arena: valid keys, valid params, or noise */
		switch (kvt_test_xorshift(&rng) % 4) {
		case 0:
			memcpy(arena, keys, sizeof(keys));
			break;
		case 1:
			memcpy(arena, &np, sizeof(np));
			break;
		case 2:
			memcpy(arena, &p, sizeof(p));
			break;
		default:
			for (int j = 0; j < 256; j++)
				arena[j] = (uint8_t)kvt_test_xorshift(&rng);
		}
		res = raw_op(a.c, &e, NULL);
		ck_assert_int_le(res, 1 << 20);
		if (e.opcode == KVT_OP_SEQ_OPEN && res > 0 && (uint32_t)res != sa)
			ck_assert_int_eq(kvt_seq_close(a.c, (uint32_t)res), 0);
	}
	ck_assert_int_eq(kvt_nop(a.c), 0);
	ck_assert_int_eq(check_rows(&a, sa, NTOK), NTOK);
	kvt_disconnect(a.c);
	ck_assert(daemon_alive(&Dm));
	/* all that is left is cached blocks: a pool-filling client reclaims them */
	stop();
}
END_TEST

/* Two pollers, four client processes, the same prompts: lookups, opens from pins, publishes
 * (new and found), quantization and closes race on the shared store. Every reader sees exact
 * rows, and at the end only cached blocks are left. */
START_TEST(t_concurrent)
{
	const char *const extra[] = {"--pollers", "2", NULL};
	pid_t pid[4];
	int st;

	daemon_start(&Dm, extra);
	for (int w = 0; w < 4; w++) {
		pid[w] = fork();
		if (pid[w] == 0) {
			struct kvt_ns_params np = nsp("model-r");
			struct kvt_block_key keys[NBLK];
			struct kvt_seq_params p;
			struct client a;
			uint32_t tok[NTOK], sq;
			uint8_t out[4096];

			client_open(&a, "model-r");
			for (int i = 0; i < 40; i++) {
				int m;

				tokens_of(tok, NTOK, (uint32_t)(i % 3)); /* three prompts */
				if (kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK) != NBLK)
					_exit(1);
				m = kvt_lookup(a.c, a.ns, keys, NBLK, KVT_LOOKUP_F_PIN);
				p = seqp(&a);
				p.t2_frac = (i & 1) ? 0.5f : 0;
				p.window = 4;
				if (m < 0 ||
				    kvt_seq_open_prefix(a.c, &p, a.ns, (uint32_t)m, &sq) < 0)
					_exit(2);
				append_range(&a, sq, (uint32_t)m * BT, NTOK);
				if (kvt_publish(a.c, sq, keys, NBLK, NULL) != NBLK)
					_exit(3);
				if (check_rows(&a, sq, NTOK) != NTOK)
					_exit(4);
				if (kvt_retier(a.c, sq, out, sizeof(out)) < 0)
					_exit(5);
				if (kvt_seq_close(a.c, sq) < 0)
					_exit(6);
			}
			kvt_disconnect(a.c);
			_exit(0);
		}
	}
	for (int w = 0; w < 4; w++) {
		ck_assert_int_eq(waitpid(pid[w], &st, 0), pid[w]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d: status %d", w, st);
	}
	stop();
}
END_TEST

static int64_t blocks_get(const char *field);

/* CLIENTS' pool_bytes of the session named @name. */
static int64_t
session_pool_bytes(const char *name)
{
	struct json_object *o = admin_request(Dm.sock, KVT_CTL_CLIENTS), *a, *c, *v;
	int64_t bytes = -1;

	ck_assert_ptr_nonnull(o);
	ck_assert(json_object_object_get_ex(o, "clients", &a));
	for (size_t i = 0; i < json_object_array_length(a); i++) {
		c = json_object_array_get_idx(a, i);
		if (json_object_object_get_ex(c, "name", &v) &&
		    !strcmp(json_object_get_string(v), name))
			bytes = json_get_i64(c, "pool_bytes");
	}
	json_object_put(o);
	ck_assert_msg(bytes >= 0, "no session named %s", name);
	return bytes;
}

/* A LOOKUP that repeats one key pins no more than the namespace holds, its pin array is charged
 * to the session (and freed with its pins), and one SQE examines a bounded number of keys. */
START_TEST(t_pins_bounded)
{
	enum { REPEAT = 500000 };
	struct kvt_opts o = {
	    .size = sizeof(o), .spin_us = 10, .name = "pinner", .arena_size = 16u << 20};
	struct kvt_ns_params np = nsp("model-p");
	struct kvt_block_key keys[NBLK], *many;
	struct client a;
	struct kvt_client *c;
	uint32_t tok[NTOK], ns;

	start();
	client_open(&a, "model-p");
	tokens_of(tok, NTOK, 0);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	publish_prompt(&a, keys, NTOK);
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_ns_open(c, &np, &ns), 0);
	many = malloc(REPEAT * sizeof(*many));
	ck_assert_ptr_nonnull(many);
	for (uint32_t i = 0; i < REPEAT; i++)
		many[i] = keys[0];
	/* the namespace holds NBLK blocks: no match is longer, pinning or not */
	ck_assert_int_eq(kvt_lookup(c, ns, many, REPEAT, 0), NBLK);
	ck_assert_int_eq(session_pool_bytes("pinner"), 0);
	ck_assert_int_eq(kvt_lookup(c, ns, many, REPEAT, KVT_LOOKUP_F_PIN), NBLK);
	ck_assert_int_eq(session_pool_bytes("pinner"), NBLK * (int64_t)sizeof(void *));
	ck_assert_int_eq(blocks_get("referenced"), NBLK);
	/* a real prefix still pins in full */
	ck_assert_int_eq(kvt_lookup(c, ns, keys, NBLK, KVT_LOOKUP_F_PIN), NBLK);
	ck_assert_int_eq(kvt_ns_close(c, ns), 0);
	ck_assert_int_eq(session_pool_bytes("pinner"), 0);
	free(many);
	kvt_disconnect(c);
	kvt_disconnect(a.c);
	stop();
}
END_TEST

/* With [limits] pool_bytes_per_uid, a uid's blocks hold at most that share of cache_bytes:
 * publishing past it is -ENOSPC while they are referenced, and the uid's own unreferenced
 * blocks give way first. (Publishing moves a block's charge off the uid's account: without the
 * share one uid held cache_bytes of referenced blocks whatever its quota.) */
START_TEST(t_uid_share)
{
	enum { PROMPTS = 4, SHARE = PROMPTS * NBLK * BT * TOK_BYTES };
	struct kvt_ns_params np = nsp("model-q");
	struct kvt_block_key keys[PROMPTS + 2][NBLK];
	uint32_t tok[NTOK], seq[PROMPTS + 2], n_new;
	struct kvt_seq_params p;
	struct client a;
	char conf[128];

	snprintf(conf, sizeof(conf),
		 "[limits]\npool_bytes_per_uid = %u\n[prefix]\ncache_bytes = 8M\n", SHARE);
	start_conf(conf);
	client_open(&a, "model-q");
	p = seqp(&a);
	/* one sequence at a time: the uid's quota holds one unpublished */
	for (int i = 0; i < PROMPTS + 1; i++) {
		tokens_of(tok, NTOK, 1000 * (i + 1));
		ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys[i], NBLK), NBLK);
		ck_assert_int_eq(kvt_seq_open_prefix(a.c, &p, a.ns, 0, &seq[i]), 0);
		append_range(&a, seq[i], 0, NTOK);
		/* the share holds PROMPTS prompts in use */
		if (i < PROMPTS)
			ck_assert_int_eq(kvt_publish(a.c, seq[i], keys[i], NBLK, &n_new), NBLK);
	}
	/* the next is refused and changes nothing */
	ck_assert_int_eq(kvt_publish(a.c, seq[PROMPTS], keys[PROMPTS], NBLK, &n_new), -ENOSPC);
	ck_assert_int_eq(blocks_get("blocks"), PROMPTS * NBLK);
	ck_assert_int_eq(blocks_get("bytes"), SHARE);
	/* a prompt no longer in use gives way to the uid's next */
	ck_assert_int_eq(kvt_seq_close(a.c, seq[0]), 0);
	ck_assert_int_eq(kvt_publish(a.c, seq[PROMPTS], keys[PROMPTS], NBLK, &n_new), NBLK);
	ck_assert_uint_eq(n_new, NBLK);
	ck_assert_int_eq(kvt_lookup(a.c, a.ns, keys[0], NBLK, 0), 0);
	tokens_of(tok, NTOK, 1000 * (PROMPTS + 2));
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys[PROMPTS + 1], NBLK), NBLK);
	ck_assert_int_eq(kvt_seq_open_prefix(a.c, &p, a.ns, 0, &seq[PROMPTS + 1]), 0);
	append_range(&a, seq[PROMPTS + 1], 0, NTOK);
	ck_assert_int_eq(kvt_publish(a.c, seq[PROMPTS + 1], keys[PROMPTS + 1], NBLK, &n_new),
			 -ENOSPC);
	ck_assert_int_eq(blocks_get("bytes"), SHARE);
	kvt_disconnect(a.c);
	stop();
}
END_TEST

/* A field of the BLOCKS document. */
static int64_t
blocks_get(const char *field)
{
	struct json_object *o = admin_request(Dm.sock, KVT_CTL_BLOCKS);
	int64_t v;

	ck_assert_ptr_nonnull(o);
	v = json_get_i64(o, field);
	json_object_put(o);
	return v;
}

static void
restart_daemon(void)
{
	struct json_object *o = admin_request(Dm.sock, KVT_CTL_RESTART), *v;

	ck_assert_msg(o, "no reply to RESTART (log %s)", Dm.log);
	ck_assert_msg(json_object_object_get_ex(o, "restarted", &v) && json_object_get_boolean(v),
		      "RESTART: %s", json_object_to_json_string(o));
	json_object_put(o);
}

/* A restart in place keeps the store: blocks (cached and in use), the readers' references,
 * the pins a LOOKUP holds, the namespaces' handles; nothing is copied or lost. Twice. */
START_TEST(t_restart)
{
	struct kvt_ns_params np = nsp("model-s");
	struct kvt_block_key keys[NBLK], other[NBLK];
	struct kvt_seq_params p;
	struct client a, b;
	uint32_t tok[NTOK], sa, sb, sb2, n_new;
	int64_t used;

	start();
	client_open(&a, "model-s");
	client_open(&b, "model-s");
	tokens_of(tok, NTOK, 0);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	tokens_of(tok, NTOK, 50);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, other, NBLK), NBLK);
	sa = publish_prompt(&a, keys, NTOK);
	/* a second prompt's blocks, left cached (their sequence closed) */
	ck_assert_int_eq(kvt_seq_close(a.c, publish_prompt(&a, other, NBLK * BT)), 0);
	/* B reads the first from pins it keeps */
	ck_assert_int_eq(kvt_lookup(b.c, b.ns, keys, NBLK, KVT_LOOKUP_F_PIN), NBLK);
	p = seqp(&b);
	ck_assert_int_eq(kvt_seq_open_prefix(b.c, &p, b.ns, NBLK, &sb), 0);
	used = pool_used(Dm.sock);
	for (int round = 0; round < 2; round++) {
		restart_daemon();
		ck_assert_int_eq(pool_used(Dm.sock), used);
		ck_assert_int_eq(blocks_get("blocks"), 2 * NBLK);
		ck_assert_int_eq(blocks_get("referenced"), NBLK);
		ck_assert_int_eq(blocks_get("published"), 2 * NBLK); /* counters carried */
		ck_assert_int_eq(check_rows(&b, sb, NBLK * BT), NBLK * BT);
		ck_assert_int_eq(check_rows(&a, sa, NTOK), NTOK);
		ck_assert_uint_eq(seq_pool_bytes(&b, sb), 0);
		/* the pins survived: another sequence opens from them */
		ck_assert_int_eq(kvt_seq_open_prefix(b.c, &p, b.ns, NBLK, &sb2), 0);
		ck_assert_int_eq(check_rows(&b, sb2, NBLK * BT), NBLK * BT);
		ck_assert_int_eq(kvt_seq_close(b.c, sb2), 0);
		/* both prompts still hit; A's sequence still publishes (found) */
		ck_assert_int_eq(kvt_lookup(b.c, b.ns, other, NBLK, 0), NBLK);
		ck_assert_int_eq(kvt_publish(a.c, sa, keys, NBLK, &n_new), NBLK);
		ck_assert_uint_eq(n_new, 0);
	}
	/* references were counted back exactly: when everyone is gone only the cache is left,
	 * and all of it can go */
	kvt_disconnect(a.c);
	kvt_disconnect(b.c);
	for (int i = 0; i < 500 && pool_used(Dm.sock) != 2 * (int64_t)NBLK * BT * TOK_BYTES; i++)
		usleep(10000);
	ck_assert_int_eq(pool_used(Dm.sock), 2 * (int64_t)NBLK * BT * TOK_BYTES);
	ck_assert_int_eq(blocks_get("referenced"), 0);
	ck_assert_int_eq(blocks_get("blocks"), 2 * NBLK);
	stop();
}
END_TEST

/* The pin array a LOOKUP charged to its session stays charged across a restart in place (it
 * was restored uncharged, until the session's next pinning LOOKUP) and goes with NS_CLOSE. */
START_TEST(t_restart_pins_charged)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10, .name = "pinner"};
	struct kvt_ns_params np = nsp("model-q");
	struct kvt_block_key keys[NBLK];
	struct kvt_client *c;
	struct client a;
	uint32_t tok[NTOK], ns;

	start();
	client_open(&a, "model-q");
	tokens_of(tok, NTOK, 0);
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK), NBLK);
	publish_prompt(&a, keys, NTOK);
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_ns_open(c, &np, &ns), 0);
	ck_assert_int_eq(kvt_lookup(c, ns, keys, NBLK, KVT_LOOKUP_F_PIN), NBLK);
	ck_assert_int_eq(session_pool_bytes("pinner"), NBLK * (int64_t)sizeof(void *));
	for (int round = 0; round < 2; round++) {
		restart_daemon();
		ck_assert_int_eq(session_pool_bytes("pinner"), NBLK * (int64_t)sizeof(void *));
	}
	ck_assert_int_eq(kvt_ns_close(c, ns), 0);
	ck_assert_int_eq(session_pool_bytes("pinner"), 0);
	kvt_disconnect(c);
	kvt_disconnect(a.c);
	stop();
}
END_TEST

KVT_CHECK_MAIN("prefix_share", 120, NULL, NULL, t_share, t_publisher_killed, t_namespaces,
	       t_uid_scope, t_copy_on_write, t_dedupe, t_bad_input, t_fuzz, t_concurrent, t_restart,
	       t_pins_bounded, t_uid_share, t_restart_pins_charged)
