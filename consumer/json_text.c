/* consumer/json_text.c: compact JSON with reals in their shortest round-trip form. */
#include "consumer/json_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shortest "%.Ng" text of d (N = 1..17) that strtod reads back as d, written without an
 * exponent when it is a whole number below 10^16, with ".0" added when it has neither '.' nor
 * an exponent. buf holds at least 32 bytes. Returns its length. */
static size_t shortest_real(double d, char *buf)
{
    int n = 0, p;
    for (p = 1; p <= 17; p++) {
        n = snprintf(buf, 32, "%.*g", p, d);
        if (strtod(buf, NULL) == d) break;
    }
    /* %g writes 100 with one digit as 1e+02: a whole number below 10^16 is written out
     * (100.0), with the same significant digits */
    const char *e = strchr(buf, 'e');
    if (e && e[1] == '+' && atoi(e + 2) <= 15) {
        int dec = (p > 17 ? 17 : p) - 1 - atoi(e + 2);
        n = snprintf(buf, 32, "%.*f", dec > 0 ? dec : 0, d);
    }
    if (!strpbrk(buf, ".eEn")) { /* "n": inf/nan never reach here (jansson refuses them) */
        memcpy(buf + n, ".0", 3);
        n += 2;
    }
    return (size_t)n;
}

char *json_text_shorten_reals(char *s)
{
    char *r = s, *w = s;
    while (*r) {
        if (*r == '"') { /* a string: copied as is, escapes included */
            *w++ = *r++;
            while (*r && *r != '"') {
                if (*r == '\\' && r[1]) *w++ = *r++;
                *w++ = *r++;
            }
            if (*r) *w++ = *r++;
            continue;
        }
        if (*r == '-' || (*r >= '0' && *r <= '9')) {
            const char *t = r;
            int real = 0;
            while (*t == '-' || *t == '+' || *t == '.' || *t == 'e' || *t == 'E' ||
                   (*t >= '0' && *t <= '9')) {
                if (*t == '.' || *t == 'e' || *t == 'E') real = 1;
                t++;
            }
            size_t len = (size_t)(t - r);
            char buf[40];
            if (real && len < sizeof buf) {
                memcpy(buf, r, len);
                buf[len] = 0;
                char sh[40];
                size_t n = shortest_real(strtod(buf, NULL), sh);
                if (n <= len) { /* shorter or equal: rewrite (w <= r, so it fits) */
                    memcpy(w, sh, n);
                    w += n;
                    r = (char *)t;
                    continue;
                }
            }
            memmove(w, r, len);
            w += len;
            r = (char *)t;
            continue;
        }
        *w++ = *r++;
    }
    *w = 0;
    return s;
}

char *json_text_dump(const json_t *v)
{
    /* jansson's default real precision is 17 significant digits: exact, then shortened */
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    return s ? json_text_shorten_reals(s) : NULL;
}
