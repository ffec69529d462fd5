/* tests/test_common.c: the base layer (common/): error messages and code names, the log hook
 * and levels, the clocks. */
#include <string.h>

#include "check.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

typedef struct {
    int level, n;
    char msg[600];
} seen_t;

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
    return check_exit();
}
