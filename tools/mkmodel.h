/* tools/mkmodel.h: synthetic Llama-family GGUF models (spillway mkmodel, tests, benchmarks).
 *
 * The file has llama.cpp's keys and tensor names, so llama.cpp loads it too: architecture
 * "llama" or "qwen2", hyper-parameters under "<arch>.", an SPM ("llama") tokenizer of the
 * requested size, and seeded random weights (deterministic: same params, same bytes, on every
 * machine). Tensors are generated row by row while the file is written, so even an 8B model
 * needs only a few MB of memory. Pure functions of their arguments; thread-safe. */
#ifndef SPILLWAY_TOOLS_MKMODEL_H
#define SPILLWAY_TOOLS_MKMODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The smallest vocabulary: <unk>, <s>, </s>, 256 byte tokens, "▁". */
#define MKMODEL_MIN_VOCAB 260
#define MKMODEL_PRESETS "tiny, qwen2-tiny, smollm2-135m, llama-3.2-1b, llama-3.1-8b"

typedef struct {
    int arch;        /* enum model_arch (engine/model.h): ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3,
                      * ARCH_GEMMA2, ARCH_GEMMA3, ARCH_PHI3, ARCH_QWEN2MOE or ARCH_QWEN3MOE, with that
                      * architecture's tensors (qwen3 / gemma3 / qwen3moe Q/K norms, gemma
                      * post-norms, phi3's fused attn_qkv and gate+up ffn_up, qwen2moe biases) */
    int dim;         /* embedding length; a multiple of n_heads, head_dim = dim / n_heads even,
                      * unless head_dim is given */
    int n_layers;
    int n_heads;
    int n_kv_heads;  /* divides n_heads */
    int ffn_dim;
    int n_vocab;     /* >= MKMODEL_MIN_VOCAB */
    int ctx_len;     /* trained context length (metadata only) */
    int dtype;       /* enum dtype of every matrix incl. token_embd/output: DT_F32, DT_F16,
                      * DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_Q4_1, DT_Q5_0,
                      * DT_Q5_1, DT_IQ4_NL, DT_IQ4_XS, DT_Q3_K or DT_Q2_K (the block types: dim
                      * and ffn_dim multiples of 32; K-quant matrices whose rows are not a multiple
                      * of 256 are written as Q4_0 (Q4_K, Q3_K, Q2_K), Q8_0 (Q5_K, Q6_K) or IQ4_NL
                      * (IQ4_XS), see mkmodel_matrix_type). Norms and biases are always F32. */
    int tied;        /* 1: no output.weight, the output projection shares token_embd */
    uint64_t seed;   /* weights are a function of (seed, tensor name, row) */
    float rope_theta;
    float norm_eps;  /* RMSNorm epsilon */
    /* Optional keys (0 / NULL: not written, the architecture's default applies). */
    int head_dim;    /* attention.key_length / value_length (any even value) */
    int swa_window;  /* attention.sliding_window */
    int swa_pattern; /* attention.sliding_window_pattern */
    float rope_theta_swa;  /* rope.freq_base_swa */
    float attn_softcap;    /* attn_logit_softcapping */
    float logit_softcap;   /* final_logit_softcapping */
    const char *rope_scaling; /* rope.scaling.type: "linear", "yarn", "llama3" or "longrope";
                               * longrope also writes rope_factors_long / _short (seeded, in
                               * [1.5, 2.5]) */
    float rope_factor;     /* rope.scaling.factor */
    int rope_orig_ctx;     /* rope.scaling.original_context_length */
    float rope_attn_factor; /* rope.scaling.attn_factor */
    /* Mixture of experts: n_expert > 0 makes every FFN routed (llama: Mixtral-style, expert
     * size ffn_dim; qwen2moe / qwen3moe need it, expert size expert_ffn_dim, and qwen2moe adds a
     * shared expert of size ffn_dim). Router ffn_gate_inp (and qwen2moe's ffn_gate_inp_shexp)
     * F32 with std 1/sqrt(dim); qwen3moe adds F32 attn_q_norm / attn_k_norm weights. */
    int n_expert;        /* 0 (dense) or 1..MODEL_MAX_EXPERTS */
    int n_expert_used;   /* top-k, 1..n_expert (when n_expert > 0) */
    int expert_ffn_dim;  /* qwen*moe: each expert's FFN size (0: ffn_dim) */
    const char *vocab_from; /* NULL: the SPM vocabulary above. Else a GGUF file whose
                             * tokenizer.* keys are copied as they are (e.g. a GPT-2 BPE
                             * vocabulary); n_vocab must equal its token count
                             * (mkmodel_vocab_size) */
} mkmodel_params_t;

/* Number of tokens (tokenizer.ggml.tokens) of the GGUF file at path; -1 with errstr. */
int mkmodel_vocab_size(const char *path, char *errstr, size_t errlen);

/* Fills p with a named preset (MKMODEL_PRESETS); 0, or -1 for an unknown name (p untouched).
 * Presets use F32 for the tiny models and F16 for the real-size ones; seed 1. */
int mkmodel_preset(const char *name, mkmodel_params_t *p);

/* Validates p and writes the model to path (atomically). 0, or -1 with errstr set. */
int mkmodel_write(const mkmodel_params_t *p, const char *path, char *errstr, size_t errlen);

/* Rounds n floats x (n a multiple of t's block) to type t into dst (dtype_row_bytes(t, n) bytes):
 * F32, F16 and BF16 round to nearest even; the block types follow ggml's reference quantisers
 * (quantize_row_q8_0_ref, _q4_0_ref, _q4_K_ref: same algorithm and float operation order, so
 * llama-quantize writes the same bytes for the same input):
 *   Q8_0  d = amax / 127, q = round(x / d)
 *   Q4_0  d = m / -8 where m is the value of largest magnitude, q = min(15, trunc(x / d + 8.5))
 *   Q4_K  per 32-element sub-block a scale and min fitted by weighted least squares over a
 *         small grid of candidate scales (weights |x| + rms of the sub-block), the scales and
 *         mins then quantised to 6 bits against their super-block maxima (fp16 d, dmin), and
 *         the quants recomputed from the stored 6-bit values.
 *   Q5_K, Q6_K  spillway's own simpler rounding, not ggml's (tools/mkmodel_q56k.h), with
 *         either quantiser of mkmodel_convert.
 *   Q2_K, Q3_K  our own quantisers too (tools/quant_q23k.h), with either quantiser of
 *         mkmodel_convert: the bytes differ from llama-quantize's.
 * Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS use spillway's own simple quantisers (tools/qleg_quant.h;
 * not ggml's bytes).
 * 0, or -1 for another type or n not a multiple of the block. Pure; thread-safe. */
int mkmodel_quantize_row(int t, const float *x, void *dst, int64_t n);

/* As mkmodel_quantize_row, minimising sum_j w[j] (x[j] - q[j])^2 (w: n finite weights >= 0,
 * e.g. the importance of each input column of a matrix row) for the 4-bit types:
 *   Q4_0  the best of 21 candidate scales around ggml's (m / (-8 +- 1)), each refitted to its
 *         quants by weighted least squares;
 *   Q4_K  ggml's fit with these weights, then rounds of (a) each sub-block's 6-bit scale and min
 *         moved within +-3 to the pair of least error with the quants re-rounded and (b) the
 *         fp16 d and dmin refitted by weighted least squares, while the error falls.
 * The block's weighted error is never above that of the reference fit with the same weights.
 * Other types round as mkmodel_quantize_row (w unused). 0, or -1 for an unsupported type, n not
 * a multiple of the block, or a negative / non-finite weight. Pure; thread-safe. */
int mkmodel_quantize_row_weighted(int t, const float *x, const float *w, void *dst, int64_t n);

/* The type a matrix with rows of ne0 elements is written in when `want` is asked for: want when
 * ne0 is a multiple of its block; for Q4_K, Q3_K and Q2_K otherwise Q4_0 when ne0 is a multiple
 * of 32 (llama.cpp falls back to Q5_0), for Q5_K and Q6_K Q8_0 (the 8-bit fallback, where
 * llama.cpp takes Q5_1 / Q8_0), for IQ4_XS IQ4_NL (as llama.cpp); otherwise `keep` (the
 * synthetic writer refuses such shapes; conversion keeps the source type). */
int mkmodel_matrix_type(int want, int64_t ne0, int keep);

/* Conversion of an existing GGUF model (spillway mkmodel --from). */
typedef struct {
    int dtype;       /* type of the 2-D weight matrices, as mkmodel_params_t.dtype; a matrix whose
                      * rows do not fit falls back (mkmodel_matrix_type, keep = its source type).
                      * 1-D tensors (norms, biases, rope factors) are copied as they are. */
    int pad;         /* 0, or pad embedding_length and feed_forward_length up to a multiple of
                      * pad with zero rows/columns (see mkmodel_convert) */
    int quant;       /* MKMODEL_QUANT_IMPORTANCE (0, the default) or MKMODEL_QUANT_GGML: how
                      * Q4_0 and Q4_K matrices are rounded (see mkmodel_convert) */
} mkmodel_convert_t;

enum { MKMODEL_QUANT_IMPORTANCE = 0, MKMODEL_QUANT_GGML = 1 };

/* Writes src's metadata and tensors to dst (atomically), every 2-D matrix of a computable type
 * re-rounded to c->dtype (dequantised to F32 first when it is a block type; a matrix already of
 * its target type is copied byte for byte). general.file_type and general.name follow the new
 * type.
 *
 * Padding (c->pad > 0; llama and qwen2 files): a model whose dimensions are not multiples of a
 * block (e.g. stories260K, dim 64, ffn 172, with Q4_K's 256) becomes an equivalent one whose
 * dimensions are: every matrix gets zero input columns up to dim' (or ffn') and zero output rows
 * up to dim' (or ffn'), token embeddings zero columns, the RMSNorm weights are scaled by
 * sqrt(dim / dim') with the epsilon by dim / dim' (so x / rms(x) * w is unchanged when the
 * residual stream carries zeros in the new lanes), and the head dimension is kept explicitly
 * (attention.key_length). The padded lanes of the residual stream stay exactly zero, so the
 * F32 model computes the same logits (bit for bit on this engine when dim' / dim is a power of
 * 4, as 64 -> 256). attn_output's rows (n_heads * head_dim) are not padded. Rounded to a block
 * type, padded rows and whole padded 32-blocks stay exactly 0; padded zeros that share a 32-block
 * with real values may become a fraction of a step under Q4_K (its min offset), which is harmless
 * in ffn_down (its padded inputs are exactly 0) and matters only for a dim not a multiple of 32.
 *
 * Quantiser: MKMODEL_QUANT_GGML rounds with ggml's reference quantisers (mkmodel_quantize_row:
 * llama-quantize's bytes without an importance matrix). MKMODEL_QUANT_IMPORTANCE rounds Q4_0 and
 * Q4_K matrices with mkmodel_quantize_row_weighted, each column weighted by the expected square
 * of its input lane, estimated from the model's own weights (no calibration text): for a
 * normalised residual stream of independent unit lanes, the RMSNorm weight squared for the
 * matrices that read a norm (attn_q/k/v, ffn_gate/up, output), E[silu(gate)^2] E[up^2] for
 * ffn_down and the value lane's E[v^2] for attn_output; matrices without an estimate (token_embd)
 * get equal weights. On stories260K (padded to 256, Q4_K) this takes perplexity from +10% to +4%
 * over F32 (bench/RESULTS.md). Q8_0 and the float types round the same either way.
 * log (may be NULL): one line per tensor that falls back, and a summary. 0, or -1 + errstr. */
int mkmodel_convert(const char *src, const char *dst, const mkmodel_convert_t *c, FILE *log,
                    char *errstr, size_t errlen);

#endif
