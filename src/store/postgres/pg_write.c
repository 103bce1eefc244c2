/*
 * pg_write.c — the relay's batch writes on PostgreSQL: event updates (compare-and-sets with
 * applied[] per row), attempts, receipts and audit rows, their loads, and a transaction's
 * writes in one round trip (write_set: on a relay connection held back and sent with the
 * transaction's COMMIT, each statement checking itself).
 *
 * Contracts (numbered as in pg_store.c):
 *   4. A batch is one round trip: rows travel as parameter arrays that the statement
 *      unnest()s; per-row results (update_events' applied[]) come back by ordinality. A batch
 *      that names the same row twice is cut into runs without repeats, executed in order, so
 *      that it behaves as the same calls one by one.
 */
#include "store/postgres/pg_int.h"

/* Length of the run starting at from in which no key repeats (contract 4): open addressing on
 * a table of 2n slots, -1 = empty. */
static size_t unique_run(const char *(*key)(const void *, size_t), const void *rows, size_t from,
                         size_t n, long *slots, size_t nslots) {
    for (size_t k = 0; k < nslots; k++) slots[k] = -1;
    size_t j = from;
    for (; j < n; j++) {
        const char *kj = key(rows, j);
        uint32_t h = 2166136261u;
        for (const char *c = kj; *c; c++) h = (h ^ (unsigned char)*c) * 16777619u;
        size_t at = h % nslots;
        bool dup = false;
        while (slots[at] >= 0) {
            if (!strcmp(key(rows, (size_t)slots[at]), kj)) {
                dup = true;
                break;
            }
            at = (at + 1) % nslots;
        }
        if (dup) break;
        slots[at] = (long)j;
    }
    return j - from;
}

static const char *update_key(const void *rows, size_t i) {
    return ((const obx__event_update *)rows)[i].row->env.event_id;
}

/* The parameters of Q_UPD_EVENTS for n updates with distinct event IDs. check: the statement
 * raises unless all n apply (WS_CHECK; the write set), else it reports which did. */
static obx_err build_update_events(params *p, const obx__event_update *u, size_t n, bool check) {
    char(*ok)[ORDER_KEY_CAP] = malloc(n * sizeof *ok);
    if (!ok) return obx__fail(OBX_ENOMEM, "update events: out of memory");
    obx__buf *b = r_begin(p, RT_EVENT_UPDATE);
    for (size_t i = 0; i < n; i++) {
        const obx__event_row *w = u[i].row;
        obx__pg_order_key(w, ok[i], sizeof ok[i]);
        size_t at = r_row(p, b, 21); /* obx._event_update */
        r_text(b, w->env.event_id);
        r_int4(b, w->envelope_gen);
        r_text(b, obx__state_name(w->state));
        r_int8(b, w->claim_gen);
        r_text(b, w->owner);
        r_int8(b, w->lease_until);
        r_int4(b, w->attempt_gen);
        r_text(b, w->attempt_id);
        r_int4(b, w->pinned_partition);
        r_int4(b, w->rejections);
        r_int8(b, w->available_at);
        r_int8(b, w->next_check_at);
        r_int8(b, w->unknown_since);
        r_text(b, w->primary_attempt_id);
        r_int8(b, w->published_at);
        r_int8(b, w->updated_at);
        r_text(b, ok[i]);
        r_text(b, w->dest.cluster);
        r_text(b, obx__state_name(u[i].expect_state));
        r_int8(b, u[i].expect_claim_gen);
        r_int8(b, w->held_at);
        r_row_end(b, at);
    }
    r_end(p);
    p_int(p, check ? (int64_t)n : -1);
    free(ok);
    return OBX_OK;
}

/* Which of Q_UPD_EVENTS's n updates applied (its RETURNING ord); consumes r. */
static void read_applied(PGresult *r, size_t n, bool *applied) {
    for (size_t i = 0; i < n; i++) applied[i] = false;
    for (int k = 0; k < PQntuples(r); k++) {
        int64_t ord = gi(r, k, 0);
        if (ord >= 1 && (size_t)ord <= n) applied[ord - 1] = true;
    }
    PQclear(r);
}

static obx_err update_events_run(pg_store *s, const obx__event_update *u, size_t n, bool *applied) {
    params p;
    p_init(&p);
    obx_err e = build_update_events(&p, u, n, false);
    PGresult *r = NULL;
    if (!e) e = obx__pg_run(s, Q_UPD_EVENTS, &p, PGRES_TUPLES_OK, &r, "update events");
    p_free(&p);
    if (e) return e;
    read_applied(r, n, applied);
    return OBX_OK;
}

obx_err obx__pg_update_events(obx__store *base, const obx__event_update *u, size_t n,
                              bool *applied) {
    pg_store *s = (pg_store *)base;
    size_t nslots = 2 * n + 1;
    long *slots = malloc(nslots * sizeof *slots);
    if (!slots) return obx__fail(OBX_ENOMEM, "update events: out of memory");
    obx_err e = OBX_OK;
    for (size_t at = 0; at < n && !e;) {
        size_t len = unique_run(update_key, u, at, n, slots, nslots);
        e = update_events_run(s, u + at, len, applied + at);
        at += len;
    }
    free(slots);
    return e;
}

/* ---- attempts, receipts, audit, counters --------------------------------------------------- */

/* The last five columns of obx._attempt_insert and obx._attempt_update: what came of the
 * attempt. */
static void r_attempt_outcome(obx__buf *b, const obx__attempt_row *a) {
    r_int8(b, a->unknown_at);
    r_int8(b, a->ended_at);
    r_int8(b, a->offset_before);
    r_int8(b, a->quiet_until);
    r_text(b, a->detail);
}

/* The parameters of Q_INS_ATT. */
static void build_insert_attempts(params *p, const obx__attempt_row *a, size_t n) {
    obx__buf *b = r_begin(p, RT_ATTEMPT_INSERT);
    for (size_t i = 0; i < n; i++) {
        size_t at = r_row(p, b, 15); /* obx._attempt_insert */
        r_text(b, a[i].attempt_id);
        r_text(b, a[i].event_id);
        r_int4(b, a[i].envelope_gen);
        r_int4(b, a[i].attempt_gen);
        r_int8(b, a[i].claim_gen);
        r_text(b, a[i].owner);
        r_text(b, a[i].dest_digest);
        r_int4(b, a[i].partition);
        r_text(b, obx__attempt_state_name(a[i].state));
        r_int8(b, a[i].started_at);
        r_attempt_outcome(b, &a[i]);
        r_row_end(b, at);
    }
    r_end(p);
}

obx_err obx__pg_insert_attempts(obx__store *base, const obx__attempt_row *a, size_t n) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    build_insert_attempts(&p, a, n);
    obx_err e = obx__pg_run(s, Q_INS_ATT, &p, PGRES_COMMAND_OK, NULL, "insert attempts");
    p_free(&p);
    return e;
}

static const char *attempt_key(const void *rows, size_t i) {
    return ((const obx__attempt_row *)rows)[i].attempt_id;
}

/* The parameters of Q_UPD_ATT for n attempts with distinct IDs. check: the statement raises
 * unless all n exist (WS_CHECK; the write set). */
static void build_update_attempts(params *p, const obx__attempt_row *a, size_t n, bool check) {
    obx__buf *b = r_begin(p, RT_ATTEMPT_UPDATE);
    for (size_t i = 0; i < n; i++) {
        size_t at = r_row(p, b, 8); /* obx._attempt_update */
        r_text(b, a[i].attempt_id);
        r_int4(b, a[i].partition);
        r_text(b, obx__attempt_state_name(a[i].state));
        r_attempt_outcome(b, &a[i]);
        r_row_end(b, at);
    }
    r_end(p);
    p_int(p, check ? (int64_t)n : -1);
}

/* Q_UPD_ATT's RETURNING against the n attempts asked for: the first one missing is named;
 * consumes r. */
static obx_err check_updated_attempts(PGresult *r, const obx__attempt_row *a, size_t n) {
    obx_err e = OBX_OK;
    if ((size_t)PQntuples(r) != n) {
        /* name the first attempt that did not match (ids in a run are distinct) */
        for (size_t i = 0; i < n && !e; i++) {
            bool seen = false;
            for (int k = 0; k < PQntuples(r) && !seen; k++)
                seen = !strcmp(PQgetvalue(r, k, 0), a[i].attempt_id);
            if (!seen) e = obx__fail(OBX_ENOTFOUND, "attempt %s not found", a[i].attempt_id);
        }
    }
    PQclear(r);
    return e;
}

static obx_err update_attempts_run(pg_store *s, const obx__attempt_row *a, size_t n) {
    params p;
    p_init(&p);
    build_update_attempts(&p, a, n, false);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_UPD_ATT, &p, PGRES_TUPLES_OK, &r, "update attempts");
    p_free(&p);
    if (e) return e;
    return check_updated_attempts(r, a, n);
}

obx_err obx__pg_update_attempts(obx__store *base, const obx__attempt_row *a, size_t n) {
    pg_store *s = (pg_store *)base;
    size_t nslots = 2 * n + 1;
    long *slots = malloc(nslots * sizeof *slots);
    if (!slots) return obx__fail(OBX_ENOMEM, "update attempts: out of memory");
    obx_err e = OBX_OK;
    for (size_t at = 0; at < n && !e;) {
        size_t len = unique_run(attempt_key, a, at, n, slots, nslots);
        e = update_attempts_run(s, a + at, len);
        at += len;
    }
    free(slots);
    return e;
}

static void read_attempt(const PGresult *r, int row, obx__attempt_row *a) {
    obx__attempt_decode(READER(r, row), a);
}

/* The attempts of result r (consumed) into *out (the caller's, free()), *n_out. */
static obx_err collect_attempts(PGresult *r, obx__attempt_row **out, size_t *n_out) {
    obx_err e = OBX_OK;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "load attempts: out of memory");
        for (int i = 0; !e && i < rows; i++) read_attempt(r, i, &(*out)[i]);
        if (!e) *n_out = (size_t)rows;
    }
    PQclear(r);
    return e;
}

obx_err obx__pg_load_attempts(obx__store *base, const char *const *ids, size_t n,
                              const char *event_id, obx__attempt_row **out, size_t *n_out) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n_out = 0;
    params p;
    p_init(&p);
    if (event_id)
        p_text(&p, event_id);
    else
        ARR_TEXT(&p, n, ids[i]);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, event_id ? Q_LOAD_ATT_EVENT : Q_LOAD_ATT, &p, PGRES_TUPLES_OK, &r,
                            "load attempts");
    p_free(&p);
    return e ? e : collect_attempts(r, out, n_out);
}

/* load_slots: the attempts (Q_LOAD_ATT) and the slots' events (Q_LOAD_SLOTS*) in one
 * pipeline, with the transaction's unsent BEGIN and planner settings (obx__pg_ws_run). The events'
 * statement finds each slot through the attempt itself, so it needs nothing from the first. */
obx_err obx__pg_load_slots(obx__store *base, const char *const *aids, const char *const *eids,
                           size_t n, unsigned flags, obx__attempt_row **att, size_t *n_att,
                           obx__rows *ev) {
    pg_store *s = (pg_store *)base;
    bool pl = flags & OBX__LOAD_PAYLOAD, lock = flags & OBX__LOAD_LOCK;
    ws_stmt st[2] = {
        {.id = Q_LOAD_ATT, .kind = WS_KEEP, .what = "load attempts", .want = PGRES_TUPLES_OK},
        {.id = lock ? Q_LOAD_SLOTS_LOCK : Q_LOAD_SLOTS,
         .kind = WS_KEEP,
         .what = "load events",
         .want = PGRES_TUPLES_OK}};
    p_init(&st[0].p);
    p_init(&st[1].p);
    ARR_TEXT(&st[0].p, n, aids[i]);
    ARR_TEXT(&st[1].p, n, aids[i]);
    ARR_TEXT(&st[1].p, n, eids[i]);
    p_bool(&st[1].p, pl);
    /* as read_ids: a locking load in a transaction the connection did not begin with the
     * relay's planner options gets them in its pipeline */
    if (!s->dispatch && lock && PQtransactionStatus(s->conn) == PQTRANS_INTRANS) s->pend |= P_RELAY;
    PGresult *r[2] = {NULL, NULL};
    obx_err e = obx__pg_ws_run(s, st, 2, NULL, r, false);
    p_free(&st[0].p);
    p_free(&st[1].p);
    if (e) return e; /* obx__pg_ws_run cleared both results */
    if ((e = collect_attempts(r[0], att, n_att))) {
        PQclear(r[1]);
        return e;
    }
    if ((e = obx__pg_collect(r[1], pl, ev, "load events"))) {
        free(*att);
        *att = NULL;
        *n_att = 0;
    }
    return e;
}

/* The parameters of Q_INS_RCPT. */
static void build_insert_receipts(params *p, const obx__receipt_row *rc, size_t n) {
    obx__buf *b = r_begin(p, RT_RECEIPT_INSERT);
    for (size_t i = 0; i < n; i++) {
        size_t at = r_row(p, b, 15); /* obx._receipt_insert */
        r_text(b, rc[i].event_id);
        r_int4(b, rc[i].envelope_gen);
        r_text(b, rc[i].attempt_id);
        r_text(b, obx__receipt_kind_name(rc[i].kind));
        r_text(b, rc[i].cluster);
        r_text(b, rc[i].topic);
        r_int4(b, rc[i].partition);
        r_int8(b, rc[i].offset);
        r_int8(b, rc[i].broker_ts);
        r_text(b, rc[i].payload_digest);
        r_text(b, rc[i].dest_digest);
        r_text(b, rc[i].reason);
        r_text(b, rc[i].detail);
        r_int8(b, rc[i].created_at);
        r_text(b, obx__receipt_source_name(rc[i].source));
        r_row_end(b, at);
    }
    r_end(p);
}

obx_err obx__pg_insert_receipts(obx__store *base, const obx__receipt_row *rc, size_t n) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    build_insert_receipts(&p, rc, n);
    obx_err e = obx__pg_run(s, Q_INS_RCPT, &p, PGRES_COMMAND_OK, NULL, "insert receipts");
    p_free(&p);
    return e;
}

/* Receipts from rows of RCPT_COLS. */
obx_err obx__pg_read_receipts(PGresult *r, const char *what, obx__receipt_row **out,
                              size_t *n_out) {
    obx_err e = OBX_OK;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "%s: out of memory", what);
    }
    for (int i = 0; !e && i < rows; i++) {
        obx__receipt_decode(READER(r, i), &(*out)[i]);
    }
    if (!e) *n_out = (size_t)rows;
    return e;
}

obx_err obx__pg_load_receipts(obx__store *base, const char *event_id, obx__receipt_row **out,
                              size_t *n_out) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n_out = 0;
    params p;
    p_init(&p);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_LOAD_RCPT, &p, PGRES_TUPLES_OK, &r, "load receipts");
    if (e) return e;
    e = obx__pg_read_receipts(r, "load receipts", out, n_out);
    PQclear(r);
    return e;
}

/* The parameters of Q_INS_AUDIT, or of Q_INS_AUDIT_FIND when some row's seq is not known;
 * returns which. */
static int build_insert_audit(params *p, const obx__audit_row *a, size_t n) {
    ARR_INT(p, n, a[i].at);
    ARR_TEXT(p, n, obx__actor_name(a[i].actor));
    ARR_TEXT(p, n, a[i].who);
    ARR_TEXT(p, n, a[i].event_id);
    ARR_INT(p, n, a[i].envelope_gen);
    ARR_TEXT(p, n, obx__state_name(a[i].from));
    ARR_TEXT(p, n, obx__state_name(a[i].to));
    ARR_INT(p, n, a[i].claim_gen);
    ARR_TEXT(p, n, a[i].attempt_id);
    ARR_INT(p, n, a[i].attempt_gen);
    ARR_TEXT(p, n, a[i].reason);
    int64_t lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i].seq <= 0) return Q_INS_AUDIT_FIND;
        if (!i || a[i].seq < lo) lo = a[i].seq;
        if (!i || a[i].seq > hi) hi = a[i].seq;
    }
    p_int(p, lo);
    p_int(p, hi);
    return Q_INS_AUDIT;
}

obx_err obx__pg_insert_audit(obx__store *base, const obx__audit_row *a, size_t n) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    int q = build_insert_audit(&p, a, n);
    obx_err e = obx__pg_run(s, q, &p, PGRES_COMMAND_OK, NULL, "insert audit");
    p_free(&p);
    return e;
}

/* ---- a transaction's writes in one round trip (write_set) ----------------------------------- */

/* The result of the COMMIT that ended obx__pg_ws_run's pipeline, after the statements' (e: theirs;
 * refused: the server answered one with an error, so it did not run the COMMIT: a definite
 * failure, OBX_ECONNLOST if the backend went with it; broke: the connection broke while they
 * were read, so the COMMIT may have run: OBX_EUNKNOWN). Reads COMMIT's result when one is
 * due. */
static obx_err ws_commit_result(pg_store *s, obx_err e, bool refused, bool broke) {
    if (e && !refused && (broke || PQstatus(s->conn) != CONNECTION_OK))
        return obx__fail(OBX_EUNKNOWN,
                         "postgres: connection lost while the write set and its COMMIT were in "
                         "flight: the transaction may or may not have been committed (%s)",
                         obx_errmsg());
    PGresult *r = PQgetResult(s->conn), *more;
    bool got = r != NULL;
    obx_err c = OBX_OK;
    if (refused)
        PQclear(r); /* PGRES_PIPELINE_ABORTED: the server skipped it */
    else
        c = obx__pg_commit_result(s, r);
    while (got && (more = PQgetResult(s->conn)) != NULL) PQclear(more);
    if (!e || refused) return e ? e : c;
    /* no statement failed on the server, but one's result was not what this side expected:
     * the COMMIT ran, and may have committed */
    return c ? e
             : obx__fail(OBX_EUNKNOWN, "postgres: the write set's COMMIT ran after a result this "
                                       "side did not expect");
}

/* A statement's successful result r (consumed or kept): an update's rows to the write set w
 * (NULL: nothing to report, the statement checked itself), the WS_KEEP result to *keep. */
static obx_err ws_take(const ws_stmt *x, PGresult *r, const obx__write_set *w, PGresult **keep) {
    if (x->kind == WS_UPD_EVENTS && w) {
        read_applied(r, x->n, w->applied + x->off);
        return OBX_OK;
    }
    if (x->kind == WS_UPD_ATT && w) return check_updated_attempts(r, w->att + x->off, x->n);
    if (x->kind == WS_KEEP && keep)
        *keep = r;
    else
        PQclear(r);
    return OBX_OK;
}

/* Sends every statement, one sync, then reads the results in order (libpq pipeline mode).
 * The server runs them one after the other in the caller's transaction, exactly as separate
 * calls would; after a failed statement it skips the rest (PGRES_PIPELINE_ABORTED) and the
 * transaction is failed. Results are always read to the sync, so the connection leaves
 * pipeline mode whatever happened, unless it broke. What the transaction has not sent yet
 * (pend: its BEGIN, planner settings) goes first, in the same pipeline. w: the write set the
 * WS_UPD_* statements answer for (NULL if none); keep[j]: the result of the j-th WS_KEEP
 * statement (keep has a slot for each; all NULL on failure).
 * commit: COMMIT goes last, in the same pipeline (held_send; the transaction is over after,
 * committed or rolled back, or OBX_EUNKNOWN: ws_commit_result). */
obx_err obx__pg_ws_run(pg_store *s, ws_stmt *st, size_t ns, const obx__write_set *w,
                       PGresult **keep, bool commit) {
    const char *what = ns ? st[0].what : "pipeline";
    obx_err e = obx__pg_conn_ready(s, what);
    unsigned pend = s->pend;
    /* the unsent part, in order: BEGIN (-1), then the settings' prepared statements */
    int pre[3];
    size_t npre = 0;
    if (pend & P_BEGIN) pre[npre++] = -1;
    if (pend & P_RELAY) pre[npre++] = Q_RELAY_PLANS;
    if (pend & P_CLAIM) pre[npre++] = Q_CLAIM_PLANS;
    for (size_t i = 0; !e && i < npre; i++)
        if (pre[i] >= 0) e = obx__pg_prepare(s, pre[i]);
    for (size_t i = 0; !e && i < ns; i++)
        if (!(e = obx__pg_p_ready(s, &st[i].p, st[i].id, st[i].what)))
            e = obx__pg_prepare(s, st[i].id);
    if (e) return e;
    if (!PQenterPipelineMode(s->conn)) return obx__pg_map_error(s, NULL, "pipeline mode");
    s->pend = 0; /* from here on the server's state says what was sent */
    static const params none;
    size_t sent = 0;
    for (; sent < npre + ns; sent++) {
        bool ok;
        if (sent < npre)
            ok = pre[sent] < 0 ? obx__pg_send_plain(s, "BEGIN")
                               : obx__pg_send_prepared(s, pre[sent], &none);
        else
            ok = obx__pg_send_prepared(s, st[sent - npre].id, &st[sent - npre].p);
        if (!ok) break;
    }
    /* COMMIT only behind every statement: the server skips it after one that failed */
    bool committing = commit && sent == npre + ns && obx__pg_send_plain(s, "COMMIT");
    /* a sync also after a failed send: what was sent is answered, not left pending */
    bool synced = PQpipelineSync(s->conn);
    if (sent < npre + ns || commit != committing || !synced)
        e = obx__pg_map_error(s, NULL, "pipeline: send");
    bool refused = false, broke = false; /* the server failed a statement; the connection broke */
    size_t nkeep = 0;                    /* WS_KEEP statements read */
    for (size_t k = 0; k < sent; k++) {
        PGresult *r = PQgetResult(s->conn), *more;
        /* the server answered a statement with an error (a SQLSTATE: libpq's own errors, such
         * as a connection closed under it, have none), also 57P01 (terminated in it): it ran
         * nothing after it, COMMIT included */
        if (!e && r && PQresultStatus(r) == PGRES_FATAL_ERROR &&
            PQresultErrorField(r, PG_DIAG_SQLSTATE))
            refused = true;
        if (e || (r && PQresultStatus(r) == PGRES_PIPELINE_ABORTED)) {
            PQclear(r);
        } else if (k < npre) {
            e = obx__pg_check(s, r, pre[k] < 0 ? PGRES_COMMAND_OK : PGRES_TUPLES_OK, NULL,
                              pre[k] < 0 ? "begin" : "relay plans");
        } else {
            /* an event update that did not apply fails in its own statement (WS_CHECK), before
             * any later part runs */
            const ws_stmt *x = &st[k - npre];
            if (!(e = obx__pg_check(s, r, x->want, &r, x->what)))
                e = ws_take(x, r, w, keep ? &keep[nkeep] : NULL);
            if (x->kind == WS_KEEP) nkeep++;
        }
        if (!r) { /* the connection broke: nothing more will come */
            broke = true;
            break;
        }
        while ((more = PQgetResult(s->conn)) != NULL) PQclear(more);
    }
    if (committing) e = ws_commit_result(s, e, refused, broke);
    if (synced && PQstatus(s->conn) == CONNECTION_OK) {
        PGresult *r = PQgetResult(s->conn); /* PGRES_PIPELINE_SYNC */
        PQclear(r);
    }
    if (!PQexitPipelineMode(s->conn) && !e) e = obx__pg_map_error(s, NULL, "pipeline mode");
    /* a COMMIT that did not run leaves the transaction open (failed): end it, as a failed
     * COMMIT does (contract 5: definite failure means rolled back) */
    if (commit && e && e != OBX_EUNKNOWN && PQstatus(s->conn) == CONNECTION_OK &&
        PQtransactionStatus(s->conn) != PQTRANS_IDLE)
        PQclear(PQexec(s->conn, "ROLLBACK"));
    for (size_t j = 0; e && keep && j < nkeep; j++) {
        PQclear(keep[j]);
        keep[j] = NULL;
    }
    return e;
}

obx_err obx__pg_write_set(obx__store *base, const obx__write_set *w) {
    pg_store *s = (pg_store *)base;
    /* a part that names a row twice is split into runs, as update_events and update_attempts
     * split it (usually one run each): count them first, a statement's parameters are large */
    size_t big = w->n_upd > w->n_att ? w->n_upd : w->n_att, nslots = 2 * big + 1;
    long *slots = malloc(nslots * sizeof *slots);
    if (!slots) return obx__fail(OBX_ENOMEM, "write set: out of memory");
    size_t max = (w->n_att_new > 0) + (w->n_rc > 0) + (w->n_au > 0);
    for (size_t at = 0; at < w->n_upd; max++)
        at += unique_run(update_key, w->upd, at, w->n_upd, slots, nslots);
    for (size_t at = 0; at < w->n_att; max++)
        at += unique_run(attempt_key, w->att, at, w->n_att, slots, nslots);
    if (!max) {
        free(slots);
        return OBX_OK;
    }
    ws_stmt *st = calloc(max, sizeof *st);
    obx_err e = OBX_OK;
    size_t ns = 0;
    if (!st) e = obx__fail(OBX_ENOMEM, "write set: out of memory");
    for (size_t at = 0; !e && at < w->n_upd;) {
        size_t len = unique_run(update_key, w->upd, at, w->n_upd, slots, nslots);
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_UPD_EVENTS, WS_UPD_EVENTS, at, len, "update events", PGRES_TUPLES_OK};
        e = build_update_events(&x->p, w->upd + at, len, true);
        at += len;
    }
    if (!e && w->n_att_new) {
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_INS_ATT, WS_PLAIN, 0, w->n_att_new, "insert attempts", PGRES_COMMAND_OK};
        build_insert_attempts(&x->p, w->att_new, w->n_att_new);
    }
    for (size_t at = 0; !e && at < w->n_att;) {
        size_t len = unique_run(attempt_key, w->att, at, w->n_att, slots, nslots);
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_UPD_ATT, WS_UPD_ATT, at, len, "update attempts", PGRES_TUPLES_OK};
        build_update_attempts(&x->p, w->att + at, len, true);
        at += len;
    }
    if (!e && w->n_rc) {
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_INS_RCPT, WS_PLAIN, 0, w->n_rc, "insert receipts", PGRES_COMMAND_OK};
        build_insert_receipts(&x->p, w->rc, w->n_rc);
    }
    if (!e && w->n_au) {
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_INS_AUDIT, WS_PLAIN, 0, w->n_au, "insert audit", PGRES_COMMAND_OK};
        x->id = build_insert_audit(&x->p, w->au, w->n_au);
    }
    /* A relay transaction (obx began it, depth 1) ends with its write set: hold it back, and
     * send it with the COMMIT (commit_outer), one round trip fewer per transaction. Every
     * statement checks itself (WS_CHECK): if an update did not apply the transaction fails and
     * the COMMIT rolls back, so every update counts as applied here. Anything else the
     * transaction sends first sends the write set (obx__pg_conn_ready). */
    if (!e && s->dispatch && s->tx.depth == 1 && s->tx.outer_begin && !s->held) {
        for (size_t i = 0; i < w->n_upd; i++) w->applied[i] = true;
        s->held = st;
        s->n_held = ns;
        free(slots);
        return OBX_OK;
    }
    if (!e) e = obx__pg_ws_run(s, st, ns, w, NULL, false);
    obx__pg_ws_free(st, ns);
    free(slots);
    return e;
}
