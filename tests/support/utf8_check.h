/* tests/support/utf8_check.h: a UTF-8 oracle for the tests of text the engine produces
 * (tests/test_tokenizer.c, tests/fuzz/fuzz_tokenizer.c), written apart from the decoder under
 * test (common/utf8.h), so a bug there is not shared with the check. Header-only: the fuzz
 * targets link no test library. */
#ifndef SPILLWAY_TESTS_SUPPORT_UTF8_CHECK_H
#define SPILLWAY_TESTS_SUPPORT_UTF8_CHECK_H

#include <stddef.h>

/* 1 when s[0..n) is well-formed UTF-8 made of complete characters (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF), 0 if not. */
static inline int utf8_complete(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) k = 1;
        else if (c >= 0xC2 && c <= 0xDF) k = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            k = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else
            return 0;
        if (i + k > n) return 0;
        if (k > 1 && (s[i + 1] < lo || s[i + 1] > hi)) return 0;
        for (size_t j = 2; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

#endif
