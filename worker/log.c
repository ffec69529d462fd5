/* worker/log.c: the worker's log lines (text or JSON, log.level and log.format) and its fatal
 * state. Any thread: wlog formats into a local buffer and writes one line with one fprintf; the
 * fatal state is under w->mu. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker/worker_int.h"

static const char *const LEVEL_NAME[] = {"ERROR", "WARN", "INFO", "DEBUG"};

static const char *const LEVEL_JSON[] = {"error", "warn", "info", "debug"};

/* Writes s into dst as the inside of a JSON string (quotes, backslashes and control characters
 * escaped; UTF-8 passes through), truncated to fit. */
void wlog_json_escape(char *dst, size_t cap, const char *s)
{
    size_t j = 0;
    for (; *s && j + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            dst[j++] = '\\';
            dst[j++] = (char)ch;
        } else if (ch == '\n') {
            dst[j++] = '\\';
            dst[j++] = 'n';
        } else if (ch < 0x20) {
            j += (size_t)snprintf(dst + j, cap - j, "\\u%04x", ch);
        } else {
            dst[j++] = (char)ch;
        }
    }
    dst[j] = 0;
}

void wlog(worker_t *w, int level, const char *fmt, ...)
{
    if (level > w->cfg.log_level) return;
    char buf[1024], ts[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    if (w->log_json) {
        char msg[2 * sizeof buf];
        wlog_json_escape(msg, sizeof msg, buf);
        fprintf(stderr,
                "{\"ts\":\"%s.%03dZ\",\"level\":\"%s\",\"worker\":\"%s\",\"msg\":\"%s\"}\n", ts,
                (int)(tv.tv_usec / 1000), LEVEL_JSON[level & 3], w->worker_id_json, msg);
        return;
    }
    fprintf(stderr, "%s.%03dZ spillway[%s] %s %s\n", ts, (int)(tv.tv_usec / 1000), w->worker_id,
            LEVEL_NAME[level & 3], buf);
}

void wlog_hook(void *arg, int level, const char *msg) { wlog(arg, level, "%s", msg); }
void wfatal_set(worker_t *w, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&w->mu);
    if (!w->fatal) {
        w->fatal = 1;
        snprintf(w->fatal_msg, sizeof w->fatal_msg, "%s", buf);
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int wfatal_is(worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    int f = w->fatal;
    pthread_mutex_unlock(&w->mu);
    return f;
}
