/*
 * enqueue.c — the producer side: route policy generations and obx_enqueue().
 *
 * Contract of obx_enqueue (docs/canonical-encoding.md):
 *   1. All input is validated before anything is written; a bad field is an error naming the
 *      field and its limit, and nothing is stored.
 *   2. The destination is resolved from the current route policy generation and frozen with
 *      its digest in the same transaction as the envelope; a later `route set` changes nothing
 *      for this event.
 *   3. The envelope and the event row are inserted together inside a savepoint of the caller's
 *      transaction (or a transaction of our own on a connection that has none): all or nothing.
 *   4. A repeated (tenant, idempotency_key) returns the first event's ID and inserts nothing.
 *   5. A route generation with a delivery set gives the event one publish slot per target in
 *      the same transaction (docs/migration.md): target 1 is the event's own row; every further
 *      target is a row with its own slot ID, the event's envelope and its own frozen
 *      destination, sent under the event's ID. The set, its rule and its slots are frozen.
 */
#include "engine/engine_int.h"

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
    const char *pol = dflt(r->on_unknown, "retry");
    if (strcmp(pol, "retry") && strcmp(pol, "hold"))
        return obx__fail(OBX_EINVAL, "on_unknown: '%s' unknown (retry or hold)", pol);
    if (!strcmp(pol, "hold") && r->blind_retry)
        return obx__fail(OBX_EINVAL,
                         "on_unknown: 'hold' contradicts blind_retry (a blind retry is 'retry')");
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
    row->blind_retry = strcmp(pol, "hold") != 0; /* the column holds the UNKNOWN policy */
    row->unordered = r->unordered != 0;
    obx__strlcpy(row->alias, dflt(r->alias, "obx"), sizeof row->alias);
    row->created_at = now;
    return OBX_OK;
}

/* A delivery set's targets: every field checked as the route's (named "targets[i].field"),
 * NULL fields take the route's value, (cluster, topic) differs between all targets. */
obx_err obx__route_set_validate(const obx_route *r, const obx__route_row *primary,
                                obx__route_set_row *set) {
    obx_err e;
    memset(set, 0, sizeof *set);
    if (r->n_targets > OBX__SET_MAX - 1)
        return obx__fail(OBX_ETOOBIG, "targets: %zu further destinations, over the limit of %d",
                         r->n_targets, OBX__SET_MAX - 1);
    if (r->n_targets && !r->targets) return obx__fail(OBX_EINVAL, "targets: NULL with n_targets");
    const char *rule = dflt(r->completion, "all");
    if (strcmp(rule, "all") && strcmp(rule, "any"))
        return obx__fail(OBX_EINVAL, "completion: '%s' unknown (all or any)", rule);
    if (!r->n_targets && r->completion && *r->completion)
        return obx__fail(OBX_EINVAL, "completion: given without targets (a delivery set needs "
                                     "at least one further destination)");
    obx__strlcpy(set->completion, rule, sizeof set->completion);
    for (size_t i = 0; i < r->n_targets; i++) {
        const obx_route_target *t = &r->targets[i];
        char f[64];
#define CHECK(field, min, max, cs)                                                                 \
    (snprintf(f, sizeof f, "targets[%zu].%s", i, #field),                                          \
     obx__check_field(f, t->field, min, max, cs))
        if ((e = CHECK(cluster, 1, OBX_NAME_MAX, OBX__CS_NAME)) ||
            (e = CHECK(topic, 1, OBX_TOPIC_MAX, OBX__CS_NAME)) ||
            (e = CHECK(routing_key, 0, OBX_KEY_MAX, OBX__CS_TEXT)) ||
            (e = CHECK(algorithm, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
            (e = CHECK(serializer, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
            (e = CHECK(durability, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
            (e = CHECK(required_acks, 0, OBX_NAME_MAX, OBX__CS_NAME)))
            return e;
#undef CHECK
        /* the same rules as the route's own fields: check a route made of this target */
        obx_route probe = *r;
        probe.cluster = t->cluster;
        probe.topic = t->topic;
        probe.routing_key = dflt(t->routing_key, primary->routing_key);
        probe.algorithm = dflt(t->algorithm, primary->algorithm);
        probe.serializer = dflt(t->serializer, primary->serializer);
        probe.durability = dflt(t->durability, primary->durability);
        probe.required_acks = dflt(t->required_acks, primary->required_acks);
        probe.targets = NULL;
        probe.n_targets = 0;
        obx__route_row tr;
        if ((e = obx__route_validate(&probe, &tr, 0)))
            return obx__fail_prefix(e, "targets[%zu]", i);
        if (!strcmp(tr.cluster, primary->cluster) && !strcmp(tr.topic, primary->topic))
            return obx__fail(OBX_EINVAL,
                             "targets[%zu]: %s/%s is the route's own destination (a delivery set "
                             "names each destination once)",
                             i, tr.cluster, tr.topic);
        for (int32_t k = 0; k < set->n; k++)
            if (!strcmp(tr.cluster, set->t[k].cluster) && !strcmp(tr.topic, set->t[k].topic))
                return obx__fail(OBX_EINVAL,
                                 "targets[%zu]: %s/%s is targets[%d] already (a delivery set "
                                 "names each destination once)",
                                 i, tr.cluster, tr.topic, (int)k);
        obx__route_target_row *o = &set->t[set->n++];
        o->target_no = set->n + 1;
        obx__strlcpy(o->cluster, tr.cluster, sizeof o->cluster);
        obx__strlcpy(o->topic, tr.topic, sizeof o->topic);
        obx__strlcpy(o->routing_key, tr.routing_key, sizeof o->routing_key);
        obx__strlcpy(o->algorithm, tr.algorithm, sizeof o->algorithm);
        obx__strlcpy(o->serializer, tr.serializer, sizeof o->serializer);
        obx__strlcpy(o->durability, tr.durability, sizeof o->durability);
        obx__strlcpy(o->required_acks, tr.required_acks, sizeof o->required_acks);
    }
    return OBX_OK;
}

obx_err obx__route_put_rows(obx__store *s, obx__route_row *row, obx__route_set_row *set,
                            int64_t *gen) {
    int64_t g = 0;
    obx_err e = obx__st_begin(s);
    if (e) return e;
    e = obx__st_route_put(s, row, &g);
    if (!e && set && set->n) {
        set->route_gen = g;
        e = obx__st_route_set_put(s, set);
    }
    if (e) {
        obx__st_rollback(s);
        return e;
    }
    if ((e = obx__st_commit(s))) return e;
    row->gen = g;
    row->targets = set && set->n ? set->n + 1 : 0;
    if (gen) *gen = g;
    return OBX_OK;
}

/* A destination contract the named cluster's registered backend cannot honour (the cluster
 * registry, filled by the relays that serve it) is refused here, naming the field, the value
 * and what the backend offers. A cluster no relay registered yet is accepted: its relay parks
 * the events it cannot honour, with the reason (dispatch.c). */
static obx_err contract_check(obx__store *s, const char *target, const char *cluster,
                              const char *durability, const char *acks, const char *serializer) {
    obx__cluster_row c;
    obx_err e = obx__st_cluster_get(s, cluster, &c);
    if (e == OBX_ENOTFOUND) return OBX_OK;
    if (e) return e;
    const char *field = NULL, *value = NULL, *offer = NULL;
    if (!obx__csv_has(c.durability, durability))
        field = "durability", value = durability, offer = c.durability;
    else if (!obx__csv_has(c.required_acks, acks))
        field = "required_acks", value = acks, offer = c.required_acks;
    else if (!obx__csv_has(c.serializer, serializer))
        field = "serializer", value = serializer, offer = c.serializer;
    if (!field) return OBX_OK;
    return obx__fail(OBX_EINVAL,
                     "%s%s: '%s' cannot be honoured by cluster %s (its relay %s registered a %s "
                     "backend, which honours: %s)",
                     target, field, value, cluster, c.relay, c.backend, offer);
}

obx_err obx__route_set_at(obx__store *s, const obx_route *r, int64_t now, int64_t *gen) {
    obx__route_row row;
    obx__route_set_row set;
    memset(&set, 0, sizeof set);
    obx_err e = obx__route_validate(r, &row, now);
    if (!e) e = obx__route_set_validate(r, &row, &set);
    if (!e)
        e = contract_check(s, "", row.cluster, row.durability, row.required_acks, row.serializer);
    for (int32_t i = 0; !e && i < set.n; i++) {
        char target[32];
        snprintf(target, sizeof target, "targets[%d].", (int)i);
        e = contract_check(s, target, set.t[i].cluster, set.t[i].durability, set.t[i].required_acks,
                           set.t[i].serializer);
    }
    if (e) return e;
    return obx__route_put_rows(s, &row, &set, gen);
}

obx_err obx_route_set(obx_store *s, const obx_route *r, int64_t *gen) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    obx__clear_error();
    return obx__route_set_at(s, r, obx__wall_ms(), gen);
}

json_t *obx__route_json(const obx__route_row *r) {
    return json_pack("{s:I,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:s,s:b,s:b,s:s,s:I,s:i}", "gen",
                     (json_int_t)r->gen, "event_type", r->event_type, "cluster", r->cluster,
                     "topic", r->topic, "routing_key", r->routing_key, "algorithm", r->algorithm,
                     "serializer", r->serializer, "durability", r->durability, "required_acks",
                     r->required_acks, "max_attempts", (int)r->max_attempts, "on_unknown",
                     r->blind_retry ? "retry" : "hold", "blind_retry", (int)r->blind_retry,
                     "unordered", (int)r->unordered, "alias", r->alias, "created_at",
                     (json_int_t)r->created_at, "targets", (int)r->targets);
}

static json_t *route_set_json(const obx__route_set_row *set) {
    json_t *t = json_array();
    for (int32_t i = 0; t && i < set->n; i++)
        json_array_append_new(
            t, json_pack("{s:i,s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "target", (int)set->t[i].target_no,
                         "cluster", set->t[i].cluster, "topic", set->t[i].topic, "routing_key",
                         set->t[i].routing_key, "algorithm", set->t[i].algorithm, "serializer",
                         set->t[i].serializer, "durability", set->t[i].durability, "required_acks",
                         set->t[i].required_acks));
    return json_pack("{s:s,s:o}", "completion", set->completion, "targets", t);
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
    obx_err e = obx__st_route_list(s, all != 0, &rows, &n);
    if (e) return e;
    json_t *arr = json_array();
    for (size_t i = 0; !e && arr && i < n; i++) {
        json_t *j = obx__route_json(&rows[i]);
        if (j && rows[i].targets) {
            obx__route_set_row set;
            if (!(e = obx__st_route_set_get(s, rows[i].gen, &set)))
                json_object_set_new(j, "delivery_set", route_set_json(&set));
        }
        json_array_append_new(arr, j);
    }
    free(rows);
    if (e) {
        json_decref(arr);
        return e;
    }
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

obx_err obx__dest_for(const obx__route_row *route, const obx__route_target_row *t,
                      const obx__envelope *env, obx__dest *d, char digest[OBX_DIGEST_LEN + 1]) {
    obx__route_row r = *route;
    if (t) { /* a delivery-set target: the route's policy generation, the target's place */
        obx__strlcpy(r.cluster, t->cluster, sizeof r.cluster);
        obx__strlcpy(r.topic, t->topic, sizeof r.topic);
        obx__strlcpy(r.routing_key, t->routing_key, sizeof r.routing_key);
        obx__strlcpy(r.algorithm, t->algorithm, sizeof r.algorithm);
        obx__strlcpy(r.serializer, t->serializer, sizeof r.serializer);
        obx__strlcpy(r.durability, t->durability, sizeof r.durability);
        obx__strlcpy(r.required_acks, t->required_acks, sizeof r.required_acks);
    }
    char rk[OBX_KEY_MAX + 1];
    obx_err e = obx__routing_key_expand(r.routing_key, env, rk, sizeof rk);
    if (e) return e;
    obx__dest_from_route(&r, env, d, rk);
    return obx__dest_digest(d, digest);
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
    else if (obx__st_txid(s, v->created_txid, sizeof v->created_txid) != OBX_OK) {
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

/* Contract 5: the further targets of a route's delivery set, inside the enqueue transaction. */
static obx_err enqueue_targets(obx__store *s, const obx_event *ev, const obx__route_row *route,
                               const obx__event_row *first, int64_t now, obx__ulid_gen *gen) {
    obx__route_set_row set;
    obx_err e = obx__st_route_set_get(s, route->gen, &set);
    if (e) return e;
    obx__event_row *slot = malloc(sizeof *slot);
    if (!slot) return obx__fail(OBX_ENOMEM, "enqueue: out of memory");
    obx__delivery_row d;
    memset(&d, 0, sizeof d);
    obx__strlcpy(d.event_id, first->env.event_id, sizeof d.event_id);
    obx__strlcpy(d.completion, set.completion, sizeof d.completion);
    d.route_gen = route->gen;
    d.created_at = now;
    d.t[0] = (obx__delivery_target_row){.target_no = 1, .created_at = now};
    obx__strlcpy(d.t[0].slot_id, first->env.event_id, sizeof d.t[0].slot_id);
    obx__strlcpy(d.t[0].origin, "enqueue", sizeof d.t[0].origin);
    d.n = 1;
    for (int32_t i = 0; !e && i < set.n; i++) {
        /* the event's envelope (and envelope digest) under the slot's own key, the target's
         * frozen destination; no idempotency key on the slot's row (the event has it) */
        *slot = *first;
        slot->target_no = set.t[i].target_no;
        if ((e = obx__dest_for(route, &set.t[i], &first->env, &slot->dest, slot->dest_digest)) ||
            (e = obx__new_id(gen, "evt-", now, slot->env.event_id, sizeof slot->env.event_id)) ||
            (e = obx__st_insert_event(s, slot, ev->payload, ev->payload_len)))
            break;
        obx__audit_row a;
        obx__audit(&a, now, OBX__ACT_PRODUCER, "producer", slot, OBX__ST_NONE, OBX__ST_PENDING,
                   "target %d of delivery set %s, enqueued under route generation %lld",
                   (int)slot->target_no, first->env.event_id, (long long)route->gen);
        if ((e = obx__st_insert_audit(s, &a, 1))) break;
        obx__delivery_target_row *t = &d.t[d.n++];
        t->target_no = slot->target_no;
        obx__strlcpy(t->slot_id, slot->env.event_id, sizeof t->slot_id);
        obx__strlcpy(t->origin, "enqueue", sizeof t->origin);
        t->created_at = now;
    }
    free(slot);
    return e ? e : obx__st_delivery_put(s, &d);
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
            e = obx__st_idem_lookup(s, ev->tenant, ev->idempotency_key, out->event_id);
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
        if ((e = obx__st_route_get(s, ev->event_type, &route)) ||
            (e = build_row(s, ev, &route, now, gen, row)) ||
            (e = obx__st_insert_event(s, row, ev->payload, ev->payload_len))) {
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
        if ((e = obx__st_insert_audit(s, &a, 1)) ||
            (route.targets && (e = enqueue_targets(s, ev, &route, row, now, gen)))) {
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
