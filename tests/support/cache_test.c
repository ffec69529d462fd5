/* tests/support/cache_test.c: what the cache tests share (contract: cache_test.h). */
#include "cache_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int64_t ct_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ct_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

uint64_t ct_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void ct_fill(void *buf, size_t n, uint64_t name)
{
    uint8_t *b = buf;
    uint64_t s = name;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s = ct_mix(s);
        memcpy(b + i, &s, 8);
    }
    for (; i < n; i++) b[i] = (uint8_t)ct_mix(s + i);
}

int ct_content_ok(const void *buf, size_t n, uint64_t name)
{
    const uint8_t *b = buf;
    uint64_t s = name;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s = ct_mix(s);
        if (memcmp(b + i, &s, 8)) return 0;
    }
    for (; i < n; i++)
        if (b[i] != (uint8_t)ct_mix(s + i)) return 0;
    return 1;
}

void ct_chain(uint64_t *names, int n, uint64_t salt)
{
    uint64_t h = ct_mix(salt);
    for (int i = 0; i < n; i++) {
        h = ct_mix(h ^ (uint64_t)(i + 1) * 0x100000001b3ull);
        names[i] = h ? h : 1;
    }
}

int ct_redis_start(ct_redis_t *r, const char *dir)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "SPILLWAY_SVC_OWNER=%d '%s/scripts/redis-server.sh' start '%s' 2>&1",
             (int)getpid(), SPILLWAY_SOURCE_DIR, r->dir);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[512];
    while (fgets(line, sizeof line, p)) {
        if (sscanf(line, "REDIS_PORT=%d", &r->port) == 1 ||
            sscanf(line, "REDIS_PID=%d", &r->pid) == 1)
            continue;
        fprintf(stderr, "  redis-server.sh: %s", line);
    }
    int st = pclose(p);
    return st == 0 && r->port > 0 && r->pid > 0 ? 0 : -1;
}

int ct_redis_script(const ct_redis_t *r, const char *verb)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s/scripts/redis-server.sh' %s '%s' >/dev/null 2>&1",
             SPILLWAY_SOURCE_DIR, verb, r->dir);
    return system(cmd);
}

/* A connection with a 2 s timeout for connecting and each command; NULL on failure. */
static redisContext *connect_2s(int port)
{
    struct timeval tv = {2, 0};
    redisContext *ctx = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!ctx || ctx->err) {
        if (ctx) redisFree(ctx);
        return NULL;
    }
    redisSetTimeout(ctx, tv);
    return ctx;
}

redisReply *ct_redis_cmd(int port, const char *auth_user, const char *auth_pass, int db,
                         const char *fmt, const char *arg)
{
    redisContext *ctx = connect_2s(port);
    if (!ctx) return NULL;
    redisReply *r = NULL;
    if (auth_pass) {
        r = auth_user ? redisCommand(ctx, "AUTH %s %s", auth_user, auth_pass)
                      : redisCommand(ctx, "AUTH %s", auth_pass);
        if (r) freeReplyObject(r);
    }
    if (db) {
        r = redisCommand(ctx, "SELECT %d", db);
        if (r) freeReplyObject(r);
    }
    r = redisCommand(ctx, fmt, arg);
    redisFree(ctx);
    return r;
}

int ct_redis_argv(int port, int argc, const char **argv)
{
    redisContext *ctx = connect_2s(port);
    if (!ctx) return -1;
    redisReply *r = redisCommandArgv(ctx, argc, argv, NULL);
    int rc = r && r->type != REDIS_REPLY_ERROR ? 0 : -1;
    if (r) freeReplyObject(r);
    redisFree(ctx);
    return rc;
}
