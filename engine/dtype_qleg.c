/* engine/dtype_qleg.c: the F32 values of Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS weights
 * (engine/dtype.h gives the layouts and the value of each weight). */
#include "dtype.h"

_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 must be packed to 20 bytes");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 must be packed to 22 bytes");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 must be packed to 24 bytes");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl must be packed to 18 bytes");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs must be packed to 136 bytes");

const int8_t dtype_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

/* The 32 4-bit fields of a 32-weight block in weight order (low nibbles, then high ones). */
static void nibbles32(const uint8_t *qs, int q[32])
{
    for (int i = 0; i < 16; i++) {
        q[i] = qs[i] & 0x0f;
        q[i + 16] = qs[i] >> 4;
    }
}

/* Q5_0 / Q5_1: adds the fifth bits (bit i of the little-endian word qh) to the nibbles. */
static void add_fifth_bits(const uint8_t qh[4], int q[32])
{
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                 (uint32_t)qh[3] << 24;
    for (int i = 0; i < 32; i++) q[i] |= (int)((h >> i) & 1) << 4;
}

int dtype_qleg_dequant_row(int t, const void *row, float *out, int64_t n)
{
    int q[32];
    switch (t) {
    case DT_Q4_1:
        for (int64_t b = 0; b < n / QK4_1; b++, out += QK4_1) {
            const block_q4_1 *blk = (const block_q4_1 *)row + b;
            const float d = fp16_to_f32(blk->d), m = fp16_to_f32(blk->m);
            nibbles32(blk->qs, q);
            for (int i = 0; i < 32; i++) {
                float p = d * (float)q[i]; /* exact */
                out[i] = p + m;
            }
        }
        return 1;
    case DT_Q5_0:
        for (int64_t b = 0; b < n / QK5_0; b++, out += QK5_0) {
            const block_q5_0 *blk = (const block_q5_0 *)row + b;
            const float d = fp16_to_f32(blk->d);
            nibbles32(blk->qs, q);
            add_fifth_bits(blk->qh, q);
            for (int i = 0; i < 32; i++) out[i] = d * (float)(q[i] - 16);
        }
        return 1;
    case DT_Q5_1:
        for (int64_t b = 0; b < n / QK5_1; b++, out += QK5_1) {
            const block_q5_1 *blk = (const block_q5_1 *)row + b;
            const float d = fp16_to_f32(blk->d), m = fp16_to_f32(blk->m);
            nibbles32(blk->qs, q);
            add_fifth_bits(blk->qh, q);
            for (int i = 0; i < 32; i++) {
                float p = d * (float)q[i]; /* exact */
                out[i] = p + m;
            }
        }
        return 1;
    case DT_IQ4_NL:
        for (int64_t b = 0; b < n / QK4_NL; b++, out += QK4_NL) {
            const block_iq4_nl *blk = (const block_iq4_nl *)row + b;
            const float d = fp16_to_f32(blk->d);
            nibbles32(blk->qs, q);
            for (int i = 0; i < 32; i++) out[i] = d * (float)dtype_iq4nl_values[q[i]];
        }
        return 1;
    case DT_IQ4_XS:
        for (int64_t b = 0; b < n / QK_K; b++) {
            const block_iq4_xs *blk = (const block_iq4_xs *)row + b;
            const float d = fp16_to_f32(blk->d);
            for (int j = 0; j < QK_K / 32; j++, out += 32) {
                const float dl = d * (float)(iq4xs_scale(blk, j) - 32); /* exact */
                nibbles32(blk->qs + 16 * j, q);
                for (int i = 0; i < 32; i++) out[i] = dl * (float)dtype_iq4nl_values[q[i]];
            }
        }
        return 1;
    default:
        return 0;
    }
}
