/* engine/cpu/kpack.c: Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0 and F16 matrices repacked in groups of 16 rows
 * (kernels_impl.h's layouts), the portable part: the size and the packing. */
#include <string.h>

#include "engine/cpu/kernels_impl.h"

/* Bytes of one packed unit (a super-block, Q8_0 a pair of blocks) of 16 rows of type t; 0 for a
 * type not packed. */
static size_t unit_bytes(int t)
{
    switch (t) {
    case DT_Q4_K: return KERN_Q4KX16_SB_BYTES;
    case DT_Q5_K: return KERN_Q5KX16_SB_BYTES;
    case DT_Q6_K: return KERN_Q6KX16_SB_BYTES;
    case DT_IQ4_XS: return KERN_IQ4XSX16_SB_BYTES;
    case DT_Q8_0: return KERN_Q8X16_PAIR_BYTES;
    case DT_F16: return KERN_F16X16_UNIT_BYTES;
    default: return 0;
    }
}

/* Units per row of K elements of type t. */
static int64_t units(int t, int64_t K)
{
    return t == DT_Q8_0 ? (K / QK8_0 + 1) / 2 : t == DT_F16 ? K / 32 : K / QK_K;
}

size_t kern_kx16_bytes(int wtype, int64_t rows, int64_t K)
{
    if (!unit_bytes(wtype) || rows < 1 || K == 0 || !kern_wtype_ok(wtype, K)) return 0;
    if (wtype == DT_F16 && K % 32) return 0;
    const size_t groups = (size_t)((rows + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS);
    return groups * (size_t)units(wtype, K) * unit_bytes(wtype);
}

/* Row r (< 16) of the first 256 bytes of a group's packed Q4_K or Q5_K super-block B: its d,
 * dmin and 12 scale bytes. */
static void pack_dm_scales(unsigned char *B, int r, const uint16_t *d, const uint16_t *dmin,
                           const uint8_t *scales)
{
    memcpy(B + 2 * r, d, 2);
    memcpy(B + 32 + 2 * r, dmin, 2);
    for (int w = 0; w < 3; w++) memcpy(B + 64 + 64 * w + 4 * r, scales + 4 * w, 4);
}

/* Row r (< 16) of a group's packed super-block B from its block b. */
static void pack_q4k(unsigned char *B, int r, const block_q4_K *b)
{
    pack_dm_scales(B, r, &b->d, &b->dmin, b->scales);
    for (int i = 0; i < QK_K / 8; i++) memcpy(B + 256 + 64 * i + 4 * r, b->qs + 4 * i, 4);
}

/* Q5_K: Q4_K's first 256 bytes, then its qs and qh words in kern_q5k_line's order. */
static void pack_q5k(unsigned char *B, int r, const block_q5_K *b)
{
    pack_dm_scales(B, r, &b->d, &b->dmin, b->scales);
    for (int i = 0; i < QK_K / 8; i++)
        memcpy(B + 256 + 64 * kern_q5k_line(i, 0) + 4 * r, b->qs + 4 * i, 4);
    for (int m = 0; m < QK_K / 32; m++)
        memcpy(B + 256 + 64 * kern_q5k_line(-1, m) + 4 * r, b->qh + 4 * m, 4);
}

static void pack_iq4xs(unsigned char *B, int r, const block_iq4_xs *b)
{
    memcpy(B + 2 * r, &b->d, 2);
    memcpy(B + 32 + 2 * r, &b->scales_h, 2);
    memcpy(B + 64 + 4 * r, b->scales_l, 4);
    for (int i = 0; i < QK_K / 8; i++) memcpy(B + 128 + 64 * i + 4 * r, b->qs + 4 * i, 4);
}

static void pack_q6k(unsigned char *B, int r, const block_q6_K *b)
{
    memcpy(B + 2 * r, &b->d, 2);
    for (int p = 0; p < Q6K_SCALES / 2; p++) memcpy(B + 32 + 32 * p + 2 * r, b->scales + 2 * p, 2);
    /* ql word 16h + 8a + wi and qh word 8h + wi (h < 2, a < 2, wi < 8): lines 24h + 3wi + a and
     * 24h + 3wi + 2 of the quants */
    for (int i = 0; i < QK_K / 8; i++) {
        const int h = i / 16, a = i / 8 % 2, wi = i % 8;
        memcpy(B + KERN_Q6KX16_QOFF + 64 * (24 * h + 3 * wi + a) + 4 * r, b->ql + 4 * i, 4);
    }
    for (int j = 0; j < QK_K / 16; j++) {
        const int h = j / 8, wi = j % 8;
        memcpy(B + KERN_Q6KX16_QOFF + 64 * (24 * h + 3 * wi + 2) + 4 * r, b->qh + 4 * j, 4);
    }
}

/* Row r of a group's packed pair of Q8_0 blocks B: block h (< 2) from b. */
static void pack_q80(unsigned char *B, int r, int h, const block_q8_0 *b)
{
    memcpy(B + 32 * h + 2 * r, &b->d, 2);
    for (int m = 0; m < QK8_0 / 4; m++) {
        uint32_t w;
        memcpy(&w, b->qs + 4 * m, 4);
        w ^= 0x80808080u; /* q + 128 in every byte */
        memcpy(B + 64 + 512 * h + 64 * m + 4 * r, &w, 4);
    }
}

void kern_kx16_pack(int wtype, const void *W, size_t wrb, int64_t rows, int64_t K, void *dst)
{
    const size_t bytes = kern_kx16_bytes(wtype, rows, K), ub = unit_bytes(wtype);
    if (!bytes) return;
    memset(dst, 0, bytes); /* the rows past the last: zero blocks (every scale 0) */
    const int64_t nu = units(wtype, K);
    for (int64_t o = 0; o < rows; o++) {
        const char *row = (const char *)W + (size_t)o * wrb;
        const int64_t g = o / KERN_PACK_ROWS;
        const int r = (int)(o % KERN_PACK_ROWS);
        for (int64_t s = 0; s < nu; s++) {
            unsigned char *B = (unsigned char *)dst + (size_t)(g * nu + s) * ub;
            if (wtype == DT_Q4_K) pack_q4k(B, r, (const block_q4_K *)row + s);
            else if (wtype == DT_Q5_K) pack_q5k(B, r, (const block_q5_K *)row + s);
            else if (wtype == DT_Q6_K) pack_q6k(B, r, (const block_q6_K *)row + s);
            else if (wtype == DT_IQ4_XS) pack_iq4xs(B, r, (const block_iq4_xs *)row + s);
            else if (wtype == DT_F16)
                for (int k = 0; k < 32; k++) memcpy(B + 32 * k + 2 * r, row + 2 * (32 * s + k), 2);
            else
                for (int h = 0; h < 2 && 2 * s + h < K / QK8_0; h++)
                    pack_q80(B, r, h, (const block_q8_0 *)row + 2 * s + h);
        }
    }
}
