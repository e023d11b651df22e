/* SPDX-License-Identifier: MIT */
/*
 * llm_pool.h - a fork-join pool of @n threads (the caller is thread 0) for the forward pass.
 *
 * llm_pool_run() runs fn(arg, t, n) on every thread t in [0, n) and returns when all are done.
 * Workers sleep on a condition variable between jobs rather than spin: the machines this runs on
 * are often shared, and a spinning worker would steal the core the caller needs.
 */
#ifndef KVT_LLM_POOL_H
#define KVT_LLM_POOL_H

#include <stdint.h>

struct llm_pool;

typedef void (*llm_job_fn)(void *arg, uint32_t t, uint32_t n);

/* Returns 0, -EINVAL (n == 0), -ENOMEM, or -errno from pthread_create. */
int llm_pool_create(uint32_t n, struct llm_pool **ret_pool);

/* Not reentrant: one job at a time, from the thread that created the pool. */
void llm_pool_run(struct llm_pool *p, llm_job_fn fn, void *arg);

/* Joins the workers. Accepts NULL. */
void llm_pool_free(struct llm_pool *p);

#endif /* KVT_LLM_POOL_H */
