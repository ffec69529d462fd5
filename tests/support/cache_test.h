/* tests/support/cache_test.h: what the tests of the cache (tests/test_cache.c, tests/test_peer.c)
 * share: a throwaway redis-server started with scripts/redis-server.sh, direct commands on it,
 * and block names and contents derived from numbers, so every fetched block can be checked byte
 * for byte. Linked into every tests/test_*.c, engine-only builds too (spillway_test_base).
 *
 * Threads: any; nothing here keeps state between calls. Failures are return values: the tests
 * count them with check.h. */
#ifndef SPILLWAY_TESTS_SUPPORT_CACHE_TEST_H
#define SPILLWAY_TESTS_SUPPORT_CACHE_TEST_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

/* Monotonic milliseconds. */
int64_t ct_now_ms(void);
void ct_sleep_ms(int ms);

/* splitmix64's finaliser: the hash every derived name, token and byte comes from. */
uint64_t ct_mix(uint64_t x);

/* The n bytes of block `name` (a deterministic function of it) into buf; ct_content_ok: 1 when
 * buf holds exactly them. */
void ct_fill(void *buf, size_t n, uint64_t name);
int ct_content_ok(const void *buf, size_t n, uint64_t name);

/* A chain of n block names from salt: names[i] depends on names[i-1], as the engine's do; never
 * 0. */
void ct_chain(uint64_t *names, int n, uint64_t salt);

/* A redis-server of scripts/redis-server.sh: its folder, port and pid. */
typedef struct {
    char dir[512];
    int port;
    int pid;
} ct_redis_t;

/* `redis-server.sh start dir` with this process as its owner (the server goes when it exits);
 * the script's other lines go to stderr. 0 when it started and r names it, -1 if not. */
int ct_redis_start(ct_redis_t *r, const char *dir);
/* `redis-server.sh verb r->dir` (stop: SIGTERM and remove the folder; kill: SIGKILL), output
 * discarded; the script's exit status as system() gives it (0: done). */
int ct_redis_script(const ct_redis_t *r, const char *verb);

/* One command fmt (its one %s: arg) on the server at port, after AUTH (auth_pass
 * not NULL; auth_user NULL: the default user) and SELECT db (db not 0), on a connection of its
 * own with a 2 s timeout. The reply (caller frees with freeReplyObject), NULL when the server did
 * not answer. */
redisReply *ct_redis_cmd(int port, const char *auth_user, const char *auth_pass, int db,
                         const char *fmt, const char *arg);
/* One command of argc arguments argv on the server at port, its reply freed: 0 when it answered
 * without error, -1 if not. */
int ct_redis_argv(int port, int argc, const char **argv);

#endif
