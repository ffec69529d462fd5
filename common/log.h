/* Log levels and the log hook every module takes (consumer, producer, cache, worker).
 *
 * A module does not write log lines itself: it formats one line and passes it, with its level,
 * to the hook its owner gave it (the worker's wlog writes them, as text or JSON). The levels'
 * numbers are those of the log.level config key and of every hook: 0 error .. 3 debug. */
#ifndef SPILLWAY_COMMON_LOG_H
#define SPILLWAY_COMMON_LOG_H

enum { SW_LOG_ERROR = 0, SW_LOG_WARN = 1, SW_LOG_INFO = 2, SW_LOG_DEBUG = 3 };

/* One log line (no newline) at level SW_LOG_*; called from whatever thread logs, so it must be
 * thread-safe. */
typedef void (*sw_log_fn)(void *arg, int level, const char *msg);

/* Formats one line (cut off at 511 bytes) and passes it to fn(arg, level, line); nothing when
 * fn is NULL. */
void sw_logf(sw_log_fn fn, void *arg, int level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The SW_LOG_* level of a syslog level (librdkafka's log callback): 0..3 error, 4 warning,
 * 5..6 info, 7 debug. */
int sw_log_from_syslog(int syslog_level);

#endif
