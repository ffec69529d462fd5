/* worker/peer.c: KV across hosts, the worker's side: before a tokenised request enters the
 * engine, the peer thread asks the cache whether another host holds more of its prefix than
 * this host's tier 2, and fetches it when the cost model says so (cache_peer_prefetch), so that
 * the engine's tier-2 lookup then finds it. The engine thread never waits on a fetch.
 *
 * Threads: wpeer_offer runs on the poll thread at intake (it only queues); the peer thread
 * takes requests from w->peer_q, one at a time, and puts each in the inbox after its fetch (or
 * at once when none is worth it); wpeer_note_done runs on the engine thread. A request in
 * peer_q is owned by the peer thread; one cancelled meanwhile goes to the inbox all the same
 * (the engine thread frees it). */
#include "worker/worker_int.h"

/* Peer thread: the fetch for one request (cancelled or not: a fetched prefix serves others). */
static void prefetch_one(worker_t *w, wreq_t *r)
{
    if (atomic_load(&r->cancelled) || !r->model || !r->model->cache) return;
    int n_toks;
    const int32_t *toks = wreq_prompt(r, &n_toks);
    engine_info_t info;
    engine_info(r->model->eng, &info);
    if (info.block_tokens <= 0 || n_toks <= info.block_tokens) return;
    int max = (n_toks - 1) / info.block_tokens;
    if (max > CACHE_PEER_MAX_NAMES) max = CACHE_PEER_MAX_NAMES;
    uint64_t *names = malloc(sizeof *names * (size_t)max);
    if (!names) return;
    const char *scope = wreq_cache_scope(w, r);
    uint64_t seed;
    int n = engine_prefix_names(r->model->eng, scope, toks, n_toks, &seed, names, max);
    cache_prefetch_t pf;
    int got = n > 0 ? cache_peer_prefetch(r->model->cache, seed, names, toks, n, &pf) : 0;
    if (n > 0 && pf.decision == CACHE_PEER_FETCH)
        wlog(w, got == pf.n_peer - pf.n_local ? SW_LOG_DEBUG : SW_LOG_INFO,
             "peer fetch from host %s: %d of %d blocks (%d held here, %d tokens each; estimate "
             "%.2f ms against %.2f ms to recompute)%s%s", pf.peer, got, pf.n_peer - pf.n_local,
             pf.n_local, info.block_tokens, pf.t_fetch_s * 1e3, pf.t_compute_s * 1e3,
             pf.error ? ": fell short, recomputing the rest: " : "",
             pf.error ? cache_peer_error_name(pf.error) : "");
    free(names);
}

static void *peer_main(void *arg)
{
    worker_t *w = arg;
    pthread_mutex_lock(&w->peer_mu);
    for (;;) {
        while (!w->peer_q && !w->peer_stop) pthread_cond_wait(&w->peer_cv, &w->peer_mu);
        wreq_t *r = w->peer_q;
        if (!r) break; /* stopping, and nothing left */
        w->peer_q = r->next;
        if (!w->peer_q) w->peer_q_tail = NULL;
        int stopping = w->peer_stop;
        pthread_mutex_unlock(&w->peer_mu);
        if (!stopping) prefetch_one(w, r);
        wadmit_inbox_push(w, r);
        pthread_mutex_lock(&w->peer_mu);
    }
    pthread_mutex_unlock(&w->peer_mu);
    return NULL;
}

void wpeer_start(worker_t *w)
{
    w->peer_on = 0;
    if (!w->tier2 || !w->cfg.cache_peer_fetch) return;
    if (pthread_mutex_init(&w->peer_mu, NULL)) return;
    if (pthread_cond_init(&w->peer_cv, NULL)) {
        pthread_mutex_destroy(&w->peer_mu);
        return;
    }
    w->peer_stop = 0;
    w->peer_q = w->peer_q_tail = NULL;
    if (pthread_create(&w->peer_th, NULL, peer_main, w)) {
        wlog(w, SW_LOG_WARN, "cannot start the peer thread: no KV fetch from other hosts");
        pthread_cond_destroy(&w->peer_cv);
        pthread_mutex_destroy(&w->peer_mu);
        return;
    }
    w->peer_on = 1;
}

void wpeer_stop(worker_t *w)
{
    if (!w->peer_on) return;
    pthread_mutex_lock(&w->peer_mu);
    w->peer_stop = 1;
    pthread_cond_broadcast(&w->peer_cv);
    pthread_mutex_unlock(&w->peer_mu);
    pthread_join(w->peer_th, NULL);
    pthread_cond_destroy(&w->peer_cv);
    pthread_mutex_destroy(&w->peer_mu);
    w->peer_on = 0;
}

int wpeer_offer(worker_t *w, wreq_t *r)
{
    if (!w->peer_on || !r->model || !r->model->cache) return 0;
    int n_toks = r->toks ? r->n_toks : r->req.n_input_ids;
    if (n_toks <= w->cfg.block_tokens) return 0; /* no full block to reuse */
    r->next = NULL;
    pthread_mutex_lock(&w->peer_mu);
    if (w->peer_q_tail) w->peer_q_tail->next = r;
    else w->peer_q = r;
    w->peer_q_tail = r;
    pthread_cond_signal(&w->peer_cv);
    pthread_mutex_unlock(&w->peer_mu);
    return 1;
}

void wpeer_note_done(worker_t *w, const wreq_t *r, const engine_result_t *res)
{
    (void)w;
    if (!r->model || !r->model->cache || res->compute_ns <= 0) return;
    /* the request's compute time split over its tokens (engine_result_t.compute_ns): its
     * prefill share over the prompt tokens it computed */
    double computed = res->n_prompt - res->n_cached;
    double all = computed + res->n_tokens;
    if (computed < 1 || all < 1) return;
    cache_peer_note_prefill(r->model->cache, computed, (double)res->compute_ns * 1e-9 * computed / all);
}
