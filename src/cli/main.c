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
    fprintf(stderr, "\n(see `obx help` or `man obx`)\n");
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

static const struct {
    const char *name;
    cli_cmd_fn fn;
    const char *help;
} commands[] = {
    {"init", cmd_init, "create or upgrade the outbox schema: obx init --db URL [--roles PREFIX]"},
    {"route", cmd_route, "route policy: obx route set TYPE --cluster C --topic T ... | list"},
    {"enqueue", cmd_enqueue, "commit one event: obx enqueue --type T --aggregate TYPE/ID@V ..."},
    {"inspect", cmd_inspect, "one event's envelope, state, attempts, receipts, audit"},
    {"report", cmd_report, "the whole outbox: counts, receipts, UNKNOWN times, invariants"},
    {"status", cmd_status, "the outbox at a glance (cheap): states, ages, UNKNOWN/PARKED lists"},
    {"trace", cmd_trace, "one event's flow, producer to consumers: obx trace ID | --correlation C"},
    {"consumer-test", cmd_consumer_test,
     "replay a consumer against duplicates, reordering, old contracts, tenants, poison"},
    {"catalog", cmd_catalog, "check the topic catalog against routes and subscriptions"},
    {"relay", cmd_relay, "run the relay daemon: obx relay [--config FILE] [--db] [--broker]"},
    {"config", cmd_config, "the relay's effective configuration as JSON, secrets redacted"},
    {"consume", cmd_consume, "run a consumer through the inbox (sample order projection)"},
    {"requeue", cmd_requeue, "put a PARKED event back to PENDING: obx requeue EVENT_ID"},
    {"resolve", cmd_resolve,
     "end UNKNOWN outcomes: same-target --retry, or --accept with evidence (--who --reason)"},
    {"poison", cmd_poison, "consumer poison messages: obx poison list|redrive"},
    {"sim", cmd_sim, "the deterministic simulator and release gate: obx sim --traces N --seed S"},
    {"audit", cmd_audit,
     "three-set audit: outbox vs receipts vs critical consumers (exit 1: "
     "findings)"},
    {"purge", cmd_purge, "retention: retain and purge what the evidence allows [--dry-run]"},
    {"watermark", cmd_watermark, "critical consumers' watermarks: list | force CONSUMER --until"},
    {"demo", cmd_demo, "the whole pipeline with injected faults: obx demo [--events N]"},
    {"migrate", cmd_migrate,
     "move undelivered events to a new destination (with proof), or add "
     "a delivery-set target"},
    {"shadow", cmd_shadow, "compare what obx would send with what another dispatcher published"},
    {"takeover", cmd_takeover,
     "hand event types to a dispatcher alias (or back): obx takeover "
     "--to A"},
};

static void help(FILE *f) {
    fprintf(f,
            "obx %s — transactional outbox with delivery reconciliation\n\nusage: obx "
            "<command> [options]\n\ncommands:\n",
            OBX_VERSION_STRING);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f,
            "\nEvery command names its outbox with --db URL (sqlite:PATH or postgres://...,\n"
            "default %s) and its broker with --broker URL (log:PATH, kafka://HOST:PORT,\n"
            "amqp://USER:PASS@HOST:PORT/VHOST; default %s).\n",
            CLI_DEFAULT_DB, CLI_DEFAULT_BROKER);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        help(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        help(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("obx %s\n", OBX_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "obx: unknown command '%s'\n\n", argv[1]);
    help(stderr);
    return 2;
}
