/* worker/output.c: the poll thread's output side: sending results and dead letters, retries,
 * holding outputs behind an earlier message of their partition (exactly-once), delivery reports,
 * refused records (cut dead letters, bounded retries of permanent errors), transactions, usage
 * records, throughput and periodic commits. Poll thread unless a function says otherwise. */
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

/* consumer hook after each offset commit (poll thread): its latency into the histogram. */
void wout_hook_committed(void *arg, int ok, int64_t ns)
{
    worker_t *w = arg;
    if (ok) metrics_hist_observe(&w->st.h_commit, (double)ns * 1e-9);
}

/* The consumer dropped r (revocation, rewind, close): cancel its work. Poll thread. */
void wout_hook_drop(void *arg, void *user)
{
    worker_t *w = arg;
    wreq_t *r = user;
    /* read before r may be freed by another thread */
    w->inflight_bytes -= (long)r->bytes;
    w->inflight_tokens -= r->cost;
    atomic_fetch_add(&w->st.dropped, 1);
    atomic_store(&r->cancelled, 1);
}

/* Counts a dead letter under its reason (poll thread: the only writer of the code table). */
static void count_dlq_reason(worker_t *w, const char *code)
{
    for (int i = 0; i < 32; i++) {
        const char *c = atomic_load(&w->st.dlq_code[i]);
        if (!c) atomic_store(&w->st.dlq_code[i], c = code);
        if (c == code || !strcmp(c, code)) {
            atomic_fetch_add(&w->st.dlq_n[i], 1);
            return;
        }
    }
}

static void count_output(worker_t *w, const wreq_t *r)
{
    if (r->lost) return; /* counted as out_lost by output_refused */
    if (r->truncated) atomic_fetch_add(&w->st.dlq_truncated, 1);
    if (r->is_shed) {
        atomic_fetch_add(&w->st.ov_shed, 1);
        return;
    }
    if (r->fwd_reason && !r->is_dlq) {
        wfwd_done(w, r);
        return;
    }
    if (r->is_dlq) {
        atomic_fetch_add(&w->st.dlq, 1);
        count_dlq_reason(w, r->dlq_code ? r->dlq_code : "unknown");
        return;
    }
    for (int i = 0; i < N_FINISH; i++)
        if (r->finish == FINISH_NAMES[i]) atomic_fetch_add(&w->st.finish_n[i], 1);
    metrics_hist_observe(&w->st.h_e2e, (double)(mono_ns() - r->t_intake) * 1e-9);
    metrics_hist_observe(&w->st.h_queue, (double)r->queue_ns * 1e-9);
    if (r->ttft_ms >= 0) metrics_hist_observe(&w->st.h_ttft, r->ttft_ms * 1e-3);
    if (r->itl_s >= 0) metrics_hist_observe(&w->st.h_itl, r->itl_s);
    atomic_fetch_add(&w->st.results, 1);
    atomic_fetch_add_explicit(&w->st.ns_queue_sum, (uint64_t)r->queue_ns, memory_order_relaxed);
    if (r->expired) atomic_fetch_add(&w->st.expired, 1);
    atomic_fetch_add(&w->st.prompt_tokens, (uint64_t)r->n_prompt);
    atomic_fetch_add(&w->st.completion_tokens, (uint64_t)r->n_completion);
    atomic_fetch_add(&w->st.cached_tokens, (uint64_t)r->n_cached);
    ewma_add(&w->st.tok_per_msg_bits, (double)(r->n_prompt + r->n_completion),
             w->cfg.autoscale_avg_results);
    usage_add(w->usage, r->parsed ? r->req.tenant : NULL, r->parsed ? w->classes[r->cls].name : NULL,
              (uint64_t)r->n_prompt, (uint64_t)r->n_cached, (uint64_t)r->n_completion,
              (uint64_t)r->compute_ns);
    if (r->ttft_ms >= 0) {
        atomic_fetch_add(&w->st.ttft_n, 1);
        atomic_fetch_add(&w->st.ttft_us_sum, (uint64_t)(r->ttft_ms * 1e3));
    }
    if (r->finish && !strcmp(r->finish, "overloaded")) atomic_fetch_add(&w->st.ov_refused, 1);
    if (r->capped_from) atomic_fetch_add(&w->st.ov_capped, 1);
    if (r->cls == w->top_class && r->ttft_ms >= 0) { /* the overload steps' latency signal */
        double s = r->wait_ms + r->ttft_ms;
        w->top_ttft_ewma_ms = w->top_ttft_at_ms ? 0.8 * w->top_ttft_ewma_ms + 0.2 * s : s;
        w->top_ttft_at_ms = mono_ms();
    }
}

/* r's output is durable (or in the open transaction): ack its offset and free it. */
static void output_done(worker_t *w, wreq_t *r)
{
    if (w->cons && consumer_ack(w->cons, &r->ticket) == 0) {
        w->inflight_bytes -= (long)r->bytes;
        w->inflight_tokens -= r->cost;
        count_output(w, r);
        atomic_store(&w->st.t_last, mono_ns());
    }
    wreq_free(w, r);
}

static void retry_later(worker_t *w, wreq_t *r, int delay_ms)
{
    r->retry_at_ms = mono_ms() + delay_ms;
    r->next = w->retry;
    w->retry = r;
}

/* Exactly-once: keeps r until every earlier message of its partition is in a transaction. */
void wout_hold(worker_t *w, wreq_t *r)
{
    wreq_t **pp = &w->held;
    while (*pp && ((*pp)->ticket.gen < r->ticket.gen ||
                   ((*pp)->ticket.gen == r->ticket.gen && (*pp)->ticket.offset < r->ticket.offset)))
        pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
}

/* Headers of a shed message: the original ones (a copy), plus where it came from. NULL on out of
 * memory; the caller owns the result (producer_send takes it). */
static rd_kafka_headers_t *deferral_headers(worker_t *w, const rd_kafka_message_t *m)
{
    rd_kafka_headers_t *orig = NULL, *h;
    if (rd_kafka_message_headers(m, &orig) == RD_KAFKA_RESP_ERR_NO_ERROR && orig)
        h = rd_kafka_headers_copy(orig);
    else
        h = rd_kafka_headers_new(2);
    if (!h) return NULL;
    char from[320], lvl[8];
    snprintf(from, sizeof from, "%s[%d]@%" PRId64, rd_kafka_topic_name(m->rkt), (int)m->partition,
             (int64_t)m->offset);
    snprintf(lvl, sizeof lvl, "%d", w->ov_level);
    if (rd_kafka_header_add(h, "__spillway.deferred.from", -1, from, -1) ||
        rd_kafka_header_add(h, "__spillway.deferred.worker", -1, w->worker_id, -1) ||
        rd_kafka_header_add(h, "__spillway.deferred.step", -1, lvl, -1)) {
        rd_kafka_headers_destroy(h);
        return NULL;
    }
    return h;
}

static void fate_get(wfate_t *f, const wreq_t *r)
{
    f->is_dlq = r->is_dlq;
    f->is_shed = r->is_shed;
    f->truncated = r->truncated;
    f->attempts = r->attempts;
    f->lost = r->lost;
    f->dlq_code = r->dlq_code;
    memcpy(f->dlq_msg, r->dlq_msg, sizeof f->dlq_msg);
}

static void fate_put(wreq_t *r, const wfate_t *f)
{
    r->is_dlq = f->is_dlq;
    r->is_shed = f->is_shed;
    r->truncated = f->truncated;
    r->attempts = f->attempts;
    r->lost = f->lost;
    r->dlq_code = f->dlq_code;
    memcpy(r->dlq_msg, f->dlq_msg, sizeof r->dlq_msg);
}

enum { REFUSED_RETRY, REFUSED_RESEND, REFUSED_LOST };

/* Decides what becomes of the output (form f, changed in place) of message topic[part]@off whose
 * produce failed with an error of kind (PRODUCER_ERR_*, err its text). REFUSED_RETRY: send it
 * again as it is, after a pause (a retriable error, or a permanent one within
 * output.max_retries). REFUSED_RESEND: send f's new form now: a dead letter instead of a result
 * or deferral (result_too_large, message_too_large, delivery_failed), or a dead letter cut to
 * dlq.truncate_bytes instead of a whole one. REFUSED_LOST: nothing can be delivered for the
 * message: its offset is acknowledged without an output. Logs and counts. Poll thread (or
 * wherever the producer serves delivery reports). */
static int output_refused(worker_t *w, wfate_t *f, int kind, const char *err, const char *topic,
                          int32_t part, int64_t off)
{
    if (kind == PRODUCER_ERR_RETRIABLE) return REFUSED_RETRY;
    if (kind == PRODUCER_ERR_PERMANENT) {
        atomic_fetch_add(&w->st.out_permanent, 1);
        if (f->attempts++ < w->cfg.output_max_retries) {
            wlog(w, SW_LOG_WARN,
                 "%s (offset %s[%d]@%" PRId64 "): a permanent error; retry %d of %d", err,
                 topic, (int)part, off, f->attempts, w->cfg.output_max_retries);
            return REFUSED_RETRY;
        }
    }
    if (!f->is_dlq) {
        const char *code = kind == PRODUCER_ERR_PERMANENT ? REQ_ERR_DELIVERY_FAILED
                           : f->is_shed                   ? REQ_ERR_MESSAGE_BYTES
                                                          : REQ_ERR_RESULT_TOO_LARGE;
        wlog(w, SW_LOG_WARN, "%s (offset %s[%d]@%" PRId64 "): dead-lettering the message (%s)",
             err, topic, (int)part, off, code);
        f->is_dlq = 1;
        f->is_shed = 0;
        f->dlq_code = code;
        snprintf(f->dlq_msg, sizeof f->dlq_msg, "%s", err);
        f->attempts = 0;
        return REFUSED_RESEND;
    }
    if (kind == PRODUCER_ERR_SIZE && !f->truncated) {
        wlog(w, SW_LOG_WARN,
             "%s (offset %s[%d]@%" PRId64 "): sending its dead letter with the value cut to "
             "%ld bytes", err, topic, (int)part, off, w->cfg.dlq_truncate_bytes);
        f->truncated = 1;
        f->attempts = 0;
        return REFUSED_RESEND;
    }
    wlog(w, SW_LOG_ERROR,
         "%s (offset %s[%d]@%" PRId64 "): its dead letter cannot be delivered either; the "
         "message is LOST (acknowledged without an output, counted in "
         "spillway:messages_lost_total)", err, topic, (int)part, off);
    atomic_fetch_add(&w->st.out_lost, 1);
    f->lost = 1;
    return REFUSED_LOST;
}

#define REFUSED_MAX 64

/* Exactly-once: unlinks and returns the entry of w->refused for message m, or NULL. */
static wsent_t *refused_take(worker_t *w, const char *topic, int32_t part, int64_t off)
{
    for (wsent_t **pp = &w->refused; *pp; pp = &(*pp)->next) {
        wsent_t *e = *pp;
        if (e->partition == part && e->offset == off && !strcmp(e->topic, topic)) {
            *pp = e->next;
            e->next = NULL;
            return e;
        }
    }
    return NULL;
}

/* Exactly-once: e (taken) becomes the entry of its message, replacing an older one; the oldest
 * entries past REFUSED_MAX are dropped. */
static void refused_put(worker_t *w, wsent_t *e)
{
    free(refused_take(w, e->topic, e->partition, e->offset));
    e->next = w->refused;
    w->refused = e;
    int n = 0;
    for (wsent_t **pp = &w->refused; *pp; pp = &(*pp)->next)
        if (++n == REFUSED_MAX) {
            for (wsent_t *x = (*pp)->next, *nx; x; x = nx) {
                nx = x->next;
                free(x);
            }
            (*pp)->next = NULL;
            break;
        }
}

/* Exactly-once: a new opaque for r's output record in its present form; NULL on out of memory. */
static wsent_t *sent_new(const wreq_t *r)
{
    const char *topic = rd_kafka_topic_name(r->msg->rkt);
    size_t n = strlen(topic) + 1;
    wsent_t *e = malloc(sizeof *e + n);
    if (!e) return NULL;
    e->next = NULL;
    e->partition = r->msg->partition;
    e->offset = r->msg->offset;
    fate_get(&e->fate, r);
    memcpy(e->topic, topic, n);
    return e;
}

/* Produces r's output. At-least-once: librdkafka holds r until the delivery report.
 * Exactly-once: inside the open transaction, in offset order per partition (held until every
 * earlier message's output is in); r is done at once. The order matters because the offsets a
 * transaction commits (the lowest unacknowledged message of each partition) must cover exactly
 * the outputs committed so far: an output committed above them would be computed and committed
 * again by whoever resumes from those offsets after a crash or a revocation. */
void wout_send(worker_t *w, wreq_t *r)
{
    char err[256];
    int eos = w->cfg.delivery == WORKER_EOS;
    if (atomic_load(&r->cancelled)) {
        wreq_free(w, r);
        return;
    }
    if (eos && !consumer_is_next(w->cons, &r->ticket)) {
        wout_hold(w, r);
        return;
    }
    if (eos && !w->txn_open) {
        if (producer_txn_begin(w->prod, err, sizeof err)) {
            char fe[512];
            /* a fence recovered from rewinds: r's ticket is then stale and r is dropped */
            if (producer_fatal(w->prod, fe, sizeof fe))
                wout_producer_fatal(w, fe);
            else
                wfatal_set(w, "%s", err);
            retry_later(w, r, 100);
            return;
        }
        w->txn_open = 1;
        w->txn_start_ms = mono_ms();
    }
    const rd_kafka_message_t *m = r->msg;
    const char *src = rd_kafka_topic_name(m->rkt);
    if (eos) { /* refused in an aborted transaction: sent in its next form (the entry stays
                  until a record of the message is delivered: this transaction may abort too) */
        for (const wsent_t *e = w->refused; e; e = e->next)
            if (e->partition == m->partition && e->offset == m->offset && !strcmp(e->topic, src)) {
                fate_put(r, &e->fate);
                break;
            }
        if (r->lost) { /* nothing to send: the transaction commits its offset */
            output_done(w, r);
            return;
        }
    }
    const void *key = m->key;
    size_t klen = m->key_len;
    if (!key && r->parsed) {
        key = r->req.id;
        klen = strlen(r->req.id);
    }
    /* a reply: to the request's reply_to (checked against reply.topics at intake), keyed by its
     * correlation id, else its id */
    const char *topic = w->cfg.output_topic;
    const char *corr = r->parsed ? r->req.correlation_id : NULL;
    if (r->parsed && r->req.reply_to) {
        topic = r->req.reply_to;
        key = corr ? corr : r->req.id;
        klen = strlen(key);
    }
    for (;;) {
        int rc;
        /* at-least-once: r is the opaque; exactly-once: a wsent_t (ours again when not sent) */
        void *op = eos ? (void *)sent_new(r) : r;
        if (!op) {
            snprintf(err, sizeof err, "out of memory");
            rc = -1;
        } else if (r->is_shed) {
            rd_kafka_headers_t *h = deferral_headers(w, m);
            rc = h ? producer_send(w->prod, w->cfg.deferral_topic, m->key, m->key_len, m->payload,
                                   m->len, h, op, err, sizeof err)
                   : (snprintf(err, sizeof err, "out of memory"), -1);
        } else if (r->is_dlq) {
            size_t vlen = m->len;
            if (r->truncated && vlen > (size_t)w->cfg.dlq_truncate_bytes)
                vlen = (size_t)w->cfg.dlq_truncate_bytes;
            rec_dlq_t in = {r->dlq_code, r->dlq_msg,
                            {rd_kafka_topic_name(m->rkt), m->partition, m->offset},
                            w->worker_id, wall_ms(), r->truncated, m->len};
            rd_kafka_headers_t *h = records_dlq_headers(&in);
            rc = h || !r->truncated
                     ? producer_send(w->prod, w->cfg.dlq_topic, m->key, m->key_len, m->payload,
                                     vlen, h, op, err, sizeof err)
                     : (snprintf(err, sizeof err, "out of memory"), -1);
        } else if (r->fwd_reason) {
            rc = wfwd_send(w, r, op, err, sizeof err); /* the original, to forward.topic */
        } else {
            rd_kafka_headers_t *h = NULL;
            if (corr) { /* NULL on out of memory: the correlation id is in the JSON too */
                h = rd_kafka_headers_new(1);
                if (h && rd_kafka_header_add(h, WORKER_H_CORRELATION_ID, -1, corr, -1)) {
                    rd_kafka_headers_destroy(h);
                    h = NULL;
                }
            }
            rc = producer_send(w->prod, topic, key, klen, r->out, r->out_len, h, op, err,
                               sizeof err);
        }
        if (rc == 0) break;
        if (eos) free(op);
        int kind = rc == -2 ? PRODUCER_ERR_SIZE
                   : rc == -3 ? PRODUCER_ERR_PERMANENT : PRODUCER_ERR_RETRIABLE;
        wfate_t f;
        fate_get(&f, r);
        int next = output_refused(w, &f, kind, err, src, m->partition, m->offset);
        fate_put(r, &f);
        if (next == REFUSED_RESEND) continue;
        if (next == REFUSED_LOST) {
            output_done(w, r);
            return;
        }
        if (kind == PRODUCER_ERR_RETRIABLE)
            wlog(w, SW_LOG_WARN, "%s (offset %s[%d]@%" PRId64 "), retrying", err, src,
                 (int)m->partition, (int64_t)m->offset);
        atomic_fetch_add(&w->st.produce_retries, 1);
        retry_later(w, r, 200);
        return;
    }
    if (eos) output_done(w, r);
}

/* Delivery report (poll thread, inside producer_poll). */
void wout_on_delivery(void *arg, void *opaque, rd_kafka_resp_err_t err)
{
    worker_t *w = arg;
    wreq_t *r = opaque;
    if (w->cfg.delivery == WORKER_EOS) {
        wsent_t *e = opaque;
        if (!e) return;
        if (!err) { /* delivered: an earlier refusal of its message is past */
            free(refused_take(w, e->topic, e->partition, e->offset));
            free(e);
            return;
        }
        wlog(w, SW_LOG_WARN, "transactional record not delivered: %s", rd_kafka_err2str(err));
        int kind = producer_err_kind(err);
        if (kind == PRODUCER_ERR_RETRIABLE) { /* produced again after the abort and rewind */
            free(e);
            return;
        }
        output_refused(w, &e->fate, kind, rd_kafka_err2str(err), e->topic, e->partition,
                       e->offset);
        refused_put(w, e);
        return;
    }
    if (atomic_load(&r->cancelled) || !w->cons) {
        if (err)
            wlog(w, SW_LOG_INFO,
                 "record for %s[%d]@%" PRId64 " not delivered: %s; its partition was "
                 "revoked, its new owner computes it again", rd_kafka_topic_name(r->msg->rkt),
                 (int)r->msg->partition, (int64_t)r->msg->offset, rd_kafka_err2str(err));
        wreq_free(w, r);
        return;
    }
    int kind = producer_err_kind(err);
    if (err && kind != PRODUCER_ERR_RETRIABLE) {
        wfate_t f;
        fate_get(&f, r);
        int next = output_refused(w, &f, kind, rd_kafka_err2str(err),
                                  rd_kafka_topic_name(r->msg->rkt), r->msg->partition,
                                  r->msg->offset);
        fate_put(r, &f);
        if (next == REFUSED_LOST) {
            output_done(w, r);
            return;
        }
        if (next == REFUSED_RESEND) { /* sent from drain_outbox, outside this report */
            retry_later(w, r, 0);
            return;
        }
    }
    if (err) {
        wlog(w, SW_LOG_WARN, "record for %s[%d]@%" PRId64 " not delivered: %s; producing it again",
             rd_kafka_topic_name(r->msg->rkt), (int)r->msg->partition, (int64_t)r->msg->offset,
             rd_kafka_err2str(err));
        atomic_fetch_add(&w->st.produce_retries, 1);
        retry_later(w, r, 100);
        return;
    }
    output_done(w, r);
}

/* Delivery report of the side producer (poll thread, inside producer_poll, or wherever
 * producer_free runs). */
void wout_on_aux_delivery(void *arg, void *opaque, rd_kafka_resp_err_t err)
{
    worker_t *w = arg;
    if (opaque == AUX_CHUNK) atomic_fetch_add(err ? &w->st.chunks_failed : &w->st.chunks_ok, 1);
    if (err)
        wlog(w, opaque == AUX_USAGE ? SW_LOG_WARN : SW_LOG_DEBUG, "%s record not delivered: %s",
             (const char *)opaque, rd_kafka_err2str(err));
}

void wout_drain(worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    wreq_t *list = w->outbox;
    w->outbox = w->outbox_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    while (list) {
        wreq_t *r = list;
        list = r->next;
        r->next = NULL;
        wout_send(w, r);
    }
    if (w->retry) {
        int64_t now = mono_ms();
        wreq_t *due = NULL, **pp = &w->retry;
        while (*pp) {
            wreq_t *r = *pp;
            if (r->retry_at_ms <= now) {
                *pp = r->next;
                r->next = due;
                due = r;
            } else {
                pp = &r->next;
            }
        }
        while (due) {
            wreq_t *r = due;
            due = r->next;
            r->next = NULL;
            wout_send(w, r);
        }
    }
    /* exactly-once: one pass in (gen, offset) order releases every run that became next */
    wreq_t *held = w->held, **tail = &w->held;
    w->held = NULL;
    while (held) {
        wreq_t *r = held;
        held = r->next;
        r->next = NULL;
        if (!atomic_load(&r->cancelled) && !consumer_is_next(w->cons, &r->ticket)) {
            *tail = r; /* still waiting: keeps its place */
            tail = &r->next;
            continue;
        }
        wout_send(w, r); /* cancelled: freed; next: produced and acked, never held again */
    }
}

/* librdkafka says "fenced by a newer instance" also when the broker aborted a transaction that
 * outlived transaction.timeout.ms (the worker was stopped or stalled): name both causes. */
static const char *fenced_hint(const char *err)
{
    return strstr(err, "enced") ? " (another worker with this transactional.id, or a transaction "
                                  "that outlived transaction.timeout.ms while this one stalled)"
                                : "";
}

static const char UNKNOWN[] = "the transaction's outcome is unknown";

/* Exactly-once, after PRODUCER_TXN_UNCERTAIN or a fence (why: its errstr): the transaction may
 * have committed or not, and the broker may still apply requests of this producer instance, which
 * without KIP-890 (librdkafka #5423) could land in its next transaction. So the next transaction
 * starts on a new instance: producer_renew destroys the old one and initialises a new one with
 * the same transactional.id, whose epoch bump fences the old requests and makes the coordinator
 * finish the transaction (committed or aborted). Only then are the committed offsets settled
 * (the consumer reads them read_committed, i.e. stable), and every assigned partition is rewound
 * to them, as after an abort: what the transaction committed is not served again, what it did
 * not commit is. what: the cause, for the log line. 0, or -1 when fatal. Poll thread. */
static int txn_renew(worker_t *w, const char *why, const char *what)
{
    char err[512];
    w->txn_open = 0;
    wlog(w, SW_LOG_WARN, "exactly-once: %s; %s: replacing producer %s", why, what,
         producer_name(w->prod));
    if (producer_renew(w->prod, err, sizeof err)) {
        wfatal_set(w, "exactly-once: %s%s (stopping; restart the worker)", err, fenced_hint(err));
        return -1;
    }
    atomic_fetch_add(&w->st.producer_restarts, 1);
    wlog(w, SW_LOG_WARN,
         "exactly-once: producer %s initialised (new epoch); rewinding to the committed "
         "offsets", producer_name(w->prod));
    if (consumer_rewind(w->cons, err, sizeof err)) wlog(w, SW_LOG_ERROR, "rewind: %s", err);
    return 0;
}

/* A fence: the coordinator bumped the epoch of this transactional.id, aborting the open
 * transaction, because the transaction outlived transaction.timeout.ms (the worker was cut off
 * from the broker or stalled: the broker's abort is what fenced it) or because another instance
 * initialised with the same transactional.id. The first is recovered from as an unknown outcome
 * is (txn_renew: a new instance, whose init settles the aborted transaction, then the rewind).
 * A second fence within transaction.fence.window.ms of the last recovered one means another
 * live worker shares the id (each init fences the other): the worker stops, so that one of the
 * two goes on. Anything else fatal stops the worker. Poll thread. */
void wout_producer_fatal(worker_t *w, const char *err)
{
    int64_t now = mono_ms();
    if (w->cfg.delivery == WORKER_EOS && w->cfg.txn_fence_window_ms > 0 &&
        producer_fenced(w->prod)) {
        if (w->fence_ms && now - w->fence_ms < w->cfg.txn_fence_window_ms) {
            wfatal_set(w,
                       "exactly-once: %s: fenced again %lld ms after the last fence (within "
                       "transaction.fence.window.ms %d): another worker has this worker's "
                       "transactional.id (worker.id '%s'); give each worker its own (stopping)",
                       err, (long long)(now - w->fence_ms), w->cfg.txn_fence_window_ms,
                       w->worker_id);
            return;
        }
        w->fence_ms = now;
        atomic_fetch_add(&w->st.producer_fences, 1);
        txn_renew(w, err,
                  "fenced (the broker aborted a transaction that outlived transaction.timeout.ms, "
                  "or another worker shares this transactional.id)");
        return;
    }
    wfatal_set(w, "exactly-once: %s%s (stopping; restart the worker)", err, fenced_hint(err));
}

/* Exactly-once: commits the open transaction with the offsets it covers. 0, or -1 when fatal. */
int wout_txn_commit(worker_t *w)
{
    if (!w->txn_open) return 0;
    char err[512];
    rd_kafka_topic_partition_list_t *offs = consumer_txn_offsets(w->cons);
    rd_kafka_consumer_group_metadata_t *md = consumer_group_metadata(w->cons);
    int64_t t0 = mono_ns();
    int rc = producer_txn_commit(w->prod, offs, md, w->cfg.txn_commit_timeout_ms, err,
                                 sizeof err);
    metrics_hist_observe(&w->st.h_commit, (double)(mono_ns() - t0) * 1e-9);
    rd_kafka_consumer_group_metadata_destroy(md);
    w->txn_open = 0;
    if (rc == PRODUCER_TXN_OK) {
        consumer_txn_committed(w->cons, offs);
        atomic_fetch_add(&w->st.txn_commits, 1);
    } else if (rc == PRODUCER_TXN_ABORTED) {
        atomic_fetch_add(&w->st.txn_aborts, 1);
        wlog(w, SW_LOG_WARN, "transaction aborted (%s); rewinding to the committed offsets", err);
        char e2[256];
        if (consumer_rewind(w->cons, e2, sizeof e2)) wlog(w, SW_LOG_ERROR, "rewind: %s", e2);
    } else if (rc == PRODUCER_TXN_UNCERTAIN) {
        if (txn_renew(w, err, UNKNOWN)) rc = PRODUCER_TXN_FATAL;
    } else {
        wout_producer_fatal(w, err);
        if (!wfatal_is(w)) rc = PRODUCER_TXN_ABORTED;
    }
    if (offs) rd_kafka_topic_partition_list_destroy(offs);
    return rc == PRODUCER_TXN_FATAL ? -1 : 0;
}

void wout_hook_before_revoke(void *arg)
{
    worker_t *w = arg;
    if (!w->prod) return;
    if (w->cfg.delivery == WORKER_EOS) {
        wout_drain(w);
        wout_txn_commit(w);
        return;
    }
    /* give outputs already produced a moment to be acknowledged, so they get committed */
    wout_drain(w);
    producer_flush(w->prod, 2000);
}

/* Partitions were lost. Exactly-once: the open transaction may hold outputs of theirs, whose
 * offsets can no longer be committed; committing those outputs alone would make whoever owns the
 * partitions now compute and commit them again. So the transaction is aborted and what is still
 * assigned rewound to the committed offsets (as after an abortable error). */
void wout_hook_lost(void *arg)
{
    worker_t *w = arg;
    if (w->cfg.delivery != WORKER_EOS || !w->prod || !w->txn_open) return;
    char err[256];
    w->txn_open = 0;
    int rc = producer_txn_abort(w->prod, w->cfg.txn_commit_timeout_ms, err, sizeof err);
    if (rc == PRODUCER_TXN_UNCERTAIN) {
        txn_renew(w, err, UNKNOWN);
        return;
    }
    if (rc != PRODUCER_TXN_OK) {
        wout_producer_fatal(w, err);
        return;
    }
    atomic_fetch_add(&w->st.txn_aborts, 1);
    wlog(w, SW_LOG_WARN,
         "partitions lost: transaction aborted; rewinding to the committed offsets");
    if (consumer_rewind(w->cons, err, sizeof err)) wlog(w, SW_LOG_ERROR, "rewind: %s", err);
}

/* Produces the usage records of the period that ends now, when usage.interval.ms has passed
 * (or force). Poll thread. Best effort (side producer): a record that cannot be sent is
 * logged and lost. */
void wout_usage_records(worker_t *w, int force)
{
    if (!*w->cfg.usage_topic || !w->aux) return;
    int64_t now = wall_ms();
    if (!force && now - w->usage_start_ms < w->cfg.usage_interval_ms) return;
    char **recs;
    int n = usage_take_records(w->usage, w->worker_id, w->usage_start_ms, now, &recs);
    if (n < 0) return; /* out of memory: the counts stay for the next period */
    w->usage_start_ms = now;
    for (int i = 0; i < n; i++) {
        char err[256];
        json_t *o = json_loads(recs[i], 0, NULL);
        const char *tenant = o ? json_string_value(json_object_get(o, "tenant")) : NULL;
        if (!tenant) tenant = "";
        if (producer_send(w->aux, w->cfg.usage_topic, tenant, strlen(tenant), recs[i],
                          strlen(recs[i]), NULL, (void *)AUX_USAGE, err, sizeof err))
            wlog(w, SW_LOG_WARN, "usage record not sent: %s", err);
        json_decref(o);
        free(recs[i]);
    }
    free(recs);
}

/* Once a second: a throughput sample (tokens of the results finished in it per second) when
 * the engine was busy through the second: work at its start and at its end, and the engine
 * thread idle for less than a tenth of it. Poll thread. */
void wout_throughput_tick(worker_t *w)
{
    int64_t now = mono_ms();
    if (now - w->tput_t_ms < 1000) return;
    uint64_t done = atomic_load(&w->st.prompt_tokens) + atomic_load(&w->st.completion_tokens);
    uint64_t idle = atomic_load(&w->st.ns_idle);
    /* busy: the engine thread waited for work less than a tenth of the second (its idle time
     * is added when a wait ends: a wait still going on shows in the next second) */
    if (w->tput_t_ms && (idle - w->tput_idle) * 10 < (uint64_t)(now - w->tput_t_ms) * 1000000 &&
        !w->tput_idle_open && atomic_load(&w->st.inbox_n) + atomic_load(&w->st.eng_running) > 0)
        ewma_add(&w->st.tput_bits,
                 (double)(done - w->tput_tokens) * 1000.0 / (double)(now - w->tput_t_ms),
                 w->cfg.autoscale_avg_seconds);
    w->tput_t_ms = now;
    w->tput_tokens = done;
    w->tput_idle = idle;
    w->tput_idle_open = atomic_load(&w->st.inbox_n) + atomic_load(&w->st.eng_running) == 0;
}

void wout_periodic_commit(worker_t *w, int force)
{
    int64_t now = mono_ms();
    if (!force && now - w->last_commit_ms < w->cfg.commit_interval_ms) return;
    w->last_commit_ms = now;
    if (w->cfg.delivery == WORKER_EOS) {
        wout_txn_commit(w);
    } else if (consumer_commit(w->cons, !force) == 0) {
        atomic_fetch_add(&w->st.commits, 1);
    }
}
