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
 * output rows or by tokens. (matmul of a block type over many tokens widens panels of rows into
 * a malloc'd F32 scratch buffer first -- the same values and arithmetic -- and takes the direct
 * path when the allocation fails.) matmul is fastest when each thread's row range is a multiple of 8
 * rows (4 when T > 2); any range is correct.
 *
 * Arithmetic (engine/cpu/kernels*.c give the exact per-ISA order): weights are widened to F32
 * exactly in registers -- F16, BF16, Q8_0 as float(q) * d and Q4_0 as float(q - 8) * d, which
 * are exact in F32, and Q4_K as the one F32 rounding of d*sc*q - dmin*m (every partial product
 * exact; the value ggml's dequantisation gives, identical on every path) -- and multiplied with
 * the F32 activations in F32 with a fixed accumulation order. So the block types add no error
 * beyond the weights' own quantisation: x is not quantised to int8. (The int8/VNNI route
 * of llama.cpp has up to 4x the multiply rate at large T, but rounds each 32-element block of x
 * to 8 bits, a relative error of up to 2^-8 per element; at T = 1 both are memory-bound.) A
 * matmul output differs from the exact dot product of the widened weights by at most
 * (K + 4) * 2^-24 * sum_k |w_k x_k| (tests/test_kernels.c checks this bound). */
#ifndef SPILLWAY_ENGINE_CPU_KERNELS_H
#define SPILLWAY_ENGINE_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name; /* "avx512", "avx2", "scalar" */
    /* y[t * ldy + o] = sum_{i<K} W[o][i] * x[t * ldx + i], for t in [0, T), o in [o0, o1).
     * W: rows of K elements of dtype wtype (DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K),
     * row o starting at (const char *)W + o * w_row_bytes. x: F32. K is a multiple of 32 for
     * Q8_0 and Q4_0, of 256 for Q4_K.
     * Returns -1 when wtype is unsupported, else 0. */
    int (*matmul)(int wtype, const void *W, size_t w_row_bytes, int64_t K, const float *x,
                  int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1);
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

/* Best table for this CPU. force: NULL for automatic, or "avx512" / "avx2" / "scalar" to pick
 * one (tests compare them); returns NULL when the forced one is not supported here. Thread-safe,
 * returns a pointer to a static const table. */
const kern_table_t *kern_get(const char *force);

#endif
