/* engine/cuda/cuda_backend.c: the CUDA backend: Llama-family forward pass on one GPU over a
 * paged KV pool in device memory (host side; kernels in cuda_kernels.cu).
 *
 * Weights are converted at load to params.weight_type (BF16 default, F16, or F32) and kept on
 * the device: q/k/v fused into one [qd + 2 kvd][dim] matrix, gate/up into one [2 ffn][dim] matrix,
 * norms and biases F32. A step is: embedding, RoPE angle table, then per layer RMSNorm ->
 * GEMM(qkv) -> bias + RoPE + KV store -> paged attention (split-K) -> GEMM(wo) added into the
 * residual (beta 1) -> RMSNorm -> GEMM(gate/up) -> SwiGLU -> GEMM(down) added into the residual;
 * finally RMSNorm of the rows whose logits are wanted and GEMM(output), then either the logits
 * copied to the host, or their argmax (cuk_argmax), or a sample of each row (cuk_sample,
 * cuda_sample.h) whose ids and logprobs come back in one copy to page-locked memory.
 * GEMMs run in cuBLAS(Lt) with F32 accumulation (cuda_blas.h: one algorithm per weight shape);
 * activations entering a GEMM are in weight_type,
 * the residual stream and GEMM outputs are F32.
 *
 * Decode steps (one token a sequence, the logits of each; at most GRAPH_MAX_T tokens) run as
 * CUDA graphs: the batch is padded to a power of two (padding tokens: token 0 at position 0 of
 * a pseudo-sequence whose only block is the scratch block after the pool), the step's
 * metadata is uploaded into the fixed buffer d_meta, and the bucket's graph of the whole
 * forward pass up to the logits (captured from the same launches at the bucket's first step)
 * is replayed; the token pick after it is launched plainly. Every kernel argument of such a
 * step is fixed by the bucket, and the attention's split of the work (att_splits) does not
 * change its results, so a replay computes exactly what plain launches would. A bucket whose
 * capture fails runs plain launches from then on (counted; backend_cuda_graph_counts).
 *
 * Streams: `cs` runs forward steps and block-to-block copies; `xs` (copy stream) moves KV blocks
 * between the pool and the host through page-locked staging slots (see "KV block transfers"):
 * a block read or write waits for the compute already queued (ev_compute); a step or block copy
 * waits only for the writes of the blocks it reads (per-block tickets), so a tier-2 prefix being
 * copied in overlaps the steps of every other sequence.
 *
 * Memory: every device allocation goes through dmalloc, which counts it against the budget
 * (mem_fraction x the free device memory at creation) and refuses what would exceed it. What
 * creation allocates is engine/devmem.h's formula (devmem_plan, shared with `spillway plan`),
 * checked as a whole before anything large is allocated; the KV pool (one allocation with the
 * graphs' scratch block after it) takes what is left when n_kv_blocks is 0. Afterwards only the
 * block-table buffer (beyond max_seqs x max_ctx; its move drops the graphs) and the penalty-slot
 * table (beyond max_seqs slots) can grow, each doubling within what the budget has left (none
 * when the pool filled it: such a step or request then fails with the sizes). A graph step
 * waits for the KV writes of its blocks (kv_wait_batch) before its replay, as a plain step.
 *
 * Errors: every CUDA and cuBLAS call is checked; failures become errstr text ("cuda: <what>:
 * <CUDA error string>"), never an abort. After a failed step the backend must not be used for
 * further steps (the device state is unknown). Threads: one driving thread at a time
 * (engine/backend.h), not always the creating one: every entry point selects the backend's
 * device for the calling thread first. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/backend.h"
#include "engine/devmem.h"
#include "engine/dtype.h"
#include "engine/cuda/cuda_blas.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/cuda_sample.h"

/* Page-locked host staging for KV block transfers: this many bytes of slots (at least
 * KV_STAGE_MIN, at most KV_STAGE_MAX), used as a ring (a slot is reused once its copy is done). */
#define KV_STAGE_BYTES ((size_t)64 << 20)
#define KV_STAGE_MIN 4
#define KV_STAGE_MAX 4096
/* Events of the block-write ring (ticket % KV_WRITE_EVENTS). */
#define KV_WRITE_EVENTS 64
/* Bytes of the pinned staging buffer used to upload and convert weights at load. */
#define UPLOAD_CHUNK ((size_t)DEVMEM_UPLOAD_CHUNK)
/* Attention partials per (token, head) that the split-K scratch holds for a full batch
 * (engine/devmem.h counts the scratch with it). */
#define ATT_SPLIT_SLOTS DEVMEM_ATT_SPLIT_SLOTS
/* Split-K of the attention (att_splits): the most thread blocks along a token's context, and
 * the keys of every chunk (fixed: a token's output depends on it, never on the batch). */
#define ATT_SPLITS DEVMEM_ATT_SPLITS
#define ATT_CHUNK 128
/* Offset of the block tables in the metadata buffers, for a max_T of mT (int32 units). */
#define META_BT(mT) (6 * (mT) + 3)
/* CUDA graphs of decode steps: buckets of 1, 2, 4, ..., GRAPH_MAX_T tokens. */
#define GRAPH_BUCKETS 9
#define GRAPH_MAX_T (1 << (GRAPH_BUCKETS - 1))
/* cuBLAS workspace given to the handle. */
#define BLAS_WORKSPACE ((size_t)DEVMEM_BLAS_WORKSPACE)

_Static_assert(sizeof(cuk_sample_row_t) == DEVMEM_SAMPLE_ROW_BYTES,
               "engine/devmem.h: DEVMEM_SAMPLE_ROW_BYTES must be sizeof(cuk_sample_row_t)");
_Static_assert(CUK_SAMPLE_MAX_LOGPROBS == SAMPLER_MAX_LOGPROBS,
               "engine/devmem.h counts SAMPLER_MAX_LOGPROBS logprobs a row");

_Static_assert(BACKEND_WTYPE_FP8 == CUDA_BLAS_FP8, "one code for FP8 GEMMs");

typedef struct {
    /* fp8: each matrix in E4M3 bytes with F32 row scales s* ([rows]); else s* NULL */
    float *sqkv, *so, *sgu, *sdown;
    void *wqkv;            /* [qd + 2 kvd][dim] wtype: rows of wq, then wk, then wv */
    float *bqkv;           /* [qd + 2 kvd] F32 or NULL (qwen2 biases; absent ones zero) */
    void *wo;              /* [dim][qd] wtype */
    void *wgu;             /* [2 ffn][dim] wtype: rows of w_gate, then w_up */
    void *wdown;           /* [dim][ffn] wtype */
    float *attn_norm;      /* [dim] F32 */
    float *ffn_norm;       /* [dim] F32 */
} cu_layer_t;

typedef struct {
    backend_t base;
    int dev;               /* CUDA device index */
    int wtype;             /* embedding, output, GEMM inputs: DT_F32, DT_F16 or DT_BF16 (fp8) */
    int fp8;               /* 1: the layer matrices are E4M3 (cu_layer_t), GEMM inputs
                              quantised per token into xq / xsc, products added to the residual
                              through acc */
    uint8_t *xq;           /* fp8: [max_T][max(dim, qd, ffn)] quantised GEMM input */
    float *xsc;            /* fp8: [max_T] its per-token scales */
    float *acc;            /* fp8: [max_T][dim] F32 product before the residual add */
    size_t welem;          /* bytes per weight / GEMM-input activation element */
    size_t kv_elem;        /* 4 (F32) or 2 (F16) */
    int attn_tc;           /* 1: attention by cuk_attention_tc (F16 KV, weights not F32, a head
                              shape it takes), tiles of tile_tokens; 0: cuk_attention */
    int tile_tokens;
    int max_T;
    int qd, kvd, qkvd;     /* n_heads hd, n_kv_heads hd, qd + 2 kvd */
    cudaStream_t cs, xs;
    cudaEvent_t ev_compute, ev_meta;
    /* device memory: bytes allocated through dmalloc, and the budget they must stay within */
    uint64_t dev_used, dev_budget;
    float mem_fraction;
    /* KV block transfers (xs): page-locked staging ring, write tickets */
    unsigned char *h_stage; /* pinned [n_stage][kv_block_bytes] */
    cudaEvent_t *ev_stage; /* [n_stage]: the copy through the slot is done */
    uint64_t *rd_ticket;   /* [n_stage]: the asynchronous read whose bytes the slot holds or
                              will hold, not yet copied to rd_dst (0: none) */
    void **rd_dst;         /* [n_stage]: where that read's bytes go */
    uint64_t rd_seq;       /* asynchronous reads queued so far */
    int rd_error;          /* a slot's read was finished early and failed */
    int n_stage, stage_next;
    int stage_held;        /* slot handed out by kv_stage_buffer, -1 none */
    cudaEvent_t ev_wr[KV_WRITE_EVENTS]; /* recorded on xs after write ticket t at t % N */
    uint64_t ev_wr_ticket[KV_WRITE_EVENTS]; /* the ticket last recorded there */
    uint64_t wr_ticket;    /* tickets issued (the last one) */
    uint64_t wr_done;      /* every ticket <= this has completed */
    uint64_t *blk_ticket;  /* [n_kv_blocks] host: the block's last write ticket, 0 none */
    cuda_blas_t *blas;     /* cuBLAS, loaded at creation, bound to cs */
    void *blas_ws;         /* [BLAS_WORKSPACE] bytes */

    /* device weights, owned */
    cu_layer_t *L;         /* [n_layers] (host array of device pointers) */
    void *tok_embd;        /* [n_vocab][dim] wtype */
    void *output;          /* [n_vocab][dim] wtype; == tok_embd when tied */
    float *out_norm;       /* [dim] F32 */
    float *inv_freq;       /* [rope_dim / 2] F32 */

    /* device KV pool, owned: [n_kv_blocks][kv_block_bytes] */
    unsigned char *kv;

    /* device activations for max_T tokens, owned */
    float *x;              /* [T][dim] residual stream */
    void *xn;              /* [T][dim] wtype: normalised input of a GEMM */
    float *qkv;            /* [T][qkvd] */
    void *att;             /* [T][qd] wtype: attention output */
    float *gu;             /* [T][2 ffn] */
    void *hbuf;            /* [T][ffn] wtype: SwiGLU output */
    float *rope_cs;        /* [T][rope_dim / 2][2] */
    float *part;           /* [T * n_heads * ATT_SPLIT_SLOTS][hd + 2] attention partials */
    float *logits;         /* [T][n_vocab] */
    int32_t *d_ids;        /* [T] argmax ids */

    /* device sampling (cuk_sample): rows up to max_T, results of up to max_T rows */
    cuk_sample_row_t *h_srows; /* pinned [T]; free once the step that read it synchronised */
    cuk_sample_row_t *d_srows; /* [T] */
    uint32_t *d_sout;      /* [cuk_sample_out_words(T, SAMPLER_MAX_LOGPROBS)] */
    uint32_t *h_sout;      /* pinned, the same size: one copy per step */
    int32_t *d_counts;     /* [slot_cap][n_vocab] penalty window counts (slot_cap >= the
                              formula's penalty_slots from creation) */
    unsigned char *slot_used; /* [slot_cap] host */
    int slot_cap;

    /* batch metadata: tokens[T], pos[T], tok_seq[T], logits_idx[T], bt_off[T] at k * max_T,
     * the attention tiles [max_T + 3] at 5 max_T (cuk_attention_tc), bt[...] at META_BT */
    int32_t *d_meta;       /* device, meta_cap int32 */
    int32_t *h_meta;       /* pinned host, meta_cap int32 (ev_meta: upload done) */
    size_t meta_cap;

    /* CUDA graphs of decode steps, one per bucket of 1 << k tokens (graph_step), captured at
     * the bucket's first step and dropped when a buffer they use moves (graphs_drop). Block
     * n_kv_blocks of the pool (one more than the engine sees, counted by devmem_plan as
     * kv_scratch) is the scratch block of the padding tokens. */
    cudaGraphExec_t graph[GRAPH_BUCKETS];
    unsigned char graph_failed[GRAPH_BUCKETS]; /* capture failed: plain launches */
    long graph_captures, graph_replays, graph_fallbacks;
    char graph_why[256];   /* the first capture failure's message */
} cu_t;

/* Checks a CUDA runtime result: 0, or -1 with "cuda: what: <error>" in errstr. */
static int ck(cudaError_t rc, const char *what, char *errstr, size_t errlen)
{
    if (rc == cudaSuccess) return 0;
    sw_seterr(errstr, errlen, "cuda: %s: %s (%s)", what, cudaGetErrorString(rc),
              cudaGetErrorName(rc));
    return -1;
}

/* One GEMM (cuda_blas_gemm, on cs): 0, or -1 with "cuda: what: cuBLAS <status>". */
static int gemm(cu_t *c, const void *W, int N, int K, const void *X, int T, float *Y, int ldy,
                float beta, const char *what, char *errstr, size_t errlen)
{
    int rc = cuda_blas_gemm(c->blas, c->wtype, W, N, K, X, T, Y, ldy, beta);
    if (rc == 0) return 0;
    sw_seterr(errstr, errlen, "cuda: %s: cuBLAS %s", what, cuda_blas_status(c->blas, rc));
    return -1;
}
/* The longest GEMM input row of an FP8 layer GEMM: max(dim, qd, ffn). */
static int fp8_kmax(const cu_t *c, const hparams_t *hp)
{
    int k = hp->dim > c->qd ? hp->dim : c->qd;
    return hp->ffn_dim > k ? hp->ffn_dim : k;
}

/* A layer GEMM: Y = W X (+ Y when beta 1). fp8 (S the weight's row scales): X ([T][K] wtype)
 * quantised per token into xq / xsc, the E4M3 product into Y (beta 0) or acc (beta 1), then
 * scaled by token and row (and added) by cuk_fp8_epilogue. Else gemm(). */
static int lgemm(cu_t *c, const void *W, const float *S, int N, int K, const void *X, int T,
                 float *Y, int ldy, float beta, const char *what, char *errstr, size_t errlen)
{
    if (!S) return gemm(c, W, N, K, X, T, Y, ldy, beta, what, errstr, errlen);
    float *out = beta != 0.0f ? c->acc : Y;
    const int ldo = beta != 0.0f ? N : ldy;
    if (ck(cuk_quant_fp8_rows(c->wtype, X, T, K, c->xq, c->xsc, c->cs), what, errstr, errlen))
        return -1;
    int rc = cuda_blas_gemm(c->blas, CUDA_BLAS_FP8, W, N, K, c->xq, T, out, ldo, 0.0f);
    if (rc != 0) {
        sw_seterr(errstr, errlen, "cuda: %s (fp8): cuBLASLt %s", what, cuda_blas_status(c->blas, rc));
        return -1;
    }
    return ck(cuk_fp8_epilogue(out, ldo, c->xsc, S, T, N, beta, Y, ldy, c->cs), what, errstr,
              errlen);
}

static double mib(size_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* ---- device memory: every allocation counted against the budget ---- */

/* cudaMalloc of bytes (4 when 0) into *pp, counted in dev_used: 0, or -1 with errstr when it
 * would take dev_used past dev_budget (naming the sizes and the key) or CUDA fails. */
static int dmalloc(cu_t *c, void *pp, size_t bytes, const char *what, char *errstr, size_t errlen)
{
    if (!bytes) bytes = 4;
    if (c->dev_used + bytes > c->dev_budget) {
        sw_seterr(errstr, errlen, "cuda: %s of %.1f MiB exceeds the device budget: %.1f of %.1f "
                  "MiB in use (cuda.mem_fraction %.2f of the free memory at creation; lower "
                  "kv.blocks or raise cuda.mem_fraction)", what, mib(bytes), mib(c->dev_used),
                  mib(c->dev_budget), (double)c->mem_fraction);
        return -1;
    }
    if (ck(cudaMalloc((void **)pp, bytes), what, errstr, errlen)) return -1;
    c->dev_used += bytes;
    return 0;
}

/* cudaFree of p, allocated by dmalloc with bytes (NULL: nothing). */
static void dfree(cu_t *c, void *p, size_t bytes)
{
    if (!p) return;
    cudaFree(p);
    c->dev_used -= bytes ? bytes : 4;
}

/* ---- weights ---- */

typedef struct {
    cu_t *c;
    void *h_stage;         /* pinned [UPLOAD_CHUNK] */
    void *d_stage;         /* device [UPLOAD_CHUNK] */
    uint64_t seed;         /* synthetic weights: 0 = off */
    uint64_t n_filled;     /* synthetic: tensors filled so far (each gets its own stream) */
    char *errstr;
    size_t errlen;
} loader_t;

/* Rows [r0, r0 + nr) of w into the pinned staging buffer: as they are for F32, F16 and BF16
 * files, else widened to F32 on the host. */
static void stage_rows(loader_t *ld, const weight_t *w, int64_t r0, int64_t nr)
{
    const int st = w->type;
    const char *src = (const char *)w->data + (size_t)r0 * w->row_bytes;
    if (st == DT_F32 || st == DT_F16 || st == DT_BF16) {
        memcpy(ld->h_stage, src, (size_t)nr * w->row_bytes);
        return;
    }
    for (int64_t r = 0; r < nr; r++)
        dtype_dequant_row(st, src + (size_t)r * w->row_bytes,
                          (float *)ld->h_stage + (size_t)r * w->cols, w->cols);
}

/* Writes weight w (rows x cols of any supported file type) to d_dst (rows x cols of dst_type),
 * chunk by chunk through the pinned and device staging buffers. Synchronous. */
static int upload(loader_t *ld, const weight_t *w, int dst_type, void *d_dst, float synth_lo,
                  float synth_hi)
{
    cu_t *c = ld->c;
    const size_t n = (size_t)w->rows * (size_t)w->cols;
    const size_t de = cuk_elem_bytes(dst_type);
    if (ld->seed) {
        uint64_t s = ld->seed * 0x9e3779b97f4a7c15ull + ++ld->n_filled;
        if (ck(cuk_fill_random(dst_type, d_dst, n, s, synth_lo, synth_hi, c->cs),
               "synthetic weights", ld->errstr, ld->errlen))
            return -1;
        return ck(cudaStreamSynchronize(c->cs), "synthetic weights", ld->errstr, ld->errlen);
    }
    const int st = w->type;
    const int raw = st == DT_F32 || st == DT_F16 || st == DT_BF16;
    /* widened on the host to F32 first when the file type is a block type */
    const size_t row_in = raw ? w->row_bytes : (size_t)w->cols * 4;
    const int in_type = raw ? st : DT_F32;
    size_t rows_per = UPLOAD_CHUNK / row_in;
    if (rows_per < 1) {
        sw_seterr(ld->errstr, ld->errlen, "cuda: a weight row of %zu bytes exceeds the %zu-byte "
                  "upload buffer", row_in, UPLOAD_CHUNK);
        return -1;
    }
    for (int64_t r0 = 0; r0 < w->rows; r0 += (int64_t)rows_per) {
        int64_t nr = w->rows - r0 < (int64_t)rows_per ? w->rows - r0 : (int64_t)rows_per;
        stage_rows(ld, w, r0, nr);
        const size_t cnt = (size_t)nr * (size_t)w->cols;
        void *dst = (char *)d_dst + (size_t)r0 * (size_t)w->cols * de;
        if (in_type == dst_type) {
            if (ck(cudaMemcpyAsync(dst, ld->h_stage, cnt * de, cudaMemcpyHostToDevice, c->cs),
                   "weight upload", ld->errstr, ld->errlen))
                return -1;
        } else {
            if (ck(cudaMemcpyAsync(ld->d_stage, ld->h_stage, (size_t)nr * row_in,
                                   cudaMemcpyHostToDevice, c->cs),
                   "weight upload", ld->errstr, ld->errlen) ||
                ck(cuk_convert(in_type, ld->d_stage, dst_type, dst, cnt, c->cs),
                   "weight conversion", ld->errstr, ld->errlen))
                return -1;
        }
        if (ck(cudaStreamSynchronize(c->cs), "weight upload", ld->errstr, ld->errlen)) return -1;
    }
    return 0;
}

/* Writes weight w quantised to E4M3 rows (d_q: [rows][cols] bytes, d_scale: [rows] F32;
 * cuk_quant_fp8_rows), chunk by chunk through the staging buffers (synthetic weights: drawn in
 * BF16 on the device first, a seed per chunk). Synchronous. */
static int upload_fp8(loader_t *ld, const weight_t *w, uint8_t *d_q, float *d_scale,
                      float synth_lo, float synth_hi)
{
    cu_t *c = ld->c;
    const int st = w->type;
    const int raw = st == DT_F32 || st == DT_F16 || st == DT_BF16;
    const int in_type = ld->seed ? DT_BF16 : raw ? st : DT_F32;
    const size_t row_in = ld->seed ? (size_t)w->cols * 2 : raw ? w->row_bytes : (size_t)w->cols * 4;
    const size_t rows_per = UPLOAD_CHUNK / row_in;
    if (rows_per < 1) {
        sw_seterr(ld->errstr, ld->errlen, "cuda: a weight row of %zu bytes exceeds the %zu-byte "
                  "upload buffer", row_in, UPLOAD_CHUNK);
        return -1;
    }
    for (int64_t r0 = 0; r0 < w->rows; r0 += (int64_t)rows_per) {
        const int64_t nr = w->rows - r0 < (int64_t)rows_per ? w->rows - r0 : (int64_t)rows_per;
        if (ld->seed) {
            uint64_t s = ld->seed * 0x9e3779b97f4a7c15ull + ++ld->n_filled;
            if (ck(cuk_fill_random(DT_BF16, ld->d_stage, (size_t)nr * (size_t)w->cols, s,
                                   synth_lo, synth_hi, c->cs),
                   "synthetic weights", ld->errstr, ld->errlen))
                return -1;
        } else {
            stage_rows(ld, w, r0, nr);
            if (ck(cudaMemcpyAsync(ld->d_stage, ld->h_stage, (size_t)nr * row_in,
                                   cudaMemcpyHostToDevice, c->cs),
                   "weight upload", ld->errstr, ld->errlen))
                return -1;
        }
        if (ck(cuk_quant_fp8_rows(in_type, ld->d_stage, (int)nr, (int)w->cols,
                                  d_q + (size_t)r0 * (size_t)w->cols, d_scale + r0, c->cs),
               "fp8 weight quantisation", ld->errstr, ld->errlen) ||
            ck(cudaStreamSynchronize(c->cs), "weight upload", ld->errstr, ld->errlen))
            return -1;
    }
    return 0;
}

/* Allocates *d and uploads w converted to dst_type (rows x cols elements). */
static int dev_weight(loader_t *ld, const weight_t *w, int dst_type, void **d, float lo, float hi)
{
    size_t bytes = (size_t)w->rows * (size_t)w->cols * cuk_elem_bytes(dst_type);
    if (dmalloc(ld->c, d, bytes, "weight allocation", ld->errstr, ld->errlen)) return -1;
    return upload(ld, w, dst_type, *d, lo, hi);
}

/* A layer matrix: the matrices ws[0..n) stacked by rows into one new [sum rows][cols] buffer
 * *d, in wtype, or (fp8) in E4M3 with their row scales in a new buffer *ds. */
static int dev_stack(loader_t *ld, const weight_t *const *ws, int n, void **d, float **ds)
{
    cu_t *c = ld->c;
    size_t rows = 0;
    for (int i = 0; i < n; i++) rows += (size_t)ws[i]->rows;
    const size_t el = c->fp8 ? 1 : c->welem;
    if (dmalloc(c, d, rows * (size_t)ws[0]->cols * el, "weight allocation", ld->errstr,
                ld->errlen) ||
        (c->fp8 && dmalloc(c, (void **)ds, rows * 4, "weight scales", ld->errstr, ld->errlen)))
        return -1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        float a = 1.0f / sqrtf((float)ws[i]->cols);
        char *dst = (char *)*d + off * (size_t)ws[i]->cols * el;
        if (c->fp8 ? upload_fp8(ld, ws[i], (uint8_t *)dst, *ds + off, -a, a)
                   : upload(ld, ws[i], c->wtype, dst, -a, a))
            return -1;
        off += (size_t)ws[i]->rows;
    }
    return 0;
}

/* A 1-D F32 vector (norm) to the device; synthetic: all ones. */
static int dev_vec(loader_t *ld, const weight_t *w, float **d)
{
    return dev_weight(ld, w, DT_F32, (void **)d, 1.0f, 1.0f);
}

static int load_weights(cu_t *c, const backend_params_t *p, char *errstr, size_t errlen)
{
    const model_t *m = c->base.model;
    const hparams_t *hp = &m->hp;
    loader_t ld = {.c = c, .seed = p->synthetic_seed, .errstr = errstr, .errlen = errlen};
    int rc = -1;
    if (!ld.seed) {
        if (ck(cudaMallocHost(&ld.h_stage, UPLOAD_CHUNK), "pinned upload buffer", errstr, errlen))
            goto done;
    }
    if ((!ld.seed || c->fp8) &&
        dmalloc(c, &ld.d_stage, UPLOAD_CHUNK, "weight upload buffer", errstr, errlen))
        goto done;
    c->L = calloc((size_t)hp->n_layers, sizeof *c->L);
    if (!c->L) {
        sw_seterr(errstr, errlen, "cuda: out of memory");
        goto done;
    }
    float ea = 1.0f;
    if (dev_weight(&ld, &m->tok_embd, c->wtype, &c->tok_embd, -ea, ea)) goto done;
    if (m->tied_output) {
        c->output = c->tok_embd;
    } else {
        float a = 1.0f / sqrtf((float)hp->dim);
        if (dev_weight(&ld, &m->output, c->wtype, &c->output, -a, a)) goto done;
    }
    if (dev_vec(&ld, &m->output_norm, &c->out_norm)) goto done;
    for (int l = 0; l < hp->n_layers; l++) {
        const layer_weights_t *W = &m->layers[l];
        cu_layer_t *D = &c->L[l];
        const weight_t *qkv[3] = {&W->wq, &W->wk, &W->wv};
        const weight_t *gu[2] = {&W->w_gate, &W->w_up};
        const weight_t *wo[1] = {&W->wo}, *wd[1] = {&W->w_down};
        if (dev_stack(&ld, qkv, 3, &D->wqkv, &D->sqkv) || dev_stack(&ld, wo, 1, &D->wo, &D->so) ||
            dev_stack(&ld, gu, 2, &D->wgu, &D->sgu) ||
            dev_stack(&ld, wd, 1, &D->wdown, &D->sdown) ||
            dev_vec(&ld, &W->attn_norm, &D->attn_norm) || dev_vec(&ld, &W->ffn_norm, &D->ffn_norm))
            goto done;
        if (!ld.seed && (W->bq.data || W->bk.data || W->bv.data)) {
            /* F32 on the host, absent parts zero, then one upload */
            size_t n = (size_t)c->qkvd;
            float *hb = calloc(n, sizeof *hb);
            if (!hb) {
                sw_seterr(errstr, errlen, "cuda: out of memory");
                goto done;
            }
            if (W->bq.data) memcpy(hb, W->bq.data, (size_t)c->qd * 4);
            if (W->bk.data) memcpy(hb + c->qd, W->bk.data, (size_t)c->kvd * 4);
            if (W->bv.data) memcpy(hb + c->qd + c->kvd, W->bv.data, (size_t)c->kvd * 4);
            /* on cs, then waited for: cs does not synchronise with the legacy default stream */
            int e = dmalloc(c, &D->bqkv, n * 4, "bias allocation", errstr, errlen) ||
                    ck(cudaMemcpyAsync(D->bqkv, hb, n * 4, cudaMemcpyHostToDevice, c->cs),
                       "bias upload", errstr, errlen) ||
                    ck(cudaStreamSynchronize(c->cs), "bias upload", errstr, errlen);
            free(hb);
            if (e) goto done;
        }
    }
    size_t nf = (size_t)hp->rope_dim / 2;
    if (dmalloc(c, &c->inv_freq, nf * 4 + 4, "rope allocation", errstr, errlen) ||
        ck(cudaMemcpyAsync(c->inv_freq, m->rope_inv_freq, nf * 4, cudaMemcpyHostToDevice, c->cs),
           "rope upload", errstr, errlen) ||
        ck(cudaStreamSynchronize(c->cs), "rope upload", errstr, errlen))
        goto done;
    rc = 0;
done:
    if (ld.h_stage) cudaFreeHost(ld.h_stage);
    dfree(c, ld.d_stage, UPLOAD_CHUNK);
    return rc;
}

/* ---- forward ---- */

static void graphs_drop(cu_t *c);

/* Makes the metadata buffers hold at least n int32 (host pinned and device): exactly n the
 * first time (the size devmem_plan counts), doubling after. d_meta moving drops the graphs. */
static int meta_reserve(cu_t *c, size_t n, char *errstr, size_t errlen)
{
    if (n <= c->meta_cap) return 0;
    size_t cap = c->meta_cap ? c->meta_cap : n;
    while (cap < n) cap *= 2;
    if (ck(cudaStreamSynchronize(c->cs), "metadata resize", errstr, errlen)) return -1;
    graphs_drop(c);
    cudaFreeHost(c->h_meta);
    dfree(c, c->d_meta, c->meta_cap * 4);
    c->h_meta = NULL;
    c->d_meta = NULL;
    c->meta_cap = 0;
    if (ck(cudaMallocHost((void **)&c->h_meta, cap * 4), "metadata allocation", errstr, errlen) ||
        dmalloc(c, &c->d_meta, cap * 4, "block-table buffer", errstr, errlen))
        return -1;
    c->meta_cap = cap;
    return 0;
}

/* Where a step's logits go: to the host (logits), their argmax (ids), or samples (ids, with
 * rows and the logprob outputs of forward_sample). */
typedef struct {
    float *logits;
    int32_t *ids;
    const backend_sample_t *rows; /* NULL: argmax when ids */
    sampler_logprob_t *chosen, *top;
} step_out_t;

static int sample_rows(cu_t *c, const backend_batch_t *b, const step_out_t *o, char *errstr,
                       size_t errlen);
static int sample_results(cu_t *c, int R, int L, const step_out_t *o);
static int kv_wait_batch(cu_t *c, const backend_batch_t *b, char *errstr, size_t errlen);

/* Enqueues on cs the forward pass of the T tokens whose metadata cu_step uploaded to d_meta
 * (fixed offsets: tokens, pos, tok_seq, logits_idx, bt_off at k * max_T, bt at 5 max_T), up to
 * the logits of rows logits_idx[0..n_logits) in c->logits: embedding, RoPE angles, the layers,
 * the output norm and GEMM. Only kernels and GEMMs on cs, every argument fixed by (T, n_logits,
 * n_splits, grid_splits) and the device buffers: it may be captured into a CUDA graph. */
static int enqueue_forward(cu_t *c, int T, int n_logits, int n_splits, int grid_splits,
                           char *errstr, size_t errlen)
{
    backend_t *be = &c->base;
    const hparams_t *hp = &be->model->hp;
    const size_t mT = (size_t)c->max_T;
    const int32_t *d = c->d_meta;
    const int32_t *d_tok = d, *d_pos = d + mT, *d_seq = d + 2 * mT, *d_lidx = d + 3 * mT;
    const int32_t *d_btoff = d + 4 * mT, *d_bt = d + META_BT(mT);
    const int dim = hp->dim, hd = hp->head_dim, ffn = hp->ffn_dim;
    const int wt = c->wtype;
    cuk_paged_t pg = {
        .pos = d_pos, .tok_seq = d_seq, .bt_off = d_btoff, .bt = d_bt, .kv = c->kv,
        .kv_type = be->params.kv_type, .block_elems = be->kv_block_bytes / c->kv_elem,
        .block_tokens = be->params.block_tokens, .layer = 0,
    };
    if (ck(cuk_embed(wt, c->tok_embd, d_tok, T, dim, c->x, c->cs), "embedding", errstr, errlen) ||
        ck(cuk_rope_table(d_pos, T, c->inv_freq, hp->rope_dim / 2, hp->rope_freq_scale,
                          c->rope_cs, c->cs), "rope table", errstr, errlen))
        return -1;
    for (int l = 0; l < hp->n_layers; l++) {
        const cu_layer_t *L = &c->L[l];
        pg.layer = l;
        cuk_qkv_args_t qa = {
            .T = T, .n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads, .head_dim = hd,
            .rope_dim = hp->rope_dim, .rope_kind = hp->rope_kind, .qkv = c->qkv, .ld = c->qkvd,
            .bias = L->bqkv, .cs = c->rope_cs, .kv = pg,
        };
        cuk_attn_args_t aa = {
            .T = T, .n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads, .head_dim = hd,
            .qkv = c->qkv, .ld = c->qkvd, .kv = pg, .scale = 1.0f / sqrtf((float)hd),
            .n_splits = n_splits, .chunk = ATT_CHUNK, .grid_splits = grid_splits,
            .part = c->part, .out_type = wt, .out = c->att,
            .tiles = c->attn_tc ? d + 5 * mT : NULL,
        };
        if (ck(cuk_rmsnorm(c->x, NULL, T, dim, L->attn_norm, hp->norm_eps, wt, c->xn, c->cs),
               "attention norm", errstr, errlen) ||
            lgemm(c, L->wqkv, L->sqkv, c->qkvd, dim, c->xn, T, c->qkv, c->qkvd, 0.0f, "qkv gemm",
                  errstr, errlen) ||
            ck(cuk_qkv_rope_store(&qa, c->cs), "rope/kv store", errstr, errlen) ||
            ck(c->attn_tc ? cuk_attention_tc(&aa, c->cs) : cuk_attention(&aa, c->cs), "attention",
               errstr, errlen) ||
            lgemm(c, L->wo, L->so, dim, c->qd, c->att, T, c->x, dim, 1.0f, "wo gemm", errstr,
                  errlen) ||
            ck(cuk_rmsnorm(c->x, NULL, T, dim, L->ffn_norm, hp->norm_eps, wt, c->xn, c->cs),
               "ffn norm", errstr, errlen) ||
            lgemm(c, L->wgu, L->sgu, 2 * ffn, dim, c->xn, T, c->gu, 2 * ffn, 0.0f, "gate/up gemm",
                  errstr, errlen) ||
            ck(cuk_swiglu(c->gu, T, ffn, wt, c->hbuf, c->cs), "swiglu", errstr, errlen) ||
            lgemm(c, L->wdown, L->sdown, dim, ffn, c->hbuf, T, c->x, dim, 1.0f, "down gemm", errstr,
                  errlen))
            return -1;
    }
    if (n_logits > 0 &&
        (ck(cuk_rmsnorm(c->x, d_lidx, n_logits, dim, c->out_norm, hp->norm_eps, wt, c->xn,
                        c->cs), "output norm", errstr, errlen) ||
         gemm(c, c->output, hp->n_vocab, dim, c->xn, n_logits, c->logits, hp->n_vocab, 0.0f,
              "output gemm", errstr, errlen)))
        return -1;
    return 0;
}

/* The graph bucket of batch b: log2 of the smallest power of two >= its token count, when b is
 * a decode step (one token a sequence, logits of every token in order) of at most GRAPH_MAX_T
 * tokens (and max_T padded); else -1. */
static int graph_bucket(const cu_t *c, const backend_batch_t *b)
{
    const int T = b->n_tokens;
    if (T != b->n_seqs || b->n_logits != T || T > GRAPH_MAX_T) return -1;
    for (int i = 0; i < T; i++)
        if (b->logits_idx[i] != i) return -1;
    int k = 0;
    while ((1 << k) < T) k++;
    const size_t Tg = (size_t)1 << k;
    if (Tg > (size_t)c->max_T) return -1;
    return k;
}

/* The attention's split-K for a step of T tokens (Tg for a graph step, graph = 1) whose longest
 * context is max_ctx keys, prefill = some sequence has more than one token in it. Both kernels
 * cut a token's context into fixed chunks of ATT_CHUNK keys and fold them in order, so what
 * is chosen here changes speed only, never a token's output (cuda_kernels.h): n_splits = the
 * partials a token the scratch holds for T tokens; grid_splits = at most ATT_SPLITS blocks
 * along the split axis (each loops over its chunks), no more than the longest context has
 * chunks. cuk_attention folds a token whose chunks do not fit by itself; cuk_attention_tc
 * folds whole steps (fold = 1) with a prefill (its tiles fill the device) or with a context
 * that does not fit. A graph's n_splits and grid_splits depend on Tg only (they are captured);
 * the tc mode travels in the metadata. */
typedef struct {
    int n_splits, grid_splits, fold;
} att_split_t;
static att_split_t att_splits(const cu_t *c, int T, int graph, int max_ctx, int prefill)
{
    att_split_t r = {0, 0, 0};
    const int slots = (int)((size_t)c->max_T * ATT_SPLIT_SLOTS / (size_t)T);
    const int nch = (max_ctx + ATT_CHUNK - 1) / ATT_CHUNK;
    r.n_splits = slots < 1 ? 1 : slots;
    const int cap = r.n_splits < ATT_SPLITS ? r.n_splits : ATT_SPLITS;
    r.fold = c->attn_tc && (prefill || nch > r.n_splits);
    r.grid_splits = graph ? cap : r.fold ? 1 : nch < 1 ? 1 : nch < cap ? nch : cap;
    return r;
}

/* Destroys every captured graph. A graph holds the pointers of every buffer enqueue_forward
 * passes: d_meta, the weights, the activations, the attention scratch (part), the KV pool with
 * its scratch block, logits and the cuBLAS workspace. Of these only d_meta moves after creation
 * (meta_reserve calls this); the rest live as long as the backend. The penalty table (d_counts,
 * which may move) is read by the sampling launched after a replay, never inside a graph. */
static void graphs_drop(cu_t *c)
{
    for (int k = 0; k < GRAPH_BUCKETS; k++) {
        if (c->graph[k]) cudaGraphExecDestroy(c->graph[k]);
        c->graph[k] = NULL;
    }
}

/* The forward pass of a decode step of bucket k (1 << k tokens, metadata uploaded): replays the
 * bucket's graph, capturing it at its first use; when capture or instantiation fails, the
 * bucket is marked and runs plain launches from then on (graph_fallbacks counts such steps). */
static int graph_step(cu_t *c, int k, char *errstr, size_t errlen)
{
    const int Tg = 1 << k;
    const att_split_t sp = att_splits(c, Tg, 1, 0, 0);
    if (!c->graph[k] && !c->graph_failed[k]) {
        cudaGraph_t g = NULL;
        int rc = ck(cudaStreamBeginCapture(c->cs, cudaStreamCaptureModeThreadLocal),
                    "graph capture", errstr, errlen);
        if (!rc) {
            rc = enqueue_forward(c, Tg, Tg, sp.n_splits, sp.grid_splits, errstr, errlen);
            /* ends the capture whatever happened inside it (the stream leaves capture mode) */
            if (ck(cudaStreamEndCapture(c->cs, &g), "graph capture", errstr, errlen)) rc = -1;
        }
        if (!rc && ck(cudaGraphInstantiate(&c->graph[k], g, 0), "graph instantiation", errstr,
                      errlen)) {
            c->graph[k] = NULL;
            rc = -1;
        }
        if (g) cudaGraphDestroy(g);
        if (rc) {
            (void)cudaGetLastError(); /* a failed capture is not an error of the step */
            c->graph_failed[k] = 1;
            snprintf(c->graph_why, sizeof c->graph_why, "%s", errstr);
        } else {
            c->graph_captures++;
        }
    }
    if (!c->graph[k]) {
        c->graph_fallbacks++;
        return enqueue_forward(c, Tg, Tg, sp.n_splits, sp.grid_splits, errstr, errlen);
    }
    c->graph_replays++;
    return ck(cudaGraphLaunch(c->graph[k], c->cs), "graph launch", errstr, errlen);
}

/* One step; then the logits [n_logits][n_vocab] as o says. */
static int cu_step(backend_t *be, const backend_batch_t *b, const step_out_t *o, char *errstr,
                   size_t errlen)
{
    cu_t *c = (cu_t *)be;
    if (ck(cudaSetDevice(c->dev), "select device", errstr, errlen)) return -1;
    const model_t *m = be->model;
    const hparams_t *hp = &m->hp;
    const int B = be->params.block_tokens, T = b->n_tokens;
    if (backend_check_batch(be, b, c->max_T, errstr, errlen)) return -1;
    /* the size of the concatenated block tables, and the longest context */
    size_t n_bt = 0;
    int max_ctx = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int last = b->pos[b->seq_start[s + 1] - 1];
        if (last + 1 > max_ctx) max_ctx = last + 1;
        n_bt += (size_t)(last / B + 1);
    }
    /* A decode step (one token a sequence, the logits of each in order) of a bucket that may
     * replay a graph: Tg tokens, the batch padded with tokens of a pseudo-sequence whose table
     * is the scratch block. */
    const size_t mT = (size_t)c->max_T;
    const int gb = graph_bucket(c, b);
    const int Tg = gb >= 0 ? 1 << gb : T;

    /* Metadata to the device: the pinned buffer is free once the previous upload is done. */
    if (ck(cudaEventSynchronize(c->ev_meta), "metadata", errstr, errlen) ||
        meta_reserve(c, META_BT(mT) + n_bt + 1, errstr, errlen))
        return -1;
    int32_t *h = c->h_meta;
    int32_t *h_tok = h, *h_pos = h + mT, *h_seq = h + 2 * mT, *h_lidx = h + 3 * mT;
    int32_t *h_btoff = h + 4 * mT, *h_bt = h + META_BT(mT);
    memcpy(h_tok, b->tokens, (size_t)T * 4);
    memcpy(h_pos, b->pos, (size_t)T * 4);
    if (b->n_logits) memcpy(h_lidx, b->logits_idx, (size_t)b->n_logits * 4);
    size_t off = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) h_seq[t] = s;
        int nb = b->pos[b->seq_start[s + 1] - 1] / B + 1;
        h_btoff[s] = (int32_t)off;
        memcpy(h_bt + off, b->block_tables[s], (size_t)nb * 4);
        off += (size_t)nb;
    }
    if (Tg > T) { /* padding: token 0 at position 0 of the scratch block, logits of its own row */
        h_btoff[b->n_seqs] = (int32_t)off;
        h_bt[off++] = (int32_t)be->params.n_kv_blocks;
        for (int t = T; t < Tg; t++) {
            h_tok[t] = 0;
            h_pos[t] = 0;
            h_seq[t] = b->n_seqs;
            h_lidx[t] = t;
        }
    }
    const att_split_t sp = att_splits(c, Tg, gb >= 0, max_ctx, T > b->n_seqs);
    if (c->attn_tc) cuk_attention_tc_tiles(h_seq, Tg, c->tile_tokens, sp.fold, h + 5 * mT);
    int32_t *d = c->d_meta;
    if (kv_wait_batch(c, b, errstr, errlen) ||
        ck(cudaMemcpyAsync(d, h, (META_BT(mT) + off) * 4, cudaMemcpyHostToDevice, c->cs),
           "metadata upload", errstr, errlen) ||
        ck(cudaEventRecord(c->ev_meta, c->cs), "metadata event", errstr, errlen))
        return -1;

    if (gb >= 0) {
        if (graph_step(c, gb, errstr, errlen)) return -1;
    } else if (enqueue_forward(c, T, b->n_logits, sp.n_splits, sp.grid_splits, errstr, errlen)) {
        return -1;
    }
    if (b->n_logits > 0) {
        if (o->rows) {
            if (sample_rows(c, b, o, errstr, errlen)) return -1;
        } else if (o->ids) {
            if (ck(cuk_argmax(c->logits, b->n_logits, hp->n_vocab, c->d_ids, c->cs), "argmax",
                   errstr, errlen) ||
                ck(cudaMemcpyAsync(o->ids, c->d_ids, (size_t)b->n_logits * 4,
                                   cudaMemcpyDeviceToHost, c->cs), "ids download", errstr, errlen))
                return -1;
        } else if (ck(cudaMemcpyAsync(o->logits, c->logits,
                                      (size_t)b->n_logits * (size_t)hp->n_vocab * sizeof(float),
                                      cudaMemcpyDeviceToHost, c->cs), "logits download", errstr,
                      errlen)) {
            return -1;
        }
    }
    if (ck(cudaEventRecord(c->ev_compute, c->cs), "compute event", errstr, errlen)) return -1;
    /* With logits the caller reads them now: wait (and surface kernel errors). Without, the
     * step stays queued; synchronize() or the next call reports its errors. */
    if (b->n_logits > 0 && ck(cudaStreamSynchronize(c->cs), "forward", errstr, errlen)) return -1;
    if (b->n_logits > 0 && o->rows) {
        int L = 0;
        for (int i = 0; i < b->n_logits; i++)
            if (o->rows[i].p->n_logprobs > L) L = o->rows[i].p->n_logprobs;
        return sample_results(c, b->n_logits, L, o);
    }
    return 0;
}

static int cu_forward(backend_t *be, const backend_batch_t *b, float *logits, char *errstr,
                      size_t errlen)
{
    const step_out_t o = {.logits = logits};
    return cu_step(be, b, &o, errstr, errlen);
}

static int cu_forward_argmax(backend_t *be, const backend_batch_t *b, int32_t *ids, char *errstr,
                             size_t errlen)
{
    const step_out_t o = {.ids = ids};
    return cu_step(be, b, &o, errstr, errlen);
}

/* ---- sampling on the device ---- */

/* Enqueues on cs: the rows' parameters up (pinned h_srows: the previous step that used it
 * synchronised cs before returning), cuk_sample over the logits, its results down to h_sout in
 * one copy. The caller synchronises cs, then sample_results unpacks. */
static int sample_rows(cu_t *c, const backend_batch_t *b, const step_out_t *o, char *errstr,
                       size_t errlen)
{
    const int R = b->n_logits, n_vocab = c->base.model->hp.n_vocab;
    int L = 0;
    for (int i = 0; i < R; i++) {
        const backend_sample_t *r = &o->rows[i];
        const sampler_params_t *p = r->p;
        if (r->pen_slot >= c->slot_cap || (r->pen_slot >= 0 && !c->slot_used[r->pen_slot]) ||
            p->n_logprobs < 0 || p->n_logprobs > SAMPLER_MAX_LOGPROBS) {
            sw_seterr(errstr, errlen, "cuda: sample row %d: bad penalty slot %d or n_logprobs %d",
                      i, r->pen_slot, p->n_logprobs);
            return -1;
        }
        cuda_sample_row_fill(&c->h_srows[i], p, r->rand, r->pen_slot, r->pen_evict);
        if (p->n_logprobs > L) L = p->n_logprobs;
    }
    const size_t words = cuk_sample_out_words(R, L);
    if (ck(cudaMemcpyAsync(c->d_srows, c->h_srows, (size_t)R * sizeof *c->h_srows,
                           cudaMemcpyHostToDevice, c->cs), "sample rows upload", errstr, errlen) ||
        ck(cuk_sample(c->logits, R, n_vocab, c->d_srows, c->d_counts, L, c->d_sout, c->cs),
           "sampling", errstr, errlen) ||
        ck(cudaMemcpyAsync(c->h_sout, c->d_sout, words * 4, cudaMemcpyDeviceToHost, c->cs),
           "samples download", errstr, errlen))
        return -1;
    return 0;
}

/* After cs synchronised: h_sout (cuk_sample's layout for R rows, L logprobs) to the caller. */
static int sample_results(cu_t *c, int R, int L, const step_out_t *o)
{
    const uint32_t *w = c->h_sout;
    for (int i = 0; i < R; i++) {
        o->ids[i] = (int32_t)w[i];
        const int nl = o->rows[i].p->n_logprobs;
        if (nl <= 0 || !o->chosen || !o->top) continue;
        o->chosen[i].id = o->ids[i];
        memcpy(&o->chosen[i].logprob, &w[R + i], 4);
        const uint32_t *t = w + 2 * (size_t)R + 2 * (size_t)L * i;
        for (int j = 0; j < nl; j++) {
            sampler_logprob_t *d = &o->top[(size_t)i * SAMPLER_MAX_LOGPROBS + j];
            d->id = (int32_t)t[2 * j];
            memcpy(&d->logprob, &t[2 * j + 1], 4);
        }
    }
    return 0;
}

static int cu_forward_sample(backend_t *be, const backend_batch_t *b, const backend_sample_t *rows,
                             int32_t *ids, sampler_logprob_t *chosen, sampler_logprob_t *top,
                             char *errstr, size_t errlen)
{
    const step_out_t o = {.ids = ids, .rows = rows, .chosen = chosen, .top = top};
    return cu_step(be, b, &o, errstr, errlen);
}

static int cu_slot_load(backend_t *be, const int32_t *counts, char *errstr, size_t errlen)
{
    cu_t *c = (cu_t *)be;
    const size_t row = (size_t)be->model->hp.n_vocab * sizeof(int32_t);
    if (ck(cudaSetDevice(c->dev), "select device", errstr, errlen)) return -1;
    int slot = 0;
    while (slot < c->slot_cap && c->slot_used[slot]) slot++;
    if (slot == c->slot_cap) { /* full: double the table, keeping the slots in use */
        const int cap = c->slot_cap ? 2 * c->slot_cap : 8;
        int32_t *d = NULL;
        unsigned char *used = realloc(c->slot_used, (size_t)cap);
        if (!used) {
            sw_seterr(errstr, errlen, "cuda: out of memory");
            return -1;
        }
        c->slot_used = used;
        memset(used + c->slot_cap, 0, (size_t)(cap - c->slot_cap));
        if (dmalloc(c, &d, (size_t)cap * row, "penalty counts", errstr, errlen)) return -1;
        if (c->slot_cap &&
            (ck(cudaMemcpyAsync(d, c->d_counts, (size_t)c->slot_cap * row,
                                cudaMemcpyDeviceToDevice, c->cs), "penalty counts", errstr, errlen) ||
             ck(cudaStreamSynchronize(c->cs), "penalty counts", errstr, errlen))) {
            dfree(c, d, (size_t)cap * row);
            return -1;
        }
        /* no graph reads d_counts (graphs_drop): moving it keeps them */
        dfree(c, c->d_counts, (size_t)c->slot_cap * row);
        c->d_counts = d;
        c->slot_cap = cap;
    }
    /* pageable source: the copy has read counts when the call returns; ordered on cs before
     * the next step's sampling */
    if (ck(cudaMemcpyAsync(c->d_counts + (size_t)slot * be->model->hp.n_vocab, counts, row,
                           cudaMemcpyHostToDevice, c->cs), "penalty counts upload", errstr, errlen))
        return -1;
    c->slot_used[slot] = 1;
    return slot;
}

static void cu_slot_free(backend_t *be, int slot)
{
    cu_t *c = (cu_t *)be;
    if (slot >= 0 && slot < c->slot_cap) c->slot_used[slot] = 0;
}

/* ---- KV block transfers (copy stream xs) ----
 *
 * Host to device (tier-2 prefix hits): kv_block_write takes a slot of the page-locked staging
 * ring (n_stage slots, KV_STAGE_BYTES in all; the host waits only when every slot's copy is
 * still queued), queues the copy on xs behind the compute queued so far (ev_compute: the block
 * may have been another sequence's), and gives it write ticket t (1, 2, ...: the writes' order
 * on xs), kept in blk_ticket[block] and recorded as event ev_wr[t % KV_WRITE_EVENTS]. An event
 * re-recorded by a later ticket completes later, so waiting on it for an earlier one is still
 * correct. A step or block copy on cs waits, on the device, for the largest ticket among the
 * blocks it reads or writes that is not known complete (wr_done), and for nothing else; the
 * engine asks kv_write_pending before it schedules such a sequence, so in practice it waits for
 * nothing. Staging rather than registering the arena with cudaHostRegister: an arena slot is
 * shared memory that other workers may rewrite while a copy is in flight, and the engine checks
 * a block's parent and tokens after the tier has copied it out; the device must get that copy.
 * Device to host (tier-2 stores): kv_block_read copies on xs, behind the compute queued so far
 * and the writes before it, into a staging slot and waits for it. kv_block_read_async queues
 * the same copy and returns; the slot remembers the read (rd_ticket, rd_dst) until its bytes
 * reach dst: when kv_read_done finds the copy done, or when the ring comes round to the slot
 * again (stage_acquire then waits for that copy and moves the bytes first). A ticket is
 * (read number << 12) | slot (KV_STAGE_MAX slots fit in 12 bits), so a ticket whose slot no
 * longer names it was finished early. */

/* Takes the next staging slot once its previous copy is done: 0, or -1 on a device error. */
static int stage_acquire(cu_t *c, int *slot)
{
    const int s = c->stage_next;
    c->stage_next = (s + 1) % c->n_stage;
    c->stage_held = -1;
    if (cudaEventSynchronize(c->ev_stage[s]) != cudaSuccess) {
        if (c->rd_ticket[s]) c->rd_error = 1;
        c->rd_ticket[s] = 0;
        return -1;
    }
    if (c->rd_ticket[s]) { /* an asynchronous read not yet answered: its bytes go out first */
        memcpy(c->rd_dst[s], c->h_stage + (size_t)s * c->base.kv_block_bytes,
               c->base.kv_block_bytes);
        c->rd_ticket[s] = 0;
    }
    *slot = s;
    return 0;
}

static unsigned char *stage_ptr(const cu_t *c, int slot)
{
    return c->h_stage + (size_t)slot * c->base.kv_block_bytes;
}

/* The largest write ticket of blocks[0..n) (out-of-pool entries, such as -1, skipped), 0 none. */
static uint64_t max_ticket(const cu_t *c, const int32_t *blocks, int n)
{
    uint64_t t = 0;
    for (int i = 0; i < n; i++) {
        const int32_t b = blocks[i];
        if (b >= 0 && b < c->base.params.n_kv_blocks && c->blk_ticket[b] > t) t = c->blk_ticket[b];
    }
    return t;
}

/* Whether write ticket t has completed: 1, 0 (still queued), or -1 (device error). Never
 * waits. */
static int ticket_done(cu_t *c, uint64_t t)
{
    if (t <= c->wr_done) return 1;
    const int e = (int)(t % KV_WRITE_EVENTS);
    cudaError_t rc = cudaEventQuery(c->ev_wr[e]);
    if (rc == cudaErrorNotReady) return 0;
    if (rc != cudaSuccess) return -1;
    if (c->ev_wr_ticket[e] > c->wr_done) c->wr_done = c->ev_wr_ticket[e]; /* xs is in order */
    return 1;
}

/* Makes cs wait for write ticket t (0: none) unless it has completed. */
static int wait_ticket(cu_t *c, uint64_t t, char *errstr, size_t errlen)
{
    if (t == 0) return 0;
    int d = ticket_done(c, t);
    if (d < 0)
        return ck(cudaEventQuery(c->ev_wr[t % KV_WRITE_EVENTS]), "KV block write", errstr, errlen);
    if (d) return 0;
    return ck(cudaStreamWaitEvent(c->cs, c->ev_wr[t % KV_WRITE_EVENTS], 0), "wait for KV writes",
              errstr, errlen);
}

/* Makes cs wait for the writes still in flight to the blocks batch b reads or writes. */
static int kv_wait_batch(cu_t *c, const backend_batch_t *b, char *errstr, size_t errlen)
{
    const int B = c->base.params.block_tokens;
    uint64_t t = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const int nb = b->pos[b->seq_start[s + 1] - 1] / B + 1;
        const uint64_t ts = max_ticket(c, b->block_tables[s], nb);
        if (ts > t) t = ts;
    }
    return wait_ticket(c, t, errstr, errlen);
}

static void *cu_kv_stage_buffer(backend_t *be)
{
    cu_t *c = (cu_t *)be;
    int slot;
    if (cudaSetDevice(c->dev) != cudaSuccess || stage_acquire(c, &slot)) return NULL;
    c->stage_held = slot;
    return stage_ptr(c, slot);
}

static int cu_kv_read(backend_t *be, int32_t block, void *dst)
{
    cu_t *c = (cu_t *)be;
    if (block < 0 || block >= be->params.n_kv_blocks || cudaSetDevice(c->dev) != cudaSuccess)
        return -1;
    int slot;
    if (stage_acquire(c, &slot)) return -1;
    unsigned char *st = stage_ptr(c, slot);
    const size_t n = be->kv_block_bytes;
    if (cudaStreamWaitEvent(c->xs, c->ev_compute, 0) != cudaSuccess ||
        cudaMemcpyAsync(st, c->kv + (size_t)block * n, n, cudaMemcpyDeviceToHost, c->xs) !=
            cudaSuccess ||
        cudaEventRecord(c->ev_stage[slot], c->xs) != cudaSuccess ||
        cudaEventSynchronize(c->ev_stage[slot]) != cudaSuccess)
        return -1;
    memcpy(dst, st, n);
    return 0;
}

static int cu_kv_read_async(backend_t *be, int32_t block, void *dst, uint64_t *ticket)
{
    cu_t *c = (cu_t *)be;
    if (block < 0 || block >= be->params.n_kv_blocks || !dst ||
        cudaSetDevice(c->dev) != cudaSuccess)
        return -1;
    int slot;
    if (stage_acquire(c, &slot)) return -1;
    const size_t n = be->kv_block_bytes;
    if (cudaStreamWaitEvent(c->xs, c->ev_compute, 0) != cudaSuccess ||
        cudaMemcpyAsync(stage_ptr(c, slot), c->kv + (size_t)block * n, n, cudaMemcpyDeviceToHost,
                        c->xs) != cudaSuccess ||
        cudaEventRecord(c->ev_stage[slot], c->xs) != cudaSuccess)
        return -1;
    const uint64_t t = (++c->rd_seq << 12) | (uint64_t)slot;
    c->rd_ticket[slot] = t;
    c->rd_dst[slot] = dst;
    *ticket = t;
    return 0;
}

static int cu_kv_read_done(backend_t *be, uint64_t ticket, int wait)
{
    cu_t *c = (cu_t *)be;
    const int slot = (int)(ticket & 4095);
    if (slot >= c->n_stage || c->rd_ticket[slot] != ticket) return c->rd_error ? -1 : 1;
    if (cudaSetDevice(c->dev) != cudaSuccess) return -1;
    cudaError_t rc = wait ? cudaEventSynchronize(c->ev_stage[slot])
                          : cudaEventQuery(c->ev_stage[slot]);
    if (rc == cudaErrorNotReady) return 0;
    c->rd_ticket[slot] = 0;
    if (rc != cudaSuccess) return -1;
    memcpy(c->rd_dst[slot], stage_ptr(c, slot), be->kv_block_bytes);
    return 1;
}

/* Returns once the copy is queued (src copied into a staging slot first unless it is the slot
 * kv_stage_buffer handed out); kv_write_pending says when it is done. */
static int cu_kv_write(backend_t *be, int32_t block, const void *src)
{
    cu_t *c = (cu_t *)be;
    if (block < 0 || block >= be->params.n_kv_blocks || cudaSetDevice(c->dev) != cudaSuccess)
        return -1;
    const size_t n = be->kv_block_bytes;
    int slot = c->stage_held;
    if (slot < 0 || src != stage_ptr(c, slot)) {
        if (stage_acquire(c, &slot)) return -1;
        memcpy(stage_ptr(c, slot), src, n);
    }
    c->stage_held = -1;
    const uint64_t t = c->wr_ticket + 1;
    const int e = (int)(t % KV_WRITE_EVENTS);
    if (cudaStreamWaitEvent(c->xs, c->ev_compute, 0) != cudaSuccess ||
        cudaMemcpyAsync(c->kv + (size_t)block * n, stage_ptr(c, slot), n, cudaMemcpyHostToDevice,
                        c->xs) != cudaSuccess ||
        cudaEventRecord(c->ev_stage[slot], c->xs) != cudaSuccess ||
        cudaEventRecord(c->ev_wr[e], c->xs) != cudaSuccess)
        return -1;
    c->wr_ticket = t;
    c->ev_wr_ticket[e] = t;
    c->blk_ticket[block] = t;
    return 0;
}

static int cu_kv_pending(backend_t *be, const int32_t *blocks, int n)
{
    cu_t *c = (cu_t *)be;
    const uint64_t t = max_ticket(c, blocks, n);
    if (t <= c->wr_done) return 0;
    if (cudaSetDevice(c->dev) != cudaSuccess) return -1;
    const int d = ticket_done(c, t);
    return d < 0 ? -1 : !d;
}

static int cu_kv_copy(backend_t *be, int32_t dst, int32_t src)
{
    cu_t *c = (cu_t *)be;
    if (dst < 0 || src < 0 || dst >= be->params.n_kv_blocks || src >= be->params.n_kv_blocks ||
        cudaSetDevice(c->dev) != cudaSuccess)
        return -1;
    if (dst == src) return 0;
    const size_t n = be->kv_block_bytes;
    const int32_t both[2] = {dst, src};
    char err[160];
    if (wait_ticket(c, max_ticket(c, both, 2), err, sizeof err) ||
        cudaMemcpyAsync(c->kv + (size_t)dst * n, c->kv + (size_t)src * n, n,
                        cudaMemcpyDeviceToDevice, c->cs) != cudaSuccess ||
        cudaEventRecord(c->ev_compute, c->cs) != cudaSuccess)
        return -1;
    return 0;
}

static int cu_sync(backend_t *be)
{
    cu_t *c = (cu_t *)be;
    if (cudaSetDevice(c->dev) != cudaSuccess || cudaStreamSynchronize(c->cs) != cudaSuccess ||
        cudaStreamSynchronize(c->xs) != cudaSuccess)
        return -1;
    c->wr_done = c->wr_ticket;
    return 0;
}

static void cu_free(backend_t *be)
{
    cu_t *c = (cu_t *)be;
    if (!c) return;
    /* Errors here cannot be reported; everything owned is released regardless. */
    cudaSetDevice(c->dev);
    if (c->cs) cudaStreamSynchronize(c->cs);
    if (c->xs) cudaStreamSynchronize(c->xs);
    graphs_drop(c);
    if (c->L) {
        for (int l = 0; l < be->model->hp.n_layers; l++) {
            cudaFree(c->L[l].wqkv);
            cudaFree(c->L[l].bqkv);
            cudaFree(c->L[l].wo);
            cudaFree(c->L[l].wgu);
            cudaFree(c->L[l].wdown);
            cudaFree(c->L[l].sqkv);
            cudaFree(c->L[l].so);
            cudaFree(c->L[l].sgu);
            cudaFree(c->L[l].sdown);
            cudaFree(c->L[l].attn_norm);
            cudaFree(c->L[l].ffn_norm);
        }
        free(c->L);
    }
    if (c->output != c->tok_embd) cudaFree(c->output);
    cudaFree(c->tok_embd);
    cudaFree(c->out_norm);
    cudaFree(c->inv_freq);
    cudaFree(c->kv);
    cudaFree(c->x);
    cudaFree(c->xn);
    cudaFree(c->xq);
    cudaFree(c->xsc);
    cudaFree(c->acc);
    cudaFree(c->qkv);
    cudaFree(c->att);
    cudaFree(c->gu);
    cudaFree(c->hbuf);
    cudaFree(c->rope_cs);
    cudaFree(c->part);
    cudaFree(c->logits);
    cudaFree(c->d_ids);
    cudaFree(c->d_srows);
    cudaFree(c->d_sout);
    cudaFree(c->d_counts);
    free(c->slot_used);
    if (c->h_srows) cudaFreeHost(c->h_srows);
    if (c->h_sout) cudaFreeHost(c->h_sout);
    cudaFree(c->d_meta);
    cudaFree(c->blas_ws);
    if (c->h_meta) cudaFreeHost(c->h_meta);
    if (c->h_stage) cudaFreeHost(c->h_stage);
    free(c->blk_ticket);
    free(c->rd_ticket);
    free(c->rd_dst);
    cuda_blas_free(c->blas);
    if (c->ev_stage) {
        for (int i = 0; i < c->n_stage; i++)
            if (c->ev_stage[i]) cudaEventDestroy(c->ev_stage[i]);
        free(c->ev_stage);
    }
    for (int i = 0; i < KV_WRITE_EVENTS; i++)
        if (c->ev_wr[i]) cudaEventDestroy(c->ev_wr[i]);
    if (c->ev_compute) cudaEventDestroy(c->ev_compute);
    if (c->ev_meta) cudaEventDestroy(c->ev_meta);
    if (c->cs) cudaStreamDestroy(c->cs);
    if (c->xs) cudaStreamDestroy(c->xs);
    free(c);
}

void backend_cuda_graph_counts(const backend_t *be, backend_graph_counts_t *out)
{
    const cu_t *c = (const cu_t *)be;
    out->captured = c->graph_captures;
    out->replayed = c->graph_replays;
    out->fallbacks = c->graph_fallbacks;
    snprintf(out->why, sizeof out->why, "%s", c->graph_why);
}

static const backend_ops_t cuda_ops = {
    .name = "cuda",
    .free = cu_free,
    .forward = cu_forward,
    .forward_argmax = cu_forward_argmax,
    .forward_sample = cu_forward_sample,
    .sample_slot_load = cu_slot_load,
    .sample_slot_free = cu_slot_free,
    .kv_block_read = cu_kv_read,
    .kv_block_write = cu_kv_write,
    .kv_block_copy = cu_kv_copy,
    .kv_write_pending = cu_kv_pending,
    .kv_stage_buffer = cu_kv_stage_buffer,
    .kv_block_read_async = cu_kv_read_async,
    .kv_read_done = cu_kv_read_done,
    .synchronize = cu_sync,
};

/* Creates the copy stream, its events, the staging ring and the ticket table (creation). */
static int kv_transfer_init(cu_t *c, char *errstr, size_t errlen)
{
    size_t n = KV_STAGE_BYTES / c->base.kv_block_bytes;
    if (n < KV_STAGE_MIN) n = KV_STAGE_MIN;
    if (n > KV_STAGE_MAX) n = KV_STAGE_MAX;
    c->stage_held = -1;
    c->blk_ticket = calloc((size_t)c->base.params.n_kv_blocks, sizeof *c->blk_ticket);
    c->ev_stage = calloc(n, sizeof *c->ev_stage);
    c->rd_ticket = calloc(n, sizeof *c->rd_ticket);
    c->rd_dst = calloc(n, sizeof *c->rd_dst);
    if (!c->blk_ticket || !c->ev_stage || !c->rd_ticket || !c->rd_dst) {
        sw_seterr(errstr, errlen, "cuda: out of memory");
        return -1;
    }
    c->n_stage = (int)n;
    if (ck(cudaStreamCreateWithFlags(&c->xs, cudaStreamNonBlocking), "copy stream", errstr,
           errlen) ||
        ck(cudaMallocHost((void **)&c->h_stage, n * c->base.kv_block_bytes), "pinned KV staging",
           errstr, errlen))
        return -1;
    for (int i = 0; i < c->n_stage; i++)
        if (ck(cudaEventCreateWithFlags(&c->ev_stage[i], cudaEventDisableTiming), "event", errstr,
               errlen))
            return -1;
    for (int i = 0; i < KV_WRITE_EVENTS; i++)
        if (ck(cudaEventCreateWithFlags(&c->ev_wr[i], cudaEventDisableTiming), "event", errstr,
               errlen))
            return -1;
    return 0;
}

int backend_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* the failed query is not an error of later calls */
        return 0;
    }
    return n;
}

/* engine/devmem.h's formula for model and p on a device with free_b bytes free (budget
 * free_b x p->mem_fraction). */
static int cuda_devmem_plan(const model_t *m, const backend_params_t *p, int qkv_bias,
                            uint64_t free_b, devmem_t *out, char *errstr, size_t errlen);

backend_t *backend_cuda_new(const model_t *model, const backend_params_t *params, char *errstr,
                            size_t errlen)
{
    const hparams_t *hp = &model->hp;
    const int wt = params->weight_type;
    if (params->block_tokens < 1 || params->n_kv_blocks < 0 || params->max_batch_tokens < 1 ||
        (params->kv_type != DT_F32 && params->kv_type != DT_F16) ||
        (wt != DT_BF16 && wt != DT_F16 && wt != DT_F32 && wt != BACKEND_WTYPE_FP8) ||
        !(params->mem_fraction > 0.0f) ||
        params->mem_fraction > 1.0f) {
        sw_seterr(errstr, errlen, "cuda: bad parameters (block tokens %d, blocks %d, batch tokens "
                  "%d, kv type %s, weight type %s, mem_fraction %g: (0, 1])", params->block_tokens,
                  params->n_kv_blocks, params->max_batch_tokens, dtype_name(params->kv_type),
                  wt == BACKEND_WTYPE_FP8 ? "fp8" : dtype_name(wt), (double)params->mem_fraction);
        return NULL;
    }
    if (hp->n_expert > 0) {
        sw_seterr(errstr, errlen, "cuda: %s with %d experts: the CUDA backend has no mixture-of-experts "
                  "FFN; use backend cpu", hp->arch_name, hp->n_expert);
        return NULL;
    }
    if (hp->head_dim > CUK_MAX_HEAD_DIM || hp->head_dim % 2 || hp->n_kv_heads < 1 ||
        hp->n_heads % hp->n_kv_heads || hp->n_heads / hp->n_kv_heads > CUK_MAX_GROUP) {
        sw_seterr(errstr, errlen, "cuda: unsupported attention shape (head_dim %d <= %d and even, "
                  "%d heads / %d kv heads <= %d)", hp->head_dim, CUK_MAX_HEAD_DIM, hp->n_heads,
                  hp->n_kv_heads, CUK_MAX_GROUP);
        return NULL;
    }
    if (!model_is_plain_llama(model)) {
        sw_seterr(errstr, errlen, "cuda: architecture '%s' (or its RoPE scaling / sliding window) "
                  "runs on the CPU backend only; the CUDA backend runs llama and qwen2 without "
                  "them", hp->arch_name);
        return NULL;
    }
    int n_dev = 0;
    cudaError_t drc = cudaGetDeviceCount(&n_dev);
    if (drc != cudaSuccess || n_dev < 1) {
        /* The static runtime opens the driver library itself; not loaded = not on this host
         * (the runtime then reports an "insufficient driver", which reads as a version
         * problem). */
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        int rt = 0;
        cudaRuntimeGetVersion(&rt);
        if (drc == cudaErrorInsufficientDriver && !drv)
            sw_seterr(errstr, errlen, "cuda: no CUDA device (no NVIDIA driver: libcuda.so.1 is not "
                      "installed; this build's CUDA runtime is %d.%d)", rt / 1000, rt % 1000 / 10);
        else
            sw_seterr(errstr, errlen, "cuda: no CUDA device (%s; CUDA runtime %d.%d)",
                      drc != cudaSuccess ? cudaGetErrorString(drc) : "device count 0", rt / 1000,
                      rt % 1000 / 10);
        if (drv) dlclose(drv);
        cudaGetLastError(); /* the failed query is not an error of later calls */
        return NULL;
    }
    cu_t *c = calloc(1, sizeof *c);
    if (!c) {
        sw_seterr(errstr, errlen, "cuda: out of memory");
        return NULL;
    }
    c->base.ops = &cuda_ops;
    c->base.ctx = c;
    c->base.model = model;
    c->base.params = *params;
    c->fp8 = wt == BACKEND_WTYPE_FP8;
    c->wtype = c->fp8 ? DT_BF16 : wt;
    c->welem = cuk_elem_bytes(c->wtype);
    c->kv_elem = params->kv_type == DT_F32 ? 4 : 2;
    c->attn_tc = c->wtype != DT_F32 &&
                 cuk_attention_tc_supported(hp->n_heads, hp->n_kv_heads, hp->head_dim,
                                            params->kv_type);
    c->tile_tokens = cuk_attention_tc_tile_tokens(hp->n_heads, hp->n_kv_heads);
    c->base.kv_block_bytes = (size_t)params->block_tokens * model_kv_bytes_per_token(model, c->kv_elem);
    c->max_T = params->max_batch_tokens;
    c->qd = hp->n_heads * hp->head_dim;
    c->kvd = hp->n_kv_heads * hp->head_dim;
    c->qkvd = c->qd + 2 * c->kvd;

    if (params->device < 0 || params->device >= n_dev) {
        sw_seterr(errstr, errlen, "cuda: no CUDA device %d (this host has %d: 0..%d)",
                  params->device, n_dev, n_dev - 1);
        goto fail;
    }
    c->dev = params->device;
    if (ck(cudaSetDevice(c->dev), "select device", errstr, errlen)) goto fail;
    if (c->fp8) {
        int major = 0, minor = 0;
        if (ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->dev),
               "device query", errstr, errlen) ||
            ck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->dev),
               "device query", errstr, errlen))
            goto fail;
        if (major * 10 + minor < 89) {
            sw_seterr(errstr, errlen, "cuda: cuda.dtype fp8 needs a device of compute capability "
                      "8.9 or later (FP8 tensor cores: Ada, Hopper); device %d is %d.%d: use "
                      "bf16", c->dev, major, minor);
            goto fail;
        }
    }
    size_t free_b = 0, total_b = 0;
    if (ck(cudaMemGetInfo(&free_b, &total_b), "device memory query", errstr, errlen)) goto fail;
    devmem_t dm;
    {
        const int bias = !params->synthetic_seed &&
                         (model->layers[0].bq.data || model->layers[0].bk.data ||
                          model->layers[0].bv.data);
        if (cuda_devmem_plan(model, params, bias, (uint64_t)free_b, &dm, errstr, errlen)) {
            size_t n = strlen(errstr);
            if (n < errlen)
                snprintf(errstr + n, errlen - n, " [budget = cuda.mem_fraction %.2f x %.1f MiB "
                         "free of %.1f MiB]", (double)params->mem_fraction, mib(free_b),
                         mib(total_b));
            goto fail;
        }
        c->dev_budget = (uint64_t)((double)free_b * (double)params->mem_fraction);
        c->mem_fraction = params->mem_fraction;
        c->base.params.n_kv_blocks = (int)dm.kv_blocks;
        c->base.dev_bytes_planned = dm.total;
        c->base.dev_allocations = dm.allocations;
    }
    if (kv_transfer_init(c, errstr, errlen)) goto fail;
    if (ck(cudaStreamCreateWithFlags(&c->cs, cudaStreamNonBlocking), "stream", errstr, errlen) ||
        ck(cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming), "event", errstr,
           errlen) ||
        ck(cudaEventCreateWithFlags(&c->ev_meta, cudaEventDisableTiming), "event", errstr, errlen))
        goto fail;
    if (dmalloc(c, &c->blas_ws, BLAS_WORKSPACE, "cuBLAS workspace", errstr, errlen) ||
        !(c->blas = cuda_blas_new(c->cs, c->blas_ws, BLAS_WORKSPACE, errstr, errlen)))
        goto fail;
    if (load_weights(c, params, errstr, errlen)) goto fail;

    {
        const size_t T = (size_t)c->max_T, dim = hp->dim, hd = hp->head_dim, we = c->welem;
        const size_t ffn = hp->ffn_dim, V = (size_t)hp->n_vocab;
        /* the pool, and the graphs' scratch block after it (devmem_t.kv_scratch) */
        const size_t kv_total = ((size_t)c->base.params.n_kv_blocks + 1) * c->base.kv_block_bytes;
        if (dmalloc(c, &c->x, T * dim * 4, "activations", errstr, errlen) ||
            dmalloc(c, &c->xn, T * dim * we, "activations", errstr, errlen) ||
            (c->fp8 &&
             (dmalloc(c, (void **)&c->xq, T * (size_t)fp8_kmax(c, hp), "fp8 activations", errstr,
                      errlen) ||
              dmalloc(c, (void **)&c->xsc, T * 4, "fp8 activations", errstr, errlen) ||
              dmalloc(c, (void **)&c->acc, T * dim * 4, "fp8 activations", errstr, errlen))) ||
            dmalloc(c, &c->qkv, T * (size_t)c->qkvd * 4, "activations", errstr, errlen) ||
            dmalloc(c, &c->att, T * (size_t)c->qd * we, "activations", errstr, errlen) ||
            dmalloc(c, &c->gu, T * 2 * ffn * 4, "activations", errstr, errlen) ||
            dmalloc(c, &c->hbuf, T * ffn * we, "activations", errstr, errlen) ||
            dmalloc(c, &c->rope_cs, T * (size_t)hp->rope_dim * 4, "activations", errstr, errlen) ||
            dmalloc(c, &c->part, T * (size_t)hp->n_heads * ATT_SPLIT_SLOTS * (hd + 2) * 4,
                    "attention scratch", errstr, errlen) ||
            dmalloc(c, &c->logits, T * V * 4, "logits", errstr, errlen) ||
            dmalloc(c, &c->d_ids, T * 4, "logits", errstr, errlen) ||
            dmalloc(c, &c->d_srows, T * sizeof(cuk_sample_row_t), "sampling", errstr, errlen) ||
            dmalloc(c, &c->d_sout, cuk_sample_out_words((int)T, SAMPLER_MAX_LOGPROBS) * 4,
                    "sampling", errstr, errlen) ||
            dmalloc(c, &c->d_counts, (size_t)dm.penalty_slots * V * 4, "penalty counts", errstr,
                    errlen) ||
            ck(cudaMallocHost((void **)&c->h_srows, T * sizeof(cuk_sample_row_t)),
               "pinned sampling rows", errstr, errlen) ||
            ck(cudaMallocHost((void **)&c->h_sout,
                              cuk_sample_out_words((int)T, SAMPLER_MAX_LOGPROBS) * 4),
               "pinned sampling results", errstr, errlen) ||
            meta_reserve(c, (size_t)dm.metadata_words, errstr, errlen))
            goto fail;
        c->slot_cap = (int)dm.penalty_slots;
        if (!(c->slot_used = calloc((size_t)c->slot_cap, 1))) {
            sw_seterr(errstr, errlen, "cuda: out of memory");
            goto fail;
        }
        char what[96];
        snprintf(what, sizeof what, "KV pool of %d blocks + the graphs' scratch block",
                 c->base.params.n_kv_blocks);
        if (dmalloc(c, &c->kv, kv_total, what, errstr, errlen)) goto fail;
    }
    /* what creation took from the device, the formula's figure beside it */
    size_t free_after = 0;
    if (ck(cudaDeviceSynchronize(), "creation", errstr, errlen) ||
        ck(cudaMemGetInfo(&free_after, &total_b), "device memory query", errstr, errlen))
        goto fail;
    c->base.dev_bytes_measured = free_b > free_after ? (uint64_t)(free_b - free_after) : 0;
    if (c->dev_used != dm.total) { /* an allocation outside the formula: a bug here */
        sw_seterr(errstr, errlen, "cuda: internal: allocated %llu bytes, engine/devmem.h says %llu",
                  (unsigned long long)c->dev_used, (unsigned long long)dm.total);
        goto fail;
    }
    return &c->base;
fail:
    cu_free(&c->base);
    return NULL;
}

static int cuda_devmem_plan(const model_t *m, const backend_params_t *p, int qkv_bias, uint64_t free_b,
                     devmem_t *out, char *errstr, size_t errlen)
{
    const hparams_t *hp = &m->hp;
    const devmem_shape_t sh = {
        .n_layers = hp->n_layers, .n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads,
        .head_dim = hp->head_dim, .dim = hp->dim, .ffn_dim = hp->ffn_dim, .n_vocab = hp->n_vocab,
        .rope_dim = hp->rope_dim, .ctx_len = hp->ctx_len, .tied_output = m->tied_output,
        .qkv_bias = qkv_bias,
    };
    const devmem_params_t dp = {
        .weight_elem = p->weight_type == BACKEND_WTYPE_FP8 ? 2 : (int)cuk_elem_bytes(p->weight_type),
        .fp8 = p->weight_type == BACKEND_WTYPE_FP8,
        .kv_elem = p->kv_type == DT_F32 ? 4 : 2,
        .block_tokens = p->block_tokens, .max_batch_tokens = p->max_batch_tokens,
        .max_seqs = p->max_seqs, .max_ctx = p->max_ctx, .n_kv_blocks = p->n_kv_blocks,
        .synthetic = p->synthetic_seed != 0,
        .budget = (uint64_t)((double)free_b * (double)p->mem_fraction),
    };
    return devmem_plan(&sh, &dp, out, errstr, errlen);
}
