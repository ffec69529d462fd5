/* worker/claims.c: the `claims` key: per input topic, the tenants and classes its requests may
 * claim (syntax and rules in worker/claims.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "records/request.h"
#include "worker/claims.h"

#define MAX_TOPIC 249    /* Kafka's longest topic name */

/* A name or a pattern: "NAME", "PREFIX*" (prefix = 1) or "*" (prefix = 1, empty text). */
typedef struct {
    char *text;          /* owned; without the '*' */
    int prefix;
} pat_t;

typedef struct {
    pat_t topic;
    pat_t *tenants, *classes;   /* [n_tenants], [n_classes] (owned) */
    int n_tenants, n_classes;
    char *def_tenant;           /* owned; NULL = none */
    int def_class;              /* index in the worker's classes; -1 = class.default */
} entry_t;

struct claims {
    entry_t *e;                 /* [n] in the order given */
    int n;
    char (*class_names)[65];    /* [n_classes] the worker's classes, by index (owned) */
    int n_classes, default_class;
};

static void entry_free(entry_t *e)
{
    free(e->topic.text);
    for (int i = 0; i < e->n_tenants; i++) free(e->tenants[i].text);
    for (int i = 0; i < e->n_classes; i++) free(e->classes[i].text);
    free(e->tenants);
    free(e->classes);
    free(e->def_tenant);
}

void claims_free(claims_t *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++) entry_free(&c->e[i]);
    free(c->e);
    free(c->class_names);
    free(c);
}

static int is_blank(char ch) { return ch == ' ' || ch == '\t'; }

static int pat_match(const pat_t *p, const char *s)
{
    return p->prefix ? !strncmp(s, p->text, strlen(p->text)) : !strcmp(s, p->text);
}

/* s[0..n) into *p: a '*' may only end it; the text before it must pass ok (or be empty). 0, -1
 * (bad syntax), -2 (out of memory). */
static int pat_set(pat_t *p, const char *s, size_t n, int (*ok)(const char *, size_t))
{
    p->prefix = n > 0 && s[n - 1] == '*';
    size_t tl = p->prefix ? n - 1 : n;
    if (memchr(s, '*', tl) || (tl > 0 && !ok(s, tl)) || (tl == 0 && !p->prefix)) return -1;
    return (p->text = strndup(s, tl)) ? 0 : -2;
}

static int class_index(const claims_t *c, const char *s, size_t n)
{
    for (int i = 0; i < c->n_classes; i++)
        if (strlen(c->class_names[i]) == n && !memcmp(c->class_names[i], s, n)) return i;
    return -1;
}

/* 1 when class pattern p matches a configured class. */
static int class_pat_used(const claims_t *c, const pat_t *p)
{
    for (int i = 0; i < c->n_classes; i++)
        if (pat_match(p, c->class_names[i])) return 1;
    return 0;
}

/* Parses the comma-separated list v[0..n) of tenant (is_class 0) or class patterns into
 * *out / *n_out. 0, or -1 with errstr (topic names the entry). */
static int parse_list(claims_t *c, const char *topic, const char *key, const char *v, size_t n,
                      int is_class, pat_t **out, int *n_out, char *errstr, size_t errlen)
{
    for (const char *p = v, *end = v + n; p <= end;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *ie = comma ? comma : end;
        pat_t *l = realloc(*out, sizeof *l * (size_t)(*n_out + 1));
        if (!l) goto oom;
        *out = l;
        pat_t *q = &l[*n_out];
        int rc = pat_set(q, p, (size_t)(ie - p), is_class ? request_is_topic_name : request_is_label_name);
        if (rc == -2) goto oom;
        if (rc) {
            snprintf(errstr, errlen, "claims: topic %s: %s: \"%.*s\" is not a %s, \"PREFIX*\" or "
                     "\"*\" (%s; a list is comma-separated, without blanks)", topic, key,
                     (int)(ie - p > 80 ? 80 : ie - p), p, is_class ? "class name" : "tenant name",
                     is_class ? "a class of `classes`" : "1..64 of a-z A-Z 0-9 . _ : @ / -, not "
                                                          "starting with _");
            return -1;
        }
        (*n_out)++;
        if (is_class && !q->prefix && class_index(c, q->text, strlen(q->text)) < 0) {
            snprintf(errstr, errlen, "claims: topic %s: classes: %s is not one of the classes",
                     topic, q->text);
            return -1;
        }
        if (is_class && q->prefix && !class_pat_used(c, q)) {
            snprintf(errstr, errlen, "claims: topic %s: classes: %s* matches none of the classes",
                     topic, q->text);
            return -1;
        }
        if (!comma) break;
        p = comma + 1;
    }
    return 0;
oom:
    snprintf(errstr, errlen, "out of memory");
    return -1;
}

/* One entry s[0..n) (trimmed, not empty) into e. 0, or -1 with errstr. */
static int parse_entry(claims_t *c, entry_t *e, const char *s, size_t n, char *errstr,
                       size_t errlen)
{
    const char *end = s + n, *p = s;
    while (p < end && !is_blank(*p)) p++;
    int rc = pat_set(&e->topic, s, (size_t)(p - s), request_is_topic_name);
    if (rc == -2) goto oom;
    if (rc) {
        snprintf(errstr, errlen, "claims: \"%.*s\" is not a topic, \"PREFIX*\" or \"*\" (an entry "
                 "is TOPIC [tenants=...] [classes=...] [tenant=...] [class=...])",
                 (int)(p - s > 80 ? 80 : p - s), s);
        return -1;
    }
    char topic[MAX_TOPIC + 2];
    snprintf(topic, sizeof topic, "%s%s", e->topic.text, e->topic.prefix ? "*" : "");
    int seen[4] = {0, 0, 0, 0};
    while (p < end) {
        while (p < end && is_blank(*p)) p++;
        if (p == end) break;
        const char *we = p;
        while (we < end && !is_blank(*we)) we++;
        const char *eq = memchr(p, '=', (size_t)(we - p));
        static const char *const KEYS[4] = {"tenants", "classes", "tenant", "class"};
        int k = -1;
        for (int i = 0; eq && i < 4; i++)
            if (strlen(KEYS[i]) == (size_t)(eq - p) && !memcmp(KEYS[i], p, (size_t)(eq - p))) k = i;
        if (k < 0) {
            snprintf(errstr, errlen, "claims: topic %s: \"%.*s\" is not tenants=, classes=, "
                     "tenant= or class= (lists are comma-separated, without blanks)", topic,
                     (int)(we - p > 80 ? 80 : we - p), p);
            return -1;
        }
        if (seen[k]++) {
            snprintf(errstr, errlen, "claims: topic %s: %s= given twice", topic, KEYS[k]);
            return -1;
        }
        const char *v = eq + 1;
        size_t vl = (size_t)(we - v);
        if (k == 0 && parse_list(c, topic, KEYS[k], v, vl, 0, &e->tenants, &e->n_tenants, errstr,
                                 errlen))
            return -1;
        if (k == 1 && parse_list(c, topic, KEYS[k], v, vl, 1, &e->classes, &e->n_classes, errstr,
                                 errlen))
            return -1;
        if (k == 2) {
            if (!request_is_label_name(v, vl)) {
                snprintf(errstr, errlen, "claims: topic %s: tenant=%.*s: expected a tenant name "
                         "(1..64 of a-z A-Z 0-9 . _ : @ / -, not starting with _)", topic,
                         (int)(vl > 80 ? 80 : vl), v);
                return -1;
            }
            if (!(e->def_tenant = strndup(v, vl))) goto oom;
        }
        if (k == 3 && (e->def_class = class_index(c, v, vl)) < 0) {
            snprintf(errstr, errlen, "claims: topic %s: class=%.*s is not one of the classes",
                     topic, (int)(vl > 80 ? 80 : vl), v);
            return -1;
        }
        p = we;
    }
    return 0;
oom:
    snprintf(errstr, errlen, "out of memory");
    return -1;
}

int claims_parse(const char *spec, const worker_class_t *classes, int n_classes,
                 int default_class, claims_t **out, char *errstr, size_t errlen)
{
    *out = NULL;
    claims_t *c = calloc(1, sizeof *c);
    if (!c || !(c->class_names = calloc((size_t)(n_classes > 0 ? n_classes : 1),
                                        sizeof *c->class_names)))
        goto oom;
    c->n_classes = n_classes;
    c->default_class = default_class;
    for (int i = 0; i < n_classes; i++)
        snprintf(c->class_names[i], sizeof c->class_names[i], "%s", classes[i].name);
    for (const char *p = spec; *p;) {
        const char *semi = strchr(p, ';');
        const char *a = p, *b = semi ? semi : p + strlen(p);
        p = semi ? semi + 1 : b;
        while (a < b && is_blank(*a)) a++;
        while (b > a && is_blank(b[-1])) b--;
        if (a == b) continue;
        entry_t *l = realloc(c->e, sizeof *l * (size_t)(c->n + 1));
        if (!l) goto oom;
        c->e = l;
        memset(&l[c->n], 0, sizeof *l);
        l[c->n].def_class = -1;
        c->n++;
        entry_t *e = &l[c->n - 1];
        if (parse_entry(c, e, a, (size_t)(b - a), errstr, errlen)) goto fail;
        for (int i = 0; i < c->n - 1; i++)
            if (c->e[i].topic.prefix == e->topic.prefix &&
                !strcmp(c->e[i].topic.text, e->topic.text)) {
                snprintf(errstr, errlen, "claims: topic %s%s given twice", e->topic.text,
                         e->topic.prefix ? "*" : "");
                goto fail;
            }
    }
    if (c->n == 0) { /* blank: no mapping */
        claims_free(c);
        return 0;
    }
    *out = c;
    return 0;
oom:
    snprintf(errstr, errlen, "out of memory");
fail:
    claims_free(c);
    return -1;
}

/* The entry of topic: its own, else the longest matching prefix ("*" the shortest); NULL when
 * none matches. */
static const entry_t *lookup(const claims_t *c, const char *topic)
{
    const entry_t *best = NULL;
    for (int i = 0; i < c->n; i++) {
        const entry_t *e = &c->e[i];
        if (!pat_match(&e->topic, topic)) continue;
        if (!e->topic.prefix) return e;
        if (!best || strlen(e->topic.text) > strlen(best->topic.text)) best = e;
    }
    return best;
}

int claims_covers(const claims_t *c, const char *topic)
{
    const entry_t *e = lookup(c, topic);
    return e && (!e->topic.prefix || e->topic.text[0]);
}

static int any_match(const pat_t *l, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (pat_match(&l[i], s)) return 1;
    return 0;
}

int claims_check(const claims_t *c, const char *topic, const char *tenant,
                 const char *class_name, const char **def_tenant, int *def_class,
                 const char **code, char *err, size_t errlen)
{
    const entry_t *e = lookup(c, topic);
    *def_tenant = e ? e->def_tenant : NULL;
    *def_class = e && e->def_class >= 0 ? e->def_class : c->default_class;
    if (tenant && !(e && (any_match(e->tenants, e->n_tenants, tenant) ||
                          (e->def_tenant && !strcmp(e->def_tenant, tenant))))) {
        snprintf(err, errlen, "tenant: \"%.64s\" may not be claimed on topic %.100s (claims)",
                 tenant, topic);
        *code = REQ_ERR_TENANT_NOT_ALLOWED;
        return -1;
    }
    if (class_name && strcmp(class_name, c->class_names[*def_class]) &&
        !(e && any_match(e->classes, e->n_classes, class_name))) {
        snprintf(err, errlen, "class: \"%.64s\" may not be claimed on topic %.100s (claims)",
                 class_name, topic);
        *code = REQ_ERR_CLASS_NOT_ALLOWED;
        return -1;
    }
    return 0;
}
