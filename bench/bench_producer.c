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
 * Overhead = tps(plain) / tps(obx) - 1 (target: at most 10%), per repetition, median; and the
 * same with the database server's CPU per transaction, which load on the machine changes less.
 *
 *   bench_producer [--seconds S] [--clients C] [--reps R] [--dir DIR]
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int seconds = 15, clients = 8, reps = 3;

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
static const char *const names[3] = {"business only", "+ plain outbox row", "+ obx.enqueue"};

int main(int argc, char **argv) {
    char log[600];
    snprintf(log, sizeof log, "/tmp/obx-bench-producer-%d.log", (int)getpid());
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
            clients = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
            mkdir(argv[++i], 0755);
            snprintf(log, sizeof log, "%s/pgbench.log", argv[i]);
        } else {
            fprintf(stderr,
                    "usage: bench_producer [--seconds S] [--clients C] [--reps R] [--dir DIR]\n");
            return 2;
        }
    }
    if (seconds < 2 || clients < 1 || reps < 1 || reps > BN_MAX_REPS)
        bn_die("--seconds >= 2, --clients >= 1, --reps 1..20");
    char url[1024];
    bn_pg_fresh("obx_bench_prod", "orders", url, sizeof url);
    PGconn *c = bn_pg_connect(url);
    bn_sql(c, "CREATE TABLE bench_customer (id int PRIMARY KEY, balance bigint NOT NULL, orders "
              "int NOT NULL, name text NOT NULL)");
    bn_sql(c, "INSERT INTO bench_customer SELECT i, 1000000, 0, 'customer ' || i FROM "
              "generate_series(1, 100000) i");
    bn_sql(c, "CREATE TABLE bench_order (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
              "customer_id int NOT NULL, total bigint NOT NULL, created_at timestamptz NOT NULL)");
    bn_sql(c, "CREATE TABLE bench_plain_outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY "
              "KEY, event_id text NOT NULL, event_type text NOT NULL, aggregate_type text NOT "
              "NULL, aggregate_id text NOT NULL, tenant text NOT NULL, payload_digest text NOT "
              "NULL, payload bytea NOT NULL, created_at timestamptz NOT NULL)");
    /* A deployed outbox, not an empty one: statistics gathered on empty tables make each
     * producer session's cached plans of obx.enqueue()'s lookups sequential scans until
     * autovacuum analyzes again (a minute of traffic), which an 8-15 s run would measure
     * instead of the steady state (docs/performance.md, scenario 3). Both outboxes get 20,000
     * rows of the same shape first. */
    bn_sql(c, "SELECT count(obx.enqueue('order.created.v1', 'order', 'w-' || i, 1, 'tenant-7', "
              "convert_to(rpad('{\"order\":\"w-' || i || '\",\"total\":1999,\"note\":\"', "
              "510, 'x') || '\"}', 'UTF8'))) FROM generate_series(1, 20000) i");
    bn_sql(c, "INSERT INTO bench_plain_outbox (event_id, event_type, aggregate_type, "
              "aggregate_id, tenant, payload_digest, payload, created_at) SELECT 'evw-' || "
              "lpad(i::text, 26, '0'), 'order.created.v1', 'order', 'w-' || i, 'tenant-7', "
              "'sha256:' || encode(sha256(p), 'hex'), p, now() FROM (SELECT i, "
              "convert_to(rpad('{\"order\":\"w-' || i || '\",\"total\":1999,\"note\":\"', "
              "510, 'x') || '\"}', 'UTF8') AS p FROM generate_series(1, 20000) i) x");
    bn_sql(c, "VACUUM ANALYZE");
    double tps[3][BN_MAX_REPS], cpu[3][BN_MAX_REPS], ov[BN_MAX_REPS], ov_cpu[BN_MAX_REPS];
    char extra[64];
    snprintf(extra, sizeof extra, "-M prepared -T %d", seconds);
    double load0 = bn_loadavg();
    for (int rep = 0; rep < reps; rep++) {
        for (int k = 0; k < 3; k++) {
            /* alternate the order so that drift in the machine's load falls on every variant */
            int v = rep % 2 ? 2 - k : k;
            long long n0 = bn_sql_ll(c, "SELECT xact_commit FROM pg_stat_database WHERE datname "
                                        "= current_database()");
            double c0 = bn_pg_server_cpu();
            tps[v][rep] = bn_pgbench(url, script[v], clients, extra, log);
            double dc = bn_pg_server_cpu() - c0;
            usleep(600000); /* statistics of the last transactions */
            long long n1 = bn_sql_ll(c, "SELECT xact_commit FROM pg_stat_database WHERE datname "
                                        "= current_database()");
            cpu[v][rep] = n1 > n0 ? dc * 1e6 / (double)(n1 - n0) : 0;
            bn_log("rep %d: %s: %.0f tps, server %.0f us CPU per transaction", rep + 1, names[v],
                   tps[v][rep], cpu[v][rep]);
        }
        ov[rep] = tps[1][rep] / tps[2][rep] - 1;
        ov_cpu[rep] = cpu[2][rep] / cpu[1][rep] - 1;
    }
    long long events = bn_sql_ll(c, "SELECT count(*) FROM obx.obx_event");
    long long plain = bn_sql_ll(c, "SELECT count(*) FROM bench_plain_outbox");
    PQfinish(c);
    bn_pg_drop("obx_bench_prod");
    printf("\nproducer overhead on PostgreSQL: pgbench, %d clients, %d s per variant, variants "
           "alternated; median of %d reps; load average %.1f before, %.1f after (2 cores); %lld "
           "obx events and %lld plain rows written\n\n",
           clients, seconds, reps, load0, bn_loadavg(), events, plain);
    printf("| variant | tps | server CPU us/tx |\n|---|---:|---:|\n");
    for (int v = 0; v < 3; v++)
        printf("| %s | %.0f | %.0f |\n", names[v], bn_median(tps[v], reps),
               bn_median(cpu[v], reps));
    double o = bn_median(ov, reps), oc = bn_median(ov_cpu, reps);
    printf("\n| obx.enqueue vs plain row | overhead | target |\n|---|---:|---|\n");
    printf("| throughput (tps plain / tps obx - 1) | %+.0f%% | <= 10%%: %s |\n", o * 100,
           o <= 0.10 ? "met" : "MISSED");
    printf("| server CPU per transaction | %+.0f%% | |\n", oc * 100);
    printf("\npgbench output: %s\n", log);
    return 0;
}
