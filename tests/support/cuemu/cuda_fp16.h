/* tests/support/cuemu/cuda_fp16.h: the CUDA header as the CPU emulation provides it. */
#include "../cuemu.h"
