/*
 * sqlite_ops.c — the SQLite store's other methods, grouped by table: the dashboard's chart
 * history, the cluster registry, unserved events, envelope generations, statistics and
 * invariants, retention (payload purge, aged rows), route sets and delivery sets, receipt
 * details, takeover aliases and recent publications.
 *
 * Contracts: the store's (sqlite_store.c): each method runs its statements on the handle's
 * connection, in the caller's transaction when there is one; none keeps state on the handle.
 */
#include "store/sqlite/sq_int.h"

/* ---- the dashboard's chart history --------------------------------------------------------- */

obx_err obx__sq_series_put(obx__store *base, const obx__series_row *r, int64_t keep_from) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_SERIES_PUT, &st);
    if (e) return e;
    bi(st, 1, r->slot);
    bi(st, 2, r->at);
    bt(st, 3, r->sample);
    if ((e = obx__sq_step_done(s, st, "series")) || (e = obx__sq_stmt(s, Q_SERIES_TRIM, &st)))
        return e;
    bi(st, 1, keep_from);
    return obx__sq_step_done(s, st, "series");
}

obx_err obx__sq_series_list(obx__store *base, int64_t from, size_t limit, obx__series_row **out,
                            size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    obx_err e = obx__sq_stmt(s, Q_SERIES_LIST, &st);
    if (e) return e;
    bi(st, 1, from);
    bi(st, 2, (int64_t)limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n + 1, sizeof **out))) break;
        obx__series_row *r = &(*out)[(*n)++];
        r->slot = ci(st, 0);
        r->at = ci(st, 1);
        const char *txt = (const char *)sqlite3_column_text(st, 2);
        if (!(r->sample = strdup(txt ? txt : "{}"))) {
            e = obx__fail(OBX_ENOMEM, "series: out of memory");
            break;
        }
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "series");
    sqlite3_reset(st);
    if (e) {
        obx__series_rows_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return e;
}

/* ---- the cluster registry ------------------------------------------------------------------ */

obx_err obx__sq_cluster_put(obx__store *base, const obx__cluster_row *c) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_CLUSTER_PUT, &st);
    if (e) return e;
    bt(st, 1, c->cluster);
    bt(st, 2, c->backend);
    bt(st, 3, c->lookup);
    bt(st, 4, c->durability);
    bt(st, 5, c->required_acks);
    bt(st, 6, c->serializer);
    bt(st, 7, c->relay);
    bi(st, 8, c->seen_at);
    if ((e = obx__sq_step_done(s, st, "register cluster"))) return e;
    if ((e = obx__sq_stmt(s, Q_RELAY_CLUSTER_PUT, &st))) return e;
    bt(st, 1, c->relay);
    bt(st, 2, c->cluster);
    bi(st, 3, c->seen_at);
    bi(st, 4, c->live_until);
    return obx__sq_step_done(s, st, "relay heartbeat");
}

obx_err obx__sq_unserved(obx__store *base, int64_t now, obx__unserved_row **out, size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    *out = NULL;
    *n = 0;
    obx_err e = obx__sq_stmt(s, Q_UNSERVED, &st);
    if (e) return e;
    bi(st, 5, now);
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n + 1, sizeof **out))) break;
        obx__unserved_row *u = &(*out)[(*n)++];
        memset(u, 0, sizeof *u);
        CT(st, 0, u->cluster);
        u->pending = ci(st, 1);
        u->oldest_committed_at = ci(st, 2);
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "unserved clusters");
    sqlite3_reset(st);
    if (e) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}

obx_err obx__sq_cluster_get(obx__store *base, const char *cluster, obx__cluster_row *c) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_CLUSTER_GET, &st);
    if (e) return e;
    bt(st, 1, cluster);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        memset(c, 0, sizeof *c);
        CT(st, 0, c->cluster);
        CT(st, 1, c->backend);
        CT(st, 2, c->lookup);
        CT(st, 3, c->durability);
        CT(st, 4, c->required_acks);
        CT(st, 5, c->serializer);
        CT(st, 6, c->relay);
        c->seen_at = ci(st, 7);
        e = OBX_OK;
    } else
        e = rc == SQLITE_DONE
                ? obx__fail(OBX_ENOTFOUND, "cluster '%s': no relay registered it", cluster)
                : obx__sq_map_rc(s, rc, "read cluster");
    sqlite3_reset(st);
    return e;
}

obx_err obx__sq_envelope_at(obx__store *base, const char *id, int32_t gen,
                            obx__envelope_at_row *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_ENV_AT, &st);
    if (e) return e;
    bt(st, 1, id);
    bi(st, 2, gen);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        obx__envelope_at_decode(READER(st), out);
        e = OBX_OK;
    } else
        e = rc == SQLITE_DONE
                ? obx__fail(OBX_ENOTFOUND, "event %s has no envelope generation %d", id, (int)gen)
                : obx__sq_map_rc(s, rc, "read envelope");
    sqlite3_reset(st);
    return e;
}

obx_err obx__sq_delivery_open(obx__store *base, int64_t out[3]) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_DOPEN, &st);
    if (e) return e;
    int rc = sqlite3_step(st);
    for (int i = 0; i < 3; i++) out[i] = rc == SQLITE_ROW ? ci(st, i) : 0;
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? OBX_OK : obx__sq_map_rc(s, rc, "open delivery sets");
}

/* ---- statistics, search ------------------------------------------------------------------ */

obx_err obx__sq_stats(obx__store *base, obx__store_stats *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    obx_err e = obx__sq_stmt(s, Q_STATS_STATE, &st);
    if (e) return e;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        obx__state k = obx__state_parse((const char *)sqlite3_column_text(st, 0));
        if (k < OBX__ST_COUNT) out->by_state[k] = ci(st, 1);
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return obx__sq_map_rc(s, rc, "stats");
    if ((e = obx__sq_stmt(s, Q_STATS_OLDEST, &st))) return e;
    if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        out->oldest_pending_committed_at = ci(st, 0);
        out->oldest_unknown_since = ci(st, 1);
        out->held = ci(st, 2);
        out->oldest_held = ci(st, 3);
    }
    sqlite3_reset(st);
    if (rc != SQLITE_ROW) return obx__sq_map_rc(s, rc, "stats");
    if ((e = obx__sq_stmt(s, Q_STATS_RCPT, &st))) return e;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(st, 0);
        int64_t v = ci(st, 1);
        if (!strcmp(k, "PRIMARY"))
            out->receipts_primary = v;
        else if (!strcmp(k, "DUPLICATE"))
            out->receipts_duplicate = v;
        else if (!strcmp(k, "QUARANTINED"))
            out->receipts_quarantined = v;
        else if (!strcmp(k, "MIGRATION"))
            out->receipts_migration = v;
        else if (!strcmp(k, "ASSERTED"))
            out->receipts_asserted = v;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return obx__sq_map_rc(s, rc, "stats");
    if ((e = obx__sq_stmt(s, Q_STATS_ATT, &st))) return e;
    if ((rc = sqlite3_step(st)) == SQLITE_ROW) out->attempts_unknown = ci(st, 0);
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? OBX_OK : obx__sq_map_rc(s, rc, "stats");
}

obx_err obx__sq_invariants(obx__store *base, obx__store_invariants *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    obx_err e = obx__sq_stmt(s, Q_STATS_INV, &st);
    if (e) return e;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        out->published_without_primary = ci(st, 0);
        out->primary_not_published = ci(st, 1);
        out->multi_primary = ci(st, 2);
        out->cancelled_with_attempt = ci(st, 3);
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? OBX_OK : obx__sq_map_rc(s, rc, "invariants");
}

obx_err obx__sq_unknown_resolutions(obx__store *base, int64_t **ms, size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    size_t cap = 0;
    *ms = NULL;
    *n = 0;
    obx_err e = obx__sq_stmt(s, Q_UNKNOWN_RES, &st);
    if (e) return e;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)ms, &cap, *n + 1, sizeof **ms))) break;
        (*ms)[(*n)++] = ci(st, 0);
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "unknown resolutions");
    sqlite3_reset(st);
    if (e) {
        free(*ms);
        *ms = NULL;
        *n = 0;
    }
    return e;
}

/* Up to 8 generations of event id that hold a payload, into gen/len; their count in *k. */
static obx_err purge_gens(sq_store *s, const char *id, int32_t gen[8], int64_t len[8], size_t *k) {
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_PURGE_GENS, &st);
    if (e) return e;
    bt(st, 1, id);
    int rc;
    for (*k = 0; *k < 8 && (rc = sqlite3_step(st)) == SQLITE_ROW; (*k)++) {
        gen[*k] = (int32_t)ci(st, 0);
        len[*k] = ci(st, 1);
    }
    if (*k < 8 && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "purge payloads");
    sqlite3_reset(st);
    return e;
}

obx_err obx__sq_purge_payloads(obx__store *base, const char *const *ids, size_t n, int64_t *bytes) {
    sq_store *s = (sq_store *)base;
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = 8;
        while (k == 8) { /* 8 at a time: the ones dropped no longer hold a payload */
            int32_t gen[8];
            int64_t len[8];
            obx_err e = purge_gens(s, ids[i], gen, len, &k);
            for (size_t j = 0; !e && j < k; j++) {
                sqlite3_stmt *st = NULL;
                if ((e = obx__sq_stmt(s, Q_PURGE_PAYLOAD, &st))) break;
                bt(st, 1, ids[i]);
                bi(st, 2, gen[j]);
                if (!(e = obx__sq_step_done(s, st, "purge payloads")))
                    total += sqlite3_changes(s->db) == 1 ? len[j] : 0;
            }
            if (e) return e;
        }
    }
    if (bytes) *bytes = total;
    return OBX_OK;
}

obx_err obx__sq_aged(obx__store *base, const obx__aged_req *req, obx__aged_row **out, size_t *n,
                     obx__aged_count *count) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e;
    int rc;
    if (req->count) {
        if ((e = obx__sq_stmt(s, Q_AGED_COUNT + (int)req->kind, &st))) return e;
        bi(st, 1, req->until);
        if (req->kind == OBX__AGED_INBOX_QUARANTINED) bt(st, 5, req->consumer);
        if (req->kind == OBX__AGED_UNSERVED) bi(st, 5, req->now);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW && count) {
            count->total = ci(st, 0);
            count->oldest = ci(st, 1);
        }
        sqlite3_reset(st);
        if (rc != SQLITE_ROW) return obx__sq_map_rc(s, rc, "audit count");
    }
    if (!req->limit) return OBX_OK;
    if ((e = obx__sq_stmt(s, Q_AGED_LIST + (int)req->kind, &st))) return e;
    bi(st, 1, req->until);
    bi(st, 2, req->after_at);
    bi(st, 3, req->after_key);
    bi(st, 4, (int64_t)req->limit);
    if (req->kind == OBX__AGED_INBOX_QUARANTINED) bt(st, 5, req->consumer);
    if (req->kind == OBX__AGED_UNSERVED) bi(st, 5, req->now);
    size_t cap = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n + 1, sizeof **out))) break;
        obx__aged_row *r = &(*out)[(*n)++];
        memset(r, 0, sizeof *r);
        CT(st, 0, r->event_id);
        r->at = ci(st, 1);
        r->key = ci(st, 2);
        CT(st, 3, r->detail);
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "audit list");
    sqlite3_reset(st);
    if (e) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}

obx_err obx__sq_route_set_put(obx__store *base, const obx__route_set_row *r) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_RSET_PUT, &st);
    if (e) return e;
    bi(st, 1, r->route_gen);
    bt(st, 2, r->completion);
    bi(st, 3, r->n + 1);
    if ((e = obx__sq_step_done(s, st, "insert route set"))) return e;
    for (int32_t i = 0; i < r->n; i++) {
        const obx__route_target_row *t = &r->t[i];
        if ((e = obx__sq_stmt(s, Q_RTGT_PUT, &st))) return e;
        bi(st, 1, r->route_gen);
        bi(st, 2, t->target_no);
        bt(st, 3, t->cluster);
        bt(st, 4, t->topic);
        bt(st, 5, t->routing_key);
        bt(st, 6, t->algorithm);
        bt(st, 7, t->serializer);
        bt(st, 8, t->durability);
        bt(st, 9, t->required_acks);
        if ((e = obx__sq_step_done(s, st, "insert route target"))) return e;
    }
    return OBX_OK;
}

obx_err obx__sq_route_set_get(obx__store *base, int64_t gen, obx__route_set_row *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    obx_err e = obx__sq_stmt(s, Q_RSET_GET, &st);
    if (e) return e;
    bi(st, 1, gen);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) CT(st, 0, out->completion);
    sqlite3_reset(st);
    if (rc == SQLITE_DONE)
        return obx__fail(OBX_ENOTFOUND, "route generation %lld declares no delivery set",
                         (long long)gen);
    if (rc != SQLITE_ROW) return obx__sq_map_rc(s, rc, "read route set");
    out->route_gen = gen;
    if ((e = obx__sq_stmt(s, Q_RTGT_GET, &st))) return e;
    bi(st, 1, gen);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && out->n < OBX__SET_MAX - 1) {
        obx__route_target_row *t = &out->t[out->n++];
        t->target_no = (int32_t)ci(st, 0);
        CT(st, 1, t->cluster);
        CT(st, 2, t->topic);
        CT(st, 3, t->routing_key);
        CT(st, 4, t->algorithm);
        CT(st, 5, t->serializer);
        CT(st, 6, t->durability);
        CT(st, 7, t->required_acks);
    }
    e = (rc == SQLITE_ROW || rc == SQLITE_DONE) ? OBX_OK
                                                : obx__sq_map_rc(s, rc, "read route targets");
    sqlite3_reset(st);
    return e;
}

obx_err obx__sq_delivery_put(obx__store *base, const obx__delivery_row *d) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_DSET_PUT, &st);
    if (e) return e;
    bt(st, 1, d->event_id);
    bt(st, 2, d->completion);
    bi(st, 3, d->route_gen);
    bi(st, 4, d->created_at);
    if ((e = obx__sq_step_done(s, st, "insert delivery set"))) return e;
    for (int32_t i = 0; i < d->n; i++) {
        if ((e = obx__sq_stmt(s, Q_DTGT_PUT, &st))) return e;
        bt(st, 1, d->t[i].slot_id);
        bt(st, 2, d->event_id);
        bi(st, 3, d->t[i].target_no);
        bt(st, 4, d->t[i].origin);
        bi(st, 5, d->t[i].created_at);
        if ((e = obx__sq_step_done(s, st, "insert delivery target"))) return e;
    }
    return OBX_OK;
}

obx_err obx__sq_delivery_get(obx__store *base, const char *id, obx__delivery_row *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    obx_err e = obx__sq_stmt(s, Q_DGET, &st);
    if (e) return e;
    bt(st, 1, id);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && out->n < OBX__SET_MAX) {
        CT(st, 0, out->event_id);
        CT(st, 1, out->completion);
        out->route_gen = ci(st, 2);
        out->created_at = ci(st, 3);
        obx__delivery_target_row *t = &out->t[out->n++];
        t->target_no = (int32_t)ci(st, 4);
        CT(st, 5, t->slot_id);
        CT(st, 6, t->origin);
        t->created_at = ci(st, 7);
    }
    e = (rc == SQLITE_ROW || rc == SQLITE_DONE) ? OBX_OK
                                                : obx__sq_map_rc(s, rc, "read delivery set");
    sqlite3_reset(st);
    if (!e && !out->n) e = obx__fail(OBX_ENOTFOUND, "%s: not part of a delivery set", id);
    return e;
}

obx_err obx__sq_delivery_stats(obx__store *base, int64_t *sets, int64_t *complete) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_DSTATS, &st);
    if (e) return e;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *sets = ci(st, 0);
        *complete = ci(st, 1);
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? OBX_OK : obx__sq_map_rc(s, rc, "delivery statistics");
}

obx_err obx__sq_receipt_details(obx__store *base, const char *event_id, obx__receipt_kind kind,
                                char ***out, size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    obx_err e = obx__sq_stmt(s, Q_RCPT_DETAIL, &st);
    if (e) return e;
    bt(st, 1, event_id);
    bt(st, 2, obx__receipt_kind_name(kind));
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n + 1, sizeof **out))) break;
        char *d = obx__strdup((const char *)sqlite3_column_text(st, 0));
        if (!d) {
            e = obx__fail(OBX_ENOMEM, "receipt details: out of memory");
            break;
        }
        (*out)[(*n)++] = d;
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "receipt details");
    sqlite3_reset(st);
    if (e) {
        for (size_t i = 0; i < *n; i++) free((*out)[i]);
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}

obx_err obx__sq_set_alias(obx__store *base, const char *const *ids, size_t n, const char *from,
                          const char *to, bool *applied) {
    sq_store *s = (sq_store *)base;
    for (size_t i = 0; i < n; i++) {
        sqlite3_stmt *st = NULL;
        obx_err e = obx__sq_stmt(s, Q_SET_ALIAS, &st);
        if (e) return e;
        bt(st, 1, ids[i]);
        bt(st, 2, from);
        bt(st, 3, to);
        if ((e = obx__sq_step_done(s, st, "set alias"))) return e;
        applied[i] = sqlite3_changes(s->db) == 1;
    }
    return OBX_OK;
}

obx_err obx__sq_receipts_by_kind(obx__store *base, obx__receipt_kind kind, size_t limit,
                                 obx__receipt_row **out, size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    *out = NULL;
    *n = 0;
    if ((unsigned)kind > OBX__RK_MIGRATION) return obx__fail(OBX_EINVAL, "receipt kind %d", kind);
    bool sparse = kind == OBX__RK_QUARANTINED || kind == OBX__RK_MIGRATION;
    obx_err e = obx__sq_stmt(s, sparse ? Q_RCPT_KIND_SPARSE : Q_RCPT_KIND_ANY, &st);
    if (e) return e;
    bt(st, 1, obx__receipt_kind_name(kind));
    bi(st, 2, (int64_t)limit);
    return obx__sq_collect_receipts(s, st, "receipts by kind", out, n);
}

obx_err obx__sq_recent_published(obx__store *base, size_t limit, obx__published_ref **out,
                                 size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    obx_err e = obx__sq_stmt(s, Q_RECENT_PUB, &st);
    if (e) return e;
    bi(st, 1, (int64_t)limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n + 1, sizeof **out))) break;
        obx__published_ref *p = &(*out)[(*n)++];
        memset(p, 0, sizeof *p);
        CT(st, 0, p->event_id);
        CT(st, 1, p->topic);
        p->published_at = ci(st, 2);
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "recent published");
    sqlite3_reset(st);
    if (e) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}
