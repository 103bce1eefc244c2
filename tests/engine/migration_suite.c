/*
 * migration_suite.c — destination migration, delivery sets, shadow mode and scoped takeover
 * (docs/migration.md, docs/migration.md) at the engine level, on every store backend: real store
 * (from the factory), real local log brokers (clusters "local" and "eu") with fault knobs,
 * virtual clock. Each test asserts the end state, the receipts, the audit rows and what the
 * brokers hold.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"

#include "engine/engine.h"
#include "engine/migration_suite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

obx_err obx__log_broker_set(obx__broker *base, const char *knob, const char *value);

static store_factory factory;
static char tmpdir[64];
static int nfiles;

typedef struct fx {
    obx__store *s;
    char url[256], url_eu[256];
    obx__broker *b;    /* dispatcher A */
    obx__broker *b2;   /* reconciler, migrator */
    obx__broker *beu;  /* the "eu" cluster */
    obx__broker *look; /* a reader (consumer side) */
    int64_t now;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    if (obx_t_factory(factory, &f->s)) {
        free(f);
        return -1;
    }
    nfiles++;
    snprintf(f->url, sizeof f->url, "log:%s/b%d.db?seed=7&cluster=local", tmpdir, nfiles);
    snprintf(f->url_eu, sizeof f->url_eu, "log:%s/eu%d.db?seed=8&cluster=eu", tmpdir, nfiles);
    if (obx__br_open(f->url, NULL, 0, &f->b) || obx__br_open(f->url, NULL, 0, &f->b2) ||
        obx__br_open(f->url_eu, NULL, 0, &f->beu) || obx__br_open(f->url, NULL, 0, &f->look)) {
        fprintf(stderr, "broker: %s\n", obx_errmsg());
        return -1;
    }
    f->now = OBX_T_NOW;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    obx__mutation_set(NULL);
    obx__br_close(f->b);
    obx__br_close(f->b2);
    obx__br_close(f->beu);
    obx__br_close(f->look);
    obx__st_close(f->s);
    free(f);
    return 0;
}

static int64_t route(fx *f, const char *type, const char *topic, int blind, int max_attempts,
                     const char *alias) {
    return obx_t_route(f->s, f->now, type, topic, blind, max_attempts, alias);
}

static void enq(fx *f, const char *type, const char *agg, char id[31]) {
    obx_t_enq(f->s, f->now, type, agg, NULL, NULL, id);
}

static void engine(fx *f, obx__engine *e, const char *owner, obx__broker *b,
                   const char *const *aliases, size_t n_aliases) {
    obx_t_engine(e, f->s, b, owner, 99, aliases, n_aliases);
}

static obx__event_row ev(fx *f, const char *id) { return obx_t_ev(f->s, id, 0); }

static int receipts(fx *f, const char *id, obx__receipt_kind k, char *reason_out) {
    return obx_t_receipts(f->s, id, k, NULL, reason_out);
}

static int attempts(fx *f, const char *id, obx__attempt_state st) {
    return obx_t_attempts(f->s, id, (int)st);
}

static int audit(fx *f, const char *id, int from, int to, const char *needle) {
    return obx_t_audit(f->s, id, from, to, needle);
}

static size_t poll_all(obx__engine *e, int64_t now) { return obx_t_poll_all(e, now); }

static void knob(obx__broker *b, const char *k, const char *v) { OK(obx__log_broker_set(b, k, v)); }

/* Messages on a topic of the broker behind url: count, and how many carry event ID id. */
static int on_topic(const char *url, const char *topic, const char *id, int *with_id) {
    obx__broker *b;
    OK(obx__br_open(url, NULL, 0, &b));
    static int groups;
    char group[32];
    snprintf(group, sizeof group, "check-%d", ++groups);
    const char *topics[] = {topic};
    OK(b->m->consume_open(b, group, topics, 1));
    obx__delivery d[64];
    size_t n = 0;
    OK(b->m->consume_poll(b, 0, d, 64, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++) {
        if (id && !strcmp(d[i].env.event_id, id)) c++;
        obx__delivery_free(&d[i]);
    }
    obx__br_close(b);
    if (with_id) *with_id = c;
    return (int)n;
}

/* Migrates one event (or adds a target) through the engine; returns its outcome JSON item. */
static json_t *migrate_one(fx *f, obx__broker *b, const char *id, int64_t gen, bool add, bool dry,
                           size_t *refused) {
    obx__engine m;
    engine(f, &m, "ops@example", b, NULL, 0);
    const char *ids[] = {id};
    obx__migrate_req req = {.ids = ids,
                            .n_ids = 1,
                            .route_gen = gen,
                            .add_target = add,
                            .who = "ops@example",
                            .reason = "old topic retired",
                            .dry_run = dry};
    json_t *out = NULL;
    OK(obx__migrate(&m, f->now, &req, &out, refused));
    json_t *item = json_incref(json_array_get(json_object_get(out, "events"), 0));
    json_decref(out);
    assert_non_null(item);
    return item;
}

static const char *outcome(json_t *item) {
    return json_string_value(json_object_get(item, "outcome"));
}
static const char *reason(json_t *item) {
    const char *r = json_string_value(json_object_get(item, "reason"));
    return r ? r : "";
}

/* Migrates event id (add: adds a target to it) as migrate_one does; the test fails unless that
 * is refused for a reason containing needle. */
static void refused_for(fx *f, obx__broker *b, const char *id, int64_t gen, bool add,
                        const char *needle) {
    size_t refused;
    json_t *it = migrate_one(f, b, id, gen, add, false, &refused);
    assert_string_equal(outcome(it), "refused");
    assert_non_null(strstr(reason(it), needle));
    json_decref(it);
}

/* ---- migration ------------------------------------------------------------------------------- */

/* Refused while the old attempt is UNKNOWN (whatever the lookup says, the reconciler resolves an
 * UNKNOWN event first); done, with its receipt, once the retry to the old target was definitely
 * rejected; the moved event is then published on the new target under the same event ID. */
static void test_migrate_refused_while_unknown_then_done(void **state) {
    fx *f = *state;
    route(f, "order.created.v1", "orders", 0, 0, NULL);
    char a[31], c[31];
    enq(f, "order.created.v1", "o-1", a); /* its request is lost in transit */
    enq(f, "order.created.v1", "o-2", c); /* appended, its ACK lost */
    obx__engine da, rc;
    engine(f, &da, "relay-a", f->b, NULL, 0);
    engine(f, &rc, "reconciler", f->b2, NULL, 0);
    knob(f->b, "blackhole", "1");
    size_t sent, n;
    obx__rows one = {0};
    OK(obx__engine_claim(&da, f->now, &one));
    assert_int_equal(one.n, 2);
    OK(obx__engine_begin_attempts(&da, f->now, one.v, 1, OBX__ACT_DISPATCHER, &sent));
    knob(f->b, "blackhole", "0");
    knob(f->b, "lose_ack", "1");
    OK(obx__engine_begin_attempts(&da, f->now, one.v + 1, 1, OBX__ACT_DISPATCHER, &sent));
    obx__rows_free(&one);
    char att_a[31], att_c[31];
    strcpy(att_a, ev(f, a).attempt_id);
    strcpy(att_c, ev(f, c).attempt_id);
    /* while the attempt is SENDING its outcome is not known: refused, naming it */
    size_t refused0 = 0;
    json_t *s0 = migrate_one(f, f->b2, c, 0, false, false, &refused0);
    assert_string_equal(outcome(s0), "refused");
    assert_non_null(strstr(reason(s0), att_c));
    assert_non_null(strstr(reason(s0), "is SENDING"));
    char lease[32]; /* operators read it: the lease's end in ISO-8601, not epoch ms */
    obx__iso_ms(ev(f, c).lease_until, lease);
    if (!strstr(reason(s0), lease)) fail_msg("reason: %s", reason(s0));
    json_decref(s0);
    f->now += 1500;
    OK(obx__engine_sweep(&rc, f->now, &n));
    assert_int_equal(n, 2);
    int64_t g2 = route(f, "order.created.v1", "orders-v2", 0, 0, NULL); /* the new route first */
    size_t refused = 0;
    /* the message is on the old target: never moved */
    json_t *it = migrate_one(f, f->b2, c, g2, false, false, &refused);
    assert_string_equal(outcome(it), "refused");
    assert_int_equal(refused, 1);
    assert_non_null(strstr(reason(it), att_c));
    assert_non_null(strstr(reason(it), "holds it"));
    json_decref(it);
    /* not on the old target, but UNKNOWN: the reconciler resolves it first */
    it = migrate_one(f, f->b2, a, g2, false, false, &refused);
    assert_string_equal(outcome(it), "refused");
    assert_non_null(strstr(reason(it), att_a));
    assert_non_null(strstr(reason(it), "reconciler resolves"));
    assert_non_null(strstr(obx_errmsg(), att_a)); /* the error message names the attempt */
    json_decref(it);
    obx__event_row ra = ev(f, a);
    assert_int_equal(ra.state, OBX__ST_DISPATCH_UNKNOWN);
    assert_int_equal(ra.envelope_gen, 1);
    assert_int_equal(receipts(f, a, OBX__RK_MIGRATION, NULL), 0);
    assert_int_equal(audit(f, a, -1, -1, "migrated"), 0);
    /* the reconciler proves it absent and retries the frozen target, which now rejects it */
    knob(f->b2, "reject", "1");
    OK(obx__reconcile_step(&rc, f->now, &n));
    assert_int_equal(n, 2);
    assert_int_equal(poll_all(&rc, f->now), 1); /* c was FOUND; a's retry was rejected */
    assert_int_equal(ev(f, c).state, OBX__ST_PUBLISHED);
    ra = ev(f, a);
    assert_int_equal(ra.state, OBX__ST_PENDING);
    assert_int_equal(attempts(f, a, OBX__AT_NOT_FOUND), 1);
    assert_int_equal(attempts(f, a, OBX__AT_REJECTED), 1);
    knob(f->b2, "reject", "0");
    /* a published event is never moved */
    refused_for(f, f->b2, c, g2, false, "delivered event is not moved");
    /* dry run: the decision without a write */
    it = migrate_one(f, f->b2, a, g2, false, true, &refused);
    assert_string_equal(outcome(it), "would_migrate");
    json_decref(it);
    assert_int_equal(ev(f, a).envelope_gen, 1);
    /* now proven: never accepted (NOT_FOUND, then a definite rejection) */
    it = migrate_one(f, f->b2, a, g2, false, false, &refused);
    assert_string_equal(outcome(it), "migrated");
    assert_int_equal(refused, 0);
    json_t *proof = json_object_get(it, "proof");
    assert_string_equal(json_string_value(json_object_get(proof, "kind")), "rejected+not_found");
    assert_int_equal(json_array_size(json_object_get(proof, "attempts")), 2);
    char old_dg[OBX_DIGEST_LEN + 1], new_dg[OBX_DIGEST_LEN + 1];
    strcpy(old_dg, json_string_value(json_object_get(json_object_get(it, "from"), "dest_digest")));
    strcpy(new_dg, json_string_value(json_object_get(json_object_get(it, "to"), "dest_digest")));
    assert_string_equal(old_dg, ra.dest_digest);
    assert_string_not_equal(old_dg, new_dg);
    obx__event_row rm = ev(f, a);
    assert_int_equal(rm.state, OBX__ST_PENDING);
    assert_int_equal(rm.envelope_gen, 2);
    assert_string_equal(rm.dest.topic, "orders-v2");
    assert_string_equal(rm.dest_digest, new_dg);
    assert_int_equal(rm.dest.route_gen, g2);
    assert_int_equal(rm.attempt_gen, 0);
    assert_int_equal(rm.pinned_partition, -1);
    assert_true(rm.claim_gen > ra.claim_gen);
    assert_string_not_equal(rm.envelope_digest, ra.envelope_digest);
    assert_string_equal(rm.env.payload_digest, ra.env.payload_digest);
    json_decref(it);
    /* the receipt: old and new digests, the proof, who, when */
    assert_int_equal(receipts(f, a, OBX__RK_MIGRATION, NULL), 1);
    char **det;
    size_t nd;
    OK(f->s->m->read->receipt_details(f->s, a, OBX__RK_MIGRATION, &det, &nd));
    assert_int_equal(nd, 1);
    json_t *d = json_loads(det[0], 0, NULL);
    assert_non_null(d);
    assert_string_equal(json_string_value(json_object_get(d, "who")), "ops@example");
    assert_int_equal(json_integer_value(json_object_get(d, "at_ms")), f->now);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(d, "old"), "dest_digest")), old_dg);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(d, "new"), "dest_digest")), new_dg);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(d, "old"), "envelope_digest")),
        ra.envelope_digest);
    assert_non_null(json_object_get(d, "proof"));
    json_decref(d);
    free(det[0]);
    free(det);
    assert_int_equal(audit(f, a, OBX__ST_PENDING, OBX__ST_PENDING, "migrated by ops@example"), 1);
    /* the new generation is dispatched to the new target, under the same event ID */
    f->now += 60000;
    knob(f->b, "lose_ack", "0");
    OK(obx__engine_dispatch(&da, f->now, &sent));
    assert_int_equal(sent, 1);
    poll_all(&da, f->now);
    rm = ev(f, a);
    assert_int_equal(rm.state, OBX__ST_PUBLISHED);
    assert_int_equal(receipts(f, a, OBX__RK_PRIMARY, NULL), 1);
    int with = 0;
    on_topic(f->url, "orders-v2", a, &with);
    assert_int_equal(with, 1);
    on_topic(f->url, "orders", a, &with);
    assert_int_equal(with, 0); /* it never reached the old target */
}

/* The old target cannot be queried: an event with an old attempt still UNKNOWN (a blind retry
 * was definitely rejected after it) is refused, naming the attempt, until a lookup proves it
 * absent; that lookup is recorded as the proof and marks the attempt NOT_FOUND. */
static void test_migrate_refused_unqueryable_then_proven(void **state) {
    fx *f = *state;
    route(f, "order.created.v1", "orders", 1, 0, NULL); /* blind same-target retry allowed */
    char a[31];
    enq(f, "order.created.v1", "o-1", a);
    obx__engine da, rc;
    engine(f, &da, "relay-a", f->b, NULL, 0);
    engine(f, &rc, "reconciler", f->b2, NULL, 0);
    knob(f->b, "blackhole", "1");
    size_t sent, n;
    OK(obx__engine_dispatch(&da, f->now, &sent));
    char att1[31];
    strcpy(att1, ev(f, a).attempt_id);
    f->now += 1500;
    OK(obx__engine_sweep(&rc, f->now, &n));
    knob(f->b2, "lookup_down", "1"); /* cannot tell: blind retry, which is rejected */
    knob(f->b2, "reject", "1");
    OK(obx__reconcile_step(&rc, f->now, &n));
    assert_int_equal(poll_all(&rc, f->now), 1);
    knob(f->b2, "reject", "0");
    obx__event_row r = ev(f, a);
    assert_int_equal(r.state, OBX__ST_PENDING);
    assert_int_equal(attempts(f, a, OBX__AT_UNKNOWN), 1);
    int64_t g2 = route(f, "order.created.v1", "orders-v2", 1, 0, NULL);
    size_t refused;
    /* the old target is not queryable */
    json_t *it = migrate_one(f, f->b2, a, g2, false, false, &refused);
    assert_string_equal(outcome(it), "refused");
    assert_non_null(strstr(reason(it), att1));
    assert_non_null(strstr(reason(it), "cannot be queried"));
    json_decref(it);
    /* no broker at all, or one of another cluster: cannot be queried either */
    it = migrate_one(f, NULL, a, g2, false, false, &refused);
    assert_non_null(strstr(reason(it), att1));
    assert_non_null(strstr(reason(it), "no broker connection"));
    json_decref(it);
    it = migrate_one(f, f->beu, a, g2, false, false, &refused);
    assert_non_null(strstr(reason(it), "cluster eu, not local"));
    json_decref(it);
    assert_int_equal(ev(f, a).envelope_gen, 1);
    assert_int_equal(attempts(f, a, OBX__AT_UNKNOWN), 1);
    /* the deliberate bug "migrate while UNKNOWN" is what these refusals catch */
    if (obx__mutation_set("migrate-while-unknown") == OBX_OK) {
        it = migrate_one(f, f->b2, a, g2, false, true, &refused);
        assert_string_equal(outcome(it), "would_migrate");
        json_decref(it);
        OK(obx__mutation_set(NULL));
    } else {
        obx__clear_error();
    }
    /* queryable again: the authoritative NOT_FOUND is the proof */
    knob(f->b2, "lookup_down", "0");
    it = migrate_one(f, f->b2, a, g2, false, false, &refused);
    assert_string_equal(outcome(it), "migrated");
    json_t *proof = json_object_get(it, "proof");
    assert_string_equal(json_string_value(json_object_get(proof, "kind")), "rejected+not_found");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(proof, "lookup"), "result")),
        "NOT_FOUND");
    json_t *pa = json_object_get(proof, "attempts");
    int by_lookup = 0;
    for (size_t i = 0; i < json_array_size(pa); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(pa, i), "attempt_id")),
                    att1)) {
            by_lookup++;
            assert_string_equal(
                json_string_value(json_object_get(json_array_get(pa, i), "proven_by")),
                "migrator lookup");
        }
    assert_int_equal(by_lookup, 1);
    json_decref(it);
    assert_int_equal(attempts(f, a, OBX__AT_UNKNOWN), 0);
    assert_int_equal(attempts(f, a, OBX__AT_NOT_FOUND), 1);
    assert_int_equal(ev(f, a).envelope_gen, 2);
    assert_int_equal(receipts(f, a, OBX__RK_MIGRATION, NULL), 1);
}

/* After a migration, a true ACK of the old generation arrives (a legacy writer that ignored its
 * deadline appends the old message): the acceptance point quarantines it, the new generation's
 * slot is filled by its own attempt, and the invariants hold. End to end through the broker. */
static void test_late_old_generation_ack_quarantined(void **state) {
    fx *f = *state;
    route(f, "order.created.v1", "orders", 0, 0, NULL);
    char a[31];
    enq(f, "order.created.v1", "o-1", a);
    obx__engine da;
    engine(f, &da, "relay-a", f->b, NULL, 0);
    knob(f->b, "reject", "1");
    size_t sent;
    OK(obx__engine_dispatch(&da, f->now, &sent));
    assert_int_equal(poll_all(&da, f->now), 1);
    knob(f->b, "reject", "0");
    obx__event_row old = ev(f, a);
    assert_int_equal(old.state, OBX__ST_PENDING);
    char att1[31];
    strcpy(att1, old.attempt_id);
    int64_t g2 = route(f, "order.created.v1", "orders-v2", 0, 0, NULL);
    size_t refused;
    json_t *it = migrate_one(f, f->b2, a, g2, false, false, &refused);
    assert_string_equal(outcome(it), "migrated");
    assert_string_equal(json_string_value(json_object_get(json_object_get(it, "proof"), "kind")),
                        "rejected");
    json_decref(it);
    /* the old generation's message lands after all, and its ACK reaches the acceptance point */
    obx__rows rows = {0};
    const char *id = a;
    OK(obx__st_load_events(f->s, &id, 1, OBX__LOAD_PAYLOAD, &rows));
    obx__envelope env1 = old.env;
    obx__msg m = {.env = &env1,
                  .dest = &old.dest,
                  .dest_digest = old.dest_digest,
                  .attempt_id = att1,
                  .attempt_gen = 1,
                  .partition = old.pinned_partition,
                  .payload = rows.v[0].payload,
                  .payload_len = rows.v[0].payload_len};
    OK(obx__br_send(f->b, &m, 1, f->now));
    obx__rows_free(&rows);
    assert_int_equal(poll_all(&da, f->now), 1);
    char why[OBX_TEXT_MAX + 1];
    assert_int_equal(receipts(f, a, OBX__RK_QUARANTINED, why), 1);
    assert_non_null(strstr(why, "superseded generation"));
    assert_int_equal(da.st.quarantined, 1);
    obx__event_row now_row = ev(f, a);
    assert_int_equal(now_row.state, OBX__ST_PENDING); /* nothing else changed */
    assert_int_equal(now_row.envelope_gen, 2);
    assert_int_equal(receipts(f, a, OBX__RK_PRIMARY, NULL), 0);
    assert_int_equal(audit(f, a, OBX__ST_PENDING, OBX__ST_PENDING, "quarantined"), 1);
    /* the new generation is published normally: one primary receipt, of generation 2 */
    f->now += 60000;
    OK(obx__engine_dispatch(&da, f->now, &sent));
    poll_all(&da, f->now);
    assert_int_equal(ev(f, a).state, OBX__ST_PUBLISHED);
    obx__receipt_row *rc;
    size_t nr;
    OK(f->s->m->load_receipts(f->s, a, &rc, &nr));
    int prim = 0;
    for (size_t i = 0; i < nr; i++)
        if (rc[i].kind == OBX__RK_PRIMARY) {
            prim++;
            assert_int_equal(rc[i].envelope_gen, 2);
            assert_string_equal(rc[i].topic, "orders-v2");
        }
    free(rc);
    assert_int_equal(prim, 1);
    obx__store_invariants inv;
    OK(f->s->m->read->invariants(f->s, &inv));
    assert_int_equal(inv.published_without_primary + inv.primary_not_published + inv.multi_primary,
                     0);
}

/* A route policy revision (a new generation) while a backlog waits: every queued event keeps the
 * destination it froze at enqueue; only events enqueued afterwards take the new one. */
static void test_route_revision_during_backlog(void **state) {
    fx *f = *state;
    int64_t g1 = route(f, "order.created.v1", "orders", 0, 0, NULL);
    char ids[25][31];
    for (int i = 0; i < 20; i++) {
        char agg[16];
        snprintf(agg, sizeof agg, "o-%d", i);
        enq(f, "order.created.v1", agg, ids[i]);
    }
    obx__engine da;
    engine(f, &da, "relay-a", f->b, NULL, 0);
    da.cfg.batch = 5; /* a backlog: dispatched five at a time */
    size_t sent;
    OK(obx__engine_dispatch(&da, f->now, &sent));
    assert_int_equal(sent, 5);
    /* the revision: another topic, another partitioning, while 15 wait */
    obx_route r = {.event_type = "order.created.v1",
                   .cluster = "local",
                   .topic = "orders-v2",
                   .algorithm = "fnv1a",
                   .routing_key = "{aggregate_id}"};
    int64_t g2 = 0;
    OK(obx__route_set_at(f->s, &r, f->now, &g2));
    assert_true(g2 > g1);
    for (int i = 20; i < 25; i++) {
        char agg[16];
        snprintf(agg, sizeof agg, "o-%d", i);
        enq(f, "order.created.v1", agg, ids[i]);
    }
    for (int round = 0; round < 10; round++) {
        OK(obx__engine_dispatch(&da, f->now, &sent));
        poll_all(&da, f->now);
    }
    for (int i = 0; i < 25; i++) {
        obx__event_row e = ev(f, ids[i]);
        assert_int_equal(e.state, OBX__ST_PUBLISHED);
        assert_int_equal(e.envelope_gen, 1);
        assert_int_equal(e.dest.route_gen, i < 20 ? g1 : g2);
        assert_string_equal(e.dest.topic, i < 20 ? "orders" : "orders-v2");
        assert_string_equal(e.dest.algorithm, i < 20 ? "murmur2" : "fnv1a");
        if (i < 20) {
            /* the digest frozen at enqueue is the one the receipt carries */
            obx__receipt_row *rc;
            size_t nr;
            OK(f->s->m->load_receipts(f->s, ids[i], &rc, &nr));
            assert_int_equal(nr, 1);
            assert_string_equal(rc[0].dest_digest, e.dest_digest);
            assert_string_equal(rc[0].topic, "orders");
            free(rc);
        }
    }
    assert_int_equal(on_topic(f->url, "orders", NULL, NULL), 20);
    assert_int_equal(on_topic(f->url, "orders-v2", NULL, NULL), 5);
}

/* ---- delivery sets -------------------------------------------------------------------------- */

static int64_t set_route(fx *f, const char *type, const char *completion) {
    obx_route_target t[] = {{.cluster = "eu", .topic = "orders-eu"},
                            {.cluster = "local", .topic = "audit", .routing_key = "{tenant}"}};
    obx_route r = {.event_type = type,
                   .cluster = "local",
                   .topic = "orders",
                   .targets = t,
                   .n_targets = 2,
                   .completion = completion};
    int64_t gen = 0;
    OK(obx__route_set_at(f->s, &r, f->now, &gen));
    return gen;
}

typedef struct cons {
    obx_store *db;
    obx_inbox *in;
    int effects;
} cons;

static obx_err handler(void *user, void *conn, const obx_message *m, const char *key, char *res,
                       size_t cap) {
    cons *c = user;
    (void)conn;
    (void)key;
    c->effects++;
    snprintf(res, cap, "seen %s", m->event_id);
    return OBX_OK;
}

/* Consumes a topic of a broker through the inbox of consumer c; returns outcomes by kind. */
static void consume(fx *f, cons *c, const char *url, const char *topic, int out[8]) {
    obx__broker *b;
    OK(obx__br_open(url, NULL, 0, &b));
    const char *topics[] = {topic};
    OK(b->m->consume_open(b, "projection", topics, 1));
    obx__delivery d[64];
    size_t n = 0;
    OK(b->m->consume_poll(b, 0, d, 64, &n));
    for (size_t i = 0; i < n; i++) {
        obx_message m = obx_t_message(&d[i]);
        obx_inbox_result r;
        OK(obx__inbox_process_at(c->in, &m, handler, c, NULL, f->now, 0, NULL, &r));
        out[r.outcome]++;
        if (r.ack) OK(b->m->consume_ack(b, &d[i]));
        obx__delivery_free(&d[i]);
    }
    obx__br_close(b);
}

/* A delivery set with rule "all": one slot per target, each with its own frozen digest,
 * attempts and publish slot; the event counts as delivered only when every target has it; the
 * consumer sees the same event ID on every target; the acceptance rules hold per target. */
static void test_delivery_set_all(void **state) {
    fx *f = *state;
    int64_t gen = set_route(f, "order.created.v1", NULL);
    char a[31];
    enq(f, "order.created.v1", "o-1", a);
    obx__delivery_row d;
    OK(f->s->m->delivery_get(f->s, a, &d));
    assert_int_equal(d.n, 3);
    assert_string_equal(d.completion, "all");
    assert_int_equal(d.route_gen, gen);
    assert_string_equal(d.t[0].slot_id, a);
    obx__event_row s1 = ev(f, a), s2 = ev(f, d.t[1].slot_id), s3 = ev(f, d.t[2].slot_id);
    assert_int_equal(s1.target_no, 1);
    assert_int_equal(s2.target_no, 2);
    assert_string_equal(obx__wire_id(&s2), a);
    assert_string_equal(obx__wire_id(&s3), a);
    assert_string_equal(s2.dest.cluster, "eu");
    assert_string_equal(s3.dest.topic, "audit");
    assert_string_equal(s3.dest.routing_key, "t1");
    assert_string_not_equal(s1.dest_digest, s2.dest_digest);
    assert_string_not_equal(s2.dest_digest, s3.dest_digest);
    assert_string_equal(s2.envelope_digest, s1.envelope_digest); /* one logical envelope */
    assert_string_equal(s2.env.payload_digest, s1.env.payload_digest);
    assert_int_equal(audit(f, d.t[1].slot_id, OBX__ST_NONE, OBX__ST_PENDING, "target 2"), 1);
    /* the same delivery set from the idempotency path: nothing more is created */
    obx__delivery_status st;
    OK(obx__delivery_status_of(f->s, a, &st));
    assert_false(st.complete);
    assert_int_equal(st.published, 0);
    obx__rows_free(&st.slots);
    /* the local relay dispatches the two local targets; the eu relay the eu one */
    obx__engine dl, deu;
    engine(f, &dl, "relay-local", f->b, NULL, 0);
    engine(f, &deu, "relay-eu", f->beu, NULL, 0);
    knob(f->b, "dup", "1"); /* every local target stored twice: per-slot duplicates */
    size_t sent;
    OK(obx__engine_dispatch(&dl, f->now, &sent));
    assert_int_equal(sent, 2);
    assert_int_equal(poll_all(&dl, f->now), 2);
    knob(f->b, "dup", "0");
    assert_int_equal(ev(f, a).state, OBX__ST_PUBLISHED);
    assert_int_equal(ev(f, s3.env.event_id).state, OBX__ST_PUBLISHED);
    assert_int_equal(ev(f, s2.env.event_id).state, OBX__ST_PENDING);
    OK(obx__delivery_status_of(f->s, a, &st));
    assert_int_equal(st.published, 2);
    assert_false(st.complete); /* "all": the eu target is missing */
    obx__rows_free(&st.slots);
    /* per-slot receipts, kept under each slot's key */
    assert_int_equal(receipts(f, a, OBX__RK_PRIMARY, NULL), 1);
    assert_int_equal(receipts(f, s3.env.event_id, OBX__RK_PRIMARY, NULL), 1);
    assert_int_equal(receipts(f, s2.env.event_id, OBX__RK_PRIMARY, NULL), 0);
    /* rule 6 per target: slot 3's attempt carrying slot 1's destination digest */
    obx__event_row p3 = ev(f, s3.env.event_id);
    obx__outcome bad = obx_t_ack(a, p3.primary_attempt_id, p3.env.payload_digest, s1.dest_digest,
                                 "audit", p3.pinned_partition, 99);
    obx__receipt_kind k;
    OK(obx__accept_receipts(&dl, f->now, &bad, 1, &k));
    assert_int_equal(k, OBX__RK_QUARANTINED);
    assert_int_equal(receipts(f, s3.env.event_id, OBX__RK_QUARANTINED, NULL), 1);
    /* a valid second ACK of slot 3 is its duplicate, not slot 1's */
    strcpy(bad.dest_digest, p3.dest_digest);
    OK(obx__accept_receipts(&dl, f->now, &bad, 1, &k));
    assert_int_equal(k, OBX__RK_DUPLICATE);
    assert_int_equal(receipts(f, s3.env.event_id, OBX__RK_DUPLICATE, NULL), 1);
    assert_int_equal(receipts(f, a, OBX__RK_DUPLICATE, NULL), 0);
    OK(obx__engine_dispatch(&deu, f->now, &sent));
    assert_int_equal(sent, 1);
    assert_int_equal(poll_all(&deu, f->now), 1);
    OK(obx__delivery_status_of(f->s, a, &st));
    assert_int_equal(st.published, 3);
    assert_true(st.complete);
    assert_int_equal(st.completed_at, f->now);
    obx__rows_free(&st.slots);
    int64_t sets, complete;
    OK(f->s->m->read->delivery_stats(f->s, &sets, &complete));
    assert_int_equal(sets, 1);
    assert_int_equal(complete, 1);
    /* every target carries the logical event ID; one consumer reading two targets applies the
     * effect once */
    int with;
    assert_int_equal(on_topic(f->url_eu, "orders-eu", a, &with), 1);
    assert_int_equal(with, 1);
    assert_int_equal(on_topic(f->url, "audit", a, &with), 2);
    assert_int_equal(with, 2);
    cons c = {0};
    char url[256];
    snprintf(url, sizeof url, "sqlite:%s/consumer%d.db", tmpdir, ++nfiles);
    OK(obx_store_open(url, &c.db));
    OK(obx_store_init(c.db));
    obx_inbox_options o = {.consumer_id = "projection"};
    OK(obx_inbox_open(c.db, &o, &c.in));
    int out[8] = {0};
    consume(f, &c, f->url, "orders", out);
    consume(f, &c, f->url_eu, "orders-eu", out);
    assert_int_equal(out[OBX_INBOX_APPLIED], 1);
    assert_int_equal(out[OBX_INBOX_DUPLICATE], 2); /* orders was stored twice (dup) */
    assert_int_equal(c.effects, 1);
    obx_inbox_close(c.in);
    obx_store_close(c.db);
    /* the contract is frozen: a later route revision changes nothing for this event */
    route(f, "order.created.v1", "orders", 0, 0, NULL);
    OK(f->s->m->delivery_get(f->s, a, &d));
    assert_int_equal(d.n, 3);
    /* inspect tells the set's story */
    json_t *doc;
    OK(obx__inspect_json(f->s, s2.env.event_id, &doc));
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(doc, "status"), "logical_event_id")), a);
    assert_true(json_is_true(json_object_get(json_object_get(doc, "delivery_set"), "complete")));
    json_decref(doc);
}

/* The completion rule decides what "delivered" means beyond inspect: for the open-set counts
 * (obx status, /metrics), for the three-set audit (a trailing target of a delivered `any` set is
 * no overdue event; an `all` set's missing target is) and for retention (a published target of
 * an undelivered `all` set is not retained; the critical consumers' evidence is read under the
 * event ID they saw, the logical one, for every target). */
static void test_delivery_rule_decides_delivered(void **state) {
    fx *f = *state;
    set_route(f, "order.created.v1", "all");
    char a[31], b[31];
    enq(f, "order.created.v1", "o-1", a);
    set_route(f, "order.created.v1", "any");
    enq(f, "order.created.v1", "o-2", b);
    obx__engine dl, deu;
    engine(f, &dl, "relay-local", f->b, NULL, 0);
    engine(f, &deu, "relay-eu", f->beu, NULL, 0);
    size_t sent;
    /* the two local targets of each (the audit targets share a key: b's waits for a's); the
     * eu ones wait for their relay */
    OK(obx__engine_dispatch(&dl, f->now, &sent));
    assert_int_equal(sent, 3);
    assert_int_equal(poll_all(&dl, f->now), 3);
    OK(obx__engine_dispatch(&dl, f->now, &sent));
    assert_int_equal(sent, 1);
    assert_int_equal(poll_all(&dl, f->now), 1);
    int64_t open[3];
    OK(f->s->m->read->delivery_open(f->s, open));
    assert_int_equal(open[0], 1); /* a: all, eu missing */
    assert_int_equal(open[1], 0); /* b: any, delivered */
    assert_int_equal(open[2], 1); /* b's eu target: trailing, still to be sent */
    /* the audit, an hour later: a's missing target is overdue, b's trailing one is not */
    f->now += 3600000;
    obx__audit_cfg ac = {.pending_max_age_ms = 60000, .max_ids = 10, .max_scan = 1000};
    json_t *doc = NULL;
    int64_t counts[OBX__FK_COUNT];
    OK(obx__audit_run(f->s, NULL, &ac, f->now, &doc, counts));
    assert_int_equal(counts[OBX__FK_PENDING], 1);
    obx__delivery_row da;
    OK(f->s->m->delivery_get(f->s, a, &da));
    char *txt = json_dumps(doc, 0);
    assert_non_null(strstr(txt, da.t[1].slot_id)); /* a's eu slot is listed */
    free(txt);
    json_decref(doc);
    /* retention with a critical consumer that has both events (under their logical IDs) */
    char url[256];
    snprintf(url, sizeof url, "sqlite:%s/consumer%d.db", tmpdir, ++nfiles);
    obx_store *cdb;
    OK(obx_store_open(url, &cdb));
    OK(obx_store_init(cdb));
    const char *ids[] = {a, b};
    for (int i = 0; i < 2; i++) {
        obx__inbox_row r = {.partition = 0, .offset = i, .consumed_at = f->now};
        strcpy(r.consumer_id, "projection");
        strcpy(r.event_id, ids[i]);
        obx__event_row got = ev(f, ids[i]);
        strcpy(r.payload_digest, got.env.payload_digest);
        r.envelope_gen = got.envelope_gen; /* what the delivery carried: evidence */
        strcpy(r.dest_digest, got.dest_digest);
        strcpy(r.event_type, "order.created.v1");
        strcpy(r.tenant, "t1");
        strcpy(r.outcome, "APPLIED");
        strcpy(r.topic, "orders");
        OK(cdb->m->inbox->inbox_put(cdb, &r));
    }
    obx__critical crit = {.s = cdb};
    strcpy(crit.id, "projection");
    obx__retention_cfg rc = {.consumers = &crit,
                             .n_consumers = 1,
                             .replay_window_ms = 0,
                             .batch = 10,
                             .who = "purger",
                             .max_listed = 20};
    obx__ret_result res = {0};
    OK(obx__purge_run(f->s, &rc, f->now, &res));
    assert_int_equal(ev(f, a).state, OBX__ST_PUBLISHED); /* all: not delivered yet */
    assert_int_equal(ev(f, da.t[2].slot_id).state, OBX__ST_PUBLISHED);
    obx__delivery_row db;
    OK(f->s->m->delivery_get(f->s, b, &db));
    /* any: delivered and consumed, retained (target 3 too: evidence under the logical ID),
     * not purged: a, published before it, is the forced consumer watermark until delivered */
    assert_int_equal(ev(f, b).state, OBX__ST_RETAINED);
    assert_int_equal(ev(f, db.t[2].slot_id).state, OBX__ST_RETAINED);
    assert_true(res.hole);
    assert_non_null(strstr(res.hole_why, "completion all) is not delivered yet: 2 of 3"));
    obx__ret_result_free(&res);
    /* the eu targets are sent: a is delivered and goes too */
    OK(obx__engine_dispatch(&deu, f->now, &sent));
    assert_int_equal(sent, 2);
    assert_int_equal(poll_all(&deu, f->now), 2);
    OK(f->s->m->read->delivery_open(f->s, open));
    assert_int_equal(open[0] + open[1] + open[2], 0);
    f->now += 1000;
    memset(&res, 0, sizeof res);
    OK(obx__purge_run(f->s, &rc, f->now, &res));
    assert_int_equal(ev(f, a).state, OBX__ST_PURGED);
    assert_int_equal(ev(f, da.t[1].slot_id).state, OBX__ST_PURGED);
    assert_int_equal(ev(f, db.t[1].slot_id).state, OBX__ST_PURGED);
    obx__ret_result_free(&res);
    obx_store_close(cdb);
}

/* Rule "any": the event counts as delivered once one target has it; the others keep their own
 * slots (and their own retries) all the same. A bad target does not hold back the others. */
static void test_delivery_set_any(void **state) {
    fx *f = *state;
    set_route(f, "order.created.v1", "any");
    char a[31];
    enq(f, "order.created.v1", "o-1", a);
    obx__engine deu;
    engine(f, &deu, "relay-eu", f->beu, NULL, 0);
    knob(f->beu, "reject", "1"); /* the eu target refuses */
    size_t sent;
    OK(obx__engine_dispatch(&deu, f->now, &sent));
    assert_int_equal(poll_all(&deu, f->now), 1);
    obx__delivery_status st;
    OK(obx__delivery_status_of(f->s, a, &st));
    assert_false(st.complete);
    assert_int_equal(st.slots.v[1].rejections, 1);
    assert_int_equal(st.slots.v[1].state, OBX__ST_PENDING);
    assert_int_equal(st.slots.v[0].state, OBX__ST_PENDING); /* the others untouched */
    obx__rows_free(&st.slots);
    obx__engine dl;
    engine(f, &dl, "relay-local", f->b, NULL, 0);
    OK(obx__engine_dispatch(&dl, f->now, &sent));
    assert_int_equal(sent, 2);
    poll_all(&dl, f->now);
    OK(obx__delivery_status_of(f->s, a, &st));
    assert_true(st.complete);
    assert_int_equal(st.published, 2);
    obx__rows_free(&st.slots);
    int64_t sets, complete;
    OK(f->s->m->read->delivery_stats(f->s, &sets, &complete));
    assert_int_equal(complete, 1);
    /* the eu slot is retried on its own, to its own frozen target */
    knob(f->beu, "reject", "0");
    f->now += 60000;
    OK(obx__engine_dispatch(&deu, f->now, &sent));
    assert_int_equal(sent, 1);
    poll_all(&deu, f->now);
    OK(obx__delivery_status_of(f->s, a, &st));
    assert_int_equal(st.published, 3);
    obx__attempt_row *at;
    size_t na;
    OK(obx__st_load_attempts(f->s, NULL, 0, st.slots.v[1].env.event_id, &at, &na));
    assert_int_equal(na, 2);
    assert_string_equal(at[0].dest_digest, at[1].dest_digest);
    free(at);
    obx__rows_free(&st.slots);
    /* bad contracts are refused, naming the field */
    obx_route_target dup[] = {{.cluster = "local", .topic = "orders"}};
    obx_route r = {.event_type = "x.y.v1",
                   .cluster = "local",
                   .topic = "orders",
                   .targets = dup,
                   .n_targets = 1};
    assert_int_equal(obx__route_set_at(f->s, &r, f->now, NULL), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "targets[0]"));
    obx_route_target bad[] = {{.cluster = "eu", .topic = "a b"}};
    r.targets = bad;
    assert_int_equal(obx__route_set_at(f->s, &r, f->now, NULL), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "targets[0].topic"));
    obx_route_target many[OBX_SET_MAX];
    char topics[OBX_SET_MAX][8];
    for (int i = 0; i < OBX_SET_MAX; i++) {
        snprintf(topics[i], sizeof topics[i], "t%d", i);
        many[i] = (obx_route_target){.cluster = "eu", .topic = topics[i]};
    }
    r.targets = many;
    r.n_targets = OBX_SET_MAX;
    assert_int_equal(obx__route_set_at(f->s, &r, f->now, NULL), OBX_ETOOBIG);
    r.n_targets = 1;
    r.completion = "most";
    assert_int_equal(obx__route_set_at(f->s, &r, f->now, NULL), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "completion"));
    assert_int_equal(f->s->m->route_get(f->s, "x.y.v1", &(obx__route_row){0}), OBX_ENOROUTE);
}

/* Adding a target to an event later is a migration: proof that the new target does not hold the
 * event, a receipt, a new slot; the existing slot is untouched. */
static void test_add_target_is_a_migration(void **state) {
    fx *f = *state;
    route(f, "order.created.v1", "orders", 0, 0, NULL);
    char a[31], b[31];
    enq(f, "order.created.v1", "o-1", a);
    enq(f, "order.created.v1", "o-2", b);
    obx__engine dl;
    engine(f, &dl, "relay-local", f->b, NULL, 0);
    size_t sent;
    OK(obx__engine_dispatch(&dl, f->now, &sent));
    poll_all(&dl, f->now);
    assert_int_equal(ev(f, a).state, OBX__ST_PUBLISHED);
    int64_t g2 = set_route(f, "order.created.v1", NULL); /* the business now needs eu too */
    size_t refused;
    /* the new target cannot be queried from this broker */
    refused_for(f, f->b2, a, g2, true, "cannot be queried");
    /* b is on the eu target already (published there outside obx): refused */
    obx__event_row rb = ev(f, b);
    obx__dest eu = rb.dest;
    strcpy(eu.cluster, "eu");
    strcpy(eu.topic, "orders-eu");
    int32_t part;
    OK(obx__br_partition_for(f->beu, &eu, &part));
    char dg[OBX_DIGEST_LEN + 1];
    OK(obx__dest_digest(&eu, dg));
    obx__rows rows = {0};
    const char *idb = b;
    OK(obx__st_load_events(f->s, &idb, 1, OBX__LOAD_PAYLOAD, &rows));
    obx__msg m = {.env = &rb.env,
                  .dest = &eu,
                  .dest_digest = dg,
                  .attempt_id = "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G",
                  .attempt_gen = 1,
                  .partition = part,
                  .payload = rows.v[0].payload,
                  .payload_len = rows.v[0].payload_len};
    OK(obx__br_send(f->beu, &m, 1, f->now));
    obx__rows_free(&rows);
    refused_for(f, f->beu, b, g2, true, "holds the event already");
    /* a: proven absent on eu; the first target of g2 it lacks is added */
    json_t *it = migrate_one(f, f->beu, a, g2, true, false, &refused);
    assert_string_equal(outcome(it), "target_added");
    assert_int_equal(json_integer_value(json_object_get(it, "target")), 2);
    char slot[31];
    strcpy(slot, json_string_value(json_object_get(it, "slot_id")));
    json_decref(it);
    obx__delivery_row d;
    OK(f->s->m->delivery_get(f->s, a, &d));
    assert_int_equal(d.n, 2);
    assert_string_equal(d.completion, "all");
    assert_int_equal(d.route_gen, 0); /* formed by a migration */
    assert_string_equal(d.t[1].origin, "migration");
    assert_string_equal(d.t[1].slot_id, slot);
    obx__event_row rs = ev(f, slot);
    assert_string_equal(obx__wire_id(&rs), a);
    assert_string_equal(rs.dest.cluster, "eu");
    assert_int_equal(rs.state, OBX__ST_PENDING);
    assert_int_equal(ev(f, a).state, OBX__ST_PUBLISHED); /* untouched */
    assert_int_equal(receipts(f, a, OBX__RK_MIGRATION, NULL), 1);
    assert_int_equal(audit(f, slot, OBX__ST_NONE, OBX__ST_PENDING, "added"), 1);
    char **det;
    size_t nd;
    OK(f->s->m->read->receipt_details(f->s, a, OBX__RK_MIGRATION, &det, &nd));
    json_t *dj = json_loads(det[0], 0, NULL);
    assert_string_equal(json_string_value(json_object_get(dj, "kind")), "add_target");
    assert_string_equal(json_string_value(json_object_get(dj, "slot_id")), slot);
    assert_string_equal(json_string_value(json_object_get(json_object_get(dj, "proof"), "kind")),
                        "not_on_new_target");
    json_decref(dj);
    free(det[0]);
    free(det);
    /* the same target again: refused, it is the event's already; the next one is target 3 */
    obx__engine m2;
    engine(f, &m2, "ops@example", f->beu, NULL, 0);
    const char *ids[] = {a};
    obx__migrate_req req = {.ids = ids,
                            .n_ids = 1,
                            .route_gen = g2,
                            .target_no = 2,
                            .add_target = true,
                            .who = "ops@example"};
    json_t *out;
    OK(obx__migrate(&m2, f->now, &req, &out, &refused));
    assert_int_equal(refused, 1);
    assert_non_null(strstr(reason(json_array_get(json_object_get(out, "events"), 0)),
                           "target 2 of this event already"));
    json_decref(out);
    /* another completion rule for a set that has one: refused by the engine (the store writes
     * what it is given), and the set keeps its rule and its targets */
    req = (obx__migrate_req){.ids = ids,
                             .n_ids = 1,
                             .route_gen = g2,
                             .add_target = true,
                             .completion = "any",
                             .who = "ops@example"};
    OK(obx__migrate(&m2, f->now, &req, &out, &refused));
    assert_int_equal(refused, 1);
    json_t *item = json_array_get(json_object_get(out, "events"), 0);
    assert_string_equal(outcome(item), "refused");
    assert_non_null(strstr(reason(item), "completes on 'all', not 'any'"));
    json_decref(out);
    OK(f->s->m->delivery_get(f->s, a, &d));
    assert_int_equal(d.n, 2);
    assert_string_equal(d.completion, "all");
    /* the added slot is dispatched by the eu relay under the event's ID */
    obx__engine deu;
    engine(f, &deu, "relay-eu", f->beu, NULL, 0);
    OK(obx__engine_dispatch(&deu, f->now, &sent));
    assert_int_equal(sent, 1);
    poll_all(&deu, f->now);
    obx__delivery_status st;
    OK(obx__delivery_status_of(f->s, a, &st));
    assert_true(st.complete);
    obx__rows_free(&st.slots);
    int with;
    on_topic(f->url_eu, "orders-eu", a, &with);
    assert_int_equal(with, 1);
}

/* ---- takeover and shadow -----------------------------------------------------------------------
 */

static int owner_is(fx *f, const char *id, const char *prefix) {
    obx__attempt_row *a;
    size_t n;
    OK(obx__st_load_attempts(f->s, NULL, 0, id, &a, &n));
    int ok = n > 0;
    for (size_t i = 0; i < n; i++) ok &= !strncmp(a[i].owner, prefix, strlen(prefix));
    free(a);
    return ok;
}

/* Enqueues order.created.v1 events of aggregates o-FROM .. o-(TO-1), their IDs into ids[FROM..TO);
 * returns TO. */
static int enq_orders(fx *f, char ids[][31], int from, int to) {
    for (int n = from; n < to; n++) {
        char agg[16];
        snprintf(agg, sizeof agg, "o-%d", n);
        enq(f, "order.created.v1", agg, ids[n]);
    }
    return to;
}

/* Hands order.created.v1 and its unclaimed backlog to alias TO (obx__takeover); the test fails
 * unless BACKLOG events were moved. The result into *out (the caller frees it). */
static void hand_over(fx *f, const char *to, json_int_t backlog, json_t **out) {
    obx__takeover_req tk = {.to = to,
                            .types = (const char *[]){"order.created.v1"},
                            .n_types = 1,
                            .backlog = true,
                            .who = "ops"};
    OK(obx__takeover(f->s, f->now, &tk, out));
    assert_int_equal(json_integer_value(json_object_get(*out, "backlog_moved")), backlog);
}

/* Two relays serving different aliases; the type's alias is switched (and its unclaimed backlog
 * handed over) while events flow, then switched back: every event published exactly once, each
 * by a relay of the alias that owned it when it was claimed; in-flight events stay with their
 * attempts and are reconciled normally. */
static void test_alias_switch_mid_stream(void **state) {
    fx *f = *state;
    route(f, "order.created.v1", "orders", 0, 0, "legacy");
    const char *al[] = {"legacy"}, *ao[] = {"obx"};
    obx__engine dl, dobx;
    engine(f, &dl, "legacy-relay", f->b, al, 1);
    engine(f, &dobx, "obx-relay", f->b2, ao, 1);
    dl.cfg.batch = 4;
    dobx.cfg.batch = 4;
    char ids[40][31];
    int n = enq_orders(f, ids, 0, 10);
    size_t sent;
    OK(obx__engine_dispatch(&dobx, f->now, &sent));
    assert_int_equal(sent, 0);   /* not obx's */
    knob(f->b, "lose_ack", "1"); /* the legacy relay's next batch: in flight, ACKs lost */
    OK(obx__engine_dispatch(&dl, f->now, &sent));
    assert_int_equal(sent, 4);
    knob(f->b, "lose_ack", "0");
    /* take over: the type and its unclaimed backlog */
    json_t *out;
    hand_over(f, "obx", 6, &out);
    assert_int_equal(json_integer_value(json_object_get(out, "types_switched")), 1);
    json_decref(out);
    n = enq_orders(f, ids, n, 20);
    for (int round = 0; round < 5; round++) {
        OK(obx__engine_dispatch(&dl, f->now, &sent));
        assert_int_equal(sent, 0); /* legacy owns nothing unclaimed any more */
        OK(obx__engine_dispatch(&dobx, f->now, &sent));
        poll_all(&dobx, f->now);
    }
    /* rollback while obx has events in flight */
    knob(f->b2, "delay_ack", "1");
    knob(f->b2, "delay_ack_ms", "500");
    n = enq_orders(f, ids, n, 30);
    OK(obx__engine_dispatch(&dobx, f->now, &sent));
    assert_int_equal(sent, 4);
    hand_over(f, "legacy", 6, &out);
    json_decref(out);
    n = enq_orders(f, ids, n, 40);
    f->now += 500; /* obx's in-flight ACKs arrive after the rollback */
    assert_int_equal(poll_all(&dobx, f->now), 4);
    for (int round = 0; round < 6; round++) {
        OK(obx__engine_dispatch(&dobx, f->now, &sent));
        assert_int_equal(sent, 0);
        OK(obx__engine_dispatch(&dl, f->now, &sent));
        poll_all(&dl, f->now);
    }
    /* the legacy relay's lost ACKs are reconciled (found, not re-sent) */
    obx__engine rc;
    engine(f, &rc, "reconciler", f->b2, NULL, 0);
    f->now += 1500;
    size_t k;
    OK(obx__engine_sweep(&rc, f->now, &k));
    assert_int_equal(k, 4);
    OK(obx__reconcile_step(&rc, f->now, &k));
    assert_int_equal(rc.st.reconciled_found, 4);
    for (int i = 0; i < 40; i++) {
        obx__event_row e = ev(f, ids[i]);
        assert_int_equal(e.state, OBX__ST_PUBLISHED);
        assert_int_equal(receipts(f, ids[i], OBX__RK_PRIMARY, NULL), 1);
        assert_int_equal(attempts(f, ids[i], OBX__AT_ACCEPTED), 1);
        assert_int_equal(receipts(f, ids[i], OBX__RK_DUPLICATE, NULL), 0);
        int with;
        on_topic(f->url, "orders", ids[i], &with);
        assert_int_equal(with, 1); /* nothing lost, nothing sent twice */
    }
    /* who sent what: the owner of the type (or of the handed-over backlog) at claim time */
    for (int i = 0; i < 4; i++) assert_true(owner_is(f, ids[i], "legacy-relay"));
    for (int i = 4; i < 24; i++) assert_true(owner_is(f, ids[i], "obx-relay"));
    for (int i = 24; i < 40; i++) assert_true(owner_is(f, ids[i], "legacy-relay"));
    assert_int_equal(audit(f, ids[5], OBX__ST_PENDING, OBX__ST_PENDING, "legacy to obx"), 1);
    /* a share of types, chosen stably: 50% of four types is two, and 25% is one of those */
    route(f, "a.one.v1", "t", 0, 0, "legacy");
    route(f, "b.two.v1", "t", 0, 0, "legacy");
    route(f, "c.three.v1", "t", 0, 0, "legacy");
    obx__takeover_req tk = {
        .to = "obx", .from = "legacy", .percent = 25, .who = "ops", .dry_run = true};
    OK(obx__takeover(f->s, f->now, &tk, &out));
    json_t *t25 = json_incref(json_object_get(out, "types"));
    json_decref(out);
    assert_int_equal(json_array_size(t25), 1);
    tk.percent = 50;
    tk.dry_run = false;
    OK(obx__takeover(f->s, f->now, &tk, &out));
    json_t *t50 = json_object_get(out, "types");
    assert_int_equal(json_array_size(t50), 2);
    int contains = 0;
    for (size_t i = 0; i < 2; i++)
        contains +=
            !strcmp(json_string_value(json_object_get(json_array_get(t50, i), "event_type")),
                    json_string_value(json_object_get(json_array_get(t25, 0), "event_type")));
    assert_int_equal(contains, 1);
    json_decref(t25);
    json_decref(out);
}

/* Shadow mode: the legacy dispatcher publishes (with planted faults); obx in shadow mode sends
 * nothing, writes nothing, and reports each planted difference. */
static void test_shadow_reports_planted_differences(void **state) {
    fx *f = *state;
    route(f, "order.created.v1", "orders", 0, 0, "legacy");
    char ids[8][31];
    for (int i = 0; i < 8; i++) {
        char agg[16];
        snprintf(agg, sizeof agg, "o-%d", i);
        enq(f, "order.created.v1", agg, ids[i]);
    }
    /* the legacy dispatcher publishes 0..3 correctly */
    const char *al[] = {"legacy"};
    obx__engine dl;
    engine(f, &dl, "legacy-relay", f->b, al, 1);
    dl.cfg.batch = 4;
    size_t sent;
    OK(obx__engine_dispatch(&dl, f->now, &sent));
    assert_int_equal(sent, 4);
    poll_all(&dl, f->now);
    /* ... and plants: 4 on another topic, 5 on another partition, 6 with other bytes; 7 is
     * never published; and an event ID nobody committed */
    obx__rows rows = {0};
    const char *want[] = {ids[4], ids[5], ids[6]};
    OK(obx__st_load_events(f->s, want, 3, OBX__LOAD_PAYLOAD, &rows));
    assert_int_equal(rows.n, 3);
    for (int i = 0; i < 3; i++) {
        obx__event_row *r = &rows.v[i];
        obx__dest d = r->dest;
        int32_t part;
        OK(obx__br_partition_for(f->b, &d, &part));
        if (i == 0) strcpy(d.topic, "orders-legacy");
        if (i == 1) part = (part + 1) % 4;
        obx__msg m = {.env = &r->env,
                      .dest = &d,
                      .dest_digest = r->dest_digest,
                      .attempt_id = "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F30",
                      .attempt_gen = 1,
                      .partition = part,
                      .payload = i == 2 ? (const void *)"{\"order\":\"tampered\"}" : r->payload,
                      .payload_len = i == 2 ? 20 : r->payload_len};
        OK(obx__br_send(f->look, &m, 1, f->now));
    }
    obx__envelope ghost = rows.v[0].env;
    strcpy(ghost.event_id, "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G");
    obx__msg gm = {.env = &ghost,
                   .dest = &rows.v[0].dest,
                   .dest_digest = rows.v[0].dest_digest,
                   .attempt_id = "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F31",
                   .attempt_gen = 1,
                   .partition = 0,
                   .payload = rows.v[0].payload,
                   .payload_len = rows.v[0].payload_len};
    OK(obx__br_send(f->look, &gm, 1, f->now));
    obx__rows_free(&rows);
    size_t dummy;
    obx__outcome drain[8];
    OK(obx__br_poll(f->look, f->now, 0, drain, 8, &dummy));
    int before = on_topic(f->url, "orders", NULL, NULL);
    obx__store_stats st0;
    OK(f->s->m->read->stats(f->s, &st0));
    /* obx in shadow mode */
    obx__engine sh;
    engine(f, &sh, "shadow", f->b2, NULL, 0);
    const char *extra[] = {"orders-legacy"};
    obx__shadow_req req = {
        .aliases = al, .n_aliases = 1, .topics = extra, .n_topics = 1, .since = 0, .grace_ms = 0};
    char **topics;
    size_t nt;
    OK(obx__shadow_topics(&sh, f->now, &req, &topics, &nt));
    assert_int_equal(nt, 2);
    obx__observed *obs;
    size_t no;
    OK(obx__shadow_observe_broker(&sh, (const char *const *)topics, nt, 0, &obs, &no));
    for (size_t i = 0; i < nt; i++) free(topics[i]);
    free(topics);
    assert_int_equal(no, 8); /* 4 + 3 planted + the ghost */
    json_t *rep;
    size_t diffs;
    OK(obx__shadow_compare(&sh, f->now, &req, obs, no, &rep, &diffs));
    free(obs);
    json_t *dif = json_object_get(rep, "differences");
    assert_int_equal(json_integer_value(json_object_get(rep, "compared")), 8);
    assert_int_equal(json_integer_value(json_object_get(rep, "matched")), 4);
    assert_int_equal(json_integer_value(json_object_get(dif, "missing")), 1);
    assert_int_equal(json_integer_value(json_object_get(dif, "destination")), 1);
    assert_int_equal(json_integer_value(json_object_get(dif, "partition")), 1);
    assert_int_equal(json_integer_value(json_object_get(dif, "payload")), 1);
    assert_int_equal(json_integer_value(json_object_get(dif, "unknown_on_broker")), 1);
    assert_int_equal(diffs, 5);
    json_t *fl = json_object_get(rep, "findings");
    const char *kinds[] = {"destination", "partition", "payload", "missing"};
    for (int i = 0; i < 4; i++) {
        int hit = 0;
        for (size_t k = 0; k < json_array_size(fl); k++) {
            json_t *x = json_array_get(fl, k);
            if (!strcmp(json_string_value(json_object_get(x, "event_id")), ids[4 + i])) {
                hit++;
                assert_string_equal(json_string_value(json_object_get(x, "kind")), kinds[i]);
                assert_non_null(json_object_get(x, "would_send"));
            }
        }
        assert_int_equal(hit, 1);
    }
    json_decref(rep);
    /* it sent nothing and changed nothing */
    assert_int_equal(on_topic(f->url, "orders", NULL, NULL), before);
    assert_int_equal(sh.st.sent + sh.st.claimed, 0);
    obx__store_stats st1;
    OK(f->s->m->read->stats(f->s, &st1));
    assert_memory_equal(st0.by_state, st1.by_state, sizeof st0.by_state);
    assert_int_equal(attempts(f, ids[7], OBX__AT_SENDING) + attempts(f, ids[7], OBX__AT_ACCEPTED),
                     0);
    /* the same from a receipts feed: one line per publication; a bad line names itself */
    char line[512];
    obx__event_row r0 = ev(f, ids[0]);
    snprintf(line, sizeof line,
             "# legacy publisher\n{\"event_id\":\"%s\",\"topic\":\"orders\",\"partition\":%d,"
             "\"offset\":0,\"payload_digest\":\"%s\"}\n\n",
             ids[0], (int)r0.pinned_partition, r0.env.payload_digest);
    OK(obx__shadow_parse_feed(line, strlen(line), &obs, &no));
    assert_int_equal(no, 1);
    req.topics = NULL;
    req.n_topics = 0;
    OK(obx__shadow_compare(&sh, f->now, &req, obs, no, &rep, &diffs));
    free(obs);
    assert_int_equal(json_integer_value(json_object_get(rep, "matched")), 1);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(rep, "differences"), "missing")), 7);
    json_decref(rep);
    const char *badfeed = "{\"event_id\":\"evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G\",\"topic\":\"o\"}\n";
    assert_int_equal(obx__shadow_parse_feed(badfeed, strlen(badfeed), &obs, &no), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "feed line 1: partition: missing"));
}

static const struct CMUnitTest tests[] = {
    OBX_T_CASE(test_migrate_refused_while_unknown_then_done),
    OBX_T_CASE(test_migrate_refused_unqueryable_then_proven),
    OBX_T_CASE(test_late_old_generation_ack_quarantined),
    OBX_T_CASE(test_route_revision_during_backlog),
    OBX_T_CASE(test_delivery_set_all),
    OBX_T_CASE(test_delivery_set_any),
    OBX_T_CASE(test_delivery_rule_decides_delivered),
    OBX_T_CASE(test_add_target_is_a_migration),
    OBX_T_CASE(test_alias_switch_mid_stream),
    OBX_T_CASE(test_shadow_reports_planted_differences),
};

int engine_migration_run(const char *label, store_factory f) {
    factory = f;
    return OBX_T_RUN_IN_TMPDIR(label, tests, tmpdir, "mig");
}
