/* tests/tsan/thrd_create.c: linked only into ThreadSanitizer builds (SPILLWAY_TSAN).
 *
 * Debian's librdkafka starts its threads with C11 thrd_create (glibc >= 2.34), which gcc 12's
 * ThreadSanitizer does not intercept: those threads run without TSan state and crash in its
 * allocator. Defining thrd_create in the executable interposes glibc's (librdkafka resolves it
 * here) and starts the thread through pthread_create, which TSan intercepts. glibc's thrd_t is
 * a pthread_t and thrd_start_t returns int, carried through the void * result. thrd_join and
 * thrd_detach likewise. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

typedef struct {
    thrd_start_t fn;
    void *arg;
} tramp_t;

static void *tramp(void *p)
{
    tramp_t t = *(tramp_t *)p;
    free(p);
    return (void *)(intptr_t)t.fn(t.arg);
}

int thrd_create(thrd_t *thr, thrd_start_t fn, void *arg)
{
    tramp_t *t = malloc(sizeof *t);
    if (!t) return thrd_nomem;
    t->fn = fn;
    t->arg = arg;
    int rc = pthread_create(thr, NULL, tramp, t);
    if (rc) {
        free(t);
        return rc == ENOMEM ? thrd_nomem : thrd_error;
    }
    return thrd_success;
}

/* Joins and detaches must reach TSan too, or it sees thread ids reused while still running. */
int thrd_join(thrd_t thr, int *res)
{
    void *v = NULL;
    if (pthread_join(thr, &v)) return thrd_error;
    if (res) *res = (int)(intptr_t)v;
    return thrd_success;
}

int thrd_detach(thrd_t thr) { return pthread_detach(thr) ? thrd_error : thrd_success; }
