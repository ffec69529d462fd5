/* engine/cpu/kernels_avx512.c: AVX-512 (F, BW, VL, DQ) + FMA + F16C kernels.
 *
 * matmul arithmetic, per output element (t, o) -- fixed, so batch invariant:
 *   one 16-lane F32 accumulator; for each 16-element chunk of K in increasing order
 *   acc = fma(w[k..k+15], x[k..k+15], acc), the last partial chunk zero-padded (masked loads);
 *   then the fixed tree  h[i] = acc[i] + acc[i+8];  q[i] = h[i] + h[i+4];
 *   p[i] = q[i] + q[i+2];  y = p[0] + p[1].
 * Weights are widened to F32 exactly in registers: F16 by vcvtph2ps, BF16 by a 16-bit shift
 * (dequant_row also widens Q8_0, Q4_0 and Q4_K, as engine/dtype.h defines them). Q4_K, Q8_0 and
 * Q4_0 take int8 activations (kernels.h; their own sections below); Q4_1, Q5_0, Q5_1, IQ4_NL and
 * IQ4_XS too, in engine/cpu/qleg_avx512.c (dequant_row: the portable widening).
 *
 * Blocking: a tile is R = 4 rows x C <= 6 tokens (24 accumulators in zmm registers); each weight
 * vector is widened once per tile and used for C tokens, each x vector is used for R rows. The
 * rows of a call are cut into panels of about KERN_PANEL_BYTES of weights (kept in L2 while
 * every token tile of the batch passes over them). Tiles of other shapes (fewer tokens at the
 * end of a batch, single rows at the end of a range) do the identical per-element arithmetic. */
/* Every function of this file is compiled for the ISA (no global -m flags). */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
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
#include "engine/cpu/simd_avx512_impl.h"

#define AI static inline __attribute__((always_inline))

#ifndef TILE_R
#define TILE_R 4
#define TILE_C 6
#endif
#define TILE_RMAX 8
#define TILE_CMAX 8
#ifndef KERN_PANEL_BYTES
#define KERN_PANEL_BYTES (192 * 1024)
#endif
#ifndef KERN_KBLOCK
#define KERN_KBLOCK 512        /* K range of a blocked pass (multiple of 32) */
#endif
#ifndef KERN_KBLOCK_MIN
#define KERN_KBLOCK_MIN 1024   /* rows longer than this are cut into K ranges */
#endif
#define KERN_KBLOCK_ROWS 64    /* panel rows when cut (bounds the saved accumulators) */
#ifndef PF_STREAM_BYTES
#define PF_STREAM_BYTES 16384
#endif
#ifndef PF_PANEL_BYTES
#define PF_PANEL_BYTES 256
#endif

/* ---- weight widening: 16 elements of a row starting at element k ---- */

/* Q8_0: the scale of the block holding element k, in every lane. */
AI __m512 q8_scale(const char *row, int64_t k)
{
    const block_q8_0 *b = (const block_q8_0 *)row + (k >> 5);
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)b->d));
}

/* Q8_0: the 16 weights at k (a multiple of 16), float(q) * d -- exact. */
AI __m512 q8_half(const char *row, int64_t k, __m512 d)
{
    const block_q8_0 *b = (const block_q8_0 *)row + (k >> 5);
    __m128i q8 = _mm_loadu_si128((const __m128i *)(b->qs + (k & 16)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8)), d);
}

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

/* Q4_0 / Q4_K: the 16 weights at kb + h (kb a multiple of 32, h 0 or 16) from their block's
 * q4_params. The nibbles, zero-extended to 32 bits, index a 16-entry table of their F32 values
 * (vpermps reads only the low 4 bits of each index, so the high nibble needs a shift and the
 * low one no mask). Q4_0: table q - 8, times d: exact. Q4_K: table q, d * q - m with one
 * rounding (fmsub; the product is exact). */
AI __m512 q4_w16(const int dt, const char *row, int64_t kb, int h, __m512 d, __m512 m, int shift)
{
    const uint8_t *q;
    if (dt == DT_Q4_0) {
        q = ((const block_q4_0 *)row + (kb >> 5))->qs;
        shift = h ? 4 : 0;
    } else {
        q = ((const block_q4_K *)row + (kb >> 8))->qs + 32 * ((kb >> 6) & 3) + h;
    }
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    v = _mm512_srl_epi32(v, _mm_cvtsi32_si128(shift));
    if (dt == DT_Q4_0) {
        const __m512 tbl = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
        return _mm512_mul_ps(_mm512_permutexvar_ps(v, tbl), d);
    }
    const __m512 tbl = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_fmsub_ps(d, _mm512_permutexvar_ps(v, tbl), m);
}

AI __m512 w_load(const int dt, const char *row, int64_t k)
{
    switch (dt) {
    case DT_F32:
        return _mm512_loadu_ps((const float *)row + k);
    case DT_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k)));
    case DT_BF16: {
        __m512i v = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    case DT_Q4_0:
    case DT_Q4_K: { /* k is a multiple of 16 */
        float d, m;
        int shift;
        q4_params(dt, row, k & ~(int64_t)31, &d, &m, &shift);
        return q4_w16(dt, row, k & ~(int64_t)31, (int)(k & 16), _mm512_set1_ps(d),
                      _mm512_set1_ps(m), shift);
    }
    default: /* DT_Q8_0; k is a multiple of 16 */
        return q8_half(row, k, q8_scale(row, k));
    }
}

/* The lanes of m only (others 0); never Q8_0 (its K is a multiple of 32). */
AI __m512 w_load_mask(const int dt, const char *row, int64_t k, __mmask16 m)
{
    switch (dt) {
    case DT_F32:
        return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    case DT_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
    default: { /* DT_BF16 */
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    }
}

/* ---- the fixed horizontal reduction ---- */

/* y[c * ldy + r] = the fixed reduction (simd_hsum16's tree) of acc[r][c], r < R, c < C: rows in
 * fours through simd_hsum16x4, the rest's tokens in fours. */
AI void tile_store(const int R, const int C, __m512 acc[TILE_RMAX][TILE_CMAX], float *y,
                   int64_t ldy)
{
    int r0 = 0;
#pragma GCC unroll 8
    for (; r0 + 4 <= R; r0 += 4)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            _mm_storeu_ps(y + c * ldy + r0,
                          simd_hsum16x4(acc[r0][c], acc[r0 + 1][c], acc[r0 + 2][c], acc[r0 + 3][c]));
#pragma GCC unroll 8
    for (int r = r0; r < R; r++) {
        int c = 0;
#pragma GCC unroll 8
        for (; c + 4 <= C; c += 4) {
            float s4[4];
            _mm_storeu_ps(s4, simd_hsum16x4(acc[r][c], acc[r][c + 1], acc[r][c + 2], acc[r][c + 3]));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) y[(c + i) * ldy + r] = s4[i];
        }
#pragma GCC unroll 8
        for (; c < C; c++) y[c * ldy + r] = simd_hsum16(acc[r][c]);
    }
}

/* ---- register tile: R rows x C tokens over the whole of K ---- */

/* Byte offset of element k within a row of F32, F16 or BF16 (the types the F32 tiles take). */
AI size_t elem_off(const int dt, int64_t k)
{
    return (size_t)k * (dt == DT_F32 ? 4 : 2);
}

/* One line of a row pf bytes ahead: into L1 (rows already in L2) or streamed from memory. */
AI void pf_row(const char *p, int l1)
{
    if (l1) _mm_prefetch(p, _MM_HINT_T0);
    else kern_pf_stream(p);
}

/* The part [k0, k1) of a tile's sums: y[c * ldy + r] for r < R, c < C, with W at the tile's
 * first row and x, y at its first token. k0, k1 are multiples of 32 (or k1 = K). A tile whose K
 * is cut into several ranges keeps its accumulators in save[r * C + c] in between (stored and
 * reloaded unchanged, so the arithmetic is that of one pass); the range with k1 = K reduces
 * and writes y. pfd: bytes ahead of each row's read position to prefetch (0: none), into L1 when
 * pf_l1 (rows already in L2), else streamed from memory (kern_pf_stream). */
AI void tile(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t k0,
             int64_t k1, int64_t K, const float *x, int64_t ldx, float *y, int64_t ldy,
             size_t pfd, int pf_l1, __m512 *save)
{
    const int blocked = save != NULL; /* a constant wherever tile is inlined */
    __m512 acc[TILE_RMAX][TILE_CMAX];
    if (!blocked || k0 == 0) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) acc[r][c] = save[r * C + c];
    }

    int64_t k = k0;
    if (dt == DT_F16 || dt == DT_BF16) {
        /* 2-byte weights: 32 per step, so that each row gets one prefetch per cache line */
        for (; k + 32 <= k1; k += 32) {
            if (pfd) {
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    pf_row(W + (size_t)r * wrb + elem_off(dt, k) + pfd, pf_l1);
            }
#pragma GCC unroll 2
            for (int h = 0; h < 32; h += 16) {
                __m512 w[TILE_RMAX];
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) w[r] = w_load(dt, W + (size_t)r * wrb, k + h);
#pragma GCC unroll 8
                for (int c = 0; c < C; c++) {
                    __m512 xv = _mm512_loadu_ps(x + c * ldx + k + h);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(w[r], xv, acc[r][c]);
                }
            }
        }
    }
    for (; k + 16 <= k1; k += 16) {
        __m512 w[TILE_RMAX];
        if (pfd) {
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) pf_row(W + (size_t)r * wrb + elem_off(dt, k) + pfd, pf_l1);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) w[r] = w_load(dt, W + (size_t)r * wrb, k);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 xv = _mm512_loadu_ps(x + c * ldx + k);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(w[r], xv, acc[r][c]);
        }
    }
    if (blocked && k1 < K) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) save[r * C + c] = acc[r][c];
        return;
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 w[TILE_RMAX];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) w[r] = w_load_mask(dt, W + (size_t)r * wrb, k, m);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + c * ldx + k);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(w[r], xv, acc[r][c]);
        }
    }

    tile_store(R, C, acc, y, ldy);
}

/* The first PF_STREAM_BYTES of a range of n bytes about to be streamed (the tiles prefetch
 * PF_STREAM_BYTES ahead of their position, so these would wait for the hardware prefetcher). */
AI void stream_head(const char *p, size_t n)
{
    if (n > PF_STREAM_BYTES) n = PF_STREAM_BYTES;
    for (size_t o = 0; o < n; o += 64) kern_pf_stream(p + o);
}

/* Rows [ob, oe) for tokens [0, C) of x/y (already offset to the tile's first token), in tiles
 * of R rows then single rows. With save (room for (oe - ob) * C vectors), K is cut into ranges
 * of KERN_KBLOCK and each range passes over all the rows before the next, so the x slice of a
 * range stays in L1. pfd, pf_l1: as tile's. */
AI void rows_pass(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t K,
                  const float *x, int64_t ldx, float *y, int64_t ldy, int64_t ob, int64_t oe,
                  size_t pfd, int pf_l1, __m512 *save)
{
    if (!save) {
        int64_t o = ob;
        for (; o + R <= oe; o += R)
            tile(dt, R, C, W + (size_t)o * wrb, wrb, 0, K, K, x, ldx, y + o, ldy, pfd, pf_l1, NULL);
        for (; o < oe; o++)
            tile(dt, 1, C, W + (size_t)o * wrb, wrb, 0, K, K, x, ldx, y + o, ldy, pfd, pf_l1, NULL);
        return;
    }
    for (int64_t k0 = 0; k0 < K; k0 += KERN_KBLOCK) {
        int64_t k1 = K - k0 <= KERN_KBLOCK ? K : k0 + KERN_KBLOCK;
        int64_t o = ob;
        for (; o + R <= oe; o += R)
            tile(dt, R, C, W + (size_t)o * wrb, wrb, k0, k1, K, x, ldx, y + o, ldy, pfd, pf_l1,
                 save + (o - ob) * C);
        for (; o < oe; o++)
            tile(dt, 1, C, W + (size_t)o * wrb, wrb, k0, k1, K, x, ldx, y + o, ldy, pfd, pf_l1,
                 save + (o - ob) * C);
    }
}

/* The one pass of a few tokens over rows [ob, oe) streamed from memory, prefetching far ahead:
 * tiles of R rows spread over R runs (kernels_impl.h), then single rows. */
AI void rows_stream(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t K,
                    const float *x, int64_t ldx, float *y, int64_t ldy, int64_t ob, int64_t oe)
{
    const int64_t q = (oe - ob) / R;
    float t[KERN_SPREAD_MAX];
    for (int64_t i = 0; i < q; i++) {
        tile(dt, R, C, W + (size_t)(ob + i) * wrb, (size_t)q * wrb, 0, K, K, x, ldx, t, R,
             PF_STREAM_BYTES, 0, NULL);
        kern_spread_store(t, R, C, y + ob + i, ldy, q);
    }
    for (int64_t o = ob + R * q; o < oe; o++)
        tile(dt, 1, C, W + (size_t)o * wrb, wrb, 0, K, K, x, ldx, y + o, ldy, PF_STREAM_BYTES,
             0, NULL);
}

AI void matmul_dt(const int dt, const char *W, size_t wrb, int64_t K, const float *x,
                  int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    /* Few tokens: one pass over the weights, streamed from memory. */
    if (T <= 6) stream_head(W + (size_t)o0 * wrb, (size_t)(o1 - o0) * wrb);
    switch (T) {
    case 1: rows_stream(dt, 8, 1, W, wrb, K, x, ldx, y, ldy, o0, o1); return;
    case 2: rows_stream(dt, 8, 2, W, wrb, K, x, ldx, y, ldy, o0, o1); return;
    case 3: rows_stream(dt, 4, 3, W, wrb, K, x, ldx, y, ldy, o0, o1); return;
    case 4: rows_stream(dt, 4, 4, W, wrb, K, x, ldx, y, ldy, o0, o1); return;
    case 5: rows_stream(dt, 4, 5, W, wrb, K, x, ldx, y, ldy, o0, o1); return;
    case 6: rows_stream(dt, 4, 6, W, wrb, K, x, ldx, y, ldy, o0, o1); return;
    default: break;
    }
    /* Many tokens: panels of rows kept in L2 while every token tile passes over them; the
     * first pass streams the panel in from memory. Long rows are cut into K ranges (F32). The
     * later passes prefetch: F32 its own rows from L2 into L1; F16 and BF16 the next panel from
     * memory into L2, each line of it as the pass reaches the same line of this panel, so that
     * the next first pass does not wait on memory. */
    int64_t panel = wrb ? (int64_t)(KERN_PANEL_BYTES / wrb) : (o1 - o0);
    panel = panel < TILE_R ? TILE_R : panel / TILE_R * TILE_R;
    __m512 *save = NULL;
    __m512 save_buf[KERN_KBLOCK_ROWS * TILE_C];
    if (dt == DT_F32 && K > KERN_KBLOCK_MIN) { /* measured: helps F32 only */
        save = save_buf;
        if (panel > KERN_KBLOCK_ROWS) panel = KERN_KBLOCK_ROWS;
    }
    const int l1 = dt == DT_F32; /* the later passes' prefetch: into L1, or the next panel */
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        const size_t pf = l1 ? PF_PANEL_BYTES : oe < o1 ? (size_t)panel * wrb : 0;
        int t = 0;
        for (; t + TILE_C <= T; t += TILE_C)
            rows_pass(dt, TILE_R, TILE_C, W, wrb, K, x + t * ldx, ldx, y + t * ldy, ldy, ob, oe,
                      t == 0 ? PF_STREAM_BYTES : pf, t == 0 ? 0 : l1, save);
        const float *xt = x + t * ldx;
        float *yt = y + t * ldy;
        switch (T - t) {
        case 1: rows_pass(dt, TILE_R, 1, W, wrb, K, xt, ldx, yt, ldy, ob, oe, pf, l1, save); break;
        case 2: rows_pass(dt, TILE_R, 2, W, wrb, K, xt, ldx, yt, ldy, ob, oe, pf, l1, save); break;
        case 3: rows_pass(dt, TILE_R, 3, W, wrb, K, xt, ldx, yt, ldy, ob, oe, pf, l1, save); break;
        case 4: rows_pass(dt, TILE_R, 4, W, wrb, K, xt, ldx, yt, ldy, ob, oe, pf, l1, save); break;
        case 5: rows_pass(dt, TILE_R, 5, W, wrb, K, xt, ldx, yt, ldy, ob, oe, pf, l1, save); break;
#if TILE_C > 6
        case 6: rows_pass(dt, TILE_R, 6, W, wrb, K, xt, ldx, yt, ldy, ob, oe, pf, l1, save); break;
        case 7: rows_pass(dt, TILE_R, 7, W, wrb, K, xt, ldx, yt, ldy, ob, oe, pf, l1, save); break;
#endif
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
 * Per 64-weight chunk c of a super-block (qs[32c .. 32c+31]): the 32 bytes broadcast to both
 * halves of a zmm, the upper half shifted right by 4, masked: bytes 0..31 are sub-block 2c's
 * nibbles, bytes 32..63 sub-block 2c+1's -- the order of x[64c .. 64c+63]. vpmaddubsw (u4 x s8,
 * pairs: |sum| <= 3810, never saturates), then vpmaddwd with the sub-block's scale in every
 * 16-bit lane (int32 lanes: sc * sum of 4 products), added over the 4 chunks: 16 exact int32
 * lanes (|lane| < 2^21, so their conversion to F32 is exact). Per super-block and token:
 * acc = fma(float(lanes), d * dx, acc) in 16 lanes, and the mins' exact integer
 * mi = sum_j m_j * bsum_j (|mi| < 2^21) into one F32 accumulator, accm = fma(float(mi), dmin * dx,
 * accm); y = simd_hsum16(acc) - accm. With one token mi is the sum of vpmaddwd's 4 lanes of mins
 * x bsum pairs; with several (tiles of one row) it comes for Q4K_TOK tokens at once, one token
 * per lane, from the tile's bsum pairs laid out across tokens (q4k_layout): the same integers,
 * so a row and token get the same bits whatever the tile. */

#define Q4K_TOK 8  /* tokens per tile */
#define Q4K_ROWS 4 /* rows per tile with one token */

/* acc + the pairwise products of the int16 lanes of p and s, summed in pairs into int32 lanes:
 * vpmaddwd + vpaddd, or with vnni the one AVX512-VNNI vpdpwssd (the same exact integers; inline
 * assembly, so this file needs no VNNI target; called with vnni only where the CPU has it). */
AI __m512i madd_acc(const int vnni, __m512i acc, __m512i p, __m512i s)
{
    if (vnni) {
        __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(p), "v"(s));
        return acc;
    }
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
}

/* Tokens' bsum pairs and scales laid out across tokens for the several-token tiles: for super-block
 * s, bt[(4 s + p) * Q4K_TOK + c] = bsum[2p] | bsum[2p+1] << 16 of token c and dxt[s * Q4K_TOK + c]
 * = its d, for c < C; 0 for c >= C. xq: C tokens of nsb super-blocks each (token stride nsb). */
AI void q4k_layout(const kern_q8k_t *xq, int C, int64_t nsb, int32_t *bt, float *dxt)
{
    for (int64_t s = 0; s < nsb; s++) {
        for (int p = 0; p < 4; p++)
            for (int c = 0; c < Q4K_TOK; c++) {
                int32_t v = 0;
                if (c < C) memcpy(&v, xq[c * nsb + s].bsum + 2 * p, 4);
                bt[(4 * s + p) * Q4K_TOK + c] = v;
            }
        for (int c = 0; c < Q4K_TOK; c++) dxt[s * Q4K_TOK + c] = c < C ? xq[c * nsb + s].d : 0.0f;
    }
}

/* Rows [0, R) at `row` (stride wrb, nsb super-blocks each) against C tokens of xq (token stride
 * nsb); y[c * ldy + r]. Either R rows (R <= Q4K_ROWS) and C == 1, or R == 1 and C tokens (C <=
 * Q4K_TOK) with bt, dxt from q4k_layout of the same C tokens (NULL when C == 1). A row's
 * arithmetic does not depend on R or C: its own accumulators, the super-blocks in order, and the
 * fixed reductions (four rows at once through simd_hsum16x4, the same trees as one row's). */
AI void q4k_tile(const int vnni, const int R, const int C, const block_q4_K *row, size_t wrb,
                 int64_t nsb, const kern_q8k_t *xq, const int32_t *bt, const float *dxt,
                 float *y, int64_t ldy, size_t pfd)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i shv = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512 acc[Q4K_ROWS][Q4K_TOK];
    __m128 accm1[Q4K_ROWS]; /* C == 1, R < 4: row r's mins accumulator in lane 0 */
    __m128 accm4 = _mm_setzero_ps(); /* C == 1, R == 4: row r's in lane r */
    __m256 accm8 = _mm256_setzero_ps(); /* C > 1: token c's mins accumulator in lane c */
    __m128i mir[Q4K_ROWS]; /* C == 1: row r's mins x bsum pairs of the super-block */
    __m128 dmr[Q4K_ROWS];  /* C == 1: row r's dmin in lane 0 */
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        accm1[r] = _mm_setzero_ps();
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    }
    for (int64_t s = 0; s < nsb; s++) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const block_q4_K *b = (const block_q4_K *)((const char *)row + (size_t)r * wrb) + s;
            q4k_prefetch(b, pfd);
            uint64_t sc64, mn64; /* in general registers until one move each */
            q4k_unpack64(b->scales, &sc64, &mn64);
            /* the 8 scale bytes in every 64-bit lane; vpshufb widens byte i to an int16 lane
             * (control 0x80 | i: byte i, then a zero byte) */
            const __m512i scb = _mm512_set1_epi64((long long)sc64);
            const __m128i mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn64));
            __m512i S[4], Q[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m512i ctl = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_set1_epi16((short)(0x8000 | (2 * j)))),
                    _mm256_set1_epi16((short)(0x8000 | (2 * j + 1))), 1);
                S[j] = _mm512_shuffle_epi8(scb, ctl);
                __m512i v =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * j)));
                Q[j] = _mm512_and_si512(_mm512_srlv_epi16(v, shv), m4);
            }
            uint32_t ddm; /* d, dmin: lanes 0, 1 */
            memcpy(&ddm, &b->d, 4);
            const __m128 dwm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ddm));
            const float d = _mm_cvtss_f32(dwm);
            const __m128 dmin = _mm_movehdup_ps(dwm); /* lane 0: dmin */
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const kern_q8k_t *xb = xq + c * nsb + s;
                __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    __m512i p = _mm512_maddubs_epi16(Q[j], _mm512_loadu_si512(xb->q + 64 * j));
                    isum = madd_acc(vnni, isum, p, S[j]);
                }
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * xb->d),
                                            acc[r][c]);
            }
            if (C == 1) { /* summed and accumulated below, all rows at once */
                mir[r] = _mm_madd_epi16(mn, _mm_loadu_si128((const __m128i *)xq[s].bsum));
                dmr[r] = dmin;
            } else { /* R == 1 */
                const __m256i mn8 = _mm256_castsi128_si256(mn);
                const int32_t *bs = bt + 4 * s * Q4K_TOK;
                __m256i mi = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) {
                    const __m256i mp = _mm256_permutevar8x32_epi32(mn8, _mm256_set1_epi32(p));
                    const __m256i bp = _mm256_loadu_si256((const __m256i *)(bs + p * Q4K_TOK));
                    mi = _mm256_add_epi32(mi, _mm256_madd_epi16(mp, bp));
                }
                const __m256 dm = _mm256_mul_ps(_mm256_broadcastss_ps(dmin),
                                                _mm256_loadu_ps(dxt + s * Q4K_TOK));
                accm8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mi), dm, accm8);
            }
        }
        if (C == 1 && R == 4) { /* lane r: row r's sum of its 4 lanes; dmin * dx; fma */
            const __m128i mi = _mm_hadd_epi32(_mm_hadd_epi32(mir[0], mir[1]),
                                              _mm_hadd_epi32(mir[2], mir[3]));
            const __m128 dm4 = _mm_unpacklo_ps(_mm_unpacklo_ps(dmr[0], dmr[2]),
                                               _mm_unpacklo_ps(dmr[1], dmr[3]));
            accm4 = _mm_fmadd_ps(_mm_cvtepi32_ps(mi), _mm_mul_ps(dm4, _mm_set1_ps(xq[s].d)), accm4);
        } else if (C == 1) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m128i mi = _mm_add_epi32(mir[r], _mm_shuffle_epi32(mir[r], 0x4e));
                mi = _mm_add_epi32(mi, _mm_shuffle_epi32(mi, 0xb1));
                const __m128 dm = _mm_mul_ss(dmr[r], _mm_set_ss(xq[s].d));
                accm1[r] = _mm_fmadd_ss(_mm_cvtepi32_ps(mi), dm, accm1[r]);
            }
        }
    }
    if (C > 1) {
        float m[Q4K_TOK];
        _mm256_storeu_ps(m, accm8);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) y[c * ldy] = simd_hsum16(acc[0][c]) - m[c];
        return;
    }
    if (R == 4) {
        _mm_storeu_ps(y, _mm_sub_ps(simd_hsum16x4(acc[0][0], acc[1][0], acc[2][0], acc[3][0]),
                                    accm4));
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) y[r] = simd_hsum16(acc[r][0]) - _mm_cvtss_f32(accm1[r]);
}

/* kern_q8k_quantize, the same bits: max|x| is exact in any order, d and 1/d are the same
 * divisions, v = x * is the same product, vcvtps2dq rounds to nearest even as the portable
 * code's magic-number addition does for |v| <= 127.x, and the sums are integers. */
static void q8k_quantize(const float *x, int64_t K, kern_q8k_t *out)
{
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < K / KERN_Q8K; b++, x += KERN_Q8K, out++) {
        __m512 mx = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int i = 0; i < KERN_Q8K; i += 16) {
            __m512 a = _mm512_and_ps(_mm512_loadu_ps(x + i), absmask);
            bad |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ);
            mx = _mm512_max_ps(mx, a);
        }
        memset(out, 0, sizeof *out);
        if (bad) {
            out->d = NAN;
            continue;
        }
        const float amax = _mm512_reduce_max_ps(mx);
        if (amax == 0.0f) continue;
        out->d = amax / 127.0f;
        const __m512 is = _mm512_set1_ps(127.0f / amax);
        const __m512i lim = _mm512_set1_epi32(127);
        for (int j = 0; j < 8; j++) {
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j), is));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j + 16), is));
            q0 = _mm512_max_epi32(_mm512_min_epi32(q0, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
            q1 = _mm512_max_epi32(_mm512_min_epi32(q1, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
            _mm_storeu_si128((__m128i *)(out->q + 32 * j), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(out->q + 32 * j + 16), _mm512_cvtepi32_epi8(q1));
            out->bsum[j] = (int16_t)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
    }
}

void kern_q8k_quantize_avx512(const float *x, int64_t K, kern_q8k_t *out)
{
    q8k_quantize(x, K, out);
}

AI void q4k_rows_isa(const int vnni, const char *W, size_t wrb, int64_t nsb,
                    const kern_q8k_t *xq, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    /* rows in panels kept in L2 while every tile of tokens passes over them; with few tokens,
     * one streamed pass prefetching ahead */
    int64_t panel = T <= Q4K_TOK ? o1 - o0 : (int64_t)(KERN_PANEL_BYTES / wrb);
    if (panel < 1) panel = 1;
    if (T <= Q4K_TOK) stream_head(W + (size_t)o0 * wrb, (size_t)(o1 - o0) * wrb);
    int32_t bt[KERN_Q8K_STACK * 4 * Q4K_TOK]; /* q4k_layout of the current token tile */
    float dxt[KERN_Q8K_STACK * Q4K_TOK];
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        for (int t = 0; t < T; t += Q4K_TOK) {
            const kern_q8k_t *xt = xq + (int64_t)t * nsb;
            float *yt = y + (int64_t)t * ldy;
            if (T - t > 1) q4k_layout(xt, T - t < Q4K_TOK ? T - t : Q4K_TOK, nsb, bt, dxt);
            const size_t pfd = t == 0 ? PF_STREAM_BYTES : 0;
            int64_t o = ob;
            if (T - t == 1) { /* one token: rows in fours (the x block loads and the reductions
                                 shared), spread over four runs (kernels_impl.h) */
                const int64_t q = (oe - ob) / Q4K_ROWS;
                float ts[Q4K_ROWS];
                for (int64_t i = 0; i < q; i++) {
                    q4k_tile(vnni, Q4K_ROWS, 1, (const block_q4_K *)(W + (size_t)(ob + i) * wrb),
                             (size_t)q * wrb, nsb, xt, NULL, NULL, ts, Q4K_ROWS, pfd);
                    kern_spread_store(ts, Q4K_ROWS, 1, yt + ob + i, ldy, q);
                }
                o = ob + Q4K_ROWS * q;
            }
            for (; o < oe; o++) {
                const block_q4_K *row = (const block_q4_K *)(W + (size_t)o * wrb);
                switch (T - t) {
                case 1: q4k_tile(vnni, 1, 1, row, wrb, nsb, xt, NULL, NULL, yt + o, ldy, pfd);
                    break;
                case 2: q4k_tile(vnni, 1, 2, row, wrb, nsb, xt, bt, dxt, yt + o, ldy, pfd); break;
                case 3: q4k_tile(vnni, 1, 3, row, wrb, nsb, xt, bt, dxt, yt + o, ldy, pfd); break;
                case 4: q4k_tile(vnni, 1, 4, row, wrb, nsb, xt, bt, dxt, yt + o, ldy, pfd); break;
                case 5: q4k_tile(vnni, 1, 5, row, wrb, nsb, xt, bt, dxt, yt + o, ldy, pfd); break;
                case 6: q4k_tile(vnni, 1, 6, row, wrb, nsb, xt, bt, dxt, yt + o, ldy, pfd); break;
                case 7: q4k_tile(vnni, 1, 7, row, wrb, nsb, xt, bt, dxt, yt + o, ldy, pfd); break;
                default: q4k_tile(vnni, 1, 8, row, wrb, nsb, xt, bt, dxt, yt + o, ldy, pfd); break;
                }
            }
        }
    }
}

static void q4k_rows(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T,
                     float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    q4k_rows_isa(0, W, wrb, nsb, xq, T, y, ldy, o0, o1);
}

static void q4k_rows_vnni(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T,
                          float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    q4k_rows_isa(1, W, wrb, nsb, xq, T, y, ldy, o0, o1);
}

/* ---- Q8_0 and Q4_0 x int8 (kernels.h) ----
 * Per pair of blocks (64 weights w, the order of x[64p .. 64p+63]; Q8_0 its quants, Q4_0 its
 * nibbles - 8) and token: 16 exact int32 lanes, lane l the sum of the 4 products w_k * xq_k,
 * k = 64p + 4l .. 4l+3 (|lane| <= 4 * 128 * 127): with VNNI, vpdpbusd of the weights offset to
 * unsigned (Q8_0 w + 128, the byte's top bit flipped; Q4_0 w + 8, its nibble) and xq, started
 * from -128 (-8) * (the sums of xq's groups of 4); without, vpmaddubsw of |w| and xq with w's
 * sign (pairs: |sum| <= 2 * 128 * 127, never saturates), then vpmaddwd with ones. Then
 * acc = fma(float(lanes), dw * dx, acc), dw * dx one F32 product per block in its 8 lanes, for the
 * pairs in order (an odd last block alone, the other 8 lanes 0); y = simd_hsum16(acc). */

#define B32_R 4 /* rows x tokens of a tile with many tokens (measured 2026-12-01 on the Zen 5 build
                   machine, T = 512: 4 x 4 and 4 x 5 the same, 3 x 4 and 8 x 2 1-12% slower, 2 x 6
                   10-20% slower) */
#define B32_C 3

/* The quants of blocks b, b + 1 of a row (b + 1 < nb) or of block b alone (the upper half 0
 * for Q8_0, 8 for Q4_0), in x's order: Q8_0 its signed quants, Q4_0 its nibbles (0..15, the
 * weight nibble - 8). bl: block b. */
AI __m512i b32_w64(const int dt, const char *bl, const int two)
{
    if (dt == DT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)bl;
        __m256i lo = _mm256_loadu_si256((const __m256i *)b[0].qs);
        if (!two) return _mm512_zextsi256_si512(lo);
        return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                  _mm256_loadu_si256((const __m256i *)b[1].qs), 1);
    }
    const block_q4_0 *b = (const block_q4_0 *)bl;
    __m128i q0 = _mm_loadu_si128((const __m128i *)b[0].qs);
    /* a missing second block: nibbles 8, weight 0 */
    __m128i q1 = two ? _mm_loadu_si128((const __m128i *)b[1].qs) : _mm_set1_epi8((char)0x88);
    /* 128-bit lanes q0, q0, q1, q1; the second of each pair shifted to its high nibbles */
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q0, q0)),
                                   _mm256_set_m128i(q1, q1), 1);
    v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}

/* Lane 0 of v in lanes 0..7, lane 1 in lanes 8..15: a block pair's two scales, each over its
 * block's 8 int32 sums. */
AI __m512 b32_spread(__m128 v)
{
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

/* The two blocks' scales, each in its 8 lanes (or the first alone, the rest 0): one 32-bit
 * move of both F16 values, one conversion, one permutation. */
AI __m512 b32_d16(const int dt, const char *bl, const int two)
{
    const size_t bs = dt == DT_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
    uint16_t d0, d1 = 0; /* the scale d is each block's first member */
    memcpy(&d0, bl, 2);
    if (two) memcpy(&d1, bl + bs, 2);
    return b32_spread(_mm_cvtph_ps(_mm_cvtsi32_si128((int)(d0 | (uint32_t)d1 << 16))));
}

/* A token's x scales of blocks b, b + 1 (or b alone), each in its 8 lanes. */
AI __m512 b32_x16(const float *d, const int two)
{
    return b32_spread(two ? _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)d)) : _mm_load_ss(d));
}

/* Rows [0, R) at W (stride wrb) against tokens [0, C) of xq/xd (strides nb * 32, nb); y[c * ldy
 * + r]. */
AI void b32_tile(const int dt, const int vnni, const int R, const int C, const char *W, size_t wrb,
                 int64_t nb, const int8_t *xq, const float *xd, float *y, int64_t ldy, size_t pfd)
{
    const int64_t K = nb * 32;
    const size_t bs = dt == DT_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
    __m512 acc[TILE_RMAX][TILE_CMAX];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        __m512i xv[TILE_CMAX], nc[TILE_CMAX];
        __m512 dx[TILE_CMAX];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const int8_t *q = xq + c * K + 32 * b;
            xv[c] = two ? _mm512_loadu_si512(q)
                        : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)q));
            dx[c] = b32_x16(xd + c * nb + b, two);
            if (vnni) /* -(the unsigned operand's offset) * the sums of xq's groups of 4 */
                nc[c] = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_set1_epi8(1), xv[c]),
                                          _mm512_set1_epi16(dt == DT_Q8_0 ? -128 : -8));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const char *bl = W + (size_t)r * wrb + (size_t)b * bs;
            if (pfd) { /* every line of the pair: Q8_0's 68 bytes span two (measured: one per
                        * pair streams 15-20% slower from memory) */
                kern_pf_stream(bl + pfd);
                if (dt == DT_Q8_0) kern_pf_stream(bl + pfd + 64);
            }
            const __m512i w = two ? b32_w64(dt, bl, 1) : b32_w64(dt, bl, 0);
            const __m512 dw = two ? b32_d16(dt, bl, 1) : b32_d16(dt, bl, 0);
            __m512i wu = w, aw = w; /* wu: w + 128 (Q8_0) or the nibbles (Q4_0, w + 8) */
            __mmask64 neg = 0;
            if (vnni) {
                if (dt == DT_Q8_0) wu = _mm512_xor_si512(w, _mm512_set1_epi8(-128));
            } else {
                const __m512i ws = dt == DT_Q8_0 ? w : _mm512_sub_epi8(w, _mm512_set1_epi8(8));
                aw = _mm512_abs_epi8(ws);
                neg = _mm512_movepi8_mask(ws);
            }
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                __m512i p;
                if (vnni) {
                    p = nc[c];
                    __asm__("vpdpbusd %2, %1, %0" : "+v"(p) : "v"(wu), "v"(xv[c]));
                } else {
                    __m512i xs = _mm512_mask_sub_epi8(xv[c], neg, _mm512_setzero_si512(), xv[c]);
                    p = _mm512_madd_epi16(_mm512_maddubs_epi16(aw, xs), _mm512_set1_epi16(1));
                }
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dx[c]),
                                            acc[r][c]);
            }
        }
    }
    tile_store(R, C, acc, y, ldy);
}

/* Rows [ob, oe): tiles of R rows, then single rows. */
AI void b32_pass(const int dt, const int vnni, const int R, const int C, const char *W, size_t wrb,
                 int64_t nb, const int8_t *xq, const float *xd, float *y, int64_t ldy, int64_t ob,
                 int64_t oe, size_t pfd)
{
    int64_t o = ob;
    for (; o + R <= oe; o += R)
        b32_tile(dt, vnni, R, C, W + (size_t)o * wrb, wrb, nb, xq, xd, y + o, ldy, pfd);
    for (; o < oe; o++)
        b32_tile(dt, vnni, 1, C, W + (size_t)o * wrb, wrb, nb, xq, xd, y + o, ldy, pfd);
}

/* The one pass of a few tokens over rows [ob, oe) streamed from memory: tiles of R rows spread
 * over R runs (kernels_impl.h), then single rows. */
AI void b32_stream(const int dt, const int vnni, const int R, const int C, const char *W,
                   size_t wrb, int64_t nb, const int8_t *xq, const float *xd, float *y, int64_t ldy,
                   int64_t ob, int64_t oe)
{
    const int64_t q = (oe - ob) / R;
    float t[KERN_SPREAD_MAX];
    for (int64_t i = 0; i < q; i++) {
        b32_tile(dt, vnni, R, C, W + (size_t)(ob + i) * wrb, (size_t)q * wrb, nb, xq, xd, t, R,
                 PF_STREAM_BYTES);
        kern_spread_store(t, R, C, y + ob + i, ldy, q);
    }
    for (int64_t o = ob + R * q; o < oe; o++)
        b32_tile(dt, vnni, 1, C, W + (size_t)o * wrb, wrb, nb, xq, xd, y + o, ldy, PF_STREAM_BYTES);
}

AI void b32_rows_isa(const int dt, const int vnni, const char *W, size_t wrb, int64_t nb,
                     const int8_t *xq, const float *xd, int T, float *y, int64_t ldy, int64_t o0,
                     int64_t o1)
{
    if (T <= 4) stream_head(W + (size_t)o0 * wrb, (size_t)(o1 - o0) * wrb);
    switch (T) { /* few tokens: one pass streaming the rows from memory */
    case 1: b32_stream(dt, vnni, 8, 1, W, wrb, nb, xq, xd, y, ldy, o0, o1); return;
    case 2: b32_stream(dt, vnni, 8, 2, W, wrb, nb, xq, xd, y, ldy, o0, o1); return;
    case 3: b32_stream(dt, vnni, 4, 3, W, wrb, nb, xq, xd, y, ldy, o0, o1); return;
    case 4: b32_stream(dt, vnni, 4, 4, W, wrb, nb, xq, xd, y, ldy, o0, o1); return;
    default: break;
    }
    /* panels of rows kept in L2 while every tile of tokens passes over them, the later passes
     * prefetching the next panel into L2 (as matmul_dt's) */
    const int64_t K = nb * 32;
    int64_t panel = (int64_t)(KERN_PANEL_BYTES / wrb);
    panel = panel < B32_R ? B32_R : panel / B32_R * B32_R;
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        const size_t pf_next = oe < o1 ? (size_t)panel * wrb : 0;
        int t = 0;
        for (; t + B32_C <= T; t += B32_C)
            b32_pass(dt, vnni, B32_R, B32_C, W, wrb, nb, xq + t * K, xd + t * nb, y + t * ldy, ldy,
                     ob, oe, t == 0 ? PF_STREAM_BYTES : pf_next);
        const int8_t *xt = xq + t * K;
        const float *xdt = xd + t * nb;
        float *yt = y + t * ldy;
        switch (T - t) {
        case 1: b32_pass(dt, vnni, B32_R, 1, W, wrb, nb, xt, xdt, yt, ldy, ob, oe, pf_next); break;
        case 2: b32_pass(dt, vnni, B32_R, 2, W, wrb, nb, xt, xdt, yt, ldy, ob, oe, pf_next); break;
        default: break;
        }
    }
}

#define B32_ROWS(NAME, DT, VNNI)                                                                   \
    static void NAME(const char *W, size_t wrb, int64_t nb, const int8_t *xq, const float *xd,      \
                     int T, float *y, int64_t ldy, int64_t o0, int64_t o1)                         \
    {                                                                                              \
        b32_rows_isa(DT, VNNI, W, wrb, nb, xq, xd, T, y, ldy, o0, o1);                             \
    }
B32_ROWS(q80_rows, DT_Q8_0, 0)
B32_ROWS(q80_rows_vnni, DT_Q8_0, 1)
B32_ROWS(q40_rows, DT_Q4_0, 0)
B32_ROWS(q40_rows_vnni, DT_Q4_0, 1)
#undef B32_ROWS

/* kern_q8_quantize, the same bits (as q8k_quantize). */
static void q8_quantize(const float *x, int64_t K, int8_t *q, float *d)
{
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    for (int64_t b = 0; b < K / 32; b++, x += 32, q += 32) {
        __m512 a0 = _mm512_and_ps(_mm512_loadu_ps(x), absmask);
        __m512 a1 = _mm512_and_ps(_mm512_loadu_ps(x + 16), absmask);
        __mmask16 bad = _mm512_cmp_ps_mask(a0, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ) |
                        _mm512_cmp_ps_mask(a1, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ);
        const float amax = bad ? 0.0f : _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        if (bad || amax == 0.0f) {
            d[b] = bad ? NAN : 0.0f;
            _mm256_storeu_si256((__m256i *)q, _mm256_setzero_si256());
            continue;
        }
        d[b] = amax / 127.0f;
        const __m512 is = _mm512_set1_ps(127.0f / amax);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), is));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), is));
        q0 = _mm512_max_epi32(_mm512_min_epi32(q0, lim), nlim);
        q1 = _mm512_max_epi32(_mm512_min_epi32(q1, lim), nlim);
        _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
    }
}

void kern_q8_quantize_avx512(const float *x, int64_t K, int8_t *q, float *d)
{
    q8_quantize(x, K, q, d);
}

static void v_dequant_row(int wtype, const void *row, float *out, int64_t K);

AI int matmul_isa(const int vnni, int wtype, const void *W, size_t w_row_bytes, int64_t K,
                  const float *x, int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                  int64_t o1)
{
    if (wtype == DT_Q4_K)
        return kern_q4k_matmul(vnni ? q4k_rows_vnni : q4k_rows, q8k_quantize, W, w_row_bytes, K,
                               x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q2_K || wtype == DT_Q3_K) /* engine/cpu/q23k_avx512.c */
        return kern_q23k_matmul_avx512(vnni, wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q6_K || wtype == DT_Q5_K)
        return kern_q56k_matmul_avx512(vnni, wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q8_0)
        return kern_b32_matmul(DT_Q8_0, vnni ? q80_rows_vnni : q80_rows, q8_quantize, W,
                               w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q4_0)
        return kern_b32_matmul(DT_Q4_0, vnni ? q40_rows_vnni : q40_rows, q8_quantize, W,
                               w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
    if (kern_qleg_type(wtype))
        return kern_qleg_matmul(vnni ? &kern_qleg_avx512_vnni : &kern_qleg_avx512, wtype, W,
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

static int v_matmul(int wtype, const void *W, size_t w_row_bytes, int64_t K, const float *x,
                    int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    return matmul_isa(0, wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
}

static int v_matmul_vnni(int wtype, const void *W, size_t w_row_bytes, int64_t K, const float *x,
                         int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    return matmul_isa(1, wtype, W, w_row_bytes, K, x, ldx, y, ldy, T, o0, o1);
}

/* ---- element-wise kernels ---- */

AI __mmask16 tail_mask(int64_t n)
{
    return (__mmask16)((1u << n) - 1);
}

static void v_dequant_row(int wtype, const void *row, float *out, int64_t K)
{
    const char *r = row;
    int64_t k = 0;
    switch (wtype) {
    case DT_F32:
        memcpy(out, row, (size_t)K * sizeof(float));
        return;
    case DT_F16:
        for (; k + 16 <= K; k += 16) _mm512_storeu_ps(out + k, w_load(DT_F16, r, k));
        if (k < K) _mm512_mask_storeu_ps(out + k, tail_mask(K - k),
                                         w_load_mask(DT_F16, r, k, tail_mask(K - k)));
        return;
    case DT_BF16:
        for (; k + 16 <= K; k += 16) _mm512_storeu_ps(out + k, w_load(DT_BF16, r, k));
        if (k < K) _mm512_mask_storeu_ps(out + k, tail_mask(K - k),
                                         w_load_mask(DT_BF16, r, k, tail_mask(K - k)));
        return;
    case DT_Q8_0:
        for (; k + 16 <= K; k += 16) _mm512_storeu_ps(out + k, w_load(DT_Q8_0, r, k));
        return;
    case DT_Q4_0:
        for (; k + 16 <= K; k += 16) _mm512_storeu_ps(out + k, w_load(DT_Q4_0, r, k));
        return;
    case DT_Q4_K:
        for (; k + 16 <= K; k += 16) _mm512_storeu_ps(out + k, w_load(DT_Q4_K, r, k));
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
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return simd_hsum16(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static void v_axpy(float a, const float *x, float *y, int64_t n)
{
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 r = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

static void v_rmsnorm(const float *x, const float *w, float eps, float *out, int64_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        s0 = _mm512_fmadd_ps(a, a, s0);
        s1 = _mm512_fmadd_ps(b, b, s1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 a = _mm512_maskz_loadu_ps(m, x + i);
        s0 = _mm512_fmadd_ps(a, a, s0);
    }
    float ss = simd_hsum16(_mm512_add_ps(s0, s1));
    __m512 scale = _mm512_set1_ps(1.0f / sqrtf(ss / (float)n + eps));
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), scale), _mm512_loadu_ps(w + i));
        _mm512_storeu_ps(out + i, v);
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale),
                                 _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

/* e^x for |x| <= 88: 2^n * P(r), r = x - n ln2 in [-ln2/2, ln2/2], P the degree-7 Taylor
 * polynomial (truncation error < 1e-8 relative); about 1-2 ulp overall. */
AI __m512 v_exp(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

AI __m512 v_silu_mul1(__m512 g, __m512 u)
{
    __m512 e = v_exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

static void v_silu_mul(const float *gate, const float *up, float *out, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, v_silu_mul1(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = v_silu_mul1(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i));
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

static void v_add(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

static void v_f32_to_f16(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(y + i, m, h);
    }
}

static void v_f16_to_f32(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
    }
}

/* The two tables' matmul differ only in madd_acc (VNNI or not): the same values. The VNNI one
 * also packs Q4_K, Q5_K, Q6_K, IQ4_XS and Q8_0 (kpack_avx512.c). */
#define V_TABLE(NAME, MATMUL, PACK_BYTES, PACK, MATMUL_PACKED)                                     \
    {                                                                                              \
        .name = NAME, .matmul = MATMUL, .pack_bytes = PACK_BYTES, .pack = PACK,                    \
        .matmul_packed = MATMUL_PACKED, .dequant_row = v_dequant_row, .dot_f32 = v_dot,            \
        .axpy_f32 = v_axpy, .rmsnorm = v_rmsnorm, .silu_mul = v_silu_mul, .add = v_add,            \
        .f32_to_f16 = v_f32_to_f16, .f16_to_f32 = v_f16_to_f32,                                    \
    }
const kern_table_t kern_table_avx512 = V_TABLE("avx512", v_matmul, NULL, NULL, NULL);
const kern_table_t kern_table_avx512_vnni = V_TABLE("avx512-vnni", v_matmul_vnni, kern_kx16_bytes,
                                                    kern_kx16_pack, kern_kx16_matmul_vnni);
#undef V_TABLE

#if defined(__clang__)
#pragma clang attribute pop
#endif
