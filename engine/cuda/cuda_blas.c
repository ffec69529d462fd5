/* engine/cuda/cuda_blas.c: cuBLAS loaded at run time (contract in cuda_blas.h).
 *
 * The declarations below are our own, from NVIDIA's cuBLAS API reference: a handle is an opaque
 * pointer; the status, operation, compute-type and algorithm types are C enums (int in the
 * x86-64 and AArch64 C ABIs); the exported names are the _v2 entry points that cublas_v2.h maps
 * cublasCreate and friends to. cudaDataType_t and libraryPropertyType come from the CUDA
 * runtime's own library_types.h, which the toolkit has even without cuBLAS. */
#include "engine/cuda/cuda_blas.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <library_types.h>

#include "common/err.h"
#include "engine/dtype.h"

typedef void *blas_handle_t; /* cublasHandle_t */
typedef int blas_status_t;   /* cublasStatus_t */
enum { BLAS_STATUS_SUCCESS = 0, BLAS_STATUS_INVALID_VALUE = 7 };
enum { BLAS_OP_N = 0, BLAS_OP_T = 1 };                          /* cublasOperation_t */
enum { BLAS_COMPUTE_32F = 68, BLAS_COMPUTE_32F_PEDANTIC = 69 }; /* cublasComputeType_t */
enum { BLAS_GEMM_DEFAULT = -1 };                                /* cublasGemmAlgo_t */

/* The functions used, as cuBLAS exports them. */
typedef struct {
    blas_status_t (*create)(blas_handle_t *h);
    blas_status_t (*destroy)(blas_handle_t h);
    blas_status_t (*set_stream)(blas_handle_t h, cudaStream_t s);
    blas_status_t (*set_workspace)(blas_handle_t h, void *ws, size_t bytes);
    blas_status_t (*gemm_ex)(blas_handle_t h, int transa, int transb, int m, int n, int k,
                             const void *alpha, const void *A, cudaDataType_t a_type, int lda,
                             const void *B, cudaDataType_t b_type, int ldb, const void *beta,
                             void *C, cudaDataType_t c_type, int ldc, int compute_type, int algo);
    const char *(*status_string)(blas_status_t st);
    blas_status_t (*get_property)(libraryPropertyType what, int *value);
} blas_fns_t;

static const struct {
    const char *name;
    size_t off;
} SYMS[] = {
    {"cublasCreate_v2", offsetof(blas_fns_t, create)},
    {"cublasDestroy_v2", offsetof(blas_fns_t, destroy)},
    {"cublasSetStream_v2", offsetof(blas_fns_t, set_stream)},
    {"cublasSetWorkspace_v2", offsetof(blas_fns_t, set_workspace)},
    {"cublasGemmEx", offsetof(blas_fns_t, gemm_ex)},
    {"cublasGetStatusString", offsetof(blas_fns_t, status_string)},
    {"cublasGetProperty", offsetof(blas_fns_t, get_property)},
};

/* The library names tried, newest first. */
static const char *const SONAMES[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
#define N_SONAMES (sizeof SONAMES / sizeof SONAMES[0])

struct cuda_blas {
    void *so;             /* libcublas (never dlclose'd: see cuda_blas_free) */
    blas_fns_t fn;
    blas_handle_t h;
    char desc[512];
};

/* Appends src to the NUL-terminated dst of capacity cap, cut off where it does not fit. */
static void append(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(dst), k = strlen(src);
    if (n + 1 >= cap) return;
    if (k > cap - 1 - n) k = cap - 1 - n;
    memcpy(dst + n, src, k);
    dst[n + k] = '\0';
}

/* Adds "what: why" to the "; "-separated trail of failed attempts. */
static void trail_add(char *trail, size_t cap, const char *what, const char *why)
{
    if (*trail) append(trail, cap, "; ");
    append(trail, cap, what);
    append(trail, cap, ": ");
    append(trail, cap, why ? why : "not loadable");
}

/* dst = src, cut off where it does not fit. */
static void set_str(char *dst, size_t cap, const char *src)
{
    *dst = '\0';
    append(dst, cap, src);
}

/* dlopen of the file `path` (a libcublas.so[.N] by path): its libcublasLt sibling first, so the
 * loader resolves cuBLAS's dependency on it by soname without a search path. */
static void *open_path(const char *path, char *trail, size_t cap)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strncmp(base, "libcublas.so", 12) == 0) {
        char lt[4096];
        int n = snprintf(lt, sizeof lt, "%.*slibcublasLt%s", (int)(base - path), path, base + 9);
        struct stat st;
        if (n > 0 && (size_t)n < sizeof lt && stat(lt, &st) == 0 &&
            !dlopen(lt, RTLD_NOW | RTLD_LOCAL))
            trail_add(trail, cap, lt, dlerror());
    }
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) trail_add(trail, cap, path, dlerror());
    return so;
}

/* Finds and opens libcublas; the path or name that worked goes to *used. */
static void *open_cublas(char *used, size_t used_cap, char *trail, size_t cap)
{
    const char *env = getenv("SPILLWAY_CUBLAS");
    if (env && *env) {
        struct stat st;
        if (stat(env, &st) != 0) {
            trail_add(trail, cap, env, "SPILLWAY_CUBLAS names no such file or folder");
            return NULL;
        }
        if (!S_ISDIR(st.st_mode)) {
            void *so = open_path(env, trail, cap);
            if (so) set_str(used, used_cap, env);
            return so;
        }
        for (size_t i = 0; i < N_SONAMES; i++) {
            char p[4096];
            int n = snprintf(p, sizeof p, "%s/%s", env, SONAMES[i]);
            if (n < 0 || (size_t)n >= sizeof p || stat(p, &st) != 0) continue;
            void *so = open_path(p, trail, cap);
            if (so) {
                set_str(used, used_cap, p);
                return so;
            }
        }
        trail_add(trail, cap, env, "no loadable libcublas.so.13, .so.12 or .so in this folder");
        return NULL;
    }
    for (size_t i = 0; i < N_SONAMES; i++) {
        void *so = dlopen(SONAMES[i], RTLD_NOW | RTLD_LOCAL);
        if (so) {
            set_str(used, used_cap, SONAMES[i]);
            return so;
        }
        trail_add(trail, cap, SONAMES[i], dlerror());
    }
    return NULL;
}

cuda_blas_t *cuda_blas_new(cudaStream_t stream, void *workspace, size_t ws_bytes, char *errstr,
                           size_t errlen)
{
    cuda_blas_t *b = calloc(1, sizeof *b);
    if (!b) {
        sw_seterr(errstr, errlen, "cuda: out of memory");
        return NULL;
    }
    char trail[1024] = "", used[400] = "";
    b->so = open_cublas(used, sizeof used, trail, sizeof trail);
    if (!b->so) {
        sw_seterr(errstr, errlen, "cuda: cuBLAS not found (%s). Install cuBLAS 12 or 13, or set "
                  "SPILLWAY_CUBLAS to its libcublas.so.N or the folder holding it (for the "
                  "nvidia-cublas Python wheel, the wheel's lib folder)", trail);
        goto fail;
    }
    for (size_t i = 0; i < sizeof SYMS / sizeof SYMS[0]; i++) {
        void *p = dlsym(b->so, SYMS[i].name);
        if (!p) {
            sw_seterr(errstr, errlen, "cuda: %s has no %s (cuBLAS 12 or newer is needed)", used,
                      SYMS[i].name);
            goto fail;
        }
        memcpy((char *)&b->fn + SYMS[i].off, &p, sizeof p);
    }
    int ver[3] = {0, 0, 0};
    b->fn.get_property(MAJOR_VERSION, &ver[0]);
    b->fn.get_property(MINOR_VERSION, &ver[1]);
    b->fn.get_property(PATCH_LEVEL, &ver[2]);
    snprintf(b->desc, sizeof b->desc, "%s (cuBLAS %d.%d.%d)", used, ver[0], ver[1], ver[2]);
    blas_status_t st = b->fn.create(&b->h);
    if (st != BLAS_STATUS_SUCCESS) {
        b->h = NULL;
        sw_seterr(errstr, errlen, "cuda: cublasCreate (%s): %s", b->desc, b->fn.status_string(st));
        goto fail;
    }
    if ((st = b->fn.set_stream(b->h, stream)) != BLAS_STATUS_SUCCESS ||
        (workspace && (st = b->fn.set_workspace(b->h, workspace, ws_bytes)) !=
                          BLAS_STATUS_SUCCESS)) {
        sw_seterr(errstr, errlen, "cuda: cuBLAS stream/workspace setup: %s", b->fn.status_string(st));
        goto fail;
    }
    return b;
fail:
    cuda_blas_free(b);
    return NULL;
}

void cuda_blas_free(cuda_blas_t *b)
{
    if (!b) return;
    if (b->h) b->fn.destroy(b->h);
    /* The library stays mapped until exit (no dlclose): libraries of the CUDA stack keep
     * process-wide state and exit handlers, and a later cuda_blas_new finds it loaded. */
    free(b);
}

const char *cuda_blas_describe(const cuda_blas_t *b)
{
    return b->desc;
}

const char *cuda_blas_status(const cuda_blas_t *b, int status)
{
    const char *s = b->fn.status_string(status);
    return s ? s : "unknown cuBLAS status";
}

int cuda_blas_gemm(cuda_blas_t *b, int wtype, const void *d_W, int N, int K, const void *d_X,
                   int T, float *d_Y, int ldy, float beta)
{
    const float alpha = 1.0f;
    cudaDataType_t dt;
    int ct = BLAS_COMPUTE_32F;
    if (wtype == DT_F32) {
        dt = CUDA_R_32F;
        ct = BLAS_COMPUTE_32F_PEDANTIC; /* no TF32 */
    } else if (wtype == DT_F16) {
        dt = CUDA_R_16F;
    } else if (wtype == DT_BF16) {
        dt = CUDA_R_16BF;
    } else {
        return BLAS_STATUS_INVALID_VALUE;
    }
    if (T <= 0) return BLAS_STATUS_SUCCESS;
    /* Row-major Y [T][N] = X [T][K] W^T is column-major Y^T (N x T) = W^T (N x K) X^T (K x T),
     * W read as a column-major K x N matrix, transposed. */
    return b->fn.gemm_ex(b->h, BLAS_OP_T, BLAS_OP_N, N, T, K, &alpha, d_W, dt, K, d_X, dt, K,
                         &beta, d_Y, CUDA_R_32F, ldy, ct, BLAS_GEMM_DEFAULT);
}
