/* SPDX-License-Identifier: MIT */
#include "opstats.h"

void
kvtd_op_stats_fold(struct kvtd_op_stats *dst, const struct kvtd_op_stats *src)
{
	for (unsigned o = 0; o < KVTD_OP_SLOTS; o++) {
		dst->count[o] += src->count[o];
		dst->errors[o] += src->errors[o];
		dst->timed[o] += src->timed[o];
		dst->sum_ns[o] += src->sum_ns[o];
		for (unsigned b = 0; b <= KVTD_LAT_BUCKETS; b++)
			dst->bucket[o][b] += src->bucket[o][b];
		dst->bytes_in[o] += src->bytes_in[o];
		dst->bytes_out[o] += src->bytes_out[o];
	}
	for (unsigned f = 0; f < KVTD_FLOW__COUNT; f++)
		dst->flow_bytes[f] += src->flow_bytes[f];
}
