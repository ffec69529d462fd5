/* engine/cpu/simd_avx512_impl.h: the AVX-512 helpers the ISA kernel files share
 * (kernels_avx512.c, kernels_q56k_avx512.c, q23k_avx512.c, qleg_avx512.c), with
 * simd_avx2_impl.h's.
 *
 * Include it only after the file's '#pragma GCC target' / '#pragma clang attribute push': these
 * functions take the including file's target, and need AVX512F and AVX512DQ. Internal to
 * engine/cpu/. */
#ifndef SPILLWAY_ENGINE_CPU_SIMD_AVX512_IMPL_H
#define SPILLWAY_ENGINE_CPU_SIMD_AVX512_IMPL_H

#include <immintrin.h>

#include "engine/cpu/simd_avx2_impl.h"

/* The fixed horizontal sum of 16 lanes: the two 256-bit halves added lane by lane, then
 * simd_hsum8's tree. */
static inline __attribute__((always_inline)) float simd_hsum16(__m512 v)
{
    return simd_hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

/* simd_hsum16 of a, b, c, d at once, each with exactly its tree: {sum a, sum b, sum c, sum d}. */
static inline __attribute__((always_inline)) __m128 simd_hsum16x4(__m512 a, __m512 b, __m512 c,
                                                                  __m512 d)
{
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
    /* ab = {h_a, h_b}, cd = {h_c, h_d}; now q[i] = h[i] + h[i+4] per 128-bit lane */
    __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 p = _mm512_add_ps(q, _mm512_permute_ps(q, _MM_SHUFFLE(1, 0, 3, 2)));
    __m512 s = _mm512_add_ps(p, _mm512_permute_ps(p, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, s));
}

#endif
