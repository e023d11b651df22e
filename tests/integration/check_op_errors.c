/* SPDX-License-Identifier: MIT */
/*
 * A refused op says why. Each case below is one SQE kvtierd must refuse; for each, the negative
 * errno and a message naming the op and what was wrong reach the client three ways: libkvtier's
 * kvt_op_error() by user_data (and kvt_last_error() for the blocking wrappers), a raw client
 * reading struct kvt_op_err from the shared region by hand (proto/ only), and the daemon's debug
 * log, one line per refusal with the session, the op and the reason. A raw client scribbling
 * over its error record changes nothing for the daemon: it never reads the record back.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
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
#include "kvt_ctl.h"
#include "kvt_ring.h"
#include "kvtier.h"
#include "kvt_test.h"

enum { L = 2, H = 1, D = 64 };

static struct kvtd_proc Dm;

static void
params_pool_only(struct kvt_seq_params *p)
{
	memset(p, 0, sizeof(*p));
	p->size = sizeof(*p);
	p->layers = L;
	p->kv_heads = H;
	p->head_dim = D;
	p->dtype = KVT_DTYPE_F32;
	p->policy = KVT_POLICY_FULL;
	p->delta = 16;
}

/*
 * One refusal: prep() fills a zeroed SQE (user_data aside) for the open, empty, pool-only
 * sequence @seq (no staging region, no retrieval) and may write a payload at the arena's start.
 */
struct refusal {
	const char *what;
	void (*prep)(struct kvt_sqe *e, uint32_t seq, uint8_t *arena);
	int res;
	const char *op;	    /* the message starts "OP: " */
	const char *reason; /* and contains this */
};

static void
p_fetch_no_stage(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_FETCH;
	e->seq = seq;
	e->op_flags = KVT_FETCH_F_T1;
	e->arena_len = 64;
	e->nlayers = 1;
}

/* F_ROWS names a row per position after the positions: 8 bytes each, not 4. */
static void
p_fetch_rows_short(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	memset(arena, 0, 8);
	e->opcode = KVT_OP_FETCH;
	e->seq = seq;
	e->op_flags = KVT_FETCH_F_LIST | KVT_FETCH_F_ROWS;
	e->npos = 2;
	e->arena_len = 8;
	e->nlayers = 1;
	e->buf_id = 1;
}

static void
p_topk_no_retrieval(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	memset(arena, 0, H * D * 4);
	e->opcode = KVT_OP_TOPK;
	e->seq = seq;
	e->arena_len = H * D * 4;
	e->k = 1;
	e->out_off = 4096;
	e->out_len = 64;
}

static void
p_append_len(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_APPEND;
	e->seq = seq;
	e->ntok = 1;
	e->arena_len = 4; /* a token is L * 2 * H * D * 4 bytes */
}

static void
p_unknown_opcode(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = 200;
}

static void
p_nop_buf_id(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_NOP;
	e->buf_id = 3;
}

static void
p_close_arena(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_SEQ_CLOSE;
	e->seq = seq;
	e->arena_len = 8;
}

static void
p_append_flags(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	p_append_len(e, seq, arena);
	e->op_flags = 0x80;
}

static void
p_stat_not_open(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_SEQ_STAT;
	e->seq = seq + 1;
	e->arena_len = sizeof(struct kvt_seq_stat);
}

static void
p_score_seq_range(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_SCORE_ADD;
	e->seq = 100000;
	e->npos = 1;
	e->arena_len = 4;
}

static void
p_nop_seq(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_NOP;
	e->seq = seq;
}

static void
p_sqe_flags(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_NOP;
	e->flags = 1;
}

static void
p_open_layers(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	struct kvt_seq_params p;

	params_pool_only(&p);
	p.layers = 0;
	memcpy(arena, &p, sizeof(p));
	e->opcode = KVT_OP_SEQ_OPEN;
	e->arena_len = sizeof(p);
}

static void
p_open_short(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_SEQ_OPEN;
	e->arena_len = 16;
}

static void
p_open_stage_buf(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	struct kvt_seq_params p;

	params_pool_only(&p);
	p.stage_buf_id = 77;
	p.stage_slots = 4;
	memcpy(arena, &p, sizeof(p));
	e->opcode = KVT_OP_SEQ_OPEN;
	e->arena_len = sizeof(p);
}

static void
p_score_past_n(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	memset(arena, 0, 4);
	e->opcode = KVT_OP_SCORE_ADD;
	e->seq = seq;
	e->first_pos = 5;
	e->npos = 1;
	e->arena_len = 4;
}

static void
p_retier_small(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_RETIER;
	e->seq = seq;
	e->arena_len = 8;
}

static void
p_arena_outside(struct kvt_sqe *e, uint32_t seq, uint8_t *arena)
{
	e->opcode = KVT_OP_SEQ_STAT;
	e->seq = seq;
	e->arena_off = 1ull << 50;
	e->arena_len = sizeof(struct kvt_seq_stat);
}

static const struct refusal Cases[] = {
    {"FETCH without a staging region", p_fetch_no_stage, -EINVAL, "FETCH", "no staging region"},
    {"FETCH F_ROWS without the rows", p_fetch_rows_short, -EINVAL, "FETCH",
     "x 8 bytes with F_ROWS"},
    {"TOPK without retrieval", p_topk_no_retrieval, -EINVAL, "TOPK", "no retrieval"},
    {"APPEND of the wrong length", p_append_len, -EINVAL, "APPEND", "arena_len 4 must be ntok"},
    {"an unknown opcode", p_unknown_opcode, -EINVAL, "OPCODE 200", "unknown opcode 200"},
    {"NOP with buf_id", p_nop_buf_id, -EINVAL, "NOP", "field buf_id"},
    {"SEQ_CLOSE with arena_len", p_close_arena, -EINVAL, "SEQ_CLOSE", "field arena_len"},
    {"APPEND with unknown op_flags", p_append_flags, -EINVAL, "APPEND", "op_flags 0x80"},
    {"SEQ_STAT of a sequence not open", p_stat_not_open, -ENOENT, "SEQ_STAT", "is not open"},
    {"SCORE_ADD seq out of range", p_score_seq_range, -EINVAL, "SCORE_ADD", "out of range"},
    {"NOP naming a sequence", p_nop_seq, -EINVAL, "NOP", "must be 0"},
    {"SQE flags", p_sqe_flags, -EINVAL, "NOP", "SQE flags 0x1"},
    {"SEQ_OPEN with layers 0", p_open_layers, -EINVAL, "SEQ_OPEN", "layers out of range"},
    {"SEQ_OPEN short payload", p_open_short, -EINVAL, "SEQ_OPEN", "shorter than struct"},
    {"SEQ_OPEN unregistered staging buffer", p_open_stage_buf, -ENOENT, "SEQ_OPEN",
     "buffer 77 is not registered"},
    {"SCORE_ADD past n", p_score_past_n, -EINVAL, "SCORE_ADD", "pass the sequence's 0 tokens"},
    {"RETIER output too small", p_retier_small, -ENOSPC, "RETIER", "the output needs"},
    {"SEQ_STAT payload outside the arena", p_arena_outside, -EINVAL, "SEQ_STAT", "inside the"},
};
#define NCASES (sizeof(Cases) / sizeof(Cases[0]))

static void
check_msg(const struct refusal *c, const char *msg)
{
	size_t n = strlen(c->op);

	ck_assert_msg(!strncmp(msg, c->op, n) && msg[n] == ':' && msg[n + 1] == ' ',
		      "%s: message \"%s\" does not start with \"%s: \"", c->what, msg, c->op);
	ck_assert_msg(strstr(msg, c->reason), "%s: message \"%s\" does not say \"%s\"", c->what,
		      msg, c->reason);
}

/* The debug log has a line for this refusal: session, op, user_data and the reason. */
static void
check_log(const struct refusal *c, uint32_t session, uint64_t ud)
{
	char want_s[48], want_ud[48], want_op[48], *line = NULL;
	size_t cap = 0;
	int found = 0;
	FILE *f;

	snprintf(want_s, sizeof(want_s), "session %u (", session);
	snprintf(want_ud, sizeof(want_ud), "user_data %#llx)", (unsigned long long)ud);
	snprintf(want_op, sizeof(want_op), ": %s refused", c->op);
	/* The daemon writes the line before it posts the CQE, with an unbuffered stderr. */
	f = fopen(Dm.log, "r");
	ck_assert_ptr_nonnull(f);
	while (getline(&line, &cap, f) > 0)
		if (strstr(line, want_s) && strstr(line, want_ud)) {
			ck_assert_msg(strstr(line, want_op) && strstr(line, c->reason),
				      "%s: log line \"%s\" lacks the op or the reason", c->what,
				      line);
			found++;
		}
	free(line);
	fclose(f);
	ck_assert_msg(found == 1, "%s: %d log lines for session %u user_data %#llx", c->what, found,
		      session, (unsigned long long)ud);
}

static uint32_t
open_pool_only(struct kvt_client *c)
{
	struct kvt_seq_params p;
	uint32_t seq;

	params_pool_only(&p);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);
	return seq;
}

/* Every case through libkvtier's async path: the CQE's res, then kvt_op_error(). */
START_TEST(t_async_op_error)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_client *c;
	struct kvt_cqe cqe;
	uint64_t arena_size;
	uint8_t *arena;
	char msg[KVT_OP_ERR_MSG_LEN];
	uint32_t seq;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	arena = kvt_arena(c, &arena_size);
	seq = open_pool_only(c);
	for (unsigned i = 0; i < NCASES; i++) {
		struct kvt_sqe *e = kvt_get_sqe(c);
		uint64_t ud = 0x5150000 + i;

		ck_assert_ptr_nonnull(e);
		Cases[i].prep(e, seq, arena);
		e->user_data = ud;
		ck_assert_int_eq(kvt_submit(c), 1);
		ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
		ck_assert_uint_eq(cqe.user_data, ud);
		ck_assert_msg(cqe.res == Cases[i].res, "%s: res %d, expected %d", Cases[i].what,
			      cqe.res, Cases[i].res);
		memset(msg, 0x7f, sizeof(msg));
		ck_assert_int_eq(kvt_op_error(c, ud, msg, sizeof(msg)), 0);
		check_msg(&Cases[i], msg);
		check_log(&Cases[i], kvt_session_id(c), ud);
		/* Another op's user_data is not this record's. */
		ck_assert_int_eq(kvt_op_error(c, ud + 1, msg, sizeof(msg)), -ENOENT);
	}
	/* The sequence is untouched by all that: still open and empty. */
	{
		struct kvt_seq_stat st;

		ck_assert_int_eq(kvt_seq_stat(c, seq, &st), 0);
		ck_assert_uint_eq(st.n_tokens, 0);
	}
	/* Two refusals in one batch: only the later one's reason is kept. */
	for (int j = 0; j < 2; j++) {
		struct kvt_sqe *e = kvt_get_sqe(c);

		p_nop_buf_id(e, seq, arena);
		e->user_data = 0xb000 + j;
	}
	ck_assert_int_eq(kvt_submit(c), 2);
	ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
	ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
	ck_assert_int_eq(kvt_op_error(c, 0xb000, msg, sizeof(msg)), -ENOENT);
	ck_assert_int_eq(kvt_op_error(c, 0xb001, msg, sizeof(msg)), 0);
	/* A short buffer gets a cut, terminated message. */
	ck_assert_int_eq(kvt_op_error(c, 0xb001, msg, 5), 0);
	ck_assert_str_eq(msg, "NOP:");
	ck_assert_int_eq(kvt_op_error(c, 0xb001, msg, 0), -EINVAL);
	kvt_disconnect(c);
}
END_TEST

/* The blocking wrappers put the reason into kvt_last_error(). */
START_TEST(t_blocking_last_error)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_seq_params p;
	struct kvt_client *c;
	struct kvt_seq_stat st;
	float row[L * 2 * H * D] = {0}, neg = -1.0f, q[H * D] = {0};
	uint8_t out[256];
	uint32_t seq, pos[4];

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	seq = open_pool_only(c);

	ck_assert_int_eq(kvt_fetch(c, seq, KVT_FETCH_F_T1, 0, 1, 0, pos, 4), -EINVAL);
	ck_assert_str_eq(kvt_last_error(), "FETCH: sequence 1 has no staging region (open the "
					   "sequence with stage_buf_id)");

	ck_assert_int_eq(kvt_append(c, seq, row, sizeof(row) - 4, 1, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "APPEND: arena_len"));

	/* A success leaves it (no work for libkvtier on the success path). */
	ck_assert_int_eq(kvt_append(c, seq, row, sizeof(row), 1, NULL), 1);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "APPEND: arena_len"));

	ck_assert_int_eq(kvt_score_add(c, seq, 0, &neg, 1), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "SCORE_ADD: value 0 is -1"));

	ck_assert_int_eq(kvt_topk(c, seq, 0, 1, 0, q, H * D, out, sizeof(out)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "TOPK: sequence 1 has no retrieval"));

	ck_assert_int_eq(kvt_retier(c, seq, out, 8), -ENOSPC);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "RETIER: the output needs"));

	params_pool_only(&p);
	p.head_dim = 0;
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), -EINVAL);
	ck_assert_str_eq(kvt_last_error(), "SEQ_OPEN: head_dim out of range");

	ck_assert_int_eq(kvt_seq_close(c, 1), 0);
	ck_assert_int_eq(kvt_seq_stat(c, 1, &st), -ENOENT);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "SEQ_STAT: seq 1 is not open"));
	ck_assert_int_eq(kvt_seq_close(c, 1), -ENOENT);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "SEQ_CLOSE: seq 1 is not open"));

	/* Refusals libkvtier makes itself say why too. */
	ck_assert_int_eq(kvt_append(c, 1, row, 1ull << 40, 1, NULL), -E2BIG);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "larger than the"));
	kvt_disconnect(c);
}
END_TEST

/* ---- a raw client, proto/ only ---------------------------------------------------------- */

struct raw {
	int sock, sq_efd;
	uint8_t *region;
	uint64_t region_size;
	struct kvt_region_hdr *h;
	struct kvt_ring_hdr *sq, *cq;
	struct kvt_sqe *sqes;
	struct kvt_cqe *cqes;
	struct kvt_op_err *err;
	uint8_t *arena;
	uint32_t session, sq_tail, cq_head;
};

static void
raw_connect(struct raw *r)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvt_ctl_hello hello = {0};
	struct kvt_ctl_welcome w;
	char cbuf[CMSG_SPACE(3 * sizeof(int))];
	struct iovec iov = {&w, sizeof(w)};
	struct msghdr m = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	int fds[3];

	memset(r, 0, sizeof(*r));
	r->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", Dm.sock);
	ck_assert_int_eq(connect(r->sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	hello.hdr.type = KVT_CTL_HELLO;
	hello.hdr.len = sizeof(hello);
	hello.hdr.id = 1;
	hello.abi_major = KVT_ABI_MAJOR;
	hello.abi_minor = KVT_ABI_MINOR;
	snprintf(hello.name, sizeof(hello.name), "raw");
	ck_assert_int_eq(send(r->sock, &hello, sizeof(hello), 0), sizeof(hello));
	ck_assert_int_eq(recvmsg(r->sock, &m, 0), sizeof(w));
	ck_assert_uint_eq(w.hdr.type, KVT_CTL_WELCOME);
	ck_assert_uint_ge(w.abi_minor, 1);
	memcpy(fds, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(fds));
	r->region_size = w.region_size;
	r->region = mmap(NULL, w.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	ck_assert(r->region != MAP_FAILED);
	close(fds[0]);
	close(fds[2]); /* CQ doorbell: this client polls the stamps */
	r->sq_efd = fds[1];
	r->session = w.session_id;
	r->h = (struct kvt_region_hdr *)r->region;
	ck_assert_uint_ge(r->h->abi_minor, 1);
	ck_assert_uint_ne(r->h->err_off, 0);
	ck_assert_uint_le(r->h->err_off + sizeof(struct kvt_op_err), r->region_size);
	ck_assert_uint_eq(r->h->err_off % 64, 0);
	r->sq = (void *)(r->region + r->h->sq_ring_off);
	r->cq = (void *)(r->region + r->h->cq_ring_off);
	r->sqes = (void *)(r->region + r->h->sq_entries_off);
	r->cqes = (void *)(r->region + r->h->cq_entries_off);
	r->err = (void *)(r->region + r->h->err_off);
	r->arena = r->region + r->h->arena_off;
	/* The record does not overlap the rings or the arena. */
	ck_assert_uint_ge(r->h->err_off,
			  r->h->cq_entries_off + r->h->cq_entries * sizeof(struct kvt_cqe));
	ck_assert_uint_le(r->h->err_off + sizeof(struct kvt_op_err), r->h->arena_off);
}

static void
raw_close(struct raw *r)
{
	munmap(r->region, r->region_size);
	close(r->sq_efd);
	close(r->sock);
}

/* Submit one SQE and wait for its CQE (a bounded number of 1 ms looks, no clock). */
static struct kvt_cqe
raw_run(struct raw *r, const struct kvt_sqe *in)
{
	struct kvt_sqe *e = &r->sqes[r->sq_tail & (r->h->sq_entries - 1)];
	struct kvt_cqe *c = &r->cqes[r->cq_head & (r->h->cq_entries - 1)], out;
	int n;

	memcpy(e, in, offsetof(struct kvt_sqe, stamp));
	e->arg3 = in->arg3;
	kvt_ring_store_stamp(&e->stamp, r->sq_tail);
	kvt_ring_store_tail(r->sq, ++r->sq_tail);
	ck_assert_int_eq(eventfd_write(r->sq_efd, 1), 0);
	for (n = 0; n < 20000 && !kvt_ring_load_stamp(&c->stamp, r->cq_head); n++)
		usleep(1000);
	ck_assert_msg(n < 20000, "no CQE");
	out = *c;
	kvt_ring_store_head(r->cq, ++r->cq_head);
	return out;
}

/* A consistent copy of the record, by the kvt_ring.h protocol. */
static struct kvt_op_err
raw_err(const struct raw *r)
{
	struct kvt_op_err x;

	for (int i = 0; i < 1000; i++) {
		uint32_t gen = kvt_op_err_read_begin(r->err);

		memcpy(&x, r->err, sizeof(x));
		if (!kvt_op_err_read_retry(r->err, gen))
			return x;
	}
	ck_abort_msg("the error record never settled");
	return x;
}

static uint32_t
raw_open(struct raw *r)
{
	struct kvt_sqe e = {0};
	struct kvt_seq_params p;
	struct kvt_cqe c;

	params_pool_only(&p);
	memcpy(r->arena, &p, sizeof(p));
	e.opcode = KVT_OP_SEQ_OPEN;
	e.arena_len = sizeof(p);
	e.user_data = 1;
	c = raw_run(r, &e);
	ck_assert_int_gt(c.res, 0);
	return (uint32_t)c.res;
}

START_TEST(t_raw_reader)
{
	struct raw r;
	uint32_t seq, last_gen = 0;

	raw_connect(&r);
	seq = raw_open(&r);
	for (unsigned i = 0; i < NCASES; i++) {
		struct kvt_sqe e = {0};
		struct kvt_op_err x;
		struct kvt_cqe c;

		Cases[i].prep(&e, seq, r.arena);
		e.user_data = 0x7a000 + i;
		c = raw_run(&r, &e);
		ck_assert_msg(c.res == Cases[i].res, "%s: res %d", Cases[i].what, c.res);
		x = raw_err(&r);
		ck_assert_uint_eq(x.user_data, e.user_data);
		ck_assert_int_eq(x.res, c.res);
		ck_assert_uint_eq(x.opcode, e.opcode);
		ck_assert_uint_eq(x.seq, e.seq);
		ck_assert_uint_eq(x.gen % 2, 0);
		ck_assert_uint_gt(x.gen, last_gen);
		last_gen = x.gen;
		ck_assert_ptr_nonnull(memchr(x.msg, '\0', sizeof(x.msg)));
		check_msg(&Cases[i], x.msg);
		check_log(&Cases[i], r.session, e.user_data);
	}
	raw_close(&r);
}
END_TEST

/* A client that scribbles over its error record (an odd gen, no NUL, huge res) harms nobody:
 * the daemon never reads it, serves on, and writes the next refusal whole. */
START_TEST(t_raw_scribble)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_client *good;
	struct kvt_sqe e = {0};
	struct kvt_op_err x;
	struct kvt_cqe c;
	struct raw r;
	uint32_t seq;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &good), 0);
	raw_connect(&r);
	seq = raw_open(&r);
	memset(r.err, 0xff, sizeof(*r.err));
	e.opcode = KVT_OP_NOP;
	e.user_data = 2;
	c = raw_run(&r, &e);
	ck_assert_int_eq(c.res, 0);
	/* A success leaves the (scribbled) record alone. */
	ck_assert_uint_eq(r.err->user_data, UINT64_MAX);
	p_fetch_no_stage(&e, seq, r.arena);
	e.user_data = 3;
	c = raw_run(&r, &e);
	ck_assert_int_eq(c.res, -EINVAL);
	x = raw_err(&r);
	ck_assert_uint_eq(x.user_data, 3);
	ck_assert_int_eq(x.res, -EINVAL);
	check_msg(&Cases[0], x.msg);
	/* Scribbling while ops run: every refusal still comes back with its own res. */
	for (int i = 0; i < 50; i++) {
		memset(r.err, i, sizeof(*r.err));
		p_nop_buf_id(&e, seq, r.arena);
		e.user_data = 100 + i;
		c = raw_run(&r, &e);
		ck_assert_int_eq(c.res, -EINVAL);
		ck_assert_uint_eq(c.user_data, 100 + i);
	}
	ck_assert(daemon_alive(&Dm));
	ck_assert_int_eq(kvt_nop(good), 0);
	ck_assert_int_eq(kvt_fetch(good, 1, KVT_FETCH_F_T1, 0, 1, 0, NULL, 0), -ENOENT);
	ck_assert_str_eq(kvt_last_error(), "FETCH: seq 1 is not open (closed, or never opened)");
	raw_close(&r);
	kvt_disconnect(good);
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

KVT_CHECK_MAIN("op_errors", 60, up, down, t_async_op_error, t_blocking_last_error, t_raw_reader,
	       t_raw_scribble)
