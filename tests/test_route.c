/* tests/test_route.c: the router (producer/route.h): the published test vectors
 * (tests/route/vectors.json, also checked by tests/test_route_reference.py's Python
 * implementation), stability across processes, the load bound under a Zipf workload, a hot key
 * spreading while cold keys stay home, ~1/n of the keys moving when a partition is added, the
 * routing key of requests, and the defaults against the key table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "producer/route.h"
#include "tests/check.h"
#include "worker/worker.h"

static route_t *mk(int n, double eps, long window, long vnodes)
{
    route_config_t c;
    char err[128];
    route_config_default(&c);
    c.eps = eps;
    c.window = window;
    c.vnodes = vnodes;
    route_t *r = route_new(n, &c, err, sizeof err);
    if (!r) fprintf(stderr, "route_new: %s\n", err);
    return r;
}

static uint64_t hs(const char *s) { return route_hash(s, strlen(s)); }

static void test_vectors(void)
{
    json_error_t je;
    json_t *v = json_load_file(SPILLWAY_SOURCE_DIR "/tests/route/vectors.json", 0, &je);
    CHECKF(v != NULL, "vectors.json: %s", je.text);
    if (!v) return;
    size_t i, j;
    json_t *c;
    json_array_foreach(json_object_get(v, "hashes"), i, c) {
        char got[17];
        snprintf(got, sizeof got, "%016llx",
                 (unsigned long long)hs(json_string_value(json_object_get(c, "key"))));
        CHECKF(!strcmp(got, json_string_value(json_object_get(c, "xxh64"))), "hash %zu: %s", i, got);
    }
    json_array_foreach(json_object_get(v, "homes"), i, c) {
        route_t *r = mk((int)json_integer_value(json_object_get(c, "partitions")), 0, 1,
                        (long)json_integer_value(json_object_get(c, "vnodes")));
        const char *key;
        json_t *part;
        json_object_foreach(json_object_get(c, "keys"), key, part)
            CHECKF(route_home(r, hs(key)) == json_integer_value(part), "home %s: %d", key,
                   route_home(r, hs(key)));
        route_free(r);
    }
    json_array_foreach(json_object_get(v, "picks"), i, c) {
        route_t *r = mk((int)json_integer_value(json_object_get(c, "partitions")),
                        json_number_value(json_object_get(c, "eps")),
                        (long)json_integer_value(json_object_get(c, "window")),
                        (long)json_integer_value(json_object_get(c, "vnodes")));
        json_t *keys = json_object_get(c, "keys"), *want = json_object_get(c, "partitions_picked");
        CHECK(json_array_size(keys) == json_array_size(want) && json_array_size(keys) > 0);
        for (j = 0; j < json_array_size(keys); j++) {
            int p = route_pick(r, hs(json_string_value(json_array_get(keys, j))));
            CHECKF(p == json_integer_value(json_array_get(want, j)), "pick case %zu msg %zu: %d", i,
                   j, p);
        }
        route_free(r);
    }
    static const char *SRC[] = {"none", "prefix_key", "prompt", "id"};
    json_array_foreach(json_object_get(v, "requests"), i, c) {
        uint64_t h = 0;
        char err[128];
        int s = route_request_key(json_object_get(c, "request"),
                                  (long)json_integer_value(json_object_get(c, "prefix_bytes")), 1,
                                  &h, err, sizeof err);
        const char *name = json_string_value(json_object_get(c, "name"));
        CHECKF(s >= 0 && !strcmp(SRC[s], json_string_value(json_object_get(c, "source"))),
               "%s: source %d", name, s);
        if (s > 0) {
            char got[17];
            snprintf(got, sizeof got, "%016llx", (unsigned long long)h);
            CHECKF(!strcmp(got, json_string_value(json_object_get(c, "hash"))), "%s: %s", name, got);
        }
    }
    json_decref(v);
}

/* A child process builds its own router and sends the homes and picks of 2000 keys through a
 * pipe: the same as this process's. */
static void test_stability(void)
{
    enum { N = 2000 };
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        route_t *r = mk(12, 0.25, 100, 128);
        for (int i = 0; i < N; i++) {
            char key[32];
            snprintf(key, sizeof key, "key-%d", i % 300);
            int pair[2] = {route_home(r, hs(key)), route_pick(r, hs(key))};
            if (write(fd[1], pair, sizeof pair) != (ssize_t)sizeof pair) _exit(1);
        }
        route_free(r);
        _exit(0);
    }
    close(fd[1]);
    route_t *r = mk(12, 0.25, 100, 128);
    int same = 0;
    for (int i = 0; i < N; i++) {
        char key[32];
        int pair[2] = {-1, -1};
        snprintf(key, sizeof key, "key-%d", i % 300);
        ssize_t got = read(fd[0], pair, sizeof pair);
        same += got == (ssize_t)sizeof pair && pair[0] == route_home(r, hs(key)) &&
                pair[1] == route_pick(r, hs(key));
    }
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECKF(same == N && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%d of %d the same", same, N);
    route_free(r);
}

/* A Zipf(s) sampler over k items (rank 0 most frequent), from a fixed xorshift seed. */
typedef struct {
    double *cdf;
    int k;
    uint64_t s;
} zipf_t;

static void zipf_init(zipf_t *z, int k, double s, uint64_t seed)
{
    z->k = k;
    z->s = seed;
    z->cdf = malloc(sizeof *z->cdf * (size_t)k);
    double t = 0;
    for (int i = 0; i < k; i++) z->cdf[i] = t += 1.0 / pow(i + 1, s);
    for (int i = 0; i < k; i++) z->cdf[i] /= t;
}

static int zipf_next(zipf_t *z)
{
    z->s ^= z->s << 13;
    z->s ^= z->s >> 7;
    z->s ^= z->s << 17;
    double u = (double)(z->s >> 11) / 9007199254740992.0;
    int lo = 0, hi = z->k - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (z->cdf[mid] < u) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* After every pick no partition holds more than ceil((1+eps) * count / n) of the window. */
static void test_bounded_load(void)
{
    static const struct {
        int n;
        double eps;
        long window;
    } CASES[] = {{12, 0.25, 1000}, {12, 0.0, 1000}, {12, 0.1, 50}, {7, 1.0, 300}, {3, 0.25, 1}};
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        route_t *r = mk(CASES[c].n, CASES[c].eps, CASES[c].window, 128);
        zipf_t z;
        zipf_init(&z, 200, 1.1, 0x9e3779b97f4a7c15ULL + c);
        long over = 0, top_home = 0, top_msgs = 0;
        int top_home_part = route_home(r, hs("prefix-0"));
        for (int i = 0; i < 50000; i++) {
            char key[32];
            int rank = zipf_next(&z);
            snprintf(key, sizeof key, "prefix-%d", rank);
            int p = route_pick(r, hs(key));
            long cap = route_cap(r, route_count(r)), sum = 0;
            for (int q = 0; q < CASES[c].n; q++) {
                over += route_load(r, q) > cap;
                sum += route_load(r, q);
            }
            over += sum != route_count(r);
            if (rank == 0) {
                top_msgs++;
                top_home += p == top_home_part;
            }
        }
        CHECKF(over == 0, "case %zu: %ld violations of the cap", c, over);
        CHECK(route_count(r) == CASES[c].window);
        /* the hottest prefix (about 1/5 of the traffic) keeps its home as long as the cap
           allows: it is the home's largest user */
        if (CASES[c].window >= 50)
            CHECKF(top_home * CASES[c].n >= top_msgs, "case %zu: %ld of %ld at home", c, top_home,
                   top_msgs);
        free(z.cdf);
        route_free(r);
    }
}

/* One key with 30% of the messages spreads over several partitions; 400 cold keys (70%
 * spread evenly) mostly stay on their home partition. */
static void test_hot_spreads(void)
{
    enum { N = 12, COLD = 400, MSGS = 60000 };
    route_t *r = mk(N, 0.25, 1000, 128);
    long hot_on[N] = {0}, cold_home = 0, cold = 0;
    uint64_t s = 88172645463325252ULL;
    for (int i = 0; i < MSGS; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        char key[32];
        int is_hot = s % 10 < 3;
        if (is_hot) snprintf(key, sizeof key, "hot");
        else snprintf(key, sizeof key, "cold-%d", (int)((s >> 8) % COLD));
        int p = route_pick(r, hs(key));
        if (is_hot) {
            hot_on[p]++;
        } else {
            cold++;
            cold_home += p == route_home(r, hs(key));
        }
    }
    int spread = 0;
    long hot = 0;
    for (int p = 0; p < N; p++) {
        hot += hot_on[p];
        spread += hot_on[p] > hot / 100;
    }
    /* 30% of the traffic needs at least 0.30 * 12 / 1.25 = 2.9 partitions' caps */
    CHECKF(spread >= 3, "hot key on %d partitions", spread);
    CHECKF(hot_on[route_home(r, hs("hot"))] * N >= hot, "hot key's home has %ld of %ld",
           hot_on[route_home(r, hs("hot"))], hot);
    fprintf(stderr, "hot key on %d partitions; cold messages at home: %.1f%%\n", spread,
            100.0 * (double)cold_home / (double)cold);
    CHECKF(cold_home * 10 >= cold * 8, "cold keys at home: %ld of %ld", cold_home, cold);
    route_free(r);
}

/* Adding a partition moves only keys to it, about 1/(n+1) of them; removing the last moves only
 * its keys. */
static void test_resize(void)
{
    enum { KEYS = 20000 };
    route_t *a = mk(12, 0.25, 1, 128), *b = mk(13, 0.25, 1, 128), *c = mk(11, 0.25, 1, 128);
    long moved = 0, wrong = 0, moved_c = 0, wrong_c = 0, on_last = 0;
    for (int i = 0; i < KEYS; i++) {
        char key[32];
        snprintf(key, sizeof key, "doc-%d", i);
        uint64_t h = hs(key);
        int pa = route_home(a, h), pb = route_home(b, h), pc = route_home(c, h);
        if (pa != pb) {
            moved++;
            wrong += pb != 12;
        }
        on_last += pa == 11;
        if (pa != pc) {
            moved_c++;
            wrong_c += pa != 11;
        }
    }
    fprintf(stderr, "12 -> 13 partitions: %.2f%% of keys moved (1/13 = 7.69%%)\n",
            100.0 * (double)moved / KEYS);
    CHECKF(wrong == 0 && wrong_c == 0, "%ld / %ld keys moved between old partitions", wrong, wrong_c);
    CHECKF(moved * 13 > KEYS / 2 && moved * 13 < KEYS * 2, "12 -> 13: %ld of %d moved", moved, KEYS);
    CHECKF(moved_c == on_last, "12 -> 11: %ld moved, %ld were on partition 11", moved_c, on_last);
    route_free(a);
    route_free(b);
    route_free(c);
}

static int key_of(const char *json, long prefix, int use_pk, uint64_t *h)
{
    json_t *r = json_loads(json, JSON_ALLOW_NUL, NULL);
    char err[128];
    int s = route_request_key(r, prefix, use_pk, h, err, sizeof err);
    json_decref(r);
    return s;
}

static void test_request_keys(void)
{
    uint64_t a = 0, b = 0;
    /* two conversations sharing a system prompt share a key when the prefix ends inside it */
    const char *c1 = "{\"id\":\"1\",\"messages\":[{\"role\":\"system\",\"content\":\"You answer questions "
                     "about the attached report.\"},{\"role\":\"user\",\"content\":\"Who wrote it?\"}]}";
    const char *c2 = "{\"id\":\"2\",\"messages\":[{\"role\":\"system\",\"content\":\"You answer questions "
                     "about the attached report.\"},{\"role\":\"user\",\"content\":\"When?\"}]}";
    CHECK(key_of(c1, 40, 1, &a) == ROUTE_KEY_PROMPT && key_of(c2, 40, 1, &b) == ROUTE_KEY_PROMPT &&
          a == b);
    CHECK(key_of(c1, 200, 1, &a) == ROUTE_KEY_PROMPT && key_of(c2, 200, 1, &b) == ROUTE_KEY_PROMPT &&
          a != b);
    /* the key hashes the canonical bytes: role 0x1F content 0x1E */
    const char canon[] = "system\x1fYou answer";
    CHECK(key_of(c1, (long)strlen(canon), 1, &a) == ROUTE_KEY_PROMPT &&
          a == route_hash(canon, strlen(canon)));
    /* prefix_key wins, whatever the prompt; the bytes mode ignores it */
    CHECK(key_of("{\"id\":\"x\",\"prefix_key\":\"doc-7\",\"prompt\":\"A\"}", 64, 1, &a) ==
              ROUTE_KEY_PREFIX_KEY && a == hs("doc-7"));
    CHECK(key_of("{\"id\":\"x\",\"prefix_key\":\"doc-7\",\"prompt\":\"A\"}", 64, 0, &a) ==
              ROUTE_KEY_PROMPT && a == hs("A"));
    /* prefix 0: the id */
    CHECK(key_of("{\"id\":\"x-1\",\"prompt\":\"A\"}", 0, 1, &a) == ROUTE_KEY_ID && a == hs("x-1"));
    CHECK(key_of("{\"prompt\":\"A\"}", 0, 1, &a) == ROUTE_KEY_NONE);
    CHECK(key_of("[1]", 64, 1, &a) == ROUTE_KEY_NONE);
    /* a prompt shorter than the prefix: all of it */
    CHECK(key_of("{\"id\":\"x\",\"prompt\":\"Hello\"}", 1 << 20, 1, &a) == ROUTE_KEY_PROMPT &&
          a == hs("Hello"));
    /* bad prefix_key: refused in every mode; null is absent */
    char big[400];
    snprintf(big, sizeof big, "{\"id\":\"x\",\"prompt\":\"A\",\"prefix_key\":\"%0257d\"}", 0);
    const char *bad[] = {"{\"id\":\"x\",\"prompt\":\"A\",\"prefix_key\":\"\"}",
                         "{\"id\":\"x\",\"prompt\":\"A\",\"prefix_key\":7}",
                         "{\"id\":\"x\",\"prompt\":\"A\",\"prefix_key\":[\"a\"]}",
                         "{\"id\":\"x\",\"prompt\":\"A\",\"prefix_key\":\"a\\u0000b\"}", big};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECKF(key_of(bad[i], 64, 1, &a) == -1, "bad %zu accepted", i);
        CHECKF(key_of(bad[i], 64, 0, &a) == -1, "bad %zu accepted (bytes)", i);
    }
    big[strlen(big) - 3] = 0; /* 256 bytes: the longest accepted */
    strcat(big, "\"}");
    CHECK(key_of(big, 64, 1, &a) == ROUTE_KEY_PREFIX_KEY);
    CHECK(key_of("{\"id\":\"x\",\"prompt\":\"A\",\"prefix_key\":null}", 64, 1, &a) ==
              ROUTE_KEY_PROMPT && a == hs("A"));
}

static void test_config(void)
{
    route_config_t c;
    worker_config_t wc;
    char err[128];
    route_config_default(&c);
    CHECK(worker_config_default(&wc) == 0);
    CHECK(wc.route_prefix_bytes == c.prefix_bytes && wc.route_eps == c.eps &&
          wc.route_window == c.window && wc.route_vnodes == c.vnodes &&
          !strcmp(wc.route_mode, "affinity"));
    worker_config_free(&wc);
    c.vnodes = 0;
    CHECK(!route_new(4, &c, err, sizeof err));
    route_config_default(&c);
    CHECK(!route_new(0, &c, err, sizeof err));
    c.eps = -0.5;
    CHECK(!route_new(4, &c, err, sizeof err));
    route_config_default(&c);
    route_t *r = route_new(1, &c, err, sizeof err);
    CHECK(r && route_pick(r, 42) == 0 && route_pick(r, 43) == 0 && route_load(r, 0) == 2);
    route_free(r);
    route_free(NULL);
}

int main(void)
{
    test_vectors();
    test_stability();
    test_bounded_load();
    test_hot_spreads();
    test_resize();
    test_request_keys();
    test_config();
    return check_exit();
}
