#include "common/utf8.h"

size_t sw_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    size_t k = s[0] < 0x80            ? 1
               : (s[0] >> 5) == 0x06 ? 2
               : (s[0] >> 4) == 0x0E ? 3
               : (s[0] >> 3) == 0x1E ? 4
                                     : 0;
    if (k == 0 || k > n) return 0;
    uint32_t c = k == 1 ? s[0] : k == 2 ? s[0] & 0x1Fu : k == 3 ? s[0] & 0x0Fu : s[0] & 0x07u;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3Fu);
    }
    static const uint32_t MIN[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < MIN[k] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return k;
}
