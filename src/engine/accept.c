/*
 * accept.c — accept_dispatch_receipt, the single acceptance point (docs/design.md, "The single
 * acceptance point"). This is the only code in obx that sets PUBLISHED. One transaction per batch
 * of receipts:
 *
 *   1. lock the event rows;
 *   2. match event_id, envelope_gen, payload_digest, dest_digest;
 *   3. match a registered attempt of this event (not necessarily the current claim's: a late
 *      true ACK from an expired claim counts) that the broker has not contradicted;
 *   4. verify the receipt against the frozen destination (cluster, topic, pinned partition);
 *   5. empty publish slot: fill it (attempt ACCEPTED, PRIMARY receipt, state PUBLISHED);
 *      full slot: record a DUPLICATE transport receipt, state unchanged;
 *   6. a receipt whose payload or destination digest differs, or that names an unknown event,
 *      an unregistered attempt, a superseded envelope generation or another place, is
 *      QUARANTINED at once with an alarm and changes nothing else.
 *
 * Every valid ACK therefore ends as the primary receipt or as a duplicate transport receipt.
 * A rolled-back acceptance leaves the attempt SENDING/UNKNOWN, to be reconciled.
 *
 * Delivery sets (docs/migration.md): every target is its own publish slot (an event row with
 * its own key) but is sent under the logical event ID. A receipt is matched to the slot whose
 * registered attempt it names, and rule 2's event_id is that slot's logical ID; the six rules
 * then apply to that slot alone, and its receipts are kept under the slot's key.
 */
#include "engine/engine_int.h"

#include <stdio.h>
#include <string.h>

typedef struct accept_ctx {
    int64_t now;
    obx__receipt_source source; /* what proved these receipts */
    const char *note;           /* appended to the audit rows (an operator's reason); may be NULL */
    const obx__outcome *acks;
    size_t n;
    obx__receipt_kind *kinds;
    /* filled per run (the transaction may be retried) */
    obx__rows ev;
    obx__attempt_row *att;
    size_t n_att;
    obx__id_index att_ix, ev_ix; /* over att and ev, rebuilt with them */
    int64_t *resolved_ms; /* per ack: UNKNOWN episode length when it filled the slot, else -1 */
    char (*alarm)[OBX_TEXT_MAX + 1];
} accept_ctx;

static obx__attempt_row *find_att(accept_ctx *c, const char *id) {
    long i = obx__id_index_find(&c->att_ix, id);
    return i < 0 ? NULL : &c->att[i];
}

static obx__event_row *find_ev(accept_ctx *c, const char *event_id) {
    long i = obx__id_index_find(&c->ev_ix, event_id);
    return i < 0 ? NULL : &c->ev.v[i];
}

static void receipt_from(obx__receipt_row *r, const obx__outcome *o, obx__receipt_kind k,
                         int64_t now, obx__receipt_source source) {
    memset(r, 0, sizeof *r);
    r->source = source;
    obx__strlcpy(r->event_id, o->event_id, sizeof r->event_id);
    r->envelope_gen = o->envelope_gen;
    obx__strlcpy(r->attempt_id, o->attempt_id, sizeof r->attempt_id);
    r->kind = k;
    obx__strlcpy(r->cluster, o->cluster, sizeof r->cluster);
    obx__strlcpy(r->topic, o->topic, sizeof r->topic);
    r->partition = o->partition;
    r->offset = o->offset;
    r->broker_ts = o->broker_ts;
    obx__strlcpy(r->payload_digest, o->payload_digest, sizeof r->payload_digest);
    obx__strlcpy(r->dest_digest, o->dest_digest, sizeof r->dest_digest);
    r->created_at = now;
}

/* The slot a receipt belongs to: the one that registered the attempt it names (a delivery-set
 * target's receipt carries the logical event ID), else the event it names. */
static const char *slot_key(const obx__outcome *o, const obx__attempt_row *a) {
    return a && strcmp(a->event_id, o->event_id) ? a->event_id : o->event_id;
}

/* Rule 2-4: why a receipt cannot be accepted, or NULL when it is valid. */
static const char *invalid(accept_ctx *c, const obx__outcome *o, const obx__event_row *ev,
                           const obx__attempt_row *a, char *why, size_t cap) {
    if (!ev) return "receipt for an event this outbox never committed";
    if (strcmp(obx__wire_id(ev), o->event_id)) {
        snprintf(why, cap, "attempt %.40s belongs to %.40s, not to event %.40s", o->attempt_id,
                 obx__wire_id(ev), o->event_id);
        return why;
    }
    if (o->envelope_gen != ev->envelope_gen && !OBX__MUTANT(ACCEPT_SUPERSEDED_GEN)) {
        snprintf(why, cap,
                 "receipt for envelope generation %d, current is %d: a superseded generation's "
                 "receipt contradicts its migration proof",
                 (int)o->envelope_gen, (int)ev->envelope_gen);
        return why;
    }
    if (!OBX__MUTANT(ACCEPT_STALE_DIGEST)) {
        if (strcmp(o->payload_digest, ev->env.payload_digest)) {
            snprintf(why, cap, "payload digest %.20s... differs from the frozen %.20s...",
                     o->payload_digest, ev->env.payload_digest);
            return why;
        }
        if (strcmp(o->dest_digest, ev->dest_digest)) {
            snprintf(why, cap, "destination digest %.20s... differs from the frozen %.20s...",
                     o->dest_digest, ev->dest_digest);
            return why;
        }
    }
    if (!a || strcmp(a->event_id, ev->env.event_id) || a->envelope_gen != o->envelope_gen)
        return "no registered attempt of this event and generation carries this attempt ID";
    if (strcmp(a->dest_digest, ev->dest_digest) && !OBX__MUTANT(ACCEPT_STALE_DIGEST))
        return "the attempt was registered for another destination";
    if (a->state == OBX__AT_REJECTED) {
        snprintf(why, cap, "the broker definitely rejected this attempt before (%s)", a->detail);
        return why;
    }
    if (a->state == OBX__AT_NOT_FOUND) return "an authoritative lookup proved this attempt absent";
    if (a->state == OBX__AT_QUARANTINED) return "this attempt is quarantined";
    if (strcmp(o->cluster, ev->dest.cluster) || strcmp(o->topic, ev->dest.topic) ||
        o->partition != a->partition) {
        snprintf(why, cap,
                 "receipt from %.40s/%.60s partition %d, frozen destination is %.40s/%.60s "
                 "partition %d",
                 o->cluster, o->topic, (int)o->partition, ev->dest.cluster, ev->dest.topic,
                 (int)a->partition);
        return why;
    }
    (void)c;
    return NULL;
}

/* Rule 1, for this run of accept_tx: loads the attempts the receipts name and their slots'
 * events (locked; the slot that registered the attempt, else the event the receipt names: a
 * delivery-set target's receipt carries the logical event ID), with their indexes; drops what
 * an earlier run of the transaction loaded. */
static obx_err accept_load(obx__engine *e, accept_ctx *c) {
    obx_err err;
    const char **ids = calloc(c->n, sizeof *ids), **aids = calloc(c->n, sizeof *aids);
    if (!ids || !aids) {
        free(ids);
        free(aids);
        return obx__fail(OBX_ENOMEM, "accept: out of memory");
    }
    for (size_t i = 0; i < c->n; i++) {
        aids[i] = c->acks[i].attempt_id;
        ids[i] = c->acks[i].event_id;
    }
    obx__rows_free(&c->ev);
    free(c->att);
    c->att = NULL;
    obx__id_index_free(&c->att_ix);
    obx__id_index_free(&c->ev_ix);
    err = obx__st_load_slots(e->s, aids, ids, c->n, OBX__LOAD_LOCK, &c->att, &c->n_att,
                             &c->ev); /* rule 1 */
    if (!err) err = obx__id_index_attempts(&c->att_ix, c->att, c->n_att);
    if (!err) err = obx__id_index_events(&c->ev_ix, &c->ev);
    free(ids);
    free(aids);
    return err;
}

/* The scratch of one run of accept_tx: the events' compare-and-set expectations as locked
 * (orig), which events and attempts changed, and the batch (whose event updates are the
 * context's rows, changed in place). */
typedef struct accept_run {
    obx__cas *orig;
    bool *dirty_ev, *dirty_att;
    obx__batch b;
} accept_run;

/* Rule 6: receipt i (o) is invalid for the reason bad: a QUARANTINED receipt (under slot ev when
 * it names one, else under the event it names), an alarm, and an audit row on ev; nothing else
 * changes. */
static void quarantine(obx__engine *e, accept_ctx *c, accept_run *w, size_t i,
                       const obx__outcome *o, const obx__event_row *ev, const char *bad) {
    obx__receipt_row *r = &w->b.rc[w->b.n_rc++];
    receipt_from(r, o, OBX__RK_QUARANTINED, c->now, c->source);
    if (ev) obx__strlcpy(r->event_id, ev->env.event_id, sizeof r->event_id);
    if (c->note) /* what the source knows of it (a lookup: the copy's bytes) */
        snprintf(r->reason, sizeof r->reason, "%s (%s)", bad, c->note);
    else
        obx__strlcpy(r->reason, bad, sizeof r->reason);
    c->kinds[i] = OBX__RK_QUARANTINED;
    obx__strlcpy(c->alarm[i], r->reason, sizeof c->alarm[i]);
    if (ev)
        obx__audit(&w->b.au[w->b.n_au++], c->now, OBX__ACT_ACCEPTOR, e->cfg.owner, ev, ev->state,
                   ev->state, "receipt of attempt %.40s quarantined: %s", o->attempt_id, r->reason);
}

/* Rule 5, empty slot: valid receipt i (o) of attempt a fills slot ev: event PUBLISHED, attempt
 * ACCEPTED, a PRIMARY receipt and the audit row (in memory, into w). Fails only when the
 * transition table does not allow the move (nothing changed then). */
static obx_err fill_slot(obx__engine *e, accept_ctx *c, accept_run *w, size_t i,
                         const obx__outcome *o, obx__attempt_row *a, obx__event_row *ev) {
    size_t ei = (size_t)(ev - c->ev.v), ai = (size_t)(a - c->att);
    obx__state from = ev->state;
    if (!obx__transition_allowed(from, OBX__ST_PUBLISHED, OBX__ACT_ACCEPTOR))
        return obx__fail(OBX_EINTERNAL, "accept: %s -> PUBLISHED is not in the table",
                         obx__state_name(from));
    if (ev->unknown_since) c->resolved_ms[i] = c->now - ev->unknown_since;
    ev->state = OBX__ST_PUBLISHED;
    obx__strlcpy(ev->primary_attempt_id, a->attempt_id, sizeof ev->primary_attempt_id);
    ev->published_at = c->now;
    ev->held_at = 0;
    ev->owner[0] = '\0';
    ev->lease_until = 0;
    ev->updated_at = c->now;
    w->dirty_ev[ei] = true;
    a->state = OBX__AT_ACCEPTED;
    a->ended_at = c->now;
    w->dirty_att[ai] = true;
    obx__receipt_row *r = &w->b.rc[w->b.n_rc++];
    receipt_from(r, o, OBX__RK_PRIMARY, c->now, c->source);
    obx__strlcpy(r->event_id, ev->env.event_id, sizeof r->event_id);
    snprintf(r->reason, sizeof r->reason, "accepted in %s", obx__state_name(from));
    c->kinds[i] = OBX__RK_PRIMARY;
    obx__audit(&w->b.au[w->b.n_au++], c->now, OBX__ACT_ACCEPTOR, e->cfg.owner, ev, from,
               OBX__ST_PUBLISHED, "%s of attempt %s (%s/%d@%lld) filled the slot%s%s%s",
               c->source == OBX__RS_BROKER     ? "receipt"
               : c->source == OBX__RS_LOOKUP   ? "lookup receipt"
               : c->source == OBX__RS_CONSUMER ? "consumer evidence"
               : c->source == OBX__RS_ASSERTED ? "operator assertion (not verified at the broker)"
                                               : "operator evidence verified at the broker",
               a->attempt_id, o->topic, (int)o->partition, (long long)o->offset,
               c->source != OBX__RS_BROKER ||
                       (from == OBX__ST_SENDING && !strcmp(ev->attempt_id, a->attempt_id))
                   ? ""
                   : " (late ACK)",
               c->note ? ": " : "", c->note ? c->note : "");
    return OBX_OK;
}

/* Rule 5, full slot: valid receipt i (o) of attempt a becomes a DUPLICATE transport receipt of
 * slot ev; a SENDING or UNKNOWN attempt ends DUPLICATE; the event does not change. */
static void duplicate(accept_ctx *c, accept_run *w, size_t i, const obx__outcome *o,
                      obx__attempt_row *a, const obx__event_row *ev) {
    size_t ai = (size_t)(a - c->att);
    c->kinds[i] = OBX__RK_DUPLICATE;
    if (OBX__MUTANT(DROP_DUPLICATE_RECEIPT)) return;
    if (a->state == OBX__AT_SENDING || a->state == OBX__AT_UNKNOWN ||
        a->state == OBX__AT_SUPERSEDED) {
        a->state = OBX__AT_DUPLICATE;
        a->ended_at = c->now;
        w->dirty_att[ai] = true;
    }
    obx__receipt_row *r = &w->b.rc[w->b.n_rc++];
    receipt_from(r, o, OBX__RK_DUPLICATE, c->now, c->source);
    obx__strlcpy(r->event_id, ev->env.event_id, sizeof r->event_id);
    snprintf(r->reason, sizeof r->reason, "slot already filled by attempt %s",
             ev->primary_attempt_id);
}

/* Rule 5's consequence: once slot ev is filled by attempt `primary`, its other attempts of the
 * generation whose outcome is still UNKNOWN, or still SENDING, have nothing left to decide: they
 * end SUPERSEDED (a late ACK of one is still a duplicate receipt, a later outcome changes
 * nothing). A SENDING one must end here: its sender may never report (a reconciler that died
 * with the retry in flight), and the sweep ends only the SENDING attempts of SENDING events.
 * Only a slot that was retried has them. */
static obx_err end_superseded(obx__engine *e, accept_ctx *c, const obx__event_row *ev) {
    if (ev->attempt_gen <= 1 || OBX__MUTANT(SUPERSEDED_STAY_OPEN)) return OBX_OK;
    obx__attempt_row *att = NULL;
    size_t n = 0;
    obx_err err = obx__st_load_attempts(e->s, NULL, 0, ev->env.event_id, &att, &n);
    obx__batch b;
    if (!err) err = obx__batch_reserve(&b, 0, n, 0, 1);
    if (err) {
        free(att);
        return err;
    }
    for (size_t i = 0; i < n; i++) {
        obx__attempt_row *a = &att[i];
        if ((a->state != OBX__AT_UNKNOWN && a->state != OBX__AT_SENDING) ||
            a->envelope_gen != ev->envelope_gen || !strcmp(a->attempt_id, ev->primary_attempt_id))
            continue;
        bool sending = a->state == OBX__AT_SENDING;
        a->state = OBX__AT_SUPERSEDED;
        a->ended_at = c->now;
        snprintf(a->detail, sizeof a->detail,
                 "SUPERSEDED: attempt %.40s filled the publish slot while this one %s",
                 ev->primary_attempt_id, sending ? "was in flight" : "had an unknown outcome");
        b.att[b.n_att++] = *a;
    }
    if (b.n_att)
        obx__audit(&b.au[b.n_au++], c->now, OBX__ACT_ACCEPTOR, e->cfg.owner, ev, ev->state,
                   ev->state,
                   "%zu other attempts, in flight or with an unknown outcome, end "
                   "SUPERSEDED",
                   b.n_att);
    err = b.n_att ? obx__batch_write(e->s, &b) : OBX_OK;
    obx__batch_free(&b);
    free(att);
    return err;
}

static obx_err accept_tx(obx__engine *e, void *arg) {
    accept_ctx *c = arg;
    obx_err err = accept_load(e, c);
    if (err) return err;
    accept_run w = {.orig = obx__cas_of(&c->ev)};
    w.dirty_ev = calloc(c->ev.n + 1, 1);
    w.dirty_att = calloc(c->n_att + 1, 1);
    err = (!w.orig || !w.dirty_ev || !w.dirty_att)
              ? obx__fail(OBX_ENOMEM, "accept: out of memory")
              : obx__batch_reserve_refs(&w.b, c->ev.n, c->n_att, c->n, c->n);
    if (err) {
        free(w.dirty_ev);
        free(w.dirty_att);
        free(w.orig);
        return err;
    }
    int64_t quarantined = 0;
    for (size_t i = 0; i < c->n; i++) {
        const obx__outcome *o = &c->acks[i];
        obx__attempt_row *a = find_att(c, o->attempt_id);
        obx__event_row *ev = find_ev(c, slot_key(o, a));
        char why[OBX_TEXT_MAX + 1];
        const char *bad = invalid(c, o, ev, a, why, sizeof why);
        c->resolved_ms[i] = -1;
        c->alarm[i][0] = '\0';
        /* receipts are kept under the slot they belong to (the event's own key for an
         * ordinary event); one that names no slot of its event stays under the event it names */
        if (ev && strcmp(obx__wire_id(ev), o->event_id)) ev = NULL;
        if (bad) { /* rule 6 */
            quarantine(e, c, &w, i, o, ev, bad);
            quarantined++;
        } else if (!ev->primary_attempt_id[0] && !obx__state_is_published(ev->state)) {
            if ((err = fill_slot(e, c, &w, i, o, a, ev))) break; /* rule 5: fill the slot */
        } else
            duplicate(c, &w, i, o, a, ev); /* rule 5: slot full */
    }
    for (size_t i = 0; !err && i < c->ev.n; i++)
        if (w.dirty_ev[i]) obx__batch_update_ref(&w.b, &w.orig[i], &c->ev.v[i]);
    for (size_t i = 0; i < c->n_att; i++)
        if (w.dirty_att[i]) w.b.att[w.b.n_att++] = c->att[i];
    if (!err) err = obx__batch_write(e->s, &w.b);
    for (size_t i = 0; !err && i < c->ev.n; i++)
        if (w.dirty_ev[i] && obx__state_is_published(c->ev.v[i].state) &&
            !obx__state_is_published(w.orig[i].state))
            err = end_superseded(e, c, &c->ev.v[i]);
    if (!err && quarantined) err = obx__st_counter_add(e->s, "receipts_quarantined", quarantined);
    obx__batch_free(&w.b);
    free(w.dirty_ev);
    free(w.dirty_att);
    free(w.orig);
    return err;
}

/* The note for ack i, from the rows as the committed transaction left them. */
static void note(obx__engine *e, accept_ctx *c, size_t i, int64_t now) {
    const obx__outcome *o = &c->acks[i];
    const obx__event_row *ev = find_ev(c, o->event_id);
    const obx__attempt_row *a = find_att(c, o->attempt_id);
    char detail[OBX_TEXT_MAX + 1] = "";
    obx__note n = {.event_id = o->event_id,
                   .attempt_id = o->attempt_id,
                   .correlation_id = ev ? ev->env.correlation_id : "",
                   .latency_ms = -1,
                   .unknown_ms = -1,
                   .detail = detail,
                   .ev = ev,
                   .attempt_gen = a ? a->attempt_gen : 0,
                   .source = c->source};
    switch (c->kinds[i]) {
    case OBX__RK_PRIMARY:
        n.kind = OBX__NOTE_PUBLISHED;
        if (ev) n.latency_ms = now - ev->committed_at;
        n.unknown_ms = c->resolved_ms[i];
        snprintf(detail, sizeof detail, "%s/%d@%lld", o->topic, (int)o->partition,
                 (long long)o->offset);
        break;
    case OBX__RK_DUPLICATE:
        n.kind = OBX__NOTE_DUPLICATE;
        snprintf(detail, sizeof detail, "%s/%d@%lld; slot filled by attempt %s", o->topic,
                 (int)o->partition, (long long)o->offset, ev ? ev->primary_attempt_id : "?");
        break;
    case OBX__RK_QUARANTINED:
        n.kind = OBX__NOTE_QUARANTINED;
        n.detail = c->alarm[i];
        break;
    default: return;
    }
    e->on_note(e->on_note_user, &n);
}

obx_err obx__accept_receipts(obx__engine *e, int64_t now, const obx__outcome *acks, size_t n,
                             obx__receipt_kind *results) {
    return obx__accept_receipts_from(e, now, acks, n, results, OBX__RS_BROKER, NULL);
}

obx_err obx__accept_receipts_from(obx__engine *e, int64_t now, const obx__outcome *acks, size_t n,
                                  obx__receipt_kind *results, obx__receipt_source source,
                                  const char *why) {
    if (!n) return OBX_OK;
    accept_ctx c = {.now = now, .acks = acks, .n = n, .source = source, .note = why};
    c.kinds = results ? results : calloc(n, sizeof *c.kinds);
    c.resolved_ms = calloc(n, sizeof *c.resolved_ms);
    c.alarm = calloc(n, sizeof *c.alarm);
    obx_err err = (!c.kinds || !c.resolved_ms || !c.alarm)
                      ? obx__fail(OBX_ENOMEM, "accept: out of memory")
                      : obx__engine_tx(e, accept_tx, &c);
    if (!err) {
        for (size_t i = 0; i < n; i++) {
            switch (c.kinds[i]) {
            case OBX__RK_PRIMARY: e->st.accepted++; break;
            case OBX__RK_DUPLICATE: e->st.duplicates++; break;
            case OBX__RK_QUARANTINED:
                e->st.quarantined++;
                if (e->on_alarm) e->on_alarm(e->on_alarm_user, acks[i].event_id, c.alarm[i]);
                break;
            default: break;
            }
            if (c.resolved_ms[i] >= 0) {
                e->st.unknown_resolved++;
                if (c.resolved_ms[i] > e->st.unknown_resolve_ms_max)
                    e->st.unknown_resolve_ms_max = c.resolved_ms[i];
                if (e->on_unknown_resolved)
                    e->on_unknown_resolved(e->on_unknown_resolved_user, acks[i].event_id,
                                           c.resolved_ms[i]);
            }
            if (e->on_note) note(e, &c, i, now);
        }
    }
    obx__rows_free(&c.ev);
    free(c.att);
    obx__id_index_free(&c.att_ix);
    obx__id_index_free(&c.ev_ix);
    if (!results) free(c.kinds);
    free(c.resolved_ms);
    free(c.alarm);
    return err;
}
