/* engine/cpu/moe.h: the mixture-of-experts FFN of the CPU backend (llama MoE, qwen2moe,
 * qwen3moe). Internal.
 *
 * For each token t (xn[t] its FFN-normalised input, n = hp.n_expert, k = hp.n_expert_used):
 *   logits = ffn_gate_inp · xn[t]                     (n values, the kernels' matmul)
 *   p      = softmax(logits)                          (F32; max subtracted, exp, sum in double
 *                                                      over e = 0..n-1, then p[e] * (1 / sum))
 *   sel    = the k experts of largest p, in rank order (descending p; equal p: the lower expert
 *            id ranks first, so ties are broken deterministically towards the lowest id)
 *   w[r]   = p[sel[r]], divided by (w[0] + ... + w[k-1], summed in F32 in rank order) when
 *            hp.moe_norm_topk
 *   y_r    = down_e(silu(gate_e · xn[t]) * (up_e · xn[t])) for e = sel[r]
 *   out    = fl(w[0] * y_0) + fl(w[1] * y_1) + ... (each product rounded, added in rank order)
 *            [+ fl(sigmoid(gate_inp_shexp · xn[t]) * down_s(silu(gate_s · xn[t]) * (up_s · xn[t])))]
 *   x[t]  += out
 * (the order of llama.cpp's build_moe_ffn: experts weighted by a multiply, summed in slot order,
 * then the shared expert, then the residual add).
 *
 * Batching: the (token, expert) pairs of a step are grouped by expert (tokens ascending within
 * an expert) and each active expert's gate, up and down run as one matmul over its tokens. The
 * kernels give every (token, row) value independently of the other tokens (kernels.h), and the
 * per-token softmax, selection and rank-order sum above depend on that token alone, so a token's
 * output is bit-identical alone or in any batch, with any thread count.
 *
 * Threads: moe_route splits tokens (the caller passes [t0, t1)); moe_gate_up and moe_down split
 * rows of every active expert over (ith, nth); moe_group runs on one thread between them. Calls
 * of one step must not overlap (each phase reads what the previous one wrote). */
#ifndef SPILLWAY_ENGINE_CPU_MOE_H
#define SPILLWAY_ENGINE_CPU_MOE_H

#include <stddef.h>

#include "../model.h"
#include "kernels.h"

typedef struct moe moe_t;

/* Scratch for steps of up to max_T tokens of model m (m->hp.n_expert > 0), after checking that
 * the kernels k multiply every MoE matrix of m. Bytes allocated per token (all F32 or int32):
 *   4 x (k x (dim + 2 eff + 3) + n_expert [+ 1 + 2 sff + dim with a shared expert])
 * (gathered inputs / expert outputs, gate and up; weight, expert and slot per pair; router
 * logits; shared expert gate, gate/up and output), plus O(n_expert) bookkeeping. Borrows m
 * (must outlive the moe_t) and k. NULL + errstr on error. */
moe_t *moe_new(const model_t *m, const kern_table_t *k, int max_T, char *errstr, size_t errlen);
void moe_free(moe_t *moe);

/* Router of tokens [t0, t1): their expert choices and weights (and the shared expert's gate)
 * from xn ([T][dim], rows t0..t1-1 read). */
void moe_route(moe_t *moe, const layer_weights_t *L, const float *xn, int t0, int t1);

/* After moe_route over all T tokens: groups the pairs by expert and copies each pair's input row
 * of xn into the gathered buffer. One thread. */
void moe_group(moe_t *moe, const float *xn, int T);

/* Gate and up of every active expert (and of the shared expert over all T tokens of xn), silu
 * applied; thread ith of nth does its share of each matrix's rows. */
void moe_gate_up(moe_t *moe, const layer_weights_t *L, const float *xn, int T, int ith, int nth);

/* Down projections, weighting and the sum above, added to x ([T][dim]); thread ith of nth owns
 * its range of the dim output columns for every token. */
void moe_down(moe_t *moe, const layer_weights_t *L, float *x, int T, int ith, int nth);

#endif
