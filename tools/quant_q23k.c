/* tools/quant_q23k.c: the Q2_K and Q3_K quantisers (tools/quant_q23k.h). */
#include "tools/quant_q23k.h"

#include <math.h>
#include <string.h>

#include "engine/dtype.h"

#define SUB 16 /* elements per sub-block */
#define NSUB (QK_K / SUB)

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- Q3_K ---- */

/* Quants of x[0..16) at step s (clamped to [-4, 3]; 0 when s is 0) and their squared error. */
static float q3_round(const float *x, float s, int8_t *q)
{
    float err = 0.0f;
    for (int i = 0; i < SUB; i++) {
        q[i] = (int8_t)(s != 0.0f ? clampi((int)rintf(x[i] / s), -4, 3) : 0);
        float e = s * (float)q[i] - x[i];
        err += e * e;
    }
    return err;
}

/* The sub-block's float scale (quant_q23k.h). */
static float q3_fit(const float *x)
{
    float m = 0.0f;
    for (int i = 0; i < SUB; i++)
        if (fabsf(x[i]) > fabsf(m)) m = x[i];
    if (m == 0.0f) return 0.0f;
    static const float cand[] = {-4.5f, -4.25f, -4.0f, -3.75f, -3.5f, -3.25f, -3.0f,
                                 3.0f,  3.25f,  3.5f};
    int8_t q[SUB];
    float best_s = m / -4.0f, best = q3_round(x, best_s, q);
    for (size_t c = 0; c < sizeof cand / sizeof cand[0]; c++) {
        float s = m / cand[c];
        q3_round(x, s, q);
        float sxq = 0.0f, sqq = 0.0f;
        for (int i = 0; i < SUB; i++) {
            sxq += x[i] * (float)q[i];
            sqq += (float)(q[i] * q[i]);
        }
        if (sqq > 0.0f) s = sxq / sqq;
        float e = q3_round(x, s, q);
        if (e < best) {
            best = e;
            best_s = s;
        }
    }
    return best_s;
}

static void quant_q3_k_block(const float *x, block_q3_K *b)
{
    float s[NSUB], smax = 0.0f;
    for (int j = 0; j < NSUB; j++) {
        s[j] = q3_fit(x + SUB * j);
        if (fabsf(s[j]) > fabsf(smax)) smax = s[j];
    }
    memset(b, 0, sizeof *b);
    b->d = f32_to_fp16(smax / -32.0f);
    const float d = fp16_to_f32(b->d);
    int8_t L[QK_K];
    for (int j = 0; j < NSUB; j++) {
        const float *xs = x + SUB * j;
        int ls = 0;
        float best = q3_round(xs, 0.0f, L + SUB * j);
        if (d != 0.0f) {
            const int r = clampi((int)rintf(fmaxf(fminf(s[j] / d, 64.0f), -64.0f)), -32, 31);
            for (int c = r - 1; c <= r + 1; c++) {
                if (c < -32 || c > 31 || c == 0) continue;
                int8_t q[SUB];
                float e = q3_round(xs, d * (float)c, q);
                if (e < best) {
                    best = e;
                    ls = c;
                    memcpy(L + SUB * j, q, SUB);
                }
            }
        }
        /* 6-bit field ls + 32: low nibble in byte j (j < 8) or the high nibble of byte j - 8;
         * top 2 bits at bit 2 (j / 4) of byte 8 + j % 4 (q3k_scale) */
        const int f = ls + 32;
        b->scales[j % 8] |= (uint8_t)((f & 15) << (j < 8 ? 0 : 4));
        b->scales[8 + j % 4] |= (uint8_t)((f >> 4) << (2 * (j / 4)));
    }
    /* weight 128c + 32p + l: bits 2p of qs[32c + l], high bit (set: u = q + 4 >= 4) at bit
     * 4c + p of hmask[l] */
    for (int k = 0; k < QK_K; k++) {
        const int c = k / 128, p = (k % 128) / 32, l = k % 32;
        const int u = L[k] + 4;
        b->qs[32 * c + l] |= (uint8_t)((u & 3) << (2 * p));
        if (u >= 4) b->hmask[l] |= (uint8_t)(1u << (4 * c + p));
    }
}

void quant_q3_k_row(const float *x, void *dst, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) quant_q3_k_block(x + i * QK_K, (block_q3_K *)dst + i);
}

/* ---- Q2_K ---- */

/* Quants of x[0..16) ~ s q - m (clamped to [0, 3]; 0 when s is 0) and their squared error. */
static float q2_round(const float *x, float s, float m, uint8_t *q)
{
    float err = 0.0f;
    for (int i = 0; i < SUB; i++) {
        q[i] = (uint8_t)(s != 0.0f ? clampi((int)rintf((x[i] + m) / s), 0, 3) : 0);
        float e = s * (float)q[i] - m - x[i];
        err += e * e;
    }
    return err;
}

/* The sub-block's float scale *s and min *m >= 0 (quant_q23k.h). */
static void q2_fit(const float *x, float *s, float *m)
{
    float lo = 0.0f, hi = 0.0f;
    for (int i = 0; i < SUB; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    *m = -lo;
    *s = (hi - lo) / 3.0f;
    if (*s == 0.0f) return;
    uint8_t q[SUB];
    const float e0 = q2_round(x, *s, *m, q);
    /* least squares of x ~ s q - m over the quants */
    float n = SUB, sq = 0.0f, sqq = 0.0f, sx = 0.0f, sxq = 0.0f;
    for (int i = 0; i < SUB; i++) {
        sq += q[i];
        sqq += (float)(q[i] * q[i]);
        sx += x[i];
        sxq += x[i] * q[i];
    }
    const float det = n * sqq - sq * sq;
    if (!(det > 0.0f)) return;
    float ns = (n * sxq - sq * sx) / det, nm = -(sqq * sx - sq * sxq) / det;
    if (nm < 0.0f) { /* the min must stay an offset below zero: refit the scale alone */
        nm = 0.0f;
        ns = sqq > 0.0f ? sxq / sqq : 0.0f;
    }
    if (!(ns > 0.0f)) return;
    if (q2_round(x, ns, nm, q) < e0) {
        *s = ns;
        *m = nm;
    }
}

static void quant_q2_k_block(const float *x, block_q2_K *b)
{
    float s[NSUB], m[NSUB], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < NSUB; j++) {
        q2_fit(x + SUB * j, &s[j], &m[j]);
        smax = fmaxf(smax, s[j]);
        mmax = fmaxf(mmax, m[j]);
    }
    memset(b, 0, sizeof *b);
    b->d = f32_to_fp16(smax / 15.0f);
    b->dmin = f32_to_fp16(mmax / 15.0f);
    const float d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
    uint8_t L[QK_K];
    for (int j = 0; j < NSUB; j++) {
        const float *xs = x + SUB * j;
        const int rs = d != 0.0f ? clampi((int)rintf(fminf(s[j] / d, 32.0f)), 0, 15) : 0;
        const int rm = dmin != 0.0f ? clampi((int)rintf(fminf(m[j] / dmin, 32.0f)), 0, 15) : 0;
        int bs = 0, bm = 0;
        float best = INFINITY;
        for (int cs = rs - 1; cs <= rs + 1; cs++)
            for (int cm = rm - 1; cm <= rm + 1; cm++) {
                if (cs < 0 || cs > 15 || cm < 0 || cm > 15) continue;
                uint8_t q[SUB];
                float e = q2_round(xs, d * (float)cs, dmin * (float)cm, q);
                if (e < best) {
                    best = e;
                    bs = cs;
                    bm = cm;
                    memcpy(L + SUB * j, q, SUB);
                }
            }
        b->scales[j] = (uint8_t)(bs | bm << 4);
    }
    for (int k = 0; k < QK_K; k++) {
        const int c = k / 128, p = (k % 128) / 32, l = k % 32;
        b->qs[32 * c + l] |= (uint8_t)(L[k] << (2 * p));
    }
}

void quant_q2_k_row(const float *x, void *dst, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) quant_q2_k_block(x + i * QK_K, (block_q2_K *)dst + i);
}
