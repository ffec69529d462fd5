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
 * by the cache (its own Redis connection), off the step thread. cache_stats may be called from
 * any thread. Errors: cache_new returns NULL and fills errstr; the rest cannot fail visibly
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

/* As cache_locate, for this host: how many leading blocks of the chain names[0..n) this host's
 * index holds (one round trip on the same connection, under the same lock). 0 when tier 2 is
 * off or Redis is unavailable; -1 only for bad arguments. Touches no LRU. */
int cache_locate_here(cache_t *c, const uint64_t *names, int n);

/* This host's id in the index and the fleet (cache_config_t.host_id, or the hostname). The
 * string lives as long as c. "" when tier 2 is off. */
const char *cache_host_id(const cache_t *c);

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
