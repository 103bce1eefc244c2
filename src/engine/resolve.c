/*
 * resolve.c — how an UNKNOWN outcome ends when the broker cannot say (docs/design.md,
 * "Reconciliation and UNKNOWN outcomes"): a critical consumer's evidence, and an operator's
 * resolution.
 *
 * Consumer evidence. A critical consumer's consume receipt (its inbox row: event ID, envelope
 * generation, attempt, destination digest, topic, partition, offset, payload digest) shows
 * that the broker accepted the message: the consumer received it from there. It is turned into
 * a receipt and goes through the single acceptance point like any other (digests, attempt and
 * destination checked; source "consumer"), so a consumer that saw another payload under the
 * event's ID raises the same quarantine alarm as a broker would. Rows written before schema
 * version 4 carry no attempt or generation and are never evidence.
 *
 * Operator resolution (`obx resolve`, POST /api/resolve). For events in DISPATCH_UNKNOWN, held
 * or not, by ID or by a selector, always with who and why:
 *   retry   DISPATCH_UNKNOWN -> RETRY_CLAIMED (OPERATOR, audited) with an expired lease: the
 *           next reconciler step takes it over and sends a new attempt to the frozen
 *           destination and pinned partition, exactly as its own retry would. There is no way
 *           to name another destination: migration (obx migrate) is the only way there, and it
 *           refuses while the outcome is UNKNOWN.
 *   accept  evidence the operator found at the broker (topic, partition, offset and the
 *           payload digest the message carries) or a declared critical consumer's receipt,
 *           through the acceptance point. Evidence that names another topic, partition,
 *           payload digest or attempt than the event's frozen ones is refused before it
 *           reaches the acceptance point (which would quarantine it as an alarm): an
 *           operator's typo is not a broker contradicting the outbox. Evidence is the bytes:
 *           where the event's cluster can be asked (an authoritative lookup, or a cluster no
 *           relay registered), the broker is read (obx__reconcile_lookup: every copy under the
 *           event ID, bodies hashed) and only the event's own message at the named offset is
 *           accepted (source "operator"); anything else is refused. Where the cluster cannot be
 *           asked (lookup none or best effort), the acceptance is an operator assertion
 *           (source "asserted"): counted in the store's stats, reported by obx audit until a
 *           critical consumer's receipt confirms it.
 * Events in any other state are refused with the reason; nothing changes for them.
 */
#include "engine/engine_int.h"

#include <stdio.h>
#include <string.h>

/* ---- consumer evidence -------------------------------------------------------------------- */

obx_err obx__consumer_evidence(obx__critical *cs, size_t n, const obx__event_row *row,
                               obx__outcome *out, bool *found, char *who, size_t who_cap) {
    *found = false;
    obx_err first = OBX_OK;
    for (size_t i = 0; i < n; i++) {
        obx__inbox_row r;
        if (!cs[i].s) continue;
        obx_err e = obx__st_inbox_get(cs[i].s, cs[i].id, obx__wire_id(row), &r);
        if (e == OBX_ENOTFOUND) continue;
        if (e) { /* this consumer cannot testify now; the others may */
            cs[i].failed = true;
            if (!first) first = obx__fail_prefix(e, "consumer evidence (%s)", cs[i].id);
            continue;
        }
        /* a receipt of another generation or destination proves nothing about this one */
        if (r.envelope_gen != row->envelope_gen || !r.attempt_id[0] ||
            strcmp(r.dest_digest, row->dest_digest))
            continue;
        memset(out, 0, sizeof *out);
        out->kind = OBX__OUT_ACK;
        obx__strlcpy(out->event_id, obx__wire_id(row), sizeof out->event_id);
        out->envelope_gen = r.envelope_gen;
        obx__strlcpy(out->attempt_id, r.attempt_id, sizeof out->attempt_id);
        obx__strlcpy(out->payload_digest, r.payload_digest, sizeof out->payload_digest);
        obx__strlcpy(out->dest_digest, r.dest_digest, sizeof out->dest_digest);
        /* the consumer does not know the cluster's name; its receipt matched the frozen
         * destination digest, which includes it */
        obx__strlcpy(out->cluster, row->dest.cluster, sizeof out->cluster);
        obx__strlcpy(out->topic, r.topic, sizeof out->topic);
        out->partition = r.partition;
        out->offset = r.offset;
        out->broker_ts = r.consumed_at;
        char at[32];
        obx__iso_ms(r.consumed_at, at); /* reasons reach operators: ISO, never epoch ms */
        snprintf(out->reason, sizeof out->reason, "consumed by %s at %s", cs[i].id, at);
        if (who) obx__strlcpy(who, cs[i].id, who_cap);
        *found = true;
        return OBX_OK;
    }
    return first;
}

/* ---- operator resolution ------------------------------------------------------------------ */

typedef struct retry_ctx {
    int64_t now;
    const char *id;
    const obx__resolve_req *req;
    char refused[OBX_TEXT_MAX + 1]; /* set when the event may not be retried (nothing written) */
    obx__event_row done;            /* the values written */
} retry_ctx;

static void refuse_state(char *out, size_t cap, const obx__event_row *ev, int64_t now) {
    if (ev->state == OBX__ST_RECONCILING || ev->state == OBX__ST_RETRY_CLAIMED)
        snprintf(out, cap,
                 "%s is %s by %s (lease for %lld ms more): a reconciler is deciding or sending; "
                 "try again later",
                 ev->env.event_id, obx__state_name(ev->state), ev->owner,
                 (long long)(ev->lease_until > now ? ev->lease_until - now : 0));
    else if (obx__state_is_published(ev->state))
        snprintf(out, cap, "%s is %s: its outcome is known, nothing to resolve", ev->env.event_id,
                 obx__state_name(ev->state));
    else
        snprintf(out, cap, "%s is %s, not DISPATCH_UNKNOWN: only UNKNOWN outcomes are resolved",
                 ev->env.event_id, obx__state_name(ev->state));
}

static obx_err retry_tx(obx__engine *e, void *arg) {
    retry_ctx *c = arg;
    c->refused[0] = '\0';
    obx__rows cur = {0};
    obx_err err = obx__st_load_events(e->s, &c->id, 1, OBX__LOAD_LOCK, &cur);
    if (!err && cur.n != 1) err = obx__fail(OBX_ENOTFOUND, "%s: not in this outbox", c->id);
    if (err) {
        obx__rows_free(&cur);
        return err;
    }
    obx__event_row *ev = &cur.v[0];
    if (ev->state != OBX__ST_DISPATCH_UNKNOWN) {
        refuse_state(c->refused, sizeof c->refused, ev, c->now);
        obx__rows_free(&cur);
        return OBX_OK;
    }
    obx__event_row next = *ev;
    next.payload = NULL;
    next.state = OBX__ST_RETRY_CLAIMED;
    next.claim_gen = ev->claim_gen + 1;
    obx__strlcpy(next.owner, c->req->who, sizeof next.owner);
    next.lease_until = c->now; /* expired: the next reconciler step takes it over and sends */
    next.held_at = 0;
    next.updated_at = c->now;
    obx__batch b;
    if ((err = obx__batch_reserve(&b, 1, 0, 0, 1))) {
        obx__rows_free(&cur);
        return err;
    }
    if (!obx__transition_allowed(ev->state, next.state, OBX__ACT_OPERATOR))
        err = obx__fail(OBX_EINTERNAL, "resolve: %s -> %s not allowed", obx__state_name(ev->state),
                        obx__state_name(next.state));
    if (!err) {
        obx__batch_update(&b, ev, &next);
        obx__audit(&b.au[b.n_au++], c->now, OBX__ACT_OPERATOR, c->req->who, &next, ev->state,
                   next.state,
                   "operator %s ordered a same-target retry to the frozen destination %s/%s "
                   "partition %d%s (UNKNOWN for %lld ms): %s",
                   c->req->who, ev->dest.cluster, ev->dest.topic, (int)ev->pinned_partition,
                   ev->held_at ? ", held" : "",
                   (long long)(ev->unknown_since ? c->now - ev->unknown_since : 0), c->req->reason);
        err = obx__batch_write(e->s, &b);
    }
    if (!err) c->done = next;
    obx__batch_free(&b);
    obx__rows_free(&cur);
    return err;
}

/* The attempt evidence names: the given one, or the newest outstanding attempt (SENDING or
 * UNKNOWN) of the current generation. *why is set when there is none acceptable. */
static obx_err pick_attempt(obx__engine *e, const obx__event_row *ev, const char *want,
                            char out[OBX__ATTEMPT_ID_LEN + 1], char *why, size_t cap) {
    obx__attempt_row *att = NULL;
    size_t n = 0;
    obx_err err = obx__st_load_attempts(e->s, NULL, 0, ev->env.event_id, &att, &n);
    if (err) return err;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        const obx__attempt_row *a = &att[i];
        if (a->envelope_gen != ev->envelope_gen) continue;
        if (want && *want) {
            if (!strcmp(a->attempt_id, want))
                obx__strlcpy(out, a->attempt_id, OBX__ATTEMPT_ID_LEN + 1);
        } else if (a->state == OBX__AT_SENDING || a->state == OBX__AT_UNKNOWN)
            obx__strlcpy(out, a->attempt_id, OBX__ATTEMPT_ID_LEN + 1); /* the last one wins */
    }
    free(att);
    if (!out[0])
        snprintf(why, cap, "%s: %s", ev->env.event_id,
                 want && *want ? "the evidence names an attempt this event's generation never "
                                 "registered"
                               : "no outstanding attempt of its current generation to accept");
    return OBX_OK;
}

/* Evidence the operator typed, checked against the frozen event before it may reach the
 * acceptance point. */
static void check_evidence(const obx__event_row *ev, const obx__resolve_req *req, char *why,
                           size_t cap) {
    why[0] = '\0';
    if (req->topic && *req->topic && strcmp(req->topic, ev->dest.topic))
        snprintf(why, cap,
                 "%s: refused: the evidence names topic '%.60s', the frozen destination is "
                 "'%.60s'; resolving never changes the destination (see obx migrate)",
                 ev->env.event_id, req->topic, ev->dest.topic);
    else if (req->partition >= 0 && req->partition != ev->pinned_partition)
        snprintf(why, cap,
                 "%s: refused: the evidence names partition %d, the event's attempts go to the "
                 "pinned partition %d",
                 ev->env.event_id, (int)req->partition, (int)ev->pinned_partition);
    else if (strcmp(req->payload_digest, ev->env.payload_digest))
        snprintf(why, cap,
                 "%s: refused: the message found carries payload digest %.24s..., the frozen "
                 "payload's is %.24s...: it is not this event's message",
                 ev->env.event_id, req->payload_digest, ev->env.payload_digest);
}

static json_t *item(const char *id, const char *result, const char *detail) {
    return json_pack("{s:s,s:s,s:s}", "event_id", id, "result", result, "detail", detail);
}

/* The operator's retry of event ev (DISPATCH_UNKNOWN when loaded): a dry run describes it,
 * otherwise retry_tx moves it to RETRY_CLAIMED. Appends id's item to arr; clears *refused when
 * the retry is (or would be) scheduled, with the detail in why (cap OBX_TEXT_MAX + 1). */
static obx_err resolve_retry(obx__engine *e, int64_t now, const obx__resolve_req *req,
                             const char *id, const obx__event_row *ev, json_t *arr, bool *refused,
                             char *why) {
    if (req->dry_run) {
        snprintf(why, OBX_TEXT_MAX + 1, "would retry to the frozen destination %s/%s partition %d",
                 ev->dest.cluster, ev->dest.topic, (int)ev->pinned_partition);
        json_array_append_new(arr, item(id, "dry-run", why));
        *refused = false;
        return OBX_OK;
    }
    retry_ctx c = {.now = now, .id = id, .req = req};
    obx_err err = obx__engine_tx(e, retry_tx, &c);
    if (err) return err;
    if (c.refused[0]) {
        json_array_append_new(arr, item(id, "refused", c.refused));
        return OBX_OK;
    }
    snprintf(why, OBX_TEXT_MAX + 1,
             "retry scheduled to the frozen destination %s/%s partition %d (a reconciler "
             "sends it)",
             ev->dest.cluster, ev->dest.topic, (int)ev->pinned_partition);
    json_array_append_new(arr, item(id, "retry", why));
    *refused = false;
    return OBX_OK;
}

/* Whether the cluster of ev can be asked (*can): the connected broker's own capability when it
 * is that cluster, else the cluster as a relay registered it; a cluster nobody registered
 * counts as one that can be asked (nothing says it cannot). Sets why (cap OBX_TEXT_MAX + 1)
 * when the broker given is another cluster. */
static obx_err can_be_asked(obx__engine *e, const obx__event_row *ev, bool *can, char *why) {
    if (e->b) {
        if (strcmp(e->cluster, ev->dest.cluster))
            snprintf(why, OBX_TEXT_MAX + 1,
                     "%s: refused: the broker given is cluster %.60s, the event's is %.60s",
                     ev->env.event_id, e->cluster, ev->dest.cluster);
        *can = (obx__br_caps(e->b) & OBX__BCAP_LOOKUP_AUTHORITATIVE) != 0;
        return OBX_OK;
    }
    obx__cluster_row c;
    obx_err err = obx__st_cluster_get(e->s, ev->dest.cluster, &c);
    if (err == OBX_ENOTFOUND) return OBX_OK;
    if (err) return err;
    *can = !strcmp(c.lookup, "authoritative");
    return OBX_OK;
}

/* Evidence at a cluster that can be asked: the broker is read (every copy under the event ID,
 * bodies hashed) and *o is the event's own message found at the named offset; anything else
 * sets why (cap OBX_TEXT_MAX + 1). */
static obx_err verify_at_broker(obx__engine *e, int64_t now, const obx__resolve_req *req,
                                const obx__event_row *ev, obx__outcome *o, char *why) {
    const char *id = ev->env.event_id;
    if (!e->b) {
        snprintf(why, OBX_TEXT_MAX + 1,
                 "%s: refused: cluster %.60s can be asked; give its broker (--broker URL) so that "
                 "obx reads offset %lld and hashes the message there",
                 id, ev->dest.cluster, (long long)req->offset);
        return OBX_OK;
    }
    obx__lookup_res res;
    obx_err err = obx__reconcile_lookup(e, now, ev, &res);
    if (err) return err;
    if (res.kind == OBX__LOOKUP_FOUND && res.found.offset == req->offset) {
        if (req->attempt_id && *req->attempt_id && strcmp(req->attempt_id, res.found.attempt_id))
            snprintf(why, OBX_TEXT_MAX + 1,
                     "%s: refused: the message at offset %lld carries attempt %.40s, not %.40s", id,
                     (long long)req->offset, res.found.attempt_id, req->attempt_id);
        *o = res.found;
    } else if (res.kind == OBX__LOOKUP_FOUND)
        snprintf(why, OBX_TEXT_MAX + 1,
                 "%s: refused: the broker holds this event's message at %.60s/%d@%lld, not at "
                 "offset %lld",
                 id, res.found.topic, (int)res.found.partition, (long long)res.found.offset,
                 (long long)req->offset);
    else if (res.n_bad && res.bad.offset == req->offset)
        snprintf(why, OBX_TEXT_MAX + 1,
                 "%s: refused: the message at offset %lld is not this event's message: %.160s", id,
                 (long long)req->offset, res.bad.reason);
    else
        snprintf(why, OBX_TEXT_MAX + 1,
                 "%s: refused: the broker does not hold this event's message at %.60s/%d@%lld "
                 "(%.120s)",
                 id, ev->dest.topic, (int)ev->pinned_partition, (long long)req->offset, res.reason);
    return OBX_OK;
}

/* The receipt *o that the evidence for ev amounts to: a consumer's consume receipt
 * (*src = OBX__RS_CONSUMER) or what the operator found at the broker. Sets why (cap
 * OBX_TEXT_MAX + 1) when the evidence is refused: none, or not matching the frozen event. */
static obx_err evidence_outcome(obx__engine *e, int64_t now, const obx__resolve_req *req,
                                const char *id, const obx__event_row *ev, obx__outcome *o,
                                obx__receipt_source *src, char *why) {
    obx_err err;
    memset(o, 0, sizeof *o);
    *src = OBX__RS_OPERATOR;
    if (req->consumer) {
        bool found = false;
        if ((err = obx__consumer_evidence(req->consumer, 1, ev, o, &found, NULL, 0))) return err;
        if (!found) {
            snprintf(why, OBX_TEXT_MAX + 1,
                     "%s: consumer %s has no consume receipt of generation %d with its "
                     "attempt and destination (none, or one whose delivery did not carry them)",
                     id, req->consumer->id, (int)ev->envelope_gen);
            return OBX_OK;
        }
        *src = OBX__RS_CONSUMER;
        obx__resolve_req chk = *req;
        chk.topic = o->topic;
        chk.partition = o->partition;
        chk.payload_digest = o->payload_digest;
        check_evidence(ev, &chk, why, OBX_TEXT_MAX + 1);
        if (!why[0]) {
            char att[OBX__ATTEMPT_ID_LEN + 1];
            if ((err = pick_attempt(e, ev, o->attempt_id, att, why, OBX_TEXT_MAX + 1))) return err;
        }
        return OBX_OK;
    }
    check_evidence(ev, req, why, OBX_TEXT_MAX + 1);
    char att[OBX__ATTEMPT_ID_LEN + 1] = "";
    if (!why[0] && (err = pick_attempt(e, ev, req->attempt_id, att, why, OBX_TEXT_MAX + 1)))
        return err;
    bool can_ask = true;
    if (!why[0] && (err = can_be_asked(e, ev, &can_ask, why))) return err;
    if (why[0]) return OBX_OK;
    if (can_ask && !OBX__MUTANT(ACCEPT_UNREAD_OFFSET))
        return verify_at_broker(e, now, req, ev, o, why);
    /* (test-only bug ACCEPT_UNREAD_OFFSET: the offset taken as verified, unread) */
    *src = can_ask ? OBX__RS_OPERATOR : OBX__RS_ASSERTED;
    o->kind = OBX__OUT_ACK;
    obx__strlcpy(o->event_id, obx__wire_id(ev), sizeof o->event_id);
    o->envelope_gen = ev->envelope_gen;
    obx__strlcpy(o->attempt_id, att, sizeof o->attempt_id);
    obx__strlcpy(o->payload_digest, req->payload_digest, sizeof o->payload_digest);
    obx__strlcpy(o->dest_digest, ev->dest_digest, sizeof o->dest_digest);
    obx__strlcpy(o->cluster, ev->dest.cluster, sizeof o->cluster);
    obx__strlcpy(o->topic, ev->dest.topic, sizeof o->topic);
    o->partition = ev->pinned_partition;
    o->offset = req->offset;
    o->broker_ts = now;
    return OBX_OK;
}

/* The operator's evidence for event ev (DISPATCH_UNKNOWN when loaded), through the acceptance
 * point unless refused or a dry run. Appends id's item to arr; clears *refused when the event is
 * (or would be) published or the evidence kept as a duplicate, with the detail in why (cap
 * OBX_TEXT_MAX + 1). */
static obx_err resolve_accept(obx__engine *e, int64_t now, const obx__resolve_req *req,
                              const char *id, const obx__event_row *ev, json_t *arr, bool *refused,
                              char *why) {
    obx__outcome o;
    obx__receipt_source src;
    obx_err err = evidence_outcome(e, now, req, id, ev, &o, &src, why);
    if (err) return err;
    if (why[0]) {
        json_array_append_new(arr, item(id, "refused", why));
        return OBX_OK;
    }
    if (req->dry_run) {
        snprintf(why, OBX_TEXT_MAX + 1, "would accept %s/%d@%lld (attempt %s) as its receipt",
                 o.topic, (int)o.partition, (long long)o.offset, o.attempt_id);
        json_array_append_new(arr, item(id, "dry-run", why));
        *refused = false;
        return OBX_OK;
    }
    char note[OBX_TEXT_MAX + 1];
    snprintf(note, sizeof note, "resolved by operator %s: %s", req->who, req->reason);
    obx__receipt_kind k = OBX__RK_QUARANTINED;
    if ((err = obx__accept_receipts_from(e, now, &o, 1, &k, src, note))) return err;
    if (k == OBX__RK_PRIMARY || k == OBX__RK_DUPLICATE) {
        snprintf(why, OBX_TEXT_MAX + 1, "%s: %s/%d@%lld (attempt %s)",
                 k == OBX__RK_PRIMARY ? "published on the evidence"
                                      : "already published; evidence kept as a duplicate",
                 o.topic, (int)o.partition, (long long)o.offset, o.attempt_id);
        json_array_append_new(arr, item(id, k == OBX__RK_PRIMARY ? "published" : "duplicate", why));
        *refused = false;
    } else {
        snprintf(why, OBX_TEXT_MAX + 1, "%s: the acceptance point quarantined the evidence: %s", id,
                 obx_errmsg());
        json_array_append_new(arr, item(id, "quarantined", why));
    }
    return OBX_OK;
}

/* One event. Appends its item to arr; *refused when nothing could be done for it. */
static obx_err resolve_one(obx__engine *e, int64_t now, const obx__resolve_req *req, const char *id,
                           json_t *arr, bool *refused) {
    char why[OBX_TEXT_MAX + 1] = "";
    *refused = true;
    obx__rows rows = {0};
    obx_err err = obx__st_load_events(e->s, &id, 1, 0, &rows);
    if (err) return err;
    if (!rows.n) {
        obx__rows_free(&rows);
        snprintf(why, sizeof why, "%s: not in this outbox", id);
        json_array_append_new(arr, item(id, "refused", why));
        return OBX_OK;
    }
    obx__event_row ev = rows.v[0];
    ev.payload = NULL;
    obx__rows_free(&rows);
    if (ev.state != OBX__ST_DISPATCH_UNKNOWN) {
        refuse_state(why, sizeof why, &ev, now);
        json_array_append_new(arr, item(id, "refused", why));
        return OBX_OK;
    }
    err = req->accept ? resolve_accept(e, now, req, id, &ev, arr, refused, why)
                      : resolve_retry(e, now, req, id, &ev, arr, refused, why);
    if (err) return err;
    if (!*refused && !req->dry_run && e->s->on_resolved)
        e->s->on_resolved(e->s->on_resolved_user, &ev, req->accept ? "accept" : "retry", req->who);
    if (!*refused && e->on_note) {
        obx__note n = {.kind = OBX__NOTE_RESOLVED,
                       .event_id = id,
                       .attempt_id = ev.attempt_id,
                       .correlation_id = ev.env.correlation_id,
                       .latency_ms = -1,
                       .unknown_ms = -1,
                       .detail = why};
        e->on_note(e->on_note_user, &n);
    }
    return OBX_OK;
}

obx_err obx__resolve(obx__engine *e, int64_t now, const obx__resolve_req *req, json_t **out,
                     size_t *n_refused) {
    obx_err err;
    *out = NULL;
    *n_refused = 0;
    if ((err = obx__check_field("who", req->who, 1, OBX__OWNER_MAX, OBX__CS_OWNER)) ||
        (err = obx__check_field("reason", req->reason, 1, OBX_TEXT_MAX, OBX__CS_TEXT)))
        return err;
    if (req->accept && !req->consumer) {
        if (!req->payload_digest || !obx__is_digest(req->payload_digest))
            return obx__fail(OBX_EINVAL,
                             "payload_digest: accepting needs the digest the message at the broker "
                             "carries (its obx-payload-digest header, sha256:<64 hex>)");
        if (req->offset < 0)
            return obx__fail(OBX_EINVAL, "offset: accepting needs the message's offset (>= 0)");
        if (req->n_ids != 1)
            return obx__fail(OBX_EINVAL,
                             "event_id: evidence found at the broker is one message: give exactly "
                             "one event ID");
    }
    if (req->topic && *req->topic &&
        (err = obx__check_field("topic", req->topic, 1, OBX_TOPIC_MAX, OBX__CS_NAME)))
        return err;
    if (req->attempt_id && *req->attempt_id &&
        (err =
             obx__check_field("attempt_id", req->attempt_id, 1, OBX__ATTEMPT_ID_LEN, OBX__CS_NAME)))
        return err;
    for (size_t i = 0; i < req->n_ids; i++)
        if ((err = obx_event_id_check(req->ids[i]))) return err;
    if (!req->n_ids && !req->filter.event_type && !req->filter.held && !req->filter.unknown_before)
        return obx__fail(OBX_EINVAL,
                         "selector: give event IDs, or at least one of type, held, older than "
                         "(resolving every UNKNOWN at once must be asked for by name)");
    json_t *arr = json_array();
    if (!arr) return obx__fail(OBX_ENOMEM, "resolve: out of memory");
    size_t resolved = 0;
    if (req->n_ids) {
        for (size_t i = 0; !err && i < req->n_ids; i++) {
            bool refused;
            err = resolve_one(e, now, req, req->ids[i], arr, &refused);
            if (!err && refused) (*n_refused)++;
            if (!err && !refused) resolved++;
        }
    } else {
        static const obx__state only[] = {OBX__ST_DISPATCH_UNKNOWN};
        obx__event_filter f = req->filter;
        f.states = only;
        f.n_states = 1;
        f.limit = 500;
        for (;;) {
            obx__rows page = {0};
            if ((err = obx__st_read_events(
                     e->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &page)))
                break;
            for (size_t i = 0; !err && i < page.n; i++) {
                bool refused;
                err = resolve_one(e, now, req, page.v[i].env.event_id, arr, &refused);
                if (!err && refused) (*n_refused)++;
                if (!err && !refused) resolved++;
            }
            size_t got = page.n;
            if (got) f.after_seq = page.v[got - 1].seq;
            obx__rows_free(&page);
            if (err || got < f.limit) break;
        }
    }
    if (err) {
        json_decref(arr);
        return err;
    }
    *out = json_pack("{s:s,s:b,s:I,s:I,s:o}", "action", req->accept ? "accept" : "retry", "dry_run",
                     (int)req->dry_run, "resolved", (json_int_t)resolved, "refused",
                     (json_int_t)*n_refused, "events", arr);
    return *out ? OBX_OK : obx__fail(OBX_ENOMEM, "resolve: out of memory");
}

/* ---- the public entry --------------------------------------------------------------------- */

/* Evidence from a consumer's inbox counts only from a declared critical consumer: id=url must
 * be one of r->critical_consumers, ID and database alike. */
static obx_err declared(const obx_resolve_request *r, const char *id, const char *url) {
    size_t n = strlen(id);
    for (size_t i = 0; i < r->n_critical_consumers; i++) {
        const char *c = r->critical_consumers ? r->critical_consumers[i] : NULL;
        if (!c || strncmp(c, id, n) || c[n] != '=') continue;
        if (!strcmp(c + n + 1, url)) return OBX_OK;
        return obx__fail(OBX_EINVAL,
                         "consumer: %s is declared with another database "
                         "(audit.critical_consumers); its evidence comes from that one",
                         id);
    }
    return obx__fail(OBX_EINVAL,
                     "consumer: %s is not a declared critical consumer (audit.critical_consumers "
                     "of the relay's configuration): only their receipts are evidence",
                     id);
}

obx_err obx_resolve(obx_store *s, const obx_resolve_request *r, char **out, size_t *n_refused) {
    if (!s || !r || !out) return obx__fail(OBX_EINVAL, "resolve: NULL argument");
    *out = NULL;
    if (n_refused) *n_refused = 0;
    obx__clear_error();
    obx_err err;
    if ((err = obx__check_field("who", r->who, 1, OBX__OWNER_MAX, OBX__CS_OWNER)) ||
        (err = obx__check_field("reason", r->reason, 1, OBX_TEXT_MAX, OBX__CS_TEXT)))
        return err;
    if (!r->action || (strcmp(r->action, "retry") && strcmp(r->action, "accept")))
        return obx__fail(OBX_EINVAL, "action: '%s' unknown (retry or accept)",
                         r->action ? r->action : "(none)");
    if ((err = obx__check_field("event_type", r->event_type, 0, OBX_NAME_MAX, OBX__CS_EVENT_TYPE)))
        return err;
    if (r->n_event_ids > 100000)
        return obx__fail(OBX_ETOOBIG, "event_ids: %zu, over the limit of 100000", r->n_event_ids);
    if (r->n_event_ids && !r->event_ids) return obx__fail(OBX_EINVAL, "event_ids: NULL");
    if (r->n_event_ids && (r->event_type || r->held || r->older_than_ms))
        return obx__fail(OBX_EINVAL, "event_ids: given together with a selector (event_type, "
                                     "held, older_than): choose one");
    if (r->older_than_ms < 0)
        return obx__fail(OBX_EINVAL, "older_than_ms: %lld is negative",
                         (long long)r->older_than_ms);
    bool accept = !strcmp(r->action, "accept");
    if (!accept && (r->topic || r->payload_digest || r->attempt_id || r->consumer ||
                    r->offset > 0 || r->has_partition))
        return obx__fail(OBX_EINVAL, "action: evidence (topic, partition, offset, payload_digest, "
                                     "attempt_id, consumer) is only for accept");
    if (r->has_partition && r->partition < 0)
        return obx__fail(OBX_EINVAL, "partition: %d is negative", (int)r->partition);
    if (accept && r->consumer && (r->topic || r->payload_digest || r->attempt_id))
        return obx__fail(OBX_EINVAL, "consumer: evidence comes from the consumer's inbox or from "
                                     "the broker, not both");
    int64_t now = obx__st_now_ms(s);
    obx__critical crit;
    memset(&crit, 0, sizeof crit);
    if (accept && r->consumer) {
        const char *eq = strchr(r->consumer, '=');
        if (!eq || eq == r->consumer || (size_t)(eq - r->consumer) > OBX_NAME_MAX)
            return obx__fail(OBX_EINVAL, "consumer: '%.40s' is not ID=URL", r->consumer);
        memcpy(crit.id, r->consumer, (size_t)(eq - r->consumer));
        if ((err = obx__check_field("consumer", crit.id, 1, OBX_NAME_MAX, OBX__CS_NAME)) ||
            (err = declared(r, crit.id, eq + 1)))
            return err;
        /* the consumer's database is evidence, only read: a dry run or not, resolve writes
         * nothing there */
        if ((err = obx__st_open_with(eq + 1, OBX_STORE_READ_ONLY, &crit.s)))
            return obx__fail_prefix(err, "consumer");
    }
    obx__broker *b = NULL;
    if (accept && !r->consumer && r->broker_url &&
        (err = obx__br_open(r->broker_url, r->broker_props, r->n_broker_props, &b)))
        return obx__fail_prefix(err, "broker");
    obx__engine e;
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    obx__strlcpy(c.owner, r->who ? r->who : "", sizeof c.owner);
    obx__resolve_req q = {
        .ids = r->event_ids,
        .n_ids = r->n_event_ids,
        .filter = {.event_type = r->event_type,
                   .held = r->held != 0,
                   .unknown_before = r->older_than_ms ? now - r->older_than_ms : 0},
        .accept = accept,
        .topic = r->topic,
        .partition = r->has_partition ? r->partition : -1,
        .offset = r->offset,
        .payload_digest = r->payload_digest,
        .attempt_id = r->attempt_id,
        .consumer = crit.s ? &crit : NULL,
        .who = r->who,
        .reason = r->reason,
        .dry_run = r->dry_run != 0};
    size_t refused = 0;
    json_t *doc = NULL;
    err = obx__engine_init(&e, s, b, &c);
    if (!err) err = obx__resolve(&e, now, &q, &doc, &refused);
    obx__st_close(crit.s);
    obx__br_close(b);
    if (err) return err;
    if (n_refused) *n_refused = refused;
    return obx__json_out(doc, out);
}
