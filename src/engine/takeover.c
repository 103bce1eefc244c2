/*
 * takeover.c — scoped takeover and rollback (docs/migration.md, the rollout's second step):
 * each event type is owned by a dispatcher alias, relays dispatch only the aliases they serve
 * (relay.aliases), so handing types over — or back — is switching the alias.
 *
 * Contracts:
 *   1. A type changes hands by a new route generation that copies the current one (destination,
 *      options, delivery set) with the new alias: events enqueued from then on are owned by the
 *      new alias; every event keeps the destination it froze.
 *   2. With backlog, unclaimed events of those types — PENDING or PARKED, nothing in flight —
 *      move to the new owner too: a compare-and-set on (alias, state) with one audit row each.
 *      An event that was claimed or sent stays with its attempts and publish slot; whatever
 *      owns its type, its outcomes still reach the acceptance point and the reconciler still
 *      resolves it (neither filters by alias), so a rollback never makes anything publish
 *      blindly, nor twice.
 *   3. A share of types (percent) is chosen stably: by the SHA-256 of the type name, so a larger
 *      share always includes the types a smaller one chose, and a rerun chooses the same ones.
 */
#include "engine/engine_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct cand {
    obx__route_row r;
    char order[OBX_DIGEST_LEN + 1];
} cand;

static int cmp_cand(const void *a, const void *b) {
    return strcmp(((const cand *)a)->order, ((const cand *)b)->order);
}

/* One type's route generation with the new alias (contract 1). */
static obx_err switch_route(obx__store *s, const obx__route_row *cur, const char *to, int64_t now,
                            int64_t *gen) {
    obx__route_row row = *cur;
    obx__route_set_row set;
    memset(&set, 0, sizeof set);
    obx__strlcpy(row.alias, to, sizeof row.alias);
    row.created_at = now;
    if (cur->targets) {
        obx_err e = obx__st_route_set_get(s, cur->gen, &set);
        if (e) return e;
    }
    return obx__route_put_rows(s, &row, cur->targets ? &set : NULL, gen);
}

/* Contract 2: the backlog of one type, in batches of one transaction each. */
static obx_err hand_backlog(obx__store *s, const char *type, const char *from, const char *to,
                            const char *who, int64_t now, bool dry_run, int64_t *moved,
                            int64_t *kept) {
    static const obx__state unclaimed[] = {OBX__ST_PENDING, OBX__ST_PARKED};
    const char *aliases[] = {from};
    obx__event_filter f = {.event_type = type,
                           .aliases = aliases,
                           .n_aliases = 1,
                           .states = unclaimed,
                           .n_states = 2,
                           .limit = 500};
    for (;;) {
        obx__rows rows = {0};
        obx_err e =
            obx__st_read_events(s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows);
        if (e || !rows.n) {
            obx__rows_free(&rows);
            return e;
        }
        f.after_seq = rows.v[rows.n - 1].seq;
        if (dry_run) {
            *moved += (int64_t)rows.n;
            obx__rows_free(&rows);
            continue;
        }
        const char **ids = calloc(rows.n, sizeof *ids);
        bool *applied = calloc(rows.n, sizeof *applied);
        obx__audit_row *au = calloc(rows.n, sizeof *au);
        if (!ids || !applied || !au) e = obx__fail(OBX_ENOMEM, "takeover: out of memory");
        for (size_t i = 0; !e && i < rows.n; i++) ids[i] = rows.v[i].env.event_id;
        if (!e) e = obx__st_begin(s);
        if (!e) {
            e = obx__st_set_alias(s, ids, rows.n, from, to, applied);
            size_t n_au = 0;
            for (size_t i = 0; !e && i < rows.n; i++) {
                if (!applied[i]) { /* claimed meanwhile: it stays with the relay that has it */
                    (*kept)++;
                    continue;
                }
                obx__audit(&au[n_au++], now, OBX__ACT_OPERATOR, who, &rows.v[i], rows.v[i].state,
                           rows.v[i].state, "unclaimed backlog handed from alias %s to %s", from,
                           to);
            }
            if (!e) e = obx__st_insert_audit(s, au, n_au);
            if (e)
                obx__st_rollback(s);
            else if (!(e = obx__st_commit(s)))
                *moved += (int64_t)n_au;
        }
        free(ids);
        free(applied);
        free(au);
        obx__rows_free(&rows);
        if (e) return e;
    }
}

obx_err obx__takeover(obx__store *s, int64_t now, const obx__takeover_req *req, json_t **out) {
    *out = NULL;
    obx__route_row *routes = NULL;
    size_t n = 0;
    obx_err e = obx__st_route_list(s, false, &routes, &n);
    if (e) return e;
    cand *c = calloc(n ? n : 1, sizeof *c);
    size_t nc = 0;
    if (!c) e = obx__fail(OBX_ENOMEM, "takeover: out of memory");
    for (size_t i = 0; !e && i < req->n_types; i++) {
        bool found = false;
        for (size_t k = 0; k < n && !found; k++)
            if (!strcmp(routes[k].event_type, req->types[i])) {
                found = true;
                bool dup = false;
                for (size_t j = 0; j < nc; j++) dup |= !strcmp(c[j].r.event_type, req->types[i]);
                if (!dup) c[nc++].r = routes[k];
            }
        if (!found)
            e = obx__fail(OBX_ENOROUTE, "event_types[%zu]: no route for '%s'", i, req->types[i]);
    }
    if (!e && !req->n_types) {
        for (size_t k = 0; k < n; k++)
            if (!strcmp(routes[k].alias, req->from)) c[nc++].r = routes[k];
        /* contract 3: a stable order, the first share of it */
        for (size_t k = 0; !e && k < nc; k++)
            e = obx_sha256_digest(c[k].r.event_type, strlen(c[k].r.event_type), c[k].order);
        if (!e) qsort(c, nc, sizeof *c, cmp_cand);
        if (req->percent > 0 && nc) {
            size_t take = (size_t)ceil((double)nc * req->percent / 100.0);
            if (take < 1) take = 1;
            if (take < nc) nc = take;
        }
    }
    json_t *types = json_array();
    int64_t moved = 0, kept = 0, switched = 0;
    for (size_t i = 0; !e && i < nc; i++) {
        const obx__route_row *cur = &c[i].r;
        int64_t gen = cur->gen, tmoved = 0, tkept = 0;
        bool change = strcmp(cur->alias, req->to) != 0;
        if (change && !req->dry_run) e = switch_route(s, cur, req->to, now, &gen);
        if (!e && change) switched++;
        /* the backlog of the alias that owned the type (after a switch done earlier, too) */
        if (!e && req->backlog) {
            const char *from = change ? cur->alias : req->from;
            if (from && strcmp(from, req->to))
                e = hand_backlog(s, cur->event_type, from, req->to, req->who, now, req->dry_run,
                                 &tmoved, &tkept);
        }
        moved += tmoved;
        kept += tkept;
        if (!e)
            json_array_append_new(
                types, json_pack("{s:s,s:s,s:s,s:I,s:I,s:b,s:I,s:I}", "event_type", cur->event_type,
                                 "from_alias", cur->alias, "to_alias", req->to, "from_route_gen",
                                 (json_int_t)cur->gen, "route_gen", (json_int_t)gen, "switched",
                                 (int)change, "backlog_moved", (json_int_t)tmoved, "backlog_kept",
                                 (json_int_t)tkept));
    }
    free(routes);
    free(c);
    if (e) {
        json_decref(types);
        return e;
    }
    *out = json_pack("{s:s,s:b,s:I,s:I,s:I,s:o}", "to_alias", req->to, "dry_run", (int)req->dry_run,
                     "types_switched", (json_int_t)switched, "backlog_moved", (json_int_t)moved,
                     "backlog_claimed_meanwhile", (json_int_t)kept, "types", types);
    return *out ? OBX_OK : obx__fail(OBX_ENOMEM, "takeover: out of memory");
}

obx_err obx_takeover(obx_store *s, const obx_takeover_request *r, char **out) {
    if (!s || !r || !out) return obx__fail(OBX_EINVAL, "takeover: NULL argument");
    *out = NULL;
    obx__clear_error();
    obx_err e;
    const char *who = r->who ? r->who : "operator";
    if ((e = obx__check_field("to_alias", r->to_alias, 1, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("from_alias", r->from_alias, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("who", who, 1, OBX__OWNER_MAX, OBX__CS_OWNER)))
        return e;
    if (r->n_event_types && !r->event_types) return obx__fail(OBX_EINVAL, "event_types: NULL");
    for (size_t i = 0; i < r->n_event_types; i++)
        if ((e = obx__check_field("event_types", r->event_types[i], 1, OBX_NAME_MAX,
                                  OBX__CS_EVENT_TYPE)))
            return obx__fail_prefix(e, "event_types[%zu]", i);
    if (!r->n_event_types && !r->from_alias)
        return obx__fail(OBX_EINVAL, "event_types: none, and no from_alias to choose them from");
    if (r->n_event_types && r->percent)
        return obx__fail(OBX_EINVAL, "percent: chooses among from_alias's types, not together "
                                     "with event_types");
    if (r->percent < 0 || r->percent > 100)
        return obx__fail(OBX_EINVAL, "percent: %d outside 1..100 (0 = all)", r->percent);
    obx__takeover_req req = {.to = r->to_alias,
                             .types = r->event_types,
                             .n_types = r->n_event_types,
                             .from = r->from_alias,
                             .percent = r->percent,
                             .backlog = r->backlog != 0,
                             .who = who,
                             .dry_run = r->dry_run != 0};
    json_t *j;
    if ((e = obx__takeover(s, obx__st_now_ms(s), &req, &j))) return e;
    return obx__json_out(j, out);
}
