/* engine/dtype.h: GGML tensor element types and scalar conversions.
 * Internal to the engine module. Pure functions, thread-safe. */
#ifndef SPILLWAY_ENGINE_DTYPE_H
#define SPILLWAY_ENGINE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Tensor element types, numbered as in GGUF/ggml (ggml_type). */
enum dtype {
    DT_F32 = 0,
    DT_F16 = 1,
    DT_Q4_0 = 2,
    DT_Q4_1 = 3,
    DT_Q5_0 = 6,
    DT_Q5_1 = 7,
    DT_Q8_0 = 8,
    DT_Q8_1 = 9,
    DT_Q2_K = 10,
    DT_Q3_K = 11,
    DT_Q4_K = 12,
    DT_Q5_K = 13,
    DT_Q6_K = 14,
    DT_Q8_K = 15,
    DT_IQ4_NL = 20,
    DT_IQ4_XS = 23,
    DT_BF16 = 30,
    DT_COUNT_ = 43, /* one past the highest ggml type number this build knows */
};

/* Q8_0 block: 32 weights = fp16 scale d + 32 int8; w[i] = d * qs[i]. */
#define QK8_0 32
typedef struct {
    uint16_t d;     /* fp16 */
    int8_t qs[QK8_0];
} block_q8_0;

/* Q4_0 block: 32 weights = fp16 scale d + 16 bytes of 4-bit q in [0, 15]; w[i] = d * (q[i] - 8).
 * Element i < 16 is the low nibble of qs[i], element i + 16 its high nibble. Exact in F32
 * (a 4-bit integer times an 11-bit significand). */
#define QK4_0 32
typedef struct {
    uint16_t d;     /* fp16 */
    uint8_t qs[QK4_0 / 2];
} block_q4_0;

/* Q4_K super-block: 256 weights in 8 sub-blocks of 32. fp16 d and dmin; per sub-block j a 6-bit
 * scale sc[j] and 6-bit min m[j] packed in scales[12] (q4k_scale_min); 4-bit q in [0, 15].
 * w = RN_f32(d*sc[j] * q - dmin*m[j]): d*sc[j] (17 bits), times q (21 bits) and dmin*m[j]
 * (17 bits) are exact in F32, so the one rounding of the difference is the only one -- the same
 * F32 value whether computed with an FMA or a multiply then a subtract (ggml's
 * dequantize_row_q4_K). Layout of qs: 4 chunks of 64 weights, chunk c in qs[32c .. 32c+31]:
 * weight 64c + l (l < 32) is the low nibble of qs[32c + l] (sub-block 2c), weight 64c + 32 + l
 * its high nibble (sub-block 2c + 1). */
#define QK_K 256
#define Q4K_SCALE_BYTES 12
typedef struct {
    uint16_t d;     /* fp16 super-block scale of the sub-block scales */
    uint16_t dmin;  /* fp16 super-block scale of the sub-block mins */
    uint8_t scales[Q4K_SCALE_BYTES];
    uint8_t qs[QK_K / 2];
} block_q4_K;

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block: j < 4 in the low 6 bits
 * of bytes j (scale) and j + 4 (min); j >= 4 in the nibbles of byte j + 4 (scale low, min high)
 * with their top 2 bits in the top 2 bits of bytes j - 4 (scale) and j (min). */
static inline void q4k_scale_min(int j, const uint8_t *scales, int *sc, int *m)
{
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
        *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

/* Q2_K super-block: 256 weights in 16 sub-blocks of 16. fp16 d and dmin; scales[j] holds
 * sub-block j's 4-bit scale sc[j] (low nibble) and 4-bit min m[j] (high nibble); 2-bit q in
 * [0, 3]. w = RN_f32(d*sc[j] * q - dmin*m[j]): d*sc[j] (15 bits), times q (17 bits) and dmin*m[j]
 * (15 bits) are exact in F32, so the one rounding of the difference is the only one (ggml's
 * dequantize_row_q2_K). Layout of qs: 2 chunks of 128 weights, chunk c in qs[32c .. 32c+31]:
 * weight 128c + 32p + l (p < 4, l < 32) is bits 2p and 2p+1 of qs[32c + l]; its sub-block is
 * 8c + 2p + l/16. */
typedef struct {
    uint8_t scales[QK_K / 16]; /* sc | m << 4 per sub-block */
    uint8_t qs[QK_K / 4];
    uint16_t d;     /* fp16 super-block scale of the sub-block scales */
    uint16_t dmin;  /* fp16 super-block scale of the sub-block mins */
} block_q2_K;

/* Q3_K super-block: 256 weights in 16 sub-blocks of 16. fp16 d; per sub-block j a 6-bit signed
 * scale sc[j] in [-32, 31] packed in scales[12] (q3k_scale); 3-bit q in [-4, 3] from 2 low bits
 * u (qs, laid out as Q2_K's) and a high bit h: weight 128c + 32p + l has h = bit 4c + p of
 * hmask[l], and q = u when h is set, u - 4 when it is clear. w = d*sc[j] * q, exact in F32 (an
 * 11-bit significand times 6 bits times 3 bits: no rounding at all; ggml's dequantize_row_q3_K
 * computes (d * sc[j]) * q, the same value). */
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12]; /* 16 packed 6-bit fields (q3k_scale) */
    uint16_t d;     /* fp16 super-block scale of the sub-block scales */
} block_q3_K;

/* The scale of sub-block j (0..15) of a Q3_K super-block: its low 4 bits are the low nibble of
 * scales[j] (j < 8) or the high nibble of scales[j - 8] (j >= 8); its high 2 bits are bits
 * 2 (j / 4) and 2 (j / 4) + 1 of scales[8 + j % 4]; the 6-bit field minus 32. */
static inline int q3k_scale(int j, const uint8_t *scales)
{
    int lo = j < 8 ? scales[j] & 0x0f : scales[j - 8] >> 4;
    int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* Q6_K super-block: 256 weights in 16 sub-blocks of 16; fp16 d, per sub-block an int8 scale
 * scales[j]; 6-bit q in [0, 63]. Weight 128h + 32i + l (h < 2, i < 4, l < 32) has its low 4 bits
 * in ql[64h + 32(i & 1) + l] (the low nibble for i < 2, the high nibble for i >= 2) and its top 2
 * bits in bits 2i, 2i+1 of qh[32h + l]; weight k is in sub-block k / 16 (q6k_quant).
 * w = RN_f32((d * sc[j]) * (q - 32)): d * sc[j] (19 bits) is exact, so the one rounding of its
 * product with q - 32 is the only one, in any order of the three factors -- but only this order
 * gives ggml's sign of zero (dequantize_row_q6_K: -0.0 when q = 32 and d * sc[j] < 0). */
#define Q6K_SCALES 16
typedef struct {
    uint8_t ql[QK_K / 2];      /* low 4 bits of q */
    uint8_t qh[QK_K / 4];      /* top 2 bits of q */
    int8_t scales[Q6K_SCALES]; /* sub-block scales */
    uint16_t d;                /* fp16 super-block scale */
} block_q6_K;

/* The 6-bit quant (0..63) of weight k (< 256) of a Q6_K super-block (the layout above). */
static inline int q6k_quant(const block_q6_K *b, int k)
{
    const int h = k >> 7, i = (k >> 5) & 3, l = k & 31;
    const uint8_t lo = b->ql[64 * h + 32 * (i & 1) + l];
    return (i < 2 ? lo & 0x0f : lo >> 4) | ((b->qh[32 * h + l] >> (2 * i)) & 3) << 4;
}

/* Q5_K super-block: Q4_K's layout (d, dmin, the same packed 6-bit scales and mins, qs the same
 * nibble order) plus a 5th bit per weight: weight 32j + l (sub-block j < 8, l < 32) has
 * q = its Q4_K nibble + 16 * (bit j of qh[l]), in [0, 31]. w = RN_f32(d*sc[j] * q - dmin*m[j])
 * with one rounding, as Q4_K (d*sc[j] * q has 22 bits: exact). */
typedef struct {
    uint16_t d;     /* fp16 super-block scale of the sub-block scales */
    uint16_t dmin;  /* fp16 super-block scale of the sub-block mins */
    uint8_t scales[Q4K_SCALE_BYTES];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;

/* The 5-bit quant (0..31) of weight k (< 256) of a Q5_K super-block (the layout above). */
static inline int q5k_quant(const block_q5_K *b, int k)
{
    const int j = k >> 5, l = k & 31;
    const uint8_t lo = b->qs[32 * (j >> 1) + l];
    return (j & 1 ? lo >> 4 : lo & 0x0f) | ((b->qh[l] >> j) & 1) << 4;
}

/* ---- Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS (ggml's layouts; engine/dtype_qleg.c) ----
 * In every 32-weight block below, weight i < 16 takes the low nibble of qs[i] and weight i + 16
 * its high nibble. Every product named is exact in F32 unless said otherwise; each weight is
 * rounded at most once, so its F32 value does not depend on FMA contraction. */

/* Q4_1: 32 weights = fp16 scale d, fp16 min m, 4-bit q in [0, 15]; w = RN_f32(d*q + m) (d*q
 * exact: 4 x 11 significant bits). */
#define QK4_1 32
typedef struct {
    uint16_t d;     /* fp16 */
    uint16_t m;     /* fp16 */
    uint8_t qs[QK4_1 / 2];
} block_q4_1;

/* Q5_0: 32 weights = fp16 scale d, 32 fifth bits qh (bit i of the little-endian word qh is the
 * fifth bit of weight i), 4 low bits in qs; q in [0, 31]; w = d * (q - 16), exact. */
#define QK5_0 32
typedef struct {
    uint16_t d;     /* fp16 */
    uint8_t qh[4];  /* little-endian uint32, bit i: weight i's bit 4 */
    uint8_t qs[QK5_0 / 2];
} block_q5_0;

/* Q5_1: as Q5_0 with an fp16 min m; q in [0, 31]; w = RN_f32(d*q + m) (d*q exact). */
#define QK5_1 32
typedef struct {
    uint16_t d;     /* fp16 */
    uint16_t m;     /* fp16 */
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;

/* The fixed non-linear 4-bit grid of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl): -127, -104, -83,
 * -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113. */
extern const int8_t dtype_iq4nl_values[16];

/* IQ4_NL: 32 weights = fp16 scale d, 4-bit indices q into dtype_iq4nl_values;
 * w = d * kv[q], exact (8 x 11 significant bits). */
#define QK4_NL 32
typedef struct {
    uint16_t d;     /* fp16 */
    uint8_t qs[QK4_NL / 2];
} block_iq4_nl;

/* IQ4_XS super-block: 256 weights in 8 sub-blocks of 32, fp16 d, a 6-bit scale ls[j] per
 * sub-block (iq4xs_scale) and 4-bit indices into dtype_iq4nl_values; sub-block j's bytes are
 * qs[16j .. 16j+15] (nibble order as the 32-blocks above). w = RN_f32(dl * kv[q]) with
 * dl = d * (ls[j] - 32) exact (17 bits): one rounding (ggml computes dl first). */
typedef struct {
    uint16_t d;         /* fp16 */
    uint16_t scales_h;  /* bits 2j, 2j+1: bits 4, 5 of ls[j] */
    uint8_t scales_l[4]; /* byte j/2, nibble j%2 (low first): bits 0..3 of ls[j] */
    uint8_t qs[QK_K / 2];
} block_iq4_xs;

/* The 6-bit scale ls (0..63; the sub-block's multiplier is ls - 32) of IQ4_XS sub-block j. */
static inline int iq4xs_scale(const block_iq4_xs *b, int j)
{
    return ((b->scales_l[j / 2] >> 4 * (j % 2)) & 0x0f) | ((b->scales_h >> 2 * j) & 3) << 4;
}

/* Elements per block and bytes per block of a type; 0 when unsupported. */
static inline int dtype_block_elems(int t)
{
    switch (t) {
    case DT_F32: case DT_F16: case DT_BF16: return 1;
    case DT_Q8_0: return QK8_0;
    case DT_Q4_0: return QK4_0;
    case DT_Q4_K: return QK_K;
    case DT_Q5_K: case DT_Q6_K: case DT_Q2_K: case DT_Q3_K: return QK_K;
    case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: case DT_IQ4_NL: return 32;
    case DT_IQ4_XS: return QK_K;
    default: return 0;
    }
}
static inline size_t dtype_block_bytes(int t)
{
    switch (t) {
    case DT_F32: return 4;
    case DT_F16: case DT_BF16: return 2;
    case DT_Q8_0: return sizeof(block_q8_0);
    case DT_Q4_0: return sizeof(block_q4_0);
    case DT_Q4_K: return sizeof(block_q4_K);
    case DT_Q2_K: return sizeof(block_q2_K);
    case DT_Q3_K: return sizeof(block_q3_K);
    case DT_Q5_K: return sizeof(block_q5_K);
    case DT_Q6_K: return sizeof(block_q6_K);
    case DT_Q4_1: return sizeof(block_q4_1);
    case DT_Q5_0: return sizeof(block_q5_0);
    case DT_Q5_1: return sizeof(block_q5_1);
    case DT_IQ4_NL: return sizeof(block_iq4_nl);
    case DT_IQ4_XS: return sizeof(block_iq4_xs);
    default: return 0;
    }
}
/* Bytes of a row of n elements (n a multiple of the block size), 0 when unsupported. */
static inline size_t dtype_row_bytes(int t, int64_t n)
{
    int be = dtype_block_elems(t);
    if (be == 0 || n % be) return 0;
    return (size_t)(n / be) * dtype_block_bytes(t);
}
const char *dtype_name(int t);               /* "f32", "q8_0", ... or "unknown" */
/* Every ggml type known to this build, supported for compute or not (file validation, inspect):
 * elements per block and bytes per block; 0 when t is not a known ggml type (numbers removed
 * from ggml, such as 4, 5 and 31..33, are unknown). Agree with dtype_block_elems/bytes on the
 * supported types. */
int dtype_ggml_block_elems(int t);
size_t dtype_ggml_block_bytes(int t);
/* 1 for the types of DTYPE_SUPPORTED_LIST */
int dtype_supported(int t);
#define DTYPE_SUPPORTED_LIST \
    "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q3_K, Q2_K"
/* The reference (portable C) widening of a row of n elements of a supported type to F32, in the
 * exact values the kernels use (see the block types above). n a multiple of the block size. */
void dtype_dequant_row(int t, const void *row, float *out, int64_t n);
/* dtype_dequant_row of Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS (engine/dtype_qleg.c); 1 when t is
 * one of them (out written), 0 otherwise (nothing written). */
int dtype_qleg_dequant_row(int t, const void *row, float *out, int64_t n);
/* dtype_dequant_row of Q2_K and Q3_K (engine/dtype_q23k.c): n a multiple of 256. */
void dtype_dequant_q2_k(const void *row, float *out, int64_t n);
void dtype_dequant_q3_k(const void *row, float *out, int64_t n);

static inline float fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even; overflow gives inf, NaN stays NaN. */
static inline uint16_t f32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below fp16 normal range: subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        /* value = m * 2^(e-150); subnormal unit 2^-24, so q = m >> (126 - e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t e = (absx >> 23) - 127 + 15;
    uint32_t m = absx & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif
