/*
 * main.c — `obx`, the command-line tool. It uses only the public API (include/obx.h): what it
 * can do, any program linked with libobx can do.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How errors reach stderr: text lines; JSON objects (a command run with --json: a program
 * reads them); or JSON log records (the relay with log.format=json: every line it writes is
 * one). */
static enum { ERR_TEXT, ERR_JSON, ERR_LOG } err_format;

void cli_errors_json(bool log_record) { err_format = log_record ? ERR_LOG : ERR_JSON; }
bool cli_errors_are_json(void) { return err_format != ERR_TEXT; }

/* The length of the valid UTF-8 sequence at p (1..4), or 0 when it is not one. */
static int utf8_len(const unsigned char *p) {
    int n = p[0] < 0x80             ? 1
            : (p[0] & 0xe0) == 0xc0 ? 2
            : (p[0] & 0xf0) == 0xe0 ? 3
            : (p[0] & 0xf8) == 0xf0 ? 4
                                    : 0;
    if (n == 2 && p[0] < 0xc2) return 0; /* overlong */
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    return n;
}

/* s into out (cap bytes) with invalid UTF-8 and (unless json: JSON escapes them) control bytes
 * as \xNN: an argument must not drive the terminal, and a JSON document must stay UTF-8. */
static void printable(char *out, size_t cap, const char *s, bool json) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 5 < cap;) {
        int n = utf8_len(p);
        if (n == 1 && ((*p >= 0x20 && *p != 0x7f) || json))
            out[o++] = (char)*p++;
        else if (n > 1 && o + (size_t)n < cap) {
            memcpy(out + o, p, (size_t)n);
            o += (size_t)n;
            p += n;
        } else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", *p++);
    }
    out[o] = '\0';
}

static void put_printable(FILE *f, const char *s) {
    char buf[4096];
    printable(buf, sizeof buf, s, false);
    fputs(buf, f);
}

/* What getopt found wrong in the last call of cli_getopt (empty: nothing); cli_usage says it. */
static char bad_option[160];

int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts) {
    opterr = 0; /* getopt's own message would be a text line before a JSON error */
    optopt = 0;
    int c = getopt_long(argc, argv, shortopts, longopts, NULL);
    if (c != '?') return c;
    const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
    if (!strncmp(arg, "--", 2)) {
        int len = (int)strcspn(arg, "=");
        snprintf(bad_option, sizeof bad_option,
                 !optopt           ? "unknown option '%.*s'"
                 : arg[len] == '=' ? "option '%.*s' takes no value"
                                   : "option '%.*s' needs a value",
                 len > 100 ? 100 : len, arg);
    } else if (optopt > 0 && optopt < 128 && strchr(shortopts, optopt))
        snprintf(bad_option, sizeof bad_option, "option '-%c' needs a value", optopt);
    else
        snprintf(bad_option, sizeof bad_option, "unknown option '-%c'",
                 optopt > 0 && optopt < 128 ? optopt : '?');
    return c;
}

void cli_iso_ms(long long ms, char out[32]) {
    if (!ms) {
        snprintf(out, 32, "-");
        return;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (ms < 0 || !gmtime_r(&t, &tm) || tm.tm_year + 1900 > 9999) {
        snprintf(out, 32, "%lld ms", ms); /* no honest calendar date to print */
        return;
    }
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03dZ", (int)(ms % 1000));
}

void cli_print_json(json_t *doc) {
    char *txt = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    printf("%s\n", txt ? txt : "{}");
    free(txt);
    json_decref(doc);
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
    /* could not look: unreachable, busy, wrong schema, I/O, memory, a lost connection, and a
     * permission the database denies this role (OBX_EDENIED: not a finding about the outbox) */
    case OBX_EDENIED:
    default: return CLI_EXIT_UNCHECKED;
    }
}

/* Writes "obx <cmd>: <msg>\n" to stderr, the message with control bytes escaped, and the hint
 * (where to read on) on a line of its own. */
static int report(const char *cmd, int rc, const char *code, const char *msg, const char *hint);

void cli_warn(const char *cmd, const char *code, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    report(cmd, -1, code, msg, NULL);
}

/* The library's own lines (librdkafka, the server's notices, a topic that does not exist): as
 * the command's warnings, text or JSON like its errors (the relay installs its log instead). */
static void library_line(int level, const char *component, const char *msg, void *user) {
    static const char *const codes[] = {"debug", "info", "warn", "error"};
    const char *cmd = user;
    if (err_format == ERR_TEXT) {
        fprintf(stderr, "obx %s: %s: ", cmd, component);
        put_printable(stderr, msg);
        fputc('\n', stderr);
        return;
    }
    char clean[2048], line[2400];
    printable(clean, sizeof clean, msg, true);
    snprintf(line, sizeof line, "%s: %s", component, clean);
    report(cmd, -1, codes[level & 3], line, NULL);
}

/* rc -1: a warning (the command goes on). */
static int report(const char *cmd, int rc, const char *code, const char *msg, const char *hint) {
    if (err_format == ERR_TEXT) {
        fprintf(stderr, "obx %s: ", cmd);
        put_printable(stderr, msg);
        fputc('\n', stderr);
        if (hint) fprintf(stderr, "%s\n", hint);
        return rc;
    }
    char clean[4096];
    printable(clean, sizeof clean, msg, true);
    json_t *o;
    if (err_format == ERR_JSON) {
        o = json_pack("{s:s,s:s,s:s}", "code", code, "message", clean, "command", cmd);
        if (o && rc >= 0) json_object_set_new(o, "exit_status", json_integer(rc));
        if (o && rc < 0) json_object_set_new(o, "level", json_string("warn"));
    } else { /* a log record like every other line of the relay's (src/drivers/log.c) */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        char when[40];
        snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
        o = json_pack("{s:s,s:s,s:s,s:s,s:s}", "ts", when, "level", rc < 0 ? "warn" : "error",
                      "component", cmd, "msg", clean, "code", code);
        if (o && rc >= 0) json_object_set_new(o, "exit_status", json_integer(rc));
    }
    char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    fprintf(stderr, "%s\n",
            line ? line : "{\"code\":\"OBX_ENOMEM\",\"message\":\"out of memory\"}");
    free(line);
    json_decref(o);
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
    /* text: the code in the line; JSON: the code is a field of its own */
    int rc = err_format == ERR_TEXT
                 ? cli_error(cmd, cli_exit_of(e), obx_errname(e), "%s: %s: %s", shown,
                             obx_errname(e), *detail ? detail : obx_strerror(e))
                 : cli_error(cmd, cli_exit_of(e), obx_errname(e), "%s: %s", shown,
                             *detail ? detail : obx_strerror(e));
    obx_free(red);
    return rc;
}

int cli_usage(const char *cmd, const char *fmt, ...) {
    char msg[1280], hint[128];
    size_t n = 0;
    if (bad_option[0]) /* what getopt refused, before the usage line */
        n = (size_t)snprintf(msg, sizeof msg, "%s; ", bad_option);
    bad_option[0] = '\0';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - n, fmt, ap); /* it may quote an argument */
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
    return cli_open_store_with(cmd, url, 0, "outbox", out);
}

int cli_open_store_ro(const char *cmd, const char *url, obx_store **out) {
    return cli_open_store_with(cmd, url, OBX_STORE_READ_ONLY, "outbox", out);
}

int cli_open_store_with(const char *cmd, const char *url, unsigned flags, const char *what,
                        obx_store **out) {
    obx_err e = obx_store_open_with(url, flags, out);
    if (e == OBX_ENODB) { /* a read-only command creates nothing: "no such outbox: PATH" */
        const char *shown = url;
        char *red = NULL;
        if (!strncmp(url, "sqlite:", 7))
            shown = url + 7 + (strncmp(url + 7, "//", 2) ? 0 : 2);
        else if (obx_url_redact(url, &red) == OBX_OK)
            shown = red;
        int rc = cli_error(cmd, CLI_EXIT_UNCHECKED, "OBX_ENODB", "no such %s: %s", what, shown);
        obx_free(red);
        return rc;
    }
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

/* The optimal string alignment distance of a and b (edits, a transposition counting as one:
 * "reprot" is 1 from "report"), or 99 when either is too long to matter. */
static int osa_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 31 || m > 31) return 99;
    int d[32][32];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

const char *cli_suggest(const char *word, const char *const *names, size_t n) {
    const char *best = NULL;
    int best_d = 99;
    for (size_t i = 0; i < n; i++) {
        int dist = osa_distance(word, names[i]);
        if (dist < best_d) {
            best_d = dist;
            best = names[i];
        }
    }
    /* a near miss: at most 2 edits, and fewer than half the word's letters */
    size_t len = strlen(word);
    return best && best_d <= 2 && (size_t)best_d * 2 < (len > 2 ? len : 3) ? best : NULL;
}

/* An unknown command: at most three lines (what, the likely one, where to look), exit 2. */
static int unknown_command(const char *word) {
    const char *names[64];
    size_t n = 0;
    for (size_t i = 0; i < cli_n_commands && n < 64; i++) names[n++] = cli_commands[i].name;
    const char *s = cli_suggest(word, names, n);
    char shown[256];
    printable(shown, sizeof shown, word, false);
    if (err_format != ERR_TEXT)
        return s ? cli_error("help", CLI_EXIT_USAGE, "usage",
                             "unknown command '%s'; did you mean '%s'?", shown, s)
                 : cli_error("help", CLI_EXIT_USAGE, "usage", "unknown command '%s'", shown);
    if (s)
        fprintf(stderr, "obx: unknown command '%s'; did you mean '%s'?\n", shown, s);
    else
        fprintf(stderr, "obx: unknown command '%s'\n", shown);
    fprintf(stderr, "(`obx help` lists the commands)\n");
    return CLI_EXIT_USAGE;
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
    /* --json is for programs: then an error is a JSON object on stderr too */
    for (int i = 2; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--json")) cli_errors_json(false);
    const cli_command *c = cli_find_command(argv[1]);
    if (!c) return unknown_command(argv[1]);
    obx_log_set(library_line, (void *)c->name);
    if (wants_help(argc, argv)) {
        cli_help_command(stdout, c);
        return 0;
    }
    return c->fn(argc - 1, argv + 1);
}
