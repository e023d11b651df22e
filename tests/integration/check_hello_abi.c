/* SPDX-License-Identifier: MIT */
/*
 * HELLO's ABI check from a raw client (proto/ only): any major but the daemon's own, older or
 * newer, is refused with -EPROTO and a message naming both versions, before a session exists
 * (no descriptors in the reply, no session in STATUS); a newer minor of the same major is a
 * compatible client and gets its session. libkvtier cannot send an older major (its abi_major
 * option 0 means "mine"), so these HELLOs are written by hand.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

static struct kvtd_proc D;

struct reply {
	union {
		struct kvt_ctl_hdr hdr;
		struct kvt_ctl_welcome w;
		struct kvt_ctl_error e;
	} m;
	ssize_t len;
	int nfds;
};

/* One well-formed HELLO with @major.@minor on a fresh connection; its reply (descriptors
 * counted and closed). The connection is returned in @ret_sock. */
static struct reply
hello(uint16_t major, uint16_t minor, uint64_t id, int *ret_sock)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvt_ctl_hello h = {.hdr = {.type = KVT_CTL_HELLO, .len = sizeof(h), .id = id}};
	union {
		char b[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct reply r = {.len = -1};
	struct iovec iov = {&r.m, sizeof(r.m)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b)};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct pollfd pfd = {.fd = fd, .events = POLLIN};

	ck_assert_int_ge(fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", D.sock);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	h.abi_major = major;
	h.abi_minor = minor;
	h.features = KVT_FEAT_ALL;
	snprintf(h.name, sizeof(h.name), "abi-%u.%u", major, minor);
	ck_assert_int_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
	/* an answer, not a hangup or silence (the daemon's own hello timeout is far longer) */
	ck_assert_msg(poll(&pfd, 1, 10000) == 1, "no reply to a HELLO of ABI %u.%u", major, minor);
	r.len = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
				close(((int *)CMSG_DATA(cm))[i]);
				r.nfds++;
			}
	*ret_sock = fd;
	return r;
}

static int64_t
sessions(void)
{
	struct json_object *o = admin_request(D.sock, KVT_CTL_STATUS);
	int64_t n = o ? json_get_i64(o, "sessions") : -1;

	if (o)
		json_object_put(o);
	return n;
}

START_TEST(t_other_majors_refused)
{
	const uint16_t majors[] = {KVT_ABI_MAJOR - 1, 0, KVT_ABI_MAJOR + 1, 0xffff};
	char want[64];

	for (unsigned i = 0; i < sizeof(majors) / sizeof(majors[0]); i++) {
		int sock;
		struct reply r = hello(majors[i], KVT_ABI_MINOR, 100 + i, &sock);

		ck_assert_msg(r.len == (ssize_t)sizeof(r.m.e) && r.m.hdr.type == KVT_CTL_ERROR,
			      "HELLO of ABI major %u: reply type %u, %zd bytes (want an ERROR)",
			      majors[i], r.m.hdr.type, r.len);
		ck_assert_uint_eq(r.m.hdr.id, 100 + i);
		ck_assert_int_eq(r.m.e.err, -EPROTO);
		ck_assert_int_eq(r.nfds, 0); /* no region, no doorbells */
		ck_assert_ptr_nonnull(memchr(r.m.e.msg, '\0', sizeof(r.m.e.msg)));
		/* a person can tell what is wrong: the ABI, the client's version and the daemon's
		 */
		ck_assert_ptr_nonnull(strstr(r.m.e.msg, "ABI"));
		snprintf(want, sizeof(want), "%u.%u", majors[i], KVT_ABI_MINOR);
		ck_assert_msg(strstr(r.m.e.msg, want), "message \"%s\" lacks \"%s\"", r.m.e.msg,
			      want);
		snprintf(want, sizeof(want), "%u.%u", KVT_ABI_MAJOR, KVT_ABI_MINOR);
		ck_assert_msg(strstr(r.m.e.msg, want), "message \"%s\" lacks \"%s\"", r.m.e.msg,
			      want);
		close(sock);
		ck_assert_int_eq(sessions(), 0);
	}
	ck_assert(daemon_alive(&D));
}
END_TEST

/* The same major with any minor is the daemon's ABI: a session, and it works. */
START_TEST(t_same_major_any_minor)
{
	const uint16_t minors[] = {0, KVT_ABI_MINOR, KVT_ABI_MINOR + 1, 0xffff};
	struct kvt_client *c;

	for (unsigned i = 0; i < sizeof(minors) / sizeof(minors[0]); i++) {
		int sock;
		struct reply r = hello(KVT_ABI_MAJOR, minors[i], 200 + i, &sock);

		ck_assert_msg(r.m.hdr.type == KVT_CTL_WELCOME, "HELLO of ABI %u.%u refused: %d %s",
			      KVT_ABI_MAJOR, minors[i],
			      r.m.hdr.type == KVT_CTL_ERROR ? r.m.e.err : 0,
			      r.m.hdr.type == KVT_CTL_ERROR ? r.m.e.msg : "");
		ck_assert_uint_eq(r.m.hdr.id, 200 + i);
		ck_assert_uint_eq(r.m.w.abi_major, KVT_ABI_MAJOR);
		ck_assert_int_eq(r.nfds, 3);
		close(sock);
	}
	ck_assert_int_eq(kvt_connect(D.sock, NULL, &c), 0);
	ck_assert_int_eq(kvt_nop(c), 0);
	kvt_disconnect(c);
}
END_TEST

static void
up(void)
{
	daemon_start(&D, NULL);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

KVT_CHECK_MAIN("hello_abi", 60, up, down, t_other_majors_refused, t_same_major_any_minor)
