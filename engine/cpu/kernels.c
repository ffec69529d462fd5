/* engine/cpu/kernels.c: kernel dispatch (kern_get) and the portable C implementation.
 *
 * Scalar matmul arithmetic, per output element (t, o) -- fixed, so batch invariant:
 *   8 lane partial sums s[j] = sum over k = j (mod 8), in increasing k, of (w[k] * x[k]) rounded
 *   (a separate multiply and add, no fused FMA, so the result does not depend on -ffp-contract
 *   or libm), then ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)).
 * Weights are widened to F32 exactly (F16, BF16, Q8_0 as d * q and Q4_0 as d * (q - 8), which
 * are exact in F32; Q4_K as the single rounding of d*sc*q - dmin*m, see engine/dtype.h). */
#include "engine/cpu/kernels.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <string.h>

#include "engine/cpu/kernels_impl.h"
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

/* ---- Q4_K's int8 route (kernels.h) ---- */

void kern_q8k_quantize(const float *x, int64_t K, kern_q8k_t *out)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: v + magic - magic rounds |v| < 2^22 to even */
    for (int64_t b = 0; b < K / KERN_Q8K; b++, x += KERN_Q8K, out++) {
        float amax = 0.0f;
        int finite = 1;
        for (int i = 0; i < KERN_Q8K; i++) {
            float a = fabsf(x[i]);
            if (!(a <= FLT_MAX)) finite = 0;
            else if (a > amax) amax = a;
        }
        memset(out, 0, sizeof *out);
        if (!finite) {
            out->d = NAN; /* every output of the block's rows becomes NaN, as in F32 */
            continue;
        }
        if (amax == 0.0f) continue;
        out->d = amax / 127.0f;
        const float is = 127.0f / amax;
        for (int j = 0; j < 8; j++) {
            int sum = 0;
            for (int i = 32 * j; i < 32 * j + 32; i++) {
                float v = x[i] * is;
                float r = v + magic; /* separate statements: never contracted into an FMA */
                r = r - magic;
                int q = (int)r;
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                out->q[i] = (int8_t)q;
                sum += q;
            }
            out->bsum[j] = (int16_t)sum;
        }
    }
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

static int sc_matmul(int wtype, const void *W, size_t w_row_bytes, int64_t K, const float *x,
                     int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    if (wtype == DT_Q4_K)
        return kern_q4k_matmul(sc_q4k, kern_q8k_quantize, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
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
