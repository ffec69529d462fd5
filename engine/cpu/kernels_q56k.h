/* engine/cpu/kernels_q56k.h: the Q6_K and Q5_K matmul routes behind kern_get()'s tables.
 * Internal to engine/cpu/kernels*.c.
 *
 * Both take int8 activations, as Q4_K does (kernels.h): x quantised per token by
 * kern_q8k_quantize (or an ISA's version of it, the same bits) into kern_q8k_t blocks of 256,
 * through kern_q4k_matmul (its K rules, a multiple of 256 up to KERN_Q8K_STACK super-blocks, are
 * the K-quants' rules). Per super-block s and token, exactly in integers:
 *   Q6_K: isum_s = sum_{j<16} sc_j * sum_{k in sub-block j} (q_k - 32) * xq_k,
 *         y = sum_s (d_s * dx_s) * isum_s;
 *   Q5_K: Q4_K's formula with the 5-bit q: isum_s = sum_{j<8} sc_j * sum_k q_k * xq_k,
 *         msum_s = sum_j m_j * bsum_j, y = sum_s (d_s dx_s) isum_s - (dmin_s dx_s) msum_s;
 * the F32 part in an ISA-specific, fixed order (kernels_q56k*.c). Batch invariant: a row's
 * arithmetic never depends on T, the row range or the tile it is computed in. */
#ifndef SPILLWAY_ENGINE_CPU_KERNELS_Q56K_H
#define SPILLWAY_ENGINE_CPU_KERNELS_Q56K_H

#include <stddef.h>
#include <stdint.h>

#include "engine/cpu/kernels_impl.h"

/* kern_table_t.matmul for wtype DT_Q6_K or DT_Q5_K (the same arguments and return value);
 * -1 for any other wtype or an unsupported K. vnni: the integer sums through AVX512-VNNI (the
 * same values; only where the CPU has it). */
int kern_q56k_matmul_scalar(int wtype, const void *W, size_t wrb, int64_t K, const float *x,
                            int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1);
#if defined(__x86_64__) && defined(__GNUC__)
int kern_q56k_matmul_avx2(int wtype, const void *W, size_t wrb, int64_t K, const float *x,
                          int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1);
int kern_q56k_matmul_avx512(int vnni, int wtype, const void *W, size_t wrb, int64_t K,
                            const float *x, int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                            int64_t o1);
#endif

/* The prefetch of a super-block of `bytes` bytes pfd bytes past b, every 64-byte line of it
 * (pfd 0: none), streamed (kern_pf_stream); consecutive super-blocks of a row together cover
 * every line. */
static inline void q56k_prefetch(const void *b, size_t bytes, size_t pfd)
{
    if (!pfd) return;
    for (size_t i = 0; i < bytes; i += 64) kern_pf_stream((const char *)b + pfd + i);
}

#endif
