/*
 * fuzz_url.c — store and broker URLs (obx__url_parse, obx_url_check, obx_url_redact in
 * src/core/url.c) and secret references (obx__secret_expand, src/core/secret.c): they come
 * from command lines, configuration files and environment variables.
 *
 * Properties, per input:
 *   1. any bytes as a store and as a broker URL: parsed or refused with a printable message;
 *      a parsed URL's parts fit their buffers and the redacted form parses to the same scheme;
 *   2. a password never shows: for URL = scheme://user:SECRET@REST (SECRET without the
 *      characters a URL must percent-encode in credentials: '/', '?', '#'), neither the
 *      redacted URL nor any parse error contains SECRET;
 *   3. ${...} expansion of arbitrary text never crashes, and its messages never contain the
 *      value of the variable it read.
 */
#include "fuzz_common.h"

#include <stdbool.h>

static const char *const schemes[] = {"postgres://", "postgresql://", "amqp://", "amqps://",
                                      "kafka://"};

static void parse_any(const char *s) {
    static const char *const kinds[] = {"store", "broker"};
    for (int k = 0; k < 2; k++) {
        obx__url u;
        obx__clear_error();
        obx_err e = obx__url_parse(s, kinds[k], &u);
        if (e) {
            PROP(e == OBX_EURL, "%s", obx_errname(e));
            fz_printable("url error", obx_errmsg());
            continue;
        }
        PROP(memchr(u.path, 0, sizeof u.path) && memchr(u.hosts, 0, sizeof u.hosts) &&
                 memchr(u.password, 0, sizeof u.password),
             "unterminated part");
        char *red = NULL;
        PROP(obx_url_redact(s, &red) == OBX_OK, "redact failed");
        if (!u.password[0] || !strstr(s, "***")) {
            obx__url r;
            obx_err e2 = obx__url_parse(red, kinds[k], &r);
            PROP(!e2 && r.scheme == u.scheme, "redacted URL '%s' does not parse like '%s': %s", red,
                 s, obx_errmsg());
        }
        obx_free(red);
    }
}

/* What a password must percent-encode, and '%' itself: with these left out, SECRET and the
 * decoy make the same URL structure, so their messages differ only where a password shows. */
static bool must_encode(unsigned char c) { return c == '/' || c == '?' || c == '#' || c == '%'; }

static size_t occurrences(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* The message for url, into out. */
static void message_of(const char *url, const char *kind, char *out, size_t cap) {
    obx__url u;
    obx__clear_error();
    out[0] = '\0';
    if (obx__url_parse(url, kind, &u)) obx__strlcpy(out, obx_errmsg(), cap);
}

/* Differential: the same URL with SECRET replaced by a decoy of the same length must show the
 * secret no fewer times (so an occurrence that is part of the message's own words, or of the
 * host, does not count as a leak). */
static void secret_hidden(const unsigned char *d, size_t n) {
    if (n < 4) return;
    size_t sl = 3 + d[0] % 24; /* SECRET: 3..26 bytes */
    if (sl + 2 > n) return;
    char secret[32], decoy[32];
    for (size_t i = 0; i < sl; i++) {
        unsigned char c = d[2 + i];
        if (!c || must_encode(c) || c == '~') c = 'x';
        secret[i] = (char)c;
        decoy[i] = '~';
    }
    secret[sl] = decoy[sl] = '\0';
    const char *scheme = schemes[d[1] % 5];
    const char *rest = (const char *)d + 2 + sl;
    size_t rl = n - 2 - sl;
    if (memchr(rest, 0, rl) || memchr(rest, '~', rl)) return;
    char url[1400], url2[1400];
    int w = snprintf(url, sizeof url, "%suser:%s@%.*s", scheme, secret, (int)rl, rest);
    if (w < 0 || (size_t)w >= sizeof url) return;
    snprintf(url2, sizeof url2, "%suser:%s@%.*s", scheme, decoy, (int)rl, rest);
    char *red = NULL, *red2 = NULL;
    PROP(obx_url_redact(url, &red) == OBX_OK && obx_url_redact(url2, &red2) == OBX_OK, "redact");
    PROP(occurrences(red, secret) <= occurrences(red2, secret),
         "redacted '%s' shows the password of '%s'", red, url);
    obx_free(red);
    obx_free(red2);
    for (int k = 0; k < 2; k++) {
        char m1[1024], m2[1024];
        message_of(url, k ? "broker" : "store", m1, sizeof m1);
        message_of(url2, k ? "broker" : "store", m2, sizeof m2);
        PROP(occurrences(m1, secret) <= occurrences(m2, secret), "error shows the password: %s",
             m1);
    }
}

static void expand_any(const char *s) {
    static const char value[] = "V4lue-0f-th3-Var";
    setenv("OBX_FUZZ_VAR", value, 1);
    for (int in_url = 0; in_url < 2; in_url++) {
        char *out = NULL;
        obx__clear_error();
        obx_err e = obx__secret_expand(s, in_url, &out);
        if (e) {
            PROP(e == OBX_ECONFIG, "%s", obx_errname(e));
            PROP(!out, "output on error");
            fz_printable("expand error", obx_errmsg());
            PROP(strstr(s, value) || !strstr(obx_errmsg(), value), "message shows a value: %s",
                 obx_errmsg());
        } else {
            PROP(out, "no output");
            if (!strstr(s, "${")) PROP(!strcmp(out, s), "changed without a reference");
        }
        obx__secret_free(out);
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = '\0';
    parse_any(s);
    expand_any(s);
    free(s);
    secret_hidden(data, size);
    return 0;
}
