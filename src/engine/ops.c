/*
 * ops.c — operator actions on the outbox: requeue a PARKED event (PARKED -> PENDING, the
 * rejection count reset so the route's max attempts apply afresh), and cancel a delayed event
 * before any relay claimed it (PENDING -> CANCELLED, final). Like every state change: one
 * transaction, compare-and-set, one audit row. Both run on the database server's clock
 * (obx__st_now_ms), as the relays do: a requeue by an operator whose host clock is ahead would
 * otherwise hold the event back (available_at) by that much.
 */
#include "engine/engine_int.h"

#include <string.h>

obx_err obx__requeue(obx__store *s, const char *event_id, const char *who, int64_t now) {
    obx_err err = obx_event_id_check(event_id);
    if (err) return err;
    if ((err = obx__check_field("who", who, 1, OBX__OWNER_MAX, OBX__CS_OWNER))) return err;
    if ((err = obx__st_begin(s))) return err;
    obx__rows rows = {0};
    err = obx__st_load_events(s, &event_id, 1, OBX__LOAD_LOCK, &rows);
    if (!err && !rows.n) err = obx__fail(OBX_ENOTFOUND, "event %s: not in this outbox", event_id);
    if (!err && rows.v[0].state != OBX__ST_PARKED)
        err = obx__fail(OBX_EREFUSED, "event %s is %s, only PARKED events can be requeued",
                        event_id, obx__state_name(rows.v[0].state));
    if (!err) {
        obx__event_row *cur = &rows.v[0], next = *cur;
        next.payload = NULL;
        next.state = OBX__ST_PENDING;
        next.rejections = 0;
        next.available_at = now;
        next.updated_at = now;
        obx__event_update u = {&next, cur->state, cur->claim_gen};
        bool ok = false;
        obx__audit_row a;
        obx__audit(&a, now, OBX__ACT_OPERATOR, who, &next, cur->state, next.state,
                   "requeued by operator after %d rejections", (int)cur->rejections);
        err = obx__st_update_events(s, &u, 1, &ok);
        if (!err && !ok) err = obx__fail(OBX_ECONFLICT, "event %s changed concurrently", event_id);
        if (!err) err = obx__st_insert_audit(s, &a, 1);
    }
    obx__rows_free(&rows);
    if (err) {
        obx__st_rollback(s);
        return err;
    }
    return obx__st_commit(s);
}

/* Why ev cannot be cancelled (obx_cancel's refusals), or NULL. A PENDING event with an attempt
 * (attempt_gen > 0) was sent before and went back to PENDING on a rejection: not cancelled, as
 * an older attempt of it may still reach the broker. */
static const char *cancel_refusal(const obx__event_row *ev) {
    if (ev->state != OBX__ST_PENDING) return "only a PENDING event that no relay claimed can be";
    if (!ev->env.not_before) return "it has no delay (not_before); only a delayed event can be";
    if (ev->target_no > 0) return "it is a publish slot of a delivery set (not supported)";
    if (ev->attempt_gen > 0) return "it was sent before (an attempt exists)";
    return NULL;
}

obx_err obx__cancel(obx__store *s, const char *event_id, const char *who, const char *reason,
                    int64_t now) {
    obx_err err = obx_event_id_check(event_id);
    if (err) return obx__fail(err, "event: '%s' is not an event ID (evt-<ULID>)", event_id);
    if ((err = obx__check_field("who", who, 1, OBX__OWNER_MAX, OBX__CS_OWNER)) ||
        (err = obx__check_field("reason", reason, 1, OBX_TEXT_MAX, OBX__CS_TEXT)))
        return err;
    if ((err = obx__st_begin(s))) return err;
    obx__rows rows = {0};
    err = obx__st_load_events(s, &event_id, 1, OBX__LOAD_LOCK, &rows);
    if (!err && !rows.n) err = obx__fail(OBX_ENOTFOUND, "event %s: not in this outbox", event_id);
    const char *why = err ? NULL : cancel_refusal(&rows.v[0]);
    if (why)
        err = obx__fail(OBX_EREFUSED, "event %s (%s) cannot be cancelled: %s", event_id,
                        obx__state_name(rows.v[0].state), why);
    if (!err) {
        obx__event_row *cur = &rows.v[0], next = *cur;
        next.payload = NULL;
        next.state = OBX__ST_CANCELLED;
        next.updated_at = now;
        obx__event_update u = {&next, cur->state, cur->claim_gen};
        bool ok = false;
        obx__audit_row a;
        obx__audit(&a, now, OBX__ACT_OPERATOR, who, &next, cur->state, next.state,
                   "cancelled before its time: %s", reason);
        err = obx__st_update_events(s, &u, 1, &ok);
        if (!err && !ok) err = obx__fail(OBX_ECONFLICT, "event %s changed concurrently", event_id);
        if (!err) err = obx__st_insert_audit(s, &a, 1);
    }
    obx__rows_free(&rows);
    if (err) {
        obx__st_rollback(s);
        return err;
    }
    return obx__st_commit(s);
}

obx_err obx_cancel(obx_store *s, const char *event_id, const char *who, const char *reason) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    obx__clear_error();
    return obx__cancel(s, event_id, who, reason, obx__st_now_ms(s));
}

obx_err obx_requeue(obx_store *s, const char *event_id, const char *who) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    obx__clear_error();
    return obx__requeue(s, event_id, who ? who : "operator", obx__st_now_ms(s));
}
