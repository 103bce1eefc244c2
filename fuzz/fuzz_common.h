/*
 * fuzz_common.h — what the fuzz targets share: a line-oriented input format, deterministic
 * value generators for round-trip properties, and the property checks every target applies.
 *
 * Input format (targets that take named fields): lines "key=value"; a value is any bytes but
 * '\n' (NUL included). A line "--" ends the fields: the rest of the input is a payload.
 * Dictionaries (fuzz/dict/TARGET.dict) hold the keys, so the fuzzer assembles valid-looking input.
 *
 * A violated property aborts with a message: libFuzzer reports it as a crash and keeps the
 * input, exactly like a sanitizer finding.
 */
#ifndef OBX_FUZZ_COMMON_H
#define OBX_FUZZ_COMMON_H

#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROP(cond, ...)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz property violated (%s:%d): ", __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

typedef struct fz_field {
    char key[64];
    const unsigned char *v;
    size_t len;
} fz_field;

typedef struct fz_input {
    fz_field f[48];
    size_t n;
    const unsigned char *rest; /* after a "--" line, else NULL */
    size_t rest_len;
} fz_input;

static inline void fz_parse(const unsigned char *d, size_t n, fz_input *in) {
    memset(in, 0, sizeof *in);
    size_t i = 0;
    while (i < n) {
        const unsigned char *nl = memchr(d + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - d) : n;
        if (end - i == 2 && d[i] == '-' && d[i + 1] == '-') {
            in->rest = d + end + (nl ? 1 : 0);
            in->rest_len = n - (end + (nl ? 1 : 0));
            return;
        }
        const unsigned char *eq = memchr(d + i, '=', end - i);
        if (eq && in->n < sizeof in->f / sizeof in->f[0] && (size_t)(eq - (d + i)) < 64) {
            fz_field *f = &in->f[in->n++];
            memcpy(f->key, d + i, (size_t)(eq - (d + i)));
            f->key[eq - (d + i)] = '\0';
            f->v = eq + 1;
            f->len = end - (size_t)(eq + 1 - d);
        }
        i = end + 1;
    }
}

/* The last value of key as a fresh NUL-terminated heap string (NULL when absent); *len gets
 * its length (a value may hold NUL bytes). */
static inline char *fz_get(const fz_input *in, const char *key, size_t *len) {
    for (size_t i = in->n; i-- > 0;)
        if (!strcmp(in->f[i].key, key)) {
            char *s = malloc(in->f[i].len + 1);
            if (!s) abort();
            memcpy(s, in->f[i].v, in->f[i].len);
            s[in->f[i].len] = '\0';
            if (len) *len = in->f[i].len;
            return s;
        }
    if (len) *len = 0;
    return NULL;
}

static inline long long fz_int(const fz_input *in, const char *key, long long dflt) {
    char *s = fz_get(in, key, NULL);
    long long v = s ? strtoll(s, NULL, 10) : dflt;
    free(s);
    return v;
}

/* Every message obx hands to a human or a log is valid UTF-8 without control characters. */
static inline void fz_printable(const char *what, const char *s) {
    size_t n = strlen(s);
    PROP(obx__utf8_invalid_at((const unsigned char *)s, n) < 0, "%s: invalid UTF-8: %s", what, s);
    for (size_t i = 0; i < n; i++)
        PROP((unsigned char)s[i] >= 0x20 && s[i] != 0x7f, "%s: control byte 0x%02x at %zu", what,
             (unsigned char)s[i], i);
}

/* ---- deterministic generators (round trips) ------------------------------------------------ */

typedef struct fz_gen {
    const unsigned char *d;
    size_t n, i;
} fz_gen;

static inline unsigned fz_byte(fz_gen *g) { return g->i < g->n ? g->d[g->i++] : 0; }

/* A string of [min,max] bytes drawn from tokens (each a short UTF-8 string). */
static inline void fz_string(fz_gen *g, const char *const *tok, size_t ntok, size_t min, size_t max,
                             char *out) {
    size_t want = min + (max > min ? fz_byte(g) % (max - min + 1) : 0), o = 0;
    while (o < want) {
        const char *t = tok[fz_byte(g) % ntok];
        size_t tl = strlen(t);
        if (o + tl > max) t = tok[0], tl = strlen(t); /* tok[0] is one byte */
        if (o + tl > max) break;
        memcpy(out + o, t, tl);
        o += tl;
    }
    out[o] = '\0';
}

static const char *const fz_name_tok[] = {"a", "Z", "0", "9", ".", "_", "-", "q", "X"};
static const char *const fz_type_tok[] = {"a", "z", "0", "9", ".", "_", "-", "v"};
static const char *const fz_text_tok[] = {"a", " ", "/", "@", "'", "\"", ";", "%", "\\",
                                          "é", "€", "😀", "ß", "-", "{",  "}", "$", "*"};
static const char *const fz_b32_tok[] = {"0", "1", "7", "A", "H", "Z", "M", "X"};

static inline void fz_event_id(fz_gen *g, char out[OBX_EVENT_ID_LEN + 1]) {
    memcpy(out, "evt-", 4);
    fz_string(g, fz_b32_tok, 8, 26, 26, out + 4);
    out[4] = "01234567"[fz_byte(g) % 8]; /* the time part must not overflow */
}

static inline void fz_event_type(fz_gen *g, char *out) {
    fz_string(g, fz_type_tok, 8, 1, 100, out);
    size_t l = strlen(out);
    snprintf(out + l, OBX_NAME_MAX + 1 - l, ".v%u", fz_byte(g) % 100);
}

static inline void fz_digest(fz_gen *g, char out[OBX_DIGEST_LEN + 1]) {
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < 64; i++) out[7 + i] = "0123456789abcdef"[fz_byte(g) % 16];
    out[OBX_DIGEST_LEN] = '\0';
}

#endif
