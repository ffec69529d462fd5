/* cli/generate.c: `spillway generate`: one prompt, or a JSONL file of prompts run as one
 * continuous batch (one JSON result per line, in completion order). */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache.h"
#include "consumer/json_schema.h"
#include "engine/grammar.h"
#include "cli.h"

#define MAX_STOP 16

typedef struct {
    int echo;             /* -p mode: print the prompt before the completion */
    int jsonl;
    long index;           /* line number in -f mode */
    char *id;             /* request id (-f mode), owned */
    uint64_t n_done;
} gen_req_t;

typedef struct {
    FILE *out;
    uint64_t done, prompt_tokens, gen_tokens, cached_tokens;
    double ttft_sum;
    int failed;
} gen_ctx_t;

static double secs(int64_t a, int64_t b) { return (double)(b - a) * 1e-9; }

static void on_done(void *arg, const engine_result_t *r)
{
    gen_ctx_t *g = arg;
    gen_req_t *q = r->user;
    g->done++;
    g->prompt_tokens += (uint64_t)r->n_prompt;
    g->gen_tokens += (uint64_t)r->n_tokens;
    g->cached_tokens += (uint64_t)r->n_cached;
    if (r->t_first_token) g->ttft_sum += secs(r->t_submit, r->t_first_token);
    if (!q->jsonl) {
        fwrite(r->text, 1, r->text_len, g->out);
        fputc('\n', g->out);
        fflush(g->out);
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(q->id));
    json_object_set_new(o, "index", json_integer(q->index));
    json_object_set_new(o, "text", json_stringn(r->text, r->text_len));
    json_object_set_new(o, "finish_reason", json_string(engine_finish_name(r->finish)));
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(r->n_prompt));
    json_object_set_new(u, "cached_tokens", json_integer(r->n_cached));
    json_object_set_new(u, "completion_tokens", json_integer(r->n_tokens));
    json_object_set_new(o, "usage", u);
    json_t *t = json_object();
    json_object_set_new(t, "queue_ms", json_real(secs(r->t_submit, r->t_first_scheduled) * 1e3));
    json_object_set_new(t, "ttft_ms", json_real(r->t_first_token ? secs(r->t_submit, r->t_first_token) * 1e3 : 0));
    json_object_set_new(t, "total_ms", json_real(secs(r->t_submit, r->t_finish) * 1e3));
    json_object_set_new(o, "timings", t);
    if (r->n_logprobs > 0) {
        json_t *lp = json_array();
        for (int i = 0; i < r->n_tokens; i++) {
            json_t *e = json_object();
            json_object_set_new(e, "id", json_integer(r->logprobs[i].id));
            json_object_set_new(e, "logprob", json_real(r->logprobs[i].logprob));
            json_t *top = json_array();
            for (int k = 0; k < r->n_logprobs; k++) {
                const engine_logprob_t *x = &r->top_logprobs[(size_t)i * r->n_logprobs + k];
                json_t *te = json_object();
                json_object_set_new(te, "id", json_integer(x->id));
                json_object_set_new(te, "logprob", json_real(x->logprob));
                json_array_append_new(top, te);
            }
            json_object_set_new(e, "top", top);
            json_array_append_new(lp, e);
        }
        json_object_set_new(o, "logprobs", lp);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(7));
    if (s) {
        fputs(s, g->out);
        fputc('\n', g->out);
        fflush(g->out);
        free(s);
    } else {
        g->failed = 1;
    }
    json_decref(o);
    free(q->id);
    free(q);
}

/* Request fields that a JSONL line may carry; everything else is ignored. */
static int parse_line(engine_t *e, json_t *o, const engine_request_t *defaults, engine_request_t *rq,
                      int32_t **toks, const char **stops, grammar_t **line_grammar, char *err,
                      size_t errlen)
{
    *rq = *defaults;
    rq->n_stop = 0;
    json_t *v;
    const json_t *gv = json_object_get(o, "grammar"), *rv = json_object_get(o, "response_format");
    if (gv && json_is_null(gv)) gv = NULL;
    if (rv && json_is_null(rv)) rv = NULL;
    if (gv || rv) { /* the line's own structured output replaces --grammar / --json-schema */
        int kind;
        if (json_schema_request_grammar(gv, rv, line_grammar, &kind, err, errlen) != 0) return -1;
        rq->grammar = *line_grammar;
    }
    const char *prompt = NULL;
    size_t plen = 0;
    v = json_object_get(o, "prompt");
    if (!json_is_string(v)) {
        snprintf(err, errlen, "\"prompt\" must be a string");
        return -1;
    }
    prompt = json_string_value(v);
    plen = json_string_length(v);
#define NUM(name, field, isint)                                                   \
    if ((v = json_object_get(o, name))) {                                         \
        if (!json_is_number(v) || (isint && !json_is_integer(v))) {               \
            snprintf(err, errlen, "\"%s\" must be a%s number", name, isint ? "n integer" : ""); \
            return -1;                                                            \
        }                                                                         \
        field = json_number_value(v);                                             \
    }
    double d;
    d = rq->max_tokens; NUM("max_tokens", d, 1); rq->max_tokens = (int)(d > 1e9 ? 1e9 : d < -1 ? -1 : d);
    d = rq->sampling.temperature; NUM("temperature", d, 0); rq->sampling.temperature = (float)d;
    d = rq->sampling.top_p; NUM("top_p", d, 0); rq->sampling.top_p = (float)d;
    d = rq->sampling.top_k; NUM("top_k", d, 1); rq->sampling.top_k = (int)(d > 1e9 ? 1e9 : d);
    d = rq->sampling.min_p; NUM("min_p", d, 0); rq->sampling.min_p = (float)d;
    d = rq->sampling.repeat_penalty; NUM("repeat_penalty", d, 0); rq->sampling.repeat_penalty = (float)d;
    d = rq->sampling.presence_penalty; NUM("presence_penalty", d, 0); rq->sampling.presence_penalty = (float)d;
    d = rq->sampling.frequency_penalty; NUM("frequency_penalty", d, 0); rq->sampling.frequency_penalty = (float)d;
    d = rq->sampling.n_logprobs; NUM("logprobs", d, 1); rq->sampling.n_logprobs = (int)(d > 100 ? 100 : d);
    d = rq->priority; NUM("priority", d, 1); rq->priority = (int)(d > 1e6 ? 1e6 : d < -1e6 ? -1e6 : d);
    if ((v = json_object_get(o, "seed"))) {
        if (!json_is_integer(v)) {
            snprintf(err, errlen, "\"seed\" must be an integer");
            return -1;
        }
        rq->sampling.seed = (uint64_t)json_integer_value(v);
    }
#undef NUM
    if ((v = json_object_get(o, "n")) && !json_is_null(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 1)) {
        snprintf(err, errlen, "\"n\": generate -f runs one choice per line (the worker serves n > 1)");
        return -1;
    }
    if ((v = json_object_get(o, "stop"))) {
        if (json_is_string(v)) {
            stops[rq->n_stop++] = json_string_value(v);
        } else if (json_is_array(v) && json_array_size(v) <= MAX_STOP) {
            for (size_t i = 0; i < json_array_size(v); i++) {
                json_t *x = json_array_get(v, i);
                if (!json_is_string(x) || json_string_length(x) == 0) {
                    snprintf(err, errlen, "\"stop\" entries must be non-empty strings");
                    return -1;
                }
                stops[rq->n_stop++] = json_string_value(x);
            }
        } else {
            snprintf(err, errlen, "\"stop\" must be a string or an array of at most %d strings", MAX_STOP);
            return -1;
        }
    }
    rq->stop = stops;
    int n = engine_tokenize(e, prompt, plen, 1, 1, NULL, 0);
    if (n < 0) {
        snprintf(err, errlen, "tokenizer failed");
        return -1;
    }
    *toks = malloc(sizeof **toks * (size_t)(n > 0 ? n : 1));
    if (!*toks) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    engine_tokenize(e, prompt, plen, 1, 1, *toks, n);
    rq->prompt = *toks;
    rq->n_prompt = n;
    rq->text_at_start = plen == 0; /* otherwise the completion continues the prompt's text */
    return 0;
}

int cli_generate(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},
        {"max-tokens", required_argument, 0, 'n'},
        {"temp", required_argument, 0, 't'},
        {"top-p", required_argument, 0, 2001},
        {"top-k", required_argument, 0, 2002},
        {"min-p", required_argument, 0, 2003},
        {"seed", required_argument, 0, 's'},
        {"stop", required_argument, 0, 2004},
        {"repeat-penalty", required_argument, 0, 2005},
        {"no-echo", no_argument, 0, 2006},
        {"ignore-eos", no_argument, 0, 2007},
        {"stats", no_argument, 0, 2008},
        {"cache-redis", required_argument, 0, 2009},
        {"cache-arena", required_argument, 0, 2010},
        {"cache-arena-mb", required_argument, 0, 2011},
        {"cache-timeout-ms", required_argument, 0, 2012},
        {"cache-secret", required_argument, 0, 2013},
        {"grammar", required_argument, 0, 2014},
        {"json-schema", required_argument, 0, 2015},
        {"help", no_argument, 0, 'h'},
        CLI_ENGINE_LONGOPTS,
        {0, 0, 0, 0},
    };
    engine_config_t cfg;
    engine_config_default(&cfg);
    engine_request_t dr;
    engine_request_default(&dr);
    const char *prompt = NULL, *file = NULL, *grammar_file = NULL, *schema_file = NULL;
    const char *stops[MAX_STOP];
    int n_stop = 0, echo = 1, stats = 0;
    cache_config_t kc;
    cache_config_default(&kc);
    char redis_host[256] = "";
    cache_t *cache = NULL;
    long v;
    double d;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:p:f:n:t:s:h", longopts, NULL)) != -1) {
        int r = cli_engine_opt(&cfg, opt, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (opt) {
        case 'm': cfg.model_path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'f': file = optarg; break;
        case 'n': if (cli_parse_key("-n", "limits.default_max_tokens", optarg, &v)) return 2; dr.max_tokens = (int)v; break;
        case 't': if (cli_parse_double("-t", optarg, &d)) return 2; dr.sampling.temperature = (float)d; break;
        case 2001: if (cli_parse_double("--top-p", optarg, &d)) return 2; dr.sampling.top_p = (float)d; break;
        case 2002: if (cli_parse_int("--top-k", optarg, 0, 1 << 30, &v)) return 2; dr.sampling.top_k = (int)v; break;
        case 2003: if (cli_parse_double("--min-p", optarg, &d)) return 2; dr.sampling.min_p = (float)d; break;
        case 's': {
            char *end;
            dr.sampling.seed = strtoull(optarg, &end, 10);
            if (*end || end == optarg) { fprintf(stderr, "spillway: --seed: not an integer\n"); return 2; }
            break;
        }
        case 2004:
            if (n_stop == MAX_STOP || !*optarg) { fprintf(stderr, "spillway: at most %d non-empty --stop strings\n", MAX_STOP); return 2; }
            stops[n_stop++] = optarg;
            break;
        case 2005: if (cli_parse_double("--repeat-penalty", optarg, &d)) return 2; dr.sampling.repeat_penalty = (float)d; break;
        case 2006: echo = 0; break;
        case 2007: dr.ignore_eos = 1; break;
        case 2008: stats = 1; break;
        case 2009: {
            snprintf(redis_host, sizeof redis_host, "%s", optarg);
            char *colon = strrchr(redis_host, ':');
            if (colon) {
                *colon = 0;
                if (cli_parse_key("--cache-redis PORT", "cache.redis.port", colon + 1, &v)) return 2;
                kc.redis_port = (int)v;
            }
            kc.redis_host = redis_host;
            break;
        }
        case 2010: kc.arena_path = optarg; break;
        case 2011: if (cli_parse_key("--cache-arena-mb", "cache.arena.mb", optarg, &v)) return 2; kc.arena_mb = v; break;
        case 2012: if (cli_parse_key("--cache-timeout-ms", "cache.redis.timeout_ms", optarg, &v)) return 2; kc.cmd_timeout_ms = (int)v; break;
        case 2013: kc.secret_path = optarg; break;
        case 2014: grammar_file = optarg; break;
        case 2015: schema_file = optarg; break;
        case 'h':
            printf("usage: spillway generate -m MODEL [-p PROMPT | -f PROMPTS.jsonl] [options]\n"
                   "  -m, --model FILE     GGUF model\n"
                   "  -p, --prompt TEXT    one prompt; prints prompt + completion (default: empty\n"
                   "                       prompt, i.e. generation from BOS)\n"
                   "  -f, --file FILE      JSONL, one request per line: {\"id\", \"prompt\", \"max_tokens\",\n"
                   "                       \"temperature\", \"top_p\", \"top_k\", \"min_p\", \"seed\", \"stop\",\n"
                   "                       \"repeat_penalty\", \"presence_penalty\", \"frequency_penalty\",\n"
                   "                       \"logprobs\", \"priority\", \"grammar\", \"response_format\"};\n"
                   "                       prints one JSON result per line\n"
                   "  --grammar FILE       constrain every request to the EBNF grammar in FILE\n"
                   "  --json-schema FILE   constrain every request to JSON valid against the JSON\n"
                   "                       Schema in FILE (a line's grammar/response_format wins)\n");
            cli_key_help(stdout, "-n, --max-tokens N", "limits.default_max_tokens",
                         "tokens to generate at most (-f: for a line without \"max_tokens\")");
            printf("  -t, --temp T         temperature, 0 = greedy (default 1)\n"
                   "  --top-p P, --top-k K, --min-p P, --seed S, --repeat-penalty R\n"
                   "  --stop STR           stop string (repeatable, at most %d)\n"
                   "  --ignore-eos         keep generating past end-of-generation tokens\n"
                   "  --no-echo            -p mode: do not print the prompt\n"
                   "  --stats              print throughput figures to stderr\n", MAX_STOP);
            printf("The prefix cache's tier 2 (the workers' cache.* keys; PORT as cache.redis.port;\n"
                   "Redis password from SPILLWAY_CACHE_REDIS_PASSWORD):\n");
            cli_key_help(stdout, "--cache-redis HOST[:PORT]", "cache.redis.host", NULL);
            cli_key_help(stdout, "--cache-arena PATH", "cache.arena.path", NULL);
            cli_key_help(stdout, "--cache-arena-mb N", "cache.arena.mb", NULL);
            cli_key_help(stdout, "--cache-timeout-ms N", "cache.redis.timeout_ms", NULL);
            cli_key_help(stdout, "--cache-secret PATH", "cache.secret_file", NULL);
            printf("Engine options (the workers' keys of the same name):\n");
            cli_engine_help(stdout);
            return 0;
        default: return 2;
        }
    }
    if (!cfg.model_path || (prompt && file) || optind != argc) {
        fprintf(stderr, "usage: spillway generate -m MODEL [-p PROMPT | -f PROMPTS.jsonl] (see --help)\n");
        return 2;
    }
    dr.stop = stops;
    dr.n_stop = n_stop;
    char err[512];
    grammar_t *dgram = NULL;
    if (grammar_file && schema_file) {
        fprintf(stderr, "spillway: --grammar and --json-schema: give one\n");
        return 2;
    }
    if (grammar_file || schema_file) {
        json_t *gs = NULL, *rf = NULL;
        if (grammar_file) {
            FILE *gf = fopen(grammar_file, "rb");
            char *buf = NULL;
            size_t n = 0;
            if (gf) {
                fseek(gf, 0, SEEK_END);
                long sz = ftell(gf);
                fseek(gf, 0, SEEK_SET);
                buf = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
                if (buf) n = fread(buf, 1, (size_t)sz, gf);
                fclose(gf);
            }
            if (!buf) {
                perror(grammar_file);
                return 1;
            }
            gs = json_stringn_nocheck(buf, n);
            free(buf);
        } else {
            json_error_t je;
            json_t *sc = json_load_file(schema_file, JSON_DECODE_ANY, &je);
            if (!sc) {
                fprintf(stderr, "spillway: %s:%d: %s\n", schema_file, je.line, je.text);
                return 1;
            }
            rf = json_pack("{s:s, s:{s:s, s:o}}", "type", "json_schema", "json_schema", "name",
                           "cli", "schema", sc);
        }
        int kind;
        int grc = json_schema_request_grammar(gs, rf, &dgram, &kind, err, sizeof err);
        json_decref(gs);
        json_decref(rf);
        if (grc != 0) {
            fprintf(stderr, "spillway: %s: %s\n", grammar_file ? grammar_file : schema_file, err);
            return 1;
        }
        dr.grammar = dgram;
    }
    unsigned char secret[CACHE_SECRET_BYTES];
    if (*redis_host && cfg.prefix_cache) { /* tier 2: name blocks like the host's workers */
        if (cache_secret_load(kc.secret_path, secret, err, sizeof err)) {
            fprintf(stderr, "spillway: %s\n", err);
            grammar_release(dgram);
            return 1;
        }
        cfg.kv_secret = secret;
    }
    engine_t *e = engine_new(&cfg, err, sizeof err);
    memset(secret, 0, sizeof secret);
    if (!e) {
        fprintf(stderr, "spillway: %s\n", err);
        grammar_release(dgram);
        return 1;
    }
    if (*redis_host && cfg.prefix_cache) {
        const char *pw = getenv("SPILLWAY_CACHE_REDIS_PASSWORD");
        if (pw) kc.redis_password = pw;
        engine_info_t info;
        engine_info(e, &info);
        cache_geometry_t geo = {.seed = info.kv_seed, .block_tokens = info.block_tokens,
                                .block_bytes = info.kv_block_bytes};
        engine_kv_tier_t tier;
        if (!(cache = cache_new(&kc, &geo, err, sizeof err))) {
            fprintf(stderr, "spillway: %s\n", err);
            engine_free(e);
            grammar_release(dgram);
            return 1;
        }
        cache_engine_tier(cache, &tier);
        if (engine_set_kv_tier(e, &tier, err, sizeof err) != 0) {
            fprintf(stderr, "spillway: %s\n", err);
            engine_free(e);
            cache_free(cache);
            grammar_release(dgram);
            return 1;
        }
    }
    gen_ctx_t g = {.out = stdout};
    int rc = 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!file) {
        const char *p = prompt ? prompt : "";
        size_t len = strlen(p);
        int n = engine_tokenize(e, p, len, 1, 1, NULL, 0);
        int32_t *toks = malloc(sizeof *toks * (size_t)(n > 0 ? n : 1));
        if (n < 0 || !toks) {
            fprintf(stderr, "spillway: cannot tokenize the prompt\n");
            free(toks);
            goto out;
        }
        engine_tokenize(e, p, len, 1, 1, toks, n);
        gen_req_t *q = calloc(1, sizeof *q);
        engine_request_t rq = dr;
        rq.prompt = toks;
        rq.n_prompt = n;
        rq.text_at_start = len == 0 || !echo;
        rq.user = q;
        if (echo) fputs(p, stdout);
        if (engine_submit(e, &rq, on_done, &g, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "spillway: %s\n", err);
            free(toks);
            free(q);
            goto out;
        }
        free(toks);
        if (engine_run(e, err, sizeof err) != 0) {
            fprintf(stderr, "spillway: %s\n", err);
            goto out;
        }
        free(q);
    } else {
        FILE *f = strcmp(file, "-") ? fopen(file, "r") : stdin;
        if (!f) {
            perror(file);
            goto out;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        long lineno = 0;
        int bad = 0;
        while ((len = getline(&line, &cap, f)) >= 0) {
            lineno++;
            if (len == 0 || line[0] == '\n') continue;
            json_error_t jerr;
            json_t *o = json_loadb(line, (size_t)len, 0, &jerr);
            const char *lstops[MAX_STOP];
            int32_t *toks = NULL;
            grammar_t *lgram = NULL;
            engine_request_t rq;
            char msg[256];
            if (!o || !json_is_object(o)) {
                fprintf(stderr, "spillway: %s:%ld: not a JSON object: %s\n", file, lineno,
                        o ? "wrong type" : jerr.text);
                bad++;
            } else if (parse_line(e, o, &dr, &rq, &toks, lstops, &lgram, msg, sizeof msg) != 0) {
                fprintf(stderr, "spillway: %s:%ld: %s\n", file, lineno, msg);
                bad++;
            } else {
                gen_req_t *q = calloc(1, sizeof *q);
                json_t *idv = json_object_get(o, "id");
                char idbuf[32];
                snprintf(idbuf, sizeof idbuf, "%ld", lineno);
                q->jsonl = 1;
                q->index = lineno - 1;
                q->id = strdup(json_is_string(idv) ? json_string_value(idv) : idbuf);
                rq.user = q;
                if (engine_submit(e, &rq, on_done, &g, NULL, err, sizeof err) != 0) {
                    fprintf(stderr, "spillway: %s:%ld: %s\n", file, lineno, err);
                    free(q->id);
                    free(q);
                    bad++;
                }
            }
            free(toks);
            grammar_release(lgram);
            json_decref(o);
        }
        free(line);
        if (f != stdin) fclose(f);
        if (engine_run(e, err, sizeof err) != 0) {
            fprintf(stderr, "spillway: %s\n", err);
            goto out;
        }
        if (bad) {
            fprintf(stderr, "spillway: %d request(s) rejected\n", bad);
            goto out;
        }
    }
    rc = g.failed;
out:
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (stats) {
        double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        engine_stats_t st;
        engine_stats(e, &st);
        fprintf(stderr,
                "spillway: %llu requests, %llu prompt tokens (%llu cached), %llu generated in "
                "%.3f s: %.1f generated tokens/s, %.1f total tokens/s, mean TTFT %.1f ms, %llu "
                "steps, %llu preemptions\n",
                (unsigned long long)g.done, (unsigned long long)g.prompt_tokens,
                (unsigned long long)g.cached_tokens, (unsigned long long)g.gen_tokens, wall,
                (double)g.gen_tokens / wall,
                (double)(g.gen_tokens + g.prompt_tokens - g.cached_tokens) / wall,
                g.done ? g.ttft_sum / (double)g.done * 1e3 : 0.0, (unsigned long long)st.steps,
                (unsigned long long)st.preemptions);
        fprintf(stderr,
                "spillway: prefix blocks: tier 1 %llu of %llu looked up, tier 2 %llu of %llu, "
                "%llu offered to tier 2, %llu admissions deferred to share a prefix, %llu "
                "refused (other tokens under the name)\n",
                (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_lookups,
                (unsigned long long)st.tier2_hits, (unsigned long long)st.tier2_lookups,
                (unsigned long long)st.tier2_stores, (unsigned long long)st.deferred,
                (unsigned long long)st.kv_mismatches);
        engine_info_t info;
        engine_info(e, &info);
        if (info.dev_bytes_planned)
            fprintf(stderr,
                    "spillway: device memory: planned %llu B (engine/devmem.h, %d allocations), "
                    "measured %llu B (free memory before and after the backend's creation); "
                    "%llu sequence-steps waited for tier-2 copies\n",
                    (unsigned long long)info.dev_bytes_planned, info.dev_allocations,
                    (unsigned long long)info.dev_bytes_measured,
                    (unsigned long long)st.tier2_waits);
    }
    engine_free(e);
    grammar_release(dgram);
    cache_free(cache); /* after the engine; waits for the queued stores */
    return rc;
}
