/* worker/metrics.c: histograms, the Prometheus text builder and the /metrics HTTP server.
 * Contracts are in worker/metrics.h. */
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- histogram ----------------------------------------------------------------------------- */

/* notes/metrics.md: the bucket bounds in seconds (fixed: dashboards and `spillway top` rely on
 * them). */
static const double hist_bounds[METRICS_HIST_NBOUNDS] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1,     2.5,   5,    7.5,  10,   20,   40,   80,  160,  640, 2560,
};

const double *metrics_hist_bounds(void) { return hist_bounds; }

void metrics_hist_init(metrics_hist_t *h)
{
    for (int i = 0; i < METRICS_HIST_NBUCKETS; i++) atomic_init(&h->buckets[i], 0);
    atomic_init(&h->count, 0);
    atomic_init(&h->sum_ns, 0);
}

/* Largest single observation added to sum_ns: 1e18 ns (about 31.7 years), so that one absurd
 * value cannot wrap the sum. */
#define HIST_MAX_NS 1e18

void metrics_hist_observe(metrics_hist_t *h, double seconds)
{
    if (!(seconds > 0)) seconds = 0; /* negative and NaN */
    int i = 0;
    while (i < METRICS_HIST_NBOUNDS && seconds > hist_bounds[i]) i++;
    double ns = seconds * 1e9 + 0.5;
    uint64_t add = ns >= HIST_MAX_NS ? (uint64_t)HIST_MAX_NS : (uint64_t)ns;
    atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, add, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

uint64_t metrics_hist_count(const metrics_hist_t *h)
{
    return atomic_load_explicit(&((metrics_hist_t *)h)->count, memory_order_relaxed);
}

/* ---- text buffer --------------------------------------------------------------------------- */

void metrics_buf_init(metrics_buf_t *b) { memset(b, 0, sizeof *b); }

void metrics_buf_free(metrics_buf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

void metrics_buf_reset(metrics_buf_t *b)
{
    b->len = 0;
    b->oom = 0;
    if (b->data) b->data[0] = '\0';
}

/* Makes room for n more bytes plus the NUL. 0 or -1 (oom set). */
static int buf_reserve(metrics_buf_t *b, size_t n)
{
    if (b->oom) return -1;
    if (n >= SIZE_MAX / 2 - b->len) goto fail;
    if (b->len + n + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) goto fail;
    b->data = p;
    b->cap = cap;
    return 0;
fail:
    b->oom = 1;
    return -1;
}

int metrics_buf_append(metrics_buf_t *b, const char *s, size_t n)
{
    if (buf_reserve(b, n)) return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static int buf_vprintf(metrics_buf_t *b, const char *fmt, va_list ap)
{
    if (b->oom) return -1;
    va_list ap2;
    va_copy(ap2, ap);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap2);
    va_end(ap2);
    if (n < 0) return -1;
    if (buf_reserve(b, (size_t)n)) return -1;
    if ((size_t)n < sizeof small) memcpy(b->data + b->len, small, (size_t)n + 1);
    else vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return 0;
}

int metrics_buf_printf(metrics_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

char *metrics_buf_steal(metrics_buf_t *b, size_t *len)
{
    char *p = b->oom ? NULL : b->data;
    if (len) *len = p ? b->len : 0;
    if (!p) free(b->data);
    memset(b, 0, sizeof *b);
    return p;
}

/* ---- exposition format --------------------------------------------------------------------- */

/* [a-zA-Z_:][a-zA-Z0-9_:]* */
static int valid_name(const char *s)
{
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                 (p != s && c >= '0' && c <= '9');
        if (!ok) return 0;
    }
    return 1;
}

/* Writes v as the text format wants it into out[64] (see metrics_sample). */
static void format_value(char *out, size_t len, double v)
{
    if (isnan(v)) {
        snprintf(out, len, "NaN");
    } else if (isinf(v)) {
        snprintf(out, len, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 9.2233720368547758e18) {
        snprintf(out, len, "%" PRId64, (int64_t)v);
    } else {
        /* the shortest %g form that reads back as v */
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(out, len, "%.*g", prec, v);
            if (strtod(out, NULL) == v) break;
        }
    }
}

/* Does the buffer already hold "# TYPE name " at the start of a line? */
static int has_type_line(const metrics_buf_t *b, const char *name)
{
    if (!b->data) return 0;
    size_t nl = strlen(name);
    const char *p = b->data;
    while ((p = strstr(p, "# TYPE ")) != NULL) {
        if ((p == b->data || p[-1] == '\n') && !strncmp(p + 7, name, nl) && p[7 + nl] == ' ')
            return 1;
        p += 7;
    }
    return 0;
}

int metrics_family(metrics_buf_t *b, const char *name, const char *type, const char *help)
{
    static const char *const types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
    int ok = 0;
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (type && !strcmp(type, types[i])) ok = 1;
    if (!ok || !valid_name(name)) return -1;
    if (has_type_line(b, name)) return b->oom ? -1 : 0;
    if (help) {
        if (metrics_buf_printf(b, "# HELP %s ", name)) return -1;
        /* HELP escapes backslash and newline (not quotes) */
        for (const char *p = help; *p; p++) {
            int rc = *p == '\\'  ? metrics_buf_append(b, "\\\\", 2)
                     : *p == '\n' ? metrics_buf_append(b, "\\n", 2)
                                  : metrics_buf_append(b, p, 1);
            if (rc) return -1;
        }
        if (metrics_buf_append(b, "\n", 1)) return -1;
    }
    return metrics_buf_printf(b, "# TYPE %s %s\n", name, type);
}

int metrics_sample(metrics_buf_t *b, const char *name, const char *labels, double value)
{
    if (!valid_name(name)) return -1;
    char v[64];
    format_value(v, sizeof v, value);
    if (labels && *labels) return metrics_buf_printf(b, "%s{%s} %s\n", name, labels, v);
    return metrics_buf_printf(b, "%s %s\n", name, v);
}

int metrics_hist_render(metrics_buf_t *b, const char *name, const char *labels,
                        const metrics_hist_t *h)
{
    if (!valid_name(name)) return -1;
    metrics_hist_t *hh = (metrics_hist_t *)h; /* atomic loads take non-const pointers */
    const char *sep = labels && *labels ? "," : "";
    const char *lab = labels ? labels : "";
    uint64_t cum = 0;
    char le[64];
    for (int i = 0; i < METRICS_HIST_NBUCKETS; i++) {
        cum += atomic_load_explicit(&hh->buckets[i], memory_order_relaxed);
        if (i < METRICS_HIST_NBOUNDS) format_value(le, sizeof le, hist_bounds[i]);
        else snprintf(le, sizeof le, "+Inf");
        if (metrics_buf_printf(b, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", name, lab, sep, le,
                               cum))
            return -1;
    }
    /* _count is the +Inf bucket as read above, so the histogram is self-consistent even while
     * observers run; _sum is read afterwards. */
    uint64_t sum_ns = atomic_load_explicit(&hh->sum_ns, memory_order_relaxed);
    char sum[64];
    format_value(sum, sizeof sum, (double)sum_ns / 1e9);
    const char *lb = *lab ? "{" : "", *rb = *lab ? "}" : "";
    return metrics_buf_printf(b, "%s_sum%s%s%s %s\n%s_count%s%s%s %" PRIu64 "\n", name, lb, lab,
                              rb, sum, name, lb, lab, rb, cum);
}

int metrics_label_escape(char *dst, size_t dstlen, const char *value)
{
    size_t o = 0;
    if (!dstlen) return -1;
    for (const char *p = value ? value : ""; *p; p++) {
        const char *rep = NULL;
        if (*p == '\\') rep = "\\\\";
        else if (*p == '"') rep = "\\\"";
        else if (*p == '\n') rep = "\\n";
        size_t n = rep ? 2 : 1;
        if (o + n >= dstlen) goto fail;
        if (rep) memcpy(dst + o, rep, 2);
        else dst[o] = *p;
        o += n;
    }
    dst[o] = '\0';
    return 0;
fail:
    dst[0] = '\0';
    return -1;
}

int metrics_labels_v(char *dst, size_t dstlen, va_list ap)
{
    size_t o = 0;
    const char *k;
    if (!dstlen) return -1;
    dst[0] = '\0';
    while ((k = va_arg(ap, const char *)) != NULL) {
        const char *v = va_arg(ap, const char *);
        int n = snprintf(dst + o, dstlen - o, "%s%s=\"", o ? "," : "", k);
        if (n < 0 || (size_t)n >= dstlen - o) goto fail;
        o += (size_t)n;
        if (metrics_label_escape(dst + o, dstlen - o, v)) goto fail;
        o += strlen(dst + o);
        if (o + 1 >= dstlen) goto fail;
        dst[o++] = '"';
        dst[o] = '\0';
    }
    return 0;
fail:
    dst[0] = '\0';
    return -1;
}

int metrics_labels(char *dst, size_t dstlen, ...)
{
    va_list ap;
    va_start(ap, dstlen);
    int rc = metrics_labels_v(dst, dstlen, ap);
    va_end(ap);
    return rc;
}

/* ---- HTTP server --------------------------------------------------------------------------- */

/* The access handler's return type changed from int to enum MHD_Result in 0.9.71. */
#if MHD_VERSION >= 0x00097002
#define MHD_RESULT enum MHD_Result
#else
#define MHD_RESULT int
#endif
/* MHD_USE_INTERNAL_POLLING_THREAD is the 0.9.54+ name of MHD_USE_SELECT_INTERNALLY;
 * MHD_USE_AUTO (pick epoll/poll/select) exists since 0.9.56. */
#if MHD_VERSION >= 0x00095600
#define METRICS_MHD_FLAGS (MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO)
#elif MHD_VERSION >= 0x00095400
#define METRICS_MHD_FLAGS MHD_USE_INTERNAL_POLLING_THREAD
#else
#define METRICS_MHD_FLAGS MHD_USE_SELECT_INTERNALLY
#endif

static const char content_type_metrics[] = "text/plain; version=0.0.4; charset=utf-8";
static const char content_type_text[] = "text/plain; charset=utf-8";

struct metrics_server;

/* One listening port: its daemon (own thread) and what it serves. */
typedef struct {
    struct metrics_server *s;
    struct MHD_Daemon *daemon; /* owned; runs its own thread; NULL when not started */
    int port;                  /* bound port, -1 when none */
    int health_only;           /* serves /healthz and /readyz only */
} endpoint_t;

struct metrics_server {
    endpoint_t main, health;   /* health.daemon NULL: no health port */
    metrics_handlers_t h;      /* copy of the caller's */
    /* libmicrohttpd's messages are kept only while metrics_server_new runs (startup errors go
     * into errstr); afterwards the logger drops them. */
    atomic_int capture_log;
    char log[256];
};

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct metrics_server *s = cls;
    if (!atomic_load(&s->capture_log)) return;
    vsnprintf(s->log, sizeof s->log, fmt, ap);
    size_t n = strlen(s->log);
    while (n && (s->log[n - 1] == '\n' || s->log[n - 1] == '\r')) s->log[--n] = '\0';
}

/* Queues one response. body: owned (freed with free()) when own, else static. */
static MHD_RESULT reply(struct MHD_Connection *c, unsigned status, const char *ctype, char *body,
                        size_t len, int own)
{
    struct MHD_Response *r;
    if (own)
        r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    else
        r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (own) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, "Allow", "GET, HEAD");
    MHD_RESULT rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static MHD_RESULT reply_text(struct MHD_Connection *c, unsigned status, const char *text)
{
    return reply(c, status, content_type_text, (char *)text, strlen(text), 0);
}

/* Runs on MHD's thread (see metrics_handlers_t). Every request is answered on its first call:
 * GET and HEAD carry no body, and for other methods MHD discards a body after the 405. */
static MHD_RESULT on_request(void *cls, struct MHD_Connection *c, const char *url,
                             const char *method, const char *version, const char *upload_data,
                             size_t *upload_data_size, void **req_cls)
{
    const endpoint_t *ep = cls;
    struct metrics_server *s = ep->s;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n");
    if (!strcmp(url, "/metrics") && !ep->health_only) {
        metrics_buf_t out;
        metrics_buf_init(&out);
        if (s->h.render) s->h.render(s->h.arg, &out);
        if (out.oom) {
            metrics_buf_free(&out);
            return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
        }
        size_t len;
        char *body = metrics_buf_steal(&out, &len);
        if (!body) return reply(c, MHD_HTTP_OK, content_type_metrics, "", 0, 0);
        return reply(c, MHD_HTTP_OK, content_type_metrics, body, len, 1); /* MHD owns body */
    }
    if (!strcmp(url, "/healthz")) {
        char why[256] = "";
        if (!s->h.healthy || s->h.healthy(s->h.arg, why, sizeof why))
            return reply_text(c, MHD_HTTP_OK, "ok\n");
        why[sizeof why - 1] = '\0';
        char *body = strdup(why[0] ? why : "unhealthy"); /* MHD sends it after we return */
        if (!body) return reply_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "unhealthy\n");
        return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, content_type_text, body, strlen(body), 1);
    }
    if (!strcmp(url, "/readyz")) {
        char why[256] = "";
        if (!s->h.ready || s->h.ready(s->h.arg, why, sizeof why))
            return reply_text(c, MHD_HTTP_OK, "ready\n");
        why[sizeof why - 1] = '\0';
        size_t n = strlen(why);
        char *body = malloc(n + 2);
        if (!body) return reply_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "not ready\n");
        memcpy(body, n ? why : "not ready", n ? n : 9);
        if (!n) n = 9;
        body[n] = '\n';
        body[n + 1] = '\0';
        return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, content_type_text, body, n + 1, 1);
    }
    return reply_text(c, MHD_HTTP_NOT_FOUND, "not found\n");
}

/* Creates, binds and listens a TCP socket on addr:port. The socket, or -1 + errstr. Binding it
 * here (not in MHD) gives the caller a precise error: which address and port, and why. */
static int listen_socket(const char *addr, int port, char *errstr, size_t errlen)
{
    struct addrinfo hints, *ai = NULL;
    char portstr[16];
    int fd = -1, one = 1, rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
    snprintf(portstr, sizeof portstr, "%d", port);
    if ((rc = getaddrinfo(addr, portstr, &hints, &ai)) != 0) {
        snprintf(errstr, errlen, "metrics: bad bind address '%s' (want a numeric IPv4/IPv6 "
                 "address): %s", addr, gai_strerror(rc));
        goto fail;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(errstr, errlen, "metrics: socket: %s", strerror(errno));
        goto fail;
    }
    /* SO_REUSEADDR: a restarted worker may rebind while old connections sit in TIME_WAIT; it
     * does not allow two listeners on one port (that still fails with EADDRINUSE). */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 64)) {
        const char *fmt = ai->ai_family == AF_INET6 ? "metrics: cannot listen on [%s]:%d: %s"
                                                    : "metrics: cannot listen on %s:%d: %s";
        snprintf(errstr, errlen, fmt, addr, port, strerror(errno));
        goto fail;
    }
    freeaddrinfo(ai);
    return fd;
fail:
    if (fd >= 0) close(fd);
    if (ai) freeaddrinfo(ai);
    return -1;
}

void metrics_server_opts_default(metrics_server_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->bind_addr = "127.0.0.1";
    o->health_port = -1;
    o->max_conns = 128;
    o->max_conns_per_ip = 8;
    o->timeout_s = 5;
}

/* Binds o->bind_addr:port and starts ep's daemon on it. 0, or -1 + errstr. */
static int endpoint_start(endpoint_t *ep, struct metrics_server *s, const metrics_server_opts_t *o,
                          int port, int health_only, char *errstr, size_t errlen)
{
    ep->s = s;
    ep->health_only = health_only;
    int fd = listen_socket(o->bind_addr, port, errstr, errlen);
    if (fd < 0) return -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl)) {
        snprintf(errstr, errlen, "metrics: getsockname: %s", strerror(errno));
        close(fd);
        return -1;
    }
    ep->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                        : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    /* MHD takes the listening socket: MHD_stop_daemon closes it, and so do MHD_start_daemon's
     * failure paths (0.9.75 and later), so fd is not closed here after this call either way: a
     * leaked descriptor on an old version beats closing a number another thread may reuse.
     * The options list ends early (MHD_OPTION_END in place of the per-address limit) when
     * max_conns_per_ip is 0. */
    s->log[0] = '\0';
    ep->daemon = MHD_start_daemon(
        METRICS_MHD_FLAGS | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, ep,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_LIMIT, o->max_conns, MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s,
        o->max_conns_per_ip ? MHD_OPTION_PER_IP_CONNECTION_LIMIT : MHD_OPTION_END,
        o->max_conns_per_ip, MHD_OPTION_END);
    if (!ep->daemon) {
        snprintf(errstr, errlen, "metrics: cannot start the HTTP server on %s:%d%s%s",
                 o->bind_addr, port, s->log[0] ? ": " : "", s->log);
        return -1;
    }
    return 0;
}

metrics_server_t *metrics_server_start(const metrics_server_opts_t *opts,
                                       const metrics_handlers_t *h, char *errstr, size_t errlen)
{
    struct metrics_server *s = NULL;
    metrics_server_opts_t o = *opts;
    if (!o.bind_addr || !*o.bind_addr) o.bind_addr = "127.0.0.1";
    if (o.port < 0 || o.port > 65535 || o.health_port < -1 || o.health_port > 65535) {
        snprintf(errstr, errlen, "metrics: port %d or health port %d out of range 0..65535",
                 o.port, o.health_port);
        goto fail;
    }
    if (!o.max_conns || !o.timeout_s) {
        snprintf(errstr, errlen, "metrics: max_conns and timeout_s must be at least 1");
        goto fail;
    }
    s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(errstr, errlen, "metrics: out of memory");
        goto fail;
    }
    if (h) s->h = *h;
    s->health.port = -1;
    atomic_init(&s->capture_log, 1);
    if (endpoint_start(&s->main, s, &o, o.port, 0, errstr, errlen)) goto fail;
    if (o.health_port >= 0 && endpoint_start(&s->health, s, &o, o.health_port, 1, errstr, errlen))
        goto fail;
    atomic_store(&s->capture_log, 0);
    return s;
fail:
    metrics_server_free(s);
    return NULL;
}

metrics_server_t *metrics_server_new(const char *bind_addr, int port, const metrics_handlers_t *h,
                                     char *errstr, size_t errlen)
{
    metrics_server_opts_t o;
    metrics_server_opts_default(&o);
    o.bind_addr = bind_addr;
    o.port = port;
    return metrics_server_start(&o, h, errstr, errlen);
}

int metrics_server_port(const metrics_server_t *s) { return s->main.port; }

int metrics_server_health_port(const metrics_server_t *s)
{
    return s->health.daemon ? s->health.port : -1;
}

void metrics_server_free(metrics_server_t *s)
{
    if (!s) return;
    if (s->health.daemon) MHD_stop_daemon(s->health.daemon);
    if (s->main.daemon) MHD_stop_daemon(s->main.daemon);
    free(s);
}
