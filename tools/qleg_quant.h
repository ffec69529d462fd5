/* tools/qleg_quant.h: spillway's own quantisers for Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS
 * (mkmodel_quantize_row). Internal to the tools module. Pure; thread-safe. */
#ifndef SPILLWAY_TOOLS_QLEG_QUANT_H
#define SPILLWAY_TOOLS_QLEG_QUANT_H

#include <stdint.h>

/* Rounds x[0..n) (n a multiple of t's block) to type t into dst (dtype_row_bytes(t, n) bytes),
 * per block:
 *   Q4_1, Q5_1  d = (max - min) / (2^bits - 1), m = min, both stored as fp16; q = the nearest
 *               integer to (x - m) / d against the stored d and m, clamped to the range;
 *   Q5_0        d = -v / 16, v the value of largest magnitude (so v is q = 0 exactly);
 *               q = nearest(x / d) + 16 clamped to [0, 31], against the stored d;
 *   IQ4_NL      scale candidates d = v / g for g in -127 +- 0..7 steps of 1 (v as Q5_0), each
 *               with the nearest grid index per weight and d refitted by least squares; the
 *               candidate of least squared error is stored (fp16), then the indices again
 *               against the stored d;
 *   IQ4_XS      each sub-block of 32 fitted as IQ4_NL, d = -s / 32 with s the sub-block scale
 *               of largest magnitude, ls - 32 = nearest(scale / d) clamped to [-32, 31], then
 *               the indices against the stored d * (ls - 32).
 * An all-zero block is stored as zeros. Returns 0, or -1 for another type or a bad n. */
int qleg_quantize_row(int t, const float *x, void *dst, int64_t n);

#endif
