/* engine/cpu/attention.h: causal attention of a tile of query vectors against one sequence's
 * paged KV cache. Internal to the CPU backend.
 *
 * Keys: a query at position p attends to keys [p - window + 1, p] (clipped at 0) with a sliding
 * window, else [0, p]; blocks wholly before the first key any query of the tile needs are not
 * read (their table entries may be stale). Scores: s = (q . k) * scale, then with a soft-cap c,
 * s = c * tanhf(s) (the caller folds 1/c into scale).
 *
 * Batch invariance: the output of a query depends only on that query vector, its position and
 * the KV rows it attends to (the rows of a tile's other queries enter its V sum with weight 0,
 * which adds exactly nothing): every score is one dot product in a fixed order, the softmax and the
 * weighted V sum run over positions in ascending order, whatever the other queries of the tile.
 * Pure function of its arguments (scratch is the caller's); thread-safe on disjoint outputs. */
#ifndef SPILLWAY_ENGINE_CPU_ATTENTION_H
#define SPILLWAY_ENGINE_CPU_ATTENTION_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int hd;                      /* head dimension */
    int nq;                      /* query vectors in the tile */
    const float *const *q;       /* [nq] -> hd floats */
    float *const *out;           /* [nq] -> hd floats, written */
    const int32_t *qpos;         /* [nq] position of each query (attends to [0, qpos]) */
    int n_ctx;                   /* max(qpos) + 1 */
    const int32_t *blocks;       /* the sequence's block table */
    int block_tokens;            /* B */
    const unsigned char *kv;     /* pool base */
    size_t block_bytes;          /* bytes per block */
    size_t k_off, v_off;         /* byte offset of this layer's K / V row 0 of this kv head */
    size_t row_stride;           /* bytes between consecutive slots' rows */
    int kv_f16;                  /* 1: F16 elements, 0: F32 */
    float scale;                 /* score multiplier (1/sqrt(hd); with a soft-cap, divided by it) */
    float softcap;               /* > 0: scores s -> softcap * tanhf(s); 0: none */
    int window;                  /* > 0: sliding window (keys qpos - window + 1 .. qpos); 0: none */
    float *scores;               /* scratch [nq][n_ctx] */
    float *stage;                /* scratch [hd][block_tokens rounded up to 16] */
} attn_args_t;

typedef void (*attn_fn)(const attn_args_t *a);

/* Queries qi.. with the same position as qi, at most max (the ISA tiles share one pass over a
 * key block among them). */
static inline int attn_same_pos_run(const attn_args_t *a, int qi, int max)
{
    int g = 1;
    while (g < max && qi + g < a->nq && a->qpos[qi + g] == a->qpos[qi]) g++;
    return g;
}

/* First key position query qi attends to. */
static inline int attn_first_key(const attn_args_t *a, int qi)
{
    int lo = a->window > 0 ? a->qpos[qi] - a->window + 1 : 0;
    return lo > 0 ? lo : 0;
}

/* First key position of the first block any query of the tile reads (a multiple of
 * block_tokens): the tiles loop over blocks from here. */
static inline int attn_first_block_pos(const attn_args_t *a)
{
    if (a->window <= 0) return 0;
    int lo = attn_first_key(a, 0);
    for (int qi = 1; qi < a->nq; qi++) {
        int l = attn_first_key(a, qi);
        lo = l < lo ? l : lo;
    }
    return lo / a->block_tokens * a->block_tokens;
}

/* Before query qi's softmax over its keys [attn_first_key, qpos]: soft-caps those scores, and
 * zeroes the scores of [j0, first key) (the rows its tile reads that it does not attend to, so
 * that they enter the V sum with weight 0). Returns the first key. */
static inline int attn_prepare_scores(const attn_args_t *a, int qi, int j0, float *sc)
{
    const int lo = attn_first_key(a, qi), n = a->qpos[qi] + 1;
    if (a->softcap > 0)
        for (int j = lo; j < n; j++) sc[j] = a->softcap * tanhf(sc[j]);
    for (int j = j0; j < lo; j++) sc[j] = 0.0f;
    return lo;
}

/* Rows of the tile's read stream (K rows 0..n_ctx-1, then V rows 0..n_ctx-1) that the ISA
 * tiles prefetch ahead of their position in it. The KV rows of a decode step come from memory
 * (the weights streamed since evicted them) and the blocks are scattered, so the hardware
 * prefetcher does not run ahead of them. Performance only. */
#define ATTN_PF_ROWS 64

/* One line into every cache level. A volatile asm: GCC 12 -O2 left no prefetch of
 * attn_prefetch's loop in the object file when it used __builtin_prefetch. */
static inline void attn_prefetch_line(const void *p)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 0, 3);
#endif
}

/* Prefetches rows [from, to) of the read stream (clipped to it) into every cache level. */
static inline void attn_prefetch(const attn_args_t *a, int from, int to)
{
    const size_t rb = (size_t)a->hd * (a->kv_f16 ? 2 : 4);
    if (from < 0) from = 0;
    if (to > 2 * a->n_ctx) to = 2 * a->n_ctx;
    for (int s = from; s < to; s++) {
        const int v = s >= a->n_ctx, j = v ? s - a->n_ctx : s;
        const unsigned char *p = a->kv + (size_t)a->blocks[j / a->block_tokens] * a->block_bytes +
                                 (v ? a->v_off : a->k_off) +
                                 (size_t)(j % a->block_tokens) * a->row_stride;
        for (size_t o = 0; o < rb; o += 64) attn_prefetch_line(p + o);
        attn_prefetch_line(p + rb - 1);
    }
}

/* Best implementation for the kernels chosen: "avx512", "avx2" (AVX2 + FMA + F16C), else
 * portable C. */
attn_fn attn_get(const char *kernels_name);

#endif
