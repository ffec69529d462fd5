/* worker/lag.c: the consumer lag cache and its thread (see lag_mu in struct worker). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker/worker_int.h"

/* Asks the lag thread for a refresh now. Any thread. */
void wlag_kick(worker_t *w)
{
    pthread_mutex_lock(&w->lag_mu);
    w->lag_kick = 1;
    pthread_cond_signal(&w->lag_cv);
    pthread_mutex_unlock(&w->lag_mu);
}

/* The lag thread: one refresh (consumer_lag under cons_mu, round trips bounded by 500 ms each),
 * then waits metrics.lag_refresh_ms or until kicked or stopped. A failed refresh keeps the
 * last good values (their age is on /metrics). */
void *wlag_main(void *arg)
{
    worker_t *w = arg;
    pthread_mutex_lock(&w->lag_mu);
    while (!w->lag_stop) {
        w->lag_kick = 0;
        pthread_mutex_unlock(&w->lag_mu);
        char err[256];
        pthread_mutex_lock(&w->cons_mu);
        int n = w->cons ? consumer_lag(w->cons, w->lag_tmp, 256, 500, err, sizeof err) : -1;
        pthread_mutex_unlock(&w->cons_mu);
        pthread_mutex_lock(&w->lag_mu);
        if (n >= 0) {
            memcpy(w->lag_cache, w->lag_tmp, sizeof *w->lag_tmp * (size_t)n);
            w->lag_n = n;
            w->lag_ms = mono_ms();
            atomic_fetch_add(&w->lag_ok, 1);
        } else {
            atomic_fetch_add(&w->lag_failed, 1);
        }
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        int64_t ns = dl.tv_nsec + (int64_t)w->cfg.metrics_lag_refresh_ms * 1000000;
        dl.tv_sec += (time_t)(ns / 1000000000);
        dl.tv_nsec = (long)(ns % 1000000000);
        while (!w->lag_stop && !w->lag_kick)
            if (pthread_cond_timedwait(&w->lag_cv, &w->lag_mu, &dl) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&w->lag_mu);
    return NULL;
}

/* Stops and joins the lag thread, if it runs. worker_run's thread. */
void wlag_thread_stop(worker_t *w)
{
    if (!w->lag_th_on) return;
    pthread_mutex_lock(&w->lag_mu);
    w->lag_stop = 1;
    pthread_cond_signal(&w->lag_cv);
    pthread_mutex_unlock(&w->lag_mu);
    pthread_join(w->lag_th, NULL);
    w->lag_th_on = 0;
}
