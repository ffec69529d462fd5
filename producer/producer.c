/* producer/producer.c: idempotent / transactional producer for results and DLQ records. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "producer/producer.h"

struct producer {
    rd_kafka_t *rk;              /* the current instance; producer_renew replaces it */
    rd_kafka_conf_t *conf;       /* owned: a copy of rk's configuration, for producer_renew */
    int transactional;
    producer_dr_fn dr;
    void *dr_arg;
    void (*log)(void *arg, int level, const char *msg);
};

#define plog(p, level, ...) sw_logf((p)->log, (p)->dr_arg, (level), __VA_ARGS__)

/* Runs on the thread calling producer_poll / producer_flush. */
static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    producer_t *p = opaque;
    if (p->dr) p->dr(p->dr_arg, m->_private, m->err);
}

static void on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    producer_t *p = rd_kafka_opaque(rk);
    if (p) plog(p, sw_log_from_syslog(level), "rdkafka %s: %s", fac, buf);
}

/* init_transactions on a new instance: fences older instances with the same transactional.id
 * (their epoch is bumped) and completes or aborts what they left open. 0, or -1 (errstr). */
static int init_txn(rd_kafka_t *rk, char *errstr, size_t errlen)
{
    rd_kafka_error_t *err = rd_kafka_init_transactions(rk, 30000);
    if (!err) return 0;
    snprintf(errstr, errlen, "init_transactions: %s", rd_kafka_error_string(err));
    rd_kafka_error_destroy(err);
    return -1;
}

producer_t *producer_new(const producer_config_t *cfg, char *errstr, size_t errlen)
{
    producer_t *p = calloc(1, sizeof *p);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char e[512];
    if (!p || !conf) {
        snprintf(errstr, errlen, "out of memory");
        goto fail;
    }
    p->dr = cfg->dr;
    p->dr_arg = cfg->dr_arg;
    p->log = cfg->log;
    p->transactional = cfg->transactional_id && *cfg->transactional_id;
    static const char *const defaults[][2] = {
        {"enable.idempotence", "true"},
        {"acks", "all"},
        {"linger.ms", "5"},
        {"compression.type", "lz4"},
    };
    if (rd_kafka_conf_set(conf, "bootstrap.servers", cfg->brokers, e, sizeof e)) goto conf_fail;
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (rd_kafka_conf_set(conf, defaults[i][0], defaults[i][1], e, sizeof e)) goto conf_fail;
    char mmb[24];
    snprintf(mmb, sizeof mmb, "%ld", cfg->message_max_bytes);
    if (cfg->message_max_bytes > 0 &&
        rd_kafka_conf_set(conf, "message.max.bytes", mmb, e, sizeof e))
        goto conf_fail;
    if (p->transactional &&
        rd_kafka_conf_set(conf, "transactional.id", cfg->transactional_id, e, sizeof e))
        goto conf_fail;
    for (int i = 0; i < cfg->n_props; i++)
        if (rd_kafka_conf_set(conf, cfg->prop_keys[i], cfg->prop_values[i], e, sizeof e))
            goto conf_fail;
    rd_kafka_conf_set_dr_msg_cb(conf, on_dr);
    rd_kafka_conf_set_log_cb(conf, on_log);
    rd_kafka_conf_set_opaque(conf, p);
    if (!(p->conf = rd_kafka_conf_dup(conf))) {
        snprintf(errstr, errlen, "out of memory");
        goto fail;
    }
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, e, sizeof e);
    if (!p->rk) goto conf_fail;
    conf = NULL; /* owned by rk */
    if (p->transactional && init_txn(p->rk, errstr, errlen)) goto fail;
    return p;
conf_fail:
    snprintf(errstr, errlen, "producer: %s", e);
fail:
    if (conf) rd_kafka_conf_destroy(conf);
    if (p && p->rk) rd_kafka_destroy(p->rk);
    if (p && p->conf) rd_kafka_conf_destroy(p->conf);
    free(p);
    return NULL;
}

/* Flushes rk up to timeout_ms, purges what is still undelivered (each one's delivery report
 * runs, with an error) and destroys it. */
static void destroy_rk(producer_t *p, rd_kafka_t *rk, int timeout_ms)
{
    if (rd_kafka_flush(rk, timeout_ms)) {
        plog(p, SW_LOG_WARN, "producer %s closed with %d record(s) undelivered", rd_kafka_name(rk),
             rd_kafka_outq_len(rk));
        /* rd_kafka_destroy would drop them without a delivery report, and so leak whatever
         * their opaques own: purge them, so that each one's report runs (with an error) */
        rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(rk, 1000);
    }
    rd_kafka_destroy(rk);
}

int producer_renew(producer_t *p, char *errstr, size_t errlen)
{
    char e[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_dup(p->conf);
    if (!conf) {
        snprintf(errstr, errlen, "producer renew: out of memory");
        return -1;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, e, sizeof e);
    if (!rk) { /* the old instance stays */
        rd_kafka_conf_destroy(conf);
        snprintf(errstr, errlen, "producer renew: %s", e);
        return -1;
    }
    /* conf is owned by rk. The old instance goes first (no request of its own is retried
     * beside the new one's), then the new one's InitProducerId bumps the epoch */
    destroy_rk(p, p->rk, 0);
    p->rk = rk;
    return p->transactional ? init_txn(p->rk, errstr, errlen) : 0;
}

const char *producer_name(const producer_t *p) { return rd_kafka_name(p->rk); }

void producer_free(producer_t *p, int timeout_ms)
{
    if (!p) return;
    destroy_rk(p, p->rk, timeout_ms);
    rd_kafka_conf_destroy(p->conf);
    free(p);
}

int producer_send(producer_t *p, const char *topic, const void *key, size_t klen,
                  const void *value, size_t vlen, rd_kafka_headers_t *hdrs, void *opaque,
                  char *errstr, size_t errlen)
{
    return producer_send_part(p, topic, RD_KAFKA_PARTITION_UA, 0, key, klen, value, vlen, hdrs,
                              opaque, errstr, errlen);
}

int producer_send_part(producer_t *p, const char *topic, int32_t partition, int64_t ts_ms,
                       const void *key, size_t klen, const void *value, size_t vlen,
                       rd_kafka_headers_t *hdrs, void *opaque, char *errstr, size_t errlen)
{
    for (;;) {
        rd_kafka_resp_err_t err = rd_kafka_producev(
            p->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
            RD_KAFKA_V_TIMESTAMP(ts_ms > 0 ? ts_ms : 0), RD_KAFKA_V_KEY(key, klen),
            RD_KAFKA_V_VALUE((void *)value, vlen), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
            RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_OPAQUE(opaque), RD_KAFKA_V_END);
        if (!err) return 0; /* hdrs now owned by librdkafka */
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            rd_kafka_poll(p->rk, 10);
            continue;
        }
        if (hdrs) rd_kafka_headers_destroy(hdrs);
        snprintf(errstr, errlen, "produce to %s: %s", topic, rd_kafka_err2str(err));
        int kind = producer_err_kind(err);
        return kind == PRODUCER_ERR_SIZE ? -2 : kind == PRODUCER_ERR_PERMANENT ? -3 : -1;
    }
}

int producer_err_kind(rd_kafka_resp_err_t err)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:   /* client check, or the broker's
                                                    MESSAGE_TOO_LARGE */
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
        return PRODUCER_ERR_SIZE;
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR__BAD_MSG:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
        return PRODUCER_ERR_PERMANENT;
    default:
        return PRODUCER_ERR_RETRIABLE;
    }
}

int producer_send_nowait(producer_t *p, const char *topic, const void *key, size_t klen,
                         const void *value, size_t vlen, rd_kafka_headers_t *hdrs, void *opaque,
                         char *errstr, size_t errlen)
{
    rd_kafka_resp_err_t err = rd_kafka_producev(
        p->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, klen),
        RD_KAFKA_V_VALUE((void *)value, vlen), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_OPAQUE(opaque), RD_KAFKA_V_END);
    if (!err) return 0; /* hdrs now owned by librdkafka */
    if (hdrs) rd_kafka_headers_destroy(hdrs);
    snprintf(errstr, errlen, "produce to %s: %s", topic, rd_kafka_err2str(err));
    if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) return 1;
    return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ? -2 : -1;
}

int producer_prepare_topic(producer_t *p, const char *topic, int timeout_ms, char *errstr,
                           size_t errlen)
{
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(p->rk, topic, NULL);
    if (!rkt) {
        snprintf(errstr, errlen, "topic %s: %s", topic, rd_kafka_err2str(rd_kafka_last_error()));
        return -1;
    }
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(p->rk, 0, rkt, &md, timeout_ms);
    if (!err && (md->topic_cnt != 1 || md->topics[0].err)) err = md->topic_cnt == 1 ? md->topics[0].err
                                                                        : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
    if (md) rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    if (err) {
        snprintf(errstr, errlen, "topic %s: %s", topic, rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

int producer_poll(producer_t *p, int timeout_ms) { return rd_kafka_poll(p->rk, timeout_ms); }

int producer_flush(producer_t *p, int timeout_ms)
{
    return rd_kafka_flush(p->rk, timeout_ms) ? -1 : 0;
}

int producer_fatal(producer_t *p, char *errstr, size_t errlen)
{
    char e[256];
    rd_kafka_resp_err_t err = rd_kafka_fatal_error(p->rk, e, sizeof e);
    if (!err) return 0;
    snprintf(errstr, errlen, "fatal producer error: %s: %s", rd_kafka_err2name(err), e);
    return 1;
}

int producer_fenced(producer_t *p)
{
    char e[8];
    rd_kafka_resp_err_t err = rd_kafka_fatal_error(p->rk, e, sizeof e);
    return err == RD_KAFKA_RESP_ERR__FENCED || err == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
           err == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH;
}

int producer_txn_begin(producer_t *p, char *errstr, size_t errlen)
{
    rd_kafka_error_t *e = rd_kafka_begin_transaction(p->rk);
    if (!e) return 0;
    snprintf(errstr, errlen, "begin_transaction: %s", rd_kafka_error_string(e));
    rd_kafka_error_destroy(e);
    return -1;
}

int producer_txn_abort(producer_t *p, int timeout_ms, char *errstr, size_t errlen)
{
    rd_kafka_error_t *e = rd_kafka_abort_transaction(p->rk, timeout_ms);
    if (!e) return PRODUCER_TXN_OK;
    snprintf(errstr, errlen, "abort_transaction: %s", rd_kafka_error_string(e));
    int fatal = rd_kafka_error_is_fatal(e);
    rd_kafka_error_destroy(e);
    /* not fatal: a timeout (the EndTxn may still be in flight, librdkafka goes on retrying it)
     * or a state this instance cannot leave; only a new instance settles it */
    return fatal ? PRODUCER_TXN_FATAL : PRODUCER_TXN_UNCERTAIN;
}

int producer_txn_commit(producer_t *p, const rd_kafka_topic_partition_list_t *offsets,
                        const rd_kafka_consumer_group_metadata_t *cgmd, int timeout_ms,
                        char *errstr, size_t errlen)
{
    int64_t end = sw_mono_ms() + timeout_ms;
    int sent = offsets == NULL || offsets->cnt == 0;
    /* Flush before sending the offsets, so no ProduceRequest is in flight while they go out.
     * librdkafka (2.0.2, and still upstream) leaks the request of send_offsets_to_transaction (an
     * op with its copies of offsets and cgmd) when the producer is destroyed while its
     * TxnOffsetCommit is in flight: the response handler returns on ERR__DESTROY without freeing
     * it. A fatal produce error arriving meanwhile (INVALID_PRODUCER_EPOCH) made the call return
     * at once with that request still in flight, and the worker, stopping on the error, then
     * destroyed the producer (LeakSanitizer, test_worker_txn_mock eos_fatal_produce). After a
     * flush such an error surfaces before the request exists, and the call returns only once its
     * request is done. commit_transaction flushes anyway; a timeout here is reported by it. */
    if (!sent) rd_kafka_flush(p->rk, timeout_ms);
    for (;;) {
        int left = (int)(end - sw_mono_ms());
        if (left < 1) left = 1;
        const char *what = sent ? "commit_transaction" : "send_offsets_to_transaction";
        rd_kafka_error_t *e = sent ? rd_kafka_commit_transaction(p->rk, left)
                                   : rd_kafka_send_offsets_to_transaction(
                                         p->rk, (rd_kafka_topic_partition_list_t *)offsets, cgmd, left);
        if (!e) {
            if (sent) return PRODUCER_TXN_OK;
            sent = 1;
            continue;
        }
        snprintf(errstr, errlen, "%s: %s", what, rd_kafka_error_string(e));
        int fatal = rd_kafka_error_is_fatal(e);
        int abortable = rd_kafka_error_txn_requires_abort(e);
        int retriable = rd_kafka_error_is_retriable(e);
        rd_kafka_error_destroy(e);
        if (fatal) return PRODUCER_TXN_FATAL;
        if (retriable && !abortable && sw_mono_ms() >= end) {
            /* timed out (librdkafka: ERR__TIMED_OUT, retriable, the call resumable): the
             * flush, the TxnOffsetCommit or the EndTxn is still in flight and the broker may
             * yet apply it. Aborting on this instance is refused while the call is resumable,
             * and without KIP-890 (librdkafka #5423) a late request of this epoch could land
             * in its next transaction: this instance must not be used again */
            return PRODUCER_TXN_UNCERTAIN;
        }
        if (abortable || !retriable) {
            plog(p, SW_LOG_WARN, "%s; aborting the transaction", errstr);
            char e2[256];
            int rc = producer_txn_abort(p, timeout_ms, e2, sizeof e2);
            if (rc != PRODUCER_TXN_OK) {
                snprintf(errstr, errlen, "%s", e2);
                return rc;
            }
            return PRODUCER_TXN_ABORTED;
        }
        plog(p, SW_LOG_WARN, "%s; retrying", errstr);
    }
}
