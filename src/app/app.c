/*
 * app.c — the application doubles (app.h): a producing service's business table and a
 * consuming service's effect table, with their own SQL on their own connections, and the
 * opening of those databases (SQLite's PRAGMAs, PostgreSQL's search_path, the tables). Every
 * statement is prepared once per connection: the simulator runs them in every trace. The
 * producer's SQL is the same on SQLite and PostgreSQL ($n placeholders bind by position in
 * both).
 */
#include "app/app.h"

#ifdef OBX_WITH_POSTGRES
#include <libpq-fe.h>
#else
#include "pq_off.h" /* OBX_WITH_POSTGRES=OFF: a PostgreSQL URL fails to connect */
#endif
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ORDER_PUT, ORDER_EVENTS, ORDER_NQ };

static const char *const order_sql[ORDER_NQ] = {
    [ORDER_PUT] = "INSERT INTO sim_orders VALUES ($1, $2) ON CONFLICT DO NOTHING",
    [ORDER_EVENTS] = "SELECT event_id FROM sim_orders",
};

#define ORDERS_TABLE                                                                               \
    "CREATE TEMP TABLE sim_orders (order_id TEXT PRIMARY KEY, event_id TEXT NOT NULL)"

struct obx__app_producer {
    sqlite3 *db;  /* SQLite in memory ... */
    PGconn *pg;   /* ... or PostgreSQL */
    obx_store *s; /* obx on the same connection */
    sqlite3_stmt *st[ORDER_NQ];
    bool pg_ready[ORDER_NQ]; /* prepared on the PostgreSQL connection (by name) */
};

struct obx__app_consumer {
    sqlite3 *db;
    obx_store *s;
    sqlite3_stmt *put, *distinct, *doubled;
};

static obx_err fail_msg(const char *what, const char *detail) {
    char msg[512];
    snprintf(msg, sizeof msg, "app: %s: %s", what, detail);
    return obx_error_set(OBX_ESTORE, msg);
}

/* An in-memory SQLite database tuned for a few dozen rows, with an initialized obx store. */
static obx_err open_mem(sqlite3 **db, obx_store **s) {
    if (sqlite3_open_v2(":memory:", db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK)
        return fail_msg("sqlite", "cannot open an in-memory database");
    /* a trace's databases hold a few dozen rows: small pages mean less to journal for every
     * page a trace touches (measured: ~5% fewer instructions than 4096) */
    sqlite3_exec(*db, "PRAGMA page_size=1024; PRAGMA synchronous=OFF", NULL, NULL, NULL);
    obx_err e = obx_store_wrap_sqlite(*db, s);
    if (!e) e = obx_store_init(*s);
    return e;
}

/* ---- the producing service ---- */

static obx_err open_pg(obx__app_producer *p, const char *url) {
    p->pg = PQconnectdb(url);
    if (PQstatus(p->pg) != CONNECTION_OK) return fail_msg("postgres", PQerrorMessage(p->pg));
    const char *setup[] = {"SET search_path = obx, public", "SET client_min_messages = warning",
                           ORDERS_TABLE};
    for (size_t i = 0; i < sizeof setup / sizeof setup[0]; i++) {
        PGresult *r = PQexec(p->pg, setup[i]);
        bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) return fail_msg("postgres", PQerrorMessage(p->pg));
    }
    return obx_store_wrap_pg(p->pg, &p->s);
}

obx_err obx__app_producer_open(const char *pg_url, obx__app_producer **out) {
    obx__app_producer *p = *out = calloc(1, sizeof *p);
    if (!p) return obx_error_set(OBX_ENOMEM, "app: out of memory");
    if (pg_url) return open_pg(p, pg_url);
    obx_err e = open_mem(&p->db, &p->s);
    if (e) return e;
    if (sqlite3_exec(p->db, ORDERS_TABLE, NULL, NULL, NULL) != SQLITE_OK)
        return fail_msg("sqlite", sqlite3_errmsg(p->db));
    return OBX_OK;
}

obx_store *obx__app_producer_store(const obx__app_producer *p) { return p->s; }

/* Runs order query q on PostgreSQL (prepared by name once); *res is the caller's to clear. */
static obx_err pg_run(obx__app_producer *p, int q, const char *const *vals, int n, PGresult **res) {
    char name[32];
    snprintf(name, sizeof name, "obx_app_order_%d", q);
    if (!p->pg_ready[q]) {
        PGresult *r = PQprepare(p->pg, name, order_sql[q], 0, NULL);
        bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) return fail_msg("prepare", PQerrorMessage(p->pg));
        p->pg_ready[q] = true;
    }
    *res = PQexecPrepared(p->pg, name, n, vals, NULL, NULL, 0);
    ExecStatusType t = PQresultStatus(*res);
    if (t == PGRES_TUPLES_OK || t == PGRES_COMMAND_OK) return OBX_OK;
    PQclear(*res);
    *res = NULL;
    return fail_msg("query", PQerrorMessage(p->pg));
}

/* Order query q on SQLite, reset and ready to bind (prepared once). */
static obx_err sq_stmt(obx__app_producer *p, int q, sqlite3_stmt **st) {
    if (!p->st[q] &&
        sqlite3_prepare_v3(p->db, order_sql[q], -1, SQLITE_PREPARE_PERSISTENT, &p->st[q], NULL))
        return fail_msg("prepare", sqlite3_errmsg(p->db));
    *st = p->st[q];
    sqlite3_reset(*st);
    return OBX_OK;
}

obx_err obx__app_order_put(obx__app_producer *p, const char *order_id, const char *event_id) {
    if (p->pg) {
        const char *vals[] = {order_id, event_id};
        PGresult *r = NULL;
        obx_err e = pg_run(p, ORDER_PUT, vals, 2, &r);
        PQclear(r);
        return e;
    }
    sqlite3_stmt *st = NULL;
    obx_err e = sq_stmt(p, ORDER_PUT, &st);
    if (e) return e;
    sqlite3_bind_text(st, 1, order_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, event_id, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? OBX_OK : fail_msg("business row", sqlite3_errmsg(p->db));
}

obx_err obx__app_orders(obx__app_producer *p, char (*ids)[OBX_EVENT_ID_LEN + 1], size_t cap,
                        size_t *n) {
    *n = 0;
    if (p->pg) {
        PGresult *r = NULL;
        obx_err e = pg_run(p, ORDER_EVENTS, NULL, 0, &r);
        for (int i = 0; !e && i < PQntuples(r) && *n < cap; i++)
            snprintf(ids[(*n)++], sizeof ids[0], "%s", PQgetvalue(r, i, 0));
        PQclear(r);
        return e;
    }
    sqlite3_stmt *st = NULL;
    obx_err e = sq_stmt(p, ORDER_EVENTS, &st);
    if (e) return e;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (*n < cap) {
            const unsigned char *t = sqlite3_column_text(st, 0);
            snprintf(ids[(*n)++], sizeof ids[0], "%s", t ? (const char *)t : "");
        }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? OBX_OK : fail_msg("business rows", sqlite3_errmsg(p->db));
}

void obx__app_producer_close(obx__app_producer *p) {
    if (!p) return;
    for (int i = 0; i < ORDER_NQ; i++) sqlite3_finalize(p->st[i]);
    obx_store_close(p->s);
    if (p->db) sqlite3_close(p->db);
    if (p->pg) PQfinish(p->pg);
    free(p);
}

/* ---- a consuming service ---- */

obx_err obx__app_consumer_open(obx__app_consumer **out) {
    obx__app_consumer *c = *out = calloc(1, sizeof *c);
    if (!c) return obx_error_set(OBX_ENOMEM, "app: out of memory");
    obx_err e = open_mem(&c->db, &c->s);
    if (e) return e;
    if (sqlite3_exec(c->db, "CREATE TABLE sim_effects (event_id TEXT NOT NULL)", NULL, NULL,
                     NULL) != SQLITE_OK)
        return fail_msg("sqlite", sqlite3_errmsg(c->db));
    return OBX_OK;
}

obx_store *obx__app_consumer_store(const obx__app_consumer *c) { return c->s; }

void *obx__app_consumer_conn(const obx__app_consumer *c) { return c->db; }

obx_err obx__app_effect_put(obx__app_consumer *c, const char *event_id) {
    if (!c->put && sqlite3_prepare_v3(c->db, "INSERT INTO sim_effects VALUES (?)", -1,
                                      SQLITE_PREPARE_PERSISTENT, &c->put, NULL))
        return fail_msg("prepare", sqlite3_errmsg(c->db));
    sqlite3_bind_text(c->put, 1, event_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(c->put);
    sqlite3_reset(c->put);
    return rc == SQLITE_DONE ? OBX_OK : fail_msg("effect", sqlite3_errmsg(c->db));
}

/* The one integer a counting query returns (prepared once into *st); -1 on failure. */
static long count(sqlite3 *db, sqlite3_stmt **st, const char *sql) {
    if (!*st && sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL)) return -1;
    long v = -1;
    if (sqlite3_step(*st) == SQLITE_ROW) v = (long)sqlite3_column_int64(*st, 0);
    sqlite3_reset(*st);
    return v;
}

long obx__app_effects_distinct(obx__app_consumer *c) {
    return count(c->db, &c->distinct, "SELECT count(DISTINCT event_id) FROM sim_effects");
}

long obx__app_effects_doubled(obx__app_consumer *c) {
    return count(
        c->db, &c->doubled,
        "SELECT count(*) FROM (SELECT 1 FROM sim_effects GROUP BY event_id HAVING count(*) > 1)");
}

void obx__app_consumer_close(obx__app_consumer *c) {
    if (!c) return;
    sqlite3_finalize(c->put);
    sqlite3_finalize(c->distinct);
    sqlite3_finalize(c->doubled);
    obx_store_close(c->s);
    if (c->db) sqlite3_close(c->db);
    free(c);
}
