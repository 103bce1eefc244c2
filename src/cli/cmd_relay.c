/*
 * cmd_relay.c — `obx relay`, `obx consume`, `obx requeue`, `obx report`, `obx poison`.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Blocks SIGINT/SIGTERM in every thread (threads inherit the mask); the main thread then
 * collects them with sigtimedwait. */
static void block_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, set, NULL);
}

static int wait_signal(const sigset_t *set, int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    int sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

int cmd_relay(int argc, char **argv) {
    /* Two malloc arenas for the whole daemon, set before any thread starts. With one arena per
     * thread (dispatchers, reconciler, auditor, librdkafka's), each keeps the freed batch
     * buffers of its busiest moment: peak RSS varied from 27 to 67 MiB between identical runs;
     * with two it stays near 26 MiB at the same CPU (docs/performance.md, resources). */
    mallopt(M_ARENA_MAX, 2);
    /* A transaction's arrays (up to relay.batch event rows of 3.8 KB each, several per
     * transaction, the attempts, the statement's parameters, libpq's results) are allocated
     * and freed per batch. Above glibc's dynamic thresholds they were mapped and unmapped, or
     * trimmed from the arena's top, every time, and each batch faulted its pages in afresh:
     * 161,333 minor faults in a 50,000-event RabbitMQ backlog, and half of the relay's CPU
     * (docs/performance.md, section 2). Nothing under 4 MiB is mapped on its own now, and an
     * arena keeps up to 4 MiB free at its top: 5,530-5,642 faults, relay CPU per event halved. */
    mallopt(M_MMAP_THRESHOLD, 4 << 20);
    mallopt(M_TRIM_THRESHOLD, 4 << 20);
    const char *config = NULL;
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},      {"db", required_argument, 0, 'd'},
        {"broker", required_argument, 0, 'b'},      {"http", required_argument, 0, 'h'},
        {"id", required_argument, 0, 'i'},          {"set", required_argument, 0, 's'},
        {"broker-prop", required_argument, 0, 'p'}, {0, 0, 0, 0}};
    /* first pass: the file; second pass: flags override it */
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'c') config = optarg;
        if (c == '?')
            return cli_usage("relay", "usage: obx relay [--config FILE] [--db URL] [--broker URL] "
                                      "[--http ADDR:PORT] [--id ID] [--set KEY=VALUE]... "
                                      "[--broker-prop K=V]...");
    }
    if (optind < argc) return cli_usage("relay", "unexpected argument '%s'", argv[optind]);
    obx_config *cfg;
    obx_err e = config ? obx_config_load(config, &cfg) : obx_config_new(&cfg);
    if (e) return cli_fail("relay", config ? config : "configuration", e);
    optind = 1;
    while (!e && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char key[128];
        switch (c) {
        case 'd': e = obx_config_set(cfg, "db", optarg); break;
        case 'b': e = obx_config_set(cfg, "broker", optarg); break;
        case 'h': e = obx_config_set(cfg, "http.listen", optarg); break;
        case 'i': e = obx_config_set(cfg, "relay.id", optarg); break;
        case 'p': e = obx_config_set(cfg, "broker_properties", optarg); break;
        case 's': {
            const char *eq = strchr(optarg, '=');
            if (!eq || (size_t)(eq - optarg) >= sizeof key) {
                obx_config_free(cfg);
                return cli_usage("relay", "--set: '%s' is not KEY=VALUE", optarg);
            }
            memcpy(key, optarg, (size_t)(eq - optarg));
            key[eq - optarg] = '\0';
            e = obx_config_set(cfg, key, eq + 1);
            break;
        }
        default: break;
        }
    }
    if (e) {
        obx_config_free(cfg);
        return cli_fail("relay", "configuration", e);
    }
    char *log_format = NULL;
    obx_config_get(cfg, "log.format", &log_format);
    bool json_log = log_format && !strcmp(log_format, "json");
    obx_free(log_format);
    sigset_t set;
    block_signals(&set);
    obx_relay *r;
    e = obx_relay_start(cfg, &r);
    obx_config_free(cfg);
    if (e) return cli_fail("relay", "start", e);
    int sig = 0;
    while (!(sig = wait_signal(&set, 200)) && !obx_relay_stopped(r)) {
    }
    obx_relay_stop(r);
    e = obx_relay_wait(r);
    char *stats = NULL;
    if (obx_relay_stats(r, &stats) == OBX_OK) {
        json_t *j = json_loads(stats, 0, NULL);
        char *line = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (json_log) { /* one JSON object per line, like every other record */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            struct tm tm;
            gmtime_r(&ts.tv_sec, &tm);
            fprintf(stderr,
                    "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"info\","
                    "\"component\":\"relay\",\"msg\":\"stopped%s\",\"counters\":%s}\n",
                    tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                    ts.tv_nsec / 1000000, sig ? " on signal" : "", line ? line : "{}");
        } else
            fprintf(stderr, "obx relay: stopped%s; counters: %s\n", sig ? " on signal" : "",
                    line ? line : stats);
        free(line);
        json_decref(j);
        obx_free(stats);
    }
    obx_relay_close(r);
    if (e) return cli_fail("relay", "run", e);
    return 0;
}

/* ---- consume: the sample effect is an order projection (projection.c) ---- */

static int split(char *s, const char **out, int max) {
    int n = 0;
    for (char *save = NULL, *t = s ? strtok_r(s, ",", &save) : NULL; t && n < max;
         t = strtok_r(NULL, ",", &save))
        out[n++] = t;
    return n;
}

/* A list flag: "*" declares nothing (any value accepted); absent: the given defaults. */
static int declared_list(char *s, const char **out, int max, const char *const *def, size_t ndef) {
    if (s && !strcmp(s, "*")) return 0;
    if (s) return split(s, out, max);
    int n = 0;
    for (size_t i = 0; i < ndef && n < max; i++) out[n++] = def[i];
    return n;
}

static long parse_long(const char *s, long min, long max, bool *ok) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    *ok = *s && !*end && !errno && v >= min && v <= max;
    return v;
}

/* What `obx consume` holds between its phases (cmd_consume and its helpers below). */
typedef struct consume_run {
    const char *cdb, *broker, *consumer, *group, *exec_cmd; /* flags (argv or defaults) */
    char *topics_s, *types_s, *tenants_s;                   /* list flags, split in place */
    long until_idle, max_failures, fail_permille, poison_exit, exec_timeout;
    int js;
    const char *props[32]; /* --broker-prop, in order */
    int nprops;
    const char *topics[16], *types[64], *tenants[64]; /* the split lists (point into argv) */
    int nt, ny, nn;
    obx_store *s;      /* the inbox's store (owned) */
    sqlite3 *db;       /* the sample projection's connection (owned), or NULL with --exec */
    projection p;      /* the sample projection's handler state */
    exec_handler x;    /* --exec: the handler command's state */
    obx_consumer *con; /* the consumer (owned) */
} consume_run;

/* Options: parses argv into r (0, or the exit code of a usage error). */
static int consume_options(consume_run *r, int argc, char **argv) {
    static const struct option opts[] = {{"consumer-db", required_argument, 0, 'D'},
                                         {"broker", required_argument, 0, 'b'},
                                         {"topic", required_argument, 0, 't'},
                                         {"consumer", required_argument, 0, 'c'},
                                         {"group", required_argument, 0, 'g'},
                                         {"types", required_argument, 0, 'T'},
                                         {"tenants", required_argument, 0, 'n'},
                                         {"max-failures", required_argument, 0, 'm'},
                                         {"until-idle", required_argument, 0, 'u'},
                                         {"fail-permille", required_argument, 0, 'f'},
                                         {"broker-prop", required_argument, 0, 'p'},
                                         {"exec", required_argument, 0, 'x'},
                                         {"poison-exit", required_argument, 0, 'P'},
                                         {"exec-timeout", required_argument, 0, 'o'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int c;
    bool ok = true;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'D': r->cdb = optarg; break;
        case 'b': r->broker = optarg; break;
        case 't': r->topics_s = optarg; break;
        case 'c': r->consumer = optarg; break;
        case 'g': r->group = optarg; break;
        case 'T': r->types_s = optarg; break;
        case 'n': r->tenants_s = optarg; break;
        case 'm': r->max_failures = strtol(optarg, NULL, 10); break;
        case 'u': r->until_idle = strtol(optarg, NULL, 10); break;
        case 'f': r->fail_permille = strtol(optarg, NULL, 10); break;
        case 'p':
            if (r->nprops < 32) r->props[r->nprops++] = optarg;
            break;
        case 'x': r->exec_cmd = optarg; break;
        case 'P':
            r->poison_exit = parse_long(optarg, 1, 255, &ok);
            if (!ok) return cli_usage("consume", "--poison-exit: '%s' is not 1..255", optarg);
            break;
        case 'o':
            r->exec_timeout = parse_long(optarg, 1, 86400000, &ok);
            if (!ok)
                return cli_usage("consume", "--exec-timeout: '%s' is not 1..86400000 (ms)", optarg);
            break;
        case 'j': r->js = 1; break;
        default:
            return cli_usage("consume",
                             "usage: obx consume --consumer-db URL --topic T [--broker URL] "
                             "[--consumer ID] [--group G] [--types T1,T2|*] [--tenants A,B|*] "
                             "[--max-failures N] [--until-idle MS] [--exec CMD [--poison-exit N] "
                             "[--exec-timeout MS]] [--json]");
        }
    }
    if (optind < argc) return cli_usage("consume", "unexpected argument '%s'", argv[optind]);
    return 0;
}

/* Validate: the flags' combinations and ranges, then the list flags split (0, or an exit
 * code). */
static int consume_validate(consume_run *r) {
    if (!r->cdb) return cli_usage("consume", "--consumer-db: required");
    if (!r->exec_cmd && strncmp(r->cdb, "sqlite:", 7))
        return cli_usage("consume", "--consumer-db: a sqlite:PATH URL is required (the sample "
                                    "projection lives in SQLite; with --exec any store URL)");
    if (r->exec_cmd && !*r->exec_cmd) return cli_usage("consume", "--exec: an empty command");
    if (r->exec_cmd && r->fail_permille)
        return cli_usage("consume", "--fail-permille: only for the sample projection, not --exec");
    if (!r->topics_s) return cli_usage("consume", "--topic: required");
    if (r->fail_permille < 0 || r->fail_permille > 1000)
        return cli_usage("consume", "--fail-permille: 0..1000");
    /* the sample projection declares its contracts and tenants; a command declares what the
     * flags say (none: any) */
    r->nt = split(r->topics_s, r->topics, 16);
    r->ny = declared_list(r->types_s, r->types, 64, r->exec_cmd ? NULL : projection_types,
                          r->exec_cmd ? 0 : projection_n_types);
    r->nn = declared_list(r->tenants_s, r->tenants, 64, r->exec_cmd ? NULL : projection_tenants,
                          r->exec_cmd ? 0 : projection_n_tenants);
    return 0;
}

/* Open: the inbox's store, the sample projection's SQLite connection (or SIGPIPE ignored for
 * --exec) and the consumer; on failure everything opened here is closed (0, or an exit code). */
static int consume_open(consume_run *r) {
    obx_err e = obx_store_open(r->cdb, &r->s);
    if (!e) e = obx_store_init(r->s);
    if (e) return cli_fail("consume", r->cdb, e);
    r->p = (projection){(unsigned)r->fail_permille, 0x2545f4914f6cdd1dull ^ (uint64_t)getpid()};
    r->x = (exec_handler){.cmd = r->exec_cmd,
                          .consumer = r->consumer,
                          .poison_exit = (int)r->poison_exit,
                          .timeout_ms = r->exec_timeout};
    if (r->exec_cmd) {
        /* a command that closed its stdin early must not kill the consumer */
        signal(SIGPIPE, SIG_IGN);
    } else {
        /* the projection writes through the inbox's own SQLite connection */
        obx_store_close(r->s);
        r->s = NULL;
        const char *path = r->cdb + 7 + (strncmp(r->cdb + 7, "//", 2) ? 0 : 2);
        if (sqlite3_open(path, &r->db) != SQLITE_OK) {
            fprintf(stderr, "obx consume: cannot open %s\n", path);
            sqlite3_close(r->db);
            return 1;
        }
        sqlite3_busy_timeout(r->db, 10000);
        sqlite3_exec(r->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
        e = projection_setup(&r->p, r->db);
        if (!e) e = obx_store_wrap_sqlite(r->db, &r->s);
    }
    obx_consumer_options o = {.broker_url = r->broker,
                              .broker_props = r->props,
                              .n_broker_props = (size_t)r->nprops,
                              .group = r->group,
                              .topics = r->topics,
                              .n_topics = (size_t)r->nt,
                              .inbox = {.consumer_id = r->consumer,
                                        .event_types = r->ny ? r->types : NULL,
                                        .n_event_types = (size_t)r->ny,
                                        .tenants = r->nn ? r->tenants : NULL,
                                        .n_tenants = (size_t)r->nn,
                                        .max_failures = (int)r->max_failures}};
    if (!e)
        e = r->exec_cmd ? obx_consumer_open(r->s, NULL, &o, exec_handler_run, &r->x, &r->con)
                        : obx_consumer_open(r->s, r->db, &o, projection_handler, &r->p, &r->con);
    if (e) {
        int rc = cli_fail("consume", "start", e);
        obx_store_close(r->s);
        sqlite3_close(r->db);
        return rc;
    }
    return 0;
}

/* Run: polls until a signal, or until --until-idle ms pass with nothing delivered; k gets
 * the consumer's counts. */
static void consume_loop(consume_run *r, obx_consumer_counts *k) {
    sigset_t set;
    block_signals(&set);
    struct timespec last;
    clock_gettime(CLOCK_MONOTONIC, &last);
    for (;;) {
        long before = k->delivered + k->redriven;
        obx_err e = obx_consumer_poll(r->con, 100, k);
        if (e) {
            fprintf(stderr, "obx consume: %s: %s (retrying)\n", obx_errname(e), obx_errmsg());
            usleep(200000);
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (k->delivered + k->redriven != before)
            last = now;
        else if (wait_signal(&set, 20))
            break;
        long idle = (now.tv_sec - last.tv_sec) * 1000 + (now.tv_nsec - last.tv_nsec) / 1000000;
        if (r->until_idle > 0 && idle >= r->until_idle) break;
    }
}

/* Report: the counts, one JSON object on stdout (--json) or one line on stderr. */
static void consume_report(int js, const obx_consumer_counts *k) {
    if (js)
        printf("{\"delivered\":%ld,\"applied\":%ld,\"duplicates\":%ld,\"quarantined\":%ld,"
               "\"failed\":%ld,\"poisoned\":%ld,\"redriven\":%ld}\n",
               k->delivered, k->applied, k->duplicates, k->quarantined, k->failed, k->poisoned,
               k->redriven);
    else
        fprintf(stderr,
                "obx consume: delivered %ld, applied %ld, duplicates %ld, quarantined %ld, "
                "failed %ld, poisoned %ld, re-driven %ld\n",
                k->delivered, k->applied, k->duplicates, k->quarantined, k->failed, k->poisoned,
                k->redriven);
}

int cmd_consume(int argc, char **argv) {
    consume_run r = {.broker = CLI_DEFAULT_BROKER,
                     .consumer = "order-projection",
                     .poison_exit = 65,
                     .exec_timeout = 60000};
    int rc = consume_options(&r, argc, argv);
    if (!rc) rc = consume_validate(&r);
    if (!rc) rc = consume_open(&r);
    if (rc) return rc;
    obx_consumer_counts k = {0};
    consume_loop(&r, &k);
    obx_consumer_close(r.con);
    obx_store_close(r.s);
    sqlite3_close(r.db);
    consume_report(r.js, &k);
    return 0;
}

int cmd_requeue(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB, *who = NULL;
    static const struct option opts[] = {
        {"db", required_argument, 0, 'd'}, {"who", required_argument, 0, 'w'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'd')
            db = optarg;
        else if (c == 'w')
            who = optarg;
        else
            return cli_usage("requeue", "usage: obx requeue EVENT_ID [--who NAME] [--db URL]");
    }
    if (optind != argc - 1) return cli_usage("requeue", "expected one EVENT_ID");
    obx_store *s;
    int rc = cli_open_store("requeue", db, &s);
    if (rc) return rc;
    char whobuf[128];
    if (!who) {
        const char *u = getenv("USER");
        snprintf(whobuf, sizeof whobuf, "operator:%s", u && *u ? u : "unknown");
        who = whobuf;
    }
    obx_err e = obx_requeue(s, argv[optind], who);
    obx_store_close(s);
    if (e) return cli_fail("requeue", argv[optind], e);
    printf("%s: PARKED -> PENDING (requeued by %s)\n", argv[optind], who);
    return 0;
}

int cmd_report(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB;
    int js = 0;
    static const struct option opts[] = {
        {"db", required_argument, 0, 'd'}, {"json", no_argument, 0, 'j'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'd')
            db = optarg;
        else if (c == 'j')
            js = 1;
        else
            return cli_usage("report", "usage: obx report [--json] [--db URL]");
    }
    obx_store *s;
    int rc = cli_open_store("report", db, &s);
    if (rc) return rc;
    char *out = NULL;
    obx_err e = obx_report(s, &out);
    obx_store_close(s);
    if (e) return cli_fail("report", db, e);
    json_t *j = json_loads(out, 0, NULL);
    bool hold = json_is_true(json_object_get(json_object_get(j, "invariants"), "hold"));
    if (js)
        printf("%s\n", out);
    else {
        json_t *st = json_object_get(j, "states"), *rc_ = json_object_get(j, "receipts"),
               *un = json_object_get(j, "unknown");
        const char *k;
        json_t *v;
        printf("events: %lld committed, %lld published\n",
               (long long)json_integer_value(json_object_get(j, "committed")),
               (long long)json_integer_value(json_object_get(j, "published")));
        json_object_foreach(st, k, v) {
            if (json_integer_value(v))
                printf("  %-17s %lld\n", k, (long long)json_integer_value(v));
        }
        printf("receipts:\n");
        json_object_foreach(rc_, k, v) {
            printf("  %-17s %lld\n", k, (long long)json_integer_value(v));
        }
        printf("unknown outcomes resolved: %lld (p50 %lld ms, p99 %lld ms, max %lld ms); open "
               "UNKNOWN attempts: %lld\n",
               (long long)json_integer_value(json_object_get(un, "resolved")),
               (long long)json_integer_value(json_object_get(un, "p50_ms")),
               (long long)json_integer_value(json_object_get(un, "p99_ms")),
               (long long)json_integer_value(json_object_get(un, "max_ms")),
               (long long)json_integer_value(json_object_get(un, "open_attempts")));
        json_t *ds = json_object_get(j, "delivery_sets");
        if (json_integer_value(json_object_get(ds, "sets")))
            printf("delivery sets: %lld, delivered under their rule: %lld\n",
                   (long long)json_integer_value(json_object_get(ds, "sets")),
                   (long long)json_integer_value(json_object_get(ds, "complete")));
        printf("invariants (one primary receipt per published event): %s\n",
               hold ? "hold" : "VIOLATED");
    }
    json_decref(j);
    obx_free(out);
    return hold ? 0 : 1;
}

int cmd_poison(int argc, char **argv) {
    const char *cdb = NULL, *consumer = NULL;
    static const struct option opts[] = {{"consumer-db", required_argument, 0, 'D'},
                                         {"consumer", required_argument, 0, 'c'},
                                         {0, 0, 0, 0}};
    if (argc < 2 || (strcmp(argv[1], "list") && strcmp(argv[1], "redrive")))
        return cli_usage("poison", "usage: obx poison list|redrive [EVENT_ID] --consumer-db URL "
                                   "[--consumer ID]");
    bool redrive = !strcmp(argv[1], "redrive");
    int c;
    optind = 1;
    argc--;
    argv++;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'D')
            cdb = optarg;
        else if (c == 'c')
            consumer = optarg;
        else
            return cli_usage("poison", "unknown option");
    }
    if (!cdb) return cli_usage("poison", "--consumer-db: required");
    obx_store *s;
    int rc = cli_open_store("poison", cdb, &s);
    if (rc) return rc;
    obx_err e;
    if (redrive) {
        if (optind != argc - 1 || !consumer) {
            obx_store_close(s);
            return cli_usage("poison", "redrive needs EVENT_ID and --consumer");
        }
        e = obx_inbox_redrive(s, consumer, argv[optind]);
        if (!e) printf("%s: marked for re-drive by consumer %s\n", argv[optind], consumer);
    } else {
        char *out = NULL;
        e = obx_inbox_poison_list(s, consumer, &out);
        if (!e) printf("%s\n", out);
        obx_free(out);
    }
    obx_store_close(s);
    return e ? cli_fail("poison", cdb, e) : 0;
}
