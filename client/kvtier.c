/* SPDX-License-Identifier: MIT */
/*
 * libkvtier. The client is the SQ producer and the CQ consumer; the ring protocol is in
 * proto/kvt_ring.h. The control socket stays open for the session's life: buffer registration
 * goes over it, and its hangup is how a lost daemon is noticed while waiting.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* XXH3-128 for block keys, compiled in: libkvtier gains no run-time dependency. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvt_ctl.h"
#include "kvt_ring.h"
#include "kvt_version.h"
#include "kvtier.h"
#include "kvtier_int.h"

#define KVT_EXPORT	   __attribute__((visibility("default")))
#define CONNECT_TIMEOUT_MS 10000

struct kvt_buf {
	struct kvt_buf *next;
	uint32_t id;
	uint64_t size;
	void *map;	 /* our mapping, or the device pointer of a CUDA buffer */
	int ipc;	 /* CUDA buffer: the memory is the caller's, nothing to unmap */
	uint64_t offset; /* CUDA buffer: where it starts in the allocation the daemon maps */
	void *mem;	 /* device memory kvt_buf_alloc_cuda() allocated, freed with the buffer */
};

struct kvt_client {
	int sock;
	int sq_efd, cq_efd;
	uint8_t *region;
	uint64_t region_size;
	struct kvt_ring_hdr *sq, *cq;
	struct kvt_sqe *sqes;
	struct kvt_cqe *cqes;
	const struct kvt_op_err *op_err; /* NULL: the daemon keeps no reasons (ABI 1.0) */
	uint8_t *arena;
	uint64_t arena_size;
	uint32_t sq_entries, cq_entries;
	uint32_t abi_minor;    /* the daemon's KVT_ABI_MINOR (region header) */
	uint32_t sq_tail;      /* private: SQEs handed out by kvt_get_sqe() */
	uint32_t sq_pub;       /* published to the daemon */
	uint32_t cq_head;      /* private consumer index */
	uint32_t sq_head_seen; /* last SQ head read from the daemon */
	unsigned inflight;     /* handed out and not reaped */
	uint32_t session_id;
	uint32_t spin_us;
	uint64_t next_ud; /* user_data of blocking wrappers: high bit set */
	int dead;	  /* the daemon's error once the session is lost */
	/* completions reaped by a blocking wrapper that belonged to someone else */
	struct kvt_cqe *stash;
	unsigned stash_n;
	uint64_t next_msg_id;
	struct kvt_buf *bufs;
	void *cuda; /* kvtier_cuda.c's per-session state (the opened event), NULL until used */
	unsigned fork_gen; /* fork_gen when connected: a different value means we are a child */
};

/*
 * Bumped in every child by a pthread_atfork() handler: a session belongs to the process that
 * connected it (its ring indices, stash and message ids are private state the parent keeps
 * using), so a client whose fork_gen differs refuses every call with -ECHILD. A compare of a
 * plain load is all the data path pays; getpid() would be a system call per op.
 */
static atomic_uint fork_gen;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void
fork_child(void)
{
	atomic_fetch_add_explicit(&fork_gen, 1, memory_order_relaxed);
}

static void
fork_register(void)
{
	pthread_atfork(NULL, NULL, fork_child);
}

static _Thread_local char last_error[256];

static void
set_last_error(const char *msg)
{
	snprintf(last_error, sizeof(last_error), "%s", msg);
}

#define FORK_MSG                                                                                   \
	"this kvtier client was connected before fork(): a child process cannot use its "          \
	"parent's session (kvt_disconnect() it and kvt_connect() a new one)"

/* Nonzero (and the client dead with -ECHILD) when called in a child of the connecting process. */
static inline int
forked(struct kvt_client *c)
{
	if (__builtin_expect(c->fork_gen == atomic_load_explicit(&fork_gen, memory_order_relaxed),
			     1))
		return 0;
	c->dead = -ECHILD;
	return 1;
}

void
kvtc_set_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
}

void **
kvtc_cuda_state(struct kvt_client *c)
{
	return &c->cuda;
}

KVT_EXPORT const char *
kvt_last_error(void)
{
	return last_error;
}

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Receives one control message (and up to @max_fds fds) within @timeout_ms. */
static int
ctl_recv(int sock, void *buf, size_t len, int *fds, int max_fds, int timeout_ms)
{
	char cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov = {buf, len};
	struct msghdr m = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct pollfd pfd = {.fd = sock, .events = POLLIN};
	int nfds = 0, r;
	ssize_t n;

	do
		r = poll(&pfd, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return errno == ECONNRESET ? -ECONNRESET : -errno;
	if (n == 0)
		return -ECONNRESET;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (nfds < max_fds)
				fds[nfds++] = fd;
			else
				close(fd);
		}
	}
	if ((size_t)n < sizeof(struct kvt_ctl_hdr)) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return -EPROTO;
	}
	return nfds;
}

/* Turns a KVT_CTL_ERROR reply into its errno and remembers its message. */
static int
ctl_error(const void *buf)
{
	const struct kvt_ctl_error *e = buf;
	char msg[sizeof(e->msg) + 1];

	memcpy(msg, e->msg, sizeof(e->msg));
	msg[sizeof(e->msg)] = '\0';
	set_last_error(msg);
	return e->err < 0 ? e->err : -EPROTO;
}

static void
client_free(struct kvt_client *c)
{
	if (c->region && c->region != MAP_FAILED)
		munmap(c->region, c->region_size);
	if (c->sock >= 0)
		close(c->sock);
	if (c->sq_efd >= 0)
		close(c->sq_efd);
	if (c->cq_efd >= 0)
		close(c->cq_efd);
	while (c->bufs) {
		struct kvt_buf *b = c->bufs;

		c->bufs = b->next;
		if (!b->ipc)
			munmap(b->map, b->size);
		kvtc_cuda_mem_free(b->mem); /* after close(sock): the daemon has let go of it */
		free(b);
	}
	if (c->fork_gen == atomic_load_explicit(&fork_gen, memory_order_relaxed))
		kvtc_cuda_fini(c->cuda); /* a child holds no CUDA context of its parent's */
	free(c->stash);
	free(c);
}

/* Validate the region header the daemon wrote: offsets inside the region, sizes consistent. */
static int
region_map(struct kvt_client *c)
{
	const struct kvt_region_hdr *h = (const void *)c->region;
	uint64_t sz = c->region_size;

	if (sz < sizeof(*h) || h->magic != KVT_REGION_MAGIC || h->abi_major != KVT_ABI_MAJOR ||
	    h->region_size != sz)
		return -EPROTO;
	if (!h->sq_entries || (h->sq_entries & (h->sq_entries - 1)) || !h->cq_entries ||
	    (h->cq_entries & (h->cq_entries - 1)))
		return -EPROTO;
	if (h->sq_ring_off > sz - sizeof(struct kvt_ring_hdr) ||
	    h->cq_ring_off > sz - sizeof(struct kvt_ring_hdr) || h->sq_entries_off > sz ||
	    (uint64_t)h->sq_entries * sizeof(struct kvt_sqe) > sz - h->sq_entries_off ||
	    h->cq_entries_off > sz ||
	    (uint64_t)h->cq_entries * sizeof(struct kvt_cqe) > sz - h->cq_entries_off ||
	    h->arena_off > sz || h->arena_size > sz - h->arena_off)
		return -EPROTO;
	/* ABI 1.1: the op error record. A 1.0 daemon leaves the field zero (it was reserved). */
	if (h->hdr_size >= offsetof(struct kvt_region_hdr, err_off) + sizeof(h->err_off) &&
	    h->err_off) {
		if (h->err_off > sz - sizeof(struct kvt_op_err) || (h->err_off & 7))
			return -EPROTO;
		c->op_err = (const void *)(c->region + h->err_off);
	}
	c->sq = (void *)(c->region + h->sq_ring_off);
	c->cq = (void *)(c->region + h->cq_ring_off);
	c->sqes = (void *)(c->region + h->sq_entries_off);
	c->cqes = (void *)(c->region + h->cq_entries_off);
	c->arena = c->region + h->arena_off;
	c->arena_size = h->arena_size;
	c->abi_minor = h->abi_minor;
	c->sq_entries = h->sq_entries;
	c->cq_entries = h->cq_entries;
	c->sq_tail = c->sq_pub = kvt_ring_prod_tail_relaxed(c->sq);
	c->sq_head_seen = kvt_ring_load_head(c->sq);
	c->cq_head = kvt_ring_load_head(c->cq);
	return 0;
}

KVT_EXPORT int
kvt_connect(const char *path, const struct kvt_opts *opts, struct kvt_client **ret_client)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvt_ctl_hello hello;
	struct kvt_opts o = {0};
	union {
		struct kvt_ctl_hdr hdr;
		struct kvt_ctl_welcome w;
		struct kvt_ctl_error e;
	} reply;
	struct kvt_client *c;
	int fds[3], r;

	last_error[0] = '\0';
	if (opts) {
		if (opts->size < offsetof(struct kvt_opts, abi_major))
			return -EINVAL;
		memcpy(&o, opts, opts->size < sizeof(o) ? opts->size : sizeof(o));
	}
	if (!path)
		path = getenv("KVTIER_SOCKET");
	if (!path || !*path)
		path = KVT_DEFAULT_SOCKET;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -EINVAL;
	strcpy(sa.sun_path, path);

	pthread_once(&fork_once, fork_register);
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fork_gen = atomic_load_explicit(&fork_gen, memory_order_relaxed);
	c->sock = c->sq_efd = c->cq_efd = -1;
	c->spin_us = o.spin_us;
	c->next_ud = 1ull << 63;
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->sock < 0) {
		r = -errno;
		goto err;
	}
	if (connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		goto err;
	}
	memset(&hello, 0, sizeof(hello));
	hello.hdr.type = KVT_CTL_HELLO;
	hello.hdr.len = sizeof(hello);
	hello.hdr.id = ++c->next_msg_id;
	hello.abi_major = o.abi_major ? (uint16_t)o.abi_major : KVT_ABI_MAJOR;
	hello.abi_minor = KVT_ABI_MINOR;
	hello.sq_entries = o.sq_entries;
	hello.cq_entries = o.cq_entries;
	hello.arena_size = o.arena_size;
	hello.features = KVT_FEAT_ALL;
	snprintf(hello.name, sizeof(hello.name), "%s",
		 o.name ? o.name : program_invocation_short_name);
	if (send(c->sock, &hello, sizeof(hello), MSG_NOSIGNAL) < 0) {
		r = -errno;
		goto err;
	}
	r = ctl_recv(c->sock, &reply, sizeof(reply), fds, 3, CONNECT_TIMEOUT_MS);
	if (r < 0)
		goto err;
	if (reply.hdr.type == KVT_CTL_ERROR) {
		for (int i = 0; i < r; i++)
			close(fds[i]);
		r = ctl_error(&reply);
		goto err;
	}
	if (reply.hdr.type != KVT_CTL_WELCOME || r != 3) {
		for (int i = 0; i < r; i++)
			close(fds[i]);
		set_last_error("malformed WELCOME from kvtierd");
		r = -EPROTO;
		goto err;
	}
	c->sq_efd = fds[1];
	c->cq_efd = fds[2];
	c->session_id = reply.w.session_id;
	c->region_size = reply.w.region_size;
	c->region = mmap(NULL, c->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	close(fds[0]);
	if (c->region == MAP_FAILED) {
		r = -errno;
		goto err;
	}
	r = region_map(c);
	if (r < 0) {
		set_last_error("kvtierd's shared region header is inconsistent");
		goto err;
	}
	c->stash = calloc(c->cq_entries, sizeof(*c->stash));
	if (!c->stash) {
		r = -ENOMEM;
		goto err;
	}
	*ret_client = c;
	return 0;
err:
	client_free(c);
	return r;
}

KVT_EXPORT void
kvt_disconnect(struct kvt_client *c)
{
	if (c)
		client_free(c);
}

KVT_EXPORT uint32_t
kvt_abi_version(void)
{
	return (uint32_t)KVT_ABI_MAJOR << 16 | KVT_ABI_MINOR;
}

KVT_EXPORT const char *
kvt_version(void)
{
	return KVT_VERSION;
}

KVT_EXPORT uint32_t
kvt_session_id(const struct kvt_client *c)
{
	return c->session_id;
}

KVT_EXPORT void *
kvt_arena(const struct kvt_client *c, uint64_t *ret_size)
{
	if (ret_size)
		*ret_size = c->arena_size;
	return c->arena;
}

KVT_EXPORT unsigned
kvt_inflight(const struct kvt_client *c)
{
	return c->inflight;
}

/* ---- control requests ------------------------------------------------------------------- */

static int
ctl_request(struct kvt_client *c, void *msg, size_t len, int fd, void *reply, size_t rlen)
{
	struct kvt_ctl_hdr *h = msg;
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {msg, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	int r;

	last_error[0] = '\0'; /* a stale message must not explain this request's failure */
	if (forked(c))
		set_last_error(FORK_MSG);
	if (c->dead)
		return c->dead;
	h->len = (uint32_t)len;
	h->id = ++c->next_msg_id;
	if (fd >= 0) {
		struct cmsghdr *cm;

		memset(cbuf, 0, sizeof(cbuf));
		m.msg_control = cbuf;
		m.msg_controllen = sizeof(cbuf);
		cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	if (sendmsg(c->sock, &m, MSG_NOSIGNAL) < 0)
		return errno == EPIPE ? -ECONNRESET : -errno;
	r = ctl_recv(c->sock, reply, rlen, NULL, 0, CONNECT_TIMEOUT_MS);
	if (r < 0)
		return r;
	if (((struct kvt_ctl_hdr *)reply)->type == KVT_CTL_ERROR)
		return ctl_error(reply);
	return 0;
}

KVT_EXPORT int
kvt_buf_alloc(struct kvt_client *c, uint64_t size, struct kvt_buf **ret_buf)
{
	struct kvt_ctl_buf_register m;
	union {
		struct kvt_ctl_buf_registered ok;
		struct kvt_ctl_error e;
	} reply;
	struct kvt_buf *b;
	int fd, r;

	last_error[0] = '\0';
	if (!size)
		return -EINVAL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	fd = memfd_create("kvtier-buf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		r = -errno;
		goto err_free;
	}
	/* Sealed against resizing: the daemon maps it and refuses an unsealed fd. */
	if (ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		goto err_close;
	}
	b->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (b->map == MAP_FAILED) {
		r = -errno;
		goto err_close;
	}
	b->size = size;
	memset(&m, 0, sizeof(m));
	m.hdr.type = KVT_CTL_BUF_REGISTER;
	m.kind = KVT_BUF_HOST_MEMFD;
	m.size = size;
	r = ctl_request(c, &m, sizeof(m), fd, &reply, sizeof(reply));
	if (r < 0)
		goto err_unmap;
	if (reply.ok.hdr.type != KVT_CTL_BUF_REGISTERED || !reply.ok.buf_id) {
		r = -EPROTO;
		goto err_unmap;
	}
	close(fd);
	b->id = reply.ok.buf_id;
	b->next = c->bufs;
	c->bufs = b;
	*ret_buf = b;
	return 0;
err_unmap:
	munmap(b->map, size);
err_close:
	close(fd);
err_free:
	free(b);
	return r;
}

KVT_EXPORT int
kvt_buf_free(struct kvt_client *c, struct kvt_buf *buf)
{
	struct kvt_ctl_buf_unregister m;
	union {
		struct kvt_ctl_hdr ok;
		struct kvt_ctl_error e;
	} reply;
	int r;

	if (!buf)
		return 0;
	memset(&m, 0, sizeof(m));
	m.hdr.type = KVT_CTL_BUF_UNREGISTER;
	m.buf_id = buf->id;
	r = ctl_request(c, &m, sizeof(m), -1, &reply, sizeof(reply));
	if (r == -EBUSY)
		return r;
	/* Unmapped on any other outcome: with the daemon gone the buffer is ours alone. */
	for (struct kvt_buf **pp = &c->bufs; *pp; pp = &(*pp)->next)
		if (*pp == buf) {
			*pp = buf->next;
			break;
		}
	if (!buf->ipc)
		munmap(buf->map, buf->size);
	if (buf->mem && r != -ECHILD) { /* a child has no CUDA context of its parent's */
		int fr = kvtc_cuda_mem_free(buf->mem);

		if (r == 0)
			r = fr;
	}
	free(buf);
	return r;
}

int
kvtc_buf_register_ipc(struct kvt_client *c, const uint8_t handle[64], const uint8_t uuid[16],
		      void *ptr, uint64_t offset, uint64_t size, void *mem,
		      struct kvt_buf **ret_buf)
{
	struct kvt_ctl_buf_register m;
	union {
		struct kvt_ctl_buf_registered ok;
		struct kvt_ctl_error e;
	} reply;
	struct kvt_buf *b;
	int r;

	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	memset(&m, 0, sizeof(m));
	m.hdr.type = KVT_CTL_BUF_REGISTER;
	m.kind = KVT_BUF_CUDA_IPC;
	m.size = offset + size; /* the daemon maps the allocation and addresses it from its start */
	memcpy(m.ipc_handle, handle, sizeof(m.ipc_handle));
	memcpy(m.device_uuid, uuid, sizeof(m.device_uuid));
	r = ctl_request(c, &m, sizeof(m), -1, &reply, sizeof(reply));
	if (r == 0 && (reply.ok.hdr.type != KVT_CTL_BUF_REGISTERED || !reply.ok.buf_id))
		r = -EPROTO;
	if (r < 0) {
		free(b);
		return r;
	}
	b->id = reply.ok.buf_id;
	b->size = size;
	b->map = ptr;
	b->ipc = 1;
	b->offset = offset;
	b->mem = mem;
	b->next = c->bufs;
	c->bufs = b;
	*ret_buf = b;
	return 0;
}

int
kvtc_event_get(struct kvt_client *c, const uint8_t uuid[16], uint8_t ret_handle[64])
{
	struct kvt_ctl_event_get m;
	union {
		struct kvt_ctl_event ev;
		struct kvt_ctl_error e;
	} reply;
	int r;

	memset(&m, 0, sizeof(m));
	m.hdr.type = KVT_CTL_EVENT_GET;
	memcpy(m.device_uuid, uuid, sizeof(m.device_uuid));
	r = ctl_request(c, &m, sizeof(m), -1, &reply, sizeof(reply));
	if (r == 0 && reply.ev.hdr.type != KVT_CTL_EVENT)
		r = -EPROTO;
	if (r == 0)
		memcpy(ret_handle, reply.ev.ipc_handle, 64);
	return r;
}

KVT_EXPORT void *
kvt_buf_ptr(const struct kvt_buf *buf)
{
	return buf->map;
}

KVT_EXPORT uint32_t
kvt_buf_id(const struct kvt_buf *buf)
{
	return buf->id;
}

KVT_EXPORT uint64_t
kvt_buf_size(const struct kvt_buf *buf)
{
	return buf->size;
}

KVT_EXPORT uint64_t
kvt_buf_offset(const struct kvt_buf *buf)
{
	return buf->offset;
}

/* ---- ring ------------------------------------------------------------------------------- */

KVT_EXPORT struct kvt_sqe *
kvt_get_sqe(struct kvt_client *c)
{
	struct kvt_sqe *e;

	/* Never more in flight than the CQ holds, so the daemon never finds it full. */
	if (c->dead || forked(c) || c->inflight + c->stash_n >= c->cq_entries)
		return NULL;
	/* Read the daemon's SQ head (a line it writes) only when our copy says the ring is full. */
	if (c->sq_tail - c->sq_head_seen >= c->sq_entries) {
		c->sq_head_seen = kvt_ring_load_head(c->sq);
		if (c->sq_tail - c->sq_head_seen >= c->sq_entries)
			return NULL;
	}
	e = &c->sqes[c->sq_tail++ & (c->sq_entries - 1)];
	/* Clear all but the stamp, which the daemon may be polling (it still holds last lap's
	 * value, never the one it waits for); kvt_submit() sets it. */
	memset(e, 0, offsetof(struct kvt_sqe, stamp));
	e->reserved = 0;
	c->inflight++;
	return e;
}

KVT_EXPORT int
kvt_submit(struct kvt_client *c)
{
	uint32_t n = c->sq_tail - c->sq_pub;

	if (c->dead || forked(c))
		return c->dead;
	if (!n)
		return 0;
	for (uint32_t i = c->sq_pub; i != c->sq_tail; i++)
		kvt_ring_store_stamp(&c->sqes[i & (c->sq_entries - 1)].stamp, i);
	kvt_ring_store_tail(c->sq, c->sq_tail);
	c->sq_pub = c->sq_tail;
	kvt_ring_fence(); /* pairs with the poller's set-NEED_WAKEUP, fence, re-check */
	if (kvt_ring_needs_wakeup(c->sq) && eventfd_write(c->sq_efd, 1) < 0)
		return -errno;
	return (int)n;
}

static int
cq_pop(struct kvt_client *c, struct kvt_cqe *ret)
{
	const struct kvt_cqe *e = &c->cqes[c->cq_head & (c->cq_entries - 1)];

	/* The stamp, not the CQ tail: a busy wait then touches only the CQE's line. */
	if (!kvt_ring_load_stamp(&e->stamp, c->cq_head))
		return -EAGAIN;
	memcpy(ret, e, sizeof(*ret));
	kvt_ring_store_head(c->cq, ++c->cq_head);
	c->inflight--;
	return 0;
}

KVT_EXPORT int
kvt_peek_cqe(struct kvt_client *c, struct kvt_cqe *ret_cqe)
{
	if (forked(c))
		return c->dead;
	if (c->stash_n) {
		*ret_cqe = c->stash[0];
		memmove(c->stash, c->stash + 1, --c->stash_n * sizeof(*c->stash));
		return 0;
	}
	return cq_pop(c, ret_cqe);
}

/* The control socket spoke while we waited: an error for a dropped session, or EOF. */
static int
session_lost(struct kvt_client *c)
{
	union {
		struct kvt_ctl_hdr hdr;
		struct kvt_ctl_error e;
	} m;
	ssize_t n = recv(c->sock, &m, sizeof(m), MSG_DONTWAIT);

	if (n < 0 && errno == EAGAIN)
		return 0;
	if (n >= (ssize_t)sizeof(m.e) && m.hdr.type == KVT_CTL_ERROR)
		c->dead = ctl_error(&m);
	else
		c->dead = -ECONNRESET;
	return c->dead;
}

static int
wait_raw(struct kvt_client *c, struct kvt_cqe *ret)
{
	uint64_t spin_end;

	if (c->dead)
		return c->dead;
	if (!c->inflight)
		return -EAGAIN;
	if (cq_pop(c, ret) == 0)
		return 0;
	if (c->spin_us) {
		spin_end = now_ns() + (uint64_t)c->spin_us * 1000;
		do {
			/* Several looks per clock read: a look is far cheaper than the clock. */
			for (int i = 0; i < 32; i++)
				if (cq_pop(c, ret) == 0)
					return 0;
		} while (now_ns() < spin_end);
	}
	for (;;) {
		struct pollfd pfd[2] = {{.fd = c->cq_efd, .events = POLLIN},
					{.fd = c->sock, .events = POLLIN | POLLRDHUP}};
		eventfd_t v;
		int r;

		/* Announce the sleep, then look again (pairs with the poller's post, fence,
		 * read-flags in kvtd_session_drain()). */
		kvt_ring_set_flags(c->cq, KVT_RING_NEED_WAKEUP);
		kvt_ring_fence();
		if (cq_pop(c, ret) == 0) {
			kvt_ring_set_flags(c->cq, 0);
			return 0;
		}
		r = poll(pfd, 2, -1);
		kvt_ring_set_flags(c->cq, 0);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (pfd[0].revents & POLLIN)
			eventfd_read(c->cq_efd, &v); /* non-blocking fd: resets the count */
		if (cq_pop(c, ret) == 0)
			return 0;
		if (pfd[1].revents && session_lost(c) < 0)
			return c->dead;
	}
}

KVT_EXPORT int
kvt_wait_cqe(struct kvt_client *c, struct kvt_cqe *ret_cqe)
{
	if (forked(c))
		return c->dead;
	if (c->stash_n)
		return kvt_peek_cqe(c, ret_cqe);
	return wait_raw(c, ret_cqe);
}

/* The daemon's reason for the refused op @ud (kvt_ring.h: the record is a sequence lock). */
static int
op_err_copy(struct kvt_client *c, uint64_t ud, char *buf, size_t len)
{
	struct kvt_op_err x;

	if (!c->op_err)
		return -EOPNOTSUPP;
	/* The daemon writes a record in well under a microsecond; a few tries always do unless
	 * this session's ops keep failing meanwhile. */
	for (int i = 0; i < 64; i++) {
		uint32_t gen = kvt_op_err_read_begin(c->op_err);

		memcpy(&x, c->op_err, sizeof(x));
		if (kvt_op_err_read_retry(c->op_err, gen))
			continue;
		if (x.user_data != ud || x.res >= 0)
			return -ENOENT;
		x.msg[sizeof(x.msg) - 1] = '\0';
		snprintf(buf, len, "%s", x.msg);
		return 0;
	}
	return -ENOENT;
}

KVT_EXPORT int
kvt_op_error(struct kvt_client *c, uint64_t user_data, char *buf, size_t len)
{
	if (!buf || !len)
		return -EINVAL;
	if (forked(c))
		return c->dead;
	return op_err_copy(c, user_data, buf, len);
}

/* ---- blocking wrappers ------------------------------------------------------------------ */

/* Submits @e (already filled, user_data set here) and waits for its own completion. */
static int
run_one(struct kvt_client *c, struct kvt_sqe *e, struct kvt_cqe *ret)
{
	uint64_t ud = c->next_ud++;
	struct kvt_cqe cqe;
	int r;

	e->user_data = ud;
	r = kvt_submit(c);
	if (r < 0) {
		if (c->dead)
			last_error[0] = '\0'; /* nothing stale; kvt_strerror() says it all */
		else
			kvtc_set_error("could not ring kvtierd's doorbell: %s", kvt_strerror(r));
		return r;
	}
	for (;;) {
		r = wait_raw(c, &cqe);
		if (r == -ECONNRESET) /* else the daemon's own message, set by session_lost() */
			last_error[0] = '\0';
		if (r < 0)
			return r;
		if (cqe.user_data == ud)
			break;
		c->stash[c->stash_n++] = cqe;
	}
	if (ret)
		*ret = cqe;
	if (cqe.res < 0 && op_err_copy(c, ud, last_error, sizeof(last_error)) < 0)
		kvtc_set_error("kvtierd refused the op: %s", kvt_strerror(cqe.res));
	return cqe.res;
}

/* An SQE for a blocking op; one that uses the arena owns all of it, so nothing may be in flight. */
static struct kvt_sqe *
sync_sqe(struct kvt_client *c, int uses_arena, int *ret_err)
{
	struct kvt_sqe *e;

	if (forked(c)) {
		*ret_err = c->dead;
		set_last_error(FORK_MSG);
		return NULL;
	}
	*ret_err = c->dead ? c->dead : -EBUSY;
	if (c->dead) {
		last_error[0] = '\0'; /* an earlier refusal's reason must not explain this */
		return NULL;
	}
	if (uses_arena && c->inflight) {
		set_last_error(
		    "operations in flight: a blocking call with a payload needs the whole "
		    "arena (reap them first)");
		return NULL;
	}
	e = kvt_get_sqe(c);
	if (!e)
		set_last_error("the submission queue is full (reap completions first)");
	return e;
}

/* As sync_sqe(), with @len bytes of @data copied to the start of the arena. */
static struct kvt_sqe *
payload_sqe(struct kvt_client *c, const void *data, uint64_t len, int *ret_err)
{
	struct kvt_sqe *e;

	*ret_err = -E2BIG;
	if (len > c->arena_size || len > UINT32_MAX) {
		kvtc_set_error("payload of %llu bytes is larger than the %llu-byte arena",
			       (unsigned long long)len, (unsigned long long)c->arena_size);
		return NULL;
	}
	e = sync_sqe(c, 1, ret_err);
	if (e)
		memcpy(c->arena, data, len);
	return e;
}

KVT_EXPORT int
kvt_nop(struct kvt_client *c)
{
	int r;
	struct kvt_sqe *e = sync_sqe(c, 0, &r);

	if (!e)
		return r;
	kvt_prep_nop(e);
	return run_one(c, e, NULL);
}

/* A CUDA buffer registered inside an allocation is, to the daemon, the allocation from its
 * start: layouts in it move by the buffer's offset. */
static int
seq_params_rebase(const struct kvt_client *c, struct kvt_seq_params *q)
{
	for (const struct kvt_buf *b = c->bufs; b; b = b->next) {
		if (!b->offset)
			continue;
		if (b->id == q->t0_buf_id) {
			if (q->t0_base_off > UINT64_MAX - b->offset)
				return -ERANGE;
			q->t0_base_off += b->offset;
		}
		if (b->id == q->stage_buf_id) {
			if (q->stage_base_off > UINT64_MAX - b->offset)
				return -ERANGE;
			q->stage_base_off += b->offset;
		}
	}
	return 0;
}

KVT_EXPORT int
kvt_seq_open_prefix(struct kvt_client *c, const struct kvt_seq_params *p, uint32_t ns,
		    uint32_t prefix_blocks, uint32_t *ret_seq)
{
	struct kvt_seq_params q = *p;
	int r;
	struct kvt_sqe *e;

	r = seq_params_rebase(c, &q);
	if (r < 0) {
		set_last_error("a T0 or staging offset overflows with its buffer's offset");
		return r;
	}
	e = payload_sqe(c, &q, sizeof(q), &r);
	if (!e)
		return r;
	kvt_prep_seq_open_prefix(e, 0, ns, prefix_blocks);
	r = run_one(c, e, NULL);
	if (r > 0) {
		*ret_seq = (uint32_t)r;
		r = 0;
	}
	return r;
}

KVT_EXPORT int
kvt_seq_open(struct kvt_client *c, const struct kvt_seq_params *p, uint32_t *ret_seq)
{
	return kvt_seq_open_prefix(c, p, 0, 0, ret_seq);
}

KVT_EXPORT int
kvt_seq_close(struct kvt_client *c, uint32_t seq)
{
	int r;
	struct kvt_sqe *e = sync_sqe(c, 0, &r);

	if (!e)
		return r;
	kvt_prep_seq_close(e, seq);
	return run_one(c, e, NULL);
}

KVT_EXPORT int64_t
kvt_append(struct kvt_client *c, uint32_t seq, const void *rows, uint64_t len, uint32_t ntok,
	   uint64_t *ret_first)
{
	struct kvt_cqe cqe;
	struct kvt_sqe *e;
	int r;

	e = payload_sqe(c, rows, len, &r);
	if (!e)
		return r;
	kvt_prep_append(e, seq, 0, (uint32_t)len, ntok);
	r = run_one(c, e, &cqe);
	if (r >= 0 && ret_first)
		*ret_first = cqe.aux[0];
	return r;
}

KVT_EXPORT int64_t
kvt_append_t0(struct kvt_client *c, uint32_t seq, const uint32_t *slots, uint32_t ntok)
{
	struct kvt_sqe *e;
	int r;

	e = payload_sqe(c, slots, (uint64_t)ntok * sizeof(uint32_t), &r);
	if (!e)
		return r;
	kvt_prep_append_t0(e, seq, 0, ntok);
	return run_one(c, e, NULL);
}

KVT_EXPORT int
kvt_score_add(struct kvt_client *c, uint32_t seq, uint64_t first, const float *values, uint32_t n)
{
	struct kvt_sqe *e;
	int r;

	e = payload_sqe(c, values, (uint64_t)n * sizeof(float), &r);
	if (!e)
		return r;
	kvt_prep_score_add(e, seq, first, 0, n);
	return run_one(c, e, NULL);
}

KVT_EXPORT int
kvt_seq_stat(struct kvt_client *c, uint32_t seq, struct kvt_seq_stat *ret_stat)
{
	struct kvt_sqe *e = NULL;
	int r;

	e = sync_sqe(c, 1, &r);
	if (!e)
		return r;
	kvt_prep_seq_stat(e, seq, 0);
	r = run_one(c, e, NULL);
	if (r >= 0) {
		memcpy(ret_stat, c->arena, sizeof(*ret_stat));
		r = 0;
	}
	return r;
}

KVT_EXPORT int
kvt_retier(struct kvt_client *c, uint32_t seq, void *out, uint64_t out_len)
{
	struct kvt_sqe *e;
	int r;

	if (out_len > c->arena_size)
		out_len = c->arena_size;
	if (out_len > UINT32_MAX)
		out_len = UINT32_MAX & ~7u;
	e = sync_sqe(c, 1, &r);
	if (!e)
		return r;
	kvt_prep_retier(e, seq, 0, (uint32_t)out_len);
	r = run_one(c, e, NULL);
	if (r > 0 && (uint64_t)r > out_len) { /* the daemon's count is not trusted with @out */
		kvtc_set_error(
		    "kvtierd answered RETIER with %d bytes, more than the %llu asked for", r,
		    (unsigned long long)out_len);
		return -EMSGSIZE;
	}
	if (r > 0)
		memcpy(out, c->arena, (size_t)r);
	return r;
}

KVT_EXPORT int
kvt_fetch(struct kvt_client *c, uint32_t seq, unsigned flags, uint32_t layer0, uint32_t nlayers,
	  uint32_t stage_row, uint32_t *pos, uint32_t count)
{
	uint64_t len = (uint64_t)count * sizeof(uint32_t);
	struct kvt_sqe *e;
	int r;

	if (len > c->arena_size)
		len = c->arena_size & ~3ull; /* as many positions as the arena holds */
	if ((flags & KVT_FETCH_F_LIST) && len != (uint64_t)count * sizeof(uint32_t)) {
		kvtc_set_error("%u positions are more than the %llu-byte arena holds", count,
			       (unsigned long long)c->arena_size);
		return -E2BIG;
	}
	e = sync_sqe(c, 1, &r);
	if (!e)
		return r;
	if (flags & KVT_FETCH_F_LIST)
		memcpy(c->arena, pos, len);
	kvt_prep_fetch(e, seq, flags, layer0, nlayers, stage_row, 0, (uint32_t)(len / 4));
	r = run_one(c, e, NULL);
	if (r > 0 && !(flags & KVT_FETCH_F_LIST) && (uint64_t)r > len / 4) {
		kvtc_set_error(
		    "kvtierd answered FETCH with %d positions, more than the %llu asked for", r,
		    (unsigned long long)(len / 4));
		return -EMSGSIZE;
	}
	if (r > 0 && !(flags & KVT_FETCH_F_LIST))
		memcpy(pos, c->arena, (size_t)r * sizeof(uint32_t));
	return r;
}

KVT_EXPORT int
kvt_fetch_rows(struct kvt_client *c, uint32_t seq, uint32_t layer0, uint32_t nlayers,
	       const struct kvt_buf *buf, const uint32_t *pos, const uint32_t *rows, uint32_t count)
{
	uint64_t len = (uint64_t)count * 2 * sizeof(uint32_t);
	struct kvt_sqe *e;
	int r;

	if (c->abi_minor < 6) {
		kvtc_set_error("FETCH to listed rows needs kvtierd of ABI %d.6; this one is %d.%u",
			       KVT_ABI_MAJOR, KVT_ABI_MAJOR, c->abi_minor);
		return -EOPNOTSUPP;
	}
	if (len > c->arena_size) {
		kvtc_set_error(
		    "%u positions and their rows are more than the %llu-byte arena holds", count,
		    (unsigned long long)c->arena_size);
		return -E2BIG;
	}
	e = sync_sqe(c, 1, &r);
	if (!e)
		return r;
	memcpy(c->arena, pos, (size_t)count * sizeof(uint32_t));
	memcpy((uint32_t *)c->arena + count, rows, (size_t)count * sizeof(uint32_t));
	kvt_prep_fetch_rows(e, seq, layer0, nlayers, buf ? kvt_buf_id(buf) : 0, 0, count);
	return run_one(c, e, NULL);
}

/* The op_flags of TOPK's SQE form (ABI 1.0-1.4) for a mode, or -1 where it has none. */
static int
topk_sqe_flags(uint32_t mode)
{
	switch (mode) {
	case KVT_TOPK_EXACT:
		return 0;
	case KVT_TOPK_ESTIMATE:
		return KVT_TOPK_F_ESTIMATE;
	case KVT_TOPK_FAST:
	case KVT_TOPK_PROBE:
		return KVT_TOPK_F_FAST;
	default:
		return -1;
	}
}

KVT_EXPORT int
kvt_topk_run(struct kvt_client *c, uint32_t seq, const struct kvt_topk_req *req, const float *query,
	     void *out)
{
	struct kvt_topk_req r;
	uint64_t req_off = 0, q_off, out_off;
	struct kvt_sqe *e;
	int rc, f;

	if (!req || req->size < KVT_TOPK_REQ_SIZE0 || req->size > sizeof(r)) {
		kvtc_set_error("kvt_topk_run: set req->size = sizeof(struct kvt_topk_req)");
		return -EINVAL;
	}
	/* a caller built with an older, shorter struct: the fields it lacks read as zero */
	memset(&r, 0, sizeof(r));
	memcpy(&r, req, req->size);
	/* a kvtierd older than ABI 1.5 takes the SQE form, which says the same in op_flags */
	f = topk_sqe_flags(r.mode);
	if (c->abi_minor < 5 && (f < 0 || r.flags & ~(KVT_TOPK_F_UNION | KVT_TOPK_F_FETCH) ||
				 r.reserved[0] || r.reserved[1])) {
		kvtc_set_error("kvtierd speaks ABI %u.%u: this TOPK request needs 1.5",
			       KVT_ABI_MAJOR, c->abi_minor);
		return -EOPNOTSUPP;
	}
	q_off = c->abi_minor < 5 ? 0 : sizeof(r);
	out_off = (q_off + r.query_len + 63) & ~63ull;
	if (out_off > c->arena_size || r.out_len > c->arena_size - out_off) {
		kvtc_set_error("the query and the output do not fit the %llu-byte arena",
			       (unsigned long long)c->arena_size);
		return -E2BIG;
	}
	e = sync_sqe(c, 1, &rc);
	if (!e)
		return rc;
	memcpy(c->arena + q_off, query, r.query_len);
	r.query_off = q_off;
	r.out_off = out_off;
	if (c->abi_minor < 5) {
		kvt_prep_rw(e, KVT_OP_TOPK, seq, (unsigned)f | r.flags, q_off, r.query_len, r.k,
			    r.layer, out_off, r.out_len);
		e->probe = r.probe;
	} else {
		memcpy(c->arena + req_off, &r, sizeof(r));
		kvt_prep_topk(e, seq, req_off);
	}
	rc = run_one(c, e, NULL);
	if (rc > 0)
		memcpy(out, c->arena + out_off, r.out_len);
	return rc;
}

KVT_EXPORT int
kvt_topk(struct kvt_client *c, uint32_t seq, uint32_t layer, uint32_t k, unsigned flags,
	 const float *query, uint32_t q_len, void *out, uint64_t out_len)
{
	return kvt_topk_probe(c, seq, layer, k, flags, 0, query, q_len, out, out_len);
}

KVT_EXPORT int
kvt_topk_probe(struct kvt_client *c, uint32_t seq, uint32_t layer, uint32_t k, unsigned flags,
	       uint32_t probe, const float *query, uint32_t q_len, void *out, uint64_t out_len)
{
	struct kvt_topk_req r = {.size = sizeof(r), .layer = layer, .k = k, .probe = probe};
	uint64_t qbytes = (uint64_t)q_len * sizeof(float);

	/* The SQE form's rules, as a kvtierd of ABI 1.4 applied them. */
	if ((flags & KVT_TOPK_F_ESTIMATE) && (flags & KVT_TOPK_F_FAST)) {
		kvtc_set_error("TOPK: KVT_TOPK_F_ESTIMATE and KVT_TOPK_F_FAST exclude each other "
			       "(pick one)");
		return -EINVAL;
	}
	if (probe && !(flags & KVT_TOPK_F_FAST)) {
		kvtc_set_error("TOPK: probe %u without KVT_TOPK_F_FAST (set both, or probe 0)",
			       probe);
		return -EINVAL;
	}
	if (flags &
	    ~(KVT_TOPK_F_UNION | KVT_TOPK_F_FETCH | KVT_TOPK_F_ESTIMATE | KVT_TOPK_F_FAST)) {
		kvtc_set_error("TOPK: flags %#x has bits TOPK does not define", flags);
		return -EINVAL;
	}
	if (qbytes > UINT32_MAX || out_len > UINT32_MAX) {
		kvtc_set_error("the query and the output do not fit the %llu-byte arena",
			       (unsigned long long)c->arena_size);
		return -E2BIG;
	}
	r.mode = probe				 ? KVT_TOPK_PROBE
		 : (flags & KVT_TOPK_F_FAST)	 ? KVT_TOPK_FAST
		 : (flags & KVT_TOPK_F_ESTIMATE) ? KVT_TOPK_ESTIMATE
						 : KVT_TOPK_EXACT;
	r.flags = flags & (KVT_TOPK_F_UNION | KVT_TOPK_F_FETCH);
	r.query_len = (uint32_t)qbytes;
	r.out_len = (uint32_t)out_len;
	return kvt_topk_run(c, seq, &r, query, out);
}

/* ---- prefix blocks ------------------------------------------------------------------------ */

KVT_EXPORT int
kvt_ns_open(struct kvt_client *c, const struct kvt_ns_params *np, uint32_t *ret_ns)
{
	struct kvt_sqe *e;
	int r;

	e = payload_sqe(c, np, sizeof(*np), &r);
	if (!e)
		return r;
	kvt_prep_ns_open(e, 0);
	r = run_one(c, e, NULL);
	if (r > 0) {
		*ret_ns = (uint32_t)r;
		r = 0;
	}
	return r;
}

KVT_EXPORT int
kvt_ns_close(struct kvt_client *c, uint32_t ns)
{
	int r;
	struct kvt_sqe *e = sync_sqe(c, 0, &r);

	if (!e)
		return r;
	kvt_prep_ns_close(e, ns);
	return run_one(c, e, NULL);
}

/* Little-endian bytes of @v at @p. */
static uint8_t *
put_le(uint8_t *p, uint64_t v, unsigned bytes)
{
	for (unsigned i = 0; i < bytes; i++)
		*p++ = (uint8_t)(v >> (8 * i));
	return p;
}

static struct kvt_block_key
key_of(XXH128_hash_t h)
{
	return (struct kvt_block_key){.lo = h.low64, .hi = h.high64};
}

KVT_EXPORT int
kvt_block_keys(const struct kvt_ns_params *np, const struct kvt_block_key *parent,
	       const uint32_t *tokens, size_t ntok, struct kvt_block_key *keys, size_t max)
{
	size_t len = strnlen(np->name, sizeof(np->name)), n;
	uint32_t bt = np->block_tokens ? np->block_tokens : KVT_BLOCK_TOKENS_DEFAULT;
	uint8_t buf[16 + 4 * KVT_BLOCK_TOKENS_MAX], *p = buf;
	struct kvt_block_key prev;

	/* The daemon's NS_OPEN checks, so a key never names a namespace that cannot exist. */
	if (np->size < sizeof(*np) || !np->layers || np->layers > KVT_MAX_LAYERS || !np->kv_heads ||
	    np->kv_heads > KVT_MAX_KV_HEADS || !np->head_dim || np->head_dim > KVT_MAX_HEAD_DIM ||
	    np->dtype >= KVT_DTYPE__COUNT || bt > KVT_BLOCK_TOKENS_MAX || !len ||
	    len == sizeof(np->name)) {
		set_last_error("the namespace parameters are not valid (see struct kvt_ns_params)");
		return -EINVAL;
	}
	if (parent) {
		prev = *parent;
	} else {
		/* the namespace's identity, in a fixed byte order */
		memcpy(p, "kvtier-ns1", 10);
		p += 10;
		p = put_le(p, np->layers, 2);
		p = put_le(p, np->kv_heads, 2);
		p = put_le(p, np->head_dim, 2);
		p = put_le(p, np->dtype, 1);
		p = put_le(p, bt, 4);
		memcpy(p, np->name, len);
		prev = key_of(XXH3_128bits(buf, (size_t)(p - buf) + len));
	}
	n = ntok / bt < max ? ntok / bt : max;
	for (size_t i = 0; i < n; i++) {
		p = put_le(buf, prev.lo, 8);
		p = put_le(p, prev.hi, 8);
		for (uint32_t t = 0; t < bt; t++)
			p = put_le(p, tokens[i * bt + t], 4);
		prev = key_of(XXH3_128bits(buf, (size_t)(p - buf)));
		keys[i] = prev;
	}
	return n > INT32_MAX ? INT32_MAX : (int)n;
}

/* @n keys to the start of the arena for LOOKUP or PUBLISH. */
static struct kvt_sqe *
keys_sqe(struct kvt_client *c, const struct kvt_block_key *keys, uint32_t n, int *ret_err)
{
	if (!n) {
		*ret_err = -EINVAL;
		set_last_error("no block keys");
		return NULL;
	}
	return payload_sqe(c, keys, (uint64_t)n * sizeof(*keys), ret_err);
}

KVT_EXPORT int
kvt_lookup(struct kvt_client *c, uint32_t ns, const struct kvt_block_key *keys, uint32_t n,
	   unsigned flags)
{
	struct kvt_sqe *e;
	int r;

	e = keys_sqe(c, keys, n, &r);
	if (!e)
		return r;
	kvt_prep_lookup(e, ns, flags, 0, n);
	return run_one(c, e, NULL);
}

KVT_EXPORT int
kvt_publish(struct kvt_client *c, uint32_t seq, const struct kvt_block_key *keys, uint32_t n,
	    uint32_t *ret_new)
{
	struct kvt_cqe cqe;
	struct kvt_sqe *e;
	int r;

	e = keys_sqe(c, keys, n, &r);
	if (!e)
		return r;
	kvt_prep_publish(e, seq, 0, n);
	r = run_one(c, e, &cqe);
	if (r >= 0 && ret_new)
		*ret_new = (uint32_t)cqe.aux[0];
	return r;
}

KVT_EXPORT const char *
kvt_strerror(int err)
{
	switch (err) {
	case 0:
		return "success";
	case -EDQUOT:
		return "pool quota exceeded for this session or user";
	case -ENOMEM:
		return "kvtierd's pool is exhausted (or out of memory)";
	case -ECONNRESET:
		return "connection to kvtierd lost";
	case -EPROTO:
		return "protocol error: ABI mismatch or corrupted ring";
	case -ENOENT:
		return "no such sequence, buffer or socket";
	case -ECONNREFUSED:
		return "kvtierd is not running";
	case -EUSERS:
		return "kvtierd session limit reached";
	case -EOPNOTSUPP:
		return "operation not supported by this kvtierd";
	case -EBUSY:
		return "busy: resource in use or operations in flight";
	case -EACCES:
		return "not allowed to use kvtierd";
	case -EMFILE:
		return "too many sequences or buffers in this session";
	case -ECHILD:
		return "client used after fork(): a child must connect its own session";
	case -EMSGSIZE:
		return "kvtierd's reply is larger than the caller's buffer";
	default:
		return err < 0 ? strerror(-err) : "unknown error";
	}
}
