/* engine/cpu/arch_ops.h: the pieces of the forward pass that only some architectures use
 * (engine/model_arch.h): RoPE tables with YaRN / magnitude, the tanh-approximation GELU of the
 * Gemma FFN, tanh soft-capping. Internal to the CPU backend; portable C, pure functions,
 * thread-safe on disjoint outputs. */
#ifndef SPILLWAY_ENGINE_CPU_ARCH_OPS_H
#define SPILLWAY_ENGINE_CPU_ARCH_OPS_H

#include <stdint.h>

#include "../model.h"

/* cs[2i], cs[2i+1] = cos, sin of pair i's angle at position pos (i < rope_dim / 2) times
 * r->mscale, for table r (model.h rope_table_t), angles in double, rounded to F32 once. Without
 * YaRN the angle is (pos * freq_scale) * inv_freq[i]. */
void arch_rope_angles(const rope_table_t *r, int rope_dim, int32_t pos, float *cs);

/* out[i] = gelu(gate[i]) * up[i] with the tanh approximation
 * gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), in F32 with tanhf; out may alias
 * gate. (llama.cpp's CPU GELU looks up an fp16 table instead: input and output rounded to
 * fp16; the two differ by up to ~1e-3 relative.) */
void arch_gelu_tanh_mul(const float *gate, const float *up, float *out, int64_t n);

/* x[i] = tanh(x[i] * (1 / cap)) * cap (in that order, as llama.cpp's scale, tanh, scale). */
void arch_softcap(float *x, int64_t n, float cap);

#endif
