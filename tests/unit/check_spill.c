/* SPDX-License-Identifier: MIT */
/*
 * The spill store (daemon/spill.h) on a real file with O_DIRECT through io_uring: refusals at
 * open, per-uid shares, eviction order, bit-exact round trips at a row's and a block's size,
 * queue depth 32 with many requests, and injected faults that touch only their own extent.
 *
 * The store file goes where O_DIRECT works: $KVT_SPILL_TEST_DIR, else /var/tmp, /tmp or the
 * working directory, the first that is no tmpfs and passes an O_DIRECT read. None: the test
 * fails saying so (it never skips).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "kvt_direct.h"
#include "kvt_test.h"
#include "spill.h"

#define ROW   768u	    /* a row of 384 f16 values: one unit on disk */
#define BLOCK (3u << 20)    /* a block: 16 tokens of a mid-size model's rows */
#define ARENA (64ull << 20) /* registered for the tests' I/O */

static char dir[512];
static char path[600];
static uint8_t *arena;

static void
setup(void)
{
	ck_assert_msg(kvt_test_direct_dir(dir, sizeof(dir)),
		      "no directory here supports O_DIRECT (tried $KVT_SPILL_TEST_DIR, "
		      "/var/tmp, /tmp, .): set KVT_SPILL_TEST_DIR to one on ext4 or xfs");
	snprintf(path, sizeof(path), "%s/kvt-spill-%d.dat", dir, (int)getpid());
	unlink(path);
	arena = mmap(NULL, ARENA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(arena, MAP_FAILED);
}

static void
teardown(void)
{
	unlink(path);
	munmap(arena, ARENA);
}

static struct kvtd_spill *
open_store(uint64_t size, unsigned qd, uint64_t share, unsigned pct)
{
	struct kvtd_spill_params p = {path, size, qd, share, pct, 4242};
	struct kvtd_spill *s = NULL;
	struct iovec iov = {arena, ARENA};
	char err[512] = "";

	ck_assert_msg(kvtd_spill_open(&p, &s, err, sizeof(err)) == 0, "%s", err);
	/* open, the file lives on; a test that fails leaves no store behind */
	unlink(path);
	ck_assert_int_eq(kvtd_spill_register_buffers(s, &iov, 1), 0);
	return s;
}

static void
fill(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = kvt_test_splitmix(&seed);

		memcpy(p + i, &v, n - i < 8 ? n - i : 8);
	}
}

/* Waits and reaps until @want completions are in @out. */
static void
reap_n(struct kvtd_spill *s, struct kvtd_spill_cqe *out, unsigned want)
{
	unsigned got = 0;

	while (got < want) {
		int r = kvtd_spill_reap(s, out + got, want - got);

		ck_assert_int_ge(r, 0);
		got += (unsigned)r;
		if (got < want)
			ck_assert_int_eq(kvtd_spill_wait(s), 0);
	}
}

START_TEST(t_open_refusals)
{
	struct kvtd_spill_params p = {path, 16ull << 20, 32, 0, 0, 0};
	struct kvtd_spill *s = NULL, *s2 = NULL;
	char err[512] = "", shm[128], missing[700];

	/* tmpfs is memory: refused, saying what to do */
	snprintf(shm, sizeof(shm), "/dev/shm/kvt-spill-%d.dat", (int)getpid());
	p.path = shm;
	ck_assert_int_eq(kvtd_spill_open(&p, &s, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "tmpfs") && strstr(err, "disk file system"), "%s", err);
	unlink(shm);
	/* a new file with no size */
	p.path = path;
	p.size = 0;
	ck_assert_int_eq(kvtd_spill_open(&p, &s, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "set [spill] size"), "%s", err);
	p.size = 512 << 10;
	ck_assert_int_eq(kvtd_spill_open(&p, &s, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "1 MiB minimum"), "%s", err);
	snprintf(missing, sizeof(missing), "%s/no-such-dir/x.dat", dir);
	p.path = missing;
	p.size = 16ull << 20;
	ck_assert_int_eq(kvtd_spill_open(&p, &s, err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, "directory must exist"), "%s", err);
	p.path = dir;
	ck_assert_int_eq(kvtd_spill_open(&p, &s, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "neither a regular file nor a block device"), "%s", err);
	p.path = path;
	p.queue_depth = 0;
	ck_assert_int_eq(kvtd_spill_open(&p, &s, err, sizeof(err)), -EINVAL);
	p.queue_depth = 32;
	/* one store per file: the second opener is refused while the first holds it */
	ck_assert_msg(kvtd_spill_open(&p, &s, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(kvtd_spill_open(&p, &s2, err, sizeof(err)), -EWOULDBLOCK);
	ck_assert_msg(strstr(err, "in use"), "%s", err);
	kvtd_spill_close(s);
	/* an existing file keeps its size when none is given */
	p.size = 0;
	ck_assert_msg(kvtd_spill_open(&p, &s, err, sizeof(err)) == 0, "%s", err);
	struct kvtd_spill_stats st;
	kvtd_spill_get_stats(s, &st);
	ck_assert_uint_eq(st.size, 16ull << 20);
	ck_assert_uint_eq(st.free, 16ull << 20);
	kvtd_spill_close(s);
	kvtd_spill_close(NULL);
}
END_TEST

START_TEST(t_alloc_and_share)
{
	struct kvtd_spill *s = open_store(64ull << 20, 8, 0, 25);
	kvtd_spill_ext e[64], x;
	struct kvtd_spill_stats st;
	int n = 0;

	/* 25% of 64 MiB: uid 1000 holds 16 MiB, not a unit more */
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(kvtd_spill_alloc(s, 1000, 4u << 20, 1, 0, &e[n++]), 0);
	ck_assert_uint_eq(kvtd_spill_uid_bytes(s, 1000), 16ull << 20);
	ck_assert_int_eq(kvtd_spill_alloc(s, 1000, 1, 1, 0, &x), -EDQUOT);
	/* a row rounds up to one unit */
	ck_assert_int_eq(kvtd_spill_alloc(s, 1001, ROW, 1, 0, &e[n++]), 0);
	ck_assert_uint_eq(kvtd_spill_uid_bytes(s, 1001), 4096);
	/* root and the daemon's uid are not held to the share */
	ck_assert_int_eq(kvtd_spill_alloc(s, 0, 20u << 20, 1, 0, &e[n++]), 0);
	ck_assert_int_eq(kvtd_spill_alloc(s, 4242, 8u << 20, 1, 0, &e[n++]), 0);
	ck_assert_int_eq(kvtd_spill_alloc(s, 4242, 8u << 20, 1, 0, &e[n++]), 0);
	ck_assert_int_eq(kvtd_spill_alloc(s, 4242, 4u << 20, 1, 0, &e[n++]), 0);
	ck_assert_uint_eq(kvtd_spill_uid_bytes(s, 4242), 20ull << 20);
	/* 56 MiB and a unit used, the rest in pieces under 8 MiB: -ENOSPC, not -EDQUOT */
	ck_assert_int_eq(kvtd_spill_alloc(s, 0, 8u << 20, 1, 0, &x), -ENOSPC);
	ck_assert_int_eq(kvtd_spill_alloc(s, 0, 0, 1, 0, &x), -EINVAL);
	ck_assert_int_eq(kvtd_spill_alloc(s, 0, 65ull << 20, 1, 0, &x), -EINVAL);
	kvtd_spill_get_stats(s, &st);
	ck_assert_uint_eq(st.refused_quota, 1);
	ck_assert_uint_eq(st.refused_nospc, 1);
	ck_assert_uint_eq(st.used, 56ull * (1 << 20) + 4096);
	ck_assert_uint_eq(st.uid_share, 16ull << 20);
	ck_assert_uint_eq(st.uids, 4);
	/* the uids holding space, most first; a shorter list keeps the largest */
	{
		struct kvtd_spill_uid u[8];

		ck_assert_uint_eq(kvtd_spill_uids(s, u, 8), 4);
		ck_assert_uint_eq(u[0].uid, 0);
		ck_assert_uint_eq(u[0].bytes, 20ull << 20);
		ck_assert_uint_eq(u[1].uid, 4242); /* as many bytes as root: the higher uid after */
		ck_assert_uint_eq(u[1].bytes, 20ull << 20);
		ck_assert_uint_eq(u[2].uid, 1000);
		ck_assert_uint_eq(u[2].bytes, 16ull << 20);
		ck_assert_uint_eq(u[3].uid, 1001);
		ck_assert_uint_eq(u[3].bytes, 4096);
		memset(u, 0xff, sizeof(u));
		ck_assert_uint_eq(kvtd_spill_uids(s, u, 2), 4);
		ck_assert_uint_eq(u[0].uid, 0);
		ck_assert_uint_eq(u[1].uid, 4242);
		ck_assert_uint_eq(u[2].uid, (uid_t)-1); /* nothing past @max */
		ck_assert_uint_eq(kvtd_spill_uids(s, u, 0), 4);
	}
	/* freeing gives the uid its room back; a freed handle is stale */
	ck_assert_int_eq(kvtd_spill_free(s, e[0]), 0);
	ck_assert_int_eq(kvtd_spill_free(s, e[0]), -ENOENT);
	ck_assert_int_eq(kvtd_spill_set_importance(s, e[0], 3), -ENOENT);
	ck_assert_uint_eq(kvtd_spill_uid_bytes(s, 1000), 12ull << 20);
	ck_assert_int_eq(kvtd_spill_alloc(s, 1000, 4u << 20, 1, 0, &x), 0);
	ck_assert_int_ne(x, e[0]); /* same slot, new generation */
	ck_assert_int_eq(kvtd_spill_free(s, x), 0);
	for (int i = 1; i < n; i++)
		ck_assert_int_eq(kvtd_spill_free(s, e[i]), 0);
	kvtd_spill_get_stats(s, &st);
	ck_assert_uint_eq(st.free, 64ull << 20);
	ck_assert_uint_eq(st.largest_free, 64ull << 20);
	ck_assert_uint_eq(st.extents, 0);
	ck_assert_uint_eq(st.uids, 0);
	ck_assert_uint_eq(kvtd_spill_uids(s, NULL, 0), 0);
	kvtd_spill_close(s);
}
END_TEST

START_TEST(t_evict_lowest)
{
	struct kvtd_spill *s = open_store(8ull << 20, 8, 0, 0);
	double imp[] = {5, 1, 9, 3, 7, 2};
	kvtd_spill_ext e[6];
	struct kvtd_spill_dropped d;
	struct kvtd_spill_cqe c;
	struct kvtd_spill_stats st;

	ck_assert_int_eq(kvtd_spill_evict_lowest(s, &d), -ENOENT);
	for (int i = 0; i < 6; i++)
		ck_assert_int_eq(kvtd_spill_alloc(s, 1000 + i, 8192, imp[i], 100 + i, &e[i]), 0);
	/* importance changes reorder: e[2] drops to the bottom */
	ck_assert_int_eq(kvtd_spill_set_importance(s, e[2], 0.5), 0);
	/* an extent with a request in flight is not evicted: e[1] (1) is skipped while busy */
	ck_assert_int_eq(kvtd_spill_write(s, e[1], arena, 8192, 1), 0);
	ck_assert_int_eq(kvtd_spill_free(s, e[1]), -EBUSY);
	ck_assert_int_eq(kvtd_spill_evict_lowest(s, &d), 0);
	ck_assert_uint_eq(d.ext, e[2]);
	ck_assert_uint_eq(d.tag, 102);
	ck_assert_uint_eq(d.uid, 1002);
	ck_assert_uint_eq(d.bytes, 8192);
	ck_assert_int_eq(kvtd_spill_evict_lowest(s, &d), 0);
	ck_assert_uint_eq(d.tag, 105); /* 2 */
	reap_n(s, &c, 1);
	ck_assert_int_eq(c.res, 8192);
	/* back in the heap once its write completed */
	ck_assert_int_eq(kvtd_spill_evict_lowest(s, &d), 0);
	ck_assert_uint_eq(d.tag, 101);
	ck_assert_int_eq(kvtd_spill_evict_lowest(s, &d), 0);
	ck_assert_uint_eq(d.tag, 103);
	ck_assert_int_eq(kvtd_spill_evict_lowest(s, &d), 0);
	ck_assert_uint_eq(d.tag, 100);
	/* the last one busy: -EBUSY, not -ENOENT */
	ck_assert_int_eq(kvtd_spill_read(s, e[4], arena, 8192, 2), 0);
	ck_assert_int_eq(kvtd_spill_evict_lowest(s, &d), -EBUSY);
	reap_n(s, &c, 1);
	ck_assert_int_eq(kvtd_spill_evict_lowest(s, &d), 0);
	ck_assert_uint_eq(d.tag, 104);
	ck_assert_int_eq(kvtd_spill_free(s, d.ext), -ENOENT);
	kvtd_spill_get_stats(s, &st);
	ck_assert_uint_eq(st.dropped, 6);
	ck_assert_uint_eq(st.dropped_bytes, 6 * 8192);
	ck_assert_uint_eq(st.free, 8ull << 20);
	kvtd_spill_close(s);
}
END_TEST

/* A row and a block, written then read back into other memory, bit for bit. */
START_TEST(t_roundtrip_row_and_block)
{
	struct kvtd_spill *s = open_store(32ull << 20, 4, 0, 0);
	uint64_t sizes[] = {ROW, 4096, 4096 + ROW, BLOCK, BLOCK + 100};
	struct kvtd_spill_cqe c[2];

	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint64_t n = sizes[i], off, bytes;
		uint8_t *src = arena, *dst = arena + (16u << 20);
		kvtd_spill_ext e;

		ck_assert_int_eq(kvtd_spill_alloc(s, 1000, n, 1, i, &e), 0);
		ck_assert_int_eq(kvtd_spill_extent(s, e, &off, &bytes), 0);
		ck_assert_uint_eq(bytes, (n + 4095) / 4096 * 4096);
		ck_assert_uint_eq(off % 4096, 0);
		fill(src, n, 7 + i);
		memset(dst, 0xa5, bytes + 4096);
		ck_assert_int_eq(kvtd_spill_write(s, e, src, n, 10 + i), 0);
		reap_n(s, c, 1);
		ck_assert_msg(c[0].res == (int)n, "%d: %s", c[0].res, c[0].reason);
		ck_assert_uint_eq(c[0].cookie, 10 + i);
		ck_assert_uint_eq(c[0].ext, e);
		ck_assert_int_eq(c[0].op, KVTD_SPILL_OP_WRITE);
		ck_assert_int_eq(kvtd_spill_read(s, e, dst, n, 20 + i), 0);
		reap_n(s, c, 1);
		ck_assert_msg(c[0].res == (int)n, "%d: %s", c[0].res, c[0].reason);
		ck_assert_int_eq(c[0].op, KVTD_SPILL_OP_READ);
		ck_assert_msg(!memcmp(src, dst, n), "size %llu differs", (unsigned long long)n);
		/* whole units move: nothing past the padded length is touched */
		ck_assert_uint_eq(dst[bytes], 0xa5);
		ck_assert_int_eq(kvtd_spill_free(s, e), 0);
	}
	kvtd_spill_close(s);
}
END_TEST

/* Hundreds of rows and blocks at queue depth 32: always 32 in flight, every one bit-exact. */
START_TEST(t_qd32_many)
{
	enum { N = 400, QD = 32 };
	struct kvtd_spill *s = open_store(512ull << 20, QD, 0, 0);
	struct kvtd_spill_cqe c[QD];
	kvtd_spill_ext e[N];
	uint64_t len[N], seed = 11;
	uint8_t *src, *dst;
	struct pollfd pfd;
	struct kvtd_spill_stats st;
	size_t span = 0;
	uint64_t ev;

	/* each request has its own memory: rows and blocks, a quarter blocks */
	uint64_t at[N];

	for (int i = 0; i < N; i++) {
		len[i] = i % 4 == 3 ? BLOCK / 16 + (kvt_test_splitmix(&seed) % 64) * 512
				    : ROW * (1 + kvt_test_splitmix(&seed) % 5);
		at[i] = span;
		span += (len[i] + 4095) / 4096 * 4096;
		ck_assert_int_eq(kvtd_spill_alloc(s, 1000, len[i], i, i, &e[i]), 0);
	}
	ck_assert_uint_le(2 * span, ARENA);
	src = arena;
	dst = arena + span;
	fill(src, span, 3);
	memset(dst, 0, span);
	for (int pass = 0; pass < 2; pass++) {
		int next = 0, done = 0;

		while (done < N) {
			while (next < N) {
				int r = pass ? kvtd_spill_read(s, e[next], dst + at[next],
							       len[next], (uint64_t)next)
					     : kvtd_spill_write(s, e[next], src + at[next],
								len[next], (uint64_t)next);
				if (r == -EBUSY)
					break;
				ck_assert_int_eq(r, 0);
				next++;
			}
			kvtd_spill_get_stats(s, &st);
			ck_assert_uint_le(st.in_flight, QD);
			if (next < N)
				ck_assert_uint_eq(st.in_flight, QD); /* -EBUSY only when full */
			ck_assert_int_ge(kvtd_spill_submit(s), 0);
			/* the eventfd is what a poller would arm */
			pfd = (struct pollfd){kvtd_spill_fd(s), POLLIN, 0};
			ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
			ck_assert_int_eq(read(pfd.fd, &ev, sizeof(ev)), sizeof(ev));
			ck_assert_uint_ge(ev, 1);
			int n = kvtd_spill_reap(s, c, QD);

			ck_assert_int_ge(n, 0);
			for (int k = 0; k < n; k++) {
				ck_assert_msg(c[k].res == (int)len[c[k].cookie], "%d: %s", c[k].res,
					      c[k].reason);
				ck_assert_uint_eq(c[k].ext, e[c[k].cookie]);
			}
			done += n;
		}
	}
	for (int i = 0; i < N; i++)
		ck_assert_msg(!memcmp(src + at[i], dst + at[i], len[i]), "request %d differs", i);
	kvtd_spill_get_stats(s, &st);
	ck_assert_uint_eq(st.writes, N);
	ck_assert_uint_eq(st.reads, N);
	ck_assert_uint_eq(st.write_errors + st.read_errors, 0);
	kvtd_spill_close(s);
}
END_TEST

/* Each kind of fault fails its own request, with a reason, and no other: its neighbours in the
 * same batch complete and read back exact, and the failed extent works again afterwards. */
START_TEST(t_faults)
{
	enum { N = 8 };
	struct kvtd_spill *s = open_store(16ull << 20, 16, 0, 0);
	struct {
		unsigned ops;
		int kind, want;
		const char *why;
	} f[] = {
	    {KVTD_SPILL_OP_WRITE, -EIO, -EIO, "write of"},
	    {KVTD_SPILL_OP_WRITE, -ENOSPC, -ENOSPC, "No space left"},
	    {KVTD_SPILL_OP_WRITE, KVTD_SPILL_FAULT_SHORT, -EIO, "short write"},
	    {KVTD_SPILL_OP_READ, -EIO, -EIO, "read of"},
	    {KVTD_SPILL_OP_READ, KVTD_SPILL_FAULT_SHORT, -EIO, "short read"},
	};
	struct kvtd_spill_cqe c[N];
	struct kvtd_spill_stats st;
	kvtd_spill_ext e[N];
	uint8_t *src = arena, *dst = arena + (8u << 20);
	uint64_t len = 2 * 4096 + ROW;

	for (int i = 0; i < N; i++)
		ck_assert_int_eq(kvtd_spill_alloc(s, 1000, len, 1, i, &e[i]), 0);
	ck_assert_int_eq(kvtd_spill_inject(s, 0, -EIO, 1), -EINVAL);
	ck_assert_int_eq(kvtd_spill_inject(s, KVTD_SPILL_OP_READ, -EPERM, 1), -EINVAL);
	for (unsigned k = 0; k < sizeof(f) / sizeof(f[0]); k++) {
		int failed = -1, nfail = 0;

		fill(src, N * 12288, 100 + k);
		memset(dst, 0, N * 12288);
		if (f[k].ops == KVTD_SPILL_OP_READ) {
			for (int i = 0; i < N; i++)
				ck_assert_int_eq(kvtd_spill_write(s, e[i], src + i * 12288, len, i),
						 0);
			reap_n(s, c, N);
			for (int i = 0; i < N; i++)
				ck_assert_int_eq(c[i].res, (int)len);
		}
		/* the third request of the batch fails, and the next two do not */
		for (int i = 0; i < N; i++) {
			if (i == 2)
				ck_assert_int_eq(kvtd_spill_inject(s, f[k].ops, f[k].kind, 1), 0);
			if (f[k].ops == KVTD_SPILL_OP_READ)
				ck_assert_int_eq(kvtd_spill_read(s, e[i], dst + i * 12288, len, i),
						 0);
			else
				ck_assert_int_eq(kvtd_spill_write(s, e[i], src + i * 12288, len, i),
						 0);
		}
		reap_n(s, c, N);
		for (int i = 0; i < N; i++) {
			if (c[i].res >= 0) {
				ck_assert_int_eq(c[i].res, (int)len);
				continue;
			}
			nfail++;
			failed = (int)c[i].cookie;
			ck_assert_int_eq(c[i].res, f[k].want);
			ck_assert_msg(strstr(c[i].reason, f[k].why) &&
					  strstr(c[i].reason, "injected"),
				      "%s", c[i].reason);
			ck_assert_uint_eq(c[i].ext, e[2]);
		}
		ck_assert_int_eq(nfail, 1);
		ck_assert_int_eq(failed, 2);
		if (f[k].ops == KVTD_SPILL_OP_WRITE) {
			/* the others landed: read them back */
			for (int i = 0; i < N; i++)
				ck_assert_int_eq(kvtd_spill_read(s, e[i], dst + i * 12288, len, i),
						 0);
			reap_n(s, c, N);
		}
		for (int i = 0; i < N; i++)
			if (i != failed)
				ck_assert_msg(!memcmp(src + i * 12288, dst + i * 12288, len),
					      "fault %u: extent %d differs", k, i);
		/* the failed extent is usable again: write and read it */
		ck_assert_int_eq(kvtd_spill_write(s, e[2], src + 2 * 12288, len, 99), 0);
		reap_n(s, c, 1);
		ck_assert_int_eq(c[0].res, (int)len);
		ck_assert_int_eq(kvtd_spill_read(s, e[2], dst + 2 * 12288, len, 99), 0);
		reap_n(s, c, 1);
		ck_assert_int_eq(c[0].res, (int)len);
		ck_assert(!memcmp(src + 2 * 12288, dst + 2 * 12288, len));
	}
	kvtd_spill_get_stats(s, &st);
	ck_assert_uint_eq(st.injected, 5);
	ck_assert_uint_eq(st.write_errors, 3);
	ck_assert_uint_eq(st.read_errors, 2);
	ck_assert_uint_eq(st.short_io, 2);
	/* each failure counted once by its cause */
	ck_assert_uint_eq(st.eio_errors, 2);
	ck_assert_uint_eq(st.nospc_errors, 1);
	ck_assert_uint_eq(st.other_errors, 0);
	ck_assert_uint_eq(st.eio_errors + st.nospc_errors + st.short_io + st.other_errors,
			  st.write_errors + st.read_errors);
	kvtd_spill_close(s);
}
END_TEST

START_TEST(t_bad_requests)
{
	struct kvtd_spill *s = open_store(8ull << 20, 2, 0, 0);
	struct kvtd_spill_cqe c[2];
	kvtd_spill_ext e, x;
	uint8_t *heap;
	struct iovec iov[2];

	ck_assert_int_eq(kvtd_spill_alloc(s, 1000, 8192, 1, 0, &e), 0);
	ck_assert_int_eq(kvtd_spill_write(s, e, arena + 512, 4096, 0), -EINVAL); /* unaligned */
	ck_assert_int_eq(kvtd_spill_write(s, e, arena, 8193, 0), -EINVAL);	 /* past it */
	ck_assert_int_eq(kvtd_spill_write(s, e, arena, 0, 0), -EINVAL);
	ck_assert_int_eq(kvtd_spill_write(s, e, arena + ARENA - 4096, 8192, 0), -EINVAL);
	ck_assert_int_eq(posix_memalign((void **)&heap, 4096, 8192), 0);
	ck_assert_int_eq(kvtd_spill_write(s, e, heap, 4096, 0), -EINVAL); /* not registered */
	ck_assert_int_eq(kvtd_spill_read(s, e ^ (1ull << 33), arena, 4096, 0), -ENOENT);
	/* queue depth 2: the third is -EBUSY until one is reaped */
	ck_assert_int_eq(kvtd_spill_alloc(s, 1000, 4096, 1, 0, &x), 0);
	ck_assert_int_eq(kvtd_spill_write(s, e, arena, 8192, 1), 0);
	ck_assert_int_eq(kvtd_spill_write(s, x, arena + 8192, 4096, 2), 0);
	ck_assert_int_eq(kvtd_spill_write(s, x, arena + 8192, 4096, 3), -EBUSY);
	iov[0] = (struct iovec){heap, 8192};
	ck_assert_int_eq(kvtd_spill_register_buffers(s, iov, 1), -EBUSY);
	reap_n(s, c, 2);
	ck_assert_int_eq(kvtd_spill_wait(s), -EAGAIN);
	/* buffers: aligned, not overlapping; replacing them takes the old ones out */
	iov[0] = (struct iovec){arena, 8192};
	iov[1] = (struct iovec){arena + 4096, 8192};
	ck_assert_int_eq(kvtd_spill_register_buffers(s, iov, 2), -EINVAL);
	iov[1] = (struct iovec){heap + 1, 4096};
	ck_assert_int_eq(kvtd_spill_register_buffers(s, iov, 2), -EINVAL);
	iov[1] = (struct iovec){heap, 8192};
	ck_assert_int_eq(kvtd_spill_register_buffers(s, iov, 2), 0);
	ck_assert_int_eq(kvtd_spill_write(s, e, heap, 8192, 0), 0);
	ck_assert_int_eq(kvtd_spill_read(s, x, arena + 8192, 4096, 0), -EINVAL);
	/* closing with a request in flight waits for it */
	kvtd_spill_close(s);
	free(heap);
}
END_TEST

KVT_CHECK_MAIN("spill", 120, setup, teardown, t_open_refusals, t_alloc_and_share, t_evict_lowest,
	       t_roundtrip_row_and_block, t_qd32_many, t_faults, t_bad_requests)
