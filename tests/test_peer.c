/* tests/test_peer.c: the cache's fleet registry (cache_locate) between "hosts" that are
 * handles of one process with their own arena and host id, sharing one real redis-server that
 * this test starts with scripts/redis-server.sh (skipped, exit 77, without redis-server).
 *
 *  1  locate: a host sees the other live hosts with the leading blocks of a chain each holds,
 *     not itself; a host gone past the TTL disappears; malformed registry records are skipped
 */
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "check.h"

#define SEED 0x5eed5eed0000beefull
#define BT 16                          /* tokens per block */
#define BB ((size_t)4096 * 2 + 100)    /* bytes per block */

/* ---- helpers ---- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The KV bytes of block `name`: a deterministic function of it. */
static void fill(void *buf, size_t n, uint64_t name)
{
    uint8_t *b = buf;
    uint64_t s = name;
    for (size_t i = 0; i < n; i++) {
        if (i % 8 == 0) s = mix(s);
        b[i] = (uint8_t)(s >> (8 * (i % 8)));
    }
}

/* A chain: names[i] follows names[i-1]; tokens [n x BT] the blocks were computed from. */
static void make_chain(uint64_t *names, int32_t *tokens, int n, uint64_t salt)
{
    uint64_t h = mix(salt);
    for (int i = 0; i < n; i++) {
        h = mix(h ^ (uint64_t)(i + 1) * 0x100000001b3ull);
        names[i] = h ? h : 1;
        for (int t = 0; t < BT; t++) tokens[i * BT + t] = (int32_t)(mix(h + (uint64_t)t) & 0x7fff);
    }
}

typedef struct {
    char dir[512];
    int port;
    int pid;
} redis_t;

static int redis_start(redis_t *r, const char *dir)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "SPILLWAY_SVC_OWNER=%d '%s/scripts/redis-server.sh' start '%s' 2>&1",
             (int)getpid(), SPILLWAY_SOURCE_DIR, dir);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[512];
    while (fgets(line, sizeof line, p))
        if (sscanf(line, "REDIS_PORT=%d", &r->port) != 1 &&
            sscanf(line, "REDIS_PID=%d", &r->pid) != 1)
            fprintf(stderr, "  redis-server.sh: %s", line);
    return pclose(p) == 0 && r->port > 0 ? 0 : -1;
}

static void redis_stop(const redis_t *r)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s/scripts/redis-server.sh' stop '%s' >/dev/null 2>&1",
             SPILLWAY_SOURCE_DIR, r->dir);
    if (system(cmd) != 0) fprintf(stderr, "redis-server.sh stop failed\n");
}

/* One command on the server (set-up), its reply freed; 0 when it answered without error. */
static int redis_do(int port, int argc, const char **argv)
{
    struct timeval tv = {2, 0};
    redisContext *ctx = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!ctx || ctx->err) {
        if (ctx) redisFree(ctx);
        return -1;
    }
    redisReply *r = redisCommandArgv(ctx, argc, argv, NULL);
    int rc = r && r->type != REDIS_REPLY_ERROR ? 0 : -1;
    if (r) freeReplyObject(r);
    redisFree(ctx);
    return rc;
}

typedef struct {
    char dir[256];
    redis_t redis;
} env_t;

static cache_t *host_new(const env_t *e, const char *host_id, int ttl_ms)
{
    char arena[512], err[256];
    snprintf(arena, sizeof arena, "%s/%s.arena", e->dir, host_id);
    cache_config_t cfg;
    cache_config_default(&cfg);
    cfg.arena_path = arena;
    cfg.arena_mb = 2;
    cfg.redis_host = "127.0.0.1";
    cfg.redis_port = e->redis.port;
    cfg.host_id = host_id;
    cfg.cmd_timeout_ms = 2000;
    cfg.fleet_refresh_ms = 100;
    cfg.fleet_ttl_ms = ttl_ms;
    cfg.log_level = getenv("TEST_PEER_VERBOSE") ? 3 : 1;
    cache_geometry_t geo = {.seed = SEED, .block_tokens = BT, .block_bytes = BB};
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    if (!c) fprintf(stderr, "cache_new(%s): %s\n", host_id, err);
    return c;
}

/* Stores names[0..n) (content fill(name), meta from tokens) through the step-thread API and
 * waits (5 s at most) until the index holds all of them. 0 when it does. */
static int store_chain(cache_t *c, const uint64_t *names, const int32_t *tokens, int n)
{
    for (int i = 0; i < n; i++) {
        void *buf = cache_store_begin(c, names[i], i ? names[i - 1] : SEED, tokens + i * BT);
        if (!buf) return -1;
        fill(buf, BB, names[i]);
        cache_store_commit(c, buf);
    }
    for (int t = 0; t < 500; t++) {
        if (cache_lookup(c, names, n) == n) return 0;
        sleep_ms(10);
    }
    return -1;
}

/* cache_locate until it reports host_id (5 s at most); its entry into *out. */
static int locate_host(cache_t *c, const uint64_t *names, int n, const char *host_id,
                       cache_peer_t *out)
{
    cache_peer_t peers[8];
    for (int t = 0; t < 500; t++) {
        int k = cache_locate(c, names, n, peers, 8);
        for (int i = 0; i < k; i++)
            if (!strcmp(peers[i].host_id, host_id)) {
                *out = peers[i];
                return 0;
            }
        sleep_ms(10);
    }
    return -1;
}

/* ---- 1: locate ---- */

static void test_locate(const env_t *e)
{
    fprintf(stderr, "test 1: fleet registry and cache_locate\n");
    enum { N = 6 };
    uint64_t names[N];
    int32_t tokens[N * BT];
    make_chain(names, tokens, N, 1);
    cache_t *a = host_new(e, "hostA", 10000), *b = host_new(e, "hostB", 10000);
    CHECK(a && b);
    if (!a || !b) goto out;
    CHECK(!strcmp(cache_host_id(a), "hostA"));
    CHECK(store_chain(a, names, tokens, 4) == 0);
    cache_peer_t p;
    CHECK(locate_host(b, names, N, "hostA", &p) == 0);
    CHECKF(p.n_blocks == 4, "hostA holds %d leading blocks", p.n_blocks);
    CHECK(p.peer_addr[0] == 0);
    /* only leading blocks count: a chain whose first block hostA lacks */
    CHECK(locate_host(b, names + 1, N - 1, "hostA", &p) == 0 && p.n_blocks == 3);
    uint64_t other[2] = {names[1] ^ 1, names[1]};
    CHECK(locate_host(b, other, 2, "hostA", &p) == 0 && p.n_blocks == 0);
    /* never itself; the other host with 0 blocks */
    cache_peer_t peers[8];
    int k = cache_locate(a, names, N, peers, 8);
    int self = 0, saw_b = 0;
    for (int i = 0; i < k; i++) {
        self |= !strcmp(peers[i].host_id, "hostA");
        if (!strcmp(peers[i].host_id, "hostB")) {
            saw_b = 1;
            CHECK(peers[i].n_blocks == 0);
        }
    }
    CHECK(!self && saw_b);
    CHECK(cache_locate(a, names, N, peers, 0) == 0);
    CHECK(cache_locate(a, names, -1, peers, 8) == -1);
    /* malformed records (bad host id, bad record, bad address) are skipped */
    char fkey[128];
    snprintf(fkey, sizeof fkey, "spillway:fleet:%016" PRIx64 ":hosts", (uint64_t)SEED);
    const char *bad1[] = {"HSET", fkey, "bad host", "v1 99999999999999 "};
    const char *bad2[] = {"HSET", fkey, "hostX", "v2 1 x"};
    const char *bad3[] = {"HSET", fkey, "hostY", "v1 99999999999999 a b"};
    CHECK(redis_do(e->redis.port, 4, bad1) == 0);
    CHECK(redis_do(e->redis.port, 4, bad2) == 0);
    CHECK(redis_do(e->redis.port, 4, bad3) == 0);
    k = cache_locate(b, names, N, peers, 8);
    CHECKF(k == 1 && !strcmp(peers[0].host_id, "hostA") && peers[0].n_blocks == 4, "k %d", k);
    /* a host gone: ignored once its record is older than the TTL */
    cache_t *c3 = host_new(e, "hostC", 300);
    CHECK(c3 != NULL);
    if (c3) {
        CHECK(locate_host(c3, names, N, "hostA", &p) == 0 && p.n_blocks == 4);
        CHECK(locate_host(b, names, N, "hostC", &p) == 0 && p.n_blocks == 0);
        cache_free(c3);
        c3 = host_new(e, "hostD", 300); /* a reader with the short TTL */
        CHECK(c3 != NULL);
        int gone = 0;
        for (int t = 0; t < 200 && c3 && !gone; t++) {
            sleep_ms(20);
            k = cache_locate(c3, names, N, peers, 8);
            gone = 1;
            for (int i = 0; i < k; i++) gone &= strcmp(peers[i].host_id, "hostC") != 0;
        }
        CHECK(gone);
        cache_free(c3);
    }
out:
    cache_free(a);
    cache_free(b);
}

int main(void)
{
    setvbuf(stderr, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN);
    if (system("command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1")) {
        fprintf(stderr, "SKIP: redis-server / redis-cli not installed (scripts/install-deps.sh)\n");
        return 77;
    }
    char workdir[] = "/tmp/spillway-peer-test.XXXXXX";
    if (!mkdtemp(workdir)) {
        perror("mkdtemp");
        return 1;
    }
    env_t e;
    memset(&e, 0, sizeof e);
    snprintf(e.dir, sizeof e.dir, "%s", workdir);
    char rdir[400];
    snprintf(rdir, sizeof rdir, "%s/redis", workdir);
    if (redis_start(&e.redis, rdir)) {
        fprintf(stderr, "cannot start redis-server in %s\n", rdir);
        return 1;
    }
    test_locate(&e);
    redis_stop(&e.redis);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", workdir);
    return check_exit();
}
