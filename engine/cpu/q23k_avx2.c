/* engine/cpu/q23k_avx2.c: Q2_K and Q3_K x int8 (engine/cpu/q23k.h) with AVX2 + FMA + F16C.
 *
 * Per super-block, group g = 4c + p (g < 8) of 32 weights is weight 128c + 32p + l, l < 32 --
 * the order of x[32g .. 32g+31]: u = (qs[32c + l] >> 2p) & 3, plus 4 for Q3_K where bit g of
 * hmask[l] is set. vpmaddubsw of u and xq (u in [0, 7]: pairs |sum| <= 1778, never saturates),
 * vpmaddwd with the sub-block scales as int16 (low 128 bits: sub-block 2g, high: 2g + 1), added
 * over the groups: 8 exact int32 lanes. Q3_K: minus 4 * (sc . bsum16 pairs) (vpmaddwd), lane by
 * lane. Q2_K: msum lanes = m . bsum16 pairs (vpmaddwd). Every lane stays below 2^21, so its
 * conversion to F32 is exact.
 * Per super-block and token: acc = fma(float(isum lanes), d * dx, acc) in 8 lanes; Q2_K also
 * accm = fma(float(msum lanes), dmin * dx, accm) in 8 lanes. y = simd_hsum8(acc) (- simd_hsum8(accm)),
 * simd_hsum8 the fixed tree h[i] = v[i] + v[i+4]; p[i] = h[i] + h[i+2]; p[0] + p[1].
 * Tiles: one row x C <= 4 tokens (a row's arithmetic does not depend on C); with more than 4
 * tokens the rows go in panels of about 128 KiB kept in L2 while the token tiles pass. */
/* Every function of this file is compiled for the ISA (no global -m flags). */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <string.h>

#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/q23k.h"
#include "engine/cpu/simd_avx2_impl.h"

#define AI static inline __attribute__((always_inline))

#define Q23K_TOK 4                    /* tokens per tile */
#define Q23K_PANEL_BYTES (128 * 1024) /* rows per panel with more tokens than a tile */
#define Q23K_PF_BYTES 16384           /* prefetch distance of the weights of the first tile */

/* The vpmaddwd operands of the 8 groups: S[g] holds scale 2g (of the 16 int16 in sc16) in the
 * int16 lanes of its low 128 bits and scale 2g + 1 in those of its high 128 bits. */
AI void group_scales(__m256i sc16, __m256i S[8])
{
    const __m256i lo = _mm256_permute4x64_epi64(sc16, 0x44), hi = _mm256_permute4x64_epi64(sc16, 0xee);
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        const int i0 = 2 * g % 8, i1 = i0 + 1; /* int16 lanes of the 128-bit half */
        const __m256i ctl = _mm256_set_m128i(_mm_set1_epi16((short)((2 * i1 + 1) << 8 | 2 * i1)),
                                             _mm_set1_epi16((short)((2 * i0 + 1) << 8 | 2 * i0)));
        S[g] = _mm256_shuffle_epi8(g < 4 ? lo : hi, ctl);
    }
}

/* Bit g of every byte of v moved to bit 2, the other bits cleared. */
AI __m256i bit_to_4(__m256i v, int g)
{
    const __m256i b2 = _mm256_set1_epi8(4);
    if (g >= 2) return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(g - 2)), b2);
    return _mm256_and_si256(_mm256_sll_epi16(v, _mm_cvtsi32_si128(2 - g)), b2);
}

/* Rows' tile: y[c * ldy] for c < C, one row of nsb super-blocks of type dt. */
AI void q23k_tile(const int dt, const int C, const char *row, int64_t nsb, const kern_q8k_t *xq,
                  const kern_q8k16_t *xs, float *y, int64_t ldy, size_t pfd)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    const size_t bs = dt == DT_Q2_K ? sizeof(block_q2_K) : sizeof(block_q3_K);
    __m256 acc[Q23K_TOK], accm[Q23K_TOK];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = accm[c] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const char *bp = row + (size_t)s * bs;
        kern_pf_stream2(bp, pfd);
        __m256i U[8], S[8], sm16; /* sm16: Q3_K the 16 scales, Q2_K the 16 mins, as int16 */
        const uint8_t *qs;
        __m128 dwm; /* d (lane 0), dmin (lane 1, Q2_K) */
        if (dt == DT_Q2_K) {
            const block_q2_K *b = (const block_q2_K *)bp;
            const __m128i sv = _mm_loadu_si128((const __m128i *)b->scales);
            const __m128i m4 = _mm_set1_epi8(0x0f);
            group_scales(_mm256_cvtepu8_epi16(_mm_and_si128(sv, m4)), S);
            sm16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sv, 4), m4));
            uint32_t ddm;
            memcpy(&ddm, &b->d, 4);
            dwm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ddm));
            qs = b->qs;
        } else {
            const block_q3_K *b = (const block_q3_K *)bp;
            const __m128i sv = kern_q3k_scales_v(b->scales);
            sm16 = _mm256_cvtepi8_epi16(sv);
            group_scales(sm16, S);
            dwm = _mm_cvtph_ps(_mm_cvtsi32_si128(b->d));
            qs = b->qs;
        }
#pragma GCC unroll 2
        for (int c2 = 0; c2 < 2; c2++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c2));
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                U[4 * c2 + p] = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * p)), m3);
        }
        if (dt == DT_Q3_K) {
            const __m256i hm = _mm256_loadu_si256((const __m256i *)((const block_q3_K *)bp)->hmask);
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) U[g] = _mm256_or_si256(U[g], bit_to_4(hm, g));
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const kern_q8k_t *xb = xq + c * nsb + s;
            const __m256i x16 = _mm256_loadu_si256((const __m256i *)xs[c * nsb + s].s);
            __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                __m256i p = _mm256_maddubs_epi16(U[g], _mm256_loadu_si256((const __m256i *)(xb->q + 32 * g)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, S[g]));
            }
            const __m256i ms = _mm256_madd_epi16(sm16, x16);
            const __m128 dd = _mm_mul_ps(dwm, _mm_set1_ps(xb->d)); /* d * dx, dmin * dx */
            if (dt == DT_Q3_K) {
                isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(ms, 2));
            } else {
                accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms),
                                          _mm256_broadcastss_ps(_mm_shuffle_ps(dd, dd, 0x55)), accm[c]);
            }
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcastss_ps(dd), acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        y[c * ldy] = dt == DT_Q2_K ? simd_hsum8(acc[c]) - simd_hsum8(accm[c]) : simd_hsum8(acc[c]);
}

AI void q23k_rows(const int dt, const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq,
                  const kern_q8k16_t *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    int64_t panel = T <= Q23K_TOK ? o1 - o0 : (int64_t)(Q23K_PANEL_BYTES / wrb);
    if (panel < 1) panel = 1;
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        for (int t = 0; t < T; t += Q23K_TOK) {
            const kern_q8k_t *xt = xq + (int64_t)t * nsb;
            const kern_q8k16_t *st = xs + (int64_t)t * nsb;
            float *yt = y + (int64_t)t * ldy;
            const size_t pfd = t == 0 ? Q23K_PF_BYTES : 0;
            for (int64_t o = ob; o < oe; o++) {
                const char *row = W + (size_t)o * wrb;
                switch (T - t) {
                case 1: q23k_tile(dt, 1, row, nsb, xt, st, yt + o, ldy, pfd); break;
                case 2: q23k_tile(dt, 2, row, nsb, xt, st, yt + o, ldy, pfd); break;
                case 3: q23k_tile(dt, 3, row, nsb, xt, st, yt + o, ldy, pfd); break;
                default: q23k_tile(dt, 4, row, nsb, xt, st, yt + o, ldy, pfd); break;
                }
            }
        }
    }
}

static void q2k_rows(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq,
                     const kern_q8k16_t *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    q23k_rows(DT_Q2_K, W, wrb, nsb, xq, xs, T, y, ldy, o0, o1);
}

static void q3k_rows(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq,
                     const kern_q8k16_t *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    q23k_rows(DT_Q3_K, W, wrb, nsb, xq, xs, T, y, ldy, o0, o1);
}

int kern_q23k_matmul_avx2(int wtype, const void *W, size_t wrb, int64_t K, const float *x,
                          int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    return kern_q23k_matmul(wtype, wtype == DT_Q2_K ? q2k_rows : q3k_rows, W, wrb, K, x, ldx, y,
                            ldy, T, o0, o1);
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
