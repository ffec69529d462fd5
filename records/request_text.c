/* records/request_text.c: what the request parser reads from the raw message text itself: a
 * UTF-8 check, a lexer over top-level members (to find which member holds a byte, to blank a
 * token jansson refuses, to echo metadata as sent) and the RFC 3339 timestamp reader. Pure,
 * thread-safe. */
#include "records/request.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/utf8.h"
#include "records/records_int.h"

/* ---- UTF-8 ---- */

/* Offset of the first byte that does not start a well-formed UTF-8 sequence (no overlong
 * forms, no surrogates, nothing above U+10FFFF), or len when all of s is well-formed. */
size_t rq_utf8_invalid_at(const unsigned char *s, size_t len)
{
    size_t i = 0;
    uint32_t cp;
    while (i < len) {
        size_t n = sw_utf8_decode(s + i, len - i, &cp);
        if (!n) return i;
        i += n;
    }
    return len;
}

/* ---- a lexer over raw JSON text: top-level members and their spans ----
 * Works on any bytes without reading past len; its answers are meaningful on the prefix that
 * jansson accepted. */

static int is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

static int is_delim(char ch)
{
    return is_ws(ch) || ch == ',' || ch == ':' || ch == '[' || ch == ']' || ch == '{' ||
           ch == '}' || ch == '"';
}

static size_t skip_ws(const char *s, size_t len, size_t i)
{
    while (i < len && is_ws(s[i])) i++;
    return i;
}

/* s[i] == '"': the index after the closing quote (len when unterminated). */
static size_t skip_string(const char *s, size_t len, size_t i)
{
    for (i++; i < len; i++) {
        if (s[i] == '\\') {
            if (++i >= len) return len;
        } else if (s[i] == '"') {
            return i + 1;
        }
    }
    return len;
}

/* The end of the value starting at s[i]. */
static size_t skip_value(const char *s, size_t len, size_t i)
{
    if (i >= len) return len;
    if (s[i] == '"') return skip_string(s, len, i);
    if (s[i] == '{' || s[i] == '[') {
        size_t depth = 0;
        while (i < len) {
            char ch = s[i];
            if (ch == '"') {
                i = skip_string(s, len, i);
                continue;
            }
            if (ch == '{' || ch == '[') {
                depth++;
            } else if (ch == '}' || ch == ']') {
                if (--depth == 0) return i + 1;
            }
            i++;
        }
        return len;
    }
    size_t start = i;
    while (i < len && !is_delim(s[i])) i++;
    return i > start ? i : start + 1;
}


/* Next member of the top-level object; 1, or 0 at its end or at malformed text. */
int rq_next_member(const char *s, size_t len, member_it_t *it)
{
    size_t i = skip_ws(s, len, it->pos);
    if (i >= len || s[i] != (it->started ? ',' : '{')) return 0;
    it->started = 1;
    i = skip_ws(s, len, i + 1);
    if (i >= len || s[i] != '"') return 0;
    it->key0 = i;
    i = skip_string(s, len, i);
    it->key1 = i;
    i = skip_ws(s, len, i);
    if (i >= len || s[i] != ':') return 0;
    i = skip_ws(s, len, i + 1);
    if (i >= len) return 0;
    it->val0 = i;
    it->val1 = skip_value(s, len, i);
    it->pos = it->val1;
    return 1;
}

/* The key of the member as text (escapes decoded), into buf; "" when it cannot be decoded. */
void rq_member_key(const char *s, const member_it_t *it, char *buf, size_t n)
{
    buf[0] = 0;
    size_t klen = it->key1 - it->key0;
    if (klen < 2) return;
    if (!memchr(s + it->key0, '\\', klen)) {
        size_t m = klen - 2 < n - 1 ? klen - 2 : n - 1;
        memcpy(buf, s + it->key0 + 1, m);
        buf[m] = 0;
        return;
    }
    /* escaped: let jansson decode the key token as a one-element array */
    char *tmp = malloc(klen + 2);
    if (!tmp) return;
    tmp[0] = '[';
    memcpy(tmp + 1, s + it->key0, klen);
    tmp[klen + 1] = ']';
    json_t *a = json_loadb(tmp, klen + 2, 0, NULL);
    free(tmp);
    const char *k = a ? json_string_value(json_array_get(a, 0)) : NULL;
    if (k) snprintf(buf, n, "%s", k);
    json_decref(a);
}

/* Start of the token of s[from..p) that ends at p (the one jansson stopped after). */
size_t rq_token_start(const char *s, size_t from, size_t p)
{
    size_t i = from, last = from;
    while (i < p) {
        char ch = s[i];
        if (is_ws(ch) || ch == ',' || ch == ':' || ch == '[' || ch == ']' || ch == '{' ||
            ch == '}') {
            i++;
            continue;
        }
        last = i;
        if (ch == '"') {
            i = skip_string(s, p, i);
        } else {
            while (i < p && !is_delim(s[i])) i++;
        }
    }
    return last;
}

/* Copies the JSON text s[0..n) without whitespace outside strings. Returns the length. */
size_t rq_compact_json(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] == '"') {
            size_t e = skip_string(s, n, i);
            memcpy(out + o, s + i, e - i);
            o += e - i;
            i = e;
        } else {
            if (!is_ws(s[i])) out[o++] = s[i];
            i++;
        }
    }
    return o;
}

/* The key of the top-level member whose value holds byte off, into key; "message" when there
 * is none (the byte is outside any value, or the text before it is not a plausible object). */
const char *rq_member_at(const char *s, size_t len, size_t off, char *key, size_t n)
{
    member_it_t it = {0};
    key[0] = 0;
    while (rq_next_member(s, len, &it)) {
        if (it.key0 <= off && off < it.val1) {
            if (off >= it.val0) rq_member_key(s, &it, key, n);
            break;
        }
    }
    return key[0] ? key : "message";
}

static int days_in_month(int y, int m)
{
    static const int dm[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : dm[m - 1];
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    if (m <= 2) y -= 1;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;                            /* [0, 399] */
    int64_t mp = m > 2 ? m - 3 : m + 9;                      /* March = 0 */
    int64_t doy = (153 * mp + 2) / 5 + d - 1;                /* [0, 365] */
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;     /* [0, 146096] */
    return era * 146097 + doe - 719468;
}

static int digits(const char *s, size_t n, size_t at, int count, int *out)
{
    if (at + (size_t)count > n) return -1;
    int v = 0;
    for (int k = 0; k < count; k++) {
        char ch = s[at + k];
        if (ch < '0' || ch > '9') return -1;
        v = v * 10 + (ch - '0');
    }
    *out = v;
    return 0;
}

/* RFC 3339 date-time "YYYY-MM-DD(T|t| )HH:MM:SS[.frac](Z|z|+HH:MM|-HH:MM|+HHMM|-HHMM)" to Unix
 * epoch milliseconds (the fraction truncated to ms; a leap second 60 counts as the next
 * second). 0, or -1 with why set to a short reason. */
int rq_parse_timestamp(const char *s, size_t n, int64_t *ms, const char **why)
{
    int Y, M, D, h, mi, sec;
    *why = "expected the form 2026-11-30T12:00:00Z";
    if (digits(s, n, 0, 4, &Y) || n < 5 || s[4] != '-' || digits(s, n, 5, 2, &M) || n < 8 ||
        s[7] != '-' || digits(s, n, 8, 2, &D) || n < 11 ||
        (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || digits(s, n, 11, 2, &h) || n < 14 ||
        s[13] != ':' || digits(s, n, 14, 2, &mi) || n < 17 || s[16] != ':' ||
        digits(s, n, 17, 2, &sec))
        return -1;
    if (M < 1 || M > 12) return *why = "month out of range", -1;
    if (D < 1 || D > days_in_month(Y, M)) return *why = "day out of range for the month", -1;
    if (h > 23 || mi > 59 || sec > 60) return *why = "time of day out of range", -1;
    size_t i = 19;
    int frac_ms = 0;
    if (i < n && s[i] == '.') {
        i++;
        size_t f0 = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (i - f0 < 3) frac_ms = frac_ms * 10 + (s[i] - '0');
            i++;
        }
        if (i == f0) return *why = "empty fraction of a second", -1;
        for (size_t k = i - f0; k < 3; k++) frac_ms *= 10;
    }
    int offset_min = 0;
    if (i < n && (s[i] == 'Z' || s[i] == 'z')) {
        i++;
    } else if (i < n && (s[i] == '+' || s[i] == '-')) {
        int sign = s[i] == '-' ? -1 : 1, oh, om;
        i++;
        if (digits(s, n, i, 2, &oh)) return *why = "bad UTC offset", -1;
        i += 2;
        if (i < n && s[i] == ':') i++;
        if (digits(s, n, i, 2, &om)) return *why = "bad UTC offset", -1;
        i += 2;
        if (oh > 23 || om > 59) return *why = "UTC offset out of range", -1;
        offset_min = sign * (oh * 60 + om);
    } else {
        return *why = "missing time zone (Z or an offset such as +02:00)", -1;
    }
    if (i != n) return *why = "unexpected text after the time zone", -1;
    int64_t secs = days_from_civil(Y, M, D) * 86400 + h * 3600 + mi * 60 + sec -
                   (int64_t)offset_min * 60;
    *ms = secs * 1000 + frac_ms;
    if (*ms < 1 || *ms > MAX_EPOCH_MS) return *why = "before 1970 or after 9999", -1;
    return 0;
}
