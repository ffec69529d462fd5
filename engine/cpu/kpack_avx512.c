/* engine/cpu/kpack_avx512.c: packed Q4_K, Q5_K, Q6_K, IQ4_XS and Q8_0 x int8, and packed F16 x
 * F32 (kernels.h "Packed ..."; the layouts in kernels_impl.h) for AVX-512 (F,
 * BW, VL, DQ) + AVX512-VNNI + FMA + F16C. Called only through the avx512-vnni table, which
 * kern_get returns only where the CPU has all of them.
 *
 * Per unit of a group of 16 rows (row r in 32-bit lane r) and per token, each 64-byte line of
 * quants (4 quant bytes of every row) becomes 4 unsigned quants per lane and goes through
 * vpdpbusd against the token's 4 matching xq, broadcast, into one int32 accumulator per
 * sub-block (block) and token:
 *   Q4_K: the low nibbles of a line are sub-block 2c of chunk c, the high ones 2c + 1
 *     (|P| <= 32 * 15 * 127; Q5_K: the same with each quant's 5th bit from its qh line,
 *     |P| <= 32 * 31 * 127); isum += P * sc (vpmulld) at each sub-block's end; the mins term
 *     msum = vpdpwssd of the rows' (m_2p, m_2p+1) pairs with the token's bsum pairs;
 *     acc = fma(float(isum), d * dx, acc), accm = fma(float(msum), dmin * dx, accm),
 *     y = acc - accm.
 *   Q6_K: q = ql nibble | qh bit pair << 4 in 0..63 (|P| <= 16 * 63 * 127); isum += P * sc;
 *     the -32 of every quant as -32 * sum_j sc_j * bsum16_j (vpdpwssd of the rows' scale pairs
 *     with the token's 16-element sums, kern_q8k16_t), so isum = sum_j sc_j sum_k (q_k - 32)
 *     xq_k exactly; acc = fma(float(isum), d * dx, acc), y = acc.
 *   IQ4_XS: kv[q] + 128 (a byte shuffle of each nibble) through vpdpbusd; isum += P * (ls - 32)
 *     per sub-block of 32 and the +128 folded in as -128 * sum_j (ls_j - 32) bsum_j (vpdpwssd);
 *     acc = fma(float(isum), d * dx, acc), y = acc.
 *   Q8_0: the stored q + 128, P started at -128 * the token's block sum, so P = sum q * xq
 *     exactly (|P| <= 32 * 128 * 127); acc = fma(float(P), d * dx, acc) per block, y = acc.
 *   F16 (F32 x, not quantised): each 32-byte column widened by vcvtph2ps; one F32 chain per
 *     row and token, acc = fma(w_k, x_k, acc) in column order, y = acc; up to 4 groups side by
 *     side share each token's broadcast x_k (f16_rows).
 * Each (row, token) has its own lane and accumulators and the same operations whatever the tile,
 * so the routes are batch invariant. */
#if defined(__x86_64__) && defined(__GNUC__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/q23k.h"

#define AI static inline __attribute__((always_inline))

#ifndef X16_TOK
#define X16_TOK 8 /* tokens per tile */
#endif
#define X16_PF_BYTES 16384           /* prefetch distance of a several-token tile streaming */
#define X16_PANEL_BYTES (192 * 1024) /* groups kept in L2 while every token tile passes them */
#define X16_F16_PF1_BYTES 4096       /* F16, one token: prefetch distance of each group's stream */
#define X16_F16_TOK 6                /* F16: tokens per tile */
#define X16_F16_L2 (512 * 1024)      /* F16: bytes of the groups a tile set keeps in L2 */

/* The vpshufb control that puts, in every 32-bit lane, bytes b0..b3 of that lane's own word
 * (b < 0: a zero byte). */
AI __m512i lane_ctl(int b0, int b1, int b2, int b3)
{
    int32_t v[16];
    for (int j = 0; j < 16; j++) {
        const int base = 4 * (j % 4);
        const int b[4] = {b0, b1, b2, b3};
        uint32_t w = 0;
        for (int i = 0; i < 4; i++) w |= (uint32_t)(b[i] < 0 ? 0x80 : base + b[i]) << (8 * i);
        v[j] = (int32_t)w;
    }
    return _mm512_loadu_si512(v);
}

/* 4 bytes at p, in every 32-bit lane. */
AI __m512i bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The lines of the unit of `bytes` at B + pfd, streamed (kern_pf_stream; pfd 0: none). */
AI void x16_prefetch(const unsigned char *B, size_t pfd, size_t bytes)
{
    if (!pfd) return;
    for (size_t l = 0; l < bytes; l += 64) kern_pf_stream(B + pfd + l);
}

/* acc[c] = 0 for C tokens. */
AI void x16_zero(const int C, __m512 *acc)
{
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
}

/* v[c] = 0 for C tokens. */
AI void x16_zeroi(const int C, __m512i *v)
{
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) v[c] = _mm512_setzero_si512();
}

/* isum[c] = -(isum[c] << k) for C tokens: a correction summed first, scaled and negated. */
AI void neg_shift(const int C, __m512i *isum, const int k)
{
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        isum[c] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(isum[c], k));
}

/* acc[c] = fma(float(isum[c]), d * dx_c, acc[c]) for C tokens: d the 16 rows' fp16 scales at
 * dp, dx_c = xb[c * nsb].d (xb: token 0's block of this super-block). */
AI void x16_fold(const int C, const unsigned char *dp, const kern_q8k_t *xb, int64_t nsb,
                 const __m512i *isum, __m512 *acc)
{
    const __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dp));
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]),
                                 _mm512_mul_ps(D, _mm512_set1_ps(xb[c * nsb].d)), acc[c]);
}

/* y[c * ldy + r] = acc[c] lane r for the rows r in keep, C tokens. */
AI void x16_store(const int C, const __m512 *acc, float *y, int64_t ldy, __mmask16 keep)
{
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) _mm512_mask_storeu_ps(y + c * ldy, keep, acc[c]);
}

/* Q4_K (q5 0) or Q5_K (q5 1): group G (nsb super-blocks of KERN_Q4KX16_SB_BYTES or
 * KERN_Q5KX16_SB_BYTES) against C tokens of xq (token stride nsb);
 * y[c * ldy + r] for the rows r in keep. pfd: prefetch distance (0: none). */
AI void q4_tile(const int q5, const int C, const unsigned char *G, int64_t nsb,
                const kern_q8k_t *xq, float *y, int64_t ldy, __mmask16 keep, size_t pfd)
{
    const size_t sbb = q5 ? KERN_Q5KX16_SB_BYTES : KERN_Q4KX16_SB_BYTES;
    const __m512i m10 = _mm512_set1_epi8(0x10);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i m6 = _mm512_set1_epi8(0x3f);
    const __m512i m2 = _mm512_set1_epi8(0x03);
    const __m512i mb = _mm512_set1_epi32(0xff);
    /* vpshufb controls: the mins as int16 pairs (m_2p, m_2p+1) per lane */
    const __m512i pair_lo = lane_ctl(0, -1, 1, -1), pair_hi = lane_ctl(2, -1, 3, -1);
    __m512 acc[X16_TOK], accm[X16_TOK];
    x16_zero(C, acc);
    x16_zero(C, accm);
    for (int64_t s = 0; s < nsb; s++) {
        const unsigned char *B = G + (size_t)s * sbb;
        x16_prefetch(B, pfd, sbb);
        /* q4k_unpack_words in every lane: v0 sc 0..3, v1 sc 4..7, v2 m 0..3, v3 m 4..7 */
        const __m512i wa = _mm512_loadu_si512(B + 64), wb = _mm512_loadu_si512(B + 128),
                      wc = _mm512_loadu_si512(B + 192);
        const __m512i v0 = _mm512_and_si512(wa, m6), v2 = _mm512_and_si512(wb, m6);
        const __m512i v1 = _mm512_or_si512(
            _mm512_and_si512(wc, m4),
            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(wa, 6), m2), 4));
        const __m512i v3 = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32(wc, 4), m4),
            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(wb, 6), m2), 4));
        const __m512i M0 = _mm512_shuffle_epi8(v2, pair_lo), M1 = _mm512_shuffle_epi8(v2, pair_hi);
        const __m512i M2 = _mm512_shuffle_epi8(v3, pair_lo), M3 = _mm512_shuffle_epi8(v3, pair_hi);
        __m512i isum[X16_TOK];
        x16_zeroi(C, isum);
#pragma GCC unroll 4
        for (int ch = 0; ch < 4; ch++) {
            __m512i plo[X16_TOK], phi[X16_TOK];
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) plo[c] = phi[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++) {
                const __m512i V = _mm512_loadu_si512(
                    B + 256 + 64 * (q5 ? kern_q5k_line(8 * ch + m, 0) : 8 * ch + m));
                __m512i lo = _mm512_and_si512(V, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(V, 4), m4);
                if (q5) { /* Q5_K: bits 2ch and 2ch + 1 of qh word m, moved to bit 4 */
                    const __m512i H = _mm512_loadu_si512(B + 256 + 64 * kern_q5k_line(-1, m));
                    const __m512i hl = 2 * ch <= 4 ? _mm512_slli_epi16(H, 4 - 2 * ch)
                                                   : _mm512_srli_epi16(H, 2 * ch - 4);
                    const __m512i hh = 2 * ch + 1 <= 4 ? _mm512_slli_epi16(H, 3 - 2 * ch)
                                                       : _mm512_srli_epi16(H, 2 * ch - 3);
                    lo = _mm512_or_si512(lo, _mm512_and_si512(hl, m10));
                    hi = _mm512_or_si512(hi, _mm512_and_si512(hh, m10));
                }
#pragma GCC unroll 8
                for (int c = 0; c < C; c++) {
                    const int8_t *xs = xq[c * nsb + s].q + 64 * ch + 4 * m;
                    plo[c] = _mm512_dpbusd_epi32(plo[c], lo, bcast4(xs));
                    phi[c] = _mm512_dpbusd_epi32(phi[c], hi, bcast4(xs + 32));
                }
            }
            /* the scales of sub-blocks 2ch and 2ch + 1: bytes (2ch) % 4, (2ch + 1) % 4 of v0/v1 */
            const __m512i vs = ch < 2 ? v0 : v1;
            const __m512i slo = _mm512_and_si512(_mm512_srli_epi32(vs, 8 * ((2 * ch) % 4)), mb);
            const __m512i shi = _mm512_and_si512(_mm512_srli_epi32(vs, 8 * ((2 * ch + 1) % 4)), mb);
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                isum[c] = _mm512_add_epi32(
                    isum[c], _mm512_add_epi32(_mm512_mullo_epi32(plo[c], slo),
                                              _mm512_mullo_epi32(phi[c], shi)));
        }
        /* msum: the rows' mins pairs against the token's bsum pairs */
        __m512i mi[X16_TOK];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const kern_q8k_t *xb = xq + c * nsb + s;
            mi[c] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), M0, bcast4(xb->bsum));
            mi[c] = _mm512_dpwssd_epi32(mi[c], M1, bcast4(xb->bsum + 2));
            mi[c] = _mm512_dpwssd_epi32(mi[c], M2, bcast4(xb->bsum + 4));
            mi[c] = _mm512_dpwssd_epi32(mi[c], M3, bcast4(xb->bsum + 6));
        }
        x16_fold(C, B, xq + s, nsb, isum, acc);       /* d */
        x16_fold(C, B + 32, xq + s, nsb, mi, accm);   /* dmin */
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        _mm512_mask_storeu_ps(y + c * ldy, keep, _mm512_sub_ps(acc[c], accm[c]));
}

/* Offsets in a packed Q6_K super-block (kernels_impl.h): the line of ql word 16h + 8a + wi and
 * of qh word 8h + wi. */
AI size_t q6_ql(int h, int a, int wi)
{
    return KERN_Q6KX16_QOFF + 64 * (size_t)(24 * h + 3 * wi + a);
}
AI size_t q6_qh(int h, int wi)
{
    return KERN_Q6KX16_QOFF + 64 * (size_t)(24 * h + 3 * wi + 2);
}

/* Q6_K: group G (nsb super-blocks of KERN_Q6KX16_SB_BYTES) against C tokens of xq and their
 * 16-element sums xs (token stride nsb); y[c * ldy + r] for the rows r in keep. pfd:
 * prefetch distance (0: none). */
AI void q6_tile(const int C, const unsigned char *G, int64_t nsb, const kern_q8k_t *xq,
                const kern_q8k16_t *xs, float *y, int64_t ldy, __mmask16 keep, size_t pfd)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[X16_TOK];
    x16_zero(C, acc);
    for (int64_t s = 0; s < nsb; s++) {
        const unsigned char *B = G + (size_t)s * KERN_Q6KX16_SB_BYTES;
        x16_prefetch(B, pfd, KERN_Q6KX16_SB_BYTES);
        /* isum starts at -32 * sum_j sc_j bsum16_j: pair p of the scales against the sums */
        __m512i isum[X16_TOK];
        x16_zeroi(C, isum);
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) {
            const __m512i sp =
                _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(B + 32 + 32 * p)));
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                isum[c] = _mm512_dpwssd_epi32(isum[c], sp, bcast4(xs[c * nsb + s].s + 2 * p));
        }
        neg_shift(C, isum, 5);
        /* sub-block j = 8h + g + 2 pos: weights 128h + 32 pos + 16g .. +15, the quads 4g + w
         * (w < 4) of ql word 16h + 8 (pos & 1) + 4g + w and qh word 8h + 4g + w, bit pair pos.
         * One token: each qh word and ql word pair unpacked once into its 4 quads (8 sub-block
         * accumulators at a time); several: a sub-block at a time for all tokens. The same
         * integers either way. */
        if (C == 1) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i P[4][2];
#pragma GCC unroll 4
                for (int pos = 0; pos < 4; pos++) P[pos][0] = P[pos][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int wi = 0; wi < 8; wi++) {
                    const __m512i ql0 = _mm512_loadu_si512(B + q6_ql(h, 0, wi));
                    const __m512i ql1 = _mm512_loadu_si512(B + q6_ql(h, 1, wi));
                    const __m512i qh = _mm512_loadu_si512(B + q6_qh(h, wi));
                    const __m512i q[4] = {
                        _mm512_or_si512(_mm512_and_si512(ql0, m4),
                                        _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30)),
                        _mm512_or_si512(_mm512_and_si512(ql1, m4),
                                        _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30)),
                        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql0, 4), m4),
                                        _mm512_and_si512(qh, m30)),
                        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql1, 4), m4),
                                        _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30))};
#pragma GCC unroll 4
                    for (int pos = 0; pos < 4; pos++)
                        P[pos][wi / 4] = _mm512_dpbusd_epi32(
                            P[pos][wi / 4], q[pos], bcast4(xq[s].q + 128 * h + 32 * pos + 4 * wi));
                }
#pragma GCC unroll 4
                for (int pos = 0; pos < 4; pos++) {
                    const __m512i sp = _mm512_cvtepi8_epi16(
                        _mm256_loadu_si256((const __m256i *)(B + 32 + 32 * (4 * h + pos))));
                    isum[0] = _mm512_add_epi32(
                        isum[0], _mm512_mullo_epi32(
                                     P[pos][0], _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16)));
                    isum[0] = _mm512_add_epi32(
                        isum[0], _mm512_mullo_epi32(P[pos][1], _mm512_srai_epi32(sp, 16)));
                }
            }
        } else
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
            for (int g = 0; g < 2; g++)
#pragma GCC unroll 4
                for (int pos = 0; pos < 4; pos++) {
                    __m512i P[X16_TOK];
                    x16_zeroi(C, P);
#pragma GCC unroll 4
                    for (int w = 0; w < 4; w++) {
                        const int wi = 4 * g + w;
                        const __m512i ql = _mm512_loadu_si512(B + q6_ql(h, pos & 1, wi));
                        const __m512i qh = _mm512_loadu_si512(B + q6_qh(h, wi));
                        const __m512i lo = pos < 2 ? _mm512_and_si512(ql, m4)
                                                   : _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
                        const __m512i hb = pos == 0   ? _mm512_slli_epi16(qh, 4)
                                           : pos == 1 ? _mm512_slli_epi16(qh, 2)
                                           : pos == 2 ? qh
                                                      : _mm512_srli_epi16(qh, 2);
                        const __m512i q = _mm512_or_si512(lo, _mm512_and_si512(hb, m30));
#pragma GCC unroll 8
                        for (int c = 0; c < C; c++)
                            P[c] = _mm512_dpbusd_epi32(
                                P[c], q, bcast4(xq[c * nsb + s].q + 128 * h + 32 * pos + 4 * wi));
                    }
                    /* scale j = 8h + g + 2 pos: of pair 4h + pos, the low (g = 0) or high half */
                    const __m512i sp = _mm512_cvtepi8_epi16(
                        _mm256_loadu_si256((const __m256i *)(B + 32 + 32 * (4 * h + pos))));
                    const __m512i sc = g ? _mm512_srai_epi32(sp, 16)
                                         : _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16);
#pragma GCC unroll 8
                    for (int c = 0; c < C; c++)
                        isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(P[c], sc));
                }
        x16_fold(C, B, xq + s, nsb, isum, acc);
    }
    x16_store(C, acc, y, ldy, keep);
}

/* IQ4_XS: group G (nsb super-blocks of KERN_IQ4XSX16_SB_BYTES) against C tokens of xq (token
 * stride nsb); y[c * ldy + r] for the rows r in keep. pfd: prefetch distance (0: none). */
AI void iq4_tile(const int C, const unsigned char *G, int64_t nsb, const kern_q8k_t *xq, float *y,
                 int64_t ldy, __mmask16 keep, size_t pfd)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi32(3);
    /* kv[q] + 128 (1..241, unsigned for vpdpbusd) in every 128-bit lane */
    int8_t kvu[16];
    for (int i = 0; i < 16; i++) kvu[i] = (int8_t)(dtype_iq4nl_values[i] + 128);
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kvu));
    __m512 acc[X16_TOK];
    x16_zero(C, acc);
    for (int64_t s = 0; s < nsb; s++) {
        const unsigned char *B = G + (size_t)s * KERN_IQ4XSX16_SB_BYTES;
        x16_prefetch(B, pfd, KERN_IQ4XSX16_SB_BYTES);
        const __m512i sh = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(B + 32)));
        const __m512i sl = _mm512_loadu_si512(B + 64);
        /* ls_j - 32 of sub-block j, per row lane */
        __m512i ls[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            ls[j] = _mm512_sub_epi32(
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32(sl, 8 * (j / 2) + 4 * (j % 2)), _mm512_set1_epi32(0xf)),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * j), m3), 4)),
                _mm512_set1_epi32(32));
        /* isum starts at -128 * sum_j (ls_j - 32) bsum_j (the +128 of every stored kv): the
         * pairs (ls_2p - 32, ls_2p+1 - 32) as int16 against the token's bsum pairs */
        __m512i isum[X16_TOK];
        x16_zeroi(C, isum);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const __m512i lp = _mm512_or_si512(_mm512_and_si512(ls[2 * p], _mm512_set1_epi32(0xffff)),
                                               _mm512_slli_epi32(ls[2 * p + 1], 16));
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                isum[c] = _mm512_dpwssd_epi32(isum[c], lp, bcast4(xq[c * nsb + s].bsum + 2 * p));
        }
        neg_shift(C, isum, 7);
        /* sub-block j: qs words 4j .. 4j+3, low nibbles weights 32j + 4w .., high 32j + 16 + 4w */
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i P[X16_TOK];
            x16_zeroi(C, P);
#pragma GCC unroll 4
            for (int w = 0; w < 4; w++) {
                const __m512i V = _mm512_loadu_si512(B + 128 + 64 * (4 * j + w));
                const __m512i lo = _mm512_shuffle_epi8(tbl, _mm512_and_si512(V, m4));
                const __m512i hi =
                    _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(V, 4), m4));
#pragma GCC unroll 8
                for (int c = 0; c < C; c++) {
                    const int8_t *xs = xq[c * nsb + s].q + 32 * j + 4 * w;
                    P[c] = _mm512_dpbusd_epi32(P[c], lo, bcast4(xs));
                    P[c] = _mm512_dpbusd_epi32(P[c], hi, bcast4(xs + 16));
                }
            }
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(P[c], ls[j]));
        }
        x16_fold(C, B, xq + s, nsb, isum, acc);
    }
    x16_store(C, acc, y, ldy, keep);
}

/* Q8_0: group G (ceil(nb / 2) pairs of blocks of KERN_Q8X16_PAIR_BYTES) against C tokens of
 * q8 (token stride nb * 32), their block scales d8 and -128 times their block sums ns (both
 * token stride nb); y[c * ldy + r] for the rows r in keep. pfd: prefetch distance (0: none). */
AI void q8_tile(const int C, const unsigned char *G, int64_t nb, const int8_t *q8, const float *d8,
                const int32_t *ns, float *y, int64_t ldy, __mmask16 keep, size_t pfd)
{
    const int64_t K = nb * QK8_0;
    __m512 acc[X16_TOK];
    x16_zero(C, acc);
    for (int64_t p = 0; p < (nb + 1) / 2; p++) {
        const unsigned char *B = G + (size_t)p * KERN_Q8X16_PAIR_BYTES;
        x16_prefetch(B, pfd, KERN_Q8X16_PAIR_BYTES);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int64_t b = 2 * p + h;
            if (b >= nb) break;
            /* P = -128 * sum xq + sum (q + 128) xq = sum q * xq, per row lane */
            __m512i P[X16_TOK];
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) P[c] = _mm512_set1_epi32(ns[c * nb + b]);
#pragma GCC unroll 8
            for (int m = 0; m < QK8_0 / 4; m++) {
                const __m512i w = _mm512_loadu_si512(B + 64 + 512 * h + 64 * m);
#pragma GCC unroll 8
                for (int c = 0; c < C; c++)
                    P[c] = _mm512_dpbusd_epi32(P[c], w, bcast4(q8 + c * K + QK8_0 * b + 4 * m));
            }
            const __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(B + 32 * h)));
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(P[c]),
                                         _mm512_mul_ps(D, _mm512_set1_ps(d8[c * nb + b])), acc[c]);
        }
    }
    x16_store(C, acc, y, ldy, keep);
}

/* A run of tokens as the tiles take them: K-quants xq (and Q6_K's xs), token stride nsb; Q8_0
 * q8 (token stride nb * 32), d8 and ns (token stride nb). */
typedef struct {
    const kern_q8k_t *xq;
    const kern_q8k16_t *xs;
    const int8_t *q8;
    const float *d8;
    const int32_t *ns;
} x16_tok_t;

/* Token t of x (type wt; n: nsb or nb) onwards. */
AI x16_tok_t tok_at(const int wt, const x16_tok_t *x, int64_t n, int t)
{
    x16_tok_t r = {0};
    if (wt == DT_Q8_0) {
        r.q8 = x->q8 + (int64_t)t * n * QK8_0;
        r.d8 = x->d8 + (int64_t)t * n;
        r.ns = x->ns + (int64_t)t * n;
    } else {
        r.xq = x->xq + (int64_t)t * n;
        r.xs = x->xs ? x->xs + (int64_t)t * n : NULL;
    }
    return r;
}

/* C tokens of group G, type wt (a constant; n its nsb or nb): the tile of that type. */
AI void x16_tile(const int wt, const int C, const unsigned char *G, int64_t n, const x16_tok_t *x,
                 float *y, int64_t ldy, __mmask16 keep, size_t pfd)
{
    if (wt == DT_Q4_K || wt == DT_Q5_K) q4_tile(wt == DT_Q5_K, C, G, n, x->xq, y, ldy, keep, pfd);
    else if (wt == DT_Q6_K) q6_tile(C, G, n, x->xq, x->xs, y, ldy, keep, pfd);
    else if (wt == DT_IQ4_XS) iq4_tile(C, G, n, x->xq, y, ldy, keep, pfd);
    else q8_tile(C, G, n, x->q8, x->d8, x->ns, y, ldy, keep, pfd);
}

/* y[t * ldy + o] for t < T, o in [o0, o1) over the packed matrix P of type wt (n: nsb, Q8_0 nb)
 * and the tokens x: groups in panels kept in L2 while every tile of tokens passes over them;
 * with few tokens, one pass. A thread's rows are one sequential stream: with one token the
 * hardware prefetchers keep up alone (software prefetch measured 0.7-1.0x on Zen 4), with
 * several the first tile over a panel prefetches X16_PF_BYTES ahead (bench/RESULTS.md). */
AI void x16_rows(const int wt, const char *P, int64_t n, const x16_tok_t *x, int T, float *y,
                 int64_t ldy, int64_t o0, int64_t o1)
{
    const size_t gb = wt == DT_Q8_0   ? (size_t)((n + 1) / 2) * KERN_Q8X16_PAIR_BYTES
                      : wt == DT_Q4_K ? (size_t)n * KERN_Q4KX16_SB_BYTES
                      : wt == DT_Q5_K ? (size_t)n * KERN_Q5KX16_SB_BYTES
                      : wt == DT_IQ4_XS ? (size_t)n * KERN_IQ4XSX16_SB_BYTES
                                      : (size_t)n * KERN_Q6KX16_SB_BYTES;
    const unsigned char *base = (const unsigned char *)P;
    const int64_t g0 = o0 / KERN_PACK_ROWS, g1 = (o1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    int64_t panel = T <= X16_TOK ? g1 - g0 : (int64_t)(X16_PANEL_BYTES / gb);
    if (panel < 1) panel = 1;
    for (int64_t gb0 = g0; gb0 < g1; gb0 += panel) {
        const int64_t ge = g1 - gb0 < panel ? g1 : gb0 + panel;
        for (int t = 0; t < T; t += X16_TOK) {
            const x16_tok_t xt = tok_at(wt, x, n, t);
            const size_t pfd = T > 1 && t == 0 ? X16_PF_BYTES : 0;
            for (int64_t g = gb0; g < ge; g++) {
                const int64_t r0 = g * KERN_PACK_ROWS;
                const int64_t lo = o0 > r0 ? o0 - r0 : 0;
                const int64_t hi = o1 - r0 < KERN_PACK_ROWS ? o1 - r0 : KERN_PACK_ROWS;
                const __mmask16 keep = (__mmask16)((0xffffu >> (16 - (hi - lo))) << lo);
                const unsigned char *G = base + (size_t)g * gb;
                float *yt = y + (int64_t)t * ldy + r0;
                switch (T - t) {
                case 1: x16_tile(wt, 1, G, n, &xt, yt, ldy, keep, pfd); break;
                case 2: x16_tile(wt, 2, G, n, &xt, yt, ldy, keep, pfd); break;
                case 3: x16_tile(wt, 3, G, n, &xt, yt, ldy, keep, pfd); break;
                case 4: x16_tile(wt, 4, G, n, &xt, yt, ldy, keep, pfd); break;
#if X16_TOK > 4
                case 5: x16_tile(wt, 5, G, n, &xt, yt, ldy, keep, pfd); break;
                case 6: x16_tile(wt, 6, G, n, &xt, yt, ldy, keep, pfd); break;
                case 7: x16_tile(wt, 7, G, n, &xt, yt, ldy, keep, pfd); break;
#endif
                default: x16_tile(wt, X16_TOK, G, n, &xt, yt, ldy, keep, pfd); break;
                }
            }
        }
    }
}

/* F16: NG groups from G0 (each K columns of 32 bytes, gb bytes apart) against C tokens of x (F32,
 * token stride ldx); y[c * ldy + 16 g + r] for the rows r in keep[g]. pfd: prefetch distance of
 * each group's stream (0: none): non-temporal with one token (each line is read once), else into
 * L2 (the groups are read again by the next tiles). */
AI void f16_tile(const int NG, const int C, const unsigned char *G0, size_t gb, int64_t K,
                 const float *x, int64_t ldx, float *y, int64_t ldy, const __mmask16 *keep,
                 size_t pfd)
{
    __m512 acc[4][X16_F16_TOK];
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) x16_zero(C, acc[g]);
    for (int64_t k = 0; k < K; k += 2) {
        if (pfd) {
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) {
                const char *p = (const char *)(G0 + (size_t)g * gb + (size_t)k * 32 + pfd);
                if (C == 1) _mm_prefetch(p, _MM_HINT_NTA);
                else kern_pf_stream(p);
            }
        }
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++) {
            __m512 w[4];
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++)
                w[g] = _mm512_cvtph_ps(_mm256_load_si256(
                    (const __m256i *)(G0 + (size_t)g * gb + (size_t)(k + j) * 32)));
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const __m512 xb = _mm512_set1_ps(x[c * ldx + k + j]);
#pragma GCC unroll 4
                for (int g = 0; g < NG; g++) acc[g][c] = _mm512_fmadd_ps(w[g], xb, acc[g][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) x16_store(C, acc[g], y + 16 * g, ldy, keep[g]);
}

/* C (a constant) tokens over NG groups: f16_tile. */
AI void f16_tile_ng(const int C, int NG, const unsigned char *G0, size_t gb, int64_t K,
                    const float *x, int64_t ldx, float *y, int64_t ldy, const __mmask16 *keep,
                    size_t pfd)
{
    switch (NG) {
    case 1: f16_tile(1, C, G0, gb, K, x, ldx, y, ldy, keep, pfd); break;
    case 2: f16_tile(2, C, G0, gb, K, x, ldx, y, ldy, keep, pfd); break;
    case 3: f16_tile(3, C, G0, gb, K, x, ldx, y, ldy, keep, pfd); break;
    default: f16_tile(4, C, G0, gb, K, x, ldx, y, ldy, keep, pfd); break;
    }
}

/* Packed F16 rows [o0, o1) for T tokens: sets of up to 4 groups (fewer when K is long, so that a
 * set stays in L2 while the token tiles of X16_F16_TOK pass over it); the first tile over a set
 * prefetches (one token: X16_F16_PF1_BYTES ahead, non-temporal; several: X16_PF_BYTES). Every
 * (row, token) lane gets the same chain whatever the set or tile: batch invariant. */
static void f16_rows(const unsigned char *P, int64_t K, const float *x, int64_t ldx, int T,
                     float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    const size_t gb = (size_t)K * 32;
    int per = (int)(X16_F16_L2 / gb);
    per = per < 1 ? 1 : per > 4 ? 4 : per;
    const int64_t g0 = o0 / KERN_PACK_ROWS, g1 = (o1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    for (int64_t gs = g0; gs < g1; gs += per) {
        const int ng = g1 - gs < per ? (int)(g1 - gs) : per;
        __mmask16 keep[4];
        for (int g = 0; g < ng; g++) {
            const int64_t r0 = (gs + g) * KERN_PACK_ROWS;
            const int64_t lo = o0 > r0 ? o0 - r0 : 0;
            const int64_t hi = o1 - r0 < KERN_PACK_ROWS ? o1 - r0 : KERN_PACK_ROWS;
            keep[g] = (__mmask16)((0xffffu >> (16 - (hi - lo))) << lo);
        }
        const unsigned char *G0 = P + (size_t)gs * gb;
        for (int t = 0; t < T; t += X16_F16_TOK) {
            const size_t pfd = t ? 0 : T == 1 ? X16_F16_PF1_BYTES : X16_PF_BYTES;
            const float *xt = x + (int64_t)t * ldx;
            float *yt = y + (int64_t)t * ldy + gs * KERN_PACK_ROWS;
            switch (T - t) {
            case 1: f16_tile_ng(1, ng, G0, gb, K, xt, ldx, yt, ldy, keep, pfd); break;
            case 2: f16_tile_ng(2, ng, G0, gb, K, xt, ldx, yt, ldy, keep, pfd); break;
            case 3: f16_tile_ng(3, ng, G0, gb, K, xt, ldx, yt, ldy, keep, pfd); break;
            case 4: f16_tile_ng(4, ng, G0, gb, K, xt, ldx, yt, ldy, keep, pfd); break;
            case 5: f16_tile_ng(5, ng, G0, gb, K, xt, ldx, yt, ldy, keep, pfd); break;
            default: f16_tile_ng(X16_F16_TOK, ng, G0, gb, K, xt, ldx, yt, ldy, keep, pfd); break;
            }
        }
    }
}

/* kern_q4k_fn over a packed Q4_K matrix (wrb unused) */
static void q4_rows(const char *P, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T, float *y,
                    int64_t ldy, int64_t o0, int64_t o1)
{
    (void)wrb;
    const x16_tok_t x = {.xq = xq};
    x16_rows(DT_Q4_K, P, nsb, &x, T, y, ldy, o0, o1);
}

/* kern_q4k_fn over a packed Q5_K matrix (wrb unused) */
static void q5_rows(const char *P, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T, float *y,
                    int64_t ldy, int64_t o0, int64_t o1)
{
    (void)wrb;
    const x16_tok_t x = {.xq = xq};
    x16_rows(DT_Q5_K, P, nsb, &x, T, y, ldy, o0, o1);
}

/* kern_q4k_fn over a packed IQ4_XS matrix (wrb unused) */
static void iq4_rows(const char *P, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T, float *y,
                     int64_t ldy, int64_t o0, int64_t o1)
{
    (void)wrb;
    const x16_tok_t x = {.xq = xq};
    x16_rows(DT_IQ4_XS, P, nsb, &x, T, y, ldy, o0, o1);
}

/* kern_q23k_fn over a packed Q6_K matrix (wrb unused) */
static void q6_rows(const char *P, size_t wrb, int64_t nsb, const kern_q8k_t *xq,
                    const kern_q8k16_t *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    (void)wrb;
    const x16_tok_t x = {.xq = xq, .xs = xs};
    x16_rows(DT_Q6_K, P, nsb, &x, T, y, ldy, o0, o1);
}

#define X16_NS_STACK 2048 /* Q8_0 block sums kept on the stack (>= KERN_Q8_STACK / 32) */

/* kern_b32_fn over a packed Q8_0 matrix (wrb unused): -128 times each token's block sums first
 * (exact integers), in one heap buffer, or on the stack in chunks of tokens when that is too
 * small and the allocation fails. */
static void q8_rows(const char *P, size_t wrb, int64_t nb, const int8_t *xq, const float *xd,
                    int T, float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    (void)wrb;
    const int64_t K = nb * QK8_0;
    int32_t stack[X16_NS_STACK];
    int32_t *ns = (int64_t)T * nb <= X16_NS_STACK ? stack
                                                  : malloc((size_t)T * (size_t)nb * sizeof *ns);
    const int chunk = ns ? T : (int)(X16_NS_STACK / nb);
    if (!ns) ns = stack;
    for (int t0 = 0; t0 < T; t0 += chunk) {
        const int n = T - t0 < chunk ? T - t0 : chunk;
        for (int t = 0; t < n; t++)
            for (int64_t b = 0; b < nb; b++) {
                const int8_t *q = xq + (int64_t)(t0 + t) * K + QK8_0 * b;
                int32_t sum = 0;
                for (int k = 0; k < QK8_0; k++) sum += q[k];
                ns[(int64_t)t * nb + b] = -128 * sum;
            }
        const x16_tok_t x = {.q8 = xq + (int64_t)t0 * K, .d8 = xd + (int64_t)t0 * nb, .ns = ns};
        x16_rows(DT_Q8_0, P, nb, &x, n, y + (int64_t)t0 * ldy, ldy, o0, o1);
    }
    if (ns != stack) free(ns);
}

int kern_kx16_matmul_vnni(int wtype, const void *P, int64_t K, const float *x, int64_t ldx,
                          float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    if (wtype == DT_Q4_K)
        return kern_q4k_matmul(q4_rows, kern_q8k_quantize_avx512, P, 0, K, x, ldx, y, ldy, T, o0,
                               o1);
    if (wtype == DT_Q5_K) /* the same int8 route as Q4_K (kernels.h) */
        return kern_q4k_matmul(q5_rows, kern_q8k_quantize_avx512, P, 0, K, x, ldx, y, ldy, T, o0,
                               o1);
    if (wtype == DT_IQ4_XS) /* Q4_K's int8 route (kernels.h) */
        return kern_q4k_matmul(iq4_rows, kern_q8k_quantize_avx512, P, 0, K, x, ldx, y, ldy, T, o0,
                               o1);
    if (wtype == DT_Q6_K)
        return kern_q23k_matmul(DT_Q6_K, q6_rows, P, 0, K, x, ldx, y, ldy, T, o0, o1);
    if (wtype == DT_Q8_0)
        return kern_b32_matmul(DT_Q8_0, q8_rows, kern_q8_quantize_avx512, P, 0, K, x, ldx, y, ldy,
                               T, o0, o1);
    if (wtype == DT_F16 && K > 0 && K % 32 == 0) {
        f16_rows(P, K, x, ldx, T, y, ldy, o0, o1);
        return 0;
    }
    return -1;
}

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif
