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
        fprintf(stderr, "obx demo: %s", PQerrorMessage(x->pg));
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
    if (sqlx_exec(&sv->db, sv->db.lite ? "BEGIN IMMEDIATE" : "BEGIN")) return -1;
    int ok = insert_order(sv, id, total) == 0;
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
        fprintf(stderr, "obx demo: enqueue: %s\n", obx_errmsg());
        ok = 0;
    }
    if (!ok || roll_back) {
        sqlx_exec(&sv->db, "ROLLBACK");
        if (ok) sv->rolled_back++; /* e.g. payment declined: no order, no event */
        return ok ? 0 : -1;
    }
    if (sqlx_exec(&sv->db, "COMMIT")) {
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

int cmd_demo(int argc, char **argv) {
    demo d;
    memset(&d, 0, sizeof d);
    d.events = 10000;
    d.lease_ms = 1500;
    const char *dir = NULL, *broker = NULL, *db = NULL;
    static const struct option opts[] = {{"events", required_argument, 0, 'n'},
                                         {"dir", required_argument, 0, 'd'},
                                         {"broker", required_argument, 0, 'b'},
                                         {"db", required_argument, 0, 'D'},
                                         {"lease-ms", required_argument, 0, 'l'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'n':
            d.events = strtol(optarg, &end, 10);
            if (*end || d.events < 1 || d.events > 10000000)
                return cli_usage("demo", "--events: '%s' is not in 1..10000000", optarg);
            break;
        case 'd': dir = optarg; break;
        case 'b': broker = optarg; break;
        case 'D': db = optarg; break;
        case 'l':
            d.lease_ms = strtol(optarg, &end, 10);
            if (*end || d.lease_ms < 200) return cli_usage("demo", "--lease-ms: at least 200");
            break;
        case 'j': d.json = 1; break;
        default:
            return cli_usage("demo", "usage: obx demo [--events N] [--dir DIR] [--db URL] "
                                     "[--broker URL|kafka] [--lease-ms MS] [--json]");
        }
    }
    if (optind < argc) return cli_usage("demo", "unexpected argument '%s'", argv[optind]);
    if (db && obx_url_check(db, "store")) return cli_fail("demo", "--db", OBX_EURL);
    if (broker && strcmp(broker, "kafka") && obx_url_check(broker, "broker"))
        return cli_fail("demo", "--broker", OBX_EURL);
    ssize_t sl = readlink("/proc/self/exe", d.self, sizeof d.self - 1);
    if (sl <= 0) return cli_usage("demo", "cannot find my own executable");
    d.self[sl] = '\0';
    if (dir) {
        if (mkdir(dir, 0755) && errno != EEXIST) {
            fprintf(stderr, "obx demo: cannot create %s: %s\n", dir, strerror(errno));
            return 1;
        }
        if (!realpath(dir, d.dir)) return 1;
    } else {
        strcpy(d.dir, "/tmp/obx-demo-XXXXXX");
        if (!mkdtemp(d.dir)) return 1;
    }
    if (db)
        snprintf(d.outbox_url, sizeof d.outbox_url, "%s", db);
    else
        snprintf(d.outbox_url, sizeof d.outbox_url, "sqlite:%s/outbox.db", d.dir);
    snprintf(d.consumer_path, sizeof d.consumer_path, "%s/consumer.db", d.dir);
    snprintf(d.consumer_url, sizeof d.consumer_url, "sqlite:%s", d.consumer_path);
    d.consume_from = "orders";
    snprintf(d.topic, sizeof d.topic, "orders");
    obx_kafka_mock *mock = NULL;
    char mock_boot[512];
    if (broker && !strcmp(broker, "kafka")) {
        /* a Kafka-protocol cluster in this process, for as long as the demo runs */
        obx_err me = obx_kafka_mock_start(3, "orders", 8, mock_boot, sizeof mock_boot, &mock);
        if (me) return cli_fail("demo", "kafka mock cluster", me);
        static char url[600];
        snprintf(url, sizeof url, "kafka://%s", mock_boot);
        broker = url;
    }
    if (broker && !strncmp(broker, "kafka://", 8)) {
        /* short timeouts: the quiet time (message + request timeout) bounds how soon a
         * lookup can prove absence after a relay was paused or killed */
        static const char *const kp[] = {"message.timeout.ms=4000", "request.timeout.ms=3000"};
        d.relay_props[0] = kp[0];
        d.relay_props[1] = kp[1];
        d.n_relay_props = 2;
        d.consumer_props[0] = "consumer.session.timeout.ms=6000";
        d.n_consumer_props = 1;
    } else if (broker && (!strncmp(broker, "amqp://", 7) || !strncmp(broker, "amqps://", 8))) {
        /* an exchange, the consumer's quorum queue and an audit stream (best-effort lookup);
         * what the lookup cannot prove, the route's default UNKNOWN policy retries */
        /* names carry a per-run tag: a queue left by an earlier run (still holding its
         * messages) must not feed this run's consumer */
        unsigned tag = (unsigned)time(NULL) ^ ((unsigned)getpid() << 16);
        snprintf(d.topic, sizeof d.topic, "obx-demo-orders-%08x", tag);
        snprintf(d.amqp_names[0], sizeof d.amqp_names[0], "declare_exchange=%s", d.topic);
        snprintf(d.amqp_names[1], sizeof d.amqp_names[1], "declare_queue=obx-demo-projection-%08x",
                 tag);
        snprintf(d.amqp_names[2], sizeof d.amqp_names[2], "audit_stream=obx-demo-audit-%08x", tag);
        snprintf(d.amqp_names[3], sizeof d.amqp_names[3], "audit_bind=%s", d.topic);
        snprintf(d.amqp_names[4], sizeof d.amqp_names[4], "confirm_timeout_ms=3000");
        for (int i = 0; i < 5; i++) d.relay_props[d.n_relay_props++] = d.amqp_names[i];
        d.consumer_props[d.n_consumer_props++] = d.amqp_names[0];
        d.consumer_props[d.n_consumer_props++] = d.amqp_names[1];
        d.consume_from = d.amqp_names[1] + strlen("declare_queue=");
    }
    if (broker) {
        d.custom_broker = true;
        snprintf(d.broker_base, sizeof d.broker_base, "%s", broker);
        snprintf(d.broker_url_a, sizeof d.broker_url_a, "%s", broker);
        snprintf(d.broker_url_b, sizeof d.broker_url_b, "%s", broker);
        snprintf(d.broker_url_c, sizeof d.broker_url_c, "%s", broker);
        snprintf(d.broker_url_consumer, sizeof d.broker_url_consumer, "%s", broker);
    } else {
        /* the local log broker, each process with its own fault knobs */
        snprintf(d.broker_base, sizeof d.broker_base, "log:%s/broker.db?partitions=8", d.dir);
        snprintf(d.broker_url_a, sizeof d.broker_url_a,
                 "log:%s/broker.db?drop_ack=0.01&ack_timeout_ms=400&lose_ack=0.003&"
                 "delay_ack=0.02&delay_ack_ms=%ld&dup=0.01",
                 d.dir, d.lease_ms + 1500);
        snprintf(d.broker_url_b, sizeof d.broker_url_b,
                 "log:%s/broker.db?blackhole=0.003&drop_ack=0.005&ack_timeout_ms=300&dup=0.005&"
                 "reject=0.002",
                 d.dir);
        snprintf(d.broker_url_c, sizeof d.broker_url_c, "log:%s/broker.db?dup=0.005", d.dir);
        snprintf(d.broker_url_consumer, sizeof d.broker_url_consumer,
                 "log:%s/broker.db?lose_commit=0.02", d.dir);
    }
    char *red_db = NULL, *red_broker = NULL;
    obx_url_redact(d.outbox_url, &red_db);
    obx_url_redact(d.broker_base, &red_broker);
    if (!d.json)
        fprintf(stderr,
                "obx demo: %ld orders through a fault-injected pipeline in %s\n"
                "  outbox   %s\n  broker   %s\n  consumer %s\n",
                d.events, d.dir, red_db, red_broker, d.consumer_url);
    int rc = setup(&d);
    if (rc) return rc;

    service sv = {0};
    sqlx out, con;
    if (sqlx_open(&sv.db, d.outbox_url) || sqlx_open(&out, d.outbox_url) ||
        sqlx_open(&con, d.consumer_url)) {
        fprintf(stderr, "obx demo: cannot open the demo databases\n");
        return 1;
    }
    if (sv.db.lite)
        sqlx_exec(&sv.db, "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS orders (order_id "
                          "TEXT PRIMARY KEY, total_cents INTEGER NOT NULL, status TEXT NOT NULL)");
    else
        sqlx_exec(&sv.db, "CREATE TABLE IF NOT EXISTS public.orders (order_id text PRIMARY KEY, "
                          "total_cents bigint NOT NULL, status text NOT NULL); "
                          "TRUNCATE public.orders");
    sqlx_exec(&con,
              "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS order_projection (event_id "
              "TEXT NOT NULL, order_id TEXT NOT NULL, version INTEGER NOT NULL, payload BLOB, "
              "effect_key TEXT NOT NULL, applied_at INTEGER NOT NULL)");
    obx_err we =
        sv.db.lite ? obx_store_wrap_sqlite(sv.db.lite, &sv.s) : obx_store_wrap_pg(sv.db.pg, &sv.s);
    if (we) return cli_fail("demo", "wrap", we);
    if (!sv.db.lite && q1(&out, "SELECT count(*) FROM obx_event") > 0) {
        fprintf(stderr, "obx demo: %s already holds events; give the demo an empty database\n",
                red_db);
        return 1;
    }

    long long t0 = mono_ms();
    d.relay_a = start_relay(&d, "relay-a", d.broker_url_a);
    d.relay_b = start_relay(&d, "relay-b", d.broker_url_b);
    d.consumer = start_consumer(&d);
    bool paused = false, killed = false;
    long long resume_at = 0;
    for (long i = 0; i < d.events; i++) {
        /* Checked before the order commit, never skipped: on SQLite a relay frozen inside
         * its write transaction holds the database's single write lock, so our commit fails
         * with SQLITE_BUSY until relay A is resumed (the retry below must not starve it). */
        if (paused && resume_at && mono_ms() >= resume_at) {
            kill(d.relay_a, SIGCONT); /* it wakes up past its lease: late ACKs arrive */
            resume_at = 0;
        }
        bool roll_back = (i % 50) == 49; /* 2%: the business transaction rolls back */
        if (commit_order(&sv, roll_back)) {
            fprintf(stderr, "obx demo: order service: %s\n", sqlx_err(&sv.db));
            i--;
            msleep(10);
            continue;
        }
        if (roll_back) d.events++; /* keep N committed orders */
        /* orders arrive at a realistic pace (a few thousand per second), not in one tight
         * loop on one connection: on SQLite the relays share the single write lock with us */
        if (i % 4 == 3) msleep(1);
        long done = sv.committed;
        if (!paused && done >= d.events * 3 / 10) {
            kill(d.relay_a, SIGSTOP); /* relay A freezes with its batch in flight */
            paused = true;
            resume_at = mono_ms() + d.lease_ms + 1200;
        }
        if (!killed && done >= d.events * 6 / 10) {
            kill(d.relay_b, SIGKILL); /* relay B dies mid-batch */
            int st;
            waitpid(d.relay_b, &st, 0);
            d.relay_b = 0;
            d.relay_c = start_relay(&d, "relay-c", d.broker_url_c); /* its replacement */
            killed = true;
        }
        if (i % (isatty(2) ? 500 : 2500) == 0) progress(&d, &out, &con, "committing orders");
    }
    if (resume_at) {
        while (mono_ms() < resume_at) msleep(20);
        kill(d.relay_a, SIGCONT);
    }
    long long committed_at = mono_ms();
    /* wait until everything is published and consumed */
    long long deadline = mono_ms() + 180000 + d.events * 20;
    bool settled = false;
    int tick = 0;
    while (mono_ms() < deadline) {
        if (isatty(2) || tick++ % 10 == 0) progress(&d, &out, &con, "publishing and consuming");
        long long pub = q1(&out, "SELECT count(*) FROM obx_event WHERE state = 'PUBLISHED'");
        long long con_n = q1(&con, "SELECT count(DISTINCT event_id) FROM order_projection");
        /* the consumer may also see messages an earlier run left on the topic, so "all
         * consumed" means: no event of this outbox lacks its effect */
        if (pub == sv.committed && con_n >= sv.committed && count_lost(&out, &con) == 0) {
            settled = true;
            break;
        }
        /* a child that exits on its own (bad broker settings, a missing queue) will not come
         * back: say so now, with its log, instead of waiting out the deadline */
        const char *gone = child_gone(&d.consumer)  ? "consumer"
                           : child_gone(&d.relay_a) ? "relay-a"
                           : child_gone(&d.relay_b) ? "relay-b"
                           : child_gone(&d.relay_c) ? "relay-c"
                                                    : NULL;
        if (gone) {
            fprintf(stderr, "obx demo: %s exited early; see %s/%s.log\n", gone, d.dir, gone);
            break;
        }
        msleep(200);
    }
    long long end = mono_ms();
    stop(d.relay_a);
    stop(d.relay_b);
    stop(d.relay_c);
    stop(d.consumer);
    if (!d.json && isatty(2)) fprintf(stderr, "\n");

    char *rep = NULL;
    obx_err e = obx_report(sv.s, &rep);
    if (e) return cli_fail("demo", "report", e);
    json_t *j = json_loads(rep, 0, NULL);
    obx_free(rep);
    json_t *rc_ = json_object_get(j, "receipts"), *un = json_object_get(j, "unknown");
    long long committed = json_integer_value(json_object_get(j, "committed"));
    long long published = json_integer_value(json_object_get(j, "published"));
    long long dups = json_integer_value(json_object_get(rc_, "duplicate"));
    long long quarantined = json_integer_value(json_object_get(rc_, "quarantined"));
    long long unk_resolved = json_integer_value(json_object_get(un, "resolved"));
    long long p50 = json_integer_value(json_object_get(un, "p50_ms"));
    long long p99 = json_integer_value(json_object_get(un, "p99_ms"));
    bool inv = json_is_true(json_object_get(json_object_get(j, "invariants"), "hold"));
    json_decref(j);
    long long orders = q1(&sv.db, "SELECT count(*) FROM orders");
    long long orphan_orders = q1(&sv.db, "SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 "
                                         "FROM obx_event e WHERE e.tenant IN ('tenant-7', "
                                         "'tenant-9') AND e.idempotency_key = o.order_id)");
    /* the consumer side, checked against the outbox */
    long long distinct_effects = q1(&con, "SELECT count(DISTINCT event_id) FROM order_projection");
    long long effect_rows = q1(&con, "SELECT count(*) FROM order_projection");
    long long dup_effects = effect_rows - distinct_effects;
    long long lost = count_lost(&out, &con);
    long long applied = committed - lost; /* effects of this outbox's events */
    long long redelivered =
        q1(&con, "SELECT count(*) FROM obx_consume_audit WHERE outcome = 'DUPLICATE'");
    long long handler_failures =
        q1(&con, "SELECT count(*) FROM obx_consume_audit WHERE outcome = 'FAILED'");
    long long poisoned = q1(&con, "SELECT count(*) FROM obx_poison WHERE state = 'PARKED'");
    double secs = (double)(end - t0) / 1000.0;
    bool ok = settled && inv && lost == 0 && dup_effects == 0 && published == committed &&
              orders == committed && orphan_orders == 0 && quarantined == 0 && poisoned == 0;
    if (d.json) {
        json_t *o = json_pack(
            "{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:s,s:s,s:s,s:s,"
            "s:f}",
            "committed", (json_int_t)committed, "rolled_back", (json_int_t)sv.rolled_back,
            "published", (json_int_t)published, "duplicate_transport_receipts", (json_int_t)dups,
            "quarantined_receipts", (json_int_t)quarantined, "unknown_resolved",
            (json_int_t)unk_resolved, "unknown_p50_ms", (json_int_t)p50, "unknown_p99_ms",
            (json_int_t)p99, "effects_applied", (json_int_t)applied, "duplicate_effects",
            (json_int_t)dup_effects, "redeliveries_deduped", (json_int_t)redelivered,
            "handler_failures_retried", (json_int_t)handler_failures, "lost", (json_int_t)lost,
            "orders_without_event", (json_int_t)orphan_orders, "poisoned", (json_int_t)poisoned,
            "invariants_hold", (int)ok, "outbox_url", red_db, "broker_url", red_broker,
            "consumer_url", d.consumer_url, "dir", d.dir, "seconds", secs);
        char *txt = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", txt);
        free(txt);
        json_decref(o);
    } else {
        printf("\nobx demo: %ld orders in %.1f s (%.0f events/s end to end; %.1f s after the last "
               "commit)\n\n",
               sv.committed, secs, (double)committed / secs, (double)(end - committed_at) / 1000.0);
        printf("  %-44s %10lld\n", "orders committed (business rows)", orders);
        printf("  %-44s %10ld\n", "business transactions rolled back (no event)", sv.rolled_back);
        printf("  %-44s %10lld\n", "events committed with them", committed);
        printf("  %-44s %10lld\n", "events published (primary receipts)", published);
        printf("  %-44s %10lld\n", "duplicate transport receipts (recorded)", dups);
        printf("  %-44s %10lld\n", "quarantined receipts", quarantined);
        printf("  %-44s %10lld\n", "UNKNOWN outcomes resolved", unk_resolved);
        printf("  %-44s %10lld\n", "  resolution time p50 (ms)", p50);
        printf("  %-44s %10lld\n", "  resolution time p99 (ms)", p99);
        printf("  %-44s %10lld\n", "consumer effects applied", applied);
        printf("  %-44s %10lld\n", "redeliveries answered by the inbox", redelivered);
        printf("  %-44s %10lld\n", "handler failures retried", handler_failures);
        printf("  %-44s %10lld\n", "duplicate effects", dup_effects);
        printf("  %-44s %10lld\n", "lost events", lost);
        printf("  %-44s %10s\n", "invariants", ok ? "HOLD" : "VIOLATED");
        printf("\n  faults injected: relay-a paused past its lease, relay-b killed (SIGKILL) "
               "mid-batch and replaced%s,\n  a flaky consumer with lost offset commits\n",
               d.custom_broker ? ""
                               : ",\n  lost/late/timed-out ACKs, duplicate appends, lost requests");
        printf("\n  outbox    %s\n  broker    %s\n  consumer  %s\n  logs      %s/*.log\n", red_db,
               red_broker, d.consumer_url, d.dir);
        printf("\n  try:  obx report --db %s\n        obx inspect <event-id> --db %s\n", red_db,
               red_db);
    }
    obx_store_close(sv.s);
    sqlx_close(&sv.db);
    sqlx_close(&out);
    sqlx_close(&con);
    free(red_db);
    free(red_broker);
    obx_kafka_mock_stop(mock);
    if (!settled) fprintf(stderr, "obx demo: did not settle before the deadline\n");
    return ok ? 0 : 1;
}
