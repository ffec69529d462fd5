/* tests/support/cuemu.h: a small emulation of the CUDA thread model on the CPU, so that the
 * real kernel sources of engine/cuda (*.cu, included unchanged by a C++ test driver compiled
 * with the host compiler; no nvcc, no GPU) can be run and compared with the CPU backend.
 *
 * Model: a launch runs its blocks one after another on a team of blockDim fibers (ucontext),
 * one per CUDA thread, on the launching OS thread. __syncthreads() is a barrier of the team; a
 * warp shuffle or ballot is a barrier of the warp's 32 threads around a per-warp exchange
 * buffer; a fiber waiting at a barrier yields, and the scheduler resumes the live fibers round
 * robin, in ascending and descending thread order on alternate passes (so code that reads what
 * another thread writes without a barrier between sees both orders); shared memory is a
 * function-local static (one block at a time uses it) and the dynamic shared memory a buffer
 * filled with a poison pattern (NaN as F32) before each block; atomics are host atomics.
 *
 * What it checks: the kernels' indexing (every thread's reads and writes; under ASan, reads
 * and writes out of the buffers), their synchronisation logic (a __syncthreads reached by part
 * of a block while the rest waits at the end of the block, or by different barriers, is reported
 * as "divergent barrier"; a barrier or shuffle that can never complete is reported as
 * "deadlock" at once instead of hanging; a launch whose dynamic shared memory exceeds 48 KiB
 * without cudaFuncSetAttribute, or any launch beyond the hardware limits, fails) and their
 * arithmetic (F32 operations in the same order as on the device up to contraction: nvcc may
 * fuse a * b + c into an FMA where the source does not forbid it, the host compiler here does
 * not, so results may differ in the last bits; fast intrinsics are not emulated).
 * What it does not check: warp timing and independent thread scheduling (lanes of a warp here
 * run one after another and meet only at shuffles), the device memory model (everything is
 * host memory, coherent, no caches), bank conflicts, occupancy, register limits and speed.
 * Only the CUDA features the kernels of engine/cuda and the drivers of their tests use are here
 * (the runtime's memory calls too: cudaMalloc is malloc); blocks run in order, so a
 * kernel that depends on blocks running concurrently (none does) would deadlock.
 *
 * Use: define nothing; include this header (directly or through the cuda_*.h shims in
 * tests/support/cuemu/, which the include path puts before the toolkit's), then the .cu file;
 * link tests/support/cuemu.cpp. Launches are synchronous: the stream argument is ignored and
 * "device" pointers are host pointers. Not thread-safe: one launch at a time per process. */
#ifndef SPILLWAY_TESTS_CUEMU_H
#define SPILLWAY_TESTS_CUEMU_H

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <functional>

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

typedef struct cuemu_stream *cudaStream_t;
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9
};
typedef enum cudaError cudaError_t;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

/* ---- the runtime (tests/support/cuemu.cpp) ---- */
inline thread_local uint3 threadIdx, blockIdx; /* set by the scheduler for the fiber it resumes */
extern dim3 blockDim, gridDim;
namespace cuemu {
/* The barrier of the whole block (kind 0: __syncthreads, 1: the end of a block). */
void block_barrier(int kind);
/* The barrier of the calling thread's warp (all 32 lanes). */
void warp_barrier();
/* Per-warp exchange buffers, double-buffered: a lane writes slot [phase][lane], passes the warp
 * barrier, reads; the next exchange uses the other phase. */
uint64_t *warp_slot(int warp, int phase);
int &warp_phase(); /* the calling CUDA thread's phase */
/* The warp-collective mma's exchange: 6 words of lane `lane` of the warp's [phase] buffer. */
uint32_t *warp_mma_slot(int warp, int phase, int lane);
void *dyn_smem();
cudaError_t last_error_take();
void set_max_dyn_smem(const void *fn, int bytes);
/* Runs body on a team of block threads for every block of grid; checks the configuration. */
cudaError_t run(const void *fn, dim3 grid, dim3 block, size_t smem, std::function<void()> body);

template <class T> static inline T exchange(T v, int src, bool take)
{
    static_assert(sizeof(T) <= 8, "exchange of at most 8 bytes");
    const int w = (int)(threadIdx.x >> 5), l = (int)(threadIdx.x & 31);
    int &ph = warp_phase();
    uint64_t *s = warp_slot(w, ph);
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    s[l] = u;
    warp_barrier();
    T r = v;
    if (take) memcpy(&r, &s[src], sizeof r);
    ph ^= 1;
    return r;
}

template <class F> struct launcher {
    F *fn;
    dim3 grid, block;
    size_t smem;
    template <class... A> void operator()(A... args) const
    {
        F *f = fn;
        cudaError_t rc = run((const void *)f, grid, block, smem, [=] { f(args...); });
        (void)rc;
    }
};
template <class F> static inline launcher<F> launch_of(F *fn, dim3 g, dim3 b, size_t smem,
                                                      cudaStream_t)
{
    return launcher<F>{fn, g, b, smem};
}
} /* namespace cuemu */

#define CUK_LAUNCH(grid, block, smem, stream, ...) \
    cuemu::launch_of(&__VA_ARGS__, dim3(grid), dim3(block), (size_t)(smem), stream)
#define CUK_DYN_SHARED(type, name) type *name = (type *)cuemu::dyn_smem()

static inline cudaError_t cudaGetLastError(void) { return cuemu::last_error_take(); }
static inline const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess               ? "no error"
           : e == cudaErrorInvalidValue     ? "invalid argument"
           : e == cudaErrorMemoryAllocation ? "out of memory"
                                            : "invalid configuration argument";
}

/* The runtime's memory calls for a test driver: "device" memory is host memory from malloc, a
 * copy of any kind is memcpy, and a stream has nothing to wait for (launches are synchronous). */
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
};
static inline cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n);
    return *p || !n ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind)
{
    memcpy(dst, src, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F *fn, enum cudaFuncAttribute, int value)
{
    cuemu::set_max_dyn_smem((const void *)fn, value);
    return cudaSuccess;
}

/* ---- intrinsics ---- */
static inline void __syncthreads(void) { cuemu::block_barrier(0); }
template <class T> static inline T __shfl_sync(unsigned, T v, int src)
{
    return cuemu::exchange(v, src & 31, true);
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o)
{
    return cuemu::exchange(v, (int)(threadIdx.x & 31) ^ o, true);
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, int o)
{
    const int l = (int)(threadIdx.x & 31);
    return cuemu::exchange(v, l + o, l + o < 32);
}
template <class T> static inline T __shfl_up_sync(unsigned, T v, int o)
{
    const int l = (int)(threadIdx.x & 31);
    return cuemu::exchange(v, l - o, l - o >= 0);
}
static inline unsigned __ballot_sync(unsigned, int p)
{
    const int w = (int)(threadIdx.x >> 5), l = (int)(threadIdx.x & 31);
    int &ph = cuemu::warp_phase();
    uint64_t *s = cuemu::warp_slot(w, ph);
    s[l] = p != 0;
    cuemu::warp_barrier();
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (unsigned)(s[i] != 0) << i;
    ph ^= 1;
    return r;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T> static inline T atomicAdd(T *p, T v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
/* _rn operations: the host compiler does not contract them (-ffp-contract=off, tests/CMake). */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned long long __double2ull_rz(double d)
{
    return d <= 0.0 ? 0ull : d >= 18446744073709551615.0 ? ~0ull : (unsigned long long)d;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

/* ---- F16 / BF16 (round to nearest even, as __float2half_rn / __float2bfloat16_rn) ---- */
struct __half {
    uint16_t x;
};
struct __nv_bfloat16 {
    uint16_t x;
};
static inline float __half2float(__half h)
{
    const uint32_t s = (uint32_t)(h.x >> 15) << 31, e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
    uint32_t u;
    if (e == 0x1f) {
        u = s | 0x7f800000u | (m << 13);
    } else if (e) {
        u = s | ((e + 112) << 23) | (m << 13);
    } else if (!m) {
        u = s;
    } else { /* subnormal: m * 2^-24 */
        float f = (float)m * (1.0f / 16777216.0f);
        return s ? -f : f;
    }
    return __uint_as_float(u);
}
static inline __half __float2half_rn(float f)
{
    const uint32_t u = __float_as_uint(f), s = (u >> 16) & 0x8000;
    const uint32_t a = u & 0x7fffffffu;
    __half h;
    if (a > 0x7f800000u) { h.x = (uint16_t)(s | 0x7e00); return h; }          /* NaN */
    if (a >= 0x477ff000u) { h.x = (uint16_t)(s | 0x7c00); return h; }         /* overflow */
    if (a < 0x38800000u) { /* below the smallest normal: units of 2^-24, ties to even */
        float q = __uint_as_float(a) * 16777216.0f;
        float r = nearbyintf(q); /* default rounding mode: to nearest even */
        h.x = (uint16_t)(s | (uint32_t)r);
        return h;
    }
    uint32_t e = (a >> 23) - 112, m = a & 0x7fffff;
    uint32_t v = (e << 10) | (m >> 13);
    const uint32_t rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (v & 1))) v++;
    h.x = (uint16_t)(s | v);
    return h;
}
static inline float __bfloat162float(__nv_bfloat16 b)
{
    return __uint_as_float((uint32_t)b.x << 16);
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u = __float_as_uint(f);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.x = (uint16_t)((u >> 16) | 0x40);
        return b;
    }
    u += 0x7fffu + ((u >> 16) & 1);
    b.x = (uint16_t)(u >> 16);
    return b;
}

/* ---- tensor-core MMA (engine/cuda/cuda_launch.h's cuk_mma_f16_16816) ----
 * mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, d = a b + d, with the fragment layouts of
 * the PTX ISA (g = lane / 4, c = lane % 4; each 32-bit register holds two F16, the lower index
 * in the low half): a[0] (row g, cols 2c, 2c+1), a[1] (row g+8, cols 2c, 2c+1), a[2] (row g,
 * cols 2c+8, 2c+9), a[3] (row g+8, cols 2c+8, 2c+9); b[0] (rows 2c, 2c+1, col g), b[1] (rows
 * 2c+8, 2c+9, col g); d[0], d[1] (row g, cols 2c, 2c+1), d[2], d[3] (row g+8, cols 2c, 2c+1).
 * Warp-collective: every lane publishes its fragments, passes the warp barrier, and computes
 * its own four outputs. Arithmetic: the products are exact (as on the device) and each output's
 * 16 products and its d are summed in double and rounded once to F32; the device's tensor
 * cores sum in their own order and precision, so the last bits may differ. Each output is a
 * function of its own row of a, column of b and element of d only, as on the device. */
#define CUK_HAVE_MMA 1
static inline float cuemu_h16(uint32_t w, int hi)
{
    __half h;
    h.x = (uint16_t)(hi ? w >> 16 : w & 0xffffu);
    return __half2float(h);
}
static inline void cuk_mma_f16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    const int w = (int)(threadIdx.x >> 5), l = (int)(threadIdx.x & 31);
    int &ph = cuemu::warp_phase();
    uint32_t *mine = cuemu::warp_mma_slot(w, ph, l);
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b[0];
    mine[5] = b[1];
    cuemu::warp_barrier();
    float A[16][16], B[16][8];
    for (int ln = 0; ln < 32; ln++) {
        const uint32_t *s = cuemu::warp_mma_slot(w, ph, ln);
        const int g = ln >> 2, c = ln & 3;
        for (int hi = 0; hi < 2; hi++) {
            A[g][2 * c + hi] = cuemu_h16(s[0], hi);
            A[g + 8][2 * c + hi] = cuemu_h16(s[1], hi);
            A[g][2 * c + 8 + hi] = cuemu_h16(s[2], hi);
            A[g + 8][2 * c + 8 + hi] = cuemu_h16(s[3], hi);
            B[2 * c + hi][g] = cuemu_h16(s[4], hi);
            B[2 * c + 8 + hi][g] = cuemu_h16(s[5], hi);
        }
    }
    ph ^= 1;
    const int g = l >> 2, c = l & 3;
    for (int i = 0; i < 4; i++) {
        const int r = g + (i >> 1) * 8, col = 2 * c + (i & 1);
        double acc = d[i];
        for (int k = 0; k < 16; k++) acc += (double)A[r][k] * (double)B[k][col];
        d[i] = (float)acc;
    }
}

#endif
