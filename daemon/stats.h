/* SPDX-License-Identifier: MIT */
/*
 * stats.h - the JSON documents kvtierctl shows (status, clients, seqs, blocks; field names and
 * schema version in proto/kvt_ctl.h). Main thread; takes each poller's lock while it reads that
 * poller's sessions.
 */
#ifndef KVTD_STATS_H
#define KVTD_STATS_H

#include <stdint.h>
#include <sys/types.h>

struct kvtd;
struct json_object;
struct kvtd_session;
struct kvtd_spill;

/* Calls @fn on every live session with its poller's lock held, one poller at a time. */
void kvtd_stats_for_each_session(struct kvtd *d, void (*fn)(struct kvtd_session *, void *),
				 void *arg);

/* STATUS; @only_uid non-NULL (a peer that is not privileged): of the spill store's per-uid use,
 * only that uid's row. */
struct json_object *kvtd_stats_status(struct kvtd *d, const uid_t *only_uid);
/*
 * kvtd_stats_spill() - STATUS's "spill" object for the store @s opened at @path (fields in
 * proto/kvt_ctl.h): its space, per-uid use (at most KVTD_STATS_SPILL_UIDS uids, most first;
 * only @only_uid's when non-NULL), I/O, errors by cause, refusals and T3 drops. Main thread
 * (the store's owner). NULL on allocation failure.
 */
#define KVTD_STATS_SPILL_UIDS 64
struct json_object *kvtd_stats_spill(const char *path, const struct kvtd_spill *s,
				     const uid_t *only_uid);
struct json_object *kvtd_stats_clients(struct kvtd *d);
struct json_object *kvtd_stats_seqs(struct kvtd *d);
/*
 * kvtd_stats_blocks() - the BLOCKS document: the prefix store's totals, and its namespaces whose
 * scope (struct kvtd_pns: uid + 1, or 0 for the shared one) is one of @scopes[0..@n_scopes);
 * @scopes NULL: every namespace (a privileged peer). Takes the store's lock.
 */
struct json_object *kvtd_stats_blocks(struct kvtd *d, const uint64_t *scopes, unsigned n_scopes);

#endif
