/* engine/cpu/qleg_avx2.c: the Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS int8 routes (qleg.h) for
 * AVX2 + FMA + F16C.
 *
 * 32-block types, per block (its 32 integer weights w in x's order: Q4_1 / Q5_1 q, unsigned;
 * Q5_0 q - 16 and IQ4_NL kv[q] (vpshufb of the nibbles in the 16-entry table), signed) and
 * token: 8 exact int32 lanes, lane l the sum of w_k * xq_k for k = 4l .. 4l+3 -- unsigned w by
 * vpmaddubsw of w and xq, signed w by vpmaddubsw of |w| and xq with w's sign (pairs:
 * |sum| <= 2 * 127 * 127, never saturate), then vpmaddwd with ones. acc = fma(float(lanes),
 * d * dx, acc) for the blocks in order; Q4_1 and Q5_1 also accm = fma(S, m * dx, accm) (one
 * lane; S the block's xq sum); y = hsum(acc) (+ accm), hsum: h[i] = acc[i] + acc[i+4],
 * p[i] = h[i] + h[i+2], p[0] + p[1].
 * IQ4_XS, per super-block and token: per sub-block j the same vpmaddubsw of |kv[q]| and the
 * signed xq, vpmaddwd with ls_j - 32 in every 16-bit lane, added over j: 8 exact int32 lanes
 * (|lane| <= 8 * 2 * 127 * 127 * 32 < 2^24: exact in F32); acc = fma(float(lanes), d * dx, acc)
 * for the super-blocks in order; y = hsum(acc).
 * Tiles: R rows x C tokens, each with its own accumulators: the per-element arithmetic does not
 * depend on the tile shape. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <string.h>

#include "engine/cpu/qleg.h"
#include "engine/cpu/simd_avx2_impl.h"

#define AI static inline __attribute__((always_inline))

#define QL_RMAX 4
#define QL_CMAX 4
#define QL_PANEL_BYTES (128 * 1024)
#define QL_PF_BYTES 16384 /* decode: prefetch distance for weights streamed from memory */

/* The 32 nibbles of 16 bytes in x's order: low nibbles, then high nibbles. */
AI __m256i ql_nibbles(const uint8_t *qs)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
}

/* 0x10 in byte i where bit i of the little-endian word at qh is set, else 0. */
AI __m256i ql_fifth_bits(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                         2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sel);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

AI __m256i ql_kvalues(void)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)dtype_iq4nl_values));
}

/* The 32 integer weights of a 32-block of type dt at bl (see the file comment). */
AI __m256i ql_w32(const int dt, const char *bl)
{
    switch (dt) {
    case DT_Q4_1: return ql_nibbles(((const block_q4_1 *)bl)->qs);
    case DT_Q5_0: {
        const block_q5_0 *b = (const block_q5_0 *)bl;
        __m256i q = _mm256_or_si256(ql_nibbles(b->qs), ql_fifth_bits(b->qh));
        return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    }
    case DT_Q5_1: {
        const block_q5_1 *b = (const block_q5_1 *)bl;
        return _mm256_or_si256(ql_nibbles(b->qs), ql_fifth_bits(b->qh));
    }
    default: return _mm256_shuffle_epi8(ql_kvalues(), ql_nibbles(((const block_iq4_nl *)bl)->qs));
    }
}

AI void qb32_tile(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t nb,
                  const int8_t *xq, const float *xd, const float *xs, float *y, int64_t ldy,
                  size_t pfd)
{
    const int64_t K = nb * 32;
    const size_t bs = dtype_block_bytes(dt);
    const int has_min = dt == DT_Q4_1 || dt == DT_Q5_1, is_signed = !has_min;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[QL_RMAX][QL_CMAX];
    __m128 accm[QL_RMAX][QL_CMAX];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            acc[r][c] = _mm256_setzero_ps();
            accm[r][c] = _mm_setzero_ps();
        }
    for (int64_t b = 0; b < nb; b++) {
        __m256i xv[QL_CMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            xv[c] = _mm256_loadu_si256((const __m256i *)(xq + c * K + 32 * b));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const char *bl = W + (size_t)r * wrb + (size_t)b * bs;
            if (pfd) kern_pf_stream(bl + pfd);
            const __m256i w = ql_w32(dt, bl);
            const __m256i aw = is_signed ? _mm256_abs_epi8(w) : w;
            uint32_t dm = 0; /* d (and m): halves 0 (and 1); x86 is little-endian */
            memcpy(&dm, bl, has_min ? 4 : 2);
            const __m128 dmf = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256i xs8 = is_signed ? _mm256_sign_epi8(xv[c], w) : xv[c];
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs8), ones);
                const __m128 dd = _mm_mul_ps(dmf, _mm_set1_ps(xd[c * nb + b])); /* d dx, m dx */
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(dd),
                                            acc[r][c]);
                if (has_min)
                    accm[r][c] = _mm_fmadd_ps(_mm_set1_ps(xs[c * nb + b]), dd, accm[r][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m128 s = _mm_set_ss(simd_hsum8(acc[r][c]));
            if (has_min) /* accm lane 1: the m terms */
                s = _mm_add_ss(s, _mm_shuffle_ps(accm[r][c], accm[r][c], 0x55));
            y[c * ldy + r] = _mm_cvtss_f32(s);
        }
}

/* Rows [ob, oe): tiles of R rows, then single rows. */
AI void qb32_pass(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t nb,
                  const int8_t *xq, const float *xd, const float *xs, float *y, int64_t ldy,
                  int64_t ob, int64_t oe, size_t pfd)
{
    int64_t o = ob;
    for (; o + R <= oe; o += R)
        qb32_tile(dt, R, C, W + (size_t)o * wrb, wrb, nb, xq, xd, xs, y + o, ldy, pfd);
    for (; o < oe; o++)
        qb32_tile(dt, 1, C, W + (size_t)o * wrb, wrb, nb, xq, xd, xs, y + o, ldy, pfd);
}

/* The one pass of a few tokens over rows [ob, oe) streamed from memory: tiles of R rows spread
 * over R runs (kernels_impl.h), then single rows. */
AI void qb32_stream(const int dt, const int R, const int C, const char *W, size_t wrb, int64_t nb,
                    const int8_t *xq, const float *xd, const float *xs, float *y, int64_t ldy,
                    int64_t ob, int64_t oe)
{
    const int64_t q = (oe - ob) / R;
    float t[KERN_SPREAD_MAX];
    for (int64_t i = 0; i < q; i++) {
        qb32_tile(dt, R, C, W + (size_t)(ob + i) * wrb, (size_t)q * wrb, nb, xq, xd, xs, t, R,
                  QL_PF_BYTES);
        kern_spread_store(t, R, C, y + ob + i, ldy, q);
    }
    for (int64_t o = ob + R * q; o < oe; o++)
        qb32_tile(dt, 1, C, W + (size_t)o * wrb, wrb, nb, xq, xd, xs, y + o, ldy, QL_PF_BYTES);
}

AI void qb32_rows(const int dt, const char *W, size_t wrb, int64_t nb, const int8_t *xq,
                  const float *xd, const float *xs, int T, float *y, int64_t ldy, int64_t o0,
                  int64_t o1)
{
    if (T == 1) { /* one pass streaming the rows from memory */
        qb32_stream(dt, 4, 1, W, wrb, nb, xq, xd, xs, y, ldy, o0, o1);
        return;
    }
    if (T == 2) {
        qb32_stream(dt, 4, 2, W, wrb, nb, xq, xd, xs, y, ldy, o0, o1);
        return;
    }
    /* panels of rows kept in L2 while every tile of tokens passes over them */
    const int64_t K = nb * 32;
    int64_t panel = (int64_t)(QL_PANEL_BYTES / wrb);
    panel = panel < 2 ? 2 : panel / 2 * 2;
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        int t = 0;
        for (; t + 3 <= T; t += 3)
            qb32_pass(dt, 2, 3, W, wrb, nb, xq + t * K, xd + t * nb, xs + t * nb, y + t * ldy, ldy,
                      ob, oe, t == 0 ? QL_PF_BYTES : 0);
        const int8_t *xt = xq + t * K;
        const float *xdt = xd + t * nb, *xst = xs + t * nb;
        float *yt = y + t * ldy;
        if (T - t == 1) qb32_pass(dt, 2, 1, W, wrb, nb, xt, xdt, xst, yt, ldy, ob, oe, 0);
        if (T - t == 2) qb32_pass(dt, 2, 2, W, wrb, nb, xt, xdt, xst, yt, ldy, ob, oe, 0);
    }
}

#define QB32_ROWS(NAME, DT)                                                                        \
    static void NAME(const char *W, size_t wrb, int64_t nb, const int8_t *xq, const float *xd,     \
                     const float *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)        \
    {                                                                                              \
        qb32_rows(DT, W, wrb, nb, xq, xd, xs, T, y, ldy, o0, o1);                                  \
    }
QB32_ROWS(q41_rows, DT_Q4_1)
QB32_ROWS(q50_rows, DT_Q5_0)
QB32_ROWS(q51_rows, DT_Q5_1)
QB32_ROWS(iq4nl_rows, DT_IQ4_NL)
#undef QB32_ROWS

/* ---- IQ4_XS ---- */

#define XS_TOK 4

/* One row against C tokens (token stride nsb super-blocks); y[c * ldy]. */
AI void iq4xs_tile(const int C, const block_iq4_xs *row, int64_t nsb, const kern_q8k_t *xq,
                   float *y, int64_t ldy, size_t pfd)
{
    const __m256i kv = ql_kvalues();
    __m256 acc[XS_TOK];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const block_iq4_xs *b = row + s;
        if (pfd) {
            kern_pf_stream((const char *)b + pfd);
            kern_pf_stream((const char *)b + pfd + 64);
            kern_pf_stream((const char *)b + pfd + 128);
        }
        __m256i isum[XS_TOK];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) isum[c] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < QK_K / 32; j++) {
            const __m256i w = _mm256_shuffle_epi8(kv, ql_nibbles(b->qs + 16 * j));
            const __m256i aw = _mm256_abs_epi8(w);
            const __m256i sc = _mm256_set1_epi16((short)(iq4xs_scale(b, j) - 32));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256i x8 = _mm256_loadu_si256((const __m256i *)(xq[c * nsb + s].q + 32 * j));
                const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x8, w));
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, sc));
            }
        }
        const float d = _cvtsh_ss(b->d);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m256 dd = _mm256_set1_ps(d * xq[c * nsb + s].d);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), dd, acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) y[c * ldy] = simd_hsum8(acc[c]);
}

static void iq4xs_rows(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T,
                       float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    int64_t panel = T <= XS_TOK ? o1 - o0 : (int64_t)(QL_PANEL_BYTES / wrb);
    if (panel < 1) panel = 1;
    for (int64_t ob = o0; ob < o1; ob += panel) {
        int64_t oe = o1 - ob < panel ? o1 : ob + panel;
        for (int t = 0; t < T; t += XS_TOK) {
            const kern_q8k_t *xt = xq + (int64_t)t * nsb;
            float *yt = y + (int64_t)t * ldy;
            const size_t pfd = t == 0 ? QL_PF_BYTES : 0;
            for (int64_t o = ob; o < oe; o++) {
                const block_iq4_xs *row = (const block_iq4_xs *)(W + (size_t)o * wrb);
                switch (T - t) {
                case 1: iq4xs_tile(1, row, nsb, xt, yt + o, ldy, pfd); break;
                case 2: iq4xs_tile(2, row, nsb, xt, yt + o, ldy, pfd); break;
                case 3: iq4xs_tile(3, row, nsb, xt, yt + o, ldy, pfd); break;
                default: iq4xs_tile(4, row, nsb, xt, yt + o, ldy, pfd); break;
                }
            }
        }
    }
}

/* The token quantisers are the portable ones (the same bits; a small part of the time). */
const kern_qleg_t kern_qleg_avx2 = {
    .q4_1 = q41_rows,
    .q5_0 = q50_rows,
    .q5_1 = q51_rows,
    .iq4_nl = iq4nl_rows,
    .iq4_xs = iq4xs_rows,
    .quant = kern_q8_quantize,
    .quant_k = kern_q8k_quantize,
};

#if defined(__clang__)
#pragma clang attribute pop
#endif
