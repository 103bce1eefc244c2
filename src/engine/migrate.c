/*
 * migrate.c — destination migration (docs/migration.md) and delivery-set target addition
 * (docs/migration.md). Owns the decision whether an event may leave its frozen destination (the
 * proof that the old target did not accept it), the new envelope generation, the MIGRATION
 * receipt, and the addition of a publish slot to an event's delivery set.
 *
 * Contracts:
 *   1. An event moves only with proof for every attempt of its current envelope generation:
 *      never sent (no attempt), a definite rejection (REJECTED), or an authoritative NOT_FOUND
 *      (recorded by the reconciler, or this migrator's own lookup of the attempts still UNKNOWN
 *      or SENDING, through a broker connected to the old target's cluster, past their quiet
 *      time: obx__br_lookup never answers NOT_FOUND earlier). Anything else is refused with a
 *      reason that names the blocking attempt (or claim).
 *   2. Only PENDING, PARKED and RETRY_CLAIMED events move (core/states.c). SENDING and CLAIMED
 *      events are in a dispatcher's hands, DISPATCH_UNKNOWN and RECONCILING ones are resolved by
 *      the reconciler first (an UNKNOWN event never returns to PENDING), a published one was
 *      accepted by its target.
 *   3. One transaction per event. The row is locked and must be as it was when the proof was
 *      made (state, claim and envelope generations, every attempt of the generation and its
 *      state); then: the new envelope generation (the original envelope is never edited), the
 *      event row back to PENDING on it (claim_gen + 1 fences any holder; attempt fields and
 *      pinned partition reset), the attempts the lookup proved absent marked NOT_FOUND, the
 *      MIGRATION receipt (old and new digests, the proof, who, when) and the audit row.
 *   4. After the move a receipt for an attempt of the old generation contradicts the proof: the
 *      acceptance point quarantines it (accept.c, rule 2).
 *   5. Adding a target leaves the event's slots untouched and needs an authoritative NOT_FOUND of
 *      the event at the new target (the new slot starts empty truthfully); the new slot is a
 *      further target of the event's delivery set (one is formed, with the requested rule, when
 *      the event had none). A destination the event already has is refused. The new slot takes
 *      the route target's number unless the set has it (the event's own row is target 1 of a set
 *      formed now): then the next free one.
 *   6. A new route generation asked with the migration (req->route) is written in one
 *      transaction with every event's change, after all proofs, and only when at least one
 *      event changes: a dry run, a run where every event is refused, and a store failure leave
 *      the routes and every event as they were.
 */
#include "engine/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An attempt of the current generation as the proof saw it. */
typedef struct seen_att {
    char id[OBX__ATTEMPT_ID_LEN + 1];
    obx__attempt_state state;
    bool looked_up; /* SENDING/UNKNOWN, proven absent by this migrator's lookup */
} seen_att;

typedef struct plan {
    obx__event_row row; /* as seen (payload not loaded) */
    seen_att *att;
    size_t n_att;
    json_t *proof; /* {kind, attempts[], lookup} */
    char lookup_reason[OBX_TEXT_MAX + 1];
    obx__dest dest; /* the new destination */
    char dest_digest[OBX_DIGEST_LEN + 1];
    int32_t target_no;    /* add_target: the route generation's target (its destination) */
    int32_t slot_no;      /* add_target: the new slot's number in the event's delivery set */
    obx__delivery_row ds; /* add_target: the event's set as seen (n = 0: none) */
    char completion[8];   /* add_target: the set's rule */
    char why[OBX_TEXT_MAX + 1];
} plan;

/* An event whose change waits for the transaction that writes the new route (contract 6). */
typedef struct pend {
    plan p;
    json_t *item; /* borrowed: the result's */
    bool changed;
    char slot_id[OBX_EVENT_ID_LEN + 1];
} pend;

typedef struct mig {
    obx__engine *e;
    int64_t now;
    const obx__migrate_req *req;
    obx__route_row *routes; /* every generation (route_list all), the new one's last */
    size_t n_routes;
    int64_t route_gen;         /* the destination generation (0 = the type's current) */
    obx__route_row *new_route; /* req->route's row in routes (its gen provisional until written) */
    pend *pend;                /* with new_route and no dry run: the changes to write */
    size_t n_pend;
    bool route_written;
    char first[OBX_TEXT_MAX + 64]; /* the first refusal, for the caller's error message */
} mig;

static void plan_free(plan *p) {
    free(p->att);
    json_decref(p->proof);
    memset(p, 0, sizeof *p);
}

static const obx__route_row *route_of(mig *m, const char *type, int64_t gen) {
    const obx__route_row *best = NULL;
    for (size_t i = 0; i < m->n_routes; i++) {
        const obx__route_row *r = &m->routes[i];
        if (gen ? r->gen == gen : (!strcmp(r->event_type, type) && (!best || r->gen > best->gen)))
            best = r;
    }
    return best;
}

static json_t *dest_json(int32_t gen, const obx__dest *d, const char *digest, const char *env_dg) {
    return json_pack("{s:i,s:s,s:s,s:s,s:I,s:s,s:s}", "envelope_gen", (int)gen, "cluster",
                     d->cluster, "topic", d->topic, "routing_key", d->routing_key, "route_gen",
                     (json_int_t)d->route_gen, "dest_digest", digest, "envelope_digest",
                     env_dg ? env_dg : "");
}

/* The envelope digest of the logical event (its wire ID) at generation gen. */
static obx_err logical_digest(const obx__event_row *r, int32_t gen, char out[OBX_DIGEST_LEN + 1]) {
    obx__envelope env = r->env;
    obx__strlcpy(env.event_id, obx__wire_id(r), sizeof env.event_id);
    env.envelope_gen = gen;
    return obx__envelope_digest(&env, out);
}

/* A lookup of the event at destination d (partition p) for generation gen: false with p->why
 * set when the target cannot be queried from this engine's broker. */
static bool lookup(mig *m, plan *p, const obx__event_row *r, const obx__dest *d, const char *digest,
                   int32_t partition, int32_t gen, int64_t since, int64_t quiet_until,
                   obx__lookup_res *res) {
    obx__engine *e = m->e;
    memset(res, 0, sizeof *res);
    if (!e->b) {
        snprintf(p->why, sizeof p->why, "no broker connection to query cluster %.40s", d->cluster);
        return false;
    }
    if (strcmp(e->cluster, d->cluster)) {
        snprintf(p->why, sizeof p->why, "the broker given is cluster %.40s, not %.40s", e->cluster,
                 d->cluster);
        return false;
    }
    obx__lookup_req q = {.dest = d,
                         .dest_digest = digest,
                         .partition = partition,
                         .event_id = obx__wire_id(r),
                         .envelope_gen = gen,
                         .since = since,
                         .quiet_until = quiet_until,
                         .now = m->now};
    /* A new target's route generation is written with the migration, so it is not in the store
     * yet (OBX_ENOTFOUND); its key does not matter here: any copy under the event ID is
     * presence, sealed or not (below) */
    obx_err ke = obx__lookup_keys(e, d->route_gen, &q);
    if (ke == OBX_ENOTFOUND) ke = OBX_OK;
    if (ke || obx__br_lookup(e->b, &q, res)) {
        e->st.broker_errors++;
        res->kind = OBX__LOOKUP_CANNOT_TELL;
        snprintf(res->reason, sizeof res->reason, "lookup failed: %s", obx_errmsg());
    } else if (res->kind != OBX__LOOKUP_FOUND && res->n_bad) {
        /* a proof of absence: any copy under the ID is presence, its bytes right or not */
        res->found = res->bad;
        res->kind = OBX__LOOKUP_FOUND;
    }
    return true;
}

static json_t *lookup_json(const obx__dest *d, int32_t partition, const obx__lookup_res *res) {
    return json_pack("{s:s,s:s,s:i,s:s,s:s}", "cluster", d->cluster, "topic", d->topic, "partition",
                     (int)partition, "result",
                     res->kind == OBX__LOOKUP_FOUND       ? "FOUND"
                     : res->kind == OBX__LOOKUP_NOT_FOUND ? "NOT_FOUND"
                                                          : "CANNOT_TELL",
                     "reason", res->reason);
}

/* ---- moving an event: the proof (contracts 1 and 2) ------------------------------------------ */

static bool undecided(obx__attempt_state s) { return s == OBX__AT_SENDING || s == OBX__AT_UNKNOWN; }

/* What prove_absent learns from the attempts of the event's current generation. */
typedef struct att_tally {
    const obx__attempt_row *open; /* the first SENDING/UNKNOWN attempt (in the loaded array) */
    int64_t since, quiet;         /* earliest start, latest quiet time of the undecided ones */
    int rejected, not_found, n_undecided;
} att_tally;

/* Records the current generation's attempts (att, n) in p->att and counts them in *t; the first
 * attempt the old target answered for (ACCEPTED, DUPLICATE, QUARANTINED) sets p->why. */
static void tally_attempts(plan *p, const obx__attempt_row *att, size_t n, att_tally *t) {
    const obx__event_row *r = &p->row;
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        const obx__attempt_row *a = &att[i];
        if (a->envelope_gen != r->envelope_gen) continue; /* a superseded generation's */
        seen_att *s = &p->att[p->n_att++];
        obx__strlcpy(s->id, a->attempt_id, sizeof s->id);
        s->state = a->state;
        if (undecided(a->state)) {
            if (!t->open) t->open = a;
            t->n_undecided++;
            if (!t->since || a->started_at < t->since) t->since = a->started_at;
            if (a->quiet_until > t->quiet) t->quiet = a->quiet_until;
        } else if (a->state == OBX__AT_REJECTED)
            t->rejected++;
        else if (a->state == OBX__AT_NOT_FOUND)
            t->not_found++;
        else if (!*p->why) /* ACCEPTED, DUPLICATE, QUARANTINED */
            snprintf(p->why, sizeof p->why,
                     "attempt %s is %s: the old target answered for it; it is not moved",
                     a->attempt_id, obx__attempt_state_name(a->state));
    }
}

/* Undecided attempts (t->open the first) that may have been persisted: asks the old target once;
 * only an authoritative NOT_FOUND clears them (marked looked_up, the answer in p->lookup_reason,
 * in p->proof); any other answer sets p->why. */
static void look_up_undecided(mig *m, plan *p, const att_tally *t) {
    obx__event_row *r = &p->row;
    const obx__attempt_row *open = t->open;
    obx__lookup_res res;
    if (!lookup(m, p, r, &r->dest, r->dest_digest, r->pinned_partition, r->envelope_gen, t->since,
                t->quiet, &res)) {
        char tmp[OBX_TEXT_MAX + 1];
        obx__strlcpy(tmp, p->why, sizeof tmp);
        snprintf(p->why, sizeof p->why,
                 "attempt %s is %s and the old target cannot be queried (%s); not moved",
                 open->attempt_id, obx__attempt_state_name(open->state), tmp);
        return;
    }
    json_object_set_new(p->proof ? p->proof : (p->proof = json_object()), "lookup",
                        lookup_json(&r->dest, r->pinned_partition, &res));
    if (res.kind == OBX__LOOKUP_FOUND)
        snprintf(p->why, sizeof p->why,
                 "attempt %s is %s and the old target holds it (%.60s/%d@%lld): it was "
                 "accepted there (the reconciler records its receipt); not moved",
                 open->attempt_id, obx__attempt_state_name(open->state), res.found.topic,
                 (int)res.found.partition, (long long)res.found.offset);
    else if (res.kind == OBX__LOOKUP_CANNOT_TELL)
        snprintf(p->why, sizeof p->why,
                 "attempt %s is %s and the old target cannot be queried (%.120s); not "
                 "moved",
                 open->attempt_id, obx__attempt_state_name(open->state), res.reason);
    else if (r->state == OBX__ST_DISPATCH_UNKNOWN || r->state == OBX__ST_RECONCILING)
        snprintf(p->why, sizeof p->why,
                 "attempt %s is UNKNOWN (event %s): the old target does not hold it, but "
                 "the reconciler resolves an UNKNOWN event first (it retries the frozen "
                 "target; once that is definitely rejected the event can move)",
                 open->attempt_id, obx__state_name(r->state));
    else { /* authoritative NOT_FOUND: the undecided attempts are proven absent */
        obx__strlcpy(p->lookup_reason, res.reason, sizeof p->lookup_reason);
        for (size_t i = 0; i < p->n_att; i++)
            if (undecided(p->att[i].state)) p->att[i].looked_up = true;
    }
}

/* Whether the event's state and its attempts (counted in *t) let it move: sets p->why when not,
 * asking the old target about undecided attempts (look_up_undecided) when nothing else blocks. */
static void check_movable(mig *m, plan *p, const att_tally *t) {
    const obx__event_row *r = &p->row;
    const char *st = obx__state_name(r->state);
    char lease[32]; /* why reaches operators: ISO, not epoch ms */
    obx__iso_ms(r->lease_until, lease);
    if (obx__state_is_published(r->state)) {
        snprintf(p->why, sizeof p->why,
                 "event is %s: the old target accepted attempt %s (its primary receipt); a "
                 "delivered event is not moved",
                 st, r->primary_attempt_id);
    } else if (r->state == OBX__ST_CLAIMED) {
        snprintf(p->why, sizeof p->why,
                 "event is CLAIMED by %.60s (claim_gen %lld, lease until %s): a dispatcher may be "
                 "about to send; retry after the lease",
                 r->owner, (long long)r->claim_gen, lease);
    } else if (r->state == OBX__ST_SENDING) {
        snprintf(p->why, sizeof p->why,
                 "attempt %s is SENDING (owner %.60s, lease until %s): its outcome is not known "
                 "yet",
                 r->attempt_id, r->owner, lease);
    } else if (!*p->why && t->n_undecided &&
               !(OBX__MUTANT(MIGRATE_WHILE_UNKNOWN) && r->state != OBX__ST_DISPATCH_UNKNOWN &&
                 r->state != OBX__ST_RECONCILING)) {
        look_up_undecided(m, p, t);
    } else if (!*p->why &&
               (r->state == OBX__ST_DISPATCH_UNKNOWN || r->state == OBX__ST_RECONCILING)) {
        snprintf(p->why, sizeof p->why,
                 "event is %s with no undecided attempt: the reconciler resolves it first", st);
    }
    if (!*p->why && r->state != OBX__ST_PENDING && r->state != OBX__ST_PARKED &&
        r->state != OBX__ST_RETRY_CLAIMED)
        snprintf(p->why, sizeof p->why, "event is %s: not movable", st);
}

/* The proof for every attempt of the event's current generation (contracts 1 and 2): on *ok,
 * p->att and p->proof are filled; otherwise p->why names what blocks the move (an OBX_OK
 * return: a refusal is a decision, not a failure). */
static obx_err prove_absent(mig *m, plan *p, bool *ok) {
    obx__event_row *r = &p->row;
    *ok = false;
    obx__attempt_row *att = NULL;
    size_t n = 0;
    obx_err err = obx__st_load_attempts(m->e->s, NULL, 0, r->env.event_id, &att, &n);
    if (err) return err;
    p->att = calloc(n ? n : 1, sizeof *p->att);
    json_t *ja = json_array();
    if (!p->att || !ja) {
        free(att);
        json_decref(ja);
        return obx__fail(OBX_ENOMEM, "migrate: out of memory");
    }
    att_tally t;
    tally_attempts(p, att, n, &t);
    check_movable(m, p, &t);
    /* the proof, attempt by attempt */
    for (size_t i = 0; !*p->why && i < p->n_att; i++) {
        const obx__attempt_row *a = NULL;
        for (size_t k = 0; k < n; k++)
            if (!strcmp(att[k].attempt_id, p->att[i].id)) a = &att[k];
        const char *by = p->att[i].looked_up             ? "migrator lookup"
                         : a->state == OBX__AT_REJECTED  ? "broker"
                         : a->state == OBX__AT_NOT_FOUND ? "reconciler lookup"
                                                         : "mutation";
        json_array_append_new(
            ja, json_pack("{s:s,s:s,s:s,s:s}", "attempt_id", a->attempt_id, "state",
                          p->att[i].looked_up ? "NOT_FOUND" : obx__attempt_state_name(a->state),
                          "proven_by", by, "detail",
                          p->att[i].looked_up ? p->lookup_reason : a->detail));
    }
    free(att);
    if (*p->why) {
        json_decref(ja);
        return OBX_OK;
    }
    const char *kind = "rejected+not_found";
    if (!p->n_att)
        kind = "never_sent";
    else if (!t.not_found && !t.n_undecided)
        kind = "rejected";
    else if (!t.rejected)
        kind = "not_found";
    if (!p->proof) p->proof = json_object();
    json_object_set_new(p->proof, "kind", json_string(kind));
    json_object_set_new(p->proof, "attempts", ja);
    *ok = true;
    return OBX_OK;
}

/* The new destination of a moved slot: the route generation's own (target 1) or its target of
 * the same number; refused when it is where the slot is, or another target of its set. */
static obx_err new_destination(mig *m, plan *p, bool *ok) {
    obx__event_row *r = &p->row;
    *ok = false;
    const obx__route_row *route = route_of(m, r->env.event_type, m->route_gen);
    if (!route) {
        snprintf(p->why, sizeof p->why, "no route for %.60s: set one first (obx route set)",
                 r->env.event_type);
        return OBX_OK;
    }
    if (strcmp(route->event_type, r->env.event_type)) {
        snprintf(p->why, sizeof p->why, "route generation %lld is for %.60s, the event is %.60s",
                 (long long)route->gen, route->event_type, r->env.event_type);
        return OBX_OK;
    }
    obx__route_set_row set;
    const obx__route_target_row *t = NULL;
    int32_t want = m->req->add_target ? p->target_no : (r->target_no > 1 ? r->target_no : 1);
    if (want > 1) {
        obx_err e =
            route->targets ? obx__st_route_set_get(m->e->s, route->gen, &set) : OBX_ENOTFOUND;
        if (e && e != OBX_ENOTFOUND) return e;
        for (int32_t i = 0; !e && i < set.n; i++)
            if (set.t[i].target_no == want) t = &set.t[i];
        if (!t) {
            obx__clear_error();
            snprintf(p->why, sizeof p->why, "route generation %lld declares no target %d",
                     (long long)route->gen, (int)want);
            return OBX_OK;
        }
    }
    obx_err e = obx__dest_for(route, t, &r->env, &p->dest, p->dest_digest);
    if (e) return e;
    if (!m->req->add_target && !strcmp(p->dest.cluster, r->dest.cluster) &&
        !strcmp(p->dest.topic, r->dest.topic) &&
        !strcmp(p->dest.routing_key, r->dest.routing_key)) {
        snprintf(p->why, sizeof p->why,
                 "destination unchanged (%.40s/%.60s, route generation %lld): a retry to the same "
                 "target is not a migration (obx requeue)",
                 p->dest.cluster, p->dest.topic, (long long)route->gen);
        return OBX_OK;
    }
    /* a delivery set names each destination once */
    if (p->ds.n) {
        const char *ids[OBX__SET_MAX];
        for (int32_t i = 0; i < p->ds.n; i++) ids[i] = p->ds.t[i].slot_id;
        obx__rows slots = {0};
        if ((e = obx__st_load_events(m->e->s, ids, (size_t)p->ds.n, 0, &slots))) return e;
        for (size_t i = 0; i < slots.n; i++) {
            const obx__event_row *o = &slots.v[i];
            if (!m->req->add_target && !strcmp(o->env.event_id, r->env.event_id)) continue;
            if (!strcmp(o->dest.cluster, p->dest.cluster) && !strcmp(o->dest.topic, p->dest.topic))
                snprintf(p->why, sizeof p->why,
                         "%.40s/%.60s is target %d of this event already (slot %s)",
                         p->dest.cluster, p->dest.topic, (int)o->target_no, o->env.event_id);
        }
        obx__rows_free(&slots);
        if (*p->why) return OBX_OK;
    } else if (m->req->add_target && !strcmp(p->dest.cluster, r->dest.cluster) &&
               !strcmp(p->dest.topic, r->dest.topic)) {
        snprintf(p->why, sizeof p->why, "%.40s/%.60s is the event's own destination already",
                 p->dest.cluster, p->dest.topic);
        return OBX_OK;
    }
    *ok = true;
    return OBX_OK;
}

/* ---- moving an event: the transaction (contract 3) --------------------------------------------
 */

typedef struct move_ctx {
    mig *m;
    plan *p;
    bool changed;
    char receipt_reason[OBX_TEXT_MAX + 1];
    char *detail; /* the receipt's JSON */
    obx__event_row next;
} move_ctx;

/* The locked row and attempts are still what the proof saw. */
static obx_err unchanged(obx__engine *e, const plan *p, const obx__event_row *cur, bool *same) {
    *same = cur->state == p->row.state && cur->claim_gen == p->row.claim_gen &&
            cur->envelope_gen == p->row.envelope_gen;
    if (!*same) return OBX_OK;
    obx__attempt_row *att = NULL;
    size_t n = 0, k = 0;
    obx_err err = obx__st_load_attempts(e->s, NULL, 0, cur->env.event_id, &att, &n);
    if (err) return err;
    for (size_t i = 0; *same && i < n; i++) {
        if (att[i].envelope_gen != cur->envelope_gen) continue;
        bool found = false;
        for (size_t j = 0; j < p->n_att; j++)
            if (!strcmp(p->att[j].id, att[i].attempt_id)) found = p->att[j].state == att[i].state;
        *same = found;
        k++;
    }
    if (*same) *same = k == p->n_att;
    free(att);
    return OBX_OK;
}

static obx_err move_tx(obx__engine *e, void *arg) {
    move_ctx *c = arg;
    mig *m = c->m;
    plan *p = c->p;
    const char *id = p->row.env.event_id;
    obx__rows cur = {0};
    obx__attempt_row *att = NULL;
    size_t n_att = 0;
    c->changed = false;
    obx_err err = obx__st_load_events(e->s, &id, 1, OBX__LOAD_LOCK | OBX__LOAD_PAYLOAD, &cur);
    if (!err && cur.n != 1) err = obx__fail(OBX_ENOTFOUND, "migrate: event %s vanished", id);
    bool same = false;
    if (!err) err = unchanged(e, p, &cur.v[0], &same);
    if (!err && !same) c->changed = true;
    if (err || c->changed) {
        obx__rows_free(&cur);
        return err;
    }
    obx__event_row *ev = &cur.v[0];
    if (ev->payload_purged) {
        obx__rows_free(&cur);
        return obx__fail(OBX_EREFUSED, "event %s: its payload was purged", id);
    }
    if ((err = obx__st_load_attempts(e->s, NULL, 0, id, &att, &n_att))) {
        obx__rows_free(&cur);
        return err;
    }
    obx__batch b;
    if ((err = obx__batch_reserve(&b, 1, n_att, 1, 1))) {
        obx__rows_free(&cur);
        free(att);
        return err;
    }
    /* the new generation: the same envelope, the new frozen destination */
    obx__event_row *next = &c->next;
    *next = *ev;
    next->payload = NULL;
    next->envelope_gen = ev->envelope_gen + 1;
    next->env.envelope_gen = next->envelope_gen;
    next->dest = p->dest;
    obx__strlcpy(next->dest_digest, p->dest_digest, sizeof next->dest_digest);
    if (!err) err = logical_digest(ev, next->envelope_gen, next->envelope_digest);
    next->state = OBX__ST_PENDING;
    next->claim_gen = ev->claim_gen + 1;
    next->owner[0] = '\0';
    next->lease_until = 0;
    next->attempt_gen = 0;
    next->attempt_id[0] = '\0';
    next->pinned_partition = -1;
    next->rejections = 0;
    next->available_at = m->now > ev->env.not_before ? m->now : ev->env.not_before; /* a delay */
    next->next_check_at = 0;
    next->unknown_since = 0;
    next->updated_at = m->now;
    if (!err && !obx__transition_allowed(ev->state, OBX__ST_PENDING, OBX__ACT_MIGRATOR))
        err = obx__fail(OBX_EINTERNAL, "migrate: %s -> PENDING is not in the table",
                        obx__state_name(ev->state));
    if (!err) {
        obx__event_row gen_row = *next; /* the envelope row is created now */
        gen_row.committed_at = m->now;
        err = obx__st_insert_envelope(e->s, &gen_row, ev->payload, ev->payload_len);
    }
    for (size_t i = 0; !err && i < n_att; i++) {
        bool proven = false;
        for (size_t k = 0; k < p->n_att; k++)
            if (!strcmp(p->att[k].id, att[i].attempt_id)) proven = p->att[k].looked_up;
        if (!proven) continue;
        att[i].state = OBX__AT_NOT_FOUND;
        att[i].ended_at = m->now;
        snprintf(att[i].detail, sizeof att[i].detail, "NOT_FOUND (migrator lookup): %s",
                 p->lookup_reason);
        b.att[b.n_att++] = att[i];
    }
    if (!err) {
        obx__batch_update(&b, ev, next);
        obx__receipt_row *rc = &b.rc[b.n_rc++];
        memset(rc, 0, sizeof *rc);
        obx__strlcpy(rc->event_id, id, sizeof rc->event_id);
        rc->envelope_gen = next->envelope_gen;
        rc->kind = OBX__RK_MIGRATION;
        obx__strlcpy(rc->cluster, next->dest.cluster, sizeof rc->cluster);
        obx__strlcpy(rc->topic, next->dest.topic, sizeof rc->topic);
        rc->partition = -1;
        rc->offset = -1;
        obx__strlcpy(rc->payload_digest, ev->env.payload_digest, sizeof rc->payload_digest);
        obx__strlcpy(rc->dest_digest, next->dest_digest, sizeof rc->dest_digest);
        obx__strlcpy(rc->reason, c->receipt_reason, sizeof rc->reason);
        rc->detail = c->detail;
        rc->created_at = m->now;
        obx__audit(&b.au[b.n_au++], m->now, OBX__ACT_MIGRATOR, m->req->who, next, ev->state,
                   OBX__ST_PENDING, "%s", c->receipt_reason);
        err = obx__batch_write(e->s, &b);
    }
    obx__batch_free(&b);
    obx__rows_free(&cur);
    free(att);
    return err;
}

/* ---- adding a target (contract 5) --------------------------------------------------------------
 */

static obx_err prove_new_target(mig *m, plan *p, bool *ok) {
    obx__event_row *r = &p->row;
    *ok = false;
    int32_t partition = -1;
    obx__engine *e = m->e;
    if (e->b && !strcmp(e->cluster, p->dest.cluster)) {
        obx_err err = obx__br_partition_for(e->b, &p->dest, &partition);
        if (err) {
            e->st.broker_errors++;
            snprintf(p->why, sizeof p->why, "the new target cannot be queried (%.160s)",
                     obx_errmsg());
            return OBX_OK;
        }
    }
    /* the event under any generation number one of its slots has had: a lookup for each */
    int32_t max_gen = r->envelope_gen;
    if (p->ds.n) {
        const char *ids[OBX__SET_MAX];
        for (int32_t i = 0; i < p->ds.n; i++) ids[i] = p->ds.t[i].slot_id;
        obx__rows slots = {0};
        obx_err err = obx__st_load_events(e->s, ids, (size_t)p->ds.n, 0, &slots);
        for (size_t i = 0; !err && i < slots.n; i++)
            if (slots.v[i].envelope_gen > max_gen) max_gen = slots.v[i].envelope_gen;
        obx__rows_free(&slots);
        if (err) return err;
    }
    json_t *looks = json_array();
    if (!looks) return obx__fail(OBX_ENOMEM, "migrate: out of memory");
    for (int32_t gen = 1; gen <= max_gen; gen++) {
        obx__lookup_res res;
        if (!lookup(m, p, r, &p->dest, p->dest_digest, partition, gen, 0, 0, &res)) {
            char tmp[OBX_TEXT_MAX + 1];
            obx__strlcpy(tmp, p->why, sizeof tmp);
            snprintf(p->why, sizeof p->why,
                     "the new target cannot be queried (%s): its absence there is the proof a "
                     "target needs",
                     tmp);
            break;
        }
        json_array_append_new(looks, lookup_json(&p->dest, partition, &res));
        if (res.kind == OBX__LOOKUP_FOUND) {
            snprintf(p->why, sizeof p->why,
                     "the new target holds the event already (%.60s/%d@%lld, generation %d): it "
                     "was published there outside this slot",
                     res.found.topic, (int)res.found.partition, (long long)res.found.offset,
                     (int)gen);
            break;
        }
        if (res.kind != OBX__LOOKUP_NOT_FOUND) {
            snprintf(p->why, sizeof p->why, "the new target cannot tell (%.160s)", res.reason);
            break;
        }
    }
    if (*p->why) {
        json_decref(looks);
        return OBX_OK;
    }
    p->proof = json_pack("{s:s,s:o}", "kind", "not_on_new_target", "lookups", looks);
    *ok = p->proof != NULL;
    return p->proof ? OBX_OK : obx__fail(OBX_ENOMEM, "migrate: out of memory");
}

typedef struct add_ctx {
    mig *m;
    plan *p;
    bool changed;
    char slot_id[OBX_EVENT_ID_LEN + 1];
    char receipt_reason[OBX_TEXT_MAX + 1];
    char *detail;
} add_ctx;

static obx_err add_tx(obx__engine *e, void *arg) {
    add_ctx *c = arg;
    mig *m = c->m;
    plan *p = c->p;
    const char *id = p->row.env.event_id;
    obx__rows cur = {0};
    c->changed = false;
    obx_err err = obx__st_load_events(e->s, &id, 1, OBX__LOAD_LOCK | OBX__LOAD_PAYLOAD, &cur);
    if (!err && cur.n != 1) err = obx__fail(OBX_ENOTFOUND, "migrate: event %s vanished", id);
    obx__delivery_row ds;
    memset(&ds, 0, sizeof ds);
    if (!err) {
        err = obx__st_delivery_get(e->s, id, &ds);
        if (err == OBX_ENOTFOUND) {
            obx__clear_error();
            err = OBX_OK;
            ds.n = 0;
        }
    }
    /* The set's completion rule never changes (docs/migration.md): this engine is the one place
     * that holds to it, the store writes what it is given. The plan took the rule from the set
     * it saw (or refused another); a set that came or changed since is decided again. */
    if (!err && (ds.n != p->ds.n || cur.v[0].envelope_gen != p->row.envelope_gen ||
                 (ds.n && strcmp(ds.completion, p->completion)))) {
        c->changed = true; /* another target came, or the event moved: decide again */
        obx__rows_free(&cur);
        return OBX_OK;
    }
    if (err) {
        obx__rows_free(&cur);
        return err;
    }
    obx__event_row *ev = &cur.v[0];
    obx__event_row *slot = malloc(sizeof *slot);
    if (!slot) {
        obx__rows_free(&cur);
        return obx__fail(OBX_ENOMEM, "migrate: out of memory");
    }
    /* the event's envelope under a new slot key, the new frozen destination, a fresh slot */
    *slot = *ev;
    slot->seq = 0; /* the store draws the slot's own (its audit row must not carry ev's) */
    slot->payload = NULL;
    slot->envelope_gen = 1;
    slot->env.envelope_gen = 1;
    slot->target_no = p->slot_no;
    slot->dest = p->dest;
    obx__strlcpy(slot->dest_digest, p->dest_digest, sizeof slot->dest_digest);
    err = logical_digest(ev, 1, slot->envelope_digest);
    obx__strlcpy(slot->env.event_id, c->slot_id, sizeof slot->env.event_id);
    slot->state = OBX__ST_PENDING;
    slot->claim_gen = 0;
    slot->owner[0] = '\0';
    slot->lease_until = 0;
    slot->attempt_gen = 0;
    slot->attempt_id[0] = '\0';
    slot->pinned_partition = -1;
    slot->rejections = 0;
    slot->available_at = m->now > ev->env.not_before ? m->now : ev->env.not_before; /* a delay */
    slot->next_check_at = 0;
    slot->unknown_since = 0;
    slot->primary_attempt_id[0] = '\0';
    slot->published_at = 0;
    slot->committed_at = m->now;
    slot->updated_at = m->now;
    if (!err) err = obx__st_insert_event(e->s, slot, ev->payload, ev->payload_len);
    obx__delivery_row d;
    memset(&d, 0, sizeof d);
    obx__strlcpy(d.event_id, id, sizeof d.event_id);
    obx__strlcpy(d.completion, p->completion, sizeof d.completion);
    d.route_gen = ds.n ? ds.route_gen : 0;
    d.created_at = ds.n ? ds.created_at : m->now;
    if (!ds.n) { /* the event's own row becomes target 1 of the set formed now */
        d.t[d.n] = (obx__delivery_target_row){.target_no = 1, .created_at = ev->committed_at};
        obx__strlcpy(d.t[d.n].slot_id, id, sizeof d.t[d.n].slot_id);
        obx__strlcpy(d.t[d.n].origin, "enqueue", sizeof d.t[d.n].origin);
        d.n++;
    }
    d.t[d.n] = (obx__delivery_target_row){.target_no = p->slot_no, .created_at = m->now};
    obx__strlcpy(d.t[d.n].slot_id, slot->env.event_id, sizeof d.t[d.n].slot_id);
    obx__strlcpy(d.t[d.n].origin, "migration", sizeof d.t[d.n].origin);
    d.n++;
    if (!err) err = obx__st_delivery_put(e->s, &d);
    obx__receipt_row rc;
    memset(&rc, 0, sizeof rc);
    obx__strlcpy(rc.event_id, id, sizeof rc.event_id);
    rc.envelope_gen = ev->envelope_gen;
    rc.kind = OBX__RK_MIGRATION;
    obx__strlcpy(rc.cluster, p->dest.cluster, sizeof rc.cluster);
    obx__strlcpy(rc.topic, p->dest.topic, sizeof rc.topic);
    rc.partition = -1;
    rc.offset = -1;
    obx__strlcpy(rc.payload_digest, ev->env.payload_digest, sizeof rc.payload_digest);
    obx__strlcpy(rc.dest_digest, p->dest_digest, sizeof rc.dest_digest);
    obx__strlcpy(rc.reason, c->receipt_reason, sizeof rc.reason);
    rc.detail = c->detail;
    rc.created_at = m->now;
    if (!err) err = obx__st_insert_receipts(e->s, &rc, 1);
    obx__audit_row au[2];
    obx__audit(&au[0], m->now, OBX__ACT_MIGRATOR, m->req->who, slot, OBX__ST_NONE, OBX__ST_PENDING,
               "target %d of %s added: %s", (int)p->slot_no, id, c->receipt_reason);
    obx__audit(&au[1], m->now, OBX__ACT_MIGRATOR, m->req->who, ev, ev->state, ev->state, "%s",
               c->receipt_reason);
    if (!err) err = obx__st_insert_audit(e->s, au, 2);
    free(slot);
    obx__rows_free(&cur);
    return err;
}

/* ---- one event
 * ----------------------------------------------------------------------------------- */

static char *receipt_detail(mig *m, plan *p, const char *kind, const char *slot_id) {
    obx__event_row *r = &p->row;
    char new_dg[OBX_DIGEST_LEN + 1] = "";
    int32_t new_gen = m->req->add_target ? 1 : r->envelope_gen + 1;
    if (logical_digest(r, new_gen, new_dg)) return NULL;
    json_t *d =
        json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:s,s:o,s:o,s:O}", "schema", "obx.migrationReceipt.v1",
                  "kind", kind, "event_id", obx__wire_id(r), "slot_id", slot_id, "who", m->req->who,
                  "at_ms", (json_int_t)m->now, "reason", m->req->reason ? m->req->reason : "",
                  "old", dest_json(r->envelope_gen, &r->dest, r->dest_digest, r->envelope_digest),
                  "new", dest_json(new_gen, &p->dest, p->dest_digest, new_dg), "proof", p->proof);
    if (!d) return NULL;
    if (m->req->add_target) {
        json_object_set_new(d, "target", json_integer(p->slot_no));
        json_object_set_new(d, "completion", json_string(p->completion));
    }
    char *txt = json_dumps(d, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(d);
    return txt;
}

static void refuse(mig *m, json_t *item, plan *p, size_t *n_refused) {
    json_object_set_new(item, "outcome", json_string("refused"));
    json_object_set_new(item, "reason", json_string(p->why));
    if (p->proof) json_object_set(item, "evidence", p->proof);
    if (!*n_refused)
        snprintf(m->first, sizeof m->first, "event %s: %s", p->row.env.event_id, p->why);
    (*n_refused)++;
}

/* The new slot's number in the event's delivery set: the route target's own, unless the set
 * (or the event's own row, target 1 of the set formed now) has it: then the next free one. */
static void slot_number(plan *p, int32_t next) {
    bool taken = !p->ds.n && p->target_no == 1;
    for (int32_t k = 0; k < p->ds.n; k++)
        if (p->ds.t[k].target_no == p->target_no) taken = true;
    p->slot_no = taken ? next : p->target_no;
}

/* The first target number of the route generation the event does not have yet, or the one
 * asked for. */
static obx_err pick_target(mig *m, plan *p) {
    const obx__route_row *route = route_of(m, p->row.env.event_type, m->route_gen);
    p->target_no = m->req->target_no;
    int32_t next = p->ds.n ? p->ds.t[p->ds.n - 1].target_no + 1 : 2;
    if (next > OBX__SET_MAX) {
        snprintf(p->why, sizeof p->why, "the event has %d targets, the limit of a delivery set",
                 OBX__SET_MAX);
        return OBX_OK;
    }
    if (!route) return OBX_OK; /* new_destination names the missing route */
    if (!p->target_no) {
        /* default: the generation's own destination, else its first target, the event lacks */
        p->target_no = 1;
        if (route->targets) {
            obx__route_set_row set;
            obx_err e = obx__st_route_set_get(m->e->s, route->gen, &set);
            if (e) return e;
            plan probe = *p;
            probe.proof = NULL;
            probe.att = NULL;
            for (int32_t k = 0; k <= set.n; k++) {
                probe.target_no = k ? set.t[k - 1].target_no : 1;
                probe.why[0] = '\0';
                bool ok = false;
                if ((e = new_destination(m, &probe, &ok))) return e;
                if (ok) {
                    p->target_no = probe.target_no;
                    break;
                }
            }
        }
    }
    slot_number(p, next);
    return OBX_OK;
}

/* Writes one event's change: its own transaction, or (in_tx) the caller's. *changed: the
 * event (or its delivery set) is no longer as the proof saw it, nothing written for it. */
static obx_err write_one(mig *m, plan *p, bool in_tx, bool *changed, char *slot_id) {
    obx__engine *e = m->e;
    const obx__migrate_req *req = m->req;
    obx_err err = OBX_OK;
    const char *kind = json_string_value(json_object_get(p->proof, "kind"));
    if (!req->add_target) {
        move_ctx c = {.m = m, .p = p};
        snprintf(c.receipt_reason, sizeof c.receipt_reason,
                 "migrated by %.60s from %.40s/%.60s (gen %d) to %.40s/%.60s (gen %d): %s",
                 req->who, p->row.dest.cluster, p->row.dest.topic, (int)p->row.envelope_gen,
                 p->dest.cluster, p->dest.topic, (int)p->row.envelope_gen + 1, kind);
        c.detail = receipt_detail(m, p, "move", p->row.env.event_id);
        if (!c.detail) return obx__fail(OBX_ENOMEM, "migrate: out of memory");
        err = in_tx ? move_tx(e, &c) : obx__engine_tx(e, move_tx, &c);
        free(c.detail);
        *changed = c.changed;
        return err;
    }
    add_ctx c = {.m = m, .p = p};
    snprintf(c.receipt_reason, sizeof c.receipt_reason,
             "target %d (%.40s/%.60s) added by %.60s, completion '%s': %s", (int)p->slot_no,
             p->dest.cluster, p->dest.topic, req->who, p->completion, kind);
    err = obx__new_id(&e->gen, "evt-", m->now, c.slot_id, sizeof c.slot_id);
    c.detail = err ? NULL : receipt_detail(m, p, "add_target", c.slot_id);
    if (!err && !c.detail) err = obx__fail(OBX_ENOMEM, "migrate: out of memory");
    if (!err) err = in_tx ? add_tx(e, &c) : obx__engine_tx(e, add_tx, &c);
    free(c.detail);
    *changed = c.changed;
    obx__strlcpy(slot_id, c.slot_id, OBX_EVENT_ID_LEN + 1);
    return err;
}

/* The outcome of a written change in its result item. */
static void written(mig *m, json_t *item, plan *p, bool changed, const char *slot_id,
                    size_t *n_refused) {
    if (changed) {
        snprintf(p->why, sizeof p->why, "%s",
                 m->req->add_target
                     ? "the event's delivery set changed while the proof was made; run again"
                     : "the event or its attempts changed while the proof was made; run again");
        refuse(m, item, p, n_refused);
    } else if (m->req->add_target) {
        json_object_set_new(item, "outcome", json_string("target_added"));
        json_object_set_new(item, "slot_id", json_string(slot_id));
    } else {
        json_object_set_new(item, "outcome", json_string("migrated"));
    }
}

static obx_err one(mig *m, const obx__event_row *row, json_t *items, size_t *n_refused) {
    obx__engine *e = m->e;
    const obx__migrate_req *req = m->req;
    plan p;
    memset(&p, 0, sizeof p);
    p.row = *row;
    p.row.payload = NULL;
    json_t *item = json_pack("{s:s}", "event_id", row->env.event_id);
    if (!item) return obx__fail(OBX_ENOMEM, "migrate: out of memory");
    if (strcmp(obx__wire_id(row), row->env.event_id))
        json_object_set_new(item, "logical_event_id", json_string(obx__wire_id(row)));
    obx_err err = obx__st_delivery_get(e->s, row->env.event_id, &p.ds);
    if (err == OBX_ENOTFOUND) {
        obx__clear_error();
        err = OBX_OK;
        memset(&p.ds, 0, sizeof p.ds);
    }
    bool ok = false;
    if (!err && req->add_target) {
        obx__strlcpy(p.completion,
                     p.ds.n ? p.ds.completion : (req->completion ? req->completion : "all"),
                     sizeof p.completion);
        if (p.ds.n && req->completion && strcmp(req->completion, p.ds.completion))
            snprintf(p.why, sizeof p.why,
                     "its delivery set completes on '%s', not '%s' (a contract rule never "
                     "changes)",
                     p.ds.completion, req->completion);
        if (!*p.why) err = pick_target(m, &p);
        if (!err && !*p.why) err = new_destination(m, &p, &ok);
        if (!err && ok) err = prove_new_target(m, &p, &ok);
    } else if (!err) {
        err = prove_absent(m, &p, &ok);
        if (!err && ok) err = new_destination(m, &p, &ok);
    }
    if (err) {
        json_decref(item);
        plan_free(&p);
        return err;
    }
    if (ok) {
        char new_dg[OBX_DIGEST_LEN + 1];
        int32_t new_gen = req->add_target ? 1 : p.row.envelope_gen + 1;
        if ((err = logical_digest(&p.row, new_gen, new_dg))) {
            json_decref(item);
            plan_free(&p);
            return err;
        }
        json_object_set_new(
            item, "from",
            dest_json(p.row.envelope_gen, &p.row.dest, p.row.dest_digest, p.row.envelope_digest));
        json_object_set_new(item, "to", dest_json(new_gen, &p.dest, p.dest_digest, new_dg));
        json_object_set(item, "proof", p.proof);
        if (req->add_target) json_object_set_new(item, "target", json_integer(p.slot_no));
    }
    if (ok && req->dry_run) {
        json_object_set_new(item, "outcome",
                            json_string(req->add_target ? "would_add_target" : "would_migrate"));
    } else if (ok && m->new_route) { /* written with the route (contract 6) */
        pend *q = &m->pend[m->n_pend++];
        q->p = p;
        q->item = item;
        memset(&p, 0, sizeof p);
    } else if (ok) {
        bool changed = false;
        char slot_id[OBX_EVENT_ID_LEN + 1] = "";
        err = write_one(m, &p, false, &changed, slot_id);
        if (!err) written(m, item, &p, changed, slot_id, n_refused);
    } else {
        refuse(m, item, &p, n_refused);
    }
    if (err) {
        /* a store failure of this event: reported with it, the others still go */
        snprintf(p.why, sizeof p.why, "%s: %s", obx_errname(err), obx_errmsg());
        json_object_del(item, "outcome");
        refuse(m, item, &p, n_refused);
        err = OBX_OK;
    }
    json_array_append_new(items, item);
    plan_free(&p);
    return err;
}

/* ---- a new route with the changes (contract 6) ----------------------------------------------
 */

/* req->route, validated, as the last of m->routes under a provisional generation number (the
 * store draws the real one when it writes it). */
static obx_err new_route(mig *m, size_t max_pend) {
    const obx_route *r = m->req->route;
    if (r->n_targets)
        return obx__fail(OBX_EINVAL, "route: a delivery set is declared with obx_route_set, "
                                     "then migrated to with route_gen");
    obx__route_row row;
    obx__route_set_row set;
    obx_err err = obx__route_prepare(m->e->s, r, m->now, &row, &set);
    if (err) return err;
    obx__route_row *v = realloc(m->routes, (m->n_routes + 1) * sizeof *v);
    if (!v) return obx__fail(OBX_ENOMEM, "migrate: out of memory");
    m->routes = v;
    for (size_t i = 0; i < m->n_routes; i++)
        if (v[i].gen >= row.gen) row.gen = v[i].gen + 1;
    m->new_route = &v[m->n_routes++];
    *m->new_route = row;
    m->route_gen = row.gen;
    if (m->req->dry_run) return OBX_OK;
    m->pend = calloc(max_pend ? max_pend : 1, sizeof *m->pend);
    return m->pend ? OBX_OK : obx__fail(OBX_ENOMEM, "migrate: out of memory");
}

/* The route and every pending change: one transaction, rolled back when no event changes. */
static obx_err route_tx(obx__engine *e, void *arg) {
    mig *m = arg;
    int64_t g = 0;
    obx_err err = obx__st_route_put(e->s, m->new_route, &g);
    if (err) return err;
    m->new_route->gen = m->route_gen = g;
    size_t n = 0;
    for (size_t i = 0; i < m->n_pend; i++) {
        pend *q = &m->pend[i];
        bool ok = false;
        q->changed = false;
        q->p.why[0] = '\0';
        if ((err = new_destination(m, &q->p, &ok))) return err; /* under the real generation */
        if (!ok) {
            q->changed = true;
            continue;
        }
        if ((err = write_one(m, &q->p, true, &q->changed, q->slot_id))) return err;
        n += !q->changed;
    }
    if (!n) return obx__fail(OBX_EREFUSED, "no event changed: the route was not written");
    m->route_written = true;
    return OBX_OK;
}

/* The new route in the result: where, and whether it was written (its generation then). */
static json_t *route_json(const mig *m) {
    const obx__route_row *r = m->new_route;
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:b}", "event_type", r->event_type, "cluster",
                          r->cluster, "topic", r->topic, "routing_key", r->routing_key, "written",
                          (int)m->route_written);
    if (j) json_object_set_new(j, "gen", m->route_written ? json_integer(r->gen) : json_null());
    return j;
}

/* Writes the pending changes with the route and records each outcome in its item. */
static void write_pending(mig *m, size_t *n_refused) {
    if (!m->n_pend) return;
    obx_err err = obx__engine_tx(m->e, route_tx, m);
    if (err) m->route_written = false;
    char msg[OBX_TEXT_MAX + 1];
    snprintf(msg, sizeof msg, "%s: %s; nothing written, the route included", obx_errname(err),
             obx_errmsg());
    for (size_t i = 0; i < m->n_pend; i++) {
        pend *q = &m->pend[i];
        char dg[OBX_DIGEST_LEN + 1] = "";
        int32_t gen = m->req->add_target ? 1 : q->p.row.envelope_gen + 1;
        if (!logical_digest(&q->p.row, gen, dg))
            json_object_set_new(q->item, "to", dest_json(gen, &q->p.dest, q->p.dest_digest, dg));
        if (err && !q->changed) {
            obx__strlcpy(q->p.why, msg, sizeof q->p.why);
            refuse(m, q->item, &q->p, n_refused);
        } else {
            written(m, q->item, &q->p, err ? true : q->changed, q->slot_id, n_refused);
        }
        plan_free(&q->p);
    }
}

obx_err obx__migrate(obx__engine *e, int64_t now, const obx__migrate_req *req, json_t **out,
                     size_t *n_refused) {
    *out = NULL;
    *n_refused = 0;
    mig m = {.e = e, .now = now, .req = req, .route_gen = req->route_gen};
    obx__rows rows = {0};
    obx_err err = obx__st_route_list(e->s, true, &m.routes, &m.n_routes);
    if (!err && req->n_ids) {
        /* one by one: the result lists every ID asked for, a missing one as refused */
        for (size_t i = 0; !err && i < req->n_ids; i++) {
            size_t before = rows.n;
            err = obx__st_load_events(e->s, &req->ids[i], 1, 0, &rows);
            if (!err && rows.n == before) {
                obx__event_row *r = obx__rows_push(&rows);
                if (!r)
                    err = obx__fail(OBX_ENOMEM, "migrate: out of memory");
                else
                    obx__strlcpy(r->env.event_id, req->ids[i], sizeof r->env.event_id);
            }
        }
    } else if (!err) {
        err = obx__st_read_events(
            e->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &req->filter}, &rows);
    }
    if (!err && req->route) err = new_route(&m, rows.n);
    if (!err && req->route && OBX__MUTANT(ROUTE_BEFORE_DECISION)) {
        int64_t g = 0; /* test-only bug: the route is written before the decision (issue 46) */
        err = obx__st_route_put(e->s, m.new_route, &g);
    }
    json_t *items = json_array();
    if (!err && !items) err = obx__fail(OBX_ENOMEM, "migrate: out of memory");
    for (size_t i = 0; !err && i < rows.n; i++) {
        obx__event_row *r = &rows.v[i];
        if (!r->seq) { /* an ID that is not in this outbox (stored rows have seq >= 1) */
            json_t *item = json_pack("{s:s,s:s,s:s}", "event_id", r->env.event_id, "outcome",
                                     "refused", "reason", "not in this outbox");
            json_array_append_new(items, item);
            if (!*n_refused)
                snprintf(m.first, sizeof m.first, "event %s: not in this outbox", r->env.event_id);
            (*n_refused)++;
            continue;
        }
        if (req->add_target && r->target_no > 1) {
            if (req->n_ids) { /* a slot named: its event gets the target */
                const char *lid = obx__wire_id(r);
                obx__rows l = {0};
                err = obx__st_load_events(e->s, &lid, 1, 0, &l);
                if (!err && l.n == 1) err = one(&m, &l.v[0], items, n_refused);
                obx__rows_free(&l);
            }
            continue; /* a selector reaches the event itself */
        }
        err = one(&m, r, items, n_refused);
    }
    if (!err) write_pending(&m, n_refused);
    for (size_t i = 0; err && i < m.n_pend; i++) plan_free(&m.pend[i].p);
    free(m.pend);
    obx__rows_free(&rows);
    json_t *route = m.new_route ? route_json(&m) : NULL;
    free(m.routes);
    if (err) {
        json_decref(items);
        json_decref(route);
        return err;
    }
    *out = json_pack("{s:i,s:i,s:b,s:o}", "selected", (int)json_array_size(items), "refused",
                     (int)*n_refused, "dry_run", (int)req->dry_run, "events", items);
    if (*out && route) json_object_set_new(*out, "route", route);
    if (!*out) return obx__fail(OBX_ENOMEM, "migrate: out of memory");
    if (*n_refused) obx__fail(OBX_EREFUSED, "%s", m.first);
    return OBX_OK;
}

/* ---- the public entry point -------------------------------------------------------------------
 */

obx_err obx_migrate(obx_store *s, const char *broker_url, const char *const *props, size_t n_props,
                    const obx_migrate_request *r, char **out) {
    if (!s || !r || !out) return obx__fail(OBX_EINVAL, "migrate: NULL argument");
    *out = NULL;
    obx__clear_error();
    obx_err err;
    const char *who = r->who ? r->who : "operator";
    if ((err = obx__check_field("who", who, 1, OBX__OWNER_MAX, OBX__CS_OWNER)) ||
        (err = obx__check_field("reason", r->reason, 0, OBX_TEXT_MAX, OBX__CS_TEXT)) ||
        (err =
             obx__check_field("event_type", r->event_type, 0, OBX_NAME_MAX, OBX__CS_EVENT_TYPE)) ||
        (err = obx__check_field("cluster", r->cluster, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (err = obx__check_field("topic", r->topic, 0, OBX_TOPIC_MAX, OBX__CS_NAME)))
        return err;
    if (r->n_event_ids > 100000)
        return obx__fail(OBX_ETOOBIG, "event_ids: %zu, over the limit of 100000", r->n_event_ids);
    if (r->n_event_ids && !r->event_ids) return obx__fail(OBX_EINVAL, "event_ids: NULL");
    for (size_t i = 0; i < r->n_event_ids; i++)
        if ((err = obx_event_id_check(r->event_ids[i])))
            return obx__fail_prefix(err, "event_ids[%zu]", i);
    if (r->n_event_ids && (r->event_type || r->cluster || r->topic || r->state))
        return obx__fail(OBX_EINVAL, "event_ids: given together with a selector (event_type, "
                                     "cluster, topic, state): choose one");
    if (!r->n_event_ids && !r->event_type && !r->cluster && !r->topic && !r->state)
        return obx__fail(OBX_EINVAL, "event_ids: none, and no selector (event_type, cluster, "
                                     "topic or state)");
    if (r->limit > 100000)
        return obx__fail(OBX_ETOOBIG, "limit: %zu, over the limit of 100000", r->limit);
    if (r->route_gen < 0)
        return obx__fail(OBX_EINVAL, "route_gen: %lld is negative", (long long)r->route_gen);
    if (r->route && r->route_gen)
        return obx__fail(OBX_EINVAL, "route_gen: not together with route (a new generation)");
    if (r->target < 0 || r->target > OBX__SET_MAX)
        return obx__fail(OBX_EINVAL, "target: %d outside 0..%d", r->target, OBX__SET_MAX);
    if (r->target && !r->add_target)
        return obx__fail(OBX_EINVAL, "target: only with add_target (a moved slot keeps its "
                                     "target number)");
    if (r->completion && strcmp(r->completion, "all") && strcmp(r->completion, "any"))
        return obx__fail(OBX_EINVAL, "completion: '%s' unknown (all or any)", r->completion);
    if (r->completion && !r->add_target)
        return obx__fail(OBX_EINVAL, "completion: only with add_target");
    /* the undelivered states unless one is named (the blocked ones are reported, not skipped) */
    static const obx__state undelivered[] = {
        OBX__ST_PENDING, OBX__ST_PARKED,      OBX__ST_RETRY_CLAIMED,    OBX__ST_CLAIMED,
        OBX__ST_SENDING, OBX__ST_RECONCILING, OBX__ST_DISPATCH_UNKNOWN,
    };
    obx__state one_state = OBX__ST_COUNT;
    if (r->state) {
        one_state = obx__state_parse(r->state);
        if (one_state == OBX__ST_COUNT || one_state == OBX__ST_NONE)
            return obx__fail(OBX_EINVAL, "state: '%s' is not a state (PENDING, PARKED, ...)",
                             r->state);
    }
    obx__migrate_req req = {.ids = r->event_ids,
                            .n_ids = r->n_event_ids,
                            .route_gen = r->route_gen,
                            .target_no = r->target,
                            .add_target = r->add_target != 0,
                            .completion = r->completion,
                            .who = who,
                            .reason = r->reason,
                            .dry_run = r->dry_run != 0,
                            .route = r->route};
    req.filter =
        (obx__event_filter){.event_type = r->event_type,
                            .cluster = r->cluster,
                            .topic = r->topic,
                            .states = r->state ? &one_state : undelivered,
                            .n_states = r->state ? 1 : sizeof undelivered / sizeof undelivered[0],
                            .limit = r->limit ? r->limit : 1000};
    if (r->add_target && !r->state) req.filter.n_states = 0; /* any state gets a target */
    obx__broker *b = NULL;
    if (broker_url && (err = obx__br_open(broker_url, props, n_props, &b))) return err;
    obx__engine e;
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    obx__strlcpy(c.owner, who, sizeof c.owner);
    if ((err = obx__engine_init(&e, s, b, &c))) {
        obx__br_close(b);
        return err;
    }
    json_t *res = NULL;
    size_t refused = 0;
    err = obx__migrate(&e, obx__st_now_ms(s), &req, &res, &refused);
    obx__br_close(b);
    if (err) return err;
    char msg[1024];
    obx__strlcpy(msg, obx_errmsg(), sizeof msg);
    if ((err = obx__json_out(res, out))) return err;
    if (refused) return obx__fail(OBX_EREFUSED, "%s", msg);
    obx__clear_error();
    return OBX_OK;
}
