/* engine/cpu/threadpool.h: a fixed pool of worker threads for data-parallel kernels. Internal.
 *
 * tpool_run(p, fn, arg) calls fn(arg, i, n) once for every i in [0, n) where n = tpool_size(p),
 * the calling thread acting as i = 0, and returns when all calls have returned. Part i > 0
 * normally runs on worker i, but the caller takes over any part whose worker has not started
 * it by the time the caller's own part is done (so a descheduled worker never stalls a job):
 * use i to pick the data and per-part scratch, not thread-local state. Workers spin a
 * short, bounded time after a job, then sleep on a futex/condvar, so a pool with more threads
 * than cores does not burn CPU between jobs. One tpool_run at a time per pool (the caller's
 * thread owns the pool). */
#ifndef SPILLWAY_ENGINE_CPU_THREADPOOL_H
#define SPILLWAY_ENGINE_CPU_THREADPOOL_H

#include <stddef.h>

typedef struct tpool tpool_t;
typedef void (*tpool_fn)(void *arg, int ith, int nth);

/* n_threads >= 1 (1 = run everything on the caller). NULL + errstr on failure. */
tpool_t *tpool_new(int n_threads, char *errstr, size_t errlen);
void tpool_free(tpool_t *p);
int tpool_size(const tpool_t *p);
void tpool_run(tpool_t *p, tpool_fn fn, void *arg);

/* Even split of [0, n) into nth parts: part ith is [*lo, *hi). */
static inline void tpool_split(long n, int ith, int nth, long *lo, long *hi)
{
    long q = n / nth, r = n % nth;
    *lo = ith * q + (ith < r ? ith : r);
    *hi = *lo + q + (ith < r ? 1 : 0);
}

#endif
