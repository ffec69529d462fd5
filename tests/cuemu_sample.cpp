/* tests/cuemu_sample.cpp: engine/cuda/cuda_sample.cu, unchanged, compiled for the CPU emulation
 * of tests/support/cuemu.h (test_cuemu). */
#include "support/cuemu.h"

#include "engine/cuda/cuda_sample.cu"
