/* SPDX-License-Identifier: MIT */
/*
 * stats.h - the JSON documents kvtierctl shows (status, clients, seqs, blocks; field names and
 * schema version in proto/kvt_ctl.h). Main thread; takes each poller's lock while it reads that
 * poller's sessions.
 */
#ifndef KVTD_STATS_H
#define KVTD_STATS_H

#include <stdint.h>

struct kvtd;
struct json_object;
struct kvtd_session;

/* Calls @fn on every live session with its poller's lock held, one poller at a time. */
void kvtd_stats_for_each_session(struct kvtd *d, void (*fn)(struct kvtd_session *, void *),
				 void *arg);

struct json_object *kvtd_stats_status(struct kvtd *d);
struct json_object *kvtd_stats_clients(struct kvtd *d);
struct json_object *kvtd_stats_seqs(struct kvtd *d);
/*
 * kvtd_stats_blocks() - the BLOCKS document: the prefix store's totals, and its namespaces whose
 * scope (struct kvtd_pns: uid + 1, or 0 for the shared one) is one of @scopes[0..@n_scopes);
 * @scopes NULL: every namespace (a privileged peer). Takes the store's lock.
 */
struct json_object *kvtd_stats_blocks(struct kvtd *d, const uint64_t *scopes, unsigned n_scopes);

#endif
