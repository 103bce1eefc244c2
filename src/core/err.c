/*
 * err.c — the error list's names and messages, and the per-thread detail message behind
 * obx_errmsg(). Codes are the return channel; the detail message only explains them.
 */
#include "core.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char tls_msg[1024];

typedef struct {
    obx_err code;
    const char *name;
    int retriable;
    const char *msg;
} err_info;

static const err_info err_table[] = {
#define OBX__ROW(name, num, retr, msg) {name, #name, retr, msg},
    OBX_ERROR_LIST(OBX__ROW)
#undef OBX__ROW
};

static const err_info *find(obx_err e) {
    for (size_t i = 0; i < sizeof err_table / sizeof err_table[0]; i++)
        if (err_table[i].code == e) return &err_table[i];
    return NULL;
}

const char *obx_strerror(obx_err e) {
    const err_info *i = find(e);
    return i ? i->msg : "unknown error code";
}

const char *obx_errname(obx_err e) {
    const err_info *i = find(e);
    return i ? i->name : "OBX_E?";
}

/* Compiled into the library: a program built against an older header still learns what runs. */
const char *obx_libversion(void) { return OBX_VERSION_STRING; }

int obx_err_is_retriable(obx_err e) {
    const err_info *i = find(e);
    return i ? i->retriable : 0;
}

const char *obx_errmsg(void) { return tls_msg; }

void obx__clear_error(void) { tls_msg[0] = '\0'; }

obx_err obx_error_set(obx_err e, const char *msg) {
    if (msg == tls_msg) return e; /* obx_errmsg() itself: already there */
    snprintf(tls_msg, sizeof tls_msg, "%s", msg ? msg : obx_strerror(e));
    return e;
}

obx_err obx__failv(obx_err e, const char *fmt, va_list ap) {
    if (fmt)
        vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
    else
        snprintf(tls_msg, sizeof tls_msg, "%s", obx_strerror(e));
    return e;
}

obx_err obx__fail(obx_err e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    obx__failv(e, fmt, ap);
    va_end(ap);
    return e;
}

obx_err obx__fail_prefix(obx_err e, const char *fmt, ...) {
    char prefix[512], old[sizeof tls_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tls_msg, sizeof old);
    snprintf(tls_msg, sizeof tls_msg, "%s: %s", prefix, old[0] ? old : obx_strerror(e));
    return e;
}
