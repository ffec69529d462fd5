/* tests/test_metrics.c: worker/metrics.{h,c}: the text builder (value formatting, families,
 * label escaping), histogram bucket math, and the HTTP server (/metrics, /healthz, /readyz, 404,
 * 405, HEAD, port in use) through a plain-socket HTTP/1.0 client (tests/support/http_client.h);
 * concurrent observers while /metrics is scraped 100 times (every scrape self-consistent, counts
 * monotonic, exact at the end). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tests/support/http_client.h"
#include "worker/metrics.h"

/* ---- parsing the rendered histogram ------------------------------------------------------- */

/* The line after the one at p, or NULL at the end. */
static const char *next_line(const char *p)
{
    const char *nl = strchr(p, '\n');
    return nl ? nl + 1 : NULL;
}

typedef struct {
    double le[METRICS_HIST_NBUCKETS];
    double cum[METRICS_HIST_NBUCKETS];
    int n;        /* bucket lines found */
    double sum;
    double count;
    int have_sum, have_count;
} parsed_hist_t;

/* Reads name_bucket{[labels,]le="x"} v, name_sum, name_count from text. 0 or -1. */
static int parse_hist(const char *text, const char *name, parsed_hist_t *ph)
{
    memset(ph, 0, sizeof *ph);
    size_t nl = strlen(name);
    for (const char *line = text; line && *line; line = next_line(line)) {
        if (strncmp(line, name, nl)) continue;
        const char *rest = line + nl;
        if (!strncmp(rest, "_bucket{", 8)) {
            const char *le = strstr(rest, "le=\"");
            const char *close = strchr(rest, '}');
            if (!le || !close || le > close || ph->n >= METRICS_HIST_NBUCKETS) return -1;
            ph->le[ph->n] = !strncmp(le + 4, "+Inf", 4) ? 1e300 : strtod(le + 4, NULL);
            ph->cum[ph->n] = strtod(close + 1, NULL);
            ph->n++;
        } else if (!strncmp(rest, "_sum", 4) && (rest[4] == ' ' || rest[4] == '{')) {
            const char *sp = strchr(rest, ' ');
            ph->sum = strtod(sp, NULL);
            ph->have_sum = 1;
        } else if (!strncmp(rest, "_count", 6) && (rest[6] == ' ' || rest[6] == '{')) {
            const char *sp = strchr(rest, ' ');
            ph->count = strtod(sp, NULL);
            ph->have_count = 1;
        }
    }
    return ph->n == METRICS_HIST_NBUCKETS && ph->have_sum && ph->have_count ? 0 : -1;
}

/* Value of the first sample line starting with `prefix ` (name plus labels), or -1. */
static double sample_value(const char *text, const char *prefix)
{
    size_t pl = strlen(prefix);
    for (const char *line = text; line && *line; line = next_line(line))
        if (!strncmp(line, prefix, pl) && line[pl] == ' ') return strtod(line + pl + 1, NULL);
    return -1;
}

/* ---- the test server's state -------------------------------------------------------------- */

typedef struct {
    metrics_hist_t ttft;        /* observed by the test threads */
    _Atomic uint64_t requests;  /* a counter */
    atomic_int ready;
    atomic_int sick;
    atomic_int renders;
} app_t;

static void app_render(void *arg, metrics_buf_t *out)
{
    app_t *a = arg;
    atomic_fetch_add(&a->renders, 1);
    char lab[128];
    metrics_family(out, "spillway:request_success_total", "counter", "results produced");
    metrics_labels(lab, sizeof lab, "finished_reason", "stop", NULL);
    metrics_sample(out, "spillway:request_success_total", lab, (double)atomic_load(&a->requests));
    metrics_family(out, "spillway:kv_cache_usage_perc", "gauge", "KV pool in use");
    metrics_sample(out, "spillway:kv_cache_usage_perc", NULL, 0.25);
    metrics_family(out, "spillway:consumer_lag", "gauge", "lag");
    metrics_labels(lab, sizeof lab, "topic", "we\"ird\\top\nic", "partition", "3", NULL);
    metrics_sample(out, "spillway:consumer_lag", lab, 42);
    metrics_family(out, "spillway:time_to_first_token_seconds", "histogram",
                   "submit to first token");
    metrics_hist_render(out, "spillway:time_to_first_token_seconds", NULL, &a->ttft);
}

static int app_ready(void *arg, char *why, size_t len)
{
    app_t *a = arg;
    if (atomic_load(&a->ready)) return 1;
    snprintf(why, len, "no partitions assigned");
    return 0;
}

static int app_healthy(void *arg, char *why, size_t len)
{
    app_t *a = arg;
    if (!atomic_load(&a->sick)) return 1;
    snprintf(why, len, "loop stuck");
    return 0;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_builder(void)
{
    metrics_buf_t b;
    metrics_buf_init(&b);
    CHECK(metrics_family(&b, "spillway:x_total", "counter", "line one\nback\\slash") == 0);
    CHECK(metrics_family(&b, "spillway:x_total", "counter", "again") == 0); /* no-op */
    CHECK(metrics_sample(&b, "spillway:x_total", NULL, 12345678901234.0) == 0);
    CHECK(metrics_sample(&b, "spillway:x_total", "a=\"1\"", 0) == 0);
    CHECK(metrics_family(&b, "spillway:g", "gauge", NULL) == 0);
    CHECK(metrics_sample(&b, "spillway:g", NULL, 0.1) == 0);
    CHECK(metrics_sample(&b, "spillway:g", NULL, -2.5) == 0);
    CHECK(metrics_sample(&b, "spillway:g", NULL, 1.0 / 3.0) == 0);
    CHECK(metrics_sample(&b, "spillway:g", NULL, NAN) == 0);
    CHECK(metrics_sample(&b, "spillway:g", NULL, INFINITY) == 0);
    CHECK(metrics_sample(&b, "spillway:g", NULL, -INFINITY) == 0);
    CHECK(metrics_sample(&b, "spillway:g", NULL, 1e20) == 0);
    CHECK(metrics_sample(&b, "spillway:g", NULL, -7) == 0);
    CHECK(metrics_family(&b, "bad name", "gauge", NULL) == -1);
    CHECK(metrics_family(&b, "9bad", "gauge", NULL) == -1);
    CHECK(metrics_family(&b, "spillway:ok", "wrongtype", NULL) == -1);
    CHECK(metrics_sample(&b, "bad-name", NULL, 1) == -1);
    const char *want =
        "# HELP spillway:x_total line one\\nback\\\\slash\n"
        "# TYPE spillway:x_total counter\n"
        "spillway:x_total 12345678901234\n"
        "spillway:x_total{a=\"1\"} 0\n"
        "# TYPE spillway:g gauge\n"
        "spillway:g 0.1\n"
        "spillway:g -2.5\n"
        "spillway:g 0.3333333333333333\n"
        "spillway:g NaN\n"
        "spillway:g +Inf\n"
        "spillway:g -Inf\n"
        "spillway:g 1e+20\n"
        "spillway:g -7\n";
    CHECKF(b.data && !strcmp(b.data, want), "got:\n%s", b.data ? b.data : "");
    if (b.data) {
        const char *third = strstr(b.data, "spillway:g 0.3");
        CHECK(third && strtod(third + 11, NULL) == 1.0 / 3.0); /* reads back exactly */
    }
    size_t len = 0;
    char *s = metrics_buf_steal(&b, &len);
    CHECK(s && len == strlen(s));
    CHECK(b.data == NULL && b.len == 0);
    free(s);
    metrics_buf_free(&b);

    /* label escaping */
    char lab[64];
    CHECK(metrics_labels(lab, sizeof lab, "path", "a\\b\"c\nd", "k", "", NULL) == 0);
    CHECKF(!strcmp(lab, "path=\"a\\\\b\\\"c\\nd\",k=\"\""), "%s", lab);
    CHECK(metrics_labels(lab, 8, "path", "abcdefgh", NULL) == -1 && lab[0] == '\0');
    CHECK(metrics_label_escape(lab, 4, "\"\"") == -1);
    CHECK(metrics_label_escape(lab, 5, "\"\"") == 0 && !strcmp(lab, "\\\"\\\""));
    CHECK(metrics_labels(lab, sizeof lab, NULL) == 0 && lab[0] == '\0');
}

/* Observes known values; the rendered buckets must match exactly. */
static void test_hist_math(void)
{
    metrics_hist_t h;
    metrics_hist_init(&h);
    const double vals[] = {0.0005, 0.001 /* on a bound: le="0.001" */, 0.003, 0.05, 0.3, 3, 5000,
                           -1 /* recorded as 0 */};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) metrics_hist_observe(&h, vals[i]);
    CHECK(metrics_hist_count(&h) == 8);
    metrics_buf_t b;
    metrics_buf_init(&b);
    CHECK(metrics_family(&b, "t_seconds", "histogram", "h") == 0);
    CHECK(metrics_hist_render(&b, "t_seconds", "tier=\"1\"", &h) == 0);
    parsed_hist_t ph;
    CHECK(parse_hist(b.data, "t_seconds", &ph) == 0);
    const double *bounds = metrics_hist_bounds();
    /* cumulative counts per bound */
    const double want[METRICS_HIST_NBUCKETS] = {3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6,
                                                6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8};
    for (int i = 0; i < METRICS_HIST_NBUCKETS; i++) {
        CHECKF(ph.cum[i] == want[i], "bucket %d: %g want %g", i, ph.cum[i], want[i]);
        if (i < METRICS_HIST_NBOUNDS) CHECK(ph.le[i] == bounds[i]);
    }
    CHECKF(ph.sum == 5003.3545, "sum %.17g", ph.sum);
    CHECK(ph.count == 8);
    CHECK(strstr(b.data, "t_seconds_bucket{tier=\"1\",le=\"0.001\"} 3\n") != NULL);
    CHECK(strstr(b.data, "t_seconds_bucket{tier=\"1\",le=\"1\"} 6\n") != NULL);
    CHECK(strstr(b.data, "t_seconds_bucket{tier=\"1\",le=\"2560\"} 7\n") != NULL);
    CHECK(strstr(b.data, "t_seconds_bucket{tier=\"1\",le=\"+Inf\"} 8\n") != NULL);
    CHECK(strstr(b.data, "t_seconds_sum{tier=\"1\"} 5003.3545\n") != NULL);
    CHECK(strstr(b.data, "t_seconds_count{tier=\"1\"} 8\n") != NULL);
    metrics_buf_free(&b);
}

/* Observer threads observe values cycling through obs_vals until the scrapes are done, so that
 * every scrape races them; each records how many it observed. */
#define OBS_THREADS 4
#define STOP_SERIES "spillway:request_success_total{finished_reason=\"stop\"}"
static const double obs_vals[5] = {0.002, 0.03, 0.2, 1.5, 100};

typedef struct {
    app_t *app;
    atomic_int *stop, *started;
    uint64_t n; /* observations made (read after join) */
} observer_t;

/* Observations recorded in h so far: the sum of its buckets, each read once. */
static uint64_t hist_total(metrics_hist_t *h)
{
    uint64_t n = 0;
    for (int i = 0; i < METRICS_HIST_NBUCKETS; i++) n += atomic_load(&h->buckets[i]);
    return n;
}

static void *observer(void *arg)
{
    observer_t *o = arg;
    uint64_t i = 0;
    atomic_fetch_add(o->started, 1);
    while (!atomic_load_explicit(o->stop, memory_order_relaxed)) {
        metrics_hist_observe(&o->app->ttft, obs_vals[i % 5]);
        atomic_fetch_add(&o->app->requests, 1);
        i++;
    }
    o->n = i;
    return NULL;
}

static void test_server(void)
{
    app_t *a = calloc(1, sizeof *a);
    metrics_hist_init(&a->ttft);
    metrics_handlers_t h = {.render = app_render, .ready = app_ready, .healthy = app_healthy,
                            .arg = a};
    char err[256] = "";
    metrics_server_t *s = metrics_server_new("127.0.0.1", 0, &h, err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    if (!s) {
        free(a);
        return;
    }
    int port = metrics_server_port(s);
    CHECK(port > 0 && port < 65536);
    th_resp_t r;

    /* /metrics */
    metrics_hist_observe(&a->ttft, 0.05);
    metrics_hist_observe(&a->ttft, 7);
    CHECK(th_request(port, "GET", "/metrics", 5, &r) == 0);
    CHECK(r.status == 200);
    CHECKF(!strcmp(r.ctype, "text/plain; version=0.0.4; charset=utf-8"), "%s", r.ctype);
    if (r.body) {
        CHECK(strstr(r.body, "# TYPE spillway:time_to_first_token_seconds histogram\n") != NULL);
        CHECK(strstr(r.body, "spillway:time_to_first_token_seconds_bucket{le=\"0.04\"} 0\n"));
        CHECK(strstr(r.body, "spillway:time_to_first_token_seconds_bucket{le=\"0.06\"} 1\n"));
        CHECK(strstr(r.body, "spillway:time_to_first_token_seconds_bucket{le=\"5\"} 1\n"));
        CHECK(strstr(r.body, "spillway:time_to_first_token_seconds_bucket{le=\"7.5\"} 2\n"));
        CHECK(strstr(r.body, "spillway:time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
        CHECK(strstr(r.body, "spillway:time_to_first_token_seconds_sum 7.05\n"));
        CHECK(strstr(r.body, "spillway:time_to_first_token_seconds_count 2\n"));
        CHECK(strstr(r.body, "spillway:kv_cache_usage_perc 0.25\n"));
        const char *lag =
            "spillway:consumer_lag{topic=\"we\\\"ird\\\\top\\nic\",partition=\"3\"} 42\n";
        CHECKF(strstr(r.body, lag), "%s", r.body);
        CHECK(strstr(r.body, "spillway:request_success_total{finished_reason=\"stop\"} 0\n"));
    }
    th_resp_free(&r);
    metrics_hist_init(&a->ttft); /* no scrape is in flight */

    /* HEAD: headers only */
    CHECK(th_request(port, "HEAD", "/metrics", 5, &r) == 0);
    CHECK(r.status == 200 && r.body_len == 0);
    CHECK(!strcmp(r.ctype, "text/plain; version=0.0.4; charset=utf-8"));
    th_resp_free(&r);

    /* /healthz */
    CHECK(th_request(port, "GET", "/healthz", 5, &r) == 0);
    CHECK(r.status == 200 && r.body && !strcmp(r.body, "ok\n"));
    th_resp_free(&r);
    atomic_store(&a->sick, 1);
    CHECK(th_request(port, "GET", "/healthz", 5, &r) == 0);
    CHECKF(r.status == 503 && r.body && !strcmp(r.body, "loop stuck"), "%d %s", r.status,
           r.body ? r.body : "");
    th_resp_free(&r);
    atomic_store(&a->sick, 0);

    /* /readyz, both states */
    CHECK(th_request(port, "GET", "/readyz", 5, &r) == 0);
    CHECKF(r.status == 503 && r.body && !strcmp(r.body, "no partitions assigned\n"), "%d %s",
           r.status, r.body ? r.body : "");
    th_resp_free(&r);
    atomic_store(&a->ready, 1);
    CHECK(th_request(port, "GET", "/readyz", 5, &r) == 0);
    CHECK(r.status == 200 && r.body && !strcmp(r.body, "ready\n"));
    th_resp_free(&r);

    /* unknown path, query string, other method */
    CHECK(th_request(port, "GET", "/nope", 5, &r) == 0);
    CHECK(r.status == 404);
    th_resp_free(&r);
    CHECK(th_request(port, "GET", "/healthz?x=1", 5, &r) == 0);
    CHECK(r.status == 200);
    th_resp_free(&r);
    CHECK(th_request(port, "POST", "/metrics", 5, &r) == 0);
    CHECK(r.status == 405);
    th_resp_free(&r);
    CHECK(th_request(port, "DELETE", "/readyz", 5, &r) == 0);
    CHECK(r.status == 405);
    th_resp_free(&r);

    /* port in use */
    char err2[256] = "";
    metrics_server_t *s2 = metrics_server_new("127.0.0.1", port, &h, err2, sizeof err2);
    CHECK(s2 == NULL);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    CHECKF(strstr(err2, want) && strstr(err2, "in use"), "%s", err2);
    metrics_server_free(s2);
    /* bad address, bad port */
    CHECK(metrics_server_new("not-an-address", 0, &h, err2, sizeof err2) == NULL);
    CHECKF(strstr(err2, "not-an-address") != NULL, "%s", err2);
    CHECK(metrics_server_new("127.0.0.1", 70000, &h, err2, sizeof err2) == NULL);

    /* concurrent observers while scraping 100 times */
    atomic_store(&a->requests, 0);
    metrics_hist_init(&a->ttft);
    atomic_int stop, started;
    atomic_init(&stop, 0);
    atomic_init(&started, 0);
    observer_t obs[OBS_THREADS];
    pthread_t th[OBS_THREADS];
    for (int i = 0; i < OBS_THREADS; i++) {
        obs[i] = (observer_t){a, &stop, &started, 0};
        pthread_create(&th[i], NULL, observer, &obs[i]);
    }
    while (atomic_load(&started) < OBS_THREADS) usleep(1000); /* every scrape races them */
    double last_count = 0, last_req = 0;
    int scrapes_ok = 0, consistent = 1, monotonic = 1, increases = 0;
    int waited_out = 0;
    for (int k = 0; k < 100; k++) {
        /* each scrape after an observation the previous one cannot have seen: the rendered count
         * is the sum of bucket reads made after this one, so it must exceed last_count (the
         * observers keep racing the render either way) */
        for (int w = 0; w < 100000 && hist_total(&a->ttft) <= (uint64_t)last_count; w++)
            usleep(100);
        waited_out += hist_total(&a->ttft) <= (uint64_t)last_count;
        if (th_request(port, "GET", "/metrics", 5, &r) || r.status != 200) {
            th_resp_free(&r);
            continue;
        }
        parsed_hist_t ph;
        if (parse_hist(r.body, "spillway:time_to_first_token_seconds", &ph) == 0) {
            scrapes_ok++;
            for (int i = 1; i < METRICS_HIST_NBUCKETS; i++)
                if (ph.cum[i] < ph.cum[i - 1]) consistent = 0;
            if (ph.cum[METRICS_HIST_NBUCKETS - 1] != ph.count) consistent = 0;
            if (ph.count < last_count) monotonic = 0;
            if (ph.count > last_count) increases++;
            last_count = ph.count;
        }
        double req = sample_value(r.body, STOP_SERIES);
        if (req < last_req) monotonic = 0;
        last_req = req;
        th_resp_free(&r);
    }
    atomic_store(&stop, 1);
    uint64_t per_val[5] = {0}, total = 0;
    for (int i = 0; i < OBS_THREADS; i++) {
        pthread_join(th[i], NULL);
        for (int j = 0; j < 5; j++) per_val[j] += obs[i].n / 5 + ((uint64_t)j < obs[i].n % 5);
        total += obs[i].n;
    }
    CHECK(scrapes_ok == 100);
    CHECK(consistent);
    CHECK(monotonic);
    CHECKF(waited_out == 0, "%d scrapes found no new observation after 10 s", waited_out);
    CHECKF(increases == 100, "only %d of 100 scrapes saw new observations", increases);
    CHECK(th_request(port, "GET", "/metrics", 5, &r) == 0);
    if (r.body) {
        parsed_hist_t ph;
        CHECK(parse_hist(r.body, "spillway:time_to_first_token_seconds", &ph) == 0);
        CHECKF(ph.count == (double)total, "%.0f != %llu", ph.count, (unsigned long long)total);
        double c1 = (double)per_val[0], c2 = c1 + (double)per_val[1], c3 = c2 + (double)per_val[2];
        double c4 = c3 + (double)per_val[3], c5 = c4 + (double)per_val[4];
        CHECK(ph.cum[0] == 0);   /* le=0.001 */
        CHECK(ph.cum[1] == c1);  /* le=0.005: 0.002 */
        CHECK(ph.cum[4] == c2);  /* le=0.04: + 0.03 */
        CHECK(ph.cum[8] == c3);  /* le=0.25: + 0.2 */
        CHECK(ph.cum[12] == c4); /* le=2.5: + 1.5 */
        CHECK(ph.cum[18] == c4); /* le=80 */
        CHECK(ph.cum[19] == c5); /* le=160: + 100 */
        CHECK(ph.cum[METRICS_HIST_NBUCKETS - 1] == c5);
        /* exact in ns: */
        uint64_t want_ns = per_val[0] * 2000000ull + per_val[1] * 30000000ull +
                           per_val[2] * 200000000ull + per_val[3] * 1500000000ull +
                           per_val[4] * 100000000000ull;
        CHECKF(ph.sum == (double)want_ns / 1e9, "sum %.17g want %.17g", ph.sum,
               (double)want_ns / 1e9);
        CHECK(sample_value(r.body, STOP_SERIES) == (double)total);
        fprintf(stderr, "concurrent: %llu observations during 100 scrapes (%d saw new ones)\n",
                (unsigned long long)total, increases);
    }
    th_resp_free(&r);
    CHECK(atomic_load(&a->renders) >= 102);

    metrics_server_free(s);
    /* the port is free again */
    s = metrics_server_new("127.0.0.1", port, &h, err, sizeof err);
    CHECKF(s != NULL, "rebind: %s", err);
    metrics_server_free(s);
    metrics_server_free(NULL);
    free(a);
}

int main(void)
{
    test_builder();
    test_hist_math();
    test_server();
    return check_exit();
}
