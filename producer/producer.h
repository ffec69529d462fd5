/* producer/producer.h: the producer module: an idempotent (optionally transactional) librdkafka
 * producer for results and dead-letter records.
 *
 * Threads: producer_send may be called from any thread; delivery reports run on the thread that
 * calls producer_poll / producer_flush; the transaction functions must be called from one thread
 * (the same one that sends inside the transaction, or with sends excluded meanwhile). Errors:
 * 0 / -1 (or NULL) plus the caller's errstr. */
#ifndef SPILLWAY_PRODUCER_H
#define SPILLWAY_PRODUCER_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

typedef struct producer producer_t;

/* Delivery report of one sent record: err 0 when the record is durable (acks=all), else the
 * librdkafka error; opaque as given to producer_send. */
typedef void (*producer_dr_fn)(void *arg, void *opaque, rd_kafka_resp_err_t err);

typedef struct {
    const char *brokers;
    const char *transactional_id;  /* NULL or "": idempotent only; else transactional */
    const char *const *prop_keys;  /* librdkafka properties applied after the defaults */
    const char *const *prop_values;
    int n_props;
    long message_max_bytes;        /* librdkafka message.max.bytes before prop_keys; 0 = its
                                      default (1000000) */
    producer_dr_fn dr;             /* may be NULL */
    void *dr_arg;
    void (*log)(void *arg, int level, const char *msg); /* may be NULL; arg = dr_arg */
} producer_config_t;

/* Creates the producer (enable.idempotence=true, acks=all); a transactional one is initialised
 * (rd_kafka_init_transactions, fencing older instances with the same id) before returning.
 * NULL + errstr on failure. */
producer_t *producer_new(const producer_config_t *cfg, char *errstr, size_t errlen);
/* Flushes (up to timeout_ms), purges what is still undelivered (its delivery reports run, with
 * an error) and destroys. NULL is a no-op. */
void producer_free(producer_t *p, int timeout_ms);
/* Replaces the librdkafka instance by a new one with the same configuration: the old one is
 * purged (its delivery reports run, with an error) and destroyed without waiting, then the new
 * one (transactional) is initialised, which bumps the transactional.id's epoch and so fences
 * every request the old one still had in flight, and lets the coordinator complete or abort the
 * transaction it left. The remedy for PRODUCER_TXN_UNCERTAIN. Transaction thread; p stays
 * valid either way. 0, or -1 (errstr): the new instance could not be created (the old one
 * stays) or initialised (the instance is unusable: stop). */
int producer_renew(producer_t *p, char *errstr, size_t errlen);
/* librdkafka's name of the current instance (e.g. "rdkafka#producer-3"); valid until the next
 * producer_renew or producer_free. */
const char *producer_name(const producer_t *p);

/* Sends one record (key, value and headers are copied; hdrs, when not NULL, is always
 * consumed). Waits while the local queue is full (serving delivery reports on this thread).
 * 0; -2 when the record exceeds the size limit (never sent); -3 another error that sending
 * again will not cure (PRODUCER_ERR_PERMANENT); -1 other errors (errstr). */
int producer_send(producer_t *p, const char *topic, const void *key, size_t klen,
                  const void *value, size_t vlen, rd_kafka_headers_t *hdrs, void *opaque,
                  char *errstr, size_t errlen);
/* As producer_send, to one partition of topic (RD_KAFKA_PARTITION_UA: the partitioner's
 * choice, as producer_send), with the record timestamp ts_ms (epoch ms; 0 = now). A partition
 * the topic does not have is a permanent error (-3). */
int producer_send_part(producer_t *p, const char *topic, int32_t partition, int64_t ts_ms,
                       const void *key, size_t klen, const void *value, size_t vlen,
                       rd_kafka_headers_t *hdrs, void *opaque, char *errstr, size_t errlen);
/* As producer_send, but never waits: 1 when the local queue is full (nothing sent; hdrs
 * consumed). For best-effort records sent from a thread that must not block. */
int producer_send_nowait(producer_t *p, const char *topic, const void *key, size_t klen,
                         const void *value, size_t vlen, rd_kafka_headers_t *hdrs, void *opaque,
                         char *errstr, size_t errlen);
/* Fetches topic's metadata (partitions and leaders) now, so that the first records sent to it
 * do not wait for a metadata refresh (about a second in librdkafka 2.0). 0, or -1 with errstr
 * (e.g. the topic does not exist, or no broker answered within timeout_ms); sending to it
 * later works either way once it exists. */
int producer_prepare_topic(producer_t *p, const char *topic, int timeout_ms, char *errstr,
                           size_t errlen);
/* Serves delivery reports; returns how many events were served. */
int producer_poll(producer_t *p, int timeout_ms);
/* Waits until every sent record is reported. 0, or -1 on timeout. */
int producer_flush(producer_t *p, int timeout_ms);
/* 1 (and errstr) once the producer raised a fatal error (e.g. fenced): it cannot go on. */
int producer_fatal(producer_t *p, char *errstr, size_t errlen);
/* 1 when the producer's fatal error is a fence (_FENCED, PRODUCER_FENCED, INVALID_PRODUCER_EPOCH:
 * the transaction coordinator bumped this transactional.id's epoch), 0 otherwise. */
int producer_fenced(producer_t *p);

/* What a produce error means for the record (from producev or in its delivery report). */
enum {
    PRODUCER_ERR_RETRIABLE = 0, /* transient (timeouts, leaders moving, brokers down, a missing
                                   topic that may yet be created): send again */
    PRODUCER_ERR_SIZE = 1,      /* the record is too large for the client or the broker */
    PRODUCER_ERR_PERMANENT = 2, /* refused as it is (authorization, policy, invalid record) */
};
int producer_err_kind(rd_kafka_resp_err_t err);

/* ---- transactions (transactional producers only) ---- */
enum {
    PRODUCER_TXN_OK = 0,
    PRODUCER_TXN_ABORTED = 1, /* an abortable error: the transaction was aborted; the caller
                                 rewinds its input to the committed offsets */
    PRODUCER_TXN_FATAL = -1,  /* the producer cannot continue (errstr): stop the process */
    PRODUCER_TXN_UNCERTAIN = 2, /* the commit or abort timed out (or failed in a way this instance
                                   cannot recover from): whether the transaction committed is
                                   unknown, and the broker may still apply requests of this
                                   instance. The caller renews the producer (producer_renew),
                                   then rewinds its input to the committed offsets, which are
                                   settled once the new instance is initialised */
};
int producer_txn_begin(producer_t *p, char *errstr, size_t errlen);
/* Sends offsets (may be NULL) for the consumer group cgmd and commits the open transaction,
 * retrying retriable errors within timeout_ms (past it: PRODUCER_TXN_UNCERTAIN). An abortable
 * error aborts it (PRODUCER_TXN_ABORTED; an abort that fails: FATAL or UNCERTAIN as
 * producer_txn_abort). PRODUCER_TXN_*. */
int producer_txn_commit(producer_t *p, const rd_kafka_topic_partition_list_t *offsets,
                        const rd_kafka_consumer_group_metadata_t *cgmd, int timeout_ms,
                        char *errstr, size_t errlen);
/* Aborts the open transaction. PRODUCER_TXN_OK, PRODUCER_TXN_FATAL (a fatal error) or
 * PRODUCER_TXN_UNCERTAIN (timed out, or another error: the instance must be renewed). */
int producer_txn_abort(producer_t *p, int timeout_ms, char *errstr, size_t errlen);

#endif
