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
#include <sys/resource.h>
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

/* A daemon that could not start or run: a configuration error (a bad key or URL, a backend not
 * built in, a Kafka cluster that is not the configured one, a database role without the
 * grants the relay needs: OBX_EDENIED) exits 2, at once, like a usage
 * error, so that a service manager need not restart it (the unit's RestartPreventExitStatus);
 * anything else with its status of the CLI's contract (cli_exit_of: 3, could not). Waiting
 * cannot mend these: what can (a database or broker not there yet) is waited for and never
 * ends the daemon. */
static int start_fail(const char *cmd, const char *what, obx_err e) {
    int rc = cli_fail(cmd, what, e);
    return e == OBX_ECONFIG || e == OBX_EURL || e == OBX_EUNSUPPORTED || e == OBX_EREFUSED ||
                   e == OBX_EDENIED
               ? 2
               : rc;
}

static void now_iso(char *out, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
}

/* One record in the relay's log format (text, or one JSON object per line). */
static void relay_say(bool json_log, const char *level, const char *msg) {
    char when[40];
    now_iso(when, sizeof when);
    if (json_log) {
        json_t *o = json_pack("{s:s,s:s,s:s,s:s}", "ts", when, "level", level, "component", "relay",
                              "msg", msg);
        char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (line) fprintf(stderr, "%s\n", line);
        free(line);
        json_decref(o);
    } else
        fprintf(stderr, "%s %-5s relay: %s\n", when, level, msg);
}

/* The relay's numbers for its status line and the drain message. */
static void relay_numbers(obx_relay *r, long long *published, long long *in_flight) {
    char *stats = NULL;
    *published = *in_flight = 0;
    if (obx_relay_stats(r, &stats)) return;
    json_t *j = json_loads(stats, 0, NULL);
    *published = json_integer_value(json_object_get(j, "accepted"));
    *in_flight = json_integer_value(json_object_get(j, "in_flight"));
    json_decref(j);
    obx_free(stats);
}

/* The main thread while the relay runs: tells systemd how it is (notify.c), and stops it on
 * SIGINT/SIGTERM: the first drains what is outstanding for up to relay.drain_ms and says so,
 * a second stops at once (what is outstanding is left as after a kill: the attempts stay
 * SENDING until a sweeper turns them UNKNOWN and a reconciler settles them). Returns when the
 * relay's threads have ended (a stop, or a fatal error); *sig: the first signal, or 0. */
static void relay_supervise(obx_relay *r, const sigset_t *set, bool json_log, const char *drain_ms,
                            int *sig) {
    cli_notify n;
    cli_notify_init(&n);
    int signals = 0;
    while (!obx_relay_stopped(r)) {
        int got = wait_signal(set, 200);
        char why[700], status[700];
        long long published, in_flight;
        if (!got) {
            if (signals) { /* draining: still alive for the watchdog */
                cli_notify_watchdog(&n);
                continue;
            }
            int ready = obx_relay_ready(r, why, sizeof why);
            relay_numbers(r, &published, &in_flight);
            if (ready)
                snprintf(status, sizeof status, "serving: %lld published, %lld in flight",
                         published, in_flight);
            else
                snprintf(status, sizeof status, "not ready: %.600s", why);
            cli_notify_tick(&n, ready, status);
            continue;
        }
        if (++signals == 1) {
            *sig = got;
            relay_numbers(r, &published, &in_flight);
            snprintf(status, sizeof status,
                     "draining %lld outstanding outcomes (up to %s ms); signal again to stop now",
                     in_flight, drain_ms);
            relay_say(json_log, "info", status);
            cli_notify_stopping(&n, status);
            obx_relay_stop(r);
        } else {
            relay_numbers(r, &published, &in_flight);
            snprintf(status, sizeof status,
                     "stopping now: %lld outcomes left outstanding (the reconciler settles them)",
                     in_flight);
            relay_say(json_log, "warn", status);
            obx_relay_stop_now(r);
        }
    }
}

/* The consumer's stop hook (obx_consumer_options.stop): a SIGINT or SIGTERM is pending. They
 * stay blocked and pending until the main loop collects them. */
static int stop_requested(void *user) {
    const sigset_t *want = user;
    sigset_t p;
    if (sigpending(&p)) return 0;
    return (sigismember(want, SIGINT) && sigismember(&p, SIGINT)) ||
           (sigismember(want, SIGTERM) && sigismember(&p, SIGTERM));
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
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        if (c == 'c') config = optarg;
        /* log.format=json: every line this process writes is a JSON record, its errors too
         * (the file's own log.format is known once it loads, below) */
        if (c == 's' && !strcmp(optarg, "log.format=json")) cli_errors_json(true);
        if (c == '?')
            return cli_usage("relay", "usage: obx relay [--config FILE] [--db URL] [--broker URL] "
                                      "[--http ADDR:PORT] [--id ID] [--set KEY=VALUE]... "
                                      "[--broker-prop K=V]...");
    }
    if (optind < argc) return cli_usage("relay", "unexpected argument '%s'", argv[optind]);
    obx_config *cfg;
    obx_err e = config ? obx_config_load(config, &cfg) : obx_config_new(&cfg);
    if (e) return start_fail("relay", config ? config : "configuration", e);
    optind = 1;
    while (!e && (c = cli_getopt(argc, argv, "", opts)) != -1) {
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
        return start_fail("relay", "configuration", e);
    }
    char *log_format = NULL, *drain_ms = NULL;
    obx_config_get(cfg, "log.format", &log_format);
    obx_config_get(cfg, "relay.drain_ms", &drain_ms);
    bool json_log = log_format && !strcmp(log_format, "json");
    obx_free(log_format);
    if (json_log) cli_errors_json(true);
    sigset_t set;
    block_signals(&set);
    /* every connection of the HTTP listener (http.max_connections) is a descriptor: the soft
     * limit up to the hard one, as a daemon may (the packaged unit sets LimitNOFILE) */
    struct rlimit nofile;
    if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    obx_relay *r;
    e = obx_relay_start(cfg, &r);
    obx_config_free(cfg);
    if (e) {
        obx_free(drain_ms);
        return start_fail("relay", "start", e);
    }
    int sig = 0;
    relay_supervise(r, &set, json_log, drain_ms ? drain_ms : "?", &sig);
    obx_free(drain_ms);
    e = obx_relay_wait(r);
    char *stats = NULL;
    if (obx_relay_stats(r, &stats) == OBX_OK) {
        json_t *j = json_loads(stats, 0, NULL);
        char *line = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (json_log) { /* one JSON object per line, like every other record */
            char when[40];
            now_iso(when, sizeof when);
            fprintf(
                stderr,
                "{\"ts\":\"%s\",\"level\":\"info\",\"component\":\"relay\",\"msg\":\"stopped%s\","
                "\"counters\":%s}\n",
                when, sig ? " on signal" : "", line ? line : "{}");
        } else
            fprintf(stderr, "obx relay: stopped%s; counters: %s\n", sig ? " on signal" : "",
                    line ? line : stats);
        free(line);
        json_decref(j);
        obx_free(stats);
    }
    obx_relay_close(r);
    if (e) return start_fail("relay", "run", e);
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
    int js, unordered;
    const char *props[32]; /* --broker-prop, in order */
    int nprops;
    const char *topics[16], *types[64], *tenants[64]; /* the split lists (point into argv) */
    int nt, ny, nn;
    obx_store *s;      /* the inbox's store (owned) */
    sqlite3 *db;       /* the sample projection's connection (owned), or NULL with --exec */
    projection p;      /* the sample projection's handler state */
    exec_handler x;    /* --exec: the handler command's state */
    obx_consumer *con; /* the consumer (owned) */
    obx_config *cfg;   /* connect.* (--set), from the relay's configuration table (owned) */
    obx_otel *otel;    /* otel.* (--set): spans per delivery; NULL: off (owned) */
    obx_keyring *keys; /* encryption.keys (--set): opens sealed messages; NULL: none (owned) */
    int64_t retry_initial_ms, retry_max_ms;
    int64_t backoff_ms, backoff_max_ms; /* --retry-backoff (0: the inbox's defaults) */
    int64_t retry_wait; /* --until-idle: the due time (wall ms) of the last pending retry seen */
    sigset_t signals;   /* SIGINT, SIGTERM: blocked, collected by the main loop */
} consume_run;

/* "250ms", "1s", "5m", "1h" -> ms (1..86400000); -1 when malformed or out of range. */
static int64_t backoff_part(const char *s, size_t len) {
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    char buf[32], *end;
    if (!len || len >= sizeof buf || *s < '0' || *s > '9') return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    long long v = strtoll(buf, &end, 10);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].unit))
            return v >= 1 && v <= 86400000 / units[i].ms ? v * units[i].ms : -1;
    return -1;
}

/* --retry-backoff BASE[,MAX] (durations; "0": no back-off, retried as soon as redelivered) into
 * r; 0 or the exit status of a usage error. */
static int consume_backoff(consume_run *r, const char *arg) {
    if (!strcmp(arg, "0")) {
        r->backoff_ms = -1;
        return 0;
    }
    const char *comma = strchr(arg, ',');
    size_t blen = comma ? (size_t)(comma - arg) : strlen(arg);
    r->backoff_ms = backoff_part(arg, blen);
    r->backoff_max_ms = comma ? backoff_part(comma + 1, strlen(comma + 1)) : 300000;
    if (!comma && r->backoff_max_ms < r->backoff_ms) r->backoff_max_ms = r->backoff_ms;
    if (r->backoff_ms < 0 || r->backoff_max_ms < r->backoff_ms)
        return cli_usage("consume",
                         "--retry-backoff: '%s' is not BASE[,MAX] (durations of 1ms..24h such as "
                         "250ms, 1s, 5m; MAX >= BASE) or 0",
                         arg);
    return 0;
}

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
                                         {"retry-backoff", required_argument, 0, 'r'},
                                         {"until-idle", required_argument, 0, 'u'},
                                         {"fail-permille", required_argument, 0, 'f'},
                                         {"broker-prop", required_argument, 0, 'p'},
                                         {"exec", required_argument, 0, 'x'},
                                         {"poison-exit", required_argument, 0, 'P'},
                                         {"exec-timeout", required_argument, 0, 'o'},
                                         {"json", no_argument, 0, 'j'},
                                         {"set", required_argument, 0, 's'},
                                         {"unordered", no_argument, 0, 'U'},
                                         {0, 0, 0, 0}};
    int c;
    bool ok = true;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'D': r->cdb = optarg; break;
        case 'b': r->broker = optarg; break;
        case 't': r->topics_s = optarg; break;
        case 'c': r->consumer = optarg; break;
        case 'g': r->group = optarg; break;
        case 'T': r->types_s = optarg; break;
        case 'n': r->tenants_s = optarg; break;
        case 'm': r->max_failures = strtol(optarg, NULL, 10); break;
        case 'r':
            if ((c = consume_backoff(r, optarg))) return c;
            break;
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
        case 'U': r->unordered = 1; break;
        case 's': {
            /* the consumer's settings from the relay's table: only the wait for what it needs */
            const char *eq = strchr(optarg, '=');
            char key[64];
            if (!eq || (size_t)(eq - optarg) >= sizeof key)
                return cli_usage("consume", "--set: '%s' is not KEY=VALUE", optarg);
            memcpy(key, optarg, (size_t)(eq - optarg));
            key[eq - optarg] = '\0';
            if (strcmp(key, "connect.retry_initial_ms") && strcmp(key, "connect.retry_max_ms") &&
                strncmp(key, "otel.", 5) && strcmp(key, "encryption.keys"))
                return cli_usage("consume",
                                 "--set: '%s' is not a consumer setting (connect.retry_initial_ms, "
                                 "connect.retry_max_ms, otel.*, encryption.keys)",
                                 key);
            obx_err e = obx_config_set(r->cfg, key, eq + 1);
            if (e) return cli_usage("consume", "--set: %s", obx_errmsg());
            break;
        }
        default:
            return cli_usage("consume",
                             "usage: obx consume --consumer-db URL --topic T [--broker URL] "
                             "[--consumer ID] [--group G] [--types T1,T2|*] [--tenants A,B|*] "
                             "[--max-failures N] [--retry-backoff BASE[,MAX]] [--unordered] "
                             "[--until-idle MS] "
                             "[--exec CMD [--poison-exit N] "
                             "[--exec-timeout MS]] [--set KEY=VALUE]... [--json]");
        }
    }
    if (optind < argc) return cli_usage("consume", "unexpected argument '%s'", argv[optind]);
    return 0;
}

/* Validate: the flags' combinations and ranges, then the list flags split (0, or an exit
 * code). */
static int consume_validate(consume_run *r) {
    if (!r->cdb) return cli_usage("consume", "--consumer-db: required");
    char *lo = NULL, *hi = NULL;
    obx_config_get(r->cfg, "connect.retry_initial_ms", &lo);
    obx_config_get(r->cfg, "connect.retry_max_ms", &hi);
    r->retry_initial_ms = lo ? strtoll(lo, NULL, 10) : 500;
    r->retry_max_ms = hi ? strtoll(hi, NULL, 10) : 15000;
    obx_free(lo);
    obx_free(hi);
    if (r->retry_max_ms < r->retry_initial_ms)
        return cli_usage("consume",
                         "--set: connect.retry_max_ms is below connect.retry_initial_ms");
    /* malformed URLs are configuration errors, found before any wait */
    obx_err ue = obx_url_check(r->cdb, "store");
    if (ue) return start_fail("consume", r->cdb, ue);
    if ((ue = obx_url_check(r->broker, "broker"))) return start_fail("consume", r->broker, ue);
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

/* What `obx consume` waits for, and the one line per change it logs about each (as the relay
 * does, src/drivers/deps.c): "broker unreachable: ...; retrying in 2.0 s", then "broker
 * reachable again after 12.4 s". */
typedef struct consume_dep {
    const char *name;
    bool down, ever_up;
    long long since; /* monotonic ms, when it went down */
    obx_err code;    /* of the failure that took it down */
} consume_dep;

static long long mono_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether an error is one to wait out (not there yet, unreachable now) rather than one that
 * ends the consumer: the same kinds as the relay's (obx__dep_waitable in deps.c). */
static bool waitable(obx_err e) {
    return e == OBX_ECONNLOST || e == OBX_ENODB || e == OBX_EBROKER || e == OBX_EIO ||
           e == OBX_EBUSY || e == OBX_ESTORE;
}

static void dep_down(consume_dep *d, obx_err e, long long retry_ms) {
    if (d->down && d->code == e) return;
    if (!d->down) d->since = mono_now_ms();
    d->down = true;
    d->code = e;
    /* a warning: text, or a JSON object under --json */
    cli_warn("consume", obx_errname(e), "%s %s: %s: %s; retrying in %.1f s", d->name,
             waitable(e) ? "unreachable" : "failing", obx_errname(e), obx_errmsg(),
             (double)retry_ms / 1000.0);
}

static void dep_up(consume_dep *d) {
    if (d->down)
        cli_warn("consume", "reachable", "%s reachable %safter %.1f s", d->name,
                 d->ever_up ? "again " : "", (double)(mono_now_ms() - d->since) / 1000.0);
    d->down = false;
    d->ever_up = true;
}

/* One try at the inbox's store, the sample projection's SQLite connection (or SIGPIPE ignored
 * for --exec) and the consumer; on failure everything opened here is closed and *which names
 * what failed (0 the consumer's database, 1 the broker). */
static obx_err consume_try_open(consume_run *r, int *which) {
    *which = 0;
    obx_err e = obx_store_open(r->cdb, &r->s);
    if (!e) e = obx_store_init(r->s);
    if (e) {
        obx_store_close(r->s);
        r->s = NULL;
        return e;
    }
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
            char msg[700];
            snprintf(msg, sizeof msg, "cannot open %s: %s", path, sqlite3_errmsg(r->db));
            sqlite3_close(r->db);
            r->db = NULL;
            return obx_error_set(OBX_ESTORE, msg);
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
                                        .max_failures = (int)r->max_failures,
                                        .keys = r->keys,
                                        .retry_backoff_ms = r->backoff_ms,
                                        .retry_backoff_max_ms = r->backoff_max_ms},
                              .stop = stop_requested,
                              .stop_user = &r->signals,
                              .otel = r->otel,
                              .unordered = r->unordered};
    if (!e) {
        *which = 1;
        e = r->exec_cmd ? obx_consumer_open(r->s, NULL, &o, exec_handler_run, &r->x, &r->con)
                        : obx_consumer_open(r->s, r->db, &o, projection_handler, &r->p, &r->con);
        if (e == OBX_ESTORE) *which = 0;
    }
    if (e) {
        obx_store_close(r->s);
        sqlite3_close(r->db);
        r->s = NULL;
        r->db = NULL;
    }
    return e;
}

/* Open: tries until the consumer's database and the broker are both there, waiting out what
 * is not (capped exponential back-off with jitter: connect.retry_initial_ms ..
 * connect.retry_max_ms; a signal ends the wait). 0 once open; -1 when a signal came first; or
 * the exit code of an error that waiting cannot mend (a configuration error: 2). */
static int consume_open(consume_run *r, consume_dep deps[2]) {
    long long t0 = mono_now_ms();
    for (int fails = 0;; fails++) {
        int which = 0;
        obx_err e = consume_try_open(r, &which);
        if (!e) {
            dep_up(&deps[0]);
            dep_up(&deps[1]);
            return 0;
        }
        /* --until-idle: a run that never got anything stops too, and says why (exit 1) */
        if (!waitable(e) || (r->until_idle > 0 && mono_now_ms() - t0 >= r->until_idle))
            return start_fail("consume", which ? r->broker : r->cdb, e);
        if (which) dep_up(&deps[0]); /* the database was there: the broker was not */
        long long ms = obx_retry_delay_ms(r->retry_initial_ms, r->retry_max_ms, fails);
        dep_down(&deps[which], e, ms);
        if (wait_signal(&r->signals, (int)ms)) return -1;
    }
}

static int64_t wall_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* --until-idle, once idle that long: whether to stop. Not while a retry this consumer scheduled
 * is pending and due within the longest back-off it schedules (MAX + 20 % jitter; 1 s without
 * back-off), nor for --until-idle ms after the due time of the last such retry it saw (the
 * retry's delivery comes then): it waits for the retry, then idles. A retry due later than the
 * bound (kept by an earlier run with another MAX) does not keep it. */
static bool idle_stop(consume_run *r) {
    int64_t due = 0, now = wall_now_ms();
    int64_t max = r->backoff_ms < 0 ? 1000 : r->backoff_max_ms ? r->backoff_max_ms : 300000;
    if (!obx_consumer_next_retry(r->con, &due) && due && due - now <= max + max / 5 &&
        due > r->retry_wait)
        r->retry_wait = due;
    return now >= r->retry_wait + r->until_idle;
}

/* Run: polls until a signal, or until --until-idle ms pass with nothing delivered; k gets
 * the consumer's counts. A signal is looked at after every poll, and a poll returns after the
 * message in hand once one is pending (the consumer's stop hook, stop_requested): the rest of
 * its batch is not acknowledged and comes again. An error (the database or broker gone) is
 * waited out with the back-off, one line when it starts and one when it ends. */
static void consume_loop(consume_run *r, consume_dep deps[2], obx_consumer_counts *k) {
    cli_notify n;
    cli_notify_init(&n);
    struct timespec last;
    clock_gettime(CLOCK_MONOTONIC, &last);
    int fails = 0;
    for (;;) {
        long before = k->delivered + k->redriven + k->retried;
        obx_err e = obx_consumer_poll(r->con, 100, k);
        char status[200];
        if (e) {
            long long ms = obx_retry_delay_ms(r->retry_initial_ms, r->retry_max_ms, fails++);
            dep_down(&deps[e == OBX_EBROKER ? 1 : 0], e, ms);
            snprintf(status, sizeof status, "not ready: %s %s", deps[e == OBX_EBROKER].name,
                     waitable(e) ? "unreachable" : "failing");
            cli_notify_tick(&n, false, status);
            if (wait_signal(&r->signals, (int)ms)) break;
            continue;
        }
        fails = 0;
        dep_up(&deps[0]);
        dep_up(&deps[1]);
        snprintf(status, sizeof status, "consuming: %ld applied, %ld duplicates, %ld failed",
                 k->applied, k->duplicates, k->failed);
        cli_notify_tick(&n, true, status);
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        bool moved = k->delivered + k->redriven + k->retried != before;
        if (moved) last = now;
        if (wait_signal(&r->signals, moved ? 0 : 20)) {
            cli_notify_stopping(&n, "stopping: the message in hand is done; the rest comes again");
            break;
        }
        long idle = (now.tv_sec - last.tv_sec) * 1000 + (now.tv_nsec - last.tv_nsec) / 1000000;
        if (r->until_idle > 0 && idle >= r->until_idle && idle_stop(r)) break;
    }
}

/* Report: the counts, one JSON object on stdout (--json) or one line on stderr. */
static void consume_report(int js, const obx_consumer_counts *k) {
    if (js)
        printf("{\"delivered\":%ld,\"applied\":%ld,\"duplicates\":%ld,\"quarantined\":%ld,"
               "\"failed\":%ld,\"poisoned\":%ld,\"redriven\":%ld,\"delayed\":%ld,"
               "\"retried\":%ld}\n",
               k->delivered, k->applied, k->duplicates, k->quarantined, k->failed, k->poisoned,
               k->redriven, k->delayed, k->retried);
    else
        fprintf(stderr,
                "obx consume: delivered %ld, applied %ld, duplicates %ld, quarantined %ld, "
                "failed %ld, poisoned %ld, re-driven %ld, delayed %ld, retried %ld\n",
                k->delivered, k->applied, k->duplicates, k->quarantined, k->failed, k->poisoned,
                k->redriven, k->delayed, k->retried);
}

int cmd_consume(int argc, char **argv) {
    consume_run r = {.broker = CLI_DEFAULT_BROKER,
                     .consumer = "order-projection",
                     .poison_exit = 65,
                     .exec_timeout = 60000};
    if (obx_config_new(&r.cfg)) return cli_fail("consume", "configuration", OBX_ENOMEM);
    int rc = consume_options(&r, argc, argv);
    if (!rc) rc = consume_validate(&r);
    obx_err oe = OBX_OK;
    if (!rc && !obx_config_set(r.cfg, "broker", r.broker) && (oe = obx_otel_open(r.cfg, &r.otel)))
        rc = cli_fail("consume", "otel.endpoint", oe);
    char *ring = NULL;
    if (!rc && !obx_config_get(r.cfg, "encryption.keys", &ring) && ring && *ring &&
        (oe = obx_keyring_open(ring, &r.keys)))
        rc = cli_fail("consume", "encryption.keys", oe);
    obx_free(ring);
    /* blocked before anything starts: a signal during the wait for the broker ends it */
    if (!rc) block_signals(&r.signals);
    consume_dep deps[2] = {{.name = "consumer database"}, {.name = "broker"}};
    if (!rc) rc = consume_open(&r, deps);
    obx_config_free(r.cfg);
    obx_consumer_counts k = {0};
    if (rc > 0) {
        obx_otel_close(r.otel);
        obx_keyring_close(r.keys);
        return rc;
    }
    if (rc == 0) {
        consume_loop(&r, deps, &k);
        obx_consumer_close(r.con);
        obx_store_close(r.s);
        sqlite3_close(r.db);
    }
    obx_otel_close(r.otel);
    obx_keyring_close(r.keys);
    consume_report(r.js, &k);
    return 0;
}

int cmd_requeue(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB, *who = NULL;
    int js = 0;
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"who", required_argument, 0, 'w'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        if (c == 'd')
            db = optarg;
        else if (c == 'w')
            who = optarg;
        else if (c == 'j')
            js = 1;
        else
            return cli_usage("requeue",
                             "usage: obx requeue EVENT_ID [--who NAME] [--db URL] [--json]");
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
    if (js)
        cli_print_json(json_pack("{s:s,s:s,s:s,s:s}", "event_id", argv[optind], "from", "PARKED",
                                 "to", "PENDING", "who", who));
    else
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
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        if (c == 'd')
            db = optarg;
        else if (c == 'j')
            js = 1;
        else
            return cli_usage("report", "usage: obx report [--json] [--db URL]");
    }
    obx_store *s;
    int rc = cli_open_store_ro("report", db, &s);
    if (rc) return rc;
    char *out = NULL;
    obx_err e = obx_report(s, &out);
    obx_store_close(s);
    if (e) return cli_fail("report", db, e);
    json_t *j = json_loads(out, 0, NULL);
    bool hold = json_is_true(json_object_get(json_object_get(j, "invariants"), "hold"));
    /* a quarantined receipt is an open alarm: a broker or a consumer contradicted the outbox */
    long long quarantined = (long long)json_integer_value(
        json_object_get(json_object_get(j, "receipts"), "quarantined"));
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
        if (quarantined)
            printf("ALARM: %lld quarantined receipt%s (a broker or consumer contradicted the "
                   "outbox; `obx status` lists them)\n",
                   quarantined, quarantined == 1 ? "" : "s");
    }
    json_decref(j);
    obx_free(out);
    return hold && !quarantined ? CLI_EXIT_OK : CLI_EXIT_FINDING;
}

int cmd_poison(int argc, char **argv) {
    const char *cdb = NULL, *consumer = NULL;
    int js = 0;
    static const struct option opts[] = {{"consumer-db", required_argument, 0, 'D'},
                                         {"consumer", required_argument, 0, 'c'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    if (argc < 2 || (strcmp(argv[1], "list") && strcmp(argv[1], "redrive")))
        return cli_usage("poison", "usage: obx poison list|redrive [EVENT_ID] --consumer-db URL "
                                   "[--consumer ID]");
    bool redrive = !strcmp(argv[1], "redrive");
    int c;
    optind = 1;
    argc--;
    argv++;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        if (c == 'D')
            cdb = optarg;
        else if (c == 'c')
            consumer = optarg;
        else if (c == 'j')
            js = 1; /* list: its output is JSON anyway */
        else
            return cli_usage("poison", "usage: obx poison list|redrive [EVENT_ID] --consumer-db "
                                       "URL [--consumer ID] [--json]");
    }
    if (!cdb) return cli_usage("poison", "--consumer-db: required");
    obx_store *s;
    int rc = cli_open_store_with("poison", cdb, redrive ? 0 : OBX_STORE_READ_ONLY,
                                 "consumer database", &s);
    if (rc) return rc;
    obx_err e;
    if (redrive) {
        if (optind != argc - 1 || !consumer) {
            obx_store_close(s);
            return cli_usage("poison", "redrive needs EVENT_ID and --consumer");
        }
        e = obx_inbox_redrive(s, consumer, argv[optind]);
        if (!e && js)
            cli_print_json(json_pack("{s:s,s:s,s:b}", "event_id", argv[optind], "consumer",
                                     consumer, "redrive", 1));
        else if (!e)
            printf("%s: marked for re-drive by consumer %s\n", argv[optind], consumer);
    } else {
        char *out = NULL;
        e = obx_inbox_poison_list(s, consumer, &out);
        if (!e) printf("%s\n", out);
        obx_free(out);
    }
    obx_store_close(s);
    return e ? cli_fail("poison", cdb, e) : 0;
}
