/* worker/result.c: what the engine thread records of a finished request (its choices, usage
 * and timings) for the result record records_result encodes, the dead-letter marking, and the
 * outbox that hands them to the poll thread. */
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

/* records_logprobs' token texts: the model's pieces. */
static int piece(void *arg, int32_t id, char *buf, size_t cap)
{
    return engine_token_to_piece(arg, id, buf, cap);
}

/* The "logprobs" of er (at most r->req.top_logprobs alternatives each); NULL when r asked for
 * none, or on out of memory (*oom set). */
static json_t *logprobs_of(const wreq_t *r, const engine_result_t *er, int *oom)
{
    *oom = 0;
    if (!r->model || r->req.sampling.n_logprobs <= 0 || !er || !er->logprobs) return NULL;
    json_t *lp = records_logprobs(er->logprobs, er->top_logprobs, er->n_tokens, er->n_logprobs,
                                  r->req.top_logprobs, piece, r->model->eng);
    *oom = !lp;
    return lp;
}

int wres_choice(worker_t *w, wreq_t *r, const engine_result_t *er, const char *finish, int index)
{
    (void)w;
    int oom;
    json_t *lp = logprobs_of(r, er, &oom);
    json_t *c = oom ? NULL : records_choice(index, er->text, er->text_len, finish, lp);
    if (!c) return -1;
    if (json_array_set_new(r->choices, (size_t)index, c)) return -1;
    r->n_completion += er->n_tokens;
    r->compute_ns += er->compute_ns;
    if (index == 0) r->choice0_cached = er->n_cached;
    if (er->n_prompt > r->n_prompt) r->n_prompt = er->n_prompt;
    return 0;
}

/* Builds the result record of r (records_result). er is the engine's result, or NULL for an
 * expired request that was never computed. 0 or -1 (out of memory: r becomes a DLQ record). */
int wres_result(worker_t *w, wreq_t *r, const engine_result_t *er, const char *finish)
{
    int64_t now = mono_ns();
    const json_t *c0 = r->choices ? json_array_get(r->choices, 0) : NULL;
    int with_choices = c0 && json_is_object(c0);
    if (with_choices) {
        /* n > 1: usage sums the choices' tokens and compute (wres_choice) */
        finish = json_string_value(json_object_get(c0, "finish_reason"));
        r->n_cached = r->choice0_cached;
    } else {
        r->n_prompt = er ? er->n_prompt : 0;
        r->n_completion = er ? er->n_tokens : 0;
        r->n_cached = er ? er->n_cached : 0;
        r->compute_ns = er ? er->compute_ns : 0;
    }
    r->queue_ns = (er && er->t_first_scheduled ? er->t_first_scheduled : now) - r->t_intake;
    r->ttft_ms = er && er->t_first_token ? ms_between(r->t_intake, er->t_first_token) : -1;
    int oom = 0;
    json_t *lp = with_choices ? NULL : logprobs_of(r, er, &oom);
    rec_result_t in = {
        .id = r->req.id,
        .correlation_id = r->req.correlation_id,
        .tenant = r->req.tenant,
        .choices = with_choices ? r->choices : NULL,
        .text = er ? er->text : "",
        .text_len = er ? er->text_len : 0,
        .finish = finish,
        .logprobs = lp,
        .prompt_tokens = r->n_prompt,
        .cached_tokens = r->n_cached,
        .completion_tokens = r->n_completion,
        .compute_ms = (double)r->compute_ns * 1e-6,
        .queue_ms = (double)r->queue_ns * 1e-6,
        .ttft_ms = r->ttft_ms >= 0 ? r->ttft_ms : 0,
        .decode_ms = er && er->t_first_token ? ms_between(er->t_first_token, er->t_finish) : 0,
        .total_ms = ms_between(r->t_intake, now),
        .wait_ms = r->wait_ms,
        .class_name = w->classes[r->cls].name,
        .capped_from = r->capped_from,
        .max_tokens = r->req.max_tokens,
        .model = r->model ? r->model->name : "",
        .model_fingerprint = r->model ? r->model->fp_hex : NULL,
        .worker = w->worker_id,
        .input = {rd_kafka_topic_name(r->msg->rkt), r->msg->partition, r->msg->offset},
        .metadata = r->req.metadata_json,
    };
    char *s = oom ? NULL : records_result(&in);
    json_decref(lp);
    if (!s) {
        wres_dlq(r, REQ_ERR_RESULT_TOO_LARGE, "out of memory building the result");
        return -1;
    }
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
}
