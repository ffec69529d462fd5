/* engine/cpu/kernels.h: CPU compute kernels of the CPU backend. Internal.
 *
 * Dispatch: kern_get() picks the best implementation the CPU supports at run time (AVX-512,
 * AVX2+FMA+F16C, or portable C) and returns a table; all callers go through the table.
 *
 * Batch invariance (a contract every implementation keeps): the value written for output element
 * (t, o) depends only on x[t], W[o] and K -- never on T, on o0/o1, on the thread that computes it
 * or on the neighbouring tokens. So a sequence gets bit-identical results alone or in a batch.
 *
 * Threads: kernels are pure functions of their arguments; callers split work over threads by
 * output rows or by tokens. (matmul of a block type quantises its T tokens of x into a malloc'd
 * buffer first -- or, when that fails, chunks of them on the stack: the same values.) matmul is
 * fastest when each thread's row range is a multiple of 8 rows (4 when T > 2); any range is
 * correct.
 *
 * Arithmetic (engine/cpu/kernels*.c give the exact per-ISA order). F32, F16, BF16: weights are
 * widened to F32 exactly in registers and multiplied with the F32 activations in F32 with a
 * fixed accumulation order, so these types add no error beyond the weights' own rounding.
 * Such a matmul output differs from the exact dot product of the widened weights by at most
 * (K + 4) * 2^-24 * sum_k |w_k x_k| (tests/test_kernels.c checks this bound).
 *
 * Q4_K takes int8 activations (the Q4_K x Q8_K route of llama.cpp), because its F32 widening is
 * compute-bound at decode (nibbles, 6-bit scales and mins: 12 GB/s of weights on 2 Zen 4 cores,
 * where integer dot products stream them at the memory's rate): each token's x is quantised by
 * kern_q8k_quantize (one portable function, so every ISA sees the same xq), then per super-block
 * s of 256 and per token, exactly in integers,
 *     isum_s = sum_j sc_j * sum_{k in sub-block j} q_k * xq_k,   msum_s = sum_j m_j * bsum_j,
 * and in F32 y = sum_s (d_s * dx_s) * isum_s - (dmin_s * dx_s) * msum_s, in an ISA-specific but
 * fixed order. Batch invariance holds (xq depends on x[t] only). The F32 part is within
 * (K/256 + 8) * 2^-24 * sum_s (|d_s dx_s| sum_j sc_j sum_k q_k |xq_k| + |dmin_s dx_s| sum_j m_j |bsum_j|)
 * of the exact value of that formula; against the exact dot product of the widened weights it
 * adds x's rounding to 8 bits, at most dx_s / 2 = max|x over the 256| / 254 per element.
 *
 * Packed Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0 and F16 (the avx512-vnni table's pack/matmul_packed: rows
 * in groups of 16, one row per 32-bit lane of AVX512-VNNI's int8 dot product): the same xq and
 * the same exact integers isum_s (and Q4_K's and Q5_K's msum_s) per row, super-block and token
 * as matmul's routes (Q5_K, Q6_K, IQ4_XS and Q8_0 below; Q8_0's P_b per block b); in F32, per
 * row and token, over s in order, acc = fma(fl(isum_s), fl(d_s * dx_s), acc) and, Q4_K and
 * Q5_K, accm = fma(msum_s, fl(dmin_s * dx_s), accm), y = acc - accm (the others: y = acc).
 * fl(isum_s) is exact below 2^24, so y is within matmul's bound for the type, though not
 * bit-equal to matmul's y. Batch invariance holds (a row's lane does the same operations in
 * every tile). Packed F16 (K a multiple of 32; x stays F32): per row and token one F32 chain,
 * acc = fma(w_k, x_k, acc) in increasing k, y = acc: within F16's matmul bound above, not
 * bit-equal to matmul's y, the same in every tile.
 *
 * Q6_K and Q5_K take the same int8 activations (kern_q8k_quantize; engine/cpu/kernels_q56k.h
 * gives each ISA's order). Per super-block s and token, exactly in integers: Q6_K
 *     isum_s = sum_{j<16} sc_j * sum_{k in sub-block j of 16} (q_k - 32) * xq_k,
 * y = sum_s (d_s * dx_s) * isum_s, within (K/256 + 8) * 2^-24 * sum_s |d_s dx_s| sum_j |sc_j|
 * sum_k |q_k - 32| |xq_k| of the exact value of that formula; Q5_K Q4_K's formula and bound with
 * its 5-bit q. Against the exact dot product of the widened weights, x's rounding adds at most
 * dx_s / 2 per element, as for Q4_K. Batch invariance holds.
 * Q2_K and Q3_K take int8 activations the same way (engine/cpu/q23k.h gives the formulas): xq
 * from kern_q8k_quantize, and, for their sub-blocks of 16, the sums bsum16_j of q over each 16
 * elements, computed from q exactly. Per super-block s and token, exactly in integers, isum_s =
 * sum_j sc_j sum_{k in j} q_k xq_k (Q3_K: sc_j signed, q_k in [-4, 3], summed as
 * sc_j (sum_k (q_k + 4) xq_k - 4 bsum16_j)) and, Q2_K, msum_s = sum_j m_j bsum16_j; in F32
 * y = sum_s (d_s dx_s) isum_s [- (dmin_s dx_s) msum_s], in an ISA-specific but fixed order,
 * within (K/256 + 8) * 2^-24 * sum_s (|d_s dx_s| sum_j |sc_j| sum_k c_k |xq_k| + |dmin_s dx_s|
 * sum_j m_j |bsum16_j|) of the exact value of that formula, c_k = q_k (Q2_K) or q_k + 8 (Q3_K,
 * whose lanes carry the two parts of the sum separately), the dmin term Q2_K's only. Against the
 * exact dot product of the widened weights x's rounding adds at most dx_s / 2 per element, and
 * Q2_K's weights their one F32 rounding (the formula uses the exact d sc q - dmin m). Batch
 * invariance holds (xq and bsum16 depend on x[t] only).
 *
 * Q8_0 and Q4_0 take int8 activations too (llama.cpp's Q8_0 x Q8_0 and Q4_0 x Q8_0), because
 * one integer dot product replaces widening, scaling and an F32 multiply per weight (measured on
 * the Zen 5 build machine, Q8_0 matmul of 576 x 576 .. 1536: 16 tokens 1.6-1.8x, 512 tokens
 * 1.2x; one token streams at the same rate, memory-bound either way): each token's x is
 * quantised in blocks of 32 by kern_q8_quantize (portable, the same bits on every ISA), then per
 * block b and token, exactly in integers, P_b = sum_{k in b} q_k * xq_k with q_k Q8_0's quants
 * or Q4_0's nibbles - 8, and in F32 y = sum_b fl(d_b * dx_b) * P_b in an
 * ISA-specific but fixed order, within (K/32 + 8) * 2^-24 * sum_b |d_b dx_b| sum_k |q_k xq_k| of
 * the exact value of that formula; x's rounding adds at most dx_b / 2 = max|x over the 32| / 254
 * per element. Batch invariance holds (xq depends on x[t] only).
 *
 * Q4_1, Q5_0, Q5_1 and IQ4_NL take int8 activations in blocks of 32 as Q4_0 does (engine/cpu/
 * qleg*.c; llama.cpp's routes for them also quantise x, to Q8_0 / Q8_1): xq and dx_b from
 * kern_q8_quantize, S_b = sum_{k in b} xq_k (exact, computed from xq), per block b and token,
 * exactly in integers, P_b = sum_{k in b} w_k * xq_k with w_k Q4_1's / Q5_1's q, Q5_0's q - 16
 * or IQ4_NL's kv[q] (the 16-entry table, looked up with a byte shuffle), and in F32
 *     y = sum_b fl(d_b * dx_b) * P_b  [+ sum_b fl(m_b * dx_b) * S_b for Q4_1 and Q5_1]
 * in an ISA-specific but fixed order, within (K/32 + 8) * 2^-24 * sum_b (|d_b dx_b| sum_k
 * |w_k xq_k| + |m_b dx_b S_b|) of the exact value of that formula (which uses the exact d*q + m,
 * before the weight's own F32 rounding); x's rounding adds at most dx_b / 2 per element.
 * IQ4_XS takes them in super-blocks of 256 as Q4_K does (kern_q8k_quantize; llama.cpp's IQ4_XS
 * route uses Q8_K too, and one F32 scale per 256 weights keeps the F32 work at one multiply-add
 * per super-block): per super-block s and token, exactly in integers,
 *     isum_s = sum_j (ls_j - 32) * sum_{k in sub-block j} kv[q_k] * xq_k,
 * and in F32 y = sum_s fl(d_s * dx_s) * isum_s in an ISA-specific but fixed order, within
 * (K/256 + 8) * 2^-24 * sum_s |d_s dx_s| sum_j |ls_j - 32| sum_k |kv[q_k] xq_k| of the exact
 * value; x's rounding adds at most dx_s / 2 = max|x over the 256| / 254 per element. Batch
 * invariance holds for all five (xq depends on x[t] only; tiles of every shape do the same
 * per-element arithmetic). */
#ifndef SPILLWAY_ENGINE_CPU_KERNELS_H
#define SPILLWAY_ENGINE_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name; /* "avx512", "avx2", "scalar" */
    /* y[t * ldy + o] = sum_{i<K} W[o][i] * x[t * ldx + i], for t in [0, T), o in [o0, o1).
     * W: rows of K elements of dtype wtype (DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K,
     * DT_Q5_K, DT_Q6_K, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_IQ4_NL, DT_IQ4_XS, DT_Q2_K, DT_Q3_K), row o
     * starting at (const char *)W + o * w_row_bytes. x: F32. K is a multiple of 32 for Q8_0, Q4_0,
     * Q4_1, Q5_0, Q5_1 and IQ4_NL, of 256 for the K-quants and IQ4_XS.
     * Returns -1 when wtype is unsupported, else 0. */
    int (*matmul)(int wtype, const void *W, size_t w_row_bytes, int64_t K, const float *x,
                  int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1);
    /* Optional (NULL in a table without it): a weight layout of the table's own, for matmul.
     * pack_bytes(wtype, rows, K): bytes of the packed copy of a rows x K matrix of wtype, or 0
     * when the table has no layout for that type and K (then use matmul on the rows as they
     * are). pack(...): writes the copy of W (matmul's W and w_row_bytes) to dst, 64-byte
     * aligned and pack_bytes long; the caller owns dst; W is not referenced afterwards. Rows
     * may be packed in parts, each starting at a multiple of KERN_PACK_ROWS: rows [a, b) packed
     * as a matrix of their own at dst + (a / KERN_PACK_ROWS) * pack_bytes(wtype,
     * KERN_PACK_ROWS, K) give the same bytes as the whole.
     * matmul_packed(wtype, P, K, ...): matmul's y for rows [o0, o1) (o1 <= rows) of the matrix
     * packed at P ("Packed Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0 and F16" above gives the values); any o0, o1,
     * fastest when both are multiples of KERN_PACK_ROWS. Returns -1 when wtype or K is not
     * packed, else 0. */
    size_t (*pack_bytes)(int wtype, int64_t rows, int64_t K);
    void (*pack)(int wtype, const void *W, size_t w_row_bytes, int64_t rows, int64_t K, void *dst);
    int (*matmul_packed)(int wtype, const void *P, int64_t K, const float *x, int64_t ldx,
                         float *y, int64_t ldy, int T, int64_t o0, int64_t o1);
    /* Row i of W (dtype wtype, K elements) converted to F32 into out[K]. */
    void (*dequant_row)(int wtype, const void *row, float *out, int64_t K);
    /* sum_i a[i] * b[i] (F32) */
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    /* y[i] += a * x[i] */
    void (*axpy_f32)(float a, const float *x, float *y, int64_t n);
    /* out[i] = x[i] * w[i] / sqrt(mean(x^2) + eps); out may alias x. */
    void (*rmsnorm)(const float *x, const float *w, float eps, float *out, int64_t n);
    /* out[i] = silu(gate[i]) * up[i]; out may alias gate. */
    void (*silu_mul)(const float *gate, const float *up, float *out, int64_t n);
    /* y[i] += x[i] */
    void (*add)(float *y, const float *x, int64_t n);
    /* F32 <-> F16 bulk conversion (KV cache). */
    void (*f32_to_f16)(const float *x, uint16_t *y, int64_t n);
    void (*f16_to_f32)(const uint16_t *x, float *y, int64_t n);
} kern_table_t;

/* Row granularity of packed layouts (kern_table_t.pack): a range of rows is best split at
 * multiples of it. */
#define KERN_PACK_ROWS 16

/* One 256-element block of a token's activations quantised for Q4_K's int8 route. */
#define KERN_Q8K 256
typedef struct {
    int8_t q[KERN_Q8K]; /* round-to-nearest-even of x[k] / d, in [-127, 127] */
    float d;            /* max|x| / 127; 0 for a block of zeros, NaN when x holds Inf or NaN */
    int16_t bsum[8];    /* sum of q over each 32-element sub-block */
    int32_t pad[2];     /* size 288: q stays 32-byte aligned in an aligned array */
} kern_q8k_t;

/* x[0..K) (K a multiple of 256) -> out[K / 256]. Portable C, the same bits on every ISA. */
void kern_q8k_quantize(const float *x, int64_t K, kern_q8k_t *out);

/* The int8 route of Q8_0 and Q4_0: x[0..K) (K a multiple of 32) quantised in blocks of 32, block
 * b to q[32b .. 32b+31] (round-to-nearest-even of x[k] / d[b], in [-127, 127]) and d[b] =
 * max|x| / 127 over the block (0 for a block of zeros, NaN when it holds Inf or NaN; q then all
 * 0). Portable C, the same bits on every ISA. */
void kern_q8_quantize(const float *x, int64_t K, int8_t *q, float *d);

/* Best table for this CPU. force: NULL for automatic, or "avx512-vnni" (AVX-512 with the int8
 * routes' integer sums through AVX512-VNNI: the same values as "avx512"), "avx512", "avx2" or
 * "scalar" to pick one (tests compare them); returns NULL when the forced one is not supported
 * here. Thread-safe, returns a pointer to a static const table. */
const kern_table_t *kern_get(const char *force);

#endif
