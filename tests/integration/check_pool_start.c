/* SPDX-License-Identifier: MIT */
/*
 * Integration: kvtierd refuses a pool this host cannot back, at start, with an exit code and a
 * message that says what to do, and before it has touched the memory: no SIGBUS from hugetlb
 * pages that were never reserved, no growing into the OOM killer.
 *
 * Each run watches the daemon's resident size and kills it past a bound, so a daemon that does
 * start touching a too-large pool fails the test instead of exhausting the host.
 */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include "kvt_test.h"

#define RSS_LIMIT_KB (128 * 1024) /* far below every pool the tests ask for */

struct run {
	int status;	    /* from wait4() */
	long peak_rss_kb;   /* the most seen in /proc, or ru_maxrss, whichever is larger */
	int killed_for_rss; /* the test stopped it for growing */
	char log[8192];	    /* its stderr */
};

/* A /proc/meminfo field in KiB, or -1. */
static long long
meminfo_kb(const char *key)
{
	char line[256];
	size_t klen = strlen(key);
	long long v = -1;
	FILE *f = fopen("/proc/meminfo", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, klen) && line[klen] == ':') {
			v = atoll(line + klen + 1);
			break;
		}
	fclose(f);
	return v;
}

static long
rss_kb(pid_t pid)
{
	char path[64], line[256];
	long v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			v = atol(line + 6);
	fclose(f);
	return v;
}

/*
 * Runs kvtierd with @extra (NULL-ended) after the test's usual flags. @memlock_kb >= 0: the
 * child's RLIMIT_MEMLOCK, and CAP_IPC_LOCK is dropped so that the limit applies (as to the
 * unprivileged service user).
 */
static void
run_kvtierd(const char *const *extra, long memlock_kb, struct run *ret)
{
	const char *bin = getenv("KVTIERD");
	char dir[64], sock[96], logp[96];
	const char *argv[32];
	struct rusage ru;
	int n = 0, fd, exited = 0;
	ssize_t len;
	pid_t pid;

	ck_assert_msg(bin, "KVTIERD is not set");
	kvt_test_tmpdir(dir, sizeof(dir), "pool");
	snprintf(sock, sizeof(sock), "%s/kvtierd.sock", dir);
	snprintf(logp, sizeof(logp), "%s/kvtierd.log", dir);
	argv[n++] = bin;
	argv[n++] = "--config";
	argv[n++] = "/dev/null";
	argv[n++] = "--socket";
	argv[n++] = sock;
	argv[n++] = "--backend";
	argv[n++] = "host";
	argv[n++] = "--log-level";
	argv[n++] = "debug";
	for (int i = 0; extra[i] && n < 31; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	memset(ret, 0, sizeof(*ret));
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		if (memlock_kb >= 0) {
			struct rlimit rl;

			/* Lowering needs no privilege; never above the hard limit already in force
			 */
			getrlimit(RLIMIT_MEMLOCK, &rl);
			if (rl.rlim_max > (rlim_t)memlock_kb << 10)
				rl.rlim_max = (rlim_t)memlock_kb << 10;
			rl.rlim_cur = rl.rlim_max;
			if (setrlimit(RLIMIT_MEMLOCK, &rl) < 0)
				_exit(120);
			/* Root keeps CAP_IPC_LOCK through exec unless the bounding set loses it;
			 * EINVAL/EPERM: not held in the first place, nothing to drop. */
			prctl(PR_CAPBSET_DROP, 14 /* CAP_IPC_LOCK */, 0, 0, 0);
		}
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	/* 5 ms samples: a pool being touched grows by far less than the bound between two. */
	for (int i = 0; i < 24000; i++) {
		siginfo_t si = {0};
		long rss;

		ck_assert_int_eq(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT), 0);
		if (si.si_pid == pid) {
			exited = 1;
			break;
		}
		rss = rss_kb(pid);
		if (rss > ret->peak_rss_kb)
			ret->peak_rss_kb = rss;
		if (rss > RSS_LIMIT_KB) {
			ret->killed_for_rss = 1;
			break;
		}
		usleep(5000);
	}
	if (!exited)
		kill(pid, SIGKILL); /* growing, or still up after 2 minutes (started, or hung) */
	ck_assert_int_eq(wait4(pid, &ret->status, 0, &ru), pid);
	if (ru.ru_maxrss > ret->peak_rss_kb)
		ret->peak_rss_kb = ru.ru_maxrss;

	fd = open(logp, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	len = read(fd, ret->log, sizeof(ret->log) - 1);
	ret->log[len > 0 ? len : 0] = '\0';
	close(fd);
	unlink(logp);
	unlink(sock);
	rmdir(dir);
}

/* A clean refusal: exited by itself with a non-zero code, not killed by a signal or by us. */
static void
assert_refused(const struct run *r, const char *needle)
{
	ck_assert_msg(!r->killed_for_rss, "kvtierd grew past %d MiB before failing; log:\n%s",
		      RSS_LIMIT_KB >> 10, r->log);
	ck_assert_msg(!WIFSIGNALED(r->status), "kvtierd died of signal %d; log:\n%s",
		      WTERMSIG(r->status), r->log);
	ck_assert_msg(WIFEXITED(r->status) && WEXITSTATUS(r->status) != 0,
		      "kvtierd did not fail (status %d); log:\n%s", r->status, r->log);
	ck_assert_msg(strstr(r->log, needle), "message lacks '%s'; log:\n%s", needle, r->log);
	ck_assert_msg(r->peak_rss_kb < RSS_LIMIT_KB, "kvtierd grew to %ld MiB before failing",
		      r->peak_rss_kb >> 10);
}

/* A pool size above what /proc/meminfo calls available, in whole GiB. */
static void
size_above_available(char *buf, size_t len)
{
	long long avail_kb = meminfo_kb("MemAvailable");

	ck_assert_int_gt(avail_kb, 0);
	snprintf(buf, len, "%lluG", (unsigned long long)(avail_kb >> 20) + 4);
}

/* --hugetlb yes with fewer free huge pages than the pool needs (none reserved on most hosts). */
START_TEST(t_hugetlb_without_pages)
{
	long long free_hp = meminfo_kb("HugePages_Free"), hp_kb = meminfo_kb("Hugepagesize");
	unsigned long long pool_mb;
	char size[32];
	struct run r;

	ck_assert_int_ge(free_hp, 0);
	ck_assert_int_gt(hp_kb, 0);
	/* More than every free huge page, in whole huge pages. */
	pool_mb = (unsigned long long)(free_hp * hp_kb / 1024) + 64;
	if (hp_kb > 1024)
		pool_mb = (pool_mb * 1024 + hp_kb - 1) / hp_kb * hp_kb / 1024;
	snprintf(size, sizeof(size), "%lluM", pool_mb);
	{
		const char *extra[] = {"--pool-size", size, "--hugetlb", "yes",
				       "--lock",      "no", NULL};

		run_kvtierd(extra, -1, &r);
	}
	assert_refused(&r, "vm.nr_hugepages");
	ck_assert_msg(strstr(r.log, "huge pages"), "log:\n%s", r.log);
}
END_TEST

/* A pool larger than the memory available: refused before a page of it is touched. */
START_TEST(t_pool_above_memavailable)
{
	char size[32];
	struct run r;

	size_above_available(size, sizeof(size));
	{
		const char *extra[] = {"--pool-size", size, "--lock", "no", NULL};

		run_kvtierd(extra, -1, &r);
	}
	assert_refused(&r, "MemAvailable");
	ck_assert_msg(strstr(r.log, "overcommit"), "the override is not named; log:\n%s", r.log);
}
END_TEST

/* A locked pool above RLIMIT_MEMLOCK without CAP_IPC_LOCK: mlock would fail, after the whole
 * pool was faulted in; refused first instead. */
START_TEST(t_pool_above_memlock)
{
	const char *extra[] = {"--pool-size", "512M", "--lock", "yes", NULL};
	struct run r;

	run_kvtierd(extra, 16 << 10, &r);
	assert_refused(&r, "RLIMIT_MEMLOCK");
	ck_assert_msg(strstr(r.log, "LimitMEMLOCK"), "log:\n%s", r.log);
}
END_TEST

/* The override, as a flag or as [pool] overcommit in the file, skips the MemAvailable check
 * only: the lock limit still stops the same pool, again before it is touched. */
START_TEST(t_overcommit_skips_memavailable)
{
	char size[32], conf[64];
	struct run r;
	FILE *f;

	size_above_available(size, sizeof(size));
	{
		const char *extra[] = {"--pool-size",	    size,  "--lock", "yes",
				       "--pool-overcommit", "yes", NULL};

		run_kvtierd(extra, 16 << 10, &r);
	}
	assert_refused(&r, "RLIMIT_MEMLOCK");
	ck_assert_msg(!strstr(r.log, "MemAvailable"), "override ignored; log:\n%s", r.log);

	snprintf(conf, sizeof(conf), "/tmp/kvt-overcommit-%d.conf", (int)getpid());
	f = fopen(conf, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "[pool]\novercommit = yes\nlock = yes\n");
	fclose(f);
	{
		const char *extra[] = {"--config", conf, "--pool-size", size, NULL};

		run_kvtierd(extra, 16 << 10, &r);
	}
	unlink(conf);
	assert_refused(&r, "RLIMIT_MEMLOCK");
	ck_assert_msg(!strstr(r.log, "MemAvailable"), "override ignored; log:\n%s", r.log);
}
END_TEST

static Suite *
suite(void)
{
	Suite *s = suite_create("pool_start");
	TCase *tc = tcase_create("refuse");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, t_hugetlb_without_pages);
	tcase_add_test(tc, t_pool_above_memavailable);
	tcase_add_test(tc, t_pool_above_memlock);
	tcase_add_test(tc, t_overcommit_skips_memavailable);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	return kvt_check_run(suite());
}
