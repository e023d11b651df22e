/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <json-c/json.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvtd.h"
#include "log.h"
#include "loop.h"
#include "metrics.h"
#include "poller.h"
#include "prom.h"
#include "restart.h"
#include "session.h"
#include "stats.h"

/* user_data of the fixed sources; connections use their (aligned, larger) address. */
enum { SRC_LISTEN = 1, SRC_SIGNAL = 2, SRC_TIMER = 3, SRC_METRICS = 4 };

/*
 * CONN_NEW: accepted, nothing said yet (closed past hello_timeout_ms).
 * CONN_REFUSED: a peer allowed_uids/allowed_gids turn away (-EACCES), or one whose uid holds
 * connections_per_uid connections already (-EUSERS); its first message is read and answered
 * with the refusal before the close, so the refusal is what it reads (a close with its HELLO
 * unread would reach it as ECONNRESET instead).
 * CONN_ADMIN: said an admin request (closed when idle past admin_idle_timeout_ms).
 */
enum { CONN_NEW, CONN_REFUSED, CONN_SESSION, CONN_ADMIN };

/* Why the listener is not polled (d->listen_paused). */
enum { LISTEN_FULL = 1, LISTEN_NOFD = 2 };

struct kvtd_conn {
	struct kvtd_conn *next, *prev;
	int fd;
	int state;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	uint64_t deadline_ns; /* NEW, REFUSED, ADMIN: closed when silent past this; 0: closing */
	int privileged;	      /* root, our uid or in admin_gids: sees every session */
	struct kvtd_session *s;
	struct kvtd_uid *uid_ent;
	int refused;	    /* CONN_REFUSED: -EACCES or -EUSERS */
	unsigned uid_conns; /* -EUSERS: the uid's connections when this one came */
};

static int
arm_poll(struct kvtd *d, int fd, uint64_t user_data)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(d->ring);

	if (!sqe) {
		io_uring_submit(d->ring);
		sqe = io_uring_get_sqe(d->ring);
		if (!sqe)
			return -EBUSY;
	}
	io_uring_prep_poll_add(sqe, fd, POLLIN | POLLRDHUP);
	io_uring_sqe_set_data64(sqe, user_data);
	return 0;
}

static void send_error(int fd, uint64_t id, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void
send_error(int fd, uint64_t id, int err, const char *fmt, ...)
{
	struct kvt_ctl_error e;
	va_list ap;

	memset(&e, 0, sizeof(e));
	e.hdr.type = KVT_CTL_ERROR;
	e.hdr.len = sizeof(e);
	e.hdr.id = id;
	e.err = err;
	va_start(ap, fmt);
	vsnprintf(e.msg, sizeof(e.msg), fmt, ap);
	va_end(ap);
	send(fd, &e, sizeof(e), MSG_DONTWAIT | MSG_NOSIGNAL);
}

static struct kvtd_uid *
uid_get(struct kvtd *d, uid_t uid)
{
	struct kvtd_uid *free_ent = NULL;

	for (unsigned i = 0; i < d->n_uids; i++) {
		struct kvtd_uid *u = &d->uids[i];

		if (u->sessions && u->uid == uid)
			return u;
		if (!u->sessions && !free_ent)
			free_ent = u;
	}
	if (free_ent) {
		/* pool_share_per_uid: so that one unprivileged uid cannot take the whole pool
		 * from root and the others by default; the smaller limit of the two applies. */
		uint64_t share = d->pool.size * d->cfg.pool_share_per_uid / 100; /* < 2^57 * 100 */

		free_ent->uid = uid;
		free_ent->acct.bytes = 0;
		free_ent->acct.limit = d->cfg.pool_bytes_per_uid;
		free_ent->limit_key = "pool_bytes_per_uid";
		memset(&free_ent->cls, 0, sizeof(free_ent->cls));
		if (uid != 0 && uid != geteuid())
			free_ent->cls.limit = d->cfg.classes_per_uid;
		if (share && uid != 0 && uid != geteuid() &&
		    (!free_ent->acct.limit || share < free_ent->acct.limit)) {
			free_ent->acct.limit = share;
			free_ent->limit_key = "pool_share_per_uid";
		}
	}
	return free_ent;
}

/* Polls the listener again after a pause, once there may be room for a connection. */
static void
listen_resume(struct kvtd *d)
{
	if (!d->listen_paused || d->listen_armed || d->stopping || d->listen_fd < 0 ||
	    d->n_conns >= d->cfg.max_connections)
		return;
	/* listen_paused stays until do_accept() gets to EAGAIN: a pause is logged once */
	if (arm_poll(d, d->listen_fd, SRC_LISTEN) == 0)
		d->listen_armed = 1;
	else
		d->listen_paused = LISTEN_NOFD; /* the timer tries again */
}

static void
conn_close(struct kvtd *d, struct kvtd_conn *c)
{
	if (c->s) {
		struct kvtd_session *s = c->s;

		kvtd_poller_detach(s);
		atomic_fetch_add(&d->cnt.ops, s->ops);
		atomic_fetch_add(&d->cnt.errors, s->errors);
		kvtd_op_stats_fold(&d->opst_ended, &s->opst);
		kvtd_log_f(KVTD_LOG_INFO,
			   &(struct kvtd_log_fields){.session = s->id, .pid = c->pid},
			   "session %u (pid %d uid %u '%s') ended: %llu ops", s->id, (int)c->pid,
			   (unsigned)c->uid, s->name, (unsigned long long)s->ops);
		kvtd_session_destroy(s);
		d->n_sessions--;
	}
	if (c->uid_ent)
		c->uid_ent->sessions--;
	if (d->restart_conn == c) /* a restart that fails answers no one rather than freed memory */
		d->restart_conn = NULL;
	if (c->prev)
		c->prev->next = c->next;
	else
		d->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	close(c->fd);
	free(c);
	d->n_conns--;
	listen_resume(d); /* a slot and a descriptor are free again */
}

/* 64-bit so that no uint32_t from a HELLO can overflow it (2^32 ends the loop). */
static uint64_t
pow2_up(uint64_t v)
{
	uint64_t p = 1;

	while (p < v && p < (1ull << 32))
		p <<= 1;
	return p;
}

static int peer_in_groups(int fd, gid_t gid, const gid_t *list, unsigned n);

static int
handle_hello(struct kvtd *d, struct kvtd_conn *c, const struct kvt_ctl_hello *h, size_t len)
{
	const struct kvtd_config *cfg = &d->cfg;
	struct kvt_ctl_welcome w;
	struct kvtd_session *s;
	uint64_t sq, cq, arena;
	int r;

	if (len < sizeof(*h)) {
		send_error(c->fd, h->hdr.id, -EINVAL, "HELLO too short (%zu bytes)", len);
		return -EINVAL;
	}
	if (h->abi_major != KVT_ABI_MAJOR) {
		send_error(c->fd, h->hdr.id, -EPROTO,
			   "ABI mismatch: client speaks %u.%u, kvtierd speaks %u.%u", h->abi_major,
			   h->abi_minor, KVT_ABI_MAJOR, KVT_ABI_MINOR);
		log_warn("pid %d: ABI mismatch (client %u.%u, daemon %u.%u)", (int)c->pid,
			 h->abi_major, h->abi_minor, KVT_ABI_MAJOR, KVT_ABI_MINOR);
		return -EPROTO;
	}
	/* Checked after the ABI major (another major may lay them out otherwise); zero now, so that
	 * a later minor version can give them meaning. */
	if (h->reserved0 || h->reserved[0] || h->reserved[1]) {
		send_error(
		    c->fd, h->hdr.id, -EINVAL,
		    "HELLO reserved fields must be zero (reserved0 %u, reserved %#llx %#llx)",
		    h->reserved0, (unsigned long long)h->reserved[0],
		    (unsigned long long)h->reserved[1]);
		return -EINVAL;
	}
	/* Limits first, on the values as sent, then rounding: every step is in 64 bits, so no
	 * field value can wrap a computation (max_sq_entries is a power of two <= 65536). */
	sq = h->sq_entries;
	if (!sq) /* the default, within a lowered max_sq_entries */
		sq = cfg->default_sq_entries < cfg->max_sq_entries ? cfg->default_sq_entries
								   : cfg->max_sq_entries;
	if (sq <= cfg->max_sq_entries)
		sq = pow2_up(sq);
	cq = h->cq_entries ? h->cq_entries : 2 * sq;
	if (sq > cfg->max_sq_entries || cq < sq || cq > 2ull * cfg->max_sq_entries) {
		send_error(c->fd, h->hdr.id, -EINVAL,
			   "ring size sq %u cq %u outside limits (sq <= %u, sq <= cq <= %u)",
			   h->sq_entries, h->cq_entries, cfg->max_sq_entries,
			   2 * cfg->max_sq_entries);
		return -EINVAL;
	}
	cq = pow2_up(cq);
	arena = h->arena_size ? h->arena_size : cfg->default_arena_size;
	if (arena > cfg->max_arena_size) {
		send_error(c->fd, h->hdr.id, -EINVAL, "arena %llu bytes above limit %llu",
			   (unsigned long long)arena, (unsigned long long)cfg->max_arena_size);
		return -EINVAL;
	}
	if (d->n_sessions >= cfg->max_sessions) {
		atomic_fetch_add(&d->cnt.refused_limit, 1);
		send_error(c->fd, h->hdr.id, -EUSERS, "kvtierd has %u sessions (max_sessions)",
			   d->n_sessions);
		return -EUSERS;
	}
	c->uid_ent = uid_get(d, c->uid);
	if (!c->uid_ent || c->uid_ent->sessions >= cfg->sessions_per_uid) {
		c->uid_ent = NULL;
		atomic_fetch_add(&d->cnt.refused_limit, 1);
		send_error(c->fd, h->hdr.id, -EUSERS, "uid %u has %u sessions (sessions_per_uid)",
			   (unsigned)c->uid, cfg->sessions_per_uid);
		return -EUSERS;
	}
	c->uid_ent->sessions++;
	r = kvtd_session_create(d, (uint32_t)sq, (uint32_t)cq, arena, &s);
	if (r < 0) {
		send_error(c->fd, h->hdr.id, r, "cannot create session: %s", strerror(-r));
		return r;
	}
	s->id = ++d->next_session_id;
	((struct kvt_region_hdr *)s->region)->session_id = s->id;
	s->sock = c->fd;
	s->pid = c->pid;
	s->uid = c->uid;
	s->gid = c->gid;
	s->uid_ent = c->uid_ent;
	/* prefix blocks: the uid's own scope, or the shared one of prefix share_uids/gids */
	s->prefix_scope = (uint64_t)c->uid + 1;
	for (unsigned i = 0; i < cfg->n_prefix_share_uids; i++)
		if (cfg->prefix_share_uids[i] == c->uid)
			s->prefix_scope = 0;
	if (peer_in_groups(c->fd, c->gid, cfg->prefix_share_gids, cfg->n_prefix_share_gids))
		s->prefix_scope = 0;
	memcpy(s->name, h->name, sizeof(s->name));
	s->name[sizeof(s->name) - 1] = '\0';
	for (char *p = s->name; *p; p++)
		if (*p < 0x20 || *p > 0x7e)
			*p = '?'; /* shown in logs and JSON */

	memset(&w, 0, sizeof(w));
	w.hdr.type = KVT_CTL_WELCOME;
	w.hdr.len = sizeof(w);
	w.hdr.id = h->hdr.id;
	w.abi_major = KVT_ABI_MAJOR;
	w.abi_minor = KVT_ABI_MINOR;
	w.session_id = s->id;
	w.region_size = s->region_size;
	w.features = h->features & KVT_FEAT_ALL;
	w.backend = kvt_dev_kind(d->dev) == KVT_DEV_CUDA ? KVT_BACKEND_CUDA : KVT_BACKEND_HOST;
	{
		int fds[3] = {s->memfd, s->sq_efd, s->cq_efd};
		char cbuf[CMSG_SPACE(sizeof(fds))];
		struct iovec iov = {&w, sizeof(w)};
		struct msghdr m = {.msg_iov = &iov,
				   .msg_iovlen = 1,
				   .msg_control = cbuf,
				   .msg_controllen = sizeof(cbuf)};
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);

		memset(cbuf, 0, sizeof(cbuf));
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(fds));
		memcpy(CMSG_DATA(cm), fds, sizeof(fds));
		if (sendmsg(c->fd, &m, MSG_NOSIGNAL) < 0) {
			r = -errno;
			kvtd_session_destroy(s);
			return r;
		}
	}
	r = kvtd_poller_attach(d, s);
	if (r < 0) {
		kvtd_session_destroy(s);
		return r;
	}
	c->s = s;
	c->state = CONN_SESSION;
	d->n_sessions++;
	atomic_fetch_add(&d->cnt.sessions_total, 1);
	kvtd_log_f(KVTD_LOG_INFO, &(struct kvtd_log_fields){.session = s->id, .pid = c->pid},
		   "session %u: pid %d uid %u '%s', sq %u cq %u arena %llu KiB", s->id, (int)c->pid,
		   (unsigned)c->uid, s->name, s->sq_entries, s->cq_entries,
		   (unsigned long long)(arena >> 10));
	return 0;
}

static void
reply_json(struct kvtd_conn *c, uint64_t id, struct json_object *o)
{
	const char *txt = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
	size_t tlen = strlen(txt) + 1;
	struct kvt_ctl_hdr h = {.type = KVT_CTL_JSON, .id = id};
	struct iovec iov[2] = {{&h, sizeof(h)}, {(void *)txt, tlen}};
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};

	if (sizeof(h) + tlen > KVT_CTL_MAX_MSG) {
		send_error(c->fd, id, -E2BIG, "reply of %zu bytes exceeds %u", tlen,
			   KVT_CTL_MAX_MSG);
	} else {
		h.len = (uint32_t)(sizeof(h) + tlen);
		sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	json_object_put(o);
}

/* METRICS: the text exposition (KVT_CTL_TEXT) or its JSON document (prom.h). */
static void
handle_metrics(struct kvtd *d, struct kvtd_conn *c, const struct kvt_ctl_metrics *m, size_t len)
{
	struct json_object *doc = NULL;
	struct kvt_ctl_hdr h = {.type = KVT_CTL_TEXT, .id = m->hdr.id};
	char *text = NULL;
	size_t tlen = 0;
	int r;

	if (len != sizeof(*m) || (m->flags & ~KVT_CTL_METRICS_F_ALL) || m->reserved0) {
		send_error(c->fd, m->hdr.id, -EINVAL,
			   "malformed METRICS request: want %zu bytes, flags within 0x%x and "
			   "reserved0 zero",
			   sizeof(*m), KVT_CTL_METRICS_F_ALL);
		return;
	}
	r = kvtd_prom_render(d, m->flags, c->privileged ? NULL : &c->uid, &text, &tlen, &doc);
	if (r < 0) {
		send_error(c->fd, m->hdr.id, r, "metrics unavailable: %s", strerror(-r));
		return;
	}
	if (doc) {
		reply_json(c, m->hdr.id, doc);
		return;
	}
	if (sizeof(h) + tlen + 1 > KVT_CTL_MAX_MSG) {
		send_error(c->fd, m->hdr.id, -E2BIG,
			   "metrics of %zu bytes exceed a message (%u); leave out the per-session "
			   "families or scrape /metrics",
			   tlen, KVT_CTL_MAX_MSG);
	} else {
		struct iovec iov[2] = {{&h, sizeof(h)}, {text, tlen + 1}};
		struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};

		h.len = (uint32_t)(sizeof(h) + tlen + 1);
		sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	free(text);
}

static int
handle_buf_register(struct kvtd *d, struct kvtd_conn *c, const struct kvt_ctl_buf_register *m,
		    size_t len, int fd)
{
	struct kvt_ctl_buf_registered ok;
	struct kvt_dev_import imp;
	struct kvt_dev_buf *buf;
	int r;

	if (len < sizeof(*m) || m->flags || m->reserved[0] || m->reserved[1]) {
		send_error(c->fd, m->hdr.id, -EINVAL, "malformed BUF_REGISTER");
		return 0;
	}
	if (m->kind == KVT_BUF_HOST_MEMFD && fd < 0) {
		send_error(c->fd, m->hdr.id, -EBADF, "BUF_REGISTER of a memfd carries no fd");
		return 0;
	}
	memset(&imp, 0, sizeof(imp));
	imp.kind = m->kind;
	imp.fd = fd;
	imp.size = m->size;
	memcpy(imp.ipc_handle, m->ipc_handle, sizeof(imp.ipc_handle));
	memcpy(imp.device_uuid, m->device_uuid, sizeof(imp.device_uuid));
	r = kvt_dev_buf_import(d->dev, &imp, &buf);
	if (r == -EOPNOTSUPP) {
		send_error(
		    c->fd, m->hdr.id, r,
		    kvt_dev_kind(d->dev) == KVT_DEV_CUDA
			? "buffer refused: this kvtierd runs the CUDA backend (%s), which "
			  "takes CUDA IPC buffers only; start it with --backend host to serve "
			  "host buffers"
			: "buffer refused: this kvtierd runs the host backend (%s), which "
			  "takes sealed memfd buffers only",
		    kvt_dev_name(d->dev));
		return 0;
	}
	if (r < 0) {
		send_error(c->fd, m->hdr.id, r,
			   r == -EINVAL && m->kind == KVT_BUF_HOST_MEMFD
			       ? "buffer refused: a host buffer must be a memfd sealed "
				 "against shrinking, at least as large as claimed"
			       : "buffer import failed: %s",
			   strerror(-r));
		return 0;
	}
	kvtd_poller_lock(c->s->poller);
	r = kvtd_session_buf_register(c->s, buf);
	kvtd_poller_unlock(c->s->poller);
	if (r < 0) {
		kvt_dev_buf_put(buf);
		send_error(c->fd, m->hdr.id, r, "too many buffers (buffers_per_session = %u)",
			   d->cfg.buffers_per_session);
		return 0;
	}
	memset(&ok, 0, sizeof(ok));
	ok.hdr.type = KVT_CTL_BUF_REGISTERED;
	ok.hdr.len = sizeof(ok);
	ok.hdr.id = m->hdr.id;
	ok.buf_id = (uint32_t)r;
	send(c->fd, &ok, sizeof(ok), MSG_NOSIGNAL | MSG_DONTWAIT);
	return 0;
}

static void
handle_buf_unregister(struct kvtd_conn *c, const struct kvt_ctl_buf_unregister *m, size_t len)
{
	struct kvt_ctl_hdr ok = {.type = KVT_CTL_OK, .len = sizeof(ok), .id = m->hdr.id};
	int r;

	if (len < sizeof(*m) || m->reserved0) {
		send_error(c->fd, m->hdr.id, -EINVAL, "malformed BUF_UNREGISTER");
		return;
	}
	kvtd_poller_lock(c->s->poller);
	r = kvtd_session_buf_unregister(c->s, m->buf_id);
	kvtd_poller_unlock(c->s->poller);
	if (r < 0)
		send_error(c->fd, m->hdr.id, r,
			   r == -EBUSY ? "buffer %u is in use by an open sequence" : "no buffer %u",
			   m->buf_id);
	else
		send(c->fd, &ok, sizeof(ok), MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void
handle_event_get(struct kvtd *d, struct kvtd_conn *c, const struct kvt_ctl_event_get *m, size_t len)
{
	struct kvt_ctl_event ev = {
	    .hdr = {.type = KVT_CTL_EVENT, .len = sizeof(ev), .id = m->hdr.id}};
	struct kvtd_session *s = c->s;
	int r = 0;

	if (len < sizeof(*m) || m->reserved[0] || m->reserved[1]) {
		send_error(c->fd, m->hdr.id, -EINVAL, "malformed EVENT_GET");
		return;
	}
	if (!s->dev_event) {
		struct kvt_dev_event *e;

		r = kvt_dev_event_create(d->dev, m->device_uuid, &e, s->event_handle);
		if (r == 0) {
			/* Ops post their CQE without waiting for their copies: a first record now
			 * covers those already queued (under the poller lock, so that no op of
			 * this session queues copies between the record and the publish). */
			kvtd_poller_lock(s->poller);
			r = kvt_dev_event_record(d->dev, e);
			if (r == 0)
				s->dev_event = e;
			kvtd_poller_unlock(s->poller);
			if (r < 0)
				kvt_dev_event_destroy(d->dev, e);
		}
	}
	if (r < 0) {
		send_error(c->fd, m->hdr.id, r,
			   r == -EOPNOTSUPP ? "the %s backend has no events: copies are complete "
					      "when the CQE is posted"
					    : "no event on the %s backend: %s",
			   kvt_dev_name(d->dev), strerror(-r));
		return;
	}
	memcpy(ev.ipc_handle, s->event_handle, sizeof(ev.ipc_handle));
	send(c->fd, &ev, sizeof(ev), MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* An admin request: the connection is an admin one, idle from now. */
static void
admin_touch(struct kvtd *d, struct kvtd_conn *c)
{
	if (c->state == CONN_NEW)
		c->state = CONN_ADMIN;
	if (c->state == CONN_ADMIN)
		c->deadline_ns = kvtd_now_ns() + (uint64_t)d->cfg.admin_idle_timeout_ms * 1000000;
}

/* Is session @id one of @uid's? */
static int
session_of(const struct kvtd *d, uint64_t id, uid_t uid)
{
	for (const struct kvtd_conn *c = d->conns; c; c = c->next)
		if (c->s && c->s->id == id)
			return c->uid == uid;
	return 0;
}

/* A peer that is not privileged sees only its own uid's sessions in a CLIENTS or SEQS document
 * (every entry names its "session"): pids, names and sizes of other users' processes are not
 * its business. */
static struct json_object *
keep_visible(struct kvtd *d, const struct kvtd_conn *c, struct json_object *doc, const char *key)
{
	struct json_object *all, *own;

	if (c->privileged || !json_object_object_get_ex(doc, key, &all))
		return doc;
	own = json_object_new_array();
	for (size_t i = 0; i < json_object_array_length(all); i++) {
		struct json_object *e = json_object_array_get_idx(all, i), *sid;

		if (json_object_object_get_ex(e, "session", &sid) &&
		    session_of(d, json_object_get_uint64(sid), c->uid))
			json_object_array_add(own, json_object_get(e));
	}
	json_object_object_add(doc, key, own);
	return doc;
}

/* BLOCKS: a peer that is not privileged sees the namespaces of its own uid's scope, and of the
 * shared scope when it is in it (the scope its sessions get at HELLO), not what other users'
 * models and prompts are. */
static void
handle_blocks(struct kvtd *d, struct kvtd_conn *c, const struct kvt_ctl_hdr *h, size_t len)
{
	const struct kvtd_config *cfg = &d->cfg;
	uint64_t scopes[2] = {(uint64_t)c->uid + 1, 0};
	unsigned n = 1;

	if (len != sizeof(*h)) {
		send_error(c->fd, h->id, -EINVAL, "malformed BLOCKS request: %zu bytes, want %zu",
			   len, sizeof(*h));
		return;
	}
	for (unsigned i = 0; i < cfg->n_prefix_share_uids; i++)
		if (cfg->prefix_share_uids[i] == c->uid)
			n = 2;
	if (peer_in_groups(c->fd, c->gid, cfg->prefix_share_gids, cfg->n_prefix_share_gids))
		n = 2;
	reply_json(c, h->id, kvtd_stats_blocks(d, c->privileged ? NULL : scopes, n));
}

/* One message. Returns < 0 to drop the connection. */
static int
handle_msg(struct kvtd *d, struct kvtd_conn *c, const uint8_t *buf, size_t len, int fd)
{
	const struct kvt_ctl_hdr *h = (const struct kvt_ctl_hdr *)buf;

	if (c->state == CONN_REFUSED && c->refused == -EUSERS) {
		send_error(c->fd, len >= sizeof(*h) ? h->id : 0, -EUSERS,
			   "uid %u holds %u control connections, connections_per_uid is %u: close "
			   "one first",
			   (unsigned)c->uid, c->uid_conns, d->cfg.connections_per_uid);
		return -EUSERS;
	}
	if (c->state == CONN_REFUSED) {
		send_error(c->fd, len >= sizeof(*h) ? h->id : 0, -EACCES,
			   "uid %u is not allowed to use kvtierd (allowed_uids / allowed_gids in "
			   "kvtierd.conf)",
			   (unsigned)c->uid);
		return -EACCES;
	}
	if (len < sizeof(*h) || h->len != len) {
		send_error(c->fd, len >= sizeof(*h) ? h->id : 0, -EINVAL,
			   "malformed control message (%zu bytes)", len);
		return c->state == CONN_NEW ? -EINVAL : 0;
	}
	switch (h->type) {
	case KVT_CTL_HELLO:
		if (c->state != CONN_NEW) {
			send_error(c->fd, h->id, -EALREADY, "HELLO already said");
			return 0;
		}
		return handle_hello(d, c, (const void *)buf, len);
	case KVT_CTL_STATUS:
		admin_touch(d, c);
		reply_json(c, h->id, kvtd_stats_status(d));
		return 0;
	case KVT_CTL_CLIENTS:
		admin_touch(d, c);
		reply_json(c, h->id, keep_visible(d, c, kvtd_stats_clients(d), "clients"));
		return 0;
	case KVT_CTL_SEQS:
		admin_touch(d, c);
		reply_json(c, h->id, keep_visible(d, c, kvtd_stats_seqs(d), "seqs"));
		return 0;
	case KVT_CTL_BLOCKS:
		admin_touch(d, c);
		handle_blocks(d, c, h, len);
		return 0;
	case KVT_CTL_RESTART:
		admin_touch(d, c);
		if (!c->privileged) {
			send_error(c->fd, h->id, -EPERM,
				   "restart is for root, kvtierd's uid or an admin_gids group");
			return 0;
		}
		if (d->restart_pending) {
			send_error(c->fd, h->id, -EALREADY,
				   "a restart is already under way; the request that asked first "
				   "gets its answer");
			return 0;
		}
		/* At the end of this turn of the loop; the reply comes from the new process. */
		d->restart_pending = 1;
		d->restart_conn = c;
		d->restart_req_id = h->id;
		return 0;
	case KVT_CTL_METRICS:
		admin_touch(d, c);
		handle_metrics(d, c, (const void *)buf, len);
		return 0;
	case KVT_CTL_BUF_REGISTER:
	case KVT_CTL_BUF_UNREGISTER:
		if (c->state != CONN_SESSION) {
			send_error(c->fd, h->id, -ENOTCONN,
				   "buffer registration needs a session "
				   "(send HELLO first)");
			return c->state == CONN_NEW ? -ENOTCONN : 0;
		}
		if (h->type == KVT_CTL_BUF_REGISTER)
			return handle_buf_register(d, c, (const void *)buf, len, fd);
		handle_buf_unregister(c, (const void *)buf, len);
		return 0;
	case KVT_CTL_EVENT_GET:
		if (c->state != CONN_SESSION) {
			send_error(c->fd, h->id, -ENOTCONN, "EVENT_GET needs a session");
			return c->state == CONN_NEW ? -ENOTCONN : 0;
		}
		handle_event_get(d, c, (const void *)buf, len);
		return 0;
	default:
		send_error(c->fd, h->id, -EINVAL, "unknown control message type %u", h->type);
		return c->state == CONN_NEW ? -EINVAL : 0;
	}
}

/* Readable or hung up. Returns < 0 when the connection is to be closed. */
static int
conn_ready(struct kvtd *d, struct kvtd_conn *c, int revents)
{
	static _Thread_local uint8_t buf[KVT_CTL_MAX_MSG];

	for (;;) {
		char cbuf[CMSG_SPACE(4 * sizeof(int))];
		struct iovec iov = {buf, sizeof(buf)};
		struct msghdr m = {.msg_iov = &iov,
				   .msg_iovlen = 1,
				   .msg_control = cbuf,
				   .msg_controllen = sizeof(cbuf)};
		int fds[4], nfds = 0, r;
		ssize_t n = recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

		if (n < 0)
			return errno == EAGAIN ? 0 : -errno;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
			if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
				int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

				for (int i = 0; i < k && nfds < 4; i++)
					memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int),
					       sizeof(int));
			}
		if (n == 0) {
			/* EOF, or an empty SEQPACKET message, which may still carry descriptors:
			 * either way the client is done */
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			return -ECONNRESET;
		}
		if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
			send_error(c->fd, 0, -EMSGSIZE, "control message too large");
			r = c->state == CONN_NEW ? -EMSGSIZE : 0;
		} else {
			r = handle_msg(d, c, buf, (size_t)n, nfds == 1 ? fds[0] : -1);
		}
		/* The daemon keeps no fd a peer passes: a host buffer import keeps its own dup. */
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		if (r < 0)
			return r;
	}
}

static int
gid_listed(const gid_t *list, unsigned n, gid_t g)
{
	for (unsigned i = 0; i < n; i++)
		if (list[i] == g)
			return 1;
	return 0;
}

/* Is the peer's primary group, or one of its supplementary groups (SO_PEERGROUPS, taken at
 * connect() like SO_PEERCRED), in @list? */
static int
peer_in_groups(int fd, gid_t gid, const gid_t *list, unsigned n)
{
	gid_t small[64], *g = small;
	socklen_t len = sizeof(small);
	int found = 0;

	if (!n)
		return 0;
	if (gid_listed(list, n, gid))
		return 1;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
		if (errno != ERANGE) /* e.g. a kernel before 4.13: the primary group only */
			return 0;
		g = malloc(len); /* len now says how much the peer's groups take */
		if (!g || getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
			free(g);
			return 0;
		}
	}
	for (size_t i = 0; i < len / sizeof(gid_t) && !found; i++)
		found = gid_listed(list, n, g[i]);
	if (g != small)
		free(g);
	return found;
}

static int
peer_allowed(const struct kvtd_config *cfg, int fd, const struct ucred *cred)
{
	if (!cfg->n_allowed_uids && !cfg->n_allowed_gids)
		return 1;
	if (cred->uid == 0 || cred->uid == geteuid())
		return 1;
	for (unsigned i = 0; i < cfg->n_allowed_uids; i++)
		if (cfg->allowed_uids[i] == cred->uid)
			return 1;
	return peer_in_groups(fd, cred->gid, cfg->allowed_gids, cfg->n_allowed_gids);
}

/* May the peer see other users' sessions? */
static int
peer_privileged(const struct kvtd_config *cfg, int fd, const struct ucred *cred)
{
	return cred->uid == 0 || cred->uid == geteuid() ||
	       peer_in_groups(fd, cred->gid, cfg->admin_gids, cfg->n_admin_gids);
}

/* Connections @uid holds now, refused ones still to be answered included. */
static unsigned
uid_conns(const struct kvtd *d, uid_t uid)
{
	unsigned n = 0;

	for (const struct kvtd_conn *c = d->conns; c; c = c->next)
		n += c->uid == uid;
	return n;
}

/*
 * Is a connection of @uid over connections_per_uid? 0: admitted; -EUSERS: refused with an
 * answer; -EMFILE: closed at once, unanswered (the uid holds twice its limit, refusals still to
 * be answered included, so refusals too are bounded per uid). Root and the daemon's own uid are
 * always admitted: one uid cannot fill max_connections and lock them out.
 */
static int
uid_conn_admit(const struct kvtd *d, uid_t uid, unsigned *ret_n)
{
	unsigned lim = d->cfg.connections_per_uid, n;

	if (!lim || uid == 0 || uid == geteuid())
		return 0;
	n = uid_conns(d, uid);
	*ret_n = n;
	if (n < lim)
		return 0;
	return n - lim < lim ? -EUSERS : -EMFILE;
}

/*
 * Accepts while there is room. The listener is left unpolled (connections wait in its backlog,
 * and a client's own timeout applies) when max_connections are open, until one closes, and when
 * accept4() finds no descriptor left, until a connection closes or the next timer tick: polling
 * a listener that stays readable would spin the loop.
 */
static void
do_accept(struct kvtd *d)
{
	while (d->n_conns < d->cfg.max_connections) {
		struct ucred cred;
		socklen_t clen = sizeof(cred);
		struct kvtd_conn *c;
		int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		int sndbuf = 2 * KVT_CTL_MAX_MSG, allowed;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN)
				break;
			if (d->listen_paused != LISTEN_NOFD) /* once per pause */
				log_warn(
				    "accept on %s: %s, with %u connections open: not accepting "
				    "until a descriptor frees (raise LimitNOFILE or lower "
				    "max_connections)",
				    d->cfg.socket_path, strerror(errno), d->n_conns);
			d->listen_paused = LISTEN_NOFD;
			return;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
			close(fd);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		allowed = peer_allowed(&d->cfg, fd, &cred);
		if (!allowed) {
			c->refused = -EACCES;
			atomic_fetch_add(&d->cnt.refused_auth, 1);
			log_warn("refused pid %d uid %u gid %u: not in allowed_uids/allowed_gids",
				 (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid);
		} else if ((c->refused = uid_conn_admit(d, cred.uid, &c->uid_conns)) < 0) {
			atomic_fetch_add(&d->cnt.refused_limit, 1);
			log_debug("refused pid %d uid %u: %u connections (connections_per_uid %u)",
				  (int)cred.pid, (unsigned)cred.uid, c->uid_conns,
				  d->cfg.connections_per_uid);
			if (c->refused == -EMFILE) {
				free(c);
				close(fd);
				continue;
			}
			allowed = 0;
		}
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		c->fd = fd;
		c->pid = cred.pid;
		c->uid = cred.uid;
		c->gid = cred.gid;
		c->state = allowed ? CONN_NEW : CONN_REFUSED;
		c->privileged = allowed && peer_privileged(&d->cfg, fd, &cred);
		c->deadline_ns = kvtd_now_ns() + (uint64_t)d->cfg.hello_timeout_ms * 1000000;
		c->next = d->conns;
		if (d->conns)
			d->conns->prev = c;
		d->conns = c;
		d->n_conns++;
		if (arm_poll(d, fd, (uint64_t)(uintptr_t)c) < 0)
			conn_close(d, c);
	}
	if (d->n_conns >= d->cfg.max_connections) {
		if (d->listen_paused != LISTEN_FULL) /* once per pause */
			log_warn("%u control connections open (max_connections): new ones wait "
				 "until one closes",
				 d->n_conns);
		d->listen_paused = LISTEN_FULL;
		return;
	}
	d->listen_paused = 0;
	if (arm_poll(d, d->listen_fd, SRC_LISTEN) == 0)
		d->listen_armed = 1;
	else
		d->listen_paused = LISTEN_NOFD;
}

static void arm_src(struct kvtd *d, unsigned src);

/* A metrics bind that failed after a restart: tried again, each wait twice the last (to a
 * minute), each failure logged by kvtd_metrics_init(). */
static void
metrics_retry(struct kvtd *d, uint64_t now)
{
	if (kvtd_metrics_init(d) == 0) {
		d->metrics_retry_ns = 0;
		if (d->metrics_fd >= 0)
			arm_src(d, SRC_METRICS);
		return;
	}
	if (d->metrics_backoff_ns < 60000000000ULL)
		d->metrics_backoff_ns *= 2;
	d->metrics_retry_ns = now + d->metrics_backoff_ns;
}

static void
on_timer(struct kvtd *d)
{
	uint64_t now = kvtd_now_ns(), ticks;

	if (read(d->timer_fd, &ticks, sizeof(ticks)) < 0)
		return;
	sd_notify(0, "WATCHDOG=1");
	/* A connection silent past its deadline is shut down; its armed poll then reports the
	 * hangup and the normal close path frees it. */
	for (struct kvtd_conn *c = d->conns; c; c = c->next) {
		if (c->state == CONN_SESSION || !c->deadline_ns || now <= c->deadline_ns)
			continue;
		if (c->state == CONN_ADMIN) {
			log_debug("pid %d: admin connection idle for %u ms: closing", (int)c->pid,
				  d->cfg.admin_idle_timeout_ms);
			send_error(
			    c->fd, 0, -ETIMEDOUT,
			    "admin connection idle for %u ms (admin_idle_timeout_ms): closed",
			    d->cfg.admin_idle_timeout_ms);
		} else if (c->state == CONN_REFUSED && c->refused == -EUSERS) {
			send_error(c->fd, 0, -EUSERS,
				   "uid %u holds %u control connections, connections_per_uid is %u",
				   (unsigned)c->uid, c->uid_conns, d->cfg.connections_per_uid);
		} else if (c->state == CONN_REFUSED) {
			send_error(c->fd, 0, -EACCES, "uid %u is not allowed to use kvtierd",
				   (unsigned)c->uid);
		} else {
			atomic_fetch_add(&d->cnt.refused_hello_timeout, 1);
			log_info("pid %d said nothing in %u ms: closing", (int)c->pid,
				 d->cfg.hello_timeout_ms);
			send_error(c->fd, 0, -ETIMEDOUT, "no HELLO within %u ms",
				   d->cfg.hello_timeout_ms);
		}
		shutdown(c->fd, SHUT_RDWR);
		c->deadline_ns = 0;
	}
	if (d->listen_paused == LISTEN_NOFD) /* descriptors may have freed outside our conns */
		listen_resume(d);
	if (d->metrics_retry_ns && now >= d->metrics_retry_ns)
		metrics_retry(d, now);
	kvtd_metrics_tick(d, now);
}

static void
on_signal(struct kvtd *d)
{
	struct signalfd_siginfo si;
	char err[512];

	while (read(d->signal_fd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			sd_notify(0, "RELOADING=1");
			if (kvtd_config_reload(&d->cfg, err, sizeof(err)) < 0) {
				log_err("reload: %s (keeping the running settings)", err);
			} else {
				for (unsigned i = 0; i < d->n_pollers; i++)
					atomic_store(&d->pollers[i]->spin_us, d->cfg.spin_us);
				log_notice("reloaded %s", d->cfg.config_path);
			}
			sd_notify(0, "READY=1");
		} else if (si.ssi_signo == SIGUSR2) {
			log_notice("SIGUSR2: restarting in place");
			if (!d->restart_pending) /* a RESTART asked first: it gets the answer */
				d->restart_conn = NULL;
			d->restart_pending = 1;
		} else {
			log_notice("signal %u: stopping", si.ssi_signo);
			d->stopping = 1;
		}
	}
}

static const char *
file_kind(mode_t m)
{
	return S_ISREG(m)    ? "a regular file"
	       : S_ISDIR(m)  ? "a directory"
	       : S_ISLNK(m)  ? "a symbolic link"
	       : S_ISFIFO(m) ? "a FIFO"
	       : S_ISCHR(m)  ? "a character device"
	       : S_ISBLK(m)  ? "a block device"
			     : "not a regular file";
}

/* A missing socket directory is the usual first start by hand: /run/kvtier is made by the unit
 * (RuntimeDirectory=) or tmpfiles with its owner and mode, so the daemon says so and does not
 * make it. */
static void
log_socket_dir_missing(const char *path)
{
	const char *slash = strrchr(path, '/');
	int len = !slash ? 1 : slash == path ? 1 : (int)(slash - path);

	log_err("cannot create the control socket %s: its directory %.*s does not exist. "
		"Run kvtierd as a service (systemctl start kvtierd: the unit creates "
		"/run/kvtier), create the directory with systemd-tmpfiles --create kvtier.conf "
		"or mkdir (owned by the user kvtierd runs as), or give --socket a path in an "
		"existing directory",
		path, len, slash ? path : ".");
}

/* One daemon per socket path: an flock on "<socket>.lock", taken before the path is looked at,
 * so that two daemons starting together cannot both take a stale socket for theirs. */
static int
socket_lock(struct kvtd *d)
{
	char lock[sizeof(d->cfg.socket_path) + 8];
	int fd, r;

	snprintf(lock, sizeof(lock), "%s.lock", d->cfg.socket_path);
	for (int tries = 0; tries < 64; tries++) {
		struct stat a, b;

		/* O_NOFOLLOW: a link planted in the runtime directory is not followed */
		fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
		if (fd < 0) {
			r = -errno;
			if (r == -ENOENT)
				log_socket_dir_missing(d->cfg.socket_path);
			else
				log_err("cannot open the lock file %s: %s", lock, strerror(-r));
			return r;
		}
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			r = -errno;
			close(fd);
			if (r == -EWOULDBLOCK) {
				log_err("another kvtierd holds %s: it serves %s (stop it first, or "
					"give this one another --socket)",
					lock, d->cfg.socket_path);
				return -EADDRINUSE;
			}
			log_err("cannot lock %s: %s", lock, strerror(-r));
			return r;
		}
		/* The holder before us unlinks the file at exit, maybe between our open and our
		 * lock: then we hold an orphan, and start over on what the path names now. */
		if (fstat(fd, &a) == 0 && stat(lock, &b) == 0 && a.st_dev == b.st_dev &&
		    a.st_ino == b.st_ino) {
			d->lock_fd = fd;
			return 0;
		}
		close(fd);
	}
	log_err("cannot lock %s: it keeps being replaced", lock);
	return -EAGAIN;
}

/* What is at the socket path may go only if it is a socket nobody listens on (a crashed
 * daemon's). Anything else is refused, with the path named, and left as it is. */
static int
socket_path_free(const char *path, const struct sockaddr_un *sa)
{
	struct stat st;
	int fd, r;

	if (lstat(path, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		r = -errno;
		log_err("cannot check the socket path %s: %s", path, strerror(-r));
		return r;
	}
	if (!S_ISSOCK(st.st_mode)) {
		log_err("%s exists and is not a socket (%s): refusing to replace it; remove it or "
			"give kvtierd another --socket",
			path, file_kind(st.st_mode));
		return -EEXIST;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0 ? 0 : -errno;
	close(fd);
	if (r == 0 || r == -EAGAIN) { /* EAGAIN: a live listener with a full backlog */
		log_err("another kvtierd is listening on %s", path);
		return -EADDRINUSE;
	}
	if (r != -ECONNREFUSED) {
		log_err("%s: cannot tell whether something listens there (connect: %s): refusing "
			"to replace it",
			path, strerror(-r));
		return r;
	}
	if (unlink(path) < 0 && errno != ENOENT) {
		r = -errno;
		log_err("cannot remove the stale socket %s: %s", path, strerror(-r));
		return r;
	}
	log_notice("removed the stale socket %s (nothing listened on it)", path);
	return 0;
}

static int
socket_bind(struct kvtd *d)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	const char *path = d->cfg.socket_path;
	struct stat st;
	int fd, r;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	r = socket_lock(d);
	if (r < 0)
		return r;
	r = socket_path_free(path, &sa);
	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		if (r == -ENOENT)
			log_socket_dir_missing(path);
		else
			log_err("bind %s: %s", path, strerror(-r));
		goto err;
	}
	if (lstat(path, &st) < 0) {
		r = -errno;
		log_err("%s vanished after bind: %s", path, strerror(-r));
		goto err;
	}
	d->sock_dev = st.st_dev;
	d->sock_ino = st.st_ino;
	d->listen_fd = fd;
	if (chmod(path, d->cfg.socket_mode) < 0) {
		r = -errno;
		log_err("chmod %s: %s", path, strerror(-r));
		return r;
	}
	if (d->cfg.socket_group[0]) {
		struct group *g = getgrnam(d->cfg.socket_group);

		if (!g || chown(path, (uid_t)-1, g->gr_gid) < 0) {
			r = g ? -errno : -ENOENT;
			log_err("chown %s to group %s: %s", path, d->cfg.socket_group,
				strerror(-r));
			return r;
		}
	}
	if (listen(fd, 128) < 0) {
		r = -errno;
		log_err("listen %s: %s", path, strerror(-r));
		return r;
	}
	return 0;
err:
	close(fd);
	return r;
}

/* Closes the listener; the socket file goes only if it is still the one bound (an operator or
 * another daemon may have put something else there since), then the lock file, still locked. */
static void
socket_release(struct kvtd *d)
{
	struct stat st;

	if (d->listen_fd >= 0) {
		close(d->listen_fd);
		d->listen_fd = -1;
		if (lstat(d->cfg.socket_path, &st) == 0 && S_ISSOCK(st.st_mode) &&
		    st.st_dev == d->sock_dev && st.st_ino == d->sock_ino)
			unlink(d->cfg.socket_path);
	}
	if (d->lock_fd >= 0) {
		char lock[sizeof(d->cfg.socket_path) + 8];

		snprintf(lock, sizeof(lock), "%s.lock", d->cfg.socket_path);
		unlink(lock);
		close(d->lock_fd);
		d->lock_fd = -1;
	}
}

int
kvtd_loop_listen(struct kvtd *d)
{
	d->listen_fd = d->signal_fd = d->timer_fd = d->metrics_fd = d->lock_fd = -1;
	return socket_bind(d);
}

/* The signals the main loop reads from its signalfd. */
static void
loop_sigset(sigset_t *ret_mask)
{
	sigemptyset(ret_mask);
	sigaddset(ret_mask, SIGTERM);
	sigaddset(ret_mask, SIGINT);
	sigaddset(ret_mask, SIGHUP);
	sigaddset(ret_mask, SIGUSR2);
}

void
kvtd_loop_block_signals(void)
{
	sigset_t mask;

	loop_sigset(&mask);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
}

/* What kvtd_loop_init() set up, closed and reset: safe on a half-built or finished loop. */
static void
loop_release(struct kvtd *d)
{
	if (d->ring) {
		io_uring_queue_exit(d->ring);
		free(d->ring);
		d->ring = NULL;
	}
	if (d->signal_fd >= 0)
		close(d->signal_fd);
	if (d->timer_fd >= 0)
		close(d->timer_fd);
	d->signal_fd = d->timer_fd = -1;
	kvtd_metrics_fini(d);
	free(d->uids);
	d->uids = NULL;
	d->n_uids = 0;
	d->rearm = 0;
}

static const char *
src_name(unsigned src)
{
	return src == SRC_SIGNAL ? "signal" : src == SRC_TIMER ? "timer" : "metrics";
}

static int
src_fd(const struct kvtd *d, unsigned src)
{
	return src == SRC_SIGNAL ? d->signal_fd : src == SRC_TIMER ? d->timer_fd : d->metrics_fd;
}

/*
 * Polls fixed source @src again. The SQ may have no room (io_uring_submit() refused, -EBUSY
 * while completions overflow): the source is then retried at the next turn of the loop, which
 * waits with a timeout meanwhile, so that a signal or the timer is never left unwatched.
 */
static void
arm_src(struct kvtd *d, unsigned src)
{
	int r = arm_poll(d, src_fd(d, src), src);

	if (r == 0) {
		d->rearm &= ~(1u << src);
		return;
	}
	if (!(d->rearm & (1u << src)))
		log_err("polling the %s fd: %s: retrying", src_name(src), strerror(-r));
	d->rearm |= 1u << src;
}

int
kvtd_loop_init(struct kvtd *d)
{
	unsigned tick_ms = (d->cfg.hello_timeout_ms < d->cfg.admin_idle_timeout_ms
				? d->cfg.hello_timeout_ms
				: d->cfg.admin_idle_timeout_ms) /
			   4;
	struct itimerspec its = {0};
	sigset_t mask;
	int r;

	loop_sigset(&mask);
	d->signal_fd = d->timer_fd = d->metrics_fd = -1;
	d->signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (d->signal_fd < 0) {
		r = -errno;
		log_err("signalfd: %s", strerror(-r));
		goto err;
	}
	if (tick_ms < 50)
		tick_ms = 50;
	if (tick_ms > 1000)
		tick_ms = 1000;
	d->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (d->timer_fd < 0) {
		r = -errno;
		log_err("timerfd_create: %s", strerror(-r));
		goto err;
	}
	its.it_interval.tv_sec = tick_ms / 1000;
	its.it_interval.tv_nsec = (long)(tick_ms % 1000) * 1000000;
	its.it_value = its.it_interval;
	timerfd_settime(d->timer_fd, 0, &its, NULL);
	d->ring = calloc(1, sizeof(*d->ring));
	if (!d->ring) {
		r = -ENOMEM;
		goto err;
	}
	r = io_uring_queue_init(256, d->ring, 0);
	if (r < 0) {
		free(d->ring);
		d->ring = NULL;
		log_err("io_uring_queue_init: %s", strerror(-r));
		goto err;
	}
	r = kvtd_metrics_init(d); /* logged */
	if (r < 0 && d->restoring) {
		/* Never fatal to the sessions a restart carries: /metrics comes back later. */
		log_warn("metrics_listen %s: serving without /metrics for now, trying again",
			 d->cfg.metrics_listen);
		d->metrics_backoff_ns = 1000000000ULL;
		d->metrics_retry_ns = kvtd_now_ns() + d->metrics_backoff_ns;
		r = 0;
	}
	if (r < 0)
		goto err;
	d->n_uids = d->cfg.max_sessions;
	d->uids = calloc(d->n_uids, sizeof(*d->uids));
	if (!d->uids) {
		r = -ENOMEM;
		goto err;
	}
	d->listen_armed = arm_poll(d, d->listen_fd, SRC_LISTEN) == 0;
	d->listen_paused = d->listen_armed ? 0 : LISTEN_NOFD; /* else the timer arms it */
	/* An empty SQ of 256 entries takes these; if not, the loop retries them (arm_src()). */
	arm_src(d, SRC_SIGNAL);
	arm_src(d, SRC_TIMER);
	if (d->metrics_fd >= 0)
		arm_src(d, SRC_METRICS);
	log_notice("listening on %s (mode %04o%s%s)", d->cfg.socket_path, d->cfg.socket_mode,
		   d->cfg.socket_group[0] ? ", group " : "", d->cfg.socket_group);
	return 0;

err:
	loop_release(d); /* the listener stays: kvtd_loop_fini() is its undo */
	return r;
}

int
kvtd_loop_run(struct kvtd *d)
{
	while (!d->stopping) {
		struct io_uring_cqe *cqe;
		uint64_t ud;
		int res, r;

		for (unsigned src = SRC_SIGNAL; d->rearm && src <= SRC_METRICS; src++)
			if (d->rearm & (1u << src))
				arm_src(d, src);
		io_uring_submit(d->ring);
		if (d->rearm) {
			/* a source waits for room in the SQ: come back soon to retry it */
			struct __kernel_timespec ts = {.tv_nsec = 10 * 1000000};

			r = io_uring_wait_cqe_timeout(d->ring, &cqe, &ts);
			if (r == -ETIME)
				continue;
		} else {
			r = io_uring_wait_cqe(d->ring, &cqe);
		}
		if (r == -EINTR)
			continue;
		if (r < 0) {
			log_err("io_uring_wait_cqe: %s", strerror(-r));
			return r;
		}
		ud = io_uring_cqe_get_data64(cqe);
		res = cqe->res;
		io_uring_cqe_seen(d->ring, cqe);
		switch (ud) {
		case SRC_LISTEN:
			d->listen_armed = 0;
			do_accept(d); /* re-arms the poll, unless it pauses the listener */
			break;
		case SRC_SIGNAL:
			on_signal(d);
			arm_src(d, SRC_SIGNAL);
			break;
		case SRC_TIMER:
			on_timer(d);
			arm_src(d, SRC_TIMER);
			break;
		case SRC_METRICS:
			kvtd_metrics_serve(d);
			arm_src(d, SRC_METRICS);
			break;
		default: {
			struct kvtd_conn *c = (struct kvtd_conn *)(uintptr_t)ud;

			if (kvtd_metrics_owns(ud)) {
				kvtd_metrics_event(d, ud, res);
				break;
			}

			if (res < 0 || conn_ready(d, c, res) < 0 || (res & (POLLHUP | POLLRDHUP))) {
				conn_close(d, c);
			} else if ((r = arm_poll(d, c->fd, ud)) < 0) {
				/* unwatched, it would hang: its peer reconnects */
				log_warn(
				    "connection of pid %d: cannot poll it again (%s): closing it",
				    (int)c->pid, strerror(-r));
				conn_close(d, c);
			}
		}
		}
		if (d->restart_pending) {
			/* the asker, unless it hung up in this turn (conn_close() forgets it) */
			void *asker = d->restart_conn;

			d->restart_pending = 0;
			r = kvtd_restart(d); /* returns only when the restart failed */
			d->restart_conn = NULL;
			if (!asker && r == -EOPNOTSUPP) {
				/* systemctl reload sends SIGUSR2: where a restart in place cannot
				 * be done, it still re-reads the configuration, as SIGHUP does */
				log_notice("SIGUSR2: reloading the configuration instead");
				kill(getpid(), SIGHUP);
			}
			if (asker) {
				char msg[512];

				if (d->restart_why[0])
					snprintf(msg, sizeof(msg),
						 "restart refused: %s (kvtierd keeps running, "
						 "every session kept)",
						 d->restart_why);
				else
					snprintf(msg, sizeof(msg),
						 "restart failed: %s (kvtierd keeps running; "
						 "see its log)",
						 strerror(-r));
				kvtd_loop_reply(d, asker, d->restart_req_id, r, msg);
			}
		}
	}
	return 0;
}

void
kvtd_loop_fini(struct kvtd *d)
{
	while (d->conns)
		conn_close(d, d->conns);
	socket_release(d);
	loop_release(d);
}

int
kvtd_loop_conns(struct kvtd *d, int (*fn)(void *ctx, const struct kvtd_conn_info *ci), void *ctx)
{
	for (struct kvtd_conn *c = d->conns; c; c = c->next) {
		struct kvtd_conn_info ci = {c->fd,  c->state,	   c->pid, c->uid,
					    c->gid, c->privileged, c->s,   c};
		int r;

		if (!c->deadline_ns && c->state != CONN_SESSION)
			continue; /* being closed */
		if (c->s && c->s->broken)
			continue;
		r = fn(ctx, &ci);
		if (r)
			return r;
	}
	return 0;
}

int
kvtd_loop_adopt(struct kvtd *d, const struct kvtd_conn_info *ci, void **ret_conn)
{
	uint64_t now = kvtd_now_ns();
	struct kvtd_conn *c;
	int r;

	if (ci->state < CONN_NEW || ci->state > CONN_ADMIN ||
	    (ci->state == CONN_SESSION) != !!ci->s)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = ci->fd;
	c->state = ci->state;
	c->pid = ci->pid;
	c->uid = ci->uid;
	c->gid = ci->gid;
	c->privileged = ci->privileged;
	if (ci->state == CONN_ADMIN)
		c->deadline_ns = now + (uint64_t)d->cfg.admin_idle_timeout_ms * 1000000;
	else if (ci->state != CONN_SESSION)
		c->deadline_ns = now + (uint64_t)d->cfg.hello_timeout_ms * 1000000;
	if (ci->s) {
		/* Kept even past a lowered limit: a restart does not end sessions. */
		c->uid_ent = uid_get(d, c->uid);
		if (!c->uid_ent) {
			free(c);
			return -EUSERS;
		}
		c->uid_ent->sessions++;
		/* what the restore claimed was charged to the session only: the uid's share. Under
		 * the pool lock, as every account: sessions adopted before this one already run
		 * on pollers and charge the same uid. */
		pthread_mutex_lock(&d->pool.lock);
		c->uid_ent->acct.bytes += ci->s->acct.bytes;
		pthread_mutex_unlock(&d->pool.lock);
		/* and its pool classes, counted among the uid's (classes_per_uid) */
		kvtd_session_uid_join(ci->s, c->uid_ent);
		ci->s->sock = c->fd;
		r = kvtd_poller_attach(d, ci->s);
		if (r < 0) {
			pthread_mutex_lock(&d->pool.lock);
			c->uid_ent->acct.bytes -= ci->s->acct.bytes;
			pthread_mutex_unlock(&d->pool.lock);
			kvtd_session_uid_leave(ci->s);
			c->uid_ent->sessions--;
			free(c);
			return r;
		}
		c->s = ci->s;
		d->n_sessions++;
	}
	if (arm_poll(d, c->fd, (uint64_t)(uintptr_t)c) < 0) {
		if (c->s) {
			kvtd_poller_detach(c->s);
			c->uid_ent->acct.bytes -= c->s->acct.bytes;
			kvtd_session_uid_leave(c->s);
			c->uid_ent->sessions--;
			d->n_sessions--;
		}
		free(c);
		return -EBUSY;
	}
	c->next = d->conns;
	if (d->conns)
		d->conns->prev = c;
	d->conns = c;
	d->n_conns++;
	*ret_conn = c;
	return 0;
}

void
kvtd_loop_reply(struct kvtd *d, void *conn, uint64_t id, int err, const char *text)
{
	struct kvtd_conn *c = conn;

	if (err < 0) {
		send_error(c->fd, id, err, "%s", text);
		return;
	}
	reply_json(c, id, json_tokener_parse(text));
}
