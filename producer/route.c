/* producer/route.c: routing keys and consistent hashing with bounded load (see route.h for the
 * definition every other producer must follow). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#include "producer/route.h"

typedef struct {
    uint64_t hash;
    int32_t part, vnode;
} point_t;

struct route {
    int n;               /* partitions */
    route_config_t cfg;
    point_t *ring;       /* [n * vnodes], sorted by (hash, part, vnode) */
    size_t n_points;
    long *load;          /* [n]: messages per partition in the window */
    int32_t *win;        /* [window]: partitions of the recorded messages, a ring buffer */
    long head, count;    /* oldest recorded message, messages recorded */
    unsigned char *seen; /* [n]: scratch of route_pick's walk */
};

void route_config_default(route_config_t *c)
{
    *c = (route_config_t){.prefix_bytes = 64, .eps = 0.25, .window = 1000, .vnodes = 128};
}

uint64_t route_hash(const void *key, size_t len) { return XXH64(key, len, 0); }

static int point_cmp(const void *a, const void *b)
{
    const point_t *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    if (x->part != y->part) return x->part < y->part ? -1 : 1;
    return (x->vnode > y->vnode) - (x->vnode < y->vnode);
}

route_t *route_new(int n_partitions, const route_config_t *cfg, char *errstr, size_t errlen)
{
    route_t *r = NULL;
    if (n_partitions < 1 || n_partitions > ROUTE_MAX_PARTITIONS) {
        snprintf(errstr, errlen, "route: %d partitions (1..%d)", n_partitions, ROUTE_MAX_PARTITIONS);
        return NULL;
    }
    if (!(cfg->eps >= 0 && cfg->eps <= 5) || cfg->window < 1 || cfg->window > (1L << 30) ||
        cfg->vnodes < 1 || cfg->vnodes > ROUTE_MAX_VNODES || cfg->prefix_bytes < 0) {
        snprintf(errstr, errlen, "route: eps %g (0..5), window %ld (>= 1), vnodes %ld (1..%d) or "
                 "prefix_bytes %ld out of range", cfg->eps, cfg->window, cfg->vnodes,
                 ROUTE_MAX_VNODES, cfg->prefix_bytes);
        return NULL;
    }
    r = calloc(1, sizeof *r);
    if (!r) goto oom;
    r->n = n_partitions;
    r->cfg = *cfg;
    r->n_points = (size_t)n_partitions * (size_t)cfg->vnodes;
    r->ring = malloc(r->n_points * sizeof *r->ring);
    r->load = calloc((size_t)n_partitions, sizeof *r->load);
    r->win = malloc((size_t)cfg->window * sizeof *r->win);
    r->seen = calloc((size_t)n_partitions, 1);
    if (!r->ring || !r->load || !r->win || !r->seen) goto oom;
    size_t i = 0;
    for (int p = 0; p < n_partitions; p++)
        for (long v = 0; v < cfg->vnodes; v++) {
            char name[32];
            int len = snprintf(name, sizeof name, "%d-%ld", p, v);
            r->ring[i++] = (point_t){route_hash(name, (size_t)len), p, (int32_t)v};
        }
    qsort(r->ring, r->n_points, sizeof *r->ring, point_cmp);
    return r;
oom:
    route_free(r);
    snprintf(errstr, errlen, "route: out of memory");
    return NULL;
}

void route_free(route_t *r)
{
    if (!r) return;
    free(r->ring);
    free(r->load);
    free(r->win);
    free(r->seen);
    free(r);
}

/* Index of the first ring point with hash >= h, 0 when there is none (the ring wraps). */
static size_t first_point(const route_t *r, uint64_t h)
{
    size_t lo = 0, hi = r->n_points;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->ring[mid].hash < h) lo = mid + 1;
        else hi = mid;
    }
    return lo == r->n_points ? 0 : lo;
}

int route_home(const route_t *r, uint64_t h) { return r->ring[first_point(r, h)].part; }

long route_cap(const route_t *r, long count)
{
    return (long)ceil(((1.0 + r->cfg.eps) * (double)count) / (double)r->n);
}

int route_pick(route_t *r, uint64_t h)
{
    if (r->count == r->cfg.window) {
        r->load[r->win[r->head]]--;
        r->head = (r->head + 1) % r->cfg.window;
        r->count--;
    }
    long cap = route_cap(r, r->count + 1);
    size_t i = first_point(r, h);
    int pick = r->ring[i].part;
    if (r->load[pick] >= cap) {
        /* walk on; every partition is on the ring, and one is under the cap */
        memset(r->seen, 0, (size_t)r->n);
        for (size_t step = 0; step < r->n_points; step++) {
            int p = r->ring[(i + step) % r->n_points].part;
            if (r->seen[p]) continue;
            r->seen[p] = 1;
            if (r->load[p] < cap) {
                pick = p;
                break;
            }
        }
    }
    r->win[(r->head + r->count) % r->cfg.window] = pick;
    r->count++;
    r->load[pick]++;
    return pick;
}

long route_load(const route_t *r, int p) { return p >= 0 && p < r->n ? r->load[p] : 0; }
long route_count(const route_t *r) { return r->count; }
int route_partitions(const route_t *r) { return r->n; }

/* ---- routing keys ---- */

/* XXH64 over the first `left` bytes of what is fed to it. */
typedef struct {
    XXH64_state_t *st;
    long left;
} cut_t;

static void feed(cut_t *c, const void *p, size_t n)
{
    if (c->left <= 0) return;
    if ((long)n > c->left) n = (size_t)c->left;
    XXH64_update(c->st, p, n);
    c->left -= (long)n;
}

int route_request_key(const json_t *req, long prefix_bytes, int use_prefix_key, uint64_t *hash,
                      char *errstr, size_t errlen)
{
    if (!json_is_object(req)) return ROUTE_KEY_NONE;
    json_t *pk = json_object_get(req, "prefix_key");
    if (pk && !json_is_null(pk)) {
        size_t n = json_is_string(pk) ? json_string_length(pk) : 0;
        if (!json_is_string(pk) || n < 1 || n > ROUTE_MAX_PREFIX_KEY ||
            memchr(json_string_value(pk), 0, n)) {
            snprintf(errstr, errlen, "prefix_key must be a string of 1..%d bytes",
                     ROUTE_MAX_PREFIX_KEY);
            return -1;
        }
        if (use_prefix_key) {
            *hash = route_hash(json_string_value(pk), n);
            return ROUTE_KEY_PREFIX_KEY;
        }
    }
    json_t *prompt = json_object_get(req, "prompt"), *msgs = json_object_get(req, "messages");
    json_t *ids = json_object_get(req, "input_ids");
    if (prefix_bytes > 0 && (json_is_string(prompt) || json_is_array(msgs) || json_is_array(ids))) {
        XXH64_state_t st;
        XXH64_reset(&st, 0);
        cut_t c = {&st, prefix_bytes};
        size_t i;
        json_t *m;
        if (json_is_string(prompt)) {
            feed(&c, json_string_value(prompt), json_string_length(prompt));
        } else if (json_is_array(msgs)) {
            json_array_foreach(msgs, i, m) {
                json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
                if (json_is_string(role)) feed(&c, json_string_value(role), json_string_length(role));
                feed(&c, "\x1f", 1);
                if (json_is_string(content)) {
                    feed(&c, json_string_value(content), json_string_length(content));
                } else if (json_is_array(content)) {
                    size_t j;
                    json_t *part;
                    json_array_foreach(content, j, part) {
                        json_t *t = json_object_get(part, "text");
                        if (json_is_string(t)) feed(&c, json_string_value(t), json_string_length(t));
                    }
                }
                feed(&c, "\x1e", 1);
                if (c.left <= 0) break;
            }
        } else {
            json_array_foreach(ids, i, m) {
                char num[32];
                int len = snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT ",",
                                   json_integer_value(m));
                feed(&c, num, (size_t)len);
                if (c.left <= 0) break;
            }
        }
        *hash = XXH64_digest(&st);
        return ROUTE_KEY_PROMPT;
    }
    json_t *id = json_object_get(req, "id");
    if (json_is_string(id)) {
        *hash = route_hash(json_string_value(id), json_string_length(id));
        return ROUTE_KEY_ID;
    }
    return ROUTE_KEY_NONE;
}
