/* worker/engine_thread.c: the engine thread: takes tokenised requests from the inbox, submits
 * them to their model version's engine, runs engine_step, and turns each finished request into an
 * output in the outbox (worker_int.h states the hand-over). */
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

#include "common/err.h"
#include "worker/worker_int.h"

void weng_active_remove(worker_t *w, wreq_t *r)
{
    int i = r->active_ix;
    if (i < 0) return;
    w->active[i] = w->active[--w->n_active];
    w->active[i]->active_ix = i;
    r->active_ix = -1;
    r->model->n_active--;
}
/* engine_step callback after each generated token that did not finish r (engine thread):
 * a chunk when stream.every_tokens tokens or stream.every_ms ms passed since the last one. */
static void on_engine_progress(void *arg, const engine_progress_t *p)
{
    worker_t *w = arg;
    wreq_t *r = p->user;
    if (atomic_load(&r->cancelled) || p->text_len <= r->stream_sent) return;
    int by_tokens = w->cfg.stream_every_tokens > 0 &&
                    p->n_tokens - r->stream_tokens >= w->cfg.stream_every_tokens;
    int by_time = w->cfg.stream_every_ms > 0 &&
                  mono_ns() - r->stream_ns >= (int64_t)w->cfg.stream_every_ms * 1000000;
    if (by_tokens || by_time)
        wstream_chunk(w, r, p->text + r->stream_sent, p->text_len - r->stream_sent, p->n_tokens,
                   NULL);
}

int weng_cancel(worker_t *w, wreq_t *r)
{
    if (!r->choice_ids) return engine_cancel(r->model->eng, r->engine_id);
    /* r may be freed by the last cancel: work on copies */
    engine_t *eng = r->model->eng;
    int n = r->req.n, known = 0;
    uint64_t *ids = malloc(sizeof *ids * (size_t)n);
    if (!ids) return engine_cancel(eng, r->engine_id);
    memcpy(ids, r->choice_ids, sizeof *ids * (size_t)n);
    for (int k = 0; k < n; k++)
        if (engine_cancel(eng, ids[k]) == 0) known = 1;
    free(ids);
    return known ? 0 : -1;
}

/* engine_step / engine_cancel callback, on the engine thread. With req.n > 1 every choice's
 * sequence ends here; the request finishes with the last one. */
static void on_engine_done(void *arg, const engine_result_t *res)
{
    worker_t *w = arg;
    wreq_t *r = res->user;
    wpeer_note_done(w, r, res); /* the cost model's prefill rate */
    if (r->choice_ids) {
        int k = 0;
        while (k < r->req.n - 1 && r->choice_ids[k] != res->id) k++;
        if (!atomic_load(&r->cancelled) && !r->choice_fail &&
            wres_choice(w, r, res, r->expire ? "expired" : engine_finish_name(res->finish), k)) {
            r->choice_fail = 1;
            snprintf(r->dlq_msg, sizeof r->dlq_msg, "out of memory building the result");
        }
        if (--r->n_left > 0) return;
    }
    weng_active_remove(w, r);
    if (atomic_load(&r->cancelled)) {
        wreq_free(w, r);
        return;
    }
    const char *finish = r->expire ? "expired" : engine_finish_name(res->finish);
    if (r->choice_fail) {
        char msg[sizeof r->dlq_msg];
        memcpy(msg, r->dlq_msg, sizeof msg);
        wres_dlq(r, REQ_ERR_BAD_PARAM, msg);
        wmodel_release(w, r);
        woutbox_push(w, r);
        return;
    }
    if (!r->choice_ids) wstream_finish(w, r, res->text, res->text_len, res->n_tokens, finish);
    int64_t t0 = mono_ns();
    wres_result(w, r, res, finish);
    add_since(&w->st.ns_result, t0);
    wmodel_release(w, r); /* done with the engine */
    woutbox_push(w, r);
}

/* Submits one tokenised request, or finishes it at once (cancelled, expired, refused). */
/* The dead-letter reason of a request engine_submit refused with rc (< 0, common/err.h). */
static const char *submit_dlq_code(int rc)
{
    switch (-rc) {
    case SW_ERANGE: return REQ_ERR_PROMPT_TOKENS; /* the prompt leaves no room in the context */
    default: return REQ_ERR_BAD_PARAM; /* SW_EINVAL; SW_ENOMEM as an allocation failure here */
    }
}

static void engine_start(worker_t *w, wreq_t *r)
{
    char err[256];
    if (atomic_load(&r->cancelled)) {
        wreq_free(w, r);
        return;
    }
    atomic_fetch_add_explicit(&w->st.ns_inbox_sum, (uint64_t)(mono_ns() - r->t_intake),
                              memory_order_relaxed);
    if (wreq_deadline_passed(r)) {
        wstream_finish(w, r, "", 0, 0, "expired");
        wres_result(w, r, NULL, "expired");
        wmodel_release(w, r);
        woutbox_push(w, r);
        return;
    }
    engine_request_t q;
    engine_request_default(&q);
    q.prompt = wreq_prompt(r, &q.n_prompt);
    q.max_tokens = r->req.max_tokens;
    q.sampling = r->req.sampling; /* as parsed (defaults: sampler_params_default) */
    q.stop = (const char *const *)r->req.stop;
    q.n_stop = r->req.n_stop;
    q.grammar = r->req.grammar; /* compiled at intake (request_parse); the engine takes a
                                   reference */
    q.priority = w->classes[r->cls].priority * 2001 + r->req.priority;
    /* cache.isolation tenant: a tenant's prefixes are its own (NULL tenant: the shared scope of
     * requests without one) */
    q.cache_scope = wreq_cache_scope(w, r);
    q.user = r;
    if (r->req.stream && w->aux) {
        q.progress = on_engine_progress;
        r->stream_ns = mono_ns();
    }
    if (w->n_active == w->cap_active) {
        int cap = w->cap_active ? w->cap_active * 2 : 64;
        wreq_t **a = realloc(w->active, sizeof *a * (size_t)cap);
        if (!a) {
            wres_dlq(r, REQ_ERR_BAD_PARAM, "out of memory");
            wmodel_release(w, r);
            woutbox_push(w, r);
            return;
        }
        w->active = a;
        w->cap_active = cap;
    }
    if (r->req.n > 1) {
        r->choice_ids = calloc((size_t)r->req.n, sizeof *r->choice_ids);
        r->choices = json_array();
        for (int k = 0; r->choices && k < r->req.n; k++)
            if (json_array_append_new(r->choices, json_null())) break;
        if (!r->choice_ids || !r->choices || (int)json_array_size(r->choices) != r->req.n) {
            wres_dlq(r, REQ_ERR_BAD_PARAM, "out of memory");
            wmodel_release(w, r);
            woutbox_push(w, r);
            return;
        }
    }
    r->active_ix = w->n_active;
    w->active[w->n_active++] = r;
    r->model->n_active++;
    if (r->req.n > 1) {
        /* the n choices are submitted together: the engine computes their shared prompt blocks
         * once (a sequence waits for a block another is computing, then shares it); choice k
         * samples with seed + k */
        uint64_t seed = q.sampling.seed;
        int k, rc = 0;
        r->n_left = 0;
        for (k = 0; k < r->req.n; k++) {
            q.sampling.seed = seed + (uint64_t)k;
            rc = engine_submit(r->model->eng, &q, on_engine_done, w, &r->choice_ids[k], err,
                               sizeof err);
            if (rc != 0) break;
            r->n_left++;
        }
        r->engine_id = r->choice_ids[0];
        if (k < r->req.n) {
            if (k == 0) {
                weng_active_remove(w, r);
                wres_dlq(r, submit_dlq_code(rc), err);
                wmodel_release(w, r);
                woutbox_push(w, r);
                return;
            }
            /* the ones submitted finish through on_engine_done, which dead-letters r */
            r->choice_fail = 1;
            int m = snprintf(r->dlq_msg, sizeof r->dlq_msg, "choice %d: ", k);
            snprintf(r->dlq_msg + m, sizeof r->dlq_msg - (size_t)m, "%.200s", err);
            weng_cancel(w, r);
            return;
        }
        free(r->toks);
        r->toks = NULL;
        return;
    }

    int rc = engine_submit(r->model->eng, &q, on_engine_done, w, &r->engine_id, err, sizeof err);
    if (rc != 0) {
        weng_active_remove(w, r);
        wres_dlq(r, submit_dlq_code(rc), err);
        wmodel_release(w, r);
        woutbox_push(w, r);
        return;
    }
    /* the engine copied the prompt */
    free(r->toks);
    r->toks = NULL;
}

/* Copies the models list into w->snap (engine thread). Returns the count, -1 on out of memory. */
static int model_snapshot(worker_t *w)
{
    pthread_mutex_lock(&w->models_mu);
    int n = 0;
    for (wmodel_t *m = w->models; m; m = m->next) n++;
    if (n > w->cap_snap) {
        wmodel_t **a = realloc(w->snap, sizeof *a * (size_t)n);
        if (!a) {
            pthread_mutex_unlock(&w->models_mu);
            return -1;
        }
        w->snap = a;
        w->cap_snap = n;
    }
    n = 0;
    for (wmodel_t *m = w->models; m; m = m->next) w->snap[n++] = m;
    pthread_mutex_unlock(&w->models_mu);
    return n;
}

static void stats_add(engine_stats_t *a, const engine_stats_t *b)
{
    a->prefix_lookups += b->prefix_lookups;
    a->prefix_hits += b->prefix_hits;
    a->evictions += b->evictions;
    a->tier2_lookups += b->tier2_lookups;
    a->tier2_hits += b->tier2_hits;
    a->tier2_stores += b->tier2_stores;
    a->deferred += b->deferred;
    a->kv_mismatches += b->kv_mismatches;
}

/* Frees the retired versions that no request holds any more (engine thread: it owns the
 * engines). A retired version's refs only go down (intake never routes to it), so 0 is final. */
static void model_gc(worker_t *w)
{
    for (;;) {
        wmodel_t *dead = NULL;
        pthread_mutex_lock(&w->models_mu);
        for (wmodel_t **pp = &w->models; *pp; pp = &(*pp)->next) {
            wmodel_t *m = *pp;
            if (atomic_load(&m->retired) && atomic_load(&m->refs) == 0 && m->n_active == 0) {
                *pp = m->next;
                dead = m;
                break;
            }
        }
        pthread_mutex_unlock(&w->models_mu);
        if (!dead) return;
        engine_stats_t es;
        engine_stats(dead->eng, &es);
        stats_add(&w->gone, &es);
        wlog(w, SW_LOG_INFO, "model %s: version %s (%s) drained and unloaded", dead->name,
             dead->fp_hex, dead->path);
        wmodel_free(dead);
        atomic_fetch_sub(&w->st.models_loaded, 1);
    }
}

/* After the steps of a turn: the engines' counters, summed (engine thread). */
static void engine_counters(worker_t *w, int n)
{
    engine_stats_t sum = w->gone;
    int used = 0, total = 0, running = 0, waiting = 0;
    for (int i = 0; i < n; i++) {
        engine_stats_t es;
        engine_stats(w->snap[i]->eng, &es);
        stats_add(&sum, &es);
        used += es.kv_blocks_used;
        total += es.kv_blocks_total;
        running += engine_n_running(w->snap[i]->eng);
        waiting += engine_n_waiting(w->snap[i]->eng);
    }
    atomic_store(&w->st.t1_lookups, sum.prefix_lookups);
    atomic_store(&w->st.t1_hits, sum.prefix_hits);
    atomic_store(&w->st.t1_evictions, sum.evictions);
    atomic_store(&w->st.t2_lookups, sum.tier2_lookups);
    atomic_store(&w->st.t2_hits, sum.tier2_hits);
    atomic_store(&w->st.t2_stores, sum.tier2_stores);
    atomic_store(&w->st.deferred, sum.deferred);
    atomic_store(&w->st.mismatches, sum.kv_mismatches);
    atomic_store(&w->st.kv_used, used);
    atomic_store(&w->st.kv_total, total);
    atomic_store(&w->st.eng_running, running);
    atomic_store(&w->st.eng_waiting, waiting);
}

void *weng_main(void *arg)
{
    worker_t *w = arg;
    char err[256];
    pthread_mutex_lock(&w->mu);
    for (;;) {
        int64_t t_wait = mono_ns();
        while (!w->eng_stop && !w->fatal && !w->inbox && w->n_active == 0 && !w->models_gc)
            pthread_cond_wait(&w->cv, &w->mu);
        add_since(&w->st.ns_idle, t_wait);
        if (w->fatal || (w->eng_stop && !w->inbox && w->n_active == 0)) break;
        wreq_t *batch = w->inbox;
        w->inbox = w->inbox_tail = NULL;
        atomic_store(&w->st.inbox_n, 0);
        int stopping = w->eng_stop;
        w->models_gc = 0;
        pthread_mutex_unlock(&w->mu);

        int64_t t0 = mono_ns();
        while (batch) {
            wreq_t *r = batch;
            batch = r->next;
            r->next = NULL;
            if (stopping) atomic_store(&r->cancelled, 1); /* only after the drain gave up */
            engine_start(w, r);
        }
        /* cancellations and deadlines; engine_cancel calls on_engine_done, which edits active */
        for (int i = w->n_active - 1; i >= 0; i--) {
            if (i >= w->n_active) continue;
            wreq_t *r = w->active[i];
            if (stopping) atomic_store(&r->cancelled, 1);
            if (atomic_load(&r->cancelled)) {
                weng_cancel(w, r);
            } else if (wreq_deadline_passed(r)) {
                r->expire = 1;
                weng_cancel(w, r);
            }
        }
        t0 = add_since(&w->st.ns_submit, t0);
        int n = model_snapshot(w), rc = 0;
        if (n < 0) {
            wfatal_set(w, "out of memory");
            pthread_mutex_lock(&w->mu);
            break;
        }
        if (w->n_active > 0) {
            /* one step of every engine with work, in turn (each has its own KV pool) */
            for (int i = 0; i < n && rc >= 0; i++)
                if (w->snap[i]->n_active > 0) {
                    rc = engine_step(w->snap[i]->eng, err, sizeof err);
                    if (rc < 0) wfatal_set(w, "engine step (model %s): %s", w->snap[i]->name, err);
                }
            add_since(&w->st.ns_step, t0);
            engine_counters(w, n);
        }
        model_gc(w);
        pthread_mutex_lock(&w->mu);
        if (rc < 0) break;
    }
    pthread_mutex_unlock(&w->mu);
    atomic_store(&w->st.eng_cpu_ns, thread_cpu_ns(CLOCK_THREAD_CPUTIME_ID));
    atomic_store(&w->st.eng_alive, 0);
    /* fatal: requests may be left in the engine; the consumer still tracks them, so they are
     * freed by worker_run once the consumer has dropped them (see there) */
    return NULL;
}
