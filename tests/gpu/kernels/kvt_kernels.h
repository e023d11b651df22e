/* SPDX-License-Identifier: MIT */
/*
 * kvt_kernels.h - C launchers of device kernels for ParisKV retrieval: a prototype of retrieval
 * on the device, not part of the product (the daemon's TOPK runs the CPU engine). They live with
 * the GPU tests, which check them against the CPU engine (check_gpu_retrieval).
 *
 * No CUDA types: streams are passed as opaque `void *stream` (a cudaStream_t, NULL for the
 * legacy default stream). Every pointer named d_* is device memory (or host memory mapped
 * through UVA where stated). Launchers only enqueue work: they return 0 once the kernels are
 * queued, or -EINVAL for bad arguments (nothing queued), -EIO when the launch failed (the CUDA
 * error is left for the device layer's wrapper to log via cudaGetLastError()). Launchers keep
 * no state, so any thread may call them; work on one stream runs in order.
 *
 * Data layouts are those of engine/paris.h, so a page built on the host can be copied
 * to the device unchanged: centroid ids [B][P] per page, codes [P][4B], weights [P][B] f32.
 * The device kernels see one contiguous "page" holding all N keys (P = the allocated stride).
 */
#ifndef KVT_KERNELS_H
#define KVT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * kvt_k_votes - cnt_i = sum_b tab[b][cid[b * cid_stride + i]] for i < n (collision votes).
 * @d_cid: centroid ids, block b of key i at d_cid[b * cid_stride + i].
 * @nblk: 8 or 16. @d_tab: [nblk][256] vote bytes (0..6) from kvt_paris_vote_tables().
 * @d_votes: n bytes out.
 */
int kvt_k_votes(const uint8_t *d_cid, uint32_t n, size_t cid_stride, uint32_t nblk,
		const uint8_t *d_tab, uint8_t *d_votes, void *stream);

/*
 * kvt_k_select_work_bytes - bytes of device scratch kvt_k_select() needs for @n keys.
 */
size_t kvt_k_select_work_bytes(uint32_t n);

/*
 * kvt_k_select - the @c keys with the most votes, in ascending index order, ties at the cut to
 * the lower indices: the same list as kvt_paris_select() on the host. Requires 1 <= c < n.
 * @d_work: kvt_k_select_work_bytes(n) bytes of device scratch (not zeroed by the caller).
 * @d_cand: c u32 out.
 */
int kvt_k_select(const uint8_t *d_votes, uint32_t n, uint32_t c, void *d_work, uint32_t *d_cand,
		 void *stream);

/*
 * kvt_k_rerank - RSQ-IP scores s_i = qnorm * sum_b w_b sum_j y_j (2 sigma_j - 1) a[t_j] (f32).
 * @d_code: [*][4 nblk] code bytes; @d_w: [*][nblk] f32 weights, indexed by key.
 * @d_cand: nc key indices. @d_qy: dim = 8 nblk floats, the rotated unit query; @qnorm: |q|.
 * @d_score: nc f32 out.
 */
int kvt_k_rerank(const uint8_t *d_code, const float *d_w, uint32_t nblk, const uint32_t *d_cand,
		 uint32_t nc, const float *d_qy, float qnorm, float *d_score, void *stream);

/*
 * kvt_k_topk - the @k best (score desc, index asc) of @n (d_idx[i], d_score[i]) pairs, sorted,
 * in one thread block. 1 <= k <= 1024, k <= n. When several scores equal the k-th exactly,
 * which of them are kept may vary between runs; the output order is always sorted.
 * @d_ret_idx, @d_ret_score: k entries out.
 */
int kvt_k_topk(const uint32_t *d_idx, const float *d_score, uint32_t n, uint32_t k,
	       uint32_t *d_ret_idx, float *d_ret_score, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVT_KERNELS_H */
