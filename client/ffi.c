/* SPDX-License-Identifier: MIT */
/*
 * ffi.c - libkvtier's out-of-line copies of kvtier.h's static inline prep helpers, exported under
 * their own names, for callers that cannot inline C (the Python package's ctypes layer), as
 * liburing-ffi exports liburing's. The bodies are kvtier.h's: nothing here to keep in step.
 */
#define KVT_INLINE __attribute__((visibility("default")))
#include "kvtier.h"
