/*
 * pg_wake.c — test_store_pg: least-privilege roles, NOTIFY and latch wake-ups, connection loss.
 */
#include "store/test_store_pg.h"

/* ---- roles ------------------------------------------------------------------------------------
 */

void test_roles(void **state) {
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
    obx__attempt_row at = obx_t_attempt(row.env.event_id, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G");
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
    int ended; /* set (atomically) once the wait returned */
} waiter;

static void *wait_thread(void *p) {
    waiter *w = p;
    w->err = w->s->m->wait_for_work(w->s, w->timeout, w->with_fd ? w->fd : -1, &w->notified);
    w->woke_at = obx__mono_ms();
    __atomic_store_n(&w->ended, 1, __ATOMIC_RELEASE);
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

/* The read end of a pipe nothing is written to: a wait for work that also watches it polls the
 * connection's socket instead of waiting in the server (pg_wake.c, server_wait), and producers,
 * which cannot name a relay outside a statement, wake it with a NOTIFY. A test that asserts that
 * nothing woke the relay waits so: a wait in the server may also end when PostgreSQL sets the
 * backend's latch for its own reasons (a catch-up signal of the notification queue, which other
 * databases' NOTIFYs cause under load), which the wait reports as a hint, as the contract allows.
 */
static int quiet_fd(void) {
    static int fds[2] = {-1, -1};
    if (fds[0] < 0) assert_int_equal(pipe(fds), 0);
    return fds[0];
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

void test_notify_wakes(void **state) {
    fx *f = *state;
    obx_store *relay = open_own(f, "obx-relay-wait");
    arm_relay(f, relay);
    bool notified = true;
    /* nothing committed: times out */
    int64_t t0 = obx__mono_ms();
    OK(relay->m->wait_for_work(relay, 200, quiet_fd(), &notified));
    assert_false(notified);
    assert_true(obx__mono_ms() - t0 >= 195);
    /* a commit wakes it within milliseconds (on its socket, by the NOTIFY: quiet_fd; the wait in
     * the server is test_latch_wake's) */
    waiter w = {.s = relay, .timeout = 5000, .with_fd = true, .fd = quiet_fd()};
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
    w = (waiter){.s = relay, .timeout = 400, .with_fd = true, .fd = quiet_fd()};
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
    /* a hint of the last commit may still be on its way (a producer that could not name the
     * relay sends a NOTIFY besides): read it first */
    notified = true;
    for (int i = 0; i < 5 && notified; i++)
        OK(relay->m->wait_for_work(relay, 50, quiet_fd(), &notified));
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

/* Waits up to timeout_ms on relay (on its socket: quiet_fd) while `sql` runs on f->conn, or,
 * with sql NULL, while the C producer enqueues ev in a transaction of its own; returns whether it
 * was woken. */
static bool woken_by(fx *f, obx_store *relay, int timeout_ms, const char *sql,
                     const obx_event *ev) {
    waiter w = {.s = relay, .timeout = timeout_ms, .with_fd = true, .fd = quiet_fd()};
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
void test_notify_off(void **state) {
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
static long long waiting_in_server(PGconn *c, const char *app) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s' AND "
             "wait_event_type = 'Extension' AND query LIKE '%%obx._wait_for_work(%%'",
             app);
    return qint(c, sql);
}

/* Starts *w's wait for work in *t and returns as soon as the relay's session waits in the
 * server. The server may end such a wait early by setting the backend's latch for its own
 * reasons (the notification queue's catch-up signals to a listener that waits inside a
 * statement, which the other tests' NOTIFYs cause every few milliseconds under CI's load, and
 * the shared invalidation queue's): a hint the contract allows (docs/postgres.md), after which
 * this starts the wait again (at most 50 times). */
static void start_server_wait(fx *f, obx_store *relay, waiter *w, pthread_t *t) {
    for (int i = 0; i < 50; i++) {
        *w = (waiter){.s = relay, .timeout = 5000};
        assert_int_equal(pthread_create(t, NULL, wait_thread, w), 0);
        for (int k = 0; k < 200 && !__atomic_load_n(&w->ended, __ATOMIC_ACQUIRE); k++) {
            if (waiting_in_server(f->conn, "obx-relay-wait") == 1) return;
            msleep(5);
        }
        pthread_join(*t, NULL);
    }
    fail_msg("the relay's wait in the server ended 50 times with nothing committed");
}

/* A producer of test_latch_wake, in a transaction: 0 obx.enqueue(), 1 the PL/pgSQL body, 2 the
 * C library, 3 a bare NOTIFY, 4 the C library again (its route cached: obx._wake_c() called
 * directly); `n` names the aggregate. Before the COMMIT it asks (on `watch`,
 * outside the transaction) whether the relay still waits in the server: false when the server
 * ended the wait early (a hint), which makes the try prove nothing (the relay, out of its wait
 * when the producer looked for it, is woken by the NOTIFY fallback instead). */
static bool produce(fx *f, PGconn *watch, int kind, int n, int64_t *committed) {
    char sql[256];
    const char *fn = kind == 1 ? "obx._enqueue_sql" : "obx.enqueue";
    snprintf(sql, sizeof sql,
             "SELECT %s('order.created.v2', 'order', 'o-lw%d', 1, 'tenant-7', '\\x7b7d')", fn, n);
    exec_ok(f->conn, "BEGIN");
    if (kind == 2 || kind == 4) {
        char agg[32];
        snprintf(agg, sizeof agg, "o-lw%d", n);
        obx_event ev = order_event(agg, "{}");
        obx_enqueue_result res;
        OK(obx_enqueue(f->s, &ev, &res));
    } else {
        exec_ok(f->conn, kind == 3 ? "NOTIFY obx_work" : sql);
    }
    if (kind == 0) msleep(30); /* enqueued, not committed: the relay still waits */
    bool waited = waiting_in_server(watch, "obx-relay-wait") == 1;
    *committed = obx__mono_ms();
    exec_ok(f->conn, "COMMIT");
    return waited;
}

/* A relay that waits in the server (obx._wait_for_work, the obx_pg extension) is woken by
 * obx.enqueue()'s C body through its latch once the commit is visible, and no NOTIFY is sent:
 * a NOTIFY makes the producers' commits wait for each other (docs/performance.md, "Producer
 * overhead"). The PL/pgSQL body and the C library (obx._wake; with its route cached,
 * obx._wake_c() directly: Q_ENQ_TRY_WC) wake it the same way; a bare
 * NOTIFY, what producers send where the database has no obx_pg, ends the wait as well. A try
 * whose wait the server ended before the commit (a hint: start_server_wait, produce) proves
 * nothing and is made again, with a new event, up to 20 times; a wake-up path that does not
 * work times out (5 s) instead. */
void test_latch_wake(void **state) {
    fx *f = *state;
    assert_enqueue_impl(f->conn, "c");
    PGconn *l = PQconnectdb(f->url), *watch = PQconnectdb(f->url);
    assert_int_equal(PQstatus(l), CONNECTION_OK);
    assert_int_equal(PQstatus(watch), CONNECTION_OK);
    PQclear(PQexec(l, "LISTEN obx_work"));
    obx_store *relay = open_own(f, "obx-relay-wait");
    arm_relay(f, relay);
    static const char *const kinds[] = {"obx.enqueue() (C body)", "obx._enqueue_sql()",
                                        "the C library", "a bare NOTIFY",
                                        "the C library, route cached"};
    size_t events = 0;
    for (int kind = 0; kind < 5; kind++) {
        int64_t latency = -1;
        bool told = false;
        int try = 0;
        for (; try < 20 && latency < 0; try++) {
            waiter w;
            pthread_t t;
            int64_t committed = 0;
            start_server_wait(f, relay, &w, &t);
            bool waited = produce(f, watch, kind, (int)events, &committed);
            events += kind != 3;
            pthread_join(t, NULL);
            OK(w.err);
            assert_true(w.notified);
            told = listener_told(l, 300);
            if (waited && w.woke_at >= committed) latency = w.woke_at - committed;
        }
        printf("  %s: wake-up latency after COMMIT: %lld ms (try %d)\n", kinds[kind],
               (long long)latency, try);
        assert_true(latency >= 0 && latency < 100);
        /* a NOTIFY only where one was sent by hand: the producers woke the relay by its latch */
        assert_int_equal(told, kind == 3);
    }
    assert_int_equal(claim_local(relay, 1000), events);
    /* the cached route's write called obx._wake_c() itself (no PL/pgSQL obx._wake()) */
    assert_true(runs_of(f->conn, TRY_TRIP "%obx._wake_c($17::text)%") >= 1);
    obx_store_close(relay);
    PQfinish(l);
    PQfinish(watch);
}

/* A waiter woken again and again returns at most once per WAKE_GAP_MS (2 ms, obx_pg.c): one
 * statement runs obx._wait_for_work() 20 times while another session commits a NOTIFY after
 * another, each of which sets the waiter's latch (a listener inside a statement falls behind
 * the queue and is signalled at every commit). Every wait is woken, and the returns are spread
 * over at least 19 gaps. Before the gap the 20 wakes took 2-6 ms here, each NOTIFY's commit
 * ending a wait at once. */
void test_wake_gap(void **state) {
    fx *f = *state;
    assert_enqueue_impl(f->conn, "c");
    PGconn *w = PQconnectdb(f->url);
    assert_int_equal(PQstatus(w), CONNECTION_OK);
    exec_ok(w, "LISTEN obx_work");
    assert_true(PQsendQuery(w, "SELECT count(*) FILTER (WHERE w), (extract(epoch FROM max(t) - "
                               "min(t)) * 1000)::int FROM (SELECT obx._wait_for_work(1000) AS w, "
                               "clock_timestamp() AS t FROM generate_series(1, 20)) x"));
    int notifies = 0;
    for (;;) {
        assert_true(PQconsumeInput(w));
        if (!PQisBusy(w)) break;
        exec_ok(f->conn, "NOTIFY obx_work");
        notifies++;
    }
    PGresult *r = PQgetResult(w);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    int woken = atoi(PQgetvalue(r, 0, 0)), span = atoi(PQgetvalue(r, 0, 1));
    printf("  20 waits woken by %d NOTIFYs: %d woken, returns spread over %d ms\n", notifies, woken,
           span);
    assert_int_equal(woken, 20);
    assert_true(span >= 19 * 2);
    PQclear(r);
    assert_null(PQgetResult(w));
    PQfinish(w);
}

/* The producers' NOTIFY only while a relay of the event's cluster waits (NOTIFY_EXPR in
 * pg_sql.c, the wake lock): none without one, none while the relay is in a backlog (its claim
 * took a whole batch), and no wake-up lost to the race between a producer that tested the lock
 * before the relay took it and the relay going to sleep. */
void test_wake_lock(void **state) {
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

void test_connection_loss(void **state) {
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

/* One enqueue of test_wake_c_dropped in its own transaction; its error, after which the
 * transaction is rolled back. */
static obx_err enqueue_one(fx *f, int n) {
    char agg[16];
    snprintf(agg, sizeof agg, "o-wd%d", n);
    obx_event ev = order_event(agg, "{}");
    obx_enqueue_result res;
    exec_ok(f->conn, "BEGIN");
    obx_err e = obx_enqueue(f->s, &ev, &res);
    exec_ok(f->conn, e ? "ROLLBACK" : "COMMIT");
    return e;
}

/* A connection whose cached-route enqueue calls obx._wake_c() itself (Q_ENQ_TRY_WC: its last
 * route read found the obx_pg extension) after the extension was dropped: that enqueue fails,
 * as obx.enqueue() does until `obx init` (its statement names a function that is gone), and the
 * next one calls obx._wake() (Q_ENQ_TRY) and writes its event (docs/postgres.md, "The latch
 * wake-up"). */
void test_wake_c_dropped(void **state) {
    fx *f = *state;
    assert_enqueue_impl(f->conn, "c");
    OK(enqueue_one(f, 0)); /* reads the route */
    OK(enqueue_one(f, 1)); /* the cached route's write */
    assert_int_equal(runs_of(f->conn, TRY_TRIP "%obx._wake_c($17::text)%"), 1);
    exec_ok(f->conn, "DROP EXTENSION obx_pg");
    assert_int_not_equal(enqueue_one(f, 2), OBX_OK);
    OK(enqueue_one(f, 3));
    assert_int_equal(runs_of(f->conn, TRY_TRIP "%obx._wake($17::text)%"), 1);
    assert_int_equal(qint(f->conn, "SELECT count(*) FROM obx.obx_event WHERE event_id IS NOT NULL"),
                     3);
}
