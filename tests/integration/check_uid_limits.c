/* SPDX-License-Identifier: MIT */
/*
 * One unprivileged uid cannot take what every user shares: the test process (root) forks
 * children that drop to uid 65534 (nobody) or 65533 and act as a greedy user, and checks that
 * root and the other uid are still served, and that each refusal names its limit, the limit's
 * value and the uid's use.
 *
 * - Control connections: connections_per_uid (default 128) keeps one uid from filling
 *   max_connections; root and another uid connect while it holds all it may.
 * - Pool bytes: pool_share_per_uid (default 50%) keeps one uid from taking the whole pool with
 *   no quota configured; root's APPEND succeeds while it holds all it may. Every -EDQUOT and
 *   -ENOMEM an op gets names the limit, its value and the use.
 * - Pool classes (row sizes, 64 in all): classes_per_uid (default 16) bounds one uid's; prefix
 *   blocks no one references give their classes up under class pressure; the refusal names its
 *   cause.
 *
 * Needs root (to take other uids); as any other user the test fails and says so.
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
#include "kvt_test.h"
#include "kvtier.h"

#define NOBODY 65534
#define OTHER  65533

static struct kvtd_proc D;
static uint8_t buf[KVT_CTL_MAX_MSG];

static void
start_with_config(const char *conf)
{
	ck_assert_msg(geteuid() == 0, "check_uid_limits needs root: it acts as uid %d", NOBODY);
	daemon_start_conf(&D, conf, DAEMON_SHARED, NULL);
}

static void
stop(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

/* A child's process: becomes @uid (and its gid), with no supplementary groups. */
static void
become(uid_t uid)
{
	if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
		_exit(3);
}

/* What a child reports back through a pipe. */
struct result {
	int answered, eusers, other; /* replies to STATUS (or HELLO) */
	int welcome;
	int64_t r;	    /* an op's result */
	int64_t bytes;	    /* pool bytes it came to hold */
	char last_msg[256]; /* the last refusal's message */
};

static void
report(int fd, const struct result *r)
{
	_exit(write(fd, r, sizeof(*r)) == sizeof(*r) ? 0 : 4);
}

static void
reap(pid_t pid)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
}

/* The child's report from @fd, then its exit. */
static struct result
collect(pid_t pid, int fd)
{
	struct result r;

	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(read(fd, &r, sizeof(r)), (ssize_t)sizeof(r));
	close(fd);
	reap(pid);
	return r;
}

/* One raw request of @type on a new connection; counts the reply. Returns the open connection
 * when it was answered, else -1. */
static int
one_request(struct result *r, uint32_t type, uint64_t id)
{
	const struct kvt_ctl_error *e = (const void *)buf;
	struct kvt_ctl_hello h;
	int fd = ctl_raw_connect(D.sock);
	ssize_t n;

	if (fd < 0) {
		r->other++;
		return -1;
	}
	memset(&h, 0, sizeof(h));
	h.hdr.type = type;
	h.hdr.len = type == KVT_CTL_HELLO ? sizeof(h) : sizeof(h.hdr);
	h.hdr.id = id;
	h.abi_major = KVT_ABI_MAJOR;
	h.abi_minor = KVT_ABI_MINOR;
	snprintf(h.name, sizeof(h.name), "uid-limits");
	if (send(fd, &h, h.hdr.len, MSG_NOSIGNAL) != (ssize_t)h.hdr.len) {
		r->other++;
		close(fd);
		return -1;
	}
	n = ctl_raw_recv(fd, buf, sizeof(buf), 10000);
	if (n >= (ssize_t)sizeof(e->hdr) && e->hdr.id == id &&
	    (e->hdr.type == KVT_CTL_JSON || e->hdr.type == KVT_CTL_WELCOME)) {
		r->answered++;
		r->welcome += e->hdr.type == KVT_CTL_WELCOME;
		return fd;
	}
	if (n == (ssize_t)sizeof(*e) && e->hdr.type == KVT_CTL_ERROR && e->err == -EUSERS) {
		r->eusers++;
		snprintf(r->last_msg, sizeof(r->last_msg), "%.*s", (int)sizeof(e->msg), e->msg);
	} else {
		r->other++;
		snprintf(r->last_msg, sizeof(r->last_msg), "reply %zd bytes", n);
	}
	close(fd);
	return -1;
}

/* Runs "kvtierctl --timeout 2 status"; returns its exit status. */
static int
ctl_status(void)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "timeout 30 %s --socket %s --timeout 2 status >/dev/null 2>&1",
		 getenv("KVTIERCTL"), D.sock);
	return WEXITSTATUS(system(cmd));
}

/*
 * nobody opens max_connections connections, each answered a STATUS (what an idle admin client
 * keeps open); past connections_per_uid (default 128) it is refused -EUSERS with a message, and
 * root's kvtierctl status and uid 65533's HELLO are still served.
 */
START_TEST(t_connections_per_uid)
{
	enum { FLOOD = 160, LIMIT = 128 };
	int done[2], rep[2], fds[FLOOD];
	struct result r, o;
	pid_t pid;
	char c;

	start_with_config("[limits]\nmax_connections = 160\n");
	ck_assert_int_eq(pipe(done), 0);
	ck_assert_int_eq(pipe(rep), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(done[1]);
		close(rep[0]);
		become(NOBODY);
		memset(&r, 0, sizeof(r));
		for (int i = 0; i < FLOOD; i++)
			fds[i] = one_request(&r, KVT_CTL_STATUS, 100 + i);
		if (write(rep[1], &r, sizeof(r)) != sizeof(r))
			_exit(4);
		/* hold them until the parent has looked */
		if (read(done[0], &c, 1) != 1)
			_exit(5);
		for (int i = 0; i < FLOOD; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		_exit(0);
	}
	close(done[0]);
	close(rep[1]);
	ck_assert_int_eq(read(rep[0], &r, sizeof(r)), (ssize_t)sizeof(r));
	/* root, and another uid, are served while nobody holds all it may */
	ck_assert_msg(ctl_status() == 0,
		      "root's kvtierctl status failed while nobody holds its connections");
	{
		int p[2];
		pid_t op;

		ck_assert_int_eq(pipe(p), 0);
		op = fork();
		ck_assert_int_ge(op, 0);
		if (op == 0) {
			int fd;

			close(p[0]);
			become(OTHER);
			memset(&o, 0, sizeof(o));
			fd = one_request(&o, KVT_CTL_HELLO, 7);
			if (fd >= 0)
				close(fd);
			report(p[1], &o);
		}
		close(p[1]);
		o = collect(op, p[0]);
		ck_assert_msg(o.welcome == 1, "uid %d: %d welcomed, %d other (%s)", OTHER,
			      o.welcome, o.other, o.last_msg);
	}
	ck_assert_msg(r.answered == LIMIT && r.eusers == FLOOD - LIMIT,
		      "nobody: %d answered, %d -EUSERS, %d other (%s)", r.answered, r.eusers,
		      r.other, r.last_msg);
	ck_assert_msg(strstr(r.last_msg, "connections_per_uid is 128") &&
			  strstr(r.last_msg, "holds 128"),
		      "refusal says: %s", r.last_msg);
	ck_assert_int_eq(write(done[1], "x", 1), 1);
	close(done[1]);
	close(rep[0]);
	reap(pid);
	stop();
}
END_TEST

static void
params_default(struct kvt_seq_params *p)
{
	memset(p, 0, sizeof(*p));
	p->size = sizeof(*p);
	p->layers = 4;
	p->kv_heads = 2;
	p->head_dim = 64;
	p->dtype = KVT_DTYPE_F16;
	p->policy = KVT_POLICY_TIERED;
	p->delta = 64;
	p->sinks = 4;
	p->window = 32;
	p->hbm_frac = 0.5f;
}

/* Appends 64-token batches (2 KiB a token) until one fails; returns that failure, the reason
 * in @why. */
static int64_t
append_until_refused(struct kvt_client *c, uint32_t seq, char *why, size_t len)
{
	static uint8_t rows[64 * 2048];
	int64_t r;

	for (size_t i = 0; i < sizeof(rows); i++)
		rows[i] = (uint8_t)(i * 31);
	while ((r = kvt_append(c, seq, rows, sizeof(rows), 64, NULL)) > 0)
		;
	snprintf(why, len, "%s", kvt_last_error());
	return r;
}

static struct kvt_client *
connect_as(const char *name)
{
	struct kvt_opts o = {.size = sizeof(o), .name = name};
	struct kvt_client *c = NULL;

	return kvt_connect(D.sock, &o, &c) == 0 ? c : NULL;
}

/*
 * No quota configured (the default): uid 65534 appends until refused and holds what it got;
 * root's APPEND is still served, and each refusal names its limit, value and use.
 */
START_TEST(t_pool_share_per_uid)
{
	char why[KVT_OP_ERR_MSG_LEN + 64];
	int done[2], rep[2];
	struct kvt_seq_params p;
	struct kvt_client *c;
	struct result r;
	uint32_t seq;
	pid_t pid;
	char x;

	start_with_config(""); /* 64 MiB pool: 32 MiB is half */
	params_default(&p);
	ck_assert_int_eq(pipe(done), 0);
	ck_assert_int_eq(pipe(rep), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(done[1]);
		close(rep[0]);
		become(NOBODY);
		memset(&r, 0, sizeof(r));
		c = connect_as("greedy");
		if (!c || kvt_seq_open(c, &p, &seq) < 0)
			_exit(6);
		r.r = append_until_refused(c, seq, r.last_msg, sizeof(r.last_msg));
		if (write(rep[1], &r, sizeof(r)) != sizeof(r))
			_exit(4);
		if (read(done[0], &x, 1) != 1) /* hold it until the parent has looked */
			_exit(5);
		kvt_disconnect(c);
		_exit(0);
	}
	close(done[0]);
	close(rep[1]);
	ck_assert_int_eq(read(rep[0], &r, sizeof(r)), (ssize_t)sizeof(r));
	/* root appends while nobody holds all it may */
	c = connect_as("root");
	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	{
		static uint8_t rows[64 * 2048];

		ck_assert_msg(kvt_append(c, seq, rows, sizeof(rows), 64, NULL) == 64,
			      "root's APPEND refused while uid %d holds its share: %s", NOBODY,
			      kvt_last_error());
	}
	ck_assert_msg(r.r == -EDQUOT, "uid %d's APPENDs ended with %lld: %s", NOBODY,
		      (long long)r.r, r.last_msg);
	ck_assert_msg(strstr(r.last_msg, "pool_share_per_uid") &&
			  strstr(r.last_msg, "may hold 33554432 pool bytes and holds 33"),
		      "refusal says: %s", r.last_msg);
	/* root is not held to the share: it fills the pool, and the refusal says so */
	ck_assert_int_eq(append_until_refused(c, seq, why, sizeof(why)), -ENOMEM);
	ck_assert_msg(strstr(why, "pool full: 67108864 bytes, 67108864 in use"), "refusal says: %s",
		      why);
	kvt_disconnect(c);
	ck_assert_int_eq(write(done[1], "x", 1), 1);
	close(done[1]);
	close(rep[0]);
	reap(pid);
	stop();
}
END_TEST

/* A configured per-session quota: the refusal names it, its value and the session's use. */
START_TEST(t_quota_reasons)
{
	char why[KVT_OP_ERR_MSG_LEN + 64];
	struct kvt_seq_params p;
	struct kvt_client *c;
	uint32_t seq;

	start_with_config("[limits]\npool_bytes_per_session = 4M\n");
	params_default(&p);
	c = connect_as("quota");
	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	ck_assert_int_eq(append_until_refused(c, seq, why, sizeof(why)), -EDQUOT);
	ck_assert_msg(strstr(why, "pool_bytes_per_session: a session may hold 4194304 pool bytes "
				  "and this one holds 4194304"),
		      "refusal says: %s", why);
	kvt_disconnect(c);
	stop();
}
END_TEST

/* Sequence parameters whose T1 rows are 64 * @k bytes (k = 1..256): F32, one kv head of 8
 * dimensions, @k layers. */
static struct kvt_seq_params
geom(unsigned k)
{
	struct kvt_seq_params p;

	memset(&p, 0, sizeof(p));
	p.size = sizeof(p);
	p.layers = k;
	p.kv_heads = 1;
	p.head_dim = 8;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 4;
	return p;
}

/*
 * uid 65534 opens sequences of new row sizes until refused: -EDQUOT at classes_per_uid (16),
 * saying so; root then opens one of yet another size. Root, held to no such bound, goes on
 * until no class is left at all: -ENOSPC, saying how many are in use.
 */
START_TEST(t_classes_per_uid)
{
	struct kvt_seq_params p;
	struct kvt_client *c;
	struct result r;
	int rep[2], done[2];
	unsigned k;
	char x;
	uint32_t seq;
	pid_t pid;

	start_with_config("[pool]\nchunk_size = 64K\n");
	ck_assert_int_eq(pipe(rep), 0);
	ck_assert_int_eq(pipe(done), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(rep[0]);
		close(done[1]);
		become(NOBODY);
		memset(&r, 0, sizeof(r));
		c = connect_as("classes");
		if (!c)
			_exit(6);
		for (k = 1; k <= 64; k++) {
			p = geom(k);
			r.r = kvt_seq_open(c, &p, &seq);
			if (r.r < 0)
				break;
			r.answered++;
		}
		snprintf(r.last_msg, sizeof(r.last_msg), "%s", kvt_last_error());
		/* what the uid holds while the parent looks: the sequences stay open */
		if (write(rep[1], &r, sizeof(r)) != sizeof(r))
			_exit(4);
		if (read(done[0], &x, 1) != 1)
			_exit(5);
		kvt_disconnect(c);
		_exit(0);
	}
	close(rep[1]);
	close(done[0]);
	ck_assert_int_eq(read(rep[0], &r, sizeof(r)), (ssize_t)sizeof(r));
	c = connect_as("root");
	ck_assert_ptr_nonnull(c);
	p = geom(256);
	ck_assert_msg(kvt_seq_open(c, &p, &seq) == 0,
		      "root's SEQ_OPEN of a new row size after uid %d's %d: %s", NOBODY, r.answered,
		      kvt_last_error());
	ck_assert_msg(r.r == -EDQUOT && strstr(r.last_msg, "classes_per_uid") &&
			  strstr(r.last_msg, "at most 16"),
		      "uid %d opened %d sequences, then %lld: %s", NOBODY, r.answered,
		      (long long)r.r, r.last_msg);
	/* root has no bound: every class goes, and then the refusal says so */
	for (k = 255; k >= 65; k--) {
		p = geom(k);
		if (kvt_seq_open(c, &p, &seq) < 0)
			break;
	}
	ck_assert_msg(k >= 65, "190 row sizes fit in 64 classes?");
	ck_assert_msg(strstr(kvt_last_error(), "no pool class left") &&
			  strstr(kvt_last_error(), "64 of 64 in use"),
		      "refusal says: %s", kvt_last_error());
	kvt_disconnect(c);
	ck_assert_int_eq(write(done[1], "x", 1), 1);
	close(done[1]);
	close(rep[0]);
	reap(pid);
	stop();
}
END_TEST

/*
 * 64 namespaces of different row sizes, one cached block each, no one holding them: their
 * classes give way to new sequences and namespaces (the blocks no one references evicted as
 * needed), across a restart in place too, rather than every later SEQ_OPEN of a new row size
 * failing -ENOSPC for good.
 */
START_TEST(t_cached_blocks_give_way)
{
	struct kvt_ns_params np;
	struct kvt_seq_params p;
	struct kvt_block_key key;
	struct json_object *o;
	struct kvt_client *c;
	static float rows[64 * 64 / sizeof(float)];
	uint32_t tok = 7, ns, seq, n_new;

	start_with_config("[pool]\nchunk_size = 64K\n");
	c = connect_as("prefix");
	ck_assert_ptr_nonnull(c);
	for (unsigned k = 1; k <= 64; k++) {
		p = geom(k);
		memset(&np, 0, sizeof(np));
		np.size = sizeof(np);
		np.layers = p.layers;
		np.kv_heads = p.kv_heads;
		np.head_dim = p.head_dim;
		np.dtype = p.dtype;
		np.block_tokens = 1;
		snprintf(np.name, sizeof(np.name), "model-%u", k);
		ck_assert_msg(kvt_ns_open(c, &np, &ns) == 0, "NS_OPEN %u: %s", k, kvt_last_error());
		ck_assert_int_eq(kvt_block_keys(&np, NULL, &tok, 1, &key, 1), 1);
		ck_assert_msg(kvt_seq_open_prefix(c, &p, ns, 0, &seq) == 0, "SEQ_OPEN %u: %s", k,
			      kvt_last_error());
		ck_assert_int_eq(kvt_append(c, seq, rows, (uint64_t)64 * k, 1, NULL), 1);
		ck_assert_int_eq(kvt_publish(c, seq, &key, 1, &n_new), 1);
		ck_assert_int_eq(kvt_seq_close(c, seq), 0);
		ck_assert_int_eq(kvt_ns_close(c, ns), 0);
	}
	/* a restart in place keeps them, and their classes (64 blocks in 64 namespaces) */
	kvt_disconnect(c);
	o = admin_request(D.sock, KVT_CTL_RESTART);
	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(json_get_i64(o, "restarted"), 1);
	json_object_put(o);
	o = admin_request(D.sock, KVT_CTL_BLOCKS);
	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(json_get_i64(o, "blocks"), 64);
	json_object_put(o);
	c = connect_as("prefix");
	ck_assert_ptr_nonnull(c);
	/* a row size none of them has */
	p = geom(200);
	ck_assert_msg(kvt_seq_open(c, &p, &seq) == 0, "SEQ_OPEN of a new row size: %s",
		      kvt_last_error());
	/* only what was needed went: most blocks are still cached */
	o = admin_request(D.sock, KVT_CTL_BLOCKS);
	ck_assert_ptr_nonnull(o);
	ck_assert_int_ge(json_get_i64(o, "blocks"), 32);
	json_object_put(o);
	kvt_disconnect(c);
	stop();
}
END_TEST

/* Opens sequences geom(1), geom(2), ... in @c until one is refused: how many opened (their ids
 * in @seq), the refusal in *@ret_r. */
static unsigned
open_until_refused(struct kvt_client *c, uint32_t *seq, int64_t *ret_r)
{
	struct kvt_seq_params p;
	unsigned k;

	for (k = 0; k < 64; k++) {
		p = geom(k + 1);
		*ret_r = kvt_seq_open(c, &p, &seq[k]);
		if (*ret_r < 0)
			break;
	}
	return k;
}

/*
 * classes_per_uid across a restart in place: the classes uid 65534's restored sequences and
 * namespace hold still count (they counted for nothing until they closed, so the uid could
 * take as many again), a new row size past the limit is still -EDQUOT, and closing them gives
 * the classes back to the uid.
 */
START_TEST(t_classes_kept_by_restart)
{
	struct result r;
	int rep[2], go[2];
	char x;
	pid_t pid;

	start_with_config("[pool]\nchunk_size = 64K\n[limits]\nclasses_per_uid = 6\n");
	ck_assert_int_eq(pipe(rep), 0);
	ck_assert_int_eq(pipe(go), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvt_ns_params np = {.size = sizeof(np),
					   .layers = 40,
					   .kv_heads = 1,
					   .head_dim = 8,
					   .dtype = KVT_DTYPE_F32,
					   .block_tokens = 8};
		struct kvt_seq_params p;
		struct kvt_client *c;
		uint32_t seq[64], ns;
		unsigned before, after;

		close(rep[0]);
		close(go[1]);
		become(NOBODY);
		memset(&r, 0, sizeof(r));
		snprintf(np.name, sizeof(np.name), "classes");
		c = connect_as("classes");
		if (!c || kvt_ns_open(c, &np, &ns) < 0)
			_exit(6);
		before = open_until_refused(c, seq, &r.r);
		if (r.r != -EDQUOT || !before)
			_exit(7);
		if (write(rep[1], &r, sizeof(r)) != sizeof(r) || read(go[0], &x, 1) != 1)
			_exit(4);
		/* restarted: the next row size is still one too many */
		p = geom(before + 1);
		r.r = kvt_seq_open(c, &p, &seq[before]);
		snprintf(r.last_msg, sizeof(r.last_msg), "%s", kvt_last_error());
		r.answered = (int)before;
		/* everything closed: the classes are the uid's again, as many as before (more:
		 * the namespace's is free) */
		for (unsigned k = 0; k < before + (r.r >= 0); k++)
			kvt_seq_close(c, seq[k]);
		kvt_ns_close(c, ns);
		after = open_until_refused(c, seq, &r.bytes);
		r.other = (int)after;
		kvt_disconnect(c);
		report(rep[1], &r);
	}
	close(rep[1]);
	close(go[0]);
	ck_assert_int_eq(read(rep[0], &r, sizeof(r)), (ssize_t)sizeof(r));
	{
		struct json_object *o = admin_request(D.sock, KVT_CTL_RESTART), *v;

		ck_assert_msg(o && json_object_object_get_ex(o, "restarted", &v) &&
				  json_object_get_boolean(v),
			      "RESTART: %s", o ? json_object_to_json_string(o) : "no reply");
		json_object_put(o);
	}
	ck_assert_int_eq(write(go[1], "g", 1), 1);
	close(go[1]);
	r = collect(pid, rep[0]);
	ck_assert_msg(r.r == -EDQUOT && strstr(r.last_msg, "classes_per_uid") &&
			  strstr(r.last_msg, "use 6"),
		      "after the restart, with %d sequences and a namespace restored: %lld, %s",
		      r.answered, (long long)r.r, r.last_msg);
	ck_assert_msg(r.other > r.answered && r.bytes == -EDQUOT,
		      "after closing all: %d opened (%d before), then %lld", r.other, r.answered,
		      (long long)r.bytes);
	stop();
}
END_TEST

KVT_CHECK_MAIN("uid_limits", 120, NULL, NULL, t_connections_per_uid, t_pool_share_per_uid,
	       t_quota_reasons, t_classes_per_uid, t_cached_blocks_give_way,
	       t_classes_kept_by_restart)
