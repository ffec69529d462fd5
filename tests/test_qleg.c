/* tests/test_qleg.c: Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS weights -- their F32 values
 * (dtype_dequant_row and every ISA's dequant_row against a decoding written here from the
 * layouts in engine/dtype.h), every ISA's matmul (the int8 routes of kernels.h) against the
 * route's formula evaluated in double within the bound kernels.h states, that formula against
 * the exact product of the widened weights within x's 8-bit rounding, batch invariance
 * (bit-identical alone and batched, odd row ranges), VNNI against plain AVX-512 (the same
 * bits), IQ4_XS packed in 16-row groups (the avx512-vnni table's pack, where this CPU has it:
 * the same accuracy and batch-invariance checks, and non-finite x), and mkmodel's quantisers
 * (round trip within each type's step).
 *
 * Blocks are random bytes (every bit pattern of quants, fifth bits and 6-bit scales) with
 * random finite fp16 scales and mins of both signs. */
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

static const int TYPES[] = {DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_IQ4_NL, DT_IQ4_XS};
#define N_TYPES 5
#define N_ISAS KC_N_ISAS

/* The non-linear grid, written out independently of dtype.c. */
static const int KV[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static uint64_t rng_state = 0x2545f4914f6cdd1dull; /* the inputs: drawn by kern_check.h */
static uint64_t rng_next(void) { return kc_rng_next(&rng_state); }
static float rng_unif(void) { return kc_rng_unif(&rng_state); }
static float *make_vec(int64_t n) { return kc_make_vec(&rng_state, n); }

static uint16_t rand_half(float scale)
{
    return f32_to_fp16(rng_unif() * scale);
}

/* Random rows of type t: random bytes, then the fp16 fields set to finite values. */
static void *make_weights(int t, int64_t rows, int64_t K, size_t *row_bytes)
{
    const size_t rb = dtype_row_bytes(t, K), bs = dtype_block_bytes(t);
    uint8_t *w = malloc(rb * (size_t)rows + 64);
    for (size_t i = 0; i < rb * (size_t)rows; i++) w[i] = (uint8_t)(rng_next() >> 56);
    for (size_t b = 0; b < rb * (size_t)rows / bs; b++) {
        uint8_t *blk = w + b * bs;
        uint16_t d = rand_half(t == DT_IQ4_XS ? 0.001f : 0.02f), m = rand_half(0.2f);
        memcpy(blk, &d, 2); /* d is every block's first member */
        if (t == DT_Q4_1 || t == DT_Q5_1) memcpy(blk + 2, &m, 2);
    }
    *row_bytes = rb;
    return w;
}

/* Weight k of a row decoded here: its integer part (*iq: Q4_1 / Q5_1 q, Q5_0 q - 16, IQ4_NL
 * kv[q], IQ4_XS kv[q]), multiplier (*im: IQ4_XS ls - 32, else 1), scale d and min m (0 without
 * one); the F32 value is the one rounding of d * im * iq + m (exact in double). */
static float ref_weight(int t, const void *row, int64_t k, int *iq, int *im, double *d, double *m)
{
    const uint8_t *p = row;
    uint16_t hd, hm = 0;
    int q, mul = 1;
    if (t == DT_IQ4_XS) {
        const uint8_t *b = p + (size_t)(k / 256) * 136;
        const int j = (int)(k % 256) / 32, l = (int)(k % 32);
        memcpy(&hd, b, 2);
        const uint16_t sh = (uint16_t)(b[2] | b[3] << 8);
        const int ls = ((b[4 + j / 2] >> (j % 2 ? 4 : 0)) & 15) | ((sh >> (2 * j)) & 3) << 4;
        const uint8_t byte = b[8 + 16 * j + l % 16];
        q = KV[l < 16 ? byte & 15 : byte >> 4];
        mul = ls - 32;
    } else {
        const size_t bs = t == DT_Q4_1 ? 20 : t == DT_Q5_0 ? 22 : t == DT_Q5_1 ? 24 : 18;
        const size_t qs_off = t == DT_Q4_1 ? 4 : t == DT_Q5_0 ? 6 : t == DT_Q5_1 ? 8 : 2;
        const uint8_t *b = p + (size_t)(k / 32) * bs;
        const int l = (int)(k % 32);
        memcpy(&hd, b, 2);
        if (t == DT_Q4_1 || t == DT_Q5_1) memcpy(&hm, b + 2, 2);
        const uint8_t byte = b[qs_off + l % 16];
        q = l < 16 ? byte & 15 : byte >> 4;
        if (t == DT_Q5_0 || t == DT_Q5_1) {
            const uint8_t *qh = b + (t == DT_Q5_0 ? 2 : 4);
            q += ((qh[l / 8] >> (l % 8)) & 1) * 16;
        }
        if (t == DT_Q5_0) q -= 16;
        if (t == DT_IQ4_NL) q = KV[q];
    }
    *iq = q;
    *im = mul;
    *d = fp16_to_f32(hd);
    *m = fp16_to_f32(hm);
    /* d * mul * q is exact in double; the types without a min add nothing (keeping -0.0) */
    if (t == DT_Q4_1 || t == DT_Q5_1) return (float)(*d * mul * q + *m);
    return (float)(*d * mul * q);
}

static float ref_w(int t, const void *row, int64_t k)
{
    int iq, im;
    double d, m;
    return ref_weight(t, row, k, &iq, &im, &d, &m);
}

static int blk_of(int t)
{
    return t == DT_IQ4_XS ? 256 : 32;
}

/* The route's formula (kernels.h) in double for one row and token: 32-block types
 * sum_b d_b dx_b P_b + m_b dx_b S_b, IQ4_XS sum_s d_s dx_s isum_s; *mag the sum of |terms|
 * that the F32 bound scales with; *qerr a bound on its distance from the exact product of the
 * widened weights with x (x's 8-bit rounding, dx / 2 per element, and the weights' rounding). */
static double ref_route(int t, const void *row, const float *x, int64_t K, double *mag,
                        double *qerr)
{
    *mag = *qerr = 0;
    if (K <= 0) return 0; /* (and tells the compiler the sizes below are positive) */
    const int bl = blk_of(t);
    const int64_t nb = K / bl;
    int8_t *xq = malloc((size_t)K);
    float *xd = malloc((size_t)nb * sizeof(float));
    if (t == DT_IQ4_XS) {
        kern_q8k_t *x8 = malloc((size_t)nb * sizeof *x8);
        kern_q8k_quantize(x, K, x8);
        for (int64_t s = 0; s < nb; s++) {
            memcpy(xq + 256 * s, x8[s].q, 256);
            xd[s] = x8[s].d;
        }
        free(x8);
    } else {
        kern_q8_quantize(x, K, xq, xd);
    }
    double ref = 0, mg = 0, qe = 0;
    for (int64_t b = 0; b < nb; b++) {
        double p = 0, ap = 0, S = 0, d = 0, m = 0;
        for (int l = 0; l < bl; l++) {
            const int64_t k = (int64_t)bl * b + l;
            int iq, im;
            const double w = ref_weight(t, row, k, &iq, &im, &d, &m);
            p += (double)im * iq * xq[k];
            ap += fabs((double)im * iq * xq[k]);
            S += xq[k];
            qe += fabs(w) * (0.5001 * xd[b]) + ldexp(1.0, -23) * fabs(w * xd[b] * xq[k]);
        }
        ref += d * xd[b] * p + m * xd[b] * S;
        mg += fabs(d * xd[b]) * ap + fabs(m * xd[b] * S);
    }
    free(xq);
    free(xd);
    *mag = mg;
    if (qerr) *qerr = qe;
    return ref;
}

static void test_dequant(const kern_table_t *kt, int t)
{
    const int64_t K = t == DT_IQ4_XS ? 2048 : 1600;
    size_t rb;
    void *W = make_weights(t, 3, K, &rb);
    float *a = malloc((size_t)K * 4), *b = malloc((size_t)K * 4);
    int bad = 0;
    for (int r = 0; r < 3; r++) {
        const char *row = (const char *)W + (size_t)r * rb;
        dtype_dequant_row(t, row, a, K);
        kt->dequant_row(t, row, b, K);
        for (int64_t k = 0; k < K; k++) {
            float want = ref_w(t, row, k);
            if (memcmp(&want, &a[k], 4) || memcmp(&want, &b[k], 4)) bad++;
        }
    }
    CHECKF(bad == 0, "%s dequant %s: %d values differ from the reference", kt->name,
           dtype_name(t), bad);
    free(W);
    free(a);
    free(b);
}

static int ref_i8(int t, const void *row, const float *x, int64_t K, double *ref, double *mag,
                  double *qerr, double *kbound)
{
    *ref = ref_route(t, row, x, K, mag, qerr);
    *kbound = (double)(K / blk_of(t) + 8);
    return 1;
}

/* matmul against the double reference (kern_check.h): N rows, T tokens, strided x and y. */
static const kc_matmul_ref_t ACC = {.N = 23, .x_pad = 5, .y_pad = 3, .nmse = 1,
                                    .make_weights = make_weights, .rng = &rng_state,
                                    .weight = ref_w, .route = ref_i8};

/* Non-finite x: the token's outputs are NaN (its block scales are NaN), the others finite. */
static void test_nonfinite(const kern_table_t *kt, int t)
{
    const int64_t N = 9, K = 512;
    size_t rb;
    void *W = make_weights(t, N, K, &rb);
    float *x = make_vec(K * 3), y[3 * 9];
    x[K + 37] = INFINITY;
    CHECK(kt->matmul(t, W, rb, K, x, K, y, N, 3, 0, N) == 0);
    int bad = 0;
    for (int64_t o = 0; o < N; o++)
        if (!isfinite(y[o]) || !isnan(y[N + o]) || !isfinite(y[2 * N + o])) bad++;
    CHECKF(bad == 0, "%s %s: non-finite x", kt->name, dtype_name(t));
    free(W);
    free(x);
}

/* mkmodel's quantiser: every weight written is the grid point of its block (the stored d, m
 * and sub-block scale) nearest to its input, up to ties within 0.1% of the step; the relative
 * RMS error of Gaussian-like rows is in each type's expected range; a zero block stays zero. */
static void test_quantiser(int t)
{
    const int64_t K = 1024;
    float *x = malloc(K * sizeof(float)), *back = malloc(K * sizeof(float));
    void *q = malloc(dtype_row_bytes(t, K));
    double se = 0, sx = 0;
    int bad = 0;
    /* its own generator: the rows are the same whichever kernel tests ran before it */
    uint64_t rs = 0x9e3779b97f4a7c15ull ^ (uint64_t)t;
    for (int rep = 0; rep < 8; rep++) {
        for (int64_t k = 0; k < K; k++) /* sums of uniforms; a few outliers; a zero block */
            x[k] = k >= 256 && k < 288 ? 0.0f
                                       : 0.05f * (kc_rng_unif(&rs) + kc_rng_unif(&rs) +
                                                  kc_rng_unif(&rs)) *
                                             (k % 97 == 5 ? 6.0f : 1.0f) + (rep == 3 ? 0.03f : 0.0f);
        CHECK(mkmodel_quantize_row(t, x, q, K) == 0);
        dtype_dequant_row(t, q, back, K);
        for (int64_t k = 0; k < K; k++) {
            int iq, im;
            double d, m;
            const float w = ref_weight(t, q, k, &iq, &im, &d, &m);
            if (memcmp(&w, &back[k], 4)) bad++;
            const double e = fabs((double)w - x[k]), step = fabs(d * im);
            double best = INFINITY;
            for (int g = 0; g < (t == DT_Q5_0 || t == DT_Q5_1 ? 32 : 16); g++) {
                const int gi = t == DT_Q5_0 ? g - 16 : t == DT_IQ4_NL || t == DT_IQ4_XS ? KV[g] : g;
                const double e2 = fabs(d * im * gi + m - x[k]);
                best = e2 < best ? e2 : best;
            }
            if (!(e <= best + 1e-3 * step + 1e-7 * fabs(x[k]))) bad++;
            se += e * e;
            sx += (double)x[k] * x[k];
        }
        for (int64_t k = 256; k < 288; k++)
            if (back[k] != 0.0f) bad++;
    }
    const double rel = sqrt(se / sx);
    const double max_rel = t == DT_Q5_0 || t == DT_Q5_1 ? 0.06 : 0.12;
    CHECKF(bad == 0 && rel < max_rel, "quantiser %s: %d values off the nearest grid point, "
           "relative RMS error %.4f", dtype_name(t), bad, rel);
    fprintf(stderr, "quantiser %s: relative RMS error %.4f\n", dtype_name(t), rel);
    free(x);
    free(back);
    free(q);
}

int main(void)
{
    const kern_table_t *tabs[N_ISAS];
    kc_tables(tabs);
    for (int ti = 0; ti < N_TYPES; ti++) CHECK(dtype_supported(TYPES[ti]));
    CHECK(dtype_block_bytes(DT_Q4_1) == 20 && dtype_block_bytes(DT_Q5_0) == 22 &&
          dtype_block_bytes(DT_Q5_1) == 24 && dtype_block_bytes(DT_IQ4_NL) == 18 &&
          dtype_block_bytes(DT_IQ4_XS) == 136 && dtype_block_elems(DT_IQ4_XS) == 256);
    for (int ti = 0; ti < N_TYPES; ti++)
        CHECK(dtype_block_bytes(TYPES[ti]) == dtype_ggml_block_bytes(TYPES[ti]) &&
              dtype_block_elems(TYPES[ti]) == dtype_ggml_block_elems(TYPES[ti]));
    static const int64_t KS32[] = {32, 96, 608, 2048};
    static const int64_t KS256[] = {256, 768, 2304};
    for (int i = 0; i < N_ISAS; i++) {
        const kern_table_t *kt = tabs[i];
        if (!kt) continue;
        for (int ti = 0; ti < N_TYPES; ti++) {
            const int t = TYPES[ti];
            test_dequant(kt, t);
            const int64_t *ks = t == DT_IQ4_XS ? KS256 : KS32;
            const int nk = t == DT_IQ4_XS ? 3 : 4;
            for (int ki = 0; ki < nk; ki++)
                for (int T = 1; T <= 13; T += 3) kc_matmul_accuracy(kt, t, ks[ki], T, &ACC);
            kc_batch_invariance(kt, t, 27, t == DT_IQ4_XS ? 256 : 96, i == 0 ? 12 : 40,
                                make_weights, &rng_state);
            kc_batch_invariance(kt, t, 27, t == DT_IQ4_XS ? 1536 : 1568, i == 0 ? 4 : 12,
                                make_weights, &rng_state);
            test_nonfinite(kt, t);
            /* K not a multiple of the block: refused */
            CHECK(kt->matmul(t, NULL, 0, t == DT_IQ4_XS ? 288 : 48, NULL, 288, NULL, 1, 1, 0, 1) == -1);
        }
    }
    if (tabs[2] && tabs[3])
        for (int ti = 0; ti < N_TYPES; ti++)
            kc_same_bits(tabs[KC_AVX512], tabs[KC_AVX512_VNNI], TYPES[ti], TYPES[ti] == DT_IQ4_XS ? 768 : 608, make_weights,
                         &rng_state);
    /* IQ4_XS packed (the avx512-vnni table's pack: kernels.h "Packed Q4_K, Q5_K, Q6_K, IQ4_XS
     * and Q8_0"): the same checks through a matmul that packs W first; the 32-blocks are not */
    const kern_table_t *vn = tabs[KC_AVX512_VNNI];
    if (vn) {
        CHECK(vn->pack_bytes(DT_IQ4_XS, 37, 768) == 3 * 3 * 2176);
        for (int ti = 0; ti < N_TYPES; ti++)
            if (TYPES[ti] != DT_IQ4_XS) CHECK(vn->pack_bytes(TYPES[ti], 37, 768) == 0);
        kern_table_t pk = *vn;
        pk.name = "avx512-vnni packed";
        pk.matmul = kc_packed_matmul;
        for (int ki = 0; ki < 3; ki++)
            for (int T = 1; T <= 21; T += 4) kc_matmul_accuracy(&pk, DT_IQ4_XS, KS256[ki], T, &ACC);
        kc_batch_invariance(&pk, DT_IQ4_XS, 27, 256, 24, make_weights, &rng_state);
        kc_batch_invariance(&pk, DT_IQ4_XS, 45, 1536, 12, make_weights, &rng_state);
        test_nonfinite(&pk, DT_IQ4_XS);
    }
    for (int ti = 0; ti < N_TYPES; ti++) test_quantiser(TYPES[ti]);
    return check_exit();
}
