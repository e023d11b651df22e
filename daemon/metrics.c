/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - GET and HEAD /metrics over HTTP on a loopback address ([daemon] metrics_listen),
 * for a Prometheus scrape: the text kvtd_prom_render() formats (prom.c), the same that
 * `kvtierctl metrics` gets with KVT_CTL_METRICS. /metrics?sessions=1 adds the per-session
 * and per-sequence families.
 *
 * Scrapers never block the main loop: each connection is non-blocking and driven by the main
 * loop's io_uring (a poll per step, user_data KVTD_METRICS_UD + slot), at most SCRAPERS_MAX at
 * once (more are answered 503 and closed), and each has SCRAPE_TIMEOUT_MS from accept to its
 * last byte sent; past it the timer closes it. A scraper that reads slowly only holds its slot.
 * A uid other than root and kvtierd's own holds at most SCRAPERS_PER_UID slots (its next
 * connection is answered 503), so that no one local user can keep the others' scrapes out.
 *
 * Who scrapes: the uid owning the peer's socket, read from /proc/net/tcp (the daemon's own
 * network namespace, readable under ProtectProc= too). ?sessions=1 shows it only its own uid's
 * sessions, as the control socket does, unless it is root, kvtierd's uid, or a uid whose groups
 * (its primary group and those the group database lists it in) include one of admin_gids. The
 * user database may block (a directory service), so the main loop never asks it: a resolver
 * thread looks a uid's groups up and a ?sessions=1 scrape waits for that answer, within its
 * deadline (past it, it is answered as one of no admin group's); a uid's groups are kept for
 * GROUPS_TTL_S and compared with admin_gids as configured now.
 * One request per connection (HTTP/1.0, Connection: close), of at most REQ_MAX bytes. Only
 * loopback addresses are accepted in the configuration: the endpoint has no authentication.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <liburing.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvtd.h"
#include "log.h"
#include "kvt_ctl.h"
#include "metrics.h"
#include "prom.h"

#define REQ_MAX		  4096
#define SCRAPERS_MAX	  8
#define SCRAPE_TIMEOUT_MS 5000
#define SCRAPERS_PER_UID  2

#define GROUPS_TTL_S  60
#define GROUPS_MAX    256 /* of one uid, looked at for admin_gids */
#define GROUPS_CACHED 16  /* uids; at most SCRAPERS_MAX wait at once */

enum { SCRAPE_FREE, SCRAPE_READ, SCRAPE_WAIT, SCRAPE_WRITE };
enum { GROUPS_FREE, GROUPS_ASKED, GROUPS_KNOWN };

/* A uid's groups, as the resolver thread found them (under resolver.lock). */
struct uid_groups {
	int state;
	uid_t uid;
	uint64_t at_ns; /* when it was found */
	unsigned n;
	gid_t g[GROUPS_MAX];
};

struct resolver {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	int started, stop;
	int efd;   /* written by the thread for each answer; polled by the main loop */
	int armed; /* main thread: a poll on efd is in flight */
	struct uid_groups u[GROUPS_CACHED];
};

struct kvtd_scraper {
	int fd;
	int state;
	uint64_t deadline_ns; /* 0: timed out, closing */
	int64_t uid;	      /* the peer's, -1: not found */
	int no_admin;	      /* its groups were not known in time: answered as no admin's */
	size_t got;	      /* request bytes read */
	char req[REQ_MAX + 1];
	char *out; /* the reply, head and body */
	size_t out_len, out_off;
};

struct kvtd_metrics {
	struct kvtd_scraper s[SCRAPERS_MAX];
	unsigned busy;
	struct resolver res;
};

/* user_data of the resolver's eventfd poll, after the scrapers' */
#define RESOLVER_UD (KVTD_METRICS_UD + SCRAPERS_MAX)

int
kvtd_metrics_parse(const char *s, uint32_t *ret_addr, uint16_t *ret_port)
{
	char host[32];
	const char *colon = strrchr(s, ':');
	struct in_addr a;
	char *end;
	unsigned long port;

	if (!colon || (size_t)(colon - s) >= sizeof(host))
		return -EINVAL;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	if (!strcmp(host, "localhost"))
		snprintf(host, sizeof(host), "127.0.0.1");
	if (inet_pton(AF_INET, host, &a) != 1 || (ntohl(a.s_addr) >> 24) != 127)
		return -EINVAL; /* loopback only: the endpoint has no authentication */
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || port > 65535)
		return -EINVAL;
	*ret_addr = a.s_addr;
	*ret_port = (uint16_t)port;
	return 0;
}

int
kvtd_metrics_init(struct kvtd *d)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t len = sizeof(sa);
	int one = 1, r;

	d->metrics_fd = -1;
	d->metrics = NULL;
	if (!d->cfg.metrics_listen[0])
		return 0;
	if (kvtd_metrics_parse(d->cfg.metrics_listen, &sa.sin_addr.s_addr, &sa.sin_port) < 0) {
		log_err("metrics_listen '%s': want 127.x.x.x:PORT or localhost:PORT",
			d->cfg.metrics_listen);
		return -EINVAL;
	}
	sa.sin_port = htons(sa.sin_port);
	d->metrics_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (d->metrics_fd < 0) {
		r = -errno;
		log_err("metrics_listen %s: socket: %s%s", d->cfg.metrics_listen, strerror(-r),
			r == -EAFNOSUPPORT ? " (under systemd, RestrictAddressFamilies= must "
					     "allow AF_INET)"
					   : "");
		return r;
	}
	setsockopt(d->metrics_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(d->metrics_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(d->metrics_fd, 16) < 0 ||
	    getsockname(d->metrics_fd, (struct sockaddr *)&sa, &len) < 0) {
		r = -errno;
		log_err("metrics_listen %s: %s", d->cfg.metrics_listen, strerror(-r));
		close(d->metrics_fd);
		d->metrics_fd = -1;
		return r;
	}
	d->metrics = calloc(1, sizeof(*d->metrics));
	if (!d->metrics) {
		close(d->metrics_fd);
		d->metrics_fd = -1;
		return -ENOMEM;
	}
	for (unsigned i = 0; i < SCRAPERS_MAX; i++)
		d->metrics->s[i].fd = -1;
	d->metrics->res.efd = -1;
	pthread_mutex_init(&d->metrics->res.lock, NULL);
	pthread_cond_init(&d->metrics->res.cond, NULL);
	d->metrics_port = ntohs(sa.sin_port);
	log_notice("serving /metrics on http://%s:%u/metrics", inet_ntoa(sa.sin_addr),
		   (unsigned)d->metrics_port);
	return 0;
}

void
kvtd_metrics_fini(struct kvtd *d)
{
	if (d->metrics) {
		struct resolver *rs = &d->metrics->res;

		if (rs->started) {
			pthread_mutex_lock(&rs->lock);
			rs->stop = 1;
			pthread_cond_signal(&rs->cond);
			pthread_mutex_unlock(&rs->lock);
			pthread_join(rs->thread, NULL);
		}
		if (rs->efd >= 0)
			close(rs->efd);
		pthread_cond_destroy(&rs->cond);
		pthread_mutex_destroy(&rs->lock);
		for (unsigned i = 0; i < SCRAPERS_MAX; i++) {
			if (d->metrics->s[i].fd >= 0)
				close(d->metrics->s[i].fd);
			free(d->metrics->s[i].out);
		}
		free(d->metrics);
		d->metrics = NULL;
	}
	if (d->metrics_fd >= 0)
		close(d->metrics_fd);
	d->metrics_fd = -1;
}

static int
arm(struct kvtd *d, int fd, unsigned events, uint64_t ud)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(d->ring);

	if (!sqe) {
		io_uring_submit(d->ring);
		sqe = io_uring_get_sqe(d->ring);
		if (!sqe)
			return -EBUSY;
	}
	io_uring_prep_poll_add(sqe, fd, events);
	io_uring_sqe_set_data64(sqe, ud);
	return 0;
}

static void
scraper_close(struct kvtd *d, struct kvtd_scraper *s)
{
	close(s->fd);
	free(s->out);
	memset(s, 0, sizeof(*s));
	s->fd = -1;
	d->metrics->busy--;
}

/*
 * The uid owning the other end of @fd, a TCP connection over loopback: the line of
 * /proc/net/tcp whose local address is our peer's and whose remote address is ours (the kernel
 * prints each address as the raw network-order word, and the port in host order). -1 when no
 * line matches (the peer already gone) or the file cannot be read.
 */
static int64_t
peer_uid(int fd)
{
	struct sockaddr_in me, peer;
	socklen_t ml = sizeof(me), pl = sizeof(peer);
	char line[512];
	int64_t uid = -1;
	FILE *f;

	if (getsockname(fd, (struct sockaddr *)&me, &ml) < 0 ||
	    getpeername(fd, (struct sockaddr *)&peer, &pl) < 0 || me.sin_family != AF_INET)
		return -1;
	f = fopen("/proc/net/tcp", "re");
	if (!f)
		return -1;
	while (uid < 0 && fgets(line, sizeof(line), f)) {
		unsigned la, lp, ra, rp, u;

		/* sl local rem st tx:rx tr:when retrnsmt uid ... */
		if (sscanf(line, " %*u: %X:%X %X:%X %*X %*X:%*X %*X:%*X %*X %u", &la, &lp, &ra, &rp,
			   &u) == 5 &&
		    la == peer.sin_addr.s_addr && lp == ntohs(peer.sin_port) &&
		    ra == me.sin_addr.s_addr && rp == ntohs(me.sin_port))
			uid = u;
	}
	fclose(f);
	return uid;
}

/* Root and kvtierd's own uid see every session, as on the control socket. */
static bool
uid_all_sessions(int64_t uid)
{
	return uid == 0 || uid == (int64_t)geteuid();
}

/* The resolver thread: a uid asked for, its groups from the user database. */
static void *
resolver_main(void *arg)
{
	struct resolver *rs = arg;
	static __thread char pwbuf[16384];

	pthread_mutex_lock(&rs->lock);
	for (;;) {
		struct uid_groups *u = NULL;
		struct passwd pw, *pwp = NULL;
		gid_t g[GROUPS_MAX];
		int n = GROUPS_MAX;
		uid_t uid;

		for (unsigned i = 0; i < GROUPS_CACHED && !u; i++)
			if (rs->u[i].state == GROUPS_ASKED)
				u = &rs->u[i];
		if (!u) {
			if (rs->stop)
				break;
			pthread_cond_wait(&rs->cond, &rs->lock);
			continue;
		}
		uid = u->uid;
		pthread_mutex_unlock(&rs->lock);
		/* outside the lock: this is what may block */
		if (getpwuid_r(uid, &pw, pwbuf, sizeof(pwbuf), &pwp) != 0 || !pwp)
			n = 0; /* no such user: no group makes it an admin */
		else if (getgrouplist(pw.pw_name, pw.pw_gid, g, &n) < 0)
			n = GROUPS_MAX; /* more than it can hold: the first GROUPS_MAX */
		pthread_mutex_lock(&rs->lock);
		u->n = (unsigned)n;
		memcpy(u->g, g, (size_t)n * sizeof(*g));
		u->at_ns = kvtd_now_ns();
		u->state = GROUPS_KNOWN;
		eventfd_write(rs->efd, 1);
	}
	pthread_mutex_unlock(&rs->lock);
	return NULL;
}

/* Main thread: a poll on the resolver's eventfd, unless one is in flight. */
static int
resolver_arm(struct kvtd *d)
{
	struct resolver *rs = &d->metrics->res;
	struct io_uring_sqe *sqe;

	if (rs->armed)
		return 0;
	sqe = io_uring_get_sqe(d->ring);
	if (!sqe) {
		io_uring_submit(d->ring);
		sqe = io_uring_get_sqe(d->ring);
		if (!sqe)
			return -EBUSY;
	}
	io_uring_prep_poll_add(sqe, rs->efd, POLLIN);
	io_uring_sqe_set_data64(sqe, RESOLVER_UD);
	rs->armed = 1;
	return 0;
}

/*
 * Is @uid in one of admin_gids? 1 or 0 from its groups as last looked up (within
 * GROUPS_TTL_S), or -EAGAIN: the resolver has been asked, and the eventfd tells when it has
 * answered. Other -errno: it cannot be asked (the caller answers as for no admin).
 */
static int
uid_admin(struct kvtd *d, uid_t uid)
{
	struct resolver *rs = &d->metrics->res;
	struct uid_groups *u = NULL, *old = NULL;
	uint64_t now = kvtd_now_ns();
	int r = -EAGAIN;

	if (rs->efd < 0) {
		rs->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (rs->efd < 0)
			return -errno;
	}
	if (!rs->started) {
		r = -pthread_create(&rs->thread, NULL, resolver_main, rs);
		if (r < 0) {
			log_warn("metrics: no thread to look up admin_gids members: %s",
				 strerror(-r));
			return r;
		}
		rs->started = 1;
		r = -EAGAIN;
	}
	pthread_mutex_lock(&rs->lock);
	for (unsigned i = 0; i < GROUPS_CACHED; i++) {
		struct uid_groups *e = &rs->u[i];

		if (e->state != GROUPS_FREE && e->uid == uid)
			u = e;
		else if (e->state != GROUPS_ASKED &&
			 (!old || e->state == GROUPS_FREE ||
			  (old->state == GROUPS_KNOWN && e->at_ns < old->at_ns)))
			old = e; /* a free entry, else the oldest answer */
	}
	if (u && u->state == GROUPS_KNOWN && now - u->at_ns < GROUPS_TTL_S * 1000000000ULL) {
		r = 0;
		for (unsigned i = 0; i < u->n && !r; i++)
			for (unsigned k = 0; k < d->cfg.n_admin_gids && !r; k++)
				r = u->g[i] == d->cfg.admin_gids[k];
	} else if (!u || u->state == GROUPS_KNOWN) {
		u = u ? u : old;
		if (u) {
			u->uid = uid;
			u->state = GROUPS_ASKED;
			pthread_cond_signal(&rs->cond);
		} else {
			r = -EBUSY; /* every entry asked for: cannot happen with SCRAPERS_MAX
				       waiters */
		}
	}
	pthread_mutex_unlock(&rs->lock);
	if (r == -EAGAIN && resolver_arm(d) < 0)
		r = -EBUSY;
	return r;
}

/* The reply into s->out: head, and the body unless @head_only (HEAD keeps its length). */
static int
prepare(struct kvtd_scraper *s, const char *status, const char *type, const char *body, size_t len,
	bool head_only)
{
	FILE *f = open_memstream(&s->out, &s->out_len);

	if (!f)
		return -ENOMEM;
	fprintf(f,
		"HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n"
		"\r\n",
		status, type, len);
	if (!head_only)
		fwrite(body, 1, len, f);
	if (fclose(f) != 0) {
		free(s->out);
		s->out = NULL;
		return -ENOMEM;
	}
	s->out_off = 0;
	s->state = SCRAPE_WRITE;
	return 0;
}

static int
prepare_msg(struct kvtd_scraper *s, const char *status, const char *msg, bool head_only)
{
	return prepare(s, status, "text/plain", msg, strlen(msg), head_only);
}

/* The request in s->req (complete, or all the peer sent) to a reply in s->out: 0, 1 when it
 * waits for the uid's groups (s->state SCRAPE_WAIT), < 0 to close. */
static int
answer(struct kvtd *d, struct kvtd_scraper *s)
{
	const char *req = s->req, *path, *q;
	uid_t only_uid = (uid_t)s->uid; /* -1 (not found): matches no session */
	uint32_t flags = 0;
	bool head = false, all;
	size_t plen, len = 0;
	char *text = NULL;
	int r;

	if (!strncmp(req, "HEAD ", 5))
		head = true;
	else if (strncmp(req, "GET ", 4) != 0)
		return prepare_msg(s, s->got ? "405 Method Not Allowed" : "400 Bad Request",
				   "only GET and HEAD /metrics are served here\n", false);
	path = req + (head ? 5 : 4);
	plen = strcspn(path, " \r\n");
	if (plen < 8 || strncmp(path, "/metrics", 8) != 0 || (plen > 8 && path[8] != '?'))
		return prepare_msg(s, "404 Not Found", "not found: the metrics are at /metrics\n",
				   head);
	/* ?sessions=1 among the query's parameters */
	for (q = path + 8; q < path + plen; q += len) {
		q++; /* the '?' or '&' */
		len = strcspn(q, "& \r\n");
		if (len == 10 && !strncmp(q, "sessions=1", 10))
			flags |= KVT_CTL_METRICS_F_SESSIONS;
	}
	len = 0;
	all = uid_all_sessions(s->uid);
	if (!all && (flags & KVT_CTL_METRICS_F_SESSIONS) && s->uid >= 0 && d->cfg.n_admin_gids &&
	    !s->no_admin) {
		/* admin_gids, as the control socket honours them: the uid's groups */
		r = uid_admin(d, (uid_t)s->uid);
		if (r == -EAGAIN) {
			s->state = SCRAPE_WAIT;
			return 1;
		}
		all = r > 0;
	}
	r = kvtd_prom_render(d, flags, all ? NULL : &only_uid, &text, &len, NULL);
	if (r < 0)
		return prepare_msg(s, "500 Internal Server Error", "metrics unavailable\n", head);
	r = prepare(s, "200 OK", "text/plain; version=0.0.4; charset=utf-8", text, len, head);
	free(text);
	return r;
}

/* Reads what is there. Returns 1 when the request is complete (or the peer stopped sending),
 * 0 to wait for more, < 0 to close. */
static int
read_req(struct kvtd_scraper *s)
{
	while (s->got < REQ_MAX) {
		ssize_t n = recv(s->fd, s->req + s->got, REQ_MAX - s->got, MSG_DONTWAIT);

		if (n == 0)
			return 1;
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
		s->got += (size_t)n;
		s->req[s->got] = '\0';
		if (strstr(s->req, "\r\n\r\n") || strstr(s->req, "\n\n"))
			return 1;
	}
	return 1; /* REQ_MAX: the request line is all that matters */
}

/* Sends what the socket takes. Returns 1 when all is sent, 0 to wait, < 0 to close. */
static int
write_reply(struct kvtd_scraper *s)
{
	while (s->out_off < s->out_len) {
		ssize_t n = send(s->fd, s->out + s->out_off, s->out_len - s->out_off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
		s->out_off += (size_t)n;
	}
	return 1;
}

/* One step of @s; re-arms its poll, or closes it. */
static void
step(struct kvtd *d, struct kvtd_scraper *s, uint64_t ud, int res)
{
	int r;

	if (res < 0 || !s->deadline_ns) /* failed poll, or timed out (the timer shut it down) */
		goto close;
	if (s->state == SCRAPE_READ) {
		r = read_req(s);
		if (r < 0)
			goto close;
		if (r == 0) {
			if (res & (POLLHUP | POLLERR))
				goto close;
			if (arm(d, s->fd, POLLIN | POLLRDHUP, ud) < 0)
				goto close;
			return;
		}
		r = answer(d, s);
		if (r < 0)
			goto close;
		if (r > 0)
			return; /* waiting for its uid's groups: resume() goes on */
	}
	r = write_reply(s);
	if (r == 0 && arm(d, s->fd, POLLOUT, ud) == 0)
		return;
close:
	scraper_close(d, s);
}

void
kvtd_metrics_serve(struct kvtd *d)
{
	for (;;) {
		int fd = accept4(d->metrics_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct kvtd_scraper *s = NULL;
		unsigned i, held = 0;
		int64_t uid;

		if (fd < 0)
			return; /* EAGAIN: all taken; other errors: the next readiness retries */
		uid = peer_uid(fd);
		for (i = 0; i < SCRAPERS_MAX; i++) {
			if (d->metrics->s[i].fd < 0 && !s)
				s = &d->metrics->s[i];
			else if (d->metrics->s[i].fd >= 0 && d->metrics->s[i].uid == uid)
				held++;
		}
		if (held >= SCRAPERS_PER_UID && !uid_all_sessions(uid)) {
			char busy[192];
			int n = snprintf(busy, sizeof(busy),
					 "HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n"
					 "X-Kvtier-Refused: uid %lld holds %u scrapes, at most %u "
					 "per uid\r\nConnection: close\r\n\r\n",
					 (long long)uid, held, SCRAPERS_PER_UID);

			send(fd, busy, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
			close(fd);
			continue;
		}
		if (!s) {
			static const char busy[] = "HTTP/1.0 503 Service Unavailable\r\n"
						   "Content-Length: 0\r\nConnection: close\r\n\r\n";

			/* a fresh socket's buffer takes this whole, or the peer misses it */
			send(fd, busy, sizeof(busy) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
			close(fd);
			continue;
		}
		s->fd = fd;
		s->uid = uid;
		s->state = SCRAPE_READ;
		s->got = 0;
		s->deadline_ns = kvtd_now_ns() + (uint64_t)SCRAPE_TIMEOUT_MS * 1000000;
		d->metrics->busy++;
		/* the request is usually there already */
		step(d, s, KVTD_METRICS_UD + (uint64_t)(s - d->metrics->s), POLLIN);
	}
}

int
kvtd_metrics_owns(uint64_t ud)
{
	return ud >= KVTD_METRICS_UD && ud <= RESOLVER_UD;
}

/* A scraper that waited for its uid's groups: answered now, from what is known. */
static void
resume(struct kvtd *d, struct kvtd_scraper *s)
{
	uint64_t ud = KVTD_METRICS_UD + (uint64_t)(s - d->metrics->s);

	s->state = SCRAPE_READ;
	if (answer(d, s) == 1)
		return; /* asked again (a cache entry reused meanwhile) */
	if (s->state != SCRAPE_WRITE) {
		scraper_close(d, s);
		return;
	}
	step(d, s, ud, POLLOUT);
}

void
kvtd_metrics_event(struct kvtd *d, uint64_t ud, int res)
{
	struct kvtd_scraper *s;

	if (!d->metrics)
		return;
	if (ud == RESOLVER_UD) {
		eventfd_t v;

		d->metrics->res.armed = 0;
		eventfd_read(d->metrics->res.efd, &v);
		for (unsigned i = 0; i < SCRAPERS_MAX; i++)
			if (d->metrics->s[i].fd >= 0 && d->metrics->s[i].state == SCRAPE_WAIT)
				resume(d, &d->metrics->s[i]);
		return;
	}
	s = &d->metrics->s[ud - KVTD_METRICS_UD];
	if (s->fd >= 0)
		step(d, s, ud, res);
}

void
kvtd_metrics_tick(struct kvtd *d, uint64_t now_ns)
{
	if (!d->metrics || !d->metrics->busy)
		return;
	for (unsigned i = 0; i < SCRAPERS_MAX; i++) {
		struct kvtd_scraper *s = &d->metrics->s[i];

		if (s->fd < 0 || !s->deadline_ns || now_ns <= s->deadline_ns)
			continue;
		if (s->state == SCRAPE_WAIT) {
			/* no poll armed: answered now, as one of no admin group's */
			log_warn("metrics: the groups of uid %lld were not known in %d ms: its "
				 "scrape shows only its own sessions",
				 (long long)s->uid, SCRAPE_TIMEOUT_MS);
			s->no_admin = 1;
			resume(d, s);
			continue;
		}
		/* Its poll is armed: the shutdown completes it and step() closes it. A scraper
		 * that never finished its request is told so first. */
		if (s->state == SCRAPE_READ) {
			static const char slow[] = "HTTP/1.0 408 Request Timeout\r\n"
						   "Content-Length: 0\r\nConnection: close\r\n\r\n";

			send(s->fd, slow, sizeof(slow) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		}
		s->deadline_ns = 0;
		shutdown(s->fd, SHUT_RDWR);
	}
}
