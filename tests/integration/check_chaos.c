/* SPDX-License-Identifier: MIT */
/*
 * kill -9 at random moments: 40 client processes in turn, each running every kind of work
 * kvtierd does (APPEND with int8 T2 and retrieval encoding, SCORE_ADD, RETIER, TOPK with and
 * without FETCH, FETCH, buffer registration, sequences opened and closed), are SIGKILLed after
 * a random 0-30 ms, while one well-behaved client decodes through all of it. The daemon must
 * stay up, the survivor must finish with correct results, and once the victims are gone no
 * session, sequence or pool byte of theirs may remain, and the daemon holds the descriptors and
 * mappings it held before. Seeded: the same delays every run. $KVT_CHAOS_VICTIMS raises the
 * count for long runs (tests/integration/chaos_long.sh); the survivor then decodes through
 * several sequences in turn until the last victim is gone.
 */
#define _GNU_SOURCE
#include <check.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

#define VICTIMS	   40
#define L	   2
#define H	   2
#define DIM	   64
#define ROW	   (H * DIM * 2) /* one K or V row of one token, f16 */
#define TOK	   (L * 2 * ROW) /* one token, all layers */
#define STAGE_ROWS 2048

static struct kvtd_proc D;

/* A victim's life: everything at once until the signal lands. Never returns normally. */
static void
victim(unsigned id, int ready_fd)
{
	struct kvt_opts o = {.size = sizeof(o), .name = "victim", .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = L,
				   .kv_heads = H,
				   .q_heads = 2 * H,
				   .head_dim = DIM,
				   .dtype = KVT_DTYPE_F16,
				   .delta = 16,
				   .sinks = 4,
				   .window = 16,
				   .hbm_frac = 0.3f,
				   .t2_frac = 0.3f,
				   .ret_update = 16,
				   .stage_slots = STAGE_ROWS,
				   .stage_slot_stride = ROW,
				   .stage_kv_stride = (uint64_t)STAGE_ROWS * ROW,
				   .stage_layer_stride = 2ull * STAGE_ROWS * ROW};
	static uint16_t rows[32 * TOK / 2];
	static uint8_t out[1 << 16];
	static uint32_t pos[STAGE_ROWS];
	float w[32], q[2 * H * DIM];
	uint64_t s = 0x9e3779b97f4a7c15ull ^ id;
	struct kvt_client *c;
	struct kvt_buf *stage, *tmp = NULL;
	uint32_t seq, extra = 0;

	if (kvt_connect(D.sock, &o, &c) < 0 ||
	    kvt_buf_alloc(c, 2ull * L * STAGE_ROWS * ROW, &stage) < 0)
		_exit(10);
	p.stage_buf_id = kvt_buf_id(stage);
	if (kvt_seq_open(c, &p, &seq) < 0)
		_exit(11);
	for (size_t i = 0; i < sizeof(rows) / 2; i++)
		rows[i] = (uint16_t)(0x3000 + kvt_test_xorshift(&s) % 0x0c00);
	for (int i = 0; i < 2 * H * DIM; i++)
		q[i] = (float)(kvt_test_xorshift(&s) % 1000) / 1000.0f - 0.5f;
	if (write(ready_fd, "x", 1) != 1)
		_exit(12);
	for (uint64_t n = 0;; n += 32) {
		if (n + 32 >= STAGE_ROWS) { /* start over in a fresh sequence */
			if (kvt_seq_close(c, seq) < 0 || kvt_seq_open(c, &p, &seq) < 0)
				_exit(13);
			n = 0;
		}
		if (kvt_append(c, seq, rows, sizeof(rows), 32, NULL) < 0)
			_exit(14);
		for (int i = 0; i < 32; i++)
			w[i] = (float)(kvt_test_xorshift(&s) % 100) / 100.0f;
		if (kvt_score_add(c, seq, n, w, 32) < 0)
			_exit(15);
		(void)kvt_retier(c, seq, out, sizeof(out)); /* -ENOMEM/-EDQUOT allowed */
		(void)kvt_topk(c, seq, (uint32_t)(kvt_test_xorshift(&s) % L), 8,
			       kvt_test_xorshift(&s) % 2 ? KVT_TOPK_F_FETCH : KVT_TOPK_F_ESTIMATE,
			       q, 2 * H * DIM, out, sizeof(out));
		(void)kvt_fetch(c, seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, L, 0, pos, STAGE_ROWS);
		if (!tmp && kvt_test_xorshift(&s) % 4 == 0) {
			if (kvt_buf_alloc(c, 1 << 20, &tmp) < 0)
				tmp = NULL;
		} else if (tmp && kvt_test_xorshift(&s) % 4 == 0) {
			kvt_buf_free(c, tmp);
			tmp = NULL;
		}
		if (!extra && kvt_test_xorshift(&s) % 8 == 0) { /* a second sequence, left open */
			struct kvt_seq_params p2 = p;

			p2.ret_update = 0;
			p2.stage_buf_id = 0;
			p2.stage_slots = 0;
			(void)kvt_seq_open(c, &p2, &extra);
		}
	}
}

/* The well-behaved client: @steps decode steps in each of its sequences, its scores checked at
 * the end of each; a new sequence after each until @stop_fd reads EOF. */
static int
survivor(int steps, int stop_fd)
{
	struct kvt_opts o = {.size = sizeof(o), .name = "survivor", .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = L,
				   .kv_heads = H,
				   .head_dim = DIM,
				   .dtype = KVT_DTYPE_F16,
				   .delta = 16,
				   .hbm_frac = 0.5f};
	static uint16_t row[TOK / 2];
	struct kvt_seq_stat st;
	struct kvt_client *c;
	uint32_t seq;

	if (kvt_connect(D.sock, &o, &c) < 0)
		return 10;
	for (;;) {
		struct pollfd pfd = {.fd = stop_fd, .events = POLLIN};

		if (kvt_seq_open(c, &p, &seq) < 0)
			return 10;
		for (int t = 0; t < steps; t++) {
			float one = 1.0f;
			uint8_t out[4096];

			if (kvt_append(c, seq, row, sizeof(row), 1, NULL) != t + 1 ||
			    kvt_score_add(c, seq, (uint64_t)t, &one, 1) < 0)
				return 11;
			if (t % 16 == 15 && kvt_retier(c, seq, out, sizeof(out)) < 0)
				return 12;
		}
		if (kvt_seq_stat(c, seq, &st) < 0 || st.n_tokens != (uint64_t)steps ||
		    fabs(st.score_total - steps) > 1e-3 * steps)
			return 13;
		if (kvt_seq_close(c, seq) < 0)
			return 14;
		if (poll(&pfd, 1, 0) == 1)
			break;
	}
	kvt_disconnect(c);
	return 0;
}

/* Sessions end asynchronously after the hangup: wait until none is left and the pool is empty. */
static void
wait_reclaimed(void)
{
	for (int i = 0;; i++) {
		struct json_object *o = admin_request(D.sock, KVT_CTL_STATUS);
		int64_t sessions = o ? json_get_i64(o, "sessions") : -1;

		if (o)
			json_object_put(o);
		if (sessions == 0 && pool_used(D.sock) == 0)
			break;
		ck_assert_msg(i < 500, "left behind: %lld sessions, %lld pool bytes",
			      (long long)sessions, (long long)pool_used(D.sock));
		usleep(10000);
	}
}

/* Forks victim @id, lets it work for a seeded 0-30 ms, SIGKILLs it. */
static void
kill_one(unsigned id, uint64_t *s)
{
	int p[2], st;
	pid_t v;
	char ch;

	ck_assert_int_eq(pipe(p), 0);
	v = fork();
	ck_assert_int_ge(v, 0);
	if (v == 0) {
		close(p[0]);
		victim(id, p[1]);
		_exit(1);
	}
	close(p[1]);
	ck_assert_int_eq(read(p[0], &ch, 1), 1); /* set up, now working */
	close(p[0]);
	usleep((useconds_t)(kvt_test_xorshift(s) % 30000));
	kill(v, SIGKILL);
	ck_assert_int_eq(waitpid(v, &st, 0), v);
	/* died by the signal, not by a failed request */
	ck_assert_msg(WIFSIGNALED(st), "victim %u exited with %d", id, WEXITSTATUS(st));
	ck_assert(daemon_alive(&D));
}

START_TEST(t_chaos)
{
	const char *env = getenv("KVT_CHAOS_VICTIMS");
	unsigned victims = env && atoi(env) > 0 ? (unsigned)atoi(env) : VICTIMS;
	uint64_t s = 42;
	struct kvtd_usage u0, u1;
	int st, stop[2];
	pid_t surv;

	daemon_start(&D, NULL);
	/* The baseline after one victim: the first session's lazily made state (thread arenas,
	 * scratch) is the daemon's, not a leak. */
	kill_one(victims, &s);
	wait_reclaimed();
	u0 = daemon_usage(&D);
	ck_assert_int_eq(pipe(stop), 0);
	surv = fork();
	ck_assert_int_ge(surv, 0);
	if (surv == 0) {
		close(stop[1]);
		_exit(survivor(20000, stop[0]));
	}
	close(stop[0]);
	for (unsigned i = 0; i < victims; i++) {
		kill_one(i, &s);
		if (env && i % 500 == 499)
			fprintf(stderr, "chaos: %u victims SIGKILLed\n", i + 1);
	}
	close(stop[1]); /* the survivor ends after its current sequence */
	ck_assert_int_eq(waitpid(surv, &st, 0), surv);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "survivor failed: %d",
		      WEXITSTATUS(st));
	wait_reclaimed();
	u1 = daemon_usage(&D);
	printf("chaos: %u victims SIGKILLed; daemon fds %ld -> %ld, maps %ld -> %ld, "
	       "RSS %ld -> %ld kB, pool bytes 0 -> %lld\n",
	       victims, u0.fds, u1.fds, u0.maps, u1.maps, u0.rss_kb, u1.rss_kb,
	       (long long)pool_used(D.sock));
	ck_assert_int_eq(u1.fds, u0.fds);
	if (!u1.sanitized) /* a sanitizer's allocator maps more as size classes are first used */
		ck_assert_int_eq(u1.maps, u0.maps);
	ck_assert_int_eq(daemon_stop(&D), 0);
}
END_TEST

KVT_CHECK_MAIN("chaos", 300, NULL, NULL, t_chaos)
