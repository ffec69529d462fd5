/* bench/membw.c: see membw.h. */
#include "bench/membw.h"

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

typedef struct {
    const uint64_t *buf;
    size_t n; /* words, a multiple of 64 */
    atomic_ullong sink;
} bw_job_t;

/* Sums this thread's share of the 512-byte steps, eight independent chains. */
static void bw_fn(void *arg, int ith, int nth)
{
    bw_job_t *j = arg;
    long lo, hi;
    tpool_split((long)(j->n / 64), ith, nth, &lo, &hi);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (long b = lo; b < hi; b++) {
        const uint64_t *p = j->buf + b * 64;
        for (int i = 0; i < 64; i += 8) {
            s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3];
            s4 += p[i + 4]; s5 += p[i + 5]; s6 += p[i + 6]; s7 += p[i + 7];
        }
    }
    atomic_fetch_add(&j->sink, s0 ^ s1 ^ s2 ^ s3 ^ s4 ^ s5 ^ s6 ^ s7);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double membw_read(tpool_t *pool, const void *buf, size_t bytes, int reps)
{
    bw_job_t j = {.buf = buf, .n = bytes / 512 * 64};
    atomic_init(&j.sink, 0);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        tpool_run(pool, bw_fn, &j);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    return (double)(j.n * 8) / best / 1e9;
}
