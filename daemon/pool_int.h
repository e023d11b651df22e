/* SPDX-License-Identifier: MIT */
/*
 * pool_int.h - what the pool files share, not for use outside them (pool.h is the pool's face):
 *   pool_region.c  the mapped region: refusals before mapping, the memfd, NUMA binding, first
 *                  touch, mlock, device registration, the adopted pool's populate thread, teardown
 *   pool.c         the slab allocator inside it: chunks, size classes, slots, the quarantine of
 *                  slots a device copy may still use, accounts, restart claims
 *
 * The region calls the allocator twice: once its bytes are mapped, locked and registered
 * (pool_slab_init()), and before they are unregistered and unmapped (pool_slab_fini()).
 */
#ifndef KVTD_POOL_INT_H
#define KVTD_POOL_INT_H

#include "pool.h"

/*
 * pool_slab_init() - the chunk metadata of pool->n_chunks chunks of pool->chunk_size bytes,
 * every chunk free. Called once, with the region mapped and no allocation yet.
 * Returns 0 or -ENOMEM (nothing allocated).
 */
int pool_slab_init(struct kvtd_pool *pool);

/*
 * pool_slab_fini() - waits for the device copies the quarantined slots were freed under, then
 * frees the allocator's metadata (chunks, quarantine, restart claims). Called with the region
 * still mapped and registered: no copy reads or writes it after this returns.
 */
void pool_slab_fini(struct kvtd_pool *pool);

#endif
