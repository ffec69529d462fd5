/* consumer/request.c: prompt request messages (see request.h and schemas/request.schema.json).
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
#include "consumer/request.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "engine/engine.h"
#include "engine/grammar.h"
#include "consumer/json_schema.h"

#define MAX_PATCHES 16                     /* unknown-field tokens overwritten, at most */
#define MAX_ROLE_BYTES 64
#define MAX_TEMPLATE_NAME_BYTES 64
#define MAX_DEADLINE_TEXT 64
#define MAX_EPOCH_MS INT64_C(253402300799999) /* 9999-12-31T23:59:59.999Z */
#define MAX_EXACT_REAL 9007199254740992.0    /* 2^53: integral reals accepted up to this */
#define MAX_TOPIC_BYTES 249                  /* Kafka's limit on a topic name */
#define MAX_LABEL_BYTES 64                   /* tenant and class names (metric labels) */

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

typedef struct {
    const request_limits_t *lim;
    const char **code;
    char *errstr;
    size_t errlen;
} pctx_t;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int fail(pctx_t *c, const char *code, const char *fmt, ...)
{
    *c->code = code;
    if (c->errstr && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->errstr, c->errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int oom(pctx_t *c)
{
    return fail(c, REQ_ERR_NO_MEMORY, "out of memory while parsing the request");
}

/* ---- fields: names, accepted values ---- */

enum ftype { F_ID, F_TEXT, F_FORM, F_INT, F_FLOAT, F_SEED, F_STOP, F_DEADLINE, F_TTL, F_META, F_TMPL,
             F_STR, F_BOOL, F_GRAMMAR };

typedef struct {
    const char *name;
    int type;            /* enum ftype */
    double lo, hi;       /* F_INT / F_FLOAT range (hi < 0 with F_INT: from limits) */
    int lo_open;         /* F_FLOAT: lo itself is excluded */
    size_t off;          /* offset of the int / float in request_t */
} field_t;

#define OFF(m) offsetof(request_t, m)
static const field_t FIELDS[] = {
    {"id", F_ID, 0, 0, 0, 0},
    {"prompt", F_FORM, 0, 0, 0, 0},
    {"messages", F_FORM, 0, 0, 0, 0},
    {"input_ids", F_FORM, 0, 0, 0, 0},
    {"max_tokens", F_INT, 1, -1, 0, OFF(max_tokens)}, /* hi -1: limits.max_tokens_limit */
    /* OpenAI's newer name; read after max_tokens, so it wins when both are set */
    {"max_completion_tokens", F_INT, 1, -1, 0, OFF(max_tokens)},
    {"temperature", F_FLOAT, 0, 100, 0, OFF(temperature)},
    {"top_p", F_FLOAT, 0, 1, 1, OFF(top_p)},
    {"top_k", F_INT, 0, 1000000, 0, OFF(top_k)},
    {"min_p", F_FLOAT, 0, 1, 0, OFF(min_p)},
    {"seed", F_SEED, 0, 0, 0, 0},
    {"stop", F_STOP, 0, 0, 0, 0},
    {"repeat_penalty", F_FLOAT, 0, 100, 1, OFF(repeat_penalty)},
    {"presence_penalty", F_FLOAT, -100, 100, 0, OFF(presence_penalty)},
    {"frequency_penalty", F_FLOAT, -100, 100, 0, OFF(frequency_penalty)},
    {"logprobs", F_INT, 0, 20, 0, OFF(n_logprobs)}, /* or true/false: chat shape */
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
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

static const field_t *field_find(const char *name)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (strcmp(FIELDS[i].name, name) == 0) return &FIELDS[i];
    return NULL;
}

/* What field f accepts, for error messages. */
static const char *accepted(const field_t *f, const request_limits_t *l, char *buf, size_t n)
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
static const char *type_code(const field_t *f)
{
    return f->type == F_ID ? REQ_ERR_BAD_ID : REQ_ERR_WRONG_TYPE;
}

static const char *json_type_name(const json_t *v)
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

static int wrong_type(pctx_t *c, const field_t *f, const json_t *v)
{
    char acc[256];
    return fail(c, type_code(f), "%s: got %s; expected %s", f->name, json_type_name(v),
                accepted(f, c->lim, acc, sizeof acc));
}

/* ---- UTF-8 ---- */

/* Offset of the first byte that does not start a well-formed UTF-8 sequence (no overlong
 * forms, no surrogates, nothing above U+10FFFF), or len when all of s is well-formed. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned b = s[i];
        if (b < 0x80) { i++; continue; }
        size_t more;
        unsigned lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) more = 1;
        else if (b == 0xE0) { more = 2; lo = 0xA0; }
        else if (b >= 0xE1 && b <= 0xEC) more = 2;
        else if (b == 0xED) { more = 2; hi = 0x9F; }
        else if (b >= 0xEE && b <= 0xEF) more = 2;
        else if (b == 0xF0) { more = 3; lo = 0x90; }
        else if (b >= 0xF1 && b <= 0xF3) more = 3;
        else if (b == 0xF4) { more = 3; hi = 0x8F; }
        else return i;
        if (len - i - 1 < more) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += more + 1;
    }
    return len;
}

/* ---- a lexer over raw JSON text: top-level members and their spans ----
 * Works on any bytes without reading past len; its answers are meaningful on the prefix that
 * jansson accepted. */

static int is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

static int is_delim(char ch)
{
    return is_ws(ch) || ch == ',' || ch == ':' || ch == '[' || ch == ']' || ch == '{' ||
           ch == '}' || ch == '"';
}

static size_t skip_ws(const char *s, size_t len, size_t i)
{
    while (i < len && is_ws(s[i])) i++;
    return i;
}

/* s[i] == '"': the index after the closing quote (len when unterminated). */
static size_t skip_string(const char *s, size_t len, size_t i)
{
    for (i++; i < len; i++) {
        if (s[i] == '\\') {
            if (++i >= len) return len;
        } else if (s[i] == '"') {
            return i + 1;
        }
    }
    return len;
}

/* The end of the value starting at s[i]. */
static size_t skip_value(const char *s, size_t len, size_t i)
{
    if (i >= len) return len;
    if (s[i] == '"') return skip_string(s, len, i);
    if (s[i] == '{' || s[i] == '[') {
        size_t depth = 0;
        while (i < len) {
            char ch = s[i];
            if (ch == '"') {
                i = skip_string(s, len, i);
                continue;
            }
            if (ch == '{' || ch == '[') {
                depth++;
            } else if (ch == '}' || ch == ']') {
                if (--depth == 0) return i + 1;
            }
            i++;
        }
        return len;
    }
    size_t start = i;
    while (i < len && !is_delim(s[i])) i++;
    return i > start ? i : start + 1;
}

typedef struct {
    size_t pos;
    int started;
    size_t key0, key1; /* key token, quotes included */
    size_t val0, val1; /* value span */
} member_it_t;

/* Next member of the top-level object; 1, or 0 at its end or at malformed text. */
static int next_member(const char *s, size_t len, member_it_t *it)
{
    size_t i = skip_ws(s, len, it->pos);
    if (i >= len || s[i] != (it->started ? ',' : '{')) return 0;
    it->started = 1;
    i = skip_ws(s, len, i + 1);
    if (i >= len || s[i] != '"') return 0;
    it->key0 = i;
    i = skip_string(s, len, i);
    it->key1 = i;
    i = skip_ws(s, len, i);
    if (i >= len || s[i] != ':') return 0;
    i = skip_ws(s, len, i + 1);
    if (i >= len) return 0;
    it->val0 = i;
    it->val1 = skip_value(s, len, i);
    it->pos = it->val1;
    return 1;
}

/* The key of the member as text (escapes decoded), into buf; "" when it cannot be decoded. */
static void member_key(const char *s, const member_it_t *it, char *buf, size_t n)
{
    buf[0] = 0;
    size_t klen = it->key1 - it->key0;
    if (klen < 2) return;
    if (!memchr(s + it->key0, '\\', klen)) {
        size_t m = klen - 2 < n - 1 ? klen - 2 : n - 1;
        memcpy(buf, s + it->key0 + 1, m);
        buf[m] = 0;
        return;
    }
    /* escaped: let jansson decode the key token as a one-element array */
    char *tmp = malloc(klen + 2);
    if (!tmp) return;
    tmp[0] = '[';
    memcpy(tmp + 1, s + it->key0, klen);
    tmp[klen + 1] = ']';
    json_t *a = json_loadb(tmp, klen + 2, 0, NULL);
    free(tmp);
    const char *k = a ? json_string_value(json_array_get(a, 0)) : NULL;
    if (k) snprintf(buf, n, "%s", k);
    json_decref(a);
}

/* Start of the token of s[from..p) that ends at p (the one jansson stopped after). */
static size_t token_start(const char *s, size_t from, size_t p)
{
    size_t i = from, last = from;
    while (i < p) {
        char ch = s[i];
        if (is_ws(ch) || ch == ',' || ch == ':' || ch == '[' || ch == ']' || ch == '{' ||
            ch == '}') {
            i++;
            continue;
        }
        last = i;
        if (ch == '"') {
            i = skip_string(s, p, i);
        } else {
            while (i < p && !is_delim(s[i])) i++;
        }
    }
    return last;
}

/* Copies the JSON text s[0..n) without whitespace outside strings. Returns the length. */
static size_t compact_json(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] == '"') {
            size_t e = skip_string(s, n, i);
            memcpy(out + o, s + i, e - i);
            o += e - i;
            i = e;
        } else {
            if (!is_ws(s[i])) out[o++] = s[i];
            i++;
        }
    }
    return o;
}

/* The key of the top-level member whose value holds byte off, into key; "message" when there
 * is none (the byte is outside any value, or the text before it is not a plausible object). */
static const char *member_at(const char *s, size_t len, size_t off, char *key, size_t n)
{
    member_it_t it = {0};
    key[0] = 0;
    while (next_member(s, len, &it)) {
        if (it.key0 <= off && off < it.val1) {
            if (off >= it.val0) member_key(s, &it, key, n);
            break;
        }
    }
    return key[0] ? key : "message";
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
        if (ec == json_error_out_of_memory) return oom(c);
        if (ec == json_error_invalid_utf8)
            return fail(c, REQ_ERR_INVALID_UTF8, "invalid UTF-8 near byte %d", jerr.position);
        int overflow = ec == json_error_numeric_overflow;
        int surrogate = ec == json_error_invalid_syntax &&
                        strncmp(jerr.text, "invalid Unicode", 15) == 0;
        int nul = ec == json_error_null_character;
        if (!overflow && !surrogate && !nul) {
            return fail(c, REQ_ERR_NOT_JSON, "not a valid JSON object: %s (line %d, column %d)",
                        jerr.text, jerr.line, jerr.column);
        }
        /* which top-level member holds the token that ends at p? */
        size_t p = jerr.position > 0 ? (size_t)jerr.position : 0;
        member_it_t it = {0};
        int found = 0;
        while (next_member(*doc, len, &it)) {
            if (it.key0 < p && p <= it.key1) break; /* in a key */
            if (it.val0 < p && p <= it.val1) {
                found = 1;
                break;
            }
            if (it.val1 >= p) break;
        }
        if (!found) {
            if (surrogate)
                return fail(c, REQ_ERR_INVALID_UTF8, "a \\u escape near byte %zu encodes a lone "
                            "UTF-16 surrogate, which is not a Unicode character", p);
            return fail(c, REQ_ERR_NOT_JSON, "not a valid JSON object: %s (line %d, column %d)",
                        jerr.text, jerr.line, jerr.column);
        }
        char key[128];
        member_key(*doc, &it, key, sizeof key);
        const field_t *f = field_find(key);
        if (f) {
            char acc[256];
            accepted(f, c->lim, acc, sizeof acc);
            if (surrogate)
                return fail(c, REQ_ERR_INVALID_UTF8, "%s: a \\u escape encodes a lone UTF-16 "
                            "surrogate, which is not a Unicode character", f->name);
            if (overflow && (f->type == F_INT || f->type == F_FLOAT || f->type == F_SEED ||
                             f->type == F_DEADLINE || f->type == F_TTL || f->type == F_META ||
                             strcmp(f->name, "input_ids") == 0))
                return fail(c, REQ_ERR_BAD_PARAM, "%s: number out of range; expected %s",
                            f->name, acc);
            if (nul && f->type != F_ID && f->type != F_TMPL && f->type != F_FORM &&
                f->type != F_STOP && f->type != F_META && f->type != F_STR)
                return fail(c, REQ_ERR_WRONG_TYPE, "%s: got a string; expected %s", f->name, acc);
            if (nul)
                return fail(c, f->type == F_ID ? REQ_ERR_BAD_ID : REQ_ERR_BAD_PARAM,
                            "%s: strings containing \\u0000 are not accepted; expected %s",
                            f->name, acc);
            return fail(c, type_code(f), "%s: got a number out of range; expected %s", f->name,
                        acc);
        }
        /* an unknown field: blank the token in the private copy and parse again */
        if (patches >= MAX_PATCHES)
            return fail(c, REQ_ERR_NOT_JSON, "more than %d unrepresentable numbers or strings in "
                        "unknown fields (last in \"%s\")", MAX_PATCHES, key);
        size_t t0 = token_start(*doc, it.val0, p);
        if (t0 >= p) return fail(c, REQ_ERR_NOT_JSON, "not a valid JSON object: %s", jerr.text);
        if (!*work) {
            *work = malloc(len);
            if (!*work) return oom(c);
            memcpy(*work, text, len);
            *doc = *work;
        }
        char *w = *work;
        if (w[t0] == '"') {
            if (p - t0 < 2) return fail(c, REQ_ERR_NOT_JSON, "not a valid JSON object");
            w[t0] = '"';
            w[t0 + 1] = '"';
            memset(w + t0 + 2, ' ', p - t0 - 2);
        } else {
            w[t0] = '0';
            memset(w + t0 + 1, ' ', p - t0 - 1);
        }
    }
}

/* ---- field readers (v is never NULL and never JSON null) ---- */

/* An integer field's value x (or, when huge, a value beyond 2^53) is outside its range. */
static int out_of_range(pctx_t *c, const field_t *f, int huge, int64_t x)
{
    char acc[256];
    accepted(f, c->lim, acc, sizeof acc);
    if (huge) return fail(c, REQ_ERR_BAD_PARAM, "%s: out of range; expected %s", f->name, acc);
    return fail(c, REQ_ERR_BAD_PARAM, "%s: %lld is out of range; expected %s", f->name,
                (long long)x, acc);
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* An integer value: JSON integers, and reals with no fraction up to 2^53 in magnitude.
 * 0 ok; -1 wrong type (*code set); -2 out of the representable range. */
static int get_int64(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (floor(d) != d) return -1;
        if (fabs(d) > MAX_EXACT_REAL) return -2;
        *out = (int64_t)d;
        return 0;
    }
    return -1;
}

static int read_int(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    int64_t x = 0;
    int rc = get_int64(v, &x);
    if (rc == -1) return wrong_type(c, f, v);
    double hi = f->hi == -2 ? (double)c->lim->max_n : f->hi < 0 ? (double)c->lim->max_tokens_limit : f->hi;
    if (rc == -2 || (double)x < f->lo || (double)x > hi) return out_of_range(c, f, rc == -2, x);
    *(int *)((char *)r + f->off) = (int)x;
    return 0;
}

static int read_float(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    if (!json_is_number(v)) return wrong_type(c, f, v);
    double d = json_number_value(v);
    float x = (float)d;
    /* the range is checked on the double and again on the float actually used, so a tiny
     * positive top_p that rounds to 0 is refused too */
    int bad = !isfinite(d) || d > f->hi || d < f->lo || (f->lo_open && d <= f->lo) ||
              !isfinite(x) || (double)x > f->hi || (f->lo_open && (double)x <= f->lo);
    if (bad) {
        char acc[128];
        return fail(c, REQ_ERR_BAD_PARAM, "%s: %.10g is out of range; expected %s", f->name, d,
                    accepted(f, c->lim, acc, sizeof acc));
    }
    *(float *)((char *)r + f->off) = x;
    return 0;
}

static int days_in_month(int y, int m)
{
    static const int dm[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : dm[m - 1];
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    if (m <= 2) y -= 1;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;                            /* [0, 399] */
    int64_t mp = m > 2 ? m - 3 : m + 9;                      /* March = 0 */
    int64_t doy = (153 * mp + 2) / 5 + d - 1;                /* [0, 365] */
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;     /* [0, 146096] */
    return era * 146097 + doe - 719468;
}

static int digits(const char *s, size_t n, size_t at, int count, int *out)
{
    if (at + (size_t)count > n) return -1;
    int v = 0;
    for (int k = 0; k < count; k++) {
        char ch = s[at + k];
        if (ch < '0' || ch > '9') return -1;
        v = v * 10 + (ch - '0');
    }
    *out = v;
    return 0;
}

/* RFC 3339 date-time "YYYY-MM-DD(T|t| )HH:MM:SS[.frac](Z|z|+HH:MM|-HH:MM|+HHMM|-HHMM)" to Unix
 * epoch milliseconds (the fraction truncated to ms; a leap second 60 counts as the next
 * second). 0, or -1 with why set to a short reason. */
static int parse_timestamp(const char *s, size_t n, int64_t *ms, const char **why)
{
    int Y, M, D, h, mi, sec;
    *why = "expected the form 2026-11-30T12:00:00Z";
    if (digits(s, n, 0, 4, &Y) || n < 5 || s[4] != '-' || digits(s, n, 5, 2, &M) || n < 8 ||
        s[7] != '-' || digits(s, n, 8, 2, &D) || n < 11 ||
        (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || digits(s, n, 11, 2, &h) || n < 14 ||
        s[13] != ':' || digits(s, n, 14, 2, &mi) || n < 17 || s[16] != ':' ||
        digits(s, n, 17, 2, &sec))
        return -1;
    if (M < 1 || M > 12) return *why = "month out of range", -1;
    if (D < 1 || D > days_in_month(Y, M)) return *why = "day out of range for the month", -1;
    if (h > 23 || mi > 59 || sec > 60) return *why = "time of day out of range", -1;
    size_t i = 19;
    int frac_ms = 0;
    if (i < n && s[i] == '.') {
        i++;
        size_t f0 = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (i - f0 < 3) frac_ms = frac_ms * 10 + (s[i] - '0');
            i++;
        }
        if (i == f0) return *why = "empty fraction of a second", -1;
        for (size_t k = i - f0; k < 3; k++) frac_ms *= 10;
    }
    int offset_min = 0;
    if (i < n && (s[i] == 'Z' || s[i] == 'z')) {
        i++;
    } else if (i < n && (s[i] == '+' || s[i] == '-')) {
        int sign = s[i] == '-' ? -1 : 1, oh, om;
        i++;
        if (digits(s, n, i, 2, &oh)) return *why = "bad UTC offset", -1;
        i += 2;
        if (i < n && s[i] == ':') i++;
        if (digits(s, n, i, 2, &om)) return *why = "bad UTC offset", -1;
        i += 2;
        if (oh > 23 || om > 59) return *why = "UTC offset out of range", -1;
        offset_min = sign * (oh * 60 + om);
    } else {
        return *why = "missing time zone (Z or an offset such as +02:00)", -1;
    }
    if (i != n) return *why = "unexpected text after the time zone", -1;
    int64_t secs = days_from_civil(Y, M, D) * 86400 + h * 3600 + mi * 60 + sec -
                   (int64_t)offset_min * 60;
    *ms = secs * 1000 + frac_ms;
    if (*ms < 1 || *ms > MAX_EPOCH_MS) return *why = "before 1970 or after 9999", -1;
    return 0;
}

static int read_deadline(pctx_t *c, const field_t *f, const json_t *v, int64_t *out)
{
    char acc[256];
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        const char *why = "too long";
        if (n > MAX_DEADLINE_TEXT || parse_timestamp(s, n, out, &why) != 0)
            return fail(c, REQ_ERR_BAD_PARAM, "%s: \"%.*s\" is not a valid timestamp (%s); "
                        "expected %s", f->name, n > MAX_DEADLINE_TEXT ? MAX_DEADLINE_TEXT : (int)n,
                        s, why, accepted(f, c->lim, acc, sizeof acc));
        return 0;
    }
    int64_t x;
    int rc = get_int64(v, &x);
    if (rc == -1) return wrong_type(c, f, v);
    if (rc == -2 || x < 1 || x > MAX_EPOCH_MS)
        return out_of_range(c, f, rc == -2, x);
    *out = x;
    return 0;
}

static int read_ttl(pctx_t *c, const field_t *f, const json_t *v, int64_t *out)
{
    int64_t x;
    int rc = get_int64(v, &x);
    if (rc == -1) return wrong_type(c, f, v);
    if (rc == -2 || x < 1 || x > MAX_EPOCH_MS) return out_of_range(c, f, rc == -2, x);
    *out = x;
    return 0;
}

static int read_id(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[128];
    if (!json_is_string(v)) {
        return fail(c, REQ_ERR_BAD_ID, "id: got %s; expected %s%s", json_type_name(v),
                    accepted(f, c->lim, acc, sizeof acc),
                    json_is_number(v) ? " (send the id as a JSON string, e.g. \"id\": \"42\")"
                                      : "");
    }
    size_t n = json_string_length(v);
    if (n == 0 || n > c->lim->max_id_bytes)
        return fail(c, REQ_ERR_BAD_ID, "id: %zu bytes; expected %s", n,
                    accepted(f, c->lim, acc, sizeof acc));
    r->id = dup_n(json_string_value(v), n);
    return r->id ? 0 : oom(c);
}

static int read_prompt(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[128];
    if (!json_is_string(v)) return wrong_type(c, f, v);
    size_t n = json_string_length(v);
    if (n == 0) return fail(c, REQ_ERR_EMPTY_PROMPT, "prompt: empty; expected %s",
                            accepted(f, c->lim, acc, sizeof acc));
    if (n > c->lim->max_prompt_bytes)
        return fail(c, REQ_ERR_PROMPT_BYTES, "prompt: %zu bytes, over the limit of %zu", n,
                    c->lim->max_prompt_bytes);
    r->prompt = dup_n(json_string_value(v), n);
    if (!r->prompt) return oom(c);
    r->prompt_len = n;
    return 0;
}

/* The byte length of a message content: a string, or an array of {"type": "text", "text":
 * string} parts (OpenAI's form; joined without separator). 0 and *len set, or -1 (failed). */
static int content_len(pctx_t *c, size_t i, const json_t *content, size_t *len)
{
    if (json_is_string(content)) {
        *len = json_string_length(content);
        return 0;
    }
    if (!json_is_array(content))
        return fail(c, REQ_ERR_WRONG_TYPE, "messages[%zu].content: %s%s; expected a string or an "
                    "array of {\"type\": \"text\", \"text\": string} parts", i,
                    content ? "got " : "missing", content ? json_type_name(content) : "");
    size_t total = 0, k;
    const json_t *p;
    json_array_foreach(content, k, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *t = json_object_get(p, "text");
        if (!type || strcmp(type, "text") || !json_is_string(t))
            return fail(c, REQ_ERR_WRONG_TYPE, "messages[%zu].content[%zu]: expected a part "
                        "{\"type\": \"text\", \"text\": string} (text is all spillway reads)", i, k);
        total += json_string_length(t);
    }
    *len = total;
    return 0;
}

/* A copy of a content checked by content_len (parts joined). NULL on out of memory. */
static char *content_dup(const json_t *content, size_t len)
{
    if (json_is_string(content)) return dup_n(json_string_value(content), len);
    char *d = malloc(len + 1);
    if (!d) return NULL;
    size_t n = 0, k;
    const json_t *p;
    json_array_foreach(content, k, p) {
        const json_t *t = json_object_get(p, "text");
        memcpy(d + n, json_string_value(t), json_string_length(t));
        n += json_string_length(t);
    }
    d[n] = 0;
    return d;
}

static int read_messages(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[128];
    if (!json_is_array(v)) return wrong_type(c, f, v);
    size_t n = json_array_size(v);
    if (n == 0) return fail(c, REQ_ERR_EMPTY_PROMPT, "messages: empty array; expected %s",
                            accepted(f, c->lim, acc, sizeof acc));
    if (n > (size_t)c->lim->max_messages)
        return fail(c, REQ_ERR_PROMPT_BYTES, "messages: %zu messages, over the limit of %d", n,
                    c->lim->max_messages);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(v, i);
        if (!json_is_object(m))
            return fail(c, REQ_ERR_WRONG_TYPE, "messages[%zu]: got %s; expected an object "
                        "{\"role\": string, \"content\": string}", i, json_type_name(m));
        const json_t *role = json_object_get(m, "role");
        const json_t *content = json_object_get(m, "content");
        if (!json_is_string(role))
            return fail(c, REQ_ERR_WRONG_TYPE, "messages[%zu].role: %s%s; expected a string such "
                        "as \"user\"", i, role ? "got " : "missing",
                        role ? json_type_name(role) : "");
        size_t cl;
        if (content_len(c, i, content, &cl)) return -1;
        size_t rl = json_string_length(role);
        if (rl == 0 || rl > MAX_ROLE_BYTES)
            return fail(c, REQ_ERR_BAD_PARAM, "messages[%zu].role: %zu bytes; expected 1..%d",
                        i, rl, MAX_ROLE_BYTES);
        total += rl + cl;
    }
    if (total > c->lim->max_prompt_bytes)
        return fail(c, REQ_ERR_PROMPT_BYTES, "messages: %zu bytes of roles and contents, over the "
                    "limit of %zu", total, c->lim->max_prompt_bytes);
    r->messages = calloc(n, sizeof *r->messages);
    if (!r->messages) return oom(c);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(v, i);
        const json_t *role = json_object_get(m, "role");
        const json_t *content = json_object_get(m, "content");
        request_message_t *dst = &r->messages[i];
        dst->role = dup_n(json_string_value(role), json_string_length(role));
        size_t cl = 0;
        content_len(c, i, content, &cl); /* checked above */
        dst->content = content_dup(content, cl);
        r->n_messages = (int)i + 1;
        if (!dst->role || !dst->content) return oom(c);
    }
    return 0;
}

static int read_input_ids(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[128];
    if (!json_is_array(v)) return wrong_type(c, f, v);
    size_t n = json_array_size(v);
    if (n == 0) return fail(c, REQ_ERR_EMPTY_PROMPT, "input_ids: empty array; expected %s",
                            accepted(f, c->lim, acc, sizeof acc));
    if (n > (size_t)c->lim->max_input_ids)
        return fail(c, REQ_ERR_PROMPT_TOKENS, "input_ids: %zu ids, over the limit of %d", n,
                    c->lim->max_input_ids);
    r->input_ids = malloc(n * sizeof *r->input_ids);
    if (!r->input_ids) return oom(c);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        int64_t x;
        int rc = get_int64(e, &x);
        if (rc == -1)
            return fail(c, REQ_ERR_WRONG_TYPE, "input_ids[%zu]: got %s; expected an integer in "
                        "0..2147483647", i, json_type_name(e));
        if (rc == -2 || x < 0 || x > INT32_MAX) {
            if (rc == -2)
                return fail(c, REQ_ERR_BAD_PARAM, "input_ids[%zu]: out of range; expected an "
                            "integer in 0..2147483647", i);
            return fail(c, REQ_ERR_BAD_PARAM, "input_ids[%zu]: %lld is out of range; expected an "
                        "integer in 0..2147483647", i, (long long)x);
        }
        r->input_ids[i] = (int32_t)x;
    }
    r->n_input_ids = (int)n;
    return 0;
}

static int read_seed(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    int64_t x;
    int rc = get_int64(v, &x);
    if (rc == -1) return wrong_type(c, f, v);
    if (rc == -2 || x < 0) return out_of_range(c, f, rc == -2, x);
    r->seed = (uint64_t)x;
    r->has_seed = 1;
    return 0;
}

static int read_stop(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[160];
    size_t n;
    if (json_is_string(v)) {
        n = 1;
    } else if (json_is_array(v)) {
        n = json_array_size(v);
    } else {
        return wrong_type(c, f, v);
    }
    if (n > (size_t)c->lim->max_stop)
        return fail(c, REQ_ERR_TOO_MANY_STOP, "stop: %zu strings, over the limit of %d", n,
                    c->lim->max_stop);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(e))
            return fail(c, REQ_ERR_WRONG_TYPE, "stop[%zu]: got %s; expected %s", i,
                        json_type_name(e), accepted(f, c->lim, acc, sizeof acc));
        size_t len = json_string_length(e);
        if (len == 0 || len > c->lim->max_stop_bytes)
            return fail(c, REQ_ERR_BAD_PARAM, "stop[%zu]: %zu bytes; expected %s", i, len,
                        accepted(f, c->lim, acc, sizeof acc));
    }
    if (n == 0) return 0;
    r->stop = calloc(n, sizeof *r->stop);
    if (!r->stop) return oom(c);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_string(v) ? v : json_array_get(v, i);
        r->stop[i] = dup_n(json_string_value(e), json_string_length(e));
        r->n_stop = (int)i + 1;
        if (!r->stop[i]) return oom(c);
    }
    return 0;
}

/* metadata: the text of the last top-level "metadata" member (jansson keeps the last of
 * duplicate keys too), compacted. */
static int read_metadata(pctx_t *c, const char *doc, size_t len, request_t *r)
{
    member_it_t it = {0};
    size_t v0 = 0, v1 = 0;
    int found = 0;
    char key[16];
    while (next_member(doc, len, &it)) {
        size_t klen = it.key1 - it.key0;
        if (klen > 2 && klen < 64) {
            member_key(doc, &it, key, sizeof key);
            if (strcmp(key, "metadata") == 0) {
                v0 = it.val0;
                v1 = it.val1;
                found = 1;
            }
        }
    }
    if (!found || v1 <= v0 || v1 > len)
        return fail(c, REQ_ERR_NOT_JSON, "metadata: cannot locate the value in the message");
    char *out = malloc(v1 - v0 + 1);
    if (!out) return oom(c);
    size_t n = compact_json(doc + v0, v1 - v0, out);
    out[n] = 0;
    if (n > c->lim->max_metadata_bytes) {
        free(out);
        return fail(c, REQ_ERR_METADATA, "metadata: %zu bytes in compact form, over the limit of "
                    "%zu", n, c->lim->max_metadata_bytes);
    }
    r->metadata_json = out;
    return 0;
}

static int read_template(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[64];
    if (!json_is_string(v)) return wrong_type(c, f, v);
    size_t n = json_string_length(v);
    if (n == 0 || n > MAX_TEMPLATE_NAME_BYTES)
        return fail(c, REQ_ERR_TEMPLATE, "chat_template: %zu bytes; expected %s", n,
                    accepted(f, c->lim, acc, sizeof acc));
    r->template_name = dup_n(json_string_value(v), n);
    return r->template_name ? 0 : oom(c);
}

/* 1 when s[0..n) is a legal Kafka topic name (1..249 of [a-zA-Z0-9._-], not "." or ".."). */
int request_is_topic_name(const char *s, size_t n)
{
    if (n == 0 || n > MAX_TOPIC_BYTES) return 0;
    if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

/* 1 when s[0..n) may name a tenant or class: 1..64 of [a-zA-Z0-9._:@/-], not starting with
 * '_' (the worker's own labels, _none and _other, start with it). */
int request_is_label_name(const char *s, size_t n)
{
    if (n == 0 || n > MAX_LABEL_BYTES || s[0] == '_') return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == ':' || ch == '@' || ch == '/' || ch == '-'))
            return 0;
    }
    return 1;
}

/* Checks the value s[0..n) of string field f (from the JSON or from a header: `from` names
 * which, for the message) and stores a copy. 0 or -1. */
static int set_str(pctx_t *c, const field_t *f, const char *s, size_t n, const char *from,
                   request_t *r)
{
    char acc[128];
    int ok;
    if (strcmp(f->name, "reply_to") == 0)
        ok = request_is_topic_name(s, n);
    else if (strcmp(f->name, "tenant") == 0 || strcmp(f->name, "class") == 0 ||
                 strcmp(f->name, "model") == 0)
        ok = request_is_label_name(s, n);
    else
        ok = n > 0 && n <= c->lim->max_id_bytes;
    if (!ok || memchr(s, 0, n))
        return fail(c, REQ_ERR_BAD_PARAM, "%s%s: %zu bytes, not accepted; expected %s", from,
                    f->name, n, accepted(f, c->lim, acc, sizeof acc));
    char **dst = (char **)((char *)r + f->off);
    free(*dst);
    *dst = dup_n(s, n);
    return *dst ? 0 : oom(c);
}

static int read_str(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    if (!json_is_string(v)) return wrong_type(c, f, v);
    return set_str(c, f, json_string_value(v), json_string_length(v), "", r);
}

int request_apply_header(request_t *r, const char *name, const void *value, size_t len,
                         const request_limits_t *limits, const char **code, char *errstr,
                         size_t errlen)
{
    request_limits_t deflim;
    if (!limits) {
        request_limits_default(&deflim);
        limits = &deflim;
    }
    const char *code_dummy;
    pctx_t c = {limits, code ? code : &code_dummy, errstr, errlen};
    const field_t *f = field_find(name);
    if (!f || f->type != F_STR) return 0;
    if (*(char **)((char *)r + f->off)) return 0; /* the JSON field wins */
    if (!value) len = 0;
    if (utf8_invalid_at((const unsigned char *)value, len) < len)
        return fail(&c, REQ_ERR_INVALID_UTF8, "header %s: invalid UTF-8", f->name);
    return set_str(&c, f, value ? value : "", len, "header ", r);
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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
        return fail(c, REQ_ERR_BAD_ID, "id: missing; expected %s",
                    accepted(field_find("id"), c->lim, acc, sizeof acc));
    }
    if (read_id(c, field_find("id"), v, r)) return -1;

    const json_t *pv = opt(root, "prompt"), *mv = opt(root, "messages"),
                 *iv = opt(root, "input_ids");
    int forms = !!pv + !!mv + !!iv;
    if (forms == 0)
        return fail(c, REQ_ERR_MISSING_PROMPT, "prompt: missing; send exactly one of prompt "
                    "(string), messages (array) or input_ids (array)");
    if (forms > 1)
        return fail(c, REQ_ERR_AMBIGUOUS, "prompt: %s%s%s%s%s are set; send exactly one of "
                    "prompt, messages or input_ids", pv ? "prompt" : "",
                    pv && (mv || iv) ? " and " : "", mv ? "messages" : "",
                    mv && iv ? " and " : "", iv ? "input_ids" : "");
    if (pv && read_prompt(c, field_find("prompt"), pv, r)) return -1;
    if (mv && read_messages(c, field_find("messages"), mv, r)) return -1;
    if (iv && read_input_ids(c, field_find("input_ids"), iv, r)) return -1;

    const json_t *lpv = opt(root, "logprobs");
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &FIELDS[i];
        if (f->type != F_INT && f->type != F_FLOAT) continue;
        v = opt(root, f->name);
        if (!v || (v == lpv && json_is_boolean(v))) continue;
        if (f->type == F_INT ? read_int(c, f, v, r) : read_float(c, f, v, r)) return -1;
    }
    /* OpenAI's chat shape: "logprobs": true with "top_logprobs": K (0..20) alternatives */
    if (r->top_logprobs >= 0 && !json_is_true(lpv))
        return fail(c, REQ_ERR_BAD_PARAM, "top_logprobs: needs \"logprobs\": true (with an "
                    "integer logprobs, that integer is the number of alternatives)");
    if (json_is_boolean(lpv)) {
        if (json_is_false(lpv)) r->n_logprobs = 0;
        else if (r->top_logprobs < 0) r->top_logprobs = 0;
        if (json_is_true(lpv)) r->n_logprobs = r->top_logprobs > 0 ? r->top_logprobs : 1;
    }
    if ((v = opt(root, "seed")) && read_seed(c, field_find("seed"), v, r)) return -1;
    if ((v = opt(root, "stop")) && read_stop(c, field_find("stop"), v, r)) return -1;

    int64_t deadline = 0, ttl = 0;
    if ((v = opt(root, "deadline")) && read_deadline(c, field_find("deadline"), v, &deadline))
        return -1;
    if ((v = opt(root, "ttl_ms")) && read_ttl(c, field_find("ttl_ms"), v, &ttl)) return -1;
    if (ttl > 0) {
        int64_t base = msg_timestamp_ms > 0 ? msg_timestamp_ms : wall_ms();
        int64_t d = base > INT64_MAX - ttl ? INT64_MAX : base + ttl;
        if (deadline == 0 || d < deadline) deadline = d;
    }
    r->deadline_ms = deadline;

    if (opt(root, "metadata") && read_metadata(c, doc, len, r)) return -1;
    if ((v = opt(root, "chat_template")) && read_template(c, field_find("chat_template"), v, r))
        return -1;
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &FIELDS[i];
        if ((f->type != F_STR && f->type != F_BOOL) || !(v = opt(root, f->name))) continue;
        if (f->type == F_BOOL) {
            if (!json_is_boolean(v)) return wrong_type(c, f, v);
            *(int *)((char *)r + f->off) = json_is_true(v);
        } else if (read_str(c, f, v, r)) {
            return -1;
        }
    }
    if (r->n > 1 && r->stream)
        return fail(c, REQ_ERR_BAD_PARAM, "stream: a request with n > 1 cannot stream; send n "
                    "requests, or stream false");
    const json_t *gv = opt(root, "grammar"), *rv = opt(root, "response_format");
    if (gv || rv) {
        char msg[512];
        int rc = json_schema_request_grammar(gv, rv, &r->grammar, &r->grammar_kind, msg,
                                             sizeof msg);
        if (rc == -3) return oom(c);
        if (rc == -2) return fail(c, REQ_ERR_WRONG_TYPE, "%s", msg);
        if (rc == -1) return fail(c, REQ_ERR_BAD_GRAMMAR, "%s", msg);
    }
    return 0;
}

static void set_defaults(request_t *r, const request_limits_t *l)
{
    engine_request_t d;
    engine_request_default(&d);
    r->max_tokens = l->default_max_tokens < l->max_tokens_limit ? l->default_max_tokens
                                                                : l->max_tokens_limit;
    r->temperature = d.sampling.temperature;
    r->top_p = d.sampling.top_p;
    r->min_p = d.sampling.min_p;
    r->top_k = d.sampling.top_k;
    r->repeat_penalty = d.sampling.repeat_penalty;
    r->presence_penalty = d.sampling.presence_penalty;
    r->frequency_penalty = d.sampling.frequency_penalty;
    r->seed = d.sampling.seed;
    r->n_logprobs = d.sampling.n_logprobs;
    r->n = 1;
    r->top_logprobs = -1;
    r->priority = d.priority;
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
    pctx_t c = {limits, code ? code : &code_dummy, errstr, errlen};
    *c.code = NULL;
    if (errstr && errlen) errstr[0] = 0;
    memset(out, 0, sizeof *out);
    if (!value) len = 0;

    if (len > limits->max_message_bytes)
        return fail(&c, REQ_ERR_MESSAGE_BYTES, "message: %zu bytes, over the limit of %zu", len,
                    limits->max_message_bytes);
    char key[128];
    size_t bad = utf8_invalid_at((const unsigned char *)value, len);
    if (bad < len)
        return fail(&c, REQ_ERR_INVALID_UTF8, "%s: invalid UTF-8 at byte %zu (0x%02x)",
                    member_at(value, len, bad, key, sizeof key), bad, (unsigned char)value[bad]);
    /* a raw NUL is never valid JSON text, but jansson lets some through (e.g. "[null\0]") */
    const char *nul = len ? memchr(value, 0, len) : NULL;
    if (nul)
        return fail(&c, REQ_ERR_NOT_JSON, "%s: raw NUL byte at byte %zu (not valid in JSON text)",
                    member_at(value, len, (size_t)(nul - value), key, sizeof key),
                    (size_t)(nul - value));
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
        rc = fail(&c, REQ_ERR_NOT_JSON, "message: got %s; expected a JSON object",
                  json_type_name(root));
    if (rc == 0) {
        set_defaults(out, limits);
        rc = read_fields(&c, root, doc, len, msg_timestamp_ms, out);
    }
    json_decref(root);
    free(work);
    if (rc != 0) {
        request_free(out);
        return -1;
    }
    return 0;
}
