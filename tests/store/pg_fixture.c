/*
 * pg_fixture.c — test_store_pg: the suite's fixture: fresh databases, a business connection,
 * helpers.
 */
#include "store/test_store_pg.h"

char base_url[1024];
PGconn *admin; /* maintenance connection to the URL's own database */
int db_count;
char created[256][64]; /* databases to drop at the end */

/* ---- helpers ----------------------------------------------------------------------------------
 */

/* base_url with its database replaced by db, and query parameters extra ("k=v&..." or "") */
void db_url(const char *db, const char *extra, char *out, size_t cap) {
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

void admin_exec(const char *sql) {
    PGresult *r = PQexec(admin, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fprintf(stderr, "admin: %s: %s", sql, PQerrorMessage(admin));
    PQclear(r);
}

/* A fresh database; its name into db (64 bytes). */
int new_db(char *db, const char *options) {
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

static char factory_url[1200]; /* the database pg_factory made last (pg_app) */

obx_err pg_factory(obx__store **out) {
    char db[64];
    if (new_db(db, NULL)) return obx__fail(OBX_ESTORE, "cannot create a test database");
    db_url(db, "", factory_url, sizeof factory_url);
    obx_err e = obx__st_open(factory_url, out);
    if (!e) e = obx_store_init(*out);
    return e;
}

/* ---- an application's connection to pg_factory's last database (the conformance suite) ------ */

static void *app_connect(void) {
    PGconn *c = PQconnectdb(factory_url);
    if (PQstatus(c) == CONNECTION_OK) return c;
    PQfinish(c);
    return NULL;
}

static obx_err app_wrap(void *conn, obx_store **out) { return obx_store_wrap_pg(conn, out); }

static int app_exec(void *conn, const char *sql) {
    PGresult *r = PQexec(conn, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return ok ? 0 : -1;
}

static long long app_count(void *conn, const char *sql) { return qint(conn, sql); }

static void app_close(void *conn) { PQfinish(conn); }

const store_app pg_app = {"obx.", app_connect, app_wrap, app_exec, app_count, app_close};

PGconn *connect_url(const char *url) { return obx_t_pg_connect(url); }

void exec_ok(PGconn *c, const char *sql) { obx_t_pg_sql(c, sql); }

long long qint(PGconn *c, const char *sql) { return obx_t_pg_qint(c, sql); }

/* SQLSTATE of a statement that must fail ("" if it succeeded); its message into msg. */
void exec_fail(PGconn *c, const char *sql, char state[6], char *msg, size_t cap) {
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

void msleep(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* qint(c, sql), read again every 10 ms for up to 5 s until it is at most `most`; the last value
 * read. For what a closed connection holds: its backend lets go when it exits, a moment after
 * the client closed it (PQfinish does not wait for that). */
long long qint_down_to(PGconn *c, const char *sql, long long most) {
    long long n = qint(c, sql);
    for (int i = 0; i < 500 && n > most; i++) {
        msleep(10);
        n = qint(c, sql);
    }
    return n;
}

/* ---- fixture: a fresh initialized database with a route, and a "business" connection ------- */

int setup(void **state) {
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

int teardown(void **state) {
    fx *f = *state;
    obx_store_close(f->s);
    PQfinish(f->conn);
    char sql[128];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", f->db);
    admin_exec(sql);
    free(f);
    return 0;
}

obx_event order_event(const char *id, const char *payload) {
    return obx_t_order_event(id, payload);
}

obx__event_row load1(obx__store *s, const char *id, unsigned flags) {
    return obx_t_ev(s, id, flags);
}

/* An event's first audit row, recorded in its envelope (created_by) and not as an obx_audit
 * row, read back as the producer wrote it: NONE -> PENDING at the envelope's created_at by
 * `who`, under the route generation the envelope froze. */
void check_first_row(obx__store *s, PGconn *c, const char *id, const char *who) {
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
obx_store *open_own(fx *f, const char *app) {
    char url[1300], extra[128];
    snprintf(extra, sizeof extra, "application_name=%s", app);
    db_url(f->db, extra, url, sizeof url);
    obx_store *s = NULL;
    OK(obx_store_open(url, &s));
    return s;
}

void kill_backend(const char *app) {
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
int wait_lock_waiter(const char *app) {
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
