/* engine/cuda/cuda_blas.c: cuBLAS loaded at run time (contract in cuda_blas.h).
 *
 * The declarations below are our own, from NVIDIA's cuBLAS API reference: a handle is an opaque
 * pointer; the status, operation, compute-type and algorithm types are C enums (int in the
 * x86-64 and AArch64 C ABIs); the exported names are the _v2 entry points that cublas_v2.h maps
 * cublasCreate and friends to. cudaDataType_t and libraryPropertyType come from the CUDA
 * runtime's own library_types.h, which the toolkit has even without cuBLAS. */
#include "engine/cuda/cuda_blas.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <library_types.h>

#include "common/err.h"
#include "engine/dtype.h"

typedef void *blas_handle_t; /* cublasHandle_t */
typedef int blas_status_t;   /* cublasStatus_t */
enum { BLAS_STATUS_SUCCESS = 0, BLAS_STATUS_INVALID_VALUE = 7, BLAS_STATUS_NOT_SUPPORTED = 15 };
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

/* cuBLASLt, from NVIDIA's cublasLt.h reference: handles and descriptors are opaque pointers, an
 * algorithm is 64 bytes held by the caller, the attribute selectors are C enums. */
typedef void *lt_handle_t; /* cublasLtHandle_t */
typedef void *lt_desc_t;   /* cublasLtMatmulDesc_t */
typedef void *lt_layout_t; /* cublasLtMatrixLayout_t */
typedef void *lt_pref_t;   /* cublasLtMatmulPreference_t */
typedef struct {
    uint64_t data[8];
} lt_algo_t; /* cublasLtMatmulAlgo_t */
typedef struct {
    lt_algo_t algo;
    size_t workspace_size;
    blas_status_t state;
    float waves_count;
    int reserved[4];
} lt_heur_t; /* cublasLtMatmulHeuristicResult_t */
enum { LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4 };          /* cublasLtMatmulDescAttributes_t */
enum { LT_LAYOUT_COLS = 3 };                              /* cublasLtMatrixLayoutAttribute_t */
enum { LT_PREF_MAX_WORKSPACE = 1, LT_PREF_REDUCTION_MASK = 3 }; /* ...PreferenceAttributes_t */
enum { LT_CONFIG_SPLITK_NUM = 2, LT_CONFIG_REDUCTION_SCHEME = 3 }; /* ...AlgoConfigAttributes_t */
enum { LT_REDUCTION_NONE = 0 };                           /* cublasLtReductionScheme_t */

typedef struct {
    blas_status_t (*create)(lt_handle_t *h);
    blas_status_t (*destroy)(lt_handle_t h);
    blas_status_t (*desc_create)(lt_desc_t *d, int compute_type, cudaDataType_t scale_type);
    blas_status_t (*desc_destroy)(lt_desc_t d);
    blas_status_t (*desc_set)(lt_desc_t d, int attr, const void *buf, size_t n);
    blas_status_t (*layout_create)(lt_layout_t *l, cudaDataType_t type, uint64_t rows,
                                   uint64_t cols, int64_t ld);
    blas_status_t (*layout_destroy)(lt_layout_t l);
    blas_status_t (*layout_set)(lt_layout_t l, int attr, const void *buf, size_t n);
    blas_status_t (*pref_create)(lt_pref_t *p);
    blas_status_t (*pref_destroy)(lt_pref_t p);
    blas_status_t (*pref_set)(lt_pref_t p, int attr, const void *buf, size_t n);
    blas_status_t (*heuristic)(lt_handle_t h, lt_desc_t d, lt_layout_t a, lt_layout_t b,
                               lt_layout_t c, lt_layout_t dd, lt_pref_t p, int requested,
                               lt_heur_t *results, int *returned);
    blas_status_t (*config_set)(lt_algo_t *algo, int attr, const void *buf, size_t n);
    blas_status_t (*check)(lt_handle_t h, lt_desc_t d, lt_layout_t a, lt_layout_t b,
                           lt_layout_t c, lt_layout_t dd, const lt_algo_t *algo, lt_heur_t *result);
    blas_status_t (*matmul)(lt_handle_t h, lt_desc_t d, const void *alpha, const void *A,
                            lt_layout_t a, const void *B, lt_layout_t b, const void *beta,
                            const void *C, lt_layout_t c, void *D, lt_layout_t dd,
                            const lt_algo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s);
} lt_fns_t;

static const struct {
    const char *name;
    size_t off;
} LT_SYMS[] = {
    {"cublasLtCreate", offsetof(lt_fns_t, create)},
    {"cublasLtDestroy", offsetof(lt_fns_t, destroy)},
    {"cublasLtMatmulDescCreate", offsetof(lt_fns_t, desc_create)},
    {"cublasLtMatmulDescDestroy", offsetof(lt_fns_t, desc_destroy)},
    {"cublasLtMatmulDescSetAttribute", offsetof(lt_fns_t, desc_set)},
    {"cublasLtMatrixLayoutCreate", offsetof(lt_fns_t, layout_create)},
    {"cublasLtMatrixLayoutDestroy", offsetof(lt_fns_t, layout_destroy)},
    {"cublasLtMatrixLayoutSetAttribute", offsetof(lt_fns_t, layout_set)},
    {"cublasLtMatmulPreferenceCreate", offsetof(lt_fns_t, pref_create)},
    {"cublasLtMatmulPreferenceDestroy", offsetof(lt_fns_t, pref_destroy)},
    {"cublasLtMatmulPreferenceSetAttribute", offsetof(lt_fns_t, pref_set)},
    {"cublasLtMatmulAlgoGetHeuristic", offsetof(lt_fns_t, heuristic)},
    {"cublasLtMatmulAlgoConfigSetAttribute", offsetof(lt_fns_t, config_set)},
    {"cublasLtMatmulAlgoCheck", offsetof(lt_fns_t, check)},
    {"cublasLtMatmul", offsetof(lt_fns_t, matmul)},
};

/* The token count a weight's algorithm is chosen for (see cuda_blas.h). */
#define LT_REF_T 128

/* One weight shape's fixed GEMM: descriptors and the algorithm chosen once. The B, C and D
 * layouts' column counts are set to each call's T. */
typedef struct {
    int wtype, N, K, ldy;
    int ok; /* 1: algo usable; 0: this shape goes through cublasGemmEx */
    lt_desc_t desc;
    lt_layout_t a, b, d;
    lt_algo_t algo;
} lt_plan_t;

/* The library names tried, newest first. */
static const char *const SONAMES[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
#define N_SONAMES (sizeof SONAMES / sizeof SONAMES[0])

struct cuda_blas {
    void *so;             /* libcublas (never dlclose'd: see cuda_blas_free) */
    blas_fns_t fn;
    blas_handle_t h;
    cudaStream_t stream;
    void *ws;             /* the caller's workspace, ws_bytes */
    size_t ws_bytes;
    lt_fns_t lt;          /* valid when lth */
    lt_handle_t lth;      /* NULL: no cuBLASLt, every GEMM through cublasGemmEx */
    lt_plan_t *plans;     /* [n_plans], one per weight shape seen */
    int n_plans;
    int fixed;            /* cuda_blas_set_fixed */
    long gemm_ex_calls;   /* GEMMs that went through cublasGemmEx */
    char desc[640];
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

/* Resolves cuBLASLt's functions (dlsym on libcublas's handle also searches its dependencies,
 * libcublasLt among them) and creates its handle; on failure b->lth stays NULL and the reason
 * goes to why. */
static void lt_open(cuda_blas_t *b, char *why, size_t cap)
{
    for (size_t i = 0; i < sizeof LT_SYMS / sizeof LT_SYMS[0]; i++) {
        void *p = dlsym(b->so, LT_SYMS[i].name);
        if (!p) {
            snprintf(why, cap, "no %s", LT_SYMS[i].name);
            return;
        }
        memcpy((char *)&b->lt + LT_SYMS[i].off, &p, sizeof p);
    }
    blas_status_t st = b->lt.create(&b->lth);
    if (st != BLAS_STATUS_SUCCESS) {
        b->lth = NULL;
        snprintf(why, cap, "cublasLtCreate: %s", b->fn.status_string(st));
    }
}

static void lt_plan_release(cuda_blas_t *b, lt_plan_t *p)
{
    if (p->a) b->lt.layout_destroy(p->a);
    if (p->b) b->lt.layout_destroy(p->b);
    if (p->d) b->lt.layout_destroy(p->d);
    if (p->desc) b->lt.desc_destroy(p->desc);
    p->a = p->b = p->d = p->desc = NULL;
}

/* Sets the column count (tokens) of the plan's B and D layouts. */
static blas_status_t lt_set_cols(cuda_blas_t *b, lt_plan_t *p, int T)
{
    uint64_t cols = (uint64_t)T;
    blas_status_t st = b->lt.layout_set(p->b, LT_LAYOUT_COLS, &cols, sizeof cols);
    return st ? st : b->lt.layout_set(p->d, LT_LAYOUT_COLS, &cols, sizeof cols);
}

/* The algorithm of one weight shape: cuBLASLt's heuristic for LT_REF_T tokens among the
 * configurations without a split of K (reduction scheme mask 0), pinned to one split and no
 * reduction, kept if cublasLtMatmulAlgoCheck accepts it at LT_REF_T and at 1 token. p->ok = 0
 * (and the descriptors released) when none is. */
static void lt_plan_init(cuda_blas_t *b, lt_plan_t *p, cudaDataType_t dt)
{
    lt_pref_t pref = NULL;
    const int op_t = BLAS_OP_T, op_n = BLAS_OP_N;
    p->ok = 0;
    /* F32 accumulation; cuBLASLt rounds F32 inputs to TF32 only when asked for by
     * CUBLAS_COMPUTE_32F_FAST_TF32, so DT_F32 stays F32 here too */
    if (b->lt.desc_create(&p->desc, BLAS_COMPUTE_32F, CUDA_R_32F) ||
        b->lt.desc_set(p->desc, LT_DESC_TRANSA, &op_t, sizeof op_t) ||
        b->lt.desc_set(p->desc, LT_DESC_TRANSB, &op_n, sizeof op_n) ||
        b->lt.layout_create(&p->a, dt, (uint64_t)p->K, (uint64_t)p->N, p->K) ||
        b->lt.layout_create(&p->b, dt, (uint64_t)p->K, LT_REF_T, p->K) ||
        b->lt.layout_create(&p->d, CUDA_R_32F, (uint64_t)p->N, LT_REF_T, p->ldy) ||
        b->lt.pref_create(&pref))
        goto fail;
    uint64_t ws = b->ws ? b->ws_bytes : 0;
    uint32_t mask = 0;
    if (b->lt.pref_set(pref, LT_PREF_MAX_WORKSPACE, &ws, sizeof ws) ||
        b->lt.pref_set(pref, LT_PREF_REDUCTION_MASK, &mask, sizeof mask))
        goto fail;
    lt_heur_t res[8];
    int n = 0;
    if (b->lt.heuristic(b->lth, p->desc, p->a, p->b, p->d, p->d, pref, 8, res, &n)) goto fail;
    for (int i = 0; i < n && !p->ok; i++) {
        if (res[i].state != BLAS_STATUS_SUCCESS) continue;
        lt_algo_t algo = res[i].algo;
        uint32_t one = 1, none = LT_REDUCTION_NONE;
        lt_heur_t chk;
        if (b->lt.config_set(&algo, LT_CONFIG_SPLITK_NUM, &one, sizeof one) ||
            b->lt.config_set(&algo, LT_CONFIG_REDUCTION_SCHEME, &none, sizeof none))
            continue;
        int fits = 1;
        const int probe[2] = {LT_REF_T, 1};
        for (int j = 0; j < 2 && fits; j++)
            fits = !lt_set_cols(b, p, probe[j]) &&
                   !b->lt.check(b->lth, p->desc, p->a, p->b, p->d, p->d, &algo, &chk) &&
                   chk.workspace_size <= ws;
        if (fits) {
            p->algo = algo;
            p->ok = 1;
        }
    }
fail:
    if (pref) b->lt.pref_destroy(pref);
    if (!p->ok) lt_plan_release(b, p);
}

/* The plan of (wtype, N, K, ldy), made at its first use; NULL when out of memory. */
static lt_plan_t *lt_plan_get(cuda_blas_t *b, int wtype, cudaDataType_t dt, int N, int K, int ldy)
{
    for (int i = 0; i < b->n_plans; i++) {
        lt_plan_t *p = &b->plans[i];
        if (p->wtype == wtype && p->N == N && p->K == K && p->ldy == ldy) return p;
    }
    lt_plan_t *grown = realloc(b->plans, sizeof *grown * (size_t)(b->n_plans + 1));
    if (!grown) return NULL;
    b->plans = grown;
    lt_plan_t *p = &b->plans[b->n_plans++];
    memset(p, 0, sizeof *p);
    p->wtype = wtype;
    p->N = N;
    p->K = K;
    p->ldy = ldy;
    lt_plan_init(b, p, dt);
    return p;
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
    char lt_why[160] = "";
    lt_open(b, lt_why, sizeof lt_why);
    snprintf(b->desc, sizeof b->desc, "%s (cuBLAS %d.%d.%d; %s%s)", used, ver[0], ver[1], ver[2],
             b->lth ? "GEMMs: cuBLASLt, one algorithm per weight, no split of K" :
                      "GEMMs: cublasGemmEx, no cuBLASLt: ", b->lth ? "" : lt_why);
    blas_status_t st = b->fn.create(&b->h);
    if (st != BLAS_STATUS_SUCCESS) {
        b->h = NULL;
        sw_seterr(errstr, errlen, "cuda: cublasCreate (%s): %s", b->desc, b->fn.status_string(st));
        goto fail;
    }
    b->stream = stream;
    b->fixed = 1;
    b->ws = workspace;
    b->ws_bytes = workspace ? ws_bytes : 0;
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
    for (int i = 0; i < b->n_plans; i++) lt_plan_release(b, &b->plans[i]);
    free(b->plans);
    if (b->lth) b->lt.destroy(b->lth);
    if (b->h) b->fn.destroy(b->h);
    /* The library stays mapped until exit (no dlclose): libraries of the CUDA stack keep
     * process-wide state and exit handlers, and a later cuda_blas_new finds it loaded. */
    free(b);
}

const char *cuda_blas_describe(const cuda_blas_t *b)
{
    return b->desc;
}

void cuda_blas_set_fixed(cuda_blas_t *b, int on)
{
    b->fixed = on != 0;
}

long cuda_blas_gemm_ex_calls(const cuda_blas_t *b)
{
    return b->gemm_ex_calls;
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
    } else if (wtype == CUDA_BLAS_FP8) {
        dt = CUDA_R_8F_E4M3;
        if (K % 16 || beta != 0.0f) return BLAS_STATUS_INVALID_VALUE;
    } else {
        return BLAS_STATUS_INVALID_VALUE;
    }
    if (T <= 0) return BLAS_STATUS_SUCCESS;
    /* Row-major Y [T][N] = X [T][K] W^T is column-major Y^T (N x T) = W^T (N x K) X^T (K x T),
     * W read as a column-major K x N matrix, transposed. */
    if (b->lth && b->fixed) {
        lt_plan_t *p = lt_plan_get(b, wtype, dt, N, K, ldy);
        if (p && p->ok && !lt_set_cols(b, p, T) &&
            b->lt.matmul(b->lth, p->desc, &alpha, d_W, p->a, d_X, p->b, &beta, d_Y, p->d, d_Y,
                         p->d, &p->algo, b->ws, b->ws_bytes, b->stream) == BLAS_STATUS_SUCCESS)
            return BLAS_STATUS_SUCCESS;
    }
    if (wtype == CUDA_BLAS_FP8) return BLAS_STATUS_NOT_SUPPORTED; /* cuBLASLt only */
    b->gemm_ex_calls++;
    return b->fn.gemm_ex(b->h, BLAS_OP_T, BLAS_OP_N, N, T, K, &alpha, d_W, dt, K, d_X, dt, K,
                         &beta, d_Y, CUDA_R_32F, ldy, ct, BLAS_GEMM_DEFAULT);
}
