/*
 * test_pg_hardening.c — obx's code inside the customer's PostgreSQL, tried as an attacker
 * holding one of obx's roles would (issue 53; docs/security.md). On a real PostgreSQL
 * (OBX_TEST_PG_URL, a superuser; scripts/services.sh) with the obx_pg extension and its test
 * build obx_pg_counters installed (`cmake --install build --component obx_pg`). Fails, never
 * skips, without them. One test per finding:
 *
 *   route_slot_wrap     the extension's route-cache counter past 2^31 (the test build starts it
 *                       there): every enqueue still written, the server still up;
 *   foreign_schema      `obx init` refuses an obx schema another role owns, naming the owner,
 *                       and creates it owned by the role that runs it;
 *   producer_view_barrier  a producer's function over obx.producer_events sees its rows only;
 *   dropped_role_grant  a grant row of a dropped role denies nobody else and grants nothing;
 *   failed_after_applied  obx.inbox_failed() on an event another instance applied: 'duplicate';
 *   payload_limit_owner_only  a producer's session setting does not raise the payload limit;
 *   idempotency_conflict  another event under a taken idempotency key is refused (OB005);
 *   two_phase_commit    obx.enqueue() in a transaction prepared while a relay waits;
 *   order_lock_per_key  an open transaction does not block producers of unrelated keys.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/pg_fx.h"
#include "support/support.h"

#include "engine/engine.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *base_url;
static PGconn *admin;
static char port[16];
static int dbs;

static void sql(PGconn *c, const char *q) { obx_t_pg_sql(c, q); }

static void sqlf(PGconn *c, const char *fmt, ...) {
    char q[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q, sizeof q, fmt, ap);
    va_end(ap);
    sql(c, q);
}

/* The first column of the one row of q, as text into out. */
static const char *qtext(PGconn *c, const char *q, char *out, size_t cap) {
    PGresult *r = PQexec(c, q);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        fail_msg("%s: %s", q, PQerrorMessage(c));
    snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return out;
}

static long long qint(PGconn *c, const char *q) { return obx_t_pg_qint(c, q); }

/* SQLSTATE of a statement that must fail ("" when it succeeded); its message into msg. */
static void sqlstate(PGconn *c, const char *q, char st[6], char *msg, size_t cap) {
    PGresult *r = PQexec(c, q);
    st[0] = '\0';
    if (msg) msg[0] = '\0';
    if (PQresultStatus(r) == PGRES_FATAL_ERROR) {
        const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        snprintf(st, 6, "%s", s ? s : "?????");
        if (msg) snprintf(msg, cap, "%s", PQerrorMessage(c));
    }
    PQclear(r);
}

static PGconn *connect_or_fail(const char *url) {
    PGconn *c = obx_t_pg_connect(url);
    sql(c, "SET client_min_messages = warning");
    return c;
}

/* A new, empty database (its name into db) and the URL of user in it (url). */
static void new_db(char *db, const char *user, char *url, size_t cap) {
    snprintf(db, 48, "obx_hard_%d_%d", (int)getpid(), ++dbs);
    sqlf(admin, "CREATE DATABASE %s", db);
    snprintf(url, cap, "postgres://%s@127.0.0.1:%s/%s", user, port, db);
}

static void drop_db(const char *db) { sqlf(admin, "DROP DATABASE IF EXISTS %s WITH (FORCE)", db); }

/* A new database with obx's schema, initialized by the superuser; its store into *s. */
static PGconn *new_outbox(char *db, obx_store **s) {
    char url[512];
    new_db(db, "postgres", url, sizeof url);
    OK(obx_store_open(url, s));
    OK(obx_store_init(*s));
    return connect_or_fail(url);
}

/* ---- finding 1: the route cache's slot counter past 2^31 ---------------------------------- */

/* 50 enqueues rotating 20 event types (each a cache miss once the 16 slots are full) through
 * the test build, whose counter starts 8 below 2^31. A signed counter went negative there and
 * the write through the negative slot killed the backend, and with it every backend of the
 * server. */
static void test_route_slot_wrap(void **st) {
    (void)st;
    char db[48];
    obx_store *s;
    PGconn *c = new_outbox(db, &s);
    for (int i = 0; i < 20; i++) {
        char type[32];
        snprintf(type, sizeof type, "t%d.v1", i);
        obx_route rt = {.event_type = type, .cluster = "local", .topic = "orders"};
        OK(obx_route_set(s, &rt, NULL));
    }
    sql(c, "CREATE FUNCTION obx._enqueue_c_counters(text, text, text, bigint, text, bytea, "
           "text, text, text, text, text, timestamptz) RETURNS text LANGUAGE c VOLATILE AS "
           "'$libdir/obx_pg_counters', 'obx_pg_enqueue'");
    for (int i = 0; i < 50; i++) {
        char q[512];
        snprintf(q, sizeof q,
                 "SELECT obx._enqueue_c_counters('t%d.v1', 'order', 'o-%d', 1, 'tenant', "
                 "'\\x7b7d', NULL, NULL, NULL, NULL, NULL, NULL)",
                 i % 20, i);
        PGresult *r = PQexec(c, q);
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            fail_msg("enqueue %d of 50: %s", i + 1, PQerrorMessage(c));
        PQclear(r);
    }
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event"), 50);
    assert_int_equal(qint(c, "SELECT count(DISTINCT event_type) FROM obx.obx_envelope"), 20);
    assert_int_equal(qint(admin, "SELECT 1"), 1); /* the server did not restart */
    PQfinish(c);
    obx_store_close(s);
    drop_db(db);
}

/* ---- finding 2: an obx schema someone else made first -------------------------------------- */

/* A role with CREATE on the database makes the schema obx before `obx init`: init refuses it,
 * naming its owner, and creates nothing in it (as its owner that role could replace any
 * function the producers' obx.enqueue() then runs). Without it, init creates the schema owned
 * by the role that runs init. */
static void test_foreign_schema(void **st) {
    (void)st;
    char db[48], url[512], squat[512];
    new_db(db, "postgres", url, sizeof url);
    sql(admin, "DROP ROLE IF EXISTS obx_hard_squatter");
    sql(admin, "CREATE ROLE obx_hard_squatter LOGIN");
    sqlf(admin, "GRANT CREATE ON DATABASE %s TO obx_hard_squatter", db);
    snprintf(squat, sizeof squat, "postgres://obx_hard_squatter@127.0.0.1:%s/%s", port, db);
    PGconn *sq = connect_or_fail(squat);
    sql(sq, "CREATE SCHEMA obx");
    PQfinish(sq);
    obx_store *s;
    OK(obx_store_open(url, &s));
    assert_int_equal(obx_store_init(s), OBX_EREFUSED);
    if (!strstr(obx_errmsg(), "obx_hard_squatter")) fail_msg("no owner named: %s", obx_errmsg());
    obx_store_close(s);
    PGconn *c = connect_or_fail(url);
    assert_int_equal(
        qint(c, "SELECT count(*) FROM pg_class WHERE relnamespace = 'obx'::regnamespace"), 0);
    assert_int_equal(
        qint(c, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'obx'::regnamespace"), 0);
    /* dropped by its owner, the schema is init's to make, and init's role owns it */
    sql(c, "DROP SCHEMA obx");
    OK(obx_store_open(url, &s));
    OK(obx_store_init(s));
    OK(obx_store_init(s)); /* again: its own schema */
    obx_store_close(s);
    char owner[64];
    assert_string_equal(qtext(c, "SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'obx'",
                              owner, sizeof owner),
                        "postgres");
    PQfinish(c);
    drop_db(db);
    sql(admin, "DROP ROLE obx_hard_squatter");
}

/* ---- finding 3: a producer's function in the WHERE clause of obx.producer_events ----------- */

static char notices[16384];

static void keep_notice(void *arg, const char *m) {
    (void)arg;
    size_t n = strlen(notices);
    snprintf(notices + n, sizeof notices - n, "%s", m);
}

/* The roles of prefix obxh (obx.create_roles) in the outbox of s, and login roles
 * obx_hard_prod_a and obx_hard_prod_b in obxh_producer. */
static void producers(obx_store *s) {
    OK(obx_store_create_roles(s, "obxh"));
    sql(admin, "DROP ROLE IF EXISTS obx_hard_prod_a, obx_hard_prod_b");
    sql(admin, "CREATE ROLE obx_hard_prod_a LOGIN IN ROLE obxh_producer");
    sql(admin, "CREATE ROLE obx_hard_prod_b LOGIN IN ROLE obxh_producer");
}

static void drop_producers(void) {
    sql(admin, "DROP ROLE obx_hard_prod_a, obx_hard_prod_b");
    sql(admin, "DROP ROLE obxh_producer, obxh_relay, obxh_auditor, obxh_consumer");
}

static PGconn *connect_as(const char *db, const char *user) {
    char url[512];
    snprintf(url, sizeof url, "postgres://%s@127.0.0.1:%s/%s", user, port, db);
    return connect_or_fail(url);
}

/* Producer A's own cheap function in a WHERE clause over obx.producer_events sees only A's
 * rows: the view is a security barrier, so its filter runs first. Before, the planner ran the
 * cheaper function first, on every row, and it printed B's tenant, aggregate and keys. */
static void test_producer_view_barrier(void **st) {
    (void)st;
    char db[48];
    obx_store *s;
    PGconn *c = new_outbox(db, &s);
    obx_route rt = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    OK(obx_route_set(s, &rt, NULL));
    producers(s);
    PGconn *a = connect_as(db, "obx_hard_prod_a"), *b = connect_as(db, "obx_hard_prod_b");
    sql(a, "SELECT obx.enqueue('order.created.v1', 'order', 'o-a', 1, 'tenant-a', '\\x7b7d')");
    sql(b, "SELECT obx.enqueue('order.created.v1', 'order', 'o-secret', 1, 'tenant-secret', "
           "'\\x7b7d', NULL, 'corr-secret', NULL, NULL, 'key-secret')");
    sql(a, "CREATE FUNCTION pg_temp.peek(text) RETURNS boolean LANGUAGE plpgsql COST 0.0001 AS "
           "$$ BEGIN RAISE WARNING 'peek %', $1; RETURN true; END $$");
    notices[0] = '\0';
    PQsetNoticeProcessor(a, keep_notice, NULL);
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.producer_events WHERE "
                             "pg_temp.peek(tenant || ' ' || aggregate_id || ' ' || "
                             "coalesce(idempotency_key, '') || ' ' || correlation_id)"),
                     1);
    if (strstr(notices, "secret")) fail_msg("producer A saw B's event:\n%s", notices);
    assert_non_null(strstr(notices, "tenant-a")); /* the function did run, on A's row */
    PQfinish(a);
    PQfinish(b);
    PQfinish(c);
    obx_store_close(s);
    drop_db(db);
    drop_producers();
}

/* ---- finding 4: a grant row whose role was dropped ---------------------------------------- */

/* DROP ROLE leaves the role's rows in obx.obx_consumer_grant (role_name is text). The policies
 * resolved them with pg_has_role(name), which raises 42704 for a missing role, on every row
 * they looked at: every consumer of every tenant failed obx.inbox_receive() and stalled. Now a
 * missing role is nobody's: it grants nothing and breaks nobody. */
static void test_dropped_role_grant(void **st) {
    (void)st;
    char db[48];
    obx_store *s;
    PGconn *c = new_outbox(db, &s);
    OK(obx_store_create_roles(s, "obxh"));
    sql(admin, "DROP ROLE IF EXISTS obx_hard_cons_a, obx_hard_gone");
    sql(admin, "CREATE ROLE obx_hard_cons_a LOGIN IN ROLE obxh_consumer");
    sql(admin, "CREATE ROLE obx_hard_gone LOGIN IN ROLE obxh_consumer");
    sql(c, "INSERT INTO obx.obx_consumer_grant VALUES ('obx_hard_gone', 'proj-a', '*'), "
           "('obx_hard_cons_a', 'proj-a', 'tenant-a')");
    sql(admin, "DROP ROLE obx_hard_gone");
    PGconn *a = connect_as(db, "obx_hard_cons_a");
    char dec[32];
    sql(a, "BEGIN");
    qtext(a,
          "SELECT decision FROM obx.inbox_receive('proj-a', 'evt-01HZX3K9QW8E7R6T5Y4V3J2A01', 1, "
          "'sha256:' || encode(sha256('\\x7b7d'::bytea), 'hex'), 'orders', 0, 1, "
          "'\\x7b7d'::bytea, 'order.created.v1', 'tenant-a')",
          dec, sizeof dec);
    assert_string_equal(dec, "process");
    sql(a, "SELECT obx.inbox_applied('proj-a', 'evt-01HZX3K9QW8E7R6T5Y4V3J2A01', 'done')");
    sql(a, "COMMIT");
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_consumer_grant"), 1);
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_inbox"), 1);
    /* the stale row grants nothing: proj-a's tenant-b is still not A's (the database refuses
     * the receipt, and the SQL inbox parks the message) */
    sql(a, "BEGIN");
    qtext(a,
          "SELECT decision FROM obx.inbox_receive('proj-a', 'evt-01HZX3K9QW8E7R6T5Y4V3J2A02', 1, "
          "'sha256:' || encode(sha256('\\x7b7d'::bytea), 'hex'), 'orders', 0, 2, "
          "'\\x7b7d'::bytea, 'order.created.v1', 'tenant-b')",
          dec, sizeof dec);
    sql(a, "COMMIT");
    assert_string_equal(dec, "poisoned");
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_inbox WHERE tenant = 'tenant-b'"), 0);
    char stt[6];
    sqlstate(a, "INSERT INTO obx.obx_consumer_grant VALUES ('obx_hard_gone', 'proj-b', '*')", stt,
             NULL, 0);
    assert_string_equal(stt, "42501");
    PQfinish(a);
    PQfinish(c);
    obx_store_close(s);
    drop_db(db);
    sql(admin, "DROP ROLE obx_hard_cons_a");
    sql(admin, "DROP ROLE obxh_producer, obxh_relay, obxh_auditor, obxh_consumer");
}

/* ---- finding 8: a stale consumer instance fails an event another instance applied ---------- */

#define RECEIVE_E1                                                                                 \
    "SELECT decision FROM obx.inbox_receive('proj', 'evt-01HZX3K9QW8E7R6T5Y4V3J2A01', 1, "         \
    "'sha256:' || encode(sha256('\\x7b7d'::bytea), 'hex'), 'orders', 0, 1, '\\x7b7d'::bytea, "     \
    "'order.created.v1', 'tenant-a')"

/* Instance A gets 'process' and rolls back (its handler failed), B gets 'process', applies and
 * commits, then A reports its failure as poison: the event is applied, so the answer is
 * 'duplicate' and nothing is parked; the next redelivery is a duplicate too. Before, A's call
 * parked the applied event ('poisoned') and every redelivery answered 'already parked'. */
static void test_failed_after_applied(void **st) {
    (void)st;
    char db[48], dec[32];
    obx_store *s;
    PGconn *a = new_outbox(db, &s);
    PGconn *b = connect_as(db, "postgres");
    sql(a, "BEGIN");
    assert_string_equal(qtext(a, RECEIVE_E1, dec, sizeof dec), "process");
    sql(a, "ROLLBACK");
    sql(b, "BEGIN");
    assert_string_equal(qtext(b, RECEIVE_E1, dec, sizeof dec), "process");
    sql(b, "SELECT obx.inbox_applied('proj', 'evt-01HZX3K9QW8E7R6T5Y4V3J2A01', 'done')");
    sql(b, "COMMIT");
    qtext(a,
          "SELECT decision FROM obx.inbox_failed('proj', 'evt-01HZX3K9QW8E7R6T5Y4V3J2A01', "
          "'cannot parse', 5, true)",
          dec, sizeof dec);
    assert_string_equal(dec, "duplicate");
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_poison"), 0);
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_inbox_failure"), 0);
    sql(a, "BEGIN");
    assert_string_equal(qtext(a, RECEIVE_E1, dec, sizeof dec), "duplicate");
    sql(a, "COMMIT");
    PQfinish(a);
    PQfinish(b);
    obx_store_close(s);
    drop_db(db);
}

/* ---- finding 6: the payload limit is not the producer's to raise ---------------------------- */

/* A producer's `SET obx.payload_limit` let a payload of any size through obx.enqueue(); the
 * limit is now obx.obx_meta's row payload_limit, which only the schema's owner writes. Through
 * both bodies (the C one falls back to the PL/pgSQL one over the limit). */
static void test_payload_limit_owner_only(void **st) {
    (void)st;
    char db[48], stt[6], msg[512];
    obx_store *s;
    PGconn *c = new_outbox(db, &s);
    obx_route rt = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    OK(obx_route_set(s, &rt, NULL));
    producers(s);
    PGconn *a = connect_as(db, "obx_hard_prod_a");
    static const char big[] = "SELECT obx.enqueue('order.created.v1', 'order', 'o', 1, 't', "
                              "convert_to(repeat('x', 2000000), 'UTF8'))";
    for (int body = 0; body < 2; body++) {
        sql(c, body ? "SELECT obx._point_enqueue(true)" : "SELECT obx._point_enqueue(false)");
        sql(a, "SET obx.payload_limit = '200000000'");
        sqlstate(a, big, stt, msg, sizeof msg);
        if (strcmp(stt, "OB003")) fail_msg("body %d: 2 MB payload: '%s' %s", body, stt, msg);
        assert_non_null(strstr(msg, "over the limit of 1048576 bytes"));
        sqlstate(a, "INSERT INTO obx.obx_meta VALUES ('payload_limit', '200000000')", stt, NULL, 0);
        assert_string_equal(stt, "42501");
        sqlstate(a, "UPDATE obx.obx_meta SET value = '200000000' WHERE key = 'payload_limit'", stt,
                 NULL, 0);
        assert_string_equal(stt, "42501");
        /* the owner's row is the limit */
        sql(c, "INSERT INTO obx.obx_meta VALUES ('payload_limit', '4')");
        sqlstate(a, "SELECT obx.enqueue('order.created.v1', 'order', 'o', 1, 't', '\\x3132333435')",
                 stt, msg, sizeof msg);
        assert_string_equal(stt, "OB003");
        assert_non_null(strstr(msg, "payload: 5 bytes, over the limit of 4 bytes"));
        sql(a, "SELECT obx.enqueue('order.created.v1', 'order', 'o', 1, 't', '\\x31323334')");
        sql(c, "DELETE FROM obx.obx_meta WHERE key = 'payload_limit'");
    }
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event"), 2);
    PQfinish(a);
    PQfinish(c);
    obx_store_close(s);
    drop_db(db);
    drop_producers();
}

/* ---- finding 9: another event under a taken idempotency key ---------------------------------- */

/* Producer A's key for tenant-b made producer B's real event with the same key answer A's
 * event ID and write nothing. Now another event under a taken key (another payload, aggregate
 * or type) is OB005, through both bodies; the same event again (a retried command) still gets
 * the first ID; keys are per tenant. */
static void test_idempotency_conflict(void **st) {
    (void)st;
    char db[48], stt[6], msg[512], first[64], again[64];
    obx_store *s;
    PGconn *c = new_outbox(db, &s);
    obx_route rt = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    OK(obx_route_set(s, &rt, NULL));
    producers(s);
    PGconn *a = connect_as(db, "obx_hard_prod_a"), *b = connect_as(db, "obx_hard_prod_b");
    for (int body = 0; body < 2; body++) {
        char q[512];
        sql(c, body ? "SELECT obx._point_enqueue(true)" : "SELECT obx._point_enqueue(false)");
#define ENQ(tenant, aid, payload)                                                                  \
    (snprintf(q, sizeof q,                                                                         \
              "SELECT obx.enqueue('order.created.v1', 'order', '%s', 1, '%s', '%s', NULL, NULL, "  \
              "NULL, NULL, 'key-%d')",                                                             \
              aid, tenant, payload, body),                                                         \
     q)
        qtext(a, ENQ("tenant-b", "o-1", "\\x7b7d"), first, sizeof first);
        sqlstate(b, ENQ("tenant-b", "o-1", "\\x5b5d"), stt, msg, sizeof msg);
        if (strcmp(stt, "OB005") || !strstr(msg, "with another payload"))
            fail_msg("body %d: another payload under a taken key: '%s' %s", body, stt, msg);
        sqlstate(b, ENQ("tenant-b", "o-2", "\\x7b7d"), stt, msg, sizeof msg);
        if (strcmp(stt, "OB005") || !strstr(msg, "with another aggregate"))
            fail_msg("body %d: another aggregate under a taken key: '%s' %s", body, stt, msg);
        assert_string_equal(qtext(b, ENQ("tenant-b", "o-1", "\\x7b7d"), again, sizeof again),
                            first);
        assert_string_not_equal(qtext(b, ENQ("tenant-c", "o-1", "\\x7b7d"), again, sizeof again),
                                first);
#undef ENQ
    }
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event"), 4);
    PQfinish(a);
    PQfinish(b);
    PQfinish(c);
    obx_store_close(s);
    drop_db(db);
    drop_producers();
}

/* ---- finding 7: two-phase commit while a relay waits ------------------------------------------
 */

/* A relay of the cluster waits (it holds the cluster's wake lock and listens): obx.enqueue()
 * through the C body, then PREPARE TRANSACTION, which refused a transaction that had executed
 * NOTIFY ('cannot PREPARE a transaction that has executed LISTEN, UNLISTEN, or NOTIFY'), so 2PC
 * failed exactly when a relay waited. Now the NOTIFY is sent at commit only: the prepared
 * transaction commits later with COMMIT PREPARED and its event is there; a plain commit still
 * wakes the relay. */
static void test_two_phase_commit(void **st) {
    (void)st;
    char db[48];
    obx_store *s;
    PGconn *c = new_outbox(db, &s);
    obx_route rt = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    OK(obx_route_set(s, &rt, NULL));
    sql(c, "SELECT obx._point_enqueue(true)");
    PGconn *relay = connect_as(db, "postgres"), *p = connect_as(db, "postgres");
    sql(relay, "SELECT pg_advisory_lock(5194330, hashtext('local'))");
    sql(relay, "LISTEN obx_work");
    sql(p, "BEGIN");
    sql(p, "SELECT obx.enqueue('order.created.v1', 'order', 'o-1', 1, 't', '\\x7b7d')");
    char gid[64];
    snprintf(gid, sizeof gid, "PREPARE TRANSACTION 'obx_hard_%d'", (int)getpid());
    sql(p, gid);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event"), 0);
    snprintf(gid, sizeof gid, "COMMIT PREPARED 'obx_hard_%d'", (int)getpid());
    sql(c, gid);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event"), 1);
    /* the PL/pgSQL body too (obx._wake defers to the commit where the database has obx_pg; it
     * used to NOTIFY inside the statement, and PREPARE refused the transaction) */
    sql(p, "BEGIN");
    sql(p, "SELECT obx._enqueue_sql('order.created.v1', 'order', 'o-1p', 1, 't', '\\x7b7d')");
    snprintf(gid, sizeof gid, "PREPARE TRANSACTION 'obx_hard_%d'", (int)getpid());
    sql(p, gid);
    snprintf(gid, sizeof gid, "COMMIT PREPARED 'obx_hard_%d'", (int)getpid());
    sql(c, gid);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_event"), 2);
    /* a plain commit wakes the waiting relay */
    sql(relay, "SELECT 1"); /* drains anything queued so far */
    while (PQnotifies(relay)) {
    }
    sql(p, "SELECT obx.enqueue('order.created.v1', 'order', 'o-2', 1, 't', '\\x7b7d')");
    int woken = 0;
    for (int i = 0; i < 50 && !woken; i++) {
        PQconsumeInput(relay);
        PGnotify *n = PQnotifies(relay);
        if (n) {
            woken = !strcmp(n->relname, "obx_work");
            PQfreemem(n);
        } else {
            usleep(20000);
        }
    }
    assert_true(woken);
    PQfinish(relay);
    PQfinish(p);
    PQfinish(c);
    obx_store_close(s);
    drop_db(db);
}

/* ---- finding 10: per-key order locks that do not block unrelated keys ----------------------- */

/* Two order keys whose hashes share one of the 1024 buckets (routing keys t1.o-<i>, topic
 * orders, cluster local): producer A enqueues the first and keeps its transaction open. A
 * producer of the second, unrelated key used to wait for A's commit (the bucket's lock; here a
 * lock timeout, 55P03); now it does not, through both bodies. A producer of A's own key still
 * waits (commit order per key), and a transaction past 64 events locks buckets again, which
 * bounds its locks: an unrelated key of a locked bucket waits for it. */
static void test_order_lock_per_key(void **st) {
    (void)st;
    char db[48], k2[32], q[512];
    obx_store *s;
    PGconn *c = new_outbox(db, &s);
    obx_route rt = {.event_type = "order.created.v1",
                    .cluster = "local",
                    .topic = "orders",
                    .routing_key = "{tenant}.{aggregate_id}"};
    OK(obx_route_set(s, &rt, NULL));
    qtext(c,
          "SELECT 'o-' || i FROM generate_series(1, 100000) i WHERE hashtext(E'local\\x1forders"
          "\\x1ft1.o-' || i) & 1023 = hashtext(E'local\\x1forders\\x1ft1.o-0') & 1023 LIMIT 1",
          k2, sizeof k2);
    PGconn *a = connect_as(db, "postgres"), *b = connect_as(db, "postgres");
    sql(b, "SET lock_timeout = '300ms'");
    for (int body = 0; body < 2; body++) {
        char stt[6], msg[256];
        sql(c, body ? "SELECT obx._point_enqueue(true)" : "SELECT obx._point_enqueue(false)");
        sql(a, "BEGIN");
        sql(a, "SELECT obx.enqueue('order.created.v1', 'order', 'o-0', 1, 't1', '\\x7b7d')");
        snprintf(q, sizeof q,
                 "SELECT obx.enqueue('order.created.v1', 'order', '%s', 1, 't1', '\\x7b7d')", k2);
        sqlstate(b, q, stt, msg, sizeof msg);
        if (*stt) fail_msg("body %d: an unrelated key of the same bucket: '%s' %s", body, stt, msg);
        sqlstate(b, "SELECT obx.enqueue('order.created.v1', 'order', 'o-0', 2, 't1', '\\x7b7d')",
                 stt, NULL, 0);
        assert_string_equal(stt, "55P03"); /* the same key waits for A's commit */
        sql(a, "COMMIT");
    }
    /* a bulk transaction: past 64 events it locks the buckets of its keys */
    sql(a, "BEGIN");
    sql(a, "SELECT count(obx.enqueue('order.created.v1', 'order', 'bulk-' || i, 1, 't1', "
           "'\\x7b7d')) FROM generate_series(1, 64) i");
    sql(a, "SELECT obx.enqueue('order.created.v1', 'order', 'o-0', 3, 't1', '\\x7b7d')");
    char stt[6];
    sqlstate(b, q, stt, NULL, 0);
    assert_string_equal(stt, "55P03");
    sql(a, "COMMIT");
    PQfinish(a);
    PQfinish(b);
    PQfinish(c);
    obx_store_close(s);
    drop_db(db);
}

int main(void) {
    obx_t_pg pg;
    if (obx_t_pg_open(&pg, "test_pg_hardening", "obx_hard_")) return 1;
    base_url = pg.url;
    admin = pg.admin;
    snprintf(port, sizeof port, "%s", pg.port);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_slot_wrap),
        cmocka_unit_test(test_foreign_schema),
        cmocka_unit_test(test_producer_view_barrier),
        cmocka_unit_test(test_dropped_role_grant),
        cmocka_unit_test(test_failed_after_applied),
        cmocka_unit_test(test_payload_limit_owner_only),
        cmocka_unit_test(test_idempotency_conflict),
        cmocka_unit_test(test_two_phase_commit),
        cmocka_unit_test(test_order_lock_per_key),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    PQfinish(admin);
    return failed;
}
