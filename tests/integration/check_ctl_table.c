/* SPDX-License-Identifier: MIT */
/*
 * The control table (daemon/ctl.c, struct kvtd_ctl_def) gates every request type alike. The test
 * walks the table itself (kvtd_ctl_def()), so a new row is covered without an edit here, and
 * holds each row to the protocol as kvt_ctl.h states it (spec[] below), so that a row with the
 * wrong gate fails:
 *
 * - t_rows_match_protocol: each row's session, admin and admin-only flags and its request size
 *   are the protocol's; each request of the protocol has a row, each row a spec entry.
 * - t_session_types_before_hello: a type that needs a session, sent before HELLO, is refused
 *   -ENOTCONN with a message naming it and the new connection is closed; on an admin connection
 *   the same refusal leaves the connection open. HELLO after HELLO or after an admin request is
 *   -EALREADY.
 * - t_admin_only_types_not_admin: from a peer that is not privileged (uid 65534), each
 *   admin-only type is refused -EPERM with a message naming it, and nothing happened (no
 *   restart); each session type is refused -ENOTCONN as for root.
 * - t_lengths: a request shorter than its row's minimum or longer than its maximum is refused
 *   -EINVAL, "malformed <NAME>", from the state the row needs; the connection goes on unless it
 *   was new.
 *
 * Needs root (to take another uid); as any other user the test fails and says so.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"
#include "harness.h"
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvt_test.h"

#define NOBODY	 65534
#define MAX_TYPE 1024 /* types probed in the table: far past the last request */
#define HDR	 sizeof(struct kvt_ctl_hdr)

/* The requests of kvt_ctl.h: which need a session (buffer registration, EVENT_GET: "Session
 * clients send HELLO first"), which are admin requests ("Admin clients send STATUS/CLIENTS/SEQS/
 * BLOCKS/METRICS without HELLO"), which only privileged peers may send ("RESTART (root, the
 * daemon's uid or admin_gids; -EPERM otherwise)"), and their sizes (header-only requests:
 * BLOCKS carries nothing, METRICS exactly its struct; the others take a longer message). */
static const struct spec {
	uint32_t type;
	const char *name;
	uint32_t min_len, max_len;
	int needs;
	int admin, admin_only;
} spec[] = {
    {KVT_CTL_HELLO, "HELLO", sizeof(struct kvt_ctl_hello), KVT_CTL_MAX_MSG, KVTD_CTL_NEEDS_NEW, 0,
     0},
    {KVT_CTL_BUF_REGISTER, "BUF_REGISTER", sizeof(struct kvt_ctl_buf_register), KVT_CTL_MAX_MSG,
     KVTD_CTL_NEEDS_SESSION, 0, 0},
    {KVT_CTL_BUF_UNREGISTER, "BUF_UNREGISTER", sizeof(struct kvt_ctl_buf_unregister),
     KVT_CTL_MAX_MSG, KVTD_CTL_NEEDS_SESSION, 0, 0},
    {KVT_CTL_EVENT_GET, "EVENT_GET", sizeof(struct kvt_ctl_event_get), KVT_CTL_MAX_MSG,
     KVTD_CTL_NEEDS_SESSION, 0, 0},
    {KVT_CTL_STATUS, "STATUS", HDR, KVT_CTL_MAX_MSG, KVTD_CTL_NEEDS_NONE, 1, 0},
    {KVT_CTL_CLIENTS, "CLIENTS", HDR, KVT_CTL_MAX_MSG, KVTD_CTL_NEEDS_NONE, 1, 0},
    {KVT_CTL_SEQS, "SEQS", HDR, KVT_CTL_MAX_MSG, KVTD_CTL_NEEDS_NONE, 1, 0},
    {KVT_CTL_RESTART, "RESTART", HDR, KVT_CTL_MAX_MSG, KVTD_CTL_NEEDS_NONE, 1, 1},
    {KVT_CTL_METRICS, "METRICS", sizeof(struct kvt_ctl_metrics), sizeof(struct kvt_ctl_metrics),
     KVTD_CTL_NEEDS_NONE, 1, 0},
    {KVT_CTL_BLOCKS, "BLOCKS", HDR, HDR, KVTD_CTL_NEEDS_NONE, 1, 0},
};
#define N_SPEC (sizeof(spec) / sizeof(spec[0]))

static struct kvtd_proc D;
static uint8_t buf[KVT_CTL_MAX_MSG];

static void
start(void)
{
	ck_assert_msg(geteuid() == 0, "check_ctl_table needs root: it connects as uid %d", NOBODY);
	daemon_start(&D, NULL);
	/* the other uid must reach the socket */
	ck_assert_int_eq(chmod(D.dir, 0711), 0);
	ck_assert_int_eq(chmod(D.sock, 0666), 0);
}

/* Sends a zeroed request of @type, @len bytes in all (header included). */
static int
send_req(int fd, uint32_t type, uint32_t len, uint64_t id)
{
	static uint8_t m[KVT_CTL_MAX_MSG];
	struct kvt_ctl_hdr h = {.type = type, .len = len, .id = id};

	memset(m, 0, len);
	memcpy(m, &h, sizeof(h));
	return send(fd, m, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
}

/* Reads one reply: 0 and the error's fields when it is ERROR for @id, else a sentence in @why.
 */
static int
recv_error(int fd, uint64_t id, int *ret_err, char *why, size_t why_len)
{
	const struct kvt_ctl_error *e = (const void *)buf;
	ssize_t n = ctl_raw_recv(fd, buf, sizeof(buf), 5000);

	if (n != (ssize_t)sizeof(*e) || e->hdr.type != KVT_CTL_ERROR || e->hdr.id != id) {
		snprintf(why, why_len, "reply %zd bytes, type %u, id %llu: not ERROR for id %llu",
			 n, n >= (ssize_t)HDR ? e->hdr.type : 0,
			 n >= (ssize_t)HDR ? (unsigned long long)e->hdr.id : 0ull,
			 (unsigned long long)id);
		return -1;
	}
	*ret_err = e->err;
	snprintf(why, why_len, "%.*s", (int)sizeof(e->msg), e->msg);
	return 0;
}

/* Sends @type with @len bytes on @fd; returns 0 when the reply is ERROR @err whose message
 * contains @word, else -1 with what came in @why. */
static int
refused(int fd, uint32_t type, uint32_t len, int err, const char *word, char *why, size_t why_len)
{
	static uint64_t id = 100;
	char msg[256];
	int got;

	id++;
	if (send_req(fd, type, len, id) < 0) {
		snprintf(why, why_len, "send: %s", strerror(errno));
		return -1;
	}
	if (recv_error(fd, id, &got, msg, sizeof(msg)) < 0) {
		snprintf(why, why_len, "%s", msg);
		return -1;
	}
	if (got != err || !strstr(msg, word)) {
		snprintf(why, why_len, "ERROR %d '%s', want %d naming '%s'", got, msg, err, word);
		return -1;
	}
	return 0;
}

#define REFUSED(fd, type, len, err, word)                                                          \
	do {                                                                                       \
		char why_[512];                                                                    \
		ck_assert_msg(refused(fd, type, len, err, word, why_, sizeof(why_)) == 0,          \
			      "type %u (%s), %u bytes: %s", (unsigned)(type), word,                \
			      (unsigned)(len), why_);                                              \
	} while (0)

/* The daemon closed @fd (after answering what it answered). */
static void
assert_closed(int fd, const char *what)
{
	ssize_t n = ctl_raw_recv(fd, buf, sizeof(buf), 5000);

	ck_assert_msg(n == 0 || n == -ECONNRESET, "%s: the connection stayed open (read %zd)", what,
		      n);
}

/* The daemon still answers on @fd. */
static void
assert_open(int fd, const char *what)
{
	struct kvt_ctl_hdr h = {.type = KVT_CTL_STATUS, .len = sizeof(h), .id = 9};
	ssize_t n;

	ck_assert_int_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
	n = ctl_raw_recv(fd, buf, sizeof(buf), 5000);
	ck_assert_msg(n > (ssize_t)HDR && ((struct kvt_ctl_hdr *)buf)->type == KVT_CTL_JSON,
		      "%s: no STATUS reply after it (read %zd)", what, n);
}

/* A new raw connection that has said an admin request (STATUS). */
static int
admin_conn(void)
{
	int fd = ctl_raw_connect(D.sock);

	ck_assert_int_ge(fd, 0);
	assert_open(fd, "admin connection");
	return fd;
}

/* A new raw connection with a session (HELLO answered WELCOME; its descriptors closed). */
static int
session_conn(void)
{
	struct kvt_ctl_hello h;
	int fd = ctl_raw_connect(D.sock);
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	memset(&h, 0, sizeof(h));
	h.hdr.type = KVT_CTL_HELLO;
	h.hdr.len = sizeof(h);
	h.hdr.id = 1;
	h.abi_major = KVT_ABI_MAJOR;
	h.abi_minor = KVT_ABI_MINOR;
	snprintf(h.name, sizeof(h.name), "ctl-table");
	ck_assert_int_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
	n = ctl_raw_recv(fd, buf, sizeof(buf), 5000);
	ck_assert_msg(n > 0 && ((struct kvt_ctl_hdr *)buf)->type == KVT_CTL_WELCOME,
		      "HELLO: no WELCOME (read %zd)", n);
	return fd;
}

START_TEST(t_rows_match_protocol)
{
	unsigned rows = 0;

	for (uint32_t t = 0; t < MAX_TYPE; t++) {
		const struct kvtd_ctl_def *def = kvtd_ctl_def(t);
		const struct spec *sp = NULL;

		for (size_t i = 0; i < N_SPEC; i++)
			if (spec[i].type == t)
				sp = &spec[i];
		if (!def) {
			ck_assert_msg(!sp, "request %s (type %u) has no row in the control table",
				      sp ? sp->name : "", t);
			continue;
		}
		rows++;
		ck_assert_msg(sp,
			      "row %s (type %u) is not a request of kvt_ctl.h as spec[] has it: "
			      "add it to spec[] with the gates the protocol gives it",
			      def->name, t);
		ck_assert_str_eq(def->name, sp->name);
		ck_assert_msg(def->needs == sp->needs, "%s: needs %d, the protocol says %d",
			      def->name, def->needs, sp->needs);
		ck_assert_msg(def->admin == sp->admin, "%s: admin %d, the protocol says %d",
			      def->name, def->admin, sp->admin);
		ck_assert_msg(def->admin_only == sp->admin_only,
			      "%s: admin_only %d, the protocol says %d", def->name, def->admin_only,
			      sp->admin_only);
		ck_assert_msg(def->min_len == sp->min_len && def->max_len == sp->max_len,
			      "%s: length [%u, %u], the protocol says [%u, %u]", def->name,
			      def->min_len, def->max_len, sp->min_len, sp->max_len);
		ck_assert_msg(def->fn, "%s: no handler", def->name);
	}
	ck_assert_uint_eq(rows, N_SPEC);
}
END_TEST

START_TEST(t_session_types_before_hello)
{
	int admin = admin_conn(), sess = session_conn(), n = 0;

	for (uint32_t t = 0; t < MAX_TYPE; t++) {
		const struct kvtd_ctl_def *def = kvtd_ctl_def(t);
		int fd;

		if (!def)
			continue;
		if (def->needs == KVTD_CTL_NEEDS_SESSION) {
			fd = ctl_raw_connect(D.sock);
			ck_assert_int_ge(fd, 0);
			REFUSED(fd, t, def->min_len, -ENOTCONN, def->name);
			assert_closed(fd, def->name);
			close(fd);
			REFUSED(admin, t, def->min_len, -ENOTCONN, def->name);
			assert_open(admin, def->name);
			n++;
		} else if (def->needs == KVTD_CTL_NEEDS_NEW) {
			REFUSED(admin, t, def->min_len, -EALREADY, def->name);
			assert_open(admin, def->name);
			REFUSED(sess, t, def->min_len, -EALREADY, def->name);
			assert_open(sess, def->name);
		}
	}
	ck_assert_int_gt(n, 0);
	close(admin);
	close(sess);
	ck_assert(daemon_alive(&D));
}
END_TEST

START_TEST(t_admin_only_types_not_admin)
{
	int p[2], st, n_only = 0;
	char why[512] = "";
	pid_t pid;

	for (uint32_t t = 0; t < MAX_TYPE; t++)
		n_only += kvtd_ctl_def(t) && kvtd_ctl_def(t)->admin_only;
	ck_assert_int_gt(n_only, 0);
	ck_assert_int_eq(pipe(p), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(p[0]);
		if (setgroups(0, NULL) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0)
			_exit(3);
		for (uint32_t t = 0; t < MAX_TYPE; t++) {
			const struct kvtd_ctl_def *def = kvtd_ctl_def(t);
			int fd, r = 0;

			if (!def || (!def->admin_only && def->needs != KVTD_CTL_NEEDS_SESSION))
				continue;
			fd = ctl_raw_connect(D.sock);
			if (fd < 0)
				_exit(4);
			if (def->admin_only)
				r = refused(fd, t, def->min_len, -EPERM, def->name, why,
					    sizeof(why));
			else
				r = refused(fd, t, def->min_len, -ENOTCONN, def->name, why,
					    sizeof(why));
			close(fd);
			if (r < 0) {
				char line[600];

				snprintf(line, sizeof(line), "%s from uid %d: %s", def->name,
					 NOBODY, why);
				_exit(write(p[1], line, strlen(line)) > 0 ? 1 : 5);
			}
		}
		_exit(0);
	}
	close(p[1]);
	if (read(p[0], why, sizeof(why) - 1) < 0)
		why[0] = '\0';
	close(p[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d: %s", st, why);
	{
		struct json_object *o = admin_request(D.sock, KVT_CTL_STATUS);

		ck_assert_ptr_nonnull(o); /* still serving, not restarted */
		ck_assert_int_eq(json_get_i64(o, "restarts"), 0);
		json_object_put(o);
	}
}
END_TEST

/* A connection in the state @def needs: new for HELLO, a session's, or a new one (which its
 * admin request makes an admin one). */
static int
conn_for(const struct kvtd_ctl_def *def)
{
	int fd;

	if (def->needs == KVTD_CTL_NEEDS_SESSION)
		return session_conn();
	fd = ctl_raw_connect(D.sock);
	ck_assert_int_ge(fd, 0);
	return fd;
}

static void
check_length(const struct kvtd_ctl_def *def, uint32_t t, uint32_t len)
{
	char word[64];
	int fd = conn_for(def);

	snprintf(word, sizeof(word), "malformed %s", def->name);
	REFUSED(fd, t, len, -EINVAL, word);
	if (def->needs == KVTD_CTL_NEEDS_NEW)
		assert_closed(fd, def->name); /* still new: nothing valid said */
	else
		assert_open(fd, def->name);
	close(fd);
}

START_TEST(t_lengths)
{
	int n = 0;

	for (uint32_t t = 0; t < MAX_TYPE; t++) {
		const struct kvtd_ctl_def *def = kvtd_ctl_def(t);

		if (!def)
			continue;
		ck_assert_uint_ge(def->min_len, HDR);
		ck_assert_uint_le(def->max_len, KVT_CTL_MAX_MSG);
		if (def->min_len > HDR) {
			check_length(def, t, def->min_len - 1);
			n++;
		}
		if (def->max_len < KVT_CTL_MAX_MSG) {
			check_length(def, t, def->max_len + 8);
			n++;
		}
	}
	ck_assert_int_gt(n, 0);
	ck_assert(daemon_alive(&D));
}
END_TEST

static void
setup(void)
{
	start();
}

static void
teardown(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

KVT_CHECK_MAIN("ctl_table", 60, setup, teardown, t_rows_match_protocol,
	       t_session_types_before_hello, t_admin_only_types_not_admin, t_lengths)
