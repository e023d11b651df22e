/* SPDX-License-Identifier: MIT */
/*
 * restart_image.c - the restart image's codec (restart_image.h): one walk of the records,
 * io_image(), run to write an image from records and to read records from an image.
 *
 * The image is written and read by the same machine and, across an upgrade, by two builds: its
 * body is native-endian fixed-width fields, read with bounds checks; any field out of range
 * refuses the whole image. It is never shared with a client.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvt_version.h"
#include "log.h"
#include "restart_image.h"
#include "tier.h"

/* ---- the tables ----------------------------------------------------------------------------- */

#define IMG_ENTRY(rec, type, name, dim, kind, max)                                                 \
	{#name, offsetof(struct img_##rec##_f, name), sizeof(((struct img_##rec##_f *)0)->name),   \
	 kind, max},
#define IMG_TABLE(rec, FIELDS, since_)                                                             \
	static const struct img_field img_fields_##rec[] = {FIELDS(IMG_ENTRY_##rec)};              \
	const struct img_rec img_rec_##rec = {                                                     \
	    #rec, img_fields_##rec, sizeof(img_fields_##rec) / sizeof(img_fields_##rec[0]),        \
	    sizeof(struct img_##rec##_f), since_};

#define IMG_ENTRY_daemon(...)	  IMG_ENTRY(daemon, __VA_ARGS__)
#define IMG_ENTRY_prefix(...)	  IMG_ENTRY(prefix, __VA_ARGS__)
#define IMG_ENTRY_ns(...)	  IMG_ENTRY(ns, __VA_ARGS__)
#define IMG_ENTRY_blk(...)	  IMG_ENTRY(blk, __VA_ARGS__)
#define IMG_ENTRY_conns(...)	  IMG_ENTRY(conns, __VA_ARGS__)
#define IMG_ENTRY_conn(...)	  IMG_ENTRY(conn, __VA_ARGS__)
#define IMG_ENTRY_session(...)	  IMG_ENTRY(session, __VA_ARGS__)
#define IMG_ENTRY_buf(...)	  IMG_ENTRY(buf, __VA_ARGS__)
#define IMG_ENTRY_seq(...)	  IMG_ENTRY(seq, __VA_ARGS__)
#define IMG_ENTRY_seq_v2(...)	  IMG_ENTRY(seq_v2, __VA_ARGS__)
#define IMG_ENTRY_session_v2(...) IMG_ENTRY(session_v2, __VA_ARGS__)
#define IMG_ENTRY_nsh(...)	  IMG_ENTRY(nsh, __VA_ARGS__)

IMG_TABLE(daemon, IMG_DAEMON_FIELDS, 1)
IMG_TABLE(prefix, IMG_PREFIX_FIELDS, 2)
IMG_TABLE(ns, IMG_NS_FIELDS, 2)
IMG_TABLE(blk, IMG_BLK_FIELDS, 2)
IMG_TABLE(conns, IMG_CONNS_FIELDS, 1)
IMG_TABLE(conn, IMG_CONN_FIELDS, 1)
IMG_TABLE(session, IMG_SESSION_FIELDS, 1)
IMG_TABLE(buf, IMG_BUF_FIELDS, 1)
IMG_TABLE(seq, IMG_SEQ_FIELDS, 1)
IMG_TABLE(seq_v2, IMG_SEQ_V2_FIELDS, 2)
IMG_TABLE(session_v2, IMG_SESSION_V2_FIELDS, 2)
IMG_TABLE(nsh, IMG_NSH_FIELDS, 2)

const struct img_rec *const kvtd_img_recs[] = {
    &img_rec_daemon, &img_rec_prefix, &img_rec_ns,	   &img_rec_blk,
    &img_rec_conns,  &img_rec_conn,   &img_rec_session,	   &img_rec_buf,
    &img_rec_seq,    &img_rec_seq_v2, &img_rec_session_v2, &img_rec_nsh,
};
const unsigned kvtd_img_n_recs = sizeof(kvtd_img_recs) / sizeof(kvtd_img_recs[0]);

/* ---- the cursor ----------------------------------------------------------------------------- */

struct img_io {
	int write;	  /* 1: records to bytes, 0: bytes to records */
	int fixed;	  /* write: @p is the caller's, @cap bytes, never grown */
	uint32_t version; /* of the image */
	uint8_t *p;	  /* write: the bytes so far; read: the image */
	size_t len, cap;  /* write: used and allocated; read: @len the image's */
	size_t off;	  /* read: the next byte */
	int err;
	char what[64]; /* the record and field refused */
};

static void
io_fail(struct img_io *io, int err, const char *rec, const char *field)
{
	if (io->err)
		return;
	io->err = err;
	snprintf(io->what, sizeof(io->what), "%s.%s", rec, field);
}

/* Write: room for @n more bytes, returned (and counted), or NULL (io->err set). */
static uint8_t *
io_reserve(struct img_io *io, size_t n, const char *rec, const char *field)
{
	uint8_t *at;

	if (io->err)
		return NULL;
	if (n > io->cap - io->len) {
		size_t cap = io->cap ? io->cap : 65536;
		uint8_t *p;

		if (io->fixed) {
			io_fail(io, -ENOSPC, rec, field);
			return NULL;
		}
		while (cap - io->len < n)
			cap *= 2;
		p = realloc(io->p, cap);
		if (!p) {
			io_fail(io, -ENOMEM, rec, field);
			return NULL;
		}
		io->p = p;
		io->cap = cap;
	}
	at = io->p + io->len;
	io->len += n;
	return at;
}

/* Write: @v (@n bytes, NULL: zeros) appended. Read: *@ret_v, the next @n bytes of the image. */
static void
io_bytes(struct img_io *io, const void *v, size_t n, const void **ret_v, const char *rec,
	 const char *field)
{
	uint8_t *at;

	if (io->err)
		return;
	if (!io->write) {
		if (n > io->len - io->off) {
			io_fail(io, -EBADMSG, rec, field);
			return;
		}
		*ret_v = io->p + io->off;
		io->off += n;
		return;
	}
	at = io_reserve(io, n, rec, field);
	if (!at)
		return;
	if (v)
		memcpy(at, v, n);
	else
		memset(at, 0, n);
}

/* A field's value as a number, for the checks (IMG_U, IMG_FD, IMG_FLAGS: 4 or 8 bytes). */
static uint64_t
field_val(const struct img_field *f, const void *p)
{
	uint32_t v32;
	uint64_t v64;

	if (f->size == 8) {
		memcpy(&v64, p, 8);
		return v64;
	}
	memcpy(&v32, p, 4);
	return v32;
}

static inline int
field_ok(const struct img_field *f, const void *p)
{
	switch (f->kind) {
	case IMG_U:
		return !f->max || field_val(f, p) <= f->max;
	case IMG_FD:
		return (int32_t)(uint32_t)field_val(f, p) >= 3;
	case IMG_FLAGS:
		return !(field_val(f, p) & ~f->max);
	default:
		return 1;
	}
}

/* @n bytes from @src to @dst, the common sizes copied as such. */
static inline void
copy_field(void *dst, const void *src, uint32_t n)
{
	if (n == 4)
		memcpy(dst, src, 4);
	else if (n == 8)
		memcpy(dst, src, 8);
	else if (n == 16)
		memcpy(dst, src, 16);
	else
		memcpy(dst, src, n);
}

/* A record newer than the image: not in it, so what it counts is not either (its fields read as
 * zeros; a writer's are left as they are and not used). */
static int
newer(const struct img_io *io, const struct img_rec *t)
{
	return t->since > io->version;
}

/* Every field of @t between @rec and the image, in the table's order, checked either way. A
 * record newer than the image is not in it and reads as zeros. */
static int
io_rec(struct img_io *io, const struct img_rec *t, void *rec)
{
	uint8_t *base = rec, *at;
	size_t bytes = 0;

	if (io->err)
		return io->err;
	if (newer(io, t)) {
		if (!io->write)
			memset(rec, 0, t->size);
		return 0;
	}
	if (io->write) {
		for (unsigned i = 0; i < t->n; i++) {
			if (t->f[i].kind <= IMG_FLAGS && !field_ok(&t->f[i], base + t->f[i].off)) {
				io_fail(io, -ERANGE, t->name, t->f[i].name);
				return io->err;
			}
			bytes += t->f[i].size;
		}
		at = io_reserve(io, bytes, t->name, "all");
		for (unsigned i = 0; at && i < t->n; i++) {
			const struct img_field *f = &t->f[i];

			if (f->kind == IMG_PAD)
				memset(at, 0, f->size);
			else
				copy_field(at, base + f->off, f->size);
			at += f->size;
		}
		return io->err;
	}
	for (unsigned i = 0; i < t->n; i++) {
		const struct img_field *f = &t->f[i];
		uint8_t *p = base + f->off;

		if (f->size > io->len - io->off) {
			io_fail(io, -EBADMSG, t->name, f->name);
			break;
		}
		if (f->kind == IMG_PAD)
			memset(p, 0, f->size);
		else
			copy_field(p, io->p + io->off, f->size);
		io->off += f->size;
		if (f->kind == IMG_STR)
			p[f->size - 1] = '\0';
		if (f->kind <= IMG_FLAGS && !field_ok(f, p)) {
			io_fail(io, -EBADMSG, t->name, f->name);
			break;
		}
	}
	return io->err;
}

int
kvtd_image_rec_io(const struct img_rec *t, void *rec, int write, uint32_t version, uint8_t *buf,
		  size_t cap, size_t *pos)
{
	struct img_io io = {.write = write, .fixed = 1, .version = version, .p = buf};

	if (write) {
		io.len = *pos;
		io.cap = cap;
	} else {
		io.len = cap;
		io.off = *pos;
	}
	io_rec(&io, t, rec);
	*pos = write ? io.len : io.off;
	return io.err;
}

static size_t
pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

/*
 * An array of @n bytes (padded to 8 when @pad) between @p and the image; returns where it is.
 * Write: @p's bytes appended; returns @p. Read: copied to @dst when given (returned), else
 * returned in the image bytes (unaligned); NULL when the image is short.
 */
static const void *
io_array(struct img_io *io, const void *p, size_t n, int pad, void *dst, const char *rec,
	 const char *field)
{
	const void *v = NULL;
	size_t padded = pad ? pad8(n) : n;

	if (io->write) {
		io_bytes(io, p, n, NULL, rec, field);
		io_bytes(io, NULL, padded - n, NULL, rec, field);
		return p;
	}
	io_bytes(io, NULL, padded, &v, rec, field);
	if (io->err)
		return NULL;
	if (dst) {
		memcpy(dst, v, n);
		v = dst;
	}
	return v;
}

/* ---- the grammar (restart_image.h), one walk for both directions ---------------------------- */

/* A sequence and its arrays. */
static int
io_seq(struct img_io *io, struct img_seq *q)
{
	size_t n, a4, a1;
	uint8_t *m = NULL;

	if (io_rec(io, &img_rec_seq, &q->f) < 0)
		return io->err;
	n = q->f.n;
	a4 = pad8(n * 4);
	a1 = pad8(n);
	if (!io->write) {
		/* Copied out: the image gives no alignment guarantee to arrays of floats. */
		if (n * 17 > io->len - io->off) { /* the arrays cannot be there */
			io_fail(io, -EBADMSG, "seq", "n");
			return io->err;
		}
		m = malloc(n * 8 + 2 * a4 + a1 + 8);
		if (!m) {
			io_fail(io, -ENOMEM, "seq", "arrays");
			return io->err;
		}
		q->mem = m;
	}
	q->score = io_array(io, q->score, n * 4, 1, m ? m + n * 8 : NULL, "seq", "score");
	q->pos_slot =
	    io_array(io, q->pos_slot, n * 4, 1, m ? m + n * 8 + a4 : NULL, "seq", "pos_slot");
	q->slot_off = io_array(io, q->slot_off, n * 8, 0, m, "seq", "slot_off");
	q->tier = io_array(io, q->tier, n, 1, m ? m + n * 8 + 2 * a4 : NULL, "seq", "tier");
	if (io_rec(io, &img_rec_seq_v2, &q->v2) < 0 || newer(io, &img_rec_seq_v2) || !q->v2.ns_id)
		return io->err;
	if (!io->write) {
		m = malloc(a4 ? a4 : 8);
		if (!m) {
			io_fail(io, -ENOMEM, "seq", "blk_idx");
			return io->err;
		}
		q->blk_idx = (const uint32_t *)m; /* owned: freed with the image */
	}
	q->blk_idx = io_array(io, q->blk_idx, n * 4, 1, io->write ? NULL : m, "seq", "blk_idx");
	if (!q->blk_idx)
		free(m);
	return io->err;
}

/* A connection and, with a session, everything of it. */
static int
io_conn(struct img_io *io, struct img_conn *c)
{
	if (io_rec(io, &img_rec_conn, &c->f) < 0 || !c->f.has_session)
		return io->err;
	if (io_rec(io, &img_rec_session, &c->s) < 0)
		return io->err;
	if (!io->write) {
		c->bufs = calloc(c->s.n_bufs ? c->s.n_bufs : 1, sizeof(*c->bufs));
		c->seqs = calloc(c->s.n_seqs ? c->s.n_seqs : 1, sizeof(*c->seqs));
		if (!c->bufs || !c->seqs) {
			io_fail(io, -ENOMEM, "session", "tables");
			return io->err;
		}
	}
	for (uint32_t i = 0; i < c->s.n_bufs && !io->err; i++)
		io_rec(io, &img_rec_buf, &c->bufs[i]);
	for (uint32_t i = 0; i < c->s.n_seqs && !io->err; i++)
		io_seq(io, &c->seqs[i]);
	io_rec(io, &img_rec_session_v2, &c->v2);
	for (int i = 0; i < KVT_MAX_NS && !io->err; i++) {
		struct img_nsh *h = &c->nsh[i];
		uint32_t *pins = NULL;
		size_t n;

		if (io_rec(io, &img_rec_nsh, &h->f) < 0 || newer(io, &img_rec_nsh))
			break;
		n = (size_t)h->f.n_pins * 4;
		if (!io->write) {
			if (n > io->len - io->off) {
				io_fail(io, -EBADMSG, "nsh", "n_pins");
				break;
			}
			pins = malloc(n + 8);
			if (!pins) {
				io_fail(io, -ENOMEM, "nsh", "pins");
				break;
			}
		}
		h->pins = io_array(io, io->write ? h->pins : pins, n, 1, pins, "nsh", "pins");
		if (!io->write && !h->pins)
			free(pins);
	}
	return io->err;
}

/* The whole image after its header: from @img and @src, or into @img. */
static int
io_image(struct img_io *io, struct kvtd_image *img, const struct img_src *src)
{
	uint32_t n_ns, n_blk;

	io_rec(io, &img_rec_daemon, &img->d);
	io_rec(io, &img_rec_prefix, &img->px);
	if (io->err)
		return io->err;
	n_ns = newer(io, &img_rec_prefix) ? 0 : img->px.n_ns;
	n_blk = newer(io, &img_rec_prefix) ? 0 : img->px.n_blk;
	if (!io->write) {
		img->ns = calloc(n_ns + 1, sizeof(*img->ns));
		img->blk = calloc(n_blk + 1, sizeof(*img->blk));
		img->blocks = calloc(n_blk + 1, sizeof(*img->blocks));
		if (!img->ns || !img->blk || !img->blocks) {
			io_fail(io, -ENOMEM, "prefix", "tables");
			return io->err;
		}
	}
	for (uint32_t i = 0; i < n_ns && !io->err; i++) {
		struct img_ns *n = &img->ns[i];

		if (io_rec(io, &img_rec_ns, &n->f) < 0)
			break;
		if (!n->f.p.block_tokens || n->f.p.block_tokens > KVT_BLOCK_TOKENS_MAX)
			io_fail(io, io->write ? -ERANGE : -EBADMSG, "ns", "p.block_tokens");
	}
	for (uint32_t i = 0; i < n_blk && !io->err; i++) {
		struct img_blk wb, *b = io->write ? &wb : &img->blk[i];
		int r;

		if (io->write && (r = src->blk(src->ctx, i, b)) < 0) {
			io_fail(io, r, "blk", "source");
			break;
		}
		if (io_rec(io, &img_rec_blk, &b->f) < 0)
			break;
		if (b->f.ns >= n_ns) {
			io_fail(io, io->write ? -ERANGE : -EBADMSG, "blk", "ns");
			break;
		}
		b->off = io_array(io, b->off, (size_t)img->ns[b->f.ns].f.p.block_tokens * 8, 0,
				  NULL, "blk", "off");
	}
	if (io_rec(io, &img_rec_conns, &img->nc) < 0)
		return io->err;
	if (!io->write) {
		img->conns = calloc(img->nc.n_conns ? img->nc.n_conns : 1, sizeof(*img->conns));
		if (!img->conns) {
			io_fail(io, -ENOMEM, "conns", "table");
			return io->err;
		}
	}
	for (uint32_t i = 0; i < img->nc.n_conns && !io->err; i++) {
		struct img_conn wc, *c = io->write ? &wc : &img->conns[i];
		int r;

		if (io->write) {
			memset(c, 0, sizeof(*c));
			r = src->conn(src->ctx, i, c);
			if (r == 0)
				io_conn(io, c);
			src->conn_done(src->ctx, c);
			if (r < 0)
				io_fail(io, r, "conn", "source");
		} else {
			io_conn(io, c);
		}
	}
	return io->err;
}

/* ---- writing -------------------------------------------------------------------------------- */

int
kvtd_image_encode(struct kvtd_image *img, const struct img_src *src, uint32_t version,
		  uint8_t **ret_buf, size_t *ret_len)
{
	struct img_io io = {.write = 1, .version = version};
	struct kvtd_image_hdr h;

	if (version < 1 || version > KVTD_IMAGE_VERSION)
		return -EINVAL;
	memset(&h, 0, sizeof(h));
	io_bytes(&io, &h, sizeof(h), NULL, "hdr", "all"); /* filled in last */
	if (io_image(&io, img, src) < 0) {
		if (io.err == -ERANGE)
			log_err("restart: the image cannot hold this state: %s is out of its range",
				io.what);
		free(io.p);
		return io.err;
	}
	memcpy(h.magic, KVTD_IMAGE_MAGIC, sizeof(KVTD_IMAGE_MAGIC));
	h.version = version;
	h.hdr_size = sizeof(h);
	snprintf(h.daemon_version, sizeof(h.daemon_version), "%s", KVT_VERSION);
	h.size = io.len;
	h.checksum = kvtd_image_checksum(io.p + sizeof(h), io.len - sizeof(h));
	memcpy(io.p, &h, sizeof(h));
	*ret_buf = io.p;
	*ret_len = io.len;
	return 0;
}

uint64_t
kvtd_image_checksum(const void *p, size_t len)
{
	const uint8_t *b = p;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* ---- reading -------------------------------------------------------------------------------- */

void
kvtd_image_free(struct kvtd_image *img)
{
	if (!img)
		return;
	for (uint32_t i = 0; img->conns && i < img->nc.n_conns; i++) {
		struct img_conn *c = &img->conns[i];

		for (uint32_t k = 0; c->seqs && k < c->s.n_seqs; k++) {
			free(c->seqs[k].mem);
			free((void *)c->seqs[k].blk_idx);
		}
		for (int k = 0; k < KVT_MAX_NS; k++)
			free((void *)c->nsh[k].pins);
		free(c->bufs);
		free(c->seqs);
	}
	free(img->conns);
	free(img->ns);
	free(img->blk);
	free(img->blocks);
	free(img->bytes);
	free(img);
}

unsigned
kvtd_image_sessions(const struct kvtd_image *img)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < img->nc.n_conns; i++)
		n += img->conns[i].f.has_session;
	return n;
}

int
kvtd_image_parse(const void *buf, size_t len, struct kvtd_image **ret_img)
{
	struct kvtd_image_hdr h;
	struct kvtd_image *img;
	struct img_io io = {0};
	int e;

	if (len < sizeof(h)) {
		log_err("restart: the image is %zu bytes, shorter than its header", len);
		return -EBADMSG;
	}
	memcpy(&h, buf, sizeof(h));
	if (memcmp(h.magic, KVTD_IMAGE_MAGIC, sizeof(KVTD_IMAGE_MAGIC)) || h.version < 1 ||
	    h.version > KVTD_IMAGE_VERSION || h.hdr_size != sizeof(h)) {
		h.daemon_version[sizeof(h.daemon_version) - 1] = '\0';
		log_err("restart: image version %u from kvtierd '%.31s' is not one this kvtierd %s "
			"reads (versions 1 to %u): the previous sessions are dropped",
			h.version, memcmp(h.magic, KVTD_IMAGE_MAGIC, 8) ? "?" : h.daemon_version,
			KVT_VERSION, KVTD_IMAGE_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (h.size != len ||
	    kvtd_image_checksum((const uint8_t *)buf + sizeof(h), len - sizeof(h)) != h.checksum) {
		log_err("restart: the image is corrupt or truncated (%zu of %llu bytes, checksum "
			"%s): the previous sessions are dropped",
			len, (unsigned long long)h.size, h.size == len ? "wrong" : "not checked");
		return -EBADMSG;
	}
	img = calloc(1, sizeof(*img));
	if (!img)
		return -ENOMEM;
	img->bytes = malloc(len);
	if (!img->bytes) {
		free(img);
		return -ENOMEM;
	}
	memcpy(img->bytes, buf, len);
	img->len = len;
	memcpy(img->version, h.daemon_version, 32);
	img->version[32] = '\0';
	img->img_version = h.version;
	io = (struct img_io){.version = h.version, .p = img->bytes, .len = len, .off = sizeof(h)};
	e = io_image(&io, img, NULL);
	if (!e && io.off != len) {
		e = -EBADMSG;
		snprintf(io.what, sizeof(io.what), "the end (%zu bytes left over)", len - io.off);
	}
	if (e) {
		if (e == -EBADMSG)
			log_err(
			    "restart: the image contradicts itself at byte %zu of %zu (%s): the "
			    "previous sessions are dropped",
			    io.off, len, io.what);
		kvtd_image_free(img);
		return e;
	}
	*ret_img = img;
	return 0;
}

int
kvtd_image_load(int fd, struct kvtd_image **ret_img)
{
	struct stat st;
	void *p;
	int r;

	if (fstat(fd, &st) < 0 || st.st_size <= 0) {
		log_err("restart: --restore-fd %d is not a readable image", fd);
		close(fd);
		return -EBADMSG;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		log_err("restart: cannot map the image: %s", strerror(errno));
		return -EBADMSG;
	}
	r = kvtd_image_parse(p, (size_t)st.st_size, ret_img);
	munmap(p, (size_t)st.st_size);
	return r;
}
