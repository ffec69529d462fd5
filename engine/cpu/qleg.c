/* engine/cpu/qleg.c: the shared driver of the Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS int8 routes
 * (qleg.h) and their portable C implementation.
 *
 * Portable arithmetic, per output element (t, o) -- fixed, so batch invariant:
 *   32-block types: for the blocks b in order, the exact integer P_b = sum_k w_k * xq_k (w_k:
 *   Q4_1 and Q5_1 q, Q5_0 q - 16, IQ4_NL kv[q]), a_b = fl(d_b * dx_b) * P_b, acc += a_b; Q4_1
 *   and Q5_1 also accm += fl(m_b * dx_b) * S_b (S_b the sum of the block's xq); y = acc + accm.
 *   IQ4_XS: for the super-blocks s in order, the exact integer
 *   isum_s = sum_j (ls_j - 32) * sum_{k in sub-block j} kv[q_k] * xq_k, acc += fl(d_s * dx_s) *
 *   isum_s; y = acc.
 * Each product and sum is its own statement (rounded; no fused multiply-add). */
#include "engine/cpu/qleg.h"

#include <stdlib.h>
#include <string.h>

int kern_qleg_type(int t)
{
    return t == DT_Q4_1 || t == DT_Q5_0 || t == DT_Q5_1 || t == DT_IQ4_NL || t == DT_IQ4_XS;
}

/* The block sums of a token's quants: s[b] = sum of q[32b .. 32b+31], exact in F32. */
static void block_sums(const int8_t *q, int64_t nb, float *s)
{
    for (int64_t b = 0; b < nb; b++, q += 32) {
        int sum = 0;
        for (int i = 0; i < 32; i++) sum += q[i];
        s[b] = (float)sum;
    }
}

int kern_qleg_matmul(const kern_qleg_t *f, int wtype, const void *W, size_t wrb, int64_t K,
                     const float *x, int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                     int64_t o1)
{
    if (!kern_qleg_type(wtype) || !kern_wtype_ok(wtype, K)) return -1;
    if (wtype == DT_IQ4_XS) /* the Q8_K token format and K rule of Q4_K */
        return kern_q4k_matmul(f->iq4_xs, f->quant_k, W, wrb, K, x, ldx, y, ldy, T, o0, o1);
    if (T <= 0 || o1 <= o0) return 0;
    const kern_qb32_fn fn = wtype == DT_Q4_1   ? f->q4_1
                            : wtype == DT_Q5_0 ? f->q5_0
                            : wtype == DT_Q5_1 ? f->q5_1
                                               : f->iq4_nl;
    const int64_t nb = K / 32;
    _Alignas(64) int8_t sq[KERN_Q8_STACK];
    float sd[KERN_Q8_STACK / 32], ss[KERN_Q8_STACK / 32];
    int8_t *heap = NULL;
    const size_t qb = ((size_t)T * (size_t)K + 63) / 64 * 64;
    if ((int64_t)T * K > KERN_Q8_STACK)
        heap = aligned_alloc(64, qb + 2 * (size_t)T * (size_t)nb * sizeof(float));
    if (heap || (int64_t)T * K <= KERN_Q8_STACK) {
        int8_t *q = heap ? heap : sq;
        float *xd = heap ? (float *)(heap + qb) : sd;
        float *xs = heap ? xd + (size_t)T * (size_t)nb : ss;
        for (int t = 0; t < T; t++) {
            f->quant(x + (int64_t)t * ldx, K, q + t * K, xd + t * nb);
            block_sums(q + t * K, nb, xs + t * nb);
        }
        fn(W, wrb, nb, q, xd, xs, T, y, ldy, o0, o1);
        free(heap);
        return 0;
    }
    /* no memory: chunks of tokens through the stack buffers (the same values per token) */
    const int chunk = (int)(KERN_Q8_STACK / K);
    for (int t0 = 0; t0 < T; t0 += chunk) {
        int n = T - t0 < chunk ? T - t0 : chunk;
        for (int t = 0; t < n; t++) {
            f->quant(x + (int64_t)(t0 + t) * ldx, K, sq + t * K, sd + t * nb);
            block_sums(sq + t * K, nb, ss + t * nb);
        }
        fn(W, wrb, nb, sq, sd, ss, n, y + (int64_t)t0 * ldy, ldy, o0, o1);
    }
    return 0;
}

/* ---- portable C ---- */

/* The integer weights of a 32-block in x's order (Q4_1 / Q5_1 q, Q5_0 q - 16, IQ4_NL kv[q]),
 * its scale d and min m (0 for the types without one). */
static void qb32_weights(int wtype, const char *blk, int w[32], float *d, float *m)
{
    const uint8_t *qs, *qh = NULL;
    uint16_t hd, hm = 0;
    memcpy(&hd, blk, 2); /* d is each block's first member */
    switch (wtype) {
    case DT_Q4_1: memcpy(&hm, blk + 2, 2); qs = ((const block_q4_1 *)blk)->qs; break;
    case DT_Q5_0: qh = ((const block_q5_0 *)blk)->qh; qs = ((const block_q5_0 *)blk)->qs; break;
    case DT_Q5_1:
        memcpy(&hm, blk + 2, 2);
        qh = ((const block_q5_1 *)blk)->qh;
        qs = ((const block_q5_1 *)blk)->qs;
        break;
    default: qs = ((const block_iq4_nl *)blk)->qs; break;
    }
    for (int i = 0; i < 16; i++) {
        w[i] = qs[i] & 0x0f;
        w[i + 16] = qs[i] >> 4;
    }
    if (qh)
        for (int i = 0; i < 32; i++) w[i] |= (qh[i / 8] >> (i % 8) & 1) << 4;
    if (wtype == DT_Q5_0)
        for (int i = 0; i < 32; i++) w[i] -= 16;
    if (wtype == DT_IQ4_NL)
        for (int i = 0; i < 32; i++) w[i] = dtype_iq4nl_values[w[i]];
    *d = fp16_to_f32(hd);
    *m = fp16_to_f32(hm);
}

static void sc_qb32(int wtype, const char *W, size_t wrb, int64_t nb, const int8_t *xq,
                    const float *xd, const float *xs, int T, float *y, int64_t ldy, int64_t o0,
                    int64_t o1)
{
    const size_t bs = dtype_block_bytes(wtype);
    const int has_min = wtype == DT_Q4_1 || wtype == DT_Q5_1;
    for (int64_t o = o0; o < o1; o++) {
        const char *row = W + (size_t)o * wrb;
        for (int t = 0; t < T; t++) {
            const int8_t *q = xq + (int64_t)t * nb * 32;
            const float *d = xd + (int64_t)t * nb, *s = xs + (int64_t)t * nb;
            float acc = 0.0f, accm = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int w[32];
                float dw, mw;
                qb32_weights(wtype, row + (size_t)b * bs, w, &dw, &mw);
                int32_t p = 0;
                for (int i = 0; i < 32; i++) p += w[i] * q[32 * b + i];
                float sc = dw * d[b];
                float a = sc * (float)p;
                acc += a;
                if (has_min) {
                    float sm = mw * d[b];
                    float am = sm * s[b];
                    accm += am;
                }
            }
            y[(int64_t)t * ldy + o] = acc + accm;
        }
    }
}

#define SC_QB32(NAME, DT)                                                                          \
    static void NAME(const char *W, size_t wrb, int64_t nb, const int8_t *xq, const float *xd,     \
                     const float *xs, int T, float *y, int64_t ldy, int64_t o0, int64_t o1)        \
    {                                                                                              \
        sc_qb32(DT, W, wrb, nb, xq, xd, xs, T, y, ldy, o0, o1);                                    \
    }
SC_QB32(sc_q41, DT_Q4_1)
SC_QB32(sc_q50, DT_Q5_0)
SC_QB32(sc_q51, DT_Q5_1)
SC_QB32(sc_iq4nl, DT_IQ4_NL)
#undef SC_QB32

static void sc_iq4xs(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T,
                     float *y, int64_t ldy, int64_t o0, int64_t o1)
{
    for (int64_t o = o0; o < o1; o++) {
        const block_iq4_xs *row = (const block_iq4_xs *)(W + (size_t)o * wrb);
        for (int t = 0; t < T; t++) {
            const kern_q8k_t *xb = xq + (int64_t)t * nsb;
            float acc = 0.0f;
            for (int64_t s = 0; s < nsb; s++) {
                const block_iq4_xs *b = row + s;
                int32_t isum = 0;
                for (int j = 0; j < QK_K / 32; j++) {
                    const uint8_t *qs = b->qs + 16 * j;
                    const int8_t *x8 = xb[s].q + 32 * j;
                    int32_t p = 0;
                    for (int i = 0; i < 16; i++)
                        p += dtype_iq4nl_values[qs[i] & 0x0f] * x8[i] +
                             dtype_iq4nl_values[qs[i] >> 4] * x8[i + 16];
                    isum += (iq4xs_scale(b, j) - 32) * p;
                }
                float sc = fp16_to_f32(b->d) * xb[s].d;
                float a = sc * (float)isum;
                acc += a;
            }
            y[(int64_t)t * ldy + o] = acc;
        }
    }
}

const kern_qleg_t kern_qleg_scalar = {
    .q4_1 = sc_q41,
    .q5_0 = sc_q50,
    .q5_1 = sc_q51,
    .iq4_nl = sc_iq4nl,
    .iq4_xs = sc_iq4xs,
    .quant = kern_q8_quantize,
    .quant_k = kern_q8k_quantize,
};
