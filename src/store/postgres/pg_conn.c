/*
 * pg_conn.c — the PostgreSQL store's connection: errors, the connection's readiness and its
 * reconnection, running one prepared statement (run), reading a bytea column, and the
 * transactions' statements (obx__pg_tx, for the nesting of shared.c).
 *
 * Contracts (numbered as in pg_store.c):
 *   3. Transactions nest: the outermost begin on a connection that is not in a transaction is
 *      BEGIN (READ COMMITTED, the server default); every other begin is a SAVEPOINT. obx never
 *      commits nor rolls back a transaction it did not begin.
 *   5. Errors (obx__pg_map_error): OB001 from the frozen-data triggers -> OBX_EIMMUTABLE; 23505
 *      unique violation -> OBX_ECONFLICT; 42501 insufficient privilege (row-level security
 *      included) -> OBX_EDENIED; 40001 serialization failure, 40P01 deadlock, 55P03 lock
 *      timeout, 57014 statement timeout -> OBX_EBUSY (retriable: the server rolled the
 *      statement back; inside a transaction the caller rolls back and retries the whole
 *      transaction); a lost connection -> OBX_ECONNLOST; a connection lost while COMMIT was in
 *      flight -> OBX_EUNKNOWN (the server may or may not have committed), never success.
 *      A standalone statement (no transaction open) that lost a serialization or deadlock race
 *      is retried here, since nothing of it was applied.
 *   6. A lost owned connection is re-established (PQreset) at the next call outside a
 *      transaction; inside one every call fails with OBX_ECONNLOST until the caller has rolled
 *      back to depth 0. A borrowed connection is never reset.
 */
#include "store/postgres/pg_int.h"

/* ---- errors ------------------------------------------------------------------------------- */

bool obx__pg_conn_lost_state(const char *st) {
    return st && (!strncmp(st, "08", 2) || !strcmp(st, "57P01") || !strcmp(st, "57P02") ||
                  !strcmp(st, "57P03"));
}

static void primary_message(pg_store *s, const PGresult *r, char *out, size_t cap) {
    const char *m = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    obx__strlcpy(out, m ? m : PQerrorMessage(s->conn), cap);
    for (char *c = out; *c; c++)
        if (*c == '\n' || *c == '\t') *c = ' ';
    size_t n = strlen(out);
    while (n && out[n - 1] == ' ') out[--n] = '\0';
    if (!*out) obx__strlcpy(out, "no message from the server", cap);
}

/* The one place where PostgreSQL's errors become obx codes (contract 5). */
obx_err obx__pg_map_error(pg_store *s, const PGresult *r, const char *what) {
    const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    char msg[768];
    primary_message(s, r, msg, sizeof msg);
    if (PQstatus(s->conn) != CONNECTION_OK || obx__pg_conn_lost_state(st)) {
        if (s->tx.depth > 0) s->lost = true;
        return obx__fail(OBX_ECONNLOST, "postgres: connection lost (%s): %s", what, msg);
    }
    if (!st) return obx__fail(OBX_ESTORE, "postgres: %s (%s)", msg, what);
    if (!strcmp(st, "OB001")) return obx__fail(OBX_EIMMUTABLE, "%s (%s)", msg, what);
    if (!strcmp(st, "OB002")) return obx__fail(OBX_EINVAL, "%s", msg);
    if (!strcmp(st, "OB003")) return obx__fail(OBX_ETOOBIG, "%s", msg);
    if (!strcmp(st, "OB004")) return obx__fail(OBX_ENOROUTE, "%s", msg);
    if (!strcmp(st, "OB005")) return obx__fail(OBX_ECONFLICT, "%s (%s)", msg, what);
    if (!strcmp(st, "OB006")) return obx__fail(OBX_ENOTFOUND, "%s (%s)", msg, what);
    if (!strcmp(st, "23505")) return obx__fail(OBX_ECONFLICT, "postgres: %s (%s)", msg, what);
    if (!strcmp(st, "40001") || !strcmp(st, "40P01") || !strcmp(st, "55P03") ||
        !strcmp(st, "57014"))
        return obx__fail(OBX_EBUSY, "postgres: %s [SQLSTATE %s] (%s): retry the transaction", msg,
                         st, what);
    if (!strncmp(st, "53", 2))
        return obx__fail(OBX_EIO, "postgres: %s [SQLSTATE %s] (%s)", msg, st, what);
    /* insufficient privilege, row-level security included: denied to this role, for good (not
     * a protocol guard's refusal: the caller could not look, or write, as this role) */
    if (!strcmp(st, "42501"))
        return obx__fail(OBX_EDENIED, "postgres: %s [SQLSTATE %s] (%s)", msg, st, what);
    return obx__fail(OBX_ESTORE, "postgres: %s [SQLSTATE %s] (%s)", msg, st, what);
}

/* Takes r. OBX_OK when it carries the expected status; *out (may be NULL) then owns it. */
obx_err obx__pg_check(pg_store *s, PGresult *r, ExecStatusType want, PGresult **out,
                      const char *what) {
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st == want || (want == PGRES_COMMAND_OK && st == PGRES_TUPLES_OK)) {
        if (out)
            *out = r;
        else
            PQclear(r);
        return OBX_OK;
    }
    /* the schema made again under this connection: a row type's OID is no longer the type's
     * ("wrong element type"), or the statement was prepared with the old type ("cache lookup
     * failed for type"): obx__pg_rec_oids prepares them again before the next statement */
    const char *code = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    if (code && (!strcmp(code, "42804") ||
                 (!strcmp(code, "XX000") && msg && strstr(msg, "cache lookup failed for type"))))
        s->rec_stale = true;
    obx_err e = obx__pg_map_error(s, r, what);
    PQclear(r);
    return e;
}

/* The OIDs of the batch statements' row types (schema.sql), read once per connection: a binary
 * array names its element type, and the server checks it against the statement's (the names are
 * qualified, so the session's search_path does not matter). Read outside any pipeline, before the
 * statement that needs them; a plain catalogue read, so also harmless inside the caller's
 * transaction. After obx__pg_check() saw a type change under the connection (rec_stale), the
 * statements that take the types are deallocated first, to be prepared again with the new ones. */
obx_err obx__pg_rec_oids(pg_store *s) {
    if (s->rec_stale) {
        static const int uses[] = {Q_UPD_EVENTS, Q_INS_ATT, Q_UPD_ATT, Q_INS_RCPT};
        for (size_t i = 0; i < sizeof uses / sizeof uses[0]; i++) {
            if (!s->prepared[uses[i]]) continue;
            char name[40], sql[64];
            obx__pg_stmt_name(uses[i], name);
            snprintf(sql, sizeof sql, "DEALLOCATE %s", name);
            PQclear(PQexec(s->conn, sql)); /* gone already is as good */
            s->prepared[uses[i]] = false;
        }
        memset(s->rec_oid, 0, sizeof s->rec_oid);
        s->rec_stale = false;
    }
    if (s->rec_oid[0]) return OBX_OK;
    PGresult *r = NULL;
    obx_err e = obx__pg_check(s,
                              PQexec(s->conn, "SELECT 'obx._event_update'::regtype::oid, "
                                              "'obx._attempt_insert'::regtype::oid, "
                                              "'obx._attempt_update'::regtype::oid, "
                                              "'obx._receipt_insert'::regtype::oid"),
                              PGRES_TUPLES_OK, &r, "the batch statements' row types");
    if (e) return e;
    for (int i = 0; i < RT_COUNT; i++)
        s->rec_oid[i] = (uint32_t)strtoul(PQgetvalue(r, 0, i), NULL, 10);
    PQclear(r);
    return OBX_OK;
}

/* ---- connection ------------------------------------------------------------------------------ */

static void forget_session(pg_store *s) {
    memset(s->prepared, 0, sizeof s->prepared);
    memset(s->rec_oid, 0, sizeof s->rec_oid);
    s->listening = false;
    s->wait_fn = 0;
    s->wake_c = 0;
    s->wake_held = false; /* a session lock ends with its session */
    s->names_checked = false;
}

static obx_err held_send(pg_store *s, bool commit);

/* Contract 6: usable connection or OBX_ECONNLOST. What the transaction has not sent yet
 * (pend) stays unsent: for the callers that put it in their pipeline (obx__pg_ws_run); a held write
 * set is sent first (its errors are this call's). */
obx_err obx__pg_conn_ready(pg_store *s, const char *what) {
    if (s->held) {
        obx_err e = held_send(s, false);
        if (e) return e;
    }
    if (s->tx.depth > 0 && s->lost)
        return obx__fail(OBX_ECONNLOST,
                         "postgres: connection lost earlier in this transaction (%s): roll back",
                         what);
    if (PQstatus(s->conn) == CONNECTION_OK) return OBX_OK;
    if (s->tx.depth > 0 || !s->owned)
        return obx__fail(OBX_ECONNLOST, "postgres: connection lost (%s): %s", what,
                         PQerrorMessage(s->conn));
    PQreset(s->conn);
    forget_session(s);
    if (PQstatus(s->conn) != CONNECTION_OK)
        return obx__fail(OBX_ECONNLOST, "postgres: cannot reconnect (%s): %s", what,
                         PQerrorMessage(s->conn));
    return OBX_OK;
}

/* The unsent part of the transaction (pend), sent on its own: for every statement that is not
 * in a pipeline. */
static obx_err pend_flush(pg_store *s, const char *what) {
    unsigned p = s->pend;
    if (!p) return OBX_OK;
    s->pend = 0;
    char sql[512];
    snprintf(sql, sizeof sql, "%s%s%s%s%s", p & P_BEGIN ? "BEGIN" : "",
             p & P_BEGIN && p & (P_RELAY | P_CLAIM) ? "; " : "", p & P_RELAY ? RELAY_PLANS : "",
             p & P_RELAY && p & P_CLAIM ? "; " : "", p & P_CLAIM ? CLAIM_PLANS : "");
    return obx__pg_check(s, PQexec(s->conn, sql), PGRES_COMMAND_OK, NULL, what);
}

/* obx__pg_conn_ready, then the transaction's unsent part: the connection is where the caller's
 * transaction says it is. */
obx_err obx__pg_ready(pg_store *s, const char *what) {
    obx_err e = obx__pg_conn_ready(s, what);
    return e ? e : pend_flush(s, what);
}

obx_err obx__pg_exec_simple(pg_store *s, const char *sql, const char *what) {
    obx_err e = obx__pg_ready(s, what);
    if (e) return e;
    return obx__pg_check(s, PQexec(s->conn, sql), PGRES_COMMAND_OK, NULL, what);
}

/* Frees ns statements and their parameters (st may be NULL). */
void obx__pg_ws_free(ws_stmt *st, size_t ns) {
    for (size_t i = 0; st && i < ns; i++) p_free(&st[i].p);
    free(st);
}

void obx__pg_held_drop(pg_store *s) {
    obx__pg_ws_free(s->held, s->n_held);
    s->held = NULL;
    s->n_held = 0;
}

/* Sends the held write set (obx__pg_write_set), then COMMIT in the same pipeline when commit (from
 * commit_outer: the transaction's depth is already 0). Its failures are the caller's. */
static obx_err held_send(pg_store *s, bool commit) {
    ws_stmt *st = s->held;
    size_t ns = s->n_held;
    s->held = NULL; /* sent once, whatever happens (obx__pg_conn_ready: no recursion) */
    s->n_held = 0;
    obx_err e;
    if (commit && (s->lost || PQstatus(s->conn) != CONNECTION_OK)) {
        s->pend = 0; /* never reconnect here: the transaction died with the connection */
        e = obx__fail(OBX_ECONNLOST, "postgres: connection lost before COMMIT: the transaction "
                                     "was not committed");
    } else {
        e = obx__pg_ws_run(s, st, ns, NULL, NULL, commit);
    }
    obx__pg_ws_free(st, ns);
    return e;
}

static bool retriable_race(const PGresult *r) {
    const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    return st && (!strcmp(st, "40001") || !strcmp(st, "40P01"));
}

/* Runs prepared statement id with p (may be NULL). want: PGRES_TUPLES_OK or PGRES_COMMAND_OK;
 * *out (may be NULL) gets the result on success (PQclear it). */
obx_err obx__pg_run(pg_store *s, int id, params *p, ExecStatusType want, PGresult **out,
                    const char *what) {
    if (p) {
        obx_err pe = obx__pg_p_ready(s, p, id, what);
        if (pe) return pe;
    }
    if (s->pend) { /* the transaction's first statement: one pipeline with its BEGIN */
        ws_stmt one = {.id = id, .kind = WS_KEEP, .what = what, .want = want};
        if (p) one.p = *p; /* shares p's buffers: not freed here */
        PGresult *r = NULL;
        obx_err e = obx__pg_ws_run(s, &one, 1, NULL, &r, false);
        if (!e && out)
            *out = r;
        else
            PQclear(r);
        return e;
    }
    char name[40];
    obx__pg_stmt_name(id, name);
    for (int attempt = 0;; attempt++) {
        obx_err e = obx__pg_ready(s, what);
        if (e) return e;
        if ((e = obx__pg_prepare(s, id))) {
            /* PREPARE found the connection lost: nothing ran, so any statement may go again */
            if (e == OBX_ECONNLOST && s->owned && s->tx.depth == 0 && attempt == 0) continue;
            return e;
        }
        PGresult *r = PQexecPrepared(s->conn, name, p ? p->n : 0, p ? p->val : NULL,
                                     p ? p->len : NULL, p ? p->fmt : NULL, 0);
        ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
        bool standalone = s->tx.depth == 0 && (PQstatus(s->conn) != CONNECTION_OK ||
                                               PQtransactionStatus(s->conn) == PQTRANS_IDLE);
        /* contract 6: a read found the connection lost; reconnect (ready) and read again */
        if (PQstatus(s->conn) != CONNECTION_OK && standalone && s->owned &&
            obx__pg_q_readonly[id] && attempt == 0) {
            PQclear(r);
            continue;
        }
        if (st != want && st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK && r) {
            const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
            /* a caller reset its session (DISCARD ALL): every statement is gone, and each is
             * prepared again when next used; this one again now where that is harmless (inside
             * a transaction the error has failed it) */
            if (code && !strcmp(code, "26000")) {
                memset(s->prepared, 0, sizeof s->prepared);
                if (standalone && attempt == 0) {
                    PQclear(r);
                    s->names_checked = true;
                    continue;
                }
            }
            /* contract 5: a standalone statement that lost a race was not applied at all */
            if (retriable_race(r) && standalone && attempt < 3) {
                PQclear(r);
                continue;
            }
        }
        return obx__pg_check(s, r, want, out, what);
    }
}

static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A bytea column in text format into a malloc'ed buffer (*out NULL for SQL NULL). Handles the
 * hex format (the default) and, through libpq, a session's bytea_output = escape. */
obx_err obx__pg_get_bytea(const PGresult *r, int row, int col, unsigned char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (PQgetisnull(r, row, col)) return OBX_OK;
    const char *t = PQgetvalue(r, row, col);
    size_t tl = (size_t)PQgetlength(r, row, col);
    if (tl >= 2 && t[0] == '\\' && t[1] == 'x') {
        size_t n = (tl - 2) / 2;
        unsigned char *b = malloc(n ? n : 1);
        if (!b) return obx__fail(OBX_ENOMEM, "payload: out of memory");
        for (size_t i = 0; i < n; i++) {
            int hi = hexv(t[2 + 2 * i]), lo = hexv(t[3 + 2 * i]);
            if (hi < 0 || lo < 0) {
                free(b);
                return obx__fail(OBX_ESTORE, "postgres: malformed bytea from the server");
            }
            b[i] = (unsigned char)(hi << 4 | lo);
        }
        *out = b;
        *len = n;
        return OBX_OK;
    }
    size_t n = 0;
    unsigned char *u = PQunescapeBytea((const unsigned char *)t, &n);
    if (!u) return obx__fail(OBX_ENOMEM, "payload: out of memory");
    unsigned char *b = malloc(n ? n : 1);
    if (b) memcpy(b, u, n);
    PQfreemem(u);
    if (!b) return obx__fail(OBX_ENOMEM, "payload: out of memory");
    *out = b;
    *len = n;
    return OBX_OK;
}

/* ---- transactions (contract 3) --------------------------------------------------------------- */

/* The nesting is shared (obx__tx_begin, shared.c); these are PostgreSQL's statements for it. */

/* Depth 0: our own connection left in a transaction (e.g. a failed COMMIT) is rolled back, being
 * nobody else's; a caller's transaction is joined unless it has failed already. */
obx_err obx__pg_tx_in_tx(obx__store *base, bool *in_tx) {
    pg_store *s = (pg_store *)base;
    obx_err e;
    if ((e = obx__pg_ready(s, "begin"))) return e;
    PGTransactionStatusType ts = PQtransactionStatus(s->conn);
    if (s->owned && ts != PQTRANS_IDLE) {
        if ((e = obx__pg_exec_simple(s, "ROLLBACK", "begin"))) return e;
        ts = PQtransactionStatus(s->conn);
    }
    *in_tx = ts != PQTRANS_IDLE;
    if (ts == PQTRANS_INERROR)
        return obx__fail(OBX_ESTORE,
                         "postgres: the caller's transaction has already failed: roll it back");
    if (*in_tx && ts != PQTRANS_INTRANS)
        return obx__fail(OBX_ESTORE, "postgres: the connection is busy with another command");
    if (*in_tx) s->lost = false;
    return OBX_OK;
}

/* A relay connection's BEGIN is not sent here: it goes with the transaction's first statement,
 * in one pipeline (pend), and a transaction that sends nothing costs nothing. */
static obx_err tx_begin(obx__store *base) {
    pg_store *s = (pg_store *)base;
    if (s->dispatch) {
        s->pend = P_BEGIN | P_RELAY;
        s->lost = false;
        return OBX_OK;
    }
    obx_err e = obx__pg_exec_simple(s, "BEGIN", "begin");
    if (!e) s->lost = false;
    return e;
}

/* COMMIT's result r (consumed; NULL when none came): definite success, definite failure, or
 * OBX_EUNKNOWN when the connection broke while COMMIT was in flight (contract 5). */
obx_err obx__pg_commit_result(pg_store *s, PGresult *r) {
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st == PGRES_COMMAND_OK) {
        /* COMMIT of a failed transaction reports success with the tag ROLLBACK */
        bool rolled_back = strcmp(PQcmdStatus(r), "COMMIT") != 0;
        PQclear(r);
        if (rolled_back)
            return obx__fail(OBX_ESTORE, "postgres: COMMIT rolled back: a statement of the "
                                         "transaction had failed");
        return OBX_OK;
    }
    const char *code = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (!r || PQstatus(s->conn) != CONNECTION_OK || obx__pg_conn_lost_state(code)) {
        char msg[512];
        primary_message(s, r, msg, sizeof msg);
        PQclear(r);
        return obx__fail(OBX_EUNKNOWN,
                         "postgres: connection lost during COMMIT: the transaction may or may "
                         "not have been committed (%s)",
                         msg);
    }
    /* the server answered: COMMIT failed (deferred constraint, serialization), rolled back */
    obx_err e = obx__pg_map_error(s, r, "commit");
    PQclear(r);
    return e;
}

/* The outermost COMMIT: definite success, definite failure, or OBX_EUNKNOWN when the connection
 * broke while COMMIT was in flight (contract 5). A held write set goes in COMMIT's pipeline. */
static obx_err commit_outer(pg_store *s) {
    if (s->held) return held_send(s, true);
    bool begun = !(s->pend & P_BEGIN);
    s->pend = 0;
    if (!begun) return OBX_OK; /* nothing was sent: nothing to commit */
    if (s->lost || PQstatus(s->conn) != CONNECTION_OK)
        return obx__fail(OBX_ECONNLOST, "postgres: connection lost before COMMIT: the "
                                        "transaction was not committed");
    return obx__pg_commit_result(s, PQexec(s->conn, "COMMIT"));
}

static obx_err tx_commit(obx__store *base) { return commit_outer((pg_store *)base); }

static obx_err tx_rollback(obx__store *base) {
    pg_store *s = (pg_store *)base;
    obx__pg_held_drop(s); /* never sent: nothing of it to roll back */
    bool begun = !(s->pend & P_BEGIN);
    s->pend = 0;
    return begun ? obx__pg_exec_simple(s, "ROLLBACK", "rollback") : OBX_OK;
}

static obx_err tx_savepoint(obx__store *base, int d, obx__sp_op op) {
    char sql[96];
    if (op == OBX__SP_OPEN)
        snprintf(sql, sizeof sql, "SAVEPOINT obx_sp%d", d);
    else if (op == OBX__SP_RELEASE)
        snprintf(sql, sizeof sql, "RELEASE SAVEPOINT obx_sp%d", d);
    else
        snprintf(sql, sizeof sql, "ROLLBACK TO SAVEPOINT obx_sp%d; RELEASE SAVEPOINT obx_sp%d", d,
                 d);
    return obx__pg_exec_simple((pg_store *)base, sql,
                               op == OBX__SP_OPEN      ? "savepoint"
                               : op == OBX__SP_RELEASE ? "release savepoint"
                                                       : "rollback to savepoint");
}

/* nothing of a transaction survives its connection: rolled back already, by the server */
static bool tx_gone(obx__store *base) {
    pg_store *s = (pg_store *)base;
    return s->lost || PQstatus(s->conn) != CONNECTION_OK;
}

static void tx_idle(obx__store *base) {
    pg_store *s = (pg_store *)base;
    s->lost = false;
    obx__pg_held_drop(s); /* the transaction is over: a write set still held belonged to it */
}

const obx__tx_ops obx__pg_tx = {obx__pg_tx_in_tx, tx_begin, tx_commit, tx_rollback,
                                tx_savepoint,     tx_gone,  tx_idle};

void obx__pg_serve_dispatch(obx__store *base) { ((pg_store *)base)->dispatch = true; }
