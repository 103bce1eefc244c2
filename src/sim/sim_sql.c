/*
 * sim_sql.c — the SQL the simulator runs itself: the business service's row (sim_orders, in
 * the same transaction as its event), the checkers' reads of what the outbox and the consumers'
 * databases hold, and the trace's outer transactions. The same SQL runs on SQLite and
 * PostgreSQL ($n placeholders bind by position in both; the PostgreSQL connection's
 * search_path is obx, public). sim_orders is the business table: a temporary table, so
 * nothing of it outlives the worker's connection.
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

void obx__simq_cached_free(void) {
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

static const char *const oq_sql[OQ_COUNT] = {
    [OQ_ORDER] = "INSERT INTO sim_orders VALUES ($1, $2) ON CONFLICT DO NOTHING",
    [OQ_RECEIPT_FOR] = "SELECT count(*) FROM obx_receipt WHERE attempt_id = $1 AND "
                       "(kind = 'PRIMARY' OR kind = 'DUPLICATE')",
    [OQ_ENV_OF] = "SELECT dest_topic, dest_digest FROM obx_envelope WHERE event_id = $1 AND "
                  "envelope_gen = $2",
    [OQ_ATT_PART] = "SELECT partition FROM obx_attempt WHERE attempt_id = $1",
    /* each purge: the event, its publication place, and when it was purged */
    [OQ_PURGED] = "SELECT e.event_id, e.published_at, e.seq, (SELECT max(a.at) FROM obx_audit a "
                  "WHERE a.event_id = e.event_id AND a.to_state = 'PURGED') FROM obx_event e "
                  "WHERE e.state = 'PURGED' ORDER BY e.seq",
    /* every published event at or before a place in publication order */
    [OQ_BEFORE] = "SELECT event_id FROM obx_event WHERE published_at > 0 AND (published_at < $1 "
                  "OR (published_at = $1 AND seq <= $2)) ORDER BY seq",
    [OQ_UNPUBLISHED] = "SELECT count(*) FROM obx_event WHERE state <> 'PUBLISHED' AND state <> "
                       "'RETAINED' AND state <> 'PURGED'",
    [OQ_EVENTS] = "SELECT count(*) FROM obx_event",
    [OQ_ORPHANS] = "SELECT count(*) FROM sim_orders o WHERE NOT EXISTS (SELECT 1 FROM obx_event e "
                   "WHERE e.event_id = o.event_id)",
    [OQ_REFERENCED] = "SELECT count(*) FROM obx_event e WHERE EXISTS (SELECT 1 FROM sim_orders o "
                      "WHERE o.event_id = e.event_id)",
    [OQ_DIVERGENT] = "SELECT count(*) FROM obx_receipt r JOIN obx_envelope v ON v.event_id = "
                     "r.event_id AND v.envelope_gen = r.envelope_gen WHERE r.kind = 'PRIMARY' AND "
                     "(r.payload_digest <> v.payload_digest OR r.dest_digest <> v.dest_digest)",
    [OQ_MULTI_PRIMARY] = "SELECT count(*) FROM (SELECT 1 FROM obx_receipt WHERE kind = 'PRIMARY' "
                         "GROUP BY event_id, envelope_gen HAVING count(*) > 1) x",
    [OQ_STALE] = "SELECT count(*) FROM obx_attempt t WHERE NOT EXISTS (SELECT 1 FROM obx_audit a "
                 "WHERE a.event_id = t.event_id AND a.claim_gen = t.claim_gen AND a.who = t.owner "
                 "AND (a.to_state = 'CLAIMED' OR a.to_state = 'RECONCILING' OR a.to_state = "
                 "'RETRY_CLAIMED'))",
    [OQ_UNKNOWN_TOTAL] = "SELECT count(*) FROM obx_attempt WHERE unknown_at > 0",
    [OQ_UNTRACEABLE] = "SELECT count(*) FROM obx_audit a WHERE a.to_state = 'DISPATCH_UNKNOWN' AND "
                       "NOT EXISTS (SELECT 1 FROM obx_attempt t WHERE t.attempt_id = a.attempt_id "
                       "AND t.event_id = a.event_id AND t.unknown_at > 0)",
    [OQ_RACING] = "SELECT count(*) FROM obx_audit WHERE (from_state = 'RETRY_CLAIMED' AND to_state "
                  "= 'PUBLISHED') OR (actor = 'reconciler' AND reason LIKE 'stale claim refused%')",
    [OQ_BOTH_ACKED] = "SELECT count(*) FROM obx_receipt r JOIN obx_event e ON e.event_id = "
                      "r.event_id WHERE r.kind = 'DUPLICATE' AND r.attempt_id <> "
                      "e.primary_attempt_id",
    [OQ_QUARANTINED] = "SELECT count(*) FROM obx_receipt WHERE kind = 'QUARANTINED'",
    [OQ_STUCK] = "SELECT event_id, state, claim_gen, owner, lease_until, next_check_at FROM "
                 "obx_event ORDER BY seq",
    /* every move: the event and the generation it left */
    [OQ_MIGRATIONS] = "SELECT event_id, envelope_gen - 1 FROM obx_receipt WHERE kind = "
                      "'MIGRATION' ORDER BY receipt_id",
    /* the liveness phase's clock: the earliest lease end, check or backoff end of an
     * unpublished event, and when the earliest held event is old enough for the operator */
    [OQ_NEXT_DUE] = "SELECT (SELECT min(t) FROM (SELECT lease_until AS t FROM obx_event WHERE "
                    "state IN ('CLAIMED', 'SENDING', 'RECONCILING', 'RETRY_CLAIMED') UNION ALL "
                    "SELECT next_check_at FROM obx_event WHERE state = 'DISPATCH_UNKNOWN' UNION "
                    "ALL SELECT available_at FROM obx_event WHERE state = 'PENDING') x), "
                    "(SELECT min(held_at) + $1 FROM obx_event WHERE held_at > 0)",
    /* UNKNOWN episodes that never ended: the event was UNKNOWN and is not published */
    [OQ_UNRESOLVED] = "SELECT count(*) FROM obx_event WHERE unknown_since > 0 AND state <> "
                      "'PUBLISHED' AND state <> 'RETAINED' AND state <> 'PURGED'",
    /* events the reconciler ever held for an operator */
    [OQ_HELD_EVER] = "SELECT count(DISTINCT event_id) FROM obx_audit WHERE actor = 'reconciler' "
                     "AND (reason LIKE 'held for an operator%' OR reason LIKE 'cannot tell past "
                     "the quiet time; the route''s UNKNOWN policy is hold%')",
};

bool obx__simq_run(wk *k, int q, const oparam *p, int n, ocur *c) {
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

bool obx__simq_next(wk *k, ocur *c) {
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

bool obx__simq_null(const ocur *c, int col) {
    return c->res ? PQgetisnull(c->res, c->row, col)
                  : sqlite3_column_type(c->st, col) == SQLITE_NULL;
}

const char *obx__simq_text(const ocur *c, int col) {
    const char *v =
        c->res ? PQgetvalue(c->res, c->row, col) : (const char *)sqlite3_column_text(c->st, col);
    return v ? v : "";
}

int64_t obx__simq_int(const ocur *c, int col) {
    return c->res ? strtoll(PQgetvalue(c->res, c->row, col), NULL, 10)
                  : sqlite3_column_int64(c->st, col);
}

void obx__simq_close(ocur *c) {
    if (c->res) PQclear(c->res);
    if (c->st) sqlite3_reset(c->st);
    memset(c, 0, sizeof *c);
}

/* The first column of the first row as an integer; -1 when the query failed or had no row. */
long obx__simq_long(wk *k, int q, const oparam *p, int n) {
    ocur c;
    long v = -1;
    if (obx__simq_run(k, q, p, n, &c) && obx__simq_next(k, &c)) v = (long)obx__simq_int(&c, 0);
    obx__simq_close(&c);
    return v;
}

/* A statement with no result rows (the business insert); false on failure. */
bool obx__simq_exec(wk *k, int q, const oparam *p, int n) {
    ocur c;
    bool ok = obx__simq_run(k, q, p, n, &c);
    if (ok) obx__simq_next(k, &c);
    ok = ok && c.ok;
    obx__simq_close(&c);
    return ok;
}

/* BEGIN (which = 0) or ROLLBACK (1) of a trace's outer transaction on SQLite database db_i (0:
 * the outbox, 1 and 2: the consumers), prepared once per worker: parsing them twice per trace
 * and database cost about 1.5% of a trace. */
int obx__simq_tx(wk *k, int db_i, int which) {
    sqlite3 *db = db_i ? k->cdb[db_i - 1] : k->odb;
    sqlite3_stmt **st = &k->st_tx[db_i][which];
    if (!*st && sqlite3_prepare_v3(db, which ? "ROLLBACK" : "BEGIN", -1, SQLITE_PREPARE_PERSISTENT,
                                   st, NULL) != SQLITE_OK)
        return sqlite3_errcode(db);
    int rc = sqlite3_step(*st);
    sqlite3_reset(*st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* BEGIN / ROLLBACK of the trace's outer transaction on the outbox connection. */
void obx__simq_outer(wk *k, const char *sql) {
    if (k->opg) {
        PGresult *r = PQexec(k->opg, sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            fail(k, "sim: %s: %s", sql, PQerrorMessage(k->opg));
        PQclear(r);
    } else if (obx__simq_tx(k, 0, strcmp(sql, "BEGIN") != 0) != SQLITE_OK)
        fail(k, "sim: %s: %s", sql, sqlite3_errmsg(k->odb));
}

/* When consumer i applied event_id (virtual ms), or -1: never. */
int64_t obx__simq_consumed_at(wk *k, int i, const char *event_id) {
    char cid[16];
    snprintf(cid, sizeof cid, "consumer-%d", i);
    sqlite3_stmt *st = k->st_inbox_at[i];
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, cid, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, event_id, -1, SQLITE_TRANSIENT);
    int64_t at = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL
                     ? sqlite3_column_int64(st, 0)
                     : -1;
    sqlite3_reset(st);
    return at;
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
