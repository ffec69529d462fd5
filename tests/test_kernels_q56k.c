/* tests/test_kernels_q56k.c: the Q6_K and Q5_K weight types -- dequantisation (engine/dtype.h)
 * and every available ISA's int8 matmul route (engine/cpu/kernels_q56k.h, kernels.h).
 *
 * Weights are random blocks (every bit pattern of the quants, scales and, Q5_K, mins and 5th
 * bits) plus hand-made extremes. The reference value of a weight is computed here from the
 * layout as ggml describes it, by arithmetic on the bytes (not engine/dtype.h's helpers), in
 * double and rounded once to F32: Q6_K (d * sc) * (q - 32), Q5_K d*sc*q - dmin*m; dequantisation
 * must match it bit for bit, the sign of zero included.
 *
 * Matmul: the reference is the route's integer formula (kernels_q56k.h) in double over x as
 * kern_q8k_quantize rounds it; the kernel must be within (K/256 + 8) u times the sum of the
 * formula's terms' |.| (u = 2^-24, the bound kernels.h states), and the formula within x's 8-bit
 * rounding of the exact product of the widened weights. Batch invariance: every (t, o) of a
 * batch over rows [o0, o1) bit-identical to that token alone over one row, for T = 1..maxT,
 * odd starts and ends. AVX-512 with and without VNNI: bit-identical. Q6_K and Q5_K packed in
 * 16-row groups (the avx512-vnni table's pack, where this CPU has it): the same accuracy and
 * batch invariance checks, row counts not multiples of 16 and ranges starting inside a group. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kern_check.h"
#include "engine/cpu/kernels.h"
#include "engine/dtype.h"

#define N_ISAS KC_N_ISAS
static const int TYPES[] = {DT_Q6_K, DT_Q5_K};

static uint64_t rng_state = 0x2545f4914f6cdd1dull; /* the inputs: drawn by kern_check.h */
static uint64_t rng_next(void) { return kc_rng_next(&rng_state); }
static float rng_unif(void) { return kc_rng_unif(&rng_state); }

static void fill_bytes(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rng_next();
}

/* rows x K of type t: random super-blocks; d (and dmin) of either sign, exponents apart. */
static void *make_weights(int t, int64_t rows, int64_t K, size_t *row_bytes)
{
    const size_t rb = dtype_row_bytes(t, K);
    char *w = malloc(rb * (size_t)rows + 64);
    for (int64_t o = 0; o < rows; o++)
        for (int64_t s = 0; s < K / 256; s++) {
            char *bp = w + (size_t)o * rb + (size_t)s * dtype_block_bytes(t);
            if (t == DT_Q6_K) {
                block_q6_K *b = (block_q6_K *)bp;
                fill_bytes(b->ql, sizeof b->ql);
                fill_bytes(b->qh, sizeof b->qh);
                fill_bytes((uint8_t *)b->scales, sizeof b->scales);
                b->d = f32_to_fp16(ldexpf(rng_unif(), -9 - (int)(rng_next() % 4)));
            } else {
                block_q5_K *b = (block_q5_K *)bp;
                fill_bytes(b->scales, sizeof b->scales);
                fill_bytes(b->qh, sizeof b->qh);
                fill_bytes(b->qs, sizeof b->qs);
                b->d = f32_to_fp16(ldexpf(rng_unif(), -7 - (int)(rng_next() % 4)));
                b->dmin = f32_to_fp16(ldexpf(rng_unif(), -4 - (int)(rng_next() % 10)));
            }
        }
    *row_bytes = rb;
    return w;
}

/* Q4_K / Q5_K 6-bit field i (0..7 scales, 8..15 mins) of scales[12], from ggml's description:
 * fields j < 4 are the low 6 bits of bytes j (scale) and j + 4 (min); j >= 4 take the low
 * (scale) or high (min) nibble of byte j + 4 and, above it, the top 2 bits of byte j - 4
 * (scale) or j (min). */
static int k4_field(const uint8_t *sc, int i)
{
    int j = i % 8, is_min = i >= 8;
    if (j < 4) return sc[j + 4 * is_min] % 64;
    int lo = is_min ? sc[j + 4] / 16 : sc[j + 4] % 16;
    return lo + 16 * (sc[is_min ? j : j - 4] / 64);
}

/* The integer quant of element i (< 256) of a super-block: Q6_K 0..63, Q5_K 0..31. */
static int ref_quant(int t, const void *blk, int i)
{
    if (t == DT_Q6_K) { /* 128-element halves; in each, four runs of 32 */
        const block_q6_K *b = blk;
        int half = i / 128, run = i % 128 / 32, l = i % 32;
        int byte = b->ql[64 * half + l + (run % 2 ? 32 : 0)];
        int low = run < 2 ? byte % 16 : byte / 16;
        int top = b->qh[32 * half + l] / (1 << (2 * run)) % 4;
        return low + 16 * top;
    }
    const block_q5_K *b = blk;
    int sub = i / 32, l = i % 32;
    int byte = b->qs[32 * (sub / 2) + l];
    int low = sub % 2 ? byte / 16 : byte % 16;
    return low + 16 * (b->qh[l] / (1 << sub) % 2);
}

/* Element k of a row, exact in double then rounded once (ggml's factor order for the sign of
 * zero). */
static float ref_weight(int t, const void *row, int64_t k)
{
    const int i = (int)(k % 256);
    const void *blk = (const char *)row + (size_t)(k / 256) * dtype_block_bytes(t);
    if (t == DT_Q6_K) {
        const block_q6_K *b = blk;
        double ds = (double)fp16_to_f32(b->d) * b->scales[i / 16];
        return (float)(ds * (ref_quant(t, blk, i) - 32));
    }
    const block_q5_K *b = blk;
    int sub = i / 32;
    return (float)((double)fp16_to_f32(b->d) * k4_field(b->scales, sub) * ref_quant(t, blk, i) -
                   (double)fp16_to_f32(b->dmin) * k4_field(b->scales, 8 + sub));
}

/* kc_matmul_ref_t's route: the formula in double over kern_q8k_quantize(x) in *out; *mag: the
 * sum its bound scales with, *kbound its factor of u; *qerr: its allowed distance from the exact
 * product of the widened weights with x. */
static int ref_i8(int t, const void *row, const float *x, int64_t K, double *out, double *mag,
                  double *qerr, double *kbound)
{
    const int64_t nsb = K / 256;
    kern_q8k_t *xq = malloc((size_t)nsb * sizeof *xq);
    kern_q8k_quantize(x, K, xq);
    double ref = 0, m = 0, qe = 0;
    for (int64_t s = 0; s < nsb; s++) {
        const void *blk = (const char *)row + (size_t)s * dtype_block_bytes(t);
        const double dx = xq[s].d;
        if (t == DT_Q6_K) {
            const block_q6_K *b = blk;
            const double d = fp16_to_f32(b->d);
            for (int j = 0; j < 16; j++) {
                double p = 0, ap = 0;
                for (int i = 16 * j; i < 16 * j + 16; i++) {
                    int q = ref_quant(t, blk, i) - 32;
                    p += (double)q * xq[s].q[i];
                    ap += fabs((double)q * xq[s].q[i]);
                }
                ref += d * dx * b->scales[j] * p;
                m += fabs(d * dx * b->scales[j]) * ap;
            }
        } else {
            const block_q5_K *b = blk;
            const double d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
            for (int j = 0; j < 8; j++) {
                const int sc = k4_field(b->scales, j), mn = k4_field(b->scales, 8 + j);
                double p = 0, ap = 0;
                for (int i = 32 * j; i < 32 * j + 32; i++) {
                    p += (double)ref_quant(t, blk, i) * xq[s].q[i];
                    ap += (double)ref_quant(t, blk, i) * abs(xq[s].q[i]);
                }
                ref += d * dx * sc * p - dmin * dx * mn * xq[s].bsum[j];
                m += fabs(d * dx) * sc * ap + fabs(dmin * dx) * mn * abs(xq[s].bsum[j]);
            }
        }
        for (int i = 0; i < 256; i++) {
            double w = ref_weight(t, row, 256 * s + i);
            qe += fabs(w) * (0.5001 * dx) + ldexp(1.0, -23) * fabs(w * dx * xq[s].q[i]);
        }
    }
    free(xq);
    *out = ref;
    *mag = m;
    *qerr = qe;
    *kbound = (double)(K / 256 + 8);
    return 1;
}

static void test_dequant(const kern_table_t *const *tabs)
{
    for (int ti = 0; ti < 2; ti++) {
        const int t = TYPES[ti];
        const int64_t K = 1536;
        size_t rb;
        char *W = make_weights(t, 3, K, &rb);
        /* row 2: extremes */
        if (t == DT_Q6_K) {
            block_q6_K *b = (block_q6_K *)(W + 2 * rb);
            for (int j = 0; j < 16; j++) b[0].scales[j] = (int8_t)(j % 2 ? -128 : 127);
            memset(b[1].ql, 0, sizeof b[1].ql), memset(b[1].qh, 0, sizeof b[1].qh); /* q 0 */
            memset(b[2].ql, 0xff, sizeof b[2].ql), memset(b[2].qh, 0xff, sizeof b[2].qh); /* 63 */
            memset(b[3].ql, 0, sizeof b[3].ql), memset(b[3].qh, 0xaa, sizeof b[3].qh); /* 32 */
            b[3].d = f32_to_fp16(-0.25f); /* zero weights of either sign */
        } else {
            block_q5_K *b = (block_q5_K *)(W + 2 * rb);
            for (int i = 0; i < Q4K_SCALE_BYTES; i++) b[0].scales[i] = 0xff, b[1].scales[i] = 0;
            memset(b[0].qh, 0xff, sizeof b[0].qh), memset(b[0].qs, 0xff, sizeof b[0].qs);
            b[0].d = f32_to_fp16(1.0f / 64), b[0].dmin = f32_to_fp16(-0.5f);
            memset(b[2].qh, 0, sizeof b[2].qh), memset(b[2].qs, 0, sizeof b[2].qs); /* q 0 */
        }
        float *out = malloc((size_t)K * 4);
        int bad = 0, negzero = 0;
        for (int r = 0; r < 3; r++) {
            const char *row = W + (size_t)r * rb;
            for (int i = -1; i < N_ISAS; i++) {
                if (i >= 0 && !tabs[i]) continue;
                memset(out, 0x7f, (size_t)K * 4);
                if (i < 0) dtype_dequant_row(t, row, out, K);
                else tabs[i]->dequant_row(t, row, out, K);
                for (int64_t k = 0; k < K; k++) {
                    float w = ref_weight(t, row, k);
                    if (memcmp(&w, &out[k], 4) != 0) bad++;
                    if (i < 0 && w == 0.0f && signbit(w)) negzero++;
                }
            }
        }
        CHECKF(bad == 0, "%s dequantisation: %d elements differ from the reference", dtype_name(t),
               bad);
        if (t == DT_Q6_K) CHECK(negzero > 0); /* the extremes reach -0.0 */
        if (t == DT_Q5_K) { /* all-ones fields: 63 d q - 63 dmin with q = 31 */
            const block_q5_K *b = (const block_q5_K *)(W + 2 * rb);
            dtype_dequant_row(t, b, out, 256);
            CHECK(out[200] == (float)(63.0 * fp16_to_f32(b->d) * 31 - 63.0 * fp16_to_f32(b->dmin)));
        }
        free(W);
        free(out);
    }
}

/* matmul against the double reference (kern_check.h): N rows, T tokens, strided x and y; a
 * zero block in token 1 (dx = 0). */
static const kc_matmul_ref_t ACC = {.N = 37, .x_pad = 3, .y_pad = 5, .zero_block = 1,
                                    .make_weights = make_weights, .rng = &rng_state,
                                    .weight = ref_weight, .route = ref_i8};

int main(void)
{
    const kern_table_t *tabs[N_ISAS];
    kc_tables(tabs);
    CHECK(dtype_supported(DT_Q6_K) && dtype_supported(DT_Q5_K));
    CHECK(dtype_block_bytes(DT_Q6_K) == 210 && dtype_block_bytes(DT_Q5_K) == 176);
    CHECK(dtype_block_bytes(DT_Q6_K) == dtype_ggml_block_bytes(DT_Q6_K));
    CHECK(dtype_block_bytes(DT_Q5_K) == dtype_ggml_block_bytes(DT_Q5_K));
    CHECK(strcmp(dtype_name(DT_Q6_K), "q6_K") == 0 && strcmp(dtype_name(DT_Q5_K), "q5_K") == 0);
    test_dequant(tabs);
    static const int64_t KS[] = {256, 512, 768, 1536};
    static const int TS[] = {1, 2, 3, 4, 5, 8, 9, 13};
    for (int i = 0; i < N_ISAS; i++) {
        const kern_table_t *kt = tabs[i];
        if (!kt) continue;
        for (int ti = 0; ti < 2; ti++) {
            const int t = TYPES[ti];
            for (size_t ki = 0; ki < sizeof KS / sizeof KS[0]; ki++)
                for (size_t j = 0; j < sizeof TS / sizeof TS[0]; j++)
                    if (ki < 2 || TS[j] % 4 == 1) kc_matmul_accuracy(kt, t, KS[ki], TS[j], &ACC);
            CHECK(kt->matmul(t, NULL, 0, 128, NULL, 128, NULL, 1, 1, 0, 1) == -1);
            CHECK(kt->matmul(t, NULL, 0, 288, NULL, 288, NULL, 1, 1, 0, 1) == -1);
            kc_batch_invariance(kt, t, 29, 256, i == 0 ? 12 : 40,
                                make_weights, &rng_state);
            kc_batch_invariance(kt, t, 29, 1536, i == 0 ? 3 : 12,
                                make_weights, &rng_state);
        }
    }
    if (tabs[2] && tabs[3])
        for (int ti = 0; ti < 2; ti++)
            kc_same_bits(tabs[KC_AVX512], tabs[KC_AVX512_VNNI], TYPES[ti], 768, make_weights,
                         &rng_state);
    /* Q6_K and Q5_K packed (the avx512-vnni table's pack: kernels.h "Packed Q4_K, Q5_K, Q6_K,
     * IQ4_XS and Q8_0"): the same checks through a matmul that packs W first */
    const kern_table_t *vn = tabs[KC_AVX512_VNNI];
    if (vn) {
        CHECK(vn->pack_bytes(DT_Q6_K, 37, 768) == 3 * 3 * 3392);
        CHECK(vn->pack_bytes(DT_Q5_K, 37, 768) == 3 * 3 * 2816);
        CHECK(vn->pack_bytes(DT_Q6_K, 37, 288) == 0 && vn->pack_bytes(DT_Q5_K, 37, 288) == 0);
        kern_table_t pk = *vn;
        pk.name = "avx512-vnni packed";
        pk.matmul = kc_packed_matmul;
        for (int ti = 0; ti < 2; ti++) {
            const int t = TYPES[ti];
            for (size_t ki = 0; ki < sizeof KS / sizeof KS[0]; ki++)
                for (int T = 1; T <= 21; T += 4) kc_matmul_accuracy(&pk, t, KS[ki], T, &ACC);
            kc_batch_invariance(&pk, t, 29, 256, 24, make_weights, &rng_state);
            kc_batch_invariance(&pk, t, 45, 768, 14, make_weights, &rng_state);
            kc_batch_invariance(&pk, t, 29, 1536, 12, make_weights, &rng_state);
        }
    }
    return check_exit();
}
