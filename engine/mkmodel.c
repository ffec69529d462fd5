/* engine/mkmodel.c: synthetic Llama-family GGUF models (see mkmodel.h).
 *
 * Weights: element j of row r of tensor T is mean + std * n, where n is an approximately
 * standard normal number (sum of four 16-bit uniforms, centred and scaled to unit variance)
 * drawn from a splitmix64 stream seeded by (seed, FNV-1a of T's name, r). Matrices of input
 * size `in` get std 1/sqrt(in) (so a matmul keeps the activation scale), token_embd std 0.02,
 * RMSNorm weights 1 + 0.05 n, qwen2 biases std 0.02. Rows are generated on demand by the
 * writer's fill callback and converted to the file dtype there (Q8_0: per 32-block scale
 * d = amax / 127 stored as fp16, q = round-to-nearest(x / d)).
 *
 * Tokenizer: SPM ("llama") vocabulary: <unk> (type 2 UNKNOWN), <s>, </s> (3 CONTROL), the 256
 * byte tokens <0x00>..<0xFF> (6 BYTE), then NORMAL pieces: "▁", single characters, "▁"+letter,
 * common English words with all their prefixes (so SPM merges can reach them), then every
 * lowercase string of length 2, 3, ... in order until n_vocab. Piece k has score -k. qwen2 files
 * use the same SPM-style vocabulary (real Qwen2 uses a GPT-2 BPE one; the engine and llama.cpp
 * key the tokenizer on tokenizer.ggml.model, not on the architecture). */
#include "mkmodel.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gguf.h"
#include "model.h"

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
        q = (mkmodel_params_t){ARCH_LLAMA, 576, 30, 9, 3, 1536, 49152, 8192, DT_F16, 1, 1,
                               100000.0f, 1e-5f};
    } else if (strcmp(name, "llama-3.2-1b") == 0) {
        q = (mkmodel_params_t){ARCH_LLAMA, 2048, 16, 32, 8, 8192, 128256, 131072, DT_F16, 1, 1,
                               500000.0f, 1e-5f};
    } else if (strcmp(name, "llama-3.1-8b") == 0) {
        q = (mkmodel_params_t){ARCH_LLAMA, 4096, 32, 32, 8, 14336, 128256, 131072, DT_F16, 0, 1,
                               500000.0f, 1e-5f};
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
    int64_t ne[2];      /* {in, out} or {n} */
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

static int fill_row(void *user, int64_t row, void *dst, size_t row_bytes)
{
    const tspec_t *t = user;
    float *x = t->scratch;
    gen_row(t, row, x);
    int64_t n = t->ne[0];
    switch (t->type) {
    case DT_F32:
        memcpy(dst, x, (size_t)n * 4);
        break;
    case DT_F16: {
        uint16_t h;
        for (int64_t j = 0; j < n; j++) {
            h = f32_to_fp16(x[j]);
            memcpy((uint8_t *)dst + 2 * j, &h, 2);
        }
        break;
    }
    case DT_BF16: {
        uint16_t h;
        for (int64_t j = 0; j < n; j++) {
            h = f32_to_bf16(x[j]);
            memcpy((uint8_t *)dst + 2 * j, &h, 2);
        }
        break;
    }
    case DT_Q8_0:
        quantize_q8_0(x, dst, n);
        break;
    default:
        return -1;
    }
    (void)row_bytes;
    return 0;
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

static int seterr(char *errstr, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int seterr(char *errstr, size_t errlen, const char *fmt, ...)
{
    if (errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errstr, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int check_params(const mkmodel_params_t *p, char *errstr, size_t errlen)
{
    if (p->arch != ARCH_LLAMA && p->arch != ARCH_QWEN2)
        return seterr(errstr, errlen, "mkmodel: arch must be llama or qwen2");
    if (p->dim <= 0 || p->dim > 65536 || p->n_heads <= 0 || p->n_heads > 1024 ||
        p->dim % p->n_heads || (p->dim / p->n_heads) % 2)
        return seterr(errstr, errlen, "mkmodel: dim %d must be a positive multiple of n_heads %d "
                      "with an even head dimension", p->dim, p->n_heads);
    if (p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads)
        return seterr(errstr, errlen, "mkmodel: n_kv_heads %d must divide n_heads %d",
                      p->n_kv_heads, p->n_heads);
    if (p->n_layers <= 0 || p->n_layers > 1024)
        return seterr(errstr, errlen, "mkmodel: n_layers %d not in 1..1024", p->n_layers);
    if (p->ffn_dim <= 0 || p->ffn_dim > 1 << 20)
        return seterr(errstr, errlen, "mkmodel: ffn_dim %d not in 1..%d", p->ffn_dim, 1 << 20);
    if (p->n_vocab < MKMODEL_MIN_VOCAB || p->n_vocab > 1 << 22)
        return seterr(errstr, errlen, "mkmodel: n_vocab %d not in %d..%d", p->n_vocab,
                      MKMODEL_MIN_VOCAB, 1 << 22);
    if (p->ctx_len <= 0) return seterr(errstr, errlen, "mkmodel: ctx_len must be positive");
    if (!dtype_supported(p->dtype))
        return seterr(errstr, errlen, "mkmodel: dtype %s not supported; supported: %s",
                      dtype_name(p->dtype), DTYPE_SUPPORTED_LIST);
    if (p->dtype == DT_Q8_0 && (p->dim % QK8_0 || p->ffn_dim % QK8_0))
        return seterr(errstr, errlen, "mkmodel: Q8_0 needs dim (%d) and ffn_dim (%d) to be "
                      "multiples of %d", p->dim, p->ffn_dim, QK8_0);
    if (!(p->rope_theta > 0) || !(p->norm_eps > 0) || !isfinite(p->rope_theta) ||
        !isfinite(p->norm_eps))
        return seterr(errstr, errlen, "mkmodel: rope_theta and norm_eps must be positive");
    return 0;
}

static int file_type_of(int dtype)
{
    switch (dtype) {
    case DT_F16: return 1;   /* LLAMA_FTYPE_MOSTLY_F16 */
    case DT_Q8_0: return 7;  /* LLAMA_FTYPE_MOSTLY_Q8_0 */
    case DT_BF16: return 32; /* LLAMA_FTYPE_MOSTLY_BF16 */
    default: return 0;       /* LLAMA_FTYPE_ALL_F32 */
    }
}

int mkmodel_write(const mkmodel_params_t *p, const char *path, char *errstr, size_t errlen)
{
    if (!p || !path) return seterr(errstr, errlen, "mkmodel: NULL argument");
    if (check_params(p, errstr, errlen)) return -1;
    const char *arch = p->arch == ARCH_QWEN2 ? "qwen2" : "llama";
    const int hd = p->dim / p->n_heads, q_dim = p->dim, kv_dim = p->n_kv_heads * hd;
    const int per_layer = p->arch == ARCH_QWEN2 ? 12 : 9;
    const int n_t = 2 + !p->tied + per_layer * p->n_layers;
    int rc = -1;
    gguf_writer_t *w = NULL;
    vocab_t v;
    memset(&v, 0, sizeof v);
    float *scores = NULL, *scratch = NULL;
    int32_t *types = NULL;
    const char **strs = NULL;
    tspec_t *ts = calloc((size_t)n_t, sizeof *ts);
    int64_t max_in = p->dim > p->ffn_dim ? p->dim : p->ffn_dim;
    scratch = malloc((size_t)max_in * sizeof *scratch);
    w = gguf_writer_new();
    if (!ts || !scratch || !w) {
        seterr(errstr, errlen, "mkmodel: out of memory");
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
    snprintf(name, sizeof name, "spillway-synthetic-%s-%dx%d-%s", arch, p->n_layers, p->dim,
             dtype_name(p->dtype));
    e |= gguf_writer_add_str(w, "general.name", name);
    e |= gguf_writer_add_u32(w, "general.file_type", (uint32_t)file_type_of(p->dtype));
    if (p->dtype == DT_Q8_0) e |= gguf_writer_add_u32(w, "general.quantization_version", 2);
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
#undef ARCH_U32
#undef ARCH_F32

    /* Tokenizer. */
    if (build_vocab(&v, p->n_vocab)) {
        seterr(errstr, errlen, "mkmodel: out of memory building the vocabulary");
        goto fail;
    }
    strs = malloc((size_t)p->n_vocab * sizeof *strs);
    scores = malloc((size_t)p->n_vocab * sizeof *scores);
    types = malloc((size_t)p->n_vocab * sizeof *types);
    if (!strs || !scores || !types) {
        seterr(errstr, errlen, "mkmodel: out of memory");
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
        seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
        goto fail;
    }

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
        t_->mean = (mean_);                                                          \
        t_->std = (std_);                                                            \
    } while (0)
    SPEC("token_embd.weight", p->dtype, 2, p->dim, p->n_vocab, 0.0f, 0.02f);
    SPEC("output_norm.weight", DT_F32, 1, p->dim, 1, 1.0f, 0.05f);
    if (!p->tied) SPEC("output.weight", p->dtype, 2, p->dim, p->n_vocab, 0.0f, mat_std_dim);
    for (int l = 0; l < p->n_layers; l++) {
        char nm[64];
#define LSPEC(suffix, type_, nd, ne0, ne1, mean_, std_)                              \
    do {                                                                             \
        snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix);                             \
        SPEC(nm, type_, nd, ne0, ne1, mean_, std_);                                  \
    } while (0)
        LSPEC("attn_norm.weight", DT_F32, 1, p->dim, 1, 1.0f, 0.05f);
        LSPEC("attn_q.weight", p->dtype, 2, p->dim, q_dim, 0.0f, mat_std_dim);
        LSPEC("attn_k.weight", p->dtype, 2, p->dim, kv_dim, 0.0f, mat_std_dim);
        LSPEC("attn_v.weight", p->dtype, 2, p->dim, kv_dim, 0.0f, mat_std_dim);
        LSPEC("attn_output.weight", p->dtype, 2, q_dim, p->dim, 0.0f, 1.0f / sqrtf((float)q_dim));
        if (p->arch == ARCH_QWEN2) {
            LSPEC("attn_q.bias", DT_F32, 1, q_dim, 1, 0.0f, 0.02f);
            LSPEC("attn_k.bias", DT_F32, 1, kv_dim, 1, 0.0f, 0.02f);
            LSPEC("attn_v.bias", DT_F32, 1, kv_dim, 1, 0.0f, 0.02f);
        }
        LSPEC("ffn_norm.weight", DT_F32, 1, p->dim, 1, 1.0f, 0.05f);
        LSPEC("ffn_gate.weight", p->dtype, 2, p->dim, p->ffn_dim, 0.0f, mat_std_dim);
        LSPEC("ffn_up.weight", p->dtype, 2, p->dim, p->ffn_dim, 0.0f, mat_std_dim);
        LSPEC("ffn_down.weight", p->dtype, 2, p->ffn_dim, p->dim, 0.0f,
              1.0f / sqrtf((float)p->ffn_dim));
#undef LSPEC
    }
#undef SPEC
    uint64_t seed_mix = p->seed;
    seed_mix = splitmix64(&seed_mix);
    for (int i = 0; i < n_t; i++) {
        tspec_t *t = &ts[i];
        t->seed = seed_mix ^ fnv1a(t->name);
        t->scratch = scratch;
        if (gguf_writer_add_tensor_stream(w, t->name, t->type, t->n_dims, t->ne, fill_row, t)) {
            seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
            goto fail;
        }
    }
    if (gguf_writer_write(w, path)) {
        seterr(errstr, errlen, "mkmodel: %s", gguf_writer_errstr(w));
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
