/* cache/secret.c: the deployment's KV name secret (see cache_secret_load in cache.h).
 *
 * The file is exactly CACHE_SECRET_BYTES random bytes. When absent it is created atomically: the
 * bytes go to a fresh temporary file beside it (O_CREAT | O_EXCL, mode 0600), which is then
 * link()ed to the path; link never replaces an existing file, so of several processes creating
 * it at once one wins and every other one reads the winner's bytes. */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/cache_internal.h"

#define SECRET_DEFAULT_FILE "spillway.secret"

/* The default path (path NULL or ""): SECRET_DEFAULT_FILE in the arena's per-user folder
 * (ARENA_DEFAULT_DIR-<euid>), created 0700 when absent and refused unless it is this user's own
 * real directory without group/other access. 0 + buf, or -1 + errstr. */
static int default_path(char *buf, size_t len, char *errstr, size_t errlen)
{
    char dir[64];
    snprintf(dir, sizeof dir, ARENA_DEFAULT_DIR "-%u", (unsigned)geteuid());
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        snprintf(errstr, errlen, "secret: mkdir %s: %s", dir, strerror(errno));
        return -1;
    }
    struct stat ds;
    if (lstat(dir, &ds) < 0) {
        snprintf(errstr, errlen, "secret: folder %s: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(ds.st_mode) || ds.st_uid != geteuid() || (ds.st_mode & 077)) {
        snprintf(errstr, errlen,
                 "secret: folder %s is not this user's own 0700 directory (uid %u, mode %04o, "
                 "we are uid %u): refused; remove it or set cache.secret_file", dir,
                 (unsigned)ds.st_uid, (unsigned)(ds.st_mode & 07777), (unsigned)geteuid());
        return -1;
    }
    snprintf(buf, len, "%s/" SECRET_DEFAULT_FILE, dir);
    return 0;
}

/* Writes fresh random bytes to a temporary file and links it to path. 0 (created, or created
 * meanwhile by another process), or -1 + errstr. */
static int create_secret(const char *path, char *errstr, size_t errlen)
{
    unsigned char key[CACHE_SECRET_BYTES];
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%08x", path, (long)getpid(),
                 (unsigned)randombytes_random()) >= (int)sizeof tmp) {
        snprintf(errstr, errlen, "secret %s: path too long", path);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(errstr, errlen, "secret %s: cannot create %s: %s", path, tmp, strerror(errno));
        return -1;
    }
    randombytes_buf(key, sizeof key);
    int ok = write(fd, key, sizeof key) == (ssize_t)sizeof key && fsync(fd) == 0;
    int e = errno;
    sodium_memzero(key, sizeof key);
    close(fd);
    if (ok && link(tmp, path) != 0 && errno != EEXIST) {
        ok = 0;
        e = errno;
    }
    unlink(tmp);
    if (!ok) {
        snprintf(errstr, errlen, "secret %s: cannot write it: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

int cache_secret_load(const char *path, unsigned char *out, char *errstr, size_t errlen)
{
    char defpath[96];
    if (!path || !*path) {
        if (default_path(defpath, sizeof defpath, errstr, errlen)) return -1;
        path = defpath;
    }
    if (sodium_init() < 0) {
        snprintf(errstr, errlen, "secret %s: libsodium failed to initialise", path);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        if (create_secret(path, errstr, errlen)) return -1;
        fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
        if (errno == ELOOP)
            snprintf(errstr, errlen, "secret %s: is a symbolic link (refused)", path);
        else
            snprintf(errstr, errlen, "secret %s: open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) != 0) {
        snprintf(errstr, errlen, "secret %s: fstat: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(errstr, errlen, "secret %s: not a regular file (refused)", path);
    } else if (st.st_uid != geteuid()) {
        snprintf(errstr, errlen, "secret %s: owned by uid %u, not by this process's uid %u "
                 "(refused: another user could know it)", path, (unsigned)st.st_uid,
                 (unsigned)geteuid());
    } else if (st.st_mode & 077) {
        snprintf(errstr, errlen, "secret %s: mode %04o gives other users access (refused: "
                 "remove it to have a new one created 0600; blocks cached under the old one "
                 "are then not reused)", path, (unsigned)(st.st_mode & 07777));
    } else if (st.st_size != CACHE_SECRET_BYTES) {
        snprintf(errstr, errlen, "secret %s: %lld bytes, not %d (refused: remove it to have "
                 "a new one created)", path, (long long)st.st_size, CACHE_SECRET_BYTES);
    } else if (read(fd, out, CACHE_SECRET_BYTES) != CACHE_SECRET_BYTES) {
        snprintf(errstr, errlen, "secret %s: short read", path);
    } else {
        rc = 0;
    }
    close(fd);
    return rc;
}
