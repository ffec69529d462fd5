/* tests/test_cache.c: tier 2 of the prefix KV cache (cache/): a shared arena indexed in a real
 * redis-server that this test starts with scripts/redis-server.sh (skipped, exit 77, when
 * redis-server is not installed). Block contents are derived from their names, so every fetched
 * block is checked byte for byte: a wrong-bytes read is a failure, a miss is not.
 *
 *  1  store, lookup (longest indexed run), fetch round trip; stats; queue full; tier 2 off;
 *     cache_new errors
 *  2  a second process (fork) on the same arena and Redis fetches the first one's blocks and
 *     stores its own
 *  3  persistence: a new handle after cache_free, and after a process killed with SIGKILL
 *  4  arena header mismatches (seed, block_bytes, magic) re-initialise it, naming the field;
 *     the index resets; a handle attached before the re-initialisation goes stale (misses)
 *  5  eviction in an 8-slot arena: counts, LRU order, consistency
 *  6  4 processes x 2 handles (one thread each) of random stores/lookups/fetches on 12 slots
 *  7  a corrupted slot is a torn miss; a writer that died holding a slot's seqlock is taken
 *     over, a live one is not
 *  8  Redis stopped (SIGSTOP), resumed, killed and restarted: bounded latency, dropped stores,
 *     reconnection after backoff
 *  9  AUTH: password and ACL user, right and wrong; SELECT; SCRIPT FLUSH (EVALSHA falls back
 *     to EVAL) and FLUSHALL (the index is initialised again) under a live handle
 * 10  permissions: a new arena is 0600 whatever the umask; an existing one that grants group or
 *     other access, or is a symbolic link, is refused (cache_new fails naming the fix), and is
 *     attached again once chmod 600
 * 11  the KV name secret file (cache_secret_load): created 0600, read back; refused when
 *     group/other-accessible, a symbolic link, another user's or of the wrong size
 * Every stored block carries the parent name and tokens it was computed from (derived from its
 * name here): a fetch must return them with the KV (begin_block / fetch_block).
 *
 * White-box parts (7, 4) poke the arena file through their own mapping, using the layout that
 * cache.h documents (4096-byte header starting with the magic, 64-byte slot headers: seqlock
 * word, name, generation, checksum) and the seqlock word of cache/arena.c (bit 0 odd while
 * written, owner pid in bits 1..31, lock time in ms at byte 32 of the slot header). */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "check.h"
#include "support/cache_test.h"

#define SEED 0x5eed5eed12345678ull
#define BB_SMALL ((size_t)4096 * 3 + 123) /* 63 slots in 1 MiB */
#define BB_8 ((size_t)4096 * 30 + 123)    /* 8 slots in 1 MiB */
#define BB_12 ((size_t)4096 * 20 + 123)   /* 12 slots in 1 MiB */

/* ---- helpers: what a block was computed from ---- */

/* What a stored block was computed from (cache_store_begin's parent and tokens): derived from
 * its name, so that fetch_block can check the slot gave back the meta stored with the block. */
enum { MAX_BT = 32 };
static uint64_t meta_parent(uint64_t name) { return ct_mix(name ^ 0xa5a5a5a5ull); }
static void meta_tokens(int32_t *t, uint64_t parent)
{
    for (int i = 0; i < MAX_BT; i++) t[i] = (int32_t)(ct_mix(parent + (uint64_t)i) & 0x7fff);
}

static void *begin_block(cache_t *c, uint64_t name)
{
    int32_t t[MAX_BT];
    meta_tokens(t, meta_parent(name));
    return cache_store_begin(c, name, meta_parent(name), t);
}

/* cache_fetch, plus a check that the parent and the 16 tokens came back with the block: when
 * they did not, dst's first byte is flipped, so the caller's content check (ct_content_ok) fails
 * as for wrong bytes (no CHECK here: the counters are not thread-safe, and threads call it). */
static int fetch_block(cache_t *c, int i, void *dst)
{
    uint64_t parent = 0;
    int32_t got[MAX_BT], want[MAX_BT];
    int rc = cache_fetch(c, i, dst, &parent, got);
    if (rc == 0) {
        meta_tokens(want, parent);
        if (memcmp(got, want, 16 * sizeof *got) != 0) ((uint8_t *)dst)[0] ^= 0xff;
    }
    return rc;
}

/* ---- helpers: log capture (the cache logs from its writer thread too) ---- */

typedef struct {
    pthread_mutex_t mu;
    char text[65536];
    size_t len;
} logcap_t;

static void cap_init(logcap_t *l)
{
    pthread_mutex_init(&l->mu, NULL);
    l->len = 0;
    l->text[0] = 0;
}

static void cap_log(void *arg, int level, const char *msg)
{
    logcap_t *l = arg;
    static const char *const lv[4] = {"E", "W", "I", "D"};
    pthread_mutex_lock(&l->mu);
    int w = snprintf(l->text + l->len, sizeof l->text - l->len, "%s %s\n", lv[level & 3], msg);
    if (w > 0 && l->len + (size_t)w < sizeof l->text) l->len += (size_t)w;
    pthread_mutex_unlock(&l->mu);
    if (getenv("TEST_CACHE_VERBOSE")) fprintf(stderr, "  [cache %s] %s\n", lv[level & 3], msg);
}

static int cap_has(logcap_t *l, const char *s)
{
    pthread_mutex_lock(&l->mu);
    int r = strstr(l->text, s) != NULL;
    pthread_mutex_unlock(&l->mu);
    return r;
}

/* cap_has within ms (polled): for lines another thread may still be about to log. */
static int cap_wait(logcap_t *l, const char *s, int ms)
{
    for (int64_t end = ct_now_ms() + ms;; ct_sleep_ms(10))
        if (cap_has(l, s) || ct_now_ms() >= end) return cap_has(l, s);
}

/* A line that holds all of a, b (b may be NULL). */
static int cap_line_has(logcap_t *l, const char *a, const char *b)
{
    int r = 0;
    pthread_mutex_lock(&l->mu);
    for (const char *p = l->text; *p && !r;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line - 1 ? n : sizeof line - 1), p);
        r = strstr(line, a) && (!b || strstr(line, b));
        p += n + (e ? 1 : 0);
    }
    pthread_mutex_unlock(&l->mu);
    return r;
}

static void cap_clear(logcap_t *l)
{
    pthread_mutex_lock(&l->mu);
    l->len = 0;
    l->text[0] = 0;
    pthread_mutex_unlock(&l->mu);
}

/* Waits (5 s at most) until process pid is stopped (running 0) or not (running 1). */
static int wait_proc_state(int pid, int running)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    for (int i = 0; i < 500; i++) {
        FILE *f = fopen(path, "r");
        if (!f) return 0;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *p = strrchr(buf, ')');
        if (p && p[1] == ' ') {
            int stopped = p[2] == 'T' || p[2] == 't';
            if (stopped != running) return 1;
        }
        ct_sleep_ms(10);
    }
    return 0;
}

/* ---- helpers: the cache ---- */

typedef struct {
    char dir[256];  /* arenas live here */
    ct_redis_t redis;  /* the main server */
} env_t;

static cache_config_t cfg_for(const char *arena, int port, const char *host_id, logcap_t *lc)
{
    cache_config_t c;
    cache_config_default(&c);
    c.arena_path = arena;
    c.arena_mb = 1;
    c.redis_host = port ? "127.0.0.1" : "";
    c.redis_port = port;
    c.namespace_ = "spwtest";
    c.host_id = host_id;
    c.connect_timeout_ms = 500; /* generous: ASan on 2 busy cores */
    c.cmd_timeout_ms = 500;
    c.backoff_min_ms = 20;
    c.backoff_max_ms = 200;
    c.write_queue = 16;
    c.log_level = 3;
    c.log_fn = cap_log;
    c.log_arg = lc;
    return c;
}

static void arena_path(char *out, size_t n, const env_t *e, const char *name)
{
    snprintf(out, n, "%s/%s.arena", e->dir, name);
}

static int store(cache_t *c, uint64_t name, size_t bb)
{
    void *b = begin_block(c, name);
    if (!b) return 0;
    ct_fill(b, bb, name);
    cache_store_commit(c, b);
    return 1;
}

static cache_stats_t stats(cache_t *c)
{
    cache_stats_t st;
    cache_stats(c, &st);
    return st;
}

/* Waits (5 s at most) until the handle has indexed `stores` blocks; 1 when it did. */
static int wait_stores(cache_t *c, uint64_t stores)
{
    int64_t end = ct_now_ms() + 5000;
    while (stats(c).stores < stores) {
        if (ct_now_ms() > end) return 0;
        ct_sleep_ms(2);
    }
    return 1;
}

static int wait_dropped(cache_t *c, uint64_t dropped)
{
    int64_t end = ct_now_ms() + 5000;
    while (stats(c).stores_dropped < dropped) {
        if (ct_now_ms() > end) return 0;
        ct_sleep_ms(2);
    }
    return 1;
}

/* Fetches blocks [0, k) of the last lookup; the number that hit with the right bytes; *wrong
 * counts hits with wrong bytes. */
static int fetch_all(cache_t *c, const uint64_t *names, int k, size_t bb, int *wrong)
{
    uint8_t *buf = malloc(bb);
    int ok = 0;
    for (int i = 0; i < k; i++) {
        if (fetch_block(c, i, buf)) continue;
        if (ct_content_ok(buf, bb, names[i]))
            ok++;
        else if (wrong)
            (*wrong)++;
    }
    free(buf);
    return ok;
}

static int check_ok(cache_t *c)
{
    char err[512];
    int r = cache_check(c, err, sizeof err);
    if (r) fprintf(stderr, "  cache_check: %s\n", err);
    return r == 0;
}

/* A child process reports through its exit status: 0 when none of its checks failed. */
static void child_exit(int failures_at_fork) { _exit(check_failures_ > failures_at_fork ? 1 : 0); }

static int child_ok(pid_t pid)
{
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Maps the arena file for white-box pokes. */
typedef struct {
    uint8_t *p;
    size_t len;
} raw_map_t;

static int raw_map(raw_map_t *m, const char *path)
{
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    struct stat st;
    fstat(fd, &st);
    m->len = (size_t)st.st_size;
    m->p = mmap(NULL, m->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return m->p == MAP_FAILED ? -1 : 0;
}

static _Atomic uint64_t *slot_word(raw_map_t *m, int slot, int word)
{
    return (_Atomic uint64_t *)(void *)(m->p + 4096 + (size_t)slot * 64 + (size_t)word * 8);
}

static int find_slot(raw_map_t *m, int n_slots, uint64_t name)
{
    for (int s = 0; s < n_slots; s++)
        if (atomic_load(slot_word(m, s, 1)) == name) return s;
    return -1;
}

static size_t slot_data_off(int n_slots, size_t bb, int slot)
{
    size_t hdr = 4096 + ((size_t)n_slots * 64 + 4095) / 4096 * 4096;
    return hdr + (size_t)slot * ((bb + 4095) / 4096 * 4096);
}

/* ---- 1: round trip ---- */

static void test_round_trip(env_t *e)
{
    fprintf(stderr, "1: store / lookup / fetch round trip\n");
    cache_config_t d;
    cache_config_default(&d);
    CHECK(!strcmp(d.arena_path, "") && d.arena_mb == 1024); /* "": the per-user default */
    CHECK(!strcmp(d.redis_host, "") && d.redis_port == 6379 && !strcmp(d.redis_user, "") &&
          !strcmp(d.redis_password, "") && d.redis_db == 0);
    CHECK(!strcmp(d.namespace_, "spillway") && !strcmp(d.host_id, ""));
    CHECK(d.connect_timeout_ms == 200 && d.cmd_timeout_ms == 50 && d.backoff_min_ms == 100 &&
          d.backoff_max_ms == 5000 && d.write_queue == 64 && d.log_level == 2 && !d.log_fn);
    logcap_t lc;
    cap_init(&lc);
    char path[400];
    arena_path(path, sizeof path, e, "t1");
    cache_config_t cfg = cfg_for(path, e->redis.port, "t1", &lc);
    cache_geometry_t geo = {SEED, 16, BB_SMALL};
    char err[256];
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (!c) return;
    cache_stats_t st = stats(c);
    CHECK(st.arena_slots == 63 && st.redis_up == 1);
    CHECK(cap_has(&lc, "new, 63 slots"));
    CHECK(check_ok(c)); /* empty index: every slot free */

    uint64_t ch[10];
    ct_chain(ch, 10, 1);
    CHECK(cache_lookup(c, ch, 10) == 0);
    for (int i = 0; i < 6; i++) CHECK(store(c, ch[i], BB_SMALL));
    CHECK(wait_stores(c, 6));
    CHECK(cache_lookup(c, ch, 10) == 6);
    int wrong = 0;
    CHECK(fetch_all(c, ch, 6, BB_SMALL, &wrong) == 6 && wrong == 0);
    uint8_t *buf = malloc(BB_SMALL);
    CHECK(fetch_block(c, 6, buf) == -1);  /* beyond the lookup's result */
    CHECK(fetch_block(c, -1, buf) == -1);
    st = stats(c);
    CHECKF(st.lookups == 20 && st.hits == 6 && st.stores == 6 && st.stores_dropped == 0 &&
               st.misses_torn == 0 && st.evictions == 0 && st.redis_errors == 0 &&
               st.arena_used == 6,
           "lookups %" PRIu64 " hits %" PRIu64 " stores %" PRIu64 " dropped %" PRIu64
           " errors %" PRIu64 " used %d", st.lookups, st.hits, st.stores, st.stores_dropped,
           st.redis_errors, st.arena_used);
    /* the longest leading run: a hole stops it */
    uint64_t holey[4] = {ch[0], ch[1], 0xdeadbeefull, ch[3]};
    CHECK(cache_lookup(c, holey, 4) == 2);
    CHECK(cache_lookup(c, ch + 1, 3) == 3); /* a run need not start at a chain's head */
    CHECK(cache_lookup(c, ch, 0) == 0);
    /* known indexed: not wanted again */
    CHECK(begin_block(c, ch[0]) == NULL);
    CHECK(begin_block(c, ch[5]) == NULL);
    /* cancel gives the buffer back; the name may be offered again */
    void *b = begin_block(c, ch[6]);
    CHECK(b != NULL);
    cache_store_cancel(c, b);
    CHECK(store(c, ch[6], BB_SMALL));
    CHECK(wait_stores(c, 7));
    CHECK(cache_lookup(c, ch, 10) == 7);
    CHECK(fetch_all(c, ch, 7, BB_SMALL, &wrong) == 7 && wrong == 0);
    CHECK(check_ok(c));

    /* a second handle (same process) with a one-buffer queue: a lent buffer fills it */
    logcap_t lc2;
    cap_init(&lc2);
    cache_config_t cfg2 = cfg_for(path, e->redis.port, "t1", &lc2);
    cfg2.write_queue = 1;
    cache_t *c2 = cache_new(&cfg2, &geo, err, sizeof err);
    CHECKF(c2, "%s", err);
    if (c2) {
        CHECK(cap_has(&lc2, "attached"));
        void *b1 = begin_block(c2, ch[7]);
        CHECK(b1 != NULL);
        CHECK(begin_block(c2, ch[8]) == NULL);
        CHECK(stats(c2).stores_dropped == 1);
        ct_fill(b1, BB_SMALL, ch[7]);
        cache_store_commit(c2, b1);
        CHECK(wait_stores(c2, 1));
        CHECK(cache_lookup(c2, ch, 10) == 8);
        CHECK(fetch_all(c2, ch, 8, BB_SMALL, &wrong) == 8 && wrong == 0);
        cache_free(c2);
    }
    CHECK(cache_lookup(c, ch, 10) == 8);
    free(buf);
    cache_free(c);

    /* tier 2 off: the arena is mapped, nothing is looked up or stored */
    cache_config_t off = cfg_for(path, 0, "t1", &lc);
    c = cache_new(&off, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (c) {
        CHECK(cache_lookup(c, ch, 10) == 0);
        CHECK(begin_block(c, 42) == NULL);
        CHECK(cache_check(c, err, sizeof err) == -1);
        st = stats(c);
        CHECK(st.redis_up == 0 && st.arena_slots == 63 && st.stores_dropped == 0);
        cache_free(c);
    }

    /* errors: too small for one slot, a path that cannot be created */
    cache_geometry_t huge = {SEED, 16, (size_t)2 << 20};
    err[0] = 'x';
    char p2[400];
    arena_path(p2, sizeof p2, e, "t1-small");
    off.arena_path = p2;
    c = cache_new(&off, &huge, err, sizeof err);
    CHECKF(!c && strstr(err, "too small"), "%s", err);
    unlink(p2);
    off.arena_path = "/nonexistent-dir/x.arena";
    c = cache_new(&off, &geo, err, sizeof err);
    CHECKF(!c && strstr(err, "/nonexistent-dir/x.arena"), "%s", err);
    off.arena_path = path;
    off.arena_mb = 0;
    c = cache_new(&off, &geo, err, sizeof err);
    CHECK(!c && err[0]);
}

/* ---- 2, 3: another process; persistence ---- */

static void test_processes(env_t *e)
{
    fprintf(stderr, "2: a second process finds and fetches the first one's blocks\n");
    logcap_t lc;
    cap_init(&lc);
    char path[400];
    arena_path(path, sizeof path, e, "t1"); /* test 1's arena and index */
    cache_config_t cfg = cfg_for(path, e->redis.port, "t1", &lc);
    cache_geometry_t geo = {SEED, 16, BB_SMALL};
    char err[256];
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (!c) return;
    uint64_t ch[10], chb[5], chc[4];
    ct_chain(ch, 10, 1);
    ct_chain(chb, 5, 2);
    ct_chain(chc, 4, 3);
    CHECK(cache_lookup(c, ch, 10) == 8);

    int base = check_failures_;
    pid_t pid = fork();
    if (pid == 0) {
        logcap_t clc;
        cap_init(&clc);
        cache_config_t ccfg = cfg_for(path, e->redis.port, "t1", &clc);
        cache_t *cc = cache_new(&ccfg, &geo, err, sizeof err);
        CHECKF(cc, "%s", err);
        if (!cc) child_exit(base);
        int wrong = 0;
        CHECK(cache_lookup(cc, ch, 10) == 8);
        CHECK(fetch_all(cc, ch, 8, BB_SMALL, &wrong) == 8 && wrong == 0);
        for (int i = 0; i < 5; i++) CHECK(store(cc, chb[i], BB_SMALL));
        CHECK(wait_stores(cc, 5));
        cache_free(cc);
        child_exit(base);
    }
    CHECK(pid > 0 && child_ok(pid));
    int wrong = 0;
    CHECK(cache_lookup(c, chb, 5) == 5);
    CHECK(fetch_all(c, chb, 5, BB_SMALL, &wrong) == 5 && wrong == 0);

    fprintf(stderr, "3: persistence across cache_free and a process killed with SIGKILL\n");
    cache_free(c);
    cap_clear(&lc);
    c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (!c) return;
    CHECK(cap_has(&lc, "attached") && !cap_has(&lc, "re-initialising"));
    CHECK(cache_lookup(c, ch, 10) == 8);
    CHECK(fetch_all(c, ch, 8, BB_SMALL, &wrong) == 8 && wrong == 0);

    base = check_failures_;
    pid = fork();
    if (pid == 0) {
        logcap_t clc;
        cap_init(&clc);
        cache_config_t ccfg = cfg_for(path, e->redis.port, "t1", &clc);
        cache_t *cc = cache_new(&ccfg, &geo, err, sizeof err);
        if (!cc) _exit(1);
        for (int i = 0; i < 4; i++) store(cc, chc[i], BB_SMALL);
        if (!wait_stores(cc, 4)) _exit(1);
        kill(getpid(), SIGKILL); /* no cache_free, no exit handlers */
        _exit(2);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    CHECK(cache_lookup(c, chc, 4) == 4);
    CHECK(fetch_all(c, chc, 4, BB_SMALL, &wrong) == 4 && wrong == 0);
    cache_free(c);
    c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (!c) return;
    CHECK(cache_lookup(c, chc, 4) == 4);
    CHECK(fetch_all(c, chc, 4, BB_SMALL, &wrong) == 4 && wrong == 0);
    CHECK(check_ok(c));
    cache_free(c);
}

/* ---- 4: header mismatches ---- */

static void test_mismatch(env_t *e)
{
    fprintf(stderr, "4: a mismatched arena header is re-initialised, never read\n");
    char path[400], err[256];
    arena_path(path, sizeof path, e, "t4");
    logcap_t la, lb;
    cap_init(&la);
    cap_init(&lb);
    cache_config_t ca = cfg_for(path, e->redis.port, "t4", &la);
    cache_config_t cb = cfg_for(path, e->redis.port, "t4", &lb);
    cache_geometry_t geo = {SEED, 16, BB_SMALL};
    cache_t *a = cache_new(&ca, &geo, err, sizeof err);
    CHECKF(a, "%s", err);
    if (!a) return;
    uint64_t ch[5];
    ct_chain(ch, 5, 4);
    for (int i = 0; i < 5; i++) store(a, ch[i], BB_SMALL);
    CHECK(wait_stores(a, 5));
    CHECK(cache_lookup(a, ch, 5) == 5);

    /* another model (seed) attaches: re-initialises, naming the field */
    cache_geometry_t other_seed = {SEED ^ 0xabcdefull, 16, BB_SMALL};
    cache_t *b = cache_new(&cb, &other_seed, err, sizeof err);
    CHECKF(b, "%s", err);
    CHECK(cap_line_has(&lb, "model fingerprint (seed)", "re-initialising"));
    CHECK(cap_line_has(&lb, path, "re-initialising"));
    if (b) {
        CHECK(cache_lookup(b, ch, 5) == 0); /* its own index (keys carry the seed) */
        CHECK(check_ok(b));
    }
    /* the handle attached before: stale, misses only, stores refused */
    uint8_t *buf = malloc(BB_SMALL);
    CHECK(fetch_block(a, 0, buf) == -1); /* the slot headers were zeroed */
    CHECK(cache_lookup(a, ch, 5) == 0);
    CHECK(cap_has(&la, "re-initialised by another process"));
    CHECK(begin_block(a, 77) == NULL);
    cache_free(a);
    cache_free(b);

    /* the first model again: the arena is re-initialised again, its old index reset */
    cap_clear(&la);
    a = cache_new(&ca, &geo, err, sizeof err);
    CHECKF(a, "%s", err);
    if (!a) return;
    CHECK(cap_line_has(&la, "seed", "re-initialising"));
    CHECK(cache_lookup(a, ch, 5) == 0);
    /* logged by whichever of its Redis connections runs the index's init first: cache_new's
     * own, or the fleet thread's, which may not have logged yet */
    CHECK(cap_wait(&la, "index reset", 5000));
    CHECK(stats(a).arena_used == 0);
    CHECK(check_ok(a));
    for (int i = 0; i < 5; i++) store(a, ch[i], BB_SMALL);
    CHECK(wait_stores(a, 5));
    CHECK(cache_lookup(a, ch, 5) == 5);
    int wrong = 0;
    CHECK(fetch_all(a, ch, 5, BB_SMALL, &wrong) == 5 && wrong == 0);
    cache_free(a);

    /* other block geometry */
    cap_clear(&lb);
    cache_geometry_t other_bb = {SEED, 16, BB_SMALL + 64};
    b = cache_new(&cb, &other_bb, err, sizeof err);
    CHECKF(b, "%s", err);
    CHECK(cap_line_has(&lb, "block_bytes", "re-initialising"));
    if (b) {
        CHECK(cache_lookup(b, ch, 5) == 0);
        CHECK(check_ok(b));
        cache_free(b);
    }
    cap_clear(&lb);
    cache_geometry_t other_bt = {SEED, 32, BB_SMALL + 64};
    b = cache_new(&cb, &other_bt, err, sizeof err);
    CHECK(b && cap_line_has(&lb, "block_tokens", "re-initialising"));
    if (b) cache_free(b);

    /* a corrupted magic */
    raw_map_t m;
    CHECK(raw_map(&m, path) == 0);
    m.p[3] ^= 0x20;
    munmap(m.p, m.len);
    cap_clear(&lb);
    b = cache_new(&cb, &other_bt, err, sizeof err);
    CHECKF(b, "%s", err);
    CHECK(cap_line_has(&lb, "magic", "re-initialising"));
    if (b) {
        CHECK(cache_lookup(b, ch, 5) == 0);
        CHECK(cap_wait(&lb, "index reset", 5000)); /* as above */
        CHECK(check_ok(b));
        cache_free(b);
    }
    /* a larger arena (n_slots) */
    cap_clear(&lb);
    cb.arena_mb = 2;
    b = cache_new(&cb, &other_bt, err, sizeof err);
    CHECK(b && cap_line_has(&lb, "n_slots", "re-initialising"));
    if (b) cache_free(b);
    free(buf);
}

/* ---- 5: eviction ---- */

static void test_eviction(env_t *e)
{
    fprintf(stderr, "5: eviction in an 8-slot arena\n");
    char path[400], err[256];
    arena_path(path, sizeof path, e, "t5");
    logcap_t lc;
    cap_init(&lc);
    cache_config_t cfg = cfg_for(path, e->redis.port, "t5", &lc);
    cache_geometry_t geo = {SEED, 16, BB_8};
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (!c) return;
    CHECK(stats(c).arena_slots == 8);
    uint64_t nm[51];
    ct_chain(nm, 51, 5);
    int stored = 0;
    for (int i = 0; i < 50; i++) {
        stored += store(c, nm[i], BB_8);
        CHECK(wait_stores(c, (uint64_t)i + 1)); /* one at a time: a deterministic LRU */
    }
    CHECK(stored == 50);
    cache_stats_t st = stats(c);
    CHECKF(st.stores == 50 && st.evictions == 42 && st.arena_used == 8,
           "stores %" PRIu64 " evictions %" PRIu64 " used %d", st.stores, st.evictions,
           st.arena_used);
    CHECK(check_ok(c));
    int wrong = 0;
    CHECK(cache_lookup(c, nm + 42, 8) == 8);
    CHECK(fetch_all(c, nm + 42, 8, BB_8, &wrong) == 8 && wrong == 0);
    CHECK(cache_lookup(c, nm, 1) == 0);
    CHECK(cache_lookup(c, nm + 41, 1) == 0);
    /* LRU: the lookup above touched 42 (head, most recent) .. 49 (tail, least); touch 43 */
    CHECK(cache_lookup(c, nm + 43, 1) == 1);
    CHECK(store(c, nm[50], BB_8));
    CHECK(wait_stores(c, 51));
    CHECK(cache_lookup(c, nm + 49, 1) == 0);
    CHECK(cache_lookup(c, nm + 43, 1) == 1);
    CHECK(cache_lookup(c, nm + 42, 1) == 1);
    CHECK(cache_lookup(c, nm + 50, 1) == 1);
    CHECK(fetch_all(c, nm + 50, 1, BB_8, &wrong) == 1 && wrong == 0);
    CHECK(stats(c).evictions == 43);
    /* an evicted name may be offered again (its lookup miss cleared the local memory) */
    CHECK(cache_lookup(c, nm, 1) == 0);
    CHECK(store(c, nm[0], BB_8));
    CHECK(wait_stores(c, 52));
    CHECK(cache_lookup(c, nm, 1) == 1);
    CHECK(check_ok(c));
    cache_free(c);
}

/* ---- 6: concurrency ---- */

#define CC_PROCS 4
#define CC_THREADS 2
#define CC_OPS 2000
#define CC_CHAINS 6
#define CC_LEN 4

typedef struct {
    _Atomic long wrong, hits, fetch_miss, found, offered; /* this test's own counts */
    _Atomic long evictions, dropped, torn, errors;         /* the handles' stats, summed */
    _Atomic long failed_new;
} cc_shared_t;

typedef struct {
    const char *path;
    int port;
    cc_shared_t *sh;
    unsigned seed;
} cc_arg_t;

static void *cc_thread(void *arg)
{
    cc_arg_t *a = arg;
    logcap_t lc;
    cap_init(&lc);
    cache_config_t cfg = cfg_for(a->path, a->port, "t6", &lc);
    cfg.write_queue = 4;
    cfg.cmd_timeout_ms = 2000; /* 16 threads on 2 cores: no timeouts wanted here */
    cfg.log_level = 1;
    cache_geometry_t geo = {SEED, 16, BB_12};
    char err[256];
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    if (!c) {
        atomic_fetch_add(&a->sh->failed_new, 1);
        return NULL;
    }
    uint64_t chains[CC_CHAINS][CC_LEN];
    for (int i = 0; i < CC_CHAINS; i++) ct_chain(chains[i], CC_LEN, 600 + (uint64_t)i);
    uint8_t *buf = malloc(BB_12);
    unsigned s = a->seed;
    for (int op = 0; op < CC_OPS; op++) {
        int ch = (int)(rand_r(&s) % CC_CHAINS);
        if (rand_r(&s) % 10 < 4) {
            uint64_t name = chains[ch][rand_r(&s) % CC_LEN];
            void *b = begin_block(c, name);
            if (b) {
                atomic_fetch_add(&a->sh->offered, 1);
                ct_fill(b, BB_12, name);
                if (rand_r(&s) % 20 == 0)
                    cache_store_cancel(c, b);
                else
                    cache_store_commit(c, b);
            }
        } else {
            int len = 1 + (int)(rand_r(&s) % CC_LEN);
            int k = cache_lookup(c, chains[ch], len);
            atomic_fetch_add(&a->sh->found, k);
            for (int i = 0; i < k; i++) {
                if (fetch_block(c, i, buf)) {
                    atomic_fetch_add(&a->sh->fetch_miss, 1);
                } else if (ct_content_ok(buf, BB_12, chains[ch][i])) {
                    atomic_fetch_add(&a->sh->hits, 1);
                } else {
                    atomic_fetch_add(&a->sh->wrong, 1);
                }
            }
        }
    }
    free(buf);
    cache_stats_t st;
    cache_stats(c, &st);
    atomic_fetch_add(&a->sh->evictions, (long)st.evictions);
    atomic_fetch_add(&a->sh->torn, (long)st.misses_torn);
    atomic_fetch_add(&a->sh->dropped, (long)st.stores_dropped);
    atomic_fetch_add(&a->sh->errors, (long)st.redis_errors);
    cache_free(c); /* drains the writer */
    return NULL;
}

static void test_concurrency(env_t *e)
{
    fprintf(stderr, "6: %d processes x %d handles, %d random ops each, 12 slots\n", CC_PROCS,
            CC_THREADS, CC_OPS);
    char path[400], err[256];
    arena_path(path, sizeof path, e, "t6");
    cc_shared_t *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    if (sh == MAP_FAILED) return;
    memset(sh, 0, sizeof *sh);
    int64_t t0 = ct_now_ms();
    pid_t pids[CC_PROCS];
    if (getenv("SPILLWAY_TEST_NO_FORK")) {
        /* ThreadSanitizer: the same handles as threads of this process (a forked child that
         * starts threads is beyond it) */
        pthread_t th[CC_PROCS * CC_THREADS];
        cc_arg_t args[CC_PROCS * CC_THREADS];
        for (int t = 0; t < CC_PROCS * CC_THREADS; t++) {
            args[t] = (cc_arg_t){path, e->redis.port, sh, (unsigned)(t + 1)};
            pthread_create(&th[t], NULL, cc_thread, &args[t]);
        }
        for (int t = 0; t < CC_PROCS * CC_THREADS; t++) pthread_join(th[t], NULL);
        for (int p = 0; p < CC_PROCS; p++) pids[p] = 0;
    }
    for (int p = 0; p < CC_PROCS && !getenv("SPILLWAY_TEST_NO_FORK"); p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            pthread_t th[CC_THREADS];
            cc_arg_t args[CC_THREADS];
            for (int t = 0; t < CC_THREADS; t++) {
                args[t] = (cc_arg_t){path, e->redis.port, sh, (unsigned)(p * 100 + t + 1)};
                pthread_create(&th[t], NULL, cc_thread, &args[t]);
            }
            for (int t = 0; t < CC_THREADS; t++) pthread_join(th[t], NULL);
            _exit(0);
        }
    }
    for (int p = 0; p < CC_PROCS && !getenv("SPILLWAY_TEST_NO_FORK"); p++)
        CHECK(pids[p] > 0 && child_ok(pids[p]));
    fprintf(stderr, "  %lld ms: %ld offered, %ld dropped, %ld evictions; %ld found, %ld fetched "
                    "right, %ld fetch misses (%ld torn), %ld wrong, %ld redis errors\n",
            (long long)(ct_now_ms() - t0), (long)sh->offered, (long)sh->dropped, (long)sh->evictions,
            (long)sh->found, (long)sh->hits, (long)sh->fetch_miss, (long)sh->torn, (long)sh->wrong,
            (long)sh->errors);
    CHECK(sh->failed_new == 0);
    CHECK(sh->errors == 0);
    CHECK(sh->evictions > 0);
    CHECK(sh->torn == sh->fetch_miss);
    CHECK(sh->wrong == 0);
    CHECK(sh->hits > 0 && sh->offered > 0);
    logcap_t lc;
    cap_init(&lc);
    cache_config_t cfg = cfg_for(path, e->redis.port, "t6", &lc);
    cache_geometry_t geo = {SEED, 16, BB_12};
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (c) {
        CHECK(check_ok(c));
        /* what is indexed is right */
        uint64_t chains[CC_CHAINS][CC_LEN];
        int total = 0, wrong = 0;
        for (int i = 0; i < CC_CHAINS; i++) {
            ct_chain(chains[i], CC_LEN, 600 + (uint64_t)i);
            int k = cache_lookup(c, chains[i], CC_LEN);
            CHECK(fetch_all(c, chains[i], k, BB_12, &wrong) == k);
            total += k;
        }
        CHECK(wrong == 0 && total <= 12);
        CHECK(check_ok(c));
        cache_free(c);
    }
    munmap(sh, sizeof *sh);
}

/* ---- 7: torn / corrupted / abandoned slots ---- */

static void set_all_odd(raw_map_t *m, int n_slots, pid_t owner)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    for (int s = 0; s < n_slots; s++) {
        uint64_t w = atomic_load(slot_word(m, s, 0));
        atomic_store(slot_word(m, s, 4), (uint64_t)ms);
        atomic_store(slot_word(m, s, 0), (((w >> 32) + 1) << 32) | ((uint64_t)owner << 1) | 1);
    }
}

static void set_all_even(raw_map_t *m, int n_slots)
{
    for (int s = 0; s < n_slots; s++) {
        uint64_t w = atomic_load(slot_word(m, s, 0));
        if (w & 1) atomic_store(slot_word(m, s, 0), ((w >> 32) + 1) << 32);
    }
}

static void test_torn(env_t *e)
{
    fprintf(stderr, "7: corrupted and abandoned slots\n");
    char path[400], err[256];
    arena_path(path, sizeof path, e, "t7");
    logcap_t lc;
    cap_init(&lc);
    cache_config_t cfg = cfg_for(path, e->redis.port, "t7", &lc);
    cache_geometry_t geo = {SEED, 16, BB_SMALL};
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (!c) return;
    int n = stats(c).arena_slots;
    uint64_t ch[3];
    ct_chain(ch, 3, 7);
    for (int i = 0; i < 3; i++) store(c, ch[i], BB_SMALL);
    CHECK(wait_stores(c, 3));
    raw_map_t m;
    CHECK(raw_map(&m, path) == 0);
    int slot = find_slot(&m, n, ch[1]);
    CHECK(slot >= 0);
    if (slot < 0) return;
    uint8_t *byte = m.p + slot_data_off(n, BB_SMALL, slot) + 1000;
    *byte ^= 0x01;
    uint8_t *buf = malloc(BB_SMALL);
    CHECK(cache_lookup(c, ch, 3) == 3);
    CHECK(fetch_block(c, 0, buf) == 0 && ct_content_ok(buf, BB_SMALL, ch[0]));
    CHECK(fetch_block(c, 1, buf) == -1);
    CHECK(fetch_block(c, 2, buf) == 0 && ct_content_ok(buf, BB_SMALL, ch[2]));
    CHECK(stats(c).misses_torn == 1);
    CHECK(cache_check(c, err, sizeof err) == -1 && strstr(err, "checksum"));
    *byte ^= 0x01;
    CHECK(fetch_block(c, 1, buf) == 0 && ct_content_ok(buf, BB_SMALL, ch[1]));
    CHECK(check_ok(c));
    /* a header naming another generation is a miss too */
    uint64_t g = atomic_load(slot_word(&m, slot, 2));
    atomic_store(slot_word(&m, slot, 2), g + 1);
    CHECK(fetch_block(c, 1, buf) == -1);
    atomic_store(slot_word(&m, slot, 2), g);

    /* a writer that died holding the seqlock: the slots read as misses, and a new writer that
     * gets such a slot from alloc takes it over */
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    set_all_odd(&m, n, dead);
    CHECK(cache_lookup(c, ch, 3) == 3);
    CHECK(fetch_block(c, 0, buf) == -1);
    uint64_t x[2];
    ct_chain(x, 2, 77);
    uint64_t stores0 = stats(c).stores;
    CHECK(store(c, x[0], BB_SMALL));
    CHECK(wait_stores(c, stores0 + 1));
    CHECK(cache_lookup(c, x, 1) == 1);
    CHECK(fetch_block(c, 0, buf) == 0 && ct_content_ok(buf, BB_SMALL, x[0]));
    set_all_even(&m, n);
    CHECK(check_ok(c));
    CHECK(cache_lookup(c, ch, 3) == 3);
    CHECK(fetch_block(c, 0, buf) == 0 && ct_content_ok(buf, BB_SMALL, ch[0]));

    /* a live writer holds every slot: the store is dropped, its slot given back */
    set_all_odd(&m, n, getpid());
    cache_stats_t st0 = stats(c);
    CHECK(store(c, x[1], BB_SMALL));
    CHECK(wait_dropped(c, st0.stores_dropped + 1));
    CHECK(stats(c).stores == st0.stores);
    set_all_even(&m, n);
    CHECK(cache_lookup(c, x + 1, 1) == 0);
    CHECK(check_ok(c));
    CHECK(stats(c).arena_used == st0.arena_used);
    munmap(m.p, m.len);
    free(buf);
    cache_free(c);
}

/* ---- 8: Redis stopped, killed, restarted ---- */

/* Starts redis-server on a given port in dir (the restart of a killed server on its port, which
 * redis-server.sh cannot do: it picks a free port). Dies with this process. */
static pid_t redis_restart_on(int port, const char *dir)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        char p[16], lf[512];
        snprintf(p, sizeof p, "%d", port);
        snprintf(lf, sizeof lf, "%s/redis.log", dir);
        execlp("redis-server", "redis-server", "--bind", "127.0.0.1", "--port", p, "--save", "",
               "--appendonly", "no", "--dir", dir, "--logfile", lf, "--daemonize", "no",
               (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100 && pid > 0; i++) {
        redisReply *r = ct_redis_cmd(port, NULL, NULL, 0, "PING%s", "");
        int ok = r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG");
        if (r) freeReplyObject(r);
        if (ok) return pid;
        ct_sleep_ms(50);
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return -1;
}

static void test_redis_faults(env_t *e, const char *workdir)
{
    fprintf(stderr, "8: Redis stopped, resumed, killed, restarted\n");
    ct_redis_t r;
    char rdir[400];
    snprintf(rdir, sizeof rdir, "%s/r8", workdir);
    if (ct_redis_start(&r, rdir)) {
        CHECKF(0, "cannot start a redis-server in %s", rdir);
        return;
    }
    char path[400], err[256];
    arena_path(path, sizeof path, e, "t8");
    logcap_t lc;
    cap_init(&lc);
    cache_config_t cfg = cfg_for(path, r.port, "t8", &lc);
    cfg.connect_timeout_ms = 200;
    cfg.cmd_timeout_ms = 100;
    cfg.backoff_min_ms = 50;
    cfg.backoff_max_ms = 400;
    const int64_t bound = cfg.connect_timeout_ms + 2 * cfg.cmd_timeout_ms + 1700; /* 2 s */
    cache_geometry_t geo = {SEED, 16, BB_SMALL};
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (!c) goto out;
    uint64_t ch[4], ch2[4];
    ct_chain(ch, 4, 8);
    ct_chain(ch2, 4, 88);
    for (int i = 0; i < 4; i++) store(c, ch[i], BB_SMALL);
    CHECK(wait_stores(c, 4));
    CHECK(cache_lookup(c, ch, 4) == 4);

    /* stopped: the first lookup times out after cmd_timeout; later ones fail fast or after a
     * bounded reconnect attempt (the kernel still accepts connections) */
    kill(r.pid, SIGSTOP);
    CHECK(wait_proc_state(r.pid, 0));
    int64_t worst = 0, t0 = ct_now_ms();
    int got = 0;
    while (ct_now_ms() - t0 < 700) {
        int64_t t = ct_now_ms();
        got += cache_lookup(c, ch, 4);
        int64_t el = ct_now_ms() - t;
        if (el > worst) worst = el;
        ct_sleep_ms(10);
    }
    cache_stats_t st = stats(c);
    fprintf(stderr, "  stopped: slowest lookup %lld ms (bound %lld), %" PRIu64 " errors\n",
            (long long)worst, (long long)bound, st.redis_errors);
    CHECK(got == 0);
    CHECK(worst < bound);
    CHECK(worst >= cfg.cmd_timeout_ms - 10); /* it did wait for the timeout once */
    CHECK(st.redis_errors >= 1 && st.redis_up == 0);
    CHECK(cap_has(&lc, "tier 2 off"));
    /* stores while stopped: dropped (the writer learns on its first command) */
    uint64_t d0 = st.stores_dropped;
    for (int i = 0; i < 4; i++) store(c, ch2[i], BB_SMALL);
    CHECK(wait_dropped(c, d0 + 4));
    st = stats(c);
    CHECK(st.stores == 4);
    kill(r.pid, SIGCONT);
    CHECK(wait_proc_state(r.pid, 1));
    /* resumed: back after the backoff, the index intact */
    int64_t until = ct_now_ms() + 5000;
    int k = 0;
    while ((k = cache_lookup(c, ch, 4)) != 4 && ct_now_ms() < until) ct_sleep_ms(20);
    CHECK(k == 4);
    int wrong = 0;
    CHECK(fetch_all(c, ch, 4, BB_SMALL, &wrong) == 4 && wrong == 0);
    CHECK(stats(c).redis_up == 1);
    CHECK(cap_has(&lc, "reconnected"));
    /* the writer reconnects too */
    until = ct_now_ms() + 5000;
    while (stats(c).stores < 5 && ct_now_ms() < until) {
        store(c, ch2[0], BB_SMALL);
        ct_sleep_ms(20);
    }
    CHECK(stats(c).stores >= 5);
    CHECK(check_ok(c));

    /* killed: connections refused at once */
    CHECK(ct_redis_script(&r, "kill") == 0);
    worst = 0;
    t0 = ct_now_ms();
    got = 0;
    while (ct_now_ms() - t0 < 400) {
        int64_t t = ct_now_ms();
        got += cache_lookup(c, ch, 4);
        int64_t el = ct_now_ms() - t;
        if (el > worst) worst = el;
        ct_sleep_ms(10);
    }
    fprintf(stderr, "  killed: slowest lookup %lld ms\n", (long long)worst);
    CHECK(got == 0 && worst < bound);
    d0 = stats(c).stores_dropped;
    store(c, ch2[1], BB_SMALL);
    store(c, ch2[2], BB_SMALL);
    CHECK(wait_dropped(c, d0 + 2));
    CHECK(cache_check(c, err, sizeof err) == -1);

    /* restarted empty on the same port: misses, then new stores index again */
    char rdir2[400];
    snprintf(rdir2, sizeof rdir2, "%s/r8b", workdir);
    mkdir(rdir2, 0700);
    pid_t rp = redis_restart_on(r.port, rdir2);
    if (rp < 0) {
        fprintf(stderr, "  (port %d taken meanwhile: restart part skipped)\n", r.port);
    } else {
        until = ct_now_ms() + 5000;
        while (!stats(c).redis_up && ct_now_ms() < until) {
            CHECK(cache_lookup(c, ch, 4) == 0);
            ct_sleep_ms(20);
        }
        CHECK(stats(c).redis_up == 1);
        CHECK(cache_lookup(c, ch, 4) == 0);
        uint64_t s0 = stats(c).stores;
        until = ct_now_ms() + 5000;
        while (stats(c).stores < s0 + 4 && ct_now_ms() < until) {
            for (int i = 0; i < 4; i++) store(c, ch[i], BB_SMALL);
            ct_sleep_ms(20);
        }
        CHECK(cache_lookup(c, ch, 4) == 4);
        CHECK(fetch_all(c, ch, 4, BB_SMALL, &wrong) == 4 && wrong == 0);
        CHECK(check_ok(c));
        /* idle (no lookup, no store): the writer's health ping notices the kill, then the
         * restart (cache_config_t.health_ms, 1000 ms by default) */
        kill(rp, SIGKILL);
        waitpid(rp, NULL, 0);
        until = ct_now_ms() + 4000;
        while (stats(c).redis_up && ct_now_ms() < until) ct_sleep_ms(20);
        fprintf(stderr, "  killed while idle: redis_up %d\n", stats(c).redis_up);
        CHECK(stats(c).redis_up == 0);
        rp = redis_restart_on(r.port, rdir2);
        if (rp >= 0) {
            until = ct_now_ms() + 8000;
            while (!stats(c).redis_up && ct_now_ms() < until) ct_sleep_ms(20);
            CHECK(stats(c).redis_up == 1);
        }
        cache_free(c);
        c = NULL;
        if (rp >= 0) {
            kill(rp, SIGTERM);
            waitpid(rp, NULL, 0);
        }
    }
    if (c) cache_free(c);
out:
    ct_redis_script(&r, "stop");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rdir2);
    if (system(cmd)) {}
}

/* ---- 9: AUTH ---- */

static void test_auth(env_t *e, const char *workdir)
{
    fprintf(stderr, "9: AUTH with a password and with an ACL user; SELECT\n");
    ct_redis_t r;
    char rdir[400];
    snprintf(rdir, sizeof rdir, "%s/r9", workdir);
    if (ct_redis_start(&r, rdir)) {
        CHECKF(0, "cannot start a redis-server in %s", rdir);
        return;
    }
    /* redis-server.sh checks readiness with an unauthenticated PING, so the passwords are set
     * once it runs */
    redisReply *rep =
        ct_redis_cmd(r.port, NULL, NULL, 0, "ACL SETUSER alice on >pw ~* &* +@all%s", "");
    CHECK(rep && rep->type == REDIS_REPLY_STATUS);
    if (rep) freeReplyObject(rep);
    rep = ct_redis_cmd(r.port, NULL, NULL, 0, "CONFIG SET requirepass %s", "secret");
    CHECK(rep && rep->type == REDIS_REPLY_STATUS);
    if (rep) freeReplyObject(rep);

    char path[400], err[256];
    arena_path(path, sizeof path, e, "t9");
    cache_geometry_t geo = {SEED, 16, BB_SMALL};
    uint64_t ch[2];
    ct_chain(ch, 2, 9);
    struct {
        const char *user, *pass;
        int db, ok;
        const char *log;
    } cases[] = {
        {"", "", 0, 0, "NOAUTH"},
        {"", "wrong", 0, 0, "WRONGPASS"},
        {"alice", "secret", 0, 0, "WRONGPASS"},
        {"", "secret", 0, 1, NULL},
        {"alice", "pw", 3, 1, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        logcap_t lc;
        cap_init(&lc);
        cache_config_t cfg = cfg_for(path, r.port, "t9", &lc);
        cfg.redis_user = cases[i].user;
        cfg.redis_password = cases[i].pass;
        cfg.redis_db = cases[i].db;
        cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
        CHECKF(c, "%s", err);
        if (!c) continue;
        if (cases[i].ok) {
            CHECK(stats(c).redis_up == 1);
            store(c, ch[0], BB_SMALL);
            store(c, ch[1], BB_SMALL);
            CHECKF(wait_stores(c, 2), "case %zu", i);
            CHECK(cache_lookup(c, ch, 2) == 2);
            int wrong = 0;
            CHECK(fetch_all(c, ch, 2, BB_SMALL, &wrong) == 2 && wrong == 0);
            CHECK(stats(c).redis_errors == 0);
            CHECK(check_ok(c));
        } else {
            CHECK(cache_lookup(c, ch, 2) == 0);
            cache_stats_t st = stats(c);
            CHECKF(st.redis_errors >= 1 && st.redis_up == 0, "case %zu", i);
            CHECKF(cap_has(&lc, cases[i].log), "case %zu: %s", i, lc.text);
        }
        cache_free(c);
    }
    /* the ACL user's index went to db 3, the password-only one's to db 0 */
    char key[128];
    snprintf(key, sizeof key, "spwtest:t9:%016" PRIx64 ":blk", (uint64_t)SEED);
    rep = ct_redis_cmd(r.port, "alice", "pw", 3, "HLEN %s", key);
    CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 2);
    if (rep) freeReplyObject(rep);
    rep = ct_redis_cmd(r.port, NULL, "secret", 0, "HLEN %s", key);
    CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 2);
    if (rep) freeReplyObject(rep);

    /* scripts flushed (EVALSHA -> NOSCRIPT -> EVAL) and the whole index flushed (init again) */
    logcap_t lc;
    cap_init(&lc);
    cache_config_t cfg = cfg_for(path, r.port, "t9", &lc);
    cfg.redis_password = "secret";
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (c) {
        rep = ct_redis_cmd(r.port, NULL, "secret", 0, "SCRIPT FLUSH%s", "");
        CHECK(rep && rep->type == REDIS_REPLY_STATUS);
        if (rep) freeReplyObject(rep);
        CHECK(cache_lookup(c, ch, 2) == 2);
        uint64_t x[2];
        ct_chain(x, 2, 99);
        store(c, x[0], BB_SMALL);
        CHECK(wait_stores(c, 1));
        CHECK(cache_lookup(c, x, 1) == 1);
        CHECK(stats(c).redis_errors == 0);
        rep = ct_redis_cmd(r.port, NULL, "secret", 0, "FLUSHALL%s", "");
        CHECK(rep && rep->type == REDIS_REPLY_STATUS);
        if (rep) freeReplyObject(rep);
        CHECK(cache_lookup(c, ch, 2) == 0);
        CHECK(cap_has(&lc, "does not name this arena"));
        CHECK(check_ok(c));
        store(c, x[1], BB_SMALL);
        CHECK(wait_stores(c, 2));
        CHECK(cache_lookup(c, x + 1, 1) == 1);
        int wrong = 0;
        CHECK(fetch_all(c, x + 1, 1, BB_SMALL, &wrong) == 1 && wrong == 0);
        CHECK(stats(c).redis_errors == 0);
        CHECK(check_ok(c));
        cache_free(c);
    }
    ct_redis_script(&r, "stop");
}

/* ---- 10: arena file permissions ---- */

/* cache_new on a refused arena: a handle with tier 2 off (lookups miss, nothing is stored), the
 * refusal logged as an error holding want1 and want2, and counted. */
static void expect_refused(const cache_config_t *cfg, const cache_geometry_t *geo, logcap_t *lc,
                           const uint64_t *ch, const char *want1, const char *want2)
{
    char err[256] = "";
    cap_clear(lc);
    cache_t *c = cache_new(cfg, geo, err, sizeof err);
    CHECKF(c != NULL, "%s: %s", want1, err);
    if (!c) return;
    cache_stats_t st = stats(c);
    CHECKF(st.arena_refused == 1, "%s: not counted", want1);
    CHECKF(cap_has(lc, want1) && cap_has(lc, want2) && cap_has(lc, "tier 2 off"),
           "%s: no log line", want1);
    CHECK(cache_lookup(c, ch, 2) == 0);
    CHECK(begin_block(c, ch[0]) == NULL);
    cache_free(c);
}

static void test_permissions(env_t *e)
{
    fprintf(stderr, "10: the arena is created 0600; looser, linked or foreign arenas are refused "
            "(tier 2 off)\n");
    char path[400], link[420], err[256];
    arena_path(path, sizeof path, e, "t10");
    snprintf(link, sizeof link, "%s.link", path);
    logcap_t lc;
    cap_init(&lc);
    cache_config_t cfg = cfg_for(path, e->redis.port, "t10", &lc);
    cache_geometry_t geo = {SEED, 16, BB_SMALL};
    uint64_t ch[2];
    ct_chain(ch, 2, 10);

    /* created 0600 even under umask 0 (the mode is explicit, not the umask's leftover) */
    mode_t old_umask = umask(0);
    cache_t *c = cache_new(&cfg, &geo, err, sizeof err);
    umask(old_umask);
    CHECKF(c, "%s", err);
    if (!c) return;
    struct stat st;
    CHECK(stat(path, &st) == 0 && S_ISREG(st.st_mode));
    CHECKF((st.st_mode & 07777) == 0600, "mode %04o", (unsigned)(st.st_mode & 07777));
    CHECK(st.st_uid == geteuid());
    store(c, ch[0], BB_SMALL);
    store(c, ch[1], BB_SMALL);
    CHECK(wait_stores(c, 2));
    cache_free(c);

    /* looser modes: refused with an error naming the mode and the fix; the file is untouched */
    static const mode_t loose[] = {0644, 0660, 0606, 0640, 0602};
    for (size_t i = 0; i < sizeof loose / sizeof loose[0]; i++) {
        CHECK(chmod(path, loose[i]) == 0);
        char want[16];
        snprintf(want, sizeof want, "mode %04o", (unsigned)loose[i]);
        expect_refused(&cfg, &geo, &lc, ch, want, "chmod 600");
        CHECK(stat(path, &st) == 0 && (st.st_mode & 07777) == loose[i]);
    }
    /* a symbolic link to a good arena: refused too (O_NOFOLLOW) */
    CHECK(chmod(path, 0600) == 0);
    unlink(link);
    CHECK(symlink(path, link) == 0);
    cache_config_t lcfg = cfg_for(link, e->redis.port, "t10", &lc);
    expect_refused(&lcfg, &geo, &lc, ch, "symbolic link", link);
    unlink(link);
    /* a hard link (to the arena itself, or to any file of this user): refused, both names */
    CHECK(linkat(AT_FDCWD, path, AT_FDCWD, link, 0) == 0);
    expect_refused(&lcfg, &geo, &lc, ch, "2 links", link);
    expect_refused(&cfg, &geo, &lc, ch, "2 links", path);
    unlink(link);
    /* a file of another owner (needs root to make one: chown to nobody) */
    if (geteuid() == 0) {
        char other[420];
        snprintf(other, sizeof other, "%s.other", path);
        int fd = open(other, O_RDWR | O_CREAT | O_EXCL, 0600);
        CHECK(fd >= 0 && fchown(fd, 65534, 65534) == 0);
        if (fd >= 0) close(fd);
        cache_config_t ocfg = cfg_for(other, e->redis.port, "t10", &lc);
        expect_refused(&ocfg, &geo, &lc, ch, "owned by uid 65534", other);
        CHECK(stat(other, &st) == 0 && st.st_size == 0); /* not written to */
        unlink(other);
    } else {
        fprintf(stderr, "   (not root: the other-owner case is skipped)\n");
    }

    /* the default path: a per-user folder made 0700, refused once it is open to others */
    char ddir[64], dfile[96];
    snprintf(ddir, sizeof ddir, "/dev/shm/spillway-%u", (unsigned)geteuid());
    snprintf(dfile, sizeof dfile, "%s/spillway.arena", ddir);
    if (access("/dev/shm", W_OK) == 0 && access(dfile, F_OK) != 0) {
        int had_dir = access(ddir, F_OK) == 0;
        cache_config_t dcfg = cfg_for("", 0, "t10", &lc);
        dcfg.arena_mb = 1;
        err[0] = 0;
        c = cache_new(&dcfg, &geo, err, sizeof err);
        CHECKF(c && stats(c).arena_refused == 0, "default arena: %s", err);
        if (c) cache_free(c);
        CHECK(lstat(ddir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid());
        CHECKF((st.st_mode & 07777) == 0700, "folder mode %04o", (unsigned)(st.st_mode & 07777));
        CHECK(stat(dfile, &st) == 0 && (st.st_mode & 07777) == 0600);
        CHECK(chmod(ddir, 0755) == 0);
        expect_refused(&dcfg, &geo, &lc, ch, "mode 0755", "must be this process's uid");
        CHECK(chmod(ddir, 0700) == 0);
        unlink(dfile);
        if (!had_dir) rmdir(ddir);
    } else {
        fprintf(stderr, "   (%s exists or /dev/shm is not writable: default path not tried)\n",
                dfile);
    }

    /* chmod 600: attached again, the blocks stored before are still there */
    cap_clear(&lc);
    c = cache_new(&cfg, &geo, err, sizeof err);
    CHECKF(c, "%s", err);
    if (!c) return;
    CHECK(cap_has(&lc, "attached"));
    CHECK(cache_lookup(c, ch, 2) == 2);
    int wrong = 0;
    CHECK(fetch_all(c, ch, 2, BB_SMALL, &wrong) == 2 && wrong == 0);
    cache_free(c);
}

/* ---- 11: the KV name secret file ---- */

/* The KV name secret (cache_secret_load): created 0600 with 32 bytes when absent and read
 * back unchanged; refused when group/other may access it, of another size, a symbolic link or
 * another user's (the last only when the test may chown). */
static void test_secret(env_t *e)
{
    char path[400], link_path[420], err[512];
    unsigned char a[CACHE_SECRET_BYTES], b[CACHE_SECRET_BYTES];
    snprintf(path, sizeof path, "%s/secret", e->dir);
    snprintf(link_path, sizeof link_path, "%s/secret.link", e->dir);
    unlink(path);
    CHECKF(cache_secret_load(path, a, err, sizeof err) == 0, "create: %s", err);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600 &&
          st.st_size == CACHE_SECRET_BYTES);
    CHECK(cache_secret_load(path, b, err, sizeof err) == 0 && memcmp(a, b, sizeof a) == 0);
    chmod(path, 0640);
    CHECK(cache_secret_load(path, b, err, sizeof err) == -1 && strstr(err, "mode 0640"));
    chmod(path, 0600);
    CHECK(symlink(path, link_path) == 0);
    CHECK(cache_secret_load(link_path, b, err, sizeof err) == -1 &&
          strstr(err, "symbolic link"));
    unlink(link_path);
    if (chown(path, 12345, (gid_t)-1) == 0) {
        CHECK(cache_secret_load(path, b, err, sizeof err) == -1 && strstr(err, "owned by uid"));
        CHECK(chown(path, geteuid(), (gid_t)-1) == 0);
    }
    CHECK(truncate(path, 16) == 0);
    CHECK(cache_secret_load(path, b, err, sizeof err) == -1 && strstr(err, "16 bytes"));
    unlink(path);
}

int main(void)
{
    setvbuf(stderr, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN); /* as the spillway binaries do */
    if (system("command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1")) {
        fprintf(stderr, "SKIP: redis-server / redis-cli not installed (scripts/install-deps.sh)\n");
        return 77;
    }
    int64_t t0 = ct_now_ms();
    char workdir[] = "/tmp/spillway-cache-test.XXXXXX";
    if (!mkdtemp(workdir)) {
        perror("mkdtemp");
        return 1;
    }
    env_t e;
    memset(&e, 0, sizeof e);
    snprintf(e.dir, sizeof e.dir, "/dev/shm/spillway-cache-test.XXXXXX");
    if (!mkdtemp(e.dir)) snprintf(e.dir, sizeof e.dir, "%s", workdir);
    char rdir[400];
    snprintf(rdir, sizeof rdir, "%s/r1", workdir);
    if (ct_redis_start(&e.redis, rdir)) {
        fprintf(stderr, "cannot start redis-server in %s\n", rdir);
        return 1;
    }
    fprintf(stderr, "redis-server on port %d (pid %d), arenas in %s\n", e.redis.port,
            e.redis.pid, e.dir);

    test_round_trip(&e);
    /* SPILLWAY_TEST_NO_FORK (the ThreadSanitizer stage): no forked child that starts threads */
    if (!getenv("SPILLWAY_TEST_NO_FORK")) test_processes(&e);
    test_mismatch(&e);
    test_eviction(&e);
    test_concurrency(&e);
    test_torn(&e);
    test_redis_faults(&e, workdir);
    test_auth(&e, workdir);
    test_permissions(&e);
    test_secret(&e);

    ct_redis_script(&e.redis, "stop");
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", e.dir, workdir);
    if (system(cmd)) fprintf(stderr, "cleanup failed: %s\n", cmd);
    fprintf(stderr, "test_cache: %.1f s\n", (double)(ct_now_ms() - t0) / 1000.0);
    return check_exit();
}
