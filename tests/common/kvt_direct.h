/* SPDX-License-Identifier: MIT */
/*
 * kvt_direct.h - where the spill tests put a store: the first of $KVT_SPILL_TEST_DIR, /var/tmp,
 * /tmp and the working directory that is not memory (tmpfs) and where a file opened with
 * O_DIRECT reads 4 KiB back. Include with _GNU_SOURCE defined (O_DIRECT).
 */
#ifndef KVT_DIRECT_H
#define KVT_DIRECT_H

#ifndef _GNU_SOURCE
#error "define _GNU_SOURCE before including kvt_direct.h (O_DIRECT)"
#endif

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <unistd.h>

#define KVT_TMPFS_MAGIC 0x01021994

/* 1 with the directory in @buf, or 0 when none of them will do. */
static inline int
kvt_test_direct_dir(char *buf, size_t len)
{
	const char *cand[] = {getenv("KVT_SPILL_TEST_DIR"), "/var/tmp", "/tmp", "."};

	for (unsigned i = 0; i < sizeof(cand) / sizeof(cand[0]); i++) {
		char p[600];
		struct statfs sfs;
		void *b;
		int fd, ok = 0;

		if (!cand[i] || !cand[i][0])
			continue;
		snprintf(p, sizeof(p), "%s/kvt-direct-probe-%d", cand[i], (int)getpid());
		fd = open(p, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
		if (fd < 0)
			continue;
		if (fstatfs(fd, &sfs) == 0 && sfs.f_type != KVT_TMPFS_MAGIC &&
		    ftruncate(fd, 4096) == 0 && posix_memalign(&b, 4096, 4096) == 0) {
			ok = pread(fd, b, 4096, 0) == 4096;
			free(b);
		}
		close(fd);
		unlink(p);
		if (ok) {
			snprintf(buf, len, "%s", cand[i]);
			return 1;
		}
	}
	return 0;
}

#endif
