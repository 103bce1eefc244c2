/*
 * cmd_retention.c — `obx audit`, `obx purge` and `obx watermark` (docs/retention.md,
 * docs/retention.md), on the public API only.
 *
 *   obx audit    the three-set audit; a table, or the audit document with --json; exit 0 when
 *                there is no finding, 1 when there are findings (or the audit could not run),
 *                2 on a usage error — for cron and CI;
 *   obx purge    retention: every event the evidence allows, or one EVENT_ID (all or nothing,
 *                exit 1 with every unmet condition when it cannot go); --dry-run lists what
 *                would go and changes nothing;
 *   obx watermark [list] | force CONSUMER --until TIME --reason TEXT
 *                the critical consumers' forced watermarks.
 *
 * Every command takes its configuration like the relay: --config FILE (YAML), then flags over
 * it: --db URL, --broker URL, --consumer ID=URL (repeatable; replaces the file's
 * audit.critical_consumers), --set KEY=VALUE (repeatable).
 */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    O_CONFIG = 1000,
    O_DB,
    O_BROKER,
    O_NO_BROKER,
    O_CONSUMER,
    O_SET,
    O_JSON,
    O_DRY,
    O_WHO,
    O_UNTIL,
    O_REASON,
    O_MAX_LISTED
};

static const struct option opts[] = {{"config", required_argument, 0, O_CONFIG},
                                     {"db", required_argument, 0, O_DB},
                                     {"broker", required_argument, 0, O_BROKER},
                                     {"no-broker", no_argument, 0, O_NO_BROKER},
                                     {"consumer", required_argument, 0, O_CONSUMER},
                                     {"set", required_argument, 0, O_SET},
                                     {"json", no_argument, 0, O_JSON},
                                     {"dry-run", no_argument, 0, O_DRY},
                                     {"who", required_argument, 0, O_WHO},
                                     {"until", required_argument, 0, O_UNTIL},
                                     {"reason", required_argument, 0, O_REASON},
                                     {"max-listed", required_argument, 0, O_MAX_LISTED},
                                     {0, 0, 0, 0}};

typedef struct args {
    obx_config *cfg;
    int json, dry_run, no_broker, broker_given, config_given;
    const char *who, *until, *reason;
    long max_listed;
    const char *pos[4]; /* positional arguments */
    int npos;
} args;

/* Parses the shared options; `allowed` lists the option codes this command takes (getopt sees
 * only those: an option of another command is unrecognized, and the command's help lists
 * exactly what its getopt accepts). Returns 0, or the exit status of a usage or configuration
 * error (already reported). */
static int parse(const char *cmd, int argc, char **argv, const int *allowed, const char *usage,
                 args *a) {
    memset(a, 0, sizeof *a);
    struct option mine[sizeof opts / sizeof opts[0]] = {{0}};
    size_t n = 0;
    for (const struct option *o = opts; o->name; o++)
        for (const int *p = allowed; *p; p++)
            if (*p == o->val) mine[n++] = *o;
    const char *config = NULL;
    int c;
    optind = 1;
    /* first pass: the file and the option set; flags apply over the file in the second */
    while ((c = cli_getopt(argc, argv, "", mine)) != -1) {
        if (c == '?') return cli_usage(cmd, "%s", usage);
        if (c == O_CONFIG) config = optarg;
    }
    for (int i = optind; i < argc; i++) {
        if (a->npos == 4) return cli_usage(cmd, "too many arguments\n%s", usage);
        a->pos[a->npos++] = argv[i];
    }
    obx_err e = config ? obx_config_load(config, &a->cfg) : obx_config_new(&a->cfg);
    if (e) return cli_fail(cmd, config ? config : "configuration", e);
    a->config_given = config != NULL;
    bool consumers_reset = false;
    optind = 1;
    while (!e && (c = cli_getopt(argc, argv, "", mine)) != -1) {
        switch (c) {
        case O_DB: e = obx_config_set(a->cfg, "db", optarg); break;
        case O_BROKER:
            e = obx_config_set(a->cfg, "broker", optarg);
            a->broker_given = 1;
            break;
        case O_NO_BROKER: a->no_broker = 1; break;
        case O_CONSUMER:
            /* flags replace the file's list, item by item (a URL may hold commas) */
            if (!consumers_reset) e = obx_config_set(a->cfg, "audit.critical_consumers", "");
            consumers_reset = true;
            if (!e) e = obx_config_append(a->cfg, "audit.critical_consumers", optarg);
            break;
        case O_SET: {
            const char *eq = strchr(optarg, '=');
            char key[128];
            if (!eq || (size_t)(eq - optarg) >= sizeof key) {
                obx_config_free(a->cfg);
                a->cfg = NULL;
                return cli_usage(cmd, "--set: '%s' is not KEY=VALUE", optarg);
            }
            memcpy(key, optarg, (size_t)(eq - optarg));
            key[eq - optarg] = '\0';
            e = obx_config_set(a->cfg, key, eq + 1);
            break;
        }
        case O_JSON: a->json = 1; break;
        case O_DRY: a->dry_run = 1; break;
        case O_WHO: a->who = optarg; break;
        case O_UNTIL: a->until = optarg; break;
        case O_REASON: a->reason = optarg; break;
        case O_MAX_LISTED: {
            char *end;
            a->max_listed = strtol(optarg, &end, 10);
            if (*end || a->max_listed < 1 || a->max_listed > 1000000) {
                obx_config_free(a->cfg);
                a->cfg = NULL;
                return cli_usage(cmd, "--max-listed: '%s' is not in 1..1000000", optarg);
            }
            break;
        }
        default: break;
        }
    }
    if (e) {
        int rc = cli_fail(cmd, "configuration", e);
        obx_config_free(a->cfg);
        a->cfg = NULL;
        return rc;
    }
    return 0;
}

static const char *who_default(args *a, char *buf, size_t cap) {
    if (a->who) return a->who;
    const char *u = getenv("USER");
    snprintf(buf, cap, "operator:%s", u && *u ? u : "unknown");
    for (char *p = buf; *p; p++) /* keep it within the audit rows' character set */
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@/-", *p))
            *p = '-';
    return buf;
}

static void iso(json_int_t ms, char out[40]) { cli_iso_ms((long long)ms, out); }

static void age(json_int_t ms, char out[32]) {
    long long s = (long long)ms / 1000;
    if (s < 60)
        snprintf(out, 32, "%lld.%03llds", s, (long long)ms % 1000);
    else if (s < 3600)
        snprintf(out, 32, "%lldm%02llds", s / 60, s % 60);
    else if (s < 86400)
        snprintf(out, 32, "%lldh%02lldm", s / 3600, s / 60 % 60);
    else
        snprintf(out, 32, "%lldd%02lldh", s / 86400, s / 3600 % 24);
}

static const char *js(json_t *o, const char *k) {
    const char *v = json_string_value(json_object_get(o, k));
    return v ? v : "";
}

static json_int_t ji(json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }

/* ---- obx audit ------------------------------------------------------------------------------- */

static void print_audit(json_t *d) {
    size_t i;
    json_t *v;
    json_t *sets = json_object_get(d, "sets");
    printf("obx audit of %s at %s\n", js(d, "store"), js(d, "at_utc"));
    printf("  broker: %s\n",
           json_is_string(json_object_get(d, "broker")) ? js(d, "broker") : "(not compared)");
    printf("  critical consumers:");
    if (!json_array_size(json_object_get(d, "critical_consumers"))) printf(" none declared");
    json_array_foreach(json_object_get(d, "critical_consumers"), i, v) {
        char t[40];
        iso(ji(v, "forced_watermark_ms"), t);
        printf("%s %s (%s%s)", i ? "," : "", js(v, "id"),
               ji(v, "forced_watermark_ms") ? "forced watermark " : "no forced watermark",
               ji(v, "forced_watermark_ms") ? t : "");
    }
    printf("\n  sets: %lld committed events, %lld published (%lld retained, %lld purged), %lld "
           "primary receipts, %lld quarantined receipts\n\n",
           (long long)ji(sets, "committed"), (long long)ji(sets, "published"),
           (long long)ji(sets, "retained"), (long long)ji(sets, "purged"),
           (long long)ji(sets, "primary_receipts"), (long long)ji(sets, "quarantined_receipts"));
    printf("%-34s %-9s %s\n", "CHECK", "STATUS", "DETAIL");
    json_array_foreach(json_object_get(d, "checks"), i, v) {
        printf("%-34s %-9s %s\n", js(v, "check"), js(v, "status"), js(v, "detail"));
    }
    json_t *f = json_object_get(d, "findings");
    if (!json_array_size(f)) {
        printf("\nno findings\n");
        return;
    }
    printf("\nFINDINGS\n");
    json_array_foreach(f, i, v) {
        char a[32];
        age(ji(v, "oldest_age_ms"), a);
        char scope[300] = "";
        if (json_object_get(v, "consumer"))
            snprintf(scope, sizeof scope, " [consumer %s]", js(v, "consumer"));
        else if (json_object_get(v, "topic"))
            snprintf(scope, sizeof scope, " [topic %s]", js(v, "topic"));
        printf("  %s%s: %lld, oldest %s\n", js(v, "kind"), scope, (long long)ji(v, "count"), a);
        size_t k;
        json_t *id;
        json_array_foreach(json_object_get(v, "event_ids"), k, id) {
            printf("    %s\n", json_string_value(id));
        }
        json_array_foreach(json_object_get(v, "without_event_id_at"), k, id) {
            printf("    (no obx event ID) %s\n", json_string_value(id));
        }
        if ((long long)ji(v, "count") > (long long)json_array_size(json_object_get(v, "event_ids")))
            printf("    ... (%lld in all; the first %zu listed, audit.max_ids)\n",
                   (long long)ji(v, "count"), json_array_size(json_object_get(v, "event_ids")));
    }
    printf("\n%lld finding%s\n", (long long)ji(d, "findings_total"),
           ji(d, "findings_total") == 1 ? "" : "s");
}

int cmd_audit(int argc, char **argv) {
    static const int allowed[] = {O_CONFIG,   O_DB,  O_BROKER, O_NO_BROKER,
                                  O_CONSUMER, O_SET, O_JSON,   0};
    args a;
    int rc = parse("audit", argc, argv, allowed,
                   "usage: obx audit [--db URL] [--broker URL | --no-broker] [--consumer "
                   "ID=URL]... [--config FILE] [--set KEY=VALUE]... [--json]",
                   &a);
    if (rc) return rc;
    if (a.npos) {
        obx_config_free(a.cfg);
        return cli_usage("audit", "unexpected argument '%s'", a.pos[0]);
    }
    /* without --broker or a configuration file there is no broker to compare with */
    unsigned flags = a.no_broker || (!a.broker_given && !a.config_given) ? OBX_AUDIT_NO_BROKER : 0;
    char *out = NULL;
    obx_err e = obx_audit(a.cfg, flags, &out);
    obx_config_free(a.cfg);
    if (e != OBX_OK && e != OBX_EFINDINGS) return cli_fail("audit", "cannot audit", e);
    if (a.json)
        printf("%s\n", out);
    else {
        json_t *d = json_loads(out, 0, NULL);
        print_audit(d);
        json_decref(d);
    }
    obx_free(out);
    return e == OBX_EFINDINGS ? 1 : 0;
}

/* ---- obx purge ------------------------------------------------------------------------------- */

static void print_purge(json_t *d) {
    bool dry = json_is_true(json_object_get(d, "dry_run"));
    printf("obx purge%s: %s %lld, %s %lld (%lld payload bytes), refused %lld, in %lld "
           "batch%s of at most %lld events\n",
           dry ? " (dry run: nothing changed)" : "", dry ? "would retain" : "retained",
           (long long)ji(d, "retained"), dry ? "would purge" : "purged", (long long)ji(d, "purged"),
           (long long)ji(d, "bytes_freed"), (long long)ji(d, "refused"),
           (long long)ji(d, "batches"), ji(d, "batches") == 1 ? "" : "es",
           (long long)ji(d, "batch"));
    printf("replay window: %lld ms after publication\n", (long long)ji(d, "replay_window_ms"));
    json_t *wm = json_object_get(d, "forced_consumer_watermark");
    if (json_is_object(wm)) {
        char t[40];
        iso(ji(wm, "published_at_ms"), t);
        printf("forced consumer watermark: at %s (published %s): %s\n", js(wm, "event_id"), t,
               js(wm, "why"));
    } else
        printf("forced consumer watermark: none (every published event has evidence from every "
               "critical consumer)\n");
    json_t *ev = json_object_get(d, "events");
    if (json_array_size(ev)) {
        printf("\n%-31s %-8s %s\n", "EVENT", "ACTION", "REASON");
        size_t i;
        json_t *v;
        json_array_foreach(ev, i, v) {
            printf("%-31s %-8s %s\n", js(v, "event_id"), js(v, "action"), js(v, "reason"));
        }
    }
    if (ji(d, "events_not_listed"))
        printf("... %lld more decisions not listed (--max-listed)\n",
               (long long)ji(d, "events_not_listed"));
}

int cmd_purge(int argc, char **argv) {
    static const int allowed[] = {O_CONFIG, O_DB,  O_CONSUMER,   O_SET, O_JSON,
                                  O_DRY,    O_WHO, O_MAX_LISTED, 0};
    args a;
    int rc = parse("purge", argc, argv, allowed,
                   "usage: obx purge [EVENT_ID] [--dry-run] [--db URL] [--consumer ID=URL]... "
                   "[--config FILE] [--set KEY=VALUE]... [--who NAME] [--max-listed N] [--json]",
                   &a);
    if (rc) return rc;
    if (a.npos > 1) {
        obx_config_free(a.cfg);
        return cli_usage("purge", "expected at most one EVENT_ID");
    }
    char whobuf[160];
    obx_purge_options o = {.dry_run = a.dry_run,
                           .event_id = a.npos ? a.pos[0] : NULL,
                           .who = who_default(&a, whobuf, sizeof whobuf),
                           .max_listed = (size_t)a.max_listed};
    char *out = NULL;
    obx_err e = obx_purge(a.cfg, &o, &out);
    obx_config_free(a.cfg);
    if (out) {
        if (a.json)
            printf("%s\n", out);
        else {
            json_t *d = json_loads(out, 0, NULL);
            print_purge(d);
            json_decref(d);
        }
        obx_free(out);
    }
    if (e) return cli_fail("purge", o.event_id ? o.event_id : "retention", e);
    return 0;
}

/* ---- obx watermark -----------------------------------------------------------------------------
 */

/* ms since the epoch, "now", or RFC 3339 UTC "2030-01-02T03:04:05[.678]Z". -1 when malformed. */
static long long parse_time(const char *s) {
    if (!strcmp(s, "now")) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    }
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*s && !*end) return v >= 0 ? v : -1;
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!p) return -1;
    int ms = 0;
    if (*p == '.') {
        int digits = 0;
        for (p++; *p >= '0' && *p <= '9'; p++)
            if (digits++ < 3) ms = ms * 10 + (*p - '0');
        if (!digits) return -1;
        while (digits++ < 3) ms *= 10;
    }
    if (strcmp(p, "Z")) return -1;
    return (long long)timegm(&tm) * 1000 + ms;
}

static int watermark_list(args *a) {
    char *out = NULL;
    obx_err e = obx_watermarks(a->cfg, &out);
    if (e) return cli_fail("watermark", "list", e);
    if (a->json) {
        printf("%s\n", out);
        obx_free(out);
        return 0;
    }
    json_t *d = json_loads(out, 0, NULL);
    obx_free(out);
    printf("%-24s %-26s %-26s %s\n", "CONSUMER", "FORCED WATERMARK", "FORCED AT", "DATABASE");
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(d, "critical_consumers"), i, v) {
        char t1[40], t2[40];
        iso(ji(v, "forced_watermark_ms"), t1);
        iso(ji(v, "forced_at_ms"), t2);
        printf("%-24s %-26s %-26s %s\n", js(v, "id"), t1, t2, js(v, "db"));
    }
    json_t *wm = json_object_get(d, "forced_consumer_watermark");
    if (json_is_object(wm)) {
        char t[40], who[512] = "";
        iso(ji(wm, "published_at_ms"), t);
        json_t *id;
        size_t k;
        json_array_foreach(json_object_get(wm, "not_consumed_by"), k, id) {
            size_t l = strlen(who);
            snprintf(who + l, sizeof who - l, "%s%s", k ? ", " : "", json_string_value(id));
        }
        printf("\nforced consumer watermark: at %s (published %s); %s%s\n", js(wm, "event_id"), t,
               *who ? "not consumed by " : "consumed by all, not yet RETAINED (run obx purge)",
               who);
    } else
        printf("\nforced consumer watermark: none (no PUBLISHED event waits for a consumer)\n");
    json_decref(d);
    return 0;
}

int cmd_watermark(int argc, char **argv) {
    static const int allowed[] = {O_CONFIG, O_DB,    O_CONSUMER, O_SET, O_JSON,
                                  O_WHO,    O_UNTIL, O_REASON,   0};
    const char *usage = "usage: obx watermark [list] [--json] | obx watermark force CONSUMER "
                        "--until TIME --reason TEXT [--who NAME]; with [--db URL] [--consumer "
                        "ID=URL]... [--config FILE] [--set KEY=VALUE]... (TIME: ms since the "
                        "epoch, now, or 2030-01-02T03:04:05Z)";
    args a;
    int rc = parse("watermark", argc, argv, allowed, usage, &a);
    if (rc) return rc;
    const char *sub = a.npos ? a.pos[0] : "list";
    if (!strcmp(sub, "list") && a.npos <= 1) {
        rc = watermark_list(&a);
    } else if (!strcmp(sub, "force") && a.npos == 2) {
        long long until = a.until ? parse_time(a.until) : -1;
        if (!a.until || until < 0)
            rc = cli_usage("watermark",
                           "--until: %s (ms since the epoch, now, or "
                           "2030-01-02T03:04:05Z)",
                           a.until ? "not a time" : "missing");
        else if (!a.reason)
            rc = cli_usage("watermark", "--reason: missing (why may events published up to "
                                        "then be purged without this consumer's receipt?)");
        else {
            char whobuf[160];
            obx_err e = obx_watermark_force(a.cfg, a.pos[1], until,
                                            who_default(&a, whobuf, sizeof whobuf), a.reason);
            if (e)
                rc = cli_fail("watermark force", a.pos[1], e);
            else if (a.json)
                cli_print_json(json_pack("{s:s,s:I}", "consumer", a.pos[1], "forced_watermark_ms",
                                         (json_int_t)until));
            else {
                char t[40];
                iso((json_int_t)until, t);
                printf("critical consumer %s: watermark forced to %s (events published up to "
                       "then count as consumed by it)\n",
                       a.pos[1], t);
            }
        }
    } else
        rc = cli_usage("watermark", "%s", usage);
    obx_config_free(a.cfg);
    return rc;
}
