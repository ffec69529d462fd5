/* bench/bench_names.c: the cost of naming and verifying prefix-cache blocks, per prompt token.
 *
 *   bench_names [block_tokens (16)] [blocks (200000)]
 * Rows: the keyed BLAKE2b chain of engine/kvpool.c (kvpool_block_name), the unkeyed XXH3 chain it
 * replaced (for comparison), and a tier-1 hit with its token and parent check (kvpool_lookup +
 * unref). ns per token = ns per block / block_tokens. Prints a markdown table. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <xxhash.h>

#include "engine/kvpool.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int B = argc > 1 ? atoi(argv[1]) : 16;
    int n = argc > 2 ? atoi(argv[2]) : 200000;
    if (B < 1 || B > 4096 || n < 1) {
        fprintf(stderr, "usage: bench_names [block_tokens 1..4096] [blocks >= 1]\n");
        return 2;
    }
    int32_t *tok = malloc(sizeof *tok * (size_t)B * (size_t)n);
    uint64_t *names = malloc(sizeof *names * (size_t)n);
    if (!tok || !names) return 1;
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)B * (size_t)n; i++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        tok[i] = (int32_t)(st % 32000);
    }
    unsigned char secret[KVPOOL_SECRET_BYTES] = "bench_names";
    char err[128];
    kvpool_t *p = kvpool_new(n, B, secret, err, sizeof err);
    if (!p) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint64_t seed = kvpool_derive_seed(p, 0, "bench", 5), h = seed, sink = 0;
    double t0 = now_s();
    for (int i = 0; i < n; i++) names[i] = h = kvpool_block_name(p, h, tok + (size_t)i * B);
    double t_keyed = now_s() - t0;
    h = seed;
    t0 = now_s();
    for (int i = 0; i < n; i++) {
        h = XXH3_64bits_withSeed(tok + (size_t)i * B, (size_t)B * sizeof *tok, h);
        sink ^= h;
    }
    double t_xxh = now_s() - t0;
    for (int i = 0; i < n; i++) { /* publish every block, then look each up */
        int32_t b = kvpool_alloc(p);
        kvpool_publish(p, b, names[i], i ? names[i - 1] : seed, tok + (size_t)i * B);
        kvpool_unref(p, b);
    }
    t0 = now_s();
    for (int i = 0; i < n; i++) {
        int32_t b = kvpool_lookup(p, names[i], i ? names[i - 1] : seed, tok + (size_t)i * B);
        if (b < 0) {
            fprintf(stderr, "lookup %d missed\n", i);
            return 1;
        }
        kvpool_unref(p, b);
    }
    double t_hit = now_s() - t0;
    printf("| block_tokens %d, %d blocks | ns/block | ns/token |\n|---|---:|---:|\n", B, n);
    printf("| keyed BLAKE2b-64 name (kvpool_block_name) | %.1f | %.2f |\n", t_keyed * 1e9 / n,
           t_keyed * 1e9 / n / B);
    printf("| unkeyed XXH3-64 name (before) | %.1f | %.2f |\n", t_xxh * 1e9 / n,
           t_xxh * 1e9 / n / B);
    printf("| tier-1 hit with token + parent check | %.1f | %.2f |\n", t_hit * 1e9 / n,
           t_hit * 1e9 / n / B);
    fprintf(stderr, "(checksum %016llx)\n", (unsigned long long)sink);
    kvpool_free(p);
    free(tok);
    free(names);
    return 0;
}
