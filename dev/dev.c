/* SPDX-License-Identifier: MIT */
/*
 * dev.c - the public device-layer entry points: backend choice, dispatch, buffer refcounts and
 * the log hook. Backends live in dev_host.c and dev_cuda.c.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "dev_int.h"
#include "kvt_abi.h"

static void
log_stderr(int level, const char *msg)
{
	/* The daemon's own format (sd-daemon level prefix), one write per line. */
	fprintf(stderr, "<%d>%s\n", level, msg);
}

static kvt_dev_log_fn *_Atomic log_fn = log_stderr;

void
kvt_dev_set_log(kvt_dev_log_fn *fn)
{
	atomic_store(&log_fn, fn ? fn : log_stderr);
}

void
kvt_dev_log(int level, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	atomic_load (&log_fn)(level, msg);
}

int
kvt_dev_open(enum kvt_dev_kind want, struct kvt_dev **ret_dev)
{
	int r;

	if (want != KVT_DEV_AUTO && want != KVT_DEV_HOST && want != KVT_DEV_CUDA)
		return -EINVAL;
	if (want == KVT_DEV_HOST)
		return kvt_dev_host_open(ret_dev);
#ifdef KVT_HAVE_CUDA
	r = kvt_dev_cuda_open(ret_dev);
	if (r == 0 || want == KVT_DEV_CUDA || r != -ENODEV)
		return r;
	kvt_dev_log(KVT_DEV_LOG_NOTICE, "no usable CUDA device: using the host backend");
#else
	if (want == KVT_DEV_CUDA) {
		kvt_dev_log(KVT_DEV_LOG_ERR, "CUDA backend asked for, but this kvtier was built "
					     "without CUDA (KVT_CUDA=OFF or no toolkit)");
		return -ENODEV;
	}
	(void)r;
#endif
	return kvt_dev_host_open(ret_dev);
}

static const struct kvt_dev_ops *
ops_of(const struct kvt_dev *dev)
{
	return ((const struct kvt_dev_base *)dev)->ops;
}

void
kvt_dev_close(struct kvt_dev *dev)
{
	if (dev)
		ops_of(dev)->close(dev);
}

enum kvt_dev_kind
kvt_dev_kind(const struct kvt_dev *dev)
{
	return ops_of(dev)->kind;
}

const char *
kvt_dev_name(const struct kvt_dev *dev)
{
	return ops_of(dev)->name(dev);
}

int
kvt_dev_numa_node(struct kvt_dev *dev)
{
	return ops_of(dev)->numa_node ? ops_of(dev)->numa_node(dev) : -1;
}

int
kvt_dev_pci_numa_node(const char *sysfs_pci, const char *bus_id)
{
	char path[256], id[64];
	int node = -1;
	size_t i;
	FILE *f;

	for (i = 0; bus_id[i] && i < sizeof(id) - 1; i++)
		id[i] = (char)tolower((unsigned char)bus_id[i]);
	id[i] = '\0';
	if (!i || strchr(id, '/') || strstr(id, ".."))
		return -1;
	snprintf(path, sizeof(path), "%s/%s/numa_node", sysfs_pci, id);
	f = fopen(path, "re");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &node) != 1 || node < 0)
		node = -1;
	fclose(f);
	return node;
}

int
kvt_dev_host_register(struct kvt_dev *dev, void *p, size_t len)
{
	return ops_of(dev)->host_register(dev, p, len);
}

void
kvt_dev_host_unregister(struct kvt_dev *dev, void *p, size_t len)
{
	ops_of(dev)->host_unregister(dev, p, len);
}

int
kvt_dev_host_alloc(struct kvt_dev *dev, size_t len, void **ret_p)
{
	return ops_of(dev)->host_alloc(dev, len, ret_p);
}

void
kvt_dev_host_free(struct kvt_dev *dev, void *p, size_t len)
{
	if (p)
		ops_of(dev)->host_free(dev, p, len);
}

int
kvt_dev_buf_import(struct kvt_dev *dev, const struct kvt_dev_import *imp,
		   struct kvt_dev_buf **ret_buf)
{
	struct kvt_dev_buf *buf;
	int r;

	if (!imp->size)
		return -EINVAL;
	r = ops_of(dev)->buf_import(dev, imp, &buf);
	if (r < 0)
		return r;
	atomic_init(&((struct kvt_dev_buf_base *)buf)->refs, 1);
	*ret_buf = buf;
	return 0;
}

void
kvt_dev_buf_get(struct kvt_dev_buf *buf)
{
	atomic_fetch_add_explicit(&((struct kvt_dev_buf_base *)buf)->refs, 1, memory_order_relaxed);
}

void
kvt_dev_buf_put(struct kvt_dev_buf *buf)
{
	struct kvt_dev_buf_base *b = (struct kvt_dev_buf_base *)buf;

	if (!buf)
		return;
	/* acq_rel: the last putter must see every other holder's copies before releasing. */
	if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
		return;
	b->ops->buf_release(buf);
}

uint64_t
kvt_dev_buf_size(const struct kvt_dev_buf *buf)
{
	return ((const struct kvt_dev_buf_base *)buf)->size;
}

int
kvt_dev_buf_fd(const struct kvt_dev_buf *buf)
{
	const struct kvt_dev_buf_base *b = (const struct kvt_dev_buf_base *)buf;

	return b->ops->kind == KVT_DEV_HOST ? kvt_dev_host_buf_fd(buf) : -EOPNOTSUPP;
}

int
kvt_dev_rows_check(uint64_t size, const struct kvt_dev_copy *rows, unsigned n, int mode)
{
	for (unsigned i = 0; i < n; i++) {
		uint64_t out = kvt_dev_out_bytes(&rows[i], mode);

		if (Q8(&rows[i], mode) &&
		    (!rows[i].group || rows[i].len > UINT64_MAX / 2 ||
		     (rows[i].dtype != KVT_DTYPE_F16 && rows[i].dtype != KVT_DTYPE_BF16)))
			return -EINVAL;
		if (rows[i].buf_off > size || out > size - rows[i].buf_off)
			return -ERANGE;
	}
	return 0;
}

static int
copy(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows, unsigned n,
     int mode)
{
	int r = kvt_dev_rows_check(kvt_dev_buf_size(buf), rows, n, mode);

	if (r < 0 || !n)
		return r;
	return ops_of(dev)->copy(dev, buf, rows, n, mode);
}

int
kvt_dev_copy_h2d(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		 unsigned n)
{
	return copy(dev, buf, rows, n, KVT_DEV_H2D);
}

int
kvt_dev_copy_d2h(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		 unsigned n)
{
	return copy(dev, buf, rows, n, KVT_DEV_D2H);
}

int
kvt_dev_dequant_ok(const struct kvt_dev *dev)
{
	return ops_of(dev)->kind == KVT_DEV_CUDA;
}

int
kvt_dev_copy_h2d_q8(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		    unsigned n)
{
	if (!kvt_dev_dequant_ok(dev))
		return -EOPNOTSUPP;
	return copy(dev, buf, rows, n, KVT_DEV_H2D_Q8);
}

int
kvt_dev_sync(struct kvt_dev *dev)
{
	return ops_of(dev)->sync(dev);
}

uint64_t
kvt_dev_fence(struct kvt_dev *dev)
{
	return ops_of(dev)->fence ? ops_of(dev)->fence(dev) : 0;
}

uint64_t
kvt_dev_fence_done(struct kvt_dev *dev)
{
	return ops_of(dev)->fence_done ? ops_of(dev)->fence_done(dev) : 0;
}

int
kvt_dev_fence_wait(struct kvt_dev *dev, uint64_t f)
{
	return ops_of(dev)->fence_wait ? ops_of(dev)->fence_wait(dev, f) : 0;
}

int
kvt_dev_event_create(struct kvt_dev *dev, const uint8_t device_uuid[16],
		     struct kvt_dev_event **ret_ev, uint8_t ret_handle[64])
{
	return ops_of(dev)->event_create(dev, device_uuid, ret_ev, ret_handle);
}

int
kvt_dev_event_record(struct kvt_dev *dev, struct kvt_dev_event *ev)
{
	return ev ? ops_of(dev)->event_record(dev, ev) : 0;
}

void
kvt_dev_event_destroy(struct kvt_dev *dev, struct kvt_dev_event *ev)
{
	if (ev)
		ops_of(dev)->event_destroy(dev, ev);
}
