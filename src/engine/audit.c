/*
 * audit.c — the three-set audit (docs/retention.md): it compares the committed outbox events, the
 * accepted publish receipts, and each critical consumer's consume receipts, and reports what
 * does not line up. Read-only: it changes nothing anywhere.
 *
 * Owns: the checks and the audit document (schema "obx.audit.v1"). Each check is one or a few
 * bounded, indexed store queries; every finding names the event IDs involved (at most
 * cfg.max_ids), counts them exactly, and gives the oldest age:
 *
 *   pending_overdue      PENDING/CLAIMED with committed_at older than audit.pending_max_age_ms:
 *                        no dispatcher scans for it (no relay for its cluster/alias, or stuck);
 *   unconsumed           PUBLISHED (not yet RETAINED) older than audit.unconsumed_max_age_ms
 *                        with no consume receipt in a critical consumer's inbox and not covered
 *                        by its forced watermark: a routing or consumer fault (one finding per
 *                        consumer; the oldest audit.max_scan events are checked per run);
 *   bypass               messages on a topic of this broker's cluster (routes name them) whose
 *                        event ID this outbox never committed, or that carry no obx event ID:
 *                        somebody publishes around the outbox (broker scan capability needed);
 *   unknown_overdue      publish outcome UNKNOWN (DISPATCH_UNKNOWN, RECONCILING, RETRY_CLAIMED)
 *                        for longer than audit.unknown_max_age_ms;
 *   quarantined_receipt  publish receipts quarantined by the acceptance point (all of them:
 *                        each is evidence of a contradicting ACK);
 *   consumer_quarantine  events a critical consumer's inbox quarantined (same ID, other
 *                        payload digest);
 *   parked               events definitely rejected the route's max attempts times, waiting for
 *                        an operator (`obx requeue`);
 *   asserted_unconfirmed events published on an operator's assertion (`obx resolve --accept` on
 *                        a cluster that cannot be asked: receipt source "asserted") that no
 *                        critical consumer's receipt (same generation, payload and destination
 *                        digests) confirms yet.
 *   pending_unserved     PENDING past audit.pending_max_age_ms whose cluster no live relay
 *                        serves (no heartbeat in obx_relay_cluster): they wait for a relay that
 *                        is not there (docs/operations.md, "Clusters nobody serves").
 *
 * A check whose input is missing (no broker, no scan capability, no critical consumer, age 0)
 * is reported as skipped with the reason, never as clean.
 */
#include "engine/engine_int.h"

#include <stdio.h>
#include <string.h>

static const char *const finding_names[] = {
#define OBX__F(n, s) s,
    OBX__FINDING_LIST(OBX__F)
#undef OBX__F
};

const char *obx__finding_name(obx__finding_kind k) {
    return (unsigned)k < OBX__FK_COUNT ? finding_names[k] : "?";
}

typedef struct audit_ctx {
    obx__store *s;
    obx__broker *b;
    const obx__audit_cfg *c;
    int64_t now;
    json_t *findings, *checks;
    int64_t *counts;
} audit_ctx;

static void check(audit_ctx *x, const char *name, const char *status, const char *fmt, ...)
    OBX__PRINTF(4, 5);

static void check(audit_ctx *x, const char *name, const char *status, const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    json_array_append_new(
        x->checks, json_pack("{s:s,s:s,s:s}", "check", name, "status", status, "detail", detail));
}

/* Appends id to a JSON array of at most max distinct IDs. */
static void list_id(json_t *arr, const char *id, size_t max) {
    size_t i;
    json_t *v;
    if (json_array_size(arr) >= max) return;
    json_array_foreach(arr, i, v) {
        if (!strcmp(json_string_value(v), id)) return;
    }
    json_array_append_new(arr, json_string(id));
}

static json_t *finding(audit_ctx *x, obx__finding_kind k, int64_t count, int64_t oldest,
                       json_t *ids, const char *detail) {
    json_t *f =
        json_pack("{s:s,s:I,s:I,s:o,s:s}", "kind", obx__finding_name(k), "count", (json_int_t)count,
                  "oldest_age_ms", (json_int_t)(oldest ? x->now - oldest : 0), "event_ids", ids,
                  "detail", detail);
    json_array_append(x->findings, f);
    json_decref(f); /* the array holds it; the caller may add keys through the borrowed ref */
    return f;
}

/* One indexed query: rows of `kind` with at <= until; a finding when there are any. `what`
 * names the rows ("PENDING/CLAIMED events committed before ..."), `hint` what they mean. */
static obx_err aged_check(audit_ctx *x, obx__store *s, obx__aged_kind kind, obx__finding_kind fk,
                          int64_t until, const char *consumer, const char *check_name,
                          const char *what, const char *hint) {
    obx__aged_req req = {.kind = kind,
                         .until = until,
                         .after_at = INT64_MIN,
                         .after_key = INT64_MIN,
                         .limit = x->c->max_ids,
                         .consumer = consumer,
                         .now = x->now,
                         .count = true};
    obx__aged_row *rows = NULL;
    size_t n = 0;
    obx__aged_count cnt;
    obx_err e = obx__st_aged(s, &req, &rows, &n, &cnt);
    if (e) return obx__fail_prefix(e, "audit %s", check_name);
    if (!cnt.total) {
        free(rows);
        check(x, check_name, "ok", "no %s", what);
        return OBX_OK;
    }
    json_t *ids = json_array();
    for (size_t i = 0; i < n; i++) list_id(ids, rows[i].event_id, x->c->max_ids);
    char t[32];
    obx__iso_ms(cnt.oldest, t);
    char detail[512];
    snprintf(detail, sizeof detail, "%lld %s, the oldest since %s%s%s%s: %s", (long long)cnt.total,
             what, t, n && rows[0].detail[0] ? " (" : "", n ? rows[0].detail : "",
             n && rows[0].detail[0] ? ")" : "", hint);
    json_t *f = finding(x, fk, cnt.total, cnt.oldest, ids, detail);
    if (consumer) json_object_set_new(f, "consumer", json_string(consumer));
    x->counts[fk] += cnt.total;
    check(x, check_name, "findings", "%s", detail);
    free(rows);
    return OBX_OK;
}

/* PENDING past audit.pending_max_age_ms in a cluster no live relay serves. */
static obx_err unserved(audit_ctx *x) {
    if (!x->c->pending_max_age_ms) {
        check(x, "pending_unserved", "skipped", "audit.pending_max_age_ms is 0 (check off)");
        return OBX_OK;
    }
    char what[200];
    snprintf(what, sizeof what, "PENDING events for over %lld ms in a cluster no live relay serves",
             (long long)x->c->pending_max_age_ms);
    return aged_check(x, x->s, OBX__AGED_UNSERVED, OBX__FK_UNSERVED,
                      x->now - x->c->pending_max_age_ms, NULL, "pending_unserved", what,
                      "start a relay for that cluster, or route the event type elsewhere");
}

/* ---- unconsumed: PUBLISHED past its age vs each critical consumer's inbox ------------------ */

typedef struct per_consumer {
    int64_t count, oldest;
    json_t *ids;
} per_consumer;

static obx_err unconsumed(audit_ctx *x) {
    const obx__audit_cfg *c = x->c;
    const char *name = "unconsumed";
    if (!c->n_consumers) {
        check(x, name, "skipped",
              "no critical consumers declared (audit.critical_consumers): nothing to compare "
              "the published events with");
        return OBX_OK;
    }
    if (!c->unconsumed_max_age_ms) {
        check(x, name, "skipped", "audit.unconsumed_max_age_ms is 0 (check off)");
        return OBX_OK;
    }
    int64_t until = x->now - c->unconsumed_max_age_ms;
    obx__aged_req req = {.kind = OBX__AGED_PUBLISHED,
                         .until = until,
                         .after_at = INT64_MIN,
                         .after_key = INT64_MIN,
                         .count = true};
    obx__aged_row *rows = NULL;
    size_t n = 0;
    obx__aged_count total;
    obx_err e = obx__st_aged(x->s, &req, &rows, &n, &total);
    if (e) return obx__fail_prefix(e, "audit %s", name);
    per_consumer *pc = calloc(c->n_consumers, sizeof *pc);
    obx__inbox_key *ids = calloc(512, sizeof *ids); /* by ID: lag, not retention's evidence */
    bool *present = calloc(512, sizeof *present), *missing = calloc(512, sizeof *missing);
    if (!pc || !ids || !present || !missing) e = obx__fail(OBX_ENOMEM, "audit: out of memory");
    for (size_t k = 0; !e && k < c->n_consumers; k++) pc[k].ids = json_array();
    int64_t scanned = 0, distinct = 0;
    req.count = false;
    while (!e && scanned < (int64_t)c->max_scan) {
        req.limit = 512;
        if ((int64_t)req.limit > (int64_t)c->max_scan - scanned)
            req.limit = (size_t)((int64_t)c->max_scan - scanned);
        free(rows);
        rows = NULL;
        if ((e = obx__st_aged(x->s, &req, &rows, &n, NULL))) break;
        if (!n) break;
        for (size_t i = 0; i < n; i++) {
            ids[i] = (obx__inbox_key){.event_id = rows[i].event_id};
            missing[i] = false;
        }
        for (size_t k = 0; !e && k < c->n_consumers; k++) {
            const obx__critical *cc = &c->consumers[k];
            if ((e = obx__st_inbox_has(cc->s, cc->id, ids, n, present))) {
                obx__fail_prefix(e, "audit: critical consumer %s", cc->id);
                break;
            }
            for (size_t i = 0; i < n; i++) {
                if (present[i] || rows[i].at <= cc->forced) continue;
                missing[i] = true;
                if (!pc[k].count || rows[i].at < pc[k].oldest) pc[k].oldest = rows[i].at;
                pc[k].count++;
                list_id(pc[k].ids, rows[i].event_id, c->max_ids);
            }
        }
        for (size_t i = 0; i < n; i++) distinct += missing[i];
        scanned += (int64_t)n;
        req.after_at = rows[n - 1].at;
        req.after_key = rows[n - 1].key;
        if (n < req.limit) break;
    }
    for (size_t k = 0; !e && k < c->n_consumers; k++) {
        const obx__critical *cc = &c->consumers[k];
        if (!pc[k].count) continue;
        char t[32], detail[512];
        obx__iso_ms(pc[k].oldest, t);
        snprintf(detail, sizeof detail,
                 "%lld PUBLISHED events older than audit.unconsumed_max_age_ms (%lld ms) have no "
                 "consume receipt in critical consumer %s's inbox (the oldest published %s): a "
                 "routing or consumer fault",
                 (long long)pc[k].count, (long long)c->unconsumed_max_age_ms, cc->id, t);
        json_t *f = finding(x, OBX__FK_UNCONSUMED, pc[k].count, pc[k].oldest, pc[k].ids, detail);
        pc[k].ids = NULL;
        json_object_set_new(f, "consumer", json_string(cc->id));
        json_object_set_new(f, "scanned", json_integer(scanned));
        json_object_set_new(f, "published_past_age", json_integer(total.total));
    }
    if (!e) {
        x->counts[OBX__FK_UNCONSUMED] += distinct;
        bool partial = scanned < total.total;
        char more[160] = "";
        if (partial)
            snprintf(more, sizeof more, " (the oldest %lld of %lld checked: audit.max_scan)",
                     (long long)scanned, (long long)total.total);
        check(x, name,
              distinct  ? "findings"
              : partial ? "partial"
                        : "ok",
              "%lld PUBLISHED events past age checked against %zu critical consumer inbox%s%s: "
              "%lld without evidence",
              (long long)scanned, c->n_consumers, c->n_consumers == 1 ? "" : "es", more,
              (long long)distinct);
    }
    for (size_t k = 0; pc && k < c->n_consumers; k++) json_decref(pc[k].ids);
    free(pc);
    free(ids);
    free(present);
    free(missing);
    free(rows);
    return e;
}

/* ---- asserted_unconfirmed: operator assertions no critical consumer confirms -------------- */

/* Whether a critical consumer's receipt of event_id confirms what the operator asserted: the
 * event's generation, payload digest and destination digest. */
static obx_err confirmed(audit_ctx *x, const char *event_id, bool *yes) {
    *yes = false;
    obx__rows ev = {0};
    obx_err e = obx__st_load_events(x->s, &event_id, 1, 0, &ev);
    for (size_t k = 0; !e && ev.n && !*yes && k < x->c->n_consumers; k++) {
        const obx__critical *cc = &x->c->consumers[k];
        const obx__event_row *r = &ev.v[0];
        obx__inbox_row in;
        e = obx__st_inbox_get(cc->s, cc->id, obx__wire_id(r), &in);
        if (e == OBX_ENOTFOUND) {
            e = OBX_OK;
            continue;
        }
        *yes = !e && in.envelope_gen == r->envelope_gen &&
               !strcmp(in.payload_digest, r->env.payload_digest) &&
               !strcmp(in.dest_digest, r->dest_digest);
    }
    obx__rows_free(&ev);
    return e;
}

static obx_err asserted(audit_ctx *x) {
    const char *name = "asserted_unconfirmed";
    obx__aged_req req = {.kind = OBX__AGED_ASSERTED,
                         .until = x->now,
                         .after_at = INT64_MIN,
                         .after_key = INT64_MIN,
                         .limit = x->c->max_scan};
    obx__aged_row *rows = NULL;
    size_t n = 0;
    obx_err e = obx__st_aged(x->s, &req, &rows, &n, NULL);
    if (e) return obx__fail_prefix(e, "audit %s", name);
    json_t *ids = json_array();
    int64_t count = 0, oldest = 0;
    for (size_t i = 0; !e && i < n; i++) {
        bool yes = false;
        if ((e = confirmed(x, rows[i].event_id, &yes)) || yes) continue;
        if (!count++ || rows[i].at < oldest) oldest = rows[i].at;
        list_id(ids, rows[i].event_id, x->c->max_ids);
    }
    free(rows);
    if (e || !count) {
        json_decref(ids);
        if (!e)
            check(x, name, "ok", "%zu operator assertions, each confirmed by a critical consumer",
                  n);
        return e ? obx__fail_prefix(e, "audit %s", name) : OBX_OK;
    }
    char detail[512];
    snprintf(detail, sizeof detail,
             "%lld events published on an operator's assertion alone (obx resolve --accept on a "
             "cluster that cannot be asked) that no critical consumer's receipt confirms: check "
             "that the broker holds them",
             (long long)count);
    finding(x, OBX__FK_ASSERTED, count, oldest, ids, detail);
    x->counts[OBX__FK_ASSERTED] += count;
    check(x, name, "findings", "%s", detail);
    return OBX_OK;
}

/* ---- bypass: what the broker holds that the outbox never committed ------------------------- */

enum { SCAN_BATCH = 256 };

typedef struct scan_ctx {
    audit_ctx *x;
    const char *topic;
    char id[SCAN_BATCH][OBX_EVENT_ID_LEN + 1];
    int64_t ts[SCAN_BATCH];
    size_t n;
    int64_t messages, unknown, no_id, oldest;
    json_t *ids, *where;
    obx_err err;
} scan_ctx;

static obx_err scan_flush(scan_ctx *sc) {
    if (!sc->n) return OBX_OK;
    const char *ids[SCAN_BATCH];
    for (size_t i = 0; i < sc->n; i++) ids[i] = sc->id[i];
    /* the rows come back in the order of ids, those not in the outbox left out */
    obx__rows got = {0};
    obx_err e = obx__st_load_events(sc->x->s, ids, sc->n, 0, &got);
    if (e) {
        obx__rows_free(&got);
        return e;
    }
    size_t j = 0;
    for (size_t i = 0; i < sc->n; i++) {
        if (j < got.n && !strcmp(got.v[j].env.event_id, ids[i])) {
            j++;
            continue;
        }
        sc->unknown++;
        if (!sc->oldest || (sc->ts[i] && sc->ts[i] < sc->oldest)) sc->oldest = sc->ts[i];
        list_id(sc->ids, sc->id[i], sc->x->c->max_ids);
    }
    obx__rows_free(&got);
    sc->n = 0;
    return OBX_OK;
}

static int scan_fn(void *user, const char *event_id, int32_t partition, int64_t offset,
                   int64_t broker_ts) {
    scan_ctx *sc = user;
    sc->messages++;
    if (!event_id || obx_event_id_check(event_id) != OBX_OK) {
        /* not an obx message at all: published around the outbox */
        sc->no_id++;
        if (!sc->oldest || (broker_ts && broker_ts < sc->oldest)) sc->oldest = broker_ts;
        if (json_array_size(sc->where) < sc->x->c->max_ids)
            json_array_append_new(sc->where, json_sprintf("%s/%d@%lld", sc->topic, (int)partition,
                                                          (long long)offset));
        return 0;
    }
    obx__strlcpy(sc->id[sc->n], event_id, sizeof sc->id[sc->n]);
    sc->ts[sc->n++] = broker_ts;
    if (sc->n == SCAN_BATCH && (sc->err = scan_flush(sc))) return 1;
    return 0;
}

static obx_err bypass(audit_ctx *x) {
    const char *name = "bypass";
    if (!x->b) {
        check(x, name, "skipped", "no broker given: the broker's set is not compared");
        return OBX_OK;
    }
    if (!(obx__br_caps(x->b) & OBX__BCAP_SCAN)) {
        check(x, name, "skipped",
              "the %s broker at %s cannot list what a topic holds (no scan capability; AMQP "
              "needs an audit stream)",
              obx__br_name(x->b), x->b->url_redacted);
        return OBX_OK;
    }
    char cluster[OBX_NAME_MAX + 1];
    obx_err e = obx__br_cluster_id(x->b, cluster, sizeof cluster);
    if (e) return obx__fail_prefix(e, "audit bypass: broker cluster identity");
    obx__route_row *routes = NULL;
    size_t nr = 0;
    if ((e = obx__st_route_list(x->s, true, &routes, &nr)))
        return obx__fail_prefix(e, "audit bypass: routes");
    int64_t since = x->c->broker_scan_window_ms ? x->now - x->c->broker_scan_window_ms : 0;
    size_t topics = 0;
    for (size_t i = 0; !e && i < nr; i++) {
        if (strcmp(routes[i].cluster, cluster)) continue;
        bool seen = false; /* every generation of a route names its topic again */
        for (size_t j = 0; j < i && !seen; j++)
            seen = !strcmp(routes[j].cluster, cluster) && !strcmp(routes[j].topic, routes[i].topic);
        if (seen) continue;
        topics++;
        scan_ctx *sc = calloc(1, sizeof *sc);
        if (!sc) {
            e = obx__fail(OBX_ENOMEM, "audit: out of memory");
            break;
        }
        sc->x = x;
        sc->topic = routes[i].topic;
        sc->ids = json_array();
        sc->where = json_array();
        e = obx__br_scan(x->b, routes[i].topic, since, scan_fn, sc);
        if (!e) e = sc->err;
        if (!e) e = scan_flush(sc);
        if (e) obx__fail_prefix(e, "audit bypass: topic %s", routes[i].topic);
        int64_t bad = sc->unknown + sc->no_id;
        char detail[512], what[64];
        snprintf(what, sizeof what, "bypass %s", routes[i].topic);
        if (!e && bad) {
            snprintf(detail, sizeof detail,
                     "%lld of %lld messages on %s/%s (scanned since %s) were never committed by "
                     "this outbox: %lld with an unknown event ID (published around the outbox, "
                     "or committed and then lost by a failover to an asynchronous standby), %lld "
                     "without an obx event ID (published around the outbox)",
                     (long long)bad, (long long)sc->messages, cluster, routes[i].topic,
                     since ? "the audit window" : "the start of the topic", (long long)sc->unknown,
                     (long long)sc->no_id);
            json_t *f = finding(x, OBX__FK_BYPASS, bad, sc->oldest, sc->ids, detail);
            sc->ids = NULL;
            json_object_set_new(f, "topic", json_string(routes[i].topic));
            json_object_set_new(f, "without_event_id", json_integer(sc->no_id));
            json_object_set_new(f, "without_event_id_at", sc->where);
            sc->where = NULL;
            json_object_set_new(f, "scanned", json_integer(sc->messages));
            x->counts[OBX__FK_BYPASS] += bad;
            check(x, what, "findings", "%s", detail);
        } else if (!e)
            check(x, what, "ok", "%lld messages on %s/%s, every one committed by this outbox",
                  (long long)sc->messages, cluster, routes[i].topic);
        json_decref(sc->ids);
        json_decref(sc->where);
        free(sc);
    }
    if (!e && !topics)
        check(x, name, "skipped", "no route names this broker's cluster '%s': no topic to scan",
              cluster);
    free(routes);
    return e;
}

/* ---- the run -------------------------------------------------------------------------------- */

obx_err obx__audit_run(obx__store *s, obx__broker *b, const obx__audit_cfg *c, int64_t now,
                       json_t **doc, int64_t counts[OBX__FK_COUNT]) {
    *doc = NULL;
    for (int k = 0; k < OBX__FK_COUNT; k++) counts[k] = 0;
    if (!c->max_ids || !c->max_scan)
        return obx__fail(OBX_EINVAL, "audit: max_ids and max_scan must be >= 1");
    audit_ctx x = {.s = s,
                   .b = b,
                   .c = c,
                   .now = now,
                   .findings = json_array(),
                   .checks = json_array(),
                   .counts = counts};
    obx_err e = (!x.findings || !x.checks) ? obx__fail(OBX_ENOMEM, "audit: out of memory") : OBX_OK;
    char name[160], what[200];
    if (!e && c->pending_max_age_ms) {
        snprintf(what, sizeof what,
                 "committed events not yet sent (PENDING/CLAIMED) for over %lld ms",
                 (long long)c->pending_max_age_ms);
        e = aged_check(&x, s, OBX__AGED_PENDING, OBX__FK_PENDING, now - c->pending_max_age_ms, NULL,
                       "pending_overdue", what,
                       "no dispatcher scans for them (no relay for their cluster or alias?)");
    } else if (!e)
        check(&x, "pending_overdue", "skipped", "audit.pending_max_age_ms is 0 (check off)");
    if (!e) e = unserved(&x);
    if (!e) e = unconsumed(&x);
    if (!e) e = bypass(&x);
    if (!e && c->unknown_max_age_ms) {
        snprintf(what, sizeof what, "events with an UNKNOWN publish outcome for over %lld ms",
                 (long long)c->unknown_max_age_ms);
        e = aged_check(&x, s, OBX__AGED_UNKNOWN, OBX__FK_UNKNOWN, now - c->unknown_max_age_ms, NULL,
                       "unknown_overdue", what,
                       "is a reconciler running, and can it query the broker?");
    } else if (!e)
        check(&x, "unknown_overdue", "skipped", "audit.unknown_max_age_ms is 0 (check off)");
    if (!e)
        e = aged_check(&x, s, OBX__AGED_QUARANTINED, OBX__FK_QUARANTINED, now, NULL,
                       "quarantined_receipt", "quarantined publish receipts",
                       "an ACK contradicted the frozen envelope (digests, place or generation)");
    for (size_t k = 0; !e && k < c->n_consumers; k++) {
        snprintf(name, sizeof name, "consumer_quarantine %s", c->consumers[k].id);
        e = aged_check(&x, c->consumers[k].s, OBX__AGED_INBOX_QUARANTINED,
                       OBX__FK_CONSUMER_QUARANTINE, now, c->consumers[k].id, name,
                       "events quarantined by this consumer's inbox",
                       "the same event ID arrived with another payload digest");
    }
    if (!e)
        e = aged_check(&x, s, OBX__AGED_PARKED, OBX__FK_PARKED, now, NULL, "parked",
                       "PARKED events (definitely rejected the route's max attempts times)",
                       "fix the cause, then `obx requeue` them");
    if (!e) e = asserted(&x);
    obx__store_stats st;
    if (!e) e = obx__st_stats(s, &st);
    if (e) {
        json_decref(x.findings);
        json_decref(x.checks);
        return e;
    }
    int64_t committed = 0, total = 0;
    for (int i = 1; i < OBX__ST_COUNT; i++) committed += st.by_state[i];
    json_t *cnt = json_object(), *cons = json_array();
    for (int k = 0; k < OBX__FK_COUNT; k++) {
        json_object_set_new(cnt, obx__finding_name((obx__finding_kind)k), json_integer(counts[k]));
        total += counts[k];
    }
    for (size_t k = 0; k < c->n_consumers; k++)
        json_array_append_new(cons,
                              json_pack("{s:s,s:s,s:I,s:I}", "id", c->consumers[k].id, "db",
                                        obx_store_url(c->consumers[k].s), "forced_watermark_ms",
                                        (json_int_t)c->consumers[k].forced, "forced_at_ms",
                                        (json_int_t)c->consumers[k].forced_at));
    char t[32];
    obx__iso_ms(now, t);
    *doc = json_pack(
        "{s:s,s:I,s:s,s:s,s:s?,s:{s:I,s:I,s:I,s:I,s:I},s:o,s:{s:I,s:I,s:I,s:I,s:I,s:I},s:o,s:o,s:o,"
        "s:I}",
        "schema", "obx.audit.v1", "at_ms", (json_int_t)now, "at_utc", t, "store", obx_store_url(s),
        "broker", b ? b->url_redacted : NULL, "thresholds", "pending_max_age_ms",
        (json_int_t)c->pending_max_age_ms, "unconsumed_max_age_ms",
        (json_int_t)c->unconsumed_max_age_ms, "unknown_max_age_ms",
        (json_int_t)c->unknown_max_age_ms, "broker_scan_window_ms",
        (json_int_t)c->broker_scan_window_ms, "max_scan", (json_int_t)c->max_scan,
        "critical_consumers", cons, "sets", "committed", (json_int_t)committed, "published",
        (json_int_t)(st.by_state[OBX__ST_PUBLISHED] + st.by_state[OBX__ST_RETAINED] +
                     st.by_state[OBX__ST_PURGED]),
        "retained", (json_int_t)st.by_state[OBX__ST_RETAINED], "purged",
        (json_int_t)st.by_state[OBX__ST_PURGED], "primary_receipts",
        (json_int_t)st.receipts_primary, "quarantined_receipts",
        (json_int_t)st.receipts_quarantined, "findings", x.findings, "counts", cnt, "checks",
        x.checks, "findings_total", (json_int_t)total);
    return *doc ? OBX_OK : obx__fail(OBX_ENOMEM, "audit: out of memory");
}
