/* engine/backend.h: the one interface every compute backend implements (CPU, CUDA).
 *
 * A backend owns the model's weights in its memory (the CPU backend borrows the mapping) and a
 * pool of KV blocks. Block *bookkeeping* (which block is free, refcounts, prefix names) lives in
 * engine/kvpool.c, not here: a backend only stores bytes per block id.
 *
 * KV block layout (the same bytes on every backend, so blocks move between tiers unchanged):
 *   [n_layers][2 (K, V)][block_tokens][n_kv_heads][head_dim] elements of kv_type (F32 or F16).
 *
 * Threads: a backend is driven by one thread at a time (the engine's step thread); it may use
 * its own worker threads inside a call. */
#ifndef SPILLWAY_ENGINE_BACKEND_H
#define SPILLWAY_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "sampler.h"

/* One forward step over a set of sequences. Tokens of sequence s occupy the contiguous range
 * [seq_start[s], seq_start[s+1]) with consecutive positions (a prefill chunk, or one decode
 * token). Each token's K/V is written at its position through the sequence's block table before
 * attention, which covers positions [0, pos] of the same sequence (causal), or [pos - W + 1, pos]
 * on a layer with a sliding window W (model.h). When every layer has one (model_kv_window > 0),
 * the table entries of blocks wholly before the first key of the sequence's first token may be
 * -1 (the engine released them). */
/* backend_params_t.weight_type of cuda.dtype fp8: each layer's matrices in FP8 E4M3 with an F32
 * scale per output row (quantised at load), GEMM inputs quantised per token, F32 accumulation;
 * the embedding, the output matrix and the activations in BF16. A device of compute capability
 * 8.9 or later (Ada, Hopper). Not a file type. */
#define BACKEND_WTYPE_FP8 1008

typedef struct {
    int n_tokens;
    const int32_t *tokens;              /* [n_tokens] token ids */
    const int32_t *pos;                 /* [n_tokens] absolute positions */
    int n_seqs;
    const int32_t *seq_start;           /* [n_seqs + 1] */
    const int32_t *const *block_tables; /* [n_seqs] -> block ids covering positions 0..last pos */
    int n_logits;
    const int32_t *logits_idx;          /* [n_logits] token indices whose logits are wanted */
} backend_batch_t;

typedef struct {
    int threads;          /* CPU worker threads (>= 1) */
    int block_tokens;     /* B: tokens per KV block */
    int n_kv_blocks;      /* blocks in the pool; CUDA: 0 = what the memory budget leaves after
                             weights and activations (the backend then sets params.n_kv_blocks) */
    int kv_type;          /* DT_F32 or DT_F16 */
    int max_batch_tokens; /* largest n_tokens a forward call may get (sizes scratch) */
    /* CPU backend only: 1 = copy the matrices its kernels pack (backend_cpu_packed_bytes) into
     * their layout at creation, unless the host's available memory is short of the copies
     * (then, as with 0, every matrix is read in place) */
    int cpu_pack;
    /* CUDA backend only (the CPU backend ignores them) */
    int weight_type;      /* device dtype of the matrices: DT_BF16, DT_F16 or DT_F32 (every file
                             type is converted at load; DT_F32 computes like the CPU backend),
                             or BACKEND_WTYPE_FP8 */
    float mem_fraction;   /* share (0, 1] of the device's free memory at creation that weights,
                             activations and the KV pool may take together */
    uint64_t synthetic_seed; /* 0: weights come from the model. Else the matrices are filled on
                                the device with seeded uniform values and the norms with 1, and
                                the model's data pointers are not read (benchmarks of real
                                shapes without a multi-GB file) */
    int device;           /* device index (>= 0; 0 = the first CUDA_VISIBLE_DEVICES names) */
    int max_seqs;         /* most sequences in one step (0: unknown); sizes the CUDA backend's
                             penalty slots and block-table buffer (engine/devmem.h) */
    int max_ctx;          /* longest sequence in tokens (0: the model's context); as max_seqs */
} backend_params_t;

/* How forward_sample picks the token of one logits row: what sampler_sample would do with the
 * same logits and a sampler in the same state (engine/sampler.h, same steps in the same order:
 * sanitising, raw logprobs, penalties, greedy or top-k, temperature, min-p, top-p, the draw).
 * The random number and the penalty window are the host sampler's, so the host keeps the
 * sequence's stream and history and the device only its penalty counts. */
typedef struct {
    const sampler_params_t *p; /* validated (sampler_params_validate); borrowed for the call */
    uint64_t rand;             /* sampler_draw(): the draw of this step (unused when greedy) */
    int pen_slot;              /* -1: no penalties. Else a slot of sample_slot_load holding the
                                  counts of the penalty window; after the pick the backend adds
                                  1 to the chosen id's count and takes 1 from pen_evict's */
    int32_t pen_evict;         /* sampler_evict_next(): the id leaving the window when the chosen
                                  one enters, -1 none */
} backend_sample_t;

typedef struct backend backend_t;

typedef struct {
    const char *name;
    void (*free)(backend_t *b);
    /* Runs one step. logits: [n_logits][n_vocab] F32 written on success. Returns 0 or -1 and
     * fills errstr. */
    int (*forward)(backend_t *b, const backend_batch_t *batch, float *logits, char *errstr,
                   size_t errlen);
    /* Optional (NULL: use forward and pick on the host). As forward, but instead of logits
     * writes ids[i] = argmax over the vocabulary of the logits of token logits_idx[i] (the
     * lowest id on ties, as a host argmax scanning upwards picks), i < n_logits: greedy
     * decoding without moving [n_logits][n_vocab] floats off the device. */
    int (*forward_argmax)(backend_t *b, const backend_batch_t *batch, int32_t *ids,
                          char *errstr, size_t errlen);
    /* Optional (NULL: use forward and sampler_sample on the host). As forward, but the
     * logits of row i < n_logits are sampled on the device as rows[i] says, and only
     * ids[i], and for rows with p->n_logprobs > 0 chosen[i] and top[i * SAMPLER_MAX_LOGPROBS
     * + j] (j < p->n_logprobs), come back (chosen and top may be NULL when no row asks for
     * logprobs). The caller then calls sampler_accept(id) on its own sampler as after
     * sampler_sample. Returns 0 or -1 and fills errstr. */
    int (*forward_sample)(backend_t *b, const backend_batch_t *batch,
                          const backend_sample_t *rows, int32_t *ids, sampler_logprob_t *chosen,
                          sampler_logprob_t *top, char *errstr, size_t errlen);
    /* With forward_sample: copies counts[n_vocab] (sampler_penalty_counts) into a free penalty
     * slot and returns it (>= 0), or -1 and errstr (out of device memory). */
    int (*sample_slot_load)(backend_t *b, const int32_t *counts, char *errstr, size_t errlen);
    /* With forward_sample: frees slot (>= 0), which a later sample_slot_load may return. */
    void (*sample_slot_free)(backend_t *b, int slot);
    /* Block copies: dst/src hold kv_block_bytes. Optional (NULL): the caller falls back.
     * kv_block_write may return before the block is on the device (see kv_write_pending); a
     * forward step or block copy that reads the block is ordered after the write by the
     * backend, so correctness never depends on the caller waiting. */
    int (*kv_block_read)(backend_t *b, int32_t block, void *dst);
    int (*kv_block_write)(backend_t *b, int32_t block, const void *src);
    int (*kv_block_copy)(backend_t *b, int32_t dst_block, int32_t src_block);
    /* Optional (NULL: kv_block_write is complete when it returns). 1 while a write queued to
     * one of blocks[0..n) (entries -1 skipped) has not completed, 0 when all have, -1 on a
     * device error. Never waits: the engine schedules a sequence whose prefix came from tier 2
     * only once its blocks are in, so a step never waits for another sequence's copies. */
    int (*kv_write_pending)(backend_t *b, const int32_t *blocks, int n);
    /* Optional (NULL: none). A page-locked host buffer of kv_block_bytes to fill and pass as
     * the src of the next kv_block_write, which then queues its copy without copying the bytes
     * once more on the host. Owned by the backend; valid until the next kv_block_read,
     * kv_block_read_async, kv_block_write or kv_stage_buffer call. NULL on a device error. */
    void *(*kv_stage_buffer)(backend_t *b);
    /* Optional pair (NULL: kv_block_read, which returns with the bytes). kv_block_read_async
     * queues the copy of block (as the forward steps queued so far leave it) towards dst
     * (kv_block_bytes of the caller's memory, which must stay valid until the ticket is
     * answered) and returns at once with *ticket; 0, or -1 when nothing was queued (the caller
     * may then use kv_block_read). The caller must not let the block be rewritten (it keeps a
     * reference) until then. kv_read_done answers a ticket: 1 when dst holds the block, 0
     * while the copy is in flight (only with wait 0; wait 1 blocks until it is not), -1 on a
     * device error (dst not filled). Each ticket is asked until it is answered 1 or -1, and
     * every ticket is answered before the backend is freed. */
    int (*kv_block_read_async)(backend_t *b, int32_t block, void *dst, uint64_t *ticket);
    int (*kv_read_done)(backend_t *b, uint64_t ticket, int wait);
    /* Waits for queued work; 0 or -1. */
    int (*synchronize)(backend_t *b);
} backend_ops_t;

struct backend {
    const backend_ops_t *ops;
    void *ctx;               /* the implementation's state */
    const model_t *model;    /* borrowed: outlives the backend */
    backend_params_t params;
    size_t kv_block_bytes;
    /* Device memory (CUDA; 0 on the CPU backend): what engine/devmem.h's formula says the
     * backend holds, and what the device's free memory fell by across backend creation
     * (cudaMemGetInfo before and after; includes the allocator's rounding and cuBLAS state). */
    uint64_t dev_bytes_planned, dev_bytes_measured;
    int dev_allocations;     /* device allocations behind dev_bytes_planned */
    /* Host memory the CPU backend holds for its kernels' packed copies of weights (the sum of
     * backend_cpu_packed_bytes over the matrices it packed; 0 on the CUDA backend). */
    uint64_t host_packed_bytes;
};

/* Bytes of host memory the CPU backend allocates on this CPU for its kernels' packed copy of a
 * rows x cols matrix of dtype wtype (Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0 with AVX512-VNNI), or 0 when it reads
 * the matrix in place. It packs every dense matmul of the forward pass (attention, a dense FFN,
 * the output head; a fused matrix's parts each on their own), never the embedding lookup or
 * mixture-of-experts FFNs. Thread-safe. */
size_t backend_cpu_packed_bytes(int wtype, int64_t rows, int64_t cols);

/* CPU backend (engine/cpu). model is borrowed and must outlive the backend. */
backend_t *backend_cpu_new(const model_t *model, const backend_params_t *params, char *errstr,
                           size_t errlen);

/* CUDA backend (engine/cuda), built when SPILLWAY_HAVE_CUDA is defined. model is borrowed and
 * must outlive the backend. Uses device params->device. NULL + errstr when there is no CUDA
 * device (or no device of that index), the parameters are bad, or the model does not fit the
 * memory budget (the message names the sizes). forward gives F32 logits as the CPU backend
 * does; forward_argmax and forward_sample pick tokens on the device. */
backend_t *backend_cuda_new(const model_t *model, const backend_params_t *params, char *errstr,
                            size_t errlen);
/* CUDA devices this host has (0 when none or no driver). */
int backend_cuda_device_count(void);
/* The CUDA backend's decode steps run through CUDA graphs (one captured per batch-size bucket
 * of 1, 2, 4, ..., 256 tokens, replayed after): graphs captured, steps replayed, steps that ran
 * plain launches because their bucket's capture failed, and the first failure's message. */
typedef struct {
    long captured, replayed, fallbacks;
    char why[256];
} backend_graph_counts_t;
/* be must be a CUDA backend (backend_cuda_new). */
void backend_cuda_graph_counts(const backend_t *be, backend_graph_counts_t *out);

/* Checks a batch against be's model and pool (engine/backend.c): 1..max_tokens tokens in
 * contiguous non-empty sequences, token ids and consecutive positions in range, every block of
 * every sequence's table in the pool, logits indices in the batch. 0, or -1 and errstr (prefixed
 * with the backend's name). Backends call it at the top of forward. */
int backend_check_batch(const backend_t *be, const backend_batch_t *b, int max_tokens,
                        char *errstr, size_t errlen);

static inline void backend_free(backend_t *b)
{
    if (b) b->ops->free(b);
}

#endif
