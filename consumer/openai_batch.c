/* consumer/openai_batch.c: OpenAI Batch lines <-> spillway requests and results (see
 * openai_batch.h for the mapping). */
#include "consumer/openai_batch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consumer/json_text.h"

#define MAX_CHAT_TOP 20
#define MAX_COMPLETION_LP 5

void oai_line_free(oai_line_t *l)
{
    if (!l) return;
    free(l->custom_id);
    free(l->request);
    memset(l, 0, sizeof *l);
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int refuse(oai_line_t *l, const char *code, const char *param, const char *fmt, ...)
{
    l->err_code = code;
    snprintf(l->err_param, sizeof l->err_param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err_msg, sizeof l->err_msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* Body fields that ask for something spillway does not do. A field listed with a "harmless"
 * value (null, false, empty, default) is accepted when it has that value. */
static int unsupported(const json_t *body, oai_line_t *l, int kind)
{
    static const char *const never[] = {"tools", "tool_choice", "functions", "function_call",
                                        "audio", "prediction", "web_search_options",
                                        "reasoning_effort"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++) {
        const json_t *v = json_object_get(body, never[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
            return refuse(l, "unsupported_parameter", never[i],
                          "%s: not supported by spillway (the request would need it honoured)",
                          never[i]);
    }
    const json_t *v = json_object_get(body, "logit_bias");
    if (v && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0))
        return refuse(l, "unsupported_parameter", "logit_bias", "logit_bias: not supported by spillway");
    v = json_object_get(body, "modalities");
    if (v && !json_is_null(v)) {
        size_t i;
        const json_t *m;
        if (!json_is_array(v))
            return refuse(l, "invalid_type", "modalities", "modalities: expected an array");
        json_array_foreach(v, i, m) {
            if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
                return refuse(l, "unsupported_parameter", "modalities",
                              "modalities: spillway produces text only");
        }
    }
    if ((v = json_object_get(body, "stream")) && json_is_true(v))
        return refuse(l, "unsupported_parameter", "stream", "stream: a Batch request cannot stream");
    if (kind == OAI_COMPLETION) {
        if ((v = json_object_get(body, "echo")) && json_is_true(v))
            return refuse(l, "unsupported_parameter", "echo", "echo: not supported by spillway");
        if ((v = json_object_get(body, "suffix")) && !json_is_null(v))
            return refuse(l, "unsupported_parameter", "suffix", "suffix: not supported by spillway");
        if ((v = json_object_get(body, "best_of")) && !json_is_null(v) &&
            !(json_is_integer(v) && json_integer_value(v) == 1))
            return refuse(l, "unsupported_parameter", "best_of",
                          "best_of: only 1 is supported by spillway");
    }
    return 0;
}

/* The text of a message's content: a string, or an array of {"type":"text","text"} parts
 * joined without separator (as OpenAI concatenates them). New reference, or NULL with l
 * refused (or on out of memory: l->err_code NULL). */
static json_t *content_text(const json_t *c, size_t idx, oai_line_t *l)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", idx);
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        refuse(l, "invalid_type", param, "%s: expected a string or an array of text parts", param);
        return NULL;
    }
    size_t total = 0, i;
    const json_t *p;
    json_array_foreach(c, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *t = json_object_get(p, "text");
        if (!type || strcmp(type, "text") || !json_is_string(t)) {
            refuse(l, type && strcmp(type, "text") ? "unsupported_content" : "invalid_type", param,
                   "%s[%zu]: spillway accepts only {\"type\": \"text\", \"text\": string} parts%s%s",
                   param, i, type ? "; got type " : "", type ? type : "");
            return NULL;
        }
        total += json_string_length(t);
    }
    char *buf = malloc(total + 1);
    if (!buf) return NULL;
    size_t n = 0;
    json_array_foreach(c, i, p) {
        const json_t *t = json_object_get(p, "text");
        memcpy(buf + n, json_string_value(t), json_string_length(t));
        n += json_string_length(t);
    }
    json_t *s = json_stringn_nocheck(buf, n);
    free(buf);
    return s;
}

/* body.messages -> the request's messages (new reference), or NULL (refused / out of memory). */
static json_t *map_messages(const json_t *msgs, oai_line_t *l)
{
    if (!json_is_array(msgs)) {
        refuse(l, msgs ? "invalid_type" : "missing_required_parameter", "messages",
               "messages: %s; expected an array of {role, content}", msgs ? "not an array" : "missing");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    const json_t *m;
    if (!out) return NULL;
    json_array_foreach(msgs, i, m) {
        const json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            char param[48];
            snprintf(param, sizeof param, "messages[%zu]", i);
            refuse(l, "invalid_type", param, "%s: expected an object with a string role", param);
            goto fail;
        }
        const char *r = json_string_value(role);
        json_t *text = content_text(json_object_get(m, "content"), i, l);
        if (!text) goto fail;
        json_t *o = json_pack("{s:s, s:o}", "role", strcmp(r, "developer") ? r : "system",
                              "content", text);
        if (!o || json_array_append_new(out, o)) goto fail;
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static int set_copy(json_t *r, const char *key, const json_t *body)
{
    const json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return 0;
    return json_object_set(r, key, (json_t *)v);
}

int oai_line_convert(const char *text, size_t len, const char *id, oai_line_t *l)
{
    memset(l, 0, sizeof *l);
    l->chat_top = -1;
    l->completion_lp = -1;
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je), *r = NULL;
    int rc = -1;
    if (!json_is_object(o)) {
        refuse(l, "invalid_json", "", "the line is not a JSON object%s%s", o ? "" : ": ",
               o ? "" : je.text);
        goto done;
    }
    const json_t *cid = json_object_get(o, "custom_id");
    if (json_is_string(cid) && json_string_length(cid) > 0) {
        if (!(l->custom_id = strdup(json_string_value(cid)))) goto oom;
    } else {
        refuse(l, "missing_required_parameter", "custom_id", "custom_id: expected a non-empty string");
        goto done;
    }
    const char *method = json_string_value(json_object_get(o, "method"));
    const char *url = json_string_value(json_object_get(o, "url"));
    if (url && !strcmp(url, "/v1/chat/completions")) l->kind = OAI_CHAT;
    else if (url && !strcmp(url, "/v1/completions")) l->kind = OAI_COMPLETION;
    if (method && strcmp(method, "POST")) {
        refuse(l, "invalid_value", "method", "method: \"%s\"; spillway accepts POST", method);
        goto done;
    }
    if (!l->kind) {
        refuse(l, "invalid_url", "url", "url: %s%s%s; spillway serves /v1/chat/completions and "
               "/v1/completions", url ? "\"" : "missing", url ? url : "", url ? "\"" : "");
        goto done;
    }
    const json_t *body = json_object_get(o, "body");
    if (!json_is_object(body)) {
        refuse(l, "invalid_type", "body", "body: expected an object");
        goto done;
    }
    if (unsupported(body, l, l->kind)) goto done;
    if (!(r = json_object())) goto oom;
    if (json_object_set_new(r, "id", json_string(id ? id : l->custom_id))) goto oom;
    if (l->kind == OAI_CHAT) {
        if (json_object_get(body, "prompt")) {
            refuse(l, "invalid_value", "prompt", "prompt: not a chat field; use messages (or the "
                   "/v1/completions url)");
            goto done;
        }
        json_t *m = map_messages(json_object_get(body, "messages"), l);
        if (!m) goto refused_or_oom;
        if (json_object_set_new(r, "messages", m)) goto oom;
    } else {
        const json_t *p = json_object_get(body, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
            p = json_array_get(p, 0);
        if (json_is_string(p)) {
            if (json_object_set(r, "prompt", (json_t *)p)) goto oom;
        } else if (json_is_array(p) && json_array_size(p) > 0 &&
                   json_is_integer(json_array_get(p, 0))) {
            if (json_object_set(r, "input_ids", (json_t *)p)) goto oom;
        } else if (json_is_array(p) && json_array_size(p) > 1) {
            refuse(l, "unsupported_parameter", "prompt", "prompt: %zu prompts in one request; "
                   "spillway takes one per line", json_array_size(p));
            goto done;
        } else {
            refuse(l, p ? "invalid_type" : "missing_required_parameter", "prompt",
                   "prompt: %s; expected a string or an array of token ids",
                   p ? "wrong type" : "missing");
            goto done;
        }
    }
    const json_t *mct = json_object_get(body, "max_completion_tokens");
    const json_t *mt = mct && !json_is_null(mct) ? mct : json_object_get(body, "max_tokens");
    if (mt && !json_is_null(mt) && json_object_set(r, "max_tokens", (json_t *)mt)) goto oom;
    static const char *const pass[] = {"temperature", "top_p", "seed", "stop", "presence_penalty",
                                       "frequency_penalty", "n", "response_format",
                                       /* spillway's own request fields, as extensions */
                                       "ttl_ms", "deadline", "priority", "top_k", "min_p",
                                       "repeat_penalty", "chat_template", "enable_thinking",
                                       "tenant", "class"};
    for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++)
        if (set_copy(r, pass[i], body)) goto oom;
    const json_t *lp = json_object_get(body, "logprobs"), *top = json_object_get(body, "top_logprobs");
    if (l->kind == OAI_CHAT) {
        if (lp && !json_is_null(lp) && !json_is_boolean(lp)) {
            refuse(l, "invalid_type", "logprobs", "logprobs: expected a boolean (chat completions)");
            goto done;
        }
        if (top && !json_is_null(top)) {
            json_int_t k = json_integer_value(top);
            if (!json_is_integer(top) || k < 0 || k > MAX_CHAT_TOP) {
                refuse(l, "invalid_value", "top_logprobs", "top_logprobs: expected an integer in 0..%d",
                       MAX_CHAT_TOP);
                goto done;
            }
            if (!json_is_true(lp)) {
                refuse(l, "invalid_value", "top_logprobs", "top_logprobs: needs logprobs true");
                goto done;
            }
        }
        if (json_is_true(lp)) {
            l->chat_top = top && json_is_integer(top) ? (int)json_integer_value(top) : 0;
            if (json_object_set_new(r, "logprobs", json_integer(l->chat_top > 0 ? l->chat_top : 1)))
                goto oom;
        }
    } else if (lp && !json_is_null(lp)) {
        json_int_t k = json_integer_value(lp);
        if (!json_is_integer(lp) || k < 0 || k > MAX_COMPLETION_LP) {
            refuse(l, "invalid_value", "logprobs", "logprobs: expected an integer in 0..%d "
                   "(completions)", MAX_COMPLETION_LP);
            goto done;
        }
        l->completion_lp = (int)k;
        if (json_object_set_new(r, "logprobs", json_integer(k > 0 ? k : 1))) goto oom;
    }
    const json_t *meta = json_object_get(body, "metadata");
    if (meta && !json_is_null(meta) && json_object_set(r, "metadata", (json_t *)meta)) goto oom;
    /* spillway's routing key (schemas/request.schema.json: 1..256 bytes), passed on */
    const json_t *pk = json_object_get(body, "prefix_key");
    if (pk && !json_is_null(pk)) {
        size_t n = json_is_string(pk) ? json_string_length(pk) : 0;
        if (n < 1 || n > 256 || memchr(json_string_value(pk), 0, n)) {
            refuse(l, "invalid_value", "prefix_key", "prefix_key: expected a string of 1..256 "
                   "bytes");
            goto done;
        }
        if (json_object_set(r, "prefix_key", (json_t *)pk)) goto oom;
    }
    if (!(l->request = json_text_dump(r))) goto oom;
    rc = 0;
    goto done;
refused_or_oom:
    if (l->err_code) goto done;
oom:
    rc = -2;
done:
    json_decref(r);
    json_decref(o);
    return rc;
}

json_t *oai_error_line(const char *line_id, const char *custom_id, int status, const char *type,
                       const char *code, const char *param, const char *message)
{
    if (status == 0)
        return json_pack("{s:s, s:s?, s:n, s:{s:s, s:s}}", "id", line_id, "custom_id", custom_id,
                         "response", "error", "code", code, "message", message);
    return json_pack("{s:s, s:s?, s:{s:i, s:s, s:{s:{s:s, s:s, s:s?, s:s}}}, s:n}", "id", line_id,
                     "custom_id", custom_id, "response", "status_code", status, "request_id",
                     line_id, "body", "error", "message", message, "type", type, "param",
                     param && *param ? param : NULL, "code", code, "error");
}

/* The UTF-8 bytes of s as an array of integers. */
static json_t *bytes_of(const char *s)
{
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)s; a && *p; p++)
        json_array_append_new(a, json_integer(*p));
    return a;
}

/* Chat shape: {"content": [{"token", "logprob", "bytes", "top_logprobs": [K of the same]}],
 * "refusal": null}, from the result's logprobs array; K alternatives kept. */
static json_t *chat_logprobs(const json_t *lps, int k)
{
    json_t *content = json_array();
    size_t i;
    const json_t *e;
    json_array_foreach(lps, i, e) {
        const char *tok = json_string_value(json_object_get(e, "text"));
        json_t *tops = json_array();
        const json_t *t;
        size_t j;
        json_array_foreach(json_object_get(e, "top_logprobs"), j, t) {
            if ((int)j >= k) break;
            const char *tt = json_string_value(json_object_get(t, "text"));
            json_array_append_new(tops, json_pack("{s:s, s:O, s:o}", "token", tt ? tt : "",
                                                  "logprob", json_object_get(t, "logprob"),
                                                  "bytes", bytes_of(tt ? tt : "")));
        }
        json_array_append_new(content, json_pack("{s:s, s:O, s:o, s:o}", "token", tok ? tok : "",
                                                 "logprob", json_object_get(e, "logprob"), "bytes",
                                                 bytes_of(tok ? tok : ""), "top_logprobs", tops));
    }
    return json_pack("{s:o, s:n}", "content", content, "refusal");
}

/* Completions shape: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}],
 * "text_offset"}; K alternatives per position. */
static json_t *completion_logprobs(const json_t *lps, int k)
{
    json_t *toks = json_array(), *lpv = json_array(), *tops = json_array(), *offs = json_array();
    size_t i, off = 0;
    const json_t *e;
    json_array_foreach(lps, i, e) {
        const char *tok = json_string_value(json_object_get(e, "text"));
        json_array_append_new(toks, json_string(tok ? tok : ""));
        json_array_append(lpv, json_object_get(e, "logprob"));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += tok ? strlen(tok) : 0;
        json_t *m = json_object();
        const json_t *t;
        size_t j;
        json_array_foreach(json_object_get(e, "top_logprobs"), j, t) {
            if ((int)j >= k) break;
            const char *tt = json_string_value(json_object_get(t, "text"));
            json_object_set(m, tt ? tt : "", json_object_get(t, "logprob"));
        }
        json_array_append_new(tops, m);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lpv,
                     "top_logprobs", tops, "text_offset", offs);
}

/* One choice of the body from a result-like object c ({"text", "finish_reason", "logprobs"}). */
static json_t *choice(const oai_line_t *l, const json_t *c, size_t index)
{
    const json_t *lps = json_object_get(c, "logprobs");
    json_t *lp = NULL;
    if (l->kind == OAI_CHAT && l->chat_top >= 0 && json_is_array(lps))
        lp = chat_logprobs(lps, l->chat_top);
    else if (l->kind == OAI_COMPLETION && l->completion_lp >= 0 && json_is_array(lps))
        lp = completion_logprobs(lps, l->completion_lp);
    const json_t *text = json_object_get(c, "text"), *fin = json_object_get(c, "finish_reason");
    if (l->kind == OAI_CHAT)
        return json_pack("{s:I, s:{s:s, s:O, s:n}, s:o?, s:O}", "index", (json_int_t)index,
                         "message", "role", "assistant", "content", text, "refusal", "logprobs",
                         lp ? lp : json_null(), "finish_reason", fin);
    return json_pack("{s:O, s:I, s:o?, s:O}", "text", text, "index", (json_int_t)index, "logprobs",
                     lp ? lp : json_null(), "finish_reason", fin);
}

json_t *oai_output_line(const oai_line_t *l, const char *line_id, const json_t *res,
                        long long created)
{
    const json_t *u = json_object_get(res, "usage");
    json_int_t pt = json_integer_value(json_object_get(u, "prompt_tokens"));
    json_int_t ct = json_integer_value(json_object_get(u, "completion_tokens"));
    json_int_t cached = json_integer_value(json_object_get(u, "cached_tokens"));
    json_t *choices = json_array();
    if (!choices) return NULL;
    const json_t *many = json_object_get(res, "choices");
    if (json_is_array(many)) {
        size_t i;
        const json_t *c;
        json_array_foreach(many, i, c) json_array_append_new(choices, choice(l, c, i));
    } else {
        json_array_append_new(choices, choice(l, res, 0));
    }
    char bid[300];
    snprintf(bid, sizeof bid, "%s%s", l->kind == OAI_CHAT ? "chatcmpl-" : "cmpl-", line_id);
    const char *model = json_string_value(json_object_get(res, "model"));
    const char *fp = json_string_value(json_object_get(res, "model_fingerprint"));
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:o, s:{s:I, s:I, s:I, s:{s:I}}, s:s?}", "id", bid,
                             "object", l->kind == OAI_CHAT ? "chat.completion" : "text_completion",
                             "created", (json_int_t)created, "model", model ? model : "",
                             "choices", choices, "usage", "prompt_tokens", pt,
                             "completion_tokens", ct, "total_tokens", pt + ct,
                             "prompt_tokens_details", "cached_tokens", cached,
                             "system_fingerprint", fp);
    if (!body) return NULL;
    return json_pack("{s:s, s:s, s:{s:i, s:s, s:o}, s:n}", "id", line_id, "custom_id",
                     l->custom_id ? l->custom_id : "", "response", "status_code", 200,
                     "request_id", line_id, "body", body, "error");
}
