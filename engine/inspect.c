/* engine/inspect.c: `spillway inspect`: a human-readable report of a GGUF file. */
#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"

int engine_inspect(const char *path, FILE *out, char *errstr, size_t errlen)
{
    gguf_t *g = gguf_open(path, errstr, errlen);
    if (!g) return -1;
    fprintf(out, "file: %s\nGGUF version %u, alignment %u, %zu bytes, %lld metadata keys, %lld tensors\n",
            path, gguf_version(g), gguf_alignment(g), gguf_file_size(g), (long long)gguf_n_kv(g),
            (long long)gguf_n_tensors(g));
    fprintf(out, "\nmetadata:\n");
    char buf[512];
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_kv_format(g, i, buf, sizeof buf);
        fprintf(out, "  %-48s %s\n", gguf_kv_key(g, i), buf);
    }
    fprintf(out, "\ntensors:\n");
    uint64_t total = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);
        char shape[96];
        int n = snprintf(shape, sizeof shape, "{");
        for (int d = 0; d < t->n_dims && n < (int)sizeof shape; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%lld", d ? ", " : "", (long long)t->ne[d]);
        if (n < (int)sizeof shape) snprintf(shape + n, sizeof shape - (size_t)n, "}");
        fprintf(out, "  %-40s %-6s %-22s %12llu bytes\n", t->name, dtype_name(t->type), shape,
                (unsigned long long)t->nbytes);
        total += t->nbytes;
    }
    fprintf(out, "  total %llu bytes (%.1f MiB)\n", (unsigned long long)total, (double)total / 1048576.0);
    gguf_close(g);

    char err[256];
    model_t *m = model_load(path, err, sizeof err);
    if (!m) {
        fprintf(out, "\nthe engine cannot run this file: %s\n", err);
        return 0;
    }
    const hparams_t *hp = &m->hp;
    fprintf(out,
            "\nmodel: arch %s, vocab %d, dim %d, layers %d, heads %d, kv heads %d, head dim %d, "
            "ffn %d, context %d\n  RMSNorm eps %g, RoPE %s base %g over %d dims%s, %s output, "
            "weights mostly %s\n",
            hp->arch_name, hp->n_vocab, hp->dim, hp->n_layers, hp->n_heads, hp->n_kv_heads,
            hp->head_dim, hp->ffn_dim, hp->ctx_len, hp->norm_eps,
            hp->rope_kind == ROPE_NORM ? "norm" : "neox", hp->rope_theta, hp->rope_dim,
            hp->rope_freq_scale != 1.0f ? " (linear scaling)" : "",
            m->tied_output ? "tied" : "separate", dtype_name(m->weight_type));
    if (hp->n_expert > 0) {
        char shared[48] = "";
        if (hp->shexp_ffn_dim > 0)
            snprintf(shared, sizeof shared, ", shared expert ffn %d", hp->shexp_ffn_dim);
        fprintf(out, "  mixture of experts: %d experts of ffn %d, %d per token (weights %s)%s\n",
                hp->n_expert, hp->expert_ffn_dim, hp->n_expert_used,
                hp->moe_norm_topk ? "renormalised" : "not renormalised", shared);
    }
    if (!model_is_plain_llama(m)) {
        int n_local = 0;
        for (int l = 0; l < hp->n_layers; l++) n_local += m->layers[l].window > 0;
        fprintf(out, "  features:%s%s%s%s attention scale %g", hp->qk_norm ? " Q/K norms," : "",
                hp->post_norms ? " post-norms," : "",
                hp->ffn_act == FFN_GELU_TANH ? " GELU-tanh FFN," : "",
                hp->embd_scale != 1.0f ? " scaled embeddings," : "", hp->attn_scale);
        if (hp->attn_softcap > 0 || hp->logit_softcap > 0)
            fprintf(out, ", soft-caps %g (scores) %g (logits)", hp->attn_softcap, hp->logit_softcap);
        if (n_local)
            fprintf(out, ", sliding window %d on %d of %d layers (local RoPE base %g)",
                    hp->swa_window, n_local, hp->n_layers, hp->rope_theta_swa);
        if (m->rope[0].ext_factor != 0.0f) fprintf(out, ", YaRN");
        if (m->rope[0].mscale != 1.0f) fprintf(out, ", RoPE magnitude %g", m->rope[0].mscale);
        fprintf(out, "\n");
    }
    fprintf(out, "  KV bytes per token: %zu (f16), %zu (f32); full context: %.1f MiB (f16)\n",
            model_kv_bytes_per_token(m, 2), model_kv_bytes_per_token(m, 4),
            (double)model_kv_bytes_per_token(m, 2) * hp->ctx_len / 1048576.0);
    fprintf(out, "  fingerprint %016llx\n", (unsigned long long)m->fingerprint);
    model_free(m);
    return 0;
}
