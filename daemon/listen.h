/* SPDX-License-Identifier: MIT */
/*
 * listen.h - the control socket and admission to it (listen.c): the socket path's lock, bind
 * and release; accept with the peer's credentials checked (allowed_uids/gids,
 * connections_per_uid, admin_gids); HELLO's admission of a session (ring and arena limits,
 * max_sessions, sessions_per_uid, the uid's account); and the close that ends a connection and
 * gives back what it was admitted to. Main thread only. Below the control messages (ctl.c) and
 * the loop (loop.c), which include this header; it includes neither.
 */
#ifndef KVTD_LISTEN_H
#define KVTD_LISTEN_H

#include <stdint.h>
#include <sys/types.h>

struct kvtd;
struct kvtd_session;
struct kvtd_uid;
struct kvt_ctl_hello;

/* user_data of the listener's poll; loop.c's other fixed sources follow it, and connections use
 * their (aligned, larger) address. */
#define KVTD_SRC_LISTEN 1

/*
 * CONN_NEW: accepted, nothing said yet (closed past hello_timeout_ms).
 * CONN_REFUSED: a peer allowed_uids/allowed_gids turn away (-EACCES), or one whose uid holds
 * connections_per_uid connections already (-EUSERS); its first message is read and answered
 * with the refusal before the close, so the refusal is what it reads (a close with its HELLO
 * unread would reach it as ECONNRESET instead).
 * CONN_ADMIN: said an admin request (closed when idle past admin_idle_timeout_ms).
 * restart.c carries the state across exec (conn.h), so the values are part of the image.
 */
enum { CONN_NEW, CONN_REFUSED, CONN_SESSION, CONN_ADMIN };

/* Why the listener is not polled (d->listen_paused). */
enum { LISTEN_FULL = 1, LISTEN_NOFD = 2 };

/* A control connection, on d->conns. */
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

/* Locks "<socket>.lock", removes a stale socket (nobody listening) and nothing else, binds,
 * sets mode and group, listens: d->listen_fd. Returns 0 or -errno (logged); see
 * kvtd_loop_listen(). */
int kvtd_listen_open(struct kvtd *d);
/* Closes the listener; unlinks the socket file if it is still the one bound, then the lock
 * file. Harmless when nothing is open. */
void kvtd_listen_close(struct kvtd *d);
/* The listener is readable: accepts while there is room (max_connections), checks each peer's
 * credentials, and polls the listener again unless it pauses (d->listen_paused). */
void kvtd_listen_accept(struct kvtd *d);
/* Polls the listener again after a pause, once there may be room for a connection. */
void kvtd_listen_resume(struct kvtd *d);
/* The one poll every main-loop source takes: readable or hung up, completing with @user_data.
 * Returns 0 or -EBUSY (kvtd_ring_poll()). */
int kvtd_listen_poll(struct kvtd *d, int fd, uint64_t user_data);

/* HELLO (@h: all sizeof(*h) bytes, ctl.c checks) on a new connection: admits a session within
 * the limits, answers WELCOME with its three descriptors. Returns 0, or -errno after answering
 * ERROR (the caller drops the connection). */
int kvtd_listen_hello(struct kvtd *d, struct kvtd_conn *c, const struct kvt_ctl_hello *h);
/* The account of @uid's sessions: its entry, or a free one set up with the uid's limits
 * (pool_bytes_per_uid, pool_share_per_uid, classes_per_uid); NULL when all d->n_uids are taken.
 * The caller counts its session in ->sessions. */
struct kvtd_uid *kvtd_uid_get(struct kvtd *d, uid_t uid);
/* The prefix scope of @c's sessions: kvtd_prefix_scope() on the peer's uid and groups (its
 * primary and supplementary ones, SO_PEERGROUPS). */
uint64_t kvtd_conn_prefix_scope(const struct kvtd *d, const struct kvtd_conn *c);

/* Ends @c: its session (folded into the daemon's counters, then destroyed), its uid's count,
 * its descriptor; frees it and lets the listener resume. */
void kvtd_conn_close(struct kvtd *d, struct kvtd_conn *c);
/* Sends ERROR with @err and a printf-style message for request @id on @fd, without blocking. */
void kvtd_conn_error(int fd, uint64_t id, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
