/* tests/test_swa_engine.c: KV blocks behind a sliding window are released by the engine.
 *
 * A synthetic llama with a window of 8 on every layer (mkmodel), KV blocks of 4 tokens and a
 * pool of 24 blocks: four greedy requests of 20 prompt + 60 generated tokens need 80 blocks if
 * every block is kept, and 4 or 5 each at a time when the blocks behind the window are released.
 *   - all four finish with 60 tokens, without a preemption, and no block stays held;
 *   - their tokens are the greedy argmax of a forward pass over the whole sequence with every
 *     block kept (engine_raw_forward), so no released (and reused) block was read;
 *   - the same with the prefix cache off (blocks released as soon as they fall behind), and
 *     with the 4 prompts sharing a 12-token prefix (published blocks released while shared);
 *   - a model with one full-attention layer (gemma3-style pattern) keeps every block: the same
 *     small pool then preempts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "tests/check.h"
#include "tools/mkmodel.h"

#define NQ 4
#define NPROMPT 20
#define NGEN 60

typedef struct {
    int32_t toks[NGEN + 8];
    int n, done, finish;
} res_t;

static void on_done(void *arg, const engine_result_t *r)
{
    res_t *x = r->user;
    (void)arg;
    x->n = r->n_tokens < NGEN + 8 ? r->n_tokens : NGEN + 8;
    memcpy(x->toks, r->tokens, sizeof(int32_t) * (size_t)x->n);
    x->finish = r->finish;
    x->done++;
}

static void prompts(int32_t p[NQ][NPROMPT], int shared, uint64_t seed)
{
    for (int i = 0; i < NQ; i++)
        for (int j = 0; j < NPROMPT; j++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int t = 3 + (int)((seed >> 33) % 300);
            p[i][j] = shared && j < 12 ? p[0][j] : t;
        }
}

/* Runs the four prompts in one engine; fills res and the stats. 0 or -1. */
static int run(const char *model, int prefix_cache, int32_t p[NQ][NPROMPT], res_t *res,
               engine_stats_t *st)
{
    engine_config_t c;
    engine_config_default(&c);
    c.model_path = model;
    c.threads = 2;
    c.kv_type = "f32";
    c.block_tokens = 4;
    c.kv_blocks = 24;
    c.prefix_cache = prefix_cache;
    char err[512];
    engine_t *e = engine_new(&c, err, sizeof err);
    CHECKF(e != NULL, "engine_new: %s", err);
    if (!e) return -1;
    memset(res, 0, sizeof(res_t) * NQ);
    for (int i = 0; i < NQ; i++) {
        engine_request_t rq;
        engine_request_default(&rq);
        rq.sampling.temperature = 0;
        rq.max_tokens = NGEN;
        rq.ignore_eos = 1;
        rq.prompt = p[i];
        rq.n_prompt = NPROMPT;
        rq.user = &res[i];
        CHECKF(engine_submit(e, &rq, on_done, NULL, NULL, err, sizeof err) == 0, "submit: %s", err);
    }
    int rc = engine_run(e, err, sizeof err);
    CHECKF(rc == 0, "run: %s", err);
    engine_stats(e, st);
    engine_free(e);
    return rc;
}

/* Greedy tokens res must be the argmax of a full-context forward pass of prompt + res, with every
 * block kept. */
static void check_against_full(const char *model, int32_t p[NQ][NPROMPT], const res_t *res)
{
    engine_config_t c;
    engine_config_default(&c);
    c.model_path = model;
    c.threads = 2;
    c.kv_type = "f32";
    c.block_tokens = 4;
    c.kv_blocks = 64;
    char err[512];
    engine_t *e = engine_new(&c, err, sizeof err);
    CHECKF(e != NULL, "engine_new: %s", err);
    if (!e) return;
    engine_info_t info;
    engine_info(e, &info);
    const int n = NPROMPT + NGEN, nb = (n + 3) / 4;
    int32_t blocks[32], seq[NPROMPT + NGEN];
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)info.n_vocab);
    CHECK(logits && engine_raw_alloc_blocks(e, nb, blocks) == 0);
    for (int i = 0; i < NQ && logits; i++) {
        memcpy(seq, p[i], sizeof(int32_t) * NPROMPT);
        memcpy(seq + NPROMPT, res[i].toks, sizeof(int32_t) * NGEN);
        const int32_t *tk = seq, *tb = blocks;
        int start = 0, cnt = n;
        CHECKF(engine_raw_forward(e, 1, &tk, &cnt, &start, &tb, logits, err, sizeof err) == 0,
               "raw forward: %s", err);
        int bad = 0;
        for (int j = 0; j < NGEN; j++) {
            const float *l = logits + (size_t)(NPROMPT - 1 + j) * (size_t)info.n_vocab;
            int best = 0;
            for (int v = 1; v < info.n_vocab; v++) best = l[v] > l[best] ? v : best;
            bad += best != res[i].toks[j];
        }
        CHECKF(bad == 0, "request %d: %d of %d tokens are not the full-context greedy choice", i,
               bad, NGEN);
    }
    engine_raw_free_blocks(e, nb, blocks);
    free(logits);
    engine_free(e);
}

int main(void)
{
    char dir[64], swa[128], mixed[128], err[256];
    snprintf(dir, sizeof dir, "/tmp/spillway-swa-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(swa, sizeof swa, "%s/swa.gguf", dir);
    snprintf(mixed, sizeof mixed, "%s/mixed.gguf", dir);
    mkmodel_params_t mp;
    mkmodel_preset("tiny", &mp);
    mp.n_vocab = 320;
    mp.ctx_len = 256;
    mp.seed = 5;
    mp.swa_window = 8;
    CHECKF(mkmodel_write(&mp, swa, err, sizeof err) == 0, "%s", err);
    mp.arch = ARCH_GEMMA3; /* pattern 6 over 2 layers: both local; pattern 2: layer 1 global */
    mp.swa_pattern = 2;
    mp.tied = 1;
    CHECKF(mkmodel_write(&mp, mixed, err, sizeof err) == 0, "%s", err);

    int32_t p[NQ][NPROMPT];
    res_t res[NQ];
    engine_stats_t st;
    for (int v = 0; v < 3; v++) {
        const int prefix_cache = v != 1, shared = v == 2;
        prompts(p, shared, 11 + (uint64_t)v);
        if (run(swa, prefix_cache, p, res, &st) != 0) continue;
        for (int i = 0; i < NQ; i++)
            CHECKF(res[i].done == 1 && res[i].n == NGEN, "case %d request %d: %d tokens", v, i,
                   res[i].n);
        CHECKF(st.preemptions == 0, "case %d: %llu preemptions (blocks behind the window not "
               "released?)", v, (unsigned long long)st.preemptions);
        CHECKF(st.kv_blocks_used == 0, "case %d: %d blocks still held", v, st.kv_blocks_used);
        if (shared) CHECKF(st.cached_tokens > 0, "case %d: the shared prefix was not reused", v);
        check_against_full(swa, p, res);
    }
    /* one full-attention layer: nothing can be released, the small pool preempts */
    prompts(p, 0, 11);
    if (run(mixed, 1, p, res, &st) == 0) {
        CHECKF(st.preemptions > 0, "mixed model: expected preemptions, got %llu",
               (unsigned long long)st.preemptions);
        CHECK(st.kv_blocks_used == 0);
        check_against_full(mixed, p, res);
    }
    unlink(swa);
    unlink(mixed);
    rmdir(dir);
    return check_exit();
}
