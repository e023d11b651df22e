/* SPDX-License-Identifier: MIT */
/*
 * The prefix store at scale, through a real kvtierd: one client holds 100,000 namespaces (each
 * kept by one cached block), and neither NS_OPEN nor a restart in place costs more per
 * namespace than it does at 1,000. A store whose namespace lookup, image writing or restore
 * walks every namespace per namespace or per block (quadratic) freezes every client for tens of
 * seconds at this size; here the ratio test fails instead, while the namespaces are being made
 * or at the restart. The bounds are ratios of this run's own measurements, loose enough for a
 * loaded 2-core machine (the fixed cost of a restart, an exec and a pool mapping, is all in
 * the 1,000-namespace pause, which makes that per-namespace cost the larger).
 *
 * Also: [prefix] namespaces_per_uid bounds what one uid may hold (-EDQUOT past it, a
 * namespace that goes frees its place) and a restart keeps every namespace.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_test.h"
#include "kvtier.h"

enum { HD = 16, TOKB = 2 * HD * 4, B = KVT_MAX_NS, SMALL = 1000, LARGE = 100000 };

/* The per-namespace cost at LARGE may be at most this many times the cost at SMALL. Linear
 * code stays near 1 (below, for a restart: its fixed costs are all in SMALL's pause); quadratic
 * code costs about LARGE / SMALL = 100 times more. Each cost is the least of several
 * measurements, so a burst of load on the machine inflates one and not the verdict. */
#define PER_NS_FACTOR 10.0
/* NS_OPEN's cost is measured over windows of this many namespaces. */
#define WINDOW 250

static struct kvtd_proc Dm;

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
start_conf(const char *conf)
{
	daemon_start_conf(&Dm, conf, 0, NULL);
}

static struct kvt_client *
client(void)
{
	struct kvt_opts o = {
	    .size = sizeof(o), .sq_entries = 128, .cq_entries = 128, .spin_us = 50};
	struct kvt_client *c;

	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &c), 0);
	return c;
}

/* Arena layout: B namespace params, one sequence's params, one token's rows, B keys. */
#define OFF_NS(i)  ((uint64_t)(i) * sizeof(struct kvt_ns_params))
#define OFF_SEQ	   OFF_NS(B)
#define OFF_ROW	   (OFF_SEQ + sizeof(struct kvt_seq_params))
#define OFF_KEY(i) (OFF_ROW + TOKB + (uint64_t)(i) * sizeof(struct kvt_block_key))

static void
arena_init(struct kvt_client *c)
{
	uint8_t *a = kvt_arena(c, NULL);
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = 1,
				   .kv_heads = 1,
				   .head_dim = HD,
				   .dtype = KVT_DTYPE_F32,
				   .policy = KVT_POLICY_TIERED,
				   .delta = 4};

	memcpy(a + OFF_SEQ, &p, sizeof(p));
	memset(a + OFF_ROW, 0x3c, TOKB);
}

/* Namespaces [@from, @from + @n) (@n <= B), each left holding one published block and no
 * handle: NS_OPEN, SEQ_OPEN, APPEND, PUBLISH, SEQ_CLOSE, NS_CLOSE, pipelined in one submit. */
static void
make_batch(struct kvt_client *c, uint32_t from, uint32_t n)
{
	uint8_t *a = kvt_arena(c, NULL);
	static const int expect_id[6] = {1, 1, 1, 1, 0, 0}; /* res: i + 1, i + 1, 1, 1, 0, 0 */
	struct kvt_cqe cqe;

	for (uint32_t i = 0; i < n; i++) {
		struct kvt_ns_params np = {.size = sizeof(np),
					   .layers = 1,
					   .kv_heads = 1,
					   .head_dim = HD,
					   .dtype = KVT_DTYPE_F32,
					   .block_tokens = 1};
		struct kvt_block_key k = {.lo = from + i, .hi = 7};

		snprintf(np.name, sizeof(np.name), "ns-%08u", from + i);
		memcpy(a + OFF_NS(i), &np, sizeof(np));
		memcpy(a + OFF_KEY(i), &k, sizeof(k));
	}
	for (int op = 0; op < 6; op++)
		for (uint32_t i = 0; i < n; i++) {
			struct kvt_sqe *e = kvt_get_sqe(c);

			ck_assert_ptr_nonnull(e);
			switch (op) {
			case 0:
				kvt_prep_ns_open(e, OFF_NS(i));
				break;
			case 1:
				kvt_prep_seq_open_prefix(e, OFF_SEQ, i + 1, 0);
				break;
			case 2:
				kvt_prep_append(e, i + 1, OFF_ROW, TOKB, 1);
				break;
			case 3:
				kvt_prep_publish(e, i + 1, OFF_KEY(i), 1);
				break;
			case 4:
				kvt_prep_seq_close(e, i + 1);
				break;
			default:
				kvt_prep_ns_close(e, i + 1);
			}
			e->user_data = (uint64_t)op << 32 | i;
		}
	ck_assert_int_eq(kvt_submit(c), 6 * (int)n);
	for (uint32_t k = 0; k < 6 * n; k++) {
		int op, i;

		ck_assert_int_eq(kvt_wait_cqe(c, &cqe), 0);
		op = (int)(cqe.user_data >> 32);
		i = (int)(cqe.user_data & 0xffffffff);
		ck_assert_msg(cqe.res == (op < 2 ? i + 1 : expect_id[op]),
			      "namespace %u, op %d: res %d (log %s)", from + i, op, cqe.res,
			      Dm.log);
	}
}

/* Makes namespaces [@from, @to) in windows of WINDOW; returns the least time per namespace of
 * the last @last windows. @bound > 0: fails as soon as @last windows in a row cost over @bound
 * a namespace (quadratic code fails within seconds, not at the end of the run). */
static double
make_namespaces(struct kvt_client *c, uint32_t from, uint32_t to, unsigned last, double bound)
{
	double best = 1e9;
	unsigned over = 0;

	for (uint32_t w = from; w < to; w += WINDOW) {
		uint32_t end = to - w < WINDOW ? to : w + WINDOW;
		double t0 = now_s(), t;

		for (uint32_t i = w; i < end; i += B)
			make_batch(c, i, end - i < B ? end - i : B);
		t = (now_s() - t0) / (end - w);
		if (end + (uint64_t)last * WINDOW > to && t < best)
			best = t;
		over = bound > 0 && t > bound ? over + 1 : 0;
		if (over == last)
			ck_abort_msg("making namespaces %u..%u took over %.1f us each, %.0fx the "
				     "%.1f us of the first %u: NS_OPEN is not O(1)",
				     end - last * WINDOW, end, bound * 1e6, PER_NS_FACTOR,
				     bound / PER_NS_FACTOR * 1e6, SMALL);
	}
	return best;
}

/* The shortest of @n restarts, in seconds; each keeps the pool's @used bytes (the blocks). */
static double
restart_pause(int n, int64_t used)
{
	double best = 1e9;

	for (int k = 0; k < n; k++) {
		struct kvt_ctl_hdr h = {.type = KVT_CTL_RESTART, .len = sizeof(h), .id = 1};
		static char buf[KVT_CTL_MAX_MSG];
		struct json_object *o, *v;
		double t0, t;
		ssize_t len;
		int fd;

		/* its own connection: admin_request() waits 5 s, and quadratic code takes longer
		 * (the ratio below says so then) */
		fd = ctl_raw_connect(Dm.sock);
		ck_assert_int_ge(fd, 0);
		t0 = now_s();
		ck_assert_int_eq(send(fd, &h, sizeof(h), 0), sizeof(h));
		len = ctl_raw_recv(fd, buf, sizeof(buf) - 1, 300000);
		t = now_s() - t0;
		close(fd);
		ck_assert_msg(len > (ssize_t)sizeof(h), "no reply to RESTART: %zd (log %s)", len,
			      Dm.log);
		buf[len] = '\0';
		o = json_tokener_parse(buf + sizeof(h));
		ck_assert_msg(o, "RESTART's reply is not JSON (log %s)", Dm.log);
		ck_assert_msg(json_object_object_get_ex(o, "restarted", &v) &&
				  json_object_get_boolean(v),
			      "RESTART: %s", json_object_to_json_string(o));
		json_object_put(o);
		ck_assert_int_eq(pool_used(Dm.sock), used);
		if (t < best)
			best = t;
	}
	return best;
}

START_TEST(t_scale)
{
	struct kvt_client *c;
	double make_small, make_large, pause_small, pause_large;

	start_conf("[prefix]\ncache_bytes = 32M\nnamespaces_per_uid = 200000\n");
	c = client();
	arena_init(c);
	make_small = make_namespaces(c, 0, SMALL, SMALL / WINDOW, 0);
	pause_small = restart_pause(3, (int64_t)SMALL * TOKB);
	make_large = make_namespaces(c, SMALL, LARGE, 8, PER_NS_FACTOR * make_small);
	pause_large = restart_pause(2, (int64_t)LARGE * TOKB);
	fprintf(stderr,
		"prefix scale: NS_OPEN and a block %.1f us a namespace in the first %u, %.1f us in "
		"the last %u of %u; restart pause %.3f s at %u, %.3f s at %u\n",
		make_small * 1e6, SMALL, make_large * 1e6, 8 * WINDOW, LARGE, pause_small, SMALL,
		pause_large, LARGE);
	ck_assert_msg(pause_large / LARGE <= PER_NS_FACTOR * pause_small / SMALL,
		      "restart pause %.3f s with %u namespaces, %.3f s with %u: more than %.0fx "
		      "the pause per namespace (the image or its restore is not linear)",
		      pause_large, LARGE, pause_small, SMALL, PER_NS_FACTOR);
	/* still serving: namespaces of either end hold their block */
	for (uint32_t i = 0; i < LARGE; i += LARGE / 7 - 1) {
		struct kvt_ns_params np = {.size = sizeof(np),
					   .layers = 1,
					   .kv_heads = 1,
					   .head_dim = HD,
					   .dtype = KVT_DTYPE_F32,
					   .block_tokens = 1};
		struct kvt_block_key k = {.lo = i, .hi = 7};
		uint32_t ns;

		snprintf(np.name, sizeof(np.name), "ns-%08u", i);
		ck_assert_int_eq(kvt_ns_open(c, &np, &ns), 0);
		ck_assert_int_eq(kvt_lookup(c, ns, &k, 1, 0), 1);
		ck_assert_int_eq(kvt_ns_close(c, ns), 0);
	}
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}
END_TEST

/* namespaces_per_uid: the next NS_OPEN is -EDQUOT (the session keeps what it has); a
 * namespace that goes frees its place; the shared store counts every uid apart. */
START_TEST(t_per_uid_limit)
{
	struct kvt_client *c;
	struct kvt_ns_params np = {.size = sizeof(np),
				   .layers = 1,
				   .kv_heads = 1,
				   .head_dim = HD,
				   .dtype = KVT_DTYPE_F32,
				   .block_tokens = 1};
	uint32_t id[4], extra;

	start_conf("[prefix]\nnamespaces_per_uid = 3\n");
	c = client();
	for (int i = 0; i < 3; i++) {
		snprintf(np.name, sizeof(np.name), "m%d", i);
		ck_assert_int_eq(kvt_ns_open(c, &np, &id[i]), 0);
	}
	snprintf(np.name, sizeof(np.name), "m3");
	ck_assert_int_eq(kvt_ns_open(c, &np, &extra), -EDQUOT);
	/* an open namespace is joined again at no cost */
	snprintf(np.name, sizeof(np.name), "m1");
	ck_assert_int_eq(kvt_ns_open(c, &np, &id[3]), 0);
	ck_assert_int_eq(kvt_ns_close(c, id[3]), 0);
	/* closing one (no block) frees its place */
	ck_assert_int_eq(kvt_ns_close(c, id[0]), 0);
	snprintf(np.name, sizeof(np.name), "m3");
	ck_assert_int_eq(kvt_ns_open(c, &np, &extra), 0);
	/* a restart keeps them, and the limit */
	restart_pause(1, 0);
	snprintf(np.name, sizeof(np.name), "m4");
	ck_assert_int_eq(kvt_ns_open(c, &np, &id[0]), -EDQUOT);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}
END_TEST

KVT_CHECK_MAIN("prefix_scale", 600, NULL, NULL, t_scale, t_per_uid_limit)
