/*
 * purge.c — retention (docs/design.md, "Audit and retention"): PUBLISHED -> RETAINED -> PURGED,
 * by the PURGER actor (obx__purge_step, named in the transition table). Definitions in engine.h
 * and docs/retention.md; in short:
 *
 *   PUBLISHED --every critical consumer has evidence--> RETAINED
 *   RETAINED  --replay window over, behind the forced consumer watermark, evidence checked
 *               again--> PURGED (payload dropped; envelope, digests, attempts, receipts and
 *               audit rows kept as a tombstone)
 *
 * Owns: the retention run (a cursor over publication order, in two phases), the single-event
 * purge, the forced watermark of a critical consumer (read and write on its database), and the
 * JSON of a run's result.
 *
 * Invariants:
 *   1. Nothing is retained or purged on the strength of an ACK alone: every transition needs
 *      evidence from every declared critical consumer, and with none declared nothing moves.
 *   2. Every transition is a compare-and-set on (state, claim_gen) with its audit row, in the
 *      transaction that locked the row; the payload is dropped in that same transaction.
 *   3. Bounded transactions: at most cfg.batch rows each (PostgreSQL: FOR UPDATE SKIP LOCKED,
 *      so that two purgers split the work and never wait for each other or for a relay).
 *   4. A dry run takes the same decisions from the same reads, and writes and locks nothing.
 *   5. Phase 1 never purges an event at or after the forced consumer watermark: the run finds
 *      the watermark after phase 0 (the oldest event still PUBLISHED, a conservative bound when
 *      another purger holds rows) and lowers it at the first RETAINED event that lost its
 *      evidence.
 */
#include "engine/engine_int.h"

#include <stdio.h>
#include <string.h>

/* ---- critical consumers: forced watermarks ----------------------------------------------------
 */

obx_err obx__critical_load(obx__critical *c) {
    obx__watermark_row *w = NULL;
    size_t n = 0;
    c->forced = c->forced_at = 0;
    obx_err e = obx__st_watermark_list(c->s, c->id, &w, &n);
    if (e) return obx__fail_prefix(e, "critical consumer %s", c->id);
    for (size_t i = 0; i < n; i++)
        if (w[i].partition == OBX__FORCED_PARTITION && !strcmp(w[i].topic, OBX__FORCED_TOPIC)) {
            c->forced = w[i].offset;
            c->forced_at = w[i].committed_at;
        }
    free(w);
    return OBX_OK;
}

obx_err obx__critical_force(obx__critical *c, int64_t until, int64_t now, const char *who,
                            const char *reason) {
    obx_err e;
    if ((e = obx__check_field("who", who, 1, OBX__OWNER_MAX, OBX__CS_OWNER)) ||
        (e = obx__check_field("reason", reason, 1, 200, OBX__CS_TEXT)))
        return e;
    char t_until[32], t_now[32];
    obx__iso_ms(until, t_until);
    obx__iso_ms(now, t_now);
    if (until <= 0)
        return obx__fail(OBX_EINVAL, "until: %lld is not a time after the epoch (ms)",
                         (long long)until);
    if (until > now)
        return obx__fail(OBX_EINVAL,
                         "until: %s is in the future (now is %s): a watermark covers what was "
                         "published; to stop waiting for consumer %s, remove it from "
                         "audit.critical_consumers",
                         t_until, t_now, c->id);
    if ((e = obx__st_begin(c->s))) return e;
    e = obx__critical_load(c);
    if (!e && until <= c->forced) {
        char t_prev[32];
        obx__iso_ms(c->forced, t_prev);
        e = obx__fail(OBX_EREFUSED,
                      "consumer %s: its watermark is already forced to %s; a forced watermark "
                      "only moves forward",
                      c->id, t_prev);
    }
    if (!e) {
        obx__watermark_row w;
        memset(&w, 0, sizeof w);
        obx__strlcpy(w.consumer_id, c->id, sizeof w.consumer_id);
        obx__strlcpy(w.topic, OBX__FORCED_TOPIC, sizeof w.topic);
        w.partition = OBX__FORCED_PARTITION;
        w.offset = until;
        w.committed_at = now;
        e = obx__st_watermark_put(c->s, &w);
    }
    if (!e) {
        obx__consume_audit_row a;
        memset(&a, 0, sizeof a);
        a.at = now;
        obx__strlcpy(a.consumer_id, c->id, sizeof a.consumer_id);
        obx__strlcpy(a.outcome, OBX__FORCED_OUTCOME, sizeof a.outcome);
        char prev[32];
        if (c->forced)
            obx__iso_ms(c->forced, prev);
        else
            obx__strlcpy(prev, "never forced", sizeof prev);
        snprintf(a.detail, sizeof a.detail, "forced to %s by %.60s (was %s): %s", t_until, who,
                 prev, reason);
        e = obx__st_consume_audit_put(c->s, &a, 1);
    }
    if (e) {
        obx__st_rollback(c->s);
        return e;
    }
    if ((e = obx__st_commit(c->s))) return e;
    c->forced = until;
    c->forced_at = now;
    return OBX_OK;
}

/* ---- evidence ------------------------------------------------------------------------------- */

enum { EV_MISSING = 0, EV_RECEIPT = 1, EV_FORCED = 2 };

/* ev[i * n_consumers + k]: the evidence consumer k has for rows[i]. One inbox query per
 * consumer for the whole batch. A receipt counts only when it is for the bytes obx froze: the
 * event's payload digest, envelope generation and destination, and no quarantine of the ID in
 * that inbox (obx__inbox_key): a consumer that applied a corrupt or foreign copy, or a row
 * made by hand, never lets the only correct payload go. */
static obx_err evidence(const obx__retention_cfg *c, const obx__event_row *rows, size_t n,
                        unsigned char *ev) {
    if (!n || !c->n_consumers) return OBX_OK;
    obx__inbox_key *keys = calloc(n, sizeof *keys);
    bool *present = calloc(n, sizeof *present);
    obx_err e = (!keys || !present) ? obx__fail(OBX_ENOMEM, "purge: out of memory") : OBX_OK;
    /* consumers dedupe and record under the event ID they were sent (a delivery-set slot's
     * logical ID), never the slot's own key */
    for (size_t i = 0; !e && i < n; i++)
        keys[i] =
            (obx__inbox_key){obx__wire_id(&rows[i]),
                             OBX__MUTANT(PURGE_ANY_INBOX_ROW) ? NULL : rows[i].env.payload_digest,
                             rows[i].envelope_gen, rows[i].target_no ? NULL : rows[i].dest_digest};
    for (size_t k = 0; !e && k < c->n_consumers; k++) {
        const obx__critical *cc = &c->consumers[k];
        e = obx__st_inbox_has(cc->s, cc->id, keys, n, present);
        if (e) {
            obx__fail_prefix(e, "critical consumer %s", cc->id);
            break;
        }
        for (size_t i = 0; i < n; i++)
            ev[i * c->n_consumers + k] = present[i]                           ? EV_RECEIPT
                                         : rows[i].published_at <= cc->forced ? EV_FORCED
                                                                              : EV_MISSING;
    }
    free(keys);
    free(present);
    return e;
}

static bool all_evidence(const obx__retention_cfg *c, const unsigned char *ev) {
    if (OBX__MUTANT(PURGE_BEFORE_WATERMARK)) return true;
    for (size_t k = 0; k < c->n_consumers; k++)
        if (ev[k] == EV_MISSING) return false;
    return c->n_consumers > 0;
}

/* "proj (consume receipt), archive (forced watermark 2030-...)" or the missing ones. */
static void describe(const obx__retention_cfg *c, const unsigned char *ev, bool missing, char *out,
                     size_t cap) {
    size_t o = 0;
    out[0] = '\0';
    for (size_t k = 0; k < c->n_consumers && o + 1 < cap; k++) {
        if ((ev[k] == EV_MISSING) != missing) continue;
        char t[32] = "";
        if (ev[k] == EV_FORCED) obx__iso_ms(c->consumers[k].forced, t);
        int w = snprintf(out + o, cap - o, "%s%s%s%s%s", o ? ", " : "", c->consumers[k].id,
                         ev[k] == EV_RECEIPT  ? " (consume receipt)"
                         : ev[k] == EV_FORCED ? " (forced watermark "
                                              : "",
                         t, ev[k] == EV_FORCED ? ")" : "");
        if (w < 0) break;
        o += (size_t)w;
        if (o >= cap) o = cap - 1;
    }
}

/* ---- results -------------------------------------------------------------------------------- */

void obx__ret_result_free(obx__ret_result *r) {
    if (!r) return;
    free(r->items);
    r->items = NULL;
    r->n_items = r->cap_items = 0;
}

static obx_err add_item(const obx__retention_cfg *c, obx__ret_result *r, const obx__event_row *row,
                        obx__state to, const char *fmt, ...) OBX__PRINTF(5, 6);

static obx_err add_item(const obx__retention_cfg *c, obx__ret_result *r, const obx__event_row *row,
                        obx__state to, const char *fmt, ...) {
    if (r->n_items >= c->max_listed) {
        r->items_dropped++;
        return OBX_OK;
    }
    if (r->n_items == r->cap_items) {
        size_t cap = r->cap_items ? r->cap_items * 2 : 64;
        if (cap > c->max_listed) cap = c->max_listed;
        obx__ret_item *p = realloc(r->items, cap * sizeof *p);
        if (!p) return obx__fail(OBX_ENOMEM, "purge: out of memory");
        r->items = p;
        r->cap_items = cap;
    }
    obx__ret_item *it = &r->items[r->n_items++];
    memset(it, 0, sizeof *it);
    obx__strlcpy(it->event_id, row->env.event_id, sizeof it->event_id);
    it->from = row->state;
    it->to = to;
    it->published_at = row->published_at;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->reason, sizeof it->reason, fmt, ap);
    va_end(ap);
    return OBX_OK;
}

static void set_hole(obx__ret_result *r, const obx__event_row *row, const char *why) {
    r->hole = true;
    obx__strlcpy(r->hole_event, row->env.event_id, sizeof r->hole_event);
    r->hole_pos = (obx__pub_pos){row->published_at, row->seq};
    obx__strlcpy(r->hole_why, why, sizeof r->hole_why);
}

static bool pos_less(obx__pub_pos a, obx__pub_pos b) {
    return a.at < b.at || (a.at == b.at && a.seq < b.seq);
}

/* The exclusive end of the replay window in publication order: every event published at or
 * before now - window. */
static obx__pub_pos replay_end(const obx__retention_cfg *c, int64_t now) {
    return (obx__pub_pos){now - c->replay_window_ms, INT64_MAX};
}

/* ---- one batch ------------------------------------------------------------------------------ */

typedef struct step_ctx {
    const obx__retention_cfg *c;
    int64_t now;
    obx__purge_cursor *cur;
    obx__ret_result *res;
    obx__ret_result part; /* this transaction's decisions: merged into res after commit */
    obx__rows rows;
    size_t handled;  /* rows whose place the cursor may pass */
    bool hole_found; /* phase 1: a RETAINED event without evidence (the new limit) */
    obx__pub_pos hole;
} step_ctx;

static void part_reset(step_ctx *x) {
    obx__ret_result_free(&x->part);
    memset(&x->part, 0, sizeof x->part);
    obx__rows_free(&x->rows);
    x->handled = 0;
    x->hole_found = false;
}

/* Writes the transitions decided for rows[i] (want[i] = target state, NONE = none), each as a
 * compare-and-set with its audit row; rows another transaction changed meanwhile are dropped
 * from the decisions (applied[i] false). */
static obx_err write_transitions(obx__engine *e, step_ctx *x, const obx__state *want,
                                 obx__audit_row *au, bool *applied, size_t *n_applied) {
    size_t n = x->rows.n, m = 0;
    obx__event_update *u = calloc(n ? n : 1, sizeof *u);
    obx__event_row *next = calloc(n ? n : 1, sizeof *next);
    size_t *map = calloc(n ? n : 1, sizeof *map);
    bool *ok = calloc(n ? n : 1, sizeof *ok);
    obx_err err =
        (!u || !next || !map || !ok) ? obx__fail(OBX_ENOMEM, "purge: out of memory") : OBX_OK;
    for (size_t i = 0; !err && i < n; i++) {
        applied[i] = false;
        if (want[i] == OBX__ST_NONE) continue;
        const obx__event_row *cur = &x->rows.v[i];
        if (!obx__transition_allowed(cur->state, want[i], OBX__ACT_PURGER)) {
            err = obx__fail(OBX_EINTERNAL, "purge: %s -> %s is not in the table",
                            obx__state_name(cur->state), obx__state_name(want[i]));
            break;
        }
        next[m] = *cur;
        next[m].payload = NULL;
        next[m].state = want[i];
        next[m].updated_at = x->now;
        u[m] = (obx__event_update){&next[m], cur->state, cur->claim_gen};
        map[m++] = i;
    }
    if (!err) err = obx__st_update_events(e->s, u, m, ok);
    size_t na = 0;
    for (size_t j = 0; !err && j < m; j++)
        if (ok[j]) {
            applied[map[j]] = true;
            if (na != j) au[na] = au[j];
            na++;
        }
    if (!err) err = obx__st_insert_audit(e->s, au, na);
    if (!err) *n_applied = na;
    free(u);
    free(next);
    free(map);
    free(ok);
    return err;
}

/* Whether slot r's delivery set counts as delivered under its completion rule; *why (cap
 * bytes) says why not, or stays empty. */
static obx_err set_delivered(obx__store *s, const obx__event_row *r, char *why, size_t cap) {
    obx__delivery_status ds;
    obx_err e = obx__delivery_status_of(s, r->env.event_id, &ds);
    if (e) return e;
    if (ds.in_set && !ds.complete)
        snprintf(why, cap,
                 "its delivery set (completion %s) is not delivered yet: %d of %d targets "
                 "published",
                 ds.set.completion, (int)ds.published, (int)ds.set.n);
    obx__rows_free(&ds.slots);
    return OBX_OK;
}

/* Phase 0: PUBLISHED -> RETAINED for the next batch after the cursor. */
static obx_err retain_tx(obx__engine *e, void *arg) {
    step_ctx *x = arg;
    const obx__retention_cfg *c = x->c;
    part_reset(x);
    obx__retention_req req = {.state = OBX__ST_PUBLISHED,
                              .after = x->cur->pos,
                              .before = OBX__PUB_POS_MAX,
                              .limit = c->batch,
                              .lock = !c->dry_run};
    obx_err err = obx__st_read_events(
        e->s, &(obx__read_req){.by = OBX__READ_RETENTION, .retention = &req}, &x->rows);
    size_t n = x->rows.n, nc = c->n_consumers ? c->n_consumers : 1;
    if (err || !n) return err;
    unsigned char *ev = calloc(n * nc, 1);
    obx__state *want = calloc(n, sizeof *want);
    obx__audit_row *au = calloc(n, sizeof *au);
    bool *applied = calloc(n, sizeof *applied);
    bool *purge_too = calloc(n, sizeof *purge_too);
    if (!ev || !want || !au || !applied || !purge_too)
        err = obx__fail(OBX_ENOMEM, "purge: out of memory");
    if (!err) err = evidence(c, x->rows.v, n, ev);
    obx__pub_pos replay = replay_end(c, x->now);
    size_t na = 0;
    char who[OBX_TEXT_MAX + 1];
    for (size_t i = 0; !err && i < n; i++) {
        const obx__event_row *r = &x->rows.v[i];
        want[i] = OBX__ST_NONE;
        /* a delivery-set slot is retained only once its set counts as delivered under its
         * rule: under `all` a published target waits for the others (the event is not
         * delivered yet), under `any` one published target is enough */
        char undelivered[OBX_TEXT_MAX + 1] = "";
        if (r->target_no > 0 && (err = set_delivered(e->s, r, undelivered, sizeof undelivered)))
            break;
        if (undelivered[0]) {
            if (!x->res->hole && !x->part.hole) set_hole(&x->part, r, undelivered);
            x->part.refused++;
            err = add_item(c, &x->part, r, r->state, "%s", undelivered);
            continue;
        }
        if (all_evidence(c, ev + i * nc)) {
            want[i] = OBX__ST_RETAINED;
            describe(c, ev + i * nc, false, who, sizeof who);
            obx__audit(&au[na++], x->now, OBX__ACT_PURGER, c->who, r, r->state, OBX__ST_RETAINED,
                       "consumed by every critical consumer: %s", who);
            /* a dry run cannot purge in phase 1 what it did not retain in phase 0: what is
             * behind the watermark found so far and out of the replay window would go */
            obx__pub_pos p = {r->published_at, r->seq};
            purge_too[i] = c->dry_run && !x->res->hole && !x->part.hole && pos_less(p, replay);
            continue;
        }
        describe(c, ev + i * nc, true, who, sizeof who);
        char why[OBX_TEXT_MAX + 1];
        snprintf(why, sizeof why,
                 "not consumed by critical consumer%s %s (no consume receipt, "
                 "not covered by a forced watermark)",
                 strchr(who, ',') ? "s" : "", who);
        if (!x->res->hole && !x->part.hole) set_hole(&x->part, r, why);
        x->part.refused++;
        err = add_item(c, &x->part, r, r->state, "%s", why);
    }
    if (!err && !c->dry_run) {
        size_t n_applied = 0;
        err = write_transitions(e, x, want, au, applied, &n_applied);
    } else if (!err)
        for (size_t i = 0; i < n; i++) applied[i] = want[i] != OBX__ST_NONE;
    for (size_t i = 0; !err && i < n; i++) {
        if (!applied[i]) continue;
        const obx__event_row *r = &x->rows.v[i];
        x->part.retained++;
        if (purge_too[i]) {
            x->part.purged++;
            x->part.bytes_freed += (int64_t)r->payload_len;
            err = add_item(c, &x->part, r, OBX__ST_PURGED,
                           "would be retained and purged: consumed by every critical consumer, "
                           "replay window over, behind the forced consumer watermark");
        } else
            err = add_item(c, &x->part, r, OBX__ST_RETAINED, "%s",
                           c->dry_run ? "would be retained: consumed by every critical consumer"
                                      : "retained: consumed by every critical consumer");
    }
    x->handled = n;
    free(ev);
    free(want);
    free(au);
    free(applied);
    free(purge_too);
    return err;
}

/* Phase 1: RETAINED -> PURGED for the next batch after the cursor, before the limit. */
static obx_err purge_tx(obx__engine *e, void *arg) {
    step_ctx *x = arg;
    const obx__retention_cfg *c = x->c;
    part_reset(x);
    obx__retention_req req = {.state = OBX__ST_RETAINED,
                              .after = x->cur->pos,
                              .before = x->cur->limit,
                              .limit = c->batch,
                              .lock = !c->dry_run};
    obx_err err = obx__st_read_events(
        e->s, &(obx__read_req){.by = OBX__READ_RETENTION, .retention = &req}, &x->rows);
    size_t n = x->rows.n, nc = c->n_consumers ? c->n_consumers : 1;
    if (err || !n) return err;
    unsigned char *ev = calloc(n * nc, 1);
    obx__state *want = calloc(n, sizeof *want);
    obx__audit_row *au = calloc(n, sizeof *au);
    bool *applied = calloc(n, sizeof *applied);
    const char **ids = calloc(n, sizeof *ids);
    if (!ev || !want || !au || !applied || !ids)
        err = obx__fail(OBX_ENOMEM, "purge: out of memory");
    if (!err) err = evidence(c, x->rows.v, n, ev);
    char t_end[32], who[OBX_TEXT_MAX + 1];
    size_t na = 0;
    x->handled = n;
    for (size_t i = 0; !err && i < n; i++) {
        const obx__event_row *r = &x->rows.v[i];
        want[i] = OBX__ST_NONE;
        if (!all_evidence(c, ev + i * nc)) {
            /* lost evidence: this event is now the forced consumer watermark; nothing at or
             * after it may go (invariant 5) */
            describe(c, ev + i * nc, true, who, sizeof who);
            char why[OBX_TEXT_MAX + 1];
            snprintf(why, sizeof why,
                     "RETAINED, but critical consumer%s %s no longer %s a consume receipt for it "
                     "(a restored consumer database?)",
                     strchr(who, ',') ? "s" : "", who, strchr(who, ',') ? "have" : "has");
            if (!x->res->hole ||
                pos_less((obx__pub_pos){r->published_at, r->seq}, x->res->hole_pos))
                set_hole(&x->part, r, why);
            x->hole_found = true;
            x->hole = (obx__pub_pos){r->published_at, r->seq};
            x->part.refused++;
            err = add_item(c, &x->part, r, r->state, "%s", why);
            x->handled = i;
            break;
        }
        want[i] = OBX__ST_PURGED;
        obx__iso_ms(r->published_at + c->replay_window_ms, t_end);
        describe(c, ev + i * nc, false, who, sizeof who);
        obx__audit(&au[na++], x->now, OBX__ACT_PURGER, c->who, r, r->state, OBX__ST_PURGED,
                   "payload dropped (%lld bytes), tombstone kept: replay window ended %s, behind "
                   "the forced consumer watermark, evidence: %s",
                   (long long)r->payload_len, t_end, who);
    }
    if (!err && !c->dry_run) {
        size_t n_applied = 0;
        err = write_transitions(e, x, want, au, applied, &n_applied);
        size_t m = 0;
        for (size_t i = 0; !err && i < n; i++)
            if (applied[i]) ids[m++] = x->rows.v[i].env.event_id;
        int64_t bytes = 0;
        if (!err) err = obx__st_purge_payloads(e->s, ids, m, &bytes);
        if (!err) x->part.bytes_freed += bytes;
    } else if (!err)
        for (size_t i = 0; i < n; i++) {
            applied[i] = want[i] != OBX__ST_NONE;
            if (applied[i]) x->part.bytes_freed += (int64_t)x->rows.v[i].payload_len;
        }
    for (size_t i = 0; !err && i < n; i++) {
        if (!applied[i]) continue;
        const obx__event_row *r = &x->rows.v[i];
        x->part.purged++;
        obx__iso_ms(r->published_at + c->replay_window_ms, t_end);
        err = add_item(c, &x->part, r, OBX__ST_PURGED,
                       "%s: replay window ended %s, behind the forced consumer watermark",
                       c->dry_run ? "would be purged" : "purged", t_end);
    }
    free(ev);
    free(want);
    free(au);
    free(applied);
    free(ids);
    return err;
}

/* Appends a transaction's decisions to the run's result. */
static obx_err merge(const obx__retention_cfg *c, obx__ret_result *res, const obx__ret_result *p) {
    res->retained += p->retained;
    res->purged += p->purged;
    res->refused += p->refused;
    res->bytes_freed += p->bytes_freed;
    res->items_dropped += p->items_dropped;
    if (p->hole && (!res->hole || pos_less(p->hole_pos, res->hole_pos))) {
        res->hole = true;
        obx__strlcpy(res->hole_event, p->hole_event, sizeof res->hole_event);
        res->hole_pos = p->hole_pos;
        obx__strlcpy(res->hole_why, p->hole_why, sizeof res->hole_why);
    }
    for (size_t i = 0; i < p->n_items; i++) {
        if (res->n_items >= c->max_listed) {
            res->items_dropped++;
            continue;
        }
        if (res->n_items == res->cap_items) {
            size_t cap = res->cap_items ? res->cap_items * 2 : 64;
            if (cap > c->max_listed) cap = c->max_listed;
            obx__ret_item *q = realloc(res->items, cap * sizeof *q);
            if (!q) return obx__fail(OBX_ENOMEM, "purge: out of memory");
            res->items = q;
            res->cap_items = cap;
        }
        res->items[res->n_items++] = p->items[i];
    }
    return OBX_OK;
}

static obx_err check_cfg(const obx__retention_cfg *c) {
    if (!c->n_consumers)
        return obx__fail(OBX_ECONFIG,
                         "audit.critical_consumers: none declared: retention needs evidence from "
                         "the consumers that matter (ID=URL of each one's inbox database); an ACK "
                         "alone never purges");
    if (!c->batch || c->replay_window_ms < 0 || !c->who)
        return obx__fail(OBX_EINVAL, "purge: batch must be >= 1 and replay_window_ms >= 0");
    return obx__check_field("who", c->who, 1, OBX__OWNER_MAX, OBX__CS_OWNER);
}

static obx_err purger(obx__store *s, const obx__retention_cfg *c, obx__engine *e) {
    obx__engine_cfg ec;
    obx__engine_cfg_defaults(&ec);
    obx__strlcpy(ec.owner, c->who, sizeof ec.owner);
    ec.batch = c->batch;
    return obx__engine_init(e, s, NULL, &ec);
}

void obx__purge_cursor_init(obx__purge_cursor *cur) {
    cur->phase = 0;
    cur->pos = OBX__PUB_POS_MIN;
    cur->limit = OBX__PUB_POS_MAX;
}

/* Between the phases of a real run: the forced consumer watermark is the oldest event still
 * PUBLISHED (phase 0 left exactly those lacking evidence, plus any another purger held), and
 * what it lacks. A dry run found it in its own scan. */
static obx_err find_watermark(obx__store *s, const obx__retention_cfg *c, obx__ret_result *res) {
    obx__rows rows = {0};
    obx__retention_req req = {.state = OBX__ST_PUBLISHED,
                              .after = OBX__PUB_POS_MIN,
                              .before = OBX__PUB_POS_MAX,
                              .limit = 1};
    obx_err e = obx__st_read_events(
        s, &(obx__read_req){.by = OBX__READ_RETENTION, .retention = &req}, &rows);
    if (e || !rows.n) {
        obx__rows_free(&rows);
        return e;
    }
    const obx__event_row *r = &rows.v[0];
    if (res->hole && !pos_less((obx__pub_pos){r->published_at, r->seq}, res->hole_pos)) {
        obx__rows_free(&rows);
        return OBX_OK; /* the run's own finding is at least as old */
    }
    unsigned char ev[64];
    size_t nc = c->n_consumers;
    unsigned char *evp = nc <= sizeof ev ? ev : calloc(nc, 1);
    if (!evp) e = obx__fail(OBX_ENOMEM, "purge: out of memory");
    if (!e) e = evidence(c, r, 1, evp);
    char undelivered[OBX_TEXT_MAX + 1] = "";
    if (!e && r->target_no > 0) e = set_delivered(s, r, undelivered, sizeof undelivered);
    if (!e) {
        char who[OBX_TEXT_MAX + 1], why[OBX_TEXT_MAX + 1];
        if (undelivered[0])
            obx__strlcpy(why, undelivered, sizeof why);
        else if (all_evidence(c, evp))
            snprintf(why, sizeof why,
                     "consumed by every critical consumer but still PUBLISHED (another purger "
                     "holds it, or it was published during this run)");
        else {
            describe(c, evp, true, who, sizeof who);
            snprintf(why, sizeof why, "not consumed by critical consumer%s %s",
                     strchr(who, ',') ? "s" : "", who);
        }
        set_hole(res, r, why);
    }
    if (evp != ev) free(evp);
    obx__rows_free(&rows);
    return e;
}

obx_err obx__purge_step(obx__store *s, const obx__retention_cfg *c, int64_t now,
                        obx__purge_cursor *cur, obx__ret_result *res) {
    obx_err err = check_cfg(c);
    if (err || cur->phase >= 2) return err;
    obx__engine e;
    if ((err = purger(s, c, &e))) return err;
    step_ctx x = {.c = c, .now = now, .cur = cur, .res = res};
    err = obx__engine_tx(&e, cur->phase == 0 ? retain_tx : purge_tx, &x);
    if (!err) err = merge(c, res, &x.part);
    if (!err) {
        res->batches++;
        if (x.handled) {
            const obx__event_row *last = &x.rows.v[x.handled - 1];
            cur->pos = (obx__pub_pos){last->published_at, last->seq};
        }
        if (cur->phase == 1 && x.hole_found) cur->limit = x.hole;
        bool exhausted = x.rows.n < c->batch || (cur->phase == 1 && x.hole_found);
        if (exhausted && cur->phase == 0) {
            /* phase 0 done: phase 1 runs up to the forced consumer watermark or the end of the
             * replay window, whichever comes first */
            if (!c->dry_run) err = find_watermark(s, c, res);
            obx__pub_pos end = replay_end(c, now);
            if (OBX__MUTANT(PURGE_BEFORE_WATERMARK)) res->hole = false;
            cur->limit = res->hole && pos_less(res->hole_pos, end) ? res->hole_pos : end;
            cur->phase = 1;
            cur->pos = OBX__PUB_POS_MIN;
        } else if (exhausted)
            cur->phase = 2;
    }
    obx__ret_result_free(&x.part);
    obx__rows_free(&x.rows);
    return err;
}

obx_err obx__purge_run(obx__store *s, const obx__retention_cfg *c, int64_t now,
                       obx__ret_result *res) {
    obx__purge_cursor cur;
    obx__purge_cursor_init(&cur);
    obx_err err = OBX_OK;
    while (!err && cur.phase < 2) err = obx__purge_step(s, c, now, &cur, res);
    return err;
}

/* ---- one event ---------------------------------------------------------------------------- */

typedef struct one_ctx {
    const obx__retention_cfg *c;
    int64_t now;
    const char *id;
    obx__ret_result *res;
    obx__ret_result part;
    bool refused, nothing;
    char why[1024];
} one_ctx;

static void add_why(one_ctx *x, const char *fmt, ...) OBX__PRINTF(2, 3);

static void add_why(one_ctx *x, const char *fmt, ...) {
    size_t o = strlen(x->why);
    if (o && o + 2 < sizeof x->why) {
        memcpy(x->why + o, "; ", 3);
        o += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->why + o, sizeof x->why - o, fmt, ap);
    va_end(ap);
    x->refused = true;
}

/* The conditions for purging the loaded event r (PUBLISHED or RETAINED): its own evidence, its
 * delivery set, the replay window and the forced consumer watermark. Reads only; every condition
 * that fails adds its reason to x->why (and sets x->refused). ev receives r's evidence; ev0 is
 * scratch for the older event's. */
static obx_err one_conditions(obx__engine *e, one_ctx *x, const obx__event_row *r,
                              unsigned char *ev, unsigned char *ev0) {
    const obx__retention_cfg *c = x->c;
    obx__rows older = {0};
    char t[32], t2[32], who[OBX_TEXT_MAX + 1];
    /* the event's own evidence */
    obx_err err = evidence(c, r, 1, ev);
    if (!err && !all_evidence(c, ev)) {
        describe(c, ev, true, who, sizeof who);
        bool several = strchr(who, ',') != NULL;
        if (r->state == OBX__ST_RETAINED)
            add_why(x,
                    "critical consumer%s %s no longer ha%s a consume receipt for it (a restored "
                    "consumer database?)",
                    several ? "s" : "", who, several ? "ve" : "s");
        else
            add_why(x,
                    "critical consumer%s %s ha%s not consumed it (no consume receipt, no forced "
                    "watermark covering it)",
                    several ? "s" : "", who, several ? "ve" : "s");
    }
    /* a delivery-set slot: its set must count as delivered under its rule */
    if (!err && r->target_no > 0 && r->state == OBX__ST_PUBLISHED) {
        char undelivered[OBX_TEXT_MAX + 1] = "";
        err = set_delivered(e->s, r, undelivered, sizeof undelivered);
        if (!err && undelivered[0]) add_why(x, "%s", undelivered);
    }
    /* the replay window */
    if (!err && r->published_at + c->replay_window_ms > x->now) {
        obx__iso_ms(r->published_at + c->replay_window_ms, t);
        obx__iso_ms(r->published_at, t2);
        add_why(x, "the replay window ends at %s (published %s + retention.replay_window_ms %lld)",
                t, t2, (long long)c->replay_window_ms);
    }
    /* the forced consumer watermark: the oldest PUBLISHED event before this one */
    if (!err && !OBX__MUTANT(PURGE_BEFORE_WATERMARK)) {
        obx__retention_req req = {.state = OBX__ST_PUBLISHED,
                                  .after = OBX__PUB_POS_MIN,
                                  .before = {r->published_at, r->seq},
                                  .limit = 1};
        err = obx__st_read_events(
            e->s, &(obx__read_req){.by = OBX__READ_RETENTION, .retention = &req}, &older);
        if (!err && older.n) err = evidence(c, &older.v[0], 1, ev0);
        if (!err && older.n) {
            obx__iso_ms(older.v[0].published_at, t);
            if (all_evidence(c, ev0))
                add_why(x,
                        "the forced consumer watermark is at older event %s (published %s), "
                        "consumed by every critical consumer but not yet RETAINED: run a purge "
                        "without an event ID first",
                        older.v[0].env.event_id, t);
            else {
                describe(c, ev0, true, who, sizeof who);
                add_why(x,
                        "the forced consumer watermark is at older event %s (published %s): not "
                        "consumed by critical consumer%s %s",
                        older.v[0].env.event_id, t, strchr(who, ',') ? "s" : "", who);
            }
        }
    }
    obx__rows_free(&older);
    return err;
}

/* Every condition holds for the loaded event r (evidence in ev): retains it (if PUBLISHED) and
 * purges it in the caller's transaction, compare-and-set on (state, claim_gen), with one audit
 * row per transition; a dry run only counts. Adds r's item to x->part. */
static obx_err one_purge(obx__engine *e, one_ctx *x, const obx__event_row *r,
                         const unsigned char *ev) {
    const obx__retention_cfg *c = x->c;
    obx_err err = OBX_OK;
    char t[32], who[OBX_TEXT_MAX + 1];
    describe(c, ev, false, who, sizeof who);
    obx__iso_ms(r->published_at + c->replay_window_ms, t);
    obx__state from = r->state;
    if (!c->dry_run) {
        obx__audit_row au[2];
        size_t na = 0;
        obx__event_row next = *r;
        next.payload = NULL;
        next.updated_at = x->now;
        bool ok = false;
        if (from == OBX__ST_PUBLISHED) {
            next.state = OBX__ST_RETAINED;
            obx__audit(&au[na++], x->now, OBX__ACT_PURGER, c->who, r, from, OBX__ST_RETAINED,
                       "consumed by every critical consumer: %s", who);
            obx__event_update u = {&next, from, r->claim_gen};
            err = obx__st_update_events(e->s, &u, 1, &ok);
            if (!err && !ok) err = obx__fail(OBX_ECONFLICT, "event %s changed concurrently", x->id);
            from = OBX__ST_RETAINED;
        }
        obx__event_row cur = next;
        next.state = OBX__ST_PURGED;
        if (!err) {
            obx__audit(&au[na++], x->now, OBX__ACT_PURGER, c->who, r, from, OBX__ST_PURGED,
                       "payload dropped (%lld bytes), tombstone kept: replay window ended %s, "
                       "behind the forced consumer watermark, evidence: %s (operator purge of one "
                       "event)",
                       (long long)r->payload_len, t, who);
            obx__event_update u = {&next, cur.state, cur.claim_gen};
            err = obx__st_update_events(e->s, &u, 1, &ok);
            if (!err && !ok) err = obx__fail(OBX_ECONFLICT, "event %s changed concurrently", x->id);
        }
        int64_t bytes = 0;
        if (!err) err = obx__st_insert_audit(e->s, au, na);
        if (!err) err = obx__st_purge_payloads(e->s, &x->id, 1, &bytes);
        if (!err) x->part.bytes_freed = bytes;
    } else
        x->part.bytes_freed = (int64_t)r->payload_len;
    if (!err) {
        if (r->state == OBX__ST_PUBLISHED) x->part.retained++;
        x->part.purged++;
        err = add_item(c, &x->part, r, OBX__ST_PURGED,
                       "%s: consumed by every critical consumer, replay window ended %s, behind "
                       "the forced consumer watermark",
                       c->dry_run ? "would be purged" : "purged", t);
    }
    return err;
}

/* One event, in one transaction: load (locked), then refuse with every reason, or purge. */
static obx_err one_tx(obx__engine *e, void *arg) {
    one_ctx *x = arg;
    const obx__retention_cfg *c = x->c;
    obx__ret_result_free(&x->part);
    memset(&x->part, 0, sizeof x->part);
    x->refused = x->nothing = false;
    x->why[0] = '\0';
    obx__rows rows = {0};
    obx_err err = obx__st_load_events(e->s, &x->id, 1, c->dry_run ? 0 : OBX__LOAD_LOCK, &rows);
    if (!err && !rows.n) err = obx__fail(OBX_ENOTFOUND, "event %s: not in this outbox", x->id);
    if (err) {
        obx__rows_free(&rows);
        return err;
    }
    obx__event_row *r = &rows.v[0];
    size_t nc = c->n_consumers;
    unsigned char *ev = calloc(nc, 1), *ev0 = calloc(nc, 1);
    if (!ev || !ev0) err = obx__fail(OBX_ENOMEM, "purge: out of memory");
    if (!err && r->state == OBX__ST_PURGED) {
        char t[32];
        x->nothing = true;
        obx__iso_ms(r->updated_at, t);
        err = add_item(c, &x->part, r, r->state, "already PURGED (%s)", t);
    } else if (!err) {
        if (r->state != OBX__ST_PUBLISHED && r->state != OBX__ST_RETAINED)
            add_why(x,
                    "it is %s: only a PUBLISHED or RETAINED event (one with an accepted publish "
                    "receipt) can be purged",
                    obx__state_name(r->state));
        else
            err = one_conditions(e, x, r, ev, ev0);
        if (!err && x->refused) {
            x->part.refused++;
            err = add_item(c, &x->part, r, r->state, "%s", x->why);
        } else if (!err)
            err = one_purge(e, x, r, ev);
    }
    free(ev);
    free(ev0);
    obx__rows_free(&rows);
    return err;
}

obx_err obx__purge_event(obx__store *s, const obx__retention_cfg *c, int64_t now,
                         const char *event_id, obx__ret_result *res) {
    obx_err err = check_cfg(c);
    if (!err) err = obx_event_id_check(event_id);
    if (err) return err;
    obx__engine e;
    if ((err = purger(s, c, &e))) return err;
    one_ctx x = {.c = c, .now = now, .id = event_id, .res = res};
    err = obx__engine_tx(&e, one_tx, &x);
    if (!err) err = merge(c, res, &x.part);
    if (!err) res->batches++;
    obx__ret_result_free(&x.part);
    if (!err && x.refused)
        return obx__fail(OBX_EREFUSED, "event %s cannot be purged%s: %s", event_id,
                         c->dry_run ? " (dry run)" : "", x.why);
    return err;
}

/* ---- JSON ----------------------------------------------------------------------------------- */

json_t *obx__ret_result_json(const obx__retention_cfg *c, const obx__ret_result *r, int64_t now) {
    json_t *cons = json_array(), *items = json_array();
    for (size_t k = 0; cons && k < c->n_consumers; k++)
        json_array_append_new(cons,
                              json_pack("{s:s,s:I,s:I}", "id", c->consumers[k].id,
                                        "forced_watermark_ms", (json_int_t)c->consumers[k].forced,
                                        "forced_at_ms", (json_int_t)c->consumers[k].forced_at));
    for (size_t i = 0; items && i < r->n_items; i++) {
        const obx__ret_item *it = &r->items[i];
        const char *action = it->to == it->from         ? "refuse"
                             : it->to == OBX__ST_PURGED ? "purge"
                                                        : "retain";
        json_array_append_new(items,
                              json_pack("{s:s,s:s,s:s,s:s,s:I,s:s}", "event_id", it->event_id,
                                        "action", action, "from", obx__state_name(it->from), "to",
                                        obx__state_name(it->to), "published_at_ms",
                                        (json_int_t)it->published_at, "reason", it->reason));
    }
    json_t *wm = r->hole ? json_pack("{s:s,s:I,s:I,s:s}", "event_id", r->hole_event,
                                     "published_at_ms", (json_int_t)r->hole_pos.at, "seq",
                                     (json_int_t)r->hole_pos.seq, "why", r->hole_why)
                         : json_null();
    return json_pack("{s:s,s:I,s:b,s:I,s:I,s:o,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:I}", "schema",
                     "obx.purge.v1", "at_ms", (json_int_t)now, "dry_run", (int)c->dry_run,
                     "replay_window_ms", (json_int_t)c->replay_window_ms, "batch",
                     (json_int_t)c->batch, "critical_consumers", cons, "retained",
                     (json_int_t)r->retained, "purged", (json_int_t)r->purged, "refused",
                     (json_int_t)r->refused, "bytes_freed", (json_int_t)r->bytes_freed, "batches",
                     (json_int_t)r->batches, "forced_consumer_watermark", wm, "events", items,
                     "events_not_listed", (json_int_t)r->items_dropped);
}
