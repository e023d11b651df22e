/* SPDX-License-Identifier: MIT */
/*
 * dev_host.c - the host backend: device buffers are sealed memfds mapped shared with the client,
 * copies are memcpy. It is what runs on machines without a GPU and what every CPU test drives.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvt_ctl.h"
#include "kvt_dev.h"

struct kvt_dev {
	enum kvt_dev_kind kind;
};

struct kvt_dev_buf {
	_Atomic unsigned refs;
	uint64_t size;
	uint8_t *map;
};

int
kvt_dev_open(enum kvt_dev_kind want, struct kvt_dev **ret_dev)
{
	struct kvt_dev *dev;

	if (want == KVT_DEV_CUDA)
		return -ENODEV; /* this build has no CUDA backend */
	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return -ENOMEM;
	dev->kind = KVT_DEV_HOST;
	*ret_dev = dev;
	return 0;
}

void
kvt_dev_close(struct kvt_dev *dev)
{
	free(dev);
}

enum kvt_dev_kind
kvt_dev_kind(const struct kvt_dev *dev)
{
	return dev->kind;
}

const char *
kvt_dev_name(const struct kvt_dev *dev)
{
	return "host";
}

int
kvt_dev_host_register(struct kvt_dev *dev, void *p, size_t len)
{
	return ((uintptr_t)p & 4095) ? -EINVAL : 0;
}

void
kvt_dev_host_unregister(struct kvt_dev *dev, void *p, size_t len)
{
}

int
kvt_dev_buf_import(struct kvt_dev *dev, const struct kvt_dev_import *imp,
		   struct kvt_dev_buf **ret_buf)
{
	struct kvt_dev_buf *buf;
	struct stat st;
	int seals;

	if (imp->kind != KVT_BUF_HOST_MEMFD || !imp->size)
		return -EINVAL;
	if (fstat(imp->fd, &st) < 0)
		return -errno;
	seals = fcntl(imp->fd, F_GET_SEALS);
	if (seals < 0)
		return errno == EINVAL ? -EINVAL : -errno; /* not a memfd */
	/* Without F_SEAL_SHRINK the client could truncate the file and fault the daemon. */
	if (!(seals & F_SEAL_SHRINK) || (uint64_t)st.st_size < imp->size)
		return -EINVAL;
	buf = calloc(1, sizeof(*buf));
	if (!buf)
		return -ENOMEM;
	buf->map = mmap(NULL, imp->size, PROT_READ | PROT_WRITE, MAP_SHARED, imp->fd, 0);
	if (buf->map == MAP_FAILED) {
		int r = -errno;

		free(buf);
		return r;
	}
	buf->size = imp->size;
	atomic_init(&buf->refs, 1);
	*ret_buf = buf;
	return 0;
}

void
kvt_dev_buf_get(struct kvt_dev_buf *buf)
{
	atomic_fetch_add_explicit(&buf->refs, 1, memory_order_relaxed);
}

void
kvt_dev_buf_put(struct kvt_dev_buf *buf)
{
	if (!buf)
		return;
	/* acq_rel: the last putter must see every other holder's copies before unmapping. */
	if (atomic_fetch_sub_explicit(&buf->refs, 1, memory_order_acq_rel) != 1)
		return;
	munmap(buf->map, buf->size);
	free(buf);
}

uint64_t
kvt_dev_buf_size(const struct kvt_dev_buf *buf)
{
	return buf->size;
}

static int
rows_check(const struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (rows[i].buf_off > buf->size || rows[i].len > buf->size - rows[i].buf_off)
			return -ERANGE;
	return 0;
}

int
kvt_dev_copy_h2d(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		 unsigned n)
{
	int r = rows_check(buf, rows, n);

	if (r < 0)
		return r;
	for (unsigned i = 0; i < n; i++)
		memcpy(buf->map + rows[i].buf_off, rows[i].host, rows[i].len);
	return 0;
}

int
kvt_dev_copy_d2h(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		 unsigned n)
{
	int r = rows_check(buf, rows, n);

	if (r < 0)
		return r;
	for (unsigned i = 0; i < n; i++)
		memcpy(rows[i].host, buf->map + rows[i].buf_off, rows[i].len);
	return 0;
}

int
kvt_dev_sync(struct kvt_dev *dev)
{
	return 0;
}
