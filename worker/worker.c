/* worker/worker.c: the worker's lifecycle and run loop: worker_new, worker_run (the poll thread's
 * loop and the shutdown with its watchdog), worker_stop, worker_free, stats. worker_int.h states the
 * threads and the ownership of a request. */
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

static int split_props(worker_t *w)
{
    int n = w->cfg.n_kafka;
    w->prop_c_keys = calloc((size_t)n + 1, sizeof(char *));
    w->prop_c_vals = calloc((size_t)n + 1, sizeof(char *));
    w->prop_p_keys = calloc((size_t)n + 1, sizeof(char *));
    w->prop_p_vals = calloc((size_t)n + 1, sizeof(char *));
    if (!w->prop_c_keys || !w->prop_c_vals || !w->prop_p_keys || !w->prop_p_vals) return -1;
    for (int i = 0; i < n; i++) {
        char *k = w->cfg.kafka[i].key, *v = w->cfg.kafka[i].value;
        if (!strncmp(k, "consumer.", 9)) {
            w->prop_c_keys[w->n_prop_c] = k + 9;
            w->prop_c_vals[w->n_prop_c++] = v;
        } else if (!strncmp(k, "producer.", 9)) {
            w->prop_p_keys[w->n_prop_p] = k + 9;
            w->prop_p_vals[w->n_prop_p++] = v;
        } else {
            w->prop_c_keys[w->n_prop_c] = k;
            w->prop_c_vals[w->n_prop_c++] = v;
            w->prop_p_keys[w->n_prop_p] = k;
            w->prop_p_vals[w->n_prop_p++] = v;
        }
    }
    return 0;
}

/* Says at start what the claims key leaves open: all of it when unset, else each listed input
 * topic that only a "*" entry (or none) covers. */
static void log_claims(worker_t *w)
{
    if (!w->claims) {
        wlog(w, SW_LOG_WARN,
             "claims is not set: requests name their own tenant and class unchecked "
             "(README \"Tenants and usage\")");
        return;
    }
    for (const char *t = w->cfg.input_topics; *t;) {
        const char *e = strchr(t, ',');
        size_t n = e ? (size_t)(e - t) : strlen(t);
        char topic[256];
        snprintf(topic, sizeof topic, "%.*s", (int)(n < sizeof topic ? n : sizeof topic - 1), t);
        if (*topic && !claims_covers(w->claims, topic))
            wlog(w, SW_LOG_INFO,
                 "claims: input topic %s has no entry of its own (the \"*\" entry, if any, "
                 "applies; with none its requests may claim no tenant or class)", topic);
        t = e ? e + 1 : t + n;
    }
}

/* reply.topics -> w->reply_allow (entries trimmed; empty ones skipped). 0 or -1 (memory). */
static int split_reply_topics(worker_t *w)
{
    const char *p = w->cfg.reply_topics;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        const char *a = p, *b = p + n;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (b > a) {
            char **l = realloc(w->reply_allow, sizeof *l * (size_t)(w->n_reply_allow + 1));
            if (!l) return -1;
            w->reply_allow = l;
            if (!(l[w->n_reply_allow] = strndup(a, (size_t)(b - a)))) return -1;
            w->n_reply_allow++;
        }
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

worker_t *worker_new(const worker_config_t *cfg, char *errstr, size_t errlen)
{
    worker_t *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(errstr, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->cons_mu, NULL);
    pthread_mutex_init(&w->models_mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_mutex_init(&w->lag_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->lag_cv, &ca);
    pthread_condattr_destroy(&ca);
    w->lag_n = -1;
    if (worker_config_copy(&w->cfg, cfg)) {
        snprintf(errstr, errlen, "out of memory");
        free(w);
        return NULL;
    }
    if (worker_config_check(&w->cfg, errstr, errlen)) goto fail;
    if (worker_classes_parse(w->cfg.classes, &w->classes, &w->n_classes, errstr, errlen)) goto fail;
    for (int i = 0; i < w->n_classes; i++) {
        if (w->classes[i].priority > w->classes[w->top_class].priority) w->top_class = i;
        if (w->classes[i].priority < w->classes[w->low_class].priority) w->low_class = i;
        if (!strcmp(w->classes[i].name, w->cfg.class_default)) w->default_class = i;
    }
    w->class_names = malloc(sizeof *w->class_names * (size_t)w->n_classes);
    if (split_props(w) || !w->class_names) {
        snprintf(errstr, errlen, "out of memory");
        goto fail;
    }
    for (int i = 0; i < w->n_classes; i++) w->class_names[i] = w->classes[i].name;
    w->log_json = !strcmp(w->cfg.log_format, "json");
    if (claims_parse(w->cfg.claims, w->classes, w->n_classes, w->default_class, &w->claims,
                     errstr, errlen))
        goto fail;
    if (split_reply_topics(w)) {
        snprintf(errstr, errlen, "out of memory");
        goto fail;
    }
    if (*w->cfg.worker_id) {
        snprintf(w->worker_id, sizeof w->worker_id, "%s", w->cfg.worker_id);
    } else {
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        snprintf(w->worker_id, sizeof w->worker_id, "%s-%d", host, (int)getpid());
    }
    wlog_json_escape(w->worker_id_json, sizeof w->worker_id_json, w->worker_id);
    log_claims(w); /* after worker_id: every log line names the worker */
    if (w->cfg.delivery == WORKER_EOS && !*w->cfg.worker_id && !*w->cfg.transactional_id)
        wlog(w, SW_LOG_WARN,
             "exactly-once without worker.id: the transactional id is spillway-%s-%s, "
             "new at each restart, so a restarted worker cannot fence its previous instance's "
             "open transaction (it times out instead); set worker.id (-i NAME) to a name "
             "stable across restarts and unique in the group", w->cfg.group_id, w->worker_id);
    /* the endpoint first: /healthz answers while the model loads and the clients connect, and
     * /readyz says "starting" until worker_new returns (a probe sees every stage) */
    if (w->cfg.metrics_port > 0) {
        metrics_handlers_t mh = {.render = wexpo_render, .ready = wexpo_ready,
                                 .healthy = wexpo_healthy, .arg = w};
        metrics_server_opts_t mo;
        metrics_server_opts_default(&mo);
        mo.bind_addr = w->cfg.metrics_bind;
        mo.port = w->cfg.metrics_port;
        mo.health_port = w->cfg.metrics_health_port > 0 ? w->cfg.metrics_health_port : -1;
        mo.max_conns = (unsigned)w->cfg.metrics_max_conns;
        mo.max_conns_per_ip = (unsigned)w->cfg.metrics_max_conns_per_ip;
        mo.timeout_s = (unsigned)w->cfg.metrics_timeout_s;
        w->metrics = metrics_server_start(&mo, &mh, errstr, errlen);
        if (!w->metrics) goto fail;
        wlog(w, SW_LOG_INFO, "metrics on http://%s:%d/metrics", w->cfg.metrics_bind,
             metrics_server_port(w->metrics));
        if (metrics_server_health_port(w->metrics) >= 0)
            wlog(w, SW_LOG_INFO, "health on http://%s:%d/healthz", w->cfg.metrics_bind,
                 metrics_server_health_port(w->metrics));
    }

    request_limits_default(&w->limits);
    w->limits.max_message_bytes = (size_t)w->cfg.max_message_bytes;
    w->limits.max_prompt_bytes = (size_t)w->cfg.max_prompt_bytes;
    w->limits.max_tokens_limit = w->cfg.max_tokens;
    w->limits.default_max_tokens = w->cfg.default_max_tokens;
    w->limits.max_input_ids = w->cfg.max_input_ids;
    w->limits.max_messages = w->cfg.max_messages;
    w->limits.max_stop = w->cfg.max_stop;
    w->limits.max_n = w->cfg.max_n;
    w->limits.max_stop_bytes = (size_t)w->cfg.max_stop_bytes;
    w->limits.max_metadata_bytes = (size_t)w->cfg.max_metadata_bytes;
    w->limits.max_id_bytes = (size_t)w->cfg.max_id_bytes;

    atomic_store(&w->st.tok_per_msg_bits, double_bits(NAN));
    atomic_store(&w->st.tput_bits, double_bits(NAN));
    w->usage = usage_new(w->cfg.usage_max_tenants, w->cfg.usage_max_classes);
    if (!w->usage) {
        snprintf(errstr, errlen, "out of memory");
        goto fail;
    }
    worker_model_spec_t *specs;
    int n_specs, def;
    if (worker_models_parse(&w->cfg, &specs, &n_specs, &def, errstr, errlen)) goto fail;
    w->tier2 = w->cfg.prefix_cache && *w->cfg.cache_redis_host;
    snprintf(w->default_model, sizeof w->default_model, "%s", specs[def].name);
    for (int i = 0; i < n_specs; i++) {
        /* tier 2 serves the default model (one arena per host holds one model's blocks) */
        wmodel_t *m = wmodel_load(w, &specs[i], w->tier2 && i == def, errstr, errlen);
        if (!m) {
            free(specs);
            goto fail;
        }
        wmodel_t **pp = &w->models; /* in the order given */
        while (*pp) pp = &(*pp)->next;
        *pp = m;
        atomic_fetch_add(&w->st.models_loaded, 1);
    }
    free(specs);

    char txid[512];
    if (*w->cfg.transactional_id) snprintf(txid, sizeof txid, "%s", w->cfg.transactional_id);
    else snprintf(txid, sizeof txid, "spillway-%s-%s", w->cfg.group_id, w->worker_id);
    producer_config_t pc = {
        .brokers = w->cfg.brokers,
        .transactional_id = w->cfg.delivery == WORKER_EOS ? txid : NULL,
        .prop_keys = (const char *const *)w->prop_p_keys,
        .prop_values = (const char *const *)w->prop_p_vals,
        .n_props = w->n_prop_p,
        /* every accepted message fits into its dead letter (worker_config_check refuses a
         * message.max.bytes below this) */
        .message_max_bytes = w->cfg.max_message_bytes + WORKER_DLQ_OVERHEAD_BYTES > 1000000
                                 ? w->cfg.max_message_bytes + WORKER_DLQ_OVERHEAD_BYTES
                                 : 1000000,
        .dr = wout_on_delivery,
        .dr_arg = w,
        .log = wlog_hook,
    };
    w->prod = producer_new(&pc, errstr, errlen);
    if (!w->prod) goto fail;
    /* learn the output topics' leaders now rather than on the first result */
    const char *outs[3] = {w->cfg.output_topic, w->cfg.dlq_topic, w->cfg.deferral_topic};
    int n_outs = *w->cfg.deferral_topic && w->n_classes > 1 ? 3 : 2;
    for (int i = 0; i < n_outs + w->n_reply_allow; i++) {
        char e[256];
        if (producer_prepare_topic(w->prod, i < n_outs ? outs[i] : w->reply_allow[i - n_outs],
                                   5000, e, sizeof e))
            wlog(w, SW_LOG_WARN, "%s (results wait until it exists)", e);
    }
    if (*w->cfg.stream_topic || *w->cfg.usage_topic) {
        producer_config_t ac = pc;
        ac.transactional_id = NULL; /* chunks are best effort, outside any transaction */
        ac.dr = wout_on_aux_delivery;
        w->aux = producer_new(&ac, errstr, errlen);
        if (!w->aux) goto fail;
        char e[256];
        if (*w->cfg.stream_topic &&
            producer_prepare_topic(w->aux, w->cfg.stream_topic, 5000, e, sizeof e))
            wlog(w, SW_LOG_WARN, "%s (stream chunks fail until it exists)", e);
        if (*w->cfg.usage_topic &&
            producer_prepare_topic(w->aux, w->cfg.usage_topic, 5000, e, sizeof e))
            wlog(w, SW_LOG_WARN, "%s (usage records fail until it exists)", e);
    }
    /* the deferral topic is an input too: what step 1 moved there is consumed when no step is on */
    char *topics = NULL;
    int listed = 0;
    if (*w->cfg.deferral_topic && w->n_classes > 1) {
        size_t dl = strlen(w->cfg.deferral_topic);
        for (const char *t = w->cfg.input_topics; t && *t;) {
            const char *e = strchr(t, ',');
            size_t l = e ? (size_t)(e - t) : strlen(t);
            listed |= l == dl && !memcmp(t, w->cfg.deferral_topic, dl);
            t = e ? e + 1 : NULL;
        }
        if (!listed) {
            size_t n = strlen(w->cfg.input_topics) + dl + 2;
            if (!(topics = malloc(n))) {
                snprintf(errstr, errlen, "out of memory");
                goto fail;
            }
            snprintf(topics, n, "%s,%s", w->cfg.input_topics, w->cfg.deferral_topic);
        }
    }
    /* forwarding: the group consumes forward.topic too (worker/forward.c) */
    if (wfwd_new(w, errstr, errlen)) {
        free(topics);
        goto fail;
    }
    if (wfwd_subscription(w, &topics)) {
        free(topics);
        snprintf(errstr, errlen, "out of memory");
        goto fail;
    }
    if (w->fwd) {
        char e[256];
        if (producer_prepare_topic(w->prod, w->cfg.forward_topic, 5000, e, sizeof e))
            wlog(w, SW_LOG_WARN, "%s (forwards wait until it exists)", e);
    }
    consumer_config_t cc = {
        .brokers = w->cfg.brokers,
        .group_id = w->cfg.group_id,
        .topics = topics ? topics : w->cfg.input_topics,
        .prop_keys = (const char *const *)w->prop_c_keys,
        .prop_values = (const char *const *)w->prop_c_vals,
        .n_props = w->n_prop_c,
        .commit_offsets = w->cfg.delivery == WORKER_ALO,
        /* half the shutdown budget: the close after it and the watchdog get the rest */
        .leave_wait_ms = w->cfg.shutdown_timeout_ms / 2,
    };
    consumer_hooks_t hooks = {.arg = w, .before_revoke = wout_hook_before_revoke, .drop = wout_hook_drop,
                              .lost = wout_hook_lost, .committed = wout_hook_committed,
                              .log = wlog_hook};
    w->cons = consumer_new(&cc, &hooks, errstr, errlen);
    free(topics);
    if (!w->cons) goto fail;
    atomic_store(&w->started, 1); /* the metrics thread may read everything above from now */
    return w;
fail:
    worker_free(w);
    return NULL;
}

void worker_stop(worker_t *w)
{
    atomic_store(&w->stop_req, 1);
    pthread_mutex_lock(&w->cons_mu);
    if (w->cons) consumer_wake(w->cons);
    pthread_mutex_unlock(&w->cons_mu);
}

void worker_set_stats_flag(worker_t *w, volatile sig_atomic_t *flag) { w->stats_flag = flag; }

void worker_set_reload(worker_t *w, volatile sig_atomic_t *flag, worker_reload_fn fn, void *arg)
{
    w->reload_flag = fn ? flag : NULL;
    w->reload_fn = fn;
    w->reload_arg = arg;
}

void worker_log_stats(worker_t *w)
{
    worker_stats_t st;
    worker_stats(w, &st);
    struct rusage ru;
    double proc_cpu = 0;
    if (!getrusage(RUSAGE_SELF, &ru))
        proc_cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
                   (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
    double busy = (double)st.ns_busy * 1e-9, s = 1e-9;
    uint64_t out = st.results + st.dlq;
    double per = out ? 1e-3 / (double)out : 0; /* ns sum -> us per output */
    wlog(w, SW_LOG_INFO,
         "stats: busy_s=%.3f outputs=%" PRIu64 " results=%" PRIu64 " dlq=%" PRIu64
         " expired=%" PRIu64 " req_per_s=%.1f completion_tokens=%" PRIu64 " tok_per_s=%.1f"
         " prompt_tokens=%" PRIu64 " cached_tokens=%" PRIu64 " poll_cpu_s=%.3f engine_cpu_s=%.3f"
         " process_cpu_s=%.3f poll_s=%.3f intake_s=%.3f parse_s=%.3f tokenize_s=%.3f"
         " produce_s=%.3f commit_s=%.3f submit_s=%.3f step_s=%.3f result_s=%.3f idle_s=%.3f"
         " intake_us=%.2f produce_us=%.2f queue_ms_mean=%.2f inbox_ms_mean=%.3f"
         " pauses=%" PRIu64 " commits=%" PRIu64 " txn_commits=%" PRIu64 " retries=%" PRIu64
         " kv_blocks=%d/%d t1_hits=%" PRIu64 "/%" PRIu64 " t1_evictions=%" PRIu64
         " t2_hits=%" PRIu64 "/%" PRIu64 " t2_stores=%" PRIu64 " t2_evictions=%" PRIu64
         " t2_torn=%" PRIu64 " arena=%d/%d redis_up=%d redis_errors=%" PRIu64
         " prefix_deferred=%" PRIu64 " prefix_mismatches=%" PRIu64,
         busy, out, st.results, st.dlq, st.expired, busy > 0 ? (double)out / busy : 0.0,
         st.completion_tokens, busy > 0 ? (double)st.completion_tokens / busy : 0.0,
         st.prompt_tokens, st.cached_tokens, st.poll_cpu_s, st.engine_cpu_s, proc_cpu,
         (double)st.ns_poll * s, (double)st.ns_intake * s, (double)st.ns_parse * s,
         (double)st.ns_tokenize * s, (double)st.ns_produce * s, (double)st.ns_commit * s,
         (double)st.ns_submit * s, (double)st.ns_step * s, (double)st.ns_result * s,
         (double)st.ns_idle * s, (double)st.ns_intake * per, (double)st.ns_produce * per,
         st.results ? (double)st.ns_queue_sum * 1e-6 / (double)st.results : 0.0,
         st.consumed ? (double)st.ns_inbox_sum * 1e-6 / (double)st.consumed : 0.0, st.pauses,
         st.commits, st.txn_commits, st.produce_retries, st.kv_blocks_used, st.kv_blocks_total,
         st.tier1_hits, st.tier1_lookups, st.tier1_evictions, st.tier2_hits, st.tier2_lookups,
         st.tier2_stores, st.tier2_evictions, st.tier2_torn, st.arena_used, st.arena_slots,
         st.redis_up, st.redis_errors, st.prefix_deferred, st.prefix_mismatches);
}

/* ---- shutdown watchdog ----
 * Closing librdkafka clients can block without bound (a fenced transactional producer, a group
 * coordinator that never answers a LeaveGroup, a message whose last reference leaked): a worker
 * that stopped working must still exit, so that its supervisor restarts it. The watchdog thread
 * waits until worker_run's shutdown has finished or its deadline passed; past the deadline it logs
 * the stage that blocked and ends the process with status 1. Nothing uncommitted is lost: offsets
 * are only committed with their results, so what was in flight is consumed again. */
typedef struct {
    worker_t *w;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* signalled when done is set */
    int done;                /* under mu */
    int64_t deadline_ms;     /* mono_ms() */
    _Atomic(const char *) stage; /* static string: the shutdown step now running */
} watchdog_t;

static void *watchdog_main(void *arg)
{
    watchdog_t *d = arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t left = d->deadline_ms - mono_ms();
    ts.tv_sec += left / 1000;
    ts.tv_nsec += (left % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&d->mu);
    while (!d->done && pthread_cond_timedwait(&d->cv, &d->mu, &ts) != ETIMEDOUT) {
    }
    int done = d->done;
    pthread_mutex_unlock(&d->mu);
    if (done) return NULL;
    worker_t *w = d->w;
    pthread_mutex_lock(&w->mu);
    int fatal = w->fatal;
    char msg[sizeof w->fatal_msg];
    snprintf(msg, sizeof msg, "%s", w->fatal_msg);
    pthread_mutex_unlock(&w->mu);
    wlog(w, SW_LOG_ERROR,
         "shutdown blocked while %s for longer than shutdown.timeout.ms=%d: exiting now "
         "(uncommitted work will be consumed again)",
         atomic_load(&d->stage), w->cfg.shutdown_timeout_ms);
    if (fatal) wlog(w, SW_LOG_ERROR, "fatal: %s", msg);
    fflush(stderr);
    _exit(1);
}

/* Arms the watchdog: the process ends at mono_ms() + after_ms unless watchdog_done is called. */
static int watchdog_start(watchdog_t *d, pthread_t *th, worker_t *w, int64_t after_ms)
{
    d->w = w;
    d->done = 0;
    d->deadline_ms = mono_ms() + after_ms;
    atomic_store(&d->stage, "draining");
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca)) return -1;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&d->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc) return -1;
    if (pthread_mutex_init(&d->mu, NULL)) {
        pthread_cond_destroy(&d->cv);
        return -1;
    }
    if (pthread_create(th, NULL, watchdog_main, d)) {
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
        return -1;
    }
    return 0;
}

static void watchdog_stage(watchdog_t *d, worker_t *w, const char *stage)
{
    atomic_store(&d->stage, stage);
    wlog(w, SW_LOG_DEBUG, "shutdown: %s", stage);
}

static void watchdog_done(watchdog_t *d, pthread_t th)
{
    pthread_mutex_lock(&d->mu);
    d->done = 1;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(th, NULL);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
}

int worker_run(worker_t *w, const volatile sig_atomic_t *stop, char *errstr, size_t errlen)
{
    pthread_t th;
    if (pthread_create(&th, NULL, weng_main, w)) {
        snprintf(errstr, errlen, "cannot start the engine thread");
        return -1;
    }
    if (!pthread_getcpuclockid(th, &w->st.eng_clock)) atomic_store(&w->st.eng_alive, 1);
    wpeer_start(w);
    if (!pthread_getcpuclockid(pthread_self(), &w->st.poll_clock)) atomic_store(&w->st.poll_alive, 1);
    if (w->metrics) {
        if (pthread_create(&w->lag_th, NULL, wlag_main, w))
            wlog(w, SW_LOG_WARN, "cannot start the lag thread: /metrics reports no consumer lag");
        else
            w->lag_th_on = 1;
    }
    for (wmodel_t *m = w->models; m; m = m->next)
        wlog(w, SW_LOG_INFO, "model %s: %s (%s), fingerprint %s%s%s", m->name, m->path, m->arch,
             m->fp_hex, strcmp(m->name, w->default_model) ? "" : ", the default",
             m->cache ? ", prefix cache tier 2" : "");
    wlog(w, SW_LOG_INFO, "started: model %s, group %s, input %s -> %s (DLQ %s), %s",
         w->default_model, w->cfg.group_id, w->cfg.input_topics, w->cfg.output_topic,
         w->cfg.dlq_topic,
         w->cfg.delivery == WORKER_EOS ? "exactly-once" : "at-least-once");
    w->last_commit_ms = mono_ms();
    w->usage_start_ms = wall_ms();
    while (!(stop && *stop) && !atomic_load(&w->stop_req) && !wfatal_is(w)) {
        if (w->stats_flag && *w->stats_flag) {
            *w->stats_flag = 0;
            worker_log_stats(w);
        }
        if (w->reload_flag && *w->reload_flag && !w->job) {
            *w->reload_flag = 0;
            wmodel_reload_start(w);
        }
        wmodel_reload_finish(w);
        wover_flow_control(w);
        wfwd_tick(w);
        pthread_mutex_lock(&w->mu);
        int have_out = w->outbox != NULL;
        pthread_mutex_unlock(&w->mu);
        int64_t t0 = mono_ns();
        atomic_store(&w->st.last_poll_ms, mono_ms());
        rd_kafka_message_t *m = consumer_poll(w->cons, have_out ? 0 : w->cfg.poll_ms);
        add_since(&w->st.ns_poll, t0);
        if (m) wadmit_intake(w, m);
        t0 = mono_ns();
        wout_drain(w);
        producer_poll(w->prod, 0);
        if (w->aux) producer_poll(w->aux, 0);
        t0 = add_since(&w->st.ns_produce, t0);
        wout_periodic_commit(w, 0);
        add_since(&w->st.ns_commit, t0);
        wout_usage_records(w, 0);
        wout_throughput_tick(w);
        char e[512];
        if (producer_fatal(w->prod, e, sizeof e)) wout_producer_fatal(w, e);
        atomic_store(&w->st.inflight, consumer_pending(w->cons));
        int n_assigned = consumer_n_assigned(w->cons);
        if (atomic_exchange(&w->st.assigned, n_assigned) != n_assigned) wlag_kick(w);
    }

    /* drain: stop intake, finish what is in flight, commit; a load in progress is abandoned */
    if (w->job) {
        if (w->job->started) pthread_join(w->job->th, NULL);
        wmodel_job_free(w->job);
        w->job = NULL;
    }
    int fatal = wfatal_is(w);
    watchdog_t wd;
    pthread_t wd_th;
    int wd_on = !watchdog_start(&wd, &wd_th, w,
                                (fatal ? 0 : (int64_t)w->cfg.drain_timeout_ms) +
                                    w->cfg.shutdown_timeout_ms);
    if (!wd_on) wlog(w, SW_LOG_WARN, "cannot start the shutdown watchdog: shutdown is not bounded");
    if (!fatal) {
        int pending = consumer_pending(w->cons);
        wlog(w, SW_LOG_INFO, "draining %d in-flight request(s) (up to %d ms)", pending,
             w->cfg.drain_timeout_ms);
        consumer_pause(w->cons);
        int64_t end = mono_ms() + w->cfg.drain_timeout_ms;
        while (consumer_pending(w->cons) > 0 && mono_ms() < end && !wfatal_is(w)) {
            rd_kafka_message_t *m = consumer_poll(w->cons, 5);
            if (m) rd_kafka_message_destroy(m); /* paused: not accepted, not tracked */
            wout_drain(w);
            producer_poll(w->prod, 5);
            wout_periodic_commit(w, 0);
        }
        wout_drain(w);
        if (w->cfg.delivery == WORKER_EOS) {
            wout_txn_commit(w);
        } else {
            producer_flush(w->prod, 5000);
            producer_poll(w->prod, 0);
        }
        if (consumer_pending(w->cons) > 0)
            wlog(w, SW_LOG_WARN, "drain timeout: %d request(s) left uncommitted",
                 consumer_pending(w->cons));
        fatal = wfatal_is(w);
    }
    if (wd_on) watchdog_stage(&wd, w, "aborting the open transaction");
    if (w->cfg.delivery == WORKER_EOS && w->txn_open) {
        char e[256];
        producer_txn_abort(w->prod, 5000, e, sizeof e);
        w->txn_open = 0;
    }
    /* leave the group (final commit in at-least-once; what is left is dropped, i.e. cancelled),
     * then free every request: each holds a consumed message, and librdkafka's destroy of the
     * consumer waits for all of them to be destroyed (a fatal error or a drain timeout used to
     * leave some in the engine or the retry list, and the worker hung in consumer_close) */
    wout_usage_records(w, 1); /* the last period, up to the last output counted */
    if (wd_on) watchdog_stage(&wd, w, "leaving the consumer group");
    consumer_leave(w->cons);
    wpeer_stop(w); /* its requests go to the inbox */
    if (wd_on) watchdog_stage(&wd, w, "stopping the engine thread");
    pthread_mutex_lock(&w->mu);
    w->eng_stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(th, NULL);
    /* a fatal error stopped the engine thread with requests still in the engine: consumer_leave
     * has dropped (cancelled) them, and the engine is this thread's now; their offsets stay
     * uncommitted */
    if (wd_on) watchdog_stage(&wd, w, "cancelling requests left in the engine");
    while (w->n_active > 0) {
        wreq_t *r = w->active[w->n_active - 1];
        atomic_store(&r->cancelled, 1);
        if (weng_cancel(w, r)) { /* unknown to the engine: free it */
            weng_active_remove(w, r);
            wreq_free(w, r);
        }
    }
    /* anything still queued is dropped */
    pthread_mutex_lock(&w->mu);
    wreq_t *list = w->outbox;
    w->outbox = w->outbox_tail = NULL;
    wreq_t *in = w->inbox;
    w->inbox = w->inbox_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    for (wreq_t *lists[4] = {list, in, w->retry, w->held}, **l = lists; l < lists + 4; l++)
        while (*l) {
            wreq_t *r = *l;
            *l = r->next;
            wreq_free(w, r);
        }
    w->retry = NULL;
    w->held = NULL;
    if (wd_on) watchdog_stage(&wd, w, "closing the producer");
    producer_free(w->prod, 5000); /* delivery reports now free without acking */
    w->prod = NULL;
    producer_free(w->aux, 5000);
    w->aux = NULL;
    if (wd_on) watchdog_stage(&wd, w, "closing the consumer");
    wlag_thread_stop(w);
    pthread_mutex_lock(&w->cons_mu);
    consumer_close(w->cons);
    w->cons = NULL;
    pthread_mutex_unlock(&w->cons_mu);
    if (wd_on) watchdog_done(&wd, wd_th);
    atomic_store(&w->st.poll_cpu_ns, thread_cpu_ns(CLOCK_THREAD_CPUTIME_ID));
    atomic_store(&w->st.poll_alive, 0);
    worker_log_stats(w);
    worker_stats_t st;
    worker_stats(w, &st);
    wlog(w, SW_LOG_INFO,
         "stopped: %" PRIu64 " consumed, %" PRIu64 " results (%" PRIu64 " expired), %" PRIu64
         " DLQ, %" PRIu64 " dropped",
         st.consumed, st.results, st.expired, st.dlq, st.revoked_dropped);
    if (fatal) {
        pthread_mutex_lock(&w->mu);
        snprintf(errstr, errlen, "%s", w->fatal_msg);
        pthread_mutex_unlock(&w->mu);
        wlog(w, SW_LOG_ERROR, "fatal: %s", errstr);
        return -1;
    }
    return 0;
}

void worker_free(worker_t *w)
{
    if (!w) return;
    metrics_server_free(w->metrics); /* first: its thread reads everything below */
    w->metrics = NULL;
    wfwd_free(w);
    if (w->cons) consumer_close(w->cons);
    w->cons = NULL;
    if (w->prod) producer_free(w->prod, 0);
    producer_free(w->aux, 0);
    while (w->models) {
        wmodel_t *m = w->models;
        w->models = m->next;
        wmodel_free(m);
    }
    free(w->snap);
    usage_free(w->usage);
    free(w->active);
    for (int i = 0; i < w->n_reply_allow; i++) free(w->reply_allow[i]);
    free(w->reply_allow);
    claims_free(w->claims);
    free(w->class_names);
    free(w->classes);
    free(w->prop_c_keys);
    free(w->prop_c_vals);
    free(w->prop_p_keys);
    free(w->prop_p_vals);
    for (wsent_t *e = w->refused, *nx; e; e = nx) {
        nx = e->next;
        free(e);
    }
    worker_config_free(&w->cfg);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->cons_mu);
    pthread_mutex_destroy(&w->models_mu);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->lag_mu);
    pthread_cond_destroy(&w->lag_cv);
    free(w);
}

void worker_stats(const worker_t *w, worker_stats_t *st)
{
    worker_t *m = (worker_t *)w; /* atomics are read-only here */
    memset(st, 0, sizeof *st);
    st->consumed = atomic_load(&m->st.consumed);
    st->results = atomic_load(&m->st.results);
    st->dlq = atomic_load(&m->st.dlq);
    st->expired = atomic_load(&m->st.expired);
    st->produce_retries = atomic_load(&m->st.produce_retries);
    st->txn_commits = atomic_load(&m->st.txn_commits);
    st->txn_aborts = atomic_load(&m->st.txn_aborts);
    st->producer_restarts = atomic_load(&m->st.producer_restarts);
    st->producer_fences = atomic_load(&m->st.producer_fences);
    st->commits = atomic_load(&m->st.commits);
    st->pauses = atomic_load(&m->st.pauses);
    st->resumes = atomic_load(&m->st.resumes);
    st->prompt_tokens = atomic_load(&m->st.prompt_tokens);
    st->completion_tokens = atomic_load(&m->st.completion_tokens);
    st->cached_tokens = atomic_load(&m->st.cached_tokens);
    st->revoked_dropped = atomic_load(&m->st.dropped);
    st->ttft_n = atomic_load(&m->st.ttft_n);
    st->ttft_ms_sum = (double)atomic_load(&m->st.ttft_us_sum) * 1e-3;
    st->inflight = atomic_load(&m->st.inflight);
    st->assigned = atomic_load(&m->st.assigned);
    st->ns_poll = atomic_load(&m->st.ns_poll);
    st->ns_intake = atomic_load(&m->st.ns_intake);
    st->ns_parse = atomic_load(&m->st.ns_parse);
    st->ns_tokenize = atomic_load(&m->st.ns_tokenize);
    st->ns_produce = atomic_load(&m->st.ns_produce);
    st->ns_commit = atomic_load(&m->st.ns_commit);
    st->ns_submit = atomic_load(&m->st.ns_submit);
    st->ns_step = atomic_load(&m->st.ns_step);
    st->ns_result = atomic_load(&m->st.ns_result);
    st->ns_idle = atomic_load(&m->st.ns_idle);
    st->ns_queue_sum = atomic_load(&m->st.ns_queue_sum);
    st->ns_inbox_sum = atomic_load(&m->st.ns_inbox_sum);
    int64_t t_first = atomic_load(&m->st.t_first), t_last = atomic_load(&m->st.t_last);
    st->ns_busy = t_first && t_last > t_first ? (uint64_t)(t_last - t_first) : 0;
    int64_t cpu = -1;
    if (atomic_load(&m->st.poll_alive)) cpu = thread_cpu_ns(m->st.poll_clock);
    if (cpu < 0) cpu = atomic_load(&m->st.poll_cpu_ns);
    st->poll_cpu_s = cpu > 0 ? (double)cpu * 1e-9 : 0;
    cpu = -1;
    if (atomic_load(&m->st.eng_alive)) cpu = thread_cpu_ns(m->st.eng_clock);
    if (cpu < 0) cpu = atomic_load(&m->st.eng_cpu_ns);
    st->engine_cpu_s = cpu > 0 ? (double)cpu * 1e-9 : 0;
    st->kv_blocks_used = atomic_load(&m->st.kv_used);
    st->kv_blocks_total = atomic_load(&m->st.kv_total);
    st->tier1_lookups = atomic_load(&m->st.t1_lookups);
    st->tier1_hits = atomic_load(&m->st.t1_hits);
    st->tier1_evictions = atomic_load(&m->st.t1_evictions);
    st->tier2_lookups = atomic_load(&m->st.t2_lookups);
    st->tier2_hits = atomic_load(&m->st.t2_hits);
    st->tier2_stores = atomic_load(&m->st.t2_stores);
    st->prefix_deferred = atomic_load(&m->st.deferred);
    st->prefix_mismatches = atomic_load(&m->st.mismatches);
    st->arena_slots = st->arena_used = -1;
    st->redis_up = -1;
    /* tier 2: the cache of the newest version that has one (the default model's) */
    pthread_mutex_lock(&m->models_mu);
    for (const wmodel_t *v = m->models; v; v = v->next) {
        if (!v->cache) continue;
        cache_stats_t cs;
        cache_stats(v->cache, &cs);
        st->arena_slots = cs.arena_slots;
        st->arena_used = cs.arena_used;
        st->arena_refused += (uint64_t)cs.arena_refused;
        st->redis_up = cs.redis_up;
        st->tier2_evictions = cs.evictions;
        st->tier2_torn = cs.misses_torn;
        st->redis_errors = cs.redis_errors;
        st->peer_fetches = cs.peer_fetches;
        st->peer_blocks = cs.peer_blocks;
        st->peer_bytes = cs.peer_bytes;
        st->peer_recompute = cs.peer_recompute;
        st->peer_served = cs.peer_served;
        st->peer_refused = cs.peer_refused;
        memcpy(st->peer_fail, cs.peer_fail, sizeof st->peer_fail);
        st->peer_prefill_tps = cs.peer_prefill_tps;
    }
    pthread_mutex_unlock(&m->models_mu);
}
