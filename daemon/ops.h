/* SPDX-License-Identifier: MIT */
/*
 * ops.h - one handler per opcode: validate the private SQE copy, then act.
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

/* The opcode's name for logs and metrics ("unknown" outside the table). */
const char *kvtd_op_name(unsigned opcode);

#endif
