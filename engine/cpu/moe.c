/* engine/cpu/moe.c: the mixture-of-experts FFN of the CPU backend (see moe.h). */
#include "moe.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "../dtype.h"
#include "threadpool.h"

struct moe {
    const model_t *m;
    const kern_table_t *k;
    int max_T;
    int n_active;         /* experts with at least one token in this step */
    /* per (token, rank) pair, [max_T][n_used] */
    float *w;             /* routing weight */
    int32_t *sel;         /* expert */
    int32_t *slot;        /* row of the pair in xg / hg / ug */
    /* per gathered pair, [max_T * n_used][...], rows grouped by expert */
    float *xg;            /* [dim]: the pair's input (moe_group), then the expert's output (moe_down) */
    float *hg;            /* [eff]: gate, then silu(gate) * up */
    float *ug;            /* [eff]: up */
    float *logits;        /* [max_T][n_expert] router logits, then probabilities */
    /* shared expert (hp.shexp_ffn_dim > 0), else NULL */
    float *sh_gate;       /* [max_T]: sigmoid(gate_inp_shexp · xn) */
    float *sg, *su;       /* [max_T][sff] */
    float *ysh;           /* [max_T][dim] */
    /* per expert */
    int32_t *count;       /* [n_expert] tokens routed to e this step */
    int32_t *first;       /* [n_expert] first gathered row of e */
    int32_t *active;      /* [n_expert] ids of the active experts, ascending */
};

void moe_free(moe_t *moe)
{
    if (!moe) return;
    free(moe->w);
    free(moe->sel);
    free(moe->slot);
    free(moe->xg);
    free(moe->hg);
    free(moe->ug);
    free(moe->logits);
    free(moe->sh_gate);
    free(moe->sg);
    free(moe->su);
    free(moe->ysh);
    free(moe->count);
    free(moe->first);
    free(moe->active);
    free(moe);
}

moe_t *moe_new(const model_t *m, const kern_table_t *k, int max_T, char *errstr, size_t errlen)
{
    const hparams_t *hp = &m->hp;
    if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert ||
        max_T <= 0) {
        sw_seterr(errstr, errlen, "cpu: moe: not a mixture-of-experts model");
        return NULL;
    }
    /* every MoE matrix must be one the kernels multiply; the probe touches no data */
    for (int l = 0; l < hp->n_layers; l++) {
        const layer_weights_t *L = &m->layers[l];
        const weight_t *ws[8] = {&L->ffn_gate_inp, &L->gate_exps, &L->up_exps, &L->down_exps,
                                 &L->gate_inp_shexp, &L->gate_shexp, &L->up_shexp, &L->down_shexp};
        for (int i = 0; i < 8; i++) {
            if (!ws[i]->data) {
                if (i < 4 || hp->shexp_ffn_dim > 0) {
                    sw_seterr(errstr, errlen, "cpu: layer %d: a mixture-of-experts matrix is missing", l);
                    return NULL;
                }
                continue;
            }
            if (k->matmul(ws[i]->type, ws[i]->data, ws[i]->row_bytes, ws[i]->cols, NULL,
                          ws[i]->cols, NULL, 1, 1, 0, 0) != 0) {
                sw_seterr(errstr, errlen, "cpu: layer %d: a %s expert matrix with rows of %lld "
                          "elements is not supported by the CPU kernels", l, dtype_name(ws[i]->type),
                          (long long)ws[i]->cols);
                return NULL;
            }
        }
    }
    moe_t *moe = calloc(1, sizeof *moe);
    if (!moe) goto oom;
    moe->m = m;
    moe->k = k;
    moe->max_T = max_T;
    const size_t T = (size_t)max_T, ku = (size_t)hp->n_expert_used, ne = (size_t)hp->n_expert;
    const size_t dim = (size_t)hp->dim, eff = (size_t)hp->expert_ffn_dim;
    const size_t sff = (size_t)hp->shexp_ffn_dim;
    moe->w = malloc(T * ku * sizeof *moe->w);
    moe->sel = malloc(T * ku * sizeof *moe->sel);
    moe->slot = malloc(T * ku * sizeof *moe->slot);
    moe->xg = malloc(T * ku * dim * sizeof *moe->xg);
    moe->hg = malloc(T * ku * eff * sizeof *moe->hg);
    moe->ug = malloc(T * ku * eff * sizeof *moe->ug);
    moe->logits = malloc(T * ne * sizeof *moe->logits);
    moe->count = malloc(ne * sizeof *moe->count);
    moe->first = malloc(ne * sizeof *moe->first);
    moe->active = malloc(ne * sizeof *moe->active);
    if (!moe->w || !moe->sel || !moe->slot || !moe->xg || !moe->hg || !moe->ug || !moe->logits ||
        !moe->count || !moe->first || !moe->active)
        goto oom;
    if (sff > 0) {
        moe->sh_gate = malloc(T * sizeof *moe->sh_gate);
        moe->sg = malloc(T * sff * sizeof *moe->sg);
        moe->su = malloc(T * sff * sizeof *moe->su);
        moe->ysh = malloc(T * dim * sizeof *moe->ysh);
        if (!moe->sh_gate || !moe->sg || !moe->su || !moe->ysh) goto oom;
    }
    return moe;
oom:
    sw_seterr(errstr, errlen, "cpu: out of memory (mixture-of-experts scratch for %d tokens)", max_T);
    moe_free(moe);
    return NULL;
}

void moe_route(moe_t *moe, const layer_weights_t *L, const float *xn, int t0, int t1)
{
    const hparams_t *hp = &moe->m->hp;
    const kern_table_t *k = moe->k;
    const int ne = hp->n_expert, ku = hp->n_expert_used, dim = hp->dim;
    if (t1 <= t0) return;
    const weight_t *r = &L->ffn_gate_inp;
    float *lg = moe->logits + (size_t)t0 * ne;
    k->matmul(r->type, r->data, r->row_bytes, dim, xn + (size_t)t0 * dim, dim, lg, ne, t1 - t0, 0,
              ne);
    if (moe->sh_gate) {
        const weight_t *g = &L->gate_inp_shexp;
        k->matmul(g->type, g->data, g->row_bytes, dim, xn + (size_t)t0 * dim, dim,
                  moe->sh_gate + t0, 1, t1 - t0, 0, 1);
        for (int t = t0; t < t1; t++) moe->sh_gate[t] = 1.0f / (1.0f + expf(-moe->sh_gate[t]));
    }
    for (int t = t0; t < t1; t++) {
        float *p = moe->logits + (size_t)t * ne;
        float mx = p[0];
        for (int e = 1; e < ne; e++)
            if (p[e] > mx) mx = p[e];
        double sum = 0.0;
        for (int e = 0; e < ne; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        const float inv = (float)(1.0 / sum);
        for (int e = 0; e < ne; e++) p[e] *= inv;
        int32_t *sel = moe->sel + (size_t)t * ku;
        float *w = moe->w + (size_t)t * ku;
        /* rank r: the largest p not yet chosen; strict '>' keeps the lowest id on ties (and
         * picks the lowest unchosen id when p holds NaN) */
        for (int rk = 0; rk < ku; rk++) {
            int best = -1;
            for (int e = 0; e < ne; e++) {
                int taken = 0;
                for (int q = 0; q < rk; q++) taken |= sel[q] == e;
                if (taken) continue;
                if (best < 0 || p[e] > p[best]) best = e;
            }
            sel[rk] = best;
            w[rk] = p[best];
        }
        if (hp->moe_norm_topk) {
            float s = 0.0f;
            for (int rk = 0; rk < ku; rk++) s += w[rk];
            for (int rk = 0; rk < ku; rk++) w[rk] /= s;
        }
    }
}

void moe_group(moe_t *moe, const float *xn, int T)
{
    const hparams_t *hp = &moe->m->hp;
    const int ne = hp->n_expert, ku = hp->n_expert_used, dim = hp->dim;
    memset(moe->count, 0, (size_t)ne * sizeof *moe->count);
    for (int i = 0; i < T * ku; i++) moe->count[moe->sel[i]]++;
    int32_t off = 0;
    moe->n_active = 0;
    for (int e = 0; e < ne; e++) {
        moe->first[e] = off;
        off += moe->count[e];
        if (moe->count[e] > 0) moe->active[moe->n_active++] = e;
        moe->count[e] = 0; /* refilled below as the fill position */
    }
    for (int t = 0; t < T; t++)
        for (int rk = 0; rk < ku; rk++) {
            const int e = moe->sel[(size_t)t * ku + rk];
            const int32_t s = moe->first[e] + moe->count[e]++;
            moe->slot[(size_t)t * ku + rk] = s;
            memcpy(moe->xg + (size_t)s * dim, xn + (size_t)t * dim, (size_t)dim * sizeof(float));
        }
}

/* y = silu(g) * u over rows [lo, hi) of n tokens with row stride ld, in place into g. */
static void silu_rows(const kern_table_t *k, float *g, const float *u, size_t ld, int n, long lo,
                      long hi)
{
    for (int t = 0; t < n; t++)
        k->silu_mul(g + (size_t)t * ld + lo, u + (size_t)t * ld + lo, g + (size_t)t * ld + lo,
                    hi - lo);
}

void moe_gate_up(moe_t *moe, const layer_weights_t *L, const float *xn, int T, int ith, int nth)
{
    const hparams_t *hp = &moe->m->hp;
    const kern_table_t *k = moe->k;
    const int dim = hp->dim, eff = hp->expert_ffn_dim, sff = hp->shexp_ffn_dim;
    long lo, hi;
    tpool_split(eff, ith, nth, &lo, &hi);
    if (lo < hi)
        for (int a = 0; a < moe->n_active; a++) {
            const int e = moe->active[a], n = moe->count[e];
            const size_t s = (size_t)moe->first[e];
            const weight_t *wg = &L->gate_exps, *wu = &L->up_exps;
            const char *g0 = (const char *)wg->data + (size_t)e * eff * wg->row_bytes;
            const char *u0 = (const char *)wu->data + (size_t)e * eff * wu->row_bytes;
            k->matmul(wg->type, g0, wg->row_bytes, dim, moe->xg + s * dim, dim, moe->hg + s * eff,
                      eff, n, lo, hi);
            k->matmul(wu->type, u0, wu->row_bytes, dim, moe->xg + s * dim, dim, moe->ug + s * eff,
                      eff, n, lo, hi);
            silu_rows(k, moe->hg + s * eff, moe->ug + s * eff, (size_t)eff, n, lo, hi);
        }
    if (sff > 0) {
        tpool_split(sff, ith, nth, &lo, &hi);
        if (lo >= hi) return;
        const weight_t *wg = &L->gate_shexp, *wu = &L->up_shexp;
        k->matmul(wg->type, wg->data, wg->row_bytes, dim, xn, dim, moe->sg, sff, T, lo, hi);
        k->matmul(wu->type, wu->data, wu->row_bytes, dim, xn, dim, moe->su, sff, T, lo, hi);
        silu_rows(k, moe->sg, moe->su, (size_t)sff, T, lo, hi);
    }
}

/* y[i] = fl(a * y[i]): a multiply alone (no fused add), as the sum's contract says. */
static void scale(float *y, float a, long n)
{
    for (long i = 0; i < n; i++) y[i] *= a;
}

void moe_down(moe_t *moe, const layer_weights_t *L, float *x, int T, int ith, int nth)
{
    const hparams_t *hp = &moe->m->hp;
    const kern_table_t *k = moe->k;
    const int dim = hp->dim, eff = hp->expert_ffn_dim, sff = hp->shexp_ffn_dim;
    const int ku = hp->n_expert_used;
    long lo, hi;
    tpool_split(dim, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    /* expert outputs overwrite the gathered inputs (moe_gate_up, which read them, is done) */
    for (int a = 0; a < moe->n_active; a++) {
        const int e = moe->active[a], n = moe->count[e];
        const size_t s = (size_t)moe->first[e];
        const weight_t *wd = &L->down_exps;
        const char *d0 = (const char *)wd->data + (size_t)e * dim * wd->row_bytes;
        k->matmul(wd->type, d0, wd->row_bytes, eff, moe->hg + s * eff, eff, moe->xg + s * dim,
                  dim, n, lo, hi);
    }
    if (sff > 0) {
        const weight_t *wd = &L->down_shexp;
        k->matmul(wd->type, wd->data, wd->row_bytes, sff, moe->sg, sff, moe->ysh, dim, T, lo, hi);
    }
    for (int t = 0; t < T; t++) {
        const int32_t *slot = moe->slot + (size_t)t * ku;
        const float *w = moe->w + (size_t)t * ku;
        /* the rank-0 output row accumulates the sum; every pair's row belongs to this token */
        float *acc = moe->xg + (size_t)slot[0] * dim + lo;
        scale(acc, w[0], hi - lo);
        for (int rk = 1; rk < ku; rk++) {
            float *y = moe->xg + (size_t)slot[rk] * dim + lo;
            scale(y, w[rk], hi - lo);
            k->add(acc, y, hi - lo);
        }
        if (sff > 0) {
            float *y = moe->ysh + (size_t)t * dim + lo;
            scale(y, moe->sh_gate[t], hi - lo);
            k->add(acc, y, hi - lo);
        }
        k->add(x + (size_t)t * dim + lo, acc, hi - lo);
    }
}
