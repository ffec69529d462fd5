/* engine/cpu/q23k_avx512.c: Q2_K and Q3_K x int8 (engine/cpu/q23k.h) with AVX-512 (F, BW, VL,
 * DQ) + FMA + F16C.
 *
 * Per super-block, zmm z (z < 4) holds weights 64z .. 64z+63 -- the order of x[64z ..]: the 32
 * bytes qs[32c ..] (c = z / 2) in both 256-bit halves, shifted right by 2p (p = 2 (z % 2) in the
 * low half, p + 1 in the high half; weight 128c + 32p + l is bits 2p, 2p+1 of qs[32c + l]),
 * masked to 2 bits; Q3_K adds 4 where the weight's high bit (bit 4c + p of hmask[l]) is set
 * (vptestmb, masked vpaddb). Each 128-bit lane of z then holds exactly sub-block 4z + lane.
 * vpmaddubsw with xq (u in [0, 7]: pairs |sum| <= 1778, never saturates), vpmaddwd with the
 * lane's sub-block scale in every int16 (or the one VNNI vpdpwssd: the same integers), added over
 * z: 16 exact int32 lanes. Q3_K: minus 4 *
 * (sc . bsum16 pairs) (vpmaddwd, 8 lanes, in lanes 0..7). Q2_K: msum lanes = m . bsum16 pairs
 * (vpmaddwd, 8 lanes). Every lane stays below 2^21, so its conversion to F32 is exact.
 * Per super-block and token: acc = fma(float(isum lanes), d * dx, acc) in 16 lanes; Q2_K also
 * accm = fma(float(msum lanes), dmin * dx, accm) in 8 lanes. y = simd_hsum16(acc) (- simd_hsum8(accm)):
 * simd_hsum16 adds the 256-bit halves, then simd_hsum8 is the tree h[i] = v[i] + v[i+4];
 * p[i] = h[i] + h[i+2]; p[0] + p[1].
 * Tiles: one row x C <= 8 tokens, or 4 rows x 1 token (a row's arithmetic does not depend on
 * the tile); with more than 8 tokens the rows go in panels of about 192 KiB kept in L2 while the
 * token tiles pass. */
/* Every function of this file is compiled for the ISA (no global -m flags). */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <string.h>

#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/q23k.h"
#include "engine/cpu/simd_avx512_impl.h"

#define AI static inline __attribute__((always_inline))

#define Q23K_TOK 8                    /* tokens per tile */
#define Q23K_ROWS 4                   /* rows per tile with one token */
#define Q23K_PANEL_BYTES (192 * 1024) /* rows per panel with more tokens than a tile */
#define Q23K_PF_BYTES 8192            /* prefetch distance of the weights of the first tile */

/* The vpmaddwd operands of the 4 zmm: S[z] holds scale 4z + L (of the 16 int16 in sc16) in
 * every int16 lane of its 128-bit lane L (vpermw). */
AI void group_scales(__m256i sc16, __m512i S[4])
{
    const __m512i src = _mm512_castsi256_si512(sc16); /* only lanes 0..15 are read */
#pragma GCC unroll 4
    for (int z = 0; z < 4; z++) {
        const int i = 4 * z;
        const __m512i idx = _mm512_set_epi32(
            (i + 3) * 0x10001, (i + 3) * 0x10001, (i + 3) * 0x10001, (i + 3) * 0x10001,
            (i + 2) * 0x10001, (i + 2) * 0x10001, (i + 2) * 0x10001, (i + 2) * 0x10001,
            (i + 1) * 0x10001, (i + 1) * 0x10001, (i + 1) * 0x10001, (i + 1) * 0x10001,
            i * 0x10001, i * 0x10001, i * 0x10001, i * 0x10001);
        S[z] = _mm512_permutexvar_epi16(idx, src);
    }
}

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

/* acc + the sums of 4 products of the unsigned bytes of w and the signed bytes of x in each int32
 * lane: AVX512-VNNI vpdpbusd (called only where the CPU has it). */
AI __m512i dpbusd(__m512i acc, __m512i w, __m512i x)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
    return acc;
}

/* A 256-bit value in both halves of a zmm. */
AI __m512i both_halves(const void *p)
{
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

/* Rows [0, R) at `row` (stride wrb, nsb super-blocks of type dt each) against C tokens:
 * y[c * ldy + r]. Every row has its own accumulators and the same per-element arithmetic whatever
 * R and C (R > 1 only shares the loads of x). */
AI void q23k_tile(const int dt, const int vnni, const int R, const int C, const char *row, size_t wrb, int64_t nsb,
                  const kern_q8k_t *xq, const kern_q8k16_t *xs, float *y, int64_t ldy, size_t pfd)
{
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const size_t bs = dt == DT_Q2_K ? sizeof(block_q2_K) : sizeof(block_q3_K);
    __m512 acc[Q23K_ROWS][Q23K_TOK];
    __m256 accm[Q23K_ROWS][Q23K_TOK];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            acc[r][c] = _mm512_setzero_ps();
            accm[r][c] = _mm256_setzero_ps();
        }
    for (int64_t s = 0; s < nsb; s++) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const char *bp = row + (size_t)r * wrb + (size_t)s * bs;
            kern_pf_stream2(bp, pfd);
            __m512i U[4], S[4];
            __m256i sm16; /* Q3_K the 16 scales, Q2_K the 16 mins, as int16 */
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
            const __m512i hmb = dt == DT_Q3_K ? both_halves(((const block_q3_K *)bp)->hmask)
                                              : _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int z = 0; z < 4; z++) {
                const int c2 = z / 2, p = 2 * (z % 2);
                const __m512i shv = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * p)),
                                                       _mm256_set1_epi16((short)(2 * p + 2)), 1);
                U[z] = _mm512_and_si512(_mm512_srlv_epi16(both_halves(qs + 32 * c2), shv), m3);
                if (dt == DT_Q3_K) {
                    const int g = 4 * c2 + p; /* hmask bit of the low half; g + 1: the high half */
                    const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << g)),
                                                           _mm256_set1_epi8((char)(1 << (g + 1))), 1);
                    U[z] = _mm512_mask_add_epi8(U[z], _mm512_test_epi8_mask(hmb, sel), U[z], four);
                }
            }
            /* Q2_K with VNNI and several tokens: sc * q (<= 45) fits a byte, so the scales are
             * folded into the quants once (a vpshufb table of sc * i per 128-bit lane, built by
             * one vpmullw: word w of a lane is s * (2w + 256 (2w + 1)), no carries) and each
             * token takes one vpdpbusd per 64 weights. Its int32 lanes are the very integers of
             * vpmaddubsw + vpmaddwd (lane l: the 4 products 4l .. 4l+3, one sub-block, times
             * its scale), so the result is the same as with one token. */
            const int fold = dt == DT_Q2_K && vnni && C > 1;
            if (fold) {
                const __m512i wconst = _mm512_set1_epi32((2 + 256 * 3) << 16 | (0 + 256 * 1));
#pragma GCC unroll 4
                for (int z = 0; z < 4; z++)
                    U[z] = _mm512_shuffle_epi8(_mm512_mullo_epi16(S[z], wconst), U[z]);
            }
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const kern_q8k_t *xb = xq + c * nsb + s;
                const __m256i x16 = _mm256_loadu_si256((const __m256i *)xs[c * nsb + s].s);
                __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int z = 0; z < 4; z++) {
                    const __m512i xv = _mm512_loadu_si512(xb->q + 64 * z);
                    if (fold) {
                        isum = dpbusd(isum, U[z], xv);
                    } else {
                        __m512i pz = _mm512_maddubs_epi16(U[z], xv);
                        isum = madd_acc(vnni, isum, pz, S[z]);
                    }
                }
                const __m256i ms = _mm256_madd_epi16(sm16, x16);
                const __m128 dd = _mm_mul_ps(dwm, _mm_set1_ps(xb->d)); /* d * dx, dmin * dx */
                if (dt == DT_Q3_K) {
                    isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(ms, 2)));
                } else {
                    accm[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms),
                                                 _mm256_broadcastss_ps(_mm_shuffle_ps(dd, dd, 0x55)),
                                                 accm[r][c]);
                }
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_broadcastss_ps(dd),
                                            acc[r][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            y[c * ldy + r] = dt == DT_Q2_K ? simd_hsum16(acc[r][c]) - simd_hsum8(accm[r][c]) : simd_hsum16(acc[r][c]);
}

AI void q23k_rows(const int dt, const int vnni, const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq,
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
            int64_t o = ob;
            if (T - t == 1) { /* one token: rows in fours (sharing the loads of x), spread over
                                 four runs (kernels_impl.h) */
                const int64_t q = (oe - ob) / Q23K_ROWS;
                float ts[Q23K_ROWS];
                for (int64_t i = 0; i < q; i++) {
                    q23k_tile(dt, vnni, Q23K_ROWS, 1, W + (size_t)(ob + i) * wrb, (size_t)q * wrb,
                              nsb, xt, st, ts, Q23K_ROWS, pfd);
                    kern_spread_store(ts, Q23K_ROWS, 1, yt + ob + i, ldy, q);
                }
                o = ob + Q23K_ROWS * q;
            }
            for (; o < oe; o++) {
                const char *row = W + (size_t)o * wrb;
                switch (T - t) {
                case 1: q23k_tile(dt, vnni, 1, 1, row, wrb, nsb, xt, st, yt + o, ldy, pfd); break;
                case 2: q23k_tile(dt, vnni, 1, 2, row, wrb, nsb, xt, st, yt + o, ldy, pfd); break;
                case 3: q23k_tile(dt, vnni, 1, 3, row, wrb, nsb, xt, st, yt + o, ldy, pfd); break;
                case 4: q23k_tile(dt, vnni, 1, 4, row, wrb, nsb, xt, st, yt + o, ldy, pfd); break;
                case 5: q23k_tile(dt, vnni, 1, 5, row, wrb, nsb, xt, st, yt + o, ldy, pfd); break;
                case 6: q23k_tile(dt, vnni, 1, 6, row, wrb, nsb, xt, st, yt + o, ldy, pfd); break;
                case 7: q23k_tile(dt, vnni, 1, 7, row, wrb, nsb, xt, st, yt + o, ldy, pfd); break;
                default: q23k_tile(dt, vnni, 1, 8, row, wrb, nsb, xt, st, yt + o, ldy, pfd); break;
                }
            }
        }
    }
}

#define Q23K_ROWS_FN(NAME, DT, VNNI)                                                              \
    static void NAME(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq,                 \
                     const kern_q8k16_t *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1) \
    {                                                                                              \
        q23k_rows(DT, VNNI, W, wrb, nsb, xq, xs, T, y, ldy, o0, o1);                               \
    }
Q23K_ROWS_FN(q2k_rows, DT_Q2_K, 0)
Q23K_ROWS_FN(q3k_rows, DT_Q3_K, 0)
Q23K_ROWS_FN(q2k_rows_vnni, DT_Q2_K, 1)
Q23K_ROWS_FN(q3k_rows_vnni, DT_Q3_K, 1)

int kern_q23k_matmul_avx512(int vnni, int wtype, const void *W, size_t wrb, int64_t K,
                            const float *x, int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                            int64_t o1)
{
    kern_q23k_fn fn = wtype == DT_Q2_K ? (vnni ? q2k_rows_vnni : q2k_rows)
                                       : (vnni ? q3k_rows_vnni : q3k_rows);
    return kern_q23k_matmul(wtype, fn, W, wrb, K, x, ldx, y, ldy, T, o0, o1);
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
