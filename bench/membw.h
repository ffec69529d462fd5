/* bench/membw.h: the memory read bandwidth the benchmarks measure (bench_kernels' ceiling and
 * bench_engine's figure next to batch-1 decode): every thread of a pool sums its share of a
 * buffer larger than any cache. */
#ifndef SPILLWAY_BENCH_MEMBW_H
#define SPILLWAY_BENCH_MEMBW_H

#include <stddef.h>

#include "engine/cpu/threadpool.h"

/* GB/s (1e9 bytes per second) reading `bytes` (a multiple of 512) of buf over pool's threads, the
 * best of `reps` passes. */
double membw_read(tpool_t *pool, const void *buf, size_t bytes, int reps);

#endif
