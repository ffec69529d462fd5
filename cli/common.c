/* cli/common.c: option parsing and request keys shared by the subcommands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

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

int cli_engine_opt(engine_config_t *cfg, int opt, const char *arg)
{
    long v;
    switch (opt) {
    case 1001:
        if (cli_parse_int("--threads", arg, 0, 1024, &v)) return -1;
        cfg->threads = (int)v;
        return 1;
    case 1002:
        if (strcmp(arg, "f16") && strcmp(arg, "f32")) {
            fprintf(stderr, "spillway: --kv-type must be f16 or f32\n");
            return -1;
        }
        cfg->kv_type = arg;
        return 1;
    case 1003:
        if (cli_parse_int("--block-tokens", arg, 1, 4096, &v)) return -1;
        cfg->block_tokens = (int)v;
        return 1;
    case 1004:
        if (cli_parse_int("--batch-tokens", arg, 1, 1 << 20, &v)) return -1;
        cfg->max_batch_tokens = (int)v;
        return 1;
    case 1005:
        if (cli_parse_int("--max-seqs", arg, 1, 1 << 16, &v)) return -1;
        cfg->max_seqs = (int)v;
        return 1;
    case 1006:
        if (cli_parse_int("--kv-mem-mb", arg, 1, 1 << 24, &v)) return -1;
        cfg->kv_mem_mb = (int)v;
        return 1;
    case 1007:
        if (cli_parse_int("--kv-blocks", arg, 1, 1 << 30, &v)) return -1;
        cfg->kv_blocks = (int)v;
        return 1;
    case 1008:
        if (cli_parse_int("--ctx", arg, 1, 1 << 30, &v)) return -1;
        cfg->max_ctx = (int)v;
        return 1;
    case 1009:
        cfg->prefix_cache = 0;
        return 1;
    default:
        return 0;
    }
}

int cli_prompt_key(const json_t *r, long prefix, char *key, size_t cap)
{
    char buf[4096];
    size_t n = 0;
    json_t *p = json_object_get(r, "prompt"), *msgs = json_object_get(r, "messages");
    if (json_is_string(p)) {
        n = json_string_length(p) < sizeof buf ? json_string_length(p) : sizeof buf;
        memcpy(buf, json_string_value(p), n);
    } else if (json_is_array(msgs)) {
        size_t i;
        json_t *m;
        json_array_foreach(msgs, i, m) {
            const char *role = json_string_value(json_object_get(m, "role"));
            const char *content = json_string_value(json_object_get(m, "content"));
            int k = snprintf(buf + n, sizeof buf - n, "%s\x1f%s\x1e", role ? role : "",
                             content ? content : "");
            if (k < 0 || (size_t)k >= sizeof buf - n) {
                n = sizeof buf;
                break;
            }
            n += (size_t)k;
        }
    } else {
        return -1;
    }
    if ((size_t)prefix < n) n = (size_t)prefix;
    snprintf(key, cap, "%016llx", (unsigned long long)XXH64(buf, n, 0));
    return 0;
}
