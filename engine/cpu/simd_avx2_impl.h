/* engine/cpu/simd_avx2_impl.h: the AVX2 helpers the ISA kernel files share (kernels_avx2.c,
 * kernels_q56k_avx2.c, q23k_avx2.c, qleg_avx2.c, attention_avx2.c, and through
 * simd_avx512_impl.h the AVX-512 ones).
 *
 * Include it only after the file's '#pragma GCC target' / '#pragma clang attribute push': these
 * functions take the including file's target (no global -m flags), and need AVX2, FMA and F16C.
 * Internal to engine/cpu/. */
#ifndef SPILLWAY_ENGINE_CPU_SIMD_AVX2_IMPL_H
#define SPILLWAY_ENGINE_CPU_SIMD_AVX2_IMPL_H

#include <immintrin.h>
#include <stddef.h>

/* The fixed horizontal sum of 8 lanes: h[i] = v[i] + v[i+4]; p[i] = h[i] + h[i+2];
 * p[0] + p[1]. Every kernel's stated arithmetic order depends on this exact tree. */
static inline __attribute__((always_inline)) float simd_hsum8(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 p = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

#endif
