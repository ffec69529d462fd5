/* cache/index.c: the Redis index of tier 2: connections (connect, AUTH, SELECT, SCRIPT LOAD,
 * index init, all pipelined in one round trip), reconnect backoff, the Lua scripts that are the
 * only writers of the index, and the consistency check.
 *
 * Keys, prefix P = "<namespace>:<host_id>:<seed as 16 hex digits>:":
 *   P meta    hash  n_slots -> decimal, arena -> arena id (16 hex digits)
 *   P free    list  free slot ids (decimal)
 *   P lru     zset  slot -> last use (a value of P clock); every slot not in free
 *   P sname   hash  slot -> name (16 hex digits) allocated there; only for slots in lru
 *   P sgen    hash  slot -> generation, HINCRBY at every allocation of the slot
 *   P blk     hash  name -> "slot:gen", for blocks completely written and committed
 *   P clock   string, the LRU counter (INCR)
 * Every script gets the 7 keys in that order and ARGV[1] = arena id, ARGV[2] = n_slots; all but
 * init first check them against meta and fail with "SPILLWAY_META ..." on a mismatch (another
 * arena's index, a flushed Redis): the client then re-runs init, or, when the arena itself was
 * re-initialised by another process since we attached, turns tier 2 off for its handle.
 *
 * Threads: an rconn_t is used by one thread; index_cfg_t is read-only; stats are atomics. */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache_internal.h"

#define META_CHECK                                                                         \
    "local m = redis.call('HMGET', KEYS[1], 'n_slots', 'arena')\n"                         \
    "if m[1] ~= ARGV[2] or m[2] ~= ARGV[1] then\n"                                         \
    "  return redis.error_reply('SPILLWAY_META index belongs to another arena')\n"         \
    "end\n"

/* init: when meta does not name this arena (and n_slots), deletes every index key and puts all
 * slots 0..n-1 on the free list. Returns 1 when it reset the index, 0 when it matched. */
static const char SRC_INIT[] =
    "local m = redis.call('HMGET', KEYS[1], 'n_slots', 'arena')\n"
    "if m[1] == ARGV[2] and m[2] == ARGV[1] then return 0 end\n"
    "redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])\n"
    "local n = tonumber(ARGV[2])\n"
    "local i = 0\n"
    "while i < n do\n"
    "  local b = {}\n"
    "  local j = i\n"
    "  while j < n and j < i + 1000 do b[#b + 1] = tostring(j); j = j + 1 end\n"
    "  redis.call('RPUSH', KEYS[2], unpack(b))\n"
    "  i = j\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 'n_slots', ARGV[2], 'arena', ARGV[1])\n"
    "return 1\n";

/* alloc(name): {-1} when name is indexed; else a free slot, or the least recently used one
 * (evicting its block from blk when it holds a committed one), with its generation bumped and
 * its LRU time set: {slot, gen, evicted 0/1, free slots left}. {-2}: no slot at all. */
static const char SRC_ALLOC[] =
    META_CHECK
    "local nm = ARGV[3]\n"
    "if redis.call('HEXISTS', KEYS[6], nm) == 1 then return {-1} end\n"
    "local slot = redis.call('LPOP', KEYS[2])\n"
    "local evicted = 0\n"
    "if not slot then\n"
    "  local r = redis.call('ZRANGE', KEYS[3], 0, 0)\n"
    "  if #r == 0 then return {-2} end\n"
    "  slot = r[1]\n"
    "  local old = redis.call('HGET', KEYS[4], slot)\n"
    "  local g = redis.call('HGET', KEYS[5], slot)\n"
    "  if old and g and redis.call('HGET', KEYS[6], old) == slot .. ':' .. g then\n"
    "    redis.call('HDEL', KEYS[6], old)\n"
    "    evicted = 1\n"
    "  end\n"
    "end\n"
    "local gen = redis.call('HINCRBY', KEYS[5], slot, 1)\n"
    "redis.call('HSET', KEYS[4], slot, nm)\n"
    "redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[7]), slot)\n"
    "return {tonumber(slot), gen, evicted, redis.call('LLEN', KEYS[2])}\n";

/* commit(name, slot, gen): {1, free} when name now maps to slot:gen; {0, free} when the slot
 * was re-allocated meanwhile (raced: nothing changes); {2, free} when another writer indexed
 * the name first (this slot goes back to the free list). */
static const char SRC_COMMIT[] =
    META_CHECK
    "local nm, slot, gen = ARGV[3], ARGV[4], ARGV[5]\n"
    "if redis.call('HGET', KEYS[5], slot) ~= gen or redis.call('HGET', KEYS[4], slot) ~= nm then\n"
    "  return {0, redis.call('LLEN', KEYS[2])}\n"
    "end\n"
    "local v = slot .. ':' .. gen\n"
    "local cur = redis.call('HGET', KEYS[6], nm)\n"
    "if cur and cur ~= v then\n"
    "  redis.call('ZREM', KEYS[3], slot)\n"
    "  redis.call('HDEL', KEYS[4], slot)\n"
    "  redis.call('RPUSH', KEYS[2], slot)\n"
    "  return {2, redis.call('LLEN', KEYS[2])}\n"
    "end\n"
    "redis.call('HSET', KEYS[6], nm, v)\n"
    "redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[7]), slot)\n"
    "return {1, redis.call('LLEN', KEYS[2])}\n";

/* release(slot, gen): gives back a slot allocated but not written (its seqlock was busy) when
 * it still has that generation. 1 released, 0 not (re-allocated meanwhile). */
static const char SRC_RELEASE[] =
    META_CHECK
    "if redis.call('HGET', KEYS[5], ARGV[3]) ~= ARGV[4] then return 0 end\n"
    "if redis.call('ZREM', KEYS[3], ARGV[3]) == 0 then return 0 end\n"
    "redis.call('HDEL', KEYS[4], ARGV[3])\n"
    "redis.call('RPUSH', KEYS[2], ARGV[3])\n"
    "return 1\n";

/* lookup(name...): the longest indexed leading run of the chain, {free, slot1, gen1, slot2,
 * gen2, ...}; touches those slots in the LRU, the chain's head most recent and its tail least
 * (a tail is useless without its head, so it goes first). */
static const char SRC_LOOKUP[] =
    META_CHECK
    "local out = {0}\n"
    "local slots = {}\n"
    "for i = 3, #ARGV do\n"
    "  local v = redis.call('HGET', KEYS[6], ARGV[i])\n"
    "  if not v then break end\n"
    "  local p = string.find(v, ':', 1, true)\n"
    "  if not p then break end\n"
    "  local s = string.sub(v, 1, p - 1)\n"
    "  slots[#slots + 1] = s\n"
    "  out[#out + 1] = tonumber(s)\n"
    "  out[#out + 1] = tonumber(string.sub(v, p + 1))\n"
    "end\n"
    "local k = #slots\n"
    "if k > 0 then\n"
    "  local base = redis.call('INCRBY', KEYS[7], k)\n"
    "  local i = 1\n"
    "  while i <= k do\n"
    "    local a = {}\n"
    "    local j = i\n"
    "    while j <= k and j < i + 500 do\n"
    "      a[#a + 1] = tostring(base - j + 1); a[#a + 1] = slots[j]; j = j + 1\n"
    "    end\n"
    "    redis.call('ZADD', KEYS[3], 'XX', unpack(a))\n"
    "    i = j\n"
    "  end\n"
    "end\n"
    "out[1] = redis.call('LLEN', KEYS[2])\n"
    "return out\n";

static const char *const SCRIPT_SRC[N_SCRIPTS] = {SRC_INIT, SRC_ALLOC, SRC_COMMIT, SRC_RELEASE,
                                                  SRC_LOOKUP};
static const char *const SCRIPT_NAME[N_SCRIPTS] = {"init", "alloc", "commit", "release", "lookup"};
static const char *const KEY_SUFFIX[N_KEYS] = {"meta", "free", "lru", "sname", "sgen", "blk",
                                               "clock"};

static struct timeval ms_tv(int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return tv;
}

int index_cfg_init(index_cfg_t *ix, const cache_config_t *cfg, const cache_geometry_t *geo,
                   uint64_t arena_id, uint32_t n_slots)
{
    memset(ix, 0, sizeof *ix);
    char hostname[256];
    const char *host_id = cfg->host_id && *cfg->host_id ? cfg->host_id : NULL;
    if (!host_id) {
        if (gethostname(hostname, sizeof hostname) < 0) snprintf(hostname, sizeof hostname, "host");
        hostname[sizeof hostname - 1] = 0;
        host_id = hostname;
    }
    const char *ns = cfg->namespace_ && *cfg->namespace_ ? cfg->namespace_ : "spillway";
    ix->host_id = strdup(host_id);
    ix->seed = geo->seed;
    ix->ns = strdup(ns);
    size_t flen = strlen(ns) + 16 + 16;
    ix->fleet_key = malloc(flen);
    if (!ix->host_id || !ix->ns || !ix->fleet_key) goto fail;
    snprintf(ix->fleet_key, flen, "%s:fleet:%016" PRIx64 ":hosts", ns, geo->seed);
    ix->host = strdup(cfg->redis_host ? cfg->redis_host : "");
    ix->user = strdup(cfg->redis_user ? cfg->redis_user : "");
    ix->password = strdup(cfg->redis_password ? cfg->redis_password : "");
    if (!ix->host || !ix->user || !ix->password) goto fail;
    ix->port = cfg->redis_port;
    ix->db = cfg->redis_db;
    ix->connect_timeout_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 1;
    ix->cmd_timeout_ms = cfg->cmd_timeout_ms > 0 ? cfg->cmd_timeout_ms : 1;
    ix->backoff_min_ms = cfg->backoff_min_ms > 0 ? cfg->backoff_min_ms : 1;
    ix->backoff_max_ms = cfg->backoff_max_ms > ix->backoff_min_ms ? cfg->backoff_max_ms
                                                                   : ix->backoff_min_ms;
    ix->health_ms = cfg->health_ms > 0 ? cfg->health_ms : 0;
    for (int k = 0; k < N_KEYS; k++) {
        size_t len = strlen(ns) + strlen(host_id) + 16 + strlen(KEY_SUFFIX[k]) + 4;
        ix->keys[k] = malloc(len);
        if (!ix->keys[k]) goto fail;
        snprintf(ix->keys[k], len, "%s:%s:%016" PRIx64 ":%s", ns, host_id, geo->seed,
                 KEY_SUFFIX[k]);
    }
    snprintf(ix->arena_id, sizeof ix->arena_id, "%016" PRIx64, arena_id);
    snprintf(ix->n_slots, sizeof ix->n_slots, "%u", n_slots);
    return 0;
fail:
    index_cfg_free(ix);
    return -1;
}

void index_cfg_free(index_cfg_t *ix)
{
    free(ix->host);
    free(ix->user);
    free(ix->password);
    free(ix->host_id);
    free(ix->ns);
    free(ix->fleet_key);
    for (int k = 0; k < N_KEYS; k++) free(ix->keys[k]);
    memset(ix, 0, sizeof *ix);
}

void rconn_init(rconn_t *r, const index_cfg_t *ix, const char *who)
{
    memset(r, 0, sizeof *r);
    r->backoff_ms = ix->backoff_min_ms;
    r->who = who;
}

void rconn_close(rconn_t *r)
{
    if (r->ctx) redisFree(r->ctx);
    r->ctx = NULL;
}

static void set_down(cache_t *c, rconn_t *r, int64_t retry_at)
{
    atomic_store_explicit(&c->st_redis_up, 0, memory_order_relaxed);
    if (r == &c->wr) atomic_store_explicit(&c->wr_retry_at_ms, retry_at, memory_order_relaxed);
}

/* The error of a failed context, a read timeout named as such (hiredis reports EAGAIN). */
static const char *ctx_error(const cache_t *c, const redisContext *ctx, char *buf, size_t len)
{
    if (ctx->err == REDIS_ERR_IO && strstr(ctx->errstr, "temporarily unavailable"))
        snprintf(buf, len, "timed out (%d ms)", c->ix.cmd_timeout_ms);
    else
        snprintf(buf, len, "%s", ctx->errstr[0] ? ctx->errstr : "connection error");
    return buf;
}

void rconn_fail(cache_t *c, rconn_t *r, const char *what, const char *detail)
{
    atomic_fetch_add_explicit(&c->st_redis_errors, 1, memory_order_relaxed);
    int64_t retry_at = sw_mono_ms() + r->backoff_ms;
    /* detail may point into the context: log before freeing it */
    CACHE_LOG(&c->log, r->failures ? SW_LOG_DEBUG : SW_LOG_WARN,
              "redis %s:%d (%s connection): %s: %s (tier 2 off, retrying in %d ms)", c->ix.host,
              c->ix.port, r->who, what, detail && *detail ? detail : "error", r->backoff_ms);
    rconn_close(r);
    r->retry_at_ms = retry_at;
    r->backoff_ms = r->backoff_ms > c->ix.backoff_max_ms / 2 ? c->ix.backoff_max_ms
                                                              : r->backoff_ms * 2;
    r->failures++;
    set_down(c, r, retry_at);
}

/* argv for EVAL/EVALSHA: cmd, script, "7", the keys, arena id, n_slots, then args. */
static int build_argv(const cache_t *c, const char *cmd, const char *script, int nargs,
                      const char **args, const size_t *lens, const char ***argv_out,
                      size_t **lens_out)
{
    int argc = 3 + N_KEYS + 2 + nargs;
    const char **argv = malloc((size_t)argc * sizeof *argv);
    size_t *al = malloc((size_t)argc * sizeof *al);
    if (!argv || !al) {
        free(argv);
        free(al);
        return -1;
    }
    int k = 0;
    argv[k++] = cmd;
    argv[k++] = script;
    argv[k++] = "7";
    for (int i = 0; i < N_KEYS; i++) argv[k++] = c->ix.keys[i];
    argv[k++] = c->ix.arena_id;
    argv[k++] = c->ix.n_slots;
    for (int i = 0; i < nargs; i++) argv[k++] = args[i];
    for (int i = 0; i < k; i++) al[i] = strlen(argv[i]);
    for (int i = 0; i < nargs; i++)
        if (lens) al[3 + N_KEYS + 2 + i] = lens[i];
    *argv_out = argv;
    *lens_out = al;
    return argc;
}

/* Connect, AUTH, SELECT, SCRIPT LOAD every script and run init, pipelined: one connect and one
 * round trip, each read bounded by cmd_timeout_ms. */
static int rconn_connect(cache_t *c, rconn_t *r)
{
    const index_cfg_t *ix = &c->ix;
    const char **argv = NULL;
    size_t *al = NULL;
    redisReply *rep = NULL;
    char what[64] = "connect", ebuf[160];
    /* init below would take the index over for this arena: never for a stale mapping */
    if (!cache_tier2_usable(c)) return -1;
    redisContext *ctx = redisConnectWithTimeout(ix->host, ix->port, ms_tv(ix->connect_timeout_ms));
    if (!ctx) {
        rconn_fail(c, r, what, "out of memory");
        return -1;
    }
    r->ctx = ctx; /* from here rconn_fail frees it */
    if (ctx->err) goto io_fail;
    if (redisSetTimeout(ctx, ms_tv(ix->cmd_timeout_ms)) != REDIS_OK) goto io_fail;
    int n_replies = 0;
    if (*ix->password) {
        if (*ix->user)
            redisAppendCommand(ctx, "AUTH %s %s", ix->user, ix->password);
        else
            redisAppendCommand(ctx, "AUTH %s", ix->password);
        n_replies++;
    }
    if (ix->db) {
        redisAppendCommand(ctx, "SELECT %d", ix->db);
        n_replies++;
    }
    for (int s = 0; s < N_SCRIPTS; s++) {
        redisAppendCommand(ctx, "SCRIPT LOAD %s", SCRIPT_SRC[s]);
        n_replies++;
    }
    int argc = build_argv(c, "EVAL", SRC_INIT, 0, NULL, NULL, &argv, &al);
    if (argc < 0) {
        rconn_fail(c, r, what, "out of memory");
        return -1;
    }
    redisAppendCommandArgv(ctx, argc, argv, al);
    n_replies++;
    free(argv);
    free(al);
    int script = 0, reset = 0;
    for (int i = 0; i < n_replies; i++) {
        void *v = NULL;
        int is_auth = *ix->password && i == 0;
        int is_select = ix->db && i == (*ix->password ? 1 : 0);
        int is_init = i == n_replies - 1;
        snprintf(what, sizeof what, "%s",
                 is_auth ? "AUTH" : is_select ? "SELECT" : is_init ? "init" : "SCRIPT LOAD");
        if (redisGetReply(ctx, &v) != REDIS_OK) goto io_fail;
        rep = v;
        if (rep->type == REDIS_REPLY_ERROR) {
            rconn_fail(c, r, what, rep->str);
            freeReplyObject(rep);
            return -1;
        }
        if (!is_auth && !is_select && !is_init) {
            if (rep->type != REDIS_REPLY_STRING || rep->len != 40) {
                rconn_fail(c, r, what, "unexpected reply");
                freeReplyObject(rep);
                return -1;
            }
            memcpy(r->sha[script], rep->str, 40);
            r->sha[script][40] = 0;
            script++;
        }
        if (is_init) reset = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
        freeReplyObject(rep);
        rep = NULL;
    }
    CACHE_LOG(&c->log, SW_LOG_INFO, "redis %s:%d (%s connection): %s%s", ix->host, ix->port, r->who,
              r->failures ? "reconnected" : "connected",
              reset ? "; index reset for this arena" : "");
    r->failures = 0;
    r->backoff_ms = ix->backoff_min_ms;
    r->retry_at_ms = 0;
    atomic_store_explicit(&c->st_redis_up, 1, memory_order_relaxed);
    if (r == &c->wr) atomic_store_explicit(&c->wr_retry_at_ms, 0, memory_order_relaxed);
    return 0;

io_fail:
    rconn_fail(c, r, what, ctx_error(c, ctx, ebuf, sizeof ebuf));
    return -1;
}

int rconn_ready(cache_t *c, rconn_t *r)
{
    if (r->ctx) return 0;
    if (sw_mono_ms() < r->retry_at_ms) return -1;
    return rconn_connect(c, r);
}

void rconn_ping(cache_t *c, rconn_t *r)
{
    if (rconn_ready(c, r)) return; /* down: rconn_fail has set redis_up 0 */
    char ebuf[160];
    redisReply *rep = redisCommand(r->ctx, "PING");
    if (!rep) {
        rconn_fail(c, r, "PING", ctx_error(c, r->ctx, ebuf, sizeof ebuf));
        return;
    }
    int ok = rep->type == REDIS_REPLY_STATUS;
    if (!ok) snprintf(ebuf, sizeof ebuf, "%s", rep->type == REDIS_REPLY_ERROR ? rep->str : "bad reply");
    freeReplyObject(rep);
    if (!ok) {
        rconn_fail(c, r, "PING", ebuf);
        return;
    }
    atomic_store_explicit(&c->st_redis_up, 1, memory_order_relaxed);
}

/* The index does not match our arena. When the arena is still ours, re-run init (resets the
 * index to this arena) and return 0 to retry; when another process re-initialised the arena,
 * this handle's mapping is stale: tier 2 off, -1. */
static int meta_mismatch(cache_t *c, rconn_t *r)
{
    if (!cache_tier2_usable(c)) return -1;
    CACHE_LOG(&c->log, SW_LOG_WARN,
              "redis index %s does not name this arena (flushed, or another arena's): resetting it",
              c->ix.keys[KEY_META]);
    const char **argv;
    size_t *al;
    int argc = build_argv(c, "EVAL", SRC_INIT, 0, NULL, NULL, &argv, &al);
    if (argc < 0) return -1;
    redisReply *rep = redisCommandArgv(r->ctx, argc, argv, al);
    free(argv);
    free(al);
    if (!rep) {
        char ebuf[160];
        rconn_fail(c, r, "init", ctx_error(c, r->ctx, ebuf, sizeof ebuf));
        return -1;
    }
    int bad = rep->type == REDIS_REPLY_ERROR;
    if (bad) rconn_fail(c, r, "init", rep->str);
    freeReplyObject(rep);
    return bad ? -1 : 0;
}

redisReply *rconn_script(cache_t *c, rconn_t *r, int script, int nargs, const char **args,
                         const size_t *lens)
{
    if (atomic_load_explicit(&c->stale, memory_order_relaxed)) return NULL;
    if (rconn_ready(c, r)) return NULL;
    const char **argv;
    size_t *al;
    int argc = build_argv(c, "EVALSHA", r->sha[script], nargs, args, lens, &argv, &al);
    if (argc < 0) return NULL;
    redisReply *rep = NULL;
    for (int attempt = 0; attempt < 3; attempt++) {
        rep = redisCommandArgv(r->ctx, argc, argv, al);
        if (!rep) {
            char ebuf[160];
            rconn_fail(c, r, SCRIPT_NAME[script], ctx_error(c, r->ctx, ebuf, sizeof ebuf));
            break;
        }
        if (rep->type != REDIS_REPLY_ERROR) break;
        if (!strncmp(rep->str, "NOSCRIPT", 8)) { /* SCRIPT FLUSH since we connected */
            argv[0] = "EVAL";
            al[0] = 4;
            argv[1] = SCRIPT_SRC[script];
            al[1] = strlen(SCRIPT_SRC[script]);
        } else if (strstr(rep->str, "SPILLWAY_META")) {
            if (meta_mismatch(c, r)) {
                freeReplyObject(rep);
                rep = NULL;
                break;
            }
        } else {
            rconn_fail(c, r, SCRIPT_NAME[script], rep->str);
            freeReplyObject(rep);
            rep = NULL;
            break;
        }
        freeReplyObject(rep);
        rep = NULL;
    }
    free(argv);
    free(al);
    return rep;
}

/* ---- cache_check ---- */

enum { SL_NONE, SL_FREE, SL_LRU };

static int parse_slot(const redisReply *e, uint32_t n_slots, uint32_t *slot)
{
    if (!e || e->type != REDIS_REPLY_STRING || !e->len || e->len > 10) return -1;
    char *end;
    unsigned long v = strtoul(e->str, &end, 10);
    if (*end || v >= n_slots) return -1;
    *slot = (uint32_t)v;
    return 0;
}

int index_check(cache_t *c, char *errstr, size_t errlen)
{
    uint32_t n = c->arena.n_slots;
    uint8_t *state = NULL;
    uint64_t *sgen = NULL, *sname = NULL;
    int32_t *owner = NULL;
    void *scratch = NULL;
    redisReply *rep = NULL;
    int rc = -1;
    snprintf(errstr, errlen, "check failed");
    if (!c->tier2) {
        snprintf(errstr, errlen, "tier 2 is off (no redis_host)");
        return -1;
    }
    if (atomic_load(&c->stale)) {
        snprintf(errstr, errlen, "arena re-initialised by another process: handle stale");
        return -1;
    }
    if (rconn_ready(c, &c->step)) {
        snprintf(errstr, errlen, "redis unavailable");
        return -1;
    }
    redisContext *ctx = c->step.ctx;
    const index_cfg_t *ix = &c->ix;
    /* One consistent snapshot of the index: MULTI ... EXEC, pipelined. */
    redisAppendCommand(ctx, "MULTI");
    redisAppendCommand(ctx, "HMGET %s n_slots arena", ix->keys[KEY_META]);
    redisAppendCommand(ctx, "LRANGE %s 0 -1", ix->keys[KEY_FREE]);
    redisAppendCommand(ctx, "ZRANGE %s 0 -1", ix->keys[KEY_LRU]);
    redisAppendCommand(ctx, "HGETALL %s", ix->keys[KEY_SNAME]);
    redisAppendCommand(ctx, "HGETALL %s", ix->keys[KEY_SGEN]);
    redisAppendCommand(ctx, "HGETALL %s", ix->keys[KEY_BLK]);
    redisAppendCommand(ctx, "EXEC");
    for (int i = 0; i < 8; i++) {
        void *v = NULL;
        if (redisGetReply(ctx, &v) != REDIS_OK) {
            char ebuf[160];
            snprintf(errstr, errlen, "redis: %s", ctx_error(c, ctx, ebuf, sizeof ebuf));
            rconn_fail(c, &c->step, "check", ebuf);
            goto out;
        }
        if (i < 7) {
            int err = ((redisReply *)v)->type == REDIS_REPLY_ERROR;
            if (err) snprintf(errstr, errlen, "redis: %s", ((redisReply *)v)->str);
            freeReplyObject(v);
            if (err) {
                /* drain the rest of the pipeline, then drop the connection */
                rconn_fail(c, &c->step, "check", errstr);
                goto out;
            }
        } else {
            rep = v;
        }
    }
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 6) {
        snprintf(errstr, errlen, "redis: EXEC returned no result");
        goto out;
    }
    redisReply *meta = rep->element[0], *fr = rep->element[1], *lru = rep->element[2],
               *snm = rep->element[3], *sg = rep->element[4], *blk = rep->element[5];
    if (meta->type != REDIS_REPLY_ARRAY || meta->elements != 2 ||
        meta->element[0]->type != REDIS_REPLY_STRING ||
        meta->element[1]->type != REDIS_REPLY_STRING ||
        strcmp(meta->element[0]->str, ix->n_slots) || strcmp(meta->element[1]->str, ix->arena_id)) {
        snprintf(errstr, errlen, "meta does not name this arena (%s slots, id %s)", ix->n_slots,
                 ix->arena_id);
        goto out;
    }
    state = calloc(n, 1);
    sgen = calloc(n, sizeof *sgen);
    sname = calloc(n, sizeof *sname);
    owner = malloc((size_t)n * sizeof *owner);
    scratch = malloc(c->arena.block_bytes + c->arena.meta_bytes);
    if (!state || !sgen || !sname || !owner || !scratch) {
        snprintf(errstr, errlen, "out of memory");
        goto out;
    }
    for (uint32_t s = 0; s < n; s++) owner[s] = -1;
    uint32_t slot;
    for (size_t i = 0; i < fr->elements; i++) {
        if (parse_slot(fr->element[i], n, &slot)) {
            snprintf(errstr, errlen, "free list entry %zu is not a slot", i);
            goto out;
        }
        if (state[slot]) {
            snprintf(errstr, errlen, "slot %u is on the free list twice", slot);
            goto out;
        }
        state[slot] = SL_FREE;
    }
    for (size_t i = 0; i < lru->elements; i++) {
        if (parse_slot(lru->element[i], n, &slot)) {
            snprintf(errstr, errlen, "LRU entry %zu is not a slot", i);
            goto out;
        }
        if (state[slot] == SL_FREE) {
            snprintf(errstr, errlen, "slot %u is both free and in the LRU", slot);
            goto out;
        }
        state[slot] = SL_LRU;
    }
    for (uint32_t s = 0; s < n; s++)
        if (state[s] == SL_NONE) {
            snprintf(errstr, errlen, "slot %u is neither free nor in the LRU (leaked)", s);
            goto out;
        }
    if (fr->elements + lru->elements != n) {
        snprintf(errstr, errlen, "free %zu + LRU %zu != %u slots", fr->elements, lru->elements, n);
        goto out;
    }
    for (size_t i = 0; i + 1 < sg->elements; i += 2) {
        if (parse_slot(sg->element[i], n, &slot)) {
            snprintf(errstr, errlen, "sgen field %s is not a slot", sg->element[i]->str);
            goto out;
        }
        sgen[slot] = strtoull(sg->element[i + 1]->str, NULL, 10);
    }
    for (size_t i = 0; i + 1 < snm->elements; i += 2) {
        if (parse_slot(snm->element[i], n, &slot)) {
            snprintf(errstr, errlen, "sname field %s is not a slot", snm->element[i]->str);
            goto out;
        }
        if (state[slot] != SL_LRU) {
            snprintf(errstr, errlen, "free slot %u has a name in sname", slot);
            goto out;
        }
        sname[slot] = strtoull(snm->element[i + 1]->str, NULL, 16);
    }
    for (size_t i = 0; i + 1 < blk->elements; i += 2) {
        const char *nm = blk->element[i]->str, *v = blk->element[i + 1]->str;
        char *end;
        uint64_t name = strtoull(nm, &end, 16);
        unsigned long long gen;
        unsigned long s;
        if (*end || sscanf(v, "%lu:%llu", &s, &gen) != 2 || s >= n) {
            snprintf(errstr, errlen, "blk entry %s -> %s is malformed", nm, v);
            goto out;
        }
        slot = (uint32_t)s;
        if (state[slot] != SL_LRU) {
            snprintf(errstr, errlen, "block %s points at free slot %u", nm, slot);
            goto out;
        }
        if (owner[slot] >= 0) {
            snprintf(errstr, errlen, "blocks %s and %s both point at slot %u",
                     blk->element[owner[slot]]->str, nm, slot);
            goto out;
        }
        owner[slot] = (int32_t)i;
        if (sgen[slot] != gen || sname[slot] != name) {
            snprintf(errstr, errlen, "block %s -> %s: slot %u has generation %llu, name %016llx",
                     nm, v, slot, (unsigned long long)sgen[slot], (unsigned long long)sname[slot]);
            goto out;
        }
        uint64_t hn, hg, seq;
        arena_peek(&c->arena, slot, &hn, &hg, &seq);
        if (hn != name || hg != gen || (seq & 1)) {
            snprintf(errstr, errlen,
                     "block %s -> %s: arena slot header holds name %016llx gen %llu seq %s", nm,
                     v, (unsigned long long)hn, (unsigned long long)hg, seq & 1 ? "odd" : "even");
            goto out;
        }
        if (arena_read(&c->arena, slot, name, gen, scratch,
                       (uint8_t *)scratch + c->arena.block_bytes)) {
            snprintf(errstr, errlen, "block %s -> %s: slot %u bytes do not match their checksum",
                     nm, v, slot);
            goto out;
        }
    }
    atomic_store_explicit(&c->st_arena_used, (int)lru->elements, memory_order_relaxed);
    rc = 0;
    if (errlen) errstr[0] = 0;
out:
    if (rep) freeReplyObject(rep);
    free(state);
    free(sgen);
    free(sname);
    free(owner);
    free(scratch);
    return rc;
}
