/* SPDX-License-Identifier: MIT */
/*
 * check_cuda_client - libkvtier's CUDA side (client/kvtier_cuda.c) on the driver entry points of
 * libkvt_cudashim, loaded by libkvtier through KVTIER_LIBCUDA (set by ctest), against the
 * production kvtierd on its CUDA backend (the shim in LD_PRELOAD). This process plays a PyTorch
 * process: its device memory comes from the shim's cudaMalloc, as torch's from its runtime.
 * Covered: registering at an allocation's start and inside it (rows land at the right bytes),
 * kvt_buf_alloc_cuda() round trip, kvt_cuda_stream_wait() waiting on the session's event, the
 * errno of every driver call's failure, the host backend, and no driver at all.
 *
 * Each test runs in its own forked process (check's default), so each loads the driver anew.
 */
#define _GNU_SOURCE
#include <check.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_shim.h"
#include "harness.h"
#include "kvtier.h"
#include "kvt_test.h"

#define L      2
#define D      64
#define SLOTS  8
#define STEPS  8
#define ROW    (D * 4) /* one head, f32 */
#define T0_LEN ((size_t)L * 2 * SLOTS * ROW)
#define ST_LEN ((size_t)L * 2 * STEPS * ROW)

static struct kvtd_proc Dm;

static struct kvt_client *
start(const char *backend)
{
	const char *const extra[] = {"--backend", backend, NULL};
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_client *c;

	daemon_start(&Dm, extra);
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	return c;
}

static void
stop(struct kvt_client *c)
{
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

/* A sequence whose T0 region is @t0 and staging region @st, both laid out from offset 0 of the
 * buffer as the caller sees it. */
static uint32_t
seq_open(struct kvt_client *c, struct kvt_buf *t0, struct kvt_buf *st)
{
	struct kvt_seq_params p = {.size = sizeof(p)};
	uint32_t seq;

	p.layers = L;
	p.kv_heads = 1;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 2;
	p.window = 2;
	p.hbm_frac = 0.5f;
	p.t0_buf_id = kvt_buf_id(t0);
	p.t0_slots = SLOTS;
	p.t0_slot_stride = ROW;
	p.t0_kv_stride = (uint64_t)SLOTS * ROW;
	p.t0_layer_stride = 2ull * SLOTS * ROW;
	p.stage_buf_id = kvt_buf_id(st);
	p.stage_slots = STEPS;
	p.stage_slot_stride = ROW;
	p.stage_kv_stride = (uint64_t)STEPS * ROW;
	p.stage_layer_stride = 2ull * STEPS * ROW;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	return seq;
}

static CUstream make_stream(void);

/* Two tokens written into T0 slots 2 and 0, appended, then fetched (positions 1, 0) into
 * staging rows 0 and 1 of every layer: the staged rows must be the T0 rows, bit for bit, once
 * a stream has waited on the session's event (the FETCH's CQE does not wait for its copies). */
static void
rows_round_trip(struct kvt_client *c, struct kvt_buf *t0, struct kvt_buf *st)
{
	uint8_t *t0p = kvt_buf_ptr(t0), *stp = kvt_buf_ptr(st);
	uint32_t seq = seq_open(c, t0, st), slots[2] = {2, 0}, list[2] = {1, 0};

	for (size_t i = 0; i < T0_LEN; i++)
		t0p[i] = (uint8_t)(i * 131 + 7);
	ck_assert_int_eq(kvt_append_t0(c, seq, slots, 2), 2);
	ck_assert_int_eq(kvt_fetch(c, seq, KVT_FETCH_F_LIST, 0, L, 0, list, 2), 2);
	{
		CUstream s = make_stream();

		ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
		ck_assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	}
	for (unsigned l = 0; l < L; l++)
		for (unsigned kv = 0; kv < 2; kv++)
			for (unsigned r = 0; r < 2; r++)
				ck_assert_mem_eq(
				    stp + (l * 2 + kv) * STEPS * ROW + r * ROW,
				    t0p + (l * 2 + kv) * SLOTS * ROW + slots[list[r]] * ROW, ROW);
	ck_assert_int_eq(kvt_seq_close(c, seq), 0);
}

START_TEST(register_at_start_and_inside)
{
	struct kvt_client *c = start("cuda");
	size_t pad = 4096, alloc = pad + T0_LEN + pad + ST_LEN + pad;
	struct kvt_buf *whole, *t0, *st, *b;
	uint8_t *a, *guard;

	ck_assert_int_eq(cudaMalloc((void **)&a, alloc), cudaSuccess);
	memset(a, 0xa5, alloc);
	guard = malloc(alloc);
	memcpy(guard, a, alloc);

	/* At the start: offset 0, as before. */
	ck_assert_int_eq(kvt_buf_register_cuda(c, a, alloc, &whole), 0);
	ck_assert_ptr_eq(kvt_buf_ptr(whole), a);
	ck_assert_uint_eq(kvt_buf_offset(whole), 0);
	ck_assert_uint_eq(kvt_buf_size(whole), alloc);
	ck_assert_int_eq(kvt_buf_free(c, whole), 0);

	/* Inside: T0 and staging regions are two ranges of one allocation (as two torch tensors
	 * of one caching-allocator block); the daemon opens the allocation once. */
	ck_assert_int_eq(kvt_buf_register_cuda(c, a + pad, T0_LEN, &t0), 0);
	ck_assert_int_eq(kvt_buf_register_cuda(c, a + 2 * pad + T0_LEN, ST_LEN, &st), 0);
	ck_assert_ptr_eq(kvt_buf_ptr(t0), a + pad);
	ck_assert_uint_eq(kvt_buf_offset(t0), pad);
	ck_assert_uint_eq(kvt_buf_size(t0), T0_LEN);
	ck_assert_uint_eq(kvt_buf_offset(st), 2 * pad + T0_LEN);
	rows_round_trip(c, t0, st);
	/* Nothing outside the two regions was touched: the daemon addressed them from their own
	 * start, not from the allocation's. */
	ck_assert_mem_eq(a, guard, pad);
	ck_assert_mem_eq(a + pad + T0_LEN, guard + pad + T0_LEN, pad);
	ck_assert_mem_eq(a + alloc - pad, guard + alloc - pad, pad);
	for (size_t i = 2 * ROW; i < (size_t)STEPS * ROW; i++) /* staging rows 2.. of layer 0 K */
		ck_assert_uint_eq(a[2 * pad + T0_LEN + i], 0xa5);

	/* Ranges that pass the allocation's end, by one byte or by wrapping. */
	ck_assert_int_eq(kvt_buf_register_cuda(c, a + pad, alloc - pad + 1, &b), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "pass the end"));
	ck_assert_int_eq(kvt_buf_register_cuda(c, a + alloc - 1, UINT64_MAX, &b), -EINVAL);
	ck_assert_int_eq(kvt_buf_register_cuda(c, a + alloc - 1, 1, &b), 0);
	ck_assert_uint_eq(kvt_buf_offset(b), alloc - 1);
	ck_assert_int_eq(kvt_buf_free(c, b), 0);
	/* Not device memory: host memory, NULL, size 0. */
	ck_assert_int_eq(kvt_buf_register_cuda(c, guard, 64, &b), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "not CUDA device memory"));
	ck_assert_int_eq(kvt_buf_register_cuda(c, NULL, 64, &b), -EINVAL);
	ck_assert_int_eq(kvt_buf_register_cuda(c, a, 0, &b), -EINVAL);
	ck_assert_uint_eq(kvt_shim_ctx_depth(), 0); /* the thread's contexts as they were */

	ck_assert_int_eq(kvt_buf_free(c, t0), 0);
	ck_assert_int_eq(kvt_buf_free(c, st), 0);
	stop(c);
	ck_assert_int_eq(cudaFree(a), cudaSuccess);
	free(guard);
}
END_TEST

/* A SEQ_OPEN whose layout, moved by the buffer's offset, would wrap: refused before sending. */
START_TEST(register_inside_offset_wrap)
{
	struct kvt_client *c = start("cuda");
	struct kvt_seq_params p = {.size = sizeof(p)};
	struct kvt_buf *t0;
	uint8_t *a;
	uint32_t seq;

	ck_assert_int_eq(cudaMalloc((void **)&a, 2 * T0_LEN), cudaSuccess);
	ck_assert_int_eq(kvt_buf_register_cuda(c, a + T0_LEN, T0_LEN, &t0), 0);
	p.layers = L;
	p.kv_heads = 1;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.delta = 2;
	p.window = 2;
	p.hbm_frac = 0.5f;
	p.t0_buf_id = kvt_buf_id(t0);
	p.t0_slots = SLOTS;
	p.t0_slot_stride = ROW;
	p.t0_kv_stride = (uint64_t)SLOTS * ROW;
	p.t0_layer_stride = 2ull * SLOTS * ROW;
	p.t0_base_off = UINT64_MAX - T0_LEN / 2;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -ERANGE);
	/* A layout past the region's end is the daemon's -ERANGE, offset or not. */
	p.t0_base_off = 1;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -ERANGE);
	p.t0_base_off = 0;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	ck_assert_int_eq(kvt_seq_close(c, seq), 0);
	ck_assert_int_eq(kvt_buf_free(c, t0), 0);
	stop(c);
	cudaFree(a);
}
END_TEST

START_TEST(alloc_cuda_round_trip)
{
	struct kvt_client *c = start("cuda");
	CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
	unsigned type = 0;
	void *data = &type;
	struct kvt_buf *t0, *st, *b;

	ck_assert_int_eq(kvt_buf_alloc_cuda(c, 0, T0_LEN, &t0), 0);
	ck_assert_int_eq(kvt_buf_alloc_cuda(c, 0, ST_LEN, &st), 0);
	ck_assert_ptr_nonnull(kvt_buf_ptr(t0));
	ck_assert_uint_eq(kvt_buf_size(t0), T0_LEN);
	ck_assert_uint_eq(kvt_buf_offset(t0), 0);
	/* Device memory, as the driver sees it (what DLPack / __cuda_array_interface__ wrap). */
	ck_assert_int_eq(
	    cuPointerGetAttributes(1, &attr, &data, (CUdeviceptr)(uintptr_t)kvt_buf_ptr(t0)),
	    CUDA_SUCCESS);
	ck_assert_uint_eq(type, CU_MEMORYTYPE_DEVICE);
	ck_assert_uint_eq(kvt_shim_count("cuDevicePrimaryCtxRetain"), 1); /* once per device */
	rows_round_trip(c, t0, st);
	ck_assert_int_eq(kvt_buf_free(c, t0), 0);
	ck_assert_uint_eq(kvt_shim_count("cuMemFree_v2"), 1);
	ck_assert_int_eq(
	    cuPointerGetAttributes(1, &attr, &data, (CUdeviceptr)(uintptr_t)kvt_buf_ptr(st)),
	    CUDA_SUCCESS);
	/* Errors: size 0, a device this process lacks. */
	ck_assert_int_eq(kvt_buf_alloc_cuda(c, 0, 0, &b), -EINVAL);
	ck_assert_int_eq(kvt_buf_alloc_cuda(c, 1, 4096, &b), -ENODEV);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "cuDeviceGet"));
	ck_assert_int_eq(kvt_buf_alloc_cuda(c, -1, 4096, &b), -ENODEV);
	ck_assert_uint_eq(kvt_shim_count("cuMemAlloc_v2"), 2);
	/* The session's end frees what is left. */
	stop(c);
	ck_assert_uint_eq(kvt_shim_count("cuMemFree_v2"), 2);
	ck_assert_uint_eq(kvt_shim_ctx_depth(), 0);
}
END_TEST

/* A stream of device 0's primary context, made as the caller's runtime would. */
static CUstream
make_stream(void)
{
	CUcontext ctx, old;
	CUstream s;

	ck_assert_int_eq(cuInit(0), CUDA_SUCCESS);
	ck_assert_int_eq(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	ck_assert_int_eq(cuCtxPushCurrent(ctx), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamCreate(&s, 0), CUDA_SUCCESS);
	ck_assert_int_eq(cuCtxPopCurrent(&old), CUDA_SUCCESS);
	return s;
}

static int
wait_lines(const char *stream_ev)
{
	const char *l = kvt_shim_log();
	int n = 0;

	while ((l = strstr(l, "cuStreamWaitEvent "))) {
		n += !strncmp(l + strlen("cuStreamWaitEvent "), stream_ev, strlen(stream_ev));
		l++;
	}
	return n;
}

START_TEST(stream_wait_on_session_event)
{
	struct kvt_client *c = start("cuda"), *c2;
	struct kvt_opts o = {.size = sizeof(o)};
	CUstream s = make_stream();
	unsigned long long serial, serial2;
	char want[128];
	void *ev, *ev2;
	int pid, pid2;

	/* The session's event, as kvt_event_get_cuda() names it. */
	ck_assert_int_eq(kvt_event_get_cuda(c, 0, &ev), 0);
	ck_assert_int_eq(kvt_shim_event_id(ev, &pid, &serial), 0);
	ck_assert_int_eq(pid, Dm.pid); /* created by kvtierd */
	ck_assert_int_eq(cuEventDestroy(ev), CUDA_SUCCESS);

	kvt_shim_reset(1);
	ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
	ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
	snprintf(want, sizeof(want), "stream=%p ev=%d.%llu flags=0", (void *)s, pid, serial);
	ck_assert_msg(wait_lines(want) == 2, "want two waits '%s' in:\n%s", want, kvt_shim_log());
	ck_assert_uint_eq(kvt_shim_count("cuIpcOpenEventHandle"), 1); /* opened once, kept */
	ck_assert_uint_eq(kvt_shim_ctx_depth(), 0);
	/* The default stream of the current context is a stream too; with no context it is not. */
	ck_assert_int_eq(kvt_cuda_stream_wait(c, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "cuStreamWaitEvent"));
	ck_assert_int_eq(kvt_cuda_stream_wait(c, (void *)&want), -EINVAL); /* not a stream */

	/* Another session waits on its own event. */
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c2), 0);
	ck_assert_int_eq(kvt_event_get_cuda(c2, 0, &ev2), 0);
	ck_assert_int_eq(kvt_shim_event_id(ev2, &pid2, &serial2), 0);
	ck_assert_uint_ne(serial2, serial);
	ck_assert_int_eq(kvt_cuda_stream_wait(c2, s), 0);
	snprintf(want, sizeof(want), "stream=%p ev=%d.%llu flags=0", (void *)s, pid2, serial2);
	ck_assert_int_eq(wait_lines(want), 1);
	cuEventDestroy(ev2);
	kvt_disconnect(c2);
	ck_assert_uint_eq(kvt_shim_count("cuEventDestroy_v2"), 2); /* ours, and c2's kept one */
	stop(c);
	ck_assert_uint_eq(kvt_shim_count("cuEventDestroy_v2"), 3);
}
END_TEST

/* Host backend: nothing to wait for (copies are done when the CQE is posted). */
START_TEST(stream_wait_host_backend)
{
	struct kvt_client *c = start("host");
	CUstream s = make_stream();
	void *ev;

	kvt_shim_reset(1);
	ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
	ck_assert_str_eq(kvt_last_error(), "");
	ck_assert_int_eq(kvt_cuda_stream_wait(c, s), 0);
	ck_assert_uint_eq(kvt_shim_count("cuStreamWaitEvent"), 0);
	ck_assert_uint_eq(kvt_shim_count("cuStreamGetCtx"), 1); /* asked once */
	ck_assert_int_eq(kvt_event_get_cuda(c, 0, &ev), -EOPNOTSUPP);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "CQE"));
	stop(c);
}
END_TEST

struct inject {
	const char *fn;
	CUresult err;
	int want;
};

/* Fail @fn's next call with @err: the call returns @want, names @fn in kvt_last_error(), leaves
 * the thread's contexts as they were and registers nothing. */
#define CHECK_FAIL(call, x)                                                                        \
	do {                                                                                       \
		kvt_shim_fail((x).fn, 1, (x).err);                                                 \
		ck_assert_int_eq((call), (x).want);                                                \
		ck_assert_msg(strstr(kvt_last_error(), (x).fn), "%s: '%s'", (x).fn,                \
			      kvt_last_error());                                                   \
		ck_assert_uint_eq(kvt_shim_ctx_depth(), 0);                                        \
		kvt_shim_reset(1);                                                                 \
	} while (0)

START_TEST(driver_errors_map_to_errno)
{
	static const struct inject reg[] = {
	    {"cuPointerGetAttributes", CUDA_ERROR_INVALID_VALUE, -EINVAL},
	    {"cuDeviceGet", CUDA_ERROR_INVALID_DEVICE, -ENODEV},
	    {"cuDeviceGetUuid_v2", CUDA_ERROR_NO_DEVICE, -ENODEV},
	    {"cuCtxPushCurrent_v2", CUDA_ERROR_CONTEXT_IS_DESTROYED, -EINVAL},
	    {"cuMemGetAddressRange_v2", CUDA_ERROR_NOT_FOUND, -EINVAL},
	    {"cuIpcGetMemHandle", CUDA_ERROR_NOT_SUPPORTED, -EOPNOTSUPP},
	};
	static const struct inject alloc[] = {
	    {"cuDevicePrimaryCtxRetain", CUDA_ERROR_DEVICE_UNAVAILABLE, -EBUSY},
	    {"cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM},
	    {"cuIpcGetMemHandle", CUDA_ERROR_NOT_PERMITTED, -EPERM},
	};
	static const struct inject wait[] = {
	    {"cuStreamGetCtx", CUDA_ERROR_INVALID_HANDLE, -EINVAL},
	    {"cuCtxGetDevice", CUDA_ERROR_ILLEGAL_ADDRESS, -EIO},
	    {"cuIpcOpenEventHandle", CUDA_ERROR_UNKNOWN, -EIO},
	    {"cuStreamWaitEvent", CUDA_ERROR_STUB_LIBRARY, -EOPNOTSUPP},
	    {"cuStreamWaitEvent", (CUresult)12345, -EIO}, /* a code newer than libkvtier */
	};
	struct kvt_client *c = start("cuda");
	CUstream s = make_stream();
	struct kvt_buf *b;
	uint8_t *a;
	void *ev;

	ck_assert_int_eq(cudaMalloc((void **)&a, 1 << 20), cudaSuccess);
	kvt_shim_reset(1);
	for (size_t i = 0; i < sizeof(reg) / sizeof(reg[0]); i++)
		CHECK_FAIL(kvt_buf_register_cuda(c, a + 64, 4096, &b), reg[i]);
	/* A failed pop leaves the context pushed, as the driver would. */
	kvt_shim_fail("cuCtxPopCurrent_v2", 1, CUDA_ERROR_INVALID_CONTEXT);
	ck_assert_int_eq(kvt_buf_register_cuda(c, a + 64, 4096, &b), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "cuCtxPopCurrent_v2"));
	ck_assert_uint_eq(kvt_shim_ctx_depth(), 1);
	ck_assert_int_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
	kvt_shim_reset(1);
	/* A failure after cuMemAlloc frees the memory again. */
	for (size_t i = 0; i < sizeof(alloc) / sizeof(alloc[0]); i++) {
		unsigned allocs = kvt_shim_count("cuMemAlloc_v2");

		kvt_shim_fail(alloc[i].fn, 1, alloc[i].err);
		ck_assert_int_eq(kvt_buf_alloc_cuda(c, 0, 4096, &b), alloc[i].want);
		ck_assert_ptr_nonnull(strstr(kvt_last_error(), alloc[i].fn));
		ck_assert_uint_eq(kvt_shim_count("cuMemFree_v2"),
				  kvt_shim_count("cuMemAlloc_v2") - allocs -
				      (alloc[i].err == CUDA_ERROR_OUT_OF_MEMORY));
		ck_assert_uint_eq(kvt_shim_ctx_depth(), 0);
		kvt_shim_reset(1);
	}
	CHECK_FAIL(kvt_event_get_cuda(c, 0, &ev),
		   ((struct inject){"cuIpcOpenEventHandle", CUDA_ERROR_INVALID_HANDLE, -EINVAL}));
	for (size_t i = 0; i < sizeof(wait) / sizeof(wait[0]); i++)
		CHECK_FAIL(kvt_cuda_stream_wait(c, s), wait[i]);
	/* A failed free: the buffer is gone from the session all the same. */
	ck_assert_int_eq(kvt_buf_alloc_cuda(c, 0, 4096, &b), 0);
	kvt_shim_fail("cuMemFree_v2", 1, CUDA_ERROR_ILLEGAL_ADDRESS);
	ck_assert_int_eq(kvt_buf_free(c, b), -EIO);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "CUDA_ERROR_ILLEGAL_ADDRESS"));
	/* Nothing failed is left registered: everything above came and went. */
	for (int i = 0; i < 16; i++) /* buffers_per_session */
		ck_assert_int_eq(kvt_buf_register_cuda(c, a + 4096 * i, 4096, &b), 0);
	ck_assert_int_eq(kvt_buf_register_cuda(c, a, 4096, &b), -EMFILE);
	stop(c);
	cudaFree(a);
}
END_TEST

/* cuInit's failure is the driver's answer for the life of the process. */
START_TEST(driver_init_fails)
{
	struct kvt_client *c = start("cuda");
	struct kvt_buf *b;

	kvt_shim_fail("cuInit", 1, CUDA_ERROR_NO_DEVICE);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(kvt_buf_alloc_cuda(c, 0, 4096, &b), -ENODEV);
		ck_assert_ptr_nonnull(strstr(kvt_last_error(), "cuInit"));
	}
	ck_assert_uint_eq(kvt_shim_count("cuInit"), 1);
	stop(c);
}
END_TEST

/* No usable driver: -EOPNOTSUPP from every call, before the daemon is asked anything, with a
 * message that says what is missing. */
static void
expect_no_driver(const char *needle)
{
	struct kvt_client *c = start("cuda");
	struct kvt_buf *b;
	char host[64];
	void *ev;

	ck_assert_int_eq(kvt_buf_register_cuda(c, host, sizeof(host), &b), -EOPNOTSUPP);
	ck_assert_msg(strstr(kvt_last_error(), needle), "'%s' lacks '%s'", kvt_last_error(),
		      needle);
	ck_assert_int_eq(kvt_buf_alloc_cuda(c, 0, 4096, &b), -EOPNOTSUPP);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), needle));
	ck_assert_int_eq(kvt_event_get_cuda(c, 0, &ev), -EOPNOTSUPP);
	ck_assert_int_eq(kvt_cuda_stream_wait(c, NULL), -EOPNOTSUPP);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), needle));
	ck_assert_int_eq(kvt_nop(c), 0); /* the session is fine */
	stop(c);
}

START_TEST(no_driver_library)
{
	setenv("KVTIER_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
	expect_no_driver("no CUDA driver: /nonexistent/libcuda.so.1");
}
END_TEST

START_TEST(not_a_driver)
{
	setenv("KVTIER_LIBCUDA", "libm.so.6", 1);
	expect_no_driver("libm.so.6 has no cuInit");
}
END_TEST

/* The default, libcuda.so.1 through the loader's path: on a machine without a driver the
 * message names it; with one, host memory is refused as what it is. */
START_TEST(default_driver)
{
	void *h;

	unsetenv("KVTIER_LIBCUDA");
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) {
		expect_no_driver("libcuda.so.1");
	} else {
		struct kvt_client *c = start("cuda");
		struct kvt_buf *b;
		char host[64];

		ck_assert_int_eq(kvt_buf_register_cuda(c, host, sizeof(host), &b), -EINVAL);
		stop(c);
	}
}
END_TEST

/* The toolkit's stub libcuda.so (for linking only): every call answers
 * CUDA_ERROR_STUB_LIBRARY, which is no driver. Run as "check_cuda_client stub <path>". */
static const char *stub_path;

START_TEST(stub_driver)
{
	setenv("KVTIER_LIBCUDA", stub_path, 1);
	expect_no_driver("CUDA_ERROR_STUB_LIBRARY");
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "cuInit"));
}
END_TEST

int
main(int argc, char **argv)
{
	Suite *s = suite_create("cuda_client");
	TCase *t = tcase_create("client");

	tcase_set_timeout(t, 60);
	if (argc == 3 && !strcmp(argv[1], "stub")) {
		stub_path = argv[2];
		tcase_add_test(t, stub_driver);
		goto run;
	}
	tcase_add_test(t, register_at_start_and_inside);
	tcase_add_test(t, register_inside_offset_wrap);
	tcase_add_test(t, alloc_cuda_round_trip);
	tcase_add_test(t, stream_wait_on_session_event);
	tcase_add_test(t, stream_wait_host_backend);
	tcase_add_test(t, driver_errors_map_to_errno);
	tcase_add_test(t, driver_init_fails);
	tcase_add_test(t, no_driver_library);
	tcase_add_test(t, not_a_driver);
	tcase_add_test(t, default_driver);
run:
	suite_add_tcase(s, t);
	return kvt_check_run(s);
}
