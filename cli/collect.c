/* cli/collect.c: `spillway collect -b BROKERS -t TOPIC (--ids FILE | --count N) [-o FILE]
 * [--openai] [--timeout S]`: reads results (read_committed, from the beginning, a throwaway
 * consumer group, nothing committed) until every wanted id is in or the timeout passes. Results
 * are de-duplicated by id (at-least-once delivery may repeat one). Output: the result lines, or
 * OpenAI Batch output lines with --openai (chat.completion bodies; an expired result is a
 * batch_expired error line; `spillway batch` writes both files in full). Exit 0 when all
 * arrived, 1 on timeout. */
#include <getopt.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <search.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common/clock.h"
#include "consumer/openai_batch.h"

static int cmp_str(const void *a, const void *b) { return strcmp(a, b); }
static int cmp_pstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One OpenAI Batch output line for result o (new reference; consumer/openai_batch.h shapes): a
 * chat.completion, or a batch_expired error line for an expired result. */
static json_t *to_openai(json_t *o, long n)
{
    char rid[32];
    snprintf(rid, sizeof rid, "batch_req_%ld", n);
    const char *id = json_string_value(json_object_get(o, "id"));
    const char *fin = json_string_value(json_object_get(o, "finish_reason"));
    if (fin && !strcmp(fin, "expired"))
        return oai_error_line(rid, id, 0, NULL, "batch_expired", NULL,
                              "This request could not be executed before its deadline passed.");
    oai_line_t l;
    memset(&l, 0, sizeof l);
    l.kind = OAI_CHAT;
    l.chat_top = -1;
    l.completion_lp = -1;
    l.custom_id = (char *)(uintptr_t)id; /* borrowed: l is not freed */
    return oai_output_line(&l, rid, o, (long long)time(NULL));
}

int cli_collect(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"brokers", required_argument, 0, 'b'}, {"topic", required_argument, 0, 't'},
        {"ids", required_argument, 0, 'i'},     {"count", required_argument, 0, 'n'},
        {"output", required_argument, 0, 'o'},  {"openai", no_argument, 0, 'A'},
        {"timeout", required_argument, 0, 'T'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *brokers = NULL, *topic = NULL, *ids_path = NULL, *out_path = NULL;
    long count = 0, timeout = 300;
    int openai = 0, opt;
    char err[512];
    optind = 0;
    while ((opt = getopt_long(argc, argv, "b:t:i:n:o:T:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'b': brokers = optarg; break;
        case 't': topic = optarg; break;
        case 'i': ids_path = optarg; break;
        case 'n':
            if (cli_parse_int("--count", optarg, 1, 1L << 40, &count)) return 2;
            break;
        case 'o': out_path = optarg; break;
        case 'A': openai = 1; break;
        case 'T':
            if (cli_parse_int("--timeout", optarg, 1, 1L << 30, &timeout)) return 2;
            break;
        case 'h':
            printf("usage: spillway collect -b BROKERS -t TOPIC (--ids FILE | --count N) [-o FILE] [--openai] [--timeout S]\n");
            return 0;
        default: return 2;
        }
    }
    if (!brokers || !topic || (!ids_path == !count) || optind < argc) {
        fprintf(stderr, "usage: spillway collect -b BROKERS -t TOPIC (--ids FILE | --count N) [-o FILE] [--openai] [--timeout S]\n");
        return 2;
    }
    /* wanted ids: sorted array (bsearch) with a seen flag each */
    char **ids = NULL;
    unsigned char *seen = NULL;
    size_t n_ids = 0, cap_ids = 0;
    void *seen_tree = NULL; /* --count: ids seen so far (tsearch) */
    int rc = 1;
    FILE *out = stdout;
    rd_kafka_t *rk = NULL;
    if (ids_path) {
        FILE *f = fopen(ids_path, "r");
        if (!f) {
            perror(ids_path);
            return 1;
        }
        char *line = NULL;
        size_t lc = 0;
        ssize_t len;
        while ((len = getline(&line, &lc, f)) > 0) {
            while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
            if (!len) continue;
            if (n_ids == cap_ids) {
                cap_ids = cap_ids ? cap_ids * 2 : 1024;
                ids = realloc(ids, sizeof *ids * cap_ids);
            }
            ids[n_ids++] = strdup(line);
        }
        free(line);
        fclose(f);
        qsort(ids, n_ids, sizeof *ids, cmp_pstr);
        seen = calloc(n_ids ? n_ids : 1, 1);
        count = (long)n_ids;
    }
    if (out_path && !(out = fopen(out_path, "w"))) {
        perror(out_path);
        goto done;
    }
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char group[64];
    snprintf(group, sizeof group, "spillway-collect-%d-%ld", (int)getpid(), (long)time(NULL));
    const char *props[][2] = {{"bootstrap.servers", brokers}, {"group.id", group},
                              {"isolation.level", "read_committed"}, {"auto.offset.reset", "earliest"},
                              {"enable.auto.commit", "false"}, {"enable.partition.eof", "false"}};
    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++)
        rd_kafka_conf_set(conf, props[i][0], props[i][1], err, sizeof err);
    rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "spillway collect: %s\n", err);
        goto done;
    }
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(rk, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    long got = 0, dups = 0, other = 0;
    int tty = isatty(2);
    double t0 = sw_mono_s(), end = t0 + (double)timeout, last = 0;
    while (got < count && sw_mono_s() < end) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (m && !m->err) {
            json_t *o = json_loadb(m->payload, m->len, 0, NULL);
            const char *id = json_string_value(json_object_get(o, "id"));
            int fresh = 0;
            if (id && ids) {
                size_t lo = 0, hi = n_ids;
                while (lo < hi) {
                    size_t mid = (lo + hi) / 2;
                    if (strcmp(ids[mid], id) < 0) lo = mid + 1;
                    else hi = mid;
                }
                if (lo < n_ids && !strcmp(ids[lo], id)) {
                    if (!seen[lo]) fresh = seen[lo] = 1;
                    else dups++;
                } else {
                    other++;
                }
            } else if (id) {
                char *dup = strdup(id);
                char **node = tsearch(dup, &seen_tree, cmp_str);
                if (node && *node == dup) fresh = 1;
                else {
                    free(dup);
                    dups++;
                }
            }
            if (fresh) {
                got++;
                if (openai) {
                    json_t *x = to_openai(o, got);
                    char *s = json_dumps(x, JSON_COMPACT);
                    fprintf(out, "%s\n", s);
                    free(s);
                    json_decref(x);
                } else {
                    fprintf(out, "%.*s\n", (int)m->len, (const char *)m->payload);
                }
            }
            json_decref(o);
        }
        if (m) rd_kafka_message_destroy(m);
        double t = sw_mono_s();
        if (tty && t - last > 0.2) {
            last = t;
            fprintf(stderr, "\r%ld/%ld results  %.0f/s   ", got, count, (double)got / (t - t0 + 1e-9));
        }
    }
    if (tty) fputc('\n', stderr);
    fprintf(stderr, "collected %ld/%ld result(s) from %s in %.2fs (%ld duplicate(s) skipped, %ld other)\n",
            got, count, topic, sw_mono_s() - t0, dups, other);
    rc = got >= count ? 0 : 1;
done:
    if (rk) {
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
    }
    if (out && out != stdout) fclose(out);
    for (size_t i = 0; i < n_ids; i++) free(ids[i]);
    free(ids);
    free(seen);
    tdestroy(seen_tree, free);
    return rc;
}
