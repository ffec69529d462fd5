/* engine/model_arch.h: what each supported architecture adds to the llama forward pass, and the
 * RoPE tables. Internal to engine/model.c (and cli/plan.c, which sizes the same models).
 *
 * Every architecture is the one forward pass of engine/cpu/cpu_backend.c with some of the
 * hparams_t feature fields set; nothing here computes a forward pass. Keys and defaults are
 * llama.cpp's (src/llama-model.cpp load_hparams and the per-architecture loaders). */
#ifndef SPILLWAY_ENGINE_MODEL_ARCH_H
#define SPILLWAY_ENGINE_MODEL_ARCH_H

#include <stddef.h>

#include "gguf.h"
#include "model.h"

/* Fills hp->arch, hp->rope_kind and the feature fields' architecture defaults for
 * hp->arch_name. 0, or -1 for an architecture spillway does not run. */
int model_arch_lookup(hparams_t *hp);

/* 1 when architecture `arch` (enum model_arch) binds tensor kinds: */
int model_arch_has_qkv_bias(int arch);   /* attn_q/k/v.bias required (qwen2) */
int model_arch_fused(int arch);          /* attn_qkv may be fused, ffn_up is gate+up (phi3) */

/* Reads the architecture's own keys once the dimensions in hp are set: soft-caps, sliding
 * window and its layer pattern, the local layers' RoPE base; derives attn_scale and embd_scale.
 * 0, or -1 + errstr for a bad value. */
int model_arch_hparams(const gguf_t *g, hparams_t *hp, char *errstr, size_t errlen);

/* m->layers[l].window and .rope_idx for every layer (hp and m->layers allocated). A per-layer
 * "<arch>.attention.sliding_window_pattern" array (bool or integer, 1 = local) overrides the
 * pattern rule. 0, or -1 + errstr. */
int model_arch_layers(model_t *m, char *errstr, size_t errlen);

/* RoPE: reads the scaling keys (rope.scaling.type none | linear | yarn | longrope | llama3,
 * .factor or the older rope.scale_linear, .original_context_length, .attn_factor,
 * .yarn_beta_fast/.yarn_beta_slow, Llama 3's .low_freq_factor/.high_freq_factor) and the factor
 * tensors (rope_freqs, or Phi-3's rope_factors_long / rope_factors_short: long when the model's
 * context exceeds the original one, as llama.cpp chooses by context size), sets
 * hp->rope_freq_scale and fills m->rope[0] (allocating m->rope_inv_freq) and m->rope[1] (the
 * local layers' table, allocating m->rope_inv_freq_swa when its base differs). 0, or -1 + errstr. */
int model_rope_init(model_t *m, char *errstr, size_t errlen);

/* "<arch>.<suffix>" as a float into *out, def when absent; 0, or -1 when present but not a
 * number. */
int model_arch_f32(const gguf_t *g, const char *arch, const char *suffix, float def, float *out);

#endif
