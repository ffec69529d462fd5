/* engine/cpu/qleg.h: the int8 routes of Q4_1, Q5_0, Q5_1, IQ4_NL (blocks of 32) and IQ4_XS
 * (super-blocks of 256) behind kern_get's matmul and dequant_row (kernels.h states their
 * arithmetic and error bounds). Internal to engine/cpu/kernels*.c and engine/cpu/qleg*.c. */
#ifndef SPILLWAY_ENGINE_CPU_QLEG_H
#define SPILLWAY_ENGINE_CPU_QLEG_H

#include "engine/cpu/kernels_impl.h"

/* The ISA's part for a 32-block type: y[t * ldy + o] for t < T, o in [o0, o1), from rows of nb
 * blocks and the quantised tokens: token t's quants at xq + t * nb * 32, its block scales at
 * xd + t * nb and the exact sums of its quants per block (as F32) at xs + t * nb. */
typedef void (*kern_qb32_fn)(const char *W, size_t wrb, int64_t nb, const int8_t *xq,
                             const float *xd, const float *xs, int T, float *y, int64_t ldy,
                             int64_t o0, int64_t o1);

/* One ISA's routes. */
typedef struct {
    kern_qb32_fn q4_1, q5_0, q5_1, iq4_nl;
    kern_q4k_fn iq4_xs; /* on tokens quantised by quant_k (kern_q8k_t) */
    kern_q8_fn quant;   /* kern_q8_quantize or an ISA's version of it (the same bits) */
    kern_q8k_fn quant_k; /* kern_q8k_quantize or an ISA's version of it (the same bits) */
} kern_qleg_t;

/* 1 for DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_IQ4_NL, DT_IQ4_XS. */
int kern_qleg_type(int t);

/* matmul (kernels.h) for those types through f: quantises the T tokens (the 32-block types
 * with f->quant plus their block sums, into one heap buffer or, when T * K is small or the
 * allocation fails, on the stack in chunks of tokens; IQ4_XS through kern_q4k_matmul with
 * f->quant_k) and runs the type's route. Returns 0, or -1 when wtype is not one of the five or
 * K is not supported (kern_wtype_ok). */
int kern_qleg_matmul(const kern_qleg_t *f, int wtype, const void *W, size_t wrb, int64_t K,
                     const float *x, int64_t ldx, float *y, int64_t ldy, int T, int64_t o0,
                     int64_t o1);

extern const kern_qleg_t kern_qleg_scalar;
#ifdef KERN_HAVE_X86
extern const kern_qleg_t kern_qleg_avx2;
extern const kern_qleg_t kern_qleg_avx512;
extern const kern_qleg_t kern_qleg_avx512_vnni;
#endif

#endif
