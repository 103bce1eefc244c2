/*
 * pg_sql.c — test_store_pg: concurrent producers, the SQL function obx.enqueue() and the digests.
 */
#include "store/test_store_pg.h"

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
void test_enqueue_own_one_round_trip(void **state) {
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
void test_idempotency_concurrent(void **state) {
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
void test_idempotency_concurrent_sql(void **state) {
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
void test_seq_is_commit_order(void **state) {
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

void test_digest_vectors_sql(void **state) {
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
void assert_enqueue_impl(PGconn *c, const char *impl) {
    char sql[160];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM obx.obx_meta WHERE key = 'enqueue_impl' AND value = '%s'", impl);
    if (qint(c, sql) != 1) fail_msg("obx.enqueue() does not run its %s body", impl);
}

/* The three ways into an enqueue give the C path's rows: obx.enqueue() without a key (the
 * extension's fast path), with one (handed to obx._enqueue_sql()), and obx._enqueue_sql()
 * itself, the body of a database without the extension. */
void test_sql_enqueue_matches_c(void **state) {
    fx *f = *state;
    assert_enqueue_impl(f->conn, "c");
    sql_enqueue_matches_c(f, "obx.enqueue", NULL, 0);
}

void test_sql_enqueue_key_matches_c(void **state) {
    sql_enqueue_matches_c(*state, "obx.enqueue", "k-sql", 1);
}

void test_sql_body_matches_c(void **state) {
    sql_enqueue_matches_c(*state, "obx._enqueue_sql", NULL, 1);
}

/* obx.enqueue(..., not_before => ...) agrees with obx_enqueue()'s not_before_ms, through
 * fn (the door, whose body is C where the server has obx_pg, or the PL/pgSQL body itself):
 * the frozen not_before and available_at, the envelope digest the C code computes (covering
 * not_before), none without it; a time over the maximum delay refused naming not_before_ms,
 * nothing written; delivery-set slots keep the delay. */
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

void test_sql_enqueue_delay(void **state) {
    fx *f = *state;
    assert_enqueue_impl(f->conn, "c");
    sql_enqueue_delay(f, "obx.enqueue", 0);
}

void test_sql_body_delay(void **state) { sql_enqueue_delay(*state, "obx._enqueue_sql", 1); }

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
int64_t route_topic(const char *url, const char *topic, obx_route_target *t, size_t n) {
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
void remake_schema(fx *f) {
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
void test_enqueue_route_schema_remade(void **state) {
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
void test_sql_enqueue_route_changes(void **state) {
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
void test_enqueue_without_extension(void **state) {
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
void test_extension_versions(void **state) {
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
void test_sql_validation_parity(void **state) {
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

void test_psql_producer(void **state) {
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
void login_role(PGconn *c, const char *db, const char *prefix, const char *kind, char *url) {
    char sql[256], extra[128];
    snprintf(sql, sizeof sql, "CREATE ROLE %s_%s_login LOGIN IN ROLE %s_%s", prefix, kind, prefix,
             kind);
    exec_ok(c, sql);
    snprintf(extra, sizeof extra, "user=%s_%s_login", prefix, kind);
    db_url(db, extra, url, 1300);
}
