/* SPDX-License-Identifier: MIT */
/*
 * check_cuda_pool - the daemon's pool on the CUDA backend (fake runtime, cuda_shim.h): pinned in
 * chunks, all or nothing, and moved to cudaHostAlloc memory when the platform refuses to pin.
 */
#define _GNU_SOURCE
#include <check.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cuda_shim.h"
#include "kvt_dev.h"
#include "pool.h"
#include "kvt_test.h"

#define MIB (1ull << 20)

static struct kvtd_config cfg;

static void
setup(void)
{
	kvt_shim_reset(1);
	memset(&cfg, 0, sizeof(cfg));
	cfg.pool_size = 6 * MIB; /* three 2 MiB registration chunks in this test build */
	cfg.chunk_size = 2 * MIB;
	cfg.numa_node = -1;
}

START_TEST(pool_pinned_in_chunks)
{
	struct kvt_dev *dev = NULL;
	struct kvtd_pool pool;

	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &dev), 0);
	ck_assert_int_eq(kvtd_pool_init(&pool, &cfg, dev), 0);
	ck_assert_uint_eq(kvt_shim_count("cudaHostRegister"), 3);
	ck_assert_uint_eq(kvt_shim_registered(), 3);
	kvtd_pool_fini(&pool);
	ck_assert_uint_eq(kvt_shim_count("cudaHostUnregister"), 3);
	ck_assert_uint_eq(kvt_shim_registered(), 0);
	kvt_dev_close(dev);
}
END_TEST

START_TEST(pool_third_chunk_fails_cleanly)
{
	struct kvt_dev *dev = NULL;
	struct kvtd_pool pool;
	char want[256];
	const char *log, *u1, *u0;

	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &dev), 0);
	kvt_shim_fail("cudaHostRegister", 3, cudaErrorMemoryAllocation);
	ck_assert_int_eq(kvtd_pool_init(&pool, &cfg, dev), -ENOMEM);
	ck_assert_ptr_null(pool.base);
	ck_assert_uint_eq(kvt_shim_registered(), 0);
	log = kvt_shim_log();
	/* The two pinned chunks come off in reverse order: the second, then the first. */
	ck_assert_uint_eq(kvt_shim_count("cudaHostUnregister"), 2);
	u1 = strstr(log, "cudaHostUnregister");
	u0 = strstr(u1 + 1, "cudaHostUnregister");
	ck_assert_ptr_nonnull(u0);
	{
		void *p1, *p0;

		ck_assert_int_eq(sscanf(u1, "cudaHostUnregister p=%p", &p1), 1);
		ck_assert_int_eq(sscanf(u0, "cudaHostUnregister p=%p", &p0), 1);
		ck_assert_ptr_eq((char *)p1, (char *)p0 + 2 * MIB);
		snprintf(want, sizeof(want), "cudaHostRegister p=%p len=2097152", p0);
		ck_assert_ptr_nonnull(strstr(log, want));
	}
	kvt_dev_close(dev);
}
END_TEST

START_TEST(pool_moves_to_host_alloc_when_pinning_refused)
{
	struct kvt_dev *dev = NULL;
	struct kvtd_pool pool;
	void *slots[4];
	int cls;

	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &dev), 0);
	kvt_shim_fail("cudaHostRegister", 1, cudaErrorNotSupported);
	ck_assert_int_eq(kvtd_pool_init(&pool, &cfg, dev), 0);
	ck_assert_str_eq(pool.backing, "cuda-host-alloc");
	ck_assert_uint_eq(kvt_shim_count("cudaHostAlloc"), 3); /* 2 lane descriptors at open */
	cls = kvtd_pool_class_get(&pool, 4096);
	ck_assert_int_ge(cls, 0);
	ck_assert_int_eq(kvtd_pool_alloc(&pool, cls, 4, NULL, NULL, slots), 0);
	memset(slots[3], 0xab, 4096);
	{
		struct cudaPointerAttributes a;

		ck_assert_int_eq(cudaPointerGetAttributes(&a, slots[3]), cudaSuccess);
		ck_assert_int_eq(a.type, cudaMemoryTypeHost);
	}
	kvtd_pool_free(&pool, cls, 4, NULL, NULL, slots);
	kvtd_pool_class_put(&pool, cls);
	kvtd_pool_fini(&pool);
	ck_assert_uint_eq(kvt_shim_count("cudaFreeHost"), 1);
	kvt_dev_close(dev);
}
END_TEST

KVT_CHECK_MAIN("cuda_pool", 0, setup, NULL, pool_pinned_in_chunks, pool_third_chunk_fails_cleanly,
	       pool_moves_to_host_alloc_when_pinning_refused)
