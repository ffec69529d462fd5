/* engine/cpu/attention_avx2.c: AVX2 + FMA + F16C attention tile (see attention.h). Called only
 * when the AVX2 kernels are chosen (dispatch in attention.c). The same structure as the AVX-512
 * tile, 8 lanes wide: K blocks transposed 8 x 8 in registers (head dimensions that are multiples
 * of 8) so that scores are summed over e in order without horizontal reductions, up to 4 chunks
 * of 8 keys per pass (one query's chain of FMAs alone would wait on their latency); the softmax in
 * 8-wide chunks; the V sum register-blocked over up to 64 output elements at a time, F16 V rows
 * widened in registers. Every output element gets the same sequence of operations whatever the
 * other queries of the tile (batch invariance). */
#if defined(__x86_64__)
#ifndef __clang__
#pragma GCC target("avx2,fma,f16c")
#endif
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "engine/cpu/attention.h"
#include "engine/cpu/simd_avx2_impl.h"

#define AI static inline __attribute__((always_inline))

/* Lanes [0, n) set (n <= 8). */
AI __m256i tail_mask(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AI float hmax8(__m256 v)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* exp(x) for x <= 0 (softmax arguments): 2^n * p(r), x = n ln2 + r, the polynomial of the
 * AVX-512 tile; 2^n built in the exponent field (n >= -126 after the clamp at -87, so it is a
 * normal number and the product is exact scaling); below -87 the result is 0. */
AI __m256 exp_neg(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* r[0..7] (rows) transposed in place: afterwards r[c] holds element c of every input row. */
AI void transpose8(__m256 r[8])
{
    __m256 t[8], s[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* per 128-bit lane: a0 b0 a1 b1 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 */
    }
    for (int i = 0; i < 8; i += 4) {
        s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);     /* a0 b0 c0 d0 (and a4.. high) */
        s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee); /* a1 b1 c1 d1 */
        s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x20);
        r[4 + k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x31);
    }
}

AI __m256 load_row8(const attn_args_t *a, const unsigned char *row, int e0)
{
    if (a->kv_f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + e0)));
    return _mm256_loadu_ps((const float *)row + e0);
}

static float f16_to_f32(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* K rows [0, cnt) of a block transposed into kt[e][ldk] (ldk a multiple of 8, zero padded).
 * Values are exact copies (F16 widened exactly). */
static void stage_kt(const attn_args_t *a, int blk, int cnt, float *kt, int ldk)
{
    const unsigned char *p = a->kv + (size_t)blk * a->block_bytes + a->k_off;
    const int hd = a->hd;
    if (hd % 8 == 0) {
        for (int i0 = 0; i0 < ldk; i0 += 8)
            for (int e0 = 0; e0 < hd; e0 += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++)
                    r[i] = i0 + i < cnt ? load_row8(a, p + (size_t)(i0 + i) * a->row_stride, e0)
                                        : _mm256_setzero_ps();
                transpose8(r);
                for (int c = 0; c < 8; c++) _mm256_storeu_ps(kt + (size_t)(e0 + c) * ldk + i0, r[c]);
            }
        return;
    }
    for (int i = 0; i < ldk; i++) {
        const unsigned char *r = p + (size_t)i * a->row_stride;
        for (int e = 0; e < hd; e++)
            kt[(size_t)e * ldk + i] = i >= cnt ? 0.0f
                                      : a->kv_f16 ? f16_to_f32(((const uint16_t *)r)[e])
                                                  : ((const float *)r)[e];
    }
}

/* Block rows [0, cnt) as F32 with stride *stride: widened into stage (F16) or in place (F32). */
static const float *block_rows(const attn_args_t *a, int blk, size_t off, int cnt, size_t *stride)
{
    const unsigned char *p = a->kv + (size_t)blk * a->block_bytes + off;
    if (!a->kv_f16) {
        *stride = a->row_stride / sizeof(float);
        return (const float *)p;
    }
    const int hd = a->hd;
    for (int i = 0; i < cnt; i++) {
        const uint16_t *h = (const uint16_t *)(p + (size_t)i * a->row_stride);
        float *dst = a->stage + (size_t)i * hd;
        for (int e = 0; e < hd; e++) dst[e] = f16_to_f32(h[e]);
    }
    *stride = (size_t)hd;
    return a->stage;
}

/* Scores of G queries (same position) against NI chunks of 8 transposed keys from column i0
 * (lim - i0 of them valid): one accumulator per query and chunk, each summed over e in order
 * (the same sequence for any G and NI; several chunks at once only hide the FMA latency). */
AI void score_group(const attn_args_t *a, int qi, int G, int NI, int ldk, int i0, int j0, int lim)
{
    __m256 acc[4][4];
    const float *q[4];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        q[g] = a->q[qi + g];
#pragma GCC unroll 4
        for (int n = 0; n < NI; n++) acc[g][n] = _mm256_setzero_ps();
    }
    const float *kt = a->stage + i0;
    for (int e = 0; e < a->hd; e++) {
        __m256 k[4];
#pragma GCC unroll 4
        for (int n = 0; n < NI; n++) k[n] = _mm256_loadu_ps(kt + (size_t)e * ldk + 8 * n);
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            __m256 qe = _mm256_set1_ps(q[g][e]);
#pragma GCC unroll 4
            for (int n = 0; n < NI; n++) acc[g][n] = _mm256_fmadd_ps(qe, k[n], acc[g][n]);
        }
    }
#pragma GCC unroll 4
    for (int n = 0; n < NI; n++) {
        const __m256i mask = tail_mask(lim - i0 - 8 * n);
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            _mm256_maskstore_ps(a->scores + (size_t)(qi + g) * a->n_ctx + j0 + i0 + 8 * n, mask,
                                _mm256_mul_ps(acc[g][n], _mm256_set1_ps(a->scale)));
    }
}

/* out[q][e0 .. e0 + 8 NV) += sum_i p[q][i] * V[i][e0 ..] for G queries (same position), rows in
 * ascending order: per output element the same FMA sequence whatever G, NV or e0. */
AI void vacc_group(const attn_args_t *a, int qi, int G, int NV, int e0, const float *V, size_t st,
                   const uint16_t *Vh, size_t sth, int j0, int lim)
{
    __m256 acc[4][8];
    const float *p[4];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        p[g] = a->scores + (size_t)(qi + g) * a->n_ctx + j0;
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) acc[g][v] = _mm256_loadu_ps(a->out[qi + g] + e0 + 8 * v);
    }
    for (int i = 0; i < lim; i++) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            __m256 x = Vh ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(Vh + (size_t)i * sth + e0 + 8 * v)))
                          : _mm256_loadu_ps(V + (size_t)i * st + e0 + 8 * v);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) acc[g][v] = _mm256_fmadd_ps(_mm256_set1_ps(p[g][i]), x, acc[g][v]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(a->out[qi + g] + e0 + 8 * v, acc[g][v]);
}

/* V sum of queries [qi, qi + G) over rows [0, lim) of one block, 64 output elements (NV 8) at a
 * time, G capped so that accumulators fit the 16 registers. */
static void vacc_rows(const attn_args_t *a, int qi, int G, const float *V, size_t st,
                      const uint16_t *Vh, size_t sth, int j0, int lim)
{
    const int hd = a->hd;
    for (int e0 = 0; e0 < hd; e0 += 64) {
        int nv = (hd - e0) / 8 < 8 ? (hd - e0) / 8 : 8;
        int gmax = nv > 4 ? 1 : nv > 2 ? 2 : 4;
        for (int g0 = 0; g0 < G; g0 += gmax) {
            int gn = G - g0 < gmax ? G - g0 : gmax;
#define VACC(NV)                                                                           \
    switch (gn) {                                                                          \
    case 4: vacc_group(a, qi + g0, 4, NV, e0, V, st, Vh, sth, j0, lim); break;             \
    case 3: vacc_group(a, qi + g0, 3, NV, e0, V, st, Vh, sth, j0, lim); break;             \
    case 2: vacc_group(a, qi + g0, 2, NV, e0, V, st, Vh, sth, j0, lim); break;             \
    default: vacc_group(a, qi + g0, 1, NV, e0, V, st, Vh, sth, j0, lim); break;            \
    }
            switch (nv) {
            case 1: VACC(1) break;
            case 2: VACC(2) break;
            case 3: VACC(3) break;
            case 4: VACC(4) break;
            case 5: VACC(5) break;
            case 6: VACC(6) break;
            case 7: VACC(7) break;
            default: VACC(8) break;
            }
#undef VACC
        }
    }
}

void attn_tile_avx2(const attn_args_t *a)
{
    const int B = a->block_tokens, hd = a->hd;
    const int fast = hd % 8 == 0;
    const int ldk = (B + 7) / 8 * 8;
    /* Scores: 8 keys at a time, summed over e in order. stage holds the transposed K block
     * [hd][ldk] (attention.h sizes it hd x B rounded up to 16). */
    const int jb = attn_first_block_pos(a);
    attn_prefetch(a, jb, jb + ATTN_PF_ROWS);
    for (int j0 = jb; j0 < a->n_ctx; j0 += B) {
        int cnt = a->n_ctx - j0 < B ? a->n_ctx - j0 : B;
        attn_prefetch(a, j0 + ATTN_PF_ROWS, j0 + B + ATTN_PF_ROWS);
        stage_kt(a, a->blocks[j0 / B], cnt, a->stage, ldk);
        for (int qi = 0; qi < a->nq;) {
            int G = attn_same_pos_run(a, qi, 4);
            int lim = a->qpos[qi] + 1 - j0;
            if (lim > cnt) lim = cnt;
            /* up to 4 chunks of 8 keys at once for 1-2 queries, 2 for 3-4 (<= 8 accumulators) */
            for (int i0 = 0; i0 < lim;) {
                int left = (lim - i0 + 7) / 8, ni = G <= 2 ? (left < 4 ? left : 4) : (left < 2 ? left : 2);
                switch (G * 8 + ni) {
                case 4 * 8 + 2: score_group(a, qi, 4, 2, ldk, i0, j0, lim); break;
                case 4 * 8 + 1: score_group(a, qi, 4, 1, ldk, i0, j0, lim); break;
                case 3 * 8 + 2: score_group(a, qi, 3, 2, ldk, i0, j0, lim); break;
                case 3 * 8 + 1: score_group(a, qi, 3, 1, ldk, i0, j0, lim); break;
                case 2 * 8 + 4: score_group(a, qi, 2, 4, ldk, i0, j0, lim); break;
                case 2 * 8 + 3: score_group(a, qi, 2, 3, ldk, i0, j0, lim); break;
                case 2 * 8 + 2: score_group(a, qi, 2, 2, ldk, i0, j0, lim); break;
                case 2 * 8 + 1: score_group(a, qi, 2, 1, ldk, i0, j0, lim); break;
                case 1 * 8 + 4: score_group(a, qi, 1, 4, ldk, i0, j0, lim); break;
                case 1 * 8 + 3: score_group(a, qi, 1, 3, ldk, i0, j0, lim); break;
                case 1 * 8 + 2: score_group(a, qi, 1, 2, ldk, i0, j0, lim); break;
                default: score_group(a, qi, 1, 1, ldk, i0, j0, lim); break;
                }
                i0 += 8 * ni;
            }
            qi += G;
        }
    }
    /* Softmax over [first key, qpos] in 8-wide chunks; the same order for a query whatever its tile. */
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int qi = 0; qi < a->nq; qi++) {
        float *sc = a->scores + (size_t)qi * a->n_ctx;
        int n = a->qpos[qi] + 1;
        const int lo = attn_prepare_scores(a, qi, jb, sc);
        __m256 vmx = ninf;
        for (int j = lo; j < n; j += 8) {
            __m256i m = tail_mask(n - j);
            __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(sc + j, m), _mm256_castsi256_ps(m));
            vmx = _mm256_max_ps(vmx, v);
        }
        __m256 mx = _mm256_set1_ps(hmax8(vmx));
        __m256 vs = _mm256_setzero_ps();
        for (int j = lo; j < n; j += 8) {
            __m256i m = tail_mask(n - j);
            __m256 ev = exp_neg(_mm256_sub_ps(_mm256_maskload_ps(sc + j, m), mx));
            ev = _mm256_and_ps(ev, _mm256_castsi256_ps(m));
            _mm256_maskstore_ps(sc + j, m, ev);
            vs = _mm256_add_ps(vs, ev);
        }
        __m256 inv = _mm256_set1_ps(1.0f / simd_hsum8(vs));
        for (int j = lo; j < n; j += 8) {
            __m256i m = tail_mask(n - j);
            _mm256_maskstore_ps(sc + j, m, _mm256_mul_ps(_mm256_maskload_ps(sc + j, m), inv));
        }
        memset(a->out[qi], 0, (size_t)hd * sizeof(float));
    }
    for (int j0 = jb; j0 < a->n_ctx; j0 += B) {
        int cnt = a->n_ctx - j0 < B ? a->n_ctx - j0 : B;
        attn_prefetch(a, a->n_ctx + j0 + ATTN_PF_ROWS, a->n_ctx + j0 + B + ATTN_PF_ROWS);
        /* F16 V with the register-blocked sum: read in place; otherwise staged as F32 */
        const uint16_t *Vh = NULL;
        size_t sth = 0, st = 0;
        const float *V = NULL;
        if (fast && a->kv_f16) {
            Vh = (const uint16_t *)(a->kv + (size_t)a->blocks[j0 / B] * a->block_bytes + a->v_off);
            sth = a->row_stride / sizeof(uint16_t);
        } else {
            V = block_rows(a, a->blocks[j0 / B], a->v_off, cnt, &st);
        }
        for (int qi = 0; qi < a->nq;) {
            int G = attn_same_pos_run(a, qi, 4);
            int lim = a->qpos[qi] + 1 - j0;
            if (lim > cnt) lim = cnt;
            if (lim > 0) {
                if (fast) {
                    vacc_rows(a, qi, G, V, st, Vh, sth, j0, lim);
                } else {
                    for (int g = 0; g < G; g++) {
                        const float *p = a->scores + (size_t)(qi + g) * a->n_ctx + j0;
                        float *o = a->out[qi + g];
                        for (int i = 0; i < lim; i++)
                            for (int e = 0; e < hd; e++) o[e] = fmaf(p[i], V[(size_t)i * st + e], o[e]);
                    }
                }
            }
            qi += G;
        }
    }
}
#endif
