/* SPDX-License-Identifier: MIT */
/*
 * Integration: a real kvtierd, real client processes through libkvtier, and raw peers where a
 * test must misbehave in ways libkvtier never would (garbage ring indices, silence, bad fds).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_ring.h"
#include "kvtier.h"
#include "kvt_test.h"

static struct kvtd_proc D;

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
	p->evict_frac = 0.0f;
}

static uint64_t
token_bytes(const struct kvt_seq_params *p)
{
	return (uint64_t)p->layers * 2 * p->kv_heads * p->head_dim * kvt_dtype_size(p->dtype);
}

static struct kvt_client *
connect_ok(const char *name)
{
	struct kvt_opts o = {.size = sizeof(o), .name = name, .spin_us = 20};
	struct kvt_client *c = NULL;
	int r = kvt_connect(D.sock, &o, &c);

	ck_assert_msg(r == 0, "kvt_connect: %s (%s)", kvt_strerror(r), kvt_last_error());
	return c;
}

static void
start_default(void)
{
	daemon_start(&D, NULL);
}

static void
stop_default(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

/* Append @ntok tokens of deterministic content; returns the new n. */
static int64_t
append_some(struct kvt_client *c, uint32_t seq, const struct kvt_seq_params *p, uint32_t ntok)
{
	uint64_t len = token_bytes(p) * ntok;
	uint8_t *rows = malloc(len);
	int64_t r;

	for (uint64_t i = 0; i < len; i++)
		rows[i] = (uint8_t)(i * 31 + ntok);
	r = kvt_append(c, seq, rows, len, ntok, NULL);
	free(rows);
	return r;
}

START_TEST(t_basic)
{
	struct kvt_client *c = connect_ok("basic");
	struct kvt_seq_params p;
	struct kvt_seq_stat st;
	float sc[10];
	uint32_t seq;
	uint64_t first = 99;

	ck_assert_int_eq(kvt_nop(c), 0);
	params_default(&p);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	ck_assert_uint_eq(seq, 1);
	ck_assert_int_eq(append_some(c, seq, &p, 10), 10);
	{
		uint8_t *rows = calloc(3, token_bytes(&p));

		ck_assert_int_eq(kvt_append(c, seq, rows, 3 * token_bytes(&p), 3, &first), 13);
		ck_assert_uint_eq(first, 10);
		/* Length that does not match count * token size. */
		ck_assert_int_eq(kvt_append(c, seq, rows, 3 * token_bytes(&p) - 1, 3, NULL),
				 -EINVAL);
		free(rows);
	}
	for (int i = 0; i < 10; i++)
		sc[i] = 0.1f * i;
	ck_assert_int_eq(kvt_score_add(c, seq, 3, sc, 10), 0);
	ck_assert_int_eq(kvt_score_add(c, seq, 4, sc, 10), -EINVAL); /* passes n */
	/* A payload larger than the arena (16 MiB) fails in the library, nothing is sent. */
	ck_assert_int_eq(kvt_score_add(c, seq, 0, sc, 5u << 20), -E2BIG);
	ck_assert_int_eq(kvt_append(c, seq, sc, 1ull << 32, 1, NULL), -E2BIG);
	ck_assert_int_eq(kvt_seq_stat(c, seq, &st), 0);
	ck_assert_uint_eq(st.n_tokens, 13);
	ck_assert_uint_eq(st.tier_count[1], 13);
	ck_assert_uint_eq(st.bytes_in, 13 * token_bytes(&p));
	ck_assert(fabs(st.score_total - 4.5) < 1e-4);
	ck_assert_int_gt(pool_used(D.sock), 0);
	ck_assert_int_eq(kvt_seq_close(c, seq), 0);
	ck_assert_int_eq(kvt_seq_close(c, seq), -ENOENT);
	ck_assert_int_eq(pool_used(D.sock), 0);
	kvt_disconnect(c);
}
END_TEST

START_TEST(t_async_batch)
{
	struct kvt_client *c = connect_ok("batch");
	struct kvt_cqe cqe;
	uint64_t seen = 0;

	for (int round = 0; round < 50; round++) {
		int n = 0;
		struct kvt_sqe *e;

		while ((e = kvt_get_sqe(c))) {
			e->opcode = KVT_OP_NOP;
			e->user_data = (uint64_t)round * 1000 + n++;
		}
		ck_assert_int_gt(n, 0);
		ck_assert_int_eq(kvt_submit(c), n);
		for (int i = 0; i < n; i++) {
			ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
			ck_assert_int_eq(cqe.res, 0);
			ck_assert_uint_eq(cqe.user_data, (uint64_t)round * 1000 + i); /* in order */
			seen++;
		}
	}
	ck_assert_int_eq(kvt_wait_cqe(c, &cqe), -EAGAIN);
	ck_assert_uint_gt(seen, 50);
	kvt_disconnect(c);
}
END_TEST

/* A worker process: open, append and score for @steps decode steps, verify, exit 0. */
static int
worker(const char *name, int steps)
{
	struct kvt_opts o = {.size = sizeof(o), .name = name, .spin_us = 10};
	struct kvt_client *c;
	struct kvt_seq_params p;
	struct kvt_seq_stat st;
	uint32_t seq;

	if (kvt_connect(D.sock, &o, &c) < 0)
		return 10;
	params_default(&p);
	if (kvt_seq_open(c, &p, &seq) < 0)
		return 11;
	for (int t = 0; t < steps; t++) {
		float w[64];
		uint32_t n = t + 1 < 64 ? t + 1 : 64;

		if (append_some(c, seq, &p, 1) != t + 1)
			return 12;
		for (uint32_t i = 0; i < n; i++)
			w[i] = 1.0f / n;
		if (kvt_score_add(c, seq, t + 1 - n, w, n) < 0)
			return 13;
	}
	if (kvt_seq_stat(c, seq, &st) < 0 || st.n_tokens != (uint64_t)steps)
		return 14;
	if (fabs(st.score_total - steps) > 1e-3 * steps)
		return 15;
	kvt_disconnect(c);
	return 0;
}

START_TEST(t_concurrent_clients)
{
	pid_t pids[4];
	struct json_object *o;

	for (int i = 0; i < 4; i++) {
		char name[16];

		snprintf(name, sizeof(name), "worker-%d", i);
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(worker(name, 300));
	}
	for (int i = 0; i < 4; i++) {
		int st;

		ck_assert_int_eq(waitpid(pids[i], &st, 0), pids[i]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d failed: %d", i,
			      WEXITSTATUS(st));
	}
	ck_assert_int_eq(pool_used(D.sock), 0);
	o = admin_request(D.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(json_get_i64(o, "sessions"), 0);
	ck_assert_int_ge(json_get_i64(o, "ops"), 4 * 600);
	json_object_put(o);
}
END_TEST

START_TEST(t_sigkill_reclaims)
{
	int64_t base = pool_used(D.sock);
	int pipefd[2];
	pid_t victim, survivor;
	char ch;
	int st;

	ck_assert_int_eq(base, 0);
	ck_assert_int_eq(pipe(pipefd), 0);
	victim = fork();
	if (victim == 0) {
		struct kvt_client *c;
		struct kvt_seq_params p;
		uint32_t seq;

		c = connect_ok("victim");
		params_default(&p);
		if (kvt_seq_open(c, &p, &seq) < 0)
			_exit(1);
		append_some(c, seq, &p, 100);
		if (write(pipefd[1], "x", 1) != 1)
			_exit(1);
		for (;;) /* mid-stream when the signal lands */
			if (append_some(c, seq, &p, 4) < 0)
				_exit(2);
	}
	ck_assert_int_eq(read(pipefd[0], &ch, 1), 1);
	survivor = fork();
	if (survivor == 0)
		_exit(worker("survivor", 2000));
	usleep(20000);
	ck_assert_int_gt(pool_used(D.sock), 0);
	kill(victim, SIGKILL);
	waitpid(victim, NULL, 0);
	ck_assert_int_eq(waitpid(survivor, &st, 0), survivor);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "survivor failed: %d",
		      WEXITSTATUS(st));
	/* The daemon sees the victim's hangup asynchronously; give it a moment. */
	for (int i = 0; i < 300 && pool_used(D.sock) != base; i++)
		usleep(10000);
	ck_assert_int_eq(pool_used(D.sock), base);
	ck_assert(daemon_alive(&D));
}
END_TEST

START_TEST(t_bad_sqes)
{
	struct kvt_client *c = connect_ok("bad");
	struct kvt_seq_params p;
	struct kvt_cqe cqe;
	struct kvt_sqe *e;
	uint32_t seq;
	struct {
		uint8_t opcode, flags;
		uint16_t op_flags;
		uint32_t seq;
		uint64_t arena_off;
		uint32_t arena_len, count;
		uint64_t reserved;
		int want;
	} cases[] = {
	    {200, 0, 0, 0, 0, 0, 0, 0, -EINVAL},		    /* unknown opcode */
	    {KVT_OP__COUNT, 0, 0, 0, 0, 0, 0, 0, -EINVAL},	    /* first unassigned */
	    {KVT_OP_NOP, 0x80, 0, 0, 0, 0, 0, 0, -EINVAL},	    /* reserved flag bit */
	    {KVT_OP_NOP, 0, 0, 0, 0, 0, 0, 1, -EINVAL},		    /* reserved field */
	    {KVT_OP_NOP, 0, 1, 0, 0, 0, 0, 0, -EINVAL},		    /* op flag on NOP */
	    {KVT_OP_SEQ_STAT, 0, 0, 100000, 0, 200, 0, 0, -EINVAL}, /* seq id out of range */
	    {KVT_OP_SEQ_STAT, 0, 0, 0, 0, 200, 0, 0, -EINVAL},	    /* seq 0 */
	    {KVT_OP_SEQ_STAT, 0, 0, 5, 0, 200, 0, 0, -ENOENT},	    /* in range, not open */
	    /* arena offset + length that overflows u64 */
	    {KVT_OP_SCORE_ADD, 0, 0, 1, UINT64_MAX - 3, 8, 2, 0, -EINVAL},
	    {KVT_OP_SEQ_OPEN, 0, 0, 0, UINT64_MAX - 100, 160, 0, 0, -EINVAL},
	    {KVT_OP_APPEND, 0, 0x8, 1, 0, 4, 1, 0, -EINVAL}, /* unknown APPEND flag */
	    {KVT_OP_APPEND, 0, 0, 1, 0, 0, 0, 0, -EINVAL},   /* zero tokens */
	};

	params_default(&p);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	ck_assert_int_eq(append_some(c, seq, &p, 2), 2);
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		e = kvt_get_sqe(c);
		e->opcode = cases[i].opcode;
		e->flags = cases[i].flags;
		e->op_flags = cases[i].op_flags;
		e->seq = cases[i].seq;
		e->arena_off = cases[i].arena_off;
		e->arena_len = cases[i].arena_len;
		e->count = cases[i].count;
		e->arg3 = cases[i].reserved;
		e->user_data = i;
		kvt_submit(c);
		ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
		ck_assert_uint_eq(cqe.user_data, i);
		ck_assert_msg(cqe.res == cases[i].want, "case %u: res %d want %d", i, cqe.res,
			      cases[i].want);
	}
	/* Nothing above changed the sequence. */
	{
		struct kvt_seq_stat st;

		ck_assert_int_eq(kvt_seq_stat(c, seq, &st), 0);
		ck_assert_uint_eq(st.n_tokens, 2);
		ck_assert(st.score_total == 0.0);
	}
	/* Scores that are not attention weights. */
	{
		float bad[2] = {NAN, 0.5f}, neg[2] = {-1.0f, 0.5f};

		ck_assert_int_eq(kvt_score_add(c, seq, 0, bad, 2), -EINVAL);
		ck_assert_int_eq(kvt_score_add(c, seq, 0, neg, 2), -EINVAL);
	}
	ck_assert_int_eq(kvt_nop(c), 0);
	kvt_disconnect(c);
}
END_TEST

START_TEST(t_bad_params)
{
	struct kvt_client *c = connect_ok("params");
	struct kvt_seq_params p;
	struct kvt_buf *t0;
	uint32_t seq;

	params_default(&p);
	p.delta = 0;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -EINVAL);
	params_default(&p);
	p.hbm_frac = 1.5f;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -EINVAL);
	params_default(&p);
	p.evict_frac = NAN;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -EINVAL);
	params_default(&p);
	p.t2_frac = -0.1f;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -EINVAL);
	params_default(&p);
	p.layers = 0;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -EINVAL);
	params_default(&p);
	p.reserved[1] = 1;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -EINVAL);
	params_default(&p);
	p.t0_buf_id = 3; /* never registered */
	p.t0_slots = 128;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -ENOENT);

	ck_assert_int_eq(kvt_buf_alloc(c, 1 << 20, &t0), 0);
	params_default(&p);
	p.t0_buf_id = kvt_buf_id(t0);
	p.t0_slots = 16; /* window 32 > t0_slots */
	p.t0_slot_stride = 256;
	p.t0_kv_stride = 16 * 256;
	p.t0_layer_stride = 2 * 16 * 256;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -EINVAL);
	p.t0_slots = 4096; /* outside the 1 MiB buffer */
	p.t0_kv_stride = 4096ull * 256;
	p.t0_layer_stride = 2 * 4096ull * 256;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -ERANGE);
	p.t0_slots = 128;
	p.t0_kv_stride = 128 * 256;
	p.t0_layer_stride = UINT64_MAX / 2; /* overflows */
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -ERANGE);
	ck_assert_int_eq(kvt_buf_free(c, t0), 0);
	ck_assert_int_eq(kvt_nop(c), 0);
	kvt_disconnect(c);
}
END_TEST

START_TEST(t_t0_append)
{
	struct kvt_client *c = connect_ok("t0");
	struct kvt_seq_params p;
	struct kvt_seq_stat st;
	struct kvt_buf *t0;
	uint32_t seq, slots[3] = {0, 5, 7}, bad[2] = {1, 1}, oob[1] = {128};
	uint64_t row;

	ck_assert_int_eq(kvt_buf_alloc(c, 4 << 20, &t0), 0);
	params_default(&p);
	row = (uint64_t)p.kv_heads * p.head_dim * 2;
	p.t0_buf_id = kvt_buf_id(t0);
	p.t0_slots = 128;
	p.t0_slot_stride = row;
	p.t0_kv_stride = 128 * row;
	p.t0_layer_stride = 2 * 128 * row;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	memset(kvt_buf_ptr(t0), 0x5a, kvt_buf_size(t0));
	ck_assert_int_eq(kvt_append_t0(c, seq, slots, 3), 3);
	ck_assert_int_eq(kvt_append_t0(c, seq, bad, 2), -EINVAL);
	ck_assert_int_eq(kvt_append_t0(c, seq, oob, 1), -EINVAL);
	ck_assert_int_eq(kvt_seq_stat(c, seq, &st), 0);
	ck_assert_uint_eq(st.n_tokens, 3);
	ck_assert_uint_eq(st.tier_count[0], 3);
	/* A slot holding a live token is not free: -EBUSY, nothing appended. */
	ck_assert_int_eq(kvt_append_t0(c, seq, &slots[1], 1), -EBUSY);
	ck_assert_int_eq(kvt_seq_stat(c, seq, &st), 0);
	ck_assert_uint_eq(st.n_tokens, 3);
	ck_assert_uint_eq(st.tier_count[0], 3);
	/* A buffer an open sequence uses cannot be unregistered. */
	ck_assert_int_eq(kvt_buf_free(c, t0), -EBUSY);
	ck_assert_int_eq(kvt_seq_close(c, seq), 0);
	ck_assert_int_eq(kvt_buf_free(c, t0), 0);
	kvt_disconnect(c);
}
END_TEST

/* A raw peer: HELLO by hand so the test can scribble over the ring. */
static int
raw_connect(const char *sock, uint16_t abi_major, struct kvt_region_hdr **ret_region, int *ret_sock)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvt_ctl_hello h = {0};
	union {
		struct kvt_ctl_welcome w;
		struct kvt_ctl_error e;
	} rep;
	char cbuf[CMSG_SPACE(3 * sizeof(int))];
	struct iovec iov = {&rep, sizeof(rep)};
	struct msghdr m = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0), fds[3];

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	h.hdr.type = KVT_CTL_HELLO;
	h.hdr.len = sizeof(h);
	h.abi_major = abi_major;
	ck_assert_int_eq(send(fd, &h, sizeof(h), 0), sizeof(h));
	ck_assert_int_gt(recvmsg(fd, &m, 0), 0);
	*ret_sock = fd;
	if (rep.w.hdr.type != KVT_CTL_WELCOME)
		return rep.e.err;
	memcpy(fds, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(fds));
	*ret_region = mmap(NULL, rep.w.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	ck_assert(*ret_region != MAP_FAILED);
	/* The region is sealed against resizing. */
	ck_assert_int_lt(ftruncate(fds[0], 4096), 0);
	ck_assert_int_eq(errno, EPERM);
	close(fds[0]);
	/* ring the SQ doorbell (fds[1]) on demand */
	*ret_sock = fd;
	(*ret_region)->reserved0 = (uint32_t)fds[1]; /* test-local stash; the daemon ignores it */
	return 0;
}

START_TEST(t_garbage_sq_tail)
{
	struct kvt_client *good = connect_ok("good");
	struct kvt_region_hdr *reg;
	struct kvt_ctl_error err;
	struct kvt_ring_hdr *sq;
	uint64_t one = 1;
	int sock;

	ck_assert_int_eq(raw_connect(D.sock, KVT_ABI_MAJOR, &reg, &sock), 0);
	sq = (struct kvt_ring_hdr *)((uint8_t *)reg + reg->sq_ring_off);
	kvt_ring_store_tail(sq, 0x7fff1234); /* far beyond sq_entries */
	ck_assert_int_eq(write((int)reg->reserved0, &one, 8), 8);
	/* The daemon says why, then hangs up. */
	ck_assert_int_eq(recv(sock, &err, sizeof(err), 0), sizeof(err));
	ck_assert_uint_eq(err.hdr.type, KVT_CTL_ERROR);
	ck_assert_int_eq(err.err, -EPROTO);
	ck_assert_ptr_nonnull(strstr(err.msg, "SQ tail"));
	ck_assert_int_eq(recv(sock, &err, sizeof(err), 0), 0);
	/* Everyone else carries on. */
	ck_assert_int_eq(kvt_nop(good), 0);
	ck_assert(daemon_alive(&D));
	kvt_disconnect(good);
	close(sock);
}
END_TEST

START_TEST(t_abi_mismatch)
{
	struct kvt_opts o = {.size = sizeof(o), .abi_major = KVT_ABI_MAJOR + 1};
	struct kvt_client *c = NULL;

	ck_assert_int_eq(kvt_connect(D.sock, &o, &c), -EPROTO);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "ABI mismatch"));
	c = connect_ok("after-mismatch");
	ck_assert_int_eq(kvt_nop(c), 0);
	kvt_disconnect(c);
}
END_TEST

START_TEST(t_unsealed_buffer)
{
	struct kvt_client *c = connect_ok("unsealed");
	struct kvt_region_hdr *reg;
	struct kvt_ctl_buf_register m = {0};
	struct kvt_ctl_error e;
	char cbuf[CMSG_SPACE(sizeof(int))] = {0};
	struct iovec iov = {&m, sizeof(m)};
	struct msghdr mh = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	int sock, fd = memfd_create("unsealed", MFD_ALLOW_SEALING);

	ck_assert_int_eq(raw_connect(D.sock, KVT_ABI_MAJOR, &reg, &sock), 0);
	ck_assert_int_eq(ftruncate(fd, 65536), 0);
	m.hdr.type = KVT_CTL_BUF_REGISTER;
	m.hdr.len = sizeof(m);
	m.kind = KVT_BUF_HOST_MEMFD;
	m.size = 65536;
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	ck_assert_int_eq(sendmsg(sock, &mh, 0), sizeof(m));
	ck_assert_int_eq(recv(sock, &e, sizeof(e), 0), sizeof(e));
	ck_assert_uint_eq(e.hdr.type, KVT_CTL_ERROR);
	ck_assert_int_eq(e.err, -EINVAL);
	/* A claimed size beyond the file is refused too, even when sealed. */
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	m.size = 1 << 20;
	ck_assert_int_eq(sendmsg(sock, &mh, 0), sizeof(m));
	ck_assert_int_eq(recv(sock, &e, sizeof(e), 0), sizeof(e));
	ck_assert_int_eq(e.err, -EINVAL);
	/* Malformed control message: wrong length field. Fails alone. */
	m.hdr.len = 3;
	ck_assert_int_eq(send(sock, &m, sizeof(m), 0), sizeof(m));
	ck_assert_int_eq(recv(sock, &e, sizeof(e), 0), sizeof(e));
	ck_assert_int_eq(e.err, -EINVAL);
	ck_assert_int_eq(kvt_nop(c), 0);
	close(fd);
	close(sock);
	kvt_disconnect(c);
}
END_TEST

START_TEST(t_quota_and_exhaustion)
{
	struct kvt_client *c = connect_ok("greedy"), *other;
	struct kvt_seq_params p;
	uint32_t seq, seq2;
	int64_t r = 0;
	int n = 0;

	params_default(&p); /* 2 KiB per token: 64 tokens = 128 KiB */
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	while ((r = append_some(c, seq, &p, 64)) > 0)
		n++;
	ck_assert_int_eq(r, -EDQUOT); /* pool_bytes_per_session = 16M */
	ck_assert_int_eq(n, 128);
	other = connect_ok("other");
	ck_assert_int_eq(kvt_seq_open(other, &p, &seq2), 0);
	while ((r = append_some(other, seq2, &p, 64)) > 0)
		;
	ck_assert_int_eq(r, -EDQUOT);
	/* uid quota 32M: the third session of the same uid hits it first */
	{
		struct kvt_client *third = connect_ok("third");
		uint32_t s3;

		ck_assert_int_eq(kvt_seq_open(third, &p, &s3), 0);
		ck_assert_int_eq(append_some(third, s3, &p, 64), -EDQUOT);
		kvt_disconnect(third);
	}
	kvt_disconnect(c);
	kvt_disconnect(other);
	for (int i = 0; i < 100 && pool_used(D.sock) != 0; i++)
		usleep(10000);
	ck_assert_int_eq(pool_used(D.sock), 0);
}
END_TEST

/*
 * RETIER's int8 room (T2 slots, and with per-channel keys the key-scale blocks) is taken before
 * anything moves: with the session quota spent it fails with -EDQUOT and changes nothing; the
 * sequence goes on, and closing gives everything back.
 */
START_TEST(t_retier_int8_quota)
{
	const uint32_t flags[2] = {0, KVT_T2_F_KEY_CHANNEL};

	for (int fi = 0; fi < 2; fi++) {
		struct kvt_client *c = connect_ok("int8");
		struct kvt_seq_params p;
		struct kvt_seq_stat before, after;
		static uint8_t out[1 << 16];
		static float w[1 << 13];
		int64_t used, r;
		uint32_t seq, n = 0;

		params_default(&p);
		p.hbm_frac = 0.3f;
		p.t2_frac = 0.5f;
		p.t2_flags = flags[fi];
		ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
		while ((r = append_some(c, seq, &p, 64)) > 0)
			n = (uint32_t)r;
		ck_assert_int_eq(r, -EDQUOT);
		ck_assert_uint_le(n, sizeof(w) / sizeof(w[0]));
		for (uint32_t i = 0; i < n; i++)
			w[i] = (float)(i % 7);
		ck_assert_int_eq(kvt_score_add(c, seq, 0, w, n), 0);
		ck_assert_int_eq(kvt_seq_stat(c, seq, &before), 0);
		used = pool_used(D.sock);
		ck_assert_int_eq(kvt_retier(c, seq, out, sizeof(out)), -EDQUOT);
		ck_assert_int_eq(kvt_seq_stat(c, seq, &after), 0);
		ck_assert(!memcmp(before.tier_count, after.tier_count, sizeof(before.tier_count)));
		ck_assert_uint_eq(after.pool_bytes, before.pool_bytes);
		ck_assert_int_eq(pool_used(D.sock), used);
		ck_assert_int_eq(kvt_nop(c), 0); /* still served */
		ck_assert_int_eq(kvt_seq_close(c, seq), 0);
		ck_assert_int_eq(pool_used(D.sock), 0);
		kvt_disconnect(c);
	}
}
END_TEST

START_TEST(t_pool_exhaustion)
{
	struct kvt_client *c = connect_ok("hog");
	struct kvt_seq_params p;
	struct json_object *o;
	uint32_t seq;
	int64_t r;

	params_default(&p);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	while ((r = append_some(c, seq, &p, 64)) > 0)
		;
	ck_assert_int_eq(r, -ENOMEM);
	o = admin_request(D.sock, KVT_CTL_STATUS);
	ck_assert_int_eq(json_get_i64(o, "pool.used"), 64 << 20);
	ck_assert_int_ge(json_get_i64(o, "refused.nomem"), 1);
	json_object_put(o);
	ck_assert_int_eq(kvt_nop(c), 0); /* still served */
	ck_assert_int_eq(kvt_seq_close(c, seq), 0);
	ck_assert_int_eq(pool_used(D.sock), 0);
	kvt_disconnect(c);
}
END_TEST

START_TEST(t_hello_timeout)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvt_ctl_error e;
	struct timeval tv = {5, 0};
	struct json_object *o;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", D.sock);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	/* say nothing */
	ck_assert_int_eq(recv(fd, &e, sizeof(e), 0), sizeof(e));
	ck_assert_int_eq(e.err, -ETIMEDOUT);
	ck_assert_int_eq(recv(fd, &e, sizeof(e), 0), 0);
	close(fd);
	o = admin_request(D.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(o);
	ck_assert_int_ge(json_get_i64(o, "refused.hello_timeout"), 1);
	json_object_put(o);
	{
		struct kvt_client *c = connect_ok("after-timeout");

		ck_assert_int_eq(kvt_nop(c), 0);
		kvt_disconnect(c);
	}
}
END_TEST

START_TEST(t_daemon_gone)
{
	struct kvt_client *c = connect_ok("orphan");
	struct kvt_cqe cqe;

	ck_assert_int_eq(daemon_stop(&D), 0);
	/* With the daemon gone a wait must fail, not hang. */
	struct kvt_sqe *e = kvt_get_sqe(c);

	e->opcode = KVT_OP_NOP;
	kvt_submit(c);
	ck_assert_int_eq(kvt_wait_cqe(c, &cqe), -ECONNRESET);
	ck_assert_int_eq(kvt_nop(c), -ECONNRESET);
	kvt_disconnect(c);
	daemon_start(&D, NULL); /* for the fixture's teardown */
}
END_TEST

static void
start_quota(void)
{
	static char conf[64];
	FILE *f;

	snprintf(conf, sizeof(conf), "/tmp/kvt-quota-%d.conf", (int)getpid());
	f = fopen(conf, "w");
	fprintf(f, "[limits]\npool_bytes_per_session = 16M\npool_bytes_per_uid = 32M\n");
	fclose(f);
	{
		const char *extra[] = {"--config", conf, NULL};

		daemon_start(&D, extra);
	}
}

static void
start_short_hello(void)
{
	const char *extra[] = {"--hello-timeout-ms", "200", NULL};

	daemon_start(&D, extra);
}

static Suite *
suite(void)
{
	Suite *s = suite_create("daemon");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, start_default, stop_default);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, t_basic);
	tcase_add_test(tc, t_async_batch);
	tcase_add_test(tc, t_concurrent_clients);
	tcase_add_test(tc, t_sigkill_reclaims);
	tcase_add_test(tc, t_bad_sqes);
	tcase_add_test(tc, t_bad_params);
	tcase_add_test(tc, t_t0_append);
	tcase_add_test(tc, t_garbage_sq_tail);
	tcase_add_test(tc, t_abi_mismatch);
	tcase_add_test(tc, t_unsealed_buffer);
	tcase_add_test(tc, t_pool_exhaustion);
	tcase_add_test(tc, t_daemon_gone);
	suite_add_tcase(s, tc);

	tc = tcase_create("quota");
	tcase_add_checked_fixture(tc, start_quota, stop_default);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, t_quota_and_exhaustion);
	tcase_add_test(tc, t_retier_int8_quota);
	suite_add_tcase(s, tc);

	tc = tcase_create("hello");
	tcase_add_checked_fixture(tc, start_short_hello, stop_default);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, t_hello_timeout);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	return kvt_check_run(suite());
}
