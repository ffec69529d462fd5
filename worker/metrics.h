/* worker/metrics.h: Prometheus metrics for the worker (internal to the worker module).
 *
 * Three parts, usable separately:
 *   - metrics_hist_t: a lock-free histogram with the fixed bucket bounds of notes/metrics.md;
 *     any thread may observe into it while another renders it.
 *   - metrics_buf_t: a growable text buffer and the functions that write the Prometheus text
 *     exposition format 0.0.4 into it (families, samples, histograms, label escaping).
 *   - metrics_server_t: a small HTTP server (libmicrohttpd, one internal thread per port) that
 *     serves /metrics, /healthz and /readyz through caller callbacks.
 *
 * Errors follow the project convention: 0 / -1 (or NULL) plus the caller's errstr where there
 * is one. Nothing here keeps global state; every object is owned by whoever created it. */
#ifndef SPILLWAY_WORKER_METRICS_H
#define SPILLWAY_WORKER_METRICS_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- histogram ----------------------------------------------------------------------------- */

/* Finite upper bounds (seconds) of the buckets, then one +Inf bucket: 22 + 1. */
#define METRICS_HIST_NBOUNDS 22
#define METRICS_HIST_NBUCKETS (METRICS_HIST_NBOUNDS + 1)

/* The bucket bounds, ascending: metrics_hist_bounds()[i] for 0 <= i < METRICS_HIST_NBOUNDS
 * (0.001 ... 2560). A pointer into constant storage. */
const double *metrics_hist_bounds(void);

/* A histogram. Zero-initialise it (static storage, calloc, memset or `= {0}` all do) or call
 * metrics_hist_init; it owns no memory and needs no cleanup.
 *
 * buckets[i] counts the observations that fell in bucket i alone (NOT cumulative): bucket i
 * holds values v with bounds[i-1] < v <= bounds[i], bucket METRICS_HIST_NBOUNDS everything above
 * the last bound. The renderer accumulates them.
 * sum_ns is the sum of the observations in whole nanoseconds (each observation rounded to the
 * nearest ns), an atomic integer so that adding is one fetch_add and the sum is exact for
 * integral ns: 2^64 ns is 584 years of summed latency, enough for any process lifetime.
 * count is the number of observations.
 *
 * All three are updated with relaxed atomics: a reader racing observers sees each field exact
 * but not a consistent set. metrics_hist_render therefore derives _count and the +Inf bucket
 * from the buckets it read (so the rendered histogram is always self-consistent); _sum may lag
 * or lead them by the observations in flight. */
typedef struct {
    _Atomic uint64_t buckets[METRICS_HIST_NBUCKETS];
    _Atomic uint64_t count;
    _Atomic uint64_t sum_ns;
} metrics_hist_t;

void metrics_hist_init(metrics_hist_t *h);
/* Records one value in seconds. Negative values and NaN are recorded as 0; one observation adds
 * at most 1e18 ns (~31.7 years) to the sum. Lock-free (three relaxed fetch_adds); any thread. */
void metrics_hist_observe(metrics_hist_t *h, double seconds);
/* Number of observations so far (one relaxed load). Any thread. */
uint64_t metrics_hist_count(const metrics_hist_t *h);

/* ---- exposition text builder --------------------------------------------------------------- */

/* A growable text buffer. Initialise with metrics_buf_init (or `= {0}`), release with
 * metrics_buf_free. data is NUL-terminated whenever it is non-NULL; len excludes the NUL.
 * After an allocation failure `oom` is set, later writes are ignored and every writer returns
 * -1; the text written before stays valid. Not thread-safe: one writer at a time. */
typedef struct {
    char *data;  /* owned; NULL until the first write */
    size_t len;  /* bytes of text, without the NUL */
    size_t cap;  /* bytes allocated */
    int oom;     /* 1 once an allocation failed */
} metrics_buf_t;

void metrics_buf_init(metrics_buf_t *b);
void metrics_buf_free(metrics_buf_t *b);
/* Empties the buffer (keeps the allocation, clears oom). */
void metrics_buf_reset(metrics_buf_t *b);
/* Appends formatted text. 0 or -1 (out of memory). */
int metrics_buf_printf(metrics_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int metrics_buf_append(metrics_buf_t *b, const char *s, size_t n);
/* Takes the text out of the buffer: returns data (the caller frees it with free()) and leaves
 * the buffer empty. NULL if nothing was written or after oom (the buffer is emptied). */
char *metrics_buf_steal(metrics_buf_t *b, size_t *len);

/* Starts a metric family: writes "# HELP name help" and "# TYPE name type" unless this buffer
 * already holds the TYPE line of that name (so calling it once per sample is harmless, but the
 * samples of one family must still be written together, as the format requires).
 * type: "counter", "gauge", "histogram" (or "summary", "untyped"). help may be NULL; backslash
 * and newline in it are escaped. 0, or -1 for an invalid metric name or type, or out of memory. */
int metrics_family(metrics_buf_t *b, const char *name, const char *type, const char *help);

/* Writes one sample line "name{labels} value". labels is the text between the braces, already
 * escaped (build it with metrics_labels), e.g. `tier="1"`; NULL or "" for none.
 * The value is written as an integer, without exponent, when it is whole and |v| < 2^63
 * (counters therefore print as integers), otherwise in the shortest form that reads back as
 * the same double; NaN, +Inf and -Inf as "NaN", "+Inf", "-Inf". 0, or -1 for an invalid name,
 * or out of memory. */
int metrics_sample(metrics_buf_t *b, const char *name, const char *labels, double value);

/* Writes the series of histogram h: name_bucket{labels,le="..."} for every bound and +Inf
 * (cumulative counts), name_sum (seconds) and name_count. Call metrics_family(name, "histogram")
 * first. h may be observed concurrently (see metrics_hist_t). 0 or -1 as metrics_sample. */
int metrics_hist_render(metrics_buf_t *b, const char *name, const char *labels,
                        const metrics_hist_t *h);

/* Builds escaped label text from name/value pairs ended by one NULL name:
 *     metrics_labels(buf, sizeof buf, "topic", t, "partition", "3", NULL)
 *         -> topic="<t escaped>",partition="3"
 * Values are escaped per the text format (\ -> \\, " -> \", newline -> \n). Label names are
 * written as given (callers pass literals). 0, or -1 when dst is too small (dst then holds
 * ""). */
int metrics_labels(char *dst, size_t dstlen, ...);
int metrics_labels_v(char *dst, size_t dstlen, va_list ap);
/* Escapes one label value into dst (NUL-terminated). 0, or -1 when dst is too small. */
int metrics_label_escape(char *dst, size_t dstlen, const char *value);

/* ---- HTTP server --------------------------------------------------------------------------- */

/* The callbacks behind the endpoints. All slots are optional (NULL).
 *
 * THREADS: each listening port (see metrics_server_opts_t) has its own libmicrohttpd thread;
 * a thread serves its requests one at a time, and the threads of two ports run concurrently:
 * render, ready and healthy may run at once (healthy and ready on two threads at once too)
 * while the rest of the process keeps running. Whatever they read must be safe to read from
 * another thread (atomics, or a lock they take). They must not block (a request waits for the
 * one before it on the same port: no network round trip in them) and must not call
 * metrics_server_free.
 *
 * render: writes the whole /metrics text into out (an empty, initialised buffer owned by the
 *         server). NULL: an empty page. If out->oom is set afterwards the reply is 500.
 * ready:  returns non-zero when ready (/readyz answers 200 "ready"), or 0 and writes a short
 *         reason into why[len] (answered 503 with that reason). NULL: always ready.
 * arg:    passed to all three. */
typedef struct {
    void (*render)(void *arg, metrics_buf_t *out);
    int (*ready)(void *arg, char *why, size_t len);
    /* healthy: like ready, for /healthz (200 "ok", or 503 with the reason). NULL: always. */
    int (*healthy)(void *arg, char *why, size_t len);
    void *arg;
} metrics_handlers_t;

typedef struct metrics_server metrics_server_t;

/* Where and how the server listens. metrics_server_opts_default fills the defaults named here.
 *   bind_addr    numeric IPv4 or IPv6 address, e.g. "127.0.0.1", "0.0.0.0", "::";
 *                NULL or "" = "127.0.0.1" (loopback only)
 *   port         0..65535; 0 binds an ephemeral port (tests): metrics_server_port reads it
 *   health_port  -1 (default): none. Else a second port (0 = ephemeral) on bind_addr with its
 *                own thread and its own connection limits that serves only /healthz and
 *                /readyz (404 otherwise): clients of `port`, however many or slow, never hold
 *                what a probe there needs. /healthz and /readyz are served on `port` as well.
 *   max_conns    connections held at once, per port (default 128); beyond it new connections
 *                wait in the listen backlog (64) until one closes
 *   max_conns_per_ip  connections one client address may hold at once, per port; more are
 *                closed at once (default 8; 0 = no limit)
 *   timeout_s    a connection that sends or reads nothing for this many seconds is closed:
 *                a slow request header or a reader that stopped (default 5) */
typedef struct {
    const char *bind_addr;
    int port;
    int health_port;
    unsigned max_conns, max_conns_per_ip, timeout_s;
} metrics_server_opts_t;

void metrics_server_opts_default(metrics_server_opts_t *o);

/* Starts serving as o says. The handlers struct is copied; h->arg must outlive the server.
 * Endpoints, for GET and HEAD:
 *   /metrics  200, Content-Type "text/plain; version=0.0.4; charset=utf-8", render's text
 *   /healthz  200 "ok" while healthy (see healthy), else 503 with its reason
 *   /readyz   200 "ready" or 503 with ready's reason
 *   other     404; other methods 405 (with an Allow header).
 * NULL + errstr on failure (bad address or limits, "address:port" in use, libmicrohttpd
 * error). */
metrics_server_t *metrics_server_start(const metrics_server_opts_t *o, const metrics_handlers_t *h,
                                       char *errstr, size_t errlen);
/* metrics_server_start with the defaults, bind_addr and port (no health port). */
metrics_server_t *metrics_server_new(const char *bind_addr, int port, const metrics_handlers_t *h,
                                     char *errstr, size_t errlen);
/* The port actually bound. */
int metrics_server_port(const metrics_server_t *s);
/* The health port actually bound, or -1 when there is none. */
int metrics_server_health_port(const metrics_server_t *s);
/* Stops the server (waits for a callback in progress to return, closes every connection and the
 * listening sockets) and frees it. NULL is a no-op. Not from a callback. */
void metrics_server_free(metrics_server_t *s);

#endif
