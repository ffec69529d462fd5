/* engine/cpu/cpu_backend.c: the CPU backend: Llama-family forward pass over the paged KV cache.
 *
 * Weights are read in place from the model's mapping, except the matrices the kernel table packs
 * into a layout of its own (kern_table_t.pack: Q4_K, Q5_K, Q6_K, IQ4_XS and Q8_0 with
 * AVX512-VNNI), copied once at creation into memory the backend owns. Activations live in scratch buffers sized
 * for params.max_batch_tokens at creation; nothing is allocated per step. Each phase of a layer
 * is one tpool_run; matmuls split output rows over threads, attention splits (token, kv head)
 * items over threads. Every output value is computed in an order that does not depend on the
 * batch (see kernels.h), so results are bit-identical alone or batched. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/err.h"
#include "../backend.h"
#include "../dtype.h"
#include "arch_ops.h"
#include "attention.h"
#include "kernels.h"
#include "moe.h"
#include "threadpool.h"

/* Up to this many tokens, every thread normalises all rows itself inside the matmul phase
 * (no separate norm phase and barrier); above it a norm phase runs first. Same arithmetic
 * either way. */
#define FUSE_T 32
/* Query tokens of one sequence that share a pass over its KV blocks in attention (fewer when
 * the context is long, to bound the score scratch). Performance only: values do not depend on
 * it. */
#define ATT_QT 16

/* The matrices of a layer, in the order of the packed-copy slots (cpu_t.packed). */
enum { MAT_Q, MAT_K, MAT_V, MAT_O, MAT_GATE, MAT_UP, MAT_DOWN, MAT_N };

typedef struct {
    backend_t base;
    const kern_table_t *k;
    /* [(n_layers + 1) * MAT_N]: the kernels' packed copy of matrix i of layer l at
     * [l * MAT_N + i], of the output head at [n_layers * MAT_N]; NULL where the matrix is used
     * in place. The pointers are into packed_mem, which c owns. */
    void **packed;
    void *packed_mem;
    tpool_t *pool;
    int n_threads;
    unsigned char *kv;       /* [n_kv_blocks][kv_block_bytes] */
    size_t kv_elem;          /* 4 (F32) or 2 (F16) */
    int max_T;
    /* scratch, [max_T][...] F32 */
    float *x;                /* [T][dim] residual stream */
    float *xn;               /* [T][dim] normalised input */
    float *q;                /* [T][n_heads * head_dim] */
    float *kk;               /* [T][n_kv * head_dim] */
    float *vv;               /* [T][n_kv * head_dim] */
    float *att;              /* [T][n_heads * head_dim] attention output */
    float *gate;             /* [T][ffn] */
    float *up;               /* [T][ffn] */
    float *tmp;              /* [T][dim] */
    float *rope_cs;          /* [T][rope_dim / 2][2] cos, sin */
    int32_t *tok_seq;        /* [T] sequence index of each token */
    float *scores;           /* [n_threads][group * ctx_len] */
    float *kvconv;           /* [n_threads][stage_floats]: K/V block staging for attention */
    size_t stage_floats;     /* head_dim * block_tokens rounded up to 16 */
    float *xn_priv;          /* [n_threads][FUSE_T][dim]: each thread's own normalised rows */
    attn_fn attn;            /* attention tile implementation */
    const float **aq;        /* [n_threads][ATT_QT * group] query pointers */
    float **ao;              /* [n_threads][ATT_QT * group] output pointers */
    int32_t *apos;           /* [n_threads][ATT_QT * group] query positions */
    int32_t *items;          /* [max_T * n_kv][3]: (seq, first token, tokens) x kv head */
    size_t scores_per_thread;
    moe_t *moe;              /* mixture-of-experts FFN (moe.h); NULL for a dense model */
} cpu_t;

/* ---- per-step job shared by the phase functions ---- */
typedef struct {
    cpu_t *c;
    const backend_batch_t *b;
    const layer_weights_t *L;
    int layer;
    int T;
    float *logits;
    int fuse_norm;           /* T <= FUSE_T: norms fused into the matmul phases */
    int fuse_attn;           /* every sequence has one token: RoPE/store fused into attention */
    int n_items;             /* attention work items in c->items */
    int rope_cur;            /* model rope table whose angles c->rope_cs holds */
} job_t;

/* Normalised input rows for this thread: either the shared xn (filled by a norm phase) or the
 * thread's private copy, computed here. */
static const float *norm_rows(const job_t *j, const float *w, int ith)
{
    const cpu_t *c = j->c;
    const int dim = c->base.model->hp.dim;
    if (!j->fuse_norm) return c->xn;
    float *xn = c->xn_priv + (size_t)ith * FUSE_T * dim;
    for (int t = 0; t < j->T; t++)
        c->k->rmsnorm(c->x + (size_t)t * dim, w, c->base.model->hp.norm_eps, xn + (size_t)t * dim, dim);
    return xn;
}

/* This thread's part [lo, hi) of n matrix rows: whole units of KERN_PACK_ROWS (the last one
 * short), so that packed matrices split at their groups. Every phase that touches a matmul's
 * rows after it splits them this way. */
static void split_rows(long n, int ith, int nth, long *lo, long *hi)
{
    tpool_split((n + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS, ith, nth, lo, hi);
    *lo *= KERN_PACK_ROWS;
    *hi *= KERN_PACK_ROWS;
    if (*hi > n) *hi = n;
    if (*lo > n) *lo = n;
}

/* y = W x over rows [lo, hi) of matrix `which` of layer `layer` (layer n_layers, which 0: the
 * output head), w, through its packed copy when it has one (kernels.h: matmul's contract either
 * way). */
static void matmul_w(const cpu_t *c, int layer, int which, const weight_t *w, const float *x,
                     int64_t ldx, float *y, int64_t ldy, int T, long lo, long hi)
{
    const void *p = c->packed[layer * MAT_N + which];
    if (p) c->k->matmul_packed(w->type, p, w->cols, x, ldx, y, ldy, T, lo, hi);
    else c->k->matmul(w->type, w->data, w->row_bytes, w->cols, x, ldx, y, ldy, T, lo, hi);
}

static void mm(const cpu_t *c, int layer, int which, const weight_t *w, const float *x,
               int64_t ldx, float *y, int64_t ldy, int T, int ith, int nth)
{
    long lo, hi;
    split_rows((long)w->rows, ith, nth, &lo, &hi);
    if (lo < hi) matmul_w(c, layer, which, w, x, ldx, y, ldy, T, lo, hi);
}

static void ph_embed(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const cpu_t *c = j->c;
    const model_t *m = c->base.model;
    const int dim = m->hp.dim;
    long lo, hi;
    tpool_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        const char *row = (const char *)m->tok_embd.data + (size_t)j->b->tokens[t] * m->tok_embd.row_bytes;
        c->k->dequant_row(m->tok_embd.type, row, c->x + t * dim, dim);
        if (m->hp.embd_scale != 1.0f)
            for (int i = 0; i < dim; i++) c->x[t * dim + i] *= m->hp.embd_scale;
        /* RoPE angles of this token, in double for accuracy at large positions. */
        arch_rope_angles(&m->rope[j->rope_cur], m->hp.rope_dim, j->b->pos[t],
                         c->rope_cs + t * m->hp.rope_dim);
    }
}

/* The RoPE angles again, from table j->rope_cur (layers with another table than the last). */
static void ph_rope_table(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const cpu_t *c = j->c;
    const model_t *m = c->base.model;
    long lo, hi;
    tpool_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        arch_rope_angles(&m->rope[j->rope_cur], m->hp.rope_dim, j->b->pos[t],
                         c->rope_cs + t * m->hp.rope_dim);
}

/* xn = rmsnorm(x) with weights w over this thread's share of the batch's rows (the norm ahead of
 * attention or of the FFN when it is not fused into their matmuls). */
static void pre_norm(const job_t *j, const float *w, int ith, int nth)
{
    const cpu_t *c = j->c;
    const int dim = c->base.model->hp.dim;
    long lo, hi;
    tpool_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        c->k->rmsnorm(c->x + t * dim, w, c->base.model->hp.norm_eps, c->xn + t * dim, dim);
}

static void ph_attn_norm(void *arg, int ith, int nth)
{
    job_t *j = arg;
    pre_norm(j, j->L->attn_norm.data, ith, nth);
}

static void ph_qkv(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const cpu_t *c = j->c;
    const hparams_t *hp = &c->base.model->hp;
    const int dim = hp->dim, qd = hp->n_heads * hp->head_dim, kvd = hp->n_kv_heads * hp->head_dim;
    const float *xn = norm_rows(j, j->L->attn_norm.data, ith);
    mm(c, j->layer, MAT_Q, &j->L->wq, xn, dim, c->q, qd, j->T, ith, nth);
    mm(c, j->layer, MAT_K, &j->L->wk, xn, dim, c->kk, kvd, j->T, ith, nth);
    mm(c, j->layer, MAT_V, &j->L->wv, xn, dim, c->vv, kvd, j->T, ith, nth);
}

static void rope_apply(const hparams_t *hp, const float *cs, float *v)
{
    const int half = hp->rope_dim / 2;
    if (hp->rope_kind == ROPE_NORM) {
        for (int i = 0; i < half; i++) {
            float a = v[2 * i], b = v[2 * i + 1], co = cs[2 * i], si = cs[2 * i + 1];
            v[2 * i] = a * co - b * si;
            v[2 * i + 1] = a * si + b * co;
        }
    } else {
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half], co = cs[2 * i], si = cs[2 * i + 1];
            v[i] = a * co - b * si;
            v[i + half] = a * si + b * co;
        }
    }
}

static inline unsigned char *kv_ptr(const cpu_t *c, int32_t block, int layer, int kind, int slot,
                                    int head)
{
    const hparams_t *hp = &c->base.model->hp;
    const int B = c->base.params.block_tokens;
    size_t idx = ((((size_t)layer * 2 + kind) * B + slot) * hp->n_kv_heads + head) * hp->head_dim;
    return c->kv + (size_t)block * c->base.kv_block_bytes + idx * c->kv_elem;
}

/* Biases, RoPE, and K/V written into the cache at the token's position, for kv head g and the
 * query heads that share it. */
static void rope_store_one(cpu_t *c, const job_t *j, long t, int g)
{
    const hparams_t *hp = &c->base.model->hp;
    const layer_weights_t *L = j->L;
    const int hd = hp->head_dim, qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd;
    const int grp = hp->n_heads / hp->n_kv_heads;
    const int B = c->base.params.block_tokens;
    float *q = c->q + t * qd + (size_t)g * grp * hd, *k = c->kk + t * kvd + (size_t)g * hd;
    float *v = c->vv + t * kvd + (size_t)g * hd;
    if (L->bq.data) c->k->add(q, (const float *)L->bq.data + (size_t)g * grp * hd, grp * hd);
    if (L->bk.data) c->k->add(k, (const float *)L->bk.data + (size_t)g * hd, hd);
    if (L->bv.data) c->k->add(v, (const float *)L->bv.data + (size_t)g * hd, hd);
    if (L->q_norm.data) {
        for (int h = 0; h < grp; h++)
            c->k->rmsnorm(q + h * hd, L->q_norm.data, hp->norm_eps, q + h * hd, hd);
        c->k->rmsnorm(k, L->k_norm.data, hp->norm_eps, k, hd);
    }
    const float *cs = c->rope_cs + t * hp->rope_dim;
    for (int h = 0; h < grp; h++) rope_apply(hp, cs, q + h * hd);
    rope_apply(hp, cs, k);
    int s = c->tok_seq[t];
    int pos = j->b->pos[t];
    int32_t blk = j->b->block_tables[s][pos / B];
    unsigned char *kd = kv_ptr(c, blk, j->layer, 0, pos % B, g);
    unsigned char *vd = kv_ptr(c, blk, j->layer, 1, pos % B, g);
    if (c->kv_elem == 4) {
        memcpy(kd, k, (size_t)hd * 4);
        memcpy(vd, v, (size_t)hd * 4);
    } else {
        c->k->f32_to_f16(k, (uint16_t *)kd, hd);
        c->k->f32_to_f16(v, (uint16_t *)vd, hd);
    }
}

static void ph_rope_store(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const int nkv = j->c->base.model->hp.n_kv_heads;
    long lo, hi;
    tpool_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        for (int g = 0; g < nkv; g++) rope_store_one(j->c, j, t, g);
}

/* Attention work items: (sequence, first token, token count, kv head), query tiles of at
 * most ATT_QT tokens of one sequence; built once per step by build_items. */
static int build_items(cpu_t *c, const backend_batch_t *b)
{
    const hparams_t *hp = &c->base.model->hp;
    const int grp = hp->n_heads / hp->n_kv_heads;
    int n = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int t0 = b->seq_start[s], t1 = b->seq_start[s + 1];
        int n_ctx = b->pos[t1 - 1] + 1;
        /* scores scratch per thread holds scores_per_thread floats = qt * grp * n_ctx */
        long qt = (long)(c->scores_per_thread / ((size_t)grp * (size_t)n_ctx));
        if (qt > ATT_QT) qt = ATT_QT;
        if (qt < 1) qt = 1;
        for (int t = t0; t < t1; t += (int)qt) {
            int cnt = t1 - t < qt ? t1 - t : (int)qt;
            for (int g = 0; g < hp->n_kv_heads; g++) {
                c->items[4 * n] = s;
                c->items[4 * n + 1] = t;
                c->items[4 * n + 2] = cnt;
                c->items[4 * n + 3] = g;
                n++;
            }
        }
    }
    return n;
}

static void ph_attention(void *arg, int ith, int nth)
{
    job_t *j = arg;
    cpu_t *c = j->c;
    const hparams_t *hp = &c->base.model->hp;
    const int hd = hp->head_dim, grp = hp->n_heads / hp->n_kv_heads;
    const int B = c->base.params.block_tokens;
    const size_t row_stride = (size_t)hp->n_kv_heads * hd * c->kv_elem;
    const float **aq = c->aq + (size_t)ith * ATT_QT * grp;
    float **ao = c->ao + (size_t)ith * ATT_QT * grp;
    int32_t *apos = c->apos + (size_t)ith * ATT_QT * grp;
    /* Interleaved so that long-context (late) tiles of a prefill spread over threads. */
    for (int it = ith; it < j->n_items; it += nth) {
        const int32_t *item = c->items + 4 * it;
        int s = item[0], t0 = item[1], cnt = item[2], g = item[3];
        int nq = 0;
        for (int t = t0; t < t0 + cnt; t++) {
            /* One token per sequence: nobody else reads this token's K/V, so store it here. */
            if (j->fuse_attn) rope_store_one(c, j, t, g);
            for (int h = 0; h < grp; h++) {
                size_t off = (size_t)t * hp->n_heads * hd + ((size_t)g * grp + h) * hd;
                aq[nq] = c->q + off;
                ao[nq] = c->att + off;
                apos[nq] = j->b->pos[t];
                nq++;
            }
        }
        attn_args_t a = {
            .hd = hd,
            .nq = nq,
            .q = aq,
            .out = ao,
            .qpos = apos,
            .n_ctx = j->b->pos[t0 + cnt - 1] + 1,
            .blocks = j->b->block_tables[s],
            .block_tokens = B,
            .kv = c->kv,
            .block_bytes = c->base.kv_block_bytes,
            .k_off = (size_t)(kv_ptr(c, 0, j->layer, 0, 0, g) - c->kv),
            .v_off = (size_t)(kv_ptr(c, 0, j->layer, 1, 0, g) - c->kv),
            .row_stride = row_stride,
            .kv_f16 = c->kv_elem == 2,
            /* with a soft-cap c the tile takes score * (scale / c), then c * tanh of it */
            .scale = hp->attn_softcap > 0 ? hp->attn_scale / hp->attn_softcap : hp->attn_scale,
            .softcap = hp->attn_softcap,
            .window = j->L->window,
            .scores = c->scores + (size_t)ith * c->scores_per_thread,
            .stage = c->kvconv + (size_t)ith * c->stage_floats,
        };
        c->attn(&a);
    }
}

/* x += Wo * att, each thread over its own output rows. */
static void ph_wo(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const cpu_t *c = j->c;
    const hparams_t *hp = &c->base.model->hp;
    const int dim = hp->dim, qd = hp->n_heads * hp->head_dim;
    long lo, hi;
    split_rows(dim, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    const weight_t *w = &j->L->wo;
    matmul_w(c, j->layer, MAT_O, w, c->att, qd, c->tmp, dim, j->T, lo, hi);
    if (j->L->post_attn_norm.data) return; /* ph_post_norm adds it */
    for (int t = 0; t < j->T; t++) c->k->add(c->x + (size_t)t * dim + lo, c->tmp + (size_t)t * dim + lo, hi - lo);
}

/* Post-norm architectures (gemma): x += rmsnorm(tmp) * w, w the layer's post_attn_norm (after
 * ph_wo) or post_ffn_norm (after ph_down), each thread over its own tokens. */
static void post_norm(const job_t *j, const weight_t *w, int ith, int nth)
{
    const cpu_t *c = j->c;
    const int dim = c->base.model->hp.dim;
    long lo, hi;
    tpool_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        float *y = c->tmp + (size_t)t * dim;
        c->k->rmsnorm(y, w->data, c->base.model->hp.norm_eps, y, dim);
        c->k->add(c->x + (size_t)t * dim, y, dim);
    }
}

static void ph_post_attn_norm(void *arg, int ith, int nth)
{
    job_t *j = arg;
    post_norm(j, &j->L->post_attn_norm, ith, nth);
}

static void ph_post_ffn_norm(void *arg, int ith, int nth)
{
    job_t *j = arg;
    post_norm(j, &j->L->post_ffn_norm, ith, nth);
}

static void ph_ffn_norm(void *arg, int ith, int nth)
{
    job_t *j = arg;
    pre_norm(j, j->L->ffn_norm.data, ith, nth);
}

/* gate, up for this thread's rows, then silu(gate) * up on the same rows. */
static void ph_gate_up(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const cpu_t *c = j->c;
    const hparams_t *hp = &c->base.model->hp;
    const int dim = hp->dim, ffn = hp->ffn_dim;
    long lo, hi;
    split_rows(ffn, ith, nth, &lo, &hi);
    const float *xn = norm_rows(j, j->L->ffn_norm.data, ith);
    if (lo >= hi) return;
    matmul_w(c, j->layer, MAT_GATE, &j->L->w_gate, xn, dim, c->gate, ffn, j->T, lo, hi);
    matmul_w(c, j->layer, MAT_UP, &j->L->w_up, xn, dim, c->up, ffn, j->T, lo, hi);
    for (int t = 0; t < j->T; t++) {
        float *g = c->gate + (size_t)t * ffn + lo;
        const float *u = c->up + (size_t)t * ffn + lo;
        if (hp->ffn_act == FFN_GELU_TANH) arch_gelu_tanh_mul(g, u, g, hi - lo);
        else c->k->silu_mul(g, u, g, hi - lo);
    }
}

static void ph_down(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const cpu_t *c = j->c;
    const hparams_t *hp = &c->base.model->hp;
    const int dim = hp->dim, ffn = hp->ffn_dim;
    long lo, hi;
    split_rows(dim, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    matmul_w(c, j->layer, MAT_DOWN, &j->L->w_down, c->gate, ffn, c->tmp, dim, j->T, lo, hi);
    if (j->L->post_ffn_norm.data) return; /* ph_post_norm adds it */
    for (int t = 0; t < j->T; t++) c->k->add(c->x + (size_t)t * dim + lo, c->tmp + (size_t)t * dim + lo, hi - lo);
}

/* MoE FFN (moe.h): this thread's tokens normalised into the shared xn, then routed. */
static void ph_moe_route(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const cpu_t *c = j->c;
    const int dim = c->base.model->hp.dim;
    long lo, hi;
    tpool_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        c->k->rmsnorm(c->x + t * dim, j->L->ffn_norm.data, c->base.model->hp.norm_eps,
                      c->xn + t * dim, dim);
    moe_route(c->moe, j->L, c->xn, (int)lo, (int)hi);
}

static void ph_moe_gate_up(void *arg, int ith, int nth)
{
    job_t *j = arg;
    moe_gate_up(j->c->moe, j->L, j->c->xn, j->T, ith, nth);
}

static void ph_moe_down(void *arg, int ith, int nth)
{
    job_t *j = arg;
    moe_down(j->c->moe, j->L, j->c->x, j->T, ith, nth);
}

static void ph_out_norm(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const cpu_t *c = j->c;
    const model_t *m = c->base.model;
    const int dim = m->hp.dim;
    long lo, hi;
    tpool_split(j->b->n_logits, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++)
        c->k->rmsnorm(c->x + (size_t)j->b->logits_idx[i] * dim, m->output_norm.data, m->hp.norm_eps,
                      c->xn + i * dim, dim);
}

static void ph_logits(void *arg, int ith, int nth)
{
    job_t *j = arg;
    const cpu_t *c = j->c;
    const model_t *m = c->base.model;
    mm(c, m->hp.n_layers, 0, &m->output, c->xn, m->hp.dim, j->logits, m->hp.n_vocab, j->b->n_logits, ith, nth);
    if (m->hp.logit_softcap > 0) {
        long lo, hi;
        split_rows((long)m->output.rows, ith, nth, &lo, &hi);
        for (int t = 0; t < j->b->n_logits && lo < hi; t++)
            arch_softcap(j->logits + (size_t)t * m->hp.n_vocab + lo, hi - lo, m->hp.logit_softcap);
    }
}

static int cpu_forward(backend_t *be, const backend_batch_t *b, float *logits, char *errstr,
                       size_t errlen)
{
    cpu_t *c = (cpu_t *)be;
    const hparams_t *hp = &be->model->hp;
    if (backend_check_batch(be, b, c->max_T, errstr, errlen)) return -1;
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) c->tok_seq[t] = s;

    job_t j = {.c = c, .b = b, .T = b->n_tokens, .logits = logits};
    j.fuse_norm = j.T <= FUSE_T;
    j.fuse_attn = b->n_seqs == b->n_tokens;
    j.n_items = build_items(c, b);
    j.rope_cur = be->model->layers[0].rope_idx;
    tpool_run(c->pool, ph_embed, &j);
    for (int l = 0; l < hp->n_layers; l++) {
        j.layer = l;
        j.L = &be->model->layers[l];
        if (j.L->rope_idx != j.rope_cur) {
            j.rope_cur = j.L->rope_idx;
            tpool_run(c->pool, ph_rope_table, &j);
        }
        if (!j.fuse_norm) tpool_run(c->pool, ph_attn_norm, &j);
        tpool_run(c->pool, ph_qkv, &j);
        if (!j.fuse_attn) tpool_run(c->pool, ph_rope_store, &j);
        tpool_run(c->pool, ph_attention, &j);
        tpool_run(c->pool, ph_wo, &j);
        if (j.L->post_attn_norm.data) tpool_run(c->pool, ph_post_attn_norm, &j);
        if (c->moe) {
            tpool_run(c->pool, ph_moe_route, &j);
            moe_group(c->moe, c->xn, j.T);
            tpool_run(c->pool, ph_moe_gate_up, &j);
            tpool_run(c->pool, ph_moe_down, &j);
            continue;
        }
        if (!j.fuse_norm) tpool_run(c->pool, ph_ffn_norm, &j);
        tpool_run(c->pool, ph_gate_up, &j);
        tpool_run(c->pool, ph_down, &j);
        if (j.L->post_ffn_norm.data) tpool_run(c->pool, ph_post_ffn_norm, &j);
    }
    if (b->n_logits > 0) {
        tpool_run(c->pool, ph_out_norm, &j);
        tpool_run(c->pool, ph_logits, &j);
    }
    return 0;
}

static int cpu_kv_read(backend_t *be, int32_t block, void *dst)
{
    cpu_t *c = (cpu_t *)be;
    if (block < 0 || block >= be->params.n_kv_blocks) return -1;
    memcpy(dst, c->kv + (size_t)block * be->kv_block_bytes, be->kv_block_bytes);
    return 0;
}

static int cpu_kv_write(backend_t *be, int32_t block, const void *src)
{
    cpu_t *c = (cpu_t *)be;
    if (block < 0 || block >= be->params.n_kv_blocks) return -1;
    memcpy(c->kv + (size_t)block * be->kv_block_bytes, src, be->kv_block_bytes);
    return 0;
}

static int cpu_kv_copy(backend_t *be, int32_t dst, int32_t src)
{
    cpu_t *c = (cpu_t *)be;
    if (dst < 0 || src < 0 || dst >= be->params.n_kv_blocks || src >= be->params.n_kv_blocks)
        return -1;
    if (dst != src)
        memcpy(c->kv + (size_t)dst * be->kv_block_bytes, c->kv + (size_t)src * be->kv_block_bytes,
               be->kv_block_bytes);
    return 0;
}

static int cpu_sync(backend_t *be)
{
    (void)be;
    return 0;
}

static void cpu_free(backend_t *be)
{
    cpu_t *c = (cpu_t *)be;
    if (!c) return;
    free(c->packed);
    free(c->packed_mem);
    tpool_free(c->pool);
    moe_free(c->moe);
    free(c->kv);
    free(c->x);
    free(c->xn);
    free(c->q);
    free(c->kk);
    free(c->vv);
    free(c->att);
    free(c->gate);
    free(c->up);
    free(c->tmp);
    free(c->rope_cs);
    free(c->tok_seq);
    free(c->scores);
    free(c->kvconv);
    free(c->xn_priv);
    free(c->aq);
    free(c->ao);
    free(c->apos);
    free(c->items);
    free(c);
}

size_t backend_cpu_packed_bytes(int wtype, int64_t rows, int64_t cols)
{
    const kern_table_t *k = kern_get(NULL);
    return k->pack_bytes ? k->pack_bytes(wtype, rows, cols) : 0;
}

/* n bytes for the packed copies (free() releases them): 64-byte aligned, and from 2 MiB on
 * aligned to 2 MiB and offered to transparent huge pages (MADV_HUGEPAGE; where the kernel has them
 * in "madvise" mode), so that packing faults them in 2 MiB pages rather than 4 KiB ones (packing
 * Llama-3.2-1B Q8_0: 1.84 -> 0.70 s) and a decode step's stream crosses fewer page boundaries.
 * Performance only. */
static void *packed_alloc(size_t n)
{
    const size_t huge = (size_t)2 << 20;
    if (n < huge) return aligned_alloc(64, (n + 63) / 64 * 64);
    void *p = aligned_alloc(huge, (n + huge - 1) / huge * huge);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
    return p;
}

/* Memory the host must have available beyond the packed copies for the backend to make them. */
#define PACK_HEADROOM ((uint64_t)1 << 30)

/* MemAvailable of /proc/meminfo in bytes (free memory and reclaimable caches, among them the
 * model file's pages that the copies make cold), or 0 when it cannot be read. */
static uint64_t host_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[128];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Packing one matrix over the pool: each thread its own groups of rows (split_rows). */
typedef struct {
    const kern_table_t *k;
    const weight_t *w;
    unsigned char *dst;  /* the copy; group g at dst + g * gbytes */
    size_t gbytes;       /* pack_bytes of one group of KERN_PACK_ROWS rows */
} pack_job_t;

static void ph_pack(void *arg, int ith, int nth)
{
    const pack_job_t *j = arg;
    long lo, hi;
    split_rows((long)j->w->rows, ith, nth, &lo, &hi);
    if (lo < hi)
        j->k->pack(j->w->type, (const char *)j->w->data + (size_t)lo * j->w->row_bytes,
                   j->w->row_bytes, hi - lo, j->w->cols,
                   j->dst + (size_t)(lo / KERN_PACK_ROWS) * j->gbytes);
}

/* The dense matmul matrices of layer l (l == n_layers: the output head) in slot order; returns
 * their count. A mixture-of-experts layer's FFN is moe.c's (checked and used there, in place). */
static int layer_mats(const model_t *m, int l, const weight_t *ws[MAT_N])
{
    if (l == m->hp.n_layers) {
        ws[0] = &m->output;
        return 1;
    }
    const layer_weights_t *L = &m->layers[l];
    const weight_t *lw[MAT_N] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    memcpy(ws, lw, sizeof lw);
    return m->hp.n_expert > 0 ? MAT_O + 1 : MAT_N;
}

/* c->packed: the kernels' packed copy of every matrix the table packs (kern_table_t.pack), all in
 * one allocation c owns (c->packed_mem), packed over the thread pool. 0, or -1 (errstr set)
 * when memory runs out. */
static int pack_weights(cpu_t *c, char *errstr, size_t errlen)
{
    const model_t *m = c->base.model;
    const int nl = m->hp.n_layers;
    c->packed = calloc((size_t)(nl + 1) * MAT_N, sizeof *c->packed);
    if (!c->packed) goto oom;
    if (!c->k->pack_bytes || !c->base.params.cpu_pack) return 0;
    size_t total = 0;
    for (int l = 0; l <= nl; l++) {
        const weight_t *ws[MAT_N];
        const int nw = layer_mats(m, l, ws);
        for (int i = 0; i < nw; i++)
            total += (c->k->pack_bytes(ws[i]->type, ws[i]->rows, ws[i]->cols) + 63) / 64 * 64;
    }
    if (!total) return 0;
    const uint64_t avail = host_mem_available();
    if (avail && (uint64_t)total + PACK_HEADROOM > avail) return 0; /* short: read in place */
    if (!(c->packed_mem = packed_alloc(total))) goto oom;
    unsigned char *at = c->packed_mem;
    for (int l = 0; l <= nl; l++) {
        const weight_t *ws[MAT_N];
        const int nw = layer_mats(m, l, ws);
        for (int i = 0; i < nw; i++) {
            const weight_t *w = ws[i];
            const size_t n = c->k->pack_bytes(w->type, w->rows, w->cols);
            if (!n) continue;
            pack_job_t j = {c->k, w, at, c->k->pack_bytes(w->type, KERN_PACK_ROWS, w->cols)};
            tpool_run(c->pool, ph_pack, &j);
            c->packed[l * MAT_N + i] = at;
            c->base.host_packed_bytes += n;
            at += (n + 63) / 64 * 64;
        }
    }
    return 0;
oom:
    sw_seterr(errstr, errlen, "cpu: out of memory for the kernels' packed copies of the weights");
    return -1;
}

static const backend_ops_t cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .forward = cpu_forward,
    .kv_block_read = cpu_kv_read,
    .kv_block_write = cpu_kv_write,
    .kv_block_copy = cpu_kv_copy,
    .synchronize = cpu_sync,
};

backend_t *backend_cpu_new(const model_t *model, const backend_params_t *params, char *errstr,
                           size_t errlen)
{
    const hparams_t *hp = &model->hp;
    if (params->threads < 1 || params->block_tokens < 1 || params->n_kv_blocks < 1 ||
        params->max_batch_tokens < 1 || (params->kv_type != DT_F32 && params->kv_type != DT_F16)) {
        sw_seterr(errstr, errlen, "cpu: bad parameters (threads %d, block tokens %d, blocks %d, "
                  "batch tokens %d, kv type %s)", params->threads, params->block_tokens,
                  params->n_kv_blocks, params->max_batch_tokens, dtype_name(params->kv_type));
        return NULL;
    }
    cpu_t *c = calloc(1, sizeof *c);
    if (!c) {
        sw_seterr(errstr, errlen, "cpu: out of memory");
        return NULL;
    }
    c->base.ops = &cpu_ops;
    c->base.ctx = c;
    c->base.model = model;
    c->base.params = *params;
    c->kv_elem = params->kv_type == DT_F32 ? 4 : 2;
    c->base.kv_block_bytes = (size_t)params->block_tokens * model_kv_bytes_per_token(model, c->kv_elem);
    c->k = kern_get(NULL);
    /* every matrix must be one the kernels multiply (type, row length); a probe over an empty
     * row range checks that without touching data */
    for (int l = 0; l <= hp->n_layers; l++) {
        const weight_t *ws[MAT_N];
        const int nw = layer_mats(model, l, ws); /* MoE FFNs: moe_new checks them */
        for (int i = 0; i < nw; i++)
            if (c->k->matmul(ws[i]->type, ws[i]->data, ws[i]->row_bytes, ws[i]->cols, NULL,
                             ws[i]->cols, NULL, 1, 1, 0, 0) != 0) {
                char where[32];
                if (l == hp->n_layers) snprintf(where, sizeof where, "output");
                else snprintf(where, sizeof where, "layer %d", l);
                sw_seterr(errstr, errlen, "cpu: %s: a %s matrix with rows of %lld elements is not "
                          "supported by the CPU kernels", where, dtype_name(ws[i]->type),
                          (long long)ws[i]->cols);
                goto fail;
            }
    }
    c->n_threads = params->threads;
    c->max_T = params->max_batch_tokens;
    c->pool = tpool_new(params->threads, errstr, errlen);
    if (!c->pool) goto fail;
    if (pack_weights(c, errstr, errlen) != 0) goto fail;
    if (hp->n_expert > 0 && !(c->moe = moe_new(model, c->k, c->max_T, errstr, errlen))) goto fail;

    const size_t T = (size_t)c->max_T, dim = hp->dim, hd = hp->head_dim;
    const size_t qd = (size_t)hp->n_heads * hd, kvd = (size_t)hp->n_kv_heads * hd;
    const size_t grp = (size_t)(hp->n_heads / hp->n_kv_heads);
    size_t kv_total = (size_t)params->n_kv_blocks * c->base.kv_block_bytes;
    if (kv_total / c->base.kv_block_bytes != (size_t)params->n_kv_blocks) goto oom;
    c->kv = malloc(kv_total);
    c->x = malloc(T * dim * 4);
    c->xn = malloc(T * dim * 4);
    c->q = malloc(T * qd * 4);
    c->kk = malloc(T * kvd * 4);
    c->vv = malloc(T * kvd * 4);
    c->att = malloc(T * qd * 4);
    c->gate = malloc(T * hp->ffn_dim * 4);
    c->up = malloc(T * hp->ffn_dim * 4);
    c->tmp = malloc(T * dim * 4);
    c->rope_cs = malloc(T * hp->rope_dim * 4);
    c->tok_seq = malloc(T * sizeof *c->tok_seq);
    /* Score scratch: one query tile at up to 4096 context tokens, or one token at the full
     * trained context, whichever is larger. */
    c->scores_per_thread = grp * (size_t)hp->ctx_len;
    if (c->scores_per_thread < (size_t)ATT_QT * grp * 4096) c->scores_per_thread = (size_t)ATT_QT * grp * 4096;
    c->scores = malloc((size_t)c->n_threads * c->scores_per_thread * 4);
    c->stage_floats = (size_t)(params->block_tokens + 15) / 16 * 16 * hd;
    c->kvconv = malloc((size_t)c->n_threads * c->stage_floats * 4);
    c->xn_priv = malloc((size_t)c->n_threads * FUSE_T * dim * 4);
    c->attn = attn_get(c->k->name);
    c->aq = malloc((size_t)c->n_threads * ATT_QT * grp * sizeof *c->aq);
    c->ao = malloc((size_t)c->n_threads * ATT_QT * grp * sizeof *c->ao);
    c->apos = malloc((size_t)c->n_threads * ATT_QT * grp * sizeof *c->apos);
    c->items = malloc(T * (size_t)hp->n_kv_heads * 4 * sizeof *c->items);
    if (!c->kv || !c->x || !c->xn || !c->q || !c->kk || !c->vv || !c->att || !c->gate ||
        !c->up || !c->tmp || !c->rope_cs || !c->tok_seq || !c->scores || !c->kvconv || !c->xn_priv || !c->aq || !c->ao || !c->apos || !c->items)
        goto oom;
    return &c->base;
oom:
    sw_seterr(errstr, errlen, "cpu: out of memory (KV pool of %d blocks x %zu bytes, batch of %d tokens)",
              params->n_kv_blocks, c->base.kv_block_bytes, c->max_T);
fail:
    cpu_free(&c->base);
    return NULL;
}
