/*
 * log.c — structured logs for the relay and consumer: one record per line on stderr, either
 * "text" (for a terminal) or "json" (one object per line, for collectors), carrying the event
 * ID, attempt ID and correlation ID when a record is about one event. Messages are built by
 * the library from redacted URLs only, and name configuration keys rather than their values:
 * no password or token reaches a log line (tests/ops/test_logs.sh plants some and greps).
 */
#include "drivers/log.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int json_mode;
static obx__log_level min_level = OBX__LOG_INFO;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void clean(char *s) {
    for (unsigned char *p = (unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f) *p = '?';
}

void obx__log_setup(const char *format, const char *level) {
    json_mode = format && !strcmp(format, "json");
    if (!level) return;
    if (!strcmp(level, "debug"))
        min_level = OBX__LOG_DEBUG;
    else if (!strcmp(level, "warn"))
        min_level = OBX__LOG_WARN;
    else if (!strcmp(level, "error"))
        min_level = OBX__LOG_ERROR;
    else
        min_level = OBX__LOG_INFO;
}

void obx__log(obx__log_level lvl, const char *component, const char *event_id,
              const char *attempt_id, const char *correlation_id, const char *fmt, ...) {
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (lvl < min_level) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    pthread_mutex_lock(&mu);
    if (json_mode) {
        json_t *o = json_pack("{s:s,s:s,s:s,s:s}", "ts", when, "level", names[lvl], "component",
                              component, "msg", msg);
        if (o && event_id && *event_id) json_object_set_new(o, "event_id", json_string(event_id));
        if (o && attempt_id && *attempt_id)
            json_object_set_new(o, "attempt_id", json_string(attempt_id));
        if (o && correlation_id && *correlation_id)
            json_object_set_new(o, "correlation_id", json_string(correlation_id));
        char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (line) fprintf(stderr, "%s\n", line);
        free(line);
        json_decref(o);
    } else {
        /* one record, one line: a control character in a message (a broker's error text) or
         * in event data must not start a forged line or move a terminal's cursor */
        clean(msg);
        char corr[OBX_TEXT_MAX + 1] = "";
        if (correlation_id) obx__strlcpy(corr, correlation_id, sizeof corr);
        clean(corr);
        fprintf(stderr, "%s %-5s %s: %s%s%s%s%s%s%s\n", when, names[lvl], component, msg,
                event_id && *event_id ? " event=" : "", event_id ? event_id : "",
                attempt_id && *attempt_id ? " attempt=" : "", attempt_id ? attempt_id : "",
                corr[0] ? " correlation=" : "", corr);
    }
    pthread_mutex_unlock(&mu);
}
