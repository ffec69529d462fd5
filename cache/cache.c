/* cache/cache.c: the tier-2 handle: construction, the step-thread calls (lookup, fetch, store
 * offers), the writer thread that writes offered blocks into the arena and indexes them, stats
 * and logging. The arena is in arena.c, the Redis index in index.c.
 *
 * Threads and locks: the step thread owns c->step, the found arrays and the argument scratch;
 * the writer thread owns c->wr; c->mu guards the buffer pool (free_stack), the fifo and
 * stopping; c->recent and the stats are atomics. A buffer is owned by exactly one of: the free
 * stack, the step thread (from store_begin to store_commit or store_cancel), the fifo, the
 * writer. */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/cache_internal.h"

void cache_config_default(cache_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->arena_path = ""; /* the per-user default (see cache.h) */
    c->secret_path = ""; /* the per-user default (see cache.h) */
    c->arena_mb = 1024;
    c->redis_host = "";
    c->redis_port = 6379;
    c->redis_user = "";
    c->redis_password = "";
    c->redis_db = 0;
    c->namespace_ = "spillway";
    c->host_id = "";
    c->connect_timeout_ms = 200;
    c->cmd_timeout_ms = 50;
    c->backoff_min_ms = 100;
    c->backoff_max_ms = 5000;
    c->health_ms = 1000;
    c->write_queue = 64;
    c->peer_advertise = "";
    c->fleet_refresh_ms = 2000;
    c->fleet_ttl_ms = 10000;
    c->peer_listen = "";
    c->peer_secret = NULL;
    c->peer_timeout_ms = 2000;
    c->peer_bandwidth_mbps = 1000;
    c->peer_rtt_us = 1000;
    c->prefill_tps = 2000;
    c->log_level = SW_LOG_INFO;
    c->log_fn = NULL;
    c->log_arg = NULL;
}

/* ---- logging and time ---- */

static const char *const LEVEL_NAME[4] = {"error", "warn", "info", "debug"};

void cache_log_emit(const cache_log_t *log, int level, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (log->fn)
        log->fn(log->arg, level, buf);
    else
        fprintf(stderr, "spillway cache %s: %s\n", LEVEL_NAME[level & 3], buf);
}

/* ---- names known to be indexed (or being stored) by this process ---- */

static _Atomic uint64_t *recent_entry(cache_t *c, uint64_t name)
{
    return &c->recent[(name ^ (name >> 29)) & (CACHE_RECENT - 1)];
}

static int recent_has(cache_t *c, uint64_t name)
{
    return name && atomic_load_explicit(recent_entry(c, name), memory_order_relaxed) == name;
}

static void recent_add(cache_t *c, uint64_t name)
{
    if (name) atomic_store_explicit(recent_entry(c, name), name, memory_order_relaxed);
}

/* Any thread: forgets name if it is still the entry's occupant. */
static void recent_forget(cache_t *c, uint64_t name)
{
    uint64_t expect = name;
    if (name)
        atomic_compare_exchange_strong_explicit(recent_entry(c, name), &expect, 0,
                                                memory_order_relaxed, memory_order_relaxed);
}

static void hex16(char *out, uint64_t v) { snprintf(out, 17, "%016" PRIx64, v); }

/* ---- writer thread ---- */

static void drop(cache_t *c, uint64_t name)
{
    atomic_fetch_add_explicit(&c->st_dropped, 1, memory_order_relaxed);
    recent_forget(c, name);
}

static void note_free(cache_t *c, long long n_free)
{
    if (n_free >= 0 && n_free <= c->arena.n_slots)
        atomic_store_explicit(&c->st_arena_used, (int)(c->arena.n_slots - n_free),
                              memory_order_relaxed);
}

/* All replies of the scripts are arrays of integers; n the least number of elements. */
static int int_array(const redisReply *r, size_t n)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < n) return 0;
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type != REDIS_REPLY_INTEGER) return 0;
    return 1;
}

/* The thread that owns r: alloc a slot, write it under the seqlock, commit it to the index. */
int cache_write_block(cache_t *c, rconn_t *rc, uint64_t name, const void *buf)
{
    char nm[17], sl[16], gn[24];
    hex16(nm, name);
    const char *args[3] = {nm, sl, gn};
    redisReply *r = rconn_script(c, rc, SCRIPT_ALLOC, 1, args, NULL);
    if (!r) {
        drop(c, name);
        return -1;
    }
    if (!int_array(r, 1) || (r->element[0]->integer >= 0 && r->elements != 4)) {
        freeReplyObject(r);
        rconn_fail(c, rc, "alloc", "unexpected reply");
        drop(c, name);
        return -1;
    }
    long long slot = r->element[0]->integer;
    if (slot < 0) { /* -1: indexed already (not a drop); -2: no slot */
        freeReplyObject(r);
        if (slot != -1) drop(c, name);
        return slot == -1 ? 0 : -1;
    }
    uint64_t gen = (uint64_t)r->element[1]->integer;
    if (r->element[2]->integer)
        atomic_fetch_add_explicit(&c->st_evictions, 1, memory_order_relaxed);
    note_free(c, r->element[3]->integer);
    freeReplyObject(r);
    if (slot >= c->arena.n_slots) {
        rconn_fail(c, rc, "alloc", "slot out of range");
        drop(c, name);
        return -1;
    }
    snprintf(sl, sizeof sl, "%lld", slot);
    snprintf(gn, sizeof gn, "%" PRIu64, gen);
    int w = arena_write(&c->arena, (uint32_t)slot, name, gen, buf,
                        (const uint8_t *)buf + c->arena.block_bytes);
    if (w != ARENA_OK) {
        CACHE_LOG(&c->log, SW_LOG_DEBUG, "store %s: slot %lld %s", nm, slot,
                  w == ARENA_BUSY ? "busy (another writer)"
                                    : "taken over, or written by a later allocation");
        if (w == ARENA_BUSY) { /* nothing written: give the slot back */
            r = rconn_script(c, rc, SCRIPT_RELEASE, 2, args + 1, NULL);
            if (r) freeReplyObject(r);
        }
        drop(c, name);
        return -1;
    }
    r = rconn_script(c, rc, SCRIPT_COMMIT, 3, args, NULL);
    if (!r) {
        drop(c, name);
        return -1;
    }
    if (!int_array(r, 2)) {
        freeReplyObject(r);
        rconn_fail(c, rc, "commit", "unexpected reply");
        drop(c, name);
        return -1;
    }
    long long res = r->element[0]->integer;
    note_free(c, r->element[1]->integer);
    freeReplyObject(r);
    if (res == 1) {
        atomic_fetch_add_explicit(&c->st_stores, 1, memory_order_relaxed);
    } else if (res == 2) { /* another process indexed it first: it is indexed, ours is freed */
        atomic_fetch_add_explicit(&c->st_dropped, 1, memory_order_relaxed);
    } else { /* slot re-allocated before the commit */
        drop(c, name);
        return -1;
    }
    return 0;
}

static void *writer_main(void *arg)
{
    cache_t *c = arg;
    /* a write to a socket the server closed must fail with EPIPE, not kill the process */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* background work: on a host whose cores all compute, the writer takes what they leave
     * (Linux: a thread's nice value is its own; failure only costs throughput) */
    if (setpriority(PRIO_PROCESS, (id_t)gettid(), 10) != 0)
        CACHE_LOG(&c->log, SW_LOG_DEBUG, "writer thread: setpriority: %s", strerror(errno));
    pthread_mutex_lock(&c->mu);
    int64_t next_ping = sw_mono_ms() + c->ix.health_ms;
    for (;;) {
        while (!c->fifo_len && !c->stopping) {
            if (!c->ix.health_ms) {
                pthread_cond_wait(&c->cv, &c->mu);
                continue;
            }
            int64_t now = sw_mono_ms();
            if (now >= next_ping) { /* idle: keep redis_up current (and reconnect) */
                pthread_mutex_unlock(&c->mu);
                if (cache_tier2_usable(c)) rconn_ping(c, &c->wr);
                pthread_mutex_lock(&c->mu);
                next_ping = sw_mono_ms() + c->ix.health_ms;
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            int64_t ns = ts.tv_nsec + (next_ping - now) * 1000000;
            ts.tv_sec += ns / 1000000000;
            ts.tv_nsec = ns % 1000000000;
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        if (!c->fifo_len) break; /* stopping and drained */
        next_ping = sw_mono_ms() + c->ix.health_ms;
        int idx = c->fifo[c->fifo_head];
        c->fifo_head = (c->fifo_head + 1) % c->n_bufs;
        c->fifo_len--;
        pthread_mutex_unlock(&c->mu);
        uint64_t name = c->job_name[idx];
        if (!cache_tier2_usable(c))
            drop(c, name);
        else
            (void)cache_write_block(c, &c->wr, name, c->pool + (size_t)idx * c->buf_stride);
        pthread_mutex_lock(&c->mu);
        c->free_stack[c->n_free++] = idx;
    }
    pthread_mutex_unlock(&c->mu);
    rconn_close(&c->wr);
    return NULL;
}

/* ---- construction ---- */

cache_t *cache_new(const cache_config_t *cfg, const cache_geometry_t *geo, char *errstr,
                   size_t errlen)
{
    if (errlen) errstr[0] = 0;
    if (!cfg || !geo) {
        snprintf(errstr, errlen, "cache: no configuration or geometry");
        return NULL;
    }
    cache_t *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(errstr, errlen, "cache: out of memory");
        return NULL;
    }
    c->arena.fd = -1;
    c->log.level = cfg->log_level;
    c->log.fn = cfg->log_fn;
    c->log.arg = cfg->log_arg;
    int arc = arena_open(&c->arena, cfg->arena_path, cfg->arena_mb, geo, &c->log, errstr,
                         errlen);
    if (arc == -2) {
        /* a file or folder we do not trust: serve without tier 2 rather than stop */
        CACHE_LOG(&c->log, SW_LOG_ERROR, "%s; tier 2 off, serving from tier 1 only", errstr);
        if (errlen) errstr[0] = 0;
        c->arena_refused = 1;
        atomic_store(&c->st_arena_used, -1);
        return c;
    }
    if (arc) goto fail;
    if (index_cfg_init(&c->ix, cfg, geo, c->arena.id, c->arena.n_slots)) goto oom;
    c->tier2 = cfg->redis_host && *cfg->redis_host;
    rconn_init(&c->step, &c->ix, "step");
    rconn_init(&c->wr, &c->ix, "writer");
    atomic_store(&c->st_arena_used, -1);
    if (!c->tier2) {
        CACHE_LOG(&c->log, SW_LOG_INFO, "no redis_host: tier 2 off (arena mapped, unused)");
        return c;
    }

    c->n_bufs = cfg->write_queue > 0 ? cfg->write_queue : 1;
    c->buf_stride = (c->arena.block_bytes + c->arena.meta_bytes + 63) / 64 * 64;
    c->pool = aligned_alloc(64, c->buf_stride * (size_t)c->n_bufs);
    c->job_name = calloc((size_t)c->n_bufs, sizeof *c->job_name);
    c->free_stack = malloc((size_t)c->n_bufs * sizeof *c->free_stack);
    c->fifo = malloc((size_t)c->n_bufs * sizeof *c->fifo);
    c->meta_stage = malloc(c->arena.meta_bytes);
    if (!c->pool || !c->job_name || !c->free_stack || !c->fifo || !c->meta_stage) goto oom;
    for (int i = 0; i < c->n_bufs; i++) c->free_stack[i] = c->n_bufs - 1 - i;
    c->n_free = c->n_bufs;
    if (pthread_mutex_init(&c->mu, NULL)) goto oom;
    c->mu_init = 1;
    if (pthread_cond_init(&c->cv, NULL)) goto oom;
    c->cv_init = 1;
    int perr = pthread_create(&c->writer, NULL, writer_main, c);
    if (perr) {
        snprintf(errstr, errlen, "cache: cannot start the writer thread: %s", strerror(perr));
        goto fail;
    }
    c->writer_started = 1;
    if (fleet_start(c, cfg, errstr, errlen)) goto fail;
    if (peer_start(c, cfg, errstr, errlen)) goto fail;
    (void)rconn_ready(c, &c->step); /* a failure is retried with backoff */
    return c;

oom:
    snprintf(errstr, errlen, "cache: out of memory");
fail:
    if (errlen && !errstr[0]) snprintf(errstr, errlen, "cache: cannot start");
    cache_free(c);
    return NULL;
}

void cache_free(cache_t *c)
{
    if (!c) return;
    peer_stop(c); /* its server thread calls into the fleet */
    fleet_stop(c);
    if (c->writer_started) {
        pthread_mutex_lock(&c->mu);
        c->stopping = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->writer, NULL);
    }
    rconn_close(&c->wr);
    rconn_close(&c->step);
    if (c->cv_init) pthread_cond_destroy(&c->cv);
    if (c->mu_init) pthread_mutex_destroy(&c->mu);
    free(c->pool);
    free(c->job_name);
    free(c->free_stack);
    free(c->fifo);
    free(c->meta_stage);
    free(c->found_name);
    free(c->found_gen);
    free(c->found_slot);
    free(c->arg_hex);
    free(c->argv);
    free(c->argvlen);
    index_cfg_free(&c->ix);
    arena_close(&c->arena);
    free(c);
}

/* ---- step thread ---- */

/* Any thread. 0 when tier 2 is off or this handle's arena mapping went stale: another process
 * re-initialised the arena (other model or geometry) since we attached; checked at every call
 * (two loads from the mapped header) so a stale handle neither reads nor writes slots. */
int cache_tier2_usable(cache_t *c)
{
    if (!c->tier2 || atomic_load_explicit(&c->stale, memory_order_relaxed)) return 0;
    if (arena_still_ours(&c->arena)) return 1;
    if (!atomic_exchange(&c->stale, 1))
        CACHE_LOG(&c->log, SW_LOG_WARN,
                  "arena %s was re-initialised by another process (other model or geometry?): "
                  "tier 2 off for this handle", c->arena.path);
    return 0;
}

/* Grows the step thread's scratch to n names. 0, or -1 out of memory (arrays kept valid). */
static int grow_scratch(cache_t *c, int n)
{
    if (n <= c->cap_found) return 0;
    int cap = c->cap_found ? c->cap_found : 16;
    while (cap < n) cap *= 2;
    uint64_t *fn = realloc(c->found_name, (size_t)cap * sizeof *fn);
    if (!fn) return -1;
    c->found_name = fn;
    uint64_t *fg = realloc(c->found_gen, (size_t)cap * sizeof *fg);
    if (!fg) return -1;
    c->found_gen = fg;
    uint32_t *fs = realloc(c->found_slot, (size_t)cap * sizeof *fs);
    if (!fs) return -1;
    c->found_slot = fs;
    char *hx = realloc(c->arg_hex, (size_t)cap * 17);
    if (!hx) return -1;
    c->arg_hex = hx;
    const char **av = realloc(c->argv, (size_t)cap * sizeof *av);
    if (!av) return -1;
    c->argv = av;
    size_t *al = realloc(c->argvlen, (size_t)cap * sizeof *al);
    if (!al) return -1;
    c->argvlen = al;
    c->cap_found = cap;
    return 0;
}

int cache_lookup(cache_t *c, const uint64_t *names, int n)
{
    c->n_found = 0;
    if (n <= 0) return 0;
    atomic_fetch_add_explicit(&c->st_lookups, (uint64_t)n, memory_order_relaxed);
    if (!cache_tier2_usable(c) || grow_scratch(c, n)) return 0;
    for (int i = 0; i < n; i++) {
        hex16(c->arg_hex + (size_t)i * 17, names[i]);
        c->argv[i] = c->arg_hex + (size_t)i * 17;
        c->argvlen[i] = 16;
    }
    redisReply *r = rconn_script(c, &c->step, SCRIPT_LOOKUP, n, c->argv, c->argvlen);
    if (!r) return 0;
    if (!int_array(r, 1) || r->elements % 2 != 1 || (int)(r->elements / 2) > n) {
        freeReplyObject(r);
        rconn_fail(c, &c->step, "lookup", "unexpected reply");
        return 0;
    }
    note_free(c, r->element[0]->integer);
    int k = (int)(r->elements / 2);
    for (int i = 0; i < k; i++) {
        long long slot = r->element[1 + 2 * i]->integer;
        if (slot < 0 || slot >= c->arena.n_slots) {
            k = i;
            break;
        }
        c->found_slot[i] = (uint32_t)slot;
        c->found_gen[i] = (uint64_t)r->element[2 + 2 * i]->integer;
        c->found_name[i] = names[i];
        recent_add(c, names[i]);
    }
    freeReplyObject(r);
    for (int i = k; i < n; i++) /* not (or not reachably) indexed: may be offered again */
        recent_forget(c, names[i]);
    c->n_found = k;
    return k;
}

int cache_fetch(cache_t *c, int i, void *dst, uint64_t *parent, int32_t *tokens)
{
    if (i < 0 || i >= c->n_found) return -1;
    if (!cache_tier2_usable(c) || arena_read(&c->arena, c->found_slot[i], c->found_name[i],
                                             c->found_gen[i], dst, c->meta_stage)) {
        atomic_fetch_add_explicit(&c->st_misses_torn, 1, memory_order_relaxed);
        return -1;
    }
    memcpy(parent, c->meta_stage, sizeof *parent);
    memcpy(tokens, c->meta_stage + sizeof *parent, c->arena.meta_bytes - sizeof *parent);
    atomic_fetch_add_explicit(&c->st_hits, 1, memory_order_relaxed);
    return 0;
}

void *cache_store_begin(cache_t *c, uint64_t name, uint64_t parent, const int32_t *tokens)
{
    if (!cache_tier2_usable(c) || recent_has(c, name)) return NULL;
    /* Redis known down: the writer's connection, or the step thread's own (same server) */
    int64_t now = sw_mono_ms();
    int64_t wr_retry = atomic_load_explicit(&c->wr_retry_at_ms, memory_order_relaxed);
    if ((wr_retry && now < wr_retry) || (!c->step.ctx && now < c->step.retry_at_ms)) {
        atomic_fetch_add_explicit(&c->st_dropped, 1, memory_order_relaxed);
        return NULL;
    }
    int idx = -1;
    pthread_mutex_lock(&c->mu);
    if (c->n_free) idx = c->free_stack[--c->n_free];
    pthread_mutex_unlock(&c->mu);
    if (idx < 0) { /* queue full */
        atomic_fetch_add_explicit(&c->st_dropped, 1, memory_order_relaxed);
        return NULL;
    }
    c->job_name[idx] = name;
    recent_add(c, name);
    uint8_t *buf = c->pool + (size_t)idx * c->buf_stride;
    memcpy(buf + c->arena.block_bytes, &parent, sizeof parent);
    memcpy(buf + c->arena.block_bytes + sizeof parent, tokens,
           c->arena.meta_bytes - sizeof parent);
    return buf;
}

/* The pool index of a buffer from cache_store_begin, or -1 when buf is not one (a caller bug,
 * then ignored). */
static int buf_index(const cache_t *c, const void *buf)
{
    if (!buf || !c->pool) return -1;
    uintptr_t p = (uintptr_t)buf, base = (uintptr_t)c->pool;
    if (p < base) return -1;
    size_t off = p - base;
    if (off % c->buf_stride || off / c->buf_stride >= (size_t)c->n_bufs) return -1;
    return (int)(off / c->buf_stride);
}

void cache_store_cancel(cache_t *c, void *buf)
{
    int idx = buf_index(c, buf);
    if (idx < 0) return;
    recent_forget(c, c->job_name[idx]); /* not stored: may be offered again */
    pthread_mutex_lock(&c->mu);
    c->free_stack[c->n_free++] = idx;
    pthread_mutex_unlock(&c->mu);
}

void cache_store_commit(cache_t *c, void *buf)
{
    int idx = buf_index(c, buf);
    if (idx < 0) return;
    pthread_mutex_lock(&c->mu);
    c->fifo[(c->fifo_head + c->fifo_len) % c->n_bufs] = idx;
    c->fifo_len++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void cache_stats(cache_t *c, cache_stats_t *st)
{
    memset(st, 0, sizeof *st);
    st->lookups = atomic_load_explicit(&c->st_lookups, memory_order_relaxed);
    st->hits = atomic_load_explicit(&c->st_hits, memory_order_relaxed);
    st->misses_torn = atomic_load_explicit(&c->st_misses_torn, memory_order_relaxed);
    st->stores = atomic_load_explicit(&c->st_stores, memory_order_relaxed);
    st->stores_dropped = atomic_load_explicit(&c->st_dropped, memory_order_relaxed);
    st->evictions = atomic_load_explicit(&c->st_evictions, memory_order_relaxed);
    st->redis_errors = atomic_load_explicit(&c->st_redis_errors, memory_order_relaxed);
    st->redis_up = atomic_load_explicit(&c->st_redis_up, memory_order_relaxed);
    st->arena_slots = (int)c->arena.n_slots;
    st->arena_used = atomic_load_explicit(&c->st_arena_used, memory_order_relaxed);
    st->arena_refused = c->arena_refused;
    st->peer_fetches = atomic_load_explicit(&c->st_peer_fetches, memory_order_relaxed);
    st->peer_blocks = atomic_load_explicit(&c->st_peer_blocks, memory_order_relaxed);
    st->peer_bytes = atomic_load_explicit(&c->st_peer_bytes, memory_order_relaxed);
    st->peer_recompute = atomic_load_explicit(&c->st_peer_recompute, memory_order_relaxed);
    for (int i = 0; i < 6; i++)
        st->peer_fail[i] = atomic_load_explicit(&c->st_peer_fail[i], memory_order_relaxed);
    st->peer_served = atomic_load_explicit(&c->st_peer_served, memory_order_relaxed);
    st->peer_refused = atomic_load_explicit(&c->st_peer_refused, memory_order_relaxed);
    if (c->peer.rmu_init) {
        pthread_mutex_lock(&c->peer.rmu);
        st->peer_prefill_tps = c->peer.prefill_tps;
        pthread_mutex_unlock(&c->peer.rmu);
    }
}

int cache_check(cache_t *c, char *errstr, size_t errlen)
{
    return index_check(c, errstr, errlen);
}
