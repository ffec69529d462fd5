/* engine/devmem.h: the device memory the CUDA engine takes, as one formula shared by the CUDA
 * backend (engine/cuda/cuda_backend.c allocates exactly these buffers, each through its budget
 * check) and `spillway plan --backend cuda` (cli/plan.c). Plain C, built with or without CUDA.
 *
 * Every device buffer of the backend, in bytes (T = max_batch_tokens, we = weight element bytes,
 * qd = n_heads x head_dim, kvd = n_kv_heads x head_dim, qkvd = qd + 2 kvd, ffn = ffn_dim):
 *   weights     per layer: (qkvd x dim + dim x qd + 2 ffn x dim + dim x ffn) x we + 2 x dim x 4
 *               [+ qkvd x 4 with q/k/v biases]; embedding n_vocab x dim x we (twice when the
 *               output matrix is not tied); output norm dim x 4; RoPE inv_freq rope_dim/2 x 4 + 4.
 *               fp8: the four layer matrices 1 byte an element plus 4 bytes a row (scales:
 *               qkvd + dim + 2 ffn + dim rows), the rest as above with we = 2
 *   activations T x (dim x 4 + dim x we + qkvd x 4 + qd x we + 2 ffn x 4 + ffn x we +
 *               rope_dim x 4 + n_vocab x 4 + 4) + attention split-K partials T x n_heads x
 *               DEVMEM_ATT_SPLIT_SLOTS x (head_dim + 2) x 4 (a batch of t tokens keeps
 *               T x DEVMEM_ATT_SPLIT_SLOTS / t chunk partials a token; a token with more
 *               chunks is folded in one block: engine/cuda/cuda_backend.c); fp8 adds T x (max(dim, qd, ffn) + 4 + dim x 4)
 *               (the quantised GEMM input, its per-token scales, and the F32 product of the
 *               GEMMs whose result is added to the residual)
 *   sampling    rows T x DEVMEM_SAMPLE_ROW_BYTES, results T x (2 + 2 SAMPLER_MAX_LOGPROBS) x 4,
 *               penalty counts max(max_seqs, DEVMEM_MIN_PEN_SLOTS) x n_vocab x 4 (more slots,
 *               when more sequences sample with penalties, double the table within the budget)
 *   metadata    (6 T + 3 + seqs x ceil(ctx / block_tokens) + 1 + 1024) x 4, seqs = max_seqs (T
 *               if 0), ctx = max_ctx (the model's context if 0); 6 T + 3: tokens, positions,
 *               sequences, logit rows, table offsets and the attention tiles; the + 1 is the
 *               block table of the padding tokens of a CUDA-graph decode step (the scratch
 *               block). The captured
 *               graphs read this buffer in place (tokens, positions, tables)
 *   workspace   DEVMEM_BLAS_WORKSPACE (cuBLAS)
 *   KV scratch  one KV block after the pool (same allocation), written by the padding tokens
 *               of CUDA-graph decode steps; never given to the engine
 *   KV pool     n_kv_blocks x block_tokens x n_layers x 2 x kvd x kv_elem; n_kv_blocks 0 = as
 *               many blocks as budget - everything above leaves (at most 2^30)
 *   upload      DEVMEM_UPLOAD_CHUNK while weights load (freed after; not with synthetic weights
 *               unless fp8, which draws them in BF16 there before quantising):
 *               weights + workspace + upload must fit the budget too.
 * Not counted (outside the budget): the CUDA context and the modules' code, cuBLAS's own handle
 * state, the memory the driver takes for instantiated CUDA graphs (up to GRAPH_BUCKETS of
 * them, kernel parameters and bookkeeping), the allocator's rounding (up to one 2 MiB page per
 * allocation: devmem_t.allocations says how many there are), and page-locked host memory. */
#ifndef SPILLWAY_ENGINE_DEVMEM_H
#define SPILLWAY_ENGINE_DEVMEM_H

#include <stddef.h>
#include <stdint.h>

/* Attention partials per (token, head) in the split-K scratch. */
#define DEVMEM_ATT_SPLIT_SLOTS 8
/* Most thread blocks along a token's context in the attention's split-K (the backend's
 * ATT_SPLITS; each loops over its chunks). */
#define DEVMEM_ATT_SPLITS 32
/* cuBLAS workspace bytes. */
#define DEVMEM_BLAS_WORKSPACE ((uint64_t)32 << 20)
/* Device (and page-locked host) staging bytes used to upload and convert weights at load. */
#define DEVMEM_UPLOAD_CHUNK ((uint64_t)64 << 20)
/* sizeof(cuk_sample_row_t) (engine/cuda/cuda_sample.h; the backend asserts it). */
#define DEVMEM_SAMPLE_ROW_BYTES 56
/* Penalty-count slots allocated when max_seqs is smaller. */
#define DEVMEM_MIN_PEN_SLOTS 8
/* Most KV blocks the backend sizes a pool to. */
#define DEVMEM_MAX_BLOCKS ((uint64_t)1 << 30)

/* The model's shape as the CUDA backend sees it. */
typedef struct {
    int n_layers, n_heads, n_kv_heads, head_dim, dim, ffn_dim, n_vocab, rope_dim, ctx_len;
    int tied_output;       /* 1: the output matrix is the embedding (one copy) */
    int qkv_bias;          /* 1: q/k/v biases are on the device (qwen2; not synthetic weights) */
} devmem_shape_t;

typedef struct {
    int weight_elem;       /* bytes per device weight element: 2 (bf16, f16) or 4 (f32) */
    int kv_elem;           /* 2 (f16) or 4 (f32) */
    int block_tokens, max_batch_tokens;
    int max_seqs;          /* sequences a step may hold: penalty slots (0: the minimum) and
                              block tables (0: T) */
    int max_ctx;           /* longest sequence in tokens; 0: the model's context */
    int n_kv_blocks;       /* 0: what the budget leaves */
    int synthetic;         /* 1: weights filled on the device (no upload staging) */
    int fp8;               /* 1: cuda.dtype fp8: the layer matrices in E4M3 (1 byte) with an F32
                              scale per row, embedding, output and activations in BF16
                              (weight_elem 2), plus the FP8 GEMMs' scratch */
    uint64_t budget;       /* bytes the engine may take: cuda.mem_fraction x free at creation */
} devmem_params_t;

typedef struct {
    uint64_t weights, activations, sampling, penalty_slots, metadata_words, metadata, workspace;
    uint64_t att_partials; /* the attention split-K scratch (part of activations) */
    uint64_t upload;       /* transient at load */
    uint64_t kv_scratch;   /* the graphs' scratch KV block (one kv_block; part of fixed) */
    uint64_t fixed;        /* everything but the KV pool (and upload) */
    uint64_t kv_block, kv_blocks, kv_pool;
    uint64_t total;        /* fixed + kv_pool: what the engine holds once created */
    int allocations;       /* device allocations behind total */
} devmem_t;

/* Fills out from s and p. 0, or -1 with errstr (naming the sizes, the budget and the keys to
 * change) when the parameters are out of range (fp8: dim, n_heads x head_dim or ffn_dim not a
 * multiple of 16, as the backend refuses), or weights and scratch, the requested pool or
 * the load staging exceed p->budget, or the budget leaves no KV block. out is filled either way
 * (kv_blocks 0 when it failed to fit). */
int devmem_plan(const devmem_shape_t *s, const devmem_params_t *p, devmem_t *out, char *errstr,
                size_t errlen);

#endif
