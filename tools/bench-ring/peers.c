/* SPDX-License-Identifier: MIT */
/*
 * peers.c - the baselines kvtier's rings are judged against: what two processes pay to hand a
 * message back and forth through shared memory, a Unix socket and eventfds, and what io_uring
 * pays per NOP at batch 32 (the rate a syscall-based queue tops out at).
 */
#include <errno.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <liburing.h>

#include "bench.h"

/* ---- clock floor ---- */

static int
nothing(void *ctx)
{
	return 0;
}

int
bench_clock(const struct bench_opts *o, struct bench_result *ret)
{
	return bench_latency(o, nothing, NULL, ret);
}

/* ---- shared-memory cache-line ping-pong ---- */

/*
 * One cache line both processes write: the parent stores 2k-1 and spins until it reads 2k; the
 * child spins until it reads 2k-1 and stores 2k. Each round trip moves the line to the other
 * core and back. The spin uses the CPU's pause hint, as kvtier's pollers do, and yields after a
 * while so a descheduled peer (2 vCPUs shared with other work) costs a time slice, not a hang.
 */
struct pp_line {
	alignas(64) _Atomic uint64_t seq;
	char pad[64 - sizeof(uint64_t)];
};

struct pp_ctx {
	struct pp_line *line;
	uint64_t k; /* private to each process after fork */
};

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

#define SPIN_BEFORE_YIELD (1u << 14)
#define SPIN_TIMEOUT_NS	  10000000000ull /* a peer silent this long is gone */

static int
pp_wait(struct pp_line *l, uint64_t want)
{
	uint64_t spins = 0, t0 = 0;

	while (atomic_load_explicit(&l->seq, memory_order_acquire) != want) {
		if (++spins < SPIN_BEFORE_YIELD) {
			cpu_relax();
			continue;
		}
		sched_yield();
		if (!t0)
			t0 = bench_now_ns();
		else if (!(spins & 1023) && bench_now_ns() - t0 > SPIN_TIMEOUT_NS)
			return -ETIMEDOUT;
	}
	return 0;
}

static int
pp_ping(void *arg)
{
	struct pp_ctx *c = arg;

	c->k++;
	/* release: pairs with the acquire load in the child's pp_wait() */
	atomic_store_explicit(&c->line->seq, 2 * c->k - 1, memory_order_release);
	return pp_wait(c->line, 2 * c->k);
}

static int
pp_pong(void *arg)
{
	struct pp_ctx *c = arg;
	int err;

	c->k++;
	err = pp_wait(c->line, 2 * c->k - 1);
	if (err < 0)
		return err;
	atomic_store_explicit(&c->line->seq, 2 * c->k, memory_order_release);
	return 0;
}

int
bench_pingpong(const struct bench_opts *o, struct bench_result *ret)
{
	static const struct bench_peer peer = {.ping = pp_ping, .pong = pp_pong};
	struct pp_ctx c = {.k = 0};
	int err;

	c.line =
	    mmap(NULL, sizeof(*c.line), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (c.line == MAP_FAILED)
		return -errno;
	atomic_init(&c.line->seq, 0);
	err = bench_roundtrip(o, &peer, &c, ret);
	munmap(c.line, sizeof(*c.line));
	return err;
}

/* ---- Unix socketpair echo ---- */

/* Message sizes cycle through these; both sides walk the cycle in step. */
static const unsigned int echo_sizes[] = {8, 16, 32, 64};

struct echo_ctx {
	int fd[2]; /* fd[0] parent's end, fd[1] child's end */
	unsigned int i;
	char buf[64];
};

static int
read_full(int fd, char *buf, size_t len)
{
	size_t off = 0;
	ssize_t n;

	while (off < len) {
		n = read(fd, buf + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ECONNRESET;
		off += n;
	}
	return 0;
}

static int
write_full(int fd, const char *buf, size_t len)
{
	size_t off = 0;
	ssize_t n;

	while (off < len) {
		n = write(fd, buf + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		off += n;
	}
	return 0;
}

static void
echo_after_fork(void *arg, int is_child)
{
	struct echo_ctx *c = arg;

	/* Keep one end each, so the survivor of a dead peer reads EOF instead of blocking. */
	close(c->fd[is_child ? 0 : 1]);
}

static int
echo_ping(void *arg)
{
	struct echo_ctx *c = arg;
	size_t len = echo_sizes[c->i++ % 4];
	int err;

	c->buf[0] = (char)c->i;
	err = write_full(c->fd[0], c->buf, len);
	if (err < 0)
		return err;
	err = read_full(c->fd[0], c->buf, len);
	if (err < 0)
		return err;
	return c->buf[0] == (char)c->i ? 0 : -EPROTO;
}

static int
echo_pong(void *arg)
{
	struct echo_ctx *c = arg;
	size_t len = echo_sizes[c->i++ % 4];
	int err;

	err = read_full(c->fd[1], c->buf, len);
	if (err < 0)
		return err;
	return write_full(c->fd[1], c->buf, len);
}

int
bench_socket(const struct bench_opts *o, struct bench_result *ret)
{
	static const struct bench_peer peer = {
	    .after_fork = echo_after_fork, .ping = echo_ping, .pong = echo_pong};
	struct echo_ctx c = {.i = 0};
	int err;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, c.fd) < 0)
		return -errno;
	memset(c.buf, 0x5a, sizeof(c.buf));
	err = bench_roundtrip(o, &peer, &c, ret);
	close(c.fd[0]);
	return err;
}

/* ---- eventfd ping-pong ---- */

struct efd_ctx {
	int to_child;  /* parent writes, child reads (blocking) */
	int to_parent; /* child writes, parent reads (blocking) */
};

static int
efd_signal(int fd)
{
	uint64_t one = 1;

	return write(fd, &one, sizeof(one)) == sizeof(one) ? 0 : -errno;
}

static int
efd_wait(int fd)
{
	uint64_t v;

	return read(fd, &v, sizeof(v)) == sizeof(v) ? 0 : -errno;
}

static int
efd_ping(void *arg)
{
	struct efd_ctx *c = arg;
	int err = efd_signal(c->to_child);

	return err < 0 ? err : efd_wait(c->to_parent);
}

static int
efd_pong(void *arg)
{
	struct efd_ctx *c = arg;
	int err = efd_wait(c->to_child);

	return err < 0 ? err : efd_signal(c->to_parent);
}

int
bench_eventfd(const struct bench_opts *o, struct bench_result *ret)
{
	static const struct bench_peer peer = {.ping = efd_ping, .pong = efd_pong};
	struct efd_ctx c;
	int err;

	c.to_child = eventfd(0, EFD_CLOEXEC);
	if (c.to_child < 0)
		return -errno;
	c.to_parent = eventfd(0, EFD_CLOEXEC);
	if (c.to_parent < 0) {
		err = -errno;
		goto err_close;
	}
	err = bench_roundtrip(o, &peer, &c, ret);
	close(c.to_parent);
err_close:
	close(c.to_child);
	return err;
}

/* ---- io_uring NOP, batch 32 ---- */

#define URING_BATCH 32

static int
uring_batch(void *arg)
{
	struct io_uring *ring = arg;
	struct io_uring_cqe *cqe;
	unsigned int i, head, seen = 0;
	int r;

	for (i = 0; i < URING_BATCH; i++) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

		if (!sqe)
			return -EBUSY;
		io_uring_prep_nop(sqe);
	}
	r = io_uring_submit_and_wait(ring, URING_BATCH);
	if (r < 0)
		return r;
	if (r != URING_BATCH)
		return -EIO;
	io_uring_for_each_cqe(ring, head, cqe)
	{
		if (cqe->res < 0)
			r = cqe->res;
		seen++;
	}
	io_uring_cq_advance(ring, seen);
	if (r < 0)
		return r;
	return seen == URING_BATCH ? 0 : -EIO;
}

int
bench_uring_batch32(const struct bench_opts *o, struct bench_result *ret)
{
	struct io_uring ring;
	int err;

	err = io_uring_queue_init(2 * URING_BATCH, &ring, 0);
	if (err < 0)
		return err;
	err = bench_throughput(o, uring_batch, URING_BATCH, &ring, ret);
	io_uring_queue_exit(&ring);
	return err;
}
