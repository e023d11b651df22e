/* SPDX-License-Identifier: MIT */
/*
 * metrics_format.h - kvtierd's metrics: the Prometheus text exposition (version 0.0.4) served on
 * /metrics and in reply to KVT_CTL_METRICS, and the same families as a JSON document
 * (KVT_CTL_METRICS_F_JSON; shape in proto/kvt_ctl.h).
 *
 * The formatters are pure: they read the STATUS, CLIENTS, SEQS and BLOCKS documents (stats.c;
 * of BLOCKS only the store's totals) and a snapshot of counters (struct kvtd_prom_snap), so
 * tests feed them canned input without a daemon. Every document key is optional: a missing
 * key or a value of the wrong type leaves its metric out. kvtd_prom_render() gathers the input from
 * a running daemon.
 *
 * Label sets stay stable from scrape to scrape: daemon-wide families have none or a bounded
 * one (op, tier, reason, direction), per-client families are labelled with the client's name
 * (kvt_opts.name, summed over its sessions). Session and sequence families, whose labels change
 * with every connection, come only with KVT_CTL_METRICS_F_SESSIONS (/metrics?sessions=1).
 */
#ifndef KVTD_METRICS_FORMAT_H
#define KVTD_METRICS_FORMAT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "opstats.h"

struct kvtd;
struct json_object;

/* One client name's sessions, summed. */
struct kvtd_prom_client {
	char name[32];
	unsigned sessions;
	uint64_t seqs, pool_bytes, ops, errors, bytes_in, bytes_out;
	uint64_t sq_backlog; /* SQEs submitted, not yet taken by the poller */
	uint64_t cq_backlog; /* CQEs posted, not yet reaped by the client */
};

struct kvtd_prom_proc {
	bool valid;
	double cpu_seconds;
	double start_time_seconds; /* since the epoch */
	uint64_t rss_bytes, vsz_bytes;
	uint64_t open_fds, max_fds;
};

struct kvtd_prom_snap {
	struct kvtd_op_stats ops; /* ended and live sessions together */
	struct kvtd_prom_client *clients;
	unsigned n_clients;
	struct kvtd_prom_proc proc;
};

struct kvtd_prom_input {
	struct json_object *status;	   /* NULL: left out */
	struct json_object *clients;	   /* NULL: left out (per-session families) */
	struct json_object *seqs;	   /* NULL: left out (per-sequence families) */
	struct json_object *blocks;	   /* BLOCKS document, NULL: left out (prefix families) */
	const struct kvtd_prom_snap *snap; /* NULL: left out */
};

/*
 * kvtd_prom_text() - write the exposition of @in to @out. Each family gets its HELP and TYPE
 * lines once, before its samples, and only when it has at least one sample. Label values are
 * escaped as the format requires (backslash, double quote, newline).
 * Returns 0, -EINVAL when a non-NULL document is not a JSON object, -EIO on a write error.
 */
int kvtd_prom_text(FILE *out, const struct kvtd_prom_input *in);

/*
 * kvtd_prom_json() - the same families as {"schema":1,"metrics":[{"name","type","help",
 * "samples":[{"labels":{...},"value":N}...]}...]}; a histogram's samples carry "suffix"
 * ("_bucket", "_sum", "_count"). Into *@ret_doc (the caller puts it).
 * Returns 0, -EINVAL as kvtd_prom_text(), -ENOMEM.
 */
int kvtd_prom_json(const struct kvtd_prom_input *in, struct json_object **ret_doc);

/* kvtd_prom_proc() - this process's CPU time, memory and descriptors from /proc. */
void kvtd_prom_proc(struct kvtd_prom_proc *ret);

/*
 * kvtd_prom_render() - gather from a running daemon and format. Main thread (takes each
 * poller's lock in turn). @flags: KVT_CTL_METRICS_F_*. @only_uid: when non-NULL, only that
 * uid's sessions appear in the client and session families (a peer that is not an admin).
 * Exactly one of @ret_text (malloc'ed, NUL-terminated, length in *@ret_len) and @ret_doc is
 * non-NULL, by KVT_CTL_METRICS_F_JSON.
 * Returns 0, -ENOMEM or -EIO.
 */
int kvtd_prom_render(struct kvtd *d, uint32_t flags, const uid_t *only_uid, char **ret_text,
		     size_t *ret_len, struct json_object **ret_doc);

#endif
