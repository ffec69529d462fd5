/* tests/test_worker_txn_mock.c: fault injection on librdkafka's in-process mock cluster
 * (rd_kafka_mock_broker_push_request_error_rtts) against the worker with stories260K:
 *  - exactly-once, retriable errors on EndTxn, AddOffsetsToTxn, TxnOffsetCommit and Produce:
 *    retried, no transaction aborted, every result exactly once;
 *  - exactly-once, abortable errors (TxnOffsetCommit UNKNOWN_MEMBER_ID, EndTxn
 *    UNKNOWN_PRODUCER_ID, Produce TOPIC_AUTHORIZATION_FAILED): the transaction is aborted, the
 *    input rewound and processed again (more messages consumed than produced), the worker goes
 *    on and every result arrives;
 *  - exactly-once, fatal errors (TxnOffsetCommit TRANSACTIONAL_ID_AUTHORIZATION_FAILED; EndTxn
 *    PRODUCER_FENCED with transaction.fence.window.ms 0; AddOffsetsToTxn INVALID_PRODUCER_EPOCH
 *    twice, the second fence within the window): worker_run returns -1 with the reason and no
 *    transaction was committed; a restarted worker with the same transactional.id serves
 *    everything;
 *  - exactly-once, one fence (EndTxn PRODUCER_FENCED, Produce INVALID_PRODUCER_EPOCH: what the
 *    broker answers after aborting a transaction that outlived transaction.timeout.ms): the
 *    producer instance is replaced, the input rewound, every input answered once by the new
 *    instance, and the worker goes on;
 *  - exactly-once, the assignment lost (a heartbeat answered ILLEGAL_GENERATION) with outputs
 *    in the open transaction: it is aborted, and everything is served again;
 *  - exactly-once, the EndTxn of a commit, or of the abort after an abortable error, answered
 *    after transaction.commit.timeout.ms (outcome unknown; librdkafka #5423): the producer
 *    instance is replaced (a second InitProducerId), the input rewound, every input answered
 *    once by the new instance, and the worker goes on;
 *  - at-least-once, permanent produce errors and delivery timeouts (leader down longer than
 *    message.timeout.ms): the worker produces again, and a checker that samples the group's
 *    committed offsets and then the results topic finds, at every sample, a durable result for
 *    every input message below the committed offset;
 *  - at-least-once, a drain timeout with long requests in flight: worker_run returns (it used to
 *    hang in rd_kafka_destroy, which waits for consumed messages the engine still held), and the
 *    committed offsets cover only durable results.
 * librdkafka 2.0's mock cluster writes no transaction markers and stores no transactional
 * offsets, so aborted records stay visible and a rewind goes back to the beginning; the
 * read_committed view and the committed offsets of exactly-once runs are checked on a real broker
 * (tests/test_worker_kafka_eos.sh). Every case runs in its own process with its own mock
 * cluster, all at once (a group's first join costs 3 s on the mock); a case's log is printed
 * only when it fails. */
#include <errno.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "tests/support/mock_kafka.h"
#include "worker/worker.h"

#define MODEL SPILLWAY_MODELS "/stories260K.gguf"

/* Kafka protocol ApiKeys */
enum { API_PRODUCE = 0, API_HEARTBEAT = 12, API_INIT_PRODUCER_ID = 22, API_ADD_OFFSETS_TO_TXN = 25,
       API_END_TXN = 26, API_TXN_OFFSET_COMMIT = 28 };
/* mock brokers: 1 = transaction coordinator and input leader, 2 = group coordinator, 3 = output
 * leader */
enum { B_TXN = 1, B_GROUP = 2, B_OUT = 3 };
enum { NPARTS = 2, MAXN = 64 };

static rd_kafka_t *new_client(rd_kafka_type_t type, const char *brokers, const char *group,
                              const char *isolation)
{
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "2", err, sizeof err);
    if (group) rd_kafka_conf_set(conf, "group.id", group, err, sizeof err);
    if (isolation) rd_kafka_conf_set(conf, "isolation.level", isolation, err, sizeof err);
    if (type == RD_KAFKA_CONSUMER) rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(type, conf, err, sizeof err);
    if (!rk) fprintf(stderr, "rd_kafka_new: %s\n", err);
    return rk;
}

/* ---- one case's setting: a mock cluster, its topics, a worker ---- */

typedef struct {
    const char *tag;
    rd_kafka_t *mk;                /* owns the mock cluster */
    rd_kafka_mock_cluster_t *mc;
    char brokers[256];
    char in[32], out[32], dlq[32], group[32], txid[48];
    int n;                         /* prompts */
} env_t;

static int env_init(env_t *e, const char *tag, int n)
{
    char err[256];
    memset(e, 0, sizeof *e);
    e->tag = tag;
    e->n = n;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "2", err, sizeof err);
    e->mk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!e->mk || !(e->mc = rd_kafka_mock_cluster_new(e->mk, 3))) return -1;
    snprintf(e->brokers, sizeof e->brokers, "%s", rd_kafka_mock_cluster_bootstraps(e->mc));
    snprintf(e->in, sizeof e->in, "in-%s", tag);
    snprintf(e->out, sizeof e->out, "out-%s", tag);
    snprintf(e->dlq, sizeof e->dlq, "dlq-%s", tag);
    snprintf(e->group, sizeof e->group, "g-%s", tag);
    snprintf(e->txid, sizeof e->txid, "tx-%s", tag);
    rd_kafka_mock_topic_create(e->mc, e->in, NPARTS, 1);
    rd_kafka_mock_topic_create(e->mc, e->out, 1, 1);
    rd_kafka_mock_topic_create(e->mc, e->dlq, 1, 1);
    for (int p = 0; p < NPARTS; p++) rd_kafka_mock_partition_set_leader(e->mc, e->in, p, B_TXN);
    rd_kafka_mock_partition_set_leader(e->mc, e->out, 0, B_OUT);
    rd_kafka_mock_partition_set_leader(e->mc, e->dlq, 0, B_OUT);
    rd_kafka_mock_coordinator_set(e->mc, "transaction", e->txid, B_TXN);
    rd_kafka_mock_coordinator_set(e->mc, "group", e->group, B_GROUP);
    return 0;
}

static void env_free(env_t *e)
{
    if (e->mc) rd_kafka_mock_cluster_destroy(e->mc);
    if (e->mk) rd_kafka_destroy(e->mk);
}

/* Produces e->n prompts "<tag>-<i>" to partition i % NPARTS; request i asks max_tokens(i). */
static void produce_prompts(env_t *e, int (*max_tokens)(int))
{
    rd_kafka_t *p = new_client(RD_KAFKA_PRODUCER, e->brokers, NULL, NULL);
    for (int i = 0; i < e->n; i++) {
        char id[48], val[256];
        snprintf(id, sizeof id, "%s-%d", e->tag, i);
        snprintf(val, sizeof val,
                 "{\"id\":\"%s\",\"prompt\":\"Tom and his dog %d\",\"max_tokens\":%d,\"temperature\":0}",
                 id, i, max_tokens ? max_tokens(i) : 2);
        rd_kafka_resp_err_t err = rd_kafka_producev(
            p, RD_KAFKA_V_TOPIC(e->in), RD_KAFKA_V_PARTITION(i % NPARTS),
            RD_KAFKA_V_KEY(id, strlen(id)), RD_KAFKA_V_VALUE(val, strlen(val)),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        CHECK(err == 0);
    }
    CHECK(rd_kafka_flush(p, 10000) == 0);
    rd_kafka_destroy(p);
}

static worker_t *make_worker(const env_t *e, int eos, const char *const *extra)
{
    worker_config_t c;
    char err[512];
    worker_config_default(&c);
    const char *kv[][2] = {
        {"brokers", e->brokers},        {"group.id", e->group},       {"input.topics", e->in},
        {"output.topic", e->out},       {"dlq.topic", e->dlq},        {"model", MODEL},
        {"threads", "1"},               {"kv.mem_mb", "16"},          {"commit.interval.ms", "100"},
        {"drain.timeout.ms", "10000"},  {"worker.id", e->tag},        {"transactional.id", e->txid},
        {"delivery", eos ? "exactly-once" : "at-least-once"},
        {"log.level", getenv("WLOG") ? getenv("WLOG") : "warn"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        CHECKF(worker_config_set(&c, kv[i][0], kv[i][1], "test", err, sizeof err) == 0, "%s", err);
    worker_config_add_kafka(&c, "log_level=3", "test", err, sizeof err);
    worker_config_add_kafka(&c, "consumer.session.timeout.ms=6000", "test", err, sizeof err);
    for (; extra && *extra; extra++) {
        const char *eq = strchr(*extra, '=');
        if (!strncmp(*extra, "kafka:", 6)) {
            worker_config_add_kafka(&c, *extra + 6, "test", err, sizeof err);
        } else if (eq) {
            char key[64];
            snprintf(key, sizeof key, "%.*s", (int)(eq - *extra), *extra);
            CHECKF(worker_config_set(&c, key, eq + 1, "test", err, sizeof err) == 0, "%s", err);
        }
    }
    worker_t *w = worker_new(&c, err, sizeof err);
    CHECKF(w != NULL, "worker_new: %s", err);
    worker_config_free(&c);
    return w;
}

typedef struct {
    worker_t *w;
    pthread_t th;
    int rc, done;
    char err[512];
} run_t;

static void *run_main(void *arg)
{
    run_t *r = arg;
    r->rc = worker_run(r->w, NULL, r->err, sizeof r->err);
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void run_start(run_t *r, worker_t *w)
{
    memset(r, 0, sizeof *r);
    r->w = w;
    pthread_create(&r->th, NULL, run_main, r);
}

/* Waits up to timeout_ms for worker_run to return. 0, or -1 when it still runs (a hang: the
 * case process then ends without cleaning up). */
static int run_wait(run_t *r, int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    return pthread_timedjoin_np(r->th, NULL, &ts) ? -1 : 0;
}

static int run_stop(run_t *r, int timeout_ms)
{
    worker_stop(r->w);
    return run_wait(r, timeout_ms);
}

static int run_done(run_t *r) { return __atomic_load_n(&r->done, __ATOMIC_ACQUIRE); }

/* ---- the results topic, read incrementally ---- */

typedef struct {
    rd_kafka_t *c;
    int n;                                /* prompts */
    int count[MAXN];                      /* records per request index */
    unsigned char seen[NPARTS][MAXN];     /* input (partition, offset) with a result */
    int records, distinct;
    int64_t next;                         /* next output offset to read */
    const char *tag;
} reader_t;

static void reader_init(reader_t *rd, const env_t *e)
{
    memset(rd, 0, sizeof *rd);
    rd->n = e->n;
    rd->tag = e->tag;
    rd->c = new_client(RD_KAFKA_CONSUMER, e->brokers, "reader", "read_committed");
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, e->out, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rd->c, l);
    rd_kafka_topic_partition_list_destroy(l);
}

static void reader_free(reader_t *rd)
{
    rd_kafka_consumer_close(rd->c);
    rd_kafka_destroy(rd->c);
}

static void reader_add(reader_t *rd, const rd_kafka_message_t *m)
{
    json_t *o = json_loadb(m->payload, m->len, 0, NULL);
    const char *id = json_string_value(json_object_get(o, "id"));
    json_t *in = json_object_get(o, "input");
    int part = (int)json_integer_value(json_object_get(in, "partition"));
    int off = (int)json_integer_value(json_object_get(in, "offset"));
    size_t tl = strlen(rd->tag);
    int i = id && !strncmp(id, rd->tag, tl) && id[tl] == '-' ? atoi(id + tl + 1) : -1;
    CHECKF(i >= 0 && i < rd->n, "unexpected result %.*s", (int)m->len, (const char *)m->payload);
    if (i >= 0 && i < rd->n) {
        if (!rd->count[i]++) rd->distinct++;
        rd->records++;
    }
    if (part >= 0 && part < NPARTS && off >= 0 && off < MAXN) rd->seen[part][off] = 1;
    json_decref(o);
}

/* Forgets what was read (counts, seen inputs), so that what follows is counted alone; the next
 * record read is the one after the last read. */
static void reader_rebase(reader_t *rd)
{
    rd_kafka_t *c = rd->c;
    int n = rd->n;
    const char *tag = rd->tag;
    int64_t next = rd->next;
    memset(rd, 0, sizeof *rd);
    rd->c = c;
    rd->n = n;
    rd->tag = tag;
    rd->next = next;
}

/* Reads every result written up to now (the high watermark when called). */
static void reader_catch_up(reader_t *rd, const char *topic)
{
    int64_t lo = 0, hi = 0;
    if (rd_kafka_query_watermark_offsets(rd->c, topic, 0, &lo, &hi, 5000)) return;
    int64_t end = tk_now_ms() + 5000;
    while (rd->next < hi && tk_now_ms() < end) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rd->c, 50);
        if (!m) continue;
        if (!m->err) {
            reader_add(rd, m);
            rd->next = m->offset + 1;
        }
        rd_kafka_message_destroy(m);
    }
}

/* The group's committed offset of each input partition (-1 none), into off[NPARTS]. */
static int committed(const env_t *e, rd_kafka_t *q, int64_t *off)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(NPARTS);
    for (int p = 0; p < NPARTS; p++) rd_kafka_topic_partition_list_add(l, e->in, p);
    int rc = rd_kafka_committed(q, l, 5000) ? -1 : 0;
    for (int p = 0; p < NPARTS; p++) off[p] = rc ? -1 : l->elems[p].offset;
    rd_kafka_topic_partition_list_destroy(l);
    return rc;
}

/* At-least-once invariant, sampled: read the committed offsets first, then every result written
 * so far; each input message below its partition's committed offset must have a result. Returns
 * the number of messages that break it; *sum gets the committed offsets' sum. */
static int check_durable(const env_t *e, rd_kafka_t *q, reader_t *rd, int64_t *sum, int read)
{
    int64_t off[NPARTS];
    *sum = 0;
    if (committed(e, q, off)) return 0;
    if (read) reader_catch_up(rd, e->out); /* not while its leader is down: that call hangs */
    int bad = 0;
    for (int p = 0; p < NPARTS; p++) {
        for (int64_t o = 0; o < off[p] && o < MAXN; o++)
            if (!rd->seen[p][o]) bad++;
        *sum += off[p] > 0 ? off[p] : 0;
    }
    return bad;
}

static size_t stack_left(const env_t *e, int broker, int api)
{
    size_t n = 0;
    rd_kafka_mock_broker_error_stack_cnt(e->mc, broker, (int16_t)api, &n);
    return n;
}

/* Waits until the InitProducerId answers pushed on the transaction coordinator are all taken
 * (the replacement instance's reached it, so the old instance is gone) or the worker stopped;
 * checked. */
static void wait_inits_taken(const env_t *e, run_t *run)
{
    int64_t end = tk_now_ms() + 30000;
    while (stack_left(e, B_TXN, API_INIT_PRODUCER_ID) > 0 && !run_done(run) && tk_now_ms() < end)
        usleep(20000);
    CHECKF(stack_left(e, B_TXN, API_INIT_PRODUCER_ID) == 0,
           "%s: no second InitProducerId (worker %s: %s)", e->tag,
           run_done(run) ? "stopped" : "running", run_done(run) ? run->err : "");
}

/* Exactly-once: waits until every request has a result and nothing is in flight, then stops the
 * worker (its drain commits the last transaction). 0, or -1 on a timeout or a hang. */
static int eos_finish(env_t *e, run_t *run, reader_t *rd, int timeout_ms)
{
    int64_t end = tk_now_ms() + timeout_ms;
    worker_stats_t st;
    for (;;) {
        reader_catch_up(rd, e->out);
        worker_stats(run->w, &st);
        if (rd->distinct == e->n && st.inflight == 0) break;
        if (run_done(run) || tk_now_ms() > end) {
            CHECKF(0, "%s: %d of %d results, %d in flight, worker %s", e->tag, rd->distinct, e->n,
                   st.inflight, run_done(run) ? "stopped" : "running");
            break;
        }
        usleep(50000);
    }
    int rc = run_stop(run, 20000);
    CHECKF(rc == 0, "%s: worker_run did not return after worker_stop", e->tag);
    return rc;
}

/* ---- the cases ---- */

static int tok2(int i) { return 1 + i % 3; }

/* Retriable errors on every transactional API and on Produce: retried, never aborted. */
static int case_eos_retriable(void)
{
    env_t e;
    if (env_init(&e, "retriable", 16)) return -1;
    produce_prompts(&e, tok2);
    rd_kafka_mock_broker_push_request_error_rtts(
        e.mc, B_TXN, API_END_TXN, 3, RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, 0,
        RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS, 0, RD_KAFKA_RESP_ERR_NOT_COORDINATOR, 0);
    rd_kafka_mock_broker_push_request_error_rtts(
        e.mc, B_TXN, API_ADD_OFFSETS_TO_TXN, 2, RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, 0,
        RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS, 0);
    rd_kafka_mock_broker_push_request_error_rtts(
        e.mc, B_GROUP, API_TXN_OFFSET_COMMIT, 2, RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, 0,
        RD_KAFKA_RESP_ERR_NOT_COORDINATOR, 0);
    rd_kafka_mock_broker_push_request_error_rtts(
        e.mc, B_OUT, API_PRODUCE, 2, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, 0,
        RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, 0);
    /* one produce request in flight: with several, a retried batch lets the next one reach the
     * mock out of sequence, which librdkafka 2.0 turns into an abortable error */
    const char *extra[] = {"kafka:producer.max.in.flight.requests.per.connection=1", NULL};
    worker_t *w = make_worker(&e, 1, extra);
    if (!w) return -1;
    reader_t rd;
    reader_init(&rd, &e);
    run_t run;
    run_start(&run, w);
    if (eos_finish(&e, &run, &rd, 30000)) return -1;
    reader_catch_up(&rd, e.out);
    worker_stats_t st;
    worker_stats(w, &st);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECKF(st.txn_aborts == 0 && st.txn_commits >= 1, "%llu aborts, %llu commits",
           (unsigned long long)st.txn_aborts, (unsigned long long)st.txn_commits);
    CHECKF(rd.records == e.n && rd.distinct == e.n, "%d records, %d ids, want %d", rd.records,
           rd.distinct, e.n);
    CHECK(st.consumed == (uint64_t)e.n);
    CHECK(stack_left(&e, B_TXN, API_END_TXN) == 0);
    CHECK(stack_left(&e, B_TXN, API_ADD_OFFSETS_TO_TXN) == 0);
    CHECK(stack_left(&e, B_GROUP, API_TXN_OFFSET_COMMIT) == 0);
    CHECK(stack_left(&e, B_OUT, API_PRODUCE) == 0);
    fprintf(stderr, "summary: %d results, %llu transactions, 0 aborted, 9 injected errors retried\n",
            rd.records, (unsigned long long)st.txn_commits);
    worker_free(w);
    reader_free(&rd);
    env_free(&e);
    return 0;
}

/* One abortable error on api at broker: the transaction is aborted, the input rewound and served
 * again; every result arrives, the worker goes on. */
static int case_eos_abortable(const char *tag, int broker, int api, rd_kafka_resp_err_t err)
{
    env_t e;
    if (env_init(&e, tag, 16)) return -1;
    produce_prompts(&e, tok2);
    rd_kafka_mock_broker_push_request_error_rtts(e.mc, broker, (int16_t)api, 1, err, 0);
    worker_t *w = make_worker(&e, 1, NULL);
    if (!w) return -1;
    reader_t rd;
    reader_init(&rd, &e);
    run_t run;
    run_start(&run, w);
    /* the abort happens at the first commit; wait for it before waiting for the end */
    worker_stats_t st;
    int64_t end = tk_now_ms() + 20000;
    do {
        usleep(50000);
        worker_stats(w, &st);
    } while (st.txn_aborts == 0 && !run_done(&run) && tk_now_ms() < end);
    if (eos_finish(&e, &run, &rd, 30000)) return -1;
    reader_catch_up(&rd, e.out);
    worker_stats(w, &st);
    CHECKF(run.rc == 0, "%s", run.err);
    /* one abort per injected error, except that after a failed Produce librdkafka 2.0 may need
     * a second one (the skipped sequence numbers require an epoch bump) */
    CHECKF(st.txn_aborts >= 1 && st.txn_aborts <= 2, "%llu aborts", (unsigned long long)st.txn_aborts);
    CHECKF(st.txn_commits >= 1, "%llu commits", (unsigned long long)st.txn_commits);
    CHECKF(st.consumed > (uint64_t)e.n, "consumed %llu of %d: the input was not rewound",
           (unsigned long long)st.consumed, e.n);
    CHECKF(rd.distinct == e.n, "%d of %d ids", rd.distinct, e.n);
    for (int i = 0; i < e.n; i++) /* at most the aborted copies and the committed one */
        CHECKF(rd.count[i] >= 1 && rd.count[i] <= 1 + (int)st.txn_aborts, "%s-%d: %d records", tag,
               i, rd.count[i]);
    CHECK(stack_left(&e, broker, api) == 0);
    fprintf(stderr, "summary: %s: %llu transaction(s) aborted, %llu consumed for %d prompts, %d records "
                    "(aborted ones stay visible on the mock), %llu committed transactions\n",
            rd_kafka_err2name(err), (unsigned long long)st.txn_aborts, (unsigned long long)st.consumed,
            e.n, rd.records,
            (unsigned long long)st.txn_commits);
    worker_free(w);
    reader_free(&rd);
    env_free(&e);
    return 0;
}

static int case_abort_offsets(void)
{
    return case_eos_abortable("abort-offsets", B_GROUP, API_TXN_OFFSET_COMMIT,
                              RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID);
}
static int case_abort_endtxn(void)
{
    return case_eos_abortable("abort-endtxn", B_TXN, API_END_TXN,
                              RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID);
}
static int case_abort_produce(void)
{
    return case_eos_abortable("abort-produce", B_OUT, API_PRODUCE,
                              RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
}

/* A fatal error on api at broker, nerr times in a row, with transaction.fence.window.ms window
 * (NULL: the default): worker_run returns -1 with a reason containing want, no transaction was
 * committed, and fences producer instances were replaced first; with restart, a new worker with
 * the same transactional.id serves everything. */
static int case_eos_fatal(const char *tag, int broker, int api, rd_kafka_resp_err_t err, int nerr,
                          const char *window, int fences, const char *want, int restart)
{
    env_t e;
    if (env_init(&e, tag, 8)) return -1;
    produce_prompts(&e, tok2);
    if (nerr == 1)
        rd_kafka_mock_broker_push_request_error_rtts(e.mc, broker, (int16_t)api, 1, err, 0);
    else
        rd_kafka_mock_broker_push_request_error_rtts(e.mc, broker, (int16_t)api, 2, err, 0, err, 0);
    char wkey[64];
    snprintf(wkey, sizeof wkey, "transaction.fence.window.ms=%s", window ? window : "300000");
    const char *extra[] = {wkey, NULL};
    worker_t *w = make_worker(&e, 1, extra);
    if (!w) return -1;
    run_t run;
    run_start(&run, w);
    if (run_wait(&run, 30000)) {
        CHECKF(0, "%s: the worker did not stop on a fatal error", tag);
        return -1;
    }
    worker_stats_t st;
    worker_stats(w, &st);
    CHECKF(run.rc == -1, "%s: worker_run returned %d", tag, run.rc);
    CHECKF(strstr(run.err, want) != NULL, "reason: '%s', want '%s'", run.err, want);
    CHECKF(st.txn_commits == 0, "%llu transactions committed", (unsigned long long)st.txn_commits);
    CHECKF(st.producer_fences == (uint64_t)fences && st.producer_restarts == (uint64_t)fences,
           "%llu fences recovered, %llu producers replaced, want %d",
           (unsigned long long)st.producer_fences, (unsigned long long)st.producer_restarts, fences);
    CHECK(stack_left(&e, broker, api) == 0);
    fprintf(stderr, "summary: %s x%d: %d fence(s) recovered, then stopped with \"%s\"\n",
            rd_kafka_err2name(err), nerr, fences, run.err);
    worker_free(w);
    if (restart) { /* count from the end: the mock keeps the failed transaction's records */
        reader_t rd;
        reader_init(&rd, &e);
        reader_catch_up(&rd, e.out);
        reader_rebase(&rd);
        w = make_worker(&e, 1, NULL);
        if (!w) return -1;
        run_start(&run, w);
        if (eos_finish(&e, &run, &rd, 30000)) return -1;
        worker_stats(w, &st);
        CHECKF(run.rc == 0, "restart: %s", run.err);
        CHECKF(rd.distinct == e.n, "restart: %d of %d ids", rd.distinct, e.n);
        CHECK(st.txn_commits >= 1 && st.txn_aborts == 0);
        fprintf(stderr, "summary: restarted worker: %d ids, %llu transactions\n", rd.distinct,
                (unsigned long long)st.txn_commits);
        worker_free(w);
        reader_free(&rd);
    }
    env_free(&e);
    return 0;
}

/* a fence with transaction.fence.window.ms 0: the worker stops, as on any fatal error */
static int case_fatal_endtxn(void)
{
    return case_eos_fatal("fatal-endtxn", B_TXN, API_END_TXN, RD_KAFKA_RESP_ERR_PRODUCER_FENCED, 1,
                          "0", 0, "(stopping; restart the worker)", 1);
}
/* not a fence: stops */
static int case_fatal_offsets(void)
{
    return case_eos_fatal("fatal-offsets", B_GROUP, API_TXN_OFFSET_COMMIT,
                          RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 1, NULL, 0,
                          "fatal", 0);
}
/* fenced twice within the window (two workers sharing a transactional.id fence each other in
 * turn): the first is recovered from, the second stops the worker */
static int case_fenced_twice(void)
{
    return case_eos_fatal("fenced-twice", B_TXN, API_ADD_OFFSETS_TO_TXN,
                          RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH, 2, NULL, 1, "fenced again", 1);
}

/* Exactly-once, one fence (error err on api at broker; what a broker answers once it aborted a
 * transaction that outlived transaction.timeout.ms and bumped the epoch, e.g. after a network
 * partition): the worker replaces its producer instance (a second InitProducerId, whose answer
 * the mock holds back 3 s, so that the test reads every record of the old instance first),
 * rewinds and goes on; every input is answered exactly once by the new instance (the mock
 * stores no transactional offsets: the rewind goes back to the beginning). The old code
 * stopped on every fence. */
static int case_eos_fenced(const char *tag, int broker, int api, rd_kafka_resp_err_t err)
{
    env_t e;
    if (env_init(&e, tag, 16)) return -1;
    produce_prompts(&e, tok2);
    rd_kafka_mock_broker_push_request_error_rtts(e.mc, B_TXN, API_INIT_PRODUCER_ID, 2,
                                                 RD_KAFKA_RESP_ERR_NO_ERROR, 0,
                                                 RD_KAFKA_RESP_ERR_NO_ERROR, 3000);
    rd_kafka_mock_broker_push_request_error_rtts(e.mc, broker, (int16_t)api, 1, err, 0);
    worker_t *w = make_worker(&e, 1, NULL);
    if (!w) return -1;
    reader_t rd;
    reader_init(&rd, &e);
    run_t run;
    run_start(&run, w);
    wait_inits_taken(&e, &run);
    CHECK(stack_left(&e, broker, api) == 0);
    reader_catch_up(&rd, e.out); /* the old instance's records, all of them */
    int old_records = rd.records;
    reader_rebase(&rd); /* from here: the new instance's records */
    if (eos_finish(&e, &run, &rd, 30000)) return -1;
    reader_catch_up(&rd, e.out);
    worker_stats_t st;
    worker_stats(w, &st);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECKF(st.producer_fences == 1 && st.producer_restarts == 1,
           "%llu fences recovered, %llu producers replaced", (unsigned long long)st.producer_fences,
           (unsigned long long)st.producer_restarts);
    CHECKF(st.txn_commits >= 1, "%llu commits", (unsigned long long)st.txn_commits);
    CHECKF(rd.records == e.n && rd.distinct == e.n, "new instance: %d records, %d ids, want %d",
           rd.records, rd.distinct, e.n);
    fprintf(stderr, "summary: %s on api %d: producer replaced (2 InitProducerId), %d record(s) "
                    "of the fenced instance, then %d records for %d inputs in %llu committed "
                    "transaction(s)\n",
            rd_kafka_err2name(err), api, old_records, rd.records, e.n,
            (unsigned long long)st.txn_commits);
    worker_free(w);
    reader_free(&rd);
    env_free(&e);
    return 0;
}

static int case_fenced_endtxn(void)
{
    return case_eos_fenced("fenced-endtxn", B_TXN, API_END_TXN, RD_KAFKA_RESP_ERR_PRODUCER_FENCED);
}
static int case_fenced_produce(void)
{
    return case_eos_fenced("fenced-produce", B_OUT, API_PRODUCE,
                           RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH);
}

/* Exactly-once, the assignment is lost (a heartbeat answered ILLEGAL_GENERATION) while outputs
 * sit in the open transaction: their offsets can no longer be committed, so the transaction is
 * aborted (committing the outputs alone would make the partitions' next owner compute them
 * again); the worker re-joins, serves everything again and commits. */
static int case_eos_lost(void)
{
    env_t e;
    if (env_init(&e, "eos-lost", 16)) return -1;
    produce_prompts(&e, tok2);
    const char *extra[] = {"commit.interval.ms=60000", "kafka:consumer.heartbeat.interval.ms=100",
                           NULL};
    worker_t *w = make_worker(&e, 1, extra);
    if (!w) return -1;
    reader_t rd;
    reader_init(&rd, &e);
    run_t run;
    run_start(&run, w);
    worker_stats_t st;
    int64_t end = tk_now_ms() + 20000;
    do { /* every output in the open transaction, nothing committed */
        usleep(20000);
        worker_stats(w, &st);
    } while (st.results < (uint64_t)e.n && tk_now_ms() < end);
    CHECKF(st.results == (uint64_t)e.n && st.txn_commits == 0, "%llu outputs, %llu commits",
           (unsigned long long)st.results, (unsigned long long)st.txn_commits);
    rd_kafka_mock_broker_push_request_error_rtts(e.mc, B_GROUP, API_HEARTBEAT, 1,
                                                 RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION, 0);
    end = tk_now_ms() + 30000;
    do { /* lost, re-joined, everything consumed and computed again */
        usleep(50000);
        worker_stats(w, &st);
    } while ((st.consumed < 2 * (uint64_t)e.n || st.inflight > 0) && !run_done(&run) &&
             tk_now_ms() < end);
    if (run_stop(&run, 20000)) {
        CHECKF(0, "worker_run did not return");
        return -1;
    }
    reader_catch_up(&rd, e.out);
    worker_stats(w, &st);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECK(stack_left(&e, B_GROUP, API_HEARTBEAT) == 0);
    CHECKF(st.txn_aborts == 1, "%llu transactions aborted after the loss, want 1",
           (unsigned long long)st.txn_aborts);
    CHECKF(st.consumed == 2 * (uint64_t)e.n, "consumed %llu", (unsigned long long)st.consumed);
    CHECK(st.txn_commits >= 1);
    CHECKF(rd.distinct == e.n, "%d of %d ids", rd.distinct, e.n);
    fprintf(stderr, "summary: lost with %d outputs in the open transaction: %llu aborted, %llu "
                    "consumed, %llu committed transaction(s)\n",
            e.n, (unsigned long long)st.txn_aborts, (unsigned long long)st.consumed,
            (unsigned long long)st.txn_commits);
    worker_free(w);
    reader_free(&rd);
    env_free(&e);
    return 0;
}

/* Exactly-once, the EndTxn of a commit (abort: 0) or of the abort after an abortable error
 * (TxnOffsetCommit UNKNOWN_MEMBER_ID; abort: 1) answered only after
 * transaction.commit.timeout.ms: the broker may or may not have applied it, and without KIP-890
 * (librdkafka #5423) a late request of that producer instance could land in its next
 * transaction. The worker destroys the producer instance and creates a new one with the same
 * transactional.id (a second InitProducerId, whose answer the mock holds back 3 s, so that the
 * test reads every record of the old instance first), rewinds to the committed offsets and goes
 * on. The old code stopped as fatal: after the commit's timeout it called abort_transaction on
 * the same instance, which librdkafka refuses while the commit is in progress; an abort that
 * timed out was fatal. The mock stores no transactional offsets, so the rewind goes back to the
 * beginning: every input must then be answered exactly once by the new instance (on a real
 * broker, those that the timed-out transaction committed are not served again). */
static int case_eos_endtxn_timeout(const char *tag, int abort)
{
    env_t e;
    if (env_init(&e, tag, 16)) return -1;
    produce_prompts(&e, tok2);
    if (abort)
        rd_kafka_mock_broker_push_request_error_rtts(e.mc, B_GROUP, API_TXN_OFFSET_COMMIT, 1,
                                                     RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID, 0);
    rd_kafka_mock_broker_push_request_error_rtts(e.mc, B_TXN, API_INIT_PRODUCER_ID, 2,
                                                 RD_KAFKA_RESP_ERR_NO_ERROR, 0,
                                                 RD_KAFKA_RESP_ERR_NO_ERROR, 3000);
    rd_kafka_mock_broker_push_request_error_rtts(e.mc, B_TXN, API_END_TXN, 1,
                                                 RD_KAFKA_RESP_ERR_NO_ERROR, 5000);
    const char *extra[] = {"transaction.commit.timeout.ms=1000", NULL};
    worker_t *w = make_worker(&e, 1, extra);
    if (!w) return -1;
    reader_t rd;
    reader_init(&rd, &e);
    run_t run;
    run_start(&run, w);
    /* the new instance's InitProducerId reached the coordinator: the old instance is gone */
    wait_inits_taken(&e, &run);
    CHECK(stack_left(&e, B_TXN, API_END_TXN) == 0);
    CHECK(stack_left(&e, B_GROUP, API_TXN_OFFSET_COMMIT) == 0);
    reader_catch_up(&rd, e.out); /* the old instance's records, all of them */
    int old_records = rd.records;
    CHECKF(old_records >= 1 && rd.distinct == old_records,
           "timed-out transaction: %d records, %d ids", old_records, rd.distinct);
    reader_rebase(&rd); /* from here: the new instance's records */
    if (eos_finish(&e, &run, &rd, 30000)) return -1;
    reader_catch_up(&rd, e.out);
    worker_stats_t st;
    worker_stats(w, &st);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECKF(st.producer_restarts == 1, "%llu producer restarts",
           (unsigned long long)st.producer_restarts);
    CHECKF(st.txn_aborts == 0 && st.txn_commits >= 1, "%llu aborts, %llu commits",
           (unsigned long long)st.txn_aborts, (unsigned long long)st.txn_commits);
    CHECKF(rd.records == e.n && rd.distinct == e.n, "new instance: %d records, %d ids, want %d",
           rd.records, rd.distinct, e.n);
    CHECKF(st.results == (uint64_t)(old_records + e.n), "%llu results, want %d + %d",
           (unsigned long long)st.results, old_records, e.n);
    fprintf(stderr, "summary: EndTxn(%s) answered after 5 s, commit timeout 1 s: producer "
                    "replaced (2 InitProducerId), %d record(s) of the timed-out transaction, then "
                    "%d records for %d inputs in %llu committed transaction(s)\n",
            abort ? "abort" : "commit", old_records, rd.records, e.n,
            (unsigned long long)st.txn_commits);
    worker_free(w);
    reader_free(&rd);
    env_free(&e);
    return 0;
}

static int case_endtxn_timeout(void) { return case_eos_endtxn_timeout("endtxn-timeout", 0); }
static int case_abort_timeout(void) { return case_eos_endtxn_timeout("abort-timeout", 1); }

/* At-least-once: outputs fail for a while (permanent produce errors, or the output leader down
 * longer than message.timeout.ms); the worker produces them again, and no sample of the committed
 * offsets ever runs ahead of the durable results. */
static int case_alo_produce_fails(const char *tag, int leader_down_ms)
{
    env_t e;
    if (env_init(&e, tag, 16)) return -1;
    produce_prompts(&e, tok2);
    /* TOPIC_AUTHORIZATION_FAILED is a permanent error, dead-lettered after output.max_retries
     * (test_worker_mock's test_permanent_error): here it must be retried until the mock's three
     * injected errors are used up */
    const char *extra[] = {"kafka:producer.message.timeout.ms=1000",
                           "kafka:reconnect.backoff.max.ms=500", "output.max_retries=1000", NULL};
    if (leader_down_ms) {
        rd_kafka_mock_broker_set_down(e.mc, B_OUT);
    } else {
        rd_kafka_mock_broker_push_request_error_rtts(
            e.mc, B_OUT, API_PRODUCE, 3, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, 300,
            RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, 300,
            RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, 300);
    }
    worker_t *w = make_worker(&e, 0, extra);
    if (!w) return -1;
    rd_kafka_t *q = new_client(RD_KAFKA_CONSUMER, e.brokers, e.group, NULL);
    reader_t rd;
    reader_init(&rd, &e);
    run_t run;
    run_start(&run, w);
    int64_t t0 = tk_now_ms(), end = t0 + 40000, up_at = t0 + leader_down_ms;
    int bad = 0, samples = 0, behind = 0, down = leader_down_ms > 0;
    int64_t sum = 0;
    worker_stats_t st;
    for (;;) {
        if (down && tk_now_ms() >= up_at) {
            rd_kafka_mock_broker_set_up(e.mc, B_OUT);
            down = 0;
        }
        bad += check_durable(&e, q, &rd, &sum, !down);
        samples++;
        if (sum < e.n) behind++;
        worker_stats(w, &st);
        if (!down && sum == e.n && rd.distinct == e.n) break;
        if (tk_now_ms() > end || run_done(&run)) {
            CHECKF(0, "%s: %d of %d results, committed sum %lld", tag, rd.distinct, e.n, (long long)sum);
            break;
        }
        usleep(30000);
    }
    if (run_stop(&run, 20000)) {
        CHECKF(0, "%s: worker_run did not return", tag);
        return -1;
    }
    worker_stats(w, &st);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECKF(bad == 0, "%d committed offsets without a durable result", bad);
    CHECKF(st.produce_retries >= 1, "no output was produced again");
    CHECK(stack_left(&e, B_OUT, API_PRODUCE) == 0);
    CHECKF(rd.distinct == e.n, "%d of %d ids", rd.distinct, e.n);
    check_durable(&e, q, &rd, &sum, 1);
    CHECKF(sum == e.n, "committed offsets sum %lld, want %d", (long long)sum, e.n);
    fprintf(stderr, "summary: %s: %d results (%d records), %llu produced again, %d samples of the "
                    "committed offsets (%d behind the end), 0 ahead of the durable results\n",
            tag, rd.distinct, rd.records, (unsigned long long)st.produce_retries, samples, behind);
    worker_free(w);
    rd_kafka_destroy(q);
    reader_free(&rd);
    env_free(&e);
    return 0;
}

static int case_alo_produce_errors(void) { return case_alo_produce_fails("produce-errors", 0); }
static int case_alo_msg_timeout(void) { return case_alo_produce_fails("msg-timeout", 6000); }

static int tok_long(int i) { return i % 4 == 0 ? 2 : 400; }

/* At-least-once, SIGTERM-style stop with long requests in flight and a short drain timeout:
 * worker_run returns, what was not finished stays uncommitted. */
static int case_alo_drain_timeout(void)
{
    env_t e;
    if (env_init(&e, "drain-timeout", 24)) return -1;
    produce_prompts(&e, tok_long);
    const char *extra[] = {"drain.timeout.ms=300", NULL};
    worker_t *w = make_worker(&e, 0, extra);
    if (!w) return -1;
    rd_kafka_t *q = new_client(RD_KAFKA_CONSUMER, e.brokers, e.group, NULL);
    reader_t rd;
    reader_init(&rd, &e);
    run_t run;
    run_start(&run, w);
    worker_stats_t st;
    int64_t end = tk_now_ms() + 45000;
    do { /* every request accepted, the short ones done */
        usleep(50000);
        worker_stats(w, &st);
    } while ((st.consumed < (uint64_t)e.n || st.results < (uint64_t)e.n / 4) && tk_now_ms() < end);
    CHECKF(st.consumed == (uint64_t)e.n && st.results >= (uint64_t)e.n / 4,
           "not ready to stop: %llu consumed, %llu done", (unsigned long long)st.consumed,
           (unsigned long long)st.results);
    int64_t t0 = tk_now_ms();
    if (run_stop(&run, 15000)) {
        CHECKF(0, "worker_run did not return within 15 s of worker_stop (drain timeout 300 ms)");
        return -1;
    }
    int64_t stop_ms = tk_now_ms() - t0;
    worker_stats(w, &st);
    int64_t sum = 0;
    int bad = check_durable(&e, q, &rd, &sum, 1);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECKF(st.results < (uint64_t)e.n, "all %d finished before the drain timeout", e.n);
    CHECKF(st.revoked_dropped > 0, "nothing dropped at the drain timeout");
    CHECKF(bad == 0, "%d committed offsets without a durable result", bad);
    CHECKF(sum < e.n, "committed offsets sum %lld: past unfinished requests", (long long)sum);
    fprintf(stderr, "summary: stopped in %lld ms with %llu of %d done, %llu dropped, committed "
                    "offsets sum %lld\n",
            (long long)stop_ms, (unsigned long long)st.results, e.n,
            (unsigned long long)st.revoked_dropped, (long long)sum);
    worker_free(w);
    rd_kafka_destroy(q);
    reader_free(&rd);
    env_free(&e);
    return 0;
}

/* At-least-once, stopped while the output leader is down: no result can be made durable, the
 * drain times out, worker_run returns (it used to hang: librdkafka's destroy of the consumer
 * waited for consumed messages that the undelivered outputs still held) and nothing is
 * committed. */
static int case_alo_stop_output_down(void)
{
    env_t e;
    if (env_init(&e, "stop-down", 8)) return -1;
    produce_prompts(&e, tok2);
    rd_kafka_mock_broker_set_down(e.mc, B_OUT);
    const char *extra[] = {"drain.timeout.ms=500", NULL};
    worker_t *w = make_worker(&e, 0, extra);
    if (!w) return -1;
    rd_kafka_t *q = new_client(RD_KAFKA_CONSUMER, e.brokers, e.group, NULL);
    run_t run;
    run_start(&run, w);
    worker_stats_t st;
    int64_t end = tk_now_ms() + 20000;
    do { /* everything consumed and computed, nothing durable */
        usleep(50000);
        worker_stats(w, &st);
    } while (st.consumed < (uint64_t)e.n && tk_now_ms() < end);
    usleep(300000);
    int64_t t0 = tk_now_ms();
    if (run_stop(&run, 20000)) {
        CHECKF(0, "worker_run did not return within 20 s of worker_stop (output leader down)");
        return -1;
    }
    int64_t stop_ms = tk_now_ms() - t0, off[NPARTS]; /* 0 or none: nothing passed */
    worker_stats(w, &st);
    CHECKF(run.rc == 0, "%s", run.err);
    CHECK(st.consumed == (uint64_t)e.n && st.results == 0);
    int crc = committed(&e, q, off);
    CHECKF(crc == 0 && off[0] <= 0 && off[1] <= 0, "committed: rc %d, offsets %lld %lld", crc,
           (long long)off[0], (long long)off[1]);
    fprintf(stderr, "summary: stopped in %lld ms, %llu consumed, 0 durable, nothing committed\n",
            (long long)stop_ms, (unsigned long long)st.consumed);
    worker_free(w);
    rd_kafka_destroy(q);
    env_free(&e);
    return 0;
}

/* ---- driver: every case in its own process, all at once ---- */

typedef struct {
    const char *name;
    int (*fn)(void);
    pid_t pid;
    char log[64];
    int status;
    int64_t t0, ms;
} case_t;

int main(void)
{
    if (access(MODEL, R_OK)) {
        fprintf(stderr, "skip: %s not found\n", MODEL);
        return 77;
    }
    case_t cases[] = {
        {.name = "eos_retriable", .fn = case_eos_retriable},
        {.name = "eos_abort_txn_offset_commit", .fn = case_abort_offsets},
        {.name = "eos_abort_end_txn", .fn = case_abort_endtxn},
        {.name = "eos_abort_produce", .fn = case_abort_produce},
        {.name = "eos_fatal_end_txn_window_0", .fn = case_fatal_endtxn},
        {.name = "eos_fatal_txn_offset_commit", .fn = case_fatal_offsets},
        {.name = "eos_fenced_twice", .fn = case_fenced_twice},
        {.name = "eos_fenced_end_txn", .fn = case_fenced_endtxn},
        {.name = "eos_fenced_produce", .fn = case_fenced_produce},
        {.name = "eos_lost", .fn = case_eos_lost},
        {.name = "eos_end_txn_timeout", .fn = case_endtxn_timeout},
        {.name = "eos_abort_timeout", .fn = case_abort_timeout},
        {.name = "alo_produce_errors", .fn = case_alo_produce_errors},
        {.name = "alo_message_timeout", .fn = case_alo_msg_timeout},
        {.name = "alo_drain_timeout", .fn = case_alo_drain_timeout},
        {.name = "alo_stop_output_down", .fn = case_alo_stop_output_down},
    };
    enum { NCASES = sizeof cases / sizeof cases[0] };
    const char *only = getenv("CASE");
    fflush(NULL);
    for (int i = 0; i < NCASES; i++) {
        case_t *c = &cases[i];
        if (only && strcmp(only, c->name)) continue;
        snprintf(c->log, sizeof c->log, "/tmp/spillway-txn-mock-%d-%d.log", (int)getpid(), i);
        c->t0 = tk_now_ms();
        c->pid = fork();
        if (c->pid == 0) {
            if (!freopen(c->log, "w", stderr)) _exit(3);
            setvbuf(stderr, NULL, _IOLBF, 0);
            int rc = c->fn();
            int ex = check_exit();
            exit(rc ? 1 : ex); /* exit, not _exit: LeakSanitizer checks the case at exit */
        }
        CHECKF(c->pid > 0, "fork: %s", strerror(errno));
    }
    /* all cases end within 90 s, or count as hung */
    int64_t end = tk_now_ms() + 90000;
    int left = 0;
    for (int i = 0; i < NCASES; i++) left += cases[i].pid > 0;
    while (left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p <= 0) {
            if (tk_now_ms() > end) break;
            usleep(20000);
            continue;
        }
        for (int i = 0; i < NCASES; i++)
            if (cases[i].pid == p) {
                cases[i].status = status;
                cases[i].ms = tk_now_ms() - cases[i].t0;
                cases[i].pid = 0;
                left--;
            }
    }
    for (int i = 0; i < NCASES; i++) {
        case_t *c = &cases[i];
        if (!c->log[0]) continue;
        int hung = c->pid > 0;
        if (hung) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, NULL, 0);
        }
        int ok = !hung && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
        CHECKF(ok, "case %s %s", c->name,
               hung ? "hung" : WIFEXITED(c->status) ? "failed" : "crashed");
        FILE *f = fopen(c->log, "r");
        char line[1024];
        fprintf(stderr, "%-28s %s %6.1fs\n", c->name, ok ? "ok  " : "FAIL", (double)c->ms * 1e-3);
        while (f && fgets(line, sizeof line, f))
            if (!ok || !strncmp(line, "summary: ", 9) || strstr(line, "CHECK failed"))
                fprintf(stderr, "    %s", line);
        if (f) fclose(f);
        unlink(c->log);
    }
    return check_exit();
}
