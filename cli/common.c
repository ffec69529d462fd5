/* cli/common.c: option parsing shared by the subcommands. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "spillway: %s: '%s' is not an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_double(const char *opt, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "spillway: %s: '%s' is not a number\n", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_key(const char *flag, const char *key, const char *arg, long *num)
{
    char err[256];
    int i = worker_config_find_key(key);
    if (worker_config_parse_value(i, arg, num, err, sizeof err)) {
        fprintf(stderr, "spillway: %s: %s\n", flag, err);
        return -1;
    }
    return 0;
}

void cli_wrap(FILE *f, const char *lead, int indent, const char *text)
{
    enum { WIDTH = 100 };
    int col = fprintf(f, "%s", lead);
    if (col >= indent) {
        fputc('\n', f);
        col = 0;
    }
    fprintf(f, "%*s", indent - col, "");
    col = indent;
    for (const char *p = text; *p;) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        if (!n) break;
        if (col > indent && col + 1 + (int)n > WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, n, f);
        col += (int)n;
        p += n;
    }
    fputc('\n', f);
}

void cli_key_help(FILE *f, const char *flag, const char *key, const char *meaning)
{
    worker_config_key_t k;
    if (worker_config_key(worker_config_find_key(key), &k)) return;
    char values[160] = "", lead[64], text[1024];
    if (k.integer && k.hi == LONG_MAX) snprintf(values, sizeof values, "; >= %ld", k.lo);
    else if (k.integer) snprintf(values, sizeof values, "; %ld..%ld", k.lo, k.hi);
    else if (k.real) snprintf(values, sizeof values, "; %g..%g", k.real_lo, k.real_hi);
    else if (k.choices) snprintf(values, sizeof values, "; %s", k.choices);
    snprintf(lead, sizeof lead, "  %s", flag);
    snprintf(text, sizeof text, "%s [%s; default %s%s]", meaning ? meaning : k.help, k.name,
             *k.def ? k.def : "\"\"", values);
    cli_wrap(f, lead, 23, text);
}

/* The engine flags: each sets the engine_config_t field of one worker key, with that key's
 * range, choices and help (engine_config_default holds the same defaults as the key table;
 * test_worker_config checks it). */
static const struct {
    int opt;
    const char *flag, *key;
} ENGINE_FLAGS[] = {
    {1001, "--threads N", "threads"},
    {1002, "--kv-type T", "kv.type"},
    {1003, "--block-tokens B", "kv.block_tokens"},
    {1004, "--batch-tokens N", "batch.max_tokens"},
    {1005, "--max-seqs N", "batch.max_seqs"},
    {1006, "--kv-mem-mb N", "kv.mem_mb"},
    {1007, "--kv-blocks N", "kv.blocks"},
    {1008, "--ctx N", "ctx"},
    {1009, "--no-prefix-cache", "prefix_cache"},
};

void cli_engine_help(FILE *f)
{
    for (size_t i = 0; i < sizeof ENGINE_FLAGS / sizeof ENGINE_FLAGS[0]; i++)
        cli_key_help(f, ENGINE_FLAGS[i].flag, ENGINE_FLAGS[i].key,
                     ENGINE_FLAGS[i].opt == 1009 ? "prefix_cache=false: do not reuse cached "
                                                   "prompt blocks" : NULL);
}

int cli_engine_opt(engine_config_t *cfg, int opt, const char *arg)
{
    size_t i = 0, n = sizeof ENGINE_FLAGS / sizeof ENGINE_FLAGS[0];
    while (i < n && ENGINE_FLAGS[i].opt != opt) i++;
    if (i == n) return 0;
    char flag[32];
    long v = 0;
    snprintf(flag, sizeof flag, "%s", ENGINE_FLAGS[i].flag);
    flag[strcspn(flag, " ")] = 0;
    if (opt != 1009 && cli_parse_key(flag, ENGINE_FLAGS[i].key, arg, &v)) return -1;
    switch (opt) {
    case 1001: cfg->threads = (int)v; break;
    case 1002: cfg->kv_type = arg; break;
    case 1003: cfg->block_tokens = (int)v; break;
    case 1004: cfg->max_batch_tokens = (int)v; break;
    case 1005: cfg->max_seqs = (int)v; break;
    case 1006: cfg->kv_mem_mb = (int)v; break;
    case 1007: cfg->kv_blocks = (int)v; break;
    case 1008: cfg->max_ctx = (int)v; break;
    case 1009: cfg->prefix_cache = 0; break;
    }
    return 1;
}
