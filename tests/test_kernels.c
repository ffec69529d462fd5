/* tests/test_kernels.c: CPU kernels (every available ISA x every weight type) and thread pool.
 *
 * Error bounds. matmul/dot accumulate K products in F32 in some fixed order; for any order the
 * rounding error is at most gamma_K * sum_k |w_k x_k| with gamma_K = K u / (1 - K u), u = 2^-24
 * (Higham, Accuracy and Stability, 3.1; an FMA only removes roundings). The weights are widened
 * exactly, so the double-precision reference over the widened weights is the exact answer and
 * the per-element check |y - ref| <= (K + 4) u sum|w x| is a rigorous bound, not a tuning knob.
 * On top, the normalised squared error over a whole output (NMSE) must be < 1e-12 -- a random
 * walk of K roundings gives ~1e-14; an indexing or tail bug gives O(1).
 *
 * Types: F32, F16, BF16, Q8_0, Q4_0 and Q4_K (random blocks: every bit pattern of the quants
 * and, for Q4_K, of the packed 6-bit scales and mins). The reference value of a Q4_K weight is
 * the one F32 rounding of d*sc*q - dmin*m (kernels.h), computed here independently. Q4_K, Q8_0
 * and Q4_0 take int8 activations (kernels.h): their reference is the route's formula in double
 * over x as kern_q8k_quantize / kern_q8_quantize round it, with the bound (K/256 + 8) u (Q4_K)
 * or (K/32 + 8) u (Q8_0, Q4_0) times the sum of the formula's terms' |.|; and that reference
 * must lie within x's 8-bit rounding of the exact product (ref_q4k_i8, ref_b32_i8).
 *
 * Batch invariance (kernels.h): every (t, o) of a batch of T tokens over rows [o0, o1) must be
 * bit-identical to the same token computed alone over a single row, for T = 1..70, ranges
 * starting and ending at odd rows, and neighbouring tokens that differ.
 *
 * Packed Q4_K and Q8_0 (the avx512-vnni table's pack / matmul_packed, where this CPU has it): the
 * same accuracy, batch invariance and cross-ISA checks, through a matmul that packs its W first;
 * row counts that are not multiples of 16, ranges that start or end inside a group, Q8_0 rows
 * of an odd number of blocks. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kern_check.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/threadpool.h"
#include "engine/dtype.h"

static const int WTYPES[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K};
#define N_WTYPES 6
#define N_ISAS KC_N_ISAS

static uint64_t rng_state = 0x9e3779b97f4a7c15ull; /* the inputs: drawn by kern_check.h */
static uint64_t rng_next(void) { return kc_rng_next(&rng_state); }
static float rng_unif(void) { return kc_rng_unif(&rng_state); }
static float *make_vec(int64_t n) { return kc_make_vec(&rng_state, n); }

/* Random weights: rows x K of type t, row_bytes = dtype_row_bytes(t, K). */
static void *make_weights(int t, int64_t rows, int64_t K, size_t *row_bytes)
{
    size_t rb = dtype_row_bytes(t, K);
    char *w = malloc(rb * (size_t)rows + 64);
    for (int64_t o = 0; o < rows; o++) {
        char *row = w + (size_t)o * rb;
        switch (t) {
        case DT_F32:
            for (int64_t k = 0; k < K; k++) ((float *)row)[k] = rng_unif();
            break;
        case DT_F16:
            for (int64_t k = 0; k < K; k++) ((uint16_t *)row)[k] = f32_to_fp16(rng_unif());
            break;
        case DT_BF16:
            for (int64_t k = 0; k < K; k++) ((uint16_t *)row)[k] = f32_to_bf16(rng_unif());
            break;
        case DT_Q8_0:
            for (int64_t b = 0; b < K / QK8_0; b++) {
                block_q8_0 *blk = (block_q8_0 *)row + b;
                blk->d = f32_to_fp16(0.01f * (1.5f + rng_unif()));
                for (int i = 0; i < QK8_0; i++) blk->qs[i] = (int8_t)((int)(rng_next() % 256) - 128);
            }
            break;
        case DT_Q4_0:
            for (int64_t b = 0; b < K / QK4_0; b++) {
                block_q4_0 *blk = (block_q4_0 *)row + b;
                blk->d = f32_to_fp16(0.02f * (1.5f + rng_unif()));
                for (int i = 0; i < QK4_0 / 2; i++) blk->qs[i] = (uint8_t)rng_next();
            }
            break;
        case DT_Q4_K:
            /* every bit pattern of scales and quants; d and dmin of either sign and of
             * exponents far apart (the min term then dominates or vanishes) */
            for (int64_t b = 0; b < K / QK_K; b++) {
                block_q4_K *blk = (block_q4_K *)row + b;
                blk->d = f32_to_fp16(ldexpf(rng_unif(), -6 - (int)(rng_next() % 4)));
                blk->dmin = f32_to_fp16(ldexpf(rng_unif(), -4 - (int)(rng_next() % 10)));
                for (int i = 0; i < Q4K_SCALE_BYTES; i++) blk->scales[i] = (uint8_t)rng_next();
                for (int i = 0; i < QK_K / 2; i++) blk->qs[i] = (uint8_t)rng_next();
            }
            break;
        }
    }
    *row_bytes = rb;
    return w;
}

/* 6-bit field i (0..15: 8 scales then 8 mins) of a Q4_K scales[12], read bit by bit from the
 * packing as ggml describes it (written independently of engine/dtype.h's q4k_scale_min):
 * fields 0..3 (scales 0-3) and 8..11 (mins 0-3) are the low 6 bits of bytes 0..3 and 4..7;
 * scale j >= 4 = low nibble of byte j+4 | (top 2 bits of byte j-4) << 4; min j >= 4 = high
 * nibble of byte j+4 | (top 2 bits of byte j) << 4. */
static int q4k_field(const uint8_t *sc, int i)
{
    int j = i & 7, is_min = i >= 8;
    if (j < 4) return sc[j + 4 * is_min] % 64;
    int lo = is_min ? sc[j + 4] / 16 : sc[j + 4] % 16;
    int hi = sc[is_min ? j : j - 4] / 64;
    return lo + 16 * hi;
}

/* Exact F32 value of element k of a row (independent of the kernels). Q4_K: the single F32
 * rounding of d*sc*q - dmin*m, computed exactly in double then rounded once to float. */
static float ref_weight(int t, const void *row, int64_t k)
{
    switch (t) {
    case DT_F32: return ((const float *)row)[k];
    case DT_F16: return fp16_to_f32(((const uint16_t *)row)[k]);
    case DT_BF16: return bf16_to_f32(((const uint16_t *)row)[k]);
    case DT_Q4_0: {
        const block_q4_0 *b = (const block_q4_0 *)row + k / 32;
        int i = (int)(k % 32), q = i < 16 ? b->qs[i] % 16 : b->qs[i - 16] / 16;
        return (float)((double)fp16_to_f32(b->d) * (q - 8));
    }
    case DT_Q4_K: {
        const block_q4_K *b = (const block_q4_K *)row + k / 256;
        int i = (int)(k % 256), sub = i / 32, chunk = i / 64, l = i % 32;
        uint8_t byte = b->qs[32 * chunk + l];
        int q = sub % 2 ? byte / 16 : byte % 16;
        double v = (double)fp16_to_f32(b->d) * q4k_field(b->scales, sub) * q -
                   (double)fp16_to_f32(b->dmin) * q4k_field(b->scales, 8 + sub);
        return (float)v;
    }
    default: {
        const block_q8_0 *b = (const block_q8_0 *)row + k / QK8_0;
        return fp16_to_f32(b->d) * (float)b->qs[k % QK8_0];
    }
    }
}

/* Elements per block of the types under test (1 for the plain ones). */
static int64_t blk_of(int t)
{
    return t == DT_Q4_K ? 256 : t == DT_Q8_0 || t == DT_Q4_0 ? 32 : 1;
}

/* Q4_K's int8 route (kernels.h): the exact value (in double) of its formula for a row and a
 * token x quantised by kern_q8k_quantize; *mag = the sum its F32 rounding bound scales with;
 * *qerr = a bound on its distance from the exact dot product of the widened weights with x
 * (x rounded to 8 bits, at most dx / 2 per element plus a few ulps, and the weights' one
 * F32 rounding, which this formula does not make). */
static double ref_q4k_i8(const void *row, const float *x, int64_t K, double *mag, double *qerr)
{
    const int64_t nsb = K / 256;
    kern_q8k_t *xq = malloc((size_t)nsb * sizeof *xq);
    kern_q8k_quantize(x, K, xq);
    double ref = 0, m = 0, qe = 0;
    for (int64_t s = 0; s < nsb; s++) {
        const block_q4_K *b = (const block_q4_K *)row + s;
        const double dx = xq[s].d, d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
        for (int j = 0; j < 8; j++) {
            const int sc = q4k_field(b->scales, j), mn = q4k_field(b->scales, 8 + j);
            double p = 0, ap = 0;
            for (int l = 0; l < 32; l++) {
                const int64_t k = 256 * s + 32 * j + l;
                uint8_t byte = b->qs[32 * (j / 2) + l];
                int q = j % 2 ? byte / 16 : byte % 16;
                p += (double)q * xq[s].q[32 * j + l];
                ap += (double)q * abs(xq[s].q[32 * j + l]);
                double w = ref_weight(DT_Q4_K, row, k);
                qe += fabs(w) * (0.5001 * dx) + ldexp(1.0, -23) * fabs(w * dx * xq[s].q[32 * j + l]);
            }
            ref += d * dx * sc * p - dmin * dx * mn * xq[s].bsum[j];
            m += fabs(d * dx) * sc * ap + fabs(dmin * dx) * mn * abs(xq[s].bsum[j]);
        }
    }
    free(xq);
    *mag = m;
    if (qerr) *qerr = qe;
    return ref;
}

/* The int8 route of Q8_0 and Q4_0 (kernels.h), as ref_q4k_i8: sum over blocks b of
 * dw_b * dx_b * P_b, with the integer weights Q8_0's quants or Q4_0's nibbles - 8. */
static double ref_b32_i8(int t, const void *row, const float *x, int64_t K, double *mag,
                         double *qerr)
{
    const int64_t nb = K / 32;
    int8_t *xq = malloc((size_t)(K > 0 ? K : 1));
    float *xd = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(float));
    kern_q8_quantize(x, K, xq, xd);
    double ref = 0, m = 0, qe = 0;
    for (int64_t b = 0; b < nb; b++) {
        uint16_t dh;
        int wi[32];
        if (t == DT_Q8_0) {
            const block_q8_0 *bl = (const block_q8_0 *)row + b;
            dh = bl->d;
            for (int l = 0; l < 32; l++) wi[l] = bl->qs[l];
        } else {
            const block_q4_0 *bl = (const block_q4_0 *)row + b;
            dh = bl->d;
            for (int l = 0; l < 16; l++) wi[l] = (bl->qs[l] & 15) - 8, wi[l + 16] = (bl->qs[l] >> 4) - 8;
        }
        const double s = (double)fp16_to_f32(dh) * xd[b];
        double p = 0, ap = 0;
        for (int l = 0; l < 32; l++) {
            const int64_t k = 32 * b + l;
            p += (double)wi[l] * xq[k];
            ap += fabs((double)wi[l] * xq[k]);
            double w = ref_weight(t, row, k);
            qe += fabs(w) * (0.5001 * xd[b]) + ldexp(1.0, -23) * fabs(w * xd[b] * xq[k]);
        }
        ref += s * p;
        m += fabs(s) * ap;
    }
    free(xq);
    free(xd);
    *mag = m;
    if (qerr) *qerr = qe;
    return ref;
}

/* The int8 routes' reference (Q4_K, Q8_0, Q4_0) and its bound's K factor; 0 for the other types. */
static int ref_i8(int t, const void *row, const float *x, int64_t K, double *ref, double *mag,
                  double *qerr, double *kbound)
{
    if (t == DT_Q4_K) {
        *ref = ref_q4k_i8(row, x, K, mag, qerr);
        *kbound = (double)(K / 256 + 8);
        return 1;
    }
    if (t == DT_Q8_0 || t == DT_Q4_0) {
        *ref = ref_b32_i8(t, row, x, K, mag, qerr);
        *kbound = (double)(K / 32 + 8);
        return 1;
    }
    return 0;
}

/* Matmul accuracy (kern_check.h): N rows, T tokens, strided x and y. */
static const kc_matmul_ref_t ACC = {.N = 37, .x_pad = 3, .y_pad = 5, .nmse = 1,
                                    .make_weights = make_weights, .rng = &rng_state,
                                    .weight = ref_weight, .route = ref_i8};

/* Two ISAs agree within the sum of their bounds. */
static void test_isa_cross(const kern_table_t *a, const kern_table_t *b, int t, int64_t K)
{
    const int64_t N = 21;
    const int T = 9;
    size_t rb;
    void *W = make_weights(t, N, K, &rb);
    float *x = make_vec(K * T);
    float *ya = malloc((size_t)(N * T) * sizeof(float)), *yb = malloc((size_t)(N * T) * sizeof(float));
    CHECK(a->matmul(t, W, rb, K, x, K, ya, N, T, 0, N) == 0);
    CHECK(b->matmul(t, W, rb, K, x, K, yb, N, T, 0, N) == 0);
    int bad = 0;
    for (int tk = 0; tk < T; tk++)
        for (int64_t o = 0; o < N; o++) {
            const void *row = (const char *)W + (size_t)o * rb;
            double mag = 0, kb = (double)(K + 4), ref;
            if (!ref_i8(t, row, x + tk * K, K, &ref, &mag, NULL, &kb)) {
                for (int64_t k = 0; k < K; k++)
                    mag += fabs((double)ref_weight(t, row, k) * x[tk * K + k]);
            }
            double bound = 2.0 * kb * ldexp(1.0, -24) * mag;
            if (!(fabs((double)ya[tk * N + o] - yb[tk * N + o]) <= bound)) bad++;
        }
    CHECKF(bad == 0, "%s vs %s %s K=%lld: %d differ beyond bound", a->name, b->name,
           dtype_name(t), (long long)K, bad);
    free(W);
    free(x);
    free(ya);
    free(yb);
}

/* kern_table_t.pack of the table that has one (avx512-vnni): what it packs, and the packed routes
 * of Q4_K, Q8_0 and F16 through the checks every matmul gets (kernels.h "Packed ..." gives their
 * bound: matmul's). Q5_K's and Q6_K's: test_kernels_q56k; IQ4_XS's: test_qleg. */
static void test_packed(const kern_table_t *kt, const kern_table_t *other)
{
    CHECK(kt->pack_bytes(DT_Q4_K, 37, 768) == 3 * 3 * 2304);
    CHECK(kt->pack_bytes(DT_Q4_K, 32, 256) == 2 * 2304);
    CHECK(kt->pack_bytes(DT_Q4_K, 37, 288) == 0); /* K not a multiple of 256 */
    CHECK(kt->pack_bytes(DT_Q4_K, 0, 256) == 0);
    CHECK(kt->pack_bytes(DT_Q8_0, 37, 96) == 3 * 2 * 1088); /* 3 blocks: a pair and a half */
    CHECK(kt->pack_bytes(DT_Q8_0, 16, 576) == 9 * 1088);
    CHECK(kt->pack_bytes(DT_Q8_0, 16, 48) == 0);
    CHECK(kt->pack_bytes(DT_F16, 37, 96) == 3 * 3 * 1024);
    CHECK(kt->pack_bytes(DT_F16, 16, 48) == 0); /* K not a multiple of 32 */
    CHECK(kt->matmul_packed(DT_F16, NULL, 48, NULL, 48, NULL, 1, 1, 0, 0) == -1);
    for (int wi = 0; wi < N_WTYPES; wi++)
        if (WTYPES[wi] != DT_Q4_K && WTYPES[wi] != DT_Q8_0 && WTYPES[wi] != DT_F16) {
            CHECK(kt->pack_bytes(WTYPES[wi], 37, 768) == 0);
            CHECK(kt->matmul_packed(WTYPES[wi], NULL, 768, NULL, 768, NULL, 1, 1, 0, 0) == -1);
        }
    /* packed in parts at group boundaries (kernels.h): the same bytes as the whole */
    static const int PT[] = {DT_Q4_K, DT_Q8_0, DT_F16};
    for (int i = 0; i < 3; i++) {
        const int64_t N = 37, K = PT[i] == DT_Q4_K ? 512 : 96;
        size_t rb;
        void *W = make_weights(PT[i], N, K, &rb);
        const size_t n = kt->pack_bytes(PT[i], N, K), g = kt->pack_bytes(PT[i], 16, K);
        unsigned char *whole = malloc(n), *parts = malloc(n);
        kt->pack(PT[i], W, rb, N, K, whole);
        kt->pack(PT[i], W, rb, 16, K, parts);
        kt->pack(PT[i], (const char *)W + 16 * rb, rb, N - 16, K, parts + g);
        CHECKF(memcmp(whole, parts, n) == 0, "%s packed in parts differs", dtype_name(PT[i]));
        free(W);
        free(whole);
        free(parts);
    }
    kern_table_t pk = *kt;
    pk.name = "avx512-vnni packed";
    pk.matmul = kc_packed_matmul;
    /* per type: the row lengths of the accuracy checks, those of the three invariance checks
     * (the middle one also for the cross-ISA check); Q8_0 with odd block counts too */
    static const struct {
        int t, nks;
        int64_t ks[5], inv[3];
    } PC[] = {{DT_Q4_K, 4, {256, 512, 768, 1536}, {256, 768, 1536}},
              {DT_Q8_0, 5, {32, 64, 96, 576, 1536}, {96, 576, 1536}},
              {DT_F16, 5, {32, 64, 96, 576, 2048}, {96, 576, 2048}}};
    for (size_t i = 0; i < sizeof PC / sizeof PC[0]; i++) {
        for (int ki = 0; ki < PC[i].nks; ki++)
            for (int T = 1; T <= 21; T += 4) kc_matmul_accuracy(&pk, PC[i].t, PC[i].ks[ki], T, &ACC);
        kc_batch_invariance(&pk, PC[i].t, 29, PC[i].inv[0], 24, make_weights, &rng_state);
        kc_batch_invariance(&pk, PC[i].t, 45, PC[i].inv[1], 14, make_weights, &rng_state);
        kc_batch_invariance(&pk, PC[i].t, 29, PC[i].inv[2], 14, make_weights, &rng_state);
        test_isa_cross(&pk, other, PC[i].t, PC[i].inv[1]);
    }
}

static void test_elementwise(const kern_table_t *kt)
{
    static const int64_t NS[] = {1, 7, 16, 33, 64, 100, 576, 1537};
    for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++) {
        int64_t n = NS[ni];
        float *a = make_vec(n), *b = make_vec(n), *c = make_vec(n + 1), *d = malloc((size_t)(n + 1) * 4);

        /* dequant_row: exact, bitwise against dtype.h */
        for (int wi = 0; wi < N_WTYPES; wi++) {
            int t = WTYPES[wi];
            int64_t K = (n + blk_of(t) - 1) / blk_of(t) * blk_of(t);
            size_t rb;
            void *W = make_weights(t, 1, K, &rb);
            float *out = malloc((size_t)K * 4);
            kt->dequant_row(t, W, out, K);
            int bad = 0;
            for (int64_t k = 0; k < K; k++) {
                float r = ref_weight(t, W, k);
                if (memcmp(&r, &out[k], 4) != 0) bad++;
            }
            CHECKF(bad == 0, "%s dequant_row %s n=%lld", kt->name, dtype_name(t), (long long)K);
            free(W);
            free(out);
        }

        /* dot */
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            ref += (double)a[i] * b[i];
            mag += fabs((double)a[i] * b[i]);
        }
        double got = kt->dot_f32(a, b, n);
        CHECKF(fabs(got - ref) <= (double)(n + 4) * ldexp(1.0, -24) * mag, "%s dot n=%lld",
               kt->name, (long long)n);

        /* axpy: one or two roundings per element; guard element untouched */
        memcpy(d, c, (size_t)(n + 1) * 4);
        kt->axpy_f32(0.75f, a, d, n);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double r = (double)c[i] + 0.75 * a[i];
            if (fabs(d[i] - r) > ldexp(1.0, -23) * (fabs(c[i]) + fabs(0.75 * a[i]))) bad++;
        }
        if (d[n] != c[n]) bad++;
        CHECKF(bad == 0, "%s axpy n=%lld", kt->name, (long long)n);

        /* add: exact */
        memcpy(d, c, (size_t)(n + 1) * 4);
        kt->add(d, a, n);
        bad = 0;
        for (int64_t i = 0; i < n; i++)
            if (d[i] != c[i] + a[i]) bad++;
        if (d[n] != c[n]) bad++;
        CHECKF(bad == 0, "%s add n=%lld", kt->name, (long long)n);

        /* rmsnorm: relative error a few ulp (sum of squares has n roundings, all positive) */
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)a[i] * a[i];
        double sc = 1.0 / sqrt(ss / (double)n + 1e-5);
        kt->rmsnorm(a, b, 1e-5f, d, n);
        bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double r = a[i] * sc * b[i];
            if (fabs(d[i] - r) > (8.0 + (double)n) * ldexp(1.0, -24) * fabs(r) + 1e-30) bad++;
        }
        CHECKF(bad == 0, "%s rmsnorm n=%lld", kt->name, (long long)n);
        /* in place */
        memcpy(d, a, (size_t)n * 4);
        kt->rmsnorm(d, b, 1e-5f, d, n);
        bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double r = a[i] * sc * b[i];
            if (fabs(d[i] - r) > (8.0 + (double)n) * ldexp(1.0, -24) * fabs(r) + 1e-30) bad++;
        }
        CHECKF(bad == 0, "%s rmsnorm in place n=%lld", kt->name, (long long)n);

        /* silu_mul over a wide range of gates: relative error <= 1e-6 (a handful of ulp) */
        for (int64_t i = 0; i < n; i++) d[i] = a[i] * 12.0f;
        memcpy(c, d, (size_t)n * 4);
        kt->silu_mul(d, b, d, n); /* out aliases gate */
        bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double g = c[i];
            double r = g / (1.0 + exp(-g)) * b[i];
            if (fabs(d[i] - r) > 1e-6 * fabs(r) + 1e-37) bad++;
        }
        CHECKF(bad == 0, "%s silu_mul n=%lld", kt->name, (long long)n);
        free(a);
        free(b);
        free(c);
        free(d);
    }
    /* silu at the extremes: finite, and the right limits */
    float g[4] = {-200.0f, -90.0f, 90.0f, 200.0f}, u[4] = {1, 1, 1, 1}, o[4];
    kt->silu_mul(g, u, o, 4);
    CHECKF(fabsf(o[0]) < 1e-30f && fabsf(o[1]) < 1e-30f && o[2] == 90.0f && o[3] == 200.0f,
           "%s silu extremes %g %g %g %g", kt->name, o[0], o[1], o[2], o[3]);

    /* f16 -> f32: every non-NaN half, bitwise */
    {
        uint16_t *h = malloc(65536 * 2);
        float *f = malloc(65536 * 4);
        for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
        kt->f16_to_f32(h, f, 65535); /* odd length: tail path */
        int bad = 0;
        for (int i = 0; i < 65535; i++) {
            float r = fp16_to_f32(h[i]);
            if (isnan(r) ? !isnan(f[i]) : memcmp(&r, &f[i], 4) != 0) bad++;
        }
        CHECKF(bad == 0, "%s f16_to_f32: %d differ", kt->name, bad);
        free(h);
        free(f);
    }
    /* f32 -> f16: round to nearest even over normal, subnormal, overflow and tie values */
    {
        const int n = 20003;
        float *f = malloc((size_t)n * 4);
        uint16_t *h = malloc((size_t)n * 2 + 2);
        for (int i = 0; i < n; i++) {
            float v = rng_unif();
            int e = (int)(rng_next() % 48) - 30; /* 2^-30 .. 2^17: subnormal .. overflow */
            f[i] = ldexpf(v, e);
        }
        f[0] = 65504.0f; f[1] = 65520.0f; f[2] = -65519.0f; f[3] = 0.0f; f[4] = -0.0f;
        f[5] = 1.0f + ldexpf(1.0f, -11); /* a tie */
        f[6] = ldexpf(1.0f, -25); f[7] = ldexpf(3.0f, -25); f[8] = INFINITY;
        h[n] = 0xbeef;
        kt->f32_to_f16(f, h, n);
        int bad = 0;
        for (int i = 0; i < n; i++)
            if (h[i] != f32_to_fp16(f[i])) bad++;
        CHECKF(bad == 0 && h[n] == 0xbeef, "%s f32_to_f16: %d differ", kt->name, bad);
        free(f);
        free(h);
    }
}

/* engine/dtype.c's portable dequantisation gives the same bits as ref_weight, for every type,
 * including hand-made Q4_K blocks that use the extreme 6-bit scales and mins. */
/* kern_q8k_quantize: |x - d q| <= d/2 (+ ulps), q in [-127, 127], the block's max|x| maps to
 * +-127, bsum = sums of q; zero blocks give d = 0; Inf or NaN give d = NaN. */
static void test_q8k_quantize(void)
{
    const int64_t K = 1024;
    float *x = make_vec(K);
    for (int64_t k = 0; k < 256; k++) x[k] *= 1e-30f;     /* tiny */
    for (int64_t k = 512; k < 768; k++) x[k] = 0.0f;      /* zeros */
    x[900] = -37.5f;                                       /* a block with one large element */
    kern_q8k_t b[4];
    kern_q8k_quantize(x, K, b);
    int bad = 0;
    for (int s = 0; s < 4; s++) {
        float amax = 0;
        for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[256 * s + i]));
        if (b[s].d != amax / 127.0f) bad++;
        int hit = 0;
        for (int j = 0; j < 8; j++) {
            int sum = 0;
            for (int i = 32 * j; i < 32 * j + 32; i++) {
                int q = b[s].q[i];
                sum += q;
                if (q < -127 || q > 127) bad++;
                if (abs(q) == 127) hit = 1;
                double e = fabs((double)x[256 * s + i] - (double)b[s].d * q);
                if (!(e <= 0.5001 * b[s].d)) bad++;
            }
            if (b[s].bsum[j] != sum) bad++;
        }
        if (s != 2 && !hit) bad++;
    }
    CHECKF(bad == 0, "kern_q8k_quantize: %d bad", bad);
    CHECK(b[2].d == 0.0f);
    x[3] = INFINITY;
    x[300] = NAN;
    kern_q8k_quantize(x, 512, b);
    CHECK(isnan(b[0].d) && isnan(b[1].d));
    free(x);
}

/* kern_q8_quantize: the same properties per block of 32 (no sums). */
static void test_q8_quantize(void)
{
    const int64_t K = 128;
    float *x = make_vec(K);
    for (int64_t k = 0; k < 32; k++) x[k] *= 1e-30f; /* tiny */
    for (int64_t k = 64; k < 96; k++) x[k] = 0.0f;   /* zeros */
    x[100] = -37.5f;                                 /* a block with one large element */
    int8_t q[128];
    float d[4];
    kern_q8_quantize(x, K, q, d);
    int bad = 0;
    for (int b = 0; b < 4; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        if (d[b] != amax / 127.0f) bad++;
        int hit = 0;
        for (int i = 32 * b; i < 32 * b + 32; i++) {
            if (q[i] == -128) bad++;
            if (abs(q[i]) == 127) hit = 1;
            if (!(fabs((double)x[i] - (double)d[b] * q[i]) <= 0.5001 * d[b])) bad++;
        }
        if (b != 2 && !hit) bad++;
        if (b == 2 && (d[b] != 0.0f || hit)) bad++;
    }
    CHECKF(bad == 0, "kern_q8_quantize: %d bad", bad);
    x[3] = INFINITY;
    x[40] = NAN;
    kern_q8_quantize(x, 64, q, d);
    CHECK(isnan(d[0]) && isnan(d[1]));
    free(x);
}

static void test_dequant_reference(void)
{
    for (int wi = 0; wi < N_WTYPES; wi++) {
        int t = WTYPES[wi];
        const int64_t K = 1536;
        size_t rb;
        void *W = make_weights(t, 3, K, &rb);
        if (t == DT_Q4_K) { /* row 2: scale and min fields 0 and 63 in every position */
            block_q4_K *b = (block_q4_K *)((char *)W + 2 * rb);
            for (int i = 0; i < Q4K_SCALE_BYTES; i++) b[0].scales[i] = 0xff, b[1].scales[i] = 0;
            b[2].d = f32_to_fp16(1.0f / 64), b[2].dmin = f32_to_fp16(-0.5f);
        }
        float *out = malloc((size_t)K * 4);
        int bad = 0;
        for (int r = 0; r < 3; r++) {
            const void *row = (const char *)W + (size_t)r * rb;
            dtype_dequant_row(t, row, out, K);
            for (int64_t k = 0; k < K; k++) {
                float w = ref_weight(t, row, k);
                if (memcmp(&w, &out[k], 4) != 0) bad++;
            }
        }
        if (t == DT_Q4_K) { /* all-ones scales: 63 * d * q - 63 * dmin */
            const block_q4_K *b = (const block_q4_K *)W + 2 * rb / sizeof(block_q4_K);
            dtype_dequant_row(t, b, out, 256);
            int q0 = b->qs[0] & 15;
            CHECK(out[0] == (float)(63.0 * fp16_to_f32(b->d) * q0 - 63.0 * fp16_to_f32(b->dmin)));
        }
        CHECKF(bad == 0, "dtype_dequant_row %s: %d elements differ from the reference", dtype_name(t), bad);
        free(W);
        free(out);
    }
}

/* ---- thread pool ---- */

typedef struct {
    atomic_int *calls;  /* [n] */
    atomic_int *inside; /* [n]: calls of part i running now (must never exceed 1) */
    atomic_int wrong_nth, overlap;
    int n, work;        /* work: busy iterations per call */
} tp_job_t;

static void tp_fn(void *arg, int ith, int nth)
{
    tp_job_t *j = arg;
    if (nth != j->n || ith < 0 || ith >= nth) {
        atomic_fetch_add(&j->wrong_nth, 1);
        return;
    }
    if (atomic_fetch_add(&j->inside[ith], 1) != 0) atomic_fetch_add(&j->overlap, 1);
    for (int i = 0; i < j->work; i++) __asm__ __volatile__("" ::: "memory"); /* busy */
    atomic_fetch_sub(&j->inside[ith], 1);
    atomic_fetch_add(&j->calls[ith], 1);
}

static void test_threadpool(void)
{
    char err[128];
    CHECK(tpool_new(0, err, sizeof err) == NULL);
    /* sizes 1..4, and 6 (more threads than this machine's cores); parts of no work (the
     * caller usually takes over parts whose worker has not started) and of some work; pauses
     * long enough for the workers to fall asleep on the futex and be woken again */
    static const int SIZES[] = {1, 2, 3, 4, 6};
    for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
        int n = SIZES[si];
        tpool_t *p = tpool_new(n, err, sizeof err);
        CHECKF(p != NULL, "tpool_new(%d): %s", n, err);
        if (!p) continue;
        CHECK(tpool_size(p) == n);
        atomic_int calls[6], inside[6];
        for (int i = 0; i < 6; i++) {
            atomic_init(&calls[i], 0);
            atomic_init(&inside[i], 0);
        }
        tp_job_t job = {.calls = calls, .inside = inside, .n = n};
        atomic_init(&job.wrong_nth, 0);
        atomic_init(&job.overlap, 0);
        int bad = 0;
        const int rounds = 3000;
        for (int r = 1; r <= rounds; r++) {
            job.work = (r / 100) % 2 ? 2000 : 0;
            tpool_run(p, tp_fn, &job);
            for (int i = 0; i < n; i++)
                if (atomic_load(&calls[i]) != r) bad++;
            if (r % 1000 == 0) usleep(1000); /* workers fall asleep, then are woken */
        }
        CHECKF(bad == 0 && atomic_load(&job.wrong_nth) == 0 && atomic_load(&job.overlap) == 0,
               "tpool n=%d: %d bad rounds, %d wrong nth, %d overlaps", n, bad,
               atomic_load(&job.wrong_nth), atomic_load(&job.overlap));
        tpool_free(p);
    }
    /* tpool_split covers [0, n) in order, sizes differ by at most 1 */
    for (long n = 0; n < 50; n++)
        for (int nth = 1; nth <= 5; nth++) {
            long prev = 0;
            for (int i = 0; i < nth; i++) {
                long lo, hi;
                tpool_split(n, i, nth, &lo, &hi);
                CHECK(lo == prev && hi >= lo && hi - lo <= n / nth + 1);
                prev = hi;
            }
            CHECK(prev == n);
        }
}

int main(void)
{
    const kern_table_t *def = kern_get(NULL);
    CHECK(def != NULL);
    if (def) fprintf(stderr, "kern_get(NULL) = %s\n", def->name);
    CHECK(kern_get("nonsense") == NULL);
    CHECK(kern_get("scalar") != NULL);

    const kern_table_t *tabs[N_ISAS];
    kc_tables(tabs);
    static const int64_t KS[] = {32, 64, 96, 576, 1536};
    static const int64_t KS_K[] = {256, 512, 768, 1536}; /* Q4_K: multiples of 256 */
    static const int64_t KS_ODD[] = {1, 7, 17, 100, 172, 1100};
    for (int i = 0; i < N_ISAS; i++) {
        const kern_table_t *kt = tabs[i];
        if (!kt) continue;
        for (int wi = 0; wi < N_WTYPES; wi++) {
            int t = WTYPES[wi];
            const int64_t bs = blk_of(t);
            if (t == DT_Q4_K) {
                for (size_t ki = 0; ki < sizeof KS_K / sizeof KS_K[0]; ki++)
                    for (int T = 1; T <= 13; T += 4) kc_matmul_accuracy(kt, t, KS_K[ki], T, &ACC);
            } else {
                for (size_t ki = 0; ki < sizeof KS / sizeof KS[0]; ki++)
                    for (int T = 1; T <= 13; T += 4) kc_matmul_accuracy(kt, t, KS[ki], T, &ACC);
            }
            if (bs == 1) {
                for (size_t ki = 0; ki < sizeof KS_ODD / sizeof KS_ODD[0]; ki++)
                    kc_matmul_accuracy(kt, t, KS_ODD[ki], 7, &ACC);
            } else { /* K not a multiple of the block: rejected */
                CHECK(kt->matmul(t, NULL, 0, 48, NULL, 48, NULL, 1, 1, 0, 1) == -1);
                if (bs == 256) CHECK(kt->matmul(t, NULL, 0, 288, NULL, 288, NULL, 1, 1, 0, 1) == -1);
            }
            kc_batch_invariance(kt, t, 29, bs == 256 ? 256 : bs == 32 ? 96 : 100, i == 0 ? 24 : 70,
                                make_weights, &rng_state);
            kc_batch_invariance(kt, t, 29, bs == 256 ? 768 : 576, i == 0 ? 8 : 14,
                                make_weights, &rng_state);
            /* long rows: the avx512 F32 path cuts K into ranges above 1024 */
            kc_batch_invariance(kt, t, 29, bs > 1 ? 1536 : 1100, i == 0 ? 3 : 14,
                                make_weights, &rng_state);
        }
        CHECK(kt->matmul(DT_Q8_1, NULL, 0, 32, NULL, 32, NULL, 1, 1, 0, 1) == -1);
        CHECK(kt->matmul(DT_Q8_K, NULL, 0, 256, NULL, 256, NULL, 1, 1, 0, 1) == -1);
        test_elementwise(kt);
    }
    for (int i = 0; i < N_ISAS; i++)
        for (int j = i + 1; j < N_ISAS; j++) {
            if (!tabs[i] || !tabs[j]) continue;
            for (int wi = 0; wi < N_WTYPES; wi++) {
                int t = WTYPES[wi];
                test_isa_cross(tabs[i], tabs[j], t, t == DT_Q4_K ? 768 : 576);
                if (blk_of(t) == 1) test_isa_cross(tabs[i], tabs[j], t, 100);
            }
        }
    if (tabs[2] && tabs[3]) /* VNNI changes instructions, not values */
        for (int wi = 0; wi < N_WTYPES; wi++)
            kc_same_bits(tabs[KC_AVX512], tabs[KC_AVX512_VNNI], WTYPES[wi], WTYPES[wi] == DT_Q4_K ? 768 : 576, make_weights,
                         &rng_state);
    if (tabs[KC_AVX512_VNNI]) test_packed(tabs[KC_AVX512_VNNI], tabs[0]);
    for (int i = 0; i < KC_AVX512_VNNI; i++) /* the other tables pack nothing */
        CHECK(!tabs[i] || (!tabs[i]->pack_bytes && !tabs[i]->matmul_packed));
    test_dequant_reference();
    test_q8k_quantize();
    test_q8_quantize();
    test_threadpool();
    return check_exit();
}
