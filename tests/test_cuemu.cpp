/* tests/test_cuemu.cpp: the CUDA kernels of engine/cuda, compiled from their real sources for
 * the CPU emulation of tests/support/cuemu.h (no nvcc, no GPU), against the CPU backend:
 *  - cuk_qkv_rope_store + cuk_attention (GQA blocks, split-K and the merge) against the CPU
 *    backend's attention (engine/cpu/attention.h, the scalar kernel) over a paged pool with
 *    shuffled block tables: block sizes 8, 16 and 64, query heads per kv head 1, 4 and 8, head
 *    dims 64, 96 and 128, F32 and F16 KV; also head dim 36 (F16 rows not a multiple of 16
 *    bytes: the scalar loads) and 32 query heads of head dim 256 (opted-in shared memory);
 *    contexts of 1 to 300 keys that cross the 32-key tiles, the split chunks and the KV blocks;
 *    split counts 1, 3 and 32; outputs and scratch poisoned (NaN) first; a token's output alone
 *    and in its batch must be bit-identical;
 *  - cuk_sample against sampler_sample (the cases of tests/test_cuda.c's sampling check).
 * What this proves and what it does not: cuemu.h (indexing, synchronisation, arithmetic logic
 * yes; warp timing, the device memory model, speed no). tests/test_cuda.c runs the same kernels
 * on a device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "support/cuemu.h"

extern "C" {
#include "engine/cpu/attention.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "engine/sampler.h"
}
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/cuda_sample.h"

static int fails, checks;
#define CHECKF(c, ...)                                                                            \
    do {                                                                                          \
        checks++;                                                                                 \
        if (!(c)) {                                                                               \
            fails++;                                                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
        }                                                                                         \
    } while (0)

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

    const int splits[3] = {1, 3, 32};
    for (int si = 0; si < 3; si++) {
        const int ns = splits[si], chunk = si == 1 ? 32 : 128;
        std::vector<float> part((size_t)T * nh * ns * (hd + 2), NAN), out((size_t)T * nh * hd, NAN);
        cuk_attn_args_t aa = {T, nh, nkv, hd, qkv.data(), qkvd, pg, 1.0f / sqrtf((float)hd), ns,
                              chunk, si == 2 ? 0 : ns, part.data(), DT_F32, out.data()};
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
        if (si != 2) continue;
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
}

/* ---- sampling ---- */

#define SC_CASES 12
#define SC_ROWS 8
#define SC_WORDS (SC_ROWS * (2 + 2 * CUK_SAMPLE_MAX_LOGPROBS))
template <class T> static void emu_alloc(T **p, size_t bytes) { *p = (T *)malloc(bytes); }
#define emu_alloc(pp, sz) (*(void **)(pp) = malloc(sz))
/* The parameter sets: every filter alone and combined, penalties over a window and the whole
 * history, logprobs, and the limits (1/T overflowing, top-k 1, a tiny top-p, top-k >= n_vocab). */
static void sample_cases(sampler_params_t *c, int V)
{
    for (int i = 0; i < SC_CASES; i++) sampler_params_default(&c[i]);
    c[0].temperature = 0.0f;
    c[1].temperature = 0.8f;
    c[2].top_k = 40;
    c[3].temperature = 1.2f, c[3].top_p = 0.9f;
    c[4].min_p = 0.05f;
    c[5].temperature = 0.9f, c[5].top_k = 200, c[5].top_p = 0.95f, c[5].min_p = 0.02f;
    c[5].n_logprobs = 5;
    c[6].temperature = 0.0f, c[6].repeat_penalty = 1.3f, c[6].presence_penalty = 0.4f;
    c[6].frequency_penalty = 0.25f, c[6].n_logprobs = 3;
    c[7].repeat_penalty = 1.1f, c[7].frequency_penalty = 0.5f, c[7].repeat_last_n = -1;
    c[7].top_p = 0.8f;
    c[8].temperature = 1e-39f; /* 1/T overflows F32: the greedy limit */
    c[9].top_k = 1;
    c[10].temperature = 1.5f, c[10].top_p = 0.001f;
    c[11].temperature = 0.7f, c[11].top_k = V + 5, c[11].n_logprobs = SAMPLER_MAX_LOGPROBS;
    c[11].presence_penalty = 0.3f, c[11].repeat_last_n = 16;
}

/* Logits of row r at step k: peaked (a few hundred tokens matter), with the odd cases the
 * sanitising step handles: ties for the max (row 1), NaN and +inf (row 2), half the vocabulary
 * -inf (row 3), every logit -inf (row 4 at step 0), all equal (row 5 at step 1). */
static void sample_logits(float *l, int V, int r, int k)
{
    for (int i = 0; i < V; i++) {
        double g = urand() + urand() + urand() - 1.5; /* ~N(0, 0.25) */
        l[i] = (float)(g * 6.0);
    }
    for (int j = 0; j < 30; j++) l[(size_t)(urand() * V)] += 8.0f; /* a nucleus */
    if (r == 1) {
        int best = 0;
        for (int i = 1; i < V; i++) best = l[i] > l[best] ? i : best;
        l[V / 2] = l[best];
        l[V - 1] = l[best];
        l[(best + 7) % V] = l[best];
    } else if (r == 2) {
        l[3] = NAN;
        l[V / 3] = k % 2 ? INFINITY : -0.0f;
    } else if (r == 3) {
        for (int i = 0; i < V; i += 2) l[i] = -INFINITY;
    } else if (r == 4 && k == 0) {
        for (int i = 0; i < V; i++) l[i] = -INFINITY;
    } else if (r == 5 && k == 1) {
        for (int i = 0; i < V; i++) l[i] = 1.5f;
    }
}

/* Logprobs agree to 1e-5, relative beyond magnitude 1 (the log-sum-exp's rounding differs). */
static int lp_close(float a, float b)
{
    return (isinf(a) && a == b) || fabsf(a - b) <= 1e-5f * fmaxf(1.0f, fabsf(b));
}

/* Every case on SC_ROWS rows for `steps` steps: each row's host sampler (sampler_sample) and
 * the device (cuk_sample, fed by a twin sampler's sampler_draw / sampler_evict_next, its counts
 * on the device) must pick the same ids with the same logprobs, and the device's penalty counts
 * must end equal to the host's. Identical, not merely alike: the same random stream, weights
 * bit-identical by construction, sums differing only by rounding. */
static void test_sample_vs_cpu(int V, int steps, int only)
{
    const int R = SC_ROWS;
    sampler_params_t cases[SC_CASES];
    sample_cases(cases, V);
    float *hl = (float *)malloc(sizeof(float) * (size_t)R * V);
    float *scratch = (float *)malloc(sizeof(float) * (size_t)V);
    float *dl = NULL;
    int32_t *dcounts = NULL, *hcounts = (int32_t *)malloc(sizeof(int32_t) * (size_t)V);
    cuk_sample_row_t hrows[SC_ROWS], *drows = NULL;
    uint32_t hout[SC_WORDS], *dout = NULL;
    emu_alloc(&dl, sizeof(float) * (size_t)R * V);
    emu_alloc(&dcounts, sizeof(int32_t) * (size_t)R * V);
    emu_alloc(&drows, sizeof hrows);
    emu_alloc(&dout, sizeof hout);
    long compared = 0, stochastic = 0;
    for (int ci = 0; ci < SC_CASES; ci++) {
        if (only >= 0 && ci != only) continue;
        const sampler_params_t *p = &cases[ci];
        const int L = p->n_logprobs;
        sampler_t *ref[SC_ROWS], *dev[SC_ROWS];
        char err[256];
        for (int r = 0; r < R; r++) {
            sampler_params_t q = *p;
            q.seed = 1000u * (unsigned)ci + (unsigned)r;
            ref[r] = sampler_new(&q, V, err, sizeof err);
            dev[r] = sampler_new(&q, V, err, sizeof err);
            if (!ref[r] || !dev[r]) { fprintf(stderr, "sampler_new: %s\n", err); exit(1); }
            for (int j = 0; j < 100; j++) { /* a prompt: low ids repeat, so penalties bite */
                int32_t t = (int32_t)(urand() * (j % 2 ? V : 64));
                sampler_accept(ref[r], t);
                sampler_accept(dev[r], t);
            }
            const int32_t *cnt = sampler_penalty_counts(dev[r]);
            if (cnt)
                memcpy(dcounts + (size_t)r * V, cnt, sizeof(int32_t) * (size_t)V);
        }
        int diverged = 0;
        for (int k = 0; k < steps && !diverged; k++) {
            for (int r = 0; r < R; r++) {
                sample_logits(hl + (size_t)r * V, V, r, k);
                const int slot = sampler_penalty_counts(dev[r]) ? r : -1;
                cuda_sample_row_fill(&hrows[r], p, sampler_draw(dev[r]), slot,
                                     sampler_evict_next(dev[r]));
            }
            memset(hout, 0xff, sizeof hout);
            memcpy(dl, hl, sizeof(float) * (size_t)R * V);
            memcpy(drows, hrows, sizeof hrows);
            memset(dout, 0xff, sizeof hout);
            CHECKF(0 == cuk_sample(dl, R, V, drows, dcounts, L, dout, NULL), "launch");
            memcpy(hout, dout, cuk_sample_out_words(R, L) * 4);
            for (int r = 0; r < R; r++) {
                sampler_logprob_t top[SAMPLER_MAX_LOGPROBS], chosen;
                memcpy(scratch, hl + (size_t)r * V, sizeof(float) * (size_t)V);
                const int32_t want = sampler_sample(ref[r], scratch, L ? top : NULL,
                                                    L ? &chosen : NULL);
                const int32_t got = (int32_t)hout[r];
                compared++;
                stochastic += p->temperature > 0.0f;
                if (got != want) {
                    CHECKF(got == want, "sample case %d row %d step %d (V %d): device %d, cpu %d",
                           ci, r, k, V, got, want);
                    diverged = 1;
                    continue;
                }
                if (L) {
                    float clp;
                    memcpy(&clp, &hout[R + r], 4);
                    CHECKF(lp_close(clp, chosen.logprob), "case %d row %d step %d: chosen "
                           "logprob %g, cpu %g", ci, r, k, (double)clp, (double)chosen.logprob);
                    const uint32_t *t = hout + 2 * (size_t)R + 2 * (size_t)L * r;
                    for (int j = 0; j < L; j++) {
                        float tlp;
                        memcpy(&tlp, &t[2 * j + 1], 4);
                        CHECKF((int32_t)t[2 * j] == top[j].id && lp_close(tlp, top[j].logprob),
                               "case %d row %d step %d: top %d = (%d, %g), cpu (%d, %g)", ci, r,
                               k, j, (int)t[2 * j], (double)tlp, top[j].id,
                               (double)top[j].logprob);
                    }
                }
                sampler_accept(ref[r], want);
                sampler_accept(dev[r], got); /* the device counted it already */
            }
        }
        for (int r = 0; r < R && !diverged; r++) {
            const int32_t *cnt = sampler_penalty_counts(dev[r]);
            if (!cnt) continue;
            memcpy(hcounts, dcounts + (size_t)r * V, sizeof(int32_t) * (size_t)V);
            int bad = 0;
            for (int i = 0; i < V; i++) bad += hcounts[i] != cnt[i];
            CHECKF(bad == 0, "case %d row %d: %d device penalty counts differ from the host's", ci,
                   r, bad);
        }
        for (int r = 0; r < R; r++) {
            sampler_free(ref[r]);
            sampler_free(dev[r]);
        }
    }
    printf("sampling: %ld picks (%ld stochastic) identical to the cpu sampler, vocabulary %d\n",
           compared, stochastic, V);
    free(hl);
    free(scratch);
    free(hcounts);
    free(dl);
    free(dcounts);
    free(drows);
    free(dout);
}

/* A row's pick and logprobs do not depend on the batch: each row of a batch of SC_ROWS (mixed
 * cases, one with penalty counts) sampled alone gives the same words, bit for bit. */
static void test_sample_batch_invariance(int V)
{
    const int R = SC_ROWS;
    sampler_params_t cases[SC_CASES];
    sample_cases(cases, V);
    const int pick[SC_ROWS] = {1, 3, 5, 7, 2, 10, 11, 4}; /* row 3: case 7 has penalties */
    float *hl = (float *)malloc(sizeof(float) * (size_t)R * V);
    int32_t *hc = (int32_t *)malloc(sizeof(int32_t) * (size_t)V);
    for (int i = 0; i < V; i++) hc[i] = i % 97 == 0 ? 1 + i % 3 : 0;
    cuk_sample_row_t rows[SC_ROWS], *drows = NULL;
    uint32_t all[SC_WORDS], one[2 + 2 * CUK_SAMPLE_MAX_LOGPROBS], *dout = NULL;
    float *dl = NULL;
    int32_t *dcounts = NULL;
    emu_alloc(&dl, sizeof(float) * (size_t)R * V);
    emu_alloc(&dcounts, sizeof(int32_t) * (size_t)V);
    emu_alloc(&drows, sizeof rows);
    emu_alloc(&dout, sizeof all);
    for (int r = 0; r < R; r++) {
        sample_logits(hl + (size_t)r * V, V, r, 3);
        const int pen = cases[pick[r]].repeat_penalty != 1.0f;
        cuda_sample_row_fill(&rows[r], &cases[pick[r]], 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1),
                             pen ? 0 : -1, pen ? 5 : -1);
    }
    const int L = SAMPLER_MAX_LOGPROBS;
    memcpy(dl, hl, sizeof(float) * (size_t)R * V);
    memcpy(dcounts, hc, sizeof(int32_t) * (size_t)V);
    memcpy(drows, rows, sizeof rows);
    CHECKF(0 == cuk_sample(dl, R, V, drows, dcounts, L, dout, NULL), "launch");
    memcpy(all, dout, cuk_sample_out_words(R, L) * 4);
    int same = 0;
    for (int r = 0; r < R; r++) {
        memcpy(dcounts, hc, sizeof(int32_t) * (size_t)V);
        memcpy(drows, &rows[r], sizeof rows[r]);
        memset(dout, 0xff, sizeof one);
        CHECKF(0 == cuk_sample(dl + (size_t)r * V, 1, V, drows, dcounts, L, dout, NULL), "launch");
        
        memcpy(one, dout, sizeof one);
        const int nl = rows[r].n_logprobs;
        int ok = one[0] == all[r] && (!nl || one[1] == all[R + r]);
        for (int j = 0; j < 2 * nl; j++)
            ok &= one[2 + j] == all[2 * (size_t)R + 2 * (size_t)L * r + j];
        CHECKF(ok, "sampling row %d alone: id %u, in a batch of %d: %u", r, one[0], R, all[r]);
        same += ok;
    }
    printf("sampling: %d/%d rows identical alone and in a batch of %d\n", same, R, R);
    free(hl);
    free(hc);
    free(dl);
    free(dcounts);
    free(drows);
    free(dout);
}


/* Usage: test_cuemu [attention|sampling] [quick]: both parts by default; quick: one attention
 * case and a small vocabulary. */
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
    int compared = 0, n_cases = 0;
    const int Bs[3] = {8, 16, 64}, grps[3] = {1, 4, 8};
    for (int bi = 0; bi < 3 && attn; bi++)
        for (int gi = 0; gi < 3; gi++) {
            /* every block size meets every group size; head dims 64, 128 and 96 in a Latin
             * square over (block size, group), F16 KV on every other case */
            const int k = bi * 3 + gi, r = (bi + gi) % 3;
            const int hd = r == 0 ? 64 : r == 1 ? 128 : 96;
            attn_case c = {Bs[bi], grps[gi], hd, k % 2 ? DT_F16 : DT_F32};
            if (quick && k) continue;
            test_attention(c, &compared);
            n_cases++;
        }
    if (attn && !quick) {
        /* a head dim of 36: F16 rows not a multiple of 16 bytes (the scalar loads); 32 query
         * heads per kv head at head dim 256: 4 heads a warp and ~96 KiB of opted-in shared
         * memory */
        test_attention(attn_case{16, 4, 36, DT_F16}, &compared);
        test_attention(attn_case{16, 32, 256, DT_F32}, &compared);
        n_cases += 2;
    }
    if (attn)
        printf("attention: %d cases, %d outputs within 2e-5 of the cpu backend's\n", n_cases,
               compared);
    if (smp) {
        const int V = quick ? 300 : 1000;
        test_sample_vs_cpu(V, quick ? 2 : 3, -1);
        test_sample_batch_invariance(V);
    }
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}
