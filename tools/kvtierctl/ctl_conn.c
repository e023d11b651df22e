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

int
kvtctl_request(struct kvtctl_conn *c, uint32_t type, char **ret_json)
{
	struct kvt_ctl_hdr req = {.type = type, .len = sizeof(req), .id = c->next_id++};
	struct kvt_ctl_hdr hdr;
	char *buf, *json;
	ssize_t n;
	int r;

	c->err_msg[0] = '\0';
	n = send(c->fd, &req, sizeof(req), MSG_NOSIGNAL);
	if (n < 0)
		return errno == EAGAIN ? -ETIMEDOUT : errno == EPIPE ? -ECONNRESET : -errno;
	if (n != sizeof(req))
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
	if (hdr.type != KVT_CTL_JSON || (size_t)n == sizeof(hdr) || buf[n - 1] != '\0') {
		r = -EPROTO;
		goto out;
	}
	json = strdup(buf + sizeof(hdr));
	if (!json) {
		r = -ENOMEM;
		goto out;
	}
	*ret_json = json;
	r = 0;
out:
	free(buf);
	return r;
}

void
kvtctl_close(struct kvtctl_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}
