/* tests/test_worker_lag_mock.c: the worker's /metrics serves consumer lag from a cache that the
 * lag thread refreshes off the scrape path (README, Metrics, health and logs), on librdkafka's
 * mock cluster with the stories260K model:
 *   - with metrics.lag_refresh_ms at one hour, spillway:consumer_lag appears for the 4 assigned
 *     partitions (the refresh the assignment triggers);
 *   - 50 scrapes after that make no refresh (spillway:consumer_lag_refreshes_total grows by at
 *     most the one refresh an assignment change may still have pending);
 *   - with every broker down, a scrape still answers with the cached lag of the 4 partitions
 *     (a scrape that asked the broker would have none to show). */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "tests/support/http_client.h"
#include "tests/support/mock_kafka.h"
#include "worker/worker.h"

#define MODEL SPILLWAY_MODELS "/stories260K.gguf"
#define NPARTS 4

/* GET /metrics from 127.0.0.1:port: the body (caller frees) or NULL. */
static char *scrape(int port)
{
    th_resp_t r;
    if (th_request(port, "GET", "/metrics", 10, &r)) return NULL;
    return r.body; /* ownership moves to the caller */
}

/* Lines that start with prefix. */
static int count_lines(const char *text, const char *prefix)
{
    int n = 0;
    size_t pl = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, prefix, pl)) n++;
    return n;
}

/* The value of the line that starts with prefix (the sample's name and labels), or -1. */
static double value_of(const char *text, const char *prefix)
{
    size_t pl = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, prefix, pl) && p[pl] == ' ') return strtod(p + pl + 1, NULL);
    return -1;
}

#define REFRESH_OK "spillway:consumer_lag_refreshes_total{outcome=\"ok\"}"
#define REFRESH_FAILED "spillway:consumer_lag_refreshes_total{outcome=\"failed\"}"
#define LAG "spillway:consumer_lag{"

static double refreshes(const char *m)
{
    return value_of(m, REFRESH_OK) + value_of(m, REFRESH_FAILED);
}

int main(void)
{
    if (access(MODEL, R_OK)) {
        fprintf(stderr, "skip: %s not found\n", MODEL);
        return 77;
    }
    char err[512], num[32];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    rd_kafka_t *mk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    CHECK(mk != NULL);
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(mk, 3);
    CHECK(mc != NULL);
    rd_kafka_mock_topic_create(mc, "lag.in", NPARTS, 1);
    rd_kafka_mock_topic_create(mc, "lag.out", 1, 1);
    rd_kafka_mock_topic_create(mc, "lag.dlq", 1, 1);
    int port = tk_free_port();
    CHECK(port > 0);

    worker_config_t c;
    worker_config_default(&c);
    const char *kv[][2] = {
        {"brokers", rd_kafka_mock_cluster_bootstraps(mc)},
        {"group.id", "lag-group"},
        {"input.topics", "lag.in"},
        {"output.topic", "lag.out"},
        {"dlq.topic", "lag.dlq"},
        {"model", MODEL},
        {"threads", "1"},
        {"kv.mem_mb", "16"},
        {"drain.timeout.ms", "2000"},
        {"worker.id", "lag-worker"},
        {"log.level", getenv("WLOG") ? getenv("WLOG") : "warn"},
        {"metrics.lag_refresh_ms", "3600000"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        CHECKF(!worker_config_set(&c, kv[i][0], kv[i][1], "test", err, sizeof err), "%s", err);
    snprintf(num, sizeof num, "%d", port);
    CHECKF(!worker_config_set(&c, "metrics.port", num, "test", err, sizeof err), "%s", err);
    worker_config_add_kafka(&c, "log_level=3", "test", err, sizeof err);
    worker_config_add_kafka(&c, "consumer.session.timeout.ms=6000", "test", err, sizeof err);
    worker_t *w = worker_new(&c, err, sizeof err);
    worker_config_free(&c);
    CHECKF(w != NULL, "%s", err);
    if (!w) return check_exit();
    tk_run_t run;
    tk_run_start(&run, w);

    /* the assignment, and the lag of its 4 partitions (awaited: 30 s is a bound on a stuck
     * group, not a speed) */
    char *m = NULL;
    int64_t end = tk_now_ms() + 30000;
    for (;;) {
        free(m);
        m = scrape(port);
        if (m && value_of(m, "spillway:partitions_assigned") == NPARTS &&
            count_lines(m, LAG) == NPARTS)
            break;
        if (tk_now_ms() > end) break;
        usleep(20000);
    }
    CHECKF(m && count_lines(m, LAG) == NPARTS, "consumer_lag series: %d, want %d",
           m ? count_lines(m, LAG) : -1, NPARTS);
    double r0 = m ? refreshes(m) : -1;
    CHECKF(r0 >= 1, "refreshes_total: %g", r0);
    free(m);
    m = NULL;

    /* scrapes make no refresh */
    double r1 = -1;
    for (int i = 0; i < 50; i++) {
        free(m);
        m = scrape(port);
    }
    if (m) r1 = refreshes(m);
    CHECKF(r1 >= r0 && r1 <= r0 + 1, "50 scrapes: refreshes %g -> %g", r0, r1);
    free(m);

    /* every broker down: the scrape serves the cache */
    for (int b = 1; b <= 3; b++) rd_kafka_mock_broker_set_down(mc, b);
    m = scrape(port);
    CHECKF(m && count_lines(m, LAG) == NPARTS, "brokers down: consumer_lag series %d, want %d",
           m ? count_lines(m, LAG) : -1, NPARTS);
    CHECK(m && value_of(m, "spillway:consumer_lag_age_seconds") >= 0);
    free(m);
    for (int b = 1; b <= 3; b++) rd_kafka_mock_broker_set_up(mc, b);

    worker_stop(w);
    tk_run_join(&run);
    CHECKF(run.rc == 0, "worker_run: %s", run.err);
    worker_free(w);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(mk);
    return check_exit();
}
