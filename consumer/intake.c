/* consumer/intake.c: Kafka intake: the group consumer, rebalances, pause/resume and the
 * per-partition offset tracker (see consumer.h for the contract).
 *
 * Threads: everything here runs on the polling thread except consumer_wake. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "consumer/consumer.h"

/* Tracking state of one assigned partition. Offsets are tracked in increasing order in a ring;
 * the front entry is always pending (done entries at the front are popped at once). */
typedef struct {
    char *topic;             /* owned */
    int32_t partition;
    uint64_t gen;            /* unique per assignment; tickets carry it */
    int64_t *off;            /* ring [cap] */
    void **user;             /* ring [cap]: the owner's pointer, NULL once acked */
    uint8_t *done;           /* ring [cap] */
    size_t head, n, cap;
    int64_t hi;              /* highest tracked offset, -1 none */
    int64_t committed;       /* last position committed (or being committed), -1 none */
} part_t;

struct consumer {
    rd_kafka_t *rk;
    rd_kafka_queue_t *q;     /* the consumer queue, for consumer_wake */
    consumer_hooks_t hooks;
    int commit_offsets;
    part_t **parts;          /* [n_parts] */
    int n_parts, cap_parts;
    uint64_t next_gen;
    int paused;
    char *held_topic;        /* partitions of this topic stay paused while held (owned), or NULL */
    int held;
    int pending;             /* unacked entries over all partitions */
    int left;                /* consumer_leave done */
    /* consumer_wake against consumer_leave: leave sets closing under it before librdkafka's
     * close starts, wake yields under it only while closing is 0 (see consumer_wake) */
    pthread_mutex_t wake_mu;
    int closing;             /* under wake_mu */
    int wake_mu_ok;          /* wake_mu initialised (consumer_new's cleanup) */
    /* Background commits are held from a (cooperative) revocation until the rebalance that
     * follows it ends: librdkafka 2.0 declares the whole assignment lost when an offset commit
     * is answered ILLEGAL_GENERATION because the re-join that follows a revocation bumped the
     * generation meanwhile (librdkafka issue #4059, fixed in 2.6), which made at-least-once
     * redo everything in flight. The revocation itself commits synchronously, before that
     * re-join. */
    int hold_commits;        /* assignment callbacks to wait for */
    int64_t hold_until_ms;   /* monotonic; commits resume then in any case */
    /* start times (monotonic ns) of commits awaiting their result, oldest first: librdkafka
     * reports commits in the order they were requested */
    int64_t commit_t0[16];
    int commit_head, commit_n;
    int in_sync_commit;      /* 1 inside a synchronous rd_kafka_commit: timed around the call */
    /* Background commits are also held while the group client re-joins (join states init,
     * wait-join, wait-metadata, wait-sync), whoever started the re-join: the coordinator
     * answers requests on a connection in order, so a commit sent after the JoinGroup is
     * answered after the join ends, with the old generation: ILLEGAL_GENERATION, which
     * librdkafka < 2.9 also takes for a lost assignment (#4059, above), and at-least-once then
     * redid everything acknowledged since the last commit that succeeded. librdkafka 2.0 has no
     * callback at a re-join's start; its cgrp debug log line "changed join state A -> B" is
     * written on its main thread before the state changes (log.queue off), so on_log sets
     * this flag before the JoinGroup is sent. */
    int watch_join;          /* debug=cgrp set here for that and for consumer_leave
                              * (librdkafka < 2.9, no user debug or log.queue) */
    atomic_int rejoining;    /* 1 in a re-join phase; written by librdkafka's main thread */
    atomic_int join_init;    /* 1 in the init join state (not joined, joining nothing);
                              * written by librdkafka's main thread */
    int leave_wait_ms;       /* consumer_leave's bound on the unsubscribe's rebalance */
    int static_member;       /* group.instance.id set (KIP-345): leaving closes at once */
};

static int is_held(const consumer_t *c, const char *topic)
{
    return c->held && c->held_topic && !strcmp(c->held_topic, topic);
}

#define logf_(c, level, ...) sw_logf((c)->hooks.log, (c)->hooks.arg, (level), __VA_ARGS__)

/* ---- partition table ---- */

static part_t *find_part(const consumer_t *c, const char *topic, int32_t partition)
{
    for (int i = 0; i < c->n_parts; i++)
        if (c->parts[i]->partition == partition && !strcmp(c->parts[i]->topic, topic))
            return c->parts[i];
    return NULL;
}

static part_t *find_gen(const consumer_t *c, uint64_t gen)
{
    for (int i = 0; i < c->n_parts; i++)
        if (c->parts[i]->gen == gen) return c->parts[i];
    return NULL;
}

static void part_free(part_t *p)
{
    if (!p) return;
    free(p->topic);
    free(p->off);
    free(p->user);
    free(p->done);
    free(p);
}

/* Drops every unacked entry (hooks.drop) and empties the ring. */
static void part_drop_all(consumer_t *c, part_t *p)
{
    for (size_t i = 0; i < p->n; i++) {
        size_t k = (p->head + i) % p->cap;
        if (!p->done[k]) {
            c->pending--;
            if (c->hooks.drop && p->user[k]) c->hooks.drop(c->hooks.arg, p->user[k]);
        }
    }
    p->head = p->n = 0;
}

static int add_part(consumer_t *c, const char *topic, int32_t partition)
{
    if (find_part(c, topic, partition)) return 0;
    if (c->n_parts == c->cap_parts) {
        int cap = c->cap_parts ? c->cap_parts * 2 : 8;
        part_t **np = realloc(c->parts, sizeof *np * (size_t)cap);
        if (!np) return -1;
        c->parts = np;
        c->cap_parts = cap;
    }
    part_t *p = calloc(1, sizeof *p);
    if (!p || !(p->topic = strdup(topic))) {
        free(p);
        return -1;
    }
    p->partition = partition;
    p->gen = ++c->next_gen;
    p->hi = -1;
    p->committed = -1;
    c->parts[c->n_parts++] = p;
    return 0;
}

static void remove_part(consumer_t *c, part_t *p)
{
    for (int i = 0; i < c->n_parts; i++)
        if (c->parts[i] == p) {
            c->parts[i] = c->parts[--c->n_parts];
            break;
        }
    part_drop_all(c, p);
    part_free(p);
}

/* Committable position: the lowest pending offset, or one past the highest tracked. */
static int64_t committable(const part_t *p)
{
    if (p->n) return p->off[p->head];
    return p->hi >= 0 ? p->hi + 1 : -1;
}

/* ---- rebalances ---- */

static void commit_started(consumer_t *c);

/* rd_kafka_commit, synchronous, timed for hooks.committed. */
static rd_kafka_resp_err_t sync_commit(consumer_t *c, const rd_kafka_topic_partition_list_t *l)
{
    int64_t t0 = sw_mono_ns();
    c->in_sync_commit = 1;
    rd_kafka_resp_err_t err = rd_kafka_commit(c->rk, l, 0);
    c->in_sync_commit = 0;
    if (c->hooks.committed && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
        c->hooks.committed(c->hooks.arg, err == RD_KAFKA_RESP_ERR_NO_ERROR, sw_mono_ns() - t0);
    return err;
}

/* Commits the given partitions' committable positions synchronously (at-least-once). */
static void commit_parts(consumer_t *c, const rd_kafka_topic_partition_list_t *parts)
{
    if (!c->commit_offsets) return;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(parts->cnt);
    for (int i = 0; i < parts->cnt; i++) {
        part_t *p = find_part(c, parts->elems[i].topic, parts->elems[i].partition);
        if (!p) continue;
        int64_t pos = committable(p);
        if (pos < 0) continue; /* sent even when unmoved: see consumer_commit */
        rd_kafka_topic_partition_list_add(l, p->topic, p->partition)->offset = pos;
        p->committed = pos;
    }
    if (l->cnt) {
        rd_kafka_resp_err_t err = sync_commit(c, l);
        if (err) logf_(c, SW_LOG_WARN, "commit on revoke: %s", rd_kafka_err2str(err));
    }
    rd_kafka_topic_partition_list_destroy(l);
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    consumer_t *c = opaque;
    int coop = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        if (c->hold_commits > 0) c->hold_commits--;
        for (int i = 0; i < parts->cnt; i++)
            if (add_part(c, parts->elems[i].topic, parts->elems[i].partition))
                logf_(c, SW_LOG_ERROR, "out of memory tracking %s[%d]", parts->elems[i].topic,
                      parts->elems[i].partition);
        rd_kafka_error_t *e = NULL;
        if (coop) e = rd_kafka_incremental_assign(rk, parts);
        else rd_kafka_assign(rk, parts);
        if (e) {
            logf_(c, SW_LOG_ERROR, "incremental assign: %s", rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        }
        /* librdkafka keeps a partition's application pause flag across unassign/assign: one
         * revoked or lost while intake was paused would come back paused for ever */
        rd_kafka_topic_partition_list_t *hp = rd_kafka_topic_partition_list_new(parts->cnt);
        rd_kafka_topic_partition_list_t *rp = rd_kafka_topic_partition_list_new(parts->cnt);
        if (hp && rp) {
            for (int i = 0; i < parts->cnt; i++)
                rd_kafka_topic_partition_list_add(c->paused || is_held(c, parts->elems[i].topic) ? hp : rp,
                                                  parts->elems[i].topic, parts->elems[i].partition);
            if (hp->cnt) rd_kafka_pause_partitions(rk, hp);
            if (rp->cnt) rd_kafka_resume_partitions(rk, rp);
        } else {
            logf_(c, SW_LOG_ERROR, "out of memory pausing/resuming assigned partitions");
        }
        if (hp) rd_kafka_topic_partition_list_destroy(hp);
        if (rp) rd_kafka_topic_partition_list_destroy(rp);
        logf_(c, SW_LOG_INFO, "assigned %d partition(s), %d now", parts->cnt, c->n_parts);
        return;
    }
    if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        int lost = rd_kafka_assignment_lost(rk);
        if (!lost) {
            if (c->hooks.before_revoke) c->hooks.before_revoke(c->hooks.arg);
            commit_parts(c, parts);
        }
        /* cooperative: the assignment that completes this revocation, then the one ending the
         * re-join after it */
        c->hold_commits = coop && !lost ? 2 : 0;
        c->hold_until_ms = sw_mono_ms() + 10000;
        int dropped = 0;
        for (int i = 0; i < parts->cnt; i++) {
            part_t *p = find_part(c, parts->elems[i].topic, parts->elems[i].partition);
            if (!p) continue;
            dropped += (int)p->n;
            remove_part(c, p);
        }
        rd_kafka_error_t *e = NULL;
        if (coop) e = rd_kafka_incremental_unassign(rk, parts);
        else rd_kafka_assign(rk, NULL);
        if (e) {
            logf_(c, SW_LOG_ERROR, "incremental unassign: %s", rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        }
        logf_(c, SW_LOG_INFO, "%s %d partition(s) (%d in-flight dropped), %d left",
              lost ? "lost" : "revoked", parts->cnt, dropped, c->n_parts);
        if (lost && c->hooks.lost) c->hooks.lost(c->hooks.arg);
        return;
    }
    logf_(c, SW_LOG_ERROR, "rebalance error: %s", rd_kafka_err2str(err));
    if (coop) {
        rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, parts);
        if (e) rd_kafka_error_destroy(e);
    } else {
        rd_kafka_assign(rk, NULL);
    }
}

static void commit_started(consumer_t *c)
{
    if (c->commit_n == 16) { /* results not seen (should not happen): forget the oldest */
        c->commit_head = (c->commit_head + 1) % 16;
        c->commit_n--;
    }
    c->commit_t0[(c->commit_head + c->commit_n++) % 16] = sw_mono_ns();
}

static void on_commit(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    consumer_t *c = opaque;
    if (!c->in_sync_commit && c->commit_n > 0) {
        int64_t t0 = c->commit_t0[c->commit_head];
        c->commit_head = (c->commit_head + 1) % 16;
        c->commit_n--;
        if (c->hooks.committed && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
            c->hooks.committed(c->hooks.arg, err == RD_KAFKA_RESP_ERR_NO_ERROR, sw_mono_ns() - t0);
    }
    if (err == RD_KAFKA_RESP_ERR__NO_OFFSET) return;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        /* the request succeeded; a partition may still have failed on its own */
        for (int i = 0; offsets && i < offsets->cnt; i++) {
            rd_kafka_resp_err_t pe = offsets->elems[i].err;
            if (!pe) continue;
            logf_(c, SW_LOG_WARN, "offset commit of %s[%d] failed: %s (will retry)",
                  offsets->elems[i].topic, (int)offsets->elems[i].partition, rd_kafka_err2str(pe));
            part_t *p = find_part(c, offsets->elems[i].topic, offsets->elems[i].partition);
            if (p) p->committed = -1;
        }
        return;
    }
    logf_(c, SW_LOG_WARN, "offset commit failed: %s (will retry)", rd_kafka_err2str(err));
    if (!offsets || offsets->cnt == 0) { /* which partitions is unknown: resend them all */
        for (int i = 0; i < c->n_parts; i++) c->parts[i]->committed = -1;
        return;
    }
    for (int i = 0; i < offsets->cnt; i++) {
        part_t *p = find_part(c, offsets->elems[i].topic, offsets->elems[i].partition);
        if (p) p->committed = -1; /* resend at the next commit */
    }
}

/* buf: librdkafka's "Group \"G\" changed join state A -> B (state S)". Sets rejoining to
 * whether B is a re-join phase (see struct consumer). Thread: librdkafka's main thread. */
static void note_join_state(consumer_t *c, const char *buf)
{
    static const char *const held[] = {"init ", "wait-join ", "wait-metadata ", "wait-sync "};
    const char *to = strstr(buf, " -> ");
    if (!to) return;
    to += 4;
    int r = 0;
    for (size_t i = 0; i < sizeof held / sizeof held[0]; i++)
        if (!strncmp(to, held[i], strlen(held[i]))) r = 1;
    atomic_store(&c->join_init, !strncmp(to, "init ", 5));
    atomic_store(&c->rejoining, r);
}

/* Thread: any librdkafka thread (log.queue off). */
static void on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    consumer_t *c = rd_kafka_opaque(rk);
    if (!c) return;
    if (c->watch_join) {
        if (!strcmp(fac, "CGRPJOINSTATE")) note_join_state(c, buf);
        if (level >= 7) return; /* debug lines asked for only to watch the join state */
    }
    logf_(c, sw_log_from_syslog(level), "rdkafka %s: %s", fac, buf);
}

/* ---- lifecycle ---- */

consumer_t *consumer_new(const consumer_config_t *cfg, const consumer_hooks_t *hooks,
                         char *errstr, size_t errlen)
{
    consumer_t *c = calloc(1, sizeof *c);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_topic_partition_list_t *subs = NULL;
    char *topics = NULL;
    if (!c || !conf) {
        snprintf(errstr, errlen, "out of memory");
        goto fail;
    }
    if (pthread_mutex_init(&c->wake_mu, NULL)) {
        snprintf(errstr, errlen, "cannot create a mutex");
        goto fail;
    }
    c->wake_mu_ok = 1;
    c->hooks = *hooks;
    c->commit_offsets = cfg->commit_offsets;
    static const char *const defaults[][2] = {
        {"partition.assignment.strategy", "cooperative-sticky"},
        {"enable.auto.commit", "false"},
        {"enable.auto.offset.store", "false"},
        {"auto.offset.reset", "earliest"},
        {"isolation.level", "read_committed"},
        {"enable.partition.eof", "false"},
        /* One fetch request is outstanding per broker; when it names only partitions at the log
         * end, the broker holds it this long, and partitions resumed meanwhile wait for it. */
        {"fetch.wait.max.ms", "100"},
    };
    char e[256];
    if (rd_kafka_conf_set(conf, "bootstrap.servers", cfg->brokers, e, sizeof e) ||
        rd_kafka_conf_set(conf, "group.id", cfg->group_id, e, sizeof e))
        goto conf_fail;
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (rd_kafka_conf_set(conf, defaults[i][0], defaults[i][1], e, sizeof e)) goto conf_fail;
    c->leave_wait_ms = cfg->leave_wait_ms > 0 ? cfg->leave_wait_ms : 10000;
    atomic_store(&c->join_init, 1); /* a new group client starts there */
    c->watch_join = rd_kafka_version() < 0x02090000;
    for (int i = 0; i < cfg->n_props; i++)
        if (!strcmp(cfg->prop_keys[i], "debug") || !strcmp(cfg->prop_keys[i], "log.queue"))
            c->watch_join = 0; /* the user's debug log, or logs served late on the poll thread */
    if (c->watch_join && rd_kafka_conf_set(conf, "debug", "cgrp", e, sizeof e)) goto conf_fail;
    for (int i = 0; i < cfg->n_props; i++)
        if (rd_kafka_conf_set(conf, cfg->prop_keys[i], cfg->prop_values[i], e, sizeof e))
            goto conf_fail;
    char inst[256];
    size_t inst_len = sizeof inst;
    c->static_member = rd_kafka_conf_get(conf, "group.instance.id", inst, &inst_len) ==
                           RD_KAFKA_CONF_OK && inst[0];
    rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
    rd_kafka_conf_set_offset_commit_cb(conf, on_commit);
    rd_kafka_conf_set_log_cb(conf, on_log);
    rd_kafka_conf_set_opaque(conf, c);
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, e, sizeof e);
    if (!c->rk) goto conf_fail;
    conf = NULL; /* owned by rk now */
    rd_kafka_poll_set_consumer(c->rk);
    c->q = rd_kafka_queue_get_consumer(c->rk);

    topics = strdup(cfg->topics);
    subs = rd_kafka_topic_partition_list_new(4);
    if (!topics || !subs) {
        snprintf(errstr, errlen, "out of memory");
        goto fail;
    }
    char *save = NULL;
    for (char *t = strtok_r(topics, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (*t) rd_kafka_topic_partition_list_add(subs, t, RD_KAFKA_PARTITION_UA);
    if (!subs->cnt) {
        snprintf(errstr, errlen, "no input topic");
        goto fail;
    }
    rd_kafka_resp_err_t err = rd_kafka_subscribe(c->rk, subs);
    if (err) {
        snprintf(errstr, errlen, "subscribe: %s", rd_kafka_err2str(err));
        goto fail;
    }
    rd_kafka_topic_partition_list_destroy(subs);
    free(topics);
    return c;
conf_fail:
    snprintf(errstr, errlen, "consumer: %s", e);
fail:
    if (subs) rd_kafka_topic_partition_list_destroy(subs);
    free(topics);
    if (conf) rd_kafka_conf_destroy(conf);
    if (c) {
        if (c->q) rd_kafka_queue_destroy(c->q);
        if (c->rk) rd_kafka_destroy(c->rk);
        if (c->wake_mu_ok) pthread_mutex_destroy(&c->wake_mu);
        free(c);
    }
    return NULL;
}

/* 1 when rd_kafka_assignment says nothing is assigned (or cannot say). */
static int nothing_assigned(consumer_t *c)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    if (rd_kafka_assignment(c->rk, &l)) return 1;
    int n = l ? l->cnt : 0;
    if (l) rd_kafka_topic_partition_list_destroy(l);
    return n == 0;
}

/* Unsubscribes and serves the rebalance that starts (the revocation, and an assignment already
 * on its way before it) on this thread until nothing is assigned and, where the join state is
 * watched, the group client is back in its init state: not a member, not joining; at most
 * leave_wait_ms. rd_kafka_consumer_close alone is not enough with librdkafka < 2.4: an
 * assignment that arrives while the consumer closes is turned into an unassign but the group
 * stays waiting for the assign call, and the close never ends (librdkafka #4527). After an
 * unsubscribe an assignment is an ordinary one, revoked in turn. Messages polled here are
 * destroyed, not tracked. */
static void unsubscribe_and_wait(consumer_t *c)
{
    rd_kafka_resp_err_t err = rd_kafka_unsubscribe(c->rk);
    if (err) {
        logf_(c, SW_LOG_WARN, "unsubscribe: %s", rd_kafka_err2str(err));
        return;
    }
    int64_t end = sw_mono_ms() + c->leave_wait_ms;
    for (;;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, 10);
        if (m) rd_kafka_message_destroy(m);
        if (c->n_parts == 0 && (!c->watch_join || atomic_load(&c->join_init)) &&
            nothing_assigned(c))
            return;
        if (sw_mono_ms() >= end) break;
    }
    logf_(c, SW_LOG_WARN,
          "leaving the group: the rebalance after the unsubscribe did not end within %d ms "
          "(%d partition(s) still tracked): closing anyway", c->leave_wait_ms, c->n_parts);
}

void consumer_leave(consumer_t *c)
{
    if (c->left) return;
    c->left = 1;
    pthread_mutex_lock(&c->wake_mu);
    c->closing = 1; /* from here on consumer_wake does nothing */
    pthread_mutex_unlock(&c->wake_mu);
    if (c->commit_offsets) consumer_commit(c, 0);
    /* A static member does not leave the group when it closes (its restart within the session
     * moves no partition), but an unsubscribe would leave it: it closes at once. */
    if (!c->static_member) unsubscribe_and_wait(c); /* revokes (commit_parts): drops what is left */
    rd_kafka_resp_err_t err = rd_kafka_consumer_close(c->rk);
    if (err) logf_(c, SW_LOG_WARN, "consumer close: %s", rd_kafka_err2str(err));
    while (c->n_parts) remove_part(c, c->parts[c->n_parts - 1]);
}

void consumer_close(consumer_t *c)
{
    if (!c) return;
    consumer_leave(c);
    rd_kafka_queue_destroy(c->q);
    free(c->parts);
    free(c->held_topic);
    rd_kafka_destroy(c->rk);
    pthread_mutex_destroy(&c->wake_mu);
    free(c);
}

rd_kafka_message_t *consumer_poll(consumer_t *c, int timeout_ms)
{
    return rd_kafka_consumer_poll(c->rk, timeout_ms);
}

/* Not once consumer_leave has begun: rd_kafka_consumer_close forwards the consumer queue to a
 * queue of its own and waits on it for the close to finish; a yield reaches that queue and ends
 * the wait early (close returns ERR__TIMED_OUT), the revocation posted there is never served,
 * and rd_kafka_destroy then waits for the group to terminate forever. The engine thread wakes
 * the poll thread for every output, also while a fatal error makes it leave the group. */
void consumer_wake(consumer_t *c)
{
    pthread_mutex_lock(&c->wake_mu);
    if (!c->closing) rd_kafka_queue_yield(c->q);
    pthread_mutex_unlock(&c->wake_mu);
}

/* ---- tracking ---- */

int consumer_track(consumer_t *c, const rd_kafka_message_t *m, void *user, consumer_ticket_t *t)
{
    part_t *p = find_part(c, rd_kafka_topic_name(m->rkt), m->partition);
    if (!p || m->offset <= p->hi) return 1;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        int64_t *off = malloc(sizeof *off * cap);
        void **us = malloc(sizeof *us * cap);
        uint8_t *done = malloc(cap);
        if (!off || !us || !done) {
            free(off);
            free(us);
            free(done);
            return -1;
        }
        for (size_t i = 0; i < p->n; i++) {
            size_t k = (p->head + i) % p->cap;
            off[i] = p->off[k];
            us[i] = p->user[k];
            done[i] = p->done[k];
        }
        free(p->off);
        free(p->user);
        free(p->done);
        p->off = off;
        p->user = us;
        p->done = done;
        p->head = 0;
        p->cap = cap;
    }
    size_t k = (p->head + p->n) % p->cap;
    p->off[k] = m->offset;
    p->user[k] = user;
    p->done[k] = 0;
    p->n++;
    p->hi = m->offset;
    c->pending++;
    t->gen = p->gen;
    t->offset = m->offset;
    return 0;
}

int consumer_ack(consumer_t *c, const consumer_ticket_t *t)
{
    part_t *p = find_gen(c, t->gen);
    if (!p || !p->n) return 1;
    size_t lo = 0, hi = p->n; /* binary search over the ring's logical order */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->off[(p->head + mid) % p->cap] < t->offset) lo = mid + 1;
        else hi = mid;
    }
    size_t k = (p->head + lo) % p->cap;
    if (lo == p->n || p->off[k] != t->offset || p->done[k]) return 1;
    p->done[k] = 1;
    p->user[k] = NULL;
    c->pending--;
    while (p->n && p->done[p->head]) {
        p->head = (p->head + 1) % p->cap;
        p->n--;
    }
    return 0;
}

int consumer_is_next(const consumer_t *c, const consumer_ticket_t *t)
{
    const part_t *p = find_gen(c, t->gen);
    return p && p->n && p->off[p->head] == t->offset; /* the front entry is always pending */
}

int consumer_pending(const consumer_t *c) { return c->pending; }
int consumer_n_assigned(const consumer_t *c) { return c->n_parts; }

int consumer_assigned(const consumer_t *c, const char *topic, int32_t *out, int cap)
{
    int n = 0;
    for (int i = 0; i < c->n_parts; i++) {
        if (strcmp(c->parts[i]->topic, topic)) continue;
        int32_t v = c->parts[i]->partition;
        if (n < cap) { /* insertion in ascending order */
            int j = n;
            while (j > 0 && out[j - 1] > v) {
                out[j] = out[j - 1];
                j--;
            }
            out[j] = v;
        }
        n++;
    }
    return n;
}
int consumer_paused(const consumer_t *c) { return c->paused; }

/* After a resume, librdkafka (2.0) does not wake the fetcher: a resumed partition is fetched at
 * the broker thread's next periodic wakeup, up to a second later, which made every pause/resume
 * cycle cost about a second of intake. An absolute seek does wake it, so every resumed partition
 * that has delivered a message is sought (asynchronously) to the offset after the last one, which
 * is where the resume restarts fetching anyway (pausing drops the prefetched messages). */
static void wake_fetcher(consumer_t *c)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    for (int i = 0; i < c->n_parts; i++) {
        part_t *p = c->parts[i];
        if (p->hi < 0) continue;
        if (!l && !(l = rd_kafka_topic_partition_list_new(c->n_parts))) return;
        rd_kafka_topic_partition_list_add(l, p->topic, p->partition)->offset = p->hi + 1;
    }
    if (!l) return;
    rd_kafka_error_t *e = rd_kafka_seek_partitions(c->rk, l, 0);
    if (e) {
        logf_(c, SW_LOG_DEBUG, "seek after resume: %s", rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
    }
    rd_kafka_topic_partition_list_destroy(l);
}

/* Pauses (pause 1) or resumes the assigned partitions that `want` selects. 0 or -1. */
static int pause_some(consumer_t *c, int pause, int (*want)(const consumer_t *, const char *))
{
    rd_kafka_topic_partition_list_t *l = NULL, *sel = NULL;
    rd_kafka_resp_err_t err = rd_kafka_assignment(c->rk, &l);
    if (!err && !(sel = rd_kafka_topic_partition_list_new(l->cnt ? l->cnt : 1)))
        err = RD_KAFKA_RESP_ERR__FAIL; /* out of memory: reported below */
    if (!err) {
        for (int i = 0; i < l->cnt; i++)
            if (want(c, l->elems[i].topic))
                rd_kafka_topic_partition_list_add(sel, l->elems[i].topic, l->elems[i].partition);
        if (sel->cnt)
            err = pause ? rd_kafka_pause_partitions(c->rk, sel) : rd_kafka_resume_partitions(c->rk, sel);
    }
    if (sel) rd_kafka_topic_partition_list_destroy(sel);
    if (l) rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        logf_(c, SW_LOG_WARN, "%s: %s", pause ? "pause" : "resume", rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

static int any_topic(const consumer_t *c, const char *topic)
{
    (void)c;
    (void)topic;
    return 1;
}
static int not_held(const consumer_t *c, const char *topic) { return !is_held(c, topic); }
/* The partitions of held_topic, whether it is held now or not. */
static int held_only(const consumer_t *c, const char *topic)
{
    return c->held_topic && !strcmp(c->held_topic, topic);
}

static int pause_resume(consumer_t *c, int pause)
{
    if (c->paused == pause) return 0;
    if (pause_some(c, pause, pause ? any_topic : not_held)) return -1;
    c->paused = pause;
    if (!pause) wake_fetcher(c);
    return 0;
}

int consumer_hold_topic(consumer_t *c, const char *topic, int hold)
{
    if (!c->held_topic || strcmp(c->held_topic, topic)) {
        if (c->held && pause_some(c, 0, held_only)) return -1; /* release the old one */
        char *t = strdup(topic);
        if (!t) return -1;
        free(c->held_topic);
        c->held_topic = t;
        c->held = 0;
    }
    if (c->held == hold) return 0;
    c->held = hold;
    if (c->paused) return 0; /* everything is paused; pause_resume keeps held partitions paused */
    if (pause_some(c, hold, held_only)) {
        c->held = !hold;
        return -1;
    }
    if (!hold) wake_fetcher(c);
    return 0;
}

int consumer_topic_held(const consumer_t *c) { return c->held; }

int consumer_pause(consumer_t *c) { return pause_resume(c, 1); }
int consumer_resume(consumer_t *c) { return pause_resume(c, 0); }

/* Partitions whose committable position moved since the last commit; all: every partition
 * with a committable position. */
static rd_kafka_topic_partition_list_t *moved(consumer_t *c, int all)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    for (int i = 0; i < c->n_parts; i++) {
        part_t *p = c->parts[i];
        int64_t pos = committable(p);
        if (pos < 0 || (!all && pos == p->committed)) continue;
        if (!l) l = rd_kafka_topic_partition_list_new(c->n_parts);
        rd_kafka_topic_partition_list_add(l, p->topic, p->partition)->offset = pos;
    }
    return l;
}

int consumer_commit(consumer_t *c, int async)
{
    if (async && c->hold_commits > 0 && sw_mono_ms() < c->hold_until_ms) return 0; /* see struct */
    if (async && atomic_load(&c->rejoining)) return 0;                        /* see struct */
    /* A synchronous commit (a forced one: stop, leave) sends every partition, not only those
     * that moved: a commit lost without a report (none was seen, but a partition once stayed
     * behind after a clean stop) is repaired there at the latest. */
    rd_kafka_topic_partition_list_t *l = moved(c, !async);
    if (!l) return 0;
    for (int i = 0; i < l->cnt; i++) {
        part_t *p = find_part(c, l->elems[i].topic, l->elems[i].partition);
        if (p) p->committed = l->elems[i].offset;
    }
    rd_kafka_resp_err_t err;
    if (async) {
        commit_started(c);
        err = rd_kafka_commit(c->rk, l, 1);
        if (err) c->commit_n--; /* refused at once: no result will come */
    } else {
        err = sync_commit(c, l);
    }
    if (err) {
        /* failed (synchronous) or refused at once (asynchronous): resend next time */
        for (int i = 0; i < l->cnt; i++) {
            part_t *p = find_part(c, l->elems[i].topic, l->elems[i].partition);
            if (p) p->committed = -1;
        }
        logf_(c, SW_LOG_WARN, "commit: %s", rd_kafka_err2str(err));
    }
    rd_kafka_topic_partition_list_destroy(l);
    return err ? -1 : 0;
}

rd_kafka_topic_partition_list_t *consumer_txn_offsets(consumer_t *c) { return moved(c, 0); }

void consumer_txn_committed(consumer_t *c, const rd_kafka_topic_partition_list_t *offsets)
{
    for (int i = 0; offsets && i < offsets->cnt; i++) {
        part_t *p = find_part(c, offsets->elems[i].topic, offsets->elems[i].partition);
        if (p) p->committed = offsets->elems[i].offset;
    }
}

int consumer_rewind(consumer_t *c, char *errstr, size_t errlen)
{
    if (!c->n_parts) return 0;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(c->n_parts);
    for (int i = 0; i < c->n_parts; i++) {
        part_t *p = c->parts[i];
        part_drop_all(c, p);
        p->hi = -1;
        p->committed = -1;
        p->gen = ++c->next_gen; /* outstanding tickets go stale */
        rd_kafka_topic_partition_list_add(l, p->topic, p->partition);
    }
    int rc = 0;
    rd_kafka_resp_err_t err = rd_kafka_committed(c->rk, l, 10000);
    if (err) {
        snprintf(errstr, errlen, "fetching committed offsets: %s", rd_kafka_err2str(err));
        rc = -1;
        goto out;
    }
    for (int i = 0; i < l->cnt; i++)
        if (l->elems[i].offset < 0) l->elems[i].offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_error_t *e = rd_kafka_seek_partitions(c->rk, l, 10000);
    if (e) {
        snprintf(errstr, errlen, "seek: %s", rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
        rc = -1;
        goto out;
    }
    for (int i = 0; i < l->cnt; i++)
        if (l->elems[i].err) {
            snprintf(errstr, errlen, "seek %s[%d]: %s", l->elems[i].topic, l->elems[i].partition,
                     rd_kafka_err2str(l->elems[i].err));
            rc = -1;
        }
out:
    rd_kafka_topic_partition_list_destroy(l);
    return rc;
}

rd_kafka_consumer_group_metadata_t *consumer_group_metadata(consumer_t *c)
{
    return rd_kafka_consumer_group_metadata(c->rk);
}

/* Offsets of every partition of l at the broker for timestamp ts (-1 latest: the log end, the
 * last stable offset under read_committed; -2 earliest), in one request per leader, into
 * out[i] (-1 where unknown). 0 or an error. */
static rd_kafka_resp_err_t list_offsets(consumer_t *c, const rd_kafka_topic_partition_list_t *l,
                                        int64_t ts, int64_t *out, int timeout_ms)
{
    rd_kafka_topic_partition_list_t *q = rd_kafka_topic_partition_list_copy(l);
    for (int i = 0; i < q->cnt; i++) q->elems[i].offset = ts;
    rd_kafka_resp_err_t err = rd_kafka_offsets_for_times(c->rk, q, timeout_ms);
    for (int i = 0; i < q->cnt; i++)
        out[i] = !err && !q->elems[i].err && q->elems[i].offset >= 0 ? q->elems[i].offset : -1;
    rd_kafka_topic_partition_list_destroy(q);
    return err;
}

int consumer_lag(consumer_t *c, consumer_lag_t *out, int cap, int timeout_ms, char *errstr,
                 size_t errlen)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    int64_t *end = NULL, *begin = NULL;
    rd_kafka_resp_err_t err = rd_kafka_assignment(c->rk, &l);
    int n = 0;
    if (err) {
        snprintf(errstr, errlen, "assignment: %s", rd_kafka_err2str(err));
        n = -1;
        goto out;
    }
    if (!l->cnt) goto out;
    end = malloc(sizeof *end * (size_t)l->cnt);
    begin = malloc(sizeof *begin * (size_t)l->cnt);
    if (!end || !begin) {
        snprintf(errstr, errlen, "out of memory");
        n = -1;
        goto out;
    }
    err = rd_kafka_committed(c->rk, l, timeout_ms);
    if (!err) err = list_offsets(c, l, -1, end, timeout_ms);
    if (err) {
        snprintf(errstr, errlen, "offsets: %s", rd_kafka_err2str(err));
        n = -1;
        goto out;
    }
    int need_begin = 0;
    for (int i = 0; i < l->cnt; i++)
        if (l->elems[i].err || l->elems[i].offset < 0) need_begin = 1;
    if (need_begin && list_offsets(c, l, -2, begin, timeout_ms))
        for (int i = 0; i < l->cnt; i++) begin[i] = -1;
    for (int i = 0; i < l->cnt && n < cap; i++) {
        const rd_kafka_topic_partition_t *tp = &l->elems[i];
        if (end[i] < 0) continue;
        consumer_lag_t *x = &out[n++];
        snprintf(x->topic, sizeof x->topic, "%s", tp->topic);
        x->partition = tp->partition;
        x->end = end[i];
        x->committed = !tp->err && tp->offset >= 0 ? tp->offset : -1;
        int64_t from = x->committed >= 0 ? x->committed : need_begin && begin[i] >= 0 ? begin[i] : end[i];
        x->lag = end[i] > from ? end[i] - from : 0;
    }
out:
    free(end);
    free(begin);
    if (l) rd_kafka_topic_partition_list_destroy(l);
    return n;
}
