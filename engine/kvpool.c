/* engine/kvpool.c: KV block refcounts, free list, name index and LRU (see kvpool.h). */
#include "kvpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>

#define NIL (-1)

struct kvpool {
    int n_blocks;
    int block_tokens;
    unsigned char secret[KVPOOL_SECRET_BYTES];
    int32_t *refcnt;     /* [n_blocks] */
    uint8_t *named;      /* [n_blocks] */
    uint64_t *name;      /* [n_blocks] valid when named */
    uint64_t *parent;    /* [n_blocks] the parent name it was published with (when named) */
    int32_t *tok;        /* [n_blocks][block_tokens] the tokens it was published with */
    int32_t *free_list;  /* stack of free ids */
    int n_free;
    int n_used;
    /* LRU of cached blocks: doubly linked; head = least recently used. */
    int32_t *prev, *next;
    int32_t lru_head, lru_tail;
    int n_cached;
    /* name -> block: open addressing, linear probing, backward-shift deletion. */
    uint64_t *ht_key;
    int32_t *ht_val;     /* NIL = empty slot */
    size_t ht_mask;
    kvpool_stats_t stats;
};

static size_t ht_slot(const kvpool_t *p, uint64_t key)
{
    return (size_t)(key * 0x9E3779B97F4A7C15ull >> 17) & p->ht_mask;
}

static int32_t ht_get(const kvpool_t *p, uint64_t key)
{
    for (size_t i = ht_slot(p, key);; i = (i + 1) & p->ht_mask) {
        if (p->ht_val[i] == NIL) return NIL;
        if (p->ht_key[i] == key) return p->ht_val[i];
    }
}

static void ht_put(kvpool_t *p, uint64_t key, int32_t val)
{
    size_t i = ht_slot(p, key);
    while (p->ht_val[i] != NIL) i = (i + 1) & p->ht_mask;
    p->ht_key[i] = key;
    p->ht_val[i] = val;
}

static void ht_del(kvpool_t *p, uint64_t key)
{
    size_t i = ht_slot(p, key);
    while (p->ht_val[i] != NIL && p->ht_key[i] != key) i = (i + 1) & p->ht_mask;
    if (p->ht_val[i] == NIL) return;
    /* Backward-shift: move later entries of the probe run into the hole when allowed. */
    size_t hole = i;
    for (size_t j = (i + 1) & p->ht_mask; p->ht_val[j] != NIL; j = (j + 1) & p->ht_mask) {
        size_t home = ht_slot(p, p->ht_key[j]);
        /* j's entry may move to hole if home is not in (hole, j] cyclically. */
        int in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_range) {
            p->ht_key[hole] = p->ht_key[j];
            p->ht_val[hole] = p->ht_val[j];
            hole = j;
        }
    }
    p->ht_val[hole] = NIL;
}

static void lru_remove(kvpool_t *p, int32_t b)
{
    if (p->prev[b] != NIL) p->next[p->prev[b]] = p->next[b];
    else p->lru_head = p->next[b];
    if (p->next[b] != NIL) p->prev[p->next[b]] = p->prev[b];
    else p->lru_tail = p->prev[b];
    p->prev[b] = p->next[b] = NIL;
    p->n_cached--;
}

static void lru_push_tail(kvpool_t *p, int32_t b)
{
    p->prev[b] = p->lru_tail;
    p->next[b] = NIL;
    if (p->lru_tail != NIL) p->next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_cached++;
}

void kvpool_free(kvpool_t *p)
{
    if (!p) return;
    free(p->refcnt);
    free(p->named);
    free(p->name);
    free(p->parent);
    free(p->tok);
    free(p->free_list);
    free(p->prev);
    free(p->next);
    free(p->ht_key);
    free(p->ht_val);
    sodium_memzero(p->secret, sizeof p->secret);
    free(p);
}

kvpool_t *kvpool_new(int n_blocks, int block_tokens, const unsigned char *secret, char *errstr,
                     size_t errlen)
{
    if (n_blocks <= 0 || block_tokens <= 0 || !secret) {
        snprintf(errstr, errlen, "kvpool: need at least one block of at least one token, and "
                 "a secret");
        return NULL;
    }
    if (sodium_init() < 0) {
        snprintf(errstr, errlen, "kvpool: libsodium failed to initialise");
        return NULL;
    }
    kvpool_t *p = calloc(1, sizeof *p);
    if (!p) goto oom;
    p->n_blocks = n_blocks;
    p->block_tokens = block_tokens;
    memcpy(p->secret, secret, sizeof p->secret);
    size_t cap = 16;
    while (cap < (size_t)n_blocks * 2) cap <<= 1;
    p->ht_mask = cap - 1;
    p->refcnt = calloc((size_t)n_blocks, sizeof *p->refcnt);
    p->named = calloc((size_t)n_blocks, 1);
    p->name = calloc((size_t)n_blocks, sizeof *p->name);
    p->parent = calloc((size_t)n_blocks, sizeof *p->parent);
    p->tok = calloc((size_t)n_blocks * (size_t)block_tokens, sizeof *p->tok);
    p->free_list = malloc((size_t)n_blocks * sizeof *p->free_list);
    p->prev = malloc((size_t)n_blocks * sizeof *p->prev);
    p->next = malloc((size_t)n_blocks * sizeof *p->next);
    p->ht_key = calloc(cap, sizeof *p->ht_key);
    p->ht_val = malloc(cap * sizeof *p->ht_val);
    if (!p->refcnt || !p->named || !p->name || !p->parent || !p->tok || !p->free_list ||
        !p->prev || !p->next || !p->ht_key || !p->ht_val)
        goto oom;
    for (size_t i = 0; i < cap; i++) p->ht_val[i] = NIL;
    /* Stack popped from the end: hand out low ids first. */
    for (int i = 0; i < n_blocks; i++) {
        p->free_list[i] = n_blocks - 1 - i;
        p->prev[i] = p->next[i] = NIL;
    }
    p->n_free = n_blocks;
    p->lru_head = p->lru_tail = NIL;
    return p;
oom:
    kvpool_free(p);
    snprintf(errstr, errlen, "kvpool: out of memory for %d blocks", n_blocks);
    return NULL;
}

int kvpool_n_blocks(const kvpool_t *p) { return p->n_blocks; }
int kvpool_n_available(const kvpool_t *p) { return p->n_free + p->n_cached; }
int kvpool_n_used(const kvpool_t *p) { return p->n_used; }
int kvpool_refcount(const kvpool_t *p, int32_t b) { return p->refcnt[b]; }
const kvpool_stats_t *kvpool_stats(const kvpool_t *p) { return &p->stats; }

int32_t kvpool_alloc(kvpool_t *p)
{
    int32_t b;
    if (p->n_free > 0) {
        b = p->free_list[--p->n_free];
    } else if (p->lru_head != NIL) {
        b = p->lru_head;
        lru_remove(p, b);
        ht_del(p, p->name[b]);
        p->named[b] = 0;
        p->stats.evictions++;
    } else {
        return NIL;
    }
    p->refcnt[b] = 1;
    p->n_used++;
    return b;
}

void kvpool_ref(kvpool_t *p, int32_t b)
{
    if (p->refcnt[b]++ == 0) {
        /* Only cached (named) blocks can be revived from zero. */
        lru_remove(p, b);
        p->n_used++;
    }
}

void kvpool_unref(kvpool_t *p, int32_t b)
{
    if (p->refcnt[b] <= 0) {
        fprintf(stderr, "kvpool: BUG: unref of block %d with refcount %d\n", b, p->refcnt[b]);
        abort();
    }
    if (--p->refcnt[b] > 0) return;
    p->n_used--;
    if (p->named[b]) lru_push_tail(p, b);
    else p->free_list[p->n_free++] = b;
}

/* Keyed BLAKE2b, 8 bytes out, of tag, parent (little-endian) and data. */
static uint64_t keyed64(const kvpool_t *p, unsigned char tag, uint64_t parent, const void *data,
                        size_t len)
{
    crypto_generichash_state st;
    unsigned char le[9], out[8];
    le[0] = tag;
    for (int i = 0; i < 8; i++) le[1 + i] = (unsigned char)(parent >> (8 * i));
    crypto_generichash_init(&st, p->secret, sizeof p->secret, sizeof out);
    crypto_generichash_update(&st, le, sizeof le);
    if (len) crypto_generichash_update(&st, data, len);
    crypto_generichash_final(&st, out, sizeof out);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)out[i] << (8 * i);
    return v;
}

uint64_t kvpool_block_name(const kvpool_t *p, uint64_t parent, const int32_t *tokens)
{
    return keyed64(p, 'N', parent, tokens, (size_t)p->block_tokens * sizeof *tokens);
}

uint64_t kvpool_derive_seed(const kvpool_t *p, uint64_t parent, const void *data, size_t len)
{
    return keyed64(p, 'S', parent, data, len);
}

/* The block named name if it was published with parent and tokens; NIL when none holds the
 * name; -2 when one does with other tokens or another parent. */
static int32_t find_verified(const kvpool_t *p, uint64_t name, uint64_t parent,
                             const int32_t *tokens)
{
    int32_t b = ht_get(p, name);
    if (b == NIL) return NIL;
    if (p->parent[b] != parent ||
        memcmp(p->tok + (size_t)b * p->block_tokens, tokens,
               (size_t)p->block_tokens * sizeof *tokens))
        return -2;
    return b;
}

int32_t kvpool_lookup(kvpool_t *p, uint64_t name, uint64_t parent, const int32_t *tokens)
{
    p->stats.lookups++;
    int32_t b = find_verified(p, name, parent, tokens);
    if (b == -2) p->stats.mismatches++;
    if (b < 0) return NIL;
    p->stats.hits++;
    kvpool_ref(p, b);
    return b;
}

int kvpool_contains(const kvpool_t *p, uint64_t name, uint64_t parent, const int32_t *tokens)
{
    return find_verified(p, name, parent, tokens) >= 0;
}

void kvpool_publish(kvpool_t *p, int32_t b, uint64_t name, uint64_t parent,
                    const int32_t *tokens)
{
    if (p->named[b] || ht_get(p, name) != NIL) return;
    p->named[b] = 1;
    p->name[b] = name;
    p->parent[b] = parent;
    memcpy(p->tok + (size_t)b * p->block_tokens, tokens,
           (size_t)p->block_tokens * sizeof *tokens);
    ht_put(p, name, b);
}
