/* SPDX-License-Identifier: MIT */
/*
 * Descriptors a peer passes on the control socket never stay in the daemon: whatever message
 * carries them (none of the types that take one, malformed, or an empty SOCK_SEQPACKET message,
 * which reads like the peer's EOF), before or after HELLO, the daemon's descriptor count is back
 * at its baseline once the connections are gone. Otherwise any peer could fill the daemon's
 * descriptor table and lock every client out.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

static struct kvtd_proc D;

/* Sends @len bytes of @msg with @nfds fresh memfds attached (closed here after the send). */
static void
send_with_fds(int sock, const void *msg, size_t len, int nfds)
{
	union {
		char b[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {(void *)msg, len};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = ctl.b,
			    .msg_controllen = CMSG_SPACE(nfds * sizeof(int))};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	int fds[4];

	for (int i = 0; i < nfds; i++) {
		fds[i] = memfd_create("passed", MFD_CLOEXEC);
		ck_assert_int_ge(fds[i], 0);
	}
	memset(&ctl, 0, sizeof(ctl));
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	ck_assert_int_eq(sendmsg(sock, &mh, MSG_NOSIGNAL), (ssize_t)len);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
}

static int
connect_raw(void)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", D.sock);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* A session's connection: HELLO answered with WELCOME (its descriptors closed). */
static int
connect_session(void)
{
	struct kvt_ctl_hello h = {.hdr = {.type = KVT_CTL_HELLO, .len = sizeof(h), .id = 1},
				  .abi_major = KVT_ABI_MAJOR,
				  .abi_minor = KVT_ABI_MINOR};
	int fd = connect_raw();
	uint8_t buf[256];

	ck_assert_int_eq(send(fd, &h, sizeof(h), 0), sizeof(h));
	ck_assert_int_gt(ctl_raw_recv(fd, buf, sizeof(buf), 5000), 0);
	ck_assert_uint_eq(((struct kvt_ctl_hdr *)buf)->type, KVT_CTL_WELCOME);
	return fd;
}

/* The daemon closed the connection (EOF, or a reset with our last message unread). */
static int
closed(int fd)
{
	uint8_t buf[512];
	ssize_t r = ctl_raw_recv(fd, buf, sizeof(buf), 5000);

	return r == 0 || r == -ECONNRESET;
}

/* Sessions end asynchronously after the hangup. */
static void
wait_no_session(void)
{
	for (int i = 0; i < 500; i++) {
		struct json_object *o = admin_request(D.sock, KVT_CTL_STATUS);
		int64_t n = o ? json_get_i64(o, "sessions") : -1;

		if (o)
			json_object_put(o);
		if (n == 0)
			return;
		usleep(10000);
	}
	ck_abort_msg("sessions left behind");
}

START_TEST(t_passed_fds_never_stay)
{
	struct kvt_ctl_hdr status = {.type = KVT_CTL_STATUS, .len = sizeof(status), .id = 2};
	struct kvt_ctl_buf_unregister unreg = {
	    .hdr = {.type = KVT_CTL_BUF_UNREGISTER, .len = sizeof(unreg), .id = 3}, .buf_id = 9};
	uint8_t junk[40] = {0xff, 0xff, 0xff, 0xff, 40};
	struct kvtd_usage u0, u1;
	uint8_t buf[512];

	u0 = daemon_usage(&D);
	for (int round = 0; round < 20; round++) {
		int pre = connect_raw(), s = connect_session();

		/* on a session: messages that take no descriptor, a malformed one, then an empty
		 * one (the daemon takes it as the end) */
		send_with_fds(s, &status, sizeof(status), 3);
		ck_assert_int_gt(ctl_raw_recv(s, buf, sizeof(buf), 5000), 0);
		send_with_fds(s, &unreg, sizeof(unreg), 2);
		ck_assert_int_gt(ctl_raw_recv(s, buf, sizeof(buf), 5000), 0);
		send_with_fds(s, junk, sizeof(junk), 1);
		ck_assert_int_gt(ctl_raw_recv(s, buf, sizeof(buf), 5000), 0);
		send_with_fds(s, "", 0, 4);
		/* before any HELLO: an empty message with descriptors */
		send_with_fds(pre, "", 0, 4);
		ck_assert(closed(pre));
		ck_assert(closed(s));
		close(pre);
		close(s);
	}
	wait_no_session();
	u1 = daemon_usage(&D);
	ck_assert_msg(u1.fds == u0.fds,
		      "the daemon holds %ld descriptors, %ld before 20 rounds of passed ones",
		      u1.fds, u0.fds);
	ck_assert(daemon_alive(&D));
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

KVT_CHECK_MAIN("ctl_fds", 60, up, down, t_passed_fds_never_stay)
