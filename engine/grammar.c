/* engine/grammar.c: EBNF grammars, their matcher and token masks (contract: grammar.h).
 *
 * Compiled form: every rule is a list of alternatives; an alternative is a run of elements in
 * one flat array ending with an END element. Elements are CHAR (a sorted, merged set of code
 * point ranges, possibly negated) or REF (another rule). Repetitions and groups are rewritten
 * into generated rules at parse time:
 *     x*      R ::= x R |            x+  x R*            x?  R ::= x |
 *     x{m,n}  m copies of x, then O_{n-m} with O_1 ::= x | and O_k ::= x O_{k-1} |
 *     x{m,}   m copies of x, then R*
 *
 * Matcher state: a set of stacks plus a partial UTF-8 character. A stack is a linked list of
 * positions in an append-only arena (node = element index + parent node); its top is always a
 * CHAR element; the rest are return positions. The empty stack is the "accept" flag (the text so
 * far is a sentence). Expanding a position: END pops to the parent's return position; REF pushes
 * the return position (skipped when it is END: right recursion stays flat) and expands every
 * alternative of the rule. Stacks are deduplicated by a structural hash (equality checked).
 *
 * Masks: a byte trie over the vocabulary's token texts is walked depth first with the state;
 * a subtree is cut as soon as the state dies, and the arena is rolled back after each child. The
 * resulting bitset is cached per canonical state (its stacks as element lists, sorted by hash,
 * plus the partial character and the at-start flag). */
#include "engine/grammar.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

enum { E_END = 0, E_CHAR = 1, E_REF = 2 };

typedef struct {
    uint8_t type;
    uint8_t neg;       /* CHAR: matches code points outside the ranges */
    uint32_t a;        /* CHAR: first range index; REF: rule */
    uint32_t n;        /* CHAR: number of ranges */
} elem_t;

typedef struct {
    uint64_t hash, key_len;
    int32_t *key;
    uint32_t *mask;
} centry_t;

struct grammar {
    atomic_int refs;
    char *text;
    size_t text_len;
    uint64_t text_hash;
    elem_t *el;           /* [n_el] */
    uint32_t n_el;
    uint32_t *ranges;     /* [2 * n_ranges]: lo, hi inclusive */
    uint32_t n_ranges;
    uint32_t *alt_start;  /* [n_alts] element index of each alternative */
    uint32_t *rule_alt;   /* [n_rules + 1] alternatives of rule r: rule_alt[r] .. rule_alt[r+1] */
    uint32_t n_rules;
    uint32_t root;
    /* mask cache (step thread) */
    uint64_t cache_vocab;
    centry_t *cache;      /* open addressing, [cache_cap] */
    size_t cache_cap, cache_n, cache_bytes;
    uint64_t hits, misses;
};

/* ---------------------------------------------------------------------------------------- */
/* parser                                                                                     */

typedef struct { elem_t *v; size_t n, cap; } evec_t;
typedef struct {
    char *name;
    int defined;
    size_t first_use;     /* byte offset of the first reference, for errors */
    evec_t *alts;
    size_t n_alts, cap_alts;
} brule_t;

typedef struct {
    const char *s;
    size_t len, pos;
    brule_t *rules;
    size_t n_rules, cap_rules;
    uint32_t *ranges;
    size_t n_ranges, cap_ranges;
    size_t n_elems;
    int oom;
    char *err;
    size_t errlen;
    int failed;
} parser_t;

static int grow(void **p, size_t *cap, size_t need, size_t elsize)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elsize);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static void perr(parser_t *p, size_t at, const char *fmt, ...)
{
    if (p->failed) return;
    p->failed = 1;
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sw_seterr(p->err, p->errlen, "grammar %d:%d: %s", line, col, msg);
}

static void poom(parser_t *p)
{
    if (!p->failed) sw_seterr(p->err, p->errlen, "out of memory");
    p->failed = 1;
    p->oom = 1;
}

static int evec_push(parser_t *p, evec_t *v, elem_t e)
{
    if (p->n_elems >= GRAMMAR_MAX_ELEMS) {
        perr(p, p->pos, "grammar too large (more than %d elements)", GRAMMAR_MAX_ELEMS);
        return -1;
    }
    if (grow((void **)&v->v, &v->cap, v->n + 1, sizeof *v->v)) {
        poom(p);
        return -1;
    }
    v->v[v->n++] = e;
    p->n_elems++;
    return 0;
}

static int evec_append(parser_t *p, evec_t *v, const evec_t *w)
{
    for (size_t i = 0; i < w->n; i++)
        if (evec_push(p, v, w->v[i])) return -1;
    return 0;
}

/* New rule (named or generated); returns its index or -1. */
static int rule_new(parser_t *p, const char *name, size_t nlen)
{
    if (p->n_rules >= GRAMMAR_MAX_RULES) {
        perr(p, p->pos, "grammar too large (more than %d rules)", GRAMMAR_MAX_RULES);
        return -1;
    }
    if (grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules)) {
        poom(p);
        return -1;
    }
    brule_t *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(nlen + 1);
    if (!r->name) {
        poom(p);
        return -1;
    }
    memcpy(r->name, name, nlen);
    r->name[nlen] = 0;
    r->first_use = p->pos;
    return (int)p->n_rules++;
}

static int rule_find(parser_t *p, const char *name, size_t nlen)
{
    for (size_t i = 0; i < p->n_rules; i++)
        if (strlen(p->rules[i].name) == nlen && memcmp(p->rules[i].name, name, nlen) == 0)
            return (int)i;
    return rule_new(p, name, nlen);
}

/* Generated rule named after its parent. */
static int rule_gen(parser_t *p, int parent)
{
    char buf[96];
    int k = snprintf(buf, sizeof buf, "%.64s-%zu", p->rules[parent].name, p->n_rules);
    int r = rule_new(p, buf, (size_t)k);
    if (r >= 0) p->rules[r].defined = 1;
    return r;
}

/* Adds an alternative (moved from *alt) to rule r. */
static int rule_add_alt(parser_t *p, int r, evec_t *alt)
{
    brule_t *br = &p->rules[r];
    if (grow((void **)&br->alts, &br->cap_alts, br->n_alts + 1, sizeof *br->alts)) {
        poom(p);
        return -1;
    }
    br->alts[br->n_alts++] = *alt;
    memset(alt, 0, sizeof *alt);
    return 0;
}

static int is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

static void skip_ws(parser_t *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n') p->pos++;
        } else {
            break;
        }
    }
}

static size_t name_len_at(const parser_t *p, size_t at)
{
    size_t n = 0;
    while (at + n < p->len && is_name_char((unsigned char)p->s[at + n])) n++;
    return n;
}

/* 1 when a `name ::=` starts at p->pos. */
static int at_rule_start(parser_t *p)
{
    size_t n = name_len_at(p, p->pos);
    if (n == 0) return 0;
    size_t save = p->pos;
    p->pos += n;
    skip_ws(p);
    int r = p->pos + 3 <= p->len && memcmp(p->s + p->pos, "::=", 3) == 0;
    p->pos = save;
    return r;
}

/* Decodes one UTF-8 code point of the grammar text. -1 when invalid. */
static long utf8_at(parser_t *p)
{
    const unsigned char *s = (const unsigned char *)p->s;
    size_t i = p->pos;
    unsigned c = s[i];
    int n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2
            : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    if (n < 0) return -1;
    unsigned long cp = n == 0 ? c : n == 1 ? c & 0x1F : n == 2 ? c & 0x0F : c & 0x07;
    for (int k = 1; k <= n; k++) {
        if (i + (size_t)k >= p->len || (s[i + k] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[i + k] & 0x3F);
    }
    static const unsigned long minv[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < minv[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    p->pos += (size_t)n + 1;
    return (long)cp;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class (escapes decoded). -1 with an error. */
static long parse_char(parser_t *p)
{
    size_t at = p->pos;
    if (p->pos >= p->len) {
        perr(p, at, "unexpected end of grammar");
        return -1;
    }
    if (p->s[p->pos] != '\\') {
        long c = utf8_at(p);
        if (c < 0) perr(p, at, "invalid UTF-8 in the grammar text");
        return c;
    }
    p->pos++;
    if (p->pos >= p->len) {
        perr(p, at, "unfinished escape");
        return -1;
    }
    char c = p->s[p->pos++];
    int nhex = 0;
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': return '\\';
    case '"': return '"';
    case '\'': return '\'';
    case '[': return '[';
    case ']': return ']';
    case '-': return '-';
    case '^': return '^';
    case '/': return '/';
    case 'x': nhex = 2; break;
    case 'u': nhex = 4; break;
    case 'U': nhex = 8; break;
    default: perr(p, at, "unknown escape \\%c", c); return -1;
    }
    unsigned long v = 0;
    for (int k = 0; k < nhex; k++) {
        int h = p->pos < p->len ? hexval((unsigned char)p->s[p->pos]) : -1;
        if (h < 0) {
            perr(p, at, "escape \\%c needs %d hex digits", c, nhex);
            return -1;
        }
        v = v << 4 | (unsigned)h;
        p->pos++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        perr(p, at, "escape gives U+%lX, not a Unicode scalar value", v);
        return -1;
    }
    return (long)v;
}

static int cmp_range(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0;
}

/* Appends a CHAR element for ranges tmp[0..2n) (sorted and merged here). */
static int push_charset(parser_t *p, evec_t *out, uint32_t *tmp, size_t n, int neg)
{
    if (n) qsort(tmp, n, 2 * sizeof *tmp, cmp_range);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && tmp[2 * i] <= tmp[2 * (m - 1) + 1] + 1) {
            if (tmp[2 * i + 1] > tmp[2 * (m - 1) + 1]) tmp[2 * (m - 1) + 1] = tmp[2 * i + 1];
        } else {
            tmp[2 * m] = tmp[2 * i];
            tmp[2 * m + 1] = tmp[2 * i + 1];
            m++;
        }
    }
    if (grow((void **)&p->ranges, &p->cap_ranges, 2 * (p->n_ranges + m), sizeof *p->ranges)) {
        poom(p);
        return -1;
    }
    elem_t e = {E_CHAR, (uint8_t)neg, (uint32_t)p->n_ranges, (uint32_t)m};
    if (m) memcpy(p->ranges + 2 * p->n_ranges, tmp, 2 * m * sizeof *tmp);
    p->n_ranges += m;
    return evec_push(p, out, e);
}

static int parse_alternatives(parser_t *p, int rule, int nested);

static int parse_class(parser_t *p, evec_t *out)
{
    size_t at = p->pos;
    p->pos++; /* [ */
    int neg = 0;
    if (p->pos < p->len && p->s[p->pos] == '^') {
        neg = 1;
        p->pos++;
    }
    uint32_t *tmp = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (p->pos >= p->len) {
            perr(p, at, "character class not closed with ]");
            goto fail;
        }
        if (p->s[p->pos] == ']') {
            p->pos++;
            break;
        }
        long lo = parse_char(p);
        if (lo < 0) goto fail;
        long hi = lo;
        if (p->pos + 1 < p->len && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
            p->pos++;
            hi = parse_char(p);
            if (hi < 0) goto fail;
            if (hi < lo) {
                perr(p, at, "range U+%lX-U+%lX in a character class is backwards", lo, hi);
                goto fail;
            }
        }
        if (grow((void **)&tmp, &cap, 2 * (n + 1), sizeof *tmp)) {
            poom(p);
            goto fail;
        }
        tmp[2 * n] = (uint32_t)lo;
        tmp[2 * n + 1] = (uint32_t)hi;
        n++;
    }
    if (n == 0 && !neg) {
        perr(p, at, "empty character class [] matches nothing");
        goto fail;
    }
    int r = push_charset(p, out, tmp, n, neg);
    free(tmp);
    return r;
fail:
    free(tmp);
    return -1;
}

static int parse_string(parser_t *p, evec_t *out)
{
    size_t at = p->pos;
    p->pos++; /* " */
    for (;;) {
        if (p->pos >= p->len) {
            perr(p, at, "string literal not closed with \"");
            return -1;
        }
        if (p->s[p->pos] == '"') {
            p->pos++;
            return 0;
        }
        long c = parse_char(p);
        if (c < 0) return -1;
        uint32_t r[2] = {(uint32_t)c, (uint32_t)c};
        if (push_charset(p, out, r, 1, 0)) return -1;
    }
}

/* x* as a new rule; prim holds x (one element). Returns the REF element's rule or -1. */
static int make_star(parser_t *p, int parent, const evec_t *prim)
{
    int r = rule_gen(p, parent);
    if (r < 0) return -1;
    evec_t a = {0}, b = {0};
    if (evec_append(p, &a, prim) || evec_push(p, &a, (elem_t){E_REF, 0, (uint32_t)r, 0}) ||
        rule_add_alt(p, r, &a) || rule_add_alt(p, r, &b)) {
        free(a.v);
        return -1;
    }
    return r;
}

static int parse_uint(parser_t *p, unsigned long *v)
{
    size_t at = p->pos;
    *v = 0;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') {
        perr(p, at, "expected a number in {m,n}");
        return -1;
    }
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        *v = *v * 10 + (unsigned long)(p->s[p->pos++] - '0');
        if (*v > GRAMMAR_MAX_REPEAT) {
            perr(p, at, "repetition bound over %d", GRAMMAR_MAX_REPEAT);
            return -1;
        }
    }
    return 0;
}

/* Applies a postfix operator at p->pos (if any) to prim, appending the result to out. */
static int apply_postfix(parser_t *p, int rule, evec_t *prim, evec_t *out)
{
    size_t save = p->pos;
    skip_ws(p);
    char c = p->pos < p->len ? p->s[p->pos] : 0;
    if (c != '*' && c != '+' && c != '?' && c != '{') {
        p->pos = save;
        return evec_append(p, out, prim);
    }
    size_t at = p->pos;
    p->pos++;
    if (prim->n != 1) { /* wrap into one rule */
        int w = rule_gen(p, rule);
        if (w < 0) return -1;
        evec_t a = {0};
        if (evec_append(p, &a, prim) || rule_add_alt(p, w, &a)) {
            free(a.v);
            return -1;
        }
        prim->n = 0;
        if (evec_push(p, prim, (elem_t){E_REF, 0, (uint32_t)w, 0})) return -1;
    }
    unsigned long m = 0, n = 0;
    int unbounded = 0;
    if (c == '*') {
        m = 0;
        unbounded = 1;
    } else if (c == '+') {
        m = 1;
        unbounded = 1;
    } else if (c == '?') {
        m = 0;
        n = 1;
    } else {
        skip_ws(p);
        if (parse_uint(p, &m)) return -1;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == '}') {
                unbounded = 1;
            } else if (parse_uint(p, &n)) {
                return -1;
            }
        } else {
            n = m;
        }
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '}') {
            perr(p, at, "repetition {m,n} not closed with }");
            return -1;
        }
        p->pos++;
        if (!unbounded && n < m) {
            perr(p, at, "repetition {%lu,%lu}: the maximum is below the minimum", m, n);
            return -1;
        }
    }
    for (unsigned long i = 0; i < m; i++)
        if (evec_append(p, out, prim)) return -1;
    if (unbounded) {
        int r = make_star(p, rule, prim);
        if (r < 0) return -1;
        return evec_push(p, out, (elem_t){E_REF, 0, (uint32_t)r, 0});
    }
    int prev = -1;
    for (unsigned long k = 0; k < n - m; k++) {
        int r = rule_gen(p, rule);
        if (r < 0) return -1;
        evec_t a = {0}, b = {0};
        if (evec_append(p, &a, prim) ||
            (prev >= 0 && evec_push(p, &a, (elem_t){E_REF, 0, (uint32_t)prev, 0})) ||
            rule_add_alt(p, r, &a) || rule_add_alt(p, r, &b)) {
            free(a.v);
            return -1;
        }
        prev = r;
    }
    if (prev >= 0) return evec_push(p, out, (elem_t){E_REF, 0, (uint32_t)prev, 0});
    return 0;
}

static int parse_sequence(parser_t *p, int rule, evec_t *out)
{
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len) return 0;
        char c = p->s[p->pos];
        if (c == '|' || c == ')' || at_rule_start(p)) return 0;
        evec_t prim = {0};
        size_t at = p->pos;
        if (c == '"') {
            if (parse_string(p, &prim)) goto fail;
        } else if (c == '[') {
            if (parse_class(p, &prim)) goto fail;
        } else if (c == '.') {
            p->pos++;
            if (push_charset(p, &prim, NULL, 0, 1)) goto fail;
        } else if (c == '(') {
            p->pos++;
            int g = rule_gen(p, rule);
            if (g < 0 || parse_alternatives(p, g, 1)) goto fail;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ')') {
                perr(p, at, "( not closed with )");
                goto fail;
            }
            p->pos++;
            if (evec_push(p, &prim, (elem_t){E_REF, 0, (uint32_t)g, 0})) goto fail;
        } else if (is_name_char((unsigned char)c)) {
            size_t n = name_len_at(p, p->pos);
            int r = rule_find(p, p->s + p->pos, n);
            if (r < 0) goto fail;
            p->pos += n;
            if (evec_push(p, &prim, (elem_t){E_REF, 0, (uint32_t)r, 0})) goto fail;
        } else {
            perr(p, at, "unexpected character '%c'", c);
            goto fail;
        }
        if (apply_postfix(p, rule, &prim, out)) goto fail;
        free(prim.v);
        continue;
    fail:
        free(prim.v);
        return -1;
    }
}

static int parse_alternatives(parser_t *p, int rule, int nested)
{
    for (;;) {
        evec_t alt = {0};
        if (parse_sequence(p, rule, &alt) || rule_add_alt(p, rule, &alt)) {
            free(alt.v);
            return -1;
        }
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == '|') {
            p->pos++;
            continue;
        }
        if (!nested && p->pos < p->len && p->s[p->pos] == ')') {
            perr(p, p->pos, "unbalanced )");
            return -1;
        }
        return 0;
    }
}

static void parser_free(parser_t *p)
{
    for (size_t i = 0; i < p->n_rules; i++) {
        for (size_t k = 0; k < p->rules[i].n_alts; k++) free(p->rules[i].alts[k].v);
        free(p->rules[i].alts);
        free(p->rules[i].name);
    }
    free(p->rules);
    free(p->ranges);
}

/* Left recursion check: DFS over "r can start with rule q" edges (through nullable prefixes). */
static int leftrec_dfs(const grammar_t *g, const uint8_t *nullable, uint8_t *color, uint32_t r,
                       uint32_t *cycle_at)
{
    color[r] = 1;
    for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
        for (uint32_t i = g->alt_start[a]; g->el[i].type != E_END; i++) {
            const elem_t *e = &g->el[i];
            if (e->type == E_CHAR) break;
            uint32_t q = e->a;
            if (color[q] == 1) {
                *cycle_at = q;
                return -1;
            }
            if (color[q] == 0 && leftrec_dfs(g, nullable, color, q, cycle_at)) return -1;
            if (!nullable[q]) break;
        }
    }
    color[r] = 2;
    return 0;
}

static uint64_t fnv64(const void *data, size_t n)
{
    const unsigned char *s = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h;
}

grammar_t *grammar_parse(const char *text, size_t len, char *errstr, size_t errlen)
{
    parser_t p = {.s = text, .len = len, .err = errstr, .errlen = errlen};
    grammar_t *g = NULL;
    uint8_t *nullable = NULL, *color = NULL;
    if (!text) {
        sw_seterr(errstr, errlen, "no grammar text");
        return NULL;
    }
    for (;;) {
        skip_ws(&p);
        if (p.pos >= p.len) break;
        size_t at = p.pos;
        size_t n = name_len_at(&p, p.pos);
        if (n == 0 || !at_rule_start(&p)) {
            perr(&p, at, "expected a rule `name ::= ...`");
            goto fail;
        }
        int r = rule_find(&p, p.s + p.pos, n);
        if (r < 0) goto fail;
        if (p.rules[r].defined) {
            perr(&p, at, "rule %s defined twice", p.rules[r].name);
            goto fail;
        }
        p.rules[r].defined = 1;
        p.pos += n;
        skip_ws(&p);
        p.pos += 3;
        if (parse_alternatives(&p, r, 0)) goto fail;
    }
    int root = -1;
    for (size_t i = 0; i < p.n_rules; i++) {
        if (!p.rules[i].defined) {
            perr(&p, p.rules[i].first_use, "rule %s is used but not defined", p.rules[i].name);
            goto fail;
        }
        if (strcmp(p.rules[i].name, "root") == 0) root = (int)i;
    }
    if (root < 0) {
        sw_seterr(errstr, errlen, "grammar has no root rule (`root ::= ...`)");
        goto fail;
    }
    g = calloc(1, sizeof *g);
    if (!g) goto oom;
    atomic_init(&g->refs, 1);
    g->text = malloc(len + 1);
    if (!g->text) goto oom;
    if (len) memcpy(g->text, text, len);
    g->text[len] = 0;
    g->text_len = len;
    g->text_hash = fnv64(text, len);
    size_t n_alts = 0, n_el = 0;
    for (size_t i = 0; i < p.n_rules; i++) {
        n_alts += p.rules[i].n_alts;
        for (size_t k = 0; k < p.rules[i].n_alts; k++) n_el += p.rules[i].alts[k].n + 1;
    }
    g->n_rules = (uint32_t)p.n_rules;
    g->root = (uint32_t)root;
    g->el = malloc(n_el * sizeof *g->el);
    g->alt_start = malloc((n_alts ? n_alts : 1) * sizeof *g->alt_start);
    g->rule_alt = malloc((p.n_rules + 1) * sizeof *g->rule_alt);
    g->ranges = malloc((p.n_ranges ? 2 * p.n_ranges : 1) * sizeof *g->ranges);
    if (!g->el || !g->alt_start || !g->rule_alt || !g->ranges) goto oom;
    if (p.n_ranges) memcpy(g->ranges, p.ranges, 2 * p.n_ranges * sizeof *g->ranges);
    g->n_ranges = (uint32_t)p.n_ranges;
    uint32_t ai = 0, ei = 0;
    for (size_t i = 0; i < p.n_rules; i++) {
        g->rule_alt[i] = ai;
        for (size_t k = 0; k < p.rules[i].n_alts; k++) {
            g->alt_start[ai++] = ei;
            if (p.rules[i].alts[k].n)
                memcpy(g->el + ei, p.rules[i].alts[k].v, p.rules[i].alts[k].n * sizeof *g->el);
            ei += (uint32_t)p.rules[i].alts[k].n;
            g->el[ei++] = (elem_t){E_END, 0, 0, 0};
        }
    }
    g->rule_alt[p.n_rules] = ai;
    g->n_el = ei;
    /* nullable rules (fixpoint) */
    nullable = calloc(p.n_rules, 1);
    color = calloc(p.n_rules, 1);
    if (!nullable || !color) goto oom;
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !nullable[r]; a++) {
                uint32_t i = g->alt_start[a];
                while (g->el[i].type == E_REF && nullable[g->el[i].a]) i++;
                if (g->el[i].type == E_END) {
                    nullable[r] = 1;
                    changed = 1;
                }
            }
        }
    }
    for (uint32_t r = 0; r < g->n_rules; r++) {
        uint32_t at = 0;
        if (color[r] == 0 && leftrec_dfs(g, nullable, color, r, &at)) {
            perr(&p, p.rules[at].first_use,
                 "rule %s is left-recursive (directly, through rules that can match empty, or "
                 "as a repetition of something that can match empty)", p.rules[at].name);
            goto fail;
        }
    }
    free(nullable);
    free(color);
    parser_free(&p);
    return g;
oom:
    sw_seterr(errstr, errlen, "out of memory");
fail:
    free(nullable);
    free(color);
    parser_free(&p);
    if (g) {
        atomic_store(&g->refs, 1);
        grammar_release(g);
    }
    return NULL;
}

static void cache_clear(grammar_t *g)
{
    for (size_t i = 0; i < g->cache_cap; i++) {
        free(g->cache[i].key);
        free(g->cache[i].mask);
    }
    free(g->cache);
    g->cache = NULL;
    g->cache_cap = g->cache_n = g->cache_bytes = 0;
}

grammar_t *grammar_retain(grammar_t *g)
{
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void grammar_release(grammar_t *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    cache_clear(g);
    free(g->text);
    free(g->el);
    free(g->alt_start);
    free(g->rule_alt);
    free(g->ranges);
    free(g);
}

uint64_t grammar_text_hash(const grammar_t *g) { return g->text_hash; }

int grammar_same_text(const grammar_t *a, const grammar_t *b)
{
    return a == b || (a->text_hash == b->text_hash && a->text_len == b->text_len &&
                      memcmp(a->text, b->text, a->text_len) == 0);
}

void grammar_cache_stats(const grammar_t *g, uint64_t *hits, uint64_t *misses)
{
    if (hits) *hits = g->hits;
    if (misses) *misses = g->misses;
}

/* ---------------------------------------------------------------------------------------- */
/* matcher                                                                                    */

typedef struct {
    int32_t elem, parent;
    uint64_t hash;
} snode_t;

typedef struct {
    snode_t *v;
    size_t n, cap;
} arena_t;

typedef struct {
    int32_t *tops;
    size_t n, cap;
    int accept;
    /* partial UTF-8 character: need continuation bytes remain; cp holds the bits so far; len is
     * the character's total length */
    uint32_t cp;
    int need, len;
    uint64_t hash;   /* of the set (mask walks only): order-independent over the tops' hashes */
} sset_t;

typedef struct {
    const grammar_t *g;
    arena_t *ar;
    int oom;
} mctx_t;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static int32_t node_new(mctx_t *c, int32_t elem, int32_t parent)
{
    arena_t *a = c->ar;
    if (a->n >= (size_t)INT32_MAX || grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v)) {
        c->oom = 1;
        return -1;
    }
    uint64_t ph = parent >= 0 ? a->v[parent].hash : 0x9e3779b97f4a7c15ull;
    a->v[a->n] = (snode_t){elem, parent, mix64(ph * 31 + (uint64_t)elem + 1)};
    return (int32_t)a->n++;
}

static int stack_equal(const arena_t *a, int32_t x, int32_t y)
{
    while (x != y) {
        if (x < 0 || y < 0) return 0;
        if (a->v[x].hash != a->v[y].hash || a->v[x].elem != a->v[y].elem) return 0;
        x = a->v[x].parent;
        y = a->v[y].parent;
    }
    return 1;
}

static void sset_add(mctx_t *c, sset_t *s, int32_t node)
{
    for (size_t i = 0; i < s->n; i++)
        if (stack_equal(c->ar, s->tops[i], node)) return;
    if (grow((void **)&s->tops, &s->cap, s->n + 1, sizeof *s->tops)) {
        c->oom = 1;
        return;
    }
    s->tops[s->n++] = node;
}

/* Adds to out every stack that results from standing at element pos with return stack parent. */
static void expand(mctx_t *c, uint32_t pos, int32_t parent, sset_t *out)
{
    const grammar_t *g = c->g;
    for (;;) {
        if (c->oom) return;
        const elem_t *e = &g->el[pos];
        if (e->type == E_END) {
            if (parent < 0) {
                out->accept = 1;
                return;
            }
            pos = (uint32_t)c->ar->v[parent].elem;
            parent = c->ar->v[parent].parent;
            continue;
        }
        if (e->type == E_CHAR) {
            int32_t nd = node_new(c, (int32_t)pos, parent);
            if (nd >= 0) sset_add(c, out, nd);
            return;
        }
        int32_t ret = parent;
        if (g->el[pos + 1].type != E_END) {
            ret = node_new(c, (int32_t)pos + 1, parent);
            if (ret < 0) return;
        }
        uint32_t r = e->a;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            expand(c, g->alt_start[a], ret, out);
        return;
    }
}

static int charset_has(const grammar_t *g, const elem_t *e, uint32_t cp)
{
    const uint32_t *r = g->ranges + 2 * e->a;
    int in = 0;
    for (uint32_t i = 0; i < e->n; i++) {
        if (cp < r[2 * i]) break;
        if (cp <= r[2 * i + 1]) {
            in = 1;
            break;
        }
    }
    return in ^ e->neg;
}

/* 1 when some code point in [lo, hi] is in the set. */
static int charset_meets(const grammar_t *g, const elem_t *e, uint32_t lo, uint32_t hi)
{
    const uint32_t *r = g->ranges + 2 * e->a;
    if (!e->neg) {
        for (uint32_t i = 0; i < e->n; i++)
            if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return 1;
        return 0;
    }
    for (uint32_t i = 0; i < e->n; i++) /* merged ranges: covered only by a single one */
        if (r[2 * i] <= lo && r[2 * i + 1] >= hi) return 0;
    return 1;
}

static void sset_reset(sset_t *s)
{
    s->n = 0;
    s->accept = 0;
    s->cp = 0;
    s->need = s->len = 0;
}

/* out = in advanced by byte b. Returns 1 when alive (some stack may continue), 0 when dead.
 * out must not be in. */
static int step_byte(mctx_t *c, const sset_t *in, unsigned b, sset_t *out)
{
    const grammar_t *g = c->g;
    sset_reset(out);
    uint32_t cp;
    int need, len;
    if (in->need == 0) {
        if (b < 0x80) {
            cp = b;
            need = 0;
            len = 1;
        } else if (b >= 0xC2 && b <= 0xDF) {
            cp = b & 0x1F;
            need = 1;
            len = 2;
        } else if (b >= 0xE0 && b <= 0xEF) {
            cp = b & 0x0F;
            need = 2;
            len = 3;
        } else if (b >= 0xF0 && b <= 0xF4) {
            cp = b & 0x07;
            need = 3;
            len = 4;
        } else {
            return 0;
        }
    } else {
        if ((b & 0xC0) != 0x80) return 0;
        cp = in->cp << 6 | (b & 0x3F);
        need = in->need - 1;
        len = in->len;
    }
    if (need > 0) {
        static const uint32_t minv[5] = {0, 0, 0x80, 0x800, 0x10000};
        static const uint32_t maxv[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
        uint32_t lo = cp << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
        if (lo < minv[len]) lo = minv[len];
        if (hi > maxv[len]) hi = maxv[len];
        if (len == 3 && lo >= 0xD800 && hi <= 0xDFFF) return 0;
        if (lo > hi) return 0;
        for (size_t i = 0; i < in->n; i++) {
            const elem_t *e = &g->el[c->ar->v[in->tops[i]].elem];
            if (charset_meets(g, e, lo, hi)) {
                if (grow((void **)&out->tops, &out->cap, out->n + 1, sizeof *out->tops)) {
                    c->oom = 1;
                    return 0;
                }
                out->tops[out->n++] = in->tops[i];
            }
        }
        out->cp = cp;
        out->need = need;
        out->len = len;
        return out->n > 0;
    }
    if (len == 3 && cp >= 0xD800 && cp <= 0xDFFF) return 0;
    for (size_t i = 0; i < in->n; i++) {
        const snode_t nd = c->ar->v[in->tops[i]];
        const elem_t *e = &g->el[nd.elem];
        if (charset_has(g, e, cp)) expand(c, (uint32_t)nd.elem + 1, nd.parent, out);
    }
    if (c->oom) return 0;
    return out->n > 0 || out->accept;
}

/* A mask walk's transition memo: (set hash, byte) -> the set it leads to. */
typedef struct {
    uint64_t key, out_hash;
    uint32_t gen, cp;
    int32_t off, n;          /* tops in the walk's pool */
    int8_t alive, accept, need, len;
} memo_t;

#define MEMO_SLOTS 8192

struct grammar_state {
    grammar_t *g;
    arena_t ar;
    sset_t cur, tmp[2];
    size_t compact_at;
    /* mask walk scratch */
    sset_t *lvl;
    size_t n_lvl;
    int32_t *key;
    size_t key_cap;
    memo_t *memo;            /* [MEMO_SLOTS] */
    uint32_t memo_gen;       /* entries of other generations are empty */
    int32_t *pool;
    size_t pool_n, pool_cap;
};

grammar_state_t *grammar_state_new(grammar_t *g, char *errstr, size_t errlen)
{
    grammar_state_t *st = calloc(1, sizeof *st);
    if (!st) goto oom;
    st->g = grammar_retain(g);
    mctx_t c = {g, &st->ar, 0};
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        expand(&c, g->alt_start[a], -1, &st->cur);
    if (c.oom) goto oom;
    st->compact_at = st->ar.n * 2 + 4096;
    return st;
oom:
    sw_seterr(errstr, errlen, "out of memory");
    grammar_state_free(st);
    return NULL;
}

void grammar_state_free(grammar_state_t *st)
{
    if (!st) return;
    grammar_release(st->g);
    free(st->ar.v);
    free(st->cur.tops);
    free(st->tmp[0].tops);
    free(st->tmp[1].tops);
    for (size_t i = 0; i < st->n_lvl; i++) free(st->lvl[i].tops);
    free(st->lvl);
    free(st->key);
    free(st->memo);
    free(st->pool);
    free(st);
}

grammar_t *grammar_state_grammar(const grammar_state_t *st) { return st->g; }

int grammar_state_can_end(const grammar_state_t *st) { return st->cur.accept && st->cur.need == 0; }

int grammar_state_done(const grammar_state_t *st)
{
    return st->cur.accept && st->cur.need == 0 && st->cur.n == 0;
}

static int32_t remap_node(const arena_t *old, arena_t *nw, int32_t *map, int32_t x, mctx_t *c)
{
    if (x < 0) return -1;
    if (map[x] >= 0) return map[x];
    /* iterative: find the deepest unmapped ancestor chain */
    int32_t chain[64];
    int n = 0;
    int32_t y = x;
    while (y >= 0 && map[y] < 0 && n < 64) {
        chain[n++] = y;
        y = old->v[y].parent;
    }
    int32_t parent = y < 0 ? -1 : map[y] >= 0 ? map[y] : remap_node(old, nw, map, y, c);
    for (int i = n - 1; i >= 0; i--) {
        mctx_t cc = {c->g, nw, 0};
        int32_t nd = node_new(&cc, old->v[chain[i]].elem, parent);
        if (nd < 0) {
            c->oom = 1;
            return -1;
        }
        map[chain[i]] = nd;
        parent = nd;
    }
    return map[x];
}

/* Copies the live stacks into a fresh arena (the old one holds the history of every step). */
static void compact(grammar_state_t *st)
{
    int32_t *map = malloc(st->ar.n * sizeof *map);
    if (!map) return;
    memset(map, 0xff, st->ar.n * sizeof *map);
    arena_t nw = {0};
    mctx_t c = {st->g, &nw, 0};
    int32_t *tops = malloc((st->cur.n ? st->cur.n : 1) * sizeof *tops);
    if (!tops) goto out;
    for (size_t i = 0; i < st->cur.n && !c.oom; i++)
        tops[i] = remap_node(&st->ar, &nw, map, st->cur.tops[i], &c);
    if (c.oom) {
        free(nw.v);
        goto out;
    }
    memcpy(st->cur.tops, tops, st->cur.n * sizeof *tops);
    free(st->ar.v);
    st->ar = nw;
    st->compact_at = st->ar.n * 2 + 4096;
out:
    free(tops);
    free(map);
}

static void sset_copy(mctx_t *c, sset_t *dst, const sset_t *src)
{
    if (grow((void **)&dst->tops, &dst->cap, src->n ? src->n : 1, sizeof *dst->tops)) {
        c->oom = 1;
        return;
    }
    if (src->n) memcpy(dst->tops, src->tops, src->n * sizeof *src->tops);
    dst->n = src->n;
    dst->accept = src->accept;
    dst->cp = src->cp;
    dst->need = src->need;
    dst->len = src->len;
}

int grammar_state_advance(grammar_state_t *st, const char *bytes, size_t n)
{
    mctx_t c = {st->g, &st->ar, 0};
    size_t mark = st->ar.n;
    const sset_t *in = &st->cur;
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        sset_t *out = &st->tmp[k];
        if (!step_byte(&c, in, (unsigned char)bytes[i], out)) {
            st->ar.n = mark;
            return c.oom ? -2 : -1;
        }
        /* a byte after the grammar ended: nothing can take it */
        in = out;
        k ^= 1;
    }
    if (n == 0) return 0;
    sset_copy(&c, &st->cur, in);
    if (c.oom) {
        st->ar.n = mark;
        return -2;
    }
    if (st->ar.n > st->compact_at) compact(st);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* vocabulary trie and masks                                                                  */

struct grammar_vocab {
    int n;
    uint64_t id;           /* content hash: keys the grammars' mask caches */
    char *pool;
    size_t *off, *len;
    unsigned char *eog;
    int strip;
    int32_t *space_ids;    /* tokens starting with ' ' (their at-start text differs) */
    int n_space;
    /* trie while building: node 0 is the root, children in linked lists */
    int32_t *first_child, *next_sib, *tok_first;
    uint8_t *byte;
    int32_t n_nodes, cap_nodes;
    int32_t *tok_next;     /* [n] next token ending at the same node */
    int32_t root_child[256];
    /* the same trie in depth-first preorder (walked): node i's subtree is [i, i + size[i]),
     * its children follow it, each after the previous child's subtree */
    int32_t *d_size, *d_tok;
    uint8_t *d_byte;
};

static int trie_node(grammar_vocab_t *v, uint8_t b)
{
    if (v->n_nodes == v->cap_nodes) {
        size_t cap = v->cap_nodes ? (size_t)v->cap_nodes * 2 : 1024;
        int32_t *a = realloc(v->first_child, cap * sizeof *a);
        if (!a) return -1;
        v->first_child = a;
        a = realloc(v->next_sib, cap * sizeof *a);
        if (!a) return -1;
        v->next_sib = a;
        a = realloc(v->tok_first, cap * sizeof *a);
        if (!a) return -1;
        v->tok_first = a;
        uint8_t *bb = realloc(v->byte, cap);
        if (!bb) return -1;
        v->byte = bb;
        v->cap_nodes = (int32_t)cap;
    }
    int32_t i = v->n_nodes++;
    v->first_child[i] = v->next_sib[i] = v->tok_first[i] = -1;
    v->byte[i] = b;
    return i;
}

/* Lays the linked trie out in depth-first preorder (d_size, d_tok, d_byte). 0 or -1. */
static int vocab_preorder(grammar_vocab_t *v)
{
    size_t n = (size_t)v->n_nodes;
    int32_t *stack = malloc(n * sizeof *stack), *pos = malloc(n * sizeof *pos);
    v->d_size = malloc(n * sizeof *v->d_size);
    v->d_tok = malloc(n * sizeof *v->d_tok);
    v->d_byte = malloc(n);
    if (!stack || !pos || !v->d_size || !v->d_tok || !v->d_byte) {
        free(stack);
        free(pos);
        return -1;
    }
    /* preorder numbering with an explicit stack; sizes from the numbering afterwards */
    int32_t sp = 0, next = 0;
    stack[sp++] = 0;
    while (sp > 0) {
        int32_t x = stack[--sp];
        pos[x] = next;
        v->d_tok[next] = v->tok_first[x];
        v->d_byte[next] = v->byte[x];
        next++;
        for (int32_t c = v->first_child[x]; c >= 0; c = v->next_sib[c]) stack[sp++] = c;
    }
    /* size = 1 + sizes of the children: children have larger preorder numbers, so a pass in
     * decreasing preorder (nodes listed by position) accumulates them */
    int32_t *order = stack; /* order[pos] = node */
    for (size_t x = 0; x < n; x++) order[pos[x]] = (int32_t)x;
    for (size_t i = n; i-- > 0;) {
        int32_t x = order[i], s = 1;
        for (int32_t c = v->first_child[x]; c >= 0; c = v->next_sib[c]) s += v->d_size[pos[c]];
        v->d_size[i] = s;
    }
    free(stack);
    free(pos);
    free(v->first_child);
    free(v->next_sib);
    free(v->tok_first);
    free(v->byte);
    v->first_child = v->next_sib = v->tok_first = NULL;
    v->byte = NULL;
    return 0;
}

grammar_vocab_t *grammar_vocab_new(int n_vocab, const char *const *pieces, const size_t *lens,
                                   const unsigned char *eog, int strip_start_space,
                                   char *errstr, size_t errlen)
{
    if (n_vocab <= 0) {
        sw_seterr(errstr, errlen, "empty vocabulary");
        return NULL;
    }
    grammar_vocab_t *v = calloc(1, sizeof *v);
    if (!v) goto oom;
    v->n = n_vocab;
    v->strip = strip_start_space ? 1 : 0;
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++) total += lens[i];
    v->pool = malloc(total + 1);
    v->off = malloc((size_t)n_vocab * sizeof *v->off);
    v->len = malloc((size_t)n_vocab * sizeof *v->len);
    v->eog = calloc((size_t)n_vocab, 1);
    v->tok_next = malloc((size_t)n_vocab * sizeof *v->tok_next);
    v->space_ids = malloc((size_t)n_vocab * sizeof *v->space_ids);
    if (!v->pool || !v->off || !v->len || !v->eog || !v->tok_next || !v->space_ids) goto oom;
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n_vocab;
    size_t at = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (lens[i]) memcpy(v->pool + at, pieces[i], lens[i]);
        v->off[i] = at;
        v->len[i] = lens[i];
        at += lens[i];
        if (eog) v->eog[i] = eog[i] ? 1 : 0;
        h = mix64(h ^ fnv64(pieces[i], lens[i]) ^ ((uint64_t)v->eog[i] << 63));
        v->tok_next[i] = -1;
        if (lens[i] > 0 && pieces[i][0] == ' ' && v->strip) v->space_ids[v->n_space++] = i;
    }
    v->id = mix64(h + (uint64_t)v->strip);
    if (trie_node(v, 0) < 0) goto oom;
    for (int b = 0; b < 256; b++) v->root_child[b] = -1;
    for (int i = 0; i < n_vocab; i++) {
        const unsigned char *s = (const unsigned char *)v->pool + v->off[i];
        if (v->len[i] == 0) continue;
        int32_t node = 0;
        for (size_t k = 0; k < v->len[i]; k++) {
            int32_t ch = -1;
            if (node == 0) {
                ch = v->root_child[s[k]];
            } else {
                for (ch = v->first_child[node]; ch >= 0 && v->byte[ch] != s[k];)
                    ch = v->next_sib[ch];
            }
            if (ch < 0) {
                ch = trie_node(v, s[k]);
                if (ch < 0) goto oom;
                v->next_sib[ch] = v->first_child[node];
                v->first_child[node] = ch;
                if (node == 0) v->root_child[s[k]] = ch;
            }
            node = ch;
        }
        v->tok_next[i] = v->tok_first[node];
        v->tok_first[node] = i;
    }
    if (vocab_preorder(v)) goto oom;
    return v;
oom:
    sw_seterr(errstr, errlen, "out of memory");
    grammar_vocab_free(v);
    return NULL;
}

void grammar_vocab_free(grammar_vocab_t *v)
{
    if (!v) return;
    free(v->pool);
    free(v->off);
    free(v->len);
    free(v->eog);
    free(v->tok_next);
    free(v->space_ids);
    free(v->first_child);
    free(v->next_sib);
    free(v->tok_first);
    free(v->byte);
    free(v->d_size);
    free(v->d_tok);
    free(v->d_byte);
    free(v);
}

int grammar_vocab_n(const grammar_vocab_t *v) { return v->n; }

const char *grammar_vocab_piece(const grammar_vocab_t *v, int32_t id, int at_start, size_t *len)
{
    if (id < 0 || id >= v->n) {
        *len = 0;
        return "";
    }
    const char *p = v->pool + v->off[id];
    size_t n = v->len[id];
    if (at_start && v->strip && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    *len = n;
    return p;
}

int grammar_vocab_is_eog(const grammar_vocab_t *v, int32_t id)
{
    return id >= 0 && id < v->n && v->eog[id];
}

static sset_t *level(grammar_state_t *st, size_t d, mctx_t *c)
{
    if (d >= st->n_lvl) {
        size_t n = st->n_lvl ? st->n_lvl : 16;
        while (n <= d) n *= 2;
        sset_t *l = realloc(st->lvl, n * sizeof *l);
        if (!l) {
            c->oom = 1;
            return NULL;
        }
        memset(l + st->n_lvl, 0, (n - st->n_lvl) * sizeof *l);
        st->lvl = l;
        st->n_lvl = n;
    }
    return &st->lvl[d];
}

static void set_hash(const arena_t *a, sset_t *s)
{
    uint64_t h = 0;
    for (size_t i = 0; i < s->n; i++) h += a->v[s->tops[i]].hash;
    h = mix64(h ^ ((uint64_t)s->cp << 16 | (uint64_t)s->need << 8 | (uint64_t)s->len << 4 |
                   (uint64_t)s->accept));
    s->hash = h;
}

/* out = in advanced by byte b, through the memo: a set reached again (whatever the path) is
 * advanced once per walk. Nodes made during a walk stay until its end (memo entries point at
 * them). Returns 1 when alive. */
static int step_memo(grammar_state_t *st, mctx_t *c, const sset_t *in, unsigned b, sset_t *out)
{
    uint64_t key = mix64(in->hash + 0x9e3779b97f4a7c15ull * (b + 1));
    memo_t *m = &st->memo[key & (MEMO_SLOTS - 1)];
    if (m->gen == st->memo_gen && m->key == key) {
        if (grow((void **)&out->tops, &out->cap, (size_t)m->n + 1, sizeof *out->tops)) {
            c->oom = 1;
            return 0;
        }
        if (m->n) memcpy(out->tops, st->pool + m->off, (size_t)m->n * sizeof *out->tops);
        out->n = (size_t)m->n;
        out->accept = m->accept;
        out->cp = m->cp;
        out->need = m->need;
        out->len = m->len;
        out->hash = m->out_hash;
        return m->alive;
    }
    int alive = step_byte(c, in, b, out);
    if (c->oom) return 0;
    if (!alive) out->n = 0;
    set_hash(c->ar, out);
    if (grow((void **)&st->pool, &st->pool_cap, st->pool_n + out->n + 1, sizeof *st->pool)) {
        c->oom = 1;
        return 0;
    }
    if (out->n) memcpy(st->pool + st->pool_n, out->tops, out->n * sizeof *out->tops);
    *m = (memo_t){key, out->hash, st->memo_gen, out->cp, (int32_t)st->pool_n, (int32_t)out->n,
                  (int8_t)alive, (int8_t)out->accept, (int8_t)out->need, (int8_t)out->len};
    st->pool_n += out->n;
    return alive;
}

static void walk(grammar_state_t *st, const grammar_vocab_t *v, mctx_t *c, int32_t node,
                 size_t depth, uint32_t *mask)
{
    if (!level(st, depth + 1, c)) return;
    const int32_t end = node + v->d_size[node];
    for (int32_t ch = node + 1; ch < end; ch += v->d_size[ch]) {
        sset_t *out = &st->lvl[depth + 1];
        const sset_t *in = &st->lvl[depth];
        if (step_memo(st, c, in, v->d_byte[ch], out)) {
            for (int32_t t = v->d_tok[ch]; t >= 0; t = v->tok_next[t])
                mask[t >> 5] |= 1u << (t & 31);
            if (v->d_size[ch] > 1) walk(st, v, c, ch, depth + 1, mask);
        }
        if (c->oom) return;
    }
}

/* 1 when bytes[0..n) keep the state s alive (a scratch pair of sets is used). */
static int accepts_bytes(grammar_state_t *st, mctx_t *c, const char *bytes, size_t n)
{
    if (n == 0) return 0;
    size_t mark = st->ar.n;
    const sset_t *in = &st->cur;
    int k = 0, ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        sset_t *out = &st->tmp[k];
        ok = step_byte(c, in, (unsigned char)bytes[i], out);
        in = out;
        k ^= 1;
    }
    st->ar.n = mark;
    return ok;
}

static int cmp_u64_idx(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0;
}

/* Canonical key of the current state into st->key; returns its length or -1. */
static long state_key(grammar_state_t *st, int at_start, uint64_t *hash)
{
    size_t n = st->cur.n;
    uint64_t *order = malloc((n ? n : 1) * 2 * sizeof *order);
    if (!order) return -1;
    for (size_t i = 0; i < n; i++) {
        order[2 * i] = st->ar.v[st->cur.tops[i]].hash;
        order[2 * i + 1] = (uint64_t)st->cur.tops[i];
    }
    qsort(order, n, 2 * sizeof *order, cmp_u64_idx);
    size_t len = 6;
    for (size_t i = 0; i < n; i++)
        for (int32_t x = st->cur.tops[i]; x >= 0; x = st->ar.v[x].parent) len++;
    len += n;
    if (grow((void **)&st->key, &st->key_cap, len, sizeof *st->key)) {
        free(order);
        return -1;
    }
    int32_t *k = st->key;
    size_t w = 0;
    k[w++] = at_start;
    k[w++] = st->cur.accept;
    k[w++] = (int32_t)st->cur.cp;
    k[w++] = st->cur.need;
    k[w++] = st->cur.len;
    k[w++] = (int32_t)n;
    uint64_t h = 0x12345;
    for (size_t i = 0; i < n; i++) {
        size_t lenpos = w++;
        int32_t d = 0;
        for (int32_t x = (int32_t)order[2 * i + 1]; x >= 0; x = st->ar.v[x].parent) {
            k[w++] = st->ar.v[x].elem;
            d++;
        }
        k[lenpos] = d;
        h = mix64(h ^ order[2 * i]);
    }
    for (size_t i = 0; i < 6; i++) h = mix64(h ^ (uint64_t)(uint32_t)k[i]);
    free(order);
    *hash = h;
    return (long)w;
}

static centry_t *cache_find(grammar_t *g, uint64_t h, const int32_t *key, size_t len)
{
    if (!g->cache_cap) return NULL;
    for (size_t i = h & (g->cache_cap - 1);; i = (i + 1) & (g->cache_cap - 1)) {
        centry_t *e = &g->cache[i];
        if (!e->key) return NULL;
        if (e->hash == h && e->key_len == len && memcmp(e->key, key, len * sizeof *key) == 0)
            return e;
    }
}

static void cache_put(grammar_t *g, uint64_t h, const int32_t *key, size_t len,
                      const uint32_t *mask, size_t words)
{
    size_t bytes = len * sizeof *key + words * sizeof *mask + sizeof(centry_t) * 2;
    if (g->cache_bytes + bytes > GRAMMAR_MASK_CACHE_BYTES) cache_clear(g);
    if ((g->cache_n + 1) * 2 > g->cache_cap) {
        size_t cap = g->cache_cap ? g->cache_cap * 2 : 64;
        centry_t *nc = calloc(cap, sizeof *nc);
        if (!nc) return;
        for (size_t i = 0; i < g->cache_cap; i++) {
            centry_t *e = &g->cache[i];
            if (!e->key) continue;
            size_t j = e->hash & (cap - 1);
            while (nc[j].key) j = (j + 1) & (cap - 1);
            nc[j] = *e;
        }
        free(g->cache);
        g->cache = nc;
        g->cache_cap = cap;
    }
    int32_t *k = malloc(len * sizeof *k);
    uint32_t *m = malloc(words * sizeof *m);
    if (!k || !m) {
        free(k);
        free(m);
        return;
    }
    memcpy(k, key, len * sizeof *k);
    memcpy(m, mask, words * sizeof *m);
    size_t j = h & (g->cache_cap - 1);
    while (g->cache[j].key) j = (j + 1) & (g->cache_cap - 1);
    g->cache[j] = (centry_t){h, len, k, m};
    g->cache_n++;
    g->cache_bytes += bytes;
}

int grammar_state_mask(grammar_state_t *st, const grammar_vocab_t *v, int at_start,
                       uint32_t *mask)
{
    grammar_t *g = st->g;
    size_t words = GRAMMAR_MASK_WORDS(v->n);
    at_start = at_start && v->strip && v->n_space > 0;
    if (g->cache_vocab != v->id) {
        cache_clear(g);
        g->cache_vocab = v->id;
    }
    uint64_t h = 0;
    long klen = state_key(st, at_start, &h);
    if (klen < 0) return -1;
    centry_t *hit = cache_find(g, h, st->key, (size_t)klen);
    if (hit) {
        g->hits++;
        memcpy(mask, hit->mask, words * sizeof *mask);
        return 0;
    }
    g->misses++;
    memset(mask, 0, words * sizeof *mask);
    mctx_t c = {g, &st->ar, 0};
    sset_t *l0 = level(st, 0, &c);
    if (!l0) return -1;
    sset_copy(&c, l0, &st->cur);
    if (c.oom) return -1;
    if (!st->memo && !(st->memo = calloc(MEMO_SLOTS, sizeof *st->memo))) return -1;
    if (++st->memo_gen == 0) { /* wrapped: forget every entry */
        memset(st->memo, 0, MEMO_SLOTS * sizeof *st->memo);
        st->memo_gen = 1;
    }
    st->pool_n = 0;
    set_hash(&st->ar, l0);
    size_t mark = st->ar.n;
    walk(st, v, &c, 0, 0, mask);
    st->ar.n = mark;
    if (c.oom) return -1;
    if (at_start) {
        for (int i = 0; i < v->n_space; i++) {
            int32_t t = v->space_ids[i];
            size_t n;
            const char *p = grammar_vocab_piece(v, t, 1, &n);
            uint32_t bit = 1u << (t & 31);
            mask[t >> 5] &= ~bit;
            if (accepts_bytes(st, &c, p, n)) mask[t >> 5] |= bit;
            if (c.oom) return -1;
        }
    }
    int can_end = grammar_state_can_end(st);
    for (int i = 0; i < v->n; i++)
        if (v->eog[i]) {
            if (can_end) mask[i >> 5] |= 1u << (i & 31);
            else mask[i >> 5] &= ~(1u << (i & 31));
        }
    cache_put(g, h, st->key, (size_t)klen, mask, words);
    return 0;
}
