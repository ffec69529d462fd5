/* worker/worker_int.h: what the worker's files share. Private to worker/ (as librdkafka's
 * rdkafka_int.h): the public interface is worker/worker.h.
 *
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
#ifndef SPILLWAY_WORKER_WORKER_INT_H
#define SPILLWAY_WORKER_WORKER_INT_H

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
#include "common/clock.h"
#include "common/log.h"
#include "consumer/consumer.h"
#include "records/records.h"
#include "engine/engine.h"
#include "producer/producer.h"
#include "worker/claims.h"
#include "worker/metrics.h"
#include "worker/usage.h"
#include "worker/worker.h"

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
    uint64_t engine_id;          /* choice 0's when req.n > 1 */
    uint64_t *choice_ids;        /* req.n > 1: [req.n] engine ids, choice i = index i (owned) */
    int n_left;                  /* req.n > 1: choices not finished yet */
    int choice_fail;             /* req.n > 1: a choice could not be submitted (dlq_msg) */
    json_t *choices;             /* req.n > 1: [req.n] finished choices (wres_choice; owned) */
    int choice0_cached;          /* req.n > 1: choice 0's n_cached */
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
    /* forwarding (worker/forward.c; poll thread) */
    int hop;                     /* came through forward.topic: served here, never forwarded */
    const char *fwd_reason;      /* the output is the original message, to forward.topic
                                    partition fwd_part: "overload" | "affinity" (static); NULL */
    int32_t fwd_part;
    char fwd_to[128];            /* the target worker, for the log line */
};

typedef struct {
    atomic_uint_fast64_t consumed, results, dlq, expired, produce_retries, txn_commits, txn_aborts,
        commits, pauses, resumes, prompt_tokens, completion_tokens, cached_tokens, dropped, ttft_n,
        ttft_us_sum, producer_restarts, producer_fences;
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
    /* forwarding (worker/forward.c): requests handed to another worker, by reason (FWD_*), and
     * received; over the budget with no worker to take them; registry round trips failed;
     * fresh workers in the registry (this one included) */
    atomic_uint_fast64_t fwd_out[2], fwd_in, fwd_no_target, fwd_registry_errors;
    atomic_int fwd_peers;
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

extern const char *const FINISH_NAMES[N_FINISH];

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
    struct wfwd *fwd;            /* forwarding (worker/forward.c; poll thread), NULL = off */
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

    /* KV fetch from peer hosts (worker/peer.c): between intake and the inbox, requests wait in
     * peer_q while the peer thread fetches their prefix; peer_mu guards peer_q and peer_stop;
     * peer_on is set and read by the poll thread only */
    pthread_mutex_t peer_mu;
    pthread_cond_t peer_cv;
    pthread_t peer_th;
    int peer_on, peer_stop;
    wreq_t *peer_q, *peer_q_tail;

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
    const char **class_names;    /* [n_classes] their names (records_admit's rules; owned array,
                                    names borrowed from classes) */
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
    int64_t fence_ms;            /* the last fence recovered from (monotonic ms); 0 = none */
    stats_t st;
};

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

/* Opaques of the side producer's records (worker/stream.c), compared by address. */
extern const char AUX_CHUNK[];
extern const char AUX_USAGE[];

/* Exactly-once: entries of w->refused kept at most (worker/output.c). */
#define REFUSED_MAX 64

/* ---- small helpers (any thread) ---- */
/* ---- small helpers ---- */

static inline int64_t mono_ns(void) { return sw_mono_ns(); }
static inline int64_t mono_ms(void) { return sw_mono_ms(); }

/* Adds the ns since t0 to counter c and returns now. */
static inline int64_t add_since(atomic_uint_fast64_t *c, int64_t t0)
{
    int64_t now = mono_ns();
    atomic_fetch_add_explicit(c, (uint64_t)(now - t0), memory_order_relaxed);
    return now;
}

static inline double bits_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}
static inline uint64_t double_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}
/* One sample into the exponential moving average stored in *bits (NaN: none yet), over about
 * n samples (alpha = 2 / (n + 1)). One writer. */
static inline void ewma_add(atomic_uint_fast64_t *bits, double x, int n)
{
    double m = bits_double(atomic_load(bits)), a = 2.0 / (n + 1.0);
    atomic_store(bits, double_bits(isnan(m) ? x : m + a * (x - m)));
}

static inline int64_t thread_cpu_ns(clockid_t id)
{
    struct timespec ts;
    if (clock_gettime(id, &ts)) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static inline int64_t wall_ms(void) { return sw_wall_ms(); }

/* ---- worker/log.c ---- */
void wlog_json_escape(char *dst, size_t cap, const char *s);
void wlog(worker_t *w, int level, const char *fmt, ...);
void wlog_hook(void *arg, int level, const char *msg);
void wfatal_set(worker_t *w, const char *fmt, ...);
int wfatal_is(worker_t *w);

/* ---- worker/wreq.c ---- */
void wreq_free(worker_t *w, wreq_t *r);
int wreq_deadline_passed(const wreq_t *r);
/* What the engine thread submits for r (parsed): its prompt tokens (*n of them; r keeps them) and
 * its cache scope (r's tenant under cache.isolation tenant, else NULL). Forwarding and the peer
 * prefetch name r's KV blocks from these, so they name what the engine will look up. */
const int32_t *wreq_prompt(const wreq_t *r, int *n);
const char *wreq_cache_scope(const worker_t *w, const wreq_t *r);

/* ---- worker/models.c ---- */
void wmodel_release(worker_t *w, wreq_t *r);
wmodel_t *wmodel_acquire(worker_t *w, const char *name);
void wmodel_free(wmodel_t *m);
wmodel_t *wmodel_load(worker_t *w, const worker_model_spec_t *spec, int with_tier2,
                            char *errstr, size_t errlen);
void wmodel_job_free(struct reload_job *j);
void wmodel_reload_start(worker_t *w);
void wmodel_reload_finish(worker_t *w);

/* ---- worker/result.c ---- */
void woutbox_push(worker_t *w, wreq_t *r);
void wres_dlq(wreq_t *r, const char *code, const char *msg);
int wres_result(worker_t *w, wreq_t *r, const engine_result_t *er, const char *finish);
/* req.n > 1: records choice `index` of r from er (text, finish, logprobs; tokens and compute
 * summed into r) for wres_result. 0 or -1 (out of memory). Engine thread. */
int wres_choice(worker_t *w, wreq_t *r, const engine_result_t *er, const char *finish, int index);

/* ---- worker/engine_thread.c ---- */
void weng_active_remove(worker_t *w, wreq_t *r);
/* engine_cancel of every engine sequence of r (its choices); each one's done callback runs, and
 * the last may free r. 0 when the engine knew one of them, -1 when none. Engine thread. */
int weng_cancel(worker_t *w, wreq_t *r);
void *weng_main(void *arg);

/* ---- worker/stream.c ---- */
void wstream_chunk(worker_t *w, wreq_t *r, const char *delta, size_t len, int n_tokens,
                       const char *finish);
void wstream_finish(worker_t *w, wreq_t *r, const char *text, size_t len, int n_tokens,
                          const char *finish);

/* ---- worker/output.c ---- */
void wout_hook_committed(void *arg, int ok, int64_t ns);
void wout_hook_drop(void *arg, void *user);
void wout_hold(worker_t *w, wreq_t *r);
void wout_send(worker_t *w, wreq_t *r);
void wout_on_delivery(void *arg, void *opaque, rd_kafka_resp_err_t err);
void wout_on_aux_delivery(void *arg, void *opaque, rd_kafka_resp_err_t err);
void wout_drain(worker_t *w);
int wout_txn_commit(worker_t *w);
/* The producer raised a fatal error (err: its text). Exactly-once, a fence is recovered from
 * (see output.c); anything else stops the worker (wfatal_set). Poll thread. */
void wout_producer_fatal(worker_t *w, const char *err);
void wout_hook_before_revoke(void *arg);
void wout_hook_lost(void *arg);
void wout_usage_records(worker_t *w, int force);
void wout_throughput_tick(worker_t *w);
void wout_periodic_commit(worker_t *w, int force);

/* ---- worker/admit.c ---- */
void wadmit_intake(worker_t *w, rd_kafka_message_t *m);
/* Hands r (ownership moves) to the engine thread: appends it to w's inbox and wakes that
 * thread. Any thread (takes w->mu). */
void wadmit_inbox_push(worker_t *w, wreq_t *r);

/* ---- worker/peer.c ---- */
void wpeer_start(worker_t *w);
void wpeer_stop(worker_t *w);
int wpeer_offer(worker_t *w, wreq_t *r);
void wpeer_note_done(worker_t *w, const wreq_t *r, const engine_result_t *res);

/* ---- worker/overload.c ---- */
void wover_flow_control(worker_t *w);

/* ---- worker/forward.c: handing requests to other workers of the group (README
 * "Forwarding"). Poll thread, except wfwd_render (the metrics thread: atomics only). ---- */
enum { FWD_OVERLOAD, FWD_AFFINITY };
/* Starts forwarding when forward.topic is set (w->fwd; NULL otherwise): the registry's Redis
 * connection is made lazily. 0, or -1 with errstr. */
int wfwd_new(worker_t *w, char *errstr, size_t errlen);
/* Removes this worker's registry entry (best effort) and frees w->fwd. NULL-safe. */
void wfwd_free(worker_t *w);
/* *topics (malloc'd, or NULL for w->cfg.input_topics) with forward.topic appended unless listed.
 * 0 or -1 (out of memory). */
int wfwd_subscription(worker_t *w, char **topics);
/* Each turn of the poll loop: the overload clock, and the registry (publish this worker's
 * forwarding-topic partitions, host and load; read the others') when due or the assignment
 * changed. */
void wfwd_tick(worker_t *w);
/* Intake, right after r is tracked: marks (r->hop) and counts a record that came through
 * forward.topic. */
void wfwd_intake(worker_t *w, wreq_t *r);
/* Intake, once r is ready for the engine (prompt tokenised, cost known): 1 when r is to be
 * forwarded (r->fwd_* set, r->cost 0: the caller sends it with wout_send), else 0. */
int wfwd_decide(worker_t *w, wreq_t *r);
/* wout_send's producer call for a forwarded r (op: the delivery opaque). As producer_send. */
int wfwd_send(worker_t *w, wreq_t *r, void *op, char *err, size_t errlen);
/* r's forward is durable (or in the open transaction): counts and logs it. */
void wfwd_done(worker_t *w, const wreq_t *r);
void wfwd_render(worker_t *w, metrics_buf_t *b);

/* ---- worker/exposition.c ---- */
void wexpo_render(void *arg, metrics_buf_t *b);
int wexpo_healthy(void *arg, char *why, size_t len);
int wexpo_ready(void *arg, char *why, size_t len);

/* ---- worker/lag.c ---- */
void wlag_kick(worker_t *w);
void *wlag_main(void *arg);
void wlag_thread_stop(worker_t *w);

#endif
