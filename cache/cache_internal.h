/* cache/cache_internal.h: what the files of cache/ share: logging, the arena (arena.c) and the
 * Redis index (index.c). Not installed; nothing outside cache/ includes it. */
#ifndef SPILLWAY_CACHE_INTERNAL_H
#define SPILLWAY_CACHE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cache/cache.h"
#include "common/clock.h"
#include "common/log.h"

/* ---- logging ---- */

/* Read-only after cache_new; fn (when set) must be callable from the step thread and the
 * writer thread at once. */
typedef struct {
    int level; /* 0 error, 1 warn, 2 info, 3 debug */
    void (*fn)(void *arg, int level, const char *msg);
    void *arg;
} cache_log_t;

void cache_log_emit(const cache_log_t *log, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Checks the level before anything is formatted. */
#define CACHE_LOG(log, lvl, ...)                                                   \
    do {                                                                           \
        if ((lvl) <= (log)->level) cache_log_emit((log), (lvl), __VA_ARGS__);      \
    } while (0)

/* ---- arena (arena.c) ---- */

/* One process's mapping of the shared arena file. Geometry fields are fixed after arena_open;
 * the mapping is shared with other processes, synchronised per slot by the seqlock word. */
typedef struct {
    char *path;           /* owned copy */
    int fd;               /* kept open for the mapping's lifetime (-1 when closed) */
    uint8_t *base;        /* map_bytes bytes, MAP_SHARED */
    size_t map_bytes;     /* arena_mb MiB */
    uint64_t seed;
    uint32_t block_tokens;
    size_t block_bytes;
    size_t meta_bytes;    /* after the KV in a slot: parent name (u64) + block_tokens x i32 */
    size_t slot_stride;   /* block_bytes + meta_bytes rounded up to 4096 */
    size_t data_offset;   /* of slot 0: 4096 + n_slots x 64, rounded up to 4096 */
    uint32_t n_slots;
    uint64_t id;          /* the random arena id this mapping was attached with */
    pid_t pid;            /* this process: the owner recorded in a seqlock word while writing */
} arena_t;

/* Maps (creating, validating, re-initialising under flock) the arena. 0, or -1 + errstr. */
/* The default arena (path NULL or ""): ARENA_DEFAULT_DIR-<euid>/ARENA_DEFAULT_FILE, the folder
 * created 0700 and refused unless it is this user's real directory with no group/other access. */
#define ARENA_DEFAULT_DIR "/dev/shm/spillway"
#define ARENA_DEFAULT_FILE "spillway.arena"
/* Opens (creating 0600) and maps the arena. 0; -2 + errstr when the file or folder is refused
 * (symlink, not a regular file, more than one link, another owner, group/other access); -1 +
 * errstr for any other failure. */
int arena_open(arena_t *a, const char *path, long arena_mb, const cache_geometry_t *geo,
               const cache_log_t *log, char *errstr, size_t errlen);
void arena_close(arena_t *a);

enum { ARENA_OK = 0, ARENA_BUSY = -1, ARENA_LOST = -2 };
/* Writer (one thread per process per slot at a time, enforced by the seqlock). Writes block
 * `name` of generation `gen` (from the alloc script) into `slot`: its KV (src, block_bytes) and
 * what it was computed from (meta, meta_bytes), both covered by the slot's checksum. ARENA_OK;
 * ARENA_BUSY when a live writer holds the slot (nothing written); ARENA_LOST when a takeover
 * happened during the copy, or when the slot already holds a newer generation (a writer that
 * allocated it later wrote first: nothing written); either way the slot is another writer's:
 * do not commit. */
int arena_write(arena_t *a, uint32_t slot, uint64_t name, uint64_t gen, const void *src,
                const void *meta);
/* Any thread. Copies slot's KV into dst (block_bytes) and its meta into meta (meta_bytes) when
 * its header holds name and gen, the seqlock is even and unchanged around the copy, and the
 * copy's XXH3 equals the header's checksum: 0. Else -1 (dst and meta hold garbage). */
int arena_read(const arena_t *a, uint32_t slot, uint64_t name, uint64_t gen, void *dst,
               void *meta);
/* arena_read, also giving the slot header's checksum (*sum, valid when 0 is returned). */
int arena_read_sum(const arena_t *a, uint32_t slot, uint64_t name, uint64_t gen, void *dst,
                   void *meta, uint64_t *sum);
/* The checksum a slot holding kv (block_bytes) and meta (meta_bytes) carries. */
uint64_t arena_sum(const arena_t *a, const void *kv, const void *meta);
/* The header's name and generation of a slot, as seen now (no consistency guarantee). */
void arena_peek(const arena_t *a, uint32_t slot, uint64_t *name, uint64_t *gen, uint64_t *seq);
/* 1 when the arena header still carries this mapping's id (nobody re-initialised it since). */
int arena_still_ours(const arena_t *a);

/* ---- Redis index (index.c) ---- */

enum { SCRIPT_INIT, SCRIPT_ALLOC, SCRIPT_COMMIT, SCRIPT_RELEASE, SCRIPT_LOOKUP, N_SCRIPTS };
enum { KEY_META, KEY_FREE, KEY_LRU, KEY_SNAME, KEY_SGEN, KEY_BLK, KEY_CLOCK, N_KEYS };

struct redisContext;
struct redisReply;

/* One Redis connection with its reconnect schedule. Used by exactly one thread. */
typedef struct {
    struct redisContext *ctx; /* NULL while down */
    char sha[N_SCRIPTS][41];  /* SCRIPT LOAD results of this connection */
    int64_t retry_at_ms;      /* monotonic ms before which no connect is attempted */
    int backoff_ms;           /* the next delay after a failure */
    int failures;             /* consecutive failed attempts (logging: only the first warns) */
    const char *who;          /* "step" or "writer" (logs) */
} rconn_t;

/* Redis settings and key names: read-only after cache_new. */
typedef struct {
    char *host, *user, *password;
    int port, db;
    int connect_timeout_ms, cmd_timeout_ms, backoff_min_ms, backoff_max_ms, health_ms;
    char *keys[N_KEYS];
    char *host_id;       /* this host (config, or the hostname) */
    char *ns;            /* the namespace (key prefix) */
    uint64_t seed;
    char *fleet_key;     /* "<namespace>:fleet:<seed hex>:hosts" */
    char arena_id[17];   /* hex of the arena id, as stored in meta */
    char n_slots[16];    /* decimal */
} index_cfg_t;

/* ---- fleet registry (fleet.c) ---- */

/* The registering thread and cache_locate's state. mu guards stopping and addr; the thread owns
 * reg; lmu guards loc and the scratch (cache_locate's callers). */
typedef struct {
    pthread_mutex_t mu, lmu;
    pthread_cond_t cv;
    int mu_init, lmu_init, cv_init, started, stopping;
    pthread_t thread;
    char addr[CACHE_PEER_ADDR_MAX]; /* the address registered (under mu) */
    int refresh_ms, ttl_ms;
    rconn_t reg;                    /* the thread's connection */
    rconn_t loc;                    /* cache_locate's connection (under lmu) */
    cache_peer_t *known;            /* the live other hosts at the last registry read, with
                                       their age then (under lmu; reused for refresh_ms / 2) */
    int known_n;
    int64_t known_at_ms;            /* monotonic ms of that read (0: none) */
    char *hex;                      /* [cap x 17] names as hex (under lmu) */
    const char **argv;              /* [cap + 2] (under lmu) */
    size_t *argvlen;
    int cap;
} fleet_t;

/* 1 when s is a usable host id or (allow_empty) peer address: at most max-1 bytes, each
 * printable ASCII other than space. */
int fleet_token_ok(const char *s, size_t len, size_t max, int allow_empty);
/* Starts the registering thread (tier 2 on only). 0, or -1 + errstr. */
int fleet_start(cache_t *c, const cache_config_t *cfg, char *errstr, size_t errlen);
/* Stops the thread and frees the fleet state (safe on a fleet never started). */
void fleet_stop(cache_t *c);
/* Any thread: sets the peer address registered from the next refresh on (truncated to
 * CACHE_PEER_ADDR_MAX - 1; "" = none) and wakes the thread to refresh now. */
void fleet_set_addr(cache_t *c, const char *addr);

/* ---- KV across hosts (peer.c): the protocol of cache.h's "KV across hosts" ---- */

enum { PEER_REQ = 1, PEER_BLOCK = 2, PEER_END = 3 };
#define PEER_KEY_BYTES 32
#define PEER_HDR_BYTES 8
#define PEER_TAG_BYTES 16

/* One authenticated connection, either side. Used by one thread. */
typedef struct {
    int fd;                        /* owned (-1 closed) */
    int64_t deadline_ms;           /* monotonic; every read and write fails after it */
    unsigned char key[PEER_KEY_BYTES]; /* the session key */
    uint64_t seq_out, seq_in;      /* frames sent and received */
    uint8_t dir_out;               /* 0: the client's frames, 1: the server's */
    uint8_t *buf;                  /* [cap] frame scratch (owned) */
    size_t cap;
} peer_conn_t;

/* The protocol key from the deployment secret (CACHE_SECRET_BYTES). */
void peer_derive_key(const unsigned char *secret, unsigned char key[PEER_KEY_BYTES]);
/* fd (taken: closed by peer_conn_close, also after a failure) becomes a session: the
 * handshake of either side, bounded by pc->deadline_ms (set by the caller first). 0, or
 * -CACHE_PEER_E* (-EAUTH: wrong tag, magic or geometry). */
int peer_handshake(peer_conn_t *pc, int fd, int is_server, const unsigned char *key,
                   const cache_geometry_t *geo);
/* One frame (payload len bytes of type). 0 or -CACHE_PEER_E*. */
int peer_send(peer_conn_t *pc, int type, const void *payload, size_t len);
/* The next frame: its type, and its payload (in pc->buf, valid until the next call) of at most
 * max bytes (a longer one is refused before it is read). 0 or -CACHE_PEER_E* (-ECLOSED when
 * the peer closed or the frame failed authentication). */
int peer_recv(peer_conn_t *pc, int *type, const uint8_t **payload, size_t *len, size_t max);
void peer_conn_close(peer_conn_t *pc);
/* Little-endian integers of the wire. */
void peer_put32(uint8_t *p, uint32_t v);
void peer_put64(uint8_t *p, uint64_t v);
uint32_t peer_get32(const uint8_t *p);
uint64_t peer_get64(const uint8_t *p);
/* Splits "host:port" ("[v6]:port" too) into host and port (digits). 0 or -1. */
int peer_split_addr(const char *addr, char *host, size_t hlen, char *port, size_t plen);
/* Connects to "host:port" by deadline_ms. The fd, or -CACHE_PEER_ECONNECT / -ETIMEOUT. */
int peer_dial(const char *addr, int64_t deadline_ms);

#define PEER_RATES 32 /* peers whose measured rates are remembered */
#define PEER_PREFILL_LENS 32 /* prefill rates kept by floor(log2(tokens)): 1 .. 2^31 tokens */

typedef struct {
    int on;                        /* a secret was given */
    unsigned char key[PEER_KEY_BYTES];
    int timeout_ms;
    /* server: its thread owns listen_fd and srv */
    char listen_host[CACHE_PEER_ADDR_MAX], listen_port[8], advertise[CACHE_PEER_ADDR_MAX];
    int listen_fd;
    pthread_t thread;
    int started;
    _Atomic int stopping;
    pthread_mutex_t mu;            /* guards bound */
    int mu_init;
    char bound[CACHE_PEER_ADDR_MAX]; /* "host:port" served now, "" none */
    rconn_t srv;
    /* client: fmu guards cli (cache_peer_fetch's stores) */
    pthread_mutex_t fmu;
    int fmu_init;
    rconn_t cli;
    /* cost model: rmu guards the rates */
    pthread_mutex_t rmu;
    int rmu_init;
    double def_bw, def_rtt, prefill_tps; /* bytes/s, s, tokens/s (every prefill's EWMA) */
    /* tokens/s of prefills of 2^i .. 2^(i+1)-1 tokens (EWMA; 0: none measured): a short prefill
     * runs several times faster per token than a long one (attention grows with the length) */
    double prefill_by_len[PEER_PREFILL_LENS];
    struct {
        char addr[CACHE_PEER_ADDR_MAX];
        double bw, rtt;
        uint64_t used;             /* LRU stamp (0: empty) */
    } rates[PEER_RATES];
    uint64_t clock;
} peer_t;

/* Starts the server thread when cfg->peer_listen is set (and a secret is). 0 or -1 + errstr. */
int peer_start(cache_t *c, const cache_config_t *cfg, char *errstr, size_t errlen);
void peer_stop(cache_t *c);
/* cache_locate (fleet.c), and: when serving_only, hosts without a peer address are left out
 * (no HMGET is sent when none is left); when self_blocks is not NULL, the leading blocks this
 * host's own index holds go there (asked in the same pipeline, only when another host is
 * asked). */
int fleet_locate(cache_t *c, const uint64_t *names, int n, cache_peer_t *out, int max_out,
                 int serving_only, int *self_blocks);

/* ---- the handle ---- */

#define CACHE_RECENT 4096 /* names remembered as indexed (direct-mapped, power of two) */

struct cache {
    cache_log_t log;
    arena_t arena;
    index_cfg_t ix;
    int tier2;                     /* 0 when redis_host is "" or the arena was refused */
    int arena_refused;             /* 1 when arena_open refused the file: tier 2 off */
    _Atomic int stale;             /* 1: another process re-initialised the arena under our
                                      mapping: tier 2 off for this handle */

    /* step thread only */
    rconn_t step;
    int n_found, cap_found;        /* the last lookup's result: blocks [0, n_found) */
    uint8_t *meta_stage;           /* [arena.meta_bytes] a fetch's meta */
    uint64_t *found_name, *found_gen;
    uint32_t *found_slot;
    char *arg_hex;                 /* lookup arguments: 17 bytes per name */
    const char **argv;             /* script arguments scratch */
    size_t *argvlen;
    int cap_args;
    /* names known to be indexed or being stored: the step thread sets entries, the writer
     * clears (CAS) the ones it failed to store; 0 = empty */
    _Atomic uint64_t recent[CACHE_RECENT];

    /* writer: the pool of write_queue buffers, each buf_stride bytes; a buffer is free (on
     * free_stack), lent to the step thread (between store_begin and store_commit), queued (fifo)
     * or being written. mu guards free_stack, fifo and stopping. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int mu_init, cv_init, writer_started;
    pthread_t writer;
    uint8_t *pool;
    size_t buf_stride;
    int n_bufs;
    uint64_t *job_name;            /* per buffer: the name being stored */
    int *free_stack, n_free;
    int *fifo, fifo_head, fifo_len;
    int stopping;
    rconn_t wr;                    /* writer thread only */
    _Atomic int64_t wr_retry_at_ms; /* writer connection down until then (0 = up or retry now) */

    fleet_t fleet;                 /* fleet.c */
    peer_t peer;                   /* peer.c */

    /* stats, relaxed atomics (any thread) */
    _Atomic uint64_t st_lookups, st_hits, st_misses_torn, st_stores, st_dropped, st_evictions,
        st_redis_errors;
    _Atomic int st_redis_up, st_arena_used;
    _Atomic uint64_t st_peer_fetches, st_peer_blocks, st_peer_bytes, st_peer_recompute,
        st_peer_fail[6], st_peer_served, st_peer_refused;
};

/* Any thread. 1 when tier 2 is on and the arena still carries this handle's arena id; else 0
 * (a stale handle is marked and logged once). */
int cache_tier2_usable(cache_t *c);

int index_cfg_init(index_cfg_t *ix, const cache_config_t *cfg, const cache_geometry_t *geo,
                   uint64_t arena_id, uint32_t n_slots);
void index_cfg_free(index_cfg_t *ix);
void rconn_init(rconn_t *r, const index_cfg_t *ix, const char *who);
void rconn_close(rconn_t *r);
/* Connects when down and the backoff allows it (bounded by connect_timeout_ms plus one
 * pipelined round trip of cmd_timeout_ms). 0 connected, -1 down. */
int rconn_ready(cache_t *c, rconn_t *r);
/* Health check: connects when the backoff allows it, then PING; sets redis_up either way. */
void rconn_ping(cache_t *c, rconn_t *r);
/* Runs a script (EVALSHA; EVAL on NOSCRIPT) with the 7 keys and ARGV = arena id, n_slots,
 * args[0..nargs). Handles an index that belongs to another arena (re-initialises it, or marks
 * the handle stale). Returns the reply (caller frees with freeReplyObject), or NULL after an
 * error (the connection is then closed and the error counted). */
struct redisReply *rconn_script(cache_t *c, rconn_t *r, int script, int nargs, const char **args,
                                const size_t *lens);
/* Counts an error, logs it, frees the context and schedules the next attempt. */
void rconn_fail(cache_t *c, rconn_t *r, const char *what, const char *detail);
/* On the thread that owns rc: stores block name (buf: block_bytes of KV, then meta_bytes of
 * parent and tokens) in the arena and indexes it (alloc script, arena_write, commit script).
 * 0 when it is indexed (by this call or before), -1 when dropped (counted). */
int cache_write_block(cache_t *c, rconn_t *rc, uint64_t name, const void *buf);
/* The consistency check of cache_check (step connection). */
int index_check(cache_t *c, char *errstr, size_t errlen);

#endif
