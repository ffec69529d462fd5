/* tests/test_threadpool.c: engine/cpu/threadpool.c under churn.
 *
 * Every part of every job runs exactly once, on its own index, while the job's caller waits;
 * and tpool_free never runs a part of a job already returned from: each job's arg lives only
 * for its tpool_run (it is poisoned right after), so a worker that ran a stale part -- as one
 * could when stopping cleared the claim flags of the last job -- is caught by the magic check.
 * Pools are created and freed thousands of times with 2 to 4 threads, on jobs short enough
 * that workers are often still waking up when the caller has taken their parts itself. The
 * stopping race's window is a few instructions: the ThreadSanitizer stage (this test is in
 * SPILLWAY_THREADED_TESTS) widens it enough that the old tpool_free failed every run there
 * (8 stale parts in 7,500 jobs); a Release build rarely hits it. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "engine/cpu/threadpool.h"

#define MAGIC 0x5eedf00du
#define MAX_PARTS 4

typedef struct {
    volatile uint32_t magic; /* MAGIC while the job is live, 0 after its tpool_run returned */
    atomic_int ran[MAX_PARTS];
    atomic_int *stale;       /* parts run outside a live job (shared, outlives every job) */
} job_t;

static void part(void *arg, int ith, int nth)
{
    job_t *j = arg;
    if (j->magic != MAGIC || ith < 0 || ith >= nth || nth > MAX_PARTS) {
        atomic_fetch_add(j->stale, 1);
        return;
    }
    atomic_fetch_add(&j->ran[ith], 1);
}

int main(void)
{
    atomic_int stale;
    atomic_init(&stale, 0);
    long bad_counts = 0, jobs = 0;
    char err[128];
    for (int round = 0; round < 3000; round++) {
        const int n = 2 + round % 3;
        tpool_t *p = tpool_new(n, err, sizeof err);
        CHECKF(p != NULL, "%s", err);
        if (!p) break;
        const int n_jobs = 1 + round % 4;
        for (int k = 0; k < n_jobs; k++) {
            job_t j = {.magic = MAGIC, .stale = &stale};
            for (int i = 0; i < MAX_PARTS; i++) atomic_init(&j.ran[i], 0);
            tpool_run(p, part, &j);
            for (int i = 0; i < n; i++) bad_counts += atomic_load(&j.ran[i]) != 1;
            j.magic = 0; /* the job is over: any later call on it is stale */
            jobs++;
        }
        tpool_free(p);
    }
    CHECKF(bad_counts == 0, "%ld parts did not run exactly once", bad_counts);
    CHECKF(atomic_load(&stale) == 0, "%d parts ran on a job already returned from",
           atomic_load(&stale));
    printf("threadpool: %ld jobs on 3000 pools, every part once, none stale\n", jobs);
    return check_exit();
}
