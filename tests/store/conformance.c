/*
 * conformance.c — the store conformance suite (see conformance.h). It tests the store vtable's
 * contract through the engine's wrappers: routes, enqueue round trips, idempotency, the claim
 * rule (order per key, leases, backoff, cluster and alias filters, a delayed backlog ahead of due
 * events), compare-and-set updates,
 * attempts, receipts (one primary per event and generation), audit, selections, nested
 * transactions, statistics, the inbox tables, and the retention and audit methods (publication
 * order, payload purge, aged queries, known event IDs); delivery sets,
 * event selection by attributes, receipt details and the alias hand-over of unclaimed events;
 * the cluster registry, receipt sources, consume receipts as evidence
 * and held events; any envelope generation as it was frozen; and the producer's methods
 * (route_get_txid, insert_event_audit, enqueue_write) and the write set, which every backend
 * implements (one engine path per operation); and a producer process killed between its business
 * row and its enqueue, before its COMMIT and after it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"

#include "engine/engine.h"
#include "store/conformance.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static store_factory factory;
static const store_app *app;

typedef struct cx {
    obx__store *s;
    int64_t now;
} cx;

static int setup(void **state) {
    cx *c = calloc(1, sizeof *c);
    if (factory(&c->s) != OBX_OK) {
        fprintf(stderr, "store factory: %s\n", obx_errmsg());
        free(c);
        return -1;
    }
    c->now = 1800000000000;
    *state = c;
    return 0;
}

static int teardown(void **state) {
    cx *c = *state;
    obx__st_close(c->s);
    free(c);
    return 0;
}

static void route(cx *c, const char *type, const char *topic, int unordered, const char *alias) {
    obx_route r = {.event_type = type,
                   .cluster = "local",
                   .topic = topic,
                   .unordered = unordered,
                   .alias = alias};
    OK(obx__route_set_at(c->s, &r, c->now, NULL));
}

static void enq(cx *c, const char *type, const char *agg, const char *corr, char id[31]) {
    obx_t_enq(c->s, c->now, type, agg, corr, "{\"x\":1}", id);
}

static obx__event_row load1(cx *c, const char *id, unsigned flags) {
    return obx_t_ev(c->s, id, flags);
}

static void test_init_and_routes(void **state) {
    cx *c = *state;
    int found = 0, known = 0;
    OK(obx_store_schema_version(c->s, &found, &known));
    assert_int_equal(found, known);
    OK(obx_store_init(c->s)); /* idempotent */
    obx__route_row rr;
    assert_int_equal(c->s->m->route_get(c->s, "order.created.v1", &rr), OBX_ENOROUTE);
    route(c, "order.created.v1", "orders", 0, NULL);
    route(c, "order.created.v1", "orders2", 1, "alias-b");
    route(c, "payment.done.v1", "payments", 0, NULL);
    OK(c->s->m->route_get(c->s, "order.created.v1", &rr));
    assert_string_equal(rr.topic, "orders2");
    assert_true(rr.unordered);
    assert_string_equal(rr.alias, "alias-b");
    assert_string_equal(rr.algorithm, "murmur2");
    assert_int_equal(rr.max_attempts, 8);
    obx__route_row *list;
    size_t n;
    OK(c->s->m->route_list(c->s, false, &list, &n));
    assert_int_equal(n, 2);
    free(list);
    OK(c->s->m->route_list(c->s, true, &list, &n));
    assert_int_equal(n, 3);
    assert_true(list[0].gen < list[1].gen);
    free(list);
}

static void test_enqueue_roundtrip(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    obx_event ev = {.event_type = "order.created.v1",
                    .aggregate_type = "order",
                    .aggregate_id = "o-ü",
                    .aggregate_version = 42,
                    .tenant = "tenant-7",
                    .payload = "\x00\x01payload\xff",
                    .payload_len = 10,
                    .correlation_id = "corr",
                    .causation_id = "cause",
                    .traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                    .idempotency_key = "k-1",
                    .occurred_at_ms = 1700000000001};
    obx_enqueue_result res;
    OK(obx__enqueue_at(c->s, &ev, c->now, NULL, &res));
    obx__rows rows = {0};
    const char *id = res.event_id;
    OK(obx__st_load_events(c->s, &id, 1, OBX__LOAD_PAYLOAD, &rows));
    assert_int_equal(rows.n, 1);
    obx__event_row *r = &rows.v[0];
    assert_int_equal(r->state, OBX__ST_PENDING);
    assert_int_equal(r->envelope_gen, 1);
    assert_int_equal(r->claim_gen, 0);
    assert_int_equal(r->pinned_partition, -1);
    assert_int_equal(r->committed_at, c->now);
    assert_int_equal(r->available_at, c->now);
    assert_string_equal(r->env.aggregate_id, "o-ü");
    assert_int_equal(r->env.aggregate_version, 42);
    assert_int_equal(r->env.occurred_at, 1700000000001);
    assert_string_equal(r->env.causation_id, "cause");
    assert_string_equal(r->env.idempotency_key, "k-1");
    assert_string_equal(r->dest.topic, "orders");
    assert_string_equal(r->dest.routing_key, "tenant-7.order.o-ü");
    assert_int_equal(r->payload_len, 10);
    assert_memory_equal(r->payload, "\x00\x01payload\xff", 10);
    assert_false(r->payload_purged);
    char d[OBX_DIGEST_LEN + 1];
    OK(obx__dest_digest(&r->dest, d));
    assert_string_equal(d, r->dest_digest);
    assert_string_equal(d, res.dest_digest);
    OK(obx__envelope_digest(&r->env, d));
    assert_string_equal(d, r->envelope_digest);
    assert_true(r->env.created_txid[0] != '\0');
    obx__rows_free(&rows);
    /* idempotency: same tenant+key returns the first; nothing new */
    obx_enqueue_result again;
    OK(obx__enqueue_at(c->s, &ev, c->now + 5, NULL, &again));
    assert_true(again.existing);
    assert_string_equal(again.event_id, res.event_id);
    /* another event under the taken key is refused, never answered with the first's ID */
    obx_event other = ev;
    other.payload = "\x00\x01payload\xfe";
    assert_int_equal(obx__enqueue_at(c->s, &other, c->now + 6, NULL, &again), OBX_ECONFLICT);
    assert_non_null(strstr(obx_errmsg(), "with another payload"));
    assert_string_equal(again.event_id, "");
    other = ev;
    other.aggregate_id = "o-2";
    assert_int_equal(obx__enqueue_at(c->s, &other, c->now + 7, NULL, &again), OBX_ECONFLICT);
    assert_non_null(strstr(obx_errmsg(), "with another aggregate"));
    other = ev;
    other.tenant = "tenant-8"; /* keys are per tenant: another tenant's is its own */
    OK(obx__enqueue_at(c->s, &other, c->now + 8, NULL, &again));
    assert_false(again.existing);
    obx__store_stats st;
    OK(c->s->m->read->stats(c->s, &st));
    assert_int_equal(st.by_state[OBX__ST_PENDING], 2);
    /* bad input leaves nothing */
    ev.tenant = "bad tenant";
    assert_int_equal(obx__enqueue_at(c->s, &ev, c->now, NULL, &again), OBX_EINVAL);
    ev.tenant = "t2";
    ev.event_type = "no.route.v1";
    assert_int_equal(obx__enqueue_at(c->s, &ev, c->now, NULL, &again), OBX_ENOROUTE);
    OK(c->s->m->read->stats(c->s, &st));
    assert_int_equal(st.by_state[OBX__ST_PENDING], 2);
    /* missing IDs are skipped by load */
    const char *missing = "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G";
    OK(obx__st_load_events(c->s, &missing, 1, 0, &rows));
    assert_int_equal(rows.n, 0);
    obx__rows_free(&rows);
}

static void claim(cx *c, obx__claim_req *req, obx__rows *out) {
    OK(obx__st_begin(c->s));
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = req}, out));
    OK(obx__st_commit(c->s));
}

static bool has(const obx__rows *r, const char *id) {
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->v[i].env.event_id, id)) return true;
    return false;
}

static void set_state(cx *c, const char *id, obx__state to, int64_t lease_until) {
    obx__event_row r = load1(c, id, 0);
    obx__state from = r.state;
    int64_t gen = r.claim_gen;
    r.state = to;
    r.lease_until = lease_until;
    if (to == OBX__ST_CLAIMED) r.claim_gen++;
    if (to == OBX__ST_PUBLISHED) r.published_at = c->now;
    obx__event_update u = {&r, from, gen};
    bool ok = false;
    OK(obx__st_begin(c->s));
    OK(obx__st_update_events(c->s, &u, 1, &ok));
    OK(obx__st_commit(c->s));
    assert_true(ok);
}

static void test_claim_rule(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    route(c, "order.free.v1", "free", 1, "other");
    char a1[31], a2[31], b1[31], u1[31], u2[31];
    enq(c, "order.created.v1", "o-a", "", a1); /* key A: a1 then a2 */
    enq(c, "order.created.v1", "o-a", "", a2);
    enq(c, "order.created.v1", "o-b", "", b1);
    enq(c, "order.free.v1", "o-u", "", u1); /* unordered: both claimable */
    enq(c, "order.free.v1", "o-u", "", u2);
    obx__claim_req req = {.now = c->now, .limit = 100};
    obx__rows r = {0};
    claim(c, &req, &r);
    assert_true(has(&r, a1));
    assert_false(has(&r, a2)); /* behind an unpublished event with the same key */
    assert_true(has(&r, b1));
    assert_true(has(&r, u1));
    assert_true(has(&r, u2));
    assert_int_equal(r.n, 4);
    for (size_t i = 1; i < r.n; i++) assert_true(r.v[i - 1].seq < r.v[i].seq); /* oldest first */
    assert_non_null(r.v[0].payload);
    obx__rows_free(&r);
    /* limit */
    req.limit = 2;
    claim(c, &req, &r);
    assert_int_equal(r.n, 2);
    obx__rows_free(&r);
    req.limit = 100;
    /* alias and cluster filters */
    const char *aliases[] = {"other"};
    req.aliases = aliases;
    req.n_aliases = 1;
    claim(c, &req, &r);
    assert_int_equal(r.n, 2);
    assert_true(has(&r, u1));
    obx__rows_free(&r);
    req.n_aliases = 0;
    req.cluster = "elsewhere";
    claim(c, &req, &r);
    assert_int_equal(r.n, 0);
    obx__rows_free(&r);
    req.cluster = "local";
    /* a1 claimed with a live lease: neither a1 nor a2 */
    set_state(c, a1, OBX__ST_CLAIMED, c->now + 1000);
    claim(c, &req, &r);
    assert_false(has(&r, a1));
    assert_false(has(&r, a2));
    obx__rows_free(&r);
    /* lease expired and no attempt: a1 may be claimed again */
    req.now = c->now + 1000;
    claim(c, &req, &r);
    assert_true(has(&r, a1));
    assert_false(has(&r, a2));
    obx__rows_free(&r);
    /* a1 SENDING, then UNKNOWN: still holds a2 back */
    set_state(c, a1, OBX__ST_SENDING, c->now + 5000);
    claim(c, &req, &r);
    assert_false(has(&r, a1));
    assert_false(has(&r, a2));
    obx__rows_free(&r);
    /* a1 published: a2 is next */
    set_state(c, a1, OBX__ST_PUBLISHED, 0);
    claim(c, &req, &r);
    assert_true(has(&r, a2));
    obx__rows_free(&r);
    /* backoff: available_at in the future */
    obx__event_row row = load1(c, b1, 0);
    row.available_at = c->now + 60000;
    obx__event_update u = {&row, row.state, row.claim_gen};
    bool ok;
    OK(obx__st_begin(c->s));
    OK(obx__st_update_events(c->s, &u, 1, &ok));
    OK(obx__st_commit(c->s));
    claim(c, &req, &r);
    assert_false(has(&r, b1));
    obx__rows_free(&r);
    req.now = c->now + 60000;
    claim(c, &req, &r);
    assert_true(has(&r, b1));
    obx__rows_free(&r);
}

/* Enqueues an event of aggregate agg not before not_before (the enqueue's time: c->now). */
static void enq_delayed(cx *c, const char *agg, int64_t not_before, char id[31]) {
    obx_event ev = obx_t_event("order.created.v1", "order", agg, "t1", "{\"x\":1}");
    ev.aggregate_version = 1;
    ev.not_before_ms = not_before;
    obx_enqueue_result r;
    OK(obx__enqueue_at(c->s, &ev, c->now, NULL, &r));
    strcpy(id, r.event_id);
}

/* Issue 51: a delayed backlog ahead of the due events (enqueued earlier, more than a claim's
 * limit) does not hide them, and no delayed event is claimed before its time: at not_before - 1
 * none, at not_before exactly those due, earliest due first; a due event behind a delayed one of
 * its key waits for it. A claim that skipped the time check, or stopped its walk on the
 * delayed rows, fails here. */
#define DELAYED_N 300
static void test_claim_delayed_backlog(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    const int64_t t1 = c->now + 3600000, t2 = c->now + 7200000;
    char far[31], late[31], d1[31], d2[31], d3[31], kx[31], ky[31], id[31];
    OK(obx__st_begin(c->s));
    for (int i = 0; i < DELAYED_N; i++) {
        char agg[32];
        snprintf(agg, sizeof agg, "o-later-%d", i);
        enq_delayed(c, agg, t2, i == 0 ? far : id); /* DELAYED_N keys due at t2 */
    }
    OK(obx__st_commit(c->s));
    enq_delayed(c, "o-k", t1, kx); /* key k: kx delayed to t1, then ky due now behind it */
    enq_delayed(c, "o-k", 0, ky);
    enq_delayed(c, "o-d1", 0, d1);
    enq_delayed(c, "o-late", t1, late);
    enq_delayed(c, "o-d2", 0, d2);
    enq_delayed(c, "o-d3", c->now, d3); /* not_before = now: due at once */
    obx__claim_req req = {.now = c->now, .limit = 2};
    obx__rows r = {0};
    claim(c, &req, &r); /* the limit: the earliest due, whatever lies before them in seq */
    assert_int_equal(r.n, 2);
    assert_true(has(&r, d1));
    assert_true(has(&r, d2));
    obx__rows_free(&r);
    req.limit = 100;
    req.now = t1 - 1;
    claim(c, &req, &r);
    assert_int_equal(r.n, 3); /* d1, d2, d3; ky behind kx; kx, late and the backlog not yet */
    assert_true(has(&r, d1) && has(&r, d2) && has(&r, d3));
    obx__rows_free(&r);
    req.now = t1;
    claim(c, &req, &r);
    assert_int_equal(r.n, 5); /* kx and late are due; ky still waits for kx */
    assert_true(has(&r, kx) && has(&r, late));
    assert_false(has(&r, ky));
    assert_false(has(&r, far));
    for (size_t i = 1; i < r.n; i++) /* earliest due first, then oldest */
        assert_true(
            r.v[i - 1].available_at < r.v[i].available_at ||
            (r.v[i - 1].available_at == r.v[i].available_at && r.v[i - 1].seq < r.v[i].seq));
    obx__rows_free(&r);
    set_state(c, kx, OBX__ST_PUBLISHED, 0); /* kx published: ky is next */
    claim(c, &req, &r);
    assert_true(has(&r, ky));
    assert_false(has(&r, far));
    obx__rows_free(&r);
    req.now = t2 - 1;
    req.limit = 1000;
    claim(c, &req, &r);
    assert_false(has(&r, far));
    assert_int_equal(r.n, 5); /* d1, d2, d3, late, ky */
    obx__rows_free(&r);
    req.now = t2; /* the backlog is due: all of it, after the earlier due ones */
    claim(c, &req, &r);
    assert_int_equal(r.n, 5 + DELAYED_N);
    assert_true(has(&r, far));
    assert_string_equal(r.v[5].env.event_id, far);
    obx__rows_free(&r);
}

static void test_cas(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    char a[31];
    enq(c, "order.created.v1", "o-1", "", a);
    obx__event_row r = load1(c, a, 0);
    r.state = OBX__ST_CLAIMED;
    r.claim_gen = 1;
    obx__strlcpy(r.owner, "relay-1", sizeof r.owner);
    r.lease_until = c->now + 100;
    obx__event_update u[2] = {{&r, OBX__ST_PENDING, 0}, {&r, OBX__ST_PENDING, 0}};
    bool ok[2] = {false, false};
    OK(obx__st_begin(c->s));
    OK(obx__st_update_events(c->s, u, 1, ok));
    assert_true(ok[0]);
    /* the same expectation again loses: the state moved on */
    OK(obx__st_update_events(c->s, u + 1, 1, ok + 1));
    assert_false(ok[1]);
    OK(obx__st_commit(c->s));
    obx__event_row back = load1(c, a, 0);
    assert_int_equal(back.state, OBX__ST_CLAIMED);
    assert_int_equal(back.claim_gen, 1);
    assert_string_equal(back.owner, "relay-1");
    assert_int_equal(back.lease_until, c->now + 100);
    /* stale claim_gen loses */
    back.state = OBX__ST_SENDING;
    obx__event_update stale = {&back, OBX__ST_CLAIMED, 0};
    OK(obx__st_begin(c->s));
    OK(obx__st_update_events(c->s, &stale, 1, ok));
    OK(obx__st_commit(c->s));
    assert_false(ok[0]);
    /* rollback undoes an applied update */
    obx__event_update good = {&back, OBX__ST_CLAIMED, 1};
    OK(obx__st_begin(c->s));
    OK(obx__st_update_events(c->s, &good, 1, ok));
    assert_true(ok[0]);
    OK(obx__st_rollback(c->s));
    assert_int_equal(load1(c, a, 0).state, OBX__ST_CLAIMED);
    /* nested: inner rolled back, outer kept */
    obx__event_row r2 = load1(c, a, 0);
    r2.rejections = 3;
    obx__event_update g2 = {&r2, OBX__ST_CLAIMED, 1};
    OK(obx__st_begin(c->s));
    OK(obx__st_update_events(c->s, &g2, 1, ok));
    OK(obx__st_begin(c->s));
    obx__event_row r3 = r2;
    r3.rejections = 7;
    obx__event_update g3 = {&r3, OBX__ST_CLAIMED, 1};
    OK(obx__st_update_events(c->s, &g3, 1, ok));
    OK(obx__st_rollback(c->s));
    OK(obx__st_commit(c->s));
    assert_int_equal(load1(c, a, 0).rejections, 3);
}

static obx__attempt_row attempt(const char *event_id, const char *att, int gen) {
    obx__attempt_row a;
    memset(&a, 0, sizeof a);
    strcpy(a.attempt_id, att);
    strcpy(a.event_id, event_id);
    a.envelope_gen = 1;
    a.attempt_gen = gen;
    a.claim_gen = 1;
    strcpy(a.owner, "relay-1");
    strcpy(a.dest_digest,
           "sha256:0000000000000000000000000000000000000000000000000000000000000000");
    a.partition = 3;
    a.state = OBX__AT_SENDING;
    a.started_at = 1000 + gen;
    a.offset_before = -1;
    return a;
}

/* A transaction's many audit rows in one call (SQLite writes them in statements of up to 16
 * rows): all of them, in the order given, after the event's 2 rows so far. */
static void audit_batch(cx *c, const char *id, const obx__audit_row *proto) {
    enum { N = 37 };
    obx__audit_row rows[N];
    for (int i = 0; i < N; i++) {
        rows[i] = *proto;
        rows[i].to = OBX__ST_CLAIMED;
        rows[i].claim_gen = 100 + i;
        snprintf(rows[i].reason, sizeof rows[i].reason, "batch row %d", i);
    }
    OK(obx__st_begin(c->s));
    OK(obx__st_insert_audit(c->s, rows, N));
    OK(obx__st_commit(c->s));
    obx__audit_row *aa;
    size_t n;
    OK(c->s->m->load_audit(c->s, id, &aa, &n));
    assert_int_equal(n, 2 + N);
    for (int i = 0; i < N; i++) {
        char want[32];
        snprintf(want, sizeof want, "batch row %d", i);
        assert_string_equal(aa[2 + i].reason, want);
        assert_int_equal(aa[2 + i].claim_gen, 100 + i);
    }
    free(aa);
}

static void test_attempts_receipts_audit(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    char a[31];
    enq(c, "order.created.v1", "o-1", "", a);
    obx__attempt_row at[2] = {attempt(a, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G", 1),
                              attempt(a, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3H", 2)};
    OK(obx__st_begin(c->s));
    OK(obx__st_insert_attempts(c->s, at, 2));
    OK(obx__st_commit(c->s));
    at[0].state = OBX__AT_UNKNOWN;
    at[0].unknown_at = 1500;
    at[0].quiet_until = 1600;
    strcpy(at[0].detail, "ack timed out");
    OK(obx__st_begin(c->s));
    OK(obx__st_update_attempts(c->s, at, 1));
    OK(obx__st_commit(c->s));
    obx__attempt_row *got;
    size_t n;
    const char *ids[] = {at[1].attempt_id, at[0].attempt_id, "att-missing"};
    OK(obx__st_load_attempts(c->s, ids, 3, NULL, &got, &n));
    assert_int_equal(n, 2);
    assert_string_equal(got[0].attempt_id, at[1].attempt_id);
    assert_int_equal(got[1].state, OBX__AT_UNKNOWN);
    assert_int_equal(got[1].quiet_until, 1600);
    assert_string_equal(got[1].detail, "ack timed out");
    assert_int_equal(got[1].partition, 3);
    free(got);
    OK(obx__st_load_attempts(c->s, NULL, 0, a, &got, &n));
    assert_int_equal(n, 2);
    assert_int_equal(got[0].attempt_gen, 1);
    free(got);
    /* load_slots: each pair's slot is the event that registered the attempt (whatever event
     * the pair names), else the event named; an ID found nowhere gives no row */
    char b[31];
    enq(c, "order.created.v1", "o-2", "", b);
    const char *aids[] = {at[1].attempt_id, "att-missing", "att-none"};
    const char *eids[] = {"evt-other", b, "evt-none"};
    obx__rows ev = {0};
    OK(obx__st_begin(c->s));
    OK(obx__st_load_slots(c->s, aids, eids, 3, OBX__LOAD_LOCK, &got, &n, &ev));
    OK(obx__st_commit(c->s));
    assert_int_equal(n, 1);
    assert_string_equal(got[0].attempt_id, at[1].attempt_id);
    assert_string_equal(got[0].event_id, a);
    assert_int_equal(ev.n, 2);
    assert_string_equal(ev.v[0].env.event_id, a);
    assert_string_equal(ev.v[1].env.event_id, b);
    assert_null(ev.v[0].payload);
    free(got);
    obx__rows_free(&ev);
    /* an attempt's identity is frozen: a second insert with the same ID conflicts */
    OK(obx__st_begin(c->s));
    assert_int_equal(obx__st_insert_attempts(c->s, at, 1), OBX_ECONFLICT);
    OK(obx__st_rollback(c->s));

    obx__receipt_row rc = obx_t_receipt(a, at[0].attempt_id, OBX__RK_PRIMARY, c->now);
    rc.partition = 3;
    rc.offset = 77;
    rc.broker_ts = 1234;
    strcpy(rc.payload_digest, at[0].dest_digest);
    strcpy(rc.dest_digest, at[0].dest_digest);
    OK(obx__st_begin(c->s));
    OK(obx__st_insert_receipts(c->s, &rc, 1));
    OK(obx__st_commit(c->s));
    /* a second PRIMARY for the same event and generation is refused by the store itself */
    OK(obx__st_begin(c->s));
    assert_int_equal(obx__st_insert_receipts(c->s, &rc, 1), OBX_ECONFLICT);
    OK(obx__st_rollback(c->s));
    rc.kind = OBX__RK_DUPLICATE;
    rc.offset = 78;
    obx__receipt_row more[2] = {rc, rc};
    more[1].kind = OBX__RK_QUARANTINED;
    strcpy(more[1].reason, "payload digest differs");
    OK(obx__st_begin(c->s));
    OK(obx__st_insert_receipts(c->s, more, 2));
    OK(obx__st_commit(c->s));
    obx__receipt_row *rr;
    OK(c->s->m->load_receipts(c->s, a, &rr, &n));
    assert_int_equal(n, 3);
    assert_int_equal(rr[0].kind, OBX__RK_PRIMARY);
    assert_int_equal(rr[0].offset, 77);
    assert_int_equal(rr[1].kind, OBX__RK_DUPLICATE);
    assert_int_equal(rr[2].kind, OBX__RK_QUARANTINED);
    assert_string_equal(rr[2].reason, "payload digest differs");
    free(rr);

    obx__audit_row au;
    memset(&au, 0, sizeof au);
    au.at = c->now;
    au.actor = OBX__ACT_DISPATCHER;
    strcpy(au.who, "relay-1");
    strcpy(au.event_id, a);
    au.envelope_gen = 1;
    au.from = OBX__ST_PENDING;
    au.to = OBX__ST_CLAIMED;
    au.claim_gen = 1;
    strcpy(au.reason, "claimed");
    OK(obx__st_begin(c->s));
    OK(obx__st_insert_audit(c->s, &au, 1));
    /* a transition outside the table is refused before it reaches the store */
    au.to = OBX__ST_PUBLISHED;
    assert_int_equal(obx__st_insert_audit(c->s, &au, 1), OBX_EINTERNAL);
    OK(obx__st_commit(c->s));
    obx__audit_row *aa;
    OK(c->s->m->load_audit(c->s, a, &aa, &n));
    assert_int_equal(n, 2); /* the producer's row and ours */
    assert_int_equal(aa[0].to, OBX__ST_PENDING);
    assert_int_equal(aa[1].actor, OBX__ACT_DISPATCHER);
    assert_string_equal(aa[1].who, "relay-1");
    free(aa);
    audit_batch(c, a, &au);
    OK(obx__st_begin(c->s));
    OK(obx__st_counter_add(c->s, "alarms", 2));
    OK(obx__st_counter_add(c->s, "alarms", 3));
    OK(obx__st_commit(c->s));
    int64_t v;
    OK(c->s->m->read->counter_get(c->s, "alarms", &v));
    assert_int_equal(v, 5);
    OK(c->s->m->read->counter_get(c->s, "nothing", &v));
    assert_int_equal(v, 0);
}

static void test_selects_and_stats(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 1, NULL);
    char a[31], b[31], d[31], e[31];
    enq(c, "order.created.v1", "o-1", "corr-x", a);
    enq(c, "order.created.v1", "o-2", "corr-x", b);
    enq(c, "order.created.v1", "o-3", "corr-y", d);
    enq(c, "order.created.v1", "o-4", "", e);
    set_state(c, a, OBX__ST_CLAIMED, c->now + 10);
    set_state(c, a, OBX__ST_SENDING, c->now + 10);
    set_state(c, b, OBX__ST_CLAIMED, c->now + 10);
    set_state(c, b, OBX__ST_SENDING, c->now + 99);
    obx__event_row r = load1(c, d, 0);
    r.state = OBX__ST_DISPATCH_UNKNOWN;
    r.next_check_at = c->now + 50;
    r.unknown_since = c->now - 7;
    obx__event_update u = {&r, OBX__ST_PENDING, 0};
    bool ok;
    OK(obx__st_begin(c->s));
    OK(obx__st_update_events(c->s, &u, 1, &ok));
    OK(obx__st_commit(c->s));
    obx__select_req q = {.kind = OBX__SEL_EXPIRED_SENDING, .now = c->now + 10, .limit = 10};
    obx__rows rows = {0};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_SELECT, .select = &q}, &rows));
    assert_int_equal(rows.n, 1);
    assert_string_equal(rows.v[0].env.event_id, a);
    obx__rows_free(&rows);
    q.kind = OBX__SEL_RECONCILE;
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_SELECT, .select = &q}, &rows));
    assert_int_equal(rows.n, 0);
    obx__rows_free(&rows);
    q.now = c->now + 50;
    q.payload = true;
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_SELECT, .select = &q}, &rows));
    assert_int_equal(rows.n, 1);
    assert_string_equal(rows.v[0].env.event_id, d);
    assert_int_equal(rows.v[0].payload_len, 7);
    assert_memory_equal(rows.v[0].payload, "{\"x\":1}", 7);
    obx__rows_free(&rows);
    q.kind = OBX__SEL_STATE;
    q.state = OBX__ST_PENDING;
    q.payload = false;
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_SELECT, .select = &q}, &rows));
    assert_int_equal(rows.n, 1);
    assert_string_equal(rows.v[0].env.event_id, e);
    obx__rows_free(&rows);
    obx__store_stats st;
    OK(c->s->m->read->stats(c->s, &st));
    assert_int_equal(st.by_state[OBX__ST_SENDING], 2);
    assert_int_equal(st.by_state[OBX__ST_DISPATCH_UNKNOWN], 1);
    assert_int_equal(st.by_state[OBX__ST_PENDING], 1);
    assert_int_equal(st.oldest_pending_committed_at, c->now);
    assert_int_equal(st.oldest_unknown_since, c->now - 7);
    /* by correlation: oldest first, whole rows, at most limit */
    obx__read_req corr = {.by = OBX__READ_CORRELATION, .correlation_id = "corr-x", .limit = 10};
    OK(obx__st_read_events(c->s, &corr, &rows));
    assert_int_equal(rows.n, 2);
    assert_string_equal(rows.v[0].env.event_id, a);
    assert_string_equal(rows.v[1].env.event_id, b);
    assert_string_equal(rows.v[1].env.correlation_id, "corr-x");
    assert_null(rows.v[0].payload);
    obx__rows_free(&rows);
    corr.limit = 1;
    OK(obx__st_read_events(c->s, &corr, &rows));
    assert_int_equal(rows.n, 1);
    assert_string_equal(rows.v[0].env.event_id, a);
    obx__rows_free(&rows);
    corr.limit = 0; /* refused by the wrapper, nothing read */
    assert_int_equal(obx__st_read_events(c->s, &corr, &rows), OBX_EINTERNAL);
    assert_int_equal(rows.n, 0);
}

/* ---- delivery sets, selections, receipt details, alias hand-over ---- */

static void test_delivery_sets(void **state) {
    cx *c = *state;
    /* a route generation's delivery set is stored with it and read back in target order */
    obx_route_target t[] = {{.cluster = "eu", .topic = "orders-eu", .routing_key = "{tenant}"},
                            {.cluster = "local", .topic = "audit", .algorithm = "none"}};
    obx_route r = {.event_type = "order.created.v1",
                   .cluster = "local",
                   .topic = "orders",
                   .targets = t,
                   .n_targets = 2,
                   .completion = "any"};
    int64_t gen = 0;
    OK(obx__route_set_at(c->s, &r, c->now, &gen));
    obx__route_row rr;
    OK(c->s->m->route_get(c->s, "order.created.v1", &rr));
    assert_int_equal(rr.targets, 3);
    obx__route_set_row rs;
    OK(c->s->m->route_set_get(c->s, gen, &rs));
    assert_string_equal(rs.completion, "any");
    assert_int_equal(rs.n, 2);
    assert_int_equal(rs.t[0].target_no, 2);
    assert_string_equal(rs.t[0].cluster, "eu");
    assert_string_equal(rs.t[0].routing_key, "{tenant}");
    assert_string_equal(rs.t[0].algorithm, "murmur2"); /* the route's */
    assert_string_equal(rs.t[1].algorithm, "none");
    assert_int_equal(c->s->m->route_set_get(c->s, gen + 100, &rs), OBX_ENOTFOUND);
    char *js = NULL;
    OK(obx_route_list(c->s, 0, &js));
    assert_non_null(strstr(js, "\"delivery_set\""));
    assert_non_null(strstr(js, "orders-eu"));
    obx_free(js);
    /* an enqueue makes one slot per target, in one transaction */
    obx_event ev = {.event_type = "order.created.v1",
                    .aggregate_type = "order",
                    .aggregate_id = "o-1",
                    .aggregate_version = 1,
                    .tenant = "t1",
                    .payload = "{\"x\":1}",
                    .payload_len = 7,
                    .idempotency_key = "k-1"};
    obx_enqueue_result er;
    OK(obx__enqueue_at(c->s, &ev, c->now, NULL, &er));
    obx__delivery_row d;
    OK(c->s->m->delivery_get(c->s, er.event_id, &d));
    assert_int_equal(d.n, 3);
    assert_string_equal(d.event_id, er.event_id);
    assert_string_equal(d.completion, "any");
    assert_int_equal(d.route_gen, gen);
    assert_string_equal(d.t[0].slot_id, er.event_id);
    assert_string_equal(d.t[2].origin, "enqueue");
    obx__delivery_row d2;
    OK(c->s->m->delivery_get(c->s, d.t[2].slot_id, &d2)); /* by a slot, the same set */
    assert_string_equal(d2.event_id, er.event_id);
    assert_int_equal(d2.n, 3);
    obx__event_row s2 = load1(c, d.t[1].slot_id, OBX__LOAD_PAYLOAD), s1 = load1(c, er.event_id, 0);
    assert_string_equal(s2.logical_id, er.event_id);
    assert_int_equal(s2.target_no, 2);
    assert_string_equal(s1.logical_id, er.event_id);
    assert_int_equal(s1.target_no, 1);
    assert_string_equal(s2.dest.cluster, "eu");
    assert_string_equal(s2.dest.routing_key, "t1");
    assert_string_equal(s2.env.idempotency_key, "k-1"); /* the event's envelope ... */
    assert_string_equal(s2.envelope_digest, s1.envelope_digest);
    /* ... but the key names the event once: a retry finds the event, not a slot */
    obx_enqueue_result again;
    OK(obx__enqueue_at(c->s, &ev, c->now, NULL, &again));
    assert_true(again.existing);
    assert_string_equal(again.event_id, er.event_id);
    OK(c->s->m->delivery_get(c->s, er.event_id, &d));
    assert_int_equal(d.n, 3);
    /* a plain event is in no set */
    route(c, "order.paid.v1", "paid", 0, NULL);
    char p[31];
    enq(c, "order.paid.v1", "o-2", "", p);
    assert_int_equal(c->s->m->delivery_get(c->s, p, &d2), OBX_ENOTFOUND);
    obx__event_row rp = load1(c, p, 0);
    assert_int_equal(rp.target_no, 0);
    assert_string_equal(obx__wire_id(&rp), p);
    /* statistics: complete under the rule ("any": one slot published) */
    int64_t sets = 0, complete = 0;
    OK(c->s->m->read->delivery_stats(c->s, &sets, &complete));
    assert_int_equal(sets, 1);
    assert_int_equal(complete, 0);
    set_state(c, d.t[2].slot_id, OBX__ST_CLAIMED, c->now + 10);
    set_state(c, d.t[2].slot_id, OBX__ST_SENDING, c->now + 10);
    set_state(c, d.t[2].slot_id, OBX__ST_PUBLISHED, 0);
    OK(c->s->m->read->delivery_stats(c->s, &sets, &complete));
    assert_int_equal(complete, 1);
    /* delivery_put: a further target; a taken number is a conflict, and nothing of it stays.
     * The set row is written once: a later put does not change its rule (whether a put may
     * name another rule is the engine's decision, test_add_target_is_a_migration) */
    obx__delivery_row add = {.completion = "any", .created_at = c->now, .n = 1};
    strcpy(add.event_id, er.event_id);
    add.t[0] = (obx__delivery_target_row){.target_no = 4, .created_at = c->now};
    strcpy(add.t[0].slot_id, p);
    strcpy(add.t[0].origin, "migration");
    obx__delivery_row bad = add;
    strcpy(bad.completion, "all");
    OK(obx__st_begin(c->s));
    OK(obx__st_delivery_put(c->s, &bad));
    OK(c->s->m->delivery_get(c->s, er.event_id, &d));
    assert_string_equal(d.completion, "any");
    assert_int_equal(d.n, 4);
    OK(obx__st_rollback(c->s));
    bad = add;
    bad.t[0].target_no = 2;
    OK(obx__st_begin(c->s));
    assert_int_equal(obx__st_delivery_put(c->s, &bad), OBX_ECONFLICT);
    OK(obx__st_rollback(c->s));
    OK(c->s->m->delivery_get(c->s, er.event_id, &d));
    assert_int_equal(d.n, 3);
    OK(obx__st_begin(c->s));
    OK(obx__st_delivery_put(c->s, &add));
    OK(obx__st_commit(c->s));
    OK(c->s->m->delivery_get(c->s, er.event_id, &d));
    assert_int_equal(d.n, 4);
    assert_string_equal(d.t[3].origin, "migration");
    obx__event_row rp2 = load1(c, p, 0);
    assert_string_equal(obx__wire_id(&rp2), er.event_id); /* now a slot of that event */
    assert_int_equal(rp2.target_no, 4);
}

static void test_find_details_alias(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, "legacy");
    route(c, "order.paid.v1", "paid", 0, NULL);
    char a[31], b[31], d[31], e[31];
    enq(c, "order.created.v1", "o-1", "", a);
    c->now += 10;
    enq(c, "order.created.v1", "o-2", "", b);
    enq(c, "order.paid.v1", "o-3", "", d);
    c->now += 10;
    enq(c, "order.paid.v1", "o-4", "", e);
    set_state(c, b, OBX__ST_CLAIMED, c->now + 100);
    /* each criterion, and paging */
    obx__rows rows = {0};
    obx__event_filter f = {.event_type = "order.created.v1"};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows));
    assert_int_equal(rows.n, 2);
    assert_string_equal(rows.v[0].env.event_id, a);
    obx__rows_free(&rows);
    const char *al[] = {"obx", "nobody"};
    f = (obx__event_filter){.aliases = al, .n_aliases = 2};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows));
    assert_int_equal(rows.n, 2);
    assert_string_equal(rows.v[1].env.event_id, e);
    obx__rows_free(&rows);
    obx__state st[] = {OBX__ST_CLAIMED, OBX__ST_SENDING};
    f = (obx__event_filter){.states = st, .n_states = 2};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows));
    assert_int_equal(rows.n, 1);
    assert_string_equal(rows.v[0].env.event_id, b);
    obx__rows_free(&rows);
    f = (obx__event_filter){.cluster = "local", .topic = "paid"};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows));
    assert_int_equal(rows.n, 2);
    obx__rows_free(&rows);
    f = (obx__event_filter){.committed_from = c->now - 10, .committed_to = c->now};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows));
    assert_int_equal(rows.n, 2); /* b and d */
    obx__rows_free(&rows);
    f = (obx__event_filter){.limit = 3};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows));
    assert_int_equal(rows.n, 3);
    f.after_seq = rows.v[2].seq;
    obx__rows_free(&rows);
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows));
    assert_int_equal(rows.n, 1);
    assert_string_equal(rows.v[0].env.event_id, e);
    obx__rows_free(&rows);
    /* receipt details: the JSON text of each receipt of a kind, oldest first */
    obx__receipt_row rc[2];
    memset(rc, 0, sizeof rc);
    for (int i = 0; i < 2; i++) {
        strcpy(rc[i].event_id, a);
        rc[i].envelope_gen = 2 + i;
        rc[i].kind = OBX__RK_MIGRATION;
        strcpy(rc[i].cluster, "local");
        strcpy(rc[i].topic, "orders-v2");
        rc[i].partition = -1;
        rc[i].offset = -1;
        rc[i].detail = i ? "{\"n\":2}" : "{\"n\":1}";
        rc[i].created_at = c->now;
    }
    OK(obx__st_begin(c->s));
    OK(obx__st_insert_receipts(c->s, rc, 2));
    OK(obx__st_commit(c->s));
    char **det;
    size_t nd;
    OK(c->s->m->read->receipt_details(c->s, a, OBX__RK_MIGRATION, &det, &nd));
    assert_int_equal(nd, 2);
    assert_string_equal(det[0], "{\"n\":1}");
    assert_string_equal(det[1], "{\"n\":2}");
    for (size_t i = 0; i < nd; i++) free(det[i]);
    free(det);
    OK(c->s->m->read->receipt_details(c->s, a, OBX__RK_PRIMARY, &det, &nd));
    assert_int_equal(nd, 0);
    free(det);
    /* alias hand-over: only unclaimed events of the expected owner change */
    const char *ids[] = {a, b, d};
    bool applied[3];
    OK(obx__st_begin(c->s));
    OK(obx__st_set_alias(c->s, ids, 3, "legacy", "obx", applied));
    OK(obx__st_commit(c->s));
    assert_true(applied[0]);
    assert_false(applied[1]); /* CLAIMED: in a relay's hands */
    assert_false(applied[2]); /* another owner */
    assert_string_equal(load1(c, a, 0).alias, "obx");
    assert_string_equal(load1(c, b, 0).alias, "legacy");
}

/* An unordered consumer's kept copies (obx_inbox_retry): the first copy of an event stays, the
 * list gives those due by a time (the failure row's next_at, a copy without one at once) with
 * their bytes, earliest first, and a copy is deleted by its event. */
static void test_retry_copies(void **state) {
    cx *c = *state;
    const char *a = "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3A", *b = "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3B";
    obx__retry_copy_row r;
    memset(&r, 0, sizeof r);
    strcpy(r.consumer_id, "projection");
    strcpy(r.event_id, a);
    strcpy(r.payload_digest, "sha256:aaaa");
    strcpy(r.topic, "orders");
    r.partition = 1;
    r.offset = 7;
    r.headers_json = "{\"event_id\":\"a\"}";
    r.payload = (unsigned char *)"a\0c";
    r.payload_len = 3;
    r.kept_at = c->now;
    OK(c->s->m->inbox->retry_copy_put(c->s, &r));
    r.payload = (unsigned char *)"zzz"; /* a second copy of the event: the first one stays */
    OK(c->s->m->inbox->retry_copy_put(c->s, &r));
    strcpy(r.event_id, b);
    r.payload = (unsigned char *)"bbb";
    OK(c->s->m->inbox->retry_copy_put(c->s, &r));
    int32_t f = 0;
    OK(c->s->m->inbox->failure_bump(c->s, "projection", a, "boom", c->now, c->now + 5000, &f));
    OK(c->s->m->inbox->failure_bump(c->s, "projection", b, "boom", c->now, c->now + 1000, &f));
    obx__retry_copy_row *l = NULL;
    size_t n = 0;
    OK(c->s->m->inbox->retry_copy_list(c->s, "projection", c->now, 16, &l, &n));
    assert_int_equal(n, 0); /* neither due */
    obx__retry_copy_rows_free(l, n);
    OK(c->s->m->inbox->retry_copy_list(c->s, "projection", c->now + 1000, 16, &l, &n));
    assert_int_equal(n, 1);
    assert_string_equal(l[0].event_id, b);
    assert_int_equal(l[0].due_at, c->now + 1000);
    obx__retry_copy_rows_free(l, n);
    OK(c->s->m->inbox->retry_copy_list(c->s, "projection", INT64_MAX, 16, &l, &n));
    assert_int_equal(n, 2);
    assert_string_equal(l[1].event_id, a); /* earliest first */
    assert_int_equal(l[1].payload_len, 3);
    assert_memory_equal(l[1].payload, "a\0c", 3);
    assert_string_equal(l[1].payload_digest, "sha256:aaaa");
    assert_string_equal(l[1].headers_json, "{\"event_id\":\"a\"}");
    assert_string_equal(l[1].topic, "orders");
    assert_int_equal(l[1].partition, 1);
    assert_int_equal(l[1].offset, 7);
    assert_int_equal(l[1].kept_at, c->now);
    obx__retry_copy_rows_free(l, n);
    OK(c->s->m->inbox->failure_clear(c->s, "projection", a)); /* no failure row: due at once */
    OK(c->s->m->inbox->retry_copy_list(c->s, "projection", c->now, 1, &l, &n));
    assert_int_equal(n, 1);
    assert_string_equal(l[0].event_id, a);
    assert_int_equal(l[0].due_at, 0);
    obx__retry_copy_rows_free(l, n);
    OK(c->s->m->inbox->retry_copy_del(c->s, "projection", a));
    OK(c->s->m->inbox->retry_copy_list(c->s, "projection", INT64_MAX, 16, &l, &n));
    assert_int_equal(n, 1);
    assert_string_equal(l[0].event_id, b);
    obx__retry_copy_rows_free(l, n);
    OK(c->s->m->inbox->retry_copy_list(c->s, "nobody", INT64_MAX, 16, &l, &n));
    assert_int_equal(n, 0);
    obx__retry_copy_rows_free(l, n);
}

static void test_inbox_tables(void **state) {
    cx *c = *state;
    obx__inbox_row r, got;
    memset(&r, 0, sizeof r);
    strcpy(r.consumer_id, "projection");
    strcpy(r.event_id, "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G");
    strcpy(r.payload_digest,
           "sha256:1111111111111111111111111111111111111111111111111111111111111111");
    strcpy(r.event_type, "order.created.v1");
    strcpy(r.tenant, "t1");
    strcpy(r.outcome, "APPLIED");
    strcpy(r.result, "order o-1 projected");
    strcpy(r.topic, "orders");
    r.partition = 2;
    r.offset = 9;
    r.consumed_at = c->now;
    r.duration_us = 120;
    assert_int_equal(c->s->m->inbox->inbox_get(c->s, "projection", r.event_id, &got),
                     OBX_ENOTFOUND);
    OK(obx__st_begin(c->s));
    OK(c->s->m->inbox->inbox_put(c->s, &r));
    OK(obx__st_commit(c->s));
    OK(obx__st_begin(c->s));
    assert_int_equal(c->s->m->inbox->inbox_put(c->s, &r),
                     OBX_ECONFLICT); /* unique (consumer, event) */
    OK(obx__st_rollback(c->s));
    OK(c->s->m->inbox->inbox_get(c->s, "projection", r.event_id, &got));
    assert_string_equal(got.result, "order o-1 projected");
    assert_int_equal(got.offset, 9);
    /* the handler's result and run time, written into the claimed receipt */
    OK(c->s->m->inbox->inbox_finish(c->s, "projection", r.event_id, "finished", 77));
    OK(c->s->m->inbox->inbox_get(c->s, "projection", r.event_id, &got));
    assert_string_equal(got.result, "finished");
    assert_int_equal(got.duration_us, 77);
    assert_int_equal(got.envelope_gen, 0); /* no evidence columns given: not evidence */
    assert_string_equal(got.attempt_id, "");
    /* the columns that make a consume receipt evidence round-trip */
    obx__inbox_row ev = r;
    strcpy(ev.event_id, "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3J");
    ev.envelope_gen = 2;
    strcpy(ev.attempt_id, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3K");
    strcpy(ev.dest_digest,
           "sha256:2222222222222222222222222222222222222222222222222222222222222222");
    OK(c->s->m->inbox->inbox_put(c->s, &ev));
    OK(c->s->m->inbox->inbox_get(c->s, "projection", ev.event_id, &got));
    assert_int_equal(got.envelope_gen, 2);
    assert_string_equal(got.attempt_id, ev.attempt_id);
    assert_string_equal(got.dest_digest, ev.dest_digest);
    const char *ids[] = {r.event_id, "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3H"};
    obx__inbox_key by_id[] = {{.event_id = ids[0]}, {.event_id = ids[1]}};
    bool present[5];
    OK(c->s->m->inbox->inbox_has(c->s, "projection", by_id, 2, present));
    assert_true(present[0]);
    assert_false(present[1]);
    OK(c->s->m->inbox->inbox_has(c->s, "other", by_id, 1, present));
    assert_false(present[0]);
    /* retention's evidence: the row counts only for the frozen payload digest, envelope
     * generation and destination it records, and not once the inbox quarantined the ID */
    const char *other_digest =
        "sha256:3333333333333333333333333333333333333333333333333333333333333333";
    obx__inbox_key strict[] = {
        {ev.event_id, ev.payload_digest, 2, ev.dest_digest},   /* the bytes obx froze */
        {ev.event_id, other_digest, 2, ev.dest_digest},        /* a corrupt copy's row */
        {ev.event_id, ev.payload_digest, 1, ev.dest_digest},   /* another generation */
        {ev.event_id, ev.payload_digest, 2, r.payload_digest}, /* another destination */
        {r.event_id, r.payload_digest, 0, ""}};                /* a row without evidence */
    OK(c->s->m->inbox->inbox_has(c->s, "projection", strict, 5, present));
    assert_true(present[0]);
    assert_false(present[1]);
    assert_false(present[2]);
    assert_false(present[3]);
    assert_false(present[4]);
    OK(obx__st_begin(c->s));
    OK(c->s->m->inbox->inbox_quarantine_put(c->s, "projection", ev.event_id, other_digest,
                                            ev.payload_digest, "another body", c->now));
    OK(obx__st_commit(c->s));
    OK(c->s->m->inbox->inbox_has(c->s, "projection", strict, 1, present));
    assert_false(present[0]); /* the quarantine alarm is open */
    OK(c->s->m->inbox->inbox_has(c->s, "projection", by_id, 1, present));
    assert_true(present[0]); /* by ID alone (lag) it still counts */

    obx__watermark_row w = {.partition = 2, .offset = 9, .occurred_at = 5, .committed_at = 6};
    strcpy(w.consumer_id, "projection");
    strcpy(w.topic, "orders");
    strcpy(w.event_id, r.event_id);
    OK(c->s->m->inbox->watermark_put(c->s, &w));
    w.offset = 4; /* an older position never moves the watermark back */
    OK(c->s->m->inbox->watermark_put(c->s, &w));
    obx__watermark_row *wl;
    size_t n;
    OK(c->s->m->inbox->watermark_list(c->s, "projection", &wl, &n));
    assert_int_equal(n, 1);
    assert_int_equal(wl[0].offset, 9);
    assert_string_equal(wl[0].event_id, r.event_id);
    free(wl);
    OK(c->s->m->inbox->watermark_list(c->s, NULL, &wl, &n));
    assert_int_equal(n, 1);
    free(wl);

    int32_t f = 0;
    OK(c->s->m->inbox->failure_bump(c->s, "projection", ids[1], "boom", c->now, c->now, &f));
    assert_int_equal(f, 1);
    OK(c->s->m->inbox->failure_bump(c->s, "projection", ids[1], "boom again", c->now, c->now, &f));
    assert_int_equal(f, 2);
    OK(c->s->m->inbox->failure_clear(c->s, "projection", ids[1]));
    OK(c->s->m->inbox->failure_bump(c->s, "projection", ids[1], "boom", c->now, c->now, &f));
    assert_int_equal(f, 1);

    obx__poison_row p;
    memset(&p, 0, sizeof p);
    strcpy(p.consumer_id, "projection");
    strcpy(p.event_id, ids[1]);
    strcpy(p.state, "PARKED");
    p.failures = 5;
    strcpy(p.last_error, "handler failed 5 times");
    strcpy(p.topic, "orders");
    p.offset = 10;
    p.headers_json = "{\"obx-event-id\":\"x\"}";
    p.payload = (unsigned char *)"abc";
    p.payload_len = 3;
    p.parked_at = c->now;
    p.updated_at = c->now;
    OK(c->s->m->inbox->poison_put(c->s, &p));
    obx__poison_row *pl;
    OK(c->s->m->inbox->poison_list(c->s, NULL, "PARKED", &pl, &n));
    assert_int_equal(n, 1);
    assert_int_equal(pl[0].failures, 5);
    assert_null(pl[0].payload);
    assert_string_equal(pl[0].headers_json, "{\"obx-event-id\":\"x\"}");
    obx__poison_rows_free(pl, n);
    obx__poison_row pg;
    OK(c->s->m->inbox->poison_get(c->s, "projection", ids[1], NULL, &pg));
    assert_int_equal(pg.payload_len, 3);
    assert_memory_equal(pg.payload, "abc", 3);
    free(pg.payload);
    free(pg.headers_json);
    /* another copy of the event (other bytes): its own row, keyed on its digest */
    strcpy(p.payload_digest, "sha256:other");
    p.payload = (unsigned char *)"abd";
    OK(c->s->m->inbox->poison_put(c->s, &p));
    OK(c->s->m->inbox->poison_list(c->s, NULL, "PARKED", &pl, &n));
    assert_int_equal(n, 2);
    obx__poison_rows_free(pl, n);
    OK(c->s->m->inbox->poison_get(c->s, "projection", ids[1], "sha256:other", &pg));
    assert_memory_equal(pg.payload, "abd", 3);
    assert_string_equal(pg.payload_digest, "sha256:other");
    free(pg.payload);
    free(pg.headers_json);
    assert_int_equal(c->s->m->inbox->poison_get(c->s, "projection", ids[1], "sha256:none", &pg),
                     OBX_ENOTFOUND);
    OK(c->s->m->inbox->poison_set_state(c->s, "projection", ids[1], "REDRIVE", c->now + 1));
    OK(c->s->m->inbox->poison_list(c->s, "projection", "PARKED", &pl, &n));
    assert_int_equal(n, 0); /* every copy */
    obx__poison_rows_free(pl, n);
    assert_int_equal(c->s->m->inbox->poison_set_state(c->s, "projection", ids[0], "DONE", 1),
                     OBX_ENOTFOUND);
    assert_int_equal(c->s->m->inbox->poison_get(c->s, "nobody", ids[1], NULL, &pg), OBX_ENOTFOUND);
    OK(c->s->m->inbox->inbox_quarantine_put(c->s, "projection", ids[0], r.payload_digest,
                                            r.payload_digest, "digest differs", c->now));
    obx__consume_audit_row ca = {.at = c->now, .duration_us = 5};
    strcpy(ca.consumer_id, "projection");
    strcpy(ca.event_id, ids[0]);
    strcpy(ca.outcome, "APPLIED");
    OK(c->s->m->inbox->consume_audit_put(c->s, &ca, 1));
}

/* ---- retention and audit methods (docs/retention.md)
 * --------------------------------------------- */

/* Moves an event to `st` behind the protocol's back (the store does not judge transitions: the
 * engine does), with the times the retention and audit queries look at. */
static obx__event_row put_state(cx *c, const char *id, obx__state st, int64_t published_at,
                                int64_t unknown_since, int64_t updated_at) {
    obx__event_row cur = load1(c, id, 0), next = cur;
    next.state = st;
    next.published_at = published_at;
    next.unknown_since = unknown_since;
    next.updated_at = updated_at;
    obx__event_update u = {&next, cur.state, cur.claim_gen};
    bool ok = false;
    OK(obx__st_update_events(c->s, &u, 1, &ok));
    assert_true(ok);
    return load1(c, id, 0);
}

static void candidates(cx *c, obx__state st, obx__pub_pos after, obx__pub_pos before, size_t limit,
                       bool lock, const char *want[], size_t n_want) {
    obx__rows rows = {0};
    obx__retention_req req = {
        .state = st, .after = after, .before = before, .limit = limit, .lock = lock};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_RETENTION, .retention = &req},
                           &rows));
    if (rows.n != n_want) fail_msg("candidates: %zu rows, want %zu", rows.n, n_want);
    for (size_t i = 0; i < n_want; i++) {
        assert_string_equal(rows.v[i].env.event_id, want[i]);
        assert_int_equal(rows.v[i].state, st);
        assert_null(rows.v[i].payload);
    }
    obx__rows_free(&rows);
}

static obx__aged_count aged(cx *c, obx__aged_kind k, int64_t until, const char *consumer,
                            int64_t after_at, int64_t after_key, size_t limit, const char *want[],
                            size_t n_want) {
    obx__aged_req req = {.kind = k,
                         .until = until,
                         .after_at = after_at,
                         .after_key = after_key,
                         .limit = limit,
                         .consumer = consumer,
                         .count = true};
    obx__aged_row *rows;
    size_t n;
    obx__aged_count cnt;
    OK(obx__st_aged(c->s, &req, &rows, &n, &cnt));
    if (n != n_want) fail_msg("aged %d: %zu rows, want %zu", (int)k, n, n_want);
    for (size_t i = 0; i < n; i++) assert_string_equal(rows[i].event_id, want[i]);
    for (size_t i = 1; i < n; i++)
        assert_true(rows[i - 1].at < rows[i].at ||
                    (rows[i - 1].at == rows[i].at && rows[i - 1].key < rows[i].key));
    free(rows);
    return cnt;
}

static void test_retention_audit_methods(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    char e[9][31];
    for (int i = 0; i < 9; i++) {
        char agg[16];
        snprintf(agg, sizeof agg, "o-%d", i);
        enq(c, "order.created.v1", agg, NULL, e[i]);
    }
    /* publication order is (published_at, seq): e0 and e1 share a millisecond */
    obx__event_row r0 = put_state(c, e[0], OBX__ST_PUBLISHED, 1000, 0, 1000);
    obx__event_row r1 = put_state(c, e[1], OBX__ST_PUBLISHED, 1000, 0, 1000);
    obx__event_row r2 = put_state(c, e[2], OBX__ST_PUBLISHED, 2000, 0, 2000);
    put_state(c, e[3], OBX__ST_RETAINED, 1500, 0, 1500);
    put_state(c, e[4], OBX__ST_PUBLISHED, 3000, 0, 3000);
    /* e5 stays PENDING (committed at c->now) */
    put_state(c, e[6], OBX__ST_DISPATCH_UNKNOWN, 0, 500, 600);
    put_state(c, e[7], OBX__ST_RECONCILING, 0, 0, 700); /* no unknown_since: updated_at */
    put_state(c, e[8], OBX__ST_PARKED, 0, 0, 900);
    assert_true(r0.seq < r1.seq);

    /* retention candidates: order, exclusive bounds, limit, state, locking in a transaction */
    const char *pub_all[] = {e[0], e[1], e[2], e[4]};
    candidates(c, OBX__ST_PUBLISHED, OBX__PUB_POS_MIN, OBX__PUB_POS_MAX, 10, false, pub_all, 4);
    candidates(c, OBX__ST_PUBLISHED, (obx__pub_pos){1000, r0.seq}, OBX__PUB_POS_MAX, 10, false,
               pub_all + 1, 3);
    candidates(c, OBX__ST_PUBLISHED, OBX__PUB_POS_MIN, (obx__pub_pos){2000, r2.seq}, 10, false,
               pub_all, 2);
    candidates(c, OBX__ST_PUBLISHED, OBX__PUB_POS_MIN, (obx__pub_pos){1000, INT64_MAX}, 10, false,
               pub_all, 2);
    candidates(c, OBX__ST_PUBLISHED, OBX__PUB_POS_MIN, OBX__PUB_POS_MAX, 2, false, pub_all, 2);
    const char *ret[] = {e[3]};
    candidates(c, OBX__ST_RETAINED, OBX__PUB_POS_MIN, OBX__PUB_POS_MAX, 10, false, ret, 1);
    OK(obx__st_begin(c->s));
    candidates(c, OBX__ST_PUBLISHED, OBX__PUB_POS_MIN, OBX__PUB_POS_MAX, 3, true, pub_all, 3);
    OK(obx__st_commit(c->s));
    obx__rows none = {0};
    obx__retention_req bad = {.state = OBX__ST_PENDING, .limit = 1};
    assert_int_equal(
        obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_RETENTION, .retention = &bad},
                            &none),
        OBX_EINTERNAL);

    /* purge_payloads: payload -> NULL on every envelope generation, the rest is a tombstone */
    obx__event_row r3 = load1(c, e[3], OBX__LOAD_PAYLOAD);
    obx__event_row g2 = r3;
    g2.envelope_gen = 2;
    g2.env.envelope_gen = 2;
    OK(obx__st_begin(c->s));
    /* a new generation keeps the envelope (the PostgreSQL trigger refuses another payload) */
    obx__rows with_payload = {0};
    const char *id3 = e[3];
    OK(obx__st_load_events(c->s, &id3, 1, OBX__LOAD_PAYLOAD, &with_payload));
    assert_int_equal(with_payload.n, 1);
    OK(c->s->m->insert_envelope(c->s, &g2, with_payload.v[0].payload, r3.payload_len));
    obx__rows_free(&with_payload);
    OK(obx__st_commit(c->s));
    const char *purge_ids[] = {e[3], "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G"};
    int64_t bytes = -1;
    OK(obx__st_begin(c->s));
    OK(obx__st_purge_payloads(c->s, purge_ids, 2, &bytes));
    OK(obx__st_commit(c->s));
    assert_int_equal(bytes, 14); /* 7 bytes in each of two generations */
    OK(obx__st_purge_payloads(c->s, purge_ids, 1, &bytes));
    assert_int_equal(bytes, 0); /* nothing left to drop */
    obx__rows rows = {0};
    OK(obx__st_load_events(c->s, &purge_ids[0], 1, OBX__LOAD_PAYLOAD, &rows));
    assert_int_equal(rows.n, 1);
    assert_true(rows.v[0].payload_purged);
    assert_null(rows.v[0].payload);
    assert_string_equal(rows.v[0].envelope_digest, r3.envelope_digest);
    assert_string_equal(rows.v[0].env.payload_digest, r3.env.payload_digest);
    assert_string_equal(rows.v[0].dest_digest, r3.dest_digest);
    obx__rows_free(&rows);
    obx__event_row t3 = load1(c, e[3], 0);
    assert_true(t3.payload_purged);
    assert_int_equal(t3.payload_len, 7); /* the tombstone keeps the length */
    obx__event_row other = load1(c, e[4], OBX__LOAD_PAYLOAD);
    assert_false(other.payload_purged);

    /* aged: counts, the oldest, order, paging, the consumer filter */
    const char *pend[] = {e[5]};
    obx__aged_count k = aged(c, OBX__AGED_PENDING, c->now, NULL, INT64_MIN, INT64_MIN, 10, pend, 1);
    assert_int_equal(k.total, 1);
    assert_int_equal(k.oldest, c->now);
    k = aged(c, OBX__AGED_PENDING, c->now - 1, NULL, INT64_MIN, INT64_MIN, 10, NULL, 0);
    assert_int_equal(k.total, 0);
    assert_int_equal(k.oldest, 0);
    const char *pub_old[] = {e[0], e[1], e[2]};
    k = aged(c, OBX__AGED_PUBLISHED, 2000, NULL, INT64_MIN, INT64_MIN, 2, pub_old, 2);
    assert_int_equal(k.total, 3);
    assert_int_equal(k.oldest, 1000);
    aged(c, OBX__AGED_PUBLISHED, 2000, NULL, 1000, r1.seq, 2, pub_old + 2, 1);
    aged(c, OBX__AGED_PUBLISHED, 2000, NULL, 1000, r0.seq, 5, pub_old + 1, 2);
    const char *unk[] = {e[6], e[7]};
    k = aged(c, OBX__AGED_UNKNOWN, 650, NULL, INT64_MIN, INT64_MIN, 10, unk, 1);
    assert_int_equal(k.total, 1);
    assert_int_equal(k.oldest, 500);
    k = aged(c, OBX__AGED_UNKNOWN, 800, NULL, INT64_MIN, INT64_MIN, 10, unk, 2);
    assert_int_equal(k.total, 2);
    const char *parked[] = {e[8]};
    k = aged(c, OBX__AGED_PARKED, 900, NULL, INT64_MIN, INT64_MIN, 10, parked, 1);
    assert_int_equal(k.oldest, 900);
    aged(c, OBX__AGED_PARKED, 899, NULL, INT64_MIN, INT64_MIN, 10, NULL, 0);
    obx__receipt_row rc[2];
    memset(rc, 0, sizeof rc);
    for (int i = 0; i < 2; i++) {
        strcpy(rc[i].event_id, e[0]);
        rc[i].envelope_gen = 1;
        strcpy(rc[i].attempt_id, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G");
        strcpy(rc[i].cluster, "local");
        strcpy(rc[i].topic, "orders");
        strcpy(rc[i].payload_digest, r0.env.payload_digest);
        strcpy(rc[i].dest_digest, r0.dest_digest);
        rc[i].created_at = 100 + i;
    }
    rc[0].kind = OBX__RK_QUARANTINED;
    strcpy(rc[0].reason, "payload digest differs");
    rc[1].kind = OBX__RK_DUPLICATE;
    OK(obx__st_insert_receipts(c->s, rc, 2));
    const char *quar[] = {e[0]};
    k = aged(c, OBX__AGED_QUARANTINED, c->now, NULL, INT64_MIN, INT64_MIN, 10, quar, 1);
    assert_int_equal(k.total, 1);
    assert_int_equal(k.oldest, 100);
    OK(c->s->m->inbox->inbox_quarantine_put(c->s, "projection", e[1], r1.env.payload_digest,
                                            r1.env.payload_digest, "digest differs", 50));
    OK(c->s->m->inbox->inbox_quarantine_put(c->s, "other", e[2], r2.env.payload_digest,
                                            r2.env.payload_digest, "digest differs", 40));
    const char *iq[] = {e[1]};
    k = aged(c, OBX__AGED_INBOX_QUARANTINED, c->now, "projection", INT64_MIN, INT64_MIN, 10, iq, 1);
    assert_int_equal(k.total, 1);
    assert_int_equal(k.oldest, 50);
    /* only the count */
    obx__aged_req only = {.kind = OBX__AGED_PUBLISHED, .until = c->now, .count = true};
    obx__aged_row *none_rows;
    size_t nn;
    OK(obx__st_aged(c->s, &only, &none_rows, &nn, &k));
    assert_int_equal(nn, 0);
    assert_null(none_rows);
    assert_int_equal(k.total, 4);

    /* read by IDs: in the order asked, an ID the outbox never committed left out */
    const char *ids[] = {e[8], "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G", e[0]};
    obx__rows known = {0};
    OK(obx__st_load_events(c->s, ids, 3, 0, &known));
    assert_int_equal(known.n, 2);
    assert_string_equal(known.v[0].env.event_id, e[8]);
    assert_string_equal(known.v[1].env.event_id, e[0]);
    obx__rows_free(&known);
}

/* Read model version 2: envelope_at reads any generation's frozen envelope (the current one or
 * an older one a migration replaced), tells a missing generation or event from an error, and
 * keeps the digests after the payload is purged. */
static void test_envelope_at(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    char e[31];
    enq(c, "order.created.v1", "o-1", NULL, e);
    obx__rows rows = {0};
    const char *id = e;
    OK(obx__st_load_events(c->s, &id, 1, OBX__LOAD_PAYLOAD, &rows));
    assert_int_equal(rows.n, 1);
    obx__event_row g1 = rows.v[0], g2 = rows.v[0];
    g2.envelope_gen = g2.env.envelope_gen = 2;
    strcpy(g2.dest.topic, "orders-v2");
    g2.dest.route_gen = g1.dest.route_gen + 1;
    OK(obx__dest_digest(&g2.dest, g2.dest_digest));
    assert_string_not_equal(g2.dest_digest, g1.dest_digest);
    OK(obx__st_begin(c->s));
    OK(c->s->m->insert_envelope(c->s, &g2, g1.payload, g1.payload_len));
    OK(obx__st_commit(c->s));
    obx__rows_free(&rows);
    const obx__event_row *want[] = {&g1, &g2};
    for (int pass = 0; pass < 2; pass++) { /* before and after the payload purge */
        for (int32_t gen = 1; gen <= 2; gen++) {
            const obx__event_row *w = want[gen - 1];
            obx__envelope_at_row v;
            memset(&v, 0x5a, sizeof v);
            OK(obx__st_envelope_at(c->s, e, gen, &v));
            assert_string_equal(v.dest.cluster, "local");
            assert_string_equal(v.dest.topic, w->dest.topic);
            assert_string_equal(v.dest.routing_key, w->dest.routing_key);
            assert_string_equal(v.dest.algorithm, w->dest.algorithm);
            assert_int_equal(v.dest.route_gen, w->dest.route_gen);
            assert_string_equal(v.dest.serializer, w->dest.serializer);
            assert_string_equal(v.dest.durability, w->dest.durability);
            assert_string_equal(v.dest.required_acks, w->dest.required_acks);
            assert_string_equal(v.dest_digest, w->dest_digest);
            assert_string_equal(v.payload_digest, g1.env.payload_digest);
            assert_string_equal(v.envelope_digest, w->envelope_digest);
        }
        obx__envelope_at_row v;
        assert_int_equal(obx__st_envelope_at(c->s, e, 3, &v), OBX_ENOTFOUND);
        assert_int_equal(obx__st_envelope_at(c->s, "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G", 1, &v),
                         OBX_ENOTFOUND);
        int64_t bytes = 0;
        OK(obx__st_begin(c->s));
        OK(obx__st_purge_payloads(c->s, &id, 1, &bytes));
        OK(obx__st_commit(c->s));
    }
    /* the event's current generation is still the first: envelope_at reads, never moves it */
    obx__event_row now = load1(c, e, 0);
    assert_int_equal(now.envelope_gen, 1);
    assert_string_equal(now.dest.topic, "orders");
}

/* The operations queries (metrics, dashboard, trace): receipts by kind newest first, the newest
 * PUBLISHED events with their frozen topic, and the consume audit as a cursor, as the newest
 * rows and by event. */
/* Schema version 4: the cluster registry, receipt sources, and held events (the held_at
 * marker, its statistics and its selector). */
static void test_unknown_ends_columns(void **state) {
    cx *c = *state;
    obx__cluster_row got;
    assert_int_equal(obx__st_cluster_get(c->s, "kafka-eu", &got), OBX_ENOTFOUND);
    obx__cluster_row k = obx_t_cluster("kafka-eu", "kafka", "persistent", "all", "relay-1", c->now);
    OK(obx__st_cluster_put(c->s, &k));
    strcpy(k.relay, "relay-2"); /* registered again: replaced */
    k.seen_at = c->now + 5;
    OK(obx__st_cluster_put(c->s, &k));
    OK(obx__st_cluster_get(c->s, "kafka-eu", &got));
    assert_string_equal(got.backend, "kafka");
    assert_string_equal(got.lookup, "authoritative");
    assert_string_equal(got.required_acks, "all");
    assert_string_equal(got.serializer, "*");
    assert_string_equal(got.relay, "relay-2");
    assert_int_equal(got.seen_at, c->now + 5);

    route(c, "order.created.v1", "orders", 0, NULL);
    char a[31], b[31];
    enq(c, "order.created.v1", "o-1", "", a);
    enq(c, "order.created.v1", "o-2", "", b);
    /* a receipt keeps its source */
    obx__receipt_row rc = obx_t_receipt(a, "att-x", OBX__RK_DUPLICATE, c->now);
    rc.source = OBX__RS_CONSUMER;
    strcpy(rc.payload_digest, "sha256:x");
    strcpy(rc.dest_digest, "sha256:y");
    OK(obx__st_insert_receipts(c->s, &rc, 1));
    obx__receipt_row *rr;
    size_t n;
    OK(c->s->m->load_receipts(c->s, a, &rr, &n));
    assert_int_equal(n, 1);
    assert_int_equal(rr[0].source, OBX__RS_CONSUMER);
    free(rr);
    /* held: set and cleared through the compare-and-set update, counted, selectable */
    obx__event_row cur = load1(c, b, 0), next = cur;
    next.state = OBX__ST_DISPATCH_UNKNOWN;
    next.unknown_since = c->now;
    next.held_at = c->now + 7;
    obx__event_update u = {&next, cur.state, cur.claim_gen};
    bool ok = false;
    OK(obx__st_update_events(c->s, &u, 1, &ok));
    assert_true(ok);
    assert_int_equal(load1(c, b, 0).held_at, c->now + 7);
    obx__store_stats st;
    OK(c->s->m->read->stats(c->s, &st));
    assert_int_equal(st.held, 1);
    assert_int_equal(st.oldest_held, c->now + 7);
    obx__event_filter f = {.held = true};
    obx__rows rows = {0};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows));
    assert_int_equal(rows.n, 1);
    assert_string_equal(rows.v[0].env.event_id, b);
    obx__rows_free(&rows);
    obx__event_filter old = {.unknown_before = c->now + 1};
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &old}, &rows));
    assert_int_equal(rows.n, 1);
    obx__rows_free(&rows);
    old.unknown_before = c->now;
    OK(obx__st_read_events(c->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &old}, &rows));
    assert_int_equal(rows.n, 0);
    obx__rows_free(&rows);
    cur = next;
    next.held_at = 0;
    u = (obx__event_update){&next, cur.state, cur.claim_gen};
    OK(obx__st_update_events(c->s, &u, 1, &ok));
    assert_true(ok);
    OK(c->s->m->read->stats(c->s, &st));
    assert_int_equal(st.held, 0);
    assert_int_equal(st.oldest_held, 0);
}

static void test_ops_queries(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 1, NULL);
    route(c, "payment.done.v1", "payments", 1, NULL);
    char a[31], b[31], d[31];
    enq(c, "order.created.v1", "o-1", "", a);
    enq(c, "payment.done.v1", "p-1", "", b);
    enq(c, "order.created.v1", "o-2", "", d);
    const char *pub[] = {a, b};
    for (int i = 0; i < 2; i++) {
        c->now += 1000; /* b is published after a */
        set_state(c, pub[i], OBX__ST_CLAIMED, c->now + 10);
        set_state(c, pub[i], OBX__ST_SENDING, c->now + 10);
        set_state(c, pub[i], OBX__ST_PUBLISHED, 0);
    }
    obx__published_ref *pr;
    size_t n;
    OK(c->s->m->read->recent_published(c->s, 10, &pr, &n));
    assert_int_equal(n, 2); /* d is PENDING */
    assert_string_equal(pr[0].event_id, b);
    assert_string_equal(pr[0].topic, "payments");
    assert_string_equal(pr[1].event_id, a);
    assert_string_equal(pr[1].topic, "orders");
    assert_true(pr[0].published_at > pr[1].published_at);
    free(pr);
    OK(c->s->m->read->recent_published(c->s, 1, &pr, &n));
    assert_int_equal(n, 1);
    assert_string_equal(pr[0].event_id, b);
    free(pr);

    obx__receipt_row rc[3];
    const obx__receipt_kind kinds[3] = {OBX__RK_QUARANTINED, OBX__RK_DUPLICATE,
                                        OBX__RK_QUARANTINED};
    for (int i = 0; i < 3; i++) {
        memset(&rc[i], 0, sizeof rc[i]);
        strcpy(rc[i].event_id, i == 2 ? d : a);
        rc[i].envelope_gen = 1;
        snprintf(rc[i].attempt_id, sizeof rc[i].attempt_id, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3%c",
                 'A' + i);
        rc[i].kind = kinds[i];
        strcpy(rc[i].cluster, "local");
        strcpy(rc[i].topic, "orders");
        rc[i].offset = i;
        snprintf(rc[i].reason, sizeof rc[i].reason, "reason %d", i);
        rc[i].created_at = c->now + i;
    }
    OK(obx__st_begin(c->s));
    OK(obx__st_insert_receipts(c->s, rc, 3));
    OK(obx__st_commit(c->s));
    obx__receipt_row *rr;
    OK(c->s->m->read->receipts_by_kind(c->s, OBX__RK_QUARANTINED, 10, &rr, &n));
    assert_int_equal(n, 2);
    assert_string_equal(rr[0].event_id, d); /* newest first */
    assert_string_equal(rr[0].reason, "reason 2");
    assert_int_equal(rr[0].kind, OBX__RK_QUARANTINED);
    assert_string_equal(rr[1].event_id, a);
    free(rr);
    OK(c->s->m->read->receipts_by_kind(c->s, OBX__RK_DUPLICATE, 10, &rr, &n));
    assert_int_equal(n, 1);
    assert_string_equal(rr[0].reason, "reason 1");
    free(rr);
    OK(c->s->m->read->receipts_by_kind(c->s, OBX__RK_MIGRATION, 10, &rr, &n));
    assert_int_equal(n, 0);
    free(rr);
    OK(c->s->m->read->receipts_by_kind(c->s, OBX__RK_QUARANTINED, 1, &rr, &n));
    assert_int_equal(n, 1);
    free(rr);

    obx__consume_audit_row ca[4];
    const char *who[4] = {"projection", "billing", "projection", "projection"};
    const char *ev[4] = {a, a, b, a};
    const char *outcome[4] = {"FAILED", "APPLIED", "APPLIED", "DUPLICATE"};
    for (int i = 0; i < 4; i++) {
        memset(&ca[i], 0, sizeof ca[i]);
        ca[i].at = c->now + i;
        strcpy(ca[i].consumer_id, who[i]);
        strcpy(ca[i].event_id, ev[i]);
        strcpy(ca[i].outcome, outcome[i]);
        ca[i].duration_us = 100 * (i + 1);
    }
    OK(obx__st_begin(c->s));
    OK(c->s->m->inbox->consume_audit_put(c->s, ca, 4));
    OK(obx__st_commit(c->s));
    obx__consume_audit_row *cl;
    OK(c->s->m->inbox->consume_audit_list(c->s, "projection", NULL, -1, 1, &cl, &n));
    assert_int_equal(n, 1); /* the newest row of this consumer: where a cursor starts */
    assert_string_equal(cl[0].outcome, "DUPLICATE");
    int64_t newest = cl[0].id;
    free(cl);
    OK(c->s->m->inbox->consume_audit_list(c->s, NULL, NULL, 0, 10, &cl, &n));
    assert_int_equal(n, 4); /* a cursor from the start: oldest first, every consumer */
    assert_string_equal(cl[0].outcome, "FAILED");
    assert_int_equal(cl[0].duration_us, 100);
    assert_true(cl[0].id < cl[1].id && cl[1].id < cl[2].id && cl[2].id < cl[3].id);
    assert_int_equal(cl[3].id, newest);
    int64_t second = cl[1].id;
    free(cl);
    OK(c->s->m->inbox->consume_audit_list(c->s, "projection", NULL, second, 10, &cl, &n));
    assert_int_equal(n, 2); /* after the cursor, this consumer only */
    assert_string_equal(cl[0].event_id, b);
    assert_string_equal(cl[1].outcome, "DUPLICATE");
    free(cl);
    OK(c->s->m->inbox->consume_audit_list(c->s, "projection", NULL, newest, 10, &cl, &n));
    assert_int_equal(n, 0);
    free(cl);
    OK(c->s->m->inbox->consume_audit_list(c->s, NULL, a, 0, 10, &cl, &n));
    assert_int_equal(n, 3); /* one event's rows from every consumer, oldest first */
    assert_string_equal(cl[1].consumer_id, "billing");
    free(cl);
    OK(c->s->m->inbox->consume_audit_list(c->s, "projection", a, 0, 10, &cl, &n));
    assert_int_equal(n, 2);
    free(cl);
}

/* The dashboard's chart history: one row per slot (the first writer keeps it), the rows before
 * keep_from deleted, a window read oldest first and bounded. */
/* ---- the producer's methods and the write set (one path per operation, issue 47) ----------
 * The engine runs the same calls on every store; each backend carries out the contract of
 * store.h in its own way (PostgreSQL: one round trip; SQLite: its own statements). */

/* An event row as the engine builds it from the current route of type, under a new ID: a copy
 * of an enqueued event's, with created_txid and the envelope digest left to the store. */
static obx__event_row producer_row_of(cx *c, const char *type, const char *new_id) {
    char a[31];
    enq(c, type, "o-src", "", a);
    obx__event_row r = load1(c, a, 0);
    obx__route_row rr;
    OK(obx__st_route_get(c->s, type, &rr));
    obx__strlcpy(r.env.event_id, new_id, sizeof r.env.event_id);
    r.env.created_txid[0] = r.envelope_digest[0] = '\0';
    r.route_rel = rr.rel;
    return r;
}

static obx__audit_row producer_audit_of(const obx__event_row *r) {
    obx__audit_row a;
    memset(&a, 0, sizeof a);
    a.at = r->committed_at;
    a.actor = OBX__ACT_PRODUCER;
    strcpy(a.who, "producer");
    strcpy(a.event_id, r->env.event_id);
    a.envelope_gen = 1;
    a.from = OBX__ST_NONE;
    a.to = OBX__ST_PENDING;
    snprintf(a.reason, sizeof a.reason, OBX__PRODUCER_REASON, (long long)r->dest.route_gen);
    return a;
}

/* A producer's row on its host's clock (obx__event_row.at_server, obx_enqueue()), written at
 * server time t0 or later: a store with a server clock (PostgreSQL) writes its own now for
 * committed_at, updated_at and the producer's audit row, and the later of not_before and it for
 * available_at; one without (SQLite, read on the producer's host clock) the row's. The row's
 * times are c->now, weeks from the server's clock. */
static void check_at_server(cx *c, const obx__event_row *r, int64_t t0) {
    obx__event_row b = load1(c, r->env.event_id, 0);
    int64_t t1 = 0;
    obx__audit_row *au = NULL;
    size_t n = 0;
    OK(obx__st_load_audit(c->s, r->env.event_id, &au, &n));
    assert_int_equal(n, 1);
    if (!c->s->m->server_ms) {
        assert_int_equal(b.committed_at, r->committed_at);
        assert_int_equal(b.available_at, r->available_at);
        assert_int_equal(au[0].at, r->committed_at);
    } else {
        OK(c->s->m->server_ms(c->s, &t1));
        assert_true(b.committed_at >= t0 && b.committed_at <= t1);
        int64_t due = r->env.not_before > b.committed_at ? r->env.not_before : b.committed_at;
        assert_int_equal(b.available_at, due);
        assert_int_equal(au[0].at, b.committed_at);
    }
    assert_int_equal(b.updated_at, b.committed_at);
    free(au);
}

/* a server clock's now (0 without one) */
static int64_t server_now(cx *c) {
    int64_t t = 0;
    if (c->s->m->server_ms) OK(c->s->m->server_ms(c->s, &t));
    return t;
}

static size_t events_of(cx *c, const char *id) {
    obx__rows rows = {0};
    OK(obx__st_load_events(c->s, &id, 1, 0, &rows));
    size_t n = rows.n;
    obx__rows_free(&rows);
    return n;
}

static void test_producer_methods(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    obx__route_row rr;
    char txid[OBX_TEXT_MAX + 1] = "";
    /* route_get_txid: the route and a transaction identity */
    OK(obx__st_begin(c->s));
    OK(obx__st_route_get_txid(c->s, "order.created.v1", &rr, txid, sizeof txid));
    assert_string_equal(rr.topic, "orders");
    assert_true(txid[0] != '\0');
    assert_int_equal(obx__st_route_get_txid(c->s, "no.route.v1", &rr, txid, sizeof txid),
                     OBX_ENOROUTE);
    OK(obx__st_rollback(c->s));
    /* insert_event_audit: both rows; load_audit gives the audit row back as given */
    obx__event_row r = producer_row_of(c, "order.created.v1", "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F30");
    obx__strlcpy(r.env.created_txid, txid, sizeof r.env.created_txid);
    OK(obx__envelope_digest(&r.env, r.envelope_digest));
    obx__audit_row a = producer_audit_of(&r);
    OK(obx__st_begin(c->s));
    OK(obx__st_insert_event_audit(c->s, &r, "{\"x\":2}", 7, &a));
    OK(obx__st_commit(c->s));
    obx__audit_row *au = NULL;
    size_t n = 0;
    OK(obx__st_load_audit(c->s, r.env.event_id, &au, &n));
    assert_int_equal(n, 1);
    assert_int_equal(au[0].actor, OBX__ACT_PRODUCER);
    assert_int_equal(au[0].to, OBX__ST_PENDING);
    assert_string_equal(au[0].reason, a.reason);
    free(au);
    assert_string_equal(load1(c, r.env.event_id, 0).env.created_txid, txid);
    /* on the producer's host clock: the server's times, where the store has a server */
    obx__event_row h = producer_row_of(c, "order.created.v1", "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3A");
    h.at_server = true;
    obx__audit_row ha = producer_audit_of(&h);
    int64_t t0 = server_now(c);
    OK(obx__st_begin(c->s));
    OK(obx__st_route_get_txid(c->s, "order.created.v1", &rr, txid, sizeof txid));
    obx__strlcpy(h.env.created_txid, txid, sizeof h.env.created_txid);
    OK(obx__envelope_digest(&h.env, h.envelope_digest));
    OK(obx__st_insert_event_audit(c->s, &h, "{\"x\":2}", 7, &ha));
    OK(obx__st_commit(c->s));
    check_at_server(c, &h, t0);
    /* producer_body: a line, or nothing where the database has no SQL producer function */
    char body[256];
    OK(obx__st_producer_body(c->s, body, sizeof body));
}

static void test_enqueue_write(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    bool written = false;
    /* no transaction open: a transaction of its own; the store supplies created_txid and the
     * envelope digest over it */
    obx__event_row r = producer_row_of(c, "order.created.v1", "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F31");
    obx__audit_row a = producer_audit_of(&r);
    OK(obx__st_enqueue_write(c->s, &r, "{\"x\":2}", 7, &a, &written));
    assert_true(written);
    obx__event_row back = load1(c, r.env.event_id, 0);
    assert_true(back.env.created_txid[0] != '\0');
    char d[OBX_DIGEST_LEN + 1];
    OK(obx__envelope_digest(&back.env, d));
    assert_string_equal(back.envelope_digest, d);
    assert_string_equal(back.dest_digest, r.dest_digest);
    obx__audit_row *au = NULL;
    size_t n = 0;
    OK(obx__st_load_audit(c->s, r.env.event_id, &au, &n));
    assert_int_equal(n, 1);
    assert_string_equal(au[0].reason, a.reason);
    free(au);
    /* on the producer's host clock, in a transaction of its own and in the caller's (delayed
     * past the server's now: available then) */
    obx__event_row h = producer_row_of(c, "order.created.v1", "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3B");
    h.at_server = true;
    obx__audit_row ha = producer_audit_of(&h);
    int64_t t0 = server_now(c);
    OK(obx__st_enqueue_write(c->s, &h, "{\"x\":2}", 7, &ha, &written));
    assert_true(written);
    check_at_server(c, &h, t0);
    h = producer_row_of(c, "order.created.v1", "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3C");
    h.at_server = true;
    h.env.not_before = server_now(c) + 3600000;
    ha = producer_audit_of(&h);
    OK(obx__st_begin(c->s));
    OK(obx__st_enqueue_write(c->s, &h, "{\"x\":2}", 7, &ha, &written));
    OK(obx__st_commit(c->s));
    assert_true(written);
    check_at_server(c, &h, t0);
    /* inside the caller's transaction: a savepoint, undone with the caller's rollback; a taken
     * idempotency key fails the write alone, and the caller's transaction goes on */
    obx__event_row k = producer_row_of(c, "order.created.v1", "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F32");
    obx__strlcpy(k.env.idempotency_key, "key-1", sizeof k.env.idempotency_key);
    obx__audit_row ka = producer_audit_of(&k);
    OK(obx__st_begin(c->s));
    OK(obx__st_enqueue_write(c->s, &k, "{\"x\":3}", 7, &ka, &written));
    assert_true(written);
    OK(obx__st_rollback(c->s));
    assert_int_equal(events_of(c, k.env.event_id), 0);
    OK(obx__st_enqueue_write(c->s, &k, "{\"x\":3}", 7, &ka, &written));
    assert_true(written);
    obx__event_row k2 = k;
    obx__strlcpy(k2.env.event_id, "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F33", sizeof k2.env.event_id);
    obx__audit_row ka2 = producer_audit_of(&k2);
    OK(obx__st_begin(c->s));
    assert_int_equal(obx__st_enqueue_write(c->s, &k2, "{\"x\":3}", 7, &ka2, &written),
                     OBX_ECONFLICT);
    assert_false(written);
    obx__event_row k3 = producer_row_of(c, "order.created.v1", "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F34");
    obx__audit_row ka3 = producer_audit_of(&k3);
    OK(obx__st_enqueue_write(c->s, &k3, "{\"x\":4}", 7, &ka3, &written));
    assert_true(written);
    OK(obx__st_commit(c->s));
    assert_int_equal(events_of(c, k2.env.event_id), 0);
    assert_int_equal(events_of(c, k3.env.event_id), 1);
    /* a route set since (another generation, whatever its fields): nothing written */
    obx__event_row old = producer_row_of(c, "order.created.v1", "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F35");
    obx__audit_row oa = producer_audit_of(&old);
    route(c, "order.created.v1", "orders", 0, NULL);
    OK(obx__st_enqueue_write(c->s, &old, "{\"x\":5}", 7, &oa, &written));
    assert_false(written);
    assert_int_equal(events_of(c, old.env.event_id), 0);
}

/* The store calls the engine makes for an enqueue, whichever the backend: the k-th call of a
 * run is the one an armed fault (obx__st_fault_after(k)) fails first, and a run is the same up
 * to its k-th call. Two events of one type on a handle: the first reads the route (no route
 * known yet), the second is the one-call write with the route the first read. */
static void test_engine_calls(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    static const char *const want[] = {"begin", "route_get_txid", "insert_event_audit", "commit",
                                       "enqueue_write"};
    const size_t n_want = sizeof want / sizeof *want;
    const char *got[16] = {0};
    size_t n = 0;
    for (long k = 1; k <= 16; k++) {
        free(c->s->routes); /* the handle knows no route: the first enqueue reads it */
        c->s->routes = NULL;
        obx__st_fault_after(k);
        obx_event ev = {.event_type = "order.created.v1",
                        .aggregate_type = "order",
                        .aggregate_id = "o-1",
                        .aggregate_version = 1,
                        .tenant = "t1",
                        .payload = "{}",
                        .payload_len = 2};
        obx_enqueue_result r;
        (void)obx__enqueue_at(c->s, &ev, c->now, NULL, &r);
        (void)obx__enqueue_at(c->s, &ev, c->now, NULL, &r);
        const char *hit = obx__st_fault_hit();
        obx__st_fault_after(0);
        if (!hit) break;
        got[n++] = hit;
    }
    for (size_t i = 0; i < n || i < n_want; i++)
        if (i >= n || i >= n_want || strcmp(got[i], want[i]))
            fail_msg("call %zu of the enqueues: %s, expected %s", i + 1, i < n ? got[i] : "none",
                     i < n_want ? want[i] : "none");
}

/* write_set: every part in order; an update that does not apply leaves the transaction to be
 * rolled back, with nothing of the set kept */
static void test_write_set(void **state) {
    cx *c = *state;
    route(c, "order.created.v1", "orders", 0, NULL);
    char a[31];
    enq(c, "order.created.v1", "o-1", "", a);
    obx__event_row r = load1(c, a, 0);
    r.state = OBX__ST_CLAIMED;
    r.claim_gen = 1;
    obx__strlcpy(r.owner, "relay-1", sizeof r.owner);
    obx__event_update u = {&r, OBX__ST_PENDING, 0};
    obx__attempt_row at = attempt(a, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3J", 1);
    obx__audit_row au;
    memset(&au, 0, sizeof au);
    au.at = c->now;
    au.actor = OBX__ACT_DISPATCHER;
    strcpy(au.who, "relay-1");
    strcpy(au.event_id, a);
    au.envelope_gen = 1;
    au.from = OBX__ST_PENDING;
    au.to = OBX__ST_CLAIMED;
    au.claim_gen = 1;
    strcpy(au.reason, "claimed");
    bool applied = false;
    obx__write_set w = {.upd = &u,
                        .n_upd = 1,
                        .applied = &applied,
                        .att_new = &at,
                        .n_att_new = 1,
                        .au = &au,
                        .n_au = 1};
    OK(obx__st_begin(c->s));
    OK(obx__st_write_set(c->s, &w));
    OK(obx__st_commit(c->s));
    assert_true(applied);
    assert_int_equal(load1(c, a, 0).state, OBX__ST_CLAIMED);
    obx__attempt_row *got = NULL;
    size_t n = 0;
    OK(obx__st_load_attempts(c->s, NULL, 0, a, &got, &n));
    assert_int_equal(n, 1);
    free(got);
    obx__audit_row *rows = NULL;
    OK(obx__st_load_audit(c->s, a, &rows, &n));
    assert_int_equal(n, 2); /* the producer's and this one */
    assert_string_equal(rows[1].reason, "claimed");
    free(rows);
    /* the same expectation again: the state moved on */
    obx__attempt_row at2 = attempt(a, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3K", 2);
    w.att_new = &at2;
    applied = true;
    OK(obx__st_begin(c->s));
    obx_err e = obx__st_write_set(c->s, &w);
    if (!e && applied) { /* held back until the COMMIT, which fails and rolls back */
        assert_int_not_equal(obx__st_commit(c->s), OBX_OK);
    } else {
        assert_true(e == OBX_ECONFLICT || (e == OBX_OK && !applied));
        OK(obx__st_rollback(c->s));
    }
    OK(obx__st_load_attempts(c->s, NULL, 0, a, &got, &n));
    assert_int_equal(n, 1);
    free(got);
}

static void test_series(void **state) {
    cx *c = *state;
    for (int64_t k = 0; k < 5; k++) {
        char txt[32];
        snprintf(txt, sizeof txt, "{\"k\":%d}", (int)k);
        obx__series_row r = {.slot = 1000 + k * 100, .at = 1000 + k * 100 + 7, .sample = txt};
        OK(obx__st_series_put(c->s, &r, 0));
    }
    obx__series_row again = {.slot = 1200, .at = 1299, .sample = "{\"k\":\"second\"}"};
    OK(obx__st_series_put(c->s, &again, 0)); /* a second relay's sample of slot 1200 */
    obx__series_row *rows = NULL;
    size_t n = 0;
    OK(obx__st_series_list(c->s, 1100, 10, &rows, &n));
    assert_int_equal(n, 4);
    assert_int_equal(rows[0].slot, 1100);
    assert_int_equal(rows[1].at, 1207);
    assert_string_equal(rows[1].sample, "{\"k\":2}");
    assert_int_equal(rows[3].slot, 1400);
    obx__series_rows_free(rows, n);
    OK(obx__st_series_list(c->s, 0, 2, &rows, &n));
    assert_int_equal(n, 2);
    assert_int_equal(rows[0].slot, 1000);
    obx__series_rows_free(rows, n);
    obx__series_row next = {.slot = 1500, .at = 1501, .sample = "{}"};
    OK(obx__st_series_put(c->s, &next, 1300)); /* the window moved: 1000..1200 go */
    OK(obx__st_series_list(c->s, 0, 10, &rows, &n));
    assert_int_equal(n, 3);
    assert_int_equal(rows[0].slot, 1300);
    assert_int_equal(rows[2].slot, 1500);
    obx__series_rows_free(rows, n);
}

/* ---- a producer killed at each point of its transaction ---------------------------------------
 * A process of its own (store_app) begins, writes a business row, enqueues, commits, and is
 * killed with SIGKILL at one point: before the COMMIT nothing of either is left, after it both.
 */

enum kill_point { KILL_BETWEEN_INSERTS, KILL_BEFORE_COMMIT, KILL_AFTER_COMMIT };

static _Noreturn void producer_child(enum kill_point kp) {
    void *conn = app->connect();
    obx_store *s;
    if (!conn || app->wrap(conn, &s)) _exit(3);
    if (app->exec(conn, "BEGIN") || app->exec(conn, "INSERT INTO conf_orders VALUES ('o-k', 1)"))
        _exit(4);
    if (kp == KILL_BETWEEN_INSERTS) raise(SIGKILL);
    obx_event ev = obx_t_order_event("o-k", "{\"k\":1}");
    obx_enqueue_result res;
    if (obx_enqueue(s, &ev, &res)) _exit(5);
    if (kp == KILL_BEFORE_COMMIT) raise(SIGKILL);
    if (app->exec(conn, "COMMIT")) _exit(6);
    raise(SIGKILL);
    _exit(7);
}

static void kill_producer_at(enum kill_point kp) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) producer_child(kp);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status)); /* an _exit(n) names the step that failed */
    assert_int_equal(WTERMSIG(status), SIGKILL);
}

/* rows of the business table and of the outbox tables, in that order */
static void producer_rows(void *conn, long long n[3]) {
    char sql[128];
    n[0] = app->count(conn, "SELECT count(*) FROM conf_orders");
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %sobx_event WHERE state = 'PENDING'",
             app->prefix);
    n[1] = app->count(conn, sql);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %sobx_envelope", app->prefix);
    n[2] = app->count(conn, sql);
}

static void test_kill_producer(void **state) {
    cx *c = *state;
    obx_route r = {.event_type = "order.created.v2", .cluster = "local", .topic = "orders"};
    OK(obx_route_set(c->s, &r, NULL));
    void *conn = app->connect();
    assert_non_null(conn);
    assert_int_equal(app->exec(conn, "CREATE TABLE conf_orders (id TEXT PRIMARY KEY, n INTEGER)"),
                     0);
    long long n[3];
    kill_producer_at(KILL_BETWEEN_INSERTS);
    producer_rows(conn, n);
    assert_true(n[0] == 0 && n[1] == 0 && n[2] == 0);
    kill_producer_at(KILL_BEFORE_COMMIT);
    producer_rows(conn, n);
    assert_true(n[0] == 0 && n[1] == 0 && n[2] == 0);
    kill_producer_at(KILL_AFTER_COMMIT);
    producer_rows(conn, n);
    assert_true(n[0] == 1 && n[1] == 1 && n[2] == 1);
    app->close(conn);
}

int store_conformance_run(const char *label, store_factory f, const store_app *a) {
    factory = f;
    app = a;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_init_and_routes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_methods, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_calls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_rule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_delayed_backlog, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cas, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attempts_receipts_audit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_selects_and_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inbox_tables, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry_copies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retention_audit_methods, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delivery_sets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find_details_alias, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ops_queries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_envelope_at, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_ends_columns, setup, teardown),
        cmocka_unit_test_setup_teardown(test_series, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_producer, setup, teardown),
    };
    return _cmocka_run_group_tests(label, tests, sizeof tests / sizeof tests[0], NULL, NULL);
}
