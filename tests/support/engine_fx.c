/*
 * engine_fx.c — the engine fixture (engine_fx.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

obx_err obx_t_sqlite_store(const char *dir, const char *name, int *count, obx__store **out) {
    char url[256];
    snprintf(url, sizeof url, "sqlite:%s/%s%d.db", dir, name, ++*count);
    obx_err e = obx__st_open(url, out);
    if (!e) e = obx_store_init(*out);
    return e;
}

int64_t obx_t_route(obx__store *s, int64_t now, const char *type, const char *topic, int blind,
                    int max_attempts, const char *alias) {
    obx_route r = {.event_type = type,
                   .cluster = "local",
                   .topic = topic,
                   .on_unknown = blind ? "retry" : "hold",
                   .max_attempts = max_attempts,
                   .alias = alias};
    int64_t gen = 0;
    OK(obx__route_set_at(s, &r, now, &gen));
    return gen;
}

obx_event obx_t_event(const char *type, const char *agg_type, const char *agg_id,
                      const char *tenant, const char *payload) {
    obx_event ev = {.event_type = type,
                    .aggregate_type = agg_type,
                    .aggregate_id = agg_id,
                    .tenant = tenant,
                    .payload = payload,
                    .payload_len = strlen(payload)};
    return ev;
}

obx_event obx_t_order_event(const char *id, const char *payload) {
    obx_event ev = obx_t_event("order.created.v2", "order", id, "tenant-7", payload);
    ev.aggregate_version = 1;
    ev.correlation_id = "corr-1";
    return ev;
}

void obx_t_enq(obx__store *s, int64_t now, const char *type, const char *agg, const char *corr,
               const char *payload, char id[31]) {
    char own[64];
    if (!payload) {
        snprintf(own, sizeof own, "{\"order\":\"%s\"}", agg);
        payload = own;
    }
    obx_event ev = obx_t_event(type, "order", agg, "t1", payload);
    ev.aggregate_version = 1;
    ev.correlation_id = corr;
    obx_enqueue_result r;
    OK(obx__enqueue_at(s, &ev, now, NULL, &r));
    strcpy(id, r.event_id);
}

void obx_t_engine(obx__engine *e, obx__store *s, obx__broker *b, const char *owner, uint64_t seed,
                  const char *const *aliases, size_t n_aliases) {
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    obx__strlcpy(c.owner, owner, sizeof c.owner);
    c.lease_ms = 1000;
    c.reconcile_lease_ms = 1000;
    c.recheck_ms = 500;
    c.backoff_base_ms = 100;
    c.seed = seed;
    c.aliases = aliases;
    c.n_aliases = n_aliases;
    OK(obx__engine_init(e, s, b, &c));
}

obx__event_row obx_t_ev(obx__store *s, const char *id, unsigned flags) {
    obx__rows rows = {0};
    OK(obx__st_load_events(s, &id, 1, flags, &rows));
    assert_int_equal(rows.n, 1);
    obx__event_row r = rows.v[0];
    r.payload = NULL;
    obx__rows_free(&rows);
    return r;
}

int obx_t_receipts(obx__store *s, const char *id, obx__receipt_kind k, char *attempt_out,
                   char *reason_out) {
    obx__receipt_row *r;
    size_t n;
    OK(s->m->load_receipts(s, id, &r, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].kind == k) {
            c++;
            if (attempt_out) strcpy(attempt_out, r[i].attempt_id);
            if (reason_out) strcpy(reason_out, r[i].reason);
        }
    free(r);
    return c;
}

int obx_t_attempts(obx__store *s, const char *id, int st) {
    obx__attempt_row *a;
    size_t n;
    OK(obx__st_load_attempts(s, NULL, 0, id, &a, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++) c += st < 0 || a[i].state == (obx__attempt_state)st;
    free(a);
    return c;
}

int obx_t_audit(obx__store *s, const char *id, int from, int to, const char *needle) {
    obx__audit_row *a;
    size_t n;
    OK(s->m->load_audit(s, id, &a, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++)
        if ((from < 0 || a[i].from == (obx__state)from) && (to < 0 || a[i].to == (obx__state)to) &&
            (!needle || strstr(a[i].reason, needle)))
            c++;
    free(a);
    return c;
}

size_t obx_t_poll_all(obx__engine *e, int64_t now) {
    size_t total = 0, n;
    do {
        OK(obx__engine_poll(e, now, 0, &n));
        total += n;
    } while (n);
    return total;
}

obx__outcome obx_t_ack(const char *id, const char *attempt_id, const char *payload_digest,
                       const char *dest_digest, const char *topic, int32_t partition,
                       int64_t offset) {
    obx__outcome o = {
        .kind = OBX__OUT_ACK, .envelope_gen = 1, .partition = partition, .offset = offset};
    snprintf(o.event_id, sizeof o.event_id, "%s", id);
    snprintf(o.attempt_id, sizeof o.attempt_id, "%s", attempt_id);
    snprintf(o.payload_digest, sizeof o.payload_digest, "%s", payload_digest);
    snprintf(o.dest_digest, sizeof o.dest_digest, "%s", dest_digest);
    snprintf(o.cluster, sizeof o.cluster, "local");
    snprintf(o.topic, sizeof o.topic, "%s", topic);
    return o;
}

obx_message obx_t_message(const obx__delivery *d) {
    return (obx_message){.event_id = d->env.event_id,
                         .envelope_gen = d->env.envelope_gen,
                         .event_type = d->env.event_type,
                         .tenant = d->env.tenant,
                         .aggregate_type = d->env.aggregate_type,
                         .aggregate_id = d->env.aggregate_id,
                         .payload_digest = d->env.payload_digest,
                         .payload = d->payload,
                         .payload_len = d->payload_len,
                         .topic = d->topic,
                         .partition = d->partition,
                         .offset = d->offset,
                         .header_error = d->header_error};
}

int obx_t_factory(obx_err (*factory)(obx__store **), obx__store **s) {
    if (factory(s) == OBX_OK) return 0;
    fprintf(stderr, "factory: %s\n", obx_errmsg());
    return -1;
}

int obx_t_log_broker(char *url, size_t size, const char *dir, int n, int seed, obx__broker **b) {
    snprintf(url, size, "log:%s/b%d.db?seed=%d&cluster=local", dir, n, seed);
    if (obx__br_open(url, NULL, 0, b) == OBX_OK) return 0;
    fprintf(stderr, "broker: %s\n", obx_errmsg());
    return -1;
}

void obx_t_enq_types(obx__store *s, int64_t now, const char *const *types, int n,
                     char ids[][OBX_EVENT_ID_LEN + 1]) {
    for (int i = 0; i < n; i++) {
        char agg[32];
        snprintf(agg, sizeof agg, "o-%d", i + 1);
        obx_event ev = obx_t_event(types[i], "order", agg, "t1", "{}");
        obx_enqueue_result r;
        OK(obx__enqueue_at(s, &ev, now, NULL, &r));
        strcpy(ids[i], r.event_id);
    }
}

void obx_t_engine_backoff(obx__engine *e, obx__store *s, obx__broker *b, int64_t base_ms,
                          int64_t max_ms, uint64_t seed) {
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    c.backoff_base_ms = base_ms;
    c.backoff_max_ms = max_ms;
    if (seed) c.seed = seed;
    OK(obx__engine_init(e, s, b, &c));
}

obx__receipt_row obx_t_receipt(const char *id, const char *attempt_id, obx__receipt_kind k,
                               int64_t at) {
    obx__receipt_row rc;
    memset(&rc, 0, sizeof rc);
    obx__strlcpy(rc.event_id, id, sizeof rc.event_id);
    rc.envelope_gen = 1;
    obx__strlcpy(rc.attempt_id, attempt_id, sizeof rc.attempt_id);
    rc.kind = k;
    strcpy(rc.cluster, "local");
    strcpy(rc.topic, "orders");
    rc.created_at = at;
    return rc;
}

obx__attempt_row obx_t_attempt(const char *id, const char *attempt_id) {
    obx__attempt_row a = {.envelope_gen = 1,
                          .attempt_gen = 1,
                          .claim_gen = 1,
                          .state = OBX__AT_SENDING,
                          .offset_before = -1};
    obx__strlcpy(a.event_id, id, sizeof a.event_id);
    obx__strlcpy(a.attempt_id, attempt_id, sizeof a.attempt_id);
    return a;
}

obx__cluster_row obx_t_cluster(const char *cluster, const char *backend, const char *durability,
                               const char *required_acks, const char *relay, int64_t seen_at) {
    obx__cluster_row k;
    memset(&k, 0, sizeof k);
    obx__strlcpy(k.cluster, cluster, sizeof k.cluster);
    obx__strlcpy(k.backend, backend, sizeof k.backend);
    strcpy(k.lookup, "authoritative");
    obx__strlcpy(k.durability, durability, sizeof k.durability);
    obx__strlcpy(k.required_acks, required_acks, sizeof k.required_acks);
    strcpy(k.serializer, "*");
    obx__strlcpy(k.relay, relay, sizeof k.relay);
    k.seen_at = seen_at;
    return k;
}

void obx_t_missing_topic(obx__store *s, int64_t now, const char *cluster,
                         char ids[2][OBX_EVENT_ID_LEN + 1]) {
    obx_route missing = {.event_type = "order.created.v1",
                         .cluster = cluster,
                         .topic = "no-such-topic",
                         .max_attempts = 2};
    obx_route good = {.event_type = "order.paid.v1", .cluster = cluster, .topic = "orders"};
    OK(obx__route_set_at(s, &missing, now, NULL));
    OK(obx__route_set_at(s, &good, now, NULL));
    const char *types[] = {"order.created.v1", "order.paid.v1"};
    obx_t_enq_types(s, now, types, 2, ids);
}

void obx_t_missing_topic_backoff(obx__store *s, char ids[2][OBX_EVENT_ID_LEN + 1]) {
    assert_int_equal(obx_t_ev(s, ids[1], 0).state, OBX__ST_PUBLISHED);
    obx__event_row bad = obx_t_ev(s, ids[0], 0);
    assert_int_equal(bad.state, OBX__ST_PENDING); /* a definite rejection: backoff */
    assert_int_equal(bad.rejections, 1);
}

void obx_t_missing_topic_parks(obx__engine *e, obx__store *s, int64_t now, const char *id) {
    size_t sent, n;
    OK(obx__engine_dispatch(e, now, &sent));
    OK(obx__engine_poll(e, now, 0, &n));
    assert_int_equal(obx_t_ev(s, id, 0).state, OBX__ST_PARKED);
}

obx_message obx_t_inbox_message(const char *id, const char *tenant,
                                char digest[OBX_DIGEST_LEN + 1]) {
    OK(obx_sha256_digest("{}", 2, digest));
    obx_message m = {.event_id = id,
                     .envelope_gen = 1,
                     .event_type = "order.created.v1",
                     .tenant = tenant,
                     .payload_digest = digest,
                     .payload = "{}",
                     .payload_len = 2,
                     .topic = "orders"};
    return m;
}
