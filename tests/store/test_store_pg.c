/*
 * test_store_pg.c — the PostgreSQL store against a real server (OBX_TEST_PG_URL, set by
 * scripts/services.sh; the suite fails, never skips, without it).
 *
 * 1. The store conformance suite, one fresh database per test (CREATE DATABASE through a
 *    maintenance connection).
 * 2. PostgreSQL-specific tests: the producer's transaction on its own PGconn (commit together,
 *    roll back together, a SIGKILLed producer leaves neither), frozen-data triggers, concurrent
 *    producers (one event per idempotency key; per-key seq order is commit order), the SQL
 *    function obx.enqueue() against the C path and the digest vectors, psql as another language,
 *    least-privilege roles, NOTIFY waking wait_for_work, connection loss and a lost COMMIT,
 *    serialization/deadlock/lock-timeout mapping, SKIP LOCKED claims by concurrent relays,
 *    exact statistics, batch semantics, schema versions, and a claim+mark throughput figure;
 *    delivery sets through obx.enqueue() against the C path; the schema's own rules (checks,
 *    storage, IDs and digests in SQL, what each role writes); an upgrade refused under a
 *    running relay.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/pg_fx.h"
#include "support/support.h"

#include "engine/engine.h"
#include "engine/delay_suite.h"
#include "engine/fault_suite.h"
#include "engine/migration_suite.h"
#include "store/conformance.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char base_url[1024];
static PGconn *admin; /* maintenance connection to the URL's own database */
static int db_count;
static char created[256][64]; /* databases to drop at the end */

/* ---- helpers ----------------------------------------------------------------------------------
 */

/* base_url with its database replaced by db, and query parameters extra ("k=v&..." or "") */
static void db_url(const char *db, const char *extra, char *out, size_t cap) {
    const char *auth = strstr(base_url, "://");
    auth = auth ? auth + 3 : base_url;
    const char *slash = strchr(auth, '/');
    const char *q = strchr(auth, '?');
    size_t head =
        slash ? (size_t)(slash - base_url) : (q ? (size_t)(q - base_url) : strlen(base_url));
    const char *query = q ? q + 1 : "";
    snprintf(out, cap, "%.*s/%s%s%s%s%s", (int)head, base_url, db, (*query || *extra) ? "?" : "",
             query, (*query && *extra) ? "&" : "", extra);
}

static void admin_exec(const char *sql) {
    PGresult *r = PQexec(admin, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fprintf(stderr, "admin: %s: %s", sql, PQerrorMessage(admin));
    PQclear(r);
}

/* A fresh database; its name into db (64 bytes). */
static int new_db(char *db, const char *options) {
    snprintf(db, 64, "obx_t%d_%d", (int)getpid(), ++db_count);
    char sql[512];
    snprintf(sql, sizeof sql, "CREATE DATABASE %s %s", db, options ? options : "");
    PGresult *r = PQexec(admin, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) fprintf(stderr, "%s: %s", sql, PQerrorMessage(admin));
    PQclear(r);
    if (ok && db_count < 256) strcpy(created[db_count - 1], db);
    return ok ? 0 : -1;
}

static obx_err pg_factory(obx__store **out) {
    char db[64], url[1200];
    if (new_db(db, NULL)) return obx__fail(OBX_ESTORE, "cannot create a test database");
    db_url(db, "", url, sizeof url);
    obx_err e = obx__st_open(url, out);
    if (!e) e = obx_store_init(*out);
    return e;
}

static PGconn *connect_url(const char *url) { return obx_t_pg_connect(url); }

static void exec_ok(PGconn *c, const char *sql) { obx_t_pg_sql(c, sql); }

static long long qint(PGconn *c, const char *sql) { return obx_t_pg_qint(c, sql); }

/* SQLSTATE of a statement that must fail ("" if it succeeded); its message into msg. */
static void exec_fail(PGconn *c, const char *sql, char state[6], char *msg, size_t cap) {
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    state[0] = '\0';
    if (msg) msg[0] = '\0';
    if (st == PGRES_FATAL_ERROR) {
        const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        snprintf(state, 6, "%s", s ? s : "?????");
        const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
        if (msg) snprintf(msg, cap, "%s", m ? m : "");
    }
    PQclear(r);
}

static void msleep(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* qint(c, sql), read again every 10 ms for up to 5 s until it is at most `most`; the last value
 * read. For what a closed connection holds: its backend lets go when it exits, a moment after
 * the client closed it (PQfinish does not wait for that). */
static long long qint_down_to(PGconn *c, const char *sql, long long most) {
    long long n = qint(c, sql);
    for (int i = 0; i < 500 && n > most; i++) {
        msleep(10);
        n = qint(c, sql);
    }
    return n;
}

/* ---- fixture: a fresh initialized database with a route, and a "business" connection ------- */

typedef struct fx {
    char db[64];
    char url[1200];
    PGconn *conn; /* the business service's connection */
    obx_store *s; /* wrapping conn */
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    if (!f || new_db(f->db, NULL)) return -1;
    db_url(f->db, "", f->url, sizeof f->url);
    obx_store *own;
    if (obx_store_open(f->url, &own) || obx_store_init(own)) {
        fprintf(stderr, "setup: %s\n", obx_errmsg());
        return -1;
    }
    obx_route r = {.event_type = "order.created.v2", .cluster = "local", .topic = "orders"};
    if (obx_route_set(own, &r, NULL)) return -1;
    obx_store_close(own);
    f->conn = PQconnectdb(f->url);
    if (PQstatus(f->conn) != CONNECTION_OK) return -1;
    PQclear(PQexec(f->conn, "CREATE TABLE orders (id text PRIMARY KEY, total int)"));
    if (obx_store_wrap_pg(f->conn, &f->s)) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    obx_store_close(f->s);
    PQfinish(f->conn);
    char sql[128];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", f->db);
    admin_exec(sql);
    free(f);
    return 0;
}

static obx_event order_event(const char *id, const char *payload) {
    obx_event ev = {.event_type = "order.created.v2",
                    .aggregate_type = "order",
                    .aggregate_id = id,
                    .aggregate_version = 1,
                    .tenant = "tenant-7",
                    .payload = payload,
                    .payload_len = strlen(payload),
                    .correlation_id = "corr-1"};
    return ev;
}

static obx__event_row load1(obx__store *s, const char *id, unsigned flags) {
    obx__rows rows = {0};
    OK(obx__st_load_events(s, &id, 1, flags, &rows));
    assert_int_equal(rows.n, 1);
    obx__event_row r = rows.v[0];
    r.payload = NULL;
    obx__rows_free(&rows);
    return r;
}

/* An event's first audit row, recorded in its envelope (created_by) and not as an obx_audit
 * row, read back as the producer wrote it: NONE -> PENDING at the envelope's created_at by
 * `who`, under the route generation the envelope froze. */
static void check_first_row(obx__store *s, PGconn *c, const char *id, const char *who) {
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM obx.obx_audit WHERE event_id = '%s'", id);
    assert_int_equal(qint(c, sql), 0);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM obx.obx_envelope WHERE event_id = '%s' AND envelope_gen = 1 "
             "AND created_by = '%s'",
             id, who);
    assert_int_equal(qint(c, sql), 1);
    obx__event_row r = load1(s, id, 0);
    obx__audit_row *a = NULL;
    size_t n = 0;
    OK(obx__st_load_audit(s, id, &a, &n));
    assert_true(n >= 1);
    char reason[64];
    snprintf(reason, sizeof reason, "enqueued under route generation %lld",
             (long long)r.dest.route_gen);
    assert_int_equal(a[0].at, r.committed_at);
    assert_int_equal(a[0].actor, OBX__ACT_PRODUCER);
    assert_string_equal(a[0].who, who);
    assert_string_equal(a[0].event_id, id);
    assert_int_equal(a[0].envelope_gen, 1);
    assert_int_equal(a[0].from, OBX__ST_NONE);
    assert_int_equal(a[0].to, OBX__ST_PENDING);
    assert_int_equal(a[0].claim_gen, 0);
    assert_string_equal(a[0].attempt_id, "");
    assert_int_equal(a[0].attempt_gen, 0);
    assert_string_equal(a[0].reason, reason);
    for (size_t i = 1; i < n; i++) assert_int_not_equal(a[i].from, OBX__ST_NONE);
    free(a);
}

/* Opens an own store on the fixture's database, with an application_name to find its backend. */
static obx_store *open_own(fx *f, const char *app) {
    char url[1300], extra[128];
    snprintf(extra, sizeof extra, "application_name=%s", app);
    db_url(f->db, extra, url, sizeof url);
    obx_store *s = NULL;
    OK(obx_store_open(url, &s));
    return s;
}

static void kill_backend(const char *app) {
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE "
             "application_name = '%s'",
             app);
    PGresult *r = PQexec(admin, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) < 1)
        fail_msg("terminate %s: %s (%d backends)", app, PQerrorMessage(admin), PQntuples(r));
    PQclear(r);
}

/* Waits until a backend with this application_name waits for a lock (type "Lock" or
 * "advisory"); 0 when it does within 5 s. */
static int wait_lock_waiter(const char *app) {
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s' AND "
             "wait_event_type = 'Lock'",
             app);
    for (int i = 0; i < 500; i++) {
        if (qint(admin, sql) > 0) return 0;
        msleep(10);
    }
    return -1;
}

/* ---- a producer's transaction on its own connection ---------------------------------------- */

static void test_commit_together(void **state) {
    fx *f = *state;
    exec_ok(f->conn, "BEGIN");
    exec_ok(f->conn, "INSERT INTO orders VALUES ('o-1', 100)");
    obx_event ev = order_event("o-1", "{\"order\":\"o-1\"}");
    obx_enqueue_result res;
    OK(obx_enqueue(f->s, &ev, &res));
    /* obx used a savepoint and did not commit for us */
    assert_int_equal(PQtransactionStatus(f->conn), PQTRANS_INTRANS);
    PGconn *other = connect_url(f->url);
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_event"), 0); /* not yet visible */
    exec_ok(f->conn, "COMMIT");
    assert_int_equal(qint(other, "SELECT count(*) FROM orders"), 1);
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_event WHERE state='PENDING'"), 1);
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_envelope"), 1);
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_audit_all WHERE to_state='PENDING'"),
                     1);
    check_first_row(f->s, other, res.event_id, "producer");
    /* created_txid is the producer's own transaction */
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM obx.obx_envelope v JOIN orders o ON o.xmin::text = "
             "v.created_txid WHERE v.event_id = '%s'",
             res.event_id);
    assert_int_equal(qint(other, sql), 1);
    PQfinish(other);
    assert_int_equal(obx_event_id_check(res.event_id), OBX_OK);
    assert_false(res.existing);
}

static void test_rollback_together(void **state) {
    fx *f = *state;
    exec_ok(f->conn, "BEGIN");
    exec_ok(f->conn, "INSERT INTO orders VALUES ('o-2', 100)");
    obx_event ev = order_event("o-2", "{}");
    obx_enqueue_result res;
    OK(obx_enqueue(f->s, &ev, &res));
    exec_ok(f->conn, "ROLLBACK");
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders"), 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope"), 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_audit_all"), 0);
    /* without a caller's transaction obx commits its own */
    OK(obx_enqueue(f->s, &ev, &res));
    assert_int_equal(PQtransactionStatus(f->conn), PQTRANS_IDLE);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 1);
}

/* A failed obx step inside the caller's transaction leaves that transaction usable. */
static void test_caller_tx_survives(void **state) {
    fx *f = *state;
    obx_event ev = order_event("o-3", "{}");
    obx_enqueue_result res;
    OK(obx_enqueue(f->s, &ev, &res));
    exec_ok(f->conn, "BEGIN");
    exec_ok(f->conn, "INSERT INTO orders VALUES ('o-3', 1)");
    obx_event bad = ev;
    bad.event_type = "no.route.v1";
    assert_int_equal(obx_enqueue(f->s, &bad, &res), OBX_ENOROUTE);
    /* a statement that fails on the server (frozen-data trigger) inside obx's savepoint */
    obx__rows rows = {0};
    const char *id = NULL;
    char first[31];
    PGresult *r = PQexec(f->conn, "SELECT event_id FROM obx.obx_event");
    strcpy(first, PQgetvalue(r, 0, 0));
    PQclear(r);
    id = first;
    OK(obx__st_load_events(f->s, &id, 1, 0, &rows));
    obx__event_row row = rows.v[0];
    obx__rows_free(&rows);
    strcpy(row.dest.topic, "elsewhere"); /* a new order key without a new envelope generation */
    obx__event_update u = {&row, OBX__ST_PENDING, 0};
    bool applied = false;
    OK(obx__st_begin(f->s));
    assert_int_equal(obx__st_update_events(f->s, &u, 1, &applied), OBX_EIMMUTABLE);
    assert_non_null(strstr(obx_errmsg(), "obx: an event's identity and frozen destination"));
    OK(obx__st_rollback(f->s));
    assert_int_equal(PQtransactionStatus(f->conn), PQTRANS_INTRANS);
    exec_ok(f->conn, "COMMIT");
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders"), 1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 1);
    /* a caller's failed transaction is refused, not papered over */
    exec_ok(f->conn, "BEGIN");
    PQclear(PQexec(f->conn, "SELECT 1/0"));
    assert_int_equal(obx_enqueue(f->s, &ev, &res), OBX_ESTORE);
    assert_non_null(strstr(obx_errmsg(), "already failed"));
    exec_ok(f->conn, "ROLLBACK");
}

/* How often this connection ran obx's prepared statement whose text starts with `head`: the
 * server's count (pg_prepared_statements), not obx's. */
static long long runs_of(PGconn *c, const char *head) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT coalesce(sum(generic_plans + custom_plans), 0) FROM pg_prepared_statements "
             "WHERE name LIKE 'obx%%' AND statement LIKE '%s%%'",
             head);
    return qint(c, sql);
}

/* The stored event checked against the C code: its envelope digest (which the one-round-trip
 * write leaves to the server) and destination digest recomputed, created_txid the caller's
 * transaction (the xmin of its business row `order_id`); the destination's topic; its first
 * audit row. */
static void check_enqueued(fx *f, const char *id, const char *order_id, const char *topic) {
    obx__event_row r = load1(f->s, id, 0);
    char d[OBX_DIGEST_LEN + 1], sql[256];
    OK(obx__envelope_digest(&r.env, d));
    assert_string_equal(d, r.envelope_digest);
    OK(obx__dest_digest(&r.dest, d));
    assert_string_equal(d, r.dest_digest);
    assert_string_equal(r.dest.topic, topic);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM obx.obx_envelope v JOIN orders o ON o.xmin::text = "
             "v.created_txid WHERE v.event_id = '%s' AND o.id = '%s'",
             id, order_id);
    assert_int_equal(qint(f->conn, sql), 1);
    check_first_row(f->s, f->conn, id, "producer");
}

/* One business transaction: its row, then an enqueue of the order; the event ID into id. */
static obx_err business_enqueue(fx *f, const char *order_id, const char *key, char id[31],
                                int *existing) {
    char sql[128];
    exec_ok(f->conn, "BEGIN");
    snprintf(sql, sizeof sql, "INSERT INTO orders VALUES ('%s', 1)", order_id);
    exec_ok(f->conn, sql);
    obx_event ev = order_event(order_id, "{\"order\":1}");
    ev.idempotency_key = key;
    obx_enqueue_result res;
    obx_err e = obx_enqueue(f->s, &ev, &res);
    /* whatever happened, the caller's transaction is usable and commits its own row */
    assert_int_equal(PQtransactionStatus(f->conn), PQTRANS_INTRANS);
    exec_ok(f->conn, "COMMIT");
    snprintf(id, 31, "%s", res.event_id);
    if (existing) *existing = res.existing;
    return e;
}

/* Takes, in holder's open transaction, every order-key bucket's lock (docs/postgres.md), so
 * that an enqueue elsewhere waits for it. */
static void lock_every_bucket(PGconn *holder) {
    exec_ok(holder, "SELECT count(pg_advisory_xact_lock(5194328, g)) FROM generate_series(0, "
                    "1023) g");
}

#define ROUTE_READ "SELECT gen, event_type"
#define ONE_TRIP                                                                                   \
    "WITH lk AS MATERIALIZED (SELECT CASE WHEN % THEN pg_advisory_xact_lock_shared(% END WHERE "   \
    "$21"
#define TRY_TRIP                                                                                   \
    "WITH lk AS MATERIALIZED (SELECT CASE WHEN % THEN pg_try_advisory_xact_lock_shared(% END AS "  \
    "got WHERE $21"

/* Whether event id was written by the caller's top-level transaction itself, which wrote the
 * business row order_id: the same xmin, where a savepoint's write has its subtransaction's. */
static bool same_xmin(fx *f, const char *id, const char *order_id) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM obx.obx_event e JOIN orders o ON o.xmin = e.xmin WHERE "
             "e.event_id = '%s' AND o.id = '%s'",
             id, order_id);
    return qint(f->conn, sql) == 1;
}

/* Issue 19: after the first enqueue of a type the handle knows its route, and the next ones
 * write in one round trip, the server supplying created_txid and the envelope digest: an event
 * without an idempotency key in one statement of the caller's transaction (enqueue_try, no
 * savepoint), one with a key, or whose order-key bucket is busy, in a pipeline of savepoint,
 * write, release; a route changed in any way since (a new generation, or the row edited in
 * place) is never used; an idempotency key taken or a lock timeout leave the caller's
 * transaction usable. */
static void test_enqueue_one_round_trip(void **state) {
    fx *f = *state;
    char id[8][31];
    OK(business_enqueue(f, "r-1", NULL, id[0], NULL)); /* reads the route */
    OK(business_enqueue(f, "r-2", NULL, id[1], NULL)); /* one round trip */
    OK(business_enqueue(f, "r-3", NULL, id[2], NULL));
    assert_int_equal(runs_of(f->conn, ROUTE_READ), 1);
    assert_int_equal(runs_of(f->conn, TRY_TRIP), 2);
    assert_int_equal(runs_of(f->conn, ONE_TRIP), 0);
    check_enqueued(f, id[0], "r-1", "orders");
    check_enqueued(f, id[1], "r-2", "orders");
    check_enqueued(f, id[2], "r-3", "orders");
    assert_false(same_xmin(f, id[0], "r-1")); /* the long way's savepoint */
    assert_true(same_xmin(f, id[1], "r-2"));  /* no savepoint */
    assert_true(same_xmin(f, id[2], "r-3"));

    /* a new generation: the cached one writes nothing, the route is read again */
    obx_store *own = open_own(f, "route-admin");
    obx_route r2 = {.event_type = "order.created.v2", .cluster = "local", .topic = "orders-2"};
    OK(obx_route_set(own, &r2, NULL));
    OK(business_enqueue(f, "r-4", NULL, id[3], NULL));
    check_enqueued(f, id[3], "r-4", "orders-2");
    OK(business_enqueue(f, "r-5", NULL, id[4], NULL));
    check_enqueued(f, id[4], "r-5", "orders-2");
    assert_int_equal(runs_of(f->conn, ROUTE_READ), 2);
    assert_int_equal(runs_of(f->conn, TRY_TRIP), 4); /* r-4's wrote nothing */
    assert_int_equal(runs_of(f->conn, ONE_TRIP), 0);

    /* a generation's row cannot be edited in place, not even by the owner (obx_route_frozen):
     * its number is all the one-trip write compares */
    PGconn *owner = connect_url(f->url);
    char st[6];
    exec_fail(owner,
              "UPDATE obx.obx_route SET routing_key = 'k-{aggregate_id}' WHERE gen = "
              "(SELECT max(gen) FROM obx.obx_route)",
              st, NULL, 0);
    assert_string_equal(st, "OB001");
    exec_fail(owner, "DELETE FROM obx.obx_route", st, NULL, 0);
    assert_string_equal(st, "OB001");
    exec_fail(owner, "TRUNCATE obx.obx_route", st, NULL, 0);
    assert_string_equal(st, "OB001");
    PQfinish(owner);
    OK(business_enqueue(f, "r-6", NULL, id[5], NULL));
    check_enqueued(f, id[5], "r-6", "orders-2");
    assert_int_equal(runs_of(f->conn, ROUTE_READ), 2); /* the cached generation still holds */
    assert_int_equal(runs_of(f->conn, TRY_TRIP), 5);

    /* an idempotency key taken by another event (another aggregate): OBX_ECONFLICT, nothing
     * written, the row committed; an event with a key goes the savepoint's way (a taken key
     * must not fail the caller's transaction). The same event again gets the first event's ID
     * (tests/store/conformance.c). */
    OK(business_enqueue(f, "r-7", "key-7", id[6], NULL));
    assert_int_equal(runs_of(f->conn, ONE_TRIP), 1);
    assert_false(same_xmin(f, id[6], "r-7"));
    int existing = 0;
    assert_int_equal(business_enqueue(f, "r-7b", "key-7", id[7], &existing), OBX_ECONFLICT);
    assert_false(existing);
    assert_string_equal(id[7], "");
    assert_int_equal(runs_of(f->conn, ONE_TRIP), 2);
    assert_int_equal(runs_of(f->conn, TRY_TRIP), 5);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 7);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders"), 8);

    /* a write that fails on the server (every order-key bucket locked elsewhere, the caller's
     * lock_timeout): an error, nothing of it stored, the caller's transaction usable */
    PGconn *holder = connect_url(f->url);
    exec_ok(holder, "BEGIN");
    lock_every_bucket(holder);
    long long trips = runs_of(f->conn, ONE_TRIP);
    exec_ok(f->conn, "SET lock_timeout = '200ms'");
    char bad[31];
    assert_int_equal(business_enqueue(f, "r-8", NULL, bad, NULL), OBX_EBUSY);
    exec_ok(f->conn, "RESET lock_timeout");
    /* the statement without a savepoint found the bucket busy and wrote nothing; the one-trip
     * write in a savepoint waited for it */
    assert_int_equal(runs_of(f->conn, TRY_TRIP), 6);
    assert_int_equal(runs_of(f->conn, ONE_TRIP), trips + 1);
    exec_ok(holder, "ROLLBACK");
    PQfinish(holder);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 7);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope"), 7);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders WHERE id = 'r-8'"), 1);
    assert_int_equal(qint(f->conn, "SELECT sum(n) FROM obx.obx_stat_delta WHERE key = "
                                   "'state:PENDING'"),
                     7);
    obx_store_close(own);
}

/* A business transaction (order s-3) whose enqueue of ev test_enqueue_server_fault's trigger
 * refuses: the error, then the caller's transaction in state `after`, ended by `end`. */
static void refused_enqueue(fx *f, const obx_event *ev, PGTransactionStatusType after,
                            const char *end) {
    obx_enqueue_result res;
    exec_ok(f->conn, "BEGIN");
    exec_ok(f->conn, "INSERT INTO orders VALUES ('s-3', 1)");
    assert_int_equal(obx_enqueue(f->s, ev, &res), OBX_ESTORE);
    assert_non_null(strstr(obx_errmsg(), "refused for the test"));
    assert_int_equal(PQtransactionStatus(f->conn), after);
    exec_ok(f->conn, end);
}

/* A statement that fails on the server (a trigger refuses the envelope, as a full disk or a
 * cancelled statement would) in the caller's transaction. Without an idempotency key the event
 * is written without a savepoint (enqueue_try), so the caller's transaction has failed, as
 * after a failure of one of its own statements (include/obx.h); with a key, the savepoint
 * undoes the write and the transaction goes on. Nothing of either event is stored, and the
 * handle enqueues again afterwards. */
static void test_enqueue_server_fault(void **state) {
    fx *f = *state;
    char id[31];
    OK(business_enqueue(f, "s-1", NULL, id, NULL)); /* the route is now cached */
    OK(business_enqueue(f, "s-2", NULL, id, NULL));
    assert_int_equal(runs_of(f->conn, TRY_TRIP), 1);
    exec_ok(f->conn, "CREATE FUNCTION public.refuse_envelope() RETURNS trigger LANGUAGE plpgsql "
                     "AS $$BEGIN RAISE EXCEPTION 'refused for the test'; END$$");
    exec_ok(f->conn, "CREATE TRIGGER refuse BEFORE INSERT ON obx.obx_envelope FOR EACH ROW "
                     "EXECUTE FUNCTION public.refuse_envelope()");
    obx_event ev = order_event("s-3", "{}");
    refused_enqueue(f, &ev, PQTRANS_INERROR, "ROLLBACK");
    assert_int_equal(runs_of(f->conn, TRY_TRIP), 2);
    ev.idempotency_key = "key-3";
    refused_enqueue(f, &ev, PQTRANS_INTRANS, "COMMIT");
    exec_ok(f->conn, "DROP TRIGGER refuse ON obx.obx_envelope");
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders WHERE id = 's-3'"), 1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 2);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope"), 2);
    OK(business_enqueue(f, "s-4", NULL, id, NULL));
    check_enqueued(f, id, "s-4", "orders");
    assert_true(same_xmin(f, id, "s-4"));
    assert_int_equal(runs_of(f->conn, TRY_TRIP), 3);
}

enum kill_point { KILL_BETWEEN_INSERTS, KILL_BEFORE_COMMIT, KILL_AFTER_COMMIT };

/* A child process connects, begins, writes the business row, enqueues (or not), and is killed
 * with SIGKILL at the given point. */
static void child_and_kill(fx *f, enum kill_point kp) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        PGconn *c = PQconnectdb(f->url);
        obx_store *s;
        if (PQstatus(c) != CONNECTION_OK || obx_store_wrap_pg(c, &s)) _exit(3);
        PQclear(PQexec(c, "BEGIN"));
        PQclear(PQexec(c, "INSERT INTO orders VALUES ('o-k', 1)"));
        if (kp == KILL_BETWEEN_INSERTS) raise(SIGKILL);
        obx_event ev = order_event("o-k", "{\"k\":1}");
        obx_enqueue_result res;
        if (obx_enqueue(s, &ev, &res)) _exit(5);
        if (kp == KILL_BEFORE_COMMIT) raise(SIGKILL);
        PGresult *r = PQexec(c, "COMMIT");
        if (PQresultStatus(r) != PGRES_COMMAND_OK) _exit(6);
        raise(SIGKILL);
        _exit(7);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);
}

static void test_kill_producer(void **state) {
    fx *f = *state;
    child_and_kill(f, KILL_BETWEEN_INSERTS);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders"), 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 0);
    child_and_kill(f, KILL_BEFORE_COMMIT);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders"), 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope"), 0);
    child_and_kill(f, KILL_AFTER_COMMIT);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders"), 1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event WHERE state='PENDING'"), 1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope"), 1);
}

/* ---- frozen data ------------------------------------------------------------------------------
 */

/* A database a newer obx initialized is refused with both versions named, and nothing in it
 * changes (the migration runner in src/store/shared.c, shared with SQLite: tests/cli). */
static void test_newer_schema_refused(void **state) {
    fx *f = *state;
    PQclear(PQexec(f->conn, "UPDATE obx.obx_meta SET value = '99' WHERE key = 'schema_version'"));
    obx_err e = obx_store_init(f->s);
    assert_int_equal(e, OBX_ESCHEMA);
    char want[96];
    snprintf(want, sizeof want, "database schema version 99 is newer than this obx knows (%d)",
             OBX__SCHEMA_VERSION);
    if (!strstr(obx_errmsg(), want)) fail_msg("message: %s", obx_errmsg());
    PGresult *r = PQexec(f->conn, "SELECT value FROM obx.obx_meta WHERE key = 'schema_version'");
    assert_string_equal(PQgetvalue(r, 0, 0), "99");
    PQclear(r);
}

/* OBX_STORE_READ_ONLY (issue 50): a read-only session reads the outbox, and the server refuses
 * every write (nothing changes). */
static void test_read_only(void **state) {
    fx *f = *state;
    obx_store *ro = NULL;
    OK(obx_store_open_with(f->url, OBX_STORE_READ_ONLY, &ro));
    char *out = NULL;
    OK(obx_report(ro, &out));
    obx_free(out);
    obx_route r = {.event_type = "order.created.v2", .cluster = "local", .topic = "other"};
    assert_int_not_equal(obx_route_set(ro, &r, NULL), OBX_OK);
    if (!strstr(obx_errmsg(), "read-only")) fail_msg("message: %s", obx_errmsg());
    obx_event ev = order_event("o-ro", "{\"total\":1}");
    obx_enqueue_result res;
    assert_int_not_equal(obx_enqueue(ro, &ev, &res), OBX_OK);
    obx_store_close(ro);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_route WHERE topic = 'other'"), 0);
}

static void test_frozen(void **state) {
    fx *f = *state;
    obx_event ev = order_event("o-5", "{}");
    obx_enqueue_result res;
    OK(obx_enqueue(f->s, &ev, &res));
    const char *bad[] = {
        "UPDATE obx.obx_envelope SET dest_topic = 'elsewhere'",
        "UPDATE obx.obx_envelope SET payload_digest = 'sha256:00'",
        "UPDATE obx.obx_envelope SET payload = '\\x00'",
        "UPDATE obx.obx_envelope SET tenant = 'other'",
        "UPDATE obx.obx_envelope SET dest_route_gen = dest_route_gen + 1",
        "UPDATE obx.obx_envelope SET created_txid = '1'",
        "DELETE FROM obx.obx_envelope",
        "TRUNCATE obx.obx_envelope CASCADE",
        "UPDATE obx.obx_event SET event_id = 'evt-x'",
        "UPDATE obx.obx_event SET dest_cluster = 'other'",
        "UPDATE obx.obx_event SET order_key = 'x'",
        "UPDATE obx.obx_event SET envelope_gen = 0",
        "UPDATE obx.obx_event SET committed_at = 1",
        "DELETE FROM obx.obx_event",
        "TRUNCATE obx.obx_event",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char st[6], msg[512];
        exec_fail(f->conn, bad[i], st, msg, sizeof msg);
        if (strcmp(st, "OB001"))
            fail_msg("'%s': SQLSTATE '%s' (%s), expected OB001", bad[i], st, msg);
        assert_non_null(strstr(msg, "obx:"));
    }
    /* attempts and receipts */
    exec_ok(f->conn, "INSERT INTO obx.obx_attempt VALUES ('att-1', 'evt-1', 1, 1, 1, 'r', "
                     "'sha256:x', 0, 'SENDING', 1, 0, 0, -1, 0, '')");
    exec_ok(f->conn, "INSERT INTO obx.obx_receipt (event_id, envelope_gen, attempt_id, kind, "
                     "cluster, topic, partition, \"offset\", broker_ts, payload_digest, "
                     "dest_digest, reason, created_at) VALUES ('evt-1', 1, 'att-1', 'PRIMARY', "
                     "'c', 't', 0, 1, 1, 'd', 'd', '', 1)");
    const char *bad2[] = {"UPDATE obx.obx_attempt SET owner = 'other'",
                          "UPDATE obx.obx_attempt SET dest_digest = 'sha256:y'",
                          "UPDATE obx.obx_receipt SET \"offset\" = 2"};
    for (size_t i = 0; i < sizeof bad2 / sizeof bad2[0]; i++) {
        char st[6], msg[512];
        exec_fail(f->conn, bad2[i], st, msg, sizeof msg);
        if (strcmp(st, "OB001")) fail_msg("'%s': SQLSTATE '%s' (%s)", bad2[i], st, msg);
    }
    /* what the engine moves is not frozen; a purge may drop the payload */
    exec_ok(f->conn, "UPDATE obx.obx_event SET updated_at = updated_at + 1, state = 'CLAIMED'");
    exec_ok(f->conn, "UPDATE obx.obx_attempt SET state = 'UNKNOWN', detail = 'lost ack'");
    exec_ok(f->conn, "UPDATE obx.obx_envelope SET payload = NULL");
    obx__event_row r = load1(f->s, res.event_id, OBX__LOAD_PAYLOAD);
    assert_true(r.payload_purged);
    /* a later route generation changes nothing for this event */
    obx_route rt = {.event_type = "order.created.v2", .cluster = "local", .topic = "orders-v2"};
    OK(obx_route_set(f->s, &rt, NULL));
    char *js = NULL;
    OK(obx_inspect(f->s, res.event_id, &js));
    assert_non_null(strstr(js, "\"topic\": \"orders\""));
    assert_non_null(strstr(js, res.dest_digest));
    obx_free(js);
}

/* ---- concurrent producers ---------------------------------------------------------------------
 */

typedef struct producer_arg {
    obx_store *s;
    obx_event ev;
    obx_enqueue_result res;
    obx_err err;
    char msg[512];
    int done; /* atomic */
} producer_arg;

static void *producer_thread(void *p) {
    producer_arg *a = p;
    a->err = obx_enqueue(a->s, &a->ev, &a->res);
    snprintf(a->msg, sizeof a->msg, "%s", obx_errmsg());
    __atomic_store_n(&a->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* Runs one enqueue of `aid` on s in a thread while this one waits for it to wait for a lock,
 * then terminates its backend (application_name app); the enqueue's error. */
static obx_err enqueue_killed_in_lock_wait(obx_store *s, const char *app, const char *aid) {
    producer_arg pa = {.s = s, .ev = order_event(aid, "{\"k\":1}")};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, producer_thread, &pa), 0);
    assert_int_equal(wait_lock_waiter(app), 0);
    kill_backend(app);
    pthread_join(t, NULL);
    if (pa.err) obx__fail(pa.err, "%s", pa.msg);
    return pa.err;
}

/* Issue 19: a producer that enqueues with no transaction open (a wrapped connection in
 * autocommit, or a handle of its own) also writes in one round trip once it knows the route:
 * BEGIN, the write and COMMIT in one pipeline, where the long way takes four. Its outcomes are
 * the long way's: stored and committed on OBX_OK; nothing stored on an error the server answered
 * (an idempotency key taken goes on to the long way's lookup), the connection idle either way;
 * a connection that broke under the write stored nothing; one that broke while COMMIT ran is
 * OBX_EUNKNOWN, as the long way's commit. */
static void test_enqueue_own_one_round_trip(void **state) {
    fx *f = *state;
    obx_enqueue_result res[3];
    for (int i = 0; i < 3; i++) {
        char aid[16];
        snprintf(aid, sizeof aid, "s-%d", i);
        obx_event ev = order_event(aid, "{\"s\":1}");
        OK(obx_enqueue(f->s, &ev, &res[i]));
        assert_int_equal(PQtransactionStatus(f->conn), PQTRANS_IDLE);
    }
    assert_int_equal(runs_of(f->conn, ROUTE_READ), 1);
    assert_int_equal(runs_of(f->conn, ONE_TRIP), 2);
    PGconn *other = connect_url(f->url);
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_event"), 3);
    /* each its own transaction, the server's digests the C code's */
    assert_int_equal(qint(other, "SELECT count(DISTINCT created_txid) FROM obx.obx_envelope"), 3);
    for (int i = 0; i < 3; i++) {
        obx__event_row r = load1(f->s, res[i].event_id, 0);
        char d[OBX_DIGEST_LEN + 1];
        OK(obx__envelope_digest(&r.env, d));
        assert_string_equal(d, r.envelope_digest);
        OK(obx__dest_digest(&r.dest, d));
        assert_string_equal(d, r.dest_digest);
        assert_string_equal(r.dest_digest, res[i].dest_digest);
        check_first_row(f->s, f->conn, res[i].event_id, "producer");
    }

    /* an idempotency key taken: the first event, nothing written, the connection idle */
    obx_event k = order_event("s-k", "{\"s\":2}");
    k.idempotency_key = "key-s";
    obx_enqueue_result ka, kb;
    OK(obx_enqueue(f->s, &k, &ka));
    OK(obx_enqueue(f->s, &k, &kb));
    assert_true(kb.existing);
    assert_string_equal(kb.event_id, ka.event_id);
    assert_int_equal(runs_of(f->conn, ONE_TRIP), 4);
    assert_int_equal(PQtransactionStatus(f->conn), PQTRANS_IDLE);
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_event"), 4);

    /* an error the server answered (every order-key bucket locked elsewhere): nothing stored,
     * the connection idle, not in a failed transaction */
    PGconn *holder = connect_url(f->url);
    exec_ok(holder, "BEGIN");
    lock_every_bucket(holder);
    exec_ok(f->conn, "SET lock_timeout = '200ms'");
    obx_event b = order_event("s-busy", "{\"s\":3}");
    obx_enqueue_result rb;
    assert_int_equal(obx_enqueue(f->s, &b, &rb), OBX_EBUSY);
    assert_int_equal(runs_of(f->conn, ONE_TRIP), 5);
    assert_int_equal(PQtransactionStatus(f->conn), PQTRANS_IDLE);
    exec_ok(f->conn, "RESET lock_timeout");

    /* the connection broken while the write waits: the server's error ended the transaction */
    obx_store *own = open_own(f, "obx-own-trip");
    obx_event warm = order_event("s-warm", "{\"s\":4}");
    obx_enqueue_result rw;
    exec_ok(holder, "ROLLBACK");
    OK(obx_enqueue(own, &warm, &rw)); /* reads the route: the next one is one round trip */
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_event"), 5);
    exec_ok(holder, "BEGIN");
    lock_every_bucket(holder);
    obx_err e = enqueue_killed_in_lock_wait(own, "obx-own-trip", "s-lost");
    if (e != OBX_ECONNLOST) fail_msg("%s: %s", obx_errname(e), obx_errmsg());
    exec_ok(holder, "ROLLBACK");
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_event"), 5);
    obx_store_close(own);

    /* the connection broken while COMMIT runs (a deferred trigger waits for a lock): unknown to
     * the producer; the server rolled it back */
    exec_ok(other, "CREATE FUNCTION public.hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$ "
                   "BEGIN PERFORM pg_advisory_xact_lock(777); RETURN NULL; END $$");
    own = open_own(f, "obx-own-commit");
    OK(obx_enqueue(own, &warm, &rw)); /* the long way, before the trigger */
    exec_ok(other, "CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT ON obx.obx_envelope "
                   "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "
                   "public.hold_commit()");
    exec_ok(holder, "SELECT pg_advisory_lock(777)");
    e = enqueue_killed_in_lock_wait(own, "obx-own-commit", "s-commit");
    if (e != OBX_EUNKNOWN) fail_msg("%s: %s", obx_errname(e), obx_errmsg());
    assert_non_null(strstr(obx_errmsg(), "may or may not have been written"));
    exec_ok(holder, "SELECT pg_advisory_unlock(777)");
    exec_ok(other, "DROP TRIGGER hold_commit ON obx.obx_envelope");
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_event"), 6);
    assert_int_equal(qint(other, "SELECT count(*) FROM obx.obx_envelope"), 6);
    obx_store_close(own);
    PQfinish(holder);
    PQfinish(other);
}

/* Two producers, one idempotency key: the second waits for the first and gets its event. */
static void test_idempotency_concurrent(void **state) {
    fx *f = *state;
    obx_store *a = open_own(f, "obx-idem-a"), *b = open_own(f, "obx-idem-b");
    obx_event ev = order_event("o-9", "{\"n\":9}");
    ev.idempotency_key = "create-o-9";
    obx_enqueue_result ra;
    OK(obx__st_begin(a));
    OK(obx_enqueue(a, &ev, &ra));
    producer_arg pb = {.s = b, .ev = ev};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, producer_thread, &pb), 0);
    assert_int_equal(wait_lock_waiter("obx-idem-b"), 0);
    assert_false(__atomic_load_n(&pb.done, __ATOMIC_SEQ_CST));
    OK(obx__st_commit(a));
    pthread_join(t, NULL);
    if (pb.err) fail_msg("second producer: %s: %s", obx_errname(pb.err), pb.msg);
    assert_true(pb.res.existing);
    assert_string_equal(pb.res.event_id, ra.event_id);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 1);
    obx_store_close(a);
    obx_store_close(b);
}

typedef struct sql_arg {
    PGconn *c;
    char id[64];
    char err[512];
} sql_arg;

static void *sql_enqueue_thread(void *p) {
    sql_arg *a = p;
    PGresult *r = PQexec(a->c, "SELECT obx.enqueue('order.created.v2', 'order', 'o-10', 1, "
                               "'tenant-7', '\\x7b7d', idempotency_key => 'create-o-10')");
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
        snprintf(a->id, sizeof a->id, "%s", PQgetvalue(r, 0, 0));
    else
        snprintf(a->err, sizeof a->err, "%s", PQerrorMessage(a->c));
    PQclear(r);
    return NULL;
}

/* The same through the SQL function, in two sessions. */
static void test_idempotency_concurrent_sql(void **state) {
    fx *f = *state;
    char url[1300];
    db_url(f->db, "application_name=obx-sql-b", url, sizeof url);
    PGconn *b = connect_url(url);
    exec_ok(f->conn, "BEGIN");
    PGresult *r = PQexec(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'o-10', 1, "
                                  "'tenant-7', '\\x7b7d', idempotency_key => 'create-o-10')");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    char first[64];
    snprintf(first, sizeof first, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    sql_arg sb = {.c = b};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, sql_enqueue_thread, &sb), 0);
    assert_int_equal(wait_lock_waiter("obx-sql-b"), 0);
    exec_ok(f->conn, "COMMIT");
    pthread_join(t, NULL);
    if (sb.err[0]) fail_msg("second session: %s", sb.err);
    assert_string_equal(sb.id, first);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 1);
    PQfinish(b);
}

/* Per order key, seq order is commit order: a second producer of the key waits for the first
 * one's commit; a producer of another key does not. */
static void test_seq_is_commit_order(void **state) {
    fx *f = *state;
    obx_store *a = open_own(f, "obx-seq-a"), *b = open_own(f, "obx-seq-b"),
              *c = open_own(f, "obx-seq-c");
    obx_event ev = order_event("o-key", "{\"n\":1}");
    obx_enqueue_result ra, rc;
    OK(obx__st_begin(a));
    OK(obx_enqueue(a, &ev, &ra));
    producer_arg pb = {.s = b, .ev = ev};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, producer_thread, &pb), 0);
    assert_int_equal(wait_lock_waiter("obx-seq-b"), 0);
    /* another key goes through while the first producer is still open */
    obx_event other = order_event("o-other", "{\"n\":2}");
    OK(obx_enqueue(c, &other, &rc));
    msleep(50);
    assert_false(__atomic_load_n(&pb.done, __ATOMIC_SEQ_CST));
    OK(obx__st_commit(a));
    pthread_join(t, NULL);
    OK(pb.err);
    obx__event_row first = load1(a, ra.event_id, 0), second = load1(a, pb.res.event_id, 0);
    assert_true(first.seq < second.seq);
    /* the claim rule sees them in that order */
    obx__claim_req req = {.now = obx__wall_ms() + 1000, .limit = 10};
    obx__rows rows = {0};
    OK(obx__st_begin(a));
    OK(obx__st_read_events(a, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &rows));
    OK(obx__st_commit(a));
    bool saw_first = false, saw_second = false;
    for (size_t i = 0; i < rows.n; i++) {
        saw_first |= !strcmp(rows.v[i].env.event_id, ra.event_id);
        saw_second |= !strcmp(rows.v[i].env.event_id, pb.res.event_id);
    }
    obx__rows_free(&rows);
    assert_true(saw_first);
    assert_false(saw_second);
    obx_store_close(a);
    obx_store_close(b);
    obx_store_close(c);
}

/* ---- the SQL function and the digests -----------------------------------------------------------
 */

static void test_digest_vectors_sql(void **state) {
    fx *f = *state;
    json_error_t jerr;
    json_t *doc = json_load_file(OBX_TEST_DATA "/digest_vectors.json", 0, &jerr);
    if (!doc) fail_msg("digest_vectors.json: %s", jerr.text);
    size_t i;
    json_t *v;
    int checked = 0;
    json_array_foreach(json_object_get(doc, "destination"), i, v) {
        json_t *fl = json_object_get(v, "fields");
        char gen[32];
        snprintf(gen, sizeof gen, "%lld",
                 (long long)json_integer_value(json_object_get(fl, "route_policy_gen")));
        const char *p[8] = {json_string_value(json_object_get(fl, "cluster")),
                            json_string_value(json_object_get(fl, "topic")),
                            json_string_value(json_object_get(fl, "routing_key")),
                            json_string_value(json_object_get(fl, "algorithm")),
                            gen,
                            json_string_value(json_object_get(fl, "serializer")),
                            json_string_value(json_object_get(fl, "durability")),
                            json_string_value(json_object_get(fl, "required_acks"))};
        PGresult *r = PQexecParams(
            f->conn,
            "SELECT encode(obx.dest_canonical($1, $2, $3, $4, $5::bigint, $6, $7, $8), 'hex'), "
            "obx.dest_digest($1, $2, $3, $4, $5::bigint, $6, $7, $8)",
            8, NULL, p, NULL, NULL, 0);
        assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
        assert_string_equal(PQgetvalue(r, 0, 0),
                            json_string_value(json_object_get(v, "canonical_hex")));
        assert_string_equal(PQgetvalue(r, 0, 1), json_string_value(json_object_get(v, "digest")));
        PQclear(r);
        checked++;
    }
    json_array_foreach(json_object_get(doc, "envelope"), i, v) {
        json_t *fl = json_object_get(v, "fields");
        char eg[32], av[32], oa[32];
        snprintf(eg, sizeof eg, "%lld",
                 (long long)json_integer_value(json_object_get(fl, "envelope_gen")));
        snprintf(av, sizeof av, "%lld",
                 (long long)json_integer_value(json_object_get(fl, "aggregate_version")));
        snprintf(oa, sizeof oa, "%lld",
                 (long long)json_integer_value(json_object_get(fl, "occurred_at")));
        const char *names[] = {
            "event_id",     "envelope_gen",   "aggregate_type", "aggregate_id", "aggregate_version",
            "event_type",   "payload_schema", "payload_digest", "tenant",       "occurred_at",
            "created_txid", "correlation_id", "causation_id",   "traceparent",  "idempotency_key"};
        const char *p[15];
        for (int k = 0; k < 15; k++) p[k] = json_string_value(json_object_get(fl, names[k]));
        p[1] = eg;
        p[4] = av;
        p[9] = oa;
        PGresult *r = PQexecParams(
            f->conn,
            "SELECT encode(obx.envelope_canonical($1, $2::int, $3, $4, $5::bigint, $6, $7, $8, $9, "
            "$10::bigint, $11, $12, $13, $14, $15), 'hex'), obx.envelope_digest($1, $2::int, $3, "
            "$4, $5::bigint, $6, $7, $8, $9, $10::bigint, $11, $12, $13, $14, $15)",
            15, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s", PQerrorMessage(f->conn));
        assert_string_equal(PQgetvalue(r, 0, 0),
                            json_string_value(json_object_get(v, "canonical_hex")));
        assert_string_equal(PQgetvalue(r, 0, 1), json_string_value(json_object_get(v, "digest")));
        PQclear(r);
        checked++;
    }
    json_array_foreach(json_object_get(doc, "payload"), i, v) {
        const char *p[1] = {json_string_value(json_object_get(v, "hex"))};
        PGresult *r =
            PQexecParams(f->conn, "SELECT 'sha256:' || encode(sha256(decode($1, 'hex')), 'hex')", 1,
                         NULL, p, NULL, NULL, 0);
        assert_string_equal(PQgetvalue(r, 0, 0), json_string_value(json_object_get(v, "digest")));
        PQclear(r);
        checked++;
    }
    assert_int_equal(checked, 10);
    json_decref(doc);
}

/* SQL function fn (obx.enqueue() or one of its bodies) and obx_enqueue() freeze
 * the same destination and digests; the C code recomputes the SQL row's envelope digest from its
 * fields. key: the SQL call's idempotency key (NULL: none). plsql: the calls of the PL/pgSQL
 * body the call makes (the server's count, track_functions), 0 when obx_pg's C body wrote it. */
static void sql_enqueue_matches_c(fx *f, const char *fn, const char *key, int plsql) {
    obx_route rt = {.event_type = "order.created.v2",
                    .cluster = "kafka-prod",
                    .topic = "orders",
                    .routing_key = "{tenant}/{event_type}/{aggregate_type}/{aggregate_id}",
                    .algorithm = "fnv1a",
                    .max_attempts = 5,
                    .unordered = 1,
                    .alias = "orders-relay"};
    OK(obx_route_set(f->s, &rt, NULL));
    obx_event ev = {.event_type = "order.created.v2",
                    .aggregate_type = "order",
                    .aggregate_id = "o-ü {tenant}",
                    .aggregate_version = 42,
                    .tenant = "tenant-7",
                    .payload = "\x00\x01payload\xff",
                    .payload_len = 10,
                    .correlation_id = "corr/ü",
                    .causation_id = "cause",
                    .traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                    .idempotency_key = "k-c",
                    .occurred_at_ms = 1700000000001};
    obx_enqueue_result rc;
    int64_t t0 = obx__wall_ms();
    OK(obx_enqueue(f->s, &ev, &rc));
    const char *p[11] = {ev.event_type,
                         ev.aggregate_type,
                         ev.aggregate_id,
                         "42",
                         ev.tenant,
                         (const char *)ev.payload,
                         NULL,
                         ev.correlation_id,
                         ev.causation_id,
                         ev.traceparent,
                         key};
    int lens[11] = {0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0};
    int fmts[11] = {0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0};
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT %s($1, $2, $3, $4::bigint, $5, $6::bytea, $7, $8, $9, $10, $11, "
             "'epoch'::timestamptz + 1700000000001 * interval '1 millisecond')",
             fn);
    exec_ok(f->conn, "BEGIN");
    exec_ok(f->conn, "SET LOCAL track_functions = 'pl'");
    PGresult *r = PQexecParams(f->conn, sql, 11, NULL, p, lens, fmts, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s", PQerrorMessage(f->conn));
    char sid[64];
    snprintf(sid, sizeof sid, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    assert_int_equal(qint(f->conn, "SELECT coalesce(pg_stat_get_xact_function_calls('"
                                   "obx._enqueue_sql(text, text, text, bigint, text, bytea, text, "
                                   "text, text, text, text, timestamptz, timestamptz)'"
                                   "::regprocedure), 0)"),
                     plsql);
    exec_ok(f->conn, "COMMIT");
    int64_t t1 = obx__wall_ms();
    OK(obx_event_id_check(sid));
    int64_t idt = obx__ulid_time(sid + 4);
    assert_true(idt >= t0 - 5 && idt <= t1 + 5);

    obx__rows rows = {0};
    const char *ids[2] = {rc.event_id, sid};
    OK(obx__st_load_events(f->s, ids, 2, OBX__LOAD_PAYLOAD, &rows));
    assert_int_equal(rows.n, 2);
    obx__event_row *c = &rows.v[0], *s = &rows.v[1];
    assert_string_equal(s->env.event_id, sid);
    /* the same frozen destination */
    assert_string_equal(s->dest_digest, c->dest_digest);
    assert_string_equal(s->dest_digest, rc.dest_digest);
    assert_string_equal(s->dest.routing_key, "tenant-7/order.created.v2/order/o-ü {tenant}");
    assert_string_equal(s->dest.routing_key, c->dest.routing_key);
    assert_string_equal(s->dest.algorithm, "fnv1a");
    assert_int_equal(s->dest.route_gen, c->dest.route_gen);
    /* the same envelope fields but identity */
    assert_string_equal(s->env.payload_digest, c->env.payload_digest);
    assert_string_equal(s->env.payload_schema, c->env.payload_schema);
    assert_int_equal(s->env.occurred_at, 1700000000001);
    assert_int_equal(s->env.occurred_at, c->env.occurred_at);
    assert_int_equal(s->env.aggregate_version, 42);
    assert_string_equal(s->env.traceparent, ev.traceparent);
    assert_string_equal(s->env.idempotency_key, key ? key : "");
    assert_int_equal(s->payload_len, 10);
    assert_memory_equal(s->payload, ev.payload, 10);
    /* the same protocol row */
    assert_int_equal(s->state, OBX__ST_PENDING);
    assert_int_equal(s->claim_gen, 0);
    assert_int_equal(s->pinned_partition, -1);
    assert_int_equal(s->max_attempts, 5);
    assert_true(s->unordered);
    assert_string_equal(s->alias, "orders-relay");
    assert_true(s->committed_at >= t0 && s->committed_at <= t1);
    assert_int_equal(s->available_at, s->committed_at);
    /* digests recomputed by the C code from the stored fields */
    char d[OBX_DIGEST_LEN + 1];
    for (int k = 0; k < 2; k++) {
        OK(obx__dest_digest(&rows.v[k].dest, d));
        assert_string_equal(d, rows.v[k].dest_digest);
        OK(obx__envelope_digest(&rows.v[k].env, d));
        assert_string_equal(d, rows.v[k].envelope_digest);
        OK(obx_sha256_digest(rows.v[k].payload, rows.v[k].payload_len, d));
        assert_string_equal(d, rows.v[k].env.payload_digest);
    }
    /* both created_txid are transaction IDs of this server */
    assert_true(strtoll(s->env.created_txid, NULL, 10) > 0);
    assert_true(strtoll(c->env.created_txid, NULL, 10) > 0);
    obx__rows_free(&rows);
    /* the SQL function wrote the audit row and the statistics */
    obx__audit_row *au;
    size_t n;
    OK(f->s->m->load_audit(f->s, sid, &au, &n));
    assert_int_equal(n, 1);
    assert_int_equal(au[0].actor, OBX__ACT_PRODUCER);
    assert_int_equal(au[0].to, OBX__ST_PENDING);
    assert_string_equal(au[0].who, "postgres");
    free(au);
    obx__store_stats st;
    OK(f->s->m->read->stats(f->s, &st));
    assert_int_equal(st.by_state[OBX__ST_PENDING], 2);
}

/* `obx init` on this server (the obx_pg extension installed by scripts/test.sh) points
 * obx.enqueue() at the extension's C body: the suite fails, never skips, without it. */
static void assert_enqueue_impl(PGconn *c, const char *impl) {
    char sql[160];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM obx.obx_meta WHERE key = 'enqueue_impl' AND value = '%s'", impl);
    if (qint(c, sql) != 1) fail_msg("obx.enqueue() does not run its %s body", impl);
}

/* The three ways into an enqueue give the C path's rows: obx.enqueue() without a key (the
 * extension's fast path), with one (handed to obx._enqueue_sql()), and obx._enqueue_sql()
 * itself, the body of a database without the extension. */
static void test_sql_enqueue_matches_c(void **state) {
    fx *f = *state;
    assert_enqueue_impl(f->conn, "c");
    sql_enqueue_matches_c(f, "obx.enqueue", NULL, 0);
}

static void test_sql_enqueue_key_matches_c(void **state) {
    sql_enqueue_matches_c(*state, "obx.enqueue", "k-sql", 1);
}

static void test_sql_body_matches_c(void **state) {
    sql_enqueue_matches_c(*state, "obx._enqueue_sql", NULL, 1);
}

/* obx.enqueue(..., not_before => ...) agrees with obx_enqueue()'s not_before_ms, through
 * fn (the door, whose body is C where the server has obx_pg, or the PL/pgSQL body itself):
 * the frozen not_before and available_at, the envelope digest the C code computes (covering
 * not_before), none without it; a time over the maximum delay refused naming not_before_ms,
 * nothing written; delivery-set slots keep the delay. */
static int64_t route_topic(const char *url, const char *topic, obx_route_target *t, size_t n);
static void sql_enqueue_delay(fx *f, const char *fn, int plsql) {
    route_topic(f->url, "orders", NULL, 0);
    char sql[512], id[3][64];
    int64_t at = obx__wall_ms() + 3000;
    exec_ok(f->conn, "BEGIN");
    exec_ok(f->conn, "SET LOCAL track_functions = 'pl'");
    for (int i = 0; i < 3; i++) {
        if (i == 2) { /* a delivery set: obx._enqueue_sql() writes its slots */
            exec_ok(f->conn, "COMMIT");
            obx_route_target t = {.cluster = "local", .topic = "orders-copy"};
            route_topic(f->url, "orders", &t, 1);
        }
        snprintf(sql, sizeof sql,
                 "SELECT %s('order.created.v2', 'order', 'o-%d', 1, 'tenant-7', '\\x7b7d', "
                 "not_before => %s)",
                 fn, i, i == 1 ? "NULL" : "'epoch'::timestamptz + $1::bigint * interval '1 ms'");
        char atv[32];
        snprintf(atv, sizeof atv, "%lld", (long long)at);
        const char *p[1] = {atv};
        PGresult *r = PQexecParams(f->conn, sql, i == 1 ? 0 : 1, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s", PQerrorMessage(f->conn));
        snprintf(id[i], 64, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        if (i == 1) /* the C body wrote both without handing them to the PL/pgSQL one */
            assert_int_equal(qint(f->conn, "SELECT coalesce(pg_stat_get_xact_function_calls('"
                                           "obx._enqueue_sql(text, text, text, bigint, text, "
                                           "bytea, text, text, text, text, text, timestamptz, "
                                           "timestamptz)'::regprocedure), 0)"),
                             plsql ? 2 : 0);
    }
    for (int i = 0; i < 3; i++) {
        obx__rows rows = {0};
        const char *ids[1] = {id[i]};
        OK(obx__st_load_events(f->s, ids, 1, 0, &rows));
        assert_int_equal(rows.n, 1);
        obx__event_row *e = &rows.v[0];
        char d[OBX_DIGEST_LEN + 1];
        OK(obx__envelope_digest(&e->env, d));
        assert_string_equal(e->envelope_digest, d);
        assert_int_equal(e->env.not_before, i == 1 ? 0 : at);
        assert_int_equal(e->available_at, i == 1 ? e->committed_at : at);
        obx__rows_free(&rows);
    }
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event e JOIN "
                                   "obx.obx_delivery_target t ON t.slot_id = e.event_id "
                                   "JOIN obx.obx_envelope v ON v.event_id = e.event_id "
                                   "WHERE t.target_no = 2 AND e.available_at = v.not_before "
                                   "AND v.not_before > 0"),
                     1);
    int64_t before = qint(f->conn, "SELECT count(*) FROM obx.obx_event");
    snprintf(sql, sizeof sql,
             "SELECT %s('order.created.v2', 'order', 'o-9', 1, 'tenant-7', '\\x7b7d', "
             "not_before => now() + interval '367 days')",
             fn);
    PGresult *r = PQexec(f->conn, sql);
    assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
    assert_non_null(strstr(PQerrorMessage(f->conn), "not_before_ms"));
    assert_non_null(strstr(PQerrorMessage(f->conn), "maximum delay"));
    PQclear(r);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), before);
}

static void test_sql_enqueue_delay(void **state) {
    fx *f = *state;
    assert_enqueue_impl(f->conn, "c");
    sql_enqueue_delay(f, "obx.enqueue", 0);
}

static void test_sql_body_delay(void **state) { sql_enqueue_delay(*state, "obx._enqueue_sql", 1); }

/* obx.enqueue() of one order.created.v2 event without a key on c; its ID into id */
static void sql_enqueue_id(PGconn *c, const char *aggregate_id, char id[64]) {
    const char *p[1] = {aggregate_id};
    PGresult *r = PQexecParams(c,
                               "SELECT obx.enqueue('order.created.v2', 'order', $1, 1, "
                               "'tenant-7', '\\x7b7d')",
                               1, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s", PQerrorMessage(c));
    snprintf(id, 64, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
}

/* A route as a new generation of order.created.v2, through a handle of its own */
static int64_t route_topic(const char *url, const char *topic, obx_route_target *t, size_t n) {
    obx_store *own;
    OK(obx_store_open(url, &own));
    obx_route rt = {.event_type = "order.created.v2",
                    .cluster = "local",
                    .topic = topic,
                    .targets = t,
                    .n_targets = n,
                    .completion = n ? "all" : NULL};
    int64_t gen;
    OK(obx_route_set(own, &rt, &gen));
    obx_store_close(own);
    return gen;
}

/* obx's schema dropped and made again (obx init on a connection of its own), under the
 * fixture's live handles: no routes, generations numbered from 1 again, new type OIDs. */
static void remake_schema(fx *f) {
    exec_ok(f->conn, "SET client_min_messages = warning"); /* the cascade's NOTICE */
    exec_ok(f->conn, "DROP SCHEMA obx CASCADE");
    exec_ok(f->conn, "RESET client_min_messages");
    obx_store *own;
    OK(obx_store_open(f->url, &own));
    OK(obx_store_init(own));
    obx_store_close(own);
}

/* The schema dropped and made again under a live handle numbers its routes from 1 again: the
 * handle's cached generation 1 (topic orders) must not stand for the new table's generation 1
 * (topic orders-new). Before the write compared the route table's OID too, r-3 went to orders. */
static void test_enqueue_route_schema_remade(void **state) {
    fx *f = *state;
    char id[3][31];
    OK(business_enqueue(f, "r-1", NULL, id[0], NULL)); /* reads and caches generation 1 */
    OK(business_enqueue(f, "r-2", NULL, id[1], NULL));
    assert_int_equal(runs_of(f->conn, TRY_TRIP), 1);
    check_enqueued(f, id[1], "r-2", "orders");
    remake_schema(f);
    assert_int_equal(route_topic(f->url, "orders-new", NULL, 0), 1);
    OK(business_enqueue(f, "r-3", NULL, id[2], NULL));
    check_enqueued(f, id[2], "r-3", "orders-new");
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope WHERE dest_topic = "
                                   "'orders-new' AND dest_route_gen = 1"),
                     1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope"), 1);
}

/* obx.enqueue()'s C body keeps the route generations it read, per session (obx_pg.c): the next
 * call on the same session sees a new generation, one with a delivery set (whose further
 * targets obx._enqueue_sql() writes), and a schema made again whose generations are numbered
 * from 1 again (the cached generation 3 must not stand for the new schema's generation 3). */
static void test_sql_enqueue_route_changes(void **state) {
    fx *f = *state;
    assert_enqueue_impl(f->conn, "c");
    char id[64];
    sql_enqueue_id(f->conn, "o-r1", id); /* setup's generation 1: topic orders */
    assert_string_equal(load1(f->s, id, 0).dest.topic, "orders");
    obx_route_target t[] = {{.cluster = "eu", .topic = "orders-eu"}};
    int64_t gen = route_topic(f->url, "orders-2", t, 1);
    sql_enqueue_id(f->conn, "o-r2", id);
    obx__delivery_row d;
    OK(f->s->m->delivery_get(f->s, id, &d));
    assert_int_equal(d.n, 2);
    assert_int_equal(d.route_gen, gen);
    assert_int_equal(route_topic(f->url, "orders-3", NULL, 0), 3);
    sql_enqueue_id(f->conn, "o-r3", id);
    obx__event_row e = load1(f->s, id, 0);
    assert_string_equal(e.dest.topic, "orders-3");
    assert_int_equal(e.dest.route_gen, 3);
    /* the schema made again, on the same session: generations 1-3 again */
    remake_schema(f);
    route_topic(f->url, "a", NULL, 0);
    route_topic(f->url, "b", NULL, 0);
    assert_int_equal(route_topic(f->url, "orders-new", NULL, 0), 3);
    sql_enqueue_id(f->conn, "o-r4", id);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope WHERE dest_topic = "
                                   "'orders-new' AND dest_route_gen = 3"),
                     1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope"), 1);
}

#define ENQ_SIG                                                                                    \
    "obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, text, text, "            \
    "timestamptz, timestamptz)"

/* A role named f->db + suffix (into role) that owns obx.enqueue() and may run init's choice of
 * its body, but may neither create nor alter the obx_pg extension. */
static void enqueue_owner_role(fx *f, const char *suffix, char *role, size_t n) {
    char sql[512];
    snprintf(role, n, "%s_%s", f->db, suffix);
    const char *const grants[] = {"CREATE ROLE %s", "GRANT USAGE, CREATE ON SCHEMA obx TO %s",
                                  "GRANT SELECT, INSERT, UPDATE ON obx.obx_meta TO %s",
                                  "GRANT EXECUTE ON FUNCTION obx._point_enqueue(boolean) TO %s",
                                  "ALTER FUNCTION " ENQ_SIG " OWNER TO %s"};
    for (size_t i = 0; i < sizeof grants / sizeof grants[0]; i++) {
        snprintf(sql, sizeof sql, grants[i], role);
        exec_ok(f->conn, sql);
    }
}

static void drop_role(fx *f, const char *role) {
    char sql[256];
    snprintf(sql, sizeof sql, "DROP OWNED BY %s", role);
    exec_ok(f->conn, sql);
    snprintf(sql, sizeof sql, "DROP ROLE %s", role);
    exec_ok(f->conn, sql);
}

/* Where `obx init` may not create the obx_pg extension (a trusted extension needs CREATE on the
 * database), obx.enqueue() runs its PL/pgSQL body, with the same rows; the next init by a user
 * who may create it points obx.enqueue() at the C body again. */
static void test_enqueue_without_extension(void **state) {
    fx *f = *state;
    char role[96], sql[512];
    enqueue_owner_role(f, "noext", role, sizeof role);
    exec_ok(f->conn, "DROP EXTENSION obx_pg");
    snprintf(sql, sizeof sql, "SET ROLE %s", role);
    exec_ok(f->conn, sql);
    OK(obx_store_init(f->s)); /* CREATE EXTENSION refused: the PL/pgSQL body */
    exec_ok(f->conn, "RESET ROLE");
    assert_enqueue_impl(f->conn, "sql");
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM pg_extension WHERE extname = 'obx_pg'"),
                     0);
    char body[320];
    OK(obx_store_producer_body(f->s, body, sizeof body));
    if (!strstr(body, "PL/pgSQL body: this init could not create the obx_pg extension"))
        fail_msg("producer body: %s", body);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM pg_proc WHERE oid = '" ENQ_SIG
                                   "'::regprocedure AND prosrc LIKE '%obx._enqueue_sql(%'"),
                     1);
    exec_ok(f->conn, "ALTER FUNCTION " ENQ_SIG " OWNER TO CURRENT_USER");
    sql_enqueue_matches_c(f, "obx.enqueue", NULL, 1);
    OK(obx_store_init(f->s)); /* a superuser's init: the C body again */
    assert_enqueue_impl(f->conn, "c");
    /* an init that changes nothing writes nothing (the row version stays; it was rewritten on
     * every init before) */
    const char *ver = "SELECT xmin::text::bigint FROM obx.obx_meta WHERE key = 'enqueue_impl'";
    long long xmin = qint(f->conn, ver);
    OK(obx_store_init(f->s));
    assert_int_equal(qint(f->conn, ver), xmin);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM pg_proc WHERE oid = '" ENQ_SIG
                                   "'::regprocedure AND prosrc LIKE '%obx._enqueue_c(%'"),
                     1);
    drop_role(f, role);
}

/* A database whose obx_pg extension is at another version than this obx's (after an upgrade of
 * obx, the version of the schema it was made with; here a made-up version 0, whose library is
 * not on this server: the catalog is edited as a superuser, since no other version exists
 * before a release). An init by a user who may not update the extension points obx.enqueue()
 * at its PL/pgSQL body and says why; an init that may, but finds no update path to this version
 * on the server, does the same rather than fail or call the other version's library; once the
 * extension of this version can be created, init uses it and its library. */
static void test_extension_versions(void **state) {
    fx *f = *state;
    char sql[512];
    exec_ok(f->conn, "UPDATE pg_extension SET extversion = '0' WHERE extname = 'obx_pg'");
    exec_ok(f->conn, "UPDATE pg_proc SET probin = '$libdir/obx_pg_v0_gone' WHERE oid = "
                     "'obx._enqueue_c(text, text, text, bigint, text, bytea, text, text, text, "
                     "text, text, timestamptz, timestamptz)'::regprocedure");
    exec_ok(f->conn, "SELECT obx._point_enqueue(true)");
    /* an init by a user who may not update the extension: the PL/pgSQL body, version 0 left */
    char role[96];
    enqueue_owner_role(f, "oldext", role, sizeof role);
    snprintf(sql, sizeof sql, "SET ROLE %s", role);
    exec_ok(f->conn, sql);
    OK(obx_store_init(f->s));
    exec_ok(f->conn, "RESET ROLE");
    assert_enqueue_impl(f->conn, "sql");
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM pg_extension WHERE extname = 'obx_pg' "
                                   "AND extversion = '0'"),
                     1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM pg_proc WHERE oid = '" ENQ_SIG
                                   "'::regprocedure AND prosrc LIKE '%obx._enqueue_sql(%'"),
                     1);
    char body[320];
    OK(obx_store_producer_body(f->s, body, sizeof body));
    if (!strstr(body, "PL/pgSQL body: the database's obx_pg is version 0 and this init could not "
                      "update it"))
        fail_msg("producer body: %s", body);
    exec_ok(f->conn, "ALTER FUNCTION " ENQ_SIG " OWNER TO CURRENT_USER");
    drop_role(f, role);
    /* a superuser's init: no update from version 0 on this server, so the PL/pgSQL body still,
     * and the SQL producer works without the other version's library (rolled back) */
    OK(obx_store_init(f->s));
    assert_enqueue_impl(f->conn, "sql");
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM pg_extension WHERE extname = 'obx_pg' "
                                   "AND extversion = '0'"),
                     1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM pg_proc WHERE oid = '" ENQ_SIG
                                   "'::regprocedure AND prosrc LIKE '%obx._enqueue_sql(%'"),
                     1);
    exec_ok(f->conn, "BEGIN");
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'o-v0', 1, 'tenant-7', "
                     "'\\x7b7d')");
    exec_ok(f->conn, "ROLLBACK");
    /* the extension of this version: its library, the C body */
    exec_ok(f->conn, "DROP EXTENSION obx_pg");
    OK(obx_store_init(f->s));
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_extension WHERE extname = 'obx_pg' AND extversion = '%d'",
             OBX__SCHEMA_VERSION);
    assert_int_equal(qint(f->conn, sql), 1);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_proc WHERE proname = '_enqueue_c' AND probin = "
             "'$libdir/obx_pg-%d'",
             OBX__SCHEMA_VERSION);
    assert_int_equal(qint(f->conn, sql), 1);
    assert_enqueue_impl(f->conn, "c");
    OK(obx_store_producer_body(f->s, body, sizeof body));
    snprintf(sql, sizeof sql, "obx.enqueue() runs in C (the obx_pg extension, version %d)",
             OBX__SCHEMA_VERSION);
    assert_string_equal(body, sql);
    /* the C body answers again, with the C producer's rows */
    sql_enqueue_matches_c(f, "obx.enqueue", NULL, 0);
}

/* Each bad input is refused by the C path and by obx.enqueue() with the same message, and
 * leaves nothing behind. */
static void test_sql_validation_parity(void **state) {
    fx *f = *state;
    char big[OBX_KEY_MAX + 10];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    unsigned char *pbig = calloc(1, OBX_PAYLOAD_DEFAULT_LIMIT + 1);
    assert_non_null(pbig);
    static const struct {
        const char *field;
        const char *value; /* "@BIG" = 264 bytes, "@NULL" = NULL */
        obx_err code;
        const char *sqlstate;
    } cases[] = {
        {"event_type", "@NULL", OBX_EINVAL, "OB002"},
        {"event_type", "order.created", OBX_EINVAL, "OB002"},
        {"event_type", "Order.created.v2", OBX_EINVAL, "OB002"},
        {"event_type", "unknown.type.v1", OBX_ENOROUTE, "OB004"},
        {"aggregate_type", "", OBX_EINVAL, "OB002"},
        {"aggregate_id", "@BIG", OBX_ETOOBIG, "OB003"},
        {"tenant", "tenant 7", OBX_EINVAL, "OB002"},
        {"tenant", "t'; DROP TABLE obx.obx_event;--", OBX_EINVAL, "OB002"},
        {"tenant", "tënant", OBX_EINVAL, "OB002"},
        {"tenant", "@BIG", OBX_ETOOBIG, "OB003"},
        {"payload", "", OBX_EINVAL, "OB002"},
        {"payload", "@BIG", OBX_ETOOBIG, "OB003"},
        {"correlation_id", "c\x01", OBX_EINVAL, "OB002"},
        {"causation_id", "c\x7f", OBX_EINVAL, "OB002"},
        {"traceparent", "00-xyz", OBX_EINVAL, "OB002"},
        /* obx.enqueue() checks these forms without anchored bounded patterns: 55 bytes with
         * a dash out of place, upper-case hex, a version without digits */
        {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", OBX_EINVAL,
         "OB002"},
        {"traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", OBX_EINVAL,
         "OB002"},
        {"event_type", "order.created.v", OBX_EINVAL, "OB002"},
        {"event_type", "order.v2.created", OBX_EINVAL, "OB002"},
        {"payload_schema", "md5:abc", OBX_EINVAL, "OB002"},
        {"payload_schema",
         "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855", OBX_EINVAL,
         "OB002"},
        {"aggregate_version", "-1", OBX_EINVAL, "OB002"},
        {"idempotency_key", "@BIG", OBX_ETOOBIG, "OB003"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *val = cases[k].value;
        bool is_big = !strcmp(val, "@BIG"), is_null = !strcmp(val, "@NULL");
        if (is_big) val = big;
        if (is_null) val = NULL;
        obx_event ev = order_event("o-b", "{}");
        const char *p[10] = {ev.event_type, ev.aggregate_type, ev.aggregate_id,
                             "1",           ev.tenant,         "{}",
                             NULL,          ev.correlation_id, NULL,
                             NULL};
        int lens[10] = {0, 0, 0, 0, 0, 2, 0, 0, 0, 0}, fmts[10] = {0, 0, 0, 0, 0, 1, 0, 0, 0, 0};
        const char *field = cases[k].field;
        if (!strcmp(field, "event_type")) ev.event_type = p[0] = val;
        if (!strcmp(field, "aggregate_type")) ev.aggregate_type = p[1] = val;
        if (!strcmp(field, "aggregate_id")) ev.aggregate_id = p[2] = val;
        if (!strcmp(field, "aggregate_version")) {
            ev.aggregate_version = -1;
            p[3] = "-1";
        }
        if (!strcmp(field, "tenant")) ev.tenant = p[4] = val;
        if (!strcmp(field, "payload")) {
            ev.payload = is_big ? (const void *)pbig : "";
            ev.payload_len = is_big ? OBX_PAYLOAD_DEFAULT_LIMIT + 1 : 0;
            p[5] = is_big ? (const char *)pbig : "";
            lens[5] = (int)ev.payload_len;
        }
        if (!strcmp(field, "payload_schema")) ev.payload_schema = p[6] = val;
        if (!strcmp(field, "correlation_id")) ev.correlation_id = p[7] = val;
        if (!strcmp(field, "causation_id")) ev.causation_id = p[8] = val;
        if (!strcmp(field, "traceparent")) ev.traceparent = p[9] = val;
        if (!strcmp(field, "idempotency_key")) ev.idempotency_key = val;
        obx_enqueue_result res;
        obx_err e = obx_enqueue(f->s, &ev, &res);
        char cmsg[1024];
        snprintf(cmsg, sizeof cmsg, "%s", obx_errmsg());
        if (e != cases[k].code)
            fail_msg("case %zu (C): %s '%s', expected %s", k, obx_errname(e), cmsg,
                     obx_errname(cases[k].code));
        const char *p11[11];
        int l11[11], f11[11];
        for (int i = 0; i < 10; i++) {
            p11[i] = p[i];
            l11[i] = lens[i];
            f11[i] = fmts[i];
        }
        p11[10] = ev.idempotency_key;
        l11[10] = f11[10] = 0;
        /* obx.enqueue() (the obx_pg extension's body on this server, which refuses nothing
         * itself) and the PL/pgSQL body */
        for (int b = 0; b < 2; b++) {
            PGresult *r = PQexecParams(f->conn,
                                       b ? "SELECT obx._enqueue_sql($1, $2, $3, $4::bigint, $5, "
                                           "$6::bytea, $7, $8, $9, $10, $11)"
                                         : "SELECT obx.enqueue($1, $2, $3, $4::bigint, $5, "
                                           "$6::bytea, $7, $8, $9, $10, $11)",
                                       11, NULL, p11, l11, f11, 0);
            const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
            const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
            if (!st || strcmp(st, cases[k].sqlstate) || !m || strcmp(m, cmsg))
                fail_msg("case %zu (SQL, %s): SQLSTATE %s '%s'; C said '%s' (expected %s)", k,
                         b ? "obx._enqueue_sql" : "obx.enqueue", st ? st : "none",
                         m ? m : PQerrorMessage(f->conn), cmsg, cases[k].sqlstate);
            PQclear(r);
        }
        assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 0);
        assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope"), 0);
        assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_audit_all"), 0);
    }
    free(pbig);
    /* the SQL limit follows obx.obx_meta's row payload_limit, as obx_store_set_payload_limit
     * does */
    char st[6], msg[512];
    exec_ok(f->conn, "INSERT INTO obx.obx_meta VALUES ('payload_limit', '4')");
    exec_fail(f->conn,
              "SELECT obx.enqueue('order.created.v2', 'order', 'o', 1, 't', '\\x3132333435')", st,
              msg, sizeof msg);
    assert_string_equal(st, "OB003");
    assert_string_equal(msg, "payload: 5 bytes, over the limit of 4 bytes");
}

/* psql as "another language": a transaction that rolls back leaves nothing, one that commits
 * leaves a PENDING event that a relay's claim finds. */
static int run_psql(const char *url, const char *sql, bool quiet) {
    char path[] = "/tmp/obx-psql-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    FILE *fp = fdopen(fd, "w");
    fputs(sql, fp);
    fclose(fp);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "psql -X -q -v ON_ERROR_STOP=1 -d '%s' -f %s >/dev/null%s", url, path,
             quiet ? " 2>&1" : "");
    int rc = system(cmd);
    unlink(path);
    return rc;
}

static void test_psql_producer(void **state) {
    fx *f = *state;
    assert_int_equal(run_psql(f->url,
                              "BEGIN;\n"
                              "INSERT INTO orders VALUES ('o-p', 5);\n"
                              "SELECT obx.enqueue('order.created.v2', 'order', 'o-p', 1, "
                              "'tenant-7', convert_to('{\"o\":\"p\"}', 'UTF8'));\n"
                              "ROLLBACK;\n",
                              false),
                     0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders"), 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_envelope"), 0);
    assert_int_equal(run_psql(f->url,
                              "BEGIN;\n"
                              "INSERT INTO orders VALUES ('o-p', 5);\n"
                              "SELECT obx.enqueue(event_type => 'order.created.v2', "
                              "aggregate_type => 'order', aggregate_id => 'o-p', "
                              "aggregate_version => 1, tenant => 'tenant-7', "
                              "payload => convert_to('{\"o\":\"p\"}', 'UTF8'), "
                              "correlation_id => 'psql-1');\n"
                              "COMMIT;\n",
                              false),
                     0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM orders"), 1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event WHERE state = 'PENDING' "
                                   "AND correlation_id = 'psql-1'"),
                     1);
    obx__claim_req req = {.now = obx__wall_ms() + 1000, .limit = 10};
    obx__rows rows = {0};
    OK(obx__st_begin(f->s));
    OK(obx__st_read_events(f->s, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &rows));
    OK(obx__st_commit(f->s));
    assert_int_equal(rows.n, 1);
    assert_int_equal(rows.v[0].payload_len, 9);
    assert_memory_equal(rows.v[0].payload, "{\"o\":\"p\"}", 9);
    obx__rows_free(&rows);
    /* a refused input is a psql error naming the field */
    assert_true(run_psql(f->url,
                         "SELECT obx.enqueue('order.created.v2', 'order', 'o-q', 1, "
                         "'bad tenant', '\\x00');\n",
                         true) != 0);
}

/* A login role <prefix>_<kind>_login in the role <prefix>_<kind> that obx.create_roles made,
 * created through the owner's connection c; the URL of database db as that login into
 * url[1300]. */
static void login_role(PGconn *c, const char *db, const char *prefix, const char *kind, char *url) {
    char sql[256], extra[128];
    snprintf(sql, sizeof sql, "CREATE ROLE %s_%s_login LOGIN IN ROLE %s_%s", prefix, kind, prefix,
             kind);
    exec_ok(c, sql);
    snprintf(extra, sizeof extra, "user=%s_%s_login", prefix, kind);
    db_url(db, extra, url, 1300);
}

/* ---- roles ------------------------------------------------------------------------------------
 */

static void test_roles(void **state) {
    fx *f = *state;
    char pre[32], sql[512];
    snprintf(pre, sizeof pre, "obxt%d", (int)getpid());
    assert_int_equal(obx_store_create_roles(f->s, "Bad-Prefix"), OBX_EINVAL);
    /* `obx init --roles` on an initialized database */
    char cmd[1600], out[1024] = "";
    snprintf(cmd, sizeof cmd, "%s init --db '%s' --roles %s 2>&1", OBX_BIN, f->url, pre);
    FILE *pp = popen(cmd, "r");
    assert_non_null(pp);
    size_t got = fread(out, 1, sizeof out - 1, pp);
    out[got] = '\0';
    assert_int_equal(pclose(pp), 0);
    assert_non_null(strstr(out, "is current"));
    assert_non_null(strstr(out, "obx.enqueue() runs in C (the obx_pg extension, version"));
    assert_non_null(strstr(out, "_producer"));
    OK(obx_store_create_roles(f->s, pre)); /* idempotent */
    const char *kinds[] = {"producer", "relay", "auditor"};
    char urls[3][1300];
    for (int i = 0; i < 3; i++) login_role(f->conn, f->db, pre, kinds[i], urls[i]);
    char st[6], msg[512];
    /* producer: enqueue through the function, read its own events, nothing else */
    obx_event ev = order_event("o-r", "{}");
    obx_enqueue_result other;
    OK(obx_enqueue(f->s, &ev, &other)); /* somebody else's event */
    PGconn *p = connect_url(urls[0]);
    PGresult *r = PQexec(p, "SELECT obx.enqueue('order.created.v2', 'order', 'o-r', 2, "
                            "'tenant-7', '\\x7b7d')");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("producer enqueue: %s", PQerrorMessage(p));
    char mine[64];
    snprintf(mine, sizeof mine, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    r = PQexec(p, "SELECT event_id, state FROM obx.producer_events");
    assert_int_equal(PQntuples(r), 1);
    assert_string_equal(PQgetvalue(r, 0, 0), mine);
    assert_string_equal(PQgetvalue(r, 0, 1), "PENDING");
    PQclear(r);
    const char *producer_denied[] = {
        "UPDATE obx.obx_event SET state = 'PUBLISHED'",
        "SELECT count(*) FROM obx.obx_envelope",
        "SELECT count(*) FROM obx.obx_event",
        "INSERT INTO obx.obx_audit (at, actor, who, event_id, envelope_gen, from_state, to_state, "
        "claim_gen, attempt_id, attempt_gen, reason) VALUES (1, 'x', 'x', 'x', 1, 'x', 'x', 0, "
        "'', 0, '')",
        "SELECT obx.create_roles('evil')",
        "SELECT obx._event_id(1)",
    };
    for (size_t i = 0; i < sizeof producer_denied / sizeof producer_denied[0]; i++) {
        exec_fail(p, producer_denied[i], st, msg, sizeof msg);
        if (strcmp(st, "42501"))
            fail_msg("producer: '%s': SQLSTATE '%s' (%s)", producer_denied[i], st, msg);
    }
    PQfinish(p);
    /* relay: the store API works for claims, attempts, receipts, audit and statistics */
    obx_store *rs = NULL;
    OK(obx_store_open(urls[1], &rs));
    int found = 0;
    OK(obx_store_schema_version(rs, &found, NULL));
    assert_int_equal(found, OBX__SCHEMA_VERSION);
    obx__claim_req req = {.now = obx__wall_ms() + 1000, .limit = 10};
    obx__rows rows = {0};
    OK(obx__st_begin(rs));
    OK(obx__st_read_events(rs, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &rows));
    assert_true(rows.n >= 1);
    obx__event_row row = rows.v[0];
    row.payload = NULL;
    row.state = OBX__ST_CLAIMED;
    row.claim_gen++;
    obx__strlcpy(row.owner, "relay-1", sizeof row.owner);
    obx__event_update u = {&row, OBX__ST_PENDING, 0};
    bool applied = false;
    OK(obx__st_update_events(rs, &u, 1, &applied));
    assert_true(applied);
    obx__audit_row au = {.at = 1,
                         .actor = OBX__ACT_DISPATCHER,
                         .from = OBX__ST_PENDING,
                         .to = OBX__ST_CLAIMED,
                         .envelope_gen = 1,
                         .claim_gen = 1};
    strcpy(au.event_id, row.env.event_id);
    strcpy(au.who, "relay-1");
    OK(obx__st_insert_audit(rs, &au, 1));
    obx__attempt_row at = {.envelope_gen = 1,
                           .attempt_gen = 1,
                           .claim_gen = 1,
                           .state = OBX__AT_SENDING,
                           .offset_before = -1};
    strcpy(at.attempt_id, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G");
    strcpy(at.event_id, row.env.event_id);
    strcpy(at.owner, "relay-1");
    strcpy(at.dest_digest, row.dest_digest);
    OK(obx__st_insert_attempts(rs, &at, 1));
    at.state = OBX__AT_UNKNOWN;
    OK(obx__st_update_attempts(rs, &at, 1));
    OK(obx__st_counter_add(rs, "alarms", 1));
    OK(obx__st_commit(rs));
    obx__rows_free(&rows);
    obx__store_stats sst;
    OK(rs->m->read->stats(rs, &sst));
    assert_int_equal(sst.by_state[OBX__ST_CLAIMED], 1);
    obx_store_close(rs);
    PGconn *rc = connect_url(urls[1]);
    const char *relay_denied[] = {
        "UPDATE obx.obx_envelope SET dest_topic = 'elsewhere'",
        "UPDATE obx.obx_envelope SET payload_digest = 'sha256:0'",
        "UPDATE obx.obx_event SET event_id = 'evt-x'",
        "DELETE FROM obx.obx_event",
        "DELETE FROM obx.obx_receipt",
        "UPDATE obx.obx_attempt SET owner = 'x'",
        "INSERT INTO obx.obx_route (event_type, cluster, topic, routing_key, algorithm, "
        "serializer, durability, required_acks, max_attempts, blind_retry, unordered, alias, "
        "created_at) VALUES ('a.v1', 'c', 't', 'k', 'murmur2', 'raw', 'persistent', 'all', 1, "
        "false, false, 'obx', 1)",
        "TRUNCATE obx.obx_audit",
    };
    for (size_t i = 0; i < sizeof relay_denied / sizeof relay_denied[0]; i++) {
        exec_fail(rc, relay_denied[i], st, msg, sizeof msg);
        if (strcmp(st, "42501"))
            fail_msg("relay: '%s': SQLSTATE '%s' (%s)", relay_denied[i], st, msg);
    }
    /* a purge may drop a payload; the trigger still guards the rest */
    exec_ok(rc, "UPDATE obx.obx_envelope SET payload = NULL WHERE false");
    exec_fail(rc, "UPDATE obx.obx_envelope SET payload = '\\x01'", st, msg, sizeof msg);
    assert_string_equal(st, "OB001");
    PQfinish(rc);
    /* auditor: reads everything, writes nothing */
    PGconn *a = connect_url(urls[2]);
    assert_true(qint(a, "SELECT count(*) FROM obx.obx_event") >= 2);
    assert_true(qint(a, "SELECT count(*) FROM obx.obx_audit_all") >= 2);
    qint(a, "SELECT count(*) FROM obx.obx_stat_delta");
    const char *auditor_denied[] = {
        "UPDATE obx.obx_event SET updated_at = 0",
        "INSERT INTO obx.obx_counter VALUES ('x', 1)",
        "DELETE FROM obx.obx_audit",
        "SELECT obx.enqueue('order.created.v2', 'order', 'o-a', 1, 'tenant-7', '\\x7b7d')",
        "SELECT * FROM obx.obx_event FOR UPDATE",
    };
    for (size_t i = 0; i < sizeof auditor_denied / sizeof auditor_denied[0]; i++) {
        exec_fail(a, auditor_denied[i], st, msg, sizeof msg);
        if (strcmp(st, "42501"))
            fail_msg("auditor: '%s': SQLSTATE '%s' (%s)", auditor_denied[i], st, msg);
    }
    PQfinish(a);
    obx_store *as = NULL;
    OK(obx_store_open(urls[2], &as));
    OK(as->m->read->stats(as, &sst));
    assert_int_equal(sst.by_state[OBX__ST_PENDING], 1);
    obx_store_close(as);
    /* SQLite has no roles */
    obx_store *sq;
    OK(obx_store_open("sqlite::memory:", &sq));
    assert_int_equal(obx_store_create_roles(sq, "x"), OBX_EUNSUPPORTED);
    obx_store_close(sq);
    /* the database goes first (it holds the grants), then the roles */
    char dropdb[128];
    snprintf(dropdb, sizeof dropdb, "DROP DATABASE IF EXISTS %s WITH (FORCE)", f->db);
    obx_store_close(f->s);
    f->s = NULL;
    PQfinish(f->conn);
    f->conn = PQconnectdb(base_url);
    admin_exec(dropdb);
    for (int i = 0; i < 3; i++) {
        snprintf(sql, sizeof sql, "DROP ROLE %s_%s_login, %s_%s", pre, kinds[i], pre, kinds[i]);
        admin_exec(sql);
    }
}

/* ---- NOTIFY ------------------------------------------------------------------------------------
 */

typedef struct waiter {
    obx__store *s;
    int timeout;
    bool with_fd; /* also_fd = fd; else -1 */
    int fd;
    bool notified;
    obx_err err;
    int64_t woke_at;
} waiter;

static void *wait_thread(void *p) {
    waiter *w = p;
    w->err = w->s->m->wait_for_work(w->s, w->timeout, w->with_fd ? w->fd : -1, &w->notified);
    w->woke_at = obx__mono_ms();
    return NULL;
}

/* A relay connection's claim for cluster "local" (limit events at most, rolled back): from
 * now on it waits on that cluster's wake lock. Returns how many it would have claimed. */
static size_t claim_local(obx_store *relay, size_t limit) {
    obx__claim_req req = {.now = obx__wall_ms(), .limit = limit, .cluster = "local"};
    obx__rows rows = {0};
    OK(obx__st_begin(relay));
    OK(obx__st_read_events(relay, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &rows));
    OK(obx__st_rollback(relay));
    size_t n = rows.n;
    obx__rows_free(&rows);
    return n;
}

/* Whether the session `app` names (application_name) holds cluster "local"'s wake lock, and
 * how (pg_locks: 'ExclusiveLock' for a waiting relay, 'ShareLock' for a producer; "" none). */
static const char *wake_lock_mode(fx *f, const char *app, char *buf, size_t cap) {
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT coalesce((SELECT l.mode FROM pg_locks l JOIN pg_stat_activity a ON a.pid = "
             "l.pid WHERE l.locktype = 'advisory' AND l.classid = 5194330 AND l.objid = "
             "hashtext('local')::oid AND l.objsubid = 2 AND l.granted AND a.application_name = "
             "'%s' LIMIT 1), '')",
             app);
    PGresult *r = PQexec(f->conn, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    snprintf(buf, cap, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return buf;
}

/* Waits until no session holds the wake lock of "local" (a closed relay store's backend may
 * still hold it for a moment: qint_down_to); a test that counts on its absence waits for it to
 * go, as a producer would see it. */
static void wait_wake_lock_free(fx *f) {
    assert_int_equal(qint_down_to(f->conn,
                                  "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                                  "classid = 5194330 AND objid = hashtext('local')::oid AND "
                                  "objsubid = 2 AND mode = 'ExclusiveLock'",
                                  0),
                     0);
}

/* Arms a relay connection: a claim for "local", then its first wait takes the wake lock and
 * returns at once, notified, for the claim that must follow it. */
static void arm_relay(fx *f, obx_store *relay) {
    claim_local(relay, 100);
    bool notified = false;
    OK(relay->m->wait_for_work(relay, 2000, -1, &notified));
    assert_true(notified);
    char mode[32];
    assert_string_equal(wake_lock_mode(f, "obx-relay-wait", mode, sizeof mode), "ExclusiveLock");
}

/* Starts w's wait in a thread, commits an obx.enqueue() of aggregate agg, and checks that the
 * wait ended notified (w->err is the caller's to check). */
static void sql_enqueue_wakes(fx *f, waiter *w, const char *agg) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_thread, w), 0);
    msleep(50);
    char sql[200];
    snprintf(sql, sizeof sql,
             "SELECT obx.enqueue('order.created.v2', 'order', '%s', 1, 'tenant-7', '\\x7b7d')",
             agg);
    exec_ok(f->conn, sql);
    pthread_join(t, NULL);
    assert_true(w->notified);
}

static void test_notify_wakes(void **state) {
    fx *f = *state;
    obx_store *relay = open_own(f, "obx-relay-wait");
    arm_relay(f, relay);
    bool notified = true;
    /* nothing committed: times out */
    int64_t t0 = obx__mono_ms();
    OK(relay->m->wait_for_work(relay, 200, -1, &notified));
    assert_false(notified);
    assert_true(obx__mono_ms() - t0 >= 195);
    /* a commit wakes it within milliseconds */
    waiter w = {.s = relay, .timeout = 5000};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_thread, &w), 0);
    msleep(150);
    exec_ok(f->conn, "BEGIN");
    obx_event ev = order_event("o-n", "{}");
    obx_enqueue_result res;
    OK(obx_enqueue(f->s, &ev, &res));
    msleep(100); /* enqueued, not committed: no wake-up yet */
    int64_t committed = obx__mono_ms();
    exec_ok(f->conn, "COMMIT");
    pthread_join(t, NULL);
    OK(w.err);
    assert_true(w.notified);
    int64_t latency = w.woke_at - committed;
    printf("  NOTIFY wake-up latency after COMMIT: %lld ms\n", (long long)latency);
    assert_true(latency >= 0 && latency < 100);
    /* a rolled-back enqueue wakes nobody */
    w = (waiter){.s = relay, .timeout = 400};
    assert_int_equal(pthread_create(&t, NULL, wait_thread, &w), 0);
    msleep(50);
    exec_ok(f->conn, "BEGIN");
    OK(obx_enqueue(f->s, &ev, &res));
    exec_ok(f->conn, "ROLLBACK");
    pthread_join(t, NULL);
    OK(w.err);
    assert_false(w.notified);
    /* the SQL function wakes it too */
    w = (waiter){.s = relay, .timeout = 5000};
    sql_enqueue_wakes(f, &w, "o-s");
    /* also_fd (a broker's wake_fd, relay.c's idle_wait): a readable descriptor ends the wait
     * at once, unread, not notified; a commit still wakes it while the descriptor is quiet */
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    assert_int_equal(write(pfd[1], "1", 1), 1);
    t0 = obx__mono_ms();
    OK(relay->m->wait_for_work(relay, 5000, pfd[0], &notified));
    assert_false(notified);
    if (obx__mono_ms() - t0 > 1000)
        fail_msg("a readable descriptor ended the wait after %lld ms",
                 (long long)(obx__mono_ms() - t0));
    char byte;
    assert_int_equal(read(pfd[0], &byte, 1), 1);
    w = (waiter){.s = relay, .timeout = 5000, .with_fd = true, .fd = pfd[0]};
    sql_enqueue_wakes(f, &w, "o-fd");
    OK(w.err);
    close(pfd[0]);
    close(pfd[1]);
    /* never inside a transaction */
    OK(obx__st_begin(relay));
    assert_int_equal(relay->m->wait_for_work(relay, 10, -1, &notified), OBX_EINVAL);
    OK(obx__st_rollback(relay));
    obx_store_close(relay);
}

/* Waits up to timeout_ms on relay while `sql` runs on f->conn, or, with sql NULL, while the C
 * producer enqueues ev in a transaction of its own; returns whether it was woken. */
static bool woken_by(fx *f, obx_store *relay, int timeout_ms, const char *sql,
                     const obx_event *ev) {
    waiter w = {.s = relay, .timeout = timeout_ms};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_thread, &w), 0);
    msleep(50);
    if (sql) {
        exec_ok(f->conn, sql);
    } else {
        obx_enqueue_result res;
        exec_ok(f->conn, "BEGIN");
        OK(obx_enqueue(f->s, ev, &res));
        exec_ok(f->conn, "COMMIT");
    }
    pthread_join(t, NULL);
    OK(w.err);
    return w.notified;
}

/* A producer session with obx.notify = 'off' inserts its events without a
 * NOTIFY on every path: the C producer's first write (the route read in the same trip) and
 * its cached-route write, obx.enqueue() (whichever body this server has), the PL/pgSQL body
 * itself; the events are written all the same. Any other value notifies. */
static void test_notify_off(void **state) {
    fx *f = *state;
    obx_store *relay = open_own(f, "obx-relay-wait");
    arm_relay(f, relay);
    exec_ok(f->conn, "SET obx.notify = off");
    obx_event ev = order_event("o-quiet", "{}");
    long long before = qint(f->conn, "SELECT count(*) FROM obx.obx_event");
    /* the first reads the route, the second has it cached */
    assert_false(woken_by(f, relay, 300, NULL, &ev));
    assert_false(woken_by(f, relay, 300, NULL, &ev));
    assert_false(woken_by(f, relay, 300,
                          "SELECT obx.enqueue('order.created.v2', 'order', 'o-q1', 1, "
                          "'tenant-7', '\\x7b7d')",
                          NULL));
    assert_false(woken_by(f, relay, 300,
                          "SELECT obx._enqueue_sql('order.created.v2', 'order', 'o-q2', 1, "
                          "'tenant-7', '\\x7b7d')",
                          NULL));
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), before + 4);
    /* any other value, and none, notifies */
    exec_ok(f->conn, "SET obx.notify = on");
    assert_true(woken_by(f, relay, 5000, NULL, &ev));
    exec_ok(f->conn, "RESET obx.notify");
    assert_true(woken_by(f, relay, 5000,
                         "SELECT obx.enqueue('order.created.v2', 'order', 'o-q3', 1, "
                         "'tenant-7', '\\x7b7d')",
                         NULL));
    assert_true(woken_by(f, relay, 5000,
                         "SELECT obx._enqueue_sql('order.created.v2', 'order', 'o-q4', 1, "
                         "'tenant-7', '\\x7b7d')",
                         NULL));
    obx_store_close(relay);
}

/* Whether a NOTIFY on obx_work reached the LISTENing connection l within ms. */
static bool listener_told(PGconn *l, int ms) {
    int64_t until = obx__mono_ms() + ms;
    bool told = false;
    while (!told) {
        assert_true(PQconsumeInput(l));
        PGnotify *n;
        while ((n = PQnotifies(l)) != NULL) {
            told = true;
            PQfreemem(n);
        }
        int64_t left = until - obx__mono_ms();
        if (told || left <= 0) break;
        struct pollfd pfd = {.fd = PQsocket(l), .events = POLLIN};
        poll(&pfd, 1, (int)left);
    }
    return told;
}

/* The sessions named `app` that wait in obx._wait_for_work() (pg_stat_activity: an extension's
 * wait). */
static long long waiting_in_server(fx *f, const char *app) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s' AND "
             "wait_event_type = 'Extension' AND query LIKE '%%obx._wait_for_work(%%'",
             app);
    return qint(f->conn, sql);
}

/* A relay that waits in the server (obx._wait_for_work, the obx_pg extension) is woken by
 * obx.enqueue()'s C body through its latch once the commit is visible, and no NOTIFY is sent:
 * a NOTIFY makes the producers' commits wait for each other (docs/performance.md, "Producer
 * overhead"). The PL/pgSQL body's NOTIFY wakes the same wait. */
static void test_latch_wake(void **state) {
    fx *f = *state;
    assert_enqueue_impl(f->conn, "c");
    PGconn *l = PQconnectdb(f->url);
    assert_int_equal(PQstatus(l), CONNECTION_OK);
    PQclear(PQexec(l, "LISTEN obx_work"));
    obx_store *relay = open_own(f, "obx-relay-wait");
    arm_relay(f, relay);
    waiter w = {.s = relay, .timeout = 5000};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_thread, &w), 0);
    msleep(150);
    assert_int_equal(waiting_in_server(f, "obx-relay-wait"), 1);
    exec_ok(f->conn, "BEGIN");
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'o-lw', 1, 'tenant-7', "
                     "'\\x7b7d')");
    msleep(100); /* enqueued, not committed: still waiting */
    assert_int_equal(waiting_in_server(f, "obx-relay-wait"), 1);
    int64_t committed = obx__mono_ms();
    exec_ok(f->conn, "COMMIT");
    pthread_join(t, NULL);
    OK(w.err);
    assert_true(w.notified);
    int64_t latency = w.woke_at - committed;
    printf("  latch wake-up latency after COMMIT: %lld ms\n", (long long)latency);
    assert_true(latency >= 0 && latency < 100);
    assert_false(listener_told(l, 300)); /* no NOTIFY */
    assert_int_equal(claim_local(relay, 1000), 1);
    /* the PL/pgSQL body and the C library's statements (obx._wake) alike; and a NOTIFY, what
     * producers send where the database has no obx_pg, ends the server-side wait as well */
    const char *const producers[] = {
        "SELECT obx._enqueue_sql('order.created.v2', 'order', 'o-lw2', 1, 'tenant-7', "
        "'\\x7b7d')",
        NULL, "NOTIFY obx_work"};
    for (int i = 0; i < 3; i++) {
        w = (waiter){.s = relay, .timeout = 5000};
        assert_int_equal(pthread_create(&t, NULL, wait_thread, &w), 0);
        msleep(150);
        assert_int_equal(waiting_in_server(f, "obx-relay-wait"), 1);
        committed = obx__mono_ms();
        if (producers[i]) {
            exec_ok(f->conn, producers[i]);
        } else {
            obx_event ev = order_event("o-lw3", "{}");
            obx_enqueue_result res;
            OK(obx_enqueue(f->s, &ev, &res));
        }
        pthread_join(t, NULL);
        OK(w.err);
        assert_true(w.notified);
        assert_true(w.woke_at - committed < 100);
        assert_int_equal(listener_told(l, 300), i == 2);
    }
    assert_int_equal(claim_local(relay, 1000), 3);
    obx_store_close(relay);
    PQfinish(l);
}

/* The producers' NOTIFY only while a relay of the event's cluster waits (NOTIFY_EXPR in
 * pg_store.c, the wake lock): none without one, none while the relay is in a backlog (its claim
 * took a whole batch), and no wake-up lost to the race between a producer that tested the lock
 * before the relay took it and the relay going to sleep. */
static void test_wake_lock(void **state) {
    fx *f = *state;
    PGconn *l = PQconnectdb(f->url);
    assert_int_equal(PQstatus(l), CONNECTION_OK);
    PQclear(PQexec(l, "LISTEN obx_work"));
    obx_event ev = order_event("o-w", "{}");
    obx_enqueue_result res;
    char mode[32];
    wait_wake_lock_free(f); /* the relays of the tests before this one */
    /* no relay waits: the producer holds the lock shared until it commits, and notifies nobody */
    exec_ok(f->conn, "BEGIN");
    OK(obx_enqueue(f->s, &ev, &res));
    assert_string_equal(wake_lock_mode(f, "obx-relay-wait", mode, sizeof mode), "");
    long long shared = qint(f->conn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                     "AND classid = 5194330 AND mode = 'ShareLock' AND pid = "
                                     "pg_backend_pid()");
    assert_int_equal(shared, 1);
    exec_ok(f->conn, "COMMIT");
    assert_false(listener_told(l, 300));
    /* obx.enqueue(), whichever body the server has, and the PL/pgSQL body */
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'o-ws', 1, 'tenant-7', "
                     "'\\x7b7d')");
    exec_ok(f->conn, "SELECT obx._enqueue_sql('order.created.v2', 'order', 'o-wp', 1, "
                     "'tenant-7', '\\x7b7d')");
    assert_false(listener_told(l, 300));

    /* the race: a producer in flight that did not notify keeps the relay from sleeping on the
     * lock; once it commits, the relay takes the lock and looks again, and finds its event */
    obx_store *relay = open_own(f, "obx-relay-wait");
    size_t before = claim_local(relay, 1000);
    exec_ok(f->conn, "BEGIN");
    ev.aggregate_id = "o-w2";
    OK(obx_enqueue(f->s, &ev, &res));
    bool notified = true;
    int64_t t0 = obx__mono_ms();
    OK(relay->m->wait_for_work(relay, 300, -1, &notified));
    assert_false(notified);
    assert_true(obx__mono_ms() - t0 >= 250); /* waited for the lock, in vain */
    assert_string_equal(wake_lock_mode(f, "obx-relay-wait", mode, sizeof mode), "");
    exec_ok(f->conn, "COMMIT");
    assert_false(listener_told(l, 200)); /* it tested the lock before the relay waited for it */
    OK(relay->m->wait_for_work(relay, 2000, -1, &notified));
    assert_true(notified); /* took the lock: look again before sleeping */
    assert_string_equal(wake_lock_mode(f, "obx-relay-wait", mode, sizeof mode), "ExclusiveLock");
    assert_int_equal(claim_local(relay, 1000), before + 1);
    before = claim_local(relay, 1000);

    /* the relay waits: every producer of its cluster notifies, on every path */
    ev.aggregate_id = "o-w3";
    OK(obx_enqueue(f->s, &ev, &res));
    assert_true(listener_told(l, 2000));
    OK(relay->m->wait_for_work(relay, 2000, -1, &notified));
    assert_true(notified);
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'o-ws2', 1, 'tenant-7', "
                     "'\\x7b7d')");
    assert_true(listener_told(l, 2000));
    exec_ok(f->conn, "SELECT obx._enqueue_sql('order.created.v2', 'order', 'o-wp2', 1, "
                     "'tenant-7', '\\x7b7d')");
    assert_true(listener_told(l, 2000));
    OK(relay->m->wait_for_work(relay, 2000, -1, &notified));
    assert_true(notified);
    assert_int_equal(claim_local(relay, 1000), before + 3);

    /* a claim that takes a whole batch releases it: no notifications during a backlog */
    assert_int_equal(claim_local(relay, 2), 2);
    assert_string_equal(wake_lock_mode(f, "obx-relay-wait", mode, sizeof mode), "");
    ev.aggregate_id = "o-w4";
    OK(obx_enqueue(f->s, &ev, &res));
    assert_false(listener_told(l, 300));
    /* and its next wait takes it again, with a look first */
    OK(relay->m->wait_for_work(relay, 2000, -1, &notified));
    assert_true(notified);
    assert_string_equal(wake_lock_mode(f, "obx-relay-wait", mode, sizeof mode), "ExclusiveLock");
    obx_store_close(relay);
    /* a session's lock ends with it: producers stop notifying */
    wait_wake_lock_free(f);
    ev.aggregate_id = "o-w5";
    OK(obx_enqueue(f->s, &ev, &res));
    assert_false(listener_told(l, 300));
    PQfinish(l);
}

/* ---- connection loss
 * ----------------------------------------------------------------------------- */

static void test_connection_loss(void **state) {
    fx *f = *state;
    obx_store *s = open_own(f, "obx-loss");
    obx_event ev = order_event("o-l", "{}");
    obx_enqueue_result res;
    /* lost inside a transaction: every call reports it until the rollback; then reconnect */
    OK(obx__st_begin(s));
    OK(obx_enqueue(s, &ev, &res));
    kill_backend("obx-loss");
    obx__rows rows = {0};
    const char *id = res.event_id;
    obx_err e = obx__st_load_events(s, &id, 1, 0, &rows);
    assert_int_equal(e, OBX_ECONNLOST);
    assert_true(obx_err_is_retriable(e));
    assert_int_equal(obx__st_load_events(s, &id, 1, 0, &rows), OBX_ECONNLOST);
    /* known lost before COMMIT: definitely not committed */
    assert_int_equal(obx__st_commit(s), OBX_ECONNLOST);
    assert_non_null(strstr(obx_errmsg(), "not committed"));
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 0);
    /* the next transaction reconnects */
    OK(obx_enqueue(s, &ev, &res));
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event"), 1);
    /* lost while COMMIT is in flight: unknown, never success */
    OK(obx__st_begin(s));
    ev.aggregate_id = "o-l2";
    OK(obx_enqueue(s, &ev, &res));
    kill_backend("obx-loss");
    e = obx__st_commit(s);
    assert_int_equal(e, OBX_EUNKNOWN);
    assert_false(obx_err_is_retriable(e));
    assert_non_null(strstr(obx_errmsg(), "may or may not"));
    assert_int_equal(s->tx_depth, 0);
    OK(obx_enqueue(s, &ev, &res)); /* usable again */
    /* a standalone statement on a lost connection */
    kill_backend("obx-loss");
    obx__store_stats st;
    OK(s->m->read->stats(s, &st)); /* outside a transaction an own connection is re-established */
    obx_store_close(s);
    /* a borrowed connection is never reset behind the caller's back */
    char url[1300];
    db_url(f->db, "application_name=obx-loss-w", url, sizeof url);
    PGconn *c = connect_url(url);
    obx_store *w;
    OK(obx_store_wrap_pg(c, &w));
    exec_ok(c, "BEGIN");
    OK(obx_enqueue(w, &ev, &res)); /* reads the route and keeps it */
    exec_ok(c, "COMMIT");
    OK(w->m->read->stats(w, &st));
    exec_ok(c, "BEGIN");
    kill_backend("obx-loss-w");
    /* the one-round-trip write (enqueue_write) finds the connection gone */
    assert_int_equal(obx_enqueue(w, &ev, &res), OBX_ECONNLOST);
    assert_int_equal(w->m->read->stats(w, &st), OBX_ECONNLOST);
    assert_int_equal(w->m->read->stats(w, &st), OBX_ECONNLOST);
    assert_int_equal(obx_enqueue(w, &ev, &res), OBX_ECONNLOST);
    obx_store_close(w);
    PQfinish(c);
}

/* ---- serialization, deadlock and lock timeouts are retriable ------------------------------------
 */

typedef struct upd_arg {
    obx__store *s;
    obx__event_update u;
    bool applied;
    obx_err err;
    char msg[512];
} upd_arg;

static void *update_thread(void *p) {
    upd_arg *a = p;
    a->err = obx__st_update_events(a->s, &a->u, 1, &a->applied);
    snprintf(a->msg, sizeof a->msg, "%s", obx_errmsg());
    return NULL;
}

static void test_busy_mapping(void **state) {
    fx *f = *state;
    obx_event ev = order_event("o-x", "{}");
    obx_enqueue_result rx, ry;
    OK(obx_enqueue(f->s, &ev, &rx));
    ev.aggregate_id = "o-y";
    OK(obx_enqueue(f->s, &ev, &ry));
    obx_store *a = open_own(f, "obx-dl-a"), *b = open_own(f, "obx-dl-b");
    obx__event_row x = load1(a, rx.event_id, 0), y = load1(a, ry.event_id, 0);
    x.rejections = y.rejections = 1;
    obx__event_update ux = {&x, OBX__ST_PENDING, 0}, uy = {&y, OBX__ST_PENDING, 0};
    bool ok;
    /* deadlock: a holds x and wants y, b holds y and wants x; the victim's statement fails,
     * its transaction keeps its locks until it rolls back */
    OK(obx__st_begin(a));
    OK(obx__st_begin(b));
    OK(obx__st_update_events(a, &ux, 1, &ok));
    OK(obx__st_update_events(b, &uy, 1, &ok));
    upd_arg ta = {.s = a, .u = uy}, tb = {.s = b, .u = ux};
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, update_thread, &ta), 0);
    assert_int_equal(wait_lock_waiter("obx-dl-a"), 0);
    assert_int_equal(pthread_create(&t2, NULL, update_thread, &tb), 0);
    /* the victim's error aborts its transaction and releases its locks at once (PostgreSQL
     * then only waits for its ROLLBACK): both statements return */
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_true((ta.err == OBX_OK) != (tb.err == OBX_OK)); /* exactly one victim */
    upd_arg *victim = ta.err ? &ta : &tb, *winner = ta.err ? &tb : &ta;
    assert_int_equal(victim->err, OBX_EBUSY);
    assert_true(obx_err_is_retriable(victim->err));
    assert_non_null(strstr(victim->msg, "40P01"));
    assert_true(winner->applied);
    OK(obx__st_rollback(victim->s));
    OK(obx__st_commit(winner->s));

    /* serialization failure: a REPEATABLE READ caller transaction updates a row that changed
     * after its snapshot */
    PGconn *c = connect_url(f->url);
    obx_store *w;
    OK(obx_store_wrap_pg(c, &w));
    exec_ok(c, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    obx__event_row snap = load1(w, rx.event_id, 0); /* takes the snapshot */
    obx__event_row fresh = load1(a, rx.event_id, 0);
    fresh.rejections += 1;
    obx__event_update uf = {&fresh, fresh.state, fresh.claim_gen};
    OK(obx__st_begin(a));
    OK(obx__st_update_events(a, &uf, 1, &ok));
    OK(obx__st_commit(a));
    snap.rejections = 9;
    obx__event_update us = {&snap, snap.state, snap.claim_gen};
    OK(obx__st_begin(w));
    obx_err e = obx__st_update_events(w, &us, 1, &ok);
    assert_int_equal(e, OBX_EBUSY);
    assert_non_null(strstr(obx_errmsg(), "40001"));
    OK(obx__st_rollback(w));
    exec_ok(c, "ROLLBACK");

    /* lock timeout */
    exec_ok(c, "SET lock_timeout = '100ms'");
    OK(obx__st_begin(a));
    obx__rows rows = {0};
    const char *id = rx.event_id;
    OK(obx__st_load_events(a, &id, 1, OBX__LOAD_LOCK, &rows)); /* a holds the row */
    obx__rows_free(&rows);
    fresh = load1(w, rx.event_id, 0);
    obx__event_update ul = {&fresh, fresh.state, fresh.claim_gen};
    OK(obx__st_begin(w));
    e = obx__st_update_events(w, &ul, 1, &ok);
    assert_int_equal(e, OBX_EBUSY);
    assert_non_null(strstr(obx_errmsg(), "55P03"));
    OK(obx__st_rollback(w));
    OK(obx__st_rollback(a));
    obx_store_close(w);
    PQfinish(c);
    obx_store_close(a);
    obx_store_close(b);
}

/* ---- concurrent relays ------------------------------------------------------------------------
 */

static bool has(const obx__rows *r, const char *id) {
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->v[i].env.event_id, id)) return true;
    return false;
}

static void test_claim_skip_locked(void **state) {
    fx *f = *state;
    char a1[31], a2[31], b1[31], c1[31];
    const char *aggs[] = {"o-a", "o-a", "o-b", "o-c"};
    char *ids[] = {a1, a2, b1, c1};
    for (int i = 0; i < 4; i++) {
        obx_event ev = order_event(aggs[i], "{}");
        obx_enqueue_result res;
        OK(obx_enqueue(f->s, &ev, &res));
        strcpy(ids[i], res.event_id);
    }
    obx_store *r1 = open_own(f, "obx-r1"), *r2 = open_own(f, "obx-r2");
    obx__claim_req req = {.now = obx__wall_ms() + 1000, .limit = 2};
    obx__rows got1 = {0}, got2 = {0};
    OK(obx__st_begin(r1));
    OK(obx__st_read_events(r1, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &got1));
    assert_int_equal(got1.n, 2);
    assert_true(has(&got1, a1) && has(&got1, b1));
    /* the second relay skips the locked rows and does not jump a2 over its locked head */
    req.limit = 10;
    OK(obx__st_begin(r2));
    OK(obx__st_read_events(r2, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &got2));
    assert_int_equal(got2.n, 1);
    assert_true(has(&got2, c1));
    OK(obx__st_commit(r2));
    OK(obx__st_commit(r1));
    obx__rows_free(&got1);
    obx__rows_free(&got2);
    obx_store_close(r1);
    obx_store_close(r2);
}

/* Relays claim 100 rows, mark them CLAIMED with an audit row, commit; every event is claimed
 * exactly once. Prints the rows/s figure. */
typedef struct relay_arg {
    obx__store *s;
    int id;
    long claimed;
    obx_err err;
    char msg[512];
    char (*seen)[31];
    long seen_n;
} relay_arg;

static void *relay_thread(void *p) {
    relay_arg *a = p;
    obx__event_update *u = calloc(100, sizeof *u);
    bool applied[100];
    obx__audit_row *au = calloc(100, sizeof *au);
    for (;;) {
        obx__claim_req req = {.now = 1900000000000, .limit = 100};
        obx__rows rows = {0};
        obx_err e = obx__st_begin(a->s);
        if (!e)
            e = obx__st_read_events(a->s, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req},
                                    &rows);
        if (!e && rows.n == 0) {
            obx__st_rollback(a->s);
            obx__rows_free(&rows);
            break;
        }
        for (size_t i = 0; !e && i < rows.n; i++) {
            obx__event_row *r = &rows.v[i];
            u[i] = (obx__event_update){r, r->state, r->claim_gen};
            au[i] = (obx__audit_row){.at = 1,
                                     .actor = OBX__ACT_DISPATCHER,
                                     .from = r->state,
                                     .to = OBX__ST_CLAIMED,
                                     .envelope_gen = 1};
            r->state = OBX__ST_CLAIMED;
            r->claim_gen++;
            r->lease_until = 2000000000000;
            snprintf(r->owner, sizeof r->owner, "relay-%d", a->id);
            strcpy(au[i].event_id, r->env.event_id);
            strcpy(au[i].who, r->owner);
            au[i].claim_gen = r->claim_gen;
        }
        if (!e) e = obx__st_update_events(a->s, u, rows.n, applied);
        if (!e) e = obx__st_insert_audit(a->s, au, rows.n);
        if (!e)
            e = obx__st_commit(a->s);
        else
            obx__st_rollback(a->s);
        if (e) {
            a->err = e;
            snprintf(a->msg, sizeof a->msg, "%s", obx_errmsg());
            obx__rows_free(&rows);
            break;
        }
        for (size_t i = 0; i < rows.n; i++) {
            if (!applied[i]) continue;
            strcpy(a->seen[a->seen_n++], rows.v[i].env.event_id);
            a->claimed++;
        }
        obx__rows_free(&rows);
    }
    free(u);
    free(au);
    return NULL;
}

static int cmp_id(const void *x, const void *y) { return strcmp(x, y); }

static void test_claim_throughput(void **state) {
    fx *f = *state;
    const int total = 10000, relays = 4;
    int64_t t0 = obx__mono_ms();
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'o-' || i, 1, 'tenant-7', "
                     "'\\x7b7d') FROM generate_series(1, 10000) i");
    int64_t t1 = obx__mono_ms();
    printf("  obx.enqueue(): %d events in one statement, %.0f events/s\n", total,
           total * 1000.0 / (double)(t1 - t0 ? t1 - t0 : 1));
    /* what autovacuum does within a minute on a deployed outbox: on a never-analyzed table the
     * planner may sort every claimable row instead of walking obx_event_claimable in order */
    exec_ok(f->conn, "ANALYZE obx.obx_event");
    relay_arg ra[4];
    pthread_t t[4];
    char(*seen)[31] = calloc((size_t)total * relays, 31);
    for (int i = 0; i < relays; i++) {
        char app[32];
        snprintf(app, sizeof app, "obx-tp-%d", i);
        ra[i] = (relay_arg){.s = open_own(f, app), .id = i, .seen = seen + (size_t)i * total};
    }
    t0 = obx__mono_ms();
    for (int i = 0; i < relays; i++) pthread_create(&t[i], NULL, relay_thread, &ra[i]);
    long claimed = 0;
    for (int i = 0; i < relays; i++) {
        pthread_join(t[i], NULL);
        if (ra[i].err) fail_msg("relay %d: %s: %s", i, obx_errname(ra[i].err), ra[i].msg);
        claimed += ra[i].claimed;
    }
    t1 = obx__mono_ms();
    printf("  claim+mark, batch 100, %d relays: %ld rows in %lld ms = %.0f rows/s\n", relays,
           claimed, (long long)(t1 - t0), claimed * 1000.0 / (double)(t1 - t0 ? t1 - t0 : 1));
    assert_int_equal(claimed, total);
    /* no event claimed twice */
    char(*all)[31] = calloc((size_t)total, 31);
    long n = 0;
    for (int i = 0; i < relays; i++)
        for (long k = 0; k < ra[i].seen_n; k++) strcpy(all[n++], ra[i].seen[k]);
    qsort(all, (size_t)n, 31, cmp_id);
    for (long k = 1; k < n; k++) assert_string_not_equal(all[k - 1], all[k]);
    free(all);
    free(seen);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event WHERE state='CLAIMED' "
                                   "AND claim_gen = 1"),
                     total);
    obx__store_stats st;
    OK(f->s->m->read->stats(f->s, &st));
    assert_int_equal(st.by_state[OBX__ST_CLAIMED], total);
    assert_int_equal(st.by_state[OBX__ST_PENDING], 0);
    for (int i = 0; i < relays; i++) obx_store_close(ra[i].s);
}

/* ---- the relay's plans ----------------------------------------------------------------------- */

/* Dispatches and accepts through a log broker until conn sees no event left unpublished. */
static void relay_until_published(PGconn *conn, obx__engine *e) {
    for (int turn = 0; turn < 2000; turn++) {
        size_t sent = 0, applied = 0;
        int64_t now = obx__wall_ms();
        OK(obx__engine_dispatch(e, now, &sent));
        OK(obx__engine_poll(e, now, 0, &applied));
        if (!sent && !applied && !e->b->m->in_flight(e->b) &&
            qint(conn, "SELECT count(*) FROM obx.obx_event WHERE state <> 'PUBLISHED'") == 0)
            return;
        if (!sent && !applied) msleep(1);
    }
    fail_msg("the relay did not publish everything");
}

/* A relay's connection with an engine on it, as the relay's dispatchers run (serve_dispatch), and
 * a log broker in a directory of its own: relay_open sets it up, relay_close takes it down. */
typedef struct relay_conn {
    PGconn *rc; /* the relay's own connection (the store wraps it) */
    obx_store *ws;
    obx__broker *b;
    obx__engine e;
    char dir[32];
} relay_conn;

static void relay_open(fx *f, relay_conn *x, const char *owner) {
    x->rc = PQconnectdb(f->url);
    assert_int_equal(PQstatus(x->rc), CONNECTION_OK);
    x->ws = NULL;
    OK(obx_store_wrap_pg(x->rc, &x->ws));
    assert_non_null(x->ws->m->serve_dispatch);
    x->ws->m->serve_dispatch(x->ws);
    strcpy(x->dir, "/tmp/obx-relay-XXXXXX");
    assert_non_null(mkdtemp(x->dir));
    char burl[128];
    snprintf(burl, sizeof burl, "log:%s/b.db?cluster=local", x->dir);
    x->b = NULL;
    OK(obx__br_open(burl, NULL, 0, &x->b));
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    obx__strlcpy(c.owner, owner, sizeof c.owner);
    c.batch = 100;
    OK(obx__engine_init(&x->e, x->ws, x->b, &c));
}

static void relay_close(relay_conn *x) {
    obx__br_close(x->b);
    obx_store_close(x->ws);
    PQfinish(x->rc);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", x->dir);
    assert_int_equal(system(cmd), 0);
}

/* The schema dropped and made again under a relay's live connection: the row types of its batch
 * statements (obx._event_update ...) get new OIDs, which the connection had read and prepared them
 * with. Its next write set is refused (nothing written), and the one after prepares them again
 * and goes through, where a relay would otherwise fail every claim until restarted. */
static void test_write_set_schema_remade(void **state) {
    fx *f = *state;
    relay_conn x;
    relay_open(f, &x, "remade");
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'm-1', 1, 't', '\\x7b7d')");
    relay_until_published(f->conn, &x.e);
    remake_schema(f);
    assert_int_equal(route_topic(f->url, "orders", NULL, 0), 1);
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'm-2', 1, 't', '\\x7b7d')");
    size_t sent = 0;
    assert_int_not_equal(obx__engine_dispatch(&x.e, obx__wall_ms(), &sent), OBX_OK);
    if (!strstr(obx_errmsg(), "cache lookup failed for type") &&
        !strstr(obx_errmsg(), "wrong element type"))
        fail_msg("dispatch: %s", obx_errmsg());
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event WHERE state = 'PENDING'"),
                     1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_attempt"), 0);
    relay_until_published(f->conn, &x.e);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_receipt WHERE kind = 'PRIMARY'"),
                     1);
    relay_close(&x);
}

/* A relay connection (serve_dispatch) makes its plans while the outbox is empty and keeps them:
 * they must not be sequential scans, which cost O(table) per statement once the tables have
 * grown and before autovacuum first analyzes them, and they must not be planned again on every
 * call, which cost 37 % of the server's time at 1,000 events/s (docs/performance.md). */
static void test_dispatch_plans(void **state) {
    fx *f = *state;
    relay_conn x;
    relay_open(f, &x, "plans");
    PGconn *rc = x.rc;
    /* the plans are made here, on an empty outbox */
    for (int i = 0; i < 8; i++) {
        exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'p-' || i, 1, "
                         "'tenant-7', '\\x7b7d') FROM generate_series(1, 2) i");
        relay_until_published(f->conn, &x.e);
    }
    /* the tables grow tenfold and more, never analyzed */
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'g-' || i, 1, 'tenant-7', "
                     "'\\x7b7d') FROM generate_series(1, 3000) i");
    relay_until_published(f->conn, &x.e);
    const char *scans = "SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_user_tables WHERE "
                        "schemaname = 'obx' AND relname IN ('obx_event', 'obx_envelope', "
                        "'obx_attempt', 'obx_receipt')";
    /* rows read through obx_event's primary key: a sweep or reconcile plan that walks it in
     * seq order through the published rows reads them all */
    const char *pkey_reads = "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
                             "WHERE schemaname = 'obx' AND indexrelname = 'obx_event_pkey'";
    /* The counters are every backend's: the producer's connection (f->conn) commits its events
     * and flushes its statistics before the baseline and says nothing until the end, so that
     * what moves is the relay connection's (a backend flushes at most once a second, when
     * idle: a late flush of the producer's own scans failed this test once). */
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'm-' || i, 1, 'tenant-7', "
                     "'\\x7b7d') FROM generate_series(1, 300) i");
    exec_ok(f->conn, "SELECT pg_stat_force_next_flush()");
    exec_ok(rc, "SELECT pg_stat_force_next_flush()");
    msleep(200);
    exec_ok(rc, "SELECT pg_stat_clear_snapshot()");
    long long before = qint(rc, scans), pk_before = qint(rc, pkey_reads);
    int64_t accepted0 = x.e.st.accepted;
    for (int turn = 0; x.e.st.accepted - accepted0 < 300 || x.e.b->m->in_flight(x.e.b); turn++) {
        if (turn > 5000)
            fail_msg("the relay accepted %lld of 300", (long long)(x.e.st.accepted - accepted0));
        size_t sent = 0, applied = 0;
        OK(obx__engine_dispatch(&x.e, obx__wall_ms(), &sent));
        OK(obx__engine_poll(&x.e, obx__wall_ms(), 0, &applied));
        if (!sent && !applied) msleep(1);
    }
    for (int i = 0; i < 5; i++) {
        size_t n = 0;
        OK(obx__engine_sweep(&x.e, obx__wall_ms(), &n));
        OK(obx__reconcile_step(&x.e, obx__wall_ms(), &n));
        assert_int_equal(n, 0);
    }
    exec_ok(rc, "SELECT pg_stat_force_next_flush()");
    exec_ok(rc, "SELECT pg_stat_clear_snapshot()");
    long long after = qint(rc, scans), pk_after = qint(rc, pkey_reads);
    if (after != before)
        fail_msg("the relay's transactions scanned the outbox's tables sequentially %lld times",
                 after - before);
    if (pk_after - pk_before > 100)
        fail_msg("the relay's transactions read %lld rows through obx_event's primary key",
                 pk_after - pk_before);
    long long custom = qint(rc, "SELECT coalesce(sum(custom_plans), 0) FROM "
                                "pg_prepared_statements WHERE NOT from_sql"),
              generic = qint(rc, "SELECT coalesce(sum(generic_plans), 0) FROM "
                                 "pg_prepared_statements WHERE NOT from_sql");
    printf("  relay connection: %lld generic and %lld custom plan executions, %lld sequential "
           "scans after the tables grew\n",
           generic, custom, after - before);
    assert_int_equal(custom, 0);
    assert_true(generic > 0);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_receipt WHERE kind = 'PRIMARY'"),
                     3316);
    relay_close(&x);
}

/* The frontend messages that end a round trip in a libpq trace: a Sync (a pipeline, an
 * extended-protocol statement) or a simple Query. */
static int trace_round_trips(const char *trace, size_t len) {
    int n = 0;
    char *buf = trace ? strndup(trace, len) : NULL;
    if (!buf) return -1;
    for (char *line = buf; line && line < buf + len;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (!strncmp(line, "F\t", 2) && (strstr(line, "\tSync") || strstr(line, "\tQuery\t"))) n++;
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    return n;
}

/* A relay transaction sends its BEGIN and planner settings with its first statement, in one
 * pipeline (pg_store.c, pend), and its COMMIT with its write set (held; obx._ws_fail): a
 * claim is 2 round trips (BEGIN + settings + claim, the writes + COMMIT) where it was 5, then 3,
 * an acceptance 2 where it was 5, then 4, then 3 (its attempts and events in one pipeline:
 * load_slots), and a transaction that sends nothing costs none. Counted
 * in libpq's trace of the relay's connection; the claim still runs inside the transaction (its rows
 * stay locked until COMMIT). */
static void test_dispatch_round_trips(void **state) {
    fx *f = *state;
    relay_conn x;
    relay_open(f, &x, "trips");
    PGconn *rc = x.rc;
    obx_store *ws = x.ws;
    /* warm: statements prepared, the route read */
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'w-' || i, 1, 'tenant-7', "
                     "'\\x7b7d') FROM generate_series(1, 3) i");
    relay_until_published(f->conn, &x.e);
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 't-' || i, 1, 'tenant-7', "
                     "'\\x7b7d') FROM generate_series(1, 5) i");
    char *buf = NULL;
    size_t len = 0;
    FILE *tr = open_memstream(&buf, &len);
    assert_non_null(tr);
    PQtrace(rc, tr);
    PQsetTraceFlags(rc, PQTRACE_SUPPRESS_TIMESTAMPS);
    /* a transaction that sends nothing */
    OK(obx__st_begin(ws));
    OK(obx__st_commit(ws));
    OK(obx__st_begin(ws));
    OK(obx__st_rollback(ws));
    fflush(tr);
    assert_int_equal(trace_round_trips(buf, len), 0);
    assert_int_equal(PQtransactionStatus(rc), PQTRANS_IDLE);
    /* the claim: 5 events claimed and registered */
    size_t sent = 0;
    OK(obx__engine_dispatch(&x.e, obx__wall_ms(), &sent));
    assert_int_equal(sent, 5);
    fflush(tr);
    int claim_trips = trace_round_trips(buf, len);
    /* the acceptance of their outcomes */
    size_t applied = 0;
    for (int i = 0; i < 200 && applied < 5; i++) {
        size_t n = 0;
        OK(obx__engine_poll(&x.e, obx__wall_ms(), 0, &n));
        applied += n;
        if (!n) msleep(1);
    }
    assert_int_equal(applied, 5);
    PQuntrace(rc); /* flushes the stream: before it is closed */
    fclose(tr);
    int all_trips = trace_round_trips(buf, len);
    free(buf);
    printf("  relay connection: a claim of 5 in %d round trips, their acceptance in %d\n",
           claim_trips, all_trips - claim_trips);
    assert_int_equal(claim_trips, 2);
    assert_int_equal(all_trips - claim_trips, 2);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event WHERE state <> 'PUBLISHED'"),
                     0);
    /* the claim's pipeline runs inside its transaction: a claim rolled back leaves its rows
     * as they were, and they were locked until then */
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'r-1', 1, 'tenant-7', "
                     "'\\x7b7d')");
    OK(obx__st_begin(ws));
    obx__claim_req req = {.now = obx__wall_ms(), .limit = 10};
    obx__rows rows = {0};
    OK(obx__st_read_events(ws, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &rows));
    assert_int_equal(rows.n, 1);
    assert_int_equal(PQtransactionStatus(rc), PQTRANS_INTRANS);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event WHERE state = 'PENDING' "
                                   "AND event_id NOT IN (SELECT event_id FROM obx.obx_event FOR "
                                   "UPDATE SKIP LOCKED)"),
                     1);
    /* with the relay's and the claim's planner settings, for this transaction only */
    PGresult *set = PQexec(rc, "SELECT current_setting('plan_cache_mode') || ' ' || "
                               "current_setting('enable_seqscan') || ' ' || "
                               "current_setting('enable_sort')");
    assert_int_equal(PQresultStatus(set), PGRES_TUPLES_OK);
    assert_string_equal(PQgetvalue(set, 0, 0), "force_generic_plan off off");
    PQclear(set);
    OK(obx__st_rollback(ws));
    obx__rows_free(&rows);
    assert_int_equal(PQtransactionStatus(rc), PQTRANS_IDLE);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event WHERE state = 'PENDING' "
                                   "AND event_id NOT IN (SELECT event_id FROM obx.obx_event FOR "
                                   "UPDATE SKIP LOCKED)"),
                     0);
    assert_int_equal(qint(rc, "SELECT (current_setting('plan_cache_mode') = 'auto')::int"), 1);
    relay_until_published(f->conn, &x.e);
    relay_close(&x);
}

/* ---- statistics and batch semantics
 * -------------------------------------------------------------- */

/* The store's statistics equal what the tables hold (store s, its database through conn). */
static void stats_exact(obx__store *s, PGconn *conn) {
    obx__store_stats st;
    OK(s->m->read->stats(s, &st));
    PGresult *r = PQexec(conn, "SELECT state, count(*) FROM obx.obx_event GROUP BY state");
    int64_t want[OBX__ST_COUNT] = {0};
    for (int i = 0; i < PQntuples(r); i++)
        want[obx__state_parse(PQgetvalue(r, i, 0))] = strtoll(PQgetvalue(r, i, 1), NULL, 10);
    PQclear(r);
    for (int k = 0; k < OBX__ST_COUNT; k++)
        if (st.by_state[k] != want[k])
            fail_msg("stats %s: %lld, table says %lld", obx__state_name((obx__state)k),
                     (long long)st.by_state[k], (long long)want[k]);
    assert_int_equal(st.receipts_primary,
                     qint(conn, "SELECT count(*) FROM obx.obx_receipt WHERE kind='PRIMARY'"));
    assert_int_equal(st.receipts_duplicate,
                     qint(conn, "SELECT count(*) FROM obx.obx_receipt WHERE kind='DUPLICATE'"));
    assert_int_equal(st.attempts_unknown,
                     qint(conn, "SELECT count(*) FROM obx.obx_attempt WHERE state='UNKNOWN'"));
}

static void check_stats_exact(fx *f) { stats_exact(f->s, f->conn); }

static void test_stats_exact(void **state) {
    fx *f = *state;
    char ids[60][31];
    for (int i = 0; i < 60; i++) {
        char agg[16];
        snprintf(agg, sizeof agg, "o-%d", i);
        obx_event ev = order_event(agg, "{}");
        obx_enqueue_result res;
        if (i % 10 == 9) { /* some enqueues roll back */
            exec_ok(f->conn, "BEGIN");
            OK(obx_enqueue(f->s, &ev, &res));
            exec_ok(f->conn, "ROLLBACK");
        }
        OK(obx_enqueue(f->s, &ev, &res));
        strcpy(ids[i], res.event_id);
    }
    check_stats_exact(f);
    unsigned seed = 7;
    for (int round = 0; round < 4; round++) {
        obx__event_update u[60];
        obx__event_row rows[60];
        bool applied[60];
        size_t n = 0;
        for (int i = 0; i < 60; i++) {
            seed = seed * 1103515245u + 12345u;
            if ((seed >> 16) % 3 == 0) continue;
            rows[n] = load1(f->s, ids[i], 0);
            u[n] = (obx__event_update){&rows[n], rows[n].state, rows[n].claim_gen};
            switch (rows[n].state) {
            case OBX__ST_PENDING: rows[n].state = OBX__ST_CLAIMED; break;
            case OBX__ST_CLAIMED: rows[n].state = OBX__ST_SENDING; break;
            case OBX__ST_SENDING: rows[n].state = OBX__ST_PUBLISHED; break;
            default: rows[n].state = OBX__ST_RETAINED; break;
            }
            n++;
        }
        OK(obx__st_begin(f->s));
        OK(obx__st_update_events(f->s, u, n, applied));
        if (round == 2) /* a rolled-back batch changes nothing */
            OK(obx__st_rollback(f->s));
        else
            OK(obx__st_commit(f->s));
        check_stats_exact(f);
    }
    { /* an update that does not apply (stale claim_gen) is not counted, the other one is */
        obx__event_row r2[2] = {load1(f->s, ids[1], 0), load1(f->s, ids[2], 0)};
        obx__event_update u2[2] = {{&r2[0], r2[0].state, r2[0].claim_gen + 5},
                                   {&r2[1], r2[1].state, r2[1].claim_gen}};
        r2[0].state = r2[1].state = OBX__ST_PARKED;
        bool ap[2];
        OK(obx__st_begin(f->s));
        OK(obx__st_update_events(f->s, u2, 2, ap));
        OK(obx__st_commit(f->s));
        assert_false(ap[0]);
        assert_true(ap[1]);
        check_stats_exact(f);
    }
    obx__receipt_row rc = {.envelope_gen = 1, .kind = OBX__RK_PRIMARY};
    strcpy(rc.event_id, ids[0]);
    obx__receipt_row two[2] = {rc, rc};
    two[1].kind = OBX__RK_DUPLICATE;
    OK(obx__st_begin(f->s));
    OK(obx__st_insert_receipts(f->s, two, 2));
    OK(obx__st_commit(f->s));
    check_stats_exact(f);
    exec_ok(f->conn, "SELECT obx._compact_stats()");
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_stat_delta WHERE n <> 0 AND "
                                   "key IN (SELECT key FROM obx.obx_stat_delta GROUP BY key "
                                   "HAVING count(*) > 1)"),
                     0);
    check_stats_exact(f);
    exec_ok(f->conn, "DELETE FROM obx.obx_receipt WHERE kind = 'DUPLICATE'");
    check_stats_exact(f);
    /* no trigger counts inserts: each inserting statement does. The SQL
     * producer: a new event, a retry of it (nothing inserted), a rolled-back one */
    const char *sql_enq = "SELECT obx.enqueue('order.created.v2', 'order', 'o-sql', 1, "
                          "'tenant-7', '\\x7b7d', idempotency_key => 'k-sql')";
    exec_ok(f->conn, sql_enq);
    exec_ok(f->conn, sql_enq);
    exec_ok(f->conn, "BEGIN");
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'o-rb', 1, 'tenant-7', "
                     "'\\x7b7d')");
    exec_ok(f->conn, "ROLLBACK");
    check_stats_exact(f);
    /* a route with a delivery set: the slots of both producers are counted too */
    obx_route_target t[] = {{.cluster = "eu", .topic = "orders-eu"},
                            {.cluster = "us", .topic = "orders-us"}};
    obx_route rt = {.event_type = "order.created.v2",
                    .cluster = "local",
                    .topic = "orders",
                    .targets = t,
                    .n_targets = 2};
    OK(obx_route_set(f->s, &rt, NULL));
    exec_ok(f->conn, "SELECT obx.enqueue('order.created.v2', 'order', 'o-set', 1, 'tenant-7', "
                     "'\\x7b7d')");
    obx_event ev = order_event("o-set-c", "{}");
    obx_enqueue_result res;
    OK(obx_enqueue(f->s, &ev, &res));
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_delivery_target"), 6);
    check_stats_exact(f);
}

/* Two order events (aggregates a and b); their IDs into x and y. */
static void enqueue_two(fx *f, const char *a, const char *b, char x[31], char y[31]) {
    obx_event ev = order_event(a, "{}");
    obx_enqueue_result res;
    OK(obx_enqueue(f->s, &ev, &res));
    strcpy(x, res.event_id);
    ev.aggregate_id = b;
    OK(obx_enqueue(f->s, &ev, &res));
    strcpy(y, res.event_id);
}

static void test_batch_semantics(void **state) {
    fx *f = *state;
    char x[31], y[31];
    enqueue_two(f, "o-1", "o-2", x, y);
    /* x twice in one batch: applied in order, as one call after the other */
    obx__event_row x1 = load1(f->s, x, 0), x2, y1 = load1(f->s, y, 0);
    x1.state = OBX__ST_CLAIMED;
    x1.claim_gen = 1;
    x2 = x1;
    x2.state = OBX__ST_SENDING;
    obx__event_row y_stale = y1;
    y_stale.state = OBX__ST_CLAIMED;
    y1.rejections = 4;
    obx__event_update u[4] = {{&x1, OBX__ST_PENDING, 0},
                              {&y_stale, OBX__ST_CLAIMED, 0}, /* wrong expectation */
                              {&x2, OBX__ST_CLAIMED, 1},
                              {&y1, OBX__ST_PENDING, 0}};
    bool applied[4];
    OK(obx__st_begin(f->s));
    OK(obx__st_update_events(f->s, u, 4, applied));
    OK(obx__st_commit(f->s));
    assert_true(applied[0]);
    assert_false(applied[1]);
    assert_true(applied[2]);
    assert_true(applied[3]);
    assert_int_equal(load1(f->s, x, 0).state, OBX__ST_SENDING);
    assert_int_equal(load1(f->s, y, 0).rejections, 4);
    /* attempts: a batch naming one attempt twice; a missing attempt is named */
    obx__attempt_row a = {.envelope_gen = 1,
                          .attempt_gen = 1,
                          .claim_gen = 1,
                          .state = OBX__AT_SENDING,
                          .offset_before = -1};
    strcpy(a.attempt_id, "att-1");
    strcpy(a.event_id, x);
    strcpy(a.detail, "it's \"quoted\" \\ {braces}, commas");
    OK(obx__st_begin(f->s));
    OK(obx__st_insert_attempts(f->s, &a, 1));
    obx__attempt_row b[2] = {a, a};
    b[0].state = OBX__AT_UNKNOWN;
    b[1].state = OBX__AT_ACCEPTED;
    OK(obx__st_update_attempts(f->s, b, 2));
    OK(obx__st_commit(f->s));
    obx__attempt_row *got;
    size_t n;
    const char *aid = "att-1";
    OK(obx__st_load_attempts(f->s, &aid, 1, NULL, &got, &n));
    assert_int_equal(n, 1);
    assert_int_equal(got[0].state, OBX__AT_ACCEPTED);
    assert_string_equal(got[0].detail, a.detail);
    free(got);
    /* array parameters travel in PostgreSQL's binary format: UTF-8 text, the extremes of
     * 32- and 64-bit integers and an empty array come back as they went */
    obx__attempt_row w = a;
    strcpy(w.attempt_id, "att-2");
    strcpy(w.detail, "Gr\xc3\xbc\xc3\x9f"
                     "e \xe2\x82\xac \xf0\x9f\x9a\x80 NULL, {} \"\" \t");
    w.partition = INT32_MIN;
    w.attempt_gen = INT32_MAX;
    w.offset_before = INT64_MIN;
    w.quiet_until = INT64_MAX;
    OK(obx__st_begin(f->s));
    OK(obx__st_insert_attempts(f->s, &w, 1));
    OK(obx__st_commit(f->s));
    aid = "att-2";
    OK(obx__st_load_attempts(f->s, &aid, 1, NULL, &got, &n));
    assert_int_equal(n, 1);
    assert_string_equal(got[0].detail, w.detail);
    assert_int_equal(got[0].partition, INT32_MIN);
    assert_int_equal(got[0].attempt_gen, INT32_MAX);
    assert_true(got[0].offset_before == INT64_MIN);
    assert_true(got[0].quiet_until == INT64_MAX);
    free(got);
    obx__rows none = {0};
    OK(obx__st_load_events(f->s, &aid, 0, 0, &none));
    assert_int_equal(none.n, 0);
    obx__rows_free(&none);
    obx__attempt_row missing[2] = {a, a};
    strcpy(missing[1].attempt_id, "att-missing");
    OK(obx__st_begin(f->s));
    assert_int_equal(obx__st_update_attempts(f->s, missing, 2), OBX_ENOTFOUND);
    assert_non_null(strstr(obx_errmsg(), "att-missing"));
    OK(obx__st_rollback(f->s));
    /* load keeps the caller's order and repeats */
    const char *order[3] = {y, x, y};
    obx__rows rows = {0};
    OK(obx__st_load_events(f->s, order, 3, 0, &rows));
    assert_int_equal(rows.n, 3);
    assert_string_equal(rows.v[0].env.event_id, y);
    assert_string_equal(rows.v[1].env.event_id, x);
    obx__rows_free(&rows);
}

/* The dispatcher's audit row of event id's claim (PENDING -> CLAIMED, claim 1). */
static obx__audit_row claimed_audit(const char *id) {
    obx__audit_row ad = {.actor = OBX__ACT_DISPATCHER,
                         .envelope_gen = 1,
                         .from = OBX__ST_PENDING,
                         .to = OBX__ST_CLAIMED,
                         .claim_gen = 1};
    obx__strlcpy(ad.event_id, id, sizeof ad.event_id);
    strcpy(ad.reason, "claimed");
    return ad;
}

/* A transaction's writes in one round trip (write_set, libpq pipeline mode): the same effects as
 * the five calls one after the other, repeated rows included; a part that fails is reported
 * with its own message; an update that did not apply wins over the failure it caused later;
 * and the connection leaves pipeline mode whatever happened. */
static void test_write_set(void **state) {
    fx *f = *state;
    assert_non_null(f->s->m->write_set);
    char x[31], y[31];
    enqueue_two(f, "o-ws1", "o-ws2", x, y);
    /* x twice (PENDING -> CLAIMED -> SENDING), y once; a new attempt updated twice */
    obx__event_row x1 = load1(f->s, x, 0), x2, y1 = load1(f->s, y, 0);
    x1.state = OBX__ST_CLAIMED;
    x1.claim_gen = 1;
    x2 = x1;
    x2.state = OBX__ST_SENDING;
    y1.rejections = 2;
    obx__event_update u[3] = {
        {&x1, OBX__ST_PENDING, 0}, {&y1, OBX__ST_PENDING, 0}, {&x2, OBX__ST_CLAIMED, 1}};
    bool applied[3];
    obx__attempt_row a = {.envelope_gen = 1,
                          .attempt_gen = 1,
                          .claim_gen = 1,
                          .state = OBX__AT_SENDING,
                          .offset_before = -1};
    strcpy(a.attempt_id, "att-ws1");
    strcpy(a.event_id, x);
    obx__attempt_row au[2] = {a, a};
    au[0].state = OBX__AT_UNKNOWN;
    au[1].state = OBX__AT_ACCEPTED;
    strcpy(au[1].detail, "acked");
    obx__audit_row ad = claimed_audit(x);
    obx__write_set w = {.upd = u,
                        .n_upd = 3,
                        .applied = applied,
                        .att_new = &a,
                        .n_att_new = 1,
                        .att = au,
                        .n_att = 2,
                        .au = &ad,
                        .n_au = 1};
    long audit0 = (long)qint(f->conn, "SELECT count(*) FROM obx.obx_audit_all");
    OK(obx__st_begin(f->s));
    OK(obx__st_write_set(f->s, &w));
    OK(obx__st_commit(f->s));
    assert_true(applied[0] && applied[1] && applied[2]);
    assert_int_equal(load1(f->s, x, 0).state, OBX__ST_SENDING);
    assert_int_equal(load1(f->s, y, 0).rejections, 2);
    obx__attempt_row *got;
    size_t n;
    const char *aid = "att-ws1";
    OK(obx__st_load_attempts(f->s, &aid, 1, NULL, &got, &n));
    assert_int_equal(n, 1);
    assert_int_equal(got[0].state, OBX__AT_ACCEPTED);
    assert_string_equal(got[0].detail, "acked");
    free(got);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_audit_all"), audit0 + 1);
    /* a missing attempt: named, and the connection is usable after the rollback */
    obx__attempt_row miss = a;
    strcpy(miss.attempt_id, "att-ws-missing");
    obx__write_set wm = {.att = &miss, .n_att = 1};
    OK(obx__st_begin(f->s));
    assert_int_equal(obx__st_write_set(f->s, &wm), OBX_ENOTFOUND);
    assert_non_null(strstr(obx_errmsg(), "att-ws-missing"));
    OK(obx__st_rollback(f->s));
    assert_int_equal(load1(f->s, x, 0).state, OBX__ST_SENDING);
    /* a statement the server refuses (a receipt kind outside the CHECK): its error, the
     * parts after it skipped, nothing kept */
    obx__receipt_row rc = {.envelope_gen = 1, .kind = (obx__receipt_kind)9, .offset = 1};
    strcpy(rc.event_id, x);
    strcpy(rc.attempt_id, "att-ws1");
    obx__write_set wr = {.rc = &rc, .n_rc = 1, .au = &ad, .n_au = 1};
    OK(obx__st_begin(f->s));
    obx_err e = obx__st_write_set(f->s, &wr);
    assert_int_not_equal(e, OBX_OK);
    assert_non_null(strstr(obx_errmsg(), "insert receipts"));
    OK(obx__st_rollback(f->s));
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_audit_all"), audit0 + 1);
    /* an update that no longer applies (x is SENDING now), and a primary receipt for y whose
     * slot is taken meanwhile would fail: the call reports the update, by name (the statement
     * checks itself, obx._ws_fail: OBX_ECONFLICT), and the rollback keeps nothing */
    obx__receipt_row pr = {.envelope_gen = 1, .kind = OBX__RK_PRIMARY, .offset = 7};
    strcpy(pr.event_id, y);
    strcpy(pr.attempt_id, "att-ws1");
    strcpy(pr.cluster, "local");
    strcpy(pr.topic, "orders");
    OK(obx__st_begin(f->s));
    OK(obx__st_insert_receipts(f->s, &pr, 1));
    OK(obx__st_commit(f->s));
    obx__event_row stale = load1(f->s, x, 0);
    stale.state = OBX__ST_PUBLISHED;
    obx__event_update us = {&stale, OBX__ST_CLAIMED, 1};
    bool ap = true;
    obx__write_set wc = {.upd = &us, .n_upd = 1, .applied = &ap, .rc = &pr, .n_rc = 1};
    OK(obx__st_begin(f->s));
    assert_int_equal(obx__st_write_set(f->s, &wc), OBX_ECONFLICT);
    assert_non_null(strstr(obx_errmsg(), x));
    assert_non_null(strstr(obx_errmsg(), "changed under a locked transaction"));
    OK(obx__st_rollback(f->s));
    assert_int_equal(load1(f->s, x, 0).state, OBX__ST_SENDING);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_receipt"), 1);
}

/* One relay transaction of write set w on s, in a thread (test_held_write_set). */
typedef struct held_arg {
    obx_store *s;
    const obx__write_set *w;
    obx_err err;
    char msg[512];
} held_arg;

static void *held_commit_thread(void *arg) {
    held_arg *h = arg;
    h->err = obx__st_begin(h->s);
    if (!h->err && !(h->err = obx__st_write_set(h->s, h->w))) h->err = obx__st_commit(h->s);
    if (h->err) obx__strlcpy(h->msg, obx_errmsg(), sizeof h->msg);
    return NULL;
}

/* A relay transaction's write set is held and sent with its COMMIT, in one pipeline (the
 * statements check themselves, obx._ws_fail): an update that did not apply fails the COMMIT
 * (OBX_ECONFLICT, the event named) and nothing of the write set is kept, the connection idle and
 * usable after; a good one is committed whole; a statement after a held write set sends it first,
 * and its failure is that statement's; a rollback sends nothing; a backend terminated in a
 * statement is OBX_ECONNLOST (the COMMIT behind it never ran), one terminated in the COMMIT
 * OBX_EUNKNOWN. */
static void test_held_write_set(void **state) {
    fx *f = *state;
    relay_conn x;
    relay_open(f, &x, "held");
    char a[31], b[31];
    enqueue_two(f, "o-held1", "o-held2", a, b);
    const char *audits = "SELECT count(*) FROM obx.obx_audit_all";
    long long audit0 = qint(f->conn, audits);
    obx__audit_row ad = claimed_audit(a);
    obx__event_row r = load1(f->s, a, 0);
    r.state = OBX__ST_CLAIMED;
    r.claim_gen = 1;
    /* stale: a is PENDING with claim_gen 0, the update expects CLAIMED 1 */
    obx__event_update u = {&r, OBX__ST_CLAIMED, 1};
    bool ap = false;
    obx__write_set w = {.upd = &u, .n_upd = 1, .applied = &ap, .au = &ad, .n_au = 1};
    OK(obx__st_begin(x.ws));
    OK(obx__st_write_set(x.ws, &w)); /* held: nothing sent yet */
    assert_int_equal(obx__st_commit(x.ws), OBX_ECONFLICT);
    assert_non_null(strstr(obx_errmsg(), a));
    assert_int_equal(PQtransactionStatus(x.rc), PQTRANS_IDLE);
    assert_int_equal(qint(f->conn, audits), audit0);
    assert_int_equal(load1(f->s, a, 0).state, OBX__ST_PENDING);
    /* the same, expecting what is there: committed whole */
    u.expect_state = OBX__ST_PENDING;
    u.expect_claim_gen = 0;
    OK(obx__st_begin(x.ws));
    OK(obx__st_write_set(x.ws, &w));
    assert_true(ap);
    OK(obx__st_commit(x.ws));
    assert_int_equal(PQtransactionStatus(x.rc), PQTRANS_IDLE);
    assert_int_equal(load1(f->s, a, 0).state, OBX__ST_CLAIMED);
    assert_int_equal(qint(f->conn, audits), audit0 + 1);
    /* stale again (a is CLAIMED now): the next statement of the transaction reports it */
    OK(obx__st_begin(x.ws));
    OK(obx__st_write_set(x.ws, &w));
    obx__rows rows = {0};
    const char *id = b;
    assert_int_equal(obx__st_load_events(x.ws, &id, 1, 0, &rows), OBX_ECONFLICT);
    assert_non_null(strstr(obx_errmsg(), a));
    obx__rows_free(&rows);
    OK(obx__st_rollback(x.ws));
    assert_int_equal(PQtransactionStatus(x.rc), PQTRANS_IDLE);
    /* a good write set, then a statement: sent in order, the statement sees the write */
    r.state = OBX__ST_SENDING;
    u.expect_state = OBX__ST_CLAIMED;
    u.expect_claim_gen = 1;
    OK(obx__st_begin(x.ws));
    OK(obx__st_write_set(x.ws, &w));
    id = a;
    OK(obx__st_load_events(x.ws, &id, 1, 0, &rows));
    assert_int_equal(rows.n, 1);
    assert_int_equal(rows.v[0].state, OBX__ST_SENDING);
    obx__rows_free(&rows);
    /* rolled back: neither the write set nor anything else is kept */
    OK(obx__st_rollback(x.ws));
    assert_int_equal(load1(f->s, a, 0).state, OBX__ST_CLAIMED);
    assert_int_equal(qint(f->conn, audits), audit0 + 1);
    /* held, then rolled back before anything was sent: nothing reaches the server */
    OK(obx__st_begin(x.ws));
    OK(obx__st_write_set(x.ws, &w));
    OK(obx__st_rollback(x.ws));
    assert_int_equal(PQtransactionStatus(x.rc), PQTRANS_IDLE);
    assert_int_equal(load1(f->s, a, 0).state, OBX__ST_CLAIMED);
    assert_int_equal(qint(f->conn, audits), audit0 + 1);
    /* the backend terminated while the write set waits (for the event's row lock): the
     * server answered that statement, so the COMMIT behind it never ran: OBX_ECONNLOST,
     * nothing kept */
    exec_ok(x.rc, "SET application_name = 'obx-held-kill'");
    PGconn *holder = connect_url(f->url);
    char lock[160];
    snprintf(lock, sizeof lock, "SELECT 1 FROM obx.obx_event WHERE event_id = '%s' FOR UPDATE", a);
    exec_ok(holder, "BEGIN");
    exec_ok(holder, lock);
    held_arg h = {.s = x.ws, .w = &w};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, held_commit_thread, &h), 0);
    assert_int_equal(wait_lock_waiter("obx-held-kill"), 0);
    kill_backend("obx-held-kill");
    pthread_join(t, NULL);
    if (h.err != OBX_ECONNLOST) fail_msg("%s: %s", obx_errname(h.err), h.msg);
    exec_ok(holder, "ROLLBACK");
    assert_int_equal(load1(f->s, a, 0).state, OBX__ST_CLAIMED);
    assert_int_equal(qint(f->conn, audits), audit0 + 1);
    relay_close(&x);
    /* terminated while the COMMIT runs (a deferred trigger waits for a lock): the statements
     * answered, the COMMIT did not: OBX_EUNKNOWN, never success */
    relay_open(f, &x, "held");
    exec_ok(x.rc, "SET application_name = 'obx-held-kill'");
    exec_ok(f->conn, "CREATE FUNCTION public.obx_test_commit_wait() RETURNS trigger LANGUAGE "
                     "plpgsql AS $$BEGIN PERFORM pg_advisory_lock(4242); RETURN NULL; END$$");
    exec_ok(f->conn, "CREATE CONSTRAINT TRIGGER obx_test_commit_wait AFTER INSERT ON "
                     "obx.obx_audit_batch DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE "
                     "FUNCTION public.obx_test_commit_wait()");
    exec_ok(holder, "SELECT pg_advisory_lock(4242)");
    h = (held_arg){.s = x.ws, .w = &w};
    assert_int_equal(pthread_create(&t, NULL, held_commit_thread, &h), 0);
    assert_int_equal(wait_lock_waiter("obx-held-kill"), 0);
    kill_backend("obx-held-kill");
    pthread_join(t, NULL);
    if (h.err != OBX_EUNKNOWN) fail_msg("%s: %s", obx_errname(h.err), h.msg);
    exec_ok(holder, "SELECT pg_advisory_unlock(4242)");
    PQfinish(holder);
    exec_ok(f->conn, "DROP TRIGGER obx_test_commit_wait ON obx.obx_audit_batch");
    exec_ok(f->conn, "DROP FUNCTION public.obx_test_commit_wait()");
    assert_int_equal(load1(f->s, a, 0).state, OBX__ST_CLAIMED); /* it had not committed */
    assert_int_equal(qint(f->conn, audits), audit0 + 1);
    relay_close(&x);
}

/* ---- delivery sets through obx.enqueue() ----------------------------------------------------
 */

/* obx.enqueue() (any language, inside the caller's transaction) makes the same delivery set as
 * the C path: one slot per target with the same frozen destinations and digests. */
static void test_sql_enqueue_delivery_set(void **state) {
    fx *f = *state;
    obx_route_target t[] = {{.cluster = "eu", .topic = "orders-eu"},
                            {.cluster = "local", .topic = "audit", .routing_key = "{tenant}"}};
    obx_route rt = {.event_type = "order.created.v2",
                    .cluster = "local",
                    .topic = "orders",
                    .targets = t,
                    .n_targets = 2,
                    .completion = "any"};
    int64_t gen;
    OK(obx_route_set(f->s, &rt, &gen));
    obx_event ev = order_event("o-set", "{\"total\":1}");
    ev.idempotency_key = "k-c";
    obx_enqueue_result rc;
    OK(obx_enqueue(f->s, &ev, &rc));
    const char *sql = "SELECT obx.enqueue('order.created.v2', 'order', 'o-set', 1, 'tenant-7', "
                      "'\\x7b22746f74616c223a317d', NULL, 'corr-1', NULL, NULL, 'k-sql')";
    PGresult *r = PQexec(f->conn, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s", PQerrorMessage(f->conn));
    char sid[64];
    snprintf(sid, sizeof sid, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    obx__delivery_row dc, ds;
    OK(f->s->m->delivery_get(f->s, rc.event_id, &dc));
    OK(f->s->m->delivery_get(f->s, sid, &ds));
    assert_int_equal(dc.n, 3);
    assert_int_equal(ds.n, 3);
    assert_string_equal(ds.completion, "any");
    assert_int_equal(ds.route_gen, gen);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ds.t[i].target_no, dc.t[i].target_no);
        obx__event_row c = load1(f->s, dc.t[i].slot_id, 0), q = load1(f->s, ds.t[i].slot_id, 0);
        assert_string_equal(q.dest_digest, c.dest_digest);
        assert_string_equal(q.dest.cluster, c.dest.cluster);
        assert_string_equal(q.dest.routing_key, c.dest.routing_key);
        assert_string_equal(obx__wire_id(&q), sid);
        assert_string_equal(obx__wire_id(&c), rc.event_id);
        assert_int_equal(q.target_no, i + 1);
        assert_string_equal(q.alias, c.alias);
        obx__event_row q1 = load1(f->s, sid, 0);
        assert_string_equal(q.envelope_digest, q1.envelope_digest);
        assert_string_equal(q.env.payload_digest, c.env.payload_digest);
    }
    /* the key names the event once; a retried command gets its event (and set) back */
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event WHERE idempotency_key IS "
                                   "NOT NULL"),
                     2);
    r = PQexec(f->conn, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_string_equal(PQgetvalue(r, 0, 0), sid);
    PQclear(r);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_delivery_target"), 6);
    assert_int_equal(qint(f->conn,
                          "SELECT count(*) FROM obx.obx_audit_all WHERE from_state = 'NONE' "
                          "AND reason LIKE 'target % of delivery set %'"),
                     4);
    /* a delivery set is a frozen contract, also for the database owner */
    char st[6], msg[256];
    exec_fail(f->conn, "UPDATE obx.obx_delivery_set SET completion = 'all'", st, msg, sizeof msg);
    assert_string_equal(st, "OB001");
    exec_fail(f->conn, "DELETE FROM obx.obx_delivery_target", st, msg, sizeof msg);
    assert_string_equal(st, "OB001");
}

/* n events of order.created.v2 through obx.enqueue() on c (aggregates o-0 ... o-<n-1>, tenant
 * t, payload {}), their IDs into ids[0..n-1]. */
static void enqueue_sql(PGconn *c, int n, char (*ids)[64]) {
    char sql[160];
    for (int i = 0; i < n; i++) {
        snprintf(sql, sizeof sql,
                 "SELECT obx.enqueue('order.created.v2', 'order', 'o-%d', 1, 't', '\\x7b7d')", i);
        PGresult *r = PQexec(c, sql);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("enqueue: %s", PQerrorMessage(c));
        snprintf(ids[i], 64, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
    }
}

/* The audit trail of event `id` as load_audit returns it: "from>to" per row, joined by ' '. */
static void trail(obx__store *s, const char *id, char *out, size_t cap) {
    obx__audit_row *a;
    size_t n;
    OK(obx__st_load_audit(s, id, &a, &n));
    out[0] = 0;
    for (size_t i = 0; i < n; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s>%s", i ? " " : "",
                 obx__state_name(a[i].from), obx__state_name(a[i].to));
    free(a);
}

/* The storage parameter, trigger timing or indexes named, as one string (pg_class.reloptions,
 * "after"/"before" from pg_trigger.tgtype's BEFORE bit, pg_indexes.indexdef). */
static void catalog_text(PGconn *c, const char *sql, char *out, size_t cap) {
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        fail_msg("%s: %s", sql, PQerrorMessage(c));
    snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
}

/* Relays every event of the database at url through the engine on a connection of its own
 * serving dispatch, as a relay's dispatcher does, with a log broker in a new directory; c sees
 * them all PUBLISHED at the end. */
static void relay_all(const char *url, PGconn *c) {
    char dir[] = "/tmp/obx-relay-all-XXXXXX", burl[64];
    assert_non_null(mkdtemp(dir));
    snprintf(burl, sizeof burl, "log:%s/broker.db", dir);
    obx__store *s;
    OK(obx__st_open(url, &s));
    obx__st_serve_dispatch(s);
    obx__broker *b;
    OK(obx__br_open(burl, NULL, 0, &b));
    obx__engine_cfg ec;
    obx__engine_cfg_defaults(&ec);
    snprintf(ec.owner, sizeof ec.owner, "test/d0");
    obx__engine e;
    OK(obx__engine_init(&e, s, b, &ec));
    relay_until_published(c, &e);
    obx__br_close(b);
    obx__st_close(s);
    char rm[96];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    assert_int_equal(system(rm), 0);
}

/* Whether the plan of query (EXPLAIN, sequential scans off) on c uses index. */
static bool plan_uses(PGconn *c, const char *query, const char *index) {
    exec_ok(c, "BEGIN");
    exec_ok(c, "SET LOCAL enable_seqscan = off");
    char sql[512];
    snprintf(sql, sizeof sql, "EXPLAIN %s", query);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s: %s", sql, PQerrorMessage(c));
    bool uses = false;
    for (int i = 0; i < PQntuples(r); i++) uses |= strstr(PQgetvalue(r, i, 0), index) != NULL;
    PQclear(r);
    exec_ok(c, "ROLLBACK");
    return uses;
}

/* SQL that must fail on c with SQLSTATE want and a message holding `has` */
static void refused(PGconn *c, const char *sql, const char *want, const char *has) {
    char st[6], msg[512];
    exec_fail(c, sql, st, msg, sizeof msg);
    if (strcmp(st, want) || !strstr(msg, has))
        fail_msg("%s: SQLSTATE '%s' (%s), expected %s with '%s'", sql, st, msg, want, has);
}

/* ---- the schema's own rules (src/store/postgres/schema.sql) -----------------------------------
 */

#define AUDIT_BATCH_INS                                                                            \
    "INSERT INTO obx.obx_audit_batch (seqs, at, actor, who, event_id, envelope_gen, from_state, "  \
    "to_state, claim_gen, attempt_id, attempt_gen, reason) VALUES ('[1,3)', "

/* The relay tables' checks hold for everyone, the owner included, in the forms that cost a
 * statement least to prepare: an audit batch's arrays hold one element per transition, at least
 * one (a row trigger where a CHECK would be: SQLSTATE 23514); an event's and an attempt's state,
 * a receipt's kind and source are of their lists (enum casts: 22P02); an envelope's generation
 * is at least 1 (in the generation trigger; a producer's envelope of generation 1 fires
 * nothing); the identity checks are column triggers that refuse any change (setting a column to
 * what it is is no change), and who enqueued is frozen with the envelope. The relay's own writes
 * pass them all, and what its attempts and receipts say (written through the batch statements'
 * row types, in binary) agrees with the events and their envelopes. */
static void test_schema_checks(void **state) {
    fx *f = *state;
    PGconn *c = f->conn;
    char ids[3][64], sql[1024];
    enqueue_sql(c, 3, ids);
    assert_int_equal(qint(c, "SELECT count(*) FROM pg_constraint WHERE conrelid = "
                             "'obx.obx_audit_batch'::regclass AND contype = 'c'"),
                     0);
    assert_int_equal(qint(c, "SELECT count(*) FROM pg_constraint WHERE conrelid = "
                             "'obx.obx_envelope'::regclass AND contype = 'c'"),
                     0);
    /* an aligned batch is written (and rolled back: the audit is append-only) */
    exec_ok(c, "BEGIN");
    exec_ok(c,
            AUDIT_BATCH_INS "'{1,2}', '{a,b}', '{w,w}', '{e1,e2}', '{1,1}', '{PENDING,"
                            "PENDING}', '{CLAIMED,CLAIMED}', '{1,1}', '{x,y}', '{0,0}', '{r,r}')");
    exec_ok(c, "ROLLBACK");
    refused(c,
            AUDIT_BATCH_INS "'{1,2}', '{a,b}', '{w,w}', '{e1,e2}', '{1,1}', '{PENDING,"
                            "PENDING}', '{CLAIMED,CLAIMED}', '{1,1}', '{x,y}', '{0,0}', '{r}')",
            "23514", "reason: 1)");
    refused(c,
            AUDIT_BATCH_INS "'{1,2}', '{a}', '{w,w}', '{e1,e2}', '{1,1}', '{PENDING,PENDING}', "
                            "'{CLAIMED,CLAIMED}', '{1,1}', '{x,y}', '{0,0}', '{r,r}')",
            "23514", "actor: 1,");
    refused(c, AUDIT_BATCH_INS "'{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')",
            "23514", "at least one");
    refused(c, "UPDATE obx.obx_event SET state = 'LOST'", "22P02", "obx.event_state");
    refused(c,
            "INSERT INTO obx.obx_attempt (attempt_id, event_id, envelope_gen, attempt_gen, "
            "claim_gen, owner, dest_digest, partition, state, started_at, unknown_at, ended_at, "
            "offset_before, quiet_until, detail) VALUES ('a-x', 'e-x', 1, 1, 1, 'o', 'd', 0, "
            "'LOST', 1, 0, 0, -1, 0, '')",
            "22P02", "obx.attempt_state");
    const char *rcpt = "INSERT INTO obx.obx_receipt (event_id, envelope_gen, attempt_id, kind, "
                       "cluster, topic, partition, \"offset\", broker_ts, payload_digest, "
                       "dest_digest, reason, created_at, source) VALUES ('e-x', 1, 'a-x', '%s', "
                       "'local', 'orders', 0, 0, 0, 'p', 'd', '', 1, '%s')";
    snprintf(sql, sizeof sql, rcpt, "SECONDARY", "broker");
    refused(c, sql, "22P02", "obx.receipt_kind");
    snprintf(sql, sizeof sql, rcpt, "PRIMARY", "rumour");
    refused(c, sql, "22P02", "obx.receipt_source");
    snprintf(sql, sizeof sql,
             "INSERT INTO obx.obx_envelope SELECT event_id, 0, aggregate_type, aggregate_id, "
             "aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at, "
             "created_txid, correlation_id, causation_id, traceparent, idempotency_key, "
             "envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm, "
             "dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload, "
             "payload_len, created_at FROM obx.obx_envelope WHERE event_id = '%s'",
             ids[0]);
    refused(c, sql, "23514", "envelope_gen 0 is below 1");
    snprintf(sql, sizeof sql,
             "UPDATE obx.obx_envelope SET created_by = 'mallory' WHERE event_id = '%s'", ids[1]);
    refused(c, sql, "OB001", "cannot change");
    /* the relay's own writes pass them all: the three events relayed through the engine */
    relay_all(f->url, c);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event WHERE state = 'PUBLISHED'"), 3);
    assert_true(qint(c, "SELECT count(*) FROM obx.obx_audit_batch") > 0);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event e JOIN obx.obx_attempt a ON "
                             "a.attempt_id = e.primary_attempt_id AND a.event_id = e.event_id AND "
                             "a.envelope_gen = e.envelope_gen AND a.attempt_gen = e.attempt_gen "
                             "AND a.claim_gen = e.claim_gen AND a.owner = 'test/d0' AND "
                             "a.partition = e.pinned_partition AND a.started_at > 0 AND "
                             "a.ended_at >= a.started_at JOIN obx.obx_envelope v ON v.event_id = "
                             "e.event_id AND v.envelope_gen = e.envelope_gen AND a.dest_digest = "
                             "v.dest_digest"),
                     3);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event e JOIN obx.obx_receipt r ON "
                             "r.event_id = e.event_id AND r.attempt_id = e.primary_attempt_id AND "
                             "r.envelope_gen = e.envelope_gen AND r.kind = 'PRIMARY' AND r.topic "
                             "= 'orders' AND r.partition = e.pinned_partition AND r.\"offset\" "
                             ">= 0 AND r.created_at > 0 JOIN obx.obx_envelope v ON v.event_id = "
                             "e.event_id AND v.envelope_gen = e.envelope_gen AND "
                             "r.payload_digest = v.payload_digest AND r.dest_digest = "
                             "v.dest_digest"),
                     3);
    /* the identity checks are column triggers, and refuse the owner */
    assert_int_equal(qint(c, "SELECT count(*) FROM pg_trigger WHERE tgname IN "
                             "('obx_event_frozen', 'obx_event_destination_frozen', "
                             "'obx_attempt_frozen') AND cardinality(tgattr::int2[]) > 0"),
                     3);
    const char *moves[] = {"UPDATE obx.obx_event SET tenant = 'other'",
                           "UPDATE obx.obx_event SET committed_at = committed_at + 1",
                           "UPDATE obx.obx_event SET envelope_gen = 0",
                           "UPDATE obx.obx_event SET order_key = order_key || 'x'",
                           "UPDATE obx.obx_event SET dest_cluster = 'elsewhere'",
                           "UPDATE obx.obx_attempt SET owner = 'mallory'",
                           "UPDATE obx.obx_attempt SET dest_digest = 'sha256:00'"};
    for (size_t i = 0; i < sizeof moves / sizeof moves[0]; i++)
        refused(c, moves[i], "OB001", "cannot change");
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event WHERE tenant = 't'"), 3);
    /* setting them to what they are is no change */
    exec_ok(c, "UPDATE obx.obx_event SET tenant = tenant, order_key = order_key");
    exec_ok(c, "UPDATE obx.obx_attempt SET owner = owner");
    stats_exact(f->s, c);
}

/* How the relay's hottest tables are stored. obx_event and obx_attempt leave room on their
 * pages (fillfactor 50) and check their identity after the update (no row lock first). An
 * attempt's outcome is a HOT update (no new index entries: the open UNKNOWN attempts are found
 * through the stored column unknown_open, which nobody writes), except when it leaves UNKNOWN.
 * The receipts have one index by event ID, which allows one primary receipt per event and
 * generation and answers a lookup of an event's receipts. */
static void test_relay_tables_storage(void **state) {
    fx *f = *state;
    PGconn *c = f->conn;
    char ev[1][64], sql[1024], txt[512];
    enqueue_sql(c, 1, ev);
    catalog_text(c,
                 "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = "
                 "'obx.obx_event'::regclass",
                 txt, sizeof txt);
    assert_non_null(strstr(txt, "fillfactor=50"));
    catalog_text(c,
                 "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = "
                 "'obx.obx_attempt'::regclass",
                 txt, sizeof txt);
    assert_string_equal(txt, "fillfactor=50");
    catalog_text(c,
                 "SELECT string_agg(tgname || ':' || CASE WHEN tgtype & 2 = 2 THEN 'before' "
                 "ELSE 'after' END, ' ' ORDER BY tgname) FROM pg_trigger WHERE tgname IN "
                 "('obx_event_frozen', 'obx_attempt_frozen')",
                 txt, sizeof txt);
    assert_string_equal(txt, "obx_attempt_frozen:after obx_event_frozen:after");
    catalog_text(c,
                 "SELECT string_agg(indexname, ' ' ORDER BY indexname) FROM pg_indexes WHERE "
                 "tablename = 'obx_receipt'",
                 txt, sizeof txt);
    assert_string_equal(txt, "obx_receipt_kind obx_receipt_pkey obx_receipt_primary");
    /* attempts in every situation */
    const char *att[][2] = {{"att-a", "UNKNOWN"}, {"att-b", "SENDING"}, {"att-c", "ACCEPTED"}};
    for (int i = 0; i < 3; i++) {
        snprintf(sql, sizeof sql,
                 "INSERT INTO obx.obx_attempt (attempt_id, event_id, envelope_gen, attempt_gen, "
                 "claim_gen, owner, dest_digest, partition, state, started_at, unknown_at, "
                 "ended_at, offset_before, quiet_until, detail) VALUES ('%s', '%s', 1, %d, 1, "
                 "'r1', 'sha256:x', 0, '%s', 1, 0, 0, -1, 0, '')",
                 att[i][0], ev[0], i + 1, att[i][1]);
        exec_ok(c, sql);
    }
    const char *unknown_stat = "SELECT v FROM obx._stats() WHERE k = 'attempts_unknown'";
    assert_int_equal(qint(c, unknown_stat), 1);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_attempt WHERE unknown_open"), 1);
    assert_int_equal(qint(c, "SELECT count(*) FROM pg_indexes WHERE schemaname = 'obx' AND "
                             "tablename = 'obx_attempt' AND indexdef LIKE '%state%'"),
                     0);
    assert_true(plan_uses(c, "SELECT attempt_id FROM obx.obx_attempt WHERE unknown_open",
                          "obx_attempt_unknown_open"));
    /* SENDING -> ACCEPTED, as the acceptance writes it: heap-only; UNKNOWN -> ACCEPTED leaves
     * the unknown index, so it is not; the transaction's own counters say which */
    exec_ok(c, "BEGIN");
    exec_ok(c, "UPDATE obx.obx_attempt SET state = 'ACCEPTED', ended_at = 2, detail = 'acked' "
               "WHERE attempt_id = 'att-b'");
    assert_int_equal(qint(c, "SELECT n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = "
                             "'obx.obx_attempt'::regclass"),
                     1);
    exec_ok(c, "UPDATE obx.obx_attempt SET state = 'ACCEPTED', ended_at = 2 WHERE attempt_id = "
               "'att-a'");
    assert_int_equal(qint(c, "SELECT n_tup_upd - n_tup_hot_upd FROM pg_stat_xact_user_tables "
                             "WHERE relid = 'obx.obx_attempt'::regclass"),
                     1);
    exec_ok(c, "COMMIT");
    assert_int_equal(qint(c, unknown_stat), 0);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_attempt WHERE unknown_open"), 0);
    /* the column is derived: nobody writes it */
    refused(c, "UPDATE obx.obx_attempt SET unknown_open = true WHERE attempt_id = 'att-c'", "428C9",
            "unknown_open");
    /* a second primary receipt for the event is a conflict, a duplicate receipt is not */
    obx__receipt_row rc = {.envelope_gen = 1, .kind = OBX__RK_PRIMARY, .offset = 1};
    strcpy(rc.event_id, ev[0]);
    strcpy(rc.attempt_id, "att-b");
    OK(obx__st_begin(f->s));
    OK(obx__st_insert_receipts(f->s, &rc, 1));
    OK(obx__st_commit(f->s));
    rc.offset = 2;
    OK(obx__st_begin(f->s));
    assert_int_equal(obx__st_insert_receipts(f->s, &rc, 1), OBX_ECONFLICT);
    OK(obx__st_rollback(f->s));
    rc.kind = OBX__RK_DUPLICATE;
    OK(obx__st_begin(f->s));
    OK(obx__st_insert_receipts(f->s, &rc, 1));
    OK(obx__st_commit(f->s));
    obx__receipt_row *got = NULL;
    size_t n = 0;
    OK(obx__st_load_receipts(f->s, ev[0], &got, &n));
    assert_int_equal(n, 2);
    assert_int_equal(got[0].kind, OBX__RK_PRIMARY);
    assert_int_equal(got[1].kind, OBX__RK_DUPLICATE);
    free(got);
    /* the one index answers a lookup of an event's receipts */
    snprintf(sql, sizeof sql, "SELECT * FROM obx.obx_receipt WHERE event_id = '%s'", ev[0]);
    assert_true(plan_uses(c, sql, "obx_receipt_primary"));
    stats_exact(f->s, c);
}

/* IDs and digests in SQL. obx.enqueue() draws its IDs as ULIDs whose time is now (in C with the
 * obx_pg extension, src/core/ulid.c; its PL/pgSQL body and obx._event_id() by obx._ulid, whose
 * random part is 16 upper-case hexadecimal digits), and obx._event_id() refuses a time out of
 * range. The digests every body writes are the bytes of the reference functions
 * obx.envelope_digest and obx.dest_digest and of the C code (src/core/canon.c), recomputed here
 * from the stored fields. The statistics deltas fold (obx._compact_stats, by ctid) into one row
 * per key without losing a count. */
static void test_sql_ids_digests(void **state) {
    fx *f = *state;
    PGconn *c = f->conn;
    char st[6], ids[3][64], tid[2][64];
    obx_route rt = {.event_type = "order.created.v2",
                    .cluster = "local",
                    .topic = "orders",
                    .routing_key = "{tenant}.{aggregate_id}"};
    OK(obx_route_set(f->s, &rt, NULL));
    int64_t t0 = obx__wall_ms();
    enqueue_sql(c, 2, ids);
    const char *draws[] = {"SELECT obx._enqueue_sql('order.created.v2', 'order', 'o-2', 1, 't', "
                           "'\\x7b7d')",
                           "SELECT obx._event_id(floor(extract(epoch FROM clock_timestamp()) * "
                           "1000)::bigint)"};
    for (int i = 0; i < 2; i++) {
        PGresult *r = PQexec(c, draws[i]);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s: %s", draws[i], PQerrorMessage(c));
        snprintf(tid[i], sizeof tid[i], "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
    }
    snprintf(ids[2], sizeof ids[2], "%s", tid[0]);
    int64_t t1 = obx__wall_ms();
    const char *fresh[4] = {ids[0], ids[1], tid[0], tid[1]};
    for (int i = 0; i < 4; i++) {
        OK(obx_event_id_check(fresh[i]));
        int64_t t = obx__ulid_time(fresh[i] + 4);
        assert_true(t >= t0 - 5 && t <= t1 + 5);
        for (int k = 0; k < i; k++) assert_string_not_equal(fresh[i], fresh[k]);
    }
    for (int i = 0; i < 2; i++) assert_int_equal(strspn(tid[i] + 14, "0123456789ABCDEF"), 16);
    exec_fail(c, "SELECT obx._event_id(-1)", st, NULL, 0);
    assert_string_equal(st, "OB002");
    exec_fail(c, "SELECT obx._event_id(1::bigint << 48)", st, NULL, 0);
    assert_string_equal(st, "OB002");
    /* every envelope's digests are the reference functions' */
    assert_int_equal(
        qint(c, "SELECT count(*) FROM obx.obx_envelope WHERE envelope_digest = "
                "obx.envelope_digest(event_id, envelope_gen, aggregate_type, aggregate_id, "
                "aggregate_version, event_type, payload_schema, payload_digest, tenant, "
                "occurred_at, created_txid, correlation_id, causation_id, traceparent, "
                "idempotency_key) AND dest_digest = obx.dest_digest(dest_cluster, dest_topic, "
                "dest_routing_key, dest_algorithm, dest_route_gen, dest_serializer, "
                "dest_durability, dest_acks)"),
        3);
    /* and the C code's */
    obx__rows rows = {0};
    const char *rid[3] = {ids[0], ids[1], ids[2]};
    OK(obx__st_load_events(f->s, rid, 3, OBX__LOAD_PAYLOAD, &rows));
    assert_int_equal(rows.n, 3);
    char d[OBX_DIGEST_LEN + 1], rk[16];
    for (size_t k = 0; k < rows.n; k++) {
        OK(obx__dest_digest(&rows.v[k].dest, d));
        assert_string_equal(d, rows.v[k].dest_digest);
        OK(obx__envelope_digest(&rows.v[k].env, d));
        assert_string_equal(d, rows.v[k].envelope_digest);
        snprintf(rk, sizeof rk, "t.%s", rows.v[k].env.aggregate_id);
        assert_string_equal(rows.v[k].dest.routing_key, rk);
    }
    obx__rows_free(&rows);
    /* the fold: every delta row, one per key left, the counts unchanged */
    exec_ok(c, "INSERT INTO obx.obx_stat_delta (key, n) VALUES ('state:PENDING', 0)");
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_stat_delta"), 4);
    exec_ok(c, "SELECT obx._compact_stats()");
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_stat_delta"), 1); /* state:PENDING 3 */
    stats_exact(f->s, c);
}

/* What the least-privilege roles of obx.create_roles() do through obx's own paths (test_roles
 * has what they may not do). The producer's first row of each event is recorded in the
 * envelope under its login, obx.producer_events finds its events and no other, and it reaches
 * obx.enqueue()'s bodies only through obx.enqueue(). The relay files its audit rows as one batch
 * under the range of the events' seqs (or looks the seq up), holds an event for an operator,
 * registers its cluster and moves an event to a new envelope generation (obx migrate). The
 * auditor reads every audit row. An audit row that is not the producer's own is written as a
 * row, and read back as given. */
static void test_roles_write_paths(void **state) {
    fx *f = *state;
    PGconn *c = f->conn;
    char pre[32], sql[512], urls[3][1300], me[128], got[256], prod_login[80];
    snprintf(pre, sizeof pre, "obxw%d", (int)getpid());
    OK(obx_store_create_roles(f->s, pre));
    const char *kinds[] = {"producer", "relay", "auditor"};
    for (int i = 0; i < 3; i++) login_role(c, f->db, pre, kinds[i], urls[i]);
    snprintf(prod_login, sizeof prod_login, "%s_producer_login", pre);
    catalog_text(c, "SELECT session_user", me, sizeof me);
    /* the producer's event and the owner's: mine, theirs, one to hold, one to migrate, one to
     * write again by hand */
    PGconn *p = connect_url(urls[0]);
    char ev[5][64];
    enqueue_sql(p, 1, &ev[0]);
    enqueue_sql(c, 4, &ev[1]);
    check_first_row(f->s, c, ev[0], prod_login);
    check_first_row(f->s, c, ev[1], me);
    assert_int_equal(qint(p, "SELECT count(*) FROM obx.producer_events"), 1);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM obx.producer_events WHERE event_id = '%s'",
             ev[0]);
    assert_int_equal(qint(p, sql), 1);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_audit_all WHERE from_state = 'NONE' "
                             "AND audit_id IS NULL AND actor = 'producer' AND reason = "
                             "'enqueued under route generation 1'"),
                     5);
    refused(p, "SELECT obx._enqueue_sql('order.created.v2', 'order', 'o-x', 1, 't', '\\x7b7d')",
            "42501", "permission denied");
    PQfinish(p);
    /* the relay claims two events: one batch, filed under their seqs */
    obx_store *rs;
    OK(obx_store_open(urls[1], &rs));
    obx__event_row rows[2];
    obx__event_update u[2];
    obx__audit_row au[2];
    bool applied[2];
    for (int i = 0; i < 2; i++) {
        rows[i] = load1(rs, ev[i], 0);
        u[i] = (obx__event_update){&rows[i], rows[i].state, rows[i].claim_gen};
        rows[i].state = OBX__ST_CLAIMED;
        rows[i].claim_gen++;
        au[i] = (obx__audit_row){.at = 3,
                                 .actor = OBX__ACT_DISPATCHER,
                                 .envelope_gen = 1,
                                 .from = OBX__ST_PENDING,
                                 .to = OBX__ST_CLAIMED,
                                 .claim_gen = rows[i].claim_gen};
        strcpy(au[i].who, "r1");
        strcpy(au[i].event_id, ev[i]);
        strcpy(au[i].reason, "claimed");
        au[i].seq = rows[i].seq; /* filed under the seqs given */
    }
    OK(obx__st_begin(rs));
    OK(obx__st_update_events(rs, u, 2, applied));
    OK(obx__st_insert_audit(rs, au, 2));
    OK(obx__st_commit(rs));
    assert_true(applied[0] && applied[1]);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_audit_batch"), 1);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM obx.obx_audit_batch WHERE seqs = int8range(%lld, %lld, '[]')",
             (long long)rows[0].seq, (long long)rows[1].seq);
    assert_int_equal(qint(c, sql), 1);
    trail(f->s, ev[0], got, sizeof got);
    assert_string_equal(got, "NONE>PENDING PENDING>CLAIMED");
    /* a row whose seq the writer does not know: looked up */
    au[1].from = OBX__ST_CLAIMED;
    au[1].seq = 0;
    strcpy(au[1].reason, "a stale report, refused");
    OK(obx__st_begin(rs));
    OK(obx__st_insert_audit(rs, &au[1], 1));
    OK(obx__st_commit(rs));
    trail(f->s, ev[1], got, sizeof got);
    assert_string_equal(got, "NONE>PENDING PENDING>CLAIMED CLAIMED>CLAIMED");
    /* the relay holds an event for an operator and registers its cluster */
    obx__event_row held = load1(rs, ev[2], 0);
    obx__event_update hu = {&held, held.state, held.claim_gen};
    held.state = OBX__ST_DISPATCH_UNKNOWN;
    held.held_at = 77;
    bool ok = false;
    OK(obx__st_update_events(rs, &hu, 1, &ok));
    assert_true(ok);
    obx__cluster_row k = {.seen_at = 1};
    strcpy(k.cluster, "local");
    strcpy(k.backend, "log");
    strcpy(k.lookup, "authoritative");
    strcpy(k.durability, "persistent,transient");
    strcpy(k.required_acks, "all,1");
    strcpy(k.serializer, "*");
    strcpy(k.relay, "r1");
    OK(obx__st_cluster_put(rs, &k));
    assert_int_equal(qint(c, "SELECT v FROM obx._stats() WHERE k = 'held'"), 1);
    assert_int_equal(qint(c, "SELECT v FROM obx._stats() WHERE k = 'oldest_held'"), 77);
    /* and moves an event to a new envelope generation (obx migrate) */
    obx_route moved = {.event_type = "order.created.v2", .cluster = "local", .topic = "orders-v2"};
    int64_t g2;
    OK(obx_route_set(f->s, &moved, &g2));
    const char *mids[] = {ev[3]};
    obx_migrate_request mr = {.event_ids = mids, .n_event_ids = 1, .route_gen = g2, .who = "ops"};
    char *mout = NULL;
    OK(obx_migrate(rs, NULL, NULL, 0, &mr, &mout));
    assert_non_null(strstr(mout, "\"migrated\""));
    assert_non_null(strstr(mout, "never_sent"));
    obx_free(mout);
    assert_int_equal(load1(f->s, ev[3], 0).envelope_gen, 2);
    obx_store_close(rs);
    /* an audit row that the envelope cannot record (not the producer's NONE -> PENDING of this
     * row) is an obx_audit row, read back as given */
    obx__event_row r = load1(f->s, ev[4], 0);
    OK(obx_event_id_new(0, r.env.event_id));
    obx__audit_row x = {.at = r.committed_at,
                        .actor = OBX__ACT_OPERATOR,
                        .envelope_gen = 1,
                        .from = OBX__ST_NONE,
                        .to = OBX__ST_PENDING};
    snprintf(x.who, sizeof x.who, "carol");
    snprintf(x.event_id, sizeof x.event_id, "%s", r.env.event_id);
    snprintf(x.reason, sizeof x.reason, "re-created by hand");
    OK(obx__st_begin(f->s));
    OK(obx__st_insert_event_audit(f->s, &r, "{}", 2, &x));
    OK(obx__st_commit(f->s));
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM obx.obx_envelope WHERE event_id = '%s' AND created_by IS NULL",
             r.env.event_id);
    assert_int_equal(qint(c, sql), 1);
    obx__audit_row *a = NULL;
    size_t n = 0;
    OK(obx__st_load_audit(f->s, r.env.event_id, &a, &n));
    assert_int_equal(n, 1);
    assert_string_equal(a[0].who, "carol");
    assert_string_equal(a[0].reason, "re-created by hand");
    assert_int_equal(a[0].actor, OBX__ACT_OPERATOR);
    free(a);
    /* the auditor reads every audit row */
    PGconn *ad = connect_url(urls[2]);
    long long all = qint(c, "SELECT count(*) FROM obx.obx_audit_all");
    assert_true(all >= 5 + 2 + 1 + 1);
    assert_int_equal(qint(ad, "SELECT count(*) FROM obx.obx_audit_all"), all);
    PQfinish(ad);
    stats_exact(f->s, c);
}

/* a relay's connection that reads the schema version while holding it (pg_schema_hold), in a
 * thread: the version it read and when */
typedef struct {
    const char *url;
    obx__store *s;
    int found;
    obx_err err;
    int done; /* atomic */
} hold_arg;

static void *hold_thread(void *p) {
    hold_arg *a = p;
    a->err = obx__st_open(a->url, &a->s);
    if (!a->err) a->err = obx__st_schema_hold(a->s, &a->found);
    __atomic_store_n(&a->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* the number of sessions holding the schema-in-use lock of database db (pg_store.c,
 * LOCK_SCHEMA_IN_USE), waited for down to at most `most` (qint_down_to) */
static long long schema_holders(const char *db, long long most) {
    char sql[320];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database WHERE "
             "l.locktype = 'advisory' AND l.classid = 5194329 AND l.objid = 1 AND l.granted AND "
             "d.datname = '%s'",
             db);
    return qint_down_to(admin, sql, most);
}

/* ---- upgrades (docs/operations.md, "Upgrading obx") -------------------------------------------
 */

/* A relay's connection holds the schema version it checked, so `obx init` does not migrate
 * under a running relay. Until a release brings schema version 2, the upgrade here is made up:
 * the store's migrate with a script table of one more version (obx__pg_migrate_to), whose script
 * adds a table. `obx init` refuses with OBX_EBUSY, naming the relay's server process, and
 * changes nothing; with the relay gone it migrates, from the version the database has, by the
 * scripts after it. An init with nothing to migrate does not care. A relay that starts while a
 * migration runs waits for its commit and reads the version it committed: not the old one,
 * which its statement's snapshot would have shown had the lock and the read been one
 * statement. */
static void test_init_refuses_under_relay(void **state) {
    fx *f = *state;
    PGconn *c = f->conn;
    char rurl[1300], sql[160];
    extern const char obx__pg_schema[];
    const char *const next[] = {NULL, obx__pg_schema, "CREATE TABLE obx.obx_next (n int)"};
    const char *has_next = "SELECT (to_regclass('obx.obx_next') IS NOT NULL)::int";
    const char *version = "SELECT value::int FROM obx.obx_meta WHERE key = 'schema_version'";
    db_url(f->db, "application_name=obx-held-relay", rurl, sizeof rurl);
    obx__store *relay = NULL;
    OK(obx__st_open(rurl, &relay));
    int found = 0;
    OK(obx__st_schema_hold(relay, &found));
    assert_int_equal(found, OBX__SCHEMA_VERSION);
    assert_int_equal(schema_holders(f->db, 1), 1);
    long long pid =
        qint(c, "SELECT pid FROM pg_stat_activity WHERE application_name = 'obx-held-relay'");
    obx_store *s = NULL;
    OK(obx_store_open(f->url, &s));
    assert_int_equal(obx__pg_migrate_to(s, next, OBX__SCHEMA_VERSION + 1), OBX_EBUSY);
    char want[48], to[32];
    snprintf(want, sizeof want, "(server pids: %lld", pid);
    snprintf(to, sizeof to, "to version %d", OBX__SCHEMA_VERSION + 1);
    if (!strstr(obx_errmsg(), want) || !strstr(obx_errmsg(), "stop the relays") ||
        !strstr(obx_errmsg(), "schema version 1 ") || !strstr(obx_errmsg(), to))
        fail_msg("refusal: %s", obx_errmsg());
    assert_int_equal(qint(c, version), OBX__SCHEMA_VERSION);
    assert_int_equal(qint(c, has_next), 0);
    obx__st_close(relay);
    assert_int_equal(schema_holders(f->db, 0), 0);
    OK(obx__pg_migrate_to(s, next, OBX__SCHEMA_VERSION + 1));
    assert_int_equal(qint(c, version), OBX__SCHEMA_VERSION + 1);
    assert_int_equal(qint(c, has_next), 1);
    /* with nothing to migrate, a relay holding the schema is no obstacle */
    OK(obx__st_open(rurl, &relay));
    OK(obx__st_schema_hold(relay, &found));
    assert_int_equal(found, OBX__SCHEMA_VERSION + 1);
    OK(obx__pg_migrate_to(s, next, OBX__SCHEMA_VERSION + 1));
    obx__st_close(relay);
    /* a relay starting during a migration (here: one that records version 99) */
    exec_ok(c, "BEGIN");
    exec_ok(c, "SELECT pg_advisory_xact_lock(5194329, 1)");
    exec_ok(c, "UPDATE obx.obx_meta SET value = '99' WHERE key = 'schema_version'");
    db_url(f->db, "application_name=obx-late-relay", rurl, sizeof rurl);
    hold_arg h = {.url = rurl};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, hold_thread, &h), 0);
    assert_int_equal(wait_lock_waiter("obx-late-relay"), 0);
    assert_int_equal(__atomic_load_n(&h.done, __ATOMIC_SEQ_CST), 0);
    exec_ok(c, "COMMIT");
    pthread_join(t, NULL);
    OK(h.err);
    assert_int_equal(h.found, 99);
    obx__st_close(h.s);
    snprintf(sql, sizeof sql, "UPDATE obx.obx_meta SET value = '%d' WHERE key = 'schema_version'",
             OBX__SCHEMA_VERSION);
    exec_ok(c, sql);
    obx_store_close(s);
}

/* ---- schema versions --------------------------------------------------------------------------
 */

static void test_schema_versions(void **state) {
    fx *f = *state;
    int found = 0, known = 0;
    OK(obx_store_schema_version(f->s, &found, &known));
    assert_int_equal(found, known);
    OK(obx_store_init(f->s));
    exec_ok(f->conn, "UPDATE obx.obx_meta SET value = '99' WHERE key = 'schema_version'");
    assert_int_equal(obx_store_init(f->s), OBX_ESCHEMA);
    assert_non_null(strstr(obx_errmsg(), "version 99 is newer"));
    /* a fresh database starts at 0; init inside a caller's transaction rolls back with it */
    char db[64], url[1200];
    assert_int_equal(new_db(db, NULL), 0);
    db_url(db, "", url, sizeof url);
    PGconn *c = connect_url(url);
    obx_store *w;
    OK(obx_store_wrap_pg(c, &w));
    OK(obx_store_schema_version(w, &found, NULL));
    assert_int_equal(found, 0);
    exec_ok(c, "BEGIN");
    OK(obx_store_init(w));
    OK(obx_store_schema_version(w, &found, NULL));
    assert_int_equal(found, known);
    exec_ok(c, "ROLLBACK");
    OK(obx_store_schema_version(w, &found, NULL));
    assert_int_equal(found, 0);
    OK(obx_store_init(w));
    OK(obx_store_schema_version(w, &found, NULL));
    assert_int_equal(found, known);
    obx_store_close(w);
    PQfinish(c);
    /* a database that does not store UTF-8 is refused */
    assert_int_equal(new_db(db, "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE "
                                "template0"),
                     0);
    db_url(db, "", url, sizeof url);
    obx_store *s;
    OK(obx_store_open(url, &s));
    assert_int_equal(obx_store_init(s), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "UTF8"));
    obx_store_close(s);
    /* a server that is not there */
    assert_int_equal(obx_store_open("postgres://postgres@127.0.0.1:1/x?connect_timeout=2", &s),
                     OBX_ECONNLOST);
}

/* ---- main
 * ---------------------------------------------------------------------------------------- */

int main(void) {
    obx_t_pg pg;
    if (obx_t_pg_open(&pg, "test_store_pg", NULL)) return 1;
    snprintf(base_url, sizeof base_url, "%s", pg.url);
    admin = pg.admin;
    int64_t t0 = obx__mono_ms();
    int failed = store_conformance_run("store conformance: postgres", pg_factory);
    int64_t t1 = obx__mono_ms();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_commit_together, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rollback_together, setup, teardown),
        cmocka_unit_test_setup_teardown(test_caller_tx_survives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_one_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_server_fault, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_own_one_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_producer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frozen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency_concurrent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency_concurrent_sql, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seq_is_commit_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_digest_vectors_sql, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_matches_c, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_key_matches_c, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_body_matches_c, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_delay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_body_delay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_without_extension, setup, teardown),
        cmocka_unit_test_setup_teardown(test_extension_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_route_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_route_schema_remade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_set_schema_remade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_validation_parity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_psql_producer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notify_wakes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notify_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wake_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_latch_wake, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connection_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_mapping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_skip_locked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dispatch_plans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dispatch_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_throughput, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_semantics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_write_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schema_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_delivery_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schema_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relay_tables_storage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_ids_digests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roles_write_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_refuses_under_relay, setup, teardown),
    };
    failed += cmocka_run_group_tests_name("postgres store", tests, NULL, NULL);
    /* the engine's fault suite (docs/design.md, "Tests per fault") on this store */
    failed += engine_fault_run("engine faults: postgres", pg_factory);
    /* destination migration, delivery sets, shadow mode and takeover on this store */
    failed +=
        engine_migration_run("migration, delivery sets, shadow, takeover: postgres", pg_factory);
    /* delayed events and their cancellation on this store */
    failed += engine_delay_run("delayed events: postgres", pg_factory);
    int64_t t2 = obx__mono_ms();
    printf("test_store_pg: conformance %lld ms, postgres-specific %lld ms\n", (long long)(t1 - t0),
           (long long)(t2 - t1));
    for (int i = 0; i < db_count && i < 256; i++) {
        char sql[128];
        snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", created[i]);
        admin_exec(sql);
    }
    PQfinish(admin);
    return failed;
}
