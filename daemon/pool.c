/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "kvt_dev.h"
#include "log.h"
#include "pool.h"

/* A slot freed under a fence (kvtd_pool_free()). */
struct kvtd_pool_quar {
	void *slot;
	int32_t cls;
	uint64_t fence;
};

struct kvtd_pool_chunk {
	struct kvtd_pool_chunk *next, *prev; /* free_list or its class's partial list */
	int32_t cls;			     /* -1: free chunk */
	uint32_t used;			     /* slots handed out */
	uint32_t bump;			     /* slots never handed out start here */
	uint32_t free_head;		     /* 1 + index of a returned slot, 0 = none */
};

static uint32_t
chunk_index(const struct kvtd_pool *pool, const void *p)
{
	return (uint32_t)(((const uint8_t *)p - pool->base) / pool->chunk_size);
}

static uint8_t *
chunk_base(const struct kvtd_pool *pool, const struct kvtd_pool_chunk *c)
{
	return pool->base + (uint64_t)(c - pool->chunks) * pool->chunk_size;
}

static void
list_del(struct kvtd_pool_chunk **head, struct kvtd_pool_chunk *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		*head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->next = c->prev = NULL;
}

static void
list_add(struct kvtd_pool_chunk **head, struct kvtd_pool_chunk *c)
{
	c->prev = NULL;
	c->next = *head;
	if (*head)
		(*head)->prev = c;
	*head = c;
}

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
 * Maps pool->fd, binds, touches, locks and registers it, and sets up the chunk metadata (every
 * chunk free). The pool is a memfd mapped shared, not anonymous memory, so that a restart can
 * hand it to the next process (restart.c) with every row in place.
 */
static int
pool_map(struct kvtd_pool *pool, const struct kvtd_config *cfg, struct kvt_dev *dev, int adopt)
{
	int r, node;

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
			goto err;
		}
		pool->backing = "hugetlb";
		pool->page_kib = (unsigned)meminfo_get("Hugepagesize");
	} else {
		pool->base = mmap(NULL, pool->size, PROT_READ | PROT_WRITE,
				  MAP_SHARED | MAP_NORESERVE, pool->fd, 0);
		if (pool->base == MAP_FAILED) {
			r = -errno;
			log_err("pool: mapping %llu MiB failed: %s",
				(unsigned long long)(pool->size >> 20), strerror(-r));
			goto err;
		}
		/* THP for shared memory needs MADV_HUGEPAGE and shmem_enabled advise, within_size,
		 * always or force; the kernel then backs the pool with PMD-sized pages as it can.
		 */
		if (madvise(pool->base, pool->size, MADV_HUGEPAGE) == 0 && shmem_thp_allowed()) {
			pool->backing = "thp";
			pool->page_kib = 2048;
		} else {
			pool->backing = "shmem";
			pool->page_kib = 4;
		}
		if (!adopt && pool->page_kib == 4)
			log_notice(
			    "pool: 4 KiB pages (transparent huge pages are off for shared "
			    "memory: /sys/kernel/mm/transparent_hugepage/shmem_enabled), so a "
			    "random row gather takes about one TLB miss per row; for huge pages "
			    "set shmem_enabled to advise (kvtier-thp.conf, kvtierd.conf(5)) or "
			    "reserve huge pages (vm.nr_hugepages: [pool] hugetlb = auto uses "
			    "them)");
	}

	/* Bind before the first touch so pages come from the node that serves the GPU: "auto"
	 * asks the device layer for the GPUs' node; with no GPU, or GPUs on several nodes, it
	 * leaves placement to first touch on the daemon's own node. */
	node = cfg->numa_node;
	if (node == -2)
		node = dev && numa_available() >= 0 ? kvt_dev_numa_node(dev) : -1;
	if (node >= 0) {
		if (numa_available() < 0 || node > numa_max_node()) {
			log_err("pool: NUMA node %d not available", node);
			r = -EINVAL;
			goto err_unmap;
		}
		numa_tonode_memory(pool->base, pool->size, node);
		pool->numa_node = node;
	}
	/* Adopted pages are all there already: mlock maps them, or the first use does. */
	r = adopt ? 0 : pool_touch(pool->base, pool->size, pool->chunk_size);
	if (r < 0) {
		log_err("pool: faulting in %llu MiB failed: %s%s",
			(unsigned long long)(pool->size >> 20), strerror(-r),
			pool->hugetlb ? " (huge pages ran out: reserve more with sysctl "
					"vm.nr_hugepages=N, or set [pool] hugetlb = no)"
				      : "");
		goto err_unmap;
	}
	if (cfg->lock && adopt) {
		/* The restart's pause must not grow with the pool: lock pages as they are mapped,
		 * and map them all from a thread once the daemon serves (kvtd_pool_populate()). */
		if (mlock2(pool->base, pool->size, MLOCK_ONFAULT) < 0) {
			r = -errno;
			log_err(
			    "pool: mlock of %llu MiB failed: %s (raise LimitMEMLOCK / ulimit -l, "
			    "grant CAP_IPC_LOCK, or set [pool] lock = no)",
			    (unsigned long long)(pool->size >> 20), strerror(-r));
			goto err_unmap;
		}
		pool->locked = 1;
	} else if (cfg->lock) {
		if (mlock(pool->base, pool->size) < 0) {
			r = -errno;
			log_err(
			    "pool: mlock of %llu MiB failed: %s (raise LimitMEMLOCK / ulimit -l, "
			    "grant CAP_IPC_LOCK, or set [pool] lock = no)",
			    (unsigned long long)(pool->size >> 20), strerror(-r));
			goto err_unmap;
		}
		pool->locked = 1;
	}
	if (pool->numa_node < 0 && numa_available() >= 0) {
		int node = -1;

		if (get_mempolicy(&node, NULL, 0, pool->base, MPOL_F_NODE | MPOL_F_ADDR) == 0)
			pool->numa_node = node;
	}
	if (dev) {
		r = kvt_dev_host_register(dev, pool->base, pool->size);
		if (r == -EOPNOTSUPP && pool->fd >= 0) {
			/* The platform pins only memory the driver allocates: the pool moves there,
			 * losing hugetlb/THP, the NUMA binding (the driver places the pages) and
			 * restarts (the memory is not a memfd the next process can map). */
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
			log_err("pool: registering with the %s backend failed: %s",
				kvt_dev_name(dev), strerror(-r));
			goto err_munlock;
		}
		pool->dev = dev;
	}

	pool->chunks = calloc(pool->n_chunks, sizeof(*pool->chunks));
	if (!pool->chunks) {
		r = -ENOMEM;
		goto err_unregister;
	}
	for (uint32_t i = pool->n_chunks; i-- > 0;) {
		pool->chunks[i].cls = -1;
		list_add(&pool->free_list, &pool->chunks[i]);
	}
	pool->free_chunks = pool->n_chunks;
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
	if (pool->n_quar)
		kvt_dev_sync(pool->dev); /* the quarantine dies with the pool, after its copies */
	free(pool->quar);
	pool->quar = NULL;
	pool->n_quar = pool->cap_quar = 0;
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
	if (pool->claimed) {
		for (uint32_t i = 0; i < pool->n_chunks; i++)
			free(pool->claimed[i]);
		free(pool->claimed);
		pool->claimed = NULL;
	}
	free(pool->chunks);
	pthread_mutex_destroy(&pool->lock);
	pool->base = NULL;
}

/* Finds or creates the class (locked); -ENOSPC when none is free. */
static int
class_find(struct kvtd_pool *pool, uint64_t slot_size)
{
	int free_cls = -1;

	for (int i = 0; i < KVTD_POOL_MAX_CLASSES; i++) {
		struct kvtd_pool_class *c = &pool->classes[i];

		if (c->slot_size == slot_size)
			return i;
		if (!c->refs && !c->chunks && free_cls < 0)
			free_cls = i;
	}
	if (free_cls >= 0) {
		struct kvtd_pool_class *c = &pool->classes[free_cls];

		c->slot_size = (uint32_t)slot_size;
		c->slots_per_chunk = (uint32_t)(pool->chunk_size / slot_size);
		c->refs = 0;
	}
	return free_cls >= 0 ? free_cls : -ENOSPC;
}

int
kvtd_pool_class_get_for(struct kvtd_pool *pool, uint64_t slot_size, struct kvtd_cls_use *use)
{
	int r;

	slot_size = (slot_size + 63) & ~63ull;
	if (!slot_size || slot_size > pool->chunk_size)
		return -E2BIG;
	pthread_mutex_lock(&pool->lock);
	for (;;) {
		r = class_find(pool, slot_size);
		if (r != -ENOSPC || !pool->reclaim_class)
			break;
		/* Classes held only by cached blocks give way. Outside the lock: the hook frees
		 * through this pool. */
		pthread_mutex_unlock(&pool->lock);
		if (!pool->reclaim_class(pool->reclaim_ctx)) {
			pthread_mutex_lock(&pool->lock);
			break;
		}
		pthread_mutex_lock(&pool->lock);
	}
	if (r >= 0 && use && !use->refs[r] && use->limit && use->held >= use->limit) {
		if (!pool->classes[r].refs && !pool->classes[r].chunks)
			pool->classes[r].slot_size = 0; /* created for this call alone */
		r = -EDQUOT;
	} else if (r >= 0) {
		pool->classes[r].refs++;
		if (use && !use->refs[r]++)
			use->held++;
	}
	pthread_mutex_unlock(&pool->lock);
	return r;
}

int
kvtd_pool_class_get(struct kvtd_pool *pool, uint64_t slot_size)
{
	return kvtd_pool_class_get_for(pool, slot_size, NULL);
}

void
kvtd_pool_class_put_for(struct kvtd_pool *pool, int cls, struct kvtd_cls_use *use)
{
	pthread_mutex_lock(&pool->lock);
	if (use && use->refs[cls] && !--use->refs[cls])
		use->held--;
	if (!--pool->classes[cls].refs && !pool->classes[cls].chunks)
		pool->classes[cls].slot_size = 0;
	pthread_mutex_unlock(&pool->lock);
}

void
kvtd_pool_class_put(struct kvtd_pool *pool, int cls)
{
	kvtd_pool_class_put_for(pool, cls, NULL);
}

void
kvtd_pool_class_use(struct kvtd_pool *pool, const int *cls, unsigned n, struct kvtd_cls_use *use,
		    int add)
{
	pthread_mutex_lock(&pool->lock);
	for (unsigned i = 0; i < n; i++) {
		int c = cls[i];

		if (c < 0 || c >= KVTD_POOL_MAX_CLASSES)
			continue;
		if (add > 0 && !use->refs[c]++)
			use->held++;
		else if (add < 0 && use->refs[c] && !--use->refs[c])
			use->held--;
	}
	pthread_mutex_unlock(&pool->lock);
}

void
kvtd_pool_class_count(struct kvtd_pool *pool, const struct kvtd_cls_use *use, unsigned *ret_used,
		      unsigned *ret_held)
{
	unsigned n = 0;

	pthread_mutex_lock(&pool->lock);
	for (int i = 0; i < KVTD_POOL_MAX_CLASSES; i++)
		n += pool->classes[i].slot_size != 0;
	*ret_used = n;
	*ret_held = use ? use->held : 0;
	pthread_mutex_unlock(&pool->lock);
}

uint64_t
kvtd_pool_slot_size(const struct kvtd_pool *pool, int cls)
{
	return pool->classes[cls].slot_size;
}

static void *
slot_take(struct kvtd_pool *pool, struct kvtd_pool_class *c, int cls)
{
	struct kvtd_pool_chunk *ch = c->partial;
	uint8_t *p;

	if (!ch) {
		ch = pool->free_list;
		if (!ch)
			return NULL;
		list_del(&pool->free_list, ch);
		pool->free_chunks--;
		ch->cls = cls;
		ch->used = ch->bump = ch->free_head = 0;
		c->chunks++;
		list_add(&c->partial, ch);
	}
	if (ch->free_head) {
		p = chunk_base(pool, ch) + (uint64_t)(ch->free_head - 1) * c->slot_size;
		memcpy(&ch->free_head, p, sizeof(uint32_t));
	} else {
		p = chunk_base(pool, ch) + (uint64_t)ch->bump++ * c->slot_size;
	}
	if (++ch->used == c->slots_per_chunk)
		list_del(&c->partial, ch);
	return p;
}

static void
slot_give(struct kvtd_pool *pool, struct kvtd_pool_class *c, void *p)
{
	struct kvtd_pool_chunk *ch = &pool->chunks[chunk_index(pool, p)];
	uint32_t idx = (uint32_t)(((uint8_t *)p - chunk_base(pool, ch)) / c->slot_size);

	if (ch->used-- == c->slots_per_chunk)
		list_add(&c->partial, ch);
	if (!ch->used) {
		/* Whole chunk free again: give it back for any class. */
		list_del(&c->partial, ch);
		ch->cls = -1;
		c->chunks--;
		list_add(&pool->free_list, ch);
		pool->free_chunks++;
		return;
	}
	memcpy(p, &ch->free_head, sizeof(uint32_t));
	ch->free_head = idx + 1;
}

/* Lock held: slots whose fence is <= @done go back to their chunks. */
static unsigned
quar_release(struct kvtd_pool *pool, uint64_t done)
{
	unsigned k = 0, n = 0;

	for (uint32_t i = 0; i < pool->n_quar; i++) {
		struct kvtd_pool_quar *q = &pool->quar[i];
		struct kvtd_pool_class *c = &pool->classes[q->cls];

		if (q->fence > done) {
			pool->quar[k++] = *q;
			continue;
		}
		slot_give(pool, c, q->slot);
		pool->used_bytes -= c->slot_size;
		pool->quar_bytes -= c->slot_size;
		if (!c->refs && !c->chunks)
			c->slot_size = 0;
		n++;
	}
	pool->n_quar = k;
	return n;
}

unsigned
kvtd_pool_reclaim_fenced(struct kvtd_pool *pool)
{
	uint64_t done;
	unsigned n;

	pthread_mutex_lock(&pool->lock);
	n = pool->n_quar;
	pthread_mutex_unlock(&pool->lock);
	if (!n || !pool->dev)
		return 0;
	done = kvt_dev_fence_done(pool->dev); /* outside the pool lock: it queries events */
	pthread_mutex_lock(&pool->lock);
	n = quar_release(pool, done);
	pthread_mutex_unlock(&pool->lock);
	return n;
}

/* Lock held on entry and exit (dropped while waiting): wait for the oldest quarantined fence and
 * give back what completed. 0 when something came back, else -ENOMEM. */
static int
quar_wait_oldest(struct kvtd_pool *pool)
{
	uint64_t f = UINT64_MAX;
	int r;

	for (uint32_t i = 0; i < pool->n_quar; i++)
		if (pool->quar[i].fence < f)
			f = pool->quar[i].fence;
	if (f == UINT64_MAX)
		return -ENOMEM;
	pthread_mutex_unlock(&pool->lock);
	r = kvt_dev_fence_wait(pool->dev, f);
	pthread_mutex_lock(&pool->lock);
	if (r < 0) {
		log_err("pool: waiting for device copies to free quarantined slots: %s",
			strerror(-r));
		return -ENOMEM;
	}
	return quar_release(pool, f) ? 0 : -ENOMEM;
}

static int
acct_fits(const struct kvtd_acct *a, uint64_t bytes)
{
	return !a || !a->limit || a->bytes + bytes <= a->limit;
}

int
kvtd_pool_alloc(struct kvtd_pool *pool, int cls, unsigned n, struct kvtd_acct *acct,
		struct kvtd_acct *acct2, void **ret_slots)
{
	struct kvtd_pool_class *c = &pool->classes[cls];
	uint64_t bytes = (uint64_t)n * c->slot_size;
	bool reclaimed = false;
	unsigned i;

	kvtd_pool_reclaim_fenced(pool);
	pthread_mutex_lock(&pool->lock);
again:
	if (!acct_fits(acct, bytes) || !acct_fits(acct2, bytes)) {
		pool->refused_quota++;
		pthread_mutex_unlock(&pool->lock);
		return -EDQUOT;
	}
	for (i = 0; i < n; i++) {
		ret_slots[i] = slot_take(pool, c, cls);
		if (!ret_slots[i])
			break;
	}
	if (i < n) {
		while (i-- > 0)
			slot_give(pool, c, ret_slots[i]);
		/* Slots waiting for device copies come back before anything is refused. */
		if (pool->n_quar && quar_wait_oldest(pool) == 0)
			goto again;
		/* Cached memory the pool can take back (unreferenced prefix blocks) goes before
		 * a refusal. Outside the lock: the reclaimer frees through this pool. */
		if (pool->reclaim && !reclaimed) {
			pthread_mutex_unlock(&pool->lock);
			pool->reclaim(pool->reclaim_ctx, bytes);
			reclaimed = true;
			pthread_mutex_lock(&pool->lock);
			goto again;
		}
		pool->refused_nomem++;
		pthread_mutex_unlock(&pool->lock);
		return -ENOMEM;
	}
	if (acct)
		acct->bytes += bytes;
	if (acct2)
		acct2->bytes += bytes;
	pool->used_bytes += bytes;
	pthread_mutex_unlock(&pool->lock);
	return 0;
}

void
kvtd_pool_free(struct kvtd_pool *pool, int cls, unsigned n, struct kvtd_acct *acct,
	       struct kvtd_acct *acct2, void *const *slots)
{
	struct kvtd_pool_class *c = &pool->classes[cls];
	uint64_t bytes = (uint64_t)n * c->slot_size, fence = 0;

	if (!n)
		return;
	/* A copy queued before this free may still read (FETCH) or write the slots. */
	if (pool->dev) {
		fence = kvt_dev_fence(pool->dev);
		if (fence && kvt_dev_fence_done(pool->dev) >= fence)
			fence = 0;
	}
	pthread_mutex_lock(&pool->lock);
	if (fence && pool->n_quar + n > pool->cap_quar) {
		uint32_t cap = pool->cap_quar ? pool->cap_quar : 1024;
		struct kvtd_pool_quar *q;

		while (cap < pool->n_quar + n)
			cap *= 2;
		q = realloc(pool->quar, cap * sizeof(*q));
		if (q) {
			pool->quar = q;
			pool->cap_quar = cap;
		} else {
			/* No room to remember them: wait for the copies instead. */
			pthread_mutex_unlock(&pool->lock);
			if (kvt_dev_fence_wait(pool->dev, fence) < 0)
				log_err("pool: freeing slots after a failed device copy");
			fence = 0;
			pthread_mutex_lock(&pool->lock);
		}
	}
	for (unsigned i = 0; i < n; i++) {
		if (fence)
			pool->quar[pool->n_quar++] = (struct kvtd_pool_quar){slots[i], cls, fence};
		else
			slot_give(pool, c, slots[i]);
	}
	if (acct)
		acct->bytes -= bytes;
	if (acct2)
		acct2->bytes -= bytes;
	if (fence)
		pool->quar_bytes += bytes;
	else
		pool->used_bytes -= bytes;
	if (!c->refs && !c->chunks)
		c->slot_size = 0;
	pthread_mutex_unlock(&pool->lock);
}

struct kvtd_acct
kvtd_pool_acct_read(struct kvtd_pool *pool, const struct kvtd_acct *acct)
{
	struct kvtd_acct a;

	pthread_mutex_lock(&pool->lock);
	a = *acct;
	pthread_mutex_unlock(&pool->lock);
	return a;
}

int
kvtd_pool_recharge(struct kvtd_pool *pool, int cls, unsigned n, struct kvtd_acct *from,
		   struct kvtd_acct *from2, struct kvtd_acct *to, struct kvtd_acct *to2)
{
	uint64_t bytes = (uint64_t)n * pool->classes[cls].slot_size;
	int r = 0;

	pthread_mutex_lock(&pool->lock);
	if (!acct_fits(to, bytes) || !acct_fits(to2, bytes)) {
		r = -EDQUOT;
	} else {
		if (from)
			from->bytes -= bytes;
		if (from2)
			from2->bytes -= bytes;
		if (to)
			to->bytes += bytes;
		if (to2)
			to2->bytes += bytes;
	}
	pthread_mutex_unlock(&pool->lock);
	return r;
}

void
kvtd_pool_usage(struct kvtd_pool *pool, struct kvtd_pool_usage *ret)
{
	kvtd_pool_reclaim_fenced(pool);
	pthread_mutex_lock(&pool->lock);
	ret->size = pool->size;
	ret->used = pool->used_bytes;
	ret->free_bytes = pool->size - pool->used_bytes;
	ret->chunks = pool->n_chunks;
	ret->chunks_free = pool->free_chunks;
	ret->refused_quota = pool->refused_quota;
	ret->refused_nomem = pool->refused_nomem;
	ret->classes = 0;
	for (int i = 0; i < KVTD_POOL_MAX_CLASSES; i++)
		ret->classes += pool->classes[i].slot_size != 0;
	pthread_mutex_unlock(&pool->lock);
}

int
kvtd_pool_claim(struct kvtd_pool *pool, int cls, uint64_t off, struct kvtd_acct *acct,
		struct kvtd_acct *acct2, void **ret_slot)
{
	struct kvtd_pool_class *c;
	struct kvtd_pool_chunk *ch;
	uint32_t ci, idx;
	uint8_t *bits;
	int r = 0;

	if (cls < 0 || cls >= KVTD_POOL_MAX_CLASSES || off >= pool->size)
		return -EINVAL;
	c = &pool->classes[cls];
	ci = (uint32_t)(off / pool->chunk_size);
	if (!c->slot_size || (off % pool->chunk_size) % c->slot_size)
		return -EINVAL;
	idx = (uint32_t)((off % pool->chunk_size) / c->slot_size);
	if (idx >= c->slots_per_chunk)
		return -EINVAL;
	pthread_mutex_lock(&pool->lock);
	if (!pool->claimed) {
		pool->claimed = calloc(pool->n_chunks, sizeof(*pool->claimed));
		if (!pool->claimed) {
			r = -ENOMEM;
			goto out;
		}
	}
	ch = &pool->chunks[ci];
	if (ch->cls >= 0 && ch->cls != cls) {
		r = -EINVAL;
		goto out;
	}
	if (!pool->claimed[ci]) {
		pool->claimed[ci] = calloc((c->slots_per_chunk + 7) / 8, 1);
		if (!pool->claimed[ci]) {
			r = -ENOMEM;
			goto out;
		}
	}
	bits = pool->claimed[ci];
	if (bits[idx / 8] & (1u << (idx % 8))) {
		r = -EEXIST;
		goto out;
	}
	if (ch->cls < 0) {
		list_del(&pool->free_list, ch);
		pool->free_chunks--;
		ch->cls = cls;
		ch->used = ch->bump = ch->free_head = 0;
		c->chunks++;
	}
	bits[idx / 8] |= (uint8_t)(1u << (idx % 8));
	ch->used++;
	if (idx >= ch->bump)
		ch->bump = idx + 1;
	if (acct)
		acct->bytes += c->slot_size;
	if (acct2)
		acct2->bytes += c->slot_size;
	pool->used_bytes += c->slot_size;
	*ret_slot = pool->base + off;
out:
	pthread_mutex_unlock(&pool->lock);
	return r;
}

void
kvtd_pool_claim_done(struct kvtd_pool *pool)
{
	pthread_mutex_lock(&pool->lock);
	for (uint32_t ci = 0; pool->claimed && ci < pool->n_chunks; ci++) {
		struct kvtd_pool_chunk *ch = &pool->chunks[ci];
		uint8_t *bits = pool->claimed[ci];
		struct kvtd_pool_class *c;

		if (!bits)
			continue;
		c = &pool->classes[ch->cls];
		/* The holes below the bump are free: chained through the slots themselves, lowest
		 * first, as slot_give() leaves them. */
		for (uint32_t idx = ch->bump; idx-- > 0;) {
			uint8_t *p;

			if (bits[idx / 8] & (1u << (idx % 8)))
				continue;
			p = chunk_base(pool, ch) + (uint64_t)idx * c->slot_size;
			memcpy(p, &ch->free_head, sizeof(uint32_t));
			ch->free_head = idx + 1;
		}
		if (ch->used < c->slots_per_chunk)
			list_add(&c->partial, ch);
		free(bits);
	}
	free(pool->claimed);
	pool->claimed = NULL;
	pthread_mutex_unlock(&pool->lock);
}
