/* engine/model.c: binds a GGUF file's tensors to a Llama-family layer structure. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/err.h"
#include "dtype.h"
#include "model_arch.h"

int model_arch_int(const gguf_t *g, const char *arch, const char *suffix, int64_t def,
                        int64_t *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_find_key(g, key) < 0) {
        *out = def;
        return 0;
    }
    if (gguf_get_i64(g, key, out) == 0) return 0;
    /* Some files store a per-layer array (e.g. head_count_kv); accept it when all equal. */
    int et;
    uint64_t n;
    if (gguf_get_arr(g, key, &et, &n) == 0 && n > 0 && (et == GGUF_INT32 || et == GGUF_UINT32)) {
        const unsigned char *d = gguf_get_arr_data(g, key);
        int32_t first, v;
        memcpy(&first, d, 4);
        for (uint64_t i = 1; i < n; i++) {
            memcpy(&v, d + 4 * i, 4);
            if (v != first) return -1;
        }
        *out = first;
        return 0;
    }
    return -1;
}

#define get_arch_f32 model_arch_f32

/* Binds tensor `name` of shape {cols, rows} (rows = 1 for vectors). required: missing is an
 * error; otherwise w->data stays NULL. */
static int bind(const model_t *m, weight_t *w, const char *name, int64_t cols, int64_t rows,
                int required, char *errstr, size_t errlen)
{
    const gguf_tensor_t *t = gguf_find_tensor(m->gguf, name);
    memset(w, 0, sizeof *w);
    if (!t) {
        if (!required) return 0;
        sw_seterr(errstr, errlen, "model: tensor '%s' is missing", name);
        return -1;
    }
    int64_t trows = 1;
    for (int d = 1; d < t->n_dims; d++) trows *= t->ne[d];
    if (t->ne[0] != cols || trows != rows) {
        sw_seterr(errstr, errlen,
                  "model: tensor '%s' has shape {%lld, %lld}, expected {%lld, %lld}", name,
                  (long long)t->ne[0], (long long)trows, (long long)cols, (long long)rows);
        return -1;
    }
    if (!dtype_supported(t->type)) {
        sw_seterr(errstr, errlen, "model: tensor '%s' has type %s; supported types: %s", name,
                  dtype_name(t->type), DTYPE_SUPPORTED_LIST);
        return -1;
    }
    w->type = t->type;
    w->data = t->data;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = dtype_row_bytes(t->type, cols);
    if (w->row_bytes == 0) {
        sw_seterr(errstr, errlen, "model: tensor '%s': row of %lld elements does not fit type %s",
                  name, (long long)cols, dtype_name(t->type));
        return -1;
    }
    return 0;
}

/* Rows [r0, r0 + n) of w as a weight of their own (a view into w's data). */
static weight_t model_weight_rows(const weight_t *w, int64_t r0, int64_t n)
{
    weight_t v = *w;
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.rows = n;
    return v;
}

/* Converts a bound vector weight to F32 into dst (n floats) and repoints w at it. */
static void to_f32(weight_t *w, float *dst)
{
    for (int64_t r = 0; r < w->rows; r++)
        dtype_dequant_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes,
                          dst + r * w->cols, w->cols);
    w->type = DT_F32;
    w->data = dst;
    w->row_bytes = (size_t)w->cols * 4;
}

/* Mixture-of-experts hyper-parameters of hp's architecture (hp->n_expert stays 0 for a dense
 * model). qwen2moe and qwen3moe are always MoE; llama is when llama.expert_count > 0. Defaults
 * are llama.cpp's: an expert's FFN size is <arch>.expert_feed_forward_length, else ffn (llama)
 * or ffn / expert_used_count (qwen*moe); qwen2moe's shared expert is
 * <arch>.expert_shared_feed_forward_length, else ffn. The k routing weights are renormalised
 * for llama and qwen3moe, not for qwen2moe. */
static int moe_hparams(const gguf_t *g, hparams_t *hp, int64_t ffn, char *errstr, size_t errlen)
{
    const char *a = hp->arch_name;
    int moe_arch = hp->arch == ARCH_QWEN2MOE || hp->arch == ARCH_QWEN3MOE;
    int64_t ne, nu, eff, sff = 0;
    if (model_arch_int(g, a, "expert_count", 0, &ne) || ne < 0 || ne > MODEL_MAX_EXPERTS) {
        sw_seterr(errstr, errlen, "model: %s.expert_count must be 0..%d", a, MODEL_MAX_EXPERTS);
        return -1;
    }
    if (ne == 0 && !moe_arch) return 0;
    if (ne == 0) {
        sw_seterr(errstr, errlen, "model: %s needs %s.expert_count >= 1", a, a);
        return -1;
    }
    if (hp->arch == ARCH_QWEN2) {
        sw_seterr(errstr, errlen, "model: %s.expert_count %lld: mixture of experts is supported for "
                  "llama, qwen2moe and qwen3moe, not %s", a, (long long)ne, a);
        return -1;
    }
    if (model_arch_int(g, a, "expert_used_count", 0, &nu) || nu <= 0 || nu > ne ||
        nu > MODEL_MAX_EXPERTS_USED) {
        sw_seterr(errstr, errlen, "model: %s.expert_used_count must be 1..min(expert_count %lld, %d)",
                  a, (long long)ne, MODEL_MAX_EXPERTS_USED);
        return -1;
    }
    if (model_arch_int(g, a, "expert_feed_forward_length",
                       hp->arch == ARCH_LLAMA ? ffn : ffn / nu, &eff) ||
        eff <= 0 || eff > 1 << 20) {
        sw_seterr(errstr, errlen, "model: bad %s.expert_feed_forward_length", a);
        return -1;
    }
    if (hp->arch == ARCH_QWEN2MOE &&
        (model_arch_int(g, a, "expert_shared_feed_forward_length", ffn, &sff) || sff <= 0 ||
         sff > 1 << 20)) {
        sw_seterr(errstr, errlen, "model: bad %s.expert_shared_feed_forward_length", a);
        return -1;
    }
    hp->n_expert = (int)ne;
    hp->n_expert_used = (int)nu;
    hp->expert_ffn_dim = (int)eff;
    hp->shexp_ffn_dim = (int)sff;
    hp->moe_norm_topk = hp->arch != ARCH_QWEN2MOE;
    return 0;
}

/* Binds a 3-D expert tensor {cols, rows, n_expert} as n_expert * rows rows of cols. */
static int bind_exps(const model_t *m, weight_t *w, const char *name, int64_t cols, int64_t rows,
                     char *errstr, size_t errlen)
{
    const gguf_tensor_t *t = gguf_find_tensor(m->gguf, name);
    const int64_t ne = m->hp.n_expert;
    if (t && (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != ne)) {
        sw_seterr(errstr, errlen, "model: tensor '%s' is not {%lld, %lld, %lld} (in, out, experts)",
                  name, (long long)cols, (long long)rows, (long long)ne);
        return -1;
    }
    return bind(m, w, name, cols, rows * ne, 1, errstr, errlen);
}

/* The MoE FFN tensors of layer l (llama.cpp's names). Files that store each expert as its own
 * 2-D tensor (blk.N.ffn_gate.E.weight, old Mixtral conversions) are refused by name. */
static int moe_bind_layer(model_t *m, int l, char *errstr, size_t errlen)
{
    const hparams_t *hp = &m->hp;
    layer_weights_t *L = &m->layers[l];
    const int64_t dim = hp->dim, eff = hp->expert_ffn_dim, sff = hp->shexp_ffn_dim;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", l);
    if (!gguf_find_tensor(m->gguf, name)) {
        char old[96];
        snprintf(old, sizeof old, "blk.%d.ffn_gate.0.weight", l);
        if (gguf_find_tensor(m->gguf, old)) {
            sw_seterr(errstr, errlen, "model: experts stored as separate tensors ('%s') are not "
                      "supported; re-convert the model so that they are merged into '%s'", old, name);
            return -1;
        }
    }
#define MOE_BIND(field, suffix, cols, rows, req)                                           \
    do {                                                                                    \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                \
        if (bind(m, &L->field, name, cols, rows, req, errstr, errlen)) return -1;           \
    } while (0)
#define MOE_BIND3(field, suffix, cols, rows)                                                \
    do {                                                                                    \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                \
        if (bind_exps(m, &L->field, name, cols, rows, errstr, errlen)) return -1;           \
    } while (0)
    MOE_BIND(ffn_gate_inp, "ffn_gate_inp.weight", dim, hp->n_expert, 1);
    MOE_BIND3(gate_exps, "ffn_gate_exps.weight", dim, eff);
    MOE_BIND3(up_exps, "ffn_up_exps.weight", dim, eff);
    MOE_BIND3(down_exps, "ffn_down_exps.weight", eff, dim);
    if (sff > 0) {
        MOE_BIND(gate_inp_shexp, "ffn_gate_inp_shexp.weight", dim, 1, 1);
        MOE_BIND(gate_shexp, "ffn_gate_shexp.weight", dim, sff, 1);
        MOE_BIND(up_shexp, "ffn_up_shexp.weight", dim, sff, 1);
        MOE_BIND(down_shexp, "ffn_down_shexp.weight", sff, dim, 1);
    }
#undef MOE_BIND
#undef MOE_BIND3
    return 0;
}

void model_free(model_t *m)
{
    if (!m) return;
    free(m->layers);
    free(m->rope_inv_freq);
    free(m->rope_inv_freq_swa);
    free(m->owned_f32);
    gguf_close(m->gguf);
    free(m);
}

int model_is_plain_llama(const model_t *m)
{
    const hparams_t *hp = &m->hp;
    if (hp->arch != ARCH_LLAMA && hp->arch != ARCH_QWEN2) return 0;
    if (hp->n_expert > 0 || hp->qk_norm || hp->post_norms || hp->ffn_act != FFN_SILU || hp->embd_scale != 1.0f ||
        hp->attn_softcap > 0 || hp->logit_softcap > 0 || hp->swa_window > 0 ||
        hp->attn_scale != 1.0f / sqrtf((float)hp->head_dim))
        return 0;
    for (int i = 0; i < 2; i++)
        if (m->rope[i].ext_factor != 0.0f || m->rope[i].mscale != 1.0f) return 0;
    return m->rope_inv_freq_swa == NULL;
}

size_t model_kv_bytes_per_token(const model_t *m, size_t elem_bytes)
{
    return (size_t)m->hp.n_layers * 2 * (size_t)m->hp.n_kv_heads * (size_t)m->hp.head_dim *
           elem_bytes;
}

model_t *model_load(const char *path, char *errstr, size_t errlen)
{
    model_t *m = calloc(1, sizeof *m);
    if (!m) {
        sw_seterr(errstr, errlen, "model: out of memory");
        return NULL;
    }
    m->gguf = gguf_open(path, errstr, errlen);
    if (!m->gguf) goto fail;
    const gguf_t *g = m->gguf;
    hparams_t *hp = &m->hp;

    gguf_str_t arch;
    if (gguf_get_str(g, "general.architecture", &arch) != 0) {
        sw_seterr(errstr, errlen, "model: general.architecture is missing; supported: %s",
                  MODEL_ARCH_SUPPORTED);
        goto fail;
    }
    if (arch.len >= sizeof hp->arch_name) arch.len = sizeof hp->arch_name - 1;
    memcpy(hp->arch_name, arch.ptr, arch.len);
    hp->arch_name[arch.len] = 0;
    if (model_arch_lookup(hp) != 0) {
        sw_seterr(errstr, errlen, "model: architecture '%s' is not supported; supported: %s",
                  hp->arch_name, MODEL_ARCH_SUPPORTED);
        goto fail;
    }
    const char *a = hp->arch_name;
    int64_t dim, n_layers, n_heads, n_kv, ffn, ctx, key_len, rope_dim;
    if (model_arch_int(g, a, "embedding_length", 0, &dim) || dim <= 0 || dim > 65536 ||
        model_arch_int(g, a, "block_count", 0, &n_layers) || n_layers <= 0 || n_layers > 1024 ||
        model_arch_int(g, a, "attention.head_count", 0, &n_heads) || n_heads <= 0 ||
        n_heads > 1024) {
        sw_seterr(errstr, errlen,
                  "model: %s.embedding_length, .block_count and .attention.head_count must be "
                  "present and positive", a);
        goto fail;
    }
    if (model_arch_int(g, a, "attention.head_count_kv", n_heads, &n_kv) || n_kv <= 0 ||
        n_heads % n_kv) {
        sw_seterr(errstr, errlen, "model: %s.attention.head_count_kv must divide head_count (%lld)",
                  a, (long long)n_heads);
        goto fail;
    }
    if (model_arch_int(g, a, "feed_forward_length", 0, &ffn) || ffn <= 0 || ffn > 1 << 20) {
        sw_seterr(errstr, errlen, "model: %s.feed_forward_length must be present and positive", a);
        goto fail;
    }
    if (model_arch_int(g, a, "context_length", 2048, &ctx) || ctx <= 0) ctx = 2048;
    if (model_arch_int(g, a, "attention.key_length", dim / n_heads, &key_len) || key_len <= 0 ||
        key_len % 2 || key_len > 1024) {
        sw_seterr(errstr, errlen, "model: bad head dimension (%s.attention.key_length)", a);
        goto fail;
    }
    int64_t val_len;
    if (model_arch_int(g, a, "attention.value_length", key_len, &val_len) || val_len != key_len) {
        sw_seterr(errstr, errlen, "model: key and value head dimensions differ; not supported");
        goto fail;
    }
    if (model_arch_int(g, a, "rope.dimension_count", key_len, &rope_dim) || rope_dim <= 0 ||
        rope_dim > key_len || rope_dim % 2) {
        sw_seterr(errstr, errlen, "model: bad %s.rope.dimension_count", a);
        goto fail;
    }
    hp->dim = (int)dim;
    hp->n_layers = (int)n_layers;
    hp->n_heads = (int)n_heads;
    hp->n_kv_heads = (int)n_kv;
    hp->head_dim = (int)key_len;
    hp->ffn_dim = (int)ffn;
    hp->ctx_len = ctx > INT32_MAX / 2 ? INT32_MAX / 2 : (int)ctx;
    hp->rope_dim = (int)rope_dim;
    if (get_arch_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->norm_eps) ||
        !(hp->norm_eps > 0) || get_arch_f32(g, a, "rope.freq_base", 10000.0f, &hp->rope_theta) ||
        !(hp->rope_theta > 0)) {
        sw_seterr(errstr, errlen, "model: bad RMSNorm epsilon or RoPE base frequency");
        goto fail;
    }
    if (model_arch_hparams(g, hp, errstr, errlen)) goto fail;
    if (model_rope_init(m, errstr, errlen)) goto fail;

    if (moe_hparams(g, hp, ffn, errstr, errlen)) goto fail;

    /* Token embedding decides the vocabulary size. */
    const gguf_tensor_t *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[0] != dim || te->ne[1] <= 0 || te->ne[1] > (1 << 24)) {
        sw_seterr(errstr, errlen, "model: tensor 'token_embd.weight' is missing or not {%lld, vocab}",
                  (long long)dim);
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];

    int64_t q_dim = (int64_t)hp->n_heads * hp->head_dim, kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    /* F32 storage for norms and biases: per layer 4 norms (dim) + biases (q_dim + 2 kv_dim) +
     * Q/K norms (2 head_dim); plus output_norm (dim). */
    size_t per_layer = (size_t)(4 * dim + q_dim + 2 * kv_dim + 2 * key_len);
    m->owned_f32 = malloc(sizeof(float) * (per_layer * (size_t)n_layers + (size_t)dim));
    m->layers = calloc((size_t)n_layers, sizeof *m->layers);
    if (!m->owned_f32 || !m->layers) {
        sw_seterr(errstr, errlen, "model: out of memory");
        goto fail;
    }
    float *f32p = m->owned_f32;

    if (bind(m, &m->tok_embd, "token_embd.weight", dim, hp->n_vocab, 1, errstr, errlen)) goto fail;
    if (bind(m, &m->output_norm, "output_norm.weight", dim, 1, 1, errstr, errlen)) goto fail;
    to_f32(&m->output_norm, f32p);
    f32p += dim;
    if (bind(m, &m->output, "output.weight", dim, hp->n_vocab, 0, errstr, errlen)) goto fail;
    if (!m->output.data) {
        m->output = m->tok_embd;
        m->tied_output = 1;
    }
    const int need_bias = model_arch_has_qkv_bias(hp->arch), fused = model_arch_fused(hp->arch);
    for (int l = 0; l < hp->n_layers; l++) {
        layer_weights_t *L = &m->layers[l];
        char name[96];
#define BIND(field, suffix, cols, rows, req)                                       \
    do {                                                                           \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                       \
        if (bind(m, &L->field, name, cols, rows, req, errstr, errlen)) goto fail;  \
    } while (0)
#define BIND_TO(var, suffix, cols, rows)                                           \
    do {                                                                           \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                       \
        if (bind(m, &var, name, cols, rows, 1, errstr, errlen)) goto fail;         \
    } while (0)
        BIND(attn_norm, "attn_norm.weight", dim, 1, 1);
        to_f32(&L->attn_norm, f32p);
        f32p += dim;
        snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
        if (fused && gguf_find_tensor(g, name)) {
            weight_t qkv;
            BIND_TO(qkv, "attn_qkv.weight", dim, q_dim + 2 * kv_dim);
            L->wq = model_weight_rows(&qkv, 0, q_dim);
            L->wk = model_weight_rows(&qkv, q_dim, kv_dim);
            L->wv = model_weight_rows(&qkv, q_dim + kv_dim, kv_dim);
        } else {
            BIND(wq, "attn_q.weight", dim, q_dim, 1);
            BIND(wk, "attn_k.weight", dim, kv_dim, 1);
            BIND(wv, "attn_v.weight", dim, kv_dim, 1);
        }
        BIND(wo, "attn_output.weight", q_dim, dim, 1);
        BIND(bq, "attn_q.bias", q_dim, 1, need_bias);
        BIND(bk, "attn_k.bias", kv_dim, 1, need_bias);
        BIND(bv, "attn_v.bias", kv_dim, 1, need_bias);
        if (L->bq.data) { to_f32(&L->bq, f32p); f32p += q_dim; }
        if (L->bk.data) { to_f32(&L->bk, f32p); f32p += kv_dim; }
        if (L->bv.data) { to_f32(&L->bv, f32p); f32p += kv_dim; }
        if (hp->qk_norm) {
            BIND(q_norm, "attn_q_norm.weight", key_len, 1, 1);
            to_f32(&L->q_norm, f32p);
            f32p += key_len;
            BIND(k_norm, "attn_k_norm.weight", key_len, 1, 1);
            to_f32(&L->k_norm, f32p);
            f32p += key_len;
        }
        if (hp->post_norms) {
            BIND(post_attn_norm, "post_attention_norm.weight", dim, 1, 1);
            to_f32(&L->post_attn_norm, f32p);
            f32p += dim;
            BIND(post_ffn_norm, "post_ffw_norm.weight", dim, 1, 1);
            to_f32(&L->post_ffn_norm, f32p);
            f32p += dim;
        }
        BIND(ffn_norm, "ffn_norm.weight", dim, 1, 1);
        to_f32(&L->ffn_norm, f32p);
        f32p += dim;
        if (hp->n_expert > 0) {
            if (moe_bind_layer(m, l, errstr, errlen)) goto fail;
        } else {
            if (fused) {
                weight_t gu;
                BIND_TO(gu, "ffn_up.weight", dim, 2 * ffn);
                L->w_gate = model_weight_rows(&gu, 0, ffn);
                L->w_up = model_weight_rows(&gu, ffn, ffn);
            } else {
                BIND(w_gate, "ffn_gate.weight", dim, ffn, 1);
                BIND(w_up, "ffn_up.weight", dim, ffn, 1);
            }
            BIND(w_down, "ffn_down.weight", ffn, dim, 1);
        }
#undef BIND
#undef BIND_TO
    }

    if (model_arch_layers(m, errstr, errlen)) goto fail;

    /* Fingerprint: architecture, shapes, tensor names/types and every weight byte. */
    {
        XXH3_state_t *st = XXH3_createState();
        if (!st) {
            sw_seterr(errstr, errlen, "model: out of memory");
            goto fail;
        }
        XXH3_64bits_reset(st);
        XXH3_64bits_update(st, hp, sizeof *hp);
        size_t total = 0;
        int counts[64] = {0};
        for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
            const gguf_tensor_t *t = gguf_tensor(g, i);
            XXH3_64bits_update(st, t->name, strlen(t->name));
            XXH3_64bits_update(st, &t->type, sizeof t->type);
            XXH3_64bits_update(st, t->ne, sizeof t->ne);
            XXH3_64bits_update(st, t->data, t->nbytes);
            total += t->nbytes;
            if (t->n_dims == 2 && t->type >= 0 && t->type < 64) counts[t->type]++;
        }
        m->fingerprint = XXH3_64bits_digest(st);
        XXH3_freeState(st);
        m->weight_bytes = total;
        int best = 0;
        for (int t = 0; t < 64; t++)
            if (counts[t] > counts[best]) best = t;
        m->weight_type = best;
    }
    return m;
fail:
    model_free(m);
    return NULL;
}
