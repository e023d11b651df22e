/* SPDX-License-Identifier: MIT */
/*
 * restart.c - restart in place (restart.h), the old process's side: the pre-flight, the live
 * state as the image's records, the exec and its watcher (the teardown child), and the verdict
 * the new process gives it. The image's bytes are restart_image.c's; the new process's restore
 * from the records is restart_restore.c's.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "conn.h"
#include "kvt_dev.h"
#include "kvt_ring.h"
#include "kvtd.h"
#include "log.h"
#include "poller.h"
#include "restart.h"
#include "restart_int.h"
#include "restart_image.h"
#include "seq.h"
#include "session.h"
#include "spill.h"

/* ---- writing (old process) ---------------------------------------------------------------- */

struct fdlist {
	int *fd;
	unsigned n, cap;
	int err;
};

static void
fd_add(struct fdlist *l, int fd)
{
	if (l->err)
		return;
	if (l->n == l->cap) {
		unsigned cap = l->cap ? 2 * l->cap : 64;
		int *p = realloc(l->fd, cap * sizeof(int));

		if (!p) {
			l->err = -ENOMEM;
			return;
		}
		l->fd = p;
		l->cap = cap;
	}
	l->fd[l->n++] = fd;
}

/* The live state as the image's records (restart_image.h's struct img_src). */
struct write_ctx {
	struct kvtd *d;
	struct fdlist *fds;
	struct kvtd_conn_info *ci; /* every connection, gathered first */
	uint32_t n_ci, cap_ci;
	uint64_t bucket;	      /* the block walk: the next bucket of px->tab */
	struct kvtd_pblock *next_blk; /* and the next block in the current one */
	uint64_t off[KVT_BLOCK_TOKENS_MAX];
};

static int
gather_conn(void *ctx, const struct kvtd_conn_info *ci)
{
	struct write_ctx *x = ctx;

	if (x->n_ci == x->cap_ci) {
		uint32_t cap = x->cap_ci ? 2 * x->cap_ci : 64;
		struct kvtd_conn_info *p = realloc(x->ci, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		x->ci = p;
		x->cap_ci = cap;
	}
	x->ci[x->n_ci++] = *ci;
	return 0;
}

/* The blocks in the order of the store's table: each gets the number it has in the image. */
static int
src_blk(void *ctx, uint32_t i, struct img_blk *b)
{
	struct write_ctx *x = ctx;
	struct kvtd_prefix *px = &x->d->prefix;
	struct kvtd_pblock *k;

	while (!x->next_blk && px->tab && x->bucket <= px->tab_mask)
		x->next_blk = px->tab[x->bucket++];
	k = x->next_blk;
	if (!k)
		return -EIO; /* fewer blocks than counted */
	x->next_blk = k->hnext;
	k->img_idx = i;
	memset(b, 0, sizeof(*b));
	b->f.ns = k->ns->img_idx;
	b->f.key = k->key;
	for (uint32_t t = 0; t < k->ns->p.block_tokens; t++)
		x->off[t] = (uint64_t)((uint8_t *)k->slot[t] - x->d->pool.base);
	b->off = x->off;
	return 0;
}

/* A sequence; its computed arrays (slot offsets, block indexes) are malloc'd. */
static int
seq_record(const struct kvtd *d, const struct kvtd_seq *q, struct img_seq *r)
{
	uint32_t n = q->ts.n;
	uint64_t *off;

	r->f.id = q->id;
	r->f.p = q->p;
	r->f.n = n;
	r->f.gen = q->ts.gen;
	r->f.bytes_in = q->bytes_in;
	r->f.bytes_out = q->bytes_out;
	r->f.score_total = q->score_total;
	r->score = q->ts.score;
	r->pos_slot = q->ts.pos_slot;
	r->tier = q->ts.tier;
	off = malloc((size_t)(n ? n : 1) * 8);
	if (!off)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		off[i] = q->slot[i] ? (uint64_t)((uint8_t *)q->slot[i] - d->pool.base) + 1 : 0;
	r->slot_off = off;
	r->v2.ns_id = q->ns ? q->ns->id : 0;
	r->v2.flags = q->no_sketch ? IMG_SEQ_F_NO_SKETCH : 0;
	if (q->ns) {
		uint32_t *idx = malloc((size_t)(n ? n : 1) * 4);

		if (!idx)
			return -ENOMEM;
		for (uint32_t i = 0; i < n; i++)
			idx[i] = q->blk[i] ? q->blk[i]->img_idx + 1 : 0;
		r->blk_idx = idx;
	}
	return 0;
}

/* A connection and its session, the descriptors to carry noted. */
static int
src_conn(void *ctx, uint32_t i, struct img_conn *c)
{
	struct write_ctx *x = ctx;
	const struct kvtd_conn_info *ci = &x->ci[i];
	struct kvtd_session *s = ci->s;
	uint32_t nb = 0, nq = 0;
	int r;

	c->f.fd = ci->fd;
	c->f.state = (uint32_t)ci->state;
	c->f.pid = (uint32_t)ci->pid;
	c->f.uid = (uint32_t)ci->uid;
	c->f.gid = (uint32_t)ci->gid;
	c->f.privileged = (uint32_t)ci->privileged;
	c->f.asker = ci->conn == x->d->restart_conn && ci->conn;
	c->f.has_session = !!s;
	fd_add(x->fds, ci->fd);
	if (!s)
		return x->fds->err;
	c->s.id = s->id;
	memcpy(c->s.name, s->name, sizeof(c->s.name));
	c->s.start_ns = s->start_ns;
	c->s.memfd = s->memfd;
	c->s.sq_efd = s->sq_efd;
	c->s.cq_efd = s->cq_efd;
	c->s.sq_entries = s->sq_entries;
	c->s.cq_entries = s->cq_entries;
	c->s.arena_size = s->arena_size;
	c->s.sq_head = s->sq_head;
	c->s.cq_tail = s->cq_tail;
	c->s.cq_head_seen = s->cq_head_seen;
	c->s.op_err_gen = s->op_err_gen;
	c->s.ops = s->ops;
	c->s.errors = s->errors;
	fd_add(x->fds, s->memfd);
	fd_add(x->fds, s->sq_efd);
	fd_add(x->fds, s->cq_efd);
	for (unsigned k = 0; k < s->max_bufs; k++)
		nb += s->bufs[k] != NULL;
	for (unsigned k = 0; k < s->max_seqs; k++)
		nq += s->seqs[k] != NULL;
	c->bufs = calloc(nb ? nb : 1, sizeof(*c->bufs));
	c->seqs = calloc(nq ? nq : 1, sizeof(*c->seqs));
	if (!c->bufs || !c->seqs)
		return -ENOMEM;
	for (unsigned k = 0; k < s->max_bufs; k++) {
		int fd;

		if (!s->bufs[k])
			continue;
		fd = kvt_dev_buf_fd(s->bufs[k]);
		if (fd < 0)
			return fd;
		c->bufs[c->s.n_bufs].id = k + 1;
		c->bufs[c->s.n_bufs].size = kvt_dev_buf_size(s->bufs[k]);
		c->bufs[c->s.n_bufs].fd = fd;
		c->s.n_bufs++;
		fd_add(x->fds, fd);
	}
	for (unsigned k = 0; k < s->max_seqs; k++) {
		if (!s->seqs[k])
			continue;
		r = seq_record(x->d, s->seqs[k], &c->seqs[c->s.n_seqs++]);
		if (r < 0)
			return r;
	}
	c->v2.prefix_scope = s->prefix_scope;
	for (int k = 0; k < KVT_MAX_NS; k++) {
		const struct kvtd_ns_handle *h = &s->ns[k];
		uint32_t *pins;

		if (!h->ns)
			continue;
		pins = malloc((size_t)(h->n_pins ? h->n_pins : 1) * 4);
		if (!pins)
			return -ENOMEM;
		for (uint32_t p = 0; p < h->n_pins; p++)
			pins[p] = h->pins[p]->img_idx;
		c->nsh[k].f.ns_id = h->ns->id;
		c->nsh[k].f.n_pins = h->n_pins;
		c->nsh[k].pins = pins;
	}
	return x->fds->err;
}

static void
src_conn_done(void *ctx, struct img_conn *c)
{
	(void)ctx;
	for (uint32_t k = 0; c->seqs && k < c->s.n_seqs; k++) {
		free((void *)c->seqs[k].slot_off);
		free((void *)c->seqs[k].blk_idx);
	}
	for (int k = 0; k < KVT_MAX_NS; k++)
		free((void *)c->nsh[k].pins);
	free(c->bufs);
	free(c->seqs);
}

/* The image of @d, pollers quiesced. Returns 0 with the bytes in *@ret_buf (*@ret_len) and the
 * descriptors to carry in @fds, or -errno. */
static int
image_write(struct kvtd *d, uint8_t **ret_buf, size_t *ret_len, struct fdlist *fds)
{
	struct kvtd_prefix *px = &d->prefix;
	struct kvtd_image img;
	struct write_ctx x = {.d = d, .fds = fds};
	struct img_src src = {&x, src_blk, src_conn, src_conn_done};
	uint32_t n_ns = 0;
	int r;

	memset(&img, 0, sizeof(img));
	img.d.next_session_id = d->next_session_id;
	img.d.restarts = d->restarts;
	img.d.start_ns = d->start_ns;
	img.d.restart_started_ns = d->restart_started_ns;
	img.d.restart_req_id = d->restart_req_id;
	img.d.listen_fd = d->listen_fd;
	img.d.lock_fd = d->lock_fd;
	img.d.sock_dev = (uint64_t)d->sock_dev;
	img.d.sock_ino = (uint64_t)d->sock_ino;
	img.d.pool_fd = d->pool.fd;
	img.d.pool_hugetlb = (uint32_t)d->pool.hugetlb;
	img.d.pool_size = d->pool.size;
	img.d.chunk_size = d->pool.chunk_size;
	img.d.pool_base = (uint64_t)(uintptr_t)d->pool.base;
	img.d.cnt[0] = atomic_load(&d->cnt.ops);
	img.d.cnt[1] = atomic_load(&d->cnt.errors);
	img.d.cnt[2] = atomic_load(&d->cnt.refused_einval);
	img.d.cnt[3] = atomic_load(&d->cnt.refused_auth);
	img.d.cnt[4] = atomic_load(&d->cnt.refused_hello_timeout);
	img.d.cnt[5] = atomic_load(&d->cnt.refused_limit);
	img.d.cnt[6] = atomic_load(&d->cnt.sessions_total);
	img.d.cnt[7] = atomic_load(&d->cnt.ring_corrupt);
	/* The prefix store. Linear in namespaces and blocks: the pause must not grow faster than
	 * the store. */
	for (struct kvtd_pns *ns = px->ns_list; ns; ns = ns->next)
		n_ns++;
	img.ns = calloc(n_ns + 1, sizeof(*img.ns));
	if (!img.ns)
		return -ENOMEM;
	n_ns = 0;
	for (struct kvtd_pns *ns = px->ns_list; ns; ns = ns->next) {
		struct img_ns_f *f = &img.ns[n_ns].f;

		ns->img_idx = n_ns++;
		f->id = ns->id;
		f->scope = ns->scope;
		f->p = ns->p;
		f->cnt[0] = ns->lookups;
		f->cnt[1] = ns->hit_blocks;
		f->cnt[2] = ns->miss_blocks;
		f->cnt[3] = ns->published;
		f->cnt[4] = ns->deduped;
		f->cnt[5] = ns->evicted;
	}
	img.px.n_ns = n_ns;
	img.px.n_blk = (uint32_t)px->n_blocks;
	img.px.cnt[0] = px->lookups;
	img.px.cnt[1] = px->hit_blocks;
	img.px.cnt[2] = px->miss_blocks;
	img.px.cnt[3] = px->published;
	img.px.cnt[4] = px->deduped;
	img.px.cnt[5] = px->evicted;
	img.px.cnt[6] = px->refused_budget;
	fd_add(fds, d->listen_fd);
	fd_add(fds, d->lock_fd);
	fd_add(fds, d->pool.fd);
	r = kvtd_loop_conns(d, gather_conn, &x);
	img.nc.n_conns = x.n_ci;
	if (r == 0)
		r = kvtd_image_encode(&img, &src, KVTD_IMAGE_VERSION, ret_buf, ret_len);
	if (r == 0 && fds->err)
		r = fds->err;
	free(img.ns);
	free(x.ci);
	return r;
}

/*
 * The teardown child: it shares the daemon's address space (CLONE_VM, not a thread) and waits
 * for the exec, which closes the pipe's write end. The exec then only drops its reference to
 * the old address space and the child, exiting, unmaps it: the pool's page tables (and its
 * munlock) are torn down after the new process runs, not inside execve, where a 1 GiB pool of
 * 4 KiB pages cost 340 ms of the pause. Raw syscalls only, no sanitizer hooks: the child runs on
 * the parent's thread pointer.
 *
 * It is also the watcher of the fallback (restart.h): it keeps the descriptors the exec carries
 * (and the old binary's) until the new process writes its verdict, and on 'F' or the pipe's end
 * without one executes the old binary with the same image.
 */
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_execveat
#define SYS_execveat 322
#endif
#define TEARDOWN_FD_MAX 65536 /* without close_range(2): the descriptor numbers closed */
#define STR_(x)		#x
#define STR(x)		STR_(x)

struct watch {
	int p[4];     /* p[0], p[1]: the exec pipe; p[2], p[3]: the child has closed */
	int rd;	      /* the verdict pipe's read end, -1: teardown only */
	int kill;     /* the new binary promised a verdict: none in time is a failure */
	int exe_fd;   /* the old binary */
	pid_t parent; /* the restarting process (the new one after the exec) */
	int *keep;    /* ascending: the descriptors kept open (p[0], rd, exe_fd, carried) */
	unsigned n_keep;
	char **argv;	   /* the old binary's arguments with --restore-fd */
	char **envp;	   /* its environment; envp[n_env] points at why_env */
	char why_env[512]; /* KVTD_FALLBACK_ENV "=" the reason */
	/* under systemd: the watcher is the unit's main pid from before the exec until it lets
	 * go, when it hands that back to the restarting pid (MAINPID=) and closes ack_w */
	struct sockaddr_un notify_addr;
	socklen_t notify_len; /* 0: not under systemd */
	char mainpid_msg[32]; /* "MAINPID=<parent>" */
	int ack_w;	      /* -1: none */
};

/* The teardown child's helpers run on its parent's thread pointer, like it: no sanitizer hooks.
 */
#define RAW_CHILD __attribute__((no_sanitize_address, no_sanitize_thread, no_sanitize_undefined))

RAW_CHILD static void
raw_close_from_to(int lo, int hi) /* [lo, hi), hi < 0: to the end */
{
	long end = hi < 0 ? TEARDOWN_FD_MAX : hi;

	if (hi >= 0 && lo >= hi)
		return;
	if (syscall(SYS_close_range, (unsigned)lo, hi < 0 ? ~0U : (unsigned)hi - 1, 0U) < 0)
		for (long fd = lo; fd < end; fd++)
			syscall(SYS_close, fd);
}

RAW_CHILD static void
raw_append(char *dst, size_t cap, const char *src)
{
	size_t n = 0;

	while (n < cap - 1 && dst[n])
		n++;
	while (n < cap - 1 && *src)
		dst[n++] = *src++;
	dst[n] = '\0';
}

/*
 * sd_notify() of @msg to the service manager, then a barrier (BARRIER=1 with a pipe's write
 * end, which the manager closes once it has processed what came before), waited for 5 s at
 * most: MAINPID= is in force when this returns.
 */
RAW_CHILD static void
raw_notify(const struct watch *w, const char *msg, size_t len)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = {.iov_base = (void *)msg, .iov_len = len};
	struct msghdr mh = {.msg_name = (void *)&w->notify_addr,
			    .msg_namelen = w->notify_len,
			    .msg_iov = &iov,
			    .msg_iovlen = 1};
	struct timespec ts = {.tv_sec = 5};
	struct pollfd pf;
	int bp[2];
	long fd = syscall(SYS_socket, AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return;
	syscall(SYS_sendmsg, fd, &mh, MSG_NOSIGNAL);
	if (syscall(SYS_pipe2, bp, O_CLOEXEC) == 0) {
		iov.iov_base = (void *)"BARRIER=1";
		iov.iov_len = 9;
		u.h.cmsg_level = SOL_SOCKET;
		u.h.cmsg_type = SCM_RIGHTS;
		u.h.cmsg_len = CMSG_LEN(sizeof(int));
		*(int *)(void *)CMSG_DATA(&u.h) = bp[1];
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		syscall(SYS_sendmsg, fd, &mh, MSG_NOSIGNAL);
		syscall(SYS_close, bp[1]);
		pf.fd = bp[0];
		pf.events = POLLIN;
		pf.revents = 0;
		syscall(SYS_ppoll, &pf, 1UL, &ts, NULL, 8UL);
		syscall(SYS_close, bp[0]);
	}
	syscall(SYS_close, fd);
}

/* The restarting pid serves (or the exec failed and the old process goes on): under systemd
 * it is the main pid again, and then it may go on. */
RAW_CHILD __attribute__((noreturn)) static void
raw_let_go(const struct watch *w)
{
	size_t n = 0;

	if (w->notify_len) {
		while (w->mainpid_msg[n])
			n++;
		raw_notify(w, w->mainpid_msg, n);
	}
	if (w->ack_w >= 0)
		syscall(SYS_close, w->ack_w);
	syscall(SYS_exit, 0);
	__builtin_unreachable();
}

RAW_CHILD static int
teardown_child(void *arg)
{
	struct watch *w = arg;
	char c, buf[400];
	long n, got = 0;
	int prev = 0, timed_out = 0;

	/* It holds nothing but what it needs: a copy of the metrics listener (or of any socket)
	 * kept until the old address space is gone would make the new process's bind fail. */
	for (unsigned i = 0; i < w->n_keep; i++) {
		raw_close_from_to(prev, w->keep[i]);
		prev = w->keep[i] + 1;
	}
	raw_close_from_to(prev, -1);
	while ((n = syscall(SYS_read, w->p[0], &c, 1)) < 0)
		;
	if (w->rd < 0) /* no watch */
		syscall(SYS_exit, 0);
	if (n == 1) /* the exec failed: the old process goes on */
		raw_let_go(w);
	/* The verdict: 'R' (taken over), 'F' and a reason, or nothing before the end. */
	for (;;) {
		struct pollfd pf = {.fd = w->rd, .events = POLLIN};
		struct timespec ts = {.tv_sec = KVTD_TAKEOVER_S};

		n = syscall(SYS_ppoll, &pf, 1UL, timed_out ? NULL : &ts, NULL, 8UL);
		if (n == 0) {
			if (!w->kill)
				raw_let_go(w); /* an older kvtierd: alive, so it took over */
			syscall(SYS_kill, w->parent, SIGKILL);
			timed_out = 1;
			continue;
		}
		if (n < 0)
			continue;
		n = syscall(SYS_read, w->rd, buf + got, sizeof(buf) - 1 - (size_t)got);
		if (n < 0)
			continue;
		if (got == 0 && n > 0 && buf[0] == 'R')
			raw_let_go(w); /* the new process serves */
		if (n == 0 || got + n == (long)sizeof(buf) - 1)
			break;
		got += n;
	}
	buf[got] = '\0';
	if (timed_out)
		raw_append(w->why_env, sizeof(w->why_env),
			   "gave no verdict in " STR(KVTD_TAKEOVER_S) " s and was killed");
	else if (got > 1 && buf[0] == 'F')
		raw_append(w->why_env, sizeof(w->why_env), buf + 1);
	else
		raw_append(w->why_env, sizeof(w->why_env),
			   "ended before it took the sessions over (exited or killed at start)");
	syscall(SYS_execveat, w->exe_fd, "", w->argv, w->envp, AT_EMPTY_PATH);
	syscall(SYS_exit, 127); /* nothing more can be done: the sessions end */
	return 0;
}

#if defined(__SANITIZE_THREAD__)
#define KVTD_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVTD_TSAN 1
#endif
#endif

typedef int (*clone_fn)(int (*)(void *), void *, int, void *, ...);

/* libc's clone(). ThreadSanitizer's interceptor runs its own bookkeeping in a CLONE_VM child on
 * the parent's thread state, where it crashes: the watcher would be gone. */
static clone_fn
libc_clone(void)
{
#ifdef KVTD_TSAN
	void *h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
	void *f = h ? dlsym(h, "clone") : NULL;

	if (f)
		return (clone_fn)f;
#endif
	return clone;
}

static int
cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/*
 * Returns the child's pid and sets *ret_wfd (close-on-exec), or -1: the exec then tears down
 * the address space itself, in the pause, and no fallback watches it. With @w->rd >= 0 the child
 * keeps @fds (close-on-exec already cleared) and watches for the verdict.
 */
static pid_t
teardown_start(struct watch *w, const struct fdlist *fds, int *ret_wfd)
{
	const size_t stack = 64 << 10;
	int *p = w->p;
	char c;
	void *st;
	pid_t pid;

	w->n_keep = 0;
	w->keep = calloc((size_t)fds->n + 7, sizeof(*w->keep));
	if (!w->keep)
		return -1;
	if (pipe2(p, O_CLOEXEC) < 0)
		goto err_keep;
	if (pipe2(p + 2, O_CLOEXEC) < 0) {
		close(p[0]);
		close(p[1]);
		goto err_keep;
	}
	w->keep[w->n_keep++] = p[0];
	if (w->rd >= 0) {
		for (int fd = 0; fd < 3; fd++) /* the fallback logs to the same stderr */
			w->keep[w->n_keep++] = fd;
		w->keep[w->n_keep++] = w->rd;
		w->keep[w->n_keep++] = w->exe_fd;
		if (w->ack_w >= 0)
			w->keep[w->n_keep++] = w->ack_w;
		for (unsigned i = 0; i < fds->n; i++)
			w->keep[w->n_keep++] = fds->fd[i];
	}
	qsort(w->keep, w->n_keep, sizeof(*w->keep), cmp_int);
	st = mmap(NULL, stack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1,
		  0);
	if (st == MAP_FAILED) {
		for (int i = 0; i < 4; i++)
			close(p[i]);
		goto err_keep;
	}
	/* The stack and *w stay as they are: they live in the old address space, which the child
	 * ends; the parent only reads w->p afterwards. */
	pid = libc_clone()(teardown_child, (uint8_t *)st + stack, CLONE_VM | SIGCHLD, w);
	close(p[0]);
	close(p[3]);
	while (pid > 0 && read(p[2], &c, 1) < 0 && errno == EINTR)
		; /* EOF: the child closed its copies */
	close(p[2]);
	if (pid < 0) {
		close(p[1]);
		munmap(st, stack);
		goto err_keep;
	}
	*ret_wfd = p[1];
	return pid;
err_keep:
	free(w->keep);
	w->keep = NULL;
	return -1;
}

static void *
reap_thread(void *arg)
{
	/* The teardown child of the previous process is ours now (same pid); kvtierd has no
	 * other children. */
	while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
		;
	return arg;
}

void
kvtd_restart_reaper_start(void)
{
	pthread_t t;

	if (pthread_create(&t, NULL, reap_thread, NULL) == 0)
		pthread_detach(t);
}

static void
set_cloexec(const struct fdlist *l, int on)
{
	for (unsigned i = 0; i < l->n; i++) {
		int f = fcntl(l->fd[i], F_GETFD);

		if (f >= 0)
			fcntl(l->fd[i], F_SETFD, on ? f | FD_CLOEXEC : f & ~FD_CLOEXEC);
	}
}

int
kvtd_restart_take_fd(int *argc, char **argv)
{
	char *end;
	long v;

	if (*argc < 3 || strcmp(argv[*argc - 2], "--restore-fd"))
		return -1;
	v = strtol(argv[*argc - 1], &end, 10);
	if (*end || v < 3 || v > INT_MAX)
		return -1;
	*argc -= 2;
	argv[*argc] = NULL;
	return (int)v;
}

int
kvtd_restart_take_check(int *argc, char **argv)
{
	if (*argc < 2 || strcmp(argv[*argc - 1], "--check-restart"))
		return 0;
	*argc -= 1;
	argv[*argc] = NULL;
	return 1;
}

#define PREFLIGHT_MS 10000 /* the longest a new binary may take to read its configuration */

/* The first line of @s, for a message. */
static const char *
first_line(char *s)
{
	size_t n = strcspn(s, "\n");

	s[n] = '\0';
	return s[0] ? s : "(no output)";
}

/*
 * The pre-flight: "<exe> <arguments> --check-restart", which reads the configuration as the
 * restarted process will and prints KVTD_RESTART_READY with the image version it reads. Run
 * while every session is still served; anything else (a configuration it refuses, a binary
 * that crashes, is not kvtierd, reads only older images or hangs) refuses the restart, the
 * reason logged and in d->restart_why. The exit status is taken when the reaper thread of a
 * restarted process did not take it first: the readiness line decides.
 */
static int
preflight(struct kvtd *d, int *ret_verdict)
{
	posix_spawn_file_actions_t fa;
	char out[512], **argv;
	size_t got = 0;
	uint64_t end = kvtd_now_ns() + (uint64_t)PREFLIGHT_MS * 1000000;
	int p[2], r, st = -1, hung = 0, ver = -1;
	const char *ready;
	pid_t pid;

	argv = calloc((size_t)d->argc + 2, sizeof(*argv));
	if (!argv)
		return -ENOMEM;
	memcpy(argv, d->argv, (size_t)d->argc * sizeof(*argv));
	argv[d->argc] = "--check-restart";
	if (pipe2(p, O_CLOEXEC) < 0) {
		r = -errno;
		free(argv);
		return r;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[1], 1);
	posix_spawn_file_actions_adddup2(&fa, p[1], 2);
	r = posix_spawn(&pid, d->exe, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(p[1]);
	free(argv);
	if (r) {
		close(p[0]);
		snprintf(d->restart_why, sizeof(d->restart_why), "cannot run %.120s: %s", d->exe,
			 strerror(r));
		return -r;
	}
	while (got < sizeof(out) - 1) {
		uint64_t now = kvtd_now_ns();
		struct pollfd pf = {.fd = p[0], .events = POLLIN};
		ssize_t n;

		if (now >= end || poll(&pf, 1, (int)((end - now) / 1000000) + 1) == 0) {
			hung = 1;
			break;
		}
		n = read(p[0], out + got, sizeof(out) - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	out[got] = '\0';
	close(p[0]);
	if (hung || waitpid(pid, &st, WNOHANG) == 0)
		kill(pid, SIGKILL); /* still running with its answer given or not: it is done */
	while (st == -1 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	ready = strstr(out, KVTD_RESTART_READY);
	if (ready)
		sscanf(ready + sizeof(KVTD_RESTART_READY) - 1, "%d", &ver);
	if (ready && ver >= KVTD_IMAGE_VERSION &&
	    (st == -1 || (WIFEXITED(st) && !WEXITSTATUS(st)))) {
		*ret_verdict = strstr(ready, " " KVTD_RESTART_VERDICT) != NULL;
		return 0;
	}
	if (hung)
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "%.120s --check-restart gave no answer in %d s", d->exe,
			 PREFLIGHT_MS / 1000);
	else if (ready)
		snprintf(
		    d->restart_why, sizeof(d->restart_why),
		    "%.120s reads restart images up to version %d; this kvtierd writes version %d",
		    d->exe, ver, KVTD_IMAGE_VERSION);
	else if (st != -1 && WIFSIGNALED(st))
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "%.120s --check-restart was killed by signal %d (%s): a damaged binary?",
			 d->exe, WTERMSIG(st), strsignal(WTERMSIG(st)));
	else if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st))
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "%.120s --check-restart exited %d: %.160s", d->exe, WEXITSTATUS(st),
			 first_line(out));
	else
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "%.120s gave no restart readiness line (not a kvtierd that restarts in "
			 "place?): %.160s",
			 d->exe, first_line(out));
	return -ECANCELED;
}

void
kvtd_restart_record(struct kvtd *d, int argc, char **argv)
{
	static const char deleted[] = " (deleted)";
	ssize_t n = readlink("/proc/self/exe", d->exe, sizeof(d->exe) - 1);

	d->exe[n > 0 ? n : 0] = '\0';
	/* A fallback runs a binary replaced on disk since: the next restart runs the path's. */
	if (n > (ssize_t)sizeof(deleted) && !strcmp(d->exe + n - sizeof(deleted) + 1, deleted))
		d->exe[n - sizeof(deleted) + 1] = '\0';
	/* Opened now: the binary this process runs, whatever the path holds by the next restart,
	 * is what a failed restart falls back to. */
	d->exe_fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	if (d->exe_fd < 0)
		log_warn("cannot open my own binary (%s): a restart that fails after its exec will "
			 "lose the sessions",
			 strerror(errno));
	d->argc = argc;
	d->argv = argv;
}

static int
is_pipe(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

int
kvtd_restart_take_watch(int *ret_ack)
{
	const char *v = getenv(KVTD_WATCH_ENV);
	long fd, ack = -1;
	char *end;

	*ret_ack = -1;
	if (!v)
		return -1;
	fd = strtol(v, &end, 10);
	if (*end == ',')
		ack = strtol(end + 1, &end, 10);
	unsetenv(KVTD_WATCH_ENV);
	/* Pipes only: a variable left over (an older kvtierd between two restarts kept it in its
	 * environment) may name a descriptor that is now a client's socket. */
	if (*end || fd < 3 || fd > INT_MAX || !is_pipe((int)fd) ||
	    fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0)
		return -1;
	if (ack >= 3 && ack <= INT_MAX && is_pipe((int)ack) &&
	    fcntl((int)ack, F_SETFD, FD_CLOEXEC) == 0)
		*ret_ack = (int)ack;
	return (int)fd;
}

char *
kvtd_restart_take_fallback(void)
{
	const char *v = getenv(KVTD_FALLBACK_ENV);
	char *why = v ? strdup(v) : NULL;

	unsetenv(KVTD_FALLBACK_ENV);
	return why;
}

void
kvtd_restart_give_up(struct kvtd *d, const char *why)
{
	char msg[400];
	int n;

	if (d->watch_fd < 0)
		return;
	n = snprintf(msg, sizeof(msg), "F%s", why);
	if (n > (int)sizeof(msg) - 1)
		n = (int)sizeof(msg) - 1;
	log_err("restart: this process %s: the previous binary takes the sessions back", why);
	if (write(d->watch_fd, msg, (size_t)n) < 0)
		log_err("restart: telling the watcher: %s", strerror(errno));
	/* Nothing shared has been changed yet: no cleanup, which could. */
	_exit(1);
}

void
kvtd_restart_took_over(struct kvtd *d)
{
	if (d->watch_fd < 0)
		return;
	if (write(d->watch_fd, "R", 1) != 1)
		log_warn("restart: telling the watcher it may go: %s", strerror(errno));
	close(d->watch_fd);
	d->watch_fd = -1;
}

void
kvtd_restart_await_main(struct kvtd *d)
{
	struct pollfd pf = {.fd = d->watch_ack_fd, .events = POLLIN};
	char c;

	if (d->watch_ack_fd < 0)
		return;
	/* The watcher hands the main pid back (and waits until the service manager has it), then
	 * closes its end: READY=1 from here on is the main pid's. The pollers serve meanwhile. */
	if (poll(&pf, 1, 10000) <= 0 || read(d->watch_ack_fd, &c, 1) != 0)
		log_warn("restart: the watcher did not hand the main pid back in 10 s");
	close(d->watch_ack_fd);
	d->watch_ack_fd = -1;
}

/* $NOTIFY_SOCKET as an address ("@name": abstract), or -ENOENT when not under systemd. */
static int
notify_addr(struct sockaddr_un *sa, socklen_t *ret_len)
{
	const char *e = getenv("NOTIFY_SOCKET");
	size_t n = e ? strlen(e) : 0;

	if (!n || n >= sizeof(sa->sun_path) || (e[0] != '/' && e[0] != '@'))
		return -ENOENT;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, e, n);
	if (e[0] == '@')
		sa->sun_path[0] = '\0';
	*ret_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (e[0] == '/'));
	return 0;
}

int
kvtd_restart(struct kvtd *d)
{
	/* read by the watcher after the exec, in the old address space: never freed then */
	static struct watch wt;
	uint8_t *img_buf = NULL;
	size_t img_len = 0;
	struct fdlist fds = {0};
	char fdarg[16], watch_env[48], **argv = NULL, **envp = NULL, **fb_envp = NULL;
	int r, img_fd = -1, twfd = -1, vp[2] = {-1, -1}, ap[2] = {-1, -1}, verdict = 0;
	size_t n_env = 0;
	pid_t tpid;

	d->restart_why[0] = '\0';
	if (kvt_dev_kind(d->dev) != KVT_DEV_HOST || d->pool.fd < 0) {
		log_err(
		    "restart: the %s backend cannot restart in place yet (device registrations "
		    "and IPC mappings are not carried over); restart the service instead, which "
		    "ends every session",
		    kvt_dev_name(d->dev));
		return -EOPNOTSUPP;
	}
	if (!d->exe[0] || access(d->exe, X_OK) < 0) {
		r = -errno;
		log_err("restart: cannot execute %s: %s", d->exe[0] ? d->exe : "(unknown binary)",
			strerror(-r));
		return r ? r : -ENOENT;
	}
	/* Before anything is stopped: a restart the new binary or configuration would fail is
	 * refused here, every session kept. */
	r = preflight(d, &verdict);
	if (r < 0) {
		if (!d->restart_why[0])
			snprintf(d->restart_why, sizeof(d->restart_why), "pre-flight of %.120s: %s",
				 d->exe, strerror(-r));
		log_err("restart refused: %s (still serving every session)", d->restart_why);
		return r;
	}
	d->restart_started_ns = kvtd_now_ns();
	/* Quiesce: with every poller's lock held no op runs; SQEs not yet drained stay in their
	 * rings. NEED_WAKEUP on every SQ makes clients ring their doorbell meanwhile; the count
	 * waits in the eventfd for the next process's poller. */
	for (unsigned i = 0; i < d->n_pollers; i++) {
		struct kvtd_poller *p = d->pollers[i];

		kvtd_poller_lock(p);
		for (unsigned j = 0; j < p->n_sessions; j++)
			kvt_ring_set_flags(p->sessions[j]->sq, KVT_RING_NEED_WAKEUP);
	}
	d->restarts++;
	r = image_write(d, &img_buf, &img_len, &fds);
	if (r < 0) {
		log_err("restart: writing the image: %s", strerror(-r));
		goto err;
	}
	img_fd = memfd_create("kvtierd-restart", MFD_CLOEXEC);
	if (img_fd < 0 || ftruncate(img_fd, (off_t)img_len) < 0) {
		r = -errno;
		log_err("restart: image memfd: %s", strerror(-r));
		goto err;
	}
	for (size_t off = 0; off < img_len;) {
		ssize_t n = pwrite(img_fd, img_buf + off, img_len - off, (off_t)off);

		if (n < 0) {
			r = -errno;
			log_err("restart: writing the image: %s", strerror(-r));
			goto err;
		}
		off += (size_t)n;
	}
	fd_add(&fds, img_fd);
	argv = calloc((size_t)d->argc + 3, sizeof(*argv));
	if (!argv || fds.err) {
		r = -ENOMEM;
		goto err;
	}
	memcpy(argv, d->argv, (size_t)d->argc * sizeof(*argv));
	snprintf(fdarg, sizeof(fdarg), "%d", img_fd);
	argv[d->argc] = "--restore-fd";
	argv[d->argc + 1] = fdarg;
	/* The new process's environment names the verdict pipe; the fallback's names the reason
	 * (the watcher writes it into wt.why_env). */
	while (environ[n_env])
		n_env++;
	envp = calloc(n_env + 2, sizeof(*envp));
	fb_envp = calloc(n_env + 2, sizeof(*fb_envp));
	if (!envp || !fb_envp) {
		r = -ENOMEM;
		goto err;
	}
	memcpy(envp, environ, n_env * sizeof(*envp));
	memcpy(fb_envp, environ, n_env * sizeof(*fb_envp));
	wt.rd = -1;
	wt.ack_w = -1;
	wt.notify_len = 0;
	if (d->exe_fd >= 0 && pipe2(vp, O_CLOEXEC) == 0) {
		snprintf(watch_env, sizeof(watch_env), "%s=%d", KVTD_WATCH_ENV, vp[1]);
		/* Under systemd the watcher is the main pid while the new process may still fail
		 * (its death then stops nothing), and hands it back before letting go: the new
		 * process waits for that (the end of the ack pipe) before its READY=1. */
		if (notify_addr(&wt.notify_addr, &wt.notify_len) == 0 &&
		    pipe2(ap, O_CLOEXEC) == 0) {
			snprintf(watch_env, sizeof(watch_env), "%s=%d,%d", KVTD_WATCH_ENV, vp[1],
				 ap[0]);
			snprintf(wt.mainpid_msg, sizeof(wt.mainpid_msg), "MAINPID=%d",
				 (int)getpid());
			wt.ack_w = ap[1];
		} else {
			wt.notify_len = 0;
		}
		envp[n_env] = watch_env;
		snprintf(wt.why_env, sizeof(wt.why_env), "%s=%.200s ", KVTD_FALLBACK_ENV, d->exe);
		fb_envp[n_env] = wt.why_env;
		wt.rd = vp[0];
		wt.kill = verdict;
		wt.exe_fd = d->exe_fd;
		wt.parent = getpid();
		wt.argv = argv;
		wt.envp = fb_envp;
	} else {
		log_warn("restart: no fallback to this binary if the new one fails (%s)",
			 d->exe_fd < 0 ? "it could not be opened at start" : strerror(errno));
	}
	if (fds.err) {
		r = -ENOMEM;
		goto err;
	}
	/* The spill store is not carried (docs/spill.md): the new process opens it again, which
	 * its lock would refuse while the old ring still holds the file after the exec. */
	if (d->spill && (r = kvtd_spill_unlock(d->spill)) < 0) {
		snprintf(d->restart_why, sizeof(d->restart_why),
			 "the spill store has requests in flight");
		log_err("restart refused: %s (still serving every session)", d->restart_why);
		goto err;
	}
	log_notice("restart %u: re-executing %s with %u descriptors, image %zu KiB", d->restarts,
		   d->exe, fds.n, img_len >> 10);
	sd_notify(0, "RELOADING=1\nSTATUS=restarting in place");
	/* Before the watcher copies them: it may have to execute the old binary with them. */
	set_cloexec(&fds, 0);
	tpid = teardown_start(&wt, &fds, &twfd);
	if (tpid < 0 && wt.rd >= 0) {
		log_warn("restart: no watcher (%s): no fallback if the new binary fails",
			 strerror(errno));
		envp[n_env] = NULL; /* nobody to give up to: the new process must not try */
	} else if (wt.rd >= 0) {
		fcntl(vp[1], F_SETFD, 0); /* the watcher has no copy: its end means the exec's */
		if (ap[0] >= 0)
			fcntl(ap[0], F_SETFD, 0);
		if (wt.notify_len) {
			/* the watcher is the main pid until the new process has taken over */
			sd_notifyf(0, "MAINPID=%d", (int)tpid);
			r = sd_notify_barrier(0, 5000000);
			if (r < 0)
				log_warn("restart: handing the main pid to the watcher: %s",
					 strerror(-r));
		}
	}
	execve(d->exe, argv, envp);
	r = -errno;
	if (vp[1] >= 0)
		fcntl(vp[1], F_SETFD, FD_CLOEXEC);
	if (ap[0] >= 0)
		fcntl(ap[0], F_SETFD, FD_CLOEXEC);
	if (tpid > 0) {
		/* not the exec's EOF: the watcher exits rather than take over */
		if (write(twfd, "x", 1) != 1)
			log_warn("restart: stopping the watcher: %s", strerror(errno));
		close(twfd);
		waitpid(tpid, NULL, 0);
		free(wt.keep);
		wt.keep = NULL;
	}
	set_cloexec(&fds, 1);
	if (d->spill && kvtd_spill_relock(d->spill) < 0) {
		log_err("restart: the spill store's lock was taken meanwhile: closing the store");
		kvtd_spill_close(d->spill);
		d->spill = NULL;
	}
	log_err("restart: exec %s: %s (still serving)", d->exe, strerror(-r));
	sd_notify(0, "READY=1\nSTATUS=serving (a restart failed)");
err:
	d->restarts--;
	if (img_fd >= 0)
		close(img_fd);
	for (int i = 0; i < 2; i++) {
		if (vp[i] >= 0)
			close(vp[i]);
		if (ap[i] >= 0)
			close(ap[i]);
	}
	free(argv);
	free(envp);
	free(fb_envp);
	free(img_buf);
	free(fds.fd);
	for (unsigned i = 0; i < d->n_pollers; i++)
		kvtd_poller_unlock(d->pollers[i]);
	return r;
}
