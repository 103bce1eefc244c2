/*
 * shared.c — what both SQL stores share (shared.h): the row decoders (one place for each row
 * type's field order, casts, and the parsing of states, kinds and receipt sources), the
 * migration runner, and transaction nesting.
 */
#include "store/shared.h"

#include <stdio.h>
#include <string.h>

#define I64(c) rd->i64(rd->ctx, (c))
#define FLAG(c) rd->flag(rd->ctx, (c))
#define TEXT(c, field) rd->text(rd->ctx, (c), (field), sizeof(field))

void obx__event_decode(const obx__col_reader *rd, obx__event_row *r) {
    int i = 0;
    char state[32];
    r->seq = I64(i++);
    TEXT(i++, r->env.event_id);
    r->envelope_gen = (int32_t)I64(i++);
    r->env.envelope_gen = r->envelope_gen;
    TEXT(i++, state);
    r->state = obx__state_parse(state);
    r->claim_gen = I64(i++);
    TEXT(i++, r->owner);
    r->lease_until = I64(i++);
    r->attempt_gen = (int32_t)I64(i++);
    TEXT(i++, r->attempt_id);
    r->pinned_partition = (int32_t)I64(i++);
    r->rejections = (int32_t)I64(i++);
    r->available_at = I64(i++);
    r->next_check_at = I64(i++);
    r->unknown_since = I64(i++);
    TEXT(i++, r->primary_attempt_id);
    r->published_at = I64(i++);
    r->committed_at = I64(i++);
    r->updated_at = I64(i++);
    r->max_attempts = (int32_t)I64(i++);
    r->blind_retry = FLAG(i++);
    r->unordered = FLAG(i++);
    TEXT(i++, r->alias);
    TEXT(i++, r->env.aggregate_type);
    TEXT(i++, r->env.aggregate_id);
    r->env.aggregate_version = I64(i++);
    TEXT(i++, r->env.event_type);
    TEXT(i++, r->env.payload_schema);
    TEXT(i++, r->env.payload_digest);
    TEXT(i++, r->env.tenant);
    r->env.occurred_at = I64(i++);
    TEXT(i++, r->env.created_txid);
    TEXT(i++, r->env.correlation_id);
    TEXT(i++, r->env.causation_id);
    TEXT(i++, r->env.traceparent);
    TEXT(i++, r->env.idempotency_key);
    TEXT(i++, r->envelope_digest);
    TEXT(i++, r->dest.cluster);
    TEXT(i++, r->dest.topic);
    TEXT(i++, r->dest.routing_key);
    TEXT(i++, r->dest.algorithm);
    r->dest.route_gen = I64(i++);
    TEXT(i++, r->dest.serializer);
    TEXT(i++, r->dest.durability);
    TEXT(i++, r->dest.required_acks);
    TEXT(i++, r->dest_digest);
    r->payload_len = (size_t)I64(i++);
    r->payload_purged = FLAG(i++);
    TEXT(i++, r->logical_id);
    r->target_no = (int32_t)I64(i++);
    r->held_at = I64(i++);
    r->env.not_before = I64(i++);
    _Static_assert(OBX__EVENT_NCOLS == 51, "obx__event_decode reads OBX__EVENT_COLS in order");
}

void obx__attempt_decode(const obx__col_reader *rd, obx__attempt_row *a) {
    char state[32];
    memset(a, 0, sizeof *a);
    TEXT(0, a->attempt_id);
    TEXT(1, a->event_id);
    a->envelope_gen = (int32_t)I64(2);
    a->attempt_gen = (int32_t)I64(3);
    a->claim_gen = I64(4);
    TEXT(5, a->owner);
    TEXT(6, a->dest_digest);
    a->partition = (int32_t)I64(7);
    TEXT(8, state);
    a->state = obx__attempt_state_parse(state);
    a->started_at = I64(9);
    a->unknown_at = I64(10);
    a->ended_at = I64(11);
    a->offset_before = I64(12);
    a->quiet_until = I64(13);
    TEXT(14, a->detail);
}

void obx__receipt_decode(const obx__col_reader *rd, obx__receipt_row *r) {
    char kind[32], src[16];
    memset(r, 0, sizeof *r);
    TEXT(0, r->event_id);
    r->envelope_gen = (int32_t)I64(1);
    TEXT(2, r->attempt_id);
    TEXT(3, kind);
    for (int k = 0; k < 4; k++)
        if (!strcmp(kind, obx__receipt_kind_name((obx__receipt_kind)k)))
            r->kind = (obx__receipt_kind)k;
    TEXT(4, r->cluster);
    TEXT(5, r->topic);
    r->partition = (int32_t)I64(6);
    r->offset = I64(7);
    r->broker_ts = I64(8);
    TEXT(9, r->payload_digest);
    TEXT(10, r->dest_digest);
    TEXT(11, r->reason);
    r->created_at = I64(12);
    TEXT(13, src);
    r->source = obx__receipt_source_parse(src);
    if (r->source == OBX__RS_COUNT) r->source = OBX__RS_BROKER;
}

void obx__envelope_at_decode(const obx__col_reader *rd, obx__envelope_at_row *r) {
    memset(r, 0, sizeof *r);
    TEXT(0, r->dest.cluster);
    TEXT(1, r->dest.topic);
    TEXT(2, r->dest.routing_key);
    TEXT(3, r->dest.algorithm);
    r->dest.route_gen = I64(4);
    TEXT(5, r->dest.serializer);
    TEXT(6, r->dest.durability);
    TEXT(7, r->dest.required_acks);
    TEXT(8, r->dest_digest);
    TEXT(9, r->payload_digest);
    TEXT(10, r->envelope_digest);
}

void obx__route_decode(const obx__col_reader *rd, obx__route_row *r) {
    memset(r, 0, sizeof *r);
    r->gen = I64(0);
    TEXT(1, r->event_type);
    TEXT(2, r->cluster);
    TEXT(3, r->topic);
    TEXT(4, r->routing_key);
    TEXT(5, r->algorithm);
    TEXT(6, r->serializer);
    TEXT(7, r->durability);
    TEXT(8, r->required_acks);
    r->max_attempts = (int32_t)I64(9);
    r->blind_retry = FLAG(10);
    r->unordered = FLAG(11);
    TEXT(12, r->alias);
    r->created_at = I64(13);
    r->targets = (int32_t)I64(14);
    TEXT(15, r->encrypt_key);
}

obx_err obx__read_events(obx__store *s, const obx__read_req *req, const obx__event_readers *r,
                         obx__rows *out) {
    switch (req->by) {
    case OBX__READ_IDS: return r->ids(s, req->ids, req->n_ids, req->flags, out);
    case OBX__READ_CLAIM: return r->claim(s, req->claim, out);
    case OBX__READ_SELECT: return r->select(s, req->select, out);
    case OBX__READ_FILTER: return r->filter(s, req->filter, out);
    case OBX__READ_RETENTION: return r->retention(s, req->retention, out);
    case OBX__READ_CORRELATION: return r->correlation(s, req->correlation_id, req->limit, out);
    default: return obx__fail(OBX_EINTERNAL, "read_events: unknown selector %d", (int)req->by);
    }
}

obx_err obx__migrate_run(obx__store *s, int found, const char *const *scripts, int last,
                         const char *meta_table, obx__exec_fn exec) {
    obx_err e;
    if (found > last)
        return obx__fail(
            OBX_ESCHEMA,
            "database schema version %d is newer than this obx knows (%d): upgrade obx", found,
            last);
    for (int v = found + 1; v <= last; v++) {
        char sql[192];
        if ((e = exec(s, scripts[v])))
            return obx__fail_prefix(e, "migration to schema version %d", v);
        snprintf(sql, sizeof sql,
                 "INSERT INTO %s (key, value) VALUES ('schema_version', '%d') "
                 "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                 meta_table, v);
        if ((e = exec(s, sql))) return e;
    }
    return OBX_OK;
}

/* ---- transaction nesting ------------------------------------------------------------------ */

obx_err obx__tx_begin(obx__store *s, obx__tx_nest *t, const obx__tx_ops *ops) {
    obx_err e;
    if (t->depth == 0) {
        bool caller = false;
        if ((e = ops->in_tx(s, &caller))) return e;
        if (!caller) {
            if ((e = ops->begin(s))) return e;
            t->outer_begin = true;
            t->depth = 1;
            return OBX_OK;
        }
        t->outer_begin = false;
    }
    if ((e = ops->savepoint(s, t->depth, OBX__SP_OPEN))) return e;
    t->depth++;
    return OBX_OK;
}

obx_err obx__tx_commit(obx__store *s, obx__tx_nest *t, const obx__tx_ops *ops) {
    if (t->depth <= 0) return obx__fail(OBX_EINTERNAL, "%s: commit without begin", s->m->name);
    t->depth--;
    obx_err e = t->depth == 0 && t->outer_begin ? ops->commit(s)
                                                : ops->savepoint(s, t->depth, OBX__SP_RELEASE);
    if (t->depth == 0 && ops->idle) ops->idle(s);
    return e;
}

obx_err obx__tx_rollback(obx__store *s, obx__tx_nest *t, const obx__tx_ops *ops) {
    if (t->depth <= 0) return OBX_OK;
    t->depth--;
    obx_err e = OBX_OK;
    /* a connection that is gone took the transaction with it: the server rolled it back */
    if (!(ops->gone && ops->gone(s)))
        e = t->depth == 0 && t->outer_begin ? ops->rollback(s)
                                            : ops->savepoint(s, t->depth, OBX__SP_ROLLBACK);
    if (t->depth == 0 && ops->idle) ops->idle(s);
    return e;
}
