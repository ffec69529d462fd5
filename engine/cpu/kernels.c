/* engine/cpu/kernels.c: kernel dispatch (kern_get) and the portable C implementation.
 *
 * Scalar matmul arithmetic, per output element (t, o) -- fixed, so batch invariant:
 *   8 lane partial sums s[j] = sum over k = j (mod 8), in increasing k, of (w[k] * x[k]) rounded
 *   (a separate multiply and add, no fused FMA, so the result does not depend on -ffp-contract
 *   or libm), then ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)).
 * F16 and BF16 weights are widened to F32 exactly. Q4_K, Q8_0 and Q4_0 take int8 activations
 * (kernels.h): sc_q4k, sc_b32; Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS too (engine/cpu/qleg*.c,
 * every ISA's matmul and dequant_row hand them over); Q2_K and Q3_K in engine/cpu/q23k.c. */
#include "engine/cpu/kernels.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <string.h>

#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/q23k.h"
#include "engine/cpu/kernels_q56k.h"
#include "engine/cpu/qleg.h"
#include "engine/dtype.h"

#define SC_LANES 8
#define SC_CHUNK 32 /* elements widened at a time; a multiple of SC_LANES, = QK8_0 = QK4_0 = 32 */
#define SC_TOK 8    /* tokens sharing one widened chunk */

/* Widens elements [k0, k0 + n) of a row to F32; for the block types k0 is a multiple of 32
 * (Q4_0 and Q4_K: n = 32, as K is a multiple of 32). */
static void sc_widen(int wtype, const void *row, int64_t k0, int n, float *out)
{
    switch (wtype) {
    case DT_F32:
        memcpy(out, (const float *)row + k0, (size_t)n * sizeof(float));
        break;
    case DT_F16: {
        const uint16_t *h = (const uint16_t *)row + k0;
        for (int i = 0; i < n; i++) out[i] = fp16_to_f32(h[i]);
        break;
    }
    case DT_BF16: {
        const uint16_t *h = (const uint16_t *)row + k0;
        for (int i = 0; i < n; i++) out[i] = bf16_to_f32(h[i]);
        break;
    }
    case DT_Q8_0: {
        const block_q8_0 *b = (const block_q8_0 *)row + k0 / QK8_0;
        for (int i = 0; i < n; i += QK8_0, b++) {
            float d = fp16_to_f32(b->d);
            int m = n - i < QK8_0 ? n - i : QK8_0;
            for (int j = 0; j < m; j++) out[i + j] = d * (float)b->qs[j];
        }
        break;
    }
    case DT_Q4_0: { /* n == 32: one block */
        const block_q4_0 *b = (const block_q4_0 *)row + k0 / QK4_0;
        float d = fp16_to_f32(b->d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            out[j] = d * (float)((b->qs[j] & 0x0f) - 8);
            out[j + QK4_0 / 2] = d * (float)((b->qs[j] >> 4) - 8);
        }
        break;
    }
    case DT_Q4_K: { /* n == 32: sub-block j of a super-block */
        const block_q4_K *b = (const block_q4_K *)row + k0 / QK_K;
        int j = (int)(k0 % QK_K) / 32, sc, m;
        q4k_scale_min(j, b->scales, &sc, &m);
        float d1 = fp16_to_f32(b->d) * (float)sc, m1 = fp16_to_f32(b->dmin) * (float)m;
        const uint8_t *q = b->qs + 32 * (j / 2);
        const int shift = j % 2 ? 4 : 0;
        for (int i = 0; i < 32; i++) {
            float p = d1 * (float)((q[i] >> shift) & 0x0f); /* exact */
            out[i] = p - m1;
        }
        break;
    }
    default:
        break;
    }
}

static float sc_lanes_sum(const float *s)
{
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* ---- the int8 routes of Q4_K, Q8_0 and Q4_0 (kernels.h) ---- */

/* The scale of x[0..n): max|x| / 127, 0 when all are zero, NaN when one is Inf or NaN; *is =
 * 127 / max|x| when the scale is finite and nonzero. */
static float q8_scale_of(const float *x, int n, float *is)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (!(a <= FLT_MAX)) return NAN;
        if (a > amax) amax = a;
    }
    if (amax == 0.0f) return 0.0f;
    *is = 127.0f / amax;
    return amax / 127.0f;
}

/* q[i] = round-to-nearest-even(x[i] * is) clamped to [-127, 127], i < n; returns the sum of q. */
static int q8_round(const float *x, int n, float is, int8_t *q)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: v + magic - magic rounds |v| < 2^22 to even */
    int sum = 0;
    for (int i = 0; i < n; i++) {
        float v = x[i] * is;
        float r = v + magic; /* separate statements: never contracted into an FMA */
        r = r - magic;
        int v8 = (int)r;
        v8 = v8 > 127 ? 127 : v8 < -127 ? -127 : v8;
        q[i] = (int8_t)v8;
        sum += v8;
    }
    return sum;
}

void kern_q8k_quantize(const float *x, int64_t K, kern_q8k_t *out)
{
    for (int64_t b = 0; b < K / KERN_Q8K; b++, x += KERN_Q8K, out++) {
        float is = 0.0f;
        memset(out, 0, sizeof *out);
        out->d = q8_scale_of(x, KERN_Q8K, &is); /* NaN: every output of the block's rows NaN */
        if (!(out->d > 0.0f)) continue;
        for (int j = 0; j < 8; j++)
            out->bsum[j] = (int16_t)q8_round(x + 32 * j, 32, is, out->q + 32 * j);
    }
}

void kern_q8_quantize(const float *x, int64_t K, int8_t *q, float *d)
{
    for (int64_t b = 0; b < K / 32; b++, x += 32, q += 32) {
        float is = 0.0f;
        d[b] = q8_scale_of(x, 32, &is);
        if (d[b] > 0.0f) q8_round(x, 32, is, q);
        else memset(q, 0, 32);
    }
}

int kern_b32_matmul(int wtype, kern_b32_fn fn, kern_q8_fn quant, const void *W, size_t wrb,
                    int64_t K, const float *x, int64_t ldx, float *y, int64_t ldy, int T,
                    int64_t o0, int64_t o1)
{
    if ((wtype != DT_Q8_0 && wtype != DT_Q4_0) || !kern_wtype_ok(wtype, K)) return -1;
    if (T <= 0 || o1 <= o0) return 0;
    const int64_t nb = K / 32;
    _Alignas(64) int8_t sq[KERN_Q8_STACK];
    float sd[KERN_Q8_STACK / 32];
    int8_t *xq = NULL;
    if ((int64_t)T * K > KERN_Q8_STACK) {
        size_t qb = ((size_t)T * (size_t)K + 63) / 64 * 64;
        xq = aligned_alloc(64, qb + (size_t)T * (size_t)nb * sizeof(float));
    }
    if (xq || (int64_t)T * K <= KERN_Q8_STACK) {
        float *xd = xq ? (float *)(xq + ((size_t)T * (size_t)K + 63) / 64 * 64) : sd;
        int8_t *q = xq ? xq : sq;
        for (int t = 0; t < T; t++) quant(x + (int64_t)t * ldx, K, q + t * K, xd + t * nb);
        fn(W, wrb, nb, q, xd, T, y, ldy, o0, o1);
        free(xq);
        return 0;
    }
    /* no memory: chunks of tokens through the stack buffers (the same values per token) */
    const int chunk = (int)(KERN_Q8_STACK / K);
    for (int t0 = 0; t0 < T; t0 += chunk) {
        int n = T - t0 < chunk ? T - t0 : chunk;
        for (int t = 0; t < n; t++) quant(x + (int64_t)(t0 + t) * ldx, K, sq + t * K, sd + t * nb);
        fn(W, wrb, nb, sq, sd, n, y + (int64_t)t0 * ldy, ldy, o0, o1);
    }
    return 0;
}

int kern_q4k_matmul(kern_q4k_fn fn, kern_q8k_fn quant, const void *W, size_t wrb, int64_t K, const float *x,
                    int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    if (!kern_wtype_ok(DT_Q4_K, K)) return -1;
    if (T <= 0 || o1 <= o0) return 0;
    const int64_t nsb = K / QK_K;
    _Alignas(64) kern_q8k_t stack[KERN_Q8K_STACK];
    kern_q8k_t *xq = (int64_t)T * nsb <= KERN_Q8K_STACK ? stack : NULL;
    if (!xq) {
        size_t bytes = (size_t)T * (size_t)nsb * sizeof(kern_q8k_t);
        xq = aligned_alloc(64, (bytes + 63) / 64 * 64);
    }
    if (xq) {
        for (int t = 0; t < T; t++) quant(x + (int64_t)t * ldx, K, xq + t * nsb);
        fn(W, wrb, nsb, xq, T, y, ldy, o0, o1);
        if (xq != stack) free(xq);
        return 0;
    }
    /* no memory: chunks of tokens through the stack buffer (the same values per token) */
    const int chunk = (int)(KERN_Q8K_STACK / nsb);
    for (int t0 = 0; t0 < T; t0 += chunk) {
        int n = T - t0 < chunk ? T - t0 : chunk;
        for (int t = 0; t < n; t++)
            quant(x + (int64_t)(t0 + t) * ldx, K, stack + t * nsb);
        fn(W, wrb, nsb, stack, n, y + (int64_t)t0 * ldy, ldy, o0, o1);
    }
    return 0;
}

/* Scalar Q4_K x int8: per (t, o) the super-blocks in order, acc and accm as in kernels.h. */
static void sc_q4k(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T, float *y,
                   int64_t ldy, int64_t o0, int64_t o1)
{
    for (int64_t o = o0; o < o1; o++) {
        const block_q4_K *row = (const block_q4_K *)(W + (size_t)o * wrb);
        for (int t = 0; t < T; t++) {
            const kern_q8k_t *xb = xq + (int64_t)t * nsb;
            float acc = 0.0f, accm = 0.0f;
            for (int64_t s = 0; s < nsb; s++) {
                const block_q4_K *b = row + s;
                uint8_t sc[8], mn[8];
                q4k_unpack(b->scales, sc, mn);
                int32_t isum = 0, msum = 0;
                for (int j = 0; j < 8; j++) {
                    const uint8_t *q = b->qs + 32 * (j / 2);
                    const int8_t *xs = xb[s].q + 32 * j;
                    const int shift = j % 2 ? 4 : 0;
                    int32_t p = 0;
                    for (int i = 0; i < 32; i++) p += ((q[i] >> shift) & 0x0f) * xs[i];
                    isum += sc[j] * p;
                    msum += mn[j] * xb[s].bsum[j];
                }
                float dd = fp16_to_f32(b->d) * xb[s].d;
                float dm = fp16_to_f32(b->dmin) * xb[s].d;
                float a = dd * (float)isum, m = dm * (float)msum;
                acc += a;
                accm += m;
            }
            y[(int64_t)t * ldy + o] = acc - accm;
        }
    }
}

/* Weight k (< 32) of a Q8_0 / Q4_0 block: its quant, or its nibble - 8. */
static inline int b32_weight(int wtype, const char *blk, int k)
{
    if (wtype == DT_Q8_0) return ((const block_q8_0 *)blk)->qs[k];
    const uint8_t q = ((const block_q4_0 *)blk)->qs[k % 16];
    return (k < 16 ? q & 0x0f : q >> 4) - 8;
}

/* Scalar Q8_0 / Q4_0 x int8: per (t, o) y = sum over blocks b in order of (dw_b * dx_b) * P_b,
 * P_b the exact integer sum of the block's products. */
static void sc_b32(int wtype, const char *W, size_t wrb, int64_t nb, const int8_t *xq,
                   const float *xd, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    const size_t bs = wtype == DT_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
    for (int64_t o = o0; o < o1; o++) {
        const char *row = W + (size_t)o * wrb;
        for (int t = 0; t < T; t++) {
            const int8_t *q = xq + (int64_t)t * nb * 32;
            const float *d = xd + (int64_t)t * nb;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const char *blk = row + (size_t)b * bs;
                uint16_t dw;
                memcpy(&dw, blk, 2); /* the scale d is each block's first member */
                int32_t p = 0;
                for (int i = 0; i < 32; i++) p += b32_weight(wtype, blk, i) * q[32 * b + i];
                float s = fp16_to_f32(dw) * d[b];
                float a = s * (float)p;
                acc += a;
            }
            y[(int64_t)t * ldy + o] = acc;
        }
    }
}

static void sc_q80(const char *W, size_t wrb, int64_t nb, const int8_t *xq, const float *xd, int T,
                   float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    sc_b32(DT_Q8_0, W, wrb, nb, xq, xd, T, y, ldy, o0, o1);
}

static void sc_q40(const char *W, size_t wrb, int64_t nb, const int8_t *xq, const float *xd, int T,
                   float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    sc_b32(DT_Q4_0, W, wrb, nb, xq, xd, T, y, ldy, o0, o1);
}

static int sc_matmul(int wtype, const void *W, size_t w_row_bytes, int64_t K, const float *x,
                     int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    if (wtype == DT_Q4_K)
        return kern_q4k_matmul(sc_q4k, kern_q8k_quantize, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q2_K || wtype == DT_Q3_K) /* engine/cpu/q23k.c */
        return kern_q23k_matmul_scalar(wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q6_K || wtype == DT_Q5_K)
        return kern_q56k_matmul_scalar(wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (kern_qleg_type(wtype))
        return kern_qleg_matmul(&kern_qleg_scalar, wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q8_0 || wtype == DT_Q4_0)
        return kern_b32_matmul(wtype, wtype == DT_Q8_0 ? sc_q80 : sc_q40, kern_q8_quantize, W,
                               w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (!kern_wtype_ok(wtype, K)) return -1;
    float w[SC_CHUNK];
    float s[SC_TOK][SC_LANES];
    for (int64_t o = o0; o < o1; o++) {
        const void *row = (const char *)W + (size_t)o * w_row_bytes;
        for (int t0 = 0; t0 < T; t0 += SC_TOK) {
            int nt = T - t0 < SC_TOK ? T - t0 : SC_TOK;
            memset(s, 0, sizeof s);
            for (int64_t k = 0; k < K; k += SC_CHUNK) {
                int n = K - k < SC_CHUNK ? (int)(K - k) : SC_CHUNK;
                sc_widen(wtype, row, k, n, w);
                for (int t = 0; t < nt; t++) {
                    const float *xt = x + (int64_t)(t0 + t) * ldx + k;
                    for (int i = 0; i < n; i++) {
                        float p = w[i] * xt[i];
                        s[t][i % SC_LANES] += p;
                    }
                }
            }
            for (int t = 0; t < nt; t++) y[(int64_t)(t0 + t) * ldy + o] = sc_lanes_sum(s[t]);
        }
    }
    return 0;
}

static void sc_dequant_row(int wtype, const void *row, float *out, int64_t K)
{
    if (wtype == DT_Q6_K || wtype == DT_Q5_K || wtype == DT_Q2_K || wtype == DT_Q3_K) {
        /* engine/dtype.h values (embedding rows: one per token at most) */
        dtype_dequant_row(wtype, row, out, K);
        return;
    }
    if (dtype_qleg_dequant_row(wtype, row, out, K)) return;
    for (int64_t k = 0; k < K; k += SC_CHUNK) {
        int n = K - k < SC_CHUNK ? (int)(K - k) : SC_CHUNK;
        sc_widen(wtype, row, k, n, out + k);
    }
}

static float sc_dot(const float *a, const float *b, int64_t n)
{
    float s[SC_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = a[i] * b[i];
        s[i % SC_LANES] += p;
    }
    return sc_lanes_sum(s);
}

static void sc_axpy(float a, const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void sc_rmsnorm(const float *x, const float *w, float eps, float *out, int64_t n)
{
    float s[SC_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = x[i] * x[i];
        s[i % SC_LANES] += p;
    }
    float scale = 1.0f / sqrtf(sc_lanes_sum(s) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void sc_silu_mul(const float *gate, const float *up, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void sc_add(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void sc_f32_to_f16(const float *x, uint16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = f32_to_fp16(x[i]);
}

static void sc_f16_to_f32(const uint16_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = fp16_to_f32(x[i]);
}

const kern_table_t kern_table_scalar = {
    .name = "scalar",
    .matmul = sc_matmul,
    .dequant_row = sc_dequant_row,
    .dot_f32 = sc_dot,
    .axpy_f32 = sc_axpy,
    .rmsnorm = sc_rmsnorm,
    .silu_mul = sc_silu_mul,
    .add = sc_add,
    .f32_to_f16 = sc_f32_to_f16,
    .f16_to_f32 = sc_f16_to_f32,
};

#ifdef KERN_HAVE_X86
/* F16C from CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports has no "f16c"). */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
}

static int cpu_has_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && cpu_has_f16c() && __builtin_cpu_supports("avx2");
}

static int cpu_has_avx2(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}
#endif

const kern_table_t *kern_get(const char *force)
{
#ifdef KERN_HAVE_X86
    if (!force) {
        if (cpu_has_avx512())
            return __builtin_cpu_supports("avx512vnni") ? &kern_table_avx512_vnni
                                                         : &kern_table_avx512;
        if (cpu_has_avx2()) return &kern_table_avx2;
        return &kern_table_scalar;
    }
    if (strcmp(force, "avx512") == 0) return cpu_has_avx512() ? &kern_table_avx512 : NULL;
    if (strcmp(force, "avx512-vnni") == 0)
        return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni") ? &kern_table_avx512_vnni
                                                                        : NULL;
    if (strcmp(force, "avx2") == 0) return cpu_has_avx2() ? &kern_table_avx2 : NULL;
#else
    if (!force) return &kern_table_scalar;
#endif
    if (strcmp(force, "scalar") == 0) return &kern_table_scalar;
    return NULL;
}
