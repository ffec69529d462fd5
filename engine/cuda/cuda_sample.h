/* engine/cuda/cuda_sample.h: token sampling on the device, the CPU sampler's semantics
 * (engine/sampler.c, whose numbered steps cuda_sample.cu follows) over rows of logits that never
 * leave the device. Internal to engine/cuda, and used by tests/test_cuda.c, which compares it
 * with sampler_sample on the same logits.
 *
 * What the device does not keep: the random stream and the penalty window's history. The host
 * sampler draws the row's 64-bit random number (sampler_draw) and names the id leaving the window
 * (sampler_evict_next); the device keeps only the window's per-id counts, one [n_vocab] int32 row
 * per slot, and updates them from the chosen id. Conventions as cuda_kernels.h (d_* device
 * pointers owned by the caller, work enqueued on `stream`, the cudaError_t of the launch). */
#ifndef SPILLWAY_ENGINE_CUDA_SAMPLE_H
#define SPILLWAY_ENGINE_CUDA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUK_SAMPLE_MAX_LOGPROBS 20 /* = SAMPLER_MAX_LOGPROBS */

/* One row's parameters (sampler_params_t, validated by the host, plus the step's state). */
typedef struct {
    float temperature;        /* <= 0: greedy */
    float inv_t;              /* 1.0f / temperature in F32, as the host sampler computes it */
    int top_k;                /* <= 0 or >= n_vocab: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repeat_penalty, presence_penalty, frequency_penalty;
    int n_logprobs;           /* 0..CUK_SAMPLE_MAX_LOGPROBS */
    int pen_slot;             /* -1: no penalties; else the row of d_counts holding the window */
    int32_t pen_evict;        /* id whose count drops when the chosen id is counted; -1 none */
    uint64_t rand;            /* the step's random number (used when temperature > 0) */
} cuk_sample_row_t;

/* 4-byte words of cuk_sample's output for R rows and at most L logprobs a row. */
static inline size_t cuk_sample_out_words(int R, int L)
{
    return L > 0 ? (size_t)R * (2 + 2 * (size_t)L) : (size_t)R;
}

/* Samples row r < R of d_logits [R][n_vocab] F32 (read only) with d_rows[r] and writes, in d_out
 * (cuk_sample_out_words(R, L) words, L = the largest n_logprobs of the rows):
 *   [0, R)            int32 chosen id of row r
 *   [R, 2R)           F32 its logprob (raw log-softmax), rows with n_logprobs > 0 (L > 0 only)
 *   [2R + 2 L r ...)  n_logprobs pairs (int32 id, F32 logprob), best first (L > 0 only)
 * then, for rows with pen_slot >= 0, adds 1 to d_counts[pen_slot][id] and takes 1 from
 * d_counts[pen_slot][pen_evict] (pen_evict >= 0). Two rows must not share a slot. d_counts may
 * be NULL when no row has a slot. Deterministic: a row's result depends on its logits, its
 * parameters and its counts only, not on R or the other rows. */
int cuk_sample(const float *d_logits, int R, int n_vocab, const cuk_sample_row_t *d_rows,
               int32_t *d_counts, int L, uint32_t *d_out, cudaStream_t stream);

#ifndef __CUDACC__
#include "engine/sampler.h"
/* *row = p (validated) with the step's random number and penalty slot / evicted id (-1 none);
 * inv_t = 1.0f / temperature as sampler_sample computes it. */
static inline void cuda_sample_row_fill(cuk_sample_row_t *row, const sampler_params_t *p,
                                        uint64_t rand, int pen_slot, int32_t pen_evict)
{
    row->temperature = p->temperature;
    row->inv_t = p->temperature > 0.0f ? 1.0f / p->temperature : 0.0f;
    row->top_k = p->top_k;
    row->top_p = p->top_p;
    row->min_p = p->min_p;
    row->repeat_penalty = p->repeat_penalty;
    row->presence_penalty = p->presence_penalty;
    row->frequency_penalty = p->frequency_penalty;
    row->n_logprobs = p->n_logprobs;
    row->pen_slot = pen_slot < 0 ? -1 : pen_slot;
    row->pen_evict = pen_slot < 0 ? -1 : pen_evict;
    row->rand = rand;
}
#endif

#ifdef __cplusplus
}
#endif

#endif
