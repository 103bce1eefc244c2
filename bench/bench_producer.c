/*
 * bench_producer.c — scenario 3 of bench/run.sh: what obx costs a producer on PostgreSQL.
 * pgbench runs one business transaction (debit a random customer of 100,000, insert the order)
 * in three variants, alternated within each repetition on the same database:
 *
 *   business  the business transaction alone (context: what any outbox adds)
 *   plain     + INSERT of a plain outbox row of the same size (event ID, type, aggregate,
 *             tenant, payload digest, the same 512-byte payload, created_at): a naive outbox
 *   obx       + SELECT obx.enqueue(...) with the same payload (the SQL producer path of
 *             docs/postgres.md: validation, route, frozen destination, digests, envelope +
 *             event + audit rows, per-key order lock, NOTIFY)
 *
 * and the same business transaction from a C program (one libpq connection per client thread,
 * prepared statements, like pgbench -M prepared) in two more variants:
 *
 *   C plain   + the plain outbox row, a prepared INSERT
 *   C obx     + obx_enqueue() on the borrowed connection (obx_store_wrap_pg): the C producer
 *             path, the same rows as obx.enqueue()
 *
 * With --standalone, two more in which the event is the whole transaction (a producer with no
 * business transaction of its own, or one that enqueues after it committed):
 *
 *   C alone: plain   the plain outbox row's prepared INSERT in autocommit
 *   C alone: obx     obx_enqueue() on a wrapped connection with no transaction open (obx's
 *                    own BEGIN ... COMMIT; docs/postgres.md, "Round trips")
 *
 * Ratios (issue 19's table; median over repetitions, each ratio taken within one repetition):
 *   obx_sql_ratio   = tps(obx.enqueue) / tps(plain row), both through pgbench
 *   obx_c_ratio     = tps(C obx_enqueue) / tps(C plain row), both through the C driver
 *   obx_alone_ratio = tps(C alone: obx) / tps(C alone: plain) (--standalone only)
 * and the same with the database server's CPU per transaction, which load on the machine
 * changes less. --json prints one JSON object with them (for scripts) after the tables.
 *
 * --notify-off runs every producer session with obx.notify = off (schema.sql, obx._enqueue_sql: no
 * NOTIFY, so PostgreSQL does not commit the producers one at a time; docs/postgres.md, "NOTIFY").
 *
 * --relay-waits keeps, for the whole run, a connection that does what a relay waiting for the
 * bench cluster's work does: it LISTENs, holds the cluster's wake lock and reads every
 * notification. The C producer notifies only while such a relay waits (docs/postgres.md,
 * "NOTIFY"); without the flag no relay waits, as during a backlog or with the relay down.
 *
 *   bench_producer [--seconds S] [--clients C] [--reps R] [--standalone] [--notify-off]
 *                  [--relay-waits] [--dir DIR] [--json]
 */
#include "bench.h"

#include <obx.h>
#include <poll.h>
#include <pthread.h>
#include <math.h>
#include <stdatomic.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int seconds = 15, clients = 8, reps = 3;
static bool notify_off;  /* --notify-off: the producers' sessions with obx.notify = off */
static bool relay_waits; /* --relay-waits: a waiting relay's LISTEN and wake lock (see above) */
static atomic_bool stop_listener;

/* --relay-waits: waits as the relay does until stop_listener: in the server
 * (obx._wait_for_work(), where the database has the obx_pg extension: producers wake it by its
 * latch) or on the socket, and reads the notifications the producers send. wakes counts the
 * waits that ended early, waits the statements (each one a transaction of the server's, taken
 * out of the producers' count), notifies the notifications read. */
static atomic_long wakes, waits, notifies;
static void *listener_main(void *arg) {
    PGconn *l = arg;
    bool in_server = bn_sql_ll(l, "SELECT (to_regprocedure('obx._wait_for_work(integer)') IS "
                                  "NOT NULL)::int") == 1;
    while (!atomic_load(&stop_listener)) {
        if (in_server) {
            PGresult *r = PQexec(l, "SELECT obx._wait_for_work(100)");
            if (PQresultStatus(r) != PGRES_TUPLES_OK)
                bn_die("--relay-waits: %s", PQerrorMessage(l));
            if (!strcmp(PQgetvalue(r, 0, 0), "t")) atomic_fetch_add(&wakes, 1);
            atomic_fetch_add(&waits, 1);
            PQclear(r);
        } else {
            struct pollfd pfd = {.fd = PQsocket(l), .events = POLLIN};
            poll(&pfd, 1, 100);
        }
        if (!PQconsumeInput(l)) bn_die("--relay-waits: %s", PQerrorMessage(l));
        PGnotify *n;
        while ((n = PQnotifies(l)) != NULL) {
            atomic_fetch_add(&notifies, 1);
            PQfreemem(n);
        }
    }
    return NULL;
}

/* A server backend's CPU seconds (utime + stime of /proc/PID/stat), 0 when unreadable */
static double backend_cpu(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *s = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    if (!s || sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* A ratio for --json: null where it could not be measured (bn_pg_server_cpu reads the server's
 * processes only for the servers bench/run.sh started; against OBX_TEST_PG_URL's it has none,
 * and 0 / 0 printed as "-nan" made the object invalid JSON). */
static const char *jratio(char *buf, size_t cap, double v) {
    if (isfinite(v))
        snprintf(buf, cap, "%.3f", v);
    else
        snprintf(buf, cap, "null");
    return buf;
}

#define BUSINESS                                                                                   \
    "\\set cid random(1, 100000)\n"                                                                \
    "BEGIN;\n"                                                                                     \
    "UPDATE bench_customer SET balance = balance - 1999, orders = orders + 1 WHERE id = :cid;\n"   \
    "INSERT INTO bench_order (customer_id, total, created_at) VALUES (:cid, 1999, now()) "         \
    "RETURNING id AS oid \\gset\n"
#define PAYLOAD                                                                                    \
    "convert_to(rpad('{\"order\":\"o-' || :oid || '\",\"total\":1999,\"note\":\"', 510, 'x') || "  \
    "'\"}', 'UTF8')"

static const char *const script[3] = {
    BUSINESS "COMMIT;\n",
    BUSINESS "INSERT INTO bench_plain_outbox (event_id, event_type, aggregate_type, aggregate_id, "
             "tenant, payload_digest, payload, created_at) SELECT 'evt-' || lpad(:oid::text, 26, "
             "'0'), 'order.created.v1', 'order', 'o-' || :oid, 'tenant-7', 'sha256:' || "
             "encode(sha256(p), 'hex'), p, now() FROM (SELECT " PAYLOAD " AS p) x;\n"
             "COMMIT;\n",
    BUSINESS "SELECT obx.enqueue('order.created.v1', 'order', 'o-' || :oid, 1, 'tenant-7', " PAYLOAD
             ");\n"
             "COMMIT;\n",
};
static const char *const names[7] = {"business only",
                                     "+ plain outbox row",
                                     "+ obx.enqueue",
                                     "C: + plain outbox row",
                                     "C: + obx_enqueue()",
                                     "C alone: plain outbox row (autocommit)",
                                     "C alone: obx_enqueue() (no transaction open)"};

/* event numbers of the standalone variants, apart from bench_order's IDs */
static atomic_long alone_seq = 1000000000L;

/* ---- the C driver: clients threads, each its own connection, for seconds ---- */

typedef struct cdrv {
    const char *url;
    bool obx;   /* obx_enqueue() (true) or the plain row */
    bool alone; /* the event is the whole transaction (no business rows, no BEGIN/COMMIT) */
    double until;
    atomic_long commits;
    atomic_int failed;
} cdrv;

static bool exec_ok(PGconn *c, const char *name, int n, const char *const *v, char *out,
                    size_t cap) {
    PGresult *r = PQexecPrepared(c, name, n, v, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (ok && out && PQntuples(r) == 1) snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
    if (!ok) bn_log("C driver: %s: %s", name, PQerrorMessage(c));
    PQclear(r);
    return ok;
}

static bool plain_row(PGconn *c, const char *oid, const char *payload, size_t len) {
    char agg[64];
    snprintf(agg, sizeof agg, "o-%s", oid);
    const char *v[3] = {oid, agg, payload};
    int lens[3] = {0, 0, (int)len}, fmt[3] = {0, 0, 1};
    PGresult *r = PQexecPrepared(c, "plain", 3, v, lens, fmt, 0);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) bn_log("C driver: plain row: %s", PQerrorMessage(c));
    PQclear(r);
    return ok;
}

static bool obx_row(obx_store *st, const char *oid, const char *payload, size_t len) {
    char agg[64];
    snprintf(agg, sizeof agg, "o-%s", oid);
    obx_event ev = {.event_type = "order.created.v1",
                    .aggregate_type = "order",
                    .aggregate_id = agg,
                    .aggregate_version = 1,
                    .tenant = "tenant-7",
                    .payload = payload,
                    .payload_len = len};
    obx_enqueue_result res;
    obx_err e = obx_enqueue(st, &ev, &res);
    if (e) bn_log("C driver: obx_enqueue: %s: %s", obx_errname(e), obx_errmsg());
    return !e;
}

static void *cdrv_main(void *arg) {
    cdrv *d = arg;
    PGconn *c = bn_pg_connect(d->url);
    bn_biz_prepare(c);
    obx_store *st = NULL;
    if (d->obx && obx_store_wrap_pg(c, &st)) bn_die("obx_store_wrap_pg: %s", obx_errmsg());
    unsigned seed = (unsigned)(uintptr_t)&seed ^ (unsigned)getpid();
    char payload[600];
    while (bn_now() < d->until && !atomic_load(&d->failed)) {
        char cid[16], oid[32] = "";
        snprintf(cid, sizeof cid, "%d", 1 + (int)(rand_r(&seed) % 100000));
        const char *v[1] = {cid};
        bool ok = true;
        if (d->alone)
            snprintf(oid, sizeof oid, "%ld", atomic_fetch_add(&alone_seq, 1));
        else
            ok = exec_ok(c, "begin", 0, NULL, NULL, 0) && exec_ok(c, "debit", 1, v, NULL, 0) &&
                 exec_ok(c, "order", 1, v, oid, sizeof oid);
        int n = bn_biz_payload(payload, sizeof payload, oid);
        ok = ok && (d->obx ? obx_row(st, oid, payload, (size_t)n)
                           : plain_row(c, oid, payload, (size_t)n));
        if (!d->alone) ok = ok && exec_ok(c, ok ? "commit" : "rollback", 0, NULL, NULL, 0);
        if (!ok) {
            atomic_store(&d->failed, 1);
            break;
        }
        atomic_fetch_add(&d->commits, 1);
    }
    obx_store_close(st);
    PQfinish(c);
    return NULL;
}

/* tps of the C driver (plain row or obx_enqueue, in the business transaction or alone) with
 * `clients` connections for `seconds` */
static double c_driver(const char *url, bool obx, bool alone, int n_clients) {
    cdrv d = {.url = url, .obx = obx, .alone = alone};
    pthread_t th[64];
    if (n_clients > 64) bn_die("--clients: at most 64 for the C driver");
    double t0 = bn_now();
    d.until = t0 + seconds;
    for (int i = 0; i < n_clients; i++)
        if (pthread_create(&th[i], NULL, cdrv_main, &d)) bn_die("pthread_create");
    for (int i = 0; i < n_clients; i++) pthread_join(th[i], NULL);
    if (atomic_load(&d.failed)) bn_die("the C driver failed (see above)");
    return (double)atomic_load(&d.commits) / (bn_now() - t0);
}

int main(int argc, char **argv) {
    char log[600];
    bool json = false, standalone = false;
    snprintf(log, sizeof log, "/tmp/obx-bench-producer-%d.log", (int)getpid());
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
            clients = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--standalone"))
            standalone = true;
        else if (!strcmp(argv[i], "--notify-off"))
            notify_off = true;
        else if (!strcmp(argv[i], "--relay-waits"))
            relay_waits = true;
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
            mkdir(argv[++i], 0755);
            snprintf(log, sizeof log, "%s/pgbench.log", argv[i]);
        } else {
            fprintf(stderr,
                    "usage: bench_producer [--seconds S] [--clients C] [--reps R] [--standalone] "
                    "[--notify-off] [--relay-waits] [--dir DIR] [--json]\n");
            return 2;
        }
    }
    if (seconds < 2 || clients < 1 || reps < 1 || reps > BN_MAX_REPS)
        bn_die("--seconds >= 2, --clients >= 1, --reps 1..20");
    char url[1024];
    bn_pg_fresh("obx_bench_prod", "orders", url, sizeof url);
    PGconn *c = bn_pg_connect(url);
    bn_biz_tables(c);
    /* every producer connection opened from here on inherits it (docs/postgres.md, "NOTIFY") */
    if (notify_off) bn_sql(c, NOTIFY_OFF_SQL);
    PGconn *waiter = NULL;
    pthread_t listener;
    if (relay_waits) {
        waiter = bn_pg_connect(url);
        bn_sql(waiter, "LISTEN obx_work");
        bn_sql(waiter, "SELECT pg_advisory_lock(5194330, hashtext('" BN_CLUSTER "'))");
        if (pthread_create(&listener, NULL, listener_main, waiter)) bn_die("pthread_create");
    }
    enum { NV = 7 };
    const int nv = standalone ? 7 : 5;
    double tps[NV][BN_MAX_REPS], cpu[NV][BN_MAX_REPS];
    double ratio[3][BN_MAX_REPS], ratio_cpu[3][BN_MAX_REPS]; /* [0] SQL, [1] C, [2] C alone */
    char extra[64];
    snprintf(extra, sizeof extra, "-M prepared -T %d", seconds);
    double load0 = bn_loadavg();
    for (int rep = 0; rep < reps; rep++) {
        for (int k = 0; k < nv; k++) {
            /* alternate the order so that drift in the machine's load falls on every variant */
            int v = rep % 2 ? nv - 1 - k : k;
            long w0 = atomic_load(&waits), k0 = atomic_load(&wakes), q0 = atomic_load(&notifies);
            double wc0 = waiter ? backend_cpu(PQbackendPID(waiter)) : 0;
            long long n0 = bn_sql_ll(c, "SELECT xact_commit FROM pg_stat_database WHERE datname "
                                        "= current_database()");
            double c0 = bn_pg_server_cpu();
            tps[v][rep] = v < 3 ? bn_pgbench(url, script[v], clients, extra, log)
                                : c_driver(url, v == 4 || v == 6, v >= 5, clients);
            double dc = bn_pg_server_cpu() - c0;
            usleep(600000); /* statistics of the last transactions */
            long long n1 = bn_sql_ll(c, "SELECT xact_commit FROM pg_stat_database WHERE datname "
                                        "= current_database()");
            n1 -= atomic_load(&waits) - w0; /* the waiter's own transactions */
            cpu[v][rep] = n1 > n0 ? dc * 1e6 / (double)(n1 - n0) : 0;
            if (waiter)
                bn_log("rep %d: %s: the waiter: %ld wakes (%.0f/s), %ld notifications, %.0f us "
                       "of its backend's CPU per wake",
                       rep + 1, names[v], atomic_load(&wakes) - k0,
                       (double)(atomic_load(&wakes) - k0) / seconds, atomic_load(&notifies) - q0,
                       atomic_load(&wakes) > k0 ? (backend_cpu(PQbackendPID(waiter)) - wc0) * 1e6 /
                                                      (double)(atomic_load(&wakes) - k0)
                                                : 0);
            bn_log("rep %d: %s: %.0f tps, server %.0f us CPU per transaction", rep + 1, names[v],
                   tps[v][rep], cpu[v][rep]);
        }
        ratio[0][rep] = tps[2][rep] / tps[1][rep];
        ratio[1][rep] = tps[4][rep] / tps[3][rep];
        ratio_cpu[0][rep] = cpu[1][rep] / cpu[2][rep];
        ratio_cpu[1][rep] = cpu[3][rep] / cpu[4][rep];
        if (standalone) {
            ratio[2][rep] = tps[6][rep] / tps[5][rep];
            ratio_cpu[2][rep] = cpu[5][rep] / cpu[6][rep];
        }
    }
    long long events = bn_sql_ll(c, "SELECT count(*) FROM obx.obx_event");
    long long plain = bn_sql_ll(c, "SELECT count(*) FROM bench_plain_outbox");
    /* which body obx.enqueue() ran (docs/postgres.md, "Two bodies, one contract"): c where
     * scripts/pg_ext.sh installed the obx_pg extension */
    const char *body = bn_sql_ll(c, "SELECT count(*) FROM obx.obx_meta WHERE key = "
                                    "'enqueue_impl' AND value = 'c'") == 1
                           ? "c"
                           : "sql";
    PQfinish(c);
    if (waiter) {
        atomic_store(&stop_listener, true);
        pthread_join(listener, NULL);
        bn_log("--relay-waits: the waiting connection was woken %ld times", atomic_load(&wakes));
        PQfinish(waiter);
    }
    bn_pg_drop("obx_bench_prod");
    printf("\nproducer overhead on PostgreSQL: pgbench, %d clients, %d s per variant, variants "
           "alternated; median of %d reps; load average %.1f before, %.1f after (2 cores); %lld "
           "obx events and %lld plain rows written\n\n",
           clients, seconds, reps, load0, bn_loadavg(), events, plain);
    printf("| variant | tps | server CPU us/tx |\n|---|---:|---:|\n");
    for (int v = 0; v < nv; v++)
        printf("| %s | %.0f | %.0f |\n", names[v], bn_median(tps[v], reps),
               bn_median(cpu[v], reps));
    double r_sql = bn_median(ratio[0], reps), r_c = bn_median(ratio[1], reps);
    double rc_sql = bn_median(ratio_cpu[0], reps), rc_c = bn_median(ratio_cpu[1], reps);
    printf("\n| producer path vs a plain outbox row | tps ratio | server CPU ratio | target | "
           "moonshot |\n|---|---:|---:|---|---|\n");
    printf("| obx.enqueue() (SQL, pgbench; body: %s) | %.2f | %.2f | >= 0.67: %s | >= 0.83: %s |\n",
           body, r_sql, rc_sql, r_sql >= 0.67 ? "met" : "MISSED", r_sql >= 0.83 ? "met" : "missed");
    printf("| obx_enqueue() (C, libpq) | %.2f | %.2f | >= 0.67: %s | >= 0.83: %s |\n", r_c, rc_c,
           r_c >= 0.67 ? "met" : "MISSED", r_c >= 0.83 ? "met" : "missed");
    double r_alone = standalone ? bn_median(ratio[2], reps) : 0;
    if (standalone)
        printf("| obx_enqueue() alone vs an autocommit row (C) | %.2f | %.2f | (none) | (none) |\n",
               r_alone, bn_median(ratio_cpu[2], reps));
    printf("\npgbench output: %s\n", log);
    char j1[32], j2[32], j3[32];
    if (json && standalone)
        printf("{\"obx_sql_ratio\": %.3f, \"obx_c_ratio\": %.3f, \"obx_alone_ratio\": %.3f, "
               "\"obx_sql_cpu_ratio\": %s, \"obx_c_cpu_ratio\": %s, \"obx_alone_cpu_ratio\": "
               "%s, \"tps\": {\"business\": %.0f, \"plain\": %.0f, \"obx_sql\": %.0f, "
               "\"c_plain\": %.0f, \"obx_c\": %.0f, \"c_alone_plain\": %.0f, \"obx_alone\": "
               "%.0f}, \"obx_sql_body\": \"%s\", \"producer_notify\": %s, \"relay_waits\": %s, "
               "\"clients\": %d, \"seconds\": %d, \"reps\": %d}\n",
               r_sql, r_c, r_alone, jratio(j1, sizeof j1, rc_sql), jratio(j2, sizeof j2, rc_c),
               jratio(j3, sizeof j3, bn_median(ratio_cpu[2], reps)), bn_median(tps[0], reps),
               bn_median(tps[1], reps), bn_median(tps[2], reps), bn_median(tps[3], reps),
               bn_median(tps[4], reps), bn_median(tps[5], reps), bn_median(tps[6], reps), body,
               notify_off ? "false" : "true", relay_waits ? "true" : "false", clients, seconds,
               reps);
    else if (json)
        printf("{\"obx_sql_ratio\": %.3f, \"obx_c_ratio\": %.3f, \"obx_sql_cpu_ratio\": %s, "
               "\"obx_c_cpu_ratio\": %s, \"tps\": {\"business\": %.0f, \"plain\": %.0f, "
               "\"obx_sql\": %.0f, \"c_plain\": %.0f, \"obx_c\": %.0f}, \"obx_sql_body\": \"%s\", "
               "\"producer_notify\": %s, \"relay_waits\": %s, "
               "\"clients\": %d, \"seconds\": %d, \"reps\": %d}\n",
               r_sql, r_c, jratio(j1, sizeof j1, rc_sql), jratio(j2, sizeof j2, rc_c),
               bn_median(tps[0], reps), bn_median(tps[1], reps), bn_median(tps[2], reps),
               bn_median(tps[3], reps), bn_median(tps[4], reps), body,
               notify_off ? "false" : "true", relay_waits ? "true" : "false", clients, seconds,
               reps);
    return 0;
}
