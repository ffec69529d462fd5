/* engine/cuda/cuda_sample.cu: sampling on the device (contract: cuda_sample.h).
 *
 * One thread block of SMP_THREADS per row. The block walks the row's logits (read only, in
 * global memory) once per step below; every step is a pass over the vocabulary or a part of
 * one, nothing is sorted. Same steps, in the same order, as sampler_sample (engine/sampler.c):
 *  1. Sanitised logits, applied at every read: NaN -> -inf, +inf -> FLT_MAX, -0 -> +0.
 *     Pass A: the raw max, and the penalised max with its lowest id (the greedy pick).
 *  2. Logprobs (n_logprobs > 0): log-sum-exp of the raw logits, and the n_logprobs best
 *     (logit desc, id asc) by a radix select over order-preserving keys, then a sort of those.
 *  3. Penalties, at every read of a logit whose window count c > 0: / or * repeat_penalty, then
 *     - (c * frequency + presence), in F32 with the host's rounding (explicit _rn operations).
 *  4. Greedy (temperature <= 0, 1/T overflowing, or every logit -inf): the lowest id of the max.
 *  5. top-k: radix select of the k-th largest key (four 8-bit passes counting keys), then the
 *     id of the last tie taken (ties go to the lowest ids).
 *  6. Weights w = exp_neg((l - max) * inv_t), our polynomial as in sampler.c with every
 *     multiply and add rounded separately, so each weight is bit-identical to the host's.
 *     Z = their sum (double).
 *  7. min-p: kept when w >= max(min_p, FLT_MIN).
 *  8. top-p: the cut token of the order (w desc, id asc) where the running sum of kept weights
 *     reaches top_p * Z: a radix select over the weights' bits whose bins hold exact 128-bit
 *     fixed-point sums (units of 2^-64, integer atomics: the sums do not depend on the order
 *     of the additions), then ties of the cut weight taken in id order as the host pops them.
 *  9. The draw: r = u * (kept mass), u = (rand >> 11) 2^-53; the first kept id whose running
 *     sum exceeds r (per-warp segment sums, then the crossing warp scans its tiles in order).
 * Sums are in double with a fixed reduction tree, so a row's result depends only on its own
 * inputs. They differ from the host's summation order by rounding (~1e-16 relative): a draw or
 * a top-p cut can differ from the host's only when r or top_p * Z falls that close to a boundary.
 *
 * Shared memory: one smp_shared per block (~7 KiB). Block helpers are called by every thread
 * of the block (uniform control flow); each starts with __syncthreads() before it writes the
 * shared scratch and ends with one after, and its result is read into registers at once. */
#include "engine/cuda/cuda_sample.h"
#include "engine/cuda/cuda_launch.h"

#include <float.h>
#include <limits.h>
#include <math.h>

#define SMP_THREADS 512
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_BINS 256
#define FULL_MASK 0xffffffffu
#define NO_BIN 0xffffffffu

struct smp_shared {
    uint32_t cnt[SMP_BINS];                 /* radix pass: elements per bin */
    unsigned long long shi[SMP_BINS];       /* top-p pass: fixed-point weight sum per bin */
    unsigned long long slo[SMP_BINS];
    float wf[SMP_WARPS];                    /* per-warp partials of the block reductions */
    int wi[SMP_WARPS];
    double wd[SMP_WARPS];
    uint32_t wu[SMP_WARPS];
    uint32_t bu[2];                         /* one thread's results, broadcast */
    int bi;
    double bd;
    unsigned long long bhi, blo;
    int top_n;                              /* logprob candidates gathered */
    float top_v[CUK_SAMPLE_MAX_LOGPROBS];
    int top_i[CUK_SAMPLE_MAX_LOGPROBS];
};

/* ---- host-identical scalar steps ---- */

static __device__ __forceinline__ float san(float v)
{
    if (isnan(v)) return -INFINITY;
    if (v > FLT_MAX) return FLT_MAX;
    if (v == 0.0f) return 0.0f;
    return v;
}

static __device__ __forceinline__ float penalize(float v, int32_t c, float rp, float pp, float fp)
{
    v = v > 0.0f ? __fdiv_rn(v, rp) : __fmul_rn(v, rp);
    v = __fsub_rn(v, __fadd_rn(__fmul_rn((float)c, fp), __fmul_rn((float)(c > 0), pp)));
    return san(v);
}

/* sampler.c's exp_neg, operation by operation (no contraction into FMAs). */
static __device__ __forceinline__ float exp_neg(float x)
{
    const float t = __fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f);
    const float nf = __fsub_rn(t, 12582912.0f);
    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(nf, 0.693145751953125f)),
                              __fmul_rn(nf, 1.428606765330187045e-06f));
    float q = 1.0f / 5040.0f;
    q = __fadd_rn(__fmul_rn(q, r), 1.0f / 720.0f);
    q = __fadd_rn(__fmul_rn(q, r), 1.0f / 120.0f);
    q = __fadd_rn(__fmul_rn(q, r), 1.0f / 24.0f);
    q = __fadd_rn(__fmul_rn(q, r), 1.0f / 6.0f);
    q = __fadd_rn(__fmul_rn(q, r), 0.5f);
    q = __fadd_rn(__fmul_rn(q, r), 1.0f);
    q = __fadd_rn(__fmul_rn(q, r), 1.0f);
    const uint32_t scale = (__float_as_uint(t) - 0x4B400000u + 127u) << 23;
    const uint32_t keep = 0u - (uint32_t)(x >= -86.0f);
    return __uint_as_float(__float_as_uint(__fmul_rn(q, __uint_as_float(scale))) & keep);
}

static __device__ __forceinline__ float weight(float l, float mx, float inv_t)
{
    return exp_neg(__fmul_rn(__fsub_rn(l, mx), inv_t));
}

/* Order-preserving key of a non-NaN float (sampler.c's float_key). */
static __device__ __forceinline__ uint32_t fkey(float f)
{
    const uint32_t b = __float_as_uint(f);
    return b ^ ((0u - (b >> 31)) | 0x80000000u);
}

static __device__ __forceinline__ void better(float &v, int &i, float v2, int i2)
{
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

static __device__ __forceinline__ bool ranks_before(float av, int ai, float bv, int bi)
{
    return av > bv || (av == bv && ai < bi);
}

/* ---- 128-bit fixed point (units of 2^-64) ---- */

struct u128 {
    unsigned long long hi, lo;
};

static __device__ __forceinline__ u128 u_add(u128 a, u128 b)
{
    u128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ull : 0ull);
    return r;
}

static __device__ __forceinline__ u128 u_sub(u128 a, u128 b) /* a >= b */
{
    u128 r;
    r.lo = a.lo - b.lo;
    r.hi = a.hi - b.hi - (a.lo < b.lo ? 1ull : 0ull);
    return r;
}

static __device__ __forceinline__ bool u_ge(u128 a, u128 b)
{
    return a.hi > b.hi || (a.hi == b.hi && a.lo >= b.lo);
}

static __device__ __forceinline__ double u_to_d(u128 a)
{
    return (double)a.hi + (double)a.lo * 0x1p-64;
}

/* A weight in (0, 1]: exact for w >= 2^-40, else truncated by less than 2^-64. */
static __device__ __forceinline__ u128 u_of_w(float w)
{
    u128 r;
    if (w >= 1.0f) {
        r.hi = 1;
        r.lo = 0;
    } else {
        r.hi = 0;
        r.lo = __double2ull_rz((double)w * 0x1p64);
    }
    return r;
}

static __device__ __forceinline__ u128 u_of_d(double t) /* t >= 0 */
{
    const double h = floor(t);
    u128 r;
    r.hi = (unsigned long long)h;
    r.lo = __double2ull_rz((t - h) * 0x1p64);
    return r;
}

static __device__ __forceinline__ u128 u_shfl_down(u128 a, int o)
{
    u128 r;
    r.hi = __shfl_down_sync(FULL_MASK, a.hi, o);
    r.lo = __shfl_down_sync(FULL_MASK, a.lo, o);
    return r;
}

/* ---- block helpers (every thread calls; see the header comment) ---- */

static __device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ uint32_t warp_sum_u(uint32_t v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ double block_sum_d(double v, smp_shared &sm)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum_d(v); /* the xor tree leaves the same value in every lane */
    __syncthreads();
    if (lane == 0) sm.wd[w] = v;
    __syncthreads();
    double s = 0.0;
    for (int k = 0; k < SMP_WARPS; k++) s += sm.wd[k];
    return s;
}

static __device__ float block_max_f(float v, smp_shared &sm)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    __syncthreads();
    if (lane == 0) sm.wf[w] = v;
    __syncthreads();
    float m = sm.wf[0];
    for (int k = 1; k < SMP_WARPS; k++) m = fmaxf(m, sm.wf[k]);
    return m;
}

/* (max, lowest index of the max) over the block. */
static __device__ void block_best(float &v, int &i, smp_shared &sm)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(FULL_MASK, v, o);
        const int i2 = __shfl_xor_sync(FULL_MASK, i, o);
        better(v, i, v2, i2);
    }
    __syncthreads();
    if (lane == 0) {
        sm.wf[w] = v;
        sm.wi[w] = i;
    }
    __syncthreads();
    v = sm.wf[0];
    i = sm.wi[0];
    for (int k = 1; k < SMP_WARPS; k++) better(v, i, sm.wf[k], sm.wi[k]);
}

/* Warp w covers ids [w * seg, min(n, (w + 1) * seg)); seg is a multiple of 32. */
static __device__ __forceinline__ int seg_len(int n)
{
    return ((n + SMP_WARPS - 1) / SMP_WARPS + 31) / 32 * 32;
}

/* The id of the m-th (1-based) i in id order with pred(i), or -1 if fewer than m. */
template <class P>
static __device__ int nth_match(P pred, int n, int m, smp_shared &sm)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int seg = seg_len(n), s0 = w * seg, s1 = min(n, s0 + seg);
    uint32_t c = 0;
    for (int i = s0 + lane; i < s1; i += 32) c += pred(i) ? 1u : 0u;
    c = warp_sum_u(c);
    __syncthreads();
    if (lane == 0) sm.wu[w] = c;
    if (threadIdx.x == 0) sm.bi = -1;
    __syncthreads();
    int W = -1;
    uint32_t before = 0;
    for (int k = 0; k < SMP_WARPS && m > 0; k++) {
        if (before + sm.wu[k] >= (uint32_t)m) {
            W = k;
            break;
        }
        before += sm.wu[k];
    }
    if (w == W) { /* uniform in the warp: s0, s1 and need are the same in every lane */
        uint32_t need = (uint32_t)m - before;
        for (int base = s0; base < s1; base += 32) {
            const int i = base + lane;
            const bool p = i < s1 && pred(i);
            const unsigned bal = __ballot_sync(FULL_MASK, p);
            const uint32_t pc = (uint32_t)__popc(bal);
            if (need <= pc) {
                const uint32_t upto = (uint32_t)__popc(bal & ((2u << lane) - 1u)); /* lanes <= me */
                if (p && upto == need) sm.bi = i;
                break;
            }
            need -= pc;
        }
    }
    __syncthreads();
    return sm.bi;
}

/* Radix select over the keys key(i), i < n: the k-th largest (1 <= k <= n) into *kth and how
 * many keys are strictly larger into *above. Four passes of 8 bits, counts in shared memory;
 * warp 0 finds the bin where the count from the top reaches the rank. */
template <class K>
static __device__ void radix_select(K key, int n, int k, uint32_t *kth, int *above,
                                    smp_shared &sm)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint32_t prefix = 0, pmask = 0;
    uint32_t rank = (uint32_t)k, abv = 0;
    for (int pass = 0; pass < 4; pass++) {
        const int sh = 24 - 8 * pass;
        __syncthreads(); /* the previous pass's readers of cnt and bu are done */
        for (int b = threadIdx.x; b < SMP_BINS; b += SMP_THREADS) sm.cnt[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += SMP_THREADS) {
            const uint32_t kk = key(i);
            if ((kk & pmask) == prefix) atomicAdd(&sm.cnt[(kk >> sh) & 255u], 1u);
        }
        __syncthreads();
        if (w == 0) {
            uint32_t own = 0;
            for (int j = 0; j < 8; j++) own += sm.cnt[lane * 8 + j];
            uint32_t incl = own; /* sum over lanes >= lane (bins from lane * 8 up) */
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t t = __shfl_down_sync(FULL_MASK, incl, o);
                if (lane + o < 32) incl += t;
            }
            const uint32_t abl = incl - own;
            const bool hit = abl < rank && rank <= incl;
            const unsigned bal = __ballot_sync(FULL_MASK, hit);
            if (bal == 0 && lane == 0) { /* cannot happen while 1 <= rank <= matching keys */
                sm.bu[0] = 0;
                sm.bu[1] = 0;
            }
            if (bal != 0 && lane == __ffs(bal) - 1) {
                uint32_t acc = abl;
                int b = lane * 8 + 7;
                while (b > lane * 8 && acc + sm.cnt[b] < rank) acc += sm.cnt[b--];
                sm.bu[0] = (uint32_t)b;
                sm.bu[1] = acc;
            }
        }
        __syncthreads();
        const uint32_t b = sm.bu[0], acc = sm.bu[1];
        rank -= acc;
        abv += acc;
        prefix |= b << sh;
        pmask |= 255u << sh;
    }
    *kth = prefix;
    *above = (int)abv;
}

/* top-p (step 8): over the weights wt(i) of kept tokens (w >= wmin), the smallest weight cw such
 * that the kept mass of weights >= cw reaches target, with the exact fixed-point mass of weights
 * > cw in *above_mass and the count of weights == cw in *n_ties. 0 when the kept mass never
 * reaches target (no cut), else 1. */
template <class Wt>
static __device__ int topp_cut_weight(Wt wt, int n, float wmin, double target, float *cw,
                                      u128 *above_mass, uint32_t *n_ties, smp_shared &sm)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const u128 T = u_of_d(target);
    u128 cum = {0, 0};
    uint32_t prefix = 0, pmask = 0, ties = 0;
    for (int pass = 0; pass < 4; pass++) {
        const int sh = 24 - 8 * pass;
        __syncthreads();
        for (int b = threadIdx.x; b < SMP_BINS; b += SMP_THREADS) {
            sm.cnt[b] = 0;
            sm.shi[b] = 0;
            sm.slo[b] = 0;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += SMP_THREADS) {
            const float x = wt(i);
            if (!(x >= wmin)) continue;
            const uint32_t kk = __float_as_uint(x);
            if ((kk & pmask) != prefix) continue;
            const uint32_t b = (kk >> sh) & 255u;
            const u128 f = u_of_w(x);
            atomicAdd(&sm.cnt[b], 1u);
            if (f.hi) atomicAdd(&sm.shi[b], f.hi);
            const unsigned long long old = atomicAdd(&sm.slo[b], f.lo);
            if (old + f.lo < old) atomicAdd(&sm.shi[b], 1ull); /* carry out of the low word */
        }
        __syncthreads();
        if (w == 0) {
            u128 own = {0, 0};
            for (int j = 0; j < 8; j++) {
                const u128 s = {sm.shi[lane * 8 + j], sm.slo[lane * 8 + j]};
                own = u_add(own, s);
            }
            u128 incl = own;
            for (int o = 1; o < 32; o <<= 1) {
                const u128 t = u_shfl_down(incl, o);
                if (lane + o < 32) incl = u_add(incl, t);
            }
            const u128 base = u_add(cum, u_sub(incl, own)); /* mass of the bins above mine */
            const bool hit = !u_ge(base, T) && u_ge(u_add(cum, incl), T);
            const unsigned bal = __ballot_sync(FULL_MASK, hit);
            if (bal == 0 && lane == 0) sm.bu[0] = NO_BIN; /* pass 0 only: mass below target */
            if (bal != 0 && lane == __ffs(bal) - 1) {
                u128 acc = base;
                int b = lane * 8 + 7;
                for (;;) {
                    const u128 s = {sm.shi[b], sm.slo[b]};
                    if (b == lane * 8 || u_ge(u_add(acc, s), T)) break;
                    acc = u_add(acc, s);
                    b--;
                }
                sm.bu[0] = (uint32_t)b;
                sm.bu[1] = sm.cnt[b];
                sm.bhi = acc.hi;
                sm.blo = acc.lo;
            }
        }
        __syncthreads();
        if (sm.bu[0] == NO_BIN) return 0; /* uniform: every thread read the same value */
        prefix |= sm.bu[0] << sh;
        pmask |= 255u << sh;
        ties = sm.bu[1];
        cum.hi = sm.bhi;
        cum.lo = sm.blo;
    }
    *cw = __uint_as_float(prefix);
    *above_mass = cum;
    *n_ties = ties;
    return 1;
}

/* Step 9: the first id in id order with w = kw(i) > 0 whose running sum of kw exceeds r; the last
 * id with kw > 0 when rounding leaves r past the end. */
template <class Kw>
static __device__ int draw_first(Kw kw, int n, double r, smp_shared &sm)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int seg = seg_len(n), s0 = w * seg, s1 = min(n, s0 + seg);
    double acc = 0.0;
    int last = -1;
    for (int i = s0 + lane; i < s1; i += 32) {
        const float x = kw(i);
        acc += (double)x;
        if (x > 0.0f) last = i;
    }
    acc = warp_sum_d(acc);
    for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(FULL_MASK, last, o));
    __syncthreads();
    if (lane == 0) {
        sm.wd[w] = acc;
        sm.wi[w] = last;
    }
    if (threadIdx.x == 0) sm.bi = -1;
    __syncthreads();
    int W = -1, last_all = -1;
    double before = 0.0;
    for (int k = 0; k < SMP_WARPS; k++) last_all = max(last_all, sm.wi[k]);
    for (int k = 0; k < SMP_WARPS; k++) {
        if (r < before + sm.wd[k]) {
            W = k;
            break;
        }
        before += sm.wd[k];
    }
    if (w == W) { /* uniform in the warp; past its segment only if rounding says so */
        double a = before;
        for (int base = s0; base < n; base += 32) {
            const int i = base + lane;
            const float x = i < n ? kw(i) : 0.0f;
            double inc = (double)x;
            for (int o = 1; o < 32; o <<= 1) {
                const double t = __shfl_up_sync(FULL_MASK, inc, o);
                if (lane >= o) inc += t;
            }
            const bool hit = x > 0.0f && r < a + inc;
            const unsigned bal = __ballot_sync(FULL_MASK, hit);
            if (bal) {
                if (lane == __ffs(bal) - 1) sm.bi = i;
                break;
            }
            a += __shfl_sync(FULL_MASK, inc, 31);
        }
    }
    __syncthreads();
    const int id = sm.bi;
    return id >= 0 ? id : (last_all >= 0 ? last_all : 0);
}

/* ---- the kernel: block = row ---- */

static __global__ void __launch_bounds__(SMP_THREADS)
k_sample(const float *logits, int n, const cuk_sample_row_t *rows, int32_t *counts, int R, int L,
         uint32_t *out)
{
    __shared__ smp_shared sm;
    const int row = blockIdx.x, tid = threadIdx.x;
    const cuk_sample_row_t P = rows[row];
    const float *l = logits + (size_t)row * n;
    int32_t *cnt = P.pen_slot >= 0 && counts ? counts + (size_t)P.pen_slot * n : NULL;
    const float rp = P.repeat_penalty, pp = P.presence_penalty, fp = P.frequency_penalty;
    auto pen = [&](int i) -> float {
        float v = san(l[i]);
        if (cnt) {
            const int32_t c = cnt[i];
            if (c > 0) v = penalize(v, c, rp, pp, fp);
        }
        return v;
    };

    /* Steps 1 and 3, pass A: raw max; penalised max and its lowest id. */
    float rmax = -INFINITY, pmax = -INFINITY;
    int pidx = INT_MAX;
    for (int i = tid; i < n; i += SMP_THREADS) {
        const float v = san(l[i]);
        rmax = fmaxf(rmax, v);
        float pv = v;
        if (cnt) {
            const int32_t c = cnt[i];
            if (c > 0) pv = penalize(v, c, rp, pp, fp);
        }
        better(pmax, pidx, pv, i);
    }
    rmax = block_max_f(rmax, sm);
    block_best(pmax, pidx, sm);

    /* Step 2: raw logprobs. */
    const int nl = min(P.n_logprobs, L);
    double lse = 0.0;
    int n_top = 0;
    if (nl > 0 && rmax > -INFINITY) {
        double s = 0.0;
        for (int i = tid; i < n; i += SMP_THREADS) s += (double)exp_neg(__fsub_rn(san(l[i]), rmax));
        s = block_sum_d(s, sm);
        lse = (double)rmax + log(s);
        const int k = min(nl, n);
        auto rkey = [&](int i) -> uint32_t { return fkey(san(l[i])); };
        uint32_t kth;
        int above;
        radix_select(rkey, n, k, &kth, &above, sm);
        const int tcut = nth_match([&](int i) { return rkey(i) == kth; }, n, k - above, sm);
        __syncthreads();
        if (tid == 0) sm.top_n = 0;
        __syncthreads();
        for (int i = tid; i < n; i += SMP_THREADS) {
            const uint32_t kk = rkey(i);
            if (kk > kth || (kk == kth && i <= tcut)) {
                const int at = atomicAdd(&sm.top_n, 1);
                if (at < CUK_SAMPLE_MAX_LOGPROBS) {
                    sm.top_v[at] = san(l[i]);
                    sm.top_i[at] = i;
                }
            }
        }
        __syncthreads();
        n_top = min(sm.top_n, CUK_SAMPLE_MAX_LOGPROBS);
        if (tid == 0) /* insertion sort, best first (at most 20) */
            for (int a = 1; a < n_top; a++) {
                const float tv = sm.top_v[a];
                const int ti = sm.top_i[a];
                int j = a;
                while (j > 0 && ranks_before(tv, ti, sm.top_v[j - 1], sm.top_i[j - 1])) {
                    sm.top_v[j] = sm.top_v[j - 1];
                    sm.top_i[j] = sm.top_i[j - 1];
                    j--;
                }
                sm.top_v[j] = tv;
                sm.top_i[j] = ti;
            }
    }

    /* Step 4: greedy, and the stochastic limits that reduce to it. */
    int id = pidx < n ? pidx : 0;
    const float mx = pmax;
    if (P.temperature > 0.0f && P.inv_t <= FLT_MAX && mx > -INFINITY) {
        const double u = (double)(P.rand >> 11) * 0x1p-53;
        const float inv_t = P.inv_t;
        const bool use_k = P.top_k > 0 && P.top_k < n;
        /* Step 5: top-k membership = key > kth, or key == kth and id <= tcut. */
        uint32_t kth = 0;
        int tcut = INT_MAX;
        if (use_k) {
            auto pkey = [&](int i) -> uint32_t { return fkey(pen(i)); };
            int above;
            radix_select(pkey, n, P.top_k, &kth, &above, sm);
            tcut = nth_match([&](int i) { return pkey(i) == kth; }, n, P.top_k - above, sm);
        }
        auto wt = [&](int i) -> float { /* step 6: 0 outside the top-k */
            const float v = pen(i);
            const uint32_t kk = fkey(v);
            if (use_k && !(kk > kth || (kk == kth && i <= tcut))) return 0.0f;
            return weight(v, mx, inv_t);
        };
        /* Steps 6-7: Z over the candidates, and the kept mass. */
        const float wmin = P.min_p > FLT_MIN ? P.min_p : FLT_MIN;
        double z = 0.0, zk = 0.0;
        for (int i = tid; i < n; i += SMP_THREADS) {
            const float x = wt(i);
            z += (double)x;
            if (x >= wmin) zk += (double)x;
        }
        z = block_sum_d(z, sm);
        zk = block_sum_d(zk, sm);
        /* Step 8: kept = w >= wmin and (w > cw, or w == cw and id <= cid); no cut: cw = 0. */
        float cw = 0.0f;
        int cid = -1;
        double tot = zk;
        if (P.top_p < 1.0f) {
            const double target = (double)P.top_p * z;
            u128 amass;
            uint32_t ties;
            if (topp_cut_weight(wt, n, wmin, target, &cw, &amass, &ties, sm)) {
                __syncthreads();
                if (tid == 0) { /* ties of cw join in id order until the mass reaches target */
                    double c = u_to_d(amass);
                    uint32_t m = 0;
                    do {
                        c += (double)cw;
                        m++;
                    } while (c < target && m < ties);
                    sm.bd = c;
                    sm.bu[0] = m;
                }
                __syncthreads();
                tot = sm.bd;
                const int m = (int)sm.bu[0];
                const float cwv = cw;
                cid = nth_match([&](int i) { return wt(i) == cwv; }, n, m, sm);
            }
        }
        /* Step 9: the draw. */
        const float cwv = cw;
        const int cidv = cid;
        auto kw = [&](int i) -> float {
            const float x = wt(i);
            return x >= wmin && (x > cwv || (x == cwv && i <= cidv)) ? x : 0.0f;
        };
        id = draw_first(kw, n, u * tot, sm);
    }

    __syncthreads(); /* every read of cnt and of the shared top list is done */
    if (tid == 0) {
        out[row] = (uint32_t)id;
        if (nl > 0) {
            const float chosen = rmax > -INFINITY ? (float)((double)san(l[id]) - lse) : -INFINITY;
            out[R + row] = __float_as_uint(chosen);
            uint32_t *top = out + 2 * (size_t)R + 2 * (size_t)L * row;
            for (int j = 0; j < nl; j++) {
                int tid_j;
                float tlp;
                if (rmax == -INFINITY) { /* every logit -inf: ids in order */
                    tid_j = j < n ? j : -1;
                    tlp = -INFINITY;
                } else if (j < n_top) {
                    tid_j = sm.top_i[j];
                    tlp = (float)((double)sm.top_v[j] - lse);
                } else {
                    tid_j = -1;
                    tlp = -INFINITY;
                }
                top[2 * j] = (uint32_t)tid_j;
                top[2 * j + 1] = __float_as_uint(tlp);
            }
        }
        if (cnt) {
            if (P.pen_evict >= 0 && P.pen_evict < n) cnt[P.pen_evict]--;
            cnt[id]++;
        }
    }
}

extern "C" int cuk_sample(const float *d_logits, int R, int n_vocab, const cuk_sample_row_t *d_rows,
                          int32_t *d_counts, int L, uint32_t *d_out, cudaStream_t stream)
{
    if (n_vocab < 1 || R < 0 || L < 0 || L > CUK_SAMPLE_MAX_LOGPROBS)
        return (int)cudaErrorInvalidValue;
    if (R == 0) return 0;
    CUK_LAUNCH(R, SMP_THREADS, 0, stream, k_sample)(d_logits, n_vocab, d_rows, d_counts, R, L,
                                                    d_out);
    return (int)cudaGetLastError();
}
