/* SPDX-License-Identifier: MIT */
/*
 * libkvtier never copies more into a caller's buffer than the caller's stated length, whatever
 * count the daemon's CQE carries. A hostile daemon is played by this test: with kvtierd stopped
 * (SIGSTOP), it forges the next CQE in its own session's shared CQ.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "kvt_ring.h"
#include "kvtier.h"
#include "kvt_test.h"

static struct kvtd_proc Dm;

/* The region header of the mapping that holds @p (the arena's). */
static struct kvt_region_hdr *
region_of(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "r");
	uintptr_t a = (uintptr_t)p, lo, hi;
	char line[512];
	void *ret = NULL;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2 && lo <= a && a < hi) {
			ret = (void *)lo;
			break;
		}
	fclose(f);
	ck_assert_ptr_nonnull(ret);
	ck_assert_uint_eq(((struct kvt_region_hdr *)ret)->magic, KVT_REGION_MAGIC);
	return ret;
}

/* Write the CQE the client reaps next: @ud, @res, published by its stamp. */
static void
forge(struct kvt_region_hdr *h, uint32_t head, uint64_t ud, int32_t res)
{
	struct kvt_cqe *e = (void *)((uint8_t *)h + h->cq_entries_off);

	e += head & (h->cq_entries - 1);
	e->user_data = ud;
	e->res = res;
	kvt_ring_store_stamp(&e->stamp, head);
}

/* SIGSTOP is delivered asynchronously: wait until every thread of @pid is stopped, or a poller
 * still running could answer the op itself. */
static void
stop_daemon(pid_t pid)
{
	ck_assert_int_eq(kill(pid, SIGSTOP), 0);
	for (int tries = 0; tries < 5000; tries++) {
		char path[64], line[512];
		struct dirent *de;
		int running = 0;
		DIR *d;

		snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
		d = opendir(path);
		ck_assert_ptr_nonnull(d);
		while ((de = readdir(d))) {
			char *st;
			FILE *f;

			if (de->d_name[0] == '.')
				continue;
			snprintf(line, sizeof(line), "%s/%s/stat", path, de->d_name);
			f = fopen(line, "r");
			if (!f)
				continue;
			if (fgets(line, sizeof(line), f) && (st = strrchr(line, ')')) &&
			    st[2] != 'T' && st[2] != 't')
				running = 1;
			fclose(f);
		}
		closedir(d);
		if (!running)
			return;
		usleep(1000);
	}
	ck_abort_msg("kvtierd (pid %d) did not stop within 5 s of SIGSTOP", (int)pid);
}

START_TEST(t_reply_larger_than_buffer)
{
	struct kvt_opts o = {.size = sizeof(o)};
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = 1,
				   .kv_heads = 1,
				   .head_dim = 8,
				   .dtype = KVT_DTYPE_F32,
				   .policy = KVT_POLICY_FULL,
				   .delta = 1};
	uint8_t out[4096], canary[4096];
	uint32_t pos[64 + 1024];
	struct kvt_region_hdr *h;
	struct kvt_client *c;
	uint32_t seq;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0); /* CQ head 1, next blocking ud 2^63 + 1 */
	h = region_of(kvt_arena(c, NULL));
	memset(out, 0xAA, sizeof(out));
	memset(canary, 0xAA, sizeof(canary));
	memset(pos, 0xAA, sizeof(pos));

	stop_daemon(Dm.pid); /* the forged CQE is the only one */
	forge(h, 1, (1ull << 63) + 1, 4000);
	ck_assert_int_eq(kvt_retier(c, seq, out, 128), -EMSGSIZE);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "more than the 128"));
	ck_assert_mem_eq(out, canary, sizeof(out));
	forge(h, 2, (1ull << 63) + 2, 1000);
	ck_assert_int_eq(kvt_fetch(c, seq, KVT_FETCH_F_T1, 0, 1, 0, pos, 64), -EMSGSIZE);
	ck_assert_mem_eq(pos, canary, sizeof(pos) < sizeof(canary) ? sizeof(pos) : sizeof(canary));
	ck_assert_int_eq(kill(Dm.pid, SIGCONT), 0);
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

KVT_CHECK_MAIN("client_bounds", 60, up, down, t_reply_larger_than_buffer)
