/* engine/dtype_q23k.c: the F32 widening of Q2_K and Q3_K rows (engine/dtype.h gives the block
 * layouts and the exact value of each weight). Pure functions, thread-safe. */
#include "dtype.h"

void dtype_dequant_q2_k(const void *row, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / QK_K; b++) {
        const block_q2_K *blk = (const block_q2_K *)row + b;
        const float d = fp16_to_f32(blk->d), dmin = fp16_to_f32(blk->dmin);
        float *o = out + b * QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            /* sub-block j: chunk c = j / 8, bit pair p = (j % 8) / 2, bytes l0 .. l0 + 15 */
            const int c = j / 8, p = (j % 8) / 2, l0 = 16 * (j % 2);
            const float d1 = d * (float)(blk->scales[j] & 0x0f); /* exact */
            const float m1 = dmin * (float)(blk->scales[j] >> 4); /* exact */
            const uint8_t *q = blk->qs + 32 * c + l0;
            for (int i = 0; i < 16; i++) {
                const float p1 = d1 * (float)((q[i] >> (2 * p)) & 3); /* exact */
                o[16 * j + i] = p1 - m1; /* the one rounding */
            }
        }
    }
}

void dtype_dequant_q3_k(const void *row, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / QK_K; b++) {
        const block_q3_K *blk = (const block_q3_K *)row + b;
        const float d = fp16_to_f32(blk->d);
        float *o = out + b * QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            const int c = j / 8, p = (j % 8) / 2, l0 = 16 * (j % 2);
            const float d1 = d * (float)q3k_scale(j, blk->scales); /* exact */
            const uint8_t *q = blk->qs + 32 * c + l0, *hm = blk->hmask + l0;
            const int hbit = 4 * c + p;
            for (int i = 0; i < 16; i++) {
                int v = (q[i] >> (2 * p)) & 3;
                if (!((hm[i] >> hbit) & 1)) v -= 4;
                o[16 * j + i] = d1 * (float)v; /* exact */
            }
        }
    }
}
