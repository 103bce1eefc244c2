/*
 * cmd_demo.c — `obx demo`: the whole pipeline on the embedded default, with faults.
 *
 *   1. an order service commits N orders, each with its event envelope in the same SQLite
 *      transaction (and a few transactions roll back: no order, no event);
 *   2. two relay processes run against the same outbox, with the local log broker's fault
 *      knobs on (lost, timed-out and late ACKs, duplicate appends, lost requests); one is
 *      paused (SIGSTOP) past its lease and resumed, so its late ACKs arrive after the
 *      reconciler took over; the other is killed with SIGKILL mid-batch and replaced;
 *   3. a consumer applies an order projection through the inbox (with flaky handler failures
 *      and lost offset commits);
 *   4. when everything is published and consumed: a table of what happened and the invariants
 *      (lost 0, duplicate effects 0, one primary receipt per event). Exit 0 only if they hold.
 *
 * Relays and the consumer are this same binary started as child processes (`obx relay`,
 * `obx consume`): the demo uses only the public API and the CLI.
 */
#include "cli.h"
#include "obx_test.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#ifdef OBX_WITH_POSTGRES
#include <libpq-fe.h>
#else
#include "pq_off.h" /* OBX_WITH_POSTGRES=OFF: a PostgreSQL URL fails to connect */
#endif
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The demo's own SQL (business rows, progress, checks) on SQLite or PostgreSQL. On
 * PostgreSQL obx's tables live in schema obx; search_path makes the same SQL work on both. */
typedef struct sqlx {
    sqlite3 *lite;
    PGconn *pg;
} sqlx;

static int sqlx_open(sqlx *x, const char *url) {
    memset(x, 0, sizeof *x);
    if (!strncmp(url, "sqlite:", 7)) {
        const char *path = url + 7 + (strncmp(url + 7, "//", 2) ? 0 : 2);
        if (sqlite3_open(path, &x->lite) != SQLITE_OK) return -1;
        sqlite3_busy_timeout(
            x->lite, 2000); /* short: the order loop retries and must keep resuming relay A */
        return 0;
    }
    x->pg = PQconnectdb(url);
    if (PQstatus(x->pg) != CONNECTION_OK) {
        cli_warn("demo", "OBX_ECONNLOST", "%s", PQerrorMessage(x->pg));
        return -1;
    }
    PQclear(PQexec(x->pg, "SET search_path = obx, public"));
    PQclear(PQexec(x->pg, "SET client_min_messages = warning"));
    return 0;
}

static void sqlx_close(sqlx *x) {
    if (x->lite) sqlite3_close(x->lite);
    if (x->pg) PQfinish(x->pg);
}

static int sqlx_exec(sqlx *x, const char *sql) {
    if (x->lite) return sqlite3_exec(x->lite, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
    PGresult *r = PQexec(x->pg, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return ok ? 0 : -1;
}

/* One integer from a one-row query; -1 on error. */
static long long q1(sqlx *x, const char *sql) {
    long long v = -1;
    if (x->lite) {
        sqlite3_stmt *st;
        if (sqlite3_prepare_v2(x->lite, sql, -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return v;
    }
    PGresult *r = PQexec(x->pg, sql);
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

static const char *sqlx_err(sqlx *x) {
    return x->lite ? sqlite3_errmsg(x->lite) : PQerrorMessage(x->pg);
}

/* All values of a one-column text query, sorted (for set comparisons across databases). */
static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char **qcol(sqlx *x, const char *sql, size_t *n) {
    size_t cap = 1024;
    char **v = malloc(cap * sizeof *v);
    *n = 0;
    if (!v) return NULL;
    if (x->lite) {
        sqlite3_stmt *st;
        if (sqlite3_prepare_v2(x->lite, sql, -1, &st, NULL) == SQLITE_OK)
            while (sqlite3_step(st) == SQLITE_ROW) {
                if (*n == cap) {
                    char **p = realloc(v, (cap *= 2) * sizeof *v);
                    if (!p) break;
                    v = p;
                }
                v[(*n)++] = strdup((const char *)sqlite3_column_text(st, 0));
            }
        sqlite3_finalize(st);
    } else {
        PGresult *r = PQexec(x->pg, sql);
        int rows = PQresultStatus(r) == PGRES_TUPLES_OK ? PQntuples(r) : 0;
        for (int i = 0; i < rows; i++) {
            if (*n == cap) {
                char **p = realloc(v, (cap *= 2) * sizeof *v);
                if (!p) break;
                v = p;
            }
            v[(*n)++] = strdup(PQgetvalue(r, i, 0));
        }
        PQclear(r);
    }
    qsort(v, *n, sizeof *v, cmp_str);
    return v;
}

static void free_col(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

typedef struct demo {
    char dir[512];
    char outbox_url[1024];
    char consumer_path[600], consumer_url[640];
    char broker_base[640];
    char broker_url_a[1024], broker_url_b[1024], broker_url_c[1024], broker_url_consumer[1024];
    bool custom_broker;
    const char *relay_props[8];
    int n_relay_props;
    const char *consumer_props[8];
    int n_consumer_props;
    const char *consume_from; /* topic (log, Kafka) or queue (AMQP) */
    char topic[64];           /* the route's topic (Kafka, log) or exchange (AMQP) */
    char amqp_names[5][128];  /* per-run exchange, queue and stream settings (AMQP) */
    long events;
    long lease_ms;
    int json;
    pid_t relay_a, relay_b, relay_c, consumer;
    char self[1024];
} demo;

static long long mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void msleep(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

/* Starts this binary with args, stdout/stderr to DIR/log. */
static pid_t spawn(demo *d, const char *log, char *const args[]) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s", d->dir, log);
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(d->self, args);
        _exit(127);
    }
    return pid;
}

static pid_t start_relay(demo *d, const char *id, const char *broker) {
    char lease[64], log[64];
    snprintf(lease, sizeof lease, "relay.lease_ms=%ld", d->lease_ms);
    snprintf(log, sizeof log, "%s.log", id);
    char *args[48] = {"obx",      "relay",
                      "--db",     d->outbox_url,
                      "--broker", (char *)broker,
                      "--id",     (char *)id,
                      "--set",    lease,
                      "--set",    "relay.reconcile_lease_ms=2000",
                      "--set",    "relay.sweep_ms=250",
                      "--set",    "relay.reconcile_ms=250",
                      "--set",    "relay.recheck_ms=300",
                      "--set",    "relay.poll_ms=20",
                      "--set",    "relay.backoff_base_ms=100",
                      "--set",    "relay.batch=200",
                      "--set",    "log.format=json",
                      NULL};
    int n = 0;
    while (args[n]) n++;
    for (int i = 0; i < d->n_relay_props; i++) {
        args[n++] = "--broker-prop";
        args[n++] = (char *)d->relay_props[i];
    }
    args[n] = NULL;
    return spawn(d, log, args);
}

static pid_t start_consumer(demo *d) {
    char *args[40] = {"obx",
                      "consume",
                      "--consumer-db",
                      d->consumer_url,
                      "--broker",
                      d->broker_url_consumer,
                      "--topic",
                      (char *)d->consume_from,
                      "--consumer",
                      "order-projection",
                      "--fail-permille",
                      "5",
                      "--max-failures",
                      "8",
                      NULL};
    int n = 0;
    while (args[n]) n++;
    for (int i = 0; i < d->n_consumer_props; i++) {
        args[n++] = "--broker-prop";
        args[n++] = (char *)d->consumer_props[i];
    }
    args[n] = NULL;
    return spawn(d, "consumer.log", args);
}

/* True when child *pid has already exited; it is reaped here and *pid is cleared, so a
 * later stop() cannot signal a recycled pid. */
static bool child_gone(pid_t *pid) {
    int st;
    if (*pid <= 0 || waitpid(*pid, &st, WNOHANG) != *pid) return false;
    *pid = 0;
    return true;
}

static void stop(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int st;
    for (int i = 0; i < 300; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) return;
        msleep(50);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
}

/* The order service: N business transactions, each an order row + its envelope. */
typedef struct service {
    sqlx db;
    obx_store *s;
    long next;
    long committed, rolled_back;
    char err[512]; /* why the last order failed, read when it failed (a ROLLBACK clears it) */
} service;

static int insert_order(service *sv, const char *id, long total) {
    if (sv->db.lite) {
        sqlite3_stmt *st;
        int ok = sqlite3_prepare_v2(sv->db.lite,
                                    "INSERT INTO orders (order_id, total_cents, status) VALUES "
                                    "(?, ?, 'created')",
                                    -1, &st, NULL) == SQLITE_OK;
        if (ok) {
            sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 2, total);
            ok = sqlite3_step(st) == SQLITE_DONE;
        }
        sqlite3_finalize(st);
        return ok ? 0 : -1;
    }
    char tot[32];
    snprintf(tot, sizeof tot, "%ld", total);
    const char *vals[2] = {id, tot};
    PGresult *r = PQexecParams(sv->db.pg,
                               "INSERT INTO public.orders (order_id, total_cents, status) VALUES "
                               "($1, $2::bigint, 'created')",
                               2, NULL, vals, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok ? 0 : -1;
}

static int commit_order(service *sv, bool roll_back) {
    char id[32], payload[256], txid[48], corr[48];
    long n = sv->next++;
    long total = 1000 + (n * 37) % 90000;
    snprintf(id, sizeof id, "o-%ld", n);
    snprintf(payload, sizeof payload,
             "{\"order\":\"%s\",\"customer\":\"c-%ld\",\"total_cents\":%ld,\"currency\":\"EUR\"}",
             id, n % 97, total);
    snprintf(txid, sizeof txid, "demo-tx-%ld", n);
    snprintf(corr, sizeof corr, "checkout-%ld", n);
    if (sqlx_exec(&sv->db, sv->db.lite ? "BEGIN IMMEDIATE" : "BEGIN")) {
        snprintf(sv->err, sizeof sv->err, "%s", sqlx_err(&sv->db));
        return -1;
    }
    int ok = insert_order(sv, id, total) == 0;
    if (!ok) snprintf(sv->err, sizeof sv->err, "%s", sqlx_err(&sv->db));
    obx_event ev = {.event_type = "order.created.v1",
                    .aggregate_type = "order",
                    .aggregate_id = id,
                    .aggregate_version = 1,
                    .tenant = n % 3 ? "tenant-7" : "tenant-9",
                    .payload = payload,
                    .payload_len = strlen(payload),
                    .correlation_id = corr,
                    .idempotency_key = id,
                    .txid = sv->db.lite ? txid : NULL};
    obx_enqueue_result res;
    if (ok && obx_enqueue(sv->s, &ev, &res) != OBX_OK) {
        snprintf(sv->err, sizeof sv->err, "enqueue: %s", obx_errmsg());
        ok = 0;
    }
    if (!ok || roll_back) {
        sqlx_exec(&sv->db, "ROLLBACK");
        if (ok) sv->rolled_back++; /* e.g. payment declined: no order, no event */
        return ok ? 0 : -1;
    }
    if (sqlx_exec(&sv->db, "COMMIT")) {
        snprintf(sv->err, sizeof sv->err, "%s", sqlx_err(&sv->db));
        sqlx_exec(&sv->db, "ROLLBACK");
        return -1;
    }
    sv->committed++;
    return 0;
}

static void progress(demo *d, sqlx *out, sqlx *con, const char *phase) {
    long long pub = q1(out, "SELECT count(*) FROM obx_event WHERE state = 'PUBLISHED'");
    long long unk = q1(out, "SELECT count(*) FROM obx_event WHERE state IN ('DISPATCH_UNKNOWN',"
                            "'RECONCILING','RETRY_CLAIMED')");
    long long com = q1(out, "SELECT count(*) FROM obx_event");
    long long eff = q1(con, "SELECT count(*) FROM order_projection");
    if (!d->json) {
        bool tty = isatty(2);
        fprintf(stderr,
                "%s  %-26s committed %6lld  published %6lld  unknown %4lld  consumed %6lld%s",
                tty ? "\r" : "", phase, com, pub, unk, eff < 0 ? 0 : eff, tty ? "" : "\n");
        fflush(stderr);
    }
}

static int setup(demo *d) {
    obx_store *s;
    obx_err e;
    if ((e = obx_store_open(d->outbox_url, &s))) return cli_fail("demo", d->outbox_url, e);
    if ((e = obx_store_init(s))) {
        obx_store_close(s);
        return cli_fail("demo", d->outbox_url, e);
    }
    char cluster[129];
    if ((e = obx_broker_cluster_id(d->broker_base, d->relay_props, (size_t)d->n_relay_props,
                                   cluster, sizeof cluster))) {
        obx_store_close(s);
        return cli_fail("demo", d->broker_base, e);
    }
    obx_route r = {.event_type = "order.created.v1",
                   .cluster = cluster,
                   .topic = d->topic,
                   .routing_key = "{tenant}.order.{aggregate_id}",
                   .max_attempts = 20}; /* the UNKNOWN policy is the default: retry */
    int64_t gen;
    e = obx_route_set(s, &r, &gen);
    obx_store_close(s);
    if (e) return cli_fail("demo", "route", e);
    if ((e = obx_store_open(d->consumer_url, &s)) || (e = obx_store_init(s)))
        return cli_fail("demo", d->consumer_url, e);
    obx_store_close(s);
    return 0;
}

/* Events of the outbox with no effect row in the consumer (the two may be different
 * databases, so compare sorted ID lists). */
static long long count_lost(sqlx *out, sqlx *con) {
    size_t ne = 0, np = 0;
    char **ev = qcol(out, "SELECT event_id FROM obx_event", &ne);
    char **pr = qcol(con, "SELECT DISTINCT event_id FROM order_projection", &np);
    long long lost = 0;
    size_t j = 0;
    for (size_t i = 0; i < ne; i++) {
        while (j < np && strcmp(pr[j], ev[i]) < 0) j++;
        if (j >= np || strcmp(pr[j], ev[i])) lost++;
    }
    free_col(ev, ne);
    free_col(pr, np);
    return lost;
}

/* What one `obx demo` run holds between its phases (cmd_demo and its helpers below). */
typedef struct demo_run {
    demo d;
    service sv;
    sqlx out, con;                   /* the outbox and consumer databases, for counting */
    obx_kafka_mock *mock;            /* --broker kafka: the in-process cluster, else NULL */
    char *red_db, *red_broker;       /* redacted URLs for output (owned) */
    long long t0, committed_at, end; /* monotonic ms: start, last commit, settled or gave up */
    bool settled;                    /* everything published and consumed before the deadline */
    bool gave_up;                    /* the order service failed for good (the reason printed) */
    const char *dir, *broker, *db;   /* --dir, --broker, --db (argv or static), or NULL */
    bool force;                      /* --force: an earlier demo's files in --dir are removed */
} demo_run;

/* Options: parses and validates argv into r (0, or the exit code of a usage error). */
static int demo_options(demo_run *r, int argc, char **argv) {
    demo *d = &r->d;
    d->events = 10000;
    d->lease_ms = 1500;
    static const struct option opts[] = {
        {"events", required_argument, 0, 'n'},   {"dir", required_argument, 0, 'd'},
        {"broker", required_argument, 0, 'b'},   {"db", required_argument, 0, 'D'},
        {"lease-ms", required_argument, 0, 'l'}, {"json", no_argument, 0, 'j'},
        {"force", no_argument, 0, 'f'},          {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'f': r->force = true; break;
        case 'n':
            d->events = strtol(optarg, &end, 10);
            if (*end || d->events < 1 || d->events > 10000000)
                return cli_usage("demo", "--events: '%s' is not in 1..10000000", optarg);
            break;
        case 'd': r->dir = optarg; break;
        case 'b': r->broker = optarg; break;
        case 'D': r->db = optarg; break;
        case 'l':
            d->lease_ms = strtol(optarg, &end, 10);
            if (*end || d->lease_ms < 200) return cli_usage("demo", "--lease-ms: at least 200");
            break;
        case 'j': d->json = 1; break;
        default:
            return cli_usage("demo",
                             "usage: obx demo [--events N] [--dir DIR [--force]] [--db URL] "
                             "[--broker URL|kafka] [--lease-ms MS] [--json]");
        }
    }
    if (optind < argc) return cli_usage("demo", "unexpected argument '%s'", argv[optind]);
    if (r->db && obx_url_check(r->db, "store")) return cli_fail("demo", "--db", OBX_EURL);
    if (r->broker && strcmp(r->broker, "kafka") && obx_url_check(r->broker, "broker"))
        return cli_fail("demo", "--broker", OBX_EURL);
    return 0;
}

/* What a demo leaves in its folder (and SQLite's -wal and -shm files beside the databases). */
static const char *const demo_files[] = {"outbox.db",   "broker.db",   "consumer.db", "relay-a.log",
                                         "relay-b.log", "relay-c.log", "consumer.log"};

/* An earlier demo in --dir is refused at once, before anything runs: a second run would meet
 * its orders (every commit refused) and its messages on the topic, and wait out its deadline.
 * With --force its files are removed first. A usage error (exit status 2): the command line
 * has to change (another --dir, or --force), nothing was looked at yet. */
static int demo_fresh_dir(demo_run *r) {
    const char *dir = r->d.dir;
    char found[256] = "", path[700];
    for (size_t i = 0; i < sizeof demo_files / sizeof demo_files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, demo_files[i]);
        size_t l = strlen(found);
        if (!access(path, F_OK))
            snprintf(found + l, sizeof found - l, "%s%s", l ? ", " : "", demo_files[i]);
    }
    if (!found[0]) return 0;
    if (!r->force)
        return cli_error("demo", CLI_EXIT_USAGE, "usage",
                         "%s holds an earlier demo (%s): give another --dir, or --force to start "
                         "afresh (its databases and logs are removed)",
                         dir, found);
    static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
    for (size_t i = 0; i < sizeof demo_files / sizeof demo_files[0]; i++)
        for (size_t k = 0; k < sizeof suffix / sizeof suffix[0]; k++) {
            snprintf(path, sizeof path, "%s/%s%s", dir, demo_files[i], suffix[k]);
            if (unlink(path) && errno != ENOENT)
                return cli_error("demo", CLI_EXIT_UNCHECKED, "OBX_EIO",
                                 "--force: cannot remove %s: %s", path, strerror(errno));
        }
    return 0;
}

/* An outbox named by --db that already holds events is refused at once too (--force removes
 * only the demo's own files): the demo counts every event in it as its own. */
static int demo_fresh_outbox(demo_run *r) {
    obx_store *s = NULL;
    obx_err e = obx_store_open_with(r->d.outbox_url, OBX_STORE_READ_ONLY, &s);
    int found = 0, known = 0;
    if (e == OBX_ENODB || (!e && (e = obx_store_schema_version(s, &found, &known)))) {
        obx_store_close(s);
        return e == OBX_ENODB ? 0 : cli_fail("demo", r->d.outbox_url, e);
    }
    if (e) return cli_fail("demo", r->d.outbox_url, e);
    char *rep = NULL;
    if (found == known && !(e = obx_report(s, &rep))) {
        json_t *j = json_loads(rep, 0, NULL);
        found = (int)json_integer_value(json_object_get(j, "committed"));
        json_decref(j);
    } else
        found = 0;
    obx_free(rep);
    obx_store_close(s);
    if (e) return cli_fail("demo", r->d.outbox_url, e);
    char *red = NULL;
    int rc = found ? cli_error("demo", CLI_EXIT_USAGE, "usage",
                               "%s already holds %d events: give the demo an empty database",
                               obx_url_redact(r->d.outbox_url, &red) ? "--db" : red, found)
                   : 0;
    obx_free(red);
    return rc;
}

/* Paths: this executable (for the children), the run's folder and the two databases' URLs. */
static int demo_paths(demo_run *r) {
    demo *d = &r->d;
    ssize_t sl = readlink("/proc/self/exe", d->self, sizeof d->self - 1);
    if (sl <= 0)
        return cli_error("demo", CLI_EXIT_UNCHECKED, "OBX_EIO", "cannot find my own executable");
    d->self[sl] = '\0';
    if (r->dir) {
        if ((mkdir(r->dir, 0755) && errno != EEXIST) || !realpath(r->dir, d->dir))
            return cli_error("demo", CLI_EXIT_UNCHECKED, "OBX_EIO", "cannot create %s: %s", r->dir,
                             strerror(errno));
    } else {
        strcpy(d->dir, "/tmp/obx-demo-XXXXXX");
        if (!mkdtemp(d->dir))
            return cli_error("demo", CLI_EXIT_UNCHECKED, "OBX_EIO", "cannot create %s: %s", d->dir,
                             strerror(errno));
    }
    if (r->db)
        snprintf(d->outbox_url, sizeof d->outbox_url, "%s", r->db);
    else
        snprintf(d->outbox_url, sizeof d->outbox_url, "sqlite:%s/outbox.db", d->dir);
    snprintf(d->consumer_path, sizeof d->consumer_path, "%s/consumer.db", d->dir);
    snprintf(d->consumer_url, sizeof d->consumer_url, "sqlite:%s", d->consumer_path);
    d->consume_from = "orders";
    snprintf(d->topic, sizeof d->topic, "orders");
    int rc = r->dir ? demo_fresh_dir(r) : 0;
    return rc ? rc : demo_fresh_outbox(r);
}

/* Broker: starts the Kafka mock for `--broker kafka` and sets each process's broker URL and
 * properties (per-run AMQP names; the local log broker with each child's fault knobs). */
static int demo_broker(demo_run *r) {
    demo *d = &r->d;
    const char *broker = r->broker;
    char mock_boot[512];
    if (broker && !strcmp(broker, "kafka")) {
        /* a Kafka-protocol cluster in this process, for as long as the demo runs */
        obx_err me = obx_kafka_mock_start(3, "orders", 8, mock_boot, sizeof mock_boot, &r->mock);
        if (me) return cli_fail("demo", "kafka mock cluster", me);
        static char url[600];
        snprintf(url, sizeof url, "kafka://%s", mock_boot);
        broker = url;
    }
    if (broker && !strncmp(broker, "kafka://", 8)) {
        /* short timeouts: the quiet time (message + request timeout) bounds how soon a
         * lookup can prove absence after a relay was paused or killed */
        static const char *const kp[] = {"message.timeout.ms=4000", "request.timeout.ms=3000"};
        d->relay_props[0] = kp[0];
        d->relay_props[1] = kp[1];
        d->n_relay_props = 2;
        d->consumer_props[0] = "consumer.session.timeout.ms=6000";
        d->n_consumer_props = 1;
    } else if (broker && (!strncmp(broker, "amqp://", 7) || !strncmp(broker, "amqps://", 8))) {
        /* an exchange, the consumer's quorum queue and an audit stream (best-effort lookup);
         * what the lookup cannot prove, the route's default UNKNOWN policy retries */
        /* names carry a per-run tag: a queue left by an earlier run (still holding its
         * messages) must not feed this run's consumer */
        unsigned tag = (unsigned)time(NULL) ^ ((unsigned)getpid() << 16);
        snprintf(d->topic, sizeof d->topic, "obx-demo-orders-%08x", tag);
        snprintf(d->amqp_names[0], sizeof d->amqp_names[0], "declare_exchange=%s", d->topic);
        snprintf(d->amqp_names[1], sizeof d->amqp_names[1],
                 "declare_queue=obx-demo-projection-%08x", tag);
        snprintf(d->amqp_names[2], sizeof d->amqp_names[2], "audit_stream=obx-demo-audit-%08x",
                 tag);
        snprintf(d->amqp_names[3], sizeof d->amqp_names[3], "audit_bind=%s", d->topic);
        snprintf(d->amqp_names[4], sizeof d->amqp_names[4], "confirm_timeout_ms=3000");
        for (int i = 0; i < 5; i++) d->relay_props[d->n_relay_props++] = d->amqp_names[i];
        d->consumer_props[d->n_consumer_props++] = d->amqp_names[0];
        d->consumer_props[d->n_consumer_props++] = d->amqp_names[1];
        d->consume_from = d->amqp_names[1] + strlen("declare_queue=");
    }
    if (broker) {
        d->custom_broker = true;
        snprintf(d->broker_base, sizeof d->broker_base, "%s", broker);
        snprintf(d->broker_url_a, sizeof d->broker_url_a, "%s", broker);
        snprintf(d->broker_url_b, sizeof d->broker_url_b, "%s", broker);
        snprintf(d->broker_url_c, sizeof d->broker_url_c, "%s", broker);
        snprintf(d->broker_url_consumer, sizeof d->broker_url_consumer, "%s", broker);
    } else {
        /* the local log broker, each process with its own fault knobs */
        snprintf(d->broker_base, sizeof d->broker_base, "log:%s/broker.db?partitions=8", d->dir);
        snprintf(d->broker_url_a, sizeof d->broker_url_a,
                 "log:%s/broker.db?drop_ack=0.01&ack_timeout_ms=400&lose_ack=0.003&"
                 "delay_ack=0.02&delay_ack_ms=%ld&dup=0.01",
                 d->dir, d->lease_ms + 1500);
        snprintf(d->broker_url_b, sizeof d->broker_url_b,
                 "log:%s/broker.db?blackhole=0.003&drop_ack=0.005&ack_timeout_ms=300&dup=0.005&"
                 "reject=0.002",
                 d->dir);
        snprintf(d->broker_url_c, sizeof d->broker_url_c, "log:%s/broker.db?dup=0.005", d->dir);
        snprintf(d->broker_url_consumer, sizeof d->broker_url_consumer,
                 "log:%s/broker.db?lose_commit=0.02", d->dir);
    }
    return 0;
}

/* Databases: opens the order service's, the outbox's and the consumer's connections and creates
 * the business and projection tables (an outbox that already holds events was refused at
 * once: demo_fresh_outbox). */
static int demo_open(demo_run *r) {
    service *sv = &r->sv;
    if (sqlx_open(&sv->db, r->d.outbox_url) || sqlx_open(&r->out, r->d.outbox_url) ||
        sqlx_open(&r->con, r->d.consumer_url)) {
        return cli_error("demo", CLI_EXIT_UNCHECKED, "OBX_ESTORE",
                         "cannot open the demo databases");
    }
    if (sv->db.lite)
        sqlx_exec(&sv->db, "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS orders (order_id "
                           "TEXT PRIMARY KEY, total_cents INTEGER NOT NULL, status TEXT NOT NULL)");
    else
        sqlx_exec(&sv->db, "CREATE TABLE IF NOT EXISTS public.orders (order_id text PRIMARY KEY, "
                           "total_cents bigint NOT NULL, status text NOT NULL); "
                           "TRUNCATE public.orders");
    sqlx_exec(&r->con,
              "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS order_projection (event_id "
              "TEXT NOT NULL, order_id TEXT NOT NULL, version INTEGER NOT NULL, payload BLOB, "
              "effect_key TEXT NOT NULL, applied_at INTEGER NOT NULL)");
    obx_err we = sv->db.lite ? obx_store_wrap_sqlite(sv->db.lite, &sv->s)
                             : obx_store_wrap_pg(sv->db.pg, &sv->s);
    if (we) return cli_fail("demo", "wrap", we);
    return 0;
}

/* Orders: starts the relays and the consumer, commits the orders and injects the faults on
 * the way (relay A paused past its lease and resumed, relay B killed and replaced). */
static void demo_orders(demo_run *r) {
    demo *d = &r->d;
    service *sv = &r->sv;
    r->t0 = mono_ms();
    d->relay_a = start_relay(d, "relay-a", d->broker_url_a);
    d->relay_b = start_relay(d, "relay-b", d->broker_url_b);
    d->consumer = start_consumer(d);
    bool paused = false, killed = false;
    long long resume_at = 0;
    int failures = 0; /* in a row: a busy database passes, a broken one does not */
    for (long i = 0; i < d->events; i++) {
        /* Checked before the order commit, never skipped: on SQLite a relay frozen inside
         * its write transaction holds the database's single write lock, so our commit fails
         * with SQLITE_BUSY until relay A is resumed (the retry below must not starve it). */
        if (paused && resume_at && mono_ms() >= resume_at) {
            kill(d->relay_a, SIGCONT); /* it wakes up past its lease: late ACKs arrive */
            resume_at = 0;
        }
        bool roll_back = (i % 50) == 49; /* 2%: the business transaction rolls back */
        if (commit_order(sv, roll_back)) {
            if (++failures == 1 || failures % 50 == 0)
                cli_warn("demo", "OBX_ESTORE", "order service: %s", sv->err);
            if (failures == 200) { /* 200 in a row: no lock is held that long */
                r->gave_up = true;
                break;
            }
            i--;
            msleep(10);
            continue;
        }
        failures = 0;
        if (roll_back) d->events++; /* keep N committed orders */
        /* orders arrive at a realistic pace (a few thousand per second), not in one tight
         * loop on one connection: on SQLite the relays share the single write lock with us */
        if (i % 4 == 3) msleep(1);
        long done = sv->committed;
        if (!paused && done >= d->events * 3 / 10) {
            kill(d->relay_a, SIGSTOP); /* relay A freezes with its batch in flight */
            paused = true;
            resume_at = mono_ms() + d->lease_ms + 1200;
        }
        if (!killed && done >= d->events * 6 / 10) {
            kill(d->relay_b, SIGKILL); /* relay B dies mid-batch */
            int st;
            waitpid(d->relay_b, &st, 0);
            d->relay_b = 0;
            d->relay_c = start_relay(d, "relay-c", d->broker_url_c); /* its replacement */
            killed = true;
        }
        if (i % (isatty(2) ? 500 : 2500) == 0) progress(d, &r->out, &r->con, "committing orders");
    }
    if (resume_at) {
        while (mono_ms() < resume_at) msleep(20);
        kill(d->relay_a, SIGCONT);
    }
    r->committed_at = mono_ms();
}

/* Settle: waits until everything is published and consumed (or a child gave up, or the
 * deadline passed), then stops the children. */
static void demo_settle(demo_run *r) {
    demo *d = &r->d;
    long long deadline = r->gave_up ? 0 : mono_ms() + 180000 + d->events * 20;
    int tick = 0;
    while (mono_ms() < deadline) {
        if (isatty(2) || tick++ % 10 == 0)
            progress(d, &r->out, &r->con, "publishing and consuming");
        long long pub = q1(&r->out, "SELECT count(*) FROM obx_event WHERE state = 'PUBLISHED'");
        long long con_n = q1(&r->con, "SELECT count(DISTINCT event_id) FROM order_projection");
        /* the consumer may also see messages an earlier run left on the topic, so "all
         * consumed" means: no event of this outbox lacks its effect */
        if (pub == r->sv.committed && con_n >= r->sv.committed &&
            count_lost(&r->out, &r->con) == 0) {
            r->settled = true;
            break;
        }
        /* a child that exits on its own (bad broker settings, a missing queue) will not come
         * back: say so now, with its log, instead of waiting out the deadline */
        const char *gone = child_gone(&d->consumer)  ? "consumer"
                           : child_gone(&d->relay_a) ? "relay-a"
                           : child_gone(&d->relay_b) ? "relay-b"
                           : child_gone(&d->relay_c) ? "relay-c"
                                                     : NULL;
        if (gone) {
            cli_warn("demo", "OBX_ESTOPPED", "%s exited early; see %s/%s.log", gone, d->dir, gone);
            break;
        }
        msleep(200);
    }
    r->end = mono_ms();
    stop(d->relay_a);
    stop(d->relay_b);
    stop(d->relay_c);
    stop(d->consumer);
    if (!d->json && isatty(2)) fprintf(stderr, "\n");
}

/* The demo's counts: obx's own report, checked against the business and consumer tables. */
typedef struct demo_tally {
    long long committed, published, dups, quarantined, unk_resolved, p50, p99;
    bool inv; /* the report's own invariants */
    long long orders, orphan_orders, dup_effects, lost, applied, redelivered, handler_failures,
        poisoned;
    double secs;
    bool ok; /* the demo's verdict: every invariant holds */
} demo_tally;

/* Tally: reads obx's report and counts the business and consumer side (0, or an exit code). */
static int demo_tally_up(demo_run *r, demo_tally *t) {
    char *rep = NULL;
    obx_err e = obx_report(r->sv.s, &rep);
    if (e) return cli_fail("demo", "report", e);
    json_t *j = json_loads(rep, 0, NULL);
    obx_free(rep);
    json_t *rc_ = json_object_get(j, "receipts"), *un = json_object_get(j, "unknown");
    t->committed = json_integer_value(json_object_get(j, "committed"));
    t->published = json_integer_value(json_object_get(j, "published"));
    t->dups = json_integer_value(json_object_get(rc_, "duplicate"));
    t->quarantined = json_integer_value(json_object_get(rc_, "quarantined"));
    t->unk_resolved = json_integer_value(json_object_get(un, "resolved"));
    t->p50 = json_integer_value(json_object_get(un, "p50_ms"));
    t->p99 = json_integer_value(json_object_get(un, "p99_ms"));
    t->inv = json_is_true(json_object_get(json_object_get(j, "invariants"), "hold"));
    json_decref(j);
    t->orders = q1(&r->sv.db, "SELECT count(*) FROM orders");
    t->orphan_orders = q1(&r->sv.db, "SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 "
                                     "FROM obx_event e WHERE e.tenant IN ('tenant-7', "
                                     "'tenant-9') AND e.idempotency_key = o.order_id)");
    /* the consumer side, checked against the outbox */
    long long distinct_effects =
        q1(&r->con, "SELECT count(DISTINCT event_id) FROM order_projection");
    long long effect_rows = q1(&r->con, "SELECT count(*) FROM order_projection");
    t->dup_effects = effect_rows - distinct_effects;
    t->lost = count_lost(&r->out, &r->con);
    t->applied = t->committed - t->lost; /* effects of this outbox's events */
    t->redelivered =
        q1(&r->con, "SELECT count(*) FROM obx_consume_audit WHERE outcome = 'DUPLICATE'");
    t->handler_failures =
        q1(&r->con, "SELECT count(*) FROM obx_consume_audit WHERE outcome = 'FAILED'");
    t->poisoned = q1(&r->con, "SELECT count(*) FROM obx_poison WHERE state = 'PARKED'");
    t->secs = (double)(r->end - r->t0) / 1000.0;
    t->ok = r->settled && t->inv && t->lost == 0 && t->dup_effects == 0 &&
            t->published == t->committed && t->orders == t->committed && t->orphan_orders == 0 &&
            t->quarantined == 0 && t->poisoned == 0;
    return 0;
}

/* Report (--json): the tally as one JSON object on stdout. */
static void demo_print_json(const demo_run *r, const demo_tally *t) {
    json_t *o = json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:s,s:s,s:s,s:s,"
        "s:f}",
        "committed", (json_int_t)t->committed, "rolled_back", (json_int_t)r->sv.rolled_back,
        "published", (json_int_t)t->published, "duplicate_transport_receipts", (json_int_t)t->dups,
        "quarantined_receipts", (json_int_t)t->quarantined, "unknown_resolved",
        (json_int_t)t->unk_resolved, "unknown_p50_ms", (json_int_t)t->p50, "unknown_p99_ms",
        (json_int_t)t->p99, "effects_applied", (json_int_t)t->applied, "duplicate_effects",
        (json_int_t)t->dup_effects, "redeliveries_deduped", (json_int_t)t->redelivered,
        "handler_failures_retried", (json_int_t)t->handler_failures, "lost", (json_int_t)t->lost,
        "orders_without_event", (json_int_t)t->orphan_orders, "poisoned", (json_int_t)t->poisoned,
        "invariants_hold", (int)t->ok, "outbox_url", r->red_db, "broker_url", r->red_broker,
        "consumer_url", r->d.consumer_url, "dir", r->d.dir, "seconds", t->secs);
    char *txt = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("%s\n", txt);
    free(txt);
    json_decref(o);
}

/* Report (default): the tally as a table, the faults injected and where to look next. */
static void demo_print_table(const demo_run *r, const demo_tally *t) {
    printf("\nobx demo: %ld orders in %.1f s (%.0f events/s end to end; %.1f s after the last "
           "commit)\n\n",
           r->sv.committed, t->secs, (double)t->committed / t->secs,
           (double)(r->end - r->committed_at) / 1000.0);
    printf("  %-44s %10lld\n", "orders committed (business rows)", t->orders);
    printf("  %-44s %10ld\n", "business transactions rolled back (no event)", r->sv.rolled_back);
    printf("  %-44s %10lld\n", "events committed with them", t->committed);
    printf("  %-44s %10lld\n", "events published (primary receipts)", t->published);
    printf("  %-44s %10lld\n", "duplicate transport receipts (recorded)", t->dups);
    printf("  %-44s %10lld\n", "quarantined receipts", t->quarantined);
    printf("  %-44s %10lld\n", "UNKNOWN outcomes resolved", t->unk_resolved);
    printf("  %-44s %10lld\n", "  resolution time p50 (ms)", t->p50);
    printf("  %-44s %10lld\n", "  resolution time p99 (ms)", t->p99);
    printf("  %-44s %10lld\n", "consumer effects applied", t->applied);
    printf("  %-44s %10lld\n", "redeliveries answered by the inbox", t->redelivered);
    printf("  %-44s %10lld\n", "handler failures retried", t->handler_failures);
    printf("  %-44s %10lld\n", "duplicate effects", t->dup_effects);
    printf("  %-44s %10lld\n", "lost events", t->lost);
    printf("  %-44s %10s\n", "invariants", t->ok ? "HOLD" : "VIOLATED");
    printf("\n  faults injected: relay-a paused past its lease, relay-b killed (SIGKILL) "
           "mid-batch and replaced%s,\n  a flaky consumer with lost offset commits\n",
           r->d.custom_broker ? ""
                              : ",\n  lost/late/timed-out ACKs, duplicate appends, lost requests");
    printf("\n  outbox    %s\n  broker    %s\n  consumer  %s\n  logs      %s/*.log\n", r->red_db,
           r->red_broker, r->d.consumer_url, r->d.dir);
    printf("\n  try:  obx report --db %s\n        obx inspect <event-id> --db %s\n", r->red_db,
           r->red_db);
}

/* Clean up: closes what demo_open opened, frees the redacted URLs, stops the Kafka mock. */
static void demo_close(demo_run *r) {
    obx_store_close(r->sv.s);
    sqlx_close(&r->sv.db);
    sqlx_close(&r->out);
    sqlx_close(&r->con);
    free(r->red_db);
    free(r->red_broker);
    obx_kafka_mock_stop(r->mock);
}

int cmd_demo(int argc, char **argv) {
    /* on the heap: the run's state is large (fixed URL and path buffers) */
    demo_run *r = calloc(1, sizeof *r);
    if (!r) return CLI_EXIT_UNCHECKED;
    int rc = demo_options(r, argc, argv);
    if (!rc) rc = demo_paths(r);
    if (!rc) rc = demo_broker(r);
    if (rc) goto out;
    demo *d = &r->d;
    obx_url_redact(d->outbox_url, &r->red_db);
    obx_url_redact(d->broker_base, &r->red_broker);
    if (!d->json)
        fprintf(stderr,
                "obx demo: %ld orders through a fault-injected pipeline in %s\n"
                "  outbox   %s\n  broker   %s\n  consumer %s\n",
                d->events, d->dir, r->red_db, r->red_broker, d->consumer_url);
    if ((rc = setup(d)) || (rc = demo_open(r))) goto out;
    demo_orders(r);
    demo_settle(r);
    if (r->gave_up) {
        rc = cli_error("demo", CLI_EXIT_UNCHECKED, "OBX_ESTORE",
                       "the order service cannot commit (%s); logs in %s", r->sv.err, d->dir);
        demo_close(r);
        free(r);
        return rc;
    }
    demo_tally t = {0};
    if ((rc = demo_tally_up(r, &t))) goto out;
    if (d->json)
        demo_print_json(r, &t);
    else
        demo_print_table(r, &t);
    demo_close(r);
    if (!r->settled) cli_warn("demo", "OBX_EINVARIANT", "did not settle before the deadline");
    free(r);
    return t.ok ? 0 : 1;
out:
    /* an early exit, as before the split: children, mock and connections die with the process */
    free(r->red_db);
    free(r->red_broker);
    free(r);
    return rc;
}
