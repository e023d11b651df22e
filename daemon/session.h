/* SPDX-License-Identifier: MIT */
/*
 * session.h - one client connection's data path: the sealed shared region (SQ, CQ, arena), the
 * two doorbells, and the client's sequences and registered buffers.
 *
 * Created by the main thread on HELLO, then handed to one poller. Everything under "poller
 * lock" is read and written with that poller's mutex held.
 */
#ifndef KVTD_SESSION_H
#define KVTD_SESSION_H

#include <stdint.h>
#include <sys/types.h>

#include "kvt_abi.h"
#include "opstats.h"
#include "poller.h"
#include "pool.h"
#include "seq.h"

struct kvtd;
struct kvtd_poller;
struct kvtd_seq;
struct kvtd_uid;
struct kvtd_pns;
struct kvtd_pblock;

/* A namespace the session opened (NS_OPEN) and the blocks its last pinning LOOKUP holds. */
struct kvtd_ns_handle {
	struct kvtd_pns *ns; /* NULL: slot free */
	struct kvtd_pblock **pins;
	uint32_t n_pins, cap_pins;
	int uid_cls; /* the namespace's pool class + 1 as counted in the uid's classes; 0: none */
	uint64_t pins_bytes; /* of pins[], charged to the session and its uid */
};
struct kvt_dev_buf;
struct kvt_dev_event;

struct kvtd_session {
	struct kvtd *d;
	struct kvtd_poller *poller;
	uint32_t id;
	int sock; /* borrowed from the connection; the poller only send()s errors on it */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char name[32];
	uint64_t start_ns;

	/* shared region (hostile: see ops.c) */
	int memfd;
	uint8_t *region;
	uint64_t region_size;
	struct kvt_ring_hdr *sq, *cq;
	struct kvt_sqe *sqes;
	struct kvt_cqe *cqes;
	uint8_t *arena;
	uint64_t arena_size;
	uint32_t sq_entries, cq_entries;
	uint32_t sq_head;      /* private: never read back from shared memory */
	uint32_t cq_tail;      /* private */
	uint32_t cq_head_seen; /* last CQ head read from the client, validated */
	int sq_efd;	       /* client -> daemon doorbell */
	int cq_efd;	       /* daemon -> client doorbell */
	int broken;	       /* ring corruption seen: the session is being dropped */

	/* why the last op was refused (ops.c); poller lock */
	struct kvt_op_err *op_err; /* shared: written only, never read back (ops.c) */
	uint32_t op_err_gen;	   /* private copy of op_err->gen */
	struct kvtd_why why;	   /* of the op being run (kvtd_op_fail, kvtd_seq_fail) */

	/* poller lock */
	struct kvt_dev_buf **bufs; /* index = buf_id - 1 */
	unsigned max_bufs;
	struct kvtd_seq_ctx ctx; /* what the sequences work with: kvtd_session_ctx() */
	struct kvtd_scratch scr; /* the ops' scratch while no poller has the session */
	struct kvtd_seq **seqs;	 /* index = seq id - 1 */
	unsigned max_seqs;
	unsigned n_seqs;
	struct kvtd_acct acct;
	struct kvtd_uid *uid_ent;
	uint64_t prefix_scope;		      /* uid + 1, or 0: prefix share_uids/gids */
	struct kvtd_ns_handle ns[KVT_MAX_NS]; /* index = ns id - 1 */
	uint64_t ops, errors;
	struct kvtd_op_stats opst;	 /* per opcode, folded into kvtd.opst_ended at the end */
	uint32_t time_rng;		 /* xorshift32 state: which ops the drain times */
	uint32_t time_gap;		 /* ops until the next one timed (session.c) */
	struct kvt_dev_event *dev_event; /* EVENT_GET: recorded after each op's copies */
	uint8_t event_handle[64];
};

/*
 * kvtd_session_create() - build the region and doorbells for a HELLO that passed the ABI check.
 * @sq_entries, @cq_entries, @arena_size: already clamped to the daemon's limits.
 * Returns 0, -ENOMEM, or the failing syscall's -errno.
 */
int kvtd_session_create(struct kvtd *d, uint32_t sq_entries, uint32_t cq_entries,
			uint64_t arena_size, struct kvtd_session **ret_s);

/*
 * kvtd_session_adopt() - a restart: a session over the region memfd and doorbells the previous
 * process handed over, with the geometry it recorded (the region's own header is not trusted).
 * The fds are owned by the session on success. Ring indices, sequences and buffers are the
 * caller's to restore.
 * Returns 0, -EINVAL (geometry out of range, or a memfd that is not sealed or not of the size
 * it implies), -ENOMEM, or mmap's -errno.
 */
int kvtd_session_adopt(struct kvtd *d, int memfd, int sq_efd, int cq_efd, uint32_t sq_entries,
		       uint32_t cq_entries, uint64_t arena_size, struct kvtd_session **ret_s);

/*
 * kvtd_session_uid_join() - a restored session joins @u (main thread, before any poller runs
 * it): the pool classes its sequences and namespace handles hold count among the uid's
 * (classes_per_uid, past a lowered limit too) and go back there when they close.
 * kvtd_session_uid_leave() undoes it (the session is then not served).
 */
void kvtd_session_uid_join(struct kvtd_session *s, struct kvtd_uid *u);
void kvtd_session_uid_leave(struct kvtd_session *s);

/* Frees every sequence, buffer, slot, mapping and fd the session holds. The session must be
 * detached from its poller. NULL is fine. */
void kvtd_session_destroy(struct kvtd_session *s);

/*
 * Prefix blocks (prefix.h), poller lock held. kvtd_session_ns_open(): NS_OPEN of @np (copied
 * out of the arena); returns the id (> 0), -EINVAL (reason in s->why), -EMFILE, -ENOMEM.
 * kvtd_session_ns(): the handle of @id, NULL when none is open. kvtd_session_ns_close(): 0 or
 * -ENOENT. kvtd_session_lookup(): LOOKUP, pins replacing the handle's with @pin.
 */
int kvtd_session_ns_open(struct kvtd_session *s, const struct kvt_ns_params *np);
struct kvtd_ns_handle *kvtd_session_ns(struct kvtd_session *s, uint64_t id);
int kvtd_session_ns_close(struct kvtd_session *s, uint64_t id);
int kvtd_session_lookup(struct kvtd_session *s, struct kvtd_ns_handle *h,
			const struct kvt_block_key *keys, uint32_t n, int pin);

/* Poller lock held. Returns the new buf id (> 0), -EMFILE (table full) or an import error. */
int kvtd_session_buf_register(struct kvtd_session *s, struct kvt_dev_buf *buf);
/* Poller lock held. Returns 0, -ENOENT (no such buffer), -EBUSY (a sequence uses it). */
int kvtd_session_buf_unregister(struct kvtd_session *s, uint32_t buf_id);
/* Poller lock held. NULL when @buf_id names no buffer. */
struct kvt_dev_buf *kvtd_session_buf(struct kvtd_session *s, uint32_t buf_id);

/*
 * kvtd_session_ctx() - the session's sequence context, brought up to date (the uid account,
 * the device event and the poller's scratch come and go after the session is made). The
 * pointer stays the same for the session's life: sequences keep it for their index pages.
 * Poller lock held, or a session no poller has yet.
 */
const struct kvtd_seq_ctx *kvtd_session_ctx(struct kvtd_session *s);

/* Poller lock held. SEQ_OPEN, in namespace @h (NULL: none) starting with @prefix_blocks of its
 * pinned blocks: returns the new id (> 0) and sets @ret_n to its n, -EMFILE (seqs_per_session
 * open) or a kvtd_seq_create()/kvtd_seq_join() error; the reason in s->why. */
int kvtd_session_seq_open(struct kvtd_session *s, const struct kvt_seq_params *p,
			  struct kvtd_ns_handle *h, uint32_t prefix_blocks, uint64_t *ret_n);
/* Poller lock held. Closes and frees sequence @id. Returns 0 or -ENOENT. */
int kvtd_session_seq_close(struct kvtd_session *s, uint32_t id);
/* Poller lock held. NULL when @id names no open sequence. */
struct kvtd_seq *kvtd_session_seq(struct kvtd_session *s, uint32_t id);
/* A restart: sequence @id re-created from @img (kvtd_seq_restore()). Returns 0, -EINVAL (id
 * out of range or taken) or a kvtd_seq_restore() error. */
int kvtd_session_seq_restore(struct kvtd_session *s, const struct kvt_seq_params *p, uint32_t id,
			     const struct kvtd_seq_image *img);

/*
 * Poller: drain the SQ, run ops, post CQEs. With @slice_ns > 0, stop after the op during which
 * @slice_ns have passed since the first one started, so that the poller's other sessions get
 * their turn: what is left waits for the next round. Returns the number of SQEs consumed.
 */
unsigned kvtd_session_drain(struct kvtd_session *s, uint64_t slice_ns);
/* Poller: are SQEs waiting? */
int kvtd_session_pending(struct kvtd_session *s);
/* Poller: the client broke the ring protocol. Sends it -EPROTO with @why, logs @why and shuts
 * the socket so the main loop drops the session. Later calls do nothing. */
void kvtd_session_break(struct kvtd_session *s, const char *why);

#endif
