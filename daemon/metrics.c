/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - GET /metrics over HTTP on a loopback address ([daemon] metrics_listen), for a
 * Prometheus scrape: the same text `kvtierctl metrics` prints, from the same formatter
 * (tools/kvtierctl/ctl_fmt.c) over the same STATUS, CLIENTS and SEQS documents.
 *
 * The main loop calls kvtd_metrics_serve() when the listening socket is readable. Each
 * connection is answered at once and closed (HTTP/1.0, Connection: close): one request of at
 * most 4 KiB, read and written with 100 ms timeouts, so a client that stalls costs the main
 * loop at most that. Only loopback addresses are accepted in the configuration: the endpoint
 * has no authentication.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "ctl_fmt.h"
#include "kvtd.h"
#include "log.h"
#include "metrics.h"
#include "stats.h"

#define REQ_MAX	      4096
#define IO_TIMEOUT_MS 100

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
	d->metrics_port = ntohs(sa.sin_port);
	log_notice("serving /metrics on http://%s:%u/metrics", inet_ntoa(sa.sin_addr),
		   (unsigned)d->metrics_port);
	return 0;
}

void
kvtd_metrics_fini(struct kvtd *d)
{
	if (d->metrics_fd >= 0)
		close(d->metrics_fd);
	d->metrics_fd = -1;
}

/* The metrics text, malloc'ed; NULL on failure. */
static char *
metrics_text(struct kvtd *d, size_t *ret_len)
{
	struct json_object *st = kvtd_stats_status(d), *cl = kvtd_stats_clients(d),
			   *sq = kvtd_stats_seqs(d);
	char *text = NULL;
	FILE *f = open_memstream(&text, ret_len);
	int r = f ? kvtctl_fmt_metrics(f, st, cl, sq) : -ENOMEM;

	if (f && fclose(f) != 0)
		r = -EIO;
	json_object_put(st);
	json_object_put(cl);
	json_object_put(sq);
	if (r < 0) {
		free(text);
		return NULL;
	}
	return text;
}

static void
send_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n <= 0)
			return; /* timeout or a client gone: nothing to do but close */
		p += n;
		len -= (size_t)n;
	}
}

static void
reply(int fd, const char *status, const char *type, const char *body, size_t len)
{
	char head[256];
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n",
			 status, type, len);

	if (n < 0 || (size_t)n >= sizeof(head))
		return; /* cannot happen with the fixed strings above; never send past @head */
	send_all(fd, head, (size_t)n);
	send_all(fd, body, len);
}

static void
serve_one(struct kvtd *d, int fd)
{
	struct timeval tv = {0, IO_TIMEOUT_MS * 1000};
	char req[REQ_MAX + 1];
	size_t got = 0;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	/* the request line is all that matters; read up to the end of the headers */
	while (got < REQ_MAX) {
		ssize_t n = recv(fd, req + got, REQ_MAX - got, 0);

		if (n <= 0)
			break;
		got += (size_t)n;
		req[got] = '\0';
		if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n"))
			break;
	}
	req[got] = '\0';
	if (strncmp(req, "GET ", 4) != 0) {
		static const char msg[] = "only GET /metrics is served here\n";

		reply(fd, got ? "405 Method Not Allowed" : "400 Bad Request", "text/plain", msg,
		      sizeof(msg) - 1);
		return;
	}
	if (strncmp(req + 4, "/metrics", 8) != 0 || !strchr(" ?", req[12])) {
		static const char msg[] = "not found: the metrics are at /metrics\n";

		reply(fd, "404 Not Found", "text/plain", msg, sizeof(msg) - 1);
		return;
	}
	{
		size_t len = 0;
		char *text = metrics_text(d, &len);

		if (!text) {
			static const char msg[] = "metrics unavailable\n";

			reply(fd, "500 Internal Server Error", "text/plain", msg, sizeof(msg) - 1);
			return;
		}
		reply(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", text, len);
		free(text);
	}
}

void
kvtd_metrics_serve(struct kvtd *d)
{
	for (;;) {
		int fd = accept4(d->metrics_fd, NULL, NULL, SOCK_CLOEXEC);

		if (fd < 0)
			return; /* EAGAIN: all taken; other errors: the next readiness retries */
		serve_one(d, fd);
		close(fd);
	}
}
