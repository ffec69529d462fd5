/* tests/kv_forge.c: the attacker's process of tests/test_kv_forgery.sh (test-only, not
 * installed). It stores, through the ordinary tier-2 path (arena slot + Redis index, cache/),
 * the first KV block of ATTACKER's prompt under the name of the first block of VICTIM's prompt:
 * what a producer who found a name collision gets the cache to hold. The block keeps the
 * tokens and parent it was really computed from (the slot's honest contents); only the name
 * lies.
 *
 *   kv_forge MODEL SECRET_FILE ARENA REDIS_PORT VICTIM_PROMPT ATTACKER_PROMPT
 * Engine settings as tests/test_kv_forgery.sh runs `spillway generate` (kv f32, 16-token
 * blocks), so the geometry and the names agree. Prints "forged NAME" and exits 0 once the
 * block was handed to the cache's writer (the script checks the index); 1 on an error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "engine/engine.h"

typedef struct {
    cache_t *cache;     /* NULL: recording the victim's names */
    uint64_t victim0;   /* the victim's first block name (0 until recorded) */
    int offered;        /* blocks offered so far */
} forge_t;

static int f_lookup(void *arg, const uint64_t *names, int n)
{
    (void)arg;
    (void)names;
    (void)n;
    return 0; /* compute everything: the offered blocks are then this process's own */
}

static int f_fetch(void *arg, int i, void *dst, uint64_t *parent, int32_t *tokens)
{
    (void)arg;
    (void)i;
    (void)dst;
    (void)parent;
    (void)tokens;
    return -1;
}

static void *f_store_begin(void *arg, uint64_t name, uint64_t parent, const int32_t *tokens)
{
    forge_t *f = arg;
    if (f->offered++ != 0) return NULL; /* the first block only */
    if (!f->cache) {
        f->victim0 = name;
        return NULL;
    }
    /* the attacker's block (its real tokens and parent), under the victim's name */
    return cache_store_begin(f->cache, f->victim0, parent, tokens);
}

static void f_store_commit(void *arg, void *buf, int ok)
{
    forge_t *f = arg;
    if (!f->cache || !buf) return;
    if (ok) cache_store_commit(f->cache, buf);
    else cache_store_cancel(f->cache, buf);
}

static void on_done(void *arg, const engine_result_t *r)
{
    (void)arg;
    (void)r;
}

/* One greedy token of prompt on a fresh engine with tier f. 0 or -1. */
static int run_prompt(const char *model, const unsigned char *secret, forge_t *f,
                      const char *prompt, engine_info_t *info)
{
    char err[512];
    engine_config_t c;
    engine_config_default(&c);
    c.model_path = model;
    c.threads = 1;
    c.kv_type = "f32";
    c.kv_mem_mb = 32;
    c.kv_secret = secret;
    engine_t *e = engine_new(&c, err, sizeof err);
    if (!e) {
        fprintf(stderr, "kv_forge: %s\n", err);
        return -1;
    }
    engine_info(e, info);
    engine_kv_tier_t t = {f, f_lookup, f_fetch, f_store_begin, f_store_commit};
    int32_t toks[4096];
    int n = engine_tokenize(e, prompt, strlen(prompt), 1, 1, toks, 4096);
    engine_request_t rq;
    engine_request_default(&rq);
    rq.prompt = toks;
    rq.n_prompt = n;
    rq.max_tokens = 1;
    rq.sampling.temperature = 0;
    int rc = -1;
    if (n < 17 || n > 4096) {
        fprintf(stderr, "kv_forge: prompt of %d tokens (17..4096 needed)\n", n);
    } else if (engine_set_kv_tier(e, &t, err, sizeof err) ||
               engine_submit(e, &rq, on_done, NULL, NULL, err, sizeof err) ||
               engine_run(e, err, sizeof err)) {
        fprintf(stderr, "kv_forge: %s\n", err);
    } else {
        rc = 0;
    }
    engine_free(e);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: kv_forge MODEL SECRET_FILE ARENA REDIS_PORT VICTIM ATTACKER\n");
        return 2;
    }
    char err[512];
    unsigned char secret[CACHE_SECRET_BYTES];
    if (cache_secret_load(argv[2], secret, err, sizeof err)) {
        fprintf(stderr, "kv_forge: %s\n", err);
        return 1;
    }
    forge_t f = {0};
    engine_info_t info;
    if (run_prompt(argv[1], secret, &f, argv[5], &info) || !f.victim0) return 1;
    cache_config_t kc;
    cache_config_default(&kc);
    kc.arena_path = argv[3];
    kc.arena_mb = 64;
    kc.redis_host = "127.0.0.1";
    kc.redis_port = atoi(argv[4]);
    kc.cmd_timeout_ms = 1000;
    cache_geometry_t geo = {info.kv_seed, info.block_tokens, info.kv_block_bytes};
    f.cache = cache_new(&kc, &geo, err, sizeof err);
    if (!f.cache) {
        fprintf(stderr, "kv_forge: %s\n", err);
        return 1;
    }
    f.offered = 0;
    int rc = run_prompt(argv[1], secret, &f, argv[6], &info);
    cache_free(f.cache); /* waits for the writer: the block is indexed (or dropped) now */
    if (rc) return 1;
    printf("forged %016llx\n", (unsigned long long)f.victim0);
    return 0;
}
