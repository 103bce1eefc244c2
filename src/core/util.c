/*
 * util.c — small string, buffer, hex and clock helpers shared by every layer.
 * obx__buf records allocation failure in a sticky flag so that encoders can run to the end
 * and report OBX_ENOMEM once.
 */
#include "core.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool obx__csv_has(const char *list, const char *v) {
    if (!list || !v) return false;
    size_t n = strlen(v);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if ((len == 1 && *p == '*') || (len == n && !strncmp(p, v, n))) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

size_t obx__strlcpy(char *dst, const char *src, size_t cap) {
    size_t n = src ? strlen(src) : 0;
    if (cap) {
        size_t c = n < cap - 1 ? n : cap - 1;
        if (c) memcpy(dst, src, c);
        dst[c] = '\0';
    }
    return n;
}

char *obx__strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

char *obx__asprintf(const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

void obx_free(void *p) { free(p); }

void obx__buf_free(obx__buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}

static bool grow(obx__buf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    unsigned char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void obx__buf_put(obx__buf *b, const void *p, size_t n) {
    if (!n || !grow(b, n)) return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

void obx__buf_puts(obx__buf *b, const char *s) { obx__buf_put(b, s, strlen(s)); }

void obx__buf_printf(obx__buf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0 && grow(b, (size_t)n + 1)) {
        vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void obx__buf_u32be(obx__buf *b, uint32_t v) {
    unsigned char x[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 8), (unsigned char)v};
    obx__buf_put(b, x, 4);
}

void obx__hex(const unsigned char *p, size_t n, char *out) {
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[p[i] >> 4];
        out[2 * i + 1] = d[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int obx__unhex(const char *hex, unsigned char *out, size_t cap, size_t *outlen) {
    size_t n = strlen(hex);
    if (n % 2 || n / 2 > cap) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int a = hexval(hex[2 * i]), b = hexval(hex[2 * i + 1]);
        if (a < 0 || b < 0) return -1;
        out[i] = (unsigned char)(a * 16 + b);
    }
    *outlen = n / 2;
    return 0;
}

int64_t obx__wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t obx__mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t obx__mono_ms(void) { return obx__mono_us() / 1000; }

/* INT64_MIN: never synchronised (the wall clock is the reference) */
static _Atomic int64_t ref_offset_ms = INT64_MIN;

int64_t obx__ref_ms(void) {
    int64_t off = atomic_load(&ref_offset_ms);
    return off == INT64_MIN ? obx__wall_ms() : obx__mono_ms() + off;
}

void obx__ref_sync(int64_t server_ms, int64_t sent_mono_ms, int64_t recv_mono_ms) {
    atomic_store(&ref_offset_ms, server_ms - (sent_mono_ms + (recv_mono_ms - sent_mono_ms) / 2));
}

void obx__iso_ms(int64_t ms, char out[32]) {
    /* outside 0000..9999 (or an unset time) there is no honest calendar date to print */
    if (ms < INT64_C(-62135596800000) || ms > INT64_C(253402300799999)) {
        snprintf(out, 32, "%lld ms", (long long)ms);
        return;
    }
    int64_t sec = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
    time_t t = (time_t)sec;
    struct tm tm;
    if (!gmtime_r(&t, &tm)) {
        snprintf(out, 32, "%lld ms", (long long)ms);
        return;
    }
    snprintf(out, 32, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms - sec * 1000));
}

static _Atomic(obx_log_fn) log_sink;
static void *_Atomic log_user;

void obx_log_set(obx_log_fn fn, void *user) {
    atomic_store(&log_user, user);
    atomic_store(&log_sink, fn);
}

void obx__backend_log(obx__blog_level level, const char *component, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) msg[--n] = '\0';
    obx_log_fn sink = atomic_load(&log_sink);
    if (sink) {
        sink((int)level, component, msg, atomic_load(&log_user));
        return;
    }
    static const char *const names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
    /* one line: a control character in a server's words must not start a forged one */
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
    fprintf(stderr, "%s %s: %s\n", component, names[level], msg);
}
