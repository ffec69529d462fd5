/* tests/test_engine.c: end-to-end engine behaviour on the real stories260K model:
 * golden greedy outputs, batch invariance, prefix-block sharing, preemption, seeds, stop
 * strings, limits and request validation; model versions get distinct KV block names. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common/err.h"
#include "engine/engine.h"
#include "tools/mkmodel.h"

#define MODEL SPILLWAY_MODELS "/stories260K.gguf"
#define MAXR 64

/* Reference (a): llama2.c run.c greedy from BOS, 256 tokens (stdout without its final '\n'). */
static const char *GOLDEN_A =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. "
    "She said, \"I want to play with your ball, but I can't find it.\"\n"
    "Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to "
    "do.\"\n"
    "Lily didn't want to help her mom, so she said, \"I'm sorry, mom. I didn't know what to do.\" "
    "Her mom said, \"Don't worry, Lily. We can help you.";
/* Reference (b1): prompt "Once upon a time", 60 generated tokens. */
static const int32_t GOLDEN_B1_IDS[] = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
    401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
    328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
    337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310};

typedef struct {
    int finish;
    char *text;
    size_t text_len;
    int32_t *toks;
    int n_toks;
    int n_cached;
    int n_preempted;
    float *lp; /* chosen logprobs */
    int done;
} res_t;

static void on_done(void *arg, const engine_result_t *r)
{
    res_t *x = r->user;
    (void)arg;
    x->finish = r->finish;
    x->text = malloc(r->text_len + 1);
    memcpy(x->text, r->text, r->text_len);
    x->text[r->text_len] = 0;
    x->text_len = r->text_len;
    x->toks = malloc(sizeof(int32_t) * (size_t)(r->n_tokens + 1));
    memcpy(x->toks, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
    x->n_toks = r->n_tokens;
    x->n_cached = r->n_cached;
    x->n_preempted = r->n_preempted;
    if (r->n_logprobs) {
        x->lp = malloc(sizeof(float) * (size_t)(r->n_tokens + 1));
        for (int i = 0; i < r->n_tokens; i++) x->lp[i] = r->logprobs[i].logprob;
    }
    x->done++;
}

static void res_clear(res_t *r, int n)
{
    for (int i = 0; i < n; i++) {
        free(r[i].text);
        free(r[i].toks);
        free(r[i].lp);
        memset(&r[i], 0, sizeof r[i]);
    }
}

static engine_t *mk(engine_config_t *cfg)
{
    char err[512];
    engine_t *e = engine_new(cfg, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new: %s\n", err);
    return e;
}

static void base_cfg(engine_config_t *c)
{
    engine_config_default(c);
    c->model_path = MODEL;
    c->threads = 2;
    c->kv_type = "f32";
    c->kv_mem_mb = 64;
}

/* Submits prompts (text), runs to completion, fills res. */
static int run(engine_t *e, int n, const char *const *prompts, const engine_request_t *tmpl,
               res_t *res)
{
    char err[512];
    for (int i = 0; i < n; i++) {
        int32_t toks[1024];
        int nt = engine_tokenize(e, prompts[i], strlen(prompts[i]), 1, 0, toks, 1024);
        if (nt < 1 || nt > 1024) return -1;
        engine_request_t rq = *tmpl;
        rq.prompt = toks;
        rq.n_prompt = nt;
        rq.user = &res[i];
        rq.text_at_start = prompts[i][0] == 0;
        if (engine_submit(e, &rq, on_done, NULL, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "submit: %s\n", err);
            return -1;
        }
    }
    if (engine_run(e, err, sizeof err) != 0) {
        fprintf(stderr, "run: %s\n", err);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (res[i].done != 1) return -1;
    return 0;
}

static const char *PROMPTS[] = {
    "Once upon a time",
    "",
    "Tom had a red ball and",
    "The little dog was sad because it could not find its toy. It looked under the bed, behind the door and",
    "Lily",
    "One day, a big bird",
    "Sue and Ben went to the park to play. They saw a swing, a slide and a sandbox. Sue wanted to",
    "The sun was",
};
#define NP ((int)(sizeof PROMPTS / sizeof PROMPTS[0]))

static void test_golden(void)
{
    engine_config_t c;
    base_cfg(&c);
    engine_t *e = mk(&c);
    CHECK(e != NULL);
    if (!e) return;
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0;
    rq.max_tokens = 256;
    res_t r[2] = {0};
    const char *p0[] = {""};
    CHECK(run(e, 1, p0, &rq, r) == 0);
    CHECKF(r[0].text && strcmp(r[0].text, GOLDEN_A) == 0, "golden (a) differs:\n%s", r[0].text ? r[0].text : "(null)");
    CHECK(r[0].n_toks == 256 && r[0].finish == ENGINE_FINISH_LENGTH);
    res_clear(r, 1);

    rq.max_tokens = 60;
    const char *p1[] = {"Once upon a time"};
    CHECK(run(e, 1, p1, &rq, r) == 0);
    int ok = r[0].n_toks == 60;
    for (int i = 0; ok && i < 60; i++) ok = r[0].toks[i] == GOLDEN_B1_IDS[4 + i];
    CHECKF(ok, "golden (b1) token ids differ");
    CHECK(strncmp(r[0].text, ", there was a little girl named Lily.", 37) == 0);
    res_clear(r, 1);
    engine_free(e);
}

/* got[0..n) has want[0..n)'s tokens and logprobs, bit for bit; what names got's run in failures. */
static void check_same(const res_t *want, const res_t *got, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        CHECKF(want[i].n_toks == got[i].n_toks &&
                   !memcmp(want[i].toks, got[i].toks, sizeof(int32_t) * (size_t)want[i].n_toks),
               "prompt %d: %s tokens differ", i, what);
        CHECKF(!memcmp(want[i].lp, got[i].lp, sizeof(float) * (size_t)want[i].n_toks),
               "prompt %d: %s logprobs differ (not bit-identical)", i, what);
    }
}

/* The prompts of the prefix tests: one long shared prefix (more than two 16-token blocks), five
 * short tails. The caller frees each. */
static void shared_prompts(char *prompts[5])
{
    static const char *shared =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. ";
    const char *tails[] = {"Lily", "Her mom", "A bird", "The ball", "She"};
    for (int i = 0; i < 5; i++) {
        prompts[i] = malloc(strlen(shared) + strlen(tails[i]) + 1);
        strcpy(prompts[i], shared);
        strcat(prompts[i], tails[i]);
    }
}

/* Greedy outputs and logprobs are identical alone, batched, with small chunks, and with the
 * prefix cache on or off; prefix blocks are reused. */
static void test_batch_invariance(void)
{
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0;
    rq.sampling.n_logprobs = 3;
    rq.max_tokens = 40;
    rq.ignore_eos = 1;
    res_t alone[NP], batch[NP], chunked[NP];
    memset(alone, 0, sizeof alone);
    memset(batch, 0, sizeof batch);
    memset(chunked, 0, sizeof chunked);
    engine_config_t c;
    base_cfg(&c);
    c.prefix_cache = 0;
    engine_t *e = mk(&c);
    CHECK(e != NULL);
    if (!e) return;
    for (int i = 0; i < NP; i++) CHECK(run(e, 1, &PROMPTS[i], &rq, &alone[i]) == 0);
    engine_free(e);

    base_cfg(&c);
    e = mk(&c);
    CHECK(run(e, NP, PROMPTS, &rq, batch) == 0);
    engine_free(e);

    base_cfg(&c);
    c.max_batch_tokens = 7; /* forces chunked prefill mixed with decodes */
    c.max_seqs = 5;
    c.block_tokens = 4;
    e = mk(&c);
    CHECK(run(e, NP, PROMPTS, &rq, chunked) == 0);
    engine_free(e);
    check_same(alone, batch, NP, "batched");
    check_same(alone, chunked, NP, "chunked");
    res_clear(alone, NP);
    res_clear(batch, NP);
    res_clear(chunked, NP);
}

/* Requests sharing a long prefix reuse its blocks (n_cached > 0) and produce the same
 * logprobs, bit for bit, as with private blocks. */
static void test_shared_prefix(void)
{
    char *prompts[5];
    shared_prompts(prompts);
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0;
    rq.sampling.n_logprobs = 2;
    rq.max_tokens = 24;
    rq.ignore_eos = 1;
    res_t priv[5], shr[5];
    memset(priv, 0, sizeof priv);
    memset(shr, 0, sizeof shr);
    engine_config_t c;
    base_cfg(&c);
    c.prefix_cache = 0;
    engine_t *e = mk(&c);
    CHECK(run(e, 5, (const char *const *)prompts, &rq, priv) == 0);
    engine_free(e);

    base_cfg(&c);
    e = mk(&c);
    /* The first request fills the cache; the others then reuse its full blocks. */
    CHECK(run(e, 1, (const char *const *)prompts, &rq, shr) == 0);
    CHECK(run(e, 4, (const char *const *)prompts + 1, &rq, shr + 1) == 0);
    engine_stats_t st;
    engine_stats(e, &st);
    engine_free(e);
    CHECK(shr[0].n_cached == 0);
    for (int i = 1; i < 5; i++) CHECKF(shr[i].n_cached >= 32, "request %d: %d cached tokens", i, shr[i].n_cached);
    CHECK(st.prefix_hits > 0);
    check_same(priv, shr, 5, "shared-prefix");
    res_clear(priv, 5);
    res_clear(shr, 5);
    for (int i = 0; i < 5; i++) free(prompts[i]);
}

/* Requests submitted together that share an uncached prefix compute it once: the first admitted
 * computes it, the others wait (deferred) until its blocks are published and then reuse them;
 * outputs equal those of private computation. */
static void test_prefix_compute_once(void)
{
    char *prompts[5];
    shared_prompts(prompts);
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0;
    rq.sampling.n_logprobs = 1;
    rq.max_tokens = 16;
    rq.ignore_eos = 1;
    res_t priv[5], shr[5];
    memset(priv, 0, sizeof priv);
    memset(shr, 0, sizeof shr);
    engine_config_t c;
    base_cfg(&c);
    c.prefix_cache = 0;
    c.max_batch_tokens = 128;
    c.max_seqs = 8;
    engine_t *e = mk(&c);
    CHECK(run(e, 5, (const char *const *)prompts, &rq, priv) == 0);
    engine_free(e);

    base_cfg(&c);
    c.max_batch_tokens = 128;
    c.max_seqs = 8;
    e = mk(&c);
    CHECK(run(e, 5, (const char *const *)prompts, &rq, shr) == 0);
    engine_stats_t st;
    engine_stats(e, &st);
    engine_free(e);
    CHECKF(st.deferred > 0, "no admission was deferred (%llu)", (unsigned long long)st.deferred);
    int shared_blocks = 0;
    for (int i = 1; i < 5; i++) {
        CHECKF(shr[i].n_cached >= 32, "request %d: %d cached tokens", i, shr[i].n_cached);
        if (shr[i].n_cached >= 32) shared_blocks++;
    }
    /* computed once: prompt tokens computed = all prompts minus what was reused */
    CHECKF(st.cached_tokens >= 4 * 32, "cached tokens %llu", (unsigned long long)st.cached_tokens);
    check_same(priv, shr, 5, "computed-once");
    res_clear(priv, 5);
    res_clear(shr, 5);
    for (int i = 0; i < 5; i++) free(prompts[i]);
}

typedef struct {
    int order[8];
    int n;
} order_t;

static void on_done_order(void *arg, const engine_result_t *r)
{
    order_t *o = arg;
    if (o->n < 8) o->order[o->n++] = (int)(intptr_t)r->user;
}

static void submit_text(engine_t *e, const char *text, int priority, int tag, order_t *o)
{
    char err[256];
    int32_t toks[512];
    int nt = engine_tokenize(e, text, strlen(text), 1, 0, toks, 512);
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0;
    rq.max_tokens = 2;
    rq.ignore_eos = 1;
    rq.prompt = toks;
    rq.n_prompt = nt;
    rq.priority = priority;
    rq.user = (void *)(intptr_t)tag;
    CHECKF(engine_submit(e, &rq, on_done_order, o, NULL, err, sizeof err) == 0, "submit: %s", err);
}

/* Admission order with one sequence at a time: the request whose prefix is cached goes before
 * older ones that share nothing (longest prefix first); priority still goes first; with aging
 * an old request overtakes a higher priority. */
static void test_admission_order(void)
{
    static const char *doc =
        "Sue and Ben went to the park to play. They saw a swing, a slide and a sandbox. Sue wanted "
        "to go on the swing, but Ben wanted to go on the slide. ";
    char warm[512], hit[512];
    snprintf(warm, sizeof warm, "%sThey", doc);
    snprintf(hit, sizeof hit, "%sSue", doc);
    engine_config_t c;
    base_cfg(&c);
    c.max_seqs = 1;
    c.sched_aging_ms = 0;
    engine_t *e = mk(&c);
    char err[256];
    order_t o = {{0}, 0};
    submit_text(e, warm, 0, 9, &o);
    CHECK(engine_run(e, err, sizeof err) == 0);
    o.n = 0;
    submit_text(e, "The little dog was sad", 0, 1, &o);
    submit_text(e, "Tom had a red ball and", 0, 2, &o);
    submit_text(e, hit, 0, 3, &o);
    submit_text(e, "One day, a big bird", 1, 4, &o);
    CHECK(engine_run(e, err, sizeof err) == 0);
    CHECKF(o.n == 4 && o.order[0] == 4 && o.order[1] == 3 && o.order[2] == 1 && o.order[3] == 2,
           "order %d %d %d %d", o.order[0], o.order[1], o.order[2], o.order[3]);
    engine_free(e);

    /* aging: 1 ms per level, the old request gains many levels while the newer high priority
     * one is submitted */
    base_cfg(&c);
    c.max_seqs = 1;
    c.sched_aging_ms = 1;
    e = mk(&c);
    o.n = 0;
    submit_text(e, "The little dog was sad", 0, 1, &o);
    struct timespec ts = {0, 50 * 1000000};
    nanosleep(&ts, NULL);
    submit_text(e, "Tom had a red ball and", 5, 2, &o);
    CHECK(engine_run(e, err, sizeof err) == 0);
    CHECKF(o.n == 2 && o.order[0] == 1 && o.order[1] == 2, "aging order %d %d", o.order[0],
           o.order[1]);
    engine_free(e);
}

/* A pool too small for all sequences at once forces preemption; outputs do not change. */
static void test_preemption(void)
{
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0;
    rq.max_tokens = 48;
    rq.ignore_eos = 1;
    res_t ref[NP], small[NP];
    memset(ref, 0, sizeof ref);
    memset(small, 0, sizeof small);
    engine_config_t c;
    base_cfg(&c);
    engine_t *e = mk(&c);
    CHECK(run(e, NP, PROMPTS, &rq, ref) == 0);
    engine_free(e);
    base_cfg(&c);
    c.block_tokens = 8;
    c.kv_blocks = 20; /* 160 token slots for 8 sequences of up to ~75 tokens */
    c.prefix_cache = 0;
    e = mk(&c);
    CHECK(run(e, NP, PROMPTS, &rq, small) == 0);
    engine_stats_t st;
    engine_stats(e, &st);
    CHECKF(st.preemptions > 0, "expected preemptions, got %llu", (unsigned long long)st.preemptions);
    CHECK(st.kv_blocks_used == 0);
    engine_free(e);
    for (int i = 0; i < NP; i++)
        CHECKF(ref[i].n_toks == small[i].n_toks && !memcmp(ref[i].toks, small[i].toks, sizeof(int32_t) * (size_t)ref[i].n_toks),
               "prompt %d: output changed under preemption", i);
    res_clear(ref, NP);
    res_clear(small, NP);
}

/* The same seed gives the same text alone and in a batch; another seed differs. */
static void test_seeds(void)
{
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0.9f;
    rq.sampling.top_p = 0.95f;
    rq.sampling.seed = 1234;
    rq.max_tokens = 40;
    rq.ignore_eos = 1;
    engine_config_t c;
    base_cfg(&c);
    engine_t *e = mk(&c);
    res_t a[1] = {0}, b[NP], d[1] = {0};
    memset(b, 0, sizeof b);
    CHECK(run(e, 1, &PROMPTS[2], &rq, a) == 0);
    CHECK(run(e, NP, PROMPTS, &rq, b) == 0);
    rq.sampling.seed = 99;
    CHECK(run(e, 1, &PROMPTS[2], &rq, d) == 0);
    engine_free(e);
    CHECK(a[0].text && b[2].text && strcmp(a[0].text, b[2].text) == 0);
    CHECK(a[0].text && d[0].text && strcmp(a[0].text, d[0].text) != 0);
    res_clear(a, 1);
    res_clear(b, NP);
    res_clear(d, 1);
}

/* A stop string that spans token boundaries ends the text right before it. */
static void test_stop_strings(void)
{
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0;
    rq.max_tokens = 60;
    engine_config_t c;
    base_cfg(&c);
    engine_t *e = mk(&c);
    res_t r[1] = {0};
    const char *p[] = {"Once upon a time"};
    CHECK(run(e, 1, p, &rq, r) == 0);
    /* ", there was a little girl named Lily." -> stop on "e girl na" (spans tokens). */
    const char *stop = "e girl na";
    const char *hit = r[0].text ? strstr(r[0].text, stop) : NULL;
    CHECK(hit != NULL);
    size_t want = hit ? (size_t)(hit - r[0].text) : 0;
    res_clear(r, 1);
    const char *stops[] = {"never appears", stop};
    rq.stop = stops;
    rq.n_stop = 2;
    CHECK(run(e, 1, p, &rq, r) == 0);
    CHECK(r[0].finish == ENGINE_FINISH_STOP);
    CHECKF(r[0].text_len == want, "stop: text %zu bytes, want %zu", r[0].text_len, want);
    CHECK(r[0].text && strstr(r[0].text, "e girl") == NULL);
    res_clear(r, 1);
    /* max_tokens */
    rq.n_stop = 0;
    rq.max_tokens = 5;
    CHECK(run(e, 1, p, &rq, r) == 0);
    CHECK(r[0].finish == ENGINE_FINISH_LENGTH && r[0].n_toks == 5);
    res_clear(r, 1);
    engine_free(e);
}

static void test_validation(void)
{
    engine_config_t c;
    base_cfg(&c);
    c.max_ctx = 64;
    engine_t *e = mk(&c);
    engine_request_t rq;
    engine_request_default(&rq);
    char err[256];
    int32_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = 300;
    rq.prompt = toks;
    rq.n_prompt = 0;
    CHECK(engine_submit(e, &rq, on_done, NULL, NULL, err, sizeof err) == -1);
    rq.n_prompt = 64;
    CHECK(engine_submit(e, &rq, on_done, NULL, NULL, err, sizeof err) == -SW_ERANGE);
    CHECK(strstr(err, "context") != NULL);
    rq.n_prompt = 3;
    toks[1] = 512;
    CHECK(engine_submit(e, &rq, on_done, NULL, NULL, err, sizeof err) == -1);
    CHECK(strstr(err, "vocabulary") != NULL);
    toks[1] = 300;
    rq.sampling.top_p = 0;
    CHECK(engine_submit(e, &rq, on_done, NULL, NULL, err, sizeof err) == -1);
    rq.sampling.top_p = 1;
    /* Context limit: a 60-token prompt with max_tokens 100 stops at the 64-token context. */
    rq.n_prompt = 60;
    rq.max_tokens = 100;
    rq.ignore_eos = 1;
    res_t r[1] = {0};
    rq.user = r;
    CHECK(engine_submit(e, &rq, on_done, NULL, NULL, err, sizeof err) == 0);
    CHECK(engine_run(e, err, sizeof err) == 0);
    CHECK(r[0].finish == ENGINE_FINISH_LENGTH && r[0].n_toks == 4);
    res_clear(r, 1);
    /* Cancel */
    uint64_t id;
    rq.n_prompt = 3;
    rq.user = r;
    CHECK(engine_submit(e, &rq, on_done, NULL, &id, err, sizeof err) == 0);
    CHECK(engine_cancel(e, id) == 0);
    CHECK(r[0].finish == ENGINE_FINISH_ABORT && r[0].done == 1);
    CHECK(engine_cancel(e, id) == -1);
    res_clear(r, 1);
    engine_free(e);
    /* Bad model path and bad config */
    base_cfg(&c);
    c.model_path = "/nonexistent.gguf";
    CHECK(engine_new(&c, err, sizeof err) == NULL);
    base_cfg(&c);
    c.kv_type = "q4";
    CHECK(engine_new(&c, err, sizeof err) == NULL);
}

/* Model versions never share KV: the pool seed that names prefix-cache blocks (kv_seed, also
 * tier 2's arena and Redis index key) is derived from the fingerprint, which hashes every weight
 * byte. Two synthetic models with the same shapes and tokenizer but other weights (seed) differ
 * in both; the same file loaded twice agrees; another block size changes only kv_seed. */
static void test_version_fingerprints(void)
{
    char err[512], a[] = "/tmp/spillway-test-fpXXXXXX", b[64];
    int fd = mkstemp(a);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    snprintf(b, sizeof b, "%s.b", a);
    mkmodel_params_t p;
    CHECK(mkmodel_preset("tiny", &p) == 0);
    CHECK(mkmodel_write(&p, a, err, sizeof err) == 0);
    p.seed = 2; /* a new version: same shapes, other weights */
    CHECK(mkmodel_write(&p, b, err, sizeof err) == 0);
    engine_info_t ia, ia2, ib, ic, id, ie;
    engine_config_t c;
    base_cfg(&c);
    c.model_path = a;
    unsigned char secret[ENGINE_KV_SECRET_BYTES] = {1, 2, 3}, other[ENGINE_KV_SECRET_BYTES] = {4};
    c.kv_secret = secret; /* names are shared only under one secret */
    engine_t *e = mk(&c);
    CHECK(e != NULL);
    if (e) {
        engine_info(e, &ia);
        engine_free(e);
    }
    e = mk(&c);
    CHECK(e != NULL);
    if (e) {
        engine_info(e, &ia2);
        engine_free(e);
    }
    c.model_path = b;
    e = mk(&c);
    CHECK(e != NULL);
    if (e) {
        engine_info(e, &ib);
        engine_free(e);
    }
    c.model_path = a;
    c.block_tokens = 32;
    e = mk(&c);
    CHECK(e != NULL);
    if (e) {
        engine_info(e, &ic);
        engine_free(e);
    }
    c.block_tokens = 16;
    c.kv_secret = other;
    e = mk(&c);
    CHECK(e != NULL);
    if (e) {
        engine_info(e, &id);
        engine_free(e);
    }
    c.kv_secret = NULL; /* a random secret of its own */
    e = mk(&c);
    CHECK(e != NULL);
    if (e) {
        engine_info(e, &ie);
        engine_free(e);
    }
    CHECK(ia.fingerprint == ia2.fingerprint && ia.kv_seed == ia2.kv_seed);
    CHECK(ia.fingerprint != ib.fingerprint && ia.kv_seed != ib.kv_seed);
    CHECK(ic.fingerprint == ia.fingerprint && ic.kv_seed != ia.kv_seed);
    CHECK(id.fingerprint == ia.fingerprint && id.kv_seed != ia.kv_seed);
    CHECK(ie.fingerprint == ia.fingerprint && ie.kv_seed != ia.kv_seed);
    unlink(a);
    unlink(b);
}

/* A tier 2 that answers every lookup with one block: the one it recorded (the first block
 * offered to it, with the parent and tokens it was computed from). Its index thus maps any
 * name, the victim's included, to the attacker's block: what a name collision produces. */
typedef struct {
    size_t bytes;
    uint8_t *kv;          /* [bytes] */
    uint64_t parent;
    int32_t tokens[16];
    int have, recording, fetches;
} forged_tier_t;

static int ft_lookup(void *arg, const uint64_t *names, int n)
{
    forged_tier_t *t = arg;
    (void)names;
    return t->have && !t->recording && n > 0 ? 1 : 0;
}

static int ft_fetch(void *arg, int i, void *dst, uint64_t *parent, int32_t *tokens)
{
    forged_tier_t *t = arg;
    if (i != 0 || !t->have) return -1;
    memcpy(dst, t->kv, t->bytes);
    *parent = t->parent;
    memcpy(tokens, t->tokens, sizeof t->tokens);
    t->fetches++;
    return 0;
}

static void *ft_store_begin(void *arg, uint64_t name, uint64_t parent, const int32_t *tokens)
{
    forged_tier_t *t = arg;
    (void)name;
    if (!t->recording || t->have) return NULL;
    t->parent = parent;
    memcpy(t->tokens, tokens, sizeof t->tokens);
    return t->kv;
}

static void ft_store_commit(void *arg, void *buf, int ok)
{
    forged_tier_t *t = arg;
    (void)buf;
    if (ok) t->have = 1;
}

/* Issue 18.1: KV computed from other tokens, found under the victim's block name in tier 2, is
 * a miss: the victim's text equals a cold run's, cached_tokens is 0, a mismatch is counted. The
 * attacker's own prompt still hits the same block (the injection path works). */
static void test_forged_tier2_block(void)
{
    static const char *VICTIM =
        "Once upon a time, there was a little girl named Lily. She loved to play outside";
    static const char *ATTACKER =
        "The big brown dog ran to the tall green tree and barked at a small cat. It was";
    unsigned char secret[ENGINE_KV_SECRET_BYTES] = {9, 9, 9};
    engine_config_t c;
    base_cfg(&c);
    c.kv_secret = secret;
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0;
    rq.max_tokens = 24;
    res_t cold[2], got[2];
    memset(cold, 0, sizeof cold);
    memset(got, 0, sizeof got);
    const char *pv[1] = {VICTIM}, *pa[1] = {ATTACKER};
    engine_t *e = mk(&c); /* cold runs, no tier */
    CHECK(e && run(e, 1, pv, &rq, &cold[0]) == 0 && run(e, 1, pa, &rq, &cold[1]) == 0);
    engine_free(e);
    CHECK(cold[0].n_cached == 0 && cold[1].n_cached == 0 && strcmp(cold[0].text, cold[1].text));

    forged_tier_t ft = {0};
    engine_kv_tier_t tier = {&ft, ft_lookup, ft_fetch, ft_store_begin, ft_store_commit};
    char err[256];
    e = mk(&c); /* the attacker's process: records its first block */
    CHECK(e != NULL);
    if (e) {
        engine_info_t info;
        engine_info(e, &info);
        ft.bytes = info.kv_block_bytes;
        ft.kv = malloc(ft.bytes);
        ft.recording = 1;
        CHECK(engine_set_kv_tier(e, &tier, err, sizeof err) == 0);
        res_t r = {0};
        CHECK(run(e, 1, pa, &rq, &r) == 0);
        res_clear(&r, 1);
        engine_free(e);
    }
    CHECK(ft.have == 1);
    ft.recording = 0;
    e = mk(&c); /* the victim's process: its tier 1 is empty, tier 2 is forged */
    CHECK(e != NULL);
    if (e && ft.have) {
        CHECK(engine_set_kv_tier(e, &tier, err, sizeof err) == 0);
        CHECK(run(e, 1, pv, &rq, &got[0]) == 0);
        engine_stats_t st;
        engine_stats(e, &st);
        CHECKF(got[0].n_cached == 0, "victim cached_tokens %d (forged block used)",
               got[0].n_cached);
        CHECKF(got[0].text && strcmp(got[0].text, cold[0].text) == 0,
               "victim text differs from a cold run: '%s' vs '%s'", got[0].text, cold[0].text);
        CHECK(ft.fetches == 1 && st.kv_mismatches == 1 && st.tier2_hits == 0);
        engine_free(e);
    }
    e = mk(&c); /* control: the block's own tokens do hit it */
    if (e && ft.have) {
        CHECK(engine_set_kv_tier(e, &tier, err, sizeof err) == 0);
        CHECK(run(e, 1, pa, &rq, &got[1]) == 0);
        CHECK(got[1].n_cached == 16 && got[1].text && strcmp(got[1].text, cold[1].text) == 0);
    }
    engine_free(e);
    free(ft.kv);
    res_clear(cold, 2);
    res_clear(got, 2);
}

/* cache_scope (cache.isolation = tenant): a prefix cached by one scope is not reused, nor
 * reported as cached, for another; the same scope reuses it. */
static void test_cache_scope(void)
{
    static const char *P =
        "Once upon a time, there was a little girl named Lily. She loved to play outside";
    engine_config_t c;
    base_cfg(&c);
    engine_t *e = mk(&c);
    CHECK(e != NULL);
    if (!e) return;
    engine_request_t rq;
    engine_request_default(&rq);
    rq.sampling.temperature = 0;
    rq.max_tokens = 4;
    const char *p[1] = {P};
    res_t r[4];
    memset(r, 0, sizeof r);
    rq.cache_scope = "tenant-a";
    CHECK(run(e, 1, p, &rq, &r[0]) == 0);
    rq.cache_scope = "tenant-b";
    CHECK(run(e, 1, p, &rq, &r[1]) == 0);
    rq.cache_scope = NULL;
    CHECK(run(e, 1, p, &rq, &r[2]) == 0);
    rq.cache_scope = "tenant-a";
    CHECK(run(e, 1, p, &rq, &r[3]) == 0);
    CHECKF(r[0].n_cached == 0 && r[1].n_cached == 0 && r[2].n_cached == 0,
           "cached across scopes: %d %d %d", r[0].n_cached, r[1].n_cached, r[2].n_cached);
    CHECK(r[3].n_cached >= 16);
    for (int i = 1; i < 4; i++) CHECK(r[i].text && strcmp(r[i].text, r[0].text) == 0);
    res_clear(r, 4);
    engine_free(e);
}

int main(void)
{
    FILE *f = fopen(MODEL, "rb");
    if (!f) {
        fprintf(stderr, "skip: %s not found\n", MODEL);
        return 77;
    }
    fclose(f);
    test_golden();
    test_batch_invariance();
    test_shared_prefix();
    test_prefix_compute_once();
    test_admission_order();
    test_preemption();
    test_seeds();
    test_stop_strings();
    test_validation();
    test_version_fingerprints();
    test_forged_tier2_block();
    test_cache_scope();
    return check_exit();
}
