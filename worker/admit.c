/* worker/admit.c: intake on the poll thread: a polled message becomes a request (parse, headers,
 * claims, chat rendering, tokenisation, limits, model and class) or an immediate dead letter. */
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

/* records_admit's header lookup: the last Kafka header of that name on the message arg. */
static int msg_header(void *arg, const char *name, const void **value, size_t *len)
{
    rd_kafka_headers_t *h = NULL;
    return rd_kafka_message_headers(arg, &h) == RD_KAFKA_RESP_ERR_NO_ERROR && h &&
           rd_kafka_header_get_last(h, name, value, len) == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* records_admit's model lookup: a current version, with a reference (wmodel_acquire). */
static void *find_model(void *arg, const char *name) { return wmodel_acquire(arg, name); }

/* When r has the header (value "TOPIC[PARTITION]@OFFSET"), its TOPIC replaces topic. */
static void origin_topic(const wreq_t *r, const char *header, char *topic, size_t cap)
{
    rd_kafka_headers_t *h = NULL;
    const void *v;
    size_t n;
    if (rd_kafka_message_headers(r->msg, &h) || !h ||
        rd_kafka_header_get_last(h, header, &v, &n) || !v)
        return;
    const char *b = memchr(v, '[', n);
    if (b && b > (const char *)v)
        snprintf(topic, cap, "%.*s", (int)(b - (const char *)v), (const char *)v);
}

/* The topic whose claims entry applies to r: the one it was consumed from, or for a message
 * on the deferral topic the one a worker shed it from (its __spillway.deferred.from header;
 * the deferral topic itself without that header), or for one on forward.topic the one a worker
 * forwarded it from (its __spillway.hop.from header), then as for the deferral topic. */
static void claims_topic(worker_t *w, const wreq_t *r, char *topic, size_t cap)
{
    snprintf(topic, cap, "%s", rd_kafka_topic_name(r->msg->rkt));
    if (*w->cfg.forward_topic && !strcmp(topic, w->cfg.forward_topic))
        origin_topic(r, "__spillway.hop.from", topic, cap);
    if (*w->cfg.deferral_topic && !strcmp(topic, w->cfg.deferral_topic))
        origin_topic(r, "__spillway.deferred.from", topic, cap);
}

/* The claims key on r (admitted: records_admit, its class r->cls found): a tenant or class its
 * topic may not claim is a dead letter; one it does not name gets the topic's default. 0, or -1
 * with *code and err set (a dead letter), or -2 on out of memory. Poll thread. */
static int check_claims(worker_t *w, wreq_t *r, const char **code, char *err, size_t errlen)
{
    if (!w->claims) return 0;
    char topic[256];
    claims_topic(w, r, topic, sizeof topic);
    const char *def_tenant;
    int def_class;
    if (claims_check(w->claims, topic, r->req.tenant, r->req.class_name, &def_tenant, &def_class,
                     code, err, errlen))
        return -1;
    if (!r->req.class_name) r->cls = def_class;
    if (!r->req.tenant && def_tenant && !(r->req.tenant = strdup(def_tenant))) return -2;
    return 0;
}

/* Encodes text into r->toks. 0, or -1 on out of memory. */
static int tokenize(wreq_t *r, const char *text, size_t len, int parse_special)
{
    /* one pass in the common case: no tokenizer makes more than a token per byte, plus BOS/EOS */
    int cap = len < (size_t)(1 << 30) ? (int)len + 4 : 1 << 30;
    for (int pass = 0; pass < 2; pass++) {
        int32_t *t = realloc(r->toks, sizeof *t * (size_t)cap);
        if (!t) return -1;
        r->toks = t;
        int n = engine_tokenize(r->model->eng, text, len, 1, parse_special, t, cap);
        if (n < 0) return -1;
        if (n <= cap) {
            r->n_toks = n;
            return 0;
        }
        cap = n;
    }
    return -1;
}

/* Renders r's chat messages (template: the request's chat_template, else the chat.template key,
 * else the model's) and tokenises the prompt; checks the token limit. 0, or -1 with *code and
 * err set (a dead letter), or -2 on out of memory. Poll thread. */
static int prepare_prompt(worker_t *w, wreq_t *r, const char **code, char *err, size_t errlen)
{
    const request_t *q = &r->req;
    if (q->messages) {
        engine_chat_msg_t *msgs = malloc(sizeof *msgs * (size_t)q->n_messages);
        if (!msgs) return -2;
        for (int i = 0; i < q->n_messages; i++) {
            msgs[i].role = q->messages[i].role;
            msgs[i].content = q->messages[i].content;
        }
        const char *name = q->template_name ? q->template_name
                           : *w->cfg.chat_template ? w->cfg.chat_template : NULL;
        /* only the template's own markers (<|im_start|>, ...) become special tokens; roles
         * outside the template's list are refused, contents are always plain text */
        int32_t *ids;
        int n_ids;
        size_t len;
        engine_chat_opts_t opts = ENGINE_CHAT_OPTS_DEFAULT;
        opts.enable_thinking = q->enable_thinking;
        int crc = engine_chat_tokenize_opts(r->model->eng, name, msgs, q->n_messages, 1, &opts,
                                            &ids, &n_ids, &len, err, errlen);
        free(msgs);
        if (crc == ENGINE_CHAT_ENOMEM) return -2;
        if (crc != 0) {
            *code = crc == ENGINE_CHAT_EROLE ? REQ_ERR_BAD_ROLE : REQ_ERR_TEMPLATE;
            if (!name && crc != ENGINE_CHAT_EROLE) {
                /* the model's own template failed: say which keys choose another */
                char *why = strdup(err);
                if (!why) return -2;
                snprintf(err, errlen, "set the worker's chat.template key or the request's "
                         "chat_template: %s", why);
                free(why);
            }
            return -1;
        }
        rec_err_t e = records_admit_prompt(len, (size_t)w->cfg.max_prompt_bytes, 0, 0, err, errlen);
        if (e != REC_OK) {
            free(ids);
            *code = rec_err_reason(e);
            return -1;
        }
        free(r->toks);
        r->toks = ids; /* owned by r from here */
        r->n_toks = n_ids;
        /* a template that writes the BOS text itself, plus the tokenizer's BOS: keep one */
        int32_t bos = r->model->bos;
        if (r->n_toks >= 2 && bos >= 0 && r->toks[0] == bos && r->toks[1] == bos) {
            memmove(r->toks, r->toks + 1, sizeof *r->toks * (size_t)(r->n_toks - 1));
            r->n_toks--;
        }
    } else if (q->prompt) {
        if (tokenize(r, q->prompt, q->prompt_len, 0)) return -2;
    }
    int n = r->toks ? r->n_toks : q->n_input_ids;
    rec_err_t e = records_admit_prompt(0, 0, n, w->cfg.max_prompt_tokens, err, errlen);
    if (e != REC_OK) {
        *code = rec_err_reason(e);
        return -1;
    }
    r->cost = (long)n + (long)q->max_tokens * q->n;
    return 0;
}

void wadmit_inbox_push(worker_t *w, wreq_t *r)
{
    r->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->inbox_tail) w->inbox_tail->next = r;
    else w->inbox = r;
    w->inbox_tail = r;
    atomic_fetch_add(&w->st.inbox_n, 1);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void wadmit_intake(worker_t *w, rd_kafka_message_t *m)
{
    if (m->err) {
        if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            wlog(w, m->err == RD_KAFKA_RESP_ERR__FATAL ? SW_LOG_ERROR : SW_LOG_WARN, "consumer: %s",
                 rd_kafka_message_errstr(m));
        if (m->err == RD_KAFKA_RESP_ERR__FATAL) wfatal_set(w, "consumer: %s", rd_kafka_message_errstr(m));
        rd_kafka_message_destroy(m);
        return;
    }
    int64_t t0 = mono_ns();
    wreq_t *r = calloc(1, sizeof *r);
    if (!r) {
        rd_kafka_message_destroy(m);
        wfatal_set(w, "out of memory");
        return;
    }
    r->msg = m; /* owned by r from here */
    r->active_ix = -1;
    r->ttft_ms = -1;
    r->t_intake = t0;
    int rc = consumer_track(w->cons, m, r, &r->ticket);
    if (rc) {
        if (rc < 0) wfatal_set(w, "out of memory");
        wreq_free(w, r);
        return;
    }
    wfwd_intake(w, r);
    int64_t zero = 0;
    atomic_compare_exchange_strong(&w->st.t_first, &zero, t0);
    r->bytes = m->len;
    w->inflight_bytes += (long)r->bytes;
    atomic_fetch_add(&w->st.consumed, 1);
    const char *code = NULL;
    char err[256];
    int64_t ts = rd_kafka_message_timestamp(m, NULL);
    int64_t t1 = mono_ns();
    rc = request_parse(m->payload, m->len, ts > 0 ? ts : 0, &w->limits, &r->req, &code, err,
                       sizeof err);
    t1 = add_since(&w->st.ns_parse, t1);
    if (rc) {
        wres_dlq(r, code ? code : rec_err_reason(REC_NOT_JSON), err);
        wout_send(w, r);
        goto out;
    }
    r->parsed = 1;
    /* the admission step: headers, reply_to, class and model (records_admit) */
    rec_rules_t rules = {&w->limits, (const char *const *)w->reply_allow, w->n_reply_allow,
                         w->class_names, w->n_classes, w->default_model, find_model, w};
    int cls;
    void *model;
    rec_err_t e = records_admit(&r->req, &rules, msg_header, m, &cls, &model, err, sizeof err);
    if (e == REC_NO_MEMORY) {
        /* r goes to the inbox, which is not served once fatal is set, and worker_run frees it */
        wfatal_set(w, "out of memory reading headers");
        goto enqueue;
    }
    r->wait_ms = ts > 0 && wall_ms() > ts ? (double)(wall_ms() - ts) : 0;
    r->cls = cls >= 0 ? cls : w->default_class;
    if (e != REC_OK) {
        wres_dlq(r, rec_err_reason(e), err);
        wout_send(w, r);
        goto out;
    }
    r->model = model; /* a reference, released by wmodel_release */
    rc = check_claims(w, r, &code, err, sizeof err);
    if (rc == -2) {
        wfatal_set(w, "out of memory checking claims"); /* as for records_admit's above */
        goto enqueue;
    }
    if (rc) {
        wmodel_release(w, r); /* a dead letter holds no model */
        wres_dlq(r, code, err);
        wout_send(w, r);
        goto out;
    }
    const worker_class_t *cl = &w->classes[r->cls];
    int from_deferral = *w->cfg.deferral_topic && !strcmp(rd_kafka_topic_name(m->rkt), w->cfg.deferral_topic);
    if (!from_deferral) {
        int64_t now_ms = mono_ms();
        w->wait_ewma_ms = w->wait_at_ms ? 0.9 * w->wait_ewma_ms + 0.1 * r->wait_ms : r->wait_ms;
        w->wait_at_ms = now_ms;
        if (r->cls == w->top_class) w->top_seen_ms = now_ms;
    }
    if (wreq_deadline_passed(r) || (cl->max_queue_ms > 0 && r->wait_ms > cl->max_queue_ms)) {
        if (!wreq_deadline_passed(r)) atomic_fetch_add(&w->st.class_expired, 1);
        wstream_finish(w, r, "", 0, 0, "expired");
        wres_result(w, r, NULL, "expired");
        wout_send(w, r);
        goto out;
    }
    if (r->cls != w->top_class && w->ov_level > 0) {
        if (r->cls == w->low_class && *w->cfg.deferral_topic && !from_deferral) {
            r->is_shed = 1; /* step 1: to the deferral topic, unprocessed */
            wout_send(w, r);
            goto out;
        }
        if (w->ov_level >= 3 && !from_deferral) { /* deferred once: served, never refused */
            wstream_finish(w, r, "", 0, 0, "overloaded");
            wres_result(w, r, NULL, "overloaded");
            wout_send(w, r);
            goto out;
        }
        if (w->ov_level >= 2 && r->req.max_tokens > w->cfg.overload_cap_tokens) {
            r->capped_from = r->req.max_tokens;
            r->req.max_tokens = w->cfg.overload_cap_tokens;
        }
    }
    rc = prepare_prompt(w, r, &code, err, sizeof err);
    add_since(&w->st.ns_tokenize, t1);
    if (rc == -2) {
        /* Not the message's fault: stop rather than dead-letter it (a restart retries it).
         * r still goes to the inbox, which the engine thread no longer takes from once fatal
         * is set; worker_run frees it after the consumer dropped it. */
        wfatal_set(w, "out of memory preparing a prompt");
    } else if (rc) {
        wres_dlq(r, code, err);
        wout_send(w, r);
        goto out;
    } else if (wfwd_decide(w, r)) { /* to another worker of the group (worker/forward.c) */
        wout_send(w, r);
        goto out;
    }
enqueue:
    w->inflight_tokens += r->cost;
    atomic_fetch_add(&w->st.cost_sum, (uint64_t)r->cost);
    atomic_fetch_add(&w->st.cost_n, 1);
    if (wpeer_offer(w, r)) goto out; /* to the inbox after its prefix fetch (worker/peer.c) */
    wadmit_inbox_push(w, r);
out:
    add_since(&w->st.ns_intake, t0);
}

/* Overload pressure, percent: the largest of (a) the top class's recent time to first token as
 * its producers see it (wait in Kafka + time to first token, averaged; counts for
 * overload.cooldown_ms after its last result) and (b) how long messages of any class wait in
 * Kafka before this worker takes them (averaged over the input topics other than the deferral
 * topic; counts for a second after the last one: a backlog ahead of the top class's next
 * message), both as percent of the top class's ttft_ms, and (c) the fullest in-flight limit
 * (messages, tokens) in percent: intake pauses at 100%, which would hold the top class's next
 * message in Kafka. 0 while no top-class message arrived within overload.window_ms: without
 * such traffic a backlog is just bulk work draining at full speed. */
