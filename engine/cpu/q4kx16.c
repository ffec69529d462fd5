/* engine/cpu/q4kx16.c: Q4_K matrices repacked in groups of 16 rows (kernels_impl.h's layout), the
 * portable part: the size and the packing. */
#include <string.h>

#include "engine/cpu/kernels_impl.h"

size_t kern_q4kx16_bytes(int wtype, int64_t rows, int64_t K)
{
    if (wtype != DT_Q4_K || rows < 1 || !kern_wtype_ok(DT_Q4_K, K) || K == 0) return 0;
    const size_t groups = (size_t)((rows + KERN_Q4KX16_ROWS - 1) / KERN_Q4KX16_ROWS);
    return groups * (size_t)(K / QK_K) * KERN_Q4KX16_SB_BYTES;
}

void kern_q4kx16_pack(int wtype, const void *W, size_t wrb, int64_t rows, int64_t K, void *dst)
{
    const size_t bytes = kern_q4kx16_bytes(wtype, rows, K);
    if (!bytes) return;
    memset(dst, 0, bytes); /* the rows past the last: zero blocks (d = dmin = 0) */
    const int64_t nsb = K / QK_K;
    for (int64_t o = 0; o < rows; o++) {
        const block_q4_K *row = (const block_q4_K *)((const char *)W + (size_t)o * wrb);
        const int64_t g = o / KERN_Q4KX16_ROWS;
        const int r = (int)(o % KERN_Q4KX16_ROWS);
        for (int64_t s = 0; s < nsb; s++) {
            unsigned char *B = (unsigned char *)dst + (size_t)(g * nsb + s) * KERN_Q4KX16_SB_BYTES;
            const block_q4_K *b = row + s;
            memcpy(B + 2 * r, &b->d, 2);
            memcpy(B + 32 + 2 * r, &b->dmin, 2);
            for (int w = 0; w < 3; w++) memcpy(B + 64 + 64 * w + 4 * r, b->scales + 4 * w, 4);
            for (int i = 0; i < QK_K / 8; i++) memcpy(B + 256 + 64 * i + 4 * r, b->qs + 4 * i, 4);
        }
    }
}
