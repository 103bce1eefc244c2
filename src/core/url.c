/*
 * url.c — store and broker URLs. Every command names its database and broker by URL:
 *   store:  sqlite:PATH | postgres://... | postgresql://...
 *   broker: log:PATH | kafka://HOST:PORT[,HOST:PORT...][?k=v&...] |
 *           amqp[s]://USER:PASS@HOST:PORT[,HOST:PORT...]/VHOST[?k=v&...] | sim:NAME
 * Errors name the bad part of the URL; passwords never appear in messages: every URL a message
 * shows goes through the same redaction as obx_url_redact, then obx__printable.
 *
 * The authority (credentials and hosts) ends at the first '/', '?' or '#'; the credentials end
 * at its last '@'. A password holding one of those three characters must be percent-encoded
 * (RFC 3986): a URL whose authority does not look like a host list while an '@' follows later
 * is refused as such, without echoing it, and redaction then hides everything up to that '@'.
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pct_decode(const char *in, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = in[i];
        if (c == '%') {
            unsigned char v;
            size_t l;
            char h[3] = {0};
            if (i + 2 >= n) return -1;
            h[0] = in[i + 1];
            h[1] = in[i + 2];
            if (obx__unhex(h, &v, 1, &l)) return -1;
            c = (char)v;
            i += 2;
        }
        if (o + 1 >= cap) return -1;
        out[o++] = c;
    }
    out[o] = '\0';
    return 0;
}

static obx_err check_hostport(const char *url_kind, const char *hp, size_t n) {
    char sh[160];
    obx__printable(hp, n, sh, sizeof sh); /* the host part holds no credentials here */
    const char *colon = memchr(hp, ':', n);
    if (!colon || colon == hp)
        return obx__fail(OBX_EURL, "%s URL: host '%s' needs HOST:PORT", url_kind, sh);
    size_t pl = n - (size_t)(colon + 1 - hp);
    if (pl == 0 || pl > 5)
        return obx__fail(OBX_EURL, "%s URL: port in '%s' is missing or too long", url_kind, sh);
    long port = 0;
    for (size_t i = 0; i < pl; i++) {
        char c = colon[1 + i];
        if (c < '0' || c > '9')
            return obx__fail(OBX_EURL, "%s URL: port in '%s' is not a number", url_kind, sh);
        port = port * 10 + (c - '0');
    }
    if (port < 1 || port > 65535)
        return obx__fail(OBX_EURL, "%s URL: port %ld in '%s' is outside 1..65535", url_kind, port,
                         sh);
    for (const char *p = hp; p < colon; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-' || *p == '_'))
            return obx__fail(OBX_EURL, "%s URL: host '%s' has a character outside [A-Za-z0-9.-]",
                             url_kind, obx__printable(hp, (size_t)(colon - hp), sh, sizeof sh));
    return OBX_OK;
}

/* "h:5432,h2:5433" / "h" / "[::1]:5432": what an authority without credentials looks like. */
static bool hostlist_like(const char *s, size_t n) {
    bool port = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == ',')
            port = false;
        else if (c == ':' && s[0] != '[')
            port = true;
        else if (port ? !(c >= '0' && c <= '9')
                      : !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                          (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_' || c == '[' ||
                          c == ']' || c == ':'))
            return false;
    }
    return true;
}

/* Parses "[user[:pass]@]hosts[/path][?query]" after "scheme://". */
static obx_err parse_authority(const char *kind, const char *s, obx__url *u, bool need_port) {
    const char *aend = s + strcspn(s, "/?#");
    const char *at = NULL;
    for (const char *p = s; p < aend; p++)
        if (*p == '@') at = p; /* the last '@' ends the credentials */
    if (!at && strchr(aend, '@') && !hostlist_like(s, (size_t)(aend - s)))
        return obx__fail(OBX_EURL,
                         "%s URL: the user name or password holds an unencoded '/', '?' or '#' "
                         "(percent-encode it: %%2F, %%3F, %%23)",
                         kind);
    const char *q = strchr(aend, '?');
    const char *end = q ? q : aend + strlen(aend);
    if (q && obx__strlcpy(u->query, q + 1, sizeof u->query) >= sizeof u->query)
        return obx__fail(OBX_EURL, "%s URL: query too long", kind);
    const char *hosts = s;
    if (at) {
        const char *colon = memchr(s, ':', (size_t)(at - s));
        const char *uend = colon ? colon : at;
        if (pct_decode(s, (size_t)(uend - s), u->user, sizeof u->user))
            return obx__fail(OBX_EURL, "%s URL: user part is malformed (bad %%-escape or too long)",
                             kind);
        if (colon &&
            pct_decode(colon + 1, (size_t)(at - colon - 1), u->password, sizeof u->password))
            return obx__fail(OBX_EURL,
                             "%s URL: password part is malformed (bad %%-escape or too "
                             "long)",
                             kind);
        hosts = at + 1;
    }
    const char *slash = *aend == '/' ? aend : NULL;
    const char *hend = aend;
    if (hend == hosts) return obx__fail(OBX_EURL, "%s URL: host part is empty", kind);
    if ((size_t)(hend - hosts) >= sizeof u->hosts)
        return obx__fail(OBX_EURL, "%s URL: host list too long", kind);
    memcpy(u->hosts, hosts, (size_t)(hend - hosts));
    u->hosts[hend - hosts] = '\0';
    if (need_port) {
        const char *h = u->hosts;
        while (*h) {
            const char *comma = strchr(h, ',');
            size_t n = comma ? (size_t)(comma - h) : strlen(h);
            obx_err rc = check_hostport(kind, h, n);
            if (rc) return rc;
            h += n + (comma ? 1 : 0);
            if (comma && !*h) return obx__fail(OBX_EURL, "%s URL: host list ends with ','", kind);
        }
    }
    if (slash && pct_decode(slash + 1, (size_t)(end - slash - 1), u->vhost, sizeof u->vhost))
        return obx__fail(OBX_EURL, "%s URL: path part is malformed", kind);
    return OBX_OK;
}

/* Writes url with its secrets replaced by "***" into out (cap >= 2 * strlen(url) + 16):
 * the password of the credentials (see the top of this file for a password that was not
 * percent-encoded) and the value of every query parameter named like a secret (password=,
 * sslpassword=, sasl.password=: obx__secret_key). */
static void redact_into(const char *url, char *out, size_t cap) {
    const char *ss = strstr(url, "://");
    const char *start = ss ? ss + 3 : strchr(url, ':');
    if (start && !ss) start++;
    const char *from = NULL, *to = NULL; /* the span [from, to) becomes "***" */
    const char *query = NULL;            /* parameters are redacted from here on */
    if (start) {
        const char *aend = start + strcspn(start, "/?#");
        query = strchr(aend, '?');
        const char *at = NULL;
        for (const char *p = start; p < aend; p++)
            if (*p == '@') at = p;
        const char *colon = at ? memchr(start, ':', (size_t)(at - start)) : NULL;
        if (colon) {
            from = colon + 1;
            to = at;
        } else if (!at && strchr(aend, '@') && !hostlist_like(start, (size_t)(aend - start)) &&
                   (colon = memchr(start, ':', (size_t)(aend - start)))) {
            from = colon + 1;
            to = strrchr(aend, '@');
        }
    }
    size_t o = 0;
    for (const char *p = url; *p && o + 4 < cap;) {
        if (p == from && from < to) {
            memcpy(out + o, "***", 3);
            o += 3;
            p = to;
            from = NULL;
            continue;
        }
        if (query && p >= query && (*p == '?' || *p == '&')) {
            /* a query parameter whose name says it holds a secret: keep the name only */
            const char *k = p + 1, *eq = k + strcspn(k, "=&");
            char key[64];
            size_t kl = (size_t)(eq - k);
            if (*eq == '=' && kl < sizeof key) {
                memcpy(key, k, kl);
                key[kl] = '\0';
                if (obx__secret_key(key) && o + kl + 6 < cap) {
                    memcpy(out + o, p, kl + 2);
                    o += kl + 2;
                    memcpy(out + o, "***", 3);
                    o += 3;
                    p = eq + 1 + strcspn(eq + 1, "&");
                    continue;
                }
            }
        }
        out[o++] = *p++;
    }
    out[o] = '\0';
}

/* url as a message may show it: redacted, printable, bounded. */
static const char *shown(const char *url, char *buf, size_t cap) {
    size_t n = strnlen(url, 400), rc = 2 * n + 16;
    char *red = malloc(rc);
    if (!red) return obx__strlcpy(buf, "(URL not shown)", cap), buf;
    char *cut = obx__strdup(url);
    if (cut) cut[n] = '\0';
    redact_into(cut ? cut : "", red, rc);
    free(cut);
    obx__printable(red, strlen(red), buf, cap);
    free(red);
    return buf;
}

obx_err obx__url_parse(const char *url, const char *kind, obx__url *u) {
    memset(u, 0, sizeof *u);
    if (!url || !*url) return obx__fail(OBX_EURL, "%s URL: empty", kind ? kind : "");
    bool store = kind && !strcmp(kind, "store");
    if (obx__strlcpy(u->raw, url, sizeof u->raw) >= sizeof u->raw)
        return obx__fail(OBX_EURL, "%s URL: longer than %zu bytes", kind, sizeof u->raw - 1);
    char sh[256];
    const char *colon = strchr(url, ':');
    if (!colon)
        return obx__fail(OBX_EURL, "%s URL '%s': no scheme (expected %s)", kind,
                         shown(url, sh, sizeof sh),
                         store ? "sqlite:PATH or postgres://..."
                               : "log:PATH, kafka://HOST:PORT or amqp://USER:PASS@HOST:PORT/VHOST");
    size_t sl = (size_t)(colon - url);
#define IS(s) (sl == strlen(s) && !strncmp(url, s, sl))
    if (store) {
        if (IS("sqlite")) {
            const char *p = colon + 1;
            if (!strncmp(p, "//", 2)) p += 2;
            if (!*p)
                return obx__fail(OBX_EURL, "store URL '%s': the path after 'sqlite:' is empty",
                                 shown(url, sh, sizeof sh));
            u->scheme = OBX__URL_SQLITE;
            obx__strlcpy(u->path, p, sizeof u->path);
            return OBX_OK;
        }
        if (IS("postgres") || IS("postgresql")) {
            if (strncmp(colon, "://", 3))
                return obx__fail(OBX_EURL, "store URL: '%.*s:' must be followed by '//'", (int)sl,
                                 url); /* the scheme: postgres or postgresql */
            u->scheme = OBX__URL_POSTGRES;
            const char *rest = colon + 3;
            /* libpq parses the rest; extract credentials for redaction and a sanity check */
            obx__url tmp;
            memset(&tmp, 0, sizeof tmp);
            if (*rest && *rest != '/' && *rest != '?') {
                obx_err rc = parse_authority("store", rest, &tmp, false);
                if (rc) return rc;
            }
            /* libpq decodes the query itself and echoes a bad %-escape in its message: refuse
             * it here, without echo (it may sit in sslpassword=) */
            char scratch[sizeof tmp.query];
            if (pct_decode(tmp.query, strlen(tmp.query), scratch, sizeof scratch))
                return obx__fail(OBX_EURL, "store URL: a query parameter has a bad %%-escape");
            memcpy(u->user, tmp.user, sizeof u->user);
            memcpy(u->password, tmp.password, sizeof u->password);
            memcpy(u->hosts, tmp.hosts, sizeof u->hosts);
            memcpy(u->query, tmp.query, sizeof u->query);
            obx__strlcpy(u->path, tmp.vhost, sizeof u->path);
            return OBX_OK;
        }
        return obx__fail(OBX_EURL,
                         "store URL: unknown scheme '%s' (expected sqlite: or postgres://)",
                         obx__printable(url, sl < 40 ? sl : 40, sh, sizeof sh));
    }
    if (IS("log") || IS("sim")) {
        const char *p = colon + 1;
        if (!strncmp(p, "//", 2)) p += 2;
        if (!*p)
            return obx__fail(OBX_EURL, "broker URL '%s': the path after the scheme is empty",
                             shown(url, sh, sizeof sh));
        u->scheme = IS("log") ? OBX__URL_LOG : OBX__URL_SIM;
        const char *q = strchr(p, '?');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n >= sizeof u->path) return obx__fail(OBX_EURL, "broker URL: path too long");
        memcpy(u->path, p, n);
        u->path[n] = '\0';
        if (q) obx__strlcpy(u->query, q + 1, sizeof u->query);
        return OBX_OK;
    }
    if (IS("kafka") || IS("amqp") || IS("amqps")) {
        if (strncmp(colon, "://", 3))
            return obx__fail(OBX_EURL, "broker URL '%s': the scheme must be followed by '//'",
                             shown(url, sh, sizeof sh));
        u->scheme = IS("kafka") ? OBX__URL_KAFKA : IS("amqp") ? OBX__URL_AMQP : OBX__URL_AMQPS;
        obx_err rc = parse_authority("broker", colon + 3, u, true);
        if (rc) return rc;
        if (u->scheme == OBX__URL_KAFKA && (u->user[0] || u->password[0]))
            return obx__fail(
                OBX_EURL,
                "broker URL: kafka:// takes no credentials in the URL (use sasl.* properties)");
        return OBX_OK; /* several hosts: Kafka's bootstrap list, a RabbitMQ cluster's nodes */
    }
#undef IS
    return obx__fail(OBX_EURL,
                     "broker URL: unknown scheme '%s' (expected log:, kafka://, amqp:// or "
                     "amqps://)",
                     obx__printable(url, sl < 40 ? sl : 40, sh, sizeof sh));
}

obx_err obx_url_check(const char *url, const char *kind) {
    obx__url u;
    if (!kind || (strcmp(kind, "store") && strcmp(kind, "broker")))
        return obx__fail(OBX_EINVAL, "kind: must be \"store\" or \"broker\"");
    /* a URL that is one ${...} reference as a whole is known only when it is opened */
    if (url && !strncmp(url, "${", 2) && strchr(url, '}') == url + strlen(url) - 1) return OBX_OK;
    return obx__url_parse(url, kind, &u);
}

obx_err obx_url_redact(const char *url, char **out) {
    if (!url || !out) return obx__fail(OBX_EINVAL, "url/out: NULL");
    *out = NULL;
    size_t cap = 2 * strlen(url) + 16;
    char *red = malloc(cap);
    if (!red) return obx__fail(OBX_ENOMEM, "out of memory");
    redact_into(url, red, cap);
    *out = red;
    return OBX_OK;
}
