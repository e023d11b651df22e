/* SPDX-License-Identifier: MIT */
/*
 * opstats.h - per-opcode counters and latency histograms.
 *
 * Each session keeps its own struct kvtd_op_stats, written by its poller with the poller lock
 * held (kvtd_op_run), so the hot path writes no cache line another thread writes. The main
 * thread reads a session's under the same lock for /metrics and folds it into the daemon's
 * ended-sessions total when the session ends (listen.c), as it does for the ops/errors counters.
 *
 * count and errors count every op. The latency histogram (timed, sum_ns, bucket) holds the
 * ops that were timed: a clock read costs about as much as a NOP, so a session alone on its
 * poller times a uniformly random 1 in KVTD_OP_TIME_SAMPLE of its ops, and a session that shares
 * its poller times every op (its time slice reads the clock after each op anyway). Either way
 * the histogram is an unbiased sample of each opcode's latency; timed <= count.
 *
 * Buckets are powers of two of microseconds: bucket i counts ops that took at most 2^i us
 * (i = 0 .. KVTD_LAT_BUCKETS - 1, 1 us to about 8.4 s), the last one everything slower. The
 * index is a count-leading-zeros, so adding a sample is a few instructions.
 */
#ifndef KVTD_OPSTATS_H
#define KVTD_OPSTATS_H

#include <stdint.h>

#include "kvt_abi.h"

#define KVTD_LAT_BUCKETS    24
#define KVTD_OP_TIME_SAMPLE 64 /* a power of two: alone on a poller, 1 op in 64 is timed */

/* Where row bytes move (kvtier_tier_bytes_total{from, to}): the client's rows (arena or T0
 * region) into T1; T1 rows quantized into T2 (the int8 bytes written); T1 and T2 rows copied to
 * the device (T0 promotions, staging; T2 rows dequantized, counted at full width). */
enum {
	KVTD_FLOW_CLIENT_T1,
	KVTD_FLOW_T1_T2,
	KVTD_FLOW_T1_DEVICE,
	KVTD_FLOW_T2_DEVICE,
	KVTD_FLOW__COUNT
};
#define KVTD_OP_SLOTS (KVT_OP__COUNT + 1) /* the last one: opcodes outside the table */

struct kvtd_op_stats {
	uint64_t count[KVTD_OP_SLOTS];
	uint64_t errors[KVTD_OP_SLOTS];
	uint64_t timed[KVTD_OP_SLOTS]; /* ops in the histogram: sum_ns and bucket */
	uint64_t sum_ns[KVTD_OP_SLOTS];
	uint64_t bucket[KVTD_OP_SLOTS][KVTD_LAT_BUCKETS + 1]; /* not cumulative */
	uint64_t bytes_in[KVTD_OP_SLOTS];  /* rows the op copied into the pool (APPEND) */
	uint64_t bytes_out[KVTD_OP_SLOTS]; /* rows it copied out: RETIER promotions to T0,
					    * FETCH and TOPK rows to the staging buffer */
	uint64_t flow_bytes[KVTD_FLOW__COUNT];
};

/* The bucket of a duration: the smallest i with @ns <= 2^i us, KVTD_LAT_BUCKETS past the last. */
static inline unsigned
kvtd_lat_bucket(uint64_t ns)
{
	uint64_t us = ns / 1000 + (ns % 1000 != 0);
	unsigned i;

	if (us <= 1)
		return 0;
	i = 64 - (unsigned)__builtin_clzll(us - 1); /* ceil(log2(us)) */
	return i < KVTD_LAT_BUCKETS ? i : KVTD_LAT_BUCKETS;
}

static inline unsigned
kvtd_op_slot(unsigned opcode)
{
	return opcode < KVT_OP__COUNT ? opcode : KVT_OP__COUNT;
}

/* One op of @opcode (any value: outside the table counts as "unknown") that ended with @res. */
static inline void
kvtd_op_stats_add(struct kvtd_op_stats *st, unsigned opcode, int res)
{
	unsigned o = kvtd_op_slot(opcode);

	st->count[o]++;
	if (res < 0)
		st->errors[o]++;
}

/* A timed op of @opcode (already counted by kvtd_op_stats_add()) took @ns. */
static inline void
kvtd_op_stats_time(struct kvtd_op_stats *st, unsigned opcode, uint64_t ns)
{
	unsigned o = kvtd_op_slot(opcode);

	st->timed[o]++;
	st->sum_ns[o] += ns;
	st->bucket[o][kvtd_lat_bucket(ns)]++;
}

/* @dst += @src, every field. */
void kvtd_op_stats_fold(struct kvtd_op_stats *dst, const struct kvtd_op_stats *src);

#endif
