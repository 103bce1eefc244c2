/*
 * sim_sql.c — the only SQL the simulator runs itself; everything else it reads or writes goes
 * through the store interface (the checkers' envelope reads: envelope_at; the trace's outer
 * transactions: the stores' own begin/rollback, world.c). What is here: opening the worker's
 * databases (SQLite in memory, or a PostgreSQL connection) and the business tables: sim_orders
 * (the producer's business row, in the same transaction as its event; temporary, so nothing of
 * it outlives the connection) and each consumer's sim_effects (the handler's effect, in the
 * inbox's transaction) — the application's own tables, which the store knows nothing of.
 * The same SQL runs on SQLite and PostgreSQL ($n placeholders bind by position in both; the
 * PostgreSQL connection's search_path is obx, public).
 */
#include "sim/sim.h"

#include <stdlib.h>
#include <string.h>

/* Cached one-integer query (the checker's statements are prepared once per worker). */
typedef struct qc {
    const char *sql;
    sqlite3_stmt *st;
} qc;

/* Cached statements of this worker thread, finalized when the worker ends (the connections
 * cannot close while statements are open). */
static _Thread_local qc *cached[32];
static _Thread_local int ncached;

static void cached_free(void) {
    for (int i = 0; i < ncached; i++) {
        sqlite3_finalize(cached[i]->st);
        cached[i]->st = NULL;
    }
    ncached = 0;
}

static long qcached(sqlite3 *db, qc *q) {
    if (!q->st) {
        if (sqlite3_prepare_v3(db, q->sql, -1, SQLITE_PREPARE_PERSISTENT, &q->st, NULL)) return -1;
        if (ncached < 32) cached[ncached++] = q;
    }
    long v = -1;
    if (sqlite3_step(q->st) == SQLITE_ROW) v = (long)sqlite3_column_int64(q->st, 0);
    sqlite3_reset(q->st);
    return v;
}

/* The queries, SQLite and PostgreSQL alike. Why they are SQL and not store calls: sim_orders is
 * the business service's table (the store knows nothing of it); the store reads an event's
 * envelope of its current generation only, and the checkers need the envelope an older
 * generation froze (a message on the broker may be of any generation) — a store method for
 * that (load_envelope(event_id, envelope_gen)) would let both go. */
enum { OQ_ORDER, OQ_ORDER_EVENTS, OQ_COUNT };

static const char *const oq_sql[OQ_COUNT] = {
    [OQ_ORDER] = "INSERT INTO sim_orders VALUES ($1, $2) ON CONFLICT DO NOTHING",
    [OQ_ORDER_EVENTS] = "SELECT event_id FROM sim_orders",
};

typedef struct oparam {
    const char *s; /* text, or NULL: the integer i */
    int64_t i;
} oparam;

#define OP_S(x) ((oparam){.s = (x)})
#define OP_I(x) ((oparam){.i = (x)})

/* A result being read: rows of a SQLite statement or of a PostgreSQL result. */
typedef struct ocur {
    sqlite3_stmt *st;
    PGresult *res;
    int row, nrows;
    bool ok;
} ocur;

static bool oq_run(wk *k, int q, const oparam *p, int n, ocur *c) {
    memset(c, 0, sizeof *c);
    c->row = -1;
    if (k->opg) {
        char name[16];
        snprintf(name, sizeof name, "obx_sim_%d", q);
        if (!k->oq_pg_ready[q]) {
            PGresult *r = PQprepare(k->opg, name, oq_sql[q], 0, NULL);
            bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
            if (!ok) fail(k, "sim: prepare: %s", PQerrorMessage(k->opg));
            PQclear(r);
            if (!ok) return false;
            k->oq_pg_ready[q] = true;
        }
        char nums[8][24];
        const char *vals[8];
        for (int i = 0; i < n && i < 8; i++) {
            if (p[i].s)
                vals[i] = p[i].s;
            else {
                snprintf(nums[i], sizeof nums[i], "%lld", (long long)p[i].i);
                vals[i] = nums[i];
            }
        }
        c->res = PQexecPrepared(k->opg, name, n, vals, NULL, NULL, 0);
        ExecStatusType t = PQresultStatus(c->res);
        c->ok = t == PGRES_TUPLES_OK || t == PGRES_COMMAND_OK;
        if (!c->ok) fail(k, "sim: query %d: %s", q, PQerrorMessage(k->opg));
        c->nrows = c->ok ? PQntuples(c->res) : 0;
        return c->ok;
    }
    if (!k->oq_st[q] &&
        sqlite3_prepare_v3(k->odb, oq_sql[q], -1, SQLITE_PREPARE_PERSISTENT, &k->oq_st[q], NULL)) {
        fail(k, "sim: prepare: %s", sqlite3_errmsg(k->odb));
        return false;
    }
    c->st = k->oq_st[q];
    sqlite3_reset(c->st);
    for (int i = 0; i < n; i++) {
        if (p[i].s)
            sqlite3_bind_text(c->st, i + 1, p[i].s, -1, SQLITE_TRANSIENT);
        else
            sqlite3_bind_int64(c->st, i + 1, p[i].i);
    }
    c->ok = true;
    return true;
}

static bool oq_next(wk *k, ocur *c) {
    if (!c->ok) return false;
    if (c->res) return ++c->row < c->nrows;
    int rc = sqlite3_step(c->st);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) {
        fail(k, "sim: step: %s", sqlite3_errmsg(k->odb));
        c->ok = false;
    }
    return false;
}

static const char *oq_text(const ocur *c, int col) {
    const char *v =
        c->res ? PQgetvalue(c->res, c->row, col) : (const char *)sqlite3_column_text(c->st, col);
    return v ? v : "";
}

static void oq_close(ocur *c) {
    if (c->res) PQclear(c->res);
    if (c->st) sqlite3_reset(c->st);
    memset(c, 0, sizeof *c);
}

/* A statement with no result rows (the business insert); false on failure. */
static bool oq_exec(wk *k, int q, const oparam *p, int n) {
    ocur c;
    bool ok = oq_run(k, q, p, n, &c);
    if (ok) oq_next(k, &c);
    ok = ok && c.ok;
    oq_close(&c);
    return ok;
}

static _Thread_local qc consumed[2] = {{"SELECT count(DISTINCT event_id) FROM sim_effects", NULL},
                                       {"SELECT count(DISTINCT event_id) FROM sim_effects", NULL}};
static _Thread_local qc doubled[2] = {
    {"SELECT count(*) FROM (SELECT 1 FROM sim_effects GROUP BY event_id HAVING count(*) > 1)",
     NULL},
    {"SELECT count(*) FROM (SELECT 1 FROM sim_effects GROUP BY event_id HAVING count(*) > 1)",
     NULL}};

long obx__simq_effects_distinct(wk *k, int i) { return qcached(k->cdb[i], &consumed[i]); }

long obx__simq_effects_doubled(wk *k, int i) { return qcached(k->cdb[i], &doubled[i]); }

/* ---- what the rest of the simulator calls (sim.h) ---- */

bool obx__simq_order_put(wk *k, const char *order_id, const char *event_id) {
    oparam op[] = {OP_S(order_id), OP_S(event_id)};
    return oq_exec(k, OQ_ORDER, op, 2);
}

bool obx__simq_orders(wk *k, obx__sim_orders *o) {
    o->n = 0;
    ocur c;
    bool ok = oq_run(k, OQ_ORDER_EVENTS, NULL, 0, &c);
    while (ok && oq_next(k, &c))
        if (o->n < MAX_EVENTS)
            obx__strlcpy(o->event_id[o->n++], oq_text(&c, 0), sizeof o->event_id[0]);
    ok = ok && c.ok;
    oq_close(&c);
    return ok;
}

obx_err obx__simq_effect_put(wk *k, int i, const char *event_id) {
    sqlite3_stmt **st = &k->st_effect[i];
    if (!*st && sqlite3_prepare_v3(k->cdb[i], "INSERT INTO sim_effects VALUES (?)", -1,
                                   SQLITE_PREPARE_PERSISTENT, st, NULL))
        return OBX_ESTORE;
    sqlite3_bind_text(*st, 1, event_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(*st);
    sqlite3_reset(*st);
    return rc == SQLITE_DONE ? OBX_OK : OBX_ESTORE;
}

/* ---- the worker's databases ---- */

static obx_err open_mem(sqlite3 **db, obx_store **s) {
    if (sqlite3_open_v2(":memory:", db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK)
        return obx__fail(OBX_ESTORE, "sim: cannot open an in-memory database");
    /* a trace's databases hold a few dozen rows: small pages mean less to journal for every
     * page a trace touches (measured: ~5% fewer instructions than 4096) */
    sqlite3_exec(*db, "PRAGMA page_size=1024; PRAGMA synchronous=OFF", NULL, NULL, NULL);
    obx_err e = obx_store_wrap_sqlite(*db, s);
    if (!e) e = obx_store_init(*s);
    return e;
}

static obx_err open_pg(wk *k, const char *url) {
    k->opg = PQconnectdb(url);
    if (PQstatus(k->opg) != CONNECTION_OK)
        return obx__fail(OBX_ESTORE, "sim: postgres: %s", PQerrorMessage(k->opg));
    const char *setup[] = {"SET search_path = obx, public", "SET client_min_messages = warning",
                           ("CREATE TEMP TABLE sim_orders (order_id TEXT PRIMARY KEY, event_id "
                            "TEXT NOT NULL)")};
    for (size_t i = 0; i < sizeof setup / sizeof setup[0]; i++) {
        PGresult *r = PQexec(k->opg, setup[i]);
        bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) return obx__fail(OBX_ESTORE, "sim: postgres: %s", PQerrorMessage(k->opg));
    }
    return obx_store_wrap_pg(k->opg, &k->os);
}

obx_err obx__simq_open(wk *k) {
    obx_err e;
    if (k->o->db_url) {
        if ((e = open_pg(k, k->o->db_url))) return e;
    } else {
        if ((e = open_mem(&k->odb, &k->os))) return e;
        if (sqlite3_exec(k->odb,
                         "CREATE TEMP TABLE sim_orders (order_id TEXT PRIMARY KEY, event_id TEXT "
                         "NOT NULL)",
                         NULL, NULL, NULL) != SQLITE_OK)
            return obx__fail(OBX_ESTORE, "sim: %s", sqlite3_errmsg(k->odb));
    }
    for (int i = 0; i < 2; i++) {
        if ((e = open_mem(&k->cdb[i], &k->cs[i]))) return e;
        if (sqlite3_exec(k->cdb[i], "CREATE TABLE sim_effects (event_id TEXT NOT NULL)", NULL, NULL,
                         NULL) != SQLITE_OK)
            return obx__fail(OBX_ESTORE, "sim: %s", sqlite3_errmsg(k->cdb[i]));
    }
    return OBX_OK;
}

void obx__simq_close_all(wk *k) {
    cached_free();
    for (int i = 0; i < OQ_COUNT; i++) sqlite3_finalize(k->oq_st[i]);
    for (int i = 0; i < 2; i++) sqlite3_finalize(k->st_effect[i]);
    for (int i = 0; i < 2; i++) {
        obx_store_close(k->cs[i]);
        sqlite3_close(k->cdb[i]);
    }
    obx_store_close(k->os);
    if (k->odb) sqlite3_close(k->odb);
    if (k->opg) PQfinish(k->opg);
}
