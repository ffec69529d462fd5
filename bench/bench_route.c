/* bench/bench_route.c: the producer routing modes (producer/route.h) on a Zipf workload, printed
 * as a markdown table: per mode the cost per message and the balance of the partitions.
 *   workload  N requests (default 100000) whose prompts start with one of K documents (200),
 *             chosen by a Zipf law (s = 1.1) from a fixed seed, each followed by a question;
 *             P partitions (12); the routing key is the prompt's first 64 bytes (no prefix_key,
 *             so `affinity` and `bytes` see the same key)
 *   modes     affinity (route_pick, eps 0.1 / 0.25 / 0.5, window 1000, 128 vnodes), bytes
 *             (librdkafka's default partitioner, consistent_random, on the 16-hex-digit key, as
 *             `spillway produce --route bytes` sends it) and random
 *   figures   ns per message of the partition choice alone and with the key derivation
 *             (route_request_key on the parsed request), median of R runs (5); max/mean of the
 *             partitions' message counts over the whole run and the worst over every window of
 *             1000 consecutive messages; documents on more than one partition (mean partitions
 *             per document); reuse: the share of messages whose document this partition had
 *             already received (an upper bound of the prefix hit rate of a cache that never
 *             evicts)
 * usage: bench_route [--requests N] [--docs K] [--partitions P] [--reps R] */
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/benchlib.h"
#include "producer/route.h"

enum { WINDOW = 1000 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

typedef struct {
    const char *name;
    int kind;   /* 0 affinity, 1 bytes, 2 random */
    double eps;
} mode_t_;

int main(int argc, char **argv)
{
    long n = 100000;
    int k = 200, parts = 12, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--requests")) n = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--docs")) k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--partitions")) parts = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_route [--requests N] [--docs K] [--partitions P] [--reps R]\n");
            return 2;
        }
    }
    if (n < WINDOW || k < 1 || parts < 1 || parts > 4096 || reps < 1) return 2;
    /* the workload: doc[i] per request, and its parsed request */
    int *doc = malloc(sizeof *doc * (size_t)n);
    json_t **req = malloc(sizeof *req * (size_t)n);
    double *cdf = malloc(sizeof *cdf * (size_t)k), t = 0;
    int *pick = malloc(sizeof *pick * (size_t)n);
    uint64_t *hash = malloc(sizeof *hash * (size_t)n);
    char (*hex)[17] = malloc(sizeof *hex * (size_t)n);
    unsigned char *seen = calloc((size_t)k * (size_t)parts, 1);
    if (!doc || !req || !cdf || !pick || !hash || !hex || !seen) return 1;
    for (int i = 0; i < k; i++) cdf[i] = t += 1.0 / pow(i + 1, 1.1);
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < n; i++) {
        double u = (double)(xorshift(&s) >> 11) / 9007199254740992.0 * t;
        int lo = 0, hi = k - 1;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (cdf[mid] < u) lo = mid + 1;
            else hi = mid;
        }
        doc[i] = lo;
        char prompt[256], id[32];
        snprintf(prompt, sizeof prompt, "Document %d of the archive. It goes on for a thousand "
                 "tokens, of which the key sees 64 bytes. Question %ld: what does it say?", lo, i);
        snprintf(id, sizeof id, "q%ld", i);
        req[i] = json_pack("{s:s,s:s}", "id", id, "prompt", prompt);
        char err[64];
        route_request_key(req[i], 64, 1, &hash[i], err, sizeof err);
        snprintf(hex[i], sizeof hex[i], "%016llx", (unsigned long long)hash[i]);
    }
    double top = 1.0 / t;
    const mode_t_ MODES[] = {{"affinity eps 0.1", 0, 0.1}, {"affinity eps 0.25", 0, 0.25},
                             {"affinity eps 0.5", 0, 0.5}, {"bytes", 1, 0}, {"random", 2, 0}};
    printf("Zipf(1.1) over %d documents (the top one %.1f%% of the messages), %ld messages, %d "
           "partitions, window %d, 128 vnodes; ns/msg median of %d runs\n\n", k, 100 * top, n,
           parts, WINDOW, reps);
    printf("| mode | ns/msg pick | ns/msg key + pick | max/mean total | max/mean worst window | "
           "partitions per document | reuse |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t m = 0; m < sizeof MODES / sizeof MODES[0]; m++) {
        double *tp = malloc(sizeof *tp * (size_t)reps), *tk = malloc(sizeof *tk * (size_t)reps);
        route_config_t rc;
        route_config_default(&rc);
        rc.eps = MODES[m].eps;
        rc.window = WINDOW;
        char err[128];
        for (int r = 0; r < reps; r++) {
            for (int with_key = 0; with_key < 2; with_key++) {
                route_t *rt = MODES[m].kind == 0 ? route_new(parts, &rc, err, sizeof err) : NULL;
                uint64_t rs = 12345 + (uint64_t)r;
                double t0 = now_s();
                for (long i = 0; i < n; i++) {
                    uint64_t h = hash[i];
                    if (with_key) route_request_key(req[i], 64, 1, &h, err, sizeof err);
                    if (MODES[m].kind == 0) {
                        pick[i] = route_pick(rt, h);
                    } else if (MODES[m].kind == 1) {
                        const char *key = hex[i];
                        if (with_key) {
                            snprintf(hex[i], sizeof hex[i], "%016llx", (unsigned long long)h);
                            key = hex[i];
                        }
                        pick[i] = rd_kafka_msg_partitioner_consistent_random(NULL, key, 16, parts,
                                                                             NULL, NULL);
                    } else {
                        pick[i] = (int)(xorshift(&rs) % (uint64_t)parts);
                    }
                }
                double el = now_s() - t0;
                (with_key ? tk : tp)[r] = el * 1e9 / (double)n;
                route_free(rt);
            }
        }
        qsort(tp, (size_t)reps, sizeof *tp, bench_cmp_double);
        qsort(tk, (size_t)reps, sizeof *tk, bench_cmp_double);
        /* balance of the last run's picks */
        long *tot = calloc((size_t)parts, sizeof *tot), *win = calloc((size_t)parts, sizeof *win);
        double worst = 0;
        long reuse = 0;
        memset(seen, 0, (size_t)k * (size_t)parts);
        for (long i = 0; i < n; i++) {
            tot[pick[i]]++;
            win[pick[i]]++;
            if (i >= WINDOW) win[pick[i - WINDOW]]--;
            if (i >= WINDOW - 1) {
                long mx = 0;
                for (int p = 0; p < parts; p++) mx = win[p] > mx ? win[p] : mx;
                double ratio = (double)mx / ((double)WINDOW / parts);
                worst = ratio > worst ? ratio : worst;
            }
            unsigned char *sn = &seen[(size_t)doc[i] * (size_t)parts + (size_t)pick[i]];
            reuse += *sn;
            *sn = 1;
        }
        long mx = 0, on = 0;
        for (int p = 0; p < parts; p++) mx = tot[p] > mx ? tot[p] : mx;
        for (long i = 0; i < (long)k * parts; i++) on += seen[i];
        int used = 0;
        for (int d = 0; d < k; d++)
            for (int p = 0; p < parts; p++)
                if (seen[(size_t)d * (size_t)parts + (size_t)p]) {
                    used++;
                    break;
                }
        printf("| %s | %.0f | %.0f | %.2f | %.2f | %.2f | %.1f%% |\n", MODES[m].name,
               tp[reps / 2], tk[reps / 2], (double)mx / ((double)n / parts), worst,
               (double)on / (used ? used : 1), 100.0 * (double)reuse / (double)n);
        free(tot);
        free(win);
        free(tp);
        free(tk);
    }
    {
        int distinct = 0;
        for (int d = 0; d < k; d++)
            for (long i = 0; i < n; i++)
                if (doc[i] == d) {
                    distinct++;
                    break;
                }
        printf("| one shared cache (ideal) | | | | | | %.1f%% |\n",
               100.0 * (double)(n - distinct) / (double)n);
    }
    for (long i = 0; i < n; i++) json_decref(req[i]);
    free(doc);
    free(req);
    free(cdf);
    free(pick);
    free(hash);
    free(hex);
    free(seen);
    return 0;
}
