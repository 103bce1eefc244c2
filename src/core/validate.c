/*
 * validate.c — the documented input set. Every field check names the field, the limit and
 * the first offending byte, so that a producer sees exactly what to fix.
 *
 *   name        [A-Za-z0-9._-]                      tenant, aggregate type, cluster, topic, ...
 *   event type  [a-z0-9._-] ending in ".v<digits>"  order.created.v2
 *   text        valid UTF-8 without control chars   aggregate id, routing key, correlation id
 *   owner       [A-Za-z0-9._:@/-]                   relay/dispatcher owner names
 */
#include "core.h"

#include <string.h>

long obx__utf8_invalid_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned min;
        unsigned cp;
        if ((c & 0xe0) == 0xc0) {
            len = 2;
            min = 0x80;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3;
            min = 0x800;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4;
            min = 0x10000;
            cp = c & 0x07;
        } else
            return (long)i;
        if (i + len > n) return (long)i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return (long)i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return (long)i;
        i += len;
    }
    return -1;
}

static bool in_set(unsigned char c, obx__charset cs) {
    bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    bool upper = c >= 'A' && c <= 'Z';
    switch (cs) {
    case OBX__CS_NAME: return alnum || upper || c == '.' || c == '_' || c == '-';
    case OBX__CS_EVENT_TYPE: return alnum || c == '.' || c == '_' || c == '-';
    case OBX__CS_OWNER:
        return alnum || upper || c == '.' || c == '_' || c == '-' || c == ':' || c == '@' ||
               c == '/';
    case OBX__CS_TEXT: return c >= 0x20 && c != 0x7f;
    }
    return false;
}

static const char *set_desc(obx__charset cs) {
    switch (cs) {
    case OBX__CS_NAME: return "[A-Za-z0-9._-]";
    case OBX__CS_EVENT_TYPE: return "[a-z0-9._-] ending in .v<N>";
    case OBX__CS_OWNER: return "[A-Za-z0-9._:@/-]";
    case OBX__CS_TEXT: return "UTF-8 text without control characters";
    }
    return "?";
}

obx_err obx__check_field(const char *name, const char *v, size_t min, size_t max, obx__charset cs) {
    if (!v) {
        if (min == 0) return OBX_OK;
        return obx__fail(OBX_EINVAL, "%s: missing (required, %zu..%zu bytes)", name, min, max);
    }
    size_t n = strlen(v);
    if (n < min) {
        if (n == 0)
            return obx__fail(OBX_EINVAL, "%s: empty (required, %zu..%zu bytes)", name, min, max);
        return obx__fail(OBX_EINVAL, "%s: %zu bytes, at least %zu required", name, n, min);
    }
    if (n > max)
        return obx__fail(OBX_ETOOBIG, "%s: %zu bytes, over the limit of %zu", name, n, max);
    if (cs == OBX__CS_TEXT) {
        long bad = obx__utf8_invalid_at((const unsigned char *)v, n);
        if (bad >= 0) return obx__fail(OBX_EINVAL, "%s: invalid UTF-8 at byte %ld", name, bad);
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (cs == OBX__CS_TEXT && c >= 0x80) continue;
        if (!in_set(c, cs))
            return obx__fail(OBX_EINVAL,
                             "%s: byte 0x%02x at offset %zu is outside the allowed set %s", name, c,
                             i, set_desc(cs));
    }
    if (cs == OBX__CS_EVENT_TYPE) {
        const char *dot = strrchr(v, '.');
        bool ok = dot && dot[1] == 'v' && dot[2];
        for (const char *p = dot ? dot + 2 : ""; ok && *p; p++) ok = *p >= '0' && *p <= '9';
        if (!ok)
            return obx__fail(OBX_EINVAL,
                             "%s: '%s' is not versioned (must end in .v<N>, e.g. order.created.v2)",
                             name, v);
    }
    return OBX_OK;
}

bool obx__is_digest(const char *s) {
    if (!s || strncmp(s, "sha256:", 7) != 0 || strlen(s) != OBX_DIGEST_LEN) return false;
    for (const char *p = s + 7; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return false;
    return true;
}

bool obx__is_traceparent(const char *s) {
    bool ok = s && strlen(s) == OBX_TRACEPARENT_LEN && s[2] == '-' && s[35] == '-' && s[52] == '-';
    for (int i = 0; ok && i < OBX_TRACEPARENT_LEN; i++)
        if (i != 2 && i != 35 && i != 52)
            ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
    return ok;
}
