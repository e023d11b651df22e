/* SPDX-License-Identifier: MIT */
/*
 * check_cuda_pool - the daemon's pool on the CUDA backend (fake runtime, cuda_shim.h): pinned in
 * chunks, all or nothing, and moved to cudaHostAlloc memory when the platform refuses to pin.
 */
#define _GNU_SOURCE
#include <check.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* A sysfs-shaped tree: the shim's GPU i is PCI function 0000:(3b + i):00.0; @nodes[i] its
 * numa_node. Returns the tree's path (KVT_SYSFS_PCI points there). */
static const char *
fake_sysfs(const int *nodes, int n)
{
	static char dir[128];
	char path[256];

	kvt_test_tmpdir(dir, sizeof(dir), "sysfs");
	for (int i = 0; i < n; i++) {
		FILE *f;

		snprintf(path, sizeof(path), "%s/0000:%02x:00.0", dir, 0x3b + i);
		ck_assert_int_eq(mkdir(path, 0755), 0);
		strcat(path, "/numa_node");
		f = fopen(path, "we");
		ck_assert_ptr_nonnull(f);
		fprintf(f, "%d\n", nodes[i]);
		fclose(f);
	}
	setenv("KVT_SYSFS_PCI", dir, 1);
	return dir;
}

/* The pool's memory policy: MPOL_BIND when numa_node bound it. */
static int
pool_policy(const struct kvtd_pool *pool)
{
	int mode = -1;

	ck_assert_int_eq(get_mempolicy(&mode, NULL, 0, pool->base, MPOL_F_ADDR), 0);
	return mode;
}

/* numa_node = auto binds the pool to the node the GPUs hang off, when sysfs names one node for
 * all of them; GPUs on two nodes, or a platform that does not say, bind nothing. */
START_TEST(pool_numa_auto)
{
	struct kvt_dev *dev = NULL;
	struct kvtd_pool pool;
	const int one[] = {0}, two[] = {0, 1};

	ck_assert_int_eq(kvt_dev_pci_numa_node(fake_sysfs(one, 1), "0000:3B:00.0"), 0);
	ck_assert_int_eq(kvt_dev_pci_numa_node(getenv("KVT_SYSFS_PCI"), "../3b"), -1);
	ck_assert_int_eq(kvt_dev_pci_numa_node(getenv("KVT_SYSFS_PCI"), "0000:3c:00.0"), -1);
	cfg.numa_node = -2;
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &dev), 0);
	ck_assert_int_eq(kvt_dev_numa_node(dev), 0);
	ck_assert_int_eq(kvtd_pool_init(&pool, &cfg, dev), 0);
	ck_assert_int_eq(pool.numa_node, 0);
	ck_assert_int_eq(pool_policy(&pool), MPOL_BIND);
	kvtd_pool_fini(&pool);
	kvt_dev_close(dev);

	kvt_shim_reset(2);
	fake_sysfs(two, 2);
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &dev), 0);
	ck_assert_int_eq(kvt_dev_numa_node(dev), -1);
	ck_assert_int_eq(kvtd_pool_init(&pool, &cfg, dev), 0);
	ck_assert_int_ne(pool_policy(&pool), MPOL_BIND);
	kvtd_pool_fini(&pool);
	kvt_dev_close(dev);

	setenv("KVT_SYSFS_PCI", "/nonexistent", 1);
	kvt_shim_reset(1);
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_CUDA, &dev), 0);
	ck_assert_int_eq(kvt_dev_numa_node(dev), -1);
	kvt_dev_close(dev);
	ck_assert_int_eq(kvt_dev_open(KVT_DEV_HOST, &dev), 0);
	ck_assert_int_eq(kvt_dev_numa_node(dev), -1);
	kvt_dev_close(dev);
}
END_TEST

KVT_CHECK_MAIN("cuda_pool", 0, setup, NULL, pool_pinned_in_chunks, pool_third_chunk_fails_cleanly,
	       pool_numa_auto, pool_moves_to_host_alloc_when_pinning_refused)
