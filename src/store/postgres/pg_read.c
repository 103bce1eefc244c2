/*
 * pg_read.c — reading event rows on PostgreSQL: the readers behind read_events (by IDs, claim
 * candidates, sweeps and state lists, attribute filters, retention candidates, a correlation
 * ID; shared.c's obx__read_events dispatches to them) and the decoding of the rows.
 *
 * Contracts: a claim reads the oldest available rows in per-key order and skips rows locked by
 * others (Q_CLAIM); it first follows its cluster's wake lock, and releases it when it takes a
 * whole batch (a backlog: producers need not notify; pg_wake.c, contract 8).
 */
#include "store/postgres/pg_int.h"

/* ---- reading events ----------------------------------------------------------------------- */

static obx_err read_event(const PGresult *res, int row, obx__event_row *r, bool with_payload) {
    obx__event_decode(READER(res, row), r);
    if (with_payload) {
        size_t n = 0;
        obx_err e = obx__pg_get_bytea(res, row, EVENT_NCOLS, &r->payload, &n);
        if (e) return e;
        if (!r->payload && !r->payload_purged)
            r->payload_unread = true; /* over the claim's ceiling: payload_len is the stored one */
        else
            r->payload_len = n;
    }
    return OBX_OK;
}

/* Appends the rows of r to out and releases r. */
obx_err obx__pg_collect(PGresult *r, bool with_payload, obx__rows *out, const char *what) {
    obx_err e = OBX_OK;
    for (int i = 0; !e && i < PQntuples(r); i++) {
        obx__event_row *row = obx__rows_push(out);
        if (!row)
            e = obx__fail(OBX_ENOMEM, "%s: out of memory", what);
        else
            e = read_event(r, i, row, with_payload);
    }
    PQclear(r);
    return e;
}

static obx_err read_claim(obx__store *base, const obx__claim_req *req, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_int(&p, req->now);
    p_text(&p, req->cluster);
    p_int(&p, (int64_t)req->limit);
    if (req->n_aliases)
        ARR_TEXT(&p, req->n_aliases, req->aliases[i]);
    else
        p_text(&p, NULL);
    if (req->max_payload)
        p_int(&p, (int64_t)req->max_payload);
    else
        p_text(&p, NULL);
    /* relay_plans. The relay prepares its statements once, often while the outbox is still
     * empty, and PostgreSQL caches generic plans made for empty tables until autovacuum first
     * analyzes them (a minute or more): each acceptance then scanned every row (3.2 ms per load
     * of a few events at 15,000 rows), and so did the claim, which without statistics prefers a
     * bitmap scan of every claimable row, the per-key NOT EXISTS and the envelope join for each
     * of them, and a sort: a claim that costs O(backlog) (212 ms against 1.5 ms at 20,000
     * pending rows; commit-to-PUBLISHED p50 of 50 s at 5,000 ev/s, docs/performance.md).
     * Planning each statement for its parameters fixed that but cost 0.3-0.5 ms per statement,
     * 37 % of the server's time at 1,000 ev/s. Every statement of the relay's transactions
     * finds its rows by key or through a partial index, so the plan that is right for them does
     * not depend on the table's size: a relay connection (serve_dispatch) begins each
     * transaction with RELAY_PLANS, which rules out what an empty table's statistics would
     * choose, and plans each statement once; the claim adds CLAIM_PLANS, which leaves the
     * ordered walk of obx_event_claimable. Other connections that claim (obx sim on
     * PostgreSQL, tests) get both for the claim's transaction. test_dispatch_plans checks the
     * plans on an outbox that grew after they were made. */
    if ((s->pend & P_BEGIN) || PQtransactionStatus(s->conn) == PQTRANS_INTRANS)
        s->pend |= s->dispatch ? P_CLAIM : P_CLAIM | P_RELAY; /* in the claim's pipeline */
    PGresult *r = NULL;
    obx_err e = obx__pg_wake_follow(s, req->cluster);
    if (!e) e = obx__pg_run(s, Q_CLAIM, &p, PGRES_TUPLES_OK, &r, "claim candidates");
    p_free(&p);
    /* a whole batch: a backlog, in which the relay claims again without waiting, so its
     * producers need not notify (nor commit one at a time) until it waits again */
    if (!e && s->wake_held && (size_t)PQntuples(r) >= req->limit) e = obx__pg_wake_release(s);
    if (e) {
        PQclear(r);
        return e;
    }
    return obx__pg_collect(r, true, out, "claim candidates");
}

static obx_err read_select(obx__store *base, const obx__select_req *req, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    int id;
    bool with_state = false;
    switch (req->kind) {
    case OBX__SEL_EXPIRED_SENDING: id = req->lock ? Q_SEL_EXPIRED_LOCK : Q_SEL_EXPIRED; break;
    case OBX__SEL_RECONCILE: id = req->lock ? Q_SEL_RECONCILE_LOCK : Q_SEL_RECONCILE; break;
    case OBX__SEL_STATE:
        if (obx__state_is_published(req->state))
            id = req->lock ? Q_SEL_STATE_LOCK : Q_SEL_STATE;
        else
            id = req->lock ? Q_SEL_UNPUB_STATE_LOCK : Q_SEL_UNPUB_STATE;
        with_state = true;
        break;
    case OBX__SEL_PUBLISHED_BEFORE:
        id = req->lock ? Q_SEL_PUBBEFORE_LOCK : Q_SEL_PUBBEFORE;
        with_state = true;
        break;
    default: return obx__fail(OBX_EINVAL, "select: unknown kind %d", (int)req->kind);
    }
    params p;
    p_init(&p);
    p_int(&p, req->now);
    p_text(&p, req->cluster);
    p_int(&p, (int64_t)(req->limit ? req->limit : 1000));
    p_bool(&p, req->payload);
    if (with_state) p_text(&p, obx__state_name(req->state));
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, id, &p, PGRES_TUPLES_OK, &r, "select events");
    return e ? e : obx__pg_collect(r, req->payload, out, "select events");
}

static obx_err read_ids(obx__store *base, const char *const *ids, size_t n, unsigned flags,
                        obx__rows *out) {
    pg_store *s = (pg_store *)base;
    bool pl = flags & OBX__LOAD_PAYLOAD;
    params p;
    p_init(&p);
    ARR_TEXT(&p, n, ids[i]);
    p_bool(&p, pl);
    /* A locking load opens acceptance and registration transactions: the relay's planner
     * options for the rest of the transaction (see relay_plans) where the connection did not
     * begin with them. */
    if (!s->dispatch && (flags & OBX__LOAD_LOCK) && PQtransactionStatus(s->conn) == PQTRANS_INTRANS)
        s->pend |= P_RELAY; /* in the load's pipeline */
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, (flags & OBX__LOAD_LOCK) ? Q_LOAD_LOCK : Q_LOAD, &p, PGRES_TUPLES_OK,
                            &r, "load events");
    p_free(&p);
    return e ? e : obx__pg_collect(r, pl, out, "load events");
}

static obx_err read_correlation(obx__store *base, const char *corr, size_t limit, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, corr);
    p_int(&p, (int64_t)limit);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_FIND_CORR, &p, PGRES_TUPLES_OK, &r, "find by correlation");
    return e ? e : obx__pg_collect(r, false, out, "find by correlation");
}

static obx_err read_retention(obx__store *base, const obx__retention_req *req, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, obx__state_name(req->state));
    p_int(&p, req->after.at);
    p_int(&p, req->after.seq);
    p_int(&p, req->before.at);
    p_int(&p, req->before.seq);
    p_int(&p, (int64_t)req->limit);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, req->lock ? Q_RET_CANDIDATES_LOCK : Q_RET_CANDIDATES, &p,
                            PGRES_TUPLES_OK, &r, "retention candidates");
    return e ? e : obx__pg_collect(r, false, out, "retention candidates");
}

static obx_err read_filter(obx__store *base, const obx__event_filter *f, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, f->event_type);
    p_text(&p, f->cluster);
    p_text(&p, f->topic);
    if (f->n_aliases)
        ARR_TEXT(&p, f->n_aliases, f->aliases[i]);
    else
        p_text(&p, NULL);
    if (f->n_states)
        ARR_TEXT(&p, f->n_states, obx__state_name(f->states[i]));
    else
        p_text(&p, NULL);
    p_int(&p, f->committed_from);
    p_int(&p, f->committed_to);
    p_int(&p, f->after_seq);
    p_int(&p, (int64_t)(f->limit ? f->limit : 1000));
    p_bool(&p, f->held);
    p_int(&p, f->unknown_before);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_FIND, &p, PGRES_TUPLES_OK, &r, "find events");
    p_free(&p);
    return e ? e : obx__pg_collect(r, false, out, "find events");
}

static const obx__event_readers pg_readers = {
    .ids = read_ids,
    .claim = read_claim,
    .select = read_select,
    .filter = read_filter,
    .retention = read_retention,
    .correlation = read_correlation,
};

obx_err obx__pg_read_events(obx__store *base, const obx__read_req *req, obx__rows *out) {
    return obx__read_events(base, req, &pg_readers, out);
}
