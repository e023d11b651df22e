/* SPDX-License-Identifier: MIT */
/*
 * The spill store of spill.h. Ownership: the store owns its file descriptor, eventfd, ring and
 * tables; the memory requests move is the caller's, registered with the ring (pinned by the
 * kernel) until replaced or the store closes. A request holds its extent (ext->inflight): the
 * extent leaves the eviction heap while it has one, and cannot be freed, so the kernel never
 * writes into space that was handed to someone else.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "extent.h"
#include "spill.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif
#ifndef RAMFS_MAGIC
#define RAMFS_MAGIC 0x858458f6
#endif

#define NONE UINT32_MAX

struct ext_ent {
	uint64_t unit, n_units;
	double imp;
	uint64_t tag;
	uid_t uid;
	uint32_t gen;	   /* odd while live: a handle names a slot and its generation */
	uint32_t inflight; /* requests on it not yet reaped */
	uint32_t heap_pos; /* NONE: not in the heap (free, or a request in flight) */
	uint32_t next_free;
};

struct req {
	kvtd_spill_ext ext;
	uint64_t cookie;
	uint64_t len, io_len;
	int op;
	int fault; /* 0, or the injected result kind */
	uint32_t next_free;
};

struct uid_use {
	uid_t uid;
	uint64_t bytes;
};

struct kvtd_spill {
	int fd, efd;
	struct io_uring ring;
	int ring_up, files_up;
	uint64_t size;
	uint64_t share; /* bytes a uid may hold; 0: no limit */
	uid_t owner;
	struct kvtd_ext_alloc alloc;

	struct ext_ent *ext;
	uint32_t n_ext, cap_ext, ext_free;
	uint32_t *heap; /* min-heap of slots by (imp, slot); cap_ext entries */
	uint32_t heap_n;

	struct req *req; /* queue_depth entries */
	unsigned qd, in_flight, queued;
	uint32_t req_free;

	struct iovec bufs[KVTD_SPILL_MAX_BUFS]; /* ascending by base */
	unsigned n_bufs;

	struct uid_use *uids;
	unsigned n_uids, cap_uids;

	unsigned fault_ops, fault_left;
	int fault_kind;

	struct kvtd_spill_stats st;
};

/* ---- extents, handles, the heap -------------------------------------------------------- */

static kvtd_spill_ext
handle(const struct kvtd_spill *s, uint32_t slot)
{
	return (uint64_t)s->ext[slot].gen << 32 | slot;
}

static struct ext_ent *
ext_get(const struct kvtd_spill *s, kvtd_spill_ext h)
{
	uint32_t slot = (uint32_t)h;

	if (slot >= s->n_ext || s->ext[slot].gen != (uint32_t)(h >> 32) || !(s->ext[slot].gen & 1))
		return NULL;
	return &s->ext[slot];
}

static int
heap_less(const struct kvtd_spill *s, uint32_t a, uint32_t b)
{
	return s->ext[a].imp < s->ext[b].imp || (s->ext[a].imp == s->ext[b].imp && a < b);
}

static void
heap_place(struct kvtd_spill *s, uint32_t pos, uint32_t slot)
{
	s->heap[pos] = slot;
	s->ext[slot].heap_pos = pos;
}

static void
heap_sift(struct kvtd_spill *s, uint32_t pos)
{
	uint32_t slot = s->heap[pos];

	while (pos && heap_less(s, slot, s->heap[(pos - 1) / 2])) {
		heap_place(s, pos, s->heap[(pos - 1) / 2]);
		pos = (pos - 1) / 2;
	}
	for (;;) {
		uint32_t c = 2 * pos + 1;

		if (c >= s->heap_n)
			break;
		if (c + 1 < s->heap_n && heap_less(s, s->heap[c + 1], s->heap[c]))
			c++;
		if (!heap_less(s, s->heap[c], slot))
			break;
		heap_place(s, pos, s->heap[c]);
		pos = c;
	}
	heap_place(s, pos, slot);
}

static void
heap_push(struct kvtd_spill *s, uint32_t slot)
{
	heap_place(s, s->heap_n++, slot);
	heap_sift(s, s->heap_n - 1);
}

static void
heap_remove(struct kvtd_spill *s, uint32_t slot)
{
	uint32_t pos = s->ext[slot].heap_pos, last;

	if (pos == NONE)
		return;
	s->ext[slot].heap_pos = NONE;
	last = s->heap[--s->heap_n];
	if (pos < s->heap_n) {
		heap_place(s, pos, last);
		heap_sift(s, pos);
	}
}

static struct uid_use *
uid_find(struct kvtd_spill *s, uid_t uid, int add)
{
	struct uid_use *spare = NULL;

	for (unsigned i = 0; i < s->n_uids; i++) {
		if (s->uids[i].uid == uid)
			return &s->uids[i];
		if (!s->uids[i].bytes && !spare)
			spare = &s->uids[i];
	}
	if (!add)
		return NULL;
	if (!spare) {
		if (s->n_uids == s->cap_uids) {
			unsigned cap = s->cap_uids ? 2 * s->cap_uids : 8;
			struct uid_use *u = realloc(s->uids, cap * sizeof(*u));

			if (!u)
				return NULL;
			s->uids = u;
			s->cap_uids = cap;
		}
		spare = &s->uids[s->n_uids++];
	}
	spare->uid = uid;
	spare->bytes = 0;
	return spare;
}

uint64_t
kvtd_spill_uid_bytes(const struct kvtd_spill *s, uid_t uid)
{
	struct uid_use *u = uid_find((struct kvtd_spill *)s, uid, 0);

	return u ? u->bytes : 0;
}

static int
ext_grow(struct kvtd_spill *s)
{
	uint32_t cap = s->cap_ext ? 2 * s->cap_ext : 256;
	struct ext_ent *e;
	uint32_t *h;

	if (s->cap_ext >= NONE / 2)
		return -ENOMEM;
	e = realloc(s->ext, cap * sizeof(*e));
	if (!e)
		return -ENOMEM;
	s->ext = e;
	h = realloc(s->heap, cap * sizeof(*h));
	if (!h)
		return -ENOMEM;
	s->heap = h;
	s->cap_ext = cap;
	return 0;
}

int
kvtd_spill_alloc(struct kvtd_spill *s, uid_t uid, uint64_t bytes, double importance, uint64_t tag,
		 kvtd_spill_ext *ret_ext)
{
	uint64_t n, unit;
	struct uid_use *u;
	uint32_t slot;
	int r;

	if (!bytes || bytes > s->size)
		return -EINVAL;
	n = (bytes + KVTD_SPILL_UNIT - 1) / KVTD_SPILL_UNIT;
	u = uid_find(s, uid, 1);
	if (!u)
		return -ENOMEM;
	if (s->share && uid != 0 && uid != s->owner && u->bytes + n * KVTD_SPILL_UNIT > s->share) {
		s->st.refused_quota++;
		return -EDQUOT;
	}
	if (s->ext_free == NONE && s->n_ext == s->cap_ext && (r = ext_grow(s)) < 0)
		return r;
	r = kvtd_ext_alloc(&s->alloc, n, &unit);
	if (r < 0) {
		if (r == -ENOSPC)
			s->st.refused_nospc++;
		return r;
	}
	if (s->ext_free != NONE) {
		slot = s->ext_free;
		s->ext_free = s->ext[slot].next_free;
	} else {
		slot = s->n_ext++;
		s->ext[slot].gen = 0;
	}
	s->ext[slot].gen++; /* odd: live */
	s->ext[slot].unit = unit;
	s->ext[slot].n_units = n;
	s->ext[slot].imp = importance;
	s->ext[slot].tag = tag;
	s->ext[slot].uid = uid;
	s->ext[slot].inflight = 0;
	s->ext[slot].heap_pos = NONE;
	heap_push(s, slot);
	u->bytes += n * KVTD_SPILL_UNIT;
	s->st.extents++;
	*ret_ext = handle(s, slot);
	return 0;
}

static void
ext_release(struct kvtd_spill *s, uint32_t slot)
{
	struct ext_ent *e = &s->ext[slot];
	struct uid_use *u = uid_find(s, e->uid, 0);

	heap_remove(s, slot);
	kvtd_ext_free(&s->alloc, e->unit, e->n_units); /* ours: cannot fail */
	if (u)
		u->bytes -= e->n_units * KVTD_SPILL_UNIT;
	e->gen++; /* even: free; the old handle is stale */
	if (!e->gen)
		e->gen = 2;
	e->next_free = s->ext_free;
	s->ext_free = slot;
	s->st.extents--;
}

int
kvtd_spill_free(struct kvtd_spill *s, kvtd_spill_ext ext)
{
	struct ext_ent *e = ext_get(s, ext);

	if (!e)
		return -ENOENT;
	if (e->inflight)
		return -EBUSY;
	ext_release(s, (uint32_t)ext);
	return 0;
}

int
kvtd_spill_set_importance(struct kvtd_spill *s, kvtd_spill_ext ext, double importance)
{
	struct ext_ent *e = ext_get(s, ext);

	if (!e)
		return -ENOENT;
	e->imp = importance;
	if (e->heap_pos != NONE)
		heap_sift(s, e->heap_pos);
	return 0;
}

int
kvtd_spill_extent(const struct kvtd_spill *s, kvtd_spill_ext ext, uint64_t *ret_off,
		  uint64_t *ret_bytes)
{
	const struct ext_ent *e = ext_get(s, ext);

	if (!e)
		return -ENOENT;
	*ret_off = e->unit * KVTD_SPILL_UNIT;
	*ret_bytes = e->n_units * KVTD_SPILL_UNIT;
	return 0;
}

int
kvtd_spill_evict_lowest(struct kvtd_spill *s, struct kvtd_spill_dropped *ret)
{
	uint32_t slot;
	struct ext_ent *e;

	if (!s->st.extents)
		return -ENOENT;
	if (!s->heap_n)
		return -EBUSY; /* every extent has a request in flight */
	slot = s->heap[0];
	e = &s->ext[slot];
	ret->ext = handle(s, slot);
	ret->uid = e->uid;
	ret->tag = e->tag;
	ret->bytes = e->n_units * KVTD_SPILL_UNIT;
	ret->importance = e->imp;
	s->st.dropped++;
	s->st.dropped_bytes += ret->bytes;
	ext_release(s, slot);
	return 0;
}

/* ---- open and close --------------------------------------------------------------------- */

static int fail(char *err, size_t errlen, int r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
fail(char *err, size_t errlen, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return r;
}

/* The file or device: opened, locked, sized. Returns the descriptor or -errno with @err. */
static int
open_backing(const struct kvtd_spill_params *p, struct kvtd_spill *s, char *err, size_t errlen)
{
	struct stat st;
	struct statfs sfs;
	int fd, r, existed, blk = 0;
	uint64_t size = p->size;

	existed = stat(p->path, &st) == 0;
	if (!existed && errno != ENOENT)
		return fail(err, errlen, -errno, "[spill] path %s: %s", p->path, strerror(errno));
	if (existed && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
		return fail(err, errlen, -EINVAL,
			    "[spill] path %s is neither a regular file nor a block device",
			    p->path);
	blk = existed && S_ISBLK(st.st_mode);
	fd = open(p->path, O_RDWR | O_CLOEXEC | O_DIRECT | (blk ? 0 : O_CREAT), 0600);
	if (fd < 0) {
		r = -errno;
		if (r == -EINVAL) {
			if (!existed)
				unlink(p->path);
			return fail(
			    err, errlen, r,
			    "[spill] path %s: its file system does not support O_DIRECT: put "
			    "the store on a local disk file system (ext4, xfs, btrfs) or name "
			    "a block device",
			    p->path);
		}
		return fail(err, errlen, r, "[spill] path %s: cannot open: %s%s", p->path,
			    strerror(-r), r == -ENOENT ? " (its directory must exist)" : "");
	}
	if (!blk && fstatfs(fd, &sfs) == 0 &&
	    (sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC)) {
		r = fail(err, errlen, -EINVAL,
			 "[spill] path %s is on tmpfs or ramfs, which is memory: spilling there "
			 "frees none; put the store on a disk file system (ext4, xfs) or a block "
			 "device",
			 p->path);
		goto err_close;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		r = -errno;
		fail(err, errlen, r,
		     "[spill] path %s is in use (locked by another process, another "
		     "kvtierd?): give each daemon its own store",
		     p->path);
		goto err_close;
	}
	if (blk) {
		uint64_t dev_size;
		int lbs;

		if (ioctl(fd, BLKGETSIZE64, &dev_size) < 0 || ioctl(fd, BLKSSZGET, &lbs) < 0) {
			r = fail(err, errlen, -errno, "[spill] path %s: cannot read its size: %s",
				 p->path, strerror(errno));
			goto err_close;
		}
		if (lbs > (int)KVTD_SPILL_UNIT) {
			r = fail(
			    err, errlen, -EINVAL,
			    "[spill] path %s has %d-byte logical blocks: the store does I/O in "
			    "4096-byte units",
			    p->path, lbs);
			goto err_close;
		}
		if (size > dev_size) {
			r = fail(
			    err, errlen, -EINVAL,
			    "[spill] size %llu is larger than %s (%llu bytes): leave size at 0 "
			    "for the whole device",
			    (unsigned long long)size, p->path, (unsigned long long)dev_size);
			goto err_close;
		}
		if (!size)
			size = dev_size;
	} else {
		if (fstat(fd, &st) < 0) {
			r = fail(err, errlen, -errno, "[spill] path %s: %s", p->path,
				 strerror(errno));
			goto err_close;
		}
		if (!size)
			size = (uint64_t)st.st_size;
		if (!size) {
			r = fail(err, errlen, -EINVAL,
				 "[spill] path %s is a new or empty file: set [spill] size",
				 p->path);
			goto err_close;
		}
		size -= size % KVTD_SPILL_UNIT;
		/* every block now, so that no write fails later for the file system's room */
		r = posix_fallocate(fd, 0, (off_t)size);
		if (r == ENOSPC || r == EFBIG) {
			r = fail(err, errlen, -r,
				 "[spill] path %s: the file system has no room for %llu MiB: free "
				 "space or lower [spill] size",
				 p->path, (unsigned long long)(size >> 20));
			goto err_close;
		}
		if (r) {
			r = fail(err, errlen, -r, "[spill] path %s: cannot allocate %llu MiB: %s",
				 p->path, (unsigned long long)(size >> 20), strerror(r));
			goto err_close;
		}
	}
	size -= size % KVTD_SPILL_UNIT;
	if (size < KVTD_SPILL_MIN_SIZE) {
		r = fail(err, errlen, -EINVAL,
			 "[spill] size: %llu bytes is below the 1 MiB minimum",
			 (unsigned long long)size);
		goto err_close;
	}
	s->size = size;
	s->st.block_device = blk;
	return fd;
err_close:
	close(fd);
	return r;
}

/* One O_DIRECT read of a unit: the open flag alone proves nothing on some file systems. */
static int
probe_direct(int fd, const char *path, char *err, size_t errlen)
{
	void *buf;
	ssize_t n;
	int r = 0;

	if (posix_memalign(&buf, KVTD_SPILL_UNIT, KVTD_SPILL_UNIT))
		return fail(err, errlen, -ENOMEM, "[spill] out of memory");
	n = pread(fd, buf, KVTD_SPILL_UNIT, 0);
	if (n < 0)
		r = fail(err, errlen, -errno,
			 "[spill] path %s: an O_DIRECT read of 4096 bytes fails (%s): the file "
			 "system or device does not do direct I/O in 4 KiB units; use a local disk "
			 "file system (ext4, xfs) or a block device",
			 path, strerror(errno));
	else if (n != KVTD_SPILL_UNIT)
		r = fail(err, errlen, -EIO, "[spill] path %s: a 4096-byte read returned %zd bytes",
			 path, n);
	free(buf);
	return r;
}

int
kvtd_spill_open(const struct kvtd_spill_params *p, struct kvtd_spill **ret_s, char *err,
		size_t errlen)
{
	struct kvtd_spill *s;
	int r;

	if (!p->path || !p->path[0])
		return fail(err, errlen, -EINVAL, "[spill] path is empty");
	if (p->queue_depth < 1 || p->queue_depth > KVTD_SPILL_MAX_QD)
		return fail(err, errlen, -EINVAL, "[spill] queue_depth %u: 1 to %u", p->queue_depth,
			    KVTD_SPILL_MAX_QD);
	s = calloc(1, sizeof(*s));
	if (!s)
		return fail(err, errlen, -ENOMEM, "[spill] out of memory");
	s->efd = -1;
	s->ext_free = NONE;
	s->req_free = NONE;
	s->owner = p->owner;
	s->fd = open_backing(p, s, err, errlen);
	if (s->fd < 0) {
		r = s->fd;
		goto err_free;
	}
	r = probe_direct(s->fd, p->path, err, errlen);
	if (r < 0)
		goto err_close;
	/* sizes are far below 2^57: the product does not overflow */
	s->share = p->uid_share ? p->uid_share : s->size * p->uid_share_pct / 100;
	r = kvtd_ext_init(&s->alloc, s->size / KVTD_SPILL_UNIT);
	if (r < 0) {
		fail(err, errlen, r, "[spill] extent table for %llu MiB: %s",
		     (unsigned long long)(s->size >> 20), strerror(-r));
		goto err_close;
	}
	s->qd = p->queue_depth;
	s->req = calloc(s->qd, sizeof(*s->req));
	if (!s->req) {
		r = fail(err, errlen, -ENOMEM, "[spill] out of memory");
		goto err_close;
	}
	for (unsigned i = s->qd; i-- > 0;) {
		s->req[i].next_free = s->req_free;
		s->req_free = i;
	}
	s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->efd < 0) {
		r = fail(err, errlen, -errno, "[spill] eventfd: %s", strerror(errno));
		goto err_close;
	}
	/* the SQ holds every request that may be in flight: queueing never waits for room */
	r = io_uring_queue_init(s->qd, &s->ring, 0);
	if (r < 0) {
		fail(err, errlen, r, "[spill] io_uring_queue_init(%u): %s", s->qd, strerror(-r));
		goto err_close;
	}
	s->ring_up = 1;
	r = io_uring_register_files(&s->ring, &s->fd, 1);
	if (r < 0) {
		fail(err, errlen, r, "[spill] registering the file with io_uring: %s",
		     strerror(-r));
		goto err_close;
	}
	s->files_up = 1;
	r = io_uring_register_eventfd(&s->ring, s->efd);
	if (r < 0) {
		fail(err, errlen, r, "[spill] registering the eventfd with io_uring: %s",
		     strerror(-r));
		goto err_close;
	}
	s->st.size = s->size;
	s->st.queue_depth = s->qd;
	*ret_s = s;
	return 0;
err_close:
	kvtd_spill_close(s);
	return r;
err_free:
	free(s);
	return r;
}

void
kvtd_spill_close(struct kvtd_spill *s)
{
	if (!s)
		return;
	if (s->ring_up) {
		struct io_uring_cqe *cqe;

		/* the kernel may still be writing into the callers' buffers: wait it out */
		io_uring_submit(&s->ring);
		while (s->in_flight && io_uring_wait_cqe(&s->ring, &cqe) == 0) {
			io_uring_cqe_seen(&s->ring, cqe);
			s->in_flight--;
		}
		io_uring_queue_exit(&s->ring);
	}
	if (s->efd >= 0)
		close(s->efd);
	/* the ring's fixed-file table may hold the file a while after the exit: the lock goes now,
	 * so that a store opened again at once (a restart, a test) is not refused */
	if (s->fd >= 0) {
		flock(s->fd, LOCK_UN);
		close(s->fd);
	}
	kvtd_ext_fini(&s->alloc);
	free(s->req);
	free(s->ext);
	free(s->heap);
	free(s->uids);
	free(s);
}

int
kvtd_spill_unlock(struct kvtd_spill *s)
{
	if (s->in_flight)
		return -EBUSY;
	return flock(s->fd, LOCK_UN) < 0 ? -errno : 0;
}

int
kvtd_spill_relock(struct kvtd_spill *s)
{
	return flock(s->fd, LOCK_EX | LOCK_NB) < 0 ? -errno : 0;
}

int
kvtd_spill_fd(const struct kvtd_spill *s)
{
	return s->efd;
}

static int
cmp_iov(const void *a, const void *b)
{
	const struct iovec *x = a, *y = b;

	return x->iov_base < y->iov_base ? -1 : x->iov_base > y->iov_base;
}

int
kvtd_spill_register_buffers(struct kvtd_spill *s, const struct iovec *iov, unsigned n)
{
	struct iovec sorted[KVTD_SPILL_MAX_BUFS];
	int r;

	if (s->in_flight)
		return -EBUSY;
	if (!n || n > KVTD_SPILL_MAX_BUFS)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++)
		if (!iov[i].iov_len || iov[i].iov_len > KVTD_SPILL_MAX_BUF ||
		    (uintptr_t)iov[i].iov_base % KVTD_SPILL_UNIT ||
		    iov[i].iov_len % KVTD_SPILL_UNIT)
			return -EINVAL;
	memcpy(sorted, iov, n * sizeof(*iov));
	qsort(sorted, n, sizeof(*sorted), cmp_iov);
	for (unsigned i = 1; i < n; i++)
		if ((char *)sorted[i - 1].iov_base + sorted[i - 1].iov_len >
		    (char *)sorted[i].iov_base)
			return -EINVAL; /* overlapping regions */
	if (s->n_bufs) {
		io_uring_unregister_buffers(&s->ring);
		s->n_bufs = 0;
	}
	r = io_uring_register_buffers(&s->ring, sorted, n);
	if (r < 0)
		return r;
	memcpy(s->bufs, sorted, n * sizeof(*iov));
	s->n_bufs = n;
	return 0;
}

/* The registered buffer holding [p, p + len), or -1. */
static int
buf_index(const struct kvtd_spill *s, const void *p, uint64_t len)
{
	unsigned lo = 0, hi = s->n_bufs;

	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;

		if ((const char *)s->bufs[mid].iov_base <= (const char *)p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!lo)
		return -1;
	lo--;
	if ((uint64_t)((const char *)p - (const char *)s->bufs[lo].iov_base) + len >
	    s->bufs[lo].iov_len)
		return -1;
	return (int)lo;
}

/* ---- I/O -------------------------------------------------------------------------------- */

static int
queue_io(struct kvtd_spill *s, int op, kvtd_spill_ext ext, void *buf, uint64_t len, uint64_t cookie)
{
	struct ext_ent *e = ext_get(s, ext);
	struct io_uring_sqe *sqe;
	uint64_t io_len;
	uint32_t slot = (uint32_t)ext, ri;
	struct req *rq;
	int bi;

	if (!e)
		return -ENOENT;
	if (!len || len > e->n_units * KVTD_SPILL_UNIT || len > KVTD_SPILL_MAX_BUF)
		return -EINVAL;
	io_len = (len + KVTD_SPILL_UNIT - 1) & ~(uint64_t)(KVTD_SPILL_UNIT - 1);
	if ((uintptr_t)buf % KVTD_SPILL_UNIT || (bi = buf_index(s, buf, io_len)) < 0)
		return -EINVAL;
	if (s->req_free == NONE)
		return -EBUSY;
	sqe = io_uring_get_sqe(&s->ring);
	if (!sqe) {
		/* cannot happen with the SQ sized to queue_depth; kept for a kernel that
		 * rounds differently */
		io_uring_submit(&s->ring);
		s->queued = 0;
		if (!(sqe = io_uring_get_sqe(&s->ring)))
			return -EBUSY;
	}
	ri = s->req_free;
	rq = &s->req[ri];
	s->req_free = rq->next_free;
	rq->ext = ext;
	rq->cookie = cookie;
	rq->len = len;
	rq->io_len = io_len;
	rq->op = op;
	rq->fault = 0;
	if (s->fault_left && (s->fault_ops & (unsigned)op)) {
		/* the kernel sees a NOP; its completion gets the injected result */
		rq->fault = s->fault_kind;
		s->fault_left--;
		s->st.injected++;
		io_uring_prep_nop(sqe);
	} else if (op == KVTD_SPILL_OP_WRITE) {
		io_uring_prep_write_fixed(sqe, 0, buf, (unsigned)io_len, e->unit * KVTD_SPILL_UNIT,
					  bi);
		sqe->flags |= IOSQE_FIXED_FILE;
	} else {
		io_uring_prep_read_fixed(sqe, 0, buf, (unsigned)io_len, e->unit * KVTD_SPILL_UNIT,
					 bi);
		sqe->flags |= IOSQE_FIXED_FILE;
	}
	io_uring_sqe_set_data64(sqe, ri);
	if (!e->inflight++)
		heap_remove(s, slot);
	s->in_flight++;
	s->queued++;
	return 0;
}

int
kvtd_spill_write(struct kvtd_spill *s, kvtd_spill_ext ext, const void *buf, uint64_t len,
		 uint64_t cookie)
{
	return queue_io(s, KVTD_SPILL_OP_WRITE, ext, (void *)buf, len, cookie);
}

int
kvtd_spill_read(struct kvtd_spill *s, kvtd_spill_ext ext, void *buf, uint64_t len, uint64_t cookie)
{
	return queue_io(s, KVTD_SPILL_OP_READ, ext, buf, len, cookie);
}

int
kvtd_spill_submit(struct kvtd_spill *s)
{
	int r;

	if (!s->queued)
		return 0;
	r = io_uring_submit(&s->ring);
	if (r < 0)
		return r;
	s->queued = s->queued > (unsigned)r ? s->queued - (unsigned)r : 0;
	return r;
}

static void
complete(struct kvtd_spill *s, uint32_t ri, int res, struct kvtd_spill_cqe *out)
{
	struct req *rq = &s->req[ri];
	uint32_t slot = (uint32_t)rq->ext;
	struct ext_ent *e = &s->ext[slot];
	const char *what = rq->op == KVTD_SPILL_OP_WRITE ? "write" : "read";
	const char *inj = rq->fault ? " (injected)" : "";

	if (rq->fault)
		res = rq->fault == KVTD_SPILL_FAULT_SHORT ? (int)(rq->io_len / 2) : rq->fault;
	out->cookie = rq->cookie;
	out->ext = rq->ext;
	out->op = rq->op;
	out->reason[0] = '\0';
	if (res < 0) {
		snprintf(out->reason, sizeof(out->reason),
			 "spill %s of %llu bytes at offset %llu failed: %s%s", what,
			 (unsigned long long)rq->io_len,
			 (unsigned long long)(e->unit * KVTD_SPILL_UNIT), strerror(-res), inj);
		out->res = res;
	} else if ((uint64_t)res < rq->io_len) {
		snprintf(out->reason, sizeof(out->reason),
			 "short %s at offset %llu: %d of %llu bytes%s", what,
			 (unsigned long long)(e->unit * KVTD_SPILL_UNIT), res,
			 (unsigned long long)rq->io_len, inj);
		out->res = -EIO;
		s->st.short_io++;
	} else {
		out->res = (int32_t)rq->len;
	}
	if (res < 0) {
		if (res == -EIO)
			s->st.eio_errors++;
		else if (res == -ENOSPC)
			s->st.nospc_errors++;
		else
			s->st.other_errors++;
	}
	if (out->res < 0) {
		if (rq->op == KVTD_SPILL_OP_WRITE)
			s->st.write_errors++;
		else
			s->st.read_errors++;
	} else if (rq->op == KVTD_SPILL_OP_WRITE) {
		s->st.writes++;
		s->st.write_bytes += rq->len;
	} else {
		s->st.reads++;
		s->st.read_bytes += rq->len;
	}
	if (!--e->inflight)
		heap_push(s, slot);
	rq->next_free = s->req_free;
	s->req_free = ri;
	s->in_flight--;
}

int
kvtd_spill_reap(struct kvtd_spill *s, struct kvtd_spill_cqe *out, unsigned max)
{
	struct io_uring_cqe *cqe;
	unsigned n = 0;
	int r;

	/* the eventfd is its poller's to read (spill.h): no system call here but the submit */
	r = kvtd_spill_submit(s);
	if (r < 0)
		return r;
	while (n < max && io_uring_peek_cqe(&s->ring, &cqe) == 0) {
		uint64_t ri = io_uring_cqe_get_data64(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&s->ring, cqe);
		if (ri >= s->qd)
			continue; /* not ours: nothing else posts to this ring */
		complete(s, (uint32_t)ri, res, &out[n++]);
	}
	return (int)n;
}

int
kvtd_spill_wait(struct kvtd_spill *s)
{
	struct io_uring_cqe *cqe;
	int r;

	if (!s->in_flight)
		return -EAGAIN;
	r = io_uring_submit_and_wait(&s->ring, 1);
	if (r < 0)
		return r;
	s->queued = 0;
	return io_uring_peek_cqe(&s->ring, &cqe) == 0 ? 0 : -EAGAIN;
}

void
kvtd_spill_get_stats(const struct kvtd_spill *s, struct kvtd_spill_stats *ret)
{
	*ret = s->st;
	ret->free = s->alloc.free_units * KVTD_SPILL_UNIT;
	ret->used = s->size - ret->free;
	ret->largest_free = kvtd_ext_largest(&s->alloc) * KVTD_SPILL_UNIT;
	ret->in_flight = s->in_flight;
	ret->uid_share = s->share;
	ret->uids = 0;
	for (unsigned i = 0; i < s->n_uids; i++)
		ret->uids += s->uids[i].bytes != 0;
}

static int
uid_before(const struct kvtd_spill_uid *a, const struct uid_use *b)
{
	return a->bytes > b->bytes || (a->bytes == b->bytes && a->uid < b->uid);
}

unsigned
kvtd_spill_uids(const struct kvtd_spill *s, struct kvtd_spill_uid *out, unsigned max)
{
	unsigned n = 0, held = 0;

	/* insertion into the @max largest: a store has few uids */
	for (unsigned i = 0; i < s->n_uids; i++) {
		const struct uid_use *u = &s->uids[i];
		unsigned j;

		if (!u->bytes)
			continue;
		held++;
		for (j = n; j > 0 && !uid_before(&out[j - 1], u); j--)
			if (j < max)
				out[j] = out[j - 1];
		if (j < max) {
			out[j] = (struct kvtd_spill_uid){u->uid, u->bytes};
			if (n < max)
				n++;
		}
	}
	return held;
}

int
kvtd_spill_inject(struct kvtd_spill *s, unsigned ops, int kind, unsigned count)
{
	if (count && (!(ops & (KVTD_SPILL_OP_READ | KVTD_SPILL_OP_WRITE)) ||
		      (kind != -EIO && kind != -ENOSPC && kind != KVTD_SPILL_FAULT_SHORT)))
		return -EINVAL;
	s->fault_ops = ops;
	s->fault_kind = kind;
	s->fault_left = count;
	return 0;
}
