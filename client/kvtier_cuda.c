/* SPDX-License-Identifier: MIT */
/*
 * kvtier_cuda.c - libkvtier's CUDA pieces: share device memory with kvtierd through CUDA IPC
 * handles, allocate device buffers for the caller, and order the caller's stream after the
 * session's event.
 *
 * Everything goes through the CUDA driver API loaded at run time (dlopen of libcuda.so.1, or of
 * $KVTIER_LIBCUDA), never through a CUDA runtime. libkvtier lives inside processes such as
 * PyTorch's that have already loaded a CUDA runtime of their own version; a second libcudart of
 * another version in one process is a conflict we cannot rule out, while the driver is one per
 * machine and backward compatible (NCCL does the same). The entry points are resolved by their
 * versioned symbol names (cuMemAlloc_v2, ...): those are what cuda.h's macros make a program
 * that links libcuda call, and dlsym must ask for the same ones.
 *
 * The few driver types used are declared here (their ABI has not changed since CUDA 4), so every
 * build of libkvtier speaks CUDA, toolkit or not; when a toolkit is present (KVT_CLIENT_CUDA)
 * they are checked against its cuda.h.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "kvtier_int.h"

#define KVT_EXPORT	 __attribute__((visibility("default")))
#define KVTC_MAX_DEVICES 64

typedef int kcu_result; /* CUresult */
typedef int kcu_device; /* CUdevice */
typedef unsigned long long kcu_dptr;
typedef struct kcu_ctx_st *kcu_ctx;
typedef struct kcu_event_st *kcu_event;
typedef struct kcu_stream_st *kcu_stream;
typedef struct {
	char reserved[64];
} kcu_ipc_handle; /* CUipcMemHandle and CUipcEventHandle */
typedef struct {
	char bytes[16];
} kcu_uuid;

enum {
	KCU_SUCCESS = 0,
	KCU_ERROR_INVALID_VALUE = 1,
	KCU_ERROR_OUT_OF_MEMORY = 2,
	KCU_ERROR_STUB_LIBRARY = 34,
	KCU_ERROR_DEVICE_UNAVAILABLE = 46,
	KCU_ERROR_NO_DEVICE = 100,
	KCU_ERROR_INVALID_DEVICE = 101,
	KCU_ERROR_INVALID_CONTEXT = 201,
	KCU_ERROR_INVALID_HANDLE = 400,
	KCU_ERROR_NOT_FOUND = 500,
	KCU_ERROR_CONTEXT_IS_DESTROYED = 709,
	KCU_ERROR_NOT_PERMITTED = 800,
	KCU_ERROR_NOT_SUPPORTED = 801,
	KCU_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
	KCU_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
};
enum {
	KCU_POINTER_ATTRIBUTE_CONTEXT = 1,
	KCU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	KCU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
};
enum { KCU_MEMORYTYPE_DEVICE = 2 };

#ifdef KVT_CLIENT_CUDA
#include <cuda.h>
_Static_assert(sizeof(CUresult) == sizeof(kcu_result) && sizeof(CUdevice) == sizeof(kcu_device) &&
		   sizeof(CUdeviceptr) == sizeof(kcu_dptr) &&
		   sizeof(CUipcMemHandle) == sizeof(kcu_ipc_handle) &&
		   sizeof(CUipcEventHandle) == sizeof(kcu_ipc_handle) &&
		   sizeof(CUuuid) == sizeof(kcu_uuid) && sizeof(CUpointer_attribute) == sizeof(int),
	       "driver types");
/* The enums differ in type, not in value. */
#define KCU_SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(KCU_SAME(KCU_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE) &&
		   KCU_SAME(KCU_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY) &&
		   KCU_SAME(KCU_ERROR_STUB_LIBRARY, CUDA_ERROR_STUB_LIBRARY) &&
		   KCU_SAME(KCU_ERROR_DEVICE_UNAVAILABLE, CUDA_ERROR_DEVICE_UNAVAILABLE) &&
		   KCU_SAME(KCU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE) &&
		   KCU_SAME(KCU_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE) &&
		   KCU_SAME(KCU_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT) &&
		   KCU_SAME(KCU_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE) &&
		   KCU_SAME(KCU_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND) &&
		   KCU_SAME(KCU_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_CONTEXT_IS_DESTROYED) &&
		   KCU_SAME(KCU_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED) &&
		   KCU_SAME(KCU_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED) &&
		   KCU_SAME(KCU_ERROR_SYSTEM_DRIVER_MISMATCH, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH) &&
		   KCU_SAME(KCU_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
			    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE),
	       "driver error codes");
_Static_assert(KCU_SAME(KCU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT) &&
		   KCU_SAME(KCU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE) &&
		   KCU_SAME(KCU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
			    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) &&
		   KCU_SAME(KCU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE),
	       "driver enums");
#endif

/* Every entry point used, by the symbol the driver exports (CUDA 11.4 has them all). */
#define KCU_FNS(X)                                                                                 \
	X(cuInit, (unsigned flags))                                                                \
	X(cuGetErrorName, (kcu_result e, const char **ret_name))                                   \
	X(cuGetErrorString, (kcu_result e, const char **ret_text))                                 \
	X(cuDeviceGet, (kcu_device * ret_dev, int ordinal))                                        \
	X(cuDeviceGetUuid_v2, (kcu_uuid * ret_uuid, kcu_device dev))                               \
	X(cuDevicePrimaryCtxRetain, (kcu_ctx * ret_ctx, kcu_device dev))                           \
	X(cuCtxPushCurrent_v2, (kcu_ctx ctx))                                                      \
	X(cuCtxPopCurrent_v2, (kcu_ctx * ret_ctx))                                                 \
	X(cuCtxGetDevice, (kcu_device * ret_dev))                                                  \
	X(cuPointerGetAttributes, (unsigned n, int *attrs, void **data, kcu_dptr p))               \
	X(cuMemGetAddressRange_v2, (kcu_dptr * ret_base, size_t * ret_size, kcu_dptr p))           \
	X(cuMemAlloc_v2, (kcu_dptr * ret_p, size_t size))                                          \
	X(cuMemFree_v2, (kcu_dptr p))                                                              \
	X(cuIpcGetMemHandle, (kcu_ipc_handle * ret_handle, kcu_dptr p))                            \
	X(cuIpcOpenEventHandle, (kcu_event * ret_ev, kcu_ipc_handle handle))                       \
	X(cuEventDestroy_v2, (kcu_event ev))                                                       \
	X(cuStreamGetCtx, (kcu_stream s, kcu_ctx * ret_ctx))                                       \
	X(cuStreamWaitEvent, (kcu_stream s, kcu_event ev, unsigned flags))

/* The driver, once per process, like the runtime's own state: it is loaded and initialized at
 * the first call that needs it and stays. Primary contexts are retained once per device and
 * kept, as the CUDA runtime keeps them, so that nothing libkvtier opened or allocated in one
 * can lose it while the caller still holds it. */
struct kcu_driver {
	pthread_once_t once;
	int err;	      /* 0, or why the driver is unusable (-errno) ... */
	char why[200];	      /* ... in words */
	pthread_mutex_t lock; /* primary[] */
	kcu_ctx primary[KVTC_MAX_DEVICES];
#define X(name, args) kcu_result(*name) args;
	KCU_FNS(X)
#undef X
};

static struct kcu_driver drv = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/* Per session: the session's interprocess event, opened once, for kvt_cuda_stream_wait(). */
struct kvtc_cuda {
	kcu_event ev;
	kcu_ctx ctx; /* the primary context it was opened in */
	int host;    /* the daemon runs the host backend: there is nothing to wait for */
};

/* Device memory kvt_buf_alloc_cuda() allocated. */
struct kvtc_mem {
	kcu_dptr p;
	kcu_ctx ctx;
};

static int
cu_errno(kcu_result e)
{
	switch (e) {
	case KCU_SUCCESS:
		return 0;
	case KCU_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case KCU_ERROR_INVALID_VALUE:
	case KCU_ERROR_INVALID_HANDLE:
	case KCU_ERROR_INVALID_CONTEXT:
	case KCU_ERROR_CONTEXT_IS_DESTROYED:
	case KCU_ERROR_NOT_FOUND:
		return -EINVAL;
	case KCU_ERROR_NO_DEVICE:
	case KCU_ERROR_INVALID_DEVICE:
		return -ENODEV;
	case KCU_ERROR_DEVICE_UNAVAILABLE:
		return -EBUSY;
	case KCU_ERROR_NOT_PERMITTED:
		return -EPERM;
	case KCU_ERROR_NOT_SUPPORTED:
	case KCU_ERROR_STUB_LIBRARY:
	case KCU_ERROR_SYSTEM_DRIVER_MISMATCH:
	case KCU_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

/* Our own words for the codes mapped above, for a driver that has none (a stub answers every
 * call, cuGetErrorName included, with CUDA_ERROR_STUB_LIBRARY). */
static const char *
cu_own_name(kcu_result e)
{
	switch (e) {
	case KCU_ERROR_STUB_LIBRARY:
		return "CUDA_ERROR_STUB_LIBRARY";
	case KCU_ERROR_NO_DEVICE:
		return "CUDA_ERROR_NO_DEVICE";
	case KCU_ERROR_OUT_OF_MEMORY:
		return "CUDA_ERROR_OUT_OF_MEMORY";
	default:
		return "unknown CUresult";
	}
}

/* The one wrapper every driver call goes through: maps a failure to -errno and says which call
 * failed, and how, in kvt_last_error(). */
static int
cu_check(const char *fn, kcu_result e)
{
	const char *name = NULL, *text = NULL;

	if (e == KCU_SUCCESS)
		return 0;
	if (drv.cuGetErrorName(e, &name) != KCU_SUCCESS || !name)
		name = cu_own_name(e);
	if (drv.cuGetErrorString(e, &text) != KCU_SUCCESS || !text)
		text = e == KCU_ERROR_STUB_LIBRARY ? "a stub libcuda, not the NVIDIA driver" : "";
	kvtc_set_error("libkvtier: %s failed: %s %d (%s)", fn, name, e, text);
	return cu_errno(e);
}

#define CU(fn, ...) cu_check(#fn, drv.fn(__VA_ARGS__))

static void
drv_load(void)
{
	static const struct {
		const char *name;
		size_t off;
	} syms[] = {
#define X(name, args) {#name, offsetof(struct kcu_driver, name)},
	    KCU_FNS(X)
#undef X
	};
	const char *path = getenv("KVTIER_LIBCUDA");
	void *lib;

	if (!path || !*path)
		path = "libcuda.so.1";
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		drv.err = -EOPNOTSUPP;
		snprintf(drv.why, sizeof(drv.why),
			 "libkvtier: no CUDA driver: %s (install the NVIDIA driver, or point "
			 "KVTIER_LIBCUDA at its libcuda.so.1)",
			 dlerror());
		return;
	}
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *fn = dlsym(lib, syms[i].name);

		if (!fn) {
			drv.err = -EOPNOTSUPP;
			snprintf(drv.why, sizeof(drv.why),
				 "libkvtier: the CUDA driver %s has no %s (CUDA 11.4 or later "
				 "needed)",
				 path, syms[i].name);
			dlclose(lib);
			memset((char *)&drv + offsetof(struct kcu_driver, cuInit), 0,
			       sizeof(drv) - offsetof(struct kcu_driver, cuInit));
			return;
		}
		memcpy((char *)&drv + syms[i].off, &fn, sizeof(fn));
	}
	/* Kept loaded for the life of the process, as the runtime keeps it. */
	drv.err = CU(cuInit, 0);
	if (drv.err)
		snprintf(drv.why, sizeof(drv.why), "%s", kvt_last_error());
}

/* The driver, loaded and initialized, or -errno with kvt_last_error() saying why. */
static int
drv_get(void)
{
	pthread_once(&drv.once, drv_load);
	if (drv.err)
		kvtc_set_error("%s", drv.why);
	return drv.err;
}

/* @dev's primary context, retained on first use and kept. */
static int
primary_ctx(kcu_device dev, kcu_ctx *ret_ctx)
{
	kcu_ctx ctx = NULL;
	int r = 0;

	if (dev < 0 || dev >= KVTC_MAX_DEVICES) {
		kvtc_set_error("libkvtier: CUDA device %d: only %d devices are supported", dev,
			       KVTC_MAX_DEVICES);
		return -ENODEV;
	}
	pthread_mutex_lock(&drv.lock);
	if (!drv.primary[dev]) {
		r = CU(cuDevicePrimaryCtxRetain, &ctx, dev);
		if (r == 0)
			drv.primary[dev] = ctx;
	}
	ctx = drv.primary[dev];
	pthread_mutex_unlock(&drv.lock);
	if (r == 0)
		*ret_ctx = ctx;
	return r;
}

/* Device @ordinal of this process: its handle, UUID (how kvtierd names it) and, when @ret_ctx
 * is not NULL, primary context. */
static int
device_get(int ordinal, kcu_device *ret_dev, kcu_ctx *ret_ctx, kcu_uuid *ret_uuid)
{
	kcu_device dev;
	int r = CU(cuDeviceGet, &dev, ordinal);

	if (r == 0)
		r = CU(cuDeviceGetUuid_v2, ret_uuid, dev);
	if (r == 0 && ret_ctx)
		r = primary_ctx(dev, ret_ctx);
	if (r == 0)
		*ret_dev = dev;
	return r;
}

/* Make @ctx current for a few calls; ctx_pop() restores the caller's current context. */
static int
ctx_push(kcu_ctx ctx)
{
	return CU(cuCtxPushCurrent_v2, ctx);
}

static int
ctx_pop(void)
{
	kcu_ctx ctx;

	return CU(cuCtxPopCurrent_v2, &ctx);
}

KVT_EXPORT int
kvt_buf_register_cuda(struct kvt_client *c, void *dev_ptr, uint64_t size, struct kvt_buf **ret_buf)
{
	int attrs[3] = {KCU_POINTER_ATTRIBUTE_CONTEXT, KCU_POINTER_ATTRIBUTE_MEMORY_TYPE,
			KCU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
	kcu_ctx ctx = NULL;
	unsigned type = 0;
	int ordinal = -1;
	void *data[3] = {&ctx, &type, &ordinal};
	kcu_dptr p = (kcu_dptr)(uintptr_t)dev_ptr, base = 0;
	size_t alloc = 0;
	kcu_ipc_handle h;
	kcu_device dev;
	kcu_uuid uuid;
	int r;

	kvtc_set_error("%s", "");
	if (!dev_ptr || !size) {
		kvtc_set_error("libkvtier: kvt_buf_register_cuda: %s",
			       dev_ptr ? "size 0" : "NULL device pointer");
		return -EINVAL;
	}
	r = drv_get();
	if (r < 0)
		return r;
	/* Unlike the singular call, this one answers CUDA_SUCCESS with memory type 0 for a
	 * pointer CUDA does not know. */
	r = CU(cuPointerGetAttributes, 3, attrs, data, p);
	if (r < 0)
		return r;
	if (type != KCU_MEMORYTYPE_DEVICE) {
		kvtc_set_error("libkvtier: %p is not CUDA device memory (memory type %u); "
			       "register cudaMalloc/cuMemAlloc memory, or use kvt_buf_alloc_cuda()",
			       dev_ptr, type);
		return -EINVAL;
	}
	/* Memory of no context (cuMemMap) is asked about in the device's primary context; its
	 * cuIpcGetMemHandle then fails: legacy IPC covers cuMemAlloc memory only. */
	r = device_get(ordinal, &dev, ctx ? NULL : &ctx, &uuid);
	if (r == 0)
		r = ctx_push(ctx);
	if (r < 0)
		return r;
	/* The daemon opens the handle of the whole allocation; the buffer is a range of it. */
	r = CU(cuMemGetAddressRange_v2, &base, &alloc, p);
	if (r == 0 && (p < base || size > alloc - (p - base))) {
		kvtc_set_error(
		    "libkvtier: %llu bytes at %p pass the end of its %zu-byte allocation "
		    "at %p",
		    (unsigned long long)size, dev_ptr, alloc, (void *)(uintptr_t)base);
		r = -EINVAL;
	}
	if (r == 0)
		r = CU(cuIpcGetMemHandle, &h, base);
	if (r == 0)
		r = ctx_pop();
	else
		ctx_pop();
	if (r < 0)
		return r;
	return kvtc_buf_register_ipc(c, (const uint8_t *)h.reserved, (const uint8_t *)uuid.bytes,
				     dev_ptr, p - base, size, NULL, ret_buf);
}

int
kvtc_cuda_mem_free(void *mem)
{
	struct kvtc_mem *m = mem;
	int r;

	if (!m)
		return 0;
	r = ctx_push(m->ctx);
	if (r == 0) {
		r = CU(cuMemFree_v2, m->p);
		ctx_pop();
	}
	free(m);
	return r;
}

KVT_EXPORT int
kvt_buf_alloc_cuda(struct kvt_client *c, int device, uint64_t size, struct kvt_buf **ret_buf)
{
	kcu_ipc_handle h;
	struct kvtc_mem *m;
	kcu_device dev;
	kcu_uuid uuid;
	kcu_ctx ctx;
	int r;

	kvtc_set_error("%s", "");
	if (!size || size > SIZE_MAX) {
		kvtc_set_error("libkvtier: kvt_buf_alloc_cuda: size %llu",
			       (unsigned long long)size);
		return -EINVAL;
	}
	r = drv_get();
	if (r == 0)
		r = device_get(device, &dev, &ctx, &uuid);
	if (r < 0)
		return r;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->ctx = ctx;
	r = ctx_push(ctx);
	if (r < 0)
		goto err_free;
	r = CU(cuMemAlloc_v2, &m->p, (size_t)size);
	if (r == 0)
		r = CU(cuIpcGetMemHandle, &h, m->p);
	if (r == 0)
		r = ctx_pop();
	else
		ctx_pop();
	if (r < 0)
		goto err_mem;
	r = kvtc_buf_register_ipc(c, (const uint8_t *)h.reserved, (const uint8_t *)uuid.bytes,
				  (void *)(uintptr_t)m->p, 0, size, m, ret_buf);
	if (r < 0)
		goto err_mem;
	return 0;
err_mem:
	if (m->p) {
		/* Keep the first failure's message: it explains @r. */
		char why[256];

		snprintf(why, sizeof(why), "%s", kvt_last_error());
		kvtc_cuda_mem_free(m);
		kvtc_set_error("%s", why);
		return r;
	}
err_free:
	free(m);
	return r;
}

/* Open the session's event in the primary context of @dev (opening makes a handle valid in
 * that context only; waits from streams of other contexts on the device are fine). Sets
 * *@ret_host when the daemon answers that its backend has no events. */
static int
event_open(struct kvt_client *c, kcu_device dev, kcu_event *ret_ev, kcu_ctx *ret_ctx, int *ret_host)
{
	kcu_ipc_handle h;
	kcu_uuid uuid;
	kcu_ctx ctx;
	int r;

	r = CU(cuDeviceGetUuid_v2, &uuid, dev);
	if (r == 0)
		r = primary_ctx(dev, &ctx);
	if (r == 0) {
		r = kvtc_event_get(c, (const uint8_t *)uuid.bytes, (uint8_t *)h.reserved);
		*ret_host = r == -EOPNOTSUPP;
	}
	if (r == 0)
		r = ctx_push(ctx);
	if (r < 0)
		return r;
	r = CU(cuIpcOpenEventHandle, ret_ev, h);
	if (r == 0)
		r = ctx_pop();
	else
		ctx_pop();
	if (r == 0)
		*ret_ctx = ctx;
	return r;
}

KVT_EXPORT int
kvt_event_get_cuda(struct kvt_client *c, int device, void **ret_event)
{
	kcu_event ev;
	kcu_device dev;
	kcu_ctx ctx;
	int host, r;

	kvtc_set_error("%s", "");
	r = drv_get();
	if (r == 0)
		r = CU(cuDeviceGet, &dev, device);
	if (r == 0)
		r = event_open(c, dev, &ev, &ctx, &host);
	if (r < 0)
		return r;
	*ret_event = ev;
	return 0;
}

/* The device of @s: its context's. */
static int
stream_device(kcu_stream s, kcu_device *ret_dev)
{
	kcu_ctx ctx;
	int r;

	r = CU(cuStreamGetCtx, s, &ctx);
	if (r == 0)
		r = ctx_push(ctx);
	if (r < 0)
		return r;
	r = CU(cuCtxGetDevice, ret_dev);
	if (r == 0)
		r = ctx_pop();
	else
		ctx_pop();
	return r;
}

KVT_EXPORT int
kvt_cuda_stream_wait(struct kvt_client *c, void *stream)
{
	struct kvtc_cuda **sp = (struct kvtc_cuda **)kvtc_cuda_state(c), *s = *sp;
	kcu_device dev;
	int host = 0, r;

	kvtc_set_error("%s", "");
	if (s && s->host)
		return 0;
	r = drv_get();
	if (r < 0)
		return r;
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s)
			return -ENOMEM;
		*sp = s;
	}
	if (!s->ev) {
		r = stream_device(stream, &dev);
		if (r == 0)
			r = event_open(c, dev, &s->ev, &s->ctx, &host);
		if (host) {
			/* The host backend: its copies are complete when the CQE is posted. */
			s->host = 1;
			kvtc_set_error("%s", "");
			return 0;
		}
		if (r < 0)
			return r;
	}
	return CU(cuStreamWaitEvent, (kcu_stream)stream, s->ev, 0);
}

void
kvtc_cuda_fini(void *state)
{
	struct kvtc_cuda *s = state;

	if (!s)
		return;
	/* Failures are ignored: at process exit the driver may already be shut down. */
	if (s->ev && ctx_push(s->ctx) == 0) {
		drv.cuEventDestroy_v2(s->ev);
		ctx_pop();
	}
	free(s);
}
