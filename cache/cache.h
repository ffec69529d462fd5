/* cache/cache.h: tier 2 of the prefix KV cache: a host-memory arena shared by every worker
 * process of a host, indexed in Redis.
 *
 * Tier 1 is the backend's own block pool (engine/kvpool.c). A full KV block is named by the
 * engine's chained keyed hash (engine/kvpool.h: keyed by the deployment's secret file, see
 * cache_secret_load), so equal prefixes have equal names in every process with that secret.
 * The bytes of a block are opaque here: block_bytes of them, the same on every backend; with
 * them the slot keeps the parent name and the token ids the block was computed from, which the
 * engine compares with its own before using the block (a name is an index, never trusted).
 *
 * Arena: a file (default /dev/shm/spillway-UID/spillway.arena) mapped MAP_SHARED by every
 * process, laid out as
 *   [header: 4096 bytes][slot headers: n_slots x 64 bytes][slots: n_slots x (block_bytes of
 *    KV + the parent name and block_tokens token ids), each slot 4096-byte aligned]
 * The header holds magic "SPILLWAYARENA\0\0\0", a layout version, the pool seed (keyed hash of
 * the model fingerprint), block_tokens, block_bytes, n_slots and a random 64-bit arena id drawn when the
 * arena is (re)initialised. On attach a header that does not match the parameters (another model,
 * block geometry or version, or a torn initialisation) is logged naming the field and the arena
 * is re-initialised: never wrong KV. A slot header holds a seqlock word (odd while being written),
 * the block name, the slot generation (from Redis) and an XXH3_64 checksum of the slot's bytes
 * (KV, parent name and tokens).
 * The file outlives the processes (a worker killed with kill -9 and restarted finds its blocks).
 *
 * Redis index, keys "<namespace>:<host_id>:<seed hex>:..." (one index per host and model):
 *   ...:meta   hash: n_slots, arena id (a mismatch with the arena resets the index)
 *   ...:free   list of free slot ids
 *   ...:lru    sorted set slot -> last use (a counter); every non-free slot is in it
 *   ...:sname  hash slot -> name (hex) of the block being/been written there
 *   ...:sgen   hash slot -> generation, incremented at every allocation of the slot
 *   ...:blk    hash name (hex) -> "slot:gen", only for blocks completely written
 * changed only by Lua scripts (EVALSHA, loaded at connect), so each change is atomic:
 *   alloc   a free slot, else the least recently used one (its block leaves blk: an eviction);
 *           bumps its generation; returns slot and generation (nothing if the name is indexed)
 *   commit  indexes name -> slot:gen if the slot still has that generation
 *   lookup  the longest indexed run of a name chain, touching each in the LRU
 * A reader copies a slot only when its header shows the expected name and generation, even
 * seqlock before and after the copy and the checksum matches; anything else (evicted and rewritten
 * meanwhile, a writer that crashed mid-copy) is a miss, never wrong bytes.
 *
 * Redis is a hint: every command is bounded by cmd_timeout_ms; when Redis is down or fails, the
 * cache reports misses and drops stores (tier 1 keeps serving) and reconnects with exponential
 * backoff (backoff_min_ms doubling to backoff_max_ms). Outputs never depend on it.
 *
 * Threads: cache_lookup, cache_fetch, cache_store_begin/commit are called from one thread (the
 * engine's step thread). Stores are written to the arena and indexed by a writer thread owned
 * by the cache (its own Redis connection), off the step thread. With tier 2 on, a fleet thread
 * registers the host (fleet.c), and with peer_listen a server thread serves blocks to other
 * hosts (peer.c), each on its own connection; cache_locate and cache_peer_* run on their
 * callers' threads (never the step thread: they wait on Redis and the network), each family on
 * a connection of its own under a lock of the handle. cache_stats may be called from any
 * thread. Errors: cache_new returns NULL and fills errstr; the rest cannot fail visibly
 * (misses and dropped stores are counted in the stats). */
#ifndef SPILLWAY_CACHE_H
#define SPILLWAY_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct cache cache_t;

/* Every tunable number, with its default in cache_config_default(). Strings are borrowed during
 * cache_new only. */
typedef struct {
    const char *arena_path;      /* shared-memory file; "" (default): the per-user
                                    /dev/shm/spillway-<euid>/spillway.arena, its folder made
                                    0700 and refused unless it is this user's, mode 0700 */
    const char *secret_path;     /* the KV name secret, for cache_secret_load (not read by
                                    cache_new); "" (default): spillway.secret in the same
                                    per-user folder */
    long arena_mb;               /* arena size in MiB, header included (1024) */
    const char *redis_host;      /* "" = tier 2 off ("") */
    int redis_port;              /* 6379 */
    const char *redis_user;      /* ACL user ("" = none: AUTH password only) */
    const char *redis_password;  /* "" = no AUTH */
    int redis_db;                /* SELECT (0) */
    const char *namespace_;      /* key prefix ("spillway") */
    const char *host_id;         /* "" = gethostname() */
    int connect_timeout_ms;      /* 200 */
    int cmd_timeout_ms;          /* per command (50) */
    int backoff_min_ms;          /* first reconnect delay (100) */
    int backoff_max_ms;          /* largest reconnect delay (5000) */
    int health_ms;               /* an idle writer thread pings Redis this often, so that the
                                  * redis_up stat follows Redis between lookups (1000; 0 = never) */
    int write_queue;             /* blocks waiting for the writer, at most; more are dropped (64) */
    /* fleet registry (fleet.c, see cache_locate) */
    const char *peer_advertise;  /* the peer address this host registers ("" = none: the host
                                    does not serve its blocks to other hosts) */
    int fleet_refresh_ms;        /* the host's record is refreshed this often (2000) */
    int fleet_ttl_ms;            /* records older than this are ignored (10000) */
    /* KV across hosts (peer.c, see cache_peer_prefetch) */
    const char *peer_listen;     /* "host:port" the peer server listens on ("" = off: this
                                    process serves no blocks; it may still fetch) */
    const unsigned char *peer_secret; /* CACHE_SECRET_BYTES, the deployment secret (borrowed
                                    during cache_new: a key is derived from it); NULL = no peer
                                    serving or fetching */
    int peer_timeout_ms;         /* a whole fetch, and each server session step (2000) */
    int peer_bandwidth_mbps;     /* cost model start: MB/s from a peer (1000) */
    int peer_rtt_us;             /* cost model start: fixed cost of a fetch, µs (1000) */
    int prefill_tps;             /* cost model start: prefill tokens per second (2000) */
    /* logging: level 0 error, 1 warn, 2 info, 3 debug; fn NULL = stderr */
    int log_level;               /* 2 */
    void (*log_fn)(void *arg, int level, const char *msg);
    void *log_arg;
} cache_config_t;

void cache_config_default(cache_config_t *c);

/* Block geometry and identity; all must match for an arena or index to be reused. */
typedef struct {
    uint64_t seed;        /* the engine's pool seed (model fingerprint, block size, KV type) */
    int block_tokens;     /* tokens per block */
    size_t block_bytes;   /* bytes per block */
} cache_geometry_t;

/* Maps (creating or re-initialising) the arena and connects to Redis (a failed connection is not
 * an error: it is retried with backoff). The arena file is created 0600; an existing one that is
 * not a regular file, is a symlink, has more than one link, belongs to another user or grants
 * group/other access is refused (as is a default folder not this user's with mode 0700): the
 * handle is then returned with tier 2 off (lookups miss, stores are dropped), the refusal logged
 * as an error naming the fix and counted in cache_stats.arena_refused. NULL + errstr when the
 * arena cannot be created or mapped otherwise (size too small for one slot, no room, ...) or out
 * of memory. */
cache_t *cache_new(const cache_config_t *cfg, const cache_geometry_t *geo, char *errstr,
                   size_t errlen);
/* Waits for the writer to finish the queued stores (bounded by cmd timeouts), then frees. */
void cache_free(cache_t *c);

/* Step thread. names[0..n) is a chain (names[i] follows names[i-1]). Returns how many leading
 * blocks the index holds (0..n; 0 when Redis is unavailable). Remembers their slots for
 * cache_fetch until the next cache_lookup. */
int cache_lookup(cache_t *c, const uint64_t *names, int n);
/* Step thread. Copies block i (< the last cache_lookup's result) into dst (block_bytes), and the
 * parent name and tokens ([block_tokens]) it was stored with into *parent and tokens; the caller
 * must compare them with its own. 0, or -1 on a miss (evicted, rewritten or torn since the
 * lookup). */
int cache_fetch(cache_t *c, int i, void *dst, uint64_t *parent, int32_t *tokens);

/* Step thread. Offers a newly computed block, named name, computed from tokens
 * ([block_tokens], copied) after the block named parent. Returns a buffer of block_bytes to fill
 * with its KV, or NULL when the block is not wanted (known to be indexed already, queue full,
 * tier 2 off/down). */
void *cache_store_begin(cache_t *c, uint64_t name, uint64_t parent, const int32_t *tokens);
/* Hands the filled buffer (from cache_store_begin) to the writer thread. */
void cache_store_commit(cache_t *c, void *buf);

/* Discards a buffer from cache_store_begin without storing it (it could not be filled). */
void cache_store_cancel(cache_t *c, void *buf);

/* Fills *tier so that engine_set_kv_tier(e, tier) makes c the engine's tier 2 (c must outlive
 * that attachment). */
void cache_engine_tier(cache_t *c, engine_kv_tier_t *tier);

typedef struct {
    uint64_t lookups;        /* blocks asked for by cache_lookup */
    uint64_t hits;           /* blocks copied by cache_fetch */
    uint64_t misses_torn;    /* fetches refused by the generation/seqlock/checksum check */
    uint64_t stores;         /* blocks written and indexed */
    uint64_t stores_dropped; /* offered but dropped (queue full, Redis down, slot raced) */
    uint64_t evictions;      /* blocks this process evicted to make room */
    uint64_t redis_errors;   /* failed or timed-out commands and connections */
    int redis_up;            /* 1 while connected */
    int arena_slots;         /* slots in the arena */
    int arena_used;          /* slots not on the free list at the last index call (-1 unknown) */
    int arena_refused;       /* 1: the arena file or folder was refused, tier 2 is off */
    /* KV across hosts (peer.c) */
    uint64_t peer_fetches;      /* fetches that stored every block asked for */
    uint64_t peer_blocks;       /* blocks fetched from peers, verified and stored */
    uint64_t peer_bytes;        /* bytes received from peers (frames included) */
    uint64_t peer_recompute;    /* prefetches the cost model sent to recomputation */
    uint64_t peer_fail[6];      /* fetches that fell short, by CACHE_PEER_E* - 1 */
    uint64_t peer_served;       /* blocks this process's server sent */
    uint64_t peer_refused;      /* connections its server refused (failed authentication,
                                   other geometry, bad frames) */
    double peer_prefill_tps;    /* the cost model's prefill rate now */
} cache_stats_t;
void cache_stats(cache_t *c, cache_stats_t *st);

/* ---- the fleet: which other host holds a prefix (fleet.c) ----
 *
 * With tier 2 on, a thread of the cache (its own Redis connection) registers this host every
 * fleet_refresh_ms in the hash "<namespace>:fleet:<seed hex>:hosts" (one per model: hosts of
 * another model never see each other): field host_id -> "v1 <ms> <peer address>", ms being
 * Redis's own clock (TIME) at the refresh, so hosts' clocks need not agree. Every worker of a
 * host writes the same field (same record). Records older than fleet_ttl_ms are ignored, older
 * than ten times that are deleted by the next refresh of any host. What is read back from Redis
 * is checked: a host id of 1..CACHE_HOST_ID_MAX-1 printable non-space ASCII bytes, an address of
 * at most CACHE_PEER_ADDR_MAX-1 such bytes; anything else is skipped (and logged at debug). */
#define CACHE_HOST_ID_MAX 64
#define CACHE_PEER_ADDR_MAX 64
#define CACHE_FLEET_MAX_HOSTS 256 /* hosts read back from the registry, at most */

typedef struct {
    char host_id[CACHE_HOST_ID_MAX];     /* NUL-terminated */
    char peer_addr[CACHE_PEER_ADDR_MAX]; /* "host:port", "" when that host does not serve */
    int n_blocks;                        /* leading blocks of the chain its index holds */
    int64_t age_ms;                      /* since its record was last refreshed */
} cache_peer_t;

/* Any thread (calls are serialised by a lock of the handle, on a Redis connection of their
 * own: a call may wait for another's round trips). names[0..n) is a chain as in cache_lookup.
 * Fills out[0..k) (caller-owned, max_out entries) with the live hosts other than this one,
 * the most blocks first (ties: the freshest record), each with how many LEADING blocks of the
 * chain its Redis index holds (0 included); k <= max_out is returned. Two pipelined round trips
 * (TIME + HGETALL of the registry, then one HMGET per host on its blk hash), each read bounded by
 * cmd_timeout_ms. The counts are a hint (a block may be evicted right after): a host's peer
 * server verifies again, and so does the caller. 0 when tier 2 is off, Redis is unavailable
 * (counted in redis_errors) or no other host is live; -1 only for bad arguments. Touches no
 * LRU. */
int cache_locate(cache_t *c, const uint64_t *names, int n, cache_peer_t *out, int max_out);
/* As cache_locate, and *here (not NULL): how many leading blocks of the chain this host's index
 * holds, asked in the same pipeline (0 when no other host is live: nothing to compare with).
 * Same threads and returns. (cache/locate.c) */
int cache_locate_here(cache_t *c, const uint64_t *names, int n, cache_peer_t *out, int max_out,
                      int *here);

/* This host's id in the index and the fleet (cache_config_t.host_id, or the hostname). The
 * string lives as long as c. "" when tier 2 is off. */
const char *cache_host_id(const cache_t *c);

/* ---- KV across hosts (peer.c) ----
 *
 * A host's blocks can be fetched by the other hosts of its fleet. One process per host serves
 * (peer_listen: of the host's workers the first that binds the port serves, the others retry
 * every fleet_refresh_ms and take over when it goes; port 0 = an ephemeral port per process,
 * for tests). The registered address is peer_advertise, or else the listen address with its
 * bound port (a wildcard host replaced by the hostname). The port must only be reachable inside
 * the deployment: authentication keeps strangers from reading blocks, nothing else is offered.
 *
 * Protocol (TCP; integers little-endian; the block bytes exactly as the arena holds them, so
 * hosts must share byte order and the engine's KV layout, which the geometry check enforces):
 *   C -> S  hello  "SWPEER01", seed u64, block_tokens u32, block_bytes u64, nonce_c[32]
 *   S -> C  "SWPEER01", nonce_s[32], HMAC-SHA256(k, "S" hello nonce_s)
 *   C -> S  HMAC-SHA256(k, "C" hello nonce_s)
 * k is derived from the deployment secret (crypto_kdf, context "swpeer01"): each side proves it
 * knows k over the other's fresh nonce (mutual challenge-response); a server refuses another
 * geometry or a wrong tag by closing. The session key is HMAC-SHA256(k, "K" hello nonce_s).
 * Then frames: an 8-byte header (u32 payload length, u8 type, 3 zero bytes), the payload
 * encrypted and authenticated with ChaCha20-Poly1305 (IETF) under the session key, the header as
 * associated data, the nonce the direction and the frame's sequence number (a frame replayed,
 * dropped or reordered fails), then the 16-byte tag. Frames:
 *   REQ    C -> S  u32 n (1..CACHE_PEER_MAX_NAMES), n block names (u64)
 *   BLOCK  S -> C  name u64, checksum u64, parent u64, block_tokens token ids (i32), KV bytes:
 *                  the leading blocks of REQ's chain the server's index and arena hold, in order
 *   END    S -> C  u32 blocks sent
 * Every length is checked against its type's exact size before anything is read into memory.
 * The server handles one connection at a time, each step bounded by peer_timeout_ms.
 *
 * Fetching: the client verifies each BLOCK as tier 2 does (the name is the one asked for, the
 * parent the previous block's, the token ids the request's, the checksum the bytes'), stores it
 * in this host's arena and index (so the engine's tier-2 path finds it, and checks it again),
 * and stops at the first failure. A fetch is bounded by peer_timeout_ms. */
#define CACHE_PEER_MAX_NAMES 4096

enum { /* why a fetch fell short (cache_prefetch_t.error); stats index error - 1 */
    CACHE_PEER_OK = 0,
    CACHE_PEER_ECONNECT,  /* no connection (peer gone, refused, address unusable) */
    CACHE_PEER_EAUTH,     /* the handshake failed (another secret or geometry, not a server) */
    CACHE_PEER_ETIMEOUT,  /* peer_timeout_ms passed */
    CACHE_PEER_ECLOSED,   /* the peer closed, or a frame failed authentication */
    CACHE_PEER_EDATA,     /* a block failed verification (name, parent, tokens, checksum) */
    CACHE_PEER_ESTORE,    /* a verified block could not be stored here */
};
const char *cache_peer_error_name(int error); /* "ok", "connect", ... */

enum { CACHE_PEER_NONE, CACHE_PEER_RECOMPUTE, CACHE_PEER_FETCH };

typedef struct {
    int n_local;                   /* leading blocks this host's index held */
    int n_peer;                    /* leading blocks the best other host held */
    int decision;                  /* CACHE_PEER_NONE: no live serving host holds more than
                                      n_local; _RECOMPUTE: the cost model chose to recompute;
                                      _FETCH: fetched */
    int fetched;                   /* blocks fetched, verified and stored (from n_local on) */
    int error;                     /* CACHE_PEER_E*, when fetched < n_peer - n_local */
    double t_fetch_s, t_compute_s; /* the cost model's estimates for those blocks */
    char peer[CACHE_HOST_ID_MAX];  /* the host chosen ("" none) */
} cache_prefetch_t;

/* Any thread except the step thread (it waits on Redis and the network: a few round trips and
 * at most peer_timeout_ms; calls are serialised per handle). names[0..n) is a request's chain
 * (names[0] follows parent, the chain seed), tokens[n x block_tokens] its token ids. Finds how
 * many leading blocks this host holds, which live host holds most (cache_locate), asks the cost
 * model, and fetches blocks [n_local, n_peer) from that host when it says so. Fills *out.
 * Returns out->fetched; 0 when peers are off (no peer_secret) or tier 2 is off. */
int cache_peer_prefetch(cache_t *c, uint64_t parent, const uint64_t *names,
                        const int32_t *tokens, int n, cache_prefetch_t *out);
/* The fetch step alone (same threads): fetches names[0..n) (names[0] follows parent) from the
 * server at addr, verifies and stores each. Returns the blocks stored, *error set when fewer
 * than n. */
int cache_peer_fetch(cache_t *c, const char *addr, uint64_t parent, const uint64_t *names,
                     const int32_t *tokens, int n, int *error);
/* The cost model (any thread): 1 when fetching n_blocks from the peer at addr is estimated
 * faster than recomputing them: rtt + n_blocks x frame bytes / bandwidth < n_blocks x
 * block_tokens / prefill rate, with that peer's measured rates (EWMAs of real fetches) or the
 * configured defaults, and the prefill rate measured for prefills of about that many tokens
 * (the nearest power-of-two length measured; else every prefill's EWMA; else the configured
 * start). The estimates into *t_fetch_s and *t_compute_s (either may be NULL). */
int cache_peer_should_fetch(cache_t *c, const char *addr, int n_blocks, double *t_fetch_s,
                            double *t_compute_s);
/* Any thread: a real prefill measurement (tokens computed in seconds) for the prefill EWMAs:
 * every prefill's, and that of prefills of the same floor(log2(tokens)). */
void cache_peer_note_prefill(cache_t *c, double tokens, double seconds);
/* Tests and benches: sets the rates the cost model starts from now: the peer at addr (NULL:
 * every peer not measured yet) and the prefill rate (which forgets the rates measured by
 * length); a value <= 0 leaves that rate as it is. */
void cache_peer_set_rates(cache_t *c, const char *addr, double bytes_per_s, double rtt_s,
                          double prefill_tps);
/* The address this process's server listens on, "host:port" with its bound port, "" when it
 * does not serve (now). Copied into buf. */
void cache_peer_listen_addr(cache_t *c, char *buf, size_t len);

/* The deployment's secret keying the KV block names (engine_config_t.kv_secret): the contents
 * of the file at path (NULL or "": spillway.secret in the per-user folder of the default arena,
 * made 0700 and refused unless it is this user's), CACHE_SECRET_BYTES random bytes, created
 * (0600, atomically) when absent.
 * Every process that shares tier 2 must read the same file. Refused (-1 + errstr naming the
 * fix) when it is a symbolic link or not a regular file, belongs to another user, grants any
 * group or other permission, or is not CACHE_SECRET_BYTES long. 0 and out filled, or -1. */
#define CACHE_SECRET_BYTES ENGINE_KV_SECRET_BYTES
int cache_secret_load(const char *path, unsigned char *out, char *errstr, size_t errlen);

/* For tests and `spillway inspect`-style tools: checks the index against the arena: every slot is
 * either free or in the LRU (never both, none missing), every indexed block points at a slot
 * whose arena header holds that name and generation, no duplicate free slot. 0 when consistent,
 * else -1 with the first problem in errstr (also when Redis is unavailable). */
int cache_check(cache_t *c, char *errstr, size_t errlen);

#endif
