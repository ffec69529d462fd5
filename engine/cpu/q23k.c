/* engine/cpu/q23k.c: the int8 route of Q2_K and Q3_K (engine/cpu/q23k.h): quantisation of the
 * tokens, shared by every ISA, and the portable C kernels.
 *
 * Scalar arithmetic, per output element (t, o): isum_s (and msum_s) as single exact integers,
 * then acc += (d_s * dx_s) * isum_s and accm += (dmin_s * dx_s) * msum_s (each a rounded
 * product then a rounded sum, no FMA) over the super-blocks in order; y = acc - accm (Q2_K) or
 * acc (Q3_K). */
#include "engine/cpu/q23k.h"

#include <stdlib.h>
#include <string.h>

#include "engine/cpu/kernels_impl.h"
#include "engine/dtype.h"

void kern_q8k16_sums(const kern_q8k_t *b, kern_q8k16_t *s)
{
    for (int j = 0; j < 16; j++) {
        int sum = 0;
        for (int i = 0; i < 16; i++) sum += b->q[16 * j + i];
        s->s[j] = (int16_t)sum;
    }
}

int kern_q23k_matmul(int wtype, kern_q23k_fn fn, const void *W, size_t wrb, int64_t K,
                     const float *x, int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                     int64_t o1)
{
    if ((wtype != DT_Q2_K && wtype != DT_Q3_K && wtype != DT_Q6_K) || !kern_wtype_ok(wtype, K))
        return -1;
    if (T <= 0 || o1 <= o0) return 0;
    const int64_t nsb = K / QK_K;
    _Alignas(64) kern_q8k_t stack[KERN_Q8K_STACK];
    kern_q8k16_t stack16[KERN_Q8K_STACK];
    kern_q8k_t *xq = (int64_t)T * nsb <= KERN_Q8K_STACK ? stack : NULL;
    kern_q8k16_t *xs = stack16;
    if (!xq) {
        const size_t n = (size_t)T * (size_t)nsb;
        const size_t qb = n * sizeof(kern_q8k_t); /* a multiple of 64 (288 * n is 32 * 9n) */
        xq = aligned_alloc(64, (qb + n * sizeof(kern_q8k16_t) + 63) / 64 * 64);
        if (xq) xs = (kern_q8k16_t *)((char *)xq + qb);
    }
    if (xq) {
        for (int t = 0; t < T; t++) kern_q8k_quantize(x + (int64_t)t * ldx, K, xq + t * nsb);
        for (int64_t i = 0; i < (int64_t)T * nsb; i++) kern_q8k16_sums(xq + i, xs + i);
        fn(W, wrb, nsb, xq, xs, T, y, ldy, o0, o1);
        if (xq != stack) free(xq);
        return 0;
    }
    /* no memory: chunks of tokens through the stack buffers (the same values per token) */
    const int chunk = (int)(KERN_Q8K_STACK / nsb);
    for (int t0 = 0; t0 < T; t0 += chunk) {
        int n = T - t0 < chunk ? T - t0 : chunk;
        for (int t = 0; t < n; t++) kern_q8k_quantize(x + (int64_t)(t0 + t) * ldx, K, stack + t * nsb);
        for (int64_t i = 0; i < (int64_t)n * nsb; i++) kern_q8k16_sums(stack + i, stack16 + i);
        fn(W, wrb, nsb, stack, stack16, n, y + (int64_t)t0 * ldy, ldy, o0, o1);
    }
    return 0;
}

/* Scalar Q2_K x int8: per (t, o) the super-blocks in order (file comment). */
static void sc_q2k(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq,
                   const kern_q8k16_t *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    for (int64_t o = o0; o < o1; o++) {
        const block_q2_K *row = (const block_q2_K *)(W + (size_t)o * wrb);
        for (int t = 0; t < T; t++) {
            float acc = 0.0f, accm = 0.0f;
            for (int64_t s = 0; s < nsb; s++) {
                const block_q2_K *b = row + s;
                const kern_q8k_t *xb = xq + (int64_t)t * nsb + s;
                const kern_q8k16_t *x16 = xs + (int64_t)t * nsb + s;
                int32_t isum = 0, msum = 0;
                for (int j = 0; j < 16; j++) {
                    const int c = j / 8, p = (j % 8) / 2, l0 = 16 * (j % 2);
                    const uint8_t *q = b->qs + 32 * c + l0;
                    const int8_t *xv = xb->q + 16 * j;
                    int32_t sum = 0;
                    for (int i = 0; i < 16; i++) sum += ((q[i] >> (2 * p)) & 3) * xv[i];
                    isum += (b->scales[j] & 0x0f) * sum;
                    msum += (b->scales[j] >> 4) * x16->s[j];
                }
                const float dd = fp16_to_f32(b->d) * xb->d, dm = fp16_to_f32(b->dmin) * xb->d;
                const float a = dd * (float)isum, m = dm * (float)msum;
                acc += a;
                accm += m;
            }
            y[(int64_t)t * ldy + o] = acc - accm;
        }
    }
}

/* Scalar Q3_K x int8: per (t, o) the super-blocks in order (file comment). */
static void sc_q3k(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq,
                   const kern_q8k16_t *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    for (int64_t o = o0; o < o1; o++) {
        const block_q3_K *row = (const block_q3_K *)(W + (size_t)o * wrb);
        for (int t = 0; t < T; t++) {
            float acc = 0.0f;
            for (int64_t s = 0; s < nsb; s++) {
                const block_q3_K *b = row + s;
                const kern_q8k_t *xb = xq + (int64_t)t * nsb + s;
                const kern_q8k16_t *x16 = xs + (int64_t)t * nsb + s;
                int8_t sc[16];
                kern_q3k_scales(b->scales, sc);
                int32_t isum = 0;
                for (int j = 0; j < 16; j++) {
                    const int c = j / 8, p = (j % 8) / 2, l0 = 16 * (j % 2);
                    const uint8_t *q = b->qs + 32 * c + l0, *hm = b->hmask + l0;
                    const int8_t *xv = xb->q + 16 * j;
                    int32_t sum = 0;
                    for (int i = 0; i < 16; i++) {
                        const int u = ((q[i] >> (2 * p)) & 3) | ((hm[i] >> (4 * c + p)) & 1) << 2;
                        sum += u * xv[i];
                    }
                    isum += sc[j] * (sum - 4 * x16->s[j]);
                }
                const float dd = fp16_to_f32(b->d) * xb->d;
                const float a = dd * (float)isum;
                acc += a;
            }
            y[(int64_t)t * ldy + o] = acc;
        }
    }
}

int kern_q23k_matmul_scalar(int wtype, const void *W, size_t wrb, int64_t K, const float *x,
                            int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    return kern_q23k_matmul(wtype, wtype == DT_Q2_K ? sc_q2k : sc_q3k, W, wrb, K, x, ldx, y, ldy,
                            T, o0, o1);
}
