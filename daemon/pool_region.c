/* SPDX-License-Identifier: MIT */
/*
 * pool_region.c - the pool's mapped region: one memfd of [pool] size bytes, mapped shared,
 * bound to a NUMA node, faulted in, locked and registered with the device layer, once at start
 * (kvtd_pool_init()) or, after a restart, taken over from the previous process with its bytes
 * (kvtd_pool_adopt()). The slab allocator inside it is pool.c (pool_int.h).
 *
 * Guarantees:
 *   - What the host cannot back (memory, locked-memory limit, huge pages) is refused before the
 *     mapping is touched, with a message saying what to change; nothing is left behind.
 *   - The region is a memfd mapped shared, so that a restart hands it to the next process with
 *     every row in place (restart.c); only a device that pins nothing but its own allocations
 *     moves it out of the memfd ("cuda-host-alloc"), and such a pool cannot be adopted.
 *   - With a NUMA node, the range is bound before its first touch. With lock = yes every page
 *     is resident and locked when kvtd_pool_init() returns (an adopted pool: locked as pages
 *     are mapped, all of them mapped by kvtd_pool_populate()'s thread).
 *   - Every step that fails undoes the ones before it: a failed init or adopt leaves nothing
 *     mapped, locked or registered, and an adopted memfd stays the caller's.
 *   - kvtd_pool_fini() lets the quarantined slots' device copies complete before the region is
 *     unregistered and unmapped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "kvt_dev.h"
#include "log.h"
#include "pool_int.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

struct touch_arg {
	uint8_t *p;
	uint64_t len;
	int err; /* -errno of a failed populate */
};

static void *
touch_thread(void *arg)
{
	struct touch_arg *t = arg;

	/* Faulted in on this thread's node (first touch). The kernel's populate reports a page it
	 * cannot supply as an error (EFAULT where a write would raise SIGBUS: hugetlb pages that
	 * ran out); only kernels without it (EINVAL) get the write loop. */
	if (!t->len || madvise(t->p, t->len, MADV_POPULATE_WRITE) == 0)
		return NULL;
	if (errno != EINVAL) {
		t->err = -errno;
		return NULL;
	}
	for (uint64_t off = 0; off < t->len; off += 4096)
		t->p[off] = 0;
	return NULL;
}

/* First touch in parallel: a GiB-sized pool takes seconds to fault in from one thread.
 * Returns 0 or the first range's -errno. */
static int
pool_touch(uint8_t *p, uint64_t len, uint64_t chunk)
{
	enum { MAX_THREADS = 8 };
	pthread_t th[MAX_THREADS];
	struct touch_arg args[MAX_THREADS];
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = ncpu > 0 ? (unsigned)ncpu : 1, started = 0;
	uint64_t per;

	if (n > MAX_THREADS)
		n = MAX_THREADS;
	if (len < (256ull << 20))
		n = 1;
	per = (len / n + chunk - 1) / chunk * chunk;
	for (unsigned i = 0; i < n; i++) {
		uint64_t off = per * i;

		args[i].p = p + off;
		args[i].len = off >= len ? 0 : (len - off < per ? len - off : per);
		args[i].err = 0;
		if (pthread_create(&th[i], NULL, touch_thread, &args[i]) == 0)
			started++;
		else
			touch_thread(&args[i]);
		if (started != i + 1) /* keep thread indices dense for the joins below */
			break;
	}
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	for (unsigned i = started; i < n; i++)
		touch_thread(&args[i]);
	for (unsigned i = 0; i < n; i++)
		if (args[i].err)
			return args[i].err;
	return 0;
}

/* A /proc/meminfo field (KiB, or a count for HugePages_*); -1 when absent. */
static long long
meminfo_get(const char *key)
{
	char line[256];
	size_t klen = strlen(key);
	long long v = -1;
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, klen) && line[klen] == ':') {
			v = atoll(line + klen + 1);
			break;
		}
	fclose(f);
	return v;
}

/* A number from one sysfs file; -1 when unreadable. */
static long long
sysfs_get(const char *path)
{
	long long v = -1;
	FILE *f = fopen(path, "re");

	if (!f)
		return -1;
	if (fscanf(f, "%lld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

/*
 * Are there enough free huge pages of the default size (what MAP_HUGETLB draws from), on
 * @node when the pool is bound to one? Without them the mapping's first touch dies of SIGBUS,
 * so this is checked before mapping, and the message says how to reserve them. @quiet
 * (hugetlb = auto): no message, the caller falls back to other pages.
 */
static int
hugetlb_check(uint64_t size, int node, int quiet)
{
	long long page_kb = meminfo_get("Hugepagesize"), total = meminfo_get("HugePages_Total");
	long long avail = meminfo_get("HugePages_Free") - meminfo_get("HugePages_Rsvd");
	unsigned long long need;
	char path[128];

	if (page_kb <= 0 || total < 0) {
		if (!quiet)
			log_err("pool: hugetlb = yes, but this kernel reports no huge pages "
				"(/proc/meminfo); set [pool] hugetlb = no");
		return -EOPNOTSUPP;
	}
	if (size % ((uint64_t)page_kb << 10)) {
		if (!quiet)
			log_err("pool: size %llu KiB is not a multiple of the huge page size (%lld "
				"KiB)",
				(unsigned long long)(size >> 10), page_kb);
		return -EINVAL;
	}
	need = size / ((uint64_t)page_kb << 10);
	if (node >= 0) {
		long long node_free;

		snprintf(
		    path, sizeof(path),
		    "/sys/devices/system/node/node%d/hugepages/hugepages-%lldkB/free_hugepages",
		    node, page_kb);
		node_free = sysfs_get(path);
		if (node_free >= 0 && node_free < avail)
			avail = node_free;
	}
	if (avail < 0)
		avail = 0;
	if ((unsigned long long)avail >= need)
		return 0;
	if (quiet)
		return -ENOMEM;
	if (node >= 0)
		log_err("pool: hugetlb = yes needs %llu huge pages of %lld KiB on NUMA node %d, "
			"%lld are free there: reserve them (echo N > %.*snr_hugepages, N at least "
			"%llu more than now; or sysctl vm.nr_hugepages) or set [pool] hugetlb = no",
			need, page_kb, node, avail, (int)(strrchr(path, '/') - path + 1), path,
			need - (unsigned long long)avail);
	else
		log_err("pool: hugetlb = yes needs %llu huge pages of %lld KiB, %lld are free: "
			"reserve them (sysctl vm.nr_hugepages=%llu, or hugepages=N on the kernel "
			"command line) or set [pool] hugetlb = no",
			need, page_kb, avail,
			(unsigned long long)total + need - (unsigned long long)avail);
	return -ENOMEM;
}

/* Does the kernel give shared memory (the pool's memfd) transparent huge pages on
 * MADV_HUGEPAGE? shmem_enabled "never" or "deny" say no, whatever madvise returns. */
static int
shmem_thp_allowed(void)
{
	char line[128];
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
	int ok = 0;

	if (!f)
		return 0;
	if (fgets(line, sizeof(line), f))
		ok = !strstr(line, "[never]") && !strstr(line, "[deny]");
	fclose(f);
	return ok;
}

/* Does the process hold CAP_IPC_LOCK (mlock beyond RLIMIT_MEMLOCK)? */
static int
has_cap_ipc_lock(void)
{
	unsigned long long eff = 0;
	char line[256];
	FILE *f = fopen("/proc/self/status", "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &eff) == 1)
			break;
	fclose(f);
	return (eff >> 14) & 1; /* CAP_IPC_LOCK, linux/capability.h */
}

/*
 * Can this host hold the pool? Checked before the mapping is touched: past MemAvailable the
 * touch grows until the OOM killer acts (and the unit's OOMScoreAdjust makes it pick other
 * processes first); past RLIMIT_MEMLOCK the mlock after the touch fails anyway. hugetlb pages
 * are not in MemAvailable: hugetlb_check() counts them.
 */
static int
pool_fit_check(const struct kvtd_config *cfg, int hugetlb)
{
	struct rlimit rl;

	if (!hugetlb && !cfg->overcommit) {
		long long avail_kb = meminfo_get("MemAvailable");

		if (avail_kb >= 0 && cfg->pool_size > (uint64_t)avail_kb << 10) {
			log_err("pool: size %llu MiB is more than this host's available memory "
				"(MemAvailable %llu MiB in /proc/meminfo): lower [pool] size "
				"(--pool-size), free memory, or set [pool] overcommit = yes "
				"(--pool-overcommit yes) to start anyway",
				(unsigned long long)(cfg->pool_size >> 20),
				(unsigned long long)avail_kb >> 10);
			return -ENOMEM;
		}
	}
	if (cfg->lock && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    cfg->pool_size > rl.rlim_cur && !has_cap_ipc_lock()) {
		log_err("pool: size %llu MiB is above the locked-memory limit (RLIMIT_MEMLOCK %llu "
			"KiB) and kvtierd lacks CAP_IPC_LOCK: raise LimitMEMLOCK= (systemd) or "
			"ulimit -l, grant CAP_IPC_LOCK, or set [pool] lock = no",
			(unsigned long long)(cfg->pool_size >> 20),
			(unsigned long long)(rl.rlim_cur >> 10));
		return -EPERM;
	}
	return 0;
}

/*
 * pool_map() and its steps: map pool->fd, bind, touch, lock and register it, then set up the
 * slab allocator's chunks (every chunk free). Each step that fails logs why and returns -errno;
 * pool_map() undoes the steps before it.
 */

/* Maps pool->fd and says what pages back it (pool->backing, pool->page_kib). */
static int
region_mmap(struct kvtd_pool *pool, int adopt)
{
	int r;

	if (pool->hugetlb) {
		/* Reserved (no MAP_NORESERVE): pages taken since the check fail the mmap with
		 * ENOMEM instead of the first touch with SIGBUS. */
		pool->base =
		    mmap(NULL, pool->size, PROT_READ | PROT_WRITE, MAP_SHARED, pool->fd, 0);
		if (pool->base == MAP_FAILED) {
			r = -errno;
			log_err("pool: hugetlb mapping of %llu MiB failed: %s (reserve more huge "
				"pages: sysctl vm.nr_hugepages=N; or set [pool] hugetlb = no)",
				(unsigned long long)(pool->size >> 20), strerror(-r));
			return r;
		}
		pool->backing = "hugetlb";
		pool->page_kib = (unsigned)meminfo_get("Hugepagesize");
		return 0;
	}
	pool->base =
	    mmap(NULL, pool->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, pool->fd, 0);
	if (pool->base == MAP_FAILED) {
		r = -errno;
		log_err("pool: mapping %llu MiB failed: %s", (unsigned long long)(pool->size >> 20),
			strerror(-r));
		return r;
	}
	/* THP for shared memory needs MADV_HUGEPAGE and shmem_enabled advise, within_size,
	 * always or force; the kernel then backs the pool with PMD-sized pages as it can. */
	if (madvise(pool->base, pool->size, MADV_HUGEPAGE) == 0 && shmem_thp_allowed()) {
		pool->backing = "thp";
		pool->page_kib = 2048;
	} else {
		pool->backing = "shmem";
		pool->page_kib = 4;
	}
	if (!adopt && pool->page_kib == 4)
		log_notice("pool: 4 KiB pages (transparent huge pages are off for shared "
			   "memory: /sys/kernel/mm/transparent_hugepage/shmem_enabled), so a "
			   "random row gather takes about one TLB miss per row; for huge pages "
			   "set shmem_enabled to advise (kvtier-thp.conf, kvtierd.conf(5)) or "
			   "reserve huge pages (vm.nr_hugepages: [pool] hugetlb = auto uses "
			   "them)");
	return 0;
}

/* Binds the range before the first touch so pages come from the node that serves the GPU:
 * "auto" asks the device layer for the GPUs' node; with no GPU, or GPUs on several nodes, it
 * leaves placement to first touch on the daemon's own node. */
static int
region_bind(struct kvtd_pool *pool, const struct kvtd_config *cfg, struct kvt_dev *dev)
{
	int node = cfg->numa_node;

	if (node == -2)
		node = dev && numa_available() >= 0 ? kvt_dev_numa_node(dev) : -1;
	if (node < 0)
		return 0;
	if (numa_available() < 0 || node > numa_max_node()) {
		log_err("pool: NUMA node %d not available", node);
		return -EINVAL;
	}
	numa_tonode_memory(pool->base, pool->size, node);
	pool->numa_node = node;
	return 0;
}

/* Faults every page in (pool_touch()). Adopted pages are all there already: mlock maps them,
 * or the first use does. */
static int
region_fault_in(struct kvtd_pool *pool, int adopt)
{
	int r = adopt ? 0 : pool_touch(pool->base, pool->size, pool->chunk_size);

	if (r < 0)
		log_err("pool: faulting in %llu MiB failed: %s%s",
			(unsigned long long)(pool->size >> 20), strerror(-r),
			pool->hugetlb ? " (huge pages ran out: reserve more with sysctl "
					"vm.nr_hugepages=N, or set [pool] hugetlb = no)"
				      : "");
	return r;
}

/* Locks the range with lock = yes (pool->locked). */
static int
region_lock(struct kvtd_pool *pool, const struct kvtd_config *cfg, int adopt)
{
	int r;

	if (!cfg->lock)
		return 0;
	/* Adopted: the restart's pause must not grow with the pool, so pages are locked as they
	 * are mapped, and mapped all from a thread once the daemon serves (kvtd_pool_populate()).
	 * Otherwise every page is there (pool_touch()): flags 0 is mlock(). */
	if (mlock2(pool->base, pool->size, adopt ? MLOCK_ONFAULT : 0) < 0) {
		r = -errno;
		log_err("pool: mlock of %llu MiB failed: %s (raise LimitMEMLOCK / ulimit -l, "
			"grant CAP_IPC_LOCK, or set [pool] lock = no)",
			(unsigned long long)(pool->size >> 20), strerror(-r));
		return r;
	}
	pool->locked = 1;
	return 0;
}

/* An unbound pool: the node its pages landed on, read back for status. */
static void
region_read_node(struct kvtd_pool *pool)
{
	int node = -1;

	if (pool->numa_node >= 0 || numa_available() < 0)
		return;
	if (get_mempolicy(&node, NULL, 0, pool->base, MPOL_F_NODE | MPOL_F_ADDR) == 0)
		pool->numa_node = node;
}

/* Registers the range with the device layer (pool->dev), or moves the pool into the device's
 * own pinned allocation where the platform pins nothing else (pool->dev_alloc). */
static int
region_register(struct kvtd_pool *pool, struct kvt_dev *dev)
{
	int r;

	if (!dev)
		return 0;
	r = kvt_dev_host_register(dev, pool->base, pool->size);
	if (r == -EOPNOTSUPP && pool->fd >= 0) {
		/* The platform pins only memory the driver allocates: the pool moves there, losing
		 * hugetlb/THP, the NUMA binding (the driver places the pages) and restarts (the
		 * memory is not a memfd the next process can map). */
		void *p;

		r = kvt_dev_host_alloc(dev, pool->size, &p);
		if (r == 0) {
			if (pool->locked)
				munlock(pool->base, pool->size);
			munmap(pool->base, pool->size);
			close(pool->fd);
			pool->fd = -1;
			pool->base = p;
			pool->locked = 0;
			pool->dev_alloc = 1;
			pool->backing = "cuda-host-alloc";
			pool->page_kib = 4; /* the driver's pages: not known to be huge */
			log_warn("pool: pinned by %s allocation instead of registration",
				 kvt_dev_name(dev));
		}
	}
	if (r < 0) {
		log_err("pool: registering with the %s backend failed: %s", kvt_dev_name(dev),
			strerror(-r));
		return r;
	}
	pool->dev = dev;
	return 0;
}

/*
 * The pool is a memfd mapped shared, not anonymous memory, so that a restart can hand it to the
 * next process (restart.c) with every row in place. @adopt: the previous process's memfd, its
 * pages already there.
 */
static int
pool_map(struct kvtd_pool *pool, const struct kvtd_config *cfg, struct kvt_dev *dev, int adopt)
{
	int r;

	r = region_mmap(pool, adopt);
	if (r < 0)
		goto err;
	r = region_bind(pool, cfg, dev);
	if (r < 0)
		goto err_unmap;
	r = region_fault_in(pool, adopt);
	if (r < 0)
		goto err_unmap;
	r = region_lock(pool, cfg, adopt);
	if (r < 0)
		goto err_unmap;
	region_read_node(pool);
	r = region_register(pool, dev);
	if (r < 0)
		goto err_munlock;
	r = pool_slab_init(pool);
	if (r < 0)
		goto err_unregister;
	log_notice("pool: %llu MiB, %u chunks of %llu KiB, backing %s (%u KiB pages), NUMA node "
		   "%d, %s",
		   (unsigned long long)(pool->size >> 20), pool->n_chunks,
		   (unsigned long long)(pool->chunk_size >> 10), pool->backing, pool->page_kib,
		   pool->numa_node, pool->locked ? "locked" : "not locked");
	return 0;

err_unregister:
	if (pool->dev_alloc) {
		kvt_dev_host_free(dev, pool->base, pool->size);
		goto err;
	}
	if (pool->dev)
		kvt_dev_host_unregister(dev, pool->base, pool->size);
err_munlock:
	if (pool->locked)
		munlock(pool->base, pool->size);
err_unmap:
	munmap(pool->base, pool->size);
err:
	pool->base = NULL;
	return r;
}
static void
pool_prep(struct kvtd_pool *pool, uint64_t size, uint64_t chunk_size)
{
	memset(pool, 0, sizeof(*pool));
	pool->size = size;
	pool->chunk_size = chunk_size;
	pool->n_chunks = (uint32_t)(size / chunk_size);
	pool->numa_node = -1;
	pool->fd = -1;
	pthread_mutex_init(&pool->lock, NULL);
}

int
kvtd_pool_init(struct kvtd_pool *pool, const struct kvtd_config *cfg, struct kvt_dev *dev)
{
	int r;

	if (!cfg->pool_size || cfg->pool_size % cfg->chunk_size) {
		memset(pool, 0, sizeof(*pool));
		pool->fd = -1;
		return -EINVAL;
	}
	pool_prep(pool, cfg->pool_size, cfg->chunk_size);
	/* hugetlb = auto takes reserved huge pages when they cover the pool (an operator who
	 * reserved them meant them for a pool like this one), else falls back quietly. */
	if (cfg->hugetlb == KVTD_HUGETLB_YES) {
		r = hugetlb_check(pool->size, cfg->numa_node, 0);
		if (r < 0)
			goto err_lock;
		pool->hugetlb = 1;
	} else {
		pool->hugetlb = cfg->hugetlb == KVTD_HUGETLB_AUTO &&
				hugetlb_check(pool->size, cfg->numa_node, 1) == 0;
	}
	r = pool_fit_check(cfg, pool->hugetlb);
	if (r < 0)
		goto err_lock;
retry:
	pool->fd = memfd_create("kvtier-pool", MFD_CLOEXEC | (pool->hugetlb ? MFD_HUGETLB : 0));
	if (pool->fd < 0) {
		r = -errno;
		log_err("pool: memfd_create%s failed: %s", pool->hugetlb ? " (hugetlb)" : "",
			strerror(-r));
		goto err_lock;
	}
	if (ftruncate(pool->fd, (off_t)pool->size) < 0) {
		r = -errno;
		log_err("pool: sizing the pool memfd to %llu MiB failed: %s",
			(unsigned long long)(pool->size >> 20), strerror(-r));
		goto err_close;
	}
	r = pool_map(pool, cfg, dev, 0);
	if (r == -ENOMEM && pool->hugetlb && cfg->hugetlb == KVTD_HUGETLB_AUTO) {
		/* Someone took the huge pages since the check: auto means "if there are any". */
		log_notice("pool: the reserved huge pages went elsewhere while mapping; "
			   "falling back to normal pages (hugetlb = auto)");
		close(pool->fd);
		pool->fd = -1;
		pool->hugetlb = 0;
		r = pool_fit_check(cfg, 0);
		if (r < 0)
			goto err_lock;
		goto retry;
	}
	if (r < 0)
		goto err_close;
	return 0;

err_close:
	if (pool->fd >= 0)
		close(pool->fd);
	pool->fd = -1;
err_lock:
	pthread_mutex_destroy(&pool->lock);
	pool->base = NULL;
	return r;
}

int
kvtd_pool_adopt(struct kvtd_pool *pool, const struct kvtd_config *cfg, struct kvt_dev *dev, int fd,
		uint64_t size, uint64_t chunk_size, int hugetlb)
{
	struct stat st;
	int r;

	if (!size || !chunk_size || size % chunk_size || size / chunk_size > UINT32_MAX ||
	    fstat(fd, &st) < 0 || (uint64_t)st.st_size != size || fcntl(fd, F_GET_SEALS) < 0) {
		memset(pool, 0, sizeof(*pool));
		pool->fd = -1;
		log_err("pool: the memfd handed over by the previous kvtierd is not a pool of %llu "
			"bytes",
			(unsigned long long)size);
		return -EINVAL;
	}
	pool_prep(pool, size, chunk_size);
	pool->fd = fd;
	pool->hugetlb = !!hugetlb;
	r = pool_map(pool, cfg, dev, 1);
	if (r < 0) {
		pool->fd = -1; /* still the caller's */
		pthread_mutex_destroy(&pool->lock);
		return r;
	}
	if (pool->dev_alloc) { /* the rows stayed in the memfd, now closed */
		kvtd_pool_fini(pool);
		log_err("pool: the %s backend needs its own pool allocation: the previous pool "
			"cannot be kept",
			kvt_dev_name(dev));
		return -EOPNOTSUPP;
	}
	return 0;
}

static void *
populate_thread(void *arg)
{
	struct kvtd_pool *pool = arg;

	/* Maps (and, under MLOCK_ONFAULT, locks) the adopted pool's pages, 64 MiB at a time. */
	for (uint64_t off = 0; off < pool->size && !atomic_load(&pool->populate_stop);
	     off += 64ull << 20) {
		uint64_t len = pool->size - off < (64ull << 20) ? pool->size - off : 64ull << 20;

		if (madvise(pool->base + off, len, MADV_POPULATE_WRITE) < 0)
			break;
	}
	return NULL;
}

void
kvtd_pool_populate(struct kvtd_pool *pool)
{
	if (!pool->base || pool->populating)
		return;
	atomic_store(&pool->populate_stop, 0);
	pool->populating = pthread_create(&pool->populate_tid, NULL, populate_thread, pool) == 0;
	if (pool->populating)
		pthread_setname_np(pool->populate_tid, "kvtd-populate");
}

void
kvtd_pool_fini(struct kvtd_pool *pool)
{
	if (!pool->base)
		return;
	if (pool->populating) {
		atomic_store(&pool->populate_stop, 1);
		pthread_join(pool->populate_tid, NULL);
		pool->populating = 0;
	}
	pool_slab_fini(pool); /* while the region is still registered: its copies complete */
	if (pool->dev_alloc) {
		kvt_dev_host_free(pool->dev, pool->base, pool->size);
		pool->base = NULL; /* not ours to unmap */
	} else if (pool->dev) {
		kvt_dev_host_unregister(pool->dev, pool->base, pool->size);
	}
	if (pool->locked)
		munlock(pool->base, pool->size);
	if (pool->base)
		munmap(pool->base, pool->size);
	if (pool->fd >= 0)
		close(pool->fd);
	pool->fd = -1;
	pthread_mutex_destroy(&pool->lock);
	pool->base = NULL;
}
