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
 * A run prints the backend's process ID (its callgrind file is named after it) and exits
 * non-zero on the first failed statement.
 */
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

static void run_sql(PGconn *c, const char *sql) {
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) die(sql, c);
    PQclear(r);
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
    run_sql(c, "CREATE TABLE bench_customer (id int PRIMARY KEY, balance bigint NOT NULL, orders "
               "int NOT NULL, name text NOT NULL)");
    run_sql(c, "INSERT INTO bench_customer SELECT i, 1000000, 0, 'customer ' || i FROM "
               "generate_series(1, 100000) i");
    run_sql(c, "CREATE TABLE bench_order (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
               "customer_id int NOT NULL, total bigint NOT NULL, created_at timestamptz NOT NULL)");
    run_sql(c, "CREATE TABLE bench_plain_outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY "
               "KEY, event_id text NOT NULL, event_type text NOT NULL, aggregate_type text NOT "
               "NULL, aggregate_id text NOT NULL, tenant text NOT NULL, payload_digest text NOT "
               "NULL, payload bytea NOT NULL, created_at timestamptz NOT NULL)");
    run_sql(c, "SELECT count(obx.enqueue('order.created.v1', 'order', 'w-' || i, 1, 'tenant-7', "
               "convert_to(rpad('{\"order\":\"w-' || i || '\",\"total\":1999,\"note\":\"', 510, "
               "'x') || '\"}', 'UTF8'))) FROM generate_series(1, 20000) i");
    run_sql(c, "INSERT INTO bench_plain_outbox (event_id, event_type, aggregate_type, "
               "aggregate_id, tenant, payload_digest, payload, created_at) SELECT 'evw-' || "
               "lpad(i::text, 26, '0'), 'order.created.v1', 'order', 'w-' || i, 'tenant-7', "
               "'sha256:' || encode(sha256(p), 'hex'), p, now() FROM (SELECT i, "
               "convert_to(rpad('{\"order\":\"w-' || i || '\",\"total\":1999,\"note\":\"', 510, "
               "'x') || '\"}', 'UTF8') AS p FROM generate_series(1, 20000) i) x");
    run_sql(c, "VACUUM ANALYZE");
    PQfinish(c);
}

static void prepare_all(PGconn *c) {
    prep(c, "begin", "BEGIN");
    prep(c, "commit", "COMMIT");
    prep(c, "debit",
         "UPDATE bench_customer SET balance = balance - 1999, orders = orders + 1 "
         "WHERE id = $1");
    prep(c, "order",
         "INSERT INTO bench_order (customer_id, total, created_at) VALUES ($1, 1999, "
         "now()) RETURNING id");
    prep(c, "plain",
         "INSERT INTO bench_plain_outbox (event_id, event_type, aggregate_type, "
         "aggregate_id, tenant, payload_digest, payload, created_at) VALUES ('evt-' "
         "|| lpad($1, 26, '0'), 'order.created.v1', 'order', $2, 'tenant-7', "
         "'sha256:' || encode(sha256($3), 'hex'), $3, now())");
    /* pgbench's obx.enqueue() variant; $1 only gives the unused parameter a type */
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
    /* the same 512-byte payload as bench_producer */
    int n =
        snprintf(payload, sizeof payload, "{\"order\":\"o-%s\",\"total\":1999,\"note\":\"", oid);
    while (n < 510) payload[n++] = 'x';
    n += snprintf(payload + n, sizeof payload - (size_t)n, "\"}");
    snprintf(agg, sizeof agg, "o-%s", oid);
    const char *pv[3] = {oid, agg, payload};
    int len[3] = {0, 0, n}, fmt[3] = {0, 0, 1};
    if (!strcmp(v, "plain") || !strcmp(v, "sql")) exec_prep(c, v, 3, pv, len, fmt, NULL, 0);
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
    bool known =
        !strcmp(v, "business") || !strcmp(v, "plain") || !strcmp(v, "sql") || !strcmp(v, "c");
    if (argc == 3 && !strcmp(v, "setup")) {
        setup(argv[1]);
        return 0;
    }
    if (argc != 4 || !known || atoi(argv[3]) < 1) {
        fprintf(stderr, "usage: bench_producer_instr URL setup | URL business|plain|sql|c N\n");
        return 2;
    }
    PGconn *c = PQconnectdb(argv[1]);
    if (PQstatus(c) != CONNECTION_OK) die("connect", c);
    printf("%d\n", PQbackendPID(c));
    fflush(stdout);
    prepare_all(c);
    obx_store *st = NULL;
    if (!strcmp(v, "c") && obx_store_wrap_pg(c, &st)) die("obx_store_wrap_pg", NULL);
    for (int i = 0, n = atoi(argv[3]); i < n; i++) txn(c, st, v, i);
    obx_store_close(st);
    PQfinish(c);
    return 0;
}
