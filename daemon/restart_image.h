/* SPDX-License-Identifier: MIT */
/*
 * restart_image.h - the restart image (restart.h): its records, described once, and the one
 * codec that writes and reads them.
 *
 * The image is a fixed header (struct kvtd_image_hdr) then a stream of records, native-endian,
 * without alignment. Every record is a list of fields written in one place, an IMG_*_FIELDS()
 * list below: the list declares the record's struct and builds the record's field table, and the
 * writer and the reader both walk that table (kvtd_image_encode(), kvtd_image_parse()), so a
 * field cannot be written by one and not read by the other. The order of the records (the
 * image's grammar) is one function too, run in either direction (restart_image.c, io_image()):
 *
 *   image   := hdr daemon prefix ns{prefix.n_ns} blk{prefix.n_blk} conns conn{conns.n_conns}
 *   blk     := blk_f u64 slot offset{ns.block_tokens}
 *   conn    := conn_f [session_f buf{n_bufs} seq{n_seqs} session_v2 nsh{KVT_MAX_NS}]
 *                     (the bracket when conn_f.has_session)
 *   seq     := seq_f score f32{n} pos_slot i32{n} slot_off u64{n} tier u8{n} seq_v2
 *              [blk_idx u32{n}] (the bracket when seq_v2.ns_id; arrays of 4 and 1 byte padded
 *              to 8)
 *   nsh     := nsh_f pins u32{n_pins} (padded to 8)
 *
 * A record has the image version it appeared in (its `since`): reading an older image, a newer
 * record is not in the bytes and reads as zeros (version 1 has no prefix store: no namespaces,
 * no blocks, no handles). The records of a released version never change: a new field goes into
 * a new record with the next version as its since, KVTD_IMAGE_VERSION goes up, and every older
 * version is still read (tests/unit/check_restart.c keeps one hand-written image of each).
 *
 * A field out of its range (a descriptor below 3, a count above its table's limit, unknown
 * flags) refuses the record in either direction: the writer refuses to write what the reader
 * would refuse.
 */
#ifndef KVTD_RESTART_IMAGE_H
#define KVTD_RESTART_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "kvt_abi.h"

#define KVTD_IMAGE_MAGIC   "KVTDIMG"
#define KVTD_IMAGE_VERSION 2 /* 2: prefix blocks; version 1 images are read too */

/* The fixed head of every image version. */
struct kvtd_image_hdr {
	char magic[8]; /* KVTD_IMAGE_MAGIC, NUL-padded */
	uint32_t version;
	uint32_t hdr_size;
	char daemon_version[32]; /* KVT_VERSION of the writer, for the log */
	uint64_t size;		 /* the whole image */
	uint64_t checksum;	 /* FNV-1a 64 of the bytes after the header */
};

/* How a field is checked, in both directions; the kinds with a check come first (io_rec() skips
 * the rest by kind > IMG_FLAGS). */
enum img_kind {
	IMG_U,	   /* unsigned, 4 or 8 bytes, at most max (0: any) */
	IMG_FD,	   /* int32 descriptor the exec carries: never stdio, never negative */
	IMG_FLAGS, /* uint32 flags: none outside max */
	IMG_PAD,   /* uint32 written as 0, not read */
	IMG_STR,   /* char array, NUL-terminated when read */
	IMG_BYTES, /* anything else of fixed size (ABI structs, arrays, doubles), not checked */
};

struct img_field {
	const char *name;
	uint32_t off, size;
	enum img_kind kind;
	uint64_t max;
};

struct img_rec {
	const char *name;
	const struct img_field *f;
	unsigned n;
	size_t size;	/* of the record's struct */
	uint32_t since; /* the image version it appeared in */
};

/*
 * The records. X(type, name, dimension, kind, max): the struct member `type name dimension`,
 * stored as kind. IMG_RECORD() below makes `struct img_<rec>_f` and `img_rec_<rec>` of each.
 */
#define IMG_DAEMON_FIELDS(X)                                                                       \
	X(uint32_t, next_session_id, , IMG_U, 0)                                                   \
	X(uint32_t, restarts, , IMG_U, 0)                                                          \
	X(uint64_t, start_ns, , IMG_U, 0)                                                          \
	X(uint64_t, restart_started_ns, , IMG_U, 0)                                                \
	X(uint64_t, restart_req_id, , IMG_U, 0)                                                    \
	X(int32_t, listen_fd, , IMG_FD, 0)                                                         \
	X(int32_t, lock_fd, , IMG_FD, 0)                                                           \
	X(uint64_t, sock_dev, , IMG_U, 0)                                                          \
	X(uint64_t, sock_ino, , IMG_U, 0)                                                          \
	X(int32_t, pool_fd, , IMG_FD, 0)                                                           \
	X(uint32_t, pool_hugetlb, , IMG_U, 0)                                                      \
	X(uint64_t, pool_size, , IMG_U, 0)                                                         \
	X(uint64_t, chunk_size, , IMG_U, 0)                                                        \
	X(uint64_t, pool_base, , IMG_U, 0)  /* where the old process mapped the pool */            \
	X(uint64_t, cnt, [8], IMG_BYTES, 0) /* struct kvtd_counters, in its order */

/* The prefix store's counts and counters (struct kvtd_prefix's, in restart.c's order). */
#define IMG_PREFIX_FIELDS(X)                                                                       \
	X(uint32_t, n_ns, , IMG_U, 1u << 20)                                                       \
	X(uint32_t, n_blk, , IMG_U, 1u << 28)                                                      \
	X(uint64_t, cnt, [7], IMG_BYTES, 0)

/* A namespace of the prefix store: its block_tokens is checked (1 to KVT_BLOCK_TOKENS_MAX). */
#define IMG_NS_FIELDS(X)                                                                           \
	X(uint32_t, id, , IMG_U, 0)                                                                \
	X(uint32_t, pad, , IMG_PAD, 0)                                                             \
	X(uint64_t, scope, , IMG_U, 0)                                                             \
	X(struct kvt_ns_params, p, , IMG_BYTES, 0)                                                 \
	X(uint64_t, cnt, [6], IMG_BYTES, 0) /* kvtd_prefix_restore_ns()'s */

/* A block: @ns is an index among the image's namespaces; the blocks are numbered in the order
 * written, the numbers sequences and pins refer to. */
#define IMG_BLK_FIELDS(X)                                                                          \
	X(uint32_t, ns, , IMG_U, 0)                                                                \
	X(uint32_t, pad, , IMG_PAD, 0)                                                             \
	X(struct kvt_block_key, key, , IMG_BYTES, 0)

#define IMG_CONNS_FIELDS(X) X(uint32_t, n_conns, , IMG_U, 1u << 20)

/* A connection, with or without a session. */
#define IMG_CONN_FIELDS(X)                                                                         \
	X(int32_t, fd, , IMG_FD, 0)                                                                \
	X(uint32_t, state, , IMG_U, 0) /* listen.h's CONN_* */                                     \
	X(uint32_t, pid, , IMG_U, 0)                                                               \
	X(uint32_t, uid, , IMG_U, 0)                                                               \
	X(uint32_t, gid, , IMG_U, 0)                                                               \
	X(uint32_t, privileged, , IMG_U, 0)                                                        \
	X(uint32_t, asker, , IMG_U, 0) /* sent the RESTART being answered */                       \
	X(uint32_t, has_session, , IMG_U, 1)

/* Its session: region, doorbells, private ring indices, counters, table sizes. */
#define IMG_SESSION_FIELDS(X)                                                                      \
	X(uint32_t, id, , IMG_U, 0)                                                                \
	X(char, name, [32], IMG_STR, 0)                                                            \
	X(uint64_t, start_ns, , IMG_U, 0)                                                          \
	X(int32_t, memfd, , IMG_FD, 0)                                                             \
	X(int32_t, sq_efd, , IMG_FD, 0)                                                            \
	X(int32_t, cq_efd, , IMG_FD, 0)                                                            \
	X(uint32_t, sq_entries, , IMG_U, 0)                                                        \
	X(uint32_t, cq_entries, , IMG_U, 0)                                                        \
	X(uint64_t, arena_size, , IMG_U, 0)                                                        \
	X(uint32_t, sq_head, , IMG_U, 0)                                                           \
	X(uint32_t, cq_tail, , IMG_U, 0)                                                           \
	X(uint32_t, cq_head_seen, , IMG_U, 0)                                                      \
	X(uint32_t, op_err_gen, , IMG_U, 0)                                                        \
	X(uint64_t, ops, , IMG_U, 0)                                                               \
	X(uint64_t, errors, , IMG_U, 0)                                                            \
	X(uint32_t, n_bufs, , IMG_U, 65536)                                                        \
	X(uint32_t, n_seqs, , IMG_U, 65536)

/* A host buffer: its id (index + 1), size and memfd. */
#define IMG_BUF_FIELDS(X)                                                                          \
	X(uint32_t, id, , IMG_U, 0)                                                                \
	X(uint64_t, size, , IMG_U, 0)                                                              \
	X(int32_t, fd, , IMG_FD, 0)

/* A sequence: parameters, tier state; its n positions' arrays follow (the grammar above). */
#define IMG_SEQ_FIELDS(X)                                                                          \
	X(uint32_t, id, , IMG_U, 0)                                                                \
	X(struct kvt_seq_params, p, , IMG_BYTES, 0)                                                \
	X(uint32_t, n, , IMG_U, KVT_TIER_MAX_CAP) /* tier.h */                                     \
	X(uint32_t, gen, , IMG_U, 0)                                                               \
	X(uint64_t, bytes_in, , IMG_U, 0)                                                          \
	X(uint64_t, bytes_out, , IMG_U, 0)                                                         \
	X(double, score_total, , IMG_BYTES, 0)

/* A sequence's flags in the image: what it keeps for life whatever the config of the build that
 * restores it says. */
#define IMG_SEQ_F_NO_SKETCH (1u << 0) /* opened with [retrieval] sketch = no */
#define IMG_SEQ_F_ALL	    IMG_SEQ_F_NO_SKETCH

/* Version 2: the sequence's namespace (0: none) and flags (builds before IMG_SEQ_F_* wrote 0). */
#define IMG_SEQ_V2_FIELDS(X)                                                                       \
	X(uint32_t, ns_id, , IMG_U, 0)                                                             \
	X(uint32_t, flags, , IMG_FLAGS, IMG_SEQ_F_ALL)

/* Version 2: the session's prefix scope (its namespace handles follow). */
#define IMG_SESSION_V2_FIELDS(X) X(uint64_t, prefix_scope, , IMG_U, 0)

/* Version 2: one of a session's KVT_MAX_NS namespace handles (ns_id 0: none), its pins after. */
#define IMG_NSH_FIELDS(X)                                                                          \
	X(uint32_t, ns_id, , IMG_U, 0)                                                             \
	X(uint32_t, n_pins, , IMG_U, 1u << 24)

#define IMG_MEMBER(type, name, dim, kind, max) type name dim;
#define IMG_RECORD(rec, FIELDS)                                                                    \
	struct img_##rec##_f {                                                                     \
		FIELDS(IMG_MEMBER)                                                                 \
	};                                                                                         \
	extern const struct img_rec img_rec_##rec;

IMG_RECORD(daemon, IMG_DAEMON_FIELDS)
IMG_RECORD(prefix, IMG_PREFIX_FIELDS)
IMG_RECORD(ns, IMG_NS_FIELDS)
IMG_RECORD(blk, IMG_BLK_FIELDS)
IMG_RECORD(conns, IMG_CONNS_FIELDS)
IMG_RECORD(conn, IMG_CONN_FIELDS)
IMG_RECORD(session, IMG_SESSION_FIELDS)
IMG_RECORD(buf, IMG_BUF_FIELDS)
IMG_RECORD(seq, IMG_SEQ_FIELDS)
IMG_RECORD(seq_v2, IMG_SEQ_V2_FIELDS)
IMG_RECORD(session_v2, IMG_SESSION_V2_FIELDS)
IMG_RECORD(nsh, IMG_NSH_FIELDS)

/* Every record table, for tests that walk them all. */
extern const struct img_rec *const kvtd_img_recs[];
extern const unsigned kvtd_img_n_recs;

/* ---- the image as records ------------------------------------------------------------------ */

struct kvtd_pns;
struct kvtd_pblock;
struct kvtd_prefix;
struct kvtd_session;

struct img_ns {
	struct img_ns_f f;
	struct kvtd_pns *ns; /* restart.c: restored */
};

struct img_blk {
	struct img_blk_f f;
	const void *off; /* block_tokens u64 pool offsets; read: in the image bytes, unaligned */
};

/* The arrays: read, copies in @mem (aligned); written, wherever the writer has them. */
struct img_seq {
	struct img_seq_f f;
	struct img_seq_v2_f v2;
	const float *score;
	const int32_t *pos_slot;
	const uint64_t *slot_off; /* pool offset + 1 of each position's slot, 0: none */
	const uint8_t *tier;
	const uint32_t *blk_idx; /* v2.ns_id only: block index + 1 per position, 0: its own slot */
	void *mem;		 /* read: what the arrays point into (blk_idx its own) */
};

struct img_nsh {
	struct img_nsh_f f;
	const uint32_t *pins; /* block indexes; read: malloc'd */
};

struct img_conn {
	struct img_conn_f f;
	struct img_session_f s; /* f.has_session only, as what follows */
	struct img_buf_f *bufs;
	struct img_seq *seqs;
	struct img_session_v2_f v2;
	struct img_nsh nsh[KVT_MAX_NS];
	/* restart.c: restore progress */
	struct kvtd_session *sess;
	unsigned bufs_done; /* buffer fds already consumed */
	int fds_owned;	    /* memfd and doorbells belong to sess */
};

struct kvtd_image {
	uint8_t *bytes; /* read: the image */
	size_t len;
	char version[33];     /* the writer's KVT_VERSION */
	uint32_t img_version; /* of the image */
	struct img_daemon_f d;
	struct img_prefix_f px;
	struct img_ns *ns;   /* px.n_ns */
	struct img_blk *blk; /* px.n_blk; not kept when written */
	struct img_conns_f nc;
	struct img_conn *conns; /* nc.n_conns; not kept when written */
	/* restart.c: restore progress */
	struct kvtd_pblock **blocks; /* restored, index = image index */
	struct kvtd_prefix *px_store;
};

/*
 * Where the writer takes the records that are many: each call fills the record of index @i
 * (asked in order, 0 first), or returns -errno, which ends the write. The connection's arrays
 * (bufs, seqs and theirs, pins) are the source's until conn_done(), called after each conn(),
 * whatever happened.
 */
struct img_src {
	void *ctx;
	int (*blk)(void *ctx, uint32_t i, struct img_blk *b);
	int (*conn)(void *ctx, uint32_t i, struct img_conn *c);
	void (*conn_done)(void *ctx, struct img_conn *c);
};

/*
 * kvtd_image_encode() - the image of @img in image version @version (KVTD_IMAGE_VERSION but in
 * tests): @img holds the daemon record, the prefix record (its counts), px.n_ns namespaces in
 * ns[] and the connections' count; @src gives the blocks and the connections. Returns 0 with the
 * bytes (malloc'd, header and checksum filled in) in *@ret_buf and their length in *@ret_len,
 * -ERANGE (a field out of its range, logged), -EINVAL (a version this build cannot write), or
 * -ENOMEM; or the error of @src.
 */
int kvtd_image_encode(struct kvtd_image *img, const struct img_src *src, uint32_t version,
		      uint8_t **ret_buf, size_t *ret_len);

/*
 * kvtd_image_parse() - check and read the image in @buf (@len bytes; copied).
 * Returns 0 and the parsed image, -EBADMSG (short, corrupt, or contradicting itself),
 * -EPROTONOSUPPORT (another image version or magic), -ENOMEM. The reason is logged.
 */
int kvtd_image_parse(const void *buf, size_t len, struct kvtd_image **ret_img);
/* kvtd_image_load() - as kvtd_image_parse(), of the image in @fd (closed here). */
int kvtd_image_load(int fd, struct kvtd_image **ret_img);
void kvtd_image_free(struct kvtd_image *img);
/* Counts in a parsed image, for logs and tests. */
unsigned kvtd_image_sessions(const struct kvtd_image *img);
uint64_t kvtd_image_checksum(const void *p, size_t len);

/*
 * One record's fields between @rec and the image at @*pos of @buf (@cap bytes), in the direction
 * @write, as the image version @version has them (nothing before the record's since). For tests
 * of the tables; the codec runs every record through it. Returns 0, -EBADMSG (read: short or a
 * field out of range), -ERANGE (write: a field out of range) or -ENOSPC (write: no room).
 */
int kvtd_image_rec_io(const struct img_rec *t, void *rec, int write, uint32_t version, uint8_t *buf,
		      size_t cap, size_t *pos);

#endif
