/* SPDX-License-Identifier: MIT */
/*
 * thp.h - memory the way kvtierd's pool backs rows and index pages: one 2 MiB-aligned anonymous
 * mapping advised MADV_HUGEPAGE (part of kvt_bench_common).
 */
#ifndef KVT_BENCH_THP_H
#define KVT_BENCH_THP_H

#include <stddef.h>

/*
 * bench_thp_map() - @size bytes rounded up to 2 MiB (*@ret_len), 2 MiB aligned, advised for
 * transparent huge pages (a hint: 4 KiB pages where the kernel has none), not yet touched.
 * Returns the mapping, or NULL (errno set). Give it back with munmap(p, *ret_len).
 */
void *bench_thp_map(size_t size, size_t *ret_len);

#endif /* KVT_BENCH_THP_H */
