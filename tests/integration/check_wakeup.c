/* SPDX-License-Identifier: MIT */
/*
 * The sleep/wakeup handshake between a poller and its clients (kvt_ring.h), through a real
 * kvtierd: a lost wakeup leaves an SQE pending while its poller sleeps and nothing will wake
 * it, which through kvt_wait_cqe() is a hang. Here every completion is awaited with a deadline
 * (DEADLINE_S, orders of magnitude above a round trip even under sanitizers), so such a bug
 * fails in seconds with the user_data that was lost:
 *  - sessions joining a poller that is asleep (its thread blocked in epoll_wait, read from
 *    /proc), alone and beside an idle session, must be woken by their first submit;
 *  - submits racing the poller going to sleep: thousands of round trips, each after an idle
 *    gap drawn around the poller's spin time;
 *  - several threads, each with its own client (a struct kvt_client is used by one thread at a
 *    time, kvtier.h), on two pollers, batches of mixed ops with idle gaps: every CQE carries a
 *    user_data that is in flight and the res that op must give;
 *  - a client preempted between stamping its entries and publishing the tail (kvt_submit()
 *    does both, in that order): the poller consumes the entries by their stamps, then finds the
 *    tail behind its head on its way to sleep; that is a submit in progress, not a corrupt
 *    ring, and the session must live on (a raw client holds the tail back on purpose);
 *  - the flag itself: once the poller sleeps, every session's SQ, a newly attached one's too,
 *    has NEED_WAKEUP set (read from the shared header: a missing flag fails at once).
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_ring.h"
#include "kvtier.h"
#include "kvt_test.h"

#define DEADLINE_S 5
#define SPIN_US	   50 /* the daemon's --spin-us: idle time before its poller sleeps */

static struct kvtd_proc D;

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One completion within DEADLINE_S, or -ETIME. Peeks only: a wait that sleeps on the CQ
 * doorbell would hang on exactly the bug this looks for. */
static int
reap_deadline(struct kvt_client *c, struct kvt_cqe *ret)
{
	uint64_t end = now_ns() + DEADLINE_S * 1000000000ull;
	struct timespec nap = {0, 20000};

	for (unsigned i = 0;; i++) {
		if (kvt_peek_cqe(c, ret) == 0)
			return 0;
		if (i < 4096)
			continue; /* a round trip: spin */
		if (now_ns() > end)
			return -ETIME;
		nanosleep(&nap, NULL);
	}
}

/* Submits one NOP with @ud and reaps it within the deadline. */
static void
nop_deadline(struct kvt_client *c, uint64_t ud, const char *what)
{
	struct kvt_sqe *e = kvt_get_sqe(c);
	struct kvt_cqe cqe;

	ck_assert_ptr_nonnull(e);
	e->opcode = KVT_OP_NOP;
	e->user_data = ud;
	ck_assert_int_eq(kvt_submit(c), 1);
	ck_assert_msg(reap_deadline(c, &cqe) == 0,
		      "%s: NOP %llu not completed within %d s (a lost wakeup: the poller sleeps "
		      "with it pending; or the session was dropped: see the daemon log)",
		      what, (unsigned long long)ud, DEADLINE_S);
	ck_assert_uint_eq(cqe.user_data, ud);
	ck_assert_int_eq(cqe.res, 0);
}

static struct kvt_client *
client(const char *name)
{
	struct kvt_opts o = {.size = sizeof(o), .name = name};
	struct kvt_client *c = NULL;
	int r = kvt_connect(D.sock, &o, &c);

	ck_assert_msg(r == 0, "kvt_connect: %s (%s)", kvt_strerror(r), kvt_last_error());
	return c;
}

static int
in_epoll_wait(long nr)
{
#ifdef SYS_epoll_wait /* not on arm64, which has epoll_pwait only */
	if (nr == SYS_epoll_wait)
		return 1;
#endif
#ifdef SYS_epoll_pwait2
	if (nr == SYS_epoll_pwait2)
		return 1;
#endif
	return nr == SYS_epoll_pwait;
}

/* Is every poller thread of the daemon blocked in epoll_wait? (/proc/PID/task/TID/syscall
 * names the syscall a blocked thread is in.) */
static int
pollers_asleep(void)
{
	char path[320], buf[64], state;
	struct dirent *de;
	int found = 0, asleep = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)D.pid);
	dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while ((de = readdir(dir))) {
		FILE *f;
		long nr;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)D.pid, de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		buf[0] = '\0';
		if (!fgets(buf, sizeof(buf), f))
			buf[0] = '\0';
		fclose(f);
		if (strncmp(buf, "kvtd-poller", 11))
			continue;
		found++;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/syscall", (int)D.pid, de->d_name);
		f = fopen(path, "r");
		if (f) {
			if (fscanf(f, "%ld", &nr) != 1)
				nr = -1; /* "running" */
			fclose(f);
			asleep += in_epoll_wait(nr);
			continue;
		}
		/* where ptrace rules hide syscall: the thread's state, S(leeping) */
		snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)D.pid, de->d_name);
		f = fopen(path, "r");
		ck_assert_msg(f, "cannot read %s", path);
		ck_assert_int_eq(fscanf(f, "%*d (%63[^)]) %c", buf, &state), 2);
		fclose(f);
		asleep += state == 'S';
	}
	closedir(dir);
	ck_assert_int_gt(found, 0);
	return asleep == found;
}

/* Waits (a state, not a duration) until every poller sleeps. */
static void
wait_pollers_asleep(void)
{
	for (int i = 0; i < 5000; i++) {
		if (pollers_asleep())
			return;
		usleep(1000);
	}
	ck_abort_msg("the pollers never went to sleep with nothing to do");
}

START_TEST(t_join_sleeping_poller)
{
	unsigned still_asleep = 0;
	char name[32];

	for (int round = 0; round < 20; round++) {
		struct kvt_client *idle = round % 2 ? client("idle") : NULL, *c;

		/* a fresh session's first submit, while the poller sleeps */
		wait_pollers_asleep();
		snprintf(name, sizeof(name), "joiner-%d", round);
		c = client(name);
		still_asleep += pollers_asleep(); /* joining alone does not wake it */
		nop_deadline(c, 1000 + round,
			     "a session's first op after joining a sleeping poller");
		/* and after the poller went back to sleep, both sessions again */
		wait_pollers_asleep();
		nop_deadline(c, 2000 + round, "a joined session's op on a sleeping poller");
		if (idle) {
			wait_pollers_asleep();
			nop_deadline(idle, 3000 + round, "an older session's op after a join");
			kvt_disconnect(idle);
		}
		kvt_disconnect(c);
	}
	fprintf(stderr, "joins: %u of 20 found the poller still asleep at the first submit\n",
		still_asleep);
}
END_TEST

START_TEST(t_submit_races_sleep)
{
	struct kvt_client *c = client("racer");
	uint64_t s = 0x5eed, slept = 0;

	for (uint64_t i = 0; i < 20000; i++) {
		/* an idle gap of 0-3x the spin time, busy (a sleep's own slack is larger than
		 * the spin time): the submit lands before, during and after the poller's
		 * decision to sleep */
		uint64_t gap = kvt_test_xorshift(&s) % (3 * SPIN_US * 1000), t0 = now_ns();

		while (now_ns() - t0 < gap)
			;
		nop_deadline(c, i, "a submit racing the poller going to sleep");
		slept += gap > SPIN_US * 1000;
	}
	/* the gaps did straddle the threshold */
	ck_assert_uint_gt(slept, 1000);
	kvt_disconnect(c);
}
END_TEST

/* ---- a tail published after the poller took the stamped entries ------------------------- */

struct raw {
	int sock, sq_efd;
	uint8_t *region;
	uint64_t size;
	struct kvt_ring_hdr *sq, *cq;
	struct kvt_sqe *sqes;
	struct kvt_cqe *cqes;
	uint32_t sq_entries, cq_entries;
};

static void
raw_connect(struct raw *r)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvt_ctl_hello h = {.hdr = {.type = KVT_CTL_HELLO, .len = sizeof(h), .id = 1}};
	struct kvt_ctl_welcome w;
	union {
		char b[CMSG_SPACE(3 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {&w, sizeof(w)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b)};
	const struct kvt_region_hdr *reg;
	int fds[3];

	r->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", D.sock);
	ck_assert_int_eq(connect(r->sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	h.abi_major = KVT_ABI_MAJOR;
	h.abi_minor = KVT_ABI_MINOR;
	h.sq_entries = 8;
	h.features = KVT_FEAT_ALL;
	ck_assert_int_eq(send(r->sock, &h, sizeof(h), 0), sizeof(h));
	ck_assert_int_eq(recvmsg(r->sock, &mh, MSG_CMSG_CLOEXEC), sizeof(w));
	ck_assert_uint_eq(w.hdr.type, KVT_CTL_WELCOME);
	memcpy(fds, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof(fds));
	r->size = w.region_size;
	r->region = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	ck_assert(r->region != MAP_FAILED);
	close(fds[0]);
	close(fds[2]);
	r->sq_efd = fds[1];
	reg = (const void *)r->region;
	r->sq = (void *)(r->region + reg->sq_ring_off);
	r->cq = (void *)(r->region + reg->cq_ring_off);
	r->sqes = (void *)(r->region + reg->sq_entries_off);
	r->cqes = (void *)(r->region + reg->cq_entries_off);
	r->sq_entries = reg->sq_entries;
	r->cq_entries = reg->cq_entries;
}

/* The CQE of index @i within the deadline, reaped; its user_data. */
static uint64_t
raw_reap(struct raw *r, uint32_t i)
{
	const struct kvt_cqe *e = &r->cqes[i & (r->cq_entries - 1)];
	uint64_t end = now_ns() + DEADLINE_S * 1000000000ull, ud;

	while (!kvt_ring_load_stamp(&e->stamp, i)) {
		ck_assert_msg(now_ns() < end, "CQE %u not posted within %d s", i, DEADLINE_S);
		usleep(100);
	}
	ud = e->user_data;
	kvt_ring_store_head(r->cq, i + 1);
	return ud;
}

/* The daemon has not given up on the session: no ERROR and no hangup on its socket. */
static void
raw_alive(struct raw *r)
{
	struct pollfd pfd = {.fd = r->sock, .events = POLLIN | POLLRDHUP};
	struct kvt_ctl_error e = {0};

	if (poll(&pfd, 1, 0) == 1) {
		ssize_t n = recv(r->sock, &e, sizeof(e), MSG_DONTWAIT);

		ck_abort_msg("the daemon dropped the session (%zd bytes: \"%.*s\")", n,
			     (int)sizeof(e.msg), n == (ssize_t)sizeof(e) ? e.msg : "");
	}
}

START_TEST(t_tail_after_stamps)
{
	struct raw r;
	uint64_t one = 1;

	for (uint32_t i = 0; i < 10; i++) {
		struct kvt_sqe *e;

		if (i == 0)
			raw_connect(&r);
		e = &r.sqes[i & (r.sq_entries - 1)];
		memset(e, 0, offsetof(struct kvt_sqe, stamp));
		e->opcode = KVT_OP_NOP;
		e->user_data = 500 + i;
		/* kvt_submit()'s first half: the stamp; then the doorbell, whatever the flags say,
		 * so that the poller is up and takes the entry by its stamp */
		kvt_ring_store_stamp(&e->stamp, i);
		ck_assert_int_eq(write(r.sq_efd, &one, 8), 8);
		ck_assert_uint_eq(raw_reap(&r, i), 500 + i);
		/* the poller goes idle, then to sleep, re-checking the tail on its way */
		wait_pollers_asleep();
		raw_alive(&r);
		/* kvt_submit()'s second half, late */
		kvt_ring_store_tail(r.sq, i + 1);
		kvt_ring_fence();
	}
	/* and an ordinary submit after all that */
	r.sqes[10 & (r.sq_entries - 1)].opcode = KVT_OP_NOP;
	r.sqes[10 & (r.sq_entries - 1)].user_data = 999;
	kvt_ring_store_stamp(&r.sqes[10 & (r.sq_entries - 1)].stamp, 10);
	kvt_ring_store_tail(r.sq, 11);
	kvt_ring_fence();
	if (kvt_ring_needs_wakeup(r.sq))
		ck_assert_int_eq(write(r.sq_efd, &one, 8), 8);
	ck_assert_uint_eq(raw_reap(&r, 10), 999);
	raw_alive(&r);
	munmap(r.region, r.size);
	close(r.sq_efd);
	close(r.sock);
}
END_TEST

/* ---- the flag itself: a sleeping poller has set NEED_WAKEUP on every session ---------- */

/* Fails at once, naming the session, if a poller blocked in epoll_wait left a session's SQ
 * without KVT_RING_NEED_WAKEUP: that session's next submit would not ring, and only a test
 * timeout would tell. @r: the raw sessions, @n of them. */
static void
assert_need_wakeup(struct raw *r, unsigned n, const char *when)
{
	wait_pollers_asleep(); /* bounded: aborts with its own message after 5 s */
	for (unsigned i = 0; i < n; i++)
		ck_assert_msg(kvt_ring_needs_wakeup(r[i].sq),
			      "%s: the poller sleeps but session %u of %u has no "
			      "KVT_RING_NEED_WAKEUP on its SQ (its next submit would not ring the "
			      "doorbell: a lost wakeup)",
			      when, i + 1, n);
}

#define JOINERS 6

/* Sessions join a sleeping poller, and a poller just woken (attached while it runs): once it
 * sleeps, each has NEED_WAKEUP set, read from the shared ring header itself. A poller that
 * never sets it for a newly attached session fails here in milliseconds, not through a hang
 * in kvt_wait_cqe(). */
START_TEST(t_need_wakeup_on_attach)
{
	struct raw r[JOINERS];
	uint64_t one = 1;
	uint32_t n0 = 0; /* entries session 1 submitted */

	for (unsigned i = 0; i < JOINERS; i++) {
		if (i % 2)
			wait_pollers_asleep(); /* joins a sleeping poller */
		else if (i) {
			/* wake it, then join while it handles the NOP or spins */
			struct kvt_sqe *e = &r[0].sqes[n0 & (r[0].sq_entries - 1)];

			memset(e, 0, offsetof(struct kvt_sqe, stamp));
			e->opcode = KVT_OP_NOP;
			e->user_data = 700 + i;
			kvt_ring_store_stamp(&e->stamp, n0);
			kvt_ring_store_tail(r[0].sq, ++n0);
			kvt_ring_fence();
			ck_assert_int_eq(write(r[0].sq_efd, &one, 8), 8);
		}
		raw_connect(&r[i]);
		if (i && !(i % 2))
			ck_assert_uint_eq(raw_reap(&r[0], n0 - 1), 700 + i);
		assert_need_wakeup(r, i + 1, i % 2 ? "joined asleep" : "joined awake");
	}
	/* and each one's first submit, trusting the flag as kvt_submit() does, completes */
	for (unsigned i = 1; i < JOINERS; i++) {
		struct kvt_sqe *e = &r[i].sqes[0];

		memset(e, 0, offsetof(struct kvt_sqe, stamp));
		e->opcode = KVT_OP_NOP;
		e->user_data = 800 + i;
		kvt_ring_store_stamp(&e->stamp, 0);
		kvt_ring_store_tail(r[i].sq, 1);
		kvt_ring_fence();
		if (kvt_ring_needs_wakeup(r[i].sq))
			ck_assert_int_eq(write(r[i].sq_efd, &one, 8), 8);
		ck_assert_uint_eq(raw_reap(&r[i], 0), 800 + i);
		assert_need_wakeup(r, JOINERS, "after a submit");
	}
	for (unsigned i = 0; i < JOINERS; i++) {
		raw_alive(&r[i]);
		munmap(r[i].region, r[i].size);
		close(r[i].sq_efd);
		close(r[i].sock);
	}
}
END_TEST

/* ---- several threads, each its own client ----------------------------------------------- */

#define THREADS 4
#define BATCHES 1500
#define SQ	32
#define CQ	64
#define SLOTS	128 /* arena payload slots per kind; > CQ: a slot is free again when reused */

enum { K_NOP, K_APPEND, K_SCORE };

struct worker {
	pthread_t t;
	unsigned id;
	char err[256]; /* the first problem seen, empty if none */
	uint64_t cqes;
};

struct inflight {
	uint8_t kind, live;
	int32_t res;	/* the res this op must give */
	uint64_t first; /* APPEND: aux[0], the first position */
};

/* One op with its payload at the arena's start, completed within the deadline (libkvtier's
 * blocking wrappers would wait forever on a lost wakeup). Returns its res or -ETIME. */
static int
op_deadline(struct kvt_client *c, uint8_t opcode, uint32_t seq, const void *in, uint32_t len)
{
	struct kvt_sqe *e = kvt_get_sqe(c);
	struct kvt_cqe cqe;

	if (!e)
		return -EBUSY;
	memcpy(kvt_arena(c, NULL), in, len);
	e->opcode = opcode;
	e->seq = seq;
	e->arena_len = len;
	e->user_data = 1ull << 63;
	if (kvt_submit(c) != 1 || reap_deadline(c, &cqe) < 0)
		return -ETIME;
	return cqe.user_data == 1ull << 63 ? cqe.res : -EPROTO;
}

#define LOSTWHY "a lost wakeup, or the session dropped: see the daemon log"
#define LOST	"no CQE within the deadline (" LOSTWHY ")"
#define FAIL(w, ...)                                                                               \
	do {                                                                                       \
		snprintf((w)->err, sizeof((w)->err), __VA_ARGS__);                                 \
		goto out;                                                                          \
	} while (0)

static void *
worker_main(void *arg)
{
	struct worker *w = arg;
	struct kvt_opts o = {
	    .size = sizeof(o), .sq_entries = SQ, .cq_entries = CQ, .name = "stress"};
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = 1,
				   .kv_heads = 1,
				   .head_dim = 8,
				   .dtype = KVT_DTYPE_F32,
				   .policy = KVT_POLICY_FULL,
				   .delta = 1024,
				   .hbm_frac = 1.0f};
	struct inflight *fl = calloc(1 << 16, sizeof(*fl));
	struct kvt_client *c = NULL;
	struct kvt_seq_stat st;
	uint64_t s = 0x9e3779b97f4a7c15ull * (w->id + 1), next = 0, ntok = 0;
	double score_sum = 0;
	uint8_t *arena;
	uint32_t seq;
	int r;

	if (!fl)
		FAIL(w, "out of memory");
	if ((r = kvt_connect(D.sock, &o, &c)) < 0)
		FAIL(w, "connect: %s", kvt_strerror(r));
	if ((r = op_deadline(c, KVT_OP_SEQ_OPEN, 0, &p, sizeof(p))) <= 0)
		FAIL(w, "SEQ_OPEN: %s", r == -ETIME ? LOST : kvt_strerror(r));
	seq = (uint32_t)r;
	arena = kvt_arena(c, NULL);
	for (int b = 0; b < BATCHES; b++) {
		unsigned want = 1 + kvt_test_xorshift(&s) % SQ, got = 0;

		for (; got < want; got++) {
			struct kvt_sqe *e = kvt_get_sqe(c);
			uint64_t ud = (uint64_t)w->id << 48 | next;
			struct inflight *f = &fl[next & 0xffff];
			float *pay;

			if (!e)
				break; /* ring or CQ full: reap first */
			if (f->live)
				FAIL(w, "user_data %llu still in flight 65536 ops later",
				     (unsigned long long)(next - 65536));
			f->live = 1;
			f->kind = kvt_test_xorshift(&s) % 3;
			e->user_data = ud;
			if (f->kind == K_NOP) {
				e->opcode = KVT_OP_NOP;
				f->res = 0;
			} else if (f->kind == K_APPEND) {
				/* one token: K and V rows of 8 f32, 64 bytes */
				e->arena_off = (next % SLOTS) * 64;
				pay = (float *)(arena + e->arena_off);
				for (int i = 0; i < 16; i++)
					pay[i] = (float)(next + i);
				e->opcode = KVT_OP_APPEND;
				e->seq = seq;
				e->count = 1;
				e->arena_len = 64;
				f->first = ntok++;
				f->res = (int32_t)ntok; /* ops of one ring run in order */
			} else {
				if (!ntok) { /* nothing to score yet */
					e->opcode = KVT_OP_NOP;
					f->kind = K_NOP;
					f->res = 0;
				} else {
					/* payload slots above the APPENDs' */
					e->arena_off = SLOTS * 64 + (next % SLOTS) * 4;
					pay = (float *)(arena + e->arena_off);
					pay[0] = (float)(next % 7);
					score_sum += pay[0];
					e->opcode = KVT_OP_SCORE_ADD;
					e->seq = seq;
					e->count = 1;
					e->arena_len = 4;
					e->arg0 = kvt_test_xorshift(&s) % ntok;
					f->res = 0;
				}
			}
			next++;
		}
		if ((r = kvt_submit(c)) != (int)got)
			FAIL(w, "submit: %d of %u", r, got);
		/* reap some now, the rest later, or all: CQEs of several batches mix */
		for (unsigned n = kvt_test_xorshift(&s) % 4 ? kvt_inflight(c) : kvt_inflight(c) / 2;
		     n; n--) {
			struct kvt_cqe cqe;
			struct inflight *f;

			if (reap_deadline(c, &cqe) < 0)
				FAIL(w, "no CQE within %d s, %u in flight (" LOSTWHY ")",
				     DEADLINE_S, kvt_inflight(c));
			w->cqes++;
			if (cqe.user_data >> 48 != w->id ||
			    (cqe.user_data & 0xffffffffffffull) >= next)
				FAIL(w, "CQE with user_data %#llx: never submitted by this client",
				     (unsigned long long)cqe.user_data);
			f = &fl[cqe.user_data & 0xffff];
			if (!f->live)
				FAIL(w, "CQE with user_data %#llx twice",
				     (unsigned long long)cqe.user_data);
			f->live = 0;
			if (cqe.res != f->res)
				FAIL(w, "op kind %u (user_data %#llx): res %d, expected %d",
				     f->kind, (unsigned long long)cqe.user_data, cqe.res, f->res);
			if (f->kind == K_APPEND && cqe.aux[0] != f->first)
				FAIL(w, "APPEND %#llx: first position %llu, expected %llu",
				     (unsigned long long)cqe.user_data,
				     (unsigned long long)cqe.aux[0], (unsigned long long)f->first);
		}
		if (kvt_test_xorshift(&s) % 8 == 0) { /* idle: the poller may go to sleep */
			struct timespec gap = {0, (long)(kvt_test_xorshift(&s) % 200000)};

			nanosleep(&gap, NULL);
		}
	}
	while (kvt_inflight(c)) {
		struct kvt_cqe cqe;

		if (reap_deadline(c, &cqe) < 0)
			FAIL(w, "no CQE within %d s at the end (" LOSTWHY ")", DEADLINE_S);
		w->cqes++;
		if (cqe.res != fl[cqe.user_data & 0xffff].res)
			FAIL(w, "res %d for %#llx", cqe.res, (unsigned long long)cqe.user_data);
		fl[cqe.user_data & 0xffff].live = 0;
	}
	memset(&st, 0, sizeof(st));
	if ((r = op_deadline(c, KVT_OP_SEQ_STAT, seq, &st, sizeof(st))) != sizeof(st))
		FAIL(w, "SEQ_STAT: %s", r == -ETIME ? LOST : kvt_strerror(r));
	memcpy(&st, kvt_arena(c, NULL), sizeof(st));
	if (st.n_tokens != ntok || st.score_total != score_sum)
		FAIL(w, "sequence has %llu tokens (want %llu), score total %g (want %g)",
		     (unsigned long long)st.n_tokens, (unsigned long long)ntok, st.score_total,
		     score_sum);
out:
	kvt_disconnect(c);
	free(fl);
	return NULL;
}

START_TEST(t_threads_stress)
{
	struct worker w[THREADS] = {0};
	uint64_t total = 0;

	for (unsigned i = 0; i < THREADS; i++) {
		w[i].id = i + 1;
		ck_assert_int_eq(pthread_create(&w[i].t, NULL, worker_main, &w[i]), 0);
	}
	for (unsigned i = 0; i < THREADS; i++) {
		ck_assert_int_eq(pthread_join(w[i].t, NULL), 0);
		ck_assert_msg(!w[i].err[0], "thread %u: %s", i, w[i].err);
		total += w[i].cqes;
	}
	fprintf(stderr, "ring stress: %u threads, %llu CQEs checked\n", THREADS,
		(unsigned long long)total);
	ck_assert_uint_gt(total, THREADS * BATCHES);
}
END_TEST

static void
up(void)
{
	static const char *const extra[] = {"--pollers", "2", "--spin-us", "50", NULL};

	daemon_start(&D, extra);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

static void
up_one(void)
{
	static const char *const extra[] = {"--pollers", "1", "--spin-us", "50", NULL};

	daemon_start(&D, extra);
}

int
main(void)
{
	Suite *s = suite_create("wakeup");
	TCase *tc = tcase_create("one_poller");

	tcase_add_checked_fixture(tc, up_one, down);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, t_join_sleeping_poller);
	tcase_add_test(tc, t_submit_races_sleep);
	tcase_add_test(tc, t_tail_after_stamps);
	tcase_add_test(tc, t_need_wakeup_on_attach);
	suite_add_tcase(s, tc);
	tc = tcase_create("threads");
	tcase_add_checked_fixture(tc, up, down);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, t_threads_stress);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
