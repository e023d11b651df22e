/* SPDX-License-Identifier: MIT */
/*
 * restart.c - restart in place (restart.h): the image, the exec, and the restore.
 *
 * The image is written and read by the same machine and, across an upgrade, by two builds: its
 * body is native-endian fixed-width fields, read with bounds checks; any field out of range
 * refuses the whole image. It is never shared with a client.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "conn.h"
#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvt_ring.h"
#include "kvt_version.h"
#include "kvtd.h"
#include "log.h"
#include "poller.h"
#include "restart.h"
#include "seq.h"
#include "session.h"
#include "spill.h"

/* ---- image buffer ------------------------------------------------------------------------ */

struct wbuf {
	uint8_t *p;
	size_t len, cap;
	int err;
};

static void
put(struct wbuf *w, const void *v, size_t n)
{
	if (w->err)
		return;
	if (w->len + n > w->cap) {
		size_t cap = w->cap ? w->cap : 65536;
		uint8_t *p;

		while (cap < w->len + n)
			cap *= 2;
		p = realloc(w->p, cap);
		if (!p) {
			w->err = -ENOMEM;
			return;
		}
		w->p = p;
		w->cap = cap;
	}
	memcpy(w->p + w->len, v, n);
	w->len += n;
}

#define PUT(w, v)                                                                                  \
	do {                                                                                       \
		__typeof__(v) _v = (v);                                                            \
		put((w), &_v, sizeof(_v));                                                         \
	} while (0)

struct rbuf {
	const uint8_t *p;
	size_t len, off;
	int err;
};

static const void *
get(struct rbuf *r, size_t n)
{
	const void *v;

	if (r->err || n > r->len - r->off) {
		r->err = -EBADMSG;
		return NULL;
	}
	v = r->p + r->off;
	r->off += n;
	return v;
}

static uint32_t
get32(struct rbuf *r)
{
	const void *v = get(r, 4);
	uint32_t x = 0;

	if (v)
		memcpy(&x, v, 4);
	return x;
}

static uint64_t
get64(struct rbuf *r)
{
	const void *v = get(r, 8);
	uint64_t x = 0;

	if (v)
		memcpy(&x, v, 8);
	return x;
}

static int
getfd(struct rbuf *r)
{
	int32_t fd = (int32_t)get32(r);

	if (fd < 3 && !r->err)
		r->err = -EBADMSG; /* never stdio, never negative */
	return fd;
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

/* ---- parsed image ------------------------------------------------------------------------- */

struct img_buf {
	uint32_t id;
	uint64_t size;
	int fd;
};

struct img_seq {
	uint32_t id;
	struct kvt_seq_params p;
	struct kvtd_seq_image si; /* arrays in mem */
	void *mem;
	uint32_t ns_id; /* 0: none */
	uint32_t *blk_idx;
};

struct img_ns_handle {
	uint32_t ns_id; /* 0: none */
	uint32_t n_pins;
	uint32_t *pins; /* block indexes */
};

struct img_ns {
	uint32_t id;
	uint64_t scope;
	struct kvt_ns_params p;
	uint64_t cnt[6];
	struct kvtd_pns *ns; /* restored */
};

struct img_blk {
	uint32_t ns; /* index in ns[] */
	struct kvt_block_key key;
	const uint8_t *off; /* block_tokens u64 pool offsets, in the image bytes */
};

struct img_conn {
	int fd, state;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	int privileged, asker, has_session;
	/* session */
	uint32_t id;
	char name[32];
	uint64_t start_ns;
	int memfd, sq_efd, cq_efd;
	uint32_t sq_entries, cq_entries;
	uint64_t arena_size;
	uint32_t sq_head, cq_tail, cq_head_seen, op_err_gen;
	uint64_t ops, errors;
	uint32_t n_bufs, n_seqs;
	struct img_buf *bufs;
	struct img_seq *seqs;
	uint64_t prefix_scope;
	struct img_ns_handle nsh[KVT_MAX_NS];
	/* restore progress */
	struct kvtd_session *s;
	unsigned bufs_done; /* buffer fds already consumed */
	int fds_owned;	    /* memfd and doorbells belong to s */
};

struct kvtd_image {
	uint8_t *bytes; /* the image */
	size_t len;
	char version[33];
	uint32_t next_session_id, restarts;
	uint64_t start_ns, restart_started_ns, restart_req_id;
	int listen_fd, lock_fd;
	uint64_t sock_dev, sock_ino;
	int pool_fd;
	uint32_t pool_hugetlb;
	uint64_t pool_size, chunk_size, pool_base;
	uint64_t cnt[8];
	uint32_t img_version; /* of the image */
	uint32_t n_ns, n_blk;
	struct img_ns *ns;
	struct img_blk *blk;
	struct kvtd_pblock **blocks; /* restored, index = image index */
	uint64_t px_cnt[7];
	struct kvtd_prefix *px; /* once prefix_restore() made its namespaces */
	uint32_t n_conns;
	struct img_conn *conns;
};

void
kvtd_image_free(struct kvtd_image *img)
{
	if (!img)
		return;
	for (uint32_t i = 0; img->conns && i < img->n_conns; i++) {
		for (uint32_t k = 0; img->conns[i].seqs && k < img->conns[i].n_seqs; k++) {
			free(img->conns[i].seqs[k].mem);
			free(img->conns[i].seqs[k].blk_idx);
		}
		for (int k = 0; k < KVT_MAX_NS; k++)
			free(img->conns[i].nsh[k].pins);
		free(img->conns[i].bufs);
		free(img->conns[i].seqs);
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

	for (uint32_t i = 0; i < img->n_conns; i++)
		n += img->conns[i].has_session;
	return n;
}

/* A sequence's flags in the image (version 2 on; older builds wrote 0 and ignore them): what it
 * keeps for life whatever the config of the build that restores it says. */
#define IMG_SEQ_F_NO_SKETCH (1u << 0) /* opened with [retrieval] sketch = no */
#define IMG_SEQ_F_ALL	    IMG_SEQ_F_NO_SKETCH

static int
parse_seq(struct rbuf *r, struct img_seq *q, uint32_t version)
{
	const void *pp;
	uint32_t n;

	q->id = get32(r);
	pp = get(r, sizeof(q->p));
	if (pp)
		memcpy(&q->p, pp, sizeof(q->p));
	n = get32(r);
	q->si.n = n;
	q->si.gen = get32(r);
	q->si.bytes_in = get64(r);
	q->si.bytes_out = get64(r);
	{
		const void *v = get(r, 8);

		if (v)
			memcpy(&q->si.score_total, v, 8);
	}
	if (r->err || n > KVT_TIER_MAX_CAP)
		return -EBADMSG;
	{
		size_t a4 = ((size_t)n * 4 + 7) & ~(size_t)7, a1 = ((size_t)n + 7) & ~(size_t)7;
		const void *score = get(r, a4), *pos_slot = get(r, a4),
			   *off = get(r, (size_t)n * 8), *tier = get(r, a1);
		uint8_t *m;

		if (r->err)
			return r->err;
		/* Copied out: the image gives no alignment guarantee to arrays of floats. */
		m = malloc(2 * a4 + (size_t)n * 8 + a1 + 8);
		if (!m)
			return -ENOMEM;
		q->mem = m;
		memcpy(m, off, (size_t)n * 8);
		q->si.slot_off = (const uint64_t *)m;
		m += (size_t)n * 8;
		memcpy(m, score, a4);
		q->si.score = (const float *)m;
		m += a4;
		memcpy(m, pos_slot, a4);
		q->si.pos_slot = (const int32_t *)m;
		m += a4;
		memcpy(m, tier, a1);
		q->si.tier = m;
	}
	if (version >= 2) {
		uint32_t flags;

		q->ns_id = get32(r);
		flags = get32(r); /* 0 in images of builds before IMG_SEQ_F_* */
		if (flags & ~IMG_SEQ_F_ALL)
			return -EBADMSG;
		q->si.no_sketch = flags & IMG_SEQ_F_NO_SKETCH;
		if (q->ns_id) {
			size_t a4 = ((size_t)n * 4 + 7) & ~(size_t)7;
			const void *idx = get(r, a4);

			if (r->err)
				return r->err;
			q->blk_idx = malloc(a4 ? a4 : 8);
			if (!q->blk_idx)
				return -ENOMEM;
			memcpy(q->blk_idx, idx, a4);
		}
	}
	return r->err;
}

static int
parse_conn(struct rbuf *r, struct img_conn *c, uint32_t version)
{
	const void *name;

	c->fd = getfd(r);
	c->state = (int)get32(r);
	c->pid = (pid_t)get32(r);
	c->uid = get32(r);
	c->gid = get32(r);
	c->privileged = (int)get32(r);
	c->asker = (int)get32(r);
	c->has_session = (int)get32(r);
	if (r->err || c->has_session > 1)
		return -EBADMSG;
	if (!c->has_session)
		return 0;
	c->id = get32(r);
	name = get(r, sizeof(c->name));
	if (name)
		memcpy(c->name, name, sizeof(c->name));
	c->name[sizeof(c->name) - 1] = '\0';
	c->start_ns = get64(r);
	c->memfd = getfd(r);
	c->sq_efd = getfd(r);
	c->cq_efd = getfd(r);
	c->sq_entries = get32(r);
	c->cq_entries = get32(r);
	c->arena_size = get64(r);
	c->sq_head = get32(r);
	c->cq_tail = get32(r);
	c->cq_head_seen = get32(r);
	c->op_err_gen = get32(r);
	c->ops = get64(r);
	c->errors = get64(r);
	c->n_bufs = get32(r);
	c->n_seqs = get32(r);
	if (r->err || c->n_bufs > 65536 || c->n_seqs > 65536)
		return -EBADMSG;
	c->bufs = calloc(c->n_bufs ? c->n_bufs : 1, sizeof(*c->bufs));
	c->seqs = calloc(c->n_seqs ? c->n_seqs : 1, sizeof(*c->seqs));
	if (!c->bufs || !c->seqs)
		return -ENOMEM;
	for (uint32_t i = 0; i < c->n_bufs; i++) {
		c->bufs[i].id = get32(r);
		c->bufs[i].size = get64(r);
		c->bufs[i].fd = getfd(r);
	}
	for (uint32_t i = 0; i < c->n_seqs && !r->err; i++)
		if (parse_seq(r, &c->seqs[i], version) < 0)
			return r->err ? r->err : -EBADMSG;
	if (version < 2)
		return r->err;
	c->prefix_scope = get64(r);
	for (int i = 0; i < KVT_MAX_NS && !r->err; i++) {
		struct img_ns_handle *h = &c->nsh[i];
		const void *pins;

		h->ns_id = get32(r);
		h->n_pins = get32(r);
		if (r->err || h->n_pins > (1u << 24))
			return -EBADMSG;
		pins = get(r, ((size_t)h->n_pins * 4 + 7) & ~(size_t)7);
		if (r->err)
			return r->err;
		h->pins = malloc((size_t)h->n_pins * 4 + 8);
		if (!h->pins)
			return -ENOMEM;
		memcpy(h->pins, pins, (size_t)h->n_pins * 4);
	}
	return r->err;
}

/* The prefix store's part (version 2): namespaces, counters, blocks. */
static int
parse_prefix(struct rbuf *r, struct kvtd_image *img)
{
	img->n_ns = get32(r);
	img->n_blk = get32(r);
	if (r->err || img->n_ns > (1u << 20) || img->n_blk > (1u << 28))
		return -EBADMSG;
	img->ns = calloc(img->n_ns + 1, sizeof(*img->ns));
	img->blk = calloc(img->n_blk + 1, sizeof(*img->blk));
	img->blocks = calloc(img->n_blk + 1, sizeof(*img->blocks));
	if (!img->ns || !img->blk || !img->blocks)
		return -ENOMEM;
	for (int i = 0; i < 7; i++)
		img->px_cnt[i] = get64(r);
	for (uint32_t i = 0; i < img->n_ns && !r->err; i++) {
		struct img_ns *n = &img->ns[i];
		const void *p;

		n->id = get32(r);
		get32(r); /* pad */
		n->scope = get64(r);
		p = get(r, sizeof(n->p));
		if (p)
			memcpy(&n->p, p, sizeof(n->p));
		for (int k = 0; k < 6; k++)
			n->cnt[k] = get64(r);
		if (!r->err && (!n->p.block_tokens || n->p.block_tokens > KVT_BLOCK_TOKENS_MAX))
			return -EBADMSG;
	}
	for (uint32_t i = 0; i < img->n_blk && !r->err; i++) {
		struct img_blk *b = &img->blk[i];
		const void *k;

		b->ns = get32(r);
		get32(r); /* pad */
		k = get(r, sizeof(b->key));
		if (k)
			memcpy(&b->key, k, sizeof(b->key));
		if (r->err || b->ns >= img->n_ns)
			return -EBADMSG;
		b->off = get(r, (size_t)img->ns[b->ns].p.block_tokens * 8);
	}
	return r->err;
}

int
kvtd_image_parse(const void *buf, size_t len, struct kvtd_image **ret_img)
{
	struct kvtd_image_hdr h;
	struct kvtd_image *img;
	struct rbuf r;
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
	r = (struct rbuf){img->bytes, len, sizeof(h), 0};
	img->next_session_id = get32(&r);
	img->restarts = get32(&r);
	img->start_ns = get64(&r);
	img->restart_started_ns = get64(&r);
	img->restart_req_id = get64(&r);
	img->listen_fd = getfd(&r);
	img->lock_fd = getfd(&r);
	img->sock_dev = get64(&r);
	img->sock_ino = get64(&r);
	img->pool_fd = getfd(&r);
	img->pool_hugetlb = get32(&r);
	img->pool_size = get64(&r);
	img->chunk_size = get64(&r);
	img->pool_base = get64(&r);
	for (int i = 0; i < 8; i++)
		img->cnt[i] = get64(&r);
	img->img_version = h.version;
	e = h.version >= 2 ? parse_prefix(&r, img) : r.err;
	img->n_conns = get32(&r);
	if (!e)
		e = r.err;
	if (!e && img->n_conns > (1u << 20))
		e = -EBADMSG;
	if (!e) {
		img->conns = calloc(img->n_conns ? img->n_conns : 1, sizeof(*img->conns));
		e = img->conns ? 0 : -ENOMEM;
	}
	for (uint32_t i = 0; !e && i < img->n_conns; i++)
		e = parse_conn(&r, &img->conns[i], img->img_version);
	if (!e && r.off != len)
		e = -EBADMSG;
	if (e) {
		if (e == -EBADMSG)
			log_err("restart: the image contradicts itself at byte %zu of %zu: the "
				"previous sessions are dropped",
				r.off, len);
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

/* ---- writing (old process) ---------------------------------------------------------------- */

struct fdlist {
	int *fd;
	unsigned n, cap;
	int err;
};

static void
fd_add(struct fdlist *l, int fd)
{
	if (l->err)
		return;
	if (l->n == l->cap) {
		unsigned cap = l->cap ? 2 * l->cap : 64;
		int *p = realloc(l->fd, cap * sizeof(int));

		if (!p) {
			l->err = -ENOMEM;
			return;
		}
		l->fd = p;
		l->cap = cap;
	}
	l->fd[l->n++] = fd;
}

static void
put_pad8(struct wbuf *w, const void *v, size_t n)
{
	static const uint8_t zero[8];

	put(w, v, n);
	if (n & 7)
		put(w, zero, 8 - (n & 7));
}

static void
write_seq(struct wbuf *w, const struct kvtd *d, const struct kvtd_seq *q)
{
	uint32_t n = q->ts.n;
	uint64_t *off;

	PUT(w, q->id);
	put(w, &q->p, sizeof(q->p));
	PUT(w, n);
	PUT(w, q->ts.gen);
	PUT(w, q->bytes_in);
	PUT(w, q->bytes_out);
	PUT(w, q->score_total);
	/* Arrays padded to 8 bytes (the reader copies them out, aligned). */
	put_pad8(w, q->ts.score, (size_t)n * 4);
	put_pad8(w, q->ts.pos_slot, (size_t)n * 4);
	off = malloc((size_t)(n ? n : 1) * 8);
	if (!off) {
		w->err = -ENOMEM;
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		off[i] = q->slot[i] ? (uint64_t)((uint8_t *)q->slot[i] - d->pool.base) + 1 : 0;
	put(w, off, (size_t)n * 8);
	free(off);
	put_pad8(w, q->ts.tier, n);
	PUT(w, (uint32_t)(q->ns ? q->ns->id : 0));
	PUT(w, (uint32_t)(q->no_sketch ? IMG_SEQ_F_NO_SKETCH : 0));
	if (q->ns) {
		uint32_t *idx = malloc((size_t)(n ? n : 1) * 4);

		if (!idx) {
			w->err = -ENOMEM;
			return;
		}
		for (uint32_t i = 0; i < n; i++)
			idx[i] = q->blk[i] ? q->blk[i]->img_idx + 1 : 0;
		put_pad8(w, idx, (size_t)n * 4);
		free(idx);
	}
}

struct write_ctx {
	struct kvtd *d;
	struct wbuf *w;
	struct fdlist *fds;
	uint32_t n;
};

static int
write_conn(void *ctx, const struct kvtd_conn_info *ci)
{
	struct write_ctx *x = ctx;
	struct wbuf *w = x->w;
	struct kvtd_session *s = ci->s;
	uint32_t nb = 0, nq = 0;

	PUT(w, (int32_t)ci->fd);
	PUT(w, (uint32_t)ci->state);
	PUT(w, (uint32_t)ci->pid);
	PUT(w, (uint32_t)ci->uid);
	PUT(w, (uint32_t)ci->gid);
	PUT(w, (uint32_t)ci->privileged);
	PUT(w, (uint32_t)(ci->conn == x->d->restart_conn && ci->conn));
	PUT(w, (uint32_t) !!s);
	fd_add(x->fds, ci->fd);
	x->n++;
	if (!s)
		return 0;
	PUT(w, s->id);
	put(w, s->name, sizeof(s->name));
	PUT(w, s->start_ns);
	PUT(w, (int32_t)s->memfd);
	PUT(w, (int32_t)s->sq_efd);
	PUT(w, (int32_t)s->cq_efd);
	PUT(w, s->sq_entries);
	PUT(w, s->cq_entries);
	PUT(w, s->arena_size);
	PUT(w, s->sq_head);
	PUT(w, s->cq_tail);
	PUT(w, s->cq_head_seen);
	PUT(w, s->op_err_gen);
	PUT(w, s->ops);
	PUT(w, s->errors);
	fd_add(x->fds, s->memfd);
	fd_add(x->fds, s->sq_efd);
	fd_add(x->fds, s->cq_efd);
	for (unsigned i = 0; i < s->max_bufs; i++)
		nb += s->bufs[i] != NULL;
	for (unsigned i = 0; i < s->max_seqs; i++)
		nq += s->seqs[i] != NULL;
	PUT(w, nb);
	PUT(w, nq);
	for (unsigned i = 0; i < s->max_bufs; i++) {
		int fd;

		if (!s->bufs[i])
			continue;
		fd = kvt_dev_buf_fd(s->bufs[i]);
		if (fd < 0)
			return fd;
		PUT(w, (uint32_t)(i + 1));
		PUT(w, kvt_dev_buf_size(s->bufs[i]));
		PUT(w, (int32_t)fd);
		fd_add(x->fds, fd);
	}
	for (unsigned i = 0; i < s->max_seqs; i++)
		if (s->seqs[i])
			write_seq(w, x->d, s->seqs[i]);
	PUT(w, s->prefix_scope);
	for (int i = 0; i < KVT_MAX_NS; i++) {
		const struct kvtd_ns_handle *h = &s->ns[i];

		PUT(w, (uint32_t)(h->ns ? h->ns->id : 0));
		PUT(w, (uint32_t)(h->ns ? h->n_pins : 0));
		for (uint32_t k = 0; h->ns && k < h->n_pins; k++)
			PUT(w, h->pins[k]->img_idx);
		if (h->ns && (h->n_pins & 1))
			PUT(w, (uint32_t)0);
	}
	return w->err ? w->err : x->fds->err;
}

/* The prefix store: namespaces, counters, then every block (numbered in the order written,
 * the numbers sequences and pins refer to) with its slots' pool offsets. */
static void
write_prefix(struct wbuf *w, struct kvtd *d)
{
	struct kvtd_prefix *px = &d->prefix;
	uint32_t n_ns = 0, idx = 0;

	/* Linear in namespaces and blocks: the pause must not grow faster than the store. */
	for (struct kvtd_pns *ns = px->ns_list; ns; ns = ns->next)
		ns->img_idx = n_ns++;
	PUT(w, n_ns);
	PUT(w, (uint32_t)px->n_blocks);
	PUT(w, px->lookups);
	PUT(w, px->hit_blocks);
	PUT(w, px->miss_blocks);
	PUT(w, px->published);
	PUT(w, px->deduped);
	PUT(w, px->evicted);
	PUT(w, px->refused_budget);
	for (struct kvtd_pns *ns = px->ns_list; ns; ns = ns->next) {
		PUT(w, ns->id);
		PUT(w, (uint32_t)0);
		PUT(w, ns->scope);
		put(w, &ns->p, sizeof(ns->p));
		PUT(w, ns->lookups);
		PUT(w, ns->hit_blocks);
		PUT(w, ns->miss_blocks);
		PUT(w, ns->published);
		PUT(w, ns->deduped);
		PUT(w, ns->evicted);
	}
	for (uint64_t i = 0; px->tab && i <= px->tab_mask; i++)
		for (struct kvtd_pblock *b = px->tab[i]; b; b = b->hnext) {
			b->img_idx = idx++;
			PUT(w, b->ns->img_idx);
			PUT(w, (uint32_t)0);
			put(w, &b->key, sizeof(b->key));
			for (uint32_t t = 0; t < b->ns->p.block_tokens; t++)
				PUT(w, (uint64_t)((uint8_t *)b->slot[t] - d->pool.base));
		}
}

/* The image of @d, pollers quiesced. Returns 0 with the bytes in @w and the descriptors to
 * carry in @fds, or -errno. */
static int
image_write(struct kvtd *d, struct wbuf *w, struct fdlist *fds)
{
	struct kvtd_image_hdr h;
	struct write_ctx x = {d, w, fds, 0};
	size_t n_at;
	int r;

	memset(&h, 0, sizeof(h));
	put(w, &h, sizeof(h)); /* filled in last */
	PUT(w, d->next_session_id);
	PUT(w, d->restarts);
	PUT(w, d->start_ns);
	PUT(w, d->restart_started_ns);
	PUT(w, d->restart_req_id);
	PUT(w, (int32_t)d->listen_fd);
	PUT(w, (int32_t)d->lock_fd);
	PUT(w, (uint64_t)d->sock_dev);
	PUT(w, (uint64_t)d->sock_ino);
	PUT(w, (int32_t)d->pool.fd);
	PUT(w, (uint32_t)d->pool.hugetlb);
	PUT(w, d->pool.size);
	PUT(w, d->pool.chunk_size);
	PUT(w, (uint64_t)(uintptr_t)d->pool.base);
	PUT(w, atomic_load(&d->cnt.ops));
	PUT(w, atomic_load(&d->cnt.errors));
	PUT(w, atomic_load(&d->cnt.refused_einval));
	PUT(w, atomic_load(&d->cnt.refused_auth));
	PUT(w, atomic_load(&d->cnt.refused_hello_timeout));
	PUT(w, atomic_load(&d->cnt.refused_limit));
	PUT(w, atomic_load(&d->cnt.sessions_total));
	PUT(w, atomic_load(&d->cnt.ring_corrupt));
	write_prefix(w, d);
	n_at = w->len;
	PUT(w, (uint32_t)0); /* connections, counted below */
	fd_add(fds, d->listen_fd);
	fd_add(fds, d->lock_fd);
	fd_add(fds, d->pool.fd);
	r = kvtd_loop_conns(d, write_conn, &x);
	if (r == 0)
		r = w->err ? w->err : fds->err;
	if (r < 0)
		return r;
	memcpy(w->p + n_at, &x.n, sizeof(x.n));
	memcpy(h.magic, KVTD_IMAGE_MAGIC, sizeof(KVTD_IMAGE_MAGIC));
	h.version = KVTD_IMAGE_VERSION;
	h.hdr_size = sizeof(h);
	snprintf(h.daemon_version, sizeof(h.daemon_version), "%s", KVT_VERSION);
	h.size = w->len;
	h.checksum = kvtd_image_checksum(w->p + sizeof(h), w->len - sizeof(h));
	memcpy(w->p, &h, sizeof(h));
	return 0;
}

/*
 * The teardown child: it shares the daemon's address space (CLONE_VM, not a thread) and waits
 * for the exec, which closes the pipe's write end. The exec then only drops its reference to
 * the old address space and the child, exiting, unmaps it: the pool's page tables (and its
 * munlock) are torn down after the new process runs, not inside execve, where a 1 GiB pool of
 * 4 KiB pages cost 340 ms of the pause. Raw syscalls only, no sanitizer hooks: the child runs on
 * the parent's thread pointer.
 *
 * It is also the watcher of the fallback (restart.h): it keeps the descriptors the exec carries
 * (and the old binary's) until the new process writes its verdict, and on 'F' or the pipe's end
 * without one executes the old binary with the same image.
 */
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_execveat
#define SYS_execveat 322
#endif
#define TEARDOWN_FD_MAX 65536 /* without close_range(2): the descriptor numbers closed */
#define STR_(x)		#x
#define STR(x)		STR_(x)

struct watch {
	int p[4];     /* p[0], p[1]: the exec pipe; p[2], p[3]: the child has closed */
	int rd;	      /* the verdict pipe's read end, -1: teardown only */
	int kill;     /* the new binary promised a verdict: none in time is a failure */
	int exe_fd;   /* the old binary */
	pid_t parent; /* the restarting process (the new one after the exec) */
	int *keep;    /* ascending: the descriptors kept open (p[0], rd, exe_fd, carried) */
	unsigned n_keep;
	char **argv;	   /* the old binary's arguments with --restore-fd */
	char **envp;	   /* its environment; envp[n_env] points at why_env */
	char why_env[512]; /* KVTD_FALLBACK_ENV "=" the reason */
	/* under systemd: the watcher is the unit's main pid from before the exec until it lets
	 * go, when it hands that back to the restarting pid (MAINPID=) and closes ack_w */
	struct sockaddr_un notify_addr;
	socklen_t notify_len; /* 0: not under systemd */
	char mainpid_msg[32]; /* "MAINPID=<parent>" */
	int ack_w;	      /* -1: none */
};

/* The teardown child's helpers run on its parent's thread pointer, like it: no sanitizer hooks.
 */
#define RAW_CHILD __attribute__((no_sanitize_address, no_sanitize_thread, no_sanitize_undefined))

RAW_CHILD static void
raw_close_from_to(int lo, int hi) /* [lo, hi), hi < 0: to the end */
{
	long end = hi < 0 ? TEARDOWN_FD_MAX : hi;

	if (hi >= 0 && lo >= hi)
		return;
	if (syscall(SYS_close_range, (unsigned)lo, hi < 0 ? ~0U : (unsigned)hi - 1, 0U) < 0)
		for (long fd = lo; fd < end; fd++)
			syscall(SYS_close, fd);
}

RAW_CHILD static void
raw_append(char *dst, size_t cap, const char *src)
{
	size_t n = 0;

	while (n < cap - 1 && dst[n])
		n++;
	while (n < cap - 1 && *src)
		dst[n++] = *src++;
	dst[n] = '\0';
}

/*
 * sd_notify() of @msg to the service manager, then a barrier (BARRIER=1 with a pipe's write
 * end, which the manager closes once it has processed what came before), waited for 5 s at
 * most: MAINPID= is in force when this returns.
 */
RAW_CHILD static void
raw_notify(const struct watch *w, const char *msg, size_t len)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = {.iov_base = (void *)msg, .iov_len = len};
	struct msghdr mh = {.msg_name = (void *)&w->notify_addr,
			    .msg_namelen = w->notify_len,
			    .msg_iov = &iov,
			    .msg_iovlen = 1};
	struct timespec ts = {.tv_sec = 5};
	struct pollfd pf;
	int bp[2];
	long fd = syscall(SYS_socket, AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return;
	syscall(SYS_sendmsg, fd, &mh, MSG_NOSIGNAL);
	if (syscall(SYS_pipe2, bp, O_CLOEXEC) == 0) {
		iov.iov_base = (void *)"BARRIER=1";
		iov.iov_len = 9;
		u.h.cmsg_level = SOL_SOCKET;
		u.h.cmsg_type = SCM_RIGHTS;
		u.h.cmsg_len = CMSG_LEN(sizeof(int));
		*(int *)(void *)CMSG_DATA(&u.h) = bp[1];
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		syscall(SYS_sendmsg, fd, &mh, MSG_NOSIGNAL);
		syscall(SYS_close, bp[1]);
		pf.fd = bp[0];
		pf.events = POLLIN;
		pf.revents = 0;
		syscall(SYS_ppoll, &pf, 1UL, &ts, NULL, 8UL);
		syscall(SYS_close, bp[0]);
	}
	syscall(SYS_close, fd);
}

/* The restarting pid serves (or the exec failed and the old process goes on): under systemd
 * it is the main pid again, and then it may go on. */
RAW_CHILD __attribute__((noreturn)) static void
raw_let_go(const struct watch *w)
{
	size_t n = 0;

	if (w->notify_len) {
		while (w->mainpid_msg[n])
			n++;
		raw_notify(w, w->mainpid_msg, n);
	}
	if (w->ack_w >= 0)
		syscall(SYS_close, w->ack_w);
	syscall(SYS_exit, 0);
	__builtin_unreachable();
}

RAW_CHILD static int
teardown_child(void *arg)
{
	struct watch *w = arg;
	char c, buf[400];
	long n, got = 0;
	int prev = 0, timed_out = 0;

	/* It holds nothing but what it needs: a copy of the metrics listener (or of any socket)
	 * kept until the old address space is gone would make the new process's bind fail. */
	for (unsigned i = 0; i < w->n_keep; i++) {
		raw_close_from_to(prev, w->keep[i]);
		prev = w->keep[i] + 1;
	}
	raw_close_from_to(prev, -1);
	while ((n = syscall(SYS_read, w->p[0], &c, 1)) < 0)
		;
	if (w->rd < 0) /* no watch */
		syscall(SYS_exit, 0);
	if (n == 1) /* the exec failed: the old process goes on */
		raw_let_go(w);
	/* The verdict: 'R' (taken over), 'F' and a reason, or nothing before the end. */
	for (;;) {
		struct pollfd pf = {.fd = w->rd, .events = POLLIN};
		struct timespec ts = {.tv_sec = KVTD_TAKEOVER_S};

		n = syscall(SYS_ppoll, &pf, 1UL, timed_out ? NULL : &ts, NULL, 8UL);
		if (n == 0) {
			if (!w->kill)
				raw_let_go(w); /* an older kvtierd: alive, so it took over */
			syscall(SYS_kill, w->parent, SIGKILL);
			timed_out = 1;
			continue;
		}
		if (n < 0)
			continue;
		n = syscall(SYS_read, w->rd, buf + got, sizeof(buf) - 1 - (size_t)got);
		if (n < 0)
			continue;
		if (got == 0 && n > 0 && buf[0] == 'R')
			raw_let_go(w); /* the new process serves */
		if (n == 0 || got + n == (long)sizeof(buf) - 1)
			break;
		got += n;
	}
	buf[got] = '\0';
	if (timed_out)
		raw_append(w->why_env, sizeof(w->why_env),
			   "gave no verdict in " STR(KVTD_TAKEOVER_S) " s and was killed");
	else if (got > 1 && buf[0] == 'F')
		raw_append(w->why_env, sizeof(w->why_env), buf + 1);
	else
		raw_append(w->why_env, sizeof(w->why_env),
			   "ended before it took the sessions over (exited or killed at start)");
	syscall(SYS_execveat, w->exe_fd, "", w->argv, w->envp, AT_EMPTY_PATH);
	syscall(SYS_exit, 127); /* nothing more can be done: the sessions end */
	return 0;
}

#if defined(__SANITIZE_THREAD__)
#define KVTD_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVTD_TSAN 1
#endif
#endif

typedef int (*clone_fn)(int (*)(void *), void *, int, void *, ...);

/* libc's clone(). ThreadSanitizer's interceptor runs its own bookkeeping in a CLONE_VM child on
 * the parent's thread state, where it crashes: the watcher would be gone. */
static clone_fn
libc_clone(void)
{
#ifdef KVTD_TSAN
	void *h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
	void *f = h ? dlsym(h, "clone") : NULL;

	if (f)
		return (clone_fn)f;
#endif
	return clone;
}

static int
cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/*
 * Returns the child's pid and sets *ret_wfd (close-on-exec), or -1: the exec then tears down
 * the address space itself, in the pause, and no fallback watches it. With @w->rd >= 0 the child
 * keeps @fds (close-on-exec already cleared) and watches for the verdict.
 */
static pid_t
teardown_start(struct watch *w, const struct fdlist *fds, int *ret_wfd)
{
	const size_t stack = 64 << 10;
	int *p = w->p;
	char c;
	void *st;
	pid_t pid;

	w->n_keep = 0;
	w->keep = calloc((size_t)fds->n + 7, sizeof(*w->keep));
	if (!w->keep)
		return -1;
	if (pipe2(p, O_CLOEXEC) < 0)
		goto err_keep;
	if (pipe2(p + 2, O_CLOEXEC) < 0) {
		close(p[0]);
		close(p[1]);
		goto err_keep;
	}
	w->keep[w->n_keep++] = p[0];
	if (w->rd >= 0) {
		for (int fd = 0; fd < 3; fd++) /* the fallback logs to the same stderr */
			w->keep[w->n_keep++] = fd;
		w->keep[w->n_keep++] = w->rd;
		w->keep[w->n_keep++] = w->exe_fd;
		if (w->ack_w >= 0)
			w->keep[w->n_keep++] = w->ack_w;
		for (unsigned i = 0; i < fds->n; i++)
			w->keep[w->n_keep++] = fds->fd[i];
	}
	qsort(w->keep, w->n_keep, sizeof(*w->keep), cmp_int);
	st = mmap(NULL, stack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1,
		  0);
	if (st == MAP_FAILED) {
		for (int i = 0; i < 4; i++)
			close(p[i]);
		goto err_keep;
	}
	/* The stack and *w stay as they are: they live in the old address space, which the child
	 * ends; the parent only reads w->p afterwards. */
	pid = libc_clone()(teardown_child, (uint8_t *)st + stack, CLONE_VM | SIGCHLD, w);
	close(p[0]);
	close(p[3]);
	while (pid > 0 && read(p[2], &c, 1) < 0 && errno == EINTR)
		; /* EOF: the child closed its copies */
	close(p[2]);
	if (pid < 0) {
		close(p[1]);
		munmap(st, stack);
		goto err_keep;
	}
	*ret_wfd = p[1];
	return pid;
err_keep:
	free(w->keep);
	w->keep = NULL;
	return -1;
}

static void *
reap_thread(void *arg)
{
	/* The teardown child of the previous process is ours now (same pid); kvtierd has no
	 * other children. */
	while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
		;
	return arg;
}

static void
reaper_start(void)
{
	pthread_t t;

	if (pthread_create(&t, NULL, reap_thread, NULL) == 0)
		pthread_detach(t);
}

static void
set_cloexec(const struct fdlist *l, int on)
{
	for (unsigned i = 0; i < l->n; i++) {
		int f = fcntl(l->fd[i], F_GETFD);

		if (f >= 0)
			fcntl(l->fd[i], F_SETFD, on ? f | FD_CLOEXEC : f & ~FD_CLOEXEC);
	}
}

int
kvtd_restart_take_fd(int *argc, char **argv)
{
	char *end;
	long v;

	if (*argc < 3 || strcmp(argv[*argc - 2], "--restore-fd"))
		return -1;
	v = strtol(argv[*argc - 1], &end, 10);
	if (*end || v < 3 || v > INT_MAX)
		return -1;
	*argc -= 2;
	argv[*argc] = NULL;
	return (int)v;
}

int
kvtd_restart_take_check(int *argc, char **argv)
{
	if (*argc < 2 || strcmp(argv[*argc - 1], "--check-restart"))
		return 0;
	*argc -= 1;
	argv[*argc] = NULL;
	return 1;
}

#define PREFLIGHT_MS 10000 /* the longest a new binary may take to read its configuration */

/* The first line of @s, for a message. */
static const char *
first_line(char *s)
{
	size_t n = strcspn(s, "\n");

	s[n] = '\0';
	return s[0] ? s : "(no output)";
}

/*
 * The pre-flight: "<exe> <arguments> --check-restart", which reads the configuration as the
 * restarted process will and prints KVTD_RESTART_READY with the image version it reads. Run
 * while every session is still served; anything else (a configuration it refuses, a binary
 * that crashes, is not kvtierd, reads only older images or hangs) refuses the restart, the
 * reason logged and in d->restart_why. The exit status is taken when the reaper thread of a
 * restarted process did not take it first: the readiness line decides.
 */
static int
preflight(struct kvtd *d, int *ret_verdict)
{
	posix_spawn_file_actions_t fa;
	char out[512], **argv;
	size_t got = 0;
	uint64_t end = kvtd_now_ns() + (uint64_t)PREFLIGHT_MS * 1000000;
	int p[2], r, st = -1, hung = 0, ver = -1;
	const char *ready;
	pid_t pid;

	argv = calloc((size_t)d->argc + 2, sizeof(*argv));
	if (!argv)
		return -ENOMEM;
	memcpy(argv, d->argv, (size_t)d->argc * sizeof(*argv));
	argv[d->argc] = "--check-restart";
	if (pipe2(p, O_CLOEXEC) < 0) {
		r = -errno;
		free(argv);
		return r;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[1], 1);
	posix_spawn_file_actions_adddup2(&fa, p[1], 2);
	r = posix_spawn(&pid, d->exe, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(p[1]);
	free(argv);
	if (r) {
		close(p[0]);
		snprintf(d->restart_why, sizeof(d->restart_why), "cannot run %.120s: %s", d->exe,
			 strerror(r));
		return -r;
	}
	while (got < sizeof(out) - 1) {
		uint64_t now = kvtd_now_ns();
		struct pollfd pf = {.fd = p[0], .events = POLLIN};
		ssize_t n;

		if (now >= end || poll(&pf, 1, (int)((end - now) / 1000000) + 1) == 0) {
			hung = 1;
			break;
		}
		n = read(p[0], out + got, sizeof(out) - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	out[got] = '\0';
	close(p[0]);
	if (hung || waitpid(pid, &st, WNOHANG) == 0)
		kill(pid, SIGKILL); /* still running with its answer given or not: it is done */
	while (st == -1 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	ready = strstr(out, KVTD_RESTART_READY);
	if (ready)
		sscanf(ready + sizeof(KVTD_RESTART_READY) - 1, "%d", &ver);
	if (ready && ver >= KVTD_IMAGE_VERSION &&
	    (st == -1 || (WIFEXITED(st) && !WEXITSTATUS(st)))) {
		*ret_verdict = strstr(ready, " " KVTD_RESTART_VERDICT) != NULL;
		return 0;
	}
	if (hung)
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "%.120s --check-restart gave no answer in %d s", d->exe,
			 PREFLIGHT_MS / 1000);
	else if (ready)
		snprintf(
		    d->restart_why, sizeof(d->restart_why),
		    "%.120s reads restart images up to version %d; this kvtierd writes version %d",
		    d->exe, ver, KVTD_IMAGE_VERSION);
	else if (st != -1 && WIFSIGNALED(st))
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "%.120s --check-restart was killed by signal %d (%s): a damaged binary?",
			 d->exe, WTERMSIG(st), strsignal(WTERMSIG(st)));
	else if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st))
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "%.120s --check-restart exited %d: %.160s", d->exe, WEXITSTATUS(st),
			 first_line(out));
	else
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "%.120s gave no restart readiness line (not a kvtierd that restarts in "
			 "place?): %.160s",
			 d->exe, first_line(out));
	return -ECANCELED;
}

void
kvtd_restart_record(struct kvtd *d, int argc, char **argv)
{
	static const char deleted[] = " (deleted)";
	ssize_t n = readlink("/proc/self/exe", d->exe, sizeof(d->exe) - 1);

	d->exe[n > 0 ? n : 0] = '\0';
	/* A fallback runs a binary replaced on disk since: the next restart runs the path's. */
	if (n > (ssize_t)sizeof(deleted) && !strcmp(d->exe + n - sizeof(deleted) + 1, deleted))
		d->exe[n - sizeof(deleted) + 1] = '\0';
	/* Opened now: the binary this process runs, whatever the path holds by the next restart,
	 * is what a failed restart falls back to. */
	d->exe_fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	if (d->exe_fd < 0)
		log_warn("cannot open my own binary (%s): a restart that fails after its exec will "
			 "lose the sessions",
			 strerror(errno));
	d->argc = argc;
	d->argv = argv;
}

static int
is_pipe(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

int
kvtd_restart_take_watch(int *ret_ack)
{
	const char *v = getenv(KVTD_WATCH_ENV);
	long fd, ack = -1;
	char *end;

	*ret_ack = -1;
	if (!v)
		return -1;
	fd = strtol(v, &end, 10);
	if (*end == ',')
		ack = strtol(end + 1, &end, 10);
	unsetenv(KVTD_WATCH_ENV);
	/* Pipes only: a variable left over (an older kvtierd between two restarts kept it in its
	 * environment) may name a descriptor that is now a client's socket. */
	if (*end || fd < 3 || fd > INT_MAX || !is_pipe((int)fd) ||
	    fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0)
		return -1;
	if (ack >= 3 && ack <= INT_MAX && is_pipe((int)ack) &&
	    fcntl((int)ack, F_SETFD, FD_CLOEXEC) == 0)
		*ret_ack = (int)ack;
	return (int)fd;
}

char *
kvtd_restart_take_fallback(void)
{
	const char *v = getenv(KVTD_FALLBACK_ENV);
	char *why = v ? strdup(v) : NULL;

	unsetenv(KVTD_FALLBACK_ENV);
	return why;
}

void
kvtd_restart_give_up(struct kvtd *d, const char *why)
{
	char msg[400];
	int n;

	if (d->watch_fd < 0)
		return;
	n = snprintf(msg, sizeof(msg), "F%s", why);
	if (n > (int)sizeof(msg) - 1)
		n = (int)sizeof(msg) - 1;
	log_err("restart: this process %s: the previous binary takes the sessions back", why);
	if (write(d->watch_fd, msg, (size_t)n) < 0)
		log_err("restart: telling the watcher: %s", strerror(errno));
	/* Nothing shared has been changed yet: no cleanup, which could. */
	_exit(1);
}

/* The point of no return of a process started by a restart: it serves the sessions now. */
static void
took_over(struct kvtd *d)
{
	if (d->watch_fd < 0)
		return;
	if (write(d->watch_fd, "R", 1) != 1)
		log_warn("restart: telling the watcher it may go: %s", strerror(errno));
	close(d->watch_fd);
	d->watch_fd = -1;
}

void
kvtd_restart_await_main(struct kvtd *d)
{
	struct pollfd pf = {.fd = d->watch_ack_fd, .events = POLLIN};
	char c;

	if (d->watch_ack_fd < 0)
		return;
	/* The watcher hands the main pid back (and waits until the service manager has it), then
	 * closes its end: READY=1 from here on is the main pid's. The pollers serve meanwhile. */
	if (poll(&pf, 1, 10000) <= 0 || read(d->watch_ack_fd, &c, 1) != 0)
		log_warn("restart: the watcher did not hand the main pid back in 10 s");
	close(d->watch_ack_fd);
	d->watch_ack_fd = -1;
}

/* $NOTIFY_SOCKET as an address ("@name": abstract), or -ENOENT when not under systemd. */
static int
notify_addr(struct sockaddr_un *sa, socklen_t *ret_len)
{
	const char *e = getenv("NOTIFY_SOCKET");
	size_t n = e ? strlen(e) : 0;

	if (!n || n >= sizeof(sa->sun_path) || (e[0] != '/' && e[0] != '@'))
		return -ENOENT;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, e, n);
	if (e[0] == '@')
		sa->sun_path[0] = '\0';
	*ret_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (e[0] == '/'));
	return 0;
}

int
kvtd_restart(struct kvtd *d)
{
	/* read by the watcher after the exec, in the old address space: never freed then */
	static struct watch wt;
	struct wbuf w = {0};
	struct fdlist fds = {0};
	char fdarg[16], watch_env[48], **argv = NULL, **envp = NULL, **fb_envp = NULL;
	int r, img_fd = -1, twfd = -1, vp[2] = {-1, -1}, ap[2] = {-1, -1}, verdict = 0;
	size_t n_env = 0;
	pid_t tpid;

	d->restart_why[0] = '\0';
	if (kvt_dev_kind(d->dev) != KVT_DEV_HOST || d->pool.fd < 0) {
		log_err(
		    "restart: the %s backend cannot restart in place yet (device registrations "
		    "and IPC mappings are not carried over); restart the service instead, which "
		    "ends every session",
		    kvt_dev_name(d->dev));
		return -EOPNOTSUPP;
	}
	if (!d->exe[0] || access(d->exe, X_OK) < 0) {
		r = -errno;
		log_err("restart: cannot execute %s: %s", d->exe[0] ? d->exe : "(unknown binary)",
			strerror(-r));
		return r ? r : -ENOENT;
	}
	/* Before anything is stopped: a restart the new binary or configuration would fail is
	 * refused here, every session kept. */
	r = preflight(d, &verdict);
	if (r < 0) {
		if (!d->restart_why[0])
			snprintf(d->restart_why, sizeof(d->restart_why), "pre-flight of %.120s: %s",
				 d->exe, strerror(-r));
		log_err("restart refused: %s (still serving every session)", d->restart_why);
		return r;
	}
	d->restart_started_ns = kvtd_now_ns();
	/* Quiesce: with every poller's lock held no op runs; SQEs not yet drained stay in their
	 * rings. NEED_WAKEUP on every SQ makes clients ring their doorbell meanwhile; the count
	 * waits in the eventfd for the next process's poller. */
	for (unsigned i = 0; i < d->n_pollers; i++) {
		struct kvtd_poller *p = d->pollers[i];

		kvtd_poller_lock(p);
		for (unsigned j = 0; j < p->n_sessions; j++)
			kvt_ring_set_flags(p->sessions[j]->sq, KVT_RING_NEED_WAKEUP);
	}
	d->restarts++;
	r = image_write(d, &w, &fds);
	if (r < 0) {
		log_err("restart: writing the image: %s", strerror(-r));
		goto err;
	}
	img_fd = memfd_create("kvtierd-restart", MFD_CLOEXEC);
	if (img_fd < 0 || ftruncate(img_fd, (off_t)w.len) < 0) {
		r = -errno;
		log_err("restart: image memfd: %s", strerror(-r));
		goto err;
	}
	for (size_t off = 0; off < w.len;) {
		ssize_t n = pwrite(img_fd, w.p + off, w.len - off, (off_t)off);

		if (n < 0) {
			r = -errno;
			log_err("restart: writing the image: %s", strerror(-r));
			goto err;
		}
		off += (size_t)n;
	}
	fd_add(&fds, img_fd);
	argv = calloc((size_t)d->argc + 3, sizeof(*argv));
	if (!argv || fds.err) {
		r = -ENOMEM;
		goto err;
	}
	memcpy(argv, d->argv, (size_t)d->argc * sizeof(*argv));
	snprintf(fdarg, sizeof(fdarg), "%d", img_fd);
	argv[d->argc] = "--restore-fd";
	argv[d->argc + 1] = fdarg;
	/* The new process's environment names the verdict pipe; the fallback's names the reason
	 * (the watcher writes it into wt.why_env). */
	while (environ[n_env])
		n_env++;
	envp = calloc(n_env + 2, sizeof(*envp));
	fb_envp = calloc(n_env + 2, sizeof(*fb_envp));
	if (!envp || !fb_envp) {
		r = -ENOMEM;
		goto err;
	}
	memcpy(envp, environ, n_env * sizeof(*envp));
	memcpy(fb_envp, environ, n_env * sizeof(*fb_envp));
	wt.rd = -1;
	wt.ack_w = -1;
	wt.notify_len = 0;
	if (d->exe_fd >= 0 && pipe2(vp, O_CLOEXEC) == 0) {
		snprintf(watch_env, sizeof(watch_env), "%s=%d", KVTD_WATCH_ENV, vp[1]);
		/* Under systemd the watcher is the main pid while the new process may still fail
		 * (its death then stops nothing), and hands it back before letting go: the new
		 * process waits for that (the end of the ack pipe) before its READY=1. */
		if (notify_addr(&wt.notify_addr, &wt.notify_len) == 0 &&
		    pipe2(ap, O_CLOEXEC) == 0) {
			snprintf(watch_env, sizeof(watch_env), "%s=%d,%d", KVTD_WATCH_ENV, vp[1],
				 ap[0]);
			snprintf(wt.mainpid_msg, sizeof(wt.mainpid_msg), "MAINPID=%d",
				 (int)getpid());
			wt.ack_w = ap[1];
		} else {
			wt.notify_len = 0;
		}
		envp[n_env] = watch_env;
		snprintf(wt.why_env, sizeof(wt.why_env), "%s=%.200s ", KVTD_FALLBACK_ENV, d->exe);
		fb_envp[n_env] = wt.why_env;
		wt.rd = vp[0];
		wt.kill = verdict;
		wt.exe_fd = d->exe_fd;
		wt.parent = getpid();
		wt.argv = argv;
		wt.envp = fb_envp;
	} else {
		log_warn("restart: no fallback to this binary if the new one fails (%s)",
			 d->exe_fd < 0 ? "it could not be opened at start" : strerror(errno));
	}
	if (fds.err) {
		r = -ENOMEM;
		goto err;
	}
	/* The spill store is not carried (docs/spill.md): the new process opens it again, which
	 * its lock would refuse while the old ring still holds the file after the exec. */
	if (d->spill && (r = kvtd_spill_unlock(d->spill)) < 0) {
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "the spill store has requests in flight");
		log_err("restart refused: %s (still serving every session)", d->restart_why);
		goto err;
	}
	log_notice("restart %u: re-executing %s with %u descriptors, image %zu KiB", d->restarts,
		   d->exe, fds.n, w.len >> 10);
	sd_notify(0, "RELOADING=1\nSTATUS=restarting in place");
	/* Before the watcher copies them: it may have to execute the old binary with them. */
	set_cloexec(&fds, 0);
	tpid = teardown_start(&wt, &fds, &twfd);
	if (tpid < 0 && wt.rd >= 0) {
		log_warn("restart: no watcher (%s): no fallback if the new binary fails",
			 strerror(errno));
		envp[n_env] = NULL; /* nobody to give up to: the new process must not try */
	} else if (wt.rd >= 0) {
		fcntl(vp[1], F_SETFD, 0); /* the watcher has no copy: its end means the exec's */
		if (ap[0] >= 0)
			fcntl(ap[0], F_SETFD, 0);
		if (wt.notify_len) {
			/* the watcher is the main pid until the new process has taken over */
			sd_notifyf(0, "MAINPID=%d", (int)tpid);
			r = sd_notify_barrier(0, 5000000);
			if (r < 0)
				log_warn("restart: handing the main pid to the watcher: %s",
					 strerror(-r));
		}
	}
	execve(d->exe, argv, envp);
	r = -errno;
	if (vp[1] >= 0)
		fcntl(vp[1], F_SETFD, FD_CLOEXEC);
	if (ap[0] >= 0)
		fcntl(ap[0], F_SETFD, FD_CLOEXEC);
	if (tpid > 0) {
		/* not the exec's EOF: the watcher exits rather than take over */
		if (write(twfd, "x", 1) != 1)
			log_warn("restart: stopping the watcher: %s", strerror(errno));
		close(twfd);
		waitpid(tpid, NULL, 0);
		free(wt.keep);
		wt.keep = NULL;
	}
	set_cloexec(&fds, 1);
	if (d->spill && kvtd_spill_relock(d->spill) < 0) {
		log_err("restart: the spill store's lock was taken meanwhile: closing the store");
		kvtd_spill_close(d->spill);
		d->spill = NULL;
	}
	log_err("restart: exec %s: %s (still serving)", d->exe, strerror(-r));
	sd_notify(0, "READY=1\nSTATUS=serving (a restart failed)");
err:
	d->restarts--;
	if (img_fd >= 0)
		close(img_fd);
	for (int i = 0; i < 2; i++) {
		if (vp[i] >= 0)
			close(vp[i]);
		if (ap[i] >= 0)
			close(ap[i]);
	}
	free(argv);
	free(envp);
	free(fb_envp);
	free(w.p);
	free(fds.fd);
	for (unsigned i = 0; i < d->n_pollers; i++)
		kvtd_poller_unlock(d->pollers[i]);
	return r;
}

/* ---- restore (new process) ---------------------------------------------------------------- */

void
kvtd_restart_drop_inherited(void)
{
	reaper_start();
	DIR *dir = opendir("/proc/self/fd");
	int fds[1024], n = 0;
	struct dirent *e;

	if (!dir)
		return;
	while ((e = readdir(dir)) && n < 1024) {
		int fd = atoi(e->d_name);

		if (fd > 2 && fd != dirfd(dir))
			fds[n++] = fd;
	}
	closedir(dir);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	if (n == 1024)
		kvtd_restart_drop_inherited();
}

static int
fd_valid(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

int
kvtd_restart_listener(struct kvtd *d, const struct kvtd_image *img)
{
	d->listen_fd = d->signal_fd = d->timer_fd = d->metrics_fd = d->lock_fd = -1;
	d->restoring = 1;
	if (!fd_valid(img->listen_fd) || !fd_valid(img->lock_fd)) {
		log_err("restart: the listening socket or its lock did not cross the exec");
		return -EBADF;
	}
	d->listen_fd = img->listen_fd;
	d->lock_fd = img->lock_fd;
	d->sock_dev = (dev_t)img->sock_dev;
	d->sock_ino = (ino_t)img->sock_ino;
	fcntl(d->listen_fd, F_SETFD, FD_CLOEXEC);
	fcntl(d->lock_fd, F_SETFD, FD_CLOEXEC);
	return 0;
}

int
kvtd_restart_pool(struct kvtd *d, const struct kvtd_image *img)
{
	int r;

	if (!fd_valid(img->pool_fd))
		return -EBADF;
	fcntl(img->pool_fd, F_SETFD, FD_CLOEXEC);
	if (img->pool_size != d->cfg.pool_size)
		log_warn("restart: keeping the pool of %llu MiB (the configuration now says %llu "
			 "MiB: a new size takes a full restart)",
			 (unsigned long long)(img->pool_size >> 20),
			 (unsigned long long)(d->cfg.pool_size >> 20));
	r = kvtd_pool_adopt(&d->pool, &d->cfg, d->dev, img->pool_fd, img->pool_size,
			    img->chunk_size, (int)img->pool_hugetlb);
	if (r < 0)
		close(img->pool_fd);
	return r;
}

/* Closes what a record still owns (the restore gave up on it). */
static void
conn_drop_fds(struct img_conn *c)
{
	for (unsigned i = c->bufs_done; i < c->n_bufs; i++)
		close(c->bufs[i].fd);
	c->bufs_done = c->n_bufs;
	if (c->has_session && !c->fds_owned) {
		close(c->memfd);
		close(c->sq_efd);
		close(c->cq_efd);
		c->fds_owned = 1;
	}
}

/* A configuration read again may have lowered buffers_per_session or seqs_per_session: the
 * session keeps the ids it has (new ones obey the new limits). */
static int
grow_tables(struct kvtd_session *s, const struct img_conn *c)
{
	uint32_t nb = 0, nq = 0;

	for (uint32_t i = 0; i < c->n_bufs; i++)
		nb = c->bufs[i].id > nb ? c->bufs[i].id : nb;
	for (uint32_t i = 0; i < c->n_seqs; i++)
		nq = c->seqs[i].id > nq ? c->seqs[i].id : nq;
	if (nb > 65536 || nq > 65536)
		return -EBADMSG;
	if (nb > s->max_bufs) {
		void *p = realloc(s->bufs, nb * sizeof(*s->bufs));

		if (!p)
			return -ENOMEM;
		s->bufs = p;
		memset(s->bufs + s->max_bufs, 0, (nb - s->max_bufs) * sizeof(*s->bufs));
		log_warn("restart: session %u keeps %u buffer ids (buffers_per_session is %u now)",
			 s->id, nb, s->max_bufs);
		s->max_bufs = nb;
	}
	if (nq > s->max_seqs) {
		void *p = realloc(s->seqs, nq * sizeof(*s->seqs));

		if (!p)
			return -ENOMEM;
		s->seqs = p;
		memset(s->seqs + s->max_seqs, 0, (nq - s->max_seqs) * sizeof(*s->seqs));
		log_warn("restart: session %u keeps %u sequence ids (seqs_per_session is %u now)",
			 s->id, nq, s->max_seqs);
		s->max_seqs = nq;
	}
	return 0;
}

/* The namespace restored with @id (prefix_restore() gave each image namespace its id), in
 * O(1): a session's handles are found without a walk of every namespace. */
static struct kvtd_pns *
ns_by_id(const struct kvtd_image *img, uint32_t id)
{
	return img->px ? kvtd_prefix_ns_by_id(img->px, id) : NULL;
}

/* The prefix store's namespaces and blocks, slots claimed for the store (no reference yet). */
static int
prefix_restore(struct kvtd *d, struct kvtd_image *img)
{
	struct kvtd_prefix *px = &d->prefix;
	int r;

	img->px = px;
	for (uint32_t i = 0; i < img->n_ns; i++) {
		r = kvtd_prefix_restore_ns(px, &img->ns[i].p, img->ns[i].scope, img->ns[i].id,
					   img->ns[i].cnt, &img->ns[i].ns);
		if (r < 0)
			return r;
	}
	for (uint32_t i = 0; i < img->n_blk; i++) {
		uint64_t off[KVT_BLOCK_TOKENS_MAX];
		uint32_t bt = img->ns[img->blk[i].ns].p.block_tokens;

		memcpy(off, img->blk[i].off, (size_t)bt * 8); /* unaligned in the image */
		r = kvtd_prefix_restore_block(px, img->ns[img->blk[i].ns].ns, &img->blk[i].key, off,
					      &img->blocks[i]);
		if (r < 0)
			return r;
	}
	px->lookups = img->px_cnt[0];
	px->hit_blocks = img->px_cnt[1];
	px->miss_blocks = img->px_cnt[2];
	px->published = img->px_cnt[3];
	px->deduped = img->px_cnt[4];
	px->evicted = img->px_cnt[5];
	px->refused_budget = img->px_cnt[6];
	return 0;
}

/* A session rebuilt from @c: region, doorbells, indices, buffers, sequences (slots claimed). */
static int
session_restore(struct kvtd *d, struct kvtd_image *img, struct img_conn *c)
{
	struct kvtd_session *s;
	int r;

	if (!c->id || !fd_valid(c->memfd) || !fd_valid(c->sq_efd) || !fd_valid(c->cq_efd))
		return -EBADMSG;
	r = kvtd_session_adopt(d, c->memfd, c->sq_efd, c->cq_efd, c->sq_entries, c->cq_entries,
			       c->arena_size, &s);
	if (r < 0)
		return r;
	c->s = s;
	c->fds_owned = 1;
	fcntl(s->memfd, F_SETFD, FD_CLOEXEC);
	fcntl(s->sq_efd, F_SETFD, FD_CLOEXEC);
	fcntl(s->cq_efd, F_SETFD, FD_CLOEXEC);
	s->id = c->id;
	s->pid = c->pid;
	s->uid = c->uid;
	s->gid = c->gid;
	memcpy(s->name, c->name, sizeof(s->name));
	s->start_ns = c->start_ns;
	s->sq_head = c->sq_head;
	s->cq_tail = c->cq_tail;
	s->cq_head_seen = c->cq_head_seen;
	s->op_err_gen = c->op_err_gen; /* the op error record's sequence goes on where it was */
	s->ops = c->ops;
	s->errors = c->errors;
	r = grow_tables(s, c);
	if (r < 0)
		return r;
	/* The private CQ view must be one the drain could have left. */
	if (kvt_ring_space(s->cq_entries, s->cq_head_seen, s->cq_tail) > s->cq_entries)
		return -EBADMSG;
	for (; c->bufs_done < c->n_bufs; c->bufs_done++) {
		struct img_buf *b = &c->bufs[c->bufs_done];
		struct kvt_dev_import imp = {
		    .kind = KVT_BUF_HOST_MEMFD, .fd = b->fd, .size = b->size};
		struct kvt_dev_buf *buf;

		if (!b->id || b->id > s->max_bufs || s->bufs[b->id - 1]) {
			r = -EBADMSG;
		} else {
			r = kvt_dev_buf_import(d->dev, &imp, &buf);
			if (r == 0)
				s->bufs[b->id - 1] = buf;
		}
		close(b->fd); /* the import keeps its own */
		if (r < 0)
			return r;
	}
	s->prefix_scope = c->prefix_scope;
	for (int i = 0; i < KVT_MAX_NS; i++) {
		struct img_ns_handle *ih = &c->nsh[i];
		struct kvtd_ns_handle *h = &s->ns[i];

		if (!ih->ns_id)
			continue;
		h->ns = ns_by_id(img, ih->ns_id);
		if (!h->ns)
			return -EBADMSG;
		kvtd_prefix_ns_hold(&d->prefix, h->ns);
		/* its row size's class, counted among the uid's when the session joins it */
		r = kvtd_pool_class_get_for(&d->pool, h->ns->token_bytes, NULL);
		if (r < 0)
			return r;
		h->uid_cls = r + 1;
		h->pins = calloc(ih->n_pins ? ih->n_pins : 1, sizeof(*h->pins));
		if (!h->pins)
			return -ENOMEM;
		h->cap_pins = ih->n_pins;
		/* the pin array is the session's memory, charged as a LOOKUP charges it (the uid's
		 * share follows with the session's bytes in kvtd_loop_adopt()); never refused */
		h->pins_bytes = (uint64_t)h->cap_pins * sizeof(*h->pins);
		pthread_mutex_lock(&d->pool.lock);
		s->acct.bytes += h->pins_bytes;
		pthread_mutex_unlock(&d->pool.lock);
		for (uint32_t k = 0; k < ih->n_pins; k++) {
			if (ih->pins[k] >= img->n_blk || img->blocks[ih->pins[k]]->ns != h->ns)
				return -EBADMSG;
			h->pins[k] = img->blocks[ih->pins[k]];
			kvtd_prefix_ref(&d->prefix, h->pins[k], 1);
			h->n_pins++;
		}
	}
	for (uint32_t i = 0; i < c->n_seqs; i++) {
		struct img_seq *q = &c->seqs[i];

		if (q->ns_id) {
			q->si.ns = ns_by_id(img, q->ns_id);
			if (!q->si.ns)
				return -EBADMSG;
			q->si.blk_idx = q->blk_idx;
			q->si.blocks = img->blocks;
			q->si.n_blocks = img->n_blk;
		}
		r = kvtd_session_seq_restore(s, &q->p, q->id, &q->si);
		if (r < 0) {
			log_err("restart: session %u seq %u: %s", s->id, q->id, strerror(-r));
			return r;
		}
	}
	return 0;
}

/* Frees a session whose restore is being abandoned, without touching the pool: the pool is
 * made again from scratch afterwards. */
static void
session_abandon(struct kvtd_session *s)
{
	for (unsigned i = 0; i < s->max_seqs; i++)
		if (s->seqs[i]) {
			s->seqs[i]->ts.n = 0; /* no slot goes back */
			s->seqs[i]->n_kblk = 0;
		}
	kvtd_session_destroy(s);
}

static void
reply_asker(struct kvtd *d, void *conn, uint64_t id, unsigned sessions, unsigned seqs,
	    double pause_ms)
{
	char text[256];

	snprintf(text, sizeof(text),
		 "{\"schema\":%d,\"restarted\":true,\"pid\":%d,\"restarts\":%u,\"sessions\":%u,"
		 "\"seqs\":%u,\"pause_ms\":%.3f,\"version\":\"%s\"}",
		 KVT_CTL_SCHEMA, (int)getpid(), d->restarts, sessions, seqs, pause_ms, KVT_VERSION);
	kvtd_loop_reply(d, conn, id, 0, text);
}

int
kvtd_restart_sessions(struct kvtd *d, struct kvtd_image *img)
{
	unsigned n_sessions = 0, n_seqs = 0;
	void *asker = NULL;
	double pause_ms;
	uint32_t i;
	int r = 0;

	reaper_start();
	/* One uid entry per session at most: a lowered max_sessions must not leave a restored
	 * session's uid without one (new sessions obey it: handle_hello() in loop.c). */
	if (kvtd_image_sessions(img) > d->n_uids) {
		unsigned n = kvtd_image_sessions(img);
		struct kvtd_uid *u = realloc(d->uids, (size_t)n * sizeof(*u));

		if (u) {
			memset(u + d->n_uids, 0, (size_t)(n - d->n_uids) * sizeof(*u));
			d->uids = u;
			d->n_uids = n;
		}
	}
	d->next_session_id = img->next_session_id;
	d->restarts = img->restarts - (d->fell_back ? 1 : 0); /* counted by the old process */
	d->start_ns = img->start_ns;
	d->restart_started_ns = img->restart_started_ns;
	atomic_store(&d->cnt.ops, img->cnt[0]);
	atomic_store(&d->cnt.errors, img->cnt[1]);
	atomic_store(&d->cnt.refused_einval, img->cnt[2]);
	atomic_store(&d->cnt.refused_auth, img->cnt[3]);
	atomic_store(&d->cnt.refused_hello_timeout, img->cnt[4]);
	atomic_store(&d->cnt.refused_limit, img->cnt[5]);
	atomic_store(&d->cnt.sessions_total, img->cnt[6]);
	atomic_store(&d->cnt.ring_corrupt, img->cnt[7]);

	/* 1: the prefix store, then sessions and their slots, nothing visible yet */
	r = prefix_restore(d, img);
	if (r < 0)
		log_err("restart: the prefix store cannot be restored: %s", strerror(-r));
	for (i = 0; i < img->n_conns && r == 0; i++) {
		struct img_conn *c = &img->conns[i];

		if (!fd_valid(c->fd)) {
			r = -EBADMSG;
			break;
		}
		fcntl(c->fd, F_SETFD, FD_CLOEXEC);
		if (!c->has_session)
			continue;
		for (uint32_t k = 0; k < c->n_seqs; k++)
			c->seqs[k].si.old_base = img->pool_base;
		r = session_restore(d, img, c);
		if (r < 0)
			log_err("restart: session %u (pid %d '%s') cannot be restored: %s", c->id,
				(int)c->pid, c->name, strerror(-r));
	}
	kvtd_pool_claim_done(&d->pool);
	/* 2: retrieval indexes, which allocate pages from the pool */
	for (i = 0; i < img->n_conns && r == 0; i++) {
		struct kvtd_session *s = img->conns[i].s;

		uint64_t limit;

		if (!s)
			continue;
		/* Charged, but never held to a limit lowered by this restart: an account over
		 * its new limit is only refused new work. No poller runs s yet. */
		limit = s->acct.limit;
		s->acct.limit = 0;
		for (unsigned k = 0; k < s->max_seqs && r == 0; k++)
			if (s->seqs[k]) {
				r = kvtd_seq_restore_retrieval(kvtd_session_ctx(s), s->seqs[k]);
				if (r < 0)
					log_err(
					    "restart: session %u seq %u: rebuilding its retrieval "
					    "index: %s",
					    s->id, k + 1, strerror(-r));
			}
		s->acct.limit = limit;
	}
	if (r < 0) {
		char why[160];

		snprintf(why, sizeof(why), "could not restore the sessions: %s", strerror(-r));
		kvtd_restart_give_up(d, why); /* with a watcher, the old binary takes them back */
		goto err_abandon;
	}
	/* Nothing shared has changed so far: from here on the sessions are served. */
	took_over(d);
	/* 3: serve them; adopting prepends, so the last first keeps the list's order */
	for (i = img->n_conns; i-- > 0;) {
		struct img_conn *c = &img->conns[i];
		struct kvtd_conn_info ci = {c->fd,  c->state,	   c->pid, c->uid,
					    c->gid, c->privileged, c->s,   NULL};
		void *conn;

		r = kvtd_loop_adopt(d, &ci, &conn);
		if (r < 0) {
			log_err("restart: connection of pid %d cannot be served again: %s: closing "
				"it",
				(int)c->pid, strerror(-r));
			if (c->s)
				kvtd_session_destroy(c->s);
			c->s = NULL;
			close(c->fd);
			r = 0;
			continue;
		}
		if (c->asker)
			asker = conn;
		if (c->s) {
			n_sessions++;
			n_seqs += c->s->n_seqs;
		}
	}
	/* A poller asleep since before its sessions came may have doorbells already rung. */
	for (unsigned p = 0; p < d->n_pollers; p++)
		eventfd_write(d->pollers[p]->wake_efd, 1);
	pause_ms = (double)(kvtd_now_ns() - img->restart_started_ns) / 1e6;
	if (d->fell_back) {
		char msg[640];

		snprintf(msg, sizeof(msg),
			 "restart failed: %s; the previous binary took back %u session(s), pid %d",
			 d->fell_back, n_sessions, (int)getpid());
		log_err(
		    "restart failed after the exec: %s; the previous binary (this process, pid "
		    "%d) took every session back: %u session(s), %u sequence(s), paused %.1f ms",
		    d->fell_back, (int)getpid(), n_sessions, n_seqs, pause_ms);
		if (asker)
			kvtd_loop_reply(d, asker, img->restart_req_id, -ECANCELED, msg);
		return 0;
	}
	log_notice("restart %u: serving again, %u session(s) and %u sequence(s) kept "
		   "(image of kvtierd %s), paused %.1f ms",
		   d->restarts, n_sessions, n_seqs, img->version, pause_ms);
	if (asker)
		reply_asker(d, asker, img->restart_req_id, n_sessions, n_seqs, pause_ms);
	return 0;

err_abandon:
	log_err("restart: dropping every session of the previous process (their clients see "
		"the connection reset) and starting with an empty pool");
	for (i = 0; i < img->n_conns; i++) {
		struct img_conn *c = &img->conns[i];

		if (c->s)
			session_abandon(c->s);
		c->s = NULL;
		conn_drop_fds(c);
		if (fd_valid(c->fd))
			close(c->fd);
	}
	kvtd_prefix_abandon(&d->prefix);
	kvtd_pool_fini(&d->pool);
	{
		int e = kvtd_pool_init(&d->pool, &d->cfg, d->dev);

		if (e == 0)
			e = kvtd_prefix_init(&d->prefix, &d->pool,
					     kvtd_config_prefix_bytes(&d->cfg));
		if (e == 0)
			kvtd_prefix_limits(&d->prefix, d->cfg.prefix_namespaces_per_uid,
					   d->cfg.pool_bytes_per_uid);
		if (e < 0)
			return e;
	}
	return r;
}
