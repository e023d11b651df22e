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

/* The opcode's name for logs and metrics ("unknown" outside the table). */
const char *kvtd_op_name(unsigned opcode);

#endif
