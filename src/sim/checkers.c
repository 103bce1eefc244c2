/*
 * checkers.c — the simulator's checkers: after each trace, what the outbox, the consumers'
 * databases and the simulated broker's log hold is checked against the protocol's promises —
 * no lost events, no second logical event IDs, no cross-destination retries, no digest
 * divergence, no duplicate consumer effects, no sends under a stale claim, late valid ACKs
 * converged to the publish slot or the duplicate log, UNKNOWNs traceable by attempt and
 * resolved, purges only behind every consumer and after the replay window, migrations only
 * away from a target that did not have the event; and (issue 46) every primary receipt backed by
 * a broker copy of the event's own bytes, no route changed by a dry run or a refusal (checked
 * by the operator actor where it happens), no genuine copy parked, no UNKNOWN attempt left open
 * on a published event, a handler run at most once per consumer ID and event, and no purge on
 * a consumer receipt of other bytes; and (issue 51) no delayed event at the broker before its
 * not_before, no handler run before its retry was due. The checkers read what the databases hold —
 * the outbox through the store interface (snapshot.c, and envelope_at for the envelope an older
 * generation froze), the consumers' inboxes through theirs, the business tables through the
 * application doubles — rather than trusting the engine's or the actors' view of it.
 */
#include "sim/sim.h"

#include <stdlib.h>
#include <string.h>

/* The row of event id in the snapshot, or -1. */
static long snap_find(const obx__sim_snap *s, const char *id) {
    for (size_t i = 0; i < s->ev.n; i++)
        if (!strcmp(s->ev.v[i].env.event_id, id)) return (long)i;
    return -1;
}

/* The attempt attempt_id in the snapshot, or NULL. */
static const obx__attempt_row *snap_attempt(const obx__sim_snap *s, const char *attempt_id) {
    for (size_t i = 0; i < s->ev.n; i++)
        for (size_t j = 0; j < s->x[i].natt; j++)
            if (!strcmp(s->x[i].att[j].attempt_id, attempt_id)) return &s->x[i].att[j];
    return NULL;
}

/* When consumer i applied event_id (virtual ms), as its inbox holds it; -1: never. */
static int64_t consumed_at(wk *k, int i, const char *event_id) {
    char cid[16];
    snprintf(cid, sizeof cid, "consumer-%d", i);
    obx__inbox_row row;
    obx_store *s = k->cs[i];
    return obx__st_inbox_get(s, cid, event_id, &row) ? -1 : row.consumed_at;
}

/* Retention (docs/retention.md): each PURGED event was purged after its replay window, and at
 * that moment every consumer (all critical) had applied it and every event published before
 * it: nothing a consumer still needed lost its payload. The payload is gone, the envelope
 * stays. */
static void check_purges(wk *k, const obx__sim_snap *s) {
    results *r = &k->r;
    for (size_t p = 0; p < s->ev.n; p++) {
        const obx__event_row *ev = &s->ev.v[p];
        if (ev->state != OBX__ST_PURGED) continue;
        int64_t pub = ev->published_at, seq = ev->seq, tp = 0; /* tp: when it was purged */
        for (size_t j = 0; j < s->x[p].nau; j++)
            if (s->x[p].au[j].to == OBX__ST_PURGED && s->x[p].au[j].at > tp) tp = s->x[p].au[j].at;
        r->purged++;
        if (pub <= 0 || pub + k->replay_window_ms > tp) {
            r->premature_purges++;
            fail(k, "%s was purged %lld ms after publication, inside the %lld ms replay window",
                 ev->env.event_id, (long long)(tp - pub), (long long)k->replay_window_ms);
            continue;
        }
        /* each consumer's receipt is for the bytes obx froze: the payload digest, generation and
         * destination of the event (issue 46, item 8; a quarantine that came after the purge
         * does not undo evidence that held when it ran, so the receipt itself is compared) */
        for (int i = 0; i < k->nconsumers; i++) {
            char cid[16];
            obx__inbox_row in;
            snprintf(cid, sizeof cid, "consumer-%d", i);
            bool match = !obx__st_inbox_get(k->cs[i], cid, obx__wire_id(ev), &in) &&
                         !strcmp(in.payload_digest, ev->env.payload_digest) &&
                         in.envelope_gen == ev->envelope_gen &&
                         !strcmp(in.dest_digest, ev->dest_digest) && in.consumed_at <= tp;
            if (!match) {
                r->purged_without_matching_evidence++;
                fail(k, "%s was purged while consumer %d held no receipt of its bytes",
                     ev->env.event_id, i);
            }
        }
        for (size_t b = 0; b < s->ev.n; b++) { /* every event published at or before it */
            const obx__event_row *eb = &s->ev.v[b];
            if (eb->published_at <= 0 || eb->published_at > pub ||
                (eb->published_at == pub && eb->seq > seq))
                continue;
            for (int i = 0; i < k->nconsumers; i++) {
                int64_t at = consumed_at(k, i, eb->env.event_id);
                if (at < 0 || at > tp) {
                    r->premature_purges++;
                    fail(k, "%s was purged at t=%lld while consumer %d %s %s", ev->env.event_id,
                         (long long)(tp - 1700000000000LL), i,
                         at < 0 ? "never applied" : "had not yet applied", eb->env.event_id);
                    break;
                }
            }
        }
    }
}

/* Migration (docs/migration.md): an event left a generation's destination only when that
 * target did not have it — so the broker's log holds no message of a generation an event
 * migrated away from (it would reach consumers from two destinations). */
static void check_migrations(wk *k, const obx__sim_snap *s) {
    size_t nlog;
    const obx__sim_msg *log = obx__sim_world_log(k->w, &nlog);
    size_t stride = obx__sim_world_log_stride();
    for (size_t e = 0; e < s->ev.n; e++)
        for (size_t j = 0; j < s->x[e].nrc; j++) {
            const obx__receipt_row *rc = &s->x[e].rc[j];
            if (rc->kind != OBX__RK_MIGRATION) continue;
            int64_t old = rc->envelope_gen - 1; /* the generation it left */
            for (size_t i = 0; i < nlog; i++) {
                const obx__sim_msg *m =
                    (const obx__sim_msg *)(const void *)((const char *)log + i * stride);
                if (!strcmp(m->env.event_id, rc->event_id) && m->env.envelope_gen == old) {
                    k->r.migrated_with_old_copy++;
                    fail(k,
                         "%s migrated away from generation %lld while its old target held it "
                         "(%s/%d, attempt %s)",
                         rc->event_id, (long long)old, m->topic, (int)m->partition, m->attempt_id);
                    break;
                }
            }
        }
}

/* Lost: committed but not published, a business row without its event, or an event a consumer
 * never applied. */
static void check_lost(wk *k, const obx__sim_snap *s, const obx__sim_orders *o) {
    results *r = &k->r;
    long v = 0;
    for (size_t i = 0; i < s->ev.n; i++) v += !obx__sim_published(s->ev.v[i].state);
    if (v > 0) {
        r->lost_events += v;
        fail(k, "%ld committed events were never published", v);
    }
    v = 0;
    for (size_t i = 0; i < o->n; i++) v += snap_find(s, o->event_id[i]) < 0;
    if (v > 0) {
        r->lost_events += v;
        fail(k, "%ld business orders committed without their event", v);
    }
    for (int i = 0; i < k->nconsumers; i++)
        if ((v = (long)s->ev.n - obx__app_effects_distinct(k->app[i])) > 0) {
            r->lost_events += v;
            fail(k, "consumer %d never applied %ld events", i, v);
        }
}

/* Generation gen of event id as the outbox froze it into v (any generation: a receipt or a
 * message may be of one a migration replaced). OBX_ENOTFOUND when the event has no such
 * generation; any other error fails the trace. */
static obx_err envelope_of(wk *k, const char *id, int32_t gen, obx__envelope_at_row *v) {
    size_t cap = sizeof k->env_memo / sizeof k->env_memo[0];
    for (size_t i = 0; i < k->n_env_memo && i < cap; i++) {
        const struct env_memo *m = &k->env_memo[i];
        if (m->gen == gen && !strcmp(m->id, id)) {
            if (!m->err) *v = m->env;
            return m->err;
        }
    }
    obx_err e = obx__st_envelope_at(k->os, id, gen, v);
    if (e && e != OBX_ENOTFOUND) fail(k, "sim: read envelope: %s", obx_errmsg());
    if (!e || e == OBX_ENOTFOUND) { /* remembered for this check (the oldest replaced) */
        struct env_memo *m = &k->env_memo[k->n_env_memo++ % cap];
        obx__strlcpy(m->id, id, sizeof m->id);
        m->gen = gen;
        m->err = e;
        if (!e) m->env = *v;
    }
    return e;
}

/* Primary receipts whose payload or destination digest differs from the envelope of their
 * generation; -1 (the trace failed) when the store cannot tell. */
static long divergent(wk *k, const obx__sim_snap *s) {
    long v = 0;
    for (size_t e = 0; e < s->ev.n; e++)
        for (size_t j = 0; j < s->x[e].nrc; j++) {
            const obx__receipt_row *rc = &s->x[e].rc[j];
            if (rc->kind != OBX__RK_PRIMARY) continue;
            obx__envelope_at_row env;
            obx_err err = envelope_of(k, rc->event_id, rc->envelope_gen, &env);
            if (err == OBX_ENOTFOUND) continue; /* a generation never frozen: nothing to differ */
            if (err) return -1;
            v += strcmp(rc->payload_digest, env.payload_digest) != 0 ||
                 strcmp(rc->dest_digest, env.dest_digest) != 0;
        }
    return v;
}

/* Primary receipts doubled for one envelope generation. */
static long multi_primary(const obx__sim_snap *s) {
    long v = 0;
    for (size_t e = 0; e < s->ev.n; e++)
        for (size_t j = 0; j < s->x[e].nrc; j++) {
            const obx__receipt_row *a = &s->x[e].rc[j];
            if (a->kind != OBX__RK_PRIMARY) continue;
            size_t before = 0, after = 0; /* this generation's primaries before and after j */
            for (size_t i = 0; i < s->x[e].nrc; i++) {
                const obx__receipt_row *b = &s->x[e].rc[i];
                if (b->kind == OBX__RK_PRIMARY && b->envelope_gen == a->envelope_gen)
                    i<j ? before++ : i> j ? after++ : 0;
            }
            v += before == 0 && after > 0; /* counted once, at its first primary */
        }
    return v;
}

/* Second logical event IDs (events no business row points at, or a command answered with two
 * different IDs), primary receipts that diverge from their frozen envelope, duplicate effects. */
static void check_ids_and_effects(wk *k, const obx__sim_snap *s, const obx__sim_orders *o) {
    results *r = &k->r;
    long v = 0;
    for (size_t i = 0; i < s->ev.n; i++) {
        bool referenced = false;
        for (size_t j = 0; j < o->n && !referenced; j++)
            referenced = !strcmp(o->event_id[j], s->ev.v[i].env.event_id);
        v += !referenced;
    }
    if (v > 0) {
        r->second_event_ids += v;
        fail(k, "%ld events belong to no business command (second event IDs)", v);
    }
    for (int c = 0; c < k->n_events; c++)
        if (k->n_ids[c] > 1) {
            r->second_event_ids++;
            fail(k, "command %s was answered with two event IDs", k->orders[c]);
        }
    if ((v = divergent(k, s)) > 0 || (v = multi_primary(s)) > 0) {
        r->digest_divergence += v;
        fail(k, "%ld primary receipts diverge from their frozen envelope or are doubled", v);
    }
    for (int i = 0; i < k->nconsumers; i++)
        if ((v = obx__app_effects_doubled(k->app[i])) > 0) {
            r->consumer_duplicate_effects += v;
            fail(k, "consumer %d applied %ld events twice", i, v);
        }
}

/* Stale claims: every attempt was sent under a claim its owner held — the audit shows the owner
 * taking that claim generation. */
static void check_stale(wk *k, const obx__sim_snap *s) {
    long v = 0;
    for (size_t e = 0; e < s->ev.n; e++)
        for (size_t j = 0; j < s->x[e].natt; j++) {
            const obx__attempt_row *t = &s->x[e].att[j];
            bool held = false;
            for (size_t i = 0; i < s->x[e].nau && !held; i++) {
                const obx__audit_row *a = &s->x[e].au[i];
                held = a->claim_gen == t->claim_gen && !strcmp(a->who, t->owner) &&
                       (a->to == OBX__ST_CLAIMED || a->to == OBX__ST_RECONCILING ||
                        a->to == OBX__ST_RETRY_CLAIMED);
            }
            v += !held;
        }
    if (v > 0) {
        k->r.stale_claim_sends += v;
        fail(k, "%ld attempts were sent under a claim their owner did not hold", v);
    }
}

/* Cross-destination: every message on the broker went to its event's frozen destination (of
 * that envelope generation) and the attempt's pinned partition. */
static void check_destinations(wk *k, const obx__sim_snap *s) {
    size_t nlog;
    const obx__sim_msg *log = obx__sim_world_log(k->w, &nlog);
    size_t stride = obx__sim_world_log_stride();
    for (size_t i = 0; i < nlog; i++) {
        const obx__sim_msg *m =
            (const obx__sim_msg *)(const void *)((const char *)log + i * stride);
        obx__envelope_at_row env;
        bool ok = !envelope_of(k, m->env.event_id, m->env.envelope_gen, &env) &&
                  !strcmp(env.dest.topic, m->topic) && !strcmp(env.dest_digest, m->dest_digest);
        const obx__attempt_row *t = snap_attempt(s, m->attempt_id);
        ok = ok && t && t->partition == m->partition;
        if (!ok) {
            k->r.cross_destination_retries++;
            fail(k, "%s (attempt %s) reached %s/%d, not its frozen destination", m->env.event_id,
                 m->attempt_id, m->topic, (int)m->partition);
        }
    }
}

/* The log message at (topic, partition, offset) under event_id, or NULL. */
static const obx__sim_msg *log_at(wk *k, const char *event_id, const char *topic, int32_t partition,
                                  int64_t offset) {
    size_t nlog;
    const obx__sim_msg *log = obx__sim_world_log(k->w, &nlog);
    size_t stride = obx__sim_world_log_stride();
    for (size_t i = 0; i < nlog; i++) {
        const obx__sim_msg *m =
            (const obx__sim_msg *)(const void *)((const char *)log + i * stride);
        if (m->offset == offset && m->partition == partition && !strcmp(m->topic, topic) &&
            !strcmp(m->env.event_id, event_id))
            return m;
    }
    return NULL;
}

/* Whether a primary receipt's broker evidence holds: the broker's log has a message at its
 * place whose bytes hash to the generation's frozen payload digest, for its destination. */
static bool receipt_backed(wk *k, const obx__receipt_row *rc) {
    obx__envelope_at_row env;
    if (envelope_of(k, rc->event_id, rc->envelope_gen, &env)) return false;
    const obx__sim_msg *m = log_at(k, rc->event_id, rc->topic, rc->partition, rc->offset);
    char hashed[OBX_DIGEST_LEN + 1] = "";
    if (!m || obx_sha256_digest(m->payload, m->payload_len, hashed)) return false;
    return !strcmp(hashed, env.payload_digest) && !strcmp(m->dest_digest, env.dest_digest);
}

/* Evidence (issue 46, items 2 and 3): every event in a published state has a primary receipt of
 * its generation, and each primary receipt from the broker, a lookup or a verified operator
 * acceptance names a message the broker holds with the event's own bytes (hashed here, not read
 * from a header). A consumer's receipt is evidence of its own kind; an operator's assertion is
 * reported by `obx audit` until one confirms it. */
static void check_evidence(wk *k, const obx__sim_snap *s) {
    long v = 0;
    for (size_t e = 0; e < s->ev.n; e++) {
        const obx__event_row *ev = &s->ev.v[e];
        bool primary = false;
        for (size_t j = 0; j < s->x[e].nrc; j++) {
            const obx__receipt_row *rc = &s->x[e].rc[j];
            if (rc->kind != OBX__RK_PRIMARY) continue;
            primary = primary || rc->envelope_gen == ev->envelope_gen;
            if (rc->source == OBX__RS_CONSUMER || rc->source == OBX__RS_ASSERTED) continue;
            if (!receipt_backed(k, rc)) {
                v++;
                fail(k, "%s: its primary receipt (%s, %s/%d@%lld) names no copy of its bytes",
                     ev->env.event_id, obx__receipt_source_name(rc->source), rc->topic,
                     (int)rc->partition, (long long)rc->offset);
            }
        }
        if (obx__sim_published(ev->state) && !primary) {
            v++;
            fail(k, "%s is %s without a primary receipt", ev->env.event_id,
                 obx__state_name(ev->state));
        }
    }
    k->r.published_without_evidence += v;
}

/* Every UNKNOWN ends (issue 46, item 6): once an event is published, none of its attempts is
 * still UNKNOWN or SENDING (a superseded one ends SUPERSEDED, accept.c's end_superseded: a
 * retry in flight when another attempt filled the slot used to stay SENDING for ever). */
static void check_open_attempts(wk *k, const obx__sim_snap *s) {
    long v = 0;
    for (size_t e = 0; e < s->ev.n; e++) {
        if (!obx__sim_published(s->ev.v[e].state)) continue;
        for (size_t j = 0; j < s->x[e].natt; j++) {
            const obx__attempt_row *t = &s->x[e].att[j];
            if (t->state != OBX__AT_UNKNOWN && t->state != OBX__AT_SENDING) continue;
            v++;
            fail(k, "%s is published, its attempt %s is still %s", s->ev.v[e].env.event_id,
                 t->attempt_id, obx__attempt_state_name(t->state));
        }
    }
    k->r.attempts_left_open += v;
}

/* At the consumers (issue 46, items 4 and 7): the genuine copy of an event is never parked —
 * neither parked itself nor kept out by a parked copy of other bytes — and a handler ran at most
 * once per consumer ID and event, whichever instance ran it. */
static void check_consumers(wk *k, const obx__sim_snap *s) {
    for (int i = 0; i < k->nconsumers; i++) {
        char cid[16];
        snprintf(cid, sizeof cid, "consumer-%d", i);
        for (size_t e = 0; e < s->ev.n; e++) {
            const obx__event_row *ev = &s->ev.v[e];
            obx__poison_row p;
            obx__inbox_row row;
            bool parked =
                !obx__st_poison_get(k->cs[i], cid, ev->env.event_id, ev->env.payload_digest, &p);
            if (parked) {
                parked = !strcmp(p.state, "PARKED");
                free(p.payload);
                free(p.headers_json);
            } else if (obx__st_inbox_get(k->cs[i], cid, ev->env.event_id, &row) &&
                       !obx__st_poison_get(k->cs[i], cid, ev->env.event_id, NULL, &p)) {
                parked = true; /* never applied, and a copy of it is parked */
                free(p.payload);
                free(p.headers_json);
            }
            if (parked) {
                k->r.genuine_copy_parked++;
                fail(k,
                     "consumer %d: the genuine copy of %s is parked or kept out by a parked "
                     "copy",
                     i, ev->env.event_id);
            }
        }
        for (int c = 0; c < k->n_events; c++)
            if (k->runs[i][c] > 1) {
                k->r.handler_runs_twice++;
                fail(k, "consumer %d's handler ran %d times for %s", i, k->runs[i][c],
                     k->event_ids[c][0]);
            }
    }
}

/* Delayed events (issue 51, item 3): no copy of a delayed event reached the broker before the
 * not_before the producer committed it with, judged on the broker's log by the virtual time of
 * each append (not by what the outbox says), less the relay's clock error ("One clock": half
 * the simulated round trip to the database server). That each one is published once due is
 * the liveness check's. The handler runs before a retry's due time are counted where they run
 * (actors.c, check_retry_due), against the failure row in the consumer's database. */
static void check_delays(wk *k) {
    bool any = false;
    for (int c = 0; c < k->n_events && !any; c++) any = k->delay_ms[c] > 0;
    if (!any) return;
    size_t nlog;
    const obx__sim_msg *log = obx__sim_world_log(k->w, &nlog);
    size_t stride = obx__sim_world_log_stride();
    for (size_t i = 0; i < nlog; i++) {
        const obx__sim_msg *m =
            (const obx__sim_msg *)(const void *)((const char *)log + i * stride);
        int slot = 0, c = obx__sim_cmd_of(k, m->env.event_id, &slot);
        int64_t nb = c < 0 ? 0 : k->not_before[c][slot];
        if (nb > 0 && m->ts < nb - SIM_DB_RTT_MS / 2) {
            k->r.published_before_not_before++;
            fail(k, "%s reached the broker %lld ms before its not_before (%s/%d@%lld)",
                 m->env.event_id, (long long)(nb - m->ts), m->topic, (int)m->partition,
                 (long long)m->offset);
        }
    }
    for (int c = 0; c < k->n_events; c++) k->r.delayed_events += k->delay_ms[c] > 0 && k->n_ids[c];
}

/* Every valid late ACK that reached a committed acceptance is the primary receipt or a
 * duplicate transport receipt. */
static void check_late_acks(wk *k, const obx__sim_snap *s) {
    results *r = &k->r;
    size_t nacks;
    const obx__sim_ack *acks = obx__sim_world_acks(k->w, &nacks);
    for (size_t i = 0; i < nacks; i++) {
        if (!acks[i].late || !acks[i].valid || !acks[i].attempt_id[0]) continue;
        r->late_ack_total++;
        k->r.fired[F_CLAIM_EXPIRY_LATE_ACK]++;
        bool conv = false;
        for (size_t e = 0; e < s->ev.n && !conv; e++)
            for (size_t j = 0; j < s->x[e].nrc && !conv; j++) {
                const obx__receipt_row *rc = &s->x[e].rc[j];
                conv = !strcmp(rc->attempt_id, acks[i].attempt_id) &&
                       (rc->kind == OBX__RK_PRIMARY || rc->kind == OBX__RK_DUPLICATE);
            }
        if (conv)
            r->late_ack_converged++;
        else
            fail(k, "the late ACK of attempt %s left no receipt", acks[i].attempt_id);
    }
}

static bool starts(const char *s, const char *prefix) {
    return !strncmp(s, prefix, strlen(prefix));
}

/* The audit of one event: UNKNOWN transitions that name no UNKNOWN attempt of it, the races
 * seen (a retry claim overtaken by a late ACK, a stale claim refused), whether it was ever held
 * for an operator. */
static void audit_counts(const obx__sim_snap *s, size_t e, long *untraceable, long *racing,
                         long *held) {
    bool was_held = false;
    for (size_t i = 0; i < s->x[e].nau; i++) {
        const obx__audit_row *a = &s->x[e].au[i];
        bool reconciler = !strcmp(obx__actor_name(a->actor), "reconciler");
        if (a->to == OBX__ST_DISPATCH_UNKNOWN) {
            bool traced = false;
            for (size_t j = 0; j < s->x[e].natt && !traced; j++)
                traced = !strcmp(s->x[e].att[j].attempt_id, a->attempt_id) &&
                         s->x[e].att[j].unknown_at > 0;
            *untraceable += !traced;
        }
        *racing += (a->from == OBX__ST_RETRY_CLAIMED && a->to == OBX__ST_PUBLISHED) ||
                   (reconciler && starts(a->reason, "stale claim refused"));
        was_held =
            was_held || (reconciler &&
                         (starts(a->reason, "held for an operator") ||
                          starts(a->reason, "cannot tell past the quiet time; the route's UNKNOWN "
                                            "policy is hold")));
    }
    *held += was_held;
}

/* UNKNOWNs: each traceable by attempt, each resolved; the two races as they happened (injected
 * or not); held and quarantined counts. Returns the number of UNKNOWN episodes still open. */
static long check_unknowns(wk *k, const obx__sim_snap *s) {
    results *r = &k->r;
    long total = 0, untraceable = 0, racing = 0, both = 0, unresolved = 0, held = 0, quar = 0;
    for (size_t e = 0; e < s->ev.n; e++) {
        const obx__event_row *ev = &s->ev.v[e];
        for (size_t j = 0; j < s->x[e].natt; j++) total += s->x[e].att[j].unknown_at > 0;
        for (size_t j = 0; j < s->x[e].nrc; j++) {
            const obx__receipt_row *rc = &s->x[e].rc[j];
            both += rc->kind == OBX__RK_DUPLICATE && strcmp(rc->attempt_id, ev->primary_attempt_id);
            quar += rc->kind == OBX__RK_QUARANTINED;
        }
        audit_counts(s, e, &untraceable, &racing, &held);
        /* every UNKNOWN ends: an episode still open here counts as never resolved */
        unresolved += ev->unknown_since > 0 && !obx__sim_published(ev->state);
    }
    r->unknown_total += total;
    if (untraceable > 0) {
        r->unknown_untraceable += untraceable;
        fail(k, "%ld UNKNOWN transitions name no UNKNOWN attempt", untraceable);
    }
    r->racing_observed += racing;
    r->both_acked_observed += both;
    if (unresolved > 0) {
        r->unknown_unresolved += unresolved;
        fail(k, "%ld UNKNOWN outcomes were never resolved", unresolved);
    }
    r->held += held;
    r->quarantined += quar;
    return unresolved;
}

/* UNKNOWN resolution times (virtual) into the worker's list; unresolved episodes take part in
 * the percentile as never resolved. */
static void collect_resolutions(wk *k, long unresolved) {
    int64_t *ms = NULL;
    size_t n = 0;
    if (obx__st_unknown_resolutions(k->os, &ms, &n)) return;
    int64_t *grown = unresolved > 0 ? realloc(ms, (n + (size_t)unresolved) * sizeof *ms) : ms;
    if (grown) {
        ms = grown;
        for (long i = 0; i < unresolved; i++) ms[n++] = UNRESOLVED_MS;
    }
    for (size_t i = 0; i < n; i++) {
        if (k->nres == k->capres) {
            size_t c = k->capres ? k->capres * 2 : 4096;
            int64_t *p = realloc(k->res_ms, c * sizeof *p);
            if (!p) break;
            k->res_ms = p;
            k->capres = c;
        }
        k->res_ms[k->nres++] = ms[i];
    }
    free(ms);
}

/* Every transaction obx opened in the trace ended: each database is back at the trace's own
 * outer transaction (a step that left one open would commit or lose the next step's work with
 * its own). */
static void check_transactions(wk *k) {
    bool open = k->os->tx_depth != 1;
    for (int i = 0; i < 2; i++) open = open || k->cs[i]->tx_depth != 1;
    if (open) {
        k->r.internal_errors++;
        fail(k, "sim: a transaction was left open (outbox at depth %d, consumers at %d and %d)",
             k->os->tx_depth, k->cs[0]->tx_depth, k->cs[1]->tx_depth);
    }
}

void obx__sim_check_trace(wk *k) {
    results *r = &k->r;
    check_transactions(k);
    k->n_env_memo = 0;
    obx__sim_snap s;
    obx__sim_orders o;
    obx_err e = obx__sim_snap_load(k, true, &s);
    if (e || obx__app_orders(k->shop, o.event_id, MAX_EVENTS, &o.n)) {
        r->internal_errors++;
        fail(k, "sim: cannot read the outbox: %s", e ? obx_errmsg() : "the business orders");
        if (!e) obx__sim_snap_free(&s);
        return;
    }
    check_lost(k, &s, &o);
    check_ids_and_effects(k, &s, &o);
    check_purges(k, &s);
    check_migrations(k, &s);
    check_stale(k, &s);
    check_destinations(k, &s);
    check_late_acks(k, &s);
    check_evidence(k, &s);
    check_open_attempts(k, &s);
    check_consumers(k, &s);
    check_delays(k);
    long unresolved = check_unknowns(k, &s);
    obx__sim_faults_collect(k);
    collect_resolutions(k, unresolved);
    size_t nlog;
    obx__sim_world_log(k->w, &nlog);
    h_add(k, (uint64_t)s.ev.n);
    h_add(k, (uint64_t)nlog);
    obx__sim_snap_free(&s);
    if (k->failure[0]) {
        if (r->nfailing < 16) r->failing[r->nfailing++] = k->idx;
        obx__strlcpy(r->first_failure, k->failure, sizeof r->first_failure);
    }
}

/* Quiescent: every command committed, every event of the snapshot s published and applied by
 * every consumer. */
bool obx__sim_quiescent(wk *k, const obx__sim_snap *s) {
    if (k->a[0].next_cmd < k->n_events || k->a[0].retry_cmd >= 0) return false;
    bool done = true;
    for (size_t i = 0; i < s->ev.n && done; i++) done = obx__sim_published(s->ev.v[i].state);
    for (int i = 0; i < k->nconsumers && done; i++)
        done = obx__app_effects_distinct(k->app[i]) >= (long)s->ev.n;
    return done;
}
