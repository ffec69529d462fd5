/* engine/kvpool.h: bookkeeping of the KV block pool (tier 1 of the prefix cache). Internal.
 *
 * Blocks are ids in [0, n_blocks); their bytes live in the backend. A block is
 *   free      refcount 0, no name: on the free list;
 *   in use    refcount > 0 (held by sequences; a shared prefix block has one ref per holder);
 *   cached    refcount 0 with a name (a full block's chained hash): in the LRU, reusable by a
 *             lookup of its name until evicted by an allocation that finds no free block.
 * Names: h_i = BLAKE2b-64 keyed by the pool's 32-byte secret of ('N', h_{i-1}, tokens of block
 * i), h_{-1} = a chain seed (kvpool_derive_seed: model fingerprint, block size, KV type, and the
 * request's cache scope), so equal prefixes in one scope get equal names, and names cannot be
 * computed (nor collisions searched for) without the secret.
 * Trust: a name is only an index. A named block also keeps the tokens it was computed from and
 * its parent's name; a lookup gets the block only when both equal the caller's (a mismatch is
 * a miss, counted in kvpool_stats_t.mismatches), so KV computed from other tokens is never
 * reused, whatever the names.
 *
 * Not thread-safe: owned by the engine's step thread. */
#ifndef SPILLWAY_ENGINE_KVPOOL_H
#define SPILLWAY_ENGINE_KVPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvpool kvpool_t;

typedef struct {
    uint64_t lookups;      /* blocks looked up by name */
    uint64_t hits;         /* of which found */
    uint64_t evictions;    /* cached blocks reclaimed by allocation */
    uint64_t mismatches;   /* lookups whose name matched a block of other tokens or parent
                              (refused: a name collision or a forgery) */
} kvpool_stats_t;

#define KVPOOL_SECRET_BYTES 32

/* secret: KVPOOL_SECRET_BYTES bytes (copied) keying every name and seed. */
kvpool_t *kvpool_new(int n_blocks, int block_tokens, const unsigned char *secret, char *errstr,
                     size_t errlen);
void kvpool_free(kvpool_t *p);

int kvpool_n_blocks(const kvpool_t *p);
/* Blocks an allocation can get now: free + cached (evictable). */
int kvpool_n_available(const kvpool_t *p);
/* Blocks with refcount > 0. */
int kvpool_n_used(const kvpool_t *p);
int kvpool_refcount(const kvpool_t *p, int32_t block);

/* A fresh unnamed block with refcount 1 (a free one first, else the least recently used cached
 * one, whose name is dropped), or -1 when every block is in use. */
int32_t kvpool_alloc(kvpool_t *p);
void kvpool_ref(kvpool_t *p, int32_t block);
/* Drops one reference. At zero a named block becomes cached (most recently used), an unnamed
 * one free. */
void kvpool_unref(kvpool_t *p, int32_t block);

/* Name of a full block (tokens: [block_tokens]) that follows parent (parent = the chain seed
 * for the first block). */
uint64_t kvpool_block_name(const kvpool_t *p, uint64_t parent, const int32_t *tokens);
/* A chain seed: keyed hash of parent (0 for a root) and data[0..len) (any bytes). */
uint64_t kvpool_derive_seed(const kvpool_t *p, uint64_t parent, const void *data, size_t len);

/* Block holding name whose stored parent and tokens ([block_tokens]) equal the given ones,
 * with one reference added (taken out of the LRU), or -1 (a name held by other tokens or
 * another parent counts a mismatch). */
int32_t kvpool_lookup(kvpool_t *p, uint64_t name, uint64_t parent, const int32_t *tokens);
/* Whether kvpool_lookup would find it now, without a reference or a stats count. */
int kvpool_contains(const kvpool_t *p, uint64_t name, uint64_t parent, const int32_t *tokens);
/* Gives an in-use, full block its name, recording parent and tokens ([block_tokens], copied),
 * so later lookups find it. If another block already has the name, nothing changes (that one
 * stays the canonical copy). */
void kvpool_publish(kvpool_t *p, int32_t block, uint64_t name, uint64_t parent,
                    const int32_t *tokens);

const kvpool_stats_t *kvpool_stats(const kvpool_t *p);

#endif
