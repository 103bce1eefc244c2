/*
 * checkers.c — the simulator's checkers: after each trace, what the outbox, the consumers'
 * databases and the simulated broker's log hold is checked against the protocol's promises —
 * no lost events, no second logical event IDs, no cross-destination retries, no digest
 * divergence, no duplicate consumer effects, no sends under a stale claim, late valid ACKs
 * converged to the publish slot or the duplicate log, UNKNOWNs traceable by attempt and
 * resolved, purges only behind every consumer and after the replay window, migrations only
 * away from a target that did not have the event. The checkers read the databases themselves
 * (sim_sql.c) rather than trusting the engine's view of them.
 */
#include "sim/sim.h"

#include <stdlib.h>
#include <string.h>

/* Retention (docs/retention.md): each PURGED event was purged after its replay window, and at that
 * moment every consumer (all critical) had applied it and every event published before it:
 * nothing a consumer still needed lost its payload. The payload is gone, the envelope stays. */
static void check_purges(wk *k) {
    results *r = &k->r;
    ocur p;
    if (!obx__simq_run(k, OQ_PURGED, NULL, 0, &p)) return;
    while (obx__simq_next(k, &p)) {
        char id[OBX_EVENT_ID_LEN + 1];
        obx__strlcpy(id, obx__simq_text(&p, 0), sizeof id);
        int64_t pub = obx__simq_int(&p, 1), seq = obx__simq_int(&p, 2),
                tp = obx__simq_null(&p, 3) ? 0 : obx__simq_int(&p, 3);
        r->purged++;
        if (pub <= 0 || pub + k->replay_window_ms > tp) {
            r->premature_purges++;
            fail(k, "%s was purged %lld ms after publication, inside the %lld ms replay window", id,
                 (long long)(tp - pub), (long long)k->replay_window_ms);
            continue;
        }
        ocur b;
        oparam op[] = {OP_I(pub), OP_I(seq)};
        if (obx__simq_run(k, OQ_BEFORE, op, 2, &b))
            while (obx__simq_next(k, &b)) {
                const char *e = obx__simq_text(&b, 0);
                for (int i = 0; i < k->nconsumers; i++) {
                    int64_t at = obx__simq_consumed_at(k, i, e);
                    if (at < 0 || at > tp) {
                        r->premature_purges++;
                        fail(k, "%s was purged at t=%lld while consumer %d %s %s", id,
                             (long long)(tp - 1700000000000LL), i,
                             at < 0 ? "never applied" : "had not yet applied", e);
                        break;
                    }
                }
            }
        obx__simq_close(&b);
    }
    obx__simq_close(&p);
}

/* Migration (docs/migration.md): an event left a generation's destination only when that target did
 * not have it — so the broker's log holds no message of a generation an event migrated away
 * from (it would reach consumers from two destinations). */
static void check_migrations(wk *k) {
    size_t nlog;
    const obx__sim_msg *log = obx__sim_world_log(k->w, &nlog);
    size_t stride = obx__sim_world_log_stride();
    ocur c;
    if (!obx__simq_run(k, OQ_MIGRATIONS, NULL, 0, &c)) return;
    while (obx__simq_next(k, &c)) {
        const char *id = obx__simq_text(&c, 0);
        int64_t old = obx__simq_int(&c, 1);
        for (size_t i = 0; i < nlog; i++) {
            const obx__sim_msg *m =
                (const obx__sim_msg *)(const void *)((const char *)log + i * stride);
            if (!strcmp(m->env.event_id, id) && m->env.envelope_gen == old) {
                k->r.migrated_with_old_copy++;
                fail(k,
                     "%s migrated away from generation %lld while its old target held it "
                     "(%s/%d, attempt %s)",
                     id, (long long)old, m->topic, (int)m->partition, m->attempt_id);
                break;
            }
        }
    }
    obx__simq_close(&c);
}

/* Lost: committed but not published, a business row without its event, or an event a consumer
 * never applied. */
static void check_lost(wk *k, long n_events) {
    results *r = &k->r;
    long v;
    if ((v = obx__simq_long(k, OQ_UNPUBLISHED, NULL, 0)) > 0) {
        r->lost_events += v;
        fail(k, "%ld committed events were never published", v);
    }
    if ((v = obx__simq_long(k, OQ_ORPHANS, NULL, 0)) > 0) {
        r->lost_events += v;
        fail(k, "%ld business orders committed without their event", v);
    }
    for (int i = 0; i < k->nconsumers; i++)
        if ((v = n_events - obx__simq_effects_distinct(k, i)) > 0) {
            r->lost_events += v;
            fail(k, "consumer %d never applied %ld events", i, v);
        }
}

/* Second logical event IDs (events no business row points at, or a command answered with two
 * different IDs), primary receipts that diverge from their frozen envelope, duplicate effects. */
static void check_ids_and_effects(wk *k, long n_events) {
    results *r = &k->r;
    long v;
    if ((v = n_events - obx__simq_long(k, OQ_REFERENCED, NULL, 0)) > 0) {
        r->second_event_ids += v;
        fail(k, "%ld events belong to no business command (second event IDs)", v);
    }
    for (int c = 0; c < k->n_events; c++)
        if (k->n_ids[c] > 1) {
            r->second_event_ids++;
            fail(k, "command %s was answered with two event IDs", k->orders[c]);
        }
    if ((v = obx__simq_long(k, OQ_DIVERGENT, NULL, 0)) > 0 ||
        (v = obx__simq_long(k, OQ_MULTI_PRIMARY, NULL, 0)) > 0) {
        r->digest_divergence += v;
        fail(k, "%ld primary receipts diverge from their frozen envelope or are doubled", v);
    }
    for (int i = 0; i < k->nconsumers; i++)
        if ((v = obx__simq_effects_doubled(k, i)) > 0) {
            r->consumer_duplicate_effects += v;
            fail(k, "consumer %d applied %ld events twice", i, v);
        }
}

/* Cross-destination: every message on the broker went to its event's frozen destination (of
 * that envelope generation) and the attempt's pinned partition. */
static void check_destinations(wk *k) {
    size_t nlog;
    const obx__sim_msg *log = obx__sim_world_log(k->w, &nlog);
    size_t stride = obx__sim_world_log_stride();
    for (size_t i = 0; i < nlog; i++) {
        const obx__sim_msg *m =
            (const obx__sim_msg *)(const void *)((const char *)log + i * stride);
        ocur c;
        oparam ev[] = {OP_S(m->env.event_id), OP_I(m->env.envelope_gen)};
        bool ok = obx__simq_run(k, OQ_ENV_OF, ev, 2, &c) && obx__simq_next(k, &c) &&
                  !strcmp(obx__simq_text(&c, 0), m->topic) &&
                  !strcmp(obx__simq_text(&c, 1), m->dest_digest);
        obx__simq_close(&c);
        oparam at[] = {OP_S(m->attempt_id)};
        ok = ok && obx__simq_long(k, OQ_ATT_PART, at, 1) == m->partition;
        if (!ok) {
            k->r.cross_destination_retries++;
            fail(k, "%s (attempt %s) reached %s/%d, not its frozen destination", m->env.event_id,
                 m->attempt_id, m->topic, (int)m->partition);
        }
    }
}

/* Every valid late ACK that reached a committed acceptance is the primary receipt or a
 * duplicate transport receipt. */
static void check_late_acks(wk *k) {
    results *r = &k->r;
    size_t nacks;
    const obx__sim_ack *acks = obx__sim_world_acks(k->w, &nacks);
    for (size_t i = 0; i < nacks; i++) {
        if (!acks[i].late || !acks[i].valid || !acks[i].attempt_id[0]) continue;
        r->late_ack_total++;
        k->r.fired[F_CLAIM_EXPIRY_LATE_ACK]++;
        oparam at[] = {OP_S(acks[i].attempt_id)};
        bool conv = obx__simq_long(k, OQ_RECEIPT_FOR, at, 1) > 0;
        if (conv)
            r->late_ack_converged++;
        else
            fail(k, "the late ACK of attempt %s left no receipt", acks[i].attempt_id);
    }
}

/* UNKNOWNs: each traceable by attempt, each resolved; the two races as they happened (injected
 * or not); held and quarantined counts. Returns the number of UNKNOWN episodes still open. */
static long check_unknowns(wk *k) {
    results *r = &k->r;
    long v;
    r->unknown_total += obx__simq_long(k, OQ_UNKNOWN_TOTAL, NULL, 0);
    if ((v = obx__simq_long(k, OQ_UNTRACEABLE, NULL, 0)) > 0) {
        r->unknown_untraceable += v;
        fail(k, "%ld UNKNOWN transitions name no UNKNOWN attempt", v);
    }
    /* a retry claim overtaken by a late ACK, and a duplicate receipt of another attempt than
     * the primary */
    r->racing_observed += obx__simq_long(k, OQ_RACING, NULL, 0);
    r->both_acked_observed += obx__simq_long(k, OQ_BOTH_ACKED, NULL, 0);
    /* every UNKNOWN ends: an episode still open here counts as never resolved */
    long unresolved = obx__simq_long(k, OQ_UNRESOLVED, NULL, 0);
    if (unresolved > 0) {
        r->unknown_unresolved += unresolved;
        fail(k, "%ld UNKNOWN outcomes were never resolved", unresolved);
    }
    r->held += obx__simq_long(k, OQ_HELD_EVER, NULL, 0);
    r->quarantined += obx__simq_long(k, OQ_QUARANTINED, NULL, 0);
    return unresolved;
}

/* UNKNOWN resolution times (virtual) into the worker's list; unresolved episodes take part in
 * the percentile as never resolved. */
static void collect_resolutions(wk *k, long unresolved) {
    int64_t *ms = NULL;
    size_t n = 0;
    if (k->os->m->unknown_resolutions(k->os, &ms, &n)) return;
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

void obx__sim_check_trace(wk *k) {
    results *r = &k->r;
    long n_events = obx__simq_long(k, OQ_EVENTS, NULL, 0);
    check_lost(k, n_events);
    check_ids_and_effects(k, n_events);
    check_purges(k);
    check_migrations(k);
    long v;
    if ((v = obx__simq_long(k, OQ_STALE, NULL, 0)) > 0) {
        r->stale_claim_sends += v;
        fail(k, "%ld attempts were sent under a claim their owner did not hold", v);
    }
    check_destinations(k);
    check_late_acks(k);
    long unresolved = check_unknowns(k);
    obx__sim_faults_collect(k);
    collect_resolutions(k, unresolved);
    size_t nlog;
    obx__sim_world_log(k->w, &nlog);
    h_add(k, (uint64_t)n_events);
    h_add(k, (uint64_t)nlog);
    if (k->failure[0]) {
        if (r->nfailing < 16) r->failing[r->nfailing++] = k->idx;
        obx__strlcpy(r->first_failure, k->failure, sizeof r->first_failure);
    }
}

/* Quiescent: every command committed, every event published and applied by every consumer. */
bool obx__sim_quiescent(wk *k) {
    if (k->a[0].next_cmd < k->n_events || k->a[0].retry_cmd >= 0) return false;
    if (obx__simq_long(k, OQ_UNPUBLISHED, NULL, 0) != 0) return false;
    long n = obx__simq_long(k, OQ_EVENTS, NULL, 0);
    for (int i = 0; i < k->nconsumers; i++)
        if (obx__simq_effects_distinct(k, i) < n) return false;
    return true;
}
