/* tests/test_common.c: the base layer (common/): error messages and code names, the log hook
 * and levels, the clocks, UTF-8 decoding. */
#include <string.h>

#include "check.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/utf8.h"

typedef struct {
    int level, n;
    char msg[600];
} seen_t;

/* Our own encoder, to check the decoder against: cp's UTF-8 bytes into b, returns their number. */
static size_t enc(uint32_t cp, unsigned char *b)
{
    if (cp < 0x80) { b[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { b[0] = (unsigned char)(0xC0 | cp >> 6); b[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | cp >> 12);
        b[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (unsigned char)(0xF0 | cp >> 18);
    b[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    b[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    b[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static void hook(void *arg, int level, const char *msg)
{
    seen_t *s = arg;
    s->level = level;
    s->n++;
    snprintf(s->msg, sizeof s->msg, "%s", msg);
}

int main(void)
{
    char err[16];
    CHECK(sw_seterr(err, sizeof err, "bad %s %d", "value", 42) == -SW_EINVAL);
    CHECK(strcmp(err, "bad value 42") == 0);
    /* cut off to fit, NUL-terminated */
    CHECK(sw_seterr(err, sizeof err, "%s", "a message longer than sixteen bytes") == -1);
    CHECK(strlen(err) == sizeof err - 1 && memcmp(err, "a message longer", 15) == 0);
    /* no buffer: nothing written */
    err[0] = 'x';
    CHECK(sw_seterr(err, 0, "ignored") == -1 && err[0] == 'x');
    CHECK(sw_seterr(NULL, 64, "ignored") == -1);
    CHECK(strcmp(sw_err_name(SW_OK), "SW_OK") == 0);
    CHECK(strcmp(sw_err_name(-SW_ERANGE), "SW_ERANGE") == 0);
    CHECK(strcmp(sw_err_name(SW_ENOMEM), "SW_ENOMEM") == 0);
    CHECK(strcmp(sw_err_name(-SW_EINVAL), "SW_EINVAL") == 0);
    CHECK(strcmp(sw_err_name(1000), "SW_E?") == 0);

    seen_t seen = {0};
    sw_logf(hook, &seen, SW_LOG_WARN, "commit: %s (%d)", "timed out", 7);
    CHECK(seen.n == 1 && seen.level == SW_LOG_WARN && strcmp(seen.msg, "commit: timed out (7)") == 0);
    char big[700];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    sw_logf(hook, &seen, SW_LOG_DEBUG, "%s", big);
    CHECK(seen.n == 2 && seen.level == SW_LOG_DEBUG && strlen(seen.msg) == 511);
    sw_logf(NULL, &seen, SW_LOG_ERROR, "nobody listens"); /* no hook: nothing */
    CHECK(seen.n == 2);
    /* the levels' numbers are those of log.level and of every hook */
    CHECK(SW_LOG_ERROR == 0 && SW_LOG_WARN == 1 && SW_LOG_INFO == 2 && SW_LOG_DEBUG == 3);
    static const int syslog_to[8] = {SW_LOG_ERROR, SW_LOG_ERROR, SW_LOG_ERROR, SW_LOG_ERROR,
                                      SW_LOG_WARN,  SW_LOG_INFO,  SW_LOG_INFO,  SW_LOG_DEBUG};
    for (int l = 0; l < 8; l++) CHECKF(sw_log_from_syslog(l) == syslog_to[l], "syslog %d", l);

    /* clocks: monotonic never goes back, the units agree, the wall clock is an epoch time */
    int64_t ns0 = sw_mono_ns(), ms = sw_mono_ms(), ns1 = sw_mono_ns();
    double sec = sw_mono_s();
    CHECK(ns1 >= ns0 && ms >= ns0 / 1000000 && ms <= ns1 / 1000000);
    CHECK(sec >= (double)ns1 * 1e-9 && sec < (double)ns1 * 1e-9 + 1.0);
    CHECK(sw_wall_ms() > INT64_C(1577836800000)); /* after 2020-01-01 */

    /* UTF-8: every scalar value round-trips, surrogates and truncations do not decode */
    int bad = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        unsigned char b[4];
        size_t k = enc(cp, b);
        uint32_t got = 0xFFFFFFFFu;
        size_t n = sw_utf8_decode(b, k, &got);
        int surrogate = cp >= 0xD800 && cp <= 0xDFFF;
        if (surrogate ? n != 0 : n != k || got != cp) bad++;
        if (k > 1 && sw_utf8_decode(b, k - 1, &got) != 0) bad++; /* truncated */
    }
    CHECKF(bad == 0, "%d code points decoded wrongly", bad);
    static const struct { const char *s; size_t n; } invalid[] = {
        {"\x80", 1}, {"\xBF", 1}, {"\xC0\x80", 2}, {"\xC1\xBF", 2}, {"\xE0\x80\x80", 3},
        {"\xE0\x9F\xBF", 3}, {"\xF0\x80\x80\x80", 4}, {"\xF0\x8F\xBF\xBF", 4},
        {"\xF4\x90\x80\x80", 4}, {"\xF8\x88\x80\x80", 4}, {"\xFF", 1}, {"\xC3\x28", 2},
        {"\xE2\x82\x28", 3}};
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        uint32_t cp = 7;
        CHECKF(sw_utf8_decode((const unsigned char *)invalid[i].s, invalid[i].n, &cp) == 0 &&
                   cp == 7,
               "invalid case %zu decoded", i);
    }
    return check_exit();
}
