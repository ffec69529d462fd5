/* tests/support/mock_kafka.h: what the C tests on librdkafka's in-process mock cluster share:
 * clients, producing test messages, reading a topic back, the group's committed offsets, and a
 * worker run on its own thread. Linked into every tests/test_*.c (spillway_test_support).
 *
 * Failures of the Kafka calls are counted with check.h's CHECK in the test that calls them (the
 * functions report them through their return values; the tests decide). Threads: the caller's,
 * except tk_run_*, which run worker_run on a thread of their own. */
#ifndef SPILLWAY_TESTS_SUPPORT_MOCK_KAFKA_H
#define SPILLWAY_TESTS_SUPPORT_MOCK_KAFKA_H

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/worker.h"

/* Monotonic milliseconds. */
int64_t tk_now_ms(void);

/* A loopback TCP port free now, below the kernel's ephemeral range (20000..32767, as
 * scripts/svc-lib.sh picks the test servers'), so no client connection of another process can be
 * given it before the test's server binds it; -1 when none was found in 200 tries. */
int tk_free_port(void);

/* An in-process mock cluster of nbrokers brokers with topic (nparts partitions, replication 1)
 * created, on a handle of its own at log_level 3 (*mk, which the caller destroys after
 * rd_kafka_mock_cluster_destroy). NULL on failure (printed; *mk then NULL). */
rd_kafka_mock_cluster_t *tk_mock_cluster(int nbrokers, const char *topic, int nparts,
                                         rd_kafka_t **mk);

/* A client of brokers (NULL: none set) at log_level 3. group: group.id, with auto commit off
 * (NULL: none); isolation: isolation.level (NULL: librdkafka's default). NULL on failure
 * (printed). Caller destroys. */
rd_kafka_t *tk_client(rd_kafka_type_t type, const char *brokers, const char *group,
                      const char *isolation);

/* One message to produce. value: len bytes (len 0: strlen(value)); h: up to two headers (name
 * NULL = none); key: NULL none; partition: as given (0 when zero-initialised), or
 * RD_KAFKA_PARTITION_UA (-1) for the partitioner. */
typedef struct {
    const char *topic;
    const char *value;
    const char *h[2][2];
    const char *key;
    size_t len;
    int32_t partition;
} tk_msg_t;

/* Produces msgs[0..n) and flushes. Returns the number of messages not delivered (0 on success). */
int tk_produce(const char *brokers, const tk_msg_t *msgs, int n);

/* Produces vals[0..n) (lens NULL: strlen) to topic, message i to partition i % nparts, keyed
 * "k<i>" when keyed. Returns the number not delivered. */
int tk_produce_values(const char *brokers, const char *topic, const char *const *vals,
                      const size_t *lens, int n, int nparts, int keyed);

/* One record read back. */
typedef struct {
    char *value;                 /* malloc'd copy, NUL-terminated */
    size_t len;
    json_t *json;                /* the value parsed, or NULL (not JSON) */
    char key[128];               /* NUL-terminated copy (cut to fit) */
    int32_t partition;
    int64_t offset;
    /* dead-letter headers (empty / -1 when absent) */
    char code[64], message[256], topic[64];
    int32_t src_partition;
} tk_rec_t;

/* Reads partitions 0..nparts-1 of topic from the beginning with read_committed, until want
 * records were read or timeout_ms passed; at most cap are kept. Returns the number read. */
int tk_collect(const char *brokers, const char *topic, int nparts, int want, int timeout_ms,
               tk_rec_t *out, int cap);
void tk_recs_free(tk_rec_t *recs, int n);
/* The record whose JSON "id" is id, or NULL. */
const tk_rec_t *tk_find(const tk_rec_t *recs, int n, const char *id);
/* That record's parsed value, or NULL. */
json_t *tk_find_json(const tk_rec_t *recs, int n, const char *id);
/* How many records hold id as their JSON "id". */
int tk_count_id(const tk_rec_t *recs, int n, const char *id);

/* The group's committed offsets of partitions 0..nparts-1 of topic into per[] (may be NULL;
 * -1 where none), and their sum with -1 for each partition without one; -1000000 when the
 * broker could not be asked. */
int64_t tk_committed(const char *brokers, const char *group, const char *topic, int nparts,
                     int64_t *per);

/* A worker of the tests on the cluster at brokers: group g-SUFFIX, input topics `inputs` (NULL:
 * in-SUFFIX), results out-SUFFIX, dead letters dlq-SUFFIX, the model at `model`, 1 thread,
 * kv.mem_mb 16, commit.interval.ms 100, worker.id `id`, log.level from $WLOG (default warn),
 * librdkafka's log_level 3; then kv[0..n) ("key", "value" pairs, set in order: a later one
 * overrides). NULL on failure, with the reason in err. Caller frees with worker_free. */
worker_t *tk_worker_new(const char *brokers, const char *suffix, const char *inputs,
                        const char *model, const char *id, const char *const (*kv)[2], int n,
                        char *err, size_t errlen);

/* A worker running worker_run on a thread of its own. */
typedef struct {
    worker_t *w;
    pthread_t th;
    int started;
    int rc;
    char err[512];
} tk_run_t;

void tk_run_start(tk_run_t *r, worker_t *w);
/* Joins the thread (after worker_stop or a fatal error); returns worker_run's result. */
int tk_run_join(tk_run_t *r);
/* Runs w until results + dead letters reach outputs (or timeout_ms), logs its stats, stops and
 * joins it; *st holds the final stats. Returns worker_run's result (r->err in errbuf). */
int tk_run_until(worker_t *w, uint64_t outputs, int timeout_ms, worker_stats_t *st,
                 char *errbuf, size_t errlen);

#endif
