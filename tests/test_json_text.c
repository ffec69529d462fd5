/* tests/test_json_text.c: consumer/json_text: reals in their shortest round-trip form, strings
 * and integers untouched. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consumer/json_text.h"
#include "tests/check.h"

static void dump_is(const char *in, const char *want)
{
    json_error_t e;
    json_t *v = json_loads(in, JSON_DECODE_ANY, &e);
    CHECKF(v != NULL, "%s: %s", in, e.text);
    if (!v) return;
    char *s = json_text_dump(v);
    CHECKF(s && !strcmp(s, want), "%s -> %s, want %s", in, s ? s : "(null)", want);
    /* and it reads back as the same value */
    json_t *back = s ? json_loads(s, JSON_DECODE_ANY, NULL) : NULL;
    CHECKF(back && json_equal(v, back), "%s does not read back equal", in);
    json_decref(back);
    free(s);
    json_decref(v);
}

int main(void)
{
    dump_is("{\"temperature\":0.8,\"top_p\":0.95}", "{\"temperature\":0.8,\"top_p\":0.95}");
    dump_is("0.1", "0.1");
    dump_is("[0.30000000000000004]", "[0.30000000000000004]"); /* 0.1 + 0.2 needs 17 digits */
    dump_is("[1.0, 2, -0.5, 1e300, 5e-324, 123456789012345678]",
            "[1.0,2,-0.5,1e+300,5e-324,123456789012345678]");
    dump_is("{\"a\":\"0.80000000000000004 and \\\"1.50\\\"\",\"b\":[{\"c\":2.50}]}",
            "{\"a\":\"0.80000000000000004 and \\\"1.50\\\"\",\"b\":[{\"c\":2.5}]}");
    /* whole numbers below 10^16 without an exponent (%g would write 100 as 1e+02) */
    dump_is("[100.0, 31000.0, 1e15, 1e16, 0.0001, 1e-05, 120.5, -2500.0]",
            "[100.0,31000.0,1000000000000000.0,1e+16,0.0001,1e-05,120.5,-2500.0]");
    /* jansson's own 17 digits are already the shortest: kept as jansson writes them */
    dump_is("[-1.7976931348623157e308]", "[-1.7976931348623157e308]");
    /* every double of a sweep: shortest text, read back exactly */
    unsigned long long x = 88172645463325252ull;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double d;
        memcpy(&d, &x, sizeof d);
        if (!isfinite(d)) continue;
        json_t *v = json_real(d);
        char *s = json_text_dump(v);
        CHECKF(s && strtod(s, NULL) == d, "%.17g -> %s", d, s ? s : "(null)");
        CHECK(s && strpbrk(s, ".e") != NULL);
        free(s);
        json_decref(v);
    }
    return check_exit();
}
