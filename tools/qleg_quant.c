/* tools/qleg_quant.c: quantisers for Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS (qleg_quant.h). */
#include "tools/qleg_quant.h"

#include <math.h>
#include <string.h>

#include "engine/dtype.h"

static int nearest_int(float v)
{
    return (int)rintf(v);
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The index of the grid value nearest to v (dtype_iq4nl_values is increasing; ties go to the
 * lower index). */
static int iq4_nearest(float v)
{
    const int8_t *g = dtype_iq4nl_values;
    if (v <= g[0]) return 0;
    if (v >= g[15]) return 15;
    int lo = 0, hi = 15; /* g[lo] < v < g[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < g[mid]) hi = mid;
        else lo = mid;
    }
    return v - g[lo] <= g[hi] - v ? lo : hi;
}

/* Packs 32 4-bit values (weight order) into 16 bytes: i < 16 low nibbles, i + 16 high. */
static void pack_nibbles(const int *q, uint8_t *qs)
{
    for (int i = 0; i < 16; i++) qs[i] = (uint8_t)((q[i] & 15) | (q[i + 16] & 15) << 4);
}

/* Q4_1 / Q5_1 block: fp16 d and m at dst, q (0 .. nmax) to *q. */
static void fit_min_scale(const float *x, int nmax, uint16_t *hd, uint16_t *hm, int *q)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *hd = f32_to_fp16((hi - lo) / (float)nmax);
    *hm = f32_to_fp16(lo);
    const float d = fp16_to_f32(*hd), m = fp16_to_f32(*hm), id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 32; i++) q[i] = clampi(nearest_int((x[i] - m) * id), 0, nmax);
}

/* The value of largest magnitude of x[0..n) (the first of them), 0 when all are zero. */
static float max_mag(const float *x, int n)
{
    float v = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(v)) v = x[i];
    return v;
}

/* The best IQ4 scale of a 32-block (see qleg_quant.h); 0 for an all-zero block. */
static float iq4_fit(const float *x)
{
    const float v = max_mag(x, 32);
    if (v == 0.0f) return 0.0f;
    float best_d = v / (float)dtype_iq4nl_values[0], best = INFINITY;
    for (int s = -7; s <= 7; s++) {
        const float d = v / ((float)dtype_iq4nl_values[0] + (float)s), id = 1.0f / d;
        double sxg = 0, sgg = 0;
        int g[32];
        for (int i = 0; i < 32; i++) {
            g[i] = dtype_iq4nl_values[iq4_nearest(x[i] * id)];
            sxg += (double)x[i] * g[i];
            sgg += (double)g[i] * g[i];
        }
        const float dd = sgg > 0 ? (float)(sxg / sgg) : d;
        double err = 0;
        for (int i = 0; i < 32; i++) {
            const double e = (double)dd * g[i] - x[i];
            err += e * e;
        }
        if (err < best) {
            best = (float)err;
            best_d = dd;
        }
    }
    return best_d;
}

/* The indices of x[0..32) against scale d (0: all the index of the grid value nearest 0). */
static void iq4_indices(const float *x, float d, int *q)
{
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 32; i++) q[i] = iq4_nearest(x[i] * id);
}

int qleg_quantize_row(int t, const float *x, void *dst, int64_t n)
{
    const int be = dtype_block_elems(t);
    if (be == 0 || n < 0 || n % be) return -1;
    int q[32];
    switch (t) {
    case DT_Q4_1:
    case DT_Q5_1:
        for (int64_t b = 0; b < n / 32; b++, x += 32) {
            uint16_t hd, hm;
            fit_min_scale(x, t == DT_Q4_1 ? 15 : 31, &hd, &hm, q);
            if (t == DT_Q4_1) {
                block_q4_1 *blk = (block_q4_1 *)dst + b;
                blk->d = hd;
                blk->m = hm;
                pack_nibbles(q, blk->qs);
            } else {
                block_q5_1 *blk = (block_q5_1 *)dst + b;
                uint32_t h = 0;
                for (int i = 0; i < 32; i++) h |= (uint32_t)(q[i] >> 4) << i;
                blk->d = hd;
                blk->m = hm;
                for (int i = 0; i < 4; i++) blk->qh[i] = (uint8_t)(h >> 8 * i);
                pack_nibbles(q, blk->qs);
            }
        }
        return 0;
    case DT_Q5_0:
        for (int64_t b = 0; b < n / 32; b++, x += 32) {
            block_q5_0 *blk = (block_q5_0 *)dst + b;
            blk->d = f32_to_fp16(max_mag(x, 32) / -16.0f);
            const float d = fp16_to_f32(blk->d), id = d != 0.0f ? 1.0f / d : 0.0f;
            uint32_t h = 0;
            for (int i = 0; i < 32; i++) {
                q[i] = clampi(nearest_int(x[i] * id) + 16, 0, 31);
                h |= (uint32_t)(q[i] >> 4) << i;
            }
            for (int i = 0; i < 4; i++) blk->qh[i] = (uint8_t)(h >> 8 * i);
            pack_nibbles(q, blk->qs);
        }
        return 0;
    case DT_IQ4_NL:
        for (int64_t b = 0; b < n / 32; b++, x += 32) {
            block_iq4_nl *blk = (block_iq4_nl *)dst + b;
            blk->d = f32_to_fp16(iq4_fit(x));
            iq4_indices(x, fp16_to_f32(blk->d), q);
            pack_nibbles(q, blk->qs);
        }
        return 0;
    case DT_IQ4_XS:
        for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
            block_iq4_xs *blk = (block_iq4_xs *)dst + b;
            float sc[QK_K / 32];
            for (int j = 0; j < QK_K / 32; j++) sc[j] = iq4_fit(x + 32 * j);
            const float smax = max_mag(sc, QK_K / 32);
            blk->d = f32_to_fp16(-smax / 32.0f);
            const float d = fp16_to_f32(blk->d), id = d != 0.0f ? 1.0f / d : 0.0f;
            blk->scales_h = 0;
            memset(blk->scales_l, 0, sizeof blk->scales_l);
            for (int j = 0; j < QK_K / 32; j++) {
                const int l = clampi(nearest_int(sc[j] * id), -32, 31), ls = l + 32;
                blk->scales_l[j / 2] |= (uint8_t)((ls & 15) << 4 * (j % 2));
                blk->scales_h |= (uint16_t)((ls >> 4) << 2 * j);
                iq4_indices(x + 32 * j, d * (float)l, q);
                pack_nibbles(q, blk->qs + 16 * j);
            }
        }
        return 0;
    default:
        return -1;
    }
}
