/* cache/arena.c: the shared host-memory arena of tier 2: mapping, header validation and
 * (re)initialisation, and the per-slot seqlock that lets one process write a slot while others
 * read it without ever taking wrong bytes.
 *
 * File layout (all integers native-endian; the file never leaves the host):
 *   [0, 4096)                 arena_header_t
 *   [4096, data_offset)       n_slots x slot_header_t (64 bytes each)
 *   [data_offset + i*stride)  slot i: block_bytes bytes of KV, then meta_bytes of what it was
 *                             computed from (parent name u64, block_tokens x int32 token ids),
 *                             stride = block_bytes + meta_bytes rounded up to 4096
 *
 * Seqlock word of a slot (slot_header_t.seq), 64 bits:
 *   bit 0        1 while a writer owns the slot (odd = being written)
 *   bits 1..31   the owner's pid while odd, 0 while even
 *   bits 32..63  a counter, incremented at every release, so a reader that sees the same even
 *                word before and after its copy knows no write completed or began meanwhile
 * A writer locks with one CAS from an even word; if the word is odd (or the CAS loses) another
 * writer is active and the store is dropped, except when that writer is gone: its pid no longer
 * exists (kill(pid, 0) == ESRCH) or it has held the lock longer than ARENA_STALE_LOCK_MS (a copy
 * takes micro- to milliseconds; this also covers a restarted process that got the dead one's
 * pid, e.g. pid 1 in a container). Then the new writer takes the lock over with a CAS from that
 * odd word. Should the old owner still be alive after all (stopped, then resumed), it can only
 * scribble bytes or header fields of a slot that is no longer its own: its release CAS fails, so
 * it never commits, and a reader of the new owner's block sees a header or checksum mismatch: a
 * miss, never wrong bytes (up to a 64-bit checksum collision). Processes sharing an arena must
 * share a pid namespace for the pid test to mean anything; otherwise only the timeout applies
 * (the same worst case: misses).
 *
 * Permissions: the arena holds KV blocks computed from prompts, so it is created 0600 and only
 * the user that runs the workers may read or write it (a writer could also plant blocks whose
 * checksum matches: the checksum catches corruption, not forgery). An existing file is refused,
 * not repaired, when it is not a regular file (a symbolic link included: O_NOFOLLOW), has more
 * than one link (a hard link planted in a shared folder could point at any file of this user),
 * belongs to another user, or grants any group or other permission: another user may already
 * have it open or mapped, and a chmod would not revoke that. The default path lives in a
 * per-user folder (ARENA_DEFAULT_DIR-<euid>, created 0700, refused unless it is this user's real
 * directory with mode 0700; the file is opened relative to it). The error names the fix (chmod
 * 600, or remove the file so that it is created again); arena_open returns -2 for these
 * refusals, and cache_new then runs without tier 2. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/cache_internal.h"

#define ARENA_MAGIC "SPILLWAYARENA\0\0\0"
#define ARENA_VERSION 2u /* 2: a slot holds the block's parent name and tokens after its KV */
#define ARENA_READY 0x5245414459215357ull /* "initialised" marker, written last */
#define ARENA_HDR_BYTES 4096u
#define ARENA_PAGE 4096u
#define ARENA_STALE_LOCK_MS 10000

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the seqlock needs lock-free 64-bit atomics");

/* The first 4096 bytes of the file. Fields are written only under flock(LOCK_EX) during
 * initialisation; ready is cleared first and set last, so a torn initialisation is detected. */
typedef struct {
    char magic[16];               /* ARENA_MAGIC */
    uint32_t version;             /* ARENA_VERSION */
    uint32_t block_tokens;
    uint64_t seed;                /* the engine's pool seed (model fingerprint) */
    uint64_t block_bytes;
    uint64_t n_slots;
    uint64_t slot_stride;
    uint64_t data_offset;
    _Atomic uint64_t arena_id;    /* random, nonzero; the Redis index names it in meta */
    _Atomic uint64_t ready;       /* ARENA_READY once everything above is written */
} arena_header_t;
_Static_assert(sizeof(arena_header_t) <= ARENA_HDR_BYTES, "arena header too large");

/* 64 bytes per slot. name, gen and checksum are meaningful only while seq is even. */
typedef struct {
    _Atomic uint64_t seq;         /* seqlock word, see the top of this file */
    _Atomic uint64_t name;        /* block name held (0 = none) */
    _Atomic uint64_t gen;         /* generation it was written for (Redis sgen; 0 = none) */
    _Atomic uint64_t checksum;    /* XXH3_64bits of the meta, seeded by XXH3_64bits of the KV */
    _Atomic int64_t lock_ms;      /* CLOCK_REALTIME ms of the latest lock attempt */
    uint64_t reserved[3];
} slot_header_t;
_Static_assert(sizeof(slot_header_t) == 64, "slot header must be 64 bytes");

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

static arena_header_t *hdr(const arena_t *a) { return (arena_header_t *)(void *)a->base; }

static slot_header_t *slot_hdr(const arena_t *a, uint32_t slot)
{
    uint8_t *p = a->base + ARENA_HDR_BYTES + (size_t)slot * sizeof(slot_header_t);
    return (slot_header_t *)(void *)p;
}

static uint8_t *slot_data(const arena_t *a, uint32_t slot)
{
    return a->base + a->data_offset + (size_t)slot * a->slot_stride;
}

/* Slots that fit in total bytes: header + slot headers (page-rounded) + page-aligned slots. */
static uint64_t slots_that_fit(size_t total, size_t stride)
{
    if (total <= ARENA_HDR_BYTES) return 0;
    uint64_t n = (total - ARENA_HDR_BYTES) / (stride + sizeof(slot_header_t));
    while (n > 0 &&
           ARENA_HDR_BYTES + round_up(n * sizeof(slot_header_t), ARENA_PAGE) + n * stride > total)
        n--;
    if (n > INT32_MAX) n = INT32_MAX;
    return n;
}

static uint64_t random_id(void)
{
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            if (read(fd, &id, sizeof id) != (ssize_t)sizeof id) id = 0;
            close(fd);
        }
    }
    if (!id) { /* last resort: time and pid, still different per initialisation */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id = XXH3_64bits_withSeed(&ts, sizeof ts, (uint64_t)getpid());
    }
    return id ? id : 1;
}

/* Names the first header field that does not match; NULL when the header is usable. what and
 * its two values go to the log line. */
static const char *header_mismatch(const arena_t *a, char *why, size_t whylen)
{
    const arena_header_t *h = hdr(a);
    if (memcmp(h->magic, ARENA_MAGIC, sizeof h->magic)) {
        snprintf(why, whylen, "magic is not \"SPILLWAYARENA\"");
        return "magic";
    }
    if (atomic_load_explicit(&h->ready, memory_order_acquire) != ARENA_READY) {
        snprintf(why, whylen, "initialised marker missing (torn initialisation)");
        return "ready";
    }
    if (h->version != ARENA_VERSION) {
        snprintf(why, whylen, "layout version %u != %u", h->version, ARENA_VERSION);
        return "version";
    }
    if (h->seed != a->seed) {
        snprintf(why, whylen, "model fingerprint (seed) %016llx != %016llx",
                 (unsigned long long)h->seed, (unsigned long long)a->seed);
        return "seed";
    }
    if (h->block_tokens != a->block_tokens) {
        snprintf(why, whylen, "block_tokens %u != %u", h->block_tokens, a->block_tokens);
        return "block_tokens";
    }
    if (h->block_bytes != a->block_bytes) {
        snprintf(why, whylen, "block_bytes %llu != %zu", (unsigned long long)h->block_bytes,
                 a->block_bytes);
        return "block_bytes";
    }
    if (h->n_slots != a->n_slots) {
        snprintf(why, whylen, "n_slots %llu != %u (arena size changed)",
                 (unsigned long long)h->n_slots, a->n_slots);
        return "n_slots";
    }
    if (h->slot_stride != a->slot_stride || h->data_offset != a->data_offset) {
        snprintf(why, whylen, "slot layout (stride %llu, offset %llu) != (%zu, %zu)",
                 (unsigned long long)h->slot_stride, (unsigned long long)h->data_offset,
                 a->slot_stride, a->data_offset);
        return "layout";
    }
    if (!atomic_load_explicit(&h->arena_id, memory_order_relaxed)) {
        snprintf(why, whylen, "arena id is 0");
        return "arena_id";
    }
    return NULL;
}

/* Caller holds flock(LOCK_EX). Clears the marker, rewrites the header, zeroes every slot header
 * (no slot then matches any name and generation >= 1) and sets the marker last. */
static void initialise(arena_t *a)
{
    arena_header_t *h = hdr(a);
    atomic_store_explicit(&h->ready, 0, memory_order_release);
    memcpy(h->magic, ARENA_MAGIC, sizeof h->magic);
    h->version = ARENA_VERSION;
    h->block_tokens = a->block_tokens;
    h->seed = a->seed;
    h->block_bytes = a->block_bytes;
    h->n_slots = a->n_slots;
    h->slot_stride = a->slot_stride;
    h->data_offset = a->data_offset;
    memset(a->base + ARENA_HDR_BYTES, 0, (size_t)a->n_slots * sizeof(slot_header_t));
    atomic_store_explicit(&h->arena_id, random_id(), memory_order_relaxed);
    atomic_store_explicit(&h->ready, ARENA_READY, memory_order_release);
}

static int all_zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

int arena_open(arena_t *a, const char *path, long arena_mb, const cache_geometry_t *geo,
               const cache_log_t *log, char *errstr, size_t errlen)
{
    memset(a, 0, sizeof *a);
    a->fd = -1;
    int locked = 0, dfd = -1, refused = 0;
    char default_dir[64], default_path[96];
    const char *dir_arg = NULL;
    if (!path || !*path) { /* the per-user default */
        snprintf(default_dir, sizeof default_dir, ARENA_DEFAULT_DIR "-%u", (unsigned)geteuid());
        snprintf(default_path, sizeof default_path, "%s/" ARENA_DEFAULT_FILE, default_dir);
        path = default_path;
        dir_arg = default_dir;
    }
    if (arena_mb <= 0 || (unsigned long)arena_mb > (SIZE_MAX >> 21)) {
        snprintf(errstr, errlen, "arena %s: size %ld MiB out of range", path, arena_mb);
        goto fail;
    }
    if (!geo || geo->block_bytes == 0 || geo->block_tokens <= 0) {
        snprintf(errstr, errlen, "arena %s: block_bytes and block_tokens must be positive", path);
        goto fail;
    }
    a->path = strdup(path);
    if (!a->path) {
        snprintf(errstr, errlen, "arena %s: out of memory", path);
        goto fail;
    }
    a->map_bytes = (size_t)arena_mb << 20;
    a->seed = geo->seed;
    a->block_tokens = (uint32_t)geo->block_tokens;
    a->block_bytes = geo->block_bytes;
    a->meta_bytes = sizeof(uint64_t) + (size_t)geo->block_tokens * sizeof(int32_t);
    a->slot_stride = round_up(geo->block_bytes + a->meta_bytes, ARENA_PAGE);
    if (a->slot_stride < geo->block_bytes) { /* overflow */
        snprintf(errstr, errlen, "arena %s: block_bytes %zu too large", path, geo->block_bytes);
        goto fail;
    }
    uint64_t n = slots_that_fit(a->map_bytes, a->slot_stride);
    if (n < 1) {
        snprintf(errstr, errlen, "arena %s: %ld MiB is too small for one slot of %zu bytes", path,
                 arena_mb, geo->block_bytes);
        goto fail;
    }
    a->n_slots = (uint32_t)n;
    a->data_offset = ARENA_HDR_BYTES + round_up(n * sizeof(slot_header_t), ARENA_PAGE);
    a->pid = getpid();

    /* refused: 1 once the failure is a refusal of a file or folder we do not trust */
    if (dir_arg) {
        /* the per-user folder: created 0700; an existing one must be ours, a real directory
         * (O_NOFOLLOW) and closed to group and other; the file is opened relative to it */
        if (mkdir(default_dir, 0700) < 0 && errno != EEXIST) {
            snprintf(errstr, errlen, "arena %s: mkdir %s: %s", path, default_dir,
                     strerror(errno));
            goto fail;
        }
        dfd = open(default_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat ds;
        if (dfd < 0 || fstat(dfd, &ds) < 0) {
            refused = errno == ELOOP || errno == ENOTDIR;
            snprintf(errstr, errlen, "arena %s: folder %s: %s%s", path, default_dir,
                     strerror(errno), refused ? " (refused: not a directory of this user)" : "");
            goto fail;
        }
        if (ds.st_uid != geteuid() || (ds.st_mode & 077)) {
            refused = 1;
            snprintf(errstr, errlen, "arena %s: folder %s is owned by uid %u with mode %04o "
                     "(refused: it must be this process's uid %u's, mode 0700)", path,
                     default_dir, (unsigned)ds.st_uid, (unsigned)(ds.st_mode & 07777),
                     (unsigned)geteuid());
            goto fail;
        }
        a->fd = openat(dfd, ARENA_DEFAULT_FILE, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    } else {
        a->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    }
    if (a->fd < 0) {
        if (errno == ELOOP) {
            refused = 1;
            snprintf(errstr, errlen, "arena %s: is a symbolic link (refused: point "
                     "cache.arena.path at the file itself)", path);
        } else {
            snprintf(errstr, errlen, "arena %s: open: %s", path, strerror(errno));
        }
        goto fail;
    }
    struct stat st;
    if (fstat(a->fd, &st) < 0) {
        snprintf(errstr, errlen, "arena %s: fstat: %s", path, strerror(errno));
        goto fail;
    }
    refused = 1; /* every failure from here to the lock is a refused file */
    if (!S_ISREG(st.st_mode)) {
        snprintf(errstr, errlen, "arena %s: not a regular file (refused)", path);
        goto fail;
    }
    if (st.st_nlink != 1) {
        snprintf(errstr, errlen, "arena %s: has %lu links (refused: a hard link may expose "
                 "another file; remove it to have it created afresh)", path,
                 (unsigned long)st.st_nlink);
        goto fail;
    }
    if (st.st_uid != geteuid()) {
        snprintf(errstr, errlen, "arena %s: owned by uid %u, not by this process's uid %u "
                 "(refused: another user could read or alter the cached blocks)", path,
                 (unsigned)st.st_uid, (unsigned)geteuid());
        goto fail;
    }
    if (st.st_mode & 077) {
        snprintf(errstr, errlen, "arena %s: mode %04o gives other users access (refused: "
                 "chmod 600 it, or remove it to have it created 0600)", path,
                 (unsigned)(st.st_mode & 07777));
        goto fail;
    }
    refused = 0;
    /* Exclusive while checking and (re)initialising: of processes attaching at once, one
     * initialises and the others then find a valid header. */
    if (flock(a->fd, LOCK_EX) < 0) {
        snprintf(errstr, errlen, "arena %s: flock: %s", path, strerror(errno));
        goto fail;
    }
    locked = 1;
    if (fstat(a->fd, &st) < 0) { /* again: the size may have changed before the lock */
        snprintf(errstr, errlen, "arena %s: fstat: %s", path, strerror(errno));
        goto fail;
    }
    /* Grow only: a process attached with a larger size would fault on a shrunk file. The pages
     * are allocated now (posix_fallocate), so a tmpfs too small for cache.arena.mb is an error
     * here rather than a SIGBUS at the first write to a slot it cannot back. */
    if ((uint64_t)st.st_size < a->map_bytes) {
        int e = posix_fallocate(a->fd, 0, (off_t)a->map_bytes);
        if (e == EOPNOTSUPP || e == EINVAL) /* a file system without it: size it sparse */
            e = ftruncate(a->fd, (off_t)a->map_bytes) < 0 ? errno : 0;
        if (e) {
            snprintf(errstr, errlen, "arena %s: cannot allocate %zu bytes: %s (a smaller "
                     "cache.arena.mb, or more room where the file lives)", path, a->map_bytes,
                     strerror(e));
            goto fail;
        }
    }
    void *m = mmap(NULL, a->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (m == MAP_FAILED) {
        snprintf(errstr, errlen, "arena %s: mmap %zu bytes: %s", path, a->map_bytes,
                 strerror(errno));
        goto fail;
    }
    a->base = m;

    char why[160];
    const char *field = header_mismatch(a, why, sizeof why);
    if (field) {
        if (st.st_size == 0 || all_zero(a->base, ARENA_HDR_BYTES))
            CACHE_LOG(log, SW_LOG_INFO, "arena %s: new, %u slots of %zu bytes", path, a->n_slots,
                      a->block_bytes);
        else
            CACHE_LOG(log, SW_LOG_WARN, "arena %s: %s: re-initialising", path, why);
        initialise(a);
    } else {
        CACHE_LOG(log, SW_LOG_INFO, "arena %s: attached, %u slots of %zu bytes, id %016llx", path,
                  a->n_slots, a->block_bytes,
                  (unsigned long long)atomic_load(&hdr(a)->arena_id));
    }
    a->id = atomic_load_explicit(&hdr(a)->arena_id, memory_order_relaxed);
    flock(a->fd, LOCK_UN);
    if (dfd >= 0) close(dfd);
    return 0;

fail:
    if (locked) flock(a->fd, LOCK_UN);
    if (dfd >= 0) close(dfd);
    arena_close(a);
    return refused ? -2 : -1;
}

void arena_close(arena_t *a)
{
    if (a->base) munmap(a->base, a->map_bytes);
    if (a->fd >= 0) close(a->fd);
    free(a->path);
    a->base = NULL;
    a->fd = -1;
    a->path = NULL;
}

int arena_still_ours(const arena_t *a)
{
    const arena_header_t *h = hdr(a);
    return atomic_load_explicit(&h->ready, memory_order_acquire) == ARENA_READY &&
           atomic_load_explicit(&h->arena_id, memory_order_relaxed) == a->id;
}

/* The owner of odd word s is gone: its pid does not exist, or the lock is older than
 * ARENA_STALE_LOCK_MS. */
static int lock_abandoned(const slot_header_t *h, uint64_t s)
{
    pid_t owner = (pid_t)((s >> 1) & 0x7fffffffu);
    if (owner > 0 && kill(owner, 0) < 0 && errno == ESRCH) return 1;
    int64_t since = atomic_load_explicit(&h->lock_ms, memory_order_relaxed);
    return sw_wall_ms() - since > ARENA_STALE_LOCK_MS;
}

static uint64_t slot_sum(const arena_t *a, const void *kv, const void *meta)
{
    return XXH3_64bits_withSeed(meta, a->meta_bytes, XXH3_64bits(kv, a->block_bytes));
}

int arena_write(arena_t *a, uint32_t slot, uint64_t name, uint64_t gen, const void *src,
                const void *meta)
{
    slot_header_t *h = slot_hdr(a, slot);
    uint64_t sum = slot_sum(a, src, meta); /* before locking: a shorter hold */
    uint64_t mine = ((uint64_t)((uint32_t)a->pid & 0x7fffffffu) << 1) | 1u;
    uint64_t s = atomic_load_explicit(&h->seq, memory_order_relaxed);
    uint64_t locked;
    if (s & 1) {
        if (!lock_abandoned(h, s)) return ARENA_BUSY;
        locked = (((s >> 32) + 1) << 32) | mine;
    } else {
        locked = (s & 0xffffffff00000000ull) | mine;
    }
    /* Stored before the CAS so that a crash between the CAS and here cannot leave an old time
     * that would let the lock be taken over early; a loser's store only delays takeovers. */
    atomic_store_explicit(&h->lock_ms, sw_wall_ms(), memory_order_relaxed);
    if (!atomic_compare_exchange_strong_explicit(&h->seq, &s, locked, memory_order_acquire,
                                                 memory_order_relaxed))
        return ARENA_BUSY;
    /* A writer that allocated the slot before another one did (an older generation) and got
     * here after it must not overwrite the newer block: give the lock back, the slot as it
     * was (an abandoned lock's torn bytes: readers reject them by checksum). */
    if (atomic_load_explicit(&h->gen, memory_order_relaxed) > gen) {
        uint64_t back = (s & 1) ? ((locked >> 32) + 1) << 32 : s;
        atomic_compare_exchange_strong_explicit(&h->seq, &locked, back, memory_order_release,
                                                memory_order_relaxed);
        return ARENA_LOST;
    }
    /* orders the odd word before the stores below, for readers that fence before re-reading */
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&h->name, name, memory_order_relaxed);
    atomic_store_explicit(&h->gen, gen, memory_order_relaxed);
    memcpy(slot_data(a, slot), src, a->block_bytes);
    memcpy(slot_data(a, slot) + a->block_bytes, meta, a->meta_bytes);
    atomic_store_explicit(&h->checksum, sum, memory_order_relaxed);
    uint64_t done = ((locked >> 32) + 1) << 32;
    if (!atomic_compare_exchange_strong_explicit(&h->seq, &locked, done, memory_order_release,
                                                 memory_order_relaxed))
        return ARENA_LOST;
    return ARENA_OK;
}

int arena_read(const arena_t *a, uint32_t slot, uint64_t name, uint64_t gen, void *dst,
               void *meta)
{
    uint64_t sum;
    return arena_read_sum(a, slot, name, gen, dst, meta, &sum);
}

int arena_read_sum(const arena_t *a, uint32_t slot, uint64_t name, uint64_t gen, void *dst,
                   void *meta, uint64_t *sum_out)
{
    slot_header_t *h = slot_hdr(a, slot);
    uint64_t s1 = atomic_load_explicit(&h->seq, memory_order_acquire);
    if (s1 & 1) return -1;
    if (atomic_load_explicit(&h->name, memory_order_relaxed) != name ||
        atomic_load_explicit(&h->gen, memory_order_relaxed) != gen)
        return -1;
    uint64_t sum = atomic_load_explicit(&h->checksum, memory_order_relaxed);
    memcpy(dst, slot_data(a, slot), a->block_bytes);
    memcpy(meta, slot_data(a, slot) + a->block_bytes, a->meta_bytes);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&h->seq, memory_order_relaxed) != s1) return -1;
    *sum_out = sum;
    return slot_sum(a, dst, meta) == sum ? 0 : -1;
}

uint64_t arena_sum(const arena_t *a, const void *kv, const void *meta)
{
    return slot_sum(a, kv, meta);
}

void arena_peek(const arena_t *a, uint32_t slot, uint64_t *name, uint64_t *gen, uint64_t *seq)
{
    slot_header_t *h = slot_hdr(a, slot);
    *seq = atomic_load_explicit(&h->seq, memory_order_acquire);
    *name = atomic_load_explicit(&h->name, memory_order_relaxed);
    *gen = atomic_load_explicit(&h->gen, memory_order_relaxed);
}
