/* SPDX-License-Identifier: MIT */
/*
 * kvt_dev.h - the device layer the daemon copies through. No CUDA types here.
 *
 * A backend pins host memory (the pool), imports client buffers (a sealed memfd on the host
 * backend, a CUDA IPC handle on the CUDA backend) and copies batches of rows between the two.
 * The host backend is complete and always built: device buffers are memfds the client maps and
 * copies are memcpy. The CUDA backend (dev_cuda.c) builds when the toolkit is found.
 *
 * Thread safety: a struct kvt_dev may be used from several threads at once; one struct
 * kvt_dev_buf may be copied to/from by several threads; get/put are atomic.
 */
#ifndef KVT_DEV_H
#define KVT_DEV_H

#include <stddef.h>
#include <stdint.h>

enum kvt_dev_kind {
	KVT_DEV_AUTO = 0, /* CUDA when a device is present, else host */
	KVT_DEV_HOST = 1,
	KVT_DEV_CUDA = 2,
};

struct kvt_dev;
struct kvt_dev_buf;

/* What a client hands over to share one buffer. */
struct kvt_dev_import {
	uint32_t kind;		/* KVT_BUF_HOST_MEMFD or KVT_BUF_CUDA_IPC (proto/kvt_ctl.h) */
	int fd;			/* memfd, host backend; not consumed: the caller closes it */
	uint64_t size;		/* bytes the client claims */
	uint8_t ipc_handle[64]; /* CUDA backend */
	uint8_t device_uuid[16];
};

/* One row to copy: @len bytes between buffer offset @buf_off and host address @host. */
struct kvt_dev_copy {
	uint64_t buf_off;
	void *host;
	uint64_t len;
};

/*
 * kvt_dev_open() - start a backend.
 * @want: KVT_DEV_AUTO, KVT_DEV_HOST or KVT_DEV_CUDA.
 * Returns 0, -ENODEV (CUDA asked for, none present or not built), -ENOMEM.
 */
int kvt_dev_open(enum kvt_dev_kind want, struct kvt_dev **ret_dev);

/* Stops the backend. Every imported buffer must have been put. NULL is fine. */
void kvt_dev_close(struct kvt_dev *dev);

/* KVT_DEV_HOST or KVT_DEV_CUDA, and a name for logs ("host", "cuda:0 NVIDIA H200"). */
enum kvt_dev_kind kvt_dev_kind(const struct kvt_dev *dev);
const char *kvt_dev_name(const struct kvt_dev *dev);

/*
 * kvt_dev_host_register() - make pool memory usable for device copies (pinning on CUDA; a no-op
 * check on the host backend, where the pool is already mlock()ed). All or nothing.
 * Returns 0, -EINVAL (unaligned), -ENOMEM, -EIO (device error, logged by the caller).
 */
int kvt_dev_host_register(struct kvt_dev *dev, void *p, size_t len);
void kvt_dev_host_unregister(struct kvt_dev *dev, void *p, size_t len);

/*
 * kvt_dev_buf_import() - map a client buffer into the daemon.
 * Host backend: @imp->fd must be a memfd carrying F_SEAL_SHRINK (so it can never shrink under
 * the daemon's mapping) and at least @imp->size bytes. The returned buffer holds one reference.
 * Returns 0, -EINVAL (wrong kind, size 0, not sealed), -EBADF, -ENOMEM, -ENODEV.
 */
int kvt_dev_buf_import(struct kvt_dev *dev, const struct kvt_dev_import *imp,
		       struct kvt_dev_buf **ret_buf);
void kvt_dev_buf_get(struct kvt_dev_buf *buf);
/* Drops a reference; the last one unmaps (CUDA: closes the IPC handle) after pending copies. */
void kvt_dev_buf_put(struct kvt_dev_buf *buf);
uint64_t kvt_dev_buf_size(const struct kvt_dev_buf *buf);

/*
 * kvt_dev_copy_h2d() / kvt_dev_copy_d2h() - copy a batch of rows to / from a buffer in one call.
 * Every (buf_off, len) must lie inside the buffer (callers validate; this checks again).
 * The copy is complete when the call returns on the host backend; on CUDA it is ordered on the
 * backend's stream and kvt_dev_sync() waits for it.
 * Returns 0, -ERANGE (row outside the buffer), -EIO.
 */
int kvt_dev_copy_h2d(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		     unsigned n);
int kvt_dev_copy_d2h(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		     unsigned n);
int kvt_dev_sync(struct kvt_dev *dev);

#endif /* KVT_DEV_H */
