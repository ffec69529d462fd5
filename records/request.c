/* records/request.c: prompt request messages (see request.h and schemas/request.schema.json):
 * the document and the order of its checks. The field readers are in request_fields.c, the
 * lexer over raw JSON text and the timestamp reader in request_text.c (records_int.h).
 *
 * Order of checks: size, UTF-8, JSON syntax, top-level object, then the fields in a fixed order
 * (id, prompt form, sampling parameters, stop, priority/deadline/ttl, metadata, chat_template);
 * the first problem found is reported.
 *
 * jansson refuses a whole document for three things that are legal JSON or legal UTF-8 bytes:
 * a number too large for json_int_t / double, a \u escape of a lone surrogate, and a \u0000
 * escape. We locate the top-level member holding the offending token (a small lexer over the
 * prefix jansson already accepted): in a known field it is that field's error; in an unknown
 * field the token is overwritten in a private copy (same length: "0" or "" plus spaces) and
 * the document parsed again, so unknown fields are ignored whatever they hold.
 *
 * "metadata" is echoed as its own text with the insignificant whitespace removed: numbers and
 * string escapes come back exactly as sent (jansson would print 0.1 as 0.10000000000000001). */
#include "records/request.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/clock.h"
#include "engine/grammar.h"
#include "engine/sampler.h"
#include "consumer/json_schema.h"
#include "records/records_int.h"

const char *rec_err_reason(rec_err_t code)
{
    switch (code) {
    case REC_OK: return "ok";
    case REC_NOT_JSON: return REQ_ERR_NOT_JSON;
    case REC_INVALID_UTF8: return REQ_ERR_INVALID_UTF8;
    case REC_WRONG_TYPE: return REQ_ERR_WRONG_TYPE;
    case REC_MISSING_PROMPT: return REQ_ERR_MISSING_PROMPT;
    case REC_AMBIGUOUS: return REQ_ERR_AMBIGUOUS;
    case REC_EMPTY_PROMPT: return REQ_ERR_EMPTY_PROMPT;
    case REC_PROMPT_BYTES: return REQ_ERR_PROMPT_BYTES;
    case REC_PROMPT_TOKENS: return REQ_ERR_PROMPT_TOKENS;
    case REC_BAD_PARAM: return REQ_ERR_BAD_PARAM;
    case REC_TOO_MANY_STOP: return REQ_ERR_TOO_MANY_STOP;
    case REC_METADATA: return REQ_ERR_METADATA;
    case REC_BAD_ID: return REQ_ERR_BAD_ID;
    case REC_TEMPLATE: return REQ_ERR_TEMPLATE;
    case REC_BAD_ROLE: return REQ_ERR_BAD_ROLE;
    case REC_RESULT_TOO_LARGE: return REQ_ERR_RESULT_TOO_LARGE;
    case REC_DELIVERY_FAILED: return REQ_ERR_DELIVERY_FAILED;
    case REC_MESSAGE_BYTES: return REQ_ERR_MESSAGE_BYTES;
    case REC_UNKNOWN_CLASS: return REQ_ERR_UNKNOWN_CLASS;
    case REC_UNKNOWN_MODEL: return REQ_ERR_UNKNOWN_MODEL;
    case REC_REPLY_NOT_ALLOWED: return REQ_ERR_REPLY_NOT_ALLOWED;
    case REC_TENANT_NOT_ALLOWED: return REQ_ERR_TENANT_NOT_ALLOWED;
    case REC_CLASS_NOT_ALLOWED: return REQ_ERR_CLASS_NOT_ALLOWED;
    case REC_BAD_GRAMMAR: return REQ_ERR_BAD_GRAMMAR;
    case REC_NO_MEMORY: return REQ_ERR_NO_MEMORY;
    }
    return "unknown";
}

void request_limits_default(request_limits_t *l)
{
    l->max_message_bytes = 1 << 20;
    l->max_prompt_bytes = 256 << 10;
    l->max_input_ids = 32768;
    l->max_messages = 256;
    l->max_tokens_limit = 4096;
    l->default_max_tokens = 256;
    l->max_stop = 16;
    l->max_n = 16;
    l->max_stop_bytes = 256;
    l->max_metadata_bytes = 16 << 10;
    l->max_id_bytes = 256;
}

void request_free(request_t *r)
{
    if (!r) return;
    free(r->id);
    free(r->prompt);
    for (int i = 0; i < r->n_messages; i++) {
        free(r->messages[i].role);
        free(r->messages[i].content);
    }
    free(r->messages);
    free(r->input_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->metadata_json);
    free(r->template_name);
    free(r->reply_to);
    free(r->correlation_id);
    free(r->tenant);
    free(r->class_name);
    free(r->model);
    grammar_release(r->grammar);
    memset(r, 0, sizeof *r);
}

/* ---- errors ---- */


int rq_fail(pctx_t *c, rec_err_t e, const char *fmt, ...)
{
    c->err = e;
    *c->code = rec_err_reason(e);
    if (c->errstr && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->errstr, c->errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int rq_oom(pctx_t *c)
{
    return rq_fail(c, REC_NO_MEMORY, "out of memory while parsing the request");
}

/* ---- fields: names, accepted values ---- */


#define OFF(m) offsetof(request_t, m)
const field_t RQ_FIELDS[] = {
    {"id", F_ID, 0, 0, 0, 0},
    {"prompt", F_FORM, 0, 0, 0, 0},
    {"messages", F_FORM, 0, 0, 0, 0},
    {"input_ids", F_FORM, 0, 0, 0, 0},
    {"max_tokens", F_INT, 1, -1, 0, OFF(max_tokens)}, /* hi -1: limits.max_tokens_limit */
    /* OpenAI's newer name; read after max_tokens, so it wins when both are set */
    {"max_completion_tokens", F_INT, 1, -1, 0, OFF(max_tokens)},
    {"temperature", F_FLOAT, 0, 100, 0, OFF(sampling.temperature)},
    {"top_p", F_FLOAT, 0, 1, 1, OFF(sampling.top_p)},
    {"top_k", F_INT, 0, 1000000, 0, OFF(sampling.top_k)},
    {"min_p", F_FLOAT, 0, 1, 0, OFF(sampling.min_p)},
    {"seed", F_SEED, 0, 0, 0, 0},
    {"stop", F_STOP, 0, 0, 0, 0},
    {"repeat_penalty", F_FLOAT, 0, 100, 1, OFF(sampling.repeat_penalty)},
    {"presence_penalty", F_FLOAT, -100, 100, 0, OFF(sampling.presence_penalty)},
    {"frequency_penalty", F_FLOAT, -100, 100, 0, OFF(sampling.frequency_penalty)},
    {"logprobs", F_INT, 0, 20, 0, OFF(sampling.n_logprobs)}, /* or true/false: chat shape */
    {"top_logprobs", F_INT, 0, 20, 0, OFF(top_logprobs)},
    {"n", F_INT, 1, -2, 0, OFF(n)},           /* hi -2: limits.max_n */
    {"priority", F_INT, -1000, 1000, 0, OFF(priority)},
    {"deadline", F_DEADLINE, 0, 0, 0, 0},
    {"ttl_ms", F_TTL, 0, 0, 0, 0},
    {"metadata", F_META, 0, 0, 0, 0},
    {"chat_template", F_TMPL, 0, 0, 0, 0},
    {"enable_thinking", F_BOOL, 0, 0, 0, OFF(enable_thinking)},
    /* routing and accounting strings: also accepted from Kafka headers (request_apply_header) */
    {"reply_to", F_STR, 0, 0, 0, OFF(reply_to)},
    {"correlation_id", F_STR, 0, 0, 0, OFF(correlation_id)},
    {"stream", F_BOOL, 0, 0, 0, OFF(stream)},
    {"tenant", F_STR, 0, 0, 0, OFF(tenant)},
    {"class", F_STR, 0, 0, 0, OFF(class_name)},
    {"model", F_STR, 0, 0, 0, OFF(model)},
    /* structured output (consumer/json_schema.h): at most one of them constrains */
    {"grammar", F_GRAMMAR, 0, 0, 0, 0},
    {"response_format", F_GRAMMAR, 0, 0, 0, 0},
};
const size_t RQ_N_FIELDS = sizeof RQ_FIELDS / sizeof RQ_FIELDS[0];

const field_t *rq_field_find(const char *name)
{
    for (size_t i = 0; i < RQ_N_FIELDS; i++)
        if (strcmp(RQ_FIELDS[i].name, name) == 0) return &RQ_FIELDS[i];
    return NULL;
}

/* What field f accepts, for error messages. */
const char *rq_accepted(const field_t *f, const request_limits_t *l, char *buf, size_t n)
{
    switch (f->type) {
    case F_ID:
        snprintf(buf, n, "a non-empty string of at most %zu bytes; numbers are not accepted",
                 l->max_id_bytes);
        break;
    case F_FORM:
        if (strcmp(f->name, "prompt") == 0)
            snprintf(buf, n, "a non-empty string of at most %zu bytes", l->max_prompt_bytes);
        else if (strcmp(f->name, "messages") == 0)
            snprintf(buf, n, "an array of 1..%d objects {\"role\": string, \"content\": string}",
                     l->max_messages);
        else
            snprintf(buf, n, "an array of 1..%d integers in 0..2147483647", l->max_input_ids);
        break;
    case F_INT:
        snprintf(buf, n, "an integer in %.0f..%.0f", f->lo,
                 f->hi == -2 ? (double)l->max_n : f->hi < 0 ? (double)l->max_tokens_limit : f->hi);
        break;
    case F_FLOAT:
        snprintf(buf, n, "a number in %s%g, %g]", f->lo_open ? "(" : "[", f->lo, f->hi);
        break;
    case F_SEED:
        snprintf(buf, n, "an integer in 0..9223372036854775807 (INT64_MAX: larger 64-bit seeds "
                         "are not accepted)");
        break;
    case F_STOP:
        snprintf(buf, n, "a string or an array of at most %d strings, each 1..%zu bytes",
                 l->max_stop, l->max_stop_bytes);
        break;
    case F_DEADLINE:
        snprintf(buf, n, "an RFC 3339 timestamp such as \"2026-11-30T12:00:00Z\" (fraction and "
                         "offset allowed) or Unix epoch milliseconds in 1..%lld",
                 (long long)MAX_EPOCH_MS);
        break;
    case F_TTL:
        snprintf(buf, n, "an integer number of milliseconds in 1..%lld", (long long)MAX_EPOCH_MS);
        break;
    case F_META:
        snprintf(buf, n, "any JSON value of at most %zu bytes in compact form, numbers within "
                         "64-bit integer / double range, strings without \\u0000 or lone "
                         "surrogates", l->max_metadata_bytes);
        break;
    case F_TMPL:
        snprintf(buf, n, "a template name of 1..%d bytes", MAX_TEMPLATE_NAME_BYTES);
        break;
    case F_BOOL:
        snprintf(buf, n, "true or false");
        break;
    case F_GRAMMAR:
        if (strcmp(f->name, "grammar") == 0)
            snprintf(buf, n, "a string: an EBNF grammar with a root rule");
        else
            snprintf(buf, n, "{\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                             "{\"type\": \"json_schema\", \"json_schema\": {\"name\", "
                             "\"schema\", \"strict\"}}");
        break;
    case F_STR:
        if (strcmp(f->name, "reply_to") == 0)
            snprintf(buf, n, "a Kafka topic name: 1..%d characters of a-z A-Z 0-9 . _ -",
                     MAX_TOPIC_BYTES);
        else if (strcmp(f->name, "tenant") == 0 || strcmp(f->name, "class") == 0 ||
                 strcmp(f->name, "model") == 0)
            snprintf(buf, n, "1..%d characters of a-z A-Z 0-9 . _ : @ / -, not starting with _",
                     MAX_LABEL_BYTES);
        else
            snprintf(buf, n, "a non-empty string of at most %zu bytes", l->max_id_bytes);
        break;
    }
    return buf;
}

/* The code for a value of the wrong JSON type in field f. */
rec_err_t rq_type_code(const field_t *f)
{
    return f->type == F_ID ? REC_BAD_ID : REC_WRONG_TYPE;
}

const char *rq_json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number with a fraction or exponent";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

int rq_wrong_type(pctx_t *c, const field_t *f, const json_t *v)
{
    char acc[256];
    return rq_fail(c, rq_type_code(f), "%s: got %s; expected %s", f->name, rq_json_type_name(v),
                rq_accepted(f, c->lim, acc, sizeof acc));
}
/* ---- parsing the document ---- */

/* Parses text[0..len) into *root, resolving jansson's refusals of legal-but-unrepresentable
 * tokens as described at the top of the file. *work gets the private copy when one was made
 * (caller frees); *doc points at the text that parsed. */
static int load_document(pctx_t *c, const char *text, size_t len, json_t **root, char **work,
                         const char **doc)
{
    *root = NULL;
    *work = NULL;
    *doc = text;
    for (int patches = 0;; patches++) {
        json_error_t jerr;
        json_t *j = json_loadb(*doc, len, 0, &jerr);
        if (j) {
            *root = j;
            return 0;
        }
        enum json_error_code ec = json_error_code(&jerr);
        if (ec == json_error_out_of_memory) return rq_oom(c);
        if (ec == json_error_invalid_utf8)
            return rq_fail(c, REC_INVALID_UTF8, "invalid UTF-8 near byte %d", jerr.position);
        int overflow = ec == json_error_numeric_overflow;
        int surrogate = ec == json_error_invalid_syntax &&
                        strncmp(jerr.text, "invalid Unicode", 15) == 0;
        int nul = ec == json_error_null_character;
        if (!overflow && !surrogate && !nul) {
            return rq_fail(c, REC_NOT_JSON, "not a valid JSON object: %s (line %d, column %d)",
                        jerr.text, jerr.line, jerr.column);
        }
        /* which top-level member holds the token that ends at p? */
        size_t p = jerr.position > 0 ? (size_t)jerr.position : 0;
        member_it_t it = {0};
        int found = 0;
        while (rq_next_member(*doc, len, &it)) {
            if (it.key0 < p && p <= it.key1) break; /* in a key */
            if (it.val0 < p && p <= it.val1) {
                found = 1;
                break;
            }
            if (it.val1 >= p) break;
        }
        if (!found) {
            if (surrogate)
                return rq_fail(c, REC_INVALID_UTF8, "a \\u escape near byte %zu encodes a lone "
                            "UTF-16 surrogate, which is not a Unicode character", p);
            return rq_fail(c, REC_NOT_JSON, "not a valid JSON object: %s (line %d, column %d)",
                        jerr.text, jerr.line, jerr.column);
        }
        char key[128];
        rq_member_key(*doc, &it, key, sizeof key);
        const field_t *f = rq_field_find(key);
        if (f) {
            char acc[256];
            rq_accepted(f, c->lim, acc, sizeof acc);
            if (surrogate)
                return rq_fail(c, REC_INVALID_UTF8, "%s: a \\u escape encodes a lone UTF-16 "
                            "surrogate, which is not a Unicode character", f->name);
            if (overflow && (f->type == F_INT || f->type == F_FLOAT || f->type == F_SEED ||
                             f->type == F_DEADLINE || f->type == F_TTL || f->type == F_META ||
                             strcmp(f->name, "input_ids") == 0))
                return rq_fail(c, REC_BAD_PARAM, "%s: number out of range; expected %s",
                            f->name, acc);
            if (nul && f->type != F_ID && f->type != F_TMPL && f->type != F_FORM &&
                f->type != F_STOP && f->type != F_META && f->type != F_STR)
                return rq_fail(c, REC_WRONG_TYPE, "%s: got a string; expected %s", f->name, acc);
            if (nul)
                return rq_fail(c, f->type == F_ID ? REC_BAD_ID : REC_BAD_PARAM,
                            "%s: strings containing \\u0000 are not accepted; expected %s",
                            f->name, acc);
            return rq_fail(c, rq_type_code(f), "%s: got a number out of range; expected %s", f->name,
                        acc);
        }
        /* an unknown field: blank the token in the private copy and parse again */
        if (patches >= MAX_PATCHES)
            return rq_fail(c, REC_NOT_JSON, "more than %d unrepresentable numbers or strings in "
                        "unknown fields (last in \"%s\")", MAX_PATCHES, key);
        size_t t0 = rq_token_start(*doc, it.val0, p);
        if (t0 >= p) return rq_fail(c, REC_NOT_JSON, "not a valid JSON object: %s", jerr.text);
        if (!*work) {
            *work = malloc(len);
            if (!*work) return rq_oom(c);
            memcpy(*work, text, len);
            *doc = *work;
        }
        char *w = *work;
        if (w[t0] == '"') {
            if (p - t0 < 2) return rq_fail(c, REC_NOT_JSON, "not a valid JSON object");
            w[t0] = '"';
            w[t0 + 1] = '"';
            memset(w + t0 + 2, ' ', p - t0 - 2);
        } else {
            w[t0] = '0';
            memset(w + t0 + 1, ' ', p - t0 - 1);
        }
    }
}

/* Optional field: NULL when absent or JSON null. */
static const json_t *opt(const json_t *root, const char *name)
{
    const json_t *v = json_object_get(root, name);
    return v && !json_is_null(v) ? v : NULL;
}

static int read_fields(pctx_t *c, const json_t *root, const char *doc, size_t len,
                       int64_t msg_timestamp_ms, request_t *r)
{
    const json_t *v = json_object_get(root, "id");
    if (!v) {
        char acc[128];
        return rq_fail(c, REC_BAD_ID, "id: missing; expected %s",
                    rq_accepted(rq_field_find("id"), c->lim, acc, sizeof acc));
    }
    if (rq_read_id(c, rq_field_find("id"), v, r)) return -1;

    const json_t *pv = opt(root, "prompt"), *mv = opt(root, "messages"),
                 *iv = opt(root, "input_ids");
    int forms = !!pv + !!mv + !!iv;
    if (forms == 0)
        return rq_fail(c, REC_MISSING_PROMPT, "prompt: missing; send exactly one of prompt "
                    "(string), messages (array) or input_ids (array)");
    if (forms > 1)
        return rq_fail(c, REC_AMBIGUOUS, "prompt: %s%s%s%s%s are set; send exactly one of "
                    "prompt, messages or input_ids", pv ? "prompt" : "",
                    pv && (mv || iv) ? " and " : "", mv ? "messages" : "",
                    mv && iv ? " and " : "", iv ? "input_ids" : "");
    if (pv && rq_read_prompt(c, rq_field_find("prompt"), pv, r)) return -1;
    if (mv && rq_read_messages(c, rq_field_find("messages"), mv, r)) return -1;
    if (iv && rq_read_input_ids(c, rq_field_find("input_ids"), iv, r)) return -1;

    const json_t *lpv = opt(root, "logprobs");
    for (size_t i = 0; i < RQ_N_FIELDS; i++) {
        const field_t *f = &RQ_FIELDS[i];
        if (f->type != F_INT && f->type != F_FLOAT) continue;
        v = opt(root, f->name);
        if (!v || (v == lpv && json_is_boolean(v))) continue;
        if (f->type == F_INT ? rq_read_int(c, f, v, r) : rq_read_float(c, f, v, r)) return -1;
    }
    /* OpenAI's chat shape: "logprobs": true with "top_logprobs": K (0..20) alternatives */
    if (r->top_logprobs >= 0 && !json_is_true(lpv))
        return rq_fail(c, REC_BAD_PARAM, "top_logprobs: needs \"logprobs\": true (with an "
                    "integer logprobs, that integer is the number of alternatives)");
    if (json_is_boolean(lpv)) {
        if (json_is_false(lpv)) r->sampling.n_logprobs = 0;
        else if (r->top_logprobs < 0) r->top_logprobs = 0;
        if (json_is_true(lpv)) r->sampling.n_logprobs = r->top_logprobs > 0 ? r->top_logprobs : 1;
    }
    if ((v = opt(root, "seed")) && rq_read_seed(c, rq_field_find("seed"), v, r)) return -1;
    if ((v = opt(root, "stop")) && rq_read_stop(c, rq_field_find("stop"), v, r)) return -1;

    int64_t deadline = 0, ttl = 0;
    if ((v = opt(root, "deadline")) && rq_read_deadline(c, rq_field_find("deadline"), v, &deadline))
        return -1;
    if ((v = opt(root, "ttl_ms")) && rq_read_ttl(c, rq_field_find("ttl_ms"), v, &ttl)) return -1;
    if (ttl > 0) {
        int64_t base = msg_timestamp_ms > 0 ? msg_timestamp_ms : sw_wall_ms();
        int64_t d = base > INT64_MAX - ttl ? INT64_MAX : base + ttl;
        if (deadline == 0 || d < deadline) deadline = d;
    }
    r->deadline_ms = deadline;

    if (opt(root, "metadata") && rq_read_metadata(c, doc, len, r)) return -1;
    if ((v = opt(root, "chat_template")) && rq_read_template(c, rq_field_find("chat_template"), v, r))
        return -1;
    for (size_t i = 0; i < RQ_N_FIELDS; i++) {
        const field_t *f = &RQ_FIELDS[i];
        if ((f->type != F_STR && f->type != F_BOOL) || !(v = opt(root, f->name))) continue;
        if (f->type == F_BOOL) {
            if (!json_is_boolean(v)) return rq_wrong_type(c, f, v);
            *(int *)((char *)r + f->off) = json_is_true(v);
        } else if (rq_read_str(c, f, v, r)) {
            return -1;
        }
    }
    if (r->n > 1 && r->stream)
        return rq_fail(c, REC_BAD_PARAM, "stream: a request with n > 1 cannot stream; send n "
                    "requests, or stream false");
    const json_t *gv = opt(root, "grammar"), *rv = opt(root, "response_format");
    if (gv || rv) {
        char msg[512];
        int rc = json_schema_request_grammar(gv, rv, &r->grammar, &r->grammar_kind, msg,
                                             sizeof msg);
        if (rc == -3) return rq_oom(c);
        if (rc == -2) return rq_fail(c, REC_WRONG_TYPE, "%s", msg);
        if (rc == -1) return rq_fail(c, REC_BAD_GRAMMAR, "%s", msg);
    }
    return 0;
}

static void set_defaults(request_t *r, const request_limits_t *l)
{
    sampler_params_default(&r->sampling);
    r->max_tokens = l->default_max_tokens < l->max_tokens_limit ? l->default_max_tokens
                                                                : l->max_tokens_limit;
    r->n = 1;
    r->top_logprobs = -1;
    r->priority = 0;
    r->enable_thinking = 1;
}

int request_parse(const char *value, size_t len, int64_t msg_timestamp_ms,
                  const request_limits_t *limits, request_t *out, const char **code,
                  char *errstr, size_t errlen)
{
    request_limits_t deflim;
    if (!limits) {
        request_limits_default(&deflim);
        limits = &deflim;
    }
    const char *code_dummy;
    pctx_t c = {limits, code ? code : &code_dummy, errstr, errlen, REC_OK};
    *c.code = NULL;
    if (errstr && errlen) errstr[0] = 0;
    memset(out, 0, sizeof *out);
    if (!value) len = 0;

    if (len > limits->max_message_bytes) {
        rq_fail(&c, REC_MESSAGE_BYTES, "message: %zu bytes, over the limit of %zu", len,
                limits->max_message_bytes);
        return -(int)c.err;
    }
    char key[128];
    size_t bad = rq_utf8_invalid_at((const unsigned char *)value, len);
    if (bad < len) {
        rq_fail(&c, REC_INVALID_UTF8, "%s: invalid UTF-8 at byte %zu (0x%02x)",
                rq_member_at(value, len, bad, key, sizeof key), bad, (unsigned char)value[bad]);
        return -(int)c.err;
    }
    /* a raw NUL is never valid JSON text, but jansson lets some through (e.g. "[null\0]") */
    const char *nul = len ? memchr(value, 0, len) : NULL;
    if (nul) {
        rq_fail(&c, REC_NOT_JSON, "%s: raw NUL byte at byte %zu (not valid in JSON text)",
                rq_member_at(value, len, (size_t)(nul - value), key, sizeof key),
                (size_t)(nul - value));
        return -(int)c.err;
    }
    /* a UTF-8 byte order mark is ignored (RFC 8259 8.1) */
    if (len >= 3 && memcmp(value, "\xEF\xBB\xBF", 3) == 0) {
        value += 3;
        len -= 3;
    }

    json_t *root = NULL;
    char *work = NULL;
    const char *doc = value;
    int rc = load_document(&c, value ? value : "", len, &root, &work, &doc);
    if (rc == 0 && !json_is_object(root))
        rc = rq_fail(&c, REC_NOT_JSON, "message: got %s; expected a JSON object",
                  rq_json_type_name(root));
    if (rc == 0) {
        set_defaults(out, limits);
        rc = read_fields(&c, root, doc, len, msg_timestamp_ms, out);
    }
    json_decref(root);
    free(work);
    if (rc != 0) {
        request_free(out);
        return -(int)c.err;
    }
    return 0;
}
