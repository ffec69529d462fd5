/* engine/cpu/arch_ops.c: see arch_ops.h. */
#include "arch_ops.h"

#include <math.h>

void arch_rope_angles(const rope_table_t *r, int rope_dim, int32_t pos, float *cs)
{
    const int half = rope_dim / 2;
    if (r->ext_factor == 0.0f) {
        double p = (double)pos * r->freq_scale;
        for (int i = 0; i < half; i++) {
            double a = p * r->inv_freq[i];
            cs[2 * i] = (float)cos(a) * r->mscale;
            cs[2 * i + 1] = (float)sin(a) * r->mscale;
        }
        return;
    }
    /* YaRN (ggml rope_yarn): ramp(i) = 1 - clamp((i - corr_lo) / max(0.001, corr_hi - corr_lo)) */
    const double span = r->corr_hi - r->corr_lo > 0.001f ? r->corr_hi - r->corr_lo : 0.001;
    for (int i = 0; i < half; i++) {
        double te = (double)pos * r->inv_freq[i];
        double ti = te * r->freq_scale;
        double y = ((double)i - r->corr_lo) / span;
        double ramp = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y);
        double mix = ramp * r->ext_factor;
        double a = ti * (1.0 - mix) + te * mix;
        cs[2 * i] = (float)cos(a) * r->mscale;
        cs[2 * i + 1] = (float)sin(a) * r->mscale;
    }
}

void arch_gelu_tanh_mul(const float *gate, const float *up, float *out, int64_t n)
{
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    for (int64_t i = 0; i < n; i++) {
        float x = gate[i];
        float g = 0.5f * x * (1.0f + tanhf(k0 * x * (1.0f + k1 * x * x)));
        out[i] = g * up[i];
    }
}

void arch_softcap(float *x, int64_t n, float cap)
{
    const float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++) x[i] = tanhf(x[i] * inv) * cap;
}
