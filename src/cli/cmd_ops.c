/*
 * cmd_ops.c — what an operator runs in a terminal: `obx status` (the outbox at a glance, with
 * --watch for a top-style refresh) and `obx trace` (one event's or one correlation ID's whole
 * flow, producer to consumer receipts, as a timeline).
 *
 * Event data is hostile: every string from the outbox goes through cli_clean() before it
 * reaches the terminal, so a control character in a broker's error text cannot move the
 * cursor or retitle the window.
 */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- shared: outbox URL and critical consumers from flags or a relay config ---- */

typedef struct ops_args {
    const char *db;
    char *db_owned; /* from --config */
    const char *consumers[64];
    size_t n_consumers;
    char *cfg_list; /* the config's consumer list, split in place */
} ops_args;

static void ops_free(ops_args *a) {
    obx_free(a->db_owned);
    obx_free(a->cfg_list);
}

/* --config FILE: the relay's db and audit.critical_consumers (flags given after win). */
static int ops_config(const char *cmd, const char *path, ops_args *a) {
    obx_config *cfg;
    obx_err e = obx_config_load(path, &cfg);
    if (e) return cli_fail(cmd, path, e);
    e = obx_config_get(cfg, "db", &a->db_owned);
    if (!e) e = obx_config_get(cfg, "audit.critical_consumers", &a->cfg_list);
    obx_config_free(cfg);
    if (e) return cli_fail(cmd, path, e);
    a->db = a->db_owned;
    for (char *save = NULL, *t = strtok_r(a->cfg_list, "\n", &save); t && a->n_consumers < 64;
         t = strtok_r(NULL, "\n", &save))
        a->consumers[a->n_consumers++] = t;
    return 0;
}

/* Prints s with control characters replaced (terminal safety). */
static void cli_clean(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++)
        fputc(*p < 0x20 || *p == 0x7f ? '?' : *p, f);
}

static const char *js(json_t *o, const char *k) {
    const char *v = json_string_value(json_object_get(o, k));
    return v ? v : "";
}

static long long ji(json_t *o, const char *k) {
    return (long long)json_integer_value(json_object_get(o, k));
}

/* ISO-8601 UTC (cli_iso_ms) into a buffer of any size. */
static void when(char *out, size_t cap, long long ms) {
    char t[32];
    cli_iso_ms(ms, t);
    snprintf(out, cap, "%s", t);
}

static void age(char *out, size_t cap, long long ms) {
    if (ms <= 0)
        snprintf(out, cap, "-");
    else if (ms < 1000)
        snprintf(out, cap, "%lld ms", ms);
    else if (ms < 120000)
        snprintf(out, cap, "%.1f s", (double)ms / 1000.0);
    else if (ms < 7200000)
        snprintf(out, cap, "%.1f min", (double)ms / 60000.0);
    else
        snprintf(out, cap, "%.1f h", (double)ms / 3600000.0);
}

/* ---- obx status ---------------------------------------------------------------------------- */

/* PENDING events of clusters no live relay serves: they wait until a relay of that cluster runs. */
static void print_unserved(json_t *s) {
    json_t *u = json_object_get(s, "unserved_clusters");
    size_t i;
    json_t *c;
    char b[64];
    json_array_foreach(u, i, c) {
        age(b, sizeof b, ji(c, "oldest_age_ms"));
        printf("\n  UNSERVED cluster ");
        cli_clean(stdout, js(c, "cluster"));
        printf(": %lld PENDING events, the oldest %s old, and no live relay serves it\n"
               "  (start a relay whose broker is that cluster, or route the type elsewhere: "
               "obx route set)\n",
               ji(c, "pending"), b);
    }
}

static void print_status(json_t *s) {
    char a[64], b[64];
    long long now = ji(s, "generated_at_ms");
    when(a, sizeof a, now);
    printf("obx status — ");
    cli_clean(stdout, js(s, "store"));
    printf(" at %s: %lld events\n\n", a, ji(s, "total"));
    json_t *st = json_object_get(s, "states");
    const char *k;
    json_t *v;
    json_object_foreach(st, k, v) {
        printf("  %-17s %10lld", k, (long long)json_integer_value(v));
        if (!strcmp(k, "PENDING")) {
            age(b, sizeof b, ji(json_object_get(s, "pending"), "oldest_age_ms"));
            printf("   oldest PENDING %s", b);
        } else if (!strcmp(k, "DISPATCH_UNKNOWN")) {
            json_t *u = json_object_get(s, "unknown");
            age(b, sizeof b, ji(u, "oldest_age_ms"));
            printf("   UNKNOWN in all: %lld events, %lld open attempts, oldest %s", ji(u, "events"),
                   ji(u, "open_attempts"), b);
        }
        printf("\n");
    }
    json_t *un = json_object_get(s, "unknown");
    if (ji(un, "held")) {
        age(b, sizeof b, ji(un, "oldest_held_age_ms"));
        printf("\n  %sHELD for an operator: %lld UNKNOWN events, the oldest held for %s%s\n"
               "  (resolve: obx resolve --held --retry --who NAME --reason TEXT, or --accept with "
               "evidence)\n",
               ji(un, "oldest_held_age_ms") > ji(un, "held_alert_ms") ? "ALERT " : "",
               ji(un, "held"), b,
               ji(un, "oldest_held_age_ms") > ji(un, "held_alert_ms") ? " (over 15 min)" : "");
    }
    print_unserved(s);
    json_t *dsets = json_object_get(s, "delivery_sets");
    if (ji(dsets, "undelivered_all") || ji(dsets, "undelivered_any") || ji(dsets, "trailing_slots"))
        printf("\n  delivery sets not delivered yet: %lld (rule all), %lld (rule any); trailing "
               "targets of delivered any-sets still being sent: %lld\n",
               ji(dsets, "undelivered_all"), ji(dsets, "undelivered_any"),
               ji(dsets, "trailing_slots"));
    json_t *rc = json_object_get(s, "receipts");
    printf("\n  receipts: %lld primary, %lld duplicate, %lld quarantined, %lld migration\n",
           ji(rc, "primary"), ji(rc, "duplicate"), ji(rc, "quarantined"), ji(rc, "migration"));
    if (ji(rc, "asserted"))
        printf("  ASSERTED by an operator, not verified at the broker: %lld published events "
               "(obx audit reports them until a critical consumer's receipt confirms them)\n",
               ji(rc, "asserted"));
    json_t *lists = json_object_get(s, "lists");
    size_t i;
    json_t *e;
    json_t *lu = json_object_get(lists, "unknown");
    printf("\nUNKNOWN events (%zu listed)\n", json_array_size(lu));
    json_array_foreach(lu, i, e) {
        age(b, sizeof b, now - ji(e, "unknown_since_ms"));
        printf("  %s %-16s ", js(e, "event_id"), js(e, "state"));
        cli_clean(stdout, js(e, "event_type"));
        printf(" unknown for %s, %zu attempt(s)%s\n", b,
               json_array_size(json_object_get(e, "attempts")),
               ji(e, "held_at_ms") ? ", HELD for an operator" : "");
        size_t j;
        json_t *at;
        json_array_foreach(json_object_get(e, "attempts"), j, at) {
            printf("      %s %-9s partition %lld ", js(at, "attempt_id"), js(at, "state"),
                   ji(at, "partition"));
            cli_clean(stdout, js(at, "detail"));
            printf("\n");
        }
    }
    json_t *lp = json_object_get(lists, "parked");
    printf("\nPARKED events (%zu listed; requeue with `obx requeue EVENT_ID`)\n",
           json_array_size(lp));
    json_array_foreach(lp, i, e) {
        printf("  %s ", js(e, "event_id"));
        cli_clean(stdout, js(e, "event_type"));
        printf(" ");
        cli_clean(stdout, js(e, "aggregate"));
        printf(" rejections %lld/%lld: ", ji(e, "rejections"), ji(e, "max_attempts"));
        cli_clean(stdout, js(e, "last_reason"));
        printf("\n");
    }
    json_t *lq = json_object_get(lists, "quarantined");
    printf("\nquarantined receipts (%zu listed)\n", json_array_size(lq));
    json_array_foreach(lq, i, e) {
        when(a, sizeof a, ji(e, "created_at_ms"));
        printf("  %s %s attempt %s: ", a, js(e, "event_id"), js(e, "attempt_id"));
        cli_clean(stdout, js(e, "reason"));
        printf("\n");
    }
    json_t *cs = json_object_get(s, "consumers");
    if (json_array_size(cs)) printf("\ncritical consumers\n");
    json_array_foreach(cs, i, e) {
        printf("  %-20s ", js(e, "consumer_id"));
        cli_clean(stdout, js(e, "url"));
        if (!json_is_true(json_object_get(e, "up"))) {
            printf("  UNREACHABLE: ");
            cli_clean(stdout, js(e, "error"));
            printf("\n");
            continue;
        }
        json_t *lag = json_object_get(e, "lag"), *po = json_object_get(e, "poison");
        age(a, sizeof a, ji(lag, "age_ms"));
        long long lc = ji(lag, "last_commit_at_ms");
        age(b, sizeof b, lc ? now - lc : 0);
        printf(
            "\n      lag %lld of the newest %lld published events (oldest %s); last commit %s%s; "
            "poison: %lld parked, %lld to re-drive\n",
            ji(lag, "events"), ji(lag, "window"), a, lc ? b : "never", lc ? " ago" : "",
            ji(po, "parked"), ji(po, "redrive"));
    }
}

/* An open alarm: a quarantined receipt, or an UNKNOWN held for an operator past its alert time
 * (the exit status 1 of `obx status`). */
static bool status_alarm(json_t *s) {
    json_t *un = json_object_get(s, "unknown");
    return ji(json_object_get(s, "receipts"), "quarantined") > 0 ||
           (ji(un, "held") > 0 && ji(un, "oldest_held_age_ms") > ji(un, "held_alert_ms"));
}

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

int cmd_status(int argc, char **argv) {
    ops_args a = {.db = CLI_DEFAULT_DB};
    int js_out = 0;
    long watch = 0, limit = 0;
    const char *config = NULL;
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"config", required_argument, 0, 'c'},
                                         {"consumer", required_argument, 0, 'C'},
                                         {"json", no_argument, 0, 'j'},
                                         {"watch", required_argument, 0, 'w'},
                                         {"limit", required_argument, 0, 'l'},
                                         {0, 0, 0, 0}};
    const char *usage = "usage: obx status [--db URL] [--config FILE] [--consumer ID=URL]... "
                        "[--limit N] [--json] [--watch SECONDS]";
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1)
        if (c == 'c') config = optarg;
    int rc = config ? ops_config("status", config, &a) : 0;
    if (rc) return rc;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        char *end;
        switch (c) {
        case 'd': a.db = optarg; break;
        case 'c': break;
        case 'C':
            if (a.n_consumers < 64) a.consumers[a.n_consumers++] = optarg;
            break;
        case 'j': js_out = 1; break;
        case 'w':
            watch = strtol(optarg, &end, 10);
            if (*end || watch < 1 || watch > 3600) {
                ops_free(&a);
                return cli_usage("status", "--watch: '%s' is not 1..3600 seconds", optarg);
            }
            break;
        case 'l':
            limit = strtol(optarg, &end, 10);
            if (*end || limit < 1 || limit > 10000) {
                ops_free(&a);
                return cli_usage("status", "--limit: '%s' is not 1..10000", optarg);
            }
            break;
        default: ops_free(&a); return cli_usage("status", "%s", usage);
        }
    }
    if (optind < argc) {
        ops_free(&a);
        return cli_usage("status", "unexpected argument '%s'", argv[optind]);
    }
    obx_store *s;
    rc = cli_open_store_ro("status", a.db, &s);
    if (rc) {
        ops_free(&a);
        return rc;
    }
    obx_ops_options o = {
        .consumers = a.consumers, .n_consumers = a.n_consumers, .limit = (size_t)limit};
    if (watch) signal(SIGINT, on_sigint);
    bool alarm = false; /* in the last frame shown */
    for (;;) {
        char *out = NULL;
        obx_err e = obx_status(s, &o, &out);
        if (e) {
            rc = cli_fail("status", a.db, e);
            break;
        }
        json_t *j = json_loads(out, 0, NULL);
        alarm = status_alarm(j);
        /* top-style, redrawn in place, only on a terminal: a program reading --json or a pipe
         * gets no terminal codes; with --watch --json one object per line */
        if (watch && !js_out && isatty(STDOUT_FILENO)) printf("\033[H\033[2J");
        char *line = watch && js_out ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (js_out)
            printf("%s\n", line ? line : out);
        else
            print_status(j);
        free(line);
        if (watch && !js_out && !isatty(STDOUT_FILENO)) printf("\n"); /* frames apart */
        json_decref(j);
        obx_free(out);
        fflush(stdout);
        if (!watch) break;
        for (long t = 0; t < watch * 10 && !interrupted; t++) usleep(100000);
        if (interrupted) break;
    }
    obx_store_close(s);
    ops_free(&a);
    return !rc && alarm ? CLI_EXIT_FINDING : rc;
}

/* ---- obx trace ------------------------------------------------------------------------------ */

typedef struct line {
    long long at;
    int order; /* ties: producer, relay, receipts, consumers */
    char *text;
} line;

static int cmp_line(const void *x, const void *y) {
    const line *a = x, *b = y;
    if (a->at != b->at) return a->at < b->at ? -1 : 1;
    return a->order - b->order;
}

static void add(line **v, size_t *n, size_t *cap, long long at, int order, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void add(line **v, size_t *n, size_t *cap, long long at, int order, const char *fmt, ...) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 32;
        line *p = realloc(*v, c * sizeof *p);
        if (!p) return;
        *v = p;
        *cap = c;
    }
    va_list ap;
    va_start(ap, fmt);
    char *t = NULL;
    if (vasprintf(&t, fmt, ap) < 0) t = NULL;
    va_end(ap);
    if (!t) return;
    (*v)[(*n)++] = (line){at, order, t};
}

static void print_event(json_t *d) {
    json_t *env = json_object_get(d, "envelope"), *dst = json_object_get(d, "destination"),
           *st = json_object_get(d, "status");
    printf("event %s  ", js(d, "event_id"));
    cli_clean(stdout, js(env, "event_type"));
    printf("  ");
    cli_clean(stdout, js(env, "aggregate_type"));
    printf("/");
    cli_clean(stdout, js(env, "aggregate_id"));
    printf("@%lld  tenant ", ji(env, "aggregate_version"));
    cli_clean(stdout, js(env, "tenant"));
    printf("\n  correlation ");
    cli_clean(stdout, js(env, "correlation_id"));
    printf("  causation ");
    cli_clean(stdout, js(env, "causation_id"));
    printf("  traceparent ");
    cli_clean(stdout, js(env, "traceparent"));
    printf("\n  destination ");
    cli_clean(stdout, js(dst, "cluster"));
    printf("/");
    cli_clean(stdout, js(dst, "topic"));
    printf(" key ");
    cli_clean(stdout, js(dst, "routing_key"));
    printf("  state %s\n", js(st, "state"));
    line *v = NULL;
    size_t n = 0, cap = 0;
    add(&v, &n, &cap, ji(st, "committed_at_ms"), 0,
        "producer    committed in txid %s (idempotency key '%s', payload %s)",
        js(env, "created_txid"), js(env, "idempotency_key"), js(env, "payload_digest"));
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(d, "audit"), i, x) {
        if (!strcmp(js(x, "actor"), "producer")) continue; /* the commit line says it */
        add(&v, &n, &cap, ji(x, "at_ms"), 1, "%-11s %s -> %s by %s%s%s: %s", js(x, "actor"),
            js(x, "from"), js(x, "to"), js(x, "who"), *js(x, "attempt_id") ? " attempt " : "",
            js(x, "attempt_id"), js(x, "reason"));
    }
    json_array_foreach(json_object_get(d, "receipts"), i, x) {
        add(&v, &n, &cap, ji(x, "created_at_ms"), 2,
            "receipt     %s from %s/%s partition %lld offset %lld (attempt %s): %s", js(x, "kind"),
            js(x, "cluster"), js(x, "topic"), ji(x, "partition"), ji(x, "offset"),
            js(x, "attempt_id"), js(x, "reason"));
    }
    json_array_foreach(json_object_get(d, "consumers"), i, x) {
        if (json_object_get(x, "error")) {
            add(&v, &n, &cap, 0, 3, "consumer    %s: unreachable: %s", js(x, "consumer_id"),
                js(x, "error"));
            continue;
        }
        size_t j;
        json_t *au;
        json_array_foreach(json_object_get(x, "audit"), j, au) {
            add(&v, &n, &cap, ji(au, "at_ms"), 3, "consumer    %s %s (%lld us)%s%s",
                js(x, "consumer_id"), js(au, "outcome"), ji(au, "duration_us"),
                *js(au, "detail") ? ": " : "", js(au, "detail"));
        }
        json_t *r = json_object_get(x, "receipt");
        if (!json_is_object(r))
            add(&v, &n, &cap, (long long)9e18, 3, "consumer    %s: no consume receipt%s",
                js(x, "consumer_id"),
                json_is_object(json_object_get(x, "poison")) ? " (parked as poison)" : " yet");
    }
    if (n) qsort(v, n, sizeof *v, cmp_line);
    for (i = 0; i < n; i++) {
        char a[64];
        if (v[i].at == (long long)9e18 || !v[i].at)
            snprintf(a, sizeof a, "%-24s", "");
        else
            when(a, sizeof a, v[i].at);
        printf("  %s  ", a);
        cli_clean(stdout, v[i].text);
        printf("\n");
        free(v[i].text);
    }
    free(v);
    printf("\n");
}

int cmd_trace(int argc, char **argv) {
    ops_args a = {.db = CLI_DEFAULT_DB};
    const char *corr = NULL, *config = NULL;
    int js_out = 0;
    static const struct option opts[] = {
        {"db", required_argument, 0, 'd'},       {"config", required_argument, 0, 'c'},
        {"consumer", required_argument, 0, 'C'}, {"correlation", required_argument, 0, 'r'},
        {"json", no_argument, 0, 'j'},           {0, 0, 0, 0}};
    const char *usage = "usage: obx trace EVENT_ID | --correlation ID [--db URL] [--config FILE] "
                        "[--consumer ID=URL]... [--json]";
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1)
        if (c == 'c') config = optarg;
    int rc = config ? ops_config("trace", config, &a) : 0;
    if (rc) return rc;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'd': a.db = optarg; break;
        case 'c': break;
        case 'C':
            if (a.n_consumers < 64) a.consumers[a.n_consumers++] = optarg;
            break;
        case 'r': corr = optarg; break;
        case 'j': js_out = 1; break;
        default: ops_free(&a); return cli_usage("trace", "%s", usage);
        }
    }
    const char *id = optind < argc ? argv[optind] : NULL;
    if ((!id && !corr) || (id && optind != argc - 1)) {
        ops_free(&a);
        return cli_usage("trace", "%s", usage);
    }
    obx_store *s;
    rc = cli_open_store_ro("trace", a.db, &s);
    if (rc) {
        ops_free(&a);
        return rc;
    }
    obx_ops_options o = {.consumers = a.consumers, .n_consumers = a.n_consumers};
    char *out = NULL;
    obx_err e = obx_trace(s, id, corr, &o, &out);
    obx_store_close(s);
    if (e) {
        rc = cli_fail("trace", id ? id : corr, e);
        ops_free(&a);
        return rc;
    }
    if (js_out)
        printf("%s\n", out);
    else {
        json_t *j = json_loads(out, 0, NULL);
        size_t i;
        json_t *d;
        json_array_foreach(json_object_get(j, "events"), i, d) { print_event(d); }
        json_decref(j);
    }
    obx_free(out);
    ops_free(&a);
    return 0;
}
