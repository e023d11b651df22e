/* SPDX-License-Identifier: MIT */
/*
 * stats.h - the JSON documents kvtierctl shows (status, clients, seqs). Main thread; takes each
 * poller's lock while it reads that poller's sessions.
 */
#ifndef KVTD_STATS_H
#define KVTD_STATS_H

struct kvtd;
struct json_object;

struct json_object *kvtd_stats_status(struct kvtd *d);
struct json_object *kvtd_stats_clients(struct kvtd *d);
struct json_object *kvtd_stats_seqs(struct kvtd *d);

#endif
