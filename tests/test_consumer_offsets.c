/* tests/test_consumer_offsets.c: the consumer's offset tracker (consumer/intake.c) on librdkafka's
 * mock cluster, without a worker: what is committed for a partition is always the offset of its
 * lowest unacknowledged message, whatever order acknowledgements come in.
 *
 *   1. 2 partitions x 30 messages tracked; a message tracked twice is stale.
 *   2. acknowledgements out of order: offsets 5..9 of partition 0 move nothing; is_next names the
 *      front; then 0..4 move the commit to 10; partition 1 acked whole commits 30; an offset acked
 *      twice is refused (stale).
 *   3. an asynchronous commit arrives through later polls.
 *   4. consumer_rewind drops every pending message (the drop hook sees each once, its tickets go
 *      stale), seeks back to the committed offsets, and exactly those messages are polled again.
 *   5. consumer_leave commits the rest synchronously. */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "consumer/consumer.h"
#include "tests/support/mock_kafka.h"

enum { NPART = 2, NMSG = 30 };

typedef struct {
    consumer_ticket_t t[NPART][NMSG];
    int tracked[NPART][NMSG];   /* times tracked */
    int dropped[NPART][NMSG];   /* times the drop hook named it */
    int64_t slot_tag[NPART][NMSG]; /* the user pointer given at tracking points here */
} state_t;

static state_t S;

static void on_drop(void *arg, void *user)
{
    (void)arg;
    int64_t *tag = user;
    int p = (int)(*tag / NMSG), o = (int)(*tag % NMSG);
    S.dropped[p][o]++;
}

static void on_log(void *arg, int level, const char *msg)
{
    (void)arg;
    if (level <= 1) fprintf(stderr, "consumer: %s\n", msg);
}

/* Polls until n tracked messages (or 20 s). Every message is tracked and destroyed; returns how
 * many were tracked. */
static int poll_track(consumer_t *c, int n)
{
    int got = 0;
    for (int64_t end = tk_now_ms() + 20000; got < n && tk_now_ms() < end;) {
        rd_kafka_message_t *m = consumer_poll(c, 100);
        if (!m) continue;
        if (!m->err && m->partition >= 0 && m->partition < NPART && m->offset >= 0 &&
            m->offset < NMSG) {
            int p = m->partition, o = (int)m->offset;
            S.slot_tag[p][o] = (int64_t)p * NMSG + o;
            int rc = consumer_track(c, m, &S.slot_tag[p][o], &S.t[p][o]);
            CHECKF(rc == 0, "track p%d o%d: %d", p, o, rc);
            if (rc == 0) {
                S.tracked[p][o]++;
                got++;
                /* the same message again is stale: its offset is not above the highest */
                consumer_ticket_t dup;
                CHECK(consumer_track(c, m, NULL, &dup) == 1);
            }
        }
        rd_kafka_message_destroy(m);
    }
    return got;
}

/* The group's committed offset of partition p, polling the consumer meanwhile (async commits
 * complete inside consumer_poll) until it equals want or 10 s passed. */
static int64_t committed_eventually(consumer_t *c, const char *brokers, int p, int64_t want)
{
    int64_t per[NPART] = {-1, -1};
    for (int64_t end = tk_now_ms() + 10000;;) {
        tk_committed(brokers, "g-offsets", "t", NPART, per);
        if (per[p] == want || tk_now_ms() >= end) return per[p];
        rd_kafka_message_t *m = consumer_poll(c, 100);
        CHECK(m == NULL); /* nothing new was produced */
        if (m) rd_kafka_message_destroy(m);
    }
}

static void ack_range(consumer_t *c, int p, int lo, int hi)
{
    for (int o = lo; o < hi; o++) CHECKF(consumer_ack(c, &S.t[p][o]) == 0, "ack p%d o%d", p, o);
}

int main(void)
{
    char err[512];
    rd_kafka_t *mk;
    rd_kafka_mock_cluster_t *mc = tk_mock_cluster(1, "t", NPART, &mk);
    CHECK(mc != NULL);
    if (!mc) return check_exit();
    const char *brokers = rd_kafka_mock_cluster_bootstraps(mc);
    static tk_msg_t msgs[NPART * NMSG];
    static char vals[NPART * NMSG][16];
    for (int i = 0; i < NPART * NMSG; i++) {
        snprintf(vals[i], sizeof vals[i], "m%d", i);
        msgs[i] = (tk_msg_t){.topic = "t", .value = vals[i], .partition = i % NPART};
    }
    CHECK(tk_produce(brokers, msgs, NPART * NMSG) == 0);

    consumer_config_t cc = {.brokers = brokers, .group_id = "g-offsets", .topics = "t",
                            .commit_offsets = 1};
    const char *pk[] = {"log_level", "session.timeout.ms"}, *pv[] = {"3", "6000"};
    cc.prop_keys = pk;
    cc.prop_values = pv;
    cc.n_props = 2;
    consumer_hooks_t hooks = {.drop = on_drop, .log = on_log};
    consumer_t *c = consumer_new(&cc, &hooks, err, sizeof err);
    CHECKF(c != NULL, "%s", err);
    if (!c) goto out;

    /* 1 */
    CHECK(poll_track(c, NPART * NMSG) == NPART * NMSG);
    CHECK(consumer_pending(c) == NPART * NMSG);
    CHECK(consumer_n_assigned(c) == NPART);

    /* 2 */
    ack_range(c, 0, 5, 10);
    CHECK(consumer_is_next(c, &S.t[0][0]) == 1);
    CHECK(consumer_is_next(c, &S.t[0][5]) == 0);
    CHECK(consumer_commit(c, 0) == 0);
    int64_t per[NPART] = {-1, -1};
    tk_committed(brokers, "g-offsets", "t", NPART, per);
    CHECKF(per[0] <= 0, "partition 0 committed %lld with offset 0 unacknowledged",
           (long long)per[0]);
    ack_range(c, 0, 0, 5);
    CHECK(consumer_is_next(c, &S.t[0][10]) == 1);
    ack_range(c, 1, 0, NMSG);
    CHECK(consumer_ack(c, &S.t[0][3]) == 1); /* acked twice */
    CHECK(consumer_ack(c, &S.t[1][NMSG - 1]) == 1);
    CHECK(consumer_pending(c) == NMSG - 10);
    CHECK(consumer_commit(c, 0) == 0);
    tk_committed(brokers, "g-offsets", "t", NPART, per);
    CHECKF(per[0] == 10 && per[1] == NMSG, "committed %lld %lld, want 10 %d", (long long)per[0],
           (long long)per[1], NMSG);

    /* 3 */
    ack_range(c, 0, 10, 15);
    CHECK(consumer_commit(c, 1) == 0);
    int64_t got = committed_eventually(c, brokers, 0, 15);
    CHECKF(got == 15, "async commit: partition 0 at %lld, want 15", (long long)got);

    /* 4 */
    CHECK(consumer_rewind(c, err, sizeof err) == 0);
    for (int o = 0; o < NMSG; o++)
        CHECKF(S.dropped[0][o] == (o >= 15), "p0 o%d dropped %d times", o, S.dropped[0][o]);
    for (int o = 0; o < NMSG; o++) CHECK(S.dropped[1][o] == 0);
    CHECK(consumer_pending(c) == 0);
    CHECK(consumer_ack(c, &S.t[0][20]) == 1); /* its ticket went stale with the rewind */
    CHECK(poll_track(c, NMSG - 15) == NMSG - 15);
    for (int o = 0; o < NMSG; o++)
        CHECKF(S.tracked[0][o] == (o >= 15 ? 2 : 1), "p0 o%d tracked %d times", o,
               S.tracked[0][o]);
    for (int o = 0; o < NMSG; o++) CHECK(S.tracked[1][o] == 1);
    CHECK(consumer_is_next(c, &S.t[0][15]) == 1);

    /* 5 */
    ack_range(c, 0, 15, NMSG);
    consumer_leave(c);
    tk_committed(brokers, "g-offsets", "t", NPART, per);
    CHECKF(per[0] == NMSG && per[1] == NMSG, "after leave: %lld %lld", (long long)per[0],
           (long long)per[1]);
    consumer_close(c);
out:
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(mk);
    return check_exit();
}
