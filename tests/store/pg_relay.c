/*
 * pg_relay.c — test_store_pg: retriable errors, concurrent relays, the relay's plans, statistics
 * and batch semantics.
 */
#include "store/test_store_pg.h"

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

void test_busy_mapping(void **state) {
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

bool has(const obx__rows *r, const char *id) {
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->v[i].env.event_id, id)) return true;
    return false;
}

void test_claim_skip_locked(void **state) {
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

void test_claim_throughput(void **state) {
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
void relay_until_published(PGconn *conn, obx__engine *e) {
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
void test_write_set_schema_remade(void **state) {
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
void test_dispatch_plans(void **state) {
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
 * pipeline (pg_conn.c, pend), and its COMMIT with its write set (held; obx._ws_fail): a
 * claim is 2 round trips (BEGIN + settings + claim, the writes + COMMIT) where it was 5, then 3,
 * an acceptance 2 where it was 5, then 4, then 3 (its attempts and events in one pipeline:
 * load_slots), and a transaction that sends nothing costs none. Counted
 * in libpq's trace of the relay's connection; the claim still runs inside the transaction (its rows
 * stay locked until COMMIT). */
void test_dispatch_round_trips(void **state) {
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
void stats_exact(obx__store *s, PGconn *conn) {
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

void test_stats_exact(void **state) {
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

void test_batch_semantics(void **state) {
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
    obx__attempt_row a = obx_t_attempt(x, "att-1");
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
void test_write_set(void **state) {
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
    obx__attempt_row a = obx_t_attempt(x, "att-ws1");
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
void test_held_write_set(void **state) {
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
