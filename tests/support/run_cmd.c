/* tests/support/run_cmd.c: running a program from a test (contract: run_cmd.h). */
#include "run_cmd.h"

#include <stdio.h>
#include <sys/wait.h>

int tr_run_cmd(const char *bin, const char *args, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s", bin, args);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = 0, r;
    while (n + 1 < cap && (r = fread(out + n, 1, cap - 1 - n, f)) > 0) n += r;
    out[n] = 0;
    char sink[4096];
    while (fread(sink, 1, sizeof sink, f) > 0) {
    }
    int st = pclose(f);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
