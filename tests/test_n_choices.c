/* tests/test_n_choices.c: "n" > 1 as the worker runs it (worker/engine_thread.c): the n choices of
 * a request are submitted together with seeds seed + i. Checks, with stories260K: the shared
 * prompt is computed once (engine stats: prompt tokens computed <= the prompt + (n - 1) blocks,
 * against n times the prompt with the prefix cache off), and choice i equals the same prompt run
 * alone with seed + i (so the choices differ only by seed). Prints the measured token counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tests/check.h"

#define MODEL SPILLWAY_MODELS "/stories260K.gguf"
#define N 4
#define MAXT 24

typedef struct {
    int32_t toks[MAXT];
    int n_toks, n_cached, done;
} res_t;

static void on_done(void *arg, const engine_result_t *r)
{
    res_t *x = r->user;
    (void)arg;
    x->n_toks = r->n_tokens < MAXT ? r->n_tokens : MAXT;
    memcpy(x->toks, r->tokens, sizeof(int32_t) * (size_t)x->n_toks);
    x->n_cached = r->n_cached;
    x->done++;
}

static engine_t *mk(int prefix_cache)
{
    engine_config_t c;
    char err[512];
    engine_config_default(&c);
    c.model_path = MODEL;
    c.threads = 2;
    c.kv_type = "f32";
    c.kv_mem_mb = 64;
    c.block_tokens = 16;
    c.prefix_cache = prefix_cache;
    engine_t *e = engine_new(&c, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new: %s\n", err);
    return e;
}

/* Submits n copies of prompt with seeds seed0 + i together, runs them; fills res[0..n). */
static int run(engine_t *e, const int32_t *prompt, int np, int n, uint64_t seed0, res_t *res)
{
    char err[512];
    for (int i = 0; i < n; i++) {
        engine_request_t q;
        engine_request_default(&q);
        q.prompt = prompt;
        q.n_prompt = np;
        q.max_tokens = MAXT;
        q.ignore_eos = 1;
        q.sampling.temperature = 1.0f;
        q.sampling.seed = seed0 + (uint64_t)i;
        q.user = &res[i];
        if (engine_submit(e, &q, on_done, NULL, NULL, err, sizeof err)) {
            fprintf(stderr, "submit: %s\n", err);
            return -1;
        }
    }
    if (engine_run(e, err, sizeof err)) {
        fprintf(stderr, "run: %s\n", err);
        return -1;
    }
    return 0;
}

int main(void)
{
    FILE *f = fopen(MODEL, "rb");
    if (!f) {
        fprintf(stderr, "skip: %s not found\n", MODEL);
        return 77;
    }
    fclose(f);
    static const char text[] =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friends. One day, she saw a big red ball under a tree and ran to get it, "
        "but a small dog got there first and";
    engine_t *e = mk(1), *solo = mk(1), *nocache = mk(0);
    if (!e || !solo || !nocache) return 1;
    int32_t prompt[512];
    int np = engine_tokenize(e, text, strlen(text), 1, 0, prompt, 512);
    CHECK(np > 48);
    res_t ch[N], one[N], nc[N];
    memset(ch, 0, sizeof ch);
    memset(one, 0, sizeof one);
    memset(nc, 0, sizeof nc);
    CHECK(run(e, prompt, np, N, 7, ch) == 0);
    engine_stats_t st, stn;
    engine_stats(e, &st);
    long computed = (long)st.prompt_tokens - (long)st.cached_tokens;
    CHECK(run(nocache, prompt, np, N, 7, nc) == 0);
    engine_stats(nocache, &stn);
    long computed_nc = (long)stn.prompt_tokens - (long)stn.cached_tokens;
    fprintf(stderr, "n=%d, prompt %d tokens: %ld prompt tokens computed together (prefix cache on), "
            "%ld with it off; %llu deferred admissions\n", N, np, computed, computed_nc,
            (unsigned long long)st.deferred);
    CHECKF(computed <= np + (N - 1) * 16, "%ld computed, more than the prompt + %d blocks",
           computed, N - 1);
    CHECK(computed_nc == (long)N * np);
    for (int i = 0; i < N; i++) {
        CHECK(ch[i].done == 1 && ch[i].n_toks == MAXT);
        res_t r1[1];
        memset(r1, 0, sizeof r1);
        CHECK(run(solo, prompt, np, 1, 7 + (uint64_t)i, r1) == 0);
        one[i] = r1[0];
        CHECKF(one[i].n_toks == ch[i].n_toks &&
                   !memcmp(one[i].toks, ch[i].toks, sizeof(int32_t) * (size_t)ch[i].n_toks),
               "choice %d differs from the prompt run alone with seed %d", i, 7 + i);
        CHECKF(!memcmp(nc[i].toks, ch[i].toks, sizeof(int32_t) * (size_t)ch[i].n_toks),
               "choice %d differs with the prefix cache off", i);
    }
    int differ = 0;
    for (int i = 1; i < N; i++)
        differ += memcmp(ch[0].toks, ch[i].toks, sizeof(int32_t) * MAXT) != 0;
    CHECKF(differ > 0, "all %d choices are the same at temperature 1", N);
    engine_free(e);
    engine_free(solo);
    engine_free(nocache);
    return check_exit();
}
