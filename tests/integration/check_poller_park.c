/* SPDX-License-Identifier: MIT */
/*
 * Integration: sessions that cannot make progress must not cost the poller CPU. A raw client
 * (proto/ only, writing the shared region itself) publishes a tail without stamping the entry,
 * or never reaps its CQ; the poller thread's CPU ticks (utime + stime from
 * /proc/PID/task/TID/stat) over a few seconds must stay a small part of the elapsed ticks, the
 * unstamped session is dropped with -EPROTO, and libkvtier clients beside them keep working.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_ring.h"
#include "kvtier.h"
#include "kvt_test.h"

static struct kvtd_proc D;

/* A session driven by hand through the shared region. */
struct raw {
	int sock, sq_efd, cq_efd;
	uint8_t *region;
	uint64_t region_size;
	struct kvt_ring_hdr *sq, *cq;
	struct kvt_sqe *sqes;
	struct kvt_cqe *cqes;
	uint32_t sq_entries, cq_entries;
	uint32_t sq_tail, cq_head;
};

static void
raw_connect(struct raw *r, uint32_t sq_entries, uint32_t cq_entries)
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
	struct timeval tv = {60, 0};
	struct kvt_region_hdr *reg;
	int fds[3];

	memset(r, 0, sizeof(*r));
	r->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(r->sock, 0);
	/* A deadline for a daemon that never answers, so the test fails instead of hanging. */
	setsockopt(r->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", D.sock);
	ck_assert_int_eq(connect(r->sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	h.hdr.type = KVT_CTL_HELLO;
	h.hdr.len = sizeof(h);
	h.abi_major = KVT_ABI_MAJOR;
	h.abi_minor = KVT_ABI_MINOR;
	h.sq_entries = sq_entries;
	h.cq_entries = cq_entries;
	h.features = KVT_FEAT_ALL;
	snprintf(h.name, sizeof(h.name), "raw");
	ck_assert_int_eq(send(r->sock, &h, sizeof(h), 0), sizeof(h));
	ck_assert_int_gt(recvmsg(r->sock, &m, 0), 0);
	ck_assert_uint_eq(rep.w.hdr.type, KVT_CTL_WELCOME);
	memcpy(fds, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(fds));
	r->region_size = rep.w.region_size;
	r->region = mmap(NULL, r->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	ck_assert(r->region != MAP_FAILED);
	close(fds[0]);
	r->sq_efd = fds[1];
	r->cq_efd = fds[2];
	reg = (struct kvt_region_hdr *)r->region;
	r->sq = (struct kvt_ring_hdr *)(r->region + reg->sq_ring_off);
	r->cq = (struct kvt_ring_hdr *)(r->region + reg->cq_ring_off);
	r->sqes = (struct kvt_sqe *)(r->region + reg->sq_entries_off);
	r->cqes = (struct kvt_cqe *)(r->region + reg->cq_entries_off);
	r->sq_entries = reg->sq_entries;
	r->cq_entries = reg->cq_entries;
	ck_assert_uint_eq(r->sq_entries, sq_entries);
	ck_assert_uint_eq(r->cq_entries, cq_entries);
}

static void
raw_close(struct raw *r)
{
	munmap(r->region, r->region_size);
	close(r->sq_efd);
	close(r->cq_efd);
	close(r->sock);
}

/* Fill a NOP at the tail; @stamp 0 leaves the entry unstamped (the protocol violation). */
static void
raw_queue_nop(struct raw *r, uint64_t user_data, int stamp)
{
	struct kvt_sqe *e = &r->sqes[r->sq_tail & (r->sq_entries - 1)];

	memset(e, 0, offsetof(struct kvt_sqe, stamp));
	e->opcode = KVT_OP_NOP;
	e->user_data = user_data;
	if (stamp)
		kvt_ring_store_stamp(&e->stamp, r->sq_tail);
	r->sq_tail++;
}

/* Publish the tail as libkvtier does: store, fence, ring the doorbell if the poller sleeps. */
static void
raw_publish(struct raw *r)
{
	kvt_ring_store_tail(r->sq, r->sq_tail);
	kvt_ring_fence();
	if (kvt_ring_needs_wakeup(r->sq))
		ck_assert_int_eq(eventfd_write(r->sq_efd, 1), 0);
}

/* Wait (bounded, so a lost completion fails the test) for the CQE at @index. */
static struct kvt_cqe *
raw_wait_cqe(struct raw *r, uint32_t index)
{
	struct kvt_cqe *e = &r->cqes[index & (r->cq_entries - 1)];

	for (int i = 0; i < 20000; i++) {
		if (kvt_ring_load_stamp(&e->stamp, index))
			return e;
		usleep(1000);
	}
	ck_abort_msg("CQE %u never came", index);
	return NULL;
}

/* The TID of kvtierd's (only) poller thread. */
static pid_t
poller_tid(pid_t pid)
{
	char path[320], comm[32];
	struct dirent *de;
	pid_t tid = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while ((de = readdir(dir))) {
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, de->d_name);
		f = fopen(path, "re");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) && !strncmp(comm, "kvtd-poller", 11)) {
			ck_assert_msg(!tid, "more than one poller thread");
			tid = (pid_t)atoi(de->d_name);
		}
		fclose(f);
	}
	closedir(dir);
	ck_assert_msg(tid, "no kvtd-poller thread in kvtierd %d", (int)pid);
	return tid;
}

/* utime + stime of one thread, in clock ticks (proc(5), fields 14 and 15). */
static unsigned long long
thread_ticks(pid_t pid, pid_t tid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut = 0, st = 0;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, (int)tid);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The name may hold spaces and parentheses: fields restart after the last ')'. */
	p = strrchr(buf, ')');
	ck_assert_ptr_nonnull(p);
	/* state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime */
	n = (size_t)sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
			   &st);
	ck_assert_uint_eq(n, 2);
	return ut + st;
}

static double
mono_ticks(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((double)ts.tv_sec + ts.tv_nsec / 1e9) * (double)sysconf(_SC_CLK_TCK);
}

/* Nanoseconds one thread ran and waited runnable on a run queue (/proc/.../schedstat). */
static unsigned long long
thread_runnable_ns(pid_t pid, pid_t tid)
{
	char path[64];
	unsigned long long run = 0, wait = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)pid, (int)tid);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fscanf(f, "%llu %llu", &run, &wait), 2);
	fclose(f);
	return run + wait;
}

/*
 * Over about 1.5 s, the poller's CPU time (utime + stime) and the time it wanted a CPU
 * (running or runnable), each in percent of the elapsed time. A spinning poller wants a CPU all
 * the time, so the second is ~100 however loaded the host is (the first can drop below the
 * bound when other processes crowd the cores); a parked one shows ~0 on both.
 */
static void
poller_load(double *ret_cpu_pct, double *ret_runnable_pct)
{
	pid_t tid = poller_tid(D.pid);
	unsigned long long c0 = thread_ticks(D.pid, tid), c1;
	unsigned long long r0 = thread_runnable_ns(D.pid, tid), r1;
	double t0 = mono_ticks(), t1;

	usleep(1500 * 1000);
	c1 = thread_ticks(D.pid, tid);
	r1 = thread_runnable_ns(D.pid, tid);
	t1 = mono_ticks();
	*ret_cpu_pct = 100.0 * (double)(c1 - c0) / (t1 - t0);
	*ret_runnable_pct =
	    100.0 * ((double)(r1 - r0) / 1e9) * (double)sysconf(_SC_CLK_TCK) / (t1 - t0);
}

/* Both loads under a generous bound: 30% of one core. */
static void
assert_poller_parked(const char *beside)
{
	double cpu, runnable;

	poller_load(&cpu, &runnable);
	ck_assert_msg(cpu < 30.0 && runnable < 30.0,
		      "poller used %.0f%% of a core (runnable %.0f%%) beside %s", cpu, runnable,
		      beside);
}

static struct kvt_client *
connect_ok(const char *name)
{
	struct kvt_opts o = {.size = sizeof(o), .name = name};
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

/* No spin after work: the poller goes to sleep after every op, so each op races the sleep. */
static void
start_nospin(void)
{
	const char *extra[] = {"--spin-us", "0", NULL};

	daemon_start(&D, extra);
}

static void
stop_default(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

/* A tail published over an entry that never gets its stamp. */
START_TEST(t_unstamped_tail)
{
	struct kvt_client *good = connect_ok("good");
	struct kvt_ctl_error err;
	struct raw r;

	raw_connect(&r, 8, 16);
	raw_queue_nop(&r, 42, 0);
	raw_publish(&r);
	/* The doorbell is rung whatever the flag says: the poller must look and park again. */
	ck_assert_int_eq(eventfd_write(r.sq_efd, 1), 0);
	usleep(100 * 1000);
	assert_poller_parked("an unstamped entry");
	/* Other sessions are served meanwhile, through the sleeping poller's doorbell. */
	for (int i = 0; i < 100; i++)
		ck_assert_int_eq(kvt_nop(good), 0);
	/* The entry stays unstamped: the session is dropped with a reason. */
	ck_assert_int_eq(recv(r.sock, &err, sizeof(err), 0), sizeof(err));
	ck_assert_uint_eq(err.hdr.type, KVT_CTL_ERROR);
	ck_assert_int_eq(err.err, -EPROTO);
	ck_assert_msg(strstr(err.msg, "stamp"), "reason: %s", err.msg);
	ck_assert_int_eq(recv(r.sock, &err, sizeof(err), 0), 0);
	ck_assert_int_eq(kvt_nop(good), 0);
	ck_assert(daemon_alive(&D));
	raw_close(&r);
	kvt_disconnect(good);
}
END_TEST

/* An entry stamped late (before the timeout) is served, not dropped. */
START_TEST(t_late_stamp)
{
	struct raw r;
	struct kvt_cqe *e;

	raw_connect(&r, 8, 16);
	raw_queue_nop(&r, 7, 0);
	raw_publish(&r);
	ck_assert_int_eq(eventfd_write(r.sq_efd, 1), 0);
	usleep(200 * 1000);
	kvt_ring_store_stamp(&r.sqes[0].stamp, 0);
	kvt_ring_fence();
	if (kvt_ring_needs_wakeup(r.sq))
		ck_assert_int_eq(eventfd_write(r.sq_efd, 1), 0);
	e = raw_wait_cqe(&r, 0);
	ck_assert_int_eq(e->res, 0);
	ck_assert_uint_eq(e->user_data, 7);
	raw_close(&r);
}
END_TEST

/* SQEs queued behind a CQ the client never reaps. */
START_TEST(t_cq_never_reaped)
{
	struct kvt_client *good = connect_ok("good");
	struct raw r;

	raw_connect(&r, 8, 8);
	for (uint32_t i = 0; i < 8; i++)
		raw_queue_nop(&r, 100 + i, 1);
	raw_publish(&r);
	raw_wait_cqe(&r, 7); /* the CQ is full now */
	for (uint32_t i = 8; i < 16; i++)
		raw_queue_nop(&r, 100 + i, 1);
	raw_publish(&r);
	ck_assert_int_eq(eventfd_write(r.sq_efd, 1), 0);
	usleep(100 * 1000);
	assert_poller_parked("a full CQ");
	for (int i = 0; i < 100; i++)
		ck_assert_int_eq(kvt_nop(good), 0);
	/* Parked and asleep (once the poller has finished with the NOPs above): the flag tells
	 * the client to ring after it makes room. */
	for (int i = 0; i < 5000 && !kvt_ring_needs_wakeup(r.sq); i++)
		usleep(1000);
	ck_assert(kvt_ring_needs_wakeup(r.sq));
	for (uint32_t i = 0; i < 8; i++) {
		struct kvt_cqe *e = raw_wait_cqe(&r, i);

		ck_assert_int_eq(e->res, 0);
		ck_assert_uint_eq(e->user_data, 100 + i);
	}
	r.cq_head = 8;
	kvt_ring_store_head(r.cq, r.cq_head);
	kvt_ring_fence();
	if (kvt_ring_needs_wakeup(r.sq))
		ck_assert_int_eq(eventfd_write(r.sq_efd, 1), 0);
	for (uint32_t i = 8; i < 16; i++) {
		struct kvt_cqe *e = raw_wait_cqe(&r, i);

		ck_assert_int_eq(e->res, 0);
		ck_assert_uint_eq(e->user_data, 100 + i);
	}
	ck_assert_int_eq(kvt_nop(good), 0);
	raw_close(&r);
	kvt_disconnect(good);
}
END_TEST

/*
 * Lost wakeups: beside a parked session (a full CQ), a client whose ops race the poller going
 * to sleep (it spins for its completions, then submits after a random 0-4 us) completes 50,000
 * round trips; a forked child does them, so a lost wakeup (an op nobody wakes the poller for)
 * fails the test at its deadline instead of hanging it. An unstamped session was there before
 * and has been dropped: while it waits for its deadline the poller wakes on a timer, which
 * would turn a lost wakeup into a delay this test cannot see.
 */
START_TEST(t_no_lost_wakeup)
{
	struct kvt_ctl_error err;
	struct raw stuck, full;
	pid_t pid;
	int st = -1;

	raw_connect(&full, 2, 2);
	for (uint32_t i = 0; i < 2; i++)
		raw_queue_nop(&full, i, 1);
	raw_publish(&full);
	raw_wait_cqe(&full, 1);
	for (uint32_t i = 2; i < 4; i++)
		raw_queue_nop(&full, i, 1);
	raw_publish(&full);
	raw_connect(&stuck, 8, 16);
	raw_queue_nop(&stuck, 1, 0);
	raw_publish(&stuck);
	ck_assert_int_eq(recv(stuck.sock, &err, sizeof(err), 0), sizeof(err));
	ck_assert_int_eq(err.err, -EPROTO);

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* The client spins for its completion, so that its next submit comes within
		 * microseconds, while the poller is on its way to sleep. */
		struct kvt_opts o = {.size = sizeof(o), .name = "racer", .spin_us = 200};
		struct kvt_client *c = NULL;

		if (kvt_connect(D.sock, &o, &c) < 0)
			_exit(2);
		srand(getpid());
		for (int i = 0; i < 50000; i++) {
			struct timespec t0, t;
			long pause_ns = rand() % 4000;

			/* 0-4 us apart: some submits land just as the poller goes to sleep */
			clock_gettime(CLOCK_MONOTONIC, &t0);
			do
				clock_gettime(CLOCK_MONOTONIC, &t);
			while ((t.tv_sec - t0.tv_sec) * 1000000000L + t.tv_nsec - t0.tv_nsec <
			       pause_ns);
			if (kvt_nop(c) != 0)
				_exit(3);
		}
		kvt_disconnect(c);
		_exit(0);
	}
	for (int i = 0; i < 3000 && waitpid(pid, &st, WNOHANG) == 0; i++)
		usleep(10 * 1000);
	if (waitpid(pid, &st, WNOHANG) == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		ck_abort_msg("a client's ops stopped completing (lost wakeup)");
	}
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "racer failed: status %d", st);
	raw_close(&stuck);
	raw_close(&full);
}
END_TEST

static Suite *
suite(void)
{
	Suite *s = suite_create("poller_park");
	TCase *tc = tcase_create("park");

	tcase_add_checked_fixture(tc, start_default, stop_default);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, t_unstamped_tail);
	tcase_add_test(tc, t_late_stamp);
	tcase_add_test(tc, t_cq_never_reaped);
	suite_add_tcase(s, tc);

	tc = tcase_create("wakeup");
	tcase_add_checked_fixture(tc, start_nospin, stop_default);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, t_no_lost_wakeup);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	return kvt_check_run(suite());
}
