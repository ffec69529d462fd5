#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>

int sw_seterr(char *errstr, size_t errlen, const char *fmt, ...)
{
    if (errstr && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errstr, errlen, fmt, ap);
        va_end(ap);
    }
    return -SW_EINVAL;
}

const char *sw_err_name(int code)
{
    if (code < 0) code = -code;
    switch (code) {
    case SW_OK: return "SW_OK";
    case SW_EINVAL: return "SW_EINVAL";
    case SW_ENOMEM: return "SW_ENOMEM";
    case SW_ERANGE: return "SW_ERANGE";
    default: return "SW_E?";
    }
}
