/*
 * test_store_sqlite.c — the SQLite store as a producer sees it: business rows and the envelope
 * commit together and roll back together (a producer process killed at each point of its
 * transaction: the conformance suite); idempotency keys; frozen data; schema versions; and every
 * bad-input case leaves no row behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"
#include "engine/engine.h"
#include "store/conformance.h"
#include "store/shared.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct fx {
    char dir[256];
    char path[300];
    char url[320];
    sqlite3 *db;  /* the "business service" connection */
    obx_store *s; /* wrapping db */
} fx;

static int count(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st;
    int n = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return n;
}

static void exec_ok(sqlite3 *db, const char *sql) {
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) fail_msg("%s: %s", sql, err);
}

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    assert_int_equal(obx_t_tmpdir(f->dir, sizeof f->dir, "store"), 0);
    snprintf(f->path, sizeof f->path, "%s/outbox.db", f->dir);
    snprintf(f->url, sizeof f->url, "sqlite:%s", f->path);
    obx_store *own;
    assert_int_equal(obx_store_open(f->url, &own), OBX_OK);
    assert_int_equal(obx_store_init(own), OBX_OK);
    obx_route r = {.event_type = "order.created.v2", .cluster = "local", .topic = "orders"};
    assert_int_equal(obx_route_set(own, &r, NULL), OBX_OK);
    obx_store_close(own);
    assert_int_equal(sqlite3_open(f->path, &f->db), SQLITE_OK);
    sqlite3_busy_timeout(f->db, 5000);
    exec_ok(f->db, "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total INTEGER)");
    assert_int_equal(obx_store_wrap_sqlite(f->db, &f->s), OBX_OK);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    obx_store_close(f->s);
    sqlite3_close(f->db);
    if (obx_t_rmdir(f->dir)) return -1;
    free(f);
    return 0;
}

static obx_event order_event(const char *id, const char *payload) {
    return obx_t_order_event(id, payload);
}

/* The application's transaction, still open: BEGIN, its business row orders(id), and the event
 * (payload) enqueued on the same connection; the result into res. */
static void business_tx(fx *f, const char *id, const char *payload, obx_enqueue_result *res) {
    char sql[128];
    snprintf(sql, sizeof sql, "INSERT INTO orders VALUES ('%s', 100)", id);
    exec_ok(f->db, "BEGIN");
    exec_ok(f->db, sql);
    obx_event ev = order_event(id, payload);
    assert_int_equal(obx_enqueue(f->s, &ev, res), OBX_OK);
}

static void test_commit_together(void **state) {
    fx *f = *state;
    obx_enqueue_result res;
    business_tx(f, "o-1", "{\"order\":\"o-1\"}", &res);
    assert_int_equal(sqlite3_get_autocommit(f->db), 0); /* obx did not commit for us */
    exec_ok(f->db, "COMMIT");
    assert_int_equal(count(f->db, "SELECT count(*) FROM orders"), 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_event WHERE state='PENDING'"), 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_envelope"), 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_audit WHERE to_state='PENDING'"), 1);
    assert_int_equal(obx_event_id_check(res.event_id), OBX_OK);
    assert_true(res.route_gen >= 1);
    assert_false(res.existing);
}

static void test_rollback_together(void **state) {
    fx *f = *state;
    obx_enqueue_result res;
    business_tx(f, "o-2", "{}", &res);
    exec_ok(f->db, "ROLLBACK");
    assert_int_equal(count(f->db, "SELECT count(*) FROM orders"), 0);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_event"), 0);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_envelope"), 0);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_audit"), 0);
}

static void test_idempotency_key(void **state) {
    fx *f = *state;
    obx_event ev = order_event("o-3", "{\"n\":1}");
    ev.idempotency_key = "create-o-3";
    obx_enqueue_result a, b, c;
    assert_int_equal(obx_enqueue(f->s, &ev, &a), OBX_OK);
    assert_false(a.existing);
    assert_int_equal(obx_enqueue(f->s, &ev, &b), OBX_OK); /* the retried command */
    assert_true(b.existing);
    assert_string_equal(a.event_id, b.event_id);
    assert_string_equal(a.dest_digest, b.dest_digest);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_event"), 1);
    /* same key, another tenant: a different event */
    ev.tenant = "tenant-8";
    assert_int_equal(obx_enqueue(f->s, &ev, &c), OBX_OK);
    assert_false(c.existing);
    assert_string_not_equal(a.event_id, c.event_id);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_event"), 2);
    /* inside the caller's transaction that later rolls back: nothing remains */
    exec_ok(f->db, "BEGIN");
    ev.idempotency_key = "create-o-4";
    assert_int_equal(obx_enqueue(f->s, &ev, &c), OBX_OK);
    exec_ok(f->db, "ROLLBACK");
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_event"), 2);
}

/* purge_payloads drops the payload of every generation of an event, more than one statement's
 * batch of them too (SQLite reads them 8 at a time), and counts each one's bytes once */
static void test_purge_generations(void **state) {
    fx *f = *state;
    obx_event ev = order_event("o-9", "{\"n\":9}");
    obx_enqueue_result res;
    assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_OK);
    char sql[256];
    snprintf(sql, sizeof sql,
             "CREATE TEMP TABLE g AS SELECT * FROM obx_envelope WHERE event_id = '%s'",
             res.event_id);
    exec_ok(f->db, sql);
    for (int i = 0; i < 10; i++) { /* generations 2..11 */
        exec_ok(f->db, "UPDATE g SET envelope_gen = envelope_gen + 1");
        exec_ok(f->db, "INSERT INTO obx_envelope SELECT * FROM g");
    }
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM obx_envelope WHERE event_id = '%s' AND payload "
             "IS NOT NULL",
             res.event_id);
    assert_int_equal(count(f->db, sql), 11);
    const char *id = res.event_id;
    int64_t bytes = -1;
    assert_int_equal(obx__st_purge_payloads(f->s, &id, 1, &bytes), OBX_OK);
    assert_int_equal(bytes, 11 * (int64_t)strlen("{\"n\":9}"));
    assert_int_equal(count(f->db, sql), 0);
    assert_int_equal(obx__st_purge_payloads(f->s, &id, 1, &bytes), OBX_OK);
    assert_int_equal(bytes, 0);
}

static void test_frozen(void **state) {
    fx *f = *state;
    obx_event ev = order_event("o-5", "{}");
    obx_enqueue_result res;
    assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_OK);
    /* and one with a delivery set, whose contract is frozen too */
    obx_route_target t[] = {{.cluster = "eu", .topic = "orders-eu"}};
    obx_route rs = {.event_type = "order.created.v2",
                    .cluster = "local",
                    .topic = "orders",
                    .targets = t,
                    .n_targets = 1};
    assert_int_equal(obx_route_set(f->s, &rs, NULL), OBX_OK);
    obx_event evs = order_event("o-5s", "{}");
    obx_enqueue_result ress;
    assert_int_equal(obx_enqueue(f->s, &evs, &ress), OBX_OK);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_delivery_target"), 2);
    exec_ok(f->db, "INSERT INTO obx_attempt VALUES ('att-1', 'evt-1', 1, 1, 1, 'relay-a', "
                   "'sha256:d', 0, 'SENDING', 5, 0, 0, -1, 0, '')");
    const char *bad[] = {
        "UPDATE obx_attempt SET owner = 'mallory'",
        "UPDATE obx_attempt SET dest_digest = 'sha256:00', state = 'ACCEPTED'",
        "UPDATE obx_attempt SET started_at = started_at + 1",
        "UPDATE obx_delivery_set SET completion = 'any'",
        "DELETE FROM obx_delivery_set",
        "UPDATE obx_delivery_target SET target_no = 3",
        "DELETE FROM obx_delivery_target",
        "UPDATE obx_route_set SET completion = 'any'",
        "UPDATE obx_route_target SET topic = 'elsewhere'",
        "UPDATE obx_envelope SET dest_topic = 'elsewhere'",
        "UPDATE obx_envelope SET payload_digest = 'sha256:00'",
        "UPDATE obx_envelope SET payload = x'00'",
        "UPDATE obx_envelope SET tenant = 'other'",
        "UPDATE obx_envelope SET dest_route_gen = dest_route_gen + 1",
        "DELETE FROM obx_envelope",
        "UPDATE obx_event SET event_id = 'evt-x'",
        "UPDATE obx_event SET dest_cluster = 'other'",
        "UPDATE obx_event SET order_key = 'x'",
        "UPDATE obx_event SET envelope_gen = 0",
        "DELETE FROM obx_event",
        /* a route generation too: a new one is an insert */
        "UPDATE obx_route SET topic = 'elsewhere'",
        "DELETE FROM obx_route",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *err = NULL;
        int rc = sqlite3_exec(f->db, bad[i], NULL, NULL, &err);
        if (rc == SQLITE_OK) fail_msg("'%s' was allowed", bad[i]);
        assert_non_null(strstr(err, "obx:"));
        sqlite3_free(err);
    }
    /* the state columns are not frozen (the engine moves them), the purge may drop payload */
    exec_ok(f->db, "UPDATE obx_event SET updated_at = updated_at + 1");
    exec_ok(f->db, "UPDATE obx_envelope SET payload = NULL");
    exec_ok(f->db, "UPDATE obx_attempt SET state = 'ACCEPTED', ended_at = 9, detail = 'acked'");
    exec_ok(f->db, "UPDATE obx_attempt SET owner = owner");
    /* a later route generation changes nothing for this event */
    obx_route r = {.event_type = "order.created.v2", .cluster = "local", .topic = "orders-v2"};
    assert_int_equal(obx_route_set(f->s, &r, NULL), OBX_OK);
    char *js = NULL;
    assert_int_equal(obx_inspect(f->s, res.event_id, &js), OBX_OK);
    assert_non_null(strstr(js, "\"topic\": \"orders\""));
    assert_non_null(strstr(js, res.dest_digest));
    obx_free(js);
    obx_enqueue_result res2;
    ev.aggregate_id = "o-6";
    assert_int_equal(obx_enqueue(f->s, &ev, &res2), OBX_OK);
    assert_string_not_equal(res.dest_digest, res2.dest_digest);
    assert_int_equal(obx_inspect(f->s, res2.event_id, &js), OBX_OK);
    assert_non_null(strstr(js, "\"topic\": \"orders-v2\""));
    obx_free(js);
}

static void test_digests_recomputable(void **state) {
    fx *f = *state;
    obx_event ev = order_event("o-7", "{\"total\":1999}");
    ev.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    obx_enqueue_result res;
    assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_OK);
    obx__rows rows = {0};
    const char *id = res.event_id;
    assert_int_equal(obx__st_load_events(f->s, &id, 1, OBX__LOAD_PAYLOAD, &rows), OBX_OK);
    assert_int_equal(rows.n, 1);
    obx__event_row *r = &rows.v[0];
    char d[OBX_DIGEST_LEN + 1];
    assert_int_equal(obx__dest_digest(&r->dest, d), OBX_OK);
    assert_string_equal(d, r->dest_digest);
    assert_int_equal(obx__envelope_digest(&r->env, d), OBX_OK);
    assert_string_equal(d, r->envelope_digest);
    assert_int_equal(obx_sha256_digest(r->payload, r->payload_len, d), OBX_OK);
    assert_string_equal(d, r->env.payload_digest);
    assert_string_equal(r->dest.routing_key, "tenant-7.order.o-7");
    assert_string_equal(r->env.traceparent, ev.traceparent);
    assert_int_equal(r->pinned_partition, -1);
    obx__rows_free(&rows);
}

/* Each case changes one field of a good event; each must fail with an error naming the field
 * and leave no row behind. */
static void mutate(int k, obx_event *e, const char *big, const unsigned char *pbig) {
    switch (k) {
    case 0: e->event_type = NULL; break;
    case 1: e->event_type = "order.created"; break;
    case 2: e->event_type = "unknown.type.v1"; break;
    case 3: e->aggregate_type = ""; break;
    case 4: e->aggregate_id = big; break;
    case 5: e->aggregate_id = "o-\xff\xfe"; break;
    case 6: e->tenant = "tenant 7"; break;
    case 7: e->tenant = "t'; DROP TABLE obx_event;--"; break;
    case 8:
        e->payload = NULL;
        e->payload_len = 0;
        break;
    case 9:
        e->payload = pbig;
        e->payload_len = OBX_PAYLOAD_DEFAULT_LIMIT + 1;
        break;
    case 10: e->correlation_id = "c\x01"; break;
    case 11: e->traceparent = "00-xyz"; break;
    case 12: e->payload_schema = "md5:abc"; break;
    case 13: e->aggregate_version = -1; break;
    case 14: e->idempotency_key = big; break;
    case 15: e->tenant = big; break;
    }
}

static void test_bad_input(void **state) {
    fx *f = *state;
    char big[OBX_KEY_MAX + 10];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    unsigned char *pbig = calloc(1, OBX_PAYLOAD_DEFAULT_LIMIT + 1);
    static const struct {
        obx_err code;
        const char *needle;
    } expect[] = {
        {OBX_EINVAL, "event_type: missing"},
        {OBX_EINVAL, "event_type: 'order.created' is not versioned"},
        {OBX_ENOROUTE, "event_type: no route for 'unknown.type.v1'"},
        {OBX_EINVAL, "aggregate_type: empty"},
        {OBX_ETOOBIG, "aggregate_id: 264 bytes, over the limit of 255"},
        {OBX_EINVAL, "aggregate_id: invalid UTF-8 at byte 2"},
        {OBX_EINVAL, "tenant: byte 0x20 at offset 6"},
        {OBX_EINVAL, "tenant: byte 0x27 at offset 1"},
        {OBX_EINVAL, "payload: empty"},
        {OBX_ETOOBIG, "payload: 1048577 bytes, over the limit of 1048576 bytes"},
        {OBX_EINVAL, "correlation_id: byte 0x01"},
        {OBX_EINVAL, "traceparent: not W3C"},
        {OBX_EINVAL, "payload_schema: must be"},
        {OBX_EINVAL, "aggregate_version: -1 is negative"},
        {OBX_ETOOBIG, "idempotency_key: 264 bytes"},
        {OBX_ETOOBIG, "tenant: 264 bytes, over the limit of 128"},
    };
    exec_ok(f->db, "BEGIN");
    exec_ok(f->db, "INSERT INTO orders VALUES ('o-b', 1)");
    for (size_t k = 0; k < sizeof expect / sizeof expect[0]; k++) {
        obx_event ev = order_event("o-b", "{}");
        mutate((int)k, &ev, big, pbig);
        obx_enqueue_result res;
        obx_err e = obx_enqueue(f->s, &ev, &res);
        if (e != expect[k].code || !strstr(obx_errmsg(), expect[k].needle))
            fail_msg("case %zu: got %s '%s', expected %s containing '%s'", k, obx_errname(e),
                     obx_errmsg(), obx_errname(expect[k].code), expect[k].needle);
        assert_string_equal(res.event_id, "");
        /* the caller's transaction is intact and nothing was stored */
        assert_int_equal(sqlite3_get_autocommit(f->db), 0);
        assert_int_equal(count(f->db, "SELECT count(*) FROM obx_event"), 0);
        assert_int_equal(count(f->db, "SELECT count(*) FROM obx_envelope"), 0);
        assert_int_equal(count(f->db, "SELECT count(*) FROM obx_audit"), 0);
    }
    exec_ok(f->db, "COMMIT");
    assert_int_equal(count(f->db, "SELECT count(*) FROM orders"), 1);
    /* a custom payload limit */
    assert_int_equal(obx_store_set_payload_limit(f->s, 4), OBX_OK);
    obx_event ev = order_event("o-c", "12345");
    obx_enqueue_result res;
    assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_ETOOBIG);
    assert_non_null(strstr(obx_errmsg(), "over the limit of 4 bytes"));
    assert_int_equal(obx_store_set_payload_limit(f->s, 0), OBX_EINVAL);
    free(pbig);
}

static void test_schema_versions(void **state) {
    fx *f = *state;
    int found = 0, known = 0;
    assert_int_equal(obx_store_schema_version(f->s, &found, &known), OBX_OK);
    assert_int_equal(found, known);
    assert_int_equal(obx_store_init(f->s), OBX_OK); /* idempotent */
    exec_ok(f->db, "UPDATE obx_meta SET value = '99' WHERE key = 'schema_version'");
    assert_int_equal(obx_store_init(f->s), OBX_ESCHEMA);
    assert_non_null(strstr(obx_errmsg(), "version 99 is newer"));
    /* a fresh in-memory database starts at 0 */
    obx_store *m;
    assert_int_equal(obx_store_open("sqlite::memory:", &m), OBX_OK);
    assert_int_equal(obx_store_schema_version(m, &found, NULL), OBX_OK);
    assert_int_equal(found, 0);
    assert_int_equal(obx_store_init(m), OBX_OK);
    assert_int_equal(obx_store_schema_version(m, &found, NULL), OBX_OK);
    assert_int_equal(found, known);
    /* no SQL producer function here: an empty line (obx init prints none) */
    char body[64] = "x";
    assert_int_equal(obx_store_producer_body(m, body, sizeof body), OBX_OK);
    assert_string_equal(body, "");
    assert_int_equal(obx_store_producer_body(m, NULL, 1), OBX_EINVAL);
    obx_store_close(m);
    obx_store_close(NULL); /* harmless */
}

/* OBX_STORE_READ_ONLY (issue 50): a missing file is OBX_ENODB and is not created; an existing
 * outbox is read (also inside a transaction: a read transaction, while the producer's
 * connection is open in WAL mode) and every write is refused with nothing changed. */
static void test_read_only(void **state) {
    fx *f = *state;
    char missing[400];
    snprintf(missing, sizeof missing, "sqlite:%s/missing.db", f->dir);
    obx_store *ro = NULL;
    assert_int_equal(obx_store_open_with(missing, OBX_STORE_READ_ONLY, &ro), OBX_ENODB);
    assert_null(ro);
    assert_non_null(strstr(obx_errmsg(), "no such database file"));
    assert_int_not_equal(access(missing + 7, F_OK), 0);
    assert_int_equal(obx_store_open_with(f->url, 8, &ro), OBX_EINVAL); /* unknown flag bits */
    obx_event ev = order_event("o-ro", "{\"total\":1}");
    obx_enqueue_result res;
    assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_OK);
    assert_int_equal(obx_store_open_with(f->url, OBX_STORE_READ_ONLY, &ro), OBX_OK);
    int found = 0, known = 0;
    assert_int_equal(obx_store_schema_version(ro, &found, &known), OBX_OK);
    assert_int_equal(found, known);
    char *out = NULL;
    assert_int_equal(obx_report(ro, &out), OBX_OK);
    assert_non_null(strstr(out, "\"committed\": 1"));
    obx_free(out);
    assert_int_equal(obx_inspect(ro, res.event_id, &out), OBX_OK); /* in a read transaction */
    obx_free(out);
    obx_route r = {.event_type = "order.created.v2", .cluster = "local", .topic = "other"};
    assert_int_not_equal(obx_route_set(ro, &r, NULL), OBX_OK);
    ev.aggregate_id = "o-ro-2";
    assert_int_not_equal(obx_enqueue(ro, &ev, &res), OBX_OK);
    obx_store_close(ro);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_event"), 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_route WHERE topic = 'other'"), 0);
}

/* The migration runner (shared.c) as an upgrade after a release will use it, here with the
 * scripts of three made-up versions on SQLite: a new database runs every script and records
 * each version; one at version 1 runs the scripts after it (running 1's again would fail); one
 * at the last version runs nothing; one newer than the last is refused, naming both versions,
 * with nothing run; a failing script's error names its version, and what ran before it is left
 * to the caller's transaction (the stores roll it back). */
static sqlite3 *runner_db;
static int runner_calls;

static obx_err runner_exec(obx__store *s, const char *sql) {
    (void)s;
    runner_calls++;
    char *err = NULL;
    if (sqlite3_exec(runner_db, sql, NULL, NULL, &err) == SQLITE_OK) return OBX_OK;
    obx_err e = obx__fail(OBX_EIO, "%s", err ? err : "?");
    sqlite3_free(err);
    return e;
}

/* runner_db: a new in-memory database, at version `at` of scripts (0: empty) */
static void runner_new(const char *const *scripts, int at) {
    if (runner_db) sqlite3_close(runner_db);
    assert_int_equal(sqlite3_open(":memory:", &runner_db), SQLITE_OK);
    for (int v = 1; v <= at; v++) exec_ok(runner_db, scripts[v]);
    char sql[96];
    snprintf(sql, sizeof sql, "INSERT INTO obx_meta VALUES ('schema_version', '%d')", at);
    if (at) exec_ok(runner_db, sql);
    runner_calls = 0;
}

static void test_migrate_runner(void **state) {
    (void)state;
    const char *const scripts[] = {NULL, "CREATE TABLE obx_meta (key TEXT PRIMARY KEY, value TEXT)",
                                   "CREATE TABLE t2 (x)", "CREATE TABLE t3 (x)"};
    const char *tables = "SELECT count(*) FROM sqlite_master WHERE name IN ('t2', 't3')";
    const char *version = "SELECT value FROM obx_meta WHERE key = 'schema_version'";
    runner_new(scripts, 0);
    assert_int_equal(obx__migrate_run(NULL, 0, scripts, 3, "obx_meta", runner_exec), OBX_OK);
    assert_int_equal(runner_calls, 6); /* each script and its version */
    assert_int_equal(count(runner_db, version), 3);
    assert_int_equal(count(runner_db, tables), 2);
    runner_new(scripts, 1);
    assert_int_equal(obx__migrate_run(NULL, 1, scripts, 3, "obx_meta", runner_exec), OBX_OK);
    assert_int_equal(runner_calls, 4);
    assert_int_equal(count(runner_db, version), 3);
    assert_int_equal(count(runner_db, tables), 2);
    runner_calls = 0;
    assert_int_equal(obx__migrate_run(NULL, 3, scripts, 3, "obx_meta", runner_exec), OBX_OK);
    assert_int_equal(runner_calls, 0);
    assert_int_equal(obx__migrate_run(NULL, 4, scripts, 3, "obx_meta", runner_exec), OBX_ESCHEMA);
    assert_string_equal(obx_errmsg(),
                        "database schema version 4 is newer than this obx knows (3): upgrade obx");
    assert_int_equal(runner_calls, 0);
    const char *const bad[] = {NULL, scripts[1], scripts[2], "CREATE TABLE t3 ("};
    runner_new(bad, 1);
    assert_int_equal(obx__migrate_run(NULL, 1, bad, 3, "obx_meta", runner_exec), OBX_EIO);
    if (!strstr(obx_errmsg(), "migration to schema version 3: ")) fail_msg("%s", obx_errmsg());
    assert_int_equal(count(runner_db, version), 2);
    sqlite3_close(runner_db);
    runner_db = NULL;
}

/* The relay refuses to send bytes that are not the committed event: a payload changed in the
 * store behind obx's back (here: the frozen-envelope trigger dropped and the row rewritten) no
 * longer hashes to the frozen payload digest, and the event is PARKED with that reason instead
 * of putting another message under its ID. Nothing reaches the broker. */
static void test_payload_rehashed_before_send(void **state) {
    fx *f = *state;
    obx_event ev = order_event("o-9", "{\"order\":\"o-9\",\"total\":10}");
    obx_enqueue_result res;
    assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_OK);
    exec_ok(f->db, "DROP TRIGGER obx_envelope_frozen");
    exec_ok(f->db, "UPDATE obx_envelope SET payload = CAST('{\"order\":\"o-9\",\"total\":99}' "
                   "AS BLOB)");
    char url[300];
    snprintf(url, sizeof url, "log:%s/broker.db?cluster=local", f->dir);
    obx__broker *b;
    assert_int_equal(obx__br_open(url, NULL, 0, &b), OBX_OK);
    obx__engine e;
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    assert_int_equal(obx__engine_init(&e, f->s, b, &c), OBX_OK);
    size_t sent = 9;
    assert_int_equal(obx__engine_dispatch(&e, obx__wall_ms(), &sent), OBX_OK);
    assert_int_equal(sent, 0);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_event WHERE state = 'PARKED'"), 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_attempt WHERE state = 'REJECTED' AND "
                                  "detail LIKE '%not the frozen payload digest%'"),
                     1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_audit WHERE to_state = 'PARKED' AND "
                                  "reason LIKE '%no retry can cure it%'"),
                     1);
    obx__br_close(b);
    sqlite3 *bdb;
    char bpath[300];
    snprintf(bpath, sizeof bpath, "%s/broker.db", f->dir);
    assert_int_equal(sqlite3_open(bpath, &bdb), SQLITE_OK);
    assert_int_equal(count(bdb, "SELECT count(*) FROM obx_log_msg"), 0);
    sqlite3_close(bdb);
}

/* A destination contract the named cluster's registered backend cannot honour is refused at
 * `obx route set`, naming the field; nothing is stored. An unregistered cluster is accepted. */
static void test_route_contract_checked(void **state) {
    fx *f = *state;
    obx__cluster_row k = obx_t_cluster("kafka-eu", "kafka", "persistent", "all", "relay-1", 1);
    assert_int_equal(obx__st_cluster_put(f->s, &k), OBX_OK);
    int before = count(f->db, "SELECT count(*) FROM obx_route");
    obx_route r = {.event_type = "payment.captured.v1",
                   .cluster = "kafka-eu",
                   .topic = "payments",
                   .required_acks = "1"};
    assert_int_equal(obx_route_set(f->s, &r, NULL), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "required_acks: '1' cannot be honoured by cluster "
                                         "kafka-eu"));
    assert_non_null(strstr(obx_errmsg(), "kafka backend, which honours: all"));
    r.required_acks = NULL;
    r.durability = "transient";
    assert_int_equal(obx_route_set(f->s, &r, NULL), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "durability: 'transient'"));
    /* a delivery-set target on that cluster is checked too, by its own field name */
    obx_route_target t[] = {
        {.cluster = "kafka-eu", .topic = "payments", .durability = "transient"}};
    obx_route rs = {.event_type = "payment.captured.v1",
                    .cluster = "local",
                    .topic = "payments",
                    .targets = t,
                    .n_targets = 1};
    assert_int_equal(obx_route_set(f->s, &rs, NULL), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "targets[0].durability"));
    assert_int_equal(count(f->db, "SELECT count(*) FROM obx_route"), before);
    r.durability = NULL;
    assert_int_equal(obx_route_set(f->s, &r, NULL), OBX_OK);
    r.cluster = "nobody-registered-it";
    r.required_acks = "1";
    assert_int_equal(obx_route_set(f->s, &r, NULL), OBX_OK);
}

static void test_routes(void **state) {
    fx *f = *state;
    obx_route r = {.event_type = "payment.captured.v1",
                   .cluster = "local",
                   .topic = "payments",
                   .max_attempts = 3,
                   .blind_retry = 1};
    int64_t g1 = 0, g2 = 0;
    assert_int_equal(obx_route_set(f->s, &r, &g1), OBX_OK);
    r.topic = "payments-v2";
    assert_int_equal(obx_route_set(f->s, &r, &g2), OBX_OK);
    assert_true(g2 > g1);
    char *js = NULL;
    assert_int_equal(obx_route_list(f->s, 0, &js), OBX_OK);
    assert_non_null(strstr(js, "payments-v2"));
    assert_null(strstr(js, "\"payments\""));
    obx_free(js);
    assert_int_equal(obx_route_list(f->s, 1, &js), OBX_OK);
    assert_non_null(strstr(js, "\"payments\""));
    obx_free(js);
    /* bad routes */
    obx_route bad = r;
    bad.topic = "has space";
    assert_int_equal(obx_route_set(f->s, &bad, NULL), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "topic:"));
    bad = r;
    bad.algorithm = "md5";
    assert_int_equal(obx_route_set(f->s, &bad, NULL), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "algorithm:"));
    bad = r;
    bad.routing_key = "{oops}";
    assert_int_equal(obx_route_set(f->s, &bad, NULL), OBX_EINVAL);
    bad = r;
    bad.cluster = NULL;
    assert_int_equal(obx_route_set(f->s, &bad, NULL), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "cluster: missing"));
}

static char conf_dir[64];
static int conf_n;

static obx_err sqlite_factory(obx__store **out) {
    return obx_t_sqlite_store(conf_dir, "c", &conf_n, out);
}

/* an application's connection to sqlite_factory's last database (the conformance suite) */
static void *app_connect(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/c%d.db", conf_dir, conf_n);
    sqlite3 *db;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 5000);
    return db;
}

static obx_err app_wrap(void *conn, obx_store **out) { return obx_store_wrap_sqlite(conn, out); }

static int app_exec(void *conn, const char *sql) {
    return sqlite3_exec(conn, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

static long long app_count(void *conn, const char *sql) { return count(conn, sql); }

static void app_close(void *conn) { sqlite3_close(conn); }

static const store_app sqlite_app = {"", app_connect, app_wrap, app_exec, app_count, app_close};

/* ---- the claim's cost does not grow with the backlog ----------------------------------------- */

static int count_vm(void *arg) {
    (*(long *)arg)++;
    return 0;
}

/* VM work (in units of 100 instructions) of claiming one batch of 50 from a backlog of n
 * PENDING events (each its own aggregate, so the per-key order check runs for every one). */
static long claim_work(fx *f, int n) {
    exec_ok(f->db, "BEGIN");
    char id[32];
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof id, "bk-%d-%d", n, i);
        obx_event ev = order_event(id, "{}");
        obx_enqueue_result res;
        assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_OK);
    }
    exec_ok(f->db, "COMMIT");
    long work = 0;
    sqlite3_progress_handler(f->db, 100, count_vm, &work);
    obx__claim_req req = {.now = INT64_MAX / 2, .limit = 50};
    obx__rows rows = {0};
    assert_int_equal(
        obx__st_read_events(f->s, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &rows),
        OBX_OK);
    sqlite3_progress_handler(f->db, 0, NULL, NULL);
    assert_int_equal(rows.n, 50);
    obx__rows_free(&rows);
    exec_ok(f->db, "UPDATE obx_event SET state = 'PUBLISHED'"); /* out of the next backlog */
    return work;
}

/* Regression: the claim query used obx_event_state_pub, sorted the whole backlog for ORDER BY
 * seq LIMIT, and checked per-key order by scanning every unpublished row per candidate, so a
 * claim from 8,000 pending rows cost ~1000x one from 200. Now it walks obx_event_claimable in
 * (available_at, seq) order and probes obx_event_unpublished (order_key, seq): the same work for
 * any backlog. */
static void test_claim_cost_flat(void **state) {
    fx *f = *state;
    long small = claim_work(f, 200);
    long big = claim_work(f, 8000);
    print_message("claim of 50: VM work %ld (200 pending) vs %ld (8000 pending)\n", small, big);
    assert_true(small > 0);
    assert_true(big < small * 2);
}

/* The VM work of a claim of 50 from 100 due events enqueued after n events delayed by a day. */
static long delayed_claim_work(fx *f, int n) {
    exec_ok(f->db, "BEGIN");
    char id[32];
    for (int i = 0; i < n + 100; i++) {
        snprintf(id, sizeof id, "dl-%d-%d", n, i);
        obx_event ev = order_event(id, "{}");
        if (i < n) ev.not_before_ms = obx__wall_ms() + 86400000;
        obx_enqueue_result res;
        assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_OK);
    }
    exec_ok(f->db, "COMMIT");
    long work = 0;
    sqlite3_progress_handler(f->db, 100, count_vm, &work);
    obx__claim_req req = {.now = obx__wall_ms() + 60000, .limit = 50};
    obx__rows rows = {0};
    assert_int_equal(
        obx__st_read_events(f->s, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &rows),
        OBX_OK);
    sqlite3_progress_handler(f->db, 0, NULL, NULL);
    assert_int_equal(rows.n, 50);
    for (size_t i = 0; i < rows.n; i++) assert_int_equal(rows.v[i].env.not_before, 0);
    obx__rows_free(&rows);
    exec_ok(f->db, "UPDATE obx_event SET state = 'PUBLISHED'"); /* out of the next backlog */
    return work;
}

/* Issue 51: 8,000 delayed events committed ahead of the due ones cost a claim nothing. With
 * obx_event_claimable on (seq) the claim walked every delayed row on each call: VM work 691
 * against 51 with none (this test before the change); now it starts at the earliest due row and
 * stops at the first one not yet due (51 and 50). */
static void test_claim_cost_delayed(void **state) {
    fx *f = *state;
    long none = delayed_claim_work(f, 0);
    long many = delayed_claim_work(f, 8000);
    print_message("claim of 50: VM work %ld (no delayed events) vs %ld (8000 delayed ahead)\n",
                  none, many);
    assert_true(none > 0);
    assert_true(many < none * 2);
}

/* ---- no statement is re-prepared on a new binding ----------------------------------------------
 * Regression: retention candidates and state selects bound the state as a parameter; compared
 * with the constants of obx_event_inflight's predicate, that made SQLite re-prepare them on
 * every bind (two thirds of `obx sim`'s instructions). */
static int reprepares(sqlite3 *db) {
    int n = 0;
    for (sqlite3_stmt *st = sqlite3_next_stmt(db, NULL); st; st = sqlite3_next_stmt(db, st))
        n += sqlite3_stmt_status(st, SQLITE_STMTSTATUS_REPREPARE, 0);
    return n;
}

static void test_no_reprepare(void **state) {
    fx *f = *state;
    for (int i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "rp-%d", i);
        obx_event ev = order_event(id, "{}");
        obx_enqueue_result res;
        assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_OK);
    }
    exec_ok(f->db, "UPDATE obx_event SET state = 'PUBLISHED', published_at = seq");
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < 2; k++) {
            obx__retention_req rq = {.state = k ? OBX__ST_RETAINED : OBX__ST_PUBLISHED,
                                     .after = OBX__PUB_POS_MIN,
                                     .before = {.at = 1000 + round, .seq = INT64_MAX},
                                     .limit = 10 + (size_t)round};
            obx__rows rows = {0};
            assert_int_equal(
                obx__st_read_events(
                    f->s, &(obx__read_req){.by = OBX__READ_RETENTION, .retention = &rq}, &rows),
                OBX_OK);
            assert_int_equal(rows.n, k ? 0 : 3);
            obx__rows_free(&rows);
        }
        for (int st = OBX__ST_PENDING; st <= OBX__ST_PARKED; st++) {
            obx__select_req q = {
                .kind = OBX__SEL_STATE, .state = (obx__state)st, .limit = 5 + (size_t)round};
            obx__rows rows = {0};
            assert_int_equal(
                obx__st_read_events(f->s, &(obx__read_req){.by = OBX__READ_SELECT, .select = &q},
                                    &rows),
                OBX_OK);
            assert_int_equal(rows.n, st == OBX__ST_PUBLISHED ? 3 : 0);
            obx__rows_free(&rows);
            q.kind = OBX__SEL_PUBLISHED_BEFORE;
            q.now = INT64_MAX / 2;
            assert_int_equal(
                obx__st_read_events(f->s, &(obx__read_req){.by = OBX__READ_SELECT, .select = &q},
                                    &rows),
                OBX_OK);
            assert_int_equal(rows.n, st == OBX__ST_PUBLISHED ? 3 : 0);
            obx__rows_free(&rows);
        }
    }
    assert_int_equal(reprepares(f->db), 0);
}

int main(void) {
    if (obx_t_tmpdir(conf_dir, sizeof conf_dir, "conf")) return 1;
    int failed = store_conformance_run("store conformance: sqlite", sqlite_factory, &sqlite_app);
    if (obx_t_rmdir(conf_dir)) failed++;
    const struct CMUnitTest tests[] = {
        OBX_T_CASE(test_commit_together),
        OBX_T_CASE(test_rollback_together),
        OBX_T_CASE(test_idempotency_key),
        OBX_T_CASE(test_frozen),
        OBX_T_CASE(test_purge_generations),
        OBX_T_CASE(test_digests_recomputable),
        OBX_T_CASE(test_bad_input),
        OBX_T_CASE(test_schema_versions),
        OBX_T_CASE(test_read_only),
        cmocka_unit_test(test_migrate_runner),
        OBX_T_CASE(test_routes),
        OBX_T_CASE(test_payload_rehashed_before_send),
        OBX_T_CASE(test_route_contract_checked),
        OBX_T_CASE(test_claim_cost_flat),
        OBX_T_CASE(test_claim_cost_delayed),
        OBX_T_CASE(test_no_reprepare),
    };
    return cmocka_run_group_tests(tests, NULL, NULL) + failed;
}
