/* cache/peer.c: KV across hosts: the server that serves this host's arena, the client that
 * fetches, verifies and stores a peer's blocks, and the cost model that decides between
 * fetching and recomputing. The protocol is documented in cache.h ("KV across hosts"); its wire
 * (sockets, handshake, frames) is peer_wire.c, what the frames carry is read and written here.
 *
 * Threads: the server thread (peer_t.thread) owns listen_fd, its connections and peer_t.srv;
 * cache_peer_fetch and cache_peer_prefetch run on their callers' threads, serialised by
 * peer_t.fmu (peer_t.cli); the rates are under peer_t.rmu; peer_t.bound under peer_t.mu. */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cache/cache_internal.h"

#define EWMA_ALPHA 0.3

/* BLOCK payload bytes for this arena: name, checksum, meta, KV. */
static size_t block_payload(const arena_t *a) { return 16 + a->meta_bytes + a->block_bytes; }

/* ---- the server ---- */

static void count_refused(cache_t *c, const char *why, int rc)
{
    atomic_fetch_add_explicit(&c->st_peer_refused, 1, memory_order_relaxed);
    CACHE_LOG(&c->log, SW_LOG_WARN, "peer server: connection dropped: %s (%s)", why,
              cache_peer_error_name(-rc));
}

/* Server thread: one REQ: the leading run of its names this host holds, as BLOCK frames, then
 * END. 0, or -CACHE_PEER_E* (the connection is then closed). */
static int serve_req(cache_t *c, peer_conn_t *pc, const uint8_t *p, size_t len, uint8_t *out)
{
    peer_t *pe = &c->peer;
    if (len < 4) return -CACHE_PEER_EDATA;
    uint32_t n = peer_get32(p);
    if (!n || n > CACHE_PEER_MAX_NAMES || len != 4 + (size_t)n * 8) return -CACHE_PEER_EDATA;
    uint32_t sent = 0;
    /* p is in pc's frame buffer, which the replies reuse: the names first */
    uint64_t *names = malloc((size_t)n * sizeof *names);
    if (!names) return -CACHE_PEER_ESTORE;
    for (uint32_t i = 0; i < n; i++) names[i] = peer_get64(p + 4 + (size_t)i * 8);
    if (cache_tier2_usable(c) && !rconn_ready(c, &pe->srv)) {
        const char **argv = malloc(((size_t)n + 2) * sizeof *argv);
        size_t *al = malloc(((size_t)n + 2) * sizeof *al);
        char *hex = malloc((size_t)n * 17);
        redisReply *r = NULL;
        if (argv && al && hex) {
            argv[0] = "HMGET";
            al[0] = 5;
            argv[1] = c->ix.keys[KEY_BLK];
            al[1] = strlen(argv[1]);
            for (uint32_t i = 0; i < n; i++) {
                snprintf(hex + (size_t)i * 17, 17, "%016" PRIx64, names[i]);
                argv[2 + i] = hex + (size_t)i * 17;
                al[2 + i] = 16;
            }
            r = redisCommandArgv(pe->srv.ctx, (int)n + 2, argv, al);
            if (!r)
                rconn_fail(c, &pe->srv, "peer HMGET",
                           pe->srv.ctx->errstr[0] ? pe->srv.ctx->errstr : "error");
        }
        free(argv);
        free(al);
        free(hex);
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements == n) {
            const arena_t *a = &c->arena;
            for (uint32_t i = 0; i < n; i++) {
                const redisReply *v = r->element[i];
                unsigned long slot;
                unsigned long long gen;
                char tail;
                if (v->type != REDIS_REPLY_STRING || v->len > 40 ||
                    sscanf(v->str, "%lu:%llu%c", &slot, &gen, &tail) != 2 || slot >= a->n_slots)
                    break;
                uint64_t name = names[i], sum;
                if (arena_read_sum(a, (uint32_t)slot, name, gen, out + 16 + a->meta_bytes,
                                   out + 16, &sum))
                    break; /* evicted or being rewritten: the run ends here */
                peer_put64(out, name);
                peer_put64(out + 8, sum);
                int rc = peer_send(pc, PEER_BLOCK, out, block_payload(a));
                if (rc) {
                    freeReplyObject(r);
                    free(names);
                    return rc;
                }
                sent++;
            }
        }
        if (r) freeReplyObject(r);
    }
    free(names);
    atomic_fetch_add_explicit(&c->st_peer_served, sent, memory_order_relaxed);
    uint8_t end[4];
    peer_put32(end, sent);
    return peer_send(pc, PEER_END, end, sizeof end);
}

/* Server thread: one connection, until the client closes, a step times out or fails. */
static void serve_conn(cache_t *c, int fd, uint8_t *out)
{
    peer_t *pe = &c->peer;
    peer_conn_t pc = {.fd = -1};
    cache_geometry_t geo = {.seed = c->arena.seed, .block_tokens = (int)c->arena.block_tokens,
                            .block_bytes = c->arena.block_bytes};
    pc.deadline_ms = sw_mono_ms() + pe->timeout_ms;
    int rc = peer_handshake(&pc, fd, 1, pe->key, &geo);
    if (rc) {
        count_refused(c, "handshake failed", rc);
        peer_conn_close(&pc);
        return;
    }
    while (!atomic_load_explicit(&pe->stopping, memory_order_relaxed)) {
        pc.deadline_ms = sw_mono_ms() + pe->timeout_ms;
        int type;
        const uint8_t *p;
        size_t len;
        rc = peer_recv(&pc, &type, &p, &len, 4 + (size_t)CACHE_PEER_MAX_NAMES * 8);
        if (rc) { /* the client closed or went idle: the end of a session */
            if (rc != -CACHE_PEER_ECLOSED && rc != -CACHE_PEER_ETIMEOUT)
                count_refused(c, "bad frame", rc);
            break;
        }
        if (type != PEER_REQ) {
            count_refused(c, "unexpected frame type", -CACHE_PEER_EDATA);
            break;
        }
        if ((rc = serve_req(c, &pc, p, len, out))) {
            if (rc == -CACHE_PEER_EDATA) count_refused(c, "malformed request", rc);
            break;
        }
    }
    peer_conn_close(&pc);
}

/* The address served on port: listen_host (a wildcard replaced by the hostname) and port. */
static void served_addr(const peer_t *pe, const char *port, char *out, size_t len)
{
    char host[CACHE_PEER_ADDR_MAX] = "";
    int wildcard = !*pe->listen_host || !strcmp(pe->listen_host, "0.0.0.0") ||
                   !strcmp(pe->listen_host, "::");
    if (wildcard) {
        if (gethostname(host, sizeof host) < 0) snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = 0;
    } else {
        snprintf(host, sizeof host, "%s", pe->listen_host);
    }
    snprintf(out, len, strchr(host, ':') ? "[%.40s]:%s" : "%.50s:%s", host, port);
}

/* Binds the listening socket. 0; 1 when the port is taken (another process of the host
 * serves); -1 on another error (logged). */
static int try_bind(cache_t *c)
{
    peer_t *pe = &c->peer;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    const char *h = *pe->listen_host ? pe->listen_host : NULL;
    int e = getaddrinfo(h, pe->listen_port, &hints, &res);
    if (e || !res) {
        CACHE_LOG(&c->log, SW_LOG_ERROR, "peer server: cannot resolve %s:%s: %s",
                  pe->listen_host, pe->listen_port, gai_strerror(e));
        return -1;
    }
    int rc = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 16) == 0) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            char port[8] = "0";
            if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
                getnameinfo((struct sockaddr *)&ss, sl, NULL, 0, port, sizeof port,
                            NI_NUMERICSERV);
            pe->listen_fd = fd;
            char addr[CACHE_PEER_ADDR_MAX];
            served_addr(pe, port, addr, sizeof addr);
            pthread_mutex_lock(&pe->mu);
            snprintf(pe->bound, sizeof pe->bound, "%s", addr);
            pthread_mutex_unlock(&pe->mu);
            rc = 0;
            break;
        }
        int err = errno;
        close(fd);
        if (err == EADDRINUSE) {
            rc = 1;
            break;
        }
        CACHE_LOG(&c->log, SW_LOG_ERROR, "peer server: bind %s:%s: %s", pe->listen_host,
                  pe->listen_port, strerror(err));
    }
    freeaddrinfo(res);
    return rc;
}

static void *server_main(void *arg)
{
    cache_t *c = arg;
    peer_t *pe = &c->peer;
    uint8_t *out = malloc(block_payload(&c->arena));
    int64_t next_bind = 0;
    int announced = 0;
    while (out && !atomic_load_explicit(&pe->stopping, memory_order_relaxed)) {
        if (pe->listen_fd < 0) {
            if (sw_mono_ms() < next_bind) {
                usleep(100 * 1000);
                continue;
            }
            int b = try_bind(c);
            next_bind = sw_mono_ms() + c->fleet.refresh_ms;
            if (b == 0) {
                char addr[CACHE_PEER_ADDR_MAX];
                cache_peer_listen_addr(c, addr, sizeof addr);
                CACHE_LOG(&c->log, SW_LOG_INFO, "peer server: serving this host's blocks on %s",
                          addr);
                fleet_set_addr(c, *pe->advertise ? pe->advertise : addr);
            } else if (b == 1 && !announced) {
                /* the host's server is another process's: register the address it serves */
                char addr[CACHE_PEER_ADDR_MAX];
                served_addr(pe, pe->listen_port, addr, sizeof addr);
                fleet_set_addr(c, *pe->advertise ? pe->advertise : addr);
                CACHE_LOG(&c->log, SW_LOG_INFO, "peer server: %s:%s is taken (another process "
                          "of this host serves); retrying every %d ms", pe->listen_host,
                          pe->listen_port, c->fleet.refresh_ms);
                announced = 1;
            }
            if (b) continue;
        }
        struct pollfd p = {.fd = pe->listen_fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        int fd = accept4(pe->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        serve_conn(c, fd, out); /* closes fd */
    }
    free(out);
    if (pe->listen_fd >= 0) close(pe->listen_fd);
    pe->listen_fd = -1;
    rconn_close(&pe->srv);
    return NULL;
}

void cache_peer_listen_addr(cache_t *c, char *buf, size_t len)
{
    if (!len) return;
    buf[0] = 0;
    if (!c->peer.mu_init) return;
    pthread_mutex_lock(&c->peer.mu);
    snprintf(buf, len, "%s", c->peer.bound);
    pthread_mutex_unlock(&c->peer.mu);
}

int peer_start(cache_t *c, const cache_config_t *cfg, char *errstr, size_t errlen)
{
    peer_t *pe = &c->peer;
    pe->listen_fd = -1;
    pe->timeout_ms = cfg->peer_timeout_ms > 0 ? cfg->peer_timeout_ms : 1;
    pe->def_bw = (cfg->peer_bandwidth_mbps > 0 ? cfg->peer_bandwidth_mbps : 1) * 1e6;
    pe->def_rtt = (cfg->peer_rtt_us > 0 ? cfg->peer_rtt_us : 0) * 1e-6;
    pe->prefill_tps = cfg->prefill_tps > 0 ? cfg->prefill_tps : 1;
    rconn_init(&pe->srv, &c->ix, "peer server");
    rconn_init(&pe->cli, &c->ix, "peer fetch");
    if (pthread_mutex_init(&pe->mu, NULL)) goto oom;
    pe->mu_init = 1;
    if (pthread_mutex_init(&pe->fmu, NULL)) goto oom;
    pe->fmu_init = 1;
    if (pthread_mutex_init(&pe->rmu, NULL)) goto oom;
    pe->rmu_init = 1;
    if (!cfg->peer_secret) return 0;
    if (sodium_init() < 0) {
        snprintf(errstr, errlen, "cache: libsodium failed to initialise");
        return -1;
    }
    peer_derive_key(cfg->peer_secret, pe->key);
    pe->on = 1;
    const char *listen = cfg->peer_listen ? cfg->peer_listen : "";
    const char *adv = cfg->peer_advertise ? cfg->peer_advertise : "";
    snprintf(pe->advertise, sizeof pe->advertise, "%s", adv);
    if (!*listen) return 0;
    if (peer_split_addr(listen, pe->listen_host, sizeof pe->listen_host, pe->listen_port,
                   sizeof pe->listen_port)) {
        snprintf(errstr, errlen, "cache: peer listen address \"%.80s\" is not host:port", listen);
        return -1;
    }
    int e = pthread_create(&pe->thread, NULL, server_main, c);
    if (e) {
        snprintf(errstr, errlen, "cache: cannot start the peer server thread: %s", strerror(e));
        return -1;
    }
    pe->started = 1;
    return 0;
oom:
    snprintf(errstr, errlen, "cache: out of memory");
    return -1;
}

void peer_stop(cache_t *c)
{
    peer_t *pe = &c->peer;
    if (pe->started) {
        atomic_store(&pe->stopping, 1);
        pthread_join(pe->thread, NULL);
        pe->started = 0;
    }
    rconn_close(&pe->srv);
    rconn_close(&pe->cli);
    if (pe->rmu_init) pthread_mutex_destroy(&pe->rmu);
    if (pe->fmu_init) pthread_mutex_destroy(&pe->fmu);
    if (pe->mu_init) pthread_mutex_destroy(&pe->mu);
    pe->rmu_init = pe->fmu_init = pe->mu_init = 0;
    sodium_memzero(pe->key, sizeof pe->key);
}

/* ---- the cost model ---- */

/* Under rmu: the rates entry of addr, created (evicting the least recently used) when create. */
static int rate_slot(peer_t *pe, const char *addr, int create)
{
    int lru = 0;
    for (int i = 0; i < PEER_RATES; i++) {
        if (pe->rates[i].used && !strcmp(pe->rates[i].addr, addr)) {
            pe->rates[i].used = ++pe->clock;
            return i;
        }
        if (pe->rates[i].used < pe->rates[lru].used) lru = i;
    }
    if (!create) return -1;
    snprintf(pe->rates[lru].addr, sizeof pe->rates[lru].addr, "%s", addr);
    pe->rates[lru].bw = pe->def_bw;
    pe->rates[lru].rtt = pe->def_rtt;
    pe->rates[lru].used = ++pe->clock;
    return lru;
}

static size_t frame_bytes(const cache_t *c)
{
    return PEER_HDR_BYTES + block_payload(&c->arena) + PEER_TAG_BYTES;
}

/* floor(log2(tokens)), clamped to the prefill_by_len buckets */
static int len_bucket(double tokens)
{
    int i = 0;
    while (tokens >= 2 && i < PEER_PREFILL_LENS - 1) {
        tokens /= 2;
        i++;
    }
    return i;
}

/* Under rmu: the prefill rate for a prefill of tokens: its length bucket's, else the nearest
 * measured bucket's (the mean of the two when one on each side is as near), else the EWMA of
 * every prefill (the configured start until a prefill is noted). */
static double prefill_rate(const peer_t *pe, double tokens)
{
    int want = len_bucket(tokens);
    for (int d = 0; d < PEER_PREFILL_LENS; d++) {
        double lo = want - d >= 0 ? pe->prefill_by_len[want - d] : 0;
        double hi = d && want + d < PEER_PREFILL_LENS ? pe->prefill_by_len[want + d] : 0;
        if (lo > 0 && hi > 0) return 0.5 * (lo + hi);
        if (lo > 0) return lo;
        if (hi > 0) return hi;
    }
    return pe->prefill_tps;
}

int cache_peer_should_fetch(cache_t *c, const char *addr, int n_blocks, double *t_fetch_s,
                            double *t_compute_s)
{
    peer_t *pe = &c->peer;
    if (t_fetch_s) *t_fetch_s = 0;
    if (t_compute_s) *t_compute_s = 0;
    if (!pe->rmu_init || n_blocks <= 0) return 0;
    pthread_mutex_lock(&pe->rmu);
    int i = addr ? rate_slot(pe, addr, 0) : -1;
    double bw = i >= 0 ? pe->rates[i].bw : pe->def_bw;
    double rtt = i >= 0 ? pe->rates[i].rtt : pe->def_rtt;
    double tokens = (double)n_blocks * c->arena.block_tokens;
    double tps = prefill_rate(pe, tokens);
    pthread_mutex_unlock(&pe->rmu);
    double tf = rtt + (double)n_blocks * (double)frame_bytes(c) / bw;
    double tc = tokens / tps;
    if (t_fetch_s) *t_fetch_s = tf;
    if (t_compute_s) *t_compute_s = tc;
    return tf < tc;
}

void cache_peer_note_prefill(cache_t *c, double tokens, double seconds)
{
    peer_t *pe = &c->peer;
    if (!pe->rmu_init || tokens < 1 || seconds <= 0) return;
    double tps = tokens / seconds;
    int i = len_bucket(tokens);
    pthread_mutex_lock(&pe->rmu);
    pe->prefill_tps = (1 - EWMA_ALPHA) * pe->prefill_tps + EWMA_ALPHA * tps;
    pe->prefill_by_len[i] = pe->prefill_by_len[i] > 0
                                ? (1 - EWMA_ALPHA) * pe->prefill_by_len[i] + EWMA_ALPHA * tps
                                : tps;
    pthread_mutex_unlock(&pe->rmu);
}

void cache_peer_set_rates(cache_t *c, const char *addr, double bytes_per_s, double rtt_s,
                          double prefill_tps)
{
    peer_t *pe = &c->peer;
    if (!pe->rmu_init) return;
    pthread_mutex_lock(&pe->rmu);
    if (addr) {
        int i = rate_slot(pe, addr, 1);
        if (bytes_per_s > 0) pe->rates[i].bw = bytes_per_s;
        if (rtt_s > 0) pe->rates[i].rtt = rtt_s;
    } else {
        if (bytes_per_s > 0) pe->def_bw = bytes_per_s;
        if (rtt_s > 0) pe->def_rtt = rtt_s;
    }
    if (prefill_tps > 0) {
        pe->prefill_tps = prefill_tps;
        memset(pe->prefill_by_len, 0, sizeof pe->prefill_by_len);
    }
    pthread_mutex_unlock(&pe->rmu);
}

/* A real fetch: the fixed cost (connect to the first block) and, with two or more blocks, the
 * bandwidth after the first block. */
static void note_fetch(cache_t *c, const char *addr, double rtt_s, double bytes, double secs)
{
    peer_t *pe = &c->peer;
    pthread_mutex_lock(&pe->rmu);
    int i = rate_slot(pe, addr, 1);
    pe->rates[i].rtt = (1 - EWMA_ALPHA) * pe->rates[i].rtt + EWMA_ALPHA * rtt_s;
    if (bytes > 0 && secs > 0)
        pe->rates[i].bw = (1 - EWMA_ALPHA) * pe->rates[i].bw + EWMA_ALPHA * (bytes / secs);
    pthread_mutex_unlock(&pe->rmu);
}

/* ---- the client ---- */

static int fail(cache_t *c, const char *addr, int error, int got, int n, const char *detail)
{
    atomic_fetch_add_explicit(&c->st_peer_fail[error - 1], 1, memory_order_relaxed);
    CACHE_LOG(&c->log, SW_LOG_WARN,
              "peer fetch from %s: %s after %d of %d blocks%s%s: recomputing the rest", addr,
              cache_peer_error_name(error), got, n, detail ? ": " : "", detail ? detail : "");
    return error;
}

int cache_peer_fetch(cache_t *c, const char *addr, uint64_t parent, const uint64_t *names,
                     const int32_t *tokens, int n, int *error)
{
    peer_t *pe = &c->peer;
    *error = CACHE_PEER_OK;
    if (!pe->on || n <= 0 || !names || !tokens || !addr || !*addr) return 0;
    if (!cache_tier2_usable(c)) return 0;
    if (n > CACHE_PEER_MAX_NAMES) n = CACHE_PEER_MAX_NAMES;
    const arena_t *a = &c->arena;
    size_t tok_bytes = a->meta_bytes - 8;
    int got = 0;
    pthread_mutex_lock(&pe->fmu);
    int64_t t0 = sw_mono_ns();
    peer_conn_t pc = {.fd = -1};
    pc.deadline_ms = sw_mono_ms() + pe->timeout_ms;
    uint8_t *store = malloc(a->block_bytes + a->meta_bytes);
    uint8_t *req = malloc(4 + (size_t)n * 8);
    if (!store || !req) {
        *error = fail(c, addr, CACHE_PEER_ESTORE, 0, n, "out of memory");
        goto out;
    }
    int fd = peer_dial(addr, pc.deadline_ms);
    if (fd < 0) {
        *error = fail(c, addr, -fd, 0, n, NULL);
        goto out;
    }
    cache_geometry_t geo = {.seed = a->seed, .block_tokens = (int)a->block_tokens,
                            .block_bytes = a->block_bytes};
    int rc = peer_handshake(&pc, fd, 0, pe->key, &geo);
    if (rc) {
        *error = fail(c, addr, -rc, 0, n, rc == -CACHE_PEER_EAUTH
                                              ? "handshake refused (another deployment secret "
                                                "or model?)"
                                              : "during the handshake");
        goto out;
    }
    peer_put32(req, (uint32_t)n);
    for (int i = 0; i < n; i++) peer_put64(req + 4 + (size_t)i * 8, names[i]);
    if ((rc = peer_send(&pc, PEER_REQ, req, 4 + (size_t)n * 8))) {
        *error = fail(c, addr, -rc, 0, n, NULL);
        goto out;
    }
    int64_t t_first = 0;
    double bytes_after_first = 0;
    for (;;) {
        int type;
        const uint8_t *p;
        size_t len;
        rc = peer_recv(&pc, &type, &p, &len, block_payload(a));
        if (rc) {
            *error = fail(c, addr, -rc, got, n, NULL);
            break;
        }
        atomic_fetch_add_explicit(&c->st_peer_bytes, len + PEER_HDR_BYTES + PEER_TAG_BYTES,
                                  memory_order_relaxed);
        if (type == PEER_END) {
            if (len != 4 || peer_get32(p) != (uint32_t)got)
                *error = fail(c, addr, CACHE_PEER_EDATA, got, n, "bad END frame");
            else if (got < n)
                CACHE_LOG(&c->log, SW_LOG_DEBUG, "peer fetch from %s: it held %d of %d blocks",
                          addr, got, n);
            break;
        }
        const char *bad = NULL;
        uint64_t want_parent = got ? names[got - 1] : parent;
        if (type != PEER_BLOCK || len != block_payload(a)) bad = "unexpected frame";
        else if (got >= n) bad = "more blocks than asked for";
        else if (peer_get64(p) != names[got]) bad = "another block's name";
        else if (peer_get64(p + 16) != want_parent) bad = "another parent";
        else if (memcmp(p + 24, tokens + (size_t)got * a->block_tokens, tok_bytes))
            bad = "other token ids";
        else if (arena_sum(a, p + 16 + a->meta_bytes, p + 16) != peer_get64(p + 8))
            bad = "checksum mismatch";
        if (bad) {
            char d[96];
            snprintf(d, sizeof d, "block %d: %s", got, bad);
            *error = fail(c, addr, CACHE_PEER_EDATA, got, n, d);
            break;
        }
        if (!t_first) t_first = sw_mono_ns();
        else bytes_after_first += (double)(len + PEER_HDR_BYTES + PEER_TAG_BYTES);
        memcpy(store, p + 16 + a->meta_bytes, a->block_bytes);
        memcpy(store + a->block_bytes, p + 16, a->meta_bytes);
        if (cache_write_block(c, &pe->cli, names[got], store)) {
            *error = fail(c, addr, CACHE_PEER_ESTORE, got, n, "the local arena or index");
            break;
        }
        got++;
    }
    if (t_first) {
        int64_t t_end = sw_mono_ns();
        note_fetch(c, addr, (double)(t_first - t0) * 1e-9, bytes_after_first,
                   (double)(t_end - t_first) * 1e-9);
    }
    atomic_fetch_add_explicit(&c->st_peer_blocks, (uint64_t)got, memory_order_relaxed);
    if (got == n) atomic_fetch_add_explicit(&c->st_peer_fetches, 1, memory_order_relaxed);
out:
    peer_conn_close(&pc);
    pthread_mutex_unlock(&pe->fmu);
    free(store);
    free(req);
    return got;
}

int cache_peer_prefetch(cache_t *c, uint64_t parent, const uint64_t *names,
                        const int32_t *tokens, int n, cache_prefetch_t *out)
{
    memset(out, 0, sizeof *out);
    if (!c->peer.on || n <= 0 || !cache_tier2_usable(c)) return 0;
    if (n > CACHE_PEER_MAX_NAMES) n = CACHE_PEER_MAX_NAMES;
    cache_peer_t peers[8];
    int self = 0;
    int k = fleet_locate(c, names, n, peers, 8, 1, &self);
    out->n_local = self;
    /* the host holding most beyond ours that serves */
    int best = -1;
    for (int i = 0; i < k && best < 0; i++)
        if (peers[i].n_blocks > self && peers[i].peer_addr[0]) best = i;
    if (best < 0) return 0;
    const cache_peer_t *p = &peers[best];
    snprintf(out->peer, sizeof out->peer, "%s", p->host_id);
    out->n_peer = p->n_blocks;
    int want = p->n_blocks - self;
    if (!cache_peer_should_fetch(c, p->peer_addr, want, &out->t_fetch_s, &out->t_compute_s)) {
        out->decision = CACHE_PEER_RECOMPUTE;
        atomic_fetch_add_explicit(&c->st_peer_recompute, 1, memory_order_relaxed);
        CACHE_LOG(&c->log, SW_LOG_DEBUG, "peer %s holds %d more blocks: recomputing (fetch "
                  "%.2f ms > compute %.2f ms)", p->host_id, want, out->t_fetch_s * 1e3,
                  out->t_compute_s * 1e3);
        return 0;
    }
    out->decision = CACHE_PEER_FETCH;
    out->fetched = cache_peer_fetch(c, p->peer_addr, self ? names[self - 1] : parent,
                                    names + self, tokens + (size_t)self * c->arena.block_tokens,
                                    want, &out->error);
    return out->fetched;
}
