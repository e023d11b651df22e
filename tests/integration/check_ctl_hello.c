/* SPDX-License-Identifier: MIT */
/*
 * HELLO from a raw client built from proto/ alone: ring sizes at the edges of uint32_t (whose
 * power-of-two rounding must not overflow), and reserved fields that must be zero. Each is
 * refused with -EINVAL and a message, within a short deadline, and the daemon then still
 * serves a session, answers an admin request and stops on SIGTERM.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvt_test.h"

static struct kvtd_proc D;

static void
hello_init(struct kvt_ctl_hello *h, uint64_t id)
{
	memset(h, 0, sizeof(*h));
	h->hdr.type = KVT_CTL_HELLO;
	h->hdr.len = sizeof(*h);
	h->hdr.id = id;
	h->abi_major = KVT_ABI_MAJOR;
	h->abi_minor = KVT_ABI_MINOR;
	snprintf(h->name, sizeof(h->name), "raw-hello");
}

/* Sends @h on a new connection; returns the reply's type, its err in @ret_err (ERROR only) and
 * its message in @msg. Fails the test when no reply comes within 5 s. */
static uint32_t
hello_exchange(const struct kvt_ctl_hello *h, int32_t *ret_err, char *msg, size_t msglen)
{
	static uint8_t buf[KVT_CTL_MAX_MSG];
	const struct kvt_ctl_hdr *rh = (const void *)buf;
	int fd = ctl_raw_connect(D.sock);
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(send(fd, h, sizeof(*h), MSG_NOSIGNAL), (ssize_t)sizeof(*h));
	n = ctl_raw_recv(fd, buf, sizeof(buf), 5000);
	close(fd);
	ck_assert_msg(n >= (ssize_t)sizeof(*rh), "no reply to HELLO sq %u cq %u (%zd)",
		      h->sq_entries, h->cq_entries, n);
	ck_assert_uint_eq(rh->len, (uint32_t)n);
	ck_assert_uint_eq(rh->id, h->hdr.id);
	*ret_err = 0;
	msg[0] = '\0';
	if (rh->type == KVT_CTL_ERROR) {
		const struct kvt_ctl_error *e = (const void *)buf;

		ck_assert_int_eq(n, (ssize_t)sizeof(*e));
		*ret_err = e->err;
		snprintf(msg, msglen, "%.*s", (int)sizeof(e->msg), e->msg);
	}
	return rh->type;
}

/* The daemon still works: a default session is welcomed, STATUS answers, no session is left. */
static void
assert_serving(void)
{
	struct kvt_ctl_hello h;
	struct json_object *o;
	char msg[256];
	int32_t err;

	hello_init(&h, 99);
	ck_assert_uint_eq(hello_exchange(&h, &err, msg, sizeof(msg)), KVT_CTL_WELCOME);
	o = admin_request(D.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(o);
	json_object_put(o);
}

START_TEST(t_hello_huge_sizes)
{
	static const struct {
		uint32_t sq, cq;
		uint64_t arena;
	} cases[] = {
	    {0xffffffffu, 0, 0},
	    {0, 0x80000001u, 0},
	    {0x80000001u, 0, 0},
	    {0x80000000u, 0, 0},
	    {0, 0xffffffffu, 0},
	    {0xffffffffu, 0xffffffffu, 0},
	    {4097, 0, 0},
	    {4096, 8193, 0},
	    {64, 32, 0},
	    {0, 0, UINT64_MAX},
	    {0x7fffffffu, 0x80000000u, 1},
	    {1u << 31, 1u << 31, 0},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct kvt_ctl_hello h;
		char msg[256];
		int32_t err;

		hello_init(&h, 1000 + i);
		h.sq_entries = cases[i].sq;
		h.cq_entries = cases[i].cq;
		h.arena_size = cases[i].arena;
		ck_assert_uint_eq(hello_exchange(&h, &err, msg, sizeof(msg)), KVT_CTL_ERROR);
		ck_assert_int_eq(err, -EINVAL);
		ck_assert_msg(strstr(msg, "limit") || strstr(msg, "above"),
			      "case %zu: message '%s' names no limit", i, msg);
	}
	assert_serving();
	ck_assert(daemon_alive(&D));
}
END_TEST

START_TEST(t_hello_reserved_nonzero)
{
	for (int i = 0; i < 3; i++) {
		struct kvt_ctl_hello h;
		char msg[256];
		int32_t err;

		hello_init(&h, 2000 + (uint64_t)i);
		if (i == 0)
			h.reserved0 = 1;
		else
			h.reserved[i - 1] = 1ull << 63;
		ck_assert_uint_eq(hello_exchange(&h, &err, msg, sizeof(msg)), KVT_CTL_ERROR);
		ck_assert_int_eq(err, -EINVAL);
		ck_assert_msg(strstr(msg, "reserved"), "message '%s' does not say reserved", msg);
	}
	assert_serving();
}
END_TEST

static void
setup(void)
{
	daemon_start(&D, NULL);
}

static void
teardown(void)
{
	/* SIGTERM is read by the main loop: a wedged loop fails here within 30 s */
	ck_assert_int_eq(daemon_stop(&D), 0);
}

KVT_CHECK_MAIN("ctl_hello", 60, setup, teardown, t_hello_huge_sizes, t_hello_reserved_nonzero)
