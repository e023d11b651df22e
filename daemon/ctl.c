/* SPDX-License-Identifier: MIT */
/*
 * ctl.c - the control messages of a connection: each is read whole (SOCK_SEQPACKET, with the
 * descriptors it carries), checked and answered with exactly one reply carrying its id. One
 * table row per request type (ctl_defs, struct kvtd_ctl_def in ctl.h) says what it needs of its
 * connection and its length; handle_msg() checks those for every type alike, then the row's
 * handler checks its payload. Admin requests (STATUS, CLIENTS, SEQS, BLOCKS, METRICS, RESTART)
 * make a connection an admin one; buffer registration and EVENT_GET need the session that HELLO
 * (listen.c) admitted. A peer that is not privileged sees only what is its own uid's.
 * To add a request: its type and struct in proto/kvt_ctl.h, one row and one handler here, its
 * line in check_ctl_table's spec[] (the protocol the rows are held to).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl.h"
#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvtd.h"
#include "listen.h"
#include "metrics_format.h"
#include "poller.h"
#include "session.h"
#include "stats.h"

void
kvtd_ctl_reply_json(struct kvtd_conn *c, uint64_t id, struct json_object *o)
{
	const char *txt = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
	size_t tlen = strlen(txt) + 1;
	struct kvt_ctl_hdr h = {.type = KVT_CTL_JSON, .id = id};
	struct iovec iov[2] = {{&h, sizeof(h)}, {(void *)txt, tlen}};
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};

	if (sizeof(h) + tlen > KVT_CTL_MAX_MSG) {
		kvtd_conn_error(c->fd, id, -E2BIG, "reply of %zu bytes exceeds %u", tlen,
				KVT_CTL_MAX_MSG);
	} else {
		h.len = (uint32_t)(sizeof(h) + tlen);
		sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	json_object_put(o);
}

/* METRICS: the text exposition (KVT_CTL_TEXT) or its JSON document (metrics_format.h). */
static int
ctl_metrics(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	const struct kvt_ctl_metrics *m = msg;
	struct json_object *doc = NULL;
	struct kvt_ctl_hdr h = {.type = KVT_CTL_TEXT, .id = m->hdr.id};
	char *text = NULL;
	size_t tlen = 0;
	int r;

	if ((m->flags & ~KVT_CTL_METRICS_F_ALL) || m->reserved0) {
		kvtd_conn_error(
		    c->fd, m->hdr.id, -EINVAL,
		    "malformed METRICS request: flags 0x%x not within 0x%x, or reserved0 "
		    "%u not zero",
		    m->flags, KVT_CTL_METRICS_F_ALL, m->reserved0);
		return 0;
	}
	r = kvtd_prom_render(d, m->flags, c->privileged ? NULL : &c->uid, &text, &tlen, &doc);
	if (r < 0) {
		kvtd_conn_error(c->fd, m->hdr.id, r, "metrics unavailable: %s", strerror(-r));
		return 0;
	}
	if (doc) {
		kvtd_ctl_reply_json(c, m->hdr.id, doc);
		return 0;
	}
	if (sizeof(h) + tlen + 1 > KVT_CTL_MAX_MSG) {
		kvtd_conn_error(
		    c->fd, m->hdr.id, -E2BIG,
		    "metrics of %zu bytes exceed a message (%u); leave out the per-session "
		    "families or scrape /metrics",
		    tlen, KVT_CTL_MAX_MSG);
	} else {
		struct iovec iov[2] = {{&h, sizeof(h)}, {text, tlen + 1}};
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};

		h.len = (uint32_t)(sizeof(h) + tlen + 1);
		sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	free(text);
	return 0;
}

static int
ctl_buf_register(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	const struct kvt_ctl_buf_register *m = msg;
	struct kvt_ctl_buf_registered ok;
	struct kvt_dev_import imp;
	struct kvt_dev_buf *buf;
	int r;

	if (m->flags || m->reserved[0] || m->reserved[1]) {
		kvtd_conn_error(c->fd, m->hdr.id, -EINVAL,
				"malformed BUF_REGISTER: flags and reserved must be zero");
		return 0;
	}
	if (m->kind == KVT_BUF_HOST_MEMFD && fd < 0) {
		kvtd_conn_error(c->fd, m->hdr.id, -EBADF, "BUF_REGISTER of a memfd carries no fd");
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
		kvtd_conn_error(
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
		kvtd_conn_error(c->fd, m->hdr.id, r,
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
		kvtd_conn_error(c->fd, m->hdr.id, r, "too many buffers (buffers_per_session = %u)",
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

static int
ctl_buf_unregister(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	const struct kvt_ctl_buf_unregister *m = msg;
	struct kvt_ctl_hdr ok = {.type = KVT_CTL_OK, .len = sizeof(ok), .id = m->hdr.id};
	int r;

	if (m->reserved0) {
		kvtd_conn_error(c->fd, m->hdr.id, -EINVAL,
				"malformed BUF_UNREGISTER: reserved0 must be zero");
		return 0;
	}
	kvtd_poller_lock(c->s->poller);
	r = kvtd_session_buf_unregister(c->s, m->buf_id);
	kvtd_poller_unlock(c->s->poller);
	if (r < 0)
		kvtd_conn_error(c->fd, m->hdr.id, r,
				r == -EBUSY ? "buffer %u is in use by an open sequence"
					    : "no buffer %u",
				m->buf_id);
	else
		send(c->fd, &ok, sizeof(ok), MSG_NOSIGNAL | MSG_DONTWAIT);
	return 0;
}

static int
ctl_event_get(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	const struct kvt_ctl_event_get *m = msg;
	struct kvt_ctl_event ev = {
	    .hdr = {.type = KVT_CTL_EVENT, .len = sizeof(ev), .id = m->hdr.id}};
	struct kvtd_session *s = c->s;
	int r = 0;

	if (m->reserved[0] || m->reserved[1]) {
		kvtd_conn_error(c->fd, m->hdr.id, -EINVAL,
				"malformed EVENT_GET: reserved must be zero");
		return 0;
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
		kvtd_conn_error(c->fd, m->hdr.id, r,
				r == -EOPNOTSUPP
				    ? "the %s backend has no events: copies are complete "
				      "when the CQE is posted"
				    : "no event on the %s backend: %s",
				kvt_dev_name(d->dev), strerror(-r));
		return 0;
	}
	memcpy(ev.ipc_handle, s->event_handle, sizeof(ev.ipc_handle));
	send(c->fd, &ev, sizeof(ev), MSG_NOSIGNAL | MSG_DONTWAIT);
	return 0;
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
static int
ctl_blocks(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	const struct kvt_ctl_hdr *h = msg;
	uint64_t scopes[2] = {(uint64_t)c->uid + 1, 0};
	unsigned n = kvtd_conn_prefix_scope(d, c) == 0 ? 2 : 1;

	kvtd_ctl_reply_json(c, h->id, kvtd_stats_blocks(d, c->privileged ? NULL : scopes, n));
	return 0;
}

static int
ctl_hello(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	return kvtd_listen_hello(d, c, msg);
}

static int
ctl_status(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	kvtd_ctl_reply_json(c, ((const struct kvt_ctl_hdr *)msg)->id,
			    kvtd_stats_status(d, c->privileged ? NULL : &c->uid));
	return 0;
}

static int
ctl_clients(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	kvtd_ctl_reply_json(c, ((const struct kvt_ctl_hdr *)msg)->id,
			    keep_visible(d, c, kvtd_stats_clients(d), "clients"));
	return 0;
}

static int
ctl_seqs(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	kvtd_ctl_reply_json(c, ((const struct kvt_ctl_hdr *)msg)->id,
			    keep_visible(d, c, kvtd_stats_seqs(d), "seqs"));
	return 0;
}

static int
ctl_restart(struct kvtd *d, struct kvtd_conn *c, const void *msg, size_t len, int fd)
{
	const struct kvt_ctl_hdr *h = msg;

	if (d->restart_pending) {
		kvtd_conn_error(c->fd, h->id, -EALREADY,
				"a restart is already under way; the request that asked first "
				"gets its answer");
		return 0;
	}
	/* At the end of this turn of the loop; the reply comes from the new process. */
	d->restart_pending = 1;
	d->restart_conn = c;
	d->restart_req_id = h->id;
	return 0;
}

#define CTL(n, len_lo, len_hi, nd, adm, only, f)                                                   \
	{                                                                                          \
		.name = n, .min_len = len_lo, .max_len = len_hi, .needs = nd, .admin = adm,        \
		.admin_only = only, .fn = f                                                        \
	}
#define HDR sizeof(struct kvt_ctl_hdr)
#define ANY KVT_CTL_MAX_MSG

/* One row per request type; a type without one is refused (-EINVAL). */
static const struct kvtd_ctl_def ctl_defs[] = {
    [KVT_CTL_HELLO] = CTL("HELLO", sizeof(struct kvt_ctl_hello), ANY, KVTD_CTL_NEEDS_NEW, false,
			  false, ctl_hello),
    [KVT_CTL_BUF_REGISTER] = CTL("BUF_REGISTER", sizeof(struct kvt_ctl_buf_register), ANY,
				 KVTD_CTL_NEEDS_SESSION, false, false, ctl_buf_register),
    [KVT_CTL_BUF_UNREGISTER] = CTL("BUF_UNREGISTER", sizeof(struct kvt_ctl_buf_unregister), ANY,
				   KVTD_CTL_NEEDS_SESSION, false, false, ctl_buf_unregister),
    [KVT_CTL_EVENT_GET] = CTL("EVENT_GET", sizeof(struct kvt_ctl_event_get), ANY,
			      KVTD_CTL_NEEDS_SESSION, false, false, ctl_event_get),
    [KVT_CTL_STATUS] = CTL("STATUS", HDR, ANY, KVTD_CTL_NEEDS_NONE, true, false, ctl_status),
    [KVT_CTL_CLIENTS] = CTL("CLIENTS", HDR, ANY, KVTD_CTL_NEEDS_NONE, true, false, ctl_clients),
    [KVT_CTL_SEQS] = CTL("SEQS", HDR, ANY, KVTD_CTL_NEEDS_NONE, true, false, ctl_seqs),
    [KVT_CTL_RESTART] = CTL("RESTART", HDR, ANY, KVTD_CTL_NEEDS_NONE, true, true, ctl_restart),
    [KVT_CTL_METRICS] =
	CTL("METRICS", sizeof(struct kvt_ctl_metrics), sizeof(struct kvt_ctl_metrics),
	    KVTD_CTL_NEEDS_NONE, true, false, ctl_metrics),
    [KVT_CTL_BLOCKS] = CTL("BLOCKS", HDR, HDR, KVTD_CTL_NEEDS_NONE, true, false, ctl_blocks),
};

#undef CTL
#undef HDR
#undef ANY

const struct kvtd_ctl_def *
kvtd_ctl_def(uint32_t type)
{
	if (type >= sizeof(ctl_defs) / sizeof(ctl_defs[0]) || !ctl_defs[type].fn)
		return NULL;
	return &ctl_defs[type];
}

/* A refusal: ERROR @err with the reason. A connection still new (nothing valid said yet) is
 * dropped after it; any other goes on. Returns what handle_msg() returns. */
static int ctl_refuse(struct kvtd_conn *c, uint64_t id, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
ctl_refuse(struct kvtd_conn *c, uint64_t id, int err, const char *fmt, ...)
{
	char why[sizeof(((struct kvt_ctl_error *)0)->msg)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	kvtd_conn_error(c->fd, id, err, "%s", why);
	return c->state == CONN_NEW ? err : 0;
}

/* One message. Returns < 0 to drop the connection. Every check a row asks for is made here, in
 * this order and with these errnos, for every type alike; the handler then checks its payload. */
static int
handle_msg(struct kvtd *d, struct kvtd_conn *c, const uint8_t *buf, size_t len, int fd)
{
	const struct kvt_ctl_hdr *h = (const struct kvt_ctl_hdr *)buf;
	const struct kvtd_ctl_def *def;

	if (c->state == CONN_REFUSED && c->refused == -EUSERS) {
		kvtd_conn_error(
		    c->fd, len >= sizeof(*h) ? h->id : 0, -EUSERS,
		    "uid %u holds %u control connections, connections_per_uid is %u: close "
		    "one first",
		    (unsigned)c->uid, c->uid_conns, d->cfg.connections_per_uid);
		return -EUSERS;
	}
	if (c->state == CONN_REFUSED) {
		kvtd_conn_error(
		    c->fd, len >= sizeof(*h) ? h->id : 0, -EACCES,
		    "uid %u is not allowed to use kvtierd (allowed_uids / allowed_gids in "
		    "kvtierd.conf)",
		    (unsigned)c->uid);
		return -EACCES;
	}
	if (len < sizeof(*h) || h->len != len)
		return ctl_refuse(c, len >= sizeof(*h) ? h->id : 0, -EINVAL,
				  "malformed control message (%zu bytes)", len);
	def = kvtd_ctl_def(h->type);
	if (!def)
		return ctl_refuse(c, h->id, -EINVAL, "unknown control message type %u", h->type);
	if (def->admin)
		admin_touch(d, c);
	if (def->needs == KVTD_CTL_NEEDS_NEW && c->state != CONN_NEW)
		return ctl_refuse(
		    c, h->id, -EALREADY,
		    "%s refused: HELLO comes first and once on a connection (this one "
		    "has said HELLO or an admin request)",
		    def->name);
	if (def->admin_only && !c->privileged)
		return ctl_refuse(c, h->id, -EPERM,
				  "%s is for root, kvtierd's uid or an admin_gids group",
				  def->name);
	if (def->needs == KVTD_CTL_NEEDS_SESSION && c->state != CONN_SESSION)
		return ctl_refuse(c, h->id, -ENOTCONN, "%s needs a session (send HELLO first)",
				  def->name);
	if (len < def->min_len || len > def->max_len)
		return ctl_refuse(c, h->id, -EINVAL, "malformed %s request: %zu bytes, want %s%u",
				  def->name, len,
				  def->min_len == def->max_len ? ""
				  : len < def->min_len	       ? "at least "
							       : "at most ",
				  len < def->min_len ? def->min_len : def->max_len);
	return def->fn(d, c, buf, len, fd);
}

/* Readable or hung up. Returns < 0 when the connection is to be closed. */
int
kvtd_ctl_ready(struct kvtd *d, struct kvtd_conn *c, int revents)
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
			kvtd_conn_error(c->fd, 0, -EMSGSIZE, "control message too large");
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
