/* cli/route.c: the --route modes of `spillway produce` and `spillway batch` (producer/route.h does
 * the routing; this file holds the flags, the topic's partition count and the Kafka key). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_route.h"

static const struct {
    int opt;
    const char *flag, *key;
} ROUTE_FLAGS[] = {
    {2001, "--route MODE", "route.mode"},
    {'k', "--key-prefix BYTES", "route.prefix_bytes"},
    {2002, "--route-eps EPS", "route.eps"},
    {2003, "--route-window N", "route.window"},
    {2004, "--route-vnodes N", "route.vnodes"},
};
#define N_ROUTE_FLAGS (sizeof ROUTE_FLAGS / sizeof ROUTE_FLAGS[0])

static int mode_of(const char *s)
{
    return !strcmp(s, "bytes") ? CLI_ROUTE_BYTES : !strcmp(s, "random") ? CLI_ROUTE_RANDOM
                                                                         : CLI_ROUTE_AFFINITY;
}

int cli_route_init(cli_route_t *r)
{
    char err[256];
    memset(r, 0, sizeof *r);
    if (worker_config_default(&r->wc)) {
        fprintf(stderr, "spillway: out of memory\n");
        return -1;
    }
    /* only the route.* keys are read from the environment: the others are the worker's */
    for (int i = 0; i < worker_config_n_keys(); i++) {
        const char *name = worker_config_key_name(i);
        if (strncmp(name, "route.", 6)) continue;
        char env[64];
        size_t j = 0;
        for (const char *p = "SPILLWAY_"; *p; p++) env[j++] = *p;
        for (const char *p = name; *p && j + 1 < sizeof env; p++)
            env[j++] = *p == '.' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
        env[j] = 0;
        const char *v = getenv(env);
        if (v && worker_config_set(&r->wc, name, v, "env", err, sizeof err)) {
            fprintf(stderr, "spillway: %s: %s\n", env, err);
            worker_config_free(&r->wc);
            return -1;
        }
    }
    r->mode = mode_of(r->wc.route_mode);
    return 0;
}

int cli_route_opt(cli_route_t *r, int opt, const char *arg)
{
    size_t i = 0;
    while (i < N_ROUTE_FLAGS && ROUTE_FLAGS[i].opt != opt) i++;
    if (i == N_ROUTE_FLAGS) return 0;
    char err[256], flag[32];
    snprintf(flag, sizeof flag, "%s", ROUTE_FLAGS[i].flag);
    flag[strcspn(flag, " ")] = 0;
    if (worker_config_set(&r->wc, ROUTE_FLAGS[i].key, arg, "cli", err, sizeof err)) {
        fprintf(stderr, "spillway: %s: %s\n", flag, err);
        return -1;
    }
    r->mode = mode_of(r->wc.route_mode);
    return 1;
}

void cli_route_help(FILE *f)
{
    for (size_t i = 0; i < N_ROUTE_FLAGS; i++)
        cli_key_help(f, ROUTE_FLAGS[i].flag, ROUTE_FLAGS[i].key, NULL);
}

int cli_route_start(cli_route_t *r, rd_kafka_t *rk, const char *topic, int timeout_ms)
{
    char err[256];
    rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR__INVALID_ARG;
    int n = -1;
    rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
    /* the topic's leaders may still be elected: ask again until timeout_ms */
    for (int waited = 0; t && n < 1; waited += 200) {
        const struct rd_kafka_metadata *md = NULL;
        e = rd_kafka_metadata(rk, 0, t, &md, timeout_ms);
        if (!e && md->topic_cnt == 1) {
            e = md->topics[0].err;
            if (!e) n = md->topics[0].partition_cnt;
        }
        if (md) rd_kafka_metadata_destroy(md);
        if (n >= 1 || waited >= timeout_ms || e == RD_KAFKA_RESP_ERR__TRANSPORT ||
            e == RD_KAFKA_RESP_ERR__TIMED_OUT)
            break;
        usleep(200 * 1000);
    }
    if (t) rd_kafka_topic_destroy(t);
    if (n < 1 && r->mode == CLI_ROUTE_BYTES) return 0; /* Kafka's partitioner needs no count */
    if (n < 1) {
        fprintf(stderr, "spillway: topic %s: %s (--route %s needs its partition count)\n", topic,
                e ? rd_kafka_err2str(e) : "no partitions", r->wc.route_mode);
        return -1;
    }
    r->n_parts = n;
    r->rng = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)getpid();
    if (r->mode != CLI_ROUTE_AFFINITY) return 0;
    route_config_t rc = {.prefix_bytes = r->wc.route_prefix_bytes, .eps = r->wc.route_eps,
                         .window = r->wc.route_window, .vnodes = r->wc.route_vnodes};
    r->router = route_new(n, &rc, err, sizeof err);
    if (!r->router) {
        fprintf(stderr, "spillway: %s\n", err);
        return -1;
    }
    return 0;
}

/* splitmix64 */
static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int cli_route_message(cli_route_t *r, const json_t *req, char *keybuf, size_t cap,
                      const char **key, size_t *klen, int32_t *partition, char *errstr,
                      size_t errlen)
{
    *key = NULL;
    *klen = 0;
    *partition = RD_KAFKA_PARTITION_UA;
    if (r->mode == CLI_ROUTE_RANDOM) {
        /* still refuse what the schema refuses, as the other modes do */
        uint64_t h;
        if (req && route_request_key(req, 0, 1, &h, errstr, errlen) < 0) return -1;
        *partition = (int32_t)(next_random(&r->rng) % (uint64_t)r->n_parts);
        return 0;
    }
    uint64_t h = 0;
    int src = req ? route_request_key(req, r->wc.route_prefix_bytes, r->mode == CLI_ROUTE_AFFINITY,
                                      &h, errstr, errlen)
                  : ROUTE_KEY_NONE;
    if (src < 0) return -1;
    r->by_source[src]++;
    if (src == ROUTE_KEY_ID) {
        json_t *id = json_object_get(req, "id");
        *key = json_string_value(id);
        *klen = json_string_length(id);
    } else if (src != ROUTE_KEY_NONE) {
        snprintf(keybuf, cap, "%016llx", (unsigned long long)h);
        *key = keybuf;
        *klen = strlen(keybuf);
    }
    if (r->mode == CLI_ROUTE_AFFINITY && src != ROUTE_KEY_NONE)
        *partition = route_pick(r->router, h);
    return 0;
}

void cli_route_free(cli_route_t *r)
{
    route_free(r->router);
    worker_config_free(&r->wc);
    memset(r, 0, sizeof *r);
}
