/* tests/test_requests.c: data-driven request_parse cases, one folder per case under
 * tests/requests/ (the folder format is described in tests/requests/README.md).
 *
 * Every case's input is parsed from an exact-size heap buffer (ASan sees any over-read), with
 * the case's limits and message timestamp; the outcome must match `expect`. Each case is also
 * parsed with a 16-byte errstr (truncation must be safe and give the same code).
 * SPILLWAY_TEST_VERBOSE=1 prints every case's outcome and message. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "records/records.h"

#define CASES_DIR SPILLWAY_SOURCE_DIR "/tests/requests"

typedef struct {
    char *p;
    size_t n, cap;
} buf_t;

static int buf_add(buf_t *b, const void *data, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* Reads a whole file; NULL when it does not exist. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    buf_t b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) buf_add(&b, tmp, n);
    fclose(f);
    if (!b.p) buf_add(&b, "", 0);
    *len = b.n;
    return b.p;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Decodes the escapes \n \r \t \\ \xHH of s[0..n) into b. 0, or -1 on a bad escape. */
static int unescape(const char *s, size_t n, buf_t *b)
{
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch != '\\') {
            buf_add(b, &ch, 1);
            continue;
        }
        if (++i >= n) return -1;
        switch (s[i]) {
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case '\\': ch = '\\'; break;
        case 'x': {
            if (i + 2 >= n) return -1;
            int h = hexval(s[i + 1]), l = hexval(s[i + 2]);
            if (h < 0 || l < 0) return -1;
            ch = (char)(h * 16 + l);
            i += 2;
            break;
        }
        default: return -1;
        }
        buf_add(b, &ch, 1);
    }
    if (!b->p) buf_add(b, "", 0);
    return 0;
}

/* The `generate` DSL, one directive a line ('#' starts a comment line):
 *   text TEXT        appends TEXT (escapes as in unescape)
 *   repeat N TEXT    appends TEXT N times */
static char *generate(const char *path, const char *src, size_t *len)
{
    buf_t out = {0};
    const char *line = src;
    int lineno = 0;
    while (*line) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        lineno++;
        buf_t piece = {0};
        long times = 1;
        const char *arg = NULL;
        if (n == 0 || line[0] == '#') {
            /* blank or comment */
        } else if (n >= 5 && strncmp(line, "text ", 5) == 0) {
            arg = line + 5;
        } else if (n >= 7 && strncmp(line, "repeat ", 7) == 0) {
            char *end;
            times = strtol(line + 7, &end, 10);
            if (end == line + 7 || *end != ' ' || times < 0) goto bad;
            arg = end + 1;
        } else {
            goto bad;
        }
        if (arg) {
            if (unescape(arg, n - (size_t)(arg - line), &piece)) goto bad;
            for (long k = 0; k < times; k++) buf_add(&out, piece.p, piece.n);
        }
        free(piece.p);
        line = nl ? nl + 1 : line + n;
        continue;
    bad:
        fprintf(stderr, "%s:%d: bad generate directive\n", path, lineno);
        free(piece.p);
        free(out.p);
        return NULL;
    }
    if (!out.p) buf_add(&out, "", 0);
    *len = out.n;
    return out.p;
}

static int apply_limit(request_limits_t *l, const char *key, const char *val)
{
    long long v = strtoll(val, NULL, 10);
    if (!strcmp(key, "max_message_bytes")) l->max_message_bytes = (size_t)v;
    else if (!strcmp(key, "max_prompt_bytes")) l->max_prompt_bytes = (size_t)v;
    else if (!strcmp(key, "max_input_ids")) l->max_input_ids = (int)v;
    else if (!strcmp(key, "max_messages")) l->max_messages = (int)v;
    else if (!strcmp(key, "max_tokens_limit")) l->max_tokens_limit = (int)v;
    else if (!strcmp(key, "default_max_tokens")) l->default_max_tokens = (int)v;
    else if (!strcmp(key, "max_stop")) l->max_stop = (int)v;
    else if (!strcmp(key, "max_stop_bytes")) l->max_stop_bytes = (size_t)v;
    else if (!strcmp(key, "max_metadata_bytes")) l->max_metadata_bytes = (size_t)v;
    else if (!strcmp(key, "max_id_bytes")) l->max_id_bytes = (size_t)v;
    else return -1;
    return 0;
}

static int float_eq(float got, const char *want)
{
    return got == strtof(want, NULL);
}

/* Checks one "key=value" line of an ok case against r. Returns 1 when it matches, 0 when
 * not, -1 for an unknown key. */
static int check_field(const request_t *r, const char *key, const char *val)
{
    char tmp[64];
    if (!strcmp(key, "id")) return r->id && !strcmp(r->id, val);
    if (!strcmp(key, "prompt")) return r->prompt && !strcmp(r->prompt, val);
    if (!strcmp(key, "prompt_len")) return r->prompt_len == strtoull(val, NULL, 10);
    if (!strcmp(key, "n_messages")) return r->n_messages == atoi(val);
    if (!strncmp(key, "message.", 8)) {
        char *end;
        long i = strtol(key + 8, &end, 10);
        if (i < 0 || i >= r->n_messages) return 0;
        if (!strcmp(end, ".role")) return !strcmp(r->messages[i].role, val);
        if (!strcmp(end, ".content")) return !strcmp(r->messages[i].content, val);
        return -1;
    }
    if (!strcmp(key, "n_input_ids")) return r->n_input_ids == atoi(val);
    if (!strcmp(key, "input_ids")) {
        buf_t b = {0};
        for (int i = 0; i < r->n_input_ids; i++) {
            snprintf(tmp, sizeof tmp, "%s%" PRId32, i ? "," : "", r->input_ids[i]);
            buf_add(&b, tmp, strlen(tmp));
        }
        int ok = b.p && !strcmp(b.p, val);
        free(b.p);
        return ok;
    }
    if (!strcmp(key, "max_tokens")) return r->max_tokens == atoi(val);
    if (!strcmp(key, "temperature")) return float_eq(r->sampling.temperature, val);
    if (!strcmp(key, "top_p")) return float_eq(r->sampling.top_p, val);
    if (!strcmp(key, "min_p")) return float_eq(r->sampling.min_p, val);
    if (!strcmp(key, "top_k")) return r->sampling.top_k == atoi(val);
    if (!strcmp(key, "repeat_penalty")) return float_eq(r->sampling.repeat_penalty, val);
    if (!strcmp(key, "presence_penalty")) return float_eq(r->sampling.presence_penalty, val);
    if (!strcmp(key, "frequency_penalty")) return float_eq(r->sampling.frequency_penalty, val);
    if (!strcmp(key, "seed")) return r->sampling.seed == strtoull(val, NULL, 10);
    if (!strcmp(key, "has_seed")) return r->has_seed == atoi(val);
    if (!strcmp(key, "logprobs")) return r->sampling.n_logprobs == atoi(val);
    if (!strcmp(key, "n")) return r->n == atoi(val);
    if (!strcmp(key, "n_stop")) return r->n_stop == atoi(val);
    if (!strncmp(key, "stop.", 5)) {
        int i = atoi(key + 5);
        return i >= 0 && i < r->n_stop && !strcmp(r->stop[i], val);
    }
    if (!strcmp(key, "priority")) return r->priority == atoi(val);
    if (!strcmp(key, "stream")) return r->stream == atoi(val);
    if (!strcmp(key, "enable_thinking")) return r->enable_thinking == atoi(val);
    if (!strcmp(key, "grammar")) { /* the structured-output kind, and a grammar iff not none */
        static const char *const kinds[] = {"none", "ebnf", "json_object", "json_schema"};
        int k = r->grammar_kind;
        return k >= 0 && k < 4 && !strcmp(kinds[k], val) && (k == 0) == (r->grammar == NULL);
    }
    if (!strcmp(key, "deadline_ms")) return r->deadline_ms == strtoll(val, NULL, 10);
    if (!strcmp(key, "metadata"))
        return !strcmp(val, "(null)") ? r->metadata_json == NULL
                                      : r->metadata_json && !strcmp(r->metadata_json, val);
    if (!strcmp(key, "chat_template"))
        return !strcmp(val, "(null)") ? r->template_name == NULL
                                      : r->template_name && !strcmp(r->template_name, val);
    static const struct { const char *key; size_t off; } STRS[] = {
        {"reply_to", offsetof(request_t, reply_to)},
        {"correlation_id", offsetof(request_t, correlation_id)},
        {"tenant", offsetof(request_t, tenant)},
        {"class", offsetof(request_t, class_name)},
    };
    for (size_t i = 0; i < sizeof STRS / sizeof STRS[0]; i++) {
        if (strcmp(key, STRS[i].key)) continue;
        const char *v = *(char *const *)((const char *)r + STRS[i].off);
        return !strcmp(val, "(null)") ? v == NULL : v && !strcmp(v, val);
    }
    return -1;
}

static int is_empty(const request_t *r)
{
    static const request_t zero;
    return memcmp(r, &zero, sizeof zero) == 0;
}

static void run_case(const char *name)
{
    char path[1024];
    size_t len = 0, elen = 0, glen = 0;
    snprintf(path, sizeof path, "%s/%s/input", CASES_DIR, name);
    char *input = read_file(path, &len);
    if (!input) {
        snprintf(path, sizeof path, "%s/%s/generate", CASES_DIR, name);
        char *gen = read_file(path, &glen);
        CHECKF(gen != NULL, "%s: neither input nor generate", name);
        if (!gen) return;
        input = generate(path, gen, &len);
        free(gen);
        CHECKF(input != NULL, "%s: bad generate file", name);
        if (!input) return;
    }
    snprintf(path, sizeof path, "%s/%s/expect", CASES_DIR, name);
    char *expect = read_file(path, &elen);
    CHECKF(expect != NULL, "%s: no expect file", name);
    if (!expect) {
        free(input);
        return;
    }
    int64_t ts = 0;
    size_t tlen;
    snprintf(path, sizeof path, "%s/%s/timestamp", CASES_DIR, name);
    char *tsf = read_file(path, &tlen);
    if (tsf) ts = strtoll(tsf, NULL, 10);
    free(tsf);
    request_limits_t lim;
    request_limits_default(&lim);
    snprintf(path, sizeof path, "%s/%s/limits", CASES_DIR, name);
    char *limf = read_file(path, &tlen);
    for (char *line = limf ? strtok(limf, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        char *eq = strchr(line, '=');
        CHECKF(eq && (*eq = 0, apply_limit(&lim, line, eq + 1) == 0), "%s: bad limits line %s",
               name, line);
    }
    free(limf);

    /* exact-size copy, so reading past len is an ASan error */
    char *exact = malloc(len ? len : 1);
    memcpy(exact, input, len);
    free(input);

    request_t r;
    const char *code = NULL;
    char err[512];
    int rc = request_parse(exact, len, ts, &lim, &r, &code, err, sizeof err);

    if (getenv("SPILLWAY_TEST_VERBOSE"))
        fprintf(stderr, "%-44s %s %s\n", name, rc == 0 ? "ok" : code, rc == 0 ? "" : err);

    char *save = NULL;
    char *first = strtok_r(expect, "\n", &save);
    if (!first) first = "";
    if (!strcmp(first, "ok")) {
        CHECKF(rc == 0, "%s: expected ok, got %s: %s", name, code ? code : "?", err);
        if (rc == 0) {
            CHECKF(code == NULL, "%s: code set on success", name);
            CHECKF(r.id && (r.prompt || r.messages || r.input_ids), "%s: incomplete", name);
            CHECKF(!!r.prompt + !!r.messages + !!r.input_ids == 1, "%s: forms", name);
            for (char *line; (line = strtok_r(NULL, "\n", &save));) {
                if (!strncmp(line, "schema", 6) || line[0] == '#') continue;
                char *eq = strchr(line, '=');
                CHECKF(eq != NULL, "%s: bad expect line %s", name, line);
                if (!eq) continue;
                *eq = 0;
                buf_t val = {0};
                CHECKF(unescape(eq + 1, strlen(eq + 1), &val) == 0, "%s: bad escape", name);
                int m = check_field(&r, line, val.p ? val.p : "");
                CHECKF(m != -1, "%s: unknown expect key %s", name, line);
                CHECKF(m != 0, "%s: %s is not %s", name, line, val.p);
                free(val.p);
            }
            request_free(&r);
            CHECK(is_empty(&r));
        }
    } else if (!strncmp(first, "error ", 6)) {
        const char *want = first + 6;
        CHECKF(rc < 0, "%s: expected error %s, got ok", name, want);
        if (rc == 0) request_free(&r);
        if (rc < 0) {
            CHECKF(code && !strcmp(code, want), "%s: expected %s, got %s (%s)", name, want,
                   code ? code : "NULL", err);
            /* the return value is the same reason as a code (rec_err_t, negated) */
            CHECKF(!strcmp(rec_err_reason((rec_err_t)-rc), want), "%s: returned %d (%s), not %s",
                   name, rc, rec_err_reason((rec_err_t)-rc), want);
            CHECKF(err[0] != 0, "%s: empty errstr", name);
            CHECKF(is_empty(&r), "%s: *out not left empty", name);
            for (char *line; (line = strtok_r(NULL, "\n", &save));) {
                if (!strncmp(line, "schema", 6) || line[0] == '#') continue;
                if (!strncmp(line, "errstr_has=", 11)) {
                    CHECKF(strstr(err, line + 11) != NULL, "%s: errstr \"%s\" lacks \"%s\"", name,
                           err, line + 11);
                } else {
                    CHECKF(0, "%s: bad expect line %s", name, line);
                }
            }
        }
        /* a tiny errstr: truncated safely, same code */
        char small[16];
        const char *code2 = NULL;
        request_t r2;
        int rc2 = request_parse(exact, len, ts, &lim, &r2, &code2, small, sizeof small);
        CHECK(rc2 == rc && code2 == code && strlen(small) < sizeof small);
        if (rc2 == 0) request_free(&r2);
    } else {
        CHECKF(0, "%s: expect must start with 'ok' or 'error CODE'", name);
    }
    free(exact);
    free(expect);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Direct checks that do not fit the folder format. */
static void test_direct(void)
{
    request_t r;
    const char *code;
    char err[256];
    /* NULL limits: defaults; NULL code and errstr pointers are allowed */
    const char *ok = "{\"id\":\"x\",\"prompt\":\"hi\"}";
    CHECK(request_parse(ok, strlen(ok), 0, NULL, &r, &code, err, sizeof err) == 0);
    CHECK(r.max_tokens == 256 && r.sampling.temperature == 1.0f && r.sampling.top_p == 1.0f);
    request_free(&r);
    request_free(&r); /* idempotent on an emptied request */
    CHECK(request_parse("{", 1, 0, NULL, &r, NULL, NULL, 0) == -1);
    /* the value is not NUL-terminated: a prefix of a longer buffer parses on its own */
    const char *pre = "{\"id\":\"x\",\"prompt\":\"hi\"}GARBAGE";
    CHECK(request_parse(pre, strlen(ok), 0, NULL, &r, &code, err, sizeof err) == 0);
    request_free(&r);
    /* ttl_ms without a message timestamp counts from the wall clock */
    const char *ttl = "{\"id\":\"x\",\"prompt\":\"hi\",\"ttl_ms\":60000}";
    CHECK(request_parse(ttl, strlen(ttl), 0, NULL, &r, &code, err, sizeof err) == 0);
    CHECK(r.deadline_ms > INT64_C(1700000000000) + 60000);
    request_free(&r);
    /* defaults from the limits: default_max_tokens, capped by max_tokens_limit */
    request_limits_t lim;
    request_limits_default(&lim);
    lim.default_max_tokens = 100;
    CHECK(request_parse(ok, strlen(ok), 0, &lim, &r, &code, err, sizeof err) == 0);
    CHECK(r.max_tokens == 100);
    request_free(&r);
    lim.max_tokens_limit = 50;
    CHECK(request_parse(ok, strlen(ok), 0, &lim, &r, &code, err, sizeof err) == 0);
    CHECK(r.max_tokens == 50);
    request_free(&r);
}

int main(void)
{
    DIR *d = opendir(CASES_DIR);
    CHECKF(d != NULL, "cannot open %s: %s", CASES_DIR, strerror(errno));
    if (!d) return check_exit();
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s/expect", CASES_DIR, e->d_name);
        FILE *f = fopen(p, "rb");
        if (!f) continue; /* README and other files */
        fclose(f);
        names = realloc(names, (n + 1) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        run_case(names[i]);
        free(names[i]);
    }
    free(names);
    CHECKF(n >= 60, "only %zu cases found", n);
    test_direct();
    fprintf(stderr, "%zu request cases\n", n);
    return check_exit();
}
