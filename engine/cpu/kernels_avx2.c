/* engine/cpu/kernels_avx2.c: AVX2 + FMA + F16C kernels.
 *
 * matmul arithmetic, per output element (t, o) -- fixed, so batch invariant:
 *   one 8-lane F32 accumulator; for each 8-element chunk of K in increasing order
 *   acc = fma(w[k..k+7], x[k..k+7], acc), the last partial chunk zero-padded;
 *   then h[i] = acc[i] + acc[i+4];  p[i] = h[i] + h[i+2];  y = p[0] + p[1].
 * F16 and BF16 weights are widened to F32 exactly (see kernels_avx512.c). Q4_K, Q8_0 and Q4_0
 * take int8 activations (kernels.h; their own sections below); Q4_1, Q5_0, Q5_1, IQ4_NL and
 * IQ4_XS too, in engine/cpu/qleg_avx2.c (dequant_row: the portable widening). Tiles are R = 3 rows x C <= 4
 * tokens (12 accumulators of the 16 ymm registers; measured ~90% of the FMA peak in L2), 8 rows
 * x 1 token for decode; other tile shapes do the same per-element arithmetic. */
/* Every function of this file is compiled for the ISA (no global -m flags). */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/q23k.h"
#include "engine/cpu/kernels_q56k.h"
#include "engine/cpu/qleg.h"
#include "engine/cpu/simd_avx2_impl.h"

#define AI static inline __attribute__((always_inline))

#define TILE_R 3
#define TILE_RMAX 8
#define TILE_C 4
#define KERN_PANEL_BYTES (128 * 1024)
#define PF_STREAM_BYTES 16384 /* decode: prefetch distance for weights streamed from memory */

/* Q4_0 / Q4_K: the F32 scale d (and min m, Q4_K) of the 32-element block holding element kb (a
 * multiple of 32), and the shift (0 or 4) that selects its nibbles. d * sc and dmin * m are
 * exact products (see engine/dtype.h). */
AI void q4_params(const int dt, const char *row, int64_t kb, float *d, float *m, int *shift)
{
    if (dt == DT_Q4_0) {
        const block_q4_0 *b = (const block_q4_0 *)row + (kb >> 5);
        *d = _cvtsh_ss(b->d);
        *m = 0.0f;
        *shift = 0;
    } else {
        const block_q4_K *b = (const block_q4_K *)row + (kb >> 8);
        int j = (int)((kb >> 5) & 7), sc, mn;
        q4k_scale_min(j, b->scales, &sc, &mn);
        *d = _cvtsh_ss(b->d) * (float)sc;
        *m = _cvtsh_ss(b->dmin) * (float)mn;
        *shift = (j & 1) * 4;
    }
}

/* Q4_0 / Q4_K: the 8 weights at kb + h (kb a multiple of 32, h in {0, 8, 16, 24}) from their
 * block's q4_params. Q4_0: d * (q - 8), exact. Q4_K: d * q - m with one rounding (fmsub; the
 * product is exact). */
AI __m256 q4_w8(const int dt, const char *row, int64_t kb, int h, __m256 d, __m256 m, int shift)
{
    const uint8_t *q;
    if (dt == DT_Q4_0) {
        q = ((const block_q4_0 *)row + (kb >> 5))->qs + (h & 15);
        shift = h & 16 ? 4 : 0;
    } else {
        q = ((const block_q4_K *)row + (kb >> 8))->qs + 32 * ((kb >> 6) & 3) + h;
    }
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    v = _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(15));
    if (dt == DT_Q4_0)
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(8))), d);
    return _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(v), m);
}

/* 8 elements of a row starting at element k. */
AI __m256 w_load(const int dt, const char *row, int64_t k)
{
    switch (dt) {
    case DT_F32:
        return _mm256_loadu_ps((const float *)row + k);
    case DT_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
    case DT_BF16: {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    case DT_Q4_0:
    case DT_Q4_K: { /* k is a multiple of 8 */
        float d, m;
        int shift;
        q4_params(dt, row, k & ~(int64_t)31, &d, &m, &shift);
        return q4_w8(dt, row, k & ~(int64_t)31, (int)(k & 31), _mm256_set1_ps(d),
                     _mm256_set1_ps(m), shift);
    }
    default: { /* DT_Q8_0; k is a multiple of 8 */
        const block_q8_0 *b = (const block_q8_0 *)row + (k >> 5);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
        __m128i q8 = _mm_loadl_epi64((const __m128i *)(b->qs + (k & 24)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), d);
    }
    }
}

/* The first n (< 8) elements at k, the rest 0; never Q8_0. */
AI __m256 w_load_part(const int dt, const char *row, int64_t k, int n)
{
    if (dt == DT_F32) {
        float tmp[8] = {0};
        memcpy(tmp, (const float *)row + k, (size_t)n * sizeof(float));
        return _mm256_loadu_ps(tmp);
    }
    uint16_t tmp[8] = {0};
    memcpy(tmp, (const uint16_t *)row + k, (size_t)n * sizeof(uint16_t));
    return w_load(dt, (const char *)tmp, 0);
}

AI __m256 x_load_part(const float *x, int n)
{
    float tmp[8] = {0};
    memcpy(tmp, x, (size_t)n * sizeof(float));
    return _mm256_loadu_ps(tmp);
}

/* Byte offset of element k within a row of F32, F16 or BF16 (the types the F32 tiles take). */
AI size_t elem_off(const int dt, int64_t k)
{
    return (size_t)k * (dt == DT_F32 ? 4 : 2);
}

/* acc[r][c] += w[r] * x[c * ldx .. + 8) for r < R, c < C (x at the step's first element). */
AI void fma_step(const int R, const int C, const __m256 *w, const float *x, int64_t ldx,
                 __m256 acc[][TILE_C])
{
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) {
        __m256 xv = _mm256_loadu_ps(x + c * ldx);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(w[r], xv, acc[r][c]);
    }
}

/* y[c * ldy + r] for r < R, c < C over all of K; pfd: prefetch distance in bytes (0: none). */
AI void tile(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t K,
             const float *x, int64_t ldx, float *y, int64_t ldy, size_t pfd)
{
    __m256 acc[TILE_RMAX][TILE_C];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 w[TILE_RMAX];
        if (pfd && (k & 15) == 0) {
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                kern_pf_stream(W + (size_t)r * wrb + elem_off(dt, k) + pfd);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) w[r] = w_load(dt, W + (size_t)r * wrb, k);
        fma_step(R, C, w, x + k, ldx, acc);
    }
    if (k < K) {
        int n = (int)(K - k);
        __m256 w[TILE_RMAX];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) w[r] = w_load_part(dt, W + (size_t)r * wrb, k, n);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m256 xv = x_load_part(x + c * ldx + k, n);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(w[r], xv, acc[r][c]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) y[c * ldy + r] = simd_hsum8(acc[r][c]);
}

AI void rows_pass(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t K,
                  const float *x, int64_t ldx, float *y, int64_t ldy, int64_t ob, int64_t oe,
                  size_t pfd)
{
    int64_t o = ob;
    for (; o + R <= oe; o += R)
        tile(dt, R, C, W + (size_t)o * wrb, wrb, K, x, ldx, y + o, ldy, pfd);
    for (; o < oe; o++) tile(dt, 1, C, W + (size_t)o * wrb, wrb, K, x, ldx, y + o, ldy, pfd);
}

/* The one pass of a few tokens over rows [ob, oe) streamed from memory, prefetching far ahead:
 * tiles of R rows spread over R runs (kernels_impl.h), then single rows. */
AI void rows_stream(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t K,
                    const float *x, int64_t ldx, float *y, int64_t ldy, int64_t ob, int64_t oe)
{
    const int64_t q = (oe - ob) / R;
    float t[KERN_SPREAD_MAX];
    for (int64_t i = 0; i < q; i++) {
        tile(dt, R, C, W + (size_t)(ob + i) * wrb, (size_t)q * wrb, K, x, ldx, t, R,
             PF_STREAM_BYTES);
        kern_spread_store(t, R, C, y + ob + i, ldy, q);
    }
    for (int64_t o = ob + R * q; o < oe; o++)
        tile(dt, 1, C, W + (size_t)o * wrb, wrb, K, x, ldx, y + o, ldy, PF_STREAM_BYTES);
}

AI void matmul_dt(const int dt, const char *W, size_t wrb, int64_t K, const float *x,
                  int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    /* Few tokens: one pass over the weights, streamed from memory; prefetch far ahead. */
    if (T == 1) {
        /* 8 rows per tile keep 8 accumulators and 8 widened weight vectors live, more than the
         * 16 registers: the F16 / BF16 tiles spilled (measured on a Zen 3: 4 rows stream
         * 10-30% faster). F32 weights are FMA memory operands, and Q4_0 is unmeasured: 8. */
        const int rows = dt == DT_F16 || dt == DT_BF16 ? 4 : 8;
        if (rows == 4) rows_stream(dt, 4, 1, W, wrb, K, x, ldx, y, ldy, o0, o1);
        else rows_stream(dt, 8, 1, W, wrb, K, x, ldx, y, ldy, o0, o1);
        return;
    }
    if (T == 2) {
        rows_stream(dt, 4, 2, W, wrb, K, x, ldx, y, ldy, o0, o1);
        return;
    }
    int64_t panel = wrb ? (int64_t)(KERN_PANEL_BYTES / wrb) : (o1 - o0);
    panel = panel < TILE_R ? TILE_R : panel / TILE_R * TILE_R;
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        int t = 0;
        for (; t + TILE_C <= T; t += TILE_C)
            rows_pass(dt, TILE_R, TILE_C, W, wrb, K, x + t * ldx, ldx, y + t * ldy, ldy, ob, oe,
                      t == 0 ? PF_STREAM_BYTES : 0);
        const float *xt = x + t * ldx;
        float *yt = y + t * ldy;
        switch (T - t) {
        case 1: rows_pass(dt, TILE_R, 1, W, wrb, K, xt, ldx, yt, ldy, ob, oe, 0); break;
        case 2: rows_pass(dt, TILE_R, 2, W, wrb, K, xt, ldx, yt, ldy, ob, oe, 0); break;
        case 3: rows_pass(dt, TILE_R, 3, W, wrb, K, xt, ldx, yt, ldy, ob, oe, 0); break;
        default: break;
        }
    }
}

static void mm_f32(const char *W, size_t wrb, int64_t K, const float *x, int64_t ldx, float *y,
                   int64_t ldy, int T, int64_t o0, int64_t o1)
{
    matmul_dt(DT_F32, W, wrb, K, x, ldx, y, ldy, T, o0, o1);
}
static void mm_f16(const char *W, size_t wrb, int64_t K, const float *x, int64_t ldx, float *y,
                   int64_t ldy, int T, int64_t o0, int64_t o1)
{
    matmul_dt(DT_F16, W, wrb, K, x, ldx, y, ldy, T, o0, o1);
}
static void mm_bf16(const char *W, size_t wrb, int64_t K, const float *x, int64_t ldx, float *y,
                    int64_t ldy, int T, int64_t o0, int64_t o1)
{
    matmul_dt(DT_BF16, W, wrb, K, x, ldx, y, ldy, T, o0, o1);
}
/* ---- Q4_K x int8 (kernels.h) ----
 * Per 32 bytes qs[32c .. 32c+31] of a super-block: low nibbles (sub-block 2c, x[64c ..]) and
 * high nibbles (sub-block 2c+1, x[64c+32 ..]); vpmaddubsw (never saturates: |pair| <= 3810),
 * vpmaddwd with the sub-block's scale broadcast, added: 8 exact int32 lanes per super-block.
 * Per super-block and token: acc = fma(float(lanes), d * dx, acc) in 8 lanes, accm =
 * fma(float(m . bsum pairs), dmin * dx, accm) in 4 lanes; y = hsum(acc) - hsum(accm). */

#define Q4K_TOK 4

AI void q4k_tile(const int C, const block_q4_K *row, int64_t nsb, const kern_q8k_t *xq,
                 float *y, int64_t ldy, size_t pfd)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[Q4K_TOK];
    __m128 accm[Q4K_TOK];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
        accm[c] = _mm_setzero_ps();
    }
    for (int64_t s = 0; s < nsb; s++) {
        const block_q4_K *b = row + s;
        q4k_prefetch(b, pfd);
        /* scales and mins to vector registers as two 64-bit words; vpshufb widens scale byte i
         * to every int16 lane (control 0x80 | i) */
        uint64_t sc64, mn64;
        q4k_unpack64(b->scales, &sc64, &mn64);
        const __m256i scb = _mm256_set1_epi64x((long long)sc64);
        const __m128i mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn64));
        __m256i S[8], Q[8];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
            Q[2 * j] = _mm256_and_si256(v, m4);
            Q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            S[2 * j] = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(0x8000 | (2 * j))));
            S[2 * j + 1] =
                _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(0x8000 | (2 * j + 1))));
        }
        uint32_t ddm; /* d, dmin: lanes 0, 1 */
        memcpy(&ddm, &b->d, 4);
        const __m128 dwm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ddm));
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const kern_q8k_t *xb = xq + c * nsb + s;
            __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m256i p = _mm256_maddubs_epi16(
                    Q[j], _mm256_loadu_si256((const __m256i *)(xb->q + 32 * j)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, S[j]));
            }
            __m128i ms = _mm_madd_epi16(mn, _mm_loadu_si128((const __m128i *)xb->bsum));
            const __m128 dd = _mm_mul_ps(dwm, _mm_set1_ps(xb->d)); /* d * dx, dmin * dx */
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcastss_ps(dd), acc[c]);
            accm[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(ms), _mm_shuffle_ps(dd, dd, 0x55), accm[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        __m128 h = _mm_add_ps(accm[c], _mm_movehl_ps(accm[c], accm[c]));
        float m = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        y[c * ldy] = simd_hsum8(acc[c]) - m;
    }
}

/* kern_q8k_quantize, the same bits (see kernels_avx512.c's q8k_quantize). */
static void q8k_quantize(const float *x, int64_t K, kern_q8k_t *out)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < K / KERN_Q8K; b++, x += KERN_Q8K, out++) {
        __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int i = 0; i < KERN_Q8K; i += 8) {
            __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absmask);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ));
            mx = _mm256_max_ps(mx, a);
        }
        memset(out, 0, sizeof *out);
        if (_mm256_movemask_ps(bad)) {
            out->d = NAN;
            continue;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if (amax == 0.0f) continue;
        out->d = amax / 127.0f;
        const __m256 is = _mm256_set1_ps(127.0f / amax);
        const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
        for (int j = 0; j < 8; j++) {
            __m256i q[4];
            for (int h = 0; h < 4; h++) {
                q[h] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * j + 8 * h), is));
                q[h] = _mm256_max_epi32(_mm256_min_epi32(q[h], lim), nlim);
            }
            /* packs interleave 128-bit lanes: fix the order with a permute */
            __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
            __m256i b8 = _mm256_packs_epi16(w01, w23);
            b8 = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(out->q + 32 * j), b8);
            __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            out->bsum[j] = (int16_t)_mm_cvtsi128_si32(s4);
        }
    }
}

void kern_q8k_quantize_avx2(const float *x, int64_t K, kern_q8k_t *out)
{
    q8k_quantize(x, K, out);
}

static void q4k_rows(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T,
                     float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    int64_t panel = T <= Q4K_TOK ? o1 - o0 : (int64_t)(KERN_PANEL_BYTES / wrb);
    if (panel < 1) panel = 1;
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        for (int t = 0; t < T; t += Q4K_TOK) {
            const kern_q8k_t *xt = xq + (int64_t)t * nsb;
            float *yt = y + (int64_t)t * ldy;
            const size_t pfd = t == 0 ? PF_STREAM_BYTES : 0;
            for (int64_t o = ob; o < oe; o++) {
                const block_q4_K *row = (const block_q4_K *)(W + (size_t)o * wrb);
                switch (T - t) {
                case 1: q4k_tile(1, row, nsb, xt, yt + o, ldy, pfd); break;
                case 2: q4k_tile(2, row, nsb, xt, yt + o, ldy, pfd); break;
                case 3: q4k_tile(3, row, nsb, xt, yt + o, ldy, pfd); break;
                default: q4k_tile(4, row, nsb, xt, yt + o, ldy, pfd); break;
                }
            }
        }
    }
}

/* ---- Q8_0 and Q4_0 x int8 (kernels.h) ----
 * Per block (weights w: Q8_0 its quants, Q4_0 its nibbles - 8) and token: vpmaddubsw of |w| and
 * xq with w's sign (vpsignb; pairs: |sum| <= 2 * 128 * 127, never saturates), vpmaddwd with
 * ones: 8 exact int32 lanes (lane l the sum of the products 4l .. 4l+3); acc = fma(float(lanes),
 * dw * dx, acc) for the blocks in order; y = simd_hsum8(acc). */

/* The 32 signed weights of block bl in x's order (Q8_0 quants, Q4_0 nibbles - 8) and its scale. */
AI __m256i b32_w32(const int dt, const char *bl, float *d)
{
    if (dt == DT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)bl;
        *d = _cvtsh_ss(b->d);
        return _mm256_loadu_si256((const __m256i *)b->qs);
    }
    const block_q4_0 *b = (const block_q4_0 *)bl;
    *d = _cvtsh_ss(b->d);
    __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

AI void b32_tile(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t nb,
                 const int8_t *xq, const float *xd, float *y, int64_t ldy, size_t pfd)
{
    const int64_t K = nb * 32;
    const size_t bs = dt == DT_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TILE_RMAX][TILE_C];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i xv[TILE_C];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            xv[c] = _mm256_loadu_si256((const __m256i *)(xq + c * K + 32 * b));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const char *bl = W + (size_t)r * wrb + (size_t)b * bs;
            if (pfd) kern_pf_stream(bl + pfd);
            float dw;
            const __m256i w = b32_w32(dt, bl, &dw);
            const __m256i aw = _mm256_abs_epi8(w);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[c], w));
                p = _mm256_madd_epi16(p, ones);
                const __m256 s = _mm256_set1_ps(dw * xd[c * nb + b]);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][c]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) y[c * ldy + r] = simd_hsum8(acc[r][c]);
}

/* Rows [ob, oe): tiles of R rows, then single rows. */
AI void b32_pass(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t nb,
                 const int8_t *xq, const float *xd, float *y, int64_t ldy, int64_t ob,
                 int64_t oe, size_t pfd)
{
    int64_t o = ob;
    for (; o + R <= oe; o += R)
        b32_tile(dt, R, C, W + (size_t)o * wrb, wrb, nb, xq, xd, y + o, ldy, pfd);
    for (; o < oe; o++) b32_tile(dt, 1, C, W + (size_t)o * wrb, wrb, nb, xq, xd, y + o, ldy, pfd);
}

/* The one pass of a few tokens over rows [ob, oe) streamed from memory: tiles of R rows spread
 * over R runs (kernels_impl.h), then single rows. */
AI void b32_stream(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t nb,
                   const int8_t *xq, const float *xd, float *y, int64_t ldy, int64_t ob,
                   int64_t oe)
{
    const int64_t q = (oe - ob) / R;
    float t[KERN_SPREAD_MAX];
    for (int64_t i = 0; i < q; i++) {
        b32_tile(dt, R, C, W + (size_t)(ob + i) * wrb, (size_t)q * wrb, nb, xq, xd, t, R,
                 PF_STREAM_BYTES);
        kern_spread_store(t, R, C, y + ob + i, ldy, q);
    }
    for (int64_t o = ob + R * q; o < oe; o++)
        b32_tile(dt, 1, C, W + (size_t)o * wrb, wrb, nb, xq, xd, y + o, ldy, PF_STREAM_BYTES);
}

AI void b32_rows(const int dt, const char *W, size_t wrb, int64_t nb, const int8_t *xq,
                 const float *xd, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    if (T <= 2) { /* one pass streaming the rows from memory */
        if (T == 1) b32_stream(dt, 4, 1, W, wrb, nb, xq, xd, y, ldy, o0, o1);
        else b32_stream(dt, 4, 2, W, wrb, nb, xq, xd, y, ldy, o0, o1);
        return;
    }
    /* panels of rows kept in L2 while every tile of tokens passes over them */
    const int64_t K = nb * 32;
    int64_t panel = (int64_t)(KERN_PANEL_BYTES / wrb);
    panel = panel < TILE_R ? TILE_R : panel / TILE_R * TILE_R;
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        int t = 0;
        for (; t + 3 <= T; t += 3)
            b32_pass(dt, TILE_R, 3, W, wrb, nb, xq + t * K, xd + t * nb, y + t * ldy, ldy, ob, oe,
                     t == 0 ? PF_STREAM_BYTES : 0);
        const int8_t *xt = xq + t * K;
        const float *xdt = xd + t * nb;
        float *yt = y + t * ldy;
        if (T - t == 1) b32_pass(dt, TILE_R, 1, W, wrb, nb, xt, xdt, yt, ldy, ob, oe, 0);
        if (T - t == 2) b32_pass(dt, TILE_R, 2, W, wrb, nb, xt, xdt, yt, ldy, ob, oe, 0);
    }
}

static void q80_rows(const char *W, size_t wrb, int64_t nb, const int8_t *xq, const float *xd,
                     int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    b32_rows(DT_Q8_0, W, wrb, nb, xq, xd, T, y, ldy, o0, o1);
}

static void q40_rows(const char *W, size_t wrb, int64_t nb, const int8_t *xq, const float *xd,
                     int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    b32_rows(DT_Q4_0, W, wrb, nb, xq, xd, T, y, ldy, o0, o1);
}

/* kern_q8_quantize, the same bits (as q8k_quantize). */
static void q8_quantize(const float *x, int64_t K, int8_t *q, float *d)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    for (int64_t b = 0; b < K / 32; b++, x += 32, q += 32) {
        __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int i = 0; i < 32; i += 8) {
            __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absmask);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ));
            mx = _mm256_max_ps(mx, a);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        const int nonfinite = _mm256_movemask_ps(bad) != 0;
        if (nonfinite || amax == 0.0f) {
            d[b] = nonfinite ? NAN : 0.0f;
            _mm256_storeu_si256((__m256i *)q, _mm256_setzero_si256());
            continue;
        }
        d[b] = amax / 127.0f;
        const __m256 is = _mm256_set1_ps(127.0f / amax);
        __m256i v[4];
        for (int h = 0; h < 4; h++) {
            v[h] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * h), is));
            v[h] = _mm256_max_epi32(_mm256_min_epi32(v[h], lim), nlim);
        }
        /* packs interleave 128-bit lanes: fix the order with a permute */
        __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]),
                                        _mm256_packs_epi32(v[2], v[3]));
        b8 = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q, b8);
    }
}

static void v_dequant_row(int wtype, const void *row, float *out, int64_t K);

static int v_matmul(int wtype, const void *W, size_t w_row_bytes, int64_t K, const float *x,
                    int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    if (wtype == DT_Q4_K)
        return kern_q4k_matmul(q4k_rows, q8k_quantize, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q2_K || wtype == DT_Q3_K) /* engine/cpu/q23k_avx2.c */
        return kern_q23k_matmul_avx2(wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q6_K || wtype == DT_Q5_K)
        return kern_q56k_matmul_avx2(wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (kern_qleg_type(wtype))
        return kern_qleg_matmul(&kern_qleg_avx2, wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q8_0 || wtype == DT_Q4_0)
        return kern_b32_matmul(wtype, wtype == DT_Q8_0 ? q80_rows : q40_rows, q8_quantize, W,
                               w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (!kern_wtype_ok(wtype, K)) return -1;
    if (T <= 0 || o1 <= o0) return 0;
    const char *w = W;
    switch (wtype) {
    case DT_F32: mm_f32(w, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1); break;
    case DT_F16: mm_f16(w, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1); break;
    default: mm_bf16(w, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1); break;
    }
    return 0;
}

/* ---- element-wise kernels (vector body, scalar tail) ---- */

static void v_dequant_row(int wtype, const void *row, float *out, int64_t K)
{
    const char *r = row;
    int64_t k = 0;
    switch (wtype) {
    case DT_F32:
        memcpy(out, row, (size_t)K * sizeof(float));
        return;
    case DT_F16:
        for (; k + 8 <= K; k += 8) _mm256_storeu_ps(out + k, w_load(DT_F16, r, k));
        for (; k < K; k++) out[k] = fp16_to_f32(((const uint16_t *)row)[k]);
        return;
    case DT_BF16:
        for (; k + 8 <= K; k += 8) _mm256_storeu_ps(out + k, w_load(DT_BF16, r, k));
        for (; k < K; k++) out[k] = bf16_to_f32(((const uint16_t *)row)[k]);
        return;
    case DT_Q8_0:
        for (; k + 8 <= K; k += 8) _mm256_storeu_ps(out + k, w_load(DT_Q8_0, r, k));
        return;
    case DT_Q4_0:
        for (; k + 8 <= K; k += 8) _mm256_storeu_ps(out + k, w_load(DT_Q4_0, r, k));
        return;
    case DT_Q4_K:
        for (; k + 8 <= K; k += 8) _mm256_storeu_ps(out + k, w_load(DT_Q4_K, r, k));
        return;
    case DT_Q6_K: case DT_Q5_K: case DT_Q2_K: case DT_Q3_K: /* dtype.h values (embeddings) */
        dtype_dequant_row(wtype, row, out, K);
        return;
    default: /* Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS: the portable widening */
        dtype_qleg_dequant_row(wtype, row, out, K);
        return;
    }
}

static float v_dot(const float *a, const float *b, int64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    if (i < n) s0 = _mm256_fmadd_ps(x_load_part(a + i, (int)(n - i)), x_load_part(b + i, (int)(n - i)), s0);
    return simd_hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

static void v_axpy(float a, const float *x, float *y, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

static void v_rmsnorm(const float *x, const float *w, float eps, float *out, int64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    if (i < n) {
        __m256 a = x_load_part(x + i, (int)(n - i));
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    float scale = 1.0f / sqrtf(simd_hsum8(_mm256_add_ps(s0, s1)) / (float)n + eps);
    __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                                _mm256_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* e^x for |x| <= 88 (see kernels_avx512.c); 2^n built in the exponent field. */
AI __m256 v_exp(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AI __m256 v_silu_mul1(__m256 g, __m256 u)
{
    __m256 e = v_exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void v_silu_mul(const float *gate, const float *up, float *out, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, v_silu_mul1(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        float tmp[8];
        int m = (int)(n - i);
        _mm256_storeu_ps(tmp, v_silu_mul1(x_load_part(gate + i, m), x_load_part(up + i, m)));
        memcpy(out + i, tmp, (size_t)m * sizeof(float));
    }
}

static void v_add(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

static void v_f32_to_f16(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = f32_to_fp16(x[i]);
}

static void v_f16_to_f32(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = fp16_to_f32(x[i]);
}

const kern_table_t kern_table_avx2 = {
    .name = "avx2",
    .matmul = v_matmul,
    .dequant_row = v_dequant_row,
    .dot_f32 = v_dot,
    .axpy_f32 = v_axpy,
    .rmsnorm = v_rmsnorm,
    .silu_mul = v_silu_mul,
    .add = v_add,
    .f32_to_f16 = v_f32_to_f16,
    .f16_to_f32 = v_f16_to_f32,
};

#if defined(__clang__)
#pragma clang attribute pop
#endif
