/* cli/top.c: `spillway top [URL] [--interval S] [--once] [--max-seqs N]`: a live summary of one
 * worker's /metrics (notes/metrics.md).
 *
 * It scrapes URL (default http://127.0.0.1:9464/metrics; only http://, an empty path means
 * /metrics) with a small HTTP/1.0 client, parses the Prometheus text format (comments ignored)
 * and shows what changed between two scrapes: results/s, token rates, DLQ rate, consumer lag in
 * total and per partition, running/waiting requests and batch occupancy, KV usage, prefix cache
 * hit rate per tier (over the interval and since start), TTFT and end-to-end latency quantiles
 * estimated from the histogram buckets as Prometheus' histogram_quantile does, and redis_up.
 *
 * On a terminal it redraws every interval until Ctrl-C; otherwise (or with --once) it prints
 * one plain table after two scrapes one interval apart and exits.
 * Exit status: 0, 1 when the URL cannot be fetched or is not Prometheus text, 2 usage error. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common/clock.h"
#include "worker/worker.h"

#define TOP_DEFAULT_URL "http://127.0.0.1:9464/metrics"
#define TOP_HTTP_TIMEOUT_S 5.0      /* connect + request + response, per scrape */
#define TOP_MAX_BODY (64u << 20)    /* largest /metrics page read */
#define TOP_MAX_PARTITIONS 20       /* partitions listed; beyond that the highest lags */
#define TOP_MAX_BUCKETS 64          /* histogram buckets considered */

/* Set by the SIGINT/SIGTERM handler in terminal mode (owned by this command). */
static volatile sig_atomic_t top_stop;

static void top_on_signal(int sig)
{
    (void)sig;
    top_stop = 1;
}

/* ---- URL and HTTP client ------------------------------------------------------------------- */

typedef struct {
    char host[256];     /* without brackets */
    char port[8];
    char path[2048];    /* starts with '/' */
    char hostport[300]; /* the Host header: host[:port], IPv6 in brackets */
} top_url_t;

/* Parses http://HOST[:PORT][/PATH]; HOST may be [IPv6]. 0 or -1 + err. */
static int url_parse(const char *url, top_url_t *u, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    if (strncasecmp(url, "http://", 7)) {
        snprintf(err, errlen, "'%s': only http:// URLs are supported", url);
        return -1;
    }
    const char *p = url + 7, *hend;
    int bracket = *p == '[';
    if (bracket) {
        hend = strchr(++p, ']');
        if (!hend) goto bad;
    } else {
        hend = p + strcspn(p, ":/?#");
    }
    size_t hl = (size_t)(hend - p);
    if (!hl || hl >= sizeof u->host) goto bad;
    memcpy(u->host, p, hl);
    p = hend + bracket;
    long port = 80;
    if (*p == ':') {
        char *e;
        port = strtol(p + 1, &e, 10);
        if (e == p + 1 || port < 1 || port > 65535) goto bad;
        p = e;
    }
    snprintf(u->port, sizeof u->port, "%ld", port);
    /* the path: as given, "/metrics" when empty (a bare query string goes on /metrics) */
    int pl;
    if (!*p || *p == '#') pl = snprintf(u->path, sizeof u->path, "/metrics");
    else if (*p == '?') pl = snprintf(u->path, sizeof u->path, "/metrics%s", p);
    else if (*p == '/') pl = snprintf(u->path, sizeof u->path, "%s", p);
    else goto bad;
    if (pl < 0 || pl >= (int)sizeof u->path || strpbrk(u->path, " \r\n")) goto bad;
    char *frag = strchr(u->path, '#');
    if (frag) *frag = '\0';
    snprintf(u->hostport, sizeof u->hostport, bracket ? "[%s]%s%s" : "%s%s%s", u->host,
             port == 80 ? "" : ":", port == 80 ? "" : u->port);
    return 0;
bad:
    snprintf(err, errlen, "'%s' is not a valid http://HOST[:PORT][/PATH] URL", url);
    return -1;
}

/* Waits for events on fd until the deadline. 0 ready, -1 with errno (ETIMEDOUT, EINTR when
 * Ctrl-C was pressed, or poll's). */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - sw_mono_s();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pfd = {fd, events, 0};
        int rc = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (rc > 0) return 0;
        if (rc < 0 && errno == EINTR) {
            if (top_stop) return -1;
            continue;
        }
        if (rc < 0) return -1;
    }
}

/* Connects to u (every address getaddrinfo gives, in order). The socket (non-blocking), or -1
 * + err. */
static int http_connect(const top_url_t *u, double deadline, char *err, size_t errlen)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(u->host, u->port, &hints, &ai);
    if (rc) {
        snprintf(err, errlen, "cannot resolve %s: %s", u->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, last_errno = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) == 0) {
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) break;
            last_errno = soerr ? soerr : errno;
        } else {
            last_errno = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        snprintf(err, errlen, "cannot connect to %s: %s", u->hostport, strerror(last_errno));
    return fd;
}

/* GETs u. 0: *body is the response body (owned, NUL-terminated; embedded NULs possible), *len
 * its length. -1 + err: connection failure, timeout, not HTTP, or a status other than 200. */
static int http_get(const top_url_t *u, char **body, size_t *len, char *err, size_t errlen)
{
    double deadline = sw_mono_s() + TOP_HTTP_TIMEOUT_S;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    *body = NULL;
    *len = 0;
    int fd = http_connect(u, deadline, err, errlen);
    if (fd < 0) goto fail;
    char req[2600];
    int rl = snprintf(req, sizeof req,
                      "GET %s HTTP/1.0\r\nHost: %s\r\nAccept: text/plain;version=0.0.4\r\n"
                      "User-Agent: spillway-top\r\nConnection: close\r\n\r\n",
                      u->path, u->hostport);
    for (int off = 0; off < rl;) {
        ssize_t w = send(fd, req + off, (size_t)(rl - off), MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(fd, POLLOUT, deadline)) goto io_fail;
            continue;
        }
        if (w < 0) goto io_fail;
        off += (int)w;
    }
    for (;;) {
        if (n + 65536 + 1 > cap) {
            if (cap >= TOP_MAX_BODY) {
                snprintf(err, errlen, "response from %s larger than %u MiB", u->hostport,
                         TOP_MAX_BODY >> 20);
                goto fail;
            }
            size_t ncap = cap ? cap * 2 : 131072;
            char *p = realloc(buf, ncap);
            if (!p) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            buf = p;
            cap = ncap;
        }
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(fd, POLLIN, deadline)) goto io_fail;
            continue;
        }
        if (r < 0) goto io_fail;
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    fd = -1;
    if (!buf || n < 12 || strncmp(buf, "HTTP/1.", 7)) {
        snprintf(err, errlen, "%s did not answer HTTP", u->hostport);
        goto fail;
    }
    buf[n] = '\0';
    int status = atoi(buf + 9);
    char *hdr_end = strstr(buf, "\r\n\r\n");
    size_t sep = 4;
    if (!hdr_end) {
        hdr_end = strstr(buf, "\n\n");
        sep = 2;
    }
    if (!hdr_end) {
        snprintf(err, errlen, "truncated HTTP response from %s", u->hostport);
        goto fail;
    }
    if (status != 200) {
        size_t ll = strcspn(buf, "\r\n");
        snprintf(err, errlen, "%.*s", (int)(ll > 200 ? 200 : ll), buf);
        goto fail;
    }
    *hdr_end = '\0';
    for (char *h = strchr(buf, '\n'); h; h = strchr(h + 1, '\n')) {
        if (!strncasecmp(h + 1, "Transfer-Encoding:", 18) && strcasestr(h + 19, "chunked")) {
            snprintf(err, errlen, "%s sent a chunked response to an HTTP/1.0 request",
                     u->hostport);
            goto fail;
        }
    }
    size_t off = (size_t)(hdr_end - buf) + sep;
    *len = n - off;
    memmove(buf, buf + off, *len);
    buf[*len] = '\0';
    *body = buf;
    return 0;
io_fail:
    snprintf(err, errlen, "%s: %s", u->hostport,
             errno == ETIMEDOUT ? "timed out" : errno == EINTR ? "interrupted" : strerror(errno));
fail:
    if (fd >= 0) close(fd);
    free(buf);
    return -1;
}

/* ---- Prometheus text format ------------------------------------------------------------------ */

typedef struct {
    char *name;    /* owned */
    char *labels;  /* owned: "key\0value\0" nlab times (values unescaped); NULL when none */
    size_t lablen; /* bytes of labels */
    int nlab;
    double v;
} top_sample_t;

/* One scrape. */
typedef struct {
    top_sample_t *s; /* [n] owned */
    int n, cap;
    double t;        /* monotonic seconds when the response arrived */
} top_snap_t;

static void snap_free(top_snap_t *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->s[i].name);
        free(s->s[i].labels);
    }
    free(s->s);
    memset(s, 0, sizeof *s);
}

static int is_name_char(char c, int first, int colon)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
           (!first && c >= '0' && c <= '9');
}

/* Parses the text exposition format into out (empty). Comment and blank lines are skipped; a
 * timestamp after the value is ignored. 0, or -1 + err naming the first bad line. */
static int parse_metrics(const char *text, size_t len, top_snap_t *out, char *err, size_t errlen)
{
    const char *p = text, *end = text + len;
    char *lab = NULL;
    size_t labcap = 0;
    int line = 0;
    const char *why = NULL;
    while (p < end) {
        line++;
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        const char *q = p;
        while (q < eol && (*q == ' ' || *q == '\t')) q++;
        if (q == eol || *q == '#' || (*q == '\r' && q + 1 == eol)) {
            p = eol + 1;
            continue;
        }
        /* name */
        const char *ns = q;
        while (q < eol && is_name_char(*q, q == ns, 1)) q++;
        if (q == ns) {
            why = "expected a metric name";
            goto bad;
        }
        size_t nl = (size_t)(q - ns);
        /* labels: unescaped into lab as key\0value\0 */
        size_t lablen = 0;
        int nlab = 0;
        if (q < eol && *q == '{') {
            q++;
            for (;;) {
                while (q < eol && (*q == ' ' || *q == '\t')) q++;
                if (q < eol && *q == '}') {
                    q++;
                    break;
                }
                const char *ks = q;
                while (q < eol && is_name_char(*q, q == ks, 0)) q++;
                if (q == ks) {
                    why = "expected a label name";
                    goto bad;
                }
                size_t kl = (size_t)(q - ks);
                while (q < eol && (*q == ' ' || *q == '\t')) q++;
                if (q >= eol || *q != '=') {
                    why = "expected '=' after a label name";
                    goto bad;
                }
                q++;
                while (q < eol && (*q == ' ' || *q == '\t')) q++;
                if (q >= eol || *q != '"') {
                    why = "expected a quoted label value";
                    goto bad;
                }
                q++;
                /* worst case: key, NUL, the rest of the line, NUL */
                size_t need = lablen + kl + 1 + (size_t)(eol - q) + 1;
                if (need > labcap) {
                    size_t nc = labcap ? labcap : 256;
                    while (nc < need) nc *= 2;
                    char *np = realloc(lab, nc);
                    if (!np) {
                        why = "out of memory";
                        goto bad;
                    }
                    lab = np;
                    labcap = nc;
                }
                memcpy(lab + lablen, ks, kl);
                lablen += kl;
                lab[lablen++] = '\0';
                for (;;) {
                    if (q >= eol) {
                        why = "unterminated label value";
                        goto bad;
                    }
                    if (*q == '"') break;
                    if (*q == '\\' && q + 1 < eol) {
                        q++;
                        lab[lablen++] = *q == 'n' ? '\n' : *q;
                    } else {
                        lab[lablen++] = *q;
                    }
                    q++;
                }
                q++;
                lab[lablen++] = '\0';
                nlab++;
                while (q < eol && (*q == ' ' || *q == '\t')) q++;
                if (q < eol && *q == ',') {
                    q++;
                    continue;
                }
                if (q < eol && *q == '}') {
                    q++;
                    break;
                }
                why = "expected ',' or '}' in the labels";
                goto bad;
            }
        }
        /* value */
        if (q >= eol || (*q != ' ' && *q != '\t')) {
            why = "expected a space and a value after the name";
            goto bad;
        }
        while (q < eol && (*q == ' ' || *q == '\t')) q++;
        char num[64];
        size_t vl = 0;
        while (q + vl < eol && q[vl] != ' ' && q[vl] != '\t' && q[vl] != '\r') vl++;
        if (!vl || vl >= sizeof num) {
            why = "expected a value";
            goto bad;
        }
        memcpy(num, q, vl);
        num[vl] = '\0';
        char *e;
        double v = strtod(num, &e);
        if (*e || e == num) {
            why = "bad sample value";
            goto bad;
        }
        /* store */
        if (out->n == out->cap) {
            int nc = out->cap ? out->cap * 2 : 256;
            top_sample_t *ns2 = realloc(out->s, (size_t)nc * sizeof *ns2);
            if (!ns2) {
                why = "out of memory";
                goto bad;
            }
            out->s = ns2;
            out->cap = nc;
        }
        top_sample_t *s = &out->s[out->n];
        memset(s, 0, sizeof *s);
        s->name = strndup(ns, nl);
        s->labels = lablen ? malloc(lablen) : NULL;
        if (!s->name || (lablen && !s->labels)) {
            free(s->name);
            free(s->labels);
            why = "out of memory";
            goto bad;
        }
        if (lablen) memcpy(s->labels, lab, lablen);
        s->lablen = lablen;
        s->nlab = nlab;
        s->v = v;
        out->n++;
        p = eol + 1;
    }
    free(lab);
    if (out->n == 0) {
        snprintf(err, errlen, "not Prometheus text: no samples");
        return -1;
    }
    return 0;
bad:
    free(lab);
    snprintf(err, errlen, "not Prometheus text: line %d: %s", line, why);
    return -1;
}

/* Value of label key of sample s, or NULL. */
static const char *label_get(const top_sample_t *s, const char *key)
{
    const char *p = s->labels;
    for (int i = 0; i < s->nlab; i++) {
        const char *v = p + strlen(p) + 1;
        if (!strcmp(p, key)) return v;
        p = v + strlen(v) + 1;
    }
    return NULL;
}

/* Does s match name and (when key is non-NULL) label key == val? */
static int sample_match(const top_sample_t *s, const char *name, const char *key, const char *val)
{
    if (strcmp(s->name, name)) return 0;
    if (!key) return 1;
    const char *v = label_get(s, key);
    return v && !strcmp(v, val);
}

/* The sample of prev with the same name and labels as s, or NULL. */
static const top_sample_t *same_series(const top_snap_t *prev, const top_sample_t *s)
{
    for (int i = 0; i < prev->n; i++) {
        const top_sample_t *o = &prev->s[i];
        if (o->lablen == s->lablen && o->nlab == s->nlab && !strcmp(o->name, s->name) &&
            (!s->lablen || !memcmp(o->labels, s->labels, s->lablen)))
            return o;
    }
    return NULL;
}

/* Sum of the matching series of cur (see sample_match); NaN when there is none. */
static double snap_sum(const top_snap_t *cur, const char *name, const char *key, const char *val)
{
    double sum = 0;
    int found = 0;
    for (int i = 0; i < cur->n; i++)
        if (sample_match(&cur->s[i], name, key, val)) {
            sum += cur->s[i].v;
            found = 1;
        }
    return found ? sum : NAN;
}

/* Counter increase between prev and cur over the matching series, summed. A series that went
 * down was reset (a restarted worker): its increase is its current value, as Prometheus counts
 * it. A series new in cur counts from 0. NaN when cur has no matching series. */
static double snap_increase(const top_snap_t *prev, const top_snap_t *cur, const char *name,
                            const char *key, const char *val)
{
    double inc = 0;
    int found = 0;
    for (int i = 0; i < cur->n; i++) {
        const top_sample_t *s = &cur->s[i];
        if (!sample_match(s, name, key, val)) continue;
        const top_sample_t *o = same_series(prev, s);
        double before = o ? o->v : 0;
        inc += s->v >= before ? s->v - before : s->v;
        found = 1;
    }
    return found ? inc : NAN;
}

static double snap_rate(const top_snap_t *prev, const top_snap_t *cur, const char *name,
                        const char *key, const char *val)
{
    double dt = cur->t - prev->t;
    return dt > 0 ? snap_increase(prev, cur, name, key, val) / dt : NAN;
}

typedef struct {
    double le; /* upper bound; INFINITY for +Inf */
    double c;  /* cumulative count */
} top_bucket_t;

static int cmp_bucket(const void *a, const void *b)
{
    double x = ((const top_bucket_t *)a)->le, y = ((const top_bucket_t *)b)->le;
    return x < y ? -1 : x > y;
}

/* The buckets of histogram `name` (series name_bucket), summed by le over all its series, in
 * ascending le: the counts in cur, or their increase since prev when prev is non-NULL. The
 * number of buckets (at most max). */
static int hist_buckets(const top_snap_t *prev, const top_snap_t *cur, const char *name,
                        top_bucket_t *out, int max)
{
    char bname[256];
    int n = 0;
    snprintf(bname, sizeof bname, "%s_bucket", name);
    for (int i = 0; i < cur->n; i++) {
        const top_sample_t *s = &cur->s[i];
        if (strcmp(s->name, bname)) continue;
        const char *les = label_get(s, "le");
        if (!les) continue;
        char *e;
        double le = strtod(les, &e);
        if (*e || e == les) continue;
        double v = s->v;
        if (prev) {
            const top_sample_t *o = same_series(prev, s);
            double before = o ? o->v : 0;
            v = v >= before ? v - before : v;
        }
        int j = 0;
        while (j < n && out[j].le != le) j++;
        if (j == n) {
            if (n == max) continue;
            out[n++] = (top_bucket_t){le, 0};
        }
        out[j].c += v;
    }
    qsort(out, (size_t)n, sizeof *out, cmp_bucket);
    return n;
}

/* The q-quantile (0 < q < 1) of the observations counted in cumulative buckets b[n], estimated
 * as Prometheus' histogram_quantile does: linear interpolation inside the bucket holding rank
 * q*total (the first bucket's lower bound is 0); a rank in the +Inf bucket gives the highest
 * finite bound. NaN without observations or without a +Inf bucket. b is made monotonic. */
static double hist_quantile(double q, top_bucket_t *b, int n)
{
    if (n < 2 || !isinf(b[n - 1].le)) return NAN;
    for (int i = 1; i < n; i++)
        if (b[i].c < b[i - 1].c) b[i].c = b[i - 1].c;
    double total = b[n - 1].c;
    if (!(total > 0)) return NAN;
    double rank = q * total;
    int i = 0;
    while (i < n - 1 && b[i].c < rank) i++;
    if (i == n - 1) return b[n - 2].le;
    if (i == 0 && b[0].le <= 0) return b[0].le;
    double lo = i ? b[i - 1].le : 0, below = i ? b[i - 1].c : 0;
    return lo + (b[i].le - lo) * (rank - below) / (b[i].c - below);
}

/* ---- the table ----------------------------------------------------------------------------- */

typedef struct {
    const char *url;
    double interval;
    int max_seqs;
} top_opts_t;

/* Text of v with prec decimals, "-" for NaN. */
static const char *fmt_num(char *buf, size_t len, double v, int prec)
{
    if (isnan(v)) snprintf(buf, len, "-");
    else snprintf(buf, len, "%.*f", prec, v);
    return buf;
}

/* "12.3%" of num/den, "-" when den is 0 or unknown. */
static const char *fmt_pct(char *buf, size_t len, double num, double den)
{
    if (isnan(num) || isnan(den) || den <= 0) snprintf(buf, len, "-");
    else snprintf(buf, len, "%.1f%%", 100.0 * num / den);
    return buf;
}

/* A duration: "45.0ms" below a second, "1.23s" above; "-" for NaN. */
static const char *fmt_dur(char *buf, size_t len, double s)
{
    if (isnan(s)) snprintf(buf, len, "-");
    else if (s < 1) snprintf(buf, len, "%.1fms", s * 1000);
    else snprintf(buf, len, "%.2fs", s);
    return buf;
}

/* "name  r1 (a 1.00, b 2.00)": the rate of counter name and its breakdown by label key. */
static void print_rate_by(FILE *f, const char *title, const top_snap_t *prev,
                          const top_snap_t *cur, const char *name, const char *key)
{
    char b[64];
    fprintf(f, "%-20s %s", title, fmt_num(b, sizeof b, snap_rate(prev, cur, name, NULL, NULL), 2));
    int shown = 0;
    for (int i = 0; i < cur->n; i++) {
        const top_sample_t *s = &cur->s[i];
        const char *v;
        if (strcmp(s->name, name) || !(v = label_get(s, key))) continue;
        int dup = 0; /* first series with this label value only */
        for (int j = 0; j < i && !dup; j++)
            dup = sample_match(&cur->s[j], name, key, v);
        if (dup) continue;
        double r = snap_rate(prev, cur, name, key, v);
        if (!(r > 0)) continue;
        fprintf(f, "%s%s %.2f", shown++ ? ", " : "  (", v, r);
    }
    fprintf(f, "%s\n", shown ? ")" : "");
}

static void print_quantiles(FILE *f, const char *title, const top_snap_t *prev,
                            const top_snap_t *cur, const char *name)
{
    top_bucket_t b[TOP_MAX_BUCKETS];
    int n = hist_buckets(prev, cur, name, b, TOP_MAX_BUCKETS);
    double count = n ? b[n - 1].c : NAN;
    char s50[32], s90[32], s99[32], sn[32];
    double p50 = hist_quantile(0.5, b, n), p90 = hist_quantile(0.9, b, n);
    double p99 = hist_quantile(0.99, b, n);
    fprintf(f, "%-20s p50 %-9s p90 %-9s p99 %-9s n=%s\n", title, fmt_dur(s50, sizeof s50, p50),
            fmt_dur(s90, sizeof s90, p90), fmt_dur(s99, sizeof s99, p99),
            fmt_num(sn, sizeof sn, count, 0));
}

typedef struct {
    const char *topic, *partition;
    double lag;
} top_lag_t;

static int cmp_lag_desc(const void *a, const void *b)
{
    double x = ((const top_lag_t *)a)->lag, y = ((const top_lag_t *)b)->lag;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int cmp_lag_name(const void *a, const void *b)
{
    const top_lag_t *x = a, *y = b;
    int c = strcmp(x->topic, y->topic);
    if (c) return c;
    long px = strtol(x->partition, NULL, 10), py = strtol(y->partition, NULL, 10);
    return px < py ? -1 : px > py ? 1 : strcmp(x->partition, y->partition);
}

static void print_lag(FILE *f, const top_snap_t *cur)
{
    char b[64];
    fprintf(f, "%-20s %s\n", "consumer lag",
            fmt_num(b, sizeof b, snap_sum(cur, "spillway:consumer_lag", NULL, NULL), 0));
    int n = 0;
    for (int i = 0; i < cur->n; i++) n += !strcmp(cur->s[i].name, "spillway:consumer_lag");
    if (!n) return;
    top_lag_t *l = calloc((size_t)n, sizeof *l);
    if (!l) return;
    n = 0;
    for (int i = 0; i < cur->n; i++) {
        const top_sample_t *s = &cur->s[i];
        if (strcmp(s->name, "spillway:consumer_lag")) continue;
        const char *t = label_get(s, "topic"), *p = label_get(s, "partition");
        l[n++] = (top_lag_t){t ? t : "?", p ? p : "?", s->v};
    }
    int shown = n;
    if (n > TOP_MAX_PARTITIONS) { /* the highest lags, then in topic/partition order */
        qsort(l, (size_t)n, sizeof *l, cmp_lag_desc);
        shown = TOP_MAX_PARTITIONS;
    }
    qsort(l, (size_t)shown, sizeof *l, cmp_lag_name);
    for (int i = 0; i < shown; i++) {
        char name[256];
        snprintf(name, sizeof name, "%s/%s", l[i].topic, l[i].partition);
        fprintf(f, "  %-18s %s\n", name, fmt_num(b, sizeof b, l[i].lag, 0));
    }
    if (shown < n) fprintf(f, "  ... %d more partitions with less lag\n", n - shown);
    free(l);
}

/* The whole table for the interval prev -> cur. */
static void print_table(FILE *f, const top_opts_t *o, const top_snap_t *prev,
                        const top_snap_t *cur)
{
    char a[64], b[64], c[64], d[64];
    fprintf(f, "spillway top  %s  (rates over %.2f s)\n\n", o->url, cur->t - prev->t);
    for (int i = 0; i < cur->n; i++) { /* spillway:model_loaded{model="..."} */
        const char *m = label_get(&cur->s[i], "model");
        if (strcmp(cur->s[i].name, "spillway:model_loaded") || !m) continue;
        const char *fp = label_get(&cur->s[i], "fingerprint");
        fprintf(f, "%-20s %s%s%s%s\n", "model", m, fp ? " " : "", fp ? fp : "",
                cur->s[i].v == 1 ? "" : " (replaced: draining)");
    }
    print_rate_by(f, "results/s", prev, cur, "spillway:request_success_total", "finished_reason");
    static const struct { const char *title, *name; int prec; } rates[] = {
        {"generated tok/s", "spillway:generation_tokens_total", 1},
        {"prompt tok/s", "spillway:prompt_tokens_total", 1},
        {"consumed msg/s", "spillway:messages_consumed_total", 2},
    };
    for (size_t i = 0; i < sizeof rates / sizeof *rates; i++) {
        double r = snap_rate(prev, cur, rates[i].name, NULL, NULL);
        fprintf(f, "%-20s %s\n", rates[i].title, fmt_num(a, sizeof a, r, rates[i].prec));
    }
    print_rate_by(f, "dlq/s", prev, cur, "spillway:dlq_records_total", "reason");

    double running = snap_sum(cur, "spillway:num_requests_running", NULL, NULL);
    double waiting = snap_sum(cur, "spillway:num_requests_waiting", NULL, NULL);
    fprintf(f, "%-20s %s\n", "requests running", fmt_num(a, sizeof a, running, 0));
    fprintf(f, "%-20s %s\n", "requests waiting", fmt_num(a, sizeof a, waiting, 0));
    fprintf(f, "%-20s %s (%s of %d seqs)\n", "batch occupancy",
            fmt_pct(a, sizeof a, running, o->max_seqs), fmt_num(b, sizeof b, running, 0),
            o->max_seqs);
    double kv = snap_sum(cur, "spillway:kv_cache_usage_perc", NULL, NULL);
    fprintf(f, "%-20s %s\n", "kv cache usage", fmt_pct(a, sizeof a, kv, 1));

    for (int tier = 1; tier <= 2; tier++) {
        char t[2] = {(char)('0' + tier), 0}, title[32], e[64], g[64];
        const char *qn = "spillway:prefix_cache_queries_total";
        const char *hn = "spillway:prefix_cache_hits_total";
        double dq = snap_increase(prev, cur, qn, "tier", t);
        double dh = snap_increase(prev, cur, hn, "tier", t);
        double cq = snap_sum(cur, qn, "tier", t), ch = snap_sum(cur, hn, "tier", t);
        snprintf(title, sizeof title, "prefix hit tier %d", tier);
        fprintf(f, "%-20s interval %s (%s/%s)  total %s (%s/%s)\n", title,
                fmt_pct(a, sizeof a, dh, dq), fmt_num(b, sizeof b, dh, 0),
                fmt_num(c, sizeof c, dq, 0), fmt_pct(d, sizeof d, ch, cq),
                fmt_num(e, sizeof e, ch, 0), fmt_num(g, sizeof g, cq, 0));
    }

    print_quantiles(f, "ttft", prev, cur, "spillway:time_to_first_token_seconds");
    print_quantiles(f, "ttft (all)", NULL, cur, "spillway:time_to_first_token_seconds");
    print_quantiles(f, "e2e latency", prev, cur, "spillway:e2e_request_latency_seconds");
    print_lag(f, cur);
    double pa = snap_sum(cur, "spillway:partitions_assigned", NULL, NULL);
    double pp = snap_sum(cur, "spillway:partitions_paused", NULL, NULL);
    fprintf(f, "%-20s %s assigned, %s paused\n", "partitions", fmt_num(a, sizeof a, pa, 0),
            fmt_num(b, sizeof b, pp, 0));
    double ru = snap_sum(cur, "spillway:redis_up", NULL, NULL);
    fprintf(f, "%-20s %s\n", "redis_up", isnan(ru) ? "- (no tier 2)" : fmt_num(a, sizeof a, ru, 0));
}

/* ---- the command --------------------------------------------------------------------------- */

/* One scrape of u into out (empty). 0 or -1 + err. */
static int scrape(const top_url_t *u, top_snap_t *out, char *err, size_t errlen)
{
    char *body;
    size_t len;
    memset(out, 0, sizeof *out);
    if (http_get(u, &body, &len, err, errlen)) return -1;
    out->t = sw_mono_s();
    int rc = parse_metrics(body, len, out, err, errlen);
    free(body);
    if (rc) snap_free(out);
    return rc;
}

/* Sleeps until the monotonic time `until` or Ctrl-C. */
static void sleep_until(double until)
{
    double left;
    while (!top_stop && (left = until - sw_mono_s()) > 0) {
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static void top_usage(FILE *f)
{
    fprintf(f,
            "usage: spillway top [URL] [--interval S] [--once] [--max-seqs N]\n"
            "  URL             a worker's metrics endpoint (default " TOP_DEFAULT_URL ");\n"
            "                  only http://, an empty path means /metrics\n"
            "  --interval S    seconds between scrapes (default 2)\n"
            "  --once          print one table after two scrapes and exit (the default when\n"
            "                  stdout is not a terminal)\n"
            "  --max-seqs N    the worker's batch.max_seqs, for batch occupancy (default: the\n"
            "                  worker's default)\n");
}

int cli_top(int argc, char **argv)
{
    static const struct option longopts[] = {{"interval", required_argument, 0, 'i'},
                                             {"once", no_argument, 0, '1'},
                                             {"max-seqs", required_argument, 0, 'm'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    top_opts_t o = {TOP_DEFAULT_URL, 2.0, 64};
    int once = 0, opt, rc = 1;
    long maxseqs = -1;
    char err[512];
    worker_config_t wc;
    if (worker_config_default(&wc) == 0) { /* batch.max_seqs' default */
        o.max_seqs = wc.max_seqs;
        worker_config_free(&wc);
    }
    optind = 0;
    while ((opt = getopt_long(argc, argv, "i:1m:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'i':
            if (cli_parse_double("--interval", optarg, &o.interval)) return 2;
            if (o.interval < 0.05 || o.interval > 3600) {
                fprintf(stderr, "spillway top: --interval must be within 0.05..3600 seconds\n");
                return 2;
            }
            break;
        case '1': once = 1; break;
        case 'm':
            if (cli_parse_int("--max-seqs", optarg, 1, 1 << 16, &maxseqs)) return 2;
            o.max_seqs = (int)maxseqs;
            break;
        case 'h': top_usage(stdout); return 0;
        default: top_usage(stderr); return 2;
        }
    }
    if (argc - optind > 1) {
        top_usage(stderr);
        return 2;
    }
    if (optind < argc) o.url = argv[optind];
    top_url_t u;
    if (url_parse(o.url, &u, err, sizeof err)) {
        fprintf(stderr, "spillway top: %s\n", err);
        return 1;
    }
    int live = !once && isatty(STDOUT_FILENO);
    if (live) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = top_on_signal; /* no SA_RESTART: sleeps and polls wake up */
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }

    top_snap_t prev, cur;
    memset(&cur, 0, sizeof cur);
    if (scrape(&u, &prev, err, sizeof err)) {
        fprintf(stderr, "spillway top: %s: %s\n", o.url, err);
        return 1;
    }
    if (!live) {
        sleep_until(prev.t + o.interval);
        if (scrape(&u, &cur, err, sizeof err)) {
            fprintf(stderr, "spillway top: %s: %s\n", o.url, err);
            goto out;
        }
        print_table(stdout, &o, &prev, &cur);
        rc = fflush(stdout) ? 1 : 0;
        goto out;
    }

    /* live: redraw every interval; a failed scrape is shown and retried, the last good one is
     * kept as the base of the next rates */
    printf("\033[H\033[2Jspillway top  %s: first scrape done, next in %.1f s ...\n", o.url,
           o.interval);
    fflush(stdout);
    double next = prev.t + o.interval;
    while (!top_stop) {
        sleep_until(next);
        if (top_stop) break;
        next += o.interval;
        if (next < sw_mono_s()) next = sw_mono_s() + o.interval;
        char *frame = NULL;
        size_t flen = 0;
        FILE *f = open_memstream(&frame, &flen);
        if (!f) break;
        fputs("\033[H\033[2J", f);
        if (scrape(&u, &cur, err, sizeof err)) {
            fprintf(f, "spillway top  %s\n\nscrape failed: %s\n(retrying every %.1f s; Ctrl-C "
                    "to quit)\n", o.url, err, o.interval);
        } else {
            print_table(f, &o, &prev, &cur);
            fprintf(f, "\n(Ctrl-C to quit)\n");
            snap_free(&prev);
            prev = cur;
            memset(&cur, 0, sizeof cur);
        }
        fclose(f);
        fwrite(frame, 1, flen, stdout);
        fflush(stdout);
        free(frame);
    }
    rc = 0;
out:
    snap_free(&prev);
    snap_free(&cur);
    return rc;
}
