/* records/encode.c: the records spillway writes: result, stream chunk, usage record and the
 * dead letter's headers (records.h). */
#include "records/records.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "consumer/json_text.h"

/* Copies src[0..len) into dst (cap >= 3 * len + 1) with every byte that does not start a
 * complete, valid UTF-8 sequence (truncated, overlong, surrogate, > U+10FFFF) replaced by
 * U+FFFD; NUL-terminates. Returns the output length. */
static size_t utf8_sanitize(const unsigned char *src, size_t len, char *dst)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n = sw_utf8_decode(src + i, len - i, &cp);
        if (!n) {
            memcpy(dst + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
            continue;
        }
        memcpy(dst + o, src + i, n);
        o += n;
        i += n;
    }
    dst[o] = 0;
    return o;
}

/* {"id", "text", "logprob"} of one token. NULL on out of memory. */
static json_t *logprob_entry(const engine_logprob_t *lp, rec_piece_fn piece, void *arg)
{
    char buf[256], text[3 * sizeof buf + 1];
    int n = piece(arg, lp->id, buf, sizeof buf);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof buf) n = (int)sizeof buf;
    utf8_sanitize((const unsigned char *)buf, (size_t)n, text);
    double v = isfinite(lp->logprob) ? (double)lp->logprob : -9999.0;
    return json_pack("{s:i, s:s, s:f}", "id", (int)lp->id, "text", text, "logprob", v);
}

json_t *records_logprobs(const engine_logprob_t *chosen, const engine_logprob_t *top,
                         int n_tokens, int n_top, int max_top, rec_piece_fn piece,
                         void *piece_arg)
{
    json_t *arr = json_array();
    if (!arr) return NULL;
    for (int i = 0; i < n_tokens; i++) {
        json_t *e = logprob_entry(&chosen[i], piece, piece_arg), *t = json_array();
        if (!e || !t || json_object_set_new(e, "top_logprobs", t)) { /* steals t */
            json_decref(e);
            goto oom;
        }
        for (int j = 0; j < n_top && (max_top < 0 || j < max_top); j++) {
            const engine_logprob_t *c = &top[(size_t)i * (size_t)n_top + (size_t)j];
            if (c->id < 0) continue; /* fewer candidates than asked (tiny vocabulary) */
            if (json_array_append_new(t, logprob_entry(c, piece, piece_arg))) {
                json_decref(e);
                goto oom;
            }
        }
        if (json_array_append_new(arr, e)) goto oom;
    }
    return arr;
oom:
    json_decref(arr);
    return NULL;
}

json_t *records_choice(int index, const char *text, size_t len, const char *finish,
                       json_t *logprobs)
{
    json_t *c = json_pack("{s:i, s:s%, s:s}", "index", index, "text", text ? text : "",
                          text ? len : (size_t)0, "finish_reason", finish);
    if (!c || (logprobs && json_object_set_new(c, "logprobs", logprobs))) { /* steals */
        if (!c) json_decref(logprobs);
        json_decref(c);
        return NULL;
    }
    return c;
}

/* The compact text of o (consumed) with shortest reals, then "key":value appended as its last
 * member when value is not NULL, value spliced in as the text it is (the request's own
 * metadata text). malloc'd, or NULL on out of memory. */
static char *finish_text(json_t *o, const char *key, const char *value)
{
    char *obj = json_text_dump(o);
    json_decref(o);
    if (!obj || !value) return obj;
    size_t ol = strlen(obj), kl = strlen(key), vl = strlen(value);
    char *out = ol >= 2 && obj[ol - 1] == '}' ? malloc(ol + kl + vl + 5) : NULL;
    if (!out) {
        free(obj);
        return NULL;
    }
    size_t n = ol - 1;
    memcpy(out, obj, n);
    if (ol > 2) out[n++] = ','; /* "{}" has no member to follow */
    out[n++] = '"';
    memcpy(out + n, key, kl);
    n += kl;
    out[n++] = '"';
    out[n++] = ':';
    memcpy(out + n, value, vl);
    n += vl;
    out[n++] = '}';
    out[n] = 0;
    free(obj);
    return out;
}

/* {"topic", "partition", "offset"}; NULL on out of memory. */
static json_t *source_json(const rec_source_t *s)
{
    return json_pack("{s:s, s:i, s:I}", "topic", s->topic, "partition", (int)s->partition,
                     "offset", (json_int_t)s->offset);
}

/* o[key] = v (stolen); 0, or -1 when v is NULL or the set fails. */
static int put(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0 ? 0 : -1;
}

char *records_result(const rec_result_t *in)
{
    json_t *o = json_object();
    if (!o) return NULL;
    const char *text = in->text ? in->text : "";
    size_t text_len = in->text ? in->text_len : 0;
    const char *finish = in->finish;
    const json_t *c0 = in->choices ? json_array_get(in->choices, 0) : NULL;
    if (c0) { /* n > 1: text and finish_reason of choice 0 at the top, every choice below */
        text = json_string_value(json_object_get(c0, "text"));
        text_len = json_string_length(json_object_get(c0, "text"));
        finish = json_string_value(json_object_get(c0, "finish_reason"));
    }
    int bad = put(o, "id", json_string(in->id));
    if (in->correlation_id) bad |= put(o, "correlation_id", json_string(in->correlation_id));
    if (in->tenant) bad |= put(o, "tenant", json_string(in->tenant));
    bad |= put(o, "text", json_stringn(text ? text : "", text ? text_len : 0));
    bad |= put(o, "finish_reason", json_string(finish ? finish : ""));
    if (c0) bad |= put(o, "choices", json_incref((json_t *)in->choices));
    bad |= put(o, "usage",
               json_pack("{s:I, s:I, s:I, s:f}", "prompt_tokens", (json_int_t)in->prompt_tokens,
                         "cached_tokens", (json_int_t)in->cached_tokens, "completion_tokens",
                         (json_int_t)in->completion_tokens, "compute_ms", in->compute_ms));
    bad |= put(o, "timings",
               json_pack("{s:f, s:f, s:f, s:f, s:f}", "queue_ms", in->queue_ms, "ttft_ms",
                         in->ttft_ms, "decode_ms", in->decode_ms, "total_ms", in->total_ms,
                         "wait_ms", in->wait_ms));
    if (in->class_name) bad |= put(o, "class", json_string(in->class_name));
    if (in->capped_from > 0)
        bad |= put(o, "degraded",
                   json_pack("{s:s, s:i, s:i}", "step", "cap", "max_tokens", in->max_tokens,
                             "requested_max_tokens", in->capped_from));
    bad |= put(o, "model", json_string(in->model ? in->model : ""));
    if (in->model_fingerprint)
        bad |= put(o, "model_fingerprint", json_string(in->model_fingerprint));
    bad |= put(o, "worker", json_string(in->worker));
    bad |= put(o, "input", source_json(&in->input));
    if (!c0 && in->logprobs) bad |= put(o, "logprobs", json_incref((json_t *)in->logprobs));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return finish_text(o, "metadata", in->metadata);
}

char *records_chunk(const rec_chunk_t *in)
{
    json_t *o = json_object();
    if (!o) return NULL;
    int bad = put(o, "id", json_string(in->id));
    if (in->correlation_id) bad |= put(o, "correlation_id", json_string(in->correlation_id));
    bad |= put(o, "seq", json_integer(in->seq));
    bad |= put(o, "text", json_stringn(in->text ? in->text : "", in->text ? in->text_len : 0));
    bad |= put(o, "n_tokens", json_integer(in->n_tokens));
    bad |= put(o, "final", json_boolean(in->finish != NULL));
    bad |= put(o, "best_effort", json_true());
    if (in->finish) bad |= put(o, "finish_reason", json_string(in->finish));
    bad |= put(o, "input", source_json(&in->input));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return finish_text(o, NULL, NULL);
}

char *records_usage(const rec_usage_t *in)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "worker",
                          in->worker, "tenant", in->tenant, "class", in->class_name, "start_ms",
                          (json_int_t)in->start_ms, "end_ms", (json_int_t)in->end_ms,
                          "requests", (json_int_t)in->requests, "prompt_tokens",
                          (json_int_t)in->prompt_tokens, "cached_tokens",
                          (json_int_t)in->cached_tokens, "completion_tokens",
                          (json_int_t)in->completion_tokens, "compute_ms", in->compute_ms);
    return o ? finish_text(o, NULL, NULL) : NULL;
}

rd_kafka_headers_t *records_dlq_headers(const rec_dlq_t *in)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(9);
    if (!h) return NULL;
    char part[16], off[24], ts[24], ob[24];
    snprintf(part, sizeof part, "%d", (int)in->input.partition);
    snprintf(off, sizeof off, "%lld", (long long)in->input.offset);
    snprintf(ts, sizeof ts, "%lld", (long long)in->timestamp_ms);
    snprintf(ob, sizeof ob, "%zu", in->original_bytes);
    if (rd_kafka_header_add(h, REC_H_CODE, -1, in->code, -1) ||
        rd_kafka_header_add(h, REC_H_MESSAGE, -1, in->message, -1) ||
        rd_kafka_header_add(h, REC_H_TOPIC, -1, in->input.topic, -1) ||
        rd_kafka_header_add(h, REC_H_PARTITION, -1, part, -1) ||
        rd_kafka_header_add(h, REC_H_OFFSET, -1, off, -1) ||
        rd_kafka_header_add(h, REC_H_WORKER, -1, in->worker, -1) ||
        rd_kafka_header_add(h, REC_H_TIMESTAMP, -1, ts, -1) ||
        (in->truncated && (rd_kafka_header_add(h, REC_H_TRUNCATED, -1, "true", -1) ||
                           rd_kafka_header_add(h, REC_H_ORIG_BYTES, -1, ob, -1)))) {
        rd_kafka_headers_destroy(h);
        return NULL;
    }
    return h;
}
