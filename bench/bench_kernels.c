/* bench/bench_kernels.c: CPU kernel benchmark (a program, not a test).
 *
 * Prints a markdown table: memory read bandwidth (1 and 2 threads), OpenBLAS sgemm, our matmul
 * per weight type and token count on SmolLM2-135M shapes (rows split over the thread pool),
 * the weight-streaming rate at T = 1, the matmul-only token rate of a whole SmolLM2-135M-shaped
 * model, and tpool_run latency. Usage: bench_kernels [threads (default 2)] [seconds per cell].
 * Weights are cycled through a set larger than the last-level cache so T = 1 measures
 * streaming from memory as in decode. Every figure is the best of several timed repeats. */
#include <cblas.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cpu/kernels.h"
#include "engine/cpu/threadpool.h"
#include "engine/dtype.h"

#define STREAM_BYTES (256u << 20) /* weight set cycled at T = 1: well above any L3 */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 40) / (double)(1ull << 23) - 1.0);
}

/* ---- memory bandwidth: each thread sums its share of a buffer ---- */

typedef struct {
    const uint64_t *buf;
    size_t n;
    atomic_ullong sink;
} bw_job_t;

static void bw_fn(void *arg, int ith, int nth)
{
    bw_job_t *j = arg;
    long lo, hi;
    tpool_split((long)(j->n / 64), ith, nth, &lo, &hi);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (long b = lo; b < hi; b++) { /* one cache line per step, eight independent chains */
        const uint64_t *p = j->buf + b * 64;
        for (int i = 0; i < 64; i += 8) {
            s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3];
            s4 += p[i + 4]; s5 += p[i + 5]; s6 += p[i + 6]; s7 += p[i + 7];
        }
    }
    atomic_fetch_add(&j->sink, s0 ^ s1 ^ s2 ^ s3 ^ s4 ^ s5 ^ s6 ^ s7);
}

static double bench_bw(tpool_t *pool)
{
    size_t bytes = 512u << 20;
    bw_job_t j = {.n = bytes / 8};
    uint64_t *buf = malloc(bytes);
    for (size_t i = 0; i < j.n; i++) buf[i] = i;
    j.buf = buf;
    atomic_init(&j.sink, 0);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        tpool_run(pool, bw_fn, &j);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    free(buf);
    return (double)bytes / best / 1e9;
}

/* ---- our matmul over the pool ---- */

typedef struct {
    const kern_table_t *kt;
    int wtype;
    const char *W;
    size_t rb;
    int64_t K, N;
    const float *x;
    float *y;
    int T;
} mm_job_t;

static void mm_fn(void *arg, int ith, int nth)
{
    mm_job_t *j = arg;
    long lo, hi; /* split in units of 16 rows */
    tpool_split((long)((j->N + 15) / 16), ith, nth, &lo, &hi);
    int64_t o0 = lo * 16, o1 = hi * 16 < j->N ? hi * 16 : j->N;
    if (o0 < o1) j->kt->matmul(j->wtype, j->W, j->rb, j->K, j->x, j->K, j->y, j->N, j->T, o0, o1);
}

/* Best seconds per call over a cycled set of weight copies. */
static double time_matmul(tpool_t *pool, const kern_table_t *kt, int wtype, int64_t N, int64_t K,
                          int T, double budget)
{
    size_t rb = dtype_row_bytes(wtype, K), wbytes = rb * (size_t)N;
    int copies = T <= 16 ? (int)(STREAM_BYTES / wbytes) + 1 : 2;
    char *W = malloc(wbytes * (size_t)copies);
    for (size_t i = 0; i < wbytes * (size_t)copies; i++) W[i] = (char)(rng >> 32), rng = rng * 6364136223846793005ull + 1;
    if (wtype == DT_F16 || wtype == DT_BF16) /* finite values */
        for (size_t i = 0; i < wbytes * (size_t)copies / 2; i++) ((uint16_t *)W)[i] &= 0x3bff;
    if (wtype == DT_F32)
        for (size_t i = 0; i < wbytes * (size_t)copies / 4; i++) ((float *)W)[i] = frand();
    if (wtype == DT_Q8_0)
        for (size_t i = 0; i < (size_t)N * (size_t)copies * (size_t)(K / 32); i++) ((block_q8_0 *)W)[i].d = 0x2000;
    float *x = malloc(sizeof(float) * (size_t)(K * T)), *y = malloc(sizeof(float) * (size_t)(N * T));
    for (int64_t i = 0; i < K * T; i++) x[i] = frand();
    mm_job_t j = {kt, wtype, W, rb, K, N, x, y, T};
    double best = 1e30;
    int c = 0;
    for (int rep = 0; rep < 5; rep++) {
        int calls = 0;
        double t0 = now_s(), t;
        do {
            j.W = W + wbytes * (size_t)(c++ % copies);
            tpool_run(pool, mm_fn, &j);
            calls++;
            t = now_s() - t0;
        } while (t < budget / 5);
        if (t / calls < best) best = t / calls;
    }
    free(W);
    free(x);
    free(y);
    return best;
}

static double time_sgemm(int64_t M, int64_t N, int64_t K, double budget)
{
    float *a = malloc(sizeof(float) * (size_t)(M * K)), *b = malloc(sizeof(float) * (size_t)(N * K));
    float *c = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) a[i] = frand();
    for (int64_t i = 0; i < N * K; i++) b[i] = frand();
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        int calls = 0;
        double t0 = now_s(), t;
        do {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, a,
                        (int)K, b, (int)K, 0.0f, c, (int)N);
            calls++;
            t = now_s() - t0;
        } while (t < budget / 5);
        if (t / calls < best) best = t / calls;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* ---- a whole SmolLM2-135M-shaped model, matmuls only ---- */

typedef struct {
    int64_t N, K;
    int per_layer;
} mshape_t;

static const mshape_t MODEL[] = {
    {576, 576, 1},   /* wq */
    {192, 576, 2},   /* wk, wv */
    {576, 576, 1},   /* wo */
    {1536, 576, 2},  /* gate, up */
    {576, 1536, 1},  /* down */
};
#define MODEL_LAYERS 30
#define MODEL_VOCAB 49152

static double model_tok_s(tpool_t *pool, const kern_table_t *kt, int wtype, int T)
{
    /* all weights of the model, distinct buffers, so decode streams them from memory */
    size_t total = 0;
    for (size_t s = 0; s < sizeof MODEL / sizeof MODEL[0]; s++)
        total += (size_t)MODEL[s].per_layer * MODEL_LAYERS * dtype_row_bytes(wtype, MODEL[s].K) *
                 (size_t)MODEL[s].N;
    total += dtype_row_bytes(wtype, 576) * MODEL_VOCAB;
    char *W = calloc(1, total);
    float *x = malloc(sizeof(float) * 1536 * (size_t)T);
    float *y = malloc(sizeof(float) * MODEL_VOCAB * (size_t)T);
    for (int64_t i = 0; i < 1536 * (int64_t)T; i++) x[i] = frand();
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        size_t off = 0;
        for (int l = 0; l < MODEL_LAYERS; l++)
            for (size_t s = 0; s < sizeof MODEL / sizeof MODEL[0]; s++)
                for (int r = 0; r < MODEL[s].per_layer; r++) {
                    size_t rb = dtype_row_bytes(wtype, MODEL[s].K);
                    mm_job_t j = {kt, wtype, W + off, rb, MODEL[s].K, MODEL[s].N, x, y, T};
                    tpool_run(pool, mm_fn, &j);
                    off += rb * (size_t)MODEL[s].N;
                }
        /* logits: only the last token of a prefill, every token otherwise */
        int tl = T > 16 ? 1 : T;
        mm_job_t j = {kt, wtype, W + off, dtype_row_bytes(wtype, 576), 576, MODEL_VOCAB, x, y, tl};
        tpool_run(pool, mm_fn, &j);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    free(W);
    free(x);
    free(y);
    return T / best;
}

static void noop_fn(void *arg, int ith, int nth)
{
    (void)arg;
    (void)ith;
    (void)nth;
}

/* Busy for *(double *)arg seconds. */
static void busy_fn(void *arg, int ith, int nth)
{
    (void)ith;
    (void)nth;
    double t0 = now_s(), d = *(const double *)arg;
    while (now_s() - t0 < d) {
    }
}

/* Best average seconds per tpool_run over batches of calls. */
static double time_tpool(tpool_t *pool, tpool_fn fn, void *arg)
{
    double best = 1e30;
    for (int rep = 0; rep < 20; rep++) {
        int n = 2000;
        double t0 = now_s();
        for (int i = 0; i < n; i++) tpool_run(pool, fn, arg);
        double t = (now_s() - t0) / n;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    double budget = argc > 2 ? atof(argv[2]) : 0.5;
    char err[128];
    tpool_t *pool = tpool_new(nth, err, sizeof err), *pool1 = tpool_new(1, err, sizeof err);
    if (!pool || !pool1) {
        fprintf(stderr, "bench_kernels: %s\n", err);
        return 1;
    }
    const kern_table_t *kt = kern_get(NULL);
    openblas_set_num_threads(nth);

    double bw1 = bench_bw(pool1), bw = bench_bw(pool);
    printf("# bench_kernels: %s kernels, %d threads\n\n", kt->name, nth);
    printf("| measure | value |\n|---|---|\n");
    printf("| memory read bandwidth, 1 thread | %.1f GB/s |\n", bw1);
    printf("| memory read bandwidth, %d threads | %.1f GB/s |\n", nth, bw);

    /* tpool_run round trip: empty parts (the caller may run them all), and parts of 5 us */
    {
        double d = 5e-6;
        tpool_run(pool, noop_fn, NULL);
        printf("| tpool_run, empty parts | %.2f us |\n", time_tpool(pool, noop_fn, NULL) * 1e6);
        printf("| tpool_run, %d parts of 5 us each (overhead above 5 us) | %.2f us |\n", nth,
               (time_tpool(pool, busy_fn, &d) - d) * 1e6);
    }

    static const int64_t SH[][2] = {{576, 576}, {1536, 576}, {576, 1536}};
    printf("\n| OpenBLAS sgemm (M=T, N, K) | GFLOP/s |\n|---|---|\n");
    double blas[3];
    for (int s = 0; s < 3; s++) {
        double t = time_sgemm(512, SH[s][0], SH[s][1], budget);
        blas[s] = 2.0 * 512 * (double)SH[s][0] * (double)SH[s][1] / t / 1e9;
        printf("| M=512 N=%lld K=%lld | %.1f |\n", (long long)SH[s][0], (long long)SH[s][1], blas[s]);
    }

    static const int TS[] = {1, 4, 16, 64, 512};
    static const int WT[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0};
    printf("\n| wtype | N x K | T=1 GFLOP/s | T=1 W GB/s (%% of bw) | T=4 | T=16 | T=64 | T=512 | "
           "T=512 vs sgemm |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int wi = 0; wi < 4; wi++)
        for (int s = 0; s < 3; s++) {
            int64_t N = SH[s][0], K = SH[s][1];
            printf("| %s | %lldx%lld ", dtype_name(WT[wi]), (long long)N, (long long)K);
            double g512 = 0;
            for (int ti = 0; ti < 5; ti++) {
                int T = TS[ti];
                double t = time_matmul(pool, kt, WT[wi], N, K, T, budget);
                double gf = 2.0 * T * (double)N * (double)K / t / 1e9;
                printf("| %.1f ", gf);
                if (T == 1) {
                    double gbs = (double)(dtype_row_bytes(WT[wi], K) * (size_t)N) / t / 1e9;
                    printf("| %.1f (%.0f%%) ", gbs, 100.0 * gbs / bw);
                }
                if (T == 512) g512 = gf;
            }
            printf("| %.0f%% |\n", 100.0 * g512 / blas[s]);
        }

    printf("\n| SmolLM2-135M shapes, matmuls only (30 layers + tied head) | T=1 tok/s | T=16 tok/s | "
           "T=512 tok/s |\n|---|---|---|---|\n");
    for (int wi = 0; wi < 4; wi++) {
        printf("| %s ", dtype_name(WT[wi]));
        static const int MT[] = {1, 16, 512};
        for (int i = 0; i < 3; i++) printf("| %.0f ", model_tok_s(pool, kt, WT[wi], MT[i]));
        printf("|\n");
    }
    tpool_free(pool);
    tpool_free(pool1);
    return 0;
}
