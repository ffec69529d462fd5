/* tests/test_worker_claims.c: the claims key end to end on librdkafka's mock cluster with
 * stories260K. One worker consumes in-p (an entry of its own: tenants acme and globex, classes
 * gold and standard, defaults acme / standard), in-o (only the "*" entry: default tenant anon,
 * nothing claimable) and its overload deferral topic:
 *  - allowed claims, from the JSON and from Kafka headers, are served with what they claimed;
 *  - a request that claims nothing gets its topic's default tenant and class;
 *  - a tenant or class the topic does not allow, in the JSON or in a header, is a dead letter
 *    with code tenant_not_allowed / class_not_allowed, and its offset is committed;
 *  - a message on the deferral topic is judged by the entry of the topic a worker shed it from
 *    (its __spillway.deferred.from header), one without that header by the deferral topic's;
 * and a worker without claims serves the same claims unchecked (as before the key existed). */
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "worker/worker.h"

#define MODEL SPILLWAY_MODELS "/stories260K.gguf"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static rd_kafka_t *client(rd_kafka_type_t type, const char *brokers, const char *group)
{
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (brokers) rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    if (group) {
        rd_kafka_conf_set(conf, "group.id", group, err, sizeof err);
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
    }
    rd_kafka_t *rk = rd_kafka_new(type, conf, err, sizeof err);
    if (!rk) fprintf(stderr, "rd_kafka_new: %s\n", err);
    return rk;
}

/* A message to produce: its value and up to two headers (name NULL = none). */
typedef struct {
    const char *topic, *value;
    const char *h[2][2];
} msg_t;

static void produce(const char *brokers, const msg_t *msgs, int n)
{
    rd_kafka_t *p = client(RD_KAFKA_PRODUCER, brokers, NULL);
    for (int i = 0; i < n; i++) {
        rd_kafka_headers_t *h = rd_kafka_headers_new(2);
        for (int k = 0; k < 2; k++)
            if (msgs[i].h[k][0]) rd_kafka_header_add(h, msgs[i].h[k][0], -1, msgs[i].h[k][1], -1);
        /* h is owned by the message once producev succeeds */
        CHECK(rd_kafka_producev(p, RD_KAFKA_V_TOPIC(msgs[i].topic),
                                RD_KAFKA_V_VALUE((void *)msgs[i].value, strlen(msgs[i].value)),
                                RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                RD_KAFKA_V_END) == 0);
    }
    CHECK(rd_kafka_flush(p, 10000) == 0);
    rd_kafka_destroy(p);
}

typedef struct {
    json_t *value;     /* parsed record value */
    char code[64], message[256], topic[64]; /* DLQ headers */
} rec_t;

/* Reads topic (1 partition) from the beginning until want records or the timeout. */
static int collect(const char *brokers, const char *topic, int want, rec_t *out)
{
    rd_kafka_t *c = client(RD_KAFKA_CONSUMER, brokers, "collector");
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(c, l);
    rd_kafka_topic_partition_list_destroy(l);
    int n = 0;
    for (int64_t end = now_ms() + 30000; n < want && now_ms() < end;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) continue;
        if (!m->err) {
            rec_t *r = &out[n++];
            memset(r, 0, sizeof *r);
            r->value = json_loadb(m->payload, m->len, 0, NULL);
            rd_kafka_headers_t *h;
            const void *v;
            size_t vl;
            if (!rd_kafka_message_headers(m, &h)) {
                if (!rd_kafka_header_get_last(h, "__spillway.errors.code", &v, &vl))
                    snprintf(r->code, sizeof r->code, "%.*s", (int)vl, (const char *)v);
                if (!rd_kafka_header_get_last(h, "__spillway.errors.message", &v, &vl))
                    snprintf(r->message, sizeof r->message, "%.*s", (int)vl, (const char *)v);
                if (!rd_kafka_header_get_last(h, "__spillway.errors.topic", &v, &vl))
                    snprintf(r->topic, sizeof r->topic, "%.*s", (int)vl, (const char *)v);
            }
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    return n;
}

static const rec_t *find(const rec_t *recs, int n, const char *id)
{
    for (int i = 0; i < n; i++) {
        const char *v = json_string_value(json_object_get(recs[i].value, "id"));
        if (v && !strcmp(v, id)) return &recs[i];
    }
    return NULL;
}

static void free_recs(rec_t *recs, int n)
{
    for (int i = 0; i < n; i++) json_decref(recs[i].value);
}

/* The group's committed offset of topic's partition 0 (-1 none). */
static int64_t committed(const char *brokers, const char *group, const char *topic)
{
    rd_kafka_t *c = client(RD_KAFKA_CONSUMER, brokers, group);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, 0);
    int64_t off = rd_kafka_committed(c, l, 5000) ? -2 : l->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(c);
    return off;
}

typedef struct {
    worker_t *w;
    int rc;
    char err[512];
} run_t;

static void *run_worker(void *arg)
{
    run_t *r = arg;
    r->rc = worker_run(r->w, NULL, r->err, sizeof r->err);
    return NULL;
}

/* A worker of group g-SUFFIX on inputs `inputs`, results out-SUFFIX, dead letters dlq-SUFFIX,
 * classes gold / standard / batch (no ttft_ms: no overload step runs), plus kv[0..n). */
static worker_t *make_worker(const char *brokers, const char *suffix, const char *inputs,
                             const char *const (*kv)[2], int n)
{
    worker_config_t c;
    char err[512], out[32], dlq[32], group[32];
    snprintf(out, sizeof out, "out-%s", suffix);
    snprintf(dlq, sizeof dlq, "dlq-%s", suffix);
    snprintf(group, sizeof group, "g-%s", suffix);
    worker_config_default(&c);
    const char *base[][2] = {
        {"brokers", brokers}, {"group.id", group}, {"input.topics", inputs},
        {"output.topic", out}, {"dlq.topic", dlq}, {"model", MODEL}, {"threads", "1"},
        {"kv.mem_mb", "16"}, {"commit.interval.ms", "100"}, {"worker.id", "wc"},
        {"classes", "gold:priority=100,standard:priority=50,batch:priority=0"},
        {"class.default", "batch"},
        {"log.level", getenv("WLOG") ? getenv("WLOG") : "warn"}};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        CHECKF(!worker_config_set(&c, base[i][0], base[i][1], "test", err, sizeof err), "%s", err);
    for (int i = 0; i < n; i++)
        CHECKF(!worker_config_set(&c, kv[i][0], kv[i][1], "test", err, sizeof err), "%s", err);
    worker_config_add_kafka(&c, "log_level=3", "test", err, sizeof err);
    worker_t *w = worker_new(&c, err, sizeof err);
    CHECKF(w != NULL, "%s", err);
    worker_config_free(&c);
    return w;
}

/* Runs w until outputs results + DLQ records are durable, then stops it (its drain commits). */
static void run_until(worker_t *w, uint64_t outputs, worker_stats_t *st)
{
    run_t run = {.w = w};
    pthread_t th;
    pthread_create(&th, NULL, run_worker, &run);
    int64_t end = now_ms() + 40000;
    do {
        usleep(50000);
        worker_stats(w, st);
    } while (st->results + st->dlq < outputs && now_ms() < end);
    worker_stop(w);
    pthread_join(th, NULL);
    CHECKF(run.rc == 0, "%s", run.err);
    worker_stats(w, st);
}

/* A result of id with this tenant (NULL = no tenant field) and class. */
static void check_served(const rec_t *res, int n, const char *id, const char *tenant,
                         const char *cls)
{
    const rec_t *r = find(res, n, id);
    CHECKF(r != NULL, "no result for %s", id);
    if (!r) return;
    const char *t = json_string_value(json_object_get(r->value, "tenant"));
    const char *c = json_string_value(json_object_get(r->value, "class"));
    CHECKF(tenant ? t && !strcmp(t, tenant) : t == NULL, "%s: tenant %s, want %s", id,
           t ? t : "(none)", tenant ? tenant : "(none)");
    CHECKF(c && !strcmp(c, cls), "%s: class %s, want %s", id, c ? c : "(none)", cls);
}

/* A dead letter of id from topic with code, its message naming the refused claim. */
static void check_refused(const rec_t *dl, int n, const char *id, const char *topic,
                          const char *code, const char *claim)
{
    const rec_t *r = find(dl, n, id);
    CHECKF(r != NULL, "no DLQ record for %s", id);
    if (!r) return;
    CHECKF(!strcmp(r->code, code) && !strcmp(r->topic, topic) && strstr(r->message, claim) &&
               strstr(r->message, "may not be claimed"),
           "%s: code %s topic %s message %s; want %s from %s naming %s", id, r->code, r->topic,
           r->message, code, topic, claim);
}

#define P(id, rest) "{\"id\":\"" id "\",\"prompt\":\"Tom had a dog\",\"max_tokens\":2" rest "}"
#define FROM "__spillway.deferred.from"

static void test_claims(const char *brokers)
{
    const msg_t msgs[] = {
        /* in-p: its own entry */
        {"in-p", P("p-ok", ",\"tenant\":\"acme\",\"class\":\"gold\""), {{0}}},
        {"in-p", P("p-none", ""), {{0}}},
        {"in-p", P("p-badt", ",\"tenant\":\"initech\""), {{0}}},
        {"in-p", P("p-badc", ",\"class\":\"batch\""), {{0}}},
        {"in-p", P("p-hok", ""), {{"tenant", "globex"}, {"class", "gold"}}},
        {"in-p", P("p-hbadt", ""), {{"tenant", "initech"}, {0}}},
        {"in-p", P("p-hbadc", ""), {{"class", "batch"}, {0}}},
        /* in-o: only the "*" entry */
        {"in-o", P("o-none", ""), {{0}}},
        {"in-o", P("o-dflt", ",\"tenant\":\"anon\",\"class\":\"batch\""), {{0}}},
        {"in-o", P("o-badt", ",\"tenant\":\"acme\""), {{0}}},
        {"in-o", P("o-badc", ",\"class\":\"gold\""), {{0}}},
        /* the deferral topic: judged as the topic named in __spillway.deferred.from */
        {"def-c", P("d-none", ""), {{FROM, "in-p[0]@1"}, {0}}},
        {"def-c", P("d-badt", ",\"tenant\":\"initech\""), {{FROM, "in-p[0]@2"}, {0}}},
        {"def-c", P("d-forged", ",\"tenant\":\"acme\""), {{0}}},
    };
    enum { N = (int)(sizeof msgs / sizeof msgs[0]), NP = 7, NO = 4, ND = 3, NDLQ = 8 };
    produce(brokers, msgs, N);
    const char *kv[][2] = {
        {"claims", "in-p tenants=acme,globex classes=gold,standard tenant=acme class=standard;"
                   " * tenant=anon"},
        {"overload.deferral.topic", "def-c"}};
    worker_t *w = make_worker(brokers, "c", "in-p,in-o", kv, 2);
    if (!w) return;
    worker_stats_t st;
    run_until(w, N, &st);
    worker_free(w);
    CHECKF(st.results == N - NDLQ && st.dlq == NDLQ, "%llu results, %llu DLQ",
           (unsigned long long)st.results, (unsigned long long)st.dlq);

    rec_t res[N], dl[N];
    int nres = collect(brokers, "out-c", N - NDLQ, res), ndl = collect(brokers, "dlq-c", NDLQ, dl);
    CHECKF(nres == N - NDLQ && ndl == NDLQ, "%d results, %d DLQ", nres, ndl);
    check_served(res, nres, "p-ok", "acme", "gold");
    check_served(res, nres, "p-none", "acme", "standard");
    check_served(res, nres, "p-hok", "globex", "gold");
    check_served(res, nres, "o-none", "anon", "batch");
    check_served(res, nres, "o-dflt", "anon", "batch");
    check_served(res, nres, "d-none", "acme", "standard");
    check_refused(dl, ndl, "p-badt", "in-p", "tenant_not_allowed", "initech");
    check_refused(dl, ndl, "p-badc", "in-p", "class_not_allowed", "batch");
    check_refused(dl, ndl, "p-hbadt", "in-p", "tenant_not_allowed", "initech");
    check_refused(dl, ndl, "p-hbadc", "in-p", "class_not_allowed", "batch");
    check_refused(dl, ndl, "o-badt", "in-o", "tenant_not_allowed", "acme");
    check_refused(dl, ndl, "o-badc", "in-o", "class_not_allowed", "gold");
    check_refused(dl, ndl, "d-badt", "def-c", "tenant_not_allowed", "initech");
    check_refused(dl, ndl, "d-forged", "def-c", "tenant_not_allowed", "acme");
    /* dead letters are committed like results: every offset, nothing left behind */
    CHECK(committed(brokers, "g-c", "in-p") == NP);
    CHECK(committed(brokers, "g-c", "in-o") == NO);
    CHECK(committed(brokers, "g-c", "def-c") == ND);
    free_recs(res, nres);
    free_recs(dl, ndl);
}

/* No claims key: a request names its tenant and class unchecked. */
static void test_unchecked(const char *brokers)
{
    const msg_t msgs[] = {
        {"in-u", P("u-json", ",\"tenant\":\"initech\",\"class\":\"gold\""), {{0}}},
        {"in-u", P("u-hdr", ""), {{"tenant", "acme"}, {"class", "standard"}}},
        {"in-u", P("u-none", ""), {{0}}},
    };
    produce(brokers, msgs, 3);
    worker_t *w = make_worker(brokers, "u", "in-u", NULL, 0);
    if (!w) return;
    worker_stats_t st;
    run_until(w, 3, &st);
    worker_free(w);
    CHECK(st.results == 3 && st.dlq == 0);
    rec_t res[3];
    int nres = collect(brokers, "out-u", 3, res);
    CHECK(nres == 3);
    check_served(res, nres, "u-json", "initech", "gold");
    check_served(res, nres, "u-hdr", "acme", "standard");
    check_served(res, nres, "u-none", NULL, "batch");
    free_recs(res, nres);
}

int main(void)
{
    if (access(MODEL, R_OK)) {
        fprintf(stderr, "skip: %s not found\n", MODEL);
        return 77;
    }
    rd_kafka_t *mk = client(RD_KAFKA_PRODUCER, NULL, NULL);
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(mk, 1);
    CHECK(mc != NULL);
    const char *topics[] = {"in-p", "in-o", "def-c", "out-c", "dlq-c", "in-u", "out-u", "dlq-u"};
    for (size_t i = 0; i < sizeof topics / sizeof topics[0]; i++)
        rd_kafka_mock_topic_create(mc, topics[i], 1, 1);
    char *brokers = strdup(rd_kafka_mock_cluster_bootstraps(mc));
    test_claims(brokers);
    test_unchecked(brokers);
    free(brokers);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(mk);
    return check_exit();
}
