/* tools/quant_q23k.h: our own quantisers to Q2_K and Q3_K (engine/dtype.h gives the formats).
 * Internal to the tools module (mkmodel). Pure functions, thread-safe. */
#ifndef SPILLWAY_TOOLS_QUANT_Q23K_H
#define SPILLWAY_TOOLS_QUANT_Q23K_H

#include <stdint.h>

/* x[0..n) (n a multiple of 256, finite values) rounded to n / 256 super-blocks at dst:
 *   Q3_K  per sub-block of 16 a signed scale s: of the candidates m / c (m the value of largest
 *         magnitude, c in -4.5 .. -3 and 3 .. 3.5 in steps of 0.25), each refitted by least
 *         squares to its quants q = clamp(round(x / s), -4, 3), the one of least squared error;
 *         the scales then to 6 bits against fp16 d = (the scale of largest magnitude) / -32, and
 *         each sub-block's 6-bit scale and quants chosen again against the stored d (the scale
 *         within +-1 of round(s / d) of least error).
 *   Q2_K  per sub-block of 16 x ~ s q - m with q in [0, 3], m = -min(x, 0) >= 0, s = (max x +
 *         m) / 3, then s and m refitted by least squares to those quants (m kept >= 0); both to
 *         4 bits against fp16 d = max s / 15 and dmin = max m / 15, and each sub-block's 4-bit
 *         scale and min chosen again against the stored d and dmin (each within +-1 of its
 *         rounding, the pair of least error with the quants re-rounded).
 * Not ggml's quantisers (llama-quantize writes other bytes); the error is of the same order. */
void quant_q2_k_row(const float *x, void *dst, int64_t n);
void quant_q3_k_row(const float *x, void *dst, int64_t n);

#endif
