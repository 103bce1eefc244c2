/*
 * observe.c — what operators look at: the critical consumers' databases (opened on demand),
 * cached store statistics, consumer lag over a bounded window, the status document (states,
 * ages, the UNKNOWN / PARKED / quarantined lists, consumers) and the trace document (one
 * event's, or one correlation ID's, whole flow from the producer's commit to each critical
 * consumer's receipt). Used by obx_status / obx_trace, the dashboard's JSON API and /metrics.
 *
 * Cost: every query here reads a bounded number of rows through an index (the lists are
 * LIMITed, the lag window is OBX__LAG_WINDOW events); only the store statistics may count a
 * table (SQLite), and obx__stats_get bounds how often that happens.
 */
#include "drivers/log.h"
#include "drivers/observe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- critical consumers ------------------------------------------------------------------ */

static obx_err split_decl(const char *decl, char id[OBX_NAME_MAX + 1], const char **url) {
    const char *eq = decl ? strchr(decl, '=') : NULL;
    if (!eq || eq == decl || (size_t)(eq - decl) > OBX_NAME_MAX || !eq[1])
        return obx__fail(OBX_ECONFIG,
                         "audit.critical_consumers: '%.40s...' is not ID=URL (e.g. "
                         "projection=sqlite:consumer.db)",
                         decl ? decl : "(null)");
    memcpy(id, decl, (size_t)(eq - decl));
    id[eq - decl] = '\0';
    char why[512] = "";
    obx_err e = obx__check_field("audit.critical_consumers: consumer ID", id, 1, OBX_NAME_MAX,
                                 OBX__CS_NAME);
    if (!e) {
        *url = eq + 1;
        e = obx_url_check(*url, "store");
        if (e) snprintf(why, sizeof why, "audit.critical_consumers: %s: ", id);
    }
    if (!e) return OBX_OK;
    /* a configuration error, whatever the check's own code (and never the URL's password:
     * URL errors name the bad part, not the value) */
    size_t l = strlen(why);
    obx__strlcpy(why + l, obx_errmsg(), sizeof why - l);
    return obx__fail(OBX_ECONFIG, "%s", why);
}

obx_err obx__consumer_decl_check(const char *decl) {
    char id[OBX_NAME_MAX + 1];
    const char *url;
    return split_decl(decl, id, &url);
}

obx_err obx__consumer_set_init(obx__consumer_set *cs, const char *const *decls, size_t n) {
    memset(cs, 0, sizeof *cs);
    if (!n) return OBX_OK;
    if (!decls) return obx__fail(OBX_EINVAL, "consumers: NULL with count %zu", n);
    cs->v = calloc(n, sizeof *cs->v);
    if (!cs->v) return obx__fail(OBX_ENOMEM, "consumers: out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *url;
        obx_err e = split_decl(decls[i], cs->v[i].id, &url);
        if (!e && !(cs->v[i].url = obx__strdup(url)))
            e = obx__fail(OBX_ENOMEM, "consumers: out of memory");
        char *red = NULL;
        if (!e && obx_url_redact(url, &red) == OBX_OK) {
            obx__strlcpy(cs->v[i].url_redacted, red, sizeof cs->v[i].url_redacted);
            free(red);
        }
        cs->n = i + 1;
        if (e) {
            obx__consumer_set_free(cs);
            return e;
        }
    }
    return OBX_OK;
}

void obx__consumer_set_free(obx__consumer_set *cs) {
    for (size_t i = 0; i < cs->n; i++) {
        obx__st_close(cs->v[i].s);
        free(cs->v[i].url);
    }
    free(cs->v);
    memset(cs, 0, sizeof *cs);
}

obx_err obx__consumer_open(obx__consumer_set *cs, size_t i) {
    obx__consumer_db *c = &cs->v[i];
    if (c->s) return OBX_OK;
    obx_err e = obx__st_open_with(c->url, cs->open_flags, &c->s);
    int found = 0;
    if (!e) e = obx__st_schema_version(c->s, &found);
    if (!e && found != OBX__SCHEMA_VERSION)
        e = obx__fail(OBX_ESCHEMA, "consumer database has schema version %d, need %d", found,
                      OBX__SCHEMA_VERSION);
    if (e) obx__consumer_drop(cs, i, e);
    return e;
}

void obx__consumer_drop(obx__consumer_set *cs, size_t i, obx_err e) {
    obx__consumer_db *c = &cs->v[i];
    /* messages name URLs only in their redacted form (store.c), never the configured one */
    snprintf(c->error, sizeof c->error, "%s: %s", obx_errname(e), obx_errmsg());
    obx__st_close(c->s);
    c->s = NULL;
}

/* ---- statistics --------------------------------------------------------------------------- */

obx_err obx__stats_get(obx__stats_cache *c, obx__store *s, obx__store_stats *out, int64_t *age_ms) {
    int64_t now = obx__mono_ms();
    int64_t keep = c->cost_ms * 100;
    if (keep > 60000) keep = 60000;
    if (!c->valid || now - c->at_ms > keep) {
        obx_err e = obx__st_stats(s, &c->st);
        if (e) {
            c->valid = false;
            return e;
        }
        int64_t done = obx__mono_ms();
        c->cost_ms = done - now;
        c->at_ms = done;
        c->valid = true;
        now = done;
    }
    *out = c->st;
    if (age_ms) *age_ms = now - c->at_ms;
    return OBX_OK;
}

/* ---- consumer lag ------------------------------------------------------------------------- */

obx_err obx__consumer_lag_of(obx__store *cdb, const char *consumer,
                             const obx__published_ref *recent, size_t n_recent,
                             obx__consumer_lag *out) {
    memset(out, 0, sizeof *out);
    obx__watermark_row *wm = NULL;
    size_t nw = 0;
    obx_err e = obx__st_watermark_list(cdb, consumer, &wm, &nw);
    if (e) return e;
    for (size_t i = 0; i < nw; i++)
        if (wm[i].committed_at > out->last_commit_at) out->last_commit_at = wm[i].committed_at;
    obx__inbox_key *ids = calloc(n_recent + 1, sizeof *ids); /* by ID: lag */
    bool *present = calloc(n_recent + 1, sizeof *present);
    const obx__published_ref **refs = calloc(n_recent + 1, sizeof *refs);
    size_t k = 0;
    if (!ids || !present || !refs) e = obx__fail(OBX_ENOMEM, "consumer lag: out of memory");
    for (size_t i = 0; !e && i < n_recent; i++) {
        bool mine = nw == 0; /* no watermark yet: every topic counts */
        for (size_t j = 0; !mine && j < nw; j++) mine = !strcmp(wm[j].topic, recent[i].topic);
        if (!mine) continue;
        refs[k] = &recent[i];
        ids[k++] = (obx__inbox_key){.event_id = recent[i].event_id};
    }
    if (!e && k) e = obx__st_inbox_has(cdb, consumer, ids, k, present);
    for (size_t i = 0; !e && i < k; i++) {
        if (present[i]) continue;
        out->missing++;
        if (!out->oldest_missing_at || refs[i]->published_at < out->oldest_missing_at)
            out->oldest_missing_at = refs[i]->published_at;
    }
    out->window = (int64_t)k;
    free(ids);
    free(present);
    free(refs);
    free(wm);
    return e;
}

/* ---- status ------------------------------------------------------------------------------- */

static json_t *summary(const obx__event_row *r) {
    char agg[OBX_NAME_MAX + OBX_KEY_MAX + 32];
    snprintf(agg, sizeof agg, "%s/%s@%lld", r->env.aggregate_type, r->env.aggregate_id,
             (long long)r->env.aggregate_version);
    return json_pack(
        "{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:i,s:i,s:s,s:i,s:I,s:I,s:s,s:I,s:I,s:s}", "event_id",
        r->env.event_id, "event_type", r->env.event_type, "aggregate", agg, "tenant", r->env.tenant,
        "correlation_id", r->env.correlation_id, "state", obx__state_name(r->state), "topic",
        r->dest.topic, "committed_at_ms", (json_int_t)r->committed_at, "updated_at_ms",
        (json_int_t)r->updated_at, "rejections", (int)r->rejections, "max_attempts",
        (int)r->max_attempts, "attempt_id", r->attempt_id, "attempt_gen", (int)r->attempt_gen,
        "unknown_since_ms", (json_int_t)r->unknown_since, "next_check_at_ms",
        (json_int_t)r->next_check_at, "owner", r->owner, "lease_until_ms",
        (json_int_t)r->lease_until, "held_at_ms", (json_int_t)r->held_at, "on_unknown",
        r->blind_retry ? "retry" : "hold");
}

static obx_err attempts_of(obx__store *s, const char *event_id, json_t *into, char *last_reason,
                           size_t cap) {
    obx__attempt_row *att = NULL;
    size_t n = 0;
    obx_err e = obx__st_load_attempts(s, NULL, 0, event_id, &att, &n);
    if (e) return e;
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(arr, obx__attempt_json(&att[i]));
        if (last_reason && att[i].detail[0]) obx__strlcpy(last_reason, att[i].detail, cap);
    }
    free(att);
    json_object_set_new(into, "attempts", arr);
    return OBX_OK;
}

static int cmp_unknown(const void *a, const void *b) {
    const obx__event_row *x = a, *y = b;
    return (x->unknown_since > y->unknown_since) - (x->unknown_since < y->unknown_since);
}

/* Events in state st (at most limit), appended to rows. */
static obx_err select_state(obx__store *s, obx__state st, size_t limit, obx__rows *rows) {
    obx__rows got = {0};
    obx__select_req q = {.kind = OBX__SEL_STATE, .state = st, .limit = limit};
    obx_err e =
        obx__st_read_events(s, &(obx__read_req){.by = OBX__READ_SELECT, .select = &q}, &got);
    for (size_t i = 0; !e && i < got.n; i++) {
        obx__event_row *r = obx__rows_push(rows);
        if (!r)
            e = obx__fail(OBX_ENOMEM, "status: out of memory");
        else
            *r = got.v[i]; /* no payload loaded */
    }
    obx__rows_free(&got);
    return e;
}

static json_t *consumer_json(obx__consumer_set *cs, size_t i, const obx__published_ref *recent,
                             size_t n_recent, size_t limit, int64_t now) {
    obx__consumer_db *c = &cs->v[i];
    json_t *o = json_pack("{s:s,s:s}", "consumer_id", c->id, "url", c->url_redacted);
    obx_err e = obx__consumer_open(cs, i);
    obx__consumer_lag lag;
    if (!e) e = obx__consumer_lag_of(c->s, c->id, recent, n_recent, &lag);
    obx__watermark_row *wm = NULL;
    size_t nw = 0;
    obx__poison_row *pr = NULL;
    size_t np = 0;
    if (!e) e = obx__st_watermark_list(c->s, c->id, &wm, &nw);
    if (!e) e = obx__st_poison_list(c->s, c->id, NULL, &pr, &np);
    if (e) {
        obx__consumer_drop(cs, i, e);
        json_object_set_new(o, "up", json_false());
        json_object_set_new(o, "error", json_string(c->error));
        free(wm);
        obx__poison_rows_free(pr, np);
        return o;
    }
    json_object_set_new(o, "up", json_true());
    json_object_set_new(
        o, "lag",
        json_pack("{s:I,s:I,s:I,s:I,s:I}", "events", (json_int_t)lag.missing,
                  "oldest_missing_at_ms", (json_int_t)lag.oldest_missing_at, "age_ms",
                  (json_int_t)(lag.oldest_missing_at ? now - lag.oldest_missing_at : 0), "window",
                  (json_int_t)lag.window, "last_commit_at_ms", (json_int_t)lag.last_commit_at));
    json_t *wa = json_array();
    for (size_t k = 0; k < nw; k++)
        json_array_append_new(wa, json_pack("{s:s,s:i,s:I,s:s,s:I,s:I}", "topic", wm[k].topic,
                                            "partition", (int)wm[k].partition, "offset",
                                            (json_int_t)wm[k].offset, "event_id", wm[k].event_id,
                                            "occurred_at_ms", (json_int_t)wm[k].occurred_at,
                                            "committed_at_ms", (json_int_t)wm[k].committed_at));
    json_object_set_new(o, "watermarks", wa);
    json_t *pa = json_array();
    int64_t parked = 0, redrive = 0;
    for (size_t k = 0; k < np; k++) {
        if (!strcmp(pr[k].state, "PARKED")) parked++;
        if (!strcmp(pr[k].state, "REDRIVE")) redrive++;
        if (!strcmp(pr[k].state, "DONE") || json_array_size(pa) >= limit) continue;
        json_array_append_new(pa, json_pack("{s:s,s:s,s:i,s:s,s:s,s:i,s:I,s:I,s:I}", "event_id",
                                            pr[k].event_id, "state", pr[k].state, "failures",
                                            (int)pr[k].failures, "last_error", pr[k].last_error,
                                            "topic", pr[k].topic, "partition", (int)pr[k].partition,
                                            "offset", (json_int_t)pr[k].offset, "parked_at_ms",
                                            (json_int_t)pr[k].parked_at, "updated_at_ms",
                                            (json_int_t)pr[k].updated_at));
    }
    json_object_set_new(o, "poison",
                        json_pack("{s:I,s:I,s:o}", "parked", (json_int_t)parked, "redrive",
                                  (json_int_t)redrive, "messages", pa));
    free(wm);
    obx__poison_rows_free(pr, np);
    return o;
}

/* The clusters no live relay serves that have PENDING events (docs/operations.md, "Clusters
 * nobody serves"): [{cluster, pending, oldest_committed_at_ms, oldest_age_ms}]. */
static obx_err unserved_json(obx__store *s, int64_t now, json_t **out) {
    obx__unserved_row *u = NULL;
    size_t n = 0;
    obx_err e = obx__st_unserved(s, now, &u, &n);
    if (e) return e;
    *out = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(*out,
                              json_pack("{s:s,s:I,s:I,s:I}", "cluster", u[i].cluster, "pending",
                                        (json_int_t)u[i].pending, "oldest_committed_at_ms",
                                        (json_int_t)u[i].oldest_committed_at, "oldest_age_ms",
                                        (json_int_t)(now - u[i].oldest_committed_at)));
    free(u);
    return OBX_OK;
}

obx_err obx__status_json(obx__store *s, obx__consumer_set *cs, const obx__store_stats *stp,
                         size_t limit, int64_t now, json_t **out) {
    *out = NULL;
    if (!limit) limit = 50;
    obx__store_stats st;
    obx_err e = OBX_OK;
    if (stp)
        st = *stp;
    else if ((e = obx__st_stats(s, &st)))
        return e;
    json_t *doc = json_object(), *states = json_object();
    int64_t total = 0;
    for (int i = 1; i < OBX__ST_COUNT; i++) {
        json_object_set_new(states, obx__state_name((obx__state)i), json_integer(st.by_state[i]));
        total += st.by_state[i];
    }
    int64_t unknown = st.by_state[OBX__ST_DISPATCH_UNKNOWN] + st.by_state[OBX__ST_RECONCILING] +
                      st.by_state[OBX__ST_RETRY_CLAIMED];
    json_object_set_new(doc, "generated_at_ms", json_integer(now));
    json_object_set_new(doc, "store", json_string(s->url_redacted));
    json_object_set_new(doc, "total", json_integer(total));
    json_object_set_new(doc, "states", states);
    json_object_set_new(
        doc, "pending",
        json_pack("{s:I,s:I,s:I}", "events",
                  (json_int_t)(st.by_state[OBX__ST_PENDING] + st.by_state[OBX__ST_CLAIMED]),
                  "oldest_committed_at_ms", (json_int_t)st.oldest_pending_committed_at,
                  "oldest_age_ms",
                  (json_int_t)(st.oldest_pending_committed_at ? now - st.oldest_pending_committed_at
                                                              : 0)));
    json_object_set_new(
        doc, "unknown",
        json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "events", (json_int_t)unknown,
                  "open_attempts", (json_int_t)st.attempts_unknown, "oldest_since_ms",
                  (json_int_t)st.oldest_unknown_since, "oldest_age_ms",
                  (json_int_t)(st.oldest_unknown_since ? now - st.oldest_unknown_since : 0),
                  /* held for an operator (obx resolve), and when to alert (docs/operations.md) */
                  "held", (json_int_t)st.held, "oldest_held_at_ms", (json_int_t)st.oldest_held,
                  "oldest_held_age_ms", (json_int_t)(st.oldest_held ? now - st.oldest_held : 0),
                  "held_alert_ms", (json_int_t)OBX__HELD_ALERT_MS));
    /* delivery sets not delivered yet under their rule, and the trailing targets of `any`
     * sets that are (still sent; not overdue events) */
    int64_t dopen[3] = {0, 0, 0};
    json_t *unserved = NULL;
    if ((e = obx__st_delivery_open(s, dopen)) || (e = unserved_json(s, now, &unserved))) {
        json_decref(doc);
        return e;
    }
    json_object_set_new(doc, "unserved_clusters", unserved);
    json_object_set_new(doc, "delivery_sets",
                        json_pack("{s:I,s:I,s:I}", "undelivered_all", (json_int_t)dopen[0],
                                  "undelivered_any", (json_int_t)dopen[1], "trailing_slots",
                                  (json_int_t)dopen[2]));
    json_object_set_new(
        doc, "receipts",
        json_pack("{s:I,s:I,s:I,s:I,s:I}", "primary", (json_int_t)st.receipts_primary, "duplicate",
                  (json_int_t)st.receipts_duplicate, "quarantined",
                  (json_int_t)st.receipts_quarantined, "migration",
                  (json_int_t)st.receipts_migration, "asserted", (json_int_t)st.receipts_asserted));

    /* UNKNOWN events with their attempts, the longest-unresolved first */
    obx__rows rows = {0};
    const obx__state unknown_states[] = {OBX__ST_DISPATCH_UNKNOWN, OBX__ST_RECONCILING,
                                         OBX__ST_RETRY_CLAIMED};
    for (size_t i = 0; !e && i < 3; i++) e = select_state(s, unknown_states[i], limit, &rows);
    if (!e && rows.n) qsort(rows.v, rows.n, sizeof *rows.v, cmp_unknown);
    json_t *lu = json_array();
    for (size_t i = 0; !e && i < rows.n && i < limit; i++) {
        json_t *j = summary(&rows.v[i]);
        e = attempts_of(s, rows.v[i].env.event_id, j, NULL, 0);
        json_array_append_new(lu, j);
    }
    obx__rows_free(&rows);
    /* PARKED events with the broker's last words */
    json_t *lp = json_array();
    if (!e) e = select_state(s, OBX__ST_PARKED, limit, &rows);
    for (size_t i = 0; !e && i < rows.n; i++) {
        json_t *j = summary(&rows.v[i]);
        char reason[OBX_TEXT_MAX + 1] = "";
        e = attempts_of(s, rows.v[i].env.event_id, j, reason, sizeof reason);
        json_object_set_new(j, "last_reason", json_string(reason));
        json_array_append_new(lp, j);
    }
    obx__rows_free(&rows);
    /* quarantined receipts, newest first */
    json_t *lq = json_array();
    obx__receipt_row *rc = NULL;
    size_t nr = 0;
    if (!e) e = obx__st_receipts_by_kind(s, OBX__RK_QUARANTINED, limit, &rc, &nr);
    for (size_t i = 0; !e && i < nr; i++) {
        json_t *j = obx__receipt_json(&rc[i]);
        json_object_set_new(j, "event_id", json_string(rc[i].event_id));
        json_array_append_new(lq, j);
    }
    free(rc);
    json_object_set_new(doc, "lists",
                        json_pack("{s:o,s:o,s:o,s:I}", "unknown", lu, "parked", lp, "quarantined",
                                  lq, "limit", (json_int_t)limit));
    /* critical consumers: lag over the newest published events, watermarks, poison */
    json_t *ca = json_array();
    obx__published_ref *recent = NULL;
    size_t n_recent = 0;
    if (!e && cs && cs->n) e = obx__st_recent_published(s, OBX__LAG_WINDOW, &recent, &n_recent);
    for (size_t i = 0; !e && cs && i < cs->n; i++)
        json_array_append_new(ca, consumer_json(cs, i, recent, n_recent, limit, now));
    free(recent);
    json_object_set_new(doc, "consumers", ca);
    if (e) {
        json_decref(doc);
        return e;
    }
    *out = doc;
    return OBX_OK;
}

/* ---- trace ---------------------------------------------------------------------------------- */

/* What consumer i holds about one event: its consume receipt, its consume audit, poison. */
static json_t *consumer_trace(obx__consumer_set *cs, size_t i, const char *event_id) {
    obx__consumer_db *c = &cs->v[i];
    json_t *o = json_pack("{s:s}", "consumer_id", c->id);
    obx_err e = obx__consumer_open(cs, i);
    obx__inbox_row in;
    bool have = false;
    if (!e) {
        e = obx__st_inbox_get(c->s, c->id, event_id, &in);
        have = e == OBX_OK;
        if (e == OBX_ENOTFOUND) e = OBX_OK;
    }
    obx__consume_audit_row *au = NULL;
    size_t na = 0;
    if (!e) e = obx__st_consume_audit_list(c->s, c->id, event_id, 0, 200, &au, &na);
    obx__poison_row p;
    bool poisoned = false;
    if (!e) {
        e = obx__st_poison_get(c->s, c->id, event_id, NULL, &p);
        poisoned = e == OBX_OK;
        if (e == OBX_ENOTFOUND) e = OBX_OK;
    }
    if (e) {
        obx__consumer_drop(cs, i, e);
        json_object_set_new(o, "error", json_string(c->error));
        free(au);
        return o;
    }
    json_object_set_new(
        o, "receipt",
        have ? json_pack("{s:s,s:s,s:s,s:s,s:s,s:i,s:I,s:I,s:I,s:s}", "outcome", in.outcome,
                         "result", in.result, "payload_digest", in.payload_digest, "event_type",
                         in.event_type, "topic", in.topic, "partition", (int)in.partition, "offset",
                         (json_int_t)in.offset, "consumed_at_ms", (json_int_t)in.consumed_at,
                         "duration_us", (json_int_t)in.duration_us, "tenant", in.tenant)
             : json_null());
    json_t *aa = json_array();
    for (size_t k = 0; k < na; k++)
        json_array_append_new(aa, json_pack("{s:I,s:s,s:I,s:s}", "at_ms", (json_int_t)au[k].at,
                                            "outcome", au[k].outcome, "duration_us",
                                            (json_int_t)au[k].duration_us, "detail", au[k].detail));
    free(au);
    json_object_set_new(o, "audit", aa);
    if (poisoned) {
        json_object_set_new(o, "poison",
                            json_pack("{s:s,s:i,s:s,s:I,s:I}", "state", p.state, "failures",
                                      (int)p.failures, "last_error", p.last_error, "parked_at_ms",
                                      (json_int_t)p.parked_at, "updated_at_ms",
                                      (json_int_t)p.updated_at));
        free(p.payload);
        free(p.headers_json);
    } else
        json_object_set_new(o, "poison", json_null());
    return o;
}

obx_err obx__trace_json(obx__store *s, obx__consumer_set *cs, const char *event_id,
                        const char *correlation_id, size_t limit, json_t **out) {
    *out = NULL;
    if (!limit) limit = 50;
    if ((!event_id || !*event_id) && (!correlation_id || !*correlation_id))
        return obx__fail(OBX_EINVAL, "trace: an event ID or a correlation ID is required");
    if (correlation_id && *correlation_id) {
        obx_err ce =
            obx__check_field("correlation_id", correlation_id, 1, OBX_TEXT_MAX, OBX__CS_TEXT);
        if (ce) return ce;
    }
    obx__rows found = {0};
    obx_err e = OBX_OK;
    if (correlation_id && *correlation_id)
        e = obx__st_read_events(s,
                                &(obx__read_req){.by = OBX__READ_CORRELATION,
                                                 .correlation_id = correlation_id,
                                                 .limit = limit},
                                &found);
    if (e) return e;
    size_t n = found.n;
    /* the event ID first, then the correlation's events (without repeating it) */
    size_t total = n + (event_id && *event_id ? 1 : 0);
    const char **all = calloc(total + 1, sizeof *all);
    if (!all) {
        obx__rows_free(&found);
        return obx__fail(OBX_ENOMEM, "trace: out of memory");
    }
    size_t k = 0;
    if (event_id && *event_id) all[k++] = event_id;
    for (size_t i = 0; i < n; i++) {
        const char *id = found.v[i].env.event_id;
        if (!(event_id && !strcmp(event_id, id))) all[k++] = id;
    }
    json_t *events = json_array();
    for (size_t i = 0; !e && i < k; i++) {
        json_t *doc = NULL;
        e = obx__inspect_json(s, all[i], &doc);
        if (e == OBX_ENOTFOUND || e == OBX_EINVAL) {
            /* an event ID typed into a search box that is not one, or not here: not an error
             * of the trace (the correlation search may still find events) */
            e = OBX_OK;
            continue;
        }
        if (e) break;
        json_t *ca = json_array();
        for (size_t j = 0; cs && j < cs->n; j++)
            json_array_append_new(ca, consumer_trace(cs, j, all[i]));
        json_object_set_new(doc, "consumers", ca);
        json_array_append_new(events, doc);
    }
    free(all);
    obx__rows_free(&found);
    if (e) {
        json_decref(events);
        return e;
    }
    json_t *checked = json_array();
    for (size_t j = 0; cs && j < cs->n; j++)
        json_array_append_new(checked, json_pack("{s:s,s:s}", "consumer_id", cs->v[j].id, "url",
                                                 cs->v[j].url_redacted));
    *out = json_pack("{s:s?,s:s?,s:o,s:o}", "event_id", event_id && *event_id ? event_id : NULL,
                     "correlation_id", correlation_id && *correlation_id ? correlation_id : NULL,
                     "events", events, "consumers", checked);
    return *out ? OBX_OK : obx__fail(OBX_ENOMEM, "trace: out of memory");
}

/* ---- public entry points --------------------------------------------------------------------- */

obx_err obx_status(obx_store *s, const obx_ops_options *o, char **out) {
    if (!s || !out) return obx__fail(OBX_EINVAL, "status: NULL argument");
    obx__clear_error();
    *out = NULL;
    obx__consumer_set cs;
    obx_err e = obx__consumer_set_init(&cs, o ? o->consumers : NULL, o ? o->n_consumers : 0);
    if (e) return e;
    cs.open_flags = OBX_STORE_READ_ONLY; /* a status never creates a consumer's database */
    json_t *doc = NULL;
    /* ages and relay heartbeats on the database server's clock, as the relays write them: an
     * operator's host clock ahead would show live relays' clusters as unserved */
    e = obx__status_json(s, &cs, NULL, o ? o->limit : 0, obx__st_now_ms(s), &doc);
    obx__consumer_set_free(&cs);
    return e ? e : obx__json_out(doc, out);
}

obx_err obx_trace(obx_store *s, const char *event_id, const char *correlation_id,
                  const obx_ops_options *o, char **out) {
    if (!s || !out) return obx__fail(OBX_EINVAL, "trace: NULL argument");
    obx__clear_error();
    *out = NULL;
    obx_err e;
    if (event_id && *event_id && (e = obx_event_id_check(event_id))) return e;
    obx__consumer_set cs;
    if ((e = obx__consumer_set_init(&cs, o ? o->consumers : NULL, o ? o->n_consumers : 0)))
        return e;
    cs.open_flags = OBX_STORE_READ_ONLY; /* nor does a trace */
    json_t *doc = NULL;
    e = obx__trace_json(s, &cs, event_id, correlation_id, o ? o->limit : 0, &doc);
    obx__consumer_set_free(&cs);
    if (!e && !json_array_size(json_object_get(doc, "events"))) {
        json_decref(doc);
        return event_id && *event_id
                   ? obx__fail(OBX_ENOTFOUND, "event %s: not in this outbox", event_id)
                   : obx__fail(OBX_ENOTFOUND, "no event with correlation ID '%s'", correlation_id);
    }
    return e ? e : obx__json_out(doc, out);
}
