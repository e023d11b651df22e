/* SPDX-License-Identifier: MIT */
/*
 * test_req.h - assertions for hot test loops, and the tests' random numbers.
 *
 * Check's ck_assert_* write to a pipe on every passing assertion (its "mark point"), which costs
 * a syscall each; checks that run millions of times use these, which only call into Check on
 * failure.
 */
#ifndef KVT_TEST_REQ_H
#define KVT_TEST_REQ_H

#include <check.h>
#include <math.h>
#include <stdint.h>

#include "kvt_test.h"

#define REQ(c)                                                                                     \
	do {                                                                                       \
		if (!(c))                                                                          \
			ck_abort_msg("%s:%d: assertion '%s' failed", __FILE__, __LINE__, #c);      \
	} while (0)
#define REQ_MSG(c, ...)                                                                            \
	do {                                                                                       \
		if (!(c))                                                                          \
			ck_abort_msg(__VA_ARGS__);                                                 \
	} while (0)
#define REQ_CMP(a, op, b)                                                                          \
	do {                                                                                       \
		long long a_ = (long long)(a), b_ = (long long)(b);                                \
		if (!(a_ op b_))                                                                   \
			ck_abort_msg("%s:%d: '%s %s %s' failed: %lld vs %lld", __FILE__, __LINE__, \
				     #a, #op, #b, a_, b_);                                         \
	} while (0)
#define REQ_EQ(a, b) REQ_CMP(a, ==, b)
#define REQ_LT(a, b) REQ_CMP(a, <, b)
#define REQ_LE(a, b) REQ_CMP(a, <=, b)
#define REQ_GT(a, b) REQ_CMP(a, >, b)
#define REQ_GE(a, b) REQ_CMP(a, >=, b)

/* Deterministic data: splitmix64 (kvt_test_splitmix()), a uniform double in (0, 1), a standard
 * normal (Box-Muller). Each test file has its own state; a test that wants a fixed stream sets
 * test_rng_state. */
static uint64_t test_rng_state;

static inline uint64_t
test_rand64(void)
{
	return kvt_test_splitmix(&test_rng_state);
}

static inline double
test_urand(void)
{
	return ((test_rand64() >> 11) + 0.5) * 0x1.0p-53;
}

static inline float
test_grand(void)
{
	return (float)(sqrt(-2.0 * log(test_urand())) * cos(6.283185307179586 * test_urand()));
}

#endif
