/* Error codes and the one error-message writer shared by every module.
 *
 * The convention: a function returns 0 on success and a negative code on failure (-SW_E...;
 * -1 is -SW_EINVAL, so callers that test `!= 0`, `< 0` or `== -1` for a bad input keep working),
 * or NULL, and writes a one-line message into the caller's errstr. A caller that must tell
 * failures apart switches on the code, never on the message text. */
#ifndef SPILLWAY_COMMON_ERR_H
#define SPILLWAY_COMMON_ERR_H

#include <stddef.h>

enum {
    SW_OK = 0,
    SW_EINVAL = 1, /* bad input or parameter (the generic failure: -1) */
    SW_ENOMEM,     /* out of memory */
    SW_ERANGE,     /* a size over its limit (a prompt that leaves no room in the context) */
};

/* Writes the printf-formatted message into errstr[errlen] (cut off to fit, NUL-terminated);
 * nothing when errstr is NULL or errlen is 0. Returns -SW_EINVAL, so a function may end with
 * `return sw_seterr(...)`. */
int sw_seterr(char *errstr, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The code's name ("SW_EINVAL"); code may be given negated. "SW_E?" for an unknown code.
 * Static storage. */
const char *sw_err_name(int code);

#endif
