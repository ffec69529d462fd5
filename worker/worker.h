/* worker/worker.h: the worker module: `spillway worker`'s configuration and its main loop.
 *
 * A worker_t is one member of a Kafka consumer group. It consumes prompt messages from the input
 * topic(s), runs them through the engine's continuous batching and produces one result per
 * accepted message to the output topic, or one dead-letter record to the DLQ topic for a message
 * that cannot be served. Offsets are committed per partition only up to the lowest message whose
 * result (or DLQ record) is not yet durable (at-least-once), or together with the results in one
 * Kafka transaction (exactly-once).
 *
 * Threads: worker_run() runs the Kafka side (consume, produce, commit, rebalances) on the
 * calling thread and the engine on a thread of its own; worker_stop() may be called from any
 * thread. Errors: 0 / -1 (or NULL) plus the caller's errstr. */
#ifndef SPILLWAY_WORKER_H
#define SPILLWAY_WORKER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- configuration ------------------------------------------------------------------------ */

/* One librdkafka property passed through untouched (-X key=value). A key prefixed "consumer."
 * or "producer." applies to that client only (the prefix is removed). */
typedef struct {
    char *key, *value;  /* owned */
    char *source;       /* owned: "file:PATH:LINE", "env:NAME" or "cli" */
} worker_kafka_prop_t;

enum { WORKER_ALO = 0, WORKER_EOS = 1 }; /* delivery: at-least-once, exactly-once */
/* The output producer's message.max.bytes is limits.max_message_bytes plus this (bytes, for a
 * dead letter's key and headers), and at least librdkafka's default 1000000. */
#define WORKER_DLQ_OVERHEAD_BYTES 65536

/* Record header of a result whose request had a correlation_id (value: that id, UTF-8). */
#define WORKER_H_CORRELATION_ID "correlation_id"

/* Every setting of the worker. All defaults live in one table in worker/config.c
 * (worker_config_default); `spillway config` prints it. Strings are owned by the struct. */
typedef struct {
    /* Kafka */
    char *brokers;             /* bootstrap.servers */
    char *input_topics;        /* comma-separated input topic list */
    char *output_topic;        /* results */
    char *dlq_topic;           /* dead letters */
    char *reply_topics;        /* comma-separated topics allowed as a request's reply_to */
    char *stream_topic;        /* partial results of "stream" requests; "" = off */
    int stream_every_tokens;   /* chunk period in generated tokens (0 = time only) */
    int stream_every_ms;       /* chunk period in ms (0 = tokens only) */
    char *usage_topic;         /* periodic per-tenant usage records; "" = none */
    int usage_interval_ms;
    int usage_max_tenants;     /* tenant / class label bounds (worker/usage.h) */
    int usage_max_classes;
    int autoscale_avg_results; /* moving-average windows of the autoscaling estimates */
    int autoscale_avg_seconds;
    char *group_id;            /* consumer group */
    char *worker_id;           /* this worker's name in results and DLQ headers; "" = host-pid */
    char *transactional_id;    /* exactly-once: "" = spillway-<group>-<worker_id> */
    int delivery;              /* WORKER_ALO / WORKER_EOS ("at-least-once" / "exactly-once") */
    int commit_interval_ms;    /* offset commit / transaction period */
    int txn_commit_timeout_ms; /* exactly-once: a commit or abort longer than this leaves the
                                  outcome unknown: the producer instance is replaced */
    int txn_fence_window_ms;   /* exactly-once: a fence is recovered from (producer replaced)
                                  unless the last one was less than this long ago; 0 = never */
    int output_max_retries;    /* an output refused with a permanent error is sent again at most
                                  this many times, then dead-lettered */
    long dlq_truncate_bytes;   /* a dead letter refused for its size carries this much of the
                                  value */
    int drain_timeout_ms;      /* SIGTERM: time to finish in-flight work before closing */
    int shutdown_timeout_ms;   /* then closing the clients; past it the process exits (status 1) */
    int max_inflight;          /* accepted messages without a durable result, at most */
    long max_inflight_bytes;   /* their message bytes, at most */
    long max_inflight_tokens;  /* prompt tokens + max_tokens of those given to the engine */
    int poll_ms;               /* longest consumer poll wait */
    /* service classes and overload steps (README "Service classes") */
    char *classes;             /* "name:priority=P:ttft_ms=T:max_queue_ms=Q,..." */
    char *class_default;       /* class of a request without "class" */
    char *claims;              /* per input topic, the tenants and classes its requests may
                                  claim (worker/claims.h); "" = unchecked */
    char *deferral_topic;      /* step shed: lowest-class messages go there ("" = no shedding) */
    int overload_shed_at;      /* pressure (percent) of step 1, shed */
    int overload_cap_at;       /* of step 2, cap max_tokens of classes below the top */
    int overload_refuse_at;    /* of step 3, refuse them (result "overloaded") */
    int overload_cap_tokens;   /* the cap of step 2 */
    int overload_cooldown_ms;  /* pressure below a step's threshold this long: one step down */
    int overload_window_ms;    /* steps only while a top-class message arrived within this */
    /* forwarding to other workers of the group (README "Forwarding") */
    char *forward_topic;       /* "" = off */
    int forward_overload_pct;  /* forwarding budget, percent of the in-flight limits; 0 = off */
    int forward_overload_ms;   /* over it this long: forward */
    int forward_affinity_min_blocks; /* leading blocks elsewhere minus here; 0 = off */
    int forward_registry_ttl_ms;     /* ownership entries older are stale */
    int forward_log_per_s;     /* forward log lines per second, at most */
    /* engine */
    char *model;               /* GGUF path, served under its file stem */
    char *models;              /* "name=path,..." (worker_models_parse) */
    char *model_default;       /* name of the model of a request without "model"; "" = first */
    char *backend;             /* "cpu" | "cuda" | "auto" */
    int cuda_device;           /* CUDA backend: device index (0) */
    char *cuda_dtype;          /* CUDA backend: device weight type "bf16" | "f16" | "f32" */
    double cuda_mem_fraction;  /* CUDA backend: share of the free device memory (0.9) */
    int threads;               /* 0 = one per CPU */
    int max_seqs;              /* sequences per batch */
    int max_batch_tokens;      /* tokens per forward step */
    int kv_blocks;             /* 0 = from kv_mem_mb */
    int kv_mem_mb;
    char *kv_type;             /* f16 | f32 */
    int block_tokens;
    int max_ctx;               /* 0 = the model's */
    int prefix_cache;          /* 0/1 */
    int cpu_pack;              /* 0/1: engine_config_t.cpu_pack */
    char *chat_template;       /* "" = the model's tokenizer.chat_template */
    int sched_window;          /* admission candidates (engine_config_t.sched_*) */
    int sched_aging_ms;
    int sched_urgent_ms;
    /* prefix cache tier 2 (cache/cache.h): host arena + Redis index */
    char *cache_redis_host;    /* "" = off */
    int cache_redis_port;
    char *cache_redis_user;
    char *cache_redis_password;
    int cache_redis_db;
    char *cache_namespace;
    int cache_connect_timeout_ms;
    int cache_cmd_timeout_ms;
    int cache_backoff_min_ms;
    int cache_backoff_max_ms;
    int cache_health_ms;
    char *cache_arena_path;
    long cache_arena_mb;
    char *cache_host_id;       /* "" = hostname */
    int cache_write_queue;
    int cache_fleet_refresh_ms;
    int cache_fleet_ttl_ms;
    char *cache_peer_listen;   /* "" = this host serves no blocks */
    char *cache_peer_advertise;
    int cache_peer_fetch;
    int cache_peer_timeout_ms;
    int cache_peer_bandwidth_mbps;
    int cache_peer_rtt_us;
    int cache_peer_prefill_tps;
    char *cache_secret_file;   /* keys the KV block names (tier 2 only) */
    char *cache_isolation;     /* "tenant" | "none" */
    /* request limits */
    long max_message_bytes;
    long max_prompt_bytes;
    int max_prompt_tokens;     /* 0 = context limit only */
    int max_tokens;            /* largest max_tokens a request may ask */
    int default_max_tokens;    /* when a request names none */
    int max_input_ids;         /* input_ids entries */
    int max_messages;          /* chat messages */
    int max_stop;              /* stop strings */
    int max_n;                 /* choices per request ("n") */
    int max_stop_bytes;        /* bytes per stop string */
    long max_metadata_bytes;   /* metadata, compact JSON */
    int max_id_bytes;          /* id length */
    /* logging */
    int log_level;             /* 0 error, 1 warn, 2 info, 3 debug ("error".."debug") */
    char *log_format;          /* "text" | "json" */
    /* metrics endpoint */
    int metrics_port;          /* 0 = off */
    char *metrics_bind;
    int metrics_health_port;   /* 0 = none */
    int metrics_max_conns, metrics_max_conns_per_ip, metrics_timeout_s;
    int metrics_lag_refresh_ms;
    /* producer routing (`spillway produce` and `spillway batch`; producer/route.h) */
    char *route_mode;          /* "affinity" | "bytes" | "random" */
    long route_prefix_bytes;   /* canonical prompt bytes in a routing key (0 = key by id) */
    double route_eps;          /* load cap = ceil((1 + eps) * mean) */
    long route_window;         /* messages in the load window */
    long route_vnodes;         /* ring points per partition */

    worker_kafka_prop_t *kafka; /* [n_kafka] pass-through properties, in the order given */
    int n_kafka;
    char **source;             /* [worker_config_n_keys()] where each key's value came from */
} worker_config_t;

/* Fills every key with its default; source "default". 0 or -1 (out of memory). */
int worker_config_default(worker_config_t *c);
void worker_config_free(worker_config_t *c);
/* Deep copy of src into dst (uninitialised). 0 or -1 (out of memory). */
int worker_config_copy(worker_config_t *dst, const worker_config_t *src);

/* Sets one key from its text form ("batch.max_seqs", "32"). source is copied. 0, or -1 for an
 * unknown key or a bad value (errstr names the key and the accepted values). */
int worker_config_set(worker_config_t *c, const char *key, const char *value, const char *source,
                      char *errstr, size_t errlen);
/* Adds a librdkafka property from "key=value". 0 or -1 (no '='). */
int worker_config_add_kafka(worker_config_t *c, const char *kv, const char *source, char *errstr,
                            size_t errlen);
/* Reads a key=value file: '#' comments, blank lines, whitespace around key and value; a key
 * prefixed "kafka." is a librdkafka property (prefix removed), anything else a worker key.
 * 0 or -1 (unreadable file, or the first bad line: errstr names FILE:LINE). */
int worker_config_load_file(worker_config_t *c, const char *path, char *errstr, size_t errlen);
/* Applies SPILLWAY_<KEY> environment variables (KEY upper-cased, '.' -> '_', e.g.
 * SPILLWAY_BATCH_MAX_SEQS). 0 or -1 on a bad value. */
int worker_config_load_env(worker_config_t *c, char *errstr, size_t errlen);
/* Cross-key checks (topics set, limits consistent). 0 or -1. */
int worker_config_check(const worker_config_t *c, char *errstr, size_t errlen);
/* A service class (the `classes` key). */
typedef struct {
    char name[65];
    int priority;              /* admission: higher first (engine priority = this x 2001 +
                                  the request's own priority in -1000..1000) */
    int ttft_ms;               /* latency target the overload steps protect (0 = none) */
    int max_queue_ms;          /* longest wait in Kafka before an "expired" result (0 = none) */
} worker_class_t;

/* Parses a `classes` spec: "name[:priority=P][:ttft_ms=T][:max_queue_ms=Q],..." (1..32
 * classes, names unique, 1..64 bytes of A-Z a-z 0-9 _ . -; P in -1000..1000, T and Q >= 0,
 * default 0). On success *out is malloc'd (caller frees) and *n set; -1 + errstr otherwise. */
int worker_classes_parse(const char *spec, worker_class_t **out, int *n, char *errstr,
                         size_t errlen);
/* A model the worker serves (the `models` and `model` keys). */
#define WORKER_MAX_MODELS 16
typedef struct {
    char name[65];             /* what a request's "model" names; results carry it */
    char path[1024];           /* GGUF file */
} worker_model_spec_t;

/* The models c asks for: the entries of `models` ("name=path,...": names 1..64 bytes of A-Z a-z
 * 0-9 _ . -, unique; blank entries skipped) in order, then `model` (if set) under its file name
 * without directories and ".gguf" unless an entry of that name has the same path (another path:
 * an error). At least one, at most WORKER_MAX_MODELS. *def: index of model.default ("" = 0).
 * On success *out is malloc'd (caller frees); -1 + errstr otherwise. */
int worker_models_parse(const worker_config_t *c, worker_model_spec_t **out, int *n, int *def,
                        char *errstr, size_t errlen);
/* Prints "key = value  # source" for every key (a real number in the shortest form that reads
 * back as the same double: 0.8, not 0.80000000000000004), then the pass-through properties. */
void worker_config_print(const worker_config_t *c, FILE *out);

int worker_config_n_keys(void);
/* Name and help of key i (0 <= i < worker_config_n_keys()). */
const char *worker_config_key_name(int i);
const char *worker_config_key_help(int i);

/* Key i's entry in the key table (worker/config.c), the one source of its default, range and
 * help: the README's configuration reference, `spillway config --keys` and the engine flags of
 * `spillway generate` are printed from it. Pointers are to static text. */
typedef struct {
    const char *name;
    const char *section; /* heading of the module that owns the key, e.g. "Prefix cache" */
    const char *def;     /* default, as text ("" for an empty string) */
    const char *help;    /* its meaning (Markdown: `code` spans) */
    const char *choices; /* the values it takes, '|'-separated, or NULL (any text / a number) */
    int integer;         /* 1: an integer in [lo, hi] */
    long lo, hi;
    int real;            /* 1: a number in [real_lo, real_hi] (printed in its shortest form) */
    double real_lo, real_hi;
} worker_config_key_t;
/* 0 and *out filled, or -1 when i is out of range. */
int worker_config_key(int i, worker_config_key_t *out);
/* Index of the key named name, or -1. */
int worker_config_find_key(const char *name);
/* Checks text as a value of key i exactly as worker_config_set would; for an integer (or
 * boolean: 0/1) key stores the value in *num (may be NULL; untouched for a real key). 0, or -1 +
 * errstr naming the key. */
int worker_config_parse_value(int i, const char *text, long *num, char *errstr, size_t errlen);

/* ---- the worker ---------------------------------------------------------------------------- */

typedef struct worker worker_t;

/* Loads the model and creates the Kafka clients (nothing is consumed before worker_run).
 * cfg is copied. NULL + errstr on failure. */
worker_t *worker_new(const worker_config_t *cfg, char *errstr, size_t errlen);
/* Consumes until *stop becomes non-zero (a flag main's signal handler sets; may be NULL) or
 * worker_stop() is called, then drains: stops intake, finishes in-flight work within the drain
 * timeout, commits and closes the consumer. 0 after a clean drain, -1 on a fatal error (errstr;
 * e.g. a fenced transactional producer): the process should exit and be restarted. */
int worker_run(worker_t *w, const volatile sig_atomic_t *stop, char *errstr, size_t errlen);
/* Asks a running worker_run to drain and return. Any thread. */
void worker_stop(worker_t *w);
/* Optional: a flag (e.g. set by a SIGUSR1 handler) that worker_run checks on every loop turn;
 * when it is non-zero worker_run logs the stats line (worker_log_stats) and sets it back to 0.
 * Call before worker_run; flag must outlive it. */
void worker_set_stats_flag(worker_t *w, volatile sig_atomic_t *flag);
/* Builds a fresh configuration for a model reload (e.g. by parsing the command line and config
 * file again); the worker takes its `models`, `model` and `model.default` from it (the other
 * keys keep their values from worker_new). 0 with *out filled (the worker frees it with
 * worker_config_free), or -1 + errstr. Called on worker_run's thread. */
typedef int (*worker_reload_fn)(void *arg, worker_config_t *out, char *errstr, size_t errlen);
/* Optional: a flag (e.g. set by a SIGHUP handler) that worker_run checks on every loop turn;
 * when it is non-zero worker_run sets it back to 0 and reloads the models: fn gives the new
 * model keys; versions whose file changed (path, inode, size, mtime) and new names are loaded
 * on a thread of their own while serving goes on; if any fails to load nothing changes (logged,
 * spillway:model_reloads_total{outcome="failed"}). Otherwise each new version takes over its
 * name for new messages, the version it replaces finishes the requests it already holds and is
 * then freed; names no longer configured stop taking messages (unknown_model). No message is
 * dropped or served twice: offsets are committed with results as always. Call before
 * worker_run; flag and arg must outlive it. */
void worker_set_reload(worker_t *w, volatile sig_atomic_t *flag, worker_reload_fn fn, void *arg);
/* Logs one info line of counters and per-phase times ("stats: key=value ..."), the line
 * worker_run also logs when it returns. Any thread. */
void worker_log_stats(worker_t *w);
void worker_free(worker_t *w);

typedef struct {
    uint64_t consumed;         /* messages accepted from Kafka */
    uint64_t results;          /* results made durable (acknowledged / committed) */
    uint64_t dlq;              /* DLQ records made durable */
    uint64_t expired;          /* results with finish_reason "expired" */
    uint64_t produce_retries;  /* outputs produced again after a failed delivery */
    uint64_t txn_commits, txn_aborts;
    uint64_t producer_restarts; /* exactly-once: producer instances replaced (outcome unknown,
                                   or fenced) */
    uint64_t producer_fences;   /* exactly-once: fences recovered from (a replacement each) */
    uint64_t commits;          /* offset commits sent (at-least-once) */
    uint64_t pauses, resumes;
    uint64_t prompt_tokens, completion_tokens, cached_tokens;
    uint64_t revoked_dropped;  /* in-flight requests dropped by a revocation or drain timeout */
    double ttft_ms_sum;        /* over results with a first token */
    uint64_t ttft_n;
    int inflight;              /* now */
    int assigned;              /* partitions assigned now */
    /* Where the time went: monotonic ns summed over calls (cheap counters, always on).
     * Poll thread: */
    uint64_t ns_poll;          /* in consumer_poll (waiting included, rebalances included) */
    uint64_t ns_intake;        /* intake of accepted messages: everything below and tracking */
    uint64_t ns_parse;         /*   of which request_parse */
    uint64_t ns_tokenize;      /*   of which chat rendering and tokenisation */
    uint64_t ns_produce;       /* producing outputs, serving delivery reports, acking */
    uint64_t ns_commit;        /* offset commits / transaction commits */
    /* Engine thread: */
    uint64_t ns_submit;        /* engine_submit and finishing requests that need no step */
    uint64_t ns_step;          /* engine_step (result building included) */
    uint64_t ns_result;        /*   of which building result JSON */
    uint64_t ns_idle;          /* waiting for work */
    /* Per request, summed over results: from intake to the first scheduled step, and to the
     * engine thread taking the request from the inbox. */
    uint64_t ns_queue_sum, ns_inbox_sum;
    /* From the first message accepted to the last output made durable (0 before). */
    uint64_t ns_busy;
    /* CPU seconds of the poll thread and of the engine thread (compute pool threads and
     * librdkafka's threads not included) */
    double poll_cpu_s, engine_cpu_s;
    /* Prefix cache, in blocks. Tier 1: the engine's pool; tier 2: the host arena (cache/). */
    int kv_blocks_used, kv_blocks_total;
    uint64_t tier1_lookups, tier1_hits, tier1_evictions;
    uint64_t tier2_lookups, tier2_hits, tier2_stores, tier2_evictions, tier2_torn;
    uint64_t prefix_deferred;  /* admissions put off to share a prefix being computed */
    uint64_t prefix_mismatches; /* blocks found by name holding other tokens: refused */
    int arena_slots, arena_used; /* -1 without tier 2 (arena_used -1: unknown) */
    uint64_t arena_refused;      /* models whose host arena was refused (tier 2 off for them) */
    int redis_up;              /* 1 / 0, -1 without tier 2 */
    uint64_t redis_errors;
    /* KV across hosts (worker/peer.c, cache/peer.c; cache_stats_t's peer_* of that cache) */
    uint64_t peer_fetches, peer_blocks, peer_bytes, peer_recompute, peer_served, peer_refused;
    uint64_t peer_fail[6];     /* fetches that fell short, by CACHE_PEER_E* - 1 */
    double peer_prefill_tps;   /* the cost model's prefill rate */
} worker_stats_t;

/* Counters so far. Any thread (values are read without a lock: each one is exact, the set is
 * not a consistent snapshot). */
void worker_stats(const worker_t *w, worker_stats_t *st);

#endif
