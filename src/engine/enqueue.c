/*
 * enqueue.c — the producer side: obx_enqueue() (route policy generations: route.c).
 *
 * Contract of obx_enqueue (docs/canonical-encoding.md):
 *   1. All input is validated before anything is written; a bad field is an error naming the
 *      field and its limit, and nothing is stored.
 *   2. The destination is resolved from the current route policy generation and frozen with
 *      its digest in the same transaction as the envelope; a later `route set` changes nothing
 *      for this event.
 *   3. The envelope and the event row are inserted together inside a savepoint of the caller's
 *      transaction (or a transaction of our own on a connection that has none): all or nothing.
 *      When the handle knows the event type's route, that is the store's enqueue_write (on
 *      PostgreSQL one round trip), and a route that changed since makes it write nothing (route
 *      cache, below). The same calls on every store: the simulator runs this path on SQLite.
 *   4. A repeated (tenant, idempotency_key) returns the first event's ID and inserts nothing,
 *      when it is the same event (type, aggregate, payload: a retried command); another event
 *      under a taken key is OBX_ECONFLICT, never the first event's ID (idem_same; schema.sql,
 *      obx._idem_same, the same rule for obx.enqueue()).
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

/* not_before_ms: 0 (no delay), or at most OBX_DELAY_MAX_MS after now; a past time is now. */
static obx_err validate_delay(const obx_event *ev, int64_t now) {
    if (ev->not_before_ms < 0 || ev->not_before_ms >= ((int64_t)1 << 48))
        return obx__fail(OBX_EINVAL, "not_before_ms: %lld outside 0..2^48",
                         (long long)ev->not_before_ms);
    if (ev->not_before_ms > now && ev->not_before_ms - now > OBX_DELAY_MAX_MS)
        return obx__fail(OBX_ETOOBIG,
                         "not_before_ms: %lld ms after now, over the maximum delay of %lld ms "
                         "(366 days)",
                         (long long)(ev->not_before_ms - now), (long long)OBX_DELAY_MAX_MS);
    return OBX_OK;
}

static obx_err validate_event(const obx_event *ev, size_t payload_limit, int64_t now) {
    obx_err e;
    if (!ev) return obx__fail(OBX_EINVAL, "event: NULL");
    if ((e = validate_delay(ev, now))) return e;
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
    if (ev->traceparent && *ev->traceparent && !obx__is_traceparent(ev->traceparent))
        return obx__fail(OBX_EINVAL,
                         "traceparent: not W3C \"00-<32 hex>-<16 hex>-<2 hex>\" (55 bytes)");
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

/* txid: the store's transaction identity, which the route read brought along (route_get_txid),
 * or NULL: the store supplies it and the envelope digest as it writes (enqueue_write;
 * row->envelope_digest stays ""). The producer's ev->txid comes first. id: the event ID when one
 * was drawn for this event already (a one-round-trip write that wrote nothing), else NULL or
 * "": drawn here. */
static obx_err build_row(const obx_event *ev, const obx__route_row *route, const char *txid,
                         int64_t now, bool at_server, obx__ulid_gen *gen, const char *id,
                         obx__event_row *row) {
    obx_err e;
    memset(row, 0, sizeof *row);
    obx__envelope *v = &row->env;
    if (id && *id)
        obx__strlcpy(v->event_id, id, sizeof v->event_id);
    else if ((e = obx__new_id(gen, "evt-", now, v->event_id, sizeof v->event_id)))
        return e;
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
    else if (txid)
        obx__strlcpy(v->created_txid, txid, sizeof v->created_txid);
    obx__strlcpy(v->correlation_id, ev->correlation_id ? ev->correlation_id : "",
                 sizeof v->correlation_id);
    obx__strlcpy(v->causation_id, ev->causation_id ? ev->causation_id : "", sizeof v->causation_id);
    obx__strlcpy(v->traceparent, ev->traceparent ? ev->traceparent : "", sizeof v->traceparent);
    obx__strlcpy(v->idempotency_key, ev->idempotency_key ? ev->idempotency_key : "",
                 sizeof v->idempotency_key);
    if (OBX__MUTANT(IGNORE_IDEMPOTENCY_KEY)) v->idempotency_key[0] = '\0'; /* test-only bug */
    v->not_before = ev->not_before_ms;

    char rk[OBX_KEY_MAX + 1];
    if ((e = obx__routing_key_expand(route->routing_key, v, rk, sizeof rk))) return e;
    obx__dest_from_route(route, v, &row->dest, rk);
    if ((e = obx__dest_digest(&row->dest, row->dest_digest))) return e;
    if (*v->created_txid && (e = obx__envelope_digest(v, row->envelope_digest))) return e;

    row->envelope_gen = 1;
    row->route_rel = route->rel;
    row->state = OBX__ST_PENDING;
    row->pinned_partition = -1;
    /* a delayed event: not claimable before its time (the claim's available_at <= now) */
    row->available_at = ev->not_before_ms > now ? ev->not_before_ms : now;
    if (OBX__MUTANT(CLAIM_DELAYED_EARLY)) row->available_at = now; /* test-only: claimable now */
    row->committed_at = now;
    row->updated_at = now;
    row->at_server = at_server; /* obx_enqueue(): the server's times, where it has one */
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

/* The audit row of an enqueue (NONE -> PENDING). */
static void producer_audit(obx__audit_row *a, const obx__event_row *row,
                           const obx__route_row *route, int64_t now) {
    memset(a, 0, sizeof *a);
    a->at = now;
    a->actor = OBX__ACT_PRODUCER;
    obx__strlcpy(a->who, "producer", sizeof a->who);
    obx__strlcpy(a->event_id, row->env.event_id, sizeof a->event_id);
    a->envelope_gen = 1;
    a->from = OBX__ST_NONE;
    a->to = OBX__ST_PENDING;
    snprintf(a->reason, sizeof a->reason, OBX__PRODUCER_REASON, (long long)route->gen);
}

/* The envelope, the event row and its audit row, inside the enqueue's savepoint. */
static obx_err insert_audited(obx__store *s, const obx_event *ev, const obx__event_row *row,
                              const obx__route_row *route, int64_t now) {
    obx__audit_row a;
    producer_audit(&a, row, route, now);
    return obx__st_insert_event_audit(s, row, ev->payload, ev->payload_len, &a);
}

/* ---- the route cache (struct obx_store's routes) -------------------------------------------
 * The routes this handle read last, by event type, replaced oldest first. A hit is only a
 * guess that lets the next enqueue of the type go in one round trip: enqueue_write writes
 * only while the database's current route is still the cached one, and otherwise nothing,
 * after which the enqueue reads the route as always (and caches the new one). */
#define ROUTE_CACHE_N 8

struct obx__route_cache {
    obx__route_row r[ROUTE_CACHE_N];
    int n, next;
};

static const obx__route_row *cached_route(const obx__store *s, const char *event_type) {
    const struct obx__route_cache *c = s->routes;
    for (int i = 0; c && i < c->n; i++)
        if (!strcmp(c->r[i].event_type, event_type)) return &c->r[i];
    return NULL;
}

/* Best effort: out of memory leaves the cache as it was. */
static void cache_route(obx__store *s, const obx__route_row *r) {
    if (!s->routes && !(s->routes = calloc(1, sizeof *s->routes))) return;
    struct obx__route_cache *c = s->routes;
    const obx__route_row *hit = cached_route(s, r->event_type);
    if (hit) {
        c->r[hit - c->r] = *r;
        return;
    }
    c->r[c->next] = *r;
    c->next = (c->next + 1) % ROUTE_CACHE_N;
    if (c->n < ROUTE_CACHE_N) c->n++;
}

/* The one-round-trip enqueue (enqueue_write) with the cached route of the event's type.
 * *done: answered here (out filled, or an error to return); otherwise nothing was written and
 * the long way follows: no cached route, a route with a delivery set, a route that changed
 * since, no transaction open, or an idempotency key already taken (the long way looks it up).
 * The event ID drawn for the attempt is then left in row->env.event_id (else ""), for the long
 * way to use: one ID per event, so that the simulator's seeded IDs stay the same on every
 * store (test_sim_pg compares PostgreSQL's run with SQLite's). */
static obx_err enqueue_cached(obx__store *s, const obx_event *ev, int64_t now, bool at_server,
                              obx__ulid_gen *gen, obx__event_row *row, obx_enqueue_result *out,
                              bool *done) {
    *done = false;
    row->env.event_id[0] = '\0';
    const obx__route_row *hit = cached_route(s, ev->event_type);
    /* the simulator's injected commit failures (fail_commits) act on the long way's commits */
    if (!hit || hit->targets || s->fail_commits > 0 || OBX__MUTANT(IGNORE_IDEMPOTENCY_KEY))
        return OBX_OK;
    obx__route_row route = *hit;
    obx__audit_row a;
    bool written = false;
    obx_err e = build_row(ev, &route, NULL, now, at_server, gen, NULL, row);
    if (!e) {
        producer_audit(&a, row, &route, now);
        e = obx__st_enqueue_write(s, row, ev->payload, ev->payload_len, &a, &written);
    }
    if (e == OBX_ECONFLICT && ev->idempotency_key && *ev->idempotency_key) {
        obx__clear_error();
        return OBX_OK;
    }
    if (e || !written) {
        *done = e != OBX_OK;
        return e;
    }
    obx__strlcpy(out->event_id, row->env.event_id, sizeof out->event_id);
    obx__strlcpy(out->dest_digest, row->dest_digest, sizeof out->dest_digest);
    obx__strlcpy(out->payload_digest, row->env.payload_digest, sizeof out->payload_digest);
    out->route_gen = route.gen;
    *done = true;
    return OBX_OK;
}

/* OBX_OK when ev is the event v its idempotency key already names (contract 4), else
 * OBX_ECONFLICT naming what differs. */
static obx_err idem_same(const obx_event *ev, const obx__envelope *v) {
    char d[OBX_DIGEST_LEN + 1];
    obx_err e = obx_sha256_digest(ev->payload, ev->payload_len, d);
    if (e) return e;
    const char *diff = strcmp(v->event_type, ev->event_type) ? "event_type"
                       : strcmp(v->aggregate_type, ev->aggregate_type) ||
                               strcmp(v->aggregate_id, ev->aggregate_id) ||
                               v->aggregate_version != ev->aggregate_version
                           ? "aggregate"
                       : strcmp(v->payload_digest, d) ? "payload"
                                                      : NULL;
    if (!diff) return OBX_OK;
    return obx__fail(OBX_ECONFLICT,
                     "idempotency_key: '%s' of tenant '%s' is taken by event %s with another %s",
                     ev->idempotency_key, ev->tenant, v->event_id, diff);
}

/* obx__enqueue_at, with at_server: the row's times are the store's server clock's where it has
 * one (obx__event_row.at_server) */
static obx_err enqueue_on(obx__store *s, const obx_event *ev, int64_t now, bool at_server,
                          obx__ulid_gen *gen, obx_enqueue_result *out) {
    obx_err e;
    if (!s || !out) return obx__fail(OBX_EINVAL, "store/out: NULL");
    memset(out, 0, sizeof *out);
    if ((e = validate_event(ev, s->payload_limit, now))) return e;

    obx__event_row *row = malloc(sizeof *row);
    if (!row) return obx__fail(OBX_ENOMEM, "enqueue: out of memory");
    /* A one-round-trip attempt that wrote nothing leaves its event ID to the long way, and a
     * seeded generator (the simulator's) is put back if the long way needs none (a retry
     * answered by its first event): the same draws as on a store without the one-trip write. */
    obx__ulid_gen before = gen ? *gen : (obx__ulid_gen){0};
    bool done = false;
    e = enqueue_cached(s, ev, now, at_server, gen, row, out, &done);
    char drawn[sizeof row->env.event_id];
    obx__strlcpy(drawn, row->env.event_id, sizeof drawn);
    bool drawn_used = done;
    for (int tries = 0; !done && tries < 2; tries++) {
        if ((e = obx__st_begin(s))) break;
        if (ev->idempotency_key && *ev->idempotency_key && !OBX__MUTANT(IGNORE_IDEMPOTENCY_KEY)) {
            e = obx__st_idem_lookup(s, ev->tenant, ev->idempotency_key, out->event_id);
            if (e == OBX_OK) {
                out->existing = 1;
                obx__rows rows = {0};
                const char *id = out->event_id;
                e = obx__st_load_events(s, &id, 1, 0, &rows);
                if (!e && rows.n) e = idem_same(ev, &rows.v[0].env);
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
        char txid[sizeof row->env.created_txid] = "";
        if ((e = obx__st_route_get_txid(s, ev->event_type, &route, txid, sizeof txid))) {
            obx__st_rollback(s);
            break;
        }
        cache_route(s, &route);
        drawn_used |= !tries;
        if ((e = build_row(ev, &route, txid, now, at_server, gen, tries ? NULL : drawn, row)) ||
            (e = insert_audited(s, ev, row, &route, now))) {
            obx__st_rollback(s);
            /* a concurrent producer committed the same idempotency key first: look again */
            if (e == OBX_ECONFLICT && ev->idempotency_key && *ev->idempotency_key && !tries)
                continue;
            break;
        }
        if (route.targets && (e = enqueue_targets(s, ev, &route, row, now, gen))) {
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
    if (!e && !out->existing && s->on_enqueued) s->on_enqueued(s->on_enqueued_user, row, now);
    free(row);
    if (*drawn && !drawn_used && gen) *gen = before;
    if (e) memset(out, 0, sizeof *out);
    return e;
}

/* On the given clock (the simulator's, the tests'): its times are written as given, on every store.
 */
obx_err obx__enqueue_at(obx__store *s, const obx_event *ev, int64_t now, obx__ulid_gen *gen,
                        obx_enqueue_result *out) {
    return enqueue_on(s, ev, now, false, gen, out);
}

/* On the host's clock, which is the producer's own: the event ID's time and occurred_at (the
 * producer's statements, frozen in the envelope and its digest) and the delay's check are on it.
 * The times relays decide on are the database server's where the store has a server clock
 * (PostgreSQL: committed_at, updated_at, available_at and the producer's audit row, written by the
 * server in the same statement, docs/design.md "One clock"). SQLite is a file on the producer's
 * host, read by relays on the same host clock: there the host's now stands. */
obx_err obx_enqueue(obx_store *s, const obx_event *ev, obx_enqueue_result *out) {
    obx__clear_error();
    return enqueue_on(s, ev, obx__wall_ms(), true, NULL, out);
}
