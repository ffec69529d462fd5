/* tests/test_consumer_leave.c: consumer_leave (consumer/intake.c) while an assignment waits to be
 * served, on librdkafka's mock cluster, without a worker.
 *
 * Consumers A and B share a group over 4 partitions (cooperative-sticky, 2 each) and acknowledge
 * every message they polled. B leaves; A, not polling, rejoins on its own (librdkafka's main
 * thread) and is given B's 2 partitions: the assignment waits on A's queue for a poll. Then A
 * leaves. With librdkafka < 2.4, rd_kafka_consumer_close serving that assignment itself turned it
 * into an unassign and the group was left before A's revocation committed ("commit on revoke:
 * Unknown member"), or the close never ended (librdkafka #4527).
 *   Checks: A's leave serves the assignment (its "assigned 2 partition(s), 4 now" line), logs no
 *   warning or error, and every partition's committed offset is its end. */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "consumer/consumer.h"
#include "tests/support/mock_kafka.h"

enum { NPART = 4, NMSG = 10 };

/* One consumer's log as the test sees it: counts of warnings/errors and of the line wanted.
 * Atomics: librdkafka's own threads may log too. */
typedef struct {
    const char *name;
    atomic_int bad;          /* warning or error lines */
    atomic_int watching;     /* 1: count lines containing want */
    const char *want;
    atomic_int wanted;
} logstate_t;

static void on_log(void *arg, int level, const char *msg)
{
    logstate_t *l = arg;
    if (level <= 1) {
        atomic_fetch_add(&l->bad, 1);
        fprintf(stderr, "consumer %s: %s\n", l->name, msg);
    }
    if (atomic_load(&l->watching) && l->want && strstr(msg, l->want))
        atomic_fetch_add(&l->wanted, 1);
}

static void on_drop(void *arg, void *user)
{
    (void)arg;
    (void)user;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Polls c for up to ms, tracking and acknowledging every message. Returns the messages seen. */
static int poll_ack(consumer_t *c, int ms)
{
    int n = 0;
    for (int64_t end = tk_now_ms() + ms; tk_now_ms() < end;) {
        rd_kafka_message_t *m = consumer_poll(c, 20);
        if (!m) continue;
        if (!m->err) {
            consumer_ticket_t t;
            CHECK(consumer_track(c, m, NULL, &t) == 0);
            CHECK(consumer_ack(c, &t) == 0);
            n++;
        }
        rd_kafka_message_destroy(m);
    }
    return n;
}

int main(void)
{
    char err[512];
    rd_kafka_t *mk;
    rd_kafka_mock_cluster_t *mc = tk_mock_cluster(1, "t", NPART, &mk);
    CHECK(mc != NULL);
    if (!mc) return check_exit();
    const char *brokers = rd_kafka_mock_cluster_bootstraps(mc);
    const char *vals[NPART * NMSG];
    for (int i = 0; i < NPART * NMSG; i++) vals[i] = "m";
    CHECK(tk_produce_values(brokers, "t", vals, NULL, NPART * NMSG, NPART, 0) == 0);

    /* max.poll.interval.ms well above the time A is left unpolled below */
    const char *pk[] = {"log_level", "session.timeout.ms", "heartbeat.interval.ms",
                        "max.poll.interval.ms"};
    const char *pv[] = {"3", "6000", "100", "60000"};
    consumer_config_t cc = {.brokers = brokers, .group_id = "g-leave", .topics = "t",
                            .commit_offsets = 1, .prop_keys = pk, .prop_values = pv,
                            .n_props = 4};
    logstate_t la = {.name = "A", .want = "assigned 2 partition(s), 4 now"}, lb = {.name = "B"};
    consumer_hooks_t ha = {.arg = &la, .drop = on_drop, .log = on_log};
    consumer_hooks_t hb = {.arg = &lb, .drop = on_drop, .log = on_log};
    consumer_t *a = consumer_new(&cc, &ha, err, sizeof err);
    CHECKF(a != NULL, "%s", err);
    consumer_t *b = a ? consumer_new(&cc, &hb, err, sizeof err) : NULL;
    CHECKF(b != NULL, "%s", err);
    if (!a || !b) goto out;

    /* both members, 2 partitions each, every message acknowledged */
    int seen = 0;
    for (int64_t end = tk_now_ms() + 30000; tk_now_ms() < end;) {
        seen += poll_ack(a, 50) + poll_ack(b, 50);
        if (consumer_n_assigned(a) == 2 && consumer_n_assigned(b) == 2 && seen == NPART * NMSG)
            break;
    }
    CHECKF(consumer_n_assigned(a) == 2 && consumer_n_assigned(b) == 2,
           "assigned: A %d, B %d (want 2 each)", consumer_n_assigned(a), consumer_n_assigned(b));
    CHECKF(seen == NPART * NMSG, "%d messages acknowledged, want %d", seen, NPART * NMSG);

    /* B leaves (polling only itself); A, unpolled, is given B's partitions meanwhile: the mock
     * group ends the rebalance a member's leave starts session.timeout.ms - 1000 ms later (5 s;
     * the mock refuses sessions under 6 s), A heartbeats every 100 ms and rejoins on
     * librdkafka's own thread */
    consumer_close(b);
    b = NULL;
    CHECK(atomic_load(&lb.bad) == 0);
    sleep_ms(8000);

    atomic_store(&la.watching, 1);
    consumer_leave(a);
    int wanted = atomic_load(&la.wanted), bad = atomic_load(&la.bad);
    CHECKF(wanted == 1, "A's leave served %d assignment(s) of B's partitions, want 1", wanted);
    CHECKF(bad == 0, "A logged %d warning(s)/error(s) while leaving", bad);
    int64_t per[NPART];
    tk_committed(brokers, "g-leave", "t", NPART, per);
    for (int p = 0; p < NPART; p++)
        CHECKF(per[p] == NMSG, "partition %d committed at %lld, want %d", p, (long long)per[p],
               NMSG);
out:
    consumer_close(b);
    consumer_close(a);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(mk);
    return check_exit();
}
