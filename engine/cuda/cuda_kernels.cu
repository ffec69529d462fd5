/* engine/cuda/cuda_kernels.cu: device kernels of the CUDA backend (contracts in
 * cuda_kernels.h). Compiled by nvcc as CUDA C++; everything outside this file sees the extern "C"
 * launchers only.
 *
 * Arithmetic: no fast-math; the element-wise steps that the CPU backend does as separate F32
 * operations (RoPE rotations, RMSNorm scaling) use explicitly rounded multiplies and adds so the
 * compiler cannot contract them into FMAs, which keeps the F32 path as close to the CPU
 * reference as a different summation order allows. */
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/cuda_launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "engine/dtype.h"
#include "engine/model.h"

/* Threads per block of the element-wise and row kernels. */
#define CUK_THREADS 256

size_t cuk_elem_bytes(int type)
{
    switch (type) {
    case DT_F32: return 4;
    case DT_F16: case DT_BF16: return 2;
    default: return 0;
    }
}

static __device__ __forceinline__ float ld_elem(int type, const void *p, size_t i)
{
    if (type == DT_F32) return ((const float *)p)[i];
    if (type == DT_F16) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

static __device__ __forceinline__ void st_elem(int type, void *p, size_t i, float v)
{
    if (type == DT_F32) ((float *)p)[i] = v;
    else if (type == DT_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}

static int grid_for(size_t n)
{
    size_t g = (n + CUK_THREADS - 1) / CUK_THREADS;
    if (g > 65535u * 16u) g = 65535u * 16u; /* grid-stride loops cover the rest */
    return g ? (int)g : 1;
}

static int launched(void)
{
    return (int)cudaGetLastError();
}

/* ---- conversions and synthetic fill ---- */

static __global__ void k_convert(int st, const void *src, int dt, void *dst, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st_elem(dt, dst, i, ld_elem(st, src, i));
}

extern "C" int cuk_convert(int src_type, const void *d_src, int dst_type, void *d_dst, size_t n,
                           cudaStream_t stream)
{
    if (!cuk_elem_bytes(src_type) || !cuk_elem_bytes(dst_type)) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    CUK_LAUNCH(grid_for(n), CUK_THREADS, 0, stream, k_convert)(src_type, d_src, dst_type, d_dst, n);
    return launched();
}

static __device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static __global__ void k_fill_random(int dt, void *dst, size_t n, uint64_t seed, float lo,
                                     float hi)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float u = (float)(mix64(seed ^ mix64(i)) >> 40) * (1.0f / 16777216.0f);
        st_elem(dt, dst, i, lo + (hi - lo) * u);
    }
}

extern "C" int cuk_fill_random(int dst_type, void *d_dst, size_t n, uint64_t seed, float lo,
                               float hi, cudaStream_t stream)
{
    if (!cuk_elem_bytes(dst_type)) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    CUK_LAUNCH(grid_for(n), CUK_THREADS, 0, stream, k_fill_random)(dst_type, d_dst, n, seed, lo,
                                                                  hi);
    return launched();
}

/* ---- embedding, RoPE table ---- */

static __global__ void k_embed(int wt, const void *table, const int32_t *tokens, int dim,
                               float *x)
{
    const int t = blockIdx.x;
    const size_t row = (size_t)tokens[t] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        x[(size_t)t * dim + i] = ld_elem(wt, table, row + i);
}

extern "C" int cuk_embed(int wtype, const void *d_table, const int32_t *d_tokens, int T, int dim,
                         float *d_x, cudaStream_t stream)
{
    if (T <= 0) return 0;
    CUK_LAUNCH(T, CUK_THREADS, 0, stream, k_embed)(wtype, d_table, d_tokens, dim, d_x);
    return launched();
}

static __global__ void k_rope_table(const int32_t *pos, int T, const float *inv_freq, int half,
                                    float freq_scale, float *cs)
{
    size_t n = (size_t)T * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(k / half), i = (int)(k % half);
        double a = (double)pos[t] * (double)freq_scale * (double)inv_freq[i];
        cs[2 * k] = (float)cos(a);
        cs[2 * k + 1] = (float)sin(a);
    }
}

extern "C" int cuk_rope_table(const int32_t *d_pos, int T, const float *d_inv_freq, int half,
                              float freq_scale, float *d_cs, cudaStream_t stream)
{
    if (T <= 0 || half <= 0) return 0;
    CUK_LAUNCH(grid_for((size_t)T * half), CUK_THREADS, 0, stream, k_rope_table)(
        d_pos, T, d_inv_freq, half, freq_scale, d_cs);
    return launched();
}

/* ---- RMSNorm, SwiGLU ---- */

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
static __device__ float block_sum(float v)
{
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* red[] may still be read by a previous call */
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}

static __global__ void k_rmsnorm(const float *x, const int32_t *rows, int dim, const float *w,
                                 float eps, int ot, void *out)
{
    const int t = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[t] : t) * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += __fmul_rn(xr[i], xr[i]);
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        st_elem(ot, out, (size_t)t * dim + i, __fmul_rn(__fmul_rn(xr[i], scale), w[i]));
}

extern "C" int cuk_rmsnorm(const float *d_x, const int32_t *d_rows, int T, int dim,
                           const float *d_w, float eps, int out_type, void *d_out,
                           cudaStream_t stream)
{
    if (!cuk_elem_bytes(out_type)) return (int)cudaErrorInvalidValue;
    if (T <= 0) return 0;
    CUK_LAUNCH(T, CUK_THREADS, 0, stream, k_rmsnorm)(d_x, d_rows, dim, d_w, eps, out_type, d_out);
    return launched();
}

static __global__ void k_swiglu(const float *gu, int T, int ffn, int ot, void *out)
{
    const size_t n = (size_t)T * ffn;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        size_t t = k / ffn, i = k % ffn;
        float g = gu[t * 2 * ffn + i], u = gu[t * 2 * ffn + ffn + i];
        st_elem(ot, out, k, __fmul_rn(g / (1.0f + expf(-g)), u));
    }
}

extern "C" int cuk_swiglu(const float *d_gu, int T, int ffn, int out_type, void *d_out,
                          cudaStream_t stream)
{
    if (!cuk_elem_bytes(out_type)) return (int)cudaErrorInvalidValue;
    if (T <= 0) return 0;
    CUK_LAUNCH(grid_for((size_t)T * ffn), CUK_THREADS, 0, stream, k_swiglu)(d_gu, T, ffn, out_type,
                                                                    d_out);
    return launched();
}

/* ---- bias + RoPE + KV store ---- */

/* Element index of (block, kind 0 K / 1 V, slot, kv head, element) in the KV pool. */
static __device__ __forceinline__ size_t kv_index(const cuk_paged_t &p, int n_kv, int hd,
                                                  int32_t blk, int kind, int slot, int g, int e)
{
    return (size_t)blk * p.block_elems +
           ((((size_t)p.layer * 2 + kind) * p.block_tokens + slot) * n_kv + g) * hd + e;
}

static __global__ void k_qkv_rope_store(cuk_qkv_args_t a)
{
    const int t = blockIdx.x;
    const int hd = a.head_dim, hp = hd / 2, half = a.rope_dim / 2;
    const int rows = a.n_heads + 2 * a.n_kv_heads;
    const int pos = a.kv.pos[t];
    const int B = a.kv.block_tokens;
    const int32_t blk = a.kv.bt[a.kv.bt_off[a.kv.tok_seq[t]] + pos / B];
    const int slot = pos % B;
    float *row0 = a.qkv + (size_t)t * a.ld;
    const float *cs = a.cs + (size_t)t * half * 2;
    for (int k = threadIdx.x; k < rows * hp; k += blockDim.x) {
        const int r = k / hp, j = k % hp;
        int e0, e1, rot;
        if (a.rope_kind == ROPE_NEOX) {
            rot = j < half;
            e0 = rot ? j : a.rope_dim + 2 * (j - half);
            e1 = rot ? j + half : e0 + 1;
        } else {
            rot = j < half;
            e0 = 2 * j;
            e1 = 2 * j + 1;
        }
        float *v = row0 + (size_t)r * hd;
        float x0 = v[e0], x1 = v[e1];
        if (a.bias) {
            x0 = __fadd_rn(x0, a.bias[(size_t)r * hd + e0]);
            x1 = __fadd_rn(x1, a.bias[(size_t)r * hd + e1]);
        }
        if (rot && r < a.n_heads + a.n_kv_heads) {
            const float co = cs[2 * j], si = cs[2 * j + 1];
            const float y0 = __fsub_rn(__fmul_rn(x0, co), __fmul_rn(x1, si));
            const float y1 = __fadd_rn(__fmul_rn(x0, si), __fmul_rn(x1, co));
            x0 = y0;
            x1 = y1;
        }
        if (r < a.n_heads) {
            v[e0] = x0;
            v[e1] = x1;
            continue;
        }
        const int kind = r < a.n_heads + a.n_kv_heads ? 0 : 1;
        const int g = r - a.n_heads - kind * a.n_kv_heads;
        const size_t i0 = kv_index(a.kv, a.n_kv_heads, hd, blk, kind, slot, g, e0);
        const size_t i1 = kv_index(a.kv, a.n_kv_heads, hd, blk, kind, slot, g, e1);
        if (a.kv.kv_type == DT_F32) {
            ((float *)a.kv.kv)[i0] = x0;
            ((float *)a.kv.kv)[i1] = x1;
        } else {
            ((__half *)a.kv.kv)[i0] = __float2half_rn(x0);
            ((__half *)a.kv.kv)[i1] = __float2half_rn(x1);
        }
    }
}

extern "C" int cuk_qkv_rope_store(const cuk_qkv_args_t *a, cudaStream_t stream)
{
    if (a->head_dim % 2 || a->rope_dim % 2 || a->rope_dim > a->head_dim ||
        (a->kv.kv_type != DT_F32 && a->kv.kv_type != DT_F16))
        return (int)cudaErrorInvalidValue;
    if (a->T <= 0) return 0;
    CUK_LAUNCH(a->T, CUK_THREADS, 0, stream, k_qkv_rope_store)(*a);
    return launched();
}

/* ---- paged attention: split-K partials, then the merge ---- */

/* Keys per shared-memory tile of the attention kernel (one key per lane when scoring). */
#define ATT_TILE 32
/* Most warps per attention block; a warp serves ceil(group / warps) query heads. */
#define ATT_MAX_WARPS 8
/* Dynamic shared memory a block may use without opting in (cudaFuncSetAttribute). */
#define ATT_SMEM_DEFAULT (48 * 1024)

static __device__ __forceinline__ float kv_f(float v) { return v; }
static __device__ __forceinline__ float kv_f(__half v) { return __half2float(v); }

/* 16 bytes of KV elements (4 F32 or 8 F16) at p, 16-byte aligned, widened into o. */
static __device__ __forceinline__ void kv_vec(const float *p, float *o)
{
    const uint4 v = *(const uint4 *)p;
    memcpy(o, &v, 16);
}
static __device__ __forceinline__ void kv_vec(const __half *p, float *o)
{
    const uint4 v = *(const uint4 *)p;
    __half h[8];
    memcpy(h, &v, 16);
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = __half2float(h[i]);
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* One step of the left fold of chunk partials (cuk_attention, cuk_attention_tc): the state (M,
 * L, O) and a chunk's (m, l, o) give M' = max(M, m), O' = o cb + O ca and L' = l cb + L ca, with
 * ca = e^(M - M') and cb = e^(m - M') (0 for an empty side, M or m = -inf). Every rounding is
 * explicit, so a kernel's own fold and the merge kernel's compute the same bits. */
static __device__ __forceinline__ void att_fold_coef(float M, float m, float *Mn, float *ca,
                                                     float *cb)
{
    *Mn = fmaxf(M, m);
    *ca = M == -INFINITY ? 0.0f : expf(__fsub_rn(M, *Mn));
    *cb = m == -INFINITY ? 0.0f : expf(__fsub_rn(m, *Mn));
}
static __device__ __forceinline__ float att_fold(float O, float ca, float o, float cb)
{
    return __fmaf_rn(o, cb, __fmul_rn(O, ca));
}

/* Block (t, g, z) of blockDim.x = 32 * warps threads: the query heads g * grp .. g * grp + grp -
 * 1 of token t (grp = n_heads / n_kv_heads) against the chunks of a.chunk keys [c * chunk,
 * min(n_ctx, (c + 1) * chunk)) of kv head g, each chunk a fresh online softmax. When the token's
 * nch = ceil(n_ctx / chunk) chunks fit the scratch (nch <= n_splits), block z computes chunks z,
 * z + gridDim.z, ... and writes each as a partial (acc[head_dim], m, l) at part[((t * n_heads +
 * h) * n_splits + c)], which k_attn_fold_merge folds; otherwise block 0 folds every chunk itself
 * (att_fold, the merge's arithmetic) and writes the output, and the others return. The K and V
 * rows of each tile of ATT_TILE keys are read from the pool once, by the whole block (16-byte
 * loads when head_dim is a multiple of 16 bytes of elements: the pool is cudaMalloc'd, every row
 * then starts 16-byte aligned), into shared memory (F32) and used by every query head of the
 * group: warp w serves heads w, w + warps, ... (at most HPW).
 * Per head, lane j scores key j of the tile, the warp updates the online softmax (running max m,
 * sum l) and lane i accumulates elements i + 32 k (k < NE, NE * 32 >= head_dim) of the weighted
 * V sum. Blocks with no chunk return at once (the merge does not read them).
 * Shared memory (dynamic, att_smem_bytes): q [grp][hd], K tile, V tile [ATT_TILE][hd + 1]. */
template <typename KT, int NE, int HPW>
static __global__ void __launch_bounds__(32 * ATT_MAX_WARPS) k_attn_part(cuk_attn_args_t a)
{
    CUK_DYN_SHARED(float, att_sm);
    const int t = blockIdx.x, g = blockIdx.y, z = blockIdx.z;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int grp = a.n_heads / a.n_kv_heads, hd = a.head_dim, nkv = a.n_kv_heads;
    const int ld = hd + 1; /* padded rows: lane j reading row j hits bank (j + e) % 32 */
    const int n_ctx = a.kv.pos[t] + 1;
    const int C = a.chunk, nch = (n_ctx + C - 1) / C, fold = nch > a.n_splits;
    if (fold ? z > 0 : z >= nch) return; /* the whole block: no barrier is skipped by part */
    const int B = a.kv.block_tokens;
    const int32_t *tab = a.kv.bt + a.kv.bt_off[a.kv.tok_seq[t]];
    const KT *kv = (const KT *)a.kv.kv;
    constexpr int VE = 16 / (int)sizeof(KT); /* elements per 16-byte load */
    float *qs = att_sm;                /* [grp][hd] */
    float *ks = qs + grp * hd;         /* [ATT_TILE][ld] */
    float *vs = ks + ATT_TILE * ld;    /* [ATT_TILE][ld] */
    const float *qg = a.qkv + (size_t)t * a.ld + (size_t)g * grp * hd; /* the group's heads */
    for (int i = threadIdx.x; i < grp * hd; i += blockDim.x) qs[i] = qg[i];

    float M[HPW], L[HPW], O[HPW][NE]; /* the fold (fold mode) */
#pragma unroll
    for (int k = 0; k < HPW; k++) {
        M[k] = -INFINITY;
        L[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < NE; i++) O[k][i] = 0.0f;
    }
    for (int c = fold ? 0 : z; c < nch; c += fold ? 1 : (int)gridDim.z) {
        const int j0 = c * C, j1 = min(n_ctx, j0 + C);
        float m[HPW], l[HPW], acc[HPW][NE];
#pragma unroll
        for (int k = 0; k < HPW; k++) {
            m[k] = -INFINITY;
            l[k] = 0.0f;
#pragma unroll
            for (int i = 0; i < NE; i++) acc[k][i] = 0.0f;
        }
        for (int jt = j0; jt < j1; jt += ATT_TILE) {
            const int n = min(ATT_TILE, j1 - jt);
            __syncthreads(); /* q is stored; the previous tile is no longer read */
            if (hd % VE == 0) { /* 16-byte loads: rows start 16-byte aligned */
                const int hv = hd / VE;
                for (int i = threadIdx.x; i < n * hv; i += blockDim.x) {
                    const int kk = i / hv, e = (i - kk * hv) * VE, j = jt + kk;
                    const int32_t blk = tab[j / B];
                    const int slot = j - (j / B) * B;
                    float x[VE];
                    kv_vec(kv + kv_index(a.kv, nkv, hd, blk, 0, slot, g, e), x);
#pragma unroll
                    for (int u = 0; u < VE; u++) ks[kk * ld + e + u] = x[u];
                    kv_vec(kv + kv_index(a.kv, nkv, hd, blk, 1, slot, g, e), x);
#pragma unroll
                    for (int u = 0; u < VE; u++) vs[kk * ld + e + u] = x[u];
                }
            } else {
                for (int i = threadIdx.x; i < n * hd; i += blockDim.x) {
                    const int kk = i / hd, e = i - kk * hd, j = jt + kk;
                    const int32_t blk = tab[j / B];
                    const int slot = j - (j / B) * B;
                    ks[kk * ld + e] = kv_f(kv[kv_index(a.kv, nkv, hd, blk, 0, slot, g, e)]);
                    vs[kk * ld + e] = kv_f(kv[kv_index(a.kv, nkv, hd, blk, 1, slot, g, e)]);
                }
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < HPW; k++) {
                const int hh = w + k * nw; /* head within the group; uniform across the warp */
                if (hh >= grp) break;
                const float *q = qs + hh * hd;
                float s = -INFINITY;
                if (lane < n) {
                    const float *kr = ks + lane * ld;
                    float dot = 0.0f;
                    for (int e = 0; e < hd; e++) dot += q[e] * kr[e];
                    s = dot * a.scale;
                }
                const float mn = fmaxf(m[k], warp_max(s));
                const float corr = expf(m[k] - mn);
                const float p = lane < n ? expf(s - mn) : 0.0f;
                l[k] = l[k] * corr + warp_sum(p);
#pragma unroll
                for (int i = 0; i < NE; i++) acc[k][i] *= corr;
                for (int jj = 0; jj < n; jj++) {
                    const float pj = __shfl_sync(0xffffffffu, p, jj);
                    const float *vr = vs + jj * ld;
#pragma unroll
                    for (int i = 0; i < NE; i++) {
                        const int e = lane + 32 * i;
                        if (e < hd) acc[k][i] += pj * vr[e];
                    }
                }
                m[k] = mn;
            }
        }
#pragma unroll
        for (int k = 0; k < HPW; k++) {
            const int hh = w + k * nw;
            if (hh >= grp) break;
            if (fold) {
                float ca, cb;
                att_fold_coef(M[k], m[k], &M[k], &ca, &cb);
                L[k] = att_fold(L[k], ca, l[k], cb);
#pragma unroll
                for (int i = 0; i < NE; i++) O[k][i] = att_fold(O[k][i], ca, acc[k][i], cb);
                continue;
            }
            const int h = g * grp + hh;
            float *out = a.part + (((size_t)t * a.n_heads + h) * a.n_splits + c) * (hd + 2);
#pragma unroll
            for (int i = 0; i < NE; i++) {
                const int e = lane + 32 * i;
                if (e < hd) out[e] = acc[k][i];
            }
            if (lane == 0) {
                out[hd] = m[k];
                out[hd + 1] = l[k];
            }
        }
    }
    if (!fold) return;
#pragma unroll
    for (int k = 0; k < HPW; k++) {
        const int hh = w + k * nw;
        if (hh >= grp) break;
        const float inv = __fdiv_rn(1.0f, L[k]);
        const size_t base = ((size_t)t * a.n_heads + g * grp + hh) * hd;
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = lane + 32 * i;
            if (e < hd) st_elem(a.out_type, a.out, base + e, __fmul_rn(O[k][i], inv));
        }
    }
}

/* Block (t, h): the left fold (att_fold, in chunk order) of token t's chunk partials 0 ..
 * ceil(n_ctx / chunk) - 1, normalised: the same arithmetic as a fold-mode block's, so a token's
 * output is the same bits whichever computed it. Returns at once for a token whose blocks
 * folded (cuk_attention: more chunks than n_splits; cuk_attention_tc: the step's mode). */
static __global__ void k_attn_fold_merge(cuk_attn_args_t a)
{
    const int t = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
    const int n_ctx = a.kv.pos[t] + 1, ns = (n_ctx + a.chunk - 1) / a.chunk;
    if (a.tiles ? a.tiles[1] != 0 : ns > a.n_splits) return;
    const float *base = a.part + ((size_t)t * a.n_heads + h) * a.n_splits * (hd + 2);
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int s = 0; s < ns; s++) {
            const float *p = base + (size_t)s * (hd + 2);
            float ca, cb;
            att_fold_coef(M, p[hd], &M, &ca, &cb);
            L = att_fold(L, ca, p[hd + 1], cb);
            O = att_fold(O, ca, p[e], cb);
        }
        st_elem(a.out_type, a.out, ((size_t)t * a.n_heads + h) * hd + e,
                __fmul_rn(O, __fdiv_rn(1.0f, L)));
    }
}

extern "C" size_t cuk_attention_smem(int n_heads, int n_kv_heads, int head_dim)
{
    const int grp = n_kv_heads > 0 ? n_heads / n_kv_heads : 0;
    return sizeof(float) * ((size_t)grp * head_dim + 2u * ATT_TILE * (head_dim + 1));
}

template <typename KT, int NE, int HPW>
static int launch_part3(const cuk_attn_args_t *a, dim3 grid, int threads, size_t smem,
                        cudaStream_t stream)
{
    if (smem > ATT_SMEM_DEFAULT) {
        int rc = (int)cudaFuncSetAttribute(k_attn_part<KT, NE, HPW>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem);
        if (rc) return rc;
    }
    CUK_LAUNCH(grid, threads, smem, stream, k_attn_part<KT, NE, HPW>)(*a);
    return launched();
}

template <typename KT, int NE>
static int launch_part2(const cuk_attn_args_t *a, dim3 grid, int threads, int hpw, size_t smem,
                        cudaStream_t stream)
{
    if (hpw <= 1) return launch_part3<KT, NE, 1>(a, grid, threads, smem, stream);
    if (hpw <= 2) return launch_part3<KT, NE, 2>(a, grid, threads, smem, stream);
    return launch_part3<KT, NE, 4>(a, grid, threads, smem, stream);
}

template <typename KT>
static int launch_part(const cuk_attn_args_t *a, dim3 grid, int threads, int hpw, size_t smem,
                       cudaStream_t stream)
{
    if (a->head_dim <= 32) return launch_part2<KT, 1>(a, grid, threads, hpw, smem, stream);
    if (a->head_dim <= 64) return launch_part2<KT, 2>(a, grid, threads, hpw, smem, stream);
    if (a->head_dim <= 128) return launch_part2<KT, 4>(a, grid, threads, hpw, smem, stream);
    return launch_part2<KT, 8>(a, grid, threads, hpw, smem, stream);
}

extern "C" int cuk_attention(const cuk_attn_args_t *a, cudaStream_t stream)
{
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
        a->head_dim > CUK_MAX_HEAD_DIM || a->n_heads / a->n_kv_heads > CUK_MAX_GROUP ||
        a->n_splits < 1 || a->chunk < 1 || a->grid_splits < 0 || a->grid_splits > a->n_splits ||
        (a->grid_splits ? a->grid_splits : a->n_splits) > 65535 || a->tiles ||
        (a->kv.kv_type != DT_F32 && a->kv.kv_type != DT_F16) || !cuk_elem_bytes(a->out_type))
        return (int)cudaErrorInvalidValue;
    if (a->T <= 0) return 0;
    const int grp = a->n_heads / a->n_kv_heads;
    int warps = grp < 4 ? 4 : grp; /* extra warps of a small group help load the tiles */
    if (warps > ATT_MAX_WARPS) warps = ATT_MAX_WARPS;
    const int hpw = (grp + warps - 1) / warps;
    const size_t smem = cuk_attention_smem(a->n_heads, a->n_kv_heads, a->head_dim);
    const int gz = a->grid_splits ? a->grid_splits : a->n_splits;
    const dim3 grid((unsigned)a->T, (unsigned)a->n_kv_heads, (unsigned)gz);
    int rc = a->kv.kv_type == DT_F32
                 ? launch_part<float>(a, grid, 32 * warps, hpw, smem, stream)
                 : launch_part<__half>(a, grid, 32 * warps, hpw, smem, stream);
    if (rc) return rc;
    const int mthreads = a->head_dim < 32 ? 32 : (a->head_dim + 31) / 32 * 32;
    CUK_LAUNCH(dim3((unsigned)a->T, (unsigned)a->n_heads), mthreads, 0, stream,
               k_attn_fold_merge)(*a);
    return launched();
}

/* ---- tensor-core paged attention (F16 KV): query tiles x key tiles through mma.sync ---- */

/* Query rows (token, head of the group) per block: 4 warps of 16 rows. */
#define TC_ROWS 64
/* Keys per shared-memory tile. */
#define TC_KEYS 32
/* 32-bit words of padding per shared row (keeps the fragment loads free of bank conflicts). */
#define TC_PADW 4

/* Two F16 (round to nearest even) in one word, lo in the low half: an mma fragment register. */
static __device__ __forceinline__ uint32_t h2_pack(float lo, float hi)
{
    const __half l = __float2half_rn(lo), h = __float2half_rn(hi);
    uint16_t ul, uh;
    memcpy(&ul, &l, 2);
    memcpy(&uh, &h, 2);
    return (uint32_t)ul | ((uint32_t)uh << 16);
}

/* Block (tile, g, z), 128 threads: the rows (t, hh) of the tile's tokens t (tiles[2 + tile] <=
 * t < tiles[3 + tile], all of one sequence) and query heads g * grp + hh of kv head g, row r =
 * (t - t0) * grp + hh, against the chunks of a.chunk keys [c * chunk, (c + 1) * chunk) of the
 * tile's context (kmax = the largest pos + 1 of its tokens). Fold mode (tiles[1] != 0; blocks
 * z > 0 return): the block folds every chunk and writes the output. Scatter mode: block z
 * computes chunks z, z + gridDim.z, ... and writes each as a partial (o, m, l) of the rows whose
 * context reaches it, at part[((t * n_heads + h) * n_splits + c)]; k_attn_fold_merge folds them.
 * Per chunk: fresh online softmax over its tiles of TC_KEYS keys in order; S = Q K^T by mma
 * (Q and K as F16, F32 accumulators), s = S * scale (F32), keys past a row's position -inf;
 * per row m, l (the unrounded p summed) and o = sum P V by mma with P rounded to F16. Keys past
 * kmax are zero in shared memory, never read from the pool. Shared memory (dynamic, words):
 * Q [TC_ROWS][QW], K [TC_KEYS][QW] as F16 pairs along the head dim, V^T [HD][VW] as pairs
 * along the keys. Warp w owns rows 16 w .. 16 w + 15; lane (g4 = lane / 4, c4 = lane % 4)
 * holds rows g4 and g4 + 8 of them (mma's fragment layout, cuda_launch.h). */
template <int D16>
static __global__ void __launch_bounds__(128) k_attn_tc(cuk_attn_args_t a)
{
    constexpr int HD = 16 * D16, NO = 2 * D16; /* head dim; 8-wide output tiles */
    constexpr int QW = HD / 2 + TC_PADW, VW = TC_KEYS / 2 + TC_PADW;
    CUK_DYN_SHARED(uint32_t, tc_sm);
    uint32_t *qs = tc_sm, *ks = qs + TC_ROWS * QW, *vt = ks + TC_KEYS * QW;
    const int tile = blockIdx.x, g = blockIdx.y, z = blockIdx.z;
    if (tile >= a.tiles[0]) return; /* whole blocks only: no barrier is skipped by part */
    const int fold = a.tiles[1];
    if (fold && z > 0) return;
    const int t0 = a.tiles[2 + tile], t1 = a.tiles[3 + tile];
    const int grp = a.n_heads / a.n_kv_heads, nkv = a.n_kv_heads;
    const int nrows = (t1 - t0) * grp;
    int kmax = 0;
    for (int t = t0; t < t1; t++) kmax = max(kmax, a.kv.pos[t] + 1);
    const int C = a.chunk, nch = (kmax + C - 1) / C;
    if (!fold && z >= nch) return;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g4 = lane >> 2, c4 = lane & 3;

    for (int i = threadIdx.x; i < TC_ROWS * (HD / 2); i += blockDim.x) {
        const int r = i / (HD / 2), e2 = i - r * (HD / 2);
        uint32_t v = 0;
        if (r < nrows) {
            const int t = t0 + r / grp, hh = r - (r / grp) * grp;
            const float *q = a.qkv + (size_t)t * a.ld + (size_t)(g * grp + hh) * HD + 2 * e2;
            v = h2_pack(q[0], q[1]);
        }
        qs[r * QW + e2] = v;
    }
    const int rw = 16 * w, rows[2] = {rw + g4, rw + g4 + 8};
    const bool live = rw < nrows; /* uniform over the warp */
    int prow[2], trow[2];
    for (int h = 0; h < 2; h++) {
        trow[h] = t0 + rows[h] / grp;
        prow[h] = rows[h] < nrows ? a.kv.pos[trow[h]] : -1; /* -1: every key masked */
    }
    const int B = a.kv.block_tokens;
    const int32_t *tab = a.kv.bt + a.kv.bt_off[a.kv.tok_seq[t0]];
    const __half *kv = (const __half *)a.kv.kv;

    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f}, O[NO][4];
#pragma unroll
    for (int d = 0; d < NO; d++) O[d][0] = O[d][1] = O[d][2] = O[d][3] = 0.0f;
    for (int c = fold ? 0 : z; c < nch; c += fold ? 1 : (int)gridDim.z) {
        const int j0 = c * C, j1 = min(kmax, j0 + C);
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[NO][4];
#pragma unroll
        for (int d = 0; d < NO; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
        for (int jt = j0; jt < j1; jt += TC_KEYS) {
            __syncthreads(); /* Q is stored; the previous tile is no longer read */
            /* K rows and V^T columns of key pairs (2 kp, 2 kp + 1), 8 head elements a thread */
            for (int i = threadIdx.x; i < (TC_KEYS / 2) * (HD / 8); i += blockDim.x) {
                const int kp = i / (HD / 8), e = (i - kp * (HD / 8)) * 8;
                uint32_t kw[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
                uint32_t vw[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
                for (int u = 0; u < 2; u++) {
                    const int j = jt + 2 * kp + u;
                    if (j >= kmax) continue;
                    const int32_t blk = tab[j / B];
                    const int slot = j - (j / B) * B;
                    const size_t ik = kv_index(a.kv, nkv, HD, blk, 0, slot, g, e);
                    const size_t iv = kv_index(a.kv, nkv, HD, blk, 1, slot, g, e);
                    const uint4 k4 = *(const uint4 *)(kv + ik), v4 = *(const uint4 *)(kv + iv);
                    memcpy(kw[u], &k4, 16);
                    memcpy(vw[u], &v4, 16);
                }
                for (int u = 0; u < 2; u++)
                    for (int x = 0; x < 4; x++) ks[(2 * kp + u) * QW + e / 2 + x] = kw[u][x];
                for (int x = 0; x < 8; x++) {
                    const int sh = (x & 1) * 16;
                    const uint32_t lo = (vw[0][x >> 1] >> sh) & 0xffffu;
                    const uint32_t hi = (vw[1][x >> 1] >> sh) & 0xffffu;
                    vt[(e + x) * VW + kp] = lo | (hi << 16);
                }
            }
            __syncthreads();
            if (!live) continue;
            float s[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D16; kk++) {
                const uint32_t af[4] = {qs[rows[0] * QW + 8 * kk + c4],
                                        qs[rows[1] * QW + 8 * kk + c4],
                                        qs[rows[0] * QW + 8 * kk + 4 + c4],
                                        qs[rows[1] * QW + 8 * kk + 4 + c4]};
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    const uint32_t bf[2] = {ks[(8 * n + g4) * QW + 8 * kk + c4],
                                            ks[(8 * n + g4) * QW + 8 * kk + 4 + c4]};
                    cuk_mma_f16_16816(s[n], af, bf);
                }
            }
            /* online softmax per row (h: rows[0], rows[1]); the 4 lanes of a quad share a row */
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = jt + 8 * n + 2 * c4 + (i & 1);
                    s[n][i] = j <= prow[i >> 1] ? __fmul_rn(s[n][i], a.scale) : -INFINITY;
                    mx[i >> 1] = fmaxf(mx[i >> 1], s[n][i]);
                }
            float ms[2], corr[2];
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                const float mn = fmaxf(m[h], mx[h]);
                ms[h] = mn == -INFINITY ? 0.0f : mn;
                corr[h] = expf(__fsub_rn(m[h], ms[h])); /* 0 while m is -inf */
                m[h] = mn;
            }
            float ps[2] = {0.0f, 0.0f};
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    s[n][i] = expf(__fsub_rn(s[n][i], ms[i >> 1])); /* p; 0 where masked */
                    ps[i >> 1] = __fadd_rn(ps[i >> 1], s[n][i]);
                }
            for (int h = 0; h < 2; h++) {
                ps[h] = __fadd_rn(ps[h], __shfl_xor_sync(0xffffffffu, ps[h], 1));
                ps[h] = __fadd_rn(ps[h], __shfl_xor_sync(0xffffffffu, ps[h], 2));
                l[h] = __fadd_rn(__fmul_rn(l[h], corr[h]), ps[h]);
            }
#pragma unroll
            for (int d = 0; d < NO; d++)
#pragma unroll
                for (int i = 0; i < 4; i++) o[d][i] = __fmul_rn(o[d][i], corr[i >> 1]);
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                const uint32_t af[4] = {h2_pack(s[2 * jj][0], s[2 * jj][1]),
                                        h2_pack(s[2 * jj][2], s[2 * jj][3]),
                                        h2_pack(s[2 * jj + 1][0], s[2 * jj + 1][1]),
                                        h2_pack(s[2 * jj + 1][2], s[2 * jj + 1][3])};
#pragma unroll
                for (int d = 0; d < NO; d++) {
                    const uint32_t bf[2] = {vt[(8 * d + g4) * VW + 8 * jj + c4],
                                            vt[(8 * d + g4) * VW + 8 * jj + 4 + c4]};
                    cuk_mma_f16_16816(o[d], af, bf);
                }
            }
        }
        if (!live) continue;
        if (fold) {
            float ca[2], cb[2];
            for (int h = 0; h < 2; h++) {
                att_fold_coef(M[h], m[h], &M[h], &ca[h], &cb[h]);
                L[h] = att_fold(L[h], ca[h], l[h], cb[h]);
            }
#pragma unroll
            for (int d = 0; d < NO; d++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    O[d][i] = att_fold(O[d][i], ca[i >> 1], o[d][i], cb[i >> 1]);
            continue;
        }
        for (int h = 0; h < 2; h++) {
            if (prow[h] < j0) continue; /* this chunk holds none of the row's keys */
            const int hh = rows[h] - (rows[h] / grp) * grp;
            float *out = a.part + (((size_t)trow[h] * a.n_heads + g * grp + hh) * a.n_splits + c) *
                                      (HD + 2);
#pragma unroll
            for (int d = 0; d < NO; d++) {
                out[8 * d + 2 * c4] = o[d][2 * h];
                out[8 * d + 2 * c4 + 1] = o[d][2 * h + 1];
            }
            if (c4 == 0) {
                out[HD] = m[h];
                out[HD + 1] = l[h];
            }
        }
    }
    if (!fold || !live) return;
    for (int h = 0; h < 2; h++) {
        if (prow[h] < 0) continue;
        const int hh = rows[h] - (rows[h] / grp) * grp;
        const float inv = __fdiv_rn(1.0f, L[h]);
        const size_t base = ((size_t)trow[h] * a.n_heads + g * grp + hh) * HD;
#pragma unroll
        for (int d = 0; d < NO; d++) {
            st_elem(a.out_type, a.out, base + 8 * d + 2 * c4, __fmul_rn(O[d][2 * h], inv));
            st_elem(a.out_type, a.out, base + 8 * d + 2 * c4 + 1, __fmul_rn(O[d][2 * h + 1], inv));
        }
    }
}

extern "C" int cuk_attention_tc_tiles(const int32_t *tok_seq, int T, int tile_tokens, int fold,
                                      int32_t *tiles)
{
    if (T < 1 || tile_tokens < 1) return -1;
    int nt = 0;
    for (int t = 0; t < T; t++)
        if (t == 0 || tok_seq[t] != tok_seq[t - 1] || t - tiles[2 + nt - 1] >= tile_tokens)
            tiles[2 + nt++] = t;
    tiles[0] = nt;
    tiles[1] = fold ? 1 : 0;
    tiles[2 + nt] = T;
    return nt;
}

extern "C" int cuk_attention_tc_supported(int n_heads, int n_kv_heads, int head_dim, int kv_type)
{
    return kv_type == DT_F16 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
           n_heads / n_kv_heads <= CUK_MAX_GROUP && head_dim > 0 && head_dim % 16 == 0 &&
           head_dim <= CUK_TC_MAX_HEAD_DIM;
}

extern "C" int cuk_attention_tc_tile_tokens(int n_heads, int n_kv_heads)
{
    return n_kv_heads > 0 && n_heads >= n_kv_heads ? TC_ROWS / (n_heads / n_kv_heads) : 0;
}

extern "C" size_t cuk_attention_tc_smem(int head_dim)
{
    return sizeof(uint32_t) * ((size_t)(TC_ROWS + TC_KEYS) * (head_dim / 2 + TC_PADW) +
                               (size_t)head_dim * (TC_KEYS / 2 + TC_PADW));
}

template <int D16> static int launch_tc(const cuk_attn_args_t *a, dim3 grid, cudaStream_t stream)
{
    CUK_LAUNCH(grid, 128, cuk_attention_tc_smem(16 * D16), stream, k_attn_tc<D16>)(*a);
    return launched();
}

extern "C" int cuk_attention_tc(const cuk_attn_args_t *a, cudaStream_t stream)
{
    if (!cuk_attention_tc_supported(a->n_heads, a->n_kv_heads, a->head_dim, a->kv.kv_type) ||
        !a->tiles || a->chunk < TC_KEYS || a->chunk % TC_KEYS || a->n_splits < 1 ||
        a->grid_splits < 0 || a->grid_splits > a->n_splits ||
        (a->grid_splits ? a->grid_splits : a->n_splits) > 65535 ||
        !cuk_elem_bytes(a->out_type))
        return (int)cudaErrorInvalidValue;
    if (a->T <= 0) return 0;
    const int gz = a->grid_splits ? a->grid_splits : a->n_splits;
    const dim3 grid((unsigned)a->T, (unsigned)a->n_kv_heads, (unsigned)gz);
    int rc;
    switch (a->head_dim / 16) {
    case 1: rc = launch_tc<1>(a, grid, stream); break;
    case 2: rc = launch_tc<2>(a, grid, stream); break;
    case 3: rc = launch_tc<3>(a, grid, stream); break;
    case 4: rc = launch_tc<4>(a, grid, stream); break;
    case 5: rc = launch_tc<5>(a, grid, stream); break;
    case 6: rc = launch_tc<6>(a, grid, stream); break;
    case 7: rc = launch_tc<7>(a, grid, stream); break;
    default: rc = launch_tc<8>(a, grid, stream); break;
    }
    if (rc) return rc;
    const int mthreads = (a->head_dim + 31) / 32 * 32;
    CUK_LAUNCH(dim3((unsigned)a->T, (unsigned)a->n_heads), mthreads, 0, stream,
               k_attn_fold_merge)(*a);
    return launched();
}

/* ---- greedy pick ---- */

static __device__ __forceinline__ void better(float &v, int &i, float v2, int i2)
{
    /* v2 wins when larger, or equal with a lower index; NaN never wins (comparisons false) */
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

static __global__ void k_argmax(const float *logits, int n_vocab, int32_t *ids)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    float v = -INFINITY;
    int idx = n_vocab; /* sentinel: loses every tie */
    for (int k = threadIdx.x; k < n_vocab; k += blockDim.x) better(v, idx, row[k], k);
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        better(v, idx, v2, i2);
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) {
        sv[w] = v;
        si[w] = idx;
    }
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
        idx = lane < (int)(blockDim.x >> 5) ? si[lane] : n_vocab;
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, v, o);
            int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
            better(v, idx, v2, i2);
        }
        /* every logit NaN or -inf: id 0, as a host scan starting at 0 keeps */
        if (lane == 0) ids[blockIdx.x] = idx < n_vocab ? idx : 0;
    }
}

/* ---- FP8 (E4M3) ---- */

/* x -> E4M3 byte: round to nearest even, finite values beyond 448 saturate, NaN -> 0x7f. */
static __device__ __forceinline__ uint8_t e4m3_encode(float x)
{
    const uint32_t u = __float_as_uint(x);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const float a = fabsf(x);
    if (a != a) return (uint8_t)(sign | 0x7f);
    if (a > CUK_FP8_MAX) return (uint8_t)(sign | 0x7e);
    if (a < 0.015625f) { /* below 2^-6: subnormal steps of 2^-9 (8 steps = the least normal) */
        const float q = rintf(a * 512.0f); /* exact scaling, then round half to even */
        return (uint8_t)(sign | (uint32_t)q);
    }
    const uint32_t ua = __float_as_uint(a);
    int e = (int)(ua >> 23) - 127; /* -6 .. 8 */
    uint32_t m = (ua & 0x7fffffu) >> 20, rem = ua & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (m & 1u))) m++;
    if (m == 8u) {
        m = 0;
        e++;
    }
    if (e > 8 || (e == 8 && m == 7u)) return (uint8_t)(sign | 0x7e); /* 448 < a rounded up */
    return (uint8_t)(sign | ((uint32_t)(e + 7) << 3) | m);
}

static __device__ float block_max(float v)
{
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_max(v);
}

static __global__ void k_quant_fp8_rows(int st, const void *src, int cols, uint8_t *q,
                                        float *scale)
{
    const size_t r = blockIdx.x, base = r * (size_t)cols;
    float amax = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        amax = fmaxf(amax, fabsf(ld_elem(st, src, base + i))); /* NaN: ignored here, encoded
                                                                 as NaN below */
    }
    amax = block_max(amax);
    const float s = amax > 0.0f ? amax / CUK_FP8_MAX : 1.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        q[base + i] = e4m3_encode(ld_elem(st, src, base + i) / s);
    if (threadIdx.x == 0) scale[r] = s;
}

extern "C" int cuk_quant_fp8_rows(int src_type, const void *d_src, int rows, int cols,
                                  uint8_t *d_q, float *d_scale, cudaStream_t stream)
{
    if (!cuk_elem_bytes(src_type) || cols < 1) return (int)cudaErrorInvalidValue;
    if (rows <= 0) return 0;
    CUK_LAUNCH(rows, CUK_THREADS, 0, stream, k_quant_fp8_rows)(src_type, d_src, cols, d_q,
                                                              d_scale);
    return launched();
}

static __global__ void k_fp8_epilogue(const float *acc, int lda, const float *sx,
                                      const float *sw, int T, int N, float beta, float *y,
                                      int ldy)
{
    const size_t n = (size_t)T * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(i / (size_t)N), o = (int)(i % (size_t)N);
        const float v = __fmul_rn(__fmul_rn(acc[(size_t)t * lda + o], sx[t]), sw[o]);
        float *yp = y + (size_t)t * ldy + o;
        *yp = beta != 0.0f ? __fadd_rn(*yp, v) : v;
    }
}

extern "C" int cuk_fp8_epilogue(const float *d_acc, int lda, const float *d_sx,
                                const float *d_sw, int T, int N, float beta, float *d_y, int ldy,
                                cudaStream_t stream)
{
    if (N < 1 || lda < N || ldy < N) return (int)cudaErrorInvalidValue;
    if (T <= 0) return 0;
    CUK_LAUNCH(grid_for((size_t)T * N), CUK_THREADS, 0, stream, k_fp8_epilogue)(
        d_acc, lda, d_sx, d_sw, T, N, beta, d_y, ldy);
    return launched();
}

extern "C" int cuk_argmax(const float *d_logits, int T, int n_vocab, int32_t *d_ids,
                          cudaStream_t stream)
{
    if (n_vocab < 1) return (int)cudaErrorInvalidValue;
    if (T <= 0) return 0;
    CUK_LAUNCH(T, 1024, 0, stream, k_argmax)(d_logits, n_vocab, d_ids);
    return launched();
}
