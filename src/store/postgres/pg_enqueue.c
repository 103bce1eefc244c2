/*
 * pg_enqueue.c — routes and the producer's writes on PostgreSQL: route policy generations,
 * idempotency lookups, the envelope and event inserts, the insert with its audit row
 * (insert_event_audit) and the one-round-trip enqueue of an event whose route the handle has
 * cached (enqueue_write: savepoint, write, release in one libpq pipeline).
 *
 * Contracts: the event's insert keeps contract 7 (pg_sql.c, Q_INS_EVENT); an enqueue writes
 * only while the database's current route is still the cached one (ROUTE_STILL), and otherwise
 * writes nothing.
 */
#include "store/postgres/pg_int.h"

/* ---- routes ------------------------------------------------------------------------------- */

static void read_route(const PGresult *r, int row, obx__route_row *o) {
    obx__route_decode(READER(r, row), o);
}

obx_err obx__pg_route_put(obx__store *base, const obx__route_row *rt, int64_t *gen) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, rt->event_type);
    p_text(&p, rt->cluster);
    p_text(&p, rt->topic);
    p_text(&p, rt->routing_key);
    p_text(&p, rt->algorithm);
    p_text(&p, rt->serializer);
    p_text(&p, rt->durability);
    p_text(&p, rt->required_acks);
    p_int(&p, rt->max_attempts);
    p_bool(&p, rt->blind_retry);
    p_bool(&p, rt->unordered);
    p_text(&p, rt->alias);
    p_int(&p, rt->created_at);
    p_text(&p, rt->encrypt_key);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_ROUTE_PUT, &p, PGRES_TUPLES_OK, &r, "insert route");
    if (!e) {
        if (gen) *gen = gi(r, 0, 0);
        PQclear(r);
    }
    return e;
}

/* The current route of event_type by statement q: Q_ROUTE_GET, whose last column is the route
 * table's OID (out->rel), or Q_ROUTE_GET_TXID, with the transaction ID after it (to txid[cap])
 * and then whether obx._wake_c() is there (s->wake_c). */
static obx_err route_read(pg_store *s, int q, const char *event_type, obx__route_row *out,
                          char *txid, size_t cap) {
    params p;
    p_init(&p);
    p_text(&p, event_type);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, q, &p, PGRES_TUPLES_OK, &r, "read route");
    if (e) return e;
    if (PQntuples(r) == 1) {
        read_route(r, 0, out);
        int last = PQnfields(r) - 1;
        if (txid) {
            s->wake_c = gb(r, 0, last--) ? 1 : -1;
            gt(r, 0, last--, txid, cap);
        }
        out->rel = (uint32_t)gi(r, 0, last);
    } else
        e = obx__fail(OBX_ENOROUTE,
                      "event_type: no route for '%s' (add one with `obx route set %s ...`)",
                      event_type, event_type);
    PQclear(r);
    return e;
}

obx_err obx__pg_route_get(obx__store *base, const char *event_type, obx__route_row *out) {
    return route_read((pg_store *)base, Q_ROUTE_GET, event_type, out, NULL, 0);
}

/* route_get and txid in one round trip: the producer's read inside its transaction. */
obx_err obx__pg_route_get_txid(obx__store *base, const char *event_type, obx__route_row *out,
                               char *txid, size_t cap) {
    return route_read((pg_store *)base, Q_ROUTE_GET_TXID, event_type, out, txid, cap);
}

obx_err obx__pg_route_list(obx__store *base, bool all, obx__route_row **out, size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, all ? Q_ROUTE_LIST_ALL : Q_ROUTE_LIST_CUR, NULL, PGRES_TUPLES_OK, &r,
                            "list routes");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "route list: out of memory");
        for (int i = 0; !e && i < rows; i++) read_route(r, i, &(*out)[i]);
        if (!e) *n = (size_t)rows;
    }
    PQclear(r);
    return e;
}

/* ---- producer ----------------------------------------------------------------------------- */

obx_err obx__pg_idem_lookup(obx__store *base, const char *tenant, const char *key,
                            char existing[OBX_EVENT_ID_LEN + 1]) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, tenant);
    p_text(&p, key);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_IDEM, &p, PGRES_TUPLES_OK, &r, "idempotency lookup");
    if (e) return e;
    if (PQntuples(r) == 1)
        gt(r, 0, 0, existing, OBX_EVENT_ID_LEN + 1);
    else
        e = OBX_ENOTFOUND;
    PQclear(r);
    return e;
}

void obx__pg_order_key(const obx__event_row *r, char *out, size_t cap) {
    snprintf(out, cap, "%s\x1f%s\x1f%s", r->dest.cluster, r->dest.topic, r->dest.routing_key);
}

/* Parameters $1..$28 of Q_INS_ENV and Q_INS_EVENT. */
static void bind_envelope(params *p, const obx__event_row *r, const void *payload, size_t len) {
    const obx__envelope *v = &r->env;
    p_text(p, v->event_id);
    p_int(p, r->envelope_gen);
    p_text(p, v->aggregate_type);
    p_text(p, v->aggregate_id);
    p_int(p, v->aggregate_version);
    p_text(p, v->event_type);
    p_text(p, v->payload_schema);
    p_text(p, v->payload_digest);
    p_text(p, v->tenant);
    p_int(p, v->occurred_at);
    p_text(p, v->created_txid);
    p_text(p, v->correlation_id);
    p_text(p, v->causation_id);
    p_text(p, v->traceparent);
    p_text(p, v->idempotency_key);
    p_text(p, r->envelope_digest);
    p_text(p, r->dest.cluster);
    p_text(p, r->dest.topic);
    p_text(p, r->dest.routing_key);
    p_text(p, r->dest.algorithm);
    p_int(p, r->dest.route_gen);
    p_text(p, r->dest.serializer);
    p_text(p, r->dest.durability);
    p_text(p, r->dest.required_acks);
    p_text(p, r->dest_digest);
    p_bytes(p, payload, len);
    p_int(p, (int64_t)len);
    if (r->at_server)
        p_text(p, NULL); /* $28: the server's now (pg_sql.c, SERVER_AT) */
    else
        p_int(p, r->committed_at);
}

obx_err obx__pg_insert_envelope(obx__store *base, const obx__event_row *r, const void *payload,
                                size_t len) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    bind_envelope(&p, r, payload, len);
    p_int(&p, r->env.not_before); /* $29 */
    return obx__pg_run(s, Q_INS_ENV, &p, PGRES_COMMAND_OK, NULL, "insert envelope");
}

/* Parameters $1..$49 of Q_INS_EVENT and Q_INS_EVENT_AUDIT. p points into ok (the caller's,
 * ORDER_KEY_CAP bytes, alive until the statement ran). */
static void bind_event(params *p, char *ok, const obx__event_row *r, const void *payload,
                       size_t len) {
    obx__pg_order_key(r, ok, ORDER_KEY_CAP);
    bind_envelope(p, r, payload, len);
    p_text(p, ok); /* $29 */
    p_text(p, obx__state_name(r->state));
    p_int(p, r->claim_gen);
    p_text(p, r->owner);
    p_int(p, r->lease_until);
    p_int(p, r->attempt_gen);
    p_text(p, r->attempt_id);
    p_int(p, r->pinned_partition);
    p_int(p, r->rejections);
    p_int(p, r->available_at);
    p_int(p, r->next_check_at);
    p_int(p, r->unknown_since);
    p_text(p, r->primary_attempt_id);
    p_int(p, r->published_at);
    p_int(p, r->committed_at);
    p_int(p, r->updated_at);
    p_int(p, r->max_attempts);
    p_bool(p, r->blind_retry);
    p_bool(p, r->unordered);
    p_text(p, r->alias);    /* $48 */
    p_int(p, r->target_no); /* $49: a further target's slot carries no idempotency key */
}

obx_err obx__pg_insert_event(obx__store *base, const obx__event_row *r, const void *payload,
                             size_t len) {
    pg_store *s = (pg_store *)base;
    char ok[ORDER_KEY_CAP];
    params p;
    p_init(&p);
    bind_event(&p, ok, r, payload, len);
    p_int(&p, r->env.not_before); /* $50 */
    return obx__pg_run(s, Q_INS_EVENT, &p, PGRES_TUPLES_OK, NULL, "insert event");
}

/* Whether a is exactly the audit row that the producer's envelope of r records
 * (created_by): the one Q_LOAD_AUDIT and obx.obx_audit_all show for an envelope with
 * created_by. Any other row is written as a row, so that what is read back is what was
 * given. */
static bool producer_row(const obx__event_row *r, const obx__audit_row *a) {
    char reason[sizeof a->reason];
    snprintf(reason, sizeof reason, OBX__PRODUCER_REASON, (long long)r->dest.route_gen);
    return a->at == r->committed_at && a->actor == OBX__ACT_PRODUCER &&
           !strcmp(a->event_id, r->env.event_id) && a->envelope_gen == 1 &&
           r->env.envelope_gen == 1 && a->from == OBX__ST_NONE && a->to == OBX__ST_PENDING &&
           a->claim_gen == 0 && !a->attempt_id[0] && a->attempt_gen == 0 &&
           !strcmp(a->reason, reason);
}

/* insert_event and insert_audit of one row in one statement (Q_INS_EVENT_AUDIT): the audit row
 * recorded in the envelope when it is the producer's (producer_row), else the two writes. */
obx_err obx__pg_insert_event_audit(obx__store *base, const obx__event_row *r, const void *payload,
                                   size_t len, const obx__audit_row *a) {
    pg_store *s = (pg_store *)base;
    if (!producer_row(r, a)) {
        obx_err e = obx__pg_insert_event(base, r, payload, len);
        return e ? e : obx__pg_insert_audit(base, a, 1);
    }
    char ok[ORDER_KEY_CAP];
    params p;
    p_init(&p);
    bind_event(&p, ok, r, payload, len);
    p_text(&p, a->who);           /* $50 */
    p_int(&p, r->env.not_before); /* $51 */
    return obx__pg_run(s, Q_INS_EVENT_AUDIT, &p, PGRES_TUPLES_OK, NULL, "insert event");
}

/* A statement without parameters (SAVEPOINT, RELEASE) into a pipeline. */
bool obx__pg_send_plain(pg_store *s, const char *sql) {
    return PQsendQueryParams(s->conn, sql, 0, NULL, NULL, NULL, NULL, 0);
}

/* Prepared statement id with p into a pipeline. */
bool obx__pg_send_prepared(pg_store *s, int id, const params *p) {
    char name[40];
    obx__pg_stmt_name(id, name);
    return PQsendQueryPrepared(s->conn, name, p->n, p->val, p->len, p->fmt, 0);
}

/* One pipeline for obx__pg_enqueue_write: SAVEPOINT, q (Q_ENQ_WRITE or Q_ENQ_WRITE_WC) with p,
 * RELEASE inside the caller's transaction; with own (no transaction open), BEGIN, q, COMMIT
 * instead.
 *
 * Outcomes with own: the COMMIT's answer decides; a statement that failed on the server (the
 * pipeline then skipped the COMMIT) or a COMMIT that was never sent wrote nothing; a connection
 * that broke once the COMMIT was sent and before its answer is OBX_EUNKNOWN, as for
 * commit_outer (the server may have executed it). */
static obx_err enqueue_send(pg_store *s, int q, const params *p, bool own, bool *written) {
    obx_err e = OBX_OK;
    char open[48] = "BEGIN", close[56] = "COMMIT";
    if (!own) {
        snprintf(open, sizeof open, "SAVEPOINT obx_sp%d", s->tx.depth);
        snprintf(close, sizeof close, "RELEASE SAVEPOINT obx_sp%d", s->tx.depth);
    }
    if (!PQenterPipelineMode(s->conn)) return obx__pg_map_error(s, NULL, "enqueue: pipeline mode");
    const char *what[3] = {own ? "begin" : "savepoint", "enqueue",
                           own ? "commit" : "release savepoint"};
    int sent = 0;
    if (obx__pg_send_plain(s, open)) sent++;
    if (sent == 1 && obx__pg_send_prepared(s, q, p)) sent++;
    if (sent == 2 && obx__pg_send_plain(s, close)) sent++;
    bool synced = PQpipelineSync(s->conn); /* also after a failed send: answer what was sent */
    if (sent < 3 || !synced) e = obx__pg_map_error(s, NULL, "enqueue: send");
    bool opened = false, closed = false, gone = false, discarded = false, refused = false;
    for (int i = 0; i < sent && !gone; i++) {
        PGresult *res = PQgetResult(s->conn), *more;
        gone = !res;
        if (!res || PQresultStatus(res) == PGRES_PIPELINE_ABORTED || e) {
            PQclear(res);
        } else {
            const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
            /* the caller reset its session (DISCARD ALL): prepared again on the long way */
            if (i == 1 && code && !strcmp(code, "26000")) {
                s->prepared[q] = false;
                discarded = true;
            }
            /* The server's own error (it carries a SQLSTATE; libpq's do not) to BEGIN or the
             * write ended the transaction, and so does one to COMMIT unless the connection was
             * ending under it (commit_outer): with own, nothing was committed */
            refused |=
                PQresultStatus(res) == PGRES_FATAL_ERROR && code &&
                (i < 2 || (!obx__pg_conn_lost_state(code) && PQstatus(s->conn) == CONNECTION_OK));
            PGresult *keep = NULL;
            if (!(e = obx__pg_check(s, res, i == 1 ? PGRES_TUPLES_OK : PGRES_COMMAND_OK, &keep,
                                    what[i]))) {
                if (i == 0) opened = true;
                if (i == 1) *written = PQntuples(keep) == 1;
                /* COMMIT of a failed transaction reports success with the tag ROLLBACK */
                if (i == 2 && own && strcmp(PQcmdStatus(keep), "COMMIT") != 0)
                    e = obx__fail(OBX_ESTORE, "postgres: COMMIT rolled back (enqueue)");
                else if (i == 2)
                    closed = true;
                PQclear(keep);
            }
        }
        while (!gone && (more = PQgetResult(s->conn)) != NULL) PQclear(more);
    }
    if (gone && !e) e = obx__pg_map_error(s, NULL, "enqueue"); /* no answer: the connection broke */
    if (own && sent == 3 && !closed && !refused && e == OBX_ECONNLOST) {
        char why[512];
        obx__strlcpy(why, obx_errmsg(), sizeof why);
        e = obx__fail(OBX_EUNKNOWN,
                      "postgres: connection lost during the enqueue's COMMIT: the event may or "
                      "may not have been written (%s)",
                      why);
    }
    if (synced && !gone && PQstatus(s->conn) == CONNECTION_OK) PQclear(PQgetResult(s->conn));
    if (!PQexitPipelineMode(s->conn) && !e)
        e = obx__pg_map_error(s, NULL, "enqueue: pipeline mode");
    if ((opened || own) && !closed && PQstatus(s->conn) == CONNECTION_OK) {
        /* the write (or the release) failed: undo it, keep the first error. With own, a failed
         * statement left the session in an aborted transaction block (or a failed send left it
         * open): end it */
        char undo[112];
        if (own)
            snprintf(undo, sizeof undo, "ROLLBACK");
        else
            snprintf(undo, sizeof undo,
                     "ROLLBACK TO SAVEPOINT obx_sp%d; RELEASE SAVEPOINT obx_sp%d", s->tx.depth,
                     s->tx.depth);
        obx_err u = PQtransactionStatus(s->conn) == PQTRANS_IDLE
                        ? OBX_OK
                        : obx__pg_exec_simple(s, undo, own ? "rollback" : "rollback to savepoint");
        if (!e || (discarded && !u)) e = u; /* undone: the long way prepares it again */
    }
    if (e) *written = false;
    return e;
}

/* q (Q_ENQ_TRY or Q_ENQ_TRY_WC) in the caller's transaction, without a savepoint
 * (obx__pg_enqueue_write says when). *written: the event was written; *busy: its order-key bucket
 * is locked by another transaction, nothing was written; neither: the cached route is no longer
 * current. An error is the server's (a disk full, a cancelled statement): the caller's transaction
 * has failed, as after a failure of its own statements. A session reset by the caller (DISCARD ALL)
 * is such an error too (run prepares every statement again afterwards). */
static obx_err enqueue_try(pg_store *s, int q, params *p, bool *written, bool *busy) {
    *written = *busy = false;
    PGresult *keep = NULL;
    obx_err e = obx__pg_run(s, q, p, PGRES_TUPLES_OK, &keep, "enqueue");
    if (e) return e;
    if (PQntuples(keep) == 1) {
        *written = gb(keep, 0, 0);
        *busy = !*written;
    }
    PQclear(keep);
    return OBX_OK;
}

/* enqueue_write (store.h): SAVEPOINT, Q_ENQ_WRITE, RELEASE in one pipeline, one round trip
 * instead of the four of begin, route_get_txid, insert_event_audit and commit (issue 19: on a
 * 2-core machine three more round trips cost a business transaction a third of its rate,
 * docs/performance.md). Inside a transaction (the caller's, or obx's at any depth) after a
 * statement failed the server skipped the rest up to the sync; the savepoint is then rolled
 * back, so the caller's transaction is as before the call, as with obx__tx_rollback. On a
 * connection with none open (a producer that enqueues on its own), the same pipeline is
 * BEGIN, Q_ENQ_WRITE, COMMIT: one round trip where the long way takes four, with the long
 * way's outcomes (enqueue_send). An event without an idempotency key in the caller's
 * transaction is first tried without the savepoint (enqueue_try, Q_ENQ_TRY: 31,000 fewer
 * server instructions per business transaction, docs/performance.md section 3); a key could be
 * taken, and its write must not fail the caller's transaction, so it keeps the savepoint.
 * Where the connection's last route read saw obx._wake_c() (s->wake_c) the statements call it
 * directly to wake a waiting relay (Q_ENQ_TRY_WC, Q_ENQ_WRITE_WC; pg_sql.c, NOTIFY_EXPR_BY). */
obx_err obx__pg_enqueue_write(obx__store *base, const obx__event_row *r, const void *payload,
                              size_t len, const obx__audit_row *a, bool *written) {
    pg_store *s = (pg_store *)base;
    *written = false;
    if (!producer_row(r, a)) return OBX_OK; /* the long way writes it as a row */
    bool in_tx = s->tx.depth > 0;
    obx_err e = in_tx ? OBX_OK : obx__pg_tx_in_tx(base, &in_tx);
    if (e) return e;
    char ok[ORDER_KEY_CAP];
    obx__buf head = {0}, tail = {0}; /* the canonical encoding around created_txid */
    obx__envelope_canonical_head(&r->env, &head);
    obx__envelope_canonical_tail(&r->env, &tail);
    params p;
    p_init(&p);
    bind_event(&p, ok, r, payload, len);
    p_text(&p, a->who);               /* $50 */
    p_bytes(&p, head.data, head.len); /* $51 */
    p_bytes(&p, tail.data, tail.len); /* $52 */
    p_int(&p, r->route_rel);          /* $53 */
    p_int(&p, r->env.not_before);     /* $54 */
    if (head.oom || tail.oom) e = obx__fail(OBX_ENOMEM, "enqueue: out of memory");
    bool busy = true; /* the savepoint pipeline: unless enqueue_try wrote or the route changed */
    bool wc = s->wake_c > 0;
    int q_write = wc ? Q_ENQ_WRITE_WC : Q_ENQ_WRITE, q_try = wc ? Q_ENQ_TRY_WC : Q_ENQ_TRY;
    if (!e && !(e = obx__pg_p_ready(s, &p, q_write, "enqueue")) &&
        !(e = obx__pg_ready(s, "enqueue")) && in_tx && s->tx.depth == 0 && !*r->env.idempotency_key)
        e = enqueue_try(s, q_try, &p, written, &busy);
    if (!e && busy && !(e = obx__pg_prepare(s, q_write)))
        e = enqueue_send(s, q_write, &p, !in_tx, written);
    /* obx._wake_c() dropped with the extension since the route was read (the statement then
     * fails, as obx.enqueue() does until `obx init`): obx._wake() from the next call on */
    if (e && wc) s->wake_c = 0;
    obx__buf_free(&head);
    obx__buf_free(&tail);
    return e;
}
