/* SPDX-License-Identifier: MIT */
/*
 * What every test program shares: the seeded generators (one definition each, so a seed means
 * the same sequence in every test), temp files and directories, and the Check runner.
 * Header only: each test is one executable and links Check already.
 */
#ifndef KVT_TEST_H
#define KVT_TEST_H

#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * Knuth's MMIX linear congruential generator. Returns the new 64-bit state; callers take the
 * high bits (the low ones have short periods).
 */
static inline uint64_t
kvt_test_lcg(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return *s;
}

/* A standard normal value by Box-Muller from two kvt_test_lcg() steps (24 high bits each). */
static inline float
kvt_test_lcg_gauss(uint64_t *s)
{
	float u, v;

	u = ((kvt_test_lcg(s) >> 40) + 1) / 16777217.0f;
	v = (kvt_test_lcg(s) >> 40) / 16777216.0f;
	return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}

/* Marsaglia's xorshift64 (13, 7, 17): @s must not be zero. Returns the new state. */
static inline uint64_t
kvt_test_xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* splitmix64: every output bit is usable, deterministic across runs and platforms. */
static inline uint64_t
kvt_test_splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/*
 * A fresh directory /tmp/kvt-@tag-XXXXXX in @buf (short: it holds unix socket paths).
 * Fails the running test when it cannot be made.
 */
static inline void
kvt_test_tmpdir(char *buf, size_t len, const char *tag)
{
	snprintf(buf, len, "/tmp/kvt-%s-XXXXXX", tag);
	ck_assert_msg(mkdtemp(buf), "mkdtemp %s failed", buf);
}

/* A fresh file /tmp/kvt-@tag-XXXXXX in @buf, open for reading and writing: returns its fd. */
static inline int
kvt_test_tmpfile(char *buf, size_t len, const char *tag)
{
	int fd;

	snprintf(buf, len, "/tmp/kvt-%s-XXXXXX", tag);
	fd = mkstemp(buf);
	ck_assert_msg(fd >= 0, "mkstemp %s failed", buf);
	return fd;
}

/* Runs @s (forking per test unless CK_FORK=no) and frees it: the process exit status. */
static inline int
kvt_check_run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/*
 * One suite with one test case, both called @name: @timeout_s (0 keeps Check's default of 4 s
 * or CK_DEFAULT_TIMEOUT), a checked fixture when @setup or @teardown is not NULL, @tests in
 * order.
 */
static inline int
kvt_check_main(const char *name, int timeout_s, SFun setup, SFun teardown,
	       const TTest *const *tests, size_t n)
{
	Suite *s = suite_create(name);
	TCase *tc = tcase_create(name);

	if (setup || teardown)
		tcase_add_checked_fixture(tc, setup, teardown);
	if (timeout_s)
		tcase_set_timeout(tc, timeout_s);
	for (size_t i = 0; i < n; i++)
		if (!getenv("KVT_TEST_ONLY") || strstr(getenv("KVT_TEST_ONLY"), tests[i]->name))
			tcase_add_test(tc,
				       tests[i]); /* KVT_TEST_ONLY: the tests it names, by hand */
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}

/* The main() of a test program that is one suite of plain tests (see kvt_check_main()). */
#define KVT_CHECK_MAIN(name, timeout_s, setup, teardown, ...)                                      \
	int main(void)                                                                             \
	{                                                                                          \
		const TTest *const kvt_tests_[] = {__VA_ARGS__};                                   \
                                                                                                   \
		return kvt_check_main(name, timeout_s, setup, teardown, kvt_tests_,                \
				      sizeof(kvt_tests_) / sizeof(kvt_tests_[0]));                 \
	}

#endif
