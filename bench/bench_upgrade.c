/*
 * bench_upgrade.c — `bench/run.sh upgrade`: how long `obx init` takes to bring a populated
 * PostgreSQL outbox at the schema version before this obx's (13) to this obx's (issue 19: "test it
 * on one with a million events, and give its duration"; docs/performance.md, section 1).
 *
 * It builds the old database the way version 13's `obx init` left it (the embedded scripts 1-13,
 * as pg_store.c's migrate applies them), fills it with bench_common's bulk fill (by default
 * 800,000 PUBLISHED events with their attempt, primary receipt and audit row, and 200,000
 * PENDING ones, each with its envelope and 512-byte payload), checkpoints, and times
 * obx_store_open + obx_store_init. Then it checks that nothing was lost: the event count, the
 * statistics against count(*) by state, and an old event's audit trail and primary receipt
 * read through the new schema.
 *
 *   bench_upgrade [--events N] [--pending M] [--json]
 */
#include "bench.h"

#include "store/store.h"

#include <obx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const char obx__pg_schema_v1[], obx__pg_schema_v2[], obx__pg_schema_v3[],
    obx__pg_schema_v4[], obx__pg_schema_v5[], obx__pg_schema_v6[], obx__pg_schema_v7[],
    obx__pg_schema_v8[], obx__pg_schema_v9[], obx__pg_schema_v10[], obx__pg_schema_v11[],
    obx__pg_schema_v12[], obx__pg_schema_v13[], obx__pg_schema_v14[], obx__pg_schema_v15[],
    obx__pg_schema_v16[];

static void usage(void) {
    fprintf(stderr, "usage: bench_upgrade [--events N] [--pending M] [--json]\n");
    exit(2);
}

int main(int argc, char **argv) {
    long events = 1000000, pending = -1;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--events") && i + 1 < argc)
            events = atol(argv[++i]);
        else if (!strcmp(argv[i], "--pending") && i + 1 < argc)
            pending = atol(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else
            usage();
    }
    if (events < 1) usage();
    if (pending < 0) pending = events / 5;
    if (pending > events) pending = events;
    const char *scripts[] = {
        obx__pg_schema_v1,  obx__pg_schema_v2,  obx__pg_schema_v3,  obx__pg_schema_v4,
        obx__pg_schema_v5,  obx__pg_schema_v6,  obx__pg_schema_v7,  obx__pg_schema_v8,
        obx__pg_schema_v9,  obx__pg_schema_v10, obx__pg_schema_v11, obx__pg_schema_v12,
        obx__pg_schema_v13, obx__pg_schema_v14, obx__pg_schema_v15, obx__pg_schema_v16};
    const int from = (int)(sizeof scripts / sizeof scripts[0]);

    /* the old database */
    char url[1024];
    bn_pg_create("obx_bench_up");
    bn_pg_url("obx_bench_up", url, sizeof url);
    PGconn *c = bn_pg_connect(url);
    bn_sql(c, "BEGIN");
    for (int v = 0; v < from; v++) {
        PGresult *r = PQexec(c, scripts[v]);
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
            bn_die("schema %d: %s", v + 1, PQerrorMessage(c));
        PQclear(r);
    }
    bn_sql(c, "INSERT INTO obx.obx_meta (key, value) VALUES ('schema_version', '%d')", from);
    bn_sql(c, "INSERT INTO obx.obx_route (event_type, cluster, topic, routing_key, algorithm, "
              "serializer, durability, required_acks, max_attempts, blind_retry, unordered, alias, "
              "created_at) VALUES ('" BN_TYPE "', '" BN_CLUSTER "', 'orders', "
              "'{tenant}.{aggregate_type}.{aggregate_id}', 'murmur2', 'raw', 'persistent', 'all', "
              "8, true, false, 'obx', 1)");
    bn_sql(c, "COMMIT");
    double t0 = bn_now();
    if (events > pending) bn_pg_fill(c, 1, events - pending, "PUBLISHED");
    if (pending) bn_pg_fill(c, events - pending + 1, pending, "PENDING");
    double fill_s = bn_now() - t0;
    bn_sql(c, "CHECKPOINT");
    double size_mb = bn_sql_d(c, "SELECT pg_database_size(current_database()) / 1048576.0");
    bn_log("filled %ld events (%ld PENDING) at schema version %d in %.1f s, %.0f MB", events,
           pending, from, fill_s, size_mb);

    /* the upgrade */
    double w0 = bn_pg_wal();
    t0 = bn_now();
    obx_store *s;
    if (obx_store_open(url, &s) || obx_store_init(s)) bn_die("upgrade: %s", obx_errmsg());
    double up_ms = (bn_now() - t0) * 1000.0;
    double wal_kb = (bn_pg_wal() - w0) / 1024.0;
    int found = 0;
    if (obx_store_schema_version(s, &found, NULL)) bn_die("version: %s", obx_errmsg());

    /* nothing lost */
    long long n = (long long)bn_sql_d(c, "SELECT count(*) FROM obx.obx_event");
    if (n != events) bn_die("%lld events after the upgrade, not %ld", n, events);
    long long off = (long long)bn_sql_d(
        c, "SELECT count(*) FROM (SELECT state, count(*) AS n FROM obx.obx_event GROUP BY state) "
           "t FULL JOIN (SELECT substr(k, 7) AS state, v FROM obx._stats() WHERE k LIKE "
           "'state:%%' AND v <> 0) s USING (state) WHERE t.n IS DISTINCT FROM s.v");
    if (off) bn_die("the statistics differ from count(*) in %lld states", off);
    if (events > pending) {
        obx__audit_row *au = NULL;
        size_t nau = 0;
        char id[64];
        snprintf(id, sizeof id, "evt-%026d", 1);
        if (obx__st_load_audit((obx__store *)s, id, &au, &nau) || nau != 1 ||
            au[0].to != OBX__ST_PUBLISHED)
            bn_die("the audit trail of %s: %zu rows (%s)", id, nau, obx_errmsg());
        free(au);
        obx__receipt_row *rc = NULL;
        size_t nrc = 0;
        if (obx__st_load_receipts((obx__store *)s, id, &rc, &nrc) || nrc != 1 ||
            rc[0].kind != OBX__RK_PRIMARY)
            bn_die("the receipts of %s: %zu (%s)", id, nrc, obx_errmsg());
        free(rc);
    }
    obx_store_close(s);
    PQfinish(c);
    bn_pg_drop("obx_bench_up");

    printf("\nobx init: schema version %d -> %d on a populated outbox; load average %.1f (2 "
           "cores)\n\n",
           from, found, bn_loadavg());
    printf("| events | of which PENDING | database MB | fill s | upgrade ms | upgrade WAL KB |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    printf("| %ld | %ld | %.0f | %.1f | %.0f | %.0f |\n", events, pending, size_mb, fill_s, up_ms,
           wal_kb);
    if (json)
        printf("{\"events\": %ld, \"pending\": %ld, \"from_version\": %d, \"to_version\": %d, "
               "\"upgrade_ms\": %.0f, \"upgrade_wal_kb\": %.0f, \"database_mb\": %.0f}\n",
               events, pending, from, found, up_ms, wal_kb, size_mb);
    return 0;
}
