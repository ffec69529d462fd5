/* cli/produce.c: `spillway produce -b BROKERS -t TOPIC [FILE|-]`: sends prompt requests to Kafka.
 *
 * Input lines are spillway requests (JSONL, sent unchanged) or OpenAI Batch API lines
 * ({"custom_id", "method", "url", "body"}, converted by consumer/openai_batch.h with id =
 * custom_id; a line it refuses is reported, not sent, and makes the exit status 1). Each
 * message goes where --route says (cli/cli_route.h, producer/route.h): `affinity` (default) to
 * the partition consistent hashing with bounded load gives its routing key (`prefix_key`, or
 * the first --key-prefix bytes of its prompt), `bytes` keyed by a hash of those bytes for
 * Kafka's partitioner, `random` to a random partition. A line whose prefix_key is not a string
 * of 1..256 bytes is refused the same way. A progress line (count, rate, ETA) is shown on a
 * terminal, a summary at the end. */
#include <getopt.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cli_route.h"
#include "common/clock.h"
#include "consumer/json_text.h"
#include "consumer/openai_batch.h"

typedef struct {
    long delivered, failed;
} dr_count_t;

static void produce_usage(FILE *f)
{
    fprintf(f, "usage: spillway produce -b BROKERS -t TOPIC [--route MODE] [--key-prefix BYTES] "
               "[-X PROP=V] [FILE|-]\n");
    if (f == stdout) cli_route_help(f);
}

static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    dr_count_t *c = opaque;
    if (m->err) c->failed++;
    else c->delivered++;
}

int cli_produce(int argc, char **argv)
{
    static const struct option longopts[] = {{"brokers", required_argument, 0, 'b'},
                                             {"topic", required_argument, 0, 't'},
                                             CLI_ROUTE_LONGOPTS,
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *brokers = NULL, *topic = NULL;
    char err[512];
    cli_route_t route;
    if (cli_route_init(&route)) return 2;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    int opt;
    optind = 0;
    while ((opt = getopt_long(argc, argv, "b:t:k:X:h", longopts, NULL)) != -1) {
        int ro = cli_route_opt(&route, opt, optarg);
        if (ro < 0) goto usage_err;
        if (ro) continue;
        switch (opt) {
        case 'b': brokers = optarg; break;
        case 't': topic = optarg; break;
        case 'X': {
            char *eq = strchr(optarg, '=');
            if (!eq) goto usage_err;
            *eq = 0;
            if (rd_kafka_conf_set(conf, optarg, eq + 1, err, sizeof err)) {
                fprintf(stderr, "spillway produce: %s\n", err);
                goto usage_err;
            }
            break;
        }
        case 'h':
            produce_usage(stdout);
            rd_kafka_conf_destroy(conf);
            cli_route_free(&route);
            return 0;
        default: goto usage_err;
        }
    }
    if (!brokers || !topic || argc - optind > 1) goto usage_err;
    const char *path = optind < argc ? argv[optind] : "-";
    FILE *in = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!in) {
        perror(path);
        rd_kafka_conf_destroy(conf);
        cli_route_free(&route);
        return 1;
    }
    struct stat sb;
    long long total_bytes = in != stdin && !stat(path, &sb) ? (long long)sb.st_size : 0;
    dr_count_t dc = {0, 0};
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err);
    rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof err);
    rd_kafka_conf_set(conf, "linger.ms", "10", err, sizeof err);
    rd_kafka_conf_set_dr_msg_cb(conf, on_dr);
    rd_kafka_conf_set_opaque(conf, &dc);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk || cli_route_start(&route, rk, topic, 10000)) {
        if (!rk) fprintf(stderr, "spillway produce: %s\n", err);
        else rd_kafka_destroy(rk);
        if (in != stdin) fclose(in);
        cli_route_free(&route);
        return 1;
    }
    int tty = isatty(2);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long sent = 0, bad = 0, refused = 0, lineno = 0;
    long long bytes = 0;
    double t0 = sw_mono_s(), last = 0;
    while ((len = getline(&line, &cap, in)) > 0) {
        lineno++;
        bytes += len;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)len, 0, &je), *r = NULL;
        char key[32];
        const char *k = NULL;
        size_t klen = 0;
        char *val = line;
        size_t vlen = (size_t)len;
        char *owned = NULL;
        if (json_is_object(o) && json_object_get(o, "custom_id")) {
            oai_line_t ol;
            int crc = oai_line_convert(line, (size_t)len, NULL, &ol);
            if (crc == 0) {
                owned = ol.request; /* numbers in their shortest form: 0.8 stays 0.8 */
                ol.request = NULL;
                r = json_loads(owned, 0, NULL);
                val = owned;
                vlen = strlen(owned);
            }
            if (crc == -1)
                fprintf(stderr, "spillway produce: line %ld (custom_id %s) not sent: %s\n", lineno,
                        ol.custom_id ? ol.custom_id : "?", ol.err_msg);
            else if (crc == -2)
                fprintf(stderr, "spillway produce: line %ld not sent: out of memory\n", lineno);
            oai_line_free(&ol);
            if (crc) {
                refused++;
                json_decref(o);
                continue;
            }
        } else if (o) {
            r = json_incref(o);
        } else {
            fprintf(stderr, "spillway produce: line %ld is not JSON (%s); sent as is\n", lineno, je.text);
            bad++;
        }
        int32_t part;
        char rerr[128];
        if (cli_route_message(&route, r, key, sizeof key, &k, &klen, &part, rerr, sizeof rerr)) {
            fprintf(stderr, "spillway produce: line %ld not sent: %s\n", lineno, rerr);
            refused++;
            free(owned);
            json_decref(r);
            json_decref(o);
            continue;
        }
        for (;;) {
            rd_kafka_resp_err_t e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(part), RD_KAFKA_V_KEY(k, klen),
                RD_KAFKA_V_VALUE(val, vlen),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
            if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                rd_kafka_poll(rk, 50);
                continue;
            }
            if (e) {
                fprintf(stderr, "spillway produce: line %ld: %s\n", lineno, rd_kafka_err2str(e));
                dc.failed++;
            } else {
                sent++;
            }
            break;
        }
        free(owned);
        json_decref(r);
        json_decref(o);
        rd_kafka_poll(rk, 0);
        double t = sw_mono_s();
        if (tty && t - last > 0.2) {
            last = t;
            double rate = (double)sent / (t - t0 + 1e-9);
            if (total_bytes > 0 && bytes > 0) {
                double eta = (t - t0) * (double)(total_bytes - bytes) / (double)bytes;
                fprintf(stderr, "\r%ld sent  %.0f msg/s  %3.0f%%  ETA %.0fs   ", sent, rate,
                        100.0 * (double)bytes / (double)total_bytes, eta);
            } else {
                fprintf(stderr, "\r%ld sent  %.0f msg/s   ", sent, rate);
            }
        }
    }
    free(line);
    if (in != stdin) fclose(in);
    int flushed = rd_kafka_flush(rk, 60000) == 0;
    double secs = sw_mono_s() - t0;
    if (tty) fputc('\n', stderr);
    fprintf(stderr, "produced %ld message(s) to %s in %.2fs (%.0f msg/s): %ld delivered, %ld failed, "
            "%ld line(s) refused%s%s\n", sent, topic, secs, (double)sent / (secs + 1e-9),
            dc.delivered, dc.failed, refused, bad ? ", some lines not JSON" : "",
            flushed ? "" : ", flush timed out");
    if (route.mode != CLI_ROUTE_RANDOM)
        fprintf(stderr, "route %s over %d partition(s): keys from prefix_key %ld, prompt %ld, id "
                "%ld, none %ld\n", route.wc.route_mode, route.n_parts,
                route.by_source[ROUTE_KEY_PREFIX_KEY], route.by_source[ROUTE_KEY_PROMPT],
                route.by_source[ROUTE_KEY_ID], route.by_source[ROUTE_KEY_NONE]);
    rd_kafka_destroy(rk);
    cli_route_free(&route);
    return dc.failed || refused || !flushed ? 1 : 0;
usage_err:
    rd_kafka_conf_destroy(conf);
    cli_route_free(&route);
    produce_usage(stderr);
    return 2;
}
