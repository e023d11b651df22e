/* SPDX-License-Identifier: MIT */
/*
 * Who may use kvtierd and what they see, with peers of another uid: the test process (root)
 * forks children that drop to uid 65534 (nobody), with or without supplementary groups, and
 * talk to the daemon as raw clients built from proto/.
 *
 * - A refused peer reads -EACCES and a message every time (its HELLO is read before the close,
 *   which would otherwise reach it as ECONNRESET).
 * - allowed_gids and admin_gids honour supplementary groups (SO_PEERGROUPS).
 * - CLIENTS and SEQS show a peer only its own uid's sessions, unless it is root, the daemon's
 *   uid or in admin_gids.
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

#include "harness.h"
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

#define NOBODY	    65534
#define GROUP_USE   4242 /* in allowed_gids */
#define GROUP_ADMIN 4343 /* in admin_gids */

static struct kvtd_proc D;

static void
start_with_config(const char *conf)
{
	ck_assert_msg(geteuid() == 0, "check_ctl_access needs root: it connects as uid %d", NOBODY);
	daemon_start_conf(&D, conf, DAEMON_SHARED, NULL);
}

static void
stop(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

/* What a child reports back through a pipe. */
struct result {
	int eacces, welcome, other; /* HELLO replies */
	int clients, seqs;	    /* entries in CLIENTS / SEQS, -1: no answer */
	int saw_root;		    /* CLIENTS named the root session */
	int own_uid_only;	    /* every CLIENTS entry has uid 65534 */
	char last_msg[256];
};

/* One raw HELLO; returns the connection (the session lives while it is open) or -1, and counts
 * the reply in @r. */
static int
child_hello(struct result *r, const char *name)
{
	static uint8_t buf[KVT_CTL_MAX_MSG];
	struct kvt_ctl_hello h;
	const struct kvt_ctl_error *e = (const void *)buf;
	int fd = ctl_raw_connect(D.sock);
	ssize_t n;

	if (fd < 0) {
		r->other++;
		snprintf(r->last_msg, sizeof(r->last_msg), "connect: %s", strerror(-fd));
		return -1;
	}
	memset(&h, 0, sizeof(h));
	h.hdr.type = KVT_CTL_HELLO;
	h.hdr.len = sizeof(h);
	h.hdr.id = 77;
	h.abi_major = KVT_ABI_MAJOR;
	h.abi_minor = KVT_ABI_MINOR;
	snprintf(h.name, sizeof(h.name), "%s", name);
	if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != sizeof(h)) {
		snprintf(r->last_msg, sizeof(r->last_msg), "send: %s", strerror(errno));
		r->other++;
		close(fd);
		return -1;
	}
	n = ctl_raw_recv(fd, buf, sizeof(buf), 5000);
	if (n == (ssize_t)sizeof(*e) && e->hdr.type == KVT_CTL_ERROR && e->hdr.id == 77 &&
	    e->err == -EACCES) {
		r->eacces++;
		snprintf(r->last_msg, sizeof(r->last_msg), "%.*s", (int)sizeof(e->msg), e->msg);
	} else if (n > 0 && e->hdr.type == KVT_CTL_WELCOME) {
		r->welcome++;
		return fd;
	} else {
		r->other++;
		snprintf(r->last_msg, sizeof(r->last_msg), "reply %zd bytes: %s", n,
			 n < 0 ? strerror((int)-n) : "not -EACCES");
	}
	close(fd);
	return -1;
}

/* CLIENTS and SEQS as this process sees them. */
static void
child_look(struct result *r)
{
	struct json_object *o = admin_request(D.sock, KVT_CTL_CLIENTS), *a;

	r->clients = r->seqs = -1;
	if (o && json_object_object_get_ex(o, "clients", &a)) {
		r->clients = (int)json_object_array_length(a);
		r->own_uid_only = 1;
		for (int i = 0; i < r->clients; i++) {
			struct json_object *e = json_object_array_get_idx(a, i), *v;

			if (json_object_object_get_ex(e, "name", &v) &&
			    !strcmp(json_object_get_string(v), "root-secret"))
				r->saw_root = 1;
			if (json_get_i64(e, "uid") != NOBODY)
				r->own_uid_only = 0;
		}
	}
	json_object_put(o);
	o = admin_request(D.sock, KVT_CTL_SEQS);
	if (o && json_object_object_get_ex(o, "seqs", &a))
		r->seqs = (int)json_object_array_length(a);
	json_object_put(o);
}

enum { DO_REFUSALS, DO_HELLO, DO_LOOK, DO_OWN_SESSION_AND_LOOK };

/* Forks a child that becomes uid/gid 65534 with supplementary @group (0: none), does @what and
 * reports. */
static struct result
as_nobody(gid_t group, int what)
{
	struct result r;
	int p[2], st;
	pid_t pid;

	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(pipe(p), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = -1;

		close(p[0]);
		if (setgroups(group ? 1 : 0, &group) < 0 || setgid(NOBODY) < 0 ||
		    setuid(NOBODY) < 0)
			_exit(3);
		switch (what) {
		case DO_REFUSALS:
			for (int i = 0; i < 100; i++)
				child_hello(&r, "refused");
			break;
		case DO_HELLO:
			fd = child_hello(&r, "by-group");
			break;
		case DO_OWN_SESSION_AND_LOOK:
			fd = child_hello(&r, "nobody-own");
			/* fall through */
		case DO_LOOK:
			child_look(&r);
			break;
		}
		if (fd >= 0)
			close(fd);
		_exit(write(p[1], &r, sizeof(r)) == sizeof(r) ? 0 : 4);
	}
	close(p[1]);
	ck_assert_int_eq(read(p[0], &r, sizeof(r)), (ssize_t)sizeof(r));
	close(p[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
	return r;
}

START_TEST(t_refused_uid_reads_eacces)
{
	struct json_object *o;
	struct result r;

	start_with_config("allowed_uids = 12345\n");
	r = as_nobody(0, DO_REFUSALS);
	ck_assert_msg(r.eacces == 100,
		      "%d of 100 refusals read -EACCES (%d welcomed, %d other: %s)", r.eacces,
		      r.welcome, r.other, r.last_msg);
	ck_assert_msg(strstr(r.last_msg, "not allowed"), "refusal says: %s", r.last_msg);
	o = admin_request(D.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(json_get_i64(o, "refused.auth"), 100);
	json_object_put(o);
	stop();
}
END_TEST

START_TEST(t_allowed_gids_supplementary)
{
	struct result r;

	start_with_config("allowed_uids = 12345\nallowed_gids = 4242\n");
	r = as_nobody(GROUP_USE, DO_HELLO); /* primary group 65534, supplementary 4242 */
	ck_assert_msg(r.welcome == 1, "a member of allowed_gids by a supplementary group: %s",
		      r.last_msg);
	r = as_nobody(0, DO_HELLO);
	ck_assert_int_eq(r.eacces, 1);
	stop();
}
END_TEST

/* A root session with one sequence, and the view of each kind of peer. */
START_TEST(t_sessions_visible_to_owner_and_admins)
{
	struct kvt_opts o = {.size = sizeof(o), .name = "root-secret"};
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = 1,
				   .kv_heads = 1,
				   .head_dim = 16,
				   .dtype = KVT_DTYPE_F32,
				   .delta = 8,
				   .hbm_frac = 0.5f};
	struct json_object *j, *a;
	struct kvt_client *c;
	struct result r;
	uint32_t seq;

	start_with_config("admin_gids = 4343\n");
	ck_assert_int_eq(kvt_connect(D.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);

	/* nobody: its own session only, none of root's, no sequence */
	r = as_nobody(0, DO_OWN_SESSION_AND_LOOK);
	ck_assert_int_eq(r.welcome, 1);
	ck_assert_msg(!r.saw_root, "an unprivileged peer sees root's session");
	ck_assert_int_eq(r.clients, 1);
	ck_assert(r.own_uid_only);
	ck_assert_int_eq(r.seqs, 0);

	/* nobody in admin_gids by a supplementary group: everything */
	r = as_nobody(GROUP_ADMIN, DO_LOOK);
	ck_assert(r.saw_root);
	ck_assert_int_ge(r.clients, 1); /* the last child's session may still be ending */
	ck_assert_int_eq(r.seqs, 1);

	/* root: everything */
	j = admin_request(D.sock, KVT_CTL_SEQS);
	ck_assert(j && json_object_object_get_ex(j, "seqs", &a));
	ck_assert_int_eq(json_object_array_length(a), 1);
	json_object_put(j);
	kvt_disconnect(c);
	stop();
}
END_TEST

KVT_CHECK_MAIN("ctl_access", 120, NULL, NULL, t_refused_uid_reads_eacces,
	       t_allowed_gids_supplementary, t_sessions_visible_to_owner_and_admins)
