/* tests/test_common.c: the base layer (common/): error messages and code names. */
#include <string.h>

#include "check.h"
#include "common/err.h"

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
    return check_exit();
}
