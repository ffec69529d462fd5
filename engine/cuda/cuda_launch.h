/* engine/cuda/cuda_launch.h: the two spellings of the kernel sources (the .cu files of
 * engine/cuda) that differ between nvcc and the CPU emulation of tests/support/cuemu.h, which
 * compiles the same .cu files with the host C++ compiler to check their logic without a GPU:
 *   CUK_LAUNCH(grid, block, smem, stream, kernel)(args...)  a kernel launch (the kernel, which
 *                                                           may be a template-id, comes last);
 *   CUK_DYN_SHARED(type, name);                             the block's dynamic shared memory
 *                                                           as `type name[]`;
 *   cuk_mma_f16_16816(d, a, b)                              the warp-collective tensor-core
 *                                                           d += a b (m16n8k16, F16 inputs,
 *                                                           F32 accumulators; fragment layouts
 *                                                           of the PTX ISA, see cuemu.h).
 * Under nvcc they are the <<<...>>> launch, an extern __shared__ array and the mma.sync
 * instruction (sm_80 and later). The emulation defines all three before it includes a .cu
 * file. */
#ifndef SPILLWAY_ENGINE_CUDA_LAUNCH_H
#define SPILLWAY_ENGINE_CUDA_LAUNCH_H

#ifndef CUK_LAUNCH
#define CUK_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif
#ifndef CUK_DYN_SHARED
#define CUK_DYN_SHARED(type, name) extern __shared__ type name[]
#endif
#ifndef CUK_HAVE_MMA
static __device__ __forceinline__ void cuk_mma_f16_16816(float d[4], const uint32_t a[4],
                                                         const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

#endif
