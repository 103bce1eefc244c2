/*
 * ops.c — operator actions on the outbox: requeue a PARKED event (PARKED -> PENDING, the
 * rejection count reset so the route's max attempts apply afresh). Like every state change:
 * one transaction, compare-and-set, one audit row.
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

obx_err obx_requeue(obx_store *s, const char *event_id, const char *who) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    obx__clear_error();
    return obx__requeue(s, event_id, who ? who : "operator", obx__wall_ms());
}
