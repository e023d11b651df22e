/* SPDX-License-Identifier: MIT */
/*
 * kvt_gpu_bench - the device-layer figures on a real GPU (run by tests/gpu/run.sh; prints, never
 * asserts on time):
 *   1. H2D bandwidth, pinned vs pageable source, 4 KiB .. 256 MiB (cudaMemcpyAsync, median of
 *      reps, events on the stream).
 *   2. 8192 scattered 256-byte rows from pinned host memory to the device, three ways: one
 *      cudaMemcpyAsync per row, one cudaMemcpyBatchAsync, one launch of the device layer's UVA
 *      row kernel (dev/rows.cu, loaded from the same embedded fatbin the daemon uses).
 *      Every method's result is checked byte for byte before its time is printed.
 * Exits 77 when there is no device.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rows.h"

#define CK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
				cudaGetErrorName(e_));                                             \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define NROWS 8192
#define ROWB  256
#define REPS  20

static int
cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

static float
median(float *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_float);
	return v[n / 2];
}

static void
bandwidth(cudaStream_t s)
{
	size_t max = 256u << 20;
	uint8_t *pinned, *pageable, *dev;
	cudaEvent_t a, b;

	CK(cudaMallocHost((void **)&pinned, max));
	pageable = malloc(max);
	if (!pageable)
		exit(1);
	memset(pinned, 1, max);
	memset(pageable, 2, max); /* faulted in: measure the copy, not first touch */
	CK(cudaMalloc((void **)&dev, max));
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	printf("\nH2D bandwidth (GB/s, median of %d)\n%12s %10s %10s\n", REPS, "bytes", "pinned",
	       "pageable");
	for (size_t n = 4096; n <= max; n *= 4) {
		float gbs[2];

		for (int k = 0; k < 2; k++) {
			float ms[REPS];
			const uint8_t *src = k ? pageable : pinned;

			CK(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, s)); /* warm */
			for (int r = 0; r < REPS; r++) {
				CK(cudaEventRecord(a, s));
				CK(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, s));
				CK(cudaEventRecord(b, s));
				CK(cudaEventSynchronize(b));
				CK(cudaEventElapsedTime(&ms[r], a, b));
			}
			gbs[k] = (float)n / (median(ms, REPS) * 1e6f);
		}
		printf("%12zu %10.2f %10.2f\n", n, gbs[0], gbs[1]);
	}
	CK(cudaEventDestroy(a));
	CK(cudaEventDestroy(b));
	CK(cudaFree(dev));
	CK(cudaFreeHost(pinned));
	free(pageable);
}

static void
check(const uint8_t *dev, const uint8_t *expect, size_t len, const char *what)
{
	uint8_t *got = malloc(len);

	if (!got)
		exit(1);
	CK(cudaMemcpy(got, dev, len, cudaMemcpyDeviceToHost));
	if (memcmp(got, expect, len)) {
		fprintf(stderr, "%s: device rows differ from the source rows\n", what);
		exit(1);
	}
	free(got);
}

static void
rows(cudaStream_t s)
{
	size_t host_len = (size_t)NROWS * 4 * ROWB, dev_len = (size_t)NROWS * ROWB;
	static void *dsts[NROWS];
	static const void *srcs[NROWS];
	static size_t sizes[NROWS];
	struct kvt_row_desc *desc, *desc_dev;
	uint8_t *host, *dev, *expect;
	struct cudaMemcpyAttributes attr;
	size_t attr_idx = 0;
	cudaLibrary_t lib;
	cudaKernel_t kern;
	cudaEvent_t a, b;
	float ms[3][REPS];
	const char *name[3] = {"cudaMemcpyAsync per row", "cudaMemcpyBatchAsync", "UVA row kernel"};
	unsigned n = NROWS;

	CK(cudaHostAlloc((void **)&host, host_len, cudaHostAllocPortable | cudaHostAllocMapped));
	CK(cudaHostAlloc((void **)&desc, NROWS * sizeof(*desc),
			 cudaHostAllocPortable | cudaHostAllocMapped));
	CK(cudaHostGetDevicePointer((void **)&desc_dev, desc, 0));
	CK(cudaMalloc((void **)&dev, dev_len));
	expect = malloc(dev_len);
	if (!expect)
		exit(1);
	for (size_t i = 0; i < host_len; i++)
		host[i] = (uint8_t)(i * 2654435761u >> 11);
	/* Row r of the device buffer comes from a scattered host row (a permutation of every
	 * fourth row slot), as FETCH stages pool slots. */
	for (unsigned r = 0; r < NROWS; r++) {
		unsigned h = (unsigned)((r * 2654435761u) % NROWS) * 4 + (r & 3);
		uint8_t *hd;

		CK(cudaHostGetDevicePointer((void **)&hd, host + (size_t)h * ROWB, 0));
		srcs[r] = host + (size_t)h * ROWB;
		dsts[r] = dev + (size_t)r * ROWB;
		sizes[r] = ROWB;
		desc[r] = (struct kvt_row_desc){.src = (uint64_t)(uintptr_t)hd,
						.dst = (uint64_t)(uintptr_t)dsts[r],
						.len = ROWB};
		memcpy(expect + (size_t)r * ROWB, srcs[r], ROWB);
	}
	memset(&attr, 0, sizeof(attr));
	attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	attr.srcLocHint.type = cudaMemLocationTypeHost;
	attr.dstLocHint.type = cudaMemLocationTypeDevice;
	CK(cudaGetDevice(&attr.dstLocHint.id));
	attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
	CK(cudaLibraryLoadData(&lib, kvt_rows_fatbin, NULL, NULL, 0, NULL, NULL, 0));
	CK(cudaLibraryGetKernel(&kern, lib, KVT_ROWS_KERNEL));
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	for (int m = 0; m < 3; m++) {
		for (int r = -1; r < REPS; r++) { /* r = -1: warm-up, then checked */
			CK(cudaMemsetAsync(dev, 0, dev_len, s));
			CK(cudaEventRecord(a, s));
			if (m == 0) {
				for (unsigned i = 0; i < NROWS; i++)
					CK(cudaMemcpyAsync(dsts[i], srcs[i], ROWB,
							   cudaMemcpyHostToDevice, s));
			} else if (m == 1) {
				CK(cudaMemcpyBatchAsync(dsts, srcs, sizes, NROWS, &attr, &attr_idx,
							1, s));
			} else {
				void *args[] = {&desc_dev, &n};

				CK(cudaLaunchKernel((const void *)kern, (dim3){1024, 1, 1},
						    (dim3){256, 1, 1}, args, 0, s));
			}
			CK(cudaEventRecord(b, s));
			CK(cudaEventSynchronize(b));
			if (r < 0)
				check(dev, expect, dev_len, name[m]);
			else
				CK(cudaEventElapsedTime(&ms[m][r], a, b));
		}
	}
	printf("\n%d scattered %d-byte rows, pinned host -> device (median of %d, checked)\n",
	       NROWS, ROWB, REPS);
	for (int m = 0; m < 3; m++) {
		float t = median(ms[m], REPS);

		printf("%-26s %9.1f us %8.2f GB/s\n", name[m], t * 1e3f,
		       (float)dev_len / (t * 1e6f));
	}
	CK(cudaLibraryUnload(lib));
	CK(cudaEventDestroy(a));
	CK(cudaEventDestroy(b));
	CK(cudaFree(dev));
	CK(cudaFreeHost(host));
	CK(cudaFreeHost(desc));
	free(expect);
}

int
main(void)
{
	struct cudaDeviceProp prop;
	cudaStream_t s;
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("kvt_gpu_bench: no CUDA device\n");
		return 77;
	}
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("kvt_gpu_bench on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
	/* Batch copies refuse the legacy default stream. */
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	bandwidth(s);
	rows(s);
	CK(cudaStreamDestroy(s));
	return 0;
}
