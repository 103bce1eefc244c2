/*
 * pg_ops.c — the PostgreSQL store's other methods, grouped by table: audit rows read back,
 * counters, the dashboard's chart history, the cluster registry, envelope generations,
 * statistics and invariants, retention (payload purge, aged rows), route sets and delivery
 * sets, receipt details, takeover aliases and recent publications.
 *
 * Contracts: each method is one statement (or one transaction of the caller's); none keeps
 * state on the handle.
 */
#include "store/postgres/pg_int.h"

obx_err obx__pg_load_audit(obx__store *base, const char *event_id, obx__audit_row **out,
                           size_t *n_out) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n_out = 0;
    params p;
    p_init(&p);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_LOAD_AUDIT, &p, PGRES_TUPLES_OK, &r, "load audit");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "load audit: out of memory");
    }
    for (int i = 0; !e && i < rows; i++) {
        obx__audit_row *a = &(*out)[i];
        a->at = gi(r, i, 0);
        const char *actor = PQgetvalue(r, i, 1);
        for (int k = 0; k < OBX__ACT_COUNT; k++)
            if (!strcmp(actor, obx__actor_name((obx__actor)k))) a->actor = (obx__actor)k;
        GT(r, i, 2, a->who);
        GT(r, i, 3, a->event_id);
        a->envelope_gen = (int32_t)gi(r, i, 4);
        a->from = obx__state_parse(PQgetvalue(r, i, 5));
        a->to = obx__state_parse(PQgetvalue(r, i, 6));
        a->claim_gen = gi(r, i, 7);
        GT(r, i, 8, a->attempt_id);
        a->attempt_gen = (int32_t)gi(r, i, 9);
        GT(r, i, 10, a->reason);
    }
    if (!e) *n_out = (size_t)rows;
    PQclear(r);
    return e;
}

obx_err obx__pg_counter_add(obx__store *base, const char *name, int64_t delta) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, name);
    p_int(&p, delta);
    return obx__pg_run(s, Q_COUNTER_ADD, &p, PGRES_COMMAND_OK, NULL, "counter");
}

obx_err obx__pg_counter_get(obx__store *base, const char *name, int64_t *value) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, name);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_COUNTER_GET, &p, PGRES_TUPLES_OK, &r, "counter");
    if (e) return e;
    *value = PQntuples(r) == 1 ? gi(r, 0, 0) : 0;
    PQclear(r);
    return OBX_OK;
}

/* ---- the dashboard's chart history --------------------------------------------------------- */

obx_err obx__pg_series_put(obx__store *base, const obx__series_row *r, int64_t keep_from) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_int(&p, r->slot);
    p_int(&p, r->at);
    p_text(&p, r->sample);
    p_int(&p, keep_from);
    return obx__pg_run(s, Q_SERIES_PUT, &p, PGRES_COMMAND_OK, NULL, "series");
}

obx_err obx__pg_series_list(obx__store *base, int64_t from, size_t limit, obx__series_row **out,
                            size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_int(&p, from);
    p_int(&p, (int64_t)limit);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_SERIES_LIST, &p, PGRES_TUPLES_OK, &r, "series");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0 && !(*out = calloc((size_t)rows, sizeof **out)))
        e = obx__fail(OBX_ENOMEM, "series: out of memory");
    for (int i = 0; !e && i < rows; i++) {
        (*out)[i].slot = gi(r, i, 0);
        (*out)[i].at = gi(r, i, 1);
        if (!((*out)[i].sample = strdup(PQgetvalue(r, i, 2))))
            e = obx__fail(OBX_ENOMEM, "series: out of memory");
    }
    if (e) {
        obx__series_rows_free(*out, (size_t)rows);
        *out = NULL;
    } else
        *n = (size_t)rows;
    PQclear(r);
    return e;
}

/* ---- the cluster registry ------------------------------------------------------------------ */

obx_err obx__pg_cluster_put(obx__store *base, const obx__cluster_row *c) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, c->cluster);
    p_text(&p, c->backend);
    p_text(&p, c->lookup);
    p_text(&p, c->durability);
    p_text(&p, c->required_acks);
    p_text(&p, c->serializer);
    p_text(&p, c->relay);
    p_int(&p, c->seen_at);
    p_int(&p, c->live_until);
    return obx__pg_run(s, Q_CLUSTER_PUT, &p, PGRES_COMMAND_OK, NULL, "register cluster");
}

obx_err obx__pg_cluster_get(obx__store *base, const char *cluster, obx__cluster_row *c) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, cluster);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_CLUSTER_GET, &p, PGRES_TUPLES_OK, &r, "read cluster");
    if (e) return e;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return obx__fail(OBX_ENOTFOUND, "cluster '%s': no relay registered it", cluster);
    }
    memset(c, 0, sizeof *c);
    GT(r, 0, 0, c->cluster);
    GT(r, 0, 1, c->backend);
    GT(r, 0, 2, c->lookup);
    GT(r, 0, 3, c->durability);
    GT(r, 0, 4, c->required_acks);
    GT(r, 0, 5, c->serializer);
    GT(r, 0, 6, c->relay);
    c->seen_at = gi(r, 0, 7);
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_envelope_at(obx__store *base, const char *id, int32_t gen,
                            obx__envelope_at_row *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, id);
    p_int(&p, gen);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_ENV_AT, &p, PGRES_TUPLES_OK, &r, "read envelope");
    if (e) return e;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return obx__fail(OBX_ENOTFOUND, "event %s has no envelope generation %d", id, (int)gen);
    }
    obx__envelope_at_decode(READER(r, 0), out);
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_unserved(obx__store *base, int64_t now, obx__unserved_row **out, size_t *n) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_int(&p, now);
    PGresult *r = NULL;
    *out = NULL;
    *n = 0;
    obx_err e = obx__pg_run(s, Q_UNSERVED, &p, PGRES_TUPLES_OK, &r, "unserved clusters");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0 && !(*out = calloc((size_t)rows, sizeof **out))) {
        PQclear(r);
        return obx__fail(OBX_ENOMEM, "unserved clusters: out of memory");
    }
    for (int i = 0; i < rows; i++) {
        GT(r, i, 0, (*out)[i].cluster);
        (*out)[i].pending = gi(r, i, 1);
        (*out)[i].oldest_committed_at = gi(r, i, 2);
    }
    *n = (size_t)rows;
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_delivery_open(obx__store *base, int64_t out[3]) {
    pg_store *s = (pg_store *)base;
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_DOPEN, NULL, PGRES_TUPLES_OK, &r, "open delivery sets");
    if (e) return e;
    for (int i = 0; i < 3; i++) out[i] = gi(r, 0, i);
    PQclear(r);
    return OBX_OK;
}

/* ---- statistics, search ------------------------------------------------------------------ */

obx_err obx__pg_stats(obx__store *base, obx__store_stats *out) {
    pg_store *s = (pg_store *)base;
    memset(out, 0, sizeof *out);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_STATS, NULL, PGRES_TUPLES_OK, &r, "stats");
    if (e) return e;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *k = PQgetvalue(r, i, 0);
        int64_t v = gi(r, i, 1);
        if (!strncmp(k, "state:", 6)) {
            obx__state st = obx__state_parse(k + 6);
            if (st < OBX__ST_COUNT) out->by_state[st] = v;
        } else if (!strcmp(k, "receipt:PRIMARY"))
            out->receipts_primary = v;
        else if (!strcmp(k, "receipt:DUPLICATE"))
            out->receipts_duplicate = v;
        else if (!strcmp(k, "receipt:QUARANTINED"))
            out->receipts_quarantined = v;
        else if (!strcmp(k, "receipt:MIGRATION"))
            out->receipts_migration = v;
        else if (!strcmp(k, "receipt:ASSERTED"))
            out->receipts_asserted = v;
        else if (!strcmp(k, "oldest_pending"))
            out->oldest_pending_committed_at = v;
        else if (!strcmp(k, "oldest_unknown"))
            out->oldest_unknown_since = v;
        else if (!strcmp(k, "attempts_unknown"))
            out->attempts_unknown = v;
        else if (!strcmp(k, "held"))
            out->held = v;
        else if (!strcmp(k, "oldest_held"))
            out->oldest_held = v;
    }
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_invariants(obx__store *base, obx__store_invariants *out) {
    pg_store *s = (pg_store *)base;
    memset(out, 0, sizeof *out);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_STATS_INV, NULL, PGRES_TUPLES_OK, &r, "invariants");
    if (e) return e;
    if (PQntuples(r) == 1) {
        out->published_without_primary = gi(r, 0, 0);
        out->primary_not_published = gi(r, 0, 1);
        out->multi_primary = gi(r, 0, 2);
        out->cancelled_with_attempt = gi(r, 0, 3);
    }
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_unknown_resolutions(obx__store *base, int64_t **ms, size_t *n) {
    pg_store *s = (pg_store *)base;
    *ms = NULL;
    *n = 0;
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_UNKNOWN_RES, NULL, PGRES_TUPLES_OK, &r, "unknown resolutions");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *ms = calloc((size_t)rows, sizeof **ms);
        if (!*ms) e = obx__fail(OBX_ENOMEM, "unknown resolutions: out of memory");
        for (int i = 0; !e && i < rows; i++) (*ms)[i] = gi(r, i, 0);
        if (!e) *n = (size_t)rows;
    }
    PQclear(r);
    return e;
}

/* ---- retention and audit (docs/retention.md)
 * ------------------------------------------------------ */

obx_err obx__pg_purge_payloads(obx__store *base, const char *const *ids, size_t n, int64_t *bytes) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    ARR_TEXT(&p, n, ids[i]);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_PURGE_PAYLOADS, &p, PGRES_TUPLES_OK, &r, "purge payloads");
    p_free(&p);
    if (e) return e;
    int64_t total = 0;
    for (int k = 0; k < PQntuples(r); k++) total += gi(r, k, 0);
    PQclear(r);
    if (bytes) *bytes = total;
    return OBX_OK;
}

obx_err obx__pg_aged(obx__store *base, const obx__aged_req *req, obx__aged_row **out, size_t *n,
                     obx__aged_count *count) {
    pg_store *s = (pg_store *)base;
    bool inbox = req->kind == OBX__AGED_INBOX_QUARANTINED;
    bool unserved = req->kind == OBX__AGED_UNSERVED;
    PGresult *r = NULL;
    obx_err e;
    if (req->count) {
        params p;
        p_init(&p);
        p_int(&p, req->until);
        if (inbox) p_text(&p, req->consumer);
        if (unserved) p_int(&p, req->now);
        if ((e = obx__pg_run(s, Q_AGED_COUNT + (int)req->kind, &p, PGRES_TUPLES_OK, &r,
                             "audit count")))
            return e;
        if (count && PQntuples(r) == 1) {
            count->total = gi(r, 0, 0);
            count->oldest = gi(r, 0, 1);
        }
        PQclear(r);
    }
    if (!req->limit) return OBX_OK;
    params p;
    p_init(&p);
    p_int(&p, req->until);
    p_int(&p, req->after_at);
    p_int(&p, req->after_key);
    p_int(&p, (int64_t)req->limit);
    if (inbox) p_text(&p, req->consumer);
    if (unserved) p_int(&p, req->now);
    if ((e = obx__pg_run(s, Q_AGED_LIST + (int)req->kind, &p, PGRES_TUPLES_OK, &r, "audit list")))
        return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "audit list: out of memory");
    }
    for (int i = 0; !e && i < rows; i++) {
        obx__aged_row *a = &(*out)[i];
        GT(r, i, 0, a->event_id);
        a->at = gi(r, i, 1);
        a->key = gi(r, i, 2);
        GT(r, i, 3, a->detail);
    }
    if (!e) *n = (size_t)rows;
    PQclear(r);
    return e;
}

/* ---- selections, delivery sets, receipt details, takeover ---------------------------------- */

obx_err obx__pg_route_set_put(obx__store *base, const obx__route_set_row *rs) {
    pg_store *s = (pg_store *)base;
    size_t n = (size_t)rs->n;
    params p;
    p_init(&p);
    p_int(&p, rs->route_gen);
    p_text(&p, rs->completion);
    p_int(&p, rs->n + 1);
    ARR_INT(&p, n, rs->t[i].target_no);
    ARR_TEXT(&p, n, rs->t[i].cluster);
    ARR_TEXT(&p, n, rs->t[i].topic);
    ARR_TEXT(&p, n, rs->t[i].routing_key);
    ARR_TEXT(&p, n, rs->t[i].algorithm);
    ARR_TEXT(&p, n, rs->t[i].serializer);
    ARR_TEXT(&p, n, rs->t[i].durability);
    ARR_TEXT(&p, n, rs->t[i].required_acks);
    obx_err e = obx__pg_run(s, Q_RSET_PUT, &p, PGRES_COMMAND_OK, NULL, "insert route set");
    p_free(&p);
    return e;
}

obx_err obx__pg_route_set_get(obx__store *base, int64_t gen, obx__route_set_row *out) {
    pg_store *s = (pg_store *)base;
    memset(out, 0, sizeof *out);
    params p;
    p_init(&p);
    p_int(&p, gen);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_RSET_GET, &p, PGRES_TUPLES_OK, &r, "read route set");
    if (e) return e;
    int rows = PQntuples(r);
    if (!rows) {
        PQclear(r);
        return obx__fail(OBX_ENOTFOUND, "route generation %lld declares no delivery set",
                         (long long)gen);
    }
    out->route_gen = gen;
    GT(r, 0, 0, out->completion);
    for (int i = 0; i < rows && out->n < OBX__SET_MAX - 1; i++) {
        if (PQgetisnull(r, i, 1)) continue;
        obx__route_target_row *t = &out->t[out->n++];
        t->target_no = (int32_t)gi(r, i, 1);
        GT(r, i, 2, t->cluster);
        GT(r, i, 3, t->topic);
        GT(r, i, 4, t->routing_key);
        GT(r, i, 5, t->algorithm);
        GT(r, i, 6, t->serializer);
        GT(r, i, 7, t->durability);
        GT(r, i, 8, t->required_acks);
    }
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_delivery_put(obx__store *base, const obx__delivery_row *d) {
    pg_store *s = (pg_store *)base;
    size_t n = (size_t)d->n;
    params p;
    p_init(&p);
    p_text(&p, d->event_id);
    p_text(&p, d->completion);
    p_int(&p, d->route_gen);
    p_int(&p, d->created_at);
    ARR_TEXT(&p, n, d->t[i].slot_id);
    ARR_INT(&p, n, d->t[i].target_no);
    ARR_TEXT(&p, n, d->t[i].origin);
    ARR_INT(&p, n, d->t[i].created_at);
    obx_err e = obx__pg_run(s, Q_DSET_PUT, &p, PGRES_COMMAND_OK, NULL, "insert delivery set");
    p_free(&p);
    return e;
}

obx_err obx__pg_delivery_get(obx__store *base, const char *id, obx__delivery_row *out) {
    pg_store *s = (pg_store *)base;
    memset(out, 0, sizeof *out);
    params p;
    p_init(&p);
    p_text(&p, id);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_DGET, &p, PGRES_TUPLES_OK, &r, "read delivery set");
    if (e) return e;
    int rows = PQntuples(r);
    for (int i = 0; i < rows && out->n < OBX__SET_MAX; i++) {
        GT(r, i, 0, out->event_id);
        GT(r, i, 1, out->completion);
        out->route_gen = gi(r, i, 2);
        out->created_at = gi(r, i, 3);
        obx__delivery_target_row *t = &out->t[out->n++];
        t->target_no = (int32_t)gi(r, i, 4);
        GT(r, i, 5, t->slot_id);
        GT(r, i, 6, t->origin);
        t->created_at = gi(r, i, 7);
    }
    PQclear(r);
    if (!out->n) return obx__fail(OBX_ENOTFOUND, "%s: not part of a delivery set", id);
    return OBX_OK;
}

obx_err obx__pg_delivery_stats(obx__store *base, int64_t *sets, int64_t *complete) {
    pg_store *s = (pg_store *)base;
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_DSTATS, NULL, PGRES_TUPLES_OK, &r, "delivery statistics");
    if (e) return e;
    *sets = gi(r, 0, 0);
    *complete = gi(r, 0, 1);
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_receipt_details(obx__store *base, const char *event_id, obx__receipt_kind kind,
                                char ***out, size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_text(&p, event_id);
    p_text(&p, obx__receipt_kind_name(kind));
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_RCPT_DETAIL, &p, PGRES_TUPLES_OK, &r, "receipt details");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "receipt details: out of memory");
        for (int i = 0; !e && i < rows; i++) {
            if (!((*out)[i] = obx__strdup(PQgetvalue(r, i, 0))))
                e = obx__fail(OBX_ENOMEM, "receipt details: out of memory");
            else
                (*n)++;
        }
    }
    PQclear(r);
    if (e) {
        for (size_t i = 0; i < *n; i++) free((*out)[i]);
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}

obx_err obx__pg_set_alias(obx__store *base, const char *const *ids, size_t n, const char *from,
                          const char *to, bool *applied) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    ARR_TEXT(&p, n, ids[i]);
    p_text(&p, from);
    p_text(&p, to);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_SET_ALIAS, &p, PGRES_TUPLES_OK, &r, "set alias");
    p_free(&p);
    if (e) return e;
    for (size_t i = 0; i < n; i++) applied[i] = false;
    for (int i = 0; i < PQntuples(r); i++) {
        long ord = (long)gi(r, i, 0);
        if (ord >= 1 && (size_t)ord <= n) applied[ord - 1] = true;
    }
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_receipts_by_kind(obx__store *base, obx__receipt_kind kind, size_t limit,
                                 obx__receipt_row **out, size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    if ((unsigned)kind > OBX__RK_MIGRATION) return obx__fail(OBX_EINVAL, "receipt kind %d", kind);
    bool sparse = kind == OBX__RK_QUARANTINED || kind == OBX__RK_MIGRATION;
    params p;
    p_init(&p);
    p_text(&p, obx__receipt_kind_name(kind));
    p_int(&p, (int64_t)limit);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, sparse ? Q_RCPT_KIND_SPARSE : Q_RCPT_KIND_ANY, &p, PGRES_TUPLES_OK,
                            &r, "receipts by kind");
    if (e) return e;
    e = obx__pg_read_receipts(r, "receipts by kind", out, n);
    PQclear(r);
    return e;
}

obx_err obx__pg_recent_published(obx__store *base, size_t limit, obx__published_ref **out,
                                 size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_int(&p, (int64_t)limit);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_RECENT_PUB, &p, PGRES_TUPLES_OK, &r, "recent published");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0 && !(*out = calloc((size_t)rows, sizeof **out)))
        e = obx__fail(OBX_ENOMEM, "recent published: out of memory");
    for (int i = 0; !e && i < rows; i++) {
        GT(r, i, 0, (*out)[i].event_id);
        GT(r, i, 1, (*out)[i].topic);
        (*out)[i].published_at = gi(r, i, 2);
    }
    if (!e) *n = (size_t)rows;
    PQclear(r);
    return e;
}
