/* tests/cuemu_kernels.cpp: engine/cuda/cuda_kernels.cu, unchanged, compiled for the CPU
 * emulation of tests/support/cuemu.h (test_cuemu). */
#include "support/cuemu.h"

#include "engine/cuda/cuda_kernels.cu"
