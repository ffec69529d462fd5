/* tests/test_worker_mock.c: the worker end to end on librdkafka's in-process mock cluster with
 * the stories260K model: N prompts in -> N results out (set equality), bad input -> DLQ with its
 * reason and original bytes, a past deadline -> finish_reason "expired", backpressure (pauses)
 * without loss, committed offsets at the log end after a clean stop; and fault injection:
 * while the results' partition leader is down nothing is committed, and once it is back every
 * result arrives and the offsets reach the end; offset commits failing for a while are resent.
 * Exactly-once mode: results read with
 * read_committed, offsets committed by the transaction. */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "tests/support/mock_kafka.h"
#include "worker/worker.h"

#define MODEL SPILLWAY_MODELS "/stories260K.gguf"

static worker_t *make_worker_x(const char *brokers, const char *group, const char *in,
                               const char *out, const char *dlq, int eos, int max_inflight,
                               const char *extra_prop)
{
    worker_config_t c;
    char err[512], num[32];
    worker_config_default(&c);
    worker_config_set(&c, "brokers", brokers, "test", err, sizeof err);
    worker_config_set(&c, "group.id", group, "test", err, sizeof err);
    worker_config_set(&c, "input.topics", in, "test", err, sizeof err);
    worker_config_set(&c, "output.topic", out, "test", err, sizeof err);
    worker_config_set(&c, "dlq.topic", dlq, "test", err, sizeof err);
    worker_config_set(&c, "model", MODEL, "test", err, sizeof err);
    worker_config_set(&c, "threads", "1", "test", err, sizeof err);
    worker_config_set(&c, "kv.mem_mb", "16", "test", err, sizeof err);
    worker_config_set(&c, "commit.interval.ms", "100", "test", err, sizeof err);
    worker_config_set(&c, "drain.timeout.ms", "10000", "test", err, sizeof err);
    worker_config_set(&c, "worker.id", "test-worker", "test", err, sizeof err);
    worker_config_set(&c, "log.level", getenv("WLOG") ? getenv("WLOG") : "warn", "test", err, sizeof err);
    snprintf(num, sizeof num, "%d", max_inflight);
    worker_config_set(&c, "max.inflight", num, "test", err, sizeof err);
    if (eos) worker_config_set(&c, "delivery", "exactly-once", "test", err, sizeof err);
    worker_config_add_kafka(&c, "log_level=3", "test", err, sizeof err);
    worker_config_add_kafka(&c, "consumer.session.timeout.ms=6000", "test", err, sizeof err);
    if (extra_prop) worker_config_add_kafka(&c, extra_prop, "test", err, sizeof err);
    worker_t *w = worker_new(&c, err, sizeof err);
    CHECKF(w != NULL, "%s", err);
    worker_config_free(&c);
    return w;
}

static worker_t *make_worker(const char *brokers, const char *group, const char *in,
                             const char *out, const char *dlq, int eos, int max_inflight)
{
    return make_worker_x(brokers, group, in, out, dlq, eos, max_inflight, NULL);
}

/* Good prompts, bad input, an expired request, backpressure; committed at the end. */
static void test_end_to_end(rd_kafka_mock_cluster_t *mc, const char *brokers, int eos)
{
    const char *in = eos ? "in-eos" : "in", *out = eos ? "out-eos" : "out",
               *dlq = eos ? "dlq-eos" : "dlq", *group = eos ? "g-eos" : "g";
    rd_kafka_mock_topic_create(mc, in, 4, 1);
    rd_kafka_mock_topic_create(mc, out, 2, 1);
    rd_kafka_mock_topic_create(mc, dlq, 1, 1);
    enum { NGOOD = 24, NBAD = 6, N = NGOOD + NBAD + 1 };
    char *vals[N];
    size_t lens[N];
    static const char *prefixes[] = {"Once upon a time, there was a little girl named Lily. She",
                                     "Tom and his dog", "The sun was"};
    /* r0's metadata comes back as its own text, less the insignificant white space: numbers
     * as written (no re-rounding), nested values, escapes untouched */
    static const char META0_IN[] = "{\"n\":0, \"x\": 12345678901234567890e-10,\"t\":0.8,"
                                   "\"deep\":{\"a\":[1, 2.50,{\"u\":\"\\u00e9 \\ud83d\\ude00\"}]}}";
    static const char META0_OUT[] = "\"metadata\":{\"n\":0,\"x\":12345678901234567890e-10,"
                                    "\"t\":0.8,\"deep\":{\"a\":[1,2.50,{\"u\":\"\\u00e9 \\ud83d\\ude00\"}]}}";
    for (int i = 0; i < NGOOD; i++) {
        char buf[512], meta[160];
        if (i == 0)
            snprintf(meta, sizeof meta, "%s", META0_IN);
        else
            snprintf(meta, sizeof meta, "{\"n\":%d}", i);
        snprintf(buf, sizeof buf,
                 "{\"id\":\"r%d\",\"prompt\":\"%s %d\",\"max_tokens\":%d,\"temperature\":0,"
                 "\"metadata\":%s}",
                 i, prefixes[i % 3], i, 4 + i % 5, meta);
        vals[i] = strdup(buf);
    }
    const char *bad[NBAD] = {
        "this is not json",
        "{\"id\":\"nop\"}",
        "{\"id\":\"u8\",\"prompt\":\"bad \xff\xfe bytes\"}",
        "{\"id\":\"mt\",\"prompt\":\"x\",\"max_tokens\":-3}",
        "{\"id\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template\":\"nosuch\"}",
        NULL, /* below */
    };
    for (int i = 0; i < NBAD - 1; i++) vals[NGOOD + i] = strdup(bad[i]);
    /* 600 input ids: within limits.max_input_ids, over the model's 512-token context, which only
     * the engine checks (engine_submit's -SW_ERANGE) */
    char *ctx = malloc(64 + 600 * 4);
    if (!ctx) abort();
    int m = sprintf(ctx, "{\"id\":\"ctx\",\"input_ids\":[");
    for (int k = 0; k < 600; k++) m += sprintf(ctx + m, k ? ",%d" : "%d", 100);
    sprintf(ctx + m, "]}");
    vals[NGOOD + NBAD - 1] = ctx;
    vals[N - 1] = strdup("{\"id\":\"late\",\"prompt\":\"Once upon\",\"deadline\":1000}");
    for (int i = 0; i < N; i++) lens[i] = strlen(vals[i]);
    CHECK(tk_produce_values(brokers, in, (const char *const *)vals, lens, N, 4, 1) == 0);

    worker_t *w = make_worker(brokers, group, in, out, dlq, eos, 5);
    if (!w) return;
    tk_run_t run;
    int64_t t0 = tk_now_ms();
    tk_run_start(&run, w);
    tk_rec_t res[64], dl[16];
    int nres = tk_collect(brokers, out, 2, NGOOD + 1, 40000, res, 64);
    int ndlq = tk_collect(brokers, dlq, 1, NBAD, 20000, dl, 16);
    double secs = (double)(tk_now_ms() - t0) * 1e-3;
    /* wait until everything is committed, then stop */
    int64_t end = tk_now_ms() + 10000;
    worker_stats_t st;
    do {
        usleep(50000);
        worker_stats(w, &st);
    } while (st.results + st.dlq < (uint64_t)N && tk_now_ms() < end);
    worker_stop(w);
    tk_run_join(&run);
    CHECKF(run.rc == 0, "%s", run.err);
    fprintf(stderr, "%s: %d results, %d DLQ in %.2fs; pauses %llu, commits %llu, txns %llu\n",
            eos ? "exactly-once" : "at-least-once", nres, ndlq, secs,
            (unsigned long long)st.pauses, (unsigned long long)st.commits,
            (unsigned long long)st.txn_commits);
    CHECKF(nres == NGOOD + 1, "%d results", nres);
    for (int i = 0; i < NGOOD; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        CHECKF(tk_count_id(res, nres, id) == 1, "%s", id);
    }
    CHECK(tk_count_id(res, nres, "late") == 1);
    for (int i = 0; i < nres; i++) {
        if (strstr(res[i].value, "\"id\":\"late\"")) {
            CHECKF(strstr(res[i].value, "\"finish_reason\":\"expired\"") != NULL, "%s", res[i].value);
            CHECK(strstr(res[i].value, "\"completion_tokens\":0") != NULL);
        } else {
            CHECKF(strstr(res[i].value, "\"finish_reason\":\"length\"") ||
                       strstr(res[i].value, "\"finish_reason\":\"stop\""), "%s", res[i].value);
            CHECK(strstr(res[i].value, "\"metadata\":{\"n\":") != NULL);
            if (strstr(res[i].value, "\"id\":\"r0\""))
                CHECKF(strstr(res[i].value, META0_OUT) != NULL, "metadata not as sent: %s",
                       res[i].value);
            CHECK(strstr(res[i].value, "\"worker\":\"test-worker\"") != NULL);
            CHECK(strstr(res[i].value, "\"input\":{\"topic\":") != NULL);
        }
    }
    CHECKF(ndlq == NBAD, "%d DLQ records", ndlq);
    static const char *codes[NBAD] = {"not_json", "missing_prompt", "invalid_utf8", "bad_parameter",
                                      "unknown_template", "prompt_too_many_tokens"};
    for (int i = 0; i < NBAD; i++) {
        int found = 0;
        for (int j = 0; j < ndlq; j++)
            if (dl[j].len == lens[NGOOD + i] && !memcmp(dl[j].value, vals[NGOOD + i], dl[j].len)) {
                found = 1;
                CHECKF(!strcmp(dl[j].code, codes[i]), "DLQ '%s': code %s, want %s", vals[NGOOD + i],
                       dl[j].code, codes[i]);
                CHECK(dl[j].src_partition == (NGOOD + i) % 4);
            }
        CHECKF(found, "no DLQ record for '%s'", vals[NGOOD + i]);
    }
    CHECK(st.pauses > 0); /* max.inflight 5 < 30 messages */
    CHECK(st.expired == 1);
    /* librdkafka 2.0's mock cluster acknowledges TxnOffsetCommit without storing the offsets,
     * so exactly-once commits are checked on the real broker (tests/test_worker_kafka.sh). */
    if (!eos) {
        int64_t sum = tk_committed(brokers, group, in, 4, NULL);
        CHECKF(sum == N, "committed offsets sum %lld, want %d", (long long)sum, N);
    } else {
        CHECK(st.txn_commits > 0 && st.txn_aborts == 0);
    }
    worker_free(w);
    tk_recs_free(res, nres);
    tk_recs_free(dl, ndlq);
    for (int i = 0; i < N; i++) free(vals[i]);
}

/* The results' leader is down: results cannot be made durable, so nothing may be committed;
 * once it is back, everything arrives and the offsets reach the end. */
/* A result larger than the producer's message.max.bytes becomes a dead letter with reason
 * result_too_large (the original message, which fits), and its offset is committed: nothing is
 * lost and the partition goes on. */
/* One message; the broker refuses its output records with the injected errors (errs[n]): the
 * message ends up as one dead letter of code want_code carrying its bytes, and its offset is
 * committed (the partition moves on). */
static void refused_case(rd_kafka_mock_cluster_t *mc, const char *brokers, const char *tag,
                         int n, const rd_kafka_resp_err_t *errs, const char *want_code)
{
    char in[64], out[64], dlq[64], group[64];
    snprintf(in, sizeof in, "%s-in", tag);
    snprintf(out, sizeof out, "%s-out", tag);
    snprintf(dlq, sizeof dlq, "%s-dlq", tag);
    snprintf(group, sizeof group, "g-%s", tag);
    rd_kafka_mock_topic_create(mc, in, 1, 1);
    rd_kafka_mock_topic_create(mc, out, 1, 1);
    rd_kafka_mock_topic_create(mc, dlq, 1, 1);
    char *vals[1] = {strdup("{\"id\":\"big\",\"prompt\":\"Once upon a time\",\"max_tokens\":4,"
                            "\"temperature\":0}")};
    size_t lens[1] = {strlen(vals[0])};
    CHECK(tk_produce_values(brokers, in, (const char *const *)vals, lens, 1, 1, 1) == 0);
    rd_kafka_mock_push_request_errors_array(mc, 0 /* Produce */, (size_t)n, errs);
    worker_t *w = make_worker_x(brokers, group, in, out, dlq, 0, 8, NULL);
    if (!w) goto out;
    tk_run_t run;
    tk_run_start(&run, w);
    tk_rec_t dl[4];
    int ndlq = tk_collect(brokers, dlq, 1, 1, 30000, dl, 4);
    int64_t end = tk_now_ms() + 30000;
    while (tk_committed(brokers, group, in, 1, NULL) < 1 && tk_now_ms() < end) usleep(100000);
    CHECKF(tk_committed(brokers, group, in, 1, NULL) == 1, "%s: offset not committed past it", tag);
    worker_stop(w);
    tk_run_join(&run);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECKF(ndlq == 1 && !strcmp(dl[0].code, want_code) && dl[0].len == lens[0] &&
               !memcmp(dl[0].value, vals[0], lens[0]),
           "%s: %d dead letters, code '%s'", tag, ndlq, ndlq ? dl[0].code : "");
    tk_recs_free(dl, ndlq);
    worker_free(w);
out:
    free(vals[0]);
}

/* The broker refuses the result for its size (MESSAGE_TOO_LARGE): result_too_large. */
static void test_result_too_large(rd_kafka_mock_cluster_t *mc, const char *brokers)
{
    rd_kafka_resp_err_t e[1] = {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE};
    refused_case(mc, brokers, "big", 1, e, "result_too_large");
}

/* A permanent error (librdkafka then refuses the topic's later records itself, so every one of
 * the output.max_retries = 3 retries fails too): delivery_failed. */
static void test_permanent_error(rd_kafka_mock_cluster_t *mc, const char *brokers)
{
    rd_kafka_resp_err_t e[1] = {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED};
    refused_case(mc, brokers, "perm", 1, e, "delivery_failed");
}

/* n prompts {"id": "<tag><i>", "prompt": "Tom and his dog <i>", "max_tokens": max_tokens} into
 * vals/lens (strdup'ed: the caller frees vals[i]), produced to topic over nparts partitions. */
static void produce_prompts(const char *brokers, const char *topic, int nparts, const char *tag,
                            int max_tokens, int n, char **vals, size_t *lens)
{
    for (int i = 0; i < n; i++) {
        char buf[128];
        snprintf(buf, sizeof buf, "{\"id\":\"%s%d\",\"prompt\":\"Tom and his dog %d\",\"max_tokens\":%d}",
                 tag, i, i, max_tokens);
        vals[i] = strdup(buf);
        lens[i] = strlen(buf);
    }
    CHECK(tk_produce_values(brokers, topic, (const char *const *)vals, lens, n, nparts, 1) == 0);
}

static void test_broker_down(rd_kafka_mock_cluster_t *mc, const char *brokers)
{
    const char *in = "fin", *out = "fout", *dlq = "fdlq", *group = "gf";
    rd_kafka_mock_topic_create(mc, in, 2, 1);
    rd_kafka_mock_topic_create(mc, out, 1, 1);
    rd_kafka_mock_topic_create(mc, dlq, 1, 1);
    rd_kafka_mock_partition_set_leader(mc, in, 0, 1);
    rd_kafka_mock_partition_set_leader(mc, in, 1, 1);
    rd_kafka_mock_partition_set_leader(mc, out, 0, 3);
    rd_kafka_mock_partition_set_leader(mc, dlq, 0, 1);
    rd_kafka_mock_coordinator_set(mc, "group", group, 1);
    enum { N = 8 };
    char *vals[N];
    size_t lens[N];
    produce_prompts(brokers, in, 2, "f", 3, N, vals, lens);
    rd_kafka_mock_broker_set_down(mc, 3);
    /* retriable produce errors on top, once the broker is back */
    rd_kafka_mock_push_request_errors(mc, 0 /* Produce */, 2, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
                                      RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS);

    worker_t *w = make_worker(brokers, group, in, out, dlq, 0, 64);
    if (!w) return;
    tk_run_t run;
    tk_run_start(&run, w);
    worker_stats_t st;
    int64_t end = tk_now_ms() + 20000;
    do { /* all consumed and computed, none durable */
        usleep(50000);
        worker_stats(w, &st);
    } while (st.consumed < N && tk_now_ms() < end);
    usleep(1500000);
    int64_t sum = tk_committed(brokers, group, in, 2, NULL);
    worker_stats(w, &st);
    CHECKF(st.results == 0, "%llu results durable while the leader is down", (unsigned long long)st.results);
    CHECKF(sum <= 0, "committed %lld while no result is durable", (long long)sum);
    rd_kafka_mock_broker_set_up(mc, 3);
    tk_rec_t res[N + 8];
    int nres = tk_collect(brokers, out, 1, N, 30000, res, N + 8);
    end = tk_now_ms() + 10000;
    do {
        usleep(50000);
        worker_stats(w, &st);
    } while (st.results < N && tk_now_ms() < end);
    worker_stop(w);
    tk_run_join(&run);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECKF(nres == N, "%d results after the broker came back", nres);
    for (int i = 0; i < N; i++) {
        char id[16];
        snprintf(id, sizeof id, "f%d", i);
        CHECKF(tk_count_id(res, nres, id) >= 1, "%s", id);
    }
    sum = tk_committed(brokers, group, in, 2, NULL);
    CHECKF(sum == N, "committed offsets sum %lld, want %d", (long long)sum, N);
    worker_free(w);
    tk_recs_free(res, nres);
    for (int i = 0; i < N; i++) free(vals[i]);
}

/* Offset commits that fail (per-partition errors from the coordinator, injected): the worker
 * resends them, and after a clean stop the committed offsets are at the log end. */
static void test_commit_errors(rd_kafka_mock_cluster_t *mc, const char *brokers)
{
    const char *in = "cin", *out = "cout", *dlq = "cdlq", *group = "gc";
    rd_kafka_mock_topic_create(mc, in, 2, 1);
    rd_kafka_mock_topic_create(mc, out, 1, 1);
    rd_kafka_mock_topic_create(mc, dlq, 1, 1);
    enum { N = 40 };
    char *vals[N];
    size_t lens[N];
    produce_prompts(brokers, in, 2, "c", 2, N, vals, lens);
    /* OffsetCommit (API key 8): the next 8 requests fail for every partition they carry */
    rd_kafka_mock_push_request_errors(mc, 8, 8, RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE,
                                      RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE,
                                      RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE,
                                      RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE,
                                      RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE,
                                      RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE,
                                      RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE,
                                      RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE);
    worker_t *w = make_worker(brokers, group, in, out, dlq, 0, 64);
    if (!w) return;
    tk_run_t run;
    tk_run_start(&run, w);
    worker_stats_t st;
    int64_t end = tk_now_ms() + 20000;
    do {
        usleep(50000);
        worker_stats(w, &st);
    } while (st.results < N && tk_now_ms() < end);
    /* the periodic commits (every 100 ms) use up the injected errors and get through */
    int64_t sum;
    end = tk_now_ms() + 10000;
    while ((sum = tk_committed(brokers, group, in, 2, NULL)) != N && tk_now_ms() < end)
        usleep(100000);
    CHECKF(sum == N, "committed offsets sum %lld while running, after failed commits, want %d",
           (long long)sum, N);
    worker_stop(w);
    tk_run_join(&run);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECKF(st.results == N, "%llu results", (unsigned long long)st.results);
    sum = tk_committed(brokers, group, in, 2, NULL);
    CHECKF(sum == N, "committed offsets sum %lld after a clean stop, want %d", (long long)sum, N);
    worker_free(w);
    for (int i = 0; i < N; i++) free(vals[i]);
}

int main(void)
{
    if (access(MODEL, R_OK)) {
        fprintf(stderr, "skip: %s not found\n", MODEL);
        return 77;
    }
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    rd_kafka_t *mk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    CHECK(mk != NULL);
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(mk, 3);
    CHECK(mc != NULL);
    char *brokers = strdup(rd_kafka_mock_cluster_bootstraps(mc));
    test_end_to_end(mc, brokers, 0);
    test_end_to_end(mc, brokers, 1);
    test_result_too_large(mc, brokers);
    test_permanent_error(mc, brokers);
    test_broker_down(mc, brokers);
    test_commit_errors(mc, brokers);
    free(brokers);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(mk);
    return check_exit();
}
