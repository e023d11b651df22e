/* SPDX-License-Identifier: MIT */
/*
 * harness.h - integration tests start a real kvtierd (the built binary, path in $KVTIERD) in a
 * private runtime directory and talk to it as clients and as kvtierctl would.
 */
#ifndef KVT_TEST_HARNESS_H
#define KVT_TEST_HARNESS_H

#include <json-c/json.h>
#include <stdint.h>
#include <sys/types.h>

struct kvtd_proc {
	pid_t pid;
	char dir[64];
	char sock[100];
	char log[160];
};

/* Starts kvtierd with "--socket <dir>/kvtierd.sock --pool-size 64M" plus @extra (NULL-ended)
 * and waits until it answers STATUS. Aborts the test on failure. */
void daemon_start(struct kvtd_proc *p, const char *const *extra);
/* daemon_start() with a config file <dir>/kvtierd.conf holding @conf (NULL: none) and "--config"
 * it before @extra (may be NULL). With DAEMON_SHARED, other uids reach the daemon: the directory
 * is 0711 and the file starts with "[daemon] socket_mode = 0666" (@conf may go on in [daemon]).
 * daemon_stop() removes the file. */
#define DAEMON_SHARED 1u
void daemon_start_conf(struct kvtd_proc *p, const char *conf, unsigned flags,
		       const char *const *extra);
/* The parts of daemon_start(): a temp dir with the socket and log paths; fork and exec kvtierd
 * with the same arguments, without waiting for it to answer. */
void daemon_prepare(struct kvtd_proc *p);
void daemon_spawn(struct kvtd_proc *p, const char *const *extra);
/* Waits until the spawned daemon answers STATUS; aborts the test if it exits or stays silent. */
void daemon_wait_ready(struct kvtd_proc *p);
/* Waits for the daemon to exit: its exit status (128 + signal when killed by one), or -1 when it
 * is still running after @timeout_ms (it is then SIGKILLed). */
int daemon_wait(struct kvtd_proc *p, int timeout_ms);
/* SIGTERM, wait (at most 30 s); returns the exit status (0 for a clean stop), -1 if it hung. */
int daemon_stop(struct kvtd_proc *p);
/* Is the process still alive? */
int daemon_alive(struct kvtd_proc *p);

/* One admin request (KVT_CTL_STATUS/CLIENTS/SEQS); the parsed JSON reply or NULL. */
struct json_object *admin_request(const char *sock, uint32_t type);
/* A raw SOCK_SEQPACKET connection to @sock (fd, or -errno), as a client built from proto/ alone
 * would open it. */
int ctl_raw_connect(const char *sock);
/* One message within @timeout_ms; descriptors it carries are closed. Returns its length, 0 at
 * EOF, -ETIMEDOUT, or -errno (-ECONNRESET: the daemon closed with our message unread). */
ssize_t ctl_raw_recv(int fd, void *buf, size_t len, int timeout_ms);
/* status.pool.used, or -1. */
int64_t pool_used(const char *sock);
int64_t json_get_i64(struct json_object *o, const char *path);

/* What a daemon holds, from /proc: open descriptors, mappings, resident kB; @sanitized: it
 * runs a sanitizer runtime, whose allocator maps size classes as they are first used (so its
 * map count grows without a leak). @named_maps counts the mappings of a file or memfd: unlike
 * @maps it is the same in two processes of one binary, whose anonymous mappings the kernel
 * merges differently as address-space randomisation places them. */
struct kvtd_usage {
	long fds, maps, named_maps, rss_kb;
	int sanitized;
};
/* The daemon's usage once it has closed the connections just made (it does so asynchronously):
 * the same fd and map counts twice, 20 ms apart. Aborts the test if they never settle. */
struct kvtd_usage daemon_usage(const struct kvtd_proc *p);

#endif
