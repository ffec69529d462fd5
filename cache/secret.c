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
    if (!path || !*path) {
        snprintf(errstr, errlen, "secret: no path (cache.secret_file)");
        return -1;
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
