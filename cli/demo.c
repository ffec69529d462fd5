/* cli/demo.c: `spillway demo`: the whole product with no server. Starts librdkafka's in-process
 * mock cluster, creates the topics, produces sample prompts (several sharing a prefix, one bad
 * message for the DLQ), runs a worker in-process, collects the results and prints them with a
 * summary (throughput, TTFT).
 *
 * Model: -m FILE, else stories260K.gguf from $SPILLWAY_MODELS, the repository's models/ or
 * ../shared/models (from the current directory or its parent), else a synthetic
 * `mkmodel --preset tiny` in a temp file. */
#include <getopt.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common/clock.h"
#include "tools/mkmodel.h"
#include "worker/worker.h"

typedef struct {
    worker_t *w;
    int rc;
    char err[512];
} demo_run_t;

static void *demo_worker(void *arg)
{
    demo_run_t *r = arg;
    r->rc = worker_run(r->w, NULL, r->err, sizeof r->err);
    return NULL;
}

static int find_model(char *out, size_t cap)
{
    const char *env = getenv("SPILLWAY_MODELS");
    /* the repository's models/ beside the build folder that holds this binary (build/spillway) */
    char exe_models[4200] = "";
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(exe_models, sizeof exe_models, "%s/../models", exe);
        }
    }
    /* $SPILLWAY_MODELS, the copy bundled in the repository (beside the binary's build folder, or
     * models/ under the current directory or its parent), then the shared test-model folder */
    const char *dirs[] = {env, exe_models[0] ? exe_models : NULL, "models", "../models",
                          "../shared/models", "../../shared/models"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i]) continue;
        snprintf(out, cap, "%s/stories260K.gguf", dirs[i]);
        if (!access(out, R_OK)) return 0;
    }
    return -1;
}

static const char *const PROMPTS[] = {
    "Once upon a time, there was a little girl named Lily. She",
    "Once upon a time, there was a little girl named Lily. Her mom",
    "Once upon a time, there was a little girl named Lily. One day",
    "Once upon a time, there was a little boy named Tom. He",
    "Tom and his dog went to the park. They",
    "The sun was shining and the birds",
    "Once upon a time, in a big forest, there lived a",
    "Sue had a red ball. She",
};

int cli_demo(int argc, char **argv)
{
    static const struct option longopts[] = {{"model", required_argument, 0, 'm'},
                                             {"requests", required_argument, 0, 'n'},
                                             {"max-tokens", required_argument, 0, 't'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    char model[1024] = "", tmpmodel[64] = "", err[512];
    long n = 32, max_tokens = 48;
    int opt;
    optind = 0;
    while ((opt = getopt_long(argc, argv, "m:n:t:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm': snprintf(model, sizeof model, "%s", optarg); break;
        case 'n':
            if (cli_parse_int("-n", optarg, 1, 100000, &n)) return 2;
            break;
        case 't':
            if (cli_parse_int("--max-tokens", optarg, 1, 4096, &max_tokens)) return 2;
            break;
        case 'h':
            printf("usage: spillway demo [-m MODEL] [-n REQUESTS] [--max-tokens N]\n");
            return 0;
        default: return 2;
        }
    }
    if (!*model && find_model(model, sizeof model)) {
        snprintf(tmpmodel, sizeof tmpmodel, "/tmp/spillway-demo-XXXXXX");
        int fd = mkstemp(tmpmodel);
        if (fd < 0) {
            perror("spillway demo: mkstemp");
            return 1;
        }
        close(fd);
        mkmodel_params_t p;
        mkmodel_preset("tiny", &p);
        if (mkmodel_write(&p, tmpmodel, err, sizeof err)) {
            fprintf(stderr, "spillway demo: mkmodel: %s\n", err);
            unlink(tmpmodel);
            return 1;
        }
        snprintf(model, sizeof model, "%s", tmpmodel);
        printf("stories260K not found: using a synthetic model (random weights, noisy text)\n");
    }

    int rc = 1;
    rd_kafka_t *mk = NULL, *prod = NULL, *coll = NULL;
    rd_kafka_mock_cluster_t *mc = NULL;
    worker_t *w = NULL;
    worker_config_t cfg;
    int have_cfg = 0;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    mk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!mk || !(mc = rd_kafka_mock_cluster_new(mk, 1))) {
        fprintf(stderr, "spillway demo: cannot start the mock cluster: %s\n", err);
        goto out;
    }
    const char *brokers = rd_kafka_mock_cluster_bootstraps(mc);
    rd_kafka_mock_topic_create(mc, "prompts", 4, 1);
    rd_kafka_mock_topic_create(mc, "results", 1, 1);
    rd_kafka_mock_topic_create(mc, "prompts.dlq", 1, 1);
    printf("mock Kafka cluster at %s; topics prompts (4 partitions), results, prompts.dlq\n", brokers);
    printf("model %s\n", model);

    /* produce: keyed by the prompt's first 24 bytes, so shared prefixes share a partition */
    conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    prod = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!prod) goto out;
    for (long i = 0; i < n; i++) {
        const char *p = PROMPTS[i % (long)(sizeof PROMPTS / sizeof PROMPTS[0])];
        json_t *o = json_pack("{s:s, s:s, s:i, s:f, s:I}", "id", "", "prompt", p, "max_tokens",
                              (int)max_tokens, "temperature", 0.8, "seed", (json_int_t)i);
        char id[32];
        snprintf(id, sizeof id, "req-%03ld", i);
        json_object_set_new(o, "id", json_string(id));
        char *v = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        rd_kafka_producev(prod, RD_KAFKA_V_TOPIC("prompts"), RD_KAFKA_V_KEY(p, strlen(p) < 24 ? strlen(p) : 24),
                          RD_KAFKA_V_VALUE(v, strlen(v)), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                          RD_KAFKA_V_END);
        free(v);
    }
    const char *bad = "{\"id\": \"bad-1\", \"max_tokens\": 5}"; /* no prompt: a dead letter */
    rd_kafka_producev(prod, RD_KAFKA_V_TOPIC("prompts"), RD_KAFKA_V_VALUE((void *)bad, strlen(bad)),
                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    rd_kafka_flush(prod, 10000);
    printf("produced %ld prompts and 1 bad message\n\n", n);

    if (worker_config_default(&cfg)) goto out;
    have_cfg = 1;
    const char *kv[][2] = {{"brokers", brokers}, {"model", model}, {"group.id", "spillway-demo"},
                           {"worker.id", "demo"}, {"commit.interval.ms", "200"},
                           {"log.level", "warn"}, {"kv.mem_mb", "64"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (worker_config_set(&cfg, kv[i][0], kv[i][1], "demo", err, sizeof err)) goto cfg_err;
    if (worker_config_add_kafka(&cfg, "log_level=3", "demo", err, sizeof err)) goto cfg_err;
    w = worker_new(&cfg, err, sizeof err);
    if (!w) goto cfg_err;
    demo_run_t run = {.w = w};
    pthread_t th;
    double t0 = sw_mono_s();
    pthread_create(&th, NULL, demo_worker, &run);

    conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", "spillway-demo-collect", err, sizeof err);
    rd_kafka_conf_set(conf, "isolation.level", "read_committed", err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    coll = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(2);
    rd_kafka_topic_partition_list_add(l, "results", 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_topic_partition_list_add(l, "prompts.dlq", 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(coll, l);
    rd_kafka_topic_partition_list_destroy(l);
    long got = 0, dlq = 0;
    double first = 0, deadline = sw_mono_s() + 120;
    while ((got < n || dlq < 1) && sw_mono_s() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(coll, 20);
        if (!first) {
            worker_stats_t s0;
            worker_stats(w, &s0);
            if (s0.consumed) first = sw_mono_s();
        }
        if (!m) continue;
        if (!m->err && !strcmp(rd_kafka_topic_name(m->rkt), "prompts.dlq")) {
            rd_kafka_headers_t *h;
            const void *cv = "?";
            size_t cl = 1;
            if (!rd_kafka_message_headers(m, &h)) rd_kafka_header_get_last(h, "__spillway.errors.code", &cv, &cl);
            printf("DLQ  %.*s  (reason: %.*s)\n", (int)m->len, (const char *)m->payload, (int)cl,
                   (const char *)cv);
            dlq++;
        } else if (!m->err) {
            json_t *o = json_loadb(m->payload, m->len, 0, NULL);
            char text[61];
            snprintf(text, sizeof text, "%s", json_string_value(json_object_get(o, "text")) ?
                     json_string_value(json_object_get(o, "text")) : "");
            for (char *c = text; *c; c++)
                if (*c == '\n' || *c == '\r' || *c == '\t') *c = ' ';
            printf("%-8s %-6s %s\n", json_string_value(json_object_get(o, "id")),
                   json_string_value(json_object_get(o, "finish_reason")), text);
            json_decref(o);
            got++;
        }
        rd_kafka_message_destroy(m);
    }
    double last = sw_mono_s(), secs = last - t0, busy = first ? last - first : 0;
    worker_stats_t st;
    worker_stats(w, &st);
    worker_stop(w);
    pthread_join(th, NULL);
    worker_stats(w, &st);
    printf("\n%ld/%ld results and %ld dead letter(s) in %.2f s (%.2f s from the first message "
           "consumed; the rest is the group join): %.1f requests/s, %.0f tokens/s generated; mean TTFT "
           "%.1f ms; prompt tokens %llu (%llu from the prefix cache)\n",
           got, n, dlq, secs, busy, (double)got / secs, (double)st.completion_tokens / secs,
           st.ttft_n ? st.ttft_ms_sum / (double)st.ttft_n : 0.0,
           (unsigned long long)st.prompt_tokens, (unsigned long long)st.cached_tokens);
    if (run.rc) fprintf(stderr, "spillway demo: worker: %s\n", run.err);
    rc = got == n && dlq == 1 && run.rc == 0 ? 0 : 1;
    goto out;
cfg_err:
    fprintf(stderr, "spillway demo: %s\n", err);
out:
    if (coll) {
        rd_kafka_consumer_close(coll);
        rd_kafka_destroy(coll);
    }
    worker_free(w);
    if (have_cfg) worker_config_free(&cfg);
    if (prod) rd_kafka_destroy(prod);
    if (mc) rd_kafka_mock_cluster_destroy(mc);
    if (mk) rd_kafka_destroy(mk);
    if (*tmpmodel) unlink(tmpmodel);
    return rc;
}
