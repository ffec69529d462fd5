/* tests/test_q23k.c: Q2_K and Q3_K -- dequantisation, the int8 matmul route of every ISA
 * (engine/cpu/q23k.h), and the quantisers of tools/quant_q23k.h.
 *
 * Weights are random bytes (every bit pattern of the quants, scales, mins and high bits) with
 * random fp16 d and dmin of either sign, plus blocks of all-zero and all-one bytes. The reference
 * value of a weight is computed here independently of engine/dtype.h: the sub-block scale read
 * bit by bit from the packing ggml describes, Q2_K's d*sc*q - dmin*m rounded once to F32, Q3_K's
 * d*sc*q exact. dtype_dequant_row and every ISA's dequant_row must give those bits exactly.
 *
 * matmul: the int8 route's formula (kernels.h) in double over x as kern_q8k_quantize rounds it,
 * within (K/256 + 8) u times the sum kernels.h names; that reference within x's 8-bit rounding of
 * the exact product of the widened weights; NMSE < 1e-12 over each output. Batch invariance: every
 * (t, o) of a batch of T = 1..70 tokens over rows [o0, o1) (odd starts and ends) bit-identical to
 * the token alone over one row. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kern_check.h"
#include "engine/cpu/kernels.h"
#include "engine/dtype.h"
#include "tools/mkmodel.h"

static const int TYPES[] = {DT_Q2_K, DT_Q3_K};
#define N_ISAS KC_N_ISAS

static uint64_t rng_state = 0x243f6a8885a308d3ull; /* the inputs: drawn by kern_check.h */
static uint64_t rng_next(void) { return kc_rng_next(&rng_state); }
static float rng_unif(void) { return kc_rng_unif(&rng_state); }
static float *make_vec(int64_t n) { return kc_make_vec(&rng_state, n); }

/* Random rows x K of type t: random bytes, then random fp16 scales of either sign; every 7th
 * block all-zero bytes and every 11th all-one bytes (before the scales). */
static void *make_weights(int t, int64_t rows, int64_t K, size_t *row_bytes)
{
    const size_t rb = dtype_row_bytes(t, K), bs = dtype_block_bytes(t);
    uint8_t *w = malloc(rb * (size_t)rows + 64);
    const int64_t nblk = rows * (K / 256);
    for (int64_t b = 0; b < nblk; b++) {
        uint8_t *p = w + (size_t)b * bs;
        for (size_t i = 0; i < bs; i++) p[i] = (uint8_t)rng_next();
        if (b % 7 == 3) memset(p, 0, bs);
        if (b % 11 == 5) memset(p, 0xff, bs);
        uint16_t d = f32_to_fp16(rng_unif() * 0.02f), dm = f32_to_fp16(rng_unif() * 0.02f);
        if (t == DT_Q2_K) {
            memcpy(p + 80, &d, 2);
            memcpy(p + 82, &dm, 2);
        } else {
            memcpy(p + 108, &d, 2);
        }
    }
    *row_bytes = rb;
    return w;
}

/* Bit i of a byte array (little-endian bit order). */
static int bit_at(const uint8_t *a, int i)
{
    return a[i / 8] >> (i % 8) & 1;
}

/* Sub-block j's scale (Q3_K, signed) or scale and min (Q2_K), read bit by bit. */
static int q3_scale_ref(const uint8_t *sc12, int j)
{
    int f = 0;
    for (int b = 0; b < 4; b++) f |= bit_at(sc12, 8 * (j % 8) + 4 * (j / 8) + b) << b;
    for (int b = 0; b < 2; b++) f |= bit_at(sc12, 64 + 8 * (j % 4) + 2 * (j / 4) + b) << (4 + b);
    return f - 32;
}

/* Integer quant of weight i (< 256) of a block: Q2_K in [0, 3], Q3_K in [-4, 3]. */
static int quant_ref(int t, const uint8_t *blk, int i)
{
    const int c = i / 128, p = i % 128 / 32, l = i % 32;
    const uint8_t *qs = blk + (t == DT_Q2_K ? 16 : 32);
    int q = bit_at(qs, 8 * (32 * c + l) + 2 * p) | bit_at(qs, 8 * (32 * c + l) + 2 * p + 1) << 1;
    if (t == DT_Q3_K && !bit_at(blk, 8 * l + 4 * c + p)) q -= 4;
    return q;
}

static void block_params(int t, const uint8_t *blk, int j, double *d, double *dmin, int *sc, int *m)
{
    uint16_t h;
    if (t == DT_Q2_K) {
        memcpy(&h, blk + 80, 2);
        *d = fp16_to_f32(h);
        memcpy(&h, blk + 82, 2);
        *dmin = fp16_to_f32(h);
        *sc = blk[j] & 15;
        *m = blk[j] >> 4;
    } else {
        memcpy(&h, blk + 108, 2);
        *d = fp16_to_f32(h);
        *dmin = 0;
        *sc = q3_scale_ref(blk + 96, j);
        *m = 0;
    }
}

/* F32 value of weight k of a row, and (exact) its value in double before the one rounding. */
static float ref_weight(int t, const void *row, int64_t k, double *exact)
{
    const uint8_t *blk = (const uint8_t *)row + (size_t)(k / 256) * dtype_block_bytes(t);
    const int i = (int)(k % 256);
    double d, dmin;
    int sc, m;
    block_params(t, blk, i / 16, &d, &dmin, &sc, &m);
    double v = d * sc * quant_ref(t, blk, i) - dmin * m; /* exact in double */
    if (exact) *exact = v;
    return (float)v;
}

/* kc_matmul_ref_t's route: the int8 route's formula in double (kernels.h) in *out, *mag its
 * bound's sum, *kbound its factor of u, *qerr a bound on its distance from the exact product of
 * the widened weights (x's 8-bit rounding, at most dx/2 per element, and Q2_K's weight rounding,
 * which the formula does not make). */
static int ref_i8(int t, const void *row, const float *x, int64_t K, double *out, double *mag,
                  double *qerr, double *kbound)
{
    const int64_t nsb = K / 256;
    kern_q8k_t *xq = malloc((size_t)nsb * sizeof *xq);
    kern_q8k_quantize(x, K, xq);
    double ref = 0, mg = 0, qe = 0;
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *blk = (const uint8_t *)row + (size_t)s * dtype_block_bytes(t);
        const double dx = xq[s].d;
        for (int j = 0; j < 16; j++) {
            double d, dmin;
            int sc, m;
            block_params(t, blk, j, &d, &dmin, &sc, &m);
            double p = 0, ap = 0, bsum = 0;
            for (int l = 0; l < 16; l++) {
                const int i = 16 * j + l, xi = xq[s].q[i], q = quant_ref(t, blk, i);
                p += (double)q * xi;
                ap += (double)(t == DT_Q3_K ? q + 8 : q) * abs(xi);
                bsum += xi;
                double w, wf = ref_weight(t, row, 256 * s + i, &w);
                qe += fabs(w) * 0.5001 * dx + fabs(wf - w) * fabs(x[256 * s + i]) +
                      ldexp(1.0, -23) * fabs(w * dx * xi);
            }
            ref += d * dx * sc * p - dmin * dx * m * bsum;
            mg += fabs(d * dx) * abs(sc) * ap + fabs(dmin * dx) * m * fabs(bsum);
        }
    }
    free(xq);
    *out = ref;
    *mag = mg;
    *qerr = qe;
    *kbound = (double)(K / 256 + 8);
    return 1;
}

/* Dequantisation: dtype_dequant_row and every table's dequant_row against ref_weight, bitwise. */
static void test_dequant(const kern_table_t *const *tabs)
{
    for (int ti = 0; ti < 2; ti++) {
        const int t = TYPES[ti];
        const int64_t rows = 9, K = 1024;
        size_t rb;
        void *W = make_weights(t, rows, K, &rb);
        float *out = malloc((size_t)K * sizeof(float));
        int bad = 0;
        for (int64_t o = 0; o < rows; o++) {
            const void *row = (const char *)W + (size_t)o * rb;
            for (int v = -1; v < N_ISAS; v++) {
                if (v >= 0 && !tabs[v]) continue;
                memset(out, 0x7f, (size_t)K * sizeof(float));
                if (v < 0) dtype_dequant_row(t, row, out, K);
                else tabs[v]->dequant_row(t, row, out, K);
                for (int64_t k = 0; k < K; k++) {
                    float r = ref_weight(t, row, k, NULL);
                    if (memcmp(&r, &out[k], 4) != 0) bad++;
                }
            }
        }
        CHECKF(bad == 0, "%s dequant: %d values differ from the reference", dtype_name(t), bad);
        free(W);
        free(out);
    }
}

static float ref_w(int t, const void *row, int64_t k)
{
    return ref_weight(t, row, k, NULL);
}

/* matmul against the double reference (kern_check.h): N rows, T tokens, strided x and y. */
static const kc_matmul_ref_t ACC = {.N = 23, .x_pad = 5, .y_pad = 3, .nmse = 1,
                                    .make_weights = make_weights, .rng = &rng_state,
                                    .weight = ref_w, .route = ref_i8};

/* Shapes refused; x holding Inf or NaN gives NaN outputs; empty ranges write nothing. */
static void test_edges(const kern_table_t *kt, int t)
{
    CHECK(kt->matmul(t, NULL, 0, 128, NULL, 128, NULL, 1, 1, 0, 1) == -1);
    CHECK(kt->matmul(t, NULL, 0, 288, NULL, 288, NULL, 1, 1, 0, 1) == -1);
    CHECK(kt->matmul(t, NULL, 0, 256 * 100000, NULL, 256, NULL, 1, 1, 0, 1) == -1);
    const int64_t K = 512, N = 5;
    size_t rb;
    void *W = make_weights(t, N, K, &rb);
    float *x = make_vec(K);
    float y[N];
    x[300] = INFINITY;
    CHECK(kt->matmul(t, W, rb, K, x, K, y, N, 1, 0, N) == 0);
    int nan = 0;
    for (int o = 0; o < N; o++) nan += isnan(y[o]) != 0;
    CHECKF(nan == N, "%s %s: %d of %d outputs NaN with an Inf in x", kt->name, dtype_name(t), nan,
           (int)N);
    y[0] = 7.0f;
    CHECK(kt->matmul(t, W, rb, K, x, K, y, N, 1, 2, 2) == 0 && y[0] == 7.0f);
    free(W);
    free(x);
}

/* mkmodel_quantize_row to Q2_K / Q3_K: dequantised rows are close to the input (relative RMS
 * error of gaussian-like rows below what these bit widths allow, and every element within half
 * a sub-block's range of its value); zero rows stay zero; scaled rows scale. */
static void test_quantiser(void)
{
    const int64_t n = 4096;
    float *x = malloc((size_t)n * sizeof(float)), *back = malloc((size_t)n * sizeof(float));
    void *q = malloc(dtype_row_bytes(DT_Q3_K, n) + dtype_row_bytes(DT_Q2_K, n));
    for (int64_t i = 0; i < n; i++) /* sum of 3 uniforms: bell-shaped, a few outliers */
        x[i] = (rng_unif() + rng_unif() + rng_unif()) * (i % 97 == 0 ? 4.0f : 1.0f) * 0.05f;
    static const double max_rel[2] = {0.40, 0.20}; /* Q2_K, Q3_K (llama.cpp: ~0.29, ~0.15) */
    for (int ti = 0; ti < 2; ti++) {
        const int t = TYPES[ti];
        CHECK(mkmodel_quantize_row(t, x, q, n) == 0);
        dtype_dequant_row(t, q, back, n);
        double se = 0, sx = 0;
        int far = 0;
        for (int64_t i = 0; i < n; i++) {
            se += ((double)back[i] - x[i]) * ((double)back[i] - x[i]);
            sx += (double)x[i] * x[i];
            float lo = 0, hi = 0; /* the sub-block's range, zero included */
            for (int64_t k = i / 16 * 16; k < i / 16 * 16 + 16; k++) {
                lo = fminf(lo, x[k]);
                hi = fmaxf(hi, x[k]);
            }
            if (!(fabsf(back[i] - x[i]) <= 0.5f * (hi - lo) + 1e-6f)) far++;
        }
        const double rel = sqrt(se / sx);
        fprintf(stderr, "%s quantiser: relative rms error %.4f\n", dtype_name(t), rel);
        CHECKF(rel < max_rel[ti] && far == 0, "%s quantiser: relative rms %.4f (max %.2f), %d far",
               dtype_name(t), rel, max_rel[ti], far);
        float z[256] = {0};
        CHECK(mkmodel_quantize_row(t, z, q, 256) == 0);
        dtype_dequant_row(t, q, back, 256);
        int nz = 0;
        for (int i = 0; i < 256; i++) nz += back[i] != 0.0f;
        CHECKF(nz == 0, "%s quantiser: zero row gives %d nonzero values", dtype_name(t), nz);
        CHECK(mkmodel_quantize_row(t, x, q, 100) == -1);
    }
    free(x);
    free(back);
    free(q);
}

int main(void)
{
    const kern_table_t *tabs[N_ISAS];
    kc_tables(tabs);
    CHECK(dtype_supported(DT_Q2_K) && dtype_supported(DT_Q3_K));
    CHECK(dtype_block_elems(DT_Q2_K) == 256 && dtype_block_bytes(DT_Q2_K) == 84);
    CHECK(dtype_block_elems(DT_Q3_K) == 256 && dtype_block_bytes(DT_Q3_K) == 110);
    CHECK(dtype_ggml_block_bytes(DT_Q2_K) == 84 && dtype_ggml_block_bytes(DT_Q3_K) == 110);
    test_dequant(tabs);
    static const int64_t KS[] = {256, 512, 1280};
    for (int i = 0; i < N_ISAS; i++) {
        const kern_table_t *kt = tabs[i];
        if (!kt) continue;
        for (int ti = 0; ti < 2; ti++) {
            const int t = TYPES[ti];
            for (size_t ki = 0; ki < sizeof KS / sizeof KS[0]; ki++)
                for (int T = 1; T <= 13; T += 4) kc_matmul_accuracy(kt, t, KS[ki], T, &ACC);
            kc_batch_invariance(kt, t, 29, 256, i == 0 ? 20 : 70,
                                make_weights, &rng_state);
            kc_batch_invariance(kt, t, 29, 1024, i == 0 ? 8 : 40,
                                make_weights, &rng_state); /* > 224 super-blocks: heap */
            test_edges(kt, t);
        }
    }
    if (tabs[2] && tabs[3])
        for (int ti = 0; ti < 2; ti++)
            kc_same_bits(tabs[KC_AVX512], tabs[KC_AVX512_VNNI], TYPES[ti], 768, make_weights,
                         &rng_state);
    test_quantiser();
    return check_exit();
}
