/* SPDX-License-Identifier: MIT */
/*
 * The restart image (daemon/restart_image.c): an image of the current version parses; one of
 * another version or magic, with a wrong checksum, cut short, with bytes left over, or whose
 * fields contradict themselves (a descriptor number below 3, an impossible count) is refused as
 * a whole, so that the new process never guesses at an old one's state.
 *
 * The writer and the reader cannot drift: every record, its fields set to values no other field
 * has, is written and read back equal, field by field, from its table (a field added to a record
 * is covered without a test change); a writer whose table has a field more or less than the
 * reader's fails that comparison; a whole image written from records and read back gives the
 * same records; and the writer, given the records of the hand-written images below (the format
 * as the previous releases write and read it), writes those bytes exactly.
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
		put32(m, i < n ? (uint32_t)-1 : 0); /* pos_slot, padded with zeros */
	for (uint32_t i = 0; i < n; i++)
		put64(m, 1 + (uint64_t)i * 4096); /* slot offsets */
	for (uint32_t i = 0; i < ((n + 7) & ~7u); i++) {
		uint8_t t1 = i < n ? 1 : 0; /* tiers: T1, padded with zeros */

		put(m, &t1, 1);
	}
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

/* ---- the tables: writer and reader from one description -------------------------------- */

/* Field @i of a record filled with a value no other field of it has (@seed tells records
 * apart), in its kind's range. */
static void
fill_field(const struct img_field *f, uint8_t *rec, unsigned i, unsigned seed)
{
	uint8_t *p = rec + f->off;
	uint64_t v = 1000ull * seed + 10 * i + 3;

	switch (f->kind) {
	case IMG_U:
		if (f->max)
			v = 1 + v % f->max;
		if (f->size == 8)
			v |= (uint64_t)(seed + i + 1) << 40; /* the high half matters too */
		memcpy(p, &v, f->size);
		break;
	case IMG_FD:
	case IMG_FLAGS: {
		uint32_t w = f->kind == IMG_FD ? (uint32_t)v : (uint32_t)f->max;

		memcpy(p, &w, 4);
		break;
	}
	case IMG_PAD:
		memset(p, 0, f->size);
		break;
	case IMG_STR:
	case IMG_BYTES:
		for (uint32_t k = 0; k < f->size; k++)
			p[k] = (uint8_t)(seed * 31 + i * 7 + k + 1);
		if (f->kind == IMG_STR)
			p[f->size - 1] = '\0';
		break;
	}
}

static void
fill_rec(const struct img_rec *t, void *rec, unsigned seed)
{
	memset(rec, 0, t->size);
	for (unsigned i = 0; i < t->n; i++)
		fill_field(&t->f[i], rec, i, seed);
}

/* The first field of @t that differs between @a and @b, or NULL. */
static const char *
rec_diff(const struct img_rec *t, const void *a, const void *b)
{
	for (unsigned i = 0; i < t->n; i++)
		if (t->f[i].kind != IMG_PAD &&
		    memcmp((const uint8_t *)a + t->f[i].off, (const uint8_t *)b + t->f[i].off,
			   t->f[i].size))
			return t->f[i].name;
	return NULL;
}

static size_t
rec_bytes(const struct img_rec *t)
{
	size_t n = 0;

	for (unsigned i = 0; i < t->n; i++)
		n += t->f[i].size;
	return n;
}

/*
 * Two records of @rt's type (each filled as fill_rec() does) written one after the other with
 * the writer's table @wt, and read back with the reader's @rt. Returns 0 when both come back
 * equal, field by field, and the reader took exactly the bytes written; else 1 (@why says what).
 */
static int
roundtrip(const struct img_rec *wt, const struct img_rec *rt, uint32_t version, char *why,
	  size_t why_len)
{
	uint8_t in[2][512], out[2][512], buf[2048];
	size_t wpos = 0, rpos = 0;
	const char *f;
	int r = 0;

	ck_assert_uint_le(wt->size, sizeof(in[0]));
	ck_assert_uint_le(rt->size, sizeof(in[0]));
	for (int k = 0; k < 2; k++) {
		fill_rec(wt, in[k], 1 + k);
		ck_assert_int_eq(kvtd_image_rec_io(wt, in[k], 1, version, buf, sizeof(buf), &wpos),
				 0);
	}
	if (rt->since <= version && wpos != 2 * rec_bytes(wt)) {
		snprintf(why, why_len, "%zu bytes written", wpos);
		return 1;
	}
	for (int k = 0; k < 2 && !r; k++) {
		memset(out[k], 0x5a, sizeof(out[k]));
		r = kvtd_image_rec_io(rt, out[k], 0, version, buf, wpos, &rpos);
		if (r) {
			snprintf(why, why_len, "record %d refused: %d", k, r);
			return 1;
		}
		/* a record newer than the image reads as zeros */
		if (rt->since > version)
			memset(in[k], 0, sizeof(in[k]));
		if ((f = rec_diff(rt, in[k], out[k]))) {
			snprintf(why, why_len, "record %d: %s.%s differs", k, rt->name, f);
			return 1;
		}
	}
	if (rpos != wpos) {
		snprintf(why, why_len, "%zu of %zu bytes read", rpos, wpos);
		return 1;
	}
	return 0;
}

/* Every record's table describes its struct: fields in the struct's order, apart, inside it,
 * named once; and no record is newer than the image version written. */
START_TEST(t_tables_describe_records)
{
	for (unsigned k = 0; k < kvtd_img_n_recs; k++) {
		const struct img_rec *t = kvtd_img_recs[k];

		ck_assert_uint_gt(t->n, 0);
		ck_assert_uint_ge(t->since, 1);
		ck_assert_uint_le(t->since, KVTD_IMAGE_VERSION);
		for (unsigned i = 0; i < t->n; i++) {
			const struct img_field *f = &t->f[i];

			ck_assert_msg(f->size > 0 && f->off + f->size <= t->size, "%s.%s", t->name,
				      f->name);
			if (i)
				ck_assert_msg(f->off >= t->f[i - 1].off + t->f[i - 1].size,
					      "%s.%s overlaps or is out of order", t->name,
					      f->name);
			if (f->kind == IMG_FD || f->kind == IMG_FLAGS || f->kind == IMG_PAD)
				ck_assert_msg(f->size == 4, "%s.%s", t->name, f->name);
			if (f->kind == IMG_U)
				ck_assert_msg(f->size == 4 || f->size == 8, "%s.%s", t->name,
					      f->name);
			for (unsigned j = 0; j < i; j++)
				ck_assert_msg(strcmp(f->name, t->f[j].name), "%s.%s twice", t->name,
					      f->name);
		}
	}
}
END_TEST

/* Each record, each image version: written and read back, every field equal. */
START_TEST(t_records_roundtrip)
{
	char why[128];

	for (uint32_t v = 1; v <= KVTD_IMAGE_VERSION; v++)
		for (unsigned k = 0; k < kvtd_img_n_recs; k++)
			ck_assert_msg(
			    !roundtrip(kvtd_img_recs[k], kvtd_img_recs[k], v, why, sizeof(why)),
			    "%s, version %u: %s", kvtd_img_recs[k]->name, v, why);
}
END_TEST

/*
 * A writer and a reader that drifted apart: the writer's table with one field more than the
 * reader's (at each place in turn), or one field less. Every such pair fails the round trip
 * t_records_roundtrip runs, for every record: a field added on one side only cannot pass.
 */
START_TEST(t_drift_fails)
{
	struct img_field more[64], less[64];
	const struct img_field added = {"added", 0, 4, IMG_U, 0};
	char why[128];

	for (unsigned k = 0; k < kvtd_img_n_recs; k++) {
		const struct img_rec *t = kvtd_img_recs[k];
		struct img_rec wt = *t;

		ck_assert_uint_lt(t->n, 64);
		for (unsigned at = 0; at <= t->n; at++) {
			/* one more: a u32 where the struct has room (the record's first bytes) */
			memcpy(more, t->f, at * sizeof(*more));
			more[at] = added;
			memcpy(more + at + 1, t->f + at, (t->n - at) * sizeof(*more));
			wt.f = more;
			wt.n = t->n + 1;
			ck_assert_msg(roundtrip(&wt, t, KVTD_IMAGE_VERSION, why, sizeof(why)),
				      "%s: a field added to the writer at %u passed", t->name, at);
			ck_assert_msg(roundtrip(t, &wt, KVTD_IMAGE_VERSION, why, sizeof(why)),
				      "%s: a field added to the reader at %u passed", t->name, at);
			if (at == t->n)
				continue;
			/* one less */
			memcpy(less, t->f, at * sizeof(*less));
			memcpy(less + at, t->f + at + 1, (t->n - at - 1) * sizeof(*less));
			wt.f = less;
			wt.n = t->n - 1;
			ck_assert_msg(roundtrip(&wt, t, KVTD_IMAGE_VERSION, why, sizeof(why)),
				      "%s: %s left out by the writer passed", t->name,
				      t->f[at].name);
		}
	}
}
END_TEST

/* ---- whole images ------------------------------------------------------------------------ */

/* A source that gives the blocks and connections of a parsed (or built) image. */
static int
tree_blk(void *ctx, uint32_t i, struct img_blk *b)
{
	*b = ((struct kvtd_image *)ctx)->blk[i];
	return 0;
}

static int
tree_conn(void *ctx, uint32_t i, struct img_conn *c)
{
	*c = ((struct kvtd_image *)ctx)->conns[i];
	return 0;
}

static void
tree_conn_done(void *ctx, struct img_conn *c)
{
	(void)ctx;
	(void)c;
}

static void
encode(struct kvtd_image *img, uint32_t version, uint8_t **ret_buf, size_t *ret_len)
{
	struct img_src src = {img, tree_blk, tree_conn, tree_conn_done};

	ck_assert_int_eq(kvtd_image_encode(img, &src, version, ret_buf, ret_len), 0);
}

#define REC_EQ(t, a, b, what)                                                                      \
	do {                                                                                       \
		const char *f_ = rec_diff(&(t), (a), (b));                                         \
		ck_assert_msg(!f_, "%s: %s.%s differs", (what), (t).name, f_);                     \
	} while (0)

/* Every record and array of @a and @b equal (@b as read from an image of @version). */
static void
image_eq(const struct kvtd_image *a, const struct kvtd_image *b, uint32_t version)
{
	REC_EQ(img_rec_daemon, &a->d, &b->d, "daemon");
	REC_EQ(img_rec_prefix, &a->px, &b->px, "prefix");
	REC_EQ(img_rec_conns, &a->nc, &b->nc, "conns");
	for (uint32_t i = 0; i < a->px.n_ns; i++)
		REC_EQ(img_rec_ns, &a->ns[i].f, &b->ns[i].f, "ns");
	for (uint32_t i = 0; i < a->px.n_blk; i++) {
		REC_EQ(img_rec_blk, &a->blk[i].f, &b->blk[i].f, "blk");
		ck_assert_mem_eq(a->blk[i].off, b->blk[i].off,
				 8 * a->ns[a->blk[i].f.ns].f.p.block_tokens);
	}
	for (uint32_t i = 0; i < a->nc.n_conns; i++) {
		const struct img_conn *x = &a->conns[i], *y = &b->conns[i];

		REC_EQ(img_rec_conn, &x->f, &y->f, "conn");
		if (!x->f.has_session)
			continue;
		REC_EQ(img_rec_session, &x->s, &y->s, "session");
		for (uint32_t k = 0; k < x->s.n_bufs; k++)
			REC_EQ(img_rec_buf, &x->bufs[k], &y->bufs[k], "buf");
		for (uint32_t k = 0; k < x->s.n_seqs; k++) {
			const struct img_seq *p = &x->seqs[k], *q = &y->seqs[k];
			uint32_t n = p->f.n;

			REC_EQ(img_rec_seq, &p->f, &q->f, "seq");
			ck_assert_mem_eq(p->score, q->score, 4 * n);
			ck_assert_mem_eq(p->pos_slot, q->pos_slot, 4 * n);
			ck_assert_mem_eq(p->slot_off, q->slot_off, 8 * n);
			ck_assert_mem_eq(p->tier, q->tier, n);
			if (version < 2) {
				ck_assert_uint_eq(q->v2.ns_id, 0);
				ck_assert_uint_eq(q->v2.flags, 0);
				continue;
			}
			REC_EQ(img_rec_seq_v2, &p->v2, &q->v2, "seq");
			if (p->v2.ns_id)
				ck_assert_mem_eq(p->blk_idx, q->blk_idx, 4 * n);
		}
		if (version < 2) {
			ck_assert_uint_eq(y->v2.prefix_scope, 0);
			for (int h = 0; h < KVT_MAX_NS; h++)
				ck_assert_uint_eq(y->nsh[h].f.ns_id, 0);
			continue;
		}
		REC_EQ(img_rec_session_v2, &x->v2, &y->v2, "session");
		for (int h = 0; h < KVT_MAX_NS; h++) {
			REC_EQ(img_rec_nsh, &x->nsh[h].f, &y->nsh[h].f, "nsh");
			if (x->nsh[h].f.n_pins)
				ck_assert_mem_eq(x->nsh[h].pins, y->nsh[h].pins,
						 4 * x->nsh[h].f.n_pins);
		}
	}
}

/*
 * A whole image built from records whose every field has its own value: two namespaces (2 and 3
 * tokens a block) and three blocks; a connection without a session, one whose session has two
 * buffers, a sequence with a namespace and one without, and pins on two handles, and one whose
 * session has nothing. Written and read back in every version, it gives the same records (those
 * newer than the version as zeros).
 */
START_TEST(t_image_roundtrip)
{
	static uint8_t arrays[4096];
	static uint32_t pins[2][3] = {{0, 2, 1}, {2, 0, 0}};
	struct img_ns ns[2];
	struct img_blk blk[3];
	struct img_buf_f bufs[2];
	struct img_seq seqs[2];
	struct img_conn conns[3];
	struct kvtd_image img;
	unsigned seed = 1;

	for (size_t i = 0; i < sizeof(arrays); i++)
		arrays[i] = (uint8_t)(i * 13 + 5);
	memset(&img, 0, sizeof(img));
	memset(conns, 0, sizeof(conns));
	fill_rec(&img_rec_daemon, &img.d, seed++);
	fill_rec(&img_rec_prefix, &img.px, seed++);
	img.px.n_ns = 2;
	img.px.n_blk = 3;
	img.ns = ns;
	img.blk = blk;
	img.conns = conns;
	img.nc.n_conns = 3;
	for (int i = 0; i < 2; i++) {
		fill_rec(&img_rec_ns, &ns[i].f, seed++);
		ns[i].f.p.block_tokens = 2 + i;
	}
	for (int i = 0; i < 3; i++) {
		fill_rec(&img_rec_blk, &blk[i].f, seed++);
		blk[i].f.ns = i % 2;
		blk[i].off = arrays + 100 * i;
	}
	for (int i = 0; i < 3; i++) {
		fill_rec(&img_rec_conn, &conns[i].f, seed++);
		conns[i].f.has_session = i > 0;
		fill_rec(&img_rec_session, &conns[i].s, seed++);
		fill_rec(&img_rec_session_v2, &conns[i].v2, seed++);
		conns[i].s.n_bufs = 0;
		conns[i].s.n_seqs = 0;
	}
	conns[1].s.n_bufs = 2;
	conns[1].s.n_seqs = 2;
	conns[1].bufs = bufs;
	conns[1].seqs = seqs;
	for (int i = 0; i < 2; i++) {
		fill_rec(&img_rec_buf, &bufs[i], seed++);
		fill_rec(&img_rec_seq, &seqs[i].f, seed++);
		fill_rec(&img_rec_seq_v2, &seqs[i].v2, seed++);
		seqs[i].f.n = 5 + 2 * i;
		seqs[i].score = (const float *)(const void *)(arrays + 400);
		seqs[i].pos_slot = (const int32_t *)(const void *)(arrays + 500);
		seqs[i].slot_off = (const uint64_t *)(const void *)(arrays + 600);
		seqs[i].tier = arrays + 700 + i;
		seqs[i].blk_idx = (const uint32_t *)(const void *)(arrays + 800);
	}
	seqs[1].v2.ns_id = 0;
	for (int h = 0; h < 2; h++) {
		fill_rec(&img_rec_nsh, &conns[1].nsh[h * 5].f, seed++);
		conns[1].nsh[h * 5].f.n_pins = 3 - 2 * h;
		conns[1].nsh[h * 5].pins = pins[h];
	}

	for (uint32_t v = 1; v <= KVTD_IMAGE_VERSION; v++) {
		struct kvtd_image *got = NULL;
		uint8_t *buf;
		size_t len;

		encode(&img, v, &buf, &len);
		ck_assert_int_eq(kvtd_image_parse(buf, len, &got), 0);
		ck_assert_uint_eq(got->img_version, v);
		if (v < 2) {
			ck_assert_uint_eq(got->px.n_ns, 0);
			ck_assert_uint_eq(got->px.n_blk, 0);
			REC_EQ(img_rec_daemon, &img.d, &got->d, "daemon");
		}
		if (v >= 2)
			image_eq(&img, got, v);
		else
			for (uint32_t i = 0; i < 3; i++)
				REC_EQ(img_rec_conn, &img.conns[i].f, &got->conns[i].f, "conn");
		ck_assert_uint_eq(kvtd_image_sessions(got), 2);
		kvtd_image_free(got);
		free(buf);
	}
}
END_TEST

/* What the writer refuses to write, the reader would refuse to read: a field out of its range is
 * -ERANGE at the writer, the restart refused before anything stops. */
START_TEST(t_writer_refuses)
{
	struct kvtd_image img;
	uint8_t *buf = NULL;
	size_t len = 0;
	struct img_src src = {&img, tree_blk, tree_conn, tree_conn_done};
	struct img_conn c;

	memset(&img, 0, sizeof(img));
	fill_rec(&img_rec_daemon, &img.d, 1);
	img.d.pool_fd = 2; /* stderr: never a carried descriptor */
	ck_assert_int_eq(kvtd_image_encode(&img, &src, KVTD_IMAGE_VERSION, &buf, &len), -ERANGE);
	img.d.pool_fd = 12;
	memset(&c, 0, sizeof(c));
	fill_rec(&img_rec_conn, &c.f, 2);
	c.f.has_session = 2;
	img.conns = &c;
	img.nc.n_conns = 1;
	ck_assert_int_eq(kvtd_image_encode(&img, &src, KVTD_IMAGE_VERSION, &buf, &len), -ERANGE);
	c.f.has_session = 0;
	ck_assert_int_eq(kvtd_image_encode(&img, &src, KVTD_IMAGE_VERSION, &buf, &len), 0);
	free(buf);
	ck_assert_int_eq(kvtd_image_encode(&img, &src, KVTD_IMAGE_VERSION + 1, &buf, &len),
			 -EINVAL);
}
END_TEST

/*
 * The format the previous releases write and read: the hand-written images (begin(),
 * session_conn(), prefix_part()) of each version, parsed and written again, give the same bytes
 * after the header, and a header that differs only in the writer's version string.
 */
START_TEST(t_writer_bytes_as_before)
{
	struct img m;

	for (ver = 1; ver <= KVTD_IMAGE_VERSION; ver++) {
		struct kvtd_image *img = NULL;
		struct kvtd_image_hdr a, b;
		uint8_t *buf;
		size_t len;

		begin(&m, 3);
		session_conn(&m, 5, 30);
		session_conn(&m, 0, 31);
		session_conn(&m, 9, 32);
		finish(&m, ver);
		ck_assert_int_eq(kvtd_image_parse(m.b, m.n, &img), 0);
		encode(img, ver, &buf, &len);
		ck_assert_uint_eq(len, m.n);
		ck_assert_mem_eq(buf + sizeof(a), m.b + sizeof(a), m.n - sizeof(a));
		memcpy(&a, buf, sizeof(a));
		memcpy(&b, m.b, sizeof(b));
		ck_assert_uint_eq(a.version, ver);
		ck_assert_uint_eq(a.size, b.size);
		ck_assert_uint_eq(a.checksum, b.checksum);
		ck_assert_mem_eq(a.magic, b.magic, sizeof(a.magic));
		kvtd_image_free(img);
		free(buf);
	}
	ver = KVTD_IMAGE_VERSION;
}
END_TEST

KVT_CHECK_MAIN("restart", 0, NULL, NULL, t_parse_valid, t_parse_refused, t_tables_describe_records,
	       t_records_roundtrip, t_drift_fails, t_image_roundtrip, t_writer_refuses,
	       t_writer_bytes_as_before)
