/*
 * reconcile.c — the reconciler (docs/design.md, "Reconciliation and UNKNOWN outcomes"). An
 * UNKNOWN outcome is never guessed, and every one ends:
 *
 *   DISPATCH_UNKNOWN --reconcile_begin--> RECONCILING (own claim_gen + lease)
 *   RECONCILING --lookup(destination, pinned partition, event_id, since)-->
 *       FOUND(receipt)              -> the acceptance point (source "lookup") -> PUBLISHED
 *       NOT_FOUND (authoritative,   -> RETRY_CLAIMED, older attempts NOT_FOUND,
 *         past the quiet time)         a new attempt (attempt_gen + 1) to the same frozen
 *                                      destination and partition -> SENDING
 *       CANNOT_TELL, before the     -> DISPATCH_UNKNOWN, next check when the quiet time ends
 *         attempts' quiet time         (a late ACK or a FOUND may still settle it)
 *       CANNOT_TELL, after it:
 *         a critical consumer's     -> the acceptance point (source "consumer") -> PUBLISHED,
 *           inbox holds it             no resend
 *         route policy "retry"      -> RETRY_CLAIMED (older attempts stay UNKNOWN: their late
 *           (the default)              ACKs are still accepted) -> SENDING
 *         route policy "hold", or   -> DISPATCH_UNKNOWN, HELD (held_at): counted, aged, listed
 *           the broker holds a copy    and alerted until a lookup proves it, a consumer's
 *           obx cannot accept          evidence arrives or an operator resolves it
 *                                      (obx__resolve); checks go on with back-off
 *
 * A reconciler is fenced like a dispatcher: its decision is applied only if the event is still
 * RECONCILING under its claim_gen and unexpired lease. A retry never uses anything but the
 * frozen destination digest; the partition is the pinned one.
 */
#include "engine/engine_int.h"

#include <stdio.h>
#include <string.h>

typedef struct rbegin_ctx {
    int64_t now;
    obx__rows rows; /* with payload: a retry needs it */
} rbegin_ctx;

static obx_err rbegin_tx(obx__engine *e, void *arg) {
    rbegin_ctx *c = arg;
    obx__rows_free(&c->rows);
    obx__select_req q = {.kind = OBX__SEL_RECONCILE,
                         .now = c->now,
                         .limit = e->cfg.batch,
                         .lock = true,
                         .payload = true,
                         .cluster = e->cfg.own_cluster && e->b ? e->cluster : NULL};
    obx_err err =
        obx__st_read_events(e->s, &(obx__read_req){.by = OBX__READ_SELECT, .select = &q}, &c->rows);
    if (err || !c->rows.n) return err;
    obx__batch b;
    if ((err = obx__batch_reserve(&b, c->rows.n, 0, 0, c->rows.n))) return err;
    for (size_t i = 0; i < c->rows.n; i++) {
        obx__event_row *cur = &c->rows.v[i];
        obx__event_row next = *cur;
        next.state =
            cur->state == OBX__ST_RETRY_CLAIMED ? OBX__ST_RETRY_CLAIMED : OBX__ST_RECONCILING;
        next.claim_gen = cur->claim_gen + 1;
        obx__strlcpy(next.owner, e->cfg.owner, sizeof next.owner);
        next.lease_until = c->now + e->cfg.reconcile_lease_ms;
        next.updated_at = c->now;
        if (!obx__transition_allowed(cur->state, next.state, OBX__ACT_RECONCILER)) {
            err = obx__fail(OBX_EINTERNAL, "reconcile: %s -> %s not allowed",
                            obx__state_name(cur->state), obx__state_name(next.state));
            break;
        }
        obx__batch_update(&b, cur, &next);
        obx__audit(&b.au[b.n_au++], c->now, OBX__ACT_RECONCILER, e->cfg.owner, &next, cur->state,
                   next.state, "%s",
                   cur->state == OBX__ST_DISPATCH_UNKNOWN ? "reconciling"
                                                          : "taken over: previous lease expired");
    }
    if (!err) err = obx__batch_write(e->s, &b);
    if (!err)
        for (size_t i = 0; i < c->rows.n; i++) {
            unsigned char *p = c->rows.v[i].payload;
            size_t len = c->rows.v[i].payload_len;
            c->rows.v[i] = b.upd_rows[i];
            c->rows.v[i].payload = p;
            c->rows.v[i].payload_len = len;
        }
    obx__batch_free(&b);
    return err;
}

typedef enum {
    DECIDE_RETRY_PROVEN, /* authoritative NOT_FOUND */
    DECIDE_RETRY_BLIND,  /* cannot tell past the quiet time; the route's policy is retry */
    DECIDE_WAIT,         /* cannot tell yet: the quiet time has not passed */
    DECIDE_HOLD,         /* cannot tell past the quiet time; hold for an operator */
    DECIDE_REJECTED      /* the current attempt was rejected while we held the event */
} decision;

typedef struct rapply_ctx {
    int64_t now;
    obx__event_row *row; /* as claimed by us; updated on success */
    decision d;
    const char *why;
    int64_t authoritative_at; /* next check when only the quiet time stood in the way */
    int64_t quiet_until;      /* the outstanding attempts' quiet time end */
    const char *hold_why;     /* DECIDE_HOLD for another reason than the route's policy */
    bool applied;
    bool held; /* this decision held the event (it was not held before) */
    int64_t resolved_ms;
} rapply_ctx;

/* A definite rejection of ev's current attempt that landed while this reconciler held the event
 * (RECONCILING) was not counted then (dispatch.c counts it for SENDING and DISPATCH_UNKNOWN
 * only): when nothing of the generation is outstanding, it counts now, as it would have:
 * PENDING after the backoff, or PARKED at the route's max attempts. Returns whether it applied
 * (next and c->d set). */
static bool late_rejection(obx__engine *e, rapply_ctx *c, const obx__event_row *ev,
                           obx__event_row *next, const obx__attempt_row *att, size_t n) {
    bool rejected = false;
    for (size_t i = 0; i < n; i++) {
        if (att[i].envelope_gen != ev->envelope_gen) continue;
        if (att[i].state == OBX__AT_UNKNOWN || att[i].state == OBX__AT_SENDING) return false;
        if (!strcmp(att[i].attempt_id, ev->attempt_id)) rejected = att[i].state == OBX__AT_REJECTED;
    }
    if (!rejected) return false;
    next->rejections = ev->rejections + 1;
    next->state = next->rejections >= ev->max_attempts ? OBX__ST_PARKED : OBX__ST_PENDING;
    next->available_at = c->now + obx__engine_backoff(e, next->rejections);
    next->held_at = 0;
    next->owner[0] = '\0';
    next->lease_until = 0;
    c->d = DECIDE_REJECTED;
    return true;
}

static obx_err rapply_tx(obx__engine *e, void *arg) {
    rapply_ctx *c = arg;
    const char *id = c->row->env.event_id;
    obx__rows cur = {0};
    obx__attempt_row *att = NULL;
    size_t n_att = 0;
    c->applied = false;
    c->resolved_ms = -1;
    obx_err err = obx__st_load_events(e->s, &id, 1, OBX__LOAD_LOCK, &cur);
    if (!err && cur.n != 1) err = obx__fail(OBX_ENOTFOUND, "reconcile: event %s vanished", id);
    if (!err) err = obx__st_load_attempts(e->s, NULL, 0, id, &att, &n_att);
    obx__batch b;
    if (!err) err = obx__batch_reserve(&b, 1, n_att, 0, 1);
    if (err) {
        obx__rows_free(&cur);
        free(att);
        return err;
    }
    obx__event_row *ev = &cur.v[0];
    bool mine = ev->claim_gen == c->row->claim_gen && !strcmp(ev->owner, e->cfg.owner) &&
                ev->lease_until > c->now &&
                (ev->state == OBX__ST_RECONCILING || ev->state == OBX__ST_RETRY_CLAIMED);
    if (!mine) {
        /* fenced: report what we saw, change nothing */
        obx__audit(&b.au[b.n_au++], c->now, OBX__ACT_RECONCILER, e->cfg.owner, ev, ev->state,
                   ev->state, "stale reconciler (claim_gen %lld) saw: %s; nothing changed",
                   (long long)c->row->claim_gen, c->why);
        e->st.stale_refused++;
    } else if (ev->state == OBX__ST_RETRY_CLAIMED) {
        /* taken over after a crash between the decision and the send: keep the decision */
        c->applied = true;
    } else {
        obx__event_row next = *ev;
        if (c->d == DECIDE_RETRY_PROVEN && late_rejection(e, c, ev, &next, att, n_att)) {
            /* counted: PENDING after its backoff, or PARKED */
        } else if (c->d == DECIDE_WAIT || c->d == DECIDE_HOLD) {
            int64_t since = ev->unknown_since ? c->now - ev->unknown_since : 0;
            int64_t wait = since / 2;
            if (wait < e->cfg.recheck_ms) wait = e->cfg.recheck_ms;
            if (wait > e->cfg.recheck_max_ms) wait = e->cfg.recheck_max_ms;
            next.state = OBX__ST_DISPATCH_UNKNOWN;
            next.next_check_at = c->now + wait;
            /* absence becomes provable, or the route's policy applies, then */
            if (c->authoritative_at > c->now && c->authoritative_at < next.next_check_at)
                next.next_check_at = c->authoritative_at;
            if (c->d == DECIDE_WAIT && c->quiet_until > c->now &&
                c->quiet_until < next.next_check_at)
                next.next_check_at = c->quiet_until;
            if (c->d == DECIDE_HOLD && !next.held_at) {
                next.held_at = c->now;
                c->held = true;
            }
            next.owner[0] = '\0';
            next.lease_until = 0;
        } else {
            next.state = OBX__ST_RETRY_CLAIMED;
            next.held_at = 0;
            next.lease_until = c->now + e->cfg.reconcile_lease_ms;
            if (c->d == DECIDE_RETRY_PROVEN) {
                /* every UNKNOWN attempt of this generation is proven absent */
                for (size_t i = 0; i < n_att; i++)
                    if (att[i].envelope_gen == ev->envelope_gen &&
                        (att[i].state == OBX__AT_UNKNOWN || att[i].state == OBX__AT_SENDING)) {
                        att[i].state = OBX__AT_NOT_FOUND;
                        att[i].ended_at = c->now;
                        snprintf(att[i].detail, sizeof att[i].detail, "NOT_FOUND: %s", c->why);
                        b.att[b.n_att++] = att[i];
                    }
                if (ev->unknown_since) c->resolved_ms = c->now - ev->unknown_since;
                next.unknown_since = 0;
            }
        }
        next.updated_at = c->now;
        if (!obx__transition_allowed(ev->state, next.state, OBX__ACT_RECONCILER))
            err = obx__fail(OBX_EINTERNAL, "reconcile: %s -> %s not allowed",
                            obx__state_name(ev->state), obx__state_name(next.state));
        if (!err) {
            obx__batch_update(&b, ev, &next);
            obx__audit(&b.au[b.n_au++], c->now, OBX__ACT_RECONCILER, e->cfg.owner, &next, ev->state,
                       next.state, "%s: %s",
                       c->d == DECIDE_REJECTED
                           ? "the current attempt was definitely rejected while reconciling: "
                             "the rejection counts (backoff, or parked at the route's max)"
                       : c->d == DECIDE_RETRY_PROVEN ? "proven absent, retry to the frozen target"
                       : c->d == DECIDE_RETRY_BLIND
                           ? "cannot tell past the quiet time; the route's UNKNOWN policy is "
                             "retry: same-target retry"
                       : c->d == DECIDE_WAIT ? "cannot tell before the quiet time ends; next "
                                               "check scheduled"
                       : c->hold_why         ? c->hold_why
                                             : "cannot tell past the quiet time; the route's "
                                               "UNKNOWN policy is hold: held for an operator",
                       c->why);
            unsigned char *p = c->row->payload;
            size_t len = c->row->payload_len;
            *c->row = next;
            c->row->payload = p;
            c->row->payload_len = len;
            c->applied = true;
        }
    }
    if (!err) err = obx__batch_write(e->s, &b);
    obx__batch_free(&b);
    obx__rows_free(&cur);
    free(att);
    return err;
}

obx_err obx__reconcile_begin(obx__engine *e, int64_t now, obx__rows *held) {
    rbegin_ctx c = {.now = now};
    obx_err err = obx__engine_tx(e, rbegin_tx, &c);
    if (err) {
        obx__rows_free(&c.rows);
        return err;
    }
    *held = c.rows;
    return OBX_OK;
}

obx_err obx__reconcile_lookup(obx__engine *e, int64_t now, const obx__event_row *row,
                              obx__lookup_res *res) {
    obx_err err;
    memset(res, 0, sizeof *res);
    obx__attempt_row *att = NULL;
    size_t n_att = 0;
    if ((err = obx__st_load_attempts(e->s, NULL, 0, row->env.event_id, &att, &n_att))) return err;
    int64_t since = 0, quiet_until = 0;
    int unknown = 0;
    for (size_t i = 0; i < n_att; i++) {
        if (att[i].envelope_gen != row->envelope_gen) continue;
        if (att[i].state != OBX__AT_UNKNOWN && att[i].state != OBX__AT_SENDING) continue;
        unknown++;
        if (!since || att[i].started_at < since) since = att[i].started_at;
        if (att[i].quiet_until > quiet_until) quiet_until = att[i].quiet_until;
    }
    free(att);
    res->quiet_until = quiet_until;
    if (!unknown) {
        /* nothing outstanding in this generation (all proven absent or rejected) */
        res->kind = OBX__LOOKUP_NOT_FOUND;
        snprintf(res->reason, sizeof res->reason, "no outstanding attempt of generation %d",
                 (int)row->envelope_gen);
    } else if (row->pinned_partition < 0) {
        /* no partition was ever chosen for this generation, so none of its attempts was handed
         * to the broker (dispatch.c registers and ends such an attempt without sending it) */
        res->kind = OBX__LOOKUP_NOT_FOUND;
        snprintf(res->reason, sizeof res->reason, "never sent: no partition was chosen");
    } else if (!e->b) {
        res->kind = OBX__LOOKUP_CANNOT_TELL;
        snprintf(res->reason, sizeof res->reason, "no broker connection");
    } else {
        obx__lookup_req q = {.dest = &row->dest,
                             .dest_digest = row->dest_digest,
                             .payload_digest = row->env.payload_digest,
                             .partition = row->pinned_partition,
                             .event_id = obx__wire_id(row), /* as sent */
                             .envelope_gen = row->envelope_gen,
                             .since = since,
                             .quiet_until = quiet_until,
                             .now = now};
        err = obx__lookup_keys(e, row->dest.route_gen, &q);
        if (!err) err = obx__br_lookup(e->b, &q, res);
        res->quiet_until = quiet_until; /* the backend's answer does not carry it */
        if (!err && OBX__MUTANT(LOOKUP_TRUSTS_HEADER) && res->kind != OBX__LOOKUP_FOUND &&
            res->n_bad) { /* test-only bug: the copy's header is taken for its bytes */
            res->found = res->bad;
            obx__strlcpy(res->found.payload_digest, q.payload_digest,
                         sizeof res->found.payload_digest);
            res->kind = OBX__LOOKUP_FOUND;
            res->n_bad = 0;
        }
        if (err) {
            e->st.broker_errors++;
            res->kind = OBX__LOOKUP_CANNOT_TELL;
            snprintf(res->reason, sizeof res->reason, "lookup failed: %s", obx_errmsg());
        }
    }
    return OBX_OK;
}

/* Test-only bug (mutant RECONCILE_GUESS): guess that the broker has it (a receipt made from the
 * frozen destination) instead of proving it. */
static obx_err guess_found(obx__engine *e, int64_t now, const obx__event_row *row) {
    obx__outcome g;
    memset(&g, 0, sizeof g);
    g.kind = OBX__OUT_ACK;
    obx__strlcpy(g.event_id, obx__wire_id(row), sizeof g.event_id);
    g.envelope_gen = row->envelope_gen;
    obx__strlcpy(g.attempt_id, row->attempt_id, sizeof g.attempt_id);
    obx__strlcpy(g.payload_digest, row->env.payload_digest, sizeof g.payload_digest);
    obx__strlcpy(g.dest_digest, row->dest_digest, sizeof g.dest_digest);
    obx__strlcpy(g.cluster, row->dest.cluster, sizeof g.cluster);
    obx__strlcpy(g.topic, row->dest.topic, sizeof g.topic);
    g.partition = row->pinned_partition;
    g.offset = -1;
    obx__receipt_kind k;
    return obx__accept_receipts_from(e, now, &g, 1, &k, OBX__RS_LOOKUP, "guessed");
}

obx_err obx__reconcile_apply(obx__engine *e, int64_t now, obx__event_row *row,
                             obx__lookup_res *res_in) {
    obx_err err;
    obx__lookup_res res = *res_in;
    if (row->state == OBX__ST_RETRY_CLAIMED) return OBX_OK; /* decision taken before a crash */
    bool found_bad = false;
    if (res.kind == OBX__LOOKUP_FOUND && res.routed_only) {
        /* a best-effort copy proves that the broker routed the message, not that every queue
         * bound to it stored it: recorded with the decision, and the route's policy decides */
        e->st.reconciled_found++;
        char why[OBX_TEXT_MAX + 1];
        snprintf(why, sizeof why,
                 "a copy was found at %s/%d@%lld (attempt %.40s), which proves the broker routed "
                 "it, not that every bound queue stored it",
                 res.found.topic, (int)res.found.partition, (long long)res.found.offset,
                 res.found.attempt_id);
        obx__strlcpy(res.reason, why, sizeof res.reason);
        res.kind = OBX__LOOKUP_CANNOT_TELL;
    }
    if (res.n_bad) {
        /* a copy under this ID whose bytes are not the event's message: quarantined with an
         * alarm (it never fills the slot); without the genuine copy, the event is held */
        obx__receipt_kind k = OBX__RK_QUARANTINED;
        if ((err = obx__accept_receipts_from(e, now, &res.bad, 1, &k, OBX__RS_LOOKUP,
                                             res.bad.reason)))
            return err;
        e->st.corrupt_copies += res.n_bad;
        if (res_in->kind != OBX__LOOKUP_FOUND) {
            res.kind = OBX__LOOKUP_CANNOT_TELL;
            obx__strlcpy(res.reason, res.bad.reason, sizeof res.reason);
            found_bad = true;
        }
    }
    if (res.kind == OBX__LOOKUP_FOUND) {
        e->st.reconciled_found++;
        obx__receipt_kind k = OBX__RK_QUARANTINED;
        if ((err = obx__accept_receipts_from(e, now, &res.found, 1, &k, OBX__RS_LOOKUP, NULL)))
            return err;
        if (k == OBX__RK_PRIMARY || k == OBX__RK_DUPLICATE) return OBX_OK;
        /* the broker holds something we cannot accept: do not retry blindly over it */
        res.kind = OBX__LOOKUP_CANNOT_TELL;
        snprintf(res.reason, sizeof res.reason, "found a message that was quarantined");
        found_bad = true;
    }
    /* Past the quiet time, before a blind retry or a hold: a critical consumer that received
     * the message proves the broker accepted it (no resend). A consumer whose database cannot
     * answer now testifies to nothing; the policy goes on without it. */
    char evidence_why[OBX_TEXT_MAX + 1] = "";
    if (res.kind == OBX__LOOKUP_CANNOT_TELL && now >= res.quiet_until && !found_bad &&
        e->cfg.n_evidence) {
        obx__outcome ev;
        bool found = false;
        char who[OBX_NAME_MAX + 1] = "";
        obx_err ce = obx__consumer_evidence(e->cfg.evidence, e->cfg.n_evidence, row, &ev, &found,
                                            who, sizeof who);
        if (found) {
            char note[OBX_TEXT_MAX + 1];
            snprintf(note, sizeof note, "evidence of critical consumer %s (the lookup: %s)", who,
                     res.reason);
            obx__receipt_kind k = OBX__RK_QUARANTINED;
            if ((err = obx__accept_receipts_from(e, now, &ev, 1, &k, OBX__RS_CONSUMER, note)))
                return err;
            e->st.reconciled_evidence++;
            if (k == OBX__RK_PRIMARY || k == OBX__RK_DUPLICATE) return OBX_OK;
            found_bad = true; /* a consumer saw another message under this ID: alarm, hold */
        } else if (ce)
            snprintf(evidence_why, sizeof evidence_why, "%s; %s", res.reason, obx_errmsg());
    }
    if (evidence_why[0]) obx__strlcpy(res.reason, evidence_why, sizeof res.reason);
    if (OBX__MUTANT(RECONCILE_GUESS) && res.kind == OBX__LOOKUP_CANNOT_TELL && !found_bad)
        return guess_found(e, now, row);
    rapply_ctx c = {.now = now,
                    .row = row,
                    .why = res.reason,
                    .authoritative_at = res.authoritative_at,
                    .quiet_until = res.quiet_until};
    if (res.kind == OBX__LOOKUP_NOT_FOUND) {
        e->st.reconciled_not_found++;
        c.d = DECIDE_RETRY_PROVEN;
    } else {
        e->st.reconciled_cannot_tell++;
        if (now < res.quiet_until || OBX__MUTANT(STAY_UNKNOWN))
            c.d = DECIDE_WAIT; /* a late write of an outstanding attempt may still appear */
        else if (found_bad) {
            c.d = DECIDE_HOLD;
            c.hold_why = "held for an operator: the broker holds a copy under this event ID that "
                         "obx cannot accept (quarantined); a retry would put a second, different "
                         "message beside it";
        } else
            c.d = row->blind_retry ? DECIDE_RETRY_BLIND : DECIDE_HOLD;
    }
    if ((err = obx__engine_tx(e, rapply_tx, &c))) return err;
    if (c.held) {
        e->st.held++;
        if (e->on_note) {
            char detail[OBX_TEXT_MAX + 1];
            snprintf(detail, sizeof detail, "%s: %s",
                     c.hold_why ? c.hold_why : "held for an operator (UNKNOWN policy hold)",
                     res.reason);
            obx__note n = obx__note_of(OBX__NOTE_HELD, row, detail);
            e->on_note(e->on_note_user, &n);
        }
    }
    if (c.resolved_ms >= 0) {
        e->st.unknown_resolved++;
        if (c.resolved_ms > e->st.unknown_resolve_ms_max)
            e->st.unknown_resolve_ms_max = c.resolved_ms;
        if (e->on_unknown_resolved)
            e->on_unknown_resolved(e->on_unknown_resolved_user, row->env.event_id, c.resolved_ms);
    }
    return OBX_OK;
}

/* Handles one event we hold as RECONCILING or RETRY_CLAIMED: lookup, decision, retry send. */
static obx_err reconcile_one(obx__engine *e, int64_t now, obx__event_row *row) {
    obx__lookup_res res;
    obx_err err = OBX_OK;
    if (row->state != OBX__ST_RETRY_CLAIMED) {
        if ((err = obx__reconcile_lookup(e, now, row, &res))) return err;
        if ((err = obx__reconcile_apply(e, now, row, &res))) return err;
    }
    if (row->state == OBX__ST_RETRY_CLAIMED) {
        size_t sent = 0;
        e->st.retries++;
        err = obx__engine_begin_attempts(e, now, row, 1, OBX__ACT_RECONCILER, &sent);
        if (!err && sent && e->on_note) {
            char detail[OBX_TEXT_MAX + 1];
            snprintf(detail, sizeof detail, "retry %d to the frozen destination %s/%s partition %d",
                     (int)row->attempt_gen, row->dest.cluster, row->dest.topic,
                     (int)row->pinned_partition);
            obx__note n = obx__note_of(OBX__NOTE_RETRY, row, detail);
            e->on_note(e->on_note_user, &n);
        }
    }
    return err;
}

obx_err obx__reconcile_step(obx__engine *e, int64_t now, size_t *handled) {
    obx__rows held = {0};
    *handled = 0;
    obx_err err = obx__reconcile_begin(e, now, &held);
    obx_err first = OBX_OK;
    for (size_t i = 0; !err && i < held.n; i++) {
        obx_err one = reconcile_one(e, now, &held.v[i]);
        /* one event's failure must not stall the others: its lease will expire and it will be
         * taken over; report the first error after trying the rest */
        if (one && !first) first = one;
        if (!one) (*handled)++;
    }
    if (!err) err = first;
    obx__rows_free(&held);
    return err;
}
