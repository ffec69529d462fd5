/* tests/test_attention.c: the attention tiles of the CPU backend (engine/cpu/attention.h).
 *
 * Every implementation this CPU runs (AVX-512 and AVX2 when kern_get supports them) against the
 * portable one on random paged KV caches: head dimensions 8, 16, 64, 128 (register-blocked
 * paths) and 12, 20 (plain loops), KV in F32 and F16, blocks of 16 and 5 tokens (ldk padding),
 * rows with a stride wider than the head, shuffled block tables, tiles mixing queries at the
 * same position (GQA groups) with consecutive ones (prefill); every output element within 2e-5
 * of the portable tile's (values ~N(0, 1); the tiles differ only in summation order and exp).
 * Batch invariance (attention.h): each query's output from a tile of many must be bit-identical
 * to that query's output from a tile of one, for every implementation.
 * Each shape also runs with a sliding window (9 keys), a score soft-cap (1.5, strong for these
 * scores) and both; with a window, the blocks wholly before the first key of the tile's queries
 * are filled with NaN and the outputs must not change (the tiles must not read them). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/attention.h"
#include "engine/cpu/kernels.h"
#include "engine/dtype.h"
#include "tests/check.h"

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float randn(uint64_t *s)
{
    float sum = 0;
    uint64_t r = rng(s);
    for (int k = 0; k < 4; k++) sum += ((float)((r >> (16 * k)) & 0xffff) + 0.5f) / 65536.0f;
    return (sum - 2.0f) * 1.7320508f;
}

typedef struct {
    int hd, B, kv_f16, n_ctx, n_blocks;
    size_t row_stride, block_bytes;
    unsigned char *kv;
    int32_t *blocks;
} cache_t;

static void cache_init(cache_t *c, int hd, int B, int kv_f16, int n_ctx, uint64_t *s)
{
    size_t es = kv_f16 ? 2 : 4;
    c->hd = hd;
    c->B = B;
    c->kv_f16 = kv_f16;
    c->n_ctx = n_ctx;
    c->n_blocks = (n_ctx + B - 1) / B + 3; /* spare blocks: the table is a shuffled subset */
    c->row_stride = (size_t)(hd + 4) * es;
    c->block_bytes = 2 * (size_t)B * c->row_stride;
    c->kv = malloc(c->block_bytes * (size_t)c->n_blocks);
    for (size_t i = 0; i < c->block_bytes * (size_t)c->n_blocks / es; i++) {
        float v = randn(s);
        if (kv_f16) {
            uint16_t h = f32_to_fp16(v);
            memcpy(c->kv + 2 * i, &h, 2);
        } else {
            memcpy(c->kv + 4 * i, &v, 4);
        }
    }
    c->blocks = malloc(sizeof *c->blocks * (size_t)c->n_blocks);
    for (int i = 0; i < c->n_blocks; i++) c->blocks[i] = i;
    for (int i = c->n_blocks - 1; i > 0; i--) {
        int j = (int)(rng(s) % (uint64_t)(i + 1)), t = c->blocks[i];
        c->blocks[i] = c->blocks[j];
        c->blocks[j] = t;
    }
}

/* Runs fn over queries q[0..nq) at positions pos into out[nq][hd]. */
static void run_tile(attn_fn fn, const cache_t *c, int nq, float *const *q, const int32_t *pos,
                     float *out, int window, float cap)
{
    int n_ctx = 0;
    for (int i = 0; i < nq; i++) n_ctx = pos[i] + 1 > n_ctx ? pos[i] + 1 : n_ctx;
    const float **qp = malloc(sizeof *qp * (size_t)nq);
    float **op = malloc(sizeof *op * (size_t)nq);
    for (int i = 0; i < nq; i++) {
        qp[i] = q[i];
        op[i] = out + (size_t)i * c->hd;
    }
    float *scores = malloc(sizeof(float) * (size_t)nq * (size_t)n_ctx);
    float *stage = malloc(sizeof(float) * (size_t)c->hd * (size_t)((c->B + 15) / 16 * 16));
    attn_args_t a = {
        .hd = c->hd, .nq = nq, .q = qp, .out = op, .qpos = pos, .n_ctx = n_ctx,
        .blocks = c->blocks, .block_tokens = c->B, .kv = c->kv, .block_bytes = c->block_bytes,
        .k_off = 0, .v_off = (size_t)c->B * c->row_stride, .row_stride = c->row_stride,
        .kv_f16 = c->kv_f16, .scale = 1.0f / sqrtf((float)c->hd) / (cap > 0 ? cap : 1.0f),
        .softcap = cap, .window = window, .scores = scores, .stage = stage,
    };
    fn(&a);
    free(scores);
    free(stage);
    free(qp);
    free(op);
}

int main(void)
{
    const char *isas[] = {"avx512", "avx2"};
    attn_fn impl[2];
    int n_impl = 0;
    const char *names[2];
    for (int i = 0; i < 2; i++)
        if (kern_get(isas[i])) {
            names[n_impl] = isas[i];
            impl[n_impl++] = attn_get(isas[i]);
        }
    attn_fn portable = attn_get(NULL);
    fprintf(stderr, "attention tiles tested against the portable one:");
    for (int i = 0; i < n_impl; i++) fprintf(stderr, " %s", names[i]);
    fprintf(stderr, "%s\n", n_impl ? "" : " none (no AVX2 on this CPU)");
    const int hds[] = {8, 16, 64, 128, 12, 20};
    uint64_t s = 7;
    int cases = 0;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
        for (int kv_f16 = 0; kv_f16 <= 1; kv_f16++)
            for (int B = 16; B >= 5; B -= 11)
            for (int var = 0; var < 4; var++) {
                const int hd = hds[hi], n_ctx = 70, window = var & 1 ? 9 : 0;
                const float cap = var & 2 ? 1.5f : 0.0f;
                cache_t c;
                cache_init(&c, hd, B, kv_f16, n_ctx, &s);
                /* a GQA group of 3 at position 69, a prefill run 40..52, 2 at 0, 1 at 17 */
                int32_t pos[20];
                int nq = 0;
                for (int g = 0; g < 3; g++) pos[nq++] = 69;
                for (int p = 40; p <= 52; p++) pos[nq++] = p;
                pos[nq++] = 0;
                pos[nq++] = 0;
                pos[nq++] = 17;
                float *qs[20], *ref = malloc(sizeof(float) * (size_t)nq * (size_t)hd);
                float *got = malloc(sizeof(float) * (size_t)nq * (size_t)hd);
                float *one = malloc(sizeof(float) * (size_t)hd);
                for (int i = 0; i < nq; i++) {
                    qs[i] = malloc(sizeof(float) * (size_t)hd);
                    for (int e = 0; e < hd; e++) qs[i][e] = 2.0f * randn(&s);
                }
                run_tile(portable, &c, nq, qs, pos, ref, window, cap);
                for (int k = 0; k < n_impl; k++) {
                    run_tile(impl[k], &c, nq, qs, pos, got, window, cap);
                    double worst = 0;
                    int bad = 0, variant = 0;
                    for (int i = 0; i < nq * hd; i++) {
                        double d = fabs((double)got[i] - ref[i]);
                        worst = d > worst ? d : worst;
                        bad += !(d <= 2e-5);
                    }
                    for (int i = 0; i < nq; i++) {
                        run_tile(impl[k], &c, 1, &qs[i], &pos[i], one, window, cap);
                        variant += memcmp(one, got + (size_t)i * hd, sizeof(float) * (size_t)hd) != 0;
                    }
                    CHECKF(bad == 0, "%s hd %d B %d kv %s window %d cap %g: %d elements off the "
                           "portable tile (worst %.3g)", names[k], hd, B, kv_f16 ? "f16" : "f32",
                           window, (double)cap, bad, worst);
                    CHECKF(variant == 0, "%s hd %d B %d kv %s window %d cap %g: %d queries "
                           "differ alone vs in the tile", names[k], hd, B,
                           kv_f16 ? "f16" : "f32", window, (double)cap, variant);
                }
                for (int i = 0; i < nq; i++) {
                    run_tile(portable, &c, 1, &qs[i], &pos[i], one, window, cap);
                    CHECK(memcmp(one, ref + (size_t)i * hd, sizeof(float) * (size_t)hd) == 0);
                }
                if (window) {
                    /* queries 0 .. 15 (positions 69 and 40..52): first key 31, so the blocks
                     * before block 31 / B are never read; NaN there must not reach any output */
                    const int nq2 = 16, first = 40 - window + 1;
                    for (int b = 0; b < first / B; b++) {
                        unsigned char *blk = c.kv + (size_t)c.blocks[b] * c.block_bytes;
                        for (size_t o = 0; o < c.block_bytes; o += 2) {
                            uint16_t h = 0x7e00; /* F16 NaN; as F32 pairs, a NaN too */
                            memcpy(blk + o, &h, 2);
                        }
                    }
                    for (int k = -1; k < n_impl; k++) {
                        /* the portable tile bit for bit, an ISA tile within its tolerance */
                        run_tile(k < 0 ? portable : impl[k], &c, nq2, qs, pos, got, window, cap);
                        int bad = 0;
                        for (int i = 0; i < nq2 * hd; i++) {
                            double d = fabs((double)got[i] - ref[i]);
                            bad += !(d <= (k < 0 ? 0.0 : 2e-5));
                        }
                        CHECKF(bad == 0, "%s hd %d B %d kv %s window %d: blocks before the first "
                               "key were read (%d elements changed)", k < 0 ? "portable" : names[k],
                               hd, B, kv_f16 ? "f16" : "f32", window, bad);
                    }
                }
                for (int i = 0; i < nq; i++) free(qs[i]);
                free(ref);
                free(got);
                free(one);
                free(c.kv);
                free(c.blocks);
                cases++;
            }
    fprintf(stderr, "%d cache shapes\n", cases);
    return check_exit();
}
