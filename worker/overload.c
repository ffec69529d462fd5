/* worker/overload.c: overload control on the poll thread: classes' pressure, the overload steps
 * (shed, cap, refuse) and flow control (pausing and resuming partitions against the in-flight
 * limits). */
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

static int overload_pressure(worker_t *w, int64_t now, int pending)
{
    const worker_class_t *top = &w->classes[w->top_class];
    if (top->ttft_ms <= 0 || !w->top_seen_ms || now - w->top_seen_ms > w->cfg.overload_window_ms)
        return 0;
    double p = 0;
    if (w->top_ttft_at_ms && now - w->top_ttft_at_ms <= (int64_t)w->cfg.overload_cooldown_ms)
        p = w->top_ttft_ewma_ms;
    if (w->wait_at_ms && now - w->wait_at_ms <= 1000 && w->wait_ewma_ms > p) p = w->wait_ewma_ms;
    p = 100.0 * p / top->ttft_ms;
    double f = 100.0 * pending / w->cfg.max_inflight;
    double ft = 100.0 * (double)w->inflight_tokens / (double)w->cfg.max_inflight_tokens;
    if (f > p) p = f;
    if (ft > p) p = ft;
    return p > 1e6 ? 1000000 : (int)p;
}

static const char *const OV_STEP[4] = {"none", "shed", "cap", "refuse"};

/* Moves the overload step: up at once to the highest step whose threshold the pressure reaches,
 * down one step after the pressure stayed under the current step's threshold for
 * overload.cooldown_ms. Holds the deferral topic while any step is on. Poll thread, at every
 * turn of the poll loop (after each message: a burst is seen at once). */
static void overload_eval(worker_t *w, int pending)
{
    int64_t now = mono_ms();
    if (w->n_classes < 2) return; /* one class: nothing to put below another */
    /* the deferral topic also waits while in-flight work is over step 1's share of the limits,
     * so that what it holds never pauses intake of the other topics */
    if (*w->cfg.deferral_topic) {
        int full = pending * 100 >= w->cfg.max_inflight * w->cfg.overload_shed_at ||
                   w->inflight_tokens * 100 >= w->cfg.max_inflight_tokens * w->cfg.overload_shed_at;
        int hold = w->ov_level > 0 || full;
        if (hold != consumer_topic_held(w->cons) &&
            consumer_hold_topic(w->cons, w->cfg.deferral_topic, hold))
            wlog(w, SW_LOG_WARN, "cannot %s the deferral topic %s", hold ? "hold" : "release",
                 w->cfg.deferral_topic);
    }
    int p = overload_pressure(w, now, pending);
    atomic_store(&w->st.ov_pressure, p);
    const int at[4] = {0, w->cfg.overload_shed_at, w->cfg.overload_cap_at, w->cfg.overload_refuse_at};
    int want = 0;
    while (want < 3 && p >= at[want + 1]) want++;
    int lvl = w->ov_level;
    if (want > lvl) {
        lvl = want;
        w->ov_below_since_ms = 0;
    } else if (want < lvl) {
        if (!w->ov_below_since_ms) w->ov_below_since_ms = now;
        if (now - w->ov_below_since_ms >= w->cfg.overload_cooldown_ms) {
            lvl--;
            w->ov_below_since_ms = lvl > want ? now : 0;
        }
    } else {
        w->ov_below_since_ms = 0;
    }
    if (lvl == w->ov_level) return;
    wlog(w, SW_LOG_INFO,
         "overload: step %s -> %s (pressure %d%% of class %s's ttft_ms %d: its time to "
         "first token %.0f ms, wait in Kafka %.0f ms; %d in flight)",
         OV_STEP[w->ov_level], OV_STEP[lvl], p, w->classes[w->top_class].name,
         w->classes[w->top_class].ttft_ms, w->top_ttft_ewma_ms, w->wait_ewma_ms, pending);
    atomic_fetch_add(lvl > w->ov_level ? &w->st.ov_steps_up : &w->st.ov_steps_down, 1);
    w->ov_level = lvl;
    atomic_store(&w->st.ov_level, lvl);
}

void wover_flow_control(worker_t *w)
{
    int pending = consumer_pending(w->cons);
    overload_eval(w, pending);
    int hi = w->cfg.max_inflight, lo = hi - (hi / 4 > 1 ? hi / 4 : 1);
    long bhi = w->cfg.max_inflight_bytes, blo = bhi - bhi / 4;
    long thi = w->cfg.max_inflight_tokens, tlo = thi - thi / 4;
    if (!consumer_paused(w->cons)) {
        if (pending >= hi || w->inflight_bytes >= bhi || w->inflight_tokens >= thi) {
            if (consumer_pause(w->cons) == 0) {
                atomic_fetch_add(&w->st.pauses, 1);
                atomic_store(&w->st.paused, 1);
                wlog(w, SW_LOG_DEBUG, "paused intake: %d in flight, %ld bytes, %ld tokens", pending,
                     w->inflight_bytes, w->inflight_tokens);
            }
        }
    } else if (pending <= lo && w->inflight_bytes <= blo && w->inflight_tokens <= tlo) {
        if (consumer_resume(w->cons) == 0) {
            atomic_fetch_add(&w->st.resumes, 1);
            atomic_store(&w->st.paused, 0);
            wlog(w, SW_LOG_DEBUG, "resumed intake: %d in flight", pending);
        }
    }
}
