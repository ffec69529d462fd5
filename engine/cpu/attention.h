/* engine/cpu/attention.h: causal attention of a tile of query vectors against one sequence's
 * paged KV cache. Internal to the CPU backend.
 *
 * Batch invariance: the output of a query depends only on that query vector, its position and
 * the KV rows [0, pos]: every score is one dot product in a fixed order, the softmax and the
 * weighted V sum run over positions in ascending order, whatever the other queries of the tile.
 * Pure function of its arguments (scratch is the caller's); thread-safe on disjoint outputs. */
#ifndef SPILLWAY_ENGINE_CPU_ATTENTION_H
#define SPILLWAY_ENGINE_CPU_ATTENTION_H

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
    float scale;                 /* 1/sqrt(hd) */
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

/* Best implementation for the kernels chosen: "avx512", "avx2" (AVX2 + FMA + F16C), else
 * portable C. */
attn_fn attn_get(const char *kernels_name);

#endif
