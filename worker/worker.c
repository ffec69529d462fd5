/* worker/worker.c: the worker's main loop.
 *
 * Two threads:
 *  - the poll thread (the caller of worker_run) owns the consumer and every Kafka call that
 *    needs one thread: it polls messages, parses them (request_parse), renders chat messages and
 *    tokenises prompts (engine_chat_render and engine_tokenize only read the immutable
 *    tokenizer and model metadata, so they may run beside engine_step), produces every output
 *    (results and DLQ records), serves delivery reports, commits offsets or transactions,
 *    pauses/resumes partitions and handles rebalances. It never waits on inference. Knowing
 *    each request's token count before the engine sees it lets it bound the tokens in flight
 *    (max.inflight.tokens) as well as the messages and bytes.
 *  - the engine thread owns the engine_t's scheduler: it takes tokenised requests from the
 *    inbox, submits them, runs engine_step and turns each finished request into an output that
 *    it puts in the outbox.
 * inbox and outbox are FIFO lists under w->mu; the engine thread waits on w->cv for work and
 * wakes the poll thread with consumer_wake when it adds to the outbox.
 *
 * Ownership of one message (wreq_t r): created by the poll thread, which tracks it in the
 * consumer (consumer_track). Then, in turn: the inbox, the engine thread, the outbox, and the
 * poll thread again, which produces r->out. At-least-once: librdkafka holds r (the record's
 * opaque) until the delivery report, whose handler acks the offset and frees r; a failed
 * delivery is retried. Exactly-once: r is acked and freed as soon as its record is in the open
 * transaction. r->msg (the rd_kafka_message_t) is destroyed exactly once, in wreq_free.
 * Cancellation: the poll thread sets r->cancelled (atomic) when r's partition is revoked or
 * rewound or the drain times out, and forgets r; whoever holds r next frees it without output. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <sodium.h>

#include "cache/cache.h"
#include "consumer/consumer.h"
#include "engine/engine.h"
#include "producer/producer.h"
#include "worker/claims.h"
#include "worker/metrics.h"
#include "worker/usage.h"
#include "worker/worker.h"

static const char *const LEVEL_NAME[] = {"ERROR", "WARN", "INFO", "DEBUG"};

#define N_FINISH 5

/* One loaded version of a model (README "Models"). Created by worker_new or by the reload
 * thread (model_load), put in w->models by the poll thread (model_install). Its engine's
 * scheduler belongs to the engine thread; the poll thread only tokenises with it (immutable
 * tokenizer) for requests that hold a reference. A version replaced by a reload (or no longer
 * configured) is retired: intake no longer routes to it, the requests it already holds finish on
 * it, and once it holds none the engine thread unlinks and frees it (model_gc). */
typedef struct wmodel wmodel_t;
struct wmodel {
    wmodel_t *next;              /* w->models, under w->models_mu */
    char name[65];
    char path[1024];
    engine_t *eng;               /* owned */
    cache_t *cache;              /* owned: tier 2, or NULL; freed after eng, which calls it */
    uint64_t fingerprint;        /* engine_info: hash of the weights; names its KV blocks */
    char fp_hex[17];
    char arch[32];
    int32_t bos;                 /* -1 none */
    dev_t dev;                   /* the file when loaded: a reload of an unchanged file keeps */
    ino_t ino;                   /* this version */
    off_t size;
    time_t mtime;
    atomic_int refs;             /* requests routed here and not yet released (model_release) */
    atomic_int retired;          /* set once, by the poll thread under w->models_mu */
    int n_active;                /* engine thread: requests submitted to eng */
};

typedef struct wreq wreq_t;
struct wreq {
    wreq_t *next;                /* link in the inbox, outbox or retry list */
    rd_kafka_message_t *msg;     /* owned: destroyed in wreq_free */
    consumer_ticket_t ticket;
    request_t req;
    int parsed;                  /* req is filled (request_free in wreq_free) */
    int64_t t_intake;            /* monotonic ns when polled */
    size_t bytes;                /* counted against max.inflight.bytes */
    int32_t *toks;               /* owned: the prompt's token ids (NULL: req.input_ids) */
    int n_toks;
    wmodel_t *model;             /* holds a reference (model_release) while non-NULL */
    long cost;                   /* prompt tokens + max_tokens, counted against
                                    max.inflight.tokens (0 when never given to the engine) */
    atomic_int cancelled;        /* set by the poll thread only */
    /* engine thread */
    uint64_t engine_id;
    int active_ix;               /* index in w->active, -1 when not submitted */
    int expire;                  /* cancelled because the deadline passed */
    /* the output: a result (out = JSON) or a DLQ record (out NULL: the original bytes) */
    int is_dlq;
    const char *dlq_code;        /* REQ_ERR_* (static) */
    char dlq_msg[256];
    int truncated;               /* the dead letter carries dlq.truncate_bytes of the value */
    int attempts;                /* permanent refusals of the output in its present form */
    int lost;                    /* no output could be delivered: acknowledged without one */
    char *out;                   /* malloc'd JSON */
    size_t out_len;
    int expired;                 /* result is finish_reason "expired" */
    const char *finish;          /* finish_reason (static), NULL for a DLQ record */
    int n_prompt, n_completion, n_cached;
    int64_t compute_ns;          /* the engine's compute share (engine_result_t.compute_ns) */
    double ttft_ms;              /* < 0 none */
    double itl_s;                /* mean time between generated tokens; < 0 none */
    int64_t queue_ns;            /* intake to the first scheduled step (or to the result) */
    int64_t retry_at_ms;         /* retry list: next attempt (monotonic ms) */
    /* streaming ("stream": true with stream.topic set): chunks of the text that is final so
     * far, by whichever thread holds r (engine thread while it runs) */
    size_t stream_sent;          /* bytes of the text already in chunks */
    int stream_seq;              /* seq of the next chunk */
    int stream_tokens;           /* generated tokens at the last chunk */
    int64_t stream_ns;           /* monotonic ns of the last chunk (or of the submission) */
    /* service class (poll thread sets at intake) */
    int cls;                     /* index in w->classes */
    int is_shed;                 /* the output is the original message, to the deferral topic */
    int capped_from;             /* max_tokens before the cap of step 2; 0 = not capped */
    double wait_ms;              /* Kafka timestamp to intake, >= 0 */
};

typedef struct {
    atomic_uint_fast64_t consumed, results, dlq, expired, produce_retries, txn_commits, txn_aborts,
        commits, pauses, resumes, prompt_tokens, completion_tokens, cached_tokens, dropped, ttft_n,
        ttft_us_sum, producer_restarts;
    atomic_int inflight, assigned;
    /* phase times, ns (worker_stats_t); each is added to by one thread only */
    atomic_uint_fast64_t ns_poll, ns_intake, ns_parse, ns_tokenize, ns_produce, ns_commit,
        ns_submit, ns_step, ns_result, ns_idle, ns_queue_sum, ns_inbox_sum;
    atomic_int_fast64_t t_first, t_last; /* monotonic ns: first accepted, last durable; 0 none */
    /* thread CPU time: live through the clock ids while the thread runs, else the final value */
    atomic_int poll_alive, eng_alive;
    clockid_t poll_clock, eng_clock;
    atomic_int_fast64_t poll_cpu_ns, eng_cpu_ns;
    /* prefix cache, copied from engine_stats after each step (engine thread) */
    atomic_uint_fast64_t t1_lookups, t1_hits, t1_evictions, t2_lookups, t2_hits, t2_stores,
        deferred, mismatches;
    atomic_int kv_used, kv_total;
    atomic_int eng_running, eng_waiting, paused;
    /* models: versions loaded now (retired ones draining included); reloads */
    atomic_int models_loaded;
    atomic_uint_fast64_t model_swaps, reloads_ok, reloads_failed;
    atomic_int inbox_n;                       /* requests in the inbox (not yet in the engine) */
    atomic_int_fast64_t last_poll_ms;         /* monotonic ms of the poll loop's last turn */
    /* metrics (worker/metrics.h): histograms observed by the poll thread */
    metrics_hist_t h_ttft, h_itl, h_e2e, h_queue, h_commit;
    atomic_uint_fast64_t finish_n[N_FINISH];  /* by FINISH_NAMES */
    /* overload steps (poll thread writes) */
    atomic_int ov_level, ov_pressure;        /* step 0..3; pressure in percent */
    atomic_uint_fast64_t ov_shed, ov_capped, ov_refused, ov_steps_up, ov_steps_down,
        class_expired;
    /* dead letters by reason: code pointers (REQ_ERR_*, static) set once by the poll thread */
    _Atomic(const char *) dlq_code[32];
    atomic_uint_fast64_t dlq_n[32];
    /* autoscaling estimates (doubles as bits; written by the poll thread only):
     * tokens per message: exponential moving average of prompt + completion tokens per
     * result (NaN before the first result); throughput: of tokens finished per second over the
     * seconds in which the engine had requests waiting (NaN before the first such second) */
    atomic_uint_fast64_t tok_per_msg_bits, tput_bits;
    atomic_uint_fast64_t cost_sum, cost_n;    /* prompt + max_tokens of accepted requests */
    /* side producer (stream chunks): records acknowledged / not queued or not delivered */
    atomic_uint_fast64_t chunks_ok, chunks_failed;
    /* outputs refused with a permanent error; dead letters cut to dlq.truncate_bytes; messages
     * acknowledged without any output (their dead letter could not be delivered either) */
    atomic_uint_fast64_t out_permanent, dlq_truncated, out_lost;
} stats_t;

/* The form of an output and its permanent refusals so far (output_refused). */
typedef struct {
    int is_dlq, is_shed, truncated, attempts, lost;
    const char *dlq_code;        /* REQ_ERR_* (static) */
    char dlq_msg[256];
} wfate_t;

/* Exactly-once: the delivery-report opaque of one output record (owned by librdkafka until its
 * report), naming its source message and its form; after a refusal, an entry of w->refused, so
 * that the message, consumed again after the transaction's abort, is sent in its next form. */
typedef struct wsent wsent_t;
struct wsent {
    wsent_t *next;               /* in w->refused */
    int32_t partition;
    int64_t offset;
    wfate_t fate;
    char topic[];                /* the source topic */
};

static const char *const FINISH_NAMES[N_FINISH] = {"stop", "length", "abort", "expired",
                                                    "overloaded"};

struct worker {
    worker_config_t cfg;
    request_limits_t limits;
    char worker_id[128];
    char worker_id_json[256];    /* worker_id escaped for JSON logs */
    int log_json;                /* log.format = json */
    int tier2;                   /* prefix cache tier 2 configured (cache.redis.host) */
    pthread_mutex_t models_mu;   /* guards the models list and each retired flag */
    wmodel_t *models;            /* loaded versions, current and retired (draining) */
    char default_model[65];      /* poll thread: name of a request without "model" */
    int models_gc;               /* under mu: a retired version may be freeable */
    /* engine thread: counters of freed versions, added to the live engines' (stats) */
    engine_stats_t gone;
    wmodel_t **snap;             /* engine thread: the list, copied each turn */
    int cap_snap;
    /* reload (SIGHUP): the poll thread starts a loader thread and installs what it loaded */
    volatile sig_atomic_t *reload_flag;
    worker_reload_fn reload_fn;
    void *reload_arg;
    struct reload_job *job;      /* poll thread: the load in progress, or NULL */
    consumer_t *cons;
    producer_t *prod;
    producer_t *aux;             /* side producer, not transactional: stream chunks and usage
                                    records (best effort); NULL when neither topic is set */
    usage_t *usage;              /* per-tenant accounting (any thread) */
    int64_t usage_start_ms;      /* poll thread: wall-clock start of the current usage period */
    int64_t tput_t_ms;           /* poll thread: start of the current throughput second ... */
    uint64_t tput_tokens;        /* ... and the finished tokens at its start */
    uint64_t tput_idle;          /* ... the engine thread's idle ns at its start ... */
    int tput_idle_open;          /* ... and whether it had nothing to do then */
    metrics_server_t *metrics;   /* the endpoint, or NULL (metrics.port 0) */
    /* consumer lag cache: the lag thread (started by worker_run when the endpoint is on) asks
     * the broker every metrics.lag_refresh_ms and when the assignment changes; /metrics reads
     * the cache, so a scrape makes no broker round trip. */
    pthread_t lag_th;
    int lag_th_on;               /* the lag thread runs (worker_run's thread starts, joins it) */
    pthread_mutex_t lag_mu;      /* guards lag_* below; never held across a broker call */
    pthread_cond_t lag_cv;       /* (CLOCK_MONOTONIC) lag thread: lag_stop or lag_kick set */
    int lag_stop, lag_kick;
    int lag_n;                   /* entries of lag_cache from the last good refresh; -1 none */
    int64_t lag_ms;              /* mono_ms of that refresh */
    consumer_lag_t lag_cache[256];
    consumer_lag_t lag_tmp[256]; /* lag thread only: the refresh in progress */
    atomic_uint_fast64_t lag_ok, lag_failed; /* refreshes by outcome */
    atomic_int started;          /* worker_new has finished: the metrics thread may read w */
    char **reply_allow;          /* [n_reply_allow] reply.topics, split (owned) */
    claims_t *claims;            /* the claims key (owned; read-only); NULL = unchecked */
    int n_reply_allow;
    char **prop_c_keys, **prop_c_vals, **prop_p_keys, **prop_p_vals; /* pass-through split */
    int n_prop_c, n_prop_p;

    pthread_mutex_t mu;          /* guards inbox, outbox, eng_stop, fatal */
    pthread_mutex_t cons_mu;     /* held by other threads while they use cons (worker_stop, the
                                    metrics thread), and by the poll thread to close it */
    pthread_cond_t cv;           /* engine thread: inbox or eng_stop changed */
    wreq_t *inbox, *inbox_tail;
    wreq_t *outbox, *outbox_tail;
    int eng_stop;
    int fatal;
    char fatal_msg[512];
    atomic_int stop_req;

    /* engine thread only */
    wreq_t **active;
    int n_active, cap_active;

    /* poll thread only */
    wreq_t *retry;               /* outputs whose produce failed, to send again */
    wsent_t *refused;            /* exactly-once: messages whose output was refused (newest
                                    first, at most REFUSED_MAX) */
    wreq_t *held;                /* exactly-once: outputs waiting for an earlier message of their
                                    partition to be in a transaction; by (ticket.gen, offset) */
    long inflight_bytes;
    long inflight_tokens;        /* sum of cost over accepted, unacknowledged requests */
    int32_t bos;                 /* the model's BOS id, -1 none */
    /* service classes (read-only after worker_new) */
    worker_class_t *classes;
    int n_classes, top_class, low_class, default_class;
    /* overload steps (poll thread only) */
    int ov_level;                /* 0 none, 1 shed, 2 cap, 3 refuse */
    int64_t ov_below_since_ms;   /* pressure under the current step's threshold since; 0 = not */
    double top_ttft_ewma_ms;     /* top class: wait_ms + ttft_ms, exponentially averaged */
    int64_t top_ttft_at_ms;      /* when it was last updated (monotonic ms); 0 = never */
    double wait_ewma_ms;         /* wait_ms of messages from topics other than the deferral one */
    int64_t wait_at_ms;          /* when it was last updated; 0 = never */
    int64_t top_seen_ms;         /* a top-class message last arrived (monotonic ms); 0 = never */
    volatile sig_atomic_t *stats_flag;
    int txn_open;
    int64_t txn_start_ms, last_commit_ms;
    stats_t st;
};

/* ---- small helpers ---- */

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int64_t mono_ms(void) { return mono_ns() / 1000000; }

/* Adds the ns since t0 to counter c and returns now. */
static int64_t add_since(atomic_uint_fast64_t *c, int64_t t0)
{
    int64_t now = mono_ns();
    atomic_fetch_add_explicit(c, (uint64_t)(now - t0), memory_order_relaxed);
    return now;
}

static double bits_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}
static uint64_t double_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}
/* One sample into the exponential moving average stored in *bits (NaN: none yet), over about
 * n samples (alpha = 2 / (n + 1)). One writer. */
static void ewma_add(atomic_uint_fast64_t *bits, double x, int n)
{
    double m = bits_double(atomic_load(bits)), a = 2.0 / (n + 1.0);
    atomic_store(bits, double_bits(isnan(m) ? x : m + a * (x - m)));
}

static int64_t thread_cpu_ns(clockid_t id)
{
    struct timespec ts;
    if (clock_gettime(id, &ts)) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *const LEVEL_JSON[] = {"error", "warn", "info", "debug"};

/* Writes s into dst as the inside of a JSON string (quotes, backslashes and control characters
 * escaped; UTF-8 passes through), truncated to fit. */
static void json_escape(char *dst, size_t cap, const char *s)
{
    size_t j = 0;
    for (; *s && j + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            dst[j++] = '\\';
            dst[j++] = (char)ch;
        } else if (ch == '\n') {
            dst[j++] = '\\';
            dst[j++] = 'n';
        } else if (ch < 0x20) {
            j += (size_t)snprintf(dst + j, cap - j, "\\u%04x", ch);
        } else {
            dst[j++] = (char)ch;
        }
    }
    dst[j] = 0;
}

static void wlog(worker_t *w, int level, const char *fmt, ...)
{
    if (level > w->cfg.log_level) return;
    char buf[1024], ts[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    if (w->log_json) {
        char msg[2 * sizeof buf];
        json_escape(msg, sizeof msg, buf);
        fprintf(stderr,
                "{\"ts\":\"%s.%03dZ\",\"level\":\"%s\",\"worker\":\"%s\",\"msg\":\"%s\"}\n", ts,
                (int)(tv.tv_usec / 1000), LEVEL_JSON[level & 3], w->worker_id_json, msg);
        return;
    }
    fprintf(stderr, "%s.%03dZ spillway[%s] %s %s\n", ts, (int)(tv.tv_usec / 1000), w->worker_id,
            LEVEL_NAME[level & 3], buf);
}

static void hook_log(void *arg, int level, const char *msg) { wlog(arg, level, "%s", msg); }

static void hook_committed(void *arg, int ok, int64_t ns)
{
    worker_t *w = arg;
    if (ok) metrics_hist_observe(&w->st.h_commit, (double)ns * 1e-9);
}

static void set_fatal(worker_t *w, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&w->mu);
    if (!w->fatal) {
        w->fatal = 1;
        snprintf(w->fatal_msg, sizeof w->fatal_msg, "%s", buf);
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static int is_fatal(worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    int f = w->fatal;
    pthread_mutex_unlock(&w->mu);
    return f;
}

static void model_release(worker_t *w, wreq_t *r);

static void wreq_free(worker_t *w, wreq_t *r)
{
    if (!r) return;
    model_release(w, r);
    if (r->parsed) request_free(&r->req);
    if (r->msg) rd_kafka_message_destroy(r->msg);
    free(r->toks);
    free(r->out);
    free(r);
}

/* ---- models ---- */

/* Drops r's reference to its model (any thread); the last one of a retired version asks the
 * engine thread to free it. */
static void model_release(worker_t *w, wreq_t *r)
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
static wmodel_t *model_acquire(worker_t *w, const char *name)
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
    ec->threads = w->cfg.threads;
    ec->max_seqs = w->cfg.max_seqs;
    ec->max_batch_tokens = w->cfg.max_batch_tokens;
    ec->kv_blocks = w->cfg.kv_blocks;
    ec->kv_mem_mb = w->cfg.kv_mem_mb;
    ec->kv_type = w->cfg.kv_type;
    ec->block_tokens = w->cfg.block_tokens;
    ec->max_ctx = w->cfg.max_ctx;
    ec->prefix_cache = w->cfg.prefix_cache;
    ec->sched_window = w->cfg.sched_window;
    ec->sched_aging_ms = w->cfg.sched_aging_ms;
    ec->sched_urgent_ms = w->cfg.sched_urgent_ms;
}

static void model_free(wmodel_t *m)
{
    if (!m) return;
    if (m->eng) engine_free(m->eng);
    cache_free(m->cache); /* after the engine, which calls it */
    free(m);
}

static void hook_log(void *arg, int level, const char *msg);

/* Loads spec's model: its engine, and tier 2 of the prefix cache when with_tier2 (the cache is
 * named by the engine's kv_seed, which hashes the model fingerprint: versions never share KV).
 * Any thread (reads w->cfg only). NULL + errstr on failure. */
static wmodel_t *model_load(worker_t *w, const worker_model_spec_t *spec, int with_tier2,
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
    sodium_memzero(secret, sizeof secret);
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
        kc.log_level = w->cfg.log_level;
        kc.log_fn = hook_log;
        kc.log_arg = w;
        cache_geometry_t geo = {.seed = info.kv_seed, .block_tokens = info.block_tokens,
                                .block_bytes = info.kv_block_bytes};
        m->cache = cache_new(&kc, &geo, errstr, errlen);
        if (!m->cache) goto fail;
        engine_kv_tier_t tier;
        cache_engine_tier(m->cache, &tier);
        if (engine_set_kv_tier(m->eng, &tier, errstr, errlen)) goto fail;
    }
    return m;
fail:
    model_free(m);
    return NULL;
}

/* Any thread: hands a finished output to the poll thread. */
static void outbox_push(worker_t *w, wreq_t *r)
{
    r->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->outbox_tail) w->outbox_tail->next = r;
    else w->outbox = r;
    w->outbox_tail = r;
    pthread_mutex_unlock(&w->mu);
    if (w->cons) consumer_wake(w->cons);
}

/* Marks r as a dead letter (the original message goes to the DLQ topic). */
static void make_dlq(wreq_t *r, const char *code, const char *msg)
{
    r->is_dlq = 1;
    r->dlq_code = code;
    snprintf(r->dlq_msg, sizeof r->dlq_msg, "%s", msg);
    free(r->out);
    r->out = NULL;
}

static double ms_between(int64_t a_ns, int64_t b_ns) { return (double)(b_ns - a_ns) * 1e-6; }

/* Copies src[0..len) into dst (cap >= 3 * len + 1) with every byte that does not start a
 * complete, valid UTF-8 sequence (truncated, overlong, surrogate, > U+10FFFF) replaced by
 * U+FFFD; NUL-terminates. Returns the output length. */
static size_t utf8_sanitize(const unsigned char *src, size_t len, char *dst)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        unsigned c = src[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = n > 0 && i + n <= len && (n != 2 || c >= 0xC2);
        for (size_t k = 1; ok && k < n; k++) ok = (src[i + k] & 0xC0) == 0x80;
        if (ok && n == 3) {
            unsigned v = (c & 0x0F) << 12 | (src[i + 1] & 0x3Fu) << 6;
            ok = v >= 0x800 && (v < 0xD800 || v > 0xDFFF);
        } else if (ok && n == 4) {
            unsigned v = (c & 0x07) << 18 | (src[i + 1] & 0x3Fu) << 12;
            ok = v >= 0x10000 && v <= 0x10FFFF;
        }
        if (!ok) {
            memcpy(dst + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
            continue;
        }
        memcpy(dst + o, src + i, n);
        o += n;
        i += n;
    }
    dst[o] = 0;
    return o;
}

/* {"id", "text", "logprob"} of one token (top-level entries get "top_logprobs" added by the
 * caller). A logprob of -inf (a token the model gives no chance) is written as -9999, as
 * OpenAI's API does. NULL on out of memory. */
static json_t *logprob_entry(engine_t *eng, const engine_logprob_t *lp)
{
    char piece[256], text[3 * sizeof piece + 1];
    int n = engine_token_to_piece(eng, lp->id, piece, sizeof piece);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof piece) n = (int)sizeof piece;
    utf8_sanitize((const unsigned char *)piece, (size_t)n, text);
    double v = isfinite(lp->logprob) ? (double)lp->logprob : -9999.0;
    return json_pack("{s:i, s:s, s:f}", "id", (int)lp->id, "text", text, "logprob", v);
}

/* The result's "logprobs" array (schemas/result.schema.json): one entry per generated token.
 * NULL on out of memory. */
static json_t *logprobs_json(engine_t *eng, const engine_result_t *er)
{
    json_t *arr = json_array();
    if (!arr) return NULL;
    for (int i = 0; i < er->n_tokens; i++) {
        json_t *e = logprob_entry(eng, &er->logprobs[i]), *top = json_array();
        if (!e || !top || json_object_set_new(e, "top_logprobs", top)) {
            json_decref(e);
            goto oom;
        }
        for (int j = 0; j < er->n_logprobs; j++) {
            const engine_logprob_t *t = &er->top_logprobs[(size_t)i * (size_t)er->n_logprobs + (size_t)j];
            if (t->id < 0) continue; /* fewer candidates than asked (tiny vocabulary) */
            if (json_array_append_new(top, logprob_entry(eng, t))) {
                json_decref(e);
                goto oom;
            }
        }
        if (json_array_append_new(arr, e)) goto oom;
    }
    return arr;
oom:
    json_decref(arr);
    return NULL;
}

/* Builds the result JSON of r. er is the engine's result, or NULL for an expired request that
 * was never computed. 0 or -1 (out of memory: r becomes a DLQ record). */
static int make_result(worker_t *w, wreq_t *r, const engine_result_t *er, const char *finish)
{
    int64_t now = mono_ns();
    json_t *o = json_object(), *u = json_object(), *t = json_object(), *in = json_object();
    if (!o || !u || !t || !in) goto oom;
    json_object_set_new(o, "id", json_string(r->req.id));
    if (r->req.correlation_id)
        json_object_set_new(o, "correlation_id", json_string(r->req.correlation_id));
    if (r->req.tenant) json_object_set_new(o, "tenant", json_string(r->req.tenant));
    json_object_set_new(o, "text", er ? json_stringn(er->text, er->text_len) : json_string(""));
    json_object_set_new(o, "finish_reason", json_string(finish));
    r->n_prompt = er ? er->n_prompt : 0;
    r->n_completion = er ? er->n_tokens : 0;
    r->n_cached = er ? er->n_cached : 0;
    r->compute_ns = er ? er->compute_ns : 0;
    json_object_set_new(u, "prompt_tokens", json_integer(r->n_prompt));
    json_object_set_new(u, "cached_tokens", json_integer(r->n_cached));
    json_object_set_new(u, "completion_tokens", json_integer(r->n_completion));
    json_object_set_new(u, "compute_ms", json_real((double)r->compute_ns * 1e-6));
    json_object_set_new(o, "usage", u);
    u = NULL;
    r->queue_ns = (er && er->t_first_scheduled ? er->t_first_scheduled : now) - r->t_intake;
    double queue = (double)r->queue_ns * 1e-6;
    r->ttft_ms = er && er->t_first_token ? ms_between(r->t_intake, er->t_first_token) : -1;
    double decode = er && er->t_first_token ? ms_between(er->t_first_token, er->t_finish) : 0;
    json_object_set_new(t, "queue_ms", json_real(queue));
    json_object_set_new(t, "ttft_ms", json_real(r->ttft_ms >= 0 ? r->ttft_ms : 0));
    json_object_set_new(t, "decode_ms", json_real(decode));
    json_object_set_new(t, "total_ms", json_real(ms_between(r->t_intake, now)));
    json_object_set_new(t, "wait_ms", json_real(r->wait_ms));
    json_object_set_new(o, "timings", t);
    t = NULL;
    json_object_set_new(o, "class", json_string(w->classes[r->cls].name));
    if (r->capped_from) {
        json_t *d = json_pack("{s:s, s:i, s:i}", "step", "cap", "max_tokens", r->req.max_tokens,
                              "requested_max_tokens", r->capped_from);
        if (!d || json_object_set_new(o, "degraded", d)) goto oom;
    }
    json_object_set_new(o, "model", json_string(r->model ? r->model->name : ""));
    if (r->model) json_object_set_new(o, "model_fingerprint", json_string(r->model->fp_hex));
    json_object_set_new(o, "worker", json_string(w->worker_id));
    json_object_set_new(in, "topic", json_string(rd_kafka_topic_name(r->msg->rkt)));
    json_object_set_new(in, "partition", json_integer(r->msg->partition));
    json_object_set_new(in, "offset", json_integer(r->msg->offset));
    json_object_set_new(o, "input", in);
    in = NULL;
    if (r->req.metadata_json) {
        json_t *md = json_loads(r->req.metadata_json, JSON_DECODE_ANY, NULL);
        if (md) json_object_set_new(o, "metadata", md); /* steals md */
    }
    if (er && r->model && r->req.n_logprobs > 0 && er->logprobs) {
        json_t *lp = logprobs_json(r->model->eng, er);
        if (!lp || json_object_set_new(o, "logprobs", lp)) goto oom;
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (!s) goto oom_done;
    free(r->out);
    r->out = s;
    r->out_len = strlen(s);
    r->is_dlq = 0;
    r->expired = !strcmp(finish, "expired");
    r->finish = NULL;
    for (int i = 0; i < N_FINISH; i++)
        if (!strcmp(finish, FINISH_NAMES[i])) r->finish = FINISH_NAMES[i];
    r->itl_s = er && er->n_tokens > 1 && er->t_first_token
                   ? (double)(er->t_finish - er->t_first_token) * 1e-9 / (er->n_tokens - 1)
                   : -1;
    return 0;
oom:
    json_decref(o);
    json_decref(u);
    json_decref(t);
    json_decref(in);
oom_done:
    make_dlq(r, REQ_ERR_RESULT_TOO_LARGE, "out of memory building the result");
    return -1;
}

static int deadline_passed(const wreq_t *r)
{
    return r->req.deadline_ms > 0 && wall_ms() >= r->req.deadline_ms;
}

/* ---- engine thread ---- */

static void active_remove(worker_t *w, wreq_t *r)
{
    int i = r->active_ix;
    if (i < 0) return;
    w->active[i] = w->active[--w->n_active];
    w->active[i]->active_ix = i;
    r->active_ix = -1;
    r->model->n_active--;
}

/* Opaques of the side producer's records, told apart in its delivery reports. */
static const char AUX_CHUNK[] = "chunk";
static const char AUX_USAGE[] = "usage";

/* Publishes one chunk of r's stream (schemas/chunk.schema.json): delta[0..len) follows the
 * text of the previous chunks; finish is NULL, or the finish reason for the last chunk. Best
 * effort and never blocking: when the side producer cannot take it, nothing is sent and the
 * next chunk carries this delta too (the deltas of the chunks sent always concatenate to a
 * prefix of the final text). Thread of whoever holds r. */
static void send_chunk(worker_t *w, wreq_t *r, const char *delta, size_t len, int n_tokens,
                       const char *finish)
{
    char err[256];
    const char *corr = r->req.correlation_id;
    json_t *o = json_object(), *in = json_object();
    if (!o || !in) {
        json_decref(o);
        json_decref(in);
        atomic_fetch_add(&w->st.chunks_failed, 1);
        return;
    }
    json_object_set_new(o, "id", json_string(r->req.id));
    if (corr) json_object_set_new(o, "correlation_id", json_string(corr));
    json_object_set_new(o, "seq", json_integer(r->stream_seq));
    json_object_set_new(o, "text", json_stringn(delta, len));
    json_object_set_new(o, "n_tokens", json_integer(n_tokens));
    json_object_set_new(o, "final", json_boolean(finish != NULL));
    json_object_set_new(o, "best_effort", json_true());
    if (finish) json_object_set_new(o, "finish_reason", json_string(finish));
    json_object_set_new(in, "topic", json_string(rd_kafka_topic_name(r->msg->rkt)));
    json_object_set_new(in, "partition", json_integer(r->msg->partition));
    json_object_set_new(in, "offset", json_integer(r->msg->offset));
    json_object_set_new(o, "input", in); /* steals in */
    char *js = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!js) {
        atomic_fetch_add(&w->st.chunks_failed, 1);
        return;
    }
    rd_kafka_headers_t *h = NULL;
    if (corr) {
        h = rd_kafka_headers_new(1);
        if (h && rd_kafka_header_add(h, WORKER_H_CORRELATION_ID, -1, corr, -1)) {
            rd_kafka_headers_destroy(h);
            h = NULL;
        }
    }
    const char *key = corr ? corr : r->req.id; /* one partition: chunks stay in seq order */
    int rc = producer_send_nowait(w->aux, w->cfg.stream_topic, key, strlen(key), js, strlen(js),
                                  h, (void *)AUX_CHUNK, err, sizeof err); /* h consumed */
    free(js);
    if (rc) {
        atomic_fetch_add(&w->st.chunks_failed, 1);
        wlog(w, 3, "stream chunk %d of %s not sent: %s", r->stream_seq, r->req.id, err);
        return;
    }
    r->stream_sent += len;
    r->stream_seq++;
    r->stream_tokens = n_tokens;
    r->stream_ns = mono_ns();
}

/* The last chunk of a streamed request: the rest of its final text, final: true. */
static void stream_finish(worker_t *w, wreq_t *r, const char *text, size_t len, int n_tokens,
                          const char *finish)
{
    if (!w->aux || !r->parsed || !r->req.stream || len < r->stream_sent) return;
    send_chunk(w, r, text + r->stream_sent, len - r->stream_sent, n_tokens, finish);
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
        send_chunk(w, r, p->text + r->stream_sent, p->text_len - r->stream_sent, p->n_tokens,
                   NULL);
}

/* engine_step / engine_cancel callback, on the engine thread. */
static void on_engine_done(void *arg, const engine_result_t *res)
{
    worker_t *w = arg;
    wreq_t *r = res->user;
    active_remove(w, r);
    if (atomic_load(&r->cancelled)) {
        wreq_free(w, r);
        return;
    }
    const char *finish = r->expire ? "expired" : engine_finish_name(res->finish);
    stream_finish(w, r, res->text, res->text_len, res->n_tokens, finish);
    int64_t t0 = mono_ns();
    make_result(w, r, res, finish);
    add_since(&w->st.ns_result, t0);
    model_release(w, r); /* done with the engine */
    outbox_push(w, r);
}

/* Submits one tokenised request, or finishes it at once (cancelled, expired, refused). */
static void engine_start(worker_t *w, wreq_t *r)
{
    char err[256];
    if (atomic_load(&r->cancelled)) {
        wreq_free(w, r);
        return;
    }
    atomic_fetch_add_explicit(&w->st.ns_inbox_sum, (uint64_t)(mono_ns() - r->t_intake),
                              memory_order_relaxed);
    if (deadline_passed(r)) {
        stream_finish(w, r, "", 0, 0, "expired");
        make_result(w, r, NULL, "expired");
        model_release(w, r);
        outbox_push(w, r);
        return;
    }
    engine_request_t q;
    engine_request_default(&q);
    q.prompt = r->toks ? r->toks : r->req.input_ids;
    q.n_prompt = r->toks ? r->n_toks : r->req.n_input_ids;
    q.max_tokens = r->req.max_tokens;
    q.sampling.temperature = r->req.temperature;
    q.sampling.top_k = r->req.top_k;
    q.sampling.top_p = r->req.top_p;
    q.sampling.min_p = r->req.min_p;
    q.sampling.repeat_penalty = r->req.repeat_penalty;
    q.sampling.presence_penalty = r->req.presence_penalty;
    q.sampling.frequency_penalty = r->req.frequency_penalty;
    if (r->req.has_seed) q.sampling.seed = r->req.seed;
    q.sampling.n_logprobs = r->req.n_logprobs;
    q.stop = (const char *const *)r->req.stop;
    q.n_stop = r->req.n_stop;
    q.priority = w->classes[r->cls].priority * 2001 + r->req.priority;
    /* cache.isolation tenant: a tenant's prefixes are its own (NULL tenant: the shared scope of
     * requests without one) */
    if (strcmp(w->cfg.cache_isolation, "tenant") == 0) q.cache_scope = r->req.tenant;
    q.user = r;
    if (r->req.stream && w->aux) {
        q.progress = on_engine_progress;
        r->stream_ns = mono_ns();
    }
    if (w->n_active == w->cap_active) {
        int cap = w->cap_active ? w->cap_active * 2 : 64;
        wreq_t **a = realloc(w->active, sizeof *a * (size_t)cap);
        if (!a) {
            make_dlq(r, REQ_ERR_BAD_PARAM, "out of memory");
            model_release(w, r);
            outbox_push(w, r);
            return;
        }
        w->active = a;
        w->cap_active = cap;
    }
    r->active_ix = w->n_active;
    w->active[w->n_active++] = r;
    r->model->n_active++;
    if (engine_submit(r->model->eng, &q, on_engine_done, w, &r->engine_id, err, sizeof err)) {
        active_remove(w, r);
        make_dlq(r, strstr(err, "context") ? REQ_ERR_PROMPT_TOKENS : REQ_ERR_BAD_PARAM, err);
        model_release(w, r);
        outbox_push(w, r);
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
        wlog(w, 2, "model %s: version %s (%s) drained and unloaded", dead->name, dead->fp_hex,
             dead->path);
        model_free(dead);
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

static void *engine_main(void *arg)
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
                engine_cancel(r->model->eng, r->engine_id);
            } else if (deadline_passed(r)) {
                r->expire = 1;
                engine_cancel(r->model->eng, r->engine_id);
            }
        }
        t0 = add_since(&w->st.ns_submit, t0);
        int n = model_snapshot(w), rc = 0;
        if (n < 0) {
            set_fatal(w, "out of memory");
            pthread_mutex_lock(&w->mu);
            break;
        }
        if (w->n_active > 0) {
            /* one step of every engine with work, in turn (each has its own KV pool) */
            for (int i = 0; i < n && rc >= 0; i++)
                if (w->snap[i]->n_active > 0) {
                    rc = engine_step(w->snap[i]->eng, err, sizeof err);
                    if (rc < 0) set_fatal(w, "engine step (model %s): %s", w->snap[i]->name, err);
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

/* ---- poll thread: outputs ---- */

/* The consumer dropped r (revocation, rewind, close): cancel its work. Poll thread. */
static void hook_drop(void *arg, void *user)
{
    worker_t *w = arg;
    wreq_t *r = user;
    /* read before r may be freed by another thread */
    w->inflight_bytes -= (long)r->bytes;
    w->inflight_tokens -= r->cost;
    atomic_fetch_add(&w->st.dropped, 1);
    atomic_store(&r->cancelled, 1);
}

/* Counts a dead letter under its reason (poll thread: the only writer of the code table). */
static void count_dlq_reason(worker_t *w, const char *code)
{
    for (int i = 0; i < 32; i++) {
        const char *c = atomic_load(&w->st.dlq_code[i]);
        if (!c) atomic_store(&w->st.dlq_code[i], c = code);
        if (c == code || !strcmp(c, code)) {
            atomic_fetch_add(&w->st.dlq_n[i], 1);
            return;
        }
    }
}

static void count_output(worker_t *w, const wreq_t *r)
{
    if (r->lost) return; /* counted as out_lost by output_refused */
    if (r->truncated) atomic_fetch_add(&w->st.dlq_truncated, 1);
    if (r->is_shed) {
        atomic_fetch_add(&w->st.ov_shed, 1);
        return;
    }
    if (r->is_dlq) {
        atomic_fetch_add(&w->st.dlq, 1);
        count_dlq_reason(w, r->dlq_code ? r->dlq_code : "unknown");
        return;
    }
    for (int i = 0; i < N_FINISH; i++)
        if (r->finish == FINISH_NAMES[i]) atomic_fetch_add(&w->st.finish_n[i], 1);
    metrics_hist_observe(&w->st.h_e2e, (double)(mono_ns() - r->t_intake) * 1e-9);
    metrics_hist_observe(&w->st.h_queue, (double)r->queue_ns * 1e-9);
    if (r->ttft_ms >= 0) metrics_hist_observe(&w->st.h_ttft, r->ttft_ms * 1e-3);
    if (r->itl_s >= 0) metrics_hist_observe(&w->st.h_itl, r->itl_s);
    atomic_fetch_add(&w->st.results, 1);
    atomic_fetch_add_explicit(&w->st.ns_queue_sum, (uint64_t)r->queue_ns, memory_order_relaxed);
    if (r->expired) atomic_fetch_add(&w->st.expired, 1);
    atomic_fetch_add(&w->st.prompt_tokens, (uint64_t)r->n_prompt);
    atomic_fetch_add(&w->st.completion_tokens, (uint64_t)r->n_completion);
    atomic_fetch_add(&w->st.cached_tokens, (uint64_t)r->n_cached);
    ewma_add(&w->st.tok_per_msg_bits, (double)(r->n_prompt + r->n_completion),
             w->cfg.autoscale_avg_results);
    usage_add(w->usage, r->parsed ? r->req.tenant : NULL, r->parsed ? w->classes[r->cls].name : NULL,
              (uint64_t)r->n_prompt, (uint64_t)r->n_cached, (uint64_t)r->n_completion,
              (uint64_t)r->compute_ns);
    if (r->ttft_ms >= 0) {
        atomic_fetch_add(&w->st.ttft_n, 1);
        atomic_fetch_add(&w->st.ttft_us_sum, (uint64_t)(r->ttft_ms * 1e3));
    }
    if (r->finish && !strcmp(r->finish, "overloaded")) atomic_fetch_add(&w->st.ov_refused, 1);
    if (r->capped_from) atomic_fetch_add(&w->st.ov_capped, 1);
    if (r->cls == w->top_class && r->ttft_ms >= 0) { /* the overload steps' latency signal */
        double s = r->wait_ms + r->ttft_ms;
        w->top_ttft_ewma_ms = w->top_ttft_at_ms ? 0.8 * w->top_ttft_ewma_ms + 0.2 * s : s;
        w->top_ttft_at_ms = mono_ms();
    }
}

/* r's output is durable (or in the open transaction): ack its offset and free it. */
static void output_done(worker_t *w, wreq_t *r)
{
    if (w->cons && consumer_ack(w->cons, &r->ticket) == 0) {
        w->inflight_bytes -= (long)r->bytes;
        w->inflight_tokens -= r->cost;
        count_output(w, r);
        atomic_store(&w->st.t_last, mono_ns());
    }
    wreq_free(w, r);
}

static void retry_later(worker_t *w, wreq_t *r, int delay_ms)
{
    r->retry_at_ms = mono_ms() + delay_ms;
    r->next = w->retry;
    w->retry = r;
}

/* Exactly-once: keeps r until every earlier message of its partition is in a transaction. */
static void hold(worker_t *w, wreq_t *r)
{
    wreq_t **pp = &w->held;
    while (*pp && ((*pp)->ticket.gen < r->ticket.gen ||
                   ((*pp)->ticket.gen == r->ticket.gen && (*pp)->ticket.offset < r->ticket.offset)))
        pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
}

/* Headers of a shed message: the original ones (a copy), plus where it came from. NULL on out of
 * memory; the caller owns the result (producer_send takes it). */
static rd_kafka_headers_t *deferral_headers(worker_t *w, const rd_kafka_message_t *m)
{
    rd_kafka_headers_t *orig = NULL, *h;
    if (rd_kafka_message_headers(m, &orig) == RD_KAFKA_RESP_ERR_NO_ERROR && orig)
        h = rd_kafka_headers_copy(orig);
    else
        h = rd_kafka_headers_new(2);
    if (!h) return NULL;
    char from[320], lvl[8];
    snprintf(from, sizeof from, "%s[%d]@%" PRId64, rd_kafka_topic_name(m->rkt), (int)m->partition,
             (int64_t)m->offset);
    snprintf(lvl, sizeof lvl, "%d", w->ov_level);
    if (rd_kafka_header_add(h, "__spillway.deferred.from", -1, from, -1) ||
        rd_kafka_header_add(h, "__spillway.deferred.worker", -1, w->worker_id, -1) ||
        rd_kafka_header_add(h, "__spillway.deferred.step", -1, lvl, -1)) {
        rd_kafka_headers_destroy(h);
        return NULL;
    }
    return h;
}

static void fate_get(wfate_t *f, const wreq_t *r)
{
    f->is_dlq = r->is_dlq;
    f->is_shed = r->is_shed;
    f->truncated = r->truncated;
    f->attempts = r->attempts;
    f->lost = r->lost;
    f->dlq_code = r->dlq_code;
    memcpy(f->dlq_msg, r->dlq_msg, sizeof f->dlq_msg);
}

static void fate_put(wreq_t *r, const wfate_t *f)
{
    r->is_dlq = f->is_dlq;
    r->is_shed = f->is_shed;
    r->truncated = f->truncated;
    r->attempts = f->attempts;
    r->lost = f->lost;
    r->dlq_code = f->dlq_code;
    memcpy(r->dlq_msg, f->dlq_msg, sizeof r->dlq_msg);
}

enum { REFUSED_RETRY, REFUSED_RESEND, REFUSED_LOST };

/* Decides what becomes of the output (form f, changed in place) of message topic[part]@off whose
 * produce failed with an error of kind (PRODUCER_ERR_*, err its text). REFUSED_RETRY: send it
 * again as it is, after a pause (a retriable error, or a permanent one within
 * output.max_retries). REFUSED_RESEND: send f's new form now: a dead letter instead of a result
 * or deferral (result_too_large, message_too_large, delivery_failed), or a dead letter cut to
 * dlq.truncate_bytes instead of a whole one. REFUSED_LOST: nothing can be delivered for the
 * message: its offset is acknowledged without an output. Logs and counts. Poll thread (or
 * wherever the producer serves delivery reports). */
static int output_refused(worker_t *w, wfate_t *f, int kind, const char *err, const char *topic,
                          int32_t part, int64_t off)
{
    if (kind == PRODUCER_ERR_RETRIABLE) return REFUSED_RETRY;
    if (kind == PRODUCER_ERR_PERMANENT) {
        atomic_fetch_add(&w->st.out_permanent, 1);
        if (f->attempts++ < w->cfg.output_max_retries) {
            wlog(w, 1, "%s (offset %s[%d]@%" PRId64 "): a permanent error; retry %d of %d", err,
                 topic, (int)part, off, f->attempts, w->cfg.output_max_retries);
            return REFUSED_RETRY;
        }
    }
    if (!f->is_dlq) {
        const char *code = kind == PRODUCER_ERR_PERMANENT ? REQ_ERR_DELIVERY_FAILED
                           : f->is_shed                   ? REQ_ERR_MESSAGE_BYTES
                                                          : REQ_ERR_RESULT_TOO_LARGE;
        wlog(w, 1, "%s (offset %s[%d]@%" PRId64 "): dead-lettering the message (%s)", err, topic,
             (int)part, off, code);
        f->is_dlq = 1;
        f->is_shed = 0;
        f->dlq_code = code;
        snprintf(f->dlq_msg, sizeof f->dlq_msg, "%s", err);
        f->attempts = 0;
        return REFUSED_RESEND;
    }
    if (kind == PRODUCER_ERR_SIZE && !f->truncated) {
        wlog(w, 1, "%s (offset %s[%d]@%" PRId64 "): sending its dead letter with the value cut to "
             "%ld bytes", err, topic, (int)part, off, w->cfg.dlq_truncate_bytes);
        f->truncated = 1;
        f->attempts = 0;
        return REFUSED_RESEND;
    }
    wlog(w, 0, "%s (offset %s[%d]@%" PRId64 "): its dead letter cannot be delivered either; the "
         "message is LOST (acknowledged without an output, counted in "
         "spillway:messages_lost_total)", err, topic, (int)part, off);
    atomic_fetch_add(&w->st.out_lost, 1);
    f->lost = 1;
    return REFUSED_LOST;
}

#define REFUSED_MAX 64

/* Exactly-once: unlinks and returns the entry of w->refused for message m, or NULL. */
static wsent_t *refused_take(worker_t *w, const char *topic, int32_t part, int64_t off)
{
    for (wsent_t **pp = &w->refused; *pp; pp = &(*pp)->next) {
        wsent_t *e = *pp;
        if (e->partition == part && e->offset == off && !strcmp(e->topic, topic)) {
            *pp = e->next;
            e->next = NULL;
            return e;
        }
    }
    return NULL;
}

/* Exactly-once: e (taken) becomes the entry of its message, replacing an older one; the oldest
 * entries past REFUSED_MAX are dropped. */
static void refused_put(worker_t *w, wsent_t *e)
{
    free(refused_take(w, e->topic, e->partition, e->offset));
    e->next = w->refused;
    w->refused = e;
    int n = 0;
    for (wsent_t **pp = &w->refused; *pp; pp = &(*pp)->next)
        if (++n == REFUSED_MAX) {
            for (wsent_t *x = (*pp)->next, *nx; x; x = nx) {
                nx = x->next;
                free(x);
            }
            (*pp)->next = NULL;
            break;
        }
}

/* Exactly-once: a new opaque for r's output record in its present form; NULL on out of memory. */
static wsent_t *sent_new(const wreq_t *r)
{
    const char *topic = rd_kafka_topic_name(r->msg->rkt);
    size_t n = strlen(topic) + 1;
    wsent_t *e = malloc(sizeof *e + n);
    if (!e) return NULL;
    e->next = NULL;
    e->partition = r->msg->partition;
    e->offset = r->msg->offset;
    fate_get(&e->fate, r);
    memcpy(e->topic, topic, n);
    return e;
}

/* Produces r's output. At-least-once: librdkafka holds r until the delivery report.
 * Exactly-once: inside the open transaction, in offset order per partition (held until every
 * earlier message's output is in); r is done at once. The order matters because the offsets a
 * transaction commits (the lowest unacknowledged message of each partition) must cover exactly
 * the outputs committed so far: an output committed above them would be computed and committed
 * again by whoever resumes from those offsets after a crash or a revocation. */
static void send_output(worker_t *w, wreq_t *r)
{
    char err[256];
    int eos = w->cfg.delivery == WORKER_EOS;
    if (atomic_load(&r->cancelled)) {
        wreq_free(w, r);
        return;
    }
    if (eos && !consumer_is_next(w->cons, &r->ticket)) {
        hold(w, r);
        return;
    }
    if (eos && !w->txn_open) {
        if (producer_txn_begin(w->prod, err, sizeof err)) {
            set_fatal(w, "%s", err);
            retry_later(w, r, 100);
            return;
        }
        w->txn_open = 1;
        w->txn_start_ms = mono_ms();
    }
    const rd_kafka_message_t *m = r->msg;
    const char *src = rd_kafka_topic_name(m->rkt);
    if (eos) { /* refused in an aborted transaction: sent in its next form (the entry stays
                  until a record of the message is delivered: this transaction may abort too) */
        for (const wsent_t *e = w->refused; e; e = e->next)
            if (e->partition == m->partition && e->offset == m->offset && !strcmp(e->topic, src)) {
                fate_put(r, &e->fate);
                break;
            }
        if (r->lost) { /* nothing to send: the transaction commits its offset */
            output_done(w, r);
            return;
        }
    }
    const void *key = m->key;
    size_t klen = m->key_len;
    if (!key && r->parsed) {
        key = r->req.id;
        klen = strlen(r->req.id);
    }
    /* a reply: to the request's reply_to (checked against reply.topics at intake), keyed by its
     * correlation id, else its id */
    const char *topic = w->cfg.output_topic;
    const char *corr = r->parsed ? r->req.correlation_id : NULL;
    if (r->parsed && r->req.reply_to) {
        topic = r->req.reply_to;
        key = corr ? corr : r->req.id;
        klen = strlen(key);
    }
    for (;;) {
        int rc;
        /* at-least-once: r is the opaque; exactly-once: a wsent_t (ours again when not sent) */
        void *op = eos ? (void *)sent_new(r) : r;
        if (!op) {
            snprintf(err, sizeof err, "out of memory");
            rc = -1;
        } else if (r->is_shed) {
            rd_kafka_headers_t *h = deferral_headers(w, m);
            rc = h ? producer_send(w->prod, w->cfg.deferral_topic, m->key, m->key_len, m->payload,
                                   m->len, h, op, err, sizeof err)
                   : (snprintf(err, sizeof err, "out of memory"), -1);
        } else if (r->is_dlq) {
            rd_kafka_headers_t *h =
                producer_dlq_headers(r->dlq_code, r->dlq_msg, rd_kafka_topic_name(m->rkt),
                                     m->partition, m->offset, w->worker_id, wall_ms());
            size_t vlen = m->len;
            if (h && r->truncated) {
                char ob[24];
                snprintf(ob, sizeof ob, "%zu", m->len);
                if (vlen > (size_t)w->cfg.dlq_truncate_bytes)
                    vlen = (size_t)w->cfg.dlq_truncate_bytes;
                if (rd_kafka_header_add(h, PRODUCER_H_TRUNCATED, -1, "true", -1) ||
                    rd_kafka_header_add(h, PRODUCER_H_ORIG_BYTES, -1, ob, -1)) {
                    rd_kafka_headers_destroy(h);
                    h = NULL;
                }
            }
            rc = h || !r->truncated
                     ? producer_send(w->prod, w->cfg.dlq_topic, m->key, m->key_len, m->payload,
                                     vlen, h, op, err, sizeof err)
                     : (snprintf(err, sizeof err, "out of memory"), -1);
        } else {
            rd_kafka_headers_t *h = NULL;
            if (corr) { /* NULL on out of memory: the correlation id is in the JSON too */
                h = rd_kafka_headers_new(1);
                if (h && rd_kafka_header_add(h, WORKER_H_CORRELATION_ID, -1, corr, -1)) {
                    rd_kafka_headers_destroy(h);
                    h = NULL;
                }
            }
            rc = producer_send(w->prod, topic, key, klen, r->out, r->out_len, h, op, err,
                               sizeof err);
        }
        if (rc == 0) break;
        if (eos) free(op);
        int kind = rc == -2 ? PRODUCER_ERR_SIZE
                   : rc == -3 ? PRODUCER_ERR_PERMANENT : PRODUCER_ERR_RETRIABLE;
        wfate_t f;
        fate_get(&f, r);
        int next = output_refused(w, &f, kind, err, src, m->partition, m->offset);
        fate_put(r, &f);
        if (next == REFUSED_RESEND) continue;
        if (next == REFUSED_LOST) {
            output_done(w, r);
            return;
        }
        if (kind == PRODUCER_ERR_RETRIABLE)
            wlog(w, 1, "%s (offset %s[%d]@%" PRId64 "), retrying", err, src, (int)m->partition,
                 (int64_t)m->offset);
        atomic_fetch_add(&w->st.produce_retries, 1);
        retry_later(w, r, 200);
        return;
    }
    if (eos) output_done(w, r);
}

/* Delivery report (poll thread, inside producer_poll). */
static void on_delivery(void *arg, void *opaque, rd_kafka_resp_err_t err)
{
    worker_t *w = arg;
    wreq_t *r = opaque;
    if (w->cfg.delivery == WORKER_EOS) {
        wsent_t *e = opaque;
        if (!e) return;
        if (!err) { /* delivered: an earlier refusal of its message is past */
            free(refused_take(w, e->topic, e->partition, e->offset));
            free(e);
            return;
        }
        wlog(w, 1, "transactional record not delivered: %s", rd_kafka_err2str(err));
        int kind = producer_err_kind(err);
        if (kind == PRODUCER_ERR_RETRIABLE) { /* produced again after the abort and rewind */
            free(e);
            return;
        }
        output_refused(w, &e->fate, kind, rd_kafka_err2str(err), e->topic, e->partition,
                       e->offset);
        refused_put(w, e);
        return;
    }
    if (atomic_load(&r->cancelled) || !w->cons) {
        if (err)
            wlog(w, 2, "record for %s[%d]@%" PRId64 " not delivered: %s; its partition was "
                 "revoked, its new owner computes it again", rd_kafka_topic_name(r->msg->rkt),
                 (int)r->msg->partition, (int64_t)r->msg->offset, rd_kafka_err2str(err));
        wreq_free(w, r);
        return;
    }
    int kind = producer_err_kind(err);
    if (err && kind != PRODUCER_ERR_RETRIABLE) {
        wfate_t f;
        fate_get(&f, r);
        int next = output_refused(w, &f, kind, rd_kafka_err2str(err),
                                  rd_kafka_topic_name(r->msg->rkt), r->msg->partition,
                                  r->msg->offset);
        fate_put(r, &f);
        if (next == REFUSED_LOST) {
            output_done(w, r);
            return;
        }
        if (next == REFUSED_RESEND) { /* sent from drain_outbox, outside this report */
            retry_later(w, r, 0);
            return;
        }
    }
    if (err) {
        wlog(w, 1, "record for %s[%d]@%" PRId64 " not delivered: %s; producing it again",
             rd_kafka_topic_name(r->msg->rkt), (int)r->msg->partition, (int64_t)r->msg->offset,
             rd_kafka_err2str(err));
        atomic_fetch_add(&w->st.produce_retries, 1);
        retry_later(w, r, 100);
        return;
    }
    output_done(w, r);
}

/* Delivery report of the side producer (poll thread, inside producer_poll, or wherever
 * producer_free runs). */
static void on_aux_delivery(void *arg, void *opaque, rd_kafka_resp_err_t err)
{
    worker_t *w = arg;
    if (opaque == AUX_CHUNK) atomic_fetch_add(err ? &w->st.chunks_failed : &w->st.chunks_ok, 1);
    if (err)
        wlog(w, opaque == AUX_USAGE ? 1 : 3, "%s record not delivered: %s", (const char *)opaque,
             rd_kafka_err2str(err));
}

static void drain_outbox(worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    wreq_t *list = w->outbox;
    w->outbox = w->outbox_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    while (list) {
        wreq_t *r = list;
        list = r->next;
        r->next = NULL;
        send_output(w, r);
    }
    if (w->retry) {
        int64_t now = mono_ms();
        wreq_t *due = NULL, **pp = &w->retry;
        while (*pp) {
            wreq_t *r = *pp;
            if (r->retry_at_ms <= now) {
                *pp = r->next;
                r->next = due;
                due = r;
            } else {
                pp = &r->next;
            }
        }
        while (due) {
            wreq_t *r = due;
            due = r->next;
            r->next = NULL;
            send_output(w, r);
        }
    }
    /* exactly-once: one pass in (gen, offset) order releases every run that became next */
    wreq_t *held = w->held, **tail = &w->held;
    w->held = NULL;
    while (held) {
        wreq_t *r = held;
        held = r->next;
        r->next = NULL;
        if (!atomic_load(&r->cancelled) && !consumer_is_next(w->cons, &r->ticket)) {
            *tail = r; /* still waiting: keeps its place */
            tail = &r->next;
            continue;
        }
        send_output(w, r); /* cancelled: freed; next: produced and acked, never held again */
    }
}

/* librdkafka says "fenced by a newer instance" also when the broker aborted a transaction that
 * outlived transaction.timeout.ms (the worker was stopped or stalled): name both causes. */
static const char *fenced_hint(const char *err)
{
    return strstr(err, "enced") ? " (another worker with this transactional.id, or a transaction "
                                  "that outlived transaction.timeout.ms while this one stalled)"
                                : "";
}

/* Exactly-once, after PRODUCER_TXN_UNCERTAIN (why: its errstr): the transaction may have
 * committed or not, and the broker may still apply requests of this producer instance, which
 * without KIP-890 (librdkafka #5423) could land in its next transaction. So the next transaction
 * starts on a new instance: producer_renew destroys the old one and initialises a new one with
 * the same transactional.id, whose epoch bump fences the old requests and makes the coordinator
 * finish the transaction (committed or aborted). Only then are the committed offsets settled
 * (the consumer reads them read_committed, i.e. stable), and every assigned partition is rewound
 * to them, as after an abort: what the transaction committed is not served again, what it did
 * not commit is. 0, or -1 when fatal. Poll thread. */
static int txn_renew(worker_t *w, const char *why)
{
    char err[512];
    w->txn_open = 0;
    wlog(w, 1, "exactly-once: %s; the transaction's outcome is unknown: replacing producer %s",
         why, producer_name(w->prod));
    if (producer_renew(w->prod, err, sizeof err)) {
        set_fatal(w, "exactly-once: %s%s (stopping; restart the worker)", err, fenced_hint(err));
        return -1;
    }
    atomic_fetch_add(&w->st.producer_restarts, 1);
    wlog(w, 1, "exactly-once: producer %s initialised (new epoch); rewinding to the committed "
         "offsets", producer_name(w->prod));
    if (consumer_rewind(w->cons, err, sizeof err)) wlog(w, 0, "rewind: %s", err);
    return 0;
}

/* Exactly-once: commits the open transaction with the offsets it covers. 0, or -1 when fatal. */
static int txn_commit(worker_t *w)
{
    if (!w->txn_open) return 0;
    char err[512];
    rd_kafka_topic_partition_list_t *offs = consumer_txn_offsets(w->cons);
    rd_kafka_consumer_group_metadata_t *md = consumer_group_metadata(w->cons);
    int64_t t0 = mono_ns();
    int rc = producer_txn_commit(w->prod, offs, md, w->cfg.txn_commit_timeout_ms, err,
                                 sizeof err);
    metrics_hist_observe(&w->st.h_commit, (double)(mono_ns() - t0) * 1e-9);
    rd_kafka_consumer_group_metadata_destroy(md);
    w->txn_open = 0;
    if (rc == PRODUCER_TXN_OK) {
        consumer_txn_committed(w->cons, offs);
        atomic_fetch_add(&w->st.txn_commits, 1);
    } else if (rc == PRODUCER_TXN_ABORTED) {
        atomic_fetch_add(&w->st.txn_aborts, 1);
        wlog(w, 1, "transaction aborted (%s); rewinding to the committed offsets", err);
        char e2[256];
        if (consumer_rewind(w->cons, e2, sizeof e2)) wlog(w, 0, "rewind: %s", e2);
    } else if (rc == PRODUCER_TXN_UNCERTAIN) {
        if (txn_renew(w, err)) rc = PRODUCER_TXN_FATAL;
    } else {
        set_fatal(w, "exactly-once: %s%s (stopping; restart the worker)", err, fenced_hint(err));
    }
    if (offs) rd_kafka_topic_partition_list_destroy(offs);
    return rc == PRODUCER_TXN_FATAL ? -1 : 0;
}

static void hook_before_revoke(void *arg)
{
    worker_t *w = arg;
    if (!w->prod) return;
    if (w->cfg.delivery == WORKER_EOS) {
        drain_outbox(w);
        txn_commit(w);
        return;
    }
    /* give outputs already produced a moment to be acknowledged, so they get committed */
    drain_outbox(w);
    producer_flush(w->prod, 2000);
}

/* Partitions were lost. Exactly-once: the open transaction may hold outputs of theirs, whose
 * offsets can no longer be committed; committing those outputs alone would make whoever owns the
 * partitions now compute and commit them again. So the transaction is aborted and what is still
 * assigned rewound to the committed offsets (as after an abortable error). */
static void hook_lost(void *arg)
{
    worker_t *w = arg;
    if (w->cfg.delivery != WORKER_EOS || !w->prod || !w->txn_open) return;
    char err[256];
    w->txn_open = 0;
    int rc = producer_txn_abort(w->prod, w->cfg.txn_commit_timeout_ms, err, sizeof err);
    if (rc == PRODUCER_TXN_UNCERTAIN) {
        txn_renew(w, err);
        return;
    }
    if (rc != PRODUCER_TXN_OK) {
        set_fatal(w, "exactly-once: %s%s (stopping; restart the worker)", err, fenced_hint(err));
        return;
    }
    atomic_fetch_add(&w->st.txn_aborts, 1);
    wlog(w, 1, "partitions lost: transaction aborted; rewinding to the committed offsets");
    if (consumer_rewind(w->cons, err, sizeof err)) wlog(w, 0, "rewind: %s", err);
}

/* Produces the usage records of the period that ends now, when usage.interval.ms has passed
 * (or force). Poll thread. Best effort (side producer): a record that cannot be sent is
 * logged and lost. */
static void usage_records(worker_t *w, int force)
{
    if (!*w->cfg.usage_topic || !w->aux) return;
    int64_t now = wall_ms();
    if (!force && now - w->usage_start_ms < w->cfg.usage_interval_ms) return;
    char **recs;
    int n = usage_take_records(w->usage, w->worker_id, w->usage_start_ms, now, &recs);
    if (n < 0) return; /* out of memory: the counts stay for the next period */
    w->usage_start_ms = now;
    for (int i = 0; i < n; i++) {
        char err[256];
        json_t *o = json_loads(recs[i], 0, NULL);
        const char *tenant = o ? json_string_value(json_object_get(o, "tenant")) : NULL;
        if (!tenant) tenant = "";
        if (producer_send(w->aux, w->cfg.usage_topic, tenant, strlen(tenant), recs[i],
                          strlen(recs[i]), NULL, (void *)AUX_USAGE, err, sizeof err))
            wlog(w, 1, "usage record not sent: %s", err);
        json_decref(o);
        free(recs[i]);
    }
    free(recs);
}

/* Once a second: a throughput sample (tokens of the results finished in it per second) when
 * the engine was busy through the second: work at its start and at its end, and the engine
 * thread idle for less than a tenth of it. Poll thread. */
static void throughput_tick(worker_t *w)
{
    int64_t now = mono_ms();
    if (now - w->tput_t_ms < 1000) return;
    uint64_t done = atomic_load(&w->st.prompt_tokens) + atomic_load(&w->st.completion_tokens);
    uint64_t idle = atomic_load(&w->st.ns_idle);
    /* busy: the engine thread waited for work less than a tenth of the second (its idle time
     * is added when a wait ends: a wait still going on shows in the next second) */
    if (w->tput_t_ms && (idle - w->tput_idle) * 10 < (uint64_t)(now - w->tput_t_ms) * 1000000 &&
        !w->tput_idle_open && atomic_load(&w->st.inbox_n) + atomic_load(&w->st.eng_running) > 0)
        ewma_add(&w->st.tput_bits,
                 (double)(done - w->tput_tokens) * 1000.0 / (double)(now - w->tput_t_ms),
                 w->cfg.autoscale_avg_seconds);
    w->tput_t_ms = now;
    w->tput_tokens = done;
    w->tput_idle = idle;
    w->tput_idle_open = atomic_load(&w->st.inbox_n) + atomic_load(&w->st.eng_running) == 0;
}

static void periodic_commit(worker_t *w, int force)
{
    int64_t now = mono_ms();
    if (!force && now - w->last_commit_ms < w->cfg.commit_interval_ms) return;
    w->last_commit_ms = now;
    if (w->cfg.delivery == WORKER_EOS) {
        txn_commit(w);
    } else if (consumer_commit(w->cons, !force) == 0) {
        atomic_fetch_add(&w->st.commits, 1);
    }
}

/* ---- poll thread: intake ---- */

/* Request fields that came as Kafka headers (REQUEST_HEADER_FIELDS), then the reply_to
 * allow-list. 0, or -1 with *code and err set (a dead letter), or -2 on out of memory. */
static int apply_headers(worker_t *w, wreq_t *r, const char **code, char *err, size_t errlen)
{
    rd_kafka_headers_t *h = NULL;
    if (rd_kafka_message_headers(r->msg, &h) == RD_KAFKA_RESP_ERR_NO_ERROR && h) {
        static const char *const names[REQUEST_N_HEADER_FIELDS] = REQUEST_HEADER_FIELDS;
        for (int i = 0; i < REQUEST_N_HEADER_FIELDS; i++) {
            const void *v;
            size_t n;
            if (rd_kafka_header_get_last(h, names[i], &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR)
                continue;
            if (request_apply_header(&r->req, names[i], v, n, &w->limits, code, err, errlen))
                return strcmp(*code, REQ_ERR_NO_MEMORY) ? -1 : -2;
        }
    }
    if (r->req.reply_to) {
        for (int i = 0; i < w->n_reply_allow; i++)
            if (!strcmp(w->reply_allow[i], r->req.reply_to)) return 0;
        snprintf(err, errlen, "reply_to: topic \"%.100s\" is not in reply.topics (%s)",
                 r->req.reply_to, w->n_reply_allow ? "see the worker's configuration"
                                                   : "empty: no reply topic is allowed");
        *code = REQ_ERR_REPLY_NOT_ALLOWED;
        return -1;
    }
    return 0;
}

/* The topic whose claims entry applies to r: the one it was consumed from, or for a message
 * on the deferral topic the one a worker shed it from (its __spillway.deferred.from header,
 * "TOPIC[PARTITION]@OFFSET"; the deferral topic itself without that header). */
static void claims_topic(worker_t *w, const wreq_t *r, char *topic, size_t cap)
{
    const char *t = rd_kafka_topic_name(r->msg->rkt);
    snprintf(topic, cap, "%s", t);
    if (!*w->cfg.deferral_topic || strcmp(t, w->cfg.deferral_topic)) return;
    rd_kafka_headers_t *h = NULL;
    const void *v;
    size_t n;
    if (rd_kafka_message_headers(r->msg, &h) || !h ||
        rd_kafka_header_get_last(h, "__spillway.deferred.from", &v, &n) || !v)
        return;
    const char *b = memchr(v, '[', n);
    if (b && b > (const char *)v)
        snprintf(topic, cap, "%.*s", (int)(b - (const char *)v), (const char *)v);
}

/* The claims key on r (parsed, headers applied, its class r->cls found): a tenant or class its
 * topic may not claim is a dead letter; one it does not name gets the topic's default. 0, or -1
 * with *code and err set (a dead letter), or -2 on out of memory. Poll thread. */
static int check_claims(worker_t *w, wreq_t *r, const char **code, char *err, size_t errlen)
{
    if (!w->claims) return 0;
    char topic[256];
    claims_topic(w, r, topic, sizeof topic);
    const char *def_tenant;
    int def_class;
    if (claims_check(w->claims, topic, r->req.tenant, r->req.class_name, &def_tenant, &def_class,
                     code, err, errlen))
        return -1;
    if (!r->req.class_name) r->cls = def_class;
    if (!r->req.tenant && def_tenant && !(r->req.tenant = strdup(def_tenant))) return -2;
    return 0;
}

/* Encodes text into r->toks. 0, or -1 on out of memory. */
static int tokenize(wreq_t *r, const char *text, size_t len, int parse_special)
{
    /* one pass in the common case: no tokenizer makes more than a token per byte, plus BOS/EOS */
    int cap = len < (size_t)(1 << 30) ? (int)len + 4 : 1 << 30;
    for (int pass = 0; pass < 2; pass++) {
        int32_t *t = realloc(r->toks, sizeof *t * (size_t)cap);
        if (!t) return -1;
        r->toks = t;
        int n = engine_tokenize(r->model->eng, text, len, 1, parse_special, t, cap);
        if (n < 0) return -1;
        if (n <= cap) {
            r->n_toks = n;
            return 0;
        }
        cap = n;
    }
    return -1;
}

/* Renders r's chat messages (template: the request's chat_template, else the chat.template key,
 * else the model's) and tokenises the prompt; checks the token limit. 0, or -1 with *code and
 * err set (a dead letter), or -2 on out of memory. Poll thread. */
static int prepare_prompt(worker_t *w, wreq_t *r, const char **code, char *err, size_t errlen)
{
    const request_t *q = &r->req;
    if (q->messages) {
        engine_chat_msg_t *msgs = malloc(sizeof *msgs * (size_t)q->n_messages);
        if (!msgs) return -2;
        for (int i = 0; i < q->n_messages; i++) {
            msgs[i].role = q->messages[i].role;
            msgs[i].content = q->messages[i].content;
        }
        const char *name = q->template_name ? q->template_name
                           : *w->cfg.chat_template ? w->cfg.chat_template : NULL;
        /* only the template's own markers (<|im_start|>, ...) become special tokens; roles
         * outside the template's list are refused, contents are always plain text */
        int32_t *ids;
        int n_ids;
        size_t len;
        engine_chat_opts_t opts = ENGINE_CHAT_OPTS_DEFAULT;
        opts.enable_thinking = q->enable_thinking;
        int crc = engine_chat_tokenize_opts(r->model->eng, name, msgs, q->n_messages, 1, &opts,
                                            &ids, &n_ids, &len, err, errlen);
        free(msgs);
        if (crc == ENGINE_CHAT_ENOMEM) return -2;
        if (crc != 0) {
            *code = crc == ENGINE_CHAT_EROLE ? REQ_ERR_BAD_ROLE : REQ_ERR_TEMPLATE;
            return -1;
        }
        if (len > (size_t)w->cfg.max_prompt_bytes) {
            snprintf(err, errlen, "rendered chat prompt has %zu bytes, over limits.max_prompt_bytes=%ld",
                     len, w->cfg.max_prompt_bytes);
            free(ids);
            *code = REQ_ERR_PROMPT_BYTES;
            return -1;
        }
        free(r->toks);
        r->toks = ids; /* owned by r from here */
        r->n_toks = n_ids;
        /* a template that writes the BOS text itself, plus the tokenizer's BOS: keep one */
        int32_t bos = r->model->bos;
        if (r->n_toks >= 2 && bos >= 0 && r->toks[0] == bos && r->toks[1] == bos) {
            memmove(r->toks, r->toks + 1, sizeof *r->toks * (size_t)(r->n_toks - 1));
            r->n_toks--;
        }
    } else if (q->prompt) {
        if (tokenize(r, q->prompt, q->prompt_len, 0)) return -2;
    }
    int n = r->toks ? r->n_toks : q->n_input_ids;
    if (w->cfg.max_prompt_tokens > 0 && n > w->cfg.max_prompt_tokens) {
        snprintf(err, errlen, "prompt has %d tokens, over limits.max_prompt_tokens=%d", n,
                 w->cfg.max_prompt_tokens);
        *code = REQ_ERR_PROMPT_TOKENS;
        return -1;
    }
    r->cost = (long)n + q->max_tokens;
    return 0;
}

static void intake(worker_t *w, rd_kafka_message_t *m)
{
    if (m->err) {
        if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            wlog(w, m->err == RD_KAFKA_RESP_ERR__FATAL ? 0 : 1, "consumer: %s",
                 rd_kafka_message_errstr(m));
        if (m->err == RD_KAFKA_RESP_ERR__FATAL) set_fatal(w, "consumer: %s", rd_kafka_message_errstr(m));
        rd_kafka_message_destroy(m);
        return;
    }
    int64_t t0 = mono_ns();
    wreq_t *r = calloc(1, sizeof *r);
    if (!r) {
        rd_kafka_message_destroy(m);
        set_fatal(w, "out of memory");
        return;
    }
    r->msg = m; /* owned by r from here */
    r->active_ix = -1;
    r->ttft_ms = -1;
    r->t_intake = t0;
    int rc = consumer_track(w->cons, m, r, &r->ticket);
    if (rc) {
        if (rc < 0) set_fatal(w, "out of memory");
        wreq_free(w, r);
        return;
    }
    int64_t zero = 0;
    atomic_compare_exchange_strong(&w->st.t_first, &zero, t0);
    r->bytes = m->len;
    w->inflight_bytes += (long)r->bytes;
    atomic_fetch_add(&w->st.consumed, 1);
    const char *code = NULL;
    char err[256];
    int64_t ts = rd_kafka_message_timestamp(m, NULL);
    int64_t t1 = mono_ns();
    rc = request_parse(m->payload, m->len, ts > 0 ? ts : 0, &w->limits, &r->req, &code, err,
                       sizeof err);
    t1 = add_since(&w->st.ns_parse, t1);
    if (rc) {
        make_dlq(r, code ? code : REQ_ERR_NOT_JSON, err);
        send_output(w, r);
        goto out;
    }
    r->parsed = 1;
    rc = apply_headers(w, r, &code, err, sizeof err);
    if (rc == -2) {
        /* as for prepare_prompt's -2 below: r goes to the inbox, which is not served once
         * fatal is set, and worker_run frees it */
        set_fatal(w, "out of memory reading headers");
        goto enqueue;
    }
    if (rc) {
        make_dlq(r, code, err);
        send_output(w, r);
        goto out;
    }
    r->wait_ms = ts > 0 && wall_ms() > ts ? (double)(wall_ms() - ts) : 0;
    r->cls = w->default_class;
    if (r->req.class_name) {
        r->cls = -1;
        for (int i = 0; i < w->n_classes; i++)
            if (!strcmp(w->classes[i].name, r->req.class_name)) r->cls = i;
        if (r->cls < 0) {
            snprintf(err, sizeof err, "class: \"%s\" is not a class of this worker", r->req.class_name);
            r->cls = w->default_class;
            make_dlq(r, REQ_ERR_UNKNOWN_CLASS, err);
            send_output(w, r);
            goto out;
        }
    }
    rc = check_claims(w, r, &code, err, sizeof err);
    if (rc == -2) {
        set_fatal(w, "out of memory checking claims"); /* as for apply_headers' -2 above */
        goto enqueue;
    }
    if (rc) {
        make_dlq(r, code, err);
        send_output(w, r);
        goto out;
    }
    /* the model: a current version (a retired one keeps only what it already holds) */
    const char *mname = r->req.model ? r->req.model : w->default_model;
    if (!(r->model = model_acquire(w, mname))) {
        snprintf(err, sizeof err, "model: \"%s\" is not a model this worker serves", mname);
        make_dlq(r, REQ_ERR_UNKNOWN_MODEL, err);
        send_output(w, r);
        goto out;
    }
    const worker_class_t *cl = &w->classes[r->cls];
    int from_deferral = *w->cfg.deferral_topic && !strcmp(rd_kafka_topic_name(m->rkt), w->cfg.deferral_topic);
    if (!from_deferral) {
        int64_t now_ms = mono_ms();
        w->wait_ewma_ms = w->wait_at_ms ? 0.9 * w->wait_ewma_ms + 0.1 * r->wait_ms : r->wait_ms;
        w->wait_at_ms = now_ms;
        if (r->cls == w->top_class) w->top_seen_ms = now_ms;
    }
    if (deadline_passed(r) || (cl->max_queue_ms > 0 && r->wait_ms > cl->max_queue_ms)) {
        if (!deadline_passed(r)) atomic_fetch_add(&w->st.class_expired, 1);
        stream_finish(w, r, "", 0, 0, "expired");
        make_result(w, r, NULL, "expired");
        send_output(w, r);
        goto out;
    }
    if (r->cls != w->top_class && w->ov_level > 0) {
        if (r->cls == w->low_class && *w->cfg.deferral_topic && !from_deferral) {
            r->is_shed = 1; /* step 1: to the deferral topic, unprocessed */
            send_output(w, r);
            goto out;
        }
        if (w->ov_level >= 3 && !from_deferral) { /* deferred once: served, never refused */
            stream_finish(w, r, "", 0, 0, "overloaded");
            make_result(w, r, NULL, "overloaded");
            send_output(w, r);
            goto out;
        }
        if (w->ov_level >= 2 && r->req.max_tokens > w->cfg.overload_cap_tokens) {
            r->capped_from = r->req.max_tokens;
            r->req.max_tokens = w->cfg.overload_cap_tokens;
        }
    }
    rc = prepare_prompt(w, r, &code, err, sizeof err);
    add_since(&w->st.ns_tokenize, t1);
    if (rc == -2) {
        /* Not the message's fault: stop rather than dead-letter it (a restart retries it).
         * r still goes to the inbox, which the engine thread no longer takes from once fatal
         * is set; worker_run frees it after the consumer dropped it. */
        set_fatal(w, "out of memory preparing a prompt");
    } else if (rc) {
        make_dlq(r, code, err);
        send_output(w, r);
        goto out;
    }
enqueue:
    w->inflight_tokens += r->cost;
    atomic_fetch_add(&w->st.cost_sum, (uint64_t)r->cost);
    atomic_fetch_add(&w->st.cost_n, 1);
    r->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->inbox_tail) w->inbox_tail->next = r;
    else w->inbox = r;
    w->inbox_tail = r;
    atomic_fetch_add(&w->st.inbox_n, 1);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
out:
    add_since(&w->st.ns_intake, t0);
}

/* Overload pressure, percent: the largest of (a) the top class's recent time to first token as
 * its producers see it (wait in Kafka + time to first token, averaged; counts for
 * overload.cooldown_ms after its last result) and (b) how long messages of any class wait in
 * Kafka before this worker takes them (averaged over the input topics other than the deferral
 * topic; counts for a second after the last one: a backlog ahead of the top class's next
 * message), both as percent of the top class's ttft_ms, and (c) the fullest in-flight limit
 * (messages, tokens) in percent: intake pauses at 100%, which would hold the top class's next
 * message in Kafka. 0 while no top-class message arrived within overload.window_ms: without
 * such traffic a backlog is just bulk work draining at full speed. */
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
            wlog(w, 1, "cannot %s the deferral topic %s", hold ? "hold" : "release",
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
    wlog(w, 2, "overload: step %s -> %s (pressure %d%% of class %s's ttft_ms %d: its time to "
               "first token %.0f ms, wait in Kafka %.0f ms; %d in flight)",
         OV_STEP[w->ov_level], OV_STEP[lvl], p, w->classes[w->top_class].name,
         w->classes[w->top_class].ttft_ms, w->top_ttft_ewma_ms, w->wait_ewma_ms, pending);
    atomic_fetch_add(lvl > w->ov_level ? &w->st.ov_steps_up : &w->st.ov_steps_down, 1);
    w->ov_level = lvl;
    atomic_store(&w->st.ov_level, lvl);
}

static void flow_control(worker_t *w)
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
                wlog(w, 3, "paused intake: %d in flight, %ld bytes, %ld tokens", pending,
                     w->inflight_bytes, w->inflight_tokens);
            }
        }
    } else if (pending <= lo && w->inflight_bytes <= blo && w->inflight_tokens <= tlo) {
        if (consumer_resume(w->cons) == 0) {
            atomic_fetch_add(&w->st.resumes, 1);
            atomic_store(&w->st.paused, 0);
            wlog(w, 3, "resumed intake: %d in flight", pending);
        }
    }
}

/* ---- poll thread: model reload (worker_set_reload) ---- */

/* A reload in progress: the specs asked for, and the versions the loader thread loads. */
struct reload_job {
    worker_model_spec_t *specs;  /* [n] owned */
    int n, def;
    wmodel_t **loaded;           /* [n] owned: a new version, or NULL where the current stays */
    int *want;                   /* [n] spec i is to be loaded (new name or changed file) */
    worker_t *w;
    pthread_t th;
    int started;                 /* th runs (join it) */
    atomic_int done;             /* the loader finished: loaded / failed are final */
    int failed;
    char err[768];
};

static void job_free(struct reload_job *j)
{
    if (!j) return;
    if (j->loaded)
        for (int i = 0; i < j->n; i++)
            model_free(j->loaded[i]);
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
        j->loaded[i] = model_load(j->w, &j->specs[i], j->w->tier2 && i == j->def, e, sizeof e);
        if (!j->loaded[i]) {
            j->failed = 1;
            snprintf(j->err, sizeof j->err, "model %s (%.200s): %.250s", j->specs[i].name,
                     j->specs[i].path, e);
        }
    }
    if (j->failed)
        for (int i = 0; i < j->n; i++) {
            model_free(j->loaded[i]);
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
static void reload_start(worker_t *w)
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
    wlog(w, 2, "reload: %d model(s) configured, %d to load", n, to_load);
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
    job_free(j);
    atomic_fetch_add(&w->st.reloads_failed, 1);
    wlog(w, 0, "reload failed, serving on unchanged: %s", err);
}

/* Installs a finished load: each new version takes over its name; what it replaces, and names
 * no longer configured, are retired (the engine thread frees them once drained). */
static void reload_finish(worker_t *w)
{
    struct reload_job *j = w->job;
    if (!j || !atomic_load(&j->done)) return;
    w->job = NULL;
    if (j->started) pthread_join(j->th, NULL);
    if (j->failed) {
        atomic_fetch_add(&w->st.reloads_failed, 1);
        wlog(w, 0, "reload failed, serving on unchanged: %s", j->err);
        job_free(j);
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
            wlog(w, 2, "model swap: %s: version %s (%s) -> %s (%s); the old one finishes the %d "
                       "request(s) it holds",
                 m->name, m->fp_hex, m->path, nv->fp_hex, nv->path, atomic_load(&m->refs));
        } else {
            wlog(w, 2, "model %s: no longer served; finishing the %d request(s) it holds",
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
        wlog(w, 2, "model %s: %s (%s), fingerprint %s loaded", nv->name, nv->path, nv->arch,
             nv->fp_hex);
    }
    snprintf(w->default_model, sizeof w->default_model, "%s", j->specs[j->def].name);
    pthread_mutex_unlock(&w->models_mu);
    atomic_fetch_add(&w->st.model_swaps, (uint64_t)swaps);
    atomic_fetch_add(&w->st.reloads_ok, 1);
    wlog(w, 2, "reload done: %d swap(s), default model %s", swaps, w->default_model);
    job_free(j);
    pthread_mutex_lock(&w->mu);
    w->models_gc = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* ---- metrics endpoint (worker/metrics.h): runs on the server's thread ---- */

static void fam(metrics_buf_t *b, const char *name, const char *type, const char *help)
{
    metrics_family(b, name, type, help);
}

static void metrics_render(void *arg, metrics_buf_t *b)
{
    worker_t *w = arg;
    if (!atomic_load(&w->started)) return; /* worker_new is still filling w */
    worker_stats_t st;
    worker_stats(w, &st);
    char lb[512];
    fam(b, "spillway:num_requests_running", "gauge", "requests in the engine's running batch");
    metrics_sample(b, "spillway:num_requests_running", NULL, atomic_load(&w->st.eng_running));
    fam(b, "spillway:num_requests_waiting", "gauge", "requests waiting for admission");
    metrics_sample(b, "spillway:num_requests_waiting", NULL,
                   atomic_load(&w->st.eng_waiting) + atomic_load(&w->st.inbox_n));
    fam(b, "spillway:kv_cache_usage_perc", "gauge", "fraction of the KV block pool in use");
    metrics_sample(b, "spillway:kv_cache_usage_perc", NULL,
                   st.kv_blocks_total > 0 ? (double)st.kv_blocks_used / st.kv_blocks_total : 0);
    fam(b, "spillway:prefix_cache_queries_total", "counter", "KV blocks looked up, per tier");
    metrics_sample(b, "spillway:prefix_cache_queries_total", "tier=\"1\"", (double)st.tier1_lookups);
    if (w->tier2)
        metrics_sample(b, "spillway:prefix_cache_queries_total", "tier=\"2\"",
                       (double)st.tier2_lookups);
    fam(b, "spillway:prefix_cache_hits_total", "counter", "KV blocks found, per tier");
    metrics_sample(b, "spillway:prefix_cache_hits_total", "tier=\"1\"", (double)st.tier1_hits);
    if (w->tier2)
        metrics_sample(b, "spillway:prefix_cache_hits_total", "tier=\"2\"", (double)st.tier2_hits);
    fam(b, "spillway:prefix_cache_mismatches_total", "counter",
        "KV blocks found by name (tier 1 or 2) but computed from other tokens: refused");
    metrics_sample(b, "spillway:prefix_cache_mismatches_total", NULL,
                   (double)st.prefix_mismatches);
    fam(b, "spillway:prefix_cache_evictions_total", "counter",
        "cached KV blocks evicted to make room, per tier (tier 2: by this process)");
    metrics_sample(b, "spillway:prefix_cache_evictions_total", "tier=\"1\"",
                   (double)st.tier1_evictions);
    if (w->tier2)
        metrics_sample(b, "spillway:prefix_cache_evictions_total", "tier=\"2\"",
                       (double)st.tier2_evictions);
    if (w->tier2) {
        fam(b, "spillway:host_arena_refused_total", "counter",
            "host arena files refused as untrusted (symlink, hard link, owner, mode): tier 2 off");
        metrics_sample(b, "spillway:host_arena_refused_total", NULL, (double)st.arena_refused);
        fam(b, "spillway:host_arena_slots", "gauge", "host arena slots (tier 2)");
        if (st.arena_used >= 0)
            metrics_sample(b, "spillway:host_arena_slots", "state=\"used\"", st.arena_used);
        metrics_sample(b, "spillway:host_arena_slots", "state=\"total\"", st.arena_slots);
    }
    fam(b, "spillway:prompt_tokens_total", "counter", "prompt tokens of finished requests");
    metrics_sample(b, "spillway:prompt_tokens_total", NULL, (double)st.prompt_tokens);
    fam(b, "spillway:generation_tokens_total", "counter", "generated tokens of finished requests");
    metrics_sample(b, "spillway:generation_tokens_total", NULL, (double)st.completion_tokens);
    fam(b, "spillway:prompt_tokens_cached_total", "counter",
        "prompt tokens served from the prefix cache");
    metrics_sample(b, "spillway:prompt_tokens_cached_total", NULL, (double)st.cached_tokens);
    fam(b, "spillway:request_success_total", "counter", "results produced, by finish reason");
    for (int i = 0; i < N_FINISH; i++) {
        metrics_labels(lb, sizeof lb, "finished_reason", FINISH_NAMES[i], (const char *)NULL);
        metrics_sample(b, "spillway:request_success_total", lb,
                       (double)atomic_load(&w->st.finish_n[i]));
    }
    fam(b, "spillway:overload_step", "gauge",
        "overload step: 0 none, 1 shed lowest class, 2 cap max_tokens, 3 refuse below the top class");
    metrics_sample(b, "spillway:overload_step", NULL, atomic_load(&w->st.ov_level));
    fam(b, "spillway:overload_pressure_percent", "gauge",
        "fullest in-flight limit, or top-class time to first token against its target");
    metrics_sample(b, "spillway:overload_pressure_percent", NULL, atomic_load(&w->st.ov_pressure));
    fam(b, "spillway:overload_actions_total", "counter",
        "requests changed by an overload step, by action");
    const struct {
        const char *a;
        atomic_uint_fast64_t *n;
    } ov[] = {{"shed", &w->st.ov_shed}, {"cap", &w->st.ov_capped}, {"refuse", &w->st.ov_refused},
              {"expired_in_queue", &w->st.class_expired}};
    for (size_t i = 0; i < sizeof ov / sizeof ov[0]; i++) {
        metrics_labels(lb, sizeof lb, "action", ov[i].a, (const char *)NULL);
        metrics_sample(b, "spillway:overload_actions_total", lb, (double)atomic_load(ov[i].n));
    }
    fam(b, "spillway:overload_step_changes_total", "counter", "overload step changes, by direction");
    metrics_labels(lb, sizeof lb, "direction", "up", (const char *)NULL);
    metrics_sample(b, "spillway:overload_step_changes_total", lb, (double)atomic_load(&w->st.ov_steps_up));
    metrics_labels(lb, sizeof lb, "direction", "down", (const char *)NULL);
    metrics_sample(b, "spillway:overload_step_changes_total", lb,
                   (double)atomic_load(&w->st.ov_steps_down));
    static const struct {
        const char *name, *help;
        size_t off;
    } H[] = {
        {"spillway:time_to_first_token_seconds", "Kafka intake to the first generated token",
         offsetof(stats_t, h_ttft)},
        {"spillway:inter_token_latency_seconds", "mean time between generated tokens, per request",
         offsetof(stats_t, h_itl)},
        {"spillway:e2e_request_latency_seconds", "Kafka intake to the output made durable",
         offsetof(stats_t, h_e2e)},
        {"spillway:request_queue_time_seconds", "Kafka intake to the first scheduled step",
         offsetof(stats_t, h_queue)},
        {"spillway:commit_latency_seconds", "offset commit or transaction commit duration",
         offsetof(stats_t, h_commit)},
    };
    for (size_t i = 0; i < sizeof H / sizeof H[0]; i++) {
        fam(b, H[i].name, "histogram", H[i].help);
        metrics_hist_render(b, H[i].name, NULL,
                            (const metrics_hist_t *)((const char *)&w->st + H[i].off));
    }
    fam(b, "spillway:messages_consumed_total", "counter", "Kafka messages accepted");
    metrics_sample(b, "spillway:messages_consumed_total", NULL, (double)st.consumed);
    consumer_lag_t lag[256];
    pthread_mutex_lock(&w->lag_mu); /* the cache (no broker round trip on a scrape) */
    int n = w->lag_n;
    int64_t lag_ms = w->lag_ms;
    if (n > 0) memcpy(lag, w->lag_cache, sizeof *lag * (size_t)n);
    pthread_mutex_unlock(&w->lag_mu);
    fam(b, "spillway:consumer_lag_refreshes_total", "counter",
        "consumer lag refreshes (broker round trips of the lag thread), by outcome");
    metrics_sample(b, "spillway:consumer_lag_refreshes_total", "outcome=\"ok\"",
                   (double)atomic_load(&w->lag_ok));
    metrics_sample(b, "spillway:consumer_lag_refreshes_total", "outcome=\"failed\"",
                   (double)atomic_load(&w->lag_failed));
    fam(b, "spillway:consumer_lag_age_seconds", "gauge",
        "age of the consumer lag served (the last successful refresh)");
    if (n >= 0)
        metrics_sample(b, "spillway:consumer_lag_age_seconds", NULL,
                       (double)(mono_ms() - lag_ms) * 1e-3);
    fam(b, "spillway:consumer_lag", "gauge", "log end offset minus the committed offset");
    for (int i = 0; i < n; i++) {
        char part[16];
        snprintf(part, sizeof part, "%d", (int)lag[i].partition);
        metrics_labels(lb, sizeof lb, "topic", lag[i].topic, "partition", part, (const char *)NULL);
        metrics_sample(b, "spillway:consumer_lag", lb, (double)lag[i].lag);
    }
    /* autoscaling (README, Autoscaling): lag in tokens and the time to drain it */
    double per_msg = bits_double(atomic_load(&w->st.tok_per_msg_bits));
    if (isnan(per_msg)) { /* no result yet: what accepted requests may cost at most */
        uint64_t cn = atomic_load(&w->st.cost_n);
        per_msg = cn ? (double)atomic_load(&w->st.cost_sum) / (double)cn : 0;
    }
    double lag_msgs = 0;
    for (int i = 0; i < n; i++) lag_msgs += (double)lag[i].lag;
    double lag_tokens = lag_msgs * per_msg;
    int known = !isnan(bits_double(atomic_load(&w->st.tok_per_msg_bits))) ||
                atomic_load(&w->st.cost_n) > 0; /* else no estimate: lag_tokens is absent */
    double tput = bits_double(atomic_load(&w->st.tput_bits));
    fam(b, "spillway:lag_tokens", "gauge",
        "consumer lag in tokens: lag messages x moving average of tokens per message");
    if (n >= 0 && (known || lag_msgs == 0)) /* absent, like consumer_lag, while the broker
                                               cannot be asked, and before any estimate */
        metrics_sample(b, "spillway:lag_tokens", NULL, lag_tokens);
    fam(b, "spillway:token_throughput", "gauge",
        "tokens per second finished while saturated (moving average)");
    if (!isnan(tput)) metrics_sample(b, "spillway:token_throughput", NULL, tput);
    fam(b, "spillway:estimated_drain_seconds", "gauge",
        "lag_tokens / token_throughput: seconds to drain this worker's lag");
    if (n < 0 || (!known && lag_msgs > 0)) {
    } else if (lag_tokens <= 0) {
        metrics_sample(b, "spillway:estimated_drain_seconds", NULL, 0);
    } else if (!isnan(tput) && tput > 0)
        metrics_sample(b, "spillway:estimated_drain_seconds", NULL, lag_tokens / tput);
    fam(b, "spillway:partitions_assigned", "gauge", "partitions assigned to this worker");
    metrics_sample(b, "spillway:partitions_assigned", NULL, st.assigned);
    fam(b, "spillway:partitions_paused", "gauge", "assigned partitions paused by backpressure");
    metrics_sample(b, "spillway:partitions_paused", NULL,
                   atomic_load(&w->st.paused) ? st.assigned : 0);
    fam(b, "spillway:intake_pauses_total", "counter",
        "times intake paused its partitions for backpressure (max.inflight*)");
    metrics_sample(b, "spillway:intake_pauses_total", NULL, (double)st.pauses);
    fam(b, "spillway:dlq_records_total", "counter", "dead letters produced, by reason");
    for (int i = 0; i < 32; i++) {
        const char *c = atomic_load(&w->st.dlq_code[i]);
        if (!c) break;
        metrics_labels(lb, sizeof lb, "reason", c, (const char *)NULL);
        metrics_sample(b, "spillway:dlq_records_total", lb, (double)atomic_load(&w->st.dlq_n[i]));
    }
    usage_render(w->usage, b);
    fam(b, "spillway:stream_chunks_total", "counter",
        "stream chunks acknowledged by the broker, or lost (not queued or not delivered)");
    metrics_sample(b, "spillway:stream_chunks_total", "outcome=\"delivered\"",
                   (double)atomic_load(&w->st.chunks_ok));
    metrics_sample(b, "spillway:stream_chunks_total", "outcome=\"failed\"",
                   (double)atomic_load(&w->st.chunks_failed));
    fam(b, "spillway:transaction_aborts_total", "counter", "exactly-once transactions aborted");
    metrics_sample(b, "spillway:transaction_aborts_total", NULL, (double)st.txn_aborts);
    fam(b, "spillway:producer_restarts_total", "counter",
        "exactly-once: producer instances replaced after a transaction's outcome was unknown");
    metrics_sample(b, "spillway:producer_restarts_total", NULL, (double)st.producer_restarts);
    fam(b, "spillway:produce_retries_total", "counter",
        "outputs produced again after a failed delivery");
    metrics_sample(b, "spillway:produce_retries_total", NULL, (double)st.produce_retries);
    fam(b, "spillway:produce_permanent_errors_total", "counter",
        "outputs refused with a permanent error (retried up to output.max_retries, then "
        "dead-lettered)");
    metrics_sample(b, "spillway:produce_permanent_errors_total", NULL,
                   (double)atomic_load(&w->st.out_permanent));
    fam(b, "spillway:dlq_truncated_total", "counter",
        "dead letters refused for their size and sent with the value cut to dlq.truncate_bytes");
    metrics_sample(b, "spillway:dlq_truncated_total", NULL,
                   (double)atomic_load(&w->st.dlq_truncated));
    fam(b, "spillway:messages_lost_total", "counter",
        "messages acknowledged without any output: even their dead letter was refused");
    metrics_sample(b, "spillway:messages_lost_total", NULL, (double)atomic_load(&w->st.out_lost));
    if (w->tier2) {
        fam(b, "spillway:redis_up", "gauge", "1 when the prefix-cache index is reachable");
        metrics_sample(b, "spillway:redis_up", NULL, st.redis_up > 0);
        fam(b, "spillway:redis_errors_total", "counter", "failed or timed-out Redis commands");
        metrics_sample(b, "spillway:redis_errors_total", NULL, (double)st.redis_errors);
    }
    fam(b, "spillway:model_loaded", "gauge",
        "per loaded model version: 1 serving, 0 replaced and draining what it holds");
    pthread_mutex_lock(&w->models_mu);
    for (const wmodel_t *m = w->models; m; m = m->next) {
        metrics_labels(lb, sizeof lb, "model", m->name, "fingerprint", m->fp_hex,
                       (const char *)NULL);
        metrics_sample(b, "spillway:model_loaded", lb, atomic_load(&m->retired) ? 0 : 1);
    }
    pthread_mutex_unlock(&w->models_mu);
    fam(b, "spillway:model_swaps_total", "counter",
        "model versions replaced by a newer one on reload (SIGHUP)");
    metrics_sample(b, "spillway:model_swaps_total", NULL, (double)atomic_load(&w->st.model_swaps));
    fam(b, "spillway:model_reloads_total", "counter", "model reloads (SIGHUP), by outcome");
    metrics_sample(b, "spillway:model_reloads_total", "outcome=\"ok\"",
                   (double)atomic_load(&w->st.reloads_ok));
    metrics_sample(b, "spillway:model_reloads_total", "outcome=\"failed\"",
                   (double)atomic_load(&w->st.reloads_failed));
}

/* Alive: no fatal error, and the poll loop turned within the last minute (a transaction commit
 * or a drain may hold it for tens of seconds; a stuck loop is not alive). */
static int metrics_healthy(void *arg, char *why, size_t len)
{
    worker_t *w = arg;
    pthread_mutex_lock(&w->mu);
    int fatal = w->fatal;
    pthread_mutex_unlock(&w->mu);
    if (fatal) {
        snprintf(why, len, "fatal error: the worker is stopping");
        return 0;
    }
    int64_t last = atomic_load(&w->st.last_poll_ms);
    if (last && mono_ms() - last > 60000) {
        snprintf(why, len, "the poll loop has not turned for %lld s",
                 (long long)((mono_ms() - last) / 1000));
        return 0;
    }
    return 1;
}

static int metrics_ready(void *arg, char *why, size_t len)
{
    worker_t *w = arg;
    if (!atomic_load(&w->started)) {
        snprintf(why, len, "starting: loading the model, connecting to Kafka");
        return 0;
    }
    if (atomic_load(&w->st.assigned) <= 0) {
        snprintf(why, len, "no partition assigned (yet)");
        return 0;
    }
    return 1;
}

/* ---- lifecycle ---- */

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
        wlog(w, 1, "claims is not set: requests name their own tenant and class unchecked "
             "(README \"Tenants and usage\")");
        return;
    }
    for (const char *t = w->cfg.input_topics; *t;) {
        const char *e = strchr(t, ',');
        size_t n = e ? (size_t)(e - t) : strlen(t);
        char topic[256];
        snprintf(topic, sizeof topic, "%.*s", (int)(n < sizeof topic ? n : sizeof topic - 1), t);
        if (*topic && !claims_covers(w->claims, topic))
            wlog(w, 2, "claims: input topic %s has no entry of its own (the \"*\" entry, if any, "
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
    if (split_props(w)) {
        snprintf(errstr, errlen, "out of memory");
        goto fail;
    }
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
    json_escape(w->worker_id_json, sizeof w->worker_id_json, w->worker_id);
    log_claims(w); /* after worker_id: every log line names the worker */
    /* the endpoint first: /healthz answers while the model loads and the clients connect, and
     * /readyz says "starting" until worker_new returns (a probe sees every stage) */
    if (w->cfg.metrics_port > 0) {
        metrics_handlers_t mh = {.render = metrics_render, .ready = metrics_ready,
                                 .healthy = metrics_healthy, .arg = w};
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
        wlog(w, 2, "metrics on http://%s:%d/metrics", w->cfg.metrics_bind,
             metrics_server_port(w->metrics));
        if (metrics_server_health_port(w->metrics) >= 0)
            wlog(w, 2, "health on http://%s:%d/healthz", w->cfg.metrics_bind,
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
        wmodel_t *m = model_load(w, &specs[i], w->tier2 && i == def, errstr, errlen);
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
        .dr = on_delivery,
        .dr_arg = w,
        .log = hook_log,
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
            wlog(w, 1, "%s (results wait until it exists)", e);
    }
    if (*w->cfg.stream_topic || *w->cfg.usage_topic) {
        producer_config_t ac = pc;
        ac.transactional_id = NULL; /* chunks are best effort, outside any transaction */
        ac.dr = on_aux_delivery;
        w->aux = producer_new(&ac, errstr, errlen);
        if (!w->aux) goto fail;
        char e[256];
        if (*w->cfg.stream_topic &&
            producer_prepare_topic(w->aux, w->cfg.stream_topic, 5000, e, sizeof e))
            wlog(w, 1, "%s (stream chunks fail until it exists)", e);
        if (*w->cfg.usage_topic &&
            producer_prepare_topic(w->aux, w->cfg.usage_topic, 5000, e, sizeof e))
            wlog(w, 1, "%s (usage records fail until it exists)", e);
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
    consumer_config_t cc = {
        .brokers = w->cfg.brokers,
        .group_id = w->cfg.group_id,
        .topics = topics ? topics : w->cfg.input_topics,
        .prop_keys = (const char *const *)w->prop_c_keys,
        .prop_values = (const char *const *)w->prop_c_vals,
        .n_props = w->n_prop_c,
        .commit_offsets = w->cfg.delivery == WORKER_ALO,
    };
    consumer_hooks_t hooks = {.arg = w, .before_revoke = hook_before_revoke, .drop = hook_drop,
                              .lost = hook_lost, .committed = hook_committed,
                              .log = hook_log};
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
    wlog(w, 2,
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
    wlog(w, 0, "shutdown blocked while %s for longer than shutdown.timeout.ms=%d: exiting now "
               "(uncommitted work will be consumed again)",
         atomic_load(&d->stage), w->cfg.shutdown_timeout_ms);
    if (fatal) wlog(w, 0, "fatal: %s", msg);
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
    wlog(w, 3, "shutdown: %s", stage);
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

/* ---- consumer lag cache (see lag_mu in struct worker) ---- */

/* Asks the lag thread for a refresh now. Any thread. */
static void lag_kick(worker_t *w)
{
    pthread_mutex_lock(&w->lag_mu);
    w->lag_kick = 1;
    pthread_cond_signal(&w->lag_cv);
    pthread_mutex_unlock(&w->lag_mu);
}

/* The lag thread: one refresh (consumer_lag under cons_mu, round trips bounded by 500 ms each),
 * then waits metrics.lag_refresh_ms or until kicked or stopped. A failed refresh keeps the
 * last good values (their age is on /metrics). */
static void *lag_main(void *arg)
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
static void lag_thread_stop(worker_t *w)
{
    if (!w->lag_th_on) return;
    pthread_mutex_lock(&w->lag_mu);
    w->lag_stop = 1;
    pthread_cond_signal(&w->lag_cv);
    pthread_mutex_unlock(&w->lag_mu);
    pthread_join(w->lag_th, NULL);
    w->lag_th_on = 0;
}

int worker_run(worker_t *w, const volatile sig_atomic_t *stop, char *errstr, size_t errlen)
{
    pthread_t th;
    if (pthread_create(&th, NULL, engine_main, w)) {
        snprintf(errstr, errlen, "cannot start the engine thread");
        return -1;
    }
    if (!pthread_getcpuclockid(th, &w->st.eng_clock)) atomic_store(&w->st.eng_alive, 1);
    if (!pthread_getcpuclockid(pthread_self(), &w->st.poll_clock)) atomic_store(&w->st.poll_alive, 1);
    if (w->metrics) {
        if (pthread_create(&w->lag_th, NULL, lag_main, w))
            wlog(w, 1, "cannot start the lag thread: /metrics reports no consumer lag");
        else
            w->lag_th_on = 1;
    }
    for (wmodel_t *m = w->models; m; m = m->next)
        wlog(w, 2, "model %s: %s (%s), fingerprint %s%s%s", m->name, m->path, m->arch, m->fp_hex,
             strcmp(m->name, w->default_model) ? "" : ", the default",
             m->cache ? ", prefix cache tier 2" : "");
    wlog(w, 2, "started: model %s, group %s, input %s -> %s (DLQ %s), %s", w->default_model,
         w->cfg.group_id, w->cfg.input_topics, w->cfg.output_topic, w->cfg.dlq_topic,
         w->cfg.delivery == WORKER_EOS ? "exactly-once" : "at-least-once");
    w->last_commit_ms = mono_ms();
    w->usage_start_ms = wall_ms();
    while (!(stop && *stop) && !atomic_load(&w->stop_req) && !is_fatal(w)) {
        if (w->stats_flag && *w->stats_flag) {
            *w->stats_flag = 0;
            worker_log_stats(w);
        }
        if (w->reload_flag && *w->reload_flag && !w->job) {
            *w->reload_flag = 0;
            reload_start(w);
        }
        reload_finish(w);
        flow_control(w);
        pthread_mutex_lock(&w->mu);
        int have_out = w->outbox != NULL;
        pthread_mutex_unlock(&w->mu);
        int64_t t0 = mono_ns();
        atomic_store(&w->st.last_poll_ms, mono_ms());
        rd_kafka_message_t *m = consumer_poll(w->cons, have_out ? 0 : w->cfg.poll_ms);
        add_since(&w->st.ns_poll, t0);
        if (m) intake(w, m);
        t0 = mono_ns();
        drain_outbox(w);
        producer_poll(w->prod, 0);
        if (w->aux) producer_poll(w->aux, 0);
        t0 = add_since(&w->st.ns_produce, t0);
        periodic_commit(w, 0);
        add_since(&w->st.ns_commit, t0);
        usage_records(w, 0);
        throughput_tick(w);
        char e[512];
        if (producer_fatal(w->prod, e, sizeof e)) set_fatal(w, "%s", e);
        atomic_store(&w->st.inflight, consumer_pending(w->cons));
        int n_assigned = consumer_n_assigned(w->cons);
        if (atomic_exchange(&w->st.assigned, n_assigned) != n_assigned) lag_kick(w);
    }

    /* drain: stop intake, finish what is in flight, commit; a load in progress is abandoned */
    if (w->job) {
        if (w->job->started) pthread_join(w->job->th, NULL);
        job_free(w->job);
        w->job = NULL;
    }
    int fatal = is_fatal(w);
    watchdog_t wd;
    pthread_t wd_th;
    int wd_on = !watchdog_start(&wd, &wd_th, w,
                                (fatal ? 0 : (int64_t)w->cfg.drain_timeout_ms) +
                                    w->cfg.shutdown_timeout_ms);
    if (!wd_on) wlog(w, 1, "cannot start the shutdown watchdog: shutdown is not bounded");
    if (!fatal) {
        int pending = consumer_pending(w->cons);
        wlog(w, 2, "draining %d in-flight request(s) (up to %d ms)", pending, w->cfg.drain_timeout_ms);
        consumer_pause(w->cons);
        int64_t end = mono_ms() + w->cfg.drain_timeout_ms;
        while (consumer_pending(w->cons) > 0 && mono_ms() < end && !is_fatal(w)) {
            rd_kafka_message_t *m = consumer_poll(w->cons, 5);
            if (m) rd_kafka_message_destroy(m); /* paused: not accepted, not tracked */
            drain_outbox(w);
            producer_poll(w->prod, 5);
            periodic_commit(w, 0);
        }
        drain_outbox(w);
        if (w->cfg.delivery == WORKER_EOS) {
            txn_commit(w);
        } else {
            producer_flush(w->prod, 5000);
            producer_poll(w->prod, 0);
        }
        if (consumer_pending(w->cons) > 0)
            wlog(w, 1, "drain timeout: %d request(s) left uncommitted", consumer_pending(w->cons));
        fatal = is_fatal(w);
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
    usage_records(w, 1); /* the last period, up to the last output counted */
    if (wd_on) watchdog_stage(&wd, w, "leaving the consumer group");
    consumer_leave(w->cons);
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
        if (engine_cancel(r->model->eng, r->engine_id)) { /* unknown to the engine: free it */
            active_remove(w, r);
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
    lag_thread_stop(w);
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
    wlog(w, 2, "stopped: %" PRIu64 " consumed, %" PRIu64 " results (%" PRIu64 " expired), %" PRIu64
               " DLQ, %" PRIu64 " dropped",
         st.consumed, st.results, st.expired, st.dlq, st.revoked_dropped);
    if (fatal) {
        pthread_mutex_lock(&w->mu);
        snprintf(errstr, errlen, "%s", w->fatal_msg);
        pthread_mutex_unlock(&w->mu);
        wlog(w, 0, "fatal: %s", errstr);
        return -1;
    }
    return 0;
}

void worker_free(worker_t *w)
{
    if (!w) return;
    metrics_server_free(w->metrics); /* first: its thread reads everything below */
    w->metrics = NULL;
    if (w->cons) consumer_close(w->cons);
    w->cons = NULL;
    if (w->prod) producer_free(w->prod, 0);
    producer_free(w->aux, 0);
    while (w->models) {
        wmodel_t *m = w->models;
        w->models = m->next;
        model_free(m);
    }
    free(w->snap);
    usage_free(w->usage);
    free(w->active);
    for (int i = 0; i < w->n_reply_allow; i++) free(w->reply_allow[i]);
    free(w->reply_allow);
    claims_free(w->claims);
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
    }
    pthread_mutex_unlock(&m->models_mu);
}
