/* tests/test_kvpool.c: tier 1 of the prefix cache (engine/kvpool.c). First, names are an index
 * only: a block published under a name with other tokens or another parent (what a name
 * collision, or an attacker who found one, produces) is a miss for a lookup of that name, counted
 * as a mismatch; names are keyed by the pool's secret. Then, under a long random mix of
 * allocations, references, releases, publications and lookups, checked after every operation
 * against a shadow model: no refcount goes negative or leaks, a block is never both free and
 * held, names resolve to the block that published them until it is evicted, eviction takes the
 * least recently released cached block, and when every holder is gone every block is available
 * again. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/kvpool.h"

enum { NB = 48, HOLD = 256, ROUNDS = 200000 };

typedef struct {
    int refs[NB];         /* references the test holds on each block */
    uint64_t name[NB];    /* name published for the block, 0 none */
    uint64_t released[NB]; /* op counter when its refcount last reached 0 (LRU order) */
    int32_t held[HOLD];   /* one entry per reference held */
    int n_held;
} shadow_t;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Tokens the random test publishes a name with: derived from it. */
static void name_tokens(int32_t *t, uint64_t name)
{
    for (int i = 0; i < 16; i++) t[i] = (int32_t)((name * 31 + (uint64_t)i) & 0x7fff);
}

/* A block of the attacker's tokens published under the victim's block name (a collision) is
 * never handed to the victim's lookup. */
static void test_forged_collision(void)
{
    char err[128];
    unsigned char secret[KVPOOL_SECRET_BYTES];
    memset(secret, 7, sizeof secret);
    kvpool_t *p = kvpool_new(4, 16, secret, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    int32_t victim[16], attacker[16];
    for (int i = 0; i < 16; i++) {
        victim[i] = 100 + i;
        attacker[i] = 200 + i;
    }
    uint64_t seed = kvpool_derive_seed(p, 0, "model", 5);
    uint64_t vname = kvpool_block_name(p, seed, victim);
    /* the attacker's block, stored under the victim's name */
    int32_t b = kvpool_alloc(p);
    CHECK(b >= 0);
    kvpool_publish(p, b, vname, seed, attacker);
    kvpool_unref(p, b); /* cached */
    CHECK(kvpool_contains(p, vname, seed, victim) == 0);
    CHECK(kvpool_lookup(p, vname, seed, victim) == -1);
    CHECK(kvpool_stats(p)->mismatches == 1 && kvpool_stats(p)->hits == 0);
    /* same tokens after another parent: also refused */
    CHECK(kvpool_lookup(p, vname, seed ^ 1, attacker) == -1);
    CHECK(kvpool_stats(p)->mismatches == 2);
    /* the owner of the tokens gets it */
    CHECK(kvpool_lookup(p, vname, seed, attacker) == b);
    CHECK(kvpool_stats(p)->hits == 1);
    kvpool_unref(p, b);

    /* names are keyed: another secret names the same tokens differently; scopes differ */
    unsigned char other[KVPOOL_SECRET_BYTES];
    memset(other, 8, sizeof other);
    kvpool_t *q = kvpool_new(4, 16, other, err, sizeof err);
    kvpool_t *r = kvpool_new(4, 16, secret, err, sizeof err);
    CHECK(q && r);
    if (q && r) {
        CHECK(kvpool_derive_seed(q, 0, "model", 5) != seed);
        CHECK(kvpool_derive_seed(r, 0, "model", 5) == seed);
        CHECK(kvpool_block_name(q, seed, victim) != vname);
        CHECK(kvpool_block_name(r, seed, victim) == vname);
        CHECK(kvpool_derive_seed(p, seed, "tenant-a", 8) !=
              kvpool_derive_seed(p, seed, "tenant-b", 8));
    }
    kvpool_free(q);
    kvpool_free(r);
    kvpool_free(p);
}

static int check_invariants(const kvpool_t *p, const shadow_t *sh)
{
    int used = 0, bad = 0;
    for (int b = 0; b < NB; b++) {
        if (kvpool_refcount(p, b) != sh->refs[b]) bad++;
        if (sh->refs[b] < 0) bad++;
        if (sh->refs[b] > 0) used++;
    }
    if (kvpool_n_used(p) != used) bad++;
    if (kvpool_n_available(p) != NB - used) bad++;
    return bad;
}

int main(void)
{
    test_forged_collision();
    char err[128];
    unsigned char secret[KVPOOL_SECRET_BYTES] = {0x12, 0x34};
    kvpool_t *p = kvpool_new(NB, 16, secret, err, sizeof err);
    int32_t toks[16];
    CHECK(p != NULL);
    if (!p) return check_exit();
    shadow_t sh;
    memset(&sh, 0, sizeof sh);
    uint64_t seed = 0x9e3779b97f4a7c15ull, op = 0;
    int failures_at = -1, evictions = 0, lookups_hit = 0;
    for (int round = 0; round < ROUNDS; round++) {
        op++;
        unsigned k = (unsigned)(rnd(&seed) % 100);
        if (k < 30 && sh.n_held < HOLD) { /* allocate */
            /* expected victim when no free block: the least recently released named block */
            int n_free = 0, victim = -1;
            for (int b = 0; b < NB; b++) {
                if (sh.refs[b] == 0 && !sh.name[b]) n_free++;
                if (sh.refs[b] == 0 && sh.name[b] &&
                    (victim < 0 || sh.released[b] < sh.released[victim]))
                    victim = b;
            }
            int32_t b = kvpool_alloc(p);
            if (n_free == 0 && victim < 0) {
                CHECK(b == -1);
            } else {
                CHECK(b >= 0 && b < NB && sh.refs[b] == 0);
                if (b < 0 || b >= NB) break;
                if (n_free == 0) {
                    CHECKF(b == victim, "evicted %d, expected the LRU block %d", b, victim);
                    evictions++;
                }
                CHECK(!(n_free > 0 && sh.name[b])); /* a free block goes first */
                if (sh.name[b]) {
                    name_tokens(toks, sh.name[b]);
                    CHECK(kvpool_contains(p, sh.name[b], sh.name[b] * 3, toks) == 0);
                }
                sh.name[b] = 0;
                sh.refs[b] = 1;
                sh.held[sh.n_held++] = b;
            }
        } else if (k < 45 && sh.n_held > 0 && sh.n_held < HOLD) { /* add a reference */
            int32_t b = sh.held[rnd(&seed) % (uint64_t)sh.n_held];
            kvpool_ref(p, b);
            sh.refs[b]++;
            sh.held[sh.n_held++] = b;
        } else if (k < 75 && sh.n_held > 0) { /* release one */
            int i = (int)(rnd(&seed) % (uint64_t)sh.n_held);
            int32_t b = sh.held[i];
            sh.held[i] = sh.held[--sh.n_held];
            kvpool_unref(p, b);
            if (--sh.refs[b] == 0) sh.released[b] = op;
        } else if (k < 88 && sh.n_held > 0) { /* publish a held block under a fresh name */
            int32_t b = sh.held[rnd(&seed) % (uint64_t)sh.n_held];
            uint64_t name = (rnd(&seed) % 64) + 1; /* small space: collisions happen */
            int taken = 0;
            for (int x = 0; x < NB; x++)
                if (sh.name[x] == name) taken = 1;
            name_tokens(toks, name);
            kvpool_publish(p, b, name, name * 3, toks);
            if (!sh.name[b] && !taken) sh.name[b] = name; /* else: unchanged, first one wins */
        } else if (sh.n_held < HOLD) { /* look a name up */
            uint64_t name = (rnd(&seed) % 64) + 1;
            int owner = -1;
            for (int x = 0; x < NB; x++)
                if (sh.name[x] == name) owner = x;
            name_tokens(toks, name);
            int32_t b = kvpool_lookup(p, name, name * 3, toks);
            CHECKF(b == owner, "lookup %llu: %d, expected %d", (unsigned long long)name, b, owner);
            if (b >= 0 && b == owner) {
                sh.refs[b]++;
                sh.held[sh.n_held++] = b;
                lookups_hit++;
            }
        }
        if (check_invariants(p, &sh) && failures_at < 0) {
            failures_at = round;
            CHECKF(0, "counts diverge from the shadow model at round %d", round);
            break;
        }
    }
    /* every holder leaves: all blocks are available, none in use */
    while (sh.n_held > 0) {
        int32_t b = sh.held[--sh.n_held];
        kvpool_unref(p, b);
        sh.refs[b]--;
    }
    CHECK(check_invariants(p, &sh) == 0);
    CHECK(kvpool_n_used(p) == 0);
    CHECK(kvpool_n_available(p) == NB);
    CHECKF(evictions > 100 && lookups_hit > 100, "evictions %d, lookup hits %d", evictions,
           lookups_hit);
    kvpool_free(p);
    return check_exit();
}
