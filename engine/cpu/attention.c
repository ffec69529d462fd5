/* engine/cpu/attention.c: portable attention tile and dispatch (see attention.h). */
#include "engine/cpu/attention.h"

#include <math.h>
#include <string.h>

#include "engine/dtype.h"

void attn_tile_avx512(const attn_args_t *a);
void attn_tile_avx2(const attn_args_t *a);

static const float *row(const attn_args_t *a, int blk, size_t off, int i, float *stage)
{
    const unsigned char *p = a->kv + (size_t)blk * a->block_bytes + off + (size_t)i * a->row_stride;
    if (!a->kv_f16) return (const float *)p;
    const uint16_t *h = (const uint16_t *)p;
    for (int e = 0; e < a->hd; e++) stage[e] = fp16_to_f32(h[e]);
    return stage;
}

static void attn_tile_c(const attn_args_t *a)
{
    const int B = a->block_tokens, hd = a->hd, jb = attn_first_block_pos(a);
    for (int j0 = jb; j0 < a->n_ctx; j0 += B) {
        int cnt = a->n_ctx - j0 < B ? a->n_ctx - j0 : B;
        int blk = a->blocks[j0 / B];
        for (int i = 0; i < cnt; i++) {
            const float *k = row(a, blk, a->k_off, i, a->stage);
            for (int qi = 0; qi < a->nq; qi++) {
                if (j0 + i > a->qpos[qi]) continue;
                const float *q = a->q[qi];
                float s = 0;
                for (int e = 0; e < hd; e++) s += q[e] * k[e];
                a->scores[(size_t)qi * a->n_ctx + j0 + i] = s * a->scale;
            }
        }
    }
    for (int qi = 0; qi < a->nq; qi++) {
        float *sc = a->scores + (size_t)qi * a->n_ctx;
        int n = a->qpos[qi] + 1;
        int lo = attn_prepare_scores(a, qi, jb, sc);
        float mx = sc[lo];
        for (int j = lo + 1; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
        float sum = 0;
        for (int j = lo; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float inv = 1.0f / sum;
        for (int j = lo; j < n; j++) sc[j] *= inv;
        memset(a->out[qi], 0, (size_t)hd * sizeof(float));
    }
    for (int j0 = jb; j0 < a->n_ctx; j0 += B) {
        int cnt = a->n_ctx - j0 < B ? a->n_ctx - j0 : B;
        int blk = a->blocks[j0 / B];
        for (int i = 0; i < cnt; i++) {
            const float *v = row(a, blk, a->v_off, i, a->stage);
            for (int qi = 0; qi < a->nq; qi++) {
                if (j0 + i > a->qpos[qi]) continue;
                float p = a->scores[(size_t)qi * a->n_ctx + j0 + i];
                float *o = a->out[qi];
                for (int e = 0; e < hd; e++) o[e] += p * v[e];
            }
        }
    }
}

attn_fn attn_get(const char *kernels_name)
{
#if defined(__x86_64__)
    if (kernels_name && strncmp(kernels_name, "avx512", 6) == 0) return attn_tile_avx512;
    if (kernels_name && strcmp(kernels_name, "avx2") == 0) return attn_tile_avx2;
#endif
    return attn_tile_c;
}
