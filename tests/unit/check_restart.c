/* SPDX-License-Identifier: MIT */
/*
 * The restart image reader (daemon/restart.c): an image of the current version parses; one of
 * another version or magic, with a wrong checksum, cut short, with bytes left over, or whose
 * fields contradict themselves (a descriptor number below 3, an impossible count) is refused as
 * a whole, so that the new process never guesses at an old one's state.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_abi.h"
#include "restart_image.h"
#include "kvt_test.h"

struct img {
	uint8_t b[8192];
	size_t n;
};

static void
put(struct img *m, const void *v, size_t n)
{
	ck_assert_uint_le(m->n + n, sizeof(m->b));
	memcpy(m->b + m->n, v, n);
	m->n += n;
}

static void
put32(struct img *m, uint32_t v)
{
	put(m, &v, 4);
}

static void
put64(struct img *m, uint64_t v)
{
	put(m, &v, 8);
}

/* The image version begin() and session_conn() write (1: no prefix store). */
static uint32_t ver = KVTD_IMAGE_VERSION;

/* Version 2's prefix store: one namespace (id 1, 2 tokens a block) with one block. */
static void
prefix_part(struct img *m, uint32_t blk_ns)
{
	struct kvt_ns_params np = {.size = sizeof(np),
				   .layers = 1,
				   .kv_heads = 1,
				   .head_dim = 16,
				   .dtype = KVT_DTYPE_F32,
				   .block_tokens = 2,
				   .name = "m"};
	struct kvt_block_key k = {1, 2};

	put32(m, 1); /* namespaces */
	put32(m, 1); /* blocks */
	for (int i = 0; i < 7; i++)
		put64(m, 0); /* store counters */
	put32(m, 1);	     /* ns id */
	put32(m, 0);
	put64(m, 1001); /* scope */
	put(m, &np, sizeof(np));
	for (int i = 0; i < 6; i++)
		put64(m, 0);
	put32(m, blk_ns); /* the block's namespace (index) */
	put32(m, 0);
	put(m, &k, sizeof(k));
	put64(m, 1 << 20);
	put64(m, (1 << 20) + 4096);
}

/* A zeroed header, which finish() fills in, then the daemon fields (restart.c, image_write()). */
static void
begin(struct img *m, uint32_t n_conns)
{
	struct kvtd_image_hdr h;

	memset(&h, 0, sizeof(h));

	m->n = 0;
	put(m, &h, sizeof(h));
	put32(m, 7);		     /* next_session_id */
	put32(m, 1);		     /* restarts */
	put64(m, 1000);		     /* start_ns */
	put64(m, 2000);		     /* restart_started_ns */
	put64(m, 5);		     /* restart_req_id */
	put32(m, 10);		     /* listen_fd */
	put32(m, 11);		     /* lock_fd */
	put64(m, 1);		     /* sock_dev */
	put64(m, 2);		     /* sock_ino */
	put32(m, 12);		     /* pool fd */
	put32(m, 0);		     /* hugetlb */
	put64(m, 64ull << 20);	     /* pool size */
	put64(m, 2ull << 20);	     /* chunk */
	put64(m, 0x7f0000000000ull); /* old base */
	for (int i = 0; i < 8; i++)
		put64(m, (uint64_t)i);
	if (ver >= 2)
		prefix_part(m, 0);
	put32(m, n_conns);
}

/* One session connection with one buffer and one sequence of @n positions. */
static void
session_conn(struct img *m, uint32_t n, int fd)
{
	struct kvt_seq_params p = {.size = sizeof(p)};
	char name[32] = "t";

	put32(m, (uint32_t)fd); /* conn fd */
	put32(m, 2);		/* CONN_SESSION */
	put32(m, 4242);
	put32(m, 1000);
	put32(m, 1000);
	put32(m, 0);
	put32(m, 0);
	put32(m, 1); /* has a session */
	put32(m, 3); /* id */
	put(m, name, sizeof(name));
	put64(m, 99);
	put32(m, 20); /* memfd, doorbells */
	put32(m, 21);
	put32(m, 22);
	put32(m, 256);
	put32(m, 512);
	put64(m, 1 << 20);
	put32(m, 5); /* sq_head, cq_tail, cq_head_seen, op_err_gen */
	put32(m, 5);
	put32(m, 5);
	put32(m, 8);
	put64(m, 5);
	put64(m, 0);
	put32(m, 1); /* bufs */
	put32(m, 1); /* seqs */
	put32(m, 1);
	put64(m, 4096);
	put32(m, 23);
	put32(m, 1); /* seq id */
	put(m, &p, sizeof(p));
	put32(m, n);
	put32(m, 3);
	put64(m, 0);
	put64(m, 0);
	put64(m, 0);
	for (uint32_t i = 0; i < ((n * 4 + 7) & ~7u) / 4; i++)
		put32(m, 0); /* scores */
	for (uint32_t i = 0; i < ((n * 4 + 7) & ~7u) / 4; i++)
		put32(m, (uint32_t)-1); /* pos_slot */
	for (uint32_t i = 0; i < n; i++)
		put64(m, 1 + (uint64_t)i * 4096); /* slot offsets */
	for (uint32_t i = 0; i < ((n + 7) & ~7u) / 4; i++)
		put32(m, 0x01010101); /* tiers: T1 */
	if (ver < 2)
		return;
	put32(m, 1); /* the sequence's namespace, and its positions' blocks */
	put32(m, 0);
	for (uint32_t i = 0; i < ((n * 4 + 7) & ~7u) / 4; i++)
		put32(m, i < 2 ? 1 : 0);
	put64(m, 1001); /* the session's scope, its namespace handles */
	for (int h = 0; h < KVT_MAX_NS; h++) {
		put32(m, h == 0 ? 1 : 0);
		put32(m, h == 0 ? 1 : 0);
		if (h == 0) {
			put32(m, 0); /* a pin on block 0 */
			put32(m, 0);
		}
	}
}

static void
finish(struct img *m, uint32_t version)
{
	struct kvtd_image_hdr h;

	memset(&h, 0, sizeof(h));

	memcpy(h.magic, KVTD_IMAGE_MAGIC, sizeof(KVTD_IMAGE_MAGIC));
	h.version = version;
	h.hdr_size = sizeof(h);
	strcpy(h.daemon_version, "test");
	h.size = m->n;
	h.checksum = kvtd_image_checksum(m->b + sizeof(h), m->n - sizeof(h));
	memcpy(m->b, &h, sizeof(h));
}

static int
parse(const struct img *m, size_t len)
{
	struct kvtd_image *img = NULL;
	int r = kvtd_image_parse(m->b, len, &img);

	if (r == 0) {
		ck_assert_ptr_nonnull(img);
		r = (int)kvtd_image_sessions(img);
		kvtd_image_free(img);
	}
	return r;
}

/* This version's images, and version 1's (no prefix store), which an upgrade reads. */
START_TEST(t_parse_valid)
{
	struct img m;

	for (ver = 1; ver <= KVTD_IMAGE_VERSION; ver++) {
		begin(&m, 0);
		finish(&m, ver);
		ck_assert_int_eq(parse(&m, m.n), 0);
		begin(&m, 2);
		session_conn(&m, 5, 30);
		session_conn(&m, 0, 31);
		finish(&m, ver);
		ck_assert_int_eq(parse(&m, m.n), 2);
	}
	ver = KVTD_IMAGE_VERSION;
	/* version 2's records read as version 1: bytes left over */
	begin(&m, 1);
	session_conn(&m, 5, 30);
	finish(&m, 1);
	ck_assert_int_eq(parse(&m, m.n), -EBADMSG);
}
END_TEST

START_TEST(t_parse_refused)
{
	struct img m;
	uint8_t save;

	/* another version, whatever the rest says */
	begin(&m, 1);
	session_conn(&m, 5, 30);
	finish(&m, KVTD_IMAGE_VERSION + 1);
	ck_assert_int_eq(parse(&m, m.n), -EPROTONOSUPPORT);
	/* another magic */
	finish(&m, KVTD_IMAGE_VERSION);
	m.b[0] ^= 0x20;
	ck_assert_int_eq(parse(&m, m.n), -EPROTONOSUPPORT);
	m.b[0] ^= 0x20;
	ck_assert_int_eq(parse(&m, m.n), 1);
	/* one byte changed anywhere in the body */
	for (size_t at = sizeof(struct kvtd_image_hdr); at < m.n; at += 37) {
		save = m.b[at];
		m.b[at] ^= 0x40;
		ck_assert_int_eq(parse(&m, m.n), -EBADMSG);
		m.b[at] = save;
	}
	/* cut short, and shorter than a header */
	ck_assert_int_eq(parse(&m, m.n - 1), -EBADMSG);
	ck_assert_int_eq(parse(&m, 10), -EBADMSG);
	/* well-formed checksum over contradicting fields: the count says 2, one follows */
	begin(&m, 2);
	session_conn(&m, 5, 30);
	finish(&m, KVTD_IMAGE_VERSION);
	ck_assert_int_eq(parse(&m, m.n), -EBADMSG);
	/* bytes left over */
	begin(&m, 0);
	put32(&m, 0);
	finish(&m, KVTD_IMAGE_VERSION);
	ck_assert_int_eq(parse(&m, m.n), -EBADMSG);
	/* a descriptor number that cannot have been inherited (stdin) */
	begin(&m, 1);
	session_conn(&m, 2, 0);
	finish(&m, KVTD_IMAGE_VERSION);
	ck_assert_int_eq(parse(&m, m.n), -EBADMSG);
	/* a block of a namespace the image does not have */
	m.n = 0;
	{
		struct kvtd_image_hdr h = {0};

		put(&m, &h, sizeof(h));
	}
	begin(&m, 0);
	m.n -= 4 + (4 + 4 + 16 + 16); /* back to the block record */
	put32(&m, 5);
	put32(&m, 0);
	put64(&m, 1);
	put64(&m, 2);
	put64(&m, 0);
	put64(&m, 4096);
	put32(&m, 0);
	finish(&m, KVTD_IMAGE_VERSION);
	ck_assert_int_eq(parse(&m, m.n), -EBADMSG);
	/* a sequence longer than any could be (version 1: the count sits 64 bytes from the end) */
	ver = 1;
	begin(&m, 1);
	session_conn(&m, 1, 30);
	{
		/* n, gen, bytes in/out, score total (32 bytes), then 4 arrays of 8 bytes at n = 1
		 */
		uint32_t huge = 0x80000000u;

		memcpy(m.b + m.n - 64, &huge, 4);
	}
	finish(&m, 1);
	ck_assert_int_eq(parse(&m, m.n), -EBADMSG);
	ver = KVTD_IMAGE_VERSION;
}
END_TEST

KVT_CHECK_MAIN("restart", 0, NULL, NULL, t_parse_valid, t_parse_refused)
