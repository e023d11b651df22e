/* SPDX-License-Identifier: MIT */
/*
 * kvtier_int.h - private to libkvtier: the control requests kvtier_cuda.c builds on, so that
 * kvtier.c stays free of CUDA. Hidden symbols (not exported by the version script).
 */
#ifndef KVTIER_INT_H
#define KVTIER_INT_H

#include <stdint.h>

struct kvt_client;
struct kvt_buf;

/* BUF_REGISTER of kind KVT_BUF_CUDA_IPC; @ptr is what kvt_buf_ptr() returns. Returns 0, the
 * daemon's -errno (message in kvt_last_error()), -EPROTO, -ENOMEM, -ECONNRESET. */
int kvtc_buf_register_ipc(struct kvt_client *c, const uint8_t handle[64], const uint8_t uuid[16],
			  void *ptr, uint64_t size, struct kvt_buf **ret_buf);
/* EVENT_GET: the session's event handle on the device @uuid. Same errors. */
int kvtc_event_get(struct kvt_client *c, const uint8_t uuid[16], uint8_t ret_handle[64]);

#endif
