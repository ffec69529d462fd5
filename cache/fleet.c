/* cache/fleet.c: the fleet registry (which hosts of the group run this model, and where their
 * peer servers listen) and cache_locate (which of them holds how much of a prefix). The record
 * format and its limits are documented with cache_locate in cache.h; this file is their only
 * writer and reader.
 *
 * Threads: one registering thread per handle (fleet_t.reg, its own Redis connection) refreshes
 * the record every refresh_ms and at once when fleet_set_addr changes the address; cache_locate
 * runs on its caller's thread under fleet_t.lmu with fleet_t.loc. */
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache_internal.h"

/* register(host_id, record tail, prune_ms): sets host_id -> "v1 <now ms> <addr>" with Redis's
 * clock, deletes records older than prune_ms (or malformed), returns now. */
static const char SRC_REGISTER[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('HSET', KEYS[1], ARGV[1], 'v1 ' .. now .. ' ' .. ARGV[2])\n"
    "local all = redis.call('HGETALL', KEYS[1])\n"
    "for i = 1, #all, 2 do\n"
    "  local ts = tonumber(string.match(all[i + 1], '^v1 (%d+) '))\n"
    "  if not ts or now - ts > tonumber(ARGV[3]) then redis.call('HDEL', KEYS[1], all[i]) end\n"
    "end\n"
    "return now\n";

int fleet_token_ok(const char *s, size_t len, size_t max, int allow_empty)
{
    if (!s || len >= max || (!len && !allow_empty)) return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f) return 0;
    return 1;
}

/* Registering thread: one refresh. */
static void fleet_register(cache_t *c)
{
    fleet_t *f = &c->fleet;
    if (!cache_tier2_usable(c) || rconn_ready(c, &f->reg)) return;
    char addr[CACHE_PEER_ADDR_MAX], prune[24];
    pthread_mutex_lock(&f->mu);
    memcpy(addr, f->addr, sizeof addr);
    pthread_mutex_unlock(&f->mu);
    snprintf(prune, sizeof prune, "%lld", (long long)f->ttl_ms * 10);
    const char *argv[] = {"EVAL", SRC_REGISTER, "1", c->ix.fleet_key, c->ix.host_id, addr, prune};
    redisReply *r = redisCommandArgv(f->reg.ctx, 7, argv, NULL);
    if (!r) {
        rconn_fail(c, &f->reg, "fleet register",
                   f->reg.ctx->errstr[0] ? f->reg.ctx->errstr : "error");
        return;
    }
    if (r->type != REDIS_REPLY_INTEGER) {
        char e[160];
        snprintf(e, sizeof e, "%s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        freeReplyObject(r);
        rconn_fail(c, &f->reg, "fleet register", e);
        return;
    }
    freeReplyObject(r);
}

static void *fleet_main(void *arg)
{
    cache_t *c = arg;
    fleet_t *f = &c->fleet;
    pthread_mutex_lock(&f->mu);
    while (!f->stopping) {
        pthread_mutex_unlock(&f->mu);
        fleet_register(c);
        pthread_mutex_lock(&f->mu);
        if (f->stopping) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)f->refresh_ms * 1000000;
        ts.tv_sec += ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
    pthread_mutex_unlock(&f->mu);
    rconn_close(&f->reg);
    return NULL;
}

int fleet_start(cache_t *c, const cache_config_t *cfg, char *errstr, size_t errlen)
{
    fleet_t *f = &c->fleet;
    f->refresh_ms = cfg->fleet_refresh_ms > 0 ? cfg->fleet_refresh_ms : 1;
    f->ttl_ms = cfg->fleet_ttl_ms > 0 ? cfg->fleet_ttl_ms : 1;
    rconn_init(&f->reg, &c->ix, "fleet");
    rconn_init(&f->loc, &c->ix, "locate");
    const char *adv = cfg->peer_advertise ? cfg->peer_advertise : "";
    if (!fleet_token_ok(adv, strlen(adv), sizeof f->addr, 1)) {
        snprintf(errstr, errlen, "cache: peer address \"%.80s\" is not 0..%d printable "
                 "characters without spaces", adv, CACHE_PEER_ADDR_MAX - 1);
        return -1;
    }
    snprintf(f->addr, sizeof f->addr, "%s", adv);
    if (pthread_mutex_init(&f->mu, NULL)) goto oom;
    f->mu_init = 1;
    if (pthread_mutex_init(&f->lmu, NULL)) goto oom;
    f->lmu_init = 1;
    if (pthread_cond_init(&f->cv, NULL)) goto oom;
    f->cv_init = 1;
    if (!fleet_token_ok(c->ix.host_id, strlen(c->ix.host_id), CACHE_HOST_ID_MAX, 0)) {
        CACHE_LOG(&c->log, SW_LOG_WARN,
                  "host id \"%.80s\" is not 1..%d printable characters without spaces: this "
                  "host is not registered in the fleet (other hosts cannot locate its blocks)",
                  c->ix.host_id, CACHE_HOST_ID_MAX - 1);
        return 0;
    }
    int e = pthread_create(&f->thread, NULL, fleet_main, c);
    if (e) {
        snprintf(errstr, errlen, "cache: cannot start the fleet thread: %s", strerror(e));
        return -1;
    }
    f->started = 1;
    return 0;
oom:
    snprintf(errstr, errlen, "cache: out of memory");
    return -1;
}

void fleet_stop(cache_t *c)
{
    fleet_t *f = &c->fleet;
    if (f->started) {
        pthread_mutex_lock(&f->mu);
        f->stopping = 1;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->thread, NULL);
        f->started = 0;
    }
    rconn_close(&f->reg);
    rconn_close(&f->loc);
    if (f->cv_init) pthread_cond_destroy(&f->cv);
    if (f->lmu_init) pthread_mutex_destroy(&f->lmu);
    if (f->mu_init) pthread_mutex_destroy(&f->mu);
    f->cv_init = f->lmu_init = f->mu_init = 0;
    free(f->known);
    f->known = NULL;
    f->known_n = 0;
    f->known_at_ms = 0;
    free(f->hex);
    free(f->argv);
    free(f->argvlen);
    f->hex = NULL;
    f->argv = NULL;
    f->argvlen = NULL;
    f->cap = 0;
}

void fleet_set_addr(cache_t *c, const char *addr)
{
    fleet_t *f = &c->fleet;
    if (!f->mu_init) return;
    pthread_mutex_lock(&f->mu);
    snprintf(f->addr, sizeof f->addr, "%s", addr ? addr : "");
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

const char *cache_host_id(const cache_t *c) { return c->ix.host_id ? c->ix.host_id : ""; }

/* ---- cache_locate ---- */

/* Parses a registry value "v1 <ms> <addr>": 0 + *ms and addr, or -1 when malformed. */
static int parse_record(const redisReply *v, int64_t *ms, char *addr)
{
    if (!v || v->type != REDIS_REPLY_STRING || v->len < 5 || v->len > 64 + CACHE_PEER_ADDR_MAX ||
        memcmp(v->str, "v1 ", 3))
        return -1;
    const char *p = v->str + 3, *end = v->str + v->len;
    int64_t t = 0;
    int digits = 0;
    while (p < end && *p >= '0' && *p <= '9' && digits < 18) {
        t = t * 10 + (*p++ - '0');
        digits++;
    }
    if (!digits || p >= end || *p != ' ') return -1;
    p++;
    size_t alen = (size_t)(end - p);
    if (!fleet_token_ok(p, alen, CACHE_PEER_ADDR_MAX, 1)) return -1;
    memcpy(addr, p, alen);
    addr[alen] = 0;
    *ms = t;
    return 0;
}

/* A well-formed blk value: "<slot>:<gen>", decimal. */
static int blk_value_ok(const redisReply *v)
{
    if (!v || v->type != REDIS_REPLY_STRING || v->len < 3 || v->len > 40) return 0;
    int colon = 0;
    for (size_t i = 0; i < v->len; i++) {
        if (v->str[i] == ':') {
            if (colon++ || i == 0 || i + 1 == v->len) return 0;
        } else if (v->str[i] < '0' || v->str[i] > '9') {
            return 0;
        }
    }
    return colon == 1;
}

static int grow_locate(fleet_t *f, int n)
{
    if (n <= f->cap) return 0;
    int cap = f->cap ? f->cap : 64;
    while (cap < n) cap *= 2;
    char *hx = realloc(f->hex, (size_t)cap * 17);
    if (!hx) return -1;
    f->hex = hx;
    const char **av = realloc(f->argv, ((size_t)cap + 2) * sizeof *av);
    if (!av) return -1;
    f->argv = av;
    size_t *al = realloc(f->argvlen, ((size_t)cap + 2) * sizeof *al);
    if (!al) return -1;
    f->argvlen = al;
    f->cap = cap;
    return 0;
}

static int peer_cmp(const void *a, const void *b)
{
    const cache_peer_t *x = a, *y = b;
    if (x->n_blocks != y->n_blocks) return x->n_blocks > y->n_blocks ? -1 : 1;
    return (x->age_ms > y->age_ms) - (x->age_ms < y->age_ms);
}

/* Under lmu, connected. The live other hosts into *hosts (malloc'd, caller frees). Count, or
 * -1 after a connection failure (already handled). */
static int read_registry(cache_t *c, cache_peer_t **hosts)
{
    fleet_t *f = &c->fleet;
    redisContext *ctx = f->loc.ctx;
    redisReply *tr = NULL, *hr = NULL;
    *hosts = NULL;
    redisAppendCommand(ctx, "TIME");
    redisAppendCommand(ctx, "HGETALL %s", c->ix.fleet_key);
    void *v = NULL;
    if (redisGetReply(ctx, &v) != REDIS_OK) goto io_fail;
    tr = v;
    if (redisGetReply(ctx, &v) != REDIS_OK) goto io_fail;
    hr = v;
    if (tr->type != REDIS_REPLY_ARRAY || tr->elements != 2 ||
        tr->element[0]->type != REDIS_REPLY_STRING || hr->type != REDIS_REPLY_ARRAY ||
        hr->elements % 2) {
        freeReplyObject(tr);
        freeReplyObject(hr);
        rconn_fail(c, &f->loc, "locate", "unexpected reply to TIME/HGETALL");
        return -1;
    }
    int64_t now = strtoll(tr->element[0]->str, NULL, 10) * 1000;
    if (tr->element[1]->type == REDIS_REPLY_STRING)
        now += strtoll(tr->element[1]->str, NULL, 10) / 1000;
    size_t n_rec = hr->elements / 2;
    if (n_rec > CACHE_FLEET_MAX_HOSTS) {
        CACHE_LOG(&c->log, SW_LOG_DEBUG, "fleet %s: %zu records, reading the first %d",
                  c->ix.fleet_key, n_rec, CACHE_FLEET_MAX_HOSTS);
        n_rec = CACHE_FLEET_MAX_HOSTS;
    }
    cache_peer_t *h = calloc(n_rec ? n_rec : 1, sizeof *h);
    if (!h) {
        freeReplyObject(tr);
        freeReplyObject(hr);
        return 0;
    }
    int k = 0;
    for (size_t i = 0; i < n_rec; i++) {
        const redisReply *key = hr->element[2 * i], *val = hr->element[2 * i + 1];
        if (key->type != REDIS_REPLY_STRING ||
            !fleet_token_ok(key->str, key->len, CACHE_HOST_ID_MAX, 0)) {
            CACHE_LOG(&c->log, SW_LOG_DEBUG, "fleet %s: entry %zu has a bad host id: skipped",
                      c->ix.fleet_key, i);
            continue;
        }
        if (!strcmp(key->str, c->ix.host_id)) continue;
        int64_t ms;
        if (parse_record(val, &ms, h[k].peer_addr)) {
            CACHE_LOG(&c->log, SW_LOG_DEBUG, "fleet %s: host %s has a malformed record: skipped",
                      c->ix.fleet_key, key->str);
            continue;
        }
        int64_t age = now - ms;
        if (age > f->ttl_ms) continue;
        memcpy(h[k].host_id, key->str, key->len);
        h[k].host_id[key->len] = 0;
        h[k].age_ms = age < 0 ? 0 : age;
        k++;
    }
    freeReplyObject(tr);
    freeReplyObject(hr);
    *hosts = h;
    return k;

io_fail:
    if (tr) freeReplyObject(tr);
    rconn_fail(c, &f->loc, "locate", ctx->errstr[0] ? ctx->errstr : "error");
    return -1;
}

int cache_locate(cache_t *c, const uint64_t *names, int n, cache_peer_t *out, int max_out)
{
    return fleet_locate(c, names, n, out, max_out, 0, NULL);
}

/* The leading well-formed values of an HMGET reply of n fields. */
static int leading(const redisReply *r, int n)
{
    int lead = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == (size_t)n)
        while (lead < n && blk_value_ok(r->element[lead])) lead++;
    return lead;
}

int fleet_locate(cache_t *c, const uint64_t *names, int n, cache_peer_t *out, int max_out,
                 int serving_only, int *self_blocks)
{
    if (self_blocks) *self_blocks = 0;
    if (!c || n < 0 || max_out < 0 || (n && !names) || (max_out && !out)) return -1;
    fleet_t *f = &c->fleet;
    if (!f->lmu_init || !max_out || !cache_tier2_usable(c)) return 0;
    pthread_mutex_lock(&f->lmu);
    cache_peer_t *hosts = NULL;
    int k = 0;
    if (grow_locate(f, n) || rconn_ready(c, &f->loc)) goto out;
    int64_t now = sw_mono_ms();
    if (!f->known_at_ms || now - f->known_at_ms > f->refresh_ms / 2) {
        cache_peer_t *fresh = NULL;
        int m = read_registry(c, &fresh);
        if (m < 0) goto out;
        free(f->known);
        f->known = fresh;
        f->known_n = m;
        f->known_at_ms = now;
    }
    hosts = malloc(sizeof *hosts * (size_t)(f->known_n ? f->known_n : 1));
    if (!hosts) goto out;
    for (int i = 0; i < f->known_n; i++) {
        if (serving_only && !f->known[i].peer_addr[0]) continue;
        hosts[k] = f->known[i];
        hosts[k].age_ms += now - f->known_at_ms;
        hosts[k].n_blocks = 0;
        k++;
    }
    if (!k) goto out;
    if (n > 0) {
        redisContext *ctx = f->loc.ctx;
        char key[CACHE_HOST_ID_MAX + 256];
        for (int i = 0; i < n; i++) {
            snprintf(f->hex + (size_t)i * 17, 17, "%016" PRIx64, names[i]);
            f->argv[2 + i] = f->hex + (size_t)i * 17;
            f->argvlen[2 + i] = 16;
        }
        f->argv[0] = "HMGET";
        f->argvlen[0] = 5;
        for (int h = 0; h < k; h++) {
            snprintf(key, sizeof key, "%s:%s:%016" PRIx64 ":blk", c->ix.ns, hosts[h].host_id,
                     c->ix.seed);
            f->argv[1] = key;
            f->argvlen[1] = strlen(key);
            redisAppendCommandArgv(ctx, n + 2, f->argv, f->argvlen); /* copies the arguments */
        }
        if (self_blocks) {
            f->argv[1] = c->ix.keys[KEY_BLK];
            f->argvlen[1] = strlen(c->ix.keys[KEY_BLK]);
            redisAppendCommandArgv(ctx, n + 2, f->argv, f->argvlen);
        }
        for (int h = 0; h < k + (self_blocks != NULL); h++) {
            void *v = NULL;
            if (redisGetReply(ctx, &v) != REDIS_OK) {
                rconn_fail(c, &f->loc, "locate", ctx->errstr[0] ? ctx->errstr : "error");
                k = 0;
                goto out;
            }
            redisReply *r = v;
            if (h < k) hosts[h].n_blocks = leading(r, n);
            else *self_blocks = leading(r, n);
            freeReplyObject(r);
        }
    }
    qsort(hosts, (size_t)k, sizeof *hosts, peer_cmp);
    if (k > max_out) k = max_out;
    memcpy(out, hosts, (size_t)k * sizeof *out);
out:
    pthread_mutex_unlock(&f->lmu);
    free(hosts);
    return k;
}
