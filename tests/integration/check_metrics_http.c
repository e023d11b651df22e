/* SPDX-License-Identifier: MIT */
/*
 * HTTP /metrics on loopback ([daemon] metrics_listen): a kvtierd started with
 * --metrics-listen 127.0.0.1:0 says in STATUS where it listens; a GET /metrics gets the
 * Prometheus text with the client's families (by name) in it, ?sessions=1 adds a session's and
 * a sequence's; HEAD gets the headers alone; other paths, methods and garbage get 404/405/400.
 * Scrapers never hold up the main loop: one that sends nothing or reads nothing does not delay
 * another scrape or a client's op, is dropped after its timeout (408 when it never sent its
 * request), and past SCRAPERS_MAX at once the next is answered 503. A non-loopback address is
 * refused at start.
 * One local user cannot keep the others' scrapes out (at most 2 slots per uid but root's and
 * kvtierd's), and ?sessions=1 shows a scraper only its own uid's sessions unless it is root or
 * kvtierd's uid, as the control socket does (t_metrics_per_uid: needs root, to act as uid
 * 65534).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

static struct kvtd_proc D;

/* The port from STATUS's metrics_url ("http://127.0.0.1:PORT/metrics"). */
static unsigned
metrics_port(void)
{
	struct json_object *o = admin_request(D.sock, KVT_CTL_STATUS), *u;
	unsigned port = 0;
	const char *s;

	ck_assert_ptr_nonnull(o);
	ck_assert(json_object_object_get_ex(o, "metrics_url", &u));
	s = json_object_get_string(u);
	ck_assert_int_eq(sscanf(s, "http://127.0.0.1:%u/metrics", &port), 1);
	json_object_put(o);
	return port;
}

static int
raw_connect(unsigned port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* Everything until the peer closes, malloc'ed; closes @fd. */
static char *
read_all(int fd)
{
	size_t cap = 1 << 16, got = 0;
	char *buf = malloc(cap + 1);
	ssize_t n;

	while ((n = recv(fd, buf + got, cap - got, 0)) > 0) {
		got += (size_t)n;
		if (got == cap)
			buf = realloc(buf, (cap *= 2) + 1);
	}
	buf[got] = '\0';
	close(fd);
	return buf;
}

/* Sends @req (may be empty: then only waits) and returns the whole reply, malloc'ed. */
static char *
http(unsigned port, const char *req)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	size_t cap = 1 << 16, got = 0;
	char *buf = malloc(cap + 1);
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	if (*req)
		ck_assert_int_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
	while ((n = recv(fd, buf + got, cap - got, 0)) > 0) {
		got += (size_t)n;
		if (got == cap)
			buf = realloc(buf, (cap *= 2) + 1);
	}
	buf[got] = '\0';
	close(fd);
	return buf;
}

/* The reply to @req starts with "HTTP/1.0 " and @status. */
static void
expect_status(unsigned port, const char *req, const char *status)
{
	char *r = http(port, req), want[64];

	snprintf(want, sizeof(want), "HTTP/1.0 %s", status);
	ck_assert_msg(!strncmp(r, want, strlen(want)), "%s -> %.60s", req, r);
	free(r);
}

START_TEST(t_metrics_http)
{
	static const char *const extra[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct kvt_opts o = {.size = sizeof(o), .name = "scraped"};
	struct kvt_seq_params p = {.size = sizeof(p),
				   .layers = 2,
				   .kv_heads = 2,
				   .head_dim = 64,
				   .dtype = KVT_DTYPE_F16,
				   .delta = 16,
				   .hbm_frac = 0.5f};
	struct kvt_client *c;
	uint32_t seq;
	unsigned port;
	char *r;

	daemon_start(&D, extra);
	port = metrics_port();
	ck_assert_uint_gt(port, 0);
	ck_assert_int_eq(kvt_connect(D.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_seq_open(c, &p, &seq), 0);

	r = http(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.0 200 OK\r\n", 17), "reply: %.200s", r);
	ck_assert_ptr_nonnull(strstr(r, "Content-Type: text/plain; version=0.0.4"));
	ck_assert_ptr_nonnull(strstr(r, "\r\n\r\n# HELP kvtier_"));
	/* the connected client, by name; no per-session label unless asked */
	ck_assert_ptr_nonnull(strstr(r, "kvtier_client_sessions{client=\"scraped\"} 1\n"));
	ck_assert_ptr_nonnull(strstr(r, "kvtier_op_total{op=\"seq_open\"} 1\n"));
	ck_assert_ptr_null(strstr(r, "kvtier_session_"));
	ck_assert_ptr_null(strstr(r, "kvtier_seq_"));
	{
		/* Content-Length is the body's length */
		unsigned long len = 0;
		const char *cl = strstr(r, "Content-Length: "), *body = strstr(r, "\r\n\r\n") + 4;

		ck_assert_ptr_nonnull(cl);
		ck_assert_int_eq(sscanf(cl, "Content-Length: %lu", &len), 1);
		ck_assert_uint_eq(len, strlen(body));
	}
	free(r);
	r = http(port, "GET /metrics?x=1&sessions=1 HTTP/1.0\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.0 200 OK\r\n", 17), "reply: %.200s", r);
	ck_assert_ptr_nonnull(strstr(r, "kvtier_session_info{session=\""));
	ck_assert_ptr_nonnull(strstr(r, "kvtier_seq_tokens{session=\""));
	free(r);
	/* HEAD: the GET's headers, a Content-Length, no body */
	r = http(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.0 200 OK\r\n", 17), "reply: %.200s", r);
	{
		unsigned long len = 0;
		const char *cl = strstr(r, "Content-Length: ");

		ck_assert_ptr_nonnull(cl);
		ck_assert_int_eq(sscanf(cl, "Content-Length: %lu", &len), 1);
		ck_assert_uint_gt(len, 1000);
		ck_assert_str_eq(strstr(r, "\r\n\r\n"), "\r\n\r\n");
	}
	free(r);
	expect_status(port, "HEAD /other HTTP/1.0\r\n\r\n", "404 ");
	expect_status(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n", "200 OK");
	expect_status(port, "GET /other HTTP/1.0\r\n\r\n", "404 ");
	expect_status(port, "GET /metricsx HTTP/1.0\r\n\r\n", "404 ");
	expect_status(port, "POST /metrics HTTP/1.0\r\n\r\n", "405 ");
	expect_status(port, "\x01\x02garbage\r\n\r\n", "405 ");
	/* says nothing: answered 408 at its deadline */
	expect_status(port, "", "408 ");
	{
		/* A scraper that says nothing, and one that sends its request but reads nothing
		 * of a reply larger than its socket buffers: while both hold their slots, another
		 * scrape and a client's op are served. */
		int idle = raw_connect(port), stuck = raw_connect(port), small = 4096;
		static const char req[] = "GET /metrics?sessions=1 HTTP/1.0\r\n\r\n";
		char buf[64];

		setsockopt(stuck, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
		ck_assert_int_eq(send(stuck, req, sizeof(req) - 1, 0), (ssize_t)sizeof(req) - 1);
		expect_status(port, "GET /metrics HTTP/1.0\r\n\r\n", "200 OK");
		ck_assert_int_eq(kvt_nop(c), 0);
		/* the idle one is still open (its deadline not passed), then told 408 */
		ck_assert_int_eq(recv(idle, buf, sizeof(buf) - 1, MSG_DONTWAIT), -1);
		ck_assert_int_eq(errno, EAGAIN);
		ck_assert_int_gt(recv(idle, buf, sizeof(buf) - 1, 0), 12);
		ck_assert_int_eq(strncmp(buf, "HTTP/1.0 408", 12), 0);
		close(idle);
		close(stuck);
	}
	{
		/* SCRAPERS_MAX (8) connections held: the ninth is answered 503 at once */
		int fds[8], extra;
		char *busy;

		for (int i = 0; i < 8; i++)
			fds[i] = raw_connect(port);
		/* the eight are accepted (in order) before the ninth: wait until they are */
		extra = raw_connect(port);
		busy = read_all(extra);
		ck_assert_msg(!strncmp(busy, "HTTP/1.0 503", 12), "reply: %.60s", busy);
		free(busy);
		for (int i = 0; i < 8; i++)
			close(fds[i]);
		/* their slots free as the daemon sees the closes */
		for (int i = 0;; i++) {
			char *r2 = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
			bool ok = !strncmp(r2, "HTTP/1.0 200", 12);

			free(r2);
			if (ok)
				break;
			ck_assert_int_lt(i, 1000);
			usleep(10000);
		}
	}
	{
		/* a scraper gone before its answer (no SIGPIPE), then the next is served */
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		ck_assert_int_eq(send(fd, req, sizeof(req) - 1, 0), (ssize_t)sizeof(req) - 1);
		close(fd);
		expect_status(port, req, "200 OK");
		ck_assert(daemon_alive(&D));
	}
	/* the client was served all along */
	ck_assert_int_eq(kvt_nop(c), 0);
	ck_assert_int_eq(kvt_seq_close(c, seq), 0);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&D), 0);
}
END_TEST

/* A non-loopback address: kvtierd refuses to start and says why. */
START_TEST(t_metrics_not_loopback)
{
	const char *bin = getenv("KVTIERD");
	char log[64];
	int fd = kvt_test_tmpfile(log, sizeof(log), "metrics"), st;
	pid_t pid;
	char buf[4096] = "";

	ck_assert_ptr_nonnull(bin);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(fd, 2);
		execl(bin, bin, "--config", "/dev/null", "--socket", "/tmp/kvt-metrics-none.sock",
		      "--metrics-listen", "0.0.0.0:9464", (char *)NULL);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	ck_assert_int_ge(pread(fd, buf, sizeof(buf) - 1, 0), 1);
	ck_assert_msg(strstr(buf, "--metrics-listen") && strstr(buf, "loopback"), "stderr: %s",
		      buf);
	close(fd);
	unlink(log);
}
END_TEST

#define NOBODY 65534

/* A child's plain GET (no ck_assert: it runs in a child): the reply, at most @len - 1 bytes. */
static void
child_get(unsigned port, const char *req, char *out, size_t len)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	size_t got = 0;
	ssize_t n;

	out[0] = '\0';
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) {
		snprintf(out, len, "connect/send: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	while (got + 1 < len && (n = recv(fd, out + got, len - 1 - got, 0)) > 0)
		got += (size_t)n;
	out[got] = '\0';
	close(fd);
}

START_TEST(t_metrics_per_uid)
{
	static const char *const extra[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	static char reply[1 << 16];
	struct kvt_opts o = {.size = sizeof(o), .name = "root-secret"};
	struct kvt_client *c;
	int go[2], rep[2], st, refused = 0;
	unsigned port;
	pid_t pid;
	char *r, x;

	ck_assert_msg(geteuid() == 0, "t_metrics_per_uid needs root: it acts as uid %d", NOBODY);
	daemon_start_conf(&D, NULL, DAEMON_SHARED, extra); /* uid 65534 connects too */
	port = metrics_port();
	ck_assert_int_eq(kvt_connect(D.sock, &o, &c), 0);

	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(rep), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvt_opts no = {.size = sizeof(no), .name = "nobody-own"};
		struct kvt_client *nc = NULL;
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		int fds[8];

		close(go[1]);
		close(rep[0]);
		if (setgroups(0, NULL) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0)
			_exit(3);
		/* 8 connections that never send their request: as many as there are slots */
		for (int i = 0; i < 8; i++) {
			char b[256];

			fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)) < 0)
				_exit(6);
			/* a refused one is answered 503 and closed at once; a held one stays
			 * silent until its deadline (seconds) */
			struct timeval tv = {0, 300000};

			setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
			if (recv(fds[i], b, sizeof(b), 0) > 12 && !strncmp(b, "HTTP/1.0 503", 12))
				refused++;
		}
		if (write(rep[1], &refused, sizeof(refused)) != sizeof(refused))
			_exit(4);
		if (read(go[0], &x, 1) != 1) /* hold them while the parent scrapes */
			_exit(5);
		for (int i = 0; i < 8; i++)
			close(fds[i]);
		/* its own session, then what ?sessions=1 shows it */
		if (kvt_connect(D.sock, &no, &nc) < 0)
			_exit(7);
		child_get(port, "GET /metrics?sessions=1 HTTP/1.0\r\n\r\n", reply, sizeof(reply));
		kvt_disconnect(nc);
		_exit(write(rep[1], reply, strlen(reply) + 1) > 0 ? 0 : 4);
	}
	close(go[0]);
	close(rep[1]);
	ck_assert_int_eq(read(rep[0], &refused, sizeof(refused)), (ssize_t)sizeof(refused));
	/* root scrapes while uid 65534 holds every connection it could open */
	r = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.0 200 OK\r\n", 17),
		      "root's scrape while uid %d holds 8 connections: %.200s", NOBODY, r);
	free(r);
	ck_assert_msg(refused == 6, "uid %d: %d of 8 connections refused 503, want 6", NOBODY,
		      refused);
	ck_assert_int_eq(write(go[1], "x", 1), 1);
	close(go[1]);
	{
		size_t got = 0;
		ssize_t n;

		while (got + 1 < sizeof(reply) &&
		       (n = read(rep[0], reply + got, sizeof(reply) - 1 - got)) > 0)
			got += (size_t)n;
		reply[got] = '\0';
	}
	close(rep[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
	ck_assert_msg(!strncmp(reply, "HTTP/1.0 200 OK\r\n", 17), "nobody's scrape: %.200s", reply);
	ck_assert_msg(!strstr(reply, "root-secret"), "uid %d's ?sessions=1 shows root's session",
		      NOBODY);
	ck_assert_msg(strstr(reply, "nobody-own"), "uid %d's ?sessions=1 misses its own session",
		      NOBODY);
	/* root sees every session (nobody's is gone by now: its own) */
	r = http(port, "GET /metrics?sessions=1 HTTP/1.0\r\n\r\n");
	ck_assert_ptr_nonnull(strstr(r, "root-secret"));
	free(r);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&D), 0);
}
END_TEST

/* uid @uid's ?sessions=1 scrape (a child process): the reply, into @out. */
static void
scrape_as(uid_t uid, unsigned port, char *out, size_t len)
{
	int p[2], st;
	size_t got = 0;
	ssize_t n;
	pid_t pid;

	ck_assert_int_eq(pipe(p), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		static char reply[1 << 16];

		close(p[0]);
		if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
			_exit(3);
		child_get(port, "GET /metrics?sessions=1 HTTP/1.0\r\n\r\n", reply, sizeof(reply));
		_exit(write(p[1], reply, strlen(reply) + 1) > 0 ? 0 : 4);
	}
	close(p[1]);
	while (got + 1 < len && (n = read(p[0], out + got, len - 1 - got)) > 0)
		got += (size_t)n;
	out[got] = '\0';
	close(p[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "scraper status %d", st);
	ck_assert_msg(!strncmp(out, "HTTP/1.0 200 OK\r\n", 17), "uid %u's scrape: %.200s",
		      (unsigned)uid, out);
}

/*
 * admin_gids on /metrics as on the control socket: with admin_gids = 65534, uid 65534 (whose
 * primary group that is) sees root's session in ?sessions=1, twice (the second from its groups
 * as looked up); uid 65533, which the user database does not know, does not.
 */
START_TEST(t_metrics_admin_gids)
{
	static char reply[1 << 16];
	static const char *const extra[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct kvt_opts o = {.size = sizeof(o), .name = "root-secret"};
	struct kvt_client *c;
	unsigned port;
	char conf[64];

	ck_assert_msg(geteuid() == 0, "t_metrics_admin_gids needs root: it acts as uid %d", NOBODY);
	snprintf(conf, sizeof(conf), "[daemon]\nadmin_gids = %d\n", NOBODY);
	daemon_start_conf(&D, conf, 0, extra);
	port = metrics_port();
	ck_assert_int_eq(kvt_connect(D.sock, &o, &c), 0);
	for (int i = 0; i < 2; i++) {
		scrape_as(NOBODY, port, reply, sizeof(reply));
		ck_assert_msg(strstr(reply, "root-secret"),
			      "uid %d (group %d, in admin_gids): ?sessions=1 misses root's session",
			      NOBODY, NOBODY);
	}
	scrape_as(NOBODY - 1, port, reply, sizeof(reply));
	ck_assert_msg(!strstr(reply, "root-secret"),
		      "uid %d (no admin group): ?sessions=1 shows root's session", NOBODY - 1);
	kvt_disconnect(c);
	ck_assert_int_eq(daemon_stop(&D), 0);
}
END_TEST

KVT_CHECK_MAIN("metrics_http", 120, NULL, NULL, t_metrics_http, t_metrics_not_loopback,
	       t_metrics_per_uid, t_metrics_admin_gids)
