/* engine/cpu/attention_avx512.c: AVX-512 attention tile (see attention.h). Called only when
 * the CPU has AVX-512F (dispatch in attention.c). Scores take any head dimension; the V sum is
 * register-blocked for head dimensions that are multiples of 16 up to 128, a plain loop
 * otherwise. K blocks are transposed 16 x 16 in registers (head dimensions that are multiples
 * of 16) and F16 V rows are widened inside the register-blocked sum rather than staged: the
 * values are exact either way, so neither changes a result. */
#if defined(__x86_64__)
#ifndef __clang__
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "engine/cpu/attention.h"

#define MAXV 8 /* hd / 16 at most for the register-blocked V sum */

/* Block rows [0, cnt) as F32 with stride hd: converted into stage (F16) or in place (F32). */
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
        int e = 0;
        for (; e + 16 <= hd; e += 16)
            _mm512_storeu_ps(dst + e, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + e))));
        for (; e < hd; e++) dst[e] = _cvtsh_ss(h[e]);
    }
    *stride = (size_t)hd;
    return a->stage;
}

/* exp(x) for x <= 0 (softmax arguments): 2^n * p(r) with x = n ln2 + r, |r| <= ln2/2, and a
 * degree-6 polynomial (relative error about 2e-7); below -87 the result is 0. */
static inline __m512 exp_neg(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.0f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512 e = _mm512_scalef_ps(p, n);
    return _mm512_maskz_mov_ps((__mmask16)~under, e);
}

/* r[0..15] (rows) transposed in place: afterwards r[c] holds element c of every input row. */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);     /* per 128-bit lane: a0 b0 a1 b1 */
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 */
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);     /* a0 b0 c0 d0 */
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee); /* a1 b1 c1 d1 */
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    /* u[4g + k], lane L: element 4L + k of rows 4g .. 4g+3 */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512 a = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);      /* lanes: 0 of g0, 2 of g0, 0 of g1, 2 of g1 */
        __m512 b = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);      /* 1, 3 of g0; 1, 3 of g1 */
        __m512 c = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
        __m512 d = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
        r[k] = _mm512_shuffle_f32x4(a, c, 0x88);      /* lane 0 of g0..g3: element k */
        r[8 + k] = _mm512_shuffle_f32x4(a, c, 0xdd);  /* lane 2: element 8 + k */
        r[4 + k] = _mm512_shuffle_f32x4(b, d, 0x88);  /* lane 1: element 4 + k */
        r[12 + k] = _mm512_shuffle_f32x4(b, d, 0xdd); /* lane 3: element 12 + k */
    }
}

/* K rows [0, cnt) of a block transposed into kt[e][ldk] (ldk a multiple of 16, zero padded).
 * Values are exact copies (F16 widened exactly), so any method gives the same bits. */
static void stage_kt(const attn_args_t *a, int blk, int cnt, float *kt, int ldk)
{
    const unsigned char *p = a->kv + (size_t)blk * a->block_bytes + a->k_off;
    const int hd = a->hd;
    if (hd % 16 == 0) {
        for (int i0 = 0; i0 < ldk; i0 += 16)
            for (int e0 = 0; e0 < hd; e0 += 16) {
                __m512 r[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) {
                    const unsigned char *row = p + (size_t)(i0 + i) * a->row_stride;
                    if (i0 + i >= cnt) r[i] = _mm512_setzero_ps();
                    else if (a->kv_f16)
                        r[i] = _mm512_cvtph_ps(
                            _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + e0)));
                    else
                        r[i] = _mm512_loadu_ps((const float *)row + e0);
                }
                transpose16(r);
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) _mm512_storeu_ps(kt + (size_t)(e0 + c) * ldk + i0, r[c]);
            }
        return;
    }
    for (int i = 0; i < ldk; i++) {
        if (i >= cnt) {
            for (int e = 0; e < hd; e++) kt[(size_t)e * ldk + i] = 0;
            continue;
        }
        const unsigned char *r = p + (size_t)i * a->row_stride;
        if (a->kv_f16) {
            const uint16_t *h = (const uint16_t *)r;
            for (int e = 0; e < hd; e++) kt[(size_t)e * ldk + i] = _cvtsh_ss(h[e]);
        } else {
            const float *f = (const float *)r;
            for (int e = 0; e < hd; e++) kt[(size_t)e * ldk + i] = f[e];
        }
    }
}

/* Scores of G queries (G <= 8, any positions, m keys valid for each) against 16 transposed
 * keys at column i0: one accumulator per query, summed over e in order (the same sequence for
 * G = 1..8; several queries at once only give independent FMA chains). */
static inline __attribute__((always_inline)) void score_group(const attn_args_t *a, int qi, int G,
                                                              int ldk, int i0, int j0, int m)
{
    __m512 acc[8];
    const float *q[8];
    #pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        acc[g] = _mm512_setzero_ps();
        q[g] = a->q[qi + g];
    }
    const float *kt = a->stage + i0;
    for (int e = 0; e < a->hd; e++) {
        __m512 k = _mm512_loadu_ps(kt + (size_t)e * ldk);
        #pragma GCC unroll 8
        for (int g = 0; g < G; g++) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g][e]), k, acc[g]);
    }
    #pragma GCC unroll 8
    for (int g = 0; g < G; g++)
        _mm512_mask_storeu_ps(a->scores + (size_t)(qi + g) * a->n_ctx + j0 + i0, (__mmask16)((1u << m) - 1),
                              _mm512_mul_ps(acc[g], _mm512_set1_ps(a->scale)));
}

/* out[q] += sum_i p[q][i] * V[i] for G queries (same position), NV vectors per row, rows in
 * ascending order: per query the same FMA sequence whatever G. */
static inline __attribute__((always_inline)) void vacc_group(const attn_args_t *a, int qi, int G, int NV,
                                                             const float *V, size_t st, int j0, int lim,
                                                             const uint16_t *Vh, size_t sth)
{
    __m512 acc[4][8];
    const float *p[4];
    #pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        p[g] = a->scores + (size_t)(qi + g) * a->n_ctx + j0;
        #pragma GCC unroll 8
        for (int v = 0; v < NV; v++) acc[g][v] = _mm512_loadu_ps(a->out[qi + g] + 16 * v);
    }
    for (int i = 0; i < lim; i++) {
        #pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            /* F16 V (Vh != NULL) widened here: the same exact values block_rows would stage */
            __m512 x = Vh ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(Vh + (size_t)i * sth + 16 * v)))
                          : _mm512_loadu_ps(V + (size_t)i * st + 16 * v);
            #pragma GCC unroll 8
            for (int g = 0; g < G; g++) acc[g][v] = _mm512_fmadd_ps(_mm512_set1_ps(p[g][i]), x, acc[g][v]);
        }
    }
    #pragma GCC unroll 8
    for (int g = 0; g < G; g++)
        #pragma GCC unroll 8
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(a->out[qi + g] + 16 * v, acc[g][v]);
}

void attn_tile_avx512(const attn_args_t *a)
{
    const int B = a->block_tokens, hd = a->hd, nv = hd / 16;
    const int fast = hd % 16 == 0 && nv <= MAXV;
    const int ldk = (B + 15) / 16 * 16;
    size_t st = 0;
    /* Scores: 16 keys at a time for up to 8 queries, sum over e in order (no horizontal
     * reductions). The stage buffer holds the transposed K block: [hd][ldk]. */
    const int jb = attn_first_block_pos(a);
    attn_prefetch(a, jb, jb + ATTN_PF_ROWS);
    for (int j0 = jb; j0 < a->n_ctx; j0 += B) {
        int cnt = a->n_ctx - j0 < B ? a->n_ctx - j0 : B;
        attn_prefetch(a, j0 + ATTN_PF_ROWS, j0 + B + ATTN_PF_ROWS);
        stage_kt(a, a->blocks[j0 / B], cnt, a->stage, ldk);
        for (int qi = 0; qi < a->nq;) {
            /* up to 8 queries that see the same keys of this block (all of it, for the
             * queries of a prefill past it), whatever their positions */
            int lim = a->qpos[qi] + 1 - j0;
            if (lim > cnt) lim = cnt;
            int G = 1;
            while (G < 8 && qi + G < a->nq &&
                   (a->qpos[qi + G] + 1 - j0 < cnt ? a->qpos[qi + G] + 1 - j0 : cnt) == lim)
                G++;
            for (int i0 = 0; i0 < lim; i0 += 16) {
                int m = lim - i0 < 16 ? lim - i0 : 16;
                switch (G) {
                case 8: score_group(a, qi, 8, ldk, i0, j0, m); break;
                case 7: score_group(a, qi, 7, ldk, i0, j0, m); break;
                case 6: score_group(a, qi, 6, ldk, i0, j0, m); break;
                case 5: score_group(a, qi, 5, ldk, i0, j0, m); break;
                case 4: score_group(a, qi, 4, ldk, i0, j0, m); break;
                case 3: score_group(a, qi, 3, ldk, i0, j0, m); break;
                case 2: score_group(a, qi, 2, ldk, i0, j0, m); break;
                default: score_group(a, qi, 1, ldk, i0, j0, m); break;
                }
            }
            qi += G;
        }
    }
    /* Softmax over [first key, qpos] in 16-wide chunks; the same order for a query whatever its tile. */
    for (int qi = 0; qi < a->nq; qi++) {
        float *sc = a->scores + (size_t)qi * a->n_ctx;
        int n = a->qpos[qi] + 1;
        const int lo = attn_prepare_scores(a, qi, jb, sc);
        __m512 vmx = _mm512_set1_ps(-INFINITY);
        for (int j = lo; j < n; j += 16) {
            __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
            vmx = _mm512_mask_max_ps(vmx, m, vmx, _mm512_maskz_loadu_ps(m, sc + j));
        }
        __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
        __m512 vs = _mm512_setzero_ps();
        for (int j = lo; j < n; j += 16) {
            __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
            __m512 ev = exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + j), mx));
            ev = _mm512_maskz_mov_ps(m, ev);
            _mm512_mask_storeu_ps(sc + j, m, ev);
            vs = _mm512_add_ps(vs, ev);
        }
        __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vs));
        for (int j = lo; j < n; j += 16) {
            __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
            _mm512_mask_storeu_ps(sc + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sc + j), inv));
        }
        memset(a->out[qi], 0, (size_t)hd * sizeof(float));
    }
    for (int j0 = jb; j0 < a->n_ctx; j0 += B) {
        int cnt = a->n_ctx - j0 < B ? a->n_ctx - j0 : B;
        attn_prefetch(a, a->n_ctx + j0 + ATTN_PF_ROWS, a->n_ctx + j0 + B + ATTN_PF_ROWS);
        /* F16 V with the register-blocked sum: read in place; otherwise staged as F32 */
        const uint16_t *Vh = NULL;
        size_t sth = 0;
        const float *V = NULL;
        if (fast && a->kv_f16 && (nv == 1 || nv == 2 || nv == 4 || nv == 8)) {
            Vh = (const uint16_t *)(a->kv + (size_t)a->blocks[j0 / B] * a->block_bytes + a->v_off);
            sth = a->row_stride / sizeof(uint16_t);
        } else {
            V = block_rows(a, a->blocks[j0 / B], a->v_off, cnt, &st);
        }
        for (int qi = 0; qi < a->nq;) {
            int G = attn_same_pos_run(a, qi, nv > 4 ? 2 : 4);
            int lim = a->qpos[qi] + 1 - j0;
            if (lim > cnt) lim = cnt;
            if (lim > 0) {
                if (!fast) {
                    for (int g = 0; g < G; g++) {
                        const float *p = a->scores + (size_t)(qi + g) * a->n_ctx + j0;
                        float *o = a->out[qi + g];
                        for (int i = 0; i < lim; i++)
                            for (int e = 0; e < hd; e++) o[e] = fmaf(p[i], V[(size_t)i * st + e], o[e]);
                    }
                } else {
#define VACC(NV)                                                                   \
    switch (G) {                                                                   \
    case 4: vacc_group(a, qi, 4, NV, V, st, j0, lim, Vh, sth); break;              \
    case 3: vacc_group(a, qi, 3, NV, V, st, j0, lim, Vh, sth); break;              \
    case 2: vacc_group(a, qi, 2, NV, V, st, j0, lim, Vh, sth); break;              \
    default: vacc_group(a, qi, 1, NV, V, st, j0, lim, Vh, sth); break;             \
    }
                    switch (nv) {
                    case 1: VACC(1) break;
                    case 2: VACC(2) break;
                    case 4: VACC(4) break;
                    case 8: VACC(8) break;
                    default: /* head dimension 48, 80, 96 or 112: plain loop */
                        for (int g = 0; g < G; g++) {
                            const float *p = a->scores + (size_t)(qi + g) * a->n_ctx + j0;
                            float *o = a->out[qi + g];
                            for (int i = 0; i < lim; i++)
                                for (int e = 0; e < hd; e++) o[e] = fmaf(p[i], V[(size_t)i * st + e], o[e]);
                        }
                        break;
                    }
#undef VACC
                }
            }
            qi += G;
        }
    }
}
#endif
