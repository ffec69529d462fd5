/* tests/test_metrics_starve.c: the metrics HTTP server (worker/metrics.h) under slow clients.
 *   - the default bind address is loopback: a non-loopback address of this host is refused;
 *   - 64 slow clients on /metrics (each from its own 127.0.0.x address, half stopped inside the
 *     request header, half not reading a large response), plus 64 more from one address, and
 *     /healthz from 127.0.0.1 on the same port answers 200 within 1 s (the liveness probe's
 *     bound);
 *   - the health port: with the main port's connections all held (and more waiting), /healthz
 *     there answers within 1 s, and it serves nothing but /healthz and /readyz.
 * The slow clients are held open (not timed): the server's 5 s idle timeout is far longer than
 * one probe. Linux routes all of 127.0.0.0/8 to the loopback device, so a client can bind any
 * of those addresses as its source. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "worker/metrics.h"

#define N_SLOW 64

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A connected TCP socket from src (host order, 0 = any) to dst:port, or -1. rcvbuf > 0 shrinks
 * the receive buffer first (a reader that stops early holds the server's send). */
static int dial(uint32_t src, uint32_t dst, int port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    if (src) {
        sa.sin_addr.s_addr = htonl(src);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa)) goto fail;
    }
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(dst);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) goto fail;
    return fd;
fail:
    close(fd);
    return -1;
}

/* GET path from 127.0.0.1 with a deadline of 1 s for the whole exchange. The status, or 0 when
 * there was no complete answer in time (refused, closed, or late); *ms: the time it took. */
static int get_within_1s(int port, const char *path, int64_t *ms)
{
    int64_t t0 = now_ms(), deadline = t0 + 1000;
    int status = 0;
    char buf[4096];
    size_t len = 0;
    int fd = dial(INADDR_LOOPBACK, INADDR_LOOPBACK, port, 0);
    if (fd < 0) goto out;
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) goto out;
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) goto out;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0) goto out;
        ssize_t got = read(fd, buf + len, sizeof buf - 1 - len);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        len += (size_t)got;
        if (len == sizeof buf - 1) break;
    }
    buf[len] = '\0';
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) status = 0;
out:
    if (fd >= 0) close(fd);
    *ms = now_ms() - t0;
    return status;
}

/* /metrics: about 2 MB, far more than the socket buffers of a reader that does not read. */
static void big_render(void *arg, metrics_buf_t *out)
{
    (void)arg;
    metrics_family(out, "spillway:filler", "gauge", "bulk");
    for (int i = 0; i < 40000; i++) {
        char lb[64];
        snprintf(lb, sizeof lb, "i=\"%d\",pad=\"xxxxxxxxxxxxxxxxxxxxxxxx\"", i);
        metrics_sample(out, "spillway:filler", lb, i);
    }
}

/* Opens n slow clients on port, client k from 127.0.0.(first + k) (or all from first when
 * one_addr): even k send a request header that never ends, odd k ask for /metrics and never
 * read (or, readers 0, all send a header that never ends). fds[] gets the sockets (-1 where the
 * connection failed). Waits until every slow reader has its first byte of response (or EOF:
 * refused), so that they hold the server's send when this returns. */
static void open_slow(int *fds, int n, int port, uint32_t first, int one_addr, int readers)
{
    for (int k = 0; k < n; k++) {
        uint32_t src = (127u << 24) | (one_addr ? first : first + (uint32_t)k);
        int reader = readers && (k & 1);
        fds[k] = dial(src, INADDR_LOOPBACK, port, reader ? 4096 : 0);
        if (fds[k] < 0) continue;
        const char *msg = reader ? "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                                 : "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
        if (write(fds[k], msg, strlen(msg)) < 0) {
            close(fds[k]);
            fds[k] = -1;
        }
    }
    for (int k = 1; readers && k < n; k += 2) {
        if (fds[k] < 0) continue;
        struct pollfd p = {.fd = fds[k], .events = POLLIN};
        char c;
        /* answered, refused (EOF) or still waiting in the backlog after 5 s: either way */
        if (poll(&p, 1, 5000) > 0) (void)!recv(fds[k], &c, 1, MSG_PEEK);
    }

}

static void close_all(int *fds, int n)
{
    for (int k = 0; k < n; k++)
        if (fds[k] >= 0) close(fds[k]);
}

/* A non-loopback IPv4 address of this host (host order), or 0 when it has none. */
static uint32_t non_loopback_addr(void)
{
    struct ifaddrs *ifs = NULL, *i;
    uint32_t a = 0;
    if (getifaddrs(&ifs)) return 0;
    for (i = ifs; i && !a; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        uint32_t v = ntohl(((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr);
        if ((v >> 24) != 127) a = v;
    }
    freeifaddrs(ifs);
    return a;
}

static void test_default_bind(void)
{
    char err[256] = "";
    metrics_server_t *s = metrics_server_new(NULL, 0, NULL, err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    if (!s) return;
    int port = metrics_server_port(s);
    int64_t ms;
    CHECK(get_within_1s(port, "/healthz", &ms) == 200);
    CHECK(metrics_server_health_port(s) == -1);
    uint32_t ext = non_loopback_addr();
    if (!ext) {
        fprintf(stderr, "default bind: this host has no non-loopback IPv4 address to try\n");
    } else {
        int fd = dial(0, ext, port, 0);
        int e = errno;
        CHECKF(fd < 0 && e == ECONNREFUSED, "connect to %u.%u.%u.%u:%d: %s", ext >> 24,
               (ext >> 16) & 255, (ext >> 8) & 255, ext & 255, port,
               fd < 0 ? strerror(e) : "accepted");
        if (fd >= 0) close(fd);
    }
    metrics_server_free(s);
}

static void test_slow_clients_same_port(void)
{
    metrics_handlers_t h = {.render = big_render};
    char err[256] = "";
    metrics_server_t *s = metrics_server_new("127.0.0.1", 0, &h, err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    if (!s) return;
    int port = metrics_server_port(s);
    int spread[N_SLOW], one[N_SLOW];
    open_slow(spread, N_SLOW, port, 2, 0, 1); /* 127.0.0.2 .. 127.0.0.65, one each */
    int64_t ms;
    int st = get_within_1s(port, "/healthz", &ms);
    CHECKF(st == 200, "/healthz with %d slow clients from %d addresses: status %d after %lld ms",
           N_SLOW, N_SLOW, st, (long long)ms);
    int64_t ms1 = ms;
    open_slow(one, N_SLOW, port, 200, 1, 1); /* and 64 more from 127.0.0.200 */
    st = get_within_1s(port, "/healthz", &ms);
    CHECKF(st == 200, "/healthz with %d more slow clients from one address: status %d after "
           "%lld ms", N_SLOW, st, (long long)ms);
    int64_t ms2 = ms;
    st = get_within_1s(port, "/readyz", &ms);
    CHECKF(st == 200, "/readyz: status %d after %lld ms", st, (long long)ms);
    fprintf(stderr, "same port: /healthz after %lld ms (64 slow, 64 addresses), %lld ms (+64 from "
            "one address), /readyz %lld ms\n", (long long)ms1, (long long)ms2, (long long)ms);
    close_all(spread, N_SLOW);
    close_all(one, N_SLOW);
    metrics_server_free(s);
}

static void test_health_port(void)
{
    metrics_handlers_t h = {.render = big_render};
    metrics_server_opts_t o;
    metrics_server_opts_default(&o);
    o.port = 0;
    o.health_port = 0;
    o.max_conns = 4;
    char err[256] = "";
    metrics_server_t *s = metrics_server_start(&o, &h, err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    if (!s) return;
    int port = metrics_server_port(s), hport = metrics_server_health_port(s);
    CHECK(hport > 0 && hport != port);
    int64_t ms;
    CHECK(get_within_1s(port, "/healthz", &ms) == 200);
    /* every connection of the main port held (4), and 4 more waiting in its backlog */
    int fds[8];
    open_slow(fds, 8, port, 2, 0, 0);
    int st = get_within_1s(hport, "/healthz", &ms);
    CHECKF(st == 200, "health port /healthz with the main port full: %d after %lld ms", st,
           (long long)ms);
    CHECK(get_within_1s(hport, "/readyz", &ms) == 200);
    CHECK(get_within_1s(hport, "/metrics", &ms) == 404);
    close_all(fds, 8);
    metrics_server_free(s);
}

int main(void)
{
    test_default_bind();
    test_slow_clients_same_port();
    test_health_port();
    return check_exit();
}
