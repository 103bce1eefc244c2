/*
 * states.c — the outbox state machine of docs/design.md, "States" as data: one table of allowed
 * (from, to, actor) transitions, naming the function that performs each. Every state change
 * in every store goes through obx__transition_allowed() before its compare-and-set, and the
 * unit tests walk the whole table and every pair outside it.
 *
 *   PENDING -> CLAIMED -> SENDING -> PUBLISHED -> RETAINED -> PURGED
 *                           |            ^
 *                           v            |
 *                    DISPATCH_UNKNOWN -> RECONCILING -> RETRY_CLAIMED -> SENDING
 *                           ^                 |
 *                           +-----------------+   (cannot prove either way)
 *
 *   SENDING --definite rejection--> PENDING (backoff) | PARKED (max attempts) --operator--> PENDING
 *   PENDING (delayed, never claimed) --operator: obx_cancel--> CANCELLED (final)
 *
 * Invariants the table encodes:
 *   1. Only the acceptor enters PUBLISHED (docs/design.md, "The single acceptance point").
 *   2. Only a registered attempt enters SENDING (CLAIMED/RETRY_CLAIMED -> SENDING).
 *   3. A possibly-sent event (SENDING) never goes back to PENDING except on a definite
 *      rejection; an expired lease makes it DISPATCH_UNKNOWN.
 *   4. Nothing leaves PURGED or CANCELLED; only a PENDING event is cancelled (never one that
 *      may have been sent).
 *   5. Events are created by the producer; the migrator only adds a publish slot (a delivery-set
 *      target) to an event that exists, and moves undelivered events to a new envelope
 *      generation — never one whose outcome is UNKNOWN (the reconciler resolves those first).
 */
#include "core.h"

#include <string.h>

#define T(f, t, a, fn, why)                                                                        \
    { OBX__ST_##f, OBX__ST_##t, OBX__ACT_##a, fn, why }

const obx__transition obx__transitions[] = {
    T(NONE, PENDING, PRODUCER, "obx_enqueue", "business transaction committed the envelope"),
    T(PENDING, CLAIMED, DISPATCHER, "obx__engine_claim", "claim with claim_gen+1 and a lease"),
    T(CLAIMED, CLAIMED, DISPATCHER, "obx__engine_claim", "re-claim: lease expired, no attempt"),
    T(CLAIMED, PENDING, DISPATCHER, "obx__engine_release", "claim released on shutdown"),
    T(CLAIMED, SENDING, DISPATCHER, "obx__engine_begin_attempts", "attempt registered"),
    T(SENDING, PUBLISHED, ACCEPTOR, "obx__accept_receipts", "receipt filled the publish slot"),
    T(SENDING, DISPATCH_UNKNOWN, DISPATCHER, "obx__engine_apply_outcomes",
      "ACK lost, timed out or transport failed"),
    T(SENDING, DISPATCH_UNKNOWN, SWEEPER, "obx__engine_sweep", "SENDING lease expired"),
    T(SENDING, PENDING, DISPATCHER, "obx__engine_apply_outcomes",
      "definite rejection: retry later with backoff"),
    T(SENDING, PARKED, DISPATCHER, "obx__engine_apply_outcomes",
      "definite rejection after the route's max attempts"),
    T(DISPATCH_UNKNOWN, RECONCILING, RECONCILER, "obx__reconcile_begin", "reconciler lease"),
    T(DISPATCH_UNKNOWN, PENDING, DISPATCHER, "obx__engine_apply_outcomes",
      "late definite rejection of the current attempt (after the sweep): backoff"),
    T(DISPATCH_UNKNOWN, PARKED, DISPATCHER, "obx__engine_apply_outcomes",
      "late definite rejection of the current attempt after the route's max attempts"),
    T(DISPATCH_UNKNOWN, PUBLISHED, ACCEPTOR, "obx__accept_receipts", "late ACK accepted"),
    T(RECONCILING, PUBLISHED, ACCEPTOR, "obx__accept_receipts", "lookup FOUND or late ACK"),
    T(RECONCILING, RETRY_CLAIMED, RECONCILER, "obx__reconcile_apply",
      "authoritative NOT_FOUND or blind same-target retry allowed"),
    T(RECONCILING, DISPATCH_UNKNOWN, RECONCILER, "obx__reconcile_apply",
      "cannot tell: next check scheduled"),
    T(RECONCILING, PENDING, RECONCILER, "obx__reconcile_apply",
      "definite rejection of the current attempt while reconciling: it counts, backoff"),
    T(RECONCILING, PARKED, RECONCILER, "obx__reconcile_apply",
      "the current attempt was rejected while reconciling, at the route's max attempts"),
    T(RECONCILING, RECONCILING, RECONCILER, "obx__reconcile_begin",
      "reconciler lease expired: taken over"),
    T(RETRY_CLAIMED, SENDING, RECONCILER, "obx__engine_begin_attempts",
      "retry attempt (attempt_gen+1) to the frozen destination"),
    T(RETRY_CLAIMED, PUBLISHED, ACCEPTOR, "obx__accept_receipts", "late ACK of an older attempt"),
    /* After a blind retry, the older attempt stays UNKNOWN; if the newer one is then definitely
     * rejected the event is PENDING again (or CLAIMED, or PARKED) while the older one may still
     * have been persisted. Its late valid ACK must reach the empty slot (docs/design.md, "The
     * single acceptance point"). */
    T(PENDING, PUBLISHED, ACCEPTOR, "obx__accept_receipts", "late ACK of an older UNKNOWN attempt"),
    T(CLAIMED, PUBLISHED, ACCEPTOR, "obx__accept_receipts", "late ACK of an older UNKNOWN attempt"),
    T(PARKED, PUBLISHED, ACCEPTOR, "obx__accept_receipts", "late ACK of an older UNKNOWN attempt"),
    T(RETRY_CLAIMED, RETRY_CLAIMED, RECONCILER, "obx__reconcile_begin",
      "retry claim lease expired: taken over"),
    T(PARKED, PENDING, OPERATOR, "obx_requeue", "operator requeued a parked event"),
    T(PENDING, CANCELLED, OPERATOR, "obx_cancel",
      "operator cancelled a delayed event before its claim"),
    /* An operator resolving an UNKNOWN (held or not) by a same-target retry: the event is
     * handed to the reconciler with an expired lease, which sends to the frozen destination.
     * Accepting with evidence goes through the acceptance point instead (ACCEPTOR rows). */
    T(DISPATCH_UNKNOWN, RETRY_CLAIMED, OPERATOR, "obx__resolve",
      "operator: same-target retry of an UNKNOWN outcome"),
    T(PUBLISHED, RETAINED, PURGER, "obx__purge_step", "critical consumers' watermarks cover it"),
    T(RETAINED, PURGED, PURGER, "obx__purge_step",
      "replay window and forced watermark passed; payload dropped, tombstone kept"),
    T(PENDING, PENDING, MIGRATOR, "obx__migrate", "new envelope generation (never sent)"),
    T(PARKED, PENDING, MIGRATOR, "obx__migrate", "new envelope generation (definitely rejected)"),
    T(RETRY_CLAIMED, PENDING, MIGRATOR, "obx__migrate",
      "new envelope generation (authoritative NOT_FOUND)"),
    /* A delivery-set target added to an existing event later (docs/migration.md): a new publish
     * slot of that event, created by the migrator with its proof and receipt. */
    T(NONE, PENDING, MIGRATOR, "obx__migrate", "delivery-set target added to an existing event"),
};
#undef T

const size_t obx__transition_count = sizeof obx__transitions / sizeof obx__transitions[0];

static const char *state_names[] = {
#define OBX__S(n, s) s,
    OBX__STATE_LIST(OBX__S)
#undef OBX__S
};

static const char *actor_names[] = {
#define OBX__A(n, s) s,
    OBX__ACTOR_LIST(OBX__A)
#undef OBX__A
};

static const char *attempt_names[] = {
#define OBX__AS(n, s) s,
    OBX__ATTEMPT_STATE_LIST(OBX__AS)
#undef OBX__AS
};

const char *obx__state_name(obx__state s) {
    return (unsigned)s < OBX__ST_COUNT ? state_names[s] : "?";
}

obx__state obx__state_parse(const char *s) {
    for (int i = 0; s && i < OBX__ST_COUNT; i++)
        if (!strcmp(s, state_names[i])) return (obx__state)i;
    return OBX__ST_COUNT;
}

const char *obx__actor_name(obx__actor a) {
    return (unsigned)a < OBX__ACT_COUNT ? actor_names[a] : "?";
}

const char *obx__attempt_state_name(obx__attempt_state s) {
    return (unsigned)s < OBX__AT_COUNT ? attempt_names[s] : "?";
}

obx__attempt_state obx__attempt_state_parse(const char *s) {
    for (int i = 0; s && i < OBX__AT_COUNT; i++)
        if (!strcmp(s, attempt_names[i])) return (obx__attempt_state)i;
    return OBX__AT_COUNT;
}

bool obx__transition_allowed(obx__state from, obx__state to, obx__actor actor) {
    for (size_t i = 0; i < obx__transition_count; i++)
        if (obx__transitions[i].from == from && obx__transitions[i].to == to &&
            obx__transitions[i].actor == actor)
            return true;
    return false;
}

bool obx__state_is_published(obx__state s) {
    return s == OBX__ST_PUBLISHED || s == OBX__ST_RETAINED || s == OBX__ST_PURGED;
}
