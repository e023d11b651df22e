// SPDX-License-Identifier: MIT
// Candidate cut by votes (docs/retrieval.md 3.5) with the host's deterministic order: every key
// with more votes than the cut tau, plus the lowest-index keys voting exactly tau, in ascending
// index order. Five small launches: a 97-bin histogram, the cut, per-tile counts, a serial scan
// over tiles (n / 4096 of them), and an ordered emit with block scans.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kvt_kernels.h"
#include "kvt_kernels_int.cuh"

#define NBINS	97 // votes 0..96
#define TILE	4096
#define THREADS 256
#define PER	(TILE / THREADS)

struct sel_hdr {
	uint32_t hist[NBINS];
	uint32_t tau;
	uint32_t eq; // keys voting tau to take
};

// Scratch layout: sel_hdr | tile_gt[tiles] | tile_eq[tiles] | tile_off[tiles] | tile_eqq[tiles]
static inline uint32_t
tiles_of(uint32_t n)
{
	return (n + TILE - 1) / TILE;
}

extern "C" size_t
kvt_k_select_work_bytes(uint32_t n)
{
	return sizeof(struct sel_hdr) + (size_t)4 * tiles_of(n) * sizeof(uint32_t);
}

__global__ void
sel_clear(struct sel_hdr *h)
{
	for (uint32_t i = threadIdx.x; i < NBINS; i += blockDim.x)
		h->hist[i] = 0;
}

__global__ void
sel_hist(const uint8_t *__restrict__ votes, uint32_t n, struct sel_hdr *h)
{
	__shared__ uint32_t sh[NBINS];

	for (uint32_t i = threadIdx.x; i < NBINS; i += blockDim.x)
		sh[i] = 0;
	__syncthreads();
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
		atomicAdd(&sh[votes[i] < NBINS ? votes[i] : NBINS - 1], 1u);
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < NBINS; i += blockDim.x)
		if (sh[i])
			atomicAdd(&h->hist[i], sh[i]);
}

__global__ void
sel_cut(struct sel_hdr *h, uint32_t c)
{
	uint32_t cum = 0, tau = 0;

	for (int v = NBINS - 1; v >= 0; v--) {
		if (cum + h->hist[v] >= c) {
			tau = (uint32_t)v;
			break;
		}
		cum += h->hist[v];
	}
	h->tau = tau;
	h->eq = c - cum;
}

__global__ void
sel_count(const uint8_t *__restrict__ votes, uint32_t n, const struct sel_hdr *h, uint32_t *tile_gt,
	  uint32_t *tile_eq)
{
	typedef cub::BlockReduce<uint32_t, THREADS> Red;
	__shared__ typename Red::TempStorage t1, t2;
	uint32_t base = blockIdx.x * TILE, gt = 0, eq = 0, tau = h->tau;

	for (uint32_t i = base + threadIdx.x; i < base + TILE && i < n; i += THREADS) {
		gt += votes[i] > tau;
		eq += votes[i] == tau;
	}
	gt = Red(t1).Sum(gt);
	eq = Red(t2).Sum(eq);
	if (!threadIdx.x) {
		tile_gt[blockIdx.x] = gt;
		tile_eq[blockIdx.x] = eq;
	}
}

// Serial over tiles: at 1M keys that is 256 iterations, cheaper than another scan launch chain.
__global__ void
sel_scan(const struct sel_hdr *h, uint32_t tiles, const uint32_t *tile_gt, const uint32_t *tile_eq,
	 uint32_t *tile_off, uint32_t *tile_eqq)
{
	uint32_t off = 0, eq_left = h->eq;

	for (uint32_t t = 0; t < tiles; t++) {
		uint32_t take = tile_eq[t] < eq_left ? tile_eq[t] : eq_left;

		tile_off[t] = off;
		tile_eqq[t] = take;
		eq_left -= take;
		off += tile_gt[t] + take;
	}
}

// One block per tile; thread t owns keys [t*PER, t*PER+PER) of the tile, so a block-wide
// exclusive scan of per-thread counts gives each thread its output offset in index order.
__global__ void
sel_emit(const uint8_t *__restrict__ votes, uint32_t n, const struct sel_hdr *h,
	 const uint32_t *tile_off, const uint32_t *tile_eqq, uint32_t *cand)
{
	typedef cub::BlockScan<uint32_t, THREADS> Scan;
	__shared__ typename Scan::TempStorage s1, s2;
	uint32_t base = blockIdx.x * TILE + threadIdx.x * PER, tau = h->tau;
	uint32_t gt = 0, eq = 0, eq_before, out_before;
	uint8_t v[PER];

	for (uint32_t j = 0; j < PER; j++) {
		v[j] = base + j < n ? votes[base + j] : 0;
		gt += base + j < n && v[j] > tau;
		eq += base + j < n && v[j] == tau;
	}
	Scan(s1).ExclusiveSum(eq, eq_before);
	__syncthreads();
	{
		uint32_t quota = tile_eqq[blockIdx.x];
		uint32_t my_eq =
		    eq_before >= quota ? 0 : (quota - eq_before < eq ? quota - eq_before : eq);

		Scan(s2).ExclusiveSum(gt + my_eq, out_before);
		uint32_t o = tile_off[blockIdx.x] + out_before;

		for (uint32_t j = 0; j < PER && base + j < n; j++) {
			if (v[j] > tau) {
				cand[o++] = base + j;
			} else if (v[j] == tau && my_eq) {
				cand[o++] = base + j;
				my_eq--;
			}
		}
	}
}

extern "C" int
kvt_k_select(const uint8_t *d_votes, uint32_t n, uint32_t c, void *d_work, uint32_t *d_cand,
	     void *stream)
{
	cudaStream_t s = (cudaStream_t)stream;
	struct sel_hdr *h = (struct sel_hdr *)d_work;
	uint32_t tiles = tiles_of(n), hb;
	uint32_t *tile_gt = (uint32_t *)(h + 1), *tile_eq = tile_gt + tiles;
	uint32_t *tile_off = tile_eq + tiles, *tile_eqq = tile_off + tiles;

	if (!c || c >= n || !d_work)
		return -EINVAL;
	hb = (n + 1023) / 1024;
	hb = hb > 1024 ? 1024 : hb;
	sel_clear<<<1, 128, 0, s>>>(h);
	sel_hist<<<hb, 256, 0, s>>>(d_votes, n, h);
	sel_cut<<<1, 1, 0, s>>>(h, c);
	sel_count<<<tiles, THREADS, 0, s>>>(d_votes, n, h, tile_gt, tile_eq);
	sel_scan<<<1, 1, 0, s>>>(h, tiles, tile_gt, tile_eq, tile_off, tile_eqq);
	sel_emit<<<tiles, THREADS, 0, s>>>(d_votes, n, h, tile_off, tile_eqq, d_cand);
	return kvt_k_launch_status();
}
