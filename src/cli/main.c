/*
 * main.c — `obx`, the command-line tool. It uses only the public API (include/obx.h): what it
 * can do, any program linked with libobx can do.
 */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Writes s to f with control bytes as \xNN: an argument must not drive the terminal. */
static void put_printable(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
}

int cli_exit_of(obx_err e) {
    switch (e) {
    case OBX_OK: return CLI_EXIT_OK;
    /* the command line (or the configuration it names) asks for something malformed */
    case OBX_EINVAL:
    case OBX_ETOOBIG:
    case OBX_EURL:
    case OBX_ECONFIG:
    case OBX_EUNSUPPORTED: return CLI_EXIT_USAGE;
    /* the outbox was read and says no: a finding, a refusal, nothing that matches */
    case OBX_ENOROUTE:
    case OBX_ESTALE:
    case OBX_ECONFLICT:
    case OBX_ENOTFOUND:
    case OBX_EIMMUTABLE:
    case OBX_EREFUSED:
    case OBX_EQUARANTINE:
    case OBX_EHANDLER:
    case OBX_ECONTRACT:
    case OBX_ETENANT:
    case OBX_EFINDINGS:
    case OBX_EINVARIANT:
    case OBX_EPOISON: return CLI_EXIT_FINDING;
    /* could not look: unreachable, busy, wrong schema, I/O, memory, a lost connection */
    default: return CLI_EXIT_UNCHECKED;
    }
}

/* Writes "obx <cmd>: <msg>\n" to stderr, the message with control bytes escaped, and the hint
 * (where to read on) on a line of its own. */
static int report(const char *cmd, int rc, const char *code, const char *msg, const char *hint) {
    (void)code;
    fprintf(stderr, "obx %s: ", cmd);
    put_printable(stderr, msg);
    fputc('\n', stderr);
    if (hint) fprintf(stderr, "%s\n", hint);
    return rc;
}

int cli_error(const char *cmd, int rc, const char *code, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return report(cmd, rc, code, msg, NULL);
}

int cli_fail(const char *cmd, const char *what, obx_err e) {
    /* `what` is often the --db or --broker URL: never print its password */
    char detail[1024], *red = NULL;
    snprintf(detail, sizeof detail, "%s", obx_errmsg());
    const char *shown = what && obx_url_redact(what, &red) == OBX_OK ? red : "(argument)";
    int rc = cli_error(cmd, cli_exit_of(e), obx_errname(e), "%s: %s: %s", shown, obx_errname(e),
                       *detail ? detail : obx_strerror(e));
    obx_free(red);
    return rc;
}

int cli_usage(const char *cmd, const char *fmt, ...) {
    char msg[1024], hint[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap); /* it may quote an argument */
    va_end(ap);
    /* cmd may be "route set": the first word names the command's help */
    snprintf(hint, sizeof hint, "(see `obx %.*s --help` or `man obx`)", (int)strcspn(cmd, " "),
             cmd);
    return report(cmd, CLI_EXIT_USAGE, "usage", msg, hint);
}

int cli_read_file(const char *cmd, const char *path, unsigned char **out, size_t *len,
                  size_t limit) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f)
        return cli_error(cmd, CLI_EXIT_USAGE, "usage", "cannot open '%s': %s", path,
                         strerror(errno));
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (n == cap) {
            if (cap > limit + 1) break; /* read one byte past the limit to report it */
            unsigned char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = p;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (f != stdin) fclose(f);
    if (!buf)
        return cli_error(cmd, CLI_EXIT_UNCHECKED, "OBX_ENOMEM", "out of memory reading '%s'", path);
    *out = buf;
    *len = n;
    return 0;
}

int cli_open_store(const char *cmd, const char *url, obx_store **out) {
    obx_err e = obx_store_open(url, out);
    if (e) return cli_fail(cmd, url, e);
    int found = 0, known = 0;
    e = obx_store_schema_version(*out, &found, &known);
    if (!e && found != known) {
        int rc = cli_error(cmd, CLI_EXIT_UNCHECKED, "OBX_ESCHEMA",
                           "%s: schema version %d, this obx needs %d: run `obx init --db %s`",
                           obx_store_url(*out), found, known, obx_store_url(*out));
        obx_store_close(*out);
        *out = NULL;
        return rc;
    }
    if (e) {
        obx_store_close(*out);
        *out = NULL;
        return cli_fail(cmd, url, e);
    }
    return 0;
}

/* `obx COMMAND ... --help` (or -h) anywhere before a "--": that command's help, nothing run. */
static bool wants_help(int argc, char **argv) {
    for (int i = 2; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        cli_help_general(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return cmd_help(1, argv + 1);
    if (!strcmp(argv[1], "--version")) return cmd_version(1, argv + 1);
    const cli_command *c = cli_find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "obx: unknown command '");
        put_printable(stderr, argv[1]);
        fprintf(stderr, "'\n\n");
        cli_help_general(stderr);
        return 2;
    }
    if (wants_help(argc, argv)) {
        cli_help_command(stdout, c);
        return 0;
    }
    return c->fn(argc - 1, argv + 1);
}
