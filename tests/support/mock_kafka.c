/* tests/support/mock_kafka.c: see mock_kafka.h. */
#include "tests/support/mock_kafka.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int64_t tk_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int tk_free_port(void)
{
    unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)tk_now_ms();
    for (int i = 0; i < 200; i++) {
        seed = seed * 1103515245u + 12345u;
        int port = 20000 + (int)((seed >> 8) % 12768);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) return -1;
        struct sockaddr_in sa;
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sa.sin_port = htons((uint16_t)port);
        int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        if (ok) return port;
    }
    return -1;
}

rd_kafka_mock_cluster_t *tk_mock_cluster(int nbrokers, const char *topic, int nparts,
                                         rd_kafka_t **mk)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    *mk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err); /* owns conf on success */
    if (!*mk) {
        fprintf(stderr, "mock cluster handle: %s\n", err);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(*mk, nbrokers);
    if (mc && rd_kafka_mock_topic_create(mc, topic, nparts, 1) == 0) return mc;
    fprintf(stderr, "mock cluster: cannot create it or its topic %s\n", topic);
    if (mc) rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(*mk);
    *mk = NULL;
    return NULL;
}

rd_kafka_t *tk_client(rd_kafka_type_t type, const char *brokers, const char *group,
                      const char *isolation)
{
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (brokers) rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    if (group) {
        rd_kafka_conf_set(conf, "group.id", group, err, sizeof err);
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
    }
    if (isolation) rd_kafka_conf_set(conf, "isolation.level", isolation, err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(type, conf, err, sizeof err); /* takes conf on success */
    if (!rk) {
        fprintf(stderr, "rd_kafka_new: %s\n", err);
        rd_kafka_conf_destroy(conf);
    }
    return rk;
}

static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    if (m->err) (*(int *)opaque)++;
}

int tk_produce(const char *brokers, const tk_msg_t *msgs, int n)
{
    char err[256];
    int failed = 0;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    rd_kafka_conf_set_dr_msg_cb(conf, on_dr);
    rd_kafka_conf_set_opaque(conf, &failed);
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!p) {
        fprintf(stderr, "rd_kafka_new: %s\n", err);
        rd_kafka_conf_destroy(conf);
        return n;
    }
    for (int i = 0; i < n; i++) {
        const tk_msg_t *m = &msgs[i];
        size_t len = m->len ? m->len : strlen(m->value);
        rd_kafka_headers_t *h = rd_kafka_headers_new(2);
        for (int k = 0; k < 2; k++)
            if (m->h[k][0]) rd_kafka_header_add(h, m->h[k][0], -1, m->h[k][1], -1);
        /* h is owned by the message once producev succeeds */
        rd_kafka_resp_err_t e = rd_kafka_producev(
            p, RD_KAFKA_V_TOPIC(m->topic), RD_KAFKA_V_PARTITION(m->partition),
            RD_KAFKA_V_KEY(m->key, m->key ? strlen(m->key) : 0),
            RD_KAFKA_V_VALUE((void *)m->value, len), RD_KAFKA_V_HEADERS(h),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        if (e) {
            rd_kafka_headers_destroy(h);
            failed++;
        }
    }
    if (rd_kafka_flush(p, 10000)) failed = n;
    rd_kafka_destroy(p);
    return failed;
}

int tk_produce_values(const char *brokers, const char *topic, const char *const *vals,
                      const size_t *lens, int n, int nparts, int keyed)
{
    tk_msg_t *m = calloc((size_t)(n > 0 ? n : 1), sizeof *m);
    char (*keys)[24] = calloc((size_t)(n > 0 ? n : 1), sizeof *keys);
    int failed = n;
    if (!m || !keys) goto out;
    for (int i = 0; i < n; i++) {
        snprintf(keys[i], sizeof keys[i], "k%d", i);
        m[i] = (tk_msg_t){.topic = topic, .value = vals[i], .len = lens ? lens[i] : 0,
                          .key = keyed ? keys[i] : NULL, .partition = i % nparts};
    }
    failed = tk_produce(brokers, m, n);
out:
    free(m);
    free(keys);
    return failed;
}

static void header_copy(rd_kafka_headers_t *h, const char *name, char *dst, size_t cap)
{
    const void *v;
    size_t vl;
    if (!rd_kafka_header_get_last(h, name, &v, &vl))
        snprintf(dst, cap, "%.*s", (int)vl, v ? (const char *)v : "");
}

int tk_collect(const char *brokers, const char *topic, int nparts, int want, int timeout_ms,
               tk_rec_t *out, int cap)
{
    rd_kafka_t *c = tk_client(RD_KAFKA_CONSUMER, brokers, "collector", "read_committed");
    if (!c) return 0;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(nparts);
    for (int p = 0; p < nparts; p++)
        rd_kafka_topic_partition_list_add(l, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(c, l);
    rd_kafka_topic_partition_list_destroy(l);
    int n = 0;
    for (int64_t end = tk_now_ms() + timeout_ms; n < want && tk_now_ms() < end;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) continue;
        if (!m->err && n < cap) {
            tk_rec_t *r = &out[n++];
            memset(r, 0, sizeof *r);
            r->value = malloc(m->len + 1);
            if (r->value) {
                if (m->len) memcpy(r->value, m->payload, m->len);
                r->value[m->len] = 0;
            }
            r->len = m->len;
            r->json = json_loadb(m->payload, m->len, 0, NULL);
            snprintf(r->key, sizeof r->key, "%.*s", (int)m->key_len,
                     m->key ? (const char *)m->key : "");
            r->partition = m->partition;
            r->offset = m->offset;
            r->src_partition = -1;
            rd_kafka_headers_t *h = NULL;
            if (!rd_kafka_message_headers(m, &h)) {
                char part[32] = "";
                header_copy(h, "__spillway.errors.code", r->code, sizeof r->code);
                header_copy(h, "__spillway.errors.message", r->message, sizeof r->message);
                header_copy(h, "__spillway.errors.topic", r->topic, sizeof r->topic);
                header_copy(h, "__spillway.errors.partition", part, sizeof part);
                if (part[0]) r->src_partition = atoi(part);
            }
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    return n;
}

void tk_recs_free(tk_rec_t *recs, int n)
{
    for (int i = 0; i < n; i++) {
        free(recs[i].value);
        json_decref(recs[i].json);
        recs[i].value = NULL;
        recs[i].json = NULL;
    }
}

static int has_id(const tk_rec_t *r, const char *id)
{
    const char *v = json_string_value(json_object_get(r->json, "id"));
    return v && !strcmp(v, id);
}

const tk_rec_t *tk_find(const tk_rec_t *recs, int n, const char *id)
{
    for (int i = 0; i < n; i++)
        if (has_id(&recs[i], id)) return &recs[i];
    return NULL;
}

json_t *tk_find_json(const tk_rec_t *recs, int n, const char *id)
{
    const tk_rec_t *r = tk_find(recs, n, id);
    return r ? r->json : NULL;
}

int tk_count_id(const tk_rec_t *recs, int n, const char *id)
{
    int hits = 0;
    for (int i = 0; i < n; i++) hits += has_id(&recs[i], id);
    return hits;
}

int64_t tk_committed(const char *brokers, const char *group, const char *topic, int nparts,
                     int64_t *per)
{
    rd_kafka_t *c = tk_client(RD_KAFKA_CONSUMER, brokers, group, NULL);
    if (!c) return -1000000;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(nparts);
    for (int p = 0; p < nparts; p++) rd_kafka_topic_partition_list_add(l, topic, p);
    int64_t sum = 0;
    if (rd_kafka_committed(c, l, 5000)) {
        sum = -1000000;
    } else {
        for (int p = 0; p < l->cnt; p++) {
            int64_t o = l->elems[p].offset >= 0 ? l->elems[p].offset : -1;
            if (per) per[p] = o;
            sum += o;
        }
    }
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(c);
    return sum;
}

static void *run_main(void *arg)
{
    tk_run_t *r = arg;
    r->rc = worker_run(r->w, NULL, r->err, sizeof r->err);
    return NULL;
}

void tk_run_start(tk_run_t *r, worker_t *w)
{
    memset(r, 0, sizeof *r);
    r->w = w;
    r->started = pthread_create(&r->th, NULL, run_main, r) == 0;
    if (!r->started) {
        r->rc = -1;
        snprintf(r->err, sizeof r->err, "pthread_create failed");
    }
}

int tk_run_join(tk_run_t *r)
{
    if (r->started) pthread_join(r->th, NULL);
    r->started = 0;
    return r->rc;
}

int tk_run_until(worker_t *w, uint64_t outputs, int timeout_ms, worker_stats_t *st,
                 char *errbuf, size_t errlen)
{
    tk_run_t run;
    tk_run_start(&run, w);
    int64_t end = tk_now_ms() + timeout_ms;
    do {
        usleep(50000);
        worker_stats(w, st);
    } while (st->results + st->dlq < outputs && tk_now_ms() < end);
    worker_log_stats(w);
    worker_stop(w);
    int rc = tk_run_join(&run);
    if (errbuf && errlen) snprintf(errbuf, errlen, "%s", run.err);
    worker_stats(w, st);
    return rc;
}

worker_t *tk_worker_new(const char *brokers, const char *suffix, const char *inputs,
                        const char *model, const char *id, const char *const (*kv)[2], int n,
                        char *err, size_t errlen)
{
    worker_config_t c;
    char in[64], out[64], dlq[64], group[64];
    snprintf(in, sizeof in, "in-%s", suffix);
    snprintf(out, sizeof out, "out-%s", suffix);
    snprintf(dlq, sizeof dlq, "dlq-%s", suffix);
    snprintf(group, sizeof group, "g-%s", suffix);
    worker_config_default(&c);
    const char *base[][2] = {{"brokers", brokers}, {"group.id", group},
                             {"input.topics", inputs ? inputs : in}, {"output.topic", out},
                             {"dlq.topic", dlq}, {"model", model}, {"threads", "1"},
                             {"kv.mem_mb", "16"}, {"commit.interval.ms", "100"},
                             {"worker.id", id},
                             {"log.level", getenv("WLOG") ? getenv("WLOG") : "warn"}};
    worker_t *w = NULL;
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        if (worker_config_set(&c, base[i][0], base[i][1], "test", err, errlen)) goto fail;
    for (int i = 0; i < n; i++)
        if (worker_config_set(&c, kv[i][0], kv[i][1], "test", err, errlen)) goto fail;
    if (worker_config_add_kafka(&c, "log_level=3", "test", err, errlen)) goto fail;
    w = worker_new(&c, err, errlen); /* copies what it keeps of c */
fail:
    worker_config_free(&c);
    return w;
}
