/* bench/bench_prefix.c: the prefix cache, on vs off, in one run, printed as a markdown table.
 *   shared    N requests (default 64) sharing a P-token prefix (1024), each with an S-token
 *             unique suffix (32) and G generated tokens (32), all submitted at once: wall time,
 *             generated tokens/s and mean TTFT, prefix cache off vs on (tier 1)
 *   ttft      one request alone: cold (nothing cached), tier-1 hit (its prefix computed by an
 *             earlier request of the same engine) and, with --redis, cross-process tier-2 hit (the
 *             prefix computed and stored by another process; this process starts empty)
 *   unique    N requests with no shared prefix (U-token random prompts, default 256): the cost
 *             of the cache (tier 1, plus tier 2 with --redis) against cache off
 * Each figure is measured R times (default 3; the shared/unique workloads default to 1 with
 * cache off, as they are long: --reps-long, 0 skips them) and printed as min / median / max.
 * Prompts are random token ids from a fixed seed, so every run and mode sees the same requests.
 * usage: bench_prefix MODEL [--threads 2] [--requests 64] [--prefix 1024] [--suffix 32]
 *                           [--gen 32] [--unique 256] [--reps 3] [--kv-type f16]
 *                           [--reps-long 1] [--workloads shared,ttft,unique]
 *                           [--redis HOST:PORT] [--arena PATH] [--json FILE]
 * --json appends one JSON object per printed figure to FILE (read by bench/run.py): key, figure,
 * unit, min, median, max, n (samples) and the workload's requests / prefix / suffix / gen. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/benchlib.h"
#include "cache/cache.h"
#include "engine/engine.h"

typedef struct {
    const char *model, *kv_type, *redis_host, *arena;
    FILE *json; /* NULL: no JSON output */
    int redis_port;
    int threads, n_req, prefix, suffix, gen, unique, reps;
    char ns[64];
} opts_t;

typedef struct {
    int done;
    double ttft_sum;   /* seconds */
    int n_cached;      /* prompt tokens from the cache, all requests */
} run_t;

static void on_done(void *arg, const engine_result_t *r)
{
    run_t *x = arg;
    x->done++;
    x->ttft_sum += (double)(r->t_first_token - r->t_submit) * 1e-9;
    x->n_cached += r->n_cached;
}

static engine_t *mk_engine(const opts_t *o, int prefix_cache)
{
    /* one secret for every engine of the run, so a fresh engine finds tier 2's blocks */
    static const unsigned char secret[ENGINE_KV_SECRET_BYTES] = "bench_prefix: one secret";
    engine_config_t c;
    engine_config_default(&c);
    c.kv_secret = secret;
    c.model_path = o->model;
    c.threads = o->threads;
    c.kv_type = o->kv_type;
    c.prefix_cache = prefix_cache;
    c.max_seqs = 64;
    c.kv_mem_mb = 2048;
    char err[512];
    engine_t *e = engine_new(&c, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new: %s\n", err);
    return e;
}

/* Tier 2 for e (NULL when no --redis). */
static cache_t *mk_cache(const opts_t *o, engine_t *e)
{
    if (!o->redis_host) return NULL;
    cache_config_t kc;
    cache_config_default(&kc);
    kc.redis_host = o->redis_host;
    kc.redis_port = o->redis_port;
    kc.arena_path = o->arena;
    kc.arena_mb = 2048;
    kc.namespace_ = o->ns;
    kc.write_queue = 256;
    kc.log_level = 1; /* warnings only: the table stays readable */
    engine_info_t info;
    engine_info(e, &info);
    cache_geometry_t geo = {info.kv_seed, info.block_tokens, info.kv_block_bytes};
    char err[512];
    cache_t *c = cache_new(&kc, &geo, err, sizeof err);
    if (!c) {
        fprintf(stderr, "cache_new: %s\n", err);
        return NULL;
    }
    engine_kv_tier_t t;
    cache_engine_tier(c, &t);
    if (engine_set_kv_tier(e, &t, err, sizeof err)) {
        fprintf(stderr, "engine_set_kv_tier: %s\n", err);
        cache_free(c);
        return NULL;
    }
    return c;
}

/* prompts[i] = [shared prefix | request i's own tokens]; shared = 0 gives unique prompts. */
static int32_t *mk_prompt(const opts_t *o, int n_vocab, int shared, int i, int *n)
{
    int len = shared ? o->prefix + o->suffix : o->unique;
    int32_t *t = malloc(sizeof *t * (size_t)len);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    int k = 0;
    if (shared)
        for (; k < o->prefix; k++) t[k] = bench_rnd_tok(&st, n_vocab);
    st = 0x2545f4914f6cdd1dull + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull + (uint64_t)shared;
    for (; k < len; k++) t[k] = bench_rnd_tok(&st, n_vocab);
    *n = len;
    return t;
}

/* Submits requests [first, first + n) and runs them; returns wall seconds or -1. */
static double run_reqs(const opts_t *o, engine_t *e, int shared, int first, int n, run_t *r)
{
    engine_info_t info;
    engine_info(e, &info);
    char err[512];
    double t0 = bench_now();
    for (int i = first; i < first + n; i++) {
        int len;
        int32_t *p = mk_prompt(o, info.n_vocab, shared, i, &len);
        engine_request_t rq;
        engine_request_default(&rq);
        rq.prompt = p;
        rq.n_prompt = len;
        rq.max_tokens = o->gen;
        rq.ignore_eos = 1;
        rq.sampling.temperature = 0;
        int rc = engine_submit(e, &rq, on_done, r, NULL, err, sizeof err);
        free(p);
        if (rc) {
            fprintf(stderr, "submit: %s\n", err);
            return -1;
        }
    }
    if (engine_run(e, err, sizeof err)) {
        fprintf(stderr, "run: %s\n", err);
        return -1;
    }
    return bench_now() - t0;
}

typedef struct {
    double v[16];
    int n;
} fig_t;

static void fig_add(fig_t *f, double x)
{
    if (f->n < 16) f->v[f->n++] = x;
}

/* Prints one table row and, with --json, its JSON line (key: a stable identifier for run.py). */
static void row(const opts_t *o, const char *key, const char *name, fig_t *f, const char *unit)
{
    qsort(f->v, (size_t)f->n, sizeof f->v[0], bench_cmp_double);
    if (!f->n) return;
    printf("| %-44s | %10.2f | %10.2f | %10.2f | %-8s |\n", name, f->v[0], f->v[f->n / 2],
           f->v[f->n - 1], unit);
    if (o->json) {
        fprintf(o->json, "{\"key\": \"%s\", \"figure\": \"%s\", \"unit\": \"%s\", \"min\": %.4f, "
                         "\"median\": %.4f, \"max\": %.4f, \"n\": %d, \"requests\": %d, \"prefix\": %d, "
                         "\"suffix\": %d, \"gen\": %d, \"unique\": %d, \"threads\": %d}\n",
                key, name, unit, f->v[0], f->v[f->n / 2], f->v[f->n - 1], f->n, o->n_req, o->prefix,
                o->suffix, o->gen, o->unique, o->threads);
        fflush(o->json);
    }
}

static double med(fig_t *f)
{
    qsort(f->v, (size_t)f->n, sizeof f->v[0], bench_cmp_double);
    return f->n ? f->v[f->n / 2] : 0;
}

/* One whole workload on a fresh engine: fills throughput (generated tok/s) and mean TTFT (ms). */
static int workload(const opts_t *o, int cache_on, int tier2, int shared, fig_t *tps, fig_t *ttft,
                    fig_t *cached)
{
    engine_t *e = mk_engine(o, cache_on);
    if (!e) return -1;
    cache_t *c = tier2 ? mk_cache(o, e) : NULL;
    if (tier2 && !c) {
        engine_free(e);
        return -1;
    }
    run_t r = {0};
    double wall = run_reqs(o, e, shared, 0, o->n_req, &r);
    engine_free(e);
    cache_free(c);
    if (wall < 0) return -1;
    fig_add(tps, (double)o->n_req * o->gen / wall);
    fig_add(ttft, r.ttft_sum / r.done * 1e3);
    if (cached) fig_add(cached, (double)r.n_cached / o->n_req);
    return 0;
}

int main(int argc, char **argv)
{
    opts_t o = {.kv_type = "f16", .threads = 2, .n_req = 64, .prefix = 1024, .suffix = 32,
                .gen = 32, .unique = 256, .reps = 3};
    int reps_long = 1;
    const char *which = "shared,ttft,unique";
    char host[256];
    if (argc < 2 || argv[1][0] == '-') goto usage;
    o.model = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) goto usage;
        i++;
        if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--requests")) o.n_req = atoi(v);
        else if (!strcmp(a, "--prefix")) o.prefix = atoi(v);
        else if (!strcmp(a, "--suffix")) o.suffix = atoi(v);
        else if (!strcmp(a, "--gen")) o.gen = atoi(v);
        else if (!strcmp(a, "--unique")) o.unique = atoi(v);
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--reps-long")) reps_long = atoi(v);
        else if (!strcmp(a, "--kv-type")) o.kv_type = v;
        else if (!strcmp(a, "--workloads")) which = v;
        else if (!strcmp(a, "--arena")) o.arena = v;
        else if (!strcmp(a, "--json")) {
            if (o.json) goto usage;
            o.json = fopen(v, "a");
            if (!o.json) {
                perror(v);
                return 1;
            }
        }
        else if (!strcmp(a, "--redis")) {
            snprintf(host, sizeof host, "%s", v);
            char *colon = strrchr(host, ':');
            o.redis_port = 6379;
            if (colon) {
                *colon = 0;
                o.redis_port = atoi(colon + 1);
            }
            o.redis_host = host;
        } else goto usage;
    }
    if (o.n_req < 1 || o.prefix < 16 || o.suffix < 1 || o.gen < 1 || o.unique < 2 || o.reps < 1 ||
        o.reps > 16 || reps_long < 0 || reps_long > 16)
        goto usage;
    snprintf(o.ns, sizeof o.ns, "bench-prefix-%d", (int)getpid());
    char arena_buf[256];
    if (o.redis_host && !o.arena) {
        snprintf(arena_buf, sizeof arena_buf, "/dev/shm/spillway-bench-%d.arena", (int)getpid());
        o.arena = arena_buf;
    }

    printf("bench_prefix %s: %d threads, kv %s; shared: %d requests x (%d prefix + %d own) tokens, "
           "%d generated; unique: %d-token prompts%s\n\n",
           o.model, o.threads, o.kv_type, o.n_req, o.prefix, o.suffix, o.gen, o.unique,
           o.redis_host ? "; tier 2 via Redis" : "");
    printf("| %-44s | %10s | %10s | %10s | %-8s |\n", "figure", "min", "median", "max", "unit");
    printf("|%s|------------|------------|------------|----------|\n",
           "----------------------------------------------");
    fflush(stdout);

    /* ---- shared-prefix workload ---- */
    fig_t off_tps = {0}, off_ttft = {0}, on_tps = {0}, on_ttft = {0}, on_cached = {0};
    double speedup = 0, r_warm = 0, r_x = 0, cost = 0;
    if (strstr(which, "shared")) {
    for (int r = 0; r < reps_long; r++)
        if (workload(&o, 0, 0, 1, &off_tps, &off_ttft, NULL)) return 1;
    for (int r = 0; r < o.reps; r++)
        if (workload(&o, 1, 0, 1, &on_tps, &on_ttft, &on_cached)) return 1;
    row(&o, "shared_tps_off", "shared: generated tok/s, cache off", &off_tps, "tok/s");
    row(&o, "shared_tps_on", "shared: generated tok/s, cache on", &on_tps, "tok/s");
    row(&o, "shared_ttft_off", "shared: mean TTFT, cache off", &off_ttft, "ms");
    row(&o, "shared_ttft_on", "shared: mean TTFT, cache on", &on_ttft, "ms");
    row(&o, "shared_cached_on", "shared: cached prompt tokens per request", &on_cached, "tokens");
    if (off_tps.n) speedup = med(&on_tps) / med(&off_tps);
    fflush(stdout);
    }

    /* ---- TTFT of one request ---- */
    fig_t cold = {0}, warm = {0}, xproc = {0};
    if (strstr(which, "ttft")) {
    for (int r = 0; r < o.reps; r++) {
        engine_t *e = mk_engine(&o, 1);
        if (!e) return 1;
        run_t a = {0}, b = {0};
        if (run_reqs(&o, e, 1, 1000 + 2 * r, 1, &a) < 0 || run_reqs(&o, e, 1, 1001 + 2 * r, 1, &b) < 0)
            return 1;
        engine_free(e);
        fig_add(&cold, a.ttft_sum * 1e3);
        fig_add(&warm, b.ttft_sum * 1e3);
    }
    row(&o, "ttft_cold", "one request: TTFT cold", &cold, "ms");
    row(&o, "ttft_tier1", "one request: TTFT, prefix in tier 1", &warm, "ms");
    r_warm = med(&warm) / med(&cold);
    if (o.redis_host) {
        for (int r = 0; r < o.reps; r++) {
            snprintf(o.ns, sizeof o.ns, "bench-prefix-%d-x%d", (int)getpid(), r);
            pid_t pid = fork();
            if (pid == 0) { /* the other process: computes and stores the prefix, exits */
                engine_t *e = mk_engine(&o, 1);
                cache_t *c = e ? mk_cache(&o, e) : NULL;
                run_t a = {0};
                int ok = c && run_reqs(&o, e, 1, 2000 + r, 1, &a) >= 0;
                engine_free(e);
                cache_free(c); /* drains the stores */
                _exit(ok ? 0 : 1);
            }
            int status;
            if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
                WEXITSTATUS(status)) {
                fprintf(stderr, "the storing process failed\n");
                return 1;
            }
            engine_t *e = mk_engine(&o, 1);
            cache_t *c = e ? mk_cache(&o, e) : NULL;
            if (!c) return 1;
            run_t b = {0};
            if (run_reqs(&o, e, 1, 3000 + r, 1, &b) < 0) return 1;
            engine_stats_t st;
            engine_stats(e, &st);
            engine_free(e);
            cache_free(c);
            if (b.n_cached < o.prefix - 16) {
                fprintf(stderr, "cross-process: only %d tokens from tier 2\n", b.n_cached);
                return 1;
            }
            fig_add(&xproc, b.ttft_sum * 1e3);
        }
        row(&o, "ttft_tier2", "one request: TTFT, prefix in tier 2 (other process)", &xproc, "ms");
        r_x = med(&xproc) / med(&cold);
    }
    fflush(stdout);
    }

    /* ---- no shared prefix: the cache's cost ---- */
    fig_t u_off = {0}, u_off_t = {0}, u_on = {0}, u_on_t = {0};
    if (strstr(which, "unique")) {
    for (int r = 0; r < reps_long; r++) {
        if (workload(&o, 0, 0, 0, &u_off, &u_off_t, NULL)) return 1;
        snprintf(o.ns, sizeof o.ns, "bench-prefix-%d-u%d", (int)getpid(), r);
        if (workload(&o, 1, o.redis_host != NULL, 0, &u_on, &u_on_t, NULL)) return 1;
    }
    row(&o, "unique_tps_off", "unique: generated tok/s, cache off", &u_off, "tok/s");
    row(&o, "unique_tps_on", o.redis_host ? "unique: generated tok/s, cache on (tiers 1+2)"
                     : "unique: generated tok/s, cache on (tier 1)", &u_on, "tok/s");
    cost = 1.0 - med(&u_on) / med(&u_off);
    }

    printf("\n");
    if (speedup > 0) printf("shared-prefix throughput with the cache: %.2fx (goal >= 4x)\n", speedup);
    if (r_warm > 0) printf("TTFT with the prefix in tier 1: %.3fx of cold (goal <= 0.2x)\n", r_warm);
    if (r_x > 0) printf("TTFT with the prefix in another process's tier 2: %.3fx of cold (goal <= 0.25x)\n", r_x);
    if (strstr(which, "unique") && u_off.n)
        printf("no shared prefix: the cache costs %.1f%% of throughput (goal < 3%%)\n", cost * 100);
    if (o.redis_host) unlink(o.arena);
    if (o.json) fclose(o.json);
    return 0;
usage:
    fprintf(stderr, "usage: bench_prefix MODEL [--threads N] [--requests N] [--prefix P] [--suffix S] "
                    "[--gen G] [--unique U] [--reps R] [--reps-long R] [--kv-type f16|f32] "
                    "[--workloads shared,ttft,unique] "
                    "[--redis HOST:PORT] [--arena PATH] [--json FILE]\n");
    return 2;
}
