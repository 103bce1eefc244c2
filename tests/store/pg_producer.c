/*
 * pg_producer.c — test_store_pg: a producer's transaction on its own connection, frozen data.
 */
#include "store/test_store_pg.h"

/* ---- a producer's transaction on its own connection ---------------------------------------- */

void test_commit_together(void **state) {
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

void test_rollback_together(void **state) {
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
void test_caller_tx_survives(void **state) {
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
long long runs_of(PGconn *c, const char *head) {
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
void check_enqueued(fx *f, const char *id, const char *order_id, const char *topic) {
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
obx_err business_enqueue(fx *f, const char *order_id, const char *key, char id[31], int *existing) {
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
void lock_every_bucket(PGconn *holder) {
    exec_ok(holder, "SELECT count(pg_advisory_xact_lock(5194328, g)) FROM generate_series(0, "
                    "1023) g");
}

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
void test_enqueue_one_round_trip(void **state) {
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
void test_enqueue_server_fault(void **state) {
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

/* ---- frozen data ------------------------------------------------------------------------------
 */

/* A database a newer obx initialized is refused with both versions named, and nothing in it
 * changes (the migration runner in src/store/shared.c, shared with SQLite: tests/cli). */
void test_newer_schema_refused(void **state) {
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
void test_read_only(void **state) {
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

void test_frozen(void **state) {
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
    exec_ok(f->conn, "INSERT INTO obx.obx_attempt (attempt_id, event_id, envelope_gen, "
                     "attempt_gen, claim_gen, owner, dest_digest, partition, state, started_at, "
                     "unknown_at, ended_at, offset_before, quiet_until, detail) VALUES ('att-1', "
                     "'evt-1', 1, 1, 1, 'r', 'sha256:x', 0, 'SENDING', 1, 0, 0, -1, 0, '')");
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
