/* worker/result.c: the records the engine thread makes for a finished request: the result JSON
 * (schemas/result.schema.json) and the dead-letter form, and the outbox that hands them to the
 * poll thread. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/utf8.h"
#include "worker/worker_int.h"

const char *const FINISH_NAMES[N_FINISH] = {"stop", "length", "abort", "expired",
                                           "overloaded"};

/* Any thread: hands a finished output to the poll thread. */
void woutbox_push(worker_t *w, wreq_t *r)
{
    r->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->outbox_tail) w->outbox_tail->next = r;
    else w->outbox = r;
    w->outbox_tail = r;
    pthread_mutex_unlock(&w->mu);
    if (w->cons) consumer_wake(w->cons);
}

/* Marks r as a dead letter (the original message goes to the DLQ topic). */
void wres_dlq(wreq_t *r, const char *code, const char *msg)
{
    r->is_dlq = 1;
    r->dlq_code = code;
    snprintf(r->dlq_msg, sizeof r->dlq_msg, "%s", msg);
    free(r->out);
    r->out = NULL;
}

static double ms_between(int64_t a_ns, int64_t b_ns) { return (double)(b_ns - a_ns) * 1e-6; }

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

/* {"id", "text", "logprob"} of one token (top-level entries get "top_logprobs" added by the
 * caller). A logprob of -inf (a token the model gives no chance) is written as -9999, as
 * OpenAI's API does. NULL on out of memory. */
static json_t *logprob_entry(engine_t *eng, const engine_logprob_t *lp)
{
    char piece[256], text[3 * sizeof piece + 1];
    int n = engine_token_to_piece(eng, lp->id, piece, sizeof piece);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof piece) n = (int)sizeof piece;
    utf8_sanitize((const unsigned char *)piece, (size_t)n, text);
    double v = isfinite(lp->logprob) ? (double)lp->logprob : -9999.0;
    return json_pack("{s:i, s:s, s:f}", "id", (int)lp->id, "text", text, "logprob", v);
}

/* The result's "logprobs" array (schemas/result.schema.json): one entry per generated token,
 * with at most max_top alternatives each (max_top < 0: all the engine computed). NULL on out of memory. */
static json_t *logprobs_json(engine_t *eng, const engine_result_t *er, int max_top)
{
    json_t *arr = json_array();
    if (!arr) return NULL;
    for (int i = 0; i < er->n_tokens; i++) {
        json_t *e = logprob_entry(eng, &er->logprobs[i]), *top = json_array();
        if (!e || !top || json_object_set_new(e, "top_logprobs", top)) {
            json_decref(e);
            goto oom;
        }
        for (int j = 0; j < er->n_logprobs && (max_top < 0 || j < max_top); j++) {
            const engine_logprob_t *t = &er->top_logprobs[(size_t)i * (size_t)er->n_logprobs + (size_t)j];
            if (t->id < 0) continue; /* fewer candidates than asked (tiny vocabulary) */
            if (json_array_append_new(top, logprob_entry(eng, t))) {
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

int wres_choice(worker_t *w, wreq_t *r, const engine_result_t *er, const char *finish, int index)
{
    (void)w;
    json_t *c = json_pack("{s:i, s:s%, s:s}", "index", index, "text", er->text ? er->text : "",
                          er->text ? er->text_len : (size_t)0, "finish_reason", finish);
    if (!c) return -1;
    if (r->model && r->req.n_logprobs > 0 && er->logprobs) {
        json_t *lp = logprobs_json(r->model->eng, er, r->req.top_logprobs);
        if (!lp || json_object_set_new(c, "logprobs", lp)) {
            json_decref(c);
            return -1;
        }
    }
    if (json_array_set_new(r->choices, (size_t)index, c)) return -1;
    r->n_completion += er->n_tokens;
    r->compute_ns += er->compute_ns;
    if (index == 0) r->choice0_cached = er->n_cached;
    if (er->n_prompt > r->n_prompt) r->n_prompt = er->n_prompt;
    return 0;
}

/* obj (a compact JSON object text ending in '}', malloc'd; consumed) with "key":value appended as
 * its last member, value spliced in as the text it is (the request's own metadata text: numbers
 * and escapes exactly as the producer wrote them). The new malloc'd text, or NULL on out of
 * memory (obj freed either way). */
static char *splice_member(char *obj, const char *key, const char *value)
{
    size_t ol = strlen(obj), kl = strlen(key), vl = strlen(value);
    if (ol < 2 || obj[ol - 1] != '}') {
        free(obj);
        return NULL;
    }
    char *out = malloc(ol + kl + vl + 5);
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

/* Builds the result JSON of r. er is the engine's result, or NULL for an expired request that
 * was never computed. 0 or -1 (out of memory: r becomes a DLQ record). */
int wres_result(worker_t *w, wreq_t *r, const engine_result_t *er, const char *finish)
{
    int64_t now = mono_ns();
    json_t *o = json_object(), *u = json_object(), *t = json_object(), *in = json_object();
    if (!o || !u || !t || !in) goto oom;
    json_object_set_new(o, "id", json_string(r->req.id));
    if (r->req.correlation_id)
        json_object_set_new(o, "correlation_id", json_string(r->req.correlation_id));
    if (r->req.tenant) json_object_set_new(o, "tenant", json_string(r->req.tenant));
    const json_t *c0 = r->choices ? json_array_get(r->choices, 0) : NULL;
    if (c0 && json_is_object(c0)) {
        /* n > 1: text and finish_reason of choice 0 at the top (the n = 1 shape), every choice
         * in "choices"; usage sums the choices' tokens and compute (wres_choice) */
        finish = json_string_value(json_object_get(c0, "finish_reason"));
        json_object_set(o, "text", json_object_get(c0, "text"));
        json_object_set_new(o, "finish_reason", json_string(finish));
        json_object_set(o, "choices", r->choices);
        r->n_cached = r->choice0_cached;
    } else {
        json_object_set_new(o, "text", er ? json_stringn(er->text, er->text_len) : json_string(""));
        json_object_set_new(o, "finish_reason", json_string(finish));
        r->n_prompt = er ? er->n_prompt : 0;
        r->n_completion = er ? er->n_tokens : 0;
        r->n_cached = er ? er->n_cached : 0;
        r->compute_ns = er ? er->compute_ns : 0;
    }
    json_object_set_new(u, "prompt_tokens", json_integer(r->n_prompt));
    json_object_set_new(u, "cached_tokens", json_integer(r->n_cached));
    json_object_set_new(u, "completion_tokens", json_integer(r->n_completion));
    json_object_set_new(u, "compute_ms", json_real((double)r->compute_ns * 1e-6));
    json_object_set_new(o, "usage", u);
    u = NULL;
    r->queue_ns = (er && er->t_first_scheduled ? er->t_first_scheduled : now) - r->t_intake;
    double queue = (double)r->queue_ns * 1e-6;
    r->ttft_ms = er && er->t_first_token ? ms_between(r->t_intake, er->t_first_token) : -1;
    double decode = er && er->t_first_token ? ms_between(er->t_first_token, er->t_finish) : 0;
    json_object_set_new(t, "queue_ms", json_real(queue));
    json_object_set_new(t, "ttft_ms", json_real(r->ttft_ms >= 0 ? r->ttft_ms : 0));
    json_object_set_new(t, "decode_ms", json_real(decode));
    json_object_set_new(t, "total_ms", json_real(ms_between(r->t_intake, now)));
    json_object_set_new(t, "wait_ms", json_real(r->wait_ms));
    json_object_set_new(o, "timings", t);
    t = NULL;
    json_object_set_new(o, "class", json_string(w->classes[r->cls].name));
    if (r->capped_from) {
        json_t *d = json_pack("{s:s, s:i, s:i}", "step", "cap", "max_tokens", r->req.max_tokens,
                              "requested_max_tokens", r->capped_from);
        if (!d || json_object_set_new(o, "degraded", d)) goto oom;
    }
    json_object_set_new(o, "model", json_string(r->model ? r->model->name : ""));
    if (r->model) json_object_set_new(o, "model_fingerprint", json_string(r->model->fp_hex));
    json_object_set_new(o, "worker", json_string(w->worker_id));
    json_object_set_new(in, "topic", json_string(rd_kafka_topic_name(r->msg->rkt)));
    json_object_set_new(in, "partition", json_integer(r->msg->partition));
    json_object_set_new(in, "offset", json_integer(r->msg->offset));
    json_object_set_new(o, "input", in);
    in = NULL;
    if (!c0 && er && r->model && r->req.n_logprobs > 0 && er->logprobs) {
        json_t *lp = logprobs_json(r->model->eng, er, r->req.top_logprobs);
        if (!lp || json_object_set_new(o, "logprobs", lp)) goto oom;
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (!s) goto oom_done;
    if (r->req.metadata_json && !(s = splice_member(s, "metadata", r->req.metadata_json)))
        goto oom_done;
    free(r->out);
    r->out = s;
    r->out_len = strlen(s);
    r->is_dlq = 0;
    r->expired = !strcmp(finish, "expired");
    r->finish = NULL;
    for (int i = 0; i < N_FINISH; i++)
        if (!strcmp(finish, FINISH_NAMES[i])) r->finish = FINISH_NAMES[i];
    r->itl_s = er && er->n_tokens > 1 && er->t_first_token
                   ? (double)(er->t_finish - er->t_first_token) * 1e-9 / (er->n_tokens - 1)
                   : -1;
    return 0;
oom:
    json_decref(o);
    json_decref(u);
    json_decref(t);
    json_decref(in);
oom_done:
    wres_dlq(r, REQ_ERR_RESULT_TOO_LARGE, "out of memory building the result");
    return -1;
}
