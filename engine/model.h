/* engine/model.h: a Llama-family model bound to the tensors of a GGUF file. Internal.
 *
 * model_load() reads hyper-parameters from the GGUF metadata and binds every tensor (no copy:
 * weights point into the gguf_t mapping, which the model owns). Immutable after load: safe to
 * share between threads.
 *
 * Matrix convention: a weight W of GGUF shape ne = {in, out} is row-major [out][in]; row o is
 * the contiguous vector of `in` elements, so y[o] = dot(W[o, :], x). */
#ifndef SPILLWAY_ENGINE_MODEL_H
#define SPILLWAY_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

enum model_arch {
    ARCH_LLAMA = 0,
    ARCH_QWEN2 = 1,
    ARCH_QWEN3 = 2,
    ARCH_GEMMA2 = 3,
    ARCH_GEMMA3 = 4,
    ARCH_PHI3 = 5,
    ARCH_QWEN2MOE = 10,  /* qwen2 attention, routed experts + a sigmoid-gated shared expert */
    ARCH_QWEN3MOE = 11,  /* qwen3 attention (Q/K norms), routed experts, renormalised top-k */
};
/* Limits model_load accepts for <arch>.expert_count and .expert_used_count. */
#define MODEL_MAX_EXPERTS 1024
#define MODEL_MAX_EXPERTS_USED 64
/* "llama" covers Mixtral-style llama files too (llama.expert_count > 0, *_exps tensors). */
#define MODEL_ARCH_SUPPORTED "llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen2moe, qwen3moe"

/* Activation of the gated FFN: down(act(gate x) * up x). */
enum ffn_act { FFN_SILU = 0, FFN_GELU_TANH = 1 };

/* RoPE pairing: NORM rotates adjacent pairs (x[2i], x[2i+1]) (llama GGUF, whose Q/K rows the
 * converter permuted); NEOX rotates (x[i], x[i + d/2]) (qwen2). */
enum rope_kind { ROPE_NORM = 0, ROPE_NEOX = 1 };

typedef struct {
    int type;            /* enum dtype */
    const void *data;    /* [rows][cols] in type's row format; borrowed from the mapping */
    int64_t rows, cols;  /* out, in */
    size_t row_bytes;
} weight_t;

typedef struct {
    weight_t attn_norm;  /* F32 [dim] (converted at load when stored otherwise) */
    weight_t wq;         /* [n_heads * head_dim][dim] */
    weight_t wk;         /* [n_kv_heads * head_dim][dim] */
    weight_t wv;         /* [n_kv_heads * head_dim][dim] */
    weight_t wo;         /* [dim][n_heads * head_dim] */
    weight_t bq, bk, bv; /* F32 biases (qwen2), data NULL when absent */
    /* phi3's fused attn_qkv is bound as three row ranges: wq, wk, wv point into it. */
    weight_t q_norm;     /* F32 [head_dim]: per-head RMSNorm of Q before RoPE (qwen3, gemma3), or
                            data NULL */
    weight_t k_norm;     /* F32 [head_dim]: the same for K */
    weight_t post_attn_norm; /* F32 [dim]: RMSNorm of the attention branch before its residual
                                add (gemma2, gemma3), or data NULL */
    int window;          /* sliding window W: a query at p sees keys p-W+1 .. p; 0 = all of 0 .. p */
    int rope_idx;        /* index into model_t.rope of this layer's RoPE table */
    weight_t ffn_norm;   /* F32 [dim] */
    weight_t w_gate;     /* [ffn_dim][dim] */
    weight_t w_up;       /* [ffn_dim][dim] */
    weight_t w_down;     /* [dim][ffn_dim] */
    /* phi3's fused ffn_up (gate rows, then up rows) is bound as w_gate and w_up row ranges. */
    weight_t post_ffn_norm; /* F32 [dim]: RMSNorm of the FFN branch before its residual add
                               (gemma2, gemma3), or data NULL */
    /* Mixture of experts (hp.n_expert > 0; w_gate/w_up/w_down are then unbound). The 3-D
     * GGUF tensors {in, out, n_expert} are bound as matrices of n_expert * out rows: expert e's
     * matrix is rows [e * out, (e + 1) * out). eff = hp.expert_ffn_dim, sff = hp.shexp_ffn_dim. */
    weight_t ffn_gate_inp;    /* router [n_expert][dim] */
    weight_t gate_exps;       /* [n_expert * eff][dim] */
    weight_t up_exps;         /* [n_expert * eff][dim] */
    weight_t down_exps;       /* [n_expert * dim][eff] */
    weight_t gate_inp_shexp;  /* [1][dim] shared expert's gate (qwen2moe), data NULL when absent */
    weight_t gate_shexp;      /* [sff][dim] */
    weight_t up_shexp;        /* [sff][dim] */
    weight_t down_shexp;      /* [dim][sff] */
} layer_weights_t;

/* One RoPE table (engine/model_arch.c). Pair i of a head at position p is rotated by
 *   theta_e = p * inv_freq[i],  theta_i = freq_scale * theta_e,
 *   theta   = theta_i                                   (ext_factor 0)
 *           = theta_i * (1 - r_i) + theta_e * r_i       (YaRN: r_i = ext_factor * ramp(i), ramp 1
 *             below corr_lo falling linearly to 0 at corr_hi)
 * with cos(theta) * mscale and sin(theta) * mscale (ggml's rope_yarn). */
typedef struct {
    const float *inv_freq; /* [rope_dim / 2]: base^(-2i/rope_dim) / freq factor i; in owned storage */
    float freq_scale;      /* 1 / linear or YaRN factor (1 = none) */
    float ext_factor;      /* YaRN extrapolation mix (0 = none) */
    float corr_lo, corr_hi; /* YaRN ramp ends, in pairs */
    float mscale;          /* cos/sin multiplier (YaRN magnitude, rope.scaling.attn_factor) */
} rope_table_t;

typedef struct {
    int arch;            /* enum model_arch */
    char arch_name[32];
    int n_vocab;
    int dim;             /* embedding length */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;        /* dim / n_heads unless the file says otherwise */
    int ffn_dim;
    int ctx_len;         /* trained context length */
    float norm_eps;      /* RMSNorm epsilon */
    int rope_kind;       /* enum rope_kind */
    float rope_theta;    /* base frequency */
    int rope_dim;        /* rotated dims per head (= head_dim unless the file says less) */
    float rope_freq_scale; /* linear scaling: positions multiplied by this (1 = none) */
    /* Architecture features beyond the llama forward pass (engine/model_arch.c sets them from
     * the architecture and its keys); the values below are llama's and qwen2's. */
    int qk_norm;         /* 1: layers have q_norm / k_norm */
    int post_norms;      /* 1: layers have post_attn_norm / post_ffn_norm */
    int ffn_act;         /* enum ffn_act (FFN_SILU) */
    float embd_scale;    /* token embeddings multiplied by this in F32 before layer 0 (1) */
    float attn_scale;    /* attention score = (q . k) * attn_scale (1/sqrt(head_dim)) */
    float attn_softcap;  /* > 0: score s -> attn_softcap * tanh(s / attn_softcap) (0) */
    float logit_softcap; /* > 0: logit l -> logit_softcap * tanh(l / logit_softcap) (0) */
    int swa_window;      /* sliding window of the local layers, 0 = none (0) */
    int swa_pattern;     /* with a window: layer l is local iff l % swa_pattern < swa_pattern - 1;
                            0 = every layer local (llama.cpp's set_swa_pattern) */
    float rope_theta_swa; /* RoPE base of the local layers (gemma3; = rope_theta otherwise) */
    int rope_long;       /* Phi-3 LongRoPE: 1 = rope_factors_long in use, 0 = the short ones
                            (or none) */
    /* Mixture of experts (engine/cpu/moe.h); all 0 for a dense model. */
    int n_expert;        /* experts per layer (<arch>.expert_count); 0 = dense FFN */
    int n_expert_used;   /* experts per token, top-k (<arch>.expert_used_count) */
    int expert_ffn_dim;  /* FFN size of one expert */
    int shexp_ffn_dim;   /* FFN size of the shared expert; 0 = none */
    int moe_norm_topk;   /* 1: the k routing weights are divided by their sum */
} hparams_t;

typedef struct model {
    hparams_t hp;
    gguf_t *gguf;                 /* owned */
    weight_t tok_embd;            /* [n_vocab][dim] */
    weight_t output_norm;         /* F32 [dim] */
    weight_t output;              /* [n_vocab][dim]; same data as tok_embd when tied */
    int tied_output;
    layer_weights_t *layers;      /* [n_layers], owned */
    float *rope_inv_freq;         /* [rope_dim / 2] owned: theta^(-2i/rope_dim) / freq factor */
    rope_table_t rope[2];         /* [0]: global layers (inv_freq = rope_inv_freq); [1]: local
                                     (sliding-window) layers when they differ (gemma3) */
    float *rope_inv_freq_swa;     /* [rope_dim / 2] owned, rope[1]'s, or NULL */
    const float *rope_factors[2]; /* Phi-3 LongRoPE short [0] and long [1] factors (in the
                                     mapping), or NULL */
    int rope_orig_ctx;            /* their original context */
    float *owned_f32;             /* norms/biases converted to F32 at load, owned */
    uint64_t fingerprint;         /* hash of hparams, tensor names/types/shapes and weight bytes sample */
    int weight_type;              /* dominant matrix dtype (for display) */
    size_t weight_bytes;          /* sum of all tensor bytes */
} model_t;

/* Loads path. Returns NULL and fills errstr on error (unsupported arch names the supported ones;
 * unsupported tensor type names the supported ones; missing tensor names it). Takes ownership of
 * nothing; the returned model owns its gguf_t. */
model_t *model_load(const char *path, char *errstr, size_t errlen);
void model_free(model_t *m);

/* 1 when m uses only the llama / qwen2 forward pass (none of the hparams_t architecture features,
 * no YaRN, LongRoPE magnitude or sliding window): what a backend without them can run. */
int model_is_plain_llama(const model_t *m);

/* Phi-3 LongRoPE (model.rope_factors): selects the long factors when n_ctx (the context served
 * per sequence) exceeds the original context, else the short ones, as llama.cpp chooses by its
 * context size; model_load chose by the trained context. A change recomputes rope_inv_freq and
 * the fingerprint. Call before creating a backend (the model is not shared yet). 1 when it
 * changed, else 0. */
int model_select_context(model_t *m, int n_ctx);

/* W when every layer of m has a sliding window (W the largest): a query at position p then reads
 * no key before p - W + 1, so the KV blocks wholly before that may be released (engine.c). 0
 * when some layer attends to the whole context. */
int model_kv_window(const model_t *m);

/* Bytes of K+V per token per layer set, for a KV element size of elem_bytes. */
size_t model_kv_bytes_per_token(const model_t *m, size_t elem_bytes);

/* Reads "<arch>.<suffix>" of g as an integer into *out, def when absent; a per-layer INT32/UINT32
 * array is accepted when all its elements are equal. 0, or -1 when present but unusable. Used by
 * model_load and by `spillway plan`, so both read hyper-parameters the same way. */
int model_arch_int(const gguf_t *g, const char *arch, const char *suffix, int64_t def,
                   int64_t *out);

#endif
