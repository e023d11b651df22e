/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench - front end for the benchmark suite.
 *
 * Each subcommand is its own program, kvtier-bench-<name>, built from tools/bench-<name>/ and
 * installed next to this one (the way git finds its subcommands). That keeps every benchmark
 * self-contained, with only the dependencies it needs (FAISS for retrieval, liburing for ring).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <libgen.h>

static int
self_dir(char *buf, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);

	if (n < 0)
		return -errno;
	buf[n] = '\0';
	dirname(buf);
	return 0;
}

static void
list_subcommands(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, "kvtier-bench-", 13))
			printf("  %s\n", e->d_name + 13);
	closedir(d);
}

int
main(int argc, char **argv)
{
	char dir[PATH_MAX], path[PATH_MAX + 64];
	int r;

	r = self_dir(dir, sizeof(dir));
	if (r < 0) {
		fprintf(stderr, "kvtier-bench: cannot find own directory: %s\n", strerror(-r));
		return 1;
	}
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		printf("usage: kvtier-bench <benchmark> [options]   (kvtier-bench <benchmark> "
		       "--help)\n"
		       "benchmarks:\n");
		list_subcommands(dir);
		return argc < 2 ? 2 : 0;
	}
	if (strchr(argv[1], '/')) {
		fprintf(stderr, "kvtier-bench: bad benchmark name '%s'\n", argv[1]);
		return 2;
	}
	snprintf(path, sizeof(path), "%s/kvtier-bench-%s", dir, argv[1]);
	argv[1] = path;
	execv(path, argv + 1);
	fprintf(stderr, "kvtier-bench: unknown benchmark '%s' (%s); run kvtier-bench --help\n",
		argv[1] + strlen(dir) + 14, strerror(errno));
	return 2;
}
