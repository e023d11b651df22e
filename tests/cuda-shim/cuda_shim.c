/* SPDX-License-Identifier: MIT */
/*
 * cuda_shim.c - FAULT-INJECTING FAKE CUDA RUNTIME, FOR TESTS ONLY: never installed, never used
 * outside tests/cuda-shim/. See cuda_shim.h for what it emulates and how it is controlled.
 *
 * Each exported function starts with ENTER(), which logs the call, counts it and returns an
 * armed failure, so every function can be failed at any call. Emulated objects:
 * - device memory: memfd + shared mapping (the fd stays open so another process can map it
 *   through /proc/<pid>/fd/<fd> when it opens the IPC handle);
 * - pinned host memory: a table of registered ranges and cudaHostAlloc blocks (device pointer
 *   = host pointer, as UVA gives on Linux);
 * - streams: tokens. Copies and kernels are queued in one FIFO per process (a legal schedule of
 *   every stream) and executed later by the shim's device thread, or by whoever synchronizes
 *   (stream or event) first. kvt_shim_hold() stops the device thread so a test can look at the
 *   state while copies are still queued;
 * - events: a slot of a per-process table in a shared memfd (recorded and completed counts),
 *   so another process that opened the IPC handle can wait for the recording process's work;
 * - the kvt_rows_copy kernel: its descriptors are read and executed with memcpy when the
 *   queued launch runs, not when it is enqueued.
 */
#define _GNU_SOURCE
#include <cublas_api.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_shim.h"
#include "gpu_decode_kernels.h"
#include "rows.h"

#define SHIM_EXPORT __attribute__((visibility("default")))
#define MAGIC	    0x4d494853544b56ull /* "KVTSHIM" */

enum obj_kind { OBJ_DEVMEM, OBJ_IPCMAP, OBJ_HOSTALLOC, OBJ_REGISTERED };

struct obj {
	struct obj *next;
	enum obj_kind kind;
	uint8_t *p;
	size_t len;
	int fd;		 /* OBJ_DEVMEM: the memfd */
	uint64_t serial; /* OBJ_DEVMEM / OBJ_IPCMAP: the allocation's id "pid.serial" */
	int pid;
	int dev; /* OBJ_DEVMEM: the device it was allocated on */
};

struct ipc_mem {
	uint64_t magic;
	int32_t pid, fd;
	uint64_t size, serial;
};

/* One event's state, in the process's shared event table. */
struct ev_slot {
	_Atomic uint64_t recorded;  /* records so far */
	_Atomic uint64_t completed; /* the last record whose preceding work has run */
};

#define EV_SLOTS 4096

struct ipc_ev {
	uint64_t magic;
	int32_t pid;
	uint32_t interprocess;
	uint64_t serial; /* the event's id "pid.serial" */
	int32_t tab_fd;	 /* the owner's event table memfd, and this event's slot in it */
	uint32_t idx;
	/* not part of the IPC handle: */
	struct ev_slot *slot;
};
#define IPC_EV_HANDLE_BYTES offsetof(struct ipc_ev, slot)

/* Queued device work. */
enum work_kind { W_COPY, W_ROWS, W_RECORD, W_FN };

struct work {
	struct work *next;
	enum work_kind kind;
	void *dst; /* W_COPY */
	const void *src;
	size_t n;
	void *own; /* W_COPY: a private copy of a pageable source, freed after */
	const struct kvt_row_desc *desc; /* W_ROWS: read when the launch runs */
	unsigned nrows;
	struct ev_slot *slot; /* W_RECORD */
	uint64_t rec;
	uint64_t due_ns;	     /* the device thread runs it no sooner (KVT_SHIM_DELAY_MS) */
	void (*fn)(const void *arg); /* W_FN: a kernel's or a library call's host equivalent */
	uint64_t arg[24];
};

struct arm {
	char fn[48];
	unsigned k;
	int err;
};

struct counter {
	char fn[48];
	unsigned n;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int n_devices = 1, cur_device;
static struct obj *objs;
static uint64_t next_serial = 1;
static struct arm arms[32];
static unsigned n_arms;
static struct counter counters[64];
static unsigned n_counters;
static char *logbuf;
static size_t log_len, log_cap;
static int log_fd = -1;
static cudaError_t last_error;
static int library_token;
/* Kernels known by name: the device layer's row copy and gpu-decode's (host equivalents). */
static const char *const kernel_names[] = {KVT_ROWS_KERNEL, KVTB_ATTN_PARTIAL, KVTB_ATTN_COMBINE,
					   KVTB_SILU_MUL};
static int kernel_tokens[4];
#define kernel_token (kernel_tokens[0])
static struct work *wq_head, *wq_tail;
static int wq_hold, dev_thread_started;
static uint64_t wq_delay_ns;
static pthread_cond_t wq_cond = PTHREAD_COND_INITIALIZER;
static unsigned hazards;
static struct ev_slot *ev_tab;
static int ev_tab_fd = -1;
static uint8_t ev_used[EV_SLOTS];

static void atfork_child(void);
static void work_run_one(void);
static void release_check(const char *what, const void *p, size_t len);

static void
log_line(const char *fmt, ...)
{
	char line[256];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	line[n] = 0;
	if (log_len + n + 1 > log_cap) {
		size_t cap = log_cap ? 2 * log_cap : 65536;
		char *b;

		while (cap < log_len + n + 1)
			cap *= 2;
		b = realloc(logbuf, cap);
		if (!b)
			return;
		logbuf = b;
		log_cap = cap;
	}
	memcpy(logbuf + log_len, line, (size_t)n + 1);
	log_len += n;
	if (log_fd >= 0 && write(log_fd, line, n) < 0)
		log_fd = -1;
}

static struct counter *
counter_of(const char *fn)
{
	for (unsigned i = 0; i < n_counters; i++)
		if (!strcmp(counters[i].fn, fn))
			return &counters[i];
	if (n_counters == sizeof(counters) / sizeof(counters[0]))
		abort();
	snprintf(counters[n_counters].fn, sizeof(counters[0].fn), "%s", fn);
	counters[n_counters].n = 0;
	return &counters[n_counters++];
}

/* Count the call, log it, and return the armed error for this call (or cudaSuccess). */
static cudaError_t
enter(const char *fn, const char *fmt, ...)
{
	struct counter *c = counter_of(fn);
	cudaError_t err = cudaSuccess;
	char args[160] = "";
	va_list ap;

	c->n++;
	for (unsigned i = 0; i < n_arms; i++)
		if (!strcmp(arms[i].fn, fn) && --arms[i].k == 0) {
			err = (cudaError_t)arms[i].err;
			arms[i] = arms[--n_arms];
			break;
		}
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	if (err)
		log_line("%s %s -> %s (injected)", fn, args, cudaGetErrorName(err));
	else
		log_line("%s %s", fn, args);
	return err;
}

#define ENTER(...)                                                                                 \
	do {                                                                                       \
		cudaError_t e_;                                                                    \
		pthread_mutex_lock(&lock);                                                         \
		e_ = enter(__func__, __VA_ARGS__);                                                 \
		if (e_) {                                                                          \
			last_error = e_;                                                           \
			pthread_mutex_unlock(&lock);                                               \
			return e_;                                                                 \
		}                                                                                  \
	} while (0)
#define LEAVE(e)                                                                                   \
	do {                                                                                       \
		cudaError_t e2_ = (e);                                                             \
		if (e2_) {                                                                         \
			last_error = e2_;                                                          \
			log_line("  -> %s", cudaGetErrorName(e2_));                                \
		}                                                                                  \
		pthread_mutex_unlock(&lock);                                                       \
		return e2_;                                                                        \
	} while (0)

static void
arm_from_env(const char *spec)
{
	char *copy = strdup(spec), *save = NULL;

	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		char fn[48];
		unsigned k;
		int err;

		if (sscanf(t, "%47[^:]:%u:%d", fn, &k, &err) == 3 && k > 0 && n_arms < 32) {
			snprintf(arms[n_arms].fn, sizeof(arms[0].fn), "%s", fn);
			arms[n_arms].k = k;
			arms[n_arms++].err = err;
		}
	}
	free(copy);
}

__attribute__((constructor)) static void
shim_init(void)
{
	const char *s = getenv("KVT_SHIM_DEVICES");

	if (s)
		n_devices = atoi(s);
	s = getenv("KVT_SHIM_FAIL");
	if (s)
		arm_from_env(s);
	s = getenv("KVT_SHIM_LOG");
	if (s)
		log_fd = open(s, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	s = getenv("KVT_SHIM_DELAY_MS");
	if (s)
		wq_delay_ns = strtoull(s, NULL, 10) * 1000000u;
	pthread_atfork(NULL, NULL, atfork_child);
}

SHIM_EXPORT void
kvt_shim_reset(int devices)
{
	pthread_mutex_lock(&lock);
	n_devices = devices;
	n_arms = 0;
	n_counters = 0;
	log_len = 0;
	if (logbuf)
		logbuf[0] = 0;
	last_error = cudaSuccess;
	hazards = 0;
	pthread_mutex_unlock(&lock);
}

SHIM_EXPORT void
kvt_shim_fail(const char *fn, unsigned k, int err)
{
	pthread_mutex_lock(&lock);
	if (n_arms < 32 && k > 0) {
		snprintf(arms[n_arms].fn, sizeof(arms[0].fn), "%s", fn);
		arms[n_arms].k = k;
		arms[n_arms++].err = err;
	}
	pthread_mutex_unlock(&lock);
}

SHIM_EXPORT unsigned
kvt_shim_count(const char *fn)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < n_counters; i++)
		if (!strcmp(counters[i].fn, fn))
			n = counters[i].n;
	pthread_mutex_unlock(&lock);
	return n;
}

SHIM_EXPORT const char *
kvt_shim_log(void)
{
	return logbuf ? logbuf : "";
}

static unsigned
count_kind(enum obj_kind k)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (struct obj *o = objs; o; o = o->next)
		n += o->kind == k;
	pthread_mutex_unlock(&lock);
	return n;
}

SHIM_EXPORT unsigned
kvt_shim_ipc_open(void)
{
	return count_kind(OBJ_IPCMAP);
}

SHIM_EXPORT unsigned
kvt_shim_registered(void)
{
	return count_kind(OBJ_REGISTERED);
}

static uint64_t
mono_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void *
dev_thread(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&lock);
	for (;;) {
		uint64_t now;

		while (!wq_head || wq_hold)
			pthread_cond_wait(&wq_cond, &lock);
		now = mono_ns();
		if (wq_head->due_ns > now) {
			/* A slow device: not yet. Wakes early on a new push or a hold change. */
			struct timespec t;

			clock_gettime(CLOCK_REALTIME, &t);
			now = (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec +
			      (wq_head->due_ns - now);
			t.tv_sec = (time_t)(now / 1000000000u);
			t.tv_nsec = (long)(now % 1000000000u);
			pthread_cond_timedwait(&wq_cond, &lock, &t);
			continue;
		}
		work_run_one();
	}
	return NULL;
}

static void
atfork_child(void)
{
	/* The device thread stays behind in the parent; the child drains at its sync points. */
	dev_thread_started = 0;
}

/* Lock held. */
static void
work_push(struct work *w)
{
	w->next = NULL;
	w->due_ns = wq_delay_ns ? mono_ns() + wq_delay_ns : 0;
	if (wq_tail)
		wq_tail->next = w;
	else
		wq_head = w;
	wq_tail = w;
	if (!dev_thread_started) {
		pthread_t t;

		if (pthread_create(&t, NULL, dev_thread, NULL) == 0) {
			pthread_detach(t);
			dev_thread_started = 1;
		}
	}
	pthread_cond_broadcast(&wq_cond);
}

/* Lock held: runs until @slot's completion count reaches @rec (or the queue is empty). */
static void
drain_until(struct ev_slot *slot, uint64_t rec)
{
	while (wq_head && (!slot || atomic_load(&slot->completed) < rec))
		work_run_one();
}

SHIM_EXPORT void
kvt_shim_hold(int on)
{
	pthread_mutex_lock(&lock);
	wq_hold = on;
	pthread_cond_broadcast(&wq_cond);
	pthread_mutex_unlock(&lock);
}

SHIM_EXPORT unsigned
kvt_shim_queued(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (struct work *w = wq_head; w; w = w->next)
		n += w->kind != W_RECORD;
	pthread_mutex_unlock(&lock);
	return n;
}

SHIM_EXPORT void
kvt_shim_run(void)
{
	pthread_mutex_lock(&lock);
	drain_until(NULL, 0);
	pthread_mutex_unlock(&lock);
}

SHIM_EXPORT unsigned
kvt_shim_hazards(void)
{
	unsigned n;

	pthread_mutex_lock(&lock);
	n = hazards;
	pthread_mutex_unlock(&lock);
	return n;
}

/* ---- objects ------------------------------------------------------------------------------ */

static struct obj *
obj_add(enum obj_kind kind, void *p, size_t len)
{
	struct obj *o = calloc(1, sizeof(*o));

	if (!o)
		return NULL;
	o->kind = kind;
	o->p = p;
	o->len = len;
	o->fd = -1;
	o->next = objs;
	objs = o;
	return o;
}

static void
obj_del(struct obj *o)
{
	for (struct obj **pp = &objs; *pp; pp = &(*pp)->next)
		if (*pp == o) {
			*pp = o->next;
			break;
		}
	free(o);
}

/* The object of a kind set (bit per kind) containing [p, p+len). */
static struct obj *
obj_find(const void *p, size_t len, unsigned kinds)
{
	const uint8_t *b = p;

	for (struct obj *o = objs; o; o = o->next)
		if ((kinds & (1u << o->kind)) && b >= o->p && b + len <= o->p + o->len)
			return o;
	return NULL;
}

static struct obj *
obj_at(const void *p, enum obj_kind kind)
{
	for (struct obj *o = objs; o; o = o->next)
		if (o->kind == kind && o->p == p)
			return o;
	return NULL;
}

/* ---- errors ------------------------------------------------------------------------------- */

SHIM_EXPORT const char *
cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "cudaSuccess";
	case cudaErrorInvalidValue:
		return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation:
		return "cudaErrorMemoryAllocation";
	case cudaErrorInvalidDevice:
		return "cudaErrorInvalidDevice";
	case cudaErrorNoDevice:
		return "cudaErrorNoDevice";
	case cudaErrorInsufficientDriver:
		return "cudaErrorInsufficientDriver";
	case cudaErrorInvalidResourceHandle:
		return "cudaErrorInvalidResourceHandle";
	case cudaErrorInvalidDevicePointer:
		return "cudaErrorInvalidDevicePointer";
	case cudaErrorInvalidDeviceFunction:
		return "cudaErrorInvalidDeviceFunction";
	case cudaErrorHostMemoryAlreadyRegistered:
		return "cudaErrorHostMemoryAlreadyRegistered";
	case cudaErrorHostMemoryNotRegistered:
		return "cudaErrorHostMemoryNotRegistered";
	case cudaErrorNotSupported:
		return "cudaErrorNotSupported";
	case cudaErrorNotPermitted:
		return "cudaErrorNotPermitted";
	case cudaErrorLaunchFailure:
		return "cudaErrorLaunchFailure";
	case cudaErrorIllegalAddress:
		return "cudaErrorIllegalAddress";
	case cudaErrorMapBufferObjectFailed:
		return "cudaErrorMapBufferObjectFailed";
	case cudaErrorDevicesUnavailable:
		return "cudaErrorDevicesUnavailable";
	case cudaErrorNotReady:
		return "cudaErrorNotReady";
	case cudaErrorLaunchTimeout:
		return "cudaErrorLaunchTimeout";
	default:
		return "cudaErrorUnknown";
	}
}

SHIM_EXPORT const char *
cudaGetErrorString(cudaError_t e)
{
	return e == cudaSuccess ? "no error" : "injected or emulated failure (kvt cuda shim)";
}

SHIM_EXPORT cudaError_t
cudaGetLastError(void)
{
	cudaError_t e;

	pthread_mutex_lock(&lock);
	e = last_error;
	last_error = cudaSuccess;
	pthread_mutex_unlock(&lock);
	return e;
}

/* ---- devices ------------------------------------------------------------------------------ */

SHIM_EXPORT cudaError_t
cudaGetDeviceCount(int *count)
{
	ENTER("");
	if (n_devices <= 0)
		LEAVE(cudaErrorNoDevice);
	*count = n_devices;
	LEAVE(cudaSuccess);
}

/* Device i sits at PCI function 0000:(0x3b + i):00.0, in upper case as the runtime writes it. */
SHIM_EXPORT cudaError_t
cudaDeviceGetPCIBusId(char *bus, int len, int device)
{
	ENTER("%d", device);
	if (device < 0 || device >= n_devices)
		LEAVE(cudaErrorInvalidDevice);
	if (!bus || len < 13)
		LEAVE(cudaErrorInvalidValue);
	snprintf(bus, (size_t)len, "0000:%02X:00.0", 0x3b + device);
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaSetDevice(int device)
{
	ENTER("%d", device);
	if (device < 0 || device >= n_devices)
		LEAVE(cudaErrorInvalidDevice);
	cur_device = device;
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaGetDevice(int *device)
{
	ENTER("");
	*device = cur_device;
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	ENTER("%d", device);
	if (device < 0 || device >= n_devices)
		LEAVE(cudaErrorInvalidDevice);
	memset(prop, 0, sizeof(*prop));
	snprintf(prop->name, sizeof(prop->name), "kvt-shim GPU %d", device);
	{
		char u[32];

		snprintf(u, sizeof(u), "KVTSHIMGPU%06u", (unsigned)device % 1000000);
		memcpy(prop->uuid.bytes, u, 16);
	}
	prop->unifiedAddressing = 1;
	prop->canMapHostMemory = 1;
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	ENTER("%d %d", (int)attr, device);
	if (device < 0 || device >= n_devices)
		LEAVE(cudaErrorInvalidDevice);
	*value = attr == cudaDevAttrUnifiedAddressing || attr == cudaDevAttrCanMapHostMemory ||
			 attr == cudaDevAttrCanUseHostPointerForRegisteredMem
		     ? 1
		     : 0;
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
	ENTER("");
	*least = 0;
	*greatest = -5;
	LEAVE(cudaSuccess);
}

/* ---- streams and events ------------------------------------------------------------------- */

/* A runtime stream is a driver stream of the current device's primary context (driver section),
 * so libkvtier's cuStreamGetCtx() knows the streams a program made with the runtime. */
static void *rt_stream_new(void);
static void rt_stream_free(void *s);

SHIM_EXPORT cudaError_t
cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority)
{
	ENTER("flags=%u priority=%d", flags, priority);
	*s = rt_stream_new();
	LEAVE(*s ? cudaSuccess : cudaErrorMemoryAllocation);
}

SHIM_EXPORT cudaError_t
cudaStreamDestroy(cudaStream_t s)
{
	ENTER("");
	rt_stream_free(s);
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaStreamSynchronize(cudaStream_t s)
{
	ENTER("");
	drain_until(NULL, 0); /* one FIFO: everything queued before is this stream's or earlier */
	LEAVE(cudaSuccess);
}

/* Lock held: the process's event table, a shared memfd other processes map through
 * /proc/<pid>/fd when they open an event's IPC handle. */
static int
ev_tab_init(void)
{
	void *p;
	int fd;

	if (ev_tab)
		return 0;
	fd = memfd_create("kvt-shim-events", 0);
	if (fd < 0)
		return -1;
	if (ftruncate(fd, EV_SLOTS * sizeof(struct ev_slot)) < 0) {
		close(fd);
		return -1;
	}
	p = mmap(NULL, EV_SLOTS * sizeof(struct ev_slot), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		 0);
	if (p == MAP_FAILED) {
		close(fd);
		return -1;
	}
	ev_tab = p;
	ev_tab_fd = fd;
	return 0;
}

/* Lock held: map another process's event table (kept for the life of this process). */
static struct ev_slot *
ev_tab_remote(int pid, int fd)
{
	static struct {
		int pid, fd;
		struct ev_slot *tab;
	} maps[16];
	static unsigned n_maps;
	char path[64];
	void *p;
	int f;

	for (unsigned i = 0; i < n_maps; i++)
		if (maps[i].pid == pid && maps[i].fd == fd)
			return maps[i].tab;
	if (n_maps == 16)
		return NULL;
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
	f = open(path, O_RDWR | O_CLOEXEC);
	if (f < 0)
		return NULL;
	p = mmap(NULL, EV_SLOTS * sizeof(struct ev_slot), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
	close(f);
	if (p == MAP_FAILED)
		return NULL;
	maps[n_maps].pid = pid;
	maps[n_maps].fd = fd;
	maps[n_maps].tab = p;
	return maps[n_maps++].tab;
}

/* Lock held on entry and exit: a stream of this process waits for another process's event.
 * Its work would run after the recorded work; this process has nothing queued that could
 * overtake it, so the wait is done here, on the CPU, with the lock dropped. */
static int
ev_wait_remote(struct ipc_ev *e)
{
	uint64_t target;

	if (!e->slot)
		return -1;
	target = atomic_load(&e->slot->recorded);
	for (unsigned i = 0; atomic_load(&e->slot->completed) < target; i++) {
		if (kill(e->pid, 0) < 0 && errno == ESRCH)
			return 0; /* its context is gone with it, and its queued work */
		if (i == 300000)
			return -1; /* 30 s: a lost record, say so rather than hang the test */
		pthread_mutex_unlock(&lock);
		usleep(100);
		pthread_mutex_lock(&lock);
	}
	return 0;
}

SHIM_EXPORT cudaError_t
cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags)
{
	struct ipc_ev *e = (struct ipc_ev *)ev;

	ENTER("");
	if (!e)
		LEAVE(cudaErrorInvalidResourceHandle);
	if (e->pid != getpid() && ev_wait_remote(e) < 0)
		LEAVE(cudaErrorLaunchTimeout);
	LEAVE(cudaSuccess); /* in this process: one FIFO, the recorded work is ahead already */
}

SHIM_EXPORT cudaError_t
cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags)
{
	struct ipc_ev *e;
	unsigned idx;

	ENTER("flags=%u", flags);
	if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
		LEAVE(cudaErrorInvalidValue); /* as CUDA requires */
	if (ev_tab_init() < 0)
		LEAVE(cudaErrorMemoryAllocation);
	for (idx = 0; idx < EV_SLOTS && ev_used[idx]; idx++)
		;
	if (idx == EV_SLOTS)
		LEAVE(cudaErrorMemoryAllocation);
	e = calloc(1, sizeof(*e));
	if (!e)
		LEAVE(cudaErrorMemoryAllocation);
	ev_used[idx] = 1;
	e->magic = MAGIC;
	e->pid = getpid();
	e->interprocess = !!(flags & cudaEventInterprocess);
	e->serial = next_serial++;
	e->tab_fd = ev_tab_fd;
	e->idx = idx;
	e->slot = &ev_tab[idx];
	atomic_store(&e->slot->recorded, 0);
	atomic_store(&e->slot->completed, 0);
	*ev = (cudaEvent_t)e;
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
	struct ipc_ev *e = (struct ipc_ev *)ev;
	uint64_t rec;

	ENTER("");
	if (!e || e->pid != getpid())
		LEAVE(cudaErrorInvalidResourceHandle);
	rec = atomic_fetch_add(&e->slot->recorded, 1) + 1;
	if (!wq_head) {
		atomic_store(&e->slot->completed, rec); /* nothing ahead of it */
	} else {
		struct work *w = calloc(1, sizeof(*w));

		if (!w)
			LEAVE(cudaErrorMemoryAllocation);
		w->kind = W_RECORD;
		w->slot = e->slot;
		w->rec = rec;
		work_push(w);
	}
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaEventSynchronize(cudaEvent_t ev)
{
	struct ipc_ev *e = (struct ipc_ev *)ev;

	ENTER("");
	if (!e)
		LEAVE(cudaErrorInvalidResourceHandle);
	if (e->pid != getpid())
		LEAVE(ev_wait_remote(e) < 0 ? cudaErrorLaunchTimeout : cudaSuccess);
	drain_until(e->slot, atomic_load(&e->slot->recorded));
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaEventQuery(cudaEvent_t ev)
{
	struct ipc_ev *e = (struct ipc_ev *)ev;

	ENTER("");
	if (!e || !e->slot)
		LEAVE(cudaErrorInvalidResourceHandle);
	if (atomic_load(&e->slot->completed) < atomic_load(&e->slot->recorded)) {
		/* Not an error: the runtime does not make it the last error either. */
		pthread_mutex_unlock(&lock);
		return cudaErrorNotReady;
	}
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaEventDestroy(cudaEvent_t ev)
{
	struct ipc_ev *e = (struct ipc_ev *)ev;

	ENTER("");
	if (e && e->pid == getpid() && e->slot == &ev_tab[e->idx])
		ev_used[e->idx] = 0;
	free(ev);
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t ev)
{
	struct ipc_ev *e = (struct ipc_ev *)ev;

	ENTER("");
	if (!e || !e->interprocess)
		LEAVE(cudaErrorInvalidResourceHandle);
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, e, IPC_EV_HANDLE_BYTES);
	LEAVE(cudaSuccess);
}

/* Lock held: an event opened from a handle, its slot in the owner's table. */
static struct ipc_ev *
ev_open(const char *reserved)
{
	struct ipc_ev *e = calloc(1, sizeof(*e));
	struct ev_slot *tab;

	if (!e)
		return NULL;
	memcpy(e, reserved, IPC_EV_HANDLE_BYTES);
	tab = e->pid == getpid() ? ev_tab : ev_tab_remote(e->pid, e->tab_fd);
	e->slot = tab && e->idx < EV_SLOTS ? &tab[e->idx] : NULL;
	return e;
}

SHIM_EXPORT cudaError_t
cudaIpcOpenEventHandle(cudaEvent_t *ev, cudaIpcEventHandle_t h)
{
	struct ipc_ev in, *e;

	ENTER("");
	memcpy(&in, h.reserved, IPC_EV_HANDLE_BYTES);
	if (in.magic != MAGIC || !in.interprocess)
		LEAVE(cudaErrorInvalidResourceHandle);
	e = ev_open(h.reserved);
	if (!e)
		LEAVE(cudaErrorMemoryAllocation);
	*ev = (cudaEvent_t)e;
	LEAVE(cudaSuccess);
}

/* ---- host memory ---------------------------------------------------------------------------- */

SHIM_EXPORT cudaError_t
cudaHostRegister(void *p, size_t len, unsigned flags)
{
	ENTER("p=%p len=%zu flags=%u", p, len, flags);
	if (!p || !len)
		LEAVE(cudaErrorInvalidValue);
	for (struct obj *o = objs; o; o = o->next)
		if (o->kind == OBJ_REGISTERED && (uint8_t *)p < o->p + o->len &&
		    o->p < (uint8_t *)p + len)
			LEAVE(cudaErrorHostMemoryAlreadyRegistered);
	LEAVE(obj_add(OBJ_REGISTERED, p, len) ? cudaSuccess : cudaErrorMemoryAllocation);
}

SHIM_EXPORT cudaError_t
cudaHostUnregister(void *p)
{
	struct obj *o;

	ENTER("p=%p", p);
	o = obj_at(p, OBJ_REGISTERED);
	if (!o)
		LEAVE(cudaErrorHostMemoryNotRegistered);
	release_check("cudaHostUnregister", o->p, o->len);
	obj_del(o);
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaHostAlloc(void **ret, size_t len, unsigned flags)
{
	void *p;

	ENTER("len=%zu flags=%u", len, flags);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		LEAVE(cudaErrorMemoryAllocation);
	if (!obj_add(OBJ_HOSTALLOC, p, len)) {
		munmap(p, len);
		LEAVE(cudaErrorMemoryAllocation);
	}
	*ret = p;
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaFreeHost(void *p)
{
	struct obj *o;

	ENTER("p=%p", p);
	o = obj_at(p, OBJ_HOSTALLOC);
	if (!o)
		LEAVE(cudaErrorInvalidValue);
	release_check("cudaFreeHost", o->p, o->len);
	munmap(o->p, o->len);
	obj_del(o);
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaHostGetDevicePointer(void **dptr, void *p, unsigned flags)
{
	ENTER("p=%p", p);
	if (!obj_find(p, 1, 1u << OBJ_REGISTERED | 1u << OBJ_HOSTALLOC))
		LEAVE(cudaErrorInvalidValue);
	*dptr = p;
	LEAVE(cudaSuccess);
}

/* ---- device memory and IPC ------------------------------------------------------------------ */

SHIM_EXPORT cudaError_t
cudaMalloc(void **ret, size_t len)
{
	struct obj *o;
	void *p;
	int fd;

	ENTER("len=%zu", len);
	fd = memfd_create("kvt-shim-devmem", 0); /* inherited on purpose: see the IPC handle */
	if (fd < 0 || ftruncate(fd, (off_t)len) < 0) {
		if (fd >= 0)
			close(fd);
		LEAVE(cudaErrorMemoryAllocation);
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		LEAVE(cudaErrorMemoryAllocation);
	}
	o = obj_add(OBJ_DEVMEM, p, len);
	if (!o) {
		munmap(p, len);
		close(fd);
		LEAVE(cudaErrorMemoryAllocation);
	}
	o->fd = fd;
	o->pid = getpid();
	o->serial = next_serial++;
	o->dev = cur_device;
	*ret = p;
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaFree(void *p)
{
	struct obj *o;

	ENTER("p=%p", p);
	if (!p)
		LEAVE(cudaSuccess);
	o = obj_at(p, OBJ_DEVMEM);
	if (!o)
		LEAVE(cudaErrorInvalidDevicePointer);
	drain_until(NULL, 0); /* cudaFree synchronizes the device */
	munmap(o->p, o->len);
	close(o->fd);
	obj_del(o);
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
	struct obj *o;

	ENTER("p=%p", p);
	memset(a, 0, sizeof(*a));
	o = obj_find(p, 1, 1u << OBJ_DEVMEM | 1u << OBJ_IPCMAP);
	if (o) {
		a->type = cudaMemoryTypeDevice;
		a->device = o->dev;
		a->devicePointer = (void *)p;
	} else if (obj_find(p, 1, 1u << OBJ_REGISTERED | 1u << OBJ_HOSTALLOC)) {
		a->type = cudaMemoryTypeHost;
		a->hostPointer = a->devicePointer = (void *)p;
	} else {
		a->type = cudaMemoryTypeUnregistered;
	}
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
	struct obj *o;
	struct ipc_mem m;

	ENTER("p=%p", p);
	o = obj_find(p, 1, 1u << OBJ_DEVMEM);
	if (!o)
		LEAVE(cudaErrorInvalidDevicePointer);
	m = (struct ipc_mem){MAGIC, o->pid, o->fd, o->len, o->serial};
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &m, sizeof(m));
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaIpcOpenMemHandle(void **ret, cudaIpcMemHandle_t h, unsigned flags)
{
	struct ipc_mem m;
	struct obj *o;
	char path[64];
	struct stat st;
	void *p;
	int fd;

	memcpy(&m, h.reserved, sizeof(m));
	ENTER("id=%d.%llu", (int)m.pid, (unsigned long long)m.serial);
	if (m.magic != MAGIC)
		LEAVE(cudaErrorInvalidResourceHandle);
	if (m.pid == getpid())
		LEAVE(
		    cudaErrorDeviceUninitialized); /* CUDA refuses handles of the calling process */
	for (o = objs; o; o = o->next)
		if (o->kind == OBJ_IPCMAP && o->pid == m.pid && o->serial == m.serial)
			LEAVE(cudaErrorAlreadyMapped); /* opened twice in one process */
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)m.pid, (int)m.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		LEAVE(cudaErrorInvalidResourceHandle);
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != m.size) {
		close(fd);
		LEAVE(cudaErrorInvalidResourceHandle);
	}
	p = mmap(NULL, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		LEAVE(cudaErrorMapBufferObjectFailed);
	o = obj_add(OBJ_IPCMAP, p, m.size);
	if (!o) {
		munmap(p, m.size);
		LEAVE(cudaErrorMemoryAllocation);
	}
	o->pid = m.pid;
	o->serial = m.serial;
	*ret = p;
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaIpcCloseMemHandle(void *p)
{
	struct obj *o;

	pthread_mutex_lock(&lock);
	o = obj_at(p, OBJ_IPCMAP);
	pthread_mutex_unlock(&lock);
	ENTER("id=%d.%llu", o ? o->pid : -1, o ? (unsigned long long)o->serial : 0ull);
	o = obj_at(p, OBJ_IPCMAP);
	if (!o)
		LEAVE(cudaErrorInvalidValue);
	release_check("cudaIpcCloseMemHandle", o->p, o->len);
	munmap(o->p, o->len);
	obj_del(o);
	LEAVE(cudaSuccess);
}

/* cuMemGetAddressRange as cudaGetDriverEntryPointByVersion hands it out. */
static CUresult
shim_get_range(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
	struct obj *o;

	pthread_mutex_lock(&lock);
	o = obj_find((void *)(uintptr_t)dptr, 1, 1u << OBJ_DEVMEM | 1u << OBJ_IPCMAP);
	if (o) {
		*base = (CUdeviceptr)(uintptr_t)o->p;
		*size = o->len;
	}
	log_line("cuMemGetAddressRange %p%s", (void *)(uintptr_t)dptr, o ? "" : " -> not found");
	pthread_mutex_unlock(&lock);
	return o ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

SHIM_EXPORT cudaError_t
cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned version,
				 unsigned long long flags,
				 enum cudaDriverEntryPointQueryResult *status)
{
	ENTER("%s", symbol);
	if (strcmp(symbol, "cuMemGetAddressRange")) {
		if (status)
			*status = cudaDriverEntryPointSymbolNotFound;
		*fn = NULL;
		LEAVE(cudaSuccess);
	}
	*fn = (void *)shim_get_range;
	if (status)
		*status = cudaDriverEntryPointSuccess;
	LEAVE(cudaSuccess);
}

/* ---- copies and the row kernel ------------------------------------------------------------ */

/* Any emulated memory: device, IPC-mapped, pinned host. Unpinned host memory is fine only for
 * cudaMemcpyAsync, as with CUDA. */
static int
mem_known(const void *p, size_t len)
{
	return obj_find(p, len, 0xf) != NULL;
}

static int
overlaps(const void *a, size_t na, const void *b, size_t nb)
{
	return (const uint8_t *)a < (const uint8_t *)b + nb &&
	       (const uint8_t *)b < (const uint8_t *)a + na;
}

/* Lock held: does queued work still read or write [p, p+len)? */
static int
queued_touches(const void *p, size_t len)
{
	for (struct work *w = wq_head; w; w = w->next) {
		if (w->kind == W_COPY &&
		    (overlaps(w->dst, w->n, p, len) || (!w->own && overlaps(w->src, w->n, p, len))))
			return 1;
		if (w->kind != W_ROWS)
			continue;
		if (overlaps(w->desc, w->nrows * sizeof(*w->desc), p, len))
			return 1;
		for (unsigned i = 0; i < w->nrows; i++)
			if (overlaps((void *)(uintptr_t)w->desc[i].dst,
				     (w->desc[i].scale ? 2 : 1) * w->desc[i].len, p, len) ||
			    overlaps((void *)(uintptr_t)w->desc[i].src, w->desc[i].len, p, len))
				return 1;
	}
	return 0;
}

/* Lock held: memory is being released; a queued copy that still uses it is a hazard (counted
 * for kvt_shim_hazards()), and the queue is drained so the emulation never touches it after. */
static void
release_check(const char *what, const void *p, size_t len)
{
	if (!queued_touches(p, len))
		return;
	hazards++;
	log_line("  hazard: %s %p+%zu released while a queued copy uses it", what, p, len);
	drain_until(NULL, 0);
}

/* A row of kvt_rows_copy touches only memory a kernel can: device or pinned, mapped host. */
static int
row_ok(const struct kvt_row_desc *d)
{
	const void *src = (const void *)(uintptr_t)d->src;
	void *dst = (void *)(uintptr_t)d->dst;

	if (!d->scale)
		return mem_known(dst, d->len) && mem_known(src, d->len);
	return d->group && mem_known(src, d->len) && mem_known(dst, 2 * d->len) &&
	       mem_known((const void *)(uintptr_t)d->scale,
			 (d->len + d->group - 1) / d->group * sizeof(float));
}

/* The row kernel's effect: a copy, or an int8 row dequantized (f32 product, nearest even). */
static void
row_run(const struct kvt_row_desc *d)
{
	const int8_t *s = (const int8_t *)(uintptr_t)d->src;
	const float *sc = (const float *)(uintptr_t)d->scale;
	uint8_t *t = (uint8_t *)(uintptr_t)d->dst;

	if (!d->scale) {
		memmove(t, s, d->len);
		return;
	}
	for (uint64_t e = 0; e < d->len; e++) {
		float x = (float)s[e] * sc[e / d->group];
		uint16_t h;

		if (d->out == KVT_ROW_OUT_BF16) {
			uint32_t u;

			memcpy(&u, &x, 4);
			h = (u & 0x7fffffffu) > 0x7f800000u
				? (uint16_t)((u >> 16) | 0x40u)
				: (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
		} else {
			_Float16 f = (_Float16)x;

			memcpy(&h, &f, 2);
		}
		memcpy(t + 2 * e, &h, 2);
	}
}

static void
work_run_one(void)
{
	struct work *w = wq_head;

	wq_head = w->next;
	if (!wq_head)
		wq_tail = NULL;
	switch (w->kind) {
	case W_COPY:
		memmove(w->dst, w->own ? w->own : w->src, w->n);
		free(w->own);
		break;
	case W_ROWS:
		/* The descriptors are read now, as the device reads them when the kernel runs. */
		for (unsigned i = 0; i < w->nrows; i++) {
			struct kvt_row_desc d = w->desc[i];

			if (!row_ok(&d)) {
				last_error = cudaErrorIllegalAddress; /* sticky, as on a device */
				log_line("  kvt_rows_copy row %u: illegal address when run", i);
				continue;
			}
			row_run(&d);
		}
		break;
	case W_RECORD:
		atomic_store(&w->slot->completed, w->rec);
		break;
	case W_FN:
		w->fn(w->arg);
		break;
	}
	free(w);
}

SHIM_EXPORT cudaError_t
cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
	struct work *w;
	int dst_known, src_known;

	ENTER("dst=%p src=%p n=%zu", dst, src, n);
	dst_known = mem_known(dst, n);
	src_known = mem_known(src, n);
	if (!dst_known && !src_known)
		LEAVE(cudaErrorInvalidValue); /* host to host through a stream: not our use */
	w = calloc(1, sizeof(*w));
	if (!w)
		LEAVE(cudaErrorMemoryAllocation);
	w->kind = W_COPY;
	w->dst = dst;
	w->src = src;
	w->n = n;
	if (!src_known) {
		/* From pageable memory CUDA stages the source before returning. */
		w->own = malloc(n);
		if (!w->own) {
			free(w);
			LEAVE(cudaErrorMemoryAllocation);
		}
		memcpy(w->own, src, n);
	}
	work_push(w);
	if (!dst_known)
		drain_until(NULL,
			    0); /* to pageable memory the call returns when the copy is done */
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaLibraryLoadData(cudaLibrary_t *lib, const void *code, enum cudaJitOption *jo, void **jov,
		    unsigned njo, enum cudaLibraryOption *lo, void **lov, unsigned nlo)
{
	ENTER("");
	if (!code)
		LEAVE(cudaErrorInvalidValue);
	*lib = (cudaLibrary_t)&library_token;
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaLibraryGetKernel(cudaKernel_t *k, cudaLibrary_t lib, const char *name)
{
	ENTER("%s", name);
	if (lib != (cudaLibrary_t)&library_token)
		LEAVE(cudaErrorInvalidResourceHandle);
	for (unsigned i = 0; i < sizeof(kernel_names) / sizeof(kernel_names[0]); i++)
		if (!strcmp(name, kernel_names[i])) {
			*k = (cudaKernel_t)&kernel_tokens[i];
			LEAVE(cudaSuccess);
		}
	LEAVE(cudaErrorSymbolNotFound);
}

SHIM_EXPORT cudaError_t
cudaLibraryUnload(cudaLibrary_t lib)
{
	ENTER("");
	LEAVE(lib == (cudaLibrary_t)&library_token ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

/* ---- gpu-decode's kernels and cuBLAS (kvtier-bench gpu-decode on the shim) ---------------
 *
 * Host equivalents, queued in stream order like every launch: the same arguments, the same
 * layouts (gpu_decode_kernels.h), f16 storage with f32 math, one split per grid y as the kernel
 * does, so the combine step runs too. */

typedef _Float16 f16;

static void
attn_partial_run(const void *arg)
{
	const uint64_t *a = arg;
	const f16 *q = (const f16 *)(uintptr_t)a[0], *k0 = (const f16 *)(uintptr_t)a[1],
		  *v0 = (const f16 *)(uintptr_t)a[2], *ks = (const f16 *)(uintptr_t)a[4],
		  *vs = (const f16 *)(uintptr_t)a[5];
	uint32_t n0 = (uint32_t)a[3], ns = (uint32_t)a[6], kvh = (uint32_t)a[7],
		 group = (uint32_t)a[8], hd = (uint32_t)a[9], chunk = (uint32_t)a[11],
		 nsplit = (uint32_t)a[13];
	float scale, *part = (float *)(uintptr_t)a[12];
	uint32_t n = n0 + ns;

	memcpy(&scale, &a[10], sizeof(scale));
	for (uint32_t h = 0; h < kvh; h++)
		for (uint32_t g = 0; g < group; g++)
			for (uint32_t sp = 0; sp < nsplit; sp++) {
				float *o =
				    part + ((uint64_t)(h * group + g) * nsplit + sp) * (hd + 2);
				const f16 *qq = q + (uint64_t)(h * group + g) * hd;
				float m = -INFINITY, sum = 0.f;

				for (uint32_t c = 0; c < hd; c++)
					o[2 + c] = 0.f;
				for (uint32_t p = sp * chunk; p < n && p < (sp + 1) * chunk; p++) {
					uint64_t off =
					    (uint64_t)(p < n0 ? p : p - n0) * kvh * hd + h * hd;
					const f16 *kr = (p < n0 ? k0 : ks) + off,
						  *vr = (p < n0 ? v0 : vs) + off;
					float x = 0.f, mn, ea, eb;

					for (uint32_t c = 0; c < hd; c++)
						x += (float)qq[c] * (float)kr[c];
					x *= scale;
					mn = x > m ? x : m;
					ea = expf(m - mn);
					eb = expf(x - mn);
					sum = sum * ea + eb;
					for (uint32_t c = 0; c < hd; c++)
						o[2 + c] = o[2 + c] * ea + eb * (float)vr[c];
					m = mn;
				}
				o[0] = m;
				o[1] = sum;
			}
}

static void
attn_combine_run(const void *arg)
{
	const uint64_t *a = arg;
	const float *part = (const float *)(uintptr_t)a[0];
	uint32_t nsplit = (uint32_t)a[1], hd = (uint32_t)a[2], qh = (uint32_t)a[4];
	f16 *out = (f16 *)(uintptr_t)a[3];

	for (uint32_t h = 0; h < qh; h++) {
		const float *p = part + (uint64_t)h * nsplit * (hd + 2);
		float M = -INFINITY, S = 0.f;

		for (uint32_t i = 0; i < nsplit; i++)
			M = p[i * (hd + 2)] > M ? p[i * (hd + 2)] : M;
		for (uint32_t i = 0; i < nsplit; i++)
			S += (p[i * (hd + 2)] == -INFINITY ? 0.f : expf(p[i * (hd + 2)] - M)) *
			     p[i * (hd + 2) + 1];
		for (uint32_t c = 0; c < hd; c++) {
			float A = 0.f;

			for (uint32_t i = 0; i < nsplit; i++)
				A += (p[i * (hd + 2)] == -INFINITY ? 0.f
								   : expf(p[i * (hd + 2)] - M)) *
				     p[i * (hd + 2) + 2 + c];
			out[(uint64_t)h * hd + c] = (f16)(S > 0.f ? A / S : 0.f);
		}
	}
}

static void
silu_mul_run(const void *arg)
{
	const uint64_t *a = arg;
	const f16 *gu = (const f16 *)(uintptr_t)a[0];
	uint32_t n = (uint32_t)a[1];
	f16 *out = (f16 *)(uintptr_t)a[2];

	for (uint32_t i = 0; i < n; i++) {
		float g = (float)gu[i], u = (float)gu[n + i];

		out[i] = (f16)(g / (1.f + expf(-g)) * u);
	}
}

static uint64_t
arg_ptr(void **args, int i)
{
	return (uint64_t)(uintptr_t) * (void **)args[i];
}

static uint64_t
arg_u32(void **args, int i)
{
	return *(const uint32_t *)args[i];
}

/* A gpu-decode kernel: queued with its arguments captured now, as a launch captures them. */
static cudaError_t
bench_kernel(const void *func, dim3 grid, dim3 block, void **args)
{
	struct work *w;
	int which = -1;

	for (int i = 1; i < 4; i++)
		if (func == (const void *)&kernel_tokens[i])
			which = i;
	if (which < 0)
		return cudaErrorInvalidDeviceFunction;
	pthread_mutex_lock(&lock);
	{
		cudaError_t e = enter("cudaLaunchKernel", "%s grid=%u,%u block=%u",
				      kernel_names[which], grid.x, grid.y, block.x);

		if (e) {
			last_error = e;
			pthread_mutex_unlock(&lock);
			return e;
		}
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		pthread_mutex_unlock(&lock);
		return cudaErrorMemoryAllocation;
	}
	w->kind = W_FN;
	if (which == 1) {
		float scale = *(const float *)args[10];

		for (int i = 0; i < 13; i++)
			w->arg[i] = (i == 0 || i == 1 || i == 2 || i == 4 || i == 5 || i == 12)
					? arg_ptr(args, i)
					: arg_u32(args, i);
		memcpy(&w->arg[10], &scale, sizeof(scale));
		w->arg[13] = grid.y;
		/* The grid is what the kernel covers: kv_heads blocks across. */
		if (grid.x != (unsigned)w->arg[7] || block.x != KVTB_ATTN_THREADS ||
		    w->arg[8] > KVTB_MAX_GROUP || w->arg[9] > KVTB_MAX_HD || w->arg[9] % 4) {
			free(w);
			last_error = cudaErrorInvalidValue;
			pthread_mutex_unlock(&lock);
			return cudaErrorInvalidValue;
		}
		w->fn = attn_partial_run;
	} else if (which == 2) {
		w->arg[0] = arg_ptr(args, 0);
		w->arg[1] = arg_u32(args, 1);
		w->arg[2] = arg_u32(args, 2);
		w->arg[3] = arg_ptr(args, 3);
		w->arg[4] = grid.x;
		w->fn = attn_combine_run;
	} else {
		w->arg[0] = arg_ptr(args, 0);
		w->arg[1] = arg_u32(args, 1);
		w->arg[2] = arg_ptr(args, 2);
		w->fn = silu_mul_run;
	}
	work_push(w);
	pthread_mutex_unlock(&lock);
	return cudaSuccess;
}

struct shim_blas {
	uint64_t magic;
	cudaStream_t stream;
};

SHIM_EXPORT cublasStatus_t
cublasCreate_v2(cublasHandle_t *ret)
{
	struct shim_blas *b = calloc(1, sizeof(*b));

	if (!b)
		return CUBLAS_STATUS_ALLOC_FAILED;
	b->magic = MAGIC;
	*ret = (cublasHandle_t)b;
	return CUBLAS_STATUS_SUCCESS;
}

SHIM_EXPORT cublasStatus_t
cublasDestroy_v2(cublasHandle_t h)
{
	free(h);
	return CUBLAS_STATUS_SUCCESS;
}

SHIM_EXPORT cublasStatus_t
cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
	((struct shim_blas *)h)->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}

static void
gemm_run(const void *arg)
{
	const uint64_t *a = arg;
	int ta = (int)a[0], m = (int)a[1], n = (int)a[2], k = (int)a[3], lda = (int)a[5],
	    ldb = (int)a[7], ldc = (int)a[9];
	const f16 *A = (const f16 *)(uintptr_t)a[4], *B = (const f16 *)(uintptr_t)a[6];
	f16 *C = (f16 *)(uintptr_t)a[8];
	float alpha, beta;

	memcpy(&alpha, &a[10], sizeof(alpha));
	memcpy(&beta, &a[11], sizeof(beta));
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			float x = 0.f;

			for (int l = 0; l < k; l++)
				x += (float)(ta ? A[l + (int64_t)i * lda]
						: A[i + (int64_t)l * lda]) *
				     (float)B[l + (int64_t)j * ldb];
			x *= alpha;
			if (beta != 0.f)
				x += beta * (float)C[i + (int64_t)j * ldc];
			C[i + (int64_t)j * ldc] = (f16)x;
		}
}

/* f16 in and out, f32 compute, op(B) = B: what gpu-decode asks for; anything else is refused. */
SHIM_EXPORT cublasStatus_t
cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
	     int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
	     cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
	     cublasComputeType_t ctype, cublasGemmAlgo_t algo)
{
	struct work *w;

	if (!h || ((struct shim_blas *)h)->magic != MAGIC)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (transb != CUBLAS_OP_N || (transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
	    Atype != CUDA_R_16F || Btype != CUDA_R_16F || Ctype != CUDA_R_16F ||
	    ctype != CUBLAS_COMPUTE_32F || m <= 0 || n <= 0 || k <= 0)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	pthread_mutex_lock(&lock);
	enter("cublasGemmEx", "m=%d n=%d k=%d", m, n, k);
	w = calloc(1, sizeof(*w));
	if (!w) {
		pthread_mutex_unlock(&lock);
		return CUBLAS_STATUS_ALLOC_FAILED;
	}
	w->kind = W_FN;
	w->fn = gemm_run;
	w->arg[0] = transa == CUBLAS_OP_T;
	w->arg[1] = (uint64_t)m;
	w->arg[2] = (uint64_t)n;
	w->arg[3] = (uint64_t)k;
	w->arg[4] = (uint64_t)(uintptr_t)A;
	w->arg[5] = (uint64_t)lda;
	w->arg[6] = (uint64_t)(uintptr_t)B;
	w->arg[7] = (uint64_t)ldb;
	w->arg[8] = (uint64_t)(uintptr_t)C;
	w->arg[9] = (uint64_t)ldc;
	memcpy(&w->arg[10], alpha, sizeof(float));
	memcpy(&w->arg[11], beta, sizeof(float));
	work_push(w);
	pthread_mutex_unlock(&lock);
	return CUBLAS_STATUS_SUCCESS;
}

/* ---- a few more runtime calls gpu-decode makes ---------------------------------------------- */

SHIM_EXPORT cudaError_t
cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	ENTER("flags=%u", flags);
	*s = rt_stream_new();
	LEAVE(*s ? cudaSuccess : cudaErrorMemoryAllocation);
}

SHIM_EXPORT cudaError_t
cudaDeviceSynchronize(void)
{
	ENTER("");
	drain_until(NULL, 0);
	LEAVE(cudaSuccess);
}

SHIM_EXPORT cudaError_t
cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, NULL);

	if (e == cudaSuccess) {
		pthread_mutex_lock(&lock);
		drain_until(NULL, 0); /* synchronous with the host, as cudaMemcpy is */
		pthread_mutex_unlock(&lock);
	}
	return e;
}

SHIM_EXPORT cudaError_t
cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s)
{
	const struct kvt_row_desc *d;
	struct work *w;
	unsigned n;

	if (func != (const void *)&kernel_token) {
		cudaError_t e = bench_kernel(func, grid, block, args);

		if (e != cudaErrorInvalidDeviceFunction)
			return e;
		ENTER("func=%p", func);
		LEAVE(cudaErrorInvalidDeviceFunction);
	}
	d = *(const struct kvt_row_desc **)args[0];
	n = *(const unsigned *)args[1];
	{
		unsigned q8 = 0;

		for (unsigned i = 0; i < n && d; i++)
			q8 += d[i].scale != 0;
		ENTER("kvt_rows_copy rows=%u grid=%u block=%u%s", n, grid.x, block.x,
		      q8 ? " int8" : "");
	}
	/* The descriptors are read through UVA: they must be pinned host memory. */
	if (!obj_find(d, n * sizeof(*d), 1u << OBJ_HOSTALLOC | 1u << OBJ_REGISTERED))
		LEAVE(cudaErrorIllegalAddress);
	/* A kernel can touch only device memory and pinned, mapped host memory: checked at the
	 * launch (a device would fault later; the test wants the error where it was made). */
	for (unsigned i = 0; i < n; i++)
		if (!row_ok(&d[i]))
			LEAVE(cudaErrorIllegalAddress);
	w = calloc(1, sizeof(*w));
	if (!w)
		LEAVE(cudaErrorMemoryAllocation);
	w->kind = W_ROWS;
	w->desc = d;
	w->nrows = n;
	work_push(w);
	LEAVE(cudaSuccess);
}

/* ---- driver entry points ---------------------------------------------------------------------
 *
 * What libkvtier calls, through dlopen of this library (KVTIER_LIBCUDA), by the versioned names
 * the driver exports. They share the emulated objects above, as the real driver's state is the
 * runtime's: a cudaMalloc pointer is known to cuMemGetAddressRange, a cuMemAlloc handle opens
 * with cudaIpcOpenMemHandle in kvtierd. Modelled as the driver does it: nothing before cuInit;
 * memory, IPC and event calls need a current context (a thread-local stack of the devices'
 * primary contexts); the plural cuPointerGetAttributes answers CUDA_SUCCESS with default values
 * for a pointer it does not know; a stream belongs to a context, and NULL, CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD name the current context's. Failures are injected with kvt_shim_fail()
 * by symbol name ("cuMemAlloc_v2") and a CUresult.
 */

#define SHIM_MAX_DEVICES 16

struct shim_ctx {
	uint64_t magic;
	int dev;
	unsigned refs;
};

struct shim_stream {
	struct shim_stream *next;
	struct shim_ctx *ctx;
};

static int drv_inited;
static struct shim_stream *streams; /* created by cuStreamCreate */
static struct shim_ctx primaries[SHIM_MAX_DEVICES];
static _Thread_local struct shim_ctx *ctx_stack[16];
static _Thread_local unsigned ctx_depth;

static const char *
cu_name(CUresult e)
{
	switch (e) {
	case CUDA_SUCCESS:
		return "CUDA_SUCCESS";
	case CUDA_ERROR_INVALID_VALUE:
		return "CUDA_ERROR_INVALID_VALUE";
	case CUDA_ERROR_OUT_OF_MEMORY:
		return "CUDA_ERROR_OUT_OF_MEMORY";
	case CUDA_ERROR_NOT_INITIALIZED:
		return "CUDA_ERROR_NOT_INITIALIZED";
	case CUDA_ERROR_DEINITIALIZED:
		return "CUDA_ERROR_DEINITIALIZED";
	case CUDA_ERROR_STUB_LIBRARY:
		return "CUDA_ERROR_STUB_LIBRARY";
	case CUDA_ERROR_DEVICE_UNAVAILABLE:
		return "CUDA_ERROR_DEVICE_UNAVAILABLE";
	case CUDA_ERROR_NO_DEVICE:
		return "CUDA_ERROR_NO_DEVICE";
	case CUDA_ERROR_INVALID_DEVICE:
		return "CUDA_ERROR_INVALID_DEVICE";
	case CUDA_ERROR_INVALID_CONTEXT:
		return "CUDA_ERROR_INVALID_CONTEXT";
	case CUDA_ERROR_INVALID_HANDLE:
		return "CUDA_ERROR_INVALID_HANDLE";
	case CUDA_ERROR_NOT_FOUND:
		return "CUDA_ERROR_NOT_FOUND";
	case CUDA_ERROR_ILLEGAL_ADDRESS:
		return "CUDA_ERROR_ILLEGAL_ADDRESS";
	case CUDA_ERROR_LAUNCH_TIMEOUT:
		return "CUDA_ERROR_LAUNCH_TIMEOUT";
	case CUDA_ERROR_CONTEXT_IS_DESTROYED:
		return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
	case CUDA_ERROR_NOT_PERMITTED:
		return "CUDA_ERROR_NOT_PERMITTED";
	case CUDA_ERROR_NOT_SUPPORTED:
		return "CUDA_ERROR_NOT_SUPPORTED";
	case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
		return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
	case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
		return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
	case CUDA_ERROR_UNKNOWN:
		return "CUDA_ERROR_UNKNOWN";
	default:
		return NULL;
	}
}

/* Count and log a driver call; its armed failure (or CUDA_SUCCESS). Lock held. */
static CUresult
drv_enter(const char *fn, const char *fmt, ...)
{
	struct counter *c = counter_of(fn);
	CUresult err = CUDA_SUCCESS;
	char args[160] = "";
	va_list ap;

	c->n++;
	for (unsigned i = 0; i < n_arms; i++)
		if (!strcmp(arms[i].fn, fn) && --arms[i].k == 0) {
			err = (CUresult)arms[i].err;
			arms[i] = arms[--n_arms];
			break;
		}
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	if (err)
		log_line("%s %s -> %s (injected)", fn, args, cu_name(err) ? cu_name(err) : "?");
	else
		log_line("%s %s", fn, args);
	if (!err && !drv_inited && strcmp(fn, "cuInit"))
		err = CUDA_ERROR_NOT_INITIALIZED;
	return err;
}

#define DENTER(...)                                                                                \
	do {                                                                                       \
		CUresult e_;                                                                       \
		pthread_mutex_lock(&lock);                                                         \
		e_ = drv_enter(__func__, __VA_ARGS__);                                             \
		if (e_) {                                                                          \
			pthread_mutex_unlock(&lock);                                               \
			return e_;                                                                 \
		}                                                                                  \
	} while (0)
#define DLEAVE(e)                                                                                  \
	do {                                                                                       \
		CUresult e2_ = (e);                                                                \
		if (e2_)                                                                           \
			log_line("  -> %s", cu_name(e2_));                                         \
		pthread_mutex_unlock(&lock);                                                       \
		return e2_;                                                                        \
	} while (0)
#define NEED_CTX()                                                                                 \
	do {                                                                                       \
		if (!ctx_depth)                                                                    \
			DLEAVE(CUDA_ERROR_INVALID_CONTEXT);                                        \
	} while (0)

static struct shim_ctx *
ctx_valid(CUcontext c)
{
	struct shim_ctx *x = (struct shim_ctx *)c;

	return x && x >= primaries && x < primaries + SHIM_MAX_DEVICES && x->magic == MAGIC &&
		       x->refs
		   ? x
		   : NULL;
}

/* The context of @s, or NULL: a stream of ours, or the current context's default streams. */
static struct shim_ctx *
stream_ctx(CUstream s)
{
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
		return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
	for (struct shim_stream *x = streams; x; x = x->next)
		if (x == (struct shim_stream *)s)
			return x->ctx;
	return NULL;
}

static struct ipc_ev *
event_valid(CUevent ev)
{
	struct ipc_ev *e = (struct ipc_ev *)ev;

	return e && e->magic == MAGIC ? e : NULL;
}

SHIM_EXPORT CUresult
cuGetErrorName(CUresult e, const char **s)
{
	*s = cu_name(e);
	return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SHIM_EXPORT CUresult
cuGetErrorString(CUresult e, const char **s)
{
	*s = cu_name(e) ? "injected or emulated failure (kvt cuda shim)" : NULL;
	if (e == CUDA_SUCCESS)
		*s = "no error";
	return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SHIM_EXPORT CUresult
cuInit(unsigned flags)
{
	DENTER("%u", flags);
	if (flags)
		DLEAVE(CUDA_ERROR_INVALID_VALUE);
	if (n_devices <= 0)
		DLEAVE(CUDA_ERROR_NO_DEVICE);
	drv_inited = 1;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuDeviceGet(CUdevice *d, int ordinal)
{
	DENTER("%d", ordinal);
	if (ordinal < 0 || ordinal >= n_devices || ordinal >= SHIM_MAX_DEVICES)
		DLEAVE(CUDA_ERROR_INVALID_DEVICE);
	*d = ordinal;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice d)
{
	char u[32];

	DENTER("%d", d);
	if (d < 0 || d >= n_devices)
		DLEAVE(CUDA_ERROR_INVALID_DEVICE);
	snprintf(u, sizeof(u), "KVTSHIMGPU%06u", (unsigned)d % 1000000); /* as the runtime's */
	memcpy(uuid->bytes, u, 16);
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuDevicePrimaryCtxRetain(CUcontext *ret, CUdevice d)
{
	DENTER("%d", d);
	if (d < 0 || d >= n_devices || d >= SHIM_MAX_DEVICES)
		DLEAVE(CUDA_ERROR_INVALID_DEVICE);
	primaries[d].magic = MAGIC;
	primaries[d].dev = d;
	primaries[d].refs++;
	*ret = (CUcontext)&primaries[d];
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	DENTER("%d", d);
	if (d < 0 || d >= n_devices || d >= SHIM_MAX_DEVICES)
		DLEAVE(CUDA_ERROR_INVALID_DEVICE);
	if (!primaries[d].refs)
		DLEAVE(CUDA_ERROR_INVALID_CONTEXT);
	primaries[d].refs--;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuCtxPushCurrent_v2(CUcontext c)
{
	struct shim_ctx *x;

	DENTER("%p", (void *)c);
	x = ctx_valid(c);
	if (!x)
		DLEAVE(CUDA_ERROR_INVALID_CONTEXT);
	if (ctx_depth == sizeof(ctx_stack) / sizeof(ctx_stack[0]))
		DLEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	ctx_stack[ctx_depth++] = x;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuCtxPopCurrent_v2(CUcontext *ret)
{
	DENTER("");
	if (!ctx_depth)
		DLEAVE(CUDA_ERROR_INVALID_CONTEXT);
	ctx_depth--;
	if (ret)
		*ret = (CUcontext)ctx_stack[ctx_depth];
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuCtxGetDevice(CUdevice *d)
{
	DENTER("");
	NEED_CTX();
	*d = ctx_stack[ctx_depth - 1]->dev;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuPointerGetAttributes(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
	struct obj *o;
	int dev = 0;

	DENTER("n=%u p=%p", n, (void *)(uintptr_t)p);
	o = obj_find((void *)(uintptr_t)p, 1, 0xf);
	if (o && o->kind == OBJ_DEVMEM)
		dev = o->dev;
	for (unsigned i = 0; i < n; i++) {
		int dm = o && (o->kind == OBJ_DEVMEM || o->kind == OBJ_IPCMAP);

		switch (attrs[i]) {
		case CU_POINTER_ATTRIBUTE_CONTEXT:
			*(CUcontext *)data[i] =
			    dm && primaries[dev].refs ? (CUcontext)&primaries[dev] : NULL;
			break;
		case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
			*(unsigned *)data[i] = !o   ? 0
					       : dm ? CU_MEMORYTYPE_DEVICE
						    : CU_MEMORYTYPE_HOST;
			break;
		case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
			*(int *)data[i] = o ? dev : -2;
			break;
		default:
			DLEAVE(CUDA_ERROR_INVALID_VALUE);
		}
	}
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	struct obj *o;

	DENTER("%p", (void *)(uintptr_t)p);
	NEED_CTX();
	o = obj_find((void *)(uintptr_t)p, 1, 1u << OBJ_DEVMEM | 1u << OBJ_IPCMAP);
	if (!o)
		DLEAVE(CUDA_ERROR_NOT_FOUND);
	if (base)
		*base = (CUdeviceptr)(uintptr_t)o->p;
	if (size)
		*size = o->len;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuMemAlloc_v2(CUdeviceptr *ret, size_t len)
{
	struct obj *o;
	void *p;
	int fd;

	DENTER("len=%zu", len);
	NEED_CTX();
	if (!len)
		DLEAVE(CUDA_ERROR_INVALID_VALUE);
	fd = memfd_create("kvt-shim-devmem", 0); /* kept open: see the IPC handle */
	if (fd < 0 || ftruncate(fd, (off_t)len) < 0) {
		if (fd >= 0)
			close(fd);
		DLEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		DLEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	}
	o = obj_add(OBJ_DEVMEM, p, len);
	if (!o) {
		munmap(p, len);
		close(fd);
		DLEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	}
	o->fd = fd;
	o->pid = getpid();
	o->serial = next_serial++;
	o->dev = ctx_stack[ctx_depth - 1]->dev;
	*ret = (CUdeviceptr)(uintptr_t)p;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuMemFree_v2(CUdeviceptr p)
{
	struct obj *o;

	DENTER("%p", (void *)(uintptr_t)p);
	NEED_CTX();
	o = obj_at((void *)(uintptr_t)p, OBJ_DEVMEM);
	if (!o)
		DLEAVE(CUDA_ERROR_INVALID_VALUE);
	drain_until(NULL, 0); /* cuMemFree synchronizes the device */
	munmap(o->p, o->len);
	close(o->fd);
	obj_del(o);
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	struct ipc_mem m;
	struct obj *o;

	DENTER("%p", (void *)(uintptr_t)p);
	NEED_CTX();
	o = obj_find((void *)(uintptr_t)p, 1, 1u << OBJ_DEVMEM);
	if (!o)
		DLEAVE(CUDA_ERROR_INVALID_VALUE);
	m = (struct ipc_mem){MAGIC, o->pid, o->fd, o->len, o->serial};
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &m, sizeof(m));
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuIpcOpenEventHandle(CUevent *ret, CUipcEventHandle h)
{
	struct ipc_ev in, *e;

	memcpy(&in, h.reserved, IPC_EV_HANDLE_BYTES);
	DENTER("id=%d.%llu", (int)in.pid, (unsigned long long)in.serial);
	NEED_CTX();
	if (in.magic != MAGIC || !in.interprocess)
		DLEAVE(CUDA_ERROR_INVALID_HANDLE);
	e = ev_open(h.reserved);
	if (!e)
		DLEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	*ret = (CUevent)e;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuEventDestroy_v2(CUevent ev)
{
	struct ipc_ev *e = event_valid(ev);

	DENTER("id=%d.%llu", e ? (int)e->pid : -1, e ? (unsigned long long)e->serial : 0ull);
	if (!e)
		DLEAVE(CUDA_ERROR_INVALID_HANDLE);
	e->magic = 0;
	free(e);
	DLEAVE(CUDA_SUCCESS);
}

/* Lock held. */
static void *
rt_stream_new(void)
{
	struct shim_stream *x = calloc(1, sizeof(*x));
	int d = cur_device < SHIM_MAX_DEVICES ? cur_device : 0;

	if (!x)
		return NULL;
	if (!primaries[d].refs) { /* the runtime retains the primary context at first use */
		primaries[d].magic = MAGIC;
		primaries[d].dev = d;
		primaries[d].refs = 1;
	}
	x->ctx = &primaries[d];
	x->next = streams;
	streams = x;
	return x;
}

/* Lock held. */
static void
rt_stream_free(void *s)
{
	for (struct shim_stream **pp = &streams; *pp; pp = &(*pp)->next)
		if (*pp == (struct shim_stream *)s) {
			*pp = (*pp)->next;
			free(s);
			return;
		}
}

SHIM_EXPORT CUresult
cuStreamCreate(CUstream *ret, unsigned flags)
{
	struct shim_stream *x;

	DENTER("flags=%u", flags);
	NEED_CTX();
	x = calloc(1, sizeof(*x));
	if (!x)
		DLEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	x->ctx = ctx_stack[ctx_depth - 1];
	x->next = streams;
	streams = x;
	*ret = (CUstream)x;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuStreamDestroy_v2(CUstream s)
{
	DENTER("%p", (void *)s);
	for (struct shim_stream **pp = &streams; *pp; pp = &(*pp)->next)
		if (*pp == (struct shim_stream *)s) {
			struct shim_stream *x = *pp;

			*pp = x->next;
			free(x);
			DLEAVE(CUDA_SUCCESS);
		}
	DLEAVE(CUDA_ERROR_INVALID_HANDLE);
}

SHIM_EXPORT CUresult
cuStreamGetCtx(CUstream s, CUcontext *ret)
{
	struct shim_ctx *x;

	DENTER("%p", (void *)s);
	x = stream_ctx(s);
	if (!x)
		DLEAVE(s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD
			   ? CUDA_ERROR_INVALID_HANDLE
			   : CUDA_ERROR_INVALID_CONTEXT);
	*ret = (CUcontext)x;
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT CUresult
cuStreamWaitEvent(CUstream s, CUevent ev, unsigned flags)
{
	struct ipc_ev *e = event_valid(ev);
	struct shim_ctx *x;

	DENTER("stream=%p ev=%d.%llu flags=%u", (void *)s, e ? (int)e->pid : -1,
	       e ? (unsigned long long)e->serial : 0ull, flags);
	x = stream_ctx(s);
	if (!x)
		DLEAVE(s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD
			   ? CUDA_ERROR_INVALID_HANDLE
			   : CUDA_ERROR_INVALID_CONTEXT);
	if (!e)
		DLEAVE(CUDA_ERROR_INVALID_HANDLE);
	if (flags & ~1u) /* CU_EVENT_WAIT_DEFAULT, CU_EVENT_WAIT_EXTERNAL */
		DLEAVE(CUDA_ERROR_INVALID_VALUE);
	/* The caller's stream has no queued work in the shim: waiting here is waiting before
	 * anything the caller queues next. */
	if (e->pid != getpid() && ev_wait_remote(e) < 0)
		DLEAVE(CUDA_ERROR_LAUNCH_TIMEOUT);
	if (e->pid == getpid() && e->slot)
		drain_until(e->slot, atomic_load(&e->slot->recorded));
	DLEAVE(CUDA_SUCCESS);
}

SHIM_EXPORT int
kvt_shim_event_id(void *ev, int *ret_pid, unsigned long long *ret_serial)
{
	struct ipc_ev *e = event_valid(ev);

	if (!e)
		return -1;
	*ret_pid = e->pid;
	*ret_serial = e->serial;
	return 0;
}

SHIM_EXPORT unsigned
kvt_shim_ctx_depth(void)
{
	return ctx_depth;
}
