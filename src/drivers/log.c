/*
 * log.c — structured logs for the relay and consumer: one record per line on stderr, either
 * "text" (for a terminal) or "json" (one object per line, for collectors), carrying the event
 * ID, attempt ID and correlation ID when a record is about one event. Messages are built by
 * the library from redacted URLs only, and name configuration keys rather than their values:
 * no password or token reaches a log line (tests/ops/test_logs.sh plants some and greps).
 *
 * Per-event records of one kind (obx__log_event: "outcome UNKNOWN", "UNKNOWN resolved", a
 * consumer's handler failure, ...) are folded during an incident: past log.fold_after records
 * of a kind in a window of log.fold_interval_ms, the rest of the window is counted, not
 * written, and one line says how many there were ("1,204 events: UNKNOWN resolved by lookup in
 * the last 10 s (the first 20 logged one by one)"). The metrics keep the exact counts.
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

/* One kind of per-event record and its current window (under fold_mu). */
enum { FOLD_KINDS = 32 };
typedef struct fold {
    const char *what; /* a literal naming the kind ("UNKNOWN resolved by lookup") */
    obx__log_level lvl;
    const char *component;
    int64_t since; /* monotonic ms: the window's start */
    long logged, folded;
} fold;
static fold folds[FOLD_KINDS];
static int n_folds;
static long fold_after = 20;
static int64_t fold_ms = 10000;
static pthread_mutex_t fold_mu = PTHREAD_MUTEX_INITIALIZER;

static void clean(char *s) {
    for (unsigned char *p = (unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f) *p = '?';
}

/* The backends' own lines (librdkafka, libpq notices): records like every other. */
static void backend_sink(int lvl, const char *component, const char *msg, void *user) {
    (void)user;
    static const obx__log_level map[] = {OBX__LOG_DEBUG, OBX__LOG_INFO, OBX__LOG_WARN,
                                         OBX__LOG_ERROR};
    obx__log(map[lvl & 3], component, NULL, NULL, NULL, "%s", msg);
}

void obx__log_setup(const char *format, const char *level) {
    obx_log_set(backend_sink, NULL);
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

static void emit(obx__log_level lvl, const char *component, const char *event_id,
                 const char *attempt_id, const char *correlation_id, char *msg);

void obx__log(obx__log_level lvl, const char *component, const char *event_id,
              const char *attempt_id, const char *correlation_id, const char *fmt, ...) {
    if (lvl < min_level) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(lvl, component, event_id, attempt_id, correlation_id, msg);
}

void obx__log_fold_setup(int64_t after, int64_t interval_ms) {
    pthread_mutex_lock(&fold_mu);
    fold_after = (long)after;
    fold_ms = interval_ms > 0 ? interval_ms : 10000;
    pthread_mutex_unlock(&fold_mu);
}

/* "1,204" */
static void grouped(long n, char *out, size_t cap) {
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%ld", n < 0 ? 0 : n);
    size_t o = 0;
    for (int i = 0; i < len && o + 2 < cap; i++) {
        if (i && (len - i) % 3 == 0) out[o++] = ',';
        out[o++] = digits[i];
    }
    out[o] = '\0';
}

/* The window of f ended: its line, when something was folded (under fold_mu). */
static void fold_close(fold *f, int64_t now) {
    if (f->folded) {
        char total[40], msg[300];
        grouped(f->logged + f->folded, total, sizeof total);
        double secs = (double)fold_ms / 1000.0;
        snprintf(msg, sizeof msg,
                 "%s events: %s in the last %g s (the first %ld logged one by one)", total, f->what,
                 secs, f->logged);
        emit(f->lvl, f->component, NULL, NULL, NULL, msg);
    }
    f->since = now;
    f->logged = f->folded = 0;
}

void obx__log_event(const char *what, obx__log_level lvl, const char *component,
                    const char *event_id, const char *attempt_id, const char *correlation_id,
                    const char *fmt, ...) {
    if (lvl < min_level) return;
    int64_t now = obx__mono_ms();
    pthread_mutex_lock(&fold_mu);
    fold *f = NULL;
    for (int i = 0; i < n_folds && !f; i++)
        if (folds[i].what == what || !strcmp(folds[i].what, what)) f = &folds[i];
    if (!f && n_folds < FOLD_KINDS) {
        f = &folds[n_folds++];
        *f = (fold){.what = what, .lvl = lvl, .component = component, .since = now};
    }
    if (f && now - f->since >= fold_ms) fold_close(f, now);
    bool write = !f || fold_after <= 0 || f->logged < fold_after;
    if (f) {
        if (write)
            f->logged++;
        else
            f->folded++;
    }
    pthread_mutex_unlock(&fold_mu);
    if (!write) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(lvl, component, event_id, attempt_id, correlation_id, msg);
}

void obx__log_fold_flush(bool all) {
    int64_t now = obx__mono_ms();
    pthread_mutex_lock(&fold_mu);
    for (int i = 0; i < n_folds; i++)
        if (all || now - folds[i].since >= fold_ms) fold_close(&folds[i], now);
    pthread_mutex_unlock(&fold_mu);
}

static void emit(obx__log_level lvl, const char *component, const char *event_id,
                 const char *attempt_id, const char *correlation_id, char *msg) {
    static const char *const names[] = {"debug", "info", "warn", "error"};
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
