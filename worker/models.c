/* worker/models.c: model versions (README "Models"): loading a version, routing a request to the
 * current one and releasing it, and reload (SIGHUP): the poll thread starts a loader thread
 * (wmodel_reload_start) and installs what it loaded (wmodel_reload_finish). Threads are stated
 * per function. */
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

/* Drops r's reference to its model (any thread); the last one of a retired version asks the
 * engine thread to free it. */
void wmodel_release(worker_t *w, wreq_t *r)
{
    wmodel_t *m = r->model;
    if (!m) return;
    r->model = NULL;
    if (atomic_fetch_sub(&m->refs, 1) == 1 && atomic_load(&m->retired)) {
        pthread_mutex_lock(&w->mu);
        w->models_gc = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
}

/* The current (not retired) version named name, with a reference taken for a request; NULL
 * when none. Poll thread. */
wmodel_t *wmodel_acquire(worker_t *w, const char *name)
{
    pthread_mutex_lock(&w->models_mu);
    wmodel_t *m = w->models;
    while (m && (atomic_load(&m->retired) || strcmp(m->name, name))) m = m->next;
    if (m) atomic_fetch_add(&m->refs, 1);
    pthread_mutex_unlock(&w->models_mu);
    return m;
}

/* The engine configuration of every model (all but the path), from w->cfg. */
static void model_engine_config(const worker_t *w, engine_config_t *ec)
{
    engine_config_default(ec);
    ec->backend = w->cfg.backend;
    ec->cuda_dtype = w->cfg.cuda_dtype;
    ec->cuda_device = w->cfg.cuda_device;
    ec->cuda_mem_fraction = (float)w->cfg.cuda_mem_fraction;
    ec->threads = w->cfg.threads;
    ec->max_seqs = w->cfg.max_seqs;
    ec->max_batch_tokens = w->cfg.max_batch_tokens;
    ec->kv_blocks = w->cfg.kv_blocks;
    ec->kv_mem_mb = w->cfg.kv_mem_mb;
    ec->kv_type = w->cfg.kv_type;
    ec->block_tokens = w->cfg.block_tokens;
    ec->max_ctx = w->cfg.max_ctx;
    ec->prefix_cache = w->cfg.prefix_cache;
    ec->cpu_pack = w->cfg.cpu_pack;
    ec->sched_window = w->cfg.sched_window;
    ec->sched_aging_ms = w->cfg.sched_aging_ms;
    ec->sched_urgent_ms = w->cfg.sched_urgent_ms;
}

void wmodel_free(wmodel_t *m)
{
    if (!m) return;
    if (m->eng) engine_free(m->eng);
    cache_free(m->cache); /* after the engine, which calls it */
    free(m);
}

/* Loads spec's model: its engine, and tier 2 of the prefix cache when with_tier2 (the cache is
 * named by the engine's kv_seed, which hashes the model fingerprint: versions never share KV).
 * Any thread (reads w->cfg only). NULL + errstr on failure. */
wmodel_t *wmodel_load(worker_t *w, const worker_model_spec_t *spec, int with_tier2,
                            char *errstr, size_t errlen)
{
    wmodel_t *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(errstr, errlen, "out of memory");
        return NULL;
    }
    snprintf(m->name, sizeof m->name, "%s", spec->name);
    snprintf(m->path, sizeof m->path, "%s", spec->path);
    struct stat sb;
    if (stat(spec->path, &sb) == 0) {
        m->dev = sb.st_dev;
        m->ino = sb.st_ino;
        m->size = sb.st_size;
        m->mtime = sb.st_mtime;
    }
    engine_config_t ec;
    model_engine_config(w, &ec);
    ec.model_path = m->path;
    /* tier 2 is shared with the host's other processes: they must name blocks alike, under the
     * deployment's secret; without tier 2 the engine draws a secret of its own */
    unsigned char secret[CACHE_SECRET_BYTES];
    if (with_tier2) {
        if (cache_secret_load(w->cfg.cache_secret_file, secret, errstr, errlen)) goto fail;
        ec.kv_secret = secret;
    }
    m->eng = engine_new(&ec, errstr, errlen);
    if (!m->eng) goto fail;
    engine_info_t info;
    engine_info(m->eng, &info);
    m->fingerprint = info.fingerprint;
    snprintf(m->fp_hex, sizeof m->fp_hex, "%016" PRIx64, info.fingerprint);
    snprintf(m->arch, sizeof m->arch, "%s", info.arch ? info.arch : "?");
    m->bos = info.bos;
    if (with_tier2) {
        cache_config_t kc;
        cache_config_default(&kc);
        kc.arena_path = w->cfg.cache_arena_path;
        kc.arena_mb = w->cfg.cache_arena_mb;
        kc.redis_host = w->cfg.cache_redis_host;
        kc.redis_port = w->cfg.cache_redis_port;
        kc.redis_user = w->cfg.cache_redis_user;
        kc.redis_password = w->cfg.cache_redis_password;
        kc.redis_db = w->cfg.cache_redis_db;
        kc.namespace_ = w->cfg.cache_namespace;
        kc.host_id = w->cfg.cache_host_id;
        kc.connect_timeout_ms = w->cfg.cache_connect_timeout_ms;
        kc.cmd_timeout_ms = w->cfg.cache_cmd_timeout_ms;
        kc.backoff_min_ms = w->cfg.cache_backoff_min_ms;
        kc.backoff_max_ms = w->cfg.cache_backoff_max_ms;
        kc.health_ms = w->cfg.cache_health_ms;
        kc.write_queue = w->cfg.cache_write_queue;
        kc.fleet_refresh_ms = w->cfg.cache_fleet_refresh_ms;
        kc.fleet_ttl_ms = w->cfg.cache_fleet_ttl_ms;
        kc.peer_listen = w->cfg.cache_peer_listen;
        kc.peer_advertise = w->cfg.cache_peer_advertise;
        kc.peer_secret = secret; /* a key is derived from it in cache_new */
        kc.peer_timeout_ms = w->cfg.cache_peer_timeout_ms;
        kc.peer_bandwidth_mbps = w->cfg.cache_peer_bandwidth_mbps;
        kc.peer_rtt_us = w->cfg.cache_peer_rtt_us;
        kc.prefill_tps = w->cfg.cache_peer_prefill_tps;
        kc.log_level = w->cfg.log_level;
        kc.log_fn = wlog_hook;
        kc.log_arg = w;
        cache_geometry_t geo = {.seed = info.kv_seed, .block_tokens = info.block_tokens,
                                .block_bytes = info.kv_block_bytes};
        m->cache = cache_new(&kc, &geo, errstr, errlen);
        sodium_memzero(secret, sizeof secret);
        if (!m->cache) goto fail;
        engine_kv_tier_t tier;
        cache_engine_tier(m->cache, &tier);
        if (engine_set_kv_tier(m->eng, &tier, errstr, errlen)) goto fail;
    }
    return m;
fail:
    sodium_memzero(secret, sizeof secret);
    wmodel_free(m);
    return NULL;
}

void wmodel_job_free(struct reload_job *j)
{
    if (!j) return;
    if (j->loaded)
        for (int i = 0; i < j->n; i++)
            wmodel_free(j->loaded[i]);
    free(j->loaded);
    free(j->want);
    free(j->specs);
    free(j);
}

/* The loader thread: loads what the job marks (all or nothing). */
static void *reload_main(void *arg)
{
    struct reload_job *j = arg;
    for (int i = 0; i < j->n && !j->failed; i++) {
        if (!j->want[i]) continue;
        char e[384];
        j->loaded[i] = wmodel_load(j->w, &j->specs[i], j->w->tier2 && i == j->def, e, sizeof e);
        if (!j->loaded[i]) {
            j->failed = 1;
            snprintf(j->err, sizeof j->err, "model %s (%.200s): %.250s", j->specs[i].name,
                     j->specs[i].path, e);
        }
    }
    if (j->failed)
        for (int i = 0; i < j->n; i++) {
            wmodel_free(j->loaded[i]);
            j->loaded[i] = NULL;
        }
    atomic_store(&j->done, 1);
    worker_t *w = j->w;
    pthread_mutex_lock(&w->cons_mu);
    if (w->cons) consumer_wake(w->cons);
    pthread_mutex_unlock(&w->cons_mu);
    return NULL;
}

/* The current version named name. Caller holds w->models_mu. */
static wmodel_t *model_current(worker_t *w, const char *name)
{
    for (wmodel_t *m = w->models; m; m = m->next)
        if (!atomic_load(&m->retired) && !strcmp(m->name, name)) return m;
    return NULL;
}

/* The reload flag was raised: reads the new model keys and starts loading. */
void wmodel_reload_start(worker_t *w)
{
    char err[512];
    worker_config_t nc;
    worker_model_spec_t *specs = NULL;
    int n, def;
    struct reload_job *j = NULL;
    if (w->reload_fn(w->reload_arg, &nc, err, sizeof err)) goto failed;
    int rc = worker_models_parse(&nc, &specs, &n, &def, err, sizeof err);
    worker_config_free(&nc);
    if (rc) goto failed;
    j = calloc(1, sizeof *j);
    if (!j || !(j->loaded = calloc((size_t)n, sizeof *j->loaded)) ||
        !(j->want = calloc((size_t)n, sizeof *j->want))) {
        snprintf(err, sizeof err, "out of memory");
        goto failed;
    }
    j->specs = specs;
    specs = NULL;
    j->n = n;
    j->def = def;
    j->w = w;
    int to_load = 0;
    pthread_mutex_lock(&w->models_mu);
    for (int i = 0; i < n; i++) {
        const wmodel_t *cur = model_current(w, j->specs[i].name);
        struct stat sb;
        int same = cur && !strcmp(cur->path, j->specs[i].path) && !stat(cur->path, &sb) &&
                   sb.st_dev == cur->dev && sb.st_ino == cur->ino && sb.st_size == cur->size &&
                   sb.st_mtime == cur->mtime;
        if (!same) {
            j->want[i] = 1;
            to_load++;
        }
    }
    pthread_mutex_unlock(&w->models_mu);
    wlog(w, SW_LOG_INFO, "reload: %d model(s) configured, %d to load", n, to_load);
    if (to_load == 0) {
        atomic_store(&j->done, 1); /* installed at once: names dropped, default changed */
    } else if (pthread_create(&j->th, NULL, reload_main, j)) {
        snprintf(err, sizeof err, "cannot start the loader thread");
        goto failed;
    } else {
        j->started = 1;
    }
    w->job = j;
    return;
failed:
    free(specs);
    wmodel_job_free(j);
    atomic_fetch_add(&w->st.reloads_failed, 1);
    wlog(w, SW_LOG_ERROR, "reload failed, serving on unchanged: %s", err);
}

/* Installs a finished load: each new version takes over its name; what it replaces, and names
 * no longer configured, are retired (the engine thread frees them once drained). */
void wmodel_reload_finish(worker_t *w)
{
    struct reload_job *j = w->job;
    if (!j || !atomic_load(&j->done)) return;
    w->job = NULL;
    if (j->started) pthread_join(j->th, NULL);
    if (j->failed) {
        atomic_fetch_add(&w->st.reloads_failed, 1);
        wlog(w, SW_LOG_ERROR, "reload failed, serving on unchanged: %s", j->err);
        wmodel_job_free(j);
        return;
    }
    int swaps = 0;
    pthread_mutex_lock(&w->models_mu);
    for (wmodel_t *m = w->models; m; m = m->next) {
        if (atomic_load(&m->retired)) continue;
        int keep = 0;
        for (int i = 0; i < j->n; i++)
            keep |= !strcmp(j->specs[i].name, m->name) && !j->loaded[i];
        if (keep) continue;
        const wmodel_t *nv = NULL;
        for (int i = 0; i < j->n; i++)
            if (!strcmp(j->specs[i].name, m->name)) nv = j->loaded[i];
        atomic_store(&m->retired, 1);
        if (nv) {
            swaps++;
            wlog(w, SW_LOG_INFO,
                 "model swap: %s: version %s (%s) -> %s (%s); the old one finishes the %d "
                 "request(s) it holds",
                 m->name, m->fp_hex, m->path, nv->fp_hex, nv->path, atomic_load(&m->refs));
        } else {
            wlog(w, SW_LOG_INFO, "model %s: no longer served; finishing the %d request(s) it holds",
                 m->name, atomic_load(&m->refs));
        }
    }
    for (int i = 0; i < j->n; i++) {
        wmodel_t *nv = j->loaded[i];
        if (!nv) continue;
        j->loaded[i] = NULL;
        wmodel_t **pp = &w->models; /* appended: the newest last */
        while (*pp) pp = &(*pp)->next;
        *pp = nv;
        atomic_fetch_add(&w->st.models_loaded, 1);
        wlog(w, SW_LOG_INFO, "model %s: %s (%s), fingerprint %s loaded", nv->name, nv->path,
             nv->arch, nv->fp_hex);
    }
    snprintf(w->default_model, sizeof w->default_model, "%s", j->specs[j->def].name);
    pthread_mutex_unlock(&w->models_mu);
    atomic_fetch_add(&w->st.model_swaps, (uint64_t)swaps);
    atomic_fetch_add(&w->st.reloads_ok, 1);
    wlog(w, SW_LOG_INFO, "reload done: %d swap(s), default model %s", swaps, w->default_model);
    wmodel_job_free(j);
    pthread_mutex_lock(&w->mu);
    w->models_gc = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}
