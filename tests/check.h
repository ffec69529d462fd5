/* tests/check.h: minimal assertions for the C tests. A failed CHECK prints file:line and the
 * expression and counts a failure; main returns check_exit(). Exit code 77 means skipped. */
#ifndef SPILLWAY_TESTS_CHECK_H
#define SPILLWAY_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_failures_;
static int check_count_;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        check_count_++;                                                                \
        if (!(cond)) {                                                                 \
            check_failures_++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
        }                                                                              \
    } while (0)

#define CHECKF(cond, ...)                                                              \
    do {                                                                               \
        check_count_++;                                                                \
        if (!(cond)) {                                                                 \
            check_failures_++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
        }                                                                              \
    } while (0)

static inline int check_exit(void)
{
    fprintf(stderr, "%d checks, %d failed\n", check_count_, check_failures_);
    return check_failures_ ? 1 : 0;
}

#endif
