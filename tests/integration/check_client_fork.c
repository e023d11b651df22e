/* SPDX-License-Identifier: MIT */
/*
 * A client used after fork(): the child's calls fail with -ECHILD and touch nothing, so the
 * parent's session goes on as if the child never existed (no foreign APPEND in its sequence,
 * no completion of its reaped by the child).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvtier.h"
#include "kvt_test.h"

enum { L = 1, H = 1, D = 8, ROW = L * 2 * H * D * 4 };

static struct kvtd_proc Dm;

/* Each of the child's calls: -ECHILD, and a reason that names fork(). Exit status: 0 or the
 * number of the first check that failed. */
static int
child(struct kvt_client *c, uint32_t seq)
{
	float row[ROW / 4] = {1.0f};
	struct kvt_seq_stat st;
	struct kvt_cqe cqe;
	struct kvt_buf *b;
	uint8_t out[KVT_RETIER_OUT_SIZE(0)];

	if (kvt_wait_cqe(c, &cqe) != -ECHILD) /* the parent's NOP stays the parent's */
		return 1;
	if (kvt_peek_cqe(c, &cqe) != -ECHILD)
		return 2;
	if (kvt_append(c, seq, row, sizeof(row), 1, NULL) != -ECHILD)
		return 3;
	if (!strstr(kvt_last_error(), "fork()"))
		return 4;
	if (kvt_nop(c) != -ECHILD || kvt_seq_stat(c, seq, &st) != -ECHILD ||
	    kvt_retier(c, seq, out, sizeof(out)) != -ECHILD)
		return 5;
	if (kvt_get_sqe(c) != NULL || kvt_submit(c) != -ECHILD)
		return 6;
	if (kvt_buf_alloc(c, 4096, &b) != -ECHILD || !strstr(kvt_last_error(), "fork()"))
		return 7;
	if (kvt_seq_close(c, seq) != -ECHILD)
		return 8;
	if (!strstr(kvt_strerror(-ECHILD), "fork"))
		return 9;
	kvt_disconnect(c); /* frees this process's copy only */
	return 0;
}

START_TEST(t_child_refused_parent_untouched)
{
	struct kvt_opts o = {.size = sizeof(o), .name = "forker"};
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = L,
				   .kv_heads = H,
				   .head_dim = D,
				   .dtype = KVT_DTYPE_F32,
				   .policy = KVT_POLICY_FULL,
				   .delta = 1};
	float row[ROW / 4] = {2.0f};
	struct kvt_seq_stat st;
	struct kvt_client *c;
	struct kvt_cqe cqe;
	struct kvt_sqe *e;
	uint32_t seq;
	pid_t pid;
	int status;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	ck_assert_int_eq(kvt_append(c, seq, row, sizeof(row), 1, NULL), 1);
	e = kvt_get_sqe(c);
	ck_assert_ptr_nonnull(e);
	kvt_prep_nop(e);
	e->user_data = 42;
	ck_assert_int_eq(kvt_submit(c), 1);

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(child(c, seq));
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "the child's use of the parent's client was not refused (check %d)",
		      WIFEXITED(status) ? WEXITSTATUS(status) : -1);

	/* The parent's NOP completes here, and only the parent's tokens are in its sequence. */
	ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
	ck_assert_uint_eq(cqe.user_data, 42);
	ck_assert_int_eq(cqe.res, 0);
	ck_assert_int_eq(kvt_append(c, seq, row, sizeof(row), 1, NULL), 2);
	ck_assert_int_eq(kvt_seq_stat(c, seq, &st), 0);
	ck_assert_uint_eq(st.n_tokens, 2);
	ck_assert_int_eq(kvt_seq_close(c, seq), 0);
	kvt_disconnect(c);
}
END_TEST

static void
up(void)
{
	daemon_start(&Dm, NULL);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

KVT_CHECK_MAIN("client_fork", 60, up, down, t_child_refused_parent_untouched)
