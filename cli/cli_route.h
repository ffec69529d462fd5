/* cli/cli_route.h: the --route modes of `spillway produce` and `spillway batch` (cli/route.c),
 * on producer/route.h. Separate from cli.h, which the engine-only build (no librdkafka) uses. */
#ifndef SPILLWAY_CLI_ROUTE_H
#define SPILLWAY_CLI_ROUTE_H

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdint.h>
#include <stdio.h>

#include "producer/route.h"
#include "worker/worker.h"
enum { CLI_ROUTE_AFFINITY = 0, CLI_ROUTE_BYTES = 1, CLI_ROUTE_RANDOM = 2 };
typedef struct {
    worker_config_t wc; /* holds the route.* keys: defaults, SPILLWAY_ROUTE_* environment, flags */
    int mode;           /* CLI_ROUTE_* */
    int n_parts;        /* partitions of the topic (cli_route_start) */
    route_t *router;    /* affinity only; owned */
    uint64_t rng;       /* random: splitmix64 state */
    long by_source[4];  /* messages per ROUTE_KEY_* */
} cli_route_t;
/* getopt_long entries for cli_route_opt (-k is --key-prefix's short form). */
#define CLI_ROUTE_LONGOPTS                           \
    {"route", required_argument, 0, 2001},           \
    {"key-prefix", required_argument, 0, 'k'},       \
    {"route-eps", required_argument, 0, 2002},       \
    {"route-window", required_argument, 0, 2003},    \
    {"route-vnodes", required_argument, 0, 2004}
/* Defaults, then SPILLWAY_ROUTE_* environment. 0, or -1 (message printed). */
int cli_route_init(cli_route_t *r);
/* 1 when opt was one of CLI_ROUTE_LONGOPTS and its value is stored, 0 when not one, -1 for a
 * bad value (message printed). */
int cli_route_opt(cli_route_t *r, int opt, const char *arg);
/* The help lines of those flags, from the key table. */
void cli_route_help(FILE *f);
/* Reads topic's partition count from the broker (rk: a producer; up to timeout_ms) and makes
 * the router. 0, or -1 (message printed: e.g. the topic does not exist). */
int cli_route_start(cli_route_t *r, rd_kafka_t *rk, const char *topic, int timeout_ms);
/* Where request req (borrowed; may be NULL: not JSON) goes: *key / *klen (into keybuf, cap >=
 * 17, or the request's id; NULL / 0 for none) and *partition (RD_KAFKA_PARTITION_UA: Kafka's
 * partitioner decides). 0, or -1 + errstr when the request must not be sent (a bad
 * prefix_key). */
int cli_route_message(cli_route_t *r, const json_t *req, char *keybuf, size_t cap,
                      const char **key, size_t *klen, int32_t *partition, char *errstr,
                      size_t errlen);
void cli_route_free(cli_route_t *r);

#endif
