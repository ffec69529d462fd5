/* engine/cpu/kernels_q56k_avx2.c: the Q6_K and Q5_K int8 routes (kernels_q56k.h) for AVX2 + FMA
 * + F16C.
 *
 * Per 32-weight sub-chunk k (< 8) of a super-block (weights 32k .. 32k+31, the order of xq): a
 * ymm of the 32 unsigned quants and a ymm of each int16 pair lane's sub-block scale.
 *   Q6_K: quants 0..63 (ql nibble | qh's 2 bits shifted to bits 4..5); p = vpmaddubsw(q, xq) -
 *     vpmaddubsw(32, xq) = the pairs of (q - 32) * xq; lanes += vpmaddwd(p, scales) (lanes 0..7
 *     sub-block 2k, 8..15 sub-block 2k + 1). |lane| <= 8 * 128 * 16256 < 2^24.
 *   Q5_K: Q4_K's nibble | qh's bit k shifted to bit 4; lanes += vpmaddwd(vpmaddubsw(q, xq),
 *     scale of sub-block k) (|lane| <= 8 * 63 * 15748 < 2^24); the mins as Q4_K.
 * The 8 int32 lanes are exact and convert to F32 exactly. Per super-block and token:
 * acc = fma(float(lanes), d * dx, acc) (8 lanes); Q5_K also accm = fma(float(m . bsum pairs),
 * dmin * dx, accm) (4 lanes). y = h(acc) (Q6_K) or h(acc) - ((accm0 + accm2) + (accm1 + accm3))
 * (Q5_K), h the tree of simd_hsum8 (simd_avx2_impl.h). Tiles are 1 row x up to 4 tokens; a row's
 * arithmetic never depends on the tile, so the route is batch invariant. */
#if defined(__x86_64__) && defined(__GNUC__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <string.h>

#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/kernels_q56k.h"
#include "engine/cpu/simd_avx2_impl.h"

#define AI static inline __attribute__((always_inline))

#define Q56_TOK 4 /* tokens per tile */
#ifndef Q56_PF_BYTES
#define Q56_PF_BYTES 16384 /* prefetch distance along each row when streaming */
#endif
#define Q56_PANEL_BYTES (192 * 1024) /* rows kept in L2 while every token tile passes them */

/* v shifted left by n (n > 0) or right by -n, in 16-bit lanes (n a constant once inlined) */
AI __m256i shl16(__m256i v, const int n)
{
    if (n > 0) return _mm256_slli_epi16(v, n);
    if (n < 0) return _mm256_srli_epi16(v, -n);
    return v;
}

/* Q6_K: the quants (0..63) of sub-chunk k and its scales (int16 lanes). */
AI void q6k_sub(const block_q6_K *b, const __m256i scb, const int k, __m256i *q, __m256i *sc)
{
    const int h = k >> 2, i = k & 3;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (i & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i nib = i < 2 ? _mm256_and_si256(ql, m4)
                              : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
    *q = _mm256_or_si256(nib, _mm256_and_si256(shl16(qh, 4 - 2 * i), _mm256_set1_epi8(0x30)));
    /* int16 lane: the scale byte in the high byte (control 0x80 | index << 8), shifted down with
     * its sign */
    const __m256i ctl = _mm256_set_m128i(_mm_set1_epi16((short)(((2 * k + 1) << 8) | 0x80)),
                                         _mm_set1_epi16((short)(((2 * k) << 8) | 0x80)));
    *sc = _mm256_srai_epi16(_mm256_shuffle_epi8(scb, ctl), 8);
}

/* Q5_K: the quants (0..31) of sub-block k and its scale in every int16 lane. */
AI void q5k_sub(const block_q5_K *b, const __m256i scb, const __m256i qh, const int k, __m256i *q,
                __m256i *sc)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (k >> 1)));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i nib = k & 1 ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)
                              : _mm256_and_si256(v, m4);
    *q = _mm256_or_si256(nib, _mm256_and_si256(shl16(qh, 4 - k), _mm256_set1_epi8(0x10)));
    *sc = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(0x8000 | k)));
}

/* One row (nsb super-blocks of dt) against C tokens of xq (stride nsb): y[c * ldy]. */
AI void q56k_tile(const int dt, const int C, const char *row, int64_t nsb, const kern_q8k_t *xq,
                  float *y, int64_t ldy, size_t pfd)
{
    const size_t bs = dt == DT_Q6_K ? sizeof(block_q6_K) : sizeof(block_q5_K);
    const __m256i k32 = _mm256_set1_epi8(32);
    __m256 acc[Q56_TOK];
    __m128 accm[Q56_TOK];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
        accm[c] = _mm_setzero_ps();
    }
    for (int64_t s = 0; s < nsb; s++) {
        const char *bp = row + (size_t)s * bs;
        q56k_prefetch(bp, bs, pfd);
        __m256i isum[Q56_TOK];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) isum[c] = _mm256_setzero_si256();
        __m256i scb, qh = _mm256_setzero_si256();
        __m128i mn = _mm_setzero_si128();
        __m128 dwm;
        if (dt == DT_Q6_K) {
            const block_q6_K *b = (const block_q6_K *)bp;
            scb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b->scales));
            dwm = _mm_set_ss(_cvtsh_ss(b->d));
        } else {
            const block_q5_K *b = (const block_q5_K *)bp;
            uint64_t sc64, mn64;
            q4k_unpack64(b->scales, &sc64, &mn64);
            scb = _mm256_set1_epi64x((long long)sc64);
            mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn64));
            qh = _mm256_loadu_si256((const __m256i *)b->qh);
            uint32_t ddm;
            memcpy(&ddm, &b->d, 4); /* d, dmin adjacent */
            dwm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ddm));
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i q, sc;
            if (dt == DT_Q6_K) q6k_sub((const block_q6_K *)bp, scb, k, &q, &sc);
            else q5k_sub((const block_q5_K *)bp, scb, qh, k, &q, &sc);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[c * nsb + s].q + 32 * k));
                __m256i p = _mm256_maddubs_epi16(q, xv);
                if (dt == DT_Q6_K) p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(k32, xv));
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, sc));
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const kern_q8k_t *xb = xq + c * nsb + s;
            const __m128 dd = _mm_mul_ps(dwm, _mm_set1_ps(xb->d)); /* d * dx, dmin * dx */
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_broadcastss_ps(dd), acc[c]);
            if (dt == DT_Q5_K) {
                const __m128i ms = _mm_madd_epi16(mn, _mm_loadu_si128((const __m128i *)xb->bsum));
                accm[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(ms), _mm_shuffle_ps(dd, dd, 0x55), accm[c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float v = simd_hsum8(acc[c]);
        if (dt == DT_Q5_K) {
            __m128 h = _mm_add_ps(accm[c], _mm_movehl_ps(accm[c], accm[c]));
            v -= _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        }
        y[c * ldy] = v;
    }
}

AI void q56k_rows_isa(const int dt, const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq,
                      int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    int64_t panel = T <= Q56_TOK ? o1 - o0 : (int64_t)(Q56_PANEL_BYTES / wrb);
    if (panel < 1) panel = 1;
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        for (int t = 0; t < T; t += Q56_TOK) {
            const kern_q8k_t *xt = xq + (int64_t)t * nsb;
            float *yt = y + (int64_t)t * ldy;
            const size_t pfd = t == 0 ? Q56_PF_BYTES : 0;
            for (int64_t o = ob; o < oe; o++) {
                const char *row = W + (size_t)o * wrb;
                switch (T - t) {
                case 1: q56k_tile(dt, 1, row, nsb, xt, yt + o, ldy, pfd); break;
                case 2: q56k_tile(dt, 2, row, nsb, xt, yt + o, ldy, pfd); break;
                case 3: q56k_tile(dt, 3, row, nsb, xt, yt + o, ldy, pfd); break;
                default: q56k_tile(dt, 4, row, nsb, xt, yt + o, ldy, pfd); break;
                }
            }
        }
    }
}

static void q6k_rows(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T, float *y,
                     int64_t ldy, int64_t o0, int64_t o1)
{
    q56k_rows_isa(DT_Q6_K, W, wrb, nsb, xq, T, y, ldy, o0, o1);
}

static void q5k_rows(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T, float *y,
                     int64_t ldy, int64_t o0, int64_t o1)
{
    q56k_rows_isa(DT_Q5_K, W, wrb, nsb, xq, T, y, ldy, o0, o1);
}

int kern_q56k_matmul_avx2(int wtype, const void *W, size_t wrb, int64_t K, const float *x,
                          int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    if (wtype != DT_Q6_K && wtype != DT_Q5_K) return -1;
    return kern_q4k_matmul(wtype == DT_Q6_K ? q6k_rows : q5k_rows, kern_q8k_quantize_avx2, W, wrb,
                           K, x, ldx, y, ldy, T, o0, o1);
}

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif
