/*
 * route.c — route policy generations: validation of a route and its delivery set, the
 * destination contract check against a registered cluster, and the rows every generation
 * writes (obx_route_set, obx_route_list, and the takeover's new generation). A generation is
 * never changed once written: events freeze the generation that was current at their commit
 * (enqueue.c), so a later `route set` changes nothing for them (docs/design.md, "The envelope
 * and destination, frozen at commit").
 */
#include "engine/engine_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

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
        (e = obx__check_field("alias", r->alias, 0, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("encrypt", r->encrypt, 0, OBX_KEY_ID_MAX, OBX__CS_NAME)))
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
    obx__strlcpy(row->encrypt_key, dflt(r->encrypt, ""), sizeof row->encrypt_key);
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

obx_err obx__route_prepare(obx__store *s, const obx_route *r, int64_t now, obx__route_row *row,
                           obx__route_set_row *set) {
    memset(set, 0, sizeof *set);
    obx_err e = obx__route_validate(r, row, now);
    if (!e) e = obx__route_set_validate(r, row, set);
    if (!e)
        e = contract_check(s, "", row->cluster, row->durability, row->required_acks,
                           row->serializer);
    for (int32_t i = 0; !e && i < set->n; i++) {
        char target[32];
        snprintf(target, sizeof target, "targets[%d].", (int)i);
        e = contract_check(s, target, set->t[i].cluster, set->t[i].durability,
                           set->t[i].required_acks, set->t[i].serializer);
    }
    return e;
}

obx_err obx__route_set_at(obx__store *s, const obx_route *r, int64_t now, int64_t *gen) {
    obx__route_row row;
    obx__route_set_row set;
    obx_err e = obx__route_prepare(s, r, now, &row, &set);
    if (e) return e;
    return obx__route_put_rows(s, &row, &set, gen);
}

obx_err obx_route_set(obx_store *s, const obx_route *r, int64_t *gen) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    obx__clear_error();
    return obx__route_set_at(s, r, obx__wall_ms(), gen);
}

obx_err obx_cluster_seen(obx_store *s, const char *cluster, int64_t *out_ms) {
    if (!s || !cluster || !out_ms) return obx__fail(OBX_EINVAL, "cluster seen: NULL argument");
    obx__clear_error();
    *out_ms = 0;
    obx__cluster_row c;
    obx_err e = obx__st_cluster_get(s, cluster, &c);
    if (e == OBX_ENOTFOUND) {
        obx__clear_error();
        return OBX_OK;
    }
    if (!e) *out_ms = c.seen_at;
    return e;
}

json_t *obx__route_json(const obx__route_row *r) {
    json_t *j = json_pack("{s:I,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:s,s:b,s:b,s:s,s:I,s:i}",
                          "gen", (json_int_t)r->gen, "event_type", r->event_type, "cluster",
                          r->cluster, "topic", r->topic, "routing_key", r->routing_key, "algorithm",
                          r->algorithm, "serializer", r->serializer, "durability", r->durability,
                          "required_acks", r->required_acks, "max_attempts", (int)r->max_attempts,
                          "on_unknown", r->blind_retry ? "retry" : "hold", "blind_retry",
                          (int)r->blind_retry, "unordered", (int)r->unordered, "alias", r->alias,
                          "created_at_ms", (json_int_t)r->created_at, "targets", (int)r->targets);
    if (j && r->encrypt_key[0]) json_object_set_new(j, "encrypt", json_string(r->encrypt_key));
    return j;
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
