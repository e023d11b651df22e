/* SPDX-License-Identifier: MIT */
#include <errno.h>

#include "paris_zone.h"

int
kvt_paris_zone_check(const struct kvt_paris_zone_cfg *cfg)
{
	if (!cfg->update || (uint64_t)cfg->sink + cfg->local > UINT32_MAX)
		return -EINVAL;
	return 0;
}

static uint32_t
ret_len(const struct kvt_paris_zone_cfg *cfg, uint32_t prefill, uint32_t total)
{
	uint32_t base = cfg->sink + cfg->local;
	uint32_t t0 = prefill > base ? prefill : base;

	if (total < t0)
		return 0;
	/* t0 - base is the prefill's retrieval part (0 for a short prompt); then whole flushes */
	return (t0 - base) + cfg->update * ((total - t0) / cfg->update);
}

int
kvt_paris_zone_at(const struct kvt_paris_zone_cfg *cfg, uint32_t prefill, uint32_t total,
		  struct kvt_paris_zones *ret_z)
{
	struct kvt_paris_zones z;
	int r = kvt_paris_zone_check(cfg);

	if (r < 0)
		return r;
	if (total < prefill)
		return -EINVAL;
	z.total = total;
	z.sink_end = total < cfg->sink ? total : cfg->sink;
	z.ret_len = ret_len(cfg, prefill, total);
	z.dense_begin = z.sink_end + z.ret_len;
	z.buffered = 0;
	if (total - z.dense_begin > cfg->local)
		z.buffered = total - z.dense_begin - cfg->local;
	*ret_z = z;
	return 0;
}

int
kvt_paris_zone_of(const struct kvt_paris_zone_cfg *cfg, uint32_t prefill, uint32_t total,
		  uint32_t pos)
{
	struct kvt_paris_zones z;
	int r = kvt_paris_zone_at(cfg, prefill, total, &z);

	if (r < 0)
		return r;
	if (pos >= total)
		return -ERANGE;
	if (pos < z.sink_end)
		return KVT_PARIS_ZONE_SINK;
	if (pos < z.dense_begin)
		return KVT_PARIS_ZONE_RETRIEVAL;
	return KVT_PARIS_ZONE_DENSE;
}

int
kvt_paris_zone_flush(const struct kvt_paris_zone_cfg *cfg, uint32_t prefill, uint32_t total,
		     uint32_t encoded, uint32_t *ret_pos, uint32_t *ret_count)
{
	struct kvt_paris_zones z;
	int r = kvt_paris_zone_at(cfg, prefill, total, &z);

	if (r < 0)
		return r;
	if (encoded > z.ret_len)
		return -EINVAL;
	*ret_pos = cfg->sink + encoded;
	*ret_count = z.ret_len - encoded;
	return 0;
}

bool
kvt_paris_zone_dense_only(const struct kvt_paris_zone_cfg *cfg, uint32_t prefill, uint32_t total,
			  uint32_t k)
{
	struct kvt_paris_zones z;
	uint64_t need = (uint64_t)cfg->sink + cfg->local + 2ull * k;

	if (kvt_paris_zone_at(cfg, prefill, total, &z) < 0)
		return true;
	if (need < cfg->full_threshold)
		need = cfg->full_threshold;
	return total < need || z.ret_len == 0;
}
