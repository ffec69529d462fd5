/* engine/cpu/kernels_q56k_avx512.c: the Q6_K and Q5_K int8 routes (kernels_q56k.h) for AVX-512
 * (F, BW, VL, DQ) + FMA + F16C, optionally with AVX512-VNNI's vpdpwssd.
 *
 * Per 64-weight chunk c of a super-block (weights 64c .. 64c+63, the order of xq[64c ..]): a zmm
 * of the 64 unsigned quants and a zmm of each int16 pair lane's sub-block scale.
 *   Q6_K: quants 0..63 (ql nibbles | qh's 2 bits moved to bits 4..5 by a 64-bit rotate that
 *     keeps every bit in its byte); p = vpmaddubsw(q, xq) - vpmaddubsw(32, xq) = the pairs of
 *     (q - 32) * xq (|p| <= 8128); lanes += vpmaddwd(p, scales) (int16 scales, sub-block c*4 +
 *     lane/8). |lane| <= 4 * 128 * 16256 < 2^24.
 *   Q5_K: Q4_K's nibbles | qh's bit moved to bit 4; lanes += vpmaddwd(vpmaddubsw(q, xq),
 *     scales) as Q4_K (|lane| <= 4 * 63 * 15748 < 2^24); the mins as Q4_K.
 * The 16 int32 lanes are exact and convert to F32 exactly. Per super-block and token:
 * acc = fma(float(lanes), d * dx, acc) (16 lanes); Q5_K also accm = fma(float(m . bsum pairs),
 * dmin * dx, accm) (4 lanes). y = hsum(acc) (Q6_K) or hsum(acc) - ((accm0 + accm2) + (accm1 +
 * accm3)) (Q5_K), hsum the tree of simd_hsum16 (simd_avx512_impl.h). A row's arithmetic is the same in
 * every tile shape (4 rows x 1 token through a 4-way reduction with the same tree, 1 row x up to
 * 8 tokens), so the route is batch invariant. */
#if defined(__x86_64__) && defined(__GNUC__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <string.h>

#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/kernels_q56k.h"
#include "engine/cpu/simd_avx512_impl.h"

#define AI static inline __attribute__((always_inline))

#define Q56_TOK 8   /* tokens per tile */
#define Q56_ROWS 4  /* rows per tile with one token */
#ifndef Q56_PF_BYTES
#define Q56_PF_BYTES 16384 /* prefetch distance along each row when streaming */
#endif
#define Q56_PANEL_BYTES (192 * 1024) /* rows kept in L2 while every token tile passes them */

/* acc + the pairwise products of the int16 lanes of p and s summed into int32 lanes: vpmaddwd +
 * vpaddd, or the one AVX512-VNNI vpdpwssd (the same exact integers; inline assembly, so no VNNI
 * target is needed; called with vnni only where the CPU has it). */
AI __m512i q56_madd(const int vnni, __m512i acc, __m512i p, __m512i s)
{
    if (vnni) {
        __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(p), "v"(s));
        return acc;
    }
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
}

/* a | (b & c), bytewise */
AI __m512i or_and(__m512i a, __m512i b, __m512i c)
{
    return _mm512_ternarylogic_epi32(a, b, c, 0xf8);
}

/* Q6_K: the quants (0..63) of chunk c (< 4) in Q[c], the int16 scale of each pair lane in S[c]. */
AI void q6k_chunks(const block_q6_K *b, __m512i Q[4], __m512i S[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i sc = _mm512_castsi256_si512(
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales)));
    /* lane p of chunk c: sub-block 4c + p / 8 */
    const __m512i sidx = _mm512_cvtepu8_epi16(_mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
        const __m512i qh =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            /* weights 128h + 64n + [0, 64): i = 2n (bytes 0..31), 2n + 1 (bytes 32..63); their
             * qh bits 2i, 2i+1 rotated to bits 4, 5 (rotate left by 4 - 2i mod 64) */
            const __m512i nib = n ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4)
                                  : _mm512_and_si512(ql, m4);
            const long long r0 = (4 - 4 * n) & 63, r1 = (2 - 4 * n) & 63;
            const __m512i rot =
                _mm512_rolv_epi64(qh, _mm512_setr_epi64(r0, r0, r0, r0, r1, r1, r1, r1));
            const int c = 2 * h + n;
            Q[c] = or_and(nib, rot, m30);
            S[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(sidx, _mm512_set1_epi16((short)(4 * c))),
                                            sc);
        }
    }
}

/* Q5_K: the quants (0..31) of chunk j (< 4) in Q[j], sub-block scales in S[j], the 8 mins as
 * int16 in *mn, d and dmin in lanes 0, 1 of *dwm. */
AI void q5k_chunks(const block_q5_K *b, __m512i Q[4], __m512i S[4], __m128i *mn, __m128 *dwm)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    const __m512i shv = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    uint64_t sc64, mn64;
    q4k_unpack64(b->scales, &sc64, &mn64);
    const __m512i scb = _mm512_set1_epi64((long long)sc64);
    *mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn64));
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->qh));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        /* bytes 0..31: sub-block 2j (low nibbles, qh bit 2j); 32..63: 2j + 1 (high, bit 2j + 1) */
        const __m512i ctl = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set1_epi16((short)(0x8000 | (2 * j)))),
            _mm256_set1_epi16((short)(0x8000 | (2 * j + 1))), 1);
        S[j] = _mm512_shuffle_epi8(scb, ctl);
        const __m512i v =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * j)));
        const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(v, shv), m4);
        const long long r0 = (4 - 2 * j) & 63, r1 = (3 - 2 * j) & 63;
        const __m512i rot =
            _mm512_rolv_epi64(qh, _mm512_setr_epi64(r0, r0, r0, r0, r1, r1, r1, r1));
        Q[j] = or_and(nib, rot, m10);
    }
    uint32_t ddm;
    memcpy(&ddm, &b->d, 4); /* d, dmin adjacent */
    *dwm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ddm));
}

/* Rows [0, R) at row0 (stride wrb, nsb super-blocks of type dt) against C tokens of xq (token
 * stride nsb); y[c * ldy + r]. */
AI void q56k_tile(const int dt, const int vnni, const int R, const int C, const char *row0,
                  size_t wrb, int64_t nsb, const kern_q8k_t *xq, float *y, int64_t ldy, size_t pfd)
{
    const size_t bs = dt == DT_Q6_K ? sizeof(block_q6_K) : sizeof(block_q5_K);
    const __m512i k32 = _mm512_set1_epi8(32);
    __m512 acc[Q56_ROWS][Q56_TOK];
    __m128 accm[Q56_ROWS][Q56_TOK];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            acc[r][c] = _mm512_setzero_ps();
            accm[r][c] = _mm_setzero_ps();
        }
    for (int64_t s = 0; s < nsb; s++) {
        /* one token: its x chunks (and Q6_K's 32 * x pairs) loaded once for the R rows */
        __m512i X1[4], M1[4];
        if (C == 1) {
            const kern_q8k_t *xb = xq + s;
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                X1[j] = _mm512_loadu_si512(xb->q + 64 * j);
                if (dt == DT_Q6_K) M1[j] = _mm512_maddubs_epi16(k32, X1[j]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const char *bp = row0 + (size_t)r * wrb + (size_t)s * bs;
            q56k_prefetch(bp, bs, pfd);
            __m512i Q[4], S[4];
            __m128i mn = _mm_setzero_si128();
            __m128 dwm;
            if (dt == DT_Q6_K) {
                q6k_chunks((const block_q6_K *)bp, Q, S);
                dwm = _mm_set_ss(_cvtsh_ss(((const block_q6_K *)bp)->d));
            } else {
                q5k_chunks((const block_q5_K *)bp, Q, S, &mn, &dwm);
            }
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const kern_q8k_t *xb = xq + c * nsb + s;
                __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const __m512i xv = C == 1 ? X1[j] : _mm512_loadu_si512(xb->q + 64 * j);
                    __m512i p = _mm512_maddubs_epi16(Q[j], xv);
                    if (dt == DT_Q6_K)
                        p = _mm512_sub_epi16(p, C == 1 ? M1[j] : _mm512_maddubs_epi16(k32, xv));
                    isum = q56_madd(vnni, isum, p, S[j]);
                }
                const __m128 dd = _mm_mul_ps(dwm, _mm_set1_ps(xb->d)); /* d * dx, dmin * dx */
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_broadcastss_ps(dd),
                                            acc[r][c]);
                if (dt == DT_Q5_K) {
                    const __m128i ms = _mm_madd_epi16(mn, _mm_loadu_si128((const __m128i *)xb->bsum));
                    accm[r][c] = _mm_fmadd_ps(_mm_cvtepi32_ps(ms), _mm_shuffle_ps(dd, dd, 0x55),
                                              accm[r][c]);
                }
            }
        }
    }
    if (R == 4) {
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m128 v = simd_hsum16x4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]);
            if (dt == DT_Q5_K) { /* lane r: (accm0 + accm2) + (accm1 + accm3) of row r */
                __m128 t0 = accm[0][c], t1 = accm[1][c], t2 = accm[2][c], t3 = accm[3][c];
                _MM_TRANSPOSE4_PS(t0, t1, t2, t3);
                v = _mm_sub_ps(v, _mm_add_ps(_mm_add_ps(t0, t2), _mm_add_ps(t1, t3)));
            }
            _mm_storeu_ps(y + c * ldy, v);
        }
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            float v = simd_hsum16(acc[r][c]);
            if (dt == DT_Q5_K) {
                __m128 h = _mm_add_ps(accm[r][c], _mm_movehl_ps(accm[r][c], accm[r][c]));
                v -= _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
            }
            y[c * ldy + r] = v;
        }
}

/* The first Q56_PF_BYTES of n bytes about to be streamed (the tiles prefetch that far ahead). */
AI void q56_stream_head(const char *p, size_t n)
{
    if (n > Q56_PF_BYTES) n = Q56_PF_BYTES;
    for (size_t o = 0; o < n; o += 64) kern_pf_stream(p + o);
}

AI void q56k_rows_isa(const int dt, const int vnni, const char *W, size_t wrb, int64_t nsb,
                      const kern_q8k_t *xq, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    /* few tokens: one pass streaming the rows, prefetching ahead; more: panels of rows kept in L2
     * while every tile of tokens passes over them */
    int64_t panel = T <= Q56_TOK ? o1 - o0 : (int64_t)(Q56_PANEL_BYTES / wrb);
    if (panel < 1) panel = 1;
    if (T <= Q56_TOK) q56_stream_head(W + (size_t)o0 * wrb, (size_t)(o1 - o0) * wrb);
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        for (int t = 0; t < T; t += Q56_TOK) {
            const kern_q8k_t *xt = xq + (int64_t)t * nsb;
            float *yt = y + (int64_t)t * ldy;
            const size_t pfd = t == 0 ? Q56_PF_BYTES : 0;
            int64_t o = ob;
            if (T - t == 1) { /* one token: rows in fours spread over four runs (kernels_impl.h) */
                const int64_t q = (oe - ob) / Q56_ROWS;
                float ts[Q56_ROWS];
                for (int64_t i = 0; i < q; i++) {
                    q56k_tile(dt, vnni, Q56_ROWS, 1, W + (size_t)(ob + i) * wrb, (size_t)q * wrb,
                              nsb, xt, ts, Q56_ROWS, pfd);
                    kern_spread_store(ts, Q56_ROWS, 1, yt + ob + i, ldy, q);
                }
                o = ob + Q56_ROWS * q;
            }
            for (; o < oe; o++) {
                const char *row = W + (size_t)o * wrb;
                switch (T - t) {
                case 1: q56k_tile(dt, vnni, 1, 1, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 2: q56k_tile(dt, vnni, 1, 2, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 3: q56k_tile(dt, vnni, 1, 3, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 4: q56k_tile(dt, vnni, 1, 4, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 5: q56k_tile(dt, vnni, 1, 5, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 6: q56k_tile(dt, vnni, 1, 6, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 7: q56k_tile(dt, vnni, 1, 7, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                default: q56k_tile(dt, vnni, 1, 8, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                }
            }
        }
    }
}

#define Q56_ROWS_FN(NAME, DT, VNNI)                                                                \
    static void NAME(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T,          \
                     float *y, int64_t ldy, int64_t o0, int64_t o1)                                \
    {                                                                                              \
        q56k_rows_isa(DT, VNNI, W, wrb, nsb, xq, T, y, ldy, o0, o1);                               \
    }
Q56_ROWS_FN(q6k_rows, DT_Q6_K, 0)
Q56_ROWS_FN(q6k_rows_vnni, DT_Q6_K, 1)
Q56_ROWS_FN(q5k_rows, DT_Q5_K, 0)
Q56_ROWS_FN(q5k_rows_vnni, DT_Q5_K, 1)
#undef Q56_ROWS_FN

int kern_q56k_matmul_avx512(int vnni, int wtype, const void *W, size_t wrb, int64_t K,
                            const float *x, int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                            int64_t o1)
{
    kern_q4k_fn fn;
    if (wtype == DT_Q6_K) fn = vnni ? q6k_rows_vnni : q6k_rows;
    else if (wtype == DT_Q5_K) fn = vnni ? q5k_rows_vnni : q5k_rows;
    else return -1;
    return kern_q4k_matmul(fn, kern_q8k_quantize_avx512, W, wrb, K, x, ldx, y, ldy, T, o0, o1);
}

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif
