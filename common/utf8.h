/* UTF-8 decoding: what counts as one valid character, for every module that checks, cleans or
 * walks text (chat templates, result text). */
#ifndef SPILLWAY_COMMON_UTF8_H
#define SPILLWAY_COMMON_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The character at s[0..n) (n >= 1): returns its length (1..4) and its code point in *cp, or 0
 * (*cp untouched) when s does not start with a complete, valid UTF-8 sequence: a stray
 * continuation byte or a bad lead byte, a truncated, overlong or surrogate (U+D800..DFFF)
 * sequence, or one above U+10FFFF. */
size_t sw_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

#endif
