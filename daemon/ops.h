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
 */
void kvtd_op_run(struct kvtd_session *s, const struct kvt_sqe *sqe, struct kvt_cqe *cqe);

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
