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
#include "tests/support/mock_kafka.h"
#include "worker/worker.h"

#define MODEL SPILLWAY_MODELS "/stories260K.gguf"

/* A worker of group g-SUFFIX on inputs `inputs`, results out-SUFFIX, dead letters dlq-SUFFIX,
 * classes gold / standard / batch (no ttft_ms: no overload step runs), plus kv[0..n). */
static worker_t *make_worker(const char *brokers, const char *suffix, const char *inputs,
                             const char *const (*kv)[2], int n)
{
    enum { MAX_KV = 16 };
    const char *all[2 + MAX_KV][2] = {
        {"classes", "gold:priority=100,standard:priority=50,batch:priority=0"},
        {"class.default", "batch"}};
    CHECK(n <= MAX_KV);
    for (int i = 0; i < n && i < MAX_KV; i++) all[2 + i][0] = kv[i][0], all[2 + i][1] = kv[i][1];
    char err[512];
    worker_t *w = tk_worker_new(brokers, suffix, inputs, MODEL, "wc", (const char *const (*)[2])all,
                                2 + (n < MAX_KV ? n : MAX_KV), err, sizeof err);
    CHECKF(w != NULL, "%s", err);
    return w;
}

/* Runs w until outputs results + DLQ records are durable, then stops it (its drain commits). */
static void run_until(worker_t *w, uint64_t outputs, worker_stats_t *st)
{
    char err[512];
    CHECKF(tk_run_until(w, outputs, 40000, st, err, sizeof err) == 0, "%s", err);
}

/* A result of id with this tenant (NULL = no tenant field) and class. */
static void check_served(const tk_rec_t *res, int n, const char *id, const char *tenant,
                         const char *cls)
{
    const tk_rec_t *r = tk_find(res, n, id);
    CHECKF(r != NULL, "no result for %s", id);
    if (!r) return;
    const char *t = json_string_value(json_object_get(r->json, "tenant"));
    const char *c = json_string_value(json_object_get(r->json, "class"));
    CHECKF(tenant ? t && !strcmp(t, tenant) : t == NULL, "%s: tenant %s, want %s", id,
           t ? t : "(none)", tenant ? tenant : "(none)");
    CHECKF(c && !strcmp(c, cls), "%s: class %s, want %s", id, c ? c : "(none)", cls);
}

/* A dead letter of id from topic with code, its message naming the refused claim. */
static void check_refused(const tk_rec_t *dl, int n, const char *id, const char *topic,
                          const char *code, const char *claim)
{
    const tk_rec_t *r = tk_find(dl, n, id);
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
    const tk_msg_t msgs[] = {
        /* in-p: its own entry */
        {.topic = "in-p", .value = P("p-ok", ",\"tenant\":\"acme\",\"class\":\"gold\"")},
        {.topic = "in-p", .value = P("p-none", "")},
        {.topic = "in-p", .value = P("p-badt", ",\"tenant\":\"initech\"")},
        {.topic = "in-p", .value = P("p-badc", ",\"class\":\"batch\"")},
        {.topic = "in-p", .value = P("p-hok", ""), .h = {{"tenant", "globex"}, {"class", "gold"}}},
        {.topic = "in-p", .value = P("p-hbadt", ""), .h = {{"tenant", "initech"}, {0}}},
        {.topic = "in-p", .value = P("p-hbadc", ""), .h = {{"class", "batch"}, {0}}},
        /* in-o: only the "*" entry */
        {.topic = "in-o", .value = P("o-none", "")},
        {.topic = "in-o", .value = P("o-dflt", ",\"tenant\":\"anon\",\"class\":\"batch\"")},
        {.topic = "in-o", .value = P("o-badt", ",\"tenant\":\"acme\"")},
        {.topic = "in-o", .value = P("o-badc", ",\"class\":\"gold\"")},
        /* the deferral topic: judged as the topic named in __spillway.deferred.from */
        {.topic = "def-c", .value = P("d-none", ""), .h = {{FROM, "in-p[0]@1"}, {0}}},
        {.topic = "def-c",
         .value = P("d-badt", ",\"tenant\":\"initech\""), .h = {{FROM, "in-p[0]@2"}, {0}}},
        {.topic = "def-c", .value = P("d-forged", ",\"tenant\":\"acme\"")},
    };
    enum { N = (int)(sizeof msgs / sizeof msgs[0]), NP = 7, NO = 4, ND = 3, NDLQ = 8 };
    CHECK(tk_produce(brokers, msgs, N) == 0);
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

    tk_rec_t res[N], dl[N];
    int nres = tk_collect(brokers, "out-c", 1, N - NDLQ, 30000, res, N),
        ndl = tk_collect(brokers, "dlq-c", 1, NDLQ, 30000, dl, N);
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
    CHECK(tk_committed(brokers, "g-c", "in-p", 1, NULL) == NP);
    CHECK(tk_committed(brokers, "g-c", "in-o", 1, NULL) == NO);
    CHECK(tk_committed(brokers, "g-c", "def-c", 1, NULL) == ND);
    tk_recs_free(res, nres);
    tk_recs_free(dl, ndl);
}

/* No claims key: a request names its tenant and class unchecked. */
static void test_unchecked(const char *brokers)
{
    const tk_msg_t msgs[] = {
        {.topic = "in-u", .value = P("u-json", ",\"tenant\":\"initech\",\"class\":\"gold\"")},
        {.topic = "in-u",
         .value = P("u-hdr", ""), .h = {{"tenant", "acme"}, {"class", "standard"}}},
        {.topic = "in-u", .value = P("u-none", "")},
    };
    CHECK(tk_produce(brokers, msgs, 3) == 0);
    worker_t *w = make_worker(brokers, "u", "in-u", NULL, 0);
    if (!w) return;
    worker_stats_t st;
    run_until(w, 3, &st);
    worker_free(w);
    CHECK(st.results == 3 && st.dlq == 0);
    tk_rec_t res[3];
    int nres = tk_collect(brokers, "out-u", 1, 3, 30000, res, 3);
    CHECK(nres == 3);
    check_served(res, nres, "u-json", "initech", "gold");
    check_served(res, nres, "u-hdr", "acme", "standard");
    check_served(res, nres, "u-none", NULL, "batch");
    tk_recs_free(res, nres);
}

int main(void)
{
    if (access(MODEL, R_OK)) {
        fprintf(stderr, "skip: %s not found\n", MODEL);
        return 77;
    }
    rd_kafka_t *mk = tk_client(RD_KAFKA_PRODUCER, NULL, NULL, NULL);
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
