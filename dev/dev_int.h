/* SPDX-License-Identifier: MIT */
/*
 * dev_int.h - private to dev/: how the public kvt_dev_* functions (dev.c) reach a backend.
 *
 * Every backend object starts with a pointer to its backend's operations, so dev.c dispatches
 * on the object itself: a struct kvt_dev_buf knows its backend without its struct kvt_dev.
 * No CUDA types here either; dev_cuda.c keeps those to itself.
 */
#ifndef KVT_DEV_INT_H
#define KVT_DEV_INT_H

#include "kvt_dev.h"

/* kvt_dev_ops.copy's direction: out of the device, into it, into it with int8 rows honoured. */
enum { KVT_DEV_D2H = 0, KVT_DEV_H2D = 1, KVT_DEV_H2D_Q8 = 2 };

/* An int8 row (kvt_dev_copy.scale) of a KVT_DEV_H2D_Q8 batch; other batches ignore the field. */
#define Q8(c, mode) ((mode) == KVT_DEV_H2D_Q8 && (c)->scale)

/* Bytes a row writes on the far side. */
static inline uint64_t
kvt_dev_out_bytes(const struct kvt_dev_copy *c, int mode)
{
	return Q8(c, mode) ? 2 * c->len : c->len;
}

struct kvt_dev_ops {
	enum kvt_dev_kind kind;
	void (*close)(struct kvt_dev *dev);
	const char *(*name)(const struct kvt_dev *dev);
	int (*numa_node)(struct kvt_dev *dev); /* NULL: no device, -1 */
	int (*host_register)(struct kvt_dev *dev, void *p, size_t len);
	void (*host_unregister)(struct kvt_dev *dev, void *p, size_t len);
	int (*host_alloc)(struct kvt_dev *dev, size_t len, void **ret_p);
	void (*host_free)(struct kvt_dev *dev, void *p, size_t len);
	int (*buf_import)(struct kvt_dev *dev, const struct kvt_dev_import *imp,
			  struct kvt_dev_buf **ret_buf);
	void (*buf_release)(struct kvt_dev_buf *buf); /* the last reference went */
	int (*copy)(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		    unsigned n, int to_dev); /* KVT_DEV_D2H, _H2D or _H2D_Q8 */
	int (*sync)(struct kvt_dev *dev);
	/* NULL on a backend whose copies are complete on return (fences are always 0). */
	uint64_t (*fence)(struct kvt_dev *dev);
	uint64_t (*fence_done)(struct kvt_dev *dev);
	int (*fence_wait)(struct kvt_dev *dev, uint64_t f);
	int (*event_create)(struct kvt_dev *dev, const uint8_t device_uuid[16],
			    struct kvt_dev_event **ret_ev, uint8_t ret_handle[64]);
	int (*event_record)(struct kvt_dev *dev, struct kvt_dev_event *ev);
	void (*event_destroy)(struct kvt_dev *dev, struct kvt_dev_event *ev);
};

/* The head of every struct kvt_dev. */
struct kvt_dev_base {
	const struct kvt_dev_ops *ops;
};

/* The head of every struct kvt_dev_buf: refcount and size are kept by dev.c. */
struct kvt_dev_buf_base {
	const struct kvt_dev_ops *ops;
	_Atomic unsigned refs;
	uint64_t size;
};

extern const struct kvt_dev_ops kvt_dev_host_ops;
int kvt_dev_host_open(struct kvt_dev **ret_dev);
/* The memfd a host buffer keeps (kvt_dev_buf_fd()). */
int kvt_dev_host_buf_fd(const struct kvt_dev_buf *buf);

#ifdef KVT_HAVE_CUDA
extern const struct kvt_dev_ops kvt_dev_cuda_ops;
/* Returns 0, -ENODEV (no usable device; reason logged), -ENOMEM, -EIO. */
int kvt_dev_cuda_open(struct kvt_dev **ret_dev);
#endif

/* Rows inside a buffer of @size bytes (and, with KVT_DEV_H2D_Q8, int8 rows well formed):
 * 0, -ERANGE or -EINVAL. */
int kvt_dev_rows_check(uint64_t size, const struct kvt_dev_copy *rows, unsigned n, int mode);

#endif /* KVT_DEV_INT_H */
