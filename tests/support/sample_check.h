/* tests/support/sample_check.h: the device sampler (engine/cuda/cuda_sample.h, cuk_sample)
 * against the CPU sampler (engine/sampler.c, sampler_sample), written once against the CUDA
 * runtime API and run by two drivers: tests/test_cuda.c on a real device and
 * tests/test_cuemu.cpp on the CPU emulation of tests/support/cuemu.h (whose runtime API keeps
 * "device" memory in host memory). C11 and C++17.
 *
 * Use: include it (it brings tests/check.h, whose CHECK counters the checks here add to, and
 * engine/cuda/cuda_sample.h with the CUDA runtime API found on the include path); call
 * test_sample_vs_cpu and test_sample_batch_invariance with the stream to launch on and the
 * driver's random source (uniform in [0, 1)), from which every prompt and logit is drawn, so a
 * driver's seed repeats a run. */
#ifndef SPILLWAY_TESTS_SAMPLE_CHECK_H
#define SPILLWAY_TESTS_SAMPLE_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "engine/cuda/cuda_sample.h"

/* A runtime call that must succeed; the message is the runtime's last error. */
#define SC_CU(x) CHECKF((x) == cudaSuccess, "%s", cudaGetErrorString(cudaGetLastError()))

enum { SC_CASES = 12, SC_ROWS = 8, SC_WORDS = SC_ROWS * (2 + 2 * CUK_SAMPLE_MAX_LOGPROBS) };

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
static void sample_logits(float *l, int V, int r, int k, double (*urand)(void))
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
static void test_sample_vs_cpu(int V, int steps, cudaStream_t S, double (*urand)(void))
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
    SC_CU(cudaMalloc((void **)&dl, sizeof(float) * (size_t)R * V));
    SC_CU(cudaMalloc((void **)&dcounts, sizeof(int32_t) * (size_t)R * V));
    SC_CU(cudaMalloc((void **)&drows, sizeof hrows));
    SC_CU(cudaMalloc((void **)&dout, sizeof hout));
    long compared = 0, stochastic = 0, identical = 0;
    for (int ci = 0; ci < SC_CASES; ci++) {
        const sampler_params_t *p = &cases[ci];
        const int L = p->n_logprobs;
        sampler_t *ref[SC_ROWS], *dev[SC_ROWS];
        char err[256];
        for (int r = 0; r < R; r++) {
            sampler_params_t q = *p;
            q.seed = 1000u * (unsigned)ci + (unsigned)r;
            ref[r] = sampler_new(&q, V, err, sizeof err);
            dev[r] = sampler_new(&q, V, err, sizeof err);
            CHECKF(ref[r] && dev[r], "sampler_new: %s", err);
            if (!ref[r] || !dev[r]) exit(check_exit());
            for (int j = 0; j < 100; j++) { /* a prompt: low ids repeat, so penalties bite */
                int32_t t = (int32_t)(urand() * (j % 2 ? V : 64));
                sampler_accept(ref[r], t);
                sampler_accept(dev[r], t);
            }
            const int32_t *cnt = sampler_penalty_counts(dev[r]);
            if (cnt)
                SC_CU(cudaMemcpy(dcounts + (size_t)r * V, cnt, sizeof(int32_t) * (size_t)V,
                              cudaMemcpyHostToDevice));
        }
        int diverged = 0;
        for (int k = 0; k < steps && !diverged; k++) {
            for (int r = 0; r < R; r++) {
                sample_logits(hl + (size_t)r * V, V, r, k, urand);
                const int slot = sampler_penalty_counts(dev[r]) ? r : -1;
                cuda_sample_row_fill(&hrows[r], p, sampler_draw(dev[r]), slot,
                                     sampler_evict_next(dev[r]));
            }
            memset(hout, 0xff, sizeof hout);
            SC_CU(cudaMemcpy(dl, hl, sizeof(float) * (size_t)R * V, cudaMemcpyHostToDevice));
            SC_CU(cudaMemcpy(drows, hrows, sizeof hrows, cudaMemcpyHostToDevice));
            SC_CU(cudaMemset(dout, 0xff, sizeof hout));
            SC_CU(cuk_sample(dl, R, V, drows, dcounts, L, dout, S));
            SC_CU(cudaStreamSynchronize(S));
            SC_CU(cudaMemcpy(hout, dout, cuk_sample_out_words(R, L) * 4, cudaMemcpyDeviceToHost));
            for (int r = 0; r < R; r++) {
                sampler_logprob_t top[SAMPLER_MAX_LOGPROBS], chosen;
                memcpy(scratch, hl + (size_t)r * V, sizeof(float) * (size_t)V);
                const int32_t want = sampler_sample(ref[r], scratch, L ? top : NULL,
                                                    L ? &chosen : NULL);
                const int32_t got = (int32_t)hout[r];
                compared++;
                stochastic += p->temperature > 0.0f;
                identical += got == want;
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
            SC_CU(cudaMemcpy(hcounts, dcounts + (size_t)r * V, sizeof(int32_t) * (size_t)V,
                          cudaMemcpyDeviceToHost));
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
    printf("sampling: %ld/%ld picks (%ld stochastic) identical to the cpu sampler, vocabulary %d\n",
           identical, compared, stochastic, V);
    free(hl);
    free(scratch);
    free(hcounts);
    cudaFree(dl);
    cudaFree(dcounts);
    cudaFree(drows);
    cudaFree(dout);
}

/* A row's pick and logprobs do not depend on the batch: each row of a batch of SC_ROWS (mixed
 * cases, one with penalty counts) sampled alone gives the same words, bit for bit. */
static void test_sample_batch_invariance(int V, cudaStream_t S, double (*urand)(void))
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
    SC_CU(cudaMalloc((void **)&dl, sizeof(float) * (size_t)R * V));
    SC_CU(cudaMalloc((void **)&dcounts, sizeof(int32_t) * (size_t)V));
    SC_CU(cudaMalloc((void **)&drows, sizeof rows));
    SC_CU(cudaMalloc((void **)&dout, sizeof all));
    for (int r = 0; r < R; r++) {
        sample_logits(hl + (size_t)r * V, V, r, 3, urand);
        const int pen = cases[pick[r]].repeat_penalty != 1.0f;
        cuda_sample_row_fill(&rows[r], &cases[pick[r]], 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1),
                             pen ? 0 : -1, pen ? 5 : -1);
    }
    const int L = SAMPLER_MAX_LOGPROBS;
    SC_CU(cudaMemcpy(dl, hl, sizeof(float) * (size_t)R * V, cudaMemcpyHostToDevice));
    SC_CU(cudaMemcpy(dcounts, hc, sizeof(int32_t) * (size_t)V, cudaMemcpyHostToDevice));
    SC_CU(cudaMemcpy(drows, rows, sizeof rows, cudaMemcpyHostToDevice));
    SC_CU(cuk_sample(dl, R, V, drows, dcounts, L, dout, S));
    SC_CU(cudaStreamSynchronize(S));
    SC_CU(cudaMemcpy(all, dout, cuk_sample_out_words(R, L) * 4, cudaMemcpyDeviceToHost));
    int same = 0;
    for (int r = 0; r < R; r++) {
        SC_CU(cudaMemcpy(dcounts, hc, sizeof(int32_t) * (size_t)V, cudaMemcpyHostToDevice));
        SC_CU(cudaMemcpy(drows, &rows[r], sizeof rows[r], cudaMemcpyHostToDevice));
        SC_CU(cudaMemset(dout, 0xff, sizeof one));
        SC_CU(cuk_sample(dl + (size_t)r * V, 1, V, drows, dcounts, L, dout, S));
        SC_CU(cudaStreamSynchronize(S));
        SC_CU(cudaMemcpy(one, dout, sizeof one, cudaMemcpyDeviceToHost));
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
    cudaFree(dl);
    cudaFree(dcounts);
    cudaFree(drows);
    cudaFree(dout);
}

#endif
