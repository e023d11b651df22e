/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench-spill - the spill store (daemon/spill.h) against fio on the same file, in the
 * same run: read and write bandwidth and latency (mean, p5, p99), sequential and random, at a
 * row's size (768 B, one 4 KiB unit on disk) and a block's (3 MiB), at queue depth 1 and 32.
 *
 * The store's side: extents of the I/O size carved from the whole file, visited in address
 * order (sequential) or uniformly at random with replacement (random), through
 * kvtd_spill_write()/kvtd_spill_read() with registered buffers and a fixed file, topped up to
 * the queue depth after each reap; a request's latency runs from its queueing to its reap.
 * fio's side: --ioengine=io_uring --direct=1 --registerfiles --fixedbufs, the same block size,
 * depth, pattern (--norandommap for random) and time, total latency (--lat_percentiles=1).
 * The two alternate case by case, so that both see the same noise; every figure is the median
 * of --reps runs. The file is written in full first: reads of blocks a file system has only
 * reserved never reach the disk.
 *
 * Block extents are buddy-aligned (a 3 MiB extent starts on a 4 MiB boundary), so the store's
 * sequential block pass skips 1 MiB after each block where fio's does not.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "kvt_cli.h"
#include "spill.h"

#define QD_MAX	  32
#define ROW_BYTES 768u
#define BLOCK	  (3u << 20)

struct opts {
	const char *path;
	uint64_t size;
	double seconds;
	int reps;
	int json;
	int keep;
	const char *only; /* run the cases whose name holds this */
	int thp;	  /* the store's buffers on transparent huge pages */
};

struct res {
	double gbps, mean_us, p5_us, p99_us;
};

struct kase {
	int write, rand, qd;
	uint32_t bs;
	const char *io; /* "row" or "block" */
	char name[48];	/* "read-block-seq-32" */
	struct res kv[16], fio[16];
	struct res kv_med, fio_med;
};

static uint64_t rng = 0x5eed5011;

static uint64_t
rnd(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double
median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double
pct(const double *sorted, size_t n, double p)
{
	size_t i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);

	return sorted[i < n ? i : n - 1];
}

/* ---- the store's side ------------------------------------------------------------------ */

struct store_run {
	struct kvtd_spill *s;
	uint8_t *arena; /* QD_MAX blocks, registered */
	kvtd_spill_ext *ext;
	uint64_t n_ext;
	double *lat; /* seconds, one a request */
	size_t n_lat, cap_lat;
};

static int
cmp_ext_off(const void *a, const void *b, void *arg)
{
	uint64_t oa, ob, len;

	kvtd_spill_extent(arg, *(const kvtd_spill_ext *)a, &oa, &len);
	kvtd_spill_extent(arg, *(const kvtd_spill_ext *)b, &ob, &len);
	return oa < ob ? -1 : oa > ob;
}

/* Carves the whole store into extents of @bs bytes, in address order. */
static int
carve(struct store_run *sr, uint64_t size, uint32_t bs)
{
	uint64_t cap = size / ((bs + KVTD_SPILL_UNIT - 1) / KVTD_SPILL_UNIT * KVTD_SPILL_UNIT);
	int r;

	sr->ext = calloc(cap, sizeof(*sr->ext));
	if (!sr->ext)
		return -ENOMEM;
	sr->n_ext = 0;
	while (sr->n_ext < cap &&
	       (r = kvtd_spill_alloc(sr->s, 0, bs, 0, sr->n_ext, &sr->ext[sr->n_ext])) == 0)
		sr->n_ext++;
	if (!sr->n_ext)
		return -ENOSPC;
	qsort_r(sr->ext, sr->n_ext, sizeof(*sr->ext), cmp_ext_off, sr->s);
	return 0;
}

static void
uncarve(struct store_run *sr)
{
	for (uint64_t i = 0; i < sr->n_ext; i++)
		kvtd_spill_free(sr->s, sr->ext[i]);
	free(sr->ext);
	sr->ext = NULL;
	sr->n_ext = 0;
}

/* One case for @seconds (or, @seconds 0, one pass over every extent): bandwidth, latencies. */
static int
store_case(struct store_run *sr, int write, int rand, int qd, uint32_t bs, uint32_t len,
	   double seconds, struct res *ret)
{
	struct kvtd_spill_cqe cqe[QD_MAX];
	double t_queued[QD_MAX], t0, t_end, t1;
	int free_slot[QD_MAX], n_free = qd, in_flight = 0;
	uint64_t next = 0, bytes = 0;
	int r;

	for (int i = 0; i < qd; i++)
		free_slot[i] = i;
	sr->n_lat = 0;
	t0 = now_s();
	t_end = t0 + seconds;
	for (;;) {
		int stop = seconds > 0 ? now_s() >= t_end : next >= sr->n_ext;

		while (!stop && n_free) {
			uint64_t i = rand ? rnd() % sr->n_ext : next % sr->n_ext;
			int slot = free_slot[--n_free];
			uint8_t *buf = sr->arena + (size_t)slot * BLOCK;

			r = write ? kvtd_spill_write(sr->s, sr->ext[i], buf, len, (uint64_t)slot)
				  : kvtd_spill_read(sr->s, sr->ext[i], buf, len, (uint64_t)slot);
			if (r < 0)
				return r;
			t_queued[slot] = now_s();
			in_flight++;
			next++;
			stop = seconds > 0 ? 0 : next >= sr->n_ext;
		}
		if (!in_flight)
			break;
		r = kvtd_spill_wait(sr->s);
		if (r < 0)
			return r;
		r = kvtd_spill_reap(sr->s, cqe, QD_MAX);
		if (r < 0)
			return r;
		t1 = now_s();
		for (int k = 0; k < r; k++) {
			int slot = (int)cqe[k].cookie;

			if (cqe[k].res < 0) {
				fprintf(stderr, "kvtier-bench spill: %s\n", cqe[k].reason);
				return cqe[k].res;
			}
			/* what the disk moved: a row is one whole unit */
			bytes += ((uint64_t)cqe[k].res + KVTD_SPILL_UNIT - 1) &
				 ~(uint64_t)(KVTD_SPILL_UNIT - 1);
			if (sr->n_lat == sr->cap_lat) {
				size_t cap = sr->cap_lat ? 2 * sr->cap_lat : 65536;
				double *l = realloc(sr->lat, cap * sizeof(*l));

				if (!l)
					return -ENOMEM;
				sr->lat = l;
				sr->cap_lat = cap;
			}
			sr->lat[sr->n_lat++] = t1 - t_queued[slot];
			free_slot[n_free++] = slot;
			in_flight--;
		}
	}
	t1 = now_s();
	(void)bs;
	if (ret && sr->n_lat) {
		double sum = 0;

		qsort(sr->lat, sr->n_lat, sizeof(double), cmp_double);
		for (size_t i = 0; i < sr->n_lat; i++)
			sum += sr->lat[i];
		ret->gbps = (double)bytes / (t1 - t0) / 1e9;
		ret->mean_us = sum / (double)sr->n_lat * 1e6;
		ret->p5_us = pct(sr->lat, sr->n_lat, 5) * 1e6;
		ret->p99_us = pct(sr->lat, sr->n_lat, 99) * 1e6;
	}
	return 0;
}

/* ---- fio's side ------------------------------------------------------------------------ */

static int
fio_case(const struct opts *o, int write, int rand, int qd, uint32_t bs, struct res *ret)
{
	char cmd[1024], *out = NULL;
	size_t len = 0, n;
	char buf[65536];
	FILE *f;
	struct json_object *root, *jobs, *job, *side, *lat, *pc, *v;
	int r = -EIO;

	snprintf(cmd, sizeof(cmd),
		 "%sfio --name=spill --filename=%s --size=%llu --ioengine=io_uring --direct=1 "
		 "--registerfiles --fixedbufs --rw=%s --bs=%u --iodepth=%d --runtime=%.3f "
		 "--time_based %s --output-format=json --lat_percentiles=1 "
		 "--percentile_list=5:99 2>/dev/null",
		 o->thp ? "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 " : "", o->path,
		 (unsigned long long)o->size,
		 rand ? (write ? "randwrite" : "randread") : (write ? "write" : "read"), bs, qd,
		 o->seconds, rand ? "--norandommap" : "");
	f = popen(cmd, "r");
	if (!f)
		return -errno;
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
		char *p = realloc(out, len + n + 1);

		if (!p) {
			free(out);
			pclose(f);
			return -ENOMEM;
		}
		out = p;
		memcpy(out + len, buf, n);
		len += n;
		out[len] = '\0';
	}
	if (pclose(f) != 0 || !out) {
		fprintf(stderr, "kvtier-bench spill: fio failed: %s\n", cmd);
		free(out);
		return -EIO;
	}
	root = json_tokener_parse(strchr(out, '{') ? strchr(out, '{') : out);
	free(out);
	if (root && json_object_object_get_ex(root, "jobs", &jobs) &&
	    (job = json_object_array_get_idx(jobs, 0)) &&
	    json_object_object_get_ex(job, write ? "write" : "read", &side) &&
	    json_object_object_get_ex(side, "lat_ns", &lat) &&
	    json_object_object_get_ex(lat, "percentile", &pc)) {
		json_object_object_get_ex(side, "bw_bytes", &v);
		ret->gbps = json_object_get_double(v) / 1e9;
		json_object_object_get_ex(lat, "mean", &v);
		ret->mean_us = json_object_get_double(v) / 1e3;
		json_object_object_get_ex(pc, "5.000000", &v);
		ret->p5_us = json_object_get_double(v) / 1e3;
		json_object_object_get_ex(pc, "99.000000", &v);
		ret->p99_us = json_object_get_double(v) / 1e3;
		r = 0;
	} else {
		fprintf(stderr, "kvtier-bench spill: fio's JSON lacks jobs[0].%s.lat_ns\n",
			write ? "write" : "read");
	}
	json_object_put(root);
	return r;
}

/* ---- the run ------------------------------------------------------------------------------ */

/* "vda (virtio, rotational 1, 256 GiB)": the disk under @path, from sysfs. */
static void
describe_disk(const char *path, char *buf, size_t len)
{
	struct stat st;
	char p[256], name[64] = "?", drv[128] = "", *slash;
	ssize_t n;
	FILE *f;
	int rot = -1;
	unsigned long long sectors = 0;

	snprintf(buf, len, "unknown");
	if (stat(path, &st) < 0)
		return;
	dev_t dev = S_ISBLK(st.st_mode) ? st.st_rdev : st.st_dev;
	snprintf(p, sizeof(p), "/sys/dev/block/%u:%u", major(dev), minor(dev));
	n = readlink(p, drv, sizeof(drv) - 1);
	if (n > 0) {
		drv[n] = '\0';
		slash = strrchr(drv, '/');
		snprintf(name, sizeof(name), "%s", slash ? slash + 1 : drv);
	}
	/* a partition's queue is its disk's */
	snprintf(p, sizeof(p), "/sys/class/block/%s/queue/rotational", name);
	if (!(f = fopen(p, "r"))) {
		snprintf(p, sizeof(p), "/sys/class/block/%s/../queue/rotational", name);
		f = fopen(p, "r");
	}
	if (f) {
		if (fscanf(f, "%d", &rot) != 1)
			rot = -1;
		fclose(f);
	}
	snprintf(p, sizeof(p), "/sys/class/block/%s/size", name);
	if ((f = fopen(p, "r"))) {
		if (fscanf(f, "%llu", &sectors) != 1)
			sectors = 0;
		fclose(f);
	}
	snprintf(p, sizeof(p), "/sys/class/block/%s/device/driver", name);
	n = readlink(p, drv, sizeof(drv) - 1);
	drv[n > 0 ? n : 0] = '\0';
	slash = strrchr(drv, '/');
	snprintf(buf, len, "%s (%s, rotational %d, %llu GiB)", name,
		 slash ? slash + 1 : (drv[0] ? drv : "driver unknown"), rot, sectors >> 21);
}

/* --size: a size as kvtierd.conf writes it (1G, 512M), at least 64 MiB. */
static int
opt_size(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	struct opts *so = o;

	if (kvtd_parse_size(arg, &so->size) < 0 || so->size < (64ull << 20)) {
		fprintf(stderr, "%s: --%s wants a size of at least 64M (e.g. 1G), got '%s'\n",
			cli->prog, d->name, arg);
		return -EINVAL;
	}
	return 0;
}

#define OFF(m) offsetof(struct opts, m)

static const struct kvt_cli_opt spill_opts[] = {
    {"json", 0, NULL, "one JSON object (the headline cases) instead of the table",
     .apply = kvt_cli_flag, .off = OFF(json)},
    {"path", 0, "FILE",
     "the store and fio's file, on a file system with O_DIRECT, not\n"
     "tmpfs (default /var/tmp/kvtier-bench-spill.dat)",
     .apply = kvt_cli_str, .off = OFF(path)},
    {"size", 0, "SIZE", "its size (default 1G, at least 64M)", .apply = opt_size},
    {"seconds", 0, "S", "per case and side (default 1.5)", .apply = kvt_cli_double,
     .off = OFF(seconds), .min = 0.1, .max = 600},
    {"reps", 0, "N", "runs of every case, medians reported (default 3)", .apply = kvt_cli_int,
     .off = OFF(reps), .min = 1, .max = 16},
    {"keep", 0, NULL, "leave the file (default: removed at the end)", .apply = kvt_cli_flag,
     .off = OFF(keep)},
    {"thp", 0, NULL, "the store's buffers on transparent huge pages (fio's too)",
     .apply = kvt_cli_flag, .off = OFF(thp)},
    {"only", 0, "TEXT",
     "only the cases whose name holds TEXT (read-block-seq-32); not\nwith --json",
     .apply = kvt_cli_str, .off = OFF(only)},
    {"help", 'h', NULL, "this text", .apply = kvt_cli_help},
    {NULL},
};

static const struct kvt_cli spill_cli = {
    .prog = "kvtier-bench spill",
    .intro = "usage: kvtier-bench spill [options]\n"
	     "The spill store against fio on the same file: bandwidth and latency, sequential\n"
	     "and random, a row's and a block's size, queue depth 1 and 32.\n\n",
    .outro = "Needs fio (apt-get install fio).\n",
    .opts = spill_opts,
};

static const char *
pattern(int rand)
{
	return rand ? "rand" : "seq";
}

int
main(int argc, char **argv)
{
	struct opts o = {"/var/tmp/kvtier-bench-spill.dat", 1ull << 30, 1.5, 3, 0, 0, NULL, 0};
	struct kvtd_spill_params p = {0};
	struct store_run sr = {0};
	struct kase cases[16];
	int n_cases = 0, r, created;
	char err[512], disk[256], fsname[32] = "?";
	struct statfs sfs;
	struct stat st;

	if (kvt_cli_parse(&spill_cli, argc, argv, &o, NULL) < 0) {
		fprintf(stderr, "Try 'kvtier-bench spill --help'.\n");
		return 2;
	}
	if (optind < argc) {
		fprintf(stderr, "kvtier-bench spill: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (o.only && o.json) {
		fprintf(stderr,
			"kvtier-bench spill: --json reports the headline cases: not with --only\n");
		return 2;
	}
	if (system("fio --version >/dev/null 2>&1") != 0) {
		fprintf(stderr, "kvtier-bench spill: fio is not installed; the comparison needs it "
				"(apt-get install fio, or dnf install fio)\n");
		return 2;
	}
	created = stat(o.path, &st) < 0;
	p.path = o.path;
	p.size = o.size;
	p.queue_depth = QD_MAX;
	p.owner = geteuid();
	r = kvtd_spill_open(&p, &sr.s, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "kvtier-bench spill: %s\n", err);
		return 1;
	}
	sr.arena = mmap(NULL, (size_t)QD_MAX * BLOCK, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (sr.arena == MAP_FAILED) {
		fprintf(stderr, "kvtier-bench spill: mmap: %s\n", strerror(errno));
		return 1;
	}
	/* 4 KiB pages by default, as fio's malloc'd buffers; --thp puts both sides on transparent
	 * huge pages (fio's through glibc's malloc tunable), as the pool is where THP or hugetlb
	 * pages are available: a 3 MiB transfer then reaches the disk in far fewer segments */
	if (o.thp && madvise(sr.arena, (size_t)QD_MAX * BLOCK, MADV_HUGEPAGE) < 0) {
		fprintf(stderr, "kvtier-bench spill: --thp: madvise: %s\n", strerror(errno));
		return 1;
	}
	for (size_t i = 0; i < (size_t)QD_MAX * BLOCK; i += 8) {
		uint64_t v = rnd();

		memcpy(sr.arena + i, &v, 8);
	}
	/* one registered buffer a slot, as fio registers one an io_u */
	struct iovec iovs[QD_MAX];

	for (int i = 0; i < QD_MAX; i++)
		iovs[i] = (struct iovec){sr.arena + (size_t)i * BLOCK, BLOCK};
	r = kvtd_spill_register_buffers(sr.s, iovs, QD_MAX);
	if (r < 0) {
		fprintf(stderr, "kvtier-bench spill: registering %u MiB: %s\n",
			QD_MAX * BLOCK >> 20, strerror(-r));
		return 1;
	}
	describe_disk(o.path, disk, sizeof(disk));
	if (statfs(o.path, &sfs) == 0)
		snprintf(fsname, sizeof(fsname), "%s",
			 sfs.f_type == 0xef53	    ? "ext4"
			 : sfs.f_type == 0x58465342 ? "xfs"
			 : sfs.f_type == 0x9123683e ? "btrfs"
						    : "other");
	/* write every byte once: 1 MiB extents, one pass at depth 32 */
	if ((r = carve(&sr, o.size, 1u << 20)) < 0 ||
	    (r = store_case(&sr, 1, 0, QD_MAX, 1u << 20, 1u << 20, 0, NULL)) < 0) {
		fprintf(stderr, "kvtier-bench spill: filling the file: %s\n", strerror(-r));
		return 1;
	}
	uncarve(&sr);

	for (int io = 0; io < 2; io++)
		for (int write = 0; write < 2; write++)
			for (int rand = 0; rand < 2; rand++)
				for (int q = 0; q < 2; q++) {
					struct kase *k = &cases[n_cases++];

					memset(k, 0, sizeof(*k));
					k->write = write;
					k->rand = rand;
					k->qd = q ? QD_MAX : 1;
					k->bs = io ? BLOCK : KVTD_SPILL_UNIT;
					k->io = io ? "block" : "row";
					snprintf(k->name, sizeof(k->name), "%s-%s-%s-%d",
						 write ? "write" : "read", k->io, pattern(rand),
						 k->qd);
				}
	for (int rep = 0; rep < o.reps; rep++)
		for (int io = 0; io < 2; io++) {
			uint32_t bs = io ? BLOCK : KVTD_SPILL_UNIT;

			if ((r = carve(&sr, o.size, bs)) < 0) {
				fprintf(stderr, "kvtier-bench spill: carving: %s\n", strerror(-r));
				return 1;
			}
			for (int c = 0; c < n_cases; c++) {
				struct kase *k = &cases[c];

				if (k->bs != bs)
					continue;
				if (o.only && !strstr(k->name, o.only))
					continue;
				/* who goes first alternates: the side that runs second may find
				 * what the first read in the host's cache (a VM's disk is a file)
				 */
				for (int side = 0; side < 2; side++) {
					if ((side ^ rep) & 1) {
						r = fio_case(&o, k->write, k->rand, k->qd, k->bs,
							     &k->fio[rep]);
						if (r < 0)
							return 1;
						continue;
					}
					r = store_case(&sr, k->write, k->rand, k->qd, k->bs,
						       io ? BLOCK : ROW_BYTES, o.seconds,
						       &k->kv[rep]);
					if (r < 0) {
						fprintf(stderr, "kvtier-bench spill: store: %s\n",
							strerror(-r));
						return 1;
					}
				}
				if (!o.json)
					fprintf(stderr,
						"rep %d %s %-5s %-4s qd%-2d: %.3f / %.3f GB/s\n",
						rep, k->write ? "write" : "read ", k->io,
						pattern(k->rand), k->qd, k->kv[rep].gbps,
						k->fio[rep].gbps);
			}
			uncarve(&sr);
		}
	for (int c = 0; c < n_cases; c++) {
		struct kase *k = &cases[c];
		double v[2][4][16];

		for (int rep = 0; rep < o.reps; rep++) {
			struct res *x[2] = {&k->kv[rep], &k->fio[rep]};

			for (int s = 0; s < 2; s++) {
				v[s][0][rep] = x[s]->gbps;
				v[s][1][rep] = x[s]->mean_us;
				v[s][2][rep] = x[s]->p5_us;
				v[s][3][rep] = x[s]->p99_us;
			}
		}
		k->kv_med = (struct res){median(v[0][0], o.reps), median(v[0][1], o.reps),
					 median(v[0][2], o.reps), median(v[0][3], o.reps)};
		k->fio_med = (struct res){median(v[1][0], o.reps), median(v[1][1], o.reps),
					  median(v[1][2], o.reps), median(v[1][3], o.reps)};
	}
	kvtd_spill_close(sr.s);
	munmap(sr.arena, (size_t)QD_MAX * BLOCK);
	free(sr.lat);
	if (created && !o.keep)
		unlink(o.path);

	/* the headline figures: bandwidth of sequential block reads and writes at depth 32, p99
	 * of random row reads at depth 1 */
	const struct kase *rd = NULL, *wr = NULL, *lat = NULL;

	for (int c = 0; c < n_cases; c++) {
		const struct kase *k = &cases[c];

		if (k->bs == BLOCK && !k->rand && k->qd == QD_MAX)
			*(k->write ? &wr : &rd) = k;
		if (k->bs == KVTD_SPILL_UNIT && k->rand && k->qd == 1 && !k->write)
			lat = k;
	}
	if (o.json) {
		printf(
		    "{\"bench\": \"spill\", \"path\": \"%s\", \"fs\": \"%s\", \"disk\": \"%s\",\n"
		    " \"size\": %llu, \"seconds\": %.3f, \"reps\": %d, \"row_bytes\": %u,\n"
		    " \"units\": \"GB/s = 1e9 bytes/s, latencies in us, medians of reps\",\n"
		    " \"buffers\": \"%s\",\n",
		    o.path, fsname, disk, (unsigned long long)o.size, o.seconds, o.reps, ROW_BYTES,
		    o.thp ? "transparent huge pages" : "4 KiB pages");
		printf(" \"read_gbps_kvtier\": %.4f, \"read_gbps_fio\": %.4f,\n"
		       " \"write_gbps_kvtier\": %.4f, \"write_gbps_fio\": %.4f,\n"
		       " \"read_ratio_qd32\": %.3f, \"write_ratio_qd32\": %.3f,\n"
		       " \"p99_us_kvtier_qd1\": %.1f, \"p99_us_fio_qd1\": %.1f, "
		       "\"p99_ratio_qd1\": %.3f,\n"
		       " \"headline\": \"bandwidth: sequential 3 MiB at QD 32; p99: random 4 KiB "
		       "reads at QD 1\",\n \"cases\": [\n",
		       rd->kv_med.gbps, rd->fio_med.gbps, wr->kv_med.gbps, wr->fio_med.gbps,
		       rd->kv_med.gbps / rd->fio_med.gbps, wr->kv_med.gbps / wr->fio_med.gbps,
		       lat->kv_med.p99_us, lat->fio_med.p99_us,
		       lat->kv_med.p99_us / lat->fio_med.p99_us);
		for (int c = 0; c < n_cases; c++) {
			const struct kase *k = &cases[c];

			printf(
			    "  {\"op\": \"%s\", \"pattern\": \"%s\", \"io\": \"%s\", \"bs\": %u, "
			    "\"qd\": %d,\n   \"gbps_kvtier\": %.4f, \"gbps_fio\": %.4f, "
			    "\"ratio\": %.3f,\n"
			    "   \"mean_us_kvtier\": %.1f, \"p5_us_kvtier\": %.1f, "
			    "\"p99_us_kvtier\": %.1f,\n"
			    "   \"mean_us_fio\": %.1f, \"p5_us_fio\": %.1f, \"p99_us_fio\": "
			    "%.1f}%s\n",
			    k->write ? "write" : "read", pattern(k->rand), k->io, k->bs, k->qd,
			    k->kv_med.gbps, k->fio_med.gbps, k->kv_med.gbps / k->fio_med.gbps,
			    k->kv_med.mean_us, k->kv_med.p5_us, k->kv_med.p99_us,
			    k->fio_med.mean_us, k->fio_med.p5_us, k->fio_med.p99_us,
			    c + 1 < n_cases ? "," : "");
		}
		printf(" ]}\n");
		return 0;
	}
	printf("spill store vs fio on %s (%s on %s), medians of %d x %.1f s, store buffers on %s\n",
	       o.path, fsname, disk, o.reps, o.seconds, o.thp ? "THP" : "4 KiB pages");
	printf("%-5s %-5s %-4s %3s | %8s %8s %5s | %8s %8s %8s | %8s %8s %8s\n", "op", "io", "pat",
	       "qd", "GB/s kv", "GB/s fio", "ratio", "mean kv", "p5 kv", "p99 kv", "mean fio",
	       "p5 fio", "p99 fio");
	for (int c = 0; c < n_cases; c++) {
		const struct kase *k = &cases[c];

		if (o.only && !strstr(k->name, o.only))
			continue;
		printf("%-5s %-5s %-4s %3d | %8.3f %8.3f %5.2f | %8.1f %8.1f %8.1f | %8.1f %8.1f "
		       "%8.1f\n",
		       k->write ? "write" : "read", k->io, pattern(k->rand), k->qd, k->kv_med.gbps,
		       k->fio_med.gbps, k->kv_med.gbps / k->fio_med.gbps, k->kv_med.mean_us,
		       k->kv_med.p5_us, k->kv_med.p99_us, k->fio_med.mean_us, k->fio_med.p5_us,
		       k->fio_med.p99_us);
	}
	return 0;
}
