/* SPDX-License-Identifier: MIT */
/*
 * spill.h - the spill store: extents of a file or block device, written and read through
 * io_uring with O_DIRECT, for rows and blocks that leave DDR (docs/spill.md). This is the store
 * alone: nothing in the daemon spills into it yet (docs/spill.md, "Not wired yet").
 *
 * Guarantees:
 * - Opened with O_DIRECT (the page cache never holds spilled data) and an exclusive flock, so
 *   two daemons never share a store. A file system without O_DIRECT, or one in memory (tmpfs,
 *   ramfs: spilling there saves nothing), is refused at open with a message saying what to do.
 *   A file is given its blocks at open (fallocate), so a write never fails for the file
 *   system's lack of room.
 * - Space: extents of whole 4 KiB units (KVTD_SPILL_UNIT) from a buddy allocator (extent.h).
 *   An allocation fails with -ENOSPC when no run fits (the caller chooses what to drop:
 *   kvtd_spill_evict_lowest()), and with -EDQUOT when it would take a uid past its share
 *   (uid_share; root and the daemon's own uid are not held to it).
 * - I/O: one io_uring, the file registered (a fixed file), the callers' memory registered as
 *   fixed buffers (kvtd_spill_register_buffers()); at most queue_depth requests in flight.
 *   kvtd_spill_write() and kvtd_spill_read() only queue; kvtd_spill_submit() (or a full SQ)
 *   sends the batch in one system call; kvtd_spill_reap() collects completions without
 *   blocking. Every request completes exactly once, with its cookie and a result: its length,
 *   or a negative errno with a reason naming the extent. A short transfer is -EIO ("short
 *   read: N of M bytes"). A failure touches only the request's own extent.
 * - An extent is never freed, evicted or reused while a request on it is in flight (-EBUSY).
 *   Requests on one extent are not ordered against each other: a caller reads an extent back
 *   only after its write has completed.
 * - Eviction: every extent carries a caller's importance; kvtd_spill_evict_lowest() drops the
 *   least important one with no request in flight (a min-heap) and counts it as T3.
 * - Fault injection (kvtd_spill_inject()): the next N reads or writes complete with -EIO,
 *   -ENOSPC or a short count, through the same completion path as the kernel's results. Only
 *   code calls it (the unit tests); no setting, flag or wire op reaches it.
 * - Not thread-safe: one owner thread (the main loop's, once wired).
 */
#ifndef KVTD_SPILL_H
#define KVTD_SPILL_H

#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define KVTD_SPILL_UNIT	    4096u /* O_DIRECT alignment of offsets, lengths and buffers */
#define KVTD_SPILL_MIN_SIZE (1ull << 20)
#define KVTD_SPILL_MAX_QD   4096u
#define KVTD_SPILL_MAX_BUFS 1024u	 /* registered buffers */
#define KVTD_SPILL_MAX_BUF  (1ull << 30) /* bytes of one registered buffer (io_uring's limit) */
#define KVTD_SPILL_REASON   128

struct kvtd_spill;

/* An extent's handle: its slot and a generation, so a stale handle is refused (-ENOENT). */
typedef uint64_t kvtd_spill_ext;

struct kvtd_spill_params {
	const char *path;	/* a file (created when missing) or a block device */
	uint64_t size;		/* bytes; 0: the existing file's or device's size */
	unsigned queue_depth;	/* requests in flight, 1 to KVTD_SPILL_MAX_QD */
	uint64_t uid_share;	/* bytes one uid may hold; 0: no share (see uid_share_pct) */
	unsigned uid_share_pct; /* used when uid_share is 0: a percentage of the size; 0: none */
	uid_t owner;		/* the daemon's uid: not held to the share, like root */
};

enum { KVTD_SPILL_OP_WRITE = 1, KVTD_SPILL_OP_READ = 2 };

struct kvtd_spill_cqe {
	uint64_t cookie;
	kvtd_spill_ext ext;
	int32_t res;			/* the length asked for, or -errno */
	int op;				/* KVTD_SPILL_OP_* */
	char reason[KVTD_SPILL_REASON]; /* when res < 0: what failed, where, why */
};

struct kvtd_spill_dropped {
	kvtd_spill_ext ext; /* no longer valid */
	uid_t uid;
	uint64_t tag; /* what the caller gave kvtd_spill_alloc() */
	uint64_t bytes;
	double importance;
};

struct kvtd_spill_stats {
	uint64_t size, used, free, largest_free; /* bytes */
	uint64_t extents, in_flight;
	uint64_t writes, reads, write_bytes, read_bytes; /* completed without error */
	uint64_t write_errors, read_errors;		 /* failed requests, by operation */
	/* failed requests by cause, each counted once: -EIO from the device, -ENOSPC, a short
	 * transfer (reported as -EIO), any other errno; they sum to write_errors + read_errors */
	uint64_t eio_errors, nospc_errors, short_io, other_errors;
	uint64_t refused_nospc, refused_quota;
	uint64_t dropped, dropped_bytes; /* T3: evicted by kvtd_spill_evict_lowest() */
	uint64_t injected;
	uint64_t uid_share; /* bytes one uid may hold; 0: no limit */
	uint64_t uids;	    /* uids holding space */
	unsigned queue_depth;
	int block_device;
};

/* What one uid holds (kvtd_spill_uids()). */
struct kvtd_spill_uid {
	uid_t uid;
	uint64_t bytes;
};

/*
 * kvtd_spill_open() - opens or creates the store at @p->path (see the guarantees above).
 * Returns 0 with *@ret_s set, or -errno with @err filled for a person: what was wrong with the
 * path and what to do.
 */
int kvtd_spill_open(const struct kvtd_spill_params *p, struct kvtd_spill **ret_s, char *err,
		    size_t errlen);
/* Waits for requests in flight (their results are dropped), then closes. Accepts NULL. */
void kvtd_spill_close(struct kvtd_spill *s);

/*
 * kvtd_spill_unlock() - lets go of the store's lock before a restart in place executes the new
 * binary, which opens the store again (its contents are not carried yet: docs/spill.md). The
 * exec closes the descriptor but the ring may hold the file a while longer. Returns 0, or
 * -EBUSY with a request in flight. kvtd_spill_relock() takes the lock back after a failed
 * exec: 0, or -errno (-EWOULDBLOCK: another process took the store meanwhile).
 */
int kvtd_spill_unlock(struct kvtd_spill *s);
int kvtd_spill_relock(struct kvtd_spill *s);

/*
 * The eventfd (non-blocking) the ring signals on each completion, for the main loop to poll.
 * Its poller reads it (8 bytes) when the poll fires and then calls kvtd_spill_reap() until it
 * returns less than asked: a completion after that read signals it again, so none is missed.
 */
int kvtd_spill_fd(const struct kvtd_spill *s);

/*
 * kvtd_spill_register_buffers() - the memory requests may use, replacing any registered
 * before (none may be in flight: -EBUSY). Each region must start and end on a 4 KiB boundary
 * and be at most KVTD_SPILL_MAX_BUF. Returns 0 or -errno (-EINVAL, -ENOMEM, -EBUSY, or the
 * kernel's refusal, e.g. -ENOMEM past RLIMIT_MEMLOCK).
 */
int kvtd_spill_register_buffers(struct kvtd_spill *s, const struct iovec *iov, unsigned n);

/*
 * kvtd_spill_alloc() - an extent of @bytes (rounded up to whole units) for @uid, with @importance
 * (lower goes first, kvtd_spill_evict_lowest()) and the caller's @tag. Returns 0 with
 * *@ret_ext, -EINVAL (@bytes 0 or past the store), -EDQUOT (past @uid's share) or -ENOSPC.
 */
int kvtd_spill_alloc(struct kvtd_spill *s, uid_t uid, uint64_t bytes, double importance,
		     uint64_t tag, kvtd_spill_ext *ret_ext);
/* Returns 0, -ENOENT (not a live extent) or -EBUSY (a request on it is in flight). */
int kvtd_spill_free(struct kvtd_spill *s, kvtd_spill_ext ext);
/* Returns 0 or -ENOENT. */
int kvtd_spill_set_importance(struct kvtd_spill *s, kvtd_spill_ext ext, double importance);
/* The extent's bytes (whole units) and offset in the store. Returns 0 or -ENOENT. */
int kvtd_spill_extent(const struct kvtd_spill *s, kvtd_spill_ext ext, uint64_t *ret_off,
		      uint64_t *ret_bytes);
/*
 * kvtd_spill_evict_lowest() - frees the least important extent with no request in flight and
 * counts it as dropped (T3). Returns 0 with *@ret filled, -ENOENT (no extent) or -EBUSY (every
 * extent has a request in flight).
 */
int kvtd_spill_evict_lowest(struct kvtd_spill *s, struct kvtd_spill_dropped *ret);

/*
 * kvtd_spill_write(), kvtd_spill_read() - queue a transfer of @len bytes between @buf and the
 * start of @ext; kvtd_spill_submit() sends it. @buf must lie in a registered buffer, on a 4 KiB
 * boundary, with room for @len rounded up to 4 KiB (the I/O is whole units: a read fills the
 * padding too, a write stores it). Returns 0, -ENOENT (@ext), -EINVAL (@len 0 or past the
 * extent, @buf unaligned or not registered) or -EBUSY (queue_depth requests in flight: reap
 * first). The completion carries @cookie.
 */
int kvtd_spill_write(struct kvtd_spill *s, kvtd_spill_ext ext, const void *buf, uint64_t len,
		     uint64_t cookie);
int kvtd_spill_read(struct kvtd_spill *s, kvtd_spill_ext ext, void *buf, uint64_t len,
		    uint64_t cookie);
/* Sends the queued requests. Returns how many, or -errno from io_uring_submit(). */
int kvtd_spill_submit(struct kvtd_spill *s);
/*
 * kvtd_spill_reap() - submits what is queued, then up to @max completions into @out, without
 * blocking. Returns how many (0: none yet).
 */
int kvtd_spill_reap(struct kvtd_spill *s, struct kvtd_spill_cqe *out, unsigned max);
/* Blocks until at least one completion is ready (for tools and tests, not the main loop).
 * Returns 0 or -errno; -EAGAIN when nothing is in flight. */
int kvtd_spill_wait(struct kvtd_spill *s);

void kvtd_spill_get_stats(const struct kvtd_spill *s, struct kvtd_spill_stats *ret);
/* Bytes @uid holds. */
uint64_t kvtd_spill_uid_bytes(const struct kvtd_spill *s, uid_t uid);
/*
 * kvtd_spill_uids() - the uids holding space, most bytes first (ties: lower uid first), at most
 * @max of them into @out. Returns how many uids hold space (more than @max when some were left
 * out).
 */
unsigned kvtd_spill_uids(const struct kvtd_spill *s, struct kvtd_spill_uid *out, unsigned max);

/* Fault injection (tests): the next @count requests of @ops (KVTD_SPILL_OP_* bits) complete
 * with @kind: -EIO, -ENOSPC, or KVTD_SPILL_FAULT_SHORT (half the length). 0 @count clears. */
#define KVTD_SPILL_FAULT_SHORT 1
int kvtd_spill_inject(struct kvtd_spill *s, unsigned ops, int kind, unsigned count);

#endif
