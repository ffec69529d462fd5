/* engine/cpu/qleg_avx512.c: the Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS int8 routes (qleg.h) for
 * AVX-512 (F, BW, VL, DQ) + FMA + F16C, with or without AVX512-VNNI (the same values).
 *
 * 32-block types, per pair of blocks (64 integer weights w in the order of x[64p .. 64p+63]:
 * Q4_1 / Q5_1 q; Q5_0 q - 16; IQ4_NL kv[q], by vpshufb of the nibbles in the 16-entry table;
 * an odd last block alone, the other half of x 0) and token: 16 exact int32 lanes, lane l the
 * sum of w_k * xq_k for k = 64p + 4l .. 4l+3 (|lane| <= 4 * 127 * 127):
 *   VNNI: vpdpbusd of the weights as unsigned bytes (Q4_1 / Q5_1 q; Q5_0 q = w + 16; IQ4_NL
 *   kv[q] + 128, from a table of those) and xq, started from -(that offset) * the sums of xq's
 *   groups of 4;
 *   without: Q4_1 / Q5_1 vpmaddubsw of q and xq, the others vpmaddubsw of |w| and xq with w's
 *   sign (pairs: |sum| <= 2 * 127 * 127, never saturate); then vpmaddwd with ones.
 * Then acc = fma(float(lanes), d * dx, acc), d * dx one F32 product per block in its 8 lanes,
 * for the pairs in order; Q4_1 and Q5_1 then also acc = fma(S, m * dx, acc) with S (the block's
 * xq sum) in the block's first lane (0 or 8) and 0 in the others; y = hsum(acc), hsum:
 * h[i] = acc[i] + acc[i+8], q[i] = h[i] + h[i+4], p[i] = q[i] + q[i+2], p[0] + p[1].
 * IQ4_XS, per super-block and token: per 64 weights (sub-blocks 2c, 2c+1) vpmaddubsw of |kv[q]|
 * and the signed xq, then vpmaddwd (VNNI: vpdpwssd) with ls_j - 32 in the 16-bit lanes of
 * sub-block j, added over the four: 16 exact int32 lanes (|lane| <= 4 * 2 * 127 * 127 * 32 <
 * 2^24, exact in F32) -- one token with VNNI: vpdpbusd of kv[q] + 128 and xq started from
 * -128 * xq's sums of 4, times ls_j - 32 (vpmulld): the same lanes; acc = fma(float(lanes),
 * d * dx, acc) for the super-blocks in order; y = hsum(acc).
 * Tiles: R rows x C tokens, each with its own accumulators: the per-element arithmetic does not
 * depend on the tile shape. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <string.h>

#include "engine/cpu/qleg.h"
#include "engine/cpu/simd_avx512_impl.h"

#define AI static inline __attribute__((always_inline))

#define QL_RMAX 8
#define QL_CMAX 8
#define QL_PANEL_BYTES (192 * 1024)
#define QL_PF_BYTES 16384 /* decode: prefetch distance for weights streamed from memory */

/* The first PF bytes of a range about to be streamed. */
AI void ql_stream_head(const char *p, size_t n)
{
    if (n > QL_PF_BYTES) n = QL_PF_BYTES;
    for (size_t o = 0; o < n; o += 64) kern_pf_stream(p + o);
}

/* The nibbles of two 16-byte groups in x's order: bytes 0..15 the low nibbles of q0, 16..31
 * its high nibbles, 32..63 the same of q1. */
AI __m512i ql_nib64(__m128i q0, __m128i q1)
{
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q0, q0)),
                                   _mm256_set_m128i(q1, q1), 1);
    v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}

/* The table dtype_iq4nl_values (plus 128 when unsigned) in every 128-bit lane. */
AI __m512i ql_table(const int plus128)
{
    __m128i t = _mm_loadu_si128((const __m128i *)dtype_iq4nl_values);
    if (plus128) t = _mm_xor_si128(t, _mm_set1_epi8(-128));
    return _mm512_broadcast_i32x4(t);
}

/* Q5_0 / Q5_1: the fifth bits (0x10) of blocks b (and b + 1) as bytes in x's order. */
AI __m512i ql_fifth64(const uint8_t *qh0, const uint8_t *qh1)
{
    uint32_t h0, h1 = 0;
    memcpy(&h0, qh0, 4);
    if (qh1) memcpy(&h1, qh1, 4);
    return _mm512_maskz_mov_epi8((__mmask64)(h0 | (uint64_t)h1 << 32), _mm512_set1_epi8(0x10));
}

/* The 64 weights of blocks b, b + 1 (two) or of b alone, as the VNNI route's unsigned bytes
 * (unsigned_form) or as the other route's operand (Q4_1 / Q5_1 q, the others the signed w). */
AI __m512i ql_w64(const int dt, const int unsigned_form, const char *bl, const int two)
{
    const size_t bs = dtype_block_bytes(dt);
    const size_t qso = dt == DT_Q4_1 ? 4 : dt == DT_Q5_0 ? 6 : dt == DT_Q5_1 ? 8 : 2;
    __m128i q0 = _mm_loadu_si128((const __m128i *)(bl + qso));
    __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(bl + bs + qso)) : _mm_setzero_si128();
    __m512i v = ql_nib64(q0, q1);
    switch (dt) {
    case DT_Q4_1: return v;
    case DT_Q5_1:
        return _mm512_or_si512(v, ql_fifth64((const uint8_t *)bl + 4,
                                             two ? (const uint8_t *)bl + bs + 4 : NULL));
    case DT_Q5_0:
        v = _mm512_or_si512(v, ql_fifth64((const uint8_t *)bl + 2,
                                          two ? (const uint8_t *)bl + bs + 2 : NULL));
        return unsigned_form ? v : _mm512_sub_epi8(v, _mm512_set1_epi8(16));
    default: return _mm512_shuffle_epi8(ql_table(unsigned_form), v);
    }
}

/* Lanes 0..7 of the result from lane a of v, lanes 8..15 from lane b. */
AI __m512 ql_spread(__m128 v, const int a, const int b)
{
    const __m512i idx = _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

AI void qb32_tile(const int dt, const int vnni, const int R, const int C, const char *W,
                  size_t wrb, int64_t nb, const int8_t *xq, const float *xd, const float *xs,
                  float *y, int64_t ldy, size_t pfd)
{
    const int64_t K = nb * 32;
    const size_t bs = dtype_block_bytes(dt);
    const int has_min = dt == DT_Q4_1 || dt == DT_Q5_1;
    /* the VNNI route's unsigned offset of the weights */
    const int off = dt == DT_Q5_0 ? 16 : dt == DT_IQ4_NL ? 128 : 0;
    __m512 acc[QL_RMAX][QL_CMAX];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        __m512i xv[QL_CMAX], nc[QL_CMAX];
        __m512 dx[QL_CMAX], sx[QL_CMAX];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const int8_t *q = xq + c * K + 32 * b;
            xv[c] = two ? _mm512_loadu_si512(q)
                        : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)q));
            const float *d = xd + c * nb + b, *s = xs + c * nb + b;
            /* dx of block b in lanes 0..7, of b + 1 in 8..15 (0 when alone) */
            dx[c] = ql_spread(two ? _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)d))
                                  : _mm_load_ss(d), 0, 1);
            if (has_min) /* S of block b in lane 0, of b + 1 in lane 8, the other lanes 0 */
                sx[c] = _mm512_maskz_permutexvar_ps(
                    0x0101, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0),
                    _mm512_castps128_ps512(two ? _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)s))
                                               : _mm_load_ss(s)));
            if (vnni && off)
                nc[c] = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_set1_epi8(1), xv[c]),
                                          _mm512_set1_epi16((short)-off));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const char *bl = W + (size_t)r * wrb + (size_t)b * bs;
            if (pfd) kern_pf_stream(bl + pfd);
            const __m512i w = two ? ql_w64(dt, vnni, bl, 1) : ql_w64(dt, vnni, bl, 0);
            __m512i aw = w;
            __mmask64 neg = 0;
            if (!vnni && !has_min) {
                aw = _mm512_abs_epi8(w);
                neg = _mm512_movepi8_mask(w);
            }
            /* halves d0, m0, d1, m1 (Q4_1 / Q5_1) or d0, 0, d1, 0 */
            uint32_t h0 = 0, h1 = 0;
            memcpy(&h0, bl, has_min ? 4 : 2);
            if (two) memcpy(&h1, bl + bs, has_min ? 4 : 2);
            const __m128 dm = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)(h0 | (uint64_t)h1 << 32)));
            const __m512 dw = ql_spread(dm, 0, 2), mw = has_min ? ql_spread(dm, 1, 3) : dw;
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                __m512i p;
                if (vnni) {
                    p = off ? nc[c] : _mm512_setzero_si512();
                    __asm__("vpdpbusd %2, %1, %0" : "+v"(p) : "v"(w), "v"(xv[c]));
                } else {
                    __m512i x8 = has_min ? xv[c]
                                         : _mm512_mask_sub_epi8(xv[c], neg, _mm512_setzero_si512(),
                                                                xv[c]);
                    p = _mm512_madd_epi16(_mm512_maddubs_epi16(aw, x8), _mm512_set1_epi16(1));
                }
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dx[c]),
                                            acc[r][c]);
                if (has_min) /* lanes 0 and 8: + S * fl(m * dx) */
                    acc[r][c] = _mm512_fmadd_ps(sx[c], _mm512_mul_ps(mw, dx[c]), acc[r][c]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) y[c * ldy + r] = simd_hsum16(acc[r][c]);
}

/* Rows [ob, oe): tiles of R rows, then single rows. */
AI void qb32_pass(const int dt, const int vnni, const int R, const int C, const char *W,
                  size_t wrb, int64_t nb, const int8_t *xq, const float *xd, const float *xs,
                  float *y, int64_t ldy, int64_t ob, int64_t oe, size_t pfd)
{
    int64_t o = ob;
    for (; o + R <= oe; o += R)
        qb32_tile(dt, vnni, R, C, W + (size_t)o * wrb, wrb, nb, xq, xd, xs, y + o, ldy, pfd);
    for (; o < oe; o++)
        qb32_tile(dt, vnni, 1, C, W + (size_t)o * wrb, wrb, nb, xq, xd, xs, y + o, ldy, pfd);
}

/* The one pass of a few tokens over rows [ob, oe) streamed from memory: tiles of R rows spread
 * over R runs (kernels_impl.h), then single rows. */
AI void qb32_stream(const int dt, const int vnni, const int R, const int C, const char *W,
                    size_t wrb, int64_t nb, const int8_t *xq, const float *xd, const float *xs,
                    float *y, int64_t ldy, int64_t ob, int64_t oe)
{
    const int64_t q = (oe - ob) / R;
    float t[KERN_SPREAD_MAX];
    for (int64_t i = 0; i < q; i++) {
        qb32_tile(dt, vnni, R, C, W + (size_t)(ob + i) * wrb, (size_t)q * wrb, nb, xq, xd, xs, t,
                  R, QL_PF_BYTES);
        kern_spread_store(t, R, C, y + ob + i, ldy, q);
    }
    for (int64_t o = ob + R * q; o < oe; o++)
        qb32_tile(dt, vnni, 1, C, W + (size_t)o * wrb, wrb, nb, xq, xd, xs, y + o, ldy,
                  QL_PF_BYTES);
}

AI void qb32_rows(const int dt, const int vnni, const char *W, size_t wrb, int64_t nb,
                  const int8_t *xq, const float *xd, const float *xs, int T, float *y,
                  int64_t ldy, int64_t o0, int64_t o1)
{
    if (T <= 4) ql_stream_head(W + (size_t)o0 * wrb, (size_t)(o1 - o0) * wrb);
    switch (T) { /* few tokens: one pass streaming the rows from memory */
    case 1: qb32_stream(dt, vnni, 8, 1, W, wrb, nb, xq, xd, xs, y, ldy, o0, o1); return;
    case 2: qb32_stream(dt, vnni, 4, 2, W, wrb, nb, xq, xd, xs, y, ldy, o0, o1); return;
    case 3: qb32_stream(dt, vnni, 4, 3, W, wrb, nb, xq, xd, xs, y, ldy, o0, o1); return;
    case 4: qb32_stream(dt, vnni, 2, 4, W, wrb, nb, xq, xd, xs, y, ldy, o0, o1); return;
    default: break;
    }
    /* panels of rows kept in L2 while every tile of tokens passes over them */
    const int64_t K = nb * 32;
    int64_t panel = (int64_t)(QL_PANEL_BYTES / wrb);
    panel = panel < 4 ? 4 : panel / 4 * 4;
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        int t = 0;
        for (; t + 3 <= T; t += 3)
            qb32_pass(dt, vnni, 4, 3, W, wrb, nb, xq + t * K, xd + t * nb, xs + t * nb,
                      y + t * ldy, ldy, ob, oe, t == 0 ? QL_PF_BYTES : 0);
        const int8_t *xt = xq + t * K;
        const float *xdt = xd + t * nb, *xst = xs + t * nb;
        float *yt = y + t * ldy;
        if (T - t == 1) qb32_pass(dt, vnni, 4, 1, W, wrb, nb, xt, xdt, xst, yt, ldy, ob, oe, 0);
        if (T - t == 2) qb32_pass(dt, vnni, 4, 2, W, wrb, nb, xt, xdt, xst, yt, ldy, ob, oe, 0);
    }
}

#define QB32_ROWS(NAME, DT, VNNI)                                                                  \
    static void NAME(const char *W, size_t wrb, int64_t nb, const int8_t *xq, const float *xd,     \
                     const float *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)        \
    {                                                                                              \
        qb32_rows(DT, VNNI, W, wrb, nb, xq, xd, xs, T, y, ldy, o0, o1);                            \
    }
QB32_ROWS(q41_rows, DT_Q4_1, 0)
QB32_ROWS(q50_rows, DT_Q5_0, 0)
QB32_ROWS(q51_rows, DT_Q5_1, 0)
QB32_ROWS(iq4nl_rows, DT_IQ4_NL, 0)
QB32_ROWS(q41_rows_vnni, DT_Q4_1, 1)
QB32_ROWS(q50_rows_vnni, DT_Q5_0, 1)
QB32_ROWS(q51_rows_vnni, DT_Q5_1, 1)
QB32_ROWS(iq4nl_rows_vnni, DT_IQ4_NL, 1)
#undef QB32_ROWS

/* ---- IQ4_XS ---- */

#define XS_ROWS 4 /* rows per tile with one token */
#define XS_TOK 8  /* tokens per tile with more */

/* The sub-block multipliers ls_j - 32 of an IQ4_XS super-block as 8 int16 lanes. */
AI __m128i iq4xs_scales16(const block_iq4_xs *b)
{
    uint32_t l;
    memcpy(&l, b->scales_l, 4);
    const __m128i v = _mm_cvtsi32_si128((int)l), m4 = _mm_set1_epi8(0x0f);
    /* bytes j: nibble j of scales_l (low nibble first) */
    const __m128i lo = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi16(_mm_set1_epi16((short)b->scales_h),
                                                    _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)),
                                     _mm_set1_epi16(3));
    const __m128i ls = _mm_or_si128(_mm_cvtepu8_epi16(lo), _mm_slli_epi16(hi, 4));
    return _mm_sub_epi16(ls, _mm_set1_epi16(32));
}

/* acc + the pairwise products of p and s summed in pairs into int32 lanes: vpmaddwd + vpaddd,
 * or the one VNNI vpdpwssd (the same exact integers). */
AI __m512i ql_madd_acc(const int vnni, __m512i acc, __m512i p, __m512i s)
{
    if (vnni) {
        __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(p), "v"(s));
        return acc;
    }
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
}

/* Rows [0, R) at row (stride wrb) against C tokens (token stride nsb); y[c * ldy + r]. */
AI void iq4xs_tile(const int vnni, const int R, const int C, const char *row, size_t wrb,
                   int64_t nsb, const kern_q8k_t *xq, float *y, int64_t ldy, size_t pfd)
{
    const __m512i kv = ql_table(0), m4 = _mm512_set1_epi8(0x0f);
    const __m512i shv = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    __m512 acc[XS_ROWS][XS_TOK];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    /* one token with VNNI: vpdpbusd of kv[q] + 128 and xq (started from -128 * xq's sums of 4,
     * once per super-block for all R rows), times the sub-block's ls - 32 (vpmulld): the same
     * int32 lanes as vpmaddubsw + vpdpwssd */
    const int dp = vnni && C == 1;
    const __m512i ku = ql_table(1);
    for (int64_t s = 0; s < nsb; s++) {
        __m512i X[4], NC[4];
        if (dp) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                X[j] = _mm512_loadu_si512(xq[s].q + 64 * j);
                NC[j] = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_set1_epi8(1), X[j]),
                                          _mm512_set1_epi16(-128));
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const block_iq4_xs *b = (const block_iq4_xs *)(row + (size_t)r * wrb) + s;
            if (pfd) {
                kern_pf_stream((const char *)b + pfd);
                kern_pf_stream((const char *)b + pfd + 64);
                kern_pf_stream((const char *)b + pfd + 128);
            }
            const __m128i sc16 = iq4xs_scales16(b);
            const __m512i sc = _mm512_castsi128_si512(sc16);
            const __m512i sc32 = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(sc16));
            const float d = _cvtsh_ss(b->d);
            if (dp) {
                __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * j)));
                    v = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 1, 0, 0));
                    const __m512i u = _mm512_shuffle_epi8(ku, _mm512_and_si512(_mm512_srlv_epi64(v, shv), m4));
                    const __m512i idx = _mm512_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j,
                                                          2 * j, 2 * j, 2 * j + 1, 2 * j + 1,
                                                          2 * j + 1, 2 * j + 1, 2 * j + 1,
                                                          2 * j + 1, 2 * j + 1, 2 * j + 1);
                    __m512i p = NC[j];
                    __asm__("vpdpbusd %2, %1, %0" : "+v"(p) : "v"(u), "v"(X[j]));
                    isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(p, _mm512_permutexvar_epi32(idx, sc32)));
                }
                const __m512 dd = _mm512_set1_ps(d * xq[s].d);
                acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, acc[r][0]);
                continue;
            }
            __m512i A[4], S[4];
            __mmask64 N[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                /* 128-bit lanes: sub-block 2j's bytes twice, then 2j+1's */
                __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * j)));
                v = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 1, 0, 0));
                const __m512i w = _mm512_shuffle_epi8(kv, _mm512_and_si512(_mm512_srlv_epi64(v, shv), m4));
                A[j] = _mm512_abs_epi8(w);
                N[j] = _mm512_movepi8_mask(w);
                const __m512i idx = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * j))),
                    _mm256_set1_epi16((short)(2 * j + 1)), 1);
                S[j] = _mm512_permutexvar_epi16(idx, sc);
            }
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const kern_q8k_t *xb = xq + c * nsb + s;
                __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const __m512i x8 = _mm512_loadu_si512(xb->q + 64 * j);
                    const __m512i xs = _mm512_mask_sub_epi8(x8, N[j], _mm512_setzero_si512(), x8);
                    isum = ql_madd_acc(vnni, isum, _mm512_maddubs_epi16(A[j], xs), S[j]);
                }
                const __m512 dd = _mm512_set1_ps(d * xb->d);
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, acc[r][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) y[c * ldy + r] = simd_hsum16(acc[r][c]);
}

AI void iq4xs_rows_isa(const int vnni, const char *W, size_t wrb, int64_t nsb,
                       const kern_q8k_t *xq, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    int64_t panel = T <= XS_TOK ? o1 - o0 : (int64_t)(QL_PANEL_BYTES / wrb);
    if (panel < 1) panel = 1;
    if (T <= XS_TOK) ql_stream_head(W + (size_t)o0 * wrb, (size_t)(o1 - o0) * wrb);
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        for (int t = 0; t < T; t += XS_TOK) {
            const kern_q8k_t *xt = xq + (int64_t)t * nsb;
            float *yt = y + (int64_t)t * ldy;
            const size_t pfd = t == 0 ? QL_PF_BYTES : 0;
            int64_t o = ob;
            if (T - t == 1) { /* one token: rows spread over XS_ROWS runs (kernels_impl.h) */
                const int64_t q = (oe - ob) / XS_ROWS;
                float ts[XS_ROWS];
                for (int64_t i = 0; i < q; i++) {
                    iq4xs_tile(vnni, XS_ROWS, 1, W + (size_t)(ob + i) * wrb, (size_t)q * wrb, nsb,
                               xt, ts, XS_ROWS, pfd);
                    kern_spread_store(ts, XS_ROWS, 1, yt + ob + i, ldy, q);
                }
                o = ob + XS_ROWS * q;
            }
            for (; o < oe; o++) {
                const char *row = W + (size_t)o * wrb;
                switch (T - t) {
                case 1: iq4xs_tile(vnni, 1, 1, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 2: iq4xs_tile(vnni, 1, 2, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 3: iq4xs_tile(vnni, 1, 3, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 4: iq4xs_tile(vnni, 1, 4, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 5: iq4xs_tile(vnni, 1, 5, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 6: iq4xs_tile(vnni, 1, 6, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                case 7: iq4xs_tile(vnni, 1, 7, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                default: iq4xs_tile(vnni, 1, 8, row, wrb, nsb, xt, yt + o, ldy, pfd); break;
                }
            }
        }
    }
}

static void iq4xs_rows(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T,
                       float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    iq4xs_rows_isa(0, W, wrb, nsb, xq, T, y, ldy, o0, o1);
}

static void iq4xs_rows_vnni(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T,
                            float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    iq4xs_rows_isa(1, W, wrb, nsb, xq, T, y, ldy, o0, o1);
}

/* The token quantisers are the portable ones (the same bits; a small part of the time). */
const kern_qleg_t kern_qleg_avx512 = {
    .q4_1 = q41_rows,
    .q5_0 = q50_rows,
    .q5_1 = q51_rows,
    .iq4_nl = iq4nl_rows,
    .iq4_xs = iq4xs_rows,
    .quant = kern_q8_quantize,
    .quant_k = kern_q8k_quantize,
};

/* Only used where the CPU has AVX512-VNNI (kern_get). */
const kern_qleg_t kern_qleg_avx512_vnni = {
    .q4_1 = q41_rows_vnni,
    .q5_0 = q50_rows_vnni,
    .q5_1 = q51_rows_vnni,
    .iq4_nl = iq4nl_rows_vnni,
    .iq4_xs = iq4xs_rows_vnni,
    .quant = kern_q8_quantize,
    .quant_k = kern_q8k_quantize,
};

#if defined(__clang__)
#pragma clang attribute pop
#endif
