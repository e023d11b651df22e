/* SPDX-License-Identifier: MIT */
/*
 * kvtier_cuda.c - libkvtier's CUDA pieces: share cudaMalloc memory with kvtierd through a CUDA
 * IPC handle, and open the session's interprocess event. Built with the CUDA runtime when
 * libkvtier is built with CUDA (KVT_CLIENT_CUDA); without it both calls answer -EOPNOTSUPP, so
 * a host-only libkvtier has the same symbols and programs link either way.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "kvtier.h"
#include "kvtier_int.h"

#define KVT_EXPORT __attribute__((visibility("default")))

#ifdef KVT_CLIENT_CUDA
#include <cuda.h> /* CUresult/CUdeviceptr for the driver entry point below; nothing linked */
#include <cuda_runtime_api.h>

static int
cuda_errno(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidResourceHandle:
		return -EINVAL;
	case cudaErrorInvalidDevice:
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
		return -ENODEV;
	case cudaErrorNotSupported:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

/* Where the allocation holding @p starts and how long it is (cuMemGetAddressRange, reached
 * through the runtime so that libkvtier does not link libcuda). */
static int
alloc_range(const void *p, uintptr_t *ret_base, size_t *ret_size)
{
	typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
	enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	CUdeviceptr base;
	void *fn = NULL;
	int r;

	r = cuda_errno(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
							cudaEnableDefault, &q));
	if (r < 0)
		return r;
	if (q != cudaDriverEntryPointSuccess || !fn)
		return -EOPNOTSUPP;
	if (((range_fn)fn)(&base, ret_size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
		return -EINVAL;
	*ret_base = (uintptr_t)base;
	return 0;
}

KVT_EXPORT int
kvt_buf_register_cuda(struct kvt_client *c, void *dev_ptr, uint64_t size, struct kvt_buf **ret_buf)
{
	struct cudaPointerAttributes a;
	struct cudaDeviceProp prop;
	cudaIpcMemHandle_t h;
	uintptr_t base;
	size_t alloc;
	int r;

	if (!dev_ptr || !size)
		return -EINVAL;
	r = cuda_errno(cudaPointerGetAttributes(&a, dev_ptr));
	if (r < 0)
		return r;
	if (a.type != cudaMemoryTypeDevice)
		return -EINVAL;
	/* The daemon maps the whole allocation and addresses it from its start. */
	r = alloc_range(dev_ptr, &base, &alloc);
	if (r < 0)
		return r;
	if (base != (uintptr_t)dev_ptr || size > alloc)
		return -EINVAL;
	r = cuda_errno(cudaGetDeviceProperties(&prop, a.device));
	if (r == 0)
		r = cuda_errno(cudaIpcGetMemHandle(&h, dev_ptr));
	if (r < 0)
		return r;
	return kvtc_buf_register_ipc(c, (const uint8_t *)h.reserved,
				     (const uint8_t *)prop.uuid.bytes, dev_ptr, size, ret_buf);
}

KVT_EXPORT int
kvt_event_get_cuda(struct kvt_client *c, int device, void **ret_event)
{
	struct cudaDeviceProp prop;
	cudaIpcEventHandle_t h;
	cudaEvent_t ev;
	int r;

	r = cuda_errno(cudaGetDeviceProperties(&prop, device));
	if (r == 0)
		r = kvtc_event_get(c, (const uint8_t *)prop.uuid.bytes, (uint8_t *)h.reserved);
	if (r == 0)
		r = cuda_errno(cudaIpcOpenEventHandle(&ev, h));
	if (r < 0)
		return r;
	*ret_event = ev;
	return 0;
}

#else /* !KVT_CLIENT_CUDA */

KVT_EXPORT int
kvt_buf_register_cuda(struct kvt_client *c, void *dev_ptr, uint64_t size, struct kvt_buf **ret_buf)
{
	return -EOPNOTSUPP;
}

KVT_EXPORT int
kvt_event_get_cuda(struct kvt_client *c, int device, void **ret_event)
{
	return -EOPNOTSUPP;
}

#endif
