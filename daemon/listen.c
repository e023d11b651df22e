/* SPDX-License-Identifier: MIT */
/*
 * listen.c - the control socket and admission to it: one daemon per socket path (an flock on
 * "<socket>.lock"), the bind that replaces only a stale socket, accept with the peer's
 * credentials (SO_PEERCRED, SO_PEERGROUPS) checked against allowed_uids/gids,
 * connections_per_uid and admin_gids, HELLO's admission of a session within the ring, arena and
 * session limits, and the close that gives back what a connection was admitted to. listen.h
 * says what each part guarantees.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvt_ctl.h"
#include "kvt_dev.h"
#include "kvtd.h"
#include "listen.h"
#include "log.h"
#include "poller.h"
#include "session.h"

int
kvtd_listen_poll(struct kvtd *d, int fd, uint64_t user_data)
{
	return kvtd_ring_poll(d, fd, POLLIN | POLLRDHUP, user_data);
}

void
kvtd_conn_error(int fd, uint64_t id, int err, const char *fmt, ...)
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

struct kvtd_uid *
kvtd_uid_get(struct kvtd *d, uid_t uid)
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
void
kvtd_listen_resume(struct kvtd *d)
{
	if (!d->listen_paused || d->listen_armed || d->stopping || d->listen_fd < 0 ||
	    d->n_conns >= d->cfg.max_connections)
		return;
	/* listen_paused stays until kvtd_listen_accept() gets to EAGAIN: a pause is logged once */
	if (kvtd_listen_poll(d, d->listen_fd, KVTD_SRC_LISTEN) == 0)
		d->listen_armed = 1;
	else
		d->listen_paused = LISTEN_NOFD; /* the timer tries again */
}

void
kvtd_conn_close(struct kvtd *d, struct kvtd_conn *c)
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
	kvtd_listen_resume(d); /* a slot and a descriptor are free again */
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

int
kvtd_listen_hello(struct kvtd *d, struct kvtd_conn *c, const struct kvt_ctl_hello *h)
{
	const struct kvtd_config *cfg = &d->cfg;
	struct kvt_ctl_welcome w;
	struct kvtd_session *s;
	uint64_t sq, cq, arena;
	int r;

	if (h->abi_major != KVT_ABI_MAJOR) {
		kvtd_conn_error(c->fd, h->hdr.id, -EPROTO,
				"ABI mismatch: client speaks %u.%u, kvtierd speaks %u.%u",
				h->abi_major, h->abi_minor, KVT_ABI_MAJOR, KVT_ABI_MINOR);
		log_warn("pid %d: ABI mismatch (client %u.%u, daemon %u.%u)", (int)c->pid,
			 h->abi_major, h->abi_minor, KVT_ABI_MAJOR, KVT_ABI_MINOR);
		return -EPROTO;
	}
	/* Checked after the ABI major (another major may lay them out otherwise); zero now, so that
	 * a later minor version can give them meaning. */
	if (h->reserved0 || h->reserved[0] || h->reserved[1]) {
		kvtd_conn_error(
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
		kvtd_conn_error(c->fd, h->hdr.id, -EINVAL,
				"ring size sq %u cq %u outside limits (sq <= %u, sq <= cq <= %u)",
				h->sq_entries, h->cq_entries, cfg->max_sq_entries,
				2 * cfg->max_sq_entries);
		return -EINVAL;
	}
	cq = pow2_up(cq);
	arena = h->arena_size ? h->arena_size : cfg->default_arena_size;
	if (arena > cfg->max_arena_size) {
		kvtd_conn_error(c->fd, h->hdr.id, -EINVAL, "arena %llu bytes above limit %llu",
				(unsigned long long)arena, (unsigned long long)cfg->max_arena_size);
		return -EINVAL;
	}
	if (d->n_sessions >= cfg->max_sessions) {
		atomic_fetch_add(&d->cnt.refused_limit, 1);
		kvtd_conn_error(c->fd, h->hdr.id, -EUSERS, "kvtierd has %u sessions (max_sessions)",
				d->n_sessions);
		return -EUSERS;
	}
	c->uid_ent = kvtd_uid_get(d, c->uid);
	if (!c->uid_ent || c->uid_ent->sessions >= cfg->sessions_per_uid) {
		c->uid_ent = NULL;
		atomic_fetch_add(&d->cnt.refused_limit, 1);
		kvtd_conn_error(c->fd, h->hdr.id, -EUSERS,
				"uid %u has %u sessions (sessions_per_uid)", (unsigned)c->uid,
				cfg->sessions_per_uid);
		return -EUSERS;
	}
	c->uid_ent->sessions++;
	r = kvtd_session_create(d, (uint32_t)sq, (uint32_t)cq, arena, &s);
	if (r < 0) {
		kvtd_conn_error(c->fd, h->hdr.id, r, "cannot create session: %s", strerror(-r));
		return r;
	}
	s->id = ++d->next_session_id;
	((struct kvt_region_hdr *)s->region)->session_id = s->id;
	s->sock = c->fd;
	s->pid = c->pid;
	s->uid = c->uid;
	s->gid = c->gid;
	s->uid_ent = c->uid_ent;
	s->prefix_scope = kvtd_conn_prefix_scope(d, c); /* prefix.c decides */
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

static int
gid_listed(const gid_t *list, unsigned n, gid_t g)
{
	for (unsigned i = 0; i < n; i++)
		if (list[i] == g)
			return 1;
	return 0;
}

/* The peer's groups: @gid, its primary one, then the supplementary ones SO_PEERGROUPS gives
 * (taken at connect(), like SO_PEERCRED); @gid alone where the kernel cannot say (before 4.13) or
 * memory is short. Returns the count; *@ret_gids is @small (room for @n_small) or, for more, an
 * allocation the caller frees. */
static size_t
peer_groups(int fd, gid_t gid, gid_t *small, size_t n_small, gid_t **ret_gids)
{
	socklen_t len = (socklen_t)((n_small - 1) * sizeof(gid_t));
	gid_t *g = small;

	*ret_gids = small;
	small[0] = gid;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, small + 1, &len) == 0)
		return 1 + len / sizeof(gid_t);
	if (errno != ERANGE) /* e.g. a kernel before 4.13: the primary group only */
		return 1;
	g = malloc(sizeof(gid_t) + len); /* len now says how much the peer's groups take */
	if (!g)
		return 1;
	g[0] = gid;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g + 1, &len) < 0) {
		free(g);
		return 1;
	}
	*ret_gids = g;
	return 1 + len / sizeof(gid_t);
}

/* Is one of the peer's groups (peer_groups()) in @list? */
static int
peer_in_groups(int fd, gid_t gid, const gid_t *list, unsigned n)
{
	gid_t small[65], *g;
	size_t ng;
	int found = 0;

	if (!n)
		return 0;
	ng = peer_groups(fd, gid, small, 65, &g);
	for (size_t i = 0; i < ng && !found; i++)
		found = gid_listed(list, n, g[i]);
	if (g != small)
		free(g);
	return found;
}

uint64_t
kvtd_conn_prefix_scope(const struct kvtd *d, const struct kvtd_conn *c)
{
	gid_t small[65], *g = small;
	size_t ng = 1;
	uint64_t scope;

	small[0] = c->gid;
	if (d->cfg.n_prefix_share_gids) /* else its groups do not matter */
		ng = peer_groups(c->fd, c->gid, small, 65, &g);
	scope = kvtd_prefix_scope(&d->cfg, c->uid, g, ng);
	if (g != small)
		free(g);
	return scope;
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
void
kvtd_listen_accept(struct kvtd *d)
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
		if (kvtd_listen_poll(d, fd, (uint64_t)(uintptr_t)c) < 0)
			kvtd_conn_close(d, c);
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
	if (kvtd_listen_poll(d, d->listen_fd, KVTD_SRC_LISTEN) == 0)
		d->listen_armed = 1;
	else
		d->listen_paused = LISTEN_NOFD;
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

int
kvtd_listen_open(struct kvtd *d)
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
void
kvtd_listen_close(struct kvtd *d)
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
