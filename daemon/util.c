/* SPDX-License-Identifier: MIT */
#include <time.h>

#include "kvtd.h"

uint64_t
kvtd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
