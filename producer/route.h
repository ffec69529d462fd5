/* producer/route.h: the routing of requests to input partitions: a routing key per request and
 * consistent hashing with bounded load (Mirrokni, Thorup, Zadimoghaddam), so that requests
 * sharing a prefix land on one partition (one worker's KV cache) while that partition is not
 * overloaded, and a hot prefix spreads over the next partitions of the ring instead of
 * drowning one. Every step is defined on bytes and 64-bit integers so that producers in other
 * languages can do the same (README, "Routing requests to partitions"; the test vectors are in
 * tests/test_route.c).
 *
 * Hash: XXH64 with seed 0 (xxHash, as in Python's xxhash.xxh64_intdigest, Go's
 * cespare/xxhash.Sum64, Java's zero-allocation-hashing xx()) of the bytes named below.
 *
 * Routing key (route_request_key), first that applies:
 *   1. `prefix_key` (a JSON string of 1..ROUTE_MAX_PREFIX_KEY bytes): its UTF-8 bytes, whole;
 *   2. the canonical form of the prompt, cut to its first prefix_bytes bytes (prefix_bytes > 0):
 *      `prompt`: its UTF-8 bytes; `messages`: for each message in order, role, 0x1F, content
 *      (a string, or the concatenation of its text parts' `text`), 0x1E; `input_ids`: each id in
 *      decimal followed by ','. (The producer has no model, so this stands for the rendered
 *      prompt: requests whose messages share their start share a key as their rendered prompts
 *      do.)
 *   3. `id` (a string): its bytes, whole (also when prefix_bytes is 0);
 * and no key otherwise.
 *
 * Ring: for each partition p in [0, n) and virtual node v in [0, vnodes), a point
 * XXH64(ASCII decimal p, '-', ASCII decimal v), e.g. "3-17"; points sorted ascending by
 * (hash, p, v). A point depends on (p, v) only: adding a partition moves only keys to it.
 *
 * Pick (route_pick) for key hash h, with load[p] the messages sent to p among the last `window`
 * messages this router picked for (a count window, not a time window):
 *   1. if `window` messages are recorded, forget the oldest (its partition's load drops by 1);
 *   2. m = messages still recorded; cap = ceil(((1 + eps) * (m + 1)) / n) in IEEE double
 *      arithmetic, evaluated in that order;
 *   3. from the first point whose hash >= h (wrapping to the first point), walk the ring in
 *      order: the first partition with load < cap is the answer (one exists: the loads add up
 *      to m < n * cap);
 *   4. record it (its load grows by 1).
 * So after every pick no partition holds more than ceil((1 + eps) * count / n) of the window's
 * count messages, and a key keeps its home partition (the first point's) while that is under
 * the cap. route_home is step 3 without loads.
 *
 * Threads: a route_t is used by one thread at a time (no locks). Errors: NULL or -1 plus the
 * caller's errstr. */
#ifndef SPILLWAY_ROUTE_H
#define SPILLWAY_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define ROUTE_MAX_PREFIX_KEY 256 /* bytes of a `prefix_key`, at most */
#define ROUTE_MAX_PARTITIONS 65536
#define ROUTE_MAX_VNODES     4096

typedef struct {
    long prefix_bytes; /* bytes of the canonical prompt in its key (0: key by id);
                          key route.prefix_bytes */
    double eps;        /* load cap = ceil((1 + eps) * mean); key route.eps */
    long window;       /* messages in the load window; key route.window */
    long vnodes;       /* ring points per partition; key route.vnodes */
} route_config_t;

/* The defaults (the same as the route.* keys of the key table, worker/config.c; test_route
 * checks it). */
void route_config_default(route_config_t *c);

typedef struct route route_t;

/* A router over n_partitions partitions (1..ROUTE_MAX_PARTITIONS) with cfg's eps (0..5),
 * window (>= 1) and vnodes (1..ROUTE_MAX_VNODES); cfg is copied. NULL + errstr on a bad value
 * or out of memory. */
route_t *route_new(int n_partitions, const route_config_t *cfg, char *errstr, size_t errlen);
/* NULL is a no-op. */
void route_free(route_t *r);

/* XXH64(key, len, seed 0). */
uint64_t route_hash(const void *key, size_t len);
/* The key's home: the partition of the first ring point at or after h (loads ignored). */
int route_home(const route_t *r, uint64_t h);
/* The partition for the next message with key hash h under the bounded load (the steps above);
 * records it in the window. */
int route_pick(route_t *r, uint64_t h);
/* Messages recorded for partition p (0 <= p < n) in the window now. */
long route_load(const route_t *r, int p);
/* Messages recorded in the window now (at most window). */
long route_count(const route_t *r);
/* ceil(((1 + eps) * count) / n) for a window holding count messages: the most any partition
 * holds after a pick that left count recorded. */
long route_cap(const route_t *r, long count);
int route_partitions(const route_t *r);

/* Where a request's key came from. */
enum { ROUTE_KEY_NONE = 0, ROUTE_KEY_PREFIX_KEY = 1, ROUTE_KEY_PROMPT = 2, ROUTE_KEY_ID = 3 };

/* The routing key hash of request req (a JSON object; borrowed) as defined above, into *hash;
 * with use_prefix_key 0 step 1 is skipped (the `bytes` mode: the prompt's bytes only).
 * ROUTE_KEY_* (NONE: *hash untouched), or -1 + errstr when `prefix_key` is present and not null
 * but not a string of 1..ROUTE_MAX_PREFIX_KEY bytes without U+0000 (the request does not match
 * schemas/request.schema.json: refuse it), whatever use_prefix_key. */
int route_request_key(const json_t *req, long prefix_bytes, int use_prefix_key, uint64_t *hash,
                      char *errstr, size_t errlen);

#endif
