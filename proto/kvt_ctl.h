/* SPDX-License-Identifier: MIT */
/*
 * kvt_ctl.h - control-socket messages.
 *
 * The control socket is AF_UNIX SOCK_SEQPACKET: one message per send, boundaries kept, file
 * descriptors passed with SCM_RIGHTS. Every message starts with struct kvt_ctl_hdr; every request
 * gets exactly one reply with the same @id. A failed request gets KVT_CTL_ERROR with -errno and a
 * message a person can read. The peer's identity comes from SO_PEERCRED at accept, never from a
 * message field.
 *
 * Session clients send HELLO first; the daemon answers WELCOME with three fds: the sealed region
 * memfd, the SQ doorbell (client writes), the CQ doorbell (daemon writes). Admin clients
 * (kvtierctl) send STATUS/CLIENTS/SEQS/BLOCKS/METRICS without HELLO; those replies carry a
 * JSON document (fields below) or, for METRICS, text.
 * CLIENTS and SEQS list only the peer's own uid's sessions, BLOCKS only the namespaces of the
 * peer's own uid's scope and of the shared scope when the peer is in it, unless the peer is
 * root, the daemon's uid or in its admin_gids. A connection that sends nothing within the
 * daemon's hello timeout is closed, an admin connection idle past admin_idle_timeout_ms too (each
 * after an ERROR -ETIMEDOUT). A peer the daemon does not allow gets ERROR -EACCES in reply to its
 * first message, then the close.
 *
 * RESTART (root, the daemon's uid or admin_gids; -EPERM otherwise) re-executes the daemon's
 * binary in place, same pid, keeping every session: connections, regions, doorbells, pool rows
 * and sequence state cross the exec, and clients see a pause, not a reconnect. The JSON reply
 * comes from the new process once it serves ({"restarted": true, "pause_ms": ..., ...}); an
 * ERROR when the restart could not start (the old process keeps serving).
 */
#ifndef KVT_CTL_H
#define KVT_CTL_H

#include <stdint.h>

#include "kvt_abi.h"

#define KVT_CTL_MAX_MSG 262144 /* largest message either side sends or accepts */

enum {
	KVT_CTL_HELLO = 1,	    /* client -> daemon, struct kvt_ctl_hello */
	KVT_CTL_WELCOME = 2,	    /* daemon -> client, struct kvt_ctl_welcome + 3 fds */
	KVT_CTL_ERROR = 3,	    /* daemon -> client, struct kvt_ctl_error */
	KVT_CTL_BUF_REGISTER = 4,   /* client -> daemon, struct kvt_ctl_buf_register (+ 1 fd) */
	KVT_CTL_BUF_REGISTERED = 5, /* daemon -> client, struct kvt_ctl_buf_registered */
	KVT_CTL_BUF_UNREGISTER = 6, /* client -> daemon, struct kvt_ctl_buf_unregister */
	KVT_CTL_OK = 7,		    /* daemon -> client, header only */
	KVT_CTL_EVENT_GET = 8,	    /* client -> daemon, struct kvt_ctl_event_get */
	KVT_CTL_EVENT = 9,	    /* daemon -> client, struct kvt_ctl_event */
	KVT_CTL_STATUS = 16,	    /* admin request, header only */
	KVT_CTL_CLIENTS = 17,	    /* admin request, header only */
	KVT_CTL_SEQS = 18,	    /* admin request, header only */
	KVT_CTL_JSON = 19,	    /* admin reply: NUL-terminated JSON text follows the header */
	KVT_CTL_RESTART = 20,	    /* admin request, header only: re-exec in place (below) */
	KVT_CTL_METRICS = 21,	    /* admin request, struct kvt_ctl_metrics */
	KVT_CTL_TEXT = 22,	    /* admin reply: NUL-terminated text follows the header */
	KVT_CTL_BLOCKS = 23,	    /* admin request, header only: prefix blocks (JSON) */
};

struct kvt_ctl_hdr {
	uint32_t type; /* KVT_CTL_* */
	uint32_t len;  /* bytes including this header */
	uint64_t id;   /* chosen by the requester, echoed in the reply */
};
_Static_assert(sizeof(struct kvt_ctl_hdr) == 16, "kvt_ctl_hdr ABI");

struct kvt_ctl_hello {
	struct kvt_ctl_hdr hdr;
	uint16_t abi_major; /* KVT_ABI_MAJOR of the client: must equal the daemon's */
	uint16_t abi_minor;
	uint32_t sq_entries; /* requested, 0 = daemon default; rounded up to a power of two */
	uint32_t cq_entries; /* 0 = 2 * sq_entries; at least sq_entries, at most 2 * the limit */
	uint32_t reserved0;  /* must be zero, as must reserved[]: -EINVAL otherwise */
	uint64_t arena_size; /* requested bytes, 0 = daemon default */
	uint64_t features;   /* KVT_FEAT_* the client understands */
	char name[32];	     /* NUL-terminated label shown by kvtierctl */
	uint64_t reserved[2];
};
_Static_assert(sizeof(struct kvt_ctl_hello) == 96, "kvt_ctl_hello ABI");

struct kvt_ctl_welcome {
	struct kvt_ctl_hdr hdr;
	uint16_t abi_major; /* the daemon's */
	uint16_t abi_minor;
	uint32_t session_id;
	uint64_t region_size;
	uint64_t features; /* the intersection in force */
	uint32_t backend;  /* KVT_BACKEND_* the daemon runs */
	uint32_t reserved0;
	uint64_t reserved[2];
};
_Static_assert(sizeof(struct kvt_ctl_welcome) == 64, "kvt_ctl_welcome ABI");

enum { KVT_BACKEND_HOST = 1, KVT_BACKEND_CUDA = 2 };

struct kvt_ctl_error {
	struct kvt_ctl_hdr hdr;
	int32_t err; /* negative errno */
	uint32_t reserved0;
	char msg[240]; /* NUL-terminated, for a person */
};
_Static_assert(sizeof(struct kvt_ctl_error) == 264, "kvt_ctl_error ABI");

enum { KVT_BUF_HOST_MEMFD = 1, KVT_BUF_CUDA_IPC = 2 };

/*
 * BUF_REGISTER: KVT_BUF_HOST_MEMFD passes one memfd fd that must carry F_SEAL_SHRINK (the daemon
 * maps it and must never see it shrink); KVT_BUF_CUDA_IPC passes the 64-byte IPC handle and the
 * device UUID inline, no fd.
 */
struct kvt_ctl_buf_register {
	struct kvt_ctl_hdr hdr;
	uint32_t kind;	/* KVT_BUF_* */
	uint32_t flags; /* zero */
	uint64_t size;	/* bytes */
	uint8_t ipc_handle[64];
	uint8_t device_uuid[16];
	uint64_t reserved[2];
};
_Static_assert(sizeof(struct kvt_ctl_buf_register) == 128, "kvt_ctl_buf_register ABI");

struct kvt_ctl_buf_registered {
	struct kvt_ctl_hdr hdr;
	uint32_t buf_id; /* > 0, names the buffer in SQEs and SEQ_OPEN */
	uint32_t reserved0;
};
_Static_assert(sizeof(struct kvt_ctl_buf_registered) == 24, "kvt_ctl_buf_registered ABI");

struct kvt_ctl_buf_unregister {
	struct kvt_ctl_hdr hdr;
	uint32_t buf_id;
	uint32_t reserved0;
};
_Static_assert(sizeof(struct kvt_ctl_buf_unregister) == 24, "kvt_ctl_buf_unregister ABI");

/*
 * EVENT_GET: the session's interprocess CUDA event on the device named by @device_uuid. The
 * daemon records it after the copies of every op of this session that moves rows, before the
 * op's CQE is posted; a client stream that waits on it (cudaStreamWaitEvent) after reaping a CQE
 * is ordered after that op's copies with no CPU round trip. One event per session: asking again
 * returns the same handle. The host backend answers -EOPNOTSUPP (its copies are complete when
 * the CQE is posted).
 */
struct kvt_ctl_event_get {
	struct kvt_ctl_hdr hdr;
	uint8_t device_uuid[16];
	uint64_t reserved[2]; /* must be zero */
};
_Static_assert(sizeof(struct kvt_ctl_event_get) == 48, "kvt_ctl_event_get ABI");

struct kvt_ctl_event {
	struct kvt_ctl_hdr hdr;
	uint8_t ipc_handle[64]; /* cudaIpcEventHandle_t */
	uint64_t reserved[2];
};
_Static_assert(sizeof(struct kvt_ctl_event) == 96, "kvt_ctl_event ABI");

/*
 * The admin JSON documents (KVT_CTL_JSON replies). Every document carries "schema":
 * KVT_CTL_SCHEMA, bumped when a field is renamed, removed or changes meaning; adding a field
 * does not bump it, so readers ignore fields they do not know. Counts are integers, durations
 * seconds (numbers), sizes bytes.
 *
 * STATUS: {"schema", "version", "abi": {"major", "minor"}, "backend", "metrics_url" (only when
 *	/metrics is served), "pid", "uptime_s", "restarts", "pollers",
 *	"pool": {"size", "used", "free", "chunk_size", "chunks", "chunks_free", "classes",
 *		 "backing", "numa_node" (-1: none), "locked" (boolean)},
 *	"sessions", "seqs", "ops", "errors",
 *	"refused": {"quota", "nomem", "einval", "auth", "hello_timeout", "limit", "ring_corrupt"},
 *	"tiers": [T0, T1, T2, T3 tokens over all sequences],
 *	"spill" (only when [spill] is configured; docs/spill.md): {"path", "kind" ("file" |
 *		"block device"), "size", "used", "free", "largest_free" (the largest extent that
 *		fits now), "extents", "queue_depth", "in_flight", "uid_share" (bytes one uid may
 *		hold; 0: no limit), "uids": [{"uid", "bytes"}...] (the uids holding space, most
 *		first, at most 64; a peer that is not privileged sees only its own uid),
 *		"io": {"reads", "writes", "read_bytes", "write_bytes" (completed without error),
 *		"read_errors", "write_errors"}, "errors": {"eio", "enospc", "short", "other"}
 *		(failed requests by cause, each once), "refused": {"nospc", "quota"} (allocations),
 *		"dropped": {"extents", "bytes"} (dropped to make room: T3)}}
 * CLIENTS: {"schema", "clients": [{"session", "pid", "uid", "gid", "name", "seqs",
 *	"pool_bytes", "ops", "errors", "sq_entries", "arena_size", "uptime_s"}...]}
 * SEQS: {"schema", "seqs": [{"session", "seq", "tokens", "layers", "kv_heads", "head_dim",
 *	"dtype" ("f16" | "bf16" | "f32"), "policy" ("tiered" | "h2o" | "streaming" | "full"),
 *	"t2_keys" ("head" | "channel"), "tiers": [T0..T3 tokens], "evicted_ratio",
 *	"pool_bytes"}...]}
 * BLOCKS: the prefix block store (docs/prefix.md). {"schema", "budget_bytes" ([prefix]
 *	cache_bytes resolved; 0: no sharing), "bytes", "blocks", "referenced" (blocks some
 *	sequence or pin holds; the others are cached, evicted first), "lookups", "hit_blocks",
 *	"miss_blocks" (leading blocks a LOOKUP found, and the rest of its keys), "published",
 *	"deduped" (PUBLISHed blocks the namespace already held), "evicted", "refused_budget"
 *	(PUBLISHes refused: the budget full of referenced blocks), totals over the whole store
 *	whoever asks, as STATUS's pool;
 *	"namespaces": [{"id", "name", "scope" ("uid" | "shared"), "uid" (scope "uid" only),
 *	"layers", "kv_heads", "head_dim", "dtype", "block_tokens", "blocks", "referenced",
 *	"bytes", "handles" (NS_OPENs and sequences holding it), "lookups", "hit_blocks",
 *	"miss_blocks", "published", "deduped", "evicted"}...]}
 * RESTART: {"schema", "restarted" (true), "pid", "restarts", "sessions", "seqs", "pause_ms",
 *	"version"}, from the new process.
 * METRICS with KVT_CTL_METRICS_F_JSON: {"schema", "metrics": [{"name", "type" ("counter" |
 *	"gauge" | "histogram"), "help", "samples": [{"labels": {name: value...}, "suffix"
 *	(histograms only: "_bucket" | "_sum" | "_count"), "value"}...]}...]}, the families of
 *	the text exposition, one object each.
 * CLIENTS, SEQS and METRICS' per-client and per-session families list only the peer's own
 * uid's sessions unless the peer is root, the daemon's uid or in its admin_gids; BLOCKS'
 * namespaces likewise (above).
 */
#define KVT_CTL_SCHEMA 1

/*
 * How kvtierctl and `python -m kvtier` print the documents: described once, here (kvtierctl's
 * ctl_fmt.c expands these tables; the Python package's are generated from them by
 * tools/gen-pyabi.py). Every key is optional: absent or of the wrong type, it prints as "-".
 *
 * STATUS, one "label  value" line each: X(label, key, kind), the key a path ("pool.size"); a
 * path segment ending in "?" ("spill?.size") names an optional section: when the document has
 * no object there, the line is left out.
 * Kinds: STR (control characters replaced), NUM, BYTES (binary units), SECS (a duration),
 * OPTSTR (STR, the line left out when the key is absent), ABI ("major.minor" of an object),
 * USED (BYTES and the share of the sibling "size"), CHUNKS ("N free, SIZE each" from the
 * object's "chunks_free" and "chunk_size"), PAGES ("N KiB", a hint at 4 KiB or less; left out
 * when absent), NUMA (NUM, "any" below 0), YESNO (a boolean), COUNTERS ("key N, ..." of an
 * object), TIERS ("T0 N  T1 N ..." of an array), UIDS ("uid N BYTES, ...; share BYTES" of an
 * array of {"uid", "bytes"} and the sibling "uid_share": "none" for an empty array, "no share"
 * for a share of 0).
 */
#define KVT_CTL_STATUS_LINES(X)                                                                    \
	X("version", "version", STR)                                                               \
	X("abi", "abi", ABI)                                                                       \
	X("backend", "backend", STR)                                                               \
	X("metrics", "metrics_url", OPTSTR)                                                        \
	X("pid", "pid", NUM)                                                                       \
	X("uptime", "uptime_s", SECS)                                                              \
	X("pollers", "pollers", NUM)                                                               \
	X("pool size", "pool.size", BYTES)                                                         \
	X("pool used", "pool.used", USED)                                                          \
	X("pool free", "pool.free", BYTES)                                                         \
	X("pool chunks", "pool", CHUNKS)                                                           \
	X("pool classes", "pool.classes", NUM)                                                     \
	X("pool backing", "pool.backing", STR)                                                     \
	X("pool pages", "pool.page_kib", PAGES)                                                    \
	X("pool numa", "pool.numa_node", NUMA)                                                     \
	X("pool locked", "pool.locked", YESNO)                                                     \
	X("sessions", "sessions", NUM)                                                             \
	X("seqs", "seqs", NUM)                                                                     \
	X("ops", "ops", NUM)                                                                       \
	X("errors", "errors", NUM)                                                                 \
	X("refused", "refused", COUNTERS)                                                          \
	X("tiers", "tiers", TIERS)                                                                 \
	X("spill path", "spill?.path", STR)                                                        \
	X("spill kind", "spill?.kind", STR)                                                        \
	X("spill size", "spill?.size", BYTES)                                                      \
	X("spill used", "spill?.used", USED)                                                       \
	X("spill free", "spill?.free", BYTES)                                                      \
	X("spill extents", "spill?.extents", NUM)                                                  \
	X("spill uids", "spill?.uids", UIDS)                                                       \
	X("spill io", "spill?.io", COUNTERS)                                                       \
	X("spill errors", "spill?.errors", COUNTERS)                                               \
	X("spill refused", "spill?.refused", COUNTERS)                                             \
	X("spill dropped", "spill?.dropped", COUNTERS)

/*
 * CLIENTS, SEQS and BLOCKS, one table row per element of the document's array, one column per
 * X(heading, key, kind, index). Kinds: INT, STR (left-aligned), BYTES, SECS, PCT (a 0..1 ratio),
 * TIER (element @index of the key's array), SCOPE ("uid N" or "shared"), MIB (bytes in MiB),
 * HITS ("hit_blocks" over "hit_blocks" + "miss_blocks"). Numbers right-aligned, widths fit the
 * widest cell.
 */
#define KVT_CTL_CLIENTS_COLS(X)                                                                    \
	X("SESSION", "session", INT, 0)                                                            \
	X("PID", "pid", INT, 0)                                                                    \
	X("UID", "uid", INT, 0)                                                                    \
	X("GID", "gid", INT, 0)                                                                    \
	X("SEQS", "seqs", INT, 0)                                                                  \
	X("POOL", "pool_bytes", BYTES, 0)                                                          \
	X("OPS", "ops", INT, 0)                                                                    \
	X("ERRORS", "errors", INT, 0)                                                              \
	X("SQ", "sq_entries", INT, 0)                                                              \
	X("ARENA", "arena_size", BYTES, 0)                                                         \
	X("UPTIME", "uptime_s", SECS, 0)                                                           \
	X("NAME", "name", STR, 0)

#define KVT_CTL_SEQS_COLS(X)                                                                       \
	X("SESSION", "session", INT, 0)                                                            \
	X("SEQ", "seq", INT, 0)                                                                    \
	X("TOKENS", "tokens", INT, 0)                                                              \
	X("LAYERS", "layers", INT, 0)                                                              \
	X("HEADS", "kv_heads", INT, 0)                                                             \
	X("DIM", "head_dim", INT, 0)                                                               \
	X("DTYPE", "dtype", STR, 0)                                                                \
	X("POLICY", "policy", STR, 0)                                                              \
	X("T2KEYS", "t2_keys", STR, 0)                                                             \
	X("T0", "tiers", TIER, 0)                                                                  \
	X("T1", "tiers", TIER, 1)                                                                  \
	X("T2", "tiers", TIER, 2)                                                                  \
	X("T3", "tiers", TIER, 3)                                                                  \
	X("EVICTED", "evicted_ratio", PCT, 0)                                                      \
	X("POOL", "pool_bytes", BYTES, 0)

#define KVT_CTL_BLOCKS_COLS(X)                                                                     \
	X("ID", "id", INT, 0)                                                                      \
	X("NAME", "name", STR, 0)                                                                  \
	X("SCOPE", "scope", SCOPE, 0)                                                              \
	X("BLOCKS", "blocks", INT, 0)                                                              \
	X("REF", "referenced", INT, 0)                                                             \
	X("MiB", "bytes", MIB, 0)                                                                  \
	X("HITRATE", "hit_blocks", HITS, 0)                                                        \
	X("PUBLISHED", "published", INT, 0)                                                        \
	X("EVICTED", "evicted", INT, 0)

/*
 * METRICS: the daemon's metrics. Without flags the reply is KVT_CTL_TEXT, the Prometheus text
 * exposition (version 0.0.4) that /metrics serves; KVT_CTL_METRICS_F_JSON asks for the same
 * families as a KVT_CTL_JSON document (above); KVT_CTL_METRICS_F_SESSIONS adds the
 * per-session and per-sequence families (their labels change with every connection, so they
 * are left out by default). Unknown flags or a non-zero reserved field: ERROR -EINVAL.
 */
#define KVT_CTL_METRICS_F_JSON	   (1u << 0)
#define KVT_CTL_METRICS_F_SESSIONS (1u << 1)
#define KVT_CTL_METRICS_F_ALL	   (KVT_CTL_METRICS_F_JSON | KVT_CTL_METRICS_F_SESSIONS)

struct kvt_ctl_metrics {
	struct kvt_ctl_hdr hdr;
	uint32_t flags; /* KVT_CTL_METRICS_F_* */
	uint32_t reserved0;
};
_Static_assert(sizeof(struct kvt_ctl_metrics) == 24, "kvt_ctl_metrics ABI");

#endif /* KVT_CTL_H */
