/* worker/usage.c: per-tenant accounting (see usage.h). */
#include "worker/usage.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "records/records.h"

typedef struct {
    uint64_t requests, prompt, cached, completion, compute_ns;
} counts_t;

/* Labels: tenants[0] = _other, tenants[1] = _none, then up to max_tenants names;
 * classes[0] = _other, classes[1] = default, then up to max_classes names. cells is
 * [cap_t][cap_c] of totals and of counts since the last record. */
struct usage {
    pthread_mutex_t mu;
    int max_tenants, max_classes;
    int n_tenants, n_classes;    /* used entries of tenants / classes */
    int cap_t, cap_c;
    char **tenants, **classes;   /* owned names */
    counts_t *total, *delta;     /* [cap_t * cap_c] */
};

usage_t *usage_new(int max_tenants, int max_classes)
{
    usage_t *u = calloc(1, sizeof *u);
    if (!u) return NULL;
    pthread_mutex_init(&u->mu, NULL);
    u->max_tenants = max_tenants;
    u->max_classes = max_classes;
    u->cap_t = max_tenants + 2;
    u->cap_c = max_classes + 2;
    u->tenants = calloc((size_t)u->cap_t, sizeof *u->tenants);
    u->classes = calloc((size_t)u->cap_c, sizeof *u->classes);
    u->total = calloc((size_t)u->cap_t * (size_t)u->cap_c, sizeof *u->total);
    u->delta = calloc((size_t)u->cap_t * (size_t)u->cap_c, sizeof *u->delta);
    if (!u->tenants || !u->classes || !u->total || !u->delta) goto fail;
    if (!(u->tenants[0] = strdup(USAGE_OTHER)) || !(u->tenants[1] = strdup(USAGE_NONE)) ||
        !(u->classes[0] = strdup(USAGE_OTHER)) || !(u->classes[1] = strdup(USAGE_DEFAULT_CLASS)))
        goto fail;
    u->n_tenants = u->n_classes = 2;
    return u;
fail:
    usage_free(u);
    return NULL;
}

void usage_free(usage_t *u)
{
    if (!u) return;
    for (int i = 0; u->tenants && i < u->n_tenants; i++) free(u->tenants[i]);
    for (int i = 0; u->classes && i < u->n_classes; i++) free(u->classes[i]);
    free(u->tenants);
    free(u->classes);
    free(u->total);
    free(u->delta);
    pthread_mutex_destroy(&u->mu);
    free(u);
}

/* Index of name in names[0..*n): found, added (while fewer than max + 2), else 0 (_other).
 * dflt: the index of a NULL name. Under mu. */
static int slot(char **names, int *n, int max, const char *name, int dflt)
{
    if (!name) return dflt;
    for (int i = 1; i < *n; i++) /* 1: an explicit class "default" is the default's slot */
        if (!strcmp(names[i], name)) return i;
    if (*n >= max + 2) return 0;
    char *d = strdup(name);
    if (!d) return 0; /* out of memory: counted, under _other */
    names[*n] = d;
    return (*n)++;
}

void usage_add(usage_t *u, const char *tenant, const char *cls, uint64_t prompt_tokens,
               uint64_t cached_tokens, uint64_t completion_tokens, uint64_t compute_ns)
{
    pthread_mutex_lock(&u->mu);
    int t = slot(u->tenants, &u->n_tenants, u->max_tenants, tenant, 1);
    int c = slot(u->classes, &u->n_classes, u->max_classes, cls, 1);
    for (counts_t *k = &u->total[t * u->cap_c + c];; k = &u->delta[t * u->cap_c + c]) {
        k->requests++;
        k->prompt += prompt_tokens;
        k->cached += cached_tokens;
        k->completion += completion_tokens;
        k->compute_ns += compute_ns;
        if (k == &u->delta[t * u->cap_c + c]) break;
    }
    pthread_mutex_unlock(&u->mu);
}

void usage_render(usage_t *u, metrics_buf_t *b)
{
    static const struct {
        const char *name, *help;
        size_t off;
        double scale;
    } F[] = {
        {"spillway:tenant_requests_total", "results produced, per tenant and class",
         offsetof(counts_t, requests), 1},
        {"spillway:tenant_prompt_tokens_total", "prompt tokens of those results",
         offsetof(counts_t, prompt), 1},
        {"spillway:tenant_cached_tokens_total", "of which served from the prefix cache",
         offsetof(counts_t, cached), 1},
        {"spillway:tenant_completion_tokens_total", "generated tokens of those results",
         offsetof(counts_t, completion), 1},
        {"spillway:tenant_compute_seconds_total",
         "forward-step time of those results (each step's time split over its tokens)",
         offsetof(counts_t, compute_ns), 1e-9},
    };
    char lb[512];
    pthread_mutex_lock(&u->mu);
    for (size_t f = 0; f < sizeof F / sizeof F[0]; f++) {
        metrics_family(b, F[f].name, "counter", F[f].help);
        for (int t = 0; t < u->n_tenants; t++)
            for (int c = 0; c < u->n_classes; c++) {
                const counts_t *k = &u->total[t * u->cap_c + c];
                if (!k->requests) continue;
                metrics_labels(lb, sizeof lb, "tenant", u->tenants[t], "class", u->classes[c],
                               (const char *)NULL);
                uint64_t v = *(const uint64_t *)((const char *)k + F[f].off);
                metrics_sample(b, F[f].name, lb, (double)v * F[f].scale);
            }
    }
    pthread_mutex_unlock(&u->mu);
}

int usage_take_records(usage_t *u, const char *worker, int64_t start_ms, int64_t end_ms,
                       char ***out)
{
    *out = NULL;
    pthread_mutex_lock(&u->mu);
    int n = 0;
    for (int i = 0; i < u->cap_t * u->cap_c; i++) n += u->delta[i].requests > 0;
    char **recs = n ? calloc((size_t)n, sizeof *recs) : NULL;
    if (n && !recs) goto oom;
    int j = 0;
    for (int t = 0; t < u->n_tenants; t++)
        for (int c = 0; c < u->n_classes; c++) {
            const counts_t *k = &u->delta[t * u->cap_c + c];
            if (!k->requests) continue;
            rec_usage_t in = {worker, u->tenants[t], u->classes[c], start_ms, end_ms,
                              k->requests, k->prompt, k->cached, k->completion,
                              (double)k->compute_ns * 1e-6};
            recs[j] = records_usage(&in);
            if (!recs[j++]) goto oom;
        }
    for (int i = 0; i < u->cap_t * u->cap_c; i++) memset(&u->delta[i], 0, sizeof u->delta[i]);
    pthread_mutex_unlock(&u->mu);
    *out = recs;
    return n;
oom:
    pthread_mutex_unlock(&u->mu);
    for (int i = 0; recs && i < n; i++) free(recs[i]);
    free(recs);
    return -1;
}
