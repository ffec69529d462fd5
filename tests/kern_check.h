/* tests/kern_check.h: what the weight-type kernel tests share (test_kernels, test_q23k,
 * test_qleg, test_kernels_q56k): their random inputs and their matmul checks that do not depend
 * on the type beyond its reference -- matmul accuracy against a double reference, batch
 * invariance, two tables' bits -- and the tables of every ISA.
 *
 * Header-only on purpose: the checks count through check.h, whose counters live in each test's
 * own translation unit, so a test's "N checks" line counts these checks too. Single-threaded.
 *
 * Random numbers: xorshift64* over a state the test owns (its seed), so each test's inputs are
 * the same sequence they were before these helpers were shared. */
#ifndef SPILLWAY_TESTS_KERN_CHECK_H
#define SPILLWAY_TESTS_KERN_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/cpu/kernels.h"
#include "engine/dtype.h"

/* The ISAs every kernel test walks, in the order of kc_tables. */
#define KC_N_ISAS 4
#define KC_SCALAR 0
#define KC_AVX512 2
#define KC_AVX512_VNNI 3

/* Makes rows x K random weights of type t (malloc'd, the caller frees), *row_bytes their stride. */
typedef void *(*kc_make_weights_fn)(int t, int64_t rows, int64_t K, size_t *row_bytes);

static inline uint64_t kc_rng_next(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545f4914f6cdd1dull;
}

/* Uniform in [-1, 1), 24 bits. */
static inline float kc_rng_unif(uint64_t *state)
{
    return (float)((double)(kc_rng_next(state) >> 40) / (double)(1ull << 23) - 1.0);
}

/* n uniform floats in [-1, 1) (malloc'd, at least one element; the caller frees). */
static inline float *kc_make_vec(uint64_t *state, int64_t n)
{
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = kc_rng_unif(state);
    return v;
}

/* tabs[i] = kern_get of "scalar", "avx2", "avx512", "avx512-vnni"; NULL (said on stderr) where
 * this machine lacks the ISA. */
static inline void kc_tables(const kern_table_t *tabs[KC_N_ISAS])
{
    static const char *const isas[KC_N_ISAS] = {"scalar", "avx2", "avx512", "avx512-vnni"};
    for (int i = 0; i < KC_N_ISAS; i++) {
        tabs[i] = kern_get(isas[i]);
        if (!tabs[i]) fprintf(stderr, "%s: not supported here, skipped\n", isas[i]);
    }
}

/* What kc_matmul_accuracy needs of a weight type and of the test. */
typedef struct {
    int64_t N;            /* output rows */
    int64_t x_pad, y_pad; /* x's row stride is K + x_pad, y's N + y_pad (padding must stay NaN) */
    int zero_block;       /* T > 1: token 1's first 256 x set to zero (a block with dx = 0) */
    int nmse;             /* also require NMSE < 1e-12 over each output */
    kc_make_weights_fn make_weights;
    uint64_t *rng;
    /* The F32 value of weight k of a row (the type's one rounding, computed by the test). */
    float (*weight)(int t, const void *row, int64_t k);
    /* Where t's matmul takes int8 activations (kernels.h): returns 1 with *ref the route's formula
     * in double over x as the route rounds it, *mag the sum of its terms' |.|, *qerr a bound on
     * |*ref - the exact product of the widened weights|, *kbound the factor of u in the bound
     * (blocks + 8). Else returns 0 and leaves them (F32 activations). */
    int (*route)(int t, const void *row, const float *x, int64_t K, double *ref, double *mag,
                 double *qerr, double *kbound);
} kc_matmul_ref_t;

/* One matmul of N rows of width K by T tokens (strided x and y) against the reference: for every
 * output, exact = sum (double)weight * x; where t has an int8 route, its formula must lie within
 * qerr of exact and the output within kbound u |formula terms| of the formula; else the output
 * within (K + 4) u sum |w x| of exact (rigorous bounds, test_kernels.c); padding untouched; with
 * spec->nmse the NMSE over the outputs < 1e-12. One CHECK (the call) and one CHECKF. Draws the
 * weights, then x. */
static inline void kc_matmul_accuracy(const kern_table_t *kt, int t, int64_t K, int T,
                                      const kc_matmul_ref_t *spec)
{
    const int64_t N = spec->N, ldx = K + spec->x_pad, ldy = N + spec->y_pad;
    size_t rb;
    void *W = spec->make_weights(t, N, K, &rb);
    float *x = kc_make_vec(spec->rng, ldx * T);
    if (spec->zero_block && T > 1) memset(x + ldx, 0, 256 * sizeof(float));
    float *y = malloc((size_t)(ldy * T) * sizeof(float));
    for (int64_t i = 0; i < ldy * T; i++) y[i] = NAN;
    CHECK(kt->matmul(t, W, rb, K, x, ldx, y, ldy, T, 0, N) == 0);
    double se = 0, sr = 0;
    int bad = 0, badq = 0;
    for (int tk = 0; tk < T; tk++) {
        for (int64_t o = 0; o < N; o++) {
            const void *row = (const char *)W + (size_t)o * rb;
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                const double p = (double)spec->weight(t, row, k) * x[tk * ldx + k];
                ref += p;
                mag += fabs(p);
            }
            double kbound = (double)(K + 4), qerr, ri8;
            if (spec->route(t, row, x + tk * ldx, K, &ri8, &mag, &qerr, &kbound)) {
                if (!(fabs(ri8 - ref) <= qerr)) badq++;
                ref = ri8;
            }
            const double got = y[tk * ldy + o];
            if (!(fabs(got - ref) <= kbound * ldexp(1.0, -24) * mag)) bad++;
            se += (got - ref) * (got - ref);
            sr += ref * ref;
        }
        for (int64_t o = N; o < ldy; o++)
            if (!isnan(y[tk * ldy + o])) bad++;
    }
    const double nmse = sr > 0 ? se / sr : se;
    CHECKF(bad == 0 && badq == 0 && (!spec->nmse || nmse < 1e-12),
           "%s %s K=%lld T=%d: %d beyond the bound, %d formula off the exact product, nmse %.3g",
           kt->name, dtype_name(t), (long long)K, T, bad, badq, nmse);
    free(W);
    free(x);
    free(y);
}

/* Bitwise batch invariance (kernels.h) over N rows of width K: every token of a pool of maxT + 2
 * computed alone, one row at a time; then for T = 1..maxT a window of T tokens starting at token
 * T % 3 over rows [o0, o1) (odd and even starts, ends short of N at times) must give those bits.
 * One CHECK per matmul call, one CHECKF for the comparison. Draws the weights, then x. */
static inline void kc_batch_invariance(const kern_table_t *kt, int t, int64_t N, int64_t K,
                                       int maxT, kc_make_weights_fn make_weights, uint64_t *rng)
{
    const int pool = maxT + 2;
    size_t rb;
    void *W = make_weights(t, N, K, &rb);
    float *x = kc_make_vec(rng, K * pool);
    float *alone = malloc((size_t)(pool * N) * sizeof(float)); /* alone[tok][o] */
    for (int tok = 0; tok < pool; tok++)
        for (int64_t o = 0; o < N; o++)
            CHECK(kt->matmul(t, W, rb, K, x + tok * K, K, alone + tok * N, N, 1, o, o + 1) == 0);
    float *y = malloc((size_t)(maxT * N) * sizeof(float));
    int bad = 0;
    for (int T = 1; T <= maxT; T++) {
        const int s = T % 3;
        const int64_t o0 = T % 2 ? 1 : 0, o1 = N - (T % 4 == 1 ? 2 : 0);
        CHECK(kt->matmul(t, W, rb, K, x + s * K, K, y, N, T, o0, o1) == 0);
        for (int tk = 0; tk < T; tk++)
            for (int64_t o = o0; o < o1; o++)
                if (memcmp(&y[tk * N + o], &alone[(s + tk) * N + o], sizeof(float)) != 0) bad++;
    }
    CHECKF(bad == 0, "%s %s K=%lld: %d outputs differ between batch and alone", kt->name,
           dtype_name(t), (long long)K, bad);
    free(W);
    free(x);
    free(alone);
    free(y);
}

/* The avx512-vnni table's packed route (kern_table_t.pack / matmul_packed) seen as a matmul:
 * W's rows [0, o1) packed, then matmul_packed, so that the checks above run on it as on every
 * matmul (a table copy with .matmul = kc_packed_matmul). -1 when that table is missing here or
 * packs no such matrix. */
static inline int kc_packed_matmul(int t, const void *W, size_t rb, int64_t K, const float *x,
                                   int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                                   int64_t o1)
{
    const kern_table_t *kt = kern_get("avx512-vnni");
    const size_t n = kt && kt->pack_bytes ? kt->pack_bytes(t, o1, K) : 0;
    if (!n) return -1;
    void *P = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!P) return -1;
    kt->pack(t, W, rb, o1, K, P);
    const int rc = kt->matmul_packed(t, P, K, x, ldx, y, ldy, T, o0, o1);
    free(P);
    return rc;
}

/* Two tables give bit-identical matmuls (AVX-512 with and without VNNI) over 19 rows of width K,
 * for every batch size T = 1..20. Two CHECKs per T, one CHECKF. Draws the weights, then x. */
static inline void kc_same_bits(const kern_table_t *a, const kern_table_t *b, int t, int64_t K,
                                kc_make_weights_fn make_weights, uint64_t *rng)
{
    const int64_t N = 19;
    const int maxT = 20;
    size_t rb;
    void *W = make_weights(t, N, K, &rb);
    float *x = kc_make_vec(rng, K * maxT);
    float *ya = malloc((size_t)(N * maxT) * sizeof(float));
    float *yb = malloc((size_t)(N * maxT) * sizeof(float));
    int bad = 0;
    for (int T = 1; T <= maxT; T++) {
        CHECK(a->matmul(t, W, rb, K, x, K, ya, N, T, 0, N) == 0);
        CHECK(b->matmul(t, W, rb, K, x, K, yb, N, T, 0, N) == 0);
        if (memcmp(ya, yb, (size_t)(N * T) * sizeof(float)) != 0) bad++;
    }
    CHECKF(bad == 0, "%s vs %s %s: %d batch sizes differ", a->name, b->name, dtype_name(t), bad);
    free(W);
    free(x);
    free(ya);
    free(yb);
}

#endif
