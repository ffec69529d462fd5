/* engine/cpu/threadpool.c: fixed pool of worker threads (see threadpool.h).
 *
 * Protocol. The caller publishes (fn, arg), sets `pending` to n-1 and bumps the generation
 * counter `gen`; each worker waits for `gen` to move past the value it last saw, runs
 * fn(arg, ith, n) and decrements `pending`; the caller runs part 0 and waits for `pending` to
 * reach 0. Both waits spin for a bounded time (pause instruction, sched_yield every few
 * hundred spins so an oversubscribed pool hands the core over) and then sleep on a futex.
 * Sleepers announce themselves in `sleepers` / `caller_sleeping` before the futex wait; the
 * waker checks those after its own store. Every such pair is seq_cst, so either the waker sees
 * the sleeper or the sleeper's futex_wait sees the new value (futex_wait re-checks the word).
 *
 * Memory ordering: fn/arg are written before the release store of `gen` and read after the
 * acquire load that saw it; each worker's writes inside fn happen before its release decrement
 * of `pending`, which the caller reads with acquire. */
#include "engine/cpu/threadpool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a waiter spins before it sleeps, and how often a spinning waiter yields. */
#define TPOOL_SPIN_NS 200000L
#define TPOOL_YIELD_EVERY 256
#define TPOOL_CLOCK_EVERY 64

#define CACHELINE 64

struct worker {
    tpool_t *pool;
    int ith;
    pthread_t tid;
};

struct tpool {
    /* Written by the caller; read by the workers. */
    _Alignas(CACHELINE) atomic_uint gen; /* futex word: job generation */
    atomic_int stop;
    tpool_fn fn;
    void *arg;
    /* Counters the workers write; kept off the caller's line. */
    _Alignas(CACHELINE) atomic_uint pending; /* futex word: workers still running this job */
    atomic_int sleepers;        /* workers in (or about to enter) futex_wait on gen */
    atomic_int caller_sleeping; /* caller in (or about to enter) futex_wait on pending */
    _Alignas(CACHELINE) int n;
    int n_started;
    struct worker *workers; /* [n] (index 0 unused: the caller) */
};

static void futex_wait(atomic_uint *addr, unsigned val)
{
    /* EAGAIN (value changed), EINTR and spurious wake-ups all return to the caller's loop. */
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(atomic_uint *addr)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Spins until *addr != val or the spin budget is spent. Returns 1 when it changed. */
static int spin_while_equal(atomic_uint *addr, unsigned val)
{
    long t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != val) return 1;
        cpu_relax();
        if (i % TPOOL_YIELD_EVERY == 0) sched_yield();
        if (i % TPOOL_CLOCK_EVERY == 0) {
            long t = now_ns();
            if (t0 == 0)
                t0 = t;
            else if (t - t0 > TPOOL_SPIN_NS)
                return 0;
        }
    }
}

static void *worker_main(void *p)
{
    struct worker *w = p;
    tpool_t *pool = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        if (!spin_while_equal(&pool->gen, seen)) {
            atomic_fetch_add(&pool->sleepers, 1);
            while ((g = atomic_load(&pool->gen)) == seen) futex_wait(&pool->gen, seen);
            atomic_fetch_sub(&pool->sleepers, 1);
        }
        g = atomic_load_explicit(&pool->gen, memory_order_acquire);
        seen = g;
        if (atomic_load_explicit(&pool->stop, memory_order_relaxed)) break;
        pool->fn(pool->arg, w->ith, pool->n);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1 &&
            atomic_load(&pool->caller_sleeping))
            futex_wake_all(&pool->pending);
    }
    return NULL;
}

/* Publishes the current fn/arg (or stop) to the workers. */
static void publish(tpool_t *p)
{
    atomic_store_explicit(&p->pending, (unsigned)(p->n_started), memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: orders against the sleepers load */
    if (atomic_load(&p->sleepers) > 0) futex_wake_all(&p->gen);
}

static void wait_workers(tpool_t *p)
{
    for (;;) {
        unsigned left = atomic_load_explicit(&p->pending, memory_order_acquire);
        if (left == 0) return;
        if (!spin_while_equal(&p->pending, left)) {
            atomic_store(&p->caller_sleeping, 1);
            while ((left = atomic_load(&p->pending)) != 0) futex_wait(&p->pending, left);
            atomic_store(&p->caller_sleeping, 0);
            atomic_thread_fence(memory_order_acquire);
            return;
        }
    }
}

tpool_t *tpool_new(int n_threads, char *errstr, size_t errlen)
{
    tpool_t *p = NULL;
    if (n_threads < 1 || n_threads > 1024) {
        snprintf(errstr, errlen, "tpool: bad thread count %d", n_threads);
        return NULL;
    }
    p = aligned_alloc(CACHELINE, (sizeof *p + CACHELINE - 1) / CACHELINE * CACHELINE);
    if (!p) goto oom;
    memset(p, 0, sizeof *p);
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_sleeping, 0);
    p->n = n_threads;
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) goto oom;
    for (int i = 1; i < n_threads; i++) {
        struct worker *w = &p->workers[i];
        w->pool = p;
        w->ith = i;
        int rc = pthread_create(&w->tid, NULL, worker_main, w);
        if (rc != 0) {
            snprintf(errstr, errlen, "tpool: pthread_create: %s", strerror(rc));
            goto fail;
        }
        p->n_started = i;
    }
    return p;
oom:
    snprintf(errstr, errlen, "tpool: out of memory");
fail:
    tpool_free(p);
    return NULL;
}

void tpool_free(tpool_t *p)
{
    if (!p) return;
    if (p->n_started > 0) {
        atomic_store(&p->stop, 1);
        publish(p);
        for (int i = 1; i <= p->n_started; i++) pthread_join(p->workers[i].tid, NULL);
    }
    free(p->workers);
    free(p);
}

int tpool_size(const tpool_t *p)
{
    return p->n;
}

void tpool_run(tpool_t *p, tpool_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    publish(p);
    fn(arg, 0, p->n);
    wait_workers(p);
}
