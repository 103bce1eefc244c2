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

int cli_fail(const char *cmd, const char *what, obx_err e) {
    /* `what` is often the --db or --broker URL: never print its password */
    char detail[1024], *red = NULL;
    snprintf(detail, sizeof detail, "%s", obx_errmsg());
    const char *shown = what && obx_url_redact(what, &red) == OBX_OK ? red : "(argument)";
    fprintf(stderr, "obx %s: ", cmd);
    put_printable(stderr, shown);
    fprintf(stderr, ": %s: %s\n", obx_errname(e), *detail ? detail : obx_strerror(e));
    obx_free(red);
    return 1;
}

int cli_usage(const char *cmd, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap); /* it may quote an argument */
    va_end(ap);
    fprintf(stderr, "obx %s: ", cmd);
    put_printable(stderr, msg);
    /* cmd may be "route set": the first word names the command's help */
    fprintf(stderr, "\n(see `obx %.*s --help` or `man obx`)\n", (int)strcspn(cmd, " "), cmd);
    return 2;
}

int cli_read_file(const char *path, unsigned char **out, size_t *len, size_t limit) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "obx: cannot open '%s': %s\n", path, strerror(errno));
        return -1;
    }
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
    if (!buf) {
        fprintf(stderr, "obx: out of memory reading '%s'\n", path);
        return -1;
    }
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
        fprintf(stderr,
                "obx %s: %s: schema version %d, this obx needs %d: run `obx init --db %s`\n", cmd,
                obx_store_url(*out), found, known, obx_store_url(*out));
        obx_store_close(*out);
        *out = NULL;
        return 1;
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
