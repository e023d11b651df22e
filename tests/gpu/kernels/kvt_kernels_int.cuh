// SPDX-License-Identifier: MIT
// Shared helpers of the kernel files: launch-error mapping.
#ifndef KVT_KERNELS_INT_CUH
#define KVT_KERNELS_INT_CUH

#include <cerrno>
#include <cuda_runtime.h>

// Launch errors are reported as -EIO; the error stays readable through cudaGetLastError()...
// except that reading it here clears it, so we peek instead and leave it for the caller.
static inline int
kvt_k_launch_status(void)
{
	return cudaPeekAtLastError() == cudaSuccess ? 0 : -EIO;
}

#endif
