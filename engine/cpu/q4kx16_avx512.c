/* engine/cpu/q4kx16_avx512.c: packed Q4_K x int8 (kernels.h "Packed Q4_K"; the layout in
 * kernels_impl.h) for AVX-512 (F, BW, VL, DQ) + AVX512-VNNI + FMA + F16C. Called only through
 * the avx512-vnni table, which kern_get returns only where the CPU has all of them.
 *
 * Per super-block of a group of 16 rows (row r in 32-bit lane r) and per token: for each 64-byte
 * line of quants (4 quant bytes of every row), the low nibbles (sub-block 2c of chunk c) and the
 * high nibbles (sub-block 2c + 1) go through vpdpbusd against 4 of the token's xq broadcast, into
 * one int32 accumulator per sub-block and token (|P| <= 32 * 15 * 127); after the chunk's 8
 * lines, isum += P * sc (vpmulld, sc the rows' 6-bit scales). The mins term is vpdpwssd of the
 * rows' (m_2p, m_2p+1) pairs with the token's bsum pairs. Then, per row lane,
 * acc = fma(float(isum), d * dx, acc) and accm = fma(float(msum), dmin * dx, accm); y = acc -
 * accm. Each (row, token) has its own lane and accumulators and the same operations whatever the
 * tile, so the route is batch invariant. */
#if defined(__x86_64__) && defined(__GNUC__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <string.h>

#include "engine/cpu/kernels_impl.h"

#define AI static inline __attribute__((always_inline))

#ifndef X16_TOK
#define X16_TOK 8 /* tokens per tile */
#endif
#define X16_PF_BYTES 16384            /* prefetch distance when streaming */
#define X16_PANEL_BYTES (192 * 1024)  /* groups kept in L2 while every token tile passes them */

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

/* Group G (nsb super-blocks of KERN_Q4KX16_SB_BYTES) against C tokens of xq (token stride nsb);
 * y[c * ldy + r] for the rows r in keep. pfd: prefetch distance (0: none). */
AI void x16_tile(const int C, const unsigned char *G, int64_t nsb, const kern_q8k_t *xq, float *y,
                 int64_t ldy, __mmask16 keep, size_t pfd)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i m6 = _mm512_set1_epi8(0x3f);
    const __m512i m2 = _mm512_set1_epi8(0x03);
    const __m512i mb = _mm512_set1_epi32(0xff);
    __m512 acc[X16_TOK], accm[X16_TOK];
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) acc[c] = accm[c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const unsigned char *B = G + (size_t)s * KERN_Q4KX16_SB_BYTES;
        if (pfd)
            for (int l = 0; l < KERN_Q4KX16_SB_BYTES / 64; l++) kern_pf_stream(B + pfd + 64 * l);
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
        /* the mins as int16 pairs (m_2p, m_2p+1) per lane */
        const __m512i pair_lo = lane_ctl(0, -1, 1, -1), pair_hi = lane_ctl(2, -1, 3, -1);
        const __m512i M0 = _mm512_shuffle_epi8(v2, pair_lo), M1 = _mm512_shuffle_epi8(v2, pair_hi);
        const __m512i M2 = _mm512_shuffle_epi8(v3, pair_lo), M3 = _mm512_shuffle_epi8(v3, pair_hi);
        __m512i isum[X16_TOK];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) isum[c] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int ch = 0; ch < 4; ch++) {
            __m512i plo[X16_TOK], phi[X16_TOK];
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) plo[c] = phi[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++) {
                const __m512i V = _mm512_loadu_si512(B + 256 + 64 * (8 * ch + m));
                const __m512i lo = _mm512_and_si512(V, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(V, 4), m4);
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
        const __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)B));
        const __m512 DM = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(B + 32)));
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const kern_q8k_t *xb = xq + c * nsb + s;
            __m512i mi = _mm512_dpwssd_epi32(_mm512_setzero_si512(), M0, bcast4(xb->bsum));
            mi = _mm512_dpwssd_epi32(mi, M1, bcast4(xb->bsum + 2));
            mi = _mm512_dpwssd_epi32(mi, M2, bcast4(xb->bsum + 4));
            mi = _mm512_dpwssd_epi32(mi, M3, bcast4(xb->bsum + 6));
            const __m512 dx = _mm512_set1_ps(xb->d);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(D, dx), acc[c]);
            accm[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mi), _mm512_mul_ps(DM, dx), accm[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        _mm512_mask_storeu_ps(y + c * ldy, keep, _mm512_sub_ps(acc[c], accm[c]));
}

/* The first X16_PF_BYTES of n bytes about to be streamed (the tiles prefetch that far ahead). */
static void x16_head(const unsigned char *p, size_t n)
{
    if (n > X16_PF_BYTES) n = X16_PF_BYTES;
    for (size_t i = 0; i < n; i += 64) kern_pf_stream(p + i);
}

/* kern_q4k_fn over the packed matrix P (wrb unused): groups in panels kept in L2 while every
 * tile of tokens passes over them; with few tokens, one streamed pass prefetching ahead. */
static void x16_rows(const char *P, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T, float *y,
                     int64_t ldy, int64_t o0, int64_t o1)
{
    (void)wrb;
    const size_t gb = (size_t)nsb * KERN_Q4KX16_SB_BYTES;
    const unsigned char *base = (const unsigned char *)P;
    const int64_t g0 = o0 / KERN_Q4KX16_ROWS, g1 = (o1 + KERN_Q4KX16_ROWS - 1) / KERN_Q4KX16_ROWS;
    int64_t panel = T <= X16_TOK ? g1 - g0 : (int64_t)(X16_PANEL_BYTES / gb);
    if (panel < 1) panel = 1;
    if (T <= X16_TOK) x16_head(base + (size_t)g0 * gb, (size_t)(g1 - g0) * gb);
    for (int64_t gb0 = g0; gb0 < g1; gb0 += panel) {
        const int64_t ge = g1 - gb0 < panel ? g1 : gb0 + panel;
        for (int t = 0; t < T; t += X16_TOK) {
            const kern_q8k_t *xt = xq + (int64_t)t * nsb;
            const size_t pfd = t == 0 ? X16_PF_BYTES : 0;
            for (int64_t g = gb0; g < ge; g++) {
                const int64_t r0 = g * KERN_Q4KX16_ROWS;
                const int64_t lo = o0 > r0 ? o0 - r0 : 0;
                const int64_t hi = o1 - r0 < KERN_Q4KX16_ROWS ? o1 - r0 : KERN_Q4KX16_ROWS;
                const __mmask16 keep = (__mmask16)((0xffffu >> (16 - (hi - lo))) << lo);
                const unsigned char *G = base + (size_t)g * gb;
                float *yt = y + (int64_t)t * ldy + r0;
                switch (T - t) {
                case 1: x16_tile(1, G, nsb, xt, yt, ldy, keep, pfd); break;
                case 2: x16_tile(2, G, nsb, xt, yt, ldy, keep, pfd); break;
                case 3: x16_tile(3, G, nsb, xt, yt, ldy, keep, pfd); break;
                case 4: x16_tile(4, G, nsb, xt, yt, ldy, keep, pfd); break;
#if X16_TOK > 4
                case 5: x16_tile(5, G, nsb, xt, yt, ldy, keep, pfd); break;
                case 6: x16_tile(6, G, nsb, xt, yt, ldy, keep, pfd); break;
                case 7: x16_tile(7, G, nsb, xt, yt, ldy, keep, pfd); break;
#endif
                default: x16_tile(X16_TOK, G, nsb, xt, yt, ldy, keep, pfd); break;
                }
            }
        }
    }
}

int kern_q4kx16_matmul_vnni(int wtype, const void *P, int64_t K, const float *x, int64_t ldx,
                            float *y, int64_t ldy, int T, int64_t o0, int64_t o1)
{
    if (wtype != DT_Q4_K) return -1;
    return kern_q4k_matmul(x16_rows, kern_q8k_quantize_avx512, P, 0, K, x, ldx, y, ldy, T, o0, o1);
}

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif
