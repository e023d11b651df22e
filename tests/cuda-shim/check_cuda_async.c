/* SPDX-License-Identifier: MIT */
/*
 * check_cuda_async - copies that complete after the call returns (the fake runtime queues them,
 * cuda_shim.h; kvt_shim_hold() keeps them queued): fences count batches and complete only when
 * the batch has run, the pool keeps a slot a queued copy still reads out of circulation until
 * then (also when an allocation would otherwise fail), and releasing a client buffer or the
 * pool waits for the copies still using it.
 */
#define _GNU_SOURCE
#include <check.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "cuda_shim.h"
#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvt_test.h"
#include "pool.h"

#define MIB  (1ull << 20)
#define SLOT 4096

struct client {
	pid_t pid;
	int ctl;
	struct kvt_dev_import imp;
};

/* A process owning @size bytes of device memory; its IPC import in c->imp. */
static void
client_start(struct client *c, uint64_t size)
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
		memcpy(imp.ipc_handle, h.reserved, 64);
		memcpy(imp.device_uuid, prop.uuid.bytes, 16);
		if (write(up[1], &imp, sizeof(imp)) != sizeof(imp))
			_exit(1);
		if (read(down[0], &b, 1) < 0)
			_exit(1);
		_exit(0);
	}
	close(up[1]);
	close(down[0]);
	ck_assert_int_eq(read(up[0], &c->imp, sizeof(c->imp)), sizeof(c->imp));
	close(up[0]);
	c->ctl = down[1];
}

static void
client_stop(struct client *c)
{
	int st;

	ck_assert_int_eq(write(c->ctl, "x", 1), 1);
	close(c->ctl);
	waitpid(c->pid, &st, 0);
}

struct fix {
	struct kvtd_config cfg;
	struct kvt_dev *dev;
	struct kvtd_pool pool;
	struct client c;
	struct kvt_dev_buf *buf;
	int cls;
};

static void
fix_start(struct fix *f, uint64_t pool_size)
{
	kvt_shim_reset(1);
	memset(f, 0, sizeof(*f));
	f->cfg.pool_size = pool_size;
	f->cfg.chunk_size = 2 * MIB;
	f->cfg.numa_node = -1;
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &f->dev), 0);
	ck_assert_int_eq(kvtd_pool_init(&f->pool, &f->cfg, f->dev), 0);
	f->cls = kvtd_pool_class_get(&f->pool, SLOT);
	ck_assert_int_ge(f->cls, 0);
	client_start(&f->c, 2 * MIB);
	ck_assert_int_eq(kvt_dev_buf_import(f->dev, &f->c.imp, &f->buf), 0);
}

static void
fix_stop(struct fix *f)
{
	kvt_shim_hold(0);
	kvt_dev_buf_put(f->buf);
	client_stop(&f->c);
	kvtd_pool_class_put(&f->pool, f->cls);
	kvtd_pool_fini(&f->pool);
	kvt_dev_close(f->dev);
	ck_assert_uint_eq(kvt_shim_hazards(), 0);
}

/* Device bytes [off, off+len) read back through a d2h copy into pool slot @tmp. */
static const uint8_t *
dev_read(struct fix *f, uint64_t off, uint32_t len, void *tmp)
{
	struct kvt_dev_copy row = {.buf_off = off, .host = tmp, .len = len};

	ck_assert_int_eq(kvt_dev_copy_d2h(f->dev, f->buf, &row, 1), 0);
	ck_assert_int_eq(kvt_dev_sync(f->dev), 0);
	return tmp;
}

START_TEST(fences_follow_the_queue)
{
	struct fix f;
	void *s[2];
	struct kvt_dev_copy rows[2];
	uint64_t f1, f2;

	fix_start(&f, 4 * MIB);
	ck_assert_int_eq(kvtd_pool_alloc(&f.pool, f.cls, 2, NULL, NULL, s), 0);
	ck_assert_uint_eq(kvt_dev_fence(f.dev), 0);
	kvt_shim_hold(1);
	rows[0] = (struct kvt_dev_copy){.buf_off = 8192, .host = s[0], .len = SLOT};
	rows[1] = (struct kvt_dev_copy){.buf_off = 0, .host = s[1], .len = SLOT};
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 2), 0); /* a kernel */
	f1 = kvt_dev_fence(f.dev);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, 1), 0); /* a memcpy */
	f2 = kvt_dev_fence(f.dev);
	ck_assert_uint_eq(f2, f1 + 1);
	ck_assert_uint_lt(kvt_dev_fence_done(f.dev), f1);
	/* Nothing waited for the device: the batches are still queued. */
	ck_assert_uint_eq(kvt_shim_queued(), 2);
	ck_assert_uint_eq(kvt_shim_count("cudaEventSynchronize"), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaStreamSynchronize"), 0);
	ck_assert_int_eq(kvt_dev_fence_wait(f.dev, f1), 0);
	ck_assert_uint_ge(kvt_dev_fence_done(f.dev), f1);
	ck_assert_uint_lt(kvt_dev_fence_done(f.dev), f2);
	ck_assert_uint_eq(kvt_shim_queued(), 1);
	kvt_shim_run();
	ck_assert_uint_eq(kvt_dev_fence_done(f.dev), f2);
	kvtd_pool_free(&f.pool, f.cls, 2, NULL, NULL, s);
	fix_stop(&f);
}
END_TEST

/* The host backend copies before returning: its fences are always done. */
START_TEST(host_fences_always_done)
{
	struct kvt_dev *dev = NULL;

	ck_assert_int_eq(kvt_dev_open(KVT_DEV_HOST, &dev), 0);
	ck_assert_uint_eq(kvt_dev_fence(dev), 0);
	ck_assert_uint_eq(kvt_dev_fence_done(dev), 0);
	ck_assert_int_eq(kvt_dev_fence_wait(dev, 0), 0);
	kvt_dev_close(dev);
}
END_TEST

/*
 * A FETCH-like h2d reads slot A; A is freed (RETIER, eviction) while the copy is queued. The
 * next allocation must not hand A out (its new owner would write it before the copy reads it),
 * and the device must receive A's old bytes. Once the copy has run, A comes back.
 */
static void
slot_freed_while_read(unsigned nrows)
{
	struct fix f;
	struct kvt_dev_copy rows[2];
	void *a[2], *b[2], *tmp, *again[2];
	const uint8_t *got;

	fix_start(&f, 4 * MIB);
	ck_assert_int_eq(kvtd_pool_alloc(&f.pool, f.cls, 1, NULL, NULL, &tmp), 0);
	ck_assert_int_eq(kvtd_pool_alloc(&f.pool, f.cls, nrows, NULL, NULL, a), 0);
	for (unsigned i = 0; i < nrows; i++) {
		memset(a[i], 0xa0 + i, SLOT);
		rows[i] = (struct kvt_dev_copy){
		    .buf_off = (uint64_t)(nrows - i) * 2 * SLOT, .host = a[i], .len = SLOT};
	}
	kvt_shim_hold(1);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, rows, nrows), 0);
	kvtd_pool_free(&f.pool, f.cls, nrows, NULL, NULL, a);
	ck_assert_int_eq(kvtd_pool_alloc(&f.pool, f.cls, nrows, NULL, NULL, b), 0);
	for (unsigned i = 0; i < nrows; i++) {
		for (unsigned j = 0; j < nrows; j++)
			ck_assert_ptr_ne(b[i], a[j]);
		memset(b[i], 0x55, SLOT); /* the new owner writes at once */
	}
	kvt_shim_hold(0);
	for (unsigned i = 0; i < nrows; i++) {
		got = dev_read(&f, rows[i].buf_off, SLOT, tmp);
		ck_assert_uint_eq(got[0], 0xa0 + i);
		ck_assert_uint_eq(got[SLOT - 1], 0xa0 + i);
	}
	/* Completed: the quarantined slots are handed out again. */
	ck_assert_int_eq(kvtd_pool_alloc(&f.pool, f.cls, nrows, NULL, NULL, again), 0);
	for (unsigned i = 0; i < nrows; i++)
		ck_assert(again[i] == a[0] || again[i] == a[nrows - 1]);
	kvtd_pool_free(&f.pool, f.cls, nrows, NULL, NULL, again);
	kvtd_pool_free(&f.pool, f.cls, nrows, NULL, NULL, b);
	kvtd_pool_free(&f.pool, f.cls, 1, NULL, NULL, &tmp);
	fix_stop(&f);
}

START_TEST(slot_freed_while_read_by_kernel)
{
	slot_freed_while_read(2);
}
END_TEST

START_TEST(slot_freed_while_read_by_memcpy)
{
	slot_freed_while_read(1);
}
END_TEST

/* An allocation that would fail for want of slots waits for the oldest quarantined fence
 * instead of failing, and gets the slots only once the copies reading them have run. */
START_TEST(full_pool_waits_for_the_copy)
{
	struct fix f;
	uint32_t per_chunk = 2 * MIB / SLOT;
	void **all = malloc(per_chunk * sizeof(void *)), *x;
	struct kvt_dev_copy row;
	struct kvtd_pool_usage u;

	fix_start(&f, 2 * MIB);
	ck_assert_int_eq(kvtd_pool_alloc(&f.pool, f.cls, per_chunk, NULL, NULL, all), 0);
	memset(all[7], 0x3c, SLOT);
	row = (struct kvt_dev_copy){.buf_off = 0, .host = all[7], .len = SLOT};
	kvt_shim_hold(1);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, &row, 1), 0);
	kvtd_pool_free(&f.pool, f.cls, 1, NULL, NULL, &all[7]);
	ck_assert_uint_eq(kvt_shim_queued(), 1);
	ck_assert_int_eq(kvtd_pool_alloc(&f.pool, f.cls, 1, NULL, NULL, &x), 0);
	ck_assert_ptr_eq(x, all[7]);
	ck_assert_uint_eq(kvt_shim_queued(), 0); /* it waited for the copy */
	kvtd_pool_usage(&f.pool, &u);
	ck_assert_uint_eq(u.used, 2 * MIB);
	all[7] = x;
	kvtd_pool_free(&f.pool, f.cls, per_chunk, NULL, NULL, all);
	kvtd_pool_usage(&f.pool, &u);
	ck_assert_uint_eq(u.used, 0);
	free(all);
	fix_stop(&f);
}
END_TEST

/* The last reference to a client buffer and the pool's unpinning wait for queued copies. */
START_TEST(release_waits_for_queued_copies)
{
	struct fix f;
	struct kvt_dev_copy row;
	void *s;

	fix_start(&f, 4 * MIB);
	ck_assert_int_eq(kvtd_pool_alloc(&f.pool, f.cls, 1, NULL, NULL, &s), 0);
	row = (struct kvt_dev_copy){.buf_off = 0, .host = s, .len = SLOT};
	kvt_shim_hold(1);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, &row, 1), 0);
	kvt_dev_buf_put(f.buf); /* a session ending, a buffer unregistered */
	f.buf = NULL;
	ck_assert_uint_eq(kvt_shim_hazards(), 0);
	ck_assert_uint_eq(kvt_shim_queued(), 0);
	ck_assert_int_eq(kvt_dev_buf_import(f.dev, &f.c.imp, &f.buf), 0);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, &row, 1), 0);
	kvtd_pool_free(&f.pool, f.cls, 1, NULL, NULL, &s); /* quarantined */
	kvt_dev_buf_put(f.buf);
	f.buf = NULL;
	ck_assert_int_eq(kvt_dev_buf_import(f.dev, &f.c.imp, &f.buf), 0);
	ck_assert_int_eq(kvt_dev_copy_h2d(f.dev, f.buf, &row, 1), 0);
	fix_stop(&f); /* the pool unpins with the copy still queued */
}
END_TEST

KVT_CHECK_MAIN("cuda_async", 60, NULL, NULL, fences_follow_the_queue, host_fences_always_done,
	       slot_freed_while_read_by_kernel, slot_freed_while_read_by_memcpy,
	       full_pool_waits_for_the_copy, release_waits_for_queued_copies)
