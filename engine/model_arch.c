/* engine/model_arch.c: the architecture table and RoPE tables (see model_arch.h). */
#include "model_arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "dtype.h"

/* One row per architecture: the features it switches on over llama's forward pass. */
typedef struct {
    const char *name;
    int arch;
    int rope_kind;
    int qk_norm, post_norms, ffn_act, embd_scaled, qkv_bias, fused;
    int swa_pattern;      /* llama.cpp's default layer pattern when a window is set */
} arch_row_t;

static const arch_row_t ARCHS[] = {
    /* name     arch         rope       qkn pn act            emb bias fused pattern */
    {"llama",  ARCH_LLAMA,  ROPE_NORM, 0,  0, FFN_SILU,      0,  0,   0,    0},
    {"qwen2",  ARCH_QWEN2,  ROPE_NEOX, 0,  0, FFN_SILU,      0,  1,   0,    0},
    {"qwen3",  ARCH_QWEN3,  ROPE_NEOX, 1,  0, FFN_SILU,      0,  0,   0,    0},
    {"gemma2", ARCH_GEMMA2, ROPE_NEOX, 0,  1, FFN_GELU_TANH, 1,  0,   0,    2},
    {"gemma3", ARCH_GEMMA3, ROPE_NEOX, 1,  1, FFN_GELU_TANH, 1,  0,   0,    6},
    {"phi3",   ARCH_PHI3,   ROPE_NEOX, 0,  0, FFN_SILU,      0,  0,   1,    0},
    /* mixture of experts (engine/cpu/moe.h): the FFN is routed, see model.c moe_hparams */
    {"qwen2moe", ARCH_QWEN2MOE, ROPE_NEOX, 0, 0, FFN_SILU,  0,  1,   0,    0},
    {"qwen3moe", ARCH_QWEN3MOE, ROPE_NEOX, 1, 0, FFN_SILU,  0,  0,   0,    0},
};

static const arch_row_t *row_of(int arch)
{
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (ARCHS[i].arch == arch) return &ARCHS[i];
    return NULL;
}

int model_arch_lookup(hparams_t *hp)
{
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++) {
        const arch_row_t *r = &ARCHS[i];
        if (strcmp(hp->arch_name, r->name)) continue;
        hp->arch = r->arch;
        hp->rope_kind = r->rope_kind;
        hp->qk_norm = r->qk_norm;
        hp->post_norms = r->post_norms;
        hp->ffn_act = r->ffn_act;
        hp->embd_scale = 1.0f;
        hp->attn_softcap = 0.0f;
        hp->logit_softcap = 0.0f;
        hp->swa_window = 0;
        hp->swa_pattern = r->swa_pattern;
        return 0;
    }
    return -1;
}

int model_arch_has_qkv_bias(int arch)
{
    const arch_row_t *r = row_of(arch);
    return r && r->qkv_bias;
}

int model_arch_fused(int arch)
{
    const arch_row_t *r = row_of(arch);
    return r && r->fused;
}

int model_arch_f32(const gguf_t *g, const char *arch, const char *suffix, float def, float *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_find_key(g, key) < 0) {
        *out = def;
        return 0;
    }
    return gguf_get_f32(g, key, out);
}

int model_arch_hparams(const gguf_t *g, hparams_t *hp, char *errstr, size_t errlen)
{
    const char *a = hp->arch_name;
    const arch_row_t *r = row_of(hp->arch);
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->rope_theta_swa = hp->rope_theta;
    if (r->embd_scaled) hp->embd_scale = sqrtf((float)hp->dim);
    if (hp->arch == ARCH_GEMMA2 || hp->arch == ARCH_GEMMA3) {
        /* Gemma 2 27B (46 layers) and Gemma 3 27B (62 layers) scale queries by
         * 1/sqrt(dim / n_heads) (query_pre_attn_scalar), the others by 1/sqrt(head_dim). */
        if ((hp->arch == ARCH_GEMMA2 && hp->n_layers == 46) ||
            (hp->arch == ARCH_GEMMA3 && hp->n_layers == 62))
            hp->attn_scale = 1.0f / sqrtf((float)(hp->dim / hp->n_heads));
    }
    if (hp->arch == ARCH_GEMMA2) {
        if (model_arch_f32(g, a, "attn_logit_softcapping", 50.0f, &hp->attn_softcap) ||
            model_arch_f32(g, a, "final_logit_softcapping", 30.0f, &hp->logit_softcap) ||
            !(hp->attn_softcap == 0 || hp->attn_softcap >= 1e-3f) ||
            !(hp->logit_softcap == 0 || hp->logit_softcap >= 1e-3f) || !isfinite(hp->attn_softcap) ||
            !isfinite(hp->logit_softcap)) {
            sw_seterr(errstr, errlen, "model: bad %s soft-capping values (0 = none, else >= 0.001)", a);
            return -1;
        }
    }
    if (hp->arch == ARCH_GEMMA3 &&
        (model_arch_f32(g, a, "rope.freq_base_swa", 10000.0f, &hp->rope_theta_swa) ||
         !(hp->rope_theta_swa > 0) || !isfinite(hp->rope_theta_swa))) {
        sw_seterr(errstr, errlen, "model: bad %s.rope.freq_base_swa", a);
        return -1;
    }
    /* The sliding window: honoured by gemma2, gemma3 and llama (every layer local); phi3's is
     * read and switched off as llama.cpp does (full attention); qwen2/qwen3 do not have one. */
    if (hp->arch == ARCH_GEMMA2 || hp->arch == ARCH_GEMMA3 || hp->arch == ARCH_LLAMA) {
        int64_t w, pat;
        if (model_arch_int(g, a, "attention.sliding_window", 0, &w) || w < 0 || w > INT32_MAX / 2) {
            sw_seterr(errstr, errlen, "model: bad %s.attention.sliding_window", a);
            return -1;
        }
        hp->swa_window = (int)w;
        char key[128];
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
        int et;
        uint64_t n;
        if (gguf_get_arr(g, key, &et, &n) != 0) {
            if (model_arch_int(g, a, "attention.sliding_window_pattern", hp->swa_pattern, &pat) ||
                pat < 0 || pat > 1 << 20) {
                sw_seterr(errstr, errlen, "model: bad %s", key);
                return -1;
            }
            hp->swa_pattern = (int)pat;
        }
    }
    return 0;
}

/* Element l of a per-layer bool / integer array: 1, 0, or -1 when not such an array. */
static int layer_flag(const gguf_t *g, const char *key, int l, int n_layers)
{
    int et;
    uint64_t n;
    if (gguf_get_arr(g, key, &et, &n) != 0 || n != (uint64_t)n_layers) return -1;
    const unsigned char *d = gguf_get_arr_data(g, key);
    switch (et) {
    case GGUF_BOOL: case GGUF_UINT8: case GGUF_INT8: return d[l] != 0;
    case GGUF_INT32: case GGUF_UINT32: {
        int32_t v;
        memcpy(&v, d + 4 * (size_t)l, 4);
        return v != 0;
    }
    default: return -1;
    }
}

int model_kv_window(const model_t *m)
{
    int w = 0;
    for (int l = 0; l < m->hp.n_layers; l++) {
        if (m->layers[l].window <= 0) return 0;
        w = m->layers[l].window > w ? m->layers[l].window : w;
    }
    return w;
}

int model_select_context(model_t *m, int n_ctx)
{
    hparams_t *hp = &m->hp;
    int want = n_ctx > m->rope_orig_ctx && m->rope_factors[1];
    if (!m->rope_factors[0] && !m->rope_factors[1]) return 0;
    if (want == hp->rope_long) return 0;
    const float *ff = m->rope_factors[want];
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        double f = pow((double)hp->rope_theta, -2.0 * i / (double)hp->rope_dim);
        if (ff) {
            float fac;
            memcpy(&fac, ff + i, 4);
            f /= fac;
        }
        m->rope_inv_freq[i] = (float)f;
    }
    hp->rope_long = want;
    /* another RoPE, other K in the cache: another fingerprint (and KV block names) */
    m->fingerprint = m->fingerprint * 0x9e3779b97f4a7c15ull + 0x6c6f6e67726f7065ull + (uint64_t)want;
    return 1;
}

int model_arch_layers(model_t *m, char *errstr, size_t errlen)
{
    const hparams_t *hp = &m->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", hp->arch_name);
    int et;
    uint64_t n;
    int has_arr = gguf_get_arr(m->gguf, key, &et, &n) == 0;
    for (int l = 0; l < hp->n_layers; l++) {
        layer_weights_t *L = &m->layers[l];
        int local = 0;
        if (hp->swa_window > 0) {
            if (has_arr) {
                local = layer_flag(m->gguf, key, l, hp->n_layers);
                if (local < 0) {
                    sw_seterr(errstr, errlen, "model: %s must be an integer or one bool per layer",
                              key);
                    return -1;
                }
            } else {
                local = hp->swa_pattern == 0 || l % hp->swa_pattern < hp->swa_pattern - 1;
            }
        }
        L->window = local ? hp->swa_window : 0;
        L->rope_idx = local && m->rope_inv_freq_swa ? 1 : 0;
    }
    return 0;
}

static int str_is(gguf_str_t s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

/* A 1-D F32 tensor of n elements, all positive and finite, or NULL (errstr set when present
 * but wrong: *bad = 1). */
static const float *factor_tensor(const gguf_t *g, const char *name, int n, int *bad, char *errstr,
                                  size_t errlen)
{
    const gguf_tensor_t *t = gguf_find_tensor(g, name);
    if (!t) return NULL;
    if (t->type != DT_F32 || t->n_dims != 1 || t->ne[0] != n) {
        sw_seterr(errstr, errlen, "model: tensor '%s' must be F32 {%d}", name, n);
        *bad = 1;
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        float f;
        memcpy(&f, (const char *)t->data + 4 * (size_t)i, 4);
        if (!(f > 0) || !isfinite(f)) {
            sw_seterr(errstr, errlen, "model: %s[%d] is not a positive number", name, i);
            *bad = 1;
            return NULL;
        }
    }
    return t->data;
}

/* ggml's YaRN correction dimension: the pair index whose wavelength fits n_rot turns in the
 * original context. */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) /
           (2.0f * logf(base));
}

int model_rope_init(model_t *m, char *errstr, size_t errlen)
{
    const gguf_t *g = m->gguf;
    hparams_t *hp = &m->hp;
    const char *a = hp->arch_name;
    const int half = hp->rope_dim / 2;
    char key[128];
    gguf_str_t st = {0};
    enum { SC_LINEAR, SC_NONE, SC_YARN, SC_LONGROPE, SC_LLAMA3 } type = SC_LINEAR;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (gguf_find_key(g, key) >= 0) {
        if (gguf_get_str(g, key, &st) != 0) {
            sw_seterr(errstr, errlen, "model: %s must be a string", key);
            return -1;
        }
        if (str_is(st, "none")) type = SC_NONE;
        else if (str_is(st, "linear")) type = SC_LINEAR;
        else if (str_is(st, "yarn")) type = SC_YARN;
        else if (str_is(st, "longrope")) type = SC_LONGROPE;
        else if (str_is(st, "llama3")) type = SC_LLAMA3;
        else {
            sw_seterr(errstr, errlen, "model: RoPE scaling type '%.*s' is not supported; supported: "
                      "none, linear, yarn, longrope, llama3", (int)(st.len > 32 ? 32 : st.len), st.ptr);
            return -1;
        }
    }
    /* llama.cpp: the factor is rope.scaling.factor, else rope.scale_linear; scaling type "none"
     * ignores it. Llama 3's factor is in its frequency factors instead. */
    float factor = 0.0f, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f;
    int64_t orig_ctx;
    if (model_arch_f32(g, a, "rope.scale_linear", 0.0f, &factor) ||
        model_arch_f32(g, a, "rope.scaling.factor", factor, &factor) || !(factor >= 0) ||
        !isfinite(factor) ||
        model_arch_f32(g, a, "rope.scaling.attn_factor", 1.0f, &attn_factor) ||
        !(attn_factor > 0) || !isfinite(attn_factor) ||
        model_arch_f32(g, a, "rope.scaling.yarn_beta_fast", 32.0f, &beta_fast) ||
        model_arch_f32(g, a, "rope.scaling.yarn_beta_slow", 1.0f, &beta_slow) ||
        !(beta_fast > 0) || !(beta_slow > 0) || !isfinite(beta_fast) || !isfinite(beta_slow) ||
        model_arch_int(g, a, "rope.scaling.original_context_length", hp->ctx_len, &orig_ctx) ||
        orig_ctx <= 0 || orig_ctx > INT32_MAX) {
        sw_seterr(errstr, errlen, "model: bad %s.rope.scaling values", a);
        return -1;
    }
    if (factor == 0.0f || type == SC_NONE || type == SC_LLAMA3) factor = 1.0f;
    hp->rope_freq_scale = 1.0f / factor;

    m->rope_inv_freq = malloc(sizeof(float) * (size_t)half);
    if (!m->rope_inv_freq) {
        sw_seterr(errstr, errlen, "model: out of memory");
        return -1;
    }
    int bad = 0;
    const float *ff = factor_tensor(g, "rope_freqs.weight", half, &bad, errstr, errlen);
    if (bad) return -1;
    if (!ff) {
        /* Phi-3 LongRoPE: long factors when the context served (the model's, until
         * model_select_context) is past the original one. */
        m->rope_factors[0] = factor_tensor(g, "rope_factors_short.weight", half, &bad, errstr, errlen);
        if (bad) return -1;
        m->rope_factors[1] = factor_tensor(g, "rope_factors_long.weight", half, &bad, errstr, errlen);
        if (bad) return -1;
        m->rope_orig_ctx = (int)orig_ctx;
        hp->rope_long = hp->ctx_len > orig_ctx && m->rope_factors[1];
        ff = m->rope_factors[hp->rope_long];
    }
    float l3_factor = 1.0f, l3_low = 1.0f, l3_high = 4.0f;
    if (type == SC_LLAMA3 && !ff) {
        /* Llama 3 frequency scaling from its keys when the converter wrote no rope_freqs. */
        if (model_arch_f32(g, a, "rope.scaling.factor", 1.0f, &l3_factor) || !(l3_factor >= 1) ||
            model_arch_f32(g, a, "rope.scaling.low_freq_factor", 1.0f, &l3_low) ||
            model_arch_f32(g, a, "rope.scaling.high_freq_factor", 4.0f, &l3_high) ||
            !(l3_low > 0) || !(l3_high > l3_low) || !isfinite(l3_factor) || !isfinite(l3_high)) {
            sw_seterr(errstr, errlen, "model: bad %s llama3 RoPE scaling keys", a);
            return -1;
        }
    }
    for (int i = 0; i < half; i++) {
        double f = pow((double)hp->rope_theta, -2.0 * i / (double)hp->rope_dim);
        if (ff) {
            float fac;
            memcpy(&fac, ff + i, 4);
            f /= fac;
        } else if (type == SC_LLAMA3 && l3_factor > 1.0f) {
            double wavelen = 2.0 * M_PI / f;
            double lo_wl = (double)orig_ctx / l3_low, hi_wl = (double)orig_ctx / l3_high;
            double fac = 1.0;
            if (wavelen > lo_wl) {
                fac = l3_factor;
            } else if (wavelen >= hi_wl) {
                double smooth = ((double)orig_ctx / wavelen - l3_low) / (l3_high - l3_low);
                fac = 1.0 / ((1.0 - smooth) / l3_factor + smooth);
            }
            f /= fac;
        }
        m->rope_inv_freq[i] = (float)f;
    }
    rope_table_t *r = &m->rope[0];
    r->inv_freq = m->rope_inv_freq;
    r->freq_scale = hp->rope_freq_scale;
    r->ext_factor = 0.0f;
    r->corr_lo = r->corr_hi = 0.0f;
    r->mscale = attn_factor;
    if (type == SC_YARN) {
        /* llama.cpp: ext_factor 1; the magnitude (1 + 0.1 ln factor) is applied once, inside
         * the rotation (its host-side factor and the cancel of it multiply to 1). */
        r->ext_factor = 1.0f;
        float lo = floorf(yarn_corr_dim(hp->rope_dim, (int)orig_ctx, beta_fast, hp->rope_theta));
        float hi = ceilf(yarn_corr_dim(hp->rope_dim, (int)orig_ctx, beta_slow, hp->rope_theta));
        r->corr_lo = lo > 0 ? lo : 0;
        r->corr_hi = hi < hp->rope_dim - 1 ? hi : (float)(hp->rope_dim - 1);
        float mfac = factor > 1.0f ? 1.0f + 0.1f * logf(factor) : 1.0f;
        r->mscale = mfac / (1.0f + 0.1f * logf(factor)) * attn_factor *
                    (1.0f + 0.1f * logf(1.0f / hp->rope_freq_scale));
    }
    /* Local layers: their own base (gemma3's rope.freq_base_swa), no scaling. */
    m->rope[1] = m->rope[0];
    if (hp->rope_theta_swa != hp->rope_theta) {
        m->rope_inv_freq_swa = malloc(sizeof(float) * (size_t)half);
        if (!m->rope_inv_freq_swa) {
            sw_seterr(errstr, errlen, "model: out of memory");
            return -1;
        }
        for (int i = 0; i < half; i++)
            m->rope_inv_freq_swa[i] =
                (float)pow((double)hp->rope_theta_swa, -2.0 * i / (double)hp->rope_dim);
        rope_table_t *s = &m->rope[1];
        s->inv_freq = m->rope_inv_freq_swa;
        s->freq_scale = 1.0f;
        s->ext_factor = 0.0f;
        s->corr_lo = s->corr_hi = 0.0f;
        s->mscale = attn_factor;
    }
    return 0;
}
