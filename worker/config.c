/* worker/config.c: the worker's settings. KEYS below is the one place that holds every key,
 * its type, its default, range and help, grouped by the module that owns it (SECTIONS);
 * defaults, the file reader, environment overrides, `spillway config` (--keys, and --markdown:
 * the README's configuration reference) and the engine flags of `spillway generate` all walk
 * it. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/claims.h"
#include "worker/worker.h"

enum { K_STR, K_INT, K_LONG, K_BOOL, K_DELIVERY, K_LOGLEVEL, K_CHOICE, K_DOUBLE };
/* K_CHOICE: a string, one of CHOICES' values for the key; K_DOUBLE: a double in REALS' range */

typedef struct {
    const char *name;
    int type;
    size_t off;          /* offset in worker_config_t */
    const char *def;     /* default, text form */
    long lo, hi;         /* numeric range */
    const char *help;
} key_t_;

#define F(x) offsetof(worker_config_t, x)
static const key_t_ KEYS[] = {
    /* ---- Kafka, delivery and flow control (consumer/, producer/, worker/) ---- */
    {"brokers", K_STR, F(brokers), "localhost:9092", 0, 0, "Kafka bootstrap servers"},
    {"input.topics", K_STR, F(input_topics), "prompts", 0, 0, "input topics, comma-separated"},
    {"output.topic", K_STR, F(output_topic), "results", 0, 0, "result topic"},
    {"dlq.topic", K_STR, F(dlq_topic), "prompts.dlq", 0, 0, "dead-letter topic"},
    {"reply.topics", K_STR, F(reply_topics), "", 0, 0,
     "topics a request may name in `reply_to`, comma-separated (\"\" = none: `reply_to` -> DLQ "
     "`reply_not_allowed`)"},
    {"group.id", K_STR, F(group_id), "spillway", 0, 0, "consumer group"},
    {"worker.id", K_STR, F(worker_id), "", 0, 0,
     "name in results and DLQ headers, stable across restarts and unique in the group; "
     "exactly-once derives its `transactional.id` from it (\"\" = host-pid)"},
    {"transactional.id", K_STR, F(transactional_id), "", 0, 0,
     "exactly-once producer id (\"\" = spillway-<group>-<worker.id>)"},
    {"delivery", K_DELIVERY, F(delivery), "at-least-once", 0, 0, "at-least-once | exactly-once"},
    {"commit.interval.ms", K_INT, F(commit_interval_ms), "500", 1, 3600000,
     "offset commit / transaction period"},
    {"transaction.commit.timeout.ms", K_INT, F(txn_commit_timeout_ms), "30000", 100, 3600000,
     "exactly-once: a transaction commit (or abort) not done in this long has an unknown "
     "outcome: the producer instance is replaced (same `transactional.id`, new epoch) and the "
     "input rewound to the committed offsets (see \"Delivery guarantees\")"},
    {"transaction.fence.window.ms", K_INT, F(txn_fence_window_ms), "300000", 0, 86400000,
     "exactly-once: a fenced producer (the broker aborted a transaction that outlived "
     "`transaction.timeout.ms` while the worker was cut off or stalled) is replaced and the "
     "input rewound, unless the last fence was less than this long ago: then another worker "
     "shares its `transactional.id` and it stops (0 = stop on every fence)"},
    {"output.max_retries", K_INT, F(output_max_retries), "3", 0, 1000000,
     "an output the broker refuses with a permanent error is produced again at most this many "
     "times, then dead-lettered"},
    {"dlq.truncate_bytes", K_LONG, F(dlq_truncate_bytes), "65536", 0, 100000000,
     "a dead letter refused for its size is sent again with the first this many bytes of the "
     "value"},
    {"drain.timeout.ms", K_INT, F(drain_timeout_ms), "30000", 0, 86400000,
     "on SIGTERM, time to finish in-flight work"},
    {"shutdown.timeout.ms", K_INT, F(shutdown_timeout_ms), "15000", 1000, 86400000,
     "after the drain (or at once after a fatal error), time to close the Kafka clients; past "
     "it the worker logs the step that blocked and exits with status 1 (uncommitted work is "
     "consumed again)"},
    {"max.inflight", K_INT, F(max_inflight), "2048", 1, 1 << 24,
     "accepted messages without a durable result; partitions pause above it"},
    {"max.inflight.bytes", K_LONG, F(max_inflight_bytes), "67108864", 1, LONG_MAX,
     "message bytes of those messages, at most"},
    {"max.inflight.tokens", K_LONG, F(max_inflight_tokens), "262144", 1, LONG_MAX,
     "prompt tokens + max_tokens of the requests given to the engine, at most"},
    {"poll.ms", K_INT, F(poll_ms), "20", 0, 10000, "longest consumer poll wait"},
    /* ---- Streaming, usage records and autoscaling signals (worker/) ---- */
    {"stream.topic", K_STR, F(stream_topic), "", 0, 0,
     "topic of the partial results of requests with `\"stream\": true` (\"\" = off: final "
     "result only)"},
    {"stream.every_tokens", K_INT, F(stream_every_tokens), "8", 0, 1 << 20,
     "a chunk once this many tokens were generated since the last one (0 = by time only)"},
    {"stream.every_ms", K_INT, F(stream_every_ms), "250", 0, 3600000,
     "a chunk once this many ms passed since the last one (0 = by tokens only)"},
    {"usage.topic", K_STR, F(usage_topic), "", 0, 0,
     "topic of the periodic per-tenant usage records (\"\" = none)"},
    {"usage.interval.ms", K_INT, F(usage_interval_ms), "60000", 100, 86400000,
     "period of the usage records"},
    {"usage.max_tenants", K_INT, F(usage_max_tenants), "100", 1, 100000,
     "distinct tenants counted by name; later ones count as `_other`"},
    {"usage.max_classes", K_INT, F(usage_max_classes), "16", 1, 10000,
     "distinct classes counted by name; later ones count as `_other`"},
    {"autoscale.avg_results", K_INT, F(autoscale_avg_results), "100", 1, 1000000,
     "results in the moving average of tokens per message (`lag_tokens`)"},
    {"autoscale.avg_seconds", K_INT, F(autoscale_avg_seconds), "30", 1, 86400,
     "busy seconds in the moving average of `token_throughput`"},
    /* ---- Models and engine (engine/; the same keys as `spillway generate`'s flags) ---- */
    {"model", K_STR, F(model), "", 0, 0,
     "GGUF model path, served under its file name without `.gguf` (see `models`)"},
    {"models", K_STR, F(models), "", 0, 0,
     "models served: `name=path`, comma-separated (a request picks one with `\"model\"`; see "
     "Models and versions; `kill -HUP` reloads)"},
    {"model.default", K_STR, F(model_default), "", 0, 0,
     "model of a request without `model` (\"\" = the first of `models`, else `model`'s)"},
    {"backend", K_CHOICE, F(backend), "cpu", 0, 0,
     "compute backend: `cpu`; `cuda` (a build with the CUDA backend and a device, else the "
     "start fails saying which is missing); `auto` = `cuda` when both are there, else `cpu` "
     "(see GPU deployment)"},
    {"cuda.device", K_INT, F(cuda_device), "0", 0, 1023,
     "CUDA backend: index of the device to use (as CUDA numbers them after "
     "`CUDA_VISIBLE_DEVICES`)"},
    {"cuda.dtype", K_CHOICE, F(cuda_dtype), "bf16", 0, 0,
     "CUDA backend: device weight type; `f32` with `kv.type` f32 computes like the CPU backend; "
     "`fp8` (compute capability 8.9+): the layer matrices in E4M3 with a scale per row, "
     "embedding and output in bf16 (see GPU deployment)"},
    {"cuda.mem_fraction", K_DOUBLE, F(cuda_mem_fraction), "0.9", 0, 0,
     "CUDA backend: share of the free device memory at start for every device allocation "
     "(weights, scratch, sampling, KV pool: `spillway plan --backend cuda`); with `kv.blocks` 0 "
     "the pool takes what is left"},
    {"threads", K_INT, F(threads), "0", 0, 1024, "compute threads (0 = one per CPU)"},
    {"cpu.pack", K_BOOL, F(cpu_pack), "true", 0, 1,
     "CPU backend: copy the Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0 and F16 matrices at start into the "
     "kernels' own layout where the CPU has AVX512-VNNI (1.2-3x faster at several sequences; the "
     "host memory of the copy is `spillway plan`'s `cpu packed copy`; not done when the host's "
     "available memory is short of it); false = every matrix read in place from the file mapping"},
    {"batch.max_seqs", K_INT, F(max_seqs), "64", 1, 1 << 16, "sequences per batch"},
    {"batch.max_tokens", K_INT, F(max_batch_tokens), "512", 1, 1 << 20, "tokens per forward step"},
    {"kv.blocks", K_INT, F(kv_blocks), "0", 0, 1 << 30,
     "KV pool size in blocks (0 = from `kv.mem_mb`)"},
    {"kv.mem_mb", K_INT, F(kv_mem_mb), "1024", 1, 1 << 24, "KV pool size in MiB"},
    {"kv.type", K_CHOICE, F(kv_type), "f16", 0, 0, "KV cache type f16 | f32"},
    {"kv.block_tokens", K_INT, F(block_tokens), "16", 1, 4096, "tokens per KV block"},
    {"ctx", K_INT, F(max_ctx), "0", 0, 1 << 30, "context limit per sequence (0 = the model's)"},
    {"prefix_cache", K_BOOL, F(prefix_cache), "true", 0, 1, "reuse cached prompt blocks"},
    {"sched.window", K_INT, F(sched_window), "32", 1, 65536,
     "waiting requests compared for admission (plus the oldest)"},
    {"sched.aging_ms", K_INT, F(sched_aging_ms), "5000", 0, 86400000,
     "a waiting request gains one priority level per this many ms (0 = no aging)"},
    {"sched.urgent_ms", K_INT, F(sched_urgent_ms), "2000", 0, 86400000,
     "one more priority level when the deadline is closer than this"},
    {"chat.template", K_STR, F(chat_template), "", 0, 0,
     "chat template name (\"\" = the model's tokenizer.chat_template)"},
    /* ---- Service classes and overload (worker/) ---- */
    {"classes", K_STR, F(classes), "interactive:priority=100:ttft_ms=1000:max_queue_ms=30000,batch:priority=0", 0, 0,
     "service classes: `name:priority=P:ttft_ms=T:max_queue_ms=Q`, comma-separated (see Service "
     "classes)"},
    {"class.default", K_STR, F(class_default), "batch", 0, 0, "class of a request without `class`"},
    {"claims", K_STR, F(claims), "", 0, 0,
     "tenants and classes each input topic may claim: `TOPIC tenants=T,... classes=C,... "
     "tenant=T class=C; ...` (see Tenants and usage; \"\" = unchecked)"},
    {"overload.deferral.topic", K_STR, F(deferral_topic), "", 0, 0,
     "overload step 1 moves lowest-class messages here, consumed again later (\"\" = no "
     "shedding; the worker subscribes to it)"},
    {"overload.shed_at", K_INT, F(overload_shed_at), "50", 1, 100000,
     "pressure (percent of the top class's ttft_ms) of step 1: shed the lowest class"},
    {"overload.cap_at", K_INT, F(overload_cap_at), "75", 1, 100000,
     "pressure of step 2: cap max_tokens of classes below the top one"},
    {"overload.refuse_at", K_INT, F(overload_refuse_at), "100", 1, 100000,
     "pressure of step 3: refuse them with an `overloaded` result"},
    {"overload.cap_tokens", K_INT, F(overload_cap_tokens), "64", 1, 1 << 20, "max_tokens cap of step 2"},
    {"overload.cooldown_ms", K_INT, F(overload_cooldown_ms), "2000", 0, 3600000,
     "pressure below a step's threshold this long before stepping down"},
    {"overload.window_ms", K_INT, F(overload_window_ms), "60000", 1, 86400000,
     "steps only while a top-class message arrived within this"},
    /* ---- Forwarding between the group's workers (worker/forward.c) ---- */
    {"forward.topic", K_STR, F(forward_topic), "", 0, 0,
     "topic through which a worker hands a request to another worker of the group (\"\" = no "
     "forwarding); every worker subscribes to it; needs `cache.redis.host` (the ownership "
     "registry); create it with as many partitions as the input topics"},
    {"forward.overload.pct", K_INT, F(forward_overload_pct), "75", 0, 100000,
     "in-flight messages (or tokens) at or above this percent of `max.inflight` (or "
     "`max.inflight.tokens`) is over the forwarding budget; a worker over it for "
     "`forward.overload.ms` forwards new requests to the least loaded worker under it (0 = "
     "no overload forwarding)"},
    {"forward.overload.ms", K_INT, F(forward_overload_ms), "1000", 0, 3600000,
     "how long a worker stays over the forwarding budget before it forwards"},
    {"forward.affinity.min_blocks", K_INT, F(forward_affinity_min_blocks), "4", 0, 1 << 20,
     "a request whose leading KV blocks another host's index holds at least this many more of "
     "than this host's is forwarded to a worker of that host (0 = no affinity forwarding; "
     "needs tier 2)"},
    {"forward.registry.ttl_ms", K_INT, F(forward_registry_ttl_ms), "3000", 300, 3600000,
     "a worker's entry in the ownership registry (its forwarding-topic partitions, host and "
     "load) is stale after this long; each worker republishes every third of it"},
    {"forward.log_per_s", K_INT, F(forward_log_per_s), "10", 0, 1000000,
     "log lines of single forwards per second, at most (the rest are counted in the next line)"},
    /* ---- Prefix cache (cache/: tier 2, the Redis index and the host arena) ---- */
    {"cache.redis.host", K_STR, F(cache_redis_host), "", 0, 0,
     "Redis of the prefix-cache index (\"\" = tier 2 off)"},
    {"cache.redis.port", K_INT, F(cache_redis_port), "6379", 1, 65535, "its port"},
    {"cache.redis.user", K_STR, F(cache_redis_user), "", 0, 0, "ACL user (\"\" = password only)"},
    {"cache.redis.password", K_STR, F(cache_redis_password), "", 0, 0,
     "AUTH password (\"\" = none); prefer `SPILLWAY_CACHE_REDIS_PASSWORD`"},
    {"cache.redis.db", K_INT, F(cache_redis_db), "0", 0, 1 << 16, "database number"},
    {"cache.redis.namespace", K_STR, F(cache_namespace), "spillway", 0, 0, "key prefix"},
    {"cache.redis.connect_timeout_ms", K_INT, F(cache_connect_timeout_ms), "200", 1, 600000,
     "connect timeout"},
    {"cache.redis.timeout_ms", K_INT, F(cache_cmd_timeout_ms), "50", 1, 600000,
     "timeout of each command"},
    {"cache.redis.backoff_min_ms", K_INT, F(cache_backoff_min_ms), "100", 1, 3600000,
     "first reconnect delay (doubles)"},
    {"cache.redis.backoff_max_ms", K_INT, F(cache_backoff_max_ms), "5000", 1, 3600000,
     "largest reconnect delay"},
    {"cache.redis.health_ms", K_INT, F(cache_health_ms), "1000", 0, 3600000,
     "an idle worker pings Redis this often (and reconnects), so `spillway:redis_up` follows "
     "Redis between lookups; 0 = never"},
    {"cache.arena.path", K_STR, F(cache_arena_path), "", 0, 0,
     "host arena file (shared by the host's workers); empty: "
     "`/dev/shm/spillway-UID/spillway.arena`, UID the effective user id, its folder created "
     "0700 and refused unless it is that user's with mode 0700"},
    {"cache.arena.mb", K_LONG, F(cache_arena_mb), "1024", 1, 1L << 30, "host arena size in MiB"},
    {"cache.host_id", K_STR, F(cache_host_id), "", 0, 0, "this host in the index (\"\" = hostname)"},
    {"cache.write_queue", K_INT, F(cache_write_queue), "64", 1, 1 << 20,
     "blocks waiting to be written to the arena, at most (more are not cached)"},
    {"cache.fleet.refresh_ms", K_INT, F(cache_fleet_refresh_ms), "2000", 1, 3600000,
     "with tier 2, this host's record in the fleet registry (`<namespace>:fleet:<model>:hosts`, "
     "which other hosts read to find who holds a prefix) is refreshed this often"},
    {"cache.fleet.ttl_ms", K_INT, F(cache_fleet_ttl_ms), "10000", 1, 86400000,
     "a host whose record is older than this is taken as gone"},
    {"cache.peer.listen", K_STR, F(cache_peer_listen), "", 0, 0,
     "`host:port` where this host serves its arena's blocks to the fleet's other hosts (\"\" = "
     "off; the host's first worker to bind serves, the others take over when it goes; reachable "
     "only inside the deployment, see KV across hosts)"},
    {"cache.peer.advertise", K_STR, F(cache_peer_advertise), "", 0, 0,
     "the address other hosts connect to (\"\" = `cache.peer.listen`, a wildcard host replaced "
     "by the hostname)"},
    {"cache.peer.fetch", K_BOOL, F(cache_peer_fetch), "true", 0, 1,
     "with tier 2, fetch a prompt's missing leading blocks from the host that holds more of them "
     "when the cost model says it beats recomputing"},
    {"cache.peer.timeout_ms", K_INT, F(cache_peer_timeout_ms), "2000", 1, 600000,
     "bound of a whole fetch (then the rest is recomputed), and of each step of a served session"},
    {"cache.peer.bandwidth_mbps", K_INT, F(cache_peer_bandwidth_mbps), "1000", 1, 1000000,
     "cost model: MB/s from a peer until fetches measure it"},
    {"cache.peer.rtt_us", K_INT, F(cache_peer_rtt_us), "1000", 0, 60000000,
     "cost model: fixed cost of one fetch (connect, handshake, first block) in µs until "
     "measured"},
    {"cache.peer.prefill_tps", K_INT, F(cache_peer_prefill_tps), "2000", 1, 100000000,
     "cost model: prefill tokens per second until finished requests measure it"},
    {"cache.secret_file", K_STR, F(cache_secret_file), "", 0, 0,
     "empty: `spillway.secret` in the arena's per-user folder `/dev/shm/spillway-UID` (created "
     "0700, refused unless it is that user's); 32 random bytes keying the KV block names, "
     "created 0600 when absent; read only with tier 2, and the host's workers share tier 2 "
     "only with the same file (see The prefix cache)"},
    {"cache.isolation", K_CHOICE, F(cache_isolation), "tenant", 0, 0,
     "`tenant`: a prefix cached for one tenant serves (and shows in `cached_tokens` of) that "
     "tenant only; `none`: shared by all tenants (see The prefix cache for the side channel)"},
    /* ---- Request limits (records/request.c) ---- */
    {"limits.max_message_bytes", K_LONG, F(max_message_bytes), "1048576", 1, LONG_MAX,
     "largest message value"},
    {"limits.max_prompt_bytes", K_LONG, F(max_prompt_bytes), "262144", 1, LONG_MAX,
     "largest prompt (text or rendered chat)"},
    {"limits.max_prompt_tokens", K_INT, F(max_prompt_tokens), "0", 0, 1 << 30,
     "largest prompt in tokens (0 = the context limit)"},
    {"limits.max_tokens", K_INT, F(max_tokens), "4096", 1, 1 << 24, "largest max_tokens accepted"},
    {"limits.default_max_tokens", K_INT, F(default_max_tokens), "256", 1, 1 << 24,
     "max_tokens when a request names none"},
    {"limits.max_input_ids", K_INT, F(max_input_ids), "32768", 1, 1 << 30,
     "most entries of input_ids"},
    {"limits.max_messages", K_INT, F(max_messages), "256", 1, 1 << 20, "most chat messages"},
    {"limits.max_stop", K_INT, F(max_stop), "16", 0, 1024, "most stop strings (0 = none accepted)"},
    {"limits.max_n", K_INT, F(max_n), "16", 1, 256, "most choices per request (\"n\")"},
    {"limits.max_stop_bytes", K_INT, F(max_stop_bytes), "256", 1, 65536,
     "longest stop string in bytes"},
    {"limits.max_metadata_bytes", K_LONG, F(max_metadata_bytes), "16384", 0, LONG_MAX,
     "largest metadata (compact JSON) echoed into results"},
    {"limits.max_id_bytes", K_INT, F(max_id_bytes), "256", 1, 65536, "longest id in bytes"},
    /* ---- Logs and metrics (worker/) ---- */
    {"log.level", K_LOGLEVEL, F(log_level), "info", 0, 0, "error | warn | info | debug"},
    {"log.format", K_CHOICE, F(log_format), "text", 0, 0, "text | json (one JSON object per line)"},
    {"metrics.port", K_INT, F(metrics_port), "0", 0, 65535,
     "Prometheus endpoint port (/metrics, /healthz, /readyz; 0 = off)"},
    {"metrics.bind", K_STR, F(metrics_bind), "127.0.0.1", 0, 0,
     "numeric address the endpoint listens on (`0.0.0.0` or `::` = every interface)"},
    {"metrics.health_port", K_INT, F(metrics_health_port), "0", 0, 65535,
     "a second port serving only /healthz and /readyz, with its own thread and connections "
     "(0 = none; they are served on metrics.port either way)"},
    {"metrics.max_connections", K_INT, F(metrics_max_conns), "128", 1, 4096,
     "connections the endpoint holds at once, per port (more wait in the listen backlog)"},
    {"metrics.max_connections_per_ip", K_INT, F(metrics_max_conns_per_ip), "8", 0, 4096,
     "connections one client address may hold at once, per port (0 = no per-address limit)"},
    {"metrics.connection_timeout_s", K_INT, F(metrics_timeout_s), "5", 1, 3600,
     "seconds a connection may send or read nothing before it is closed (slow headers)"},
    {"metrics.lag_refresh_ms", K_INT, F(metrics_lag_refresh_ms), "1000", 100, 3600000,
     "period of the consumer lag refresh (broker round trips off the scrape path; /metrics "
     "serves the last refreshed value)"},
    /* ---- Producer routing (producer/route.h; `spillway produce` and `spillway batch`) ---- */
    {"route.mode", K_CHOICE, F(route_mode), "affinity", 0, 0,
     "how producers pick a request's partition: `affinity` (consistent hashing with bounded "
     "load on the routing key), `bytes` (Kafka's partitioner on a hash of the key) or `random` "
     "(see Routing requests to partitions)"},
    {"route.prefix_bytes", K_LONG, F(route_prefix_bytes), "64", 0, 1 << 20,
     "bytes of the prompt's canonical form in the routing key of a request without "
     "`prefix_key` (0 = key by id)"},
    {"route.eps", K_DOUBLE, F(route_eps), "0.25", 0, 0,
     "`affinity`: no partition gets more than ceil((1 + eps) x mean) of the window's messages"},
    {"route.window", K_LONG, F(route_window), "1000", 1, 1 << 30,
     "`affinity`: the load of a partition is what this producer sent it among its last this "
     "many messages"},
    {"route.vnodes", K_LONG, F(route_vnodes), "128", 1, 4096,
     "`affinity`: points per partition on the hash ring"},
};
#undef F
#define NKEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

/* The module sections of KEYS, in table order: each starts at the key named first and runs to
 * the next one's. The README's configuration reference has one table per section. */
static const struct {
    const char *first, *title;
} SECTIONS[] = {
    {"brokers", "Kafka, delivery and flow control"},
    {"stream.topic", "Streaming, usage records and autoscaling signals"},
    {"model", "Models and engine"},
    {"classes", "Service classes and overload"},
    {"forward.topic", "Forwarding"},
    {"cache.redis.host", "Prefix cache"},
    {"limits.max_message_bytes", "Request limits"},
    {"log.level", "Logs and metrics"},
    {"route.mode", "Producer routing"},
};

/* The values a K_CHOICE key takes ('|'-separated), and those of the enumerated types. */
static const struct {
    const char *key, *choices;
} CHOICES[] = {
    {"kv.type", "f16|f32"},
    {"cache.isolation", "tenant|none"},
    {"log.format", "text|json"},
    {"cuda.dtype", "bf16|f16|f32|fp8"},
    {"backend", "cpu|cuda|auto"},
    {"route.mode", "affinity|bytes|random"},
};

/* The range of each K_DOUBLE key, bounds included. */
static const struct {
    const char *key;
    double lo, hi;
} REALS[] = {
    {"cuda.mem_fraction", 0.01, 1.0},
    {"route.eps", 0.0, 5.0},
};

static const char *const LOG_LEVELS[] = {"error", "warn", "info", "debug"};

int worker_config_n_keys(void) { return NKEYS; }
const char *worker_config_key_name(int i) { return i >= 0 && i < NKEYS ? KEYS[i].name : NULL; }
const char *worker_config_key_help(int i) { return i >= 0 && i < NKEYS ? KEYS[i].help : NULL; }

static int is_string(int type) { return type == K_STR || type == K_CHOICE; }

/* The '|'-separated values key i takes, or NULL. */
static const char *key_choices(int i)
{
    switch (KEYS[i].type) {
    case K_BOOL: return "true|false";
    case K_DELIVERY: return "at-least-once|exactly-once";
    case K_LOGLEVEL: return "error|warn|info|debug";
    case K_CHOICE:
        for (size_t j = 0; j < sizeof CHOICES / sizeof CHOICES[0]; j++)
            if (!strcmp(CHOICES[j].key, KEYS[i].name)) return CHOICES[j].choices;
        return NULL;
    default: return NULL;
    }
}

/* The range of K_DOUBLE key i (empty when REALS lacks it). */
static void real_range(int i, double *lo, double *hi)
{
    *lo = 1, *hi = 0;
    for (size_t j = 0; j < sizeof REALS / sizeof REALS[0]; j++)
        if (!strcmp(REALS[j].key, KEYS[i].name)) *lo = REALS[j].lo, *hi = REALS[j].hi;
}

/* v in the shortest "%.*g" form that strtod reads back as v (0.8, not 0.80000000000000004). */
static const char *shortest_double(double v, char *buf, size_t cap)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

int worker_config_find_key(const char *name)
{
    for (int i = 0; i < NKEYS; i++)
        if (!strcmp(KEYS[i].name, name)) return i;
    return -1;
}

int worker_config_key(int i, worker_config_key_t *out)
{
    if (i < 0 || i >= NKEYS) return -1;
    const key_t_ *k = &KEYS[i];
    const char *section = NULL;
    for (size_t s = 0; s < sizeof SECTIONS / sizeof SECTIONS[0]; s++) {
        int first = worker_config_find_key(SECTIONS[s].first);
        if (first >= 0 && first <= i) section = SECTIONS[s].title;
    }
    *out = (worker_config_key_t){.name = k->name, .section = section, .def = k->def,
                                 .help = k->help, .choices = key_choices(i),
                                 .integer = k->type == K_INT || k->type == K_LONG,
                                 .lo = k->lo, .hi = k->hi, .real = k->type == K_DOUBLE};
    if (k->type == K_DOUBLE) real_range(i, &out->real_lo, &out->real_hi);
    return 0;
}

/* 1 when value is one of the '|'-separated choices. */
static int is_choice(const char *choices, const char *value)
{
    size_t n = strlen(value);
    for (const char *p = choices; p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !memcmp(p, value, n)) return 1;
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

/* "a, b or c" from "a|b|c" into buf. */
static const char *choices_text(const char *choices, char *buf, size_t cap)
{
    size_t j = 0;
    for (const char *p = choices; *p && j + 4 < cap; p++) {
        if (*p != '|') {
            buf[j++] = *p;
            continue;
        }
        const char *rest = strchr(p + 1, '|') ? ", " : " or ";
        j += (size_t)snprintf(buf + j, cap - j, "%s", rest);
    }
    buf[j < cap ? j : cap - 1] = 0;
    return buf;
}

int worker_config_parse_value(int i, const char *value, long *num, char *errstr, size_t errlen)
{
    if (i < 0 || i >= NKEYS) {
        snprintf(errstr, errlen, "no key %d", i);
        return -1;
    }
    const key_t_ *k = &KEYS[i];
    long v = 0;
    switch (k->type) {
    case K_STR: break;
    case K_INT:
    case K_LONG: {
        char *end;
        errno = 0;
        v = strtol(value, &end, 10);
        if (errno || end == value || *end || v < k->lo || v > k->hi) {
            snprintf(errstr, errlen, "%s: '%s' is not an integer in [%ld, %ld]", k->name, value,
                     k->lo, k->hi);
            return -1;
        }
        break;
    }
    case K_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes")) v = 1;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no")) v = 0;
        else {
            snprintf(errstr, errlen, "%s must be true or false (not '%s')", k->name, value);
            return -1;
        }
        break;
    case K_DOUBLE: {
        char *end, a[32], b[32];
        double lo, hi;
        real_range(i, &lo, &hi);
        errno = 0;
        double d = strtod(value, &end);
        if (errno || end == value || *end || !(d >= lo && d <= hi)) {
            snprintf(errstr, errlen, "%s: '%s' is not a number in [%s, %s]", k->name, value,
                     shortest_double(lo, a, sizeof a), shortest_double(hi, b, sizeof b));
            return -1;
        }
        break;
    }
    case K_DELIVERY:
    case K_LOGLEVEL:
    case K_CHOICE: {
        const char *ch = key_choices(i);
        if (!ch || !is_choice(ch, value)) {
            char buf[128];
            snprintf(errstr, errlen, "%s must be %s (not '%s')", k->name,
                     ch ? choices_text(ch, buf, sizeof buf) : "valid", value);
            return -1;
        }
        if (k->type == K_DELIVERY) v = !strcmp(value, "exactly-once") ? WORKER_EOS : WORKER_ALO;
        else if (k->type == K_LOGLEVEL)
            for (int l = 0; l < 4; l++)
                if (!strcmp(value, LOG_LEVELS[l])) v = l;
        break;
    }
    }
    if (num) *num = v;
    return 0;
}

static int set_source(worker_config_t *c, int i, const char *source)
{
    char *s = strdup(source);
    if (!s) return -1;
    free(c->source[i]);
    c->source[i] = s;
    return 0;
}

static int set_value(worker_config_t *c, int i, const char *value, char *errstr, size_t errlen)
{
    const key_t_ *k = &KEYS[i];
    void *p = (char *)c + k->off;
    long v;
    if (worker_config_parse_value(i, value, &v, errstr, errlen)) return -1;
    if (is_string(k->type)) {
        char *s = strdup(value);
        if (!s) {
            snprintf(errstr, errlen, "out of memory");
            return -1;
        }
        free(*(char **)p);
        *(char **)p = s;
    } else if (k->type == K_DOUBLE) {
        *(double *)p = strtod(value, NULL);
    } else if (k->type == K_LONG) {
        *(long *)p = v;
    } else {
        *(int *)p = (int)v;
    }
    return 0;
}

int worker_config_default(worker_config_t *c)
{
    char err[64];
    memset(c, 0, sizeof *c);
    c->source = calloc(NKEYS, sizeof *c->source);
    if (!c->source) return -1;
    for (int i = 0; i < NKEYS; i++)
        if (set_value(c, i, KEYS[i].def, err, sizeof err) || set_source(c, i, "default")) {
            worker_config_free(c);
            return -1;
        }
    return 0;
}

void worker_config_free(worker_config_t *c)
{
    if (!c) return;
    for (int i = 0; i < NKEYS; i++)
        if (is_string(KEYS[i].type)) free(*(char **)((char *)c + KEYS[i].off));
    if (c->source)
        for (int i = 0; i < NKEYS; i++) free(c->source[i]);
    free(c->source);
    for (int i = 0; i < c->n_kafka; i++) {
        free(c->kafka[i].key);
        free(c->kafka[i].value);
        free(c->kafka[i].source);
    }
    free(c->kafka);
    memset(c, 0, sizeof *c);
}

/* 1 when a key's value is a secret that `spillway config` must not print: a worker key or a
 * librdkafka property whose name (case-insensitively) contains one of these words, e.g.
 * cache.redis.password, sasl.password, ssl.key.password, ssl.keystore.password,
 * sasl.oauthbearer.client.secret, ssl.key.pem (an inline private key), sasl.oauthbearer.config
 * (may carry a client secret). */
static int is_secret_key(const char *key)
{
    static const char *const WORDS[] = {"password", "secret", "passphrase", "key.pem",
                                        "private.key", "sasl.oauthbearer.config", "credential",
                                        "jaas"};
    char low[256];
    size_t n = 0;
    for (; key[n] && n + 1 < sizeof low; n++) low[n] = (char)tolower((unsigned char)key[n]);
    low[n] = 0;
    for (size_t i = 0; i < sizeof WORDS / sizeof WORDS[0]; i++)
        if (strstr(low, WORDS[i])) return 1;
    return 0;
}

static int add_kafka(worker_config_t *c, const char *key, size_t klen, const char *value,
                     const char *source)
{
    worker_kafka_prop_t *k = realloc(c->kafka, sizeof *k * (size_t)(c->n_kafka + 1));
    if (!k) return -1;
    c->kafka = k;
    worker_kafka_prop_t *p = &k[c->n_kafka];
    p->key = strndup(key, klen);
    p->value = strdup(value);
    p->source = strdup(source);
    if (!p->key || !p->value || !p->source) {
        free(p->key);
        free(p->value);
        free(p->source);
        return -1;
    }
    c->n_kafka++;
    return 0;
}

int worker_config_copy(worker_config_t *dst, const worker_config_t *src)
{
    *dst = *src;
    dst->source = calloc(NKEYS, sizeof *dst->source);
    dst->kafka = NULL;
    dst->n_kafka = 0;
    for (int i = 0; i < NKEYS; i++)
        if (is_string(KEYS[i].type)) *(char **)((char *)dst + KEYS[i].off) = NULL;
    if (!dst->source) goto fail;
    for (int i = 0; i < NKEYS; i++) {
        if (!(dst->source[i] = strdup(src->source[i]))) goto fail;
        if (is_string(KEYS[i].type)) {
            char **d = (char **)((char *)dst + KEYS[i].off);
            if (!(*d = strdup(*(char *const *)((const char *)src + KEYS[i].off)))) goto fail;
        }
    }
    for (int i = 0; i < src->n_kafka; i++)
        if (add_kafka(dst, src->kafka[i].key, strlen(src->kafka[i].key), src->kafka[i].value,
                      src->kafka[i].source))
            goto fail;
    return 0;
fail:
    worker_config_free(dst);
    return -1;
}

int worker_config_set(worker_config_t *c, const char *key, const char *value, const char *source,
                      char *errstr, size_t errlen)
{
    int i = worker_config_find_key(key);
    if (i < 0) {
        snprintf(errstr, errlen, "unknown key '%s' (librdkafka properties go in -X or kafka.*)", key);
        return -1;
    }
    if (set_value(c, i, value, errstr, errlen)) return -1;
    if (set_source(c, i, source)) {
        snprintf(errstr, errlen, "out of memory");
        return -1;
    }
    return 0;
}

int worker_config_add_kafka(worker_config_t *c, const char *kv, const char *source, char *errstr,
                            size_t errlen)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) {
        if (is_secret_key(kv)) /* e.g. "sasl.password:hunter2": do not echo it */
            snprintf(errstr, errlen, "-X (a secret property): expected property=value");
        else
            snprintf(errstr, errlen, "-X %s: expected property=value", kv);
        return -1;
    }
    if (add_kafka(c, kv, (size_t)(eq - kv), eq + 1, source)) {
        snprintf(errstr, errlen, "out of memory");
        return -1;
    }
    return 0;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

int worker_config_load_file(worker_config_t *c, const char *path, char *errstr, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(errstr, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char line[4096], src[512], sub[384];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        snprintf(src, sizeof src, "file:%s:%d", path, lineno);
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            snprintf(errstr, errlen, "%s:%d: line too long", path, lineno);
            rc = -1;
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(errstr, errlen, "%s:%d: expected key=value", path, lineno);
            rc = -1;
            break;
        }
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        if (!strncmp(key, "kafka.", 6) && key[6]) {
            if (add_kafka(c, key + 6, strlen(key + 6), val, src)) {
                snprintf(errstr, errlen, "out of memory");
                rc = -1;
                break;
            }
        } else if (worker_config_set(c, key, val, src, sub, sizeof sub)) {
            snprintf(errstr, errlen, "%s:%d: %s", path, lineno, sub);
            rc = -1;
            break;
        }
    }
    if (!rc && ferror(f)) {
        snprintf(errstr, errlen, "%s: read error", path);
        rc = -1;
    }
    fclose(f);
    return rc;
}

int worker_config_load_env(worker_config_t *c, char *errstr, size_t errlen)
{
    char name[128], src[160];
    for (int i = 0; i < NKEYS; i++) {
        size_t j = 0;
        j += (size_t)snprintf(name, sizeof name, "SPILLWAY_");
        for (const char *p = KEYS[i].name; *p && j + 1 < sizeof name; p++)
            name[j++] = *p == '.' ? '_' : (char)toupper((unsigned char)*p);
        name[j] = 0;
        const char *v = getenv(name);
        if (!v) continue;
        snprintf(src, sizeof src, "env:%s", name);
        if (worker_config_set(c, KEYS[i].name, v, src, errstr, errlen)) return -1;
    }
    return 0;
}

int worker_config_check(const worker_config_t *c, char *errstr, size_t errlen)
{
    if (!*c->brokers) {
        snprintf(errstr, errlen, "brokers is empty");
        return -1;
    }
    if (!*c->input_topics || !*c->output_topic || !*c->dlq_topic) {
        snprintf(errstr, errlen, "input.topics, output.topic and dlq.topic must be set");
        return -1;
    }
    if (!*c->group_id) {
        snprintf(errstr, errlen, "group.id is empty");
        return -1;
    }
    worker_model_spec_t *ms;
    int n_ms, def_ms;
    if (worker_models_parse(c, &ms, &n_ms, &def_ms, errstr, errlen)) return -1;
    free(ms);
    for (const char *p = c->reply_topics; *p; p++) {
        if (*p == ',' || *p == ' ' || *p == '\t' || (*p >= 'a' && *p <= 'z') ||
            (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' ||
            *p == '-')
            continue;
        snprintf(errstr, errlen, "reply.topics: '%c' cannot be in a topic name (a comma-separated "
                 "list of topics of a-z A-Z 0-9 . _ -)", *p);
        return -1;
    }
    if (c->stream_every_tokens == 0 && c->stream_every_ms == 0) {
        snprintf(errstr, errlen, "stream.every_tokens and stream.every_ms are both 0");
        return -1;
    }
    if (c->default_max_tokens > c->max_tokens) {
        snprintf(errstr, errlen, "limits.default_max_tokens (%d) exceeds limits.max_tokens (%d)",
                 c->default_max_tokens, c->max_tokens);
        return -1;
    }
    if (c->max_metadata_bytes > c->max_message_bytes) {
        snprintf(errstr, errlen, "limits.max_metadata_bytes exceeds limits.max_message_bytes");
        return -1;
    }
    if (c->max_prompt_bytes > c->max_message_bytes) {
        snprintf(errstr, errlen, "limits.max_prompt_bytes exceeds limits.max_message_bytes");
        return -1;
    }
    /* every accepted value must fit back into a dead letter (worker_new sets the producer's
     * message.max.bytes to need; a value given with -X must not undercut it) */
    if (c->max_message_bytes > 1000000000L - WORKER_DLQ_OVERHEAD_BYTES) {
        snprintf(errstr, errlen, "limits.max_message_bytes %ld exceeds %ld (the producer's largest "
                 "message.max.bytes less %d bytes for a dead letter's key and headers)",
                 c->max_message_bytes, 1000000000L - WORKER_DLQ_OVERHEAD_BYTES,
                 WORKER_DLQ_OVERHEAD_BYTES);
        return -1;
    }
    long need = c->max_message_bytes + WORKER_DLQ_OVERHEAD_BYTES;
    for (int i = 0; i < c->n_kafka; i++) {
        const char *k = c->kafka[i].key;
        if (strcmp(k, "message.max.bytes") && strcmp(k, "producer.message.max.bytes")) continue;
        long v = strtol(c->kafka[i].value, NULL, 10);
        if (v < need) {
            snprintf(errstr, errlen, "%s=%s is below limits.max_message_bytes (%ld) + %d bytes "
                     "for a dead letter's key and headers: every accepted message must fit into "
                     "its dead letter; raise %s to at least %ld or lower limits.max_message_bytes",
                     k, c->kafka[i].value, c->max_message_bytes, WORKER_DLQ_OVERHEAD_BYTES, k,
                     need);
            return -1;
        }
    }
    worker_class_t *cl;
    int n;
    if (worker_classes_parse(c->classes, &cl, &n, errstr, errlen)) return -1;
    int found = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(cl[i].name, c->class_default)) found = i;
    if (found < 0) {
        free(cl);
        snprintf(errstr, errlen, "class.default %s is not one of the classes", c->class_default);
        return -1;
    }
    claims_t *claims;
    int crc = claims_parse(c->claims, cl, n, found, &claims, errstr, errlen);
    free(cl);
    claims_free(claims);
    if (crc) return -1;
    if (!(c->overload_shed_at <= c->overload_cap_at && c->overload_cap_at <= c->overload_refuse_at)) {
        snprintf(errstr, errlen, "overload.shed_at <= overload.cap_at <= overload.refuse_at must hold");
        return -1;
    }
    if (*c->deferral_topic && (!strcmp(c->deferral_topic, c->output_topic) ||
                               !strcmp(c->deferral_topic, c->dlq_topic))) {
        snprintf(errstr, errlen, "overload.deferral.topic must differ from output.topic and dlq.topic");
        return -1;
    }
    if (*c->forward_topic) {
        if (!strcmp(c->forward_topic, c->output_topic) || !strcmp(c->forward_topic, c->dlq_topic) ||
            !strcmp(c->forward_topic, c->deferral_topic)) {
            snprintf(errstr, errlen, "forward.topic must differ from output.topic, dlq.topic and "
                     "overload.deferral.topic");
            return -1;
        }
        if (!*c->cache_redis_host) {
            snprintf(errstr, errlen, "forward.topic needs cache.redis.host: workers find which "
                     "of them owns a partition of it in the Redis registry");
            return -1;
        }
    }
    return 0;
}

static int class_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '.' && s[i] != '-') return 0;
    return 1;
}

int worker_classes_parse(const char *spec, worker_class_t **out, int *n, char *errstr,
                         size_t errlen)
{
    worker_class_t *cl = calloc(32, sizeof *cl);
    int k = 0;
    if (!cl) {
        snprintf(errstr, errlen, "out of memory");
        return -1;
    }
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (k == 32) {
            snprintf(errstr, errlen, "classes: more than 32 classes");
            goto fail;
        }
        worker_class_t *c = &cl[k];
        const char *q = p, *stop = p + len;
        const char *colon = memchr(q, ':', len);
        size_t nl = colon ? (size_t)(colon - q) : len;
        if (!class_name_ok(q, nl)) {
            snprintf(errstr, errlen, "classes: bad class name \"%.*s\" (1..64 bytes of A-Z a-z 0-9 _ . -)",
                     (int)(nl > 64 ? 64 : nl), q);
            goto fail;
        }
        memcpy(c->name, q, nl);
        c->name[nl] = 0;
        for (int i = 0; i < k; i++)
            if (!strcmp(cl[i].name, c->name)) {
                snprintf(errstr, errlen, "classes: class %s given twice", c->name);
                goto fail;
            }
        q += nl;
        while (q < stop) { /* ":key=value" */
            q++;
            const char *ce = memchr(q, ':', (size_t)(stop - q));
            if (!ce) ce = stop;
            const char *eq = memchr(q, '=', (size_t)(ce - q));
            char val[32];
            size_t vl = eq ? (size_t)(ce - eq - 1) : 0;
            if (!eq || vl == 0 || vl >= sizeof val) {
                snprintf(errstr, errlen, "classes: class %s: expected key=value, got \"%.*s\"",
                         c->name, (int)(ce - q), q);
                goto fail;
            }
            memcpy(val, eq + 1, vl);
            val[vl] = 0;
            char *e;
            errno = 0;
            long v = strtol(val, &e, 10);
            size_t kl = (size_t)(eq - q);
            int *dst = kl == 8 && !memcmp(q, "priority", 8)       ? &c->priority
                       : kl == 7 && !memcmp(q, "ttft_ms", 7)       ? &c->ttft_ms
                       : kl == 12 && !memcmp(q, "max_queue_ms", 12) ? &c->max_queue_ms
                                                                    : NULL;
            if (!dst) {
                snprintf(errstr, errlen, "classes: class %s: unknown setting \"%.*s\" "
                         "(priority, ttft_ms, max_queue_ms)", c->name, (int)kl, q);
                goto fail;
            }
            long lo = dst == &c->priority ? -1000 : 0, hi = dst == &c->priority ? 1000 : 86400000;
            if (*e || errno || v < lo || v > hi) {
                snprintf(errstr, errlen, "classes: class %s: %.*s=%s: expected an integer in %ld..%ld",
                         c->name, (int)kl, q, val, lo, hi);
                goto fail;
            }
            *dst = (int)v;
            q = ce;
        }
        k++;
        p = end ? end + 1 : p + len;
    }
    if (k == 0) {
        snprintf(errstr, errlen, "classes: no class given");
        goto fail;
    }
    *out = cl;
    *n = k;
    return 0;
fail:
    free(cl);
    return -1;
}

/* The served name of a bare model path: its file name without directories and ".gguf". */
static void model_stem(const char *path, char *name, size_t cap)
{
    const char *base = strrchr(path, '/');
    snprintf(name, cap, "%s", base ? base + 1 : path);
    char *dot = strrchr(name, '.');
    if (dot && !strcmp(dot, ".gguf")) *dot = 0;
}

int worker_models_parse(const worker_config_t *c, worker_model_spec_t **out, int *n, int *def,
                        char *errstr, size_t errlen)
{
    worker_model_spec_t *ms = calloc(WORKER_MAX_MODELS, sizeof *ms);
    int k = 0;
    if (!ms) {
        snprintf(errstr, errlen, "out of memory");
        return -1;
    }
    for (const char *p = c->models; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *a = p, *b = p + len;
        p = end ? end + 1 : b;
        while (a < b && isspace((unsigned char)*a)) a++;
        while (b > a && isspace((unsigned char)b[-1])) b--;
        if (a == b) continue;
        const char *eq = memchr(a, '=', (size_t)(b - a));
        size_t nl = eq ? (size_t)(eq - a) : 0, pl = eq ? (size_t)(b - eq - 1) : 0;
        while (nl > 0 && isspace((unsigned char)a[nl - 1])) nl--;
        const char *path = eq ? eq + 1 : NULL;
        while (pl > 0 && isspace((unsigned char)*path)) path++, pl--;
        if (!eq || !class_name_ok(a, nl) || pl == 0 || pl >= sizeof ms->path) {
            snprintf(errstr, errlen, "models: expected name=path (name 1..64 bytes of A-Z a-z 0-9 "
                     "_ . -, a path under %zu bytes), got \"%.*s\"", sizeof ms->path,
                     (int)(b - a > 200 ? 200 : b - a), a);
            goto fail;
        }
        if (k == WORKER_MAX_MODELS) {
            snprintf(errstr, errlen, "models: more than %d models", WORKER_MAX_MODELS);
            goto fail;
        }
        memcpy(ms[k].name, a, nl);
        ms[k].name[nl] = 0;
        memcpy(ms[k].path, path, pl);
        ms[k].path[pl] = 0;
        for (int i = 0; i < k; i++)
            if (!strcmp(ms[i].name, ms[k].name)) {
                snprintf(errstr, errlen, "models: model %s given twice", ms[k].name);
                goto fail;
            }
        k++;
    }
    if (*c->model) {
        char name[sizeof ms->name];
        model_stem(c->model, name, sizeof name);
        int dup = -1;
        for (int i = 0; i < k; i++)
            if (!strcmp(ms[i].name, name)) dup = i;
        if (dup >= 0 && strcmp(ms[dup].path, c->model)) {
            snprintf(errstr, errlen, "model %s is served as %s, a name models gives to %s",
                     c->model, name, ms[dup].path);
            goto fail;
        }
        if (dup < 0) {
            if (k == WORKER_MAX_MODELS || strlen(c->model) >= sizeof ms->path) {
                snprintf(errstr, errlen, "model: too many models or too long a path");
                goto fail;
            }
            snprintf(ms[k].name, sizeof ms[k].name, "%s", name);
            snprintf(ms[k].path, sizeof ms[k].path, "%s", c->model);
            k++;
        }
    }
    if (k == 0) {
        snprintf(errstr, errlen, "model is not set (-m FILE, model=FILE or models=name=FILE,...)");
        goto fail;
    }
    *def = 0;
    if (*c->model_default) {
        *def = -1;
        for (int i = 0; i < k; i++)
            if (!strcmp(ms[i].name, c->model_default)) *def = i;
        if (*def < 0) {
            snprintf(errstr, errlen, "model.default %s is not one of the models served", c->model_default);
            goto fail;
        }
    }
    *out = ms;
    *n = k;
    return 0;
fail:
    free(ms);
    return -1;
}

void worker_config_print(const worker_config_t *c, FILE *out)
{
    for (int i = 0; i < NKEYS; i++) {
        const key_t_ *k = &KEYS[i];
        const void *p = (const char *)c + k->off;
        char val[64];
        const char *v = val;
        switch (k->type) {
        case K_STR:
        case K_CHOICE: v = *(char *const *)p; break;
        case K_INT:
        case K_BOOL: snprintf(val, sizeof val, "%d", *(const int *)p); break;
        case K_LONG: snprintf(val, sizeof val, "%ld", *(const long *)p); break;
        case K_DOUBLE: shortest_double(*(const double *)p, val, sizeof val); break;
        case K_DELIVERY: v = *(const int *)p == WORKER_EOS ? "exactly-once" : "at-least-once"; break;
        case K_LOGLEVEL: v = LOG_LEVELS[*(const int *)p & 3]; break;
        }
        if (k->type == K_BOOL) v = *(const int *)p ? "true" : "false";
        if (is_secret_key(k->name) && *v) v = "(set)";
        fprintf(out, "%-28s = %-24s # %s\n", k->name, v, c->source[i]);
    }
    for (int i = 0; i < c->n_kafka; i++) {
        const char *v = c->kafka[i].value;
        if (is_secret_key(c->kafka[i].key) && *v) v = "(set)";
        fprintf(out, "kafka.%-22s = %-24s # %s\n", c->kafka[i].key, v, c->kafka[i].source);
    }
}
