/* tools/mkmodel_q56k.h: spillway's own Q6_K and Q5_K quantisers (tools/mkmodel.c's
 * mkmodel_quantize_row). Internal to the tools module. Pure functions, thread-safe. */
#ifndef SPILLWAY_TOOLS_MKMODEL_Q56K_H
#define SPILLWAY_TOOLS_MKMODEL_Q56K_H

#include <stdint.h>

#include "engine/dtype.h"

/* x[0..n) (n a multiple of 256) -> n / 256 super-blocks (engine/dtype.h's layouts).
 *   Q6_K: per sub-block of 16 the scale s = m / -32 with m its value of largest magnitude (the
 *     first if several), so m maps to q - 32 = -32; the 16 scales rounded to int8 against
 *     d = max|s| / 127 (fp16); then q = round(x / (d * sc)) + 32, clamped to [0, 63].
 *   Q5_K: per sub-block of 32 the range [lo, hi] with lo = min(0, min x): scale (hi - lo) / 31
 *     and min -lo; both rounded to 6 bits against their super-block maxima / 63 (fp16 d, dmin);
 *     then q = round((x + dmin * m) / (d * sc)), clamped to [0, 31].
 * Quants are computed against the scales as stored; round half to even. A sub-block whose
 * stored scale is 0 gets q = 32 (Q6_K) or 0 (Q5_K). Not llama.cpp's search for the best
 * scales: a simple, correct rounding for test and synthetic models. */
void mkmodel_quantize_q6_k(const float *x, block_q6_K *b, int64_t n);
void mkmodel_quantize_q5_k(const float *x, block_q5_K *b, int64_t n);

#endif
