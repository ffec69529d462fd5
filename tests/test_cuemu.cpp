/* tests/test_cuemu.cpp: the CUDA kernels of engine/cuda, compiled from their real sources for
 * the CPU emulation of tests/support/cuemu.h (no nvcc, no GPU), against the CPU backend:
 *  - cuk_qkv_rope_store + cuk_attention (GQA blocks, split-K and the merge) against the CPU
 *    backend's attention (engine/cpu/attention.h, the scalar kernel) over a paged pool with
 *    shuffled block tables: block sizes 8, 16 and 64, query heads per kv head 1, 4 and 8, head
 *    dims 64, 96 and 128, F32 and F16 KV; also head dim 36 (F16 rows not a multiple of 16
 *    bytes: the scalar loads) and 32 query heads of head dim 256 (opted-in shared memory);
 *    contexts of 1 to 300 keys that cross the 32-key tiles, the split chunks and the KV blocks;
 *    scratch for 1, 3 and 32 chunk partials a token (folded in one block and scattered alike
 *    must give the same bits); outputs and scratch poisoned (NaN) first; a token's output alone
 *    and in its batch must be bit-identical;
 *  - cuk_attention_tc (the tensor-core kernel, mma.sync emulated as cuemu.h says) on the F16 KV
 *    cases: against the CPU backend within F16 rounding, and bit for bit against itself in fold
 *    and scatter modes, tiles of every size, fewer blocks than chunks and each token alone;
 *  - cuk_sample against sampler_sample: tests/support/sample_check.h, which tests/test_cuda.c
 *    runs on a device.
 * What this proves and what it does not: cuemu.h (indexing, synchronisation, arithmetic logic
 * yes; warp timing, the device memory model, speed no). tests/test_cuda.c runs the same kernels
 * on a device. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <vector>

#include "support/cuemu.h"

extern "C" {
#include "engine/cpu/attention.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "engine/sampler.h"
}
#include "engine/cuda/cuda_kernels.h"
#include "support/sample_check.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- attention ---- */

struct attn_case {
    int B, grp, hd, kv_type;
};

/* The tensor-core kernel (cuk_attention_tc) on test_attention's batch: against the CPU
 * backend within the F16 rounding of q and the probabilities; then bit for bit against itself
 * with the work cut differently: fold and scatter modes, every tile size, fewer scatter blocks
 * than chunks, each token alone; and chunks of 32 keys, fold against scatter. */
static std::vector<int32_t> tc_tiles(const std::vector<int32_t> &seq, int T, int tq, int mode)
{
    std::vector<int32_t> tl((size_t)T + 3, -7);
    const int nt = cuk_attention_tc_tiles(seq.data(), T, tq, mode, tl.data());
    /* the contract, checked on every call: tiles cover 0..T in order, each non-empty, of one
     * sequence, at most tq tokens, and a new tile only where one must start */
    CHECKF(nt >= 1 && tl[0] == nt && tl[1] == mode && tl[2] == 0 && tl[2 + nt] == T,
           "tc tiles: header");
    for (int i = 0; i < nt; i++) {
        const int a = tl[2 + i], b = tl[3 + i];
        CHECKF(a < b && b - a <= tq, "tc tiles: tile %d [%d, %d) of at most %d", i, a, b, tq);
        for (int t = a + 1; t < b; t++) CHECKF(seq[t] == seq[a], "tc tiles: tile %d mixes", i);
        if (i > 0) CHECKF(seq[a] != seq[a - 1] || a - tl[1 + i] == tq, "tc tiles: tile %d "
                          "starts early", i);
    }
    tl.resize((size_t)nt + 3);
    return tl;
}

static void test_attention_tc(const attn_case &c, int T, const std::vector<int32_t> &pos,
                              const std::vector<int32_t> &seq, const cuk_paged_t &pg,
                              std::vector<float> &qkv, int qkvd, const std::vector<float> &ref,
                              int *compared)
{
    const int nkv = 2, nh = nkv * c.grp, hd = c.hd, tq = cuk_attention_tc_tile_tokens(nh, nkv);
    const float scale = 1.0f / sqrtf((float)hd);
    /* one run: tiles of at most `tiles_of` tokens, mode, chunk, scratch splits and grid */
    auto run = [&](int tiles_of, int mode, int chunk, int ns, int gs, int out_type) {
        std::vector<int32_t> tl = tc_tiles(seq, T, tiles_of, mode);
        std::vector<float> part((size_t)T * nh * ns * (hd + 2), NAN);
        std::vector<float> out((size_t)T * nh * hd, NAN);
        cuk_attn_args_t a = {T, nh, nkv, hd, qkv.data(), qkvd, pg, scale, ns, chunk, gs,
                             part.data(), out_type, out.data(), tl.data()};
        CHECKF(cuk_attention_tc(&a, NULL) == 0, "tc attention launch");
        return out;
    };
    std::vector<float> base = run(tq, 1, 128, 1, 0, DT_F32);
    double worst = 0;
    for (size_t i = 0; i < base.size(); i++) {
        double d = fabs((double)base[i] - ref[i]) / (1.0 + fabs((double)ref[i]));
        if (!(d <= worst)) worst = d;
    }
    /* q and the probabilities rounded to F16 (relative 2^-11 each) */
    CHECKF(worst <= 1e-3, "tc attention B %d grp %d hd %d: worst relative error %g against the "
           "cpu backend", c.B, c.grp, hd, worst);
    *compared += (int)base.size();
    const size_t bytes = base.size() * 4;
    struct { int tiles_of, mode, chunk, ns, gs; } same[] = {
        {tq, 0, 128, 32, 0}, {1, 0, 128, 32, 2}, {1, 1, 128, 1, 0}, {2, 0, 128, 3, 1},
        {3, 1, 128, 1, 0}};
    for (auto &v : same) {
        std::vector<float> o = run(v.tiles_of, v.mode, v.chunk, v.ns, v.gs, DT_F32);
        CHECKF(memcmp(o.data(), base.data(), bytes) == 0, "tc attention B %d grp %d hd %d: "
               "tiles of %d, mode %d, splits %d, grid %d differ from the fold of tiles of %d",
               c.B, c.grp, hd, v.tiles_of, v.mode, v.ns, v.gs, tq);
    }
    std::vector<float> f32 = run(tq, 1, 32, 1, 0, DT_F32), s32 = run(1, 0, 32, 10, 3, DT_F32);
    CHECKF(memcmp(f32.data(), s32.data(), bytes) == 0, "tc attention chunks of 32: scatter "
           "differs from fold");
    for (int t = 0; t < T; t++) { /* each token alone */
        cuk_paged_t p1 = pg;
        p1.pos = &pos[t];
        p1.tok_seq = &seq[t];
        const int32_t tl[4] = {1, 1, 0, 1};
        std::vector<float> one((size_t)nh * hd, NAN), part(hd + 2, NAN);
        cuk_attn_args_t a = {1, nh, nkv, hd, qkv.data() + (size_t)t * qkvd, qkvd, p1, scale, 1,
                             128, 0, part.data(), DT_F32, one.data(), tl};
        CHECKF(cuk_attention_tc(&a, NULL) == 0, "tc attention launch");
        CHECKF(memcmp(one.data(), &base[(size_t)t * nh * hd], one.size() * 4) == 0,
               "tc attention B %d grp %d hd %d: token %d alone differs from its batch output",
               c.B, c.grp, hd, t);
    }
    std::vector<int32_t> tl = tc_tiles(seq, T, tq, 0);
    std::vector<float> part((size_t)T * nh * 32 * (hd + 2), NAN);
    std::vector<uint16_t> ob((size_t)T * nh * hd, 0xffff);
    cuk_attn_args_t ab = {T, nh, nkv, hd, qkv.data(), qkvd, pg, scale, 32, 128, 0, part.data(),
                          DT_BF16, ob.data(), tl.data()};
    CHECKF(cuk_attention_tc(&ab, NULL) == 0, "tc attention launch");
    int bad = 0;
    for (size_t i = 0; i < ob.size(); i++) bad += ob[i] != __float2bfloat16_rn(base[i]).x;
    CHECKF(bad == 0, "tc attention bf16 output: %d values differ from the f32 output rounded",
           bad);
    printf("tc attention B %d grp %d hd %d: worst relative error %.2e against the cpu backend; "
           "fold, scatter, tile sizes and tokens alone bit-identical\n", c.B, c.grp, hd, worst);
}

/* One batch: sequence s has its tokens at positions pos[...]; tables are shuffled pool blocks. */
static void test_attention(const attn_case &c, int *compared)
{
    const int nkv = 2, nh = nkv * c.grp, hd = c.hd, B = c.B, layers = 2, layer = 1;
    const size_t el = c.kv_type == DT_F32 ? 4 : 2;
    /* tokens: sequence 0 decodes at 299 (crossing every boundary), sequence 1 is a prefill
     * chunk at 30..35 (a tile edge inside), sequence 2 decodes its first token, sequence 3 at
     * 128 (just past a chunk of 128) */
    const int seq_last[4] = {299, 35, 0, 128};
    std::vector<int32_t> pos, seq;
    for (int p = 30; p <= 35; p++) pos.push_back(p), seq.push_back(1);
    pos.insert(pos.begin(), 299), seq.insert(seq.begin(), 0);
    pos.push_back(0), seq.push_back(2);
    pos.push_back(128), seq.push_back(3);
    const int T = (int)pos.size(), S = 4;
    std::vector<int32_t> bt_off(S), bt;
    int n_blocks = 0;
    for (int s = 0; s < S; s++) n_blocks += seq_last[s] / B + 1;
    const int pool_blocks = n_blocks + 3;
    std::vector<int32_t> perm(pool_blocks);
    for (int i = 0; i < pool_blocks; i++) perm[i] = i;
    for (int i = pool_blocks - 1; i > 0; i--) std::swap(perm[i], perm[(int)(urand() * (i + 1))]);
    int k = 0;
    for (int s = 0; s < S; s++) {
        bt_off[s] = (int32_t)bt.size();
        for (int b = 0; b <= seq_last[s] / B; b++) bt.push_back(perm[k++]);
    }
    const size_t block_elems = (size_t)layers * 2 * B * nkv * hd;
    const size_t pool = (size_t)pool_blocks * block_elems;
    std::vector<unsigned char> kv(pool * el);
    for (size_t i = 0; i < pool; i++) {
        float v = (float)(urand() * 2.0 - 1.0);
        if (el == 4) memcpy(&kv[i * 4], &v, 4);
        else {
            __half h = __float2half_rn(v);
            memcpy(&kv[i * 2], &h.x, 2);
        }
    }
    /* qkv rows: q, k, v of every token; the batch's own K/V go through cuk_qkv_rope_store */
    const int qkvd = (nh + 2 * nkv) * hd, half = hd / 2;
    std::vector<float> qkv((size_t)T * qkvd), cs((size_t)T * half * 2);
    for (auto &v : qkv) v = (float)(urand() * 2.0 - 1.0) * 1.5f;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double a = pos[t] * pow(10000.0, -2.0 * i / hd);
            cs[((size_t)t * half + i) * 2] = (float)cos(a);
            cs[((size_t)t * half + i) * 2 + 1] = (float)sin(a);
        }
    cuk_paged_t pg = {pos.data(), seq.data(), bt_off.data(), bt.data(), kv.data(), c.kv_type,
                      block_elems, B, layer};
    cuk_qkv_args_t qa = {T, nh, nkv, hd, hd, ROPE_NEOX, qkv.data(), qkvd, NULL, cs.data(), pg};
    CHECKF(cuk_qkv_rope_store(&qa, NULL) == 0, "qkv launch");

    /* the reference: the CPU backend's attention of each (token, head) over the same pool */
    attn_fn cpu = attn_get("c");
    std::vector<float> ref((size_t)T * nh * hd);
    const size_t row_stride = (size_t)nkv * hd * el;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const int g = h / c.grp, n_ctx = pos[t] + 1;
            const float *qp = &qkv[(size_t)t * qkvd + (size_t)h * hd];
            float *op = &ref[((size_t)t * nh + h) * hd];
            std::vector<float> scores(n_ctx), stage((size_t)hd * ((B + 15) / 16 * 16));
            attn_args_t a;
            memset(&a, 0, sizeof a);
            a.hd = hd;
            a.nq = 1;
            a.q = &qp;
            a.out = &op;
            a.qpos = &pos[t];
            a.n_ctx = n_ctx;
            a.blocks = &bt[bt_off[seq[t]]];
            a.block_tokens = B;
            a.kv = kv.data();
            a.block_bytes = block_elems * el;
            a.k_off = ((((size_t)layer * 2 + 0) * B) * nkv + g) * hd * el;
            a.v_off = ((((size_t)layer * 2 + 1) * B) * nkv + g) * hd * el;
            a.row_stride = row_stride;
            a.kv_f16 = c.kv_type == DT_F16;
            a.scale = 1.0f / sqrtf((float)hd);
            a.scores = scores.data();
            a.stage = stage.data();
            cpu(&a);
        }

    /* chunks of 128 keys with scratch for 1 partial a token (every token with more folds in one
     * block) and for 32 (scattered): the same bits; chunks of 32 with 3 (a mix) */
    const int splits[3] = {1, 3, 32};
    std::vector<float> first;
    for (int si = 0; si < 3; si++) {
        const int ns = splits[si], chunk = si == 1 ? 32 : 128;
        std::vector<float> part((size_t)T * nh * ns * (hd + 2), NAN), out((size_t)T * nh * hd, NAN);
        cuk_attn_args_t aa = {T, nh, nkv, hd, qkv.data(), qkvd, pg, 1.0f / sqrtf((float)hd), ns,
                              chunk, si == 2 ? 0 : ns, part.data(), DT_F32, out.data(), NULL};
        CHECKF(cuk_attention(&aa, NULL) == 0, "attention launch");
        double worst = 0;
        for (size_t i = 0; i < out.size(); i++) {
            double d = fabs((double)out[i] - ref[i]) / (1.0 + fabs((double)ref[i]));
            if (!(d <= worst)) worst = d; /* NaN sticks */
        }
        CHECKF(worst <= 2e-5, "attention B %d grp %d hd %d kv %s splits %d chunk %d: worst "
               "relative error %g against the cpu backend", B, c.grp, hd,
               c.kv_type == DT_F32 ? "f32" : "f16", ns, chunk, worst);
        *compared += (int)out.size();
        if (si == 0) first = out;
        if (si != 2) continue;
        CHECKF(memcmp(first.data(), out.data(), out.size() * 4) == 0, "attention B %d grp %d: "
               "chunks of 128 scattered differ from the same chunks folded", B, c.grp);
        /* batch invariance: token 0 alone gives its batch output bit for bit */
        std::vector<float> one((size_t)nh * hd, NAN);
        cuk_attn_args_t a1 = aa;
        a1.T = 1;
        a1.out = one.data();
        CHECKF(cuk_attention(&a1, NULL) == 0, "attention launch");
        CHECKF(memcmp(one.data(), out.data(), one.size() * 4) == 0,
               "attention B %d grp %d: token 0 alone differs from its batch output", B, c.grp);
        /* BF16 output: the F32 result rounded */
        std::vector<uint16_t> ob((size_t)T * nh * hd, 0xffff);
        cuk_attn_args_t ab = aa;
        ab.out_type = DT_BF16;
        ab.out = ob.data();
        CHECKF(cuk_attention(&ab, NULL) == 0, "attention launch");
        int bad = 0;
        for (size_t i = 0; i < ob.size(); i++) bad += ob[i] != __float2bfloat16_rn(out[i]).x;
        CHECKF(bad == 0, "attention bf16 output: %d of %zu values differ from the f32 output "
               "rounded", bad, ob.size());
    }
    if (cuk_attention_tc_supported(nh, nkv, hd, c.kv_type))
        test_attention_tc(c, T, pos, seq, pg, qkv, qkvd, ref, compared);
}

/* ---- the emulation's own checks: what cuemu.h says it reports, it reports ---- */

/* lanes 0..15 of warp 0 shuffle while the rest of the block ends: a deadlock */
static __global__ void k_half_warp_shuffle(float *out)
{
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffu, 1.0f, 1);
}
/* thread 0 waits at __syncthreads while the others end the block: a divergent barrier */
static __global__ void k_divergent(float *out)
{
    if (threadIdx.x == 0) __syncthreads();
    out[threadIdx.x] = 1.0f;
}
/* thread 0 writes shared memory that every thread reads with no barrier between */
static __global__ void k_missing_barrier(float *out)
{
    CUK_DYN_SHARED(float, sh);
    if (threadIdx.x == 0) sh[0] = 1.0f;
    out[threadIdx.x] = sh[0];
}

/* Runs kernel k on 2 blocks of 64 threads in a child process: true when the child aborted with
 * a message containing want on stderr. */
static bool child_reports(void (*k)(float *), const char *want)
{
    int pfd[2];
    if (pipe(pfd)) return false;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]);
        static float out[64];
        cuemu::launch_of(k, dim3(2), dim3(64), 0, nullptr)(out);
        _exit(0);
    }
    close(pfd[1]);
    char buf[4096];
    size_t n = 0;
    ssize_t r;
    while (n + 1 < sizeof buf && (r = read(pfd[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(buf, want);
}

static void test_emulation(void)
{
    CHECKF(child_reports(k_half_warp_shuffle, "cuemu: deadlock"),
           "a shuffle by half a warp is not reported as a deadlock");
    CHECKF(child_reports(k_divergent, "cuemu: divergent barrier"),
           "a __syncthreads of one thread is not reported as a divergent barrier");
    /* the block runs in descending thread order too: some thread reads before thread 0 writes
     * and sees the poison */
    std::vector<float> out(64, 0.0f);
    CUK_LAUNCH(2, 64, sizeof(float), nullptr, k_missing_barrier)(out.data());
    int poisoned = 0;
    for (float v : out) poisoned += isnan(v);
    CHECKF(poisoned > 0, "a read of shared memory before its write without a barrier saw the "
           "write in every thread");
    printf("emulation: a deadlock and a divergent barrier reported, a missing barrier exposed "
           "(%d of 64 threads read the poison)\n", poisoned);
}

/* Usage: test_cuemu [attention|sampling] [quick]: both parts by default; quick: one attention
 * case and a small vocabulary. The emulation's own checks run first, always. */
/* ---- FP8 (E4M3) quantisation and the GEMM epilogue ---- */

/* The value of E4M3 code c (NaN for 0x7f / 0xff), from the format's definition. */
static double e4m3_value(int c)
{
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e == 0 ? m / 8.0 * ldexp(1.0, -6) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return s ? -v : v;
}

/* The reference encoder, independent of the kernel's bit manipulation: the nearest of the 126
 * finite non-negative codes by value (ties to the even code), |y| > 448 to 448, NaN to 0x7f. */
static int e4m3_ref(float y)
{
    if (y != y) return (std::signbit(y) ? 0x80 : 0) | 0x7f;
    const double a = fabs((double)y);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        const double d = fabs(e4m3_value(c) - a), db = fabs(e4m3_value(best) - a);
        if (d < db || (d == db && !(c & 1))) best = c;
    }
    return (std::signbit(y) ? 0x80 : 0) | best;
}

static void test_fp8(void)
{
    /* rows: random magnitudes over many octaves; every code's value and every midpoint between
     * neighbours (ties) scaled so amax is exactly 448; zeros; a NaN; values below 2^-9 */
    const int cols = 300;
    std::vector<std::vector<float>> rows;
    for (int r = 0; r < 6; r++) {
        std::vector<float> v(cols);
        for (int i = 0; i < cols; i++)
            v[i] = (float)((urand() * 2 - 1) * ldexp(1.0, (int)(urand() * 24) - 12 + r));
        rows.push_back(v);
    }
    std::vector<float> codes(cols, 0.0f);
    int k = 0;
    for (int c = 0; c <= 0x7e && k + 2 < cols; c++) {
        codes[k++] = (float)e4m3_value(c);
        if (c < 0x7e) codes[k++] = (float)((e4m3_value(c) + e4m3_value(c + 1)) / 2); /* tie */
    }
    codes[k++] = -448.0f;
    rows.push_back(codes);
    rows.push_back(std::vector<float>(cols, 0.0f));
    std::vector<float> odd(cols);
    for (int i = 0; i < cols; i++) odd[i] = (float)((urand() - 0.5) * 1e-3);
    odd[7] = NAN;
    odd[8] = 1e-30f;
    rows.push_back(odd);
    const int R = (int)rows.size();
    std::vector<float> src((size_t)R * cols);
    for (int r = 0; r < R; r++) memcpy(&src[(size_t)r * cols], rows[r].data(), cols * 4);
    std::vector<uint8_t> q((size_t)R * cols, 0xaa);
    std::vector<float> sc(R, NAN);
    CHECK(cuk_quant_fp8_rows(DT_F32, src.data(), R, cols, q.data(), sc.data(), NULL) == 0);
    int bad = 0;
    for (int r = 0; r < R; r++) {
        float amax = 0.0f;
        for (int i = 0; i < cols; i++)
            if (src[(size_t)r * cols + i] == src[(size_t)r * cols + i])
                amax = fmaxf(amax, fabsf(src[(size_t)r * cols + i]));
        const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
        CHECKF(sc[r] == s, "fp8 row %d: scale %g, want %g", r, sc[r], s);
        for (int i = 0; i < cols; i++) {
            const int want = e4m3_ref(src[(size_t)r * cols + i] / s);
            const int got = q[(size_t)r * cols + i];
            if (got != want && bad++ < 5)
                fprintf(stderr, "fp8 row %d col %d: %.9g / %g -> 0x%02x, want 0x%02x\n", r, i,
                        src[(size_t)r * cols + i], s, got, want);
        }
    }
    CHECKF(bad == 0, "fp8 quantisation: %d codes differ from the reference", bad);
    /* the codes row is its own scale 1 (amax 448): every code comes back as itself */
    for (int c = 0; c <= 0x7e; c++) CHECK(q[(size_t)6 * cols + 2 * c] == c);

    /* epilogue: beta 0 and 1, acc with a wider stride than y */
    const int T = 3, N = 5, lda = 7, ldy = 6;
    std::vector<float> acc((size_t)T * lda), sx(T), sw(N), y((size_t)T * ldy), y0;
    for (auto &v : acc) v = (float)(urand() * 100 - 50);
    for (auto &v : sx) v = (float)urand();
    for (auto &v : sw) v = (float)urand();
    for (auto &v : y) v = (float)(urand() - 0.5);
    y0 = y;
    for (int beta = 0; beta <= 1; beta++) {
        y = y0;
        CHECK(cuk_fp8_epilogue(acc.data(), lda, sx.data(), sw.data(), T, N, (float)beta,
                               y.data(), ldy, NULL) == 0);
        for (int t = 0; t < T; t++)
            for (int o = 0; o < ldy; o++) {
                float want = y0[(size_t)t * ldy + o];
                if (o < N) {
                    const float v = acc[(size_t)t * lda + o] * sx[t] * sw[o];
                    want = beta ? want + v : v;
                }
                CHECKF(y[(size_t)t * ldy + o] == want, "fp8 epilogue beta %d [%d][%d]", beta, t, o);
            }
    }
    printf("fp8: %d rows x %d quantised as the reference encoder, epilogue exact\n", R, cols);
}

int main(int argc, char **argv)
{
    int attn = 1, smp = 1, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "attention")) smp = 0;
        else if (!strcmp(argv[i], "sampling")) attn = 0;
        else if (!strcmp(argv[i], "quick")) quick = 1;
        else {
            fprintf(stderr, "usage: test_cuemu [attention|sampling] [quick]\n");
            return 2;
        }
    }
    test_emulation();
    test_fp8();
    int compared = 0, n_cases = 0;
    const int Bs[3] = {8, 16, 64}, grps[3] = {1, 4, 8};
    for (int bi = 0; bi < 3 && attn; bi++)
        for (int gi = 0; gi < 3; gi++) {
            /* every block size meets every group size; head dims 64, 128 and 96 in a Latin
             * square over (block size, group), F16 KV on every other case */
            const int k = bi * 3 + gi, r = (bi + gi) % 3;
            const int hd = r == 0 ? 64 : r == 1 ? 128 : 96;
            attn_case c = {Bs[bi], grps[gi], hd, k % 2 ? DT_F16 : DT_F32};
            if (quick && k > 1) continue; /* one F32 case, one F16 (tensor-core) case */
            test_attention(c, &compared);
            n_cases++;
        }
    if (attn && !quick) {
        /* a head dim of 36: F16 rows not a multiple of 16 bytes (the scalar loads); 32 query
         * heads per kv head at head dim 256: 4 heads a warp and ~96 KiB of opted-in shared
         * memory */
        test_attention(attn_case{16, 4, 36, DT_F16}, &compared);
        test_attention(attn_case{16, 32, 256, DT_F32}, &compared);
        /* tensor-core tiles of 4 tokens of 16 heads at head dim 96; of 9 tokens of 7 heads (63
         * of the 64 rows) at head dim 80 */
        test_attention(attn_case{16, 16, 96, DT_F16}, &compared);
        test_attention(attn_case{8, 7, 80, DT_F16}, &compared);
        n_cases += 4;
    }
    if (attn)
        printf("attention: %d cases, %d outputs within 2e-5 (tensor-core kernel: 1e-3) of the cpu "
               "backend's\n", n_cases, compared);
    if (smp) {
        const int V = quick ? 300 : 1000;
        test_sample_vs_cpu(V, quick ? 2 : 3, NULL, urand);
        test_sample_batch_invariance(V, NULL, urand);
    }
    return check_exit();
}
