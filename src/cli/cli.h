/*
 * cli.h — shared helpers of the `obx` command (public API only: include/obx.h).
 */
#ifndef OBX_CLI_H
#define OBX_CLI_H

#include "obx.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#define CLI_DEFAULT_DB "sqlite:obx.db"
#define CLI_DEFAULT_BROKER "log:obx-broker.db"

/* The exit status of every command (README.md "Commands", `man obx` EXIT STATUS, each
 * command's --help): a script tells a finding from a failure to look. */
enum {
    CLI_EXIT_OK = 0,        /* done; for a check: all good */
    CLI_EXIT_FINDING = 1,   /* a finding: an invariant violated, an open alarm, audit findings,
                               some selected events refused */
    CLI_EXIT_USAGE = 2,     /* a usage error: unknown flag, malformed URL or value, missing
                               required option */
    CLI_EXIT_UNCHECKED = 3, /* could not check: unreachable, no such outbox, wrong schema,
                               permission, out of memory */
};
/* The exit status an error from the library means (the table in main.c). */
int cli_exit_of(obx_err e);
/* Prints "obx <cmd>: <what>: <errname>: <detail>" to stderr; returns cli_exit_of(e). */
int cli_fail(const char *cmd, const char *what, obx_err e);
/* A usage error: prints the message and where to read on; returns CLI_EXIT_USAGE. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Any other error: prints "obx <cmd>: <message>" (code: an OBX_E... name, or "usage");
 * returns rc. */
int cli_error(const char *cmd, int rc, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Errors as JSON on stderr from now on: an object {"code", "message", "command",
 * "exit_status"} per error (a command run with --json), or, with log_record, a log record like
 * the relay's others (log.format=json). */
void cli_errors_json(bool log_record);
bool cli_errors_are_json(void);
struct option;
/* getopt_long without getopt's own message (cli_usage says what was wrong, as text or JSON). */
int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts);
/* ms since the epoch as ISO-8601 UTC, "2030-01-02T03:04:05.678Z", for people to read (JSON
 * keeps epoch ms in keys ending in _ms); 0 (not set) is "-". */
void cli_iso_ms(long long ms, char out[32]);
/* Prints doc as one compact JSON line on stdout and releases it (NULL: out of memory, "{}"). */
void cli_print_json(json_t *doc);
/* The name among names[0..n) that word most likely misspells (a transposition or up to two
 * edits), or NULL. */
const char *cli_suggest(const char *word, const char *const *names, size_t n);
/* A warning (the command goes on), as text or JSON like an error. */
void cli_warn(const char *cmd, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reads a whole file ("-" = stdin) into a malloc'ed buffer; on failure prints why and returns
 * the exit status (CLI_EXIT_USAGE: the file named cannot be read). */
int cli_read_file(const char *cmd, const char *path, unsigned char **out, size_t *len,
                  size_t limit);
/* Opens the store named by url and checks that its schema is the one this obx needs
 * (CLI_EXIT_UNCHECKED when it is not). */
int cli_open_store(const char *cmd, const char *url, obx_store **out);
/* The same for a command that only reads (OBX_STORE_READ_ONLY): it never creates a file, reads
 * one the user cannot write, and a missing database is "no such outbox: PATH" (exit 3). */
int cli_open_store_ro(const char *cmd, const char *url, obx_store **out);
/* what: the database's name in the message ("outbox", "consumer database"). */
int cli_open_store_with(const char *cmd, const char *url, unsigned flags, const char *what,
                        obx_store **out);

/* notify.c: the service manager's view of a daemon command (READY=1, STATUS=, WATCHDOG=1,
 * STOPPING=1; nothing outside systemd). */
typedef struct cli_notify {
    bool ready_sent;
    long long watchdog_ms, watchdog_at, status_at; /* monotonic ms; watchdog_ms 0: off */
    char status[640];                              /* the last STATUS= sent */
} cli_notify;
void cli_notify_init(cli_notify *n);
/* From the main loop, every few hundred ms: READY=1 the first time ready is true, STATUS= when
 * status changed (at most once a second), WATCHDOG=1 when due. */
void cli_notify_tick(cli_notify *n, bool ready, const char *status);
/* WATCHDOG=1 when due, nothing else (while a stop drains). */
void cli_notify_watchdog(cli_notify *n);
void cli_notify_stopping(cli_notify *n, const char *status);

typedef int (*cli_cmd_fn)(int argc, char **argv);

/* The command table (commands.c): the one source of dispatch, help, man page and completion. */
typedef struct cli_opt {
    const char *name; /* long option without "--"; NULL ends the list */
    const char *arg;  /* its argument's name ("URL"); NULL: a flag, no argument */
    const char *def;  /* with an argument: its default as typed, or "required..."; flags: NULL */
    const char *text; /* what it does: plain sentences */
    char short_name;  /* a one-letter alias getopt also accepts (-d), or 0 */
} cli_opt;

#define CLI_MAX_OPTS 32
typedef struct cli_command {
    const char *name;
    cli_cmd_fn fn;
    const char *summary;        /* one line for `obx help` */
    const char *finding;        /* what exit status 1 means for it; NULL: it never exits 1 */
    const char *synopsis;       /* usage lines without "obx ", '\n' between them */
    const char *subcommands;    /* words that may follow the name (space separated), or NULL */
    const char *text;           /* description: plain sentences, "\n\n" between paragraphs */
    cli_opt opts[CLI_MAX_OPTS]; /* every option the command's getopt accepts; ends at name NULL */
    const char *examples;       /* command lines, '\n' between them */
} cli_command;

extern const cli_command cli_commands[];
extern const size_t cli_n_commands;
extern const char cli_man_description[], cli_man_files[], cli_man_http[], cli_man_exit[],
    cli_man_see_also[];
/* The entry named `name`, or NULL. */
const cli_command *cli_find_command(const char *name);
/* help.c: the general help (command list), one command's help. */
void cli_help_general(FILE *f);
void cli_help_command(FILE *f, const cli_command *c);

/* The sample consumer (projection.c): an order projection in the consumer's SQLite database. */
typedef struct projection {
    unsigned fail_permille; /* injected handler failures (demo, tests) */
    uint64_t rng;
} projection;
obx_err projection_setup(void *user, void *db);
obx_err projection_handler(void *user, void *conn, const obx_message *m, const char *effect_key,
                           char *result, size_t cap);
obx_err projection_snapshot(void *user, void *db, char **out);

/* What the sample consumer declares (projection.c): the contracts it understands and the
 * tenants it serves. `obx consume` and `obx consumer-test --builtin order-projection` use them
 * unless --types / --tenants say otherwise. */
extern const char *const projection_types[];
extern const size_t projection_n_types;
extern const char *const projection_tenants[];
extern const size_t projection_n_tenants;

/* `obx consume --exec CMD` (exec_handler.c): an inbox handler that runs CMD per message. */
typedef struct exec_handler {
    const char *cmd;      /* run with /bin/sh -c */
    const char *consumer; /* OBX_CONSUMER_ID */
    int poison_exit;      /* this exit status parks the message at once (OBX_EPOISON) */
    long timeout_ms;      /* the command's process group is killed after this long */
} exec_handler;
obx_err exec_handler_run(void *user, void *conn, const obx_message *m, const char *effect_key,
                         char *result, size_t cap);

int cmd_init(int argc, char **argv);
int cmd_route(int argc, char **argv);
int cmd_enqueue(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_relay(int argc, char **argv);
int cmd_config(int argc, char **argv);
int cmd_consume(int argc, char **argv);
int cmd_requeue(int argc, char **argv);
int cmd_cancel(int argc, char **argv);
int cmd_resolve(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_poison(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_sim(int argc, char **argv);
int cmd_audit(int argc, char **argv);
int cmd_purge(int argc, char **argv);
int cmd_watermark(int argc, char **argv);
int cmd_migrate(int argc, char **argv);
int cmd_shadow(int argc, char **argv);
int cmd_takeover(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_consumer_test(int argc, char **argv);
int cmd_catalog(int argc, char **argv);
int cmd_help(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_completion(int argc, char **argv);

/* --otel-endpoint URL (obx enqueue, obx resolve): an exporter for the command's own spans;
 * obx_otel_close sends them before the command ends. */
obx_err cli_otel_open(const char *endpoint, obx_otel **out);

#endif
