/* cli/plan.c: `spillway plan`: how a model's memory divides between weights, the KV block pool,
 * step scratch and the host arena, computed from the model's GGUF metadata alone.
 *
 * Why not engine_new or model_load: both read every weight byte (model_load hashes all tensor data
 * for the model fingerprint; engine_new also builds the tokenizer, spawns threads and allocates
 * the KV pool and scratch), so planning a 70B model would read 140 GB. plan opens the file with
 * gguf_open (maps it and validates the header and tensor table; touches no tensor data) and reads
 * the hyper-parameters with the same keys, defaults and checks as model_load (engine/model.c):
 * that part is mirrored here and tests/test_plan.c checks the result against engine_new's real
 * allocations. Integer keys are read with model_arch_int, as model_load reads them.
 *
 * Formulas (all integers; MiB = 2^20 bytes):
 *   kv bytes/token = n_layers x 2 x n_kv_heads x head_dim x elem (f16 2, f32 4)
 *   block_bytes    = block_tokens x kv bytes/token                   (engine/engine.c)
 *   pool MiB       = --kv-mem, or (--gpu-mem - reserve - scratch - [weights]) in whole MiB
 *   blocks         = min(pool MiB x 2^20 / block_bytes, 2^30)         (engine/engine.c)
 *   ctx            = --ctx when 0 < --ctx < the model's context, else the model's; when one
 *                    sequence would not fit the pool, blocks x block_tokens (the engine caps it)
 *   seqs at ctx    = blocks / ceil(ctx / block_tokens)
 *   scratch        = activations + logits, F32:
 *                    4 x batch_tokens x (3 dim + 2 q_dim + 2 kv_dim + 2 ffn + rope_dim)
 *                    (residual, normed input, tmp; q, attention out; k, v; gate, up; rope
 *                    cos/sin: the per-token buffers of a forward step, engine/cpu/cpu_backend.c)
 *                    + with experts (n_expert > 0): 4 x batch_tokens x (k x (dim + 2 eff + 3) +
 *                    n_expert [+ 1 + 2 sff + dim with a shared expert]), k experts used per
 *                    token of eff FFN rows, sff the shared expert's (engine/cpu/moe.h)
 *                    + 4 x max_seqs x n_vocab (one logits row per running sequence, engine.c)
 *   reserve        = device runtime overhead outside the engine's buffers (CUDA context, BLAS
 *                    workspace, allocator slack): --reserve, default 512 MiB; --gpu-mem only
 *   arena slots    = the largest n with 4096 + roundup(64 n, 4096) + n x stride <= arena MiB x 2^20,
 *                    stride = block_bytes + 8 + 4 x block_tokens (the block's parent
 *                    name and token ids) rounded up to 4096               (cache/arena.c)
 *   prefix tokens  = slots x block_tokens
 *   total          = pool + scratch [+ reserve with --gpu-mem] [+ weights with --weights-on-device]
 * With --backend cuda the device figures are the CUDA backend's own: engine/devmem.h's
 * devmem_plan, the function the backend sizes and checks its allocations with (not a copy), on
 * the budget --gpu-mem (the device's free memory when the engine starts) x --mem-fraction
 * (cuda.mem_fraction); the pool is kv.blocks blocks, or what that budget leaves; total is what
 * the backend holds on the device (the CUDA context and the allocator's rounding aside).
 * A mixture-of-experts model's weights are all its experts' (all are resident; a token reads only
 * k of them). Weights count against --gpu-mem only with --weights-on-device (the CPU backend reads them in
 * place from the file mapping, i.e. host page cache, not from the pool's budget; except the
 * matrices its kernels pack on this CPU, whose copies it holds in its own memory: the
 * "cpu packed copy" row, backend_cpu_packed_bytes; none with cpu.pack false, or when the host's
 * available memory is short of them at start). */
#include <getopt.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "cache/cache.h"
#include "cli.h"
#include "engine/backend.h"
#include "engine/devmem.h"
#include "engine/dtype.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/model_arch.h"

#define PLAN_MIB (1ull << 20)
#define PLAN_RESERVE_DEFAULT (512ull << 20)
#define PLAN_MAX_BLOCKS (1ull << 30)  /* the engine's cap on a kv_mem_mb-sized pool */
#define PLAN_MAX_KV_MB (1ull << 24)   /* kv.mem_mb / --kv-mem-mb upper bound */
#define PLAN_MAX_ARENA_MB (1ull << 30) /* cache.arena.mb upper bound */
/* Arena layout constants of cache/arena.c (documented in cache/cache.h). */
#define PLAN_ARENA_HDR 4096ull
#define PLAN_ARENA_SLOT_HDR 64ull
#define PLAN_ARENA_PAGE 4096ull

/* What plan needs of a model: hyper-parameters as model_load reads them, and tensor bytes. */
typedef struct {
    char arch[32];
    int arch_supported;        /* 1: an architecture model_load runs (MODEL_ARCH_SUPPORTED) */
    int n_layers, n_heads, n_kv_heads, head_dim, dim, ffn_dim, n_vocab, ctx_len, rope_dim;
    int n_expert, n_expert_used, expert_ffn_dim, shexp_ffn_dim; /* 0 for a dense model */
    uint64_t weight_bytes;     /* sum of every tensor's bytes (as model_t.weight_bytes) */
    uint64_t by_dtype[DT_COUNT_]; /* weight_bytes split by tensor type */
    int unsupported_dtype;     /* a tensor type the engine cannot compute with (-1 none) */
    int tied_output;           /* no output.weight: the output matrix is the embedding */
    int qkv_bias;              /* layer 0 has a q, k or v bias (the CUDA backend uploads them) */
    uint64_t cpu_packed_bytes; /* the CPU backend's packed copies on this CPU
                                  (backend_cpu_packed_bytes of every matrix it packs) */
} plan_model_t;

/* Inputs (from options, engine/cache defaults) and results of one plan. */
typedef struct {
    /* inputs */
    int kv_elem;               /* 2 (f16) or 4 (f32) */
    const char *kv_type;
    int block_tokens, batch_tokens, max_seqs;
    int ctx_req;               /* --ctx; 0 = the model's */
    int on_device;             /* --weights-on-device */
    int from_gpu;              /* 1: the pool is what --gpu-mem leaves; 0: --kv-mem */
    uint64_t gpu_bytes, kv_mem_bytes, arena_bytes, reserve_bytes;
    int cuda;                  /* --backend cuda: the device figures come from devmem_plan */
    int cuda_welem;            /* --cuda-dtype's element bytes (fp8: 2, the non-layer ones) */
    int cuda_fp8;              /* --cuda-dtype fp8 */
    const char *cuda_dtype;
    float mem_fraction;        /* --mem-fraction (cuda.mem_fraction) */
    int kv_blocks;             /* --kv-blocks (kv.blocks), 0 = what the budget leaves */
    devmem_t dev;              /* --backend cuda: the backend's device memory */
    uint64_t dev_budget;       /* its budget, 0 without --gpu-mem (then kv.blocks is needed) */
    /* results */
    uint64_t kv_per_token, block_bytes;
    uint64_t act_bytes, logits_bytes, scratch_bytes;
    uint64_t kv_mem_mb, pool_bytes, blocks, tokens;
    int ctx;
    int ctx_capped;            /* 0; 1 = --ctx above the model's; 2 = the pool holds less */
    uint64_t blocks_per_seq, seqs_at_ctx;
    int kv_mb_capped;          /* 1: --gpu-mem left more than kv.mem_mb can express */
    uint64_t arena_mb, slot_bytes, arena_slots, arena_tokens, arena_used;
    uint64_t total_bytes;      /* pool + scratch [+ reserve with --gpu-mem] [+ weights on device] */
} plan_t;

/* SIZE: a decimal number with at most 6 decimals and an optional unit, case-insensitive:
 * none or B (bytes; no decimals then), K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB, all powers of
 * 1024 ("24G" = "24GiB" = 24 x 2^30). The result is rounded down to whole bytes. 0, or -1 with a
 * message naming opt. */
static int parse_size(const char *opt, const char *s, uint64_t *out)
{
    static const struct { const char *unit; int shift; } units[] = {
        {"", 0}, {"b", 0},
        {"k", 10}, {"kb", 10}, {"kib", 10},
        {"m", 20}, {"mb", 20}, {"mib", 20},
        {"g", 30}, {"gb", 30}, {"gib", 30},
        {"t", 40}, {"tb", 40}, {"tib", 40},
    };
    const char *p = s;
    int shift = -1;
    uint64_t ip = 0, frac = 0, frac_div = 1;
    int digits = 0, fdigits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (ip > (UINT64_MAX - 9) / 10) goto bad;
        ip = ip * 10 + (uint64_t)(*p - '0');
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, fdigits++) {
            if (fdigits == 6) goto bad;
            frac = frac * 10 + (uint64_t)(*p - '0');
            frac_div *= 10;
        }
        if (fdigits == 0) goto bad;
    }
    if (digits == 0) goto bad;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(p, units[i].unit)) shift = units[i].shift;
    if (shift < 0 || (shift == 0 && fdigits)) goto bad;
    if (ip > (UINT64_MAX >> shift)) goto bad;
    /* frac < 10^6 < 2^20 and shift <= 40: the product fits in 64 bits */
    uint64_t v = (ip << shift) + (frac << shift) / frac_div;
    if (v < (ip << shift)) goto bad;
    *out = v;
    return 0;
bad:
    fprintf(stderr, "spillway: %s: '%s' is not a size (e.g. 4096, 512M, 24G, 1.5GiB)\n", opt, s);
    return -1;
}

/* Mixture-of-experts keys, defaults and limits of model_load (engine/model.c moe_hparams):
 * qwen2moe and qwen3moe always have experts, llama when llama.expert_count > 0. 0, or -1 +
 * errstr. */
static int read_experts(const gguf_t *g, const char *path, plan_model_t *m, int64_t ffn,
                        char *errstr, size_t errlen)
{
    const char *a = m->arch;
    const int moe_arch = !strcmp(a, "qwen2moe") || !strcmp(a, "qwen3moe");
    int64_t ne, nu, eff, sff = 0;
    if (model_arch_int(g, a, "expert_count", 0, &ne) || ne < 0 || ne > MODEL_MAX_EXPERTS) {
        sw_seterr(errstr, errlen, "%s: %s.expert_count must be 0..%d", path, a, MODEL_MAX_EXPERTS);
        return -1;
    }
    if (ne == 0 && !moe_arch) return 0;
    if (ne == 0) {
        sw_seterr(errstr, errlen, "%s: %s without experts", path, a);
        return -1;
    }
    if (model_arch_int(g, a, "expert_used_count", 0, &nu) || nu <= 0 || nu > ne ||
        nu > MODEL_MAX_EXPERTS_USED) {
        sw_seterr(errstr, errlen, "%s: %s.expert_used_count must be 1..min(expert_count %lld, %d)",
                  path, a, (long long)ne, MODEL_MAX_EXPERTS_USED);
        return -1;
    }
    if (model_arch_int(g, a, "expert_feed_forward_length", moe_arch ? ffn / nu : ffn, &eff) ||
        eff <= 0 || eff > 1 << 20 ||
        (!strcmp(a, "qwen2moe") &&
         (model_arch_int(g, a, "expert_shared_feed_forward_length", ffn, &sff) || sff <= 0 ||
          sff > 1 << 20))) {
        sw_seterr(errstr, errlen, "%s: bad %s expert FFN size", path, a);
        return -1;
    }
    m->n_expert = (int)ne;
    m->n_expert_used = (int)nu;
    m->expert_ffn_dim = (int)eff;
    m->shexp_ffn_dim = (int)sff;
    return 0;
}

/* backend_cpu_packed_bytes of tensor t (a dense matmul of the forward pass, by name, as the CPU
 * backend binds it: the parts of a fused attn_qkv, and of phi3's ffn_up holding gate and up,
 * each on their own), or 0. */
static uint64_t cpu_packed(const gguf_t *g, const plan_model_t *m, const gguf_tensor_t *t)
{
    static const char *const dense[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                        "ffn_up", "ffn_down"};
    const int64_t rows = t->ne[1], cols = t->ne[0];
    if (t->n_dims != 2) return 0;
    if (!strcmp(t->name, "output.weight") || (m->tied_output && !strcmp(t->name, "token_embd.weight")))
        return backend_cpu_packed_bytes(t->type, rows, cols);
    int layer, n = 0;
    char what[32];
    if (sscanf(t->name, "blk.%d.%31[a-z_].weight%n", &layer, what, &n) != 2 || t->name[n] != '\0')
        return 0;
    if (!strcmp(what, "attn_qkv")) {
        const int64_t q = (int64_t)m->n_heads * m->head_dim, kv = (int64_t)m->n_kv_heads * m->head_dim;
        return backend_cpu_packed_bytes(t->type, q, cols) + 2 * backend_cpu_packed_bytes(t->type, kv, cols);
    }
    char gate[64];
    snprintf(gate, sizeof gate, "blk.%d.ffn_gate.weight", layer);
    if (!strcmp(what, "ffn_up") && !gguf_find_tensor(g, gate) && rows == 2 * (int64_t)m->ffn_dim)
        return 2 * backend_cpu_packed_bytes(t->type, m->ffn_dim, cols);
    for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++)
        if (!strcmp(what, dense[i])) return backend_cpu_packed_bytes(t->type, rows, cols);
    return 0;
}

/* Reads path's hyper-parameters (keys, defaults and limits of model_load) and tensor bytes into
 * m. Maps the file only while reading; touches no tensor data. 0, or -1 + errstr. */
static int read_model(const char *path, plan_model_t *m, char *errstr, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->unsupported_dtype = -1;
    gguf_t *g = gguf_open(path, errstr, errlen);
    if (!g) return -1;
    gguf_str_t arch;
    if (gguf_get_str(g, "general.architecture", &arch) != 0) {
        sw_seterr(errstr, errlen, "%s: general.architecture is missing", path);
        goto fail;
    }
    size_t alen = arch.len < sizeof m->arch ? (size_t)arch.len : sizeof m->arch - 1;
    memcpy(m->arch, arch.ptr, alen);
    m->arch[alen] = 0;
    {
        hparams_t h;
        memset(&h, 0, sizeof h);
        snprintf(h.arch_name, sizeof h.arch_name, "%s", m->arch);
        m->arch_supported = model_arch_lookup(&h) == 0; /* the table model_load uses */
    }
    const char *a = m->arch;
    int64_t dim, n_layers, n_heads, n_kv, ffn, ctx, key_len, val_len, rope_dim;
    if (model_arch_int(g, a, "embedding_length", 0, &dim) || dim <= 0 || dim > 65536 ||
        model_arch_int(g, a, "block_count", 0, &n_layers) || n_layers <= 0 || n_layers > 1024 ||
        model_arch_int(g, a, "attention.head_count", 0, &n_heads) || n_heads <= 0 ||
        n_heads > 1024) {
        sw_seterr(errstr, errlen, "%s: %s.embedding_length, .block_count and .attention.head_count "
                  "must be present and positive", path, a);
        goto fail;
    }
    if (model_arch_int(g, a, "attention.head_count_kv", n_heads, &n_kv) || n_kv <= 0 ||
        n_heads % n_kv) {
        sw_seterr(errstr, errlen, "%s: %s.attention.head_count_kv must divide head_count (%lld)",
                  path, a, (long long)n_heads);
        goto fail;
    }
    if (model_arch_int(g, a, "feed_forward_length", 0, &ffn) || ffn <= 0 || ffn > 1 << 20) {
        sw_seterr(errstr, errlen, "%s: %s.feed_forward_length must be present and positive", path, a);
        goto fail;
    }
    if (model_arch_int(g, a, "context_length", 2048, &ctx) || ctx <= 0) ctx = 2048;
    if (model_arch_int(g, a, "attention.key_length", dim / n_heads, &key_len) || key_len <= 0 ||
        key_len % 2 || key_len > 1024) {
        sw_seterr(errstr, errlen, "%s: bad head dimension (%s.attention.key_length)", path, a);
        goto fail;
    }
    if (model_arch_int(g, a, "attention.value_length", key_len, &val_len) || val_len != key_len) {
        sw_seterr(errstr, errlen, "%s: key and value head dimensions differ; not supported", path);
        goto fail;
    }
    if (model_arch_int(g, a, "rope.dimension_count", key_len, &rope_dim) || rope_dim <= 0 ||
        rope_dim > key_len || rope_dim % 2) {
        sw_seterr(errstr, errlen, "%s: bad %s.rope.dimension_count", path, a);
        goto fail;
    }
    const gguf_tensor_t *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[0] != dim || te->ne[1] <= 0 || te->ne[1] > (1 << 24)) {
        sw_seterr(errstr, errlen, "%s: tensor 'token_embd.weight' is missing or not {%lld, vocab}",
                  path, (long long)dim);
        goto fail;
    }
    m->dim = (int)dim;
    m->n_layers = (int)n_layers;
    m->n_heads = (int)n_heads;
    m->n_kv_heads = (int)n_kv;
    m->head_dim = (int)key_len;
    m->ffn_dim = (int)ffn;
    m->ctx_len = ctx > INT32_MAX / 2 ? INT32_MAX / 2 : (int)ctx;
    m->rope_dim = (int)rope_dim;
    m->n_vocab = (int)te->ne[1];
    m->tied_output = gguf_find_tensor(g, "output.weight") == NULL;
    m->qkv_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") || gguf_find_tensor(g, "blk.0.attn_k.bias") ||
                  gguf_find_tensor(g, "blk.0.attn_v.bias");
    if (read_experts(g, path, m, ffn, errstr, errlen)) goto fail;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);
        m->weight_bytes += t->nbytes;
        if (t->type >= 0 && t->type < DT_COUNT_) m->by_dtype[t->type] += t->nbytes;
        if (!dtype_supported(t->type) && m->unsupported_dtype < 0) m->unsupported_dtype = t->type;
        if (m->n_expert == 0 || strstr(t->name, "attn_") || !strncmp(t->name, "output", 6) ||
            !strncmp(t->name, "token_embd", 10))
            m->cpu_packed_bytes += cpu_packed(g, m, t);
    }
    gguf_close(g);
    return 0;
fail:
    gguf_close(g);
    return -1;
}

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* cache/arena.c's slot count for an arena of total bytes and slots of stride bytes. */
static uint64_t arena_slots_that_fit(uint64_t total, uint64_t stride)
{
    if (total <= PLAN_ARENA_HDR) return 0;
    uint64_t n = (total - PLAN_ARENA_HDR) / (stride + PLAN_ARENA_SLOT_HDR);
    while (n > 0 && PLAN_ARENA_HDR + round_up(n * PLAN_ARENA_SLOT_HDR, PLAN_ARENA_PAGE) +
                            n * stride > total)
        n--;
    return n > INT32_MAX ? INT32_MAX : n;
}

/* Fills p's results from m and p's inputs. 0, or -1 + errstr when the KV pool gets no block
 * (the engine would refuse to start). */
static int plan_compute(const plan_model_t *m, plan_t *p, char *errstr, size_t errlen)
{
    p->kv_per_token = (uint64_t)m->n_layers * 2 * (uint64_t)m->n_kv_heads *
                      (uint64_t)m->head_dim * (uint64_t)p->kv_elem;
    p->block_bytes = (uint64_t)p->block_tokens * p->kv_per_token;

    const uint64_t q_dim = (uint64_t)m->n_heads * (uint64_t)m->head_dim;
    const uint64_t kv_dim = (uint64_t)m->n_kv_heads * (uint64_t)m->head_dim;
    p->act_bytes = 4ull * (uint64_t)p->batch_tokens *
                   (3ull * (uint64_t)m->dim + 2 * q_dim + 2 * kv_dim + 2ull * (uint64_t)m->ffn_dim +
                    (uint64_t)m->rope_dim);
    if (m->n_expert > 0)
        p->act_bytes += 4ull * (uint64_t)p->batch_tokens *
                        ((uint64_t)m->n_expert_used *
                             ((uint64_t)m->dim + 2ull * (uint64_t)m->expert_ffn_dim + 3) +
                         (uint64_t)m->n_expert +
                         (m->shexp_ffn_dim > 0
                              ? 1 + 2ull * (uint64_t)m->shexp_ffn_dim + (uint64_t)m->dim
                              : 0));
    p->logits_bytes = 4ull * (uint64_t)p->max_seqs * (uint64_t)m->n_vocab;
    p->scratch_bytes = p->act_bytes + p->logits_bytes;

    if (p->cuda) {
        const devmem_shape_t sh = {
            .n_layers = m->n_layers, .n_heads = m->n_heads, .n_kv_heads = m->n_kv_heads,
            .head_dim = m->head_dim, .dim = m->dim, .ffn_dim = m->ffn_dim, .n_vocab = m->n_vocab,
            .rope_dim = m->rope_dim, .ctx_len = m->ctx_len, .tied_output = m->tied_output,
            .qkv_bias = m->qkv_bias,
        };
        /* as backend_cuda_new: free x mem_fraction in double, the engine's context limit */
        p->dev_budget = p->from_gpu ? (uint64_t)((double)p->gpu_bytes * (double)p->mem_fraction)
                                    : UINT64_MAX / 2;
        const devmem_params_t dp = {
            .weight_elem = p->cuda_welem, .kv_elem = p->kv_elem, .block_tokens = p->block_tokens,
            .max_batch_tokens = p->batch_tokens, .max_seqs = p->max_seqs,
            .max_ctx = p->ctx_req > 0 && p->ctx_req < m->ctx_len ? p->ctx_req : m->ctx_len,
            .n_kv_blocks = p->kv_blocks, .budget = p->dev_budget, .fp8 = p->cuda_fp8,
        };
        if (devmem_plan(&sh, &dp, &p->dev, errstr, errlen)) return -1;
        if (!p->from_gpu) p->dev_budget = 0;
    } else if (p->from_gpu) {
        uint64_t need = p->reserve_bytes + p->scratch_bytes + (p->on_device ? m->weight_bytes : 0);
        if (p->gpu_bytes < need + PLAN_MIB) {
            sw_seterr(errstr, errlen,
                      "--gpu-mem %llu bytes leaves no MiB for the KV pool: %s%llu bytes of scratch "
                      "and %llu of reserve take %llu",
                      (unsigned long long)p->gpu_bytes, p->on_device ? "the weights, " : "",
                      (unsigned long long)p->scratch_bytes, (unsigned long long)p->reserve_bytes,
                      (unsigned long long)need);
            return -1;
        }
        p->kv_mem_mb = (p->gpu_bytes - need) / PLAN_MIB;
        if (p->kv_mem_mb > PLAN_MAX_KV_MB) {
            p->kv_mem_mb = PLAN_MAX_KV_MB;
            p->kv_mb_capped = 1;
        }
    } else {
        p->kv_mem_mb = p->kv_mem_bytes / PLAN_MIB;
    }
    p->blocks = p->cuda ? p->dev.kv_blocks : p->kv_mem_mb * PLAN_MIB / p->block_bytes;
    if (p->blocks > PLAN_MAX_BLOCKS) p->blocks = PLAN_MAX_BLOCKS;
    if (p->blocks < 1) {
        sw_seterr(errstr, errlen, "a KV pool of %llu MiB holds no block of %llu bytes",
                  (unsigned long long)p->kv_mem_mb, (unsigned long long)p->block_bytes);
        return -1;
    }
    p->pool_bytes = p->blocks * p->block_bytes;
    p->total_bytes = p->pool_bytes + p->scratch_bytes + (p->from_gpu ? p->reserve_bytes : 0) +
                     (p->on_device ? m->weight_bytes : 0);
    if (p->cuda) {
        p->kv_mem_mb = p->pool_bytes / PLAN_MIB;
        p->total_bytes = p->dev.total;
    }
    p->tokens = p->blocks * (uint64_t)p->block_tokens;

    p->ctx = m->ctx_len;
    if (p->ctx_req > 0 && p->ctx_req < m->ctx_len) p->ctx = p->ctx_req;
    else if (p->ctx_req > m->ctx_len) p->ctx_capped = 1;
    p->blocks_per_seq = ((uint64_t)p->ctx + (uint64_t)p->block_tokens - 1) / (uint64_t)p->block_tokens;
    if (p->blocks_per_seq > p->blocks) { /* engine_new: one sequence must fit */
        p->ctx = (int)(p->blocks * (uint64_t)p->block_tokens);
        p->blocks_per_seq = p->blocks;
        p->ctx_capped = 2;
    }
    p->seqs_at_ctx = p->blocks / p->blocks_per_seq;

    p->arena_mb = p->arena_bytes / PLAN_MIB;
    p->slot_bytes = round_up(p->block_bytes + 8 + 4 * (uint64_t)p->block_tokens, PLAN_ARENA_PAGE);
    p->arena_slots = arena_slots_that_fit(p->arena_mb * PLAN_MIB, p->slot_bytes);
    p->arena_tokens = p->arena_slots * (uint64_t)p->block_tokens;
    p->arena_used = p->arena_slots
                        ? PLAN_ARENA_HDR + round_up(p->arena_slots * PLAN_ARENA_SLOT_HDR, PLAN_ARENA_PAGE) +
                              p->arena_slots * p->slot_bytes
                        : 0;
    return 0;
}

/* "1.5 GiB"-style rendering of n bytes into buf. */
static const char *human(uint64_t n, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, len, "%llu B", (unsigned long long)n);
    else snprintf(buf, len, "%.1f %s", v, unit[u]);
    return buf;
}

#define ROW(label, ...)                        \
    do {                                       \
        fprintf(out, "%-18s ", label);         \
        fprintf(out, __VA_ARGS__);             \
        fputc('\n', out);                      \
    } while (0)

static void print_table(FILE *out, const char *path, const plan_model_t *m, const plan_t *p)
{
    char h1[32], h2[32], h3[32];
    ROW("model", "%s", path);
    ROW("", "%s: %d layers, %d heads, %d kv heads, head dim %d, dim %d, ffn %d, vocab %d, "
        "context %d", m->arch, m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim, m->dim,
        m->ffn_dim, m->n_vocab, m->ctx_len);
    if (m->n_expert > 0) {
        char shared[48] = "";
        if (m->shexp_ffn_dim > 0)
            snprintf(shared, sizeof shared, ", shared expert ffn %d", m->shexp_ffn_dim);
        ROW("", "mixture of experts: %d experts of ffn %d, %d used per token%s; all resident",
            m->n_expert, m->expert_ffn_dim, m->n_expert_used, shared);
    }
    ROW("weights", "%14llu B  %10s  %s", (unsigned long long)m->weight_bytes,
        human(m->weight_bytes, h1, sizeof h1), p->on_device ? "on the device" : "on the host");
    for (int t = 0; t < DT_COUNT_; t++)
        if (m->by_dtype[t]) {
            char label[32];
            snprintf(label, sizeof label, "  %s", dtype_name(t));
            ROW(label, "%14llu B  %10s", (unsigned long long)m->by_dtype[t],
                human(m->by_dtype[t], h1, sizeof h1));
        }
    if (m->cpu_packed_bytes && !p->on_device)
        ROW("  cpu packed copy", "%14llu B  %10s  host memory the CPU kernels copy those of the "
            "matrices they pack into", (unsigned long long)m->cpu_packed_bytes,
            human(m->cpu_packed_bytes, h1, sizeof h1));
    ROW("KV per token", "%14llu B  %10s  %d layers x 2 x %d kv heads x %d x %d B (%s)",
        (unsigned long long)p->kv_per_token, human(p->kv_per_token, h1, sizeof h1), m->n_layers,
        m->n_kv_heads, m->head_dim, p->kv_elem, p->kv_type);
    ROW("KV per block", "%14llu B  %10s  %d tokens", (unsigned long long)p->block_bytes,
        human(p->block_bytes, h1, sizeof h1), p->block_tokens);
    ROW("scratch (est.)", "%14llu B  %10s  activations %s (%d batch tokens) + logits %s (%d seqs)",
        (unsigned long long)p->scratch_bytes, human(p->scratch_bytes, h1, sizeof h1),
        human(p->act_bytes, h2, sizeof h2), p->batch_tokens,
        human(p->logits_bytes, h3, sizeof h3), p->max_seqs);
    if (p->cuda) {
        const devmem_t *d = &p->dev;
        ROW("cuda device", "%s weights, cuda.mem_fraction %.2f", p->cuda_dtype,
            (double)p->mem_fraction);
        if (p->from_gpu)
            ROW("  budget", "%14llu B  %10s  --gpu-mem (free) x --mem-fraction",
                (unsigned long long)p->dev_budget, human(p->dev_budget, h1, sizeof h1));
        ROW("  weights", "%14llu B  %10s", (unsigned long long)d->weights,
            human(d->weights, h1, sizeof h1));
        ROW("  activations", "%14llu B  %10s  %d batch tokens", (unsigned long long)d->activations,
            human(d->activations, h1, sizeof h1), p->batch_tokens);
        ROW("  sampling", "%14llu B  %10s  %llu penalty slots", (unsigned long long)d->sampling,
            human(d->sampling, h1, sizeof h1), (unsigned long long)d->penalty_slots);
        ROW("  block tables", "%14llu B  %10s", (unsigned long long)d->metadata,
            human(d->metadata, h1, sizeof h1));
        ROW("  workspace", "%14llu B  %10s  cuBLAS", (unsigned long long)d->workspace,
            human(d->workspace, h1, sizeof h1));
        ROW("  KV scratch", "%14llu B  %10s  1 block after the pool (CUDA-graph padding)",
            (unsigned long long)d->kv_scratch, human(d->kv_scratch, h1, sizeof h1));
        ROW("  KV pool", "%14llu B  %10s  %llu blocks%s", (unsigned long long)d->kv_pool,
            human(d->kv_pool, h1, sizeof h1), (unsigned long long)d->kv_blocks,
            p->kv_blocks ? " (kv.blocks)" : " (what the budget leaves)");
        ROW("  device total", "%14llu B  %10s  in %d allocations (+ CUDA context; %s load "
            "staging while weights load)", (unsigned long long)d->total,
            human(d->total, h1, sizeof h1), d->allocations, human(d->upload, h2, sizeof h2));
    } else if (p->from_gpu) {
        ROW("device memory", "%14llu B  %10s  --gpu-mem", (unsigned long long)p->gpu_bytes,
            human(p->gpu_bytes, h1, sizeof h1));
        ROW("  reserve", "%14llu B  %10s  runtime overhead (--reserve)",
            (unsigned long long)p->reserve_bytes, human(p->reserve_bytes, h1, sizeof h1));
    }
    ROW("KV pool", "%14llu B  %10s  kv.mem_mb %llu%s", (unsigned long long)p->pool_bytes,
        human(p->pool_bytes, h1, sizeof h1), (unsigned long long)p->kv_mem_mb,
        p->from_gpu ? (p->kv_mb_capped ? " (what --gpu-mem leaves, capped at kv.mem_mb's maximum)"
                                       : " (what --gpu-mem leaves)")
                    : "");
    ROW("  blocks", "%14llu", (unsigned long long)p->blocks);
    ROW("  tokens", "%14llu", (unsigned long long)p->tokens);
    ROW("  context", "%14d     tokens, %llu blocks per sequence%s", p->ctx,
        (unsigned long long)p->blocks_per_seq,
        p->ctx_capped == 1 ? " (--ctx is above the model's context: capped to it)"
        : p->ctx_capped == 2 ? " (capped by the engine: the pool holds no more)"
                             : "");
    ROW("  sequences", "%14llu     at that context at once (engine max_seqs %d)",
        (unsigned long long)p->seqs_at_ctx, p->max_seqs);
    if (p->cuda)
        ROW("total", "%14llu B  %10s  the CUDA engine's device memory",
            (unsigned long long)p->total_bytes, human(p->total_bytes, h1, sizeof h1));
    else
        ROW("total", "%14llu B  %10s  KV pool + scratch%s%s", (unsigned long long)p->total_bytes,
            human(p->total_bytes, h1, sizeof h1), p->from_gpu ? " + reserve" : "",
            p->on_device ? " + weights" : "");
    ROW("host arena", "%14llu B  %10s  cache.arena.mb %llu", (unsigned long long)(p->arena_mb * PLAN_MIB),
        human(p->arena_mb * PLAN_MIB, h1, sizeof h1), (unsigned long long)p->arena_mb);
    ROW("  slots", "%14llu     of %llu B (block + its tokens, rounded up to 4096)%s",
        (unsigned long long)p->arena_slots, (unsigned long long)p->slot_bytes,
        p->arena_slots ? "" : ": too small for one slot, tier 2 cannot start");
    ROW("  prefix tokens", "%14llu", (unsigned long long)p->arena_tokens);
    if (!m->arch_supported)
        fprintf(out, "note: the engine does not run architecture '%s' (supported: %s)\n", m->arch,
                MODEL_ARCH_SUPPORTED);
    if (m->unsupported_dtype >= 0)
        fprintf(out, "note: the engine does not compute with tensor type %s (supported: %s)\n",
                dtype_name(m->unsupported_dtype), DTYPE_SUPPORTED_LIST);
}
#undef ROW

static json_t *jint(uint64_t v) { return json_integer((json_int_t)v); }

/* Builds the --json document (see cli_plan's help for its fields). NULL when out of memory. */
static json_t *plan_json(const char *path, const plan_model_t *m, const plan_t *p)
{
    json_t *root = json_object();
    json_t *jm = json_object(), *jw = json_object(), *jd = json_object(), *jk = json_object(),
           *js = json_object(), *jp = json_object(), *ja = json_object();
    json_t *jc = p->cuda ? json_object() : json_null();
    if (!root || !jm || !jw || !jd || !jk || !js || !jp || !ja || !jc) goto fail;
    if (p->cuda) {
        const devmem_t *d = &p->dev;
        int ec = 0;
        ec |= json_object_set_new(jc, "dtype", json_string(p->cuda_dtype));
        ec |= json_object_set_new(jc, "mem_fraction", json_real((double)p->mem_fraction));
        ec |= json_object_set_new(jc, "budget_bytes",
                                  p->from_gpu ? jint(p->dev_budget) : json_null());
        ec |= json_object_set_new(jc, "weights_bytes", jint(d->weights));
        ec |= json_object_set_new(jc, "activation_bytes", jint(d->activations));
        ec |= json_object_set_new(jc, "sampling_bytes", jint(d->sampling));
        ec |= json_object_set_new(jc, "penalty_slots", jint(d->penalty_slots));
        ec |= json_object_set_new(jc, "block_table_bytes", jint(d->metadata));
        ec |= json_object_set_new(jc, "workspace_bytes", jint(d->workspace));
        ec |= json_object_set_new(jc, "upload_bytes", jint(d->upload));
        ec |= json_object_set_new(jc, "kv_scratch_bytes", jint(d->kv_scratch));
        ec |= json_object_set_new(jc, "kv_blocks", jint(d->kv_blocks));
        ec |= json_object_set_new(jc, "kv_pool_bytes", jint(d->kv_pool));
        ec |= json_object_set_new(jc, "total_bytes", jint(d->total));
        ec |= json_object_set_new(jc, "allocations", jint((uint64_t)d->allocations));
        if (ec) goto fail;
    }
    int e = 0;
    e |= json_object_set_new(jm, "path", json_string(path));
    e |= json_object_set_new(jm, "arch", json_string(m->arch));
    e |= json_object_set_new(jm, "engine_supported",
                             json_boolean(m->arch_supported && m->unsupported_dtype < 0));
    e |= json_object_set_new(jm, "n_layers", jint((uint64_t)m->n_layers));
    e |= json_object_set_new(jm, "n_heads", jint((uint64_t)m->n_heads));
    e |= json_object_set_new(jm, "n_kv_heads", jint((uint64_t)m->n_kv_heads));
    e |= json_object_set_new(jm, "head_dim", jint((uint64_t)m->head_dim));
    e |= json_object_set_new(jm, "dim", jint((uint64_t)m->dim));
    e |= json_object_set_new(jm, "ffn_dim", jint((uint64_t)m->ffn_dim));
    e |= json_object_set_new(jm, "n_vocab", jint((uint64_t)m->n_vocab));
    e |= json_object_set_new(jm, "ctx_len", jint((uint64_t)m->ctx_len));
    e |= json_object_set_new(jm, "n_expert", jint((uint64_t)m->n_expert));
    e |= json_object_set_new(jm, "n_expert_used", jint((uint64_t)m->n_expert_used));
    e |= json_object_set_new(jm, "expert_ffn_dim", jint((uint64_t)m->expert_ffn_dim));
    e |= json_object_set_new(jm, "shexp_ffn_dim", jint((uint64_t)m->shexp_ffn_dim));

    for (int t = 0; t < DT_COUNT_; t++)
        if (m->by_dtype[t]) e |= json_object_set_new(jd, dtype_name(t), jint(m->by_dtype[t]));
    e |= json_object_set_new(jw, "bytes", jint(m->weight_bytes));
    e |= json_object_set_new(jw, "by_dtype", jd);
    jd = NULL;
    e |= json_object_set_new(jw, "on_device", json_boolean(p->on_device));
    e |= json_object_set_new(jw, "cpu_packed_bytes", jint(m->cpu_packed_bytes));

    e |= json_object_set_new(jk, "type", json_string(p->kv_type));
    e |= json_object_set_new(jk, "elem_bytes", jint((uint64_t)p->kv_elem));
    e |= json_object_set_new(jk, "bytes_per_token", jint(p->kv_per_token));
    e |= json_object_set_new(jk, "block_tokens", jint((uint64_t)p->block_tokens));
    e |= json_object_set_new(jk, "block_bytes", jint(p->block_bytes));

    e |= json_object_set_new(js, "batch_tokens", jint((uint64_t)p->batch_tokens));
    e |= json_object_set_new(js, "max_seqs", jint((uint64_t)p->max_seqs));
    e |= json_object_set_new(js, "activation_bytes", jint(p->act_bytes));
    e |= json_object_set_new(js, "logits_bytes", jint(p->logits_bytes));
    e |= json_object_set_new(js, "bytes", jint(p->scratch_bytes));

    e |= json_object_set_new(jp, "from", json_string(p->from_gpu ? "gpu-mem" : "kv-mem"));
    e |= json_object_set_new(jp, "gpu_mem_bytes", p->from_gpu ? jint(p->gpu_bytes) : json_null());
    e |= json_object_set_new(jp, "reserve_bytes",
                             p->from_gpu ? jint(p->reserve_bytes) : json_null());
    e |= json_object_set_new(jp, "kv_mem_mb", jint(p->kv_mem_mb));
    e |= json_object_set_new(jp, "bytes", jint(p->pool_bytes));
    e |= json_object_set_new(jp, "blocks", jint(p->blocks));
    e |= json_object_set_new(jp, "tokens", jint(p->tokens));
    e |= json_object_set_new(jp, "ctx", jint((uint64_t)p->ctx));
    e |= json_object_set_new(jp, "ctx_capped", json_string(p->ctx_capped == 1   ? "model"
                                                           : p->ctx_capped == 2 ? "pool"
                                                                                : "no"));
    e |= json_object_set_new(jp, "blocks_per_seq", jint(p->blocks_per_seq));
    e |= json_object_set_new(jp, "max_seqs_at_ctx", jint(p->seqs_at_ctx));

    e |= json_object_set_new(ja, "mb", jint(p->arena_mb));
    e |= json_object_set_new(ja, "slot_bytes", jint(p->slot_bytes));
    e |= json_object_set_new(ja, "slots", jint(p->arena_slots));
    e |= json_object_set_new(ja, "prefix_tokens", jint(p->arena_tokens));
    e |= json_object_set_new(ja, "bytes_used", jint(p->arena_used));

    /* json_object_set_new steals the value even when it fails */
    e |= json_object_set_new(root, "model", jm);
    jm = NULL;
    e |= json_object_set_new(root, "weights", jw);
    jw = NULL;
    e |= json_object_set_new(root, "kv", jk);
    jk = NULL;
    e |= json_object_set_new(root, "scratch", js);
    js = NULL;
    e |= json_object_set_new(root, "pool", jp);
    jp = NULL;
    e |= json_object_set_new(root, "arena", ja);
    ja = NULL;
    e |= json_object_set_new(root, "cuda", jc);
    jc = NULL;
    e |= json_object_set_new(root, "total_bytes", jint(p->total_bytes));
    if (e) goto fail;
    return root;
fail:
    json_decref(jc);
    json_decref(ja);
    json_decref(jp);
    json_decref(js);
    json_decref(jk);
    json_decref(jd);
    json_decref(jw);
    json_decref(jm);
    json_decref(root);
    return NULL;
}

/* The table default of worker key name, as text. */
static const char *key_default(const char *name)
{
    worker_config_key_t k;
    return worker_config_key(worker_config_find_key(name), &k) ? "?" : k.def;
}

static void plan_usage(FILE *f)
{
    fprintf(f,
            "usage: spillway plan -m MODEL [options]\n"
            "Memory plan of MODEL from its GGUF metadata (no tensor data is read):\n"
            "weights, KV bytes per token and block, the KV pool's blocks, tokens and sequences\n"
            "at a context, step scratch, and the host arena's slots and prefix tokens.\n"
            "  -m, --model FILE     GGUF model\n"
            "  --kv-mem SIZE        KV pool size (default kv.mem_mb, %s MiB)\n"
            "  --gpu-mem SIZE       size the pool from device memory instead: SIZE minus the\n"
            "                       scratch estimate, --reserve and, with --weights-on-device,\n"
            "                       the weights (not with --kv-mem)\n"
            "  --weights-on-device  the weights take device memory too\n"
            "  --reserve SIZE       device runtime overhead for --gpu-mem (default 512M)\n"
            "  --host-arena SIZE    tier-2 host arena size (default cache.arena.mb, %s MiB)\n"
            "  --backend cuda       the CUDA engine's device memory (engine/devmem.h): with\n"
            "                       --gpu-mem the device's free memory, the budget is it x\n"
            "                       --mem-fraction; the pool is --kv-blocks blocks or what the\n"
            "                       budget leaves (one of --gpu-mem, --kv-blocks is needed)\n"
            "  --mem-fraction F     cuda.mem_fraction (default %s)\n"
            "  --cuda-dtype T       cuda.dtype: bf16, f16, f32 or fp8 (default %s)\n"
            "  --kv-blocks N        kv.blocks: a fixed pool (with --backend cuda)\n",
            key_default("kv.mem_mb"), key_default("cache.arena.mb"),
            key_default("cuda.mem_fraction"), key_default("cuda.dtype"));
    /* the engine flags, with their keys' help, defaults and ranges */
    cli_key_help(f, "--ctx N", "ctx", NULL);
    cli_key_help(f, "--block-tokens B", "kv.block_tokens", NULL);
    cli_key_help(f, "--kv-type T", "kv.type", NULL);
    cli_key_help(f, "--batch-tokens N", "batch.max_tokens", "tokens per forward step, for the scratch");
    cli_key_help(f, "--max-seqs N", "batch.max_seqs", "sequences at once, for the scratch");
    fprintf(f,
            "  --json               one JSON object: model {arch, dims, n_expert, n_expert_used,\n"
            "                       expert_ffn_dim, shexp_ffn_dim, ...},\n"
            "                       weights {bytes, by_dtype, on_device},\n"
            "                       kv {bytes_per_token, block_bytes, ...}, scratch {bytes, ...},\n"
            "                       pool {kv_mem_mb, bytes, blocks, tokens, ctx, max_seqs_at_ctx,\n"
            "                       ...}, arena {mb, slot_bytes, slots, prefix_tokens, ...},\n"
            "                       cuda {weights_bytes, activation_bytes, sampling_bytes,\n"
            "                       block_table_bytes, workspace_bytes, kv_scratch_bytes,\n"
            "                       kv_blocks, kv_pool_bytes, total_bytes, allocations,\n"
            "                       budget_bytes, ...} or null,\n"
            "                       total_bytes (pool + scratch [+ reserve] [+ device weights];\n"
            "                       with --backend cuda, cuda.total_bytes)\n"
            "SIZE: bytes, or a number with K, M, G or T (powers of 1024; KB, KiB the same),\n"
            "e.g. 512M, 24G, 1.5GiB. Pool and arena sizes are used in whole MiB, as the engine's\n"
            "kv.mem_mb and cache.arena.mb are.\n");
}

int cli_plan(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"gpu-mem", required_argument, 0, 5001},
        {"host-arena", required_argument, 0, 5002},
        {"kv-mem", required_argument, 0, 5003},
        {"weights-on-device", no_argument, 0, 5004},
        {"reserve", required_argument, 0, 5005},
        {"json", no_argument, 0, 5006},
        {"mem-fraction", required_argument, 0, 5007},
        {"backend", required_argument, 0, 1010},
        {"cuda-dtype", required_argument, 0, 1012},
        {"kv-blocks", required_argument, 0, 1007},
        {"help", no_argument, 0, 'h'},
        /* validated by cli_engine_opt, as for generate */
        {"kv-type", required_argument, 0, 1002},
        {"block-tokens", required_argument, 0, 1003},
        {"batch-tokens", required_argument, 0, 1004},
        {"max-seqs", required_argument, 0, 1005},
        {"ctx", required_argument, 0, 1008},
        {0, 0, 0, 0},
    };
    engine_config_t ec;
    engine_config_default(&ec);
    cache_config_t cc;
    cache_config_default(&cc);
    plan_t p;
    memset(&p, 0, sizeof p);
    p.kv_mem_bytes = (uint64_t)ec.kv_mem_mb * PLAN_MIB;
    p.arena_bytes = (uint64_t)cc.arena_mb * PLAN_MIB;
    p.reserve_bytes = PLAN_RESERVE_DEFAULT;
    int have_kv_mem = 0, json = 0, opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1) {
        int r = cli_engine_opt(&ec, opt, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (opt) {
        case 'm': ec.model_path = optarg; break;
        case 5001:
            if (parse_size("--gpu-mem", optarg, &p.gpu_bytes)) return 2;
            p.from_gpu = 1;
            break;
        case 5002: if (parse_size("--host-arena", optarg, &p.arena_bytes)) return 2; break;
        case 5003:
            if (parse_size("--kv-mem", optarg, &p.kv_mem_bytes)) return 2;
            have_kv_mem = 1;
            break;
        case 5004: p.on_device = 1; break;
        case 5005: if (parse_size("--reserve", optarg, &p.reserve_bytes)) return 2; break;
        case 5006: json = 1; break;
        case 5007: {
            char *end = NULL;
            ec.cuda_mem_fraction = strtof(optarg, &end);
            if (end == optarg || *end || !(ec.cuda_mem_fraction > 0.0f) ||
                ec.cuda_mem_fraction > 1.0f) {
                fprintf(stderr, "spillway: plan: --mem-fraction must be in (0, 1] "
                        "(cuda.mem_fraction)\n");
                return 2;
            }
            break;
        }
        case 'h': plan_usage(stdout); return 0;
        default: return 2;
        }
    }
    if (!ec.model_path || optind != argc) {
        fprintf(stderr, "usage: spillway plan -m MODEL [options] (see --help)\n");
        return 2;
    }
    if (have_kv_mem && p.from_gpu) {
        fprintf(stderr, "spillway: plan: give --kv-mem or --gpu-mem, not both\n");
        return 2;
    }
    if (!p.from_gpu && (p.kv_mem_bytes < PLAN_MIB || p.kv_mem_bytes / PLAN_MIB > PLAN_MAX_KV_MB)) {
        fprintf(stderr, "spillway: plan: --kv-mem must be 1 MiB .. %llu MiB (kv.mem_mb)\n",
                (unsigned long long)PLAN_MAX_KV_MB);
        return 2;
    }
    if (p.arena_bytes < PLAN_MIB || p.arena_bytes / PLAN_MIB > PLAN_MAX_ARENA_MB) {
        fprintf(stderr, "spillway: plan: --host-arena must be 1 MiB .. %llu MiB (cache.arena.mb)\n",
                (unsigned long long)PLAN_MAX_ARENA_MB);
        return 2;
    }
    if (ec.max_seqs > ec.max_batch_tokens) {
        fprintf(stderr, "spillway: plan: --max-seqs (%d) must not exceed --batch-tokens (%d)\n",
                ec.max_seqs, ec.max_batch_tokens);
        return 2;
    }
    if (strcmp(ec.backend, "cuda") == 0) {
        p.cuda = 1;
        p.cuda_dtype = ec.cuda_dtype;
        p.cuda_welem = strcmp(ec.cuda_dtype, "f32") == 0 ? 4 : 2;
        p.cuda_fp8 = strcmp(ec.cuda_dtype, "fp8") == 0;
        if (strcmp(ec.cuda_dtype, "bf16") && strcmp(ec.cuda_dtype, "f16") &&
            strcmp(ec.cuda_dtype, "f32") && !p.cuda_fp8) {
            fprintf(stderr, "spillway: plan: --cuda-dtype must be bf16, f16, f32 or fp8\n");
            return 2;
        }
        p.mem_fraction = ec.cuda_mem_fraction;
        p.kv_blocks = ec.kv_blocks;
        if (!p.from_gpu && !p.kv_blocks) {
            fprintf(stderr, "spillway: plan: --backend cuda needs --gpu-mem (the device's free "
                    "memory) or --kv-blocks\n");
            return 2;
        }
    } else if (strcmp(ec.backend, "cpu") != 0) {
        fprintf(stderr, "spillway: plan: --backend must be cpu or cuda\n");
        return 2;
    } else if (ec.kv_blocks) {
        fprintf(stderr, "spillway: plan: --kv-blocks goes with --backend cuda (use --kv-mem)\n");
        return 2;
    }
    p.kv_type = ec.kv_type;
    p.kv_elem = strcmp(ec.kv_type, "f32") == 0 ? 4 : 2;
    p.block_tokens = ec.block_tokens;
    p.batch_tokens = ec.max_batch_tokens;
    p.max_seqs = ec.max_seqs;
    p.ctx_req = ec.max_ctx;

    char err[512];
    plan_model_t *m = malloc(sizeof *m);
    json_t *doc = NULL;
    int rc = 1;
    if (!m) {
        fprintf(stderr, "spillway: plan: out of memory\n");
        goto done;
    }
    if (read_model(ec.model_path, m, err, sizeof err) || plan_compute(m, &p, err, sizeof err)) {
        fprintf(stderr, "spillway: plan: %s\n", err);
        goto done;
    }
    if (json) {
        doc = plan_json(ec.model_path, m, &p);
        if (!doc || json_dumpf(doc, stdout, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "spillway: plan: cannot write JSON\n");
            goto done;
        }
        fputc('\n', stdout);
    } else {
        print_table(stdout, ec.model_path, m, &p);
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    json_decref(doc);
    free(m);
    return rc;
}
