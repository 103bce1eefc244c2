/*
 * text.c — outside input on its way into messages and text columns. Owns two copies:
 *
 *   obx__printable  for echoing a value in an error message or a log line: control characters,
 *                   DEL and bytes outside valid UTF-8 become "\xNN", so that a hostile value
 *                   cannot write terminal escape sequences or break a JSON log line;
 *   obx__text_copy  for text columns filled from outside input (a handler's result, a broker's
 *                   reason): invalid bytes and control characters become '?', and the copy is
 *                   never cut inside a UTF-8 sequence — PostgreSQL refuses invalid UTF-8 in a
 *                   TEXT column, and one refused row would stall a consumer on that message.
 */
#include "core.h"

#include <stdio.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s[0..n), 0 when s[0] does not start one. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    long bad = obx__utf8_invalid_at(s, n < 4 ? n : 4);
    size_t len = (s[0] & 0xe0) == 0xc0   ? 2
                 : (s[0] & 0xf0) == 0xe0 ? 3
                 : (s[0] & 0xf8) == 0xf0 ? 4
                                         : 0;
    if (!len || len > n) return 0;
    /* obx__utf8_invalid_at reports the first bad sequence: ours is fine if that is later */
    return bad < 0 || (size_t)bad >= len ? len : 0;
}

static bool is_control(unsigned char c) { return c < 0x20 || c == 0x7f; }

const char *obx__printable(const char *s, size_t n, char *out, size_t cap) {
    if (!cap) return out;
    out[0] = '\0';
    if (!s) return out;
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0, i = 0;
    while (i < n) {
        size_t len = is_control(p[i]) ? 0 : utf8_len(p + i, n - i);
        size_t need = len ? len : 4;
        if (o + need + 4 > cap) { /* this character, "..." and the NUL would not fit */
            size_t k = cap - 1 - o < 3 ? cap - 1 - o : 3;
            memcpy(out + o, "...", k);
            o += k;
            break;
        }
        if (len) {
            memcpy(out + o, p + i, len);
            o += len;
            i += len;
        } else {
            snprintf(out + o, 5, "\\x%02x", p[i]);
            o += 4;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

void obx__text_copy(char *dst, const char *src, size_t cap) {
    if (!cap) return;
    size_t o = 0, n = src ? strlen(src) : 0;
    const unsigned char *p = (const unsigned char *)src;
    for (size_t i = 0; i < n;) {
        size_t len = is_control(p[i]) ? 0 : utf8_len(p + i, n - i);
        size_t take = len ? len : 1;
        if (o + take >= cap) break; /* a character that does not fit whole is left out */
        if (len)
            memcpy(dst + o, p + i, len);
        else
            dst[o] = '?';
        o += take;
        i += take;
    }
    dst[o] = '\0';
}

void obx__utf8_trim(char *s) {
    size_t n = strlen(s), k = 0;
    /* back up over continuation bytes to the last lead byte; drop it when incomplete */
    while (k < n && k < 4 && ((unsigned char)s[n - 1 - k] & 0xc0) == 0x80) k++;
    if (k == n) return;
    unsigned char lead = (unsigned char)s[n - 1 - k];
    size_t want = lead < 0x80 ? 1 : (lead & 0xe0) == 0xc0 ? 2 : (lead & 0xf0) == 0xe0 ? 3 : 4;
    if (lead >= 0x80 && k + 1 < want) s[n - 1 - k] = '\0';
}
