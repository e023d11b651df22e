/* SPDX-License-Identifier: MIT */
/*
 * The control socket against random and malformed messages, from outside: raw SOCK_SEQPACKET
 * connections to a real kvtierd send messages of every type and none, lengths that lie, random
 * payloads, and descriptors of every kind (sealed and unsealed memfds, a pipe, an eventfd, none,
 * several), sometimes after a HELLO (sane, or with any ring and arena sizes, features and
 * reserved fields: those out of limits must be refused). The daemon must answer every message
 * it keeps the connection for with exactly one reply carrying the request's id, close only
 * connections that never said HELLO, stay up, serve a well-behaved client between rounds, and hold
 * no session, sequence or pool byte once every connection is gone. Seeded: the same messages every
 * run ($KVT_CTL_FUZZ_SEED and $KVT_CTL_FUZZ_ROUNDS change the seed and the count, for
 * tests/fuzz/long.sh).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

#define ROUNDS 400 /* connections; $KVT_CTL_FUZZ_ROUNDS overrides (tests/fuzz/long.sh) */

static struct kvtd_proc D;
static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t
rnd(void)
{
	return (uint32_t)(kvt_test_xorshift(&rng) >> 32);
}

static int
raw_connect(void)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", D.sock);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* A descriptor to pass along, of a random kind (the caller closes it), or -1. */
static int
some_fd(void)
{
	int fd = -1, p[2];

	switch (rnd() % 6) {
	case 0: /* sealed memfd, the size a BUF_REGISTER may claim */
	case 1: /* unsealed memfd */
		fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(ftruncate(fd, 1 << 16), 0);
		if (rnd() % 2)
			fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
		break;
	case 2:
		ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
		close(p[1]);
		fd = p[0];
		break;
	case 3:
		fd = eventfd(0, EFD_CLOEXEC);
		break;
	default:
		break;
	}
	return fd;
}

static void
send_msg(int sock, const void *buf, size_t len, int nfds)
{
	union {
		char b[CMSG_SPACE(3 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	int fds[3], n = 0;

	for (int i = 0; i < nfds; i++) {
		int fd = some_fd();

		if (fd >= 0)
			fds[n++] = fd;
	}
	if (n) {
		struct cmsghdr *cm;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = CMSG_SPACE(n * sizeof(int));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(n * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
	}
	/* EPIPE/ECONNRESET: the daemon closed a connection that never said HELLO */
	(void)sendmsg(sock, &mh, MSG_NOSIGNAL);
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

/* One reply (descriptors it carries are closed). Returns its header id, or -1 at EOF/timeout. */
static int64_t
recv_reply(int sock, uint32_t *ret_type)
{
	static uint8_t buf[KVT_CTL_MAX_MSG];
	union {
		char b[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b)};
	struct pollfd pfd = {.fd = sock, .events = POLLIN};
	const struct kvt_ctl_hdr *h = (const void *)buf;
	ssize_t n;

	if (poll(&pfd, 1, 5000) != 1)
		return -1;
	n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	if (n <= 0)
		return -1;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
				close(((int *)CMSG_DATA(cm))[i]);
	ck_assert_int_ge(n, (ssize_t)sizeof(*h));
	ck_assert_uint_eq(h->len, (uint32_t)n);
	*ret_type = h->type;
	return (int64_t)h->id;
}

/* A ring size for a HELLO: an edge of uint32_t, of the daemon's limits (4096, 8192), or any. */
static uint32_t
any_u32(void)
{
	static const uint32_t edge[] = {
	    0,	  1,	2,	     3,		  4095,	       4096,	    4097,
	    8192, 8193, 0x7fffffffu, 0x80000000u, 0x80000001u, 0xfffffffeu, 0xffffffffu};

	switch (rnd() % 3) {
	case 0:
		return edge[rnd() % (sizeof(edge) / sizeof(edge[0]))];
	case 1:
		return 1u << (rnd() % 32);
	default:
		return rnd();
	}
}

/* Does a HELLO break a limit of the default config, so that it must be refused? */
static int
hello_out_of_limits(const struct kvt_ctl_hello *m)
{
	uint32_t sq = m->sq_entries ? m->sq_entries : 256;

	return m->sq_entries > 4096 || m->cq_entries > 8192 ||
	       (m->cq_entries && m->cq_entries < sq) || m->arena_size > (256ull << 20) ||
	       m->reserved0 || m->reserved[0] || m->reserved[1];
}

/* A message of a random type (or none), a random or lying length and a random payload. */
static size_t
make_msg(uint8_t *buf, uint64_t id, int hello, int session)
{
	static const uint32_t types[] = {KVT_CTL_HELLO,
					 KVT_CTL_BUF_REGISTER,
					 KVT_CTL_BUF_UNREGISTER,
					 KVT_CTL_EVENT_GET,
					 KVT_CTL_STATUS,
					 KVT_CTL_CLIENTS,
					 KVT_CTL_SEQS,
					 KVT_CTL_WELCOME,
					 KVT_CTL_OK,
					 0};
	struct kvt_ctl_hdr *h = (struct kvt_ctl_hdr *)buf;
	size_t len;

	if (hello) { /* a well-framed HELLO: sane sizes, or any sizes and flags at all */
		struct kvt_ctl_hello *m = (struct kvt_ctl_hello *)buf;

		memset(m, 0, sizeof(*m));
		m->hdr.type = KVT_CTL_HELLO;
		m->abi_major = KVT_ABI_MAJOR;
		m->abi_minor = KVT_ABI_MINOR;
		if (rnd() % 2) {
			m->sq_entries = rnd() % 2 ? 0 : 1u << (rnd() % 13); /* 4096 the most */
			m->arena_size = rnd() % 2 ? 0 : (uint64_t)(1 + rnd() % 64) << 16;
		} else {
			m->sq_entries = any_u32();
			m->cq_entries = any_u32();
			m->arena_size = rnd() % 2 ? (uint64_t)any_u32() << (rnd() % 33)
						  : (uint64_t)rnd() << 32 | rnd();
			m->features = rnd() % 2 ? KVT_FEAT_ALL : (uint64_t)rnd() << 32 | rnd();
			m->abi_minor = (uint16_t)rnd();
			if (rnd() % 8 == 0)
				m->reserved0 = rnd();
			if (rnd() % 8 == 0)
				m->reserved[rnd() % 2] = (uint64_t)rnd() << (rnd() % 33);
		}
		for (size_t i = 0; i < sizeof(m->name); i++) /* not always NUL-terminated */
			m->name[i] = rnd() % 4 ? "fuzz"[i % 4] : (char)rnd();
		len = sizeof(*m);
	} else {
		/* no empty message on a session: a 0-byte SEQPACKET reads as the peer's EOF */
		static const size_t sizes[] = {8, 16, 24, 48, 96, 128, 264, 1000, 0};

		len = sizes[rnd() % (session ? 8 : 9)];
		for (size_t i = 0; i < len; i++)
			buf[i] = rnd() % 4 ? 0 : (uint8_t)rnd();
		if (len >= sizeof(*h))
			h->type = rnd() % 8 ? types[rnd() % 10] : rnd();
	}
	if (len >= sizeof(*h)) {
		h->len = hello || rnd() % 8 ? (uint32_t)len : rnd() % 2000;
		h->id = id;
		if (!hello && h->type == KVT_CTL_BUF_REGISTER && len >= 128 && rnd() % 2) {
			struct kvt_ctl_buf_register *m = (struct kvt_ctl_buf_register *)buf;

			m->kind = rnd() % 4 ? KVT_BUF_HOST_MEMFD : rnd();
			m->size = rnd() % 4 ? 1 << 16 : (uint64_t)rnd() << (rnd() % 32);
		}
	}
	return len;
}

/* Sessions end asynchronously after their socket closes: wait until none is left (and, with
 * @pool, until the pool is empty too). */
static void
wait_idle(int pool)
{
	for (int i = 0; i < 500; i++) {
		struct json_object *o = admin_request(D.sock, KVT_CTL_STATUS);
		int64_t sessions = o ? json_get_i64(o, "sessions") : -1;

		if (o)
			json_object_put(o);
		if (sessions == 0 && (!pool || pool_used(D.sock) == 0))
			return;
		usleep(2000);
	}
	ck_abort_msg("sessions or pool bytes left behind");
}

START_TEST(t_ctl_fuzz)
{
	uint64_t next_id = 1000;
	unsigned closed_early = 0, replies = 0, hellos_refused = 0;
	struct kvtd_usage u0 = {0}, u1;
	int have_u0 = 0;
	uint8_t *buf = malloc(KVT_CTL_MAX_MSG);
	const char *env = getenv("KVT_CTL_FUZZ_ROUNDS");
	int rounds = env && atoi(env) > 0 ? atoi(env) : ROUNDS;
	unsigned long sent_msgs = 0;

	env = getenv("KVT_CTL_FUZZ_SEED"); /* other messages than CI's, same checks */
	if (env && strtoull(env, NULL, 0))
		rng = strtoull(env, NULL, 0);

	for (int round = 0; round < rounds; round++) {
		int sock = raw_connect(), hello = rnd() % 4 != 0, nmsg = 1 + rnd() % 6, session = 0;
		uint64_t sent[8];
		int nsent = 0;

		for (int m = 0; m < nmsg + hello; m++) {
			int is_hello = hello && m == 0;
			size_t len = make_msg(buf, next_id, is_hello, session);
			const struct kvt_ctl_hdr *h = (const void *)buf;
			uint32_t type;
			int64_t id;

			send_msg(sock, buf, len, is_hello ? 0 : (int)(rnd() % 4));
			sent_msgs++;
			/* a message the daemon takes as whole gets its id back */
			if (len >= sizeof(*h) && h->len == len)
				sent[nsent++] = next_id;
			next_id++;
			id = recv_reply(sock, &type);
			if (id < 0) { /* closed: allowed only before a HELLO was taken */
				ck_assert_msg(!session, "a session's connection was closed");
				closed_early++;
				break;
			}
			replies++;
			/* malformed: id 0 or the claimed one; whole: the id we sent */
			if (len >= sizeof(*h) && h->len == len)
				ck_assert_uint_eq((uint64_t)id, sent[nsent - 1]);
			if (is_hello) {
				const struct kvt_ctl_hello *hm = (const void *)buf;

				ck_assert_msg(type == KVT_CTL_WELCOME || type == KVT_CTL_ERROR,
					      "HELLO answered with type %u", type);
				ck_assert_msg(type == KVT_CTL_ERROR || !hello_out_of_limits(hm),
					      "HELLO sq %u cq %u arena %llu reserved %u/%llx/%llx "
					      "welcomed",
					      hm->sq_entries, hm->cq_entries,
					      (unsigned long long)hm->arena_size, hm->reserved0,
					      (unsigned long long)hm->reserved[0],
					      (unsigned long long)hm->reserved[1]);
				session = type == KVT_CTL_WELCOME;
				hellos_refused += type == KVT_CTL_ERROR;
			}
		}
		close(sock);
		if (session) /* else sessions_per_uid (64) refuses the next HELLOs */
			wait_idle(0);
		if (round % 50 == 49) { /* between rounds a proper client gets full service */
			struct kvt_opts o = {.size = sizeof(o), .name = "proper"};
			struct kvt_client *c;
			struct kvt_buf *b;

			ck_assert(daemon_alive(&D));
			ck_assert_int_eq(kvt_connect(D.sock, &o, &c), 0);
			ck_assert_int_eq(kvt_nop(c), 0);
			ck_assert_int_eq(kvt_buf_alloc(c, 1 << 20, &b), 0);
			ck_assert_int_eq(kvt_buf_free(c, b), 0);
			kvt_disconnect(c);
			if (!have_u0) { /* after the first sessions' lazily made state */
				wait_idle(1);
				u0 = daemon_usage(&D);
				have_u0 = 1;
			}
		}
	}
	free(buf);
	printf("check_ctl_fuzz: %d connections, %lu messages, %u replies, %u closed before a "
	       "session, %u HELLOs refused\n",
	       rounds, sent_msgs, replies, closed_early, hellos_refused);
	ck_assert(daemon_alive(&D));
	ck_assert_uint_gt(replies, (unsigned)rounds);
	ck_assert_uint_gt(closed_early, 0);
	wait_idle(1);  /* every connection gone: no session, no pool byte left */
	if (have_u0) { /* and the descriptors and mappings of the first 50 rounds' end */
		u1 = daemon_usage(&D);
		printf("check_ctl_fuzz: daemon after round 50 -> end: fds %ld -> %ld, maps %ld -> "
		       "%ld, RSS %ld -> %ld kB\n",
		       u0.fds, u1.fds, u0.maps, u1.maps, u0.rss_kb, u1.rss_kb);
		ck_assert_int_eq(u1.fds, u0.fds);
		if (!u1.sanitized)
			ck_assert_int_eq(u1.maps, u0.maps);
	}
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
	ck_assert_int_eq(daemon_stop(&D), 0);
}

KVT_CHECK_MAIN("ctl_fuzz", 300, setup, teardown, t_ctl_fuzz)
