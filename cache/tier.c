/* cache/tier.c: the engine's tier-2 callbacks (engine_kv_tier_t) on a cache_t. */
#include "cache/cache.h"

static int tier_lookup(void *arg, const uint64_t *names, int n) { return cache_lookup(arg, names, n); }
static int tier_fetch(void *arg, int i, void *dst, uint64_t *parent, int32_t *tokens)
{
    return cache_fetch(arg, i, dst, parent, tokens);
}

static void *tier_store_begin(void *arg, uint64_t name, uint64_t parent, const int32_t *tokens)
{
    return cache_store_begin(arg, name, parent, tokens);
}

static void tier_store_commit(void *arg, void *buf, int ok)
{
    if (ok) cache_store_commit(arg, buf);
    else cache_store_cancel(arg, buf);
}

void cache_engine_tier(cache_t *c, engine_kv_tier_t *tier)
{
    tier->arg = c;
    tier->lookup = tier_lookup;
    tier->fetch = tier_fetch;
    tier->store_begin = tier_store_begin;
    tier->store_commit = tier_store_commit;
}
