/*
 * secret.c — secrets kept out of configuration files, command lines and messages.
 *
 * Owns the reference syntax that store URLs, broker URLs and broker properties may carry
 * instead of a literal secret (docs/security.md):
 *
 *   ${NAME}        the environment variable NAME ([A-Za-z_][A-Za-z0-9_]*), which must be set
 *   ${file:PATH}   the contents of the file PATH (at most 64 KiB, no NUL byte), without one
 *                  trailing newline — the usual shape of a mounted secret
 *   $${            a literal "${"; any other '$' is literal
 *
 * Inside a URL a substituted value is percent-encoded (a password may hold '@', '/' or ':'),
 * except when the reference is the whole URL (`db: ${DATABASE_URL}`) and in sqlite:, log: and
 * sim: URLs, whose rest is a file path that nobody decodes. Expansion happens only
 * where a connection is opened (obx__st_open, obx__br_open): configuration, dumps and
 * messages keep the reference, never the value. Messages name the variable or the file, never
 * what it holds. This is the one file of the core that reads the environment and files; the
 * engine never calls it.
 *
 * Also owns the comparison of a presented secret (an HTTP token) with the expected one in time
 * that does not depend on where they differ, and the list of property names that hold secrets.
 */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECRET_FILE_MAX (64 * 1024)

bool obx__secret_equal(const void *a, size_t alen, const void *b, size_t blen) {
    /* Hashing first makes the comparison independent of both lengths and contents; the final
     * compare is libcrypto's constant-time one. */
    unsigned char da[SHA256_DIGEST_LENGTH], db[SHA256_DIGEST_LENGTH];
    SHA256(a ? a : (const void *)"", a ? alen : 0, da);
    SHA256(b ? b : (const void *)"", b ? blen : 0, db);
    return CRYPTO_memcmp(da, db, sizeof da) == 0 && (a != NULL) == (b != NULL);
}

bool obx__secret_key(const char *key) {
    if (!key) return false;
    static const char *const parts[] = {"password",         "passwd", "secret",  "token",
                                        "sasl.oauthbearer", ".pem",   "ssl.key", "private"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (strstr(key, parts[i])) return true;
    return !strcmp(key, "sasl.username") || !strcmp(key, "ssl_key");
}

void obx__secret_free(char *s) {
    if (!s) return;
    OPENSSL_cleanse(s, strlen(s));
    free(s);
}

static obx_err read_secret_file(const char *raw_path, obx__buf *out) {
    char path[256]; /* for messages: the path as given, printable */
    obx__printable(raw_path, strlen(raw_path), path, sizeof path);
    /* O_NONBLOCK: a FIFO named by mistake must not hang the open */
    int fd = open(raw_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return obx__fail(OBX_ECONFIG, "${file:%s}: cannot open: %s", path, strerror(errno));
    struct stat st;
    obx_err e = OBX_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        e = obx__fail(OBX_ECONFIG, "${file:%s}: not a regular file", path);
    else if (st.st_size > SECRET_FILE_MAX)
        e = obx__fail(OBX_ECONFIG, "${file:%s}: %lld bytes, over the limit of %d", path,
                      (long long)st.st_size, SECRET_FILE_MAX);
    unsigned char buf[4096];
    size_t total = 0;
    while (!e) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            e = obx__fail(OBX_ECONFIG, "${file:%s}: cannot read: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        total += (size_t)r;
        if (total > SECRET_FILE_MAX) {
            e = obx__fail(OBX_ECONFIG, "${file:%s}: over the limit of %d bytes", path,
                          SECRET_FILE_MAX);
            break;
        }
        if (memchr(buf, '\0', (size_t)r)) {
            e = obx__fail(OBX_ECONFIG, "${file:%s}: contains a NUL byte", path);
            break;
        }
        obx__buf_put(out, buf, (size_t)r);
    }
    OPENSSL_cleanse(buf, sizeof buf);
    close(fd);
    if (!e && out->oom) e = obx__fail(OBX_ENOMEM, "${file:%s}: out of memory", path);
    if (!e && out->len && out->data[out->len - 1] == '\n') {
        out->len--;
        if (out->len && out->data[out->len - 1] == '\r') out->len--;
    }
    return e;
}

static bool unreserved(unsigned char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

/* Wipes and frees a buffer that may hold a secret. */
static void buf_wipe(obx__buf *b) {
    if (b->data) OPENSSL_cleanse(b->data, b->cap);
    obx__buf_free(b);
}

obx_err obx__secret_expand(const char *in, bool in_url, char **out) {
    *out = NULL;
    if (!in) return OBX_OK;
    /* sqlite:, log: and sim: URLs carry a file path, which is never percent-decoded */
    if (in_url &&
        (!strncmp(in, "sqlite:", 7) || !strncmp(in, "log:", 4) || !strncmp(in, "sim:", 4)))
        in_url = false;
    obx__buf b = {0};
    obx_err e = OBX_OK;
    size_t n = strlen(in);
    for (size_t i = 0; i < n && !e;) {
        if (in[i] == '$' && i + 2 < n && in[i + 1] == '$' && in[i + 2] == '{') {
            obx__buf_put(&b, "${", 2);
            i += 3;
            continue;
        }
        if (!(in[i] == '$' && i + 1 < n && in[i + 1] == '{')) {
            obx__buf_put(&b, in + i, 1);
            i++;
            continue;
        }
        const char *ref = in + i + 2, *close = strchr(ref, '}');
        if (!close) {
            e = obx__fail(OBX_ECONFIG, "'${' at byte %zu has no closing '}'", i);
            break;
        }
        size_t rl = (size_t)(close - ref);
        bool whole = i == 0 && close + 1 == in + n;
        obx__buf val = {0};
        if (rl > 5 && !strncmp(ref, "file:", 5)) {
            char path[1024];
            if (rl - 5 >= sizeof path) {
                e = obx__fail(OBX_ECONFIG, "${file:...}: path longer than %zu bytes",
                              sizeof path - 1);
                break;
            }
            memcpy(path, ref + 5, rl - 5);
            path[rl - 5] = '\0';
            e = read_secret_file(path, &val);
        } else {
            char name[128];
            bool ok = rl > 0 && rl < sizeof name && !(ref[0] >= '0' && ref[0] <= '9');
            for (size_t k = 0; ok && k < rl; k++)
                ok = (ref[k] >= 'A' && ref[k] <= 'Z') || (ref[k] >= 'a' && ref[k] <= 'z') ||
                     (ref[k] >= '0' && ref[k] <= '9') || ref[k] == '_';
            if (!ok) {
                char shown[64];
                e = obx__fail(OBX_ECONFIG,
                              "'${%s}' at byte %zu: expected ${NAME} (an environment variable) or "
                              "${file:PATH}",
                              obx__printable(ref, rl, shown, sizeof shown), i);
                break;
            }
            memcpy(name, ref, rl);
            name[rl] = '\0';
            const char *v = getenv(name);
            if (!v)
                e = obx__fail(OBX_ECONFIG, "${%s}: the environment variable is not set", name);
            else
                obx__buf_puts(&val, v);
        }
        if (!e) {
            if (in_url && !whole) {
                for (size_t k = 0; k < val.len; k++) {
                    if (unreserved(val.data[k]))
                        obx__buf_put(&b, val.data + k, 1);
                    else
                        obx__buf_printf(&b, "%%%02X", val.data[k]);
                }
            } else
                obx__buf_put(&b, val.data, val.len);
        }
        buf_wipe(&val);
        i = (size_t)(close + 1 - in);
    }
    if (!e) obx__buf_put(&b, "", 1);
    if (!e && b.oom) e = obx__fail(OBX_ENOMEM, "secret reference: out of memory");
    if (e) {
        buf_wipe(&b);
        return e;
    }
    *out = (char *)b.data; /* NUL-terminated above; the caller frees with obx__secret_free */
    return OBX_OK;
}
