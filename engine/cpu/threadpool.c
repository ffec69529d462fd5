/* engine/cpu/threadpool.c: fixed pool of worker threads (see threadpool.h).
 *
 * Protocol. For each job the caller publishes (fn, arg), clears one claim flag per part, sets
 * `pending` to n-1 and bumps the generation counter `gen`. A worker that sees `gen` move claims
 * its own part (atomic exchange on its flag) and runs it. The caller runs part 0, then claims
 * and runs every part whose worker has not claimed it yet -- so a worker that is descheduled
 * (more threads than free cores) costs at most one part's time, never a scheduler time slice.
 * Whoever completes a part 1..n-1 decrements `pending`; the caller returns when it is 0.
 *
 * Waiting. Both sides spin for a bounded time (pause instruction; sched_yield every few hundred
 * spins so an oversubscribed core is handed over), then sleep on a futex. A sleeper announces
 * itself (`sleepers`, `caller_sleeping`) before futex_wait; the waker checks after its own
 * store; both sides are seq_cst, so either the waker sees the sleeper or futex_wait sees the new
 * value (it re-checks the word atomically).
 *
 * Memory ordering. fn/arg are written before the claim flags are cleared (release) and read
 * after a successful claim (acq_rel exchange that read the cleared flag). A part's writes happen
 * before its release decrement of `pending`, which the caller reads with acquire. A new job is
 * published only after `pending` reached 0, i.e. after every part of the previous one ended.
 *
 * Stopping (tpool_free) sets `stop` and bumps `gen` but leaves every claim flag set: a worker
 * between its stop check and its claim then finds nothing to take, instead of the previous
 * job's part with a stale arg. */
#include "engine/cpu/threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

/* A waiter spins (pause: ~20 ns on Zen 4/5) for up to TPOOL_SPIN_NS, then sleeps. Past the
 * first TPOOL_YIELD_AFTER spins (~20 us: longer than the gaps between the parallel regions of
 * a decode step) it also yields every TPOOL_YIELD_EVERY spins, so on an oversubscribed core
 * the threads with work get to run; sched_yield is a ~1 us system call, hence not earlier. */
#define TPOOL_SPIN_NS 200000L
#define TPOOL_YIELD_AFTER 1024u
#define TPOOL_YIELD_EVERY 256u
#define TPOOL_CLOCK_EVERY 64u
#define TPOOL_MAX_THREADS 1024

#define CACHELINE 64

struct worker {
    tpool_t *pool;
    int ith;
    pthread_t tid;
};

struct tpool {
    /* Written by the caller per job; read by the workers. */
    _Alignas(CACHELINE) atomic_uint gen; /* futex word: job generation */
    atomic_int stop;
    tpool_fn fn;
    void *arg;
    int n;
    /* Written by whoever completes a part. */
    _Alignas(CACHELINE) atomic_uint pending; /* futex word: parts 1..n-1 not yet completed */
    atomic_int sleepers;        /* workers in (or about to enter) futex_wait on gen */
    atomic_int caller_sleeping; /* caller in (or about to enter) futex_wait on pending */
    _Alignas(CACHELINE) int n_started;
    atomic_int *claimed;    /* [n]: part i taken in the current job (index 0 unused) */
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

/* Spins while *addr == val, for at most the spin budget. Returns 1 when it changed. */
static int spin_while_equal(atomic_uint *addr, unsigned val)
{
    int64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != val) return 1;
        cpu_relax();
        if (i >= TPOOL_YIELD_AFTER && i % TPOOL_YIELD_EVERY == 0) sched_yield();
        if (i % TPOOL_CLOCK_EVERY == 0) {
            int64_t t = sw_mono_ns();
            if (t0 == 0)
                t0 = t;
            else if (t - t0 > TPOOL_SPIN_NS)
                return 0;
        }
    }
}

/* Takes part i of the current job if nobody has; returns 1 when taken. */
static inline int claim(tpool_t *p, int i)
{
    if (atomic_load_explicit(&p->claimed[i], memory_order_relaxed)) return 0;
    return atomic_exchange_explicit(&p->claimed[i], 1, memory_order_acq_rel) == 0;
}

/* Runs claimed part i and reports it complete. */
static void run_part(tpool_t *p, int i)
{
    p->fn(p->arg, i, p->n);
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1 &&
        atomic_load(&p->caller_sleeping))
        futex_wake_all(&p->pending);
}

static void *worker_main(void *v)
{
    struct worker *w = v;
    tpool_t *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        if (!spin_while_equal(&p->gen, seen)) {
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen) futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        if (claim(p, w->ith)) run_part(p, w->ith);
    }
    return NULL;
}

/* Moves gen on and wakes the sleepers. */
static void bump_gen(tpool_t *p)
{
    atomic_fetch_add(&p->gen, 1); /* seq_cst: ordered before the sleepers load */
    if (atomic_load(&p->sleepers) > 0) futex_wake_all(&p->gen);
}

/* Publishes the current fn/arg to the workers. */
static void publish(tpool_t *p)
{
    atomic_store_explicit(&p->pending, (unsigned)(p->n - 1), memory_order_relaxed);
    for (int i = 1; i < p->n; i++) atomic_store_explicit(&p->claimed[i], 0, memory_order_release);
    bump_gen(p);
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
            return;
        }
    }
}

tpool_t *tpool_new(int n_threads, char *errstr, size_t errlen)
{
    tpool_t *p = NULL;
    if (n_threads < 1 || n_threads > TPOOL_MAX_THREADS) {
        snprintf(errstr, errlen, "tpool: bad thread count %d (1..%d)", n_threads,
                 TPOOL_MAX_THREADS);
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
    p->claimed = calloc((size_t)n_threads, sizeof *p->claimed);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->claimed || !p->workers) goto oom;
    for (int i = 0; i < n_threads; i++) atomic_init(&p->claimed[i], 1);
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
        /* stop, without clearing the claim flags: a worker that read stop = 0 just before, and
         * claims now, must find every part of the last job taken -- else it would run that job's
         * fn on its arg, which its caller no longer holds */
        atomic_store(&p->stop, 1);
        bump_gen(p);
        for (int i = 1; i <= p->n_started; i++) pthread_join(p->workers[i].tid, NULL);
    }
    free(p->claimed);
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
    for (int i = 1; i < p->n; i++) /* parts whose worker has not started yet */
        if (claim(p, i)) run_part(p, i);
    wait_workers(p);
}
