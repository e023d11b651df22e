/* SPDX-License-Identifier: MIT */
/*
 * Restart in place (daemon/restart.h) through a real kvtierd and two real client processes:
 *  - t_restart_lossless: two clients run a deterministic workload (appends, scores, a RETIER
 *    every step, FETCH of T1 rows checked against what was appended, TOPK): one with int8 T2
 *    rows under per-channel key scales and eviction, one with a retrieval index and eviction.
 *    Both pause at step 40: a restart there keeps every staged row bit for bit, every sequence's
 *    stat, the pool bytes and the daemon's descriptor count. Two more restarts land while they
 *    run. The final state of each (every T1/T2 row, positions, tiers, TOPK answers) equals that
 *    of the same workload on a daemon never restarted, and after three restarts the daemon holds
 *    as many descriptors as before the first.
 *  - t_restart_refused_image: a kvtierd started with an image it cannot read (corrupt, another
 *    version) says so, ends the sessions it was handed (the peer sees its connection end) and
 *    serves new clients.
 *  - t_restart_not_admin: RESTART from a peer that is not privileged is -EPERM (run as root:
 *    skipped part).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvtier.h"

#include "../../daemon/restart.h"
#include "../../daemon/restart_image.h"
#include "kvt_test.h"

enum { L = 2, H = 2, D = 64, STEP_TOK = 16, STEPS = 90, PAUSE_AT = 40, STAGE = 2048 };
#define ROW (H * D)	  /* floats per (token, layer, K|V) */
#define TOK (L * 2 * ROW) /* floats per token */

/* What a workload ends with: equal between a restarted daemon and an uninterrupted one. */
struct digest {
	uint64_t rows;	   /* FNV of every T1/T2 row staged, in FETCH order */
	uint64_t pos;	   /* FNV of the FETCH positions */
	uint64_t topk;	   /* FNV of TOPK answers (kind 1) */
	uint64_t tiers[4]; /* seq_stat */
	uint64_t pool_bytes, n;
	double score_total;
	int err; /* 0, or the step * 1000 + check that failed */
};

static uint64_t
fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static uint64_t
rnd(uint64_t *s)
{
	return kvt_test_lcg(s) >> 11;
}

static float
rndf(uint64_t *s)
{
	return (float)(rnd(s) & 0xffff) / 65536.0f - 0.5f;
}

static void
wbyte(int fd, char c)
{
	ck_assert_int_eq(write(fd, &c, 1), 1);
}

static char
rbyte(int fd)
{
	char c = 0;

	return read(fd, &c, 1) == 1 ? c : 0;
}

#define FAIL(code)                                                                                 \
	do {                                                                                       \
		dg.err = step * 1000 + (code);                                                     \
		goto out;                                                                          \
	} while (0)

/*
 * Kind 0: int8 T2 with per-channel key scales, 10 % evicted. Kind 1: retrieval (ret_update 16),
 * 10 % evicted, no int8 (so that re-encoded keys are the same keys). Reports progress on @prog
 * after every step; at PAUSE_AT and at the end waits for a byte on @go (when @go >= 0).
 */
static struct digest
workload(const char *sock, int kind, int prog, int go)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	struct digest dg = {0};
	struct kvt_client *c = NULL;
	struct kvt_buf *stage = NULL;
	uint64_t rng = 0x5eed + (uint64_t)kind * 7919;
	float *ref = malloc((size_t)STEPS * STEP_TOK * TOK * sizeof(float));
	float *sc = malloc((size_t)STEPS * STEP_TOK * sizeof(float));
	uint32_t *pos = malloc(STAGE * sizeof(uint32_t)), seq = 0, n = 0;
	uint8_t *rout = malloc(KVT_RETIER_OUT_SIZE(0) + 4096);
	float q[H * D];
	uint8_t tout[H * 4 + H * 8 * 8];
	int step = 0, r;

	dg.rows = dg.pos = dg.topk = 0xcbf29ce484222325ull;
	if (kvt_connect(sock, &o, &c) < 0)
		FAIL(1);
	if (kvt_buf_alloc(c, (size_t)L * 2 * STAGE * ROW * 4, &stage) < 0)
		FAIL(2);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = STEP_TOK;
	p.sinks = 4;
	p.window = 16;
	p.evict_frac = 0.1f;
	p.t2_frac = kind == 0 ? 0.4f : 0.0f;
	p.t2_flags = kind == 0 ? KVT_T2_F_KEY_CHANNEL : 0;
	p.ret_update = kind == 1 ? 16 : 0;
	p.stage_buf_id = kvt_buf_id(stage);
	p.stage_slots = STAGE;
	p.stage_slot_stride = ROW * 4;
	p.stage_kv_stride = (uint64_t)STAGE * ROW * 4;
	p.stage_layer_stride = 2ull * STAGE * ROW * 4;
	if (kvt_seq_open(c, &p, &seq) < 0)
		FAIL(3);
	for (step = 1; step <= STEPS; step++) {
		float *rows = ref + (size_t)n * TOK;
		const float *st = kvt_buf_ptr(stage);
		int m;

		for (size_t i = 0; i < (size_t)STEP_TOK * TOK; i++)
			rows[i] = rndf(&rng);
		if (kvt_append(c, seq, rows, (size_t)STEP_TOK * TOK * 4, STEP_TOK, NULL) !=
		    (int64_t)(n + STEP_TOK))
			FAIL(4);
		n += STEP_TOK;
		for (uint32_t i = 0; i < n; i++)
			sc[i] = (float)(rnd(&rng) & 0xff) / 256.0f;
		if (kvt_score_add(c, seq, 0, sc, n) < 0)
			FAIL(5);
		if (kvt_retier(c, seq, rout, KVT_RETIER_OUT_SIZE(0) + 4096) < 0)
			FAIL(6);
		/* Every T1 row is the row appended, bit for bit. */
		m = kvt_fetch(c, seq, KVT_FETCH_F_T1, 0, L, 0, pos, STAGE);
		if (m < 0)
			FAIL(7);
		for (int i = 0; i < m; i++)
			for (uint32_t l = 0; l < L; l++)
				for (uint32_t kv = 0; kv < 2; kv++)
					if (memcmp(st + ((size_t)(l * 2 + kv) * STAGE + i) * ROW,
						   ref + (size_t)pos[i] * TOK + (l * 2 + kv) * ROW,
						   ROW * 4))
						FAIL(8);
		if (kind == 1 && n > 64) {
			for (int i = 0; i < H * D; i++)
				q[i] = rndf(&rng);
			memset(tout, 0, sizeof(tout));
			r = kvt_topk(c, seq, step % L, 8, 0, q, H * D, tout, sizeof(tout));
			if (r < 0 && r != -ERANGE)
				FAIL(9);
			if (r > 0)
				dg.topk = fnv(dg.topk, tout, sizeof(tout));
		}
		if (prog >= 0)
			wbyte(prog, 's');
		if (go >= 0 && step == PAUSE_AT && rbyte(go) != 'g')
			FAIL(10);
	}
	step = STEPS + 1;
	{
		struct kvt_seq_stat ss;
		int m = kvt_fetch(c, seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, L, 0, pos, STAGE);

		if (m <= 0)
			FAIL(11);
		dg.pos = fnv(dg.pos, pos, (size_t)m * 4);
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				dg.rows = fnv(dg.rows,
					      (const float *)kvt_buf_ptr(stage) +
						  (size_t)(l * 2 + kv) * STAGE * ROW,
					      (size_t)m * ROW * 4);
		if (kvt_seq_stat(c, seq, &ss) < 0)
			FAIL(12);
		memcpy(dg.tiers, ss.tier_count, sizeof(dg.tiers));
		dg.pool_bytes = ss.pool_bytes;
		dg.n = ss.n_tokens;
		dg.score_total = ss.score_total;
	}
	if (prog >= 0)
		wbyte(prog, 'e');
	if (go >= 0 && rbyte(go) != 'g')
		FAIL(13);
out:
	if (c)
		kvt_disconnect(c);
	free(ref);
	free(sc);
	free(pos);
	free(rout);
	return dg;
}

struct child {
	pid_t pid;
	int prog, go, res;
};

static void
child_start(struct child *ch, const char *sock, int kind, int pausing)
{
	int p1[2], p2[2], p3[2];

	ck_assert_int_eq(pipe2(p1, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(p2, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(p3, O_CLOEXEC), 0);
	ch->pid = fork();
	ck_assert_int_ge(ch->pid, 0);
	if (ch->pid == 0) {
		struct digest dg = workload(sock, kind, p1[1], pausing ? p2[0] : -1);

		_exit(write(p3[1], &dg, sizeof(dg)) == sizeof(dg) ? 0 : 1);
	}
	close(p1[1]);
	close(p2[0]);
	close(p3[1]);
	ch->prog = p1[0];
	ch->go = p2[1];
	ch->res = p3[0];
}

/* Reads progress bytes until @want of kind @c have come (the child's step count). */
static void
child_until(struct child *ch, int want, char c)
{
	for (int got = 0; got < want;) {
		char b = rbyte(ch->prog);

		ck_assert_msg(b, "client %d ended early", (int)ch->pid);
		got += b == c;
	}
}

static struct digest
child_finish(struct child *ch)
{
	struct digest dg;
	int st;

	ck_assert_int_eq(read(ch->res, &dg, sizeof(dg)), sizeof(dg));
	ck_assert_int_eq(waitpid(ch->pid, &st, 0), ch->pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client exit status %d", st);
	close(ch->prog);
	close(ch->go);
	close(ch->res);
	return dg;
}

static void
restart(struct kvtd_proc *d, int sessions)
{
	struct json_object *o = admin_request(d->sock, KVT_CTL_RESTART), *v;

	if (!o && getenv("KVT_RESTART_SOAK")) {
		/* the long run: what the daemon (and its children) are doing, for the report */
		char cmd[256];

		snprintf(cmd, sizeof(cmd),
			 "for p in %d $(cat /proc/%d/task/*/children 2>/dev/null); do "
			 "gdb -p $p -batch -ex 'thread apply all bt' >&2 2>&1; done",
			 (int)d->pid, (int)d->pid);
		if (system(cmd) < 0)
			perror("gdb");
	}
	ck_assert_msg(o, "no reply to RESTART (log %s)", d->log);
	ck_assert_msg(json_object_object_get_ex(o, "restarted", &v) && json_object_get_boolean(v),
		      "RESTART: %s", json_object_to_json_string(o));
	ck_assert_int_eq(json_get_i64(o, "pid"), d->pid);
	if (sessions >= 0)
		ck_assert_int_eq(json_get_i64(o, "sessions"), sessions);
	json_object_put(o);
	ck_assert(daemon_alive(d));
}

static void
digest_eq(const struct digest *a, const struct digest *b, int kind)
{
	ck_assert_msg(!a->err && !b->err, "kind %d: workload failed at %d / %d", kind, a->err,
		      b->err);
	ck_assert_uint_eq(a->n, (uint64_t)STEPS * STEP_TOK);
	ck_assert_mem_eq(a->tiers, b->tiers, sizeof(a->tiers));
	ck_assert_uint_gt(a->tiers[1], 0);
	ck_assert_uint_gt(a->tiers[3], 0);
	if (kind == 0)
		ck_assert_uint_gt(a->tiers[2], 0);
	ck_assert_uint_eq(a->pos, b->pos);
	ck_assert_uint_eq(a->rows, b->rows);
	ck_assert_uint_eq(a->topk, b->topk);
	ck_assert_uint_eq(a->pool_bytes, b->pool_bytes);
	ck_assert(a->score_total == b->score_total);
}

/*
 * With $KVT_RESTART_FROM naming another kvtierd (an older build's), the daemon starts from a copy
 * of that binary, replaced by this build's before the first restart: the restarts are an upgrade
 * from it, and with the two swapped ($KVTIERD the older) a downgrade.
 */
START_TEST(t_restart_lossless)
{
	char dir[] = "/tmp/kvt-restart-from-XXXXXX", bin[64], cmd[512];
	const char *from = getenv("KVT_RESTART_FROM");
	const char *var = getenv("KVT_EXEC") ? "KVT_EXEC" : "KVTIERD";
	char *orig = strdup(getenv(var));
	struct kvtd_proc d1, d2;
	struct child c[2];
	struct digest got[2], want[2];
	struct kvtd_usage u0, u1, u3;
	int64_t used0, used1;
	struct json_object *st;

	if (from) {
		ck_assert_ptr_nonnull(mkdtemp(dir));
		snprintf(bin, sizeof(bin), "%s/kvtierd", dir);
		snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", from, bin);
		ck_assert_int_eq(system(cmd), 0);
		setenv(var, bin, 1);
	}
	daemon_start(&d1, NULL);
	if (from) {
		setenv(var, orig, 1);
		snprintf(cmd, sizeof(cmd), "cp '%s' '%s.new' && mv '%s.new' '%s'", orig, bin, bin,
			 bin);
		ck_assert_int_eq(system(cmd), 0);
	}
	child_start(&c[0], d1.sock, 0, 1);
	child_start(&c[1], d1.sock, 1, 1);
	child_until(&c[0], PAUSE_AT, 's');
	child_until(&c[1], PAUSE_AT, 's');
	/* Both paused: a restart changes nothing anyone can see. */
	used0 = pool_used(d1.sock);
	u0 = daemon_usage(&d1);
	restart(&d1, 2);
	used1 = pool_used(d1.sock);
	u1 = daemon_usage(&d1);
	ck_assert_int_gt(used0, 0);
	ck_assert_int_eq(used1, used0);
	ck_assert_int_eq(u1.fds, u0.fds);
	wbyte(c[0].go, 'g');
	wbyte(c[1].go, 'g');
	/* Two more while both run. */
	child_until(&c[0], 15, 's');
	restart(&d1, 2);
	child_until(&c[1], 10, 's');
	restart(&d1, -1);
	child_until(&c[0], STEPS - PAUSE_AT - 15, 's');
	child_until(&c[0], 1, 'e');
	child_until(&c[1], STEPS - PAUSE_AT - 10, 's');
	child_until(&c[1], 1, 'e');
	u3 = daemon_usage(&d1);
	ck_assert_int_eq(u3.fds, u0.fds); /* same sessions, buffers and sequences open */
	st = admin_request(d1.sock, KVT_CTL_STATUS);
	ck_assert_int_eq(json_get_i64(st, "restarts"), 3);
	ck_assert_int_eq(json_get_i64(st, "sessions"), 2);
	json_object_put(st);
	wbyte(c[0].go, 'g');
	wbyte(c[1].go, 'g');
	got[0] = child_finish(&c[0]);
	got[1] = child_finish(&c[1]);
	ck_assert_int_eq(daemon_stop(&d1), 0);

	/* The same workloads, never restarted. */
	daemon_start(&d2, NULL);
	child_start(&c[0], d2.sock, 0, 0);
	child_start(&c[1], d2.sock, 1, 0);
	want[0] = child_finish(&c[0]);
	want[1] = child_finish(&c[1]);
	ck_assert_int_eq(daemon_stop(&d2), 0);
	digest_eq(&got[0], &want[0], 0);
	digest_eq(&got[1], &want[1], 1);
	if (from) {
		unlink(bin);
		rmdir(dir);
	}
	free(orig);
}
END_TEST

/* Runs kvtierd by hand with --restore-fd naming @img (@len bytes) and one end of a socketpair
 * as an inherited descriptor; the other end must see the connection end, and the daemon must
 * serve. */
static void
refused_image(const void *img, size_t len)
{
	struct kvtd_proc d;
	int sp[2], mfd, st;
	char fdarg[16], env[16], *log = NULL;
	struct pollfd pfd;
	char b;
	FILE *f;
	size_t loglen = 0;

	daemon_prepare(&d);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp), 0);
	mfd = memfd_create("img", 0);
	ck_assert_int_eq(write(mfd, img, len), (ssize_t)len);
	snprintf(fdarg, sizeof(fdarg), "%d", mfd);
	d.pid = fork();
	ck_assert_int_ge(d.pid, 0);
	if (d.pid == 0) {
		int fd = open(d.log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		dup2(fd, 2);
		close(sp[0]);
		/* a verdict variable left over, naming what is now a client's socket: never
		 * written to (not a pipe), the image refused as without it */
		snprintf(env, sizeof(env), "%d", sp[1]);
		setenv("KVTIERD_RESTART_WATCH", env, 1);
		execl(getenv("KVTIERD"), "kvtierd", "--config", "/dev/null", "--socket", d.sock,
		      "--pool-size", "64M", "--backend", "host", "--restore-fd", fdarg,
		      (char *)NULL);
		_exit(127);
	}
	close(sp[1]);
	close(mfd);
	daemon_wait_ready(&d);
	/* the inherited end was closed: EOF here, not a hang */
	pfd.fd = sp[0];
	pfd.events = POLLIN;
	ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
	ck_assert_int_eq(read(sp[0], &b, 1), 0);
	close(sp[0]);
	f = fopen(d.log, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert(getdelim(&log, &loglen, '\0', f) > 0);
	fclose(f);
	ck_assert_msg(strstr(log, "previous sessions are dropped"), "log: %s", log);
	free(log);
	st = daemon_stop(&d);
	ck_assert_int_eq(st, 0);
}

START_TEST(t_restart_refused_image)
{
	struct kvtd_image_hdr h;
	uint8_t buf[512];

	memset(buf, 0, sizeof(buf));
	memset(&h, 0, sizeof(h));
	memcpy(h.magic, KVTD_IMAGE_MAGIC, sizeof(KVTD_IMAGE_MAGIC));
	h.version = KVTD_IMAGE_VERSION + 1;
	h.hdr_size = sizeof(h);
	h.size = sizeof(buf);
	memcpy(buf, &h, sizeof(h));
	refused_image(buf, sizeof(buf)); /* another version */
	h.version = KVTD_IMAGE_VERSION;
	h.checksum = fnv(0xcbf29ce484222325ull, buf + sizeof(h), sizeof(buf) - sizeof(h)) ^ 1;
	memcpy(buf, &h, sizeof(h));
	refused_image(buf, sizeof(buf)); /* corrupt */
}
END_TEST

/*
 * The uid's pool account survives a restart: what the restored sequences hold still counts
 * against pool_bytes_per_uid, so appending after the restart stops at the same limit (a
 * restored account of zero would let the uid hold the limit again on top).
 */
START_TEST(t_restart_keeps_quota)
{
	char cfgpath[] = "/tmp/kvt-restart-cfg-XXXXXX";
	const char *extra[] = {"--config", cfgpath, NULL};
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	static float rows[8 * TOK];
	const int64_t limit = 4 << 20;
	struct kvt_client *c;
	struct kvtd_proc d;
	uint32_t seq;
	int64_t r = 0, used;
	int fd = mkstemp(cfgpath);

	ck_assert_int_ge(fd, 0);
	dprintf(fd, "[limits]\npool_bytes_per_uid = 4M\n");
	close(fd);
	daemon_start(&d, extra);
	ck_assert_int_eq(kvt_connect(d.sock, &o, &c), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 16;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	/* about three quarters of the limit, then a restart */
	while (pool_used(d.sock) < limit * 3 / 4)
		ck_assert_int_gt(kvt_append(c, seq, rows, sizeof(rows), 8, NULL), 0);
	restart(&d, 1);
	while ((r = kvt_append(c, seq, rows, sizeof(rows), 8, NULL)) > 0)
		ck_assert_int_le(pool_used(d.sock), 2 * limit);
	ck_assert_int_eq(r, -EDQUOT);
	used = pool_used(d.sock);
	ck_assert_int_le(used, limit);
	ck_assert_int_gt(used, limit - 8 * TOK * 4 - 4096);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&d), 0);
	unlink(cfgpath);
}
END_TEST

/*
 * The configuration is read again by a restart: limits lowered below what a session holds
 * (seqs_per_session) keep its sequences (new ones obey the new limit) instead of dropping it.
 */
START_TEST(t_restart_lowered_limits)
{
	char cfgpath[] = "/tmp/kvt-restart-cfg-XXXXXX";
	const char *extra[] = {"--config", cfgpath, NULL};
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	static float rows[2 * TOK];
	struct kvt_client *c;
	struct kvtd_proc d;
	uint32_t seq[3], extra_seq;
	int fd = mkstemp(cfgpath);

	ck_assert_int_ge(fd, 0);
	dprintf(fd, "[limits]\nseqs_per_session = 4\n");
	close(fd);
	daemon_start(&d, extra);
	ck_assert_int_eq(kvt_connect(d.sock, &o, &c), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 16;
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(kvt_seq_open(c, &p, &seq[i]), 0);
		ck_assert_int_eq(kvt_append(c, seq[i], rows, sizeof(rows), 2, NULL), 2);
	}
	fd = open(cfgpath, O_WRONLY | O_TRUNC);
	dprintf(fd, "[limits]\nseqs_per_session = 1\n");
	close(fd);
	restart(&d, 1);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(kvt_append(c, seq[i], rows, sizeof(rows), 2, NULL), 4);
	ck_assert_int_eq(kvt_seq_open(c, &p, &extra_seq), -EMFILE);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&d), 0);
	unlink(cfgpath);
}
END_TEST

/* Two RESTART requests pipelined: each answered once (the second -EALREADY when it is read
 * before the first is carried out), none left without a reply. */
START_TEST(t_restart_twice_pipelined)
{
	struct kvtd_proc d;
	struct kvt_ctl_hdr h[2] = {{.type = KVT_CTL_RESTART, .len = sizeof(h[0]), .id = 1},
				   {.type = KVT_CTL_RESTART, .len = sizeof(h[0]), .id = 2}};
	static char buf[KVT_CTL_MAX_MSG];
	int fd, answered[3] = {0}, restarts = 0;
	struct json_object *st;

	daemon_start(&d, NULL);
	fd = ctl_raw_connect(d.sock);
	ck_assert_int_ge(fd, 0);
	/* Both sit in the socket before the daemon reads either, or (a slow daemon) the second
	 * is read by the restarted process: one reply each either way, the first a restart. */
	ck_assert_int_eq(send(fd, &h[0], sizeof(h[0]), 0), sizeof(h[0]));
	ck_assert_int_eq(send(fd, &h[1], sizeof(h[1]), 0), sizeof(h[1]));
	for (int i = 0; i < 2; i++) {
		ssize_t n = ctl_raw_recv(fd, buf, sizeof(buf), 10000);
		const struct kvt_ctl_hdr *r = (const void *)buf;

		ck_assert_msg(n >= (ssize_t)sizeof(*r), "reply %d of 2: %zd", i + 1, n);
		ck_assert(r->id == 1 || r->id == 2);
		ck_assert_int_eq(answered[r->id]++, 0);
		if (r->type == KVT_CTL_JSON) {
			restarts++;
		} else {
			ck_assert_uint_eq(r->type, KVT_CTL_ERROR);
			ck_assert_uint_eq(r->id, 2);
			ck_assert_int_eq(((const struct kvt_ctl_error *)buf)->err, -EALREADY);
		}
	}
	ck_assert_int_ge(restarts, 1);
	close(fd);
	st = admin_request(d.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(st);
	ck_assert_int_eq(json_get_i64(st, "restarts"), restarts);
	json_object_put(st);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* The op error record's generation (a sequence lock the daemon writes) goes on across a restart
 * instead of starting again at 0, where a reader holding an old even generation could take a
 * record the new process is half way through writing for a whole one. */
static uint32_t
op_err_gen(struct kvt_client *c)
{
	uint64_t sz;
	const uint8_t *a = kvt_arena(c, &sz), *p = a - 4096;
	const struct kvt_region_hdr *h;

	/* the region header is on the first page of the mapping the arena ends */
	for (;; p -= 4096) {
		h = (const void *)p;
		if (h->magic == KVT_REGION_MAGIC && p + h->arena_off == a)
			break;
	}
	ck_assert_uint_ne(h->err_off, 0);
	return __atomic_load_n(&((const struct kvt_op_err *)(p + h->err_off))->gen,
			       __ATOMIC_ACQUIRE);
}

START_TEST(t_restart_op_err_gen)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_client *c;
	struct kvtd_proc d;
	uint32_t g1, g2;

	daemon_start(&d, NULL);
	ck_assert_int_eq(kvt_connect(d.sock, &o, &c), 0);
	ck_assert_int_lt(kvt_seq_close(c, 5), 0);
	ck_assert_int_lt(kvt_seq_close(c, 6), 0);
	g1 = op_err_gen(c);
	ck_assert_uint_ge(g1, 4);
	restart(&d, 1);
	ck_assert_int_lt(kvt_seq_close(c, 7), 0);
	g2 = op_err_gen(c);
	ck_assert_uint_eq(g2, g1 + 2);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

START_TEST(t_restart_not_admin)
{
	struct kvtd_proc d;
	pid_t pid;
	int st;

	if (geteuid() != 0)
		return; /* the daemon's own uid is privileged: nothing to test without root */
	daemon_start(&d, NULL);
	chmod(d.dir, 0755);
	chmod(d.sock, 0666);
	pid = fork();
	if (pid == 0) {
		struct kvt_ctl_hdr h = {.type = KVT_CTL_RESTART, .len = sizeof(h), .id = 1};
		struct kvt_ctl_error e;
		int fd;

		if (setgid(65534) || setuid(65534))
			_exit(2);
		fd = ctl_raw_connect(d.sock);
		if (fd < 0 || send(fd, &h, sizeof(h), 0) != sizeof(h))
			_exit(3);
		if (ctl_raw_recv(fd, &e, sizeof(e), 5000) < (ssize_t)sizeof(e.hdr) ||
		    e.hdr.type != KVT_CTL_ERROR || e.err != -EPERM)
			_exit(4);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "unprivileged RESTART: status %d", st);
	{
		struct json_object *o = admin_request(d.sock, KVT_CTL_STATUS);

		ck_assert_ptr_nonnull(o); /* still serving, not restarted */
		ck_assert_int_eq(json_get_i64(o, "restarts"), 0);
		json_object_put(o);
	}
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A free loopback port: bound, read back, released. */
static unsigned
free_port(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

/* With metrics_listen on a fixed port, restarts keep the session and /metrics: the teardown
 * child of the old process holds no copy of the metrics listener while the new one binds it. */
START_TEST(t_restart_metrics_listen)
{
	char cfgpath[] = "/tmp/kvt-restart-cfg-XXXXXX";
	const char *extra[] = {"--config", cfgpath, NULL};
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_client *c;
	struct kvtd_proc d;
	unsigned port = free_port();
	int fd = mkstemp(cfgpath);

	ck_assert_int_ge(fd, 0);
	dprintf(fd, "[daemon]\nmetrics_listen = 127.0.0.1:%u\n", port);
	close(fd);
	daemon_start(&d, extra);
	ck_assert_int_eq(kvt_connect(d.sock, &o, &c), 0);
	for (int i = 0; i < 5; i++) {
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		struct json_object *st;
		int tries = 0, s;

		restart(&d, 1);
		/* After a failed bind the new process tries again: wait for it, boundedly. */
		for (;; tries++) {
			s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			ck_assert_int_ge(s, 0);
			if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0)
				break;
			close(s);
			ck_assert_msg(tries < 400, "restart %d: /metrics never came back", i + 1);
			usleep(25000);
		}
		close(s);
		st = admin_request(d.sock, KVT_CTL_STATUS);
		ck_assert_ptr_nonnull(st);
		ck_assert_int_eq(json_get_i64(st, "sessions"), 1);
		json_object_put(st);
	}
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&d), 0);
	unlink(cfgpath);
}
END_TEST

/* A RESTART whose asker hung up before the restart was carried out, and the restart fails (the
 * binary on disk lost its execute bits): the daemon answers no one and keeps serving, rather
 * than writing its reply through the freed connection (ASan reported a use after free). */
START_TEST(t_restart_fails_asker_gone)
{
	char dir[] = "/tmp/kvt-restart-bin-XXXXXX", bin[64], cmd[256];
	/* under the unit's system call filter KVTIERD is a wrapper that runs KVT_EXEC */
	const char *var = getenv("KVT_EXEC") ? "KVT_EXEC" : "KVTIERD", *orig = getenv(var);
	struct kvt_ctl_hdr h = {.type = KVT_CTL_RESTART, .len = sizeof(h), .id = 7};
	struct json_object *st;
	struct kvtd_proc d;
	int fd;

	ck_assert_ptr_nonnull(orig);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(bin, sizeof(bin), "%s/kvtierd", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", orig, bin);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(chmod(bin, 0755), 0);
	orig = strdup(orig);
	setenv(var, bin, 1);
	daemon_start(&d, NULL);
	setenv(var, orig, 1);
	free((void *)orig);
	ck_assert_int_eq(chmod(bin, 0644), 0); /* the restart's exec now fails */
	for (int i = 0; i < 3; i++) {
		fd = ctl_raw_connect(d.sock);
		ck_assert_int_ge(fd, 0);
		/* Stopped, the daemon finds the request and the hangup in one turn of its loop. */
		ck_assert_int_eq(kill(d.pid, SIGSTOP), 0);
		ck_assert_int_eq(send(fd, &h, sizeof(h), 0), sizeof(h));
		close(fd);
		ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
		st = admin_request(d.sock, KVT_CTL_STATUS);
		ck_assert_msg(st, "no STATUS after a failed restart (log %s)", d.log);
		ck_assert_int_eq(json_get_i64(st, "restarts"), 0);
		json_object_put(st);
	}
	ck_assert(daemon_alive(&d));
	ck_assert_int_eq(daemon_stop(&d), 0);
	unlink(bin);
	rmdir(dir);
}
END_TEST

/* A retrieval sequence (ret_update 16) of @ntok tokens in a new session; returns the session. */
static struct kvt_client *
retrieval_session(const char *sock, int ntok, uint32_t *ret_seq)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	static float rows[16 * TOK];
	struct kvt_client *c;

	if (kvt_connect(sock, &o, &c) < 0)
		return NULL;
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 16;
	p.sinks = 4;
	p.window = 16;
	p.ret_update = 16;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		rows[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
	if (kvt_seq_open(c, &p, ret_seq) < 0)
		return NULL;
	for (int t = 0; t < ntok; t += 16)
		if (kvt_append(c, *ret_seq, rows, sizeof(rows), 16, NULL) < 0)
			return NULL;
	return c;
}

/*
 * pool_bytes_per_session lowered below what a session holds and max_sessions lowered to 1, then
 * a restart: both sessions (of two uids when run as root) are kept, retrieval indexes rebuilt,
 * and only new work is refused. It dropped every session ("rebuilding its retrieval index:
 * Cannot allocate memory"), and the second uid found no uid entry ("Too many users").
 */
START_TEST(t_restart_lowered_quota)
{
	char cfgpath[] = "/tmp/kvt-restart-cfg-XXXXXX";
	const char *extra[] = {"--config", cfgpath, NULL};
	struct kvt_seq_stat before = {.size = sizeof(before)}, after = {.size = sizeof(after)};
	static float rows[16 * TOK];
	int go[2], ready[2], fd = mkstemp(cfgpath), st;
	struct kvt_client *c;
	struct kvtd_proc d;
	uint32_t seq;
	pid_t pid;

	ck_assert_int_ge(fd, 0);
	dprintf(fd, "[limits]\nmax_sessions = 4\n");
	close(fd);
	daemon_start(&d, extra);
	chmod(d.dir, 0755);
	chmod(d.sock, 0666);
	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(ready), 0);
	pid = fork();
	if (pid == 0) {
		uint32_t s2;
		struct kvt_client *c2;
		struct kvt_seq_stat ss = {.size = sizeof(ss)};

		if (geteuid() == 0 && (setgid(65534) || setuid(65534)))
			_exit(2);
		c2 = retrieval_session(d.sock, 256, &s2);
		if (!c2)
			_exit(3);
		wbyte(ready[1], 'r');
		rbyte(go[0]);
		if (kvt_seq_stat(c2, s2, &ss) < 0 || ss.n_tokens != 256)
			_exit(4);
		_exit(0);
	}
	c = retrieval_session(d.sock, 256, &seq);
	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(rbyte(ready[0]), 'r');
	ck_assert_int_eq(kvt_seq_stat(c, seq, &before), 0);
	ck_assert_uint_gt(before.pool_bytes, 64 << 10);
	fd = open(cfgpath, O_WRONLY | O_TRUNC);
	dprintf(fd, "[limits]\nmax_sessions = 1\npool_bytes_per_session = 64K\n");
	close(fd);
	restart(&d, 2);
	ck_assert_int_eq(kvt_seq_stat(c, seq, &after), 0);
	ck_assert_uint_eq(after.n_tokens, before.n_tokens);
	ck_assert_uint_eq(after.pool_bytes, before.pool_bytes); /* the index rebuilt, charged */
	/* over its new limit: new work is refused, what it holds stays */
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), 16, NULL), -EDQUOT);
	wbyte(go[1], 'g');
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "second session: status %d", st);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&d), 0);
	unlink(cfgpath);
}
END_TEST

/* Opens a sequence of workload() kind @kind in @c and runs @steps steps of APPEND, SCORE_ADD,
 * RETIER and FETCH on it (staging into @stage); returns its id, 0 on failure. */
static uint32_t
stat_seq(struct kvt_client *c, struct kvt_buf *stage, int kind, int steps)
{
	struct kvt_seq_params p = {.size = sizeof(p)};
	static float rows[STEP_TOK * TOK], sc[STAGE];
	static uint32_t pos[STAGE];
	static uint8_t rout[KVT_RETIER_OUT_SIZE(0) + 4096];
	uint64_t rng = 0x57a7 + (uint64_t)kind;
	uint32_t seq, n = 0;

	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = STEP_TOK;
	p.sinks = 4;
	p.window = 16;
	p.evict_frac = 0.1f;
	p.t2_frac = kind == 0 ? 0.4f : 0.0f;
	p.t2_flags = kind == 0 ? KVT_T2_F_KEY_CHANNEL : 0;
	p.ret_update = kind == 1 ? 16 : 0;
	p.stage_buf_id = kvt_buf_id(stage);
	p.stage_slots = STAGE;
	p.stage_slot_stride = ROW * 4;
	p.stage_kv_stride = (uint64_t)STAGE * ROW * 4;
	p.stage_layer_stride = 2ull * STAGE * ROW * 4;
	if (kvt_seq_open(c, &p, &seq) < 0)
		return 0;
	for (int step = 0; step < steps; step++) {
		for (size_t i = 0; i < (size_t)STEP_TOK * TOK; i++)
			rows[i] = rndf(&rng);
		if (kvt_append(c, seq, rows, sizeof(rows), STEP_TOK, NULL) !=
		    (int64_t)(n + STEP_TOK))
			return 0;
		n += STEP_TOK;
		for (uint32_t i = 0; i < n; i++)
			sc[i] = (float)(rnd(&rng) & 0xff) / 256.0f;
		if (kvt_score_add(c, seq, 0, sc, n) < 0 ||
		    kvt_retier(c, seq, rout, sizeof(rout)) < 0 ||
		    kvt_fetch(c, seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, L, 0, pos, STAGE) < 0)
			return 0;
	}
	return seq;
}

/*
 * Every SEQ_STAT field of every sequence, and every field kvtierctl seqs shows (SEQS), are the
 * same after a restart in place as before it: an image that drops any one counter of a sequence
 * (tokens, tier counts, bytes in and out, score total, pool bytes) fails here.
 */
START_TEST(t_restart_seq_stats_kept)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_stat before[2], after[2];
	struct json_object *js;
	struct kvt_client *c;
	struct kvt_buf *stage;
	struct kvtd_proc d;
	uint32_t seq[2];
	char *seqs_before;

	daemon_start(&d, NULL);
	ck_assert_int_eq(kvt_connect(d.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_buf_alloc(c, (size_t)L * 2 * STAGE * ROW * 4, &stage), 0);
	for (int k = 0; k < 2; k++) {
		seq[k] = stat_seq(c, stage, k, 24);
		ck_assert_uint_ne(seq[k], 0);
		memset(&before[k], 0, sizeof(before[k]));
		before[k].size = sizeof(before[k]);
		ck_assert_int_eq(kvt_seq_stat(c, seq[k], &before[k]), 0);
		/* each counter has moved, so that losing it shows */
		ck_assert_uint_gt(before[k].n_tokens, 0);
		ck_assert_uint_gt(before[k].tier_count[1], 0);
		ck_assert_uint_gt(before[k].tier_count[3], 0);
		ck_assert_uint_gt(before[k].pool_bytes, 0);
		ck_assert_uint_gt(before[k].bytes_in, 0);
		ck_assert_uint_gt(before[k].bytes_out, 0);
		ck_assert(before[k].score_total > 0);
	}
	ck_assert_uint_gt(before[0].tier_count[2], 0);
	js = admin_request(d.sock, KVT_CTL_SEQS);
	ck_assert_ptr_nonnull(js);
	seqs_before = strdup(json_object_to_json_string(js));
	json_object_put(js);
	restart(&d, 1);
	for (int k = 0; k < 2; k++) {
		memset(&after[k], 0, sizeof(after[k]));
		after[k].size = sizeof(after[k]);
		ck_assert_int_eq(kvt_seq_stat(c, seq[k], &after[k]), 0);
		ck_assert_uint_eq(after[k].seq, before[k].seq);
		ck_assert_uint_eq(after[k].n_tokens, before[k].n_tokens);
		for (int t = 0; t < 4; t++)
			ck_assert_uint_eq(after[k].tier_count[t], before[k].tier_count[t]);
		ck_assert_uint_eq(after[k].pool_bytes, before[k].pool_bytes);
		ck_assert_uint_eq(after[k].bytes_in, before[k].bytes_in);
		ck_assert_uint_eq(after[k].bytes_out, before[k].bytes_out);
		ck_assert(after[k].score_total == before[k].score_total);
		/* and whatever field SEQ_STAT gains later */
		ck_assert_int_eq(memcmp(&after[k], &before[k], sizeof(after[k])), 0);
	}
	js = admin_request(d.sock, KVT_CTL_SEQS);
	ck_assert_ptr_nonnull(js);
	ck_assert_str_eq(json_object_to_json_string(js), seqs_before);
	json_object_put(js);
	free(seqs_before);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* Sends RESTART and returns its error reply's message (static), or NULL when it was a JSON
 * answer; the error must be -ECANCELED: the restart was refused. */
static const char *
restart_refused(struct kvtd_proc *d)
{
	static char buf[KVT_CTL_MAX_MSG];
	struct kvt_ctl_hdr h = {.type = KVT_CTL_RESTART, .len = sizeof(h), .id = 9};
	const struct kvt_ctl_error *e = (const void *)buf;
	int fd = ctl_raw_connect(d->sock);
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(send(fd, &h, sizeof(h), 0), sizeof(h));
	n = ctl_raw_recv(fd, buf, sizeof(buf) - 1, 20000);
	close(fd);
	ck_assert_msg(n >= (ssize_t)sizeof(e->hdr), "no reply to RESTART (log %s)", d->log);
	buf[n] = '\0';
	if (e->hdr.type != KVT_CTL_ERROR)
		return NULL;
	ck_assert_int_ge(n, sizeof(*e));
	ck_assert_int_eq(e->err, -ECANCELED);
	return e->msg;
}

/* Where the last loaded segment of the ELF image @elf ends in the file. */
static size_t
loaded_end(const void *elf)
{
	const Elf64_Ehdr *eh = elf;
	size_t end = 0;

	ck_assert_int_eq(memcmp(eh->e_ident, ELFMAG, SELFMAG), 0);
	for (unsigned i = 0; i < eh->e_phnum; i++) {
		const Elf64_Phdr *ph =
		    (const void *)((const char *)elf + eh->e_phoff + (size_t)i * eh->e_phentsize);

		if (ph->p_type == PT_LOAD && ph->p_offset + ph->p_filesz > end)
			end = ph->p_offset + ph->p_filesz;
	}
	ck_assert_uint_gt(end, 0);
	return end;
}

/* @bin replaced (renamed over, as a package upgrade does) by @len bytes of @data, mode 0755. */
static void
replace_bin(const char *bin, const void *data, size_t len)
{
	char tmp[80];
	int fd;

	snprintf(tmp, sizeof(tmp), "%s.new", bin);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0755);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
	close(fd);
	ck_assert_int_eq(rename(tmp, bin), 0);
}

/*
 * The pre-flight: a configuration the new process refuses (an unknown key), a truncated binary
 * and a foreign executable each refuse the restart with a reason, and the session lives on with
 * its rows; then the good binary and configuration back, and the restart goes ahead. Each of
 * them used to exec a process that died, and every session with it.
 */
START_TEST(t_restart_preflight)
{
	char dir[] = "/tmp/kvt-restart-bin-XXXXXX", bin[64], cmd[256], cfgpath[80];
	const char *extra[] = {"--config", cfgpath, NULL};
	const char *var = getenv("KVT_EXEC") ? "KVT_EXEC" : "KVTIERD", *orig = getenv(var);
	static const char foreign[] = "#!/bin/sh\necho 'some other program'\nexit 3\n";
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	static float rows[2 * TOK];
	struct json_object *st;
	struct kvt_client *c;
	struct kvtd_proc d;
	const char *why;
	struct stat sb;
	char *good;
	uint32_t seq;
	int fd;

	ck_assert_ptr_nonnull(orig);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(bin, sizeof(bin), "%s/kvtierd", dir);
	snprintf(cfgpath, sizeof(cfgpath), "%s/kvtierd.conf", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", orig, bin);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(stat(bin, &sb), 0);
	good = malloc((size_t)sb.st_size);
	fd = open(bin, O_RDONLY);
	ck_assert_int_eq(read(fd, good, (size_t)sb.st_size), sb.st_size);
	close(fd);
	fd = open(cfgpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	dprintf(fd, "[limits]\nseqs_per_session = 8\n");
	close(fd);
	orig = strdup(orig);
	setenv(var, bin, 1);
	daemon_start(&d, extra);
	setenv(var, orig, 1);
	free((void *)orig);
	ck_assert_int_eq(kvt_connect(d.sock, &o, &c), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 16;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), 2, NULL), 2);

	/* 1: a configuration SIGHUP refuses too */
	fd = open(cfgpath, O_WRONLY | O_TRUNC);
	dprintf(fd, "[limits]\nseqs_per_session = 8\nno_such_key = 1\n");
	close(fd);
	why = restart_refused(&d);
	ck_assert_ptr_nonnull(why);
	ck_assert_msg(strstr(why, "no_such_key"), "reason: %s", why);
	fd = open(cfgpath, O_WRONLY | O_TRUNC);
	dprintf(fd, "[limits]\nseqs_per_session = 8\n");
	close(fd);
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), 2, NULL), 4);

	/* 2: a truncated binary: cut in the middle of what the loader maps (its end past it) */
	replace_bin(bin, good, loaded_end(good) / 2);
	why = restart_refused(&d);
	ck_assert_ptr_nonnull(why);
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), 2, NULL), 6);

	/* 3: another program */
	replace_bin(bin, foreign, sizeof(foreign) - 1);
	why = restart_refused(&d);
	ck_assert_ptr_nonnull(why);
	ck_assert_msg(strstr(why, "exited 3"), "reason: %s", why);
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), 2, NULL), 8);

	st = admin_request(d.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(st);
	ck_assert_int_eq(json_get_i64(st, "restarts"), 0);
	json_object_put(st);

	/* the good binary back: the restart goes ahead */
	replace_bin(bin, good, (size_t)sb.st_size);
	restart(&d, 1);
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), 2, NULL), 10);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&d), 0);
	free(good);
	unlink(bin);
	unlink(cfgpath);
	rmdir(dir);
}
END_TEST

/* Replaces @bin with a program that passes the pre-flight (it runs @good for
 * --check-restart) and, run for real, says so and exits 3 at once: the exec goes ahead and the
 * new process dies before it takes anything over. */
static void
replace_bin_exits_at_start(const char *bin, const char *good)
{
	char script[512];
	int n = snprintf(script, sizeof(script),
			 "#!/bin/sh\n"
			 "case \"$*\" in *--check-restart) exec '%s' \"$@\";; esac\n"
			 "echo 'a kvtierd that exits at start' >&2\n"
			 "exit 3\n",
			 good);

	ck_assert_int_lt(n, (int)sizeof(script));
	replace_bin(bin, script, (size_t)n);
}

/*
 * A service manager's notification socket for NotifyAccess=main (as kvtierd.service sets it):
 * a thread takes each datagram with its sender's pid, refuses (counts) one from any pid but the
 * main pid, follows MAINPID=, and closes a BARRIER=1's descriptor (from anyone) once what came
 * before is taken, as systemd does.
 */
struct fake_sd {
	int fd, stop;
	pthread_t thread;
	pthread_mutex_t lock;
	pid_t main_pid;	  /* 0: the first sender */
	unsigned refused; /* notifications from a pid that was not the main pid */
	unsigned handoffs;
	char log[16384];
};

static void *
fake_sd_main(void *arg)
{
	struct fake_sd *f = arg;

	while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(4 * sizeof(int))];
		} u;
		char text[512];
		struct iovec iov = {text, sizeof(text) - 1};
		struct msghdr mh = {.msg_iov = &iov,
				    .msg_iovlen = 1,
				    .msg_control = u.buf,
				    .msg_controllen = sizeof(u.buf)};
		struct pollfd pf = {.fd = f->fd, .events = POLLIN};
		pid_t pid = 0;
		ssize_t n;
		size_t len;
		const char *mp;

		if (poll(&pf, 1, 50) <= 0)
			continue;
		n = recvmsg(f->fd, &mh, MSG_DONTWAIT);
		if (n < 0)
			continue;
		text[n] = '\0';
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_type == SCM_CREDENTIALS) {
				struct ucred cr;

				memcpy(&cr, CMSG_DATA(c), sizeof(cr));
				pid = cr.pid;
			} else if (c->cmsg_type == SCM_RIGHTS) {
				int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));

				for (int i = 0; i < k; i++) {
					int fd;

					memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
					close(fd); /* the barrier: processed */
				}
			}
		}
		pthread_mutex_lock(&f->lock);
		if (!f->main_pid)
			f->main_pid = pid;
		len = strlen(f->log);
		if (!strcmp(text, "BARRIER=1")) {
			/* taken from anyone, before any unit's rules (systemd's manager.c) */
		} else if (pid != f->main_pid) {
			f->refused++;
			snprintf(f->log + len, sizeof(f->log) - len, "REFUSED from %d: %s|",
				 (int)pid, text);
		} else {
			snprintf(f->log + len, sizeof(f->log) - len, "%d: %s|", (int)pid, text);
			mp = strstr(text, "MAINPID=");
			if (mp) {
				f->main_pid = atoi(mp + 8);
				f->handoffs++;
			}
		}
		pthread_mutex_unlock(&f->lock);
	}
	return NULL;
}

/* Listens at @path (NOTIFY_SOCKET is set to it for the daemons started after). */
static void
fake_sd_start(struct fake_sd *f, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int one = 1;

	memset(f, 0, sizeof(*f));
	pthread_mutex_init(&f->lock, NULL);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	f->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(f->fd, 0);
	ck_assert_int_eq(setsockopt(f->fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
	ck_assert_int_eq(bind(f->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_sd_main, f), 0);
	setenv("NOTIFY_SOCKET", path, 1);
}

static void
fake_sd_stop(struct fake_sd *f)
{
	unsetenv("NOTIFY_SOCKET");
	__atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
	pthread_join(f->thread, NULL);
	close(f->fd);
}

/* The main pid the manager knows, once everything sent so far is taken (a moment's wait). */
static pid_t
fake_sd_main_pid(struct fake_sd *f)
{
	pid_t pid;

	usleep(200000);
	pthread_mutex_lock(&f->lock);
	pid = f->main_pid;
	pthread_mutex_unlock(&f->lock);
	return pid;
}

/* The daemon's pid from STATUS. */
static pid_t
status_pid(const struct kvtd_proc *d)
{
	struct json_object *st = admin_request(d->sock, KVT_CTL_STATUS);
	pid_t pid;

	ck_assert_ptr_nonnull(st);
	pid = (pid_t)json_get_i64(st, "pid");
	json_object_put(st);
	return pid;
}

/*
 * The fallback: the binary passes the pre-flight but exits at start when executed for real.
 * The old binary (kept open since its start) takes every session back: two clients paused
 * mid-workload go on and end with an uninterrupted run's rows, positions, tiers and TOPK
 * answers; RESTART gets -ECANCELED naming the cause; the log says why; STATUS counts no restart.
 * Then the good binary is back and restarts go ahead from the process that took over.
 */
START_TEST(t_restart_fallback)
{
	char dir[] = "/tmp/kvt-restart-bin-XXXXXX", bin[64], cmd[256], sdpath[80], *log = NULL;
	struct fake_sd sd;
	const char *var = getenv("KVT_EXEC") ? "KVT_EXEC" : "KVTIERD";
	char *orig = strdup(getenv(var));
	struct kvtd_proc d1, d2;
	struct child c[2];
	struct digest got[2], want[2];
	struct json_object *st;
	const char *why;
	size_t loglen = 0;
	pid_t old_pid;
	FILE *f;
	int ws;

	/* the process that takes over is the watcher, whose parent dies: it becomes ours */
	ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	/* as under systemd, NotifyAccess=main: the pid that dies is never the main pid */
	snprintf(sdpath, sizeof(sdpath), "%s/notify", dir);
	fake_sd_start(&sd, sdpath);
	snprintf(bin, sizeof(bin), "%s/kvtierd", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", orig, bin);
	ck_assert_int_eq(system(cmd), 0);
	setenv(var, bin, 1);
	daemon_start(&d1, NULL);
	setenv(var, orig, 1);
	child_start(&c[0], d1.sock, 0, 1);
	child_start(&c[1], d1.sock, 1, 1);
	child_until(&c[0], PAUSE_AT, 's');
	child_until(&c[1], PAUSE_AT, 's');

	replace_bin_exits_at_start(bin, orig);
	old_pid = d1.pid;
	why = restart_refused(&d1);
	ck_assert_msg(why, "the restart into a binary that exits at start was not refused");
	ck_assert_msg(strstr(why, "ended before it took the sessions over") && strstr(why, bin),
		      "reason: %s", why);
	ck_assert_msg(strstr(why, "took back 2 session(s)"), "reason: %s", why);
	/* the process that exec'd the bad binary is gone (exit 3); the watcher serves on */
	ck_assert_int_eq(waitpid(old_pid, &ws, 0), old_pid);
	ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 3, "exec'd binary: status %d", ws);
	d1.pid = status_pid(&d1);
	ck_assert_int_ne(d1.pid, old_pid);
	ck_assert(daemon_alive(&d1));
	ck_assert_msg(fake_sd_main_pid(&sd) == d1.pid, "main pid %d, daemon %d: %s",
		      (int)fake_sd_main_pid(&sd), (int)d1.pid, sd.log);
	st = admin_request(d1.sock, KVT_CTL_STATUS);
	ck_assert_int_eq(json_get_i64(st, "restarts"), 0);
	ck_assert_int_eq(json_get_i64(st, "sessions"), 2);
	json_object_put(st);
	f = fopen(d1.log, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert(getdelim(&log, &loglen, '\0', f) > 0);
	fclose(f);
	ck_assert_msg(strstr(log, "a kvtierd that exits at start") &&
			  strstr(log, "restart failed after the exec: ") &&
			  strstr(log, "ended before it took the sessions over"),
		      "log: %s", log);
	free(log);

	/* the clients go on; then the good binary back, and a restart from the new pid */
	wbyte(c[0].go, 'g');
	wbyte(c[1].go, 'g');
	child_until(&c[0], 10, 's');
	replace_bin(bin, "", 0);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", orig, bin);
	ck_assert_int_eq(system(cmd), 0);
	restart(&d1, 2);
	ck_assert_msg(fake_sd_main_pid(&sd) == d1.pid, "main pid %d, daemon %d: %s",
		      (int)fake_sd_main_pid(&sd), (int)d1.pid, sd.log);
	child_until(&c[0], STEPS - PAUSE_AT - 10, 's');
	child_until(&c[0], 1, 'e');
	child_until(&c[1], STEPS - PAUSE_AT, 's');
	child_until(&c[1], 1, 'e');
	wbyte(c[0].go, 'g');
	wbyte(c[1].go, 'g');
	got[0] = child_finish(&c[0]);
	got[1] = child_finish(&c[1]);
	ck_assert_int_eq(daemon_stop(&d1), 0);
	fake_sd_stop(&sd);
	/* the manager took every notification: each came from the main pid of the moment; the
	 * main pid went to the watcher for good at the fallback, and to the watcher and back at
	 * the good restart */
	ck_assert_msg(sd.refused == 0 && sd.handoffs == 3, "%u refused, %u handoffs: %s",
		      sd.refused, sd.handoffs, sd.log);

	daemon_start(&d2, NULL);
	child_start(&c[0], d2.sock, 0, 0);
	child_start(&c[1], d2.sock, 1, 0);
	want[0] = child_finish(&c[0]);
	want[1] = child_finish(&c[1]);
	ck_assert_int_eq(daemon_stop(&d2), 0);
	digest_eq(&got[0], &want[0], 0);
	digest_eq(&got[1], &want[1], 1);
	unlink(bin);
	rmdir(dir);
	free(orig);
}
END_TEST

enum { PX_BT = 16, PX_NBLK = 4, PX_NTOK = PX_NBLK * PX_BT + 5, PX_STAGE = 128, PX_PROMPTS = 3 };

/* The rows of position @i of prompt @prompt: the same for every client (the "model"). */
static void
px_rows(uint32_t prompt, uint32_t i, float *out)
{
	uint64_t rng = 0xb10c + prompt * 100003ull + i;

	for (int k = 0; k < TOK; k++)
		out[k] = rndf(&rng);
}

/*
 * One prefix round of a soak client (no ck_assert: it runs in a child): NS_OPEN of the shared
 * namespace, a pinning LOOKUP of prompt @prompt's blocks, a sequence opened from what matched,
 * the rest appended, its full blocks published, and every T1 row fetched and compared bit for
 * bit with px_rows(). 0, or the step that failed (20-29).
 */
static int
prefix_round(const char *sock, uint32_t prompt)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_ns_params np = {.size = sizeof(np),
				   .layers = L,
				   .kv_heads = H,
				   .head_dim = D,
				   .dtype = KVT_DTYPE_F32,
				   .block_tokens = PX_BT};
	struct kvt_seq_params p = {.size = sizeof(p)};
	struct kvt_block_key keys[PX_NBLK];
	static float rows[PX_NTOK * TOK], ref[TOK];
	uint32_t tok[PX_NTOK], pos[PX_STAGE], ns, seq, n_new;
	struct kvt_client *c = NULL;
	struct kvt_buf *stage = NULL;
	int err = 0, m, f;

	snprintf(np.name, sizeof(np.name), "soak-model");
	for (uint32_t i = 0; i < PX_NTOK; i++)
		tok[i] = 1000 * prompt + i;
	if (kvt_connect(sock, &o, &c) < 0)
		return 20;
	if (kvt_buf_alloc(c, (size_t)L * 2 * PX_STAGE * ROW * 4, &stage) < 0 ||
	    kvt_ns_open(c, &np, &ns) < 0 ||
	    kvt_block_keys(&np, NULL, tok, PX_NTOK, keys, PX_NBLK) != PX_NBLK) {
		err = 21;
		goto out;
	}
	m = kvt_lookup(c, ns, keys, PX_NBLK, KVT_LOOKUP_F_PIN);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 4;
	p.stage_buf_id = kvt_buf_id(stage);
	p.stage_slots = PX_STAGE;
	p.stage_slot_stride = ROW * 4;
	p.stage_kv_stride = (uint64_t)PX_STAGE * ROW * 4;
	p.stage_layer_stride = 2ull * PX_STAGE * ROW * 4;
	if (m < 0 || kvt_seq_open_prefix(c, &p, ns, (uint32_t)m, &seq) < 0) {
		err = 22;
		goto out;
	}
	for (uint32_t i = (uint32_t)m * PX_BT; i < PX_NTOK; i++)
		px_rows(prompt, i, rows + (size_t)(i - (uint32_t)m * PX_BT) * TOK);
	if (kvt_append(c, seq, rows, (uint64_t)(PX_NTOK - (uint32_t)m * PX_BT) * TOK * 4,
		       PX_NTOK - (uint32_t)m * PX_BT, NULL) != PX_NTOK) {
		err = 23;
		goto out;
	}
	if (kvt_publish(c, seq, keys, PX_NBLK, &n_new) != PX_NBLK) {
		err = 24;
		goto out;
	}
	f = kvt_fetch(c, seq, KVT_FETCH_F_T1, 0, L, 0, pos, PX_STAGE);
	if (f != PX_NTOK) {
		err = 25;
		goto out;
	}
	for (int i = 0; i < f && !err; i++) {
		px_rows(prompt, pos[i], ref);
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				if (memcmp((const float *)kvt_buf_ptr(stage) +
					       ((size_t)(l * 2 + kv) * PX_STAGE + i) * ROW,
					   ref + (l * 2 + kv) * ROW, ROW * 4))
					err = 26;
	}
	if (!err && (kvt_seq_close(c, seq) < 0 || kvt_ns_close(c, ns) < 0))
		err = 27;
out:
	kvt_disconnect(c);
	return err;
}

/*
 * The fallback on the new process's word: a kvtierd that passes the pre-flight but is run for
 * real with an option it refuses gives up to the watcher with its reason ('F'), and the old
 * binary takes the session back; RESTART's error carries that reason.
 */
START_TEST(t_restart_fallback_gave_up)
{
	char dir[] = "/tmp/kvt-restart-bin-XXXXXX", bin[64], cmd[256], script[768];
	const char *var = getenv("KVT_EXEC") ? "KVT_EXEC" : "KVTIERD";
	char *orig = strdup(getenv(var));
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};
	static float rows[2 * TOK];
	struct kvt_client *c;
	struct kvtd_proc d;
	const char *why;
	pid_t old_pid;
	uint32_t seq;
	int n;

	ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(bin, sizeof(bin), "%s/kvtierd", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", orig, bin);
	ck_assert_int_eq(system(cmd), 0);
	setenv(var, bin, 1);
	daemon_start(&d, NULL);
	setenv(var, orig, 1);
	ck_assert_int_eq(kvt_connect(d.sock, &o, &c), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_FULL;
	p.delta = 16;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), 2, NULL), 2);
	/* the real kvtierd, with "--backend bogus" slipped in before "--restore-fd N" */
	n = snprintf(
	    script, sizeof(script),
	    "#!/bin/sh\n"
	    "case \"$*\" in *--check-restart) exec '%s' \"$@\";; esac\n"
	    "n=$#; eval \"fd=\\${$n}\"; i=0\n"
	    "for a in \"$@\"; do i=$((i + 1)); [ $i -le $((n - 2)) ] && set -- \"$@\" \"$a\"; "
	    "done\n"
	    "shift $n\n"
	    "exec '%s' \"$@\" --backend bogus --restore-fd \"$fd\"\n",
	    orig, orig);
	ck_assert_int_lt(n, (int)sizeof(script));
	replace_bin(bin, script, (size_t)n);
	old_pid = d.pid;
	why = restart_refused(&d);
	ck_assert_msg(why && strstr(why, "refused its configuration") && strstr(why, "bogus") &&
			  strstr(why, "took back 1 session(s)"),
		      "reason: %s", why);
	ck_assert_int_eq(waitpid(old_pid, NULL, 0), old_pid);
	d.pid = status_pid(&d);
	ck_assert_int_ne(d.pid, old_pid);
	ck_assert_int_eq(kvt_append(c, seq, rows, sizeof(rows), 2, NULL), 4);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&d), 0);
	unlink(bin);
	rmdir(dir);
	free(orig);
}
END_TEST

/*
 * The restart soak: 4 clients run workload() and prefix_round() over and over (APPEND,
 * SCORE_ADD, RETIER, FETCH with every T1 row compared bit for bit, TOPK; NS_OPEN, a pinning
 * LOOKUP, SEQ_OPEN from the shared blocks, PUBLISH), with metrics_listen set, while the daemon
 * restarts in place $KVT_RESTART_SOAK times (6 in CI; restart_soak.sh runs 500); every
 * $KVT_RESTART_SOAK_BAD-th time (3 in CI, 50 in the long run) a configuration with an unknown
 * key, a truncated binary and a foreign executable are tried first and must be refused, and
 * then a binary that passes the pre-flight but exits at start must fall back to the old binary
 * (every session kept; the daemon's pid is then the watcher's). No client may lose its session
 * or see a wrong row, and afterwards the daemon holds the descriptors, mappings and pool bytes
 * (the prefix store's cached blocks) it held before.
 */
START_TEST(t_restart_soak)
{
	char dir[] = "/tmp/kvt-restart-bin-XXXXXX", bin[64], cmd[256], cfgpath[80];
	const char *extra[] = {"--config", cfgpath, NULL};
	const char *var = getenv("KVT_EXEC") ? "KVT_EXEC" : "KVTIERD", *orig = getenv(var);
	const char *env_n = getenv("KVT_RESTART_SOAK"), *env_bad = getenv("KVT_RESTART_SOAK_BAD");
	unsigned n = env_n ? (unsigned)atoi(env_n) : 6, bad = env_bad ? (unsigned)atoi(env_bad) : 3;
	static const char foreign[] = "#!/bin/sh\necho 'some other program'\nexit 3\n";
	unsigned port = free_port(), refused = 0, fell_back = 0;
	struct kvtd_usage u0, u1;
	struct kvtd_proc d;
	int64_t cached, published;
	pid_t kids[4];
	int stop[2], fd;
	struct stat sb;
	char *good;

	ck_assert_ptr_nonnull(orig);
	ck_assert_uint_gt(bad, 0);
	/* a fallback's daemon is the watcher, whose parent dies: it becomes ours */
	ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(bin, sizeof(bin), "%s/kvtierd", dir);
	snprintf(cfgpath, sizeof(cfgpath), "%s/kvtierd.conf", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", orig, bin);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(stat(bin, &sb), 0);
	good = malloc((size_t)sb.st_size);
	fd = open(bin, O_RDONLY);
	ck_assert_int_eq(read(fd, good, (size_t)sb.st_size), sb.st_size);
	close(fd);
	fd = open(cfgpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	dprintf(fd, "[daemon]\nmetrics_listen = 127.0.0.1:%u\n", port);
	close(fd);
	orig = strdup(orig);
	setenv(var, bin, 1);
	daemon_start(&d, extra);
	setenv(var, orig, 1);
	/* the baseline is a restarted process's that has served a workload (its poller's malloc
	 * arena made) and holds the prefix store's blocks of every prompt */
	restart(&d, 0);
	ck_assert_int_eq(workload(d.sock, 1, -1, -1).err, 0);
	for (uint32_t pr = 0; pr < PX_PROMPTS; pr++)
		ck_assert_int_eq(prefix_round(d.sock, pr), 0);
	usleep(500000); /* a steadier baseline: the restart's short-lived threads gone */
	u0 = daemon_usage(&d);
	ck_assert_int_eq(pipe(stop), 0);
	for (int k = 0; k < 4; k++) {
		kids[k] = fork();
		ck_assert_int_ge(kids[k], 0);
		if (kids[k] == 0) {
			close(stop[1]);
			fcntl(stop[0], F_SETFL, O_NONBLOCK);
			for (unsigned round = 0;; round++) {
				struct digest dg = workload(d.sock, k % 2, -1, -1);
				char c;

				int e;

				if (dg.err)
					_exit(dg.err % 200 + 1);
				e = prefix_round(d.sock, (round + (unsigned)k) % PX_PROMPTS);
				if (e)
					_exit(200 + e);
				if (read(stop[0], &c, 1) == 0) /* EOF: the parent is done */
					_exit(0);
			}
		}
	}
	close(stop[0]);
	for (unsigned i = 1; i <= n; i++) {
		if (i % bad == 0) {
			const char *why;

			fd = open(cfgpath, O_WRONLY | O_TRUNC);
			dprintf(fd, "[daemon]\nmetrics_listen = 127.0.0.1:%u\nno_such_key = 1\n",
				port);
			close(fd);
			why = restart_refused(&d);
			ck_assert_msg(why, "restart %u: a bad configuration was not refused", i);
			fd = open(cfgpath, O_WRONLY | O_TRUNC);
			dprintf(fd, "[daemon]\nmetrics_listen = 127.0.0.1:%u\n", port);
			close(fd);
			replace_bin(bin, good, loaded_end(good) / 2);
			why = restart_refused(&d);
			ck_assert_msg(why, "restart %u: a truncated binary was not refused", i);
			replace_bin(bin, foreign, sizeof(foreign) - 1);
			why = restart_refused(&d);
			ck_assert_msg(why && strstr(why, "exited 3"),
				      "restart %u: a foreign executable was not refused: %s", i,
				      why);
			refused += 3;
			/* past the pre-flight, exiting at start: the old binary takes over */
			replace_bin_exits_at_start(bin, orig);
			why = restart_refused(&d);
			ck_assert_msg(why && strstr(why, "ended before it took the sessions over"),
				      "restart %u: no fallback: %s", i, why);
			ck_assert_int_eq(waitpid(d.pid, NULL, 0), d.pid);
			d.pid = status_pid(&d);
			ck_assert(daemon_alive(&d));
			fell_back++;
			replace_bin(bin, good, (size_t)sb.st_size);
		}
		restart(&d, -1);
		if (env_n && i % 50 == 0)
			fprintf(stderr, "restart soak: %u restarts, %u refused, %u fell back\n", i,
				refused, fell_back);
	}
	close(stop[1]);
	for (int k = 0; k < 4; k++) {
		int st;

		ck_assert_int_eq(waitpid(kids[k], &st, 0), kids[k]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "client %d: status %d (workload failure code %d)", k, st,
			      WIFEXITED(st) ? WEXITSTATUS(st) - 1 : -1);
	}
	/* measured as the baseline was: a restarted process after one workload (descriptors and
	 * pool bytes are carried by every restart; a mapping of the old process is not) */
	restart(&d, 0);
	ck_assert_int_eq(workload(d.sock, 1, -1, -1).err, 0);
	for (uint32_t pr = 0; pr < PX_PROMPTS; pr++)
		ck_assert_int_eq(prefix_round(d.sock, pr), 0);
	/* a restart's short-lived threads (the pool's populate, the reaper) come and go: waited
	 * for, boundedly. Mappings are compared by what they map (files, the pool's memfd): two
	 * processes' anonymous mappings merge differently as randomisation places them */
	for (int i = 0; i < 250; i++) {
		u1 = daemon_usage(&d);
		if (u1.fds == u0.fds && (u1.sanitized || u1.named_maps == u0.named_maps))
			break;
		usleep(20000);
	}
	{
		struct json_object *bl = admin_request(d.sock, KVT_CTL_BLOCKS);

		ck_assert_ptr_nonnull(bl);
		cached = json_get_i64(bl, "bytes");
		published = json_get_i64(bl, "published");
		ck_assert_int_eq(json_get_i64(bl, "referenced"), 0);
		json_object_put(bl);
	}
	printf("restart soak: %u restarts in place, %u bad ones refused, %u fell back to the old "
	       "binary, 4 clients (%lld blocks published); daemon fds %ld -> %ld, named maps "
	       "%ld -> %ld (all maps %ld -> %ld), RSS %ld -> %ld kB, pool bytes %lld (cached "
	       "blocks %lld)\n",
	       n, refused, fell_back, (long long)published, u0.fds, u1.fds, u0.named_maps,
	       u1.named_maps, u0.maps, u1.maps, u0.rss_kb, u1.rss_kb, (long long)pool_used(d.sock),
	       (long long)cached);
	ck_assert_int_eq(u1.fds, u0.fds);
	if (!u1.sanitized)
		ck_assert_int_eq(u1.named_maps, u0.named_maps);
	/* every sequence gone: only the prefix store's cached blocks, all of every prompt */
	ck_assert_int_eq(cached, (int64_t)PX_PROMPTS * PX_NBLK * PX_BT * TOK * 4);
	ck_assert_int_eq(pool_used(d.sock), cached);
	ck_assert_int_eq(daemon_stop(&d), 0);
	free(good);
	free((void *)orig);
	unlink(bin);
	unlink(cfgpath);
	rmdir(dir);
}
END_TEST

KVT_CHECK_MAIN("restart", 300, NULL, NULL, t_restart_lossless, t_restart_refused_image,
	       t_restart_keeps_quota, t_restart_lowered_limits, t_restart_twice_pipelined,
	       t_restart_op_err_gen, t_restart_not_admin, t_restart_metrics_listen,
	       t_restart_fails_asker_gone, t_restart_lowered_quota, t_restart_seq_stats_kept,
	       t_restart_preflight, t_restart_fallback, t_restart_fallback_gave_up, t_restart_soak)
