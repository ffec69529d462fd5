/* engine/cpu/q23k.h: the int8 route of Q2_K and Q3_K (kernels.h), shared by every ISA. Internal
 * to engine/cpu/kernels*.c and q23k*.c.
 *
 * Each token's x is quantised by kern_q8k_quantize (portable: the same xq on every ISA) and,
 * because these types have sub-blocks of 16 where kern_q8k_t sums q per 32, the sums of q over
 * every 16 elements are taken from q exactly (kern_q8k16_t). Per super-block s, token and row,
 * in exact integers (sc_j, m_j: engine/dtype.h's sub-block scales and mins; q_k the weight's
 * quant: Q2_K in [0, 3], Q3_K in [-4, 3]; u_k = q_k + 4 in [0, 7] for Q3_K),
 *     Q2_K: isum_s = sum_j sc_j * sum_{k in j} q_k xq_k,   msum_s = sum_j m_j * bsum16_j
 *     Q3_K: isum_s = sum_j sc_j * (sum_{k in j} u_k xq_k - 4 * bsum16_j)   (= sum sc_j q_k xq_k)
 * and in F32, in an ISA-specific but fixed order,
 *     Q2_K: y = sum_s (d_s * dx_s) * isum_s - (dmin_s * dx_s) * msum_s
 *     Q3_K: y = sum_s (d_s * dx_s) * isum_s. */
#ifndef SPILLWAY_ENGINE_CPU_Q23K_H
#define SPILLWAY_ENGINE_CPU_Q23K_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/cpu/kernels.h"

/* The sums of a kern_q8k_t's q over its 16 sub-blocks of 16 (|s| <= 16 * 127). */
typedef struct {
    int16_t s[16];
} kern_q8k16_t;

/* s[j] = sum of b->q[16j .. 16j+15] (portable; the same bits on every ISA). */
void kern_q8k16_sums(const kern_q8k_t *b, kern_q8k16_t *s);

/* The ISA's part for one type: y[t * ldy + o] for t < T, o in [o0, o1), from rows of nsb
 * super-blocks and the quantised tokens xq[t * nsb + s], xs[t * nsb + s]. */
typedef void (*kern_q23k_fn)(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq,
                             const kern_q8k16_t *xs, int T, float *y, int64_t ldy, int64_t o0,
                             int64_t o1);

/* matmul for wtype DT_Q2_K / DT_Q3_K (the kern_table_t contract; also DT_Q6_K, for the packed
 * route of engine/cpu/kpack_avx512.c, which takes the same sums) through fn: quantises the T
 * tokens (one heap buffer, or on the stack in chunks of tokens when that allocation fails) and
 * runs fn. Returns 0, or -1 when wtype or K is not supported (kern_wtype_ok). */
int kern_q23k_matmul(int wtype, kern_q23k_fn fn, const void *W, size_t wrb, int64_t K,
                     const float *x, int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                     int64_t o1);

/* The 16 signed scales of a Q3_K super-block (engine/dtype.h's q3k_scale, all at once):
 * byte-wise operations on words loaded and stored in host order. Of the 12 bytes, 0..7 hold the
 * low nibbles of scales 0..7 and (high nibbles) 8..15; byte 8 + i holds the high 2 bits of
 * scales i, i + 4, i + 8, i + 12 in its bit pairs 0, 1, 2, 3. */
static inline void kern_q3k_scales(const uint8_t *scales, int8_t sc[16])
{
    uint32_t a, b, h, v[4];
    memcpy(&a, scales, 4);
    memcpy(&b, scales + 4, 4);
    memcpy(&h, scales + 8, 4);
    v[0] = (a & 0x0f0f0f0fu) | (h & 0x03030303u) << 4;
    v[1] = (b & 0x0f0f0f0fu) | (h >> 2 & 0x03030303u) << 4;
    v[2] = (a >> 4 & 0x0f0f0f0fu) | (h >> 4 & 0x03030303u) << 4;
    v[3] = (b >> 4 & 0x0f0f0f0fu) | (h >> 6 & 0x03030303u) << 4;
    /* minus 32 in every byte (< 64) without borrows between bytes: set bit 7, subtract, flip
     * bit 7 back -- byte x becomes (x - 32) mod 256 */
    for (int w = 0; w < 4; w++) v[w] = ((v[w] | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
    memcpy(sc, v, 16);
}

#if defined(__SSE4_1__) || defined(__AVX2__)
#include <immintrin.h>
/* kern_q3k_scales in a register (for the ISA files, compiled for AVX2 or above): byte j of the
 * result is scale j. Reads exactly the 12 bytes. */
static inline __m128i kern_q3k_scales_v(const uint8_t *scales)
{
    uint32_t h;
    memcpy(&h, scales + 8, 4);
    const __m128i ab = _mm_loadl_epi64((const __m128i *)scales), m4 = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(ab, m4), _mm_and_si128(_mm_srli_epi16(ab, 4), m4));
    /* byte j of hv is byte 8 + j % 4; shifted right by 2 (j / 4) within its dword */
    const __m128i hv = _mm_srlv_epi32(_mm_set1_epi32((int)h), _mm_setr_epi32(0, 2, 4, 6));
    const __m128i hi = _mm_slli_epi16(_mm_and_si128(hv, _mm_set1_epi8(3)), 4);
    return _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
}
#endif

/* kern_table_t.matmul for DT_Q2_K and DT_Q3_K on each ISA (q23k.c, q23k_avx2.c,
 * q23k_avx512.c); the x86 ones only after kern_get checked the CPU. */
int kern_q23k_matmul_scalar(int wtype, const void *W, size_t wrb, int64_t K, const float *x,
                            int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1);
int kern_q23k_matmul_avx2(int wtype, const void *W, size_t wrb, int64_t K, const float *x,
                          int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1);
/* vnni: 1 to sum through AVX512-VNNI (the same values; only where the CPU has it). */
int kern_q23k_matmul_avx512(int vnni, int wtype, const void *W, size_t wrb, int64_t K,
                            const float *x, int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                            int64_t o1);

#endif
