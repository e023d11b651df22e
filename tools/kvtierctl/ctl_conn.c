/* SPDX-License-Identifier: MIT */
/*
 * ctl_conn.c - admin requests over the control socket (see ctl_conn.h).
 *
 * The reply is read with one recv() into a KVT_CTL_MAX_MSG buffer: SOCK_SEQPACKET keeps message
 * boundaries, so a reply never arrives in pieces, and MSG_TRUNC tells us if the daemon broke the
 * size limit. Nothing in the reply is trusted: its length, id and type are checked before use.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvt_ctl.h"
#include "ctl_conn.h"

int
kvtctl_connect(struct kvtctl_conn *c, const char *path, int timeout_ms)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = timeout_ms % 1000 * 1000};
	int fd, r;

	c->fd = -1;
	c->next_id = 1;
	c->path = path;
	c->err_msg[0] = '\0';
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);

	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* SO_SNDTIMEO also bounds connect() on AF_UNIX when the daemon's backlog is full. */
	if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0) {
		r = -errno;
		goto err_close;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = errno == EAGAIN ? -ETIMEDOUT : -errno;
		goto err_close;
	}
	c->fd = fd;
	return 0;

err_close:
	close(fd);
	return r;
}

/* Sends @msg (@len bytes, starting with its header: the id is set here) and reads the reply,
 * KVT_CTL_JSON or KVT_CTL_TEXT (type in *@ret_type) or KVT_CTL_ERROR. */
static int
exchange(struct kvtctl_conn *c, void *msg, size_t len, uint32_t *ret_type, char **ret_json)
{
	struct kvt_ctl_hdr req, hdr;
	char *buf, *json;
	ssize_t n;
	int r;

	memcpy(&req, msg, sizeof(req));
	req.len = (uint32_t)len;
	req.id = c->next_id++;
	memcpy(msg, &req, sizeof(req));
	c->err_msg[0] = '\0';
	n = send(c->fd, msg, len, MSG_NOSIGNAL);
	if (n < 0)
		return errno == EAGAIN ? -ETIMEDOUT : errno == EPIPE ? -ECONNRESET : -errno;
	if ((size_t)n != len)
		return -EPROTO;

	buf = malloc(KVT_CTL_MAX_MSG);
	if (!buf)
		return -ENOMEM;
	n = recv(c->fd, buf, KVT_CTL_MAX_MSG, MSG_TRUNC);
	if (n < 0) {
		r = errno == EAGAIN ? -ETIMEDOUT : -errno;
		goto out;
	}
	if (n == 0) {
		r = -ECONNRESET;
		goto out;
	}
	if ((size_t)n < sizeof(hdr) || n > KVT_CTL_MAX_MSG) {
		r = -EPROTO;
		goto out;
	}
	memcpy(&hdr, buf, sizeof(hdr));
	if (hdr.len != (uint32_t)n || hdr.id != req.id) {
		r = -EPROTO;
		goto out;
	}

	if (hdr.type == KVT_CTL_ERROR) {
		struct kvt_ctl_error e;

		if ((size_t)n < sizeof(e)) {
			r = -EPROTO;
			goto out;
		}
		memcpy(&e, buf, sizeof(e));
		if (e.err >= 0) {
			r = -EPROTO;
			goto out;
		}
		e.msg[sizeof(e.msg) - 1] = '\0';
		snprintf(c->err_msg, sizeof(c->err_msg), "%s", e.msg);
		r = e.err;
		goto out;
	}
	if ((hdr.type != KVT_CTL_JSON && hdr.type != KVT_CTL_TEXT) || (size_t)n == sizeof(hdr) ||
	    buf[n - 1] != '\0') {
		r = -EPROTO;
		goto out;
	}
	json = strdup(buf + sizeof(hdr));
	if (!json) {
		r = -ENOMEM;
		goto out;
	}
	*ret_type = hdr.type;
	*ret_json = json;
	r = 0;
out:
	free(buf);
	return r;
}

int
kvtctl_request(struct kvtctl_conn *c, uint32_t type, char **ret_json)
{
	struct kvt_ctl_hdr req = {.type = type};
	uint32_t got = 0;
	char *text = NULL;
	int r = exchange(c, &req, sizeof(req), &got, &text);

	if (r < 0)
		return r;
	if (got != KVT_CTL_JSON) {
		free(text);
		return -EPROTO;
	}
	*ret_json = text;
	return 0;
}

int
kvtctl_metrics(struct kvtctl_conn *c, uint32_t flags, char **ret_text)
{
	struct kvt_ctl_metrics req = {.hdr = {.type = KVT_CTL_METRICS}, .flags = flags};
	uint32_t want = flags & KVT_CTL_METRICS_F_JSON ? KVT_CTL_JSON : KVT_CTL_TEXT, got = 0;
	char *text = NULL;
	int r = exchange(c, &req, sizeof(req), &got, &text);

	if (r < 0)
		return r;
	if (got != want) {
		free(text);
		return -EPROTO;
	}
	*ret_text = text;
	return 0;
}

void
kvtctl_close(struct kvtctl_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}
