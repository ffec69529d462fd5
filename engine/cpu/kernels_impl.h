/* engine/cpu/kernels_impl.h: the per-ISA kernel tables behind kern_get(). Internal to
 * engine/cpu/kernels*.c.
 *
 * Each table is a static const object defined in its own translation unit; the AVX2 and AVX-512
 * units compile their functions for those ISAs with `#pragma GCC target`, so a table may only
 * be used after kern_get() checked the CPU (kern_get is the only caller). */
#ifndef SPILLWAY_ENGINE_CPU_KERNELS_IMPL_H
#define SPILLWAY_ENGINE_CPU_KERNELS_IMPL_H

#include "engine/cpu/kernels.h"
#include "engine/dtype.h"

/* 1 when matmul supports weight type t with row length K. */
static inline int kern_wtype_ok(int t, int64_t K)
{
    switch (t) {
    case DT_F32: case DT_F16: case DT_BF16: return K >= 0;
    case DT_Q8_0: return K >= 0 && K % QK8_0 == 0;
    case DT_Q4_0: return K >= 0 && K % QK4_0 == 0;
    case DT_Q4_K: return K >= 0 && K % QK_K == 0;
    default: return 0;
    }
}

extern const kern_table_t kern_table_scalar;
#if defined(__x86_64__) && defined(__GNUC__)
#define KERN_HAVE_X86 1
extern const kern_table_t kern_table_avx2;
extern const kern_table_t kern_table_avx512;
#endif

/* 1 for the block types whose K is always a multiple of 32 (no partial tail chunk). */
static inline int kern_wtype_blocked(int t)
{
    return t == DT_Q8_0 || t == DT_Q4_0 || t == DT_Q4_K;
}

#endif
