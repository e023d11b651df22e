/* SPDX-License-Identifier: MIT */
/*
 * kvtier_int.h - private to libkvtier: what kvtier.c and kvtier_cuda.c share, so that kvtier.c
 * stays free of CUDA. Hidden symbols (not exported by the version script).
 */
#ifndef KVTIER_INT_H
#define KVTIER_INT_H

#include <stdint.h>

struct kvt_client;
struct kvt_buf;

/* BUF_REGISTER of kind KVT_BUF_CUDA_IPC. @handle names a whole allocation; the buffer is its
 * @size bytes from @offset on (the daemon is told offset + size and addresses the allocation
 * from its start; kvt_seq_open() adds @offset to layouts in the buffer). @ptr is what
 * kvt_buf_ptr() returns. @mem, when not NULL, is device memory libkvtier allocated: it is
 * handed to kvtc_cuda_mem_free() when the buffer goes. Returns 0, the daemon's -errno (message
 * in kvt_last_error()), -EPROTO, -ENOMEM, -ECONNRESET; on failure @mem is still the caller's. */
int kvtc_buf_register_ipc(struct kvt_client *c, const uint8_t handle[64], const uint8_t uuid[16],
			  void *ptr, uint64_t offset, uint64_t size, void *mem,
			  struct kvt_buf **ret_buf);
/* EVENT_GET: the session's event handle on the device @uuid. Same errors. */
int kvtc_event_get(struct kvt_client *c, const uint8_t uuid[16], uint8_t ret_handle[64]);

/* Sets this thread's kvt_last_error() text. */
void kvtc_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* kvtier_cuda.c's per-session slot in the client (NULL until it stores something there). */
void **kvtc_cuda_state(struct kvt_client *c);

/* kvtier_cuda.c: frees what kvt_buf_alloc_cuda() allocated (NULL is fine: 0), returning 0 or
 * the driver's failure as -errno (kvt_last_error() says which); releases what a session kept
 * in its slot (NULL is fine). */
int kvtc_cuda_mem_free(void *mem);
void kvtc_cuda_fini(void *state);

#endif
