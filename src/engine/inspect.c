/*
 * inspect.c — one event's whole story as JSON: frozen envelope and destination with digests,
 * protocol state, attempts, receipts and audit rows, its delivery set (targets, slots and
 * whether it counts as delivered) and its migration receipts. Used by `obx inspect`, the
 * dashboard and `obx trace`.
 */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

json_t *obx__event_json(const obx__event_row *r) {
    json_t *env = json_pack(
        "{s:s,s:s,s:i,s:s,s:s,s:I,s:s,s:s,s:s,s:s,s:I,s:s,s:s,s:s,s:s,s:s,s:s}", "schema",
        "outboxEnvelope.v1", "event_id", r->env.event_id, "envelope_gen", (int)r->envelope_gen,
        "aggregate_type", r->env.aggregate_type, "aggregate_id", r->env.aggregate_id,
        "aggregate_version", (json_int_t)r->env.aggregate_version, "event_type", r->env.event_type,
        "payload_schema", r->env.payload_schema, "payload_digest", r->env.payload_digest, "tenant",
        r->env.tenant, "occurred_at_ms", (json_int_t)r->env.occurred_at, "created_txid",
        r->env.created_txid, "correlation_id", r->env.correlation_id, "causation_id",
        r->env.causation_id, "traceparent", r->env.traceparent, "idempotency_key",
        r->env.idempotency_key, "envelope_digest", r->envelope_digest);
    if (env && r->env.not_before) /* a delayed event's frozen time (only when set, as digested) */
        json_object_set_new(env, "not_before_at_ms", json_integer(r->env.not_before));
    json_t *dest = json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:s,s:s,s:s,s:s}", "schema",
                             "destination.v1", "cluster", r->dest.cluster, "topic", r->dest.topic,
                             "routing_key", r->dest.routing_key, "algorithm", r->dest.algorithm,
                             "route_policy_gen", (json_int_t)r->dest.route_gen, "serializer",
                             r->dest.serializer, "durability", r->dest.durability, "required_acks",
                             r->dest.required_acks, "dest_digest", r->dest_digest);
    json_t *st = json_pack(
        "{s:s,s:I,s:s,s:I,s:i,s:s,s:i,s:i,s:I,s:I,s:I,s:s,s:I,s:I,s:I,s:i,s:b,s:b,s:s,s:I,s:b}",
        "state", obx__state_name(r->state), "claim_gen", (json_int_t)r->claim_gen, "owner",
        r->owner, "lease_until_ms", (json_int_t)r->lease_until, "attempt_gen", (int)r->attempt_gen,
        "attempt_id", r->attempt_id, "pinned_partition", (int)r->pinned_partition, "rejections",
        (int)r->rejections, "available_at_ms", (json_int_t)r->available_at, "next_check_at_ms",
        (json_int_t)r->next_check_at, "unknown_since_ms", (json_int_t)r->unknown_since,
        "primary_attempt_id", r->primary_attempt_id, "published_at_ms", (json_int_t)r->published_at,
        "committed_at_ms", (json_int_t)r->committed_at, "updated_at_ms", (json_int_t)r->updated_at,
        "max_attempts", (int)r->max_attempts, "blind_retry", (int)r->blind_retry, "unordered",
        (int)r->unordered, "alias", r->alias, "payload_len", (json_int_t)r->payload_len,
        "payload_purged", (int)r->payload_purged);
    if (st) { /* the UNKNOWN policy frozen with the route generation, and whether it is held */
        json_object_set_new(st, "on_unknown", json_string(r->blind_retry ? "retry" : "hold"));
        json_object_set_new(st, "held_at_ms", json_integer(r->held_at));
    }
    if (!env || !dest || !st) {
        json_decref(env);
        json_decref(dest);
        json_decref(st);
        return NULL;
    }
    return json_pack("{s:s,s:o,s:o,s:o}", "event_id", r->env.event_id, "envelope", env,
                     "destination", dest, "status", st);
}

json_t *obx__attempt_json(const obx__attempt_row *a) {
    return json_pack("{s:s,s:i,s:i,s:I,s:s,s:s,s:i,s:s,s:I,s:I,s:I,s:I,s:I,s:s}", "attempt_id",
                     a->attempt_id, "envelope_gen", (int)a->envelope_gen, "attempt_gen",
                     (int)a->attempt_gen, "claim_gen", (json_int_t)a->claim_gen, "owner", a->owner,
                     "dest_digest", a->dest_digest, "partition", (int)a->partition, "state",
                     obx__attempt_state_name(a->state), "started_at_ms", (json_int_t)a->started_at,
                     "unknown_at_ms", (json_int_t)a->unknown_at, "ended_at_ms",
                     (json_int_t)a->ended_at, "offset_before", (json_int_t)a->offset_before,
                     "quiet_until_ms", (json_int_t)a->quiet_until, "detail", a->detail);
}

json_t *obx__receipt_json(const obx__receipt_row *r) {
    return json_pack("{s:s,s:i,s:s,s:s,s:s,s:i,s:I,s:I,s:s,s:s,s:s,s:I,s:s}", "kind",
                     obx__receipt_kind_name(r->kind), "envelope_gen", (int)r->envelope_gen,
                     "attempt_id", r->attempt_id, "cluster", r->cluster, "topic", r->topic,
                     "partition", (int)r->partition, "offset", (json_int_t)r->offset,
                     "broker_ts_ms", (json_int_t)r->broker_ts, "payload_digest", r->payload_digest,
                     "dest_digest", r->dest_digest, "reason", r->reason, "created_at_ms",
                     (json_int_t)r->created_at, "source", obx__receipt_source_name(r->source));
}

json_t *obx__audit_json(const obx__audit_row *a) {
    return json_pack("{s:I,s:s,s:s,s:i,s:s,s:s,s:I,s:s,s:i,s:s}", "at_ms", (json_int_t)a->at,
                     "actor", obx__actor_name(a->actor), "who", a->who, "envelope_gen",
                     (int)a->envelope_gen, "from", obx__state_name(a->from), "to",
                     obx__state_name(a->to), "claim_gen", (json_int_t)a->claim_gen, "attempt_id",
                     a->attempt_id, "attempt_gen", (int)a->attempt_gen, "reason", a->reason);
}

obx_err obx__delivery_status_of(obx__store *s, const char *event_id, obx__delivery_status *out) {
    memset(out, 0, sizeof *out);
    obx_err e = obx__st_delivery_get(s, event_id, &out->set);
    const char *ids[OBX__SET_MAX];
    size_t n = 0;
    if (e == OBX_ENOTFOUND) { /* a single destination: its own slot */
        obx__clear_error();
        ids[n++] = event_id;
    } else if (e) {
        return e;
    } else {
        out->in_set = true;
        for (int32_t i = 0; i < out->set.n; i++) ids[n++] = out->set.t[i].slot_id;
    }
    if ((e = obx__st_load_events(s, ids, n, 0, &out->slots))) return e;
    if (out->slots.n != n) {
        obx__rows_free(&out->slots);
        return obx__fail(OBX_ENOTFOUND, "event %s: not in this outbox", event_id);
    }
    int64_t first = 0, last = 0;
    for (size_t i = 0; i < n; i++) {
        const obx__event_row *r = &out->slots.v[i];
        if (!obx__state_is_published(r->state)) continue;
        out->published++;
        if (!first || r->published_at < first) first = r->published_at;
        if (r->published_at > last) last = r->published_at;
    }
    bool any = out->in_set && !strcmp(out->set.completion, "any");
    out->complete = any ? out->published > 0 : (size_t)out->published == n;
    out->completed_at = out->complete ? (any ? first : last) : 0;
    return OBX_OK;
}

static json_t *delivery_json(const obx__delivery_status *d) {
    json_t *t = json_array();
    for (size_t i = 0; t && i < d->slots.n; i++) {
        const obx__event_row *r = &d->slots.v[i];
        json_array_append_new(t, json_pack("{s:i,s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:I}", "target",
                                           (int)d->set.t[i].target_no, "slot_id", r->env.event_id,
                                           "origin", d->set.t[i].origin, "state",
                                           obx__state_name(r->state), "cluster", r->dest.cluster,
                                           "topic", r->dest.topic, "dest_digest", r->dest_digest,
                                           "envelope_gen", (int)r->envelope_gen, "published_at_ms",
                                           (json_int_t)r->published_at));
    }
    return json_pack("{s:s,s:s,s:I,s:i,s:b,s:I,s:o}", "event_id", d->set.event_id, "completion",
                     d->set.completion, "route_gen", (json_int_t)d->set.route_gen, "published",
                     (int)d->published, "complete", (int)d->complete, "completed_at_ms",
                     (json_int_t)d->completed_at, "targets", t);
}

obx_err obx__inspect_json(obx__store *s, const char *event_id, json_t **out) {
    obx_err e;
    *out = NULL;
    if ((e = obx_event_id_check(event_id))) return e;
    obx__rows rows = {0};
    if ((e = obx__st_load_events(s, &event_id, 1, 0, &rows))) return e;
    if (!rows.n) {
        obx__rows_free(&rows);
        return obx__fail(OBX_ENOTFOUND, "event %s: not in this outbox", event_id);
    }
    json_t *doc = obx__event_json(&rows.v[0]);
    if (doc && rows.v[0].target_no > 1) /* a further target's slot: whose event it carries */
        json_object_set_new(json_object_get(doc, "status"), "logical_event_id",
                            json_string(obx__wire_id(&rows.v[0])));
    obx__rows_free(&rows);
    obx__attempt_row *att = NULL;
    obx__receipt_row *rc = NULL;
    obx__audit_row *au = NULL;
    size_t na = 0, nr = 0, nu = 0;
    if (!doc) return obx__fail(OBX_ENOMEM, "inspect: out of memory");
    if ((e = obx__st_load_attempts(s, NULL, 0, event_id, &att, &na)) ||
        (e = obx__st_load_receipts(s, event_id, &rc, &nr)) ||
        (e = obx__st_load_audit(s, event_id, &au, &nu))) {
        json_decref(doc);
        free(att);
        free(rc);
        return e;
    }
    json_t *ja = json_array(), *jr = json_array(), *ju = json_array();
    for (size_t i = 0; i < na; i++) json_array_append_new(ja, obx__attempt_json(&att[i]));
    for (size_t i = 0; i < nr; i++) json_array_append_new(jr, obx__receipt_json(&rc[i]));
    for (size_t i = 0; i < nu; i++) json_array_append_new(ju, obx__audit_json(&au[i]));
    free(att);
    free(rc);
    free(au);
    json_object_set_new(doc, "attempts", ja);
    json_object_set_new(doc, "receipts", jr);
    json_object_set_new(doc, "audit", ju);
    /* the delivery set it belongs to, and what its migration receipts prove */
    obx__delivery_status ds;
    if ((e = obx__delivery_status_of(s, event_id, &ds))) {
        json_decref(doc);
        return e;
    }
    if (ds.in_set) json_object_set_new(doc, "delivery_set", delivery_json(&ds));
    obx__rows_free(&ds.slots);
    char **det = NULL;
    size_t nd = 0;
    if ((e = obx__st_receipt_details(s, event_id, OBX__RK_MIGRATION, &det, &nd))) {
        json_decref(doc);
        return e;
    }
    json_t *jm = json_array();
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_loads(det[i], 0, NULL);
        json_array_append_new(jm, d ? d : json_string(det[i]));
        free(det[i]);
    }
    free(det);
    json_object_set_new(doc, "migrations", jm);
    *out = doc;
    return OBX_OK;
}

obx_err obx_inspect(obx_store *s, const char *event_id, char **out) {
    if (!s || !out) return obx__fail(OBX_EINVAL, "store/out: NULL");
    *out = NULL;
    obx__clear_error();
    json_t *doc;
    obx_err e = obx__inspect_json(s, event_id, &doc);
    if (e) return e;
    return obx__json_out(doc, out);
}
