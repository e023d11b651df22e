/* SPDX-License-Identifier: MIT */
/*
 * check_cuda_dev - the CUDA backend of the device layer against the fake CUDA runtime
 * (cuda_shim.h): backend choice, chunked pinning and its unwinding, IPC imports opened and
 * closed exactly once (also across a client killed with SIGKILL), batch copies as one launch per
 * batch with the bytes checked, events, and every injected CUDA error mapped to its errno with a
 * message naming the call.
 */
#define _GNU_SOURCE
#include <check.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_shim.h"
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvt_test.h"

#define MIB (1ull << 20)

static char msgs[16384];

static void
capture(int level, const char *msg)
{
	size_t n = strlen(msgs);

	snprintf(msgs + n, sizeof(msgs) - n, "%s\n", msg);
}

static void
setup(void)
{
	kvt_shim_reset(1);
	msgs[0] = 0;
	kvt_dev_set_log(capture);
}

static struct kvt_dev *
open_cuda(void)
{
	struct kvt_dev *dev = NULL;

	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &dev), 0);
	ck_assert_int_eq(kvt_dev_kind(dev), KVT_DEV_CUDA);
	return dev;
}

/* Lines of the shim log that start with @prefix, in order, joined by '|'. */
static const char *
calls(const char *prefix)
{
	static char out[8192];
	const char *p = kvt_shim_log();
	size_t n = strlen(prefix), o = 0;

	out[0] = 0;
	while (*p) {
		const char *e = strchr(p, '\n');

		if (!strncmp(p, prefix, n) && o + (size_t)(e - p) + 2 < sizeof(out)) {
			memcpy(out + o, p, (size_t)(e - p));
			o += (size_t)(e - p);
			out[o++] = '|';
			out[o] = 0;
		}
		p = e + 1;
	}
	return out;
}

/* ---- a client process owning device memory ------------------------------------------------ */

struct client {
	pid_t pid;
	int ctl; /* write a byte: the client frees and exits */
	struct kvt_dev_import imp;
};

/* Forks a process that cudaMallocs @size bytes filled with @fill, and hands back its import. */
static void
client_start(struct client *c, uint64_t size, uint8_t fill)
{
	int up[2], down[2];

	ck_assert_int_eq(pipe(up), 0);
	ck_assert_int_eq(pipe(down), 0);
	c->pid = fork();
	ck_assert_int_ge(c->pid, 0);
	if (c->pid == 0) {
		struct kvt_dev_import imp = {.kind = KVT_BUF_CUDA_IPC, .fd = -1, .size = size};
		struct cudaDeviceProp prop;
		cudaIpcMemHandle_t h;
		void *p;
		char b;

		close(up[0]);
		close(down[1]);
		if (cudaMalloc(&p, size) || cudaIpcGetMemHandle(&h, p) ||
		    cudaGetDeviceProperties(&prop, 0))
			_exit(1);
		memset(p, fill, size);
		memcpy(imp.ipc_handle, h.reserved, 64);
		memcpy(imp.device_uuid, prop.uuid.bytes, 16);
		if (write(up[1], &imp, sizeof(imp)) != sizeof(imp))
			_exit(1);
		if (read(down[0], &b, 1) < 0)
			_exit(1);
		cudaFree(p);
		_exit(0);
	}
	close(up[1]);
	close(down[0]);
	ck_assert_int_eq(read(up[0], &c->imp, sizeof(c->imp)), sizeof(c->imp));
	close(up[0]);
	c->ctl = down[1];
}

static void
client_stop(struct client *c, int sig)
{
	int st;

	if (sig)
		kill(c->pid, sig);
	else
		ck_assert_int_eq(write(c->ctl, "x", 1), 1);
	close(c->ctl);
	waitpid(c->pid, &st, 0);
}

/* ---- backend choice ----------------------------------------------------------------------- */

START_TEST(open_auto_without_device_is_host)
{
	struct kvt_dev *dev = NULL;

	kvt_shim_reset(0);
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_AUTO, &dev), 0);
	ck_assert_int_eq(kvt_dev_kind(dev), KVT_DEV_HOST);
	ck_assert_str_eq(kvt_dev_name(dev), "host");
	ck_assert_ptr_nonnull(strstr(msgs, "no CUDA device present"));
	kvt_dev_close(dev);
}
END_TEST

START_TEST(open_cuda_without_device_is_enodev)
{
	struct kvt_dev *dev = NULL;

	kvt_shim_reset(0);
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &dev), -ENODEV);
	ck_assert_ptr_null(dev);
	ck_assert_ptr_nonnull(strstr(msgs, "no CUDA device present"));
	ck_assert_ptr_nonnull(strstr(msgs, "cudaErrorNoDevice"));
}
END_TEST

START_TEST(open_auto_with_device_is_cuda)
{
	struct kvt_dev *dev = NULL;

	ck_assert_int_eq(kvt_dev_open(KVT_DEV_AUTO, &dev), 0);
	ck_assert_int_eq(kvt_dev_kind(dev), KVT_DEV_CUDA);
	ck_assert_str_eq(kvt_dev_name(dev), "cuda:0 kvt-shim GPU 0");
	/* One high-priority and one low-priority stream per device. */
	ck_assert_str_eq(calls("cudaStreamCreateWithPriority"),
			 "cudaStreamCreateWithPriority flags=1 priority=-5|"
			 "cudaStreamCreateWithPriority flags=1 priority=0|");
	kvt_dev_close(dev);
	ck_assert_uint_eq(kvt_shim_count("cudaStreamDestroy"), 2);
	ck_assert_uint_eq(kvt_shim_count("cudaLibraryUnload"), 1);
}
END_TEST

START_TEST(open_host_never_touches_cuda)
{
	struct kvt_dev *dev = NULL;

	ck_assert_int_eq(kvt_dev_open(KVT_DEV_HOST, &dev), 0);
	ck_assert_int_eq(kvt_dev_kind(dev), KVT_DEV_HOST);
	ck_assert_str_eq(kvt_shim_log(), "");
	kvt_dev_close(dev);
}
END_TEST

/* ---- errors: every injected failure has a message and the documented errno ---------------- */

static const struct {
	const char *fn;
	int err, want;
} open_faults[] = {
    {"cudaLibraryLoadData", cudaErrorInvalidValue, -EINVAL},
    {"cudaLibraryGetKernel", cudaErrorInvalidResourceHandle, -EINVAL},
    {"cudaGetDriverEntryPointByVersion", cudaErrorNotSupported, -EOPNOTSUPP},
    {"cudaGetDeviceProperties", cudaErrorInvalidDevice, -ENODEV},
    {"cudaSetDevice", cudaErrorDevicesUnavailable, -ENODEV},
    {"cudaDeviceGetAttribute", cudaErrorInsufficientDriver, -ENODEV},
    {"cudaStreamCreateWithPriority", cudaErrorLaunchFailure, -EIO},
    {"cudaEventCreateWithFlags", cudaErrorMemoryAllocation, -ENOMEM},
    {"cudaHostAlloc", cudaErrorMemoryAllocation, -ENOMEM},
    {"cudaHostGetDevicePointer", cudaErrorIllegalAddress, -EIO},
};

START_TEST(open_fault_maps_errno)
{
	struct kvt_dev *dev = NULL;
	char want[128];

	kvt_shim_fail(open_faults[_i].fn, 1, open_faults[_i].err);
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &dev), open_faults[_i].want);
	ck_assert_ptr_null(dev);
	/* "cuda: <function>: <call> failed: <cudaErrorName> (...) -> <strerror>": an operator
	 * reads it, so no source path */
	snprintf(want, sizeof(want), "%s(", open_faults[_i].fn);
	ck_assert_msg(strstr(msgs, want), "no message naming %s in:\n%s", want, msgs);
	ck_assert_ptr_nonnull(strstr(msgs, "cuda: "));
	ck_assert_msg(!strstr(msgs, ".c:"), "a source path in:\n%s", msgs);
	ck_assert_ptr_nonnull(strstr(msgs, strerror(-open_faults[_i].want)));
	/* Whatever was created before the failure is gone again. */
	ck_assert_uint_eq(kvt_shim_count("cudaStreamCreateWithPriority") -
			      (!strcmp(open_faults[_i].fn, "cudaStreamCreateWithPriority")),
			  kvt_shim_count("cudaStreamDestroy"));
	ck_assert_uint_eq(kvt_shim_count("cudaHostAlloc") -
			      (!strcmp(open_faults[_i].fn, "cudaHostAlloc")),
			  kvt_shim_count("cudaFreeHost"));
}
END_TEST

/* ---- pinning ------------------------------------------------------------------------------ */

static void *
map_pool(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ck_assert_ptr_ne(p, MAP_FAILED);
	return p;
}

START_TEST(register_chunks_and_reverse_unregister)
{
	struct kvt_dev *dev = open_cuda();
	size_t len = 5 * MIB;
	uint8_t *p = map_pool(len);
	char want[512];

	ck_assert_int_eq(kvt_dev_host_register(dev, p, len), 0);
	/* This test build pins in 2 MiB chunks (64 GiB in production). */
	snprintf(want, sizeof(want),
		 "cudaHostRegister p=%p len=2097152 flags=3|cudaHostRegister p=%p len=2097152 "
		 "flags=3|cudaHostRegister p=%p len=1048576 flags=3|",
		 p, p + 2 * MIB, p + 4 * MIB);
	ck_assert_str_eq(calls("cudaHostRegister"), want);
	ck_assert_uint_eq(kvt_shim_registered(), 3);
	kvt_dev_host_unregister(dev, p, len);
	snprintf(want, sizeof(want),
		 "cudaHostUnregister p=%p|cudaHostUnregister p=%p|cudaHostUnregister p=%p|",
		 p + 4 * MIB, p + 2 * MIB, p);
	ck_assert_str_eq(calls("cudaHostUnregister"), want);
	ck_assert_uint_eq(kvt_shim_registered(), 0);
	ck_assert_int_eq(kvt_dev_host_register(dev, p + 1, MIB), -EINVAL);
	kvt_dev_close(dev);
	munmap(p, len);
}
END_TEST

START_TEST(register_third_chunk_fails_unwinds_in_reverse)
{
	struct kvt_dev *dev = open_cuda();
	size_t len = 6 * MIB;
	uint8_t *p = map_pool(len);
	char want[256];

	kvt_shim_fail("cudaHostRegister", 3, cudaErrorMemoryAllocation);
	ck_assert_int_eq(kvt_dev_host_register(dev, p, len), -ENOMEM);
	ck_assert_uint_eq(kvt_shim_count("cudaHostRegister"), 3);
	snprintf(want, sizeof(want), "cudaHostUnregister p=%p|cudaHostUnregister p=%p|",
		 p + 2 * MIB, p);
	ck_assert_str_eq(calls("cudaHostUnregister"), want);
	ck_assert_uint_eq(kvt_shim_registered(), 0);
	ck_assert_ptr_nonnull(strstr(msgs, "cudaHostRegister(base + done"));
	ck_assert_ptr_nonnull(strstr(msgs, "cudaErrorMemoryAllocation"));
	/* Nothing is left half-registered: the same range registers again. */
	ck_assert_int_eq(kvt_dev_host_register(dev, p, len), 0);
	kvt_dev_host_unregister(dev, p, len);
	kvt_dev_close(dev);
	munmap(p, len);
}
END_TEST

START_TEST(register_refused_is_eopnotsupp_then_host_alloc)
{
	struct kvt_dev *dev = open_cuda();
	size_t len = 4 * MIB;
	uint8_t *p = map_pool(len);
	void *q = NULL;

	kvt_shim_fail("cudaHostRegister", 1, cudaErrorNotSupported);
	ck_assert_int_eq(kvt_dev_host_register(dev, p, len), -EOPNOTSUPP);
	ck_assert_ptr_nonnull(strstr(msgs, "must come from cudaHostAlloc"));
	ck_assert_int_eq(kvt_dev_host_alloc(dev, len, &q), 0);
	ck_assert_ptr_nonnull(q);
	kvt_dev_host_free(dev, q, len);
	kvt_shim_fail("cudaHostAlloc", 1, cudaErrorMemoryAllocation);
	ck_assert_int_eq(kvt_dev_host_alloc(dev, len, &q), -ENOMEM);
	kvt_dev_close(dev);
	munmap(p, len);
}
END_TEST

/* ---- IPC imports -------------------------------------------------------------------------- */

START_TEST(import_opens_once_closes_once)
{
	struct kvt_dev *dev = open_cuda();
	struct kvt_dev_buf *a, *b, *c2;
	struct client c;

	client_start(&c, 4 * MIB, 0x5a);
	ck_assert_int_eq(kvt_dev_buf_import(dev, &c.imp, &a), 0);
	ck_assert_int_eq(kvt_dev_buf_import(dev, &c.imp, &b), 0);
	c.imp.size = MIB; /* a smaller view of the same allocation shares the mapping */
	ck_assert_int_eq(kvt_dev_buf_import(dev, &c.imp, &c2), 0);
	ck_assert_uint_eq(kvt_dev_buf_size(c2), MIB);
	ck_assert_uint_eq(kvt_shim_count("cudaIpcOpenMemHandle"), 1);
	kvt_dev_buf_get(a); /* a sequence holding the buffer */
	kvt_dev_buf_put(a);
	kvt_dev_buf_put(b);
	kvt_dev_buf_put(c2);
	ck_assert_uint_eq(kvt_shim_count("cudaIpcCloseMemHandle"), 0);
	ck_assert_uint_eq(kvt_shim_ipc_open(), 1);
	kvt_dev_buf_put(a); /* the last reference: streams drained, then closed */
	ck_assert_uint_eq(kvt_shim_count("cudaIpcCloseMemHandle"), 1);
	ck_assert_uint_eq(kvt_shim_ipc_open(), 0);
	{
		const char *log = kvt_shim_log(), *close = strstr(log, "cudaIpcCloseMemHandle");
		const char *sync = strstr(log, "cudaStreamSynchronize");

		ck_assert_ptr_nonnull(sync);
		ck_assert(sync < close);
	}
	/* Opened again after the close: a fresh mapping. */
	ck_assert_int_eq(kvt_dev_buf_import(dev, &c.imp, &a), 0);
	kvt_dev_buf_put(a);
	ck_assert_uint_eq(kvt_shim_count("cudaIpcOpenMemHandle"), 2);
	ck_assert_uint_eq(kvt_shim_count("cudaIpcCloseMemHandle"), 2);
	client_stop(&c, 0);
	kvt_dev_close(dev);
}
END_TEST

START_TEST(import_survives_sigkilled_client)
{
	struct kvt_dev *dev = open_cuda();
	struct kvt_dev_buf *a, *b;
	struct client c1, c2;
	uint8_t *host = NULL;
	struct kvt_dev_copy row;

	client_start(&c1, MIB, 0x11);
	client_start(&c2, MIB, 0x22);
	ck_assert_int_eq(kvt_dev_buf_import(dev, &c1.imp, &a), 0);
	ck_assert_int_eq(kvt_dev_buf_import(dev, &c2.imp, &b), 0);
	client_stop(&c1, SIGKILL);
	/* The daemon's mapping outlives its owner: copies still work, the other client too. */
	ck_assert_int_eq(kvt_dev_host_alloc(dev, 4096, (void **)&host), 0);
	row = (struct kvt_dev_copy){.buf_off = 4096, .host = host, .len = 4096};
	ck_assert_int_eq(kvt_dev_copy_d2h(dev, a, &row, 1), 0);
	ck_assert_int_eq(kvt_dev_sync(dev), 0);
	ck_assert_uint_eq(host[0], 0x11);
	ck_assert_int_eq(kvt_dev_copy_d2h(dev, b, &row, 1), 0);
	ck_assert_int_eq(kvt_dev_sync(dev), 0);
	ck_assert_uint_eq(host[4095], 0x22);
	/* The session of the killed client ends: its import is closed once, the other stays. */
	kvt_dev_buf_put(a);
	ck_assert_uint_eq(kvt_shim_count("cudaIpcCloseMemHandle"), 1);
	ck_assert_uint_eq(kvt_shim_ipc_open(), 1);
	kvt_dev_buf_put(b);
	ck_assert_uint_eq(kvt_shim_count("cudaIpcCloseMemHandle"), 2);
	ck_assert_uint_eq(kvt_shim_count("cudaIpcOpenMemHandle"), 2);
	client_stop(&c2, 0);
	kvt_dev_host_free(dev, host, 4096);
	kvt_dev_close(dev);
}
END_TEST

START_TEST(import_refusals)
{
	struct kvt_dev *dev = open_cuda();
	struct kvt_dev_buf *a = NULL;
	struct client c;
	struct kvt_dev_import bad;

	client_start(&c, MIB, 0);
	/* Bigger than the allocation: refused, and the handle it opened is closed again. */
	bad = c.imp;
	bad.size = 2 * MIB;
	ck_assert_int_eq(kvt_dev_buf_import(dev, &bad, &a), -EINVAL);
	ck_assert_uint_eq(kvt_shim_count("cudaIpcOpenMemHandle"), 1);
	ck_assert_uint_eq(kvt_shim_count("cudaIpcCloseMemHandle"), 1);
	ck_assert_ptr_nonnull(strstr(msgs, "claims 2097152 bytes of a 1048576-byte allocation"));
	/* A device this daemon does not have. */
	bad = c.imp;
	memset(bad.device_uuid, 0xee, 16);
	ck_assert_int_eq(kvt_dev_buf_import(dev, &bad, &a), -ENODEV);
	ck_assert_ptr_nonnull(strstr(msgs, "no device with UUID eeeeeeee"));
	/* A forged handle. */
	bad = c.imp;
	memset(bad.ipc_handle, 0x42, 64);
	ck_assert_int_eq(kvt_dev_buf_import(dev, &bad, &a), -EINVAL);
	ck_assert_ptr_nonnull(strstr(msgs, "cudaErrorInvalidResourceHandle"));
	/* A memfd on the CUDA backend: a kind it does not take. */
	bad = c.imp;
	bad.kind = KVT_BUF_HOST_MEMFD;
	ck_assert_int_eq(kvt_dev_buf_import(dev, &bad, &a), -EOPNOTSUPP);
	/* Injected driver failures. */
	kvt_shim_fail("cudaIpcOpenMemHandle", 1, cudaErrorMapBufferObjectFailed);
	ck_assert_int_eq(kvt_dev_buf_import(dev, &c.imp, &a), -EIO);
	kvt_shim_fail("cudaSetDevice", 1, cudaErrorInvalidDevice);
	ck_assert_int_eq(kvt_dev_buf_import(dev, &c.imp, &a), -ENODEV);
	ck_assert_uint_eq(kvt_shim_ipc_open(), 0);
	client_stop(&c, 0);
	kvt_dev_close(dev);
}
END_TEST

/* ---- batch copies ------------------------------------------------------------------------- */

struct copy_fix {
	struct kvt_dev *dev;
	struct client c;
	struct kvt_dev_buf *buf;
	uint8_t *pool, *pageable;
	size_t pool_len;
};

static void
copy_fix_start(struct copy_fix *f)
{
	f->dev = open_cuda();
	f->pool_len = 4 * MIB;
	f->pool = map_pool(f->pool_len);
	ck_assert_int_eq(kvt_dev_host_register(f->dev, f->pool, f->pool_len), 0);
	f->pageable = malloc(MIB);
	client_start(&f->c, 2 * MIB, 0);
	ck_assert_int_eq(kvt_dev_buf_import(f->dev, &f->c.imp, &f->buf), 0);
}

static void
copy_fix_stop(struct copy_fix *f)
{
	kvt_dev_buf_put(f->buf);
	client_stop(&f->c, 0);
	kvt_dev_host_unregister(f->dev, f->pool, f->pool_len);
	kvt_dev_close(f->dev);
	munmap(f->pool, f->pool_len);
	free(f->pageable);
}

/* Row i: 256 bytes, scattered on both sides (reversed, with gaps). */
static void
scatter_rows(struct kvt_dev_copy *rows, unsigned n, uint8_t *host, unsigned len)
{
	for (unsigned i = 0; i < n; i++) {
		rows[i].buf_off = (uint64_t)(n - 1 - i) * 2 * len + (i & 1) * 16;
		rows[i].host = host + (uint64_t)i * 3 * len;
		rows[i].len = len - (i % 3) * 8; /* some rows not a multiple of 16 */
	}
}

START_TEST(batch_is_one_launch_bit_exact)
{
	struct copy_fix f;
	struct kvt_dev_copy rows[256], back[256];
	uint8_t *dst;

	copy_fix_start(&f);
	for (size_t i = 0; i < f.pool_len; i++)
		f.pool[i] = (uint8_t)(i * 2654435761u >> 13);
	scatter_rows(rows, 256, f.pool, 256);
	kvt_shim_reset(1);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 256), 0);
	ck_assert_int_eq(kvt_dev_sync(f.dev), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaLaunchKernel"), 1);
	ck_assert_uint_eq(kvt_shim_count("cudaMemcpyAsync"), 0);
	ck_assert_ptr_nonnull(strstr(kvt_shim_log(), "kvt_rows_copy rows=256"));
	/* Back into other pool rows through the offload stream, again one launch. */
	dst = f.pool + 2 * MIB;
	memcpy(back, rows, sizeof(back));
	for (unsigned i = 0; i < 256; i++)
		back[i].host = dst + (uint64_t)(255 - i) * 1000;
	ck_assert_int_eq(kvt_dev_copy_d2h(f.dev, f.buf, back, 256), 0);
	ck_assert_int_eq(kvt_dev_sync(f.dev), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaLaunchKernel"), 2);
	ck_assert_uint_eq(kvt_shim_count("cudaMemcpyAsync"), 0);
	for (unsigned i = 0; i < 256; i++)
		ck_assert_mem_eq(back[i].host, rows[i].host, rows[i].len);
	copy_fix_stop(&f);
}
END_TEST

START_TEST(batch_large_is_one_launch_per_1024_rows)
{
	struct copy_fix f;
	static struct kvt_dev_copy rows[2500];

	copy_fix_start(&f);
	for (unsigned i = 0; i < 2500; i++)
		rows[i] = (struct kvt_dev_copy){.buf_off = (uint64_t)i * 512,
						.host = f.pool + (uint64_t)(2499 - i) * 256,
						.len = 256};
	kvt_shim_reset(1);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 2500), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaLaunchKernel"), 3);
	ck_assert_uint_eq(kvt_shim_count("cudaMemcpyAsync"), 0);
	copy_fix_stop(&f);
}
END_TEST

START_TEST(batch_contiguous_is_one_memcpy)
{
	struct copy_fix f;
	struct kvt_dev_copy rows[64];

	copy_fix_start(&f);
	for (unsigned i = 0; i < 64; i++)
		rows[i] = (struct kvt_dev_copy){
		    .buf_off = 4096 + i * 128ull, .host = f.pool + 8192 + i * 128ull, .len = 128};
	memset(f.pool + 8192, 0x77, 64 * 128);
	kvt_shim_reset(1);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 64), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaMemcpyAsync"), 1);
	ck_assert_uint_eq(kvt_shim_count("cudaLaunchKernel"), 0);
	ck_assert_ptr_nonnull(strstr(kvt_shim_log(), "n=8192"));
	copy_fix_stop(&f);
}
END_TEST

START_TEST(batch_unpinned_rows_bounce)
{
	struct copy_fix f;
	struct kvt_dev_copy rows[100], back[100];
	static uint8_t out[100 * 300];

	copy_fix_start(&f);
	for (unsigned i = 0; i < 100 * 300 && i < MIB; i++)
		f.pageable[i] = (uint8_t)(i * 7 + 3);
	/* Mixed: even rows from the pinned pool, odd rows from malloc()ed memory. */
	for (unsigned i = 0; i < 100; i++) {
		rows[i].buf_off = (uint64_t)(99 - i) * 1024;
		rows[i].host = i & 1 ? f.pageable + i * 300ull : f.pool + i * 300ull;
		rows[i].len = 200 + i;
		if (!(i & 1))
			memset(rows[i].host, (int)i, rows[i].len);
	}
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 100), 0);
	ck_assert_int_eq(kvt_dev_sync(f.dev), 0);
	for (unsigned i = 0; i < 100; i++)
		back[i] = (struct kvt_dev_copy){
		    .buf_off = rows[i].buf_off, .host = out + i * 300ull, .len = rows[i].len};
	kvt_shim_reset(1);
	ck_assert_int_eq(kvt_dev_copy_d2h(f.dev, f.buf, back, 100), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaLaunchKernel"), 1);
	/* The unpinned destination is filled when the call returns. */
	for (unsigned i = 0; i < 100; i++)
		ck_assert_mem_eq(out + i * 300ull, rows[i].host, rows[i].len);
	copy_fix_stop(&f);
}
END_TEST

/* The reference of an int8 row's element: f32 product, nearest even, as the kernel does. */
static uint16_t
deq_ref(int8_t code, float scale, uint32_t dtype)
{
	float x = (float)code * scale;
	uint16_t h;

	if (dtype == KVT_DTYPE_BF16) {
		uint32_t u;

		memcpy(&u, &x, 4);
		return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
	}
	{
		_Float16 f = (_Float16)x;

		memcpy(&h, &f, 2);
	}
	return h;
}

/* T2 rows cross as int8 and land dequantized: per-head scales (group head_dim) and per-channel
 * ones (group 1), f16 and bf16, beside a plain row, in one launch; rows whose codes are not in
 * registered memory are dequantized on the host into the bounce buffer, same bytes. */
START_TEST(batch_int8_rows_dequantized)
{
	struct copy_fix f;
	enum { E = 64, N = 6 };
	struct kvt_dev_copy rows[N], back[N];
	static uint8_t out[N][2 * E];
	float *sc;
	int8_t *codes;

	copy_fix_start(&f);
	codes = (int8_t *)f.pool;
	sc = (float *)(f.pool + 65536);
	for (unsigned i = 0; i < N * E; i++)
		codes[i] = (int8_t)(i * 37 + 11);
	for (unsigned i = 0; i < N * E; i++)
		sc[i] = 0.001f * (float)(i % 97 + 1);
	memcpy(f.pageable, codes, N * E);
	for (unsigned i = 0; i < N; i++) {
		rows[i] =
		    (struct kvt_dev_copy){.buf_off = 8192 + i * 4096ull,
					  .host = codes + i * E,
					  .len = E,
					  .scale = sc + i * E,
					  .group = i % 2 ? 1 : 8,
					  .dtype = i % 3 == 1 ? KVT_DTYPE_BF16 : KVT_DTYPE_F16};
	}
	rows[3].host = f.pageable + 3 * E; /* through the bounce buffer */
	rows[5].scale = NULL;		   /* a plain row of E bytes */
	kvt_shim_reset(1);
	ck_assert_int_eq(kvt_dev_copy_h2d_q8(f.dev, f.buf, rows, N), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaLaunchKernel"), 1);
	ck_assert_int_eq(kvt_dev_sync(f.dev), 0);
	for (unsigned i = 0; i < N; i++)
		back[i] = (struct kvt_dev_copy){
		    .buf_off = rows[i].buf_off, .host = out[i], .len = i == 5 ? E : 2 * E};
	ck_assert_int_eq(kvt_dev_copy_d2h(f.dev, f.buf, back, N), 0);
	ck_assert_int_eq(kvt_dev_sync(f.dev), 0);
	for (unsigned i = 0; i < N; i++) {
		if (i == 5) {
			ck_assert_mem_eq(out[i], codes + i * E, E);
			continue;
		}
		for (unsigned e = 0; e < E; e++) {
			uint16_t got;

			memcpy(&got, out[i] + 2 * e, 2);
			ck_assert_uint_eq(got,
					  deq_ref(codes[i * E + e], sc[i * E + e / rows[i].group],
						  rows[i].dtype));
		}
	}
	/* The plain entry points ignore the fields: E bytes copied as they are. */
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 1), 0);
	ck_assert_int_eq(kvt_dev_sync(f.dev), 0);
	ck_assert_int_eq(kvt_dev_copy_d2h(f.dev, f.buf, back, 1), 0);
	ck_assert_int_eq(kvt_dev_sync(f.dev), 0);
	ck_assert_mem_eq(out[0], codes, E);
	/* Malformed int8 rows fail alone, before anything is queued. */
	rows[0].group = 0;
	ck_assert_int_eq(kvt_dev_copy_h2d_q8(f.dev, f.buf, rows, 1), -EINVAL);
	rows[0].group = 8;
	rows[0].dtype = KVT_DTYPE_F32;
	ck_assert_int_eq(kvt_dev_copy_h2d_q8(f.dev, f.buf, rows, 1), -EINVAL);
	rows[0].dtype = KVT_DTYPE_F16;
	rows[0].buf_off = 2 * MIB - E; /* 2 E bytes land: past the end */
	ck_assert_int_eq(kvt_dev_copy_h2d_q8(f.dev, f.buf, rows, 1), -ERANGE);
	copy_fix_stop(&f);
}
END_TEST

START_TEST(int8_rows_not_on_host_backend)
{
	struct kvt_dev *dev = NULL;
	struct kvt_dev_copy row = {.len = 8, .scale = (const float *)&row, .group = 8};

	ck_assert_int_eq(kvt_dev_open(KVT_DEV_HOST, &dev), 0);
	ck_assert_int_eq(kvt_dev_dequant_ok(dev), 0);
	ck_assert_int_eq(kvt_dev_copy_h2d_q8(dev, NULL, &row, 1), -EOPNOTSUPP);
	kvt_dev_close(dev);
}
END_TEST

START_TEST(batch_range_and_faults)
{
	struct copy_fix f;
	struct kvt_dev_copy rows[2] = {{.buf_off = 0, .len = 64},
				       {.buf_off = 2 * MIB - 32, .len = 64}};

	copy_fix_start(&f);
	rows[0].host = f.pool;
	rows[1].host = f.pool + 4096;
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 2), -ERANGE);
	ck_assert_int_eq(kvt_dev_copy_d2h(f.dev, f.buf, rows, 2), -ERANGE);
	rows[1].buf_off = 4096;
	kvt_shim_fail("cudaLaunchKernel", 1, cudaErrorLaunchFailure);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 2), -EIO);
	ck_assert_ptr_nonnull(strstr(msgs, "cudaLaunchKernel("));
	ck_assert_ptr_nonnull(strstr(msgs, "cudaErrorLaunchFailure"));
	kvt_shim_fail("cudaStreamSynchronize", 1, cudaErrorIllegalAddress);
	ck_assert_int_eq(kvt_dev_sync(f.dev), -EIO);
	ck_assert_ptr_nonnull(strstr(msgs, "cudaErrorIllegalAddress"));
	/* A lane runs 64 batches ahead of the device without waiting; the 65th waits for the
	 * oldest before reusing its descriptors. */
	kvt_shim_hold(1);
	kvt_shim_reset(1);
	for (unsigned i = 0; i < 64; i++)
		ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 2), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaEventSynchronize"), 0);
	ck_assert_uint_eq(kvt_shim_queued(), 64);
	kvt_shim_fail("cudaEventSynchronize", 1, cudaErrorLaunchFailure);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 2), -EIO);
	/* The lane recovers: the next batch waits for the oldest and goes through. */
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 2), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaEventSynchronize"), 2);
	kvt_shim_hold(0);
	ck_assert_int_eq(kvt_dev_sync(f.dev), 0);
	copy_fix_stop(&f);
}
END_TEST

/* ---- events ------------------------------------------------------------------------------- */

START_TEST(event_export_and_record)
{
	struct kvt_dev *dev = open_cuda(), *host = NULL;
	struct kvt_dev_event *ev = NULL;
	uint8_t handle[64], uuid[16];
	struct cudaDeviceProp prop;
	cudaIpcEventHandle_t h;
	cudaEvent_t opened;

	ck_assert_int_eq(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
	memcpy(uuid, prop.uuid.bytes, 16);
	ck_assert_int_eq(kvt_dev_event_create(dev, uuid, &ev, handle), 0);
	memcpy(h.reserved, handle, 64);
	ck_assert_int_eq(cudaIpcOpenEventHandle(&opened, h), cudaSuccess);
	cudaEventDestroy(opened);
	kvt_shim_reset(1);
	ck_assert_int_eq(kvt_dev_event_record(dev, ev), 0);
	/* Offload joins prefetch, then the exported event is recorded. */
	ck_assert_str_eq(calls("cuda"), "cudaSetDevice 0|cudaEventRecord |cudaStreamWaitEvent |"
					"cudaEventRecord |");
	kvt_dev_event_destroy(dev, ev);
	ck_assert_uint_eq(kvt_shim_count("cudaEventDestroy"), 2);
	memset(uuid, 0, 16);
	ck_assert_int_eq(kvt_dev_event_create(dev, uuid, &ev, handle), -ENODEV);
	kvt_shim_fail("cudaIpcGetEventHandle", 1, cudaErrorNotSupported);
	memcpy(uuid, prop.uuid.bytes, 16);
	ck_assert_int_eq(kvt_dev_event_create(dev, uuid, &ev, handle), -EOPNOTSUPP);
	ck_assert_uint_eq(kvt_shim_count("cudaEventDestroy"), 4); /* both of the failed one */
	kvt_dev_close(dev);
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_HOST, &host), 0);
	ck_assert_int_eq(kvt_dev_event_create(host, uuid, &ev, handle), -EOPNOTSUPP);
	ck_assert_int_eq(kvt_dev_event_record(host, NULL), 0);
	kvt_dev_close(host);
}
END_TEST

static Suite *
suite(void)
{
	Suite *s = suite_create("cuda_dev");
	TCase *t = tcase_create("open");

	tcase_add_checked_fixture(t, setup, NULL);
	tcase_add_test(t, open_auto_without_device_is_host);
	tcase_add_test(t, open_cuda_without_device_is_enodev);
	tcase_add_test(t, open_auto_with_device_is_cuda);
	tcase_add_test(t, open_host_never_touches_cuda);
	tcase_add_loop_test(t, open_fault_maps_errno, 0,
			    sizeof(open_faults) / sizeof(open_faults[0]));
	suite_add_tcase(s, t);
	t = tcase_create("pin");
	tcase_add_checked_fixture(t, setup, NULL);
	tcase_add_test(t, register_chunks_and_reverse_unregister);
	tcase_add_test(t, register_third_chunk_fails_unwinds_in_reverse);
	tcase_add_test(t, register_refused_is_eopnotsupp_then_host_alloc);
	suite_add_tcase(s, t);
	t = tcase_create("ipc");
	tcase_add_checked_fixture(t, setup, NULL);
	tcase_add_test(t, import_opens_once_closes_once);
	tcase_add_test(t, import_survives_sigkilled_client);
	tcase_add_test(t, import_refusals);
	suite_add_tcase(s, t);
	t = tcase_create("copy");
	tcase_add_checked_fixture(t, setup, NULL);
	tcase_add_test(t, batch_is_one_launch_bit_exact);
	tcase_add_test(t, batch_large_is_one_launch_per_1024_rows);
	tcase_add_test(t, batch_contiguous_is_one_memcpy);
	tcase_add_test(t, batch_unpinned_rows_bounce);
	tcase_add_test(t, batch_range_and_faults);
	tcase_add_test(t, batch_int8_rows_dequantized);
	tcase_add_test(t, int8_rows_not_on_host_backend);
	tcase_add_test(t, event_export_and_record);
	suite_add_tcase(s, t);
	return s;
}

int
main(void)
{
	return kvt_check_run(suite());
}
