/*
 * delay_suite.c — delayed events on every store backend (docs/operations.md, "Delayed events"):
 * the relay does not claim a delayed event before its time and claims it at its time; the
 * envelope freezes not_before (in its digest only when set, the digest computed by the store
 * on PostgreSQL's one-round-trip enqueue equal to the C one); a later event of the same order
 * key waits behind it unless the route is unordered; obx_cancel moves a PENDING delayed event to
 * CANCELLED with an audit row and releases the key, and refuses once it is claimed; a delay over
 * OBX_DELAY_MAX_MS is refused with nothing written. Real store (from the factory), real local
 * log broker, virtual clock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"

#include "engine/delay_suite.h"
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static store_factory factory;
static char tmpdir[64];
static int nfiles;

#define DELAY_MS 3000

typedef struct fx {
    obx__store *s;
    obx__broker *b;
    obx__engine e;
    int64_t now;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    char url[256];
    if (!f || obx_t_factory(factory, &f->s)) {
        free(f);
        return -1;
    }
    if (obx_t_log_broker(url, sizeof url, tmpdir, ++nfiles, 11, &f->b)) return -1;
    f->now = OBX_T_NOW;
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    obx__strlcpy(c.owner, "relay-a", sizeof c.owner);
    c.lease_ms = 1000;
    c.seed = 99;
    if (obx__engine_init(&f->e, f->s, f->b, &c)) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    obx__br_close(f->b);
    obx__st_close(f->s);
    free(f);
    return 0;
}

static void route(fx *f, int unordered) {
    obx_route r = {.event_type = "order.created.v1",
                   .cluster = "local",
                   .topic = "orders",
                   .unordered = unordered};
    OK(obx__route_set_at(f->s, &r, f->now, NULL));
}

/* Enqueues an event of aggregate agg, not before not_before (0: no delay); its ID into id. */
static obx_err enq(fx *f, const char *agg, int64_t not_before, char id[31]) {
    obx_event ev = obx_t_event("order.created.v1", "order", agg, "t1", "{}");
    ev.aggregate_version = 1;
    ev.not_before_ms = not_before;
    obx_enqueue_result r;
    obx_err e = obx__enqueue_at(f->s, &ev, f->now, NULL, &r);
    if (!e) strcpy(id, r.event_id);
    return e;
}

static obx__event_row ev(fx *f, const char *id) { return obx_t_ev(f->s, id, 0); }

/* Dispatches at `at` and applies every outcome; the number of events sent. */
static size_t relay_at(fx *f, int64_t at) {
    size_t sent = 0, n;
    OK(obx__engine_dispatch(&f->e, at, &sent));
    do OK(obx__engine_poll(&f->e, at, 0, &n));
    while (n);
    return sent;
}

static int64_t committed(fx *f) {
    obx__store_stats st;
    OK(obx__st_stats(f->s, &st));
    int64_t n = 0;
    for (int i = 1; i < OBX__ST_COUNT; i++) n += st.by_state[i];
    return n;
}

/* Not claimed a millisecond before its time, claimed and published at it; an event without a
 * delay beside it goes at once. */
static void test_delay_not_claimed_before_time(void **state) {
    fx *f = *state;
    route(f, 0);
    char d[31], now_id[31];
    int64_t at = f->now + DELAY_MS;
    OK(enq(f, "o-1", at, d));
    OK(enq(f, "o-2", 0, now_id));
    obx__event_row r = ev(f, d);
    assert_int_equal(r.state, OBX__ST_PENDING);
    assert_int_equal(r.available_at, at);
    assert_int_equal(r.env.not_before, at);
    assert_int_equal(relay_at(f, f->now), 1);
    assert_int_equal(ev(f, now_id).state, OBX__ST_PUBLISHED);
    assert_int_equal(relay_at(f, at - 1), 0);
    assert_int_equal(ev(f, d).state, OBX__ST_PENDING);
    assert_int_equal(relay_at(f, at), 1);
    r = ev(f, d);
    assert_int_equal(r.state, OBX__ST_PUBLISHED);
    assert_true(r.published_at >= at);
}

/* The envelope freezes not_before: its digest covers it when set (the stored digest is the C
 * one, also where the store computes it: the second enqueue of a type goes in one round trip
 * on PostgreSQL), and an event without a delay digests as before not_before existed. */
static void test_delay_frozen_in_digest(void **state) {
    fx *f = *state;
    route(f, 0);
    char a[31], b[31], c[31];
    OK(enq(f, "o-1", 0, a));
    OK(enq(f, "o-2", f->now + DELAY_MS, b));
    OK(enq(f, "o-3", f->now + DELAY_MS, c));
    const char *ids[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        obx__event_row r = ev(f, ids[i]);
        char want[OBX_DIGEST_LEN + 1], without[OBX_DIGEST_LEN + 1];
        OK(obx__envelope_digest(&r.env, want));
        assert_string_equal(r.envelope_digest, want);
        r.env.not_before = 0;
        OK(obx__envelope_digest(&r.env, without));
        if (i == 0)
            assert_string_equal(want, without);
        else
            assert_string_not_equal(want, without);
    }
}

/* A later event of the same key waits behind a delayed one (ordered route); another key does
 * not. */
static void test_delay_orders_key(void **state) {
    fx *f = *state;
    route(f, 0);
    char d[31], later[31], other[31];
    int64_t at = f->now + DELAY_MS;
    OK(enq(f, "o-1", at, d));
    OK(enq(f, "o-1", 0, later));
    OK(enq(f, "o-2", 0, other));
    assert_int_equal(relay_at(f, f->now), 1);
    assert_int_equal(ev(f, other).state, OBX__ST_PUBLISHED);
    assert_int_equal(relay_at(f, at - 1), 0);
    assert_int_equal(ev(f, later).state, OBX__ST_PENDING);
    relay_at(f, at);
    relay_at(f, at);
    obx__event_row rd = ev(f, d), rl = ev(f, later);
    assert_int_equal(rd.state, OBX__ST_PUBLISHED);
    assert_int_equal(rl.state, OBX__ST_PUBLISHED);
    assert_true(rd.seq < rl.seq);
    assert_true(rl.published_at >= rd.published_at);
}

/* On an unordered route the later event of the key does not wait. */
static void test_delay_unordered_route(void **state) {
    fx *f = *state;
    route(f, 1);
    char d[31], later[31];
    OK(enq(f, "o-1", f->now + DELAY_MS, d));
    OK(enq(f, "o-1", 0, later));
    assert_int_equal(relay_at(f, f->now), 1);
    assert_int_equal(ev(f, later).state, OBX__ST_PUBLISHED);
    assert_int_equal(ev(f, d).state, OBX__ST_PENDING);
}

static int audit_rows(fx *f, const char *id, obx__state to, const char *needle) {
    obx__audit_row *a;
    size_t n;
    OK(f->s->m->load_audit(f->s, id, &a, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++)
        c += a[i].to == to && a[i].actor == OBX__ACT_OPERATOR && strstr(a[i].reason, needle);
    free(a);
    return c;
}

/* Cancel before the claim: CANCELLED with one audit row naming who and why, never sent, and the
 * key's next event goes; a second cancel, and a cancel of an event without a delay, refused. */
static void test_cancel_before_claim(void **state) {
    fx *f = *state;
    route(f, 0);
    char d[31], later[31], plain[31];
    OK(enq(f, "o-1", f->now + DELAY_MS, d));
    OK(enq(f, "o-1", 0, later));
    OK(enq(f, "o-9", f->now + DELAY_MS, plain));
    assert_int_equal(obx__cancel(f->s, d, "", "paid", f->now), OBX_EINVAL);
    assert_int_equal(obx__cancel(f->s, d, "alice", "", f->now), OBX_EINVAL);
    OK(obx__cancel(f->s, d, "alice", "order paid", f->now));
    assert_int_equal(ev(f, d).state, OBX__ST_CANCELLED);
    assert_int_equal(audit_rows(f, d, OBX__ST_CANCELLED, "order paid"), 1);
    assert_int_equal(obx__cancel(f->s, d, "alice", "again", f->now), OBX_EREFUSED);
    assert_int_equal(relay_at(f, f->now), 1);
    assert_int_equal(ev(f, later).state, OBX__ST_PUBLISHED);
    assert_int_equal(obx__cancel(f->s, later, "alice", "no delay", f->now), OBX_EREFUSED);
    relay_at(f, f->now + DELAY_MS);
    assert_int_equal(ev(f, d).state, OBX__ST_CANCELLED);
    assert_int_equal(ev(f, plain).state, OBX__ST_PUBLISHED);
    obx__attempt_row *att;
    size_t n;
    OK(obx__st_load_attempts(f->s, NULL, 0, d, &att, &n));
    free(att);
    assert_int_equal(n, 0);
    obx__store_invariants inv;
    OK(obx__st_invariants(f->s, &inv));
    assert_int_equal(inv.cancelled_with_attempt, 0);
    char missing[31] = "evt-00000000000000000000000000";
    assert_int_equal(obx__cancel(f->s, missing, "alice", "x", f->now), OBX_ENOTFOUND);
}

/* Once claimed (sent), cancel is refused and changes nothing. */
static void test_cancel_after_claim_refused(void **state) {
    fx *f = *state;
    route(f, 0);
    char d[31];
    int64_t at = f->now + DELAY_MS;
    OK(enq(f, "o-1", at, d));
    size_t sent;
    OK(obx__engine_dispatch(&f->e, at, &sent));
    assert_int_equal(sent, 1);
    assert_int_equal(ev(f, d).state, OBX__ST_SENDING);
    assert_int_equal(obx__cancel(f->s, d, "alice", "too late", at), OBX_EREFUSED);
    assert_int_equal(ev(f, d).state, OBX__ST_SENDING);
    assert_int_equal(audit_rows(f, d, OBX__ST_CANCELLED, "too late"), 0);
    relay_at(f, at);
    assert_int_equal(ev(f, d).state, OBX__ST_PUBLISHED);
    assert_int_equal(obx__cancel(f->s, d, "alice", "too late", at), OBX_EREFUSED);
}

/* A delay over the maximum, or a negative time, is refused naming the field; nothing is
 * written. The maximum itself and a time in the past are accepted. */
static void test_delay_bad_input(void **state) {
    fx *f = *state;
    route(f, 0);
    char id[31];
    assert_int_equal(enq(f, "o-1", f->now + OBX_DELAY_MAX_MS + 1, id), OBX_ETOOBIG);
    assert_non_null(strstr(obx_errmsg(), "not_before_ms"));
    assert_non_null(strstr(obx_errmsg(), "maximum delay"));
    assert_int_equal(enq(f, "o-1", -5, id), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "not_before_ms"));
    assert_int_equal(committed(f), 0);
    OK(enq(f, "o-1", f->now + OBX_DELAY_MAX_MS, id));
    OK(enq(f, "o-2", f->now - 60000, id));
    assert_int_equal(ev(f, id).available_at, f->now);
    assert_int_equal(relay_at(f, f->now), 1);
    assert_int_equal(committed(f), 2);
}

/* A delayed event migrated to a new destination before its time keeps its time (the new
 * envelope generation freezes the same not_before). Before the migrator kept it, the event was
 * claimable at once: sent 1 ms before its time. */
static void test_delay_kept_by_migration(void **state) {
    fx *f = *state;
    route(f, 0);
    char d[31];
    int64_t at = f->now + DELAY_MS, gen;
    OK(enq(f, "o-1", at, d));
    obx_route r2 = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders-v2"};
    OK(obx__route_set_at(f->s, &r2, f->now, &gen));
    const char *ids[] = {d};
    obx__migrate_req req = {
        .ids = ids, .n_ids = 1, .route_gen = gen, .who = "ops", .reason = "topic renamed"};
    json_t *out = NULL;
    size_t refused = 0;
    OK(obx__migrate(&f->e, f->now, &req, &out, &refused));
    json_decref(out);
    assert_int_equal(refused, 0);
    obx__event_row r = ev(f, d);
    assert_int_equal(r.envelope_gen, 2);
    assert_string_equal(r.dest.topic, "orders-v2");
    assert_int_equal(r.env.not_before, at);
    assert_int_equal(r.available_at, at);
    assert_int_equal(relay_at(f, at - 1), 0);
    assert_int_equal(relay_at(f, at), 1);
    assert_int_equal(ev(f, d).state, OBX__ST_PUBLISHED);
}

static const struct CMUnitTest tests[] = {
    OBX_T_CASE(test_delay_not_claimed_before_time),
    OBX_T_CASE(test_delay_frozen_in_digest),
    OBX_T_CASE(test_delay_orders_key),
    OBX_T_CASE(test_delay_unordered_route),
    OBX_T_CASE(test_cancel_before_claim),
    OBX_T_CASE(test_cancel_after_claim_refused),
    OBX_T_CASE(test_delay_bad_input),
    OBX_T_CASE(test_delay_kept_by_migration),
};

int engine_delay_run(const char *label, store_factory f) {
    factory = f;
    return OBX_T_RUN_IN_TMPDIR(label, tests, tmpdir, "delay");
}
