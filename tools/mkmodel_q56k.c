/* tools/mkmodel_q56k.c: the Q6_K and Q5_K quantisers (tools/mkmodel_q56k.h). */
#include "tools/mkmodel_q56k.h"

#include <math.h>
#include <string.h>

/* round half to even (the default rounding mode), clamped to [lo, hi]; NaN gives lo */
static int round_clamp(float v, int lo, int hi)
{
    if (!(v >= (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)rintf(v);
}

void mkmodel_quantize_q6_k(const float *x, block_q6_K *b, int64_t n)
{
    for (int64_t s = 0; s < n / QK_K; s++, x += QK_K, b++) {
        float sub[Q6K_SCALES], smax = 0.0f;
        for (int j = 0; j < Q6K_SCALES; j++) {
            float m = 0.0f, am = 0.0f;
            for (int l = 0; l < 16; l++)
                if (fabsf(x[16 * j + l]) > am) {
                    am = fabsf(x[16 * j + l]);
                    m = x[16 * j + l];
                }
            sub[j] = m / -32.0f;
            if (fabsf(sub[j]) > smax) smax = fabsf(sub[j]);
        }
        memset(b, 0, sizeof *b);
        const float d = smax / 127.0f;
        b->d = f32_to_fp16(d);
        const float ds = fp16_to_f32(b->d);
        for (int j = 0; j < Q6K_SCALES; j++)
            b->scales[j] = (int8_t)(ds > 0.0f ? round_clamp(sub[j] / ds, -127, 127) : 0);
        for (int k = 0; k < QK_K; k++) {
            const float eff = ds * (float)b->scales[k / 16];
            const int q = eff != 0.0f ? round_clamp(x[k] / eff, -32, 31) + 32 : 32;
            const int h = k / 128, i = k / 32 % 4, l = k % 32;
            b->ql[64 * h + 32 * (i & 1) + l] |= (uint8_t)((q & 15) << (i >= 2 ? 4 : 0));
            b->qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * i));
        }
    }
}

/* Packs the 6-bit scales and mins of 8 sub-blocks as engine/dtype.h's q4k_scale_min reads them. */
static void pack_scale_min(const int ls[8], const int lm[8], uint8_t out[Q4K_SCALE_BYTES])
{
    memset(out, 0, Q4K_SCALE_BYTES);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] = (uint8_t)ls[j];
            out[j + 4] = (uint8_t)lm[j];
        } else {
            out[j + 4] = (uint8_t)((ls[j] & 15) | (lm[j] & 15) << 4);
            out[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            out[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

void mkmodel_quantize_q5_k(const float *x, block_q5_K *b, int64_t n)
{
    for (int64_t s = 0; s < n / QK_K; s++, x += QK_K, b++) {
        float scale[8], mn[8], max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            float lo = 0.0f, hi = x[32 * j];
            for (int l = 0; l < 32; l++) {
                if (x[32 * j + l] < lo) lo = x[32 * j + l];
                if (x[32 * j + l] > hi) hi = x[32 * j + l];
            }
            scale[j] = hi > lo ? (hi - lo) / 31.0f : 0.0f;
            mn[j] = -lo;
            if (scale[j] > max_scale) max_scale = scale[j];
            if (mn[j] > max_min) max_min = mn[j];
        }
        memset(b, 0, sizeof *b);
        b->d = f32_to_fp16(max_scale / 63.0f);
        b->dmin = f32_to_fp16(max_min / 63.0f);
        const float d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
        int ls[8], lm[8];
        for (int j = 0; j < 8; j++) {
            ls[j] = d > 0.0f ? round_clamp(scale[j] / d, 0, 63) : 0;
            lm[j] = dmin > 0.0f ? round_clamp(mn[j] / dmin, 0, 63) : 0;
        }
        pack_scale_min(ls, lm, b->scales);
        for (int j = 0; j < 8; j++) {
            const float dj = d * (float)ls[j], mj = dmin * (float)lm[j];
            for (int l = 0; l < 32; l++) {
                const int q = dj != 0.0f ? round_clamp((x[32 * j + l] + mj) / dj, 0, 31) : 0;
                b->qs[32 * (j / 2) + l] |= (uint8_t)((q & 15) << (j % 2 ? 4 : 0));
                b->qh[l] |= (uint8_t)((q >> 4) << j);
            }
        }
    }
}
