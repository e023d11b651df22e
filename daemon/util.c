/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <liburing.h>
#include <time.h>

#include "kvtd.h"

uint64_t
kvtd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int
kvtd_ring_poll(struct kvtd *d, int fd, unsigned events, uint64_t user_data)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(d->ring);

	if (!sqe) {
		io_uring_submit(d->ring);
		sqe = io_uring_get_sqe(d->ring);
		if (!sqe)
			return -EBUSY;
	}
	io_uring_prep_poll_add(sqe, fd, events);
	io_uring_sqe_set_data64(sqe, user_data);
	return 0;
}
