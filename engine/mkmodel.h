/* engine/mkmodel.h: synthetic Llama-family GGUF models (spillway mkmodel, tests, benchmarks).
 *
 * The file has llama.cpp's keys and tensor names, so llama.cpp loads it too: architecture
 * "llama" or "qwen2", hyper-parameters under "<arch>.", an SPM ("llama") tokenizer of the
 * requested size, and seeded random weights (deterministic: same params, same bytes, on every
 * machine). Tensors are generated row by row while the file is written, so even an 8B model
 * needs only a few MB of memory. Pure functions of their arguments; thread-safe. */
#ifndef SPILLWAY_ENGINE_MKMODEL_H
#define SPILLWAY_ENGINE_MKMODEL_H

#include <stddef.h>
#include <stdint.h>

/* The smallest vocabulary: <unk>, <s>, </s>, 256 byte tokens, "▁". */
#define MKMODEL_MIN_VOCAB 260
#define MKMODEL_PRESETS "tiny, qwen2-tiny, smollm2-135m, llama-3.2-1b, llama-3.1-8b"

typedef struct {
    int arch;        /* enum model_arch (engine/model.h): ARCH_LLAMA or ARCH_QWEN2 */
    int dim;         /* embedding length; a multiple of n_heads, head_dim = dim / n_heads even */
    int n_layers;
    int n_heads;
    int n_kv_heads;  /* divides n_heads */
    int ffn_dim;
    int n_vocab;     /* >= MKMODEL_MIN_VOCAB */
    int ctx_len;     /* trained context length (metadata only) */
    int dtype;       /* enum dtype of every matrix incl. token_embd/output: DT_F32, DT_F16,
                      * DT_BF16 or DT_Q8_0 (Q8_0: dim and ffn_dim multiples of 32). Norms and
                      * biases are always F32. */
    int tied;        /* 1: no output.weight, the output projection shares token_embd */
    uint64_t seed;   /* weights are a function of (seed, tensor name, row) */
    float rope_theta;
    float norm_eps;  /* RMSNorm epsilon */
} mkmodel_params_t;

/* Fills p with a named preset (MKMODEL_PRESETS); 0, or -1 for an unknown name (p untouched).
 * Presets use F32 for the tiny models and F16 for the real-size ones; seed 1. */
int mkmodel_preset(const char *name, mkmodel_params_t *p);

/* Validates p and writes the model to path (atomically). 0, or -1 with errstr set. */
int mkmodel_write(const mkmodel_params_t *p, const char *path, char *errstr, size_t errlen);

#endif
