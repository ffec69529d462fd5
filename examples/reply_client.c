/* examples/reply_client.c: request-reply through spillway, as a waiting service would do it.
 *
 *   spillway-reply-client -b BROKERS -t PROMPTS -r REPLIES -p "Once upon a time" [options]
 *
 * 1. Reads the end offset of every partition of the reply topic and assigns them from there
 *    (no consumer group: a reply produced from now on cannot be missed, and nothing older is
 *    read). Done before the request is sent.
 * 2. Produces one request to the prompt topic with `reply_to` and a fresh `correlation_id`
 *    (in the JSON, or with --headers as the record headers `reply_to` and `correlation_id`).
 * 3. Reads the reply topic (isolation.level=read_committed, so an exactly-once worker's
 *    aborted transactions are never seen) until a record whose `correlation_id` header equals
 *    ours arrives, and prints its value (the result JSON) on stdout.
 *
 * Exit status: 0 reply printed, 2 no reply within --timeout-ms, 1 any other error.
 * Options: -i ID (default: the correlation id), -c CORRELATION_ID (default: pid-time-random),
 *          -n MAX_TOKENS (16), --temperature T (0), --timeout-ms MS (30000), --headers,
 *          -X librdkafka.property=value (both clients).
 * Uses librdkafka and jansson only; one thread. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#define MAX_PROPS 32

typedef struct {
    const char *brokers, *topic, *reply_topic, *prompt, *id, *corr;
    int max_tokens;
    double temperature;
    int timeout_ms;
    int use_headers;
    const char *prop_k[MAX_PROPS], *prop_v[MAX_PROPS];
    int n_props;
} opts_t;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: spillway-reply-client -b BROKERS -t PROMPT_TOPIC -r REPLY_TOPIC -p PROMPT\n"
            "         [-i ID] [-c CORRELATION_ID] [-n MAX_TOKENS] [--temperature T]\n"
            "         [--timeout-ms MS] [--headers] [-X prop=value]...\n");
}

/* A conf with bootstrap.servers and the -X properties. NULL + message on stderr. */
static rd_kafka_conf_t *make_conf(const opts_t *o)
{
    char e[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", o->brokers, e, sizeof e)) goto fail;
    for (int i = 0; i < o->n_props; i++)
        if (rd_kafka_conf_set(conf, o->prop_k[i], o->prop_v[i], e, sizeof e)) goto fail;
    return conf;
fail:
    fprintf(stderr, "reply-client: %s\n", e);
    rd_kafka_conf_destroy(conf);
    return NULL;
}

/* Assigns every partition of the reply topic from its current end. 0 or -1. */
static int assign_from_end(rd_kafka_t *c, const char *topic, int timeout_ms)
{
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(c, topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(c, 0, rkt, &md, timeout_ms);
    rd_kafka_topic_destroy(rkt);
    if (err || md->topic_cnt != 1 || md->topics[0].err || md->topics[0].partition_cnt == 0) {
        fprintf(stderr, "reply-client: reply topic %s: %s\n", topic,
                rd_kafka_err2str(err ? err : md->topic_cnt == 1 && md->topics[0].err
                                                 ? md->topics[0].err
                                                 : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
        if (md) rd_kafka_metadata_destroy(md);
        return -1;
    }
    int n = md->topics[0].partition_cnt;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++) {
        int32_t p = md->topics[0].partitions[i].id;
        int64_t lo, hi;
        err = rd_kafka_query_watermark_offsets(c, topic, p, &lo, &hi, timeout_ms);
        if (err) {
            fprintf(stderr, "reply-client: end offset of %s[%d]: %s\n", topic, (int)p,
                    rd_kafka_err2str(err));
            rd_kafka_topic_partition_list_destroy(l);
            rd_kafka_metadata_destroy(md);
            return -1;
        }
        rd_kafka_topic_partition_list_add(l, topic, p)->offset = hi;
    }
    rd_kafka_metadata_destroy(md);
    err = rd_kafka_assign(c, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        fprintf(stderr, "reply-client: assign: %s\n", rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

/* Produces the request and waits until it is acknowledged. 0 or -1. */
static int send_request(const opts_t *o)
{
    char e[512];
    rd_kafka_conf_t *conf = make_conf(o);
    if (!conf) return -1;
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, conf, e, sizeof e);
    if (!p) {
        fprintf(stderr, "reply-client: producer: %s\n", e);
        return -1;
    }
    json_t *req = json_pack("{s:s, s:s, s:i, s:f}", "id", o->id, "prompt", o->prompt,
                            "max_tokens", o->max_tokens, "temperature", o->temperature);
    rd_kafka_headers_t *h = rd_kafka_headers_new(2);
    if (o->use_headers) {
        rd_kafka_header_add(h, "reply_to", -1, o->reply_topic, -1);
        rd_kafka_header_add(h, "correlation_id", -1, o->corr, -1);
    } else {
        json_object_set_new(req, "reply_to", json_string(o->reply_topic));
        json_object_set_new(req, "correlation_id", json_string(o->corr));
    }
    char *value = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    rd_kafka_resp_err_t err = rd_kafka_producev(
        p, RD_KAFKA_V_TOPIC(o->topic), RD_KAFKA_V_KEY(o->id, strlen(o->id)),
        RD_KAFKA_V_VALUE(value, strlen(value)), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
    free(value);
    if (err) {
        rd_kafka_headers_destroy(h); /* not taken on error */
        fprintf(stderr, "reply-client: produce: %s\n", rd_kafka_err2str(err));
        rd_kafka_destroy(p);
        return -1;
    }
    int rc = rd_kafka_flush(p, o->timeout_ms) ? -1 : 0;
    if (rc) fprintf(stderr, "reply-client: the request was not acknowledged in time\n");
    rd_kafka_destroy(p);
    return rc;
}

/* 1 when m carries header correlation_id == corr. */
static int matches(const rd_kafka_message_t *m, const char *corr)
{
    rd_kafka_headers_t *h = NULL;
    const void *v;
    size_t n;
    if (rd_kafka_message_headers(m, &h) || !h) return 0;
    if (rd_kafka_header_get_last(h, "correlation_id", &v, &n)) return 0;
    return n == strlen(corr) && memcmp(v, corr, n) == 0;
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "-b") && v) o->brokers = v;
        else if (!strcmp(a, "-t") && v) o->topic = v;
        else if (!strcmp(a, "-r") && v) o->reply_topic = v;
        else if (!strcmp(a, "-p") && v) o->prompt = v;
        else if (!strcmp(a, "-i") && v) o->id = v;
        else if (!strcmp(a, "-c") && v) o->corr = v;
        else if (!strcmp(a, "-n") && v) o->max_tokens = atoi(v);
        else if (!strcmp(a, "--temperature") && v) o->temperature = atof(v);
        else if (!strcmp(a, "--timeout-ms") && v) o->timeout_ms = atoi(v);
        else if (!strcmp(a, "-X") && v) {
            char *eq = strchr(v, '=');
            if (!eq || o->n_props == MAX_PROPS) return -1;
            *eq = 0; /* argv is writable */
            o->prop_k[o->n_props] = v;
            o->prop_v[o->n_props++] = eq + 1;
        } else if (!strcmp(a, "--headers")) {
            o->use_headers = 1;
            takes = 0;
        } else {
            return -1;
        }
        i += takes;
    }
    return o->brokers && o->topic && o->reply_topic && o->prompt && o->max_tokens > 0 &&
                   o->timeout_ms > 0
               ? 0
               : -1;
}

int main(int argc, char **argv)
{
    opts_t o = {.max_tokens = 16, .timeout_ms = 30000};
    if (parse_args(argc, argv, &o)) {
        usage();
        return 1;
    }
    char corr[96];
    if (!o.corr) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        srand((unsigned)(ts.tv_nsec ^ getpid()));
        snprintf(corr, sizeof corr, "%d-%lld-%08x", (int)getpid(), (long long)ts.tv_sec,
                 (unsigned)rand());
        o.corr = corr;
    }
    if (!o.id) o.id = o.corr;

    char e[512];
    char group[128];
    snprintf(group, sizeof group, "spillway-reply-client-%d", (int)getpid());
    rd_kafka_conf_t *conf = make_conf(&o);
    if (!conf) return 1;
    /* group.id only because librdkafka wants one for a consumer: nothing is committed */
    if (rd_kafka_conf_set(conf, "group.id", group, e, sizeof e) ||
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", e, sizeof e) ||
        rd_kafka_conf_set(conf, "isolation.level", "read_committed", e, sizeof e)) {
        fprintf(stderr, "reply-client: %s\n", e);
        rd_kafka_conf_destroy(conf);
        return 1;
    }
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, e, sizeof e);
    if (!c) {
        fprintf(stderr, "reply-client: consumer: %s\n", e);
        return 1;
    }
    int64_t t0 = mono_ms();
    int status = 1;
    if (assign_from_end(c, o.reply_topic, o.timeout_ms) || send_request(&o)) goto done;
    status = 2;
    while (mono_ms() - t0 < o.timeout_ms) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) continue;
        if (m->err) {
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                fprintf(stderr, "reply-client: %s\n", rd_kafka_message_errstr(m));
        } else if (matches(m, o.corr)) {
            fwrite(m->payload, 1, m->len, stdout);
            fputc('\n', stdout);
            fprintf(stderr, "reply-client: reply for %s in %lld ms\n", o.corr,
                    (long long)(mono_ms() - t0));
            status = 0;
        }
        rd_kafka_message_destroy(m);
        if (status == 0) break;
    }
    if (status == 2)
        fprintf(stderr, "reply-client: no reply for %s within %d ms\n", o.corr, o.timeout_ms);
done:
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    return status;
}
