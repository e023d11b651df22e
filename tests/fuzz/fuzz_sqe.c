/* SPDX-License-Identifier: MIT */
/*
 * fuzz_sqe - whatever a client writes into its SQ and arena, kvtierd answers every entry with
 * a CQE and stays whole: no crash, no out-of-bounds access (ASan, UBSan), every pool byte back
 * when the session ends (and the prefix blocks it published are released: every one can be
 * reclaimed).
 *
 * One input is a session's life: a fresh session (8 MiB arena) in a daemon core with a real
 * pool and prefix store, a namespace (id 1) and a valid sequence opened in it (tiered, int8 T2,
 * retrieval on, T0 and staging regions, 96 tokens appended, so every opcode reaches sequence
 * code, PUBLISH included), then the input read as records of [2
 * bytes (LE) arena length / 16][64-byte SQE][that many arena bytes at offset 0], each submitted and
 * drained like the poller does. SQE stamps are set by the harness (a bad stamp only stalls a ring,
 * tested elsewhere); everything else is the input's.
 *
 * Built two ways: with clang and -fsanitize=fuzzer (cmake -DKVT_FUZZ=ON, a libFuzzer binary
 * that takes the usual libFuzzer flags), and always as a plain program, `fuzz_sqe [N] [seed]`,
 * that feeds N inputs made by a seeded generator that knows each opcode's fields and payload
 * (mostly well-formed requests against the open sequence, one field in four replaced by an
 * edge-case number, NaN, Inf and negative values in payloads): a deterministic test for ctest
 * under the sanitizers, which prints how many requests of each opcode succeeded. An input holds
 * 1-12 SQEs, 1-$KVT_FUZZ_SQES with that set (tests/fuzz/long.sh).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvt_ring.h"
#include "kvtd.h"
#include "session.h"
#include "kvt_test.h"

#define ARENA (8u << 20)

static struct kvtd D;
static unsigned long answered[KVT_OP__COUNT + 1][2]; /* [opcode or other][failed, ok] */
static unsigned long fuzzed;			     /* SQEs from inputs, not the set-up */

__attribute__((noreturn)) static void
die(const char *what)
{
	fprintf(stderr, "fuzz_sqe: %s\n", what);
	abort();
}

#define STAGE_ROWS  256 /* per layer and K|V, 128-byte rows (2 kv heads x 64, f16) */
#define STAGE_BYTES (2ull * 2 * STAGE_ROWS * 256)
#define T0_SLOTS    64 /* the client's device copy: slots of one token, all layers */
#define T0_BYTES    (2ull * 2 * T0_SLOTS * 256)

static int
daemon_init(void)
{
	kvtd_config_defaults(&D.cfg);
	D.cfg.pool_size = 64ull << 20;
	D.cfg.lock = 0;
	D.cfg.numa_node = -1;
	if (kvt_dev_open(KVT_DEV_HOST, &D.dev) < 0)
		return -1;
	if (kvtd_pool_init(&D.pool, &D.cfg, D.dev) < 0)
		return -1;
	return kvtd_prefix_init(&D.prefix, &D.pool, 8ull << 20);
}

/* The namespace of the base sequence's geometry (blocks of 16 tokens). */
static struct kvt_ns_params
base_ns(void)
{
	struct kvt_ns_params np = {.size = sizeof(np),
				   .layers = 2,
				   .kv_heads = 2,
				   .head_dim = 64,
				   .dtype = KVT_DTYPE_F16,
				   .name = "fuzz"};

	return np;
}

/* Block key @i of a small set, so that LOOKUPs find what PUBLISHes put there. */
static struct kvt_block_key
fkey(uint32_t i)
{
	return (struct kvt_block_key){.lo = i, .hi = (uint64_t)i * 7};
}

/* A region a client would register (T0 or staging): a sealed memfd; returns its buffer id. */
static uint32_t
buf_register(struct kvtd_session *s, uint64_t bytes)
{
	struct kvt_dev_import imp = {.kind = KVT_BUF_HOST_MEMFD, .size = bytes};
	struct kvt_dev_buf *buf;
	int r;

	imp.fd = memfd_create("fuzz-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (imp.fd < 0 || ftruncate(imp.fd, (off_t)bytes) < 0 ||
	    fcntl(imp.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0 ||
	    kvt_dev_buf_import(D.dev, &imp, &buf) < 0)
		die("buffer");
	close(imp.fd);
	r = kvtd_session_buf_register(s, buf);
	if (r <= 0)
		die("buffer registration");
	return (uint32_t)r;
}

/* Submits @e (stamp set here) and drains; the CQE must come back with its user_data. */
static struct kvt_cqe
submit(struct kvtd_session *s, const struct kvt_sqe *e)
{
	uint32_t tail = kvt_ring_prod_tail_relaxed(s->sq), head = kvt_ring_load_head(s->cq);
	struct kvt_sqe *slot = &s->sqes[tail & (s->sq_entries - 1)];
	struct kvt_cqe cqe;

	*slot = *e;
	kvt_ring_store_stamp(&slot->stamp, tail);
	kvt_ring_store_tail(s->sq, tail + 1);
	if (kvtd_session_drain(s, 0) != 1 || kvt_ring_load_tail(s->cq) != head + 1)
		die("an SQE was not answered");
	cqe = s->cqes[head & (s->cq_entries - 1)];
	kvt_ring_store_head(s->cq, head + 1);
	if (cqe.user_data != e->user_data)
		die("a CQE lost its user_data");
	answered[e->opcode < KVT_OP__COUNT ? e->opcode : KVT_OP__COUNT][cqe.res >= 0]++;
	return cqe;
}

/* A sequence every opcode can work on, with a T0 region (APPEND from slots, RETIER's
 * promotions) and a staging region (FETCH, TOPK's rows): id 1. */
static void
open_seq(struct kvtd_session *s)
{
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = 2,
				   .kv_heads = 2,
				   .q_heads = 4,
				   .head_dim = 64,
				   .dtype = KVT_DTYPE_F16,
				   .delta = 16,
				   .sinks = 4,
				   .window = 16,
				   .hbm_frac = 0.5f,
				   .t2_frac = 0.25f,
				   .ret_update = 16,
				   .t0_slots = T0_SLOTS,
				   .t0_slot_stride = 256,
				   .t0_kv_stride = T0_SLOTS * 256,
				   .t0_layer_stride = 2 * T0_SLOTS * 256,
				   .stage_slots = STAGE_ROWS,
				   .stage_slot_stride = 256,
				   .stage_kv_stride = STAGE_ROWS * 256,
				   .stage_layer_stride = 2 * STAGE_ROWS * 256};
	struct kvt_ns_params np = base_ns();
	struct kvt_sqe e = {.opcode = KVT_OP_NS_OPEN, .arena_len = sizeof(np)};
	uint32_t ntok = 96, len = ntok * 2 * 2 * 2 * 64 * 2;
	uint16_t *rows = (uint16_t *)s->arena;

	memcpy(s->arena, &np, sizeof(np));
	if (submit(s, &e).res != 1)
		die("NS_OPEN of the base namespace failed");
	p.t0_buf_id = buf_register(s, T0_BYTES);
	p.stage_buf_id = buf_register(s, STAGE_BYTES);
	memcpy(s->arena, &p, sizeof(p));
	e = (struct kvt_sqe){.opcode = KVT_OP_SEQ_OPEN, .arena_len = sizeof(p), .ns = 1};
	if (submit(s, &e).res != 1)
		die("SEQ_OPEN of the base sequence failed");
	for (uint32_t i = 0; i < len / 2; i++)
		rows[i] =
		    (uint16_t)(0x3000 + (i * 2654435761u >> 20) % 0x0c00); /* f16 in ~[0.1, 2) */
	e = (struct kvt_sqe){.opcode = KVT_OP_APPEND, .seq = 1, .arena_len = len, .count = ntok};
	if (submit(s, &e).res != (int)ntok)
		die("APPEND of the base sequence failed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int ready;
	struct kvtd_session *s;
	struct kvtd_pool_usage u0, u1;

	if (!ready) {
		if (daemon_init() < 0)
			die("pool");
		ready = 1;
	}
	kvtd_pool_usage(&D.pool, &u0);
	if (kvtd_session_create(&D, 16, 32, ARENA, &s) < 0)
		die("session");
	s->sock = -1;
	open_seq(s);
	while (size >= 2 + sizeof(struct kvt_sqe)) {
		size_t alen = ((size_t)data[0] | (size_t)data[1] << 8) * 16;
		struct kvt_sqe e;

		memcpy(&e, data + 2, sizeof(e));
		data += 2 + sizeof(e);
		size -= 2 + sizeof(e);
		if (alen > size)
			alen = size;
		memcpy(s->arena, data, alen);
		data += alen;
		size -= alen;
		fuzzed++;
		submit(s, &e);
	}
	kvtd_session_destroy(s);
	kvtd_prefix_reclaim(&D.prefix, UINT64_MAX); /* only a leaked reference keeps one */
	kvtd_pool_usage(&D.pool, &u1);
	if (u1.used != u0.used || D.prefix.n_blocks)
		die("pool bytes not given back");
	return 0;
}

#ifndef KVT_LIBFUZZER
/* ---- the plain driver: inputs from a generator that knows the layout ---- */

static uint64_t rng;
static unsigned max_sqes = 12; /* per input; long runs raise it (KVT_FUZZ_SQES) */

static uint32_t
rnd(void)
{
	return (uint32_t)(kvt_test_xorshift(&rng) >> 32);
}

/* Small numbers, edges, and now and then anything. */
static uint64_t
num(void)
{
	static const uint64_t edge[] = {
	    0,	      1,	  2,	       15,	   16,	       17,	  63,
	    64,	      96,	  255,	       256,	   4095,       4096,	  65535,
	    1u << 20, 0x7fffffff, 0x80000000u, UINT32_MAX, UINT64_MAX, 1ull << 40};

	switch (rnd() % 4) {
	case 0:
		return rnd() % 8;
	case 1:
		return rnd() % 200;
	case 2:
		return edge[rnd() % (sizeof(edge) / sizeof(edge[0]))];
	default:
		return (uint64_t)rnd() << 32 | rnd();
	}
}

static float
fval(void)
{
	static const float odd[] = {NAN, INFINITY, -INFINITY, -0.0f, 1e30f, -1.0f};

	return rnd() % 32 ? (float)(rnd() % 1000) / 1000.0f : odd[rnd() % 6];
}

/* One request as a client would build it for the base sequence (or a new one), into @e and
 * @pay; returns the payload's length. */
static size_t
gen_request(struct kvt_sqe *e, uint8_t *pay)
{
	static const uint16_t odd16[] = {0x7c00, 0xfc00, 0x7e00, 0x8000, 0x7bff};
	uint32_t req_len =
	    0; /* TOPK's request form: arena_len is the request's, not the payload's */
	size_t len = 0;

	memset(e, 0, sizeof(*e));
	e->opcode = (uint8_t)(rnd() % KVT_OP__COUNT);
	e->user_data = (uint64_t)rnd() << 32 | rnd();
	if (e->opcode == KVT_OP_SEQ_CLOSE) /* the ones SEQ_OPEN made, the base one rarely */
		e->seq = rnd() % 16 ? 2 + rnd() % 4 : 1;
	else if (e->opcode != KVT_OP_NOP && e->opcode != KVT_OP_SEQ_OPEN)
		e->seq = rnd() % 8 ? 1 : 1 + rnd() % 4;
	switch (e->opcode) {
	case KVT_OP_SEQ_OPEN: {
		static const uint16_t dims[] = {64, 128, 8, 96};
		struct kvt_seq_params p = {.size = sizeof(p)};

		p.layers = (uint16_t)(1 + rnd() % 3);
		p.kv_heads = (uint16_t)(1 + rnd() % 3);
		p.q_heads = (uint16_t)(rnd() % 2 ? 0 : p.kv_heads * (1 + rnd() % 3));
		p.head_dim = dims[rnd() % 4];
		p.dtype = (uint8_t)(rnd() % KVT_DTYPE__COUNT);
		p.policy = (uint8_t)(rnd() % KVT_POLICY__COUNT);
		p.score_mode = (uint8_t)(rnd() % KVT_SCORE__COUNT);
		p.delta = 1 + rnd() % 32;
		p.sinks = rnd() % 8;
		p.window = rnd() % 32;
		p.hbm_frac = fval();
		p.evict_frac = rnd() % 2 ? 0.0f : fval() / 4;
		p.t2_frac = rnd() % 2 ? 0.0f : fval() / 2;
		p.t2_flags = rnd() % 4 ? 0 : KVT_T2_F_KEY_CHANNEL;
		p.ret_update = rnd() % 2 ? 0 : 8 << rnd() % 3;
		if (rnd() % 3 == 0) { /* in a namespace, from pinned blocks: the base geometry */
			p.layers = 2;
			p.kv_heads = 2;
			p.head_dim = 64;
			p.dtype = KVT_DTYPE_F16;
			e->ns = rnd() % 8 ? 1 : rnd() % 4;
			e->prefix_blocks = rnd() % 5;
		}
		memcpy(pay, &p, sizeof(p));
		len = sizeof(p);
		break;
	}
	case KVT_OP_NS_OPEN: {
		static const uint32_t bts[] = {0, 16, 4, 1, KVT_BLOCK_TOKENS_MAX + 1};
		struct kvt_ns_params np = base_ns();

		np.block_tokens = bts[rnd() % 5];
		if (rnd() % 4 == 0)
			np.name[rnd() % sizeof(np.name)] = (char)rnd();
		if (rnd() % 4 == 0)
			np.head_dim = (uint16_t)num();
		memcpy(pay, &np, sizeof(np));
		len = sizeof(np);
		e->seq = 0;
		break;
	}
	case KVT_OP_NS_CLOSE:
		e->seq = 0;
		e->ns = 2 + rnd() % 4; /* the base one rarely: below */
		if (!(rnd() % 16))
			e->ns = 1;
		break;
	case KVT_OP_LOOKUP:
	case KVT_OP_PUBLISH: { /* keys from a small set, mostly in order: hits and misses */
		uint32_t n = 1 + rnd() % 8, first = rnd() % 3;

		for (uint32_t i = 0; i < n; i++) {
			struct kvt_block_key k = fkey(rnd() % 8 ? first + i : rnd() % 16);

			memcpy(pay + 16 * i, &k, 16);
		}
		len = 16 * (size_t)n;
		e->count = n;
		if (e->opcode == KVT_OP_LOOKUP) {
			e->seq = 0;
			e->ns = rnd() % 8 ? 1 : rnd() % 5;
			e->op_flags = rnd() % 2 ? KVT_LOOKUP_F_PIN : (uint16_t)(rnd() % 4);
		}
		break;
	}
	case KVT_OP_APPEND: { /* base sequence: rows inline (1 KiB a token), or T0 slots */
		uint32_t ntok = 1 + rnd() % 16;

		e->count = ntok;
		if (rnd() % 4 == 0) {
			e->op_flags = KVT_APPEND_F_T0;
			for (uint32_t i = 0; i < ntok; i++) {
				uint32_t slot = rnd() % (T0_SLOTS + 8);

				memcpy(pay + 4 * i, &slot, 4);
			}
			len = 4 * (size_t)ntok;
			break;
		}
		len = (size_t)ntok * 1024;
		for (size_t i = 0; i < len; i += 2) {
			uint16_t h = rnd() % 64 ? (uint16_t)(rnd() % 0x7800) : odd16[rnd() % 5];

			memcpy(pay + i, &h, 2);
		}
		break;
	}
	case KVT_OP_SCORE_ADD: {
		uint32_t n = 1 + rnd() % 64;

		for (uint32_t i = 0; i < n; i++) {
			float f = rnd() % 64 ? (float)(rnd() % 1000) / 1000.0f : fval();

			memcpy(pay + 4 * i, &f, 4);
		}
		len = 4 * (size_t)n;
		e->count = n;
		e->arg0 = rnd() % 48;
		break;
	}
	case KVT_OP_RETIER:
		e->arena_len = rnd() % 4 ? 8192 : rnd() % 256;
		break;
	case KVT_OP_FETCH: { /* every T1 and/or T2 row, or a list of positions */
		static const uint16_t how[] = {KVT_FETCH_F_T1, KVT_FETCH_F_T2,
					       KVT_FETCH_F_T1 | KVT_FETCH_F_T2, KVT_FETCH_F_LIST};

		e->op_flags = rnd() % 8 ? how[rnd() % 4] : (uint16_t)(rnd() % 8);
		e->arg0 = rnd() % 3;
		e->arg1 = 1 + rnd() % 2;
		e->arg2 = rnd() % 4 ? 0 : rnd() % 300;
		if (e->op_flags & KVT_FETCH_F_LIST) {
			uint32_t n = 1 + rnd() % 64;

			for (uint32_t i = 0; i < n; i++) {
				uint32_t pos = rnd() % 120;

				memcpy(pay + 4 * i, &pos, 4);
			}
			len = 4 * (size_t)n;
			e->count = n;
		} else {
			e->arena_len = rnd() % 4 ? 1024 : 4 * (rnd() % 64); /* room for positions */
		}
		break;
	}
	case KVT_OP_TOPK: { /* query of q_heads 4 x 64 floats, output after it */
		for (uint32_t i = 0; i < 256; i++) {
			float f = (float)(rnd() % 2001) / 1000.0f - 1.0f;

			memcpy(pay + 4 * i, &f, 4);
		}
		if (!(rnd() % 16)) { /* now and then one value that is not a number */
			float f = fval() * NAN;

			memcpy(pay + 4 * (rnd() % 256), &f, 4);
		}
		len = 1024;
		e->op_flags = (uint16_t)(rnd() % 8);
		e->count = 1 + rnd() % 48;
		e->arg0 = rnd() % 3;
		e->arg1 = 1024;
		e->arg2 = rnd() % 4 ? 8192 : rnd() % 512;
		if (rnd() % 2) { /* ABI 1.5's form: a struct kvt_topk_req, query after it */
			struct kvt_topk_req r = {
			    .size = rnd() % 8 ? sizeof(r) : (uint32_t)num(),
			    .mode = rnd() % 8 ? rnd() % KVT_TOPK__MODES : (uint32_t)num(),
			    .flags = rnd() % 4 ? rnd() % 4 : (uint32_t)num(),
			    .layer = rnd() % 3,
			    .k = rnd() % 16 ? 1 + rnd() % 48 : (uint32_t)num(),
			    .query_off = 64,
			    .query_len = rnd() % 8 ? 1024 : (uint32_t)num(),
			    .out_len = rnd() % 4 ? 8192 : rnd() % 512,
			    .out_off = rnd() % 8 ? 1088 : num(),
			};

			if (r.mode == KVT_TOPK_PROBE || !(rnd() % 8))
				r.probe = rnd() % 4 ? 1 + rnd() % 256 : (uint32_t)num();
			if (!(rnd() % 8))
				r.reserved[rnd() % 2] = num();
			memmove(pay + 64, pay, 1024);
			memcpy(pay, &r, sizeof(r));
			len = 1088;
			e->op_flags = KVT_TOPK_F_REQ;
			e->count = 0;
			e->arg0 = e->arg1 = e->arg2 = 0;
			req_len = rnd() % 8 ? (uint32_t)sizeof(r) : rnd() % 128;
			if (!(rnd() % 8)) /* a newer client's longer request, its tail maybe set */
				pay[64 + rnd() % 8] = (uint8_t)(rnd() % 2);
		}
		break;
	}
	case KVT_OP_SEQ_STAT:
		e->arena_len = rnd() % 8 ? (uint32_t)sizeof(struct kvt_seq_stat) : rnd() % 64;
		break;
	default:
		break;
	}
	if (len)
		e->arena_len = req_len ? req_len : (uint32_t)len;
	/* one request in four gets one field from the edge-case list */
	if (!(rnd() % 4)) {
		uint64_t v = num();

		switch (rnd() % 11) {
		case 0:
			e->opcode = (uint8_t)v;
			break;
		case 1:
			e->flags = (uint8_t)v;
			break;
		case 2:
			e->op_flags = (uint16_t)v;
			break;
		case 3:
			e->seq = (uint32_t)v;
			break;
		case 4:
			e->arena_off = v;
			break;
		case 5:
			e->arena_len = (uint32_t)v;
			break;
		case 6:
			e->count = (uint32_t)v;
			break;
		case 7:
			e->arg0 = v;
			break;
		case 8:
			e->arg1 = v;
			break;
		case 9:
			e->arg2 = (uint32_t)v;
			break;
		default:
			e->buf_id = (uint32_t)v;
			break;
		}
	}
	return len;
}

static size_t
make_input(uint8_t *buf, size_t cap)
{
	static uint8_t pay[64 << 10];
	unsigned nsqe = 1 + rnd() % max_sqes;
	size_t n = 0;

	for (unsigned k = 0; k < nsqe; k++) {
		struct kvt_sqe e;
		size_t len = gen_request(&e, pay), units = (len + 15) / 16;

		if (n + 2 + sizeof(e) + units * 16 > cap)
			break;
		buf[n++] = (uint8_t)units;
		buf[n++] = (uint8_t)(units >> 8);
		memcpy(buf + n, &e, sizeof(e));
		n += sizeof(e);
		memset(pay + len, 0, units * 16 - len);
		memcpy(buf + n, pay, units * 16);
		n += units * 16;
	}
	return n;
}

/* fuzz_sqe [N] [seed]: run N generated inputs. fuzz_sqe --corpus DIR [N] [seed]: write them
 * to DIR as files instead, a seed corpus for the libFuzzer build. */
int
main(int argc, char **argv)
{
	const char *corpus = NULL;
	static uint8_t buf[256 << 10];
	unsigned long inputs;

	if (argc > 2 && !strcmp(argv[1], "--corpus")) {
		corpus = argv[2];
		argc -= 2;
		argv += 2;
	}
	inputs = argc > 1 ? strtoul(argv[1], NULL, 10) : 2000;
	rng = argc > 2 ? strtoull(argv[2], NULL, 10) : 0x9e3779b97f4a7c15ull;
	if (!rng)
		rng = 1;
	/* Longer sessions: more drained SQEs per set-up (a session, two buffers, 96 tokens). */
	if (getenv("KVT_FUZZ_SQES"))
		max_sqes = (unsigned)strtoul(getenv("KVT_FUZZ_SQES"), NULL, 10);
	if (!max_sqes)
		max_sqes = 12;
	for (unsigned long i = 0; i < inputs; i++) {
		size_t n = make_input(buf, sizeof(buf));

		if (corpus) {
			char path[4096];
			FILE *f;

			snprintf(path, sizeof(path), "%s/gen-%06lu", corpus, i);
			f = fopen(path, "wb");
			if (!f || fwrite(buf, 1, n, f) != n || fclose(f)) {
				perror(path);
				return 1;
			}
			continue;
		}
		LLVMFuzzerTestOneInput(buf, n);
	}
	if (corpus) {
		printf("fuzz_sqe: %lu inputs written to %s\n", inputs, corpus);
		return 0;
	}
	printf("fuzz_sqe: %lu inputs, %lu fuzzed SQEs, every SQE answered, every pool byte back\n",
	       inputs, fuzzed);
	printf("answers (ok / failed) by opcode:");
	for (int op = 0; op <= KVT_OP__COUNT; op++)
		printf(" %d: %lu / %lu", op, answered[op][1], answered[op][0]);
	printf(" (%d: unknown)\n", KVT_OP__COUNT);
	return 0;
}
#endif
