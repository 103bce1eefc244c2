/*
 * pg_schema.c — test_store_pg: delivery sets, the schema's own rules, upgrades and schema versions.
 */
#include "store/test_store_pg.h"

/* ---- delivery sets through obx.enqueue() ----------------------------------------------------
 */

/* obx.enqueue() (any language, inside the caller's transaction) makes the same delivery set as
 * the C path: one slot per target with the same frozen destinations and digests. */
void test_sql_enqueue_delivery_set(void **state) {
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
void refused(PGconn *c, const char *sql, const char *want, const char *has) {
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
void test_schema_checks(void **state) {
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
void test_relay_tables_storage(void **state) {
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
    assert_string_equal(txt, "obx_receipt_kind obx_receipt_primary");
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
void test_sql_ids_digests(void **state) {
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
void test_roles_write_paths(void **state) {
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
    obx__cluster_row k = obx_t_cluster("local", "log", "persistent,transient", "all,1", "r1", 1);
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
void test_init_refuses_under_relay(void **state) {
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

void test_schema_versions(void **state) {
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
