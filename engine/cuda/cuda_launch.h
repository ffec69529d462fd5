/* engine/cuda/cuda_launch.h: the two spellings of the kernel sources (the .cu files of
 * engine/cuda) that differ between nvcc and the CPU emulation of tests/support/cuemu.h, which
 * compiles the same .cu files with the host C++ compiler to check their logic without a GPU:
 *   CUK_LAUNCH(grid, block, smem, stream, kernel)(args...)  a kernel launch (the kernel, which
 *                                                           may be a template-id, comes last);
 *   CUK_DYN_SHARED(type, name);                             the block's dynamic shared memory
 *                                                           as `type name[]`.
 * Under nvcc they are the <<<...>>> launch and an extern __shared__ array. The emulation
 * defines both before it includes a .cu file. */
#ifndef SPILLWAY_ENGINE_CUDA_LAUNCH_H
#define SPILLWAY_ENGINE_CUDA_LAUNCH_H

#ifndef CUK_LAUNCH
#define CUK_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif
#ifndef CUK_DYN_SHARED
#define CUK_DYN_SHARED(type, name) extern __shared__ type name[]
#endif

#endif
