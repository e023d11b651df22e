/* SPDX-License-Identifier: MIT */
#include <stdint.h>
#include <sys/mman.h>

#include "thp.h"

void *
bench_thp_map(size_t size, size_t *ret_len)
{
	const size_t huge = 2u << 20;
	size_t len = (size + huge - 1) & ~(huge - 1);
	uint8_t *m = mmap(NULL, len + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			  0),
		*p;

	if (m == MAP_FAILED)
		return NULL;
	/* keep the 2 MiB-aligned part only, so every huge page can be one */
	p = (uint8_t *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1));
	if (p > m)
		munmap(m, (size_t)(p - m));
	munmap(p + len, (size_t)(m + huge - p));
	(void)madvise(p, len, MADV_HUGEPAGE);
	*ret_len = len;
	return p;
}
