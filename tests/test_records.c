/* tests/test_records.c: data-driven cases of the records module's encoders, one folder per case
 * under tests/records/ (README.md there): the encoder's inputs as a small JSON (`input.json`)
 * and the record it must write, byte for byte (`record`). tests/test_schemas.py checks every
 * `record` against its schema. Also: the admission step's codes (records_admit) and the
 * dead-letter reason of every code. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "records/records.h"
#include "check.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

/* ---- inputs ---- */

static const char *str_or_null(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key)); /* NULL when absent or not a string */
}

static double num(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    if (json_is_string(v) && !strcmp(json_string_value(v), "-inf")) return -INFINITY;
    return json_number_value(v);
}

/* The pieces table of a case: {"ID": "text" | {"hex": "HHHH"}} (hex: raw bytes, e.g. invalid
 * UTF-8). */
static int piece(void *arg, int32_t id, char *buf, size_t cap)
{
    char key[16];
    snprintf(key, sizeof key, "%d", (int)id);
    const json_t *v = json_object_get(arg, key);
    if (json_is_string(v)) {
        size_t n = json_string_length(v);
        memcpy(buf, json_string_value(v), n < cap ? n : cap);
        return (int)n;
    }
    const char *hex = str_or_null(v, "hex");
    if (!hex) return -1;
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n && i < cap; i++) {
        unsigned b;
        sscanf(hex + 2 * i, "%2x", &b);
        buf[i] = (char)b;
    }
    return (int)n;
}

/* A case's "logprobs" {"tokens": [{"id", "logprob", "top": [{"id", "logprob"}]}], "n_top",
 * "max_top"} through records_logprobs; NULL when absent. */
static json_t *logprobs_of(const json_t *lp, const json_t *pieces)
{
    if (!lp) return NULL;
    const json_t *toks = json_object_get(lp, "tokens");
    int n = (int)json_array_size(toks);
    int n_top = (int)json_integer_value(json_object_get(lp, "n_top"));
    int max_top = json_object_get(lp, "max_top") ? (int)json_integer_value(json_object_get(lp, "max_top")) : -1;
    engine_logprob_t *ch = calloc((size_t)n + 1, sizeof *ch);
    engine_logprob_t *top = calloc((size_t)n * (size_t)n_top + 1, sizeof *top);
    for (int i = 0; i < n; i++) {
        const json_t *t = json_array_get(toks, (size_t)i);
        ch[i].id = (int32_t)json_integer_value(json_object_get(t, "id"));
        ch[i].logprob = (float)num(t, "logprob");
        for (int j = 0; j < n_top; j++) {
            const json_t *a = json_array_get(json_object_get(t, "top"), (size_t)j);
            engine_logprob_t *e = &top[(size_t)i * (size_t)n_top + (size_t)j];
            e->id = a ? (int32_t)json_integer_value(json_object_get(a, "id")) : -1;
            e->logprob = a ? (float)num(a, "logprob") : -INFINITY;
        }
    }
    json_t *out = records_logprobs(ch, top, n, n_top, max_top, piece, (void *)pieces);
    free(ch);
    free(top);
    return out;
}

static rec_source_t source_of(const json_t *in)
{
    const json_t *s = json_object_get(in, "input");
    rec_source_t r = {str_or_null(s, "topic"), (int32_t)json_integer_value(json_object_get(s, "partition")),
                      (int64_t)json_integer_value(json_object_get(s, "offset"))};
    return r;
}

static char *encode_result(const json_t *in)
{
    const json_t *pieces = json_object_get(in, "pieces");
    const json_t *u = json_object_get(in, "usage"), *t = json_object_get(in, "timings");
    const json_t *d = json_object_get(in, "degraded");
    json_t *choices = NULL, *lp = logprobs_of(json_object_get(in, "logprobs"), pieces);
    const json_t *cs = json_object_get(in, "choices");
    if (cs) {
        choices = json_array();
        for (size_t i = 0; i < json_array_size(cs); i++) {
            const json_t *c = json_array_get(cs, i);
            const char *text = str_or_null(c, "text");
            json_array_append_new(choices,
                                  records_choice((int)i, text, text ? strlen(text) : 0,
                                                 str_or_null(c, "finish_reason"),
                                                 logprobs_of(json_object_get(c, "logprobs"), pieces)));
        }
    }
    const char *text = str_or_null(in, "text");
    rec_result_t r = {
        .id = str_or_null(in, "id"),
        .correlation_id = str_or_null(in, "correlation_id"),
        .tenant = str_or_null(in, "tenant"),
        .choices = choices,
        .text = text,
        .text_len = text ? json_string_length(json_object_get(in, "text")) : 0,
        .finish = str_or_null(in, "finish_reason"),
        .logprobs = lp,
        .prompt_tokens = json_integer_value(json_object_get(u, "prompt_tokens")),
        .cached_tokens = json_integer_value(json_object_get(u, "cached_tokens")),
        .completion_tokens = json_integer_value(json_object_get(u, "completion_tokens")),
        .compute_ms = num(u, "compute_ms"),
        .queue_ms = num(t, "queue_ms"),
        .ttft_ms = num(t, "ttft_ms"),
        .decode_ms = num(t, "decode_ms"),
        .total_ms = num(t, "total_ms"),
        .wait_ms = num(t, "wait_ms"),
        .class_name = str_or_null(in, "class"),
        .capped_from = d ? (int)json_integer_value(json_object_get(d, "requested_max_tokens")) : 0,
        .max_tokens = d ? (int)json_integer_value(json_object_get(d, "max_tokens")) : 0,
        .model = str_or_null(in, "model"),
        .model_fingerprint = str_or_null(in, "model_fingerprint"),
        .worker = str_or_null(in, "worker"),
        .input = source_of(in),
        .metadata = str_or_null(in, "metadata_text"),
    };
    char *s = records_result(&r);
    json_decref(choices);
    json_decref(lp);
    return s;
}

static char *encode_chunk(const json_t *in)
{
    const char *text = str_or_null(in, "text");
    rec_chunk_t c = {str_or_null(in, "id"), str_or_null(in, "correlation_id"),
                     (int)json_integer_value(json_object_get(in, "seq")), text,
                     text ? json_string_length(json_object_get(in, "text")) : 0,
                     (int)json_integer_value(json_object_get(in, "n_tokens")),
                     str_or_null(in, "finish_reason"), source_of(in)};
    return records_chunk(&c);
}

static char *encode_usage(const json_t *in)
{
    rec_usage_t u = {str_or_null(in, "worker"), str_or_null(in, "tenant"), str_or_null(in, "class"),
                     json_integer_value(json_object_get(in, "start_ms")),
                     json_integer_value(json_object_get(in, "end_ms")),
                     (uint64_t)json_integer_value(json_object_get(in, "requests")),
                     (uint64_t)json_integer_value(json_object_get(in, "prompt_tokens")),
                     (uint64_t)json_integer_value(json_object_get(in, "cached_tokens")),
                     (uint64_t)json_integer_value(json_object_get(in, "completion_tokens")),
                     num(in, "compute_ms")};
    return records_usage(&u);
}

/* The dead letter's headers as one compact JSON object, header name -> value, in their order
 * (the shape schemas/dlq.schema.json describes). */
static char *encode_dlq(const json_t *in)
{
    rec_dlq_t d = {str_or_null(in, "code"), str_or_null(in, "message"), source_of(in),
                   str_or_null(in, "worker"), json_integer_value(json_object_get(in, "timestamp_ms")),
                   json_is_true(json_object_get(in, "truncated")),
                   (size_t)json_integer_value(json_object_get(in, "original_bytes"))};
    rd_kafka_headers_t *h = records_dlq_headers(&d);
    if (!h) return NULL;
    json_t *o = json_object();
    const char *name;
    const void *v;
    size_t n;
    for (size_t i = 0; rd_kafka_header_get_all(h, i, &name, &v, &n) == RD_KAFKA_RESP_ERR_NO_ERROR; i++) {
        CHECKF(!json_object_get(o, name), "dlq header %s written twice", name);
        json_object_set_new(o, name, json_stringn(v, n));
    }
    rd_kafka_headers_destroy(h);
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

static void run_case(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/input.json", dir, name);
    json_error_t jerr;
    json_t *in = json_load_file(path, 0, &jerr);
    CHECKF(in != NULL, "%s: input.json: %s", name, jerr.text);
    if (!in) return;
    snprintf(path, sizeof path, "%s/%s/record", dir, name);
    size_t want_len = 0;
    char *want = read_file(path, &want_len);
    CHECKF(want != NULL, "%s: no record file", name);
    while (want && want_len && want[want_len - 1] == '\n') want[--want_len] = 0; /* editors */
    const char *kind = str_or_null(in, "kind");
    char *got = NULL;
    if (kind && !strcmp(kind, "result")) got = encode_result(in);
    else if (kind && !strcmp(kind, "chunk")) got = encode_chunk(in);
    else if (kind && !strcmp(kind, "usage")) got = encode_usage(in);
    else if (kind && !strcmp(kind, "dlq")) got = encode_dlq(in);
    else CHECKF(0, "%s: kind must be result, chunk, usage or dlq", name);
    CHECKF(got != NULL || !kind, "%s: the encoder returned NULL", name);
    if (got && want)
        CHECKF(!strcmp(got, want), "%s: record differs\n  got:  %s\n  want: %s", name, got, want);
    if (got && getenv("SPILLWAY_TEST_VERBOSE")) fprintf(stderr, "%s: %s\n", name, got);
    free(got);
    free(want);
    json_decref(in);
}

/* ---- admission ---- */

static void *model_lookup(void *arg, const char *name)
{
    (void)arg;
    static char served[] = "stories";
    return !strcmp(name, served) ? served : NULL;
}

static int hdrs(void *arg, const char *name, const void **value, size_t *len)
{
    const char *const *kv = arg; /* name, value, ..., NULL */
    for (; kv && *kv; kv += 2)
        if (!strcmp(kv[0], name)) {
            *value = kv[1];
            *len = strlen(kv[1]);
            return 1;
        }
    return 0;
}

/* The admission code of the request text req with the headers kv (NULL: none). */
static rec_err_t admit(const char *req, const char *const *kv, int *cls, void **model)
{
    static const char *const topics[] = {"replies"};
    static const char *const classes[] = {"interactive", "batch"};
    request_limits_t lim;
    request_limits_default(&lim);
    rec_rules_t rules = {&lim, topics, 1, classes, 2, "stories", model_lookup, NULL};
    request_t r;
    char err[256] = "";
    CHECK(request_parse(req, strlen(req), 0, &lim, &r, NULL, err, sizeof err) == 0);
    rec_err_t e = records_admit(&r, &rules, kv ? hdrs : NULL, (void *)kv, cls, model, err, sizeof err);
    CHECKF(e == REC_OK || err[0], "%s: code %d without a message", req, (int)e);
    request_free(&r);
    return e;
}

static void test_admission(void)
{
    int cls;
    void *model;
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\"}", NULL, &cls, &model) == REC_OK);
    CHECK(cls == -1 && model && !strcmp(model, "stories"));
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\",\"class\":\"batch\"}", NULL, &cls, &model) == REC_OK);
    CHECK(cls == 1);
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\",\"class\":\"bulk\"}", NULL, &cls, &model) ==
          REC_UNKNOWN_CLASS);
    CHECK(model == NULL);
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\",\"model\":\"llama\"}", NULL, &cls, &model) ==
          REC_UNKNOWN_MODEL);
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\",\"reply_to\":\"replies\"}", NULL, &cls, &model) ==
          REC_OK);
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\",\"reply_to\":\"other\"}", NULL, &cls, &model) ==
          REC_REPLY_NOT_ALLOWED);
    /* header fields: the same rules; the JSON field wins */
    const char *const h1[] = {"class", "interactive", NULL};
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\"}", h1, &cls, &model) == REC_OK && cls == 0);
    const char *const h2[] = {"reply_to", "elsewhere", NULL};
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\"}", h2, &cls, &model) == REC_REPLY_NOT_ALLOWED);
    const char *const h3[] = {"model", "bad model name", NULL};
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\"}", h3, &cls, &model) == REC_BAD_PARAM);
    const char *const h4[] = {"class", "bulk", NULL};
    CHECK(admit("{\"id\":\"a\",\"prompt\":\"x\",\"class\":\"batch\"}", h4, &cls, &model) == REC_OK &&
          cls == 1);
    char err[128];
    CHECK(records_admit_prompt(10, 10, 5, 5, err, sizeof err) == REC_OK);
    CHECK(records_admit_prompt(11, 10, 5, 5, err, sizeof err) == REC_PROMPT_BYTES);
    CHECK(records_admit_prompt(0, 10, 6, 5, err, sizeof err) == REC_PROMPT_TOKENS);
    CHECK(records_admit_prompt(0, 10, 6, 0, err, sizeof err) == REC_OK);
}

/* The metadata round trip, request to result: numbers, nested values and escapes come back as
 * the producer wrote them (only whitespace outside strings is dropped). */
static void test_metadata_round_trip(void)
{
    const char *req = "{\"id\": \"m\", \"prompt\": \"x\", \"metadata\": {\"n\": "
                      "12345678901234567890e-10, \"f\": 0.80, \"deep\": {\"a\": [1, {\"b\": "
                      "1E+300}]}, \"u\": \"\\u00e9\\ud83d\\ude00\\\"\", \"big\": "
                      "-9223372036854775808, \"r\": 1.000000000000000000001}}";
    const char *want = "\"metadata\":{\"n\":12345678901234567890e-10,\"f\":0.80,\"deep\":{\"a\":"
                       "[1,{\"b\":1E+300}]},\"u\":\"\\u00e9\\ud83d\\ude00\\\"\",\"big\":"
                       "-9223372036854775808,\"r\":1.000000000000000000001}}";
    request_t r;
    char err[256] = "";
    int rc = request_parse(req, strlen(req), 0, NULL, &r, NULL, err, sizeof err);
    CHECKF(rc == 0, "metadata request refused: %s", err);
    if (rc) return;
    rec_result_t in = {.id = r.id, .text = "", .finish = "stop", .model = "m", .worker = "w",
                       .input = {"prompts", 0, 0}, .metadata = r.metadata_json};
    char *s = records_result(&in);
    size_t ls = s ? strlen(s) : 0, lw = strlen(want);
    CHECKF(s && ls > lw && !strcmp(s + ls - lw, want), "metadata not as sent: %s", s ? s : "NULL");
    free(s);
    request_free(&r);
}

/* Every code has its own reason string, and the strings are the REQ_ERR_* ones. */
static void test_reasons(void)
{
    for (int a = REC_NOT_JSON; a <= REC_NO_MEMORY; a++) {
        CHECKF(strcmp(rec_err_reason((rec_err_t)a), "unknown") != 0, "code %d has no reason", a);
        for (int b = REC_NOT_JSON; b < a; b++)
            CHECKF(strcmp(rec_err_reason((rec_err_t)a), rec_err_reason((rec_err_t)b)) != 0,
                   "codes %d and %d share a reason", a, b);
    }
    CHECK(!strcmp(rec_err_reason(REC_NOT_JSON), REQ_ERR_NOT_JSON));
    CHECK(!strcmp(rec_err_reason(REC_BAD_GRAMMAR), REQ_ERR_BAD_GRAMMAR));
    CHECK(!strcmp(rec_err_reason((rec_err_t)999), "unknown"));
}

int main(void)
{
    const char *dir = SPILLWAY_SOURCE_DIR "/tests/records";
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "cannot open %s", dir);
    int n = 0;
    if (d) {
        char *names[256];
        struct dirent *e;
        while ((e = readdir(d)) && n < 256) {
            char p[1024];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s/input.json", dir, e->d_name);
            if (e->d_name[0] != '.' && stat(p, &st) == 0) names[n++] = strdup(e->d_name);
        }
        closedir(d);
        for (int i = 0; i < n; i++) {
            run_case(dir, names[i]);
            free(names[i]);
        }
    }
    CHECKF(n >= 8, "only %d record cases", n);
    printf("%d record cases\n", n);
    test_admission();
    test_reasons();
    test_metadata_round_trip();
    return check_exit();
}
