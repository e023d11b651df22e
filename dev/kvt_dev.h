/* SPDX-License-Identifier: MIT */
/*
 * kvt_dev.h - the device layer the daemon copies through. No CUDA types here.
 *
 * A backend pins host memory (the pool), imports client buffers (a sealed memfd on the host
 * backend, a CUDA IPC handle on the CUDA backend) and copies batches of rows between the two.
 * The host backend is complete and always built: device buffers are memfds the client maps and
 * copies are memcpy. The CUDA backend (dev_cuda.c) builds when the toolkit is found.
 *
 * Both backends are always linked in a CUDA build; kvt_dev_open() picks one at run time.
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
struct kvt_dev_event;

/* Log levels of the device layer: the sd-daemon priorities the daemon's log.h uses. */
enum {
	KVT_DEV_LOG_ERR = 3,
	KVT_DEV_LOG_WARNING = 4,
	KVT_DEV_LOG_NOTICE = 5,
	KVT_DEV_LOG_INFO = 6,
	KVT_DEV_LOG_DEBUG = 7
};

/*
 * kvt_dev_set_log() - where the device layer's messages go: @fn gets a level and one line
 * without a newline. NULL restores the default, "<level>line\n" on stderr (the daemon's format).
 * Every failed CUDA call is logged once, with its call site and the CUDA error name.
 * Thread safety: may be called at any time; @fn may be called from any thread.
 */
typedef void kvt_dev_log_fn(int level, const char *msg);
void kvt_dev_set_log(kvt_dev_log_fn *fn);
void kvt_dev_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What a client hands over to share one buffer. */
struct kvt_dev_import {
	uint32_t kind;		/* KVT_BUF_HOST_MEMFD or KVT_BUF_CUDA_IPC (proto/kvt_ctl.h) */
	int fd;			/* memfd, host backend; not consumed: the caller closes it */
	uint64_t size;		/* bytes the client claims */
	uint8_t ipc_handle[64]; /* CUDA backend */
	uint8_t device_uuid[16];
};

/*
 * One row to copy: @len bytes between buffer offset @buf_off and host address @host.
 * kvt_dev_copy_h2d_q8() also reads @scale: when set the row is int8 and is dequantized as it
 * lands: @host holds @len int8 codes, element e becomes @dtype (KVT_DTYPE_F16 or KVT_DTYPE_BF16
 * of kvt_abi.h) of code * scale[e / group], so 2 * @len bytes are written at @buf_off while @len
 * cross the bus. The other copy functions ignore the last three fields.
 */
struct kvt_dev_copy {
	uint64_t buf_off;
	void *host;
	uint64_t len;
	const float *scale;
	uint32_t group; /* elements per scale: head_dim (a scale per head) or 1 (per channel) */
	uint32_t dtype;
};

/*
 * kvt_dev_open() - start a backend.
 * @want: KVT_DEV_AUTO, KVT_DEV_HOST or KVT_DEV_CUDA. AUTO opens CUDA when the build has it and
 *        a device is present, else the host backend (logged at notice level); the caller logs
 *        kvt_dev_name() of what it got.
 * Returns 0, -ENODEV (CUDA asked for, none present or not built; the reason is logged),
 * -EINVAL (unknown @want), -ENOMEM, -EIO (CUDA present but failing; logged).
 */
int kvt_dev_open(enum kvt_dev_kind want, struct kvt_dev **ret_dev);

/* Stops the backend. Every imported buffer must have been put. NULL is fine. */
void kvt_dev_close(struct kvt_dev *dev);

/* KVT_DEV_HOST or KVT_DEV_CUDA, and a name for logs ("host", "cuda:0 NVIDIA H200"). */
enum kvt_dev_kind kvt_dev_kind(const struct kvt_dev *dev);
const char *kvt_dev_name(const struct kvt_dev *dev);

/*
 * kvt_dev_numa_node() - the NUMA node the devices hang off (their PCI functions' numa_node in
 * sysfs), for a pool that should be local to them; -1 when there is no device (host backend),
 * the platform does not say, or the devices sit on different nodes (logged).
 */
int kvt_dev_numa_node(struct kvt_dev *dev);

/* The numa_node sysfs reports for PCI function @bus_id ("0000:3b:00.0", any case) under
 * @sysfs_pci (normally "/sys/bus/pci/devices"), or -1. */
int kvt_dev_pci_numa_node(const char *sysfs_pci, const char *bus_id);

/*
 * kvt_dev_host_register() - make pool memory usable for device copies (pinning on CUDA; a no-op
 * check on the host backend, where the pool is already mlock()ed). All or nothing: CUDA pins
 * in chunks of at most 64 GiB (cudaHostRegister, portable and mapped) and unpins the chunks
 * already done, in reverse order, when one fails.
 * Returns 0, -EINVAL (unaligned), -ENOMEM, -EOPNOTSUPP (the platform refuses to pin memory it
 * did not allocate: use kvt_dev_host_alloc() instead), -EIO (device error). Failures are logged.
 */
int kvt_dev_host_register(struct kvt_dev *dev, void *p, size_t len);
/* Undoes a successful kvt_dev_host_register() of the same range (chunks in reverse order). */
void kvt_dev_host_unregister(struct kvt_dev *dev, void *p, size_t len);

/*
 * kvt_dev_host_alloc() - @len bytes of pinned, device-mapped host memory allocated by the
 * backend (cudaHostAlloc, portable and mapped), for when kvt_dev_host_register() says
 * -EOPNOTSUPP. Page aligned and zeroed. Free with kvt_dev_host_free() with the same @len.
 * Returns 0, -EOPNOTSUPP (host backend: it never refuses registration), -ENOMEM, -EIO.
 */
int kvt_dev_host_alloc(struct kvt_dev *dev, size_t len, void **ret_p);
void kvt_dev_host_free(struct kvt_dev *dev, void *p, size_t len);

/*
 * kvt_dev_buf_import() - map a client buffer into the daemon.
 * Host backend: @imp->fd must be a memfd carrying F_SEAL_SHRINK (so it can never shrink under
 * the daemon's mapping) and at least @imp->size bytes. CUDA backend: KVT_BUF_CUDA_IPC, the
 * device named by @imp->device_uuid; the handle must name the start of an allocation of at least
 * @imp->size bytes. A handle is opened once per device however often it is imported; the
 * mapping is shared and closed when its last importer is released. The returned buffer holds
 * one reference.
 * Returns 0, -EOPNOTSUPP (a kind this backend does not take), -EINVAL (size 0, not sealed, bad
 * handle, allocation too small), -EBADF, -ENOMEM, -ENODEV (no device with that UUID), -EIO.
 */
int kvt_dev_buf_import(struct kvt_dev *dev, const struct kvt_dev_import *imp,
		       struct kvt_dev_buf **ret_buf);
void kvt_dev_buf_get(struct kvt_dev_buf *buf);
/* Drops a reference; the last one waits for the buffer's device streams to drain, then unmaps
 * (CUDA: drops its share of the IPC mapping, which is closed exactly once). NULL is fine. */
void kvt_dev_buf_put(struct kvt_dev_buf *buf);
uint64_t kvt_dev_buf_size(const struct kvt_dev_buf *buf);
/*
 * kvt_dev_buf_fd() - the memfd a host-backend buffer was imported from: the buffer keeps a
 * duplicate (close-on-exec) for its lifetime, so that a restarted daemon can map it again.
 * Returns the fd (owned by the buffer), or -EOPNOTSUPP (CUDA buffers: re-imported from their
 * IPC handle instead).
 */
int kvt_dev_buf_fd(const struct kvt_dev_buf *buf);

/*
 * kvt_dev_copy_h2d() / kvt_dev_copy_d2h() - copy a batch of rows to / from a buffer in one call.
 * Every (buf_off, len) must lie inside the buffer (callers validate; this checks again).
 * The copy is complete when the call returns on the host backend; on CUDA it is ordered on the
 * device's high-priority prefetch stream (h2d) or its offload stream (d2h), and kvt_dev_sync()
 * waits for it. CUDA moves a batch with one gather kernel reading and writing host rows through
 * UVA (or one cudaMemcpyAsync when the rows are contiguous on both sides), never one copy per
 * row, and never waiting for the device unless LANE_RING batches are already in flight. A batch
 * on one stream is ordered after the batches queued before it on the other (a device-side
 * wait). Host rows outside registered memory go through a pinned bounce buffer (an h2d batch
 * reads them before returning; a d2h batch that needs it is complete on return). Registered
 * host rows are read or written when the batch runs: they must stay untouched until its fence
 * completes (kvt_dev_fence() after the call, kvt_dev_fence_done()) or kvt_dev_sync().
 * Returns 0, -ERANGE (row outside the buffer), -ENOMEM, -EIO (logged).
 */
int kvt_dev_copy_h2d(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		     unsigned n);
int kvt_dev_copy_d2h(struct kvt_dev *dev, struct kvt_dev_buf *buf, const struct kvt_dev_copy *rows,
		     unsigned n);
/*
 * kvt_dev_copy_h2d_q8() - kvt_dev_copy_h2d() where rows with @scale set are int8 rows,
 * dequantized by the row kernel (T2 rows cross the bus as int8: half the bytes of f16). Codes
 * and scales are read when the batch runs (pool memory: keep them until its fence completes);
 * an int8 row whose codes or scales lie outside registered memory is dequantized on the host
 * into the bounce buffer instead, with the same result.
 * Returns kvt_dev_copy_h2d()'s values, -EINVAL (an int8 row with group 0 or a dtype other than
 * f16/bf16), -EOPNOTSUPP (the host backend: dequantize on the CPU there).
 * kvt_dev_dequant_ok() - 1 when kvt_dev_copy_h2d_q8() is supported, else 0.
 */
int kvt_dev_copy_h2d_q8(struct kvt_dev *dev, struct kvt_dev_buf *buf,
			const struct kvt_dev_copy *rows, unsigned n);
int kvt_dev_dequant_ok(const struct kvt_dev *dev);

/* Waits for every copy queued so far on every stream. Returns 0 or -EIO (logged). */
int kvt_dev_sync(struct kvt_dev *dev);

/*
 * Fences: every copy batch submitted gets the next number of a per-device counter.
 * kvt_dev_fence() - the fence of the last batch submitted so far (0 before the first). Memory a
 *   queued batch reads or writes may be reused once kvt_dev_fence_done() reaches the fence
 *   kvt_dev_fence() returned after the copy call.
 * kvt_dev_fence_done() - every batch up to the returned fence has completed (event queries,
 *   never blocking; a failed batch stops it advancing until kvt_dev_sync()).
 * kvt_dev_fence_wait() - blocks until kvt_dev_fence_done() >= @f. Returns 0 or -EIO (logged).
 * The host backend copies synchronously: its fences are always 0, so always done.
 * Thread safety: any thread.
 */
uint64_t kvt_dev_fence(struct kvt_dev *dev);
uint64_t kvt_dev_fence_done(struct kvt_dev *dev);
int kvt_dev_fence_wait(struct kvt_dev *dev, uint64_t f);

/*
 * Session events: let a client's stream wait for the daemon's copies with no CPU round trip.
 * kvt_dev_event_create() makes an interprocess event on the device named by @device_uuid and
 * writes its 64-byte IPC handle (cudaIpcEventHandle_t) to @ret_handle; the client opens it with
 * cudaIpcOpenEventHandle() (kvt_event_get_cuda() in libkvtier). kvt_dev_event_record() records
 * it after everything queued so far on both of that device's streams: a client stream that
 * waits on it (cudaStreamWaitEvent) after reaping a CQE sees that op's rows, though the daemon
 * posted the CQE without waiting for them.
 * create returns 0, -EOPNOTSUPP (host backend), -ENODEV (no such device), -ENOMEM, -EIO;
 * record returns 0 or -EIO; NULL @ev is a no-op for record and destroy.
 * Thread safety: record may race with copies on other threads; destroy after the last record.
 */
int kvt_dev_event_create(struct kvt_dev *dev, const uint8_t device_uuid[16],
			 struct kvt_dev_event **ret_ev, uint8_t ret_handle[64]);
int kvt_dev_event_record(struct kvt_dev *dev, struct kvt_dev_event *ev);
void kvt_dev_event_destroy(struct kvt_dev *dev, struct kvt_dev_event *ev);

#endif /* KVT_DEV_H */
