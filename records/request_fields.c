/* records/request_fields.c: the readers of the request's fields, one per kind of field (the
 * table and the order they are read in: request.c). Each returns 0, or -1 with the code and
 * message set through rq_fail. */
#include "records/request.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/utf8.h"
#include "records/records_int.h"

/* ---- field readers (v is never NULL and never JSON null) ---- */

/* An integer field's value x (or, when huge, a value beyond 2^53) is outside its range. */
int rq_out_of_range(pctx_t *c, const field_t *f, int huge, int64_t x)
{
    char acc[256];
    rq_accepted(f, c->lim, acc, sizeof acc);
    if (huge) return rq_fail(c, REC_BAD_PARAM, "%s: out of range; expected %s", f->name, acc);
    return rq_fail(c, REC_BAD_PARAM, "%s: %lld is out of range; expected %s", f->name,
                (long long)x, acc);
}

char *rq_dup_n(const char *s, size_t n)
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
int rq_get_int64(const json_t *v, int64_t *out)
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

int rq_read_int(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    int64_t x = 0;
    int rc = rq_get_int64(v, &x);
    if (rc == -1) return rq_wrong_type(c, f, v);
    double hi = f->hi == -2 ? (double)c->lim->max_n : f->hi < 0 ? (double)c->lim->max_tokens_limit : f->hi;
    if (rc == -2 || (double)x < f->lo || (double)x > hi) return rq_out_of_range(c, f, rc == -2, x);
    *(int *)((char *)r + f->off) = (int)x;
    return 0;
}

int rq_read_float(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    if (!json_is_number(v)) return rq_wrong_type(c, f, v);
    double d = json_number_value(v);
    float x = (float)d;
    /* the range is checked on the double and again on the float actually used, so a tiny
     * positive top_p that rounds to 0 is refused too */
    int bad = !isfinite(d) || d > f->hi || d < f->lo || (f->lo_open && d <= f->lo) ||
              !isfinite(x) || (double)x > f->hi || (f->lo_open && (double)x <= f->lo);
    if (bad) {
        char acc[128];
        return rq_fail(c, REC_BAD_PARAM, "%s: %.10g is out of range; expected %s", f->name, d,
                    rq_accepted(f, c->lim, acc, sizeof acc));
    }
    *(float *)((char *)r + f->off) = x;
    return 0;
}

int rq_read_deadline(pctx_t *c, const field_t *f, const json_t *v, int64_t *out)
{
    char acc[256];
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        const char *why = "too long";
        if (n > MAX_DEADLINE_TEXT || rq_parse_timestamp(s, n, out, &why) != 0)
            return rq_fail(c, REC_BAD_PARAM, "%s: \"%.*s\" is not a valid timestamp (%s); "
                        "expected %s", f->name, n > MAX_DEADLINE_TEXT ? MAX_DEADLINE_TEXT : (int)n,
                        s, why, rq_accepted(f, c->lim, acc, sizeof acc));
        return 0;
    }
    int64_t x;
    int rc = rq_get_int64(v, &x);
    if (rc == -1) return rq_wrong_type(c, f, v);
    if (rc == -2 || x < 1 || x > MAX_EPOCH_MS)
        return rq_out_of_range(c, f, rc == -2, x);
    *out = x;
    return 0;
}

int rq_read_ttl(pctx_t *c, const field_t *f, const json_t *v, int64_t *out)
{
    int64_t x;
    int rc = rq_get_int64(v, &x);
    if (rc == -1) return rq_wrong_type(c, f, v);
    if (rc == -2 || x < 1 || x > MAX_EPOCH_MS) return rq_out_of_range(c, f, rc == -2, x);
    *out = x;
    return 0;
}

int rq_read_id(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[128];
    if (!json_is_string(v)) {
        return rq_fail(c, REC_BAD_ID, "id: got %s; expected %s%s", rq_json_type_name(v),
                    rq_accepted(f, c->lim, acc, sizeof acc),
                    json_is_number(v) ? " (send the id as a JSON string, e.g. \"id\": \"42\")"
                                      : "");
    }
    size_t n = json_string_length(v);
    if (n == 0 || n > c->lim->max_id_bytes)
        return rq_fail(c, REC_BAD_ID, "id: %zu bytes; expected %s", n,
                    rq_accepted(f, c->lim, acc, sizeof acc));
    r->id = rq_dup_n(json_string_value(v), n);
    return r->id ? 0 : rq_oom(c);
}

int rq_read_prompt(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[128];
    if (!json_is_string(v)) return rq_wrong_type(c, f, v);
    size_t n = json_string_length(v);
    if (n == 0) return rq_fail(c, REC_EMPTY_PROMPT, "prompt: empty; expected %s",
                            rq_accepted(f, c->lim, acc, sizeof acc));
    if (n > c->lim->max_prompt_bytes)
        return rq_fail(c, REC_PROMPT_BYTES, "prompt: %zu bytes, over the limit of %zu", n,
                    c->lim->max_prompt_bytes);
    r->prompt = rq_dup_n(json_string_value(v), n);
    if (!r->prompt) return rq_oom(c);
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
        return rq_fail(c, REC_WRONG_TYPE, "messages[%zu].content: %s%s; expected a string or an "
                    "array of {\"type\": \"text\", \"text\": string} parts", i,
                    content ? "got " : "missing", content ? rq_json_type_name(content) : "");
    size_t total = 0, k;
    const json_t *p;
    json_array_foreach(content, k, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *t = json_object_get(p, "text");
        if (!type || strcmp(type, "text") || !json_is_string(t))
            return rq_fail(c, REC_WRONG_TYPE, "messages[%zu].content[%zu]: expected a part "
                        "{\"type\": \"text\", \"text\": string} (text is all spillway reads)", i, k);
        total += json_string_length(t);
    }
    *len = total;
    return 0;
}

/* A copy of a content checked by content_len (parts joined). NULL on out of memory. */
static char *content_dup(const json_t *content, size_t len)
{
    if (json_is_string(content)) return rq_dup_n(json_string_value(content), len);
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

/* The size of prompt field f's value v, an array of 1..max elements (unit: what one is called);
 * -1 after failing c: not an array, empty (empty_prompt), or more than max (over). */
static long prompt_array(pctx_t *c, const field_t *f, const json_t *v, int max, rec_err_t over,
                         const char *unit)
{
    char acc[128];
    if (!json_is_array(v)) return rq_wrong_type(c, f, v);
    size_t n = json_array_size(v);
    if (n == 0) return rq_fail(c, REC_EMPTY_PROMPT, "%s: empty array; expected %s", f->name,
                               rq_accepted(f, c->lim, acc, sizeof acc));
    if (n > (size_t)max)
        return rq_fail(c, over, "%s: %zu %s, over the limit of %d", f->name, n, unit, max);
    return (long)n;
}

int rq_read_messages(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    long an = prompt_array(c, f, v, c->lim->max_messages, REC_PROMPT_BYTES, "messages");
    if (an < 0) return -1;
    const size_t n = (size_t)an;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(v, i);
        if (!json_is_object(m))
            return rq_fail(c, REC_WRONG_TYPE, "messages[%zu]: got %s; expected an object "
                        "{\"role\": string, \"content\": string}", i, rq_json_type_name(m));
        const json_t *role = json_object_get(m, "role");
        const json_t *content = json_object_get(m, "content");
        if (!json_is_string(role))
            return rq_fail(c, REC_WRONG_TYPE, "messages[%zu].role: %s%s; expected a string such "
                        "as \"user\"", i, role ? "got " : "missing",
                        role ? rq_json_type_name(role) : "");
        size_t cl;
        if (content_len(c, i, content, &cl)) return -1;
        size_t rl = json_string_length(role);
        if (rl == 0 || rl > MAX_ROLE_BYTES)
            return rq_fail(c, REC_BAD_PARAM, "messages[%zu].role: %zu bytes; expected 1..%d",
                        i, rl, MAX_ROLE_BYTES);
        total += rl + cl;
    }
    if (total > c->lim->max_prompt_bytes)
        return rq_fail(c, REC_PROMPT_BYTES, "messages: %zu bytes of roles and contents, over the "
                    "limit of %zu", total, c->lim->max_prompt_bytes);
    r->messages = calloc(n, sizeof *r->messages);
    if (!r->messages) return rq_oom(c);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(v, i);
        const json_t *role = json_object_get(m, "role");
        const json_t *content = json_object_get(m, "content");
        request_message_t *dst = &r->messages[i];
        dst->role = rq_dup_n(json_string_value(role), json_string_length(role));
        size_t cl = 0;
        content_len(c, i, content, &cl); /* checked above */
        dst->content = content_dup(content, cl);
        r->n_messages = (int)i + 1;
        if (!dst->role || !dst->content) return rq_oom(c);
    }
    return 0;
}

int rq_read_input_ids(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    long an = prompt_array(c, f, v, c->lim->max_input_ids, REC_PROMPT_TOKENS, "ids");
    if (an < 0) return -1;
    const size_t n = (size_t)an;
    r->input_ids = malloc(n * sizeof *r->input_ids);
    if (!r->input_ids) return rq_oom(c);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        int64_t x;
        int rc = rq_get_int64(e, &x);
        if (rc == -1)
            return rq_fail(c, REC_WRONG_TYPE, "input_ids[%zu]: got %s; expected an integer in "
                        "0..2147483647", i, rq_json_type_name(e));
        if (rc == -2 || x < 0 || x > INT32_MAX) {
            if (rc == -2)
                return rq_fail(c, REC_BAD_PARAM, "input_ids[%zu]: out of range; expected an "
                            "integer in 0..2147483647", i);
            return rq_fail(c, REC_BAD_PARAM, "input_ids[%zu]: %lld is out of range; expected an "
                        "integer in 0..2147483647", i, (long long)x);
        }
        r->input_ids[i] = (int32_t)x;
    }
    r->n_input_ids = (int)n;
    return 0;
}

int rq_read_seed(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    int64_t x;
    int rc = rq_get_int64(v, &x);
    if (rc == -1) return rq_wrong_type(c, f, v);
    if (rc == -2 || x < 0) return rq_out_of_range(c, f, rc == -2, x);
    r->sampling.seed = (uint64_t)x;
    r->has_seed = 1;
    return 0;
}

int rq_read_stop(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[160];
    size_t n;
    if (json_is_string(v)) {
        n = 1;
    } else if (json_is_array(v)) {
        n = json_array_size(v);
    } else {
        return rq_wrong_type(c, f, v);
    }
    if (n > (size_t)c->lim->max_stop)
        return rq_fail(c, REC_TOO_MANY_STOP, "stop: %zu strings, over the limit of %d", n,
                    c->lim->max_stop);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(e))
            return rq_fail(c, REC_WRONG_TYPE, "stop[%zu]: got %s; expected %s", i,
                        rq_json_type_name(e), rq_accepted(f, c->lim, acc, sizeof acc));
        size_t len = json_string_length(e);
        if (len == 0 || len > c->lim->max_stop_bytes)
            return rq_fail(c, REC_BAD_PARAM, "stop[%zu]: %zu bytes; expected %s", i, len,
                        rq_accepted(f, c->lim, acc, sizeof acc));
    }
    if (n == 0) return 0;
    r->stop = calloc(n, sizeof *r->stop);
    if (!r->stop) return rq_oom(c);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_string(v) ? v : json_array_get(v, i);
        r->stop[i] = rq_dup_n(json_string_value(e), json_string_length(e));
        r->n_stop = (int)i + 1;
        if (!r->stop[i]) return rq_oom(c);
    }
    return 0;
}

/* metadata: the text of the last top-level "metadata" member (jansson keeps the last of
 * duplicate keys too), compacted. */
int rq_read_metadata(pctx_t *c, const char *doc, size_t len, request_t *r)
{
    member_it_t it = {0};
    size_t v0 = 0, v1 = 0;
    int found = 0;
    char key[16];
    while (rq_next_member(doc, len, &it)) {
        size_t klen = it.key1 - it.key0;
        if (klen > 2 && klen < 64) {
            rq_member_key(doc, &it, key, sizeof key);
            if (strcmp(key, "metadata") == 0) {
                v0 = it.val0;
                v1 = it.val1;
                found = 1;
            }
        }
    }
    if (!found || v1 <= v0 || v1 > len)
        return rq_fail(c, REC_NOT_JSON, "metadata: cannot locate the value in the message");
    char *out = malloc(v1 - v0 + 1);
    if (!out) return rq_oom(c);
    size_t n = rq_compact_json(doc + v0, v1 - v0, out);
    out[n] = 0;
    if (n > c->lim->max_metadata_bytes) {
        free(out);
        return rq_fail(c, REC_METADATA, "metadata: %zu bytes in compact form, over the limit of "
                    "%zu", n, c->lim->max_metadata_bytes);
    }
    r->metadata_json = out;
    return 0;
}

int rq_read_template(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    char acc[64];
    if (!json_is_string(v)) return rq_wrong_type(c, f, v);
    size_t n = json_string_length(v);
    if (n == 0 || n > MAX_TEMPLATE_NAME_BYTES)
        return rq_fail(c, REC_TEMPLATE, "chat_template: %zu bytes; expected %s", n,
                    rq_accepted(f, c->lim, acc, sizeof acc));
    r->template_name = rq_dup_n(json_string_value(v), n);
    return r->template_name ? 0 : rq_oom(c);
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
        return rq_fail(c, REC_BAD_PARAM, "%s%s: %zu bytes, not accepted; expected %s", from,
                    f->name, n, rq_accepted(f, c->lim, acc, sizeof acc));
    char **dst = (char **)((char *)r + f->off);
    free(*dst);
    *dst = rq_dup_n(s, n);
    return *dst ? 0 : rq_oom(c);
}

int rq_read_str(pctx_t *c, const field_t *f, const json_t *v, request_t *r)
{
    if (!json_is_string(v)) return rq_wrong_type(c, f, v);
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
    pctx_t c = {limits, code ? code : &code_dummy, errstr, errlen, REC_OK};
    const field_t *f = rq_field_find(name);
    if (!f || f->type != F_STR) return 0;
    if (*(char **)((char *)r + f->off)) return 0; /* the JSON field wins */
    if (!value) len = 0;
    if (rq_utf8_invalid_at((const unsigned char *)value, len) < len) {
        rq_fail(&c, REC_INVALID_UTF8, "header %s: invalid UTF-8", f->name);
        return -(int)c.err;
    }
    return set_str(&c, f, value ? value : "", len, "header ", r) ? -(int)c.err : 0;
}

