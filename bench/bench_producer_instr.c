/*
 * bench_producer_instr.c — the business transaction of bench_producer, on one connection, for
 * counting the server's instructions per transaction (bench/producer_instr.sh runs it against a
 * PostgreSQL under callgrind; docs/performance.md, section 3). Counting instead of timing: on
 * a 2-core machine shared with the clients, tps and CPU per transaction moved by more between
 * repetitions than the changes measured, while instruction counts repeat to 0.2 %.
 *
 *   bench_producer_instr URL setup        the bench's tables, route and 20,000 events of each
 *                                         outbox (as bench_producer), VACUUM ANALYZE
 *   bench_producer_instr URL VARIANT N    N transactions: business | plain | sql | c
 *
 * With OBX_INSTR_RELAY_WAITS=1 in the environment a second connection holds the route's
 * cluster's wake lock and LISTENs throughout, and waits inside a statement, as a relay waiting in
 * the server does, so that every enqueue takes the wake-up path (docs/postgres.md, "The latch
 * wake-up"); its backend is not the one counted.
 * A run prints the backend's process ID (its callgrind file is named after it) and exits
 * non-zero on the first failed statement.
 */
#include "bench.h"

#include <libpq-fe.h>
#include <obx.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what, PGconn *c) {
    fprintf(stderr, "bench_producer_instr: %s: %s\n", what, c ? PQerrorMessage(c) : obx_errmsg());
    exit(1);
}

static void prep(PGconn *c, const char *name, const char *sql) {
    PGresult *r = PQprepare(c, name, sql, 0, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) die(name, c);
    PQclear(r);
}

/* Prepared statement name with n text/binary parameters; its one value into out (may be NULL). */
static void exec_prep(PGconn *c, const char *name, int n, const char *const *v, const int *len,
                      const int *fmt, char *out, size_t cap) {
    PGresult *r = PQexecPrepared(c, name, n, v, len, fmt, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) die(name, c);
    if (out && PQntuples(r) == 1) snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
}

static void setup(const char *url) {
    obx_store *s;
    if (obx_store_open(url, &s) || obx_store_init(s)) die("obx init", NULL);
    obx_route rt = {.event_type = "order.created.v1", .cluster = "main", .topic = "orders"};
    if (obx_route_set(s, &rt, NULL)) die("route", NULL);
    obx_store_close(s);
    PGconn *c = PQconnectdb(url);
    if (PQstatus(c) != CONNECTION_OK) die("connect", c);
    bn_biz_tables(c);
    PQfinish(c);
}

/* bench_producer's statements, and pgbench's obx.enqueue() variant ($1 only gives the unused
 * parameter a type) */
static void prepare_all(PGconn *c, const char *v) {
    bn_biz_prepare(c);
    /* plsql: obx.enqueue() of a database without the obx_pg extension (its PL/pgSQL body) */
    if (!strcmp(v, "plsql")) PQclear(PQexec(c, "SELECT obx._point_enqueue(false)"));
    prep(c, "sql",
         "SELECT obx.enqueue('order.created.v1', 'order', $2, 1, 'tenant-7', $3) WHERE "
         "$1::text IS NOT NULL");
}

/* One business transaction of variant v; i picks the customer. */
static void txn(PGconn *c, obx_store *st, const char *v, int i) {
    char cid[16], oid[32] = "", agg[64], payload[600];
    snprintf(cid, sizeof cid, "%d", 1 + (i * 7919) % 100000);
    const char *cv[1] = {cid};
    exec_prep(c, "begin", 0, NULL, NULL, NULL, NULL, 0);
    exec_prep(c, "debit", 1, cv, NULL, NULL, NULL, 0);
    exec_prep(c, "order", 1, cv, NULL, NULL, oid, sizeof oid);
    int n = bn_biz_payload(payload, sizeof payload, oid);
    snprintf(agg, sizeof agg, "o-%s", oid);
    const char *pv[3] = {oid, agg, payload};
    int len[3] = {0, 0, n}, fmt[3] = {0, 0, 1};
    if (!strcmp(v, "plain") || !strcmp(v, "sql") || !strcmp(v, "plsql"))
        exec_prep(c, strcmp(v, "plain") ? "sql" : "plain", 3, pv, len, fmt, NULL, 0);
    if (!strcmp(v, "c")) {
        obx_event ev = {.event_type = "order.created.v1",
                        .aggregate_type = "order",
                        .aggregate_id = agg,
                        .aggregate_version = 1,
                        .tenant = "tenant-7",
                        .payload = payload,
                        .payload_len = (size_t)n};
        obx_enqueue_result res;
        if (obx_enqueue(st, &ev, &res)) die("obx_enqueue", NULL);
    }
    exec_prep(c, "commit", 0, NULL, NULL, NULL, NULL, 0);
}

int main(int argc, char **argv) {
    const char *v = argc >= 3 ? argv[2] : "";
    bool known = !strcmp(v, "business") || !strcmp(v, "plain") || !strcmp(v, "sql") ||
                 !strcmp(v, "c") || !strcmp(v, "plsql");
    if (argc == 3 && !strcmp(v, "setup")) {
        setup(argv[1]);
        return 0;
    }
    if (argc != 4 || !known || atoi(argv[3]) < 1) {
        fprintf(stderr,
                "usage: bench_producer_instr URL setup | URL business|plain|sql|plsql|c N\n");
        return 2;
    }
    PGconn *c = PQconnectdb(argv[1]);
    if (PQstatus(c) != CONNECTION_OK) die("connect", c);
    printf("%d\n", PQbackendPID(c));
    fflush(stdout);
    prepare_all(c, v);
    PGconn *waiter = NULL; /* OBX_INSTR_RELAY_WAITS: holds the wake lock of cluster "main" */
    const char *rw = getenv("OBX_INSTR_RELAY_WAITS");
    if (rw && !strcmp(rw, "1")) {
        waiter = PQconnectdb(argv[1]);
        if (PQstatus(waiter) != CONNECTION_OK) die("connect", waiter);
        PGresult *r = PQexec(waiter, "LISTEN obx_work; SELECT pg_advisory_lock(5194330, "
                                     "hashtext('main'))");
        if (PQresultStatus(r) != PGRES_TUPLES_OK) die("the wake lock", waiter);
        PQclear(r);
        /* inside a statement it has a virtual transaction, by which producers name it */
        if (!PQsendQuery(waiter, "SELECT pg_sleep(3600)")) die("wait", waiter);
    }
    obx_store *st = NULL;
    if (!strcmp(v, "c") && obx_store_wrap_pg(c, &st)) die("obx_store_wrap_pg", NULL);
    for (int i = 0, n = atoi(argv[3]); i < n; i++) txn(c, st, v, i);
    obx_store_close(st);
    PQfinish(c);
    if (waiter) {
        char err[256];
        PGcancel *k = PQgetCancel(waiter);
        if (!k || !PQcancel(k, err, sizeof err)) die("cancel the wait", waiter);
        PQfreeCancel(k);
        PQfinish(waiter);
    }
    return 0;
}
