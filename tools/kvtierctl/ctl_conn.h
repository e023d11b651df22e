/* SPDX-License-Identifier: MIT */
/*
 * ctl_conn.h - kvtierctl's side of the control socket (proto/kvt_ctl.h).
 *
 * An admin connection sends no HELLO: it sends admin requests (KVT_CTL_STATUS, _CLIENTS, _SEQS,
 * _BLOCKS, _METRICS) and reads exactly one reply per request, KVT_CTL_JSON, KVT_CTL_TEXT or
 * KVT_CTL_ERROR, matched by id.
 * One connection serves a few requests in a row; kvtierctl opens a fresh one per refresh so the
 * daemon's hello timeout never closes a connection under it.
 */
#ifndef KVTCTL_CONN_H
#define KVTCTL_CONN_H

#include <stdint.h>

struct kvtctl_conn {
	int fd;
	uint64_t next_id;
	const char *path;
	char err_msg[240]; /* the daemon's message after a KVT_CTL_ERROR reply, else empty */
};

/*
 * kvtctl_connect() - connect to the control socket at @path with send, receive and connect
 * timeouts of @timeout_ms milliseconds.
 * Returns 0, -ENOENT (no socket file), -ECONNREFUSED (a stale socket: nothing listens), -EACCES
 * (no permission on the socket or its directory), -ENAMETOOLONG (path longer than sun_path), or
 * another -errno from socket()/connect().
 */
int kvtctl_connect(struct kvtctl_conn *c, const char *path, int timeout_ms);

/*
 * kvtctl_request() - send the header-only admin request @type and wait for its reply.
 * On KVT_CTL_JSON stores a malloc'd NUL-terminated copy of the JSON text in *@ret_json (the
 * caller frees it) and returns 0. On KVT_CTL_ERROR returns the daemon's negative errno and
 * leaves its message in @c->err_msg.
 * Other returns: -ETIMEDOUT (no reply within the timeout), -ECONNRESET (the daemon closed the
 * connection), -EPROTO (a reply that breaks kvt_ctl.h: wrong size, id, type, or a JSON text
 * without its NUL), -ENOMEM, or -errno from send()/recv().
 */
int kvtctl_request(struct kvtctl_conn *c, uint32_t type, char **ret_json);

/*
 * kvtctl_metrics() - send KVT_CTL_METRICS with @flags (KVT_CTL_METRICS_F_*) and wait for its
 * reply: the Prometheus text, or with KVT_CTL_METRICS_F_JSON the JSON document, malloc'd and
 * NUL-terminated in *@ret_text. Returns as kvtctl_request().
 */
int kvtctl_metrics(struct kvtctl_conn *c, uint32_t flags, char **ret_text);

/* kvtctl_close() - close the connection; accepts a connection that never connected. */
void kvtctl_close(struct kvtctl_conn *c);

#endif /* KVTCTL_CONN_H */
