/* bench/benchlib.h: what the benchmark programs (bench/bench_*.c) share: a monotonic clock,
 * medians, and the random prompt tokens they feed an engine. Linked into every one of them
 * (bench/benchlib.c). Threads: any (no state here; a token stream's state is the caller's). */
#ifndef SPILLWAY_BENCH_BENCHLIB_H
#define SPILLWAY_BENCH_BENCHLIB_H

#include <stdint.h>

/* Seconds on CLOCK_MONOTONIC. */
double bench_now(void);

/* qsort comparator of doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);

/* The median of v[0..n) (n >= 1); sorts v in place. */
double bench_median(double *v, int n);

/* The next token of the xorshift64* stream *st (the caller's, seeded non-zero): an id in
 * [4, n_vocab - 4), clear of the first vocabulary entries, where the special tokens live. */
int32_t bench_rnd_tok(uint64_t *st, int n_vocab);

#endif
