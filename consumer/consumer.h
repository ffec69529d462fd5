/* consumer/consumer.h: the consumer module's public header.
 *
 * The consumer is Kafka intake (consumer_*): the group consumer and its per-partition offset
 * tracker, declared below. What a message holds is the records module's (records/records.h:
 * request_parse and the other wire formats); the JSON helpers that module uses (json_schema.h,
 * json_text.h) live here. */
#ifndef SPILLWAY_CONSUMER_H
#define SPILLWAY_CONSUMER_H


/* ---- Kafka intake ---------------------------------------------------------------------------
 *
 * A consumer_t is a librdkafka KafkaConsumer in a consumer group (cooperative-sticky, automatic
 * commit and offset store off) plus a per-partition offset tracker: every accepted message is
 * tracked from consumer_track() until consumer_ack(); the position committed for a partition is
 * the offset of its lowest unacknowledged message (or one past the highest tracked message when
 * none is pending), so requests may finish in any order and a commit never passes a message
 * whose output is not durable.
 *
 * Threads: every function runs on the one polling thread, except consumer_wake (any thread).
 * Rebalance callbacks and commit callbacks run inside consumer_poll / consumer_commit /
 * consumer_close on that thread. */

#include <librdkafka/rdkafka.h>

typedef struct consumer consumer_t;

typedef struct {
    void *arg;
    /* Partitions (not lost) are about to be revoked: the last chance to make outputs durable
     * (poll the producer for delivery reports, commit an open transaction). May be NULL. */
    void (*before_revoke)(void *arg);
    /* A tracked, unacknowledged message of a revoked, lost or rewound partition is dropped: the
     * owner of user must cancel its work and must not ack it. */
    void (*drop)(void *arg, void *user);
    /* One log line (level 0 error .. 3 debug). May be NULL. */
    void (*log)(void *arg, int level, const char *msg);
    /* Partitions were lost (not revoked: another member may own them already, and their
     * offsets can no longer be committed); their tracked messages were dropped first. May be
     * NULL. */
    void (*lost)(void *arg);
    /* An offset commit (at-least-once) completed: ok 1/0, ns from its request to its result
     * (poll thread, inside consumer_poll or consumer_commit). May be NULL. */
    void (*committed)(void *arg, int ok, int64_t ns);
} consumer_hooks_t;

typedef struct {
    const char *brokers;
    const char *group_id;
    const char *topics;            /* comma-separated */
    /* librdkafka properties applied after the defaults: [n_props] key/value pairs */
    const char *const *prop_keys;
    const char *const *prop_values;
    int n_props;
    int commit_offsets;            /* 1: consumer_commit commits (at-least-once); 0: the caller
                                      commits through a transaction */
    int leave_wait_ms;             /* consumer_leave serves the rebalance of its unsubscribe at
                                      most this long (ms) before it closes; 0: 10000 */
} consumer_config_t;

/* Creates the consumer and subscribes. NULL + errstr on failure. hooks is copied. */
consumer_t *consumer_new(const consumer_config_t *cfg, const consumer_hooks_t *hooks,
                         char *errstr, size_t errlen);
/* Commits what is committable (synchronously when commit_offsets), unsubscribes, serves the
 * rebalance that follows (at most leave_wait_ms; not for a static member, group.instance.id,
 * which must not leave the group) and closes the group membership: revocations drop what is
 * left (hooks.drop) and every partition is forgotten. The handle stays valid for consumer_wake
 * and consumer_close only. Idempotent. */
void consumer_leave(consumer_t *c);
/* consumer_leave unless done, then frees. Every message consumer_poll returned must have been
 * destroyed before: librdkafka's rd_kafka_destroy waits for them (forever). NULL is a no-op. */
void consumer_close(consumer_t *c);

/* Next message or NULL (timeout, or an event that was handled). The caller owns the message
 * and destroys it with rd_kafka_message_destroy. Messages with m->err set are returned too
 * (the caller logs them; they are not tracked). */
rd_kafka_message_t *consumer_poll(consumer_t *c, int timeout_ms);
/* Makes a blocked consumer_poll return early. Any thread. A no-op once consumer_leave has begun
 * (a wake-up then would cut librdkafka's close short, and rd_kafka_destroy would hang). */
void consumer_wake(consumer_t *c);

/* A tracked message: enough to find it again after its partition state may have been dropped. */
typedef struct {
    uint64_t gen;                  /* the partition assignment it belongs to */
    int64_t offset;
} consumer_ticket_t;

/* Starts tracking message m (not consumed otherwise). 0 and *t set; 1 when the message is
 * stale (its partition is not assigned, or its offset is not above the highest tracked one):
 * the caller must skip it without output. -1 out of memory. */
int consumer_track(consumer_t *c, const rd_kafka_message_t *m, void *user, consumer_ticket_t *t);
/* The message's output is durable. 0, or 1 when the ticket is stale (partition revoked). */
int consumer_ack(consumer_t *c, const consumer_ticket_t *t);
/* 1 when t's message is the lowest unacknowledged one of its partition (every earlier tracked
 * message is acknowledged), else 0 (also for a stale ticket). Exactly-once uses it to put
 * outputs into a transaction in offset order: the offsets a transaction commits must cover
 * exactly the outputs committed so far, or a restart would compute the ones above them again. */
int consumer_is_next(const consumer_t *c, const consumer_ticket_t *t);
/* Tracked messages not yet acknowledged, all partitions. */
int consumer_pending(const consumer_t *c);
int consumer_n_assigned(const consumer_t *c);
/* The assigned partitions of topic, ascending, into out[0..cap): how many there are (may
 * exceed cap: only cap are written). */
int consumer_assigned(const consumer_t *c, const char *topic, int32_t *out, int cap);

/* Pause / resume fetching of every assigned partition (partitions assigned while paused are
 * paused too). Idempotent. */
int consumer_pause(consumer_t *c);
int consumer_resume(consumer_t *c);
int consumer_paused(const consumer_t *c);
/* Holds (hold 1) or releases the partitions of one topic: held partitions stay paused through
 * consumer_resume and reassignment until released (the overload deferral topic). One topic at
 * a time; topic is copied. 0 or -1. Poll thread. */
int consumer_hold_topic(consumer_t *c, const char *topic, int hold);
int consumer_topic_held(const consumer_t *c);

/* Lag of one assigned partition. */
typedef struct {
    char topic[256];
    int32_t partition;
    int64_t end;        /* high watermark (log end offset; the last stable offset under
                           read_committed), from the broker */
    int64_t committed;  /* the group's committed offset; -1 none yet */
    int64_t lag;        /* end - committed (end - low watermark when nothing is committed) */
} consumer_lag_t;

/* Lag of up to cap assigned partitions (Kafka's consumer-group lag: log end minus committed
 * offset; from the log start when nothing is committed). Any thread: uses only thread-safe
 * librdkafka calls, with network round trips (the committed offsets, then the end offsets of all
 * partitions in one request per leader, and their start offsets when some partition has no
 * commit), each bounded by timeout_ms. Returns the number written, or -1 (errstr) when the
 * assignment or the offsets could not be read; a partition whose end is unknown is left out. */
int consumer_lag(consumer_t *c, consumer_lag_t *out, int cap, int timeout_ms, char *errstr,
                 size_t errlen);

/* At-least-once: commits the committable position of every partition that moved (async: 1, a
 * background commit whose result arrives in a later consumer_poll), or synchronously of every
 * partition that has one (async: 0). A failed commit is resent by the next call. 0 or -1. */
int consumer_commit(consumer_t *c, int async);
/* Exactly-once: the committable positions that moved since the last mark (NULL when none;
 * caller destroys the list), for rd_kafka_send_offsets_to_transaction ... */
rd_kafka_topic_partition_list_t *consumer_txn_offsets(consumer_t *c);
/* ... and, after the transaction committed, records them as committed. */
void consumer_txn_committed(consumer_t *c, const rd_kafka_topic_partition_list_t *offsets);
/* Drops every tracked message (hooks.drop) and seeks every assigned partition back to its
 * committed offset (after an aborted transaction). 0 or -1. */
int consumer_rewind(consumer_t *c, char *errstr, size_t errlen);
/* For rd_kafka_send_offsets_to_transaction. Caller destroys. */
rd_kafka_consumer_group_metadata_t *consumer_group_metadata(consumer_t *c);


#endif
