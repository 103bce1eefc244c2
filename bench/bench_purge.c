/*
 * bench_purge.c — retention throughput on PostgreSQL (docs/retention.md): N published events
 * (512-byte payloads, one primary receipt each) in a fresh outbox database, a consume receipt for
 * each in a fresh consumer database, then one purge run (PUBLISHED -> RETAINED -> PURGED) per
 * batch size, timed. The rows are bulk-inserted with SQL to get to 100k+ quickly; the purge
 * itself is the library's (obx__purge_run), exactly as `obx purge` and the relay run it.
 *
 * Usage: bench_purge [N] [BATCH...]   (default 100000 events, batches 500 2000)
 * Needs OBX_TEST_PG_URL (scripts/services.sh). Not a test: it asserts only that every event
 * ends PURGED. Each batch size gets its own pair of databases.
 */
#include "engine/engine.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static PGconn *admin;
static char base[1024];

static void url_of(const char *db, char *out, size_t cap) {
    const char *auth = strstr(base, "://");
    auth = auth ? auth + 3 : base;
    const char *slash = strchr(auth, '/'), *q = strchr(auth, '?');
    size_t head = slash ? (size_t)(slash - base) : (q ? (size_t)(q - base) : strlen(base));
    snprintf(out, cap, "%.*s/%s%s", (int)head, base, db, q ? q : "");
}

static int sql(PGconn *c, const char *q) {
    PGresult *r = PQexec(c, q);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok) fprintf(stderr, "bench_purge: %.120s: %s", q, PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

static long long count(PGconn *c, const char *q) {
    PGresult *r = PQexec(c, q);
    long long v =
        PQresultStatus(r) == PGRES_TUPLES_OK ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
    PQclear(r);
    return v;
}

/* A fresh initialized database; its URL into url. */
static int fresh(const char *name, char *url, size_t cap) {
    char q[256];
    snprintf(q, sizeof q, "DROP DATABASE IF EXISTS %s WITH (FORCE)", name);
    if (sql(admin, q)) return -1;
    snprintf(q, sizeof q, "CREATE DATABASE %s", name);
    if (sql(admin, q)) return -1;
    url_of(name, url, cap);
    obx_store *s;
    if (obx_store_open(url, &s) || obx_store_init(s)) {
        fprintf(stderr, "bench_purge: init %s: %s\n", name, obx_errmsg());
        return -1;
    }
    obx_store_close(s);
    return 0;
}

static int fill(const char *outbox_url, const char *consumer_url, long n) {
    PGconn *o = PQconnectdb(outbox_url), *c = PQconnectdb(consumer_url);
    char q[4096];
    int rc = PQstatus(o) == CONNECTION_OK && PQstatus(c) == CONNECTION_OK ? 0 : -1;
    /* event i: published at 1e12 + i ms, so that the whole set is out of any replay window */
    snprintf(q, sizeof q,
             "INSERT INTO obx.obx_envelope (event_id, envelope_gen, aggregate_type, aggregate_id, "
             "aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at, "
             "created_txid, correlation_id, causation_id, traceparent, idempotency_key, "
             "envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm, "
             "dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload, "
             "payload_len, created_at) SELECT 'evt-' || lpad(i::text, 26, '0'), 1, 'order', "
             "'o-' || i, 1, 'order.created.v1', 'sha256:' || repeat('a', 64), 'sha256:' || "
             "repeat('b', 64), 't1', 1000000000000 + i, 'tx', '', '', '', '', 'sha256:' || "
             "repeat('c', 64), 'local', 'orders', 't1.order.o-' || i, 'murmur2', 1, 'raw', "
             "'persistent', 'all', 'sha256:' || repeat('d', 64), convert_to(repeat('x', 512), "
             "'UTF8'), 512, 1000000000000 + i FROM generate_series(1, %ld) i",
             n);
    if (!rc) rc = sql(o, q);
    snprintf(q, sizeof q,
             "INSERT INTO obx.obx_event (event_id, tenant, idempotency_key, event_type, "
             "correlation_id, order_key, envelope_gen, state, claim_gen, owner, lease_until, "
             "attempt_gen, attempt_id, pinned_partition, rejections, available_at, next_check_at, "
             "unknown_since, primary_attempt_id, published_at, committed_at, updated_at, "
             "max_attempts, blind_retry, unordered, alias, dest_cluster) SELECT 'evt-' || "
             "lpad(i::text, 26, '0'), 't1', NULL, 'order.created.v1', '', 'local' || chr(31) || "
             "'orders' || chr(31) || 't1.order.o-' || i, 1, 'PUBLISHED', 1, '', 0, 1, 'att-' || "
             "lpad(i::text, 26, '0'), i %% 8, 0, 0, 0, 0, 'att-' || lpad(i::text, 26, '0'), "
             "1000000000000 + i, 1000000000000 + i, 1000000000000 + i, 8, false, false, 'obx', "
             "'local' FROM generate_series(1, %ld) i",
             n);
    if (!rc) rc = sql(o, q);
    /* their statistics delta, as every statement inserting events writes one (schema.sql,
     * obx_stat_delta) */
    snprintf(q, sizeof q, "INSERT INTO obx.obx_stat_delta (key, n) VALUES ('state:PUBLISHED', %ld)",
             n);
    if (!rc) rc = sql(o, q);
    snprintf(q, sizeof q,
             "INSERT INTO obx.obx_receipt (event_id, envelope_gen, attempt_id, kind, cluster, "
             "topic, partition, \"offset\", broker_ts, payload_digest, dest_digest, reason, "
             "created_at) SELECT 'evt-' || lpad(i::text, 26, '0'), 1, 'att-' || lpad(i::text, 26, "
             "'0'), 'PRIMARY', 'local', 'orders', i %% 8, i, 1000000000000 + i, 'sha256:' || "
             "repeat('b', 64), 'sha256:' || repeat('d', 64), 'bench', 1000000000000 + i FROM "
             "generate_series(1, %ld) i",
             n);
    if (!rc) rc = sql(o, q);
    snprintf(q, sizeof q,
             "INSERT INTO obx.obx_inbox (consumer_id, event_id, payload_digest, event_type, "
             "tenant, outcome, result, topic, partition, \"offset\", consumed_at, duration_us) "
             "SELECT 'projection', 'evt-' || lpad(i::text, 26, '0'), 'sha256:' || repeat('b', "
             "64), 'order.created.v1', 't1', 'APPLIED', '', 'orders', i %% 8, i, 1000000000000 + "
             "i, 1 FROM generate_series(1, %ld) i",
             n);
    if (!rc) rc = sql(c, q);
    if (!rc) rc = sql(o, "VACUUM ANALYZE obx.obx_event");
    if (!rc) rc = sql(o, "VACUUM ANALYZE obx.obx_envelope");
    if (!rc) rc = sql(c, "VACUUM ANALYZE obx.obx_inbox");
    PQfinish(o);
    PQfinish(c);
    return rc;
}

int main(int argc, char **argv) {
    const char *env = getenv("OBX_TEST_PG_URL");
    if (!env || !*env) {
        fprintf(stderr, "bench_purge: OBX_TEST_PG_URL is not set (source scripts/services.sh)\n");
        return 1;
    }
    snprintf(base, sizeof base, "%s", env);
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 100000;
    long batches[8] = {500, 2000};
    int nb = 2;
    if (argc > 2) {
        nb = 0;
        for (int i = 2; i < argc && nb < 8; i++) batches[nb++] = strtol(argv[i], NULL, 10);
    }
    admin = PQconnectdb(base);
    if (PQstatus(admin) != CONNECTION_OK) {
        fprintf(stderr, "bench_purge: %s", PQerrorMessage(admin));
        return 1;
    }
    PQclear(PQexec(admin, "SET client_min_messages = warning"));
    int failed = 0;
    for (int b = 0; b < nb; b++) {
        char ou[1200], cu[1200], on[64], cn[64];
        snprintf(on, sizeof on, "obx_bench_purge_%d", (int)getpid());
        snprintf(cn, sizeof cn, "obx_bench_purge_c_%d", (int)getpid());
        if (fresh(on, ou, sizeof ou) || fresh(cn, cu, sizeof cu)) return 1;
        int64_t t0 = obx__mono_ms();
        if (fill(ou, cu, n)) return 1;
        int64_t t1 = obx__mono_ms();
        obx__store *s, *cs;
        if (obx__st_open(ou, &s) || obx__st_open(cu, &cs)) {
            fprintf(stderr, "bench_purge: %s\n", obx_errmsg());
            return 1;
        }
        obx__critical crit = {.id = "projection", .s = cs};
        obx__retention_cfg cfg = {.consumers = &crit,
                                  .n_consumers = 1,
                                  .replay_window_ms = 0,
                                  .batch = (size_t)batches[b],
                                  .who = "bench",
                                  .max_listed = 1};
        obx__ret_result r;
        memset(&r, 0, sizeof r);
        obx__purge_cursor cur;
        obx__purge_cursor_init(&cur);
        int64_t p0 = obx__mono_ms(), retain_ms = 0;
        obx_err e = OBX_OK;
        while (!e && cur.phase < 2) {
            int phase = cur.phase;
            e = obx__purge_step(s, &cfg, obx__wall_ms(), &cur, &r);
            if (phase == 0 && cur.phase == 1) retain_ms = obx__mono_ms() - p0;
        }
        int64_t p1 = obx__mono_ms();
        if (e) {
            fprintf(stderr, "bench_purge: %s: %s\n", obx_errname(e), obx_errmsg());
            return 1;
        }
        PGconn *o = PQconnectdb(ou);
        long long purged = count(o, "SELECT count(*) FROM obx.obx_event WHERE state = 'PURGED'");
        long long left =
            count(o, "SELECT count(*) FROM obx.obx_envelope WHERE payload IS NOT NULL");
        PQfinish(o);
        double total_s = (double)(p1 - p0) / 1000.0, purge_s = (double)(p1 - p0 - retain_ms) / 1000;
        printf("purge of %ld published events, batch %ld: retained %lld in %.2f s (%.0f rows/s), "
               "purged %lld in %.2f s (%.0f rows/s); %lld transactions, %.0f events/s end to end "
               "(setup %.1f s)\n",
               n, batches[b], (long long)r.retained, (double)retain_ms / 1000.0,
               (double)r.retained * 1000.0 / (double)(retain_ms ? retain_ms : 1),
               (long long)r.purged, purge_s, (double)r.purged / (purge_s > 0 ? purge_s : 0.001),
               (long long)r.batches, (double)n / (total_s > 0 ? total_s : 0.001),
               (double)(t1 - t0) / 1000.0);
        if (purged != n || left != 0) {
            fprintf(stderr, "bench_purge: %lld PURGED, %lld payloads left (want %ld, 0)\n", purged,
                    left, n);
            failed = 1;
        }
        obx__ret_result_free(&r);
        obx__st_close(s);
        obx__st_close(cs);
        char q[256];
        snprintf(q, sizeof q, "DROP DATABASE IF EXISTS %s WITH (FORCE)", on);
        sql(admin, q);
        snprintf(q, sizeof q, "DROP DATABASE IF EXISTS %s WITH (FORCE)", cn);
        sql(admin, q);
    }
    PQfinish(admin);
    return failed;
}
