/* tests/support/run_cmd.h: running a program of the build (the spillway command) from a test and
 * reading what it prints. Linked into every tests/test_*.c, engine-only builds too
 * (spillway_test_base). Threads: any. */
#ifndef SPILLWAY_TESTS_SUPPORT_RUN_CMD_H
#define SPILLWAY_TESTS_SUPPORT_RUN_CMD_H

#include <stddef.h>

/* Runs `'bin' args` through the shell (args are shell words, quoted by the caller); its stdout
 * (at most cap - 1 bytes, the rest read and dropped) into out, NUL-terminated; stderr is the
 * test's. Returns the exit status, or -1 when it could not run or did not exit. */
int tr_run_cmd(const char *bin, const char *args, char *out, size_t cap);

#endif
