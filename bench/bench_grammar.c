/* bench/bench_grammar.c: the cost of structured output (engine/grammar.h) on the engine.
 * For each batch size N (1, 16, 64 by default) it runs N sequences of a short random prompt
 * generating up to G tokens (default 64) at temperature 1 (seed = sequence number) twice:
 * unconstrained (EOS ignored, so every sequence makes G tokens) and constrained by the JSON
 * Schema in SCHEMA (compiled once per run, shared by the N sequences, mask cache cold at the
 * start). It prints a markdown table: generated tokens/s of both, the constrained run's time in
 * masks and grammar advances (engine_stats.grammar_seconds) as a share of its wall time and per
 * generated token, and the mask cache's hits and misses.
 * usage: bench_grammar MODEL SCHEMA.json [--threads N] [--gen G] [--batches 1,16,64] */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/benchlib.h"
#include "consumer/json_schema.h"
#include "engine/engine.h"
#include "engine/grammar.h"

typedef struct {
    int done;
    long tokens;
    int stopped;
} cnt_t;

static void on_done(void *arg, const engine_result_t *r)
{
    cnt_t *c = arg;
    c->done++;
    c->tokens += r->n_tokens;
    c->stopped += r->finish == ENGINE_FINISH_STOP;
}

typedef struct {
    double wall, grammar_s;
    long tokens;
    int stopped;
    uint64_t hits, misses;
} run_t;

static int run(engine_t *e, int n_seq, int gen, grammar_t *g, run_t *out)
{
    engine_info_t info;
    engine_info(e, &info);
    cnt_t cnt = {0};
    char err[512];
    int32_t prompt[8];
    engine_stats_t st0, st1;
    engine_stats(e, &st0);
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < 8; i++) prompt[i] = (int32_t)((s * 7919 + i * 104729) % info.n_vocab);
        engine_request_t rq;
        engine_request_default(&rq);
        rq.prompt = prompt;
        rq.n_prompt = 8;
        rq.sampling.temperature = 1.0f;
        rq.sampling.seed = (uint64_t)s + 1;
        rq.max_tokens = gen;
        rq.ignore_eos = g == NULL;
        rq.grammar = g;
        if (engine_submit(e, &rq, on_done, &cnt, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "submit: %s\n", err);
            return -1;
        }
    }
    double t0 = bench_now();
    if (engine_run(e, err, sizeof err) != 0) {
        fprintf(stderr, "run: %s\n", err);
        return -1;
    }
    out->wall = bench_now() - t0;
    engine_stats(e, &st1);
    out->grammar_s = st1.grammar_seconds - st0.grammar_seconds;
    out->tokens = cnt.tokens;
    out->stopped = cnt.stopped;
    out->hits = out->misses = 0;
    if (g) grammar_cache_stats(g, &out->hits, &out->misses);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_grammar MODEL SCHEMA.json [--threads N] [--gen G] "
                        "[--batches 1,16,64]\n");
        return 2;
    }
    engine_config_t cfg;
    engine_config_default(&cfg);
    cfg.model_path = argv[1];
    cfg.prefix_cache = 0;
    int gen = 64;
    const char *batches = "1,16,64";
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) cfg.threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen")) gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batches")) batches = argv[i + 1];
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    json_error_t je;
    json_t *schema = json_load_file(argv[2], JSON_DECODE_ANY, &je);
    char err[512];
    if (!schema) {
        fprintf(stderr, "%s:%d: %s\n", argv[2], je.line, je.text);
        return 1;
    }
    char *text = json_schema_to_grammar(schema, err, sizeof err);
    json_decref(schema);
    if (!text) {
        fprintf(stderr, "%s: %s\n", argv[2], err);
        return 1;
    }
    int maxb = 1;
    for (const char *p = batches; *p;) {
        int b = atoi(p);
        if (b > maxb) maxb = b;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    cfg.max_seqs = maxb;
    cfg.max_batch_tokens = maxb * 8 > 512 ? maxb * 8 : 512;
    engine_t *e = engine_new(&cfg, err, sizeof err);
    if (!e) {
        fprintf(stderr, "%s\n", err);
        free(text);
        return 1;
    }
    engine_info_t info;
    engine_info(e, &info);
    printf("model %s: %s, vocab %d, dim %d, %d layers, %d threads, kernels %s; schema %s, up "
           "to %d tokens per sequence, temperature 1\n\n",
           argv[1], info.arch, info.n_vocab, info.dim, info.n_layers, info.threads, info.kernels,
           argv[2], gen);
    printf("| seqs | free tok/s | schema tok/s | schema tokens (stopped seqs) | grammar s | "
           "grammar share of wall | grammar us/token | mask cache hits / misses |\n"
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int rc = 0;
    for (const char *p = batches; *p && rc == 0;) {
        int n = atoi(p);
        run_t a, b;
        grammar_t *g = grammar_parse(text, strlen(text), err, sizeof err);
        if (!g) {
            fprintf(stderr, "grammar: %s\n", err);
            rc = 1;
            break;
        }
        if (run(e, n, gen, NULL, &a) || run(e, n, gen, g, &b)) rc = 1;
        grammar_release(g);
        if (rc) break;
        printf("| %d | %.1f | %.1f | %ld (%d) | %.3f | %.1f%% | %.0f | %llu / %llu |\n", n,
               (double)a.tokens / a.wall, (double)b.tokens / b.wall, b.tokens, b.stopped,
               b.grammar_s, 100.0 * b.grammar_s / b.wall,
               b.tokens ? 1e6 * b.grammar_s / (double)b.tokens : 0.0,
               (unsigned long long)b.hits, (unsigned long long)b.misses);
        fflush(stdout);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    engine_free(e);
    free(text);
    return rc;
}
