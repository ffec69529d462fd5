/* worker/exposition.c: the Prometheus rendering of /metrics and the health and readiness answers
 * (worker/metrics.h's callbacks). Runs on the metrics server's thread: reads atomics and, under
 * their locks, the lag cache and the model list. */
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

static void fam(metrics_buf_t *b, const char *name, const char *type, const char *help)
{
    metrics_family(b, name, type, help);
}

void wexpo_render(void *arg, metrics_buf_t *b)
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
    if (w->tier2) {
        fam(b, "spillway:peer_kv_fetches_total", "counter",
            "prefix fetches from another host that got every block asked for");
        metrics_sample(b, "spillway:peer_kv_fetches_total", NULL, (double)st.peer_fetches);
        fam(b, "spillway:peer_kv_blocks_total", "counter",
            "KV blocks fetched from other hosts, verified and stored (received) or sent (served)");
        metrics_sample(b, "spillway:peer_kv_blocks_total", "dir=\"received\"",
                       (double)st.peer_blocks);
        metrics_sample(b, "spillway:peer_kv_blocks_total", "dir=\"served\"",
                       (double)st.peer_served);
        fam(b, "spillway:peer_kv_bytes_total", "counter", "bytes received from other hosts");
        metrics_sample(b, "spillway:peer_kv_bytes_total", NULL, (double)st.peer_bytes);
        fam(b, "spillway:peer_kv_recomputed_total", "counter",
            "prefixes another host held that the cost model chose to recompute");
        metrics_sample(b, "spillway:peer_kv_recomputed_total", NULL, (double)st.peer_recompute);
        fam(b, "spillway:peer_kv_fallbacks_total", "counter",
            "fetches that fell short (the rest recomputed), by reason");
        for (int i = 0; i < 6; i++) {
            metrics_labels(lb, sizeof lb, "reason", cache_peer_error_name(i + 1),
                           (const char *)NULL);
            metrics_sample(b, "spillway:peer_kv_fallbacks_total", lb, (double)st.peer_fail[i]);
        }
        fam(b, "spillway:peer_kv_refused_total", "counter",
            "connections this host's peer server refused (authentication, geometry, frames)");
        metrics_sample(b, "spillway:peer_kv_refused_total", NULL, (double)st.peer_refused);
        fam(b, "spillway:peer_prefill_tokens_per_second", "gauge",
            "the KV-fetch cost model's measured prefill rate");
        metrics_sample(b, "spillway:peer_prefill_tokens_per_second", NULL, st.peer_prefill_tps);
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
        "exactly-once: producer instances replaced after a transaction's outcome was unknown "
        "or a fence");
    metrics_sample(b, "spillway:producer_restarts_total", NULL, (double)st.producer_restarts);
    fam(b, "spillway:producer_fences_total", "counter",
        "exactly-once: fences of the producer recovered from by replacing it (the coordinator "
        "aborted a transaction that outlived transaction.timeout.ms)");
    metrics_sample(b, "spillway:producer_fences_total", NULL, (double)st.producer_fences);
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
    wfwd_render(w, b);
}

/* Alive: no fatal error, and the poll loop turned within the last minute (a transaction commit
 * or a drain may hold it for tens of seconds; a stuck loop is not alive). */
int wexpo_healthy(void *arg, char *why, size_t len)
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

int wexpo_ready(void *arg, char *why, size_t len)
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
