/* worker/forward.c: forwarding: a worker hands a request it holds to another worker of its group
 * through forward.topic, a topic the whole group consumes besides the input topics (README
 * "Forwarding"). Two triggers, both decided at intake before the request enters the engine:
 *   overload  this worker has been over its forwarding budget (forward.overload.pct of its
 *             in-flight limits) for forward.overload.ms: the request goes to the least loaded
 *             worker that has room under its own budget;
 *   affinity  another host's tier-2 index holds at least forward.affinity.min_blocks more of
 *             the request's leading KV blocks than this host's: the request goes to the least
 *             loaded worker of that host that has room.
 * The forwarded record is the original one (key, value, headers, timestamp) to a partition of
 * forward.topic that the target owns, plus the hop headers (__spillway.hop "1", .hop.from
 * "TOPIC[PARTITION]@OFFSET", .hop.reason, .hop.worker); a record that came through
 * forward.topic is always served where it lands: one hop at most. It is an output like a
 * result: at-least-once acks the input offset after its delivery report, exactly-once produces
 * it in the transaction that commits the input offset (worker/output.c).
 *
 * Ownership registry (Redis, the tier-2 server): hash "<namespace>:fwd:<group>:<forward.topic>",
 * field worker.id, value "1 MS LOAD ROOM HOST PARTS": Redis's clock (ms) at the write, the
 * load (percent of the fuller in-flight limit), room (messages it takes before its budget),
 * cache.host_id (or the host name) and its forward.topic partitions now (comma-separated, "-"
 * none). Each worker rewrites its entry every forward.registry.ttl_ms / 3 and when its
 * assignment of forward.topic changes, and reads everyone's in the same round trip. An entry
 * older than the ttl (or unreadable) is ignored: no fresh entry, no forward. Entries older than
 * 10 ttls are deleted by the reader (workers killed or renamed); the hash expires 10 ttls after
 * its last write. Everything read from Redis is checked before use.
 *
 * Threads: all on the poll thread except wfwd_render (atomics). */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "worker/worker_int.h"

#define FWD_MAX_PEERS 256
#define FWD_MAX_PARTS 64
#define FWD_MAX_BLOCKS 4096

static const char *const FWD_REASON[2] = {"overload", "affinity"};

typedef struct {
    char id[128];                /* worker.id */
    char host[128];
    int64_t at_ms;               /* Redis's clock (ms) at the entry's write */
    int load, room;              /* room: decremented by each forward sent to it here */
    int n_parts;
    int32_t parts[FWD_MAX_PARTS];
} fwd_peer_t;

struct wfwd {
    redisContext *rc;            /* NULL: not connected */
    int64_t retry_at_ms;         /* monotonic: next connection attempt */
    int backoff_ms;
    char key[512];               /* the registry hash */
    char host[128];              /* this host's id */
    int64_t next_pub_ms;         /* monotonic: next publication */
    int32_t mine[FWD_MAX_PARTS]; /* forward.topic partitions in the last publication */
    int n_mine;
    fwd_peer_t *peers;           /* [FWD_MAX_PEERS] from the last read */
    int n_peers;
    int bad_entries;             /* malformed entries at the last read (logged when it changes) */
    int64_t clock_off_ms;        /* Redis's clock minus wall_ms() at the last sync */
    int64_t over_since_ms;       /* monotonic: over the budget since; 0 = not over */
    unsigned rr;                 /* round robin over a target's partitions */
    int64_t log_sec;             /* the second of the log rate limit ... */
    int log_n;                   /* ... lines logged in it */
    uint64_t log_skipped;        /* lines not logged since the last one */
    uint64_t *names;             /* [FWD_MAX_BLOCKS] block names of the request at hand */
};

int wfwd_new(worker_t *w, char *errstr, size_t errlen)
{
    if (!*w->cfg.forward_topic) return 0;
    struct wfwd *f = calloc(1, sizeof *f);
    if (!f || !(f->peers = calloc(FWD_MAX_PEERS, sizeof *f->peers)) ||
        !(f->names = malloc(sizeof *f->names * FWD_MAX_BLOCKS))) {
        if (f) free(f->peers);
        free(f);
        snprintf(errstr, errlen, "out of memory");
        return -1;
    }
    /* the host as tier 2 names it (cache_locate reports hosts by that name) */
    const char *hid = "";
    for (const wmodel_t *m = w->models; m && !*hid; m = m->next)
        if (m->cache) hid = cache_host_id(m->cache);
    if (*hid) {
        snprintf(f->host, sizeof f->host, "%s", hid);
    } else if (*w->cfg.cache_host_id) {
        snprintf(f->host, sizeof f->host, "%s", w->cfg.cache_host_id);
    } else if (gethostname(f->host, sizeof f->host - 1)) {
        snprintf(f->host, sizeof f->host, "host");
    }
    for (char *p = f->host; *p; p++) /* the entry is space-separated */
        if (*p == ' ' || *p == '\t' || *p == '\n') *p = '_';
    snprintf(f->key, sizeof f->key, "%s:fwd:%s:%s", w->cfg.cache_namespace, w->cfg.group_id,
             w->cfg.forward_topic);
    f->backoff_ms = w->cfg.cache_backoff_min_ms;
    w->fwd = f;
    return 0;
}

static struct timeval ms_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

static void redis_drop(worker_t *w, const char *what)
{
    struct wfwd *f = w->fwd;
    atomic_fetch_add(&w->st.fwd_registry_errors, 1);
    wlog(w, SW_LOG_WARN, "forward registry: %s: %s (no forwarding until it answers)", what,
         f->rc && f->rc->err ? f->rc->errstr : "bad reply");
    if (f->rc) redisFree(f->rc);
    f->rc = NULL;
    f->n_peers = 0; /* what we knew may be stale by the time we reconnect */
    atomic_store(&w->st.fwd_peers, 0);
    f->retry_at_ms = mono_ms() + f->backoff_ms;
    f->backoff_ms = f->backoff_ms * 2 < w->cfg.cache_backoff_max_ms ? f->backoff_ms * 2
                                                                   : w->cfg.cache_backoff_max_ms;
}

/* Connects (AUTH, SELECT) when due. 0 when connected. */
static int redis_up(worker_t *w)
{
    struct wfwd *f = w->fwd;
    if (f->rc) return 0;
    if (mono_ms() < f->retry_at_ms) return -1;
    f->rc = redisConnectWithTimeout(w->cfg.cache_redis_host, w->cfg.cache_redis_port,
                                    ms_tv(w->cfg.cache_connect_timeout_ms));
    if (!f->rc || f->rc->err) {
        redis_drop(w, "connect");
        return -1;
    }
    redisSetTimeout(f->rc, ms_tv(w->cfg.cache_cmd_timeout_ms));
    int n = 0;
    if (*w->cfg.cache_redis_password) {
        if (*w->cfg.cache_redis_user)
            redisAppendCommand(f->rc, "AUTH %s %s", w->cfg.cache_redis_user,
                               w->cfg.cache_redis_password);
        else
            redisAppendCommand(f->rc, "AUTH %s", w->cfg.cache_redis_password);
        n++;
    }
    if (w->cfg.cache_redis_db) {
        redisAppendCommand(f->rc, "SELECT %d", w->cfg.cache_redis_db);
        n++;
    }
    for (int i = 0; i < n; i++) {
        redisReply *rep = NULL;
        int bad = redisGetReply(f->rc, (void **)&rep) != REDIS_OK || !rep ||
                  rep->type == REDIS_REPLY_ERROR;
        if (rep) freeReplyObject(rep);
        if (bad) {
            redis_drop(w, "AUTH/SELECT");
            return -1;
        }
    }
    f->backoff_ms = w->cfg.cache_backoff_min_ms;
    return 0;
}

/* This worker's load in percent of the fuller in-flight limit, and its room: messages it takes
 * before its forwarding budget (forward.overload.pct, or 100 when overload forwarding is off). */
static void own_load(worker_t *w, int pending, int *load, int *room)
{
    /* doubles: the limits may be as large as LONG_MAX */
    double lm = 100.0 * pending / w->cfg.max_inflight;
    double lt = 100.0 * (double)(w->inflight_tokens > 0 ? w->inflight_tokens : 0) /
                (double)w->cfg.max_inflight_tokens;
    double l = lm > lt ? lm : lt;
    *load = l > 100000 ? 100000 : (int)l;
    int pct = w->cfg.forward_overload_pct > 0 ? w->cfg.forward_overload_pct : 100;
    long budget = (long)w->cfg.max_inflight * pct / 100;
    long r = budget - pending;
    if (*load >= pct) r = 0; /* the token limit is the fuller one */
    *room = r < 0 ? 0 : r > 1000000 ? 1000000 : (int)r;
}

/* Parses one registry entry (untrusted). 0, or -1 when it is malformed. */
static int parse_entry(fwd_peer_t *p, const char *id, size_t id_len, const char *v, size_t len)
{
    if (!id_len || id_len >= sizeof p->id || memchr(id, 0, id_len) || len > 4096) return -1;
    memcpy(p->id, id, id_len);
    p->id[id_len] = 0;
    char buf[4097];
    memcpy(buf, v, len);
    buf[len] = 0;
    if (strlen(buf) != len || len < 2 || memcmp(buf, "1 ", 2)) return -1; /* version 1 */
    long long at;
    int load, room, off = 0;
    char host[128], parts[4097];
    if (sscanf(buf + 2, "%lld %d %d %127s %4096s%n", &at, &load, &room, host, parts, &off) != 5 ||
        (size_t)off != len - 2 || at <= 0 || load < 0 || room < 0)
        return -1;
    p->at_ms = at;
    p->load = load;
    p->room = room;
    snprintf(p->host, sizeof p->host, "%s", host);
    p->n_parts = 0;
    if (!strcmp(parts, "-")) return 0;
    for (char *s = parts; *s;) {
        char *e;
        errno = 0;
        long x = strtol(s, &e, 10);
        if (e == s || errno || x < 0 || x > INT32_MAX || (*e && *e != ',')) return -1;
        if (p->n_parts < FWD_MAX_PARTS) p->parts[p->n_parts++] = (int32_t)x;
        s = *e ? e + 1 : e;
    }
    return 0;
}

/* The registry round trip, atomic: this worker's entry stamped with Redis's clock (so hosts'
 * clocks need not agree), the hash's expiry, then that clock and every entry. KEYS[1] the hash;
 * ARGV: worker.id, "LOAD ROOM HOST PARTS", the expiry in ms. */
static const char SRC_SYNC[] =
    "local t = redis.call('TIME') "
    "local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "redis.call('HSET', KEYS[1], ARGV[1], string.format('1 %d ', ms) .. ARGV[2]) "
    "redis.call('PEXPIRE', KEYS[1], ARGV[3]) "
    "return {ms, redis.call('HGETALL', KEYS[1])}";

/* One registry round trip (SRC_SYNC): writes this worker's entry, reads every entry into
 * f->peers (fresh ones only), deletes those 10 ttls old. */
static void registry_sync(worker_t *w)
{
    struct wfwd *f = w->fwd;
    if (redis_up(w)) return;
    int load, room;
    own_load(w, consumer_pending(w->cons), &load, &room);
    char parts[FWD_MAX_PARTS * 12 + 2] = "-";
    size_t o = 0;
    for (int i = 0; i < f->n_mine; i++)
        o += (size_t)snprintf(parts + o, sizeof parts - o, "%s%d", i ? "," : "", (int)f->mine[i]);
    char val[1024];
    snprintf(val, sizeof val, "%d %d %s %s", load, room, f->host, parts);
    int ttl = w->cfg.forward_registry_ttl_ms;
    redisReply *rep = redisCommand(f->rc, "EVAL %s 1 %s %s %s %d", SRC_SYNC, f->key, w->worker_id,
                                   val, ttl * 10);
    /* {now_ms, {field, value, ...}} */
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER || rep->element[0]->integer <= 0 ||
        rep->element[1]->type != REDIS_REPLY_ARRAY || rep->element[1]->elements % 2) {
        if (rep) freeReplyObject(rep);
        redis_drop(w, "registry sync");
        return;
    }
    int64_t now = rep->element[0]->integer;
    f->clock_off_ms = now - wall_ms();
    const redisReply *all = rep->element[1];
    int n = 0, bad_entries = 0, n_pruned = 0;
    for (size_t i = 0; i + 1 < all->elements && n < FWD_MAX_PEERS; i += 2) {
        const redisReply *k = all->element[i], *v = all->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
            parse_entry(&f->peers[n], k->str, k->len, v->str, v->len)) {
            bad_entries++;
            continue;
        }
        int64_t age = now - f->peers[n].at_ms;
        if (age > 10LL * ttl && n_pruned < 32) { /* a worker gone long ago (killed, renamed) */
            redisAppendCommand(f->rc, "HDEL %s %b", f->key, k->str, k->len);
            n_pruned++;
        }
        if (age > ttl || age < -ttl) continue; /* stale (or a clock far off): ignored */
        n++;
    }
    freeReplyObject(rep);
    for (int i = 0; i < n_pruned; i++) {
        redisReply *r = NULL;
        if (redisGetReply(f->rc, (void **)&r) != REDIS_OK) {
            redis_drop(w, "HDEL");
            return;
        }
        if (r) freeReplyObject(r);
    }
    if (bad_entries != f->bad_entries && bad_entries)
        wlog(w, SW_LOG_WARN, "forward registry %s: %d malformed entr%s ignored", f->key,
             bad_entries, bad_entries == 1 ? "y" : "ies");
    f->bad_entries = bad_entries;
    f->n_peers = n;
    atomic_store(&w->st.fwd_peers, n);
}

void wfwd_free(worker_t *w)
{
    struct wfwd *f = w->fwd;
    if (!f) return;
    if (f->rc) { /* leave the registry now rather than at expiry (best effort) */
        redisReply *rep = redisCommand(f->rc, "HDEL %s %s", f->key, w->worker_id);
        if (rep) freeReplyObject(rep);
        redisFree(f->rc);
    }
    wlog(w, SW_LOG_INFO,
         "forwarding: %" PRIu64 " forwarded (overload %" PRIu64 ", affinity %" PRIu64 "), %" PRIu64
         " received, %" PRIu64 " over budget with no target",
         atomic_load(&w->st.fwd_out[FWD_OVERLOAD]) + atomic_load(&w->st.fwd_out[FWD_AFFINITY]),
         atomic_load(&w->st.fwd_out[FWD_OVERLOAD]), atomic_load(&w->st.fwd_out[FWD_AFFINITY]),
         atomic_load(&w->st.fwd_in), atomic_load(&w->st.fwd_no_target));
    free(f->peers);
    free(f->names);
    free(f);
    w->fwd = NULL;
}

int wfwd_subscription(worker_t *w, char **topics)
{
    if (!w->fwd) return 0;
    const char *base = *topics ? *topics : w->cfg.input_topics, *ft = w->cfg.forward_topic;
    size_t fl = strlen(ft);
    for (const char *t = base; t && *t;) {
        const char *e = strchr(t, ',');
        size_t l = e ? (size_t)(e - t) : strlen(t);
        if (l == fl && !memcmp(t, ft, fl)) return 0;
        t = e ? e + 1 : NULL;
    }
    size_t n = strlen(base) + fl + 2;
    char *s = malloc(n);
    if (!s) return -1;
    snprintf(s, n, "%s,%s", base, ft);
    free(*topics);
    *topics = s;
    return 0;
}

/* Over the forwarding budget now (pending: tracked messages besides the one at hand)? Keeps
 * the clock of how long. */
static int over_budget_for(worker_t *w, int pending)
{
    struct wfwd *f = w->fwd;
    int pct = w->cfg.forward_overload_pct;
    int over = pct > 0 && (100.0 * pending >= (double)w->cfg.max_inflight * pct ||
                           100.0 * (double)w->inflight_tokens >=
                               (double)w->cfg.max_inflight_tokens * pct);
    int64_t now = mono_ms();
    if (!over) {
        f->over_since_ms = 0;
        return 0;
    }
    if (!f->over_since_ms) f->over_since_ms = now;
    return now - f->over_since_ms >= w->cfg.forward_overload_ms;
}

void wfwd_tick(worker_t *w)
{
    struct wfwd *f = w->fwd;
    if (!f) return;
    over_budget_for(w, consumer_pending(w->cons));
    int32_t now_parts[FWD_MAX_PARTS];
    int n = consumer_assigned(w->cons, w->cfg.forward_topic, now_parts, FWD_MAX_PARTS);
    if (n > FWD_MAX_PARTS) n = FWD_MAX_PARTS;
    int changed = n != f->n_mine || memcmp(now_parts, f->mine, sizeof *now_parts * (size_t)n);
    int64_t now = mono_ms();
    if (!changed && now < f->next_pub_ms) return;
    memcpy(f->mine, now_parts, sizeof *now_parts * (size_t)n);
    f->n_mine = n;
    f->next_pub_ms = now + w->cfg.forward_registry_ttl_ms / 3;
    registry_sync(w);
}

static int header_get(const rd_kafka_message_t *m, const char *name, const void **v, size_t *n)
{
    rd_kafka_headers_t *h = NULL;
    return !rd_kafka_message_headers(m, &h) && h && !rd_kafka_header_get_last(h, name, v, n);
}

void wfwd_intake(worker_t *w, wreq_t *r)
{
    const void *v;
    size_t n;
    int from_topic = *w->cfg.forward_topic &&
                     !strcmp(rd_kafka_topic_name(r->msg->rkt), w->cfg.forward_topic);
    if (!from_topic && !header_get(r->msg, "__spillway.hop", &v, &n)) return;
    r->hop = 1;
    atomic_fetch_add(&w->st.fwd_in, 1);
}

/* The fresh registry entry to forward to: not this worker, on host `host` (NULL: any other
 * worker), owning a forward.topic partition, with room; the least loaded. NULL when none. */
static fwd_peer_t *pick(worker_t *w, const char *host)
{
    struct wfwd *f = w->fwd;
    fwd_peer_t *best = NULL;
    int64_t now = wall_ms() + f->clock_off_ms; /* Redis's clock, as the entries' */
    for (int i = 0; i < f->n_peers; i++) {
        fwd_peer_t *p = &f->peers[i];
        if (!strcmp(p->id, w->worker_id) || !p->n_parts || p->room <= 0) continue;
        if (now - p->at_ms > w->cfg.forward_registry_ttl_ms) continue;
        if (host && strcmp(p->host, host)) continue;
        if (!best || p->load < best->load) best = p;
    }
    return best;
}

/* Affinity: the fresh registry entry with room of a worker on the host whose tier-2 index holds
 * at least forward.affinity.min_blocks more of r's leading KV blocks than this host's (of the
 * hosts that qualify, the one that holds the most), or NULL. The Redis round trips of
 * cache_locate_here when the prompt has that many full blocks. */
static fwd_peer_t *affinity_target(worker_t *w, wreq_t *r)
{
    struct wfwd *f = w->fwd;
    int min = w->cfg.forward_affinity_min_blocks;
    wmodel_t *m = r->model;
    if (min <= 0 || !m || !m->cache) return NULL;
    int n;
    const int32_t *toks = wreq_prompt(r, &n);
    const char *scope = wreq_cache_scope(w, r);
    uint64_t seed;
    int nb = engine_prefix_names(m->eng, scope, toks, n, &seed, f->names, FWD_MAX_BLOCKS);
    if (nb < min) return NULL;
    cache_peer_t hosts[8];
    int here = 0;
    int k = cache_locate_here(m->cache, f->names, nb, hosts, 8, &here); /* most blocks first */
    if (k <= 0 || hosts[0].n_blocks < min) return NULL;
    for (int i = 0; i < k && hosts[i].n_blocks - here >= min; i++) {
        fwd_peer_t *p = pick(w, hosts[i].host_id);
        if (p) return p;
    }
    return NULL;
}

int wfwd_decide(worker_t *w, wreq_t *r)
{
    struct wfwd *f = w->fwd;
    if (!f || r->hop || !r->parsed) return 0;
    int reason = -1;
    fwd_peer_t *to = NULL;
    if ((to = affinity_target(w, r))) reason = FWD_AFFINITY;
    if (reason < 0 && over_budget_for(w, consumer_pending(w->cons) - 1)) {
        if ((to = pick(w, NULL))) reason = FWD_OVERLOAD;
        else atomic_fetch_add(&w->st.fwd_no_target, 1);
    }
    if (reason < 0) return 0;
    r->fwd_reason = FWD_REASON[reason];
    r->fwd_part = to->parts[f->rr++ % (unsigned)to->n_parts];
    snprintf(r->fwd_to, sizeof r->fwd_to, "%s", to->id);
    to->room--;
    to->load++; /* spreads a burst before the next registry read */
    r->cost = 0; /* never given to the engine */
    return 1;
}

int wfwd_send(worker_t *w, wreq_t *r, void *op, char *err, size_t errlen)
{
    const rd_kafka_message_t *m = r->msg;
    rd_kafka_headers_t *orig = NULL, *h;
    if (!rd_kafka_message_headers(m, &orig) && orig) h = rd_kafka_headers_copy(orig);
    else h = rd_kafka_headers_new(4);
    char from[320];
    snprintf(from, sizeof from, "%s[%d]@%" PRId64, rd_kafka_topic_name(m->rkt), (int)m->partition,
             (int64_t)m->offset);
    if (!h || rd_kafka_header_add(h, "__spillway.hop", -1, "1", -1) ||
        rd_kafka_header_add(h, "__spillway.hop.from", -1, from, -1) ||
        rd_kafka_header_add(h, "__spillway.hop.reason", -1, r->fwd_reason, -1) ||
        rd_kafka_header_add(h, "__spillway.hop.worker", -1, w->worker_id, -1)) {
        if (h) rd_kafka_headers_destroy(h);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    rd_kafka_timestamp_type_t tt;
    int64_t ts = rd_kafka_message_timestamp(m, &tt);
    /* the original timestamp: the request's age (max_queue_ms, deadlines) runs on */
    return producer_send_part(w->prod, w->cfg.forward_topic, r->fwd_part, ts > 0 ? ts : 0, m->key,
                              m->key_len, m->payload, m->len, h, op, err, errlen);
}

void wfwd_done(worker_t *w, const wreq_t *r)
{
    struct wfwd *f = w->fwd;
    int reason = !strcmp(r->fwd_reason, FWD_REASON[FWD_AFFINITY]) ? FWD_AFFINITY : FWD_OVERLOAD;
    atomic_fetch_add(&w->st.fwd_out[reason], 1);
    if (!f) return;
    int64_t sec = mono_ms() / 1000;
    if (sec != f->log_sec) {
        f->log_sec = sec;
        f->log_n = 0;
    }
    if (f->log_n >= w->cfg.forward_log_per_s) {
        f->log_skipped++;
        return;
    }
    f->log_n++;
    const rd_kafka_message_t *m = r->msg;
    char more[64] = "";
    if (f->log_skipped)
        snprintf(more, sizeof more, " (%" PRIu64 " more forwards not logged)", f->log_skipped);
    f->log_skipped = 0;
    wlog(w, SW_LOG_INFO, "forwarded %s[%d]@%" PRId64 " (id %.64s) to %s[%d] (worker %s): %s%s",
         rd_kafka_topic_name(m->rkt), (int)m->partition, (int64_t)m->offset,
         r->parsed ? r->req.id : "?", w->cfg.forward_topic, (int)r->fwd_part, r->fwd_to,
         r->fwd_reason, more);
}

void wfwd_render(worker_t *w, metrics_buf_t *b)
{
    if (!*w->cfg.forward_topic) return;
    metrics_family(b, "spillway:forwarded_total", "counter",
                   "requests handed to another worker of the group through forward.topic, by "
                   "reason");
    for (int i = 0; i < 2; i++) {
        char lb[64];
        snprintf(lb, sizeof lb, "reason=\"%s\"", FWD_REASON[i]);
        metrics_sample(b, "spillway:forwarded_total", lb, (double)atomic_load(&w->st.fwd_out[i]));
    }
    metrics_family(b, "spillway:forwarded_in_total", "counter",
                   "requests received through forward.topic (served here, never forwarded again)");
    metrics_sample(b, "spillway:forwarded_in_total", NULL, (double)atomic_load(&w->st.fwd_in));
    metrics_family(b, "spillway:forward_no_target_total", "counter",
                   "requests taken over the forwarding budget with no worker to forward them to "
                   "(served here)");
    metrics_sample(b, "spillway:forward_no_target_total", NULL,
                   (double)atomic_load(&w->st.fwd_no_target));
    metrics_family(b, "spillway:forward_registry_errors_total", "counter",
                   "failed round trips to the forwarding registry (Redis)");
    metrics_sample(b, "spillway:forward_registry_errors_total", NULL,
                   (double)atomic_load(&w->st.fwd_registry_errors));
    metrics_family(b, "spillway:forward_registry_workers", "gauge",
                   "workers with a fresh entry in the forwarding registry (this one included)");
    metrics_sample(b, "spillway:forward_registry_workers", NULL,
                   (double)atomic_load(&w->st.fwd_peers));
}
