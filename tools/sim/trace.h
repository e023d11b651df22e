/* SPDX-License-Identifier: MIT */
/*
 * trace.h - the synthetic decode kvtier-sim replays. Not a model: a generator whose attention
 * behaves the way reasoning traces do for tiering purposes.
 *
 * There are T "topics", each a random unit direction per (layer, kv head). Token t's key is its
 * topic's direction scaled by a strength, plus Gaussian noise; tokens come in runs of one topic
 * (a "thought"). The query at step t points at one topic: with probability p_revisit a topic
 * chosen uniformly from all topics seen so far (an unpredictable return to an old thought), else
 * the current one. Keys of the queried topic then carry most of the softmax mass, wherever they
 * sit in the sequence. Values are Gaussian. Everything is reproducible from the seed.
 */
#ifndef KVT_SIM_TRACE_H
#define KVT_SIM_TRACE_H

#include <stdint.h>

struct sim_trace {
	uint32_t layers, kv_heads, head_dim;
	uint32_t topics, run_len;
	float strength, noise, p_revisit;
	uint64_t rng;
	float *dirs;	    /* [topics][layers][kv_heads][head_dim] */
	uint32_t cur_topic; /* topic of the current run */
	uint32_t max_topic; /* topics seen so far: 0..max_topic */
	uint64_t t;	    /* tokens generated */
};

int sim_trace_init(struct sim_trace *tr, uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
		   uint64_t seed);
void sim_trace_fini(struct sim_trace *tr);
/* Next token's rows, f32, laid out [layer][K,V][kv_head][head_dim]. */
void sim_trace_token(struct sim_trace *tr, float *rows);
/* The query of the current step: [layer][kv_head][head_dim] (one query head per kv head). */
void sim_trace_query(struct sim_trace *tr, float *q);

#endif
