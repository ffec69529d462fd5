/* tests/test_devmem.c: the CUDA engine's device memory formula (engine/devmem.h) and
 * `spillway plan --backend cuda --json`, which must print that formula's figures.
 *
 * For each model and setting, plan's cuda section is compared field by field with devmem_plan
 * fed by the real loader (model_load: its hyper-parameters, tied output and biases, as
 * backend_cuda_new feeds it), so plan's GGUF metadata mirror and its option handling are
 * checked, not the formula against itself. The formula is checked on its own by facts that do
 * not use it: the KV block is model_kv_bytes_per_token x block_tokens (what every backend
 * allocates); with F32 device weights of an all-F32 file the weights are the file's tensor bytes
 * plus the RoPE table; a pool sized from the budget is the largest block count that fits; the
 * refusals name the sizes and the key to change; and the CUDA-graph path's buffers (the scratch
 * KV block after the pool, the metadata buffer a padded decode step uploads into) and the
 * split-K attention scratch hold what the backend's rules need (check_graph_buffers). No device
 * is needed (what the backend really allocates is compared with plan on a device by
 * scripts/gpu-check.sh and test_cuda).
 * The spillway binary: $SPILLWAY_BIN, else ./spillway. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "support/run_cmd.h"
#include "engine/devmem.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "tools/mkmodel.h"

typedef struct {
    const char *args;    /* plan options beyond -m, --json and --backend cuda */
    int welem, kv_elem, block_tokens, batch_tokens, max_seqs, ctx, kv_blocks;
    double gpu_bytes;    /* 0: none (kv_blocks given) */
    float fraction;
    int fp8;             /* --cuda-dtype fp8 */
} dcase_t;

static long long jget(const json_t *j, const char *key)
{
    const json_t *v = json_object_get(json_object_get(j, "cuda"), key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

/* The buffers of the CUDA-graph decode path and the split-K attention, by what the backend
 * (engine/cuda/cuda_backend.c) needs of them, not by the formula: the scratch KV block the
 * padding tokens write (one block after the pool, in the same allocation: one more block than
 * the engine sees is in total), the metadata buffer a padded decode step uploads into (5 T
 * per-token words, the T + 3 words of the attention tiles, every sequence's full block table
 * and the padding's one-block table), and the attention partials of every batch size (t
 * tokens, T x DEVMEM_ATT_SPLIT_SLOTS / t chunk partials of head_dim + 2 floats per (token,
 * head), at least 1). */
static void check_graph_buffers(const model_t *m, const dcase_t *dc, const devmem_params_t *dp,
                                const devmem_t *d, const char *args)
{
    const hparams_t *hp = &m->hp;
    const uint64_t blk = (uint64_t)dc->block_tokens *
                         model_kv_bytes_per_token(m, (size_t)dc->kv_elem);
    CHECKF(d->kv_scratch == blk, "%s: scratch block %llu, a KV block is %llu", args,
           (unsigned long long)d->kv_scratch, (unsigned long long)blk);
    CHECKF(d->total == d->weights + d->activations + d->sampling + d->metadata + d->workspace +
                           (d->kv_blocks + 1) * blk,
           "%s: total %llu does not hold the pool and the graphs' scratch block", args,
           (unsigned long long)d->total);
    const uint64_t T = (uint64_t)dc->batch_tokens, B = (uint64_t)dc->block_tokens;
    const uint64_t seqs = dc->max_seqs > 0 ? (uint64_t)dc->max_seqs : T;
    const uint64_t ctx = (uint64_t)dp->max_ctx;
    CHECKF(d->metadata == d->metadata_words * 4 &&
               d->metadata_words >= 6 * T + 3 + seqs * ((ctx + B - 1) / B) + 1,
           "%s: metadata %llu words cannot hold a padded decode step", args,
           (unsigned long long)d->metadata_words);
    uint64_t need = 0;
    for (uint64_t t = 1; t <= T; t++) {
        uint64_t n = T * DEVMEM_ATT_SPLIT_SLOTS / t;
        if (n < 1) n = 1;
        const uint64_t b = t * (uint64_t)hp->n_heads * n * ((uint64_t)hp->head_dim + 2) * 4;
        if (b > need) need = b;
    }
    CHECKF(need > 0 && need <= d->att_partials, "%s: attention scratch %llu, a batch needs %llu",
           args, (unsigned long long)d->att_partials, (unsigned long long)need);
    CHECKF(d->att_partials < d->activations, "%s: the attention scratch is not in activations",
           args);
}

static void check_model(const char *bin, const char *path, int all_f32, const dcase_t *dc)
{
    char err[512], args[768], *out = malloc(1 << 16);
    if (!out) abort();
    model_t *m = model_load(path, err, sizeof err);
    CHECKF(m, "%s: %s", path, err);
    if (!m) {
        free(out);
        return;
    }
    const hparams_t *hp = &m->hp;
    const devmem_shape_t sh = {
        .n_layers = hp->n_layers, .n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads,
        .head_dim = hp->head_dim, .dim = hp->dim, .ffn_dim = hp->ffn_dim, .n_vocab = hp->n_vocab,
        .rope_dim = hp->rope_dim, .ctx_len = hp->ctx_len, .tied_output = m->tied_output,
        .qkv_bias = m->layers[0].bq.data || m->layers[0].bk.data || m->layers[0].bv.data,
    };
    const uint64_t budget =
        dc->gpu_bytes > 0 ? (uint64_t)(dc->gpu_bytes * (double)dc->fraction) : UINT64_MAX / 2;
    const devmem_params_t dp = {
        .weight_elem = dc->welem, .kv_elem = dc->kv_elem, .block_tokens = dc->block_tokens,
        .max_batch_tokens = dc->batch_tokens, .max_seqs = dc->max_seqs,
        .max_ctx = dc->ctx > 0 && dc->ctx < hp->ctx_len ? dc->ctx : hp->ctx_len,
        .n_kv_blocks = dc->kv_blocks, .budget = budget, .fp8 = dc->fp8,
    };
    devmem_t d;
    int frc = devmem_plan(&sh, &dp, &d, err, sizeof err);
    if (dc->fp8) {
        /* fp8 by the model's own matrices: BF16's weights less a byte an element of the four
         * layer matrices, plus a 4-byte scale a row */
        devmem_params_t bp = dp;
        devmem_t db;
        bp.fp8 = 0;
        const int brc = devmem_plan(&sh, &bp, &db, err, sizeof err);
        uint64_t el = 0, rows = 0;
        for (int l = 0; l < hp->n_layers; l++) {
            const layer_weights_t *L = &m->layers[l];
            const weight_t *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                     &L->w_down};
            for (int i = 0; i < 7; i++) {
                el += (uint64_t)ws[i]->rows * (uint64_t)ws[i]->cols;
                rows += (uint64_t)ws[i]->rows;
            }
        }
        const int mult16 = hp->dim % 16 == 0 && (hp->n_heads * hp->head_dim) % 16 == 0 &&
                           hp->ffn_dim % 16 == 0;
        CHECKF(mult16 ? frc == 0 && brc == 0 && d.weights == db.weights - el + rows * 4
                      : frc != 0 && strstr(err, "multiples of 16"),
               "%s: fp8 weights %llu, bf16 %llu, %llu layer elements, %llu rows (%s)", path,
               (unsigned long long)d.weights, (unsigned long long)db.weights,
               (unsigned long long)el, (unsigned long long)rows, frc ? err : "");
        if (!mult16) snprintf(err, sizeof err, "fp8: dims not multiples of 16");
    }
    snprintf(args, sizeof args, "plan --json --backend cuda -m '%s' %s 2>/dev/null", path,
             dc->args);
    int rc = tr_run_cmd(bin, args, out, 1 << 16);
    if (frc) {
        CHECKF(rc == 1, "%s: the formula refuses (%s) but plan exits %d", args, err, rc);
        goto done;
    }
    CHECKF(rc == 0, "%s: exit %d", args, rc);
    json_error_t je;
    json_t *j = rc == 0 ? json_loads(out, 0, &je) : NULL;
    CHECKF(j, "%s: bad JSON", args);
    if (!j) goto done;
    static const char *const keys[] = {"weights_bytes", "activation_bytes", "sampling_bytes",
                                       "penalty_slots", "block_table_bytes", "workspace_bytes",
                                       "upload_bytes", "kv_scratch_bytes", "kv_blocks",
                                       "kv_pool_bytes", "total_bytes", "allocations"};
    const uint64_t want[] = {d.weights, d.activations, d.sampling, d.penalty_slots, d.metadata,
                             d.workspace, d.upload, d.kv_scratch, d.kv_blocks, d.kv_pool,
                             d.total, (uint64_t)d.allocations};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        CHECKF(jget(j, keys[k]) == (long long)want[k], "%s: cuda.%s %lld, formula %llu", args,
               keys[k], jget(j, keys[k]), (unsigned long long)want[k]);
    const json_t *tot = json_object_get(j, "total_bytes");
    CHECKF(json_is_integer(tot) && (uint64_t)json_integer_value(tot) == d.total,
           "%s: total_bytes is not cuda.total_bytes", args);
    CHECKF(json_integer_value(json_object_get(json_object_get(j, "pool"), "blocks")) ==
               (json_int_t)d.kv_blocks, "%s: pool.blocks is not the device pool's", args);
    json_decref(j);

    /* the formula by facts that do not use it */
    CHECKF(d.kv_block == (uint64_t)dc->block_tokens *
                             model_kv_bytes_per_token(m, (size_t)dc->kv_elem),
           "%s: KV block %llu", path, (unsigned long long)d.kv_block);
    if (all_f32 && dc->welem == 4)
        CHECKF(d.weights == m->weight_bytes + (uint64_t)(hp->rope_dim / 2) * 4 + 4,
               "%s: F32 weights %llu, file %zu", path, (unsigned long long)d.weights,
               m->weight_bytes);
    if (dc->kv_blocks == 0)
        CHECKF(d.fixed + d.kv_blocks * d.kv_block <= budget &&
                   d.fixed + (d.kv_blocks + 1) * d.kv_block > budget,
               "%s: %llu blocks are not what the budget leaves", args,
               (unsigned long long)d.kv_blocks);
    else
        CHECK(d.kv_blocks == (uint64_t)dc->kv_blocks);
    CHECK(d.total == d.fixed + d.kv_pool && d.kv_pool == d.kv_blocks * d.kv_block);
    check_graph_buffers(m, dc, &dp, &d, args);
done:
    model_free(m);
    free(out);
}

/* A budget that cannot hold the model: the formula and plan refuse, naming the key. */
static void check_refusals(const char *bin, const char *path)
{
    char args[768], out[4096];
    snprintf(args, sizeof args, "plan --backend cuda -m '%s' --gpu-mem 40M 2>&1", path);
    CHECKF(tr_run_cmd(bin, args, out, sizeof out) == 1 && strstr(out, "cuda.mem_fraction") &&
               strstr(out, "MiB"), "%s:\n%s", args, out);
    snprintf(args, sizeof args,
             "plan --backend cuda -m '%s' --gpu-mem 2G --mem-fraction 0.5 --kv-blocks 100000 2>&1",
             path);
    CHECKF(tr_run_cmd(bin, args, out, sizeof out) == 1 && strstr(out, "KV pool") &&
               strstr(out, "kv.blocks"), "%s:\n%s", args, out);
    snprintf(args, sizeof args, "plan --backend cuda -m '%s' 2>&1", path);
    CHECKF(tr_run_cmd(bin, args, out, sizeof out) == 2 && strstr(out, "--kv-blocks"), "%s:\n%s",
           args, out);
    snprintf(args, sizeof args, "plan --backend cuda --mem-fraction 1.5 -m '%s' --kv-blocks 8 2>&1",
             path);
    CHECKF(tr_run_cmd(bin, args, out, sizeof out) == 2, "%s:\n%s", args, out);
    snprintf(args, sizeof args, "plan --backend cuda -m '%s' --gpu-mem 2G", path);
    CHECKF(tr_run_cmd(bin, args, out, sizeof out) == 0 && strstr(out, "device total") &&
               strstr(out, "what the budget leaves"), "table:\n%s", out);
}

int main(void)
{
    const char *bin = getenv("SPILLWAY_BIN") ? getenv("SPILLWAY_BIN") : "./spillway";
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "test_devmem: no spillway binary at %s (set SPILLWAY_BIN): skipped\n", bin);
        return 77;
    }
    char dir[64] = "/tmp/spillway-devmem-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char err[256], tiny[128], untied[128], qwen[128], smol[128];
    snprintf(tiny, sizeof tiny, "%s/tiny.gguf", dir);
    snprintf(untied, sizeof untied, "%s/tiny-untied-f32.gguf", dir);
    snprintf(qwen, sizeof qwen, "%s/qwen2-tiny.gguf", dir);
    snprintf(smol, sizeof smol, "%s/smollm2.gguf", dir);
    mkmodel_params_t p;
    mkmodel_preset("tiny", &p);
    CHECKF(mkmodel_write(&p, tiny, err, sizeof err) == 0, "%s", err);
    mkmodel_preset("tiny", &p);
    p.dtype = DT_F32;
    p.tied = 0;
    CHECKF(mkmodel_write(&p, untied, err, sizeof err) == 0, "%s", err);
    mkmodel_preset("qwen2-tiny", &p); /* q/k/v biases */
    CHECKF(mkmodel_write(&p, qwen, err, sizeof err) == 0, "%s", err);
    mkmodel_preset("smollm2-135m", &p);
    CHECKF(mkmodel_write(&p, smol, err, sizeof err) == 0, "%s", err);

    static const dcase_t cases[] = {
        {"--kv-blocks 64", 2, 2, 16, 512, 64, 0, 64, 0, 0.9f, 0},
        {"--kv-blocks 300 --cuda-dtype f32 --kv-type f32 --block-tokens 32 --batch-tokens 128 "
         "--max-seqs 16 --ctx 200", 4, 4, 32, 128, 16, 200, 300, 0, 0.9f, 0},
        {"--gpu-mem 1G", 2, 2, 16, 512, 64, 0, 0, 1073741824.0, 0.9f, 0},
        {"--gpu-mem 3.5G --mem-fraction 0.45 --cuda-dtype f16 --batch-tokens 2048 --max-seqs 256",
         2, 2, 16, 2048, 256, 0, 0, 3758096384.0, 0.45f, 0},
        {"--gpu-mem 900M --mem-fraction 0.3 --cuda-dtype f32 --block-tokens 7 --ctx 100000", 4, 2,
         7, 512, 64, 100000, 0, 943718400.0, 0.3f, 0},
        {"--kv-blocks 64 --cuda-dtype fp8", 2, 2, 16, 512, 64, 0, 64, 0, 0.9f, 1},
        {"--gpu-mem 1G --cuda-dtype fp8 --batch-tokens 256", 2, 2, 16, 256, 64, 0, 0,
         1073741824.0, 0.9f, 1},
    };
    const struct { const char *path; int all_f32; } models[] = {
        {SPILLWAY_MODELS "/stories260K.gguf", 1}, {tiny, 0}, {untied, 1}, {qwen, 0}, {smol, 0},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        if (access(models[i].path, R_OK) != 0) {
            fprintf(stderr, "test_devmem: %s missing: skipped\n", models[i].path);
            continue;
        }
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            check_model(bin, models[i].path, models[i].all_f32, &cases[k]);
    }
    check_refusals(bin, smol);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_devmem: could not remove %s\n", dir);
    return check_exit();
}
