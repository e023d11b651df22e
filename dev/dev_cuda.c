/* SPDX-License-Identifier: MIT */
/*
 * dev_cuda.c - the CUDA backend of the device layer.
 *
 * Per device: a high-priority prefetch stream (h2d: FETCH, promotions) and a low-priority
 * offload stream (d2h: APPEND), each a "lane" with a ring of LANE_RING batches in flight: each
 * entry has its pinned descriptor block and the event recorded after its batch, and carries the
 * batch's fence (kvt_dev_fence()). A batch takes the oldest entry back only once its event has
 * completed, so the CPU runs up to LANE_RING batches ahead of the device and never waits per
 * batch. Host rows outside registered memory go through one bounce buffer per lane, reused once
 * the last batch that read it has completed. A batch of rows is one launch of kvt_rows_copy
 * (rows.cu), reading and writing pinned host memory through UVA, or one cudaMemcpyAsync when the
 * rows are contiguous on both sides: never one copy per row.
 *
 * Pool memory: cudaHostRegister(Portable | Mapped) in chunks of at most KVT_CUDA_REG_CHUNK,
 * all or nothing. Client buffers: cudaIpcOpenMemHandle, once per (device, handle), shared by
 * every import of that handle and closed when the last one is released, after the device's
 * streams have drained.
 *
 * Every CUDA call goes through KVT_CUDA(): it logs the call site, the call and the CUDA error,
 * and maps the error to a negative errno (cuda_errno()).
 */
#define _GNU_SOURCE
#include <cuda.h> /* driver types only (cuMemGetAddressRange through the runtime's entry point) */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_int.h"
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "rows.h"

/* Largest single cudaHostRegister(); test builds shrink it to exercise several chunks. */
#ifndef KVT_CUDA_REG_CHUNK
#define KVT_CUDA_REG_CHUNK (64ull << 30)
#endif
#define LANE_ROWS  1024	      /* rows per kernel launch */
#define LANE_RING  64	      /* batches in flight per lane */
#define BOUNCE_MIN (1u << 20) /* first bounce buffer size */

static int
cuda_errno(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidResourceHandle:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidDeviceFunction:
	case cudaErrorHostMemoryNotRegistered:
		return -EINVAL;
	case cudaErrorHostMemoryAlreadyRegistered:
		return -EEXIST;
	case cudaErrorInvalidDevice:
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorDevicesUnavailable:
	case cudaErrorCallRequiresNewerDriver:
		return -ENODEV;
	case cudaErrorNotSupported:
	case cudaErrorNotPermitted:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

/* The one wrapper: 0, or the mapped -errno after logging what failed, in which function (an
 * operator reads this: a function and a call name it, a source path would not help). */
static int
cuda_check(cudaError_t e, int level, const char *call, const char *func)
{
	int r;

	if (e == cudaSuccess)
		return 0;
	r = cuda_errno(e);
	kvt_dev_log(level, "cuda: %s: %s failed: %s (%s) -> %s", func, call, cudaGetErrorName(e),
		    cudaGetErrorString(e), strerror(-r));
	return r;
}

#define KVT_CUDA_LVL(level, call) cuda_check((call), (level), #call, __func__)
#define KVT_CUDA(call)		  KVT_CUDA_LVL(KVT_DEV_LOG_ERR, call)

typedef CUresult (*get_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);

/* One batch in flight: its event and fence; its descriptors are desc[index * LANE_ROWS]. */
struct ring_ent {
	cudaEvent_t ev;
	uint64_t fence;
};

struct lane {
	pthread_mutex_t lock; /* submission: staging and ring slots being filled */
	cudaStream_t stream;
	cudaEvent_t join; /* this lane's tail, for the other lane to wait on */
	struct ring_ent ring[LANE_RING];
	unsigned head, count;	   /* pending entries: under the device's fence_lock */
	struct kvt_row_desc *desc; /* LANE_RING * LANE_ROWS, pinned and mapped */
	struct kvt_row_desc *desc_dev;
	uint8_t *bounce, *bounce_dev;
	size_t bounce_size;
	uint64_t bounce_fence; /* the last batch that read or wrote the bounce buffer */
};

struct gpu {
	int ordinal;
	uint8_t uuid[16];
	char name[256];
	struct lane prefetch, offload;
	int ready;
};

/* Host memory the device can reach: pool chunks registered or allocated through us. */
struct region {
	uint8_t *host, *dev;
	size_t len;
};

/* One opened IPC handle on one device, shared by every import of it. */
struct ipc_map {
	struct ipc_map *next;
	int gpu;
	uint8_t handle[64];
	uint8_t *ptr;
	uint64_t size; /* of the allocation */
	unsigned refs;
};

struct kvt_dev {
	struct kvt_dev_base base;
	char name[300];
	cudaLibrary_t lib;
	cudaKernel_t rows_kernel;
	get_range_fn get_range;
	int n_gpus;
	struct gpu *gpus;
	pthread_rwlock_t regions_lock;
	struct region *regions;
	unsigned n_regions, cap_regions;
	pthread_mutex_t ipc_lock;
	struct ipc_map *maps;
	/* Fences: @submitted counts batches; every lane's ring (head, count) changes under it, so
	 * that a fence is never visible as submitted before its batch is in a ring. Held only for
	 * non-blocking work (event queries). */
	pthread_mutex_t fence_lock;
	uint64_t submitted, done;
};

struct kvt_dev_buf {
	struct kvt_dev_buf_base base;
	struct kvt_dev *dev;
	struct ipc_map *map;
};

struct kvt_dev_event {
	int gpu;
	cudaEvent_t ev;	  /* interprocess, exported */
	cudaEvent_t join; /* offload stream -> prefetch stream */
};

static int
set_device(const struct gpu *g)
{
	return KVT_CUDA(cudaSetDevice(g->ordinal));
}

static void
lane_fini(struct lane *l)
{
	if (l->stream)
		KVT_CUDA(cudaStreamSynchronize(l->stream));
	for (unsigned i = 0; i < LANE_RING; i++)
		if (l->ring[i].ev)
			KVT_CUDA(cudaEventDestroy(l->ring[i].ev));
	if (l->join)
		KVT_CUDA(cudaEventDestroy(l->join));
	if (l->stream)
		KVT_CUDA(cudaStreamDestroy(l->stream));
	if (l->desc)
		KVT_CUDA(cudaFreeHost(l->desc));
	if (l->bounce)
		KVT_CUDA(cudaFreeHost(l->bounce));
	pthread_mutex_destroy(&l->lock);
	memset(l, 0, sizeof(*l));
}

static int
lane_init(struct lane *l, int priority)
{
	int r;

	memset(l, 0, sizeof(*l));
	pthread_mutex_init(&l->lock, NULL);
	/* Non-blocking: the legacy default stream of other threads must never serialize us. */
	r = KVT_CUDA(cudaStreamCreateWithPriority(&l->stream, cudaStreamNonBlocking, priority));
	if (r == 0)
		r = KVT_CUDA(cudaEventCreateWithFlags(&l->join, cudaEventDisableTiming));
	for (unsigned i = 0; i < LANE_RING && r == 0; i++)
		r = KVT_CUDA(cudaEventCreateWithFlags(&l->ring[i].ev, cudaEventDisableTiming));
	if (r == 0)
		r = KVT_CUDA(cudaHostAlloc((void **)&l->desc,
					   LANE_RING * LANE_ROWS * sizeof(*l->desc),
					   cudaHostAllocPortable | cudaHostAllocMapped));
	if (r == 0)
		r = KVT_CUDA(cudaHostGetDevicePointer((void **)&l->desc_dev, l->desc, 0));
	if (r < 0)
		lane_fini(l);
	return r;
}

static void
gpu_fini(struct gpu *g)
{
	if (!g->ready)
		return;
	set_device(g);
	lane_fini(&g->prefetch);
	lane_fini(&g->offload);
	g->ready = 0;
}

static int
gpu_init(struct gpu *g, int ordinal)
{
	struct cudaDeviceProp prop;
	int least, greatest, uva = 0, r;

	g->ordinal = ordinal;
	r = KVT_CUDA(cudaGetDeviceProperties(&prop, ordinal));
	if (r < 0)
		return r;
	memcpy(g->uuid, prop.uuid.bytes, sizeof(g->uuid));
	snprintf(g->name, sizeof(g->name), "%s", prop.name);
	r = set_device(g);
	if (r == 0)
		r = KVT_CUDA(cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, ordinal));
	if (r < 0)
		return r;
	if (!uva) {
		/* The row kernel reads pool memory at its host address. */
		kvt_dev_log(KVT_DEV_LOG_ERR, "cuda: device %d (%s) has no unified addressing",
			    ordinal, g->name);
		return -ENODEV;
	}
	r = KVT_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
	if (r < 0)
		return r;
	r = lane_init(&g->prefetch, greatest);
	if (r < 0)
		return r;
	r = lane_init(&g->offload, least);
	if (r < 0) {
		lane_fini(&g->prefetch);
		return r;
	}
	g->ready = 1;
	return 0;
}

static void
cuda_close(struct kvt_dev *dev)
{
	for (int i = 0; i < dev->n_gpus; i++)
		gpu_fini(&dev->gpus[i]);
	if (dev->maps)
		kvt_dev_log(KVT_DEV_LOG_WARNING, "cuda: closing with IPC mappings still open");
	if (dev->lib)
		KVT_CUDA(cudaLibraryUnload(dev->lib));
	free(dev->gpus);
	free(dev->regions);
	pthread_rwlock_destroy(&dev->regions_lock);
	pthread_mutex_destroy(&dev->ipc_lock);
	pthread_mutex_destroy(&dev->fence_lock);
	free(dev);
}

/* The node every GPU's PCI function reports, or -1 (unknown, or not one node for all). */
static int
cuda_numa_node(struct kvt_dev *dev)
{
	const char *root = getenv("KVT_SYSFS_PCI"); /* tests: a tree shaped like sysfs */
	int node = -1;

	for (int i = 0; i < dev->n_gpus; i++) {
		char bus[32];
		int n;

		if (KVT_CUDA(cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), i)) < 0)
			return -1;
		n = kvt_dev_pci_numa_node(root ? root : "/sys/bus/pci/devices", bus);
		if (n < 0)
			return -1;
		if (i && n != node) {
			kvt_dev_log(KVT_DEV_LOG_NOTICE,
				    "cuda: GPUs on NUMA nodes %d and %d: numa_node = auto binds "
				    "nothing (set a node to choose)",
				    node, n);
			return -1;
		}
		node = n;
	}
	return node;
}

int
kvt_dev_cuda_open(struct kvt_dev **ret_dev)
{
	enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	struct kvt_dev *dev;
	void *fn = NULL;
	int n = 0, r;

	/* Not finding a device is an answer, not a failure: info level; AUTO falls back. */
	r = KVT_CUDA_LVL(KVT_DEV_LOG_INFO, cudaGetDeviceCount(&n));
	if (r < 0 || n <= 0) {
		kvt_dev_log(KVT_DEV_LOG_NOTICE, "cuda: no CUDA device present (%s)",
			    r < 0 ? strerror(-r) : "the driver reports none");
		return -ENODEV;
	}
	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return -ENOMEM;
	dev->base.ops = &kvt_dev_cuda_ops;
	pthread_rwlock_init(&dev->regions_lock, NULL);
	pthread_mutex_init(&dev->ipc_lock, NULL);
	pthread_mutex_init(&dev->fence_lock, NULL);
	dev->gpus = calloc((size_t)n, sizeof(*dev->gpus));
	if (!dev->gpus) {
		r = -ENOMEM;
		goto err;
	}
	dev->n_gpus = n;
	/* Loaded into every device's context, now and later: one kernel handle for all. */
	r = KVT_CUDA(cudaLibraryLoadData(&dev->lib, kvt_rows_fatbin, NULL, NULL, 0, NULL, NULL, 0));
	if (r < 0)
		goto err;
	r = KVT_CUDA(cudaLibraryGetKernel(&dev->rows_kernel, dev->lib, KVT_ROWS_KERNEL));
	if (r < 0)
		goto err;
	/* The allocation behind an IPC handle is checked against the size the client claims
	 * (a lie would send the kernel past the end and poison the daemon's context). */
	r = KVT_CUDA(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
						      cudaEnableDefault, &q));
	if (r == 0 && (q != cudaDriverEntryPointSuccess || !fn)) {
		kvt_dev_log(KVT_DEV_LOG_ERR, "cuda: driver has no cuMemGetAddressRange");
		r = -ENODEV;
	}
	if (r < 0)
		goto err;
	dev->get_range = (get_range_fn)fn;
	for (int i = 0; i < n; i++) {
		r = gpu_init(&dev->gpus[i], i);
		if (r < 0)
			goto err;
	}
	snprintf(dev->name, sizeof(dev->name), "cuda:0 %s%s", dev->gpus[0].name,
		 n > 1 ? " (+ more devices)" : "");
	*ret_dev = dev;
	return 0;
err:
	cuda_close(dev);
	return r;
}

static const char *
cuda_name(const struct kvt_dev *dev)
{
	return dev->name;
}

static int cuda_sync(struct kvt_dev *dev);

static int
regions_add(struct kvt_dev *dev, uint8_t *host, uint8_t *dptr, size_t len)
{
	int r = 0;

	pthread_rwlock_wrlock(&dev->regions_lock);
	if (dev->n_regions == dev->cap_regions) {
		unsigned cap = dev->cap_regions ? 2 * dev->cap_regions : 8;
		struct region *n = realloc(dev->regions, cap * sizeof(*n));

		if (!n) {
			r = -ENOMEM;
			goto out;
		}
		dev->regions = n;
		dev->cap_regions = cap;
	}
	dev->regions[dev->n_regions++] = (struct region){host, dptr, len};
out:
	pthread_rwlock_unlock(&dev->regions_lock);
	return r;
}

static void
regions_del(struct kvt_dev *dev, const uint8_t *host)
{
	pthread_rwlock_wrlock(&dev->regions_lock);
	for (unsigned i = 0; i < dev->n_regions; i++)
		if (dev->regions[i].host == host) {
			dev->regions[i] = dev->regions[--dev->n_regions];
			break;
		}
	pthread_rwlock_unlock(&dev->regions_lock);
}

/* Device address of [p, p+len) when it lies inside one region, else NULL. Lock held. */
static uint8_t *
regions_find(const struct kvt_dev *dev, const uint8_t *p, uint64_t len)
{
	for (unsigned i = 0; i < dev->n_regions; i++) {
		const struct region *g = &dev->regions[i];

		if (p >= g->host && len <= g->len && (size_t)(p - g->host) <= g->len - len)
			return g->dev + (p - g->host);
	}
	return NULL;
}

static int
cuda_register(struct kvt_dev *dev, void *p, size_t len)
{
	uint8_t *base = p;
	size_t done = 0;
	int r = 0;

	if (((uintptr_t)p & 4095) || !len)
		return -EINVAL;
	/* Portable: pinned for every device's context; Mapped: the row kernel reads it. */
	for (; done < len; done += KVT_CUDA_REG_CHUNK) {
		size_t n = len - done < KVT_CUDA_REG_CHUNK ? len - done : KVT_CUDA_REG_CHUNK;
		uint8_t *dptr;

		r = KVT_CUDA(cudaHostRegister(base + done, n,
					      cudaHostRegisterPortable | cudaHostRegisterMapped));
		if (r < 0)
			break;
		r = KVT_CUDA(cudaHostGetDevicePointer((void **)&dptr, base + done, 0));
		if (r == 0)
			r = regions_add(dev, base + done, dptr, n);
		if (r < 0) {
			KVT_CUDA(cudaHostUnregister(base + done));
			break;
		}
	}
	if (r == 0)
		return 0;
	/* All or nothing: unpin what was pinned, last chunk first. */
	while (done > 0) {
		done -= KVT_CUDA_REG_CHUNK;
		regions_del(dev, base + done);
		KVT_CUDA(cudaHostUnregister(base + done));
	}
	if (r == -EOPNOTSUPP)
		kvt_dev_log(KVT_DEV_LOG_WARNING,
			    "cuda: the platform refuses to pin the pool "
			    "(cudaHostRegister); it must come from cudaHostAlloc");
	return r;
}

static void
cuda_unregister(struct kvt_dev *dev, void *p, size_t len)
{
	uint8_t *base = p;
	size_t n = len ? (len - 1) / KVT_CUDA_REG_CHUNK + 1 : 0;

	/* Queued batches may still read or write the range: let them finish first. */
	cuda_sync(dev);
	/* Reverse order of registration. */
	while (n-- > 0) {
		regions_del(dev, base + n * KVT_CUDA_REG_CHUNK);
		KVT_CUDA(cudaHostUnregister(base + n * KVT_CUDA_REG_CHUNK));
	}
}

static int
cuda_host_alloc(struct kvt_dev *dev, size_t len, void **ret_p)
{
	uint8_t *p, *dptr;
	int r;

	r = KVT_CUDA(cudaHostAlloc((void **)&p, len, cudaHostAllocPortable | cudaHostAllocMapped));
	if (r < 0)
		return r;
	r = KVT_CUDA(cudaHostGetDevicePointer((void **)&dptr, p, 0));
	if (r == 0)
		r = regions_add(dev, p, dptr, len);
	if (r < 0) {
		KVT_CUDA(cudaFreeHost(p));
		return r;
	}
	*ret_p = p;
	return 0;
}

static void
cuda_host_free(struct kvt_dev *dev, void *p, size_t len)
{
	cuda_sync(dev); /* queued batches may still use it */
	regions_del(dev, p);
	KVT_CUDA(cudaFreeHost(p));
}

static int
gpu_by_uuid(const struct kvt_dev *dev, const uint8_t uuid[16])
{
	for (int i = 0; i < dev->n_gpus; i++)
		if (!memcmp(dev->gpus[i].uuid, uuid, 16))
			return i;
	kvt_dev_log(KVT_DEV_LOG_WARNING, "cuda: no device with UUID %02x%02x%02x%02x-... here",
		    uuid[0], uuid[1], uuid[2], uuid[3]);
	return -ENODEV;
}

static int
cuda_import(struct kvt_dev *dev, const struct kvt_dev_import *imp, struct kvt_dev_buf **ret_buf)
{
	struct kvt_dev_buf *buf;
	struct ipc_map *m;
	cudaIpcMemHandle_t h;
	CUdeviceptr base = 0;
	size_t size = 0;
	int gi, r;

	if (imp->kind != KVT_BUF_CUDA_IPC)
		return -EOPNOTSUPP; /* a host memfd: the rows must live in device memory */
	gi = gpu_by_uuid(dev, imp->device_uuid);
	if (gi < 0)
		return gi;
	buf = calloc(1, sizeof(*buf));
	if (!buf)
		return -ENOMEM;
	pthread_mutex_lock(&dev->ipc_lock);
	for (m = dev->maps; m; m = m->next)
		if (m->gpu == gi && !memcmp(m->handle, imp->ipc_handle, 64))
			break;
	if (m) {
		m->refs++;
	} else {
		m = calloc(1, sizeof(*m));
		if (!m) {
			r = -ENOMEM;
			goto err;
		}
		memcpy(h.reserved, imp->ipc_handle, sizeof(h.reserved));
		r = set_device(&dev->gpus[gi]);
		if (r == 0)
			r = KVT_CUDA(cudaIpcOpenMemHandle((void **)&m->ptr, h,
							  cudaIpcMemLazyEnablePeerAccess));
		if (r < 0) {
			free(m);
			goto err;
		}
		if (dev->get_range(&base, &size, (CUdeviceptr)(uintptr_t)m->ptr) != CUDA_SUCCESS ||
		    base != (CUdeviceptr)(uintptr_t)m->ptr) {
			kvt_dev_log(KVT_DEV_LOG_ERR, "cuda: IPC allocation has no address range");
			KVT_CUDA(cudaIpcCloseMemHandle(m->ptr));
			free(m);
			r = -EINVAL;
			goto err;
		}
		m->gpu = gi;
		m->size = size;
		m->refs = 1;
		memcpy(m->handle, imp->ipc_handle, 64);
		m->next = dev->maps;
		dev->maps = m;
	}
	if (imp->size > m->size) {
		kvt_dev_log(KVT_DEV_LOG_WARNING,
			    "cuda: client claims %llu bytes of a %llu-byte "
			    "allocation",
			    (unsigned long long)imp->size, (unsigned long long)m->size);
		pthread_mutex_unlock(&dev->ipc_lock);
		buf->dev = dev;
		buf->map = m;
		dev->base.ops->buf_release(buf);
		return -EINVAL;
	}
	pthread_mutex_unlock(&dev->ipc_lock);
	buf->base.ops = &kvt_dev_cuda_ops;
	buf->base.size = imp->size;
	buf->dev = dev;
	buf->map = m;
	*ret_buf = buf;
	return 0;
err:
	pthread_mutex_unlock(&dev->ipc_lock);
	free(buf);
	return r;
}

static int
gpu_sync(struct gpu *g)
{
	int r = set_device(g);

	if (r == 0)
		r = KVT_CUDA(cudaStreamSynchronize(g->prefetch.stream));
	if (r == 0)
		r = KVT_CUDA(cudaStreamSynchronize(g->offload.stream));
	return r;
}

static void
cuda_release(struct kvt_dev_buf *buf)
{
	struct kvt_dev *dev = buf->dev;
	struct ipc_map *m = buf->map;

	pthread_mutex_lock(&dev->ipc_lock);
	if (--m->refs == 0) {
		/* Copies queued on this device may still touch the mapping: drain, then close. */
		gpu_sync(&dev->gpus[m->gpu]);
		KVT_CUDA(cudaIpcCloseMemHandle(m->ptr));
		for (struct ipc_map **pp = &dev->maps; *pp; pp = &(*pp)->next)
			if (*pp == m) {
				*pp = m->next;
				break;
			}
		free(m);
	}
	pthread_mutex_unlock(&dev->ipc_lock);
	free(buf);
}

/* The rows as one contiguous span on both sides: 1, else 0. */
static int
rows_contiguous(const struct kvt_dev_copy *rows, unsigned n, int mode)
{
	if (Q8(&rows[0], mode))
		return 0;
	for (unsigned i = 1; i < n; i++)
		if (Q8(&rows[i], mode) ||
		    rows[i].buf_off != rows[i - 1].buf_off + rows[i - 1].len ||
		    (uint8_t *)rows[i].host != (uint8_t *)rows[i - 1].host + rows[i - 1].len)
			return 0;
	return 1;
}

/* fence_lock held: drop the lane's completed entries from the front of its ring (event
 * queries, no waiting); the fence of its oldest pending batch, or UINT64_MAX when none. */
static uint64_t
lane_reap(struct lane *l)
{
	while (l->count) {
		cudaError_t e = cudaEventQuery(l->ring[l->head].ev);

		if (e == cudaErrorNotReady)
			return l->ring[l->head].fence;
		if (e != cudaSuccess) /* a failed batch: whoever waits for it logs the error */
			return l->ring[l->head].fence;
		l->head = (l->head + 1) % LANE_RING;
		l->count--;
	}
	return UINT64_MAX;
}

/* Every fence up to the returned one has completed (fence_lock held). */
static uint64_t
fences_reap(struct kvt_dev *dev)
{
	uint64_t done = dev->submitted;

	for (int i = 0; i < dev->n_gpus; i++) {
		struct gpu *g = &dev->gpus[i];
		uint64_t a, b;

		if (!g->ready)
			continue;
		a = lane_reap(&g->prefetch);
		b = lane_reap(&g->offload);
		if (a != UINT64_MAX && a - 1 < done)
			done = a - 1;
		if (b != UINT64_MAX && b - 1 < done)
			done = b - 1;
	}
	if (done > dev->done)
		dev->done = done;
	return dev->done;
}

/* Lane lock held: wait (blocking) until every batch of this lane with fence <= @f is done. */
static int
lane_wait(struct kvt_dev *dev, struct lane *l, uint64_t f)
{
	int r = 0;

	for (;;) {
		cudaEvent_t ev;

		pthread_mutex_lock(&dev->fence_lock);
		lane_reap(l);
		if (!l->count || l->ring[l->head].fence > f) {
			pthread_mutex_unlock(&dev->fence_lock);
			return r;
		}
		ev = l->ring[l->head].ev;
		pthread_mutex_unlock(&dev->fence_lock);
		/* Only this lane's submitters (holding its lock) record these events. */
		r = KVT_CUDA(cudaEventSynchronize(ev));
		if (r < 0)
			return r;
	}
}

/* Lane lock held: a free ring entry, waiting for the oldest batch when all are in flight. */
static int
lane_slot(struct kvt_dev *dev, struct lane *l, unsigned *ret_idx)
{
	int r = 0;

	pthread_mutex_lock(&dev->fence_lock);
	lane_reap(l);
	if (l->count == LANE_RING) {
		uint64_t f = l->ring[l->head].fence;

		pthread_mutex_unlock(&dev->fence_lock);
		r = lane_wait(dev, l, f);
		if (r < 0)
			return r;
		pthread_mutex_lock(&dev->fence_lock);
	}
	*ret_idx = (l->head + l->count) % LANE_RING;
	pthread_mutex_unlock(&dev->fence_lock);
	return 0;
}

/* Lane lock held: the batch just queued on entry @idx is in flight; returns its fence. */
static uint64_t
lane_push(struct kvt_dev *dev, struct lane *l, unsigned idx)
{
	uint64_t f;

	pthread_mutex_lock(&dev->fence_lock);
	f = ++dev->submitted;
	l->ring[idx].fence = f;
	l->count++;
	pthread_mutex_unlock(&dev->fence_lock);
	return f;
}

static int
lane_bounce(struct kvt_dev *dev, struct lane *l, size_t need)
{
	size_t size = l->bounce_size ? l->bounce_size : BOUNCE_MIN;
	uint8_t *p, *dptr;
	int r;

	/* The last batch through the bounce buffer must be done before it is refilled. */
	r = lane_wait(dev, l, l->bounce_fence);
	if (r < 0 || need <= l->bounce_size)
		return r;
	while (size < need)
		size *= 2;
	r = KVT_CUDA(cudaHostAlloc((void **)&p, size, cudaHostAllocPortable | cudaHostAllocMapped));
	if (r < 0)
		return r;
	r = KVT_CUDA(cudaHostGetDevicePointer((void **)&dptr, p, 0));
	if (r < 0) {
		KVT_CUDA(cudaFreeHost(p));
		return r;
	}
	if (l->bounce)
		KVT_CUDA(cudaFreeHost(l->bounce));
	l->bounce = p;
	l->bounce_dev = dptr;
	l->bounce_size = size;
	return 0;
}

/* Bytes of f32 scales an int8 row reads. */
static uint64_t
scales_bytes(const struct kvt_dev_copy *c)
{
	return (c->len + c->group - 1) / c->group * sizeof(float);
}

/* An int8 row whose codes or scales the device cannot reach, dequantized on the host into @dst
 * the way the row kernel does it (f32 product, round to nearest even). */
static void
dequant_host(const struct kvt_dev_copy *c, uint8_t *dst)
{
	const int8_t *s = c->host;

	for (uint64_t e = 0; e < c->len; e++) {
		float x = (float)s[e] * c->scale[e / c->group];
		uint16_t h;

		if (c->dtype == KVT_DTYPE_BF16) {
			uint32_t u;

			memcpy(&u, &x, 4);
			h = (u & 0x7fffffffu) > 0x7f800000u
				? (uint16_t)((u >> 16) | 0x40u)
				: (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
		} else {
			_Float16 f = (_Float16)x;

			memcpy(&h, &f, 2);
		}
		memcpy(dst + 2 * e, &h, 2);
	}
}

/* One launch for up to LANE_ROWS rows, or one cudaMemcpyAsync when they are contiguous on both
 * sides. Lane lock held. */
static int
lane_launch(struct kvt_dev *dev, struct lane *l, struct kvt_dev_buf *buf,
	    const struct kvt_dev_copy *rows, unsigned n, int to_dev)
{
	uint8_t *bp = buf->map->ptr;
	size_t bounce = 0, boff = 0;
	unsigned blocks = n < 1024 ? n : 1024, idx;
	struct kvt_row_desc *desc, *desc_dev;
	uint64_t f;
	void *args[2];
	int r;

	r = lane_slot(dev, l, &idx);
	if (r < 0)
		return r;
	if (rows_contiguous(rows, n, to_dev)) {
		uint8_t *d = bp + rows[0].buf_off;
		uint64_t len = rows[n - 1].buf_off + rows[n - 1].len - rows[0].buf_off;

		r = KVT_CUDA(cudaMemcpyAsync(to_dev ? d : rows[0].host, to_dev ? rows[0].host : d,
					     len, cudaMemcpyDefault, l->stream));
		if (r == 0)
			r = KVT_CUDA(cudaEventRecord(l->ring[idx].ev, l->stream));
		if (r == 0)
			lane_push(dev, l, idx);
		return r;
	}
	desc = l->desc + (size_t)idx * LANE_ROWS;
	desc_dev = l->desc_dev + (size_t)idx * LANE_ROWS;
	pthread_rwlock_rdlock(&dev->regions_lock);
	for (unsigned i = 0; i < n; i++) {
		uint8_t *hd = regions_find(dev, rows[i].host, rows[i].len), *sd = NULL;

		if (hd && Q8(&rows[i], to_dev))
			sd = regions_find(dev, (const uint8_t *)rows[i].scale,
					  scales_bytes(&rows[i]));
		desc[i].len = rows[i].len;
		desc[i].scale = (uint64_t)(uintptr_t)sd;
		desc[i].group = rows[i].group;
		desc[i].out = rows[i].dtype == KVT_DTYPE_BF16 ? KVT_ROW_OUT_BF16 : KVT_ROW_OUT_F16;
		/* 0: through the bounce buffer (an int8 row then dequantized on the host) */
		desc[i].src = Q8(&rows[i], to_dev) && !sd ? 0 : (uint64_t)(uintptr_t)hd;
		if (!desc[i].src)
			bounce += (kvt_dev_out_bytes(&rows[i], to_dev) + 15) & ~(size_t)15;
	}
	pthread_rwlock_unlock(&dev->regions_lock);
	if (bounce) {
		r = lane_bounce(dev, l, bounce);
		if (r < 0)
			return r;
	}
	for (unsigned i = 0; i < n; i++) {
		uint64_t h = desc[i].src, d = (uint64_t)(uintptr_t)(bp + rows[i].buf_off);

		if (!h) {
			h = (uint64_t)(uintptr_t)(l->bounce_dev + boff);
			if (Q8(&rows[i], to_dev)) {
				dequant_host(&rows[i], l->bounce + boff);
				desc[i].len = 2 * rows[i].len;
				desc[i].scale = 0;
			} else if (to_dev) {
				memcpy(l->bounce + boff, rows[i].host, rows[i].len);
			}
			boff += (kvt_dev_out_bytes(&rows[i], to_dev) + 15) & ~(size_t)15;
		}
		desc[i].src = to_dev ? h : d;
		desc[i].dst = to_dev ? d : h;
	}
	args[0] = &desc_dev;
	args[1] = &n;
	r = KVT_CUDA(cudaLaunchKernel((const void *)dev->rows_kernel, (dim3){blocks, 1, 1},
				      (dim3){256, 1, 1}, args, 0, l->stream));
	if (r == 0)
		r = KVT_CUDA(cudaEventRecord(l->ring[idx].ev, l->stream));
	if (r < 0)
		return r;
	f = lane_push(dev, l, idx);
	if (!bounce)
		return 0;
	l->bounce_fence = f;
	if (!to_dev) {
		/* Rows for unregistered host memory land in the bounce buffer: copy them out now,
		 * since nothing runs on the host when the stream gets there. */
		r = lane_wait(dev, l, f);
		if (r < 0)
			return r;
		boff = 0;
		pthread_rwlock_rdlock(&dev->regions_lock);
		for (unsigned i = 0; i < n; i++)
			if (!regions_find(dev, rows[i].host, rows[i].len)) {
				memcpy(rows[i].host, l->bounce + boff, rows[i].len);
				boff += (rows[i].len + 15) & ~(size_t)15;
			}
		pthread_rwlock_unlock(&dev->regions_lock);
	}
	return 0;
}

static int
cuda_copy(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows, unsigned n,
	  int to_dev)
{
	struct gpu *g = &dev->gpus[buf->map->gpu];
	struct lane *l = to_dev ? &g->prefetch : &g->offload,
		    *o = to_dev ? &g->offload : &g->prefetch;
	int r = set_device(g), other_busy;

	if (r < 0)
		return r;
	pthread_mutex_lock(&dev->fence_lock);
	other_busy = lane_reap(o) != UINT64_MAX;
	pthread_mutex_unlock(&dev->fence_lock);
	/* The two lanes run side by side, but a batch must not overtake the other lane's queued
	 * batches: an h2d into a T0 slot, then a d2h out of it, or the reverse. A device-side wait
	 * on the other lane's tail, only when it has work in flight. The other lane's lock is not
	 * held with ours (lock order); a later record of its join only waits for more. */
	if (other_busy) {
		pthread_mutex_lock(&o->lock);
		r = KVT_CUDA(cudaEventRecord(o->join, o->stream));
		pthread_mutex_unlock(&o->lock);
	}
	pthread_mutex_lock(&l->lock);
	if (other_busy && r == 0)
		r = KVT_CUDA(cudaStreamWaitEvent(l->stream, o->join, 0));
	for (unsigned done = 0; done < n && r == 0; done += LANE_ROWS)
		r = lane_launch(dev, l, buf, rows + done,
				n - done < LANE_ROWS ? n - done : LANE_ROWS, to_dev);
	pthread_mutex_unlock(&l->lock);
	return r;
}

static int
cuda_sync(struct kvt_dev *dev)
{
	int r = 0;

	for (int i = 0; i < dev->n_gpus; i++) {
		int k = gpu_sync(&dev->gpus[i]);

		if (k < 0 && r == 0)
			r = k;
	}
	pthread_mutex_lock(&dev->fence_lock);
	fences_reap(dev);
	pthread_mutex_unlock(&dev->fence_lock);
	return r;
}

static uint64_t
cuda_fence(struct kvt_dev *dev)
{
	uint64_t f;

	pthread_mutex_lock(&dev->fence_lock);
	f = dev->submitted;
	pthread_mutex_unlock(&dev->fence_lock);
	return f;
}

static uint64_t
cuda_fence_done(struct kvt_dev *dev)
{
	uint64_t f;

	pthread_mutex_lock(&dev->fence_lock);
	f = fences_reap(dev);
	pthread_mutex_unlock(&dev->fence_lock);
	return f;
}

static int
cuda_fence_wait(struct kvt_dev *dev, uint64_t f)
{
	int r = 0;

	for (int i = 0; i < dev->n_gpus && r == 0; i++) {
		struct gpu *g = &dev->gpus[i];

		if (!g->ready)
			continue;
		r = set_device(g);
		for (int k = 0; k < 2 && r == 0; k++) {
			struct lane *l = k ? &g->offload : &g->prefetch;

			pthread_mutex_lock(&l->lock);
			r = lane_wait(dev, l, f);
			pthread_mutex_unlock(&l->lock);
		}
	}
	if (r == 0)
		cuda_fence_done(dev);
	return r;
}

static void
cuda_event_destroy(struct kvt_dev *dev, struct kvt_dev_event *ev)
{
	set_device(&dev->gpus[ev->gpu]);
	if (ev->ev)
		KVT_CUDA(cudaEventDestroy(ev->ev));
	if (ev->join)
		KVT_CUDA(cudaEventDestroy(ev->join));
	free(ev);
}

static int
cuda_event_create(struct kvt_dev *dev, const uint8_t device_uuid[16], struct kvt_dev_event **ret_ev,
		  uint8_t ret_handle[64])
{
	struct kvt_dev_event *ev;
	cudaIpcEventHandle_t h;
	int gi = gpu_by_uuid(dev, device_uuid), r;

	if (gi < 0)
		return gi;
	ev = calloc(1, sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	ev->gpu = gi;
	r = set_device(&dev->gpus[gi]);
	/* Interprocess events must not time (CUDA requires DisableTiming with Interprocess). */
	if (r == 0)
		r = KVT_CUDA(cudaEventCreateWithFlags(&ev->ev, cudaEventInterprocess |
								   cudaEventDisableTiming));
	if (r == 0)
		r = KVT_CUDA(cudaEventCreateWithFlags(&ev->join, cudaEventDisableTiming));
	if (r == 0)
		r = KVT_CUDA(cudaIpcGetEventHandle(&h, ev->ev));
	if (r < 0) {
		cuda_event_destroy(dev, ev);
		return r;
	}
	memcpy(ret_handle, h.reserved, 64);
	*ret_ev = ev;
	return 0;
}

static int
cuda_event_record(struct kvt_dev *dev, struct kvt_dev_event *ev)
{
	struct gpu *g = &dev->gpus[ev->gpu];
	int r = set_device(g);

	/* The exported event follows both streams: offload joins prefetch, then it is recorded
	 * there. Costs the prefetch stream a wait on offload work queued before this point. */
	if (r == 0)
		r = KVT_CUDA(cudaEventRecord(ev->join, g->offload.stream));
	if (r == 0)
		r = KVT_CUDA(cudaStreamWaitEvent(g->prefetch.stream, ev->join, 0));
	if (r == 0)
		r = KVT_CUDA(cudaEventRecord(ev->ev, g->prefetch.stream));
	return r;
}

const struct kvt_dev_ops kvt_dev_cuda_ops = {
    .kind = KVT_DEV_CUDA,
    .close = cuda_close,
    .name = cuda_name,
    .numa_node = cuda_numa_node,
    .host_register = cuda_register,
    .host_unregister = cuda_unregister,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .buf_import = cuda_import,
    .buf_release = cuda_release,
    .copy = cuda_copy,
    .sync = cuda_sync,
    .fence = cuda_fence,
    .fence_done = cuda_fence_done,
    .fence_wait = cuda_fence_wait,
    .event_create = cuda_event_create,
    .event_record = cuda_event_record,
    .event_destroy = cuda_event_destroy,
};
