/* bench/bench_kernels.c: CPU kernel benchmark (a program, not a test).
 *
 * Prints a markdown table: memory read bandwidth (1 and n threads), copy bandwidth, tpool_run overhead,
 * OpenBLAS sgemm, our matmul per weight type and token count on SmolLM2-135M shapes (rows split
 * over the thread pool in 16-row units), the weight-streaming rate at T = 1 against the measured
 * bandwidth, and the matmul-only token rate of a whole SmolLM2-135M-shaped model (30 layers +
 * tied 49152-row head).
 *
 * Usage: bench_kernels [threads (2)] [rounds (3)] [seconds per cell per round (0.2)] [--ceilings]
 *                      [--json FILE] [--types LIST]
 *   --ceilings   measure only the machine's ceilings: read and copy bandwidth, OpenBLAS sgemm and
 *                our matmul at T = 512 (no tpool, small-T or whole-model cells)
 *   --kquant     measure only the K-quant table (below)
 *   --types LIST only these weight types' matmul cells (comma-separated dtype names, e.g.
 *                q4_1,iq4_xs); the 256-block types (q4_K, iq4_xs) run K rounded up to 256s
 *                (576 -> 768), as a model padded by `mkmodel --pad 256`
 *   --json FILE  also write the ceilings as one JSON object to FILE (read by bench/run.py):
 *                read_bw_gbs_1t, read_bw_gbs, copy_bw_gbs (GB/s, 1e9 bytes), sgemm_gflops and
 *                matmul_t512_gflops (per shape "NxK", M = T = 512), sgemm_best_gflops,
 *                matmul_best_gflops with matmul_best_type / matmul_best_shape
 *
 * Weights come from one pool per type, larger than any last-level cache and filled with random
 * finite values, cycled so that small-T cells stream from memory as decode does. The whole table
 * is measured `rounds` times and each cell keeps its best round: the machine is shared, and the
 * best round is the one least disturbed by other processes.
 *
 * K-quant table (kquant_table): the K-quant types (int8 activations, K a multiple of 256) on
 * Llama-style shapes of TinyLlama-1.1B (2048 x 2048, 5632 x 2048, 2048 x 5632), for every
 * x86 table kern_get offers: GOP/s (2 N K T / s) per T and, at T = 1, the weight stream in GB/s
 * and as a share of the measured read bandwidth. Weights cycle through a pool of 256 MB per type
 * (random bytes, every scale finite). Then the same kernels on one thread timed in the thread's
 * CPU time (CLOCK_THREAD_CPUTIME_ID: what the kernel does while it runs, so that a machine
 * shared with other processes still gives comparable figures): 256 x 2048 weights kept in L2 at
 * T = 1, 16, 64, and 2048 x 2048 streamed from the pool at T = 1. */
#include <cblas.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "engine/cpu/kernels.h"
#include "engine/cpu/threadpool.h"
#include "engine/dtype.h"
#include "bench/membw.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the calling thread */
static double cpu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t rnext(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void)
{
    return (float)((double)(rnext() >> 40) / (double)(1ull << 23) - 1.0);
}

typedef struct {
    const char *src;
    char *dst;
    size_t bytes;
} copy_job_t;

static void copy_fn(void *arg, int ith, int nth)
{
    copy_job_t *j = arg;
    long lo, hi; /* split in 4 KiB units */
    tpool_split((long)(j->bytes / 4096), ith, nth, &lo, &hi);
    memcpy(j->dst + lo * 4096, j->src + lo * 4096, (size_t)(hi - lo) * 4096);
}

/* GB/s copying `bytes` (a multiple of 4096) from src to dst over the pool, best of 3, counted as
 * STREAM's copy does: bytes read + bytes written (2 x bytes) per second. */
static double bench_copy(tpool_t *pool, const void *src, void *dst, size_t bytes)
{
    copy_job_t j = {src, dst, bytes};
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        tpool_run(pool, copy_fn, &j);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    return 2.0 * (double)bytes / best / 1e9;
}

/* ---- weights ---- */

/* F32 and F16 first: their pools also serve the bandwidth measurements. */
static const int WT[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K,
                         DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_IQ4_NL, DT_IQ4_XS};
#define N_WT ((int)(sizeof WT / sizeof WT[0]))

/* K for type t: K rounded up to t's block (576 -> 768 for the 256-blocks: the shapes of a model
 * padded as `mkmodel --pad 256` does). */
static int64_t kfit(int t, int64_t K)
{
    const int64_t b = dtype_block_elems(t);
    return (K + b - 1) / b * b;
}

/* Random finite weights of type t filling `bytes` (a multiple of the row size used). */
static char *make_pool(int t, size_t bytes)
{
    char *w = malloc(bytes + 64);
    if (!w) return NULL;
    switch (t) {
    case DT_F32:
        for (size_t i = 0; i < bytes / 4; i++) ((float *)w)[i] = frand();
        break;
    case DT_F16:
        for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)w)[i] = f32_to_fp16(frand());
        break;
    case DT_BF16:
        for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)w)[i] = f32_to_bf16(frand());
        break;
    case DT_Q8_0:
        for (size_t i = 0; i < bytes / sizeof(block_q8_0); i++) {
            block_q8_0 *b = (block_q8_0 *)w + i;
            uint64_t r = rnext();
            b->d = f32_to_fp16(0.01f);
            for (int k = 0; k < QK8_0; k++) b->qs[k] = (int8_t)(r >> (k % 8 * 8));
        }
        break;
    default: { /* other block types: random bytes, the fp16 scale (and min) at 0 (and 2) finite */
        const size_t bs = dtype_block_bytes(t);
        const int two = t == DT_Q4_K || t == DT_Q4_1 || t == DT_Q5_1;
        for (size_t i = 0; i < bytes / 8; i++) {
            uint64_t r = rnext();
            memcpy(w + 8 * i, &r, 8);
        }
        for (size_t i = 0; i < bytes / bs; i++) {
            uint16_t h[2] = {f32_to_fp16(0.01f), f32_to_fp16(0.001f)};
            memcpy(w + i * bs, h, two ? 4 : 2);
        }
        break;
    }
    }
    return w;
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
    int packed; /* W is kt->pack's copy: kt->matmul_packed */
} mm_job_t;

static void mm_fn(void *arg, int ith, int nth)
{
    mm_job_t *j = arg;
    long lo, hi; /* split in units of 16 rows */
    tpool_split((long)((j->N + 15) / 16), ith, nth, &lo, &hi);
    int64_t o0 = lo * 16, o1 = hi * 16 < j->N ? hi * 16 : j->N;
    if (o0 >= o1) return;
    if (j->packed)
        j->kt->matmul_packed(j->wtype, j->W, j->K, j->x, j->K, j->y, j->N, j->T, o0, o1);
    else
        j->kt->matmul(j->wtype, j->W, j->rb, j->K, j->x, j->K, j->y, j->N, j->T, o0, o1);
}

/* Best seconds per call; the weights cycle through the pool (pool_bytes) unless T is large.
 * packed: wpool holds kt->pack's copy of the pool's rows (N a multiple of KERN_PACK_ROWS, so
 * N rows take the same bytes packed). */
static double time_matmul_p(tpool_t *pool, const kern_table_t *kt, int wtype, const char *wpool,
                            size_t pool_bytes, int64_t N, int64_t K, int T, const float *x,
                            float *y, double budget, int packed)
{
    size_t rb = dtype_row_bytes(wtype, K), wbytes = rb * (size_t)N;
    size_t copies = T <= 16 ? pool_bytes / wbytes : 1;
    mm_job_t j = {kt, wtype, wpool, rb, K, N, x, y, T, packed};
    double best = 1e30;
    size_t c = 0;
    for (int rep = 0; rep < 4; rep++) {
        int calls = 0;
        double t0 = now_s(), t;
        do {
            j.W = wpool + wbytes * (c++ % copies);
            tpool_run(pool, mm_fn, &j);
            calls++;
            t = now_s() - t0;
        } while (t < budget / 4);
        if (t / calls < best) best = t / calls;
    }
    return best;
}

static double time_matmul(tpool_t *pool, const kern_table_t *kt, int wtype, const char *wpool,
                          size_t pool_bytes, int64_t N, int64_t K, int T, const float *x, float *y,
                          double budget)
{
    return time_matmul_p(pool, kt, wtype, wpool, pool_bytes, N, K, T, x, y, budget, 0);
}

static double time_sgemm(int64_t M, int64_t N, int64_t K, const float *a, const float *b, float *c,
                         double budget)
{
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        int calls = 0;
        double t0 = now_s(), t;
        do {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, a,
                        (int)K, b, (int)K, 0.0f, c, (int)N);
            calls++;
            t = now_s() - t0;
        } while (t < budget / 4);
        if (t / calls < best) best = t / calls;
    }
    return best;
}

/* ---- a whole SmolLM2-135M-shaped model, matmuls only ---- */

typedef struct {
    int64_t N, K;
    int per_layer;
} mshape_t;

static const mshape_t MODEL[] = {
    {576, 576, 1},  /* wq */
    {192, 576, 2},  /* wk, wv */
    {576, 576, 1},  /* wo */
    {1536, 576, 2}, /* gate, up */
    {576, 1536, 1}, /* down */
};
#define N_MODEL (sizeof MODEL / sizeof MODEL[0])
#define MODEL_LAYERS 30
#define MODEL_VOCAB 49152

static size_t model_bytes(int t)
{
    size_t total = 0;
    for (size_t s = 0; s < N_MODEL; s++)
        total += (size_t)MODEL[s].per_layer * MODEL_LAYERS *
                 dtype_row_bytes(t, kfit(t, MODEL[s].K)) * (size_t)MODEL[s].N;
    return total + dtype_row_bytes(t, kfit(t, 576)) * MODEL_VOCAB;
}

/* Seconds for one forward's matmuls over T tokens (logits for every token when T <= 16, for the
 * last one otherwise); every matrix at its own place in wpool, as in a real model. */
static double time_model(tpool_t *pool, const kern_table_t *kt, int t, const char *wpool, int T,
                         const float *x, float *y)
{
    double t0 = now_s();
    size_t off = 0;
    for (int l = 0; l < MODEL_LAYERS; l++)
        for (size_t s = 0; s < N_MODEL; s++)
            for (int r = 0; r < MODEL[s].per_layer; r++) {
                size_t rb = dtype_row_bytes(t, kfit(t, MODEL[s].K));
                mm_job_t j = {kt, t, wpool + off, rb, kfit(t, MODEL[s].K), MODEL[s].N, x, y, T, 0};
                tpool_run(pool, mm_fn, &j);
                off += rb * (size_t)MODEL[s].N;
            }
    mm_job_t j = {kt, t, wpool + off, dtype_row_bytes(t, kfit(t, 576)), kfit(t, 576), MODEL_VOCAB,
                  x, y, T > 16 ? 1 : T, 0};
    tpool_run(pool, mm_fn, &j);
    return now_s() - t0;
}

/* ---- thread pool ---- */

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
    for (int rep = 0; rep < 10; rep++) {
        int n = 2000;
        double t0 = now_s();
        for (int i = 0; i < n; i++) tpool_run(pool, fn, arg);
        double t = (now_s() - t0) / n;
        if (t < best) best = t;
    }
    return best;
}

static void keep_min(double *best, double v)
{
    if (v < *best) *best = v;
}
static void keep_max(double *best, double v)
{
    if (v > *best) *best = v;
}

/* ---- K-quants ---- */

static const int KQ_T[] = {DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_Q3_K, DT_Q2_K};
#define N_KQ_T (sizeof KQ_T / sizeof KQ_T[0])
static const int64_t KQ_SH[][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
#define N_KQ_SH 3
static const int KQ_TS[] = {1, 4, 16, 64, 512};
#define N_KQ_TS 5
#define KQ_POOL_BYTES ((size_t)256 << 20)

/* Random super-blocks of type t filling `bytes`: random quant bytes, small finite fp16 scales. */
static char *make_kq_pool(int t, size_t bytes)
{
    char *w = malloc(bytes + 64);
    if (!w) return NULL;
    for (size_t i = 0; i < bytes / 8; i++) {
        uint64_t r = rnext();
        memcpy(w + 8 * i, &r, 8);
    }
    const size_t bs = dtype_block_bytes(t);
    const uint16_t d = f32_to_fp16(0.001f);
    for (size_t o = 0; o + bs <= bytes; o += bs) {
        char *b = w + o;
        if (t == DT_Q6_K) {
            memcpy(b + offsetof(block_q6_K, d), &d, 2);
        } else if (t == DT_Q3_K) {
            memcpy(b + offsetof(block_q3_K, d), &d, 2);
        } else if (t == DT_Q2_K) {
            memcpy(b + offsetof(block_q2_K, d), &d, 2);
            memcpy(b + offsetof(block_q2_K, dmin), &d, 2);
        } else { /* Q4_K, Q5_K (and the other K-quants): d and dmin first */
            memcpy(b, &d, 2);
            memcpy(b + 2, &d, 2);
        }
    }
    return w;
}

/* kt's packed copy (kern_table_t.pack) of as many whole 16-row groups of the pool's rows of
 * width K as it holds; *bytes its size (the same bytes as those rows). NULL when kt packs no
 * such matrix or memory runs out. */
static char *pack_pool(const kern_table_t *kt, int t, const char *wp, int64_t K, size_t *bytes)
{
    if (!kt->pack_bytes) return NULL;
    const size_t rb = dtype_row_bytes(t, K);
    const int64_t rows = (int64_t)(KQ_POOL_BYTES / rb) / KERN_PACK_ROWS * KERN_PACK_ROWS;
    const size_t n = kt->pack_bytes(t, rows, K);
    char *P = n ? aligned_alloc(64, (n + 63) / 64 * 64) : NULL;
    if (!P) return NULL;
    kt->pack(t, wp, rb, rows, K, P);
    *bytes = n;
    return P;
}

static void kquant_table(tpool_t *pool, int nth, int rounds, double budget, double bw)
{
    static const char *const isas[] = {"avx2", "avx512", "avx512-vnni"};
    float *x = malloc(sizeof(float) * 5632 * 512), *y = malloc(sizeof(float) * 5632 * 512);
    if (!x || !y) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < 5632 * 512; i++) x[i] = frand();
    printf("\n| kernels | wtype | N x K | T=1 GOP/s | T=1 W GB/s (%% of bw) | T=4 | T=16 | T=64 | "
           "T=512 |\n|---|---|---|---|---|---|---|---|---|\n");
    for (size_t ti = 0; ti < N_KQ_T; ti++) {
        const int t = KQ_T[ti];
        char *wp = make_kq_pool(t, KQ_POOL_BYTES);
        if (!wp) {
            fprintf(stderr, "bench_kernels: out of memory\n");
            exit(1);
        }
        for (size_t ii = 0; ii < 2 * (sizeof isas / sizeof isas[0]); ii++) {
            const kern_table_t *kt = kern_get(isas[ii / 2]);
            const int packed = (int)(ii % 2); /* the table's own layout (kern_table_t.pack) */
            if (!kt || (packed && !kt->pack_bytes)) continue;
            for (int s = 0; s < N_KQ_SH; s++) {
                const int64_t N = KQ_SH[s][0], K = KQ_SH[s][1];
                size_t pbytes = KQ_POOL_BYTES;
                char *pk = packed ? pack_pool(kt, t, wp, K, &pbytes) : NULL;
                if (packed && !pk) continue;
                double best[N_KQ_TS];
                for (int k = 0; k < N_KQ_TS; k++) best[k] = 1e30;
                for (int r = 0; r < rounds; r++)
                    for (int k = 0; k < N_KQ_TS; k++)
                        keep_min(&best[k], time_matmul_p(pool, kt, t, packed ? pk : wp, pbytes, N,
                                                         K, KQ_TS[k], x, y, budget, packed));
                free(pk);
                printf("| %s%s, %d | %s | %lldx%lld ", kt->name, packed ? " packed" : "", nth,
                       dtype_name(t), (long long)N, (long long)K);
                for (int k = 0; k < N_KQ_TS; k++) {
                    printf("| %.1f ", 2.0 * KQ_TS[k] * (double)N * (double)K / best[k] / 1e9);
                    if (KQ_TS[k] == 1) {
                        double gbs = (double)(dtype_row_bytes(t, K) * (size_t)N) / best[k] / 1e9;
                        printf("| %.1f (%.0f%%) ", gbs, 100.0 * gbs / bw);
                    }
                }
                printf("|\n");
                fflush(stdout);
            }
        }
        free(wp);
    }
    /* one thread, CPU time */
    printf("\n| kernels, 1 thread, CPU time | wtype | in L2: T=1 GOP/s (W GB/s) | T=16 | T=64 | "
           "streamed: T=1 W GB/s |\n|---|---|---|---|---|---|\n");
    for (size_t ti = 0; ti < N_KQ_T; ti++) {
        const int t = KQ_T[ti];
        char *wp = make_kq_pool(t, KQ_POOL_BYTES);
        if (!wp) {
            fprintf(stderr, "bench_kernels: out of memory\n");
            exit(1);
        }
        for (size_t ii = 0; ii < 2 * (sizeof isas / sizeof isas[0]); ii++) {
            const kern_table_t *kt = kern_get(isas[ii / 2]);
            const int packed = (int)(ii % 2);
            if (!kt || (packed && !kt->pack_bytes)) continue;
            const int64_t K = 2048, NL = 256, NS = 2048;
            const size_t rb = dtype_row_bytes(t, K), ws = rb * (size_t)NS;
            size_t pbytes = KQ_POOL_BYTES;
            char *pk = packed ? pack_pool(kt, t, wp, K, &pbytes) : NULL;
            if (packed && !pk) continue;
            static const int tl[3] = {1, 16, 64};
            double best[4] = {1e30, 1e30, 1e30, 1e30};
            size_t c = 0;
            for (int r = 0; r < rounds; r++)
                for (int k = 0; k < 4; k++)
                    for (int rep = 0; rep < 10; rep++) {
                        int calls = 0;
                        double t0 = cpu_now_s(), el;
                        do {
                            if (packed && k < 3)
                                kt->matmul_packed(t, pk, K, x, K, y, NL, tl[k], 0, NL);
                            else if (packed)
                                kt->matmul_packed(t, pk + ws * (c++ % (pbytes / ws)), K, x, K, y,
                                                  NS, 1, 0, NS);
                            else if (k < 3) kt->matmul(t, wp, rb, K, x, K, y, NL, tl[k], 0, NL);
                            else kt->matmul(t, wp + ws * (c++ % (KQ_POOL_BYTES / ws)), rb, K, x, K, y,
                                            NS, 1, 0, NS);
                            calls++;
                            el = cpu_now_s() - t0;
                        } while (el < budget / 20);
                        keep_min(&best[k], el / calls);
                    }
            free(pk);
            printf("| %s%s | %s | %.1f (%.1f) | %.1f | %.1f | %.1f |\n", kt->name,
                   packed ? " packed" : "", dtype_name(t),
                   2.0 * (double)NL * (double)K / best[0] / 1e9,
                   (double)(rb * (size_t)NL) / best[0] / 1e9,
                   2.0 * 16 * (double)NL * (double)K / best[1] / 1e9,
                   2.0 * 64 * (double)NL * (double)K / best[2] / 1e9, (double)ws / best[3] / 1e9);
            fflush(stdout);
        }
        free(wp);
    }
    free(x);
    free(y);
}

#define N_SH 3
#define N_TS 5
static const int64_t SH[N_SH][2] = {{576, 576}, {1536, 576}, {576, 1536}};
static const int TS[N_TS] = {1, 4, 16, 64, 512};
static const int MT[3] = {1, 16, 512};

int main(int argc, char **argv)
{
    int nth = 2, rounds = 3, npos = 0, ceilings = 0, kquant = 0;
    double budget = 0.2;
    const char *json = NULL;
    int on[N_WT]; /* the types measured (--types) */
    for (int wi = 0; wi < N_WT; wi++) on[wi] = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ceilings")) ceilings = 1;
        else if (!strcmp(argv[i], "--kquant")) kquant = 1;
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--types") && i + 1 < argc) {
            const char *list = argv[++i];
            for (int wi = 0; wi < N_WT; wi++) {
                const char *nm = dtype_name(WT[wi]), *p = list;
                size_t n = strlen(nm);
                on[wi] = 0;
                for (; *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p))
                    if (!strncasecmp(p, nm, n) && (p[n] == ',' || p[n] == 0)) on[wi] = 1;
            }
        }
        else if (argv[i][0] != '-' && npos < 3) { /* threads, rounds, seconds, in this order */
            if (npos == 0) nth = atoi(argv[i]);
            else if (npos == 1) rounds = atoi(argv[i]);
            else budget = atof(argv[i]);
            npos++;
        } else {
            fprintf(stderr, "usage: bench_kernels [threads] [rounds] [seconds per cell] [--ceilings] "
                            "[--kquant] [--json FILE] [--types T1,T2,...]\n");
            return 2;
        }
    }
    if (nth < 1 || rounds < 1 || !(budget > 0)) {
        fprintf(stderr, "bench_kernels: threads and rounds >= 1, seconds per cell > 0\n");
        return 2;
    }
    char err[128];
    tpool_t *pool = tpool_new(nth, err, sizeof err), *pool1 = tpool_new(1, err, sizeof err);
    if (!pool || !pool1) {
        fprintf(stderr, "bench_kernels: %s\n", err);
        return 1;
    }
    const kern_table_t *kt = kern_get(NULL);
    openblas_set_num_threads(nth);
    if (kquant) {
        double bw = 0;
        char *buf = make_kq_pool(DT_Q4_K, KQ_POOL_BYTES);
        if (!buf) {
            fprintf(stderr, "bench_kernels: out of memory\n");
            return 1;
        }
        for (int r = 0; r < rounds; r++) keep_max(&bw, membw_read(pool, buf, KQ_POOL_BYTES, 3));
        free(buf);
        printf("# bench_kernels --kquant: %d threads, best of %d rounds; memory read bandwidth %.1f GB/s\n",
               nth, rounds, bw);
        kquant_table(pool, nth, rounds, budget, bw);
        tpool_free(pool);
        tpool_free(pool1);
        return 0;
    }

    char *wpool[N_WT];
    size_t pool_bytes[N_WT];
    for (int wi = 0; wi < N_WT; wi++) {
        pool_bytes[wi] = model_bytes(WT[wi]);
        wpool[wi] = on[wi] || wi < 2 ? make_pool(WT[wi], pool_bytes[wi]) : NULL;
        if (!wpool[wi] && (on[wi] || wi < 2)) {
            fprintf(stderr, "bench_kernels: out of memory\n");
            return 1;
        }
    }
    float *x = malloc(sizeof(float) * 1536 * 512), *y = malloc(sizeof(float) * MODEL_VOCAB * 16);
    float *bb = malloc(sizeof(float) * 1536 * 576);
    size_t copy_bytes = pool_bytes[1] / 4096 * 4096; /* the F16 pool, copied to cbuf */
    char *cbuf = malloc(copy_bytes);
    if (!x || !y || !bb || !cbuf) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        return 1;
    }
    memset(cbuf, 1, copy_bytes); /* first touch outside the timing */
    for (int i = 0; i < 1536 * 512; i++) x[i] = frand();
    for (int i = 0; i < 1536 * 576; i++) bb[i] = frand();

    double bw1 = 0, bw = 0, cbw = 0, tp_empty = 1e30, tp_busy = 1e30, blas[N_SH], mm[N_WT][N_SH][N_TS],
           model[N_WT][3];
    for (int s = 0; s < N_SH; s++) blas[s] = 1e30;
    for (int wi = 0; wi < N_WT; wi++) {
        for (int s = 0; s < N_SH; s++)
            for (int ti = 0; ti < N_TS; ti++) mm[wi][s][ti] = 1e30;
        for (int i = 0; i < 3; i++) model[wi][i] = 1e30;
    }
    const double busy = 5e-6;
    for (int r = 0; r < rounds; r++) {
        keep_max(&bw1, membw_read(pool1, wpool[0], pool_bytes[0] / 512 * 512, 3));
        keep_max(&bw, membw_read(pool, wpool[0], pool_bytes[0] / 512 * 512, 3));
        keep_max(&cbw, bench_copy(pool, wpool[1], cbuf, copy_bytes));
        if (!ceilings) {
            keep_min(&tp_empty, time_tpool(pool, noop_fn, NULL));
            keep_min(&tp_busy, time_tpool(pool, busy_fn, (void *)&busy));
        }
        for (int s = 0; s < N_SH; s++)
            keep_min(&blas[s], time_sgemm(512, SH[s][0], SH[s][1], x, bb, y, budget));
        for (int wi = 0; wi < N_WT; wi++) {
            if (!on[wi]) continue;
            for (int s = 0; s < N_SH; s++)
                for (int ti = ceilings ? N_TS - 1 : 0; ti < N_TS; ti++)
                    keep_min(&mm[wi][s][ti],
                             time_matmul(pool, kt, WT[wi], wpool[wi], pool_bytes[wi], SH[s][0],
                                         kfit(WT[wi], SH[s][1]), TS[ti], x, y, budget));
            for (int i = 0; i < 3 && !ceilings; i++)
                keep_min(&model[wi][i], time_model(pool, kt, WT[wi], wpool[wi], MT[i], x, y));
        }
    }

    printf("# bench_kernels: %s kernels, %d threads, best of %d rounds\n\n", kt->name, nth, rounds);
    printf("| measure | value |\n|---|---|\n");
    printf("| memory read bandwidth, 1 thread | %.1f GB/s |\n", bw1);
    printf("| memory read bandwidth, %d threads | %.1f GB/s |\n", nth, bw);
    printf("| memory copy bandwidth, %d threads (read + written) | %.1f GB/s |\n", nth, cbw);
    if (!ceilings) {
        printf("| tpool_run, empty parts (the caller may take them all) | %.2f us |\n", tp_empty * 1e6);
        printf("| tpool_run, %d parts of 5 us: time above 5 us | %.2f us |\n", nth,
               (tp_busy - busy) * 1e6);
    }

    printf("\n| OpenBLAS sgemm, %d threads (M=T, N, K) | GFLOP/s |\n|---|---|\n", nth);
    for (int s = 0; s < N_SH; s++) {
        blas[s] = 2.0 * 512 * (double)SH[s][0] * (double)SH[s][1] / blas[s] / 1e9;
        printf("| M=512 N=%lld K=%lld | %.1f |\n", (long long)SH[s][0], (long long)SH[s][1], blas[s]);
    }

    printf("\n| wtype | N x K | T=1 GFLOP/s | T=1 W GB/s (%% of bw) | T=4 | T=16 | T=64 | T=512 | "
           "T=512 vs sgemm |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int wi = 0; wi < N_WT; wi++)
        for (int s = 0; s < N_SH && on[wi]; s++) {
            int64_t N = SH[s][0], K = kfit(WT[wi], SH[s][1]);
            printf("| %s | %lldx%lld ", dtype_name(WT[wi]), (long long)N, (long long)K);
            double g512 = 0;
            for (int ti = 0; ti < N_TS; ti++) {
                double t = mm[wi][s][ti];
                double gf = 2.0 * TS[ti] * (double)N * (double)K / t / 1e9;
                if (t >= 1e30) { /* not measured (--ceilings) */
                    printf(TS[ti] == 1 ? "| - | - " : "| - ");
                    continue;
                }
                printf("| %.1f ", gf);
                if (TS[ti] == 1) {
                    double gbs = (double)(dtype_row_bytes(WT[wi], K) * (size_t)N) / t / 1e9;
                    printf("| %.1f (%.0f%%) ", gbs, 100.0 * gbs / bw);
                }
                if (TS[ti] == 512) g512 = gf;
            }
            printf("| %.0f%% |\n", 100.0 * g512 / blas[s]);
        }

    if (json) {
        FILE *jf = fopen(json, "w");
        if (!jf) {
            perror(json);
            return 1;
        }
        double sg_best = 0, mm_best = 0;
        int best_wi = 0, best_s = 0;
        fprintf(jf, "{\"kernels\": \"%s\", \"threads\": %d, \"rounds\": %d, \"read_bw_gbs_1t\": %.3f, "
                    "\"read_bw_gbs\": %.3f, \"copy_bw_gbs\": %.3f, \"sgemm_gflops\": {",
                kt->name, nth, rounds, bw1, bw, cbw);
        for (int s = 0; s < N_SH; s++) {
            fprintf(jf, "%s\"%lldx%lld\": %.3f", s ? ", " : "", (long long)SH[s][0],
                    (long long)SH[s][1], blas[s]);
            keep_max(&sg_best, blas[s]);
        }
        fprintf(jf, "}, \"matmul_t512_gflops\": {");
        for (int wi = 0, first = 1; wi < N_WT; wi++) {
            if (!on[wi]) continue;
            fprintf(jf, "%s\"%s\": {", first ? "" : ", ", dtype_name(WT[wi]));
            first = 0;
            for (int s = 0; s < N_SH; s++) {
                double gf = 2.0 * 512 * (double)SH[s][0] * (double)kfit(WT[wi], SH[s][1]) /
                            mm[wi][s][N_TS - 1] / 1e9;
                fprintf(jf, "%s\"%lldx%lld\": %.3f", s ? ", " : "", (long long)SH[s][0],
                        (long long)SH[s][1], gf);
                if (gf > mm_best) {
                    mm_best = gf;
                    best_wi = wi;
                    best_s = s;
                }
            }
            fprintf(jf, "}");
        }
        fprintf(jf, "}, \"sgemm_best_gflops\": %.3f, \"matmul_best_gflops\": %.3f, "
                    "\"matmul_best_type\": \"%s\", \"matmul_best_shape\": \"%lldx%lld\"}\n",
                sg_best, mm_best, dtype_name(WT[best_wi]), (long long)SH[best_s][0],
                (long long)SH[best_s][1]);
        fclose(jf);
    }

    if (!ceilings)
        printf("\n| SmolLM2-135M shapes, matmuls only | weights MB | T=1 tok/s (W GB/s) | T=16 tok/s | "
               "T=512 tok/s |\n|---|---|---|---|---|\n");
    for (int wi = 0; wi < N_WT && !ceilings; wi++) {
        if (!on[wi]) continue;
        double mb = (double)model_bytes(WT[wi]) / 1e6;
        printf("| %s | %.0f | %.0f (%.1f) | %.0f | %.0f |\n", dtype_name(WT[wi]), mb,
               1.0 / model[wi][0], mb / 1e3 / model[wi][0], 16.0 / model[wi][1],
               512.0 / model[wi][2]);
    }
    if (!ceilings) kquant_table(pool, nth, rounds, budget, bw);
    for (int wi = 0; wi < N_WT; wi++) free(wpool[wi]);
    free(x);
    free(y);
    free(bb);
    free(cbuf);
    tpool_free(pool);
    tpool_free(pool1);
    return 0;
}
