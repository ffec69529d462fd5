/* bench/bench_cuda.c: the CUDA backend against the device's own ceilings, printed as a markdown
 * table.
 *   copy bandwidth  device-to-device cudaMemcpy of a 2 GiB buffer, bytes read + written per s
 *   GEMM rate       cuBLAS BF16 GEMM 8192^3 with F32 accumulation, cuBLAS's own algorithm (not the
 *                   engine's fixed ones: cuda_blas_set_fixed 0), FLOP/s
 * Then per model shape (mkmodel presets llama-3.2-1b and llama-3.1-8b, BF16 weights, F16 KV):
 *   decode@B   tokens/s of B sequences (B = 1, 8, 64, 256) each decoding one token per step at a
 *              context of 128..160, greedy on the device (forward_argmax); ceiling: the larger
 *              of weight bytes / copy bandwidth and 2 x matrix parameters x B / GEMM rate per step
 *   prefill    tokens/s of 8 prompts of 512 tokens in one 4096-token step; ceiling
 *              GEMM rate / (2 x matrix parameters) per token
 *   128/128    generated tokens/s of 256 requests of 128 prompt tokens and 128 generated tokens
 *              (prefill in 4096-token steps, then decode at batch 256)
 * Then device sampling (cuk_sample, engine/cuda/cuda_sample.h) of B rows of 128,256 random
 * logits (B = 1, 64, 256), microseconds per step for greedy, temperature + top-p, top-k + top-p
 * + min-p, penalties + logprobs, beside cuk_argmax and the time the logits would take to cross
 * PCIe at 25 GB/s (what sampling on the host moved per step).
 * Then decode attention alone on the 8B shape, batch 1..256 x context 512..32k, the CUDA-core
 * cuk_attention and the tensor-core cuk_attention_tc (what BF16 and FP8 use): microseconds per
 * call and the tensor-core kernel's KV bytes read per second against the copy bandwidth.
 * The models are not read from files: the backend fills BF16 weights of the preset's shape on
 * the device from a seed (backend_params_t.synthetic_seed), so an 8B shape costs no 16 GB file
 * and no upload. Goals on an H200 are printed beside the numbers.
 * --dtypes bf16,fp8 (the default) runs every model in BF16, then with cuda.dtype fp8 (E4M3 layer
 * matrices: the decode ceiling counts their bytes as 1 a weight).
 * usage: bench_cuda [--models llama-3.2-1b,llama-3.1-8b] [--dtypes bf16,fp8] [--steps N]
 * Exit 0 when it ran (goals missed or not), 1 on an error, 77 without a CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef SPILLWAY_HAVE_CUDA
int main(void)
{
    printf("SKIP: CUDA backend not built (configure with -DSPILLWAY_CUDA=ON)\n");
    return 77;
}
#else

#include "bench/benchlib.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_blas.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/cuda_sample.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "tools/mkmodel.h"

#define BLOCK_TOKENS 16
#define MAX_T 4096
#define CTX0 128        /* context before the timed decode steps */
#define PREFILL_SEQS 8
#define PREFILL_LEN 512
#define TP_SEQS 256     /* 128-in / 128-out run */
#define TP_IN 128
#define TP_OUT 128
/* goals on an H200 */
#define GOAL_DECODE1 0.75
#define GOAL_PREFILL 0.60
#define GOAL_TP_8B 12500.0

#define CK(x, what)                                                                            \
    do {                                                                                       \
        cudaError_t rc_ = (x);                                                                 \
        if (rc_ != cudaSuccess) {                                                              \
            fprintf(stderr, "bench_cuda: %s: %s\n", what, cudaGetErrorString(rc_));            \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

/* Device copy bandwidth (read + written bytes per second) and BF16 GEMM FLOP/s. 0 or -1. */
static int ceilings(double *bw, double *flops)
{
    const size_t bytes = (size_t)2 << 30;
    const int M = 8192, reps = 10;
    void *a = NULL, *b = NULL, *w = NULL, *x = NULL;
    float *y = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cuda_blas_t *h = NULL;
    char err[1024];
    int rc = -1;
    float ms = 0;
    CK(cudaEventCreate(&e0), "event");
    CK(cudaEventCreate(&e1), "event");
    CK(cudaMalloc(&a, bytes), "copy buffer");
    CK(cudaMalloc(&b, bytes), "copy buffer");
    CK(cudaMemset(a, 1, bytes), "memset");
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "copy");
    CK(cudaEventRecord(e0, 0), "event");
    for (int i = 0; i < reps; i++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0), "copy");
    CK(cudaEventRecord(e1, 0), "event");
    CK(cudaEventSynchronize(e1), "copy");
    CK(cudaEventElapsedTime(&ms, e0, e1), "event");
    *bw = 2.0 * (double)bytes * reps / (ms * 1e-3);
    cudaFree(a);
    cudaFree(b);
    a = b = NULL;

    if (!(h = cuda_blas_new(0, NULL, 0, err, sizeof err))) {
        fprintf(stderr, "bench_cuda: %s\n", err);
        goto fail;
    }
    cuda_blas_set_fixed(h, 0); /* the device's best GEMM, the reference rate */
    CK(cudaMalloc(&w, (size_t)M * M * 2), "gemm buffer");
    CK(cudaMalloc(&x, (size_t)M * M * 2), "gemm buffer");
    CK(cudaMalloc((void **)&y, (size_t)M * M * 4), "gemm buffer");
    CK(cuk_fill_random(DT_BF16, w, (size_t)M * M, 1, -1, 1, 0), "fill");
    CK(cuk_fill_random(DT_BF16, x, (size_t)M * M, 2, -1, 1, 0), "fill");
    for (int i = 0; i < reps + 2; i++) {
        if (i == 2) CK(cudaEventRecord(e0, 0), "event");
        int st = cuda_blas_gemm(h, DT_BF16, w, M, M, x, M, y, M, 0.0f);
        if (st != 0) {
            fprintf(stderr, "bench_cuda: gemm: cuBLAS %s\n", cuda_blas_status(h, st));
            goto fail;
        }
    }
    CK(cudaEventRecord(e1, 0), "event");
    CK(cudaEventSynchronize(e1), "gemm");
    CK(cudaEventElapsedTime(&ms, e0, e1), "event");
    *flops = 2.0 * M * (double)M * M * reps / (ms * 1e-3);
    rc = 0;
fail:
    cuda_blas_free(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

/* A model_t of a preset's shape whose weights carry no data (the backend fills them). */
typedef struct {
    model_t m;
    layer_weights_t *layers;
    float *inv_freq;
} synth_t;

static void wset(weight_t *w, int64_t rows, int64_t cols, int type)
{
    w->type = type;
    w->data = NULL;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = dtype_row_bytes(type, cols);
}

static int synth_model(const char *preset, synth_t *s)
{
    mkmodel_params_t p;
    if (mkmodel_preset(preset, &p) != 0) {
        fprintf(stderr, "bench_cuda: unknown preset '%s' (%s)\n", preset, MKMODEL_PRESETS);
        return -1;
    }
    memset(s, 0, sizeof *s);
    hparams_t *hp = &s->m.hp;
    hp->arch = p.arch;
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", p.arch == ARCH_QWEN2 ? "qwen2" : "llama");
    hp->n_vocab = p.n_vocab;
    hp->dim = p.dim;
    hp->n_layers = p.n_layers;
    hp->n_heads = p.n_heads;
    hp->n_kv_heads = p.n_kv_heads;
    hp->head_dim = p.dim / p.n_heads;
    hp->ffn_dim = p.ffn_dim;
    hp->ctx_len = p.ctx_len;
    hp->norm_eps = p.norm_eps;
    hp->rope_kind = p.arch == ARCH_QWEN2 ? ROPE_NEOX : ROPE_NORM;
    hp->rope_theta = p.rope_theta;
    hp->rope_dim = hp->head_dim;
    hp->rope_freq_scale = 1.0f;
    s->layers = calloc((size_t)hp->n_layers, sizeof *s->layers);
    s->inv_freq = malloc(sizeof(float) * (size_t)(hp->rope_dim / 2));
    if (!s->layers || !s->inv_freq) return -1;
    for (int i = 0; i < hp->rope_dim / 2; i++)
        s->inv_freq[i] = (float)pow((double)p.rope_theta, -2.0 * i / hp->rope_dim);
    const int bf = DT_BF16, hd = hp->head_dim, dim = hp->dim, ffn = hp->ffn_dim;
    wset(&s->m.tok_embd, hp->n_vocab, dim, bf);
    wset(&s->m.output, hp->n_vocab, dim, bf);
    wset(&s->m.output_norm, 1, dim, DT_F32);
    s->m.tied_output = p.tied;
    for (int l = 0; l < hp->n_layers; l++) {
        layer_weights_t *L = &s->layers[l];
        wset(&L->attn_norm, 1, dim, DT_F32);
        wset(&L->ffn_norm, 1, dim, DT_F32);
        wset(&L->wq, (int64_t)hp->n_heads * hd, dim, bf);
        wset(&L->wk, (int64_t)hp->n_kv_heads * hd, dim, bf);
        wset(&L->wv, (int64_t)hp->n_kv_heads * hd, dim, bf);
        wset(&L->wo, dim, (int64_t)hp->n_heads * hd, bf);
        wset(&L->w_gate, ffn, dim, bf);
        wset(&L->w_up, ffn, dim, bf);
        wset(&L->w_down, dim, ffn, bf);
    }
    s->m.layers = s->layers;
    s->m.rope_inv_freq = s->inv_freq;
    s->m.weight_type = bf;
    return 0;
}

/* Matrix parameters touched per token: all layer matrices and the output projection. */
static double matrix_params(const hparams_t *hp)
{
    double hd = hp->head_dim, dim = hp->dim;
    double per = (hp->n_heads + 2.0 * hp->n_kv_heads) * hd * dim + dim * hp->n_heads * hd +
                 3.0 * hp->ffn_dim * dim;
    return per * hp->n_layers + (double)hp->n_vocab * dim;
}

/* Batch of n_seqs sequences, each with len tokens from position start[s]; tables fixed. */
typedef struct {
    int32_t *tokens, *pos, *seq_start, *logits_idx, *ids;
    int32_t **tables;
    int32_t *blocks;
} bufs_t;

static int step(backend_t *be, bufs_t *u, int n_seqs, const int *start, int len, int with_ids,
                char *err, size_t errlen)
{
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        u->seq_start[s] = t;
        for (int i = 0; i < len; i++, t++) {
            u->tokens[t] = (int32_t)((s * 7919 + start[s] + i) % 1000 + 1);
            u->pos[t] = start[s] + i;
        }
        u->logits_idx[s] = t - 1;
    }
    u->seq_start[n_seqs] = t;
    backend_batch_t b = {
        .n_tokens = t, .tokens = u->tokens, .pos = u->pos, .n_seqs = n_seqs,
        .seq_start = u->seq_start, .block_tables = (const int32_t *const *)u->tables,
        .n_logits = with_ids ? n_seqs : 0, .logits_idx = u->logits_idx,
    };
    if (with_ids) return be->ops->forward_argmax(be, &b, u->ids, err, errlen);
    return be->ops->forward(be, &b, NULL, err, errlen);
}

static const char *mark(double v, double goal)
{
    return v >= goal ? "met" : "missed";
}

static int bench_model(const char *preset, int wtype, double bw, double flops, int steps)
{
    const int fp8 = wtype == BACKEND_WTYPE_FP8;
    synth_t s;
    backend_t *be = NULL;
    bufs_t u = {0};
    char err[512];
    int rc = -1;
    if (synth_model(preset, &s)) goto done;
    const hparams_t *hp = &s.m.hp;
    const int max_seqs = TP_SEQS;
    const int per_seq = (TP_IN + TP_OUT + PREFILL_LEN + BLOCK_TOKENS - 1) / BLOCK_TOKENS + 1;
    backend_params_t bp = {
        .threads = 1, .block_tokens = BLOCK_TOKENS, .n_kv_blocks = max_seqs * per_seq,
        .kv_type = DT_F16, .max_batch_tokens = MAX_T, .weight_type = wtype,
        .mem_fraction = 0.9f, .synthetic_seed = 42, .max_seqs = max_seqs,
        .max_ctx = per_seq * BLOCK_TOKENS,
    };
    double t0 = bench_now();
    be = backend_cuda_new(&s.m, &bp, err, sizeof err);
    if (!be) {
        fprintf(stderr, "bench_cuda: %s: %s\n", preset, err);
        goto done;
    }
    double t_load = bench_now() - t0;
    u.tokens = malloc(MAX_T * 4);
    u.pos = malloc(MAX_T * 4);
    u.seq_start = malloc((MAX_T + 1) * 4);
    u.logits_idx = malloc(MAX_T * 4);
    u.ids = malloc(MAX_T * 4);
    u.tables = malloc(sizeof *u.tables * max_seqs);
    u.blocks = malloc(sizeof *u.blocks * (size_t)max_seqs * per_seq);
    if (!u.tokens || !u.pos || !u.seq_start || !u.logits_idx || !u.ids || !u.tables || !u.blocks)
        goto done;
    for (int i = 0; i < max_seqs * per_seq; i++) u.blocks[i] = i;
    for (int i = 0; i < max_seqs; i++) u.tables[i] = u.blocks + (size_t)i * per_seq;

    /* the matrices read once per step: BF16, or (fp8) E4M3 layer matrices and a BF16 output */
    const double params = matrix_params(hp);
    const double out_params = (double)hp->n_vocab * hp->dim;
    const double wbytes = fp8 ? (params - out_params) + out_params * 2.0 : params * 2.0;
    printf("\n### %s (%s, synthetic weights; %d layers, dim %d, ffn %d, vocab %d; load %.1f s)\n\n",
           preset, fp8 ? "FP8 E4M3 layer matrices, BF16 output" : "BF16", hp->n_layers, hp->dim,
           hp->ffn_dim, hp->n_vocab, t_load);
    printf("| figure | tokens/s | ceiling tokens/s | fraction | goal |\n|---|---|---|---|---|\n");

    int start[TP_SEQS];
    const int batches[4] = {1, 8, 64, 256};
    for (int bi = 0; bi < 4; bi++) {
        int B = batches[bi];
        /* the context: one prefill step per sequence group */
        for (int s0 = 0; s0 < B; s0 += MAX_T / CTX0) {
            int n = B - s0 < MAX_T / CTX0 ? B - s0 : MAX_T / CTX0;
            int st[MAX_T / CTX0] = {0};
            int32_t **save = u.tables;
            u.tables += s0;
            int e = step(be, &u, n, st, CTX0, 0, err, sizeof err);
            u.tables = save;
            if (e) goto fwd_fail;
        }
        for (int i = 0; i < B; i++) start[i] = CTX0;
        for (int w = 0; w < 2; w++) { /* warm-up steps, not timed */
            if (step(be, &u, B, start, 1, 1, err, sizeof err)) goto fwd_fail;
            for (int i = 0; i < B; i++) start[i]++;
        }
        double ts = bench_now();
        for (int k = 0; k < steps; k++) {
            if (step(be, &u, B, start, 1, 1, err, sizeof err)) goto fwd_fail;
            for (int i = 0; i < B; i++) start[i]++;
        }
        double tps = (double)B * steps / (bench_now() - ts);
        double step_s = fmax(wbytes / bw, 2.0 * params * B / flops);
        double ceil_tps = B / step_s;
        char goal[64] = "";
        if (B == 1)
            snprintf(goal, sizeof goal, ">= %.0f%% of copy bandwidth: %s", GOAL_DECODE1 * 100,
                     mark(tps / ceil_tps, GOAL_DECODE1));
        printf("| decode@%d | %.0f | %.0f | %.2f | %s |\n", B, tps, ceil_tps, tps / ceil_tps, goal);
    }
    {
        int st[PREFILL_SEQS] = {0};
        if (step(be, &u, PREFILL_SEQS, st, PREFILL_LEN, 1, err, sizeof err)) goto fwd_fail;
        const int reps = 3;
        double ts = bench_now();
        for (int r = 0; r < reps; r++)
            if (step(be, &u, PREFILL_SEQS, st, PREFILL_LEN, 1, err, sizeof err)) goto fwd_fail;
        double tps = (double)PREFILL_SEQS * PREFILL_LEN * reps / (bench_now() - ts);
        double ceil_tps = flops / (2.0 * params);
        printf("| prefill %dx%d | %.0f | %.0f | %.2f | >= %.0f%% of GEMM rate: %s |\n",
               PREFILL_SEQS, PREFILL_LEN, tps, ceil_tps, tps / ceil_tps, GOAL_PREFILL * 100,
               mark(tps / ceil_tps, GOAL_PREFILL));
    }
    {
        double ts = bench_now();
        const int per_step = MAX_T / TP_IN;
        for (int s0 = 0; s0 < TP_SEQS; s0 += per_step) {
            int st[MAX_T / TP_IN] = {0};
            int32_t **save = u.tables;
            u.tables += s0;
            int e = step(be, &u, per_step, st, TP_IN, 1, err, sizeof err);
            u.tables = save;
            if (e) goto fwd_fail;
        }
        for (int i = 0; i < TP_SEQS; i++) start[i] = TP_IN;
        for (int k = 1; k < TP_OUT; k++) {
            if (step(be, &u, TP_SEQS, start, 1, 1, err, sizeof err)) goto fwd_fail;
            for (int i = 0; i < TP_SEQS; i++) start[i]++;
        }
        double tps = (double)TP_SEQS * TP_OUT / (bench_now() - ts);
        char goal[64] = "";
        if (strcmp(preset, "llama-3.1-8b") == 0)
            snprintf(goal, sizeof goal, ">= %.0f tok/s: %s", GOAL_TP_8B, mark(tps, GOAL_TP_8B));
        printf("| %d x %d-in/%d-out, generated | %.0f | | | %s |\n", TP_SEQS, TP_IN, TP_OUT, tps,
               goal);
    }
    rc = 0;
    goto done;
fwd_fail:
    fprintf(stderr, "bench_cuda: %s: %s\n", preset, err);
done:
    backend_free(be);
    free(u.tokens);
    free(u.pos);
    free(u.seq_start);
    free(u.logits_idx);
    free(u.ids);
    free(u.tables);
    free(u.blocks);
    free(s.layers);
    free(s.inv_freq);
    return rc;
}

/* Device sampling time per step (see the header). 0 or -1. */
static int bench_sampling(void)
{
    enum { V = 128256, BMAX = 256, REPS = 20, NP = 4 };
    const int Bs[3] = {1, 64, 256};
    const char *names[NP] = {"greedy", "T 0.8, top-p 0.95", "top-k 50, top-p 0.9, min-p 0.05",
                             "T 1, penalties, 5 logprobs"};
    sampler_params_t ps[NP];
    for (int i = 0; i < NP; i++) sampler_params_default(&ps[i]);
    ps[0].temperature = 0.0f;
    ps[1].temperature = 0.8f, ps[1].top_p = 0.95f;
    ps[2].top_k = 50, ps[2].top_p = 0.9f, ps[2].min_p = 0.05f;
    ps[3].repeat_penalty = 1.1f, ps[3].presence_penalty = 0.5f, ps[3].n_logprobs = 5;
    float *dl = NULL;
    int32_t *dcounts = NULL, *dids = NULL, *hseen = NULL;
    cuk_sample_row_t *hrows = NULL, *drows = NULL;
    uint32_t *dout = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -1;
    float ms = 0;
    CK(cudaEventCreate(&e0), "event");
    CK(cudaEventCreate(&e1), "event");
    CK(cudaMalloc((void **)&dl, (size_t)BMAX * V * 4), "logits");
    CK(cudaMalloc((void **)&dcounts, (size_t)BMAX * V * 4), "counts");
    CK(cudaMalloc((void **)&dids, BMAX * 4), "ids");
    CK(cudaMalloc((void **)&drows, BMAX * sizeof *drows), "rows");
    CK(cudaMalloc((void **)&dout, cuk_sample_out_words(BMAX, CUK_SAMPLE_MAX_LOGPROBS) * 4), "out");
    CK(cudaMallocHost((void **)&hrows, BMAX * sizeof *hrows), "rows");
    /* logits ~ uniform(-8, 8): flat, the slow case of top-p; every 64th id seen once */
    CK(cuk_fill_random(DT_F32, dl, (size_t)BMAX * V, 7, -8.0f, 8.0f, 0), "fill");
    hseen = calloc(V, sizeof *hseen);
    if (!hseen) goto fail;
    for (int i = 0; i < V; i += 64) hseen[i] = 1;
    for (int r = 0; r < BMAX; r++)
        CK(cudaMemcpy(dcounts + (size_t)r * V, hseen, (size_t)V * 4, cudaMemcpyHostToDevice), "counts");
    printf("\n| sampling, rows x 128256 | us per step | argmax us | logits over PCIe at 25 GB/s, us |\n"
           "|---|---|---|---|\n");
    for (int bi = 0; bi < 3; bi++) {
        const int B = Bs[bi];
        CK(cudaEventRecord(e0, 0), "event");
        for (int r = 0; r < REPS; r++) CK(cuk_argmax(dl, B, V, dids, 0), "argmax");
        CK(cudaEventRecord(e1, 0), "event");
        CK(cudaEventSynchronize(e1), "argmax");
        CK(cudaEventElapsedTime(&ms, e0, e1), "event");
        const double argmax_us = ms * 1e3 / REPS;
        for (int pi = 0; pi < NP; pi++) {
            const int pen = ps[pi].repeat_penalty != 1.0f;
            for (int r = 0; r < B; r++)
                cuda_sample_row_fill(&hrows[r], &ps[pi], 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1),
                                     pen ? r : -1, -1);
            CK(cudaMemcpy(drows, hrows, (size_t)B * sizeof *hrows, cudaMemcpyHostToDevice), "rows");
            const int L = ps[pi].n_logprobs;
            CK(cuk_sample(dl, B, V, drows, dcounts, L, dout, 0), "sample"); /* warm-up */
            CK(cudaEventRecord(e0, 0), "event");
            for (int r = 0; r < REPS; r++) CK(cuk_sample(dl, B, V, drows, dcounts, L, dout, 0), "sample");
            CK(cudaEventRecord(e1, 0), "event");
            CK(cudaEventSynchronize(e1), "sample");
            CK(cudaEventElapsedTime(&ms, e0, e1), "event");
            printf("| %d x %s | %.0f | %.0f | %.0f |\n", B, names[pi], ms * 1e3 / REPS, argmax_us,
                   (double)B * V * 4 / 25e9 * 1e6);
        }
    }
    rc = 0;
fail:
    cudaFree(dl);
    cudaFree(dcounts);
    cudaFree(dids);
    cudaFree(drows);
    cudaFree(dout);
    if (hrows) cudaFreeHost(hrows);
    free(hseen);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

/* Decode attention alone, as the backend launches it, on the Llama-3.1-8B shape (32 query heads,
 * 8 kv heads, head dim 128, F16 KV in blocks of 16, one layer): B sequences each decoding one
 * token at context ctx. Both kernels: chunks of 128 keys scattered over up to 32 blocks a token
 * when the partials fit ATT_BENCH_SLOTS a token, else folded (cuk_attention: F32 weights or KV;
 * cuk_attention_tc: BF16 / FP8). KV bytes read per call = B x ctx x 2
 * x 8 x 128 x 2; the table gives microseconds per call of each kernel and the tensor-core
 * kernel's bytes per second as a fraction of the copy bandwidth (read + write) measured above.
 * Shapes whose pool would pass ATT_BENCH_MAX_POOL are left out ("-"). */
#define ATT_BENCH_SLOTS 256
#define ATT_BENCH_MAX_POOL ((size_t)24 << 30)

/* Microseconds per call of cuk_attention_tc (tc) or cuk_attention on stream 0, over reps calls
 * after one warm-up, into *us. 0, or -1 with the error printed. */
static int time_attention(const cuk_attn_args_t *a, int tc, int reps, cudaEvent_t e0,
                          cudaEvent_t e1, double *us)
{
    float ms = 0;
    int rc = -1;
    const char *what = tc ? "tc attention" : "attention";
    CK(tc ? cuk_attention_tc(a, 0) : cuk_attention(a, 0), what); /* warm-up */
    CK(cudaEventRecord(e0, 0), "event");
    for (int r = 0; r < reps; r++) CK(tc ? cuk_attention_tc(a, 0) : cuk_attention(a, 0), what);
    CK(cudaEventRecord(e1, 0), "event");
    CK(cudaEventSynchronize(e1), what);
    CK(cudaEventElapsedTime(&ms, e0, e1), "event");
    *us = ms * 1e3 / reps;
    rc = 0;
fail:
    return rc;
}

static int bench_attention(double bw)
{
    enum { NH = 32, NKV = 8, HD = 128, BT = 16, REPS = 10, NB = 5, NC = 7 };
    const int Bs[NB] = {1, 8, 64, 128, 256};
    const int ctxs[NC] = {512, 1024, 2048, 4096, 8192, 16384, 32768};
    const size_t be = (size_t)2 * BT * NKV * HD; /* elements of one (one-layer) block */
    cudaEvent_t e0 = NULL, e1 = NULL;
    void *dkv = NULL, *dout = NULL;
    float *dq = NULL, *dpart = NULL;
    int32_t *dmeta = NULL, *hmeta = NULL, *dtiles = NULL, *htiles = NULL;
    int rc = -1;
    CK(cudaEventCreate(&e0), "event");
    CK(cudaEventCreate(&e1), "event");
    CK(cudaMalloc((void **)&dq, (size_t)256 * NH * HD * 4), "q");
    CK(cudaMalloc(&dout, (size_t)256 * NH * HD * 2), "out");
    htiles = malloc(sizeof(int32_t) * (256 + 3));
    if (!htiles) goto fail;
    CK(cudaMalloc((void **)&dtiles, sizeof(int32_t) * (256 + 3)), "tiles");
    CK(cudaMalloc((void **)&dpart, (size_t)256 * NH * ATT_BENCH_SLOTS * (HD + 2) * 4),
       "partials");
    CK(cuk_fill_random(DT_F32, dq, (size_t)256 * NH * HD, 11, -1.0f, 1.0f, 0), "fill");
    printf("\n| decode attention, 8B shape, us per call: CUDA cores / tensor cores (tensor cores' KV "
           "GB/s, fraction of copy bandwidth) |");
    for (int ci = 0; ci < NC; ci++) printf(" ctx %d |", ctxs[ci]);
    printf("\n|---|");
    for (int ci = 0; ci < NC; ci++) printf("---|");
    printf("\n");
    for (int bi = 0; bi < NB; bi++) {
        const int B = Bs[bi];
        printf("| batch %d |", B);
        for (int ci = 0; ci < NC; ci++) {
            const int ctx = ctxs[ci], nb = (ctx + BT - 1) / BT;
            const size_t pool = (size_t)B * nb * be * 2;
            if (pool > ATT_BENCH_MAX_POOL) {
                printf(" - |");
                continue;
            }
            CK(cudaMalloc(&dkv, pool), "kv pool");
            CK(cuk_fill_random(DT_F16, dkv, pool / 2, 13, -1.0f, 1.0f, 0), "fill");
            const size_t nmeta = 3 * (size_t)B + (size_t)B * nb;
            hmeta = malloc(nmeta * 4);
            if (!hmeta) goto fail;
            for (int b = 0; b < B; b++) {
                hmeta[b] = ctx - 1;
                hmeta[B + b] = b;
                hmeta[2 * B + b] = b * nb;
            }
            for (size_t i = 0; i < (size_t)B * nb; i++) hmeta[3 * (size_t)B + i] = (int32_t)i;
            CK(cudaMalloc((void **)&dmeta, nmeta * 4), "meta");
            CK(cudaMemcpy(dmeta, hmeta, nmeta * 4, cudaMemcpyHostToDevice), "meta");
            const int gs = (ctx + 127) / 128 < 32 ? (ctx + 127) / 128 : 32;
            cuk_attn_args_t aa = {
                .T = B, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .qkv = dq,
                .ld = NH * HD,
                .kv = {.pos = dmeta, .tok_seq = dmeta + B, .bt_off = dmeta + 2 * B,
                       .bt = dmeta + 3 * B, .kv = dkv, .kv_type = DT_F16, .block_elems = be,
                       .block_tokens = BT, .layer = 0},
                .scale = 1.0f / sqrtf((float)HD), .n_splits = ATT_BENCH_SLOTS, .chunk = 128,
                .grid_splits = gs, .part = dpart, .out_type = DT_BF16, .out = dout,
            };
            double us_simt = 0, us = 0;
            if (time_attention(&aa, 0, REPS, e0, e1, &us_simt)) goto fail;
            /* tensor cores: every token its own sequence, so its own tile */
            const int fold = (ctx + 127) / 128 > ATT_BENCH_SLOTS;
            cuk_attention_tc_tiles(hmeta + B, B, 1, fold, htiles);
            CK(cudaMemcpy(dtiles, htiles, sizeof(int32_t) * (size_t)(B + 3),
                          cudaMemcpyHostToDevice), "tiles");
            aa.tiles = dtiles;
            aa.grid_splits = fold ? 1 : gs;
            if (time_attention(&aa, 1, REPS, e0, e1, &us)) goto fail;
            const double gbs = (double)pool / (us * 1e-6) / 1e9;
            printf(" %.0f / %.0f (%.0f, %.2f) |", us_simt, us, gbs, gbs * 1e9 / bw);
            fflush(stdout);
            cudaFree(dkv);
            cudaFree(dmeta);
            free(hmeta);
            dkv = NULL;
            dmeta = NULL;
            hmeta = NULL;
        }
        printf("\n");
    }
    rc = 0;
fail:
    cudaFree(dkv);
    cudaFree(dmeta);
    free(hmeta);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dpart);
    cudaFree(dtiles);
    free(htiles);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

int main(int argc, char **argv)
{
    const char *models = "llama-3.2-1b,llama-3.1-8b", *dtypes = "bf16,fp8";
    int steps = 32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--models") && i + 1 < argc) models = argv[++i];
        else if (!strcmp(argv[i], "--dtypes") && i + 1 < argc) dtypes = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cuda [--models a,b] [--dtypes bf16,fp8] [--steps N]\n");
            return 2;
        }
    }
    if (steps < 1) steps = 1;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 1;
    double bw = 0, flops = 0;
    if (ceilings(&bw, &flops)) return 1;
    printf("## bench_cuda on %s (%.0f GiB)\n\n", prop.name, (double)prop.totalGlobalMem / (1 << 30));
    printf("| ceiling | measured |\n|---|---|\n");
    printf("| device copy bandwidth (read + write) | %.0f GB/s |\n", bw / 1e9);
    printf("| cuBLAS BF16 GEMM 8192^3, F32 accumulate | %.0f TFLOP/s |\n", flops / 1e12);
    char list[256];
    snprintf(list, sizeof list, "%s", models);
    int rc = 0;
    /* every model in BF16 first, then in FP8 (a device below 8.9 refuses FP8, saying why) */
    char dl[64];
    snprintf(dl, sizeof dl, "%s", dtypes);
    for (char *sd = NULL, *d = strtok_r(dl, ",", &sd); d; d = strtok_r(NULL, ",", &sd)) {
        const int wt = !strcmp(d, "fp8") ? BACKEND_WTYPE_FP8 : !strcmp(d, "bf16") ? DT_BF16 : -1;
        if (wt < 0) {
            fprintf(stderr, "bench_cuda: --dtypes: %s is not bf16 or fp8\n", d);
            return 2;
        }
        snprintf(list, sizeof list, "%s", models);
        for (char *save = NULL, *m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save))
            if (bench_model(m, wt, bw, flops, steps)) rc = 1;
    }
    if (bench_sampling()) rc = 1;
    if (bench_attention(bw)) rc = 1;
    return rc;
}
#endif
