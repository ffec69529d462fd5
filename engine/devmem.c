/* engine/devmem.c: the CUDA engine's device memory formula (engine/devmem.h). */
#include "engine/devmem.h"

#include <string.h>

#include "common/err.h"
#include "engine/sampler.h"

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

int devmem_plan(const devmem_shape_t *s, const devmem_params_t *p, devmem_t *o, char *errstr,
                size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (s->n_layers < 1 || s->n_heads < 1 || s->n_kv_heads < 1 || s->head_dim < 1 || s->dim < 1 ||
        s->ffn_dim < 1 || s->n_vocab < 1 || s->rope_dim < 0 ||
        (p->weight_elem != 2 && p->weight_elem != 4) || (p->kv_elem != 2 && p->kv_elem != 4) ||
        p->block_tokens < 1 || p->max_batch_tokens < 1 || p->max_seqs < 0 || p->max_ctx < 0 ||
        p->n_kv_blocks < 0)
        return sw_seterr(errstr, errlen, "devmem: bad shape or parameters");
    const uint64_t T = (uint64_t)p->max_batch_tokens, we = (uint64_t)p->weight_elem;
    const uint64_t dim = (uint64_t)s->dim, hd = (uint64_t)s->head_dim, ffn = (uint64_t)s->ffn_dim;
    const uint64_t qd = (uint64_t)s->n_heads * hd, kvd = (uint64_t)s->n_kv_heads * hd;
    const uint64_t qkvd = qd + 2 * kvd, V = (uint64_t)s->n_vocab, L = (uint64_t)s->n_layers;
    int allocs = 0;

    if (p->fp8 && we != 2) return sw_seterr(errstr, errlen, "devmem: fp8 takes weight_elem 2");
    /* cuBLASLt's FP8 GEMMs take K and the leading dimensions in multiples of 16 */
    if (p->fp8 && (dim % 16 || qd % 16 || ffn % 16))
        return sw_seterr(errstr, errlen, "cuda: cuda.dtype fp8 needs dim, n_heads x head_dim and "
                         "ffn_dim in multiples of 16 (%llu, %llu, %llu): use bf16",
                         (unsigned long long)dim, (unsigned long long)qd,
                         (unsigned long long)ffn);
    const uint64_t mat_elems = qkvd * dim + dim * qd + 2 * ffn * dim + dim * ffn;
    uint64_t per_layer = (p->fp8 ? mat_elems + (qkvd + dim + 2 * ffn + dim) * 4 : mat_elems * we) +
                         2 * dim * 4;
    allocs += 6 * s->n_layers + (p->fp8 ? 4 * s->n_layers : 0);
    if (s->qkv_bias) {
        per_layer += qkvd * 4;
        allocs += s->n_layers;
    }
    o->weights = per_layer * L + V * dim * we * (s->tied_output ? 1 : 2) + dim * 4 +
                 (uint64_t)(s->rope_dim / 2) * 4 + 4;
    allocs += (s->tied_output ? 1 : 2) + 2;

    o->att_partials = T * (uint64_t)s->n_heads * DEVMEM_ATT_SPLIT_SLOTS * (hd + 2) * 4;
    o->activations = T * (dim * 4 + dim * we + qkvd * 4 + qd * we + 2 * ffn * 4 + ffn * we +
                          (uint64_t)s->rope_dim * 4 + V * 4 + 4) +
                     o->att_partials;
    allocs += 10;
    if (p->fp8) {
        uint64_t kmax = dim > qd ? dim : qd;
        if (ffn > kmax) kmax = ffn;
        o->activations += T * (kmax + 4 + dim * 4);
        allocs += 3;
    }

    const uint64_t seqs = p->max_seqs > 0 ? (uint64_t)p->max_seqs : T;
    o->penalty_slots = (uint64_t)p->max_seqs > DEVMEM_MIN_PEN_SLOTS ? (uint64_t)p->max_seqs
                                                                    : DEVMEM_MIN_PEN_SLOTS;
    o->sampling = T * DEVMEM_SAMPLE_ROW_BYTES + T * (2 + 2 * (uint64_t)SAMPLER_MAX_LOGPROBS) * 4 +
                  o->penalty_slots * V * 4;
    allocs += 3;

    const uint64_t ctx = p->max_ctx > 0 ? (uint64_t)p->max_ctx
                                        : (s->ctx_len > 0 ? (uint64_t)s->ctx_len : 1);
    const uint64_t B = (uint64_t)p->block_tokens;
    o->metadata_words = 6 * T + 3 + seqs * ((ctx + B - 1) / B) + 1 + 1024;
    o->metadata = o->metadata_words * 4;
    o->workspace = DEVMEM_BLAS_WORKSPACE;
    o->upload = p->synthetic && !p->fp8 ? 0 : DEVMEM_UPLOAD_CHUNK;
    allocs += 2;
    o->kv_block = B * L * 2 * kvd * (uint64_t)p->kv_elem;
    o->kv_scratch = o->kv_block;
    o->fixed = o->weights + o->activations + o->sampling + o->metadata + o->workspace +
               o->kv_scratch;
    allocs += 1; /* the pool and the scratch block: one allocation */
    o->allocations = allocs;

    const char *keys = "lower batch.max_tokens, batch.max_seqs, ctx or kv.blocks, choose a "
                       "smaller cuda.dtype, or raise cuda.mem_fraction (a reload or a second "
                       "model needs the first engine's fraction to leave it room)";
    if (o->weights + o->workspace + o->upload > p->budget)
        return sw_seterr(errstr, errlen, "cuda: the weights do not fit: weights %.1f MiB (%s) + "
                         "cuBLAS workspace %.1f MiB + load staging %.1f MiB > budget %.1f MiB; %s",
                         mib(o->weights),
                         p->fp8 ? "fp8 layer matrices" : p->weight_elem == 2 ? "2-byte elements"
                                                                               : "4-byte elements",
                         mib(o->workspace),
                         mib(o->upload), mib(p->budget), keys);
    if (o->fixed > p->budget)
        return sw_seterr(errstr, errlen, "cuda: the model does not fit: weights %.1f MiB + "
                         "activations %.1f MiB (%d batch tokens) + sampling %.1f MiB (%llu penalty "
                         "slots) + metadata %.1f MiB + workspace %.1f MiB + KV scratch block %.2f MiB "
                         "= %.1f MiB > budget %.1f MiB; %s", mib(o->weights), mib(o->activations),
                         p->max_batch_tokens, mib(o->sampling),
                         (unsigned long long)o->penalty_slots, mib(o->metadata), mib(o->workspace),
                         mib(o->kv_scratch), mib(o->fixed), mib(p->budget), keys);
    uint64_t nb = (uint64_t)p->n_kv_blocks;
    if (nb == 0) {
        nb = (p->budget - o->fixed) / o->kv_block;
        if (nb > DEVMEM_MAX_BLOCKS) nb = DEVMEM_MAX_BLOCKS;
        if (nb < 1)
            return sw_seterr(errstr, errlen, "cuda: no room for a KV block of %.2f MiB: weights "
                             "and scratch take %.1f MiB of the %.1f MiB budget; %s",
                             mib(o->kv_block), mib(o->fixed), mib(p->budget), keys);
    } else if (o->fixed + nb * o->kv_block > p->budget) {
        return sw_seterr(errstr, errlen, "cuda: the model does not fit: weights and scratch %.1f "
                         "MiB + KV pool %.1f MiB (%llu blocks of %.2f MiB) = %.1f MiB > budget "
                         "%.1f MiB; %s", mib(o->fixed), mib(nb * o->kv_block),
                         (unsigned long long)nb, mib(o->kv_block),
                         mib(o->fixed + nb * o->kv_block), mib(p->budget), keys);
    }
    o->kv_blocks = nb;
    o->kv_pool = nb * o->kv_block;
    o->total = o->fixed + o->kv_pool;
    return 0;
}
