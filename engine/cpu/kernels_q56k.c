/* engine/cpu/kernels_q56k.c: the portable Q6_K and Q5_K int8 routes (kernels_q56k.h).
 *
 * Per (t, o), the super-blocks in order: isum (and msum, Q5_K) exact in int32 (Q6_K
 * |isum| <= 256 * 128 * 32 * 127 < 2^31), then in F32 with separate roundings (never an FMA):
 *   Q6_K: a = (d * dx) * float(isum); acc += a; y = acc.
 *   Q5_K: a = (d * dx) * float(isum); m = (dmin * dx) * float(msum); acc += a; accm += m;
 *         y = acc - accm. */
#include "engine/cpu/kernels_q56k.h"

#include "engine/cpu/kernels_impl.h"
#include "engine/dtype.h"

static void sc_q6k(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T, float *y,
                   int64_t ldy, int64_t o0, int64_t o1)
{
    for (int64_t o = o0; o < o1; o++) {
        const block_q6_K *row = (const block_q6_K *)(W + (size_t)o * wrb);
        for (int t = 0; t < T; t++) {
            const kern_q8k_t *xb = xq + (int64_t)t * nsb;
            float acc = 0.0f;
            for (int64_t s = 0; s < nsb; s++) {
                const block_q6_K *b = row + s;
                int32_t isum = 0;
                for (int j = 0; j < Q6K_SCALES; j++) {
                    int32_t p = 0;
                    for (int k = 16 * j; k < 16 * j + 16; k++)
                        p += (q6k_quant(b, k) - 32) * xb[s].q[k];
                    isum += b->scales[j] * p;
                }
                const float dd = fp16_to_f32(b->d) * xb[s].d;
                const float a = dd * (float)isum;
                acc += a;
            }
            y[(int64_t)t * ldy + o] = acc;
        }
    }
}

static void sc_q5k(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T, float *y,
                   int64_t ldy, int64_t o0, int64_t o1)
{
    for (int64_t o = o0; o < o1; o++) {
        const block_q5_K *row = (const block_q5_K *)(W + (size_t)o * wrb);
        for (int t = 0; t < T; t++) {
            const kern_q8k_t *xb = xq + (int64_t)t * nsb;
            float acc = 0.0f, accm = 0.0f;
            for (int64_t s = 0; s < nsb; s++) {
                const block_q5_K *b = row + s;
                uint8_t sc[8], mn[8];
                q4k_unpack(b->scales, sc, mn);
                int32_t isum = 0, msum = 0;
                for (int j = 0; j < 8; j++) {
                    int32_t p = 0;
                    for (int k = 32 * j; k < 32 * j + 32; k++) p += q5k_quant(b, k) * xb[s].q[k];
                    isum += sc[j] * p;
                    msum += mn[j] * xb[s].bsum[j];
                }
                const float dd = fp16_to_f32(b->d) * xb[s].d;
                const float dm = fp16_to_f32(b->dmin) * xb[s].d;
                const float a = dd * (float)isum, m = dm * (float)msum;
                acc += a;
                accm += m;
            }
            y[(int64_t)t * ldy + o] = acc - accm;
        }
    }
}

int kern_q56k_matmul_scalar(int wtype, const void *W, size_t wrb, int64_t K, const float *x,
                            int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    if (wtype != DT_Q6_K && wtype != DT_Q5_K) return -1;
    return kern_q4k_matmul(wtype == DT_Q6_K ? sc_q6k : sc_q5k, kern_q8k_quantize, W, wrb, K, x,
                           ldx, y, ldy, T, o0, o1);
}
