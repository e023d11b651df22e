/* SPDX-License-Identifier: MIT */
/*
 * stats.h - the JSON documents kvtierctl shows (status, clients, seqs; field names and schema
 * version in proto/kvt_ctl.h). Main thread; takes each poller's lock while it reads that
 * poller's sessions.
 */
#ifndef KVTD_STATS_H
#define KVTD_STATS_H

struct kvtd;
struct json_object;
struct kvtd_session;

/* Calls @fn on every live session with its poller's lock held, one poller at a time. */
void kvtd_stats_for_each_session(struct kvtd *d, void (*fn)(struct kvtd_session *, void *),
				 void *arg);

struct json_object *kvtd_stats_status(struct kvtd *d);
struct json_object *kvtd_stats_clients(struct kvtd *d);
struct json_object *kvtd_stats_seqs(struct kvtd *d);

#endif
