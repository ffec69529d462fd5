/* tools/mkmodel.c: synthetic Llama-family GGUF models (see mkmodel.h).
 *
 * Weights: element j of row r of tensor T is mean + std * n, where n is an approximately
 * standard normal number (sum of four 16-bit uniforms, centred and scaled to unit variance)
 * drawn from a splitmix64 stream seeded by (seed, FNV-1a of T's name, r). Matrices of input
 * size `in` get std 1/sqrt(in) (so a matmul keeps the activation scale), token_embd std 0.02,
 * RMSNorm weights 1 + 0.05 n (also qwen3moe's Q/K norms), qwen2 / qwen2moe biases std 0.02, MoE
 * routers std 1/sqrt(dim); a 3-D expert tensor's rows are numbered expert by expert. Rows are generated on demand by the
 * writer's fill callback and converted to the file dtype there (Q8_0: per 32-block scale
 * d = amax / 127 stored as fp16, q = round-to-nearest(x / d)).
 *
 * Tokenizer: SPM ("llama") vocabulary: <unk> (type 2 UNKNOWN), <s>, </s> (3 CONTROL), the 256
 * byte tokens <0x00>..<0xFF> (6 BYTE), then NORMAL pieces: "▁", single characters, "▁"+letter,
 * common English words with all their prefixes (so SPM merges can reach them), then every
 * lowercase string of length 2, 3, ... in order until n_vocab. Piece k has score -k. qwen2 files
 * use the same SPM-style vocabulary (real Qwen2 uses a GPT-2 BPE one; the engine and llama.cpp
 * key the tokenizer on tokenizer.ggml.model, not on the architecture). */
#include "tools/mkmodel.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/dtype.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "tools/gguf_write.h"
#include "tools/mkmodel_q56k.h"
#include "tools/qleg_quant.h"
#include "tools/quant_q23k.h"

/* ---------------------------------------------------------------- presets */

int mkmodel_preset(const char *name, mkmodel_params_t *p)
{
    mkmodel_params_t q = {
        .arch = ARCH_LLAMA, .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 128, .n_vocab = 512, .ctx_len = 512, .dtype = DT_F32, .tied = 0, .seed = 1,
        .rope_theta = 10000.0f, .norm_eps = 1e-5f,
    };
    if (!name || !p) return -1;
    if (strcmp(name, "tiny") == 0) {
        /* defaults above */
    } else if (strcmp(name, "qwen2-tiny") == 0) {
        q.arch = ARCH_QWEN2;
        q.norm_eps = 1e-6f;
        q.rope_theta = 1000000.0f;
    } else if (strcmp(name, "smollm2-135m") == 0) {
        q = (mkmodel_params_t){.arch = ARCH_LLAMA, .dim = 576, .n_layers = 30, .n_heads = 9,
                               .n_kv_heads = 3, .ffn_dim = 1536, .n_vocab = 49152,
                               .ctx_len = 8192, .dtype = DT_F16, .tied = 1, .seed = 1,
                               .rope_theta = 100000.0f, .norm_eps = 1e-5f};
    } else if (strcmp(name, "llama-3.2-1b") == 0) {
        q = (mkmodel_params_t){.arch = ARCH_LLAMA, .dim = 2048, .n_layers = 16, .n_heads = 32,
                               .n_kv_heads = 8, .ffn_dim = 8192, .n_vocab = 128256,
                               .ctx_len = 131072, .dtype = DT_F16, .tied = 1, .seed = 1,
                               .rope_theta = 500000.0f, .norm_eps = 1e-5f};
    } else if (strcmp(name, "llama-3.1-8b") == 0) {
        q = (mkmodel_params_t){.arch = ARCH_LLAMA, .dim = 4096, .n_layers = 32, .n_heads = 32,
                               .n_kv_heads = 8, .ffn_dim = 14336, .n_vocab = 128256,
                               .ctx_len = 131072, .dtype = DT_F16, .tied = 0, .seed = 1,
                               .rope_theta = 500000.0f, .norm_eps = 1e-5f};
    } else {
        return -1;
    }
    *p = q;
    return 0;
}

/* ---------------------------------------------------------------- random numbers */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Approximately N(0, 1): Irwin-Hall sum of four uniforms on (0, 1), variance 1/3 -> scaled. */
static float approx_normal(uint64_t *s)
{
    uint64_t r = splitmix64(s);
    float sum = 0.0f;
    for (int k = 0; k < 4; k++) sum += ((float)((r >> (16 * k)) & 0xffff) + 0.5f) * (1.0f / 65536.0f);
    return (sum - 2.0f) * 1.7320508f;
}

/* ---------------------------------------------------------------- tensors */

typedef struct {
    char name[64];
    int type;           /* enum dtype in the file */
    int n_dims;
    int64_t ne[3];      /* {in, out}, {in, out, n_expert} or {n} */
    float mean, std;
    uint64_t seed;      /* per tensor */
    float *scratch;     /* [max ne0] shared by all specs (the writer fills one row at a time) */
} tspec_t;

static void gen_row(const tspec_t *t, int64_t row, float *out)
{
    uint64_t s = t->seed ^ ((uint64_t)(row + 1) * 0xd1b54a32d192ed03ull);
    splitmix64(&s);
    for (int64_t j = 0; j < t->ne[0]; j++) out[j] = t->mean + t->std * approx_normal(&s);
}

static void quantize_q8_0(const float *x, block_q8_0 *b, int64_t n)
{
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *v = x + i * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) {
            float q = roundf(v[j] * id);
            b[i].qs[j] = (int8_t)(q > 127.0f ? 127 : q < -127.0f ? -127 : q);
        }
    }
}

/* ggml's nearest_int: round half to even (the default rounding mode), |v| < 2^22. */
static int round_even(float v)
{
    return (int)rintf(v);
}

/* Q4_0: one block of 32. The scale maps the value of largest magnitude m (the first one, if
 * several) to -8 exactly, so the other side reaches at most +7; q = x / d + 8 rounded half up
 * (truncation of a positive number + 0.5), capped at 15. */
static void quantize_q4_0(const float *x, block_q4_0 *b, int64_t n)
{
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < QK4_0; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                m = x[j];
            }
        float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            int lo = (int)(int8_t)(x[j] * id + 8.5f), hi = (int)(int8_t)(x[j + 16] * id + 8.5f);
            lo = lo > 15 ? 15 : lo;
            hi = hi > 15 ? 15 : hi;
            b[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* Q4_K helper: fits x[0..32) ~ scale * L + lo with L in [0, 15] and lo <= 0, minimising the
 * w-weighted squared error. Start from the plain min/max grid, then try 21 alternative step
 * counts (15 - 1 + 0.1 s, s = 0..20) whose rounding gives new L, refit scale and lo by weighted
 * least squares for each, and keep the best. Writes L and *neg_lo = -lo; returns scale. */
static float q4k_fit(const float *x, const float *w, uint8_t *L, float *neg_lo)
{
    enum { N = 32, NMAX = 15, NSTEP = 20 };
    const float rmin = -1.0f, rdelta = 0.1f;
    float lo = x[0], hi = x[0], sw = w[0], swx = w[0] * x[0];
    for (int i = 1; i < N; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        swx += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, N);
        *neg_lo = -lo;
        return 0.0f;
    }
    float iscale = NMAX / (hi - lo), scale = 1 / iscale, best = 0;
    for (int i = 0; i < N; i++) {
        int l = round_even(iscale * (x[i] - lo));
        L[i] = (uint8_t)(l < 0 ? 0 : l > NMAX ? NMAX : l);
        float diff = scale * L[i] + lo - x[i];
        best += w[i] * (diff * diff);
    }
    uint8_t Lt[N];
    for (int s = 0; s <= NSTEP; s++) {
        float is = (rmin + rdelta * s + NMAX) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < N; i++) {
            int l = round_even(is * (x[i] - lo));
            l = l < 0 ? 0 : l > NMAX ? NMAX : l;
            Lt[i] = (uint8_t)l;
            sl += w[i] * l;
            sl2 += w[i] * l * l;
            sxl += w[i] * l * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0)) continue;
        float sc = (sw * sxl - swx * sl) / det, mn = (sl2 * swx - sl * sxl) / det;
        if (mn > 0) {
            mn = 0;
            sc = sxl / sl2;
        }
        float err = 0;
        for (int i = 0; i < N; i++) {
            float diff = sc * Lt[i] + mn - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best) {
            memcpy(L, Lt, N);
            best = err;
            scale = sc;
            lo = mn;
        }
    }
    *neg_lo = -lo;
    return scale;
}

static void quantize_q4_k(const float *x, block_q4_K *b, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        float scales[QK_K / 32], mins[QK_K / 32], max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            const float *xs = x + 32 * j;
            float w[32], s2 = 0;
            for (int l = 0; l < 32; l++) s2 += xs[l] * xs[l];
            float rms = sqrtf(s2 / 32);
            for (int l = 0; l < 32; l++) w[l] = rms + fabsf(xs[l]);
            scales[j] = q4k_fit(xs, w, L + 32 * j, &mins[j]);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        float inv_s = max_scale > 0 ? 63.0f / max_scale : 0.0f;
        float inv_m = max_min > 0 ? 63.0f / max_min : 0.0f;
        memset(b[i].scales, 0, sizeof b[i].scales);
        for (int j = 0; j < QK_K / 32; j++) {
            int ls = (uint8_t)round_even(inv_s * scales[j]), lm = (uint8_t)round_even(inv_m * mins[j]);
            ls = ls > 63 ? 63 : ls;
            lm = lm > 63 ? 63 : lm;
            if (j < 4) { /* the packing q4k_scale_min reads */
                b[i].scales[j] = (uint8_t)ls;
                b[i].scales[j + 4] = (uint8_t)lm;
            } else {
                b[i].scales[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
                b[i].scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
                b[i].scales[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        b[i].d = f32_to_fp16(max_scale / 63.0f);
        b[i].dmin = f32_to_fp16(max_min / 63.0f);
        /* the quants again, against the scales as stored */
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, mn;
            q4k_scale_min(j, b[i].scales, &sc, &mn);
            float d = fp16_to_f32(b[i].d) * sc;
            if (d == 0.0f) continue;
            float dm = fp16_to_f32(b[i].dmin) * mn;
            for (int l = 0; l < 32; l++) {
                int q = round_even((x[32 * j + l] + dm) / d);
                L[32 * j + l] = (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
            }
        }
        for (int c = 0; c < QK_K / 64; c++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
    }
}

/* ---------------------------------------------------------------- weighted quantisers */

/* Q4_0 against weights w >= 0: for each block of 32, candidate scales d = m / s (m the value of
 * largest magnitude, s = -8 + 0.1 k for k in [-10, 10]), the quants q = round(x / d) clamped
 * to [-8, 7], d refitted to them by weighted least squares and rounded to fp16; the candidate
 * of least w-weighted squared error is kept (an all-zero block when none beats zero). */
static void quantize_q4_0_w(const float *x, const float *w, block_q4_0 *b, int64_t n)
{
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0, w += QK4_0) {
        float amax = 0.0f, m = 0.0f, bd = 0.0f, best = 0.0f;
        int q[QK4_0], bq[QK4_0];
        for (int j = 0; j < QK4_0; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                m = x[j];
            }
            bq[j] = 0;
            best += w[j] * x[j] * x[j];
        }
        for (int k = -10; k <= 10 && amax > 0.0f; k++) {
            float id = (-8.0f + 0.1f * (float)k) / m;
            double sxq = 0, sqq = 0;
            for (int j = 0; j < QK4_0; j++) {
                int v = round_even(x[j] * id);
                q[j] = v < -8 ? -8 : v > 7 ? 7 : v;
                sxq += (double)w[j] * x[j] * q[j];
                sqq += (double)w[j] * q[j] * q[j];
            }
            if (!(sqq > 0)) continue;
            float d = fp16_to_f32(f32_to_fp16((float)(sxq / sqq))), err = 0.0f;
            for (int j = 0; j < QK4_0; j++) {
                float diff = d * (float)q[j] - x[j];
                err += w[j] * diff * diff;
            }
            if (err < best) {
                best = err;
                bd = d;
                memcpy(bq, q, sizeof q);
            }
        }
        b[i].d = f32_to_fp16(bd);
        for (int j = 0; j < QK4_0 / 2; j++)
            b[i].qs[j] = (uint8_t)((bq[j] + 8) | (bq[j + 16] + 8) << 4);
    }
}

/* Q4_K sub-block of 32 at sub-block scale d1 and min m1 (x ~ d1 L - m1): writes the quants
 * L (nearest, ties up, clamped to [0, 15]; 0 when d1 is 0) and returns their w-weighted squared
 * error. In GCC/clang vector extensions, 4 lanes (SSE2 on any x86-64; the search spends most of
 * its time here). */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static float q4k_sub_err(const float *x, const float *w, float d1, float m1, uint8_t *L)
{
    const float id = d1 != 0.0f ? 1.0f / d1 : 0.0f;
    const v4f zero = {0, 0, 0, 0}, top = {15, 15, 15, 15};
    v4f acc = zero;
    for (int l = 0; l < 32; l += 4) {
        v4f xv, wv;
        memcpy(&xv, x + l, sizeof xv);
        memcpy(&wv, w + l, sizeof wv);
        v4f v = (xv + m1) * id + 0.5f;
        v4i neg = v < zero, over = v > top;
        v = (v4f)(((v4i)v & ~neg & ~over) | ((v4i)top & over));
        v4i q = __builtin_convertvector(v, v4i);
        v4f diff = d1 * __builtin_convertvector(q, v4f) - m1 - xv;
        acc += wv * diff * diff;
        for (int k = 0; k < 4; k++) L[l + k] = (uint8_t)q[k];
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

/* Q4_K against weights w >= 0, one super-block of 256: the reference fit (q4k_fit per sub-block
 * with w, 6-bit scales and mins against their maxima), then up to 8 rounds of (a) each
 * sub-block's 6-bit scale and min moved within +-3 to the pair whose re-rounded quants give
 * the least weighted error at the current fp16 d and dmin, and (b) d and dmin refitted by
 * weighted least squares to the integer scales, mins and quants (rounded to fp16; dmin >= 0),
 * stopping when a round no longer lowers the super-block's error. The best block seen is
 * written. */
static void quantize_q4_k_block_w(const float *x, const float *w, block_q4_K *b)
{
    enum { NSUB = QK_K / 32, R = 3, ROUNDS = 8 };
    int ls[NSUB], lm[NSUB], bls[NSUB], blm[NSUB];
    uint8_t L[QK_K], bL[QK_K], Lt[32];
    float scales[NSUB], mins[NSUB], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < NSUB; j++) {
        scales[j] = q4k_fit(x + 32 * j, w + 32 * j, L + 32 * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float d = fp16_to_f32(f32_to_fp16(max_scale / 63.0f));
    float dmin = fp16_to_f32(f32_to_fp16(max_min / 63.0f));
    float inv_s = max_scale > 0 ? 63.0f / max_scale : 0.0f, inv_m = max_min > 0 ? 63.0f / max_min : 0.0f;
    float best = 0.0f;
    for (int j = 0; j < NSUB; j++) {
        ls[j] = round_even(inv_s * scales[j]);
        lm[j] = round_even(inv_m * mins[j]);
        ls[j] = ls[j] > 63 ? 63 : ls[j];
        lm[j] = lm[j] > 63 ? 63 : lm[j];
        best += q4k_sub_err(x + 32 * j, w + 32 * j, d * (float)ls[j], dmin * (float)lm[j], L + 32 * j);
    }
    float bd = d, bdmin = dmin;
    memcpy(bls, ls, sizeof ls);
    memcpy(blm, lm, sizeof lm);
    memcpy(bL, L, sizeof L);
    for (int round = 0; round < ROUNDS; round++) {
        float total = 0.0f;
        for (int j = 0; j < NSUB; j++) { /* (a) */
            const float *xs = x + 32 * j, *ws = w + 32 * j;
            int s0 = ls[j], m0 = lm[j];
            float e0 = q4k_sub_err(xs, ws, d * (float)s0, dmin * (float)m0, L + 32 * j);
            for (int sc = s0 - R; sc <= s0 + R; sc++)
                for (int mn = m0 - R; mn <= m0 + R; mn++) {
                    if (sc < 0 || sc > 63 || mn < 0 || mn > 63 || (sc == s0 && mn == m0)) continue;
                    float e = q4k_sub_err(xs, ws, d * (float)sc, dmin * (float)mn, Lt);
                    if (e < e0) {
                        e0 = e;
                        ls[j] = sc;
                        lm[j] = mn;
                        memcpy(L + 32 * j, Lt, 32);
                    }
                }
            total += e0;
        }
        if (round > 0 && !(total < best)) break;
        if (total < best) {
            best = total;
            bd = d;
            bdmin = dmin;
            memcpy(bls, ls, sizeof ls);
            memcpy(blm, lm, sizeof lm);
            memcpy(bL, L, sizeof L);
        }
        /* (b) minimise sum w (d a - dmin c - x)^2 with a = ls L, c = lm */
        double saa = 0, sac = 0, scc = 0, sax = 0, scx = 0;
        for (int j = 0; j < NSUB; j++)
            for (int l = 0; l < 32; l++) {
                double wi = w[32 * j + l], a = (double)ls[j] * L[32 * j + l], c = lm[j];
                double xi = x[32 * j + l];
                saa += wi * a * a;
                sac += wi * a * c;
                scc += wi * c * c;
                sax += wi * a * xi;
                scx += wi * c * xi;
            }
        double det = saa * scc - sac * sac, nd, ndmin;
        if (det > 1e-12 * saa * scc) {
            nd = (sax * scc - scx * sac) / det;
            ndmin = (sax * sac - saa * scx) / det;
        } else {
            nd = saa > 0 ? sax / saa : 0; /* no usable mins: scale alone */
            ndmin = dmin;
        }
        if (ndmin < 0) { /* mins are offsets below zero: refit the scale alone at dmin 0 */
            ndmin = 0;
            nd = saa > 0 ? sax / saa : 0;
        }
        if (!(nd > 0)) break;
        d = fp16_to_f32(f32_to_fp16((float)nd));
        dmin = fp16_to_f32(f32_to_fp16((float)ndmin));
    }
    b->d = f32_to_fp16(bd);
    b->dmin = f32_to_fp16(bdmin);
    memset(b->scales, 0, sizeof b->scales);
    for (int j = 0; j < NSUB; j++) {
        if (j < 4) { /* the packing q4k_scale_min reads */
            b->scales[j] = (uint8_t)bls[j];
            b->scales[j + 4] = (uint8_t)blm[j];
        } else {
            b->scales[j + 4] = (uint8_t)((bls[j] & 15) | (blm[j] & 15) << 4);
            b->scales[j - 4] |= (uint8_t)((bls[j] >> 4) << 6);
            b->scales[j] |= (uint8_t)((blm[j] >> 4) << 6);
        }
    }
    for (int c = 0; c < QK_K / 64; c++)
        for (int l = 0; l < 32; l++)
            b->qs[32 * c + l] = (uint8_t)(bL[64 * c + l] | bL[64 * c + 32 + l] << 4);
}

int mkmodel_quantize_row_weighted(int t, const float *x, const float *w, void *dst, int64_t n)
{
    int be = dtype_block_elems(t);
    if (!dtype_supported(t) || be == 0 || n < 0 || n % be || !w) return -1;
    for (int64_t j = 0; j < n; j++)
        if (!(w[j] >= 0.0f) || isinf(w[j])) return -1;
    if (t == DT_Q4_0) {
        quantize_q4_0_w(x, w, dst, n);
    } else if (t == DT_Q4_K) {
        for (int64_t i = 0; i < n / QK_K; i++)
            quantize_q4_k_block_w(x + i * QK_K, w + i * QK_K, (block_q4_K *)dst + i);
    } else {
        return mkmodel_quantize_row(t, x, dst, n);
    }
    return 0;
}

int mkmodel_quantize_row(int t, const float *x, void *dst, int64_t n)
{
    int be = dtype_block_elems(t);
    if (!dtype_supported(t) || be == 0 || n < 0 || n % be) return -1;
    switch (t) {
    case DT_F32:
        memcpy(dst, x, (size_t)n * 4);
        break;
    case DT_F16:
        for (int64_t j = 0; j < n; j++) {
            uint16_t h = f32_to_fp16(x[j]);
            memcpy((uint8_t *)dst + 2 * j, &h, 2);
        }
        break;
    case DT_BF16:
        for (int64_t j = 0; j < n; j++) {
            uint16_t h = f32_to_bf16(x[j]);
            memcpy((uint8_t *)dst + 2 * j, &h, 2);
        }
        break;
    case DT_Q8_0: quantize_q8_0(x, dst, n); break;
    case DT_Q4_0: quantize_q4_0(x, dst, n); break;
    case DT_Q4_K: quantize_q4_k(x, dst, n); break;
    case DT_Q2_K: quant_q2_k_row(x, dst, n); break; /* tools/quant_q23k.c */
    case DT_Q3_K: quant_q3_k_row(x, dst, n); break;
    case DT_Q5_K: mkmodel_quantize_q5_k(x, dst, n); break;
    case DT_Q6_K: mkmodel_quantize_q6_k(x, dst, n); break;
    case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: case DT_IQ4_NL: case DT_IQ4_XS:
        return qleg_quantize_row(t, x, dst, n);
    default: return -1;
    }
    return 0;
}

int mkmodel_matrix_type(int want, int64_t ne0, int keep)
{
    if (dtype_row_bytes(want, ne0)) return want;
    if ((want == DT_Q4_K || want == DT_Q2_K || want == DT_Q3_K) && dtype_row_bytes(DT_Q4_0, ne0))
        return DT_Q4_0;
    if ((want == DT_Q5_K || want == DT_Q6_K) && dtype_row_bytes(DT_Q8_0, ne0)) return DT_Q8_0;
    if (want == DT_IQ4_XS && dtype_row_bytes(DT_IQ4_NL, ne0)) return DT_IQ4_NL;
    return keep;
}

static int fill_row(void *user, int64_t row, void *dst, size_t row_bytes)
{
    const tspec_t *t = user;
    float *x = t->scratch;
    gen_row(t, row, x);
    (void)row_bytes;
    return mkmodel_quantize_row(t->type, x, dst, t->ne[0]);
}

/* ---------------------------------------------------------------- vocabulary */

typedef struct {
    char *buf;          /* all pieces, NUL-separated */
    size_t len, cap;
    size_t *off;        /* [n] offset of piece i in buf */
    int n, want;
    uint32_t *set;      /* open-addressing hash set of piece index + 1; capacity mask + 1 */
    uint32_t mask;
} vocab_t;

static int vocab_has(const vocab_t *v, const char *s, uint64_t h)
{
    for (uint32_t i = (uint32_t)h & v->mask;; i = (i + 1) & v->mask) {
        if (!v->set[i]) return 0;
        if (strcmp(v->buf + v->off[v->set[i] - 1], s) == 0) return 1;
    }
}

/* Appends s unless present or the vocabulary is full. 0, or -1 out of memory. */
static int vocab_add(vocab_t *v, const char *s)
{
    if (v->n >= v->want) return 0;
    uint64_t h = fnv1a(s);
    if (vocab_has(v, s, h)) return 0;
    size_t l = strlen(s) + 1;
    if (v->len + l > v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 4096;
        while (nc < v->len + l) nc *= 2;
        char *nb = realloc(v->buf, nc);
        if (!nb) return -1;
        v->buf = nb;
        v->cap = nc;
    }
    memcpy(v->buf + v->len, s, l);
    v->off[v->n] = v->len;
    v->len += l;
    uint32_t i = (uint32_t)h & v->mask;
    while (v->set[i]) i = (i + 1) & v->mask;
    v->set[i] = (uint32_t)++v->n;
    return 0;
}

static const char *const common_words[] = {
    "the", "and", "was", "to", "a", "of", "in", "it", "he", "she", "is", "that", "for", "on",
    "with", "they", "we", "you", "said", "once", "upon", "time", "there", "little", "day", "one",
    "big", "girl", "boy", "play", "happy", "saw", "had", "her", "his", "very", "wanted", "friend",
    "went", "not", "but", "so", "be", "have", "at", "all", "this", "from", "by", "what", "do",
    "Once", "The", "She", "He", "They", "Lily", "Tom", "hello", "world", "model", "token",
};
static const char *const suffixes[] = {"ing", "ed", "er", "ly", "es", "s", "'s", "n't"};

#define SPM_SPACE "\xe2\x96\x81" /* U+2581 */

static int build_vocab(vocab_t *v, int n_vocab)
{
    memset(v, 0, sizeof *v);
    v->want = n_vocab;
    uint32_t cap = 1;
    while (cap < 2u * (uint32_t)n_vocab) cap <<= 1;
    v->mask = cap - 1;
    v->set = calloc(cap, sizeof *v->set);
    v->off = malloc((size_t)n_vocab * sizeof *v->off);
    if (!v->set || !v->off) return -1;
    char s[64];
    int rc = 0;
    rc |= vocab_add(v, "<unk>");
    rc |= vocab_add(v, "<s>");
    rc |= vocab_add(v, "</s>");
    for (int b = 0; b < 256; b++) {
        snprintf(s, sizeof s, "<0x%02X>", b);
        rc |= vocab_add(v, s);
    }
    rc |= vocab_add(v, SPM_SPACE);
    static const char singles[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()";
    for (const char *c = singles; *c; c++) {
        s[0] = *c;
        s[1] = '\0';
        rc |= vocab_add(v, s);
    }
    for (const char *c = singles; *c && c < singles + 52; c++) {
        snprintf(s, sizeof s, SPM_SPACE "%c", *c);
        rc |= vocab_add(v, s);
    }
    for (size_t w = 0; w < sizeof common_words / sizeof common_words[0]; w++) {
        size_t wl = strlen(common_words[w]);
        for (size_t k = 1; k <= wl; k++) {
            snprintf(s, sizeof s, SPM_SPACE "%.*s", (int)k, common_words[w]);
            rc |= vocab_add(v, s);
        }
    }
    for (size_t w = 0; w < sizeof suffixes / sizeof suffixes[0]; w++) {
        size_t wl = strlen(suffixes[w]);
        for (size_t k = 1; k <= wl; k++) {
            snprintf(s, sizeof s, "%.*s", (int)k, suffixes[w]);
            rc |= vocab_add(v, s);
        }
    }
    /* Every lowercase string of length 2, 3, ... in lexicographic order. */
    for (int len = 2; v->n < n_vocab && len < 16 && rc == 0; len++) {
        int idx[16] = {0};
        for (;;) {
            for (int k = 0; k < len; k++) s[k] = (char)('a' + idx[k]);
            s[len] = '\0';
            rc |= vocab_add(v, s);
            if (v->n >= n_vocab || rc) break;
            int k = len - 1;
            while (k >= 0 && ++idx[k] == 26) idx[k--] = 0;
            if (k < 0) break;
        }
    }
    return rc || v->n != n_vocab ? -1 : 0;
}

static void vocab_free(vocab_t *v)
{
    free(v->buf);
    free(v->off);
    free(v->set);
}

/* ---------------------------------------------------------------- write */

static int check_params(const mkmodel_params_t *p, char *errstr, size_t errlen)
{
    const int moe_arch = p->arch == ARCH_QWEN2MOE || p->arch == ARCH_QWEN3MOE;
    if ((p->arch < ARCH_LLAMA || p->arch > ARCH_PHI3) && !moe_arch)
        return sw_seterr(errstr, errlen, "mkmodel: arch must be llama, qwen2, qwen3, gemma2, gemma3, "
                      "phi3, qwen2moe or qwen3moe");
    if (p->head_dim < 0 || p->head_dim % 2 || p->head_dim > 1024 || p->swa_window < 0 ||
        p->swa_pattern < 0 || p->rope_orig_ctx < 0 || !(p->rope_theta_swa >= 0) ||
        !(p->attn_softcap >= 0) || !(p->logit_softcap >= 0) || !(p->rope_factor >= 0) ||
        !(p->rope_attn_factor >= 0))
        return sw_seterr(errstr, errlen, "mkmodel: head_dim (even), window, pattern, original "
                      "context, RoPE and soft-cap values must not be negative");
    if (p->arch == ARCH_GEMMA2 && !p->tied)
        return sw_seterr(errstr, errlen, "mkmodel: gemma2 ties the output projection to "
                      "token_embd (llama.cpp's gemma2 loader refuses output.weight): drop --untied");
    if (p->rope_scaling && strcmp(p->rope_scaling, "linear") && strcmp(p->rope_scaling, "yarn") &&
        strcmp(p->rope_scaling, "llama3") && strcmp(p->rope_scaling, "longrope"))
        return sw_seterr(errstr, errlen, "mkmodel: rope scaling must be linear, yarn, llama3 or "
                      "longrope");
    if (p->n_expert < 0 || p->n_expert > MODEL_MAX_EXPERTS || (moe_arch && p->n_expert == 0) ||
        (!moe_arch && p->arch != ARCH_LLAMA && p->n_expert))
        return sw_seterr(errstr, errlen, "mkmodel: n_expert %d: qwen2moe and qwen3moe need 1..%d "
                      "experts, llama 0..%d, the other architectures none", p->n_expert,
                      MODEL_MAX_EXPERTS, MODEL_MAX_EXPERTS);
    if (p->n_expert && (p->n_expert_used < 1 || p->n_expert_used > p->n_expert ||
                        p->n_expert_used > MODEL_MAX_EXPERTS_USED))
        return sw_seterr(errstr, errlen, "mkmodel: n_expert_used %d not in 1..min(n_expert %d, %d)",
                      p->n_expert_used, p->n_expert, MODEL_MAX_EXPERTS_USED);
    if (p->expert_ffn_dim < 0 || p->expert_ffn_dim > 1 << 20 ||
        (p->expert_ffn_dim && (!moe_arch || !p->n_expert)))
        return sw_seterr(errstr, errlen, "mkmodel: expert_ffn_dim %d: 0, or 1..%d for qwen2moe and "
                      "qwen3moe", p->expert_ffn_dim, 1 << 20);
    if ((p->dtype == DT_Q8_0 || p->dtype == DT_Q4_0 || p->dtype == DT_Q4_K) &&
        p->expert_ffn_dim % 32)
        return sw_seterr(errstr, errlen, "mkmodel: %s needs expert_ffn_dim (%d) to be a multiple of "
                      "32", dtype_name(p->dtype), p->expert_ffn_dim);
    if (p->dim <= 0 || p->dim > 65536 || p->n_heads <= 0 || p->n_heads > 1024 ||
        (!p->head_dim && (p->dim % p->n_heads || (p->dim / p->n_heads) % 2)))
        return sw_seterr(errstr, errlen, "mkmodel: dim %d must be a positive multiple of n_heads %d "
                      "with an even head dimension", p->dim, p->n_heads);
    if (p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads)
        return sw_seterr(errstr, errlen, "mkmodel: n_kv_heads %d must divide n_heads %d",
                      p->n_kv_heads, p->n_heads);
    if (p->n_layers <= 0 || p->n_layers > 1024)
        return sw_seterr(errstr, errlen, "mkmodel: n_layers %d not in 1..1024", p->n_layers);
    if (p->ffn_dim <= 0 || p->ffn_dim > 1 << 20)
        return sw_seterr(errstr, errlen, "mkmodel: ffn_dim %d not in 1..%d", p->ffn_dim, 1 << 20);
    if (p->n_vocab < MKMODEL_MIN_VOCAB || p->n_vocab > 1 << 22)
        return sw_seterr(errstr, errlen, "mkmodel: n_vocab %d not in %d..%d", p->n_vocab,
                      MKMODEL_MIN_VOCAB, 1 << 22);
    if (p->ctx_len <= 0) return sw_seterr(errstr, errlen, "mkmodel: ctx_len must be positive");
    if (!dtype_supported(p->dtype))
        return sw_seterr(errstr, errlen, "mkmodel: dtype %s not supported; supported: %s",
                      dtype_name(p->dtype), DTYPE_SUPPORTED_LIST);
    if (dtype_block_elems(p->dtype) > 1 && (p->dim % 32 || p->ffn_dim % 32))
        return sw_seterr(errstr, errlen, "mkmodel: %s needs dim (%d) and ffn_dim (%d) to be "
                      "multiples of 32", dtype_name(p->dtype), p->dim, p->ffn_dim);
    if ((p->dtype == DT_Q8_0 || p->dtype == DT_Q4_0 || p->dtype == DT_Q4_K ||
         p->dtype == DT_Q2_K || p->dtype == DT_Q3_K) && p->head_dim &&
        (p->n_heads * p->head_dim) % 32)
        return sw_seterr(errstr, errlen, "mkmodel: %s needs n_heads x head_dim (%d) to be a "
                      "multiple of 32", dtype_name(p->dtype), p->n_heads * p->head_dim);
    if (!(p->rope_theta > 0) || !(p->norm_eps > 0) || !isfinite(p->rope_theta) ||
        !isfinite(p->norm_eps))
        return sw_seterr(errstr, errlen, "mkmodel: rope_theta and norm_eps must be positive");
    return 0;
}

static int file_type_of(int dtype)
{
    switch (dtype) {
    case DT_F16: return 1;   /* LLAMA_FTYPE_MOSTLY_F16 */
    case DT_Q8_0: return 7;  /* LLAMA_FTYPE_MOSTLY_Q8_0 */
    case DT_Q4_0: return 2;  /* LLAMA_FTYPE_MOSTLY_Q4_0 */
    case DT_Q4_K: return 14; /* LLAMA_FTYPE_MOSTLY_Q4_K_S */
    case DT_Q2_K: return 10; /* LLAMA_FTYPE_MOSTLY_Q2_K */
    case DT_Q3_K: return 11; /* LLAMA_FTYPE_MOSTLY_Q3_K_S */
    case DT_Q5_K: return 16; /* LLAMA_FTYPE_MOSTLY_Q5_K_S */
    case DT_Q6_K: return 18; /* LLAMA_FTYPE_MOSTLY_Q6_K */
    case DT_Q4_1: return 3;   /* LLAMA_FTYPE_MOSTLY_Q4_1 */
    case DT_Q5_0: return 8;   /* LLAMA_FTYPE_MOSTLY_Q5_0 */
    case DT_Q5_1: return 9;   /* LLAMA_FTYPE_MOSTLY_Q5_1 */
    case DT_IQ4_NL: return 25; /* LLAMA_FTYPE_MOSTLY_IQ4_NL */
    case DT_IQ4_XS: return 30; /* LLAMA_FTYPE_MOSTLY_IQ4_XS */
    case DT_BF16: return 32; /* LLAMA_FTYPE_MOSTLY_BF16 */
    default: return 0;       /* LLAMA_FTYPE_ALL_F32 */
    }
}

int mkmodel_vocab_size(const char *path, char *errstr, size_t errlen)
{
    gguf_t *g = gguf_open(path, errstr, errlen);
    if (!g) return -1;
    int et;
    uint64_t n = 0;
    int rc = gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) == 0 && et == GGUF_STRING &&
                     n > 0 && n <= (1u << 22)
                 ? (int)n
                 : -1;
    if (rc < 0) sw_seterr(errstr, errlen, "mkmodel: %s has no tokenizer.ggml.tokens", path);
    gguf_close(g);
    return rc;
}

/* Copies every tokenizer.* key of the GGUF file at path into w. 0, or -1 with errstr. */
static int copy_vocab(gguf_writer_t *w, const char *path, int n_vocab, char *errstr,
                      size_t errlen)
{
    gguf_t *g = gguf_open(path, errstr, errlen);
    if (!g) return -1;
    int rc = -1;
    const char **strs = NULL;
    uint64_t *lens = NULL;
    char *sbuf = NULL;
    if (mkmodel_vocab_size(path, errstr, errlen) != n_vocab) {
        sw_seterr(errstr, errlen, "mkmodel: %s does not have %d tokens", path, n_vocab);
        goto out;
    }
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        if (strncmp(key, "tokenizer.", 10) != 0) continue;
        int type = gguf_kv_type(g, i), e = 0;
        if (type == GGUF_STRING) {
            gguf_str_t s;
            e = gguf_get_str(g, key, &s);
            free(sbuf);
            sbuf = e ? NULL : malloc(s.len + 1);
            if (!e && !sbuf) goto oom;
            if (!e) {
                memcpy(sbuf, s.ptr, s.len);
                sbuf[s.len] = 0;
                e = gguf_writer_add_str(w, key, sbuf);
            }
        } else if (type == GGUF_ARRAY) {
            int et;
            uint64_t n;
            e = gguf_get_arr(g, key, &et, &n);
            if (!e && et == GGUF_STRING) {
                free(strs);
                free(lens);
                strs = malloc((n ? n : 1) * sizeof *strs);
                lens = malloc((n ? n : 1) * sizeof *lens);
                if (!strs || !lens) goto oom;
                for (uint64_t j = 0; j < n && !e; j++) {
                    gguf_str_t s;
                    e = gguf_get_arr_str(g, key, j, &s);
                    strs[j] = s.ptr;
                    lens[j] = s.len;
                }
                if (!e) e = gguf_writer_add_arr_str(w, key, strs, lens, n);
            } else if (!e) {
                e = gguf_writer_add_arr(w, key, et, gguf_get_arr_data(g, key), n);
            }
        } else if (type == GGUF_UINT32) {
            uint32_t x;
            e = gguf_get_u32(g, key, &x) || gguf_writer_add_u32(w, key, x);
        } else if (type == GGUF_FLOAT32) {
            float x;
            e = gguf_get_f32(g, key, &x) || gguf_writer_add_f32(w, key, x);
        } else if (type == GGUF_BOOL) {
            int x;
            e = gguf_get_bool(g, key, &x) || gguf_writer_add_bool(w, key, x);
        } else {
            int64_t x;
            e = gguf_get_i64(g, key, &x);
            if (!e && type == GGUF_INT32) {
                int32_t y = (int32_t)x;
                e = gguf_writer_add_scalar(w, key, type, &y);
            } else if (!e && (type == GGUF_INT64 || type == GGUF_UINT64)) {
                e = gguf_writer_add_scalar(w, key, type, &x);
            } else {
                e = 1;
            }
        }
        if (e) {
            sw_seterr(errstr, errlen, "mkmodel: cannot copy %s from %s", key, path);
            goto out;
        }
    }
    rc = 0;
    goto out;
oom:
    sw_seterr(errstr, errlen, "mkmodel: out of memory");
out:
    free(strs);
    free(lens);
    free(sbuf);
    gguf_close(g);
    return rc;
}

int mkmodel_write(const mkmodel_params_t *p, const char *path, char *errstr, size_t errlen)
{
    if (!p || !path) return sw_seterr(errstr, errlen, "mkmodel: NULL argument");
    if (check_params(p, errstr, errlen)) return -1;
    static const char *const names[] = {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"};
    const char *arch = p->arch == ARCH_QWEN2MOE   ? "qwen2moe"
                       : p->arch == ARCH_QWEN3MOE ? "qwen3moe"
                                                  : names[p->arch];
    const int hd = p->head_dim ? p->head_dim : p->dim / p->n_heads;
    const int q_dim = p->n_heads * hd, kv_dim = p->n_kv_heads * hd;
    const int qk_norm = p->arch == ARCH_QWEN3 || p->arch == ARCH_GEMMA3 || p->arch == ARCH_QWEN3MOE;
    const int post_norms = p->arch == ARCH_GEMMA2 || p->arch == ARCH_GEMMA3;
    const int fused = p->arch == ARCH_PHI3;
    const int longrope = p->rope_scaling && !strcmp(p->rope_scaling, "longrope");
    const int biases = p->arch == ARCH_QWEN2 || p->arch == ARCH_QWEN2MOE;
    const int eff = p->arch == ARCH_LLAMA ? p->ffn_dim : p->expert_ffn_dim ? p->expert_ffn_dim : p->ffn_dim;
    const int n_t = 5 + 20 * p->n_layers; /* at most */
    int n_written = 0;
    int rc = -1;
    gguf_writer_t *w = NULL;
    vocab_t v;
    memset(&v, 0, sizeof v);
    float *scores = NULL, *scratch = NULL;
    int32_t *types = NULL;
    const char **strs = NULL;
    tspec_t *ts = calloc((size_t)n_t, sizeof *ts);
    int64_t max_in = p->dim > p->ffn_dim ? p->dim : p->ffn_dim;
    if (eff > max_in) max_in = eff;
    if (q_dim > max_in) max_in = q_dim;
    scratch = malloc((size_t)max_in * sizeof *scratch);
    w = gguf_writer_new();
    if (!ts || !scratch || !w) {
        sw_seterr(errstr, errlen, "mkmodel: out of memory");
        goto fail;
    }

    /* Metadata. */
    char key[96], name[96];
    int e = 0;
#define ARCH_U32(suffix, val)                                       \
    do {                                                            \
        snprintf(key, sizeof key, "%s.%s", arch, suffix);           \
        e |= gguf_writer_add_u32(w, key, (uint32_t)(val));          \
    } while (0)
#define ARCH_F32(suffix, val)                                       \
    do {                                                            \
        snprintf(key, sizeof key, "%s.%s", arch, suffix);           \
        e |= gguf_writer_add_f32(w, key, (val));                    \
    } while (0)
    e |= gguf_writer_add_str(w, "general.architecture", arch);
    /* not "phi3" in the name: llama.cpp then applies Phi-3 special-token rules this vocabulary
     * cannot meet */
    snprintf(name, sizeof name, "spillway-synthetic-%s-%dx%d-%s",
             p->arch == ARCH_PHI3 ? "phi" : arch, p->n_layers, p->dim, dtype_name(p->dtype));
    e |= gguf_writer_add_str(w, "general.name", name);
    e |= gguf_writer_add_u32(w, "general.file_type", (uint32_t)file_type_of(p->dtype));
    if (dtype_block_elems(p->dtype) > 1)
        e |= gguf_writer_add_u32(w, "general.quantization_version", 2);
    ARCH_U32("context_length", p->ctx_len);
    ARCH_U32("embedding_length", p->dim);
    ARCH_U32("block_count", p->n_layers);
    ARCH_U32("feed_forward_length", p->ffn_dim);
    ARCH_U32("attention.head_count", p->n_heads);
    ARCH_U32("attention.head_count_kv", p->n_kv_heads);
    ARCH_F32("attention.layer_norm_rms_epsilon", p->norm_eps);
    ARCH_F32("rope.freq_base", p->rope_theta);
    ARCH_U32("rope.dimension_count", hd);
    ARCH_U32("vocab_size", p->n_vocab);
    if (p->n_expert) {
        ARCH_U32("expert_count", p->n_expert);
        ARCH_U32("expert_used_count", p->n_expert_used);
        if (p->arch != ARCH_LLAMA) ARCH_U32("expert_feed_forward_length", eff);
        if (p->arch == ARCH_QWEN2MOE) ARCH_U32("expert_shared_feed_forward_length", p->ffn_dim);
    }
    if (p->head_dim) {
        ARCH_U32("attention.key_length", hd);
        ARCH_U32("attention.value_length", hd);
    }
    if (p->swa_window) ARCH_U32("attention.sliding_window", p->swa_window);
    if (p->swa_pattern) ARCH_U32("attention.sliding_window_pattern", p->swa_pattern);
    if (p->rope_theta_swa > 0) ARCH_F32("rope.freq_base_swa", p->rope_theta_swa);
    if (p->attn_softcap > 0) ARCH_F32("attn_logit_softcapping", p->attn_softcap);
    if (p->logit_softcap > 0) ARCH_F32("final_logit_softcapping", p->logit_softcap);
    if (p->rope_scaling) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        e |= gguf_writer_add_str(w, key, p->rope_scaling);
    }
    if (p->rope_factor > 0) ARCH_F32("rope.scaling.factor", p->rope_factor);
    if (p->rope_orig_ctx) ARCH_U32("rope.scaling.original_context_length", p->rope_orig_ctx);
    if (p->rope_attn_factor > 0) ARCH_F32("rope.scaling.attn_factor", p->rope_attn_factor);
#undef ARCH_U32
#undef ARCH_F32

    /* Tokenizer. */
    if (p->vocab_from) {
        if (copy_vocab(w, p->vocab_from, p->n_vocab, errstr, errlen)) goto fail;
        goto tensors;
    }
    if (build_vocab(&v, p->n_vocab)) {
        sw_seterr(errstr, errlen, "mkmodel: out of memory building the vocabulary");
        goto fail;
    }
    strs = malloc((size_t)p->n_vocab * sizeof *strs);
    scores = malloc((size_t)p->n_vocab * sizeof *scores);
    types = malloc((size_t)p->n_vocab * sizeof *types);
    if (!strs || !scores || !types) {
        sw_seterr(errstr, errlen, "mkmodel: out of memory");
        goto fail;
    }
    for (int i = 0; i < p->n_vocab; i++) {
        strs[i] = v.buf + v.off[i];
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
        scores[i] = i < 259 ? 0.0f : -(float)(i - 259);
    }
    e |= gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
    e |= gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", strs, NULL, (uint64_t)p->n_vocab);
    e |= gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, (uint64_t)p->n_vocab);
    e |= gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, (uint64_t)p->n_vocab);
    e |= gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
    e |= gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    e |= gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    e |= gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1);
    e |= gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", 0);
    if (e) {
        sw_seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
        goto fail;
    }

tensors:;
    /* Tensors, in llama.cpp's order. */
    int k = 0;
    const float mat_std_dim = 1.0f / sqrtf((float)p->dim);
#define SPEC(nm, type_, nd, ne0, ne1, mean_, std_)                                   \
    do {                                                                             \
        tspec_t *t_ = &ts[k++];                                                      \
        snprintf(t_->name, sizeof t_->name, "%s", nm);                               \
        t_->type = (type_);                                                          \
        t_->n_dims = (nd);                                                           \
        t_->ne[0] = (ne0);                                                           \
        t_->ne[1] = (ne1);                                                           \
        t_->ne[2] = 1;                                                               \
        t_->mean = (mean_);                                                          \
        t_->std = (std_);                                                            \
    } while (0)
    SPEC("token_embd.weight", p->dtype, 2, p->dim, p->n_vocab, 0.0f, 0.02f);
    SPEC("output_norm.weight", DT_F32, 1, p->dim, 1, 1.0f, 0.05f);
    if (!p->tied) SPEC("output.weight", p->dtype, 2, p->dim, p->n_vocab, 0.0f, mat_std_dim);
    if (longrope) {
        SPEC("rope_factors_long.weight", DT_F32, 1, hd / 2, 1, 2.0f, 0.15f);
        SPEC("rope_factors_short.weight", DT_F32, 1, hd / 2, 1, 1.2f, 0.05f);
    }
    for (int l = 0; l < p->n_layers; l++) {
        char nm[64];
#define LSPEC(suffix, type_, nd, ne0, ne1, mean_, std_)                              \
    do {                                                                             \
        snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix);                             \
        SPEC(nm, type_, nd, ne0, ne1, mean_, std_);                                  \
    } while (0)
        LSPEC("attn_norm.weight", DT_F32, 1, p->dim, 1, 1.0f, 0.05f);
        if (fused) {
            LSPEC("attn_qkv.weight", p->dtype, 2, p->dim, q_dim + 2 * kv_dim, 0.0f, mat_std_dim);
        } else {
            LSPEC("attn_q.weight", p->dtype, 2, p->dim, q_dim, 0.0f, mat_std_dim);
            LSPEC("attn_k.weight", p->dtype, 2, p->dim, kv_dim, 0.0f, mat_std_dim);
            LSPEC("attn_v.weight", p->dtype, 2, p->dim, kv_dim, 0.0f, mat_std_dim);
        }
        if (qk_norm) {
            LSPEC("attn_q_norm.weight", DT_F32, 1, hd, 1, 1.0f, 0.1f);
            LSPEC("attn_k_norm.weight", DT_F32, 1, hd, 1, 1.0f, 0.1f);
        }
        LSPEC("attn_output.weight", p->dtype, 2, q_dim, p->dim, 0.0f, 1.0f / sqrtf((float)q_dim));
        if (post_norms) LSPEC("post_attention_norm.weight", DT_F32, 1, p->dim, 1, 1.0f, 0.1f);
        if (biases) {
            LSPEC("attn_q.bias", DT_F32, 1, q_dim, 1, 0.0f, 0.02f);
            LSPEC("attn_k.bias", DT_F32, 1, kv_dim, 1, 0.0f, 0.02f);
            LSPEC("attn_v.bias", DT_F32, 1, kv_dim, 1, 0.0f, 0.02f);
        }
        LSPEC("ffn_norm.weight", DT_F32, 1, p->dim, 1, 1.0f, 0.05f);
        if (p->n_expert) {
            LSPEC("ffn_gate_inp.weight", DT_F32, 2, p->dim, p->n_expert, 0.0f, mat_std_dim);
            LSPEC("ffn_gate_exps.weight", p->dtype, 3, p->dim, eff, 0.0f, mat_std_dim);
            ts[k - 1].ne[2] = p->n_expert;
            LSPEC("ffn_up_exps.weight", p->dtype, 3, p->dim, eff, 0.0f, mat_std_dim);
            ts[k - 1].ne[2] = p->n_expert;
            LSPEC("ffn_down_exps.weight", p->dtype, 3, eff, p->dim, 0.0f, 1.0f / sqrtf((float)eff));
            ts[k - 1].ne[2] = p->n_expert;
            if (p->arch == ARCH_QWEN2MOE) {
                LSPEC("ffn_gate_inp_shexp.weight", DT_F32, 1, p->dim, 1, 0.0f, mat_std_dim);
                LSPEC("ffn_gate_shexp.weight", p->dtype, 2, p->dim, p->ffn_dim, 0.0f, mat_std_dim);
                LSPEC("ffn_up_shexp.weight", p->dtype, 2, p->dim, p->ffn_dim, 0.0f, mat_std_dim);
                LSPEC("ffn_down_shexp.weight", p->dtype, 2, p->ffn_dim, p->dim, 0.0f,
                      1.0f / sqrtf((float)p->ffn_dim));
            }
        } else {
            if (fused) {
                LSPEC("ffn_up.weight", p->dtype, 2, p->dim, 2 * p->ffn_dim, 0.0f, mat_std_dim);
            } else {
                LSPEC("ffn_gate.weight", p->dtype, 2, p->dim, p->ffn_dim, 0.0f, mat_std_dim);
                LSPEC("ffn_up.weight", p->dtype, 2, p->dim, p->ffn_dim, 0.0f, mat_std_dim);
            }
            LSPEC("ffn_down.weight", p->dtype, 2, p->ffn_dim, p->dim, 0.0f,
                  1.0f / sqrtf((float)p->ffn_dim));
        }
        if (post_norms) LSPEC("post_ffw_norm.weight", DT_F32, 1, p->dim, 1, 1.0f, 0.1f);
#undef LSPEC
    }
#undef SPEC
    n_written = k;
    uint64_t seed_mix = p->seed;
    seed_mix = splitmix64(&seed_mix);
    for (int i = 0; i < n_written; i++) {
        tspec_t *t = &ts[i];
        if (t->n_dims >= 2) t->type = mkmodel_matrix_type(t->type, t->ne[0], t->type);
        t->seed = seed_mix ^ fnv1a(t->name);
        t->scratch = scratch;
        if (gguf_writer_add_tensor_stream(w, t->name, t->type, t->n_dims, t->ne, fill_row, t)) {
            sw_seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
            goto fail;
        }
    }
    if (gguf_writer_write(w, path)) {
        sw_seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
        goto fail;
    }
    rc = 0;
fail:
    gguf_writer_free(w);
    vocab_free(&v);
    free(strs);
    free(scores);
    free(types);
    free(scratch);
    free(ts);
    return rc;
}

/* ---------------------------------------------------------------- conversion */

typedef struct {
    const gguf_tensor_t *src;
    int type;            /* output type */
    int64_t ne[2];       /* output {ne0, rows} (rows = product of the higher dims) */
    int64_t src_rows;
    size_t src_row_bytes;
    float scale;         /* applied to the values (RMSNorm weights when padding), else 1 */
    float *scratch;      /* [max output ne0], shared */
    float *imp;          /* [output ne0] quantisation weights (column importance), owned; NULL:
                          * the reference quantiser */
} ctensor_t;

/* Output row `row`: the source row (dequantised, scaled, zero-extended), or zeros past the
 * source's rows; copied byte for byte when nothing changes. */
static int convert_row(void *user, int64_t row, void *dst, size_t row_bytes)
{
    const ctensor_t *c = user;
    const gguf_tensor_t *t = c->src;
    const char *src = (const char *)t->data + (size_t)row * c->src_row_bytes;
    if (c->type == t->type && c->ne[0] == t->ne[0] && c->scale == 1.0f) {
        if (row < c->src_rows) memcpy(dst, src, row_bytes);
        else memset(dst, 0, row_bytes);
        return 0;
    }
    float *x = c->scratch;
    memset(x, 0, (size_t)c->ne[0] * sizeof *x);
    if (row < c->src_rows) {
        dtype_dequant_row(t->type, src, x, t->ne[0]);
        if (c->scale != 1.0f)
            for (int64_t j = 0; j < t->ne[0]; j++) x[j] *= c->scale;
    }
    if (c->imp) return mkmodel_quantize_row_weighted(c->type, x, c->imp, dst, c->ne[0]);
    return mkmodel_quantize_row(c->type, x, dst, c->ne[0]);
}

static int64_t round_up(int64_t v, int64_t m)
{
    return (v + m - 1) / m * m;
}

/* 1 when name is "blk.N.<suffix>" or "<suffix>" exactly. */
static int name_is(const char *name, const char *suffix)
{
    if (strncmp(name, "blk.", 4) == 0) {
        const char *p = name + 4;
        while (*p >= '0' && *p <= '9') p++;
        if (p > name + 4 && *p == '.') name = p + 1;
    }
    return strcmp(name, suffix) == 0;
}

/* ---------------------------------------------------------------- column importance */

/* E[silu(a)^2] for a ~ N(0, v): trapezoid rule over +-8 standard deviations. */
static double silu_sq_moment(double v)
{
    enum { STEPS = 512 };
    if (!(v > 0)) return 0;
    double sd = sqrt(v), h = 16.0 * sd / STEPS, sum = 0;
    for (int k = 0; k <= STEPS; k++) {
        double a = -8.0 * sd + h * k, si = a / (1.0 + exp(-a));
        sum += (k == 0 || k == STEPS ? 0.5 : 1.0) * si * si * exp(-a * a / (2.0 * v));
    }
    return sum * h / sqrt(2.0 * M_PI * v);
}

/* Tensor "blk.<layer>.<suffix>" (layer < 0: "<suffix>"), or NULL. */
static const gguf_tensor_t *find_layer_tensor(const gguf_t *g, int layer, const char *suffix)
{
    char name[160];
    if (layer >= 0) snprintf(name, sizeof name, "blk.%d.%s", layer, suffix);
    else snprintf(name, sizeof name, "%s", suffix);
    return gguf_find_tensor(g, name);
}

/* The F32 values of 1-D tensor "blk.<layer>.<suffix>" of n elements, or NULL when absent or of
 * another shape or type. Borrowed from g. */
static const float *find_vec(const gguf_t *g, int layer, const char *suffix, int64_t n)
{
    const gguf_tensor_t *t = find_layer_tensor(g, layer, suffix);
    return t && t->n_dims == 1 && t->ne[0] == n && t->type == DT_F32 ? t->data : NULL;
}

/* out[r] = sum_c W[r][c]^2 v[c] (+ bias[r]^2 when the tensor has one) for the rows of matrix
 * "blk.<layer>.<suffix>.weight" with ne0 columns; *rows gets its row count. NULL when absent,
 * of another width or type, or out of memory; the caller frees the result. */
static double *rows_sq(const gguf_t *g, int layer, const char *suffix, const float *v, int64_t ne0,
                       int64_t *rows)
{
    char name[160];
    snprintf(name, sizeof name, "blk.%d.%s.weight", layer, suffix);
    const gguf_tensor_t *t = gguf_find_tensor(g, name);
    if (!t || t->n_dims != 2 || t->ne[0] != ne0 || !dtype_supported(t->type)) return NULL;
    size_t rb = dtype_row_bytes(t->type, ne0);
    double *out = calloc((size_t)t->ne[1], sizeof *out);
    float *row = malloc(sizeof *row * (size_t)ne0);
    if (!out || !row || !rb) goto fail;
    snprintf(name, sizeof name, "%s.bias", suffix);
    const float *bias = find_vec(g, layer, name, t->ne[1]);
    for (int64_t r = 0; r < t->ne[1]; r++) {
        dtype_dequant_row(t->type, (const char *)t->data + (size_t)r * rb, row, ne0);
        double acc = bias ? (double)bias[r] * bias[r] : 0.0;
        for (int64_t c = 0; c < ne0; c++) acc += (double)row[c] * row[c] * v[c];
        out[r] = acc;
    }
    free(row);
    *rows = t->ne[1];
    return out;
fail:
    free(out);
    free(row);
    return NULL;
}

/* Column importance of matrix t (llama/qwen2 names): the expected square of each input lane,
 * estimated from the model's own weights for a normalised residual stream of independent unit
 * lanes: g[c]^2 for the matrices reading an RMSNorm (attn_q/k/v: attn_norm, ffn_gate/up:
 * ffn_norm, output: output_norm); for ffn_down E[silu(a)^2] E[b^2] with E[a^2] and E[b^2] the
 * squared norms of ffn_gate's and ffn_up's rows against ffn_norm^2; for attn_output the value
 * lane's E[v^2] (attn_v's rows against attn_norm^2, plus its bias; an attention-weighted mean
 * of values is taken to keep that scale), head h reading kv head h / (n_heads / n_kv_heads).
 * Minimising sum_c imp[c] (dW[r][c])^2 minimises the expected squared error of each output.
 * Returns a new array [out_ne0] (floored at 1e-4 of the mean, also past t's columns (padding):
 * no value is free, zeros stay exactly zero), or NULL when t is not such a matrix or a tensor it needs is missing (the
 * caller then uses the reference quantiser). n_heads: the model's head count (0: unknown). */
static float *column_importance(const gguf_t *g, const gguf_tensor_t *t, int64_t n_heads,
                                int64_t out_ne0)
{
    const char *nm = t->name;
    int layer = -1;
    if (strncmp(nm, "blk.", 4) == 0) layer = atoi(nm + 4);
    int64_t ne0 = t->ne[0], na = 0, nb = 0;
    double *va = NULL, *vb = NULL;
    float *g2 = NULL, *imp = NULL;
    const char *norm = NULL;
    if (name_is(nm, "attn_q.weight") || name_is(nm, "attn_k.weight") ||
        name_is(nm, "attn_v.weight") || name_is(nm, "attn_output.weight"))
        norm = "attn_norm.weight";
    else if (name_is(nm, "ffn_gate.weight") || name_is(nm, "ffn_up.weight") ||
             name_is(nm, "ffn_down.weight"))
        norm = "ffn_norm.weight";
    else if (!strcmp(nm, "output.weight"))
        norm = "output_norm.weight";
    if (!norm || (norm[0] != 'o' && layer < 0) || out_ne0 < ne0) return NULL;
    const float *gn = NULL;
    int64_t dim = 0;
    const gguf_tensor_t *nt = find_layer_tensor(g, layer, norm);
    if (!nt || nt->n_dims != 1) return NULL;
    dim = nt->ne[0];
    gn = find_vec(g, layer, norm, dim);
    if (!gn || !(g2 = malloc(sizeof *g2 * (size_t)dim)) ||
        !(imp = calloc((size_t)out_ne0, sizeof *imp)))
        goto fail;
    for (int64_t c = 0; c < dim; c++) g2[c] = gn[c] * gn[c];
    if (name_is(nm, "ffn_down.weight")) {
        va = rows_sq(g, layer, "ffn_gate", g2, dim, &na);
        vb = rows_sq(g, layer, "ffn_up", g2, dim, &nb);
        if (!va || !vb || na != ne0 || nb != ne0) goto fail;
        for (int64_t f = 0; f < ne0; f++) imp[f] = (float)(silu_sq_moment(va[f]) * vb[f]);
    } else if (name_is(nm, "attn_output.weight")) {
        va = rows_sq(g, layer, "attn_v", g2, dim, &na);
        if (!va || n_heads <= 0 || ne0 % n_heads) goto fail;
        int64_t hd = ne0 / n_heads;
        if (na % hd || na / hd <= 0 || n_heads % (na / hd)) goto fail;
        int64_t group = n_heads / (na / hd);
        for (int64_t c = 0; c < ne0; c++) imp[c] = (float)va[(c / hd / group) * hd + c % hd];
    } else {
        if (dim != ne0) goto fail;
        for (int64_t c = 0; c < ne0; c++) imp[c] = g2[c];
    }
    double mean = 0;
    for (int64_t c = 0; c < ne0; c++) {
        if (!(imp[c] >= 0.0f) || isinf(imp[c])) goto fail;
        mean += imp[c];
    }
    mean /= (double)ne0;
    if (!(mean > 0)) goto fail;
    for (int64_t c = 0; c < out_ne0; c++)
        if (!(imp[c] >= 1e-4 * mean)) imp[c] = (float)(1e-4 * mean);
    free(va);
    free(vb);
    free(g2);
    return imp;
fail:
    free(va);
    free(vb);
    free(g2);
    free(imp);
    return NULL;
}

int mkmodel_convert(const char *src, const char *dst, const mkmodel_convert_t *c, FILE *log,
                    char *errstr, size_t errlen)
{
    if (!src || !dst || !c) return sw_seterr(errstr, errlen, "mkmodel: NULL argument");
    if (!dtype_supported(c->dtype))
        return sw_seterr(errstr, errlen, "mkmodel: dtype %s not supported; supported: %s",
                      dtype_name(c->dtype), DTYPE_SUPPORTED_LIST);
    if (c->pad < 0 || c->pad > 65536)
        return sw_seterr(errstr, errlen, "mkmodel: pad %d not in 0..65536", c->pad);
    if (c->quant != MKMODEL_QUANT_IMPORTANCE && c->quant != MKMODEL_QUANT_GGML)
        return sw_seterr(errstr, errlen, "mkmodel: unknown quantiser %d", c->quant);
    int rc = -1;
    gguf_writer_t *w = NULL;
    ctensor_t *ct = NULL;
    float *scratch = NULL;
    gguf_t *g = gguf_open(src, errstr, errlen);
    if (!g) return -1;
    w = gguf_writer_new();
    int64_t nt = gguf_n_tensors(g);
    ct = calloc((size_t)(nt ? nt : 1), sizeof *ct);
    if (!w || !ct) {
        sw_seterr(errstr, errlen, "mkmodel: out of memory");
        goto fail;
    }
    char arch[64] = "";
    {
        gguf_str_t a;
        if (gguf_get_str(g, "general.architecture", &a) == 0 && a.len < sizeof arch) {
            memcpy(arch, a.ptr, a.len);
            arch[a.len] = 0;
        }
    }
    int64_t n_heads_any = 0;
    {
        char k_h[96];
        snprintf(k_h, sizeof k_h, "%s.attention.head_count", arch);
        if (gguf_get_i64(g, k_h, &n_heads_any)) n_heads_any = 0;
    }
    /* Padding: the hyper-parameters it changes. */
    int64_t dim = 0, ffn = 0, n_heads = 0, head_dim = 0, dim2 = 0, ffn2 = 0;
    float eps = 1e-5f, nscale = 1.0f;
    char k_dim[96], k_ffn[96], k_eps[96], k_kl[96], k_vl[96];
    snprintf(k_dim, sizeof k_dim, "%s.embedding_length", arch);
    snprintf(k_ffn, sizeof k_ffn, "%s.feed_forward_length", arch);
    snprintf(k_eps, sizeof k_eps, "%s.attention.layer_norm_rms_epsilon", arch);
    snprintf(k_kl, sizeof k_kl, "%s.attention.key_length", arch);
    snprintf(k_vl, sizeof k_vl, "%s.attention.value_length", arch);
    if (c->pad) {
        char k_h[96];
        snprintf(k_h, sizeof k_h, "%s.attention.head_count", arch);
        if ((strcmp(arch, "llama") && strcmp(arch, "qwen2")) || gguf_get_i64(g, k_dim, &dim) ||
            gguf_get_i64(g, k_ffn, &ffn) || gguf_get_i64(g, k_h, &n_heads) || dim <= 0 ||
            ffn <= 0 || n_heads <= 0 || dim % n_heads) {
            sw_seterr(errstr, errlen, "mkmodel: --pad needs a llama or qwen2 model with its "
                   "embedding_length, feed_forward_length and head_count");
            goto fail;
        }
        if (gguf_get_i64(g, k_kl, &head_dim)) head_dim = dim / n_heads;
        if (gguf_find_key(g, k_eps) >= 0 && gguf_get_f32(g, k_eps, &eps)) {
            sw_seterr(errstr, errlen, "mkmodel: bad %s", k_eps);
            goto fail;
        }
        dim2 = round_up(dim, c->pad);
        ffn2 = round_up(ffn, c->pad);
        nscale = (float)sqrt((double)dim / (double)dim2);
    }

    /* Metadata: everything but what changes, then the changed values. */
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        if (!strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version") ||
            !strcmp(key, "general.name"))
            continue;
        if (c->pad && (!strcmp(key, k_dim) || !strcmp(key, k_ffn) || !strcmp(key, k_eps) ||
                       !strcmp(key, k_kl) || !strcmp(key, k_vl)))
            continue;
        if (gguf_writer_copy_kv(w, g, i)) {
            sw_seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
            goto fail;
        }
    }
    int e = 0;
    {
        char name[160];
        gguf_str_t on;
        int have = gguf_get_str(g, "general.name", &on) == 0;
        snprintf(name, sizeof name, "%.*s-%s%s", have ? (int)(on.len > 100 ? 100 : on.len) : 5,
                 have ? on.ptr : "model", dtype_name(c->dtype), c->pad ? "-padded" : "");
        e |= gguf_writer_add_str(w, "general.name", name);
    }
    e |= gguf_writer_add_u32(w, "general.file_type", (uint32_t)file_type_of(c->dtype));
    if (dtype_block_elems(c->dtype) > 1)
        e |= gguf_writer_add_u32(w, "general.quantization_version", 2);
    if (c->pad) {
        e |= gguf_writer_add_u32(w, k_dim, (uint32_t)dim2);
        e |= gguf_writer_add_u32(w, k_ffn, (uint32_t)ffn2);
        e |= gguf_writer_add_f32(w, k_eps, (float)((double)eps * (double)dim / (double)dim2));
        e |= gguf_writer_add_u32(w, k_kl, (uint32_t)head_dim);
        e |= gguf_writer_add_u32(w, k_vl, (uint32_t)head_dim);
    }
    if (e) {
        sw_seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
        goto fail;
    }

    /* Tensors, in the source's order. */
    int64_t max_ne0 = 1, n_conv = 0, n_fallback = 0, n_imp = 0;
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);
        ctensor_t *x = &ct[i];
        x->src = t;
        x->type = t->type;
        x->scale = 1.0f;
        x->ne[0] = t->ne[0];
        x->src_rows = t->ne[1] * t->ne[2] * t->ne[3];
        x->ne[1] = x->src_rows;
        x->src_row_bytes = dtype_ggml_block_elems(t->type)
                               ? (size_t)(t->ne[0] / dtype_ggml_block_elems(t->type)) *
                                     dtype_ggml_block_bytes(t->type)
                               : 0;
        int n_dims = t->n_dims;
        if (c->pad) {
            const char *nm = t->name;
            int in_dim = 0, in_ffn = 0, out_dim = 0, out_ffn = 0, norm = 0;
            if (name_is(nm, "token_embd.weight") || name_is(nm, "output.weight") ||
                name_is(nm, "attn_q.weight") || name_is(nm, "attn_k.weight") ||
                name_is(nm, "attn_v.weight"))
                in_dim = 1;
            else if (name_is(nm, "attn_output.weight"))
                out_dim = 1;
            else if (name_is(nm, "ffn_gate.weight") || name_is(nm, "ffn_up.weight"))
                in_dim = out_ffn = 1;
            else if (name_is(nm, "ffn_down.weight"))
                in_ffn = out_dim = 1;
            else if (name_is(nm, "attn_norm.weight") || name_is(nm, "ffn_norm.weight") ||
                     name_is(nm, "output_norm.weight"))
                norm = 1;
            int64_t want0 = in_dim || norm ? dim : in_ffn ? ffn : t->ne[0];
            int64_t want1 = out_dim ? dim : out_ffn ? ffn : x->src_rows;
            if (t->ne[0] != want0 || x->src_rows != want1 || (norm && n_dims != 1) ||
                ((in_dim || in_ffn || out_dim) && n_dims != 2)) {
                sw_seterr(errstr, errlen, "mkmodel: --pad: tensor '%s' has an unexpected shape", nm);
                goto fail;
            }
            if (in_dim || norm) x->ne[0] = dim2;
            if (in_ffn) x->ne[0] = ffn2;
            if (out_dim) x->ne[1] = dim2;
            if (out_ffn) x->ne[1] = ffn2;
            if (norm) x->scale = nscale;
            if ((x->ne[0] != t->ne[0] || norm) && !dtype_supported(t->type)) {
                sw_seterr(errstr, errlen, "mkmodel: --pad: tensor '%s' has type %s", nm,
                       dtype_name(t->type));
                goto fail;
            }
            if (norm) x->type = DT_F32; /* scaled values: stored exactly */
        }
        if (n_dims == 2 && dtype_supported(t->type)) {
            x->type = mkmodel_matrix_type(c->dtype, x->ne[0], t->type);
            n_conv++;
            if (x->type != c->dtype) {
                n_fallback++;
                if (log)
                    fprintf(log, "mkmodel: %s: rows of %lld elements do not fit %s blocks of "
                            "%d: written as %s\n", t->name, (long long)x->ne[0],
                            dtype_name(c->dtype), dtype_block_elems(c->dtype),
                            dtype_name(x->type));
            }
        }
        if (n_dims == 2 && c->quant == MKMODEL_QUANT_IMPORTANCE && x->type != t->type &&
            (x->type == DT_Q4_0 || x->type == DT_Q4_K)) {
            x->imp = column_importance(g, t, n_heads_any, x->ne[0]);
            if (!x->imp) { /* no estimate for this matrix: every column alike */
                x->imp = malloc(sizeof *x->imp * (size_t)x->ne[0]);
                if (!x->imp) {
                    sw_seterr(errstr, errlen, "mkmodel: out of memory");
                    goto fail;
                }
                for (int64_t j = 0; j < x->ne[0]; j++) x->imp[j] = 1.0f;
            } else {
                n_imp++;
            }
        }
        if (x->ne[0] > max_ne0) max_ne0 = x->ne[0];
        int64_t ne[GGUF_MAX_DIMS] = {x->ne[0], 1, 1, 1};
        if (n_dims == 2 && x->ne[1] != x->src_rows) {
            ne[1] = x->ne[1];
        } else {
            for (int d = 1; d < GGUF_MAX_DIMS; d++) ne[d] = t->ne[d];
        }
        if (gguf_writer_add_tensor_stream(w, t->name, x->type, n_dims, ne, convert_row, x)) {
            sw_seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
            goto fail;
        }
    }
    scratch = malloc(sizeof *scratch * (size_t)max_ne0);
    if (!scratch) {
        sw_seterr(errstr, errlen, "mkmodel: out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < nt; i++) ct[i].scratch = scratch;
    if (gguf_writer_write(w, dst)) {
        sw_seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
        goto fail;
    }
    if (log)
        fprintf(log, "mkmodel: %s -> %s: %lld of %lld tensors are matrices re-rounded to %s, %lld "
                "of them fell back%s; quantiser %s (%lld matrices with estimated input lanes)\n",
                src, dst, (long long)n_conv, (long long)nt, dtype_name(c->dtype),
                (long long)n_fallback, c->pad ? " (dimensions padded)" : "",
                c->quant == MKMODEL_QUANT_IMPORTANCE ? "importance" : "ggml", (long long)n_imp);
    rc = 0;
fail:
    gguf_writer_free(w);
    for (int64_t i = 0; ct && i < nt; i++) free(ct[i].imp);
    free(ct);
    free(scratch);
    gguf_close(g);
    return rc;
}
