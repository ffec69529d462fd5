/* tests/test_plan.c: `spillway plan --json` against what the engine and the cache really allocate.
 *
 * plan reads only GGUF metadata and computes with its own copy of the formulas; every number it
 * prints is compared here with a number taken from the engine or the cache, never with the same
 * formula recomputed:
 *   - hyper-parameters, kv.block_bytes, pool.blocks, pool.ctx, weights.bytes,
 *     weights.cpu_packed_bytes: engine_new's engine_info (the backend's kv_block_bytes,
 *     n_kv_blocks and host_packed_bytes -- what it allocated for packed copies on this CPU; none
 *     with cpu_pack 0 --,
 *     model_load's weight_bytes, the engine's context limit);
 *   - kv.bytes_per_token: `spillway inspect` (model_load + model_kv_bytes_per_token), f16 and f32;
 *   - pool.max_seqs_at_ctx: that many sequences of blocks_per_seq blocks are allocated from the
 *     engine's pool (engine_raw_alloc_blocks) and one more sequence is refused;
 *   - pool.bytes, scratch.activation_bytes, scratch.logits_bytes: the growth of the process's
 *     mapped memory (VmSize) between two live engines that differ only in kv_mem_mb, in
 *     max_batch_tokens or in max_seqs, within 1% (the pool is malloc'd but never touched here, so
 *     it raises VmSize, not RSS; threads = 1 so no thread stacks appear);
 *   - arena.slots, arena.mb: cache_new (tier 2 off, arena mapped) in a temporary folder: its
 *     cache_stats arena_slots and the arena file's size;
 *   - --gpu-mem: the pool's kv_mem_mb given to the engine gives the planned blocks, and the
 *     budget adds up (kv_mem_mb MiB <= gpu - scratch - reserve - [weights] < one MiB more).
 * Models: stories260K and the arch-fixtures qwen3, gemma2, gemma3, phi3 (shared), mkmodel presets
 * tiny, qwen2-tiny, tiny, phi3 and qwen2moe in q8_0 (packed copies), smollm2-135m in f16 (VmSize checks: blocks of 360 KiB), a
 * qwen2moe and a Mixtral-style llama (mixture of experts: hyper-parameters and every case) and a
 * qwen2moe of smollm2's shapes (2 layers, for the VmSize checks of the expert scratch), and two
 * rewrites of tiny that take model_load's other
 * metadata paths: no head_count_kv and no context_length keys (defaults n_heads and 2048), and
 * head_count_kv as a per-layer array.
 * The spillway binary: $SPILLWAY_BIN, else ./spillway (ctest runs tests in the build folder). */
#include <errno.h>
#include <jansson.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/cache.h"
#include "check.h"
#include "support/run_cmd.h"
#include "engine/dtype.h"
#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "tools/gguf_write.h"
#include "tools/mkmodel.h"

#define MIB (1ll << 20)

typedef struct {
    const char *bin;   /* spillway binary */
    char dir[64];      /* temporary folder (models, arena) */
} ctx_t;

/* `spillway plan --json -m model args`, parsed; NULL (and a failed check) when it fails. */
static json_t *plan(const ctx_t *c, const char *model, const char *args)
{
    char cmdargs[768], *out = malloc(1 << 16);
    if (!out) return NULL;
    snprintf(cmdargs, sizeof cmdargs, "plan --json -m '%s' %s", model, args);
    int rc = tr_run_cmd(c->bin, cmdargs, out, 1 << 16);
    CHECKF(rc == 0, "spillway %s: exit %d", cmdargs, rc);
    json_error_t je;
    json_t *j = rc == 0 ? json_loads(out, 0, &je) : NULL;
    CHECKF(rc != 0 || j, "spillway %s: bad JSON: %s", cmdargs, rc == 0 ? je.text : "");
    free(out);
    return j;
}

/* Integer at "a.b" in j (-1 when absent or not an integer). */
static long long jget(const json_t *j, const char *sect, const char *key)
{
    const json_t *v = json_object_get(json_object_get(j, sect), key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static long long vm_size(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static engine_config_t base_cfg(const char *model)
{
    engine_config_t cfg;
    engine_config_default(&cfg);
    cfg.model_path = model;
    cfg.threads = 1;
    return cfg;
}

/* engine_new(cfg); *grown gets the VmSize growth it caused. */
static engine_t *engine_measured(const engine_config_t *cfg, long long *grown)
{
    char err[256];
    long long before = vm_size();
    engine_t *e = engine_new(cfg, err, sizeof err);
    *grown = vm_size() - before;
    CHECKF(e, "engine_new %s: %s", cfg->model_path, err);
    return e;
}

static int within_1pct(long long got, long long want)
{
    long long d = got > want ? got - want : want - got;
    return want > 0 && d * 100 <= want;
}

/* ---- GGUF rewriting (metadata variants the presets do not produce) ---- */

/* Copies src to dst, leaving out the keys in drop[0..n_drop) and, when arr_key is set, writing
 * that (integer) key as an INT32 array of n_arr copies of its value. 0 or -1. */
static int gguf_rewrite(const char *src, const char *dst, const char *const *drop, int n_drop,
                        const char *arr_key, int n_arr)
{
    char err[256];
    gguf_t *g = gguf_open(src, err, sizeof err);
    gguf_writer_t *w = gguf_writer_new();
    int rc = -1;
    if (!g || !w || gguf_writer_set_alignment(w, gguf_alignment(g))) goto done;
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        int skip = 0;
        for (int d = 0; d < n_drop; d++) skip |= !strcmp(key, drop[d]);
        if (skip) continue;
        int64_t iv;
        if (arr_key && !strcmp(key, arr_key)) {
            int32_t a[64];
            if (gguf_get_i64(g, key, &iv) || n_arr > 64) goto done;
            for (int k = 0; k < n_arr; k++) a[k] = (int32_t)iv;
            if (gguf_writer_add_arr(w, key, GGUF_INT32, a, (uint64_t)n_arr)) goto done;
        } else if (gguf_writer_copy_kv(w, g, i)) {
            goto done;
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);
        if (gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data)) goto done;
    }
    rc = gguf_writer_write(w, dst);
done:
    if (rc) fprintf(stderr, "gguf_rewrite %s: %s\n", src, w ? gguf_writer_errstr(w) : err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

/* ---- one plan against one engine ---- */

typedef struct {
    const char *args;  /* plan options besides --json -m */
    int kv_mem_mb;     /* what the engine gets; 0: the plan's pool.kv_mem_mb (--gpu-mem) */
    int block_tokens;  /* 0: default */
    const char *kv_type;
    int ctx;           /* engine max_ctx (as --ctx); 0 default */
    int on_device;     /* --weights-on-device given */
    int arena;         /* 1: also check the arena with cache_new */
} pcase_t;

/* "KV bytes per token: N (f16), M (f32)" from `spillway inspect model`; 0 ok. */
static int inspect_kv(const ctx_t *c, const char *model, long long *f16, long long *f32)
{
    char args[512], *out = malloc(1 << 20);
    if (!out) return -1;
    snprintf(args, sizeof args, "inspect '%s'", model);
    int rc = tr_run_cmd(c->bin, args, out, 1 << 20);
    const char *p = rc == 0 ? strstr(out, "KV bytes per token: ") : NULL;
    int ok = p && sscanf(p, "KV bytes per token: %lld (f16), %lld (f32)", f16, f32) == 2;
    free(out);
    return ok ? 0 : -1;
}

static void check_case(const ctx_t *c, const char *model, const pcase_t *pc, int case_no)
{
    json_t *j = plan(c, model, pc->args);
    if (!j) return;
    const char *what = pc->args;
    engine_config_t cfg = base_cfg(model);
    cfg.kv_mem_mb = pc->kv_mem_mb ? pc->kv_mem_mb : (int)jget(j, "pool", "kv_mem_mb");
    if (pc->block_tokens) cfg.block_tokens = pc->block_tokens;
    if (pc->kv_type) cfg.kv_type = pc->kv_type;
    cfg.max_ctx = pc->ctx;
    CHECKF(jget(j, "pool", "kv_mem_mb") == cfg.kv_mem_mb, "%s %s: kv_mem_mb %lld, want %d", model,
           what, jget(j, "pool", "kv_mem_mb"), cfg.kv_mem_mb);
    char err[256];
    engine_t *e = engine_new(&cfg, err, sizeof err);
    CHECKF(e, "engine_new %s: %s", model, err);
    if (!e) goto done;
    engine_info_t in;
    engine_info(e, &in);

    CHECKF(jget(j, "model", "n_layers") == in.n_layers && jget(j, "model", "n_heads") == in.n_heads &&
               jget(j, "model", "n_kv_heads") == in.n_kv_heads &&
               jget(j, "model", "head_dim") == in.head_dim && jget(j, "model", "dim") == in.dim &&
               jget(j, "model", "ffn_dim") == in.ffn_dim && jget(j, "model", "n_vocab") == in.n_vocab,
           "%s: hyper-parameters differ from the engine's (kv heads %lld vs %d)", model,
           jget(j, "model", "n_kv_heads"), in.n_kv_heads);
    CHECKF(jget(j, "weights", "bytes") == (long long)in.weight_bytes, "%s: weights %lld vs engine %zu",
           model, jget(j, "weights", "bytes"), in.weight_bytes);
    long long sum = 0;
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(json_object_get(j, "weights"), "by_dtype"), k, v)
        sum += json_integer_value(v);
    CHECKF(sum == (long long)in.weight_bytes, "%s: by_dtype sums to %lld", model, sum);
    CHECKF(jget(j, "weights", "cpu_packed_bytes") == (long long)in.host_packed_bytes,
           "%s: cpu_packed_bytes %lld vs the CPU backend's %llu", model,
           jget(j, "weights", "cpu_packed_bytes"), (unsigned long long)in.host_packed_bytes);
    CHECKF(jget(j, "kv", "block_bytes") == (long long)in.kv_block_bytes,
           "%s %s: block_bytes %lld vs engine %zu", model, what, jget(j, "kv", "block_bytes"),
           in.kv_block_bytes);
    CHECKF(jget(j, "kv", "block_tokens") == in.block_tokens, "%s: block_tokens", model);
    CHECKF(jget(j, "kv", "bytes_per_token") * in.block_tokens == (long long)in.kv_block_bytes,
           "%s: bytes_per_token %lld", model, jget(j, "kv", "bytes_per_token"));
    long long i16, i32;
    CHECKF(inspect_kv(c, model, &i16, &i32) == 0, "%s: spillway inspect", model);
    const json_t *ktype = json_object_get(json_object_get(j, "kv"), "type");
    long long want_tok = json_is_string(ktype) && !strcmp(json_string_value(ktype), "f32") ? i32 : i16;
    CHECKF(jget(j, "kv", "bytes_per_token") == want_tok, "%s %s: bytes_per_token %lld vs inspect %lld",
           model, what, jget(j, "kv", "bytes_per_token"), want_tok);
    CHECKF(jget(j, "pool", "blocks") == in.kv_blocks, "%s %s: blocks %lld vs engine %d", model, what,
           jget(j, "pool", "blocks"), in.kv_blocks);
    CHECKF(jget(j, "pool", "bytes") == (long long)in.kv_blocks * (long long)in.kv_block_bytes,
           "%s: pool bytes", model);
    CHECKF(jget(j, "pool", "tokens") == (long long)in.kv_blocks * in.block_tokens, "%s: tokens", model);
    CHECKF(jget(j, "pool", "ctx") == in.ctx_len, "%s %s: ctx %lld vs engine %d", model, what,
           jget(j, "pool", "ctx"), in.ctx_len);

    /* max_seqs_at_ctx sequences of blocks_per_seq blocks fit in the engine's pool; one more not */
    long long per = jget(j, "pool", "blocks_per_seq"), seqs = jget(j, "pool", "max_seqs_at_ctx");
    CHECKF(per == (in.ctx_len + in.block_tokens - 1) / in.block_tokens, "%s: blocks_per_seq %lld",
           model, per);
    int32_t *blk = per > 0 && seqs > 0 ? malloc(sizeof *blk * (size_t)(per * seqs + per)) : NULL;
    CHECK(blk);
    if (blk) {
        /* engine_raw_alloc_blocks allocates all or nothing */
        int fit = engine_raw_alloc_blocks(e, (int)(per * seqs), blk) == 0;
        CHECKF(fit, "%s %s: %lld sequences of %lld blocks do not fit", model, what, seqs, per);
        if (fit) {
            int more = engine_raw_alloc_blocks(e, (int)per, blk + per * seqs) == 0;
            CHECKF(!more, "%s %s: room for more than %lld sequences", model, what, seqs);
            engine_raw_free_blocks(e, (int)(per * seqs + (more ? per : 0)), blk);
        }
        free(blk);
    }

    if (pc->arena) {
        char path[128];
        snprintf(path, sizeof path, "%s/arena.%d", c->dir, case_no);
        cache_config_t cc;
        cache_config_default(&cc);
        cc.arena_path = path;
        cc.arena_mb = (long)jget(j, "arena", "mb");
        cc.log_level = 0;
        cache_geometry_t geo = {in.kv_seed, in.block_tokens, in.kv_block_bytes};
        cache_t *cache = cache_new(&cc, &geo, err, sizeof err);
        long long slots = jget(j, "arena", "slots");
        CHECKF(cache || slots == 0, "cache_new %s: %s", path, err);
        CHECKF(!cache == (slots == 0), "%s: arena slots %lld but cache_new %s", model, slots,
               cache ? "succeeded" : "failed");
        if (cache) {
            cache_stats_t st;
            cache_stats(cache, &st);
            CHECKF(st.arena_slots == slots, "%s %s: arena slots %lld vs cache %d", model, what,
                   slots, st.arena_slots);
            CHECKF(jget(j, "arena", "prefix_tokens") == (long long)st.arena_slots * in.block_tokens,
                   "%s: prefix_tokens", model);
            struct stat sb;
            CHECKF(stat(path, &sb) == 0 && sb.st_size == jget(j, "arena", "mb") * MIB,
                   "%s: arena file size", path);
            CHECKF(jget(j, "arena", "bytes_used") <= jget(j, "arena", "mb") * MIB, "bytes_used");
            cache_free(cache);
        }
        unlink(path);
    }

    if (jget(j, "pool", "gpu_mem_bytes") > 0) { /* --gpu-mem: the budget adds up */
        long long left = jget(j, "pool", "gpu_mem_bytes") - jget(j, "pool", "reserve_bytes") -
                         jget(j, "scratch", "bytes") -
                         (pc->on_device ? jget(j, "weights", "bytes") : 0);
        CHECKF(jget(j, "pool", "kv_mem_mb") * MIB <= left && left < (jget(j, "pool", "kv_mem_mb") + 1) * MIB,
               "%s %s: gpu budget: %lld MiB for %lld bytes left", model, what,
               jget(j, "pool", "kv_mem_mb"), left);
        const json_t *tb = json_object_get(j, "total_bytes");
        CHECKF(json_is_integer(tb) && json_integer_value(tb) <= jget(j, "pool", "gpu_mem_bytes") &&
                   json_integer_value(tb) == jget(j, "pool", "gpu_mem_bytes") - left +
                                                 jget(j, "pool", "bytes"),
               "%s %s: total_bytes", model, what);
    }
    engine_free(e);
done:
    json_decref(j);
}

/* VmSize growth of live engines that differ in one setting against the plan's figure; the
 * logits buffer only when logits (the engine's growth beyond it, 0.4-1.0 MiB from other
 * allocations, was 0.4% of it on smollm2 but 1.1% on the 2-layer MoE model measured after it). */
static void check_vm(const ctx_t *c, const char *model, int logits)
{
    /* plans first: popen and JSON parsing allocate */
    json_t *pa = plan(c, model, "--kv-mem 16M");
    json_t *pb = plan(c, model, "--kv-mem 528M");
    json_t *pt = plan(c, model, "--kv-mem 16M --batch-tokens 4608");
    json_t *ps = plan(c, model, "--kv-mem 16M --max-seqs 512");
    if (!pa || !pb || !pt || !ps) goto done;
    engine_config_t a = base_cfg(model), b = a, t = a, s = a;
    a.kv_mem_mb = t.kv_mem_mb = s.kv_mem_mb = 16;
    b.kv_mem_mb = 528;
    t.max_batch_tokens = 4608;
    s.max_seqs = 512;
    long long ga, gb, gt, gs;
    engine_t *ea = engine_measured(&a, &ga);
    engine_t *eb = engine_measured(&b, &gb);
    engine_t *et = engine_measured(&t, &gt);
    engine_t *es = engine_measured(&s, &gs);
    long long want_pool = jget(pb, "pool", "bytes") - jget(pa, "pool", "bytes");
    long long want_act = jget(pt, "scratch", "activation_bytes") - jget(pa, "scratch", "activation_bytes");
    long long want_log = jget(ps, "scratch", "logits_bytes") - jget(pa, "scratch", "logits_bytes");
    fprintf(stderr, "%s: VmSize growth: pool %lld (plan %lld), activations %lld (plan %lld), "
            "logits %lld (plan %lld)\n", model, gb - ga, want_pool, gt - ga, want_act, gs - ga,
            want_log);
    CHECKF(ea && eb && within_1pct(gb - ga, want_pool), "pool: VmSize +%lld, plan +%lld",
           gb - ga, want_pool);
    CHECKF(ea && et && within_1pct(gt - ga, want_act), "activations: VmSize +%lld, plan +%lld",
           gt - ga, want_act);
    CHECKF(ea && es && (!logits || within_1pct(gs - ga, want_log)),
           "logits: VmSize +%lld, plan +%lld", gs - ga, want_log);
    engine_free(es);
    engine_free(et);
    engine_free(eb);
    engine_free(ea);
done:
    json_decref(ps);
    json_decref(pt);
    json_decref(pb);
    json_decref(pa);
}

/* Options: sizes, exclusions, exit codes, the table. */
static void check_cli(const ctx_t *c, const char *model)
{
    static const struct { const char *arg; long long mb; } sizes[] = {
        {"--kv-mem 512M", 512}, {"--kv-mem 1.5GiB", 1536}, {"--kv-mem 1073741824", 1024},
        {"--kv-mem 0.5g", 512}, {"--kv-mem 2048K", 2}, {"--kv-mem 3MB", 3},
        {"--kv-mem 1048577", 1}, {"--kv-mem 1.25M", 1},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        json_t *j = plan(c, model, sizes[i].arg);
        CHECKF(j && jget(j, "pool", "kv_mem_mb") == sizes[i].mb, "%s: kv_mem_mb %lld, want %lld",
               sizes[i].arg, j ? jget(j, "pool", "kv_mem_mb") : -1, sizes[i].mb);
        json_decref(j);
    }
    json_t *j = plan(c, model, "--host-arena 24G");
    CHECKF(j && jget(j, "arena", "mb") == 24 * 1024, "--host-arena 24G");
    json_decref(j);
    static const struct { const char *args; int rc; } bad[] = {
        {"--kv-mem 12X", 2}, {"--kv-mem 1.5", 2}, {"--kv-mem -1M", 2}, {"--kv-mem 1.1234567G", 2},
        {"--kv-mem 512K", 2}, {"--kv-mem 1G --gpu-mem 8G", 2}, {"--kv-type f8", 2},
        {"--block-tokens 0", 2}, {"--max-seqs 600", 2}, {"--host-arena 100K", 2},
        {"--gpu-mem 100M", 1}, {"--gpu-mem 99999999999999999999", 2}, {"extra", 2},
    };
    char args[512], out[8192];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "plan -m '%s' %s 2>/dev/null", model, bad[i].args);
        int rc = tr_run_cmd(c->bin, args, out, sizeof out);
        CHECKF(rc == bad[i].rc, "plan %s: exit %d, want %d", bad[i].args, rc, bad[i].rc);
    }
    CHECKF(tr_run_cmd(c->bin, "plan 2>/dev/null", out, sizeof out) == 2, "plan without -m");
    CHECKF(tr_run_cmd(c->bin, "plan -m /nonexistent.gguf 2>/dev/null", out, sizeof out) == 1, "missing file");
    CHECKF(tr_run_cmd(c->bin, "plan --help", out, sizeof out) == 0 && strstr(out, "--gpu-mem"), "--help");
    snprintf(args, sizeof args, "plan -m '%s' --gpu-mem 2G", model);
    CHECKF(tr_run_cmd(c->bin, args, out, sizeof out) == 0 && strstr(out, "KV pool") &&
               strstr(out, "host arena") && strstr(out, "--gpu-mem"),
           "table output:\n%s", out);
}

int main(void)
{
#ifdef __GLIBC__
    /* Every allocation of 64 KiB or more its own mapping: glibc's default threshold moves up
     * when a large block is freed, after which big buffers come from the heap, whose growth
     * depends on earlier frees (not on the buffer). ASan's allocator ignores this. */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
#endif
    ctx_t c;
    memset(&c, 0, sizeof c);
    c.bin = getenv("SPILLWAY_BIN") ? getenv("SPILLWAY_BIN") : "./spillway";
    if (access(c.bin, X_OK) != 0) {
        fprintf(stderr, "test_plan: no spillway binary at %s (set SPILLWAY_BIN): skipped\n", c.bin);
        return 77;
    }
    snprintf(c.dir, sizeof c.dir, "/tmp/spillway-plan-XXXXXX");
    if (!mkdtemp(c.dir)) {
        perror("mkdtemp");
        return 1;
    }
    char err[256], tiny[128], qwen[128], q8[128], smol[128], nokv[128], arr[128], mha[128];
    char moe2[128], moe3[128], moebig[128], phi3q8[128], moe2q8[128];
    snprintf(tiny, sizeof tiny, "%s/tiny.gguf", c.dir);
    snprintf(qwen, sizeof qwen, "%s/qwen2-tiny.gguf", c.dir);
    snprintf(q8, sizeof q8, "%s/tiny-q8.gguf", c.dir);
    snprintf(smol, sizeof smol, "%s/smollm2.gguf", c.dir);
    snprintf(mha, sizeof mha, "%s/tiny-mha.gguf", c.dir);
    snprintf(nokv, sizeof nokv, "%s/tiny-nokeys.gguf", c.dir);
    snprintf(arr, sizeof arr, "%s/tiny-arr.gguf", c.dir);
    snprintf(moe2, sizeof moe2, "%s/qwen2moe.gguf", c.dir);
    snprintf(moe3, sizeof moe3, "%s/llama-moe.gguf", c.dir);
    snprintf(moebig, sizeof moebig, "%s/qwen2moe-576.gguf", c.dir);
    snprintf(phi3q8, sizeof phi3q8, "%s/phi3-q8.gguf", c.dir);
    snprintf(moe2q8, sizeof moe2q8, "%s/qwen2moe-q8.gguf", c.dir);
    mkmodel_params_t p;
    mkmodel_preset("tiny", &p);
    CHECKF(mkmodel_write(&p, tiny, err, sizeof err) == 0, "%s", err);
    p.n_kv_heads = p.n_heads;
    CHECKF(mkmodel_write(&p, mha, err, sizeof err) == 0, "%s", err);
    mkmodel_preset("tiny", &p);
    p.dtype = DT_Q8_0;
    CHECKF(mkmodel_write(&p, q8, err, sizeof err) == 0, "%s", err);
    mkmodel_preset("qwen2-tiny", &p);
    CHECKF(mkmodel_write(&p, qwen, err, sizeof err) == 0, "%s", err);
    mkmodel_preset("smollm2-135m", &p);
    CHECKF(mkmodel_write(&p, smol, err, sizeof err) == 0, "%s", err);
    /* mixture of experts: qwen2moe with a shared expert (expert size its own key), and a
     * Mixtral-style llama (expert size feed_forward_length) */
    mkmodel_preset("qwen2-tiny", &p);
    p.arch = ARCH_QWEN2MOE;
    p.n_expert = 8;
    p.n_expert_used = 2;
    p.expert_ffn_dim = 96;
    CHECKF(mkmodel_write(&p, moe2, err, sizeof err) == 0, "%s", err);
    /* in Q8_0, which the CPU backend packs where the CPU has AVX512-VNNI (weights.
     * cpu_packed_bytes): the attention only, the experts in place */
    p.dtype = DT_Q8_0;
    CHECKF(mkmodel_write(&p, moe2q8, err, sizeof err) == 0, "%s", err);
    /* phi3 in Q8_0: the parts of its fused attn_qkv and ffn_up packed each on their own */
    mkmodel_preset("tiny", &p);
    p.arch = ARCH_PHI3;
    p.dtype = DT_Q8_0;
    CHECKF(mkmodel_write(&p, phi3q8, err, sizeof err) == 0, "%s", err);
    mkmodel_preset("tiny", &p);
    p.n_expert = 4;
    p.n_expert_used = 2;
    CHECKF(mkmodel_write(&p, moe3, err, sizeof err) == 0, "%s", err);
    /* for the VmSize checks, scratch large against the engine's fixed allocations: smollm2's
     * shapes, 2 layers, 8 experts of 512, 4 used per token */
    mkmodel_preset("smollm2-135m", &p);
    p.arch = ARCH_QWEN2MOE;
    p.n_layers = 2;
    p.n_expert = 8;
    p.n_expert_used = 4;
    p.expert_ffn_dim = 512;
    p.ctx_len = 2048; /* per-sequence state the plan does not count grows with it */
    CHECKF(mkmodel_write(&p, moebig, err, sizeof err) == 0, "%s", err);
    static const char *const drop[] = {"llama.attention.head_count_kv", "llama.context_length"};
    CHECK(gguf_rewrite(mha, nokv, drop, 2, NULL, 0) == 0);
    CHECK(gguf_rewrite(tiny, arr, NULL, 0, "llama.attention.head_count_kv", 2) == 0);

    static const pcase_t cases[] = {
        {"", 1024, 0, NULL, 0, 0, 1},
        {"--kv-mem 64M --block-tokens 32 --kv-type f32 --host-arena 8M", 64, 32, "f32", 0, 0, 1},
        {"--kv-mem 1M --ctx 300 --host-arena 3M", 1, 0, NULL, 300, 0, 1},
        {"--kv-mem 1M --block-tokens 7 --ctx 100000", 1, 7, NULL, 100000, 0, 0},
        {"--gpu-mem 1.5GiB --weights-on-device --host-arena 64M", 0, 0, NULL, 0, 1, 1},
        {"--gpu-mem 600M --reserve 64M --batch-tokens 128 --max-seqs 16", 0, 0, NULL, 0, 0, 0},
    };
    const char *shared = SPILLWAY_MODELS "/stories260K.gguf";
    /* the architectures beyond llama/qwen2 (gemma3: head_dim 64 != dim / n_heads) */
    const char *models[] = {shared, tiny, qwen, q8, mha, nokv, arr, moe2, moe3, phi3q8, moe2q8,
                            SPILLWAY_MODELS "/arch-fixtures/qwen3-tiny.gguf",
                            SPILLWAY_MODELS "/arch-fixtures/gemma2-tiny.gguf",
                            SPILLWAY_MODELS "/arch-fixtures/gemma3-tiny.gguf",
                            SPILLWAY_MODELS "/arch-fixtures/phi3-tiny.gguf"};
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        if (access(models[m], R_OK) != 0) {
            fprintf(stderr, "test_plan: %s missing: skipped\n", models[m]);
            continue;
        }
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            check_case(&c, models[m], &cases[i], (int)i);
    }
    /* nokv takes the defaults: n_kv_heads = n_heads, context 2048; arr: 2 kv heads */
    json_t *j = plan(&c, nokv, "");
    CHECK(j && jget(j, "model", "n_kv_heads") == 4 && jget(j, "model", "ctx_len") == 2048);
    json_decref(j);
    j = plan(&c, arr, "");
    CHECK(j && jget(j, "model", "n_kv_heads") == 2);
    json_decref(j);
    j = plan(&c, moe2, "");
    CHECK(j && jget(j, "model", "n_expert") == 8 && jget(j, "model", "n_expert_used") == 2 &&
          jget(j, "model", "expert_ffn_dim") == 96 && jget(j, "model", "shexp_ffn_dim") == 128);
    json_decref(j);
    j = plan(&c, moe3, "");
    CHECK(j && jget(j, "model", "n_expert") == 4 && jget(j, "model", "expert_ffn_dim") == 128 &&
          jget(j, "model", "shexp_ffn_dim") == 0);
    json_decref(j);
    j = plan(&c, tiny, "");
    CHECK(j && jget(j, "model", "n_expert") == 0);
    json_decref(j);
    /* cpu.pack false: no copies, whatever the plan says this CPU's kernels would pack */
    {
        engine_config_t cfg = base_cfg(phi3q8);
        cfg.cpu_pack = 0;
        engine_t *e = engine_new(&cfg, err, sizeof err);
        CHECKF(e, "engine_new %s: %s", phi3q8, err);
        if (e) {
            engine_info_t in;
            engine_info(e, &in);
            CHECK(in.host_packed_bytes == 0);
            engine_free(e);
        }
    }


    /* smollm2-135m shapes: blocks of 360 KiB at f16 */
    static const pcase_t big[] = {
        {"", 1024, 0, NULL, 0, 0, 1},
        {"--kv-mem 1M --ctx 4000 --host-arena 2M", 1, 0, NULL, 4000, 0, 1},
        {"--kv-mem 100M --kv-type f32 --block-tokens 64 --ctx 2048", 100, 64, "f32", 2048, 0, 0},
        {"--gpu-mem 24G --weights-on-device --reserve 1G", 0, 0, NULL, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) check_case(&c, smol, &big[i], (int)i);
    check_vm(&c, smol, 1);
    check_vm(&c, moebig, 0); /* the logits buffer does not depend on the experts */
    check_cli(&c, tiny);

    const char *files[] = {tiny, qwen, q8, smol, mha, nokv, arr, moe2, moe3, moebig, phi3q8, moe2q8};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(files[i]);
    if (rmdir(c.dir) != 0) fprintf(stderr, "rmdir %s: %s\n", c.dir, strerror(errno));
    return check_exit();
}
