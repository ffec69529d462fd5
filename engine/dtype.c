/* engine/dtype.c: names and block geometry of the ggml tensor types. */
#include "dtype.h"

typedef struct {
    const char *name;
    int block_elems;
    int block_bytes;
} dtype_desc_t;

/* Indexed by ggml type number. Block sizes as fixed by the ggml file format (ggml-common.h
 * block structs); an entry with block_elems 0 is a number ggml has retired or never used. */
static const dtype_desc_t dtype_table[DT_COUNT_] = {
    [0] = {"f32", 1, 4},
    [1] = {"f16", 1, 2},
    [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},
    [6] = {"q5_0", 32, 22},
    [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},
    [9] = {"q8_1", 32, 36},
    [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},
    [12] = {"q4_K", 256, 144},
    [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},
    [15] = {"q8_K", 256, 292},
    [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},
    [18] = {"iq3_xxs", 256, 98},
    [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},
    [21] = {"iq3_s", 256, 110},
    [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136},
    [24] = {"i8", 1, 1},
    [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},
    [27] = {"i64", 1, 8},
    [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},
    [30] = {"bf16", 1, 2},
    [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},
    [39] = {"mxfp4", 32, 17},
    [40] = {"nvfp4", 64, 36},
    [41] = {"q1_0", 128, 18},
    [42] = {"q2_0", 64, 18},
};

_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 must be packed to 34 bytes");
_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 must be packed to 18 bytes");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K must be packed to 144 bytes");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K must be packed to 84 bytes");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K must be packed to 110 bytes");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K must be packed to 176 bytes");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K must be packed to 210 bytes");

static const dtype_desc_t *dtype_desc(int t)
{
    if (t < 0 || t >= DT_COUNT_ || dtype_table[t].block_elems == 0) return NULL;
    return &dtype_table[t];
}

const char *dtype_name(int t)
{
    const dtype_desc_t *d = dtype_desc(t);
    return d ? d->name : "unknown";
}

int dtype_supported(int t)
{
    return t == DT_F32 || t == DT_F16 || t == DT_BF16 || t == DT_Q8_0 || t == DT_Q4_0 ||
           t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K || t == DT_Q4_1 || t == DT_Q5_0 ||
           t == DT_Q5_1 || t == DT_IQ4_NL || t == DT_IQ4_XS || t == DT_Q2_K || t == DT_Q3_K;
}

/* Q6_K rows (engine/dtype.h): (d * sc) * (q - 32), in ggml's order. */
static void dequant_q6_k(const block_q6_K *blk, float *out, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, blk++) {
        const float d = fp16_to_f32(blk->d);
        for (int k = 0; k < QK_K; k++) {
            const float ds = d * (float)blk->scales[k / 16]; /* exact */
            out[b * QK_K + k] = ds * (float)(q6k_quant(blk, k) - 32);
        }
    }
}

/* Q5_K rows (engine/dtype.h): d*sc * q - dmin*m, one rounding. */
static void dequant_q5_k(const block_q5_K *blk, float *out, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, blk++) {
        const float d = fp16_to_f32(blk->d), dmin = fp16_to_f32(blk->dmin);
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m;
            q4k_scale_min(j, blk->scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m; /* both exact */
            for (int l = 0; l < 32; l++) {
                const float p = d1 * (float)q5k_quant(blk, 32 * j + l); /* exact */
                out[b * QK_K + 32 * j + l] = p - m1;
            }
        }
    }
}

void dtype_dequant_row(int t, const void *row, float *out, int64_t n)
{
    switch (t) {
    case DT_F32:
        memcpy(out, row, (size_t)n * sizeof(float));
        break;
    case DT_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)row + 2 * i, 2);
            out[i] = fp16_to_f32(h);
        }
        break;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)row + 2 * i, 2);
            out[i] = bf16_to_f32(h);
        }
        break;
    case DT_Q8_0:
        for (int64_t b = 0; b < n / QK8_0; b++) {
            const block_q8_0 *blk = (const block_q8_0 *)row + b;
            float d = fp16_to_f32(blk->d);
            for (int i = 0; i < QK8_0; i++) out[b * QK8_0 + i] = d * (float)blk->qs[i];
        }
        break;
    case DT_Q4_0:
        for (int64_t b = 0; b < n / QK4_0; b++) {
            const block_q4_0 *blk = (const block_q4_0 *)row + b;
            float d = fp16_to_f32(blk->d);
            float *o = out + b * QK4_0;
            for (int i = 0; i < QK4_0 / 2; i++) {
                o[i] = d * (float)((blk->qs[i] & 0x0f) - 8);
                o[i + QK4_0 / 2] = d * (float)((blk->qs[i] >> 4) - 8);
            }
        }
        break;
    case DT_Q4_K:
        for (int64_t b = 0; b < n / QK_K; b++) {
            const block_q4_K *blk = (const block_q4_K *)row + b;
            float d = fp16_to_f32(blk->d), dmin = fp16_to_f32(blk->dmin);
            for (int j = 0; j < QK_K / 32; j++) {
                int sc, m;
                q4k_scale_min(j, blk->scales, &sc, &m);
                float d1 = d * (float)sc, m1 = dmin * (float)m; /* both exact */
                const uint8_t *q = blk->qs + 32 * (j / 2);
                float *o = out + b * QK_K + 32 * j;
                for (int i = 0; i < 32; i++) {
                    int qi = j % 2 ? q[i] >> 4 : q[i] & 0x0f;
                    o[i] = d1 * (float)qi - m1; /* d1 * qi exact: one rounding */
                }
            }
        }
        break;
    case DT_Q2_K:
        dtype_dequant_q2_k(row, out, n);
        break;
    case DT_Q3_K:
        dtype_dequant_q3_k(row, out, n);
        break;
    case DT_Q5_K: dequant_q5_k(row, out, n / QK_K); break;
    case DT_Q6_K: dequant_q6_k(row, out, n / QK_K); break;
    default:
        if (!dtype_qleg_dequant_row(t, row, out, n)) memset(out, 0, (size_t)n * sizeof(float));
        break;
    }
}

int dtype_ggml_block_elems(int t)
{
    const dtype_desc_t *d = dtype_desc(t);
    return d ? d->block_elems : 0;
}

size_t dtype_ggml_block_bytes(int t)
{
    const dtype_desc_t *d = dtype_desc(t);
    return d ? (size_t)d->block_bytes : 0;
}
