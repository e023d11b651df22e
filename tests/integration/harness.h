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
/* SIGTERM, wait; returns the exit status (0 for a clean stop). */
int daemon_stop(struct kvtd_proc *p);
/* Is the process still alive? */
int daemon_alive(struct kvtd_proc *p);

/* One admin request (KVT_CTL_STATUS/CLIENTS/SEQS); the parsed JSON reply or NULL. */
struct json_object *admin_request(const char *sock, uint32_t type);
/* status.pool.used, or -1. */
int64_t pool_used(const char *sock);
int64_t json_get_i64(struct json_object *o, const char *path);

#endif
