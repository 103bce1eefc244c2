/*
 * enqueue.c — the producer side: route policy generations and obx_enqueue().
 *
 * Contract of obx_enqueue (DESIGN.md §1):
 *   1. All input is validated before anything is written; a bad field is an error naming the
 *      field and its limit, and nothing is stored.
 *   2. The destination is resolved from the current route policy generation and frozen with
 *      its digest in the same transaction as the envelope; a later `route set` changes nothing
 *      for this event.
 *   3. The envelope and the event row are inserted together inside a savepoint of the caller's
 *      transaction (or a transaction of our own on a connection that has none): all or nothing.
 *   4. A repeated (tenant, idempotency_key) returns the first event's ID and inserts nothing.
 */
#include "engine/engine.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static obx__ulid_gen default_gen;
static pthread_mutex_t gen_mu = PTHREAD_MUTEX_INITIALIZER;

obx_err obx__new_id(obx__ulid_gen *g, const char *prefix, int64_t now, char *out, size_t cap) {
    char ulid[27];
    obx_err e;
    if (g)
        e = obx__ulid_next(g, now, ulid);
    else {
        pthread_mutex_lock(&gen_mu);
        e = obx__ulid_next(&default_gen, now, ulid);
        pthread_mutex_unlock(&gen_mu);
    }
    if (e) return e;
    size_t pl = strlen(prefix);
    if (pl + 27 > cap) return obx__fail(OBX_EINTERNAL, "id buffer too small");
    memcpy(out, prefix, pl);
    memcpy(out + pl, ulid, 27);
    return OBX_OK;
}

/* ---- route policy ------------------------------------------------------------------------- */

static const char *dflt(const char *v, const char *d) { return v && *v ? v : d; }

obx_err obx__route_validate(const obx_route *r, obx__route_row *row, int64_t now) {
    obx_err e;
    memset(row, 0, sizeof *row);
    if (!r) return obx__fail(OBX_EINVAL, "route: NULL");
    if ((e = obx__check_field("event_type", r->event_type, 1, OBX_NAME_MAX, OBX__CS_EVENT_TYPE)) ||
        (e = obx__check_field("cluster", r->cluster, 1, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("topic", r->topic, 1, OBX_TOPIC_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("routing_key", r->routing_key, 0, OBX_KEY_MAX, OBX__CS_TEXT)) ||
        (e = obx__check_field("algorithm", r->algorithm, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("serializer", r->serializer, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("durability", r->durability, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("required_acks", r->required_acks, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("alias", r->alias, 0, OBX_NAME_MAX, OBX__CS_NAME)))
        return e;
    const char *alg = dflt(r->algorithm, "murmur2");
    if (strcmp(alg, "murmur2") && strcmp(alg, "fnv1a") && strcmp(alg, "none"))
        return obx__fail(OBX_EINVAL, "algorithm: '%s' unknown (murmur2, fnv1a or none)", alg);
    const char *acks = dflt(r->required_acks, "all");
    if (strcmp(acks, "all") && strcmp(acks, "1") && strcmp(acks, "confirm"))
        return obx__fail(OBX_EINVAL, "required_acks: '%s' unknown (all, 1 or confirm)", acks);
    const char *dur = dflt(r->durability, "persistent");
    if (strcmp(dur, "persistent") && strcmp(dur, "transient"))
        return obx__fail(OBX_EINVAL, "durability: '%s' unknown (persistent or transient)", dur);
    if (r->max_attempts < 0 || r->max_attempts > 1000)
        return obx__fail(OBX_EINVAL, "max_attempts: %d outside 1..1000 (0 = default 8)",
                         r->max_attempts);
    /* the template must expand for a sample envelope */
    const char *tpl = dflt(r->routing_key, "{tenant}.{aggregate_type}.{aggregate_id}");
    obx__envelope probe;
    memset(&probe, 0, sizeof probe);
    char tmp[OBX_KEY_MAX + 1];
    if ((e = obx__routing_key_expand(tpl, &probe, tmp, sizeof tmp))) return e;

    obx__strlcpy(row->event_type, r->event_type, sizeof row->event_type);
    obx__strlcpy(row->cluster, r->cluster, sizeof row->cluster);
    obx__strlcpy(row->topic, r->topic, sizeof row->topic);
    obx__strlcpy(row->routing_key, tpl, sizeof row->routing_key);
    obx__strlcpy(row->algorithm, alg, sizeof row->algorithm);
    obx__strlcpy(row->serializer, dflt(r->serializer, "raw"), sizeof row->serializer);
    obx__strlcpy(row->durability, dur, sizeof row->durability);
    obx__strlcpy(row->required_acks, acks, sizeof row->required_acks);
    row->max_attempts = r->max_attempts ? r->max_attempts : 8;
    row->blind_retry = r->blind_retry != 0;
    row->unordered = r->unordered != 0;
    obx__strlcpy(row->alias, dflt(r->alias, "obx"), sizeof row->alias);
    row->created_at = now;
    return OBX_OK;
}

obx_err obx__route_set_at(obx__store *s, const obx_route *r, int64_t now, int64_t *gen) {
    obx__route_row row;
    obx_err e = obx__route_validate(r, &row, now);
    if (e) return e;
    if ((e = obx__st_begin(s))) return e;
    e = s->m->route_put(s, &row, gen);
    if (e) {
        obx__st_rollback(s);
        return e;
    }
    return obx__st_commit(s);
}

obx_err obx_route_set(obx_store *s, const obx_route *r, int64_t *gen) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    obx__clear_error();
    return obx__route_set_at(s, r, obx__wall_ms(), gen);
}

json_t *obx__route_json(const obx__route_row *r) {
    return json_pack("{s:I,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:b,s:b,s:s,s:I}", "gen",
                     (json_int_t)r->gen, "event_type", r->event_type, "cluster", r->cluster,
                     "topic", r->topic, "routing_key", r->routing_key, "algorithm", r->algorithm,
                     "serializer", r->serializer, "durability", r->durability, "required_acks",
                     r->required_acks, "max_attempts", (int)r->max_attempts, "blind_retry",
                     (int)r->blind_retry, "unordered", (int)r->unordered, "alias", r->alias,
                     "created_at", (json_int_t)r->created_at);
}

obx_err obx__json_out(json_t *j, char **out) {
    if (!j) return obx__fail(OBX_ENOMEM, "JSON: out of memory");
    char *txt = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!txt) return obx__fail(OBX_ENOMEM, "JSON: out of memory");
    /* json_dumps uses jansson's allocator (malloc by default): obx_free() is free() */
    *out = txt;
    return OBX_OK;
}

obx_err obx_route_list(obx_store *s, int all, char **out) {
    if (!s || !out) return obx__fail(OBX_EINVAL, "store/out: NULL");
    *out = NULL;
    obx__clear_error();
    obx__route_row *rows = NULL;
    size_t n = 0;
    obx_err e = s->m->route_list(s, all != 0, &rows, &n);
    if (e) return e;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) json_array_append_new(arr, obx__route_json(&rows[i]));
    free(rows);
    return obx__json_out(arr, out);
}

/* ---- enqueue ------------------------------------------------------------------------------ */

static obx_err validate_event(const obx_event *ev, size_t payload_limit) {
    obx_err e;
    if (!ev) return obx__fail(OBX_EINVAL, "event: NULL");
    if ((e = obx__check_field("event_type", ev->event_type, 1, OBX_NAME_MAX, OBX__CS_EVENT_TYPE)) ||
        (e = obx__check_field("aggregate_type", ev->aggregate_type, 1, OBX_NAME_MAX,
                              OBX__CS_NAME)) ||
        (e = obx__check_field("aggregate_id", ev->aggregate_id, 1, OBX_KEY_MAX, OBX__CS_TEXT)) ||
        (e = obx__check_field("tenant", ev->tenant, 1, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("correlation_id", ev->correlation_id, 0, OBX_TEXT_MAX,
                              OBX__CS_TEXT)) ||
        (e = obx__check_field("causation_id", ev->causation_id, 0, OBX_TEXT_MAX, OBX__CS_TEXT)) ||
        (e = obx__check_field("idempotency_key", ev->idempotency_key, 0, OBX_KEY_MAX,
                              OBX__CS_TEXT)) ||
        (e = obx__check_field("txid", ev->txid, 0, OBX_TEXT_MAX, OBX__CS_TEXT)))
        return e;
    if (ev->aggregate_version < 0)
        return obx__fail(OBX_EINVAL, "aggregate_version: %lld is negative (must be >= 0)",
                         (long long)ev->aggregate_version);
    if (ev->occurred_at_ms < 0 || ev->occurred_at_ms >= ((int64_t)1 << 48))
        return obx__fail(OBX_EINVAL, "occurred_at_ms: %lld outside 0..2^48",
                         (long long)ev->occurred_at_ms);
    if (ev->payload_schema && !obx__is_digest(ev->payload_schema))
        return obx__fail(OBX_EINVAL, "payload_schema: must be \"sha256:\" + 64 lowercase hex");
    if (ev->traceparent && *ev->traceparent) {
        const char *t = ev->traceparent;
        bool ok = strlen(t) == OBX_TRACEPARENT_LEN && t[2] == '-' && t[35] == '-' && t[52] == '-';
        for (int i = 0; ok && i < OBX_TRACEPARENT_LEN; i++)
            if (i != 2 && i != 35 && i != 52)
                ok = (t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f');
        if (!ok)
            return obx__fail(OBX_EINVAL,
                             "traceparent: not W3C \"00-<32 hex>-<16 hex>-<2 hex>\" (55 bytes)");
    }
    if (!ev->payload || ev->payload_len == 0)
        return obx__fail(OBX_EINVAL, "payload: empty (1..%zu bytes required)", payload_limit);
    if (ev->payload_len > payload_limit)
        return obx__fail(OBX_ETOOBIG, "payload: %zu bytes, over the limit of %zu bytes",
                         ev->payload_len, payload_limit);
    return OBX_OK;
}

void obx__dest_from_route(const obx__route_row *route, const obx__envelope *env, obx__dest *d,
                          const char *routing_key) {
    memset(d, 0, sizeof *d);
    obx__strlcpy(d->cluster, route->cluster, sizeof d->cluster);
    obx__strlcpy(d->topic, route->topic, sizeof d->topic);
    obx__strlcpy(d->routing_key, routing_key, sizeof d->routing_key);
    obx__strlcpy(d->algorithm, route->algorithm, sizeof d->algorithm);
    d->route_gen = route->gen;
    obx__strlcpy(d->serializer, route->serializer, sizeof d->serializer);
    obx__strlcpy(d->durability, route->durability, sizeof d->durability);
    obx__strlcpy(d->required_acks, route->required_acks, sizeof d->required_acks);
    (void)env;
}

static obx_err build_row(obx__store *s, const obx_event *ev, const obx__route_row *route,
                         int64_t now, obx__ulid_gen *gen, obx__event_row *row) {
    obx_err e;
    memset(row, 0, sizeof *row);
    obx__envelope *v = &row->env;
    if ((e = obx__new_id(gen, "evt-", now, v->event_id, sizeof v->event_id))) return e;
    v->envelope_gen = 1;
    obx__strlcpy(v->aggregate_type, ev->aggregate_type, sizeof v->aggregate_type);
    obx__strlcpy(v->aggregate_id, ev->aggregate_id, sizeof v->aggregate_id);
    v->aggregate_version = ev->aggregate_version;
    obx__strlcpy(v->event_type, ev->event_type, sizeof v->event_type);
    if (ev->payload_schema)
        obx__strlcpy(v->payload_schema, ev->payload_schema, sizeof v->payload_schema);
    else {
        char tmp[OBX_NAME_MAX + 16];
        snprintf(tmp, sizeof tmp, "schema:%s", ev->event_type);
        if ((e = obx_sha256_digest(tmp, strlen(tmp), v->payload_schema))) return e;
    }
    if ((e = obx_sha256_digest(ev->payload, ev->payload_len, v->payload_digest))) return e;
    obx__strlcpy(v->tenant, ev->tenant, sizeof v->tenant);
    v->occurred_at = ev->occurred_at_ms ? ev->occurred_at_ms : now;
    if (ev->txid && *ev->txid)
        obx__strlcpy(v->created_txid, ev->txid, sizeof v->created_txid);
    else if (s->m->txid(s, v->created_txid, sizeof v->created_txid) != OBX_OK) {
        /* SQLite cannot name its transaction: mint one (documented in obx.h) */
        obx__clear_error();
        if ((e = obx__new_id(gen, "tx-", now, v->created_txid, sizeof v->created_txid))) return e;
    }
    obx__strlcpy(v->correlation_id, ev->correlation_id ? ev->correlation_id : "",
                 sizeof v->correlation_id);
    obx__strlcpy(v->causation_id, ev->causation_id ? ev->causation_id : "", sizeof v->causation_id);
    obx__strlcpy(v->traceparent, ev->traceparent ? ev->traceparent : "", sizeof v->traceparent);
    obx__strlcpy(v->idempotency_key, ev->idempotency_key ? ev->idempotency_key : "",
                 sizeof v->idempotency_key);
    if (OBX__MUTANT(IGNORE_IDEMPOTENCY_KEY)) v->idempotency_key[0] = '\0'; /* test-only bug */

    char rk[OBX_KEY_MAX + 1];
    if ((e = obx__routing_key_expand(route->routing_key, v, rk, sizeof rk))) return e;
    obx__dest_from_route(route, v, &row->dest, rk);
    if ((e = obx__dest_digest(&row->dest, row->dest_digest))) return e;
    if ((e = obx__envelope_digest(v, row->envelope_digest))) return e;

    row->envelope_gen = 1;
    row->state = OBX__ST_PENDING;
    row->pinned_partition = -1;
    row->available_at = now;
    row->committed_at = now;
    row->updated_at = now;
    row->max_attempts = route->max_attempts;
    row->blind_retry = route->blind_retry;
    row->unordered = route->unordered;
    obx__strlcpy(row->alias, route->alias, sizeof row->alias);
    return OBX_OK;
}

obx_err obx__enqueue_at(obx__store *s, const obx_event *ev, int64_t now, obx__ulid_gen *gen,
                        obx_enqueue_result *out) {
    obx_err e;
    if (!s || !out) return obx__fail(OBX_EINVAL, "store/out: NULL");
    memset(out, 0, sizeof *out);
    if ((e = validate_event(ev, s->payload_limit))) return e;

    obx__event_row *row = malloc(sizeof *row);
    if (!row) return obx__fail(OBX_ENOMEM, "enqueue: out of memory");
    for (int tries = 0; tries < 2; tries++) {
        if ((e = obx__st_begin(s))) break;
        if (ev->idempotency_key && *ev->idempotency_key && !OBX__MUTANT(IGNORE_IDEMPOTENCY_KEY)) {
            e = s->m->idem_lookup(s, ev->tenant, ev->idempotency_key, out->event_id);
            if (e == OBX_OK) {
                out->existing = 1;
                obx__rows rows = {0};
                const char *id = out->event_id;
                e = obx__st_load_events(s, &id, 1, 0, &rows);
                if (!e && rows.n) {
                    obx__strlcpy(out->dest_digest, rows.v[0].dest_digest, sizeof out->dest_digest);
                    obx__strlcpy(out->payload_digest, rows.v[0].env.payload_digest,
                                 sizeof out->payload_digest);
                    out->route_gen = rows.v[0].dest.route_gen;
                }
                obx__rows_free(&rows);
                obx__st_rollback(s); /* nothing written */
                break;
            }
            if (e != OBX_ENOTFOUND) {
                obx__st_rollback(s);
                break;
            }
        }
        obx__route_row route;
        if ((e = s->m->route_get(s, ev->event_type, &route)) ||
            (e = build_row(s, ev, &route, now, gen, row)) ||
            (e = s->m->insert_event(s, row, ev->payload, ev->payload_len))) {
            obx__st_rollback(s);
            /* a concurrent producer committed the same idempotency key first: look again */
            if (e == OBX_ECONFLICT && ev->idempotency_key && *ev->idempotency_key && !tries)
                continue;
            break;
        }
        obx__audit_row a;
        memset(&a, 0, sizeof a);
        a.at = now;
        a.actor = OBX__ACT_PRODUCER;
        obx__strlcpy(a.who, "producer", sizeof a.who);
        obx__strlcpy(a.event_id, row->env.event_id, sizeof a.event_id);
        a.envelope_gen = 1;
        a.from = OBX__ST_NONE;
        a.to = OBX__ST_PENDING;
        snprintf(a.reason, sizeof a.reason, "enqueued under route generation %lld",
                 (long long)route.gen);
        if ((e = obx__st_insert_audit(s, &a, 1))) {
            obx__st_rollback(s);
            break;
        }
        if ((e = obx__st_commit(s))) break;
        obx__strlcpy(out->event_id, row->env.event_id, sizeof out->event_id);
        obx__strlcpy(out->dest_digest, row->dest_digest, sizeof out->dest_digest);
        obx__strlcpy(out->payload_digest, row->env.payload_digest, sizeof out->payload_digest);
        out->route_gen = route.gen;
        break;
    }
    free(row);
    if (e) memset(out, 0, sizeof *out);
    return e;
}

obx_err obx_enqueue(obx_store *s, const obx_event *ev, obx_enqueue_result *out) {
    obx__clear_error();
    return obx__enqueue_at(s, ev, obx__wall_ms(), NULL, out);
}
