/* SPDX-License-Identifier: MIT */
/*
 * cuda_shim.h - control interface of libkvt_cudashim, a FAULT-INJECTING FAKE CUDA RUNTIME FOR
 * TESTS ONLY. It is never installed and never used outside tests/cuda-shim/.
 *
 * The shim exports the subset of the CUDA runtime API that dev/dev_cuda.c and
 * client/kvtier_cuda.c call, with the real signatures (it is compiled against the toolkit's
 * cuda_runtime_api.h). It emulates devices in host memory:
 * - "device memory" (cudaMalloc) is a shared memfd mapping; its IPC handle names the owner's
 *   pid and fd, and cudaIpcOpenMemHandle in another process maps /proc/<pid>/fd/<fd>, so two
 *   processes really share the bytes;
 * - copies and kernel launches are queued (one FIFO per process) and run later, by the shim's
 *   device thread or at the first stream or event synchronization that needs them: work is
 *   asynchronous, and an event is complete only once the work before its record has run
 *   (cudaEventQuery says cudaErrorNotReady until then). Event state lives in a shared table,
 *   so a process that opened another's event handle waits for that process's work;
 * - the one kernel it knows, kvt_rows_copy from dev/rows.cu (found through
 *   cudaLibraryGetKernel), is run on the host from its descriptors, read when it runs;
 * - releasing memory a queued copy still uses (cudaIpcCloseMemHandle, cudaHostUnregister,
 *   cudaFreeHost) is counted as a hazard (kvt_shim_hazards()).
 * It records every call in order and can fail the k-th call of a chosen function.
 *
 * It also exports the CUDA driver entry points libkvtier uses (cuInit, cuMemAlloc_v2,
 * cuMemGetAddressRange_v2, cuIpcGetMemHandle, cuIpcOpenEventHandle, cuStreamWaitEvent, ...),
 * under the versioned names the real libcuda.so.1 exports, over the same emulated objects:
 * libkvtier loads them through KVTIER_LIBCUDA=<path of this library>. See the driver section
 * of cuda_shim.c for what is modelled (contexts, the plural pointer query, streams).
 *
 * Environment (read at load): KVT_SHIM_DEVICES=n (default 1; 0 = no device), KVT_SHIM_DELAY_MS=n
 * (a slow device: the device thread runs queued work no sooner than n ms after it was queued;
 * synchronizations still run it at once),
 * KVT_SHIM_FAIL="fn:k:err[,fn:k:err...]" (fail the k-th call of fn, counted from load, with
 * cudaError_t err), KVT_SHIM_LOG=path (also append every call, one line each, to that file:
 * how a test reads the calls of another process such as kvtierd).
 *
 * Thread safety: all functions take one lock.
 */
#ifndef KVT_CUDA_SHIM_H
#define KVT_CUDA_SHIM_H

/* Forget the call log, counters and armed failures; @devices devices from now on. */
void kvt_shim_reset(int devices);
/* Fail the @k-th call (1 = the next one) of @fn from now with cudaError_t @err. */
void kvt_shim_fail(const char *fn, unsigned k, int err);
/* Calls of @fn since the last reset (failed ones included). */
unsigned kvt_shim_count(const char *fn);
/* The log since the last reset: one line per call, "fn args[ -> errname]", NUL-terminated.
 * Valid until the next shim call. */
const char *kvt_shim_log(void);
/* Live emulated objects: IPC mappings open, host ranges registered, host allocations. */
unsigned kvt_shim_ipc_open(void);
unsigned kvt_shim_registered(void);
/* The id "pid.serial" of an event (the creating process and its serial there): 0, or -1 when
 * @ev is not an event of the shim. */
int kvt_shim_event_id(void *ev, int *ret_pid, unsigned long long *ret_serial);
/* Stop (1) or let (0) the device thread run queued work. Held work still runs at a stream or
 * event synchronization that needs it; cudaEventQuery and cuStreamWaitEvent from another
 * process see it incomplete until then. */
void kvt_shim_hold(int on);
/* Copies and launches queued and not yet run. */
unsigned kvt_shim_queued(void);
/* Run everything queued now, held or not. */
void kvt_shim_run(void);
/* Memory released while a queued copy still used it, since the last reset. */
unsigned kvt_shim_hazards(void);
/* Driver contexts pushed on the calling thread's stack. */
unsigned kvt_shim_ctx_depth(void);

#endif /* KVT_CUDA_SHIM_H */
