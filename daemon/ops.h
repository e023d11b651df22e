/* SPDX-License-Identifier: MIT */
/*
 * ops.h - the data path: drain a session's SQ and, per opcode, validate the private SQE copy, then
 * act. Above session.c: ops call into the session, never the other way round.
 */
#ifndef KVTD_OPS_H
#define KVTD_OPS_H

#include "kvt_abi.h"

struct kvtd_session;

/*
 * kvtd_op_run() - execute one SQE (already copied out of shared memory) and fill @cqe
 * (user_data is set by the caller). Unknown opcode, a set reserved bit or field, a bad id or an
 * (offset, length) outside the arena: res = -EINVAL and nothing else happens. Poller lock held.
 * The op is always counted. @start_ns: 0 leaves it untimed; else the op's start
 * (kvtd_now_ns()), and its duration goes into the latency histogram.
 * Returns the clock at the op's end when it was timed, else 0.
 */
uint64_t kvtd_op_run(struct kvtd_session *s, const struct kvt_sqe *sqe, struct kvt_cqe *cqe,
		     uint64_t start_ns);

/*
 * kvtd_op_fail() - state why the op being run is refused, printf-style; returns @r so a
 * handler can `return kvtd_op_fail(s, -EINVAL, "...", ...)`. kvtd_op_run() prefixes the opcode's
 * name, logs it at debug and hands it to the client (struct kvt_op_err). Formats only here, on
 * the error path. Poller lock held.
 */
int kvtd_op_fail(struct kvtd_session *s, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Poller: drain the SQ, run ops, post CQEs. With @slice_ns > 0, stop after the op during which
 * @slice_ns have passed since the first one started, so that the poller's other sessions get
 * their turn: what is left waits for the next round. Returns the number of SQEs consumed.
 */
unsigned kvtd_session_drain(struct kvtd_session *s, uint64_t slice_ns);

/* The opcode's name for logs and metrics ("unknown" outside the table). */
const char *kvtd_op_name(unsigned opcode);

#endif
