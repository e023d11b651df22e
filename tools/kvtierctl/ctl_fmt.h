/* SPDX-License-Identifier: MIT */
/*
 * ctl_fmt.h - kvtierctl's pure formatters: daemon JSON documents to text tables. (The
 * Prometheus text is the daemon's own: daemon/metrics_format.c, KVT_CTL_METRICS.)
 *
 * They do no I/O beyond writing to @out and never look at the socket, so tests feed them canned
 * documents. The documents are the replies to KVT_CTL_STATUS, KVT_CTL_CLIENTS, KVT_CTL_SEQS
 * and KVT_CTL_BLOCKS (fields in proto/kvt_ctl.h). Every key is optional: a missing key or a value
 * of the wrong type prints as "-" in tables and is left out of the metrics, so an older or newer
 * daemon still gets useful output. Not thread-safe only in the sense that @out is shared.
 */
#ifndef KVTCTL_FMT_H
#define KVTCTL_FMT_H

#include <stdio.h>

#include <json-c/json.h>

/*
 * kvtctl_fmt_status() - print the STATUS document as aligned "key  value" lines.
 * Returns 0, -EINVAL when @status is not a JSON object, -EIO when writing to @out failed.
 */
int kvtctl_fmt_status(FILE *out, struct json_object *status);

/*
 * kvtctl_fmt_clients() - print the CLIENTS document ({"clients":[...]}) as a table, one row per
 * session, or a one-line note when there is none.
 * Returns 0, -EINVAL when @clients is not an object or "clients" is present but not an array,
 * -EIO on a write error.
 */
int kvtctl_fmt_clients(FILE *out, struct json_object *clients);

/*
 * kvtctl_fmt_seqs() - print the SEQS document ({"seqs":[...]}) as a table, one row per open
 * sequence. Same returns as kvtctl_fmt_clients().
 */
int kvtctl_fmt_seqs(FILE *out, struct json_object *seqs);

/*
 * kvtctl_fmt_blocks() - print the BLOCKS document ({"namespaces":[...], totals}) as a table,
 * one row per prefix namespace (or a one-line note when there is none), then one line of the
 * store's totals: blocks, referenced, bytes of the budget, hit rate, published, deduped,
 * evicted and refused. Same returns as kvtctl_fmt_clients().
 */
int kvtctl_fmt_blocks(FILE *out, struct json_object *blocks);

/*
 * kvtctl_fmt_bytes() - human-readable size with binary units ("512 B", "1.5 GiB") into @buf.
 * Always NUL-terminates @buf when @len > 0.
 */
void kvtctl_fmt_bytes(char *buf, size_t len, double bytes);

/*
 * kvtctl_fmt_duration() - human-readable duration ("12.5s", "3m07s", "2h05m", "4d03h").
 */
void kvtctl_fmt_duration(char *buf, size_t len, double seconds);

#endif /* KVTCTL_FMT_H */
