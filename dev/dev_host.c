/* SPDX-License-Identifier: MIT */
/*
 * dev_host.c - the host backend: device buffers are sealed memfds mapped shared with the client,
 * copies are memcpy. It is what runs on machines without a GPU and what every CPU test drives.
 * Reached through dev.c (kvt_dev_* dispatch on the ops table at the head of each object).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev_int.h"
#include "kvt_ctl.h"

struct kvt_dev {
	struct kvt_dev_base base;
};

struct kvt_dev_buf {
	struct kvt_dev_buf_base base;
	uint8_t *map;
	int fd; /* a duplicate of the client's memfd, for a restart (kvt_dev_buf_fd()) */
};

int
kvt_dev_host_open(struct kvt_dev **ret_dev)
{
	struct kvt_dev *dev = calloc(1, sizeof(*dev));

	if (!dev)
		return -ENOMEM;
	dev->base.ops = &kvt_dev_host_ops;
	*ret_dev = dev;
	return 0;
}

static void
host_close(struct kvt_dev *dev)
{
	free(dev);
}

static const char *
host_name(const struct kvt_dev *dev)
{
	return "host";
}

static int
host_register(struct kvt_dev *dev, void *p, size_t len)
{
	return ((uintptr_t)p & 4095) ? -EINVAL : 0;
}

static void
host_unregister(struct kvt_dev *dev, void *p, size_t len)
{
}

static int
host_alloc(struct kvt_dev *dev, size_t len, void **ret_p)
{
	return -EOPNOTSUPP; /* host_register() never refuses, so nobody needs this */
}

static void
host_free(struct kvt_dev *dev, void *p, size_t len)
{
}

static int
host_import(struct kvt_dev *dev, const struct kvt_dev_import *imp, struct kvt_dev_buf **ret_buf)
{
	struct kvt_dev_buf *buf;
	struct stat st;
	int seals;

	if (imp->kind != KVT_BUF_HOST_MEMFD)
		return -EOPNOTSUPP; /* a CUDA IPC handle: this backend has no device */
	if (!imp->size)
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
	buf->fd = fcntl(imp->fd, F_DUPFD_CLOEXEC, 3);
	if (buf->fd < 0) {
		int r = -errno;

		munmap(buf->map, imp->size);
		free(buf);
		return r;
	}
	buf->base.ops = &kvt_dev_host_ops;
	buf->base.size = imp->size;
	*ret_buf = buf;
	return 0;
}

static void
host_release(struct kvt_dev_buf *buf)
{
	munmap(buf->map, buf->base.size);
	close(buf->fd);
	free(buf);
}

int
kvt_dev_host_buf_fd(const struct kvt_dev_buf *buf)
{
	return buf->fd;
}

static int
host_copy(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows, unsigned n,
	  int to_dev)
{
	for (unsigned i = 0; i < n; i++) {
		if (to_dev)
			memcpy(buf->map + rows[i].buf_off, rows[i].host, rows[i].len);
		else
			memcpy(rows[i].host, buf->map + rows[i].buf_off, rows[i].len);
	}
	return 0;
}

static int
host_sync(struct kvt_dev *dev)
{
	return 0;
}

static int
host_event_create(struct kvt_dev *dev, const uint8_t device_uuid[16], struct kvt_dev_event **ret_ev,
		  uint8_t ret_handle[64])
{
	return -EOPNOTSUPP; /* copies are complete when the op's CQE is posted */
}

static int
host_event_record(struct kvt_dev *dev, struct kvt_dev_event *ev)
{
	return 0;
}

static void
host_event_destroy(struct kvt_dev *dev, struct kvt_dev_event *ev)
{
}

const struct kvt_dev_ops kvt_dev_host_ops = {
    .kind = KVT_DEV_HOST,
    .close = host_close,
    .name = host_name,
    .host_register = host_register,
    .host_unregister = host_unregister,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .buf_import = host_import,
    .buf_release = host_release,
    .copy = host_copy,
    .sync = host_sync,
    .event_create = host_event_create,
    .event_record = host_event_record,
    .event_destroy = host_event_destroy,
};
