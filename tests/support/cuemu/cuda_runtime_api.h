/* tests/support/cuemu/cuda_runtime_api.h: the CUDA header as the CPU emulation provides it. */
#include "../cuemu.h"
