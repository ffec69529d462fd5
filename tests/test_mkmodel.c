/* tests/test_mkmodel.c: synthetic model writer.
 *
 * Writes tiny models for both architectures, every matrix dtype, tied and untied, and reads
 * them back with gguf_open: metadata keys, tokenizer arrays, tensor names/shapes/types, weight
 * statistics, and the F16/BF16/Q8_0/Q4_0/Q4_K values against the F32 file of the same seed
 * (Q8_0 error within half a quantisation step per block, Q4_0 within one, NMSE bounds). The
 * quantisers against hashes of ggml's reference quantisers' output, the weighted ones against
 * ggml's error; conversion of a model (mkmodel_convert) with and without padding, with both
 * quantisers. Also: determinism, parameter validation,
 * presets, a 128256-token vocabulary with unique pieces, the qwen3 / gemma2 / gemma3 / phi3
 * writers and options as model_load binds them, and mixture-of-experts files (llama MoE,
 * qwen2moe, qwen3moe: keys, 3-D expert tensors, routers, shared expert, Q/K norms, read back by
 * model_load). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/dtype.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "tests/check.h"
#include "tools/mkmodel.h"

static char tmpdir[64];

static mkmodel_params_t small_params(int arch, int dtype, int tied)
{
    mkmodel_params_t p;
    mkmodel_preset(arch == ARCH_QWEN2 ? "qwen2-tiny" : "tiny", &p);
    p.ffn_dim = 96;
    p.n_vocab = 320;
    p.ctx_len = 128;
    p.dtype = dtype;
    p.tied = tied;
    p.seed = 42;
    return p;
}

static int str_eq(gguf_str_t s, const char *c)
{
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static float elem_f32(const gguf_tensor_t *t, int64_t i)
{
    const uint8_t *d = t->data;
    uint16_t h;
    float f;
    switch (t->type) {
    case DT_F32: memcpy(&f, d + 4 * i, 4); return f;
    case DT_F16: memcpy(&h, d + 2 * i, 2); return fp16_to_f32(h);
    case DT_BF16: memcpy(&h, d + 2 * i, 2); return bf16_to_f32(h);
    case DT_Q8_0: {
        const block_q8_0 *b = (const block_q8_0 *)d + i / QK8_0;
        return fp16_to_f32(b->d) * (float)b->qs[i % QK8_0];
    }
    case DT_Q4_0: case DT_Q4_K: { /* the block through dtype_dequant_row (test_kernels checks it) */
        int be = dtype_block_elems(t->type);
        float blk[QK_K];
        dtype_dequant_row(t->type, d + (size_t)(i / be) * dtype_block_bytes(t->type), blk, be);
        return blk[i % be];
    }
    default: return NAN;
    }
}

/* The type mkmodel writes a matrix with rows of ne0 elements in. */
static int mat_type(const mkmodel_params_t *p, int64_t ne0)
{
    return p->dtype == DT_Q4_K && ne0 % 256 ? DT_Q4_0 : p->dtype;
}

static uint32_t file_type_want(int dtype)
{
    switch (dtype) {
    case DT_F32: return 0;
    case DT_F16: return 1;
    case DT_Q4_0: return 2;
    case DT_Q8_0: return 7;
    case DT_Q4_K: return 14;
    default: return 32;
    }
}

static int64_t n_elems(const gguf_tensor_t *t)
{
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

static void check_model(const gguf_t *g, const mkmodel_params_t *p)
{
    const char *arch = p->arch == ARCH_QWEN2 ? "qwen2" : "llama";
    char key[96];
    gguf_str_t s;
    uint32_t u;
    float f;
    int b;
#define AKEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    CHECK(gguf_get_str(g, "general.architecture", &s) == 0 && str_eq(s, arch));
    CHECK(gguf_get_str(g, "general.name", &s) == 0 && s.len > 0);
    CHECK(gguf_get_u32(g, "general.file_type", &u) == 0 && u == file_type_want(p->dtype));
    CHECK((gguf_find_key(g, "general.quantization_version") >= 0) == (dtype_block_elems(p->dtype) > 1));
    CHECK(gguf_kv_type(g, gguf_find_key(g, AKEY("context_length"))) == GGUF_UINT32);
    CHECK(gguf_get_u32(g, AKEY("context_length"), &u) == 0 && u == (uint32_t)p->ctx_len);
    CHECK(gguf_get_u32(g, AKEY("embedding_length"), &u) == 0 && u == (uint32_t)p->dim);
    CHECK(gguf_get_u32(g, AKEY("block_count"), &u) == 0 && u == (uint32_t)p->n_layers);
    CHECK(gguf_get_u32(g, AKEY("feed_forward_length"), &u) == 0 && u == (uint32_t)p->ffn_dim);
    CHECK(gguf_get_u32(g, AKEY("attention.head_count"), &u) == 0 && u == (uint32_t)p->n_heads);
    CHECK(gguf_get_u32(g, AKEY("attention.head_count_kv"), &u) == 0 && u == (uint32_t)p->n_kv_heads);
    CHECK(gguf_get_u32(g, AKEY("vocab_size"), &u) == 0 && u == (uint32_t)p->n_vocab);
    CHECK(gguf_get_u32(g, AKEY("rope.dimension_count"), &u) == 0 && u == (uint32_t)(p->dim / p->n_heads));
    CHECK(gguf_get_f32(g, AKEY("attention.layer_norm_rms_epsilon"), &f) == 0 && f == p->norm_eps);
    CHECK(gguf_get_f32(g, AKEY("rope.freq_base"), &f) == 0 && f == p->rope_theta);
#undef AKEY
    /* Tokenizer. */
    int et;
    uint64_t n;
    CHECK(gguf_get_str(g, "tokenizer.ggml.model", &s) == 0 && str_eq(s, "llama"));
    CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) == 0 && et == GGUF_STRING &&
          n == (uint64_t)p->n_vocab);
    CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", 0, &s) == 0 && str_eq(s, "<unk>"));
    CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", 1, &s) == 0 && str_eq(s, "<s>"));
    CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", 2, &s) == 0 && str_eq(s, "</s>"));
    CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", 3 + 0x0A, &s) == 0 && str_eq(s, "<0x0A>"));
    CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", 258, &s) == 0 && str_eq(s, "<0xFF>"));
    CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", 259, &s) == 0 && str_eq(s, "\xe2\x96\x81"));
    CHECK(gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n) == 0 && et == GGUF_FLOAT32 &&
          n == (uint64_t)p->n_vocab);
    CHECK(gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n) == 0 && et == GGUF_INT32 &&
          n == (uint64_t)p->n_vocab);
    const uint8_t *tt = gguf_get_arr_data(g, "tokenizer.ggml.token_type");
    if (tt) {
        int32_t t0, t1, t2, t3, t258, t259, tl;
        memcpy(&t0, tt, 4);
        memcpy(&t1, tt + 4, 4);
        memcpy(&t2, tt + 8, 4);
        memcpy(&t3, tt + 12, 4);
        memcpy(&t258, tt + 4 * 258, 4);
        memcpy(&t259, tt + 4 * 259, 4);
        memcpy(&tl, tt + 4 * (p->n_vocab - 1), 4);
        CHECK(t0 == 2 && t1 == 3 && t2 == 3 && t3 == 6 && t258 == 6 && t259 == 1 && tl == 1);
    }
    const uint8_t *sc = gguf_get_arr_data(g, "tokenizer.ggml.scores");
    if (sc) {
        float s260, s300;
        memcpy(&s260, sc + 4 * 260, 4);
        memcpy(&s300, sc + 4 * 300, 4);
        CHECK(s260 > s300);
    }
    CHECK(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u) == 0 && u == 1);
    CHECK(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) == 0 && u == 2);
    CHECK(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0 && b == 1);

    /* Tensors. */
    int hd = p->dim / p->n_heads, kv_dim = p->n_kv_heads * hd;
    int qwen = p->arch == ARCH_QWEN2;
    CHECK(gguf_n_tensors(g) == 2 + !p->tied + p->n_layers * (qwen ? 12 : 9));
    const gguf_tensor_t *t = gguf_find_tensor(g, "token_embd.weight");
    const int dt_dim = mat_type(p, p->dim), dt_ffn = mat_type(p, p->ffn_dim);
    CHECK(t && t->type == dt_dim && t->n_dims == 2 && t->ne[0] == p->dim && t->ne[1] == p->n_vocab);
    t = gguf_find_tensor(g, "output_norm.weight");
    CHECK(t && t->type == DT_F32 && t->n_dims == 1 && t->ne[0] == p->dim);
    t = gguf_find_tensor(g, "output.weight");
    CHECK(p->tied ? t == NULL : (t && t->type == dt_dim && t->ne[0] == p->dim && t->ne[1] == p->n_vocab));
    for (int l = 0; l < p->n_layers; l++) {
        struct {
            const char *suffix;
            int type;
            int64_t ne0, ne1;
            int present;
        } want[] = {
            {"attn_norm.weight", DT_F32, p->dim, 1, 1},
            {"attn_q.weight", dt_dim, p->dim, p->dim, 1},
            {"attn_k.weight", dt_dim, p->dim, kv_dim, 1},
            {"attn_v.weight", dt_dim, p->dim, kv_dim, 1},
            {"attn_output.weight", dt_dim, p->dim, p->dim, 1},
            {"attn_q.bias", DT_F32, p->dim, 1, qwen},
            {"attn_k.bias", DT_F32, kv_dim, 1, qwen},
            {"attn_v.bias", DT_F32, kv_dim, 1, qwen},
            {"ffn_norm.weight", DT_F32, p->dim, 1, 1},
            {"ffn_gate.weight", dt_dim, p->dim, p->ffn_dim, 1},
            {"ffn_up.weight", dt_dim, p->dim, p->ffn_dim, 1},
            {"ffn_down.weight", dt_ffn, p->ffn_dim, p->dim, 1},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s", l, want[i].suffix);
            t = gguf_find_tensor(g, nm);
            if (!want[i].present) {
                CHECKF(t == NULL, "%s", nm);
                continue;
            }
            CHECKF(t && t->type == want[i].type && t->ne[0] == want[i].ne0 && t->ne[1] == want[i].ne1 &&
                   t->n_dims == (want[i].ne1 == 1 ? 1 : 2), "%s", nm);
        }
    }
    /* Weight statistics (on the F32 file). */
    if (p->dtype == DT_F32) {
        struct {
            const char *name;
            double mean, std;
        } st[] = {
            {"blk.0.attn_norm.weight", 1.0, 0.05},
            {"blk.1.ffn_gate.weight", 0.0, 1.0 / sqrt(p->dim)},
            {"blk.1.ffn_down.weight", 0.0, 1.0 / sqrt(p->ffn_dim)},
            {"token_embd.weight", 0.0, 0.02},
        };
        for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
            t = gguf_find_tensor(g, st[i].name);
            if (!t) continue;
            double s1 = 0, s2 = 0;
            int64_t ne = n_elems(t);
            for (int64_t j = 0; j < ne; j++) {
                double x = elem_f32(t, j);
                s1 += x;
                s2 += x * x;
            }
            double mean = s1 / (double)ne, sd = sqrt(s2 / (double)ne - mean * mean);
            CHECKF(fabs(mean - st[i].mean) < 0.2 * st[i].std + 1e-3 && fabs(sd / st[i].std - 1) < 0.15,
                   "%s: mean %g std %g, want %g %g", st[i].name, mean, sd, st[i].mean, st[i].std);
        }
    }
}

/* Compares every matrix of gq (dtype p->dtype) with the same tensor of the F32 file gf; returns
 * the NMSE over all matrices. Per element: Q8_0 within half a step (d = amax / 127) plus the
 * fp16 rounding of d; Q4_0 within one step (d = amax / 8: half a step, but values within half a
 * step of +amax are capped at +7 d, a whole step) plus d's rounding. Q4_K (weighted least-squares
 * fits, no simple per-element bound) and all types: NMSE bounds ~1.5-2x over the observed values
 * (Q8_0 2.6e-5, Q4_0 6.6e-3, Q4_K 5.1e-3 on these approximately normal weights; Q4_K files of
 * dim 64 are Q4_0 throughout). */
static double check_against_f32(const gguf_t *gq, const gguf_t *gf, int dtype)
{
    double worst_rel = 0, err2 = 0, ref2 = 0; /* worst_rel: worst error / bound */
    int bad_blocks = 0;
    for (int64_t i = 0; i < gguf_n_tensors(gf); i++) {
        const gguf_tensor_t *tf = gguf_tensor(gf, i);
        const gguf_tensor_t *tq = gguf_find_tensor(gq, tf->name);
        CHECKF(tq && n_elems(tq) == n_elems(tf), "%s", tf->name);
        if (!tq || tf->n_dims == 1) continue;
        int64_t ne = n_elems(tf);
        for (int64_t j = 0; j < ne; j += QK8_0) {
            float amax = 0;
            for (int k = 0; k < QK8_0; k++) amax = fmaxf(amax, fabsf(elem_f32(tf, j + k)));
            for (int k = 0; k < QK8_0; k++) {
                float a = elem_f32(tf, j + k), q = elem_f32(tq, j + k);
                double e = fabs((double)a - q);
                err2 += e * e;
                ref2 += (double)a * a;
                if (dtype == DT_Q8_0 || tq->type == DT_Q8_0) {
                    /* half a step of d = amax/127, plus the fp16 rounding of d over |q| <= 127 */
                    if (e > 0.5 * amax / 127.0 + 127.0 * amax / 127.0 / 1024.0) bad_blocks++;
                } else if (tq->type == DT_Q4_0) {
                    if (e > amax / 8.0 + 8.0 * amax / 8.0 / 1024.0) bad_blocks++;
                } else if (tq->type == DT_Q4_K) {
                    /* no per-element bound: NMSE below */
                } else {
                    /* error over the rounding bound: half an ulp, relative 2^-11 (F16) or
                     * 2^-8 (BF16), floored at half the smallest F16 subnormal */
                    double bound = dtype == DT_F16 ? fabs(a) / 2048.0 + ldexp(1.0, -25)
                                                   : fabs(a) / 256.0;
                    if (e / bound > worst_rel) worst_rel = e / bound;
                }
            }
        }
    }
    double nmse = err2 / ref2;
    if (dtype == DT_Q8_0) {
        CHECKF(bad_blocks == 0, "%d Q8_0 elements off by more than half a step", bad_blocks);
        CHECKF(nmse < 5e-5, "Q8_0 NMSE %g", nmse);
    } else if (dtype == DT_Q4_0) {
        CHECKF(bad_blocks == 0, "%d Q4_0 elements off by more than a step", bad_blocks);
        CHECKF(nmse < 1e-2, "Q4_0 NMSE %g", nmse);
    } else if (dtype == DT_Q4_K) {
        CHECKF(bad_blocks == 0, "%d Q4_0 (fallback) elements off by more than a step", bad_blocks);
        CHECKF(nmse < 1e-2, "Q4_K NMSE %g", nmse);
    } else if (dtype == DT_F16) {
        CHECKF(worst_rel <= 1.0 && nmse < 1e-7, "F16 error/bound %g NMSE %g", worst_rel, nmse);
    } else if (dtype == DT_BF16) {
        CHECKF(worst_rel <= 1.0 && nmse < 1e-5, "BF16 error/bound %g NMSE %g", worst_rel, nmse);
    }
    fprintf(stderr, "  %s vs f32: NMSE %.3g\n", dtype_name(dtype), nmse);
    return nmse;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void test_all_variants(void)
{
    const int dtypes[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K};
    const int arches[] = {ARCH_LLAMA, ARCH_QWEN2};
    char err[256], pf[128], pq[128];
    for (int a = 0; a < 2; a++) {
        for (int tied = 0; tied < 2; tied++) {
            mkmodel_params_t p32 = small_params(arches[a], DT_F32, tied);
            snprintf(pf, sizeof pf, "%s/f32.gguf", tmpdir);
            CHECKF(mkmodel_write(&p32, pf, err, sizeof err) == 0, "%s", err);
            gguf_t *gf = gguf_open(pf, err, sizeof err);
            CHECKF(gf != NULL, "%s", err);
            if (!gf) continue;
            check_model(gf, &p32);
            for (int d = 1; d < 6; d++) {
                mkmodel_params_t p = small_params(arches[a], dtypes[d], tied);
                snprintf(pq, sizeof pq, "%s/%s.gguf", tmpdir, dtype_name(dtypes[d]));
                CHECKF(mkmodel_write(&p, pq, err, sizeof err) == 0, "%s", err);
                gguf_t *gq = gguf_open(pq, err, sizeof err);
                CHECKF(gq != NULL, "%s", err);
                if (!gq) continue;
                fprintf(stderr, "%s %s:\n", a ? "qwen2" : "llama", tied ? "tied" : "untied");
                check_model(gq, &p);
                check_against_f32(gq, gf, dtypes[d]);
                gguf_close(gq);
                unlink(pq);
            }
            gguf_close(gf);
            unlink(pf);
        }
    }
}

static void test_determinism(void)
{
    char err[256], p1[128], p2[128];
    mkmodel_params_t p = small_params(ARCH_LLAMA, DT_Q8_0, 0);
    snprintf(p1, sizeof p1, "%s/a.gguf", tmpdir);
    snprintf(p2, sizeof p2, "%s/b.gguf", tmpdir);
    CHECK(mkmodel_write(&p, p1, err, sizeof err) == 0);
    CHECK(mkmodel_write(&p, p2, err, sizeof err) == 0);
    size_t l1 = 0, l2 = 0;
    uint8_t *b1 = slurp(p1, &l1), *b2 = slurp(p2, &l2);
    CHECK(b1 && b2 && l1 == l2 && memcmp(b1, b2, l1) == 0);
    free(b2);
    p.seed = 43;
    CHECK(mkmodel_write(&p, p2, err, sizeof err) == 0);
    b2 = slurp(p2, &l2);
    CHECK(b1 && b2 && l1 == l2 && memcmp(b1, b2, l1) != 0);
    free(b1);
    free(b2);
    unlink(p1);
    unlink(p2);
}

static void test_validation_and_presets(void)
{
    char err[256], path[128];
    snprintf(path, sizeof path, "%s/bad.gguf", tmpdir);
    mkmodel_params_t p = small_params(ARCH_LLAMA, DT_F32, 0);
    p.n_heads = 5;
    CHECK(mkmodel_write(&p, path, err, sizeof err) == -1 && strstr(err, "n_heads"));
    p = small_params(ARCH_LLAMA, DT_F32, 0);
    p.n_kv_heads = 3;
    CHECK(mkmodel_write(&p, path, err, sizeof err) == -1 && strstr(err, "n_kv_heads 3"));
    p = small_params(ARCH_LLAMA, DT_Q8_0, 0);
    p.ffn_dim = 100;
    CHECK(mkmodel_write(&p, path, err, sizeof err) == -1 && strstr(err, "multiples of 32"));
    p = small_params(ARCH_LLAMA, DT_Q4_K, 0);
    p.dim = 48;
    p.n_heads = 2;
    p.n_kv_heads = 1;
    CHECK(mkmodel_write(&p, path, err, sizeof err) == -1 && strstr(err, "multiples of 32"));
    p = small_params(ARCH_LLAMA, DT_Q8_K, 0);
    CHECK(mkmodel_write(&p, path, err, sizeof err) == -1 && strstr(err, "not supported"));
    p = small_params(ARCH_LLAMA, DT_F32, 0);
    p.n_vocab = 259;
    CHECK(mkmodel_write(&p, path, err, sizeof err) == -1 && strstr(err, "n_vocab 259"));
    p = small_params(ARCH_LLAMA, DT_F32, 0);
    p.arch = 7;
    CHECK(mkmodel_write(&p, path, err, sizeof err) == -1 && strstr(err, "arch"));
    CHECK(access(path, F_OK) != 0);
    /* Valid parameters, unwritable path: the error comes from the writer. */
    p = small_params(ARCH_LLAMA, DT_F32, 0);
    CHECK(mkmodel_write(&p, "/nonexistent-dir/m.gguf", err, sizeof err) == -1 &&
          strstr(err, "temp file"));

    const char *names[] = {"tiny", "qwen2-tiny", "smollm2-135m", "llama-3.2-1b", "llama-3.1-8b"};
    for (size_t i = 0; i < 5; i++) CHECKF(mkmodel_preset(names[i], &p) == 0, "%s", names[i]);
    CHECK(mkmodel_preset("nope", &p) == -1);
    CHECK(mkmodel_preset("tiny", &p) == 0 && p.arch == ARCH_LLAMA && p.dim == 64 && p.n_layers == 2 &&
          p.n_heads == 4 && p.n_kv_heads == 2 && p.ffn_dim == 128 && p.n_vocab == 512);
    CHECK(mkmodel_preset("qwen2-tiny", &p) == 0 && p.arch == ARCH_QWEN2 && p.dim == 64 &&
          p.n_vocab == 512 && p.n_kv_heads == 2);
    CHECK(mkmodel_preset("smollm2-135m", &p) == 0 && p.dim == 576 && p.n_layers == 30 &&
          p.n_heads == 9 && p.n_kv_heads == 3 && p.ffn_dim == 1536 && p.n_vocab == 49152 &&
          p.ctx_len == 8192 && p.tied && p.rope_theta == 100000.0f && p.norm_eps == 1e-5f);
    CHECK(mkmodel_preset("llama-3.2-1b", &p) == 0 && p.dim == 2048 && p.n_layers == 16 &&
          p.n_heads == 32 && p.n_kv_heads == 8 && p.ffn_dim == 8192 && p.n_vocab == 128256 &&
          p.tied && p.rope_theta == 500000.0f);
    CHECK(mkmodel_preset("llama-3.1-8b", &p) == 0 && p.dim == 4096 && p.n_layers == 32 &&
          p.n_heads == 32 && p.n_kv_heads == 8 && p.ffn_dim == 14336 && p.n_vocab == 128256 &&
          !p.tied && p.rope_theta == 500000.0f);
    /* The tiny presets write as they are. */
    for (size_t i = 0; i < 2; i++) {
        mkmodel_preset(names[i], &p);
        CHECKF(mkmodel_write(&p, path, err, sizeof err) == 0, "%s: %s", names[i], err);
        gguf_t *g = gguf_open(path, err, sizeof err);
        CHECKF(g != NULL, "%s", err);
        if (g) check_model(g, &p);
        gguf_close(g);
        unlink(path);
    }
}

static int cmp_str(const void *a, const void *b)
{
    const gguf_str_t *x = a, *y = b;
    size_t n = x->len < y->len ? (size_t)x->len : (size_t)y->len;
    int c = memcmp(x->ptr, y->ptr, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static void test_big_vocab(void)
{
    char err[256], path[128];
    snprintf(path, sizeof path, "%s/vocab.gguf", tmpdir);
    mkmodel_params_t p = small_params(ARCH_LLAMA, DT_BF16, 1);
    p.dim = 32;
    p.n_heads = 2;
    p.n_kv_heads = 1;
    p.n_layers = 1;
    p.ffn_dim = 32;
    p.n_vocab = 128256;
    CHECKF(mkmodel_write(&p, path, err, sizeof err) == 0, "%s", err);
    gguf_t *g = gguf_open(path, err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    if (!g) return;
    gguf_str_t *all = malloc(sizeof *all * (size_t)p.n_vocab);
    int ok = all != NULL;
    for (int i = 0; ok && i < p.n_vocab; i++) ok = gguf_get_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)i, &all[i]) == 0 && all[i].len > 0;
    CHECK(ok);
    if (ok) {
        qsort(all, (size_t)p.n_vocab, sizeof *all, cmp_str);
        int dups = 0;
        for (int i = 1; i < p.n_vocab; i++) dups += cmp_str(&all[i - 1], &all[i]) == 0;
        CHECKF(dups == 0, "%d duplicate pieces", dups);
    }
    free(all);
    const gguf_tensor_t *t = gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->ne[1] == 128256 && t->type == DT_BF16);
    gguf_close(g);
    unlink(path);
}

/* Q4_K where it fits: dim 256 (matrices with rows of 256 are Q4_K) beside ffn 96 (ffn_down
 * falls back to Q4_0). The least-squares fit must beat Q4_0's error on the same weights. */
static void test_q4k_shapes(void)
{
    char err[256], pf[128], pq[128];
    mkmodel_params_t p32 = small_params(ARCH_LLAMA, DT_F32, 0);
    p32.dim = 256;
    snprintf(pf, sizeof pf, "%s/f32.gguf", tmpdir);
    CHECKF(mkmodel_write(&p32, pf, err, sizeof err) == 0, "%s", err);
    gguf_t *gf = gguf_open(pf, err, sizeof err);
    CHECKF(gf != NULL, "%s", err);
    if (!gf) return;
    double nmse[2] = {0, 0};
    const int dts[2] = {DT_Q4_0, DT_Q4_K};
    for (int i = 0; i < 2; i++) {
        mkmodel_params_t p = p32;
        p.dtype = dts[i];
        snprintf(pq, sizeof pq, "%s/q.gguf", tmpdir);
        CHECKF(mkmodel_write(&p, pq, err, sizeof err) == 0, "%s", err);
        gguf_t *gq = gguf_open(pq, err, sizeof err);
        CHECKF(gq != NULL, "%s", err);
        if (!gq) continue;
        fprintf(stderr, "llama dim 256 %s:\n", dtype_name(dts[i]));
        check_model(gq, &p);
        const gguf_tensor_t *t = gguf_find_tensor(gq, "blk.0.attn_q.weight");
        CHECK(t && t->type == dts[i]);
        t = gguf_find_tensor(gq, "blk.0.ffn_down.weight");
        CHECK(t && t->type == DT_Q4_0);
        nmse[i] = check_against_f32(gq, gf, dts[i]);
        gguf_close(gq);
        unlink(pq);
    }
    CHECKF(nmse[1] < 0.9 * nmse[0], "Q4_K NMSE %g not below Q4_0's %g", nmse[1], nmse[0]);
    gguf_close(gf);
    unlink(pf);
}

/* The quantisers against ggml's reference ones: the FNV-1a hashes of their output for a fixed
 * input (four super-blocks: symmetric values, all positive and narrow, a zero sub-block among
 * heavy tails, plateaus) were computed with ggml's quantize_row_q8_0_ref, _q4_0_ref and
 * _q4_K_ref (llama.cpp ggml/src/ggml-quants.c), built separately; mkmodel must write the same
 * bytes. Also mkmodel_matrix_type's fallbacks and the rejected arguments. */
static uint64_t fnv64(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void test_quantize_golden(void)
{
    float x[1024];
    uint32_t st = 12345u;
    for (int i = 0; i < 1024; i++) {
        st = st * 1664525u + 1013904223u;
        float u = (float)((int32_t)(st >> 8) - (1 << 23)) / (float)(1 << 23); /* [-1, 1) */
        int b = i / 256, j = i % 256;
        if (b == 0) x[i] = u;
        else if (b == 1) x[i] = 0.5f + 0.001f * u;
        else if (b == 2) x[i] = j / 32 == 3 ? 0.0f : u * u * u * 4.0f;
        else x[i] = j < 128 ? 0.25f : -2.0f + 0.125f * (float)(j % 8);
    }
    static const struct { int t; uint64_t h; } want[] = {
        {DT_Q8_0, 0xdb02de59c689c47aull},
        {DT_Q4_0, 0x4864a3375b070d75ull},
        {DT_Q4_K, 0x80b8bb2ed6815f51ull},
    };
    uint8_t out[2048];
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        memset(out, 0xa5, sizeof out);
        CHECK(mkmodel_quantize_row(want[i].t, x, out, 1024) == 0);
        size_t nb = dtype_row_bytes(want[i].t, 1024);
        uint64_t h = fnv64(out, nb);
        CHECKF(h == want[i].h, "%s: hash %016llx, ggml's reference gives %016llx", dtype_name(want[i].t),
               (unsigned long long)h, (unsigned long long)want[i].h);
        CHECK(out[nb] == 0xa5); /* nothing written past the row */
        /* round trip: every weight within a 4-bit step of its super-block's largest magnitude */
        float back[1024];
        dtype_dequant_row(want[i].t, out, back, 1024);
        int bad = 0;
        for (int k = 0; k < 1024; k++) {
            float amax = 0;
            for (int j = k / 256 * 256; j < k / 256 * 256 + 256; j++) amax = fmaxf(amax, fabsf(x[j]));
            bad += !(fabsf(back[k] - x[k]) <= amax / 7.0f);
        }
        CHECKF(bad == 0, "%s: %d weights far off after the round trip", dtype_name(want[i].t), bad);
    }
    CHECK(mkmodel_quantize_row(DT_Q4_K, x, out, 512 + 32) == -1);
    CHECK(mkmodel_quantize_row(DT_Q4_0, x, out, 48) == -1);
    CHECK(mkmodel_quantize_row(DT_Q8_K, x, out, 256) == -1);
    CHECK(mkmodel_matrix_type(DT_Q4_K, 512, DT_F32) == DT_Q4_K);
    CHECK(mkmodel_matrix_type(DT_Q4_K, 576, DT_F32) == DT_Q4_0);
    CHECK(mkmodel_matrix_type(DT_Q4_K, 172, DT_F16) == DT_F16);
    CHECK(mkmodel_matrix_type(DT_Q8_0, 172, DT_F32) == DT_F32);
    CHECK(mkmodel_matrix_type(DT_Q4_0, 64, DT_F32) == DT_Q4_0);
}

/* mkmodel_quantize_row_weighted: on rows of normal-ish values with outliers and random
 * weights (spanning 100x), the 4-bit types' w-weighted squared error summed over 64 rows is
 * below 0.95x that of ggml's quantisers (observed Q4_0 0.88x, Q4_K 0.88x), and with equal
 * weights the plain squared error below 0.97x (observed 0.91x, 0.94x);
 * all-zero weights still give a decodable block; zeros stay exactly zero; other types round as
 * mkmodel_quantize_row; bad weights are refused. */
static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float approx_normal(uint64_t *s) /* sum of 4 uniforms, unit variance */
{
    uint64_t r = splitmix(s);
    float sum = 0;
    for (int k = 0; k < 4; k++) sum += ((float)((r >> (16 * k)) & 0xffff) + 0.5f) / 65536.0f;
    return (sum - 2.0f) * 1.7320508f;
}

static double werr(int t, const void *q, const float *x, const float *w, int64_t n)
{
    float back[1024];
    dtype_dequant_row(t, q, back, n);
    double e = 0;
    for (int64_t i = 0; i < n; i++) e += (double)w[i] * (back[i] - x[i]) * (back[i] - x[i]);
    return e;
}

static void test_quantize_weighted(void)
{
    uint64_t st = 99;
    float x[1024], w[1024], ones[1024];
    uint8_t q[2048], r[2048];
    const int ts[] = {DT_Q4_0, DT_Q4_K};
    for (size_t ti = 0; ti < 2; ti++)
        for (int equal = 0; equal <= 1; equal++) {
            double ew = 0, eg = 0;
            for (int row = 0; row < 64; row++) {
                for (int i = 0; i < 1024; i++) {
                    x[i] = approx_normal(&st) * (i % 97 == 0 ? 4.0f : 1.0f) + (row % 4 == 1 ? 0.5f : 0.0f);
                    w[i] = equal ? 1.0f : 0.1f + 10.0f * (float)(splitmix(&st) >> 40) / (float)(1 << 24);
                }
                CHECK(mkmodel_quantize_row_weighted(ts[ti], x, w, q, 1024) == 0);
                CHECK(mkmodel_quantize_row(ts[ti], x, r, 1024) == 0);
                ew += werr(ts[ti], q, x, w, 1024);
                eg += werr(ts[ti], r, x, w, 1024);
            }
            CHECKF(ew < (equal ? 0.97 : 0.95) * eg, "%s, %s weights: weighted error %g, ggml's %g", dtype_name(ts[ti]),
                   equal ? "equal" : "random", ew, eg);
            fprintf(stderr, "%s, %s weights: weighted squared error %.4g (ggml's quantiser %.4g)\n",
                    dtype_name(ts[ti]), equal ? "equal" : "random", ew, eg);
        }
    for (int i = 0; i < 1024; i++) {
        ones[i] = 1.0f;
        x[i] = i < 512 ? 0.0f : approx_normal(&st);
        w[i] = i >= 256 && i < 768 ? 0.0f : 1.0f;
    }
    for (size_t ti = 0; ti < 2; ti++) {
        float back[1024];
        CHECK(mkmodel_quantize_row_weighted(ts[ti], x, w, q, 1024) == 0);
        dtype_dequant_row(ts[ti], q, back, 1024);
        int bad = 0;
        for (int i = 0; i < 1024; i++) {
            bad += !isfinite(back[i]);
            bad += i < 256 && back[i] != 0.0f; /* zeros of weight 1 */
        }
        CHECKF(bad == 0, "%s: %d values wrong with zero weights / zero values", dtype_name(ts[ti]), bad);
    }
    CHECK(mkmodel_quantize_row_weighted(DT_Q8_0, x, w, q, 1024) == 0);
    CHECK(mkmodel_quantize_row(DT_Q8_0, x, r, 1024) == 0 && memcmp(q, r, dtype_row_bytes(DT_Q8_0, 1024)) == 0);
    w[5] = -1.0f;
    CHECK(mkmodel_quantize_row_weighted(DT_Q4_K, x, w, q, 1024) == -1);
    w[5] = NAN;
    CHECK(mkmodel_quantize_row_weighted(DT_Q4_0, x, w, q, 1024) == -1);
    CHECK(mkmodel_quantize_row_weighted(DT_Q4_K, x, ones, q, 512 + 32) == -1);
    CHECK(mkmodel_quantize_row_weighted(DT_Q4_K, x, NULL, q, 1024) == -1);
}

/* mkmodel_convert: from an F32 file, each dtype: matrices re-rounded exactly as
 * mkmodel_quantize_row rounds the source rows (fallbacks where rows do not fit), 1-D tensors and
 * metadata copied. With pad 256: shapes, hyper-parameters, zero padding, norm scaling. */
static void test_convert(void)
{
    char err[256], pf[128], pc[128];
    mkmodel_params_t p = small_params(ARCH_QWEN2, DT_F32, 0);
    p.ffn_dim = 100; /* ffn_down's rows of 100 fit no block: kept in F32 */
    snprintf(pf, sizeof pf, "%s/src.gguf", tmpdir);
    snprintf(pc, sizeof pc, "%s/conv.gguf", tmpdir);
    CHECKF(mkmodel_write(&p, pf, err, sizeof err) == 0, "%s", err);
    gguf_t *gs = gguf_open(pf, err, sizeof err);
    CHECKF(gs != NULL, "%s", err);
    if (!gs) return;
    const int dts[] = {DT_F16, DT_Q8_0, DT_Q4_0, DT_Q4_K};
    for (int quant = MKMODEL_QUANT_IMPORTANCE; quant <= MKMODEL_QUANT_GGML; quant++)
    for (int pad = 0; pad <= 256; pad += 256)
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            int dt = dts[di];
            mkmodel_convert_t c = {.dtype = dt, .pad = pad, .quant = quant};
            CHECKF(mkmodel_convert(pf, pc, &c, NULL, err, sizeof err) == 0, "%s", err);
            gguf_t *g = gguf_open(pc, err, sizeof err);
            CHECKF(g != NULL, "%s", err);
            if (!g) continue;
            uint32_t u;
            float eps_s = 0, eps_d = 0;
            CHECK(gguf_get_u32(g, "general.file_type", &u) == 0 && u == file_type_want(dt));
            CHECK(gguf_n_tensors(g) == gguf_n_tensors(gs));
            uint64_t n1, n2;
            int et;
            gguf_str_t s1, s2;
            CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n1) == 0 &&
                  gguf_get_arr(gs, "tokenizer.ggml.tokens", &et, &n2) == 0 && n1 == n2);
            CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", 300, &s1) == 0 &&
                  gguf_get_arr_str(gs, "tokenizer.ggml.tokens", 300, &s2) == 0 &&
                  s1.len == s2.len && memcmp(s1.ptr, s2.ptr, s1.len) == 0);
            CHECK(gguf_get_f32(gs, "qwen2.attention.layer_norm_rms_epsilon", &eps_s) == 0 &&
                  gguf_get_f32(g, "qwen2.attention.layer_norm_rms_epsilon", &eps_d) == 0);
            CHECK(gguf_get_u32(g, "qwen2.rope.dimension_count", &u) == 0 && u == 16);
            int64_t dim2 = pad ? 256 : p.dim, ffn2 = pad ? 256 : p.ffn_dim;
            CHECK(gguf_get_u32(g, "qwen2.embedding_length", &u) == 0 && u == (uint32_t)dim2);
            CHECK(gguf_get_u32(g, "qwen2.feed_forward_length", &u) == 0 && u == (uint32_t)ffn2);
            if (pad) {
                CHECK(eps_d == eps_s / 4); /* dim / dim' = 1/4: exact */
                CHECK(gguf_get_u32(g, "qwen2.attention.key_length", &u) == 0 && u == 16);
            } else {
                CHECK(eps_d == eps_s && gguf_find_key(g, "qwen2.attention.key_length") < 0);
            }
            int bad_type = 0, bad_val = 0, bad_pad = 0, bad_err = 0;
            float *row = malloc(sizeof(float) * 256), *got = malloc(sizeof(float) * 256);
            float wq[256];
            uint8_t *q = malloc(2048);
            for (int64_t i = 0; i < gguf_n_tensors(gs); i++) {
                const gguf_tensor_t *ts = gguf_tensor(gs, i);
                const gguf_tensor_t *td = gguf_find_tensor(g, ts->name);
                if (!td) {
                    bad_type++;
                    continue;
                }
                int64_t rows_s = ts->ne[1], rows_d = td->ne[1];
                int is_norm = strstr(ts->name, "norm") != NULL;
                /* the importance quantiser: 4-bit matrices rounded against weights; attn_q's are
                 * its norm's values squared (floored at 1e-4 of their mean, padding too) */
                int weighted = quant == MKMODEL_QUANT_IMPORTANCE &&
                               (td->type == DT_Q4_0 || td->type == DT_Q4_K);
                int exact = !weighted || strstr(ts->name, "attn_q.weight") != NULL;
                if (weighted && exact) {
                    char nn[64];
                    snprintf(nn, sizeof nn, "blk.%d.attn_norm.weight", atoi(ts->name + 4));
                    const gguf_tensor_t *tn = gguf_find_tensor(gs, nn);
                    double mean = 0;
                    for (int64_t k = 0; k < ts->ne[0]; k++) {
                        float gk = ((const float *)tn->data)[k];
                        wq[k] = gk * gk;
                        mean += wq[k];
                    }
                    mean /= (double)ts->ne[0];
                    for (int64_t k = 0; k < td->ne[0]; k++)
                        if (k >= ts->ne[0] || wq[k] < 1e-4 * mean) wq[k] = (float)(1e-4 * mean);
                }
                int want_t = ts->n_dims == 2 ? mkmodel_matrix_type(dt, td->ne[0], DT_F32) : DT_F32;
                if (td->type != want_t || td->n_dims != ts->n_dims) bad_type++;
                if (!pad && (td->ne[0] != ts->ne[0] || rows_d != rows_s)) bad_type++;
                size_t rbs = dtype_row_bytes(ts->type, ts->ne[0]), rbd = dtype_row_bytes(td->type, td->ne[0]);
                for (int64_t r = 0; r < rows_d; r++) {
                    memset(row, 0, sizeof(float) * 256);
                    if (r < rows_s) dtype_dequant_row(ts->type, (const char *)ts->data + r * rbs, row, ts->ne[0]);
                    if (is_norm && pad)
                        for (int k = 0; k < 256; k++) row[k] *= 0.5f;
                    /* the destination row is the source row rounded to its type */
                    if (exact && ((weighted ? mkmodel_quantize_row_weighted(td->type, row, wq, q, td->ne[0])
                                            : mkmodel_quantize_row(td->type, row, q, td->ne[0])) != 0 ||
                                  memcmp(q, (const char *)td->data + r * rbd, rbd) != 0))
                        bad_val++;
                    dtype_dequant_row(td->type, (const char *)td->data + r * rbd, got, td->ne[0]);
                    /* every 4-bit weight within a step of its block's largest magnitude */
                    for (int64_t k = 0; weighted && k < td->ne[0]; k++) {
                        int64_t bl = dtype_block_elems(td->type), k0 = k / bl * bl;
                        float amax = 0;
                        for (int64_t j = k0; j < k0 + bl; j++) amax = fmaxf(amax, fabsf(row[j]));
                        bad_err += !(fabsf(got[k] - row[k]) <= amax / 7.0f);
                    }
                    /* padded rows, and padded columns outside the source's last partial block of
                     * 32, are exactly 0. (Within that block Q4_K may round the zeros to +-a
                     * fraction of a step; those columns only ever meet padded activations,
                     * which are exactly 0.) */
                    for (int64_t k = 0; k < td->ne[0]; k++)
                        if ((r >= rows_s || k >= (ts->ne[0] + 31) / 32 * 32) && got[k] != 0.0f)
                            bad_pad++;
                }
            }
            CHECKF(bad_type == 0 && bad_val == 0 && bad_pad == 0 && bad_err == 0,
                   "convert to %s pad %d quantiser %d: %d types, %d rows, %d padded values, %d "
                   "values wrong", dtype_name(dt), pad, quant, bad_type, bad_val, bad_pad, bad_err);
            free(row);
            free(got);
            free(q);
            gguf_close(g);
            unlink(pc);
        }
    /* padding something that is not a llama/qwen2 model's layout fails cleanly */
    mkmodel_convert_t c = {.dtype = DT_Q4_K, .pad = 0};
    CHECK(mkmodel_convert("/nonexistent.gguf", pc, &c, NULL, err, sizeof err) == -1);
    c.dtype = DT_Q8_K;
    CHECK(mkmodel_convert(pf, pc, &c, NULL, err, sizeof err) == -1 && strstr(err, "not supported"));
    c.dtype = DT_Q4_K;
    c.quant = 7;
    CHECK(mkmodel_convert(pf, pc, &c, NULL, err, sizeof err) == -1 && strstr(err, "quantiser"));
    CHECK(access(pc, F_OK) != 0);
    gguf_close(gs);
    unlink(pf);
}

/* MoE models: what mkmodel writes, and what model_load makes of it. */
static void test_moe(void)
{
    static const struct {
        int arch, n_expert, used, eff, dtype;
    } cases[] = {
        {ARCH_LLAMA, 4, 2, 0, DT_F32},
        {ARCH_QWEN2MOE, 4, 2, 64, DT_Q8_0},
        {ARCH_QWEN3MOE, 8, 3, 32, DT_F16},
    };
    char err[256], path[128], name[96];
    snprintf(path, sizeof path, "%s/moe.gguf", tmpdir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mkmodel_params_t p = small_params(ARCH_LLAMA, cases[i].dtype, 0);
        p.arch = cases[i].arch;
        p.n_expert = cases[i].n_expert;
        p.n_expert_used = cases[i].used;
        p.expert_ffn_dim = cases[i].eff;
        CHECKF(mkmodel_write(&p, path, err, sizeof err) == 0, "%s", err);
        const int eff = cases[i].eff ? cases[i].eff : p.ffn_dim, hd = p.dim / p.n_heads;
        const char *arch = p.arch == ARCH_LLAMA ? "llama" : p.arch == ARCH_QWEN2MOE ? "qwen2moe"
                                                                                   : "qwen3moe";
        gguf_t *g = gguf_open(path, err, sizeof err);
        CHECKF(g != NULL, "%s", err);
        if (!g) continue;
        gguf_str_t a;
        uint32_t u;
        CHECK(gguf_get_str(g, "general.architecture", &a) == 0 && str_eq(a, arch));
        snprintf(name, sizeof name, "%s.expert_count", arch);
        CHECK(gguf_get_u32(g, name, &u) == 0 && u == (uint32_t)p.n_expert);
        snprintf(name, sizeof name, "%s.expert_used_count", arch);
        CHECK(gguf_get_u32(g, name, &u) == 0 && u == (uint32_t)p.n_expert_used);
        snprintf(name, sizeof name, "%s.expert_feed_forward_length", arch);
        CHECK(p.arch == ARCH_LLAMA ? gguf_find_key(g, name) < 0
                                   : gguf_get_u32(g, name, &u) == 0 && u == (uint32_t)eff);
        for (int l = 0; l < p.n_layers; l++) {
            static const char *const exps[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, exps[k]);
                const gguf_tensor_t *t = gguf_find_tensor(g, name);
                int64_t in = k < 2 ? p.dim : eff, out = k < 2 ? eff : p.dim;
                CHECKF(t && t->n_dims == 3 && t->ne[0] == in && t->ne[1] == out &&
                           t->ne[2] == p.n_expert && t->type == cases[i].dtype,
                       "%s %s", arch, name);
            }
            snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
            const gguf_tensor_t *t = gguf_find_tensor(g, name);
            CHECKF(t && t->n_dims == 2 && t->ne[0] == p.dim && t->ne[1] == p.n_expert &&
                       t->type == DT_F32, "%s %s", arch, name);
            snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", l);
            CHECKF(!gguf_find_tensor(g, name), "%s: dense %s in a MoE file", arch, name);
            snprintf(name, sizeof name, "blk.%d.ffn_down_shexp.weight", l);
            t = gguf_find_tensor(g, name);
            CHECKF(p.arch == ARCH_QWEN2MOE ? t && t->ne[0] == p.ffn_dim && t->ne[1] == p.dim : !t,
                   "%s %s", arch, name);
            snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", l);
            t = gguf_find_tensor(g, name);
            CHECKF(p.arch == ARCH_QWEN2MOE ? t && t->n_dims == 1 && t->ne[0] == p.dim : !t,
                   "%s %s", arch, name);
            snprintf(name, sizeof name, "blk.%d.attn_k_norm.weight", l);
            t = gguf_find_tensor(g, name);
            CHECKF(p.arch == ARCH_QWEN3MOE ? t && t->n_dims == 1 && t->ne[0] == hd : !t, "%s %s",
                   arch, name);
        }
        gguf_close(g);
        model_t *m = model_load(path, err, sizeof err);
        CHECKF(m != NULL, "model_load %s: %s", arch, err);
        if (m) {
            const hparams_t *hp = &m->hp;
            CHECK(hp->n_expert == p.n_expert && hp->n_expert_used == p.n_expert_used &&
                  hp->expert_ffn_dim == eff);
            CHECK(hp->shexp_ffn_dim == (p.arch == ARCH_QWEN2MOE ? p.ffn_dim : 0));
            CHECK(hp->moe_norm_topk == (p.arch != ARCH_QWEN2MOE));
            CHECK(m->layers[1].down_exps.rows == (int64_t)p.n_expert * p.dim &&
                  m->layers[1].down_exps.cols == eff && !m->layers[1].w_gate.data);
            CHECK(!m->layers[0].q_norm.data == (p.arch != ARCH_QWEN3MOE));
            CHECK(!m->layers[0].bq.data == (p.arch != ARCH_QWEN2MOE));
            model_free(m);
        }
        unlink(path);
    }
    /* parameter validation */
    static const struct {
        int arch, n_expert, used, eff;
    } bad[] = {
        {ARCH_QWEN3MOE, 0, 0, 0},  {ARCH_QWEN2MOE, 0, 0, 0},  {ARCH_QWEN2, 4, 2, 0},
        {ARCH_LLAMA, 4, 0, 0},     {ARCH_LLAMA, 4, 5, 0},     {ARCH_LLAMA, 4, 2, 64},
        {ARCH_LLAMA, -1, 1, 0},    {ARCH_LLAMA, MODEL_MAX_EXPERTS + 1, 2, 0},
        {ARCH_QWEN3MOE, 4, 2, -1}, {ARCH_LLAMA, 128, MODEL_MAX_EXPERTS_USED + 1, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mkmodel_params_t p = small_params(ARCH_LLAMA, DT_F32, 0);
        p.arch = bad[i].arch;
        p.n_expert = bad[i].n_expert;
        p.n_expert_used = bad[i].used;
        p.expert_ffn_dim = bad[i].eff;
        CHECKF(mkmodel_write(&p, path, err, sizeof err) != 0, "bad MoE case %zu accepted", i);
    }
    mkmodel_params_t p = small_params(ARCH_LLAMA, DT_Q8_0, 0);
    p.arch = ARCH_QWEN3MOE;
    p.n_expert = 4;
    p.n_expert_used = 2;
    p.expert_ffn_dim = 48; /* Q8_0 rows of 48 */
    CHECK(mkmodel_write(&p, path, err, sizeof err) != 0);
}

/* The other architectures: mkmodel writes each with its tensors and keys, and model_load binds
 * them into the features of engine/model_arch.h. */
static void test_archs(void)
{
    char err[256], path[128];
    snprintf(path, sizeof path, "%s/arch.gguf", tmpdir);
    /* gemma2 always ties its output projection (llama.cpp refuses a gemma2 output.weight) */
    mkmodel_params_t untied = small_params(ARCH_LLAMA, DT_F32, 0);
    untied.arch = ARCH_GEMMA2;
    CHECK(mkmodel_write(&untied, path, err, sizeof err) != 0 && strstr(err, "ties") != NULL);
    const int arches[] = {ARCH_QWEN3, ARCH_GEMMA2, ARCH_GEMMA3, ARCH_PHI3};
    for (int a = 0; a < 4; a++) {
        mkmodel_params_t p = small_params(ARCH_LLAMA, DT_F32, arches[a] != ARCH_PHI3);
        p.arch = arches[a];
        p.head_dim = arches[a] == ARCH_PHI3 ? 0 : 24; /* 4 x 24 = 96 != dim 64 */
        p.swa_window = 8;
        p.n_layers = 3;
        if (arches[a] == ARCH_GEMMA3) p.swa_pattern = 3;
        if (arches[a] == ARCH_PHI3) {
            p.rope_scaling = "longrope";
            p.rope_orig_ctx = 64;
            p.rope_attn_factor = 1.25f;
        }
        CHECKF(mkmodel_write(&p, path, err, sizeof err) == 0, "%s", err);
        model_t *m = model_load(path, err, sizeof err);
        CHECKF(m != NULL, "arch %d: %s", arches[a], err);
        if (!m) continue;
        const hparams_t *hp = &m->hp;
        const int gemma = arches[a] == ARCH_GEMMA2 || arches[a] == ARCH_GEMMA3;
        const int hd = arches[a] == ARCH_PHI3 ? 16 : 24;
        CHECK(hp->arch == arches[a] && hp->head_dim == hd && hp->rope_kind == ROPE_NEOX);
        CHECK(hp->qk_norm == (arches[a] == ARCH_QWEN3 || arches[a] == ARCH_GEMMA3));
        CHECK(hp->post_norms == gemma && (hp->ffn_act == FFN_GELU_TANH) == gemma);
        CHECK(hp->embd_scale == (gemma ? sqrtf(64.0f) : 1.0f));
        CHECK(fabsf(hp->attn_scale - 1.0f / sqrtf((float)hd)) < 1e-7f);
        CHECK(hp->attn_softcap == (arches[a] == ARCH_GEMMA2 ? 50.0f : 0.0f));
        CHECK(hp->logit_softcap == (arches[a] == ARCH_GEMMA2 ? 30.0f : 0.0f));
        CHECK(!model_is_plain_llama(m));
        for (int l = 0; l < 3; l++) {
            const layer_weights_t *L = &m->layers[l];
            /* gemma2: pattern 2 (layers 0, 2 local); gemma3: pattern 3 (0, 1); qwen3 and phi3
             * have no window */
            int local = arches[a] == ARCH_GEMMA2 ? l % 2 == 0 : arches[a] == ARCH_GEMMA3 ? l < 2 : 0;
            CHECKF(L->window == (local ? 8 : 0), "arch %d layer %d window %d", arches[a], l,
                   L->window);
            CHECK((L->q_norm.data != NULL) == hp->qk_norm && (L->k_norm.data != NULL) == hp->qk_norm);
            CHECK((L->post_attn_norm.data != NULL) == gemma && (L->post_ffn_norm.data != NULL) == gemma);
            CHECK(L->wq.rows == 4 * hd && L->wk.rows == 2 * hd && L->wv.rows == 2 * hd &&
                  L->wo.cols == 4 * hd && L->w_gate.rows == 96 && L->w_up.rows == 96);
            /* gemma3's local layers: RoPE base 10000 against the global 10000 of the preset, so
             * one table */
            CHECK(L->rope_idx == 0);
        }
        if (arches[a] == ARCH_PHI3) {
            /* fused tensors bound as consecutive row ranges of one matrix */
            const layer_weights_t *L = &m->layers[1];
            CHECK((const char *)L->wk.data == (const char *)L->wq.data + 64 * L->wq.row_bytes);
            CHECK((const char *)L->wv.data == (const char *)L->wk.data + 32 * L->wk.row_bytes);
            CHECK((const char *)L->w_up.data == (const char *)L->w_gate.data + 96 * L->w_gate.row_bytes);
            /* LongRoPE: context 128 > original 64, so the long factors (mean 2) divide the
             * frequencies; the attention factor scales cos and sin */
            CHECK(m->rope[0].mscale == 1.25f && m->rope[0].ext_factor == 0.0f);
            double ratio = m->rope_inv_freq[1] / pow(10000.0, -2.0 / 16.0);
            CHECKF(ratio > 1.0 / 3.0 && ratio < 1.0 / 1.5, "long factor ratio %g", ratio);
            /* served with a context of at most the original 64: the short factors (mean 1.2),
             * another fingerprint; back at 128 the long ones and the load-time fingerprint */
            uint64_t fp = m->fingerprint;
            CHECK(m->hp.rope_long == 1 && model_select_context(m, 128) == 0);
            CHECK(model_select_context(m, 64) == 1 && m->hp.rope_long == 0 && m->fingerprint != fp);
            ratio = m->rope_inv_freq[1] / pow(10000.0, -2.0 / 16.0);
            CHECKF(ratio > 1.0 / 1.45 && ratio < 1.0 / 1.0, "short factor ratio %g", ratio);
            CHECK(model_select_context(m, 64) == 0);
            CHECK(model_select_context(m, 100) == 1 && m->hp.rope_long == 1);
            ratio = m->rope_inv_freq[1] / pow(10000.0, -2.0 / 16.0);
            CHECK(ratio > 1.0 / 3.0 && ratio < 1.0 / 1.5);
        }
        model_free(m);
    }
    /* gemma3 with its own local RoPE base: two tables, local layers on the second */
    mkmodel_params_t p = small_params(ARCH_LLAMA, DT_F32, 1);
    p.arch = ARCH_GEMMA3;
    p.swa_window = 4;
    p.rope_theta = 1e6f;
    CHECKF(mkmodel_write(&p, path, err, sizeof err) == 0, "%s", err);
    model_t *m = model_load(path, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    if (m) {
        CHECK(m->hp.rope_theta_swa == 10000.0f && m->rope_inv_freq_swa != NULL);
        CHECK(m->layers[0].rope_idx == 1 && m->layers[1].rope_idx == 1 && m->layers[0].window == 4);
        CHECK(m->rope[1].inv_freq[1] == (float)pow(10000.0, -2.0 / 16.0));
        model_free(m);
    }
    /* YaRN: extrapolation on, magnitude 1 + 0.1 ln 4 */
    p = small_params(ARCH_LLAMA, DT_F32, 0);
    p.rope_scaling = "yarn";
    p.rope_factor = 4.0f;
    p.rope_orig_ctx = 32;
    CHECKF(mkmodel_write(&p, path, err, sizeof err) == 0, "%s", err);
    m = model_load(path, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    if (m) {
        CHECK(m->rope[0].ext_factor == 1.0f && m->hp.rope_freq_scale == 0.25f);
        CHECKF(fabsf(m->rope[0].mscale - (1.0f + 0.1f * logf(4.0f))) < 1e-6f, "mscale %g",
               (double)m->rope[0].mscale);
        CHECK(m->rope[0].corr_lo >= 0 && m->rope[0].corr_hi <= 15 &&
              m->rope[0].corr_lo < m->rope[0].corr_hi);
        CHECK(!model_is_plain_llama(m));
        model_free(m);
    }
    p.rope_scaling = "dynamic";
    CHECK(mkmodel_write(&p, path, err, sizeof err) != 0);
    unlink(path);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "test_mkmodel.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_all_variants();
    test_archs();
    test_q4k_shapes();
    test_quantize_golden();
    test_quantize_weighted();
    test_convert();
    test_determinism();
    test_validation_and_presets();
    test_big_vocab();
    test_moe();
    if (rmdir(tmpdir) != 0) {
        fprintf(stderr, "temp dir %s not empty\n", tmpdir);
        check_failures_++;
    }
    return check_exit();
}
