/* SPDX-License-Identifier: MIT */
/*
 * kvtier.h - libkvtier, the client library of the kvtier KV-cache memory service.
 *
 * An inference process connects to kvtierd, shares buffers with it, and submits operations
 * (append KV rows, add attention scores, re-tier, fetch, top-k) over a shared-memory ring: no
 * syscall on a busy data path. Every operation is asynchronous: get an SQE, fill it, submit,
 * then reap its CQE by user_data. Blocking wrappers (kvt_nop(), kvt_seq_open(), ...) do all
 * three for one operation.
 *
 * Errors: functions return 0 (or a count) on success and a negative errno on failure; errno is
 * never used. kvt_strerror() names kvtier-specific meanings. A lost daemon gives -ECONNRESET
 * (or the daemon's own error for a session it dropped), never a hang.
 *
 * Thread safety: a struct kvt_client is used by one thread at a time (like an io_uring);
 * different clients are independent. Nothing here logs.
 *
 * fork(): a session belongs to the process that connected it. In a child of that process every
 * call on the inherited client fails with -ECHILD and touches neither the rings nor the
 * control socket, so the parent's session carries on unaffected; the child may only
 * kvt_disconnect() it (which frees its own copy and nothing of the parent's) and kvt_connect()
 * a session of its own. Detected through a pthread_atfork() handler: a child made by a raw
 * clone() system call is not noticed and must not use the client.
 *
 * The wire structs (struct kvt_sqe, kvt_cqe, kvt_seq_params, kvt_seq_stat, KVT_OP_*) come from
 * kvtier/kvt_abi.h, installed under this header's directory.
 */
#ifndef KVTIER_H
#define KVTIER_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/kvt_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvt_client;
struct kvt_buf;

/* Connection options. Set @size = sizeof(struct kvt_opts) so the struct can grow. */
struct kvt_opts {
	uint32_t size;
	uint32_t sq_entries; /* 0: daemon default (256) */
	uint32_t cq_entries; /* 0: 2 * sq_entries */
	uint32_t spin_us;    /* kvt_wait_cqe() spins this long before sleeping; 0: never spin */
	uint64_t arena_size; /* 0: daemon default (16 MiB) */
	const char *name;    /* label shown by kvtierctl; NULL: the program name */
	uint32_t abi_major;  /* 0: KVT_ABI_MAJOR; set only to test mismatch handling */
	uint32_t reserved;
};

/*
 * kvt_connect() - open a session with kvtierd.
 * @path: control socket; NULL means $KVTIER_SOCKET, else KVT_DEFAULT_SOCKET.
 * @opts: NULL for defaults.
 * @ret_client: set on success only.
 * Returns 0, -ENOENT/-ECONNREFUSED (no daemon), -EACCES (uid not allowed), -EPROTO (ABI
 * mismatch, or a malformed reply), -EUSERS (session limits), -EINVAL (bad options),
 * -ETIMEDOUT (no answer within 10 s), -ENOMEM.
 */
int kvt_connect(const char *path, const struct kvt_opts *opts, struct kvt_client **ret_client);

/* Ends the session: the daemon frees every sequence, slot and buffer it held. NULL is fine. */
void kvt_disconnect(struct kvt_client *c);

/* The error message for this thread's last failed connect, buffer registration or
 * unregistration (the daemon's; empty when it gave none; each of those calls clears it first),
 * or blocking operation (kvt_nop() ... kvt_topk(), set when one fails: "FETCH: ...", the op and
 * what was wrong; a successful one leaves it, so read it right after the failure).
 * Valid until the next libkvtier call on this thread. */
const char *kvt_last_error(void);

/*
 * kvt_abi_version() - the ABI this libkvtier speaks: KVT_ABI_MAJOR << 16 | KVT_ABI_MINOR of the
 * kvt_abi.h it was built from. Bindings that mirror the wire structs (the Python package)
 * compare the major with their own before any call. Thread-safe.
 */
uint32_t kvt_abi_version(void);

/*
 * kvt_version() - the kvtier release this libkvtier belongs to, "major.minor.patch" (the
 * KVT_VERSION kvtierd --version and kvtierctl --version print). Static storage; thread-safe.
 */
const char *kvt_version(void);

/* Session id, as kvtierctl shows it. */
uint32_t kvt_session_id(const struct kvt_client *c);

/* The arena: client-managed payload space named in SQEs by (offset, length). */
void *kvt_arena(const struct kvt_client *c, uint64_t *ret_size);

/* ---- buffers --------------------------------------------------------------------------- */

/*
 * kvt_buf_alloc() - allocate a host-backend device buffer (a sealed memfd mapped into this
 * process and the daemon) and register it. Used as T0 and staging regions without a GPU.
 * Returns 0, -EINVAL (size 0), -ENOMEM, -EMFILE (buffers_per_session reached), -EOPNOTSUPP
 * (the daemon runs the CUDA backend: use kvt_buf_register_cuda()), -ECONNRESET.
 */
int kvt_buf_alloc(struct kvt_client *c, uint64_t size, struct kvt_buf **ret_buf);
/* Unregisters and unmaps (frees the device memory of kvt_buf_alloc_cuda()). Returns 0, -EBUSY
 * (an open sequence uses it; nothing changes), -ECONNRESET, or the CUDA driver's failure to
 * free (as kvt_buf_alloc_cuda(); the buffer is gone all the same). NULL is fine (0). */
int kvt_buf_free(struct kvt_client *c, struct kvt_buf *buf);
void *kvt_buf_ptr(const struct kvt_buf *buf);

/*
 * CUDA buffers and events. libkvtier reaches CUDA through the driver API, loaded at run time
 * (libcuda.so.1, or the file $KVTIER_LIBCUDA names: a seam for tests and debugging), never
 * through a CUDA runtime, so it lives in a process that has loaded a runtime of any version
 * (PyTorch's) and the caller links no CUDA either. Pointers, streams and events are the
 * runtime's and the driver's alike (a cudaStream_t is a CUstream, a cudaEvent_t a CUevent).
 * Thread safety: as the client; the calling thread's current CUDA context does not matter and
 * is left as it was. Errors of every call below, besides those listed with it: -EOPNOTSUPP (no
 * CUDA driver on this machine, one older than CUDA 11.4, or a stub; kvt_last_error() says
 * which), and a failed driver call as CUresult -> errno: out of memory -ENOMEM; invalid value,
 * handle or context, not found -EINVAL; no or invalid device -ENODEV; device unavailable
 * (exclusive compute mode) -EBUSY; not permitted -EPERM; not supported -EOPNOTSUPP; anything
 * else -EIO. kvt_last_error() then names the call and the CUresult.
 */

/*
 * kvt_buf_register_cuda() - share device memory with kvtierd as a device buffer (T0 or staging
 * region on the CUDA backend): the @size bytes at @dev_ptr, anywhere inside a cudaMalloc() /
 * cuMemAlloc() allocation (a PyTorch tensor's data_ptr() is fine). libkvtier exports the whole
 * allocation (cuMemGetAddressRange, cuIpcGetMemHandle), names its device by UUID, and the daemon
 * opens the handle on that device and addresses the allocation from its start; kvt_seq_open()
 * adds the buffer's offset in it (kvt_buf_offset()) to t0_base_off / stage_base_off, so layouts
 * are relative to @dev_ptr as for any buffer. A SEQ_OPEN built by hand (kvt_prep_seq_open())
 * must add kvt_buf_offset() itself. The memory stays the caller's: free it only after
 * kvt_buf_free() (or kvt_disconnect()). kvt_buf_ptr() returns @dev_ptr, kvt_buf_size() @size.
 * Returns 0, -EINVAL (NULL, not device memory, @size 0 or past the allocation's end, memory
 * that legacy CUDA IPC cannot export (cuMemMap); the daemon's refusals: bad handle), -ENODEV
 * (the daemon has no such device), -EOPNOTSUPP (also: the daemon runs the host backend),
 * -EMFILE (buffers_per_session), -ENOMEM, -ECONNRESET.
 */
int kvt_buf_register_cuda(struct kvt_client *c, void *dev_ptr, uint64_t size,
			  struct kvt_buf **ret_buf);

/*
 * kvt_buf_alloc_cuda() - a device buffer of @size bytes that libkvtier allocates (cuMemAlloc in
 * the primary context of device @device, ordinal in this process) and registers as
 * kvt_buf_register_cuda() does. kvt_buf_ptr() is its device address, for the caller to wrap
 * (DLPack, __cuda_array_interface__); kvt_buf_free() (or kvt_disconnect()) frees it.
 * Returns 0, -EINVAL (@size 0), -ENODEV (no device @device here, or the daemon has none of that
 * UUID), -ENOMEM, and kvt_buf_register_cuda()'s errors.
 */
int kvt_buf_alloc_cuda(struct kvt_client *c, int device, uint64_t size, struct kvt_buf **ret_buf);

/* Where a CUDA buffer starts in the allocation the daemon maps: 0 for a buffer registered at an
 * allocation's start, for kvt_buf_alloc_cuda() and for host buffers. */
uint64_t kvt_buf_offset(const struct kvt_buf *buf);

/*
 * kvt_event_get_cuda() - the session's interprocess CUDA event, opened in the primary context
 * of device @device (ordinal in this process): a CUevent (= cudaEvent_t) returned as void * so
 * this header needs no CUDA types. kvtierd records it after the copies of each op that moves
 * rows and before that op's CQE: after reaping the CQE, cudaStreamWaitEvent(stream, ev, 0)
 * orders the stream after the op's copies with no CPU wait (kvt_cuda_stream_wait() does this
 * for you). Asking again returns a new handle to the same event; destroy each with
 * cudaEventDestroy() / cuEventDestroy(). Returns 0, -EOPNOTSUPP (also: the daemon's host
 * backend, where copies are complete when the CQE is posted), -ENODEV, -ECONNRESET.
 */
int kvt_event_get_cuda(struct kvt_client *c, int device, void **ret_event);

/*
 * kvt_cuda_stream_wait() - order @stream (a cudaStream_t / CUstream; NULL is the current
 * context's default stream) after kvtierd's last recorded event for this session, i.e. after
 * the copies of every op whose CQE has been reaped: cuStreamWaitEvent(), no CPU wait. The first
 * call opens the session's event (in the primary context of the stream's device) and keeps it
 * until kvt_disconnect(). On the host backend it returns 0 and does nothing (copies are
 * complete when the CQE is posted), so the same code runs on both backends.
 * Returns 0, -EINVAL (not a stream, or NULL with no current context), -ENODEV (the daemon has
 * no device of that UUID), -ENOMEM, -ECONNRESET.
 */
int kvt_cuda_stream_wait(struct kvt_client *c, void *stream);
uint32_t kvt_buf_id(const struct kvt_buf *buf);
uint64_t kvt_buf_size(const struct kvt_buf *buf);

/* ---- asynchronous interface ------------------------------------------------------------ */

/*
 * kvt_get_sqe() - next free submission entry, zeroed, or NULL when the SQ is full or as many
 * operations are in flight as the CQ holds (reap first). Fill it, then kvt_submit().
 */
struct kvt_sqe *kvt_get_sqe(struct kvt_client *c);

/*
 * kvt_submit() - publish every SQE taken since the last submit. Rings the daemon's doorbell
 * only when its poller sleeps. Returns the number published (>= 0) or -ECONNRESET.
 */
int kvt_submit(struct kvt_client *c);

/* kvt_peek_cqe() - one completion if any. Returns 0 (copied to @ret_cqe) or -EAGAIN. */
int kvt_peek_cqe(struct kvt_client *c, struct kvt_cqe *ret_cqe);

/*
 * kvt_wait_cqe() - one completion: spins opts.spin_us, then sleeps on the doorbell.
 * Returns 0, -EAGAIN (nothing in flight), -ECONNRESET (daemon gone), or the negative errno
 * the daemon gave when it dropped the session (e.g. -EPROTO for a corrupted ring).
 */
int kvt_wait_cqe(struct kvt_client *c, struct kvt_cqe *ret_cqe);

/* Operations submitted and not yet reaped. */
unsigned kvt_inflight(const struct kvt_client *c);

/*
 * kvt_op_error() - why kvtierd refused the operation submitted with @user_data (a CQE with
 * res < 0): "OPNAME: what was wrong", copied NUL-terminated into @buf (cut to @len bytes).
 * The daemon keeps the reason of the session's most recent refusal only, so call it after
 * reaping that CQE and before a later op of this session fails. Returns 0, -ENOENT (the
 * kept reason is another op's, or no op was refused yet), -EOPNOTSUPP (a kvtierd older than
 * ABI 1.1, which keeps none), -EINVAL (@buf NULL or @len 0). Thread safety: as kvt_peek_cqe().
 */
int kvt_op_error(struct kvt_client *c, uint64_t user_data, char *buf, size_t len);

/* ---- prep helpers: one per opcode ------------------------------------------------------ */
/*
 * Each fills every field of an SQE from kvt_get_sqe() for one opcode except user_data (the
 * caller's) and stamp (kvt_submit()'s), as liburing's io_uring_prep_*() do; payloads live in
 * the arena (kvt_arena()) at offsets the caller manages. Field meanings and errors: kvt_abi.h.
 * The blocking wrappers below are these plus kvt_submit() and a wait for the one CQE.
 *
 * For C they are static inline. libkvtier also exports an out-of-line copy of each under the
 * same name (client/ffi.c compiles this header with KVT_INLINE defined to nothing, as
 * liburing-ffi does) for callers that cannot inline C: the Python package calls those, so the
 * helpers exist once, here.
 */
#ifndef KVT_INLINE
#define KVT_INLINE static inline
#endif
KVT_INLINE void
kvt_prep_rw(struct kvt_sqe *e, uint8_t opcode, uint32_t seq, unsigned op_flags, uint64_t arena_off,
	    uint32_t arena_len, uint32_t count, uint64_t arg0, uint64_t arg1, uint32_t arg2)
{
	e->opcode = opcode;
	e->flags = 0;
	e->op_flags = (uint16_t)op_flags;
	e->seq = seq;
	e->arena_off = arena_off;
	e->arena_len = arena_len;
	e->count = count;
	e->arg0 = arg0;
	e->arg1 = arg1;
	e->arg2 = arg2;
	e->buf_id = 0;
	e->arg3 = 0;
}

KVT_INLINE void
kvt_prep_nop(struct kvt_sqe *e)
{
	kvt_prep_rw(e, KVT_OP_NOP, 0, 0, 0, 0, 0, 0, 0, 0);
}

/* @params_off: a struct kvt_seq_params in the arena. CQE res: the sequence id. */
KVT_INLINE void
kvt_prep_seq_open(struct kvt_sqe *e, uint64_t params_off)
{
	kvt_prep_rw(e, KVT_OP_SEQ_OPEN, 0, 0, params_off, sizeof(struct kvt_seq_params), 0, 0, 0,
		    0);
}

KVT_INLINE void
kvt_prep_seq_close(struct kvt_sqe *e, uint32_t seq)
{
	kvt_prep_rw(e, KVT_OP_SEQ_CLOSE, seq, 0, 0, 0, 0, 0, 0, 0);
}

/* @ntok tokens' rows, @rows_len bytes at @rows_off. CQE res: new n; aux[0]: first position. */
KVT_INLINE void
kvt_prep_append(struct kvt_sqe *e, uint32_t seq, uint64_t rows_off, uint32_t rows_len,
		uint32_t ntok)
{
	kvt_prep_rw(e, KVT_OP_APPEND, seq, 0, rows_off, rows_len, ntok, 0, 0, 0);
}

/* @ntok tokens the client wrote into T0 slots, whose u32 ids are at @slots_off. */
KVT_INLINE void
kvt_prep_append_t0(struct kvt_sqe *e, uint32_t seq, uint64_t slots_off, uint32_t ntok)
{
	kvt_prep_rw(e, KVT_OP_APPEND, seq, KVT_APPEND_F_T0, slots_off,
		    ntok * (uint32_t)sizeof(uint32_t), ntok, 0, 0, 0);
}

/* score[first_pos + i] += values[i], @n f32 values at @values_off. */
KVT_INLINE void
kvt_prep_score_add(struct kvt_sqe *e, uint32_t seq, uint64_t first_pos, uint64_t values_off,
		   uint32_t n)
{
	kvt_prep_rw(e, KVT_OP_SCORE_ADD, seq, 0, values_off, n * (uint32_t)sizeof(float), n,
		    first_pos, 0, 0);
}

/* struct kvt_seq_stat written at @out_off. */
KVT_INLINE void
kvt_prep_seq_stat(struct kvt_sqe *e, uint32_t seq, uint64_t out_off)
{
	kvt_prep_rw(e, KVT_OP_SEQ_STAT, seq, 0, out_off, sizeof(struct kvt_seq_stat), 0, 0, 0, 0);
}

/* Output at @out_off, @out_len bytes (KVT_RETIER_OUT_SIZE(t0_slots) always suffices). */
KVT_INLINE void
kvt_prep_retier(struct kvt_sqe *e, uint32_t seq, uint64_t out_off, uint32_t out_len)
{
	kvt_prep_rw(e, KVT_OP_RETIER, seq, 0, out_off, out_len, 0, 0, 0, 0);
}

/*
 * Stage layers [@layer0, @layer0 + @nlayers) from staging row @stage_row. @pos_off: u32
 * positions in the arena, @npos of them: the list to stage with KVT_FETCH_F_LIST, else room
 * for the staged positions the daemon writes there.
 */
KVT_INLINE void
kvt_prep_fetch(struct kvt_sqe *e, uint32_t seq, unsigned flags, uint32_t layer0, uint32_t nlayers,
	       uint32_t stage_row, uint64_t pos_off, uint32_t npos)
{
	kvt_prep_rw(e, KVT_OP_FETCH, seq, flags, pos_off, npos * (uint32_t)sizeof(uint32_t),
		    (flags & KVT_FETCH_F_LIST) ? npos : 0, layer0, nlayers, stage_row);
}

/*
 * FETCH (ABI 1.6) of the @npos positions at @pos_off in the arena, each to the staging row the
 * @npos u32 after them give (KVT_FETCH_F_ROWS), into registered buffer @buf_id (0: the
 * sequence's staging region) laid out as the staging region: a paged cache's blocks.
 */
KVT_INLINE void
kvt_prep_fetch_rows(struct kvt_sqe *e, uint32_t seq, uint32_t layer0, uint32_t nlayers,
		    uint32_t buf_id, uint64_t pos_off, uint32_t npos)
{
	kvt_prep_rw(e, KVT_OP_FETCH, seq, KVT_FETCH_F_LIST | KVT_FETCH_F_ROWS, pos_off,
		    npos * 2 * (uint32_t)sizeof(uint32_t), npos, layer0, nlayers, 0);
	e->buf_id = buf_id;
}

/*
 * TOPK (ABI 1.5): the struct kvt_topk_req at @req_off in the arena (8-byte aligned) says
 * everything, the mode and every knob included; it names the query's and the output's places
 * in the arena (kvt_abi.h, TOPK). Set its size to sizeof(struct kvt_topk_req).
 */
KVT_INLINE void
kvt_prep_topk(struct kvt_sqe *e, uint32_t seq, uint64_t req_off)
{
	kvt_prep_rw(e, KVT_OP_TOPK, seq, KVT_TOPK_F_REQ, req_off, sizeof(struct kvt_topk_req), 0, 0,
		    0, 0);
}

/*
 * SEQ_OPEN in namespace @ns (kvt_prep_ns_open()'s id; 0: none) starting with @prefix_blocks
 * blocks pinned there by the last kvt_prep_lookup() with KVT_LOOKUP_F_PIN.
 */
KVT_INLINE void
kvt_prep_seq_open_prefix(struct kvt_sqe *e, uint64_t params_off, uint32_t ns,
			 uint32_t prefix_blocks)
{
	kvt_prep_rw(e, KVT_OP_SEQ_OPEN, 0, 0, params_off, sizeof(struct kvt_seq_params),
		    prefix_blocks, ns, 0, 0);
}

/* Namespace from the struct kvt_ns_params at @params_off. */
KVT_INLINE void
kvt_prep_ns_open(struct kvt_sqe *e, uint64_t params_off)
{
	kvt_prep_rw(e, KVT_OP_NS_OPEN, 0, 0, params_off, sizeof(struct kvt_ns_params), 0, 0, 0, 0);
}

KVT_INLINE void
kvt_prep_ns_close(struct kvt_sqe *e, uint32_t ns)
{
	kvt_prep_rw(e, KVT_OP_NS_CLOSE, 0, 0, 0, 0, 0, ns, 0, 0);
}

/* How many of the @nkeys block keys at @keys_off (8-byte aligned) lead in @ns. */
KVT_INLINE void
kvt_prep_lookup(struct kvt_sqe *e, uint32_t ns, unsigned flags, uint64_t keys_off, uint32_t nkeys)
{
	kvt_prep_rw(e, KVT_OP_LOOKUP, 0, flags, keys_off,
		    nkeys * (uint32_t)sizeof(struct kvt_block_key), nkeys, ns, 0, 0);
}

/* Offer the first @nkeys blocks of @seq, keyed by the keys at @keys_off, to its namespace. */
KVT_INLINE void
kvt_prep_publish(struct kvt_sqe *e, uint32_t seq, uint64_t keys_off, uint32_t nkeys)
{
	kvt_prep_rw(e, KVT_OP_PUBLISH, seq, 0, keys_off,
		    nkeys * (uint32_t)sizeof(struct kvt_block_key), nkeys, 0, 0, 0);
}

/* ---- blocking wrappers ------------------------------------------------------------------ */
/*
 * Each submits one operation and waits for it, keeping any other completion for a later
 * kvt_peek_cqe()/kvt_wait_cqe(). The ones that carry a payload use the start of the arena, so
 * they return -EBUSY while asynchronous operations are in flight. Each returns the daemon's
 * result: >= 0 or a negative errno (-EINVAL bad field, -ENOENT sequence not open, -EDQUOT quota,
 * -ENOMEM pool exhausted, -E2BIG payload larger than the arena, -ECONNRESET).
 * On failure kvt_last_error() says why.
 */

/* Round trip with no work. */
int kvt_nop(struct kvt_client *c);

/* Opens a sequence; @p->size must be sizeof(*p). Sets @ret_seq to its id. */
int kvt_seq_open(struct kvt_client *c, const struct kvt_seq_params *p, uint32_t *ret_seq);
int kvt_seq_close(struct kvt_client *c, uint32_t seq);

/*
 * kvt_append() - append @ntok tokens whose rows are laid out [token][layer][K,V][head][dim] in
 * @rows, @len bytes (ntok * layers * 2 * kv_heads * head_dim elements of the dtype). Sets
 * @ret_first (may be NULL) to the first new position. Returns the new token count.
 */
int64_t kvt_append(struct kvt_client *c, uint32_t seq, const void *rows, uint64_t len,
		   uint32_t ntok, uint64_t *ret_first);

/* Appends @ntok tokens whose rows the client wrote into T0 slots @slots of its T0 region. */
int64_t kvt_append_t0(struct kvt_client *c, uint32_t seq, const uint32_t *slots, uint32_t ntok);

/* score[first + i] += values[i] for i < n (cumulative attention; values >= 0, finite). */
int kvt_score_add(struct kvt_client *c, uint32_t seq, uint64_t first, const float *values,
		  uint32_t n);

int kvt_seq_stat(struct kvt_client *c, uint32_t seq, struct kvt_seq_stat *ret_stat);

/*
 * kvt_retier() - re-tier the sequence (docs/tiering.md). @out receives struct
 * kvt_retier_result, then its n_changes struct kvt_slot_change, then n_free u32 free slots
 * (see kvt_abi.h); @out_len must hold them (KVT_RETIER_OUT_SIZE(t0_slots) always does).
 * Returns the bytes written, -ENOSPC (@out too small: nothing changed), -ENOMEM/-EDQUOT (no pool
 * room for int8 rows: nothing changed), or the errors above. At most @out_len bytes are ever
 * written to @out (a daemon that answers with more gets -EMSGSIZE, @out untouched), so @out_len
 * must be @out's true size; values past the arena's size are treated as the arena's size.
 */
int kvt_retier(struct kvt_client *c, uint32_t seq, void *out, uint64_t out_len);

/*
 * kvt_fetch() - stage rows of layers [@layer0, @layer0 + @nlayers) into the staging region from
 * staging row @stage_row on. @flags KVT_FETCH_F_T1 and/or KVT_FETCH_F_T2: every position of
 * those tiers, ascending, written to @pos (room for @count); KVT_FETCH_F_LIST: the @count
 * positions in @pos, in that order. Returns the rows staged per (layer, K|V), -ENOSPC (staging
 * region or @pos too small: nothing staged), -EINVAL, -ENOENT (a listed position was evicted),
 * -EMSGSIZE (the daemon counted more positions than @count: @pos untouched).
 */
int kvt_fetch(struct kvt_client *c, uint32_t seq, unsigned flags, uint32_t layer0, uint32_t nlayers,
	      uint32_t stage_row, uint32_t *pos, uint32_t count);

/*
 * kvt_fetch_rows() - stage rows of layers [@layer0, @layer0 + @nlayers) of the @count positions
 * @pos, position i at staging row @rows[i], into @buf (NULL: the sequence's staging region)
 * laid out as the sequence's staging region (kvt_abi.h, FETCH: KVT_FETCH_F_ROWS and buf_id).
 * With one @buf per layer, a serving engine's paged cache, each layer a registration of its
 * own, takes its blocks straight from the pool: one call per layer. Needs a daemon of ABI 1.6.
 * Returns @count, -EOPNOTSUPP (an older daemon), -E2BIG (the lists pass the arena), or
 * kvt_fetch()'s errors; -EINVAL also for a row >= stage_slots, -ENOENT for a @buf not
 * registered, -ERANGE for one too small for the layout.
 */
int kvt_fetch_rows(struct kvt_client *c, uint32_t seq, uint32_t layer0, uint32_t nlayers,
		   const struct kvt_buf *buf, const uint32_t *pos, const uint32_t *rows,
		   uint32_t count);

/*
 * Layer-pipelined staging (CUDA backend). kvtierd posts a FETCH's CQE as soon as its copies are
 * queued, so a decode step can stage layer l+1's T1/T2 rows while layer l computes: one FETCH
 * per layer in flight, into the other half of a double-buffered staging region, and a
 * per-layer event the compute stream waits on, with no CPU wait on the copies. Open the
 * sequence with stage_slots = 2 * m (m: the T1 + T2 rows of a layer, ctx - T0 rows with
 * evict 0) and stage_layer_stride = 0: every layer uses the same 2 m rows, layer number g
 * (counted over all steps) the half g % 2. Per half, two CUDA events: staged[h] (its rows
 * landed), read[h] (the attention that last read it is done). With a side stream `aux`:
 *
 *	static void stage(uint32_t layer, uint64_t g)	// layer number g of the run
 *	{
 *		int h = g % 2;
 *		if (g >= 2)	// the half's previous reader; layer g-1 is queued behind it
 *			cudaEventSynchronize(read[h]);
 *		kvt_fetch(c, seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, layer, 1, h * m, pos, m);
 *		kvt_cuda_stream_wait(c, aux);	// aux waits for this FETCH's copies ...
 *		cudaEventRecord(staged[h], aux);	// ... and this event marks them
 *	}
 *
 *	stage(0, g++);				// before the first step
 *	for (l = 0; l < layers; l++) {		// each decode step
 *		int h = (g - 1) % 2;		// layer l's half, staged last
 *		qkv_projection(l, compute);
 *		cudaStreamWaitEvent(compute, staged[h], 0);
 *		attention(l, t0_rows(l), stage + h * m, compute);
 *		cudaEventRecord(read[h], compute);
 *		mlp(l, compute);
 *		stage(l + 1 < layers ? l + 1 : 0, g++);	// overlaps layer l on the device
 *	}
 *
 * The CPU waits only for read[h] of the layer before last, while the previous layer is still
 * queued, so the device never idles on it. kvt_cuda_stream_wait() must follow the FETCH's
 * kvt_fetch() (or its reaped CQE) before the next op of the session that moves rows: it waits
 * for the session event's latest record, and a later op's record would make this layer wait
 * for that op's copies too. kvtier-bench gpu-decode (tools/bench/gpu_decode.c) runs this
 * pattern. On the host backend the same code works: copies are done when the CQE is posted.
 */

/*
 * kvt_topk_run() - TOPK as @req says (kvt_abi.h, struct kvt_topk_req): mode
 * (KVT_TOPK_EXACT, _ESTIMATE, _FAST, _PROBE with @req->probe), flags (KVT_TOPK_F_UNION,
 * KVT_TOPK_F_FETCH), layer, k. @query: @req->query_len bytes, q_heads * head_dim f32; @out
 * receives @req->out_len bytes: u32 n[kv_heads], u32 pos[kv_heads][stride], f32
 * score[kv_heads][stride]. @req->query_off and out_off are not read: libkvtier places both in
 * the arena. The sequence was opened with ret_update > 0. n[h] is min(k, live keys): evicted
 * positions are never candidates nor returned. KVT_TOPK_EXACT returns the exact top-k at any
 * zone length (int8 keys as they dequantize) with exact scores; FAST and PROBE return the exact
 * top-k of the keys they score, with exact scores; ESTIMATE returns estimated scores. What each
 * mode scores: kvt_abi.h; its recall and time: docs/retrieval.md. A kvtierd older than ABI 1.5
 * gets the same request in TOPK's SQE form (modes it does not know refuse it with -EINVAL).
 * Returns the stride, -ERANGE (k larger than the retrieval zone: attend densely), -ENOSPC
 * (@out or staging too small), -EINVAL (the daemon's checks, or @req->size not
 * sizeof(struct kvt_topk_req)), -E2BIG (the query and output do not fit the arena),
 * -EOPNOTSUPP (a field an old kvtierd cannot be told), or the errors above.
 */
int kvt_topk_run(struct kvt_client *c, uint32_t seq, const struct kvt_topk_req *req,
		 const float *query, void *out);

/*
 * kvt_topk() - kvt_topk_run() with the knobs as arguments, as before ABI 1.5: @flags
 * KVT_TOPK_F_UNION, KVT_TOPK_F_FETCH, and KVT_TOPK_F_ESTIMATE or KVT_TOPK_F_FAST for those
 * modes (not both: -EINVAL); @q_len floats of @query; @out_len bytes of @out.
 */
int kvt_topk(struct kvt_client *c, uint32_t seq, uint32_t layer, uint32_t k, unsigned flags,
	     const float *query, uint32_t q_len, void *out, uint64_t out_len);

/* kvt_topk_probe() - kvt_topk() in mode KVT_TOPK_PROBE when @probe > 0 (then @flags must hold
 * KVT_TOPK_F_FAST, else -EINVAL); @probe 0 is kvt_topk(). Kept for ABI 1.4 callers. */
int kvt_topk_probe(struct kvt_client *c, uint32_t seq, uint32_t layer, uint32_t k, unsigned flags,
		   uint32_t probe, const float *query, uint32_t q_len, void *out, uint64_t out_len);

/* ---- prefix blocks (docs/prefix.md) ------------------------------------------------------ */
/*
 * Processes that serve the same prompt prefix compute its rows once and hold them once:
 *
 *	kvt_ns_open(c, &np, &ns);                       // model identity + geometry
 *	n = kvt_block_keys(&np, NULL, tokens, ntok, keys, max);
 *	m = kvt_lookup(c, ns, keys, n, KVT_LOOKUP_F_PIN); // m blocks are cached: pinned
 *	kvt_seq_open_prefix(c, &p, ns, m, &seq);         // n = m * block_tokens, no copy
 *	... prefill tokens[m * block_tokens ..], appending their rows as usual ...
 *	kvt_publish(c, seq, keys, n);                    // for the next process
 *
 * Rows are shared only inside a namespace (same name, geometry, dtype, block size, and uid unless
 * the daemon's prefix_share_* config says otherwise). A hit is faster than a miss, so processes
 * sharing a namespace can learn which prefixes the others used.
 */

/* Opens (or joins) namespace @np; sets @ret_ns to its id for this session. */
int kvt_ns_open(struct kvt_client *c, const struct kvt_ns_params *np, uint32_t *ret_ns);
/* Closes the session's handle (its pins go); cached blocks stay. */
int kvt_ns_close(struct kvt_client *c, uint32_t ns);

/*
 * kvt_block_keys() - the keys of the full blocks of @tokens (@ntok token ids) in namespace
 * @np: key i = XXH3-128(key i-1, tokens of block i), key -1 = XXH3-128 of the namespace's
 * identity (name, geometry, dtype, block_tokens), so a key names its whole prefix and nothing
 * of another namespace. @parent: the key of the block before @tokens[0] (NULL: @tokens start
 * the sequence). Writes min(ntok / block_tokens, @max) keys to @keys and returns that count,
 * or -EINVAL (@np fails the daemon's NS_OPEN checks). Pure computation: no connection needed.
 */
int kvt_block_keys(const struct kvt_ns_params *np, const struct kvt_block_key *parent,
		   const uint32_t *tokens, size_t ntok, struct kvt_block_key *keys, size_t max);

/* How many of @keys (in order) lead in namespace @ns; with KVT_LOOKUP_F_PIN, pins them for
 * kvt_seq_open_prefix(). */
int kvt_lookup(struct kvt_client *c, uint32_t ns, const struct kvt_block_key *keys, uint32_t n,
	       unsigned flags);

/*
 * kvt_seq_open_prefix() - kvt_seq_open() in namespace @ns (may PUBLISH there), starting with
 * the first @prefix_blocks blocks the last pinning kvt_lookup() on @ns matched: its n is
 * @prefix_blocks * block_tokens, rows shared (copy-on-write) with every other user.
 */
int kvt_seq_open_prefix(struct kvt_client *c, const struct kvt_seq_params *p, uint32_t ns,
			uint32_t prefix_blocks, uint32_t *ret_seq);

/*
 * kvt_publish() - offer the first @n full blocks of @seq (keys from kvt_block_keys()) to its
 * namespace. Returns how many leading blocks the namespace now holds for it (it stops at a
 * block with an evicted or int8 position); sets @ret_new (may be NULL) to how many of them this
 * call published. -ENOSPC: nothing published, the daemon's prefix cache is full of blocks in
 * use.
 */
int kvt_publish(struct kvt_client *c, uint32_t seq, const struct kvt_block_key *keys, uint32_t n,
		uint32_t *ret_new);

/* ---- tiering driver (docs/tiering.md, "The client's loop") -------------------------------- */
/*
 * The decode-step cadence of one sequence with a T0 region and a staging region, as an
 * inference engine runs it (kvtier-llm and the Python package's KvtierCache both do):
 *
 *	kvt_driver_open(c, &p, NULL, &d);		// p: geometry, policy knobs, both regions
 *	for each forward pass of q new tokens:
 *		kvt_driver_step_begin(d, q, &slots);	// RETIER + FETCH when due
 *		m = kvt_driver_view(d, &pos, &loc);	// what attention reads, by position
 *		... write the q tokens' rows into T0 slots slots[0..q), every layer, K and V;
 *		    attend over loc[0..m) (the last q entries are the new tokens) ...
 *		kvt_driver_step_end(d, w, m);		// queues APPEND and SCORE_ADD
 *	kvt_driver_close(d);				// submits what is queued, SEQ_CLOSE
 *
 * The driver keeps the client-side mirror of the tiers: which position each T0 slot holds, the
 * free slots the last RETIER handed out, and where every live position's rows are (a T0 slot,
 * or a staging row FETCH filled). Each pass takes its q slots in the order RETIER handed them
 * out (before the first RETIER every slot is free; a pass longer than the slots handed out, the
 * prompt, takes any slot free now, lowest first). step_end() queues one APPEND
 * (KVT_APPEND_F_T0, the pass's slots) and one SCORE_ADD (the pass's weights, dense over
 * [first attended position, n) with 0 at the holes); the queue goes to kvtierd in one submit
 * before the next RETIER, kvt_driver_flush() or kvt_driver_close(), or earlier when the SQ or
 * the arena is full. The daemon runs a session's SQEs in ring order, so its scores sum the same
 * values in the same order as one round trip per op would: tiering decisions are the same.
 *
 * Cadence: a pass at n > 0 first re-tiers when the slots handed out cannot hold its q tokens
 * (every Δ tokens of decode) and when n is the prompt's length (p->prompt_len: the prompt is
 * in). RETIER's answer is checked (slot changes in range, free slots free) and applied; then,
 * when T1 or T2 holds positions, one FETCH (KVT_FETCH_F_T1 | KVT_FETCH_F_T2, all layers, from
 * staging row 0) stages them, and the view is rebuilt: every live position exactly once, in a
 * T0 slot or a staging row, else -EPROTO (a daemon that broke that would silently change the
 * model's output). Between two RETIERs the T1/T2 sets do not change, so staged rows stay valid.
 *
 * The driver uses the client's ring and the start of its arena: while ops are queued the
 * caller submits nothing of its own on @c (kvt_driver_flush() first; blocking wrappers such
 * as kvt_seq_stat() and kvt_publish() on kvt_driver_seq() are fine after it). After a failure
 * every call but kvt_driver_stats() and kvt_driver_close() returns the same error, and
 * kvt_last_error() says again what failed. Thread safety: as the client.
 */
struct kvt_driver;

/* Options of kvt_driver_open(). Set @size = sizeof(struct kvt_driver_opts). NULL: none. */
struct kvt_driver_opts {
	uint32_t size;
	uint32_t flags;		/* none defined: 0 */
	uint32_t ns;		/* prefix sharing: a namespace of kvt_ns_open(), 0: none */
	uint32_t prefix_blocks; /* open from the first blocks the last pinning kvt_lookup() on @ns
				 * matched (kvt_seq_open_prefix()); 0: an empty sequence */
	uint64_t reserved[2];	/* must be zero */
};

/* What a driver has done. Set @size = sizeof(struct kvt_driver_stats) before the call. */
struct kvt_driver_stats {
	uint32_t size;
	uint32_t seq;		/* the sequence's id */
	uint32_t n;		/* positions appended (queued included) */
	uint32_t view;		/* entries of the current view, the pass's new tokens included */
	uint32_t t0_slots;	/* of the sequence */
	uint32_t stage_slots;	/* staging rows */
	uint32_t prefix_tokens; /* positions the sequence opened with (prefix sharing) */
	uint32_t last_retier_n; /* n at the last RETIER */
	uint32_t first_evict_n; /* n at the first RETIER whose answer counted evicted tokens */
	uint32_t reserved;
	uint64_t tier_count[4]; /* of the last RETIER's answer */
	uint64_t steps;		/* passes ended (each queued one APPEND) */
	uint64_t score_adds;	/* SCORE_ADDs queued */
	uint64_t retiers, fetches;
	uint64_t rows_staged; /* by every FETCH, per (layer, K|V) */
	uint64_t submits;     /* kvt_submit() of the queue */
	uint64_t retier_ns;   /* in RETIER (the queue's submit and reap before it included) */
	uint64_t fetch_ns;    /* in FETCH */
	uint64_t reap_ns;     /* submitting the queue and waiting for its completions */
};

/*
 * kvt_driver_t0_slots() - the T0 slots a sequence of @p needs: the HBM budget at max_tokens
 * (ceil(hbm_frac * max_tokens); policy full: max_tokens; streaming: the protected set), raised
 * to the protected set (max(sinks, prompt_len if protect_prompt) + window), plus Δ slots for
 * the tokens between two RETIERs, and at least prompt_len (the prompt lands in T0 in one pass).
 * Reads policy, hbm_frac, max_tokens, sinks, window, protect_prompt, prompt_len, delta.
 * Returns the count (> 0), or -EINVAL (delta or max_tokens 0, max_tokens over 2^24, prompt_len
 * over max_tokens, an unknown policy). Pure computation; thread-safe.
 */
int kvt_driver_t0_slots(const struct kvt_seq_params *p);

/*
 * kvt_driver_open() - open a sequence with @p (kvt_seq_open(), or kvt_seq_open_prefix() with
 * @opts' namespace) and a driver for it. @p must give a T0 region (t0_buf_id, t0_slots, at least
 * delta + 1 slots) and a staging region (stage_buf_id, stage_slots > 0); the caller keeps
 * both buffers registered until kvt_driver_close(). Opened from a prefix, the sequence's
 * shared positions (all T1) are staged at once (FETCH) and make up the first view.
 * @c: borrowed, must outlive the driver. @ret_drv: set on success only.
 * Returns 0, -EINVAL (NULL, bad @opts, no T0 or staging region; kvt_last_error() says which),
 * -ENOMEM, or kvt_seq_open()'s, kvt_seq_open_prefix()'s and kvt_fetch()'s errors.
 */
int kvt_driver_open(struct kvt_client *c, const struct kvt_seq_params *p,
		    const struct kvt_driver_opts *opts, struct kvt_driver **ret_drv);

/*
 * kvt_driver_step_begin() - start a forward pass of @q new tokens at position n: RETIER and
 * FETCH when due (above), then take @q T0 slots. *@ret_slots (may be NULL): the @q slots, for
 * positions n..n+q-1 in order, into which the caller writes the tokens' rows (every layer, K
 * and V) before the queue is submitted; valid until the next call on the driver.
 * Returns 1 when the view was rebuilt (RETIER ran: re-read every entry), 0 when only the @q new
 * entries were added at its end; -EINVAL (@q 0), -EBUSY (a pass is already begun), -ENOSPC
 * (n + @q over max_tokens, or fewer than @q T0 slots free: nothing changed, the driver stays
 * usable), -EPROTO (the daemon's answer breaks the rules above), or RETIER's, FETCH's and the
 * queued ops' errors.
 */
int kvt_driver_step_begin(struct kvt_driver *d, uint32_t q, const uint32_t **ret_slots);

/*
 * kvt_driver_view() - the entries attention reads, in increasing position order: the live
 * positions of the view (resident and staged), then, within a pass, its @q new tokens.
 * *@ret_pos: each entry's position; *@ret_loc: where its rows are, a T0 slot (< t0_slots) or
 * t0_slots + a staging row (so a buffer holding T0 slots then staging rows is indexed as is).
 * Either may be NULL. Valid until the next step_begin(). Returns the entry count.
 */
uint32_t kvt_driver_view(const struct kvt_driver *d, const uint32_t **ret_pos,
			 const uint32_t **ret_loc);

/*
 * kvt_driver_step_end() - end the pass: queue its APPEND and, when @w is not NULL, its
 * SCORE_ADD. @w: @nw attention weights, one per view entry (kvt_driver_view()'s count), the
 * step's weights averaged over layers and heads and summed over its queries; each finite and
 * >= 0 (-0 is taken as 0). Returns 0, -EINVAL (no pass begun, @nw not the view's count, a
 * weight negative, NaN or over 1e30: nothing queued, the pass stays open), -E2BIG (a payload
 * larger than the arena), or the queued ops' errors when the queue had to be submitted.
 */
int kvt_driver_step_end(struct kvt_driver *d, const float *w, uint32_t nw);

/*
 * kvt_driver_flush() - submit what is queued and reap it, checking each op (an APPEND must
 * answer the n it reached). Returns 0, -EBUSY (inside a pass: its rows may not be written
 * yet), or the failed op's error (kvt_last_error(): which op, at which n, and kvtierd's reason).
 */
int kvt_driver_flush(struct kvt_driver *d);

/* Counters and state; 0, or -EINVAL (@ret NULL or its size smaller than the first version). */
int kvt_driver_stats(const struct kvt_driver *d, struct kvt_driver_stats *ret);

/* The sequence's id (for kvt_seq_stat(), kvt_publish() after kvt_driver_flush()). */
uint32_t kvt_driver_seq(const struct kvt_driver *d);

/*
 * kvt_driver_close() - submit what is queued, close the sequence and free the driver (the
 * client and buffers stay the caller's). After a failure it only frees (the session's end
 * frees the sequence). NULL is fine. Returns 0, the failure the driver had, or SEQ_CLOSE's error.
 */
int kvt_driver_close(struct kvt_driver *d);

/* Message for a negative errno from libkvtier or the daemon, kvtier meanings first. */
const char *kvt_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_H */
