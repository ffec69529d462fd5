#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>

void sw_logf(sw_log_fn fn, void *arg, int level, const char *fmt, ...)
{
    if (!fn) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fn(arg, level, buf);
}

int sw_log_from_syslog(int syslog_level)
{
    return syslog_level <= 3   ? SW_LOG_ERROR
           : syslog_level <= 4 ? SW_LOG_WARN
           : syslog_level <= 6 ? SW_LOG_INFO
                               : SW_LOG_DEBUG;
}
