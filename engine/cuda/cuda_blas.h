/* engine/cuda/cuda_blas.h: the part of cuBLAS the CUDA backend uses, loaded at run time.
 *
 * cuBLAS is not linked: cuda_blas_new() finds the shared library with dlopen and resolves the
 * few functions used into a table held by the returned object, so the build needs no cuBLAS
 * headers or libraries (the build machines' CUDA toolkit has none), and one binary serves hosts
 * without a GPU or without cuBLAS (the CUDA backend then refuses with the reason; the CPU path
 * is unaffected).
 *
 * Where it looks, in order: $SPILLWAY_CUBLAS (a libcublas.so.N file, or a folder holding one:
 * e.g. the lib folder of the nvidia-cublas Python wheel), then the dynamic linker's own search
 * (LD_LIBRARY_PATH, the ld.so cache) for libcublas.so.13, libcublas.so.12, libcublas.so. The
 * libcublasLt beside a libcublas found by path is loaded first, so cuBLAS finds it even when its
 * folder is on no search path; cuBLASLt's functions are taken from that dependency.
 *
 * Threads: an object is used by one thread at a time (its handle is cuBLAS's handle). Ownership:
 * the caller owns the object; the stream and workspace given at creation stay the caller's and
 * must outlive it. */
#ifndef SPILLWAY_ENGINE_CUDA_BLAS_H
#define SPILLWAY_ENGINE_CUDA_BLAS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_blas cuda_blas_t;

/* Loads cuBLAS, creates a handle bound to `stream` (work is enqueued there) and gives it the
 * device `workspace` of ws_bytes (NULL/0: cuBLAS's own). NULL + errstr when the library is not
 * found, lacks a function, or the handle cannot be created (no device, say). */
cuda_blas_t *cuda_blas_new(cudaStream_t stream, void *workspace, size_t ws_bytes, char *errstr,
                           size_t errlen);

/* Destroys the handle and unloads the library; NULL is allowed. */
void cuda_blas_free(cuda_blas_t *b);

/* "PATH (cuBLAS MAJOR.MINOR.PATCH)": what was loaded. Valid while b lives. */
const char *cuda_blas_describe(const cuda_blas_t *b);

/* cuBLAS's text for a status code returned by cuda_blas_gemm (static). */
const char *cuda_blas_status(const cuda_blas_t *b, int status);

/* wtype of an FP8 GEMM (not a file type): W and X in E4M3 bytes (cuda_kernels.h), K a multiple
 * of 16, beta 0, through cuBLASLt only (no cublasGemmEx fallback: CUBLAS_STATUS_NOT_SUPPORTED
 * without a cuBLASLt algorithm); the caller applies the scales (cuk_fp8_epilogue). A device
 * of compute capability 8.9 or later. */
#define CUDA_BLAS_FP8 1008

/* Y[t][o] = sum_k W[o][k] X[t][k] + beta * Y[t][o], t < T, o < N: W [N][K] and X [T][K] of
 * wtype (DT_F32, DT_F16, DT_BF16 or CUDA_BLAS_FP8; row-major, rows contiguous; W, X and Y at least 256-byte
 * aligned, as cudaMalloc gives), Y F32 with row stride ldy >= N, accumulation in F32 (DT_F32
 * without TF32: the F32 mode tracks the CPU backend). beta 1 adds the product into Y (the
 * residual adds). Enqueued on the handle's stream; returns the cuBLAS status (0 = success).
 *
 * Batch invariance: through cuBLASLt, each (wtype, N, K, ldy) gets one algorithm at its first
 * call -- the heuristic's choice for 128 tokens among the configurations that do not split K,
 * pinned to one split and no reduction -- and every later call of that shape uses it whatever
 * T is, so each output is one thread block's walk over K in an order T does not change, and a
 * token's row of Y does not depend on the other rows of X. Without cuBLASLt, for a shape no
 * such algorithm is accepted for, or when cuBLASLt refuses a call, the call goes through
 * cublasGemmEx, whose algorithm may change with T (counted: cuda_blas_gemm_ex_calls). */
int cuda_blas_gemm(cuda_blas_t *b, int wtype, const void *d_W, int N, int K, const void *d_X,
                   int T, float *d_Y, int ldy, float beta);

/* on 0: every later cuda_blas_gemm goes through cublasGemmEx with cuBLAS's own choice of
 * algorithm for each shape (a reference GEMM rate; not batch invariant); on 1 (the default at
 * creation): the fixed algorithms above. */
void cuda_blas_set_fixed(cuda_blas_t *b, int on);

/* How many cuda_blas_gemm calls so far went through cublasGemmEx (not batch invariant). */
long cuda_blas_gemm_ex_calls(const cuda_blas_t *b);

#ifdef __cplusplus
}
#endif

#endif
