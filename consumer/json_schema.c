/* consumer/json_schema.c: JSON Schema to EBNF grammar (contract: json_schema.h).
 *
 * Every schema node becomes a rule r<N>; $ref targets are compiled once (memoised by their JSON
 * pointer), so recursive schemas give recursive rules. Objects: declared properties in the
 * schema's order, each required one present, optional ones omissible, as a chain of rules
 * F_i (no member written yet) / N_i (a comma is needed) over the properties i.. ; additional
 * members (additionalProperties true or a schema) come after the declared ones with keys that
 * differ from every declared key (a trie of the declared keys, complemented). Integer ranges
 * are decimal digit-range alternations (exact); unbounded numbers have at most
 * JSON_SCHEMA_MAX_DIGITS digits. Patterns are a regex subset translated into the grammar over
 * the string's JSON text (generated strings never hold a quote, backslash or control
 * character from a pattern's class or dot). */
#include "consumer/json_schema.h"

#include "engine/grammar.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sb_t;

static void sb_addn(sb_t *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_add(sb_t *b, const char *s) { sb_addn(b, s, strlen(s)); }

static void sb_addf(sb_t *b, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof buf) {
        sb_addn(b, buf, (size_t)k);
        return;
    }
    char *big = malloc((size_t)k + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    sb_addn(b, big, (size_t)k);
    free(big);
}

typedef struct {
    char *ptr;
    int rule;
} ref_t;

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

typedef struct {
    const json_t *doc;
    sb_t out;
    int n_rules;
    ref_t *refs;
    size_t n_refs, cap_refs;
    char *err;
    size_t errlen;
    int failed;
    int depth;
} cx_t;

static void fail(cx_t *c, const char *path, const char *fmt, ...)
{
    if (c->failed) return;
    c->failed = 1;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->err && c->errlen) snprintf(c->err, c->errlen, "%s at %s", msg, path[0] ? path : "#");
}

/* Appends a code point as a grammar escape (usable in literals and classes). */
static void put_cp(sb_t *b, uint32_t cp)
{
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
        cp == ' ' || cp == '_' || cp == ',' || cp == ':' || cp == '.' || cp == '{' ||
        cp == '}' || cp == '(' || cp == ')' || cp == '+' || cp == '=' || cp == '@' || cp == '#')
        sb_addn(b, (const char *)&(char){(char)cp}, 1);
    else if (cp <= 0xFFFF)
        sb_addf(b, "\\u%04X", (unsigned)cp);
    else
        sb_addf(b, "\\U%08X", (unsigned)cp);
}

/* Decodes the next code point of valid UTF-8 s (jansson strings are valid). */
static uint32_t next_cp(const char **s)
{
    const unsigned char *p = (const unsigned char *)*s;
    uint32_t c = p[0];
    int n = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    if (n) c &= n == 1 ? 0x1F : n == 2 ? 0x0F : 0x07;
    for (int k = 1; k <= n && p[k]; k++) c = c << 6 | (p[k] & 0x3F);
    *s += 1 + n;
    return c;
}

/* A grammar literal matching the bytes of JSON text t (as json_dumps writes it). */
static void put_literal(sb_t *b, const char *t)
{
    sb_add(b, "\"");
    while (*t) put_cp(b, next_cp(&t));
    sb_add(b, "\"");
}

static void put_json_literal(cx_t *c, sb_t *b, const json_t *v)
{
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!t) {
        b->oom = 1;
        return;
    }
    (void)c;
    put_literal(b, t);
    free(t);
}

static const char *COMMON =
    "ws ::= ( \" \" | \"\\n\" \" \"{0,4} )?\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,14} )\n"
    "number ::= integer ( \".\" [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,2} )?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? "
    "\"}\"\n"
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "hex ::= [0-9a-fA-F]\n"
    "date ::= [0-9]{4} \"-\" ( ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | \"1\" [0-9] | "
    "\"2\" [0-8] ) | ( \"0\" [13-9] | \"1\" [0-2] ) \"-\" ( \"29\" | \"30\" ) | ( \"0\" [13578] | "
    "\"1\" [02] ) \"-31\" )\n"
    "time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
    "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"
    "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n";

static int gen(cx_t *c, const json_t *s, const char *path);

static int new_rule(cx_t *c) { return c->n_rules++; }

static void emit_rule(cx_t *c, int r, sb_t *body)
{
    if (body->oom) c->out.oom = 1;
    sb_addf(&c->out, "r%d ::= ", r);
    if (body->s) sb_add(&c->out, body->s);
    sb_add(&c->out, "\n");
    free(body->s);
    memset(body, 0, sizeof *body);
}

static int is_annotation(const char *k)
{
    static const char *const ann[] = {"title", "description", "$schema", "$id", "$comment",
                                      "examples", "default", "deprecated", "readOnly",
                                      "writeOnly", "$defs", "definitions", NULL};
    for (int i = 0; ann[i]; i++)
        if (strcmp(k, ann[i]) == 0) return 1;
    return 0;
}

static int is_known(const char *k)
{
    static const char *const kw[] = {"type", "properties", "required", "additionalProperties",
                                     "enum", "const", "items", "minItems", "maxItems", "anyOf",
                                     "allOf", "$ref", "pattern", "format", "minimum", "maximum",
                                     "exclusiveMinimum", "exclusiveMaximum", "minLength",
                                     "maxLength", "propertyNames", "minProperties",
                                     "maxProperties", NULL};
    for (int i = 0; kw[i]; i++)
        if (strcmp(k, kw[i]) == 0) return 1;
    return is_annotation(k);
}

/* ---- integers: exact decimal ranges --------------------------------------------------- */

static const int64_t LIMIT = 999999999999999; /* JSON_SCHEMA_MAX_DIGITS nines */

/* Alternation for decimal strings of equal length between a and b (a <= b). */
static void same_len(sb_t *b, const char *a, const char *z, size_t L)
{
    if (L == 1) {
        if (a[0] == z[0])
            sb_addf(b, "\"%c\"", a[0]);
        else
            sb_addf(b, "[%c-%c]", a[0], z[0]);
        return;
    }
    if (a[0] == z[0]) {
        sb_addf(b, "\"%c\" ", a[0]);
        same_len(b, a + 1, z + 1, L - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', L - 1);
    memset(zeros, '0', L - 1);
    sb_addf(b, "( \"%c\" ( ", a[0]);
    same_len(b, a + 1, nines, L - 1);
    sb_add(b, " )");
    if (a[0] + 1 <= z[0] - 1) {
        if (a[0] + 1 == z[0] - 1)
            sb_addf(b, " | \"%c\" [0-9]{%zu}", a[0] + 1, L - 1);
        else
            sb_addf(b, " | [%c-%c] [0-9]{%zu}", a[0] + 1, z[0] - 1, L - 1);
    }
    sb_addf(b, " | \"%c\" ( ", z[0]);
    same_len(b, zeros, z + 1, L - 1);
    sb_add(b, " ) )");
}

/* ( alternatives ) for the decimal forms of lo..hi, 0 <= lo <= hi. */
static void uint_range(sb_t *b, int64_t lo, int64_t hi)
{
    char sl[24], sh[24];
    int ll = snprintf(sl, sizeof sl, "%lld", (long long)lo);
    int lh = snprintf(sh, sizeof sh, "%lld", (long long)hi);
    sb_add(b, "( ");
    int64_t p = 1;
    for (int i = 1; i < ll; i++) p *= 10;
    for (int L = ll; L <= lh; L++, p *= 10) {
        int64_t a = L == ll ? lo : p;
        int64_t top = p * 10 - 1;
        int64_t z = hi < top ? hi : top;
        char ta[24], tz[24];
        snprintf(ta, sizeof ta, "%lld", (long long)a);
        snprintf(tz, sizeof tz, "%lld", (long long)z);
        if (L > ll) sb_add(b, " | ");
        same_len(b, ta, tz, (size_t)L);
    }
    sb_add(b, " )");
}

/* Integer literal grammar for lo..hi (lo <= hi, both within +-LIMIT). */
static void int_range(sb_t *b, int64_t lo, int64_t hi)
{
    int both = lo < 0 && hi >= 0;
    if (both) sb_add(b, "( ");
    if (lo < 0) {
        int64_t mlo = hi < 0 ? -hi : 1;
        sb_add(b, "\"-\" ");
        uint_range(b, mlo, -lo);
    }
    if (both) sb_add(b, " | ");
    if (hi >= 0) uint_range(b, lo > 0 ? lo : 0, hi);
    if (both) sb_add(b, " )");
}

/* Reads minimum/maximum/exclusive* as an inclusive integer range. 0, or -1 after fail(). */
static int int_bounds(cx_t *c, const json_t *s, const char *path, int64_t *lo, int64_t *hi,
                      int *has_lo, int *has_hi)
{
    *lo = -LIMIT;
    *hi = LIMIT;
    *has_lo = *has_hi = 0;
    const char *keys[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        const json_t *v = json_object_get(s, keys[i]);
        if (!v) continue;
        if (!json_is_number(v)) {
            fail(c, path, "%s must be a number (the draft-4 boolean form is not supported)",
                 keys[i]);
            return -1;
        }
        double d = json_number_value(v);
        if (!(fabs(d) <= (double)LIMIT)) {
            fail(c, path, "%s %g is beyond the enforced range +-%lld", keys[i], d,
                 (long long)LIMIT);
            return -1;
        }
        int64_t x;
        if (i == 0) x = (int64_t)ceil(d);
        else if (i == 1) x = (int64_t)floor(d) + 1;
        else if (i == 2) x = (int64_t)floor(d);
        else x = (int64_t)ceil(d) - 1;
        if (i < 2) {
            *lo = *has_lo && *lo > x ? *lo : x;
            *has_lo = 1;
        } else {
            *hi = *has_hi && *hi < x ? *hi : x;
            *has_hi = 1;
        }
    }
    if (*lo > *hi) {
        fail(c, path, "no integer lies between the minimum and the maximum");
        return -1;
    }
    return 0;
}

/* ---- regular expressions (pattern) ---------------------------------------------------- */

typedef struct {
    const char *s;
    size_t i, n;
    cx_t *c;
    const char *path;
} rx_t;

typedef struct {
    uint32_t *r;
    size_t n, cap;
} ranges_t;

static void rng_add(rx_t *x, ranges_t *r, uint32_t lo, uint32_t hi)
{
    if (r->n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        uint32_t *p = realloc(r->r, cap * 2 * sizeof *p);
        if (!p) {
            x->c->out.oom = 1;
            return;
        }
        r->r = p;
        r->cap = cap;
    }
    r->r[2 * r->n] = lo;
    r->r[2 * r->n + 1] = hi;
    r->n++;
}

static void rx_shorthand(rx_t *x, ranges_t *r, char k)
{
    if (k == 'd') {
        rng_add(x, r, '0', '9');
    } else if (k == 'w') {
        rng_add(x, r, 'a', 'z');
        rng_add(x, r, 'A', 'Z');
        rng_add(x, r, '0', '9');
        rng_add(x, r, '_', '_');
    } else { /* s: only the space survives JSON-safety */
        rng_add(x, r, ' ', ' ');
    }
}

/* Renders a class over code points with the JSON-unsafe ones (controls, quote, backslash)
 * removed: as [^ ... unsafe] when negated. */
static void render_class(rx_t *x, sb_t *b, ranges_t *r, int neg)
{
    if (neg) {
        sb_add(b, "[^");
        for (size_t i = 0; i < r->n; i++) {
            put_cp(b, r->r[2 * i]);
            if (r->r[2 * i + 1] != r->r[2 * i]) {
                sb_add(b, "-");
                put_cp(b, r->r[2 * i + 1]);
            }
        }
        sb_add(b, "\\x00-\\x1f\\\"\\\\]");
        return;
    }
    /* subtract [0,0x1f], 0x22, 0x5c */
    size_t kept = 0;
    sb_t cls = {0};
    for (size_t i = 0; i < r->n; i++) {
        uint32_t lo = r->r[2 * i], hi = r->r[2 * i + 1];
        const uint32_t cut[3][2] = {{0, 0x1f}, {0x22, 0x22}, {0x5c, 0x5c}};
        uint32_t segs[8][2];
        int ns = 1;
        segs[0][0] = lo;
        segs[0][1] = hi;
        for (int k = 0; k < 3; k++) {
            uint32_t out[8][2];
            int no = 0;
            for (int j = 0; j < ns; j++) {
                uint32_t a = segs[j][0], z = segs[j][1];
                if (z < cut[k][0] || a > cut[k][1]) {
                    out[no][0] = a;
                    out[no++][1] = z;
                    continue;
                }
                if (a < cut[k][0]) {
                    out[no][0] = a;
                    out[no++][1] = cut[k][0] - 1;
                }
                if (z > cut[k][1]) {
                    out[no][0] = cut[k][1] + 1;
                    out[no++][1] = z;
                }
            }
            memcpy(segs, out, sizeof out);
            ns = no;
        }
        for (int j = 0; j < ns; j++) {
            put_cp(&cls, segs[j][0]);
            if (segs[j][1] != segs[j][0]) {
                sb_add(&cls, "-");
                put_cp(&cls, segs[j][1]);
            }
            kept++;
        }
    }
    if (!kept) {
        fail(x->c, x->path, "pattern has a character class with no character a JSON string "
                            "can hold unescaped");
    } else {
        sb_add(b, "[");
        sb_add(b, cls.s);
        sb_add(b, "]");
    }
    if (cls.oom) b->oom = 1;
    free(cls.s);
}

/* A literal code point of the decoded string, as its JSON text. */
static void rx_lit(sb_t *b, uint32_t cp)
{
    if (cp == '"') sb_add(b, "\"\\\\\\\"\"");
    else if (cp == '\\') sb_add(b, "\"\\\\\\\\\"");
    else if (cp == '\n') sb_add(b, "\"\\\\n\"");
    else if (cp == '\t') sb_add(b, "\"\\\\t\"");
    else if (cp == '\r') sb_add(b, "\"\\\\r\"");
    else if (cp < 0x20) sb_addf(b, "\"\\\\u%04x\"", (unsigned)cp);
    else {
        sb_add(b, "\"");
        put_cp(b, cp);
        sb_add(b, "\"");
    }
}

static void rx_alt(rx_t *x, sb_t *b);

static int rx_escape_char(char k, uint32_t *cp)
{
    const char *meta = ".^$|?*+()[]{}\\/-\"'";
    if (strchr(meta, k)) {
        *cp = (uint32_t)k;
        return 0;
    }
    if (k == 'n') *cp = '\n';
    else if (k == 't') *cp = '\t';
    else if (k == 'r') *cp = '\r';
    else return -1;
    return 0;
}

static void rx_class(rx_t *x, sb_t *b)
{
    x->i++; /* [ */
    int neg = 0;
    ranges_t r = {0};
    if (x->i < x->n && x->s[x->i] == '^') {
        neg = 1;
        x->i++;
    }
    int first = 1;
    for (;;) {
        if (x->i >= x->n) {
            fail(x->c, x->path, "pattern: character class not closed");
            goto out;
        }
        char ch = x->s[x->i];
        if (ch == ']' && !first) {
            x->i++;
            break;
        }
        first = 0;
        uint32_t lo;
        if (ch == '\\') {
            if (x->i + 1 >= x->n) {
                fail(x->c, x->path, "pattern: unfinished escape");
                goto out;
            }
            char k = x->s[x->i + 1];
            x->i += 2;
            if (k == 'd' || k == 'w' || k == 's') {
                rx_shorthand(x, &r, k);
                continue;
            }
            if (rx_escape_char(k, &lo)) {
                fail(x->c, x->path, "pattern: escape \\%c is not supported", k);
                goto out;
            }
        } else {
            const char *p = x->s + x->i;
            lo = next_cp(&p);
            x->i = (size_t)(p - x->s);
        }
        uint32_t hi = lo;
        if (x->i + 1 < x->n && x->s[x->i] == '-' && x->s[x->i + 1] != ']') {
            x->i++;
            if (x->s[x->i] == '\\') {
                if (x->i + 1 >= x->n || rx_escape_char(x->s[x->i + 1], &hi)) {
                    fail(x->c, x->path, "pattern: bad range end in a class");
                    goto out;
                }
                x->i += 2;
            } else {
                const char *p = x->s + x->i;
                hi = next_cp(&p);
                x->i = (size_t)(p - x->s);
            }
            if (hi < lo) {
                fail(x->c, x->path, "pattern: backwards range in a class");
                goto out;
            }
        }
        rng_add(x, &r, lo, hi);
    }
    render_class(x, b, &r, neg);
out:
    free(r.r);
}

static void rx_atom(rx_t *x, sb_t *b)
{
    char ch = x->s[x->i];
    if (ch == '(') {
        x->i++;
        if (x->i + 1 < x->n && x->s[x->i] == '?') {
            if (x->s[x->i + 1] != ':') {
                fail(x->c, x->path, "pattern: only (?:...) groups are supported");
                return;
            }
            x->i += 2;
        }
        sb_add(b, "( ");
        rx_alt(x, b);
        sb_add(b, " )");
        if (x->i >= x->n || x->s[x->i] != ')') {
            fail(x->c, x->path, "pattern: ( not closed");
            return;
        }
        x->i++;
    } else if (ch == '[') {
        rx_class(x, b);
    } else if (ch == '.') {
        x->i++;
        sb_add(b, "[^\\x00-\\x1f\\\"\\\\]");
    } else if (ch == '\\') {
        if (x->i + 1 >= x->n) {
            fail(x->c, x->path, "pattern: unfinished escape");
            return;
        }
        char k = x->s[x->i + 1];
        x->i += 2;
        uint32_t cp;
        if (k == 'd' || k == 'w' || k == 's' || k == 'D' || k == 'W' || k == 'S') {
            ranges_t r = {0};
            rx_shorthand(x, &r, (char)(k | 0x20));
            render_class(x, b, &r, k >= 'A' && k <= 'Z');
            free(r.r);
        } else if (!rx_escape_char(k, &cp)) {
            rx_lit(b, cp);
        } else {
            fail(x->c, x->path, "pattern: escape \\%c is not supported", k);
        }
    } else if (ch == '^' || ch == '$') {
        fail(x->c, x->path, "pattern: ^ and $ are supported only at the very start and end");
    } else if (strchr("*+?{}", ch)) {
        fail(x->c, x->path, "pattern: quantifier '%c' with nothing to repeat", ch);
    } else {
        const char *p = x->s + x->i;
        uint32_t cp = next_cp(&p);
        x->i = (size_t)(p - x->s);
        rx_lit(b, cp);
    }
}

static void rx_seq(rx_t *x, sb_t *b)
{
    int any = 0;
    while (x->i < x->n && !x->c->failed && x->s[x->i] != '|' && x->s[x->i] != ')') {
        sb_t atom = {0};
        rx_atom(x, &atom);
        if (x->c->failed) {
            free(atom.s);
            return;
        }
        if (any) sb_add(b, " ");
        any = 1;
        sb_add(b, "( ");
        if (atom.s) sb_add(b, atom.s);
        sb_add(b, " )");
        if (atom.oom) b->oom = 1;
        free(atom.s);
        if (x->i < x->n && strchr("*+?{", x->s[x->i])) {
            char q = x->s[x->i];
            if (q == '{') {
                size_t j = x->i + 1;
                unsigned long m = 0, mx = 0;
                int has_max = 1, digits = 0;
                while (j < x->n && x->s[j] >= '0' && x->s[j] <= '9' && digits < 6) {
                    m = m * 10 + (unsigned long)(x->s[j++] - '0');
                    digits++;
                }
                mx = m;
                if (digits && j < x->n && x->s[j] == ',') {
                    j++;
                    if (j < x->n && x->s[j] == '}') {
                        has_max = 0;
                    } else {
                        int d2 = 0;
                        mx = 0;
                        while (j < x->n && x->s[j] >= '0' && x->s[j] <= '9' && d2 < 6) {
                            mx = mx * 10 + (unsigned long)(x->s[j++] - '0');
                            d2++;
                        }
                        if (!d2) digits = 0;
                    }
                }
                if (!digits || j >= x->n || x->s[j] != '}' || (has_max && mx < m) ||
                    m > 1000 || mx > 1000) {
                    fail(x->c, x->path, "pattern: bad {m,n} quantifier (bounds up to 1000)");
                    return;
                }
                x->i = j + 1;
                if (has_max) sb_addf(b, "{%lu,%lu}", m, mx);
                else sb_addf(b, "{%lu,}", m);
            } else {
                sb_addn(b, &q, 1);
                x->i++;
            }
            if (x->i < x->n && x->s[x->i] == '?') x->i++; /* lazy: same language */
            if (x->i < x->n && strchr("*+{", x->s[x->i])) {
                fail(x->c, x->path, "pattern: stacked or possessive quantifiers are not "
                                    "supported");
                return;
            }
        }
    }
    if (!any) sb_add(b, "\"\"");
}

static void rx_alt(rx_t *x, sb_t *b)
{
    rx_seq(x, b);
    while (!x->c->failed && x->i < x->n && x->s[x->i] == '|') {
        x->i++;
        sb_add(b, " | ");
        rx_seq(x, b);
    }
}

static void gen_pattern(cx_t *c, sb_t *b, const char *pat, const char *path)
{
    size_t n = strlen(pat);
    int a0 = n > 0 && pat[0] == '^';
    int a1 = 0;
    if (n > (size_t)a0 && pat[n - 1] == '$') {
        size_t bs = 0; /* an escaped \$ is a literal */
        for (size_t k = n - 1; k > 0 && pat[k - 1] == '\\'; k--) bs++;
        a1 = bs % 2 == 0;
    }
    rx_t x = {pat + a0, 0, n - (size_t)a0 - (size_t)a1, c, path};
    if (a0 || a1) { /* a top-level | would bind looser than the anchors */
        int depth = 0, in_cls = 0;
        for (size_t k = 0; k < x.n; k++) {
            char ch = x.s[k];
            if (ch == '\\') k++;
            else if (in_cls) in_cls = ch != ']';
            else if (ch == '[') in_cls = 1;
            else if (ch == '(') depth++;
            else if (ch == ')') depth--;
            else if (ch == '|' && depth == 0) {
                fail(c, path, "pattern: an anchored top-level | needs a group, e.g. ^(a|b)$");
                return;
            }
        }
    }
    sb_add(b, "\"\\\"\" ");
    if (!a0) sb_add(b, "char* ");
    sb_add(b, "( ");
    rx_alt(&x, b);
    if (!c->failed && x.i < x.n) fail(c, path, "pattern: unbalanced )");
    sb_add(b, " ) ");
    if (!a1) sb_add(b, "char* ");
    sb_add(b, "\"\\\"\"");
}

/* ---- types ----------------------------------------------------------------------------- */

static int get_count(cx_t *c, const json_t *s, const char *key, const char *path, long *out)
{
    const json_t *v = json_object_get(s, key);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000) {
        fail(c, path, "%s must be an integer in 0..1000", key);
        return -1;
    }
    *out = (long)json_integer_value(v);
    return 1;
}

static void gen_string(cx_t *c, sb_t *b, const json_t *s, const char *path)
{
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    long mn = 0, mx = -1;
    int hmn = get_count(c, s, "minLength", path, &mn), hmx = get_count(c, s, "maxLength", path,
                                                                         &mx);
    if (hmn < 0 || hmx < 0) return;
    if ((pat || fmt) && (hmn || hmx)) {
        fail(c, path, "minLength/maxLength together with pattern or format is not supported");
        return;
    }
    if (pat && fmt) {
        fail(c, path, "pattern together with format is not supported");
        return;
    }
    if (pat) {
        if (!json_is_string(pat)) {
            fail(c, path, "pattern must be a string");
            return;
        }
        gen_pattern(c, b, json_string_value(pat), path);
        return;
    }
    if (fmt) {
        const char *f = json_is_string(fmt) ? json_string_value(fmt) : "";
        const char *rule = strcmp(f, "date") == 0        ? "date"
                           : strcmp(f, "time") == 0      ? "time"
                           : strcmp(f, "date-time") == 0 ? "date \"T\" time"
                           : strcmp(f, "uuid") == 0      ? "uuid"
                                                         : NULL;
        if (!rule) {
            fail(c, path, "unsupported string format '%s' (date, time, date-time, uuid)", f);
            return;
        }
        sb_addf(b, "\"\\\"\" %s \"\\\"\"", rule);
        return;
    }
    if (hmx && mx < mn) {
        fail(c, path, "maxLength is below minLength");
        return;
    }
    if (!hmn && !hmx) sb_add(b, "string");
    else if (hmx) sb_addf(b, "\"\\\"\" char{%ld,%ld} \"\\\"\"", mn, mx);
    else sb_addf(b, "\"\\\"\" char{%ld,} \"\\\"\"", mn);
}

static void gen_integer(cx_t *c, sb_t *b, const json_t *s, const char *path)
{
    int64_t lo, hi;
    int hl, hh;
    if (int_bounds(c, s, path, &lo, &hi, &hl, &hh)) return;
    if (!hl && !hh) {
        sb_add(b, "integer");
        return;
    }
    int_range(b, lo, hi);
}

static void gen_number(cx_t *c, sb_t *b, const json_t *s, const char *path)
{
    const json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    if (json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum")) {
        fail(c, path, "exclusiveMinimum/exclusiveMaximum are supported on integer only");
        return;
    }
    if (!mn && !mx) {
        sb_add(b, "number");
        return;
    }
    double dlo = mn && json_is_number(mn) ? json_number_value(mn) : -1;
    double dhi = mx && json_is_number(mx) ? json_number_value(mx) : 0;
    if (!mn || !json_is_number(mn) || dlo < 0 || dlo != floor(dlo) || dlo > (double)LIMIT ||
        (mx && (!json_is_number(mx) || dhi != floor(dhi) || dhi > (double)LIMIT || dhi < dlo))) {
        fail(c, path, "number ranges are supported with an integral minimum >= 0 and an "
                      "optional integral maximum >= it (use integer for other ranges)");
        return;
    }
    int64_t lo = (int64_t)dlo, hi = mx ? (int64_t)dhi : LIMIT;
    const char *frac = "( \".\" [0-9]{1,15} )?";
    if (!mx) {
        sb_add(b, "( ");
        uint_range(b, lo, hi);
        sb_addf(b, " %s )", frac);
        return;
    }
    sb_add(b, "( ");
    if (hi > lo) {
        uint_range(b, lo, hi - 1);
        sb_addf(b, " %s | ", frac);
    }
    sb_addf(b, "\"%lld\" ( \".\" \"0\"{1,15} )? )", (long long)hi);
}

static void gen_array(cx_t *c, sb_t *b, const json_t *s, const char *path)
{
    long mn = 0, mx = -1;
    int hmn = get_count(c, s, "minItems", path, &mn), hmx = get_count(c, s, "maxItems", path,
                                                                       &mx);
    if (hmn < 0 || hmx < 0) return;
    if (hmx && mx < mn) {
        fail(c, path, "maxItems is below minItems");
        return;
    }
    const json_t *items = json_object_get(s, "items");
    char item[32] = "value";
    if (items) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/items", path);
        int r = gen(c, items, sub);
        if (r < 0) return;
        snprintf(item, sizeof item, "r%d", r);
    }
    if (hmx && mx == 0) {
        sb_add(b, "\"[\" ws \"]\"");
        return;
    }
    sb_addf(b, "\"[\" ws %s%s ws ( \",\" ws %s ws )", mn == 0 ? "( " : "", item, item);
    long lo = mn > 0 ? mn - 1 : 0;
    if (hmx) sb_addf(b, "{%ld,%ld}", lo, mx - 1);
    else sb_addf(b, "{%ld,}", lo);
    sb_addf(b, "%s \"]\"", mn == 0 ? " )?" : "");
}

/* Keys other than the declared ones: a trie of the declared keys' code points, complemented. */
typedef struct knode {
    uint32_t cp;
    int terminal;
    struct knode *kids, *next;
} knode_t;

static void knode_free(knode_t *k)
{
    while (k) {
        knode_t *n = k->next;
        knode_free(k->kids);
        free(k);
        k = n;
    }
}

static int knode_rule(cx_t *c, const knode_t *node)
{
    int r = new_rule(c);
    sb_t b = {0};
    sb_add(&b, node->terminal ? "" : "\"\" | ");
    sb_add(&b, "[^");
    for (const knode_t *k = node->kids; k; k = k->next) put_cp(&b, k->cp);
    sb_add(&b, "\\\"\\\\\\x00-\\x1f] char* | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" hex{4} ) char*");
    for (const knode_t *k = node->kids; k; k = k->next) {
        int kr = knode_rule(c, k);
        sb_add(&b, " | \"");
        put_cp(&b, k->cp);
        sb_addf(&b, "\" r%d", kr);
    }
    emit_rule(c, r, &b);
    return r;
}

static void gen_object(cx_t *c, sb_t *b, const json_t *s, const char *path)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) {
        fail(c, path, "properties must be an object");
        return;
    }
    if (req && !json_is_array(req)) {
        fail(c, path, "required must be an array of strings");
        return;
    }
    size_t np = props ? json_object_size(props) : 0;
    const json_t *pn = json_object_get(s, "propertyNames");
    long minp = 0, maxp = -1;
    int hminp = get_count(c, s, "minProperties", path, &minp);
    int hmaxp = get_count(c, s, "maxProperties", path, &maxp);
    if (hminp < 0 || hmaxp < 0) return;
    if ((pn || hminp || hmaxp) && (np > 0 || (addl && json_is_false(addl)))) {
        fail(c, path, "propertyNames/minProperties/maxProperties are supported only on objects "
                      "without properties whose members come from additionalProperties");
        return;
    }
    if (hmaxp && maxp < minp) {
        fail(c, path, "maxProperties is below minProperties");
        return;
    }
    if ((pn || hminp || hmaxp) && !addl) addl = json_true(); /* (a singleton: no reference) */
    const char **keys = calloc(np + 1, sizeof *keys);
    int *vrule = calloc(np + 1, sizeof *vrule);
    char *isreq = calloc(np + 1, 1);
    knode_t *root = calloc(1, sizeof *root);
    if (!keys || !vrule || !isreq || !root) {
        c->out.oom = 1;
        goto out;
    }
    size_t i = 0;
    const char *k;
    json_t *v;
    if (props) {
        json_object_foreach((json_t *)props, k, v) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/properties/%s", path, k);
            keys[i] = k;
            vrule[i] = gen(c, v, sub);
            if (vrule[i] < 0) goto out;
            i++;
        }
    }
    for (size_t j = 0; req && j < json_array_size(req); j++) {
        const json_t *e = json_array_get(req, j);
        if (!json_is_string(e)) {
            fail(c, path, "required must be an array of strings");
            goto out;
        }
        size_t m = 0;
        while (m < np && strcmp(keys[m], json_string_value(e)) != 0) m++;
        if (m == np) {
            fail(c, path, "required property '%s' is not in properties", json_string_value(e));
            goto out;
        }
        isreq[m] = 1;
    }
    /* additional members */
    char addkv[64] = "";
    if (addl && !json_is_boolean(addl) && !json_is_object(addl)) {
        fail(c, path, "additionalProperties must be a boolean or a schema");
        goto out;
    }
    if (addl && !json_is_false(addl)) {
        int vr = -1;
        if (json_is_object(addl) && json_object_size(addl) > 0) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            vr = gen(c, addl, sub);
            if (vr < 0) goto out;
        }
        int keyr = -1;
        if (pn) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/propertyNames", path);
            const json_t *pt = json_is_object(pn) ? json_object_get(pn, "type") : NULL;
            if (!json_is_object(pn) || (pt && !(json_is_string(pt) &&
                                               strcmp(json_string_value(pt), "string") == 0))) {
                fail(c, sub, "propertyNames must be a string schema");
                goto out;
            }
            json_t *ps = json_deep_copy(pn);
            if (!ps || json_object_set_new(ps, "type", json_string("string"))) {
                json_decref(ps);
                c->out.oom = 1;
                goto out;
            }
            int pr = gen(c, ps, sub);
            json_decref(ps);
            if (pr < 0) goto out;
            keyr = pr;
        } else if (np > 0) {
            for (size_t j = 0; j < np; j++) {
                knode_t *node = root;
                for (const char *p = keys[j]; *p;) {
                    uint32_t cp = next_cp(&p);
                    knode_t *ch = node->kids;
                    while (ch && ch->cp != cp) ch = ch->next;
                    if (!ch) {
                        ch = calloc(1, sizeof *ch);
                        if (!ch) {
                            c->out.oom = 1;
                            goto out;
                        }
                        ch->cp = cp;
                        ch->next = node->kids;
                        node->kids = ch;
                    }
                    node = ch;
                }
                node->terminal = 1;
            }
            keyr = knode_rule(c, root);
        }
        int ar = new_rule(c);
        sb_t ab = {0};
        if (keyr >= 0 && pn) sb_addf(&ab, "r%d", keyr);
        else if (keyr >= 0) sb_addf(&ab, "\"\\\"\" r%d \"\\\"\"", keyr);
        else sb_add(&ab, "string");
        if (vr >= 0) sb_addf(&ab, " ws \":\" ws r%d ws", vr);
        else sb_add(&ab, " ws \":\" ws value ws");
        emit_rule(c, ar, &ab);
        snprintf(addkv, sizeof addkv, "r%d", ar);
    }
    /* F_i / N_i chain, built from the end */
    int F = new_rule(c), N = new_rule(c);
    sb_t fb = {0}, nb = {0};
    if (addkv[0] && (hminp || hmaxp)) {
        sb_addf(&fb, "%s%s ( \",\" ws %s )", minp == 0 ? "( " : "", addkv, addkv);
        if (hmaxp && maxp == 0) {
            free(fb.s);
            memset(&fb, 0, sizeof fb);
            sb_add(&fb, "\"\"");
        } else {
            if (hmaxp) sb_addf(&fb, "{%ld,%ld}", minp > 0 ? minp - 1 : 0, maxp - 1);
            else sb_addf(&fb, "{%ld,}", minp > 0 ? minp - 1 : 0);
            if (minp == 0) sb_add(&fb, " )?");
        }
        sb_add(&nb, "\"\"");
    } else if (addkv[0]) {
        sb_addf(&fb, "( %s ( \",\" ws %s )* )?", addkv, addkv);
        sb_addf(&nb, "( \",\" ws %s )*", addkv);
    } else {
        sb_add(&fb, "\"\"");
        sb_add(&nb, "\"\"");
    }
    emit_rule(c, F, &fb);
    emit_rule(c, N, &nb);
    for (size_t j = np; j-- > 0;) {
        int F2 = new_rule(c), N2 = new_rule(c);
        sb_t kv = {0};
        json_t *ks = json_string(keys[j]);
        char *enc = ks ? json_dumps(ks, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(ks);
        if (!enc) {
            c->out.oom = 1;
            free(kv.s);
            goto out;
        }
        put_literal(&kv, enc);
        free(enc);
        sb_addf(&kv, " ws \":\" ws r%d ws", vrule[j]);
        sb_addf(&fb, "%s r%d", kv.s ? kv.s : "", N);
        sb_addf(&nb, "\",\" ws %s r%d", kv.s ? kv.s : "", N);
        if (!isreq[j]) {
            sb_addf(&fb, " | r%d", F);
            sb_addf(&nb, " | r%d", N);
        }
        if (kv.oom) c->out.oom = 1;
        free(kv.s);
        emit_rule(c, F2, &fb);
        emit_rule(c, N2, &nb);
        F = F2;
        N = N2;
    }
    sb_addf(b, "\"{\" ws r%d \"}\"", F);
out:
    free(keys);
    free(vrule);
    free(isreq);
    knode_free(root);
}

static int type_matches(const char *t, const json_t *v)
{
    if (strcmp(t, "string") == 0) return json_is_string(v);
    if (strcmp(t, "integer") == 0)
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) ==
                                                              floor(json_real_value(v)));
    if (strcmp(t, "number") == 0) return json_is_number(v);
    if (strcmp(t, "boolean") == 0) return json_is_boolean(v);
    if (strcmp(t, "null") == 0) return json_is_null(v);
    if (strcmp(t, "object") == 0) return json_is_object(v);
    if (strcmp(t, "array") == 0) return json_is_array(v);
    return 0;
}

static void gen_type(cx_t *c, sb_t *b, const char *t, const json_t *s, const char *path)
{
    if (strcmp(t, "string") == 0) gen_string(c, b, s, path);
    else if (strcmp(t, "integer") == 0) gen_integer(c, b, s, path);
    else if (strcmp(t, "number") == 0) gen_number(c, b, s, path);
    else if (strcmp(t, "boolean") == 0) sb_add(b, "boolean");
    else if (strcmp(t, "null") == 0) sb_add(b, "null");
    else if (strcmp(t, "object") == 0) gen_object(c, b, s, path);
    else if (strcmp(t, "array") == 0) gen_array(c, b, s, path);
    else fail(c, path, "unknown type '%s'", t);
}

/* Resolves a local JSON pointer ("#", "#/$defs/a", with ~0 ~1 escapes). */
static const json_t *resolve(const json_t *doc, const char *ref)
{
    if (ref[0] != '#') return NULL;
    const json_t *cur = doc;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') {
                tok[n++] = '~';
                p += 2;
            } else if (p[0] == '~' && p[1] == '1') {
                tok[n++] = '/';
                p += 2;
            } else {
                tok[n++] = *p++;
            }
        }
        tok[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            cur = *end || i < 0 ? NULL : json_array_get(cur, (size_t)i);
        } else {
            return NULL;
        }
        if (!cur) return NULL;
    }
    return cur;
}

/* Compiles schema s into a new rule; returns its number, or -1 after fail(). */
static int gen(cx_t *c, const json_t *s, const char *path)
{
    if (c->failed) return -1;
    if (++c->depth > 64) {
        fail(c, path, "schema nested too deeply (64 levels)");
        return -1;
    }
    int r = -1;
    sb_t b = {0};
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        r = new_rule(c);
        sb_add(&b, "value");
        goto emit;
    }
    if (json_is_false(s)) {
        fail(c, path, "schema false matches nothing");
        goto out;
    }
    if (!json_is_object(s)) {
        fail(c, path, "a schema must be an object or a boolean");
        goto out;
    }
    const char *k;
    json_t *v;
    int n_constraints = 0;
    json_object_foreach((json_t *)s, k, v) {
        if (!is_known(k)) {
            fail(c, path, "unsupported JSON Schema keyword '%s'", k);
            goto out;
        }
        if (!is_annotation(k)) n_constraints++;
    }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref) || n_constraints != 1) {
            fail(c, path, "$ref must be a string and have no sibling keywords");
            goto out;
        }
        const char *rs = json_string_value(ref);
        for (size_t i = 0; i < c->n_refs; i++)
            if (strcmp(c->refs[i].ptr, rs) == 0) {
                r = c->refs[i].rule;
                goto out;
            }
        const json_t *target = resolve(c->doc, rs);
        if (!target) {
            fail(c, path, "$ref '%s' does not resolve (only local #/... pointers are "
                          "supported)", rs);
            goto out;
        }
        if (c->n_refs == c->cap_refs) {
            size_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
            ref_t *nr = realloc(c->refs, cap * sizeof *nr);
            if (!nr) {
                c->out.oom = 1;
                goto out;
            }
            c->refs = nr;
            c->cap_refs = cap;
        }
        r = new_rule(c);
        c->refs[c->n_refs].ptr = dupstr(rs);
        c->refs[c->n_refs++].rule = r;
        if (!c->refs[c->n_refs - 1].ptr) c->out.oom = 1;
        int t = gen(c, target, rs);
        if (t < 0) {
            r = -1;
            goto out;
        }
        sb_addf(&b, "r%d", t);
        goto emit;
    }
    const json_t *any = json_object_get(s, "anyOf"), *all = json_object_get(s, "allOf");
    if (any || all) {
        const json_t *arr = any ? any : all;
        if ((any && all) || n_constraints != 1 || !json_is_array(arr) ||
            json_array_size(arr) == 0 || (all && json_array_size(arr) != 1)) {
            fail(c, path, "anyOf must be a non-empty array without sibling keywords; allOf is "
                          "supported with exactly one schema");
            goto out;
        }
        r = new_rule(c);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, any ? "anyOf" : "allOf", i);
            int t = gen(c, json_array_get(arr, i), sub);
            if (t < 0) {
                r = -1;
                goto out;
            }
            sb_addf(&b, "%sr%d", i ? " | " : "", t);
        }
        goto emit;
    }
    const json_t *type = json_object_get(s, "type");
    const char *types[8];
    int nt = 0;
    if (type) {
        if (json_is_string(type)) {
            types[nt++] = json_string_value(type);
        } else if (json_is_array(type) && json_array_size(type) > 0 &&
                   json_array_size(type) <= 7) {
            for (size_t i = 0; i < json_array_size(type); i++) {
                const json_t *t = json_array_get(type, i);
                if (!json_is_string(t)) break;
                types[nt++] = json_string_value(t);
            }
            if ((size_t)nt != json_array_size(type)) nt = -1;
        } else {
            nt = -1;
        }
        if (nt < 0) {
            fail(c, path, "type must be a string or an array of type names");
            goto out;
        }
    }
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        if ((en && cn) || (en && (!json_is_array(en) || json_array_size(en) == 0)) ||
            n_constraints != 1 + (type != NULL)) {
            fail(c, path, "enum must be a non-empty array; enum/const take no sibling keywords "
                          "but type");
            goto out;
        }
        r = new_rule(c);
        size_t n = en ? json_array_size(en) : 1, kept = 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *val = en ? json_array_get(en, i) : cn;
            int ok = nt == 0;
            for (int t = 0; t < nt; t++) ok |= type_matches(types[t], val);
            if (!ok) continue;
            if (kept++) sb_add(&b, " | ");
            put_json_literal(c, &b, val);
        }
        if (!kept) {
            fail(c, path, "no enum/const value has the schema's type");
            r = -1;
            goto out;
        }
        goto emit;
    }
    if (nt == 0) { /* infer from the keywords present */
        if (json_object_get(s, "properties") || json_object_get(s, "required") ||
            json_object_get(s, "additionalProperties"))
            types[nt++] = "object";
        else if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
                 json_object_get(s, "maxItems"))
            types[nt++] = "array";
        else if (json_object_get(s, "pattern") || json_object_get(s, "format") ||
                 json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            types[nt++] = "string";
        else if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                 json_object_get(s, "exclusiveMinimum") ||
                 json_object_get(s, "exclusiveMaximum"))
            types[nt++] = "number";
    }
    r = new_rule(c);
    if (nt == 0) {
        sb_add(&b, "value");
        goto emit;
    }
    for (int t = 0; t < nt; t++) {
        sb_t tb = {0};
        gen_type(c, &tb, types[t], s, path);
        if (t) sb_add(&b, " | ");
        sb_add(&b, "( ");
        if (tb.s) sb_add(&b, tb.s);
        sb_add(&b, " )");
        if (tb.oom) b.oom = 1;
        free(tb.s);
        if (c->failed) {
            r = -1;
            goto out;
        }
    }
emit:
    if (!c->failed) emit_rule(c, r, &b);
    else r = -1;
out:
    free(b.s);
    c->depth--;
    return c->failed ? -1 : r;
}

char *json_schema_to_grammar(const json_t *schema, char *errstr, size_t errlen)
{
    cx_t c = {.doc = schema, .err = errstr, .errlen = errlen};
    char *res = NULL;
    if (!schema) {
        snprintf(errstr, errlen, "no schema");
        return NULL;
    }
    int r = gen(&c, schema, "#");
    if (r >= 0 && !c.failed) {
        sb_addf(&c.out, "root ::= r%d\n", r);
        sb_add(&c.out, COMMON);
        if (c.out.oom) {
            if (errstr && errlen) snprintf(errstr, errlen, "out of memory");
        } else {
            res = c.out.s;
            c.out.s = NULL;
        }
    }
    free(c.out.s);
    for (size_t i = 0; i < c.n_refs; i++) free(c.refs[i].ptr);
    free(c.refs);
    return res;
}

char *json_schema_any_object_grammar(char *errstr, size_t errlen)
{
    sb_t b = {0};
    sb_add(&b, "root ::= object\n");
    sb_add(&b, COMMON);
    if (b.oom) {
        free(b.s);
        if (errstr && errlen) snprintf(errstr, errlen, "out of memory");
        return NULL;
    }
    return b.s;
}

int json_schema_request_grammar(const json_t *grammar, const json_t *response_format,
                                struct grammar **out, int *kind, char *errstr, size_t errlen)
{
    *out = NULL;
    *kind = JSON_SCHEMA_NONE;
    char *text = NULL;
    char sub[384] = "";
    if (grammar && !json_is_string(grammar)) {
        snprintf(errstr, errlen, "grammar: got %s; expected a string (EBNF)",
                 json_is_object(grammar) ? "an object" : "another type");
        return -2;
    }
    if (response_format) {
        if (!json_is_object(response_format)) {
            snprintf(errstr, errlen, "response_format: expected an object");
            return -2;
        }
        const json_t *t = json_object_get(response_format, "type");
        if (!json_is_string(t)) {
            snprintf(errstr, errlen, "response_format.type: expected a string (text, "
                                     "json_object or json_schema)");
            return -2;
        }
        const char *ts = json_string_value(t);
        if (strcmp(ts, "text") == 0) {
            /* no constraint */
        } else if (strcmp(ts, "json_object") == 0 || strcmp(ts, "json_schema") == 0) {
            if (grammar) {
                snprintf(errstr, errlen, "grammar and response_format %s are both set; send one",
                         ts);
                return -1;
            }
            if (ts[5] == 'o') {
                *kind = JSON_SCHEMA_OBJECT;
                text = json_schema_any_object_grammar(errstr, errlen);
                if (!text) return -3;
            } else {
                *kind = JSON_SCHEMA_SCHEMA;
                const json_t *js = json_object_get(response_format, "json_schema");
                if (!json_is_object(js)) {
                    snprintf(errstr, errlen, "response_format.json_schema: expected an object "
                                             "{\"name\", \"schema\", \"strict\"}");
                    return -2;
                }
                const json_t *nm = json_object_get(js, "name"), *st = json_object_get(js, "strict");
                const json_t *sc = json_object_get(js, "schema");
                if ((nm && !json_is_string(nm)) || (st && !json_is_boolean(st) && !json_is_null(st))) {
                    snprintf(errstr, errlen, "response_format.json_schema: name must be a string "
                                             "and strict a boolean");
                    return -2;
                }
                if (!sc || (!json_is_object(sc) && !json_is_boolean(sc))) {
                    snprintf(errstr, errlen, "response_format.json_schema.schema: expected a JSON "
                                             "Schema object");
                    return -2;
                }
                text = json_schema_to_grammar(sc, sub, sizeof sub);
                if (!text) {
                    snprintf(errstr, errlen, "response_format.json_schema.schema: %s", sub);
                    return strcmp(sub, "out of memory") == 0 ? -3 : -1;
                }
            }
        } else {
            snprintf(errstr, errlen, "response_format.type: '%.64s' is not text, json_object or "
                                     "json_schema", ts);
            return -1;
        }
    }
    if (grammar) {
        *kind = JSON_SCHEMA_EBNF;
        *out = grammar_parse(json_string_value(grammar), json_string_length(grammar), sub,
                             sizeof sub);
        if (!*out) {
            snprintf(errstr, errlen, "grammar: %s", sub);
            return strcmp(sub, "out of memory") == 0 ? -3 : -1;
        }
        return 0;
    }
    if (!text) return 0;
    *out = grammar_parse(text, strlen(text), sub, sizeof sub);
    free(text);
    if (!*out) { /* the compiler's output is ours: a failure here is a bug or the size limit */
        snprintf(errstr, errlen, "response_format: the schema's grammar: %s", sub);
        return strcmp(sub, "out of memory") == 0 ? -3 : -1;
    }
    return 0;
}
