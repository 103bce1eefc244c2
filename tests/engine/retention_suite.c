/*
 * retention_suite.c — the three-set audit and retention (docs/retention.md) on every store backend.
 *
 * Each audit finding is produced on purpose and detected (PENDING past its age, PUBLISHED not
 * consumed by a critical consumer, a message on the broker the outbox never committed, UNKNOWN
 * past its age, quarantined receipts on both sides, PARKED); a clean pipeline has none. The
 * purge is refused without consumer evidence and done after it (payload gone, tombstone kept,
 * inspect and the report's invariants intact), refused inside the replay window, held by an
 * older gap (the forced consumer watermark) until an operator forces the consumer's watermark,
 * refused again when a consumer's database lost its receipts, changes nothing in a dry run,
 * works in bounded batches over many events and with two purgers at once, and refuses
 * everything without a declared critical consumer. The outbox and both consumers' databases
 * come from the backend's factory; the broker is the local log broker; the clock is virtual.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"

#include "engine/engine.h"
#include "engine/retention_suite.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

obx_err obx__log_broker_set(obx__broker *base, const char *knob, const char *value);

static store_factory factory;
static int many_events = 1000;
static char tmpdir[64];
static int nfiles;

#define MIN_MS 60000

typedef struct fx {
    obx__store *s;         /* the outbox */
    obx__store *cdb[2];    /* the critical consumers' databases */
    obx__critical crit[2]; /* "projection", "ledger" */
    char broker_url[256];
    obx__broker *b;
    int64_t now;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    if (!f || obx_t_factory(factory, &f->s) || obx_t_factory(factory, &f->cdb[0]) ||
        obx_t_factory(factory, &f->cdb[1]) ||
        obx_t_log_broker(f->broker_url, sizeof f->broker_url, tmpdir, ++nfiles, 7, &f->b))
        return -1;
    const char *names[] = {"projection", "ledger"};
    for (int i = 0; i < 2; i++) {
        strcpy(f->crit[i].id, names[i]);
        f->crit[i].s = f->cdb[i];
    }
    f->now = OBX_T_NOW;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    obx__br_close(f->b);
    obx__st_close(f->s);
    for (int i = 0; i < 2; i++) obx__st_close(f->cdb[i]);
    free(f);
    return 0;
}

static void route(fx *f, int max_attempts) {
    obx_route r = {.event_type = "order.created.v1",
                   .cluster = "local",
                   .topic = "orders",
                   .max_attempts = max_attempts};
    OK(obx__route_set_at(f->s, &r, f->now, NULL));
}

static void enq(fx *f, int i, char id[31]) {
    char payload[64], agg[32];
    snprintf(agg, sizeof agg, "o-%d", i);
    snprintf(payload, sizeof payload, "{\"order\":\"%s\",\"total\":%d}", agg, 100 + i);
    obx_t_enq(f->s, f->now, "order.created.v1", agg, NULL, payload, id);
}

static void engine(fx *f, obx__engine *e, const char *owner) {
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    obx__strlcpy(c.owner, owner, sizeof c.owner);
    c.lease_ms = 1000;
    c.seed = 5;
    OK(obx__engine_init(e, f->s, f->b, &c));
}

/* Enqueues n events and publishes them all (one relay, ACKs through the acceptance point). */
static void publish(fx *f, int n, char ids[][31]) {
    route(f, 0);
    for (int i = 0; i < n; i++) enq(f, i, ids[i]);
    obx__engine e;
    engine(f, &e, "relay-a");
    size_t sent = 0, got = 0, k;
    do {
        OK(obx__engine_dispatch(&e, f->now, &k));
        sent += k;
        do {
            OK(obx__engine_poll(&e, f->now, 0, &k));
            got += k;
        } while (k);
    } while (got < (size_t)n);
    assert_int_equal(sent, n);
}

/* Consumer k's inbox receives a consume receipt for ids (what obx_inbox_process writes: the
 * payload digest of the bytes it applied, the envelope generation and destination digest the
 * delivery carried). digest NULL: the event's own, else that of another body (a corrupt or
 * foreign copy the consumer applied). */
static void consumed_as(fx *f, int k, char ids[][31], int n, const char *digest) {
    obx__store *s = f->cdb[k];
    OK(obx__st_begin(s));
    for (int i = 0; i < n; i++) {
        obx__rows rows = {0};
        const char *id = ids[i];
        OK(obx__st_load_events(f->s, &id, 1, 0, &rows));
        assert_int_equal(rows.n, 1);
        obx__inbox_row r;
        memset(&r, 0, sizeof r);
        strcpy(r.consumer_id, f->crit[k].id);
        strcpy(r.event_id, ids[i]);
        strcpy(r.payload_digest, digest ? digest : rows.v[0].env.payload_digest);
        strcpy(r.event_type, "order.created.v1");
        strcpy(r.tenant, "t1");
        strcpy(r.outcome, "APPLIED");
        strcpy(r.topic, "orders");
        r.consumed_at = f->now;
        r.envelope_gen = rows.v[0].envelope_gen;
        strcpy(r.attempt_id, rows.v[0].attempt_id);
        strcpy(r.dest_digest, rows.v[0].dest_digest);
        obx__rows_free(&rows);
        OK(s->m->inbox->inbox_put(s, &r));
    }
    OK(obx__st_commit(s));
}

static void consumed(fx *f, int k, char ids[][31], int n) { consumed_as(f, k, ids, n, NULL); }

static obx__event_row ev(fx *f, const char *id, unsigned flags) {
    return obx_t_ev(f->s, id, flags);
}

static int audit_rows(fx *f, const char *id, obx__state from, obx__state to) {
    obx__audit_row *a;
    size_t n;
    OK(f->s->m->load_audit(f->s, id, &a, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++) c += a[i].from == from && a[i].to == to;
    free(a);
    return c;
}

static int n_audit_rows(fx *f, const char *id) {
    obx__audit_row *a;
    size_t n;
    OK(f->s->m->load_audit(f->s, id, &a, &n));
    free(a);
    return (int)n;
}

static obx__retention_cfg rcfg(fx *f, int n_consumers, int64_t window) {
    for (int i = 0; i < n_consumers; i++) OK(obx__critical_load(&f->crit[i]));
    obx__retention_cfg c = {.consumers = f->crit,
                            .n_consumers = (size_t)n_consumers,
                            .replay_window_ms = window,
                            .batch = 100,
                            .who = "ops:test",
                            .max_listed = 10000};
    return c;
}

static obx__ret_result run(fx *f, obx__retention_cfg *c) {
    obx__ret_result r;
    memset(&r, 0, sizeof r);
    OK(obx__purge_run(f->s, c, f->now, &r));
    return r;
}

/* ---- audit ---------------------------------------------------------------------------------- */

static obx__audit_cfg acfg(fx *f, int n_consumers) {
    for (int i = 0; i < n_consumers; i++) OK(obx__critical_load(&f->crit[i]));
    obx__audit_cfg c = {.consumers = f->crit,
                        .n_consumers = (size_t)n_consumers,
                        .pending_max_age_ms = 5 * MIN_MS,
                        .unconsumed_max_age_ms = 15 * MIN_MS,
                        .unknown_max_age_ms = 15 * MIN_MS,
                        .max_ids = 20,
                        .max_scan = 100000};
    return c;
}

/* Runs the audit; returns the document, counts into counts. */
static json_t *audit_run(fx *f, const obx__audit_cfg *c, bool broker, int64_t counts[]) {
    json_t *doc = NULL;
    OK(obx__audit_run(f->s, broker ? f->b : NULL, c, f->now, &doc, counts));
    assert_non_null(doc);
    return doc;
}

/* The finding of kind (and consumer, when given), or NULL. */
static json_t *finding(json_t *doc, const char *kind, const char *consumer) {
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(doc, "findings"), i, v) {
        if (strcmp(json_string_value(json_object_get(v, "kind")), kind)) continue;
        json_t *c = json_object_get(v, "consumer");
        if (consumer && (!c || strcmp(json_string_value(c), consumer))) continue;
        return v;
    }
    return NULL;
}

static bool lists(json_t *f, const char *id) {
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(f, "event_ids"), i, v) {
        if (!strcmp(json_string_value(v), id)) return true;
    }
    return false;
}

static const char *check_status(json_t *doc, const char *name) {
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(doc, "checks"), i, v) {
        if (!strcmp(json_string_value(json_object_get(v, "check")), name))
            return json_string_value(json_object_get(v, "status"));
    }
    return "";
}

static int64_t total(const int64_t counts[]) {
    int64_t t = 0;
    for (int k = 0; k < OBX__FK_COUNT; k++) t += counts[k];
    return t;
}

/* A clean pipeline, consumed for real through the broker and the inbox: no finding at all. */
static obx_err project(void *user, void *conn, const obx_message *m, const char *key, char *res,
                       size_t cap) {
    (void)user;
    (void)conn;
    (void)key;
    snprintf(res, cap, "projected %s", m->aggregate_id);
    return OBX_OK;
}

static void consume_through_inbox(fx *f, int k) {
    obx__broker *b;
    OK(obx__br_open(f->broker_url, NULL, 0, &b));
    const char *topics[] = {"orders"};
    OK(b->m->consume_open(b, f->crit[k].id, topics, 1));
    obx_inbox_options o = {.consumer_id = f->crit[k].id};
    obx_inbox *in;
    OK(obx_inbox_open(f->cdb[k], &o, &in));
    obx__delivery d[64];
    size_t n = 0;
    OK(b->m->consume_poll(b, 0, d, 64, &n));
    for (size_t i = 0; i < n; i++) {
        obx_message m = obx_t_message(&d[i]);
        m.aggregate_version = d[i].env.aggregate_version;
        m.occurred_at = d[i].env.occurred_at;
        obx_inbox_result r;
        OK(obx__inbox_process_at(in, &m, project, NULL, NULL, f->now, 0, NULL, &r));
        assert_int_equal(r.outcome, OBX_INBOX_APPLIED);
        OK(b->m->consume_ack(b, &d[i]));
        obx__delivery_free(&d[i]);
    }
    obx_inbox_close(in);
    obx__br_close(b);
}

static void test_audit_clean(void **state) {
    fx *f = *state;
    char ids[3][31];
    publish(f, 3, ids);
    consume_through_inbox(f, 0);
    consume_through_inbox(f, 1);
    f->now += 60 * MIN_MS;
    obx__audit_cfg c = acfg(f, 2);
    int64_t counts[OBX__FK_COUNT];
    json_t *doc = audit_run(f, &c, true, counts);
    assert_int_equal(total(counts), 0);
    assert_int_equal(json_array_size(json_object_get(doc, "findings")), 0);
    assert_string_equal(check_status(doc, "pending_overdue"), "ok");
    assert_string_equal(check_status(doc, "unconsumed"), "ok");
    assert_string_equal(check_status(doc, "bypass orders"), "ok");
    assert_string_equal(check_status(doc, "parked"), "ok");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(doc, "sets"), "published")),
                     3);
    json_decref(doc);
    /* no broker: the bypass check says it was skipped, never "ok" */
    doc = audit_run(f, &c, false, counts);
    assert_string_equal(check_status(doc, "bypass"), "skipped");
    json_decref(doc);
    /* no critical consumers: the unconsumed check is skipped */
    c.n_consumers = 0;
    doc = audit_run(f, &c, true, counts);
    assert_string_equal(check_status(doc, "unconsumed"), "skipped");
    json_decref(doc);
}

static void test_audit_pending_overdue(void **state) {
    fx *f = *state;
    route(f, 0);
    char a[31], b[31];
    enq(f, 1, a);
    f->now += MIN_MS;
    enq(f, 2, b);
    obx__audit_cfg c = acfg(f, 0);
    int64_t counts[OBX__FK_COUNT];
    f->now += 4 * MIN_MS + 30000; /* a is 5.5 min old, b 4.5 min */
    json_t *doc = audit_run(f, &c, false, counts);
    json_t *p = finding(doc, "pending_overdue", NULL);
    assert_non_null(p);
    assert_int_equal(counts[OBX__FK_PENDING], 1);
    assert_true(lists(p, a));
    assert_false(lists(p, b));
    assert_int_equal(json_integer_value(json_object_get(p, "oldest_age_ms")), 5 * MIN_MS + 30000);
    json_decref(doc);
    f->now += MIN_MS;
    doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_PENDING], 2);
    assert_true(lists(finding(doc, "pending_overdue", NULL), b));
    json_decref(doc);
    c.pending_max_age_ms = 0; /* check off: skipped, not clean */
    doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_PENDING], 0);
    assert_string_equal(check_status(doc, "pending_overdue"), "skipped");
    json_decref(doc);
}

static void test_audit_unconsumed(void **state) {
    fx *f = *state;
    char ids[3][31];
    publish(f, 3, ids);
    consumed(f, 0, ids, 3); /* projection has all */
    consumed(f, 1, ids, 1); /* ledger only the first */
    obx__audit_cfg c = acfg(f, 2);
    int64_t counts[OBX__FK_COUNT];
    f->now += 10 * MIN_MS; /* not yet past audit.unconsumed_max_age_ms */
    json_t *doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_UNCONSUMED], 0);
    json_decref(doc);
    f->now += 10 * MIN_MS;
    doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_UNCONSUMED], 2);
    assert_null(finding(doc, "unconsumed", "projection"));
    json_t *u = finding(doc, "unconsumed", "ledger");
    assert_non_null(u);
    assert_int_equal(json_integer_value(json_object_get(u, "count")), 2);
    assert_false(lists(u, ids[0]));
    assert_true(lists(u, ids[1]));
    assert_true(lists(u, ids[2]));
    assert_int_equal(json_integer_value(json_object_get(u, "oldest_age_ms")), 20 * MIN_MS);
    json_decref(doc);
    /* audit.max_scan bounds the work and says so */
    c.max_scan = 1;
    doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_UNCONSUMED], 0); /* the oldest one is consumed */
    assert_string_equal(check_status(doc, "unconsumed"), "partial");
    json_decref(doc);
    /* an operator forces ledger's watermark past them: no longer a finding */
    OK(obx__critical_force(&f->crit[1], ev(f, ids[2], 0).published_at, f->now, "ops:test",
                           "ledger rebuilt from a snapshot"));
    c = acfg(f, 2);
    doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_UNCONSUMED], 0);
    json_decref(doc);
}

/* A message on the broker that the outbox never committed: somebody published around it. */
static void test_audit_bypass(void **state) {
    fx *f = *state;
    char ids[2][31];
    publish(f, 2, ids);
    obx__event_row r = ev(f, ids[0], 0);
    obx__envelope env = r.env;
    OK(obx_event_id_new(0, env.event_id)); /* a fresh ID the outbox never saw */
    obx__msg m = {.env = &env,
                  .dest = &r.dest,
                  .dest_digest = r.dest_digest,
                  .attempt_id = "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G",
                  .attempt_gen = 1,
                  .partition = 0,
                  .payload = "{\"rogue\":1}",
                  .payload_len = 11};
    OK(obx__br_send(f->b, &m, 1, f->now));
    obx__outcome o[4];
    size_t n = 0;
    OK(obx__br_poll(f->b, f->now, 100, o, 4, &n));
    assert_int_equal(n, 1);
    assert_int_equal(o[0].kind, OBX__OUT_ACK);
    obx__audit_cfg c = acfg(f, 0);
    int64_t counts[OBX__FK_COUNT];
    json_t *doc = audit_run(f, &c, true, counts);
    json_t *b = finding(doc, "bypass", NULL);
    assert_non_null(b);
    assert_int_equal(counts[OBX__FK_BYPASS], 1);
    assert_true(lists(b, env.event_id));
    assert_false(lists(b, ids[0]));
    assert_string_equal(json_string_value(json_object_get(b, "topic")), "orders");
    assert_int_equal(json_integer_value(json_object_get(b, "scanned")), 3);
    assert_string_equal(check_status(doc, "bypass orders"), "findings");
    json_decref(doc);
    /* a route to another cluster is not this broker's business */
    obx_route other = {.event_type = "payment.done.v1", .cluster = "elsewhere", .topic = "pay"};
    OK(obx__route_set_at(f->s, &other, f->now, NULL));
    doc = audit_run(f, &c, true, counts);
    assert_int_equal(counts[OBX__FK_BYPASS], 1);
    assert_string_equal(check_status(doc, "bypass pay"), "");
    json_decref(doc);
}

static void test_audit_unknown_overdue(void **state) {
    fx *f = *state;
    route(f, 0);
    char a[31];
    enq(f, 1, a);
    obx__engine e;
    engine(f, &e, "relay-a");
    OK(obx__log_broker_set(f->b, "lose_ack", "1"));
    size_t sent, n;
    OK(obx__engine_dispatch(&e, f->now, &sent));
    f->now += 1500;
    OK(obx__engine_sweep(&e, f->now, &n)); /* lease over: the outcome is UNKNOWN */
    assert_int_equal(ev(f, a, 0).state, OBX__ST_DISPATCH_UNKNOWN);
    obx__audit_cfg c = acfg(f, 0);
    c.pending_max_age_ms = 0;
    int64_t counts[OBX__FK_COUNT];
    f->now += 14 * MIN_MS;
    json_t *doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_UNKNOWN], 0);
    json_decref(doc);
    f->now += 2 * MIN_MS;
    doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_UNKNOWN], 1);
    json_t *u = finding(doc, "unknown_overdue", NULL);
    assert_non_null(u);
    assert_true(lists(u, a));
    json_decref(doc);
}

/* Both sides' quarantines: a contradicting ACK at the acceptance point, and a consumer inbox
 * that saw the same event ID with another payload. */
static void test_audit_quarantines(void **state) {
    fx *f = *state;
    char ids[2][31];
    publish(f, 2, ids);
    obx__event_row r = ev(f, ids[0], 0);
    obx__outcome bad = obx_t_ack(ids[0], r.primary_attempt_id, r.env.payload_digest, r.dest_digest,
                                 "orders", r.pinned_partition, 0);
    bad.payload_digest[12] ^= 1;
    obx__engine e;
    engine(f, &e, "relay-a");
    obx__receipt_kind k;
    OK(obx__accept_receipts(&e, f->now, &bad, 1, &k));
    assert_int_equal(k, OBX__RK_QUARANTINED);
    OK(f->cdb[1]->m->inbox->inbox_quarantine_put(f->cdb[1], "ledger", ids[1], r.env.payload_digest,
                                                 r.env.payload_digest, "digest differs", f->now));
    consumed(f, 0, ids, 2);
    consumed(f, 1, ids, 2);
    obx__audit_cfg c = acfg(f, 2);
    int64_t counts[OBX__FK_COUNT];
    json_t *doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_QUARANTINED], 1);
    assert_true(lists(finding(doc, "quarantined_receipt", NULL), ids[0]));
    assert_int_equal(counts[OBX__FK_CONSUMER_QUARANTINE], 1);
    assert_true(lists(finding(doc, "consumer_quarantine", "ledger"), ids[1]));
    assert_null(finding(doc, "consumer_quarantine", "projection"));
    json_decref(doc);
}

static void test_audit_parked(void **state) {
    fx *f = *state;
    route(f, 1);
    char a[31];
    enq(f, 1, a);
    obx__engine e;
    engine(f, &e, "relay-a");
    OK(obx__log_broker_set(f->b, "reject", "1"));
    size_t sent, n;
    OK(obx__engine_dispatch(&e, f->now, &sent));
    do OK(obx__engine_poll(&e, f->now, 0, &n));
    while (n);
    assert_int_equal(ev(f, a, 0).state, OBX__ST_PARKED);
    obx__audit_cfg c = acfg(f, 0);
    int64_t counts[OBX__FK_COUNT];
    json_t *doc = audit_run(f, &c, false, counts);
    assert_int_equal(counts[OBX__FK_PARKED], 1);
    assert_true(lists(finding(doc, "parked", NULL), a));
    json_decref(doc);
}

/* ---- retention ----------------------------------------------------------------------------- */

/* Refused before the consumers' evidence exists, done after it; the tombstone keeps everything
 * but the payload, inspect works, the report's invariants hold. */
static void test_purge_after_evidence(void **state) {
    fx *f = *state;
    char ids[3][31];
    publish(f, 3, ids);
    consumed(f, 0, ids, 3);
    obx__retention_cfg c = rcfg(f, 2, 0);
    obx__ret_result r = run(f, &c);
    assert_int_equal(r.retained, 0);
    assert_int_equal(r.purged, 0);
    assert_int_equal(r.refused, 3);
    assert_true(r.hole);
    assert_string_equal(r.hole_event, ids[0]);
    assert_non_null(strstr(r.hole_why, "ledger"));
    assert_null(strstr(r.hole_why, "projection"));
    assert_non_null(strstr(r.items[0].reason, "not consumed by critical consumer ledger"));
    obx__ret_result_free(&r);
    for (int i = 0; i < 3; i++) {
        obx__event_row e = ev(f, ids[i], OBX__LOAD_PAYLOAD);
        assert_int_equal(e.state, OBX__ST_PUBLISHED);
        assert_false(e.payload_purged);
    }
    consumed(f, 1, ids, 3);
    obx__event_row before = ev(f, ids[1], 0);
    r = run(f, &c);
    assert_int_equal(r.retained, 3);
    assert_int_equal(r.purged, 3);
    assert_int_equal(r.refused, 0);
    assert_false(r.hole);
    assert_true(r.bytes_freed > 0);
    obx__ret_result_free(&r);
    for (int i = 0; i < 3; i++) {
        obx__rows rows = {0};
        const char *id = ids[i];
        OK(obx__st_load_events(f->s, &id, 1, OBX__LOAD_PAYLOAD, &rows));
        assert_int_equal(rows.v[0].state, OBX__ST_PURGED);
        assert_true(rows.v[0].payload_purged);
        assert_null(rows.v[0].payload);
        obx__rows_free(&rows);
        assert_int_equal(audit_rows(f, ids[i], OBX__ST_PUBLISHED, OBX__ST_RETAINED), 1);
        assert_int_equal(audit_rows(f, ids[i], OBX__ST_RETAINED, OBX__ST_PURGED), 1);
    }
    /* the tombstone: envelope, digests, primary receipt, attempts, audit */
    obx__event_row after = ev(f, ids[1], 0);
    assert_string_equal(after.envelope_digest, before.envelope_digest);
    assert_string_equal(after.env.payload_digest, before.env.payload_digest);
    assert_string_equal(after.dest_digest, before.dest_digest);
    assert_string_equal(after.primary_attempt_id, before.primary_attempt_id);
    assert_int_equal(after.payload_len, before.payload_len);
    json_t *doc;
    OK(obx__inspect_json(f->s, ids[1], &doc));
    json_t *st = json_object_get(doc, "status");
    assert_string_equal(json_string_value(json_object_get(st, "state")), "PURGED");
    assert_true(json_is_true(json_object_get(st, "payload_purged")));
    assert_int_equal(json_array_size(json_object_get(doc, "attempts")), 1);
    assert_int_equal(json_array_size(json_object_get(doc, "receipts")), 1);
    json_decref(doc);
    char *rep;
    OK(obx_report(f->s, &rep));
    doc = json_loads(rep, 0, NULL);
    obx_free(rep);
    json_t *inv = json_object_get(doc, "invariants");
    assert_true(json_is_true(json_object_get(inv, "hold")));
    assert_int_equal(json_integer_value(json_object_get(doc, "published")), 3);
    json_decref(doc);
    /* nothing more to do */
    r = run(f, &c);
    assert_int_equal(r.retained + r.purged + r.refused, 0);
    obx__ret_result_free(&r);
    /* a late ACK of the purged event still ends as a duplicate transport receipt */
    obx__event_row p = ev(f, ids[2], 0);
    obx__receipt_row *rc;
    size_t nrc;
    OK(f->s->m->load_receipts(f->s, ids[2], &rc, &nrc));
    obx__outcome late = obx_t_ack(ids[2], p.primary_attempt_id, p.env.payload_digest, p.dest_digest,
                                  "orders", rc[0].partition, rc[0].offset);
    free(rc);
    obx__engine e;
    engine(f, &e, "relay-b");
    obx__receipt_kind k;
    OK(obx__accept_receipts(&e, f->now, &late, 1, &k));
    assert_int_equal(k, OBX__RK_DUPLICATE);
    assert_int_equal(ev(f, ids[2], 0).state, OBX__ST_PURGED);
}

/* Issue 46, defect 8: retention's evidence is checked. A critical consumer's row counts only
 * for the bytes obx froze (payload digest, envelope generation, destination), and an event the
 * consumer's inbox quarantined (another body under its ID: an open alarm) is never purged. Before
 * the check, any row for the ID counted and all three payloads went. */
static void test_purge_checks_evidence(void **state) {
    fx *f = *state;
    char ids[3][31];
    publish(f, 3, ids);
    consumed(f, 0, ids, 3);
    consumed(f, 1, ids, 1); /* ids[0]: the genuine copy */
    consumed_as(f, 1, ids + 1, 1,
                "sha256:9999999999999999999999999999999999999999999999999999999999999999");
    consumed(f, 1, ids + 2, 1); /* ids[2]: applied, but the inbox quarantined another body */
    obx__store *c1 = f->cdb[1];
    OK(obx__st_begin(c1));
    OK(c1->m->inbox->inbox_quarantine_put(
        c1, f->crit[1].id, ids[2],
        "sha256:8888888888888888888888888888888888888888888888888888888888888888",
        ev(f, ids[2], 0).env.payload_digest, "digest differs", f->now));
    OK(obx__st_commit(c1));
    obx__retention_cfg c = rcfg(f, 2, 0);
    obx__ret_result r = run(f, &c);
    assert_int_equal(r.purged, 1);
    assert_true(r.hole);
    assert_string_equal(r.hole_event, ids[1]);
    obx__ret_result_free(&r);
    assert_int_equal(ev(f, ids[0], 0).state, OBX__ST_PURGED);
    for (int i = 1; i < 3; i++) {
        obx__event_row e = ev(f, ids[i], OBX__LOAD_PAYLOAD);
        assert_true(e.state == OBX__ST_PUBLISHED || e.state == OBX__ST_RETAINED);
        assert_false(e.payload_purged);
    }
    /* the single-event purge an operator asks for checks the same */
    obx__ret_result one = {0};
    assert_int_equal(obx__purge_event(f->s, &c, f->now, ids[2], &one), OBX_EREFUSED);
    obx__ret_result_free(&one);
    assert_false(ev(f, ids[2], OBX__LOAD_PAYLOAD).payload_purged);
}

static void test_purge_replay_window(void **state) {
    fx *f = *state;
    char ids[2][31];
    publish(f, 2, ids);
    consumed(f, 0, ids, 2);
    consumed(f, 1, ids, 2);
    int64_t published = f->now;
    obx__retention_cfg c = rcfg(f, 2, 60 * MIN_MS);
    obx__ret_result r = run(f, &c);
    assert_int_equal(r.retained, 2);
    assert_int_equal(r.purged, 0);
    obx__ret_result_free(&r);
    assert_int_equal(ev(f, ids[0], 0).state, OBX__ST_RETAINED);
    /* one event, inside the window: refused, says until when */
    f->now = published + 30 * MIN_MS;
    memset(&r, 0, sizeof r);
    assert_int_equal(obx__purge_event(f->s, &c, f->now, ids[0], &r), OBX_EREFUSED);
    assert_non_null(strstr(obx_errmsg(), "the replay window ends at 2100-01-01T01:00:00.000Z"));
    assert_int_equal(r.refused, 1);
    obx__ret_result_free(&r);
    f->now = published + 60 * MIN_MS - 1;
    r = run(f, &c);
    assert_int_equal(r.purged, 0);
    obx__ret_result_free(&r);
    f->now = published + 60 * MIN_MS;
    r = run(f, &c);
    assert_int_equal(r.purged, 2);
    obx__ret_result_free(&r);
    assert_int_equal(ev(f, ids[1], 0).state, OBX__ST_PURGED);
}

typedef struct snap {
    obx__state st[8];
    bool purged[8];
    int audits[8];
} snap;

static snap take(fx *f, char ids[][31], int n) {
    snap s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < n; i++) {
        obx__event_row e = ev(f, ids[i], OBX__LOAD_PAYLOAD);
        s.st[i] = e.state;
        s.purged[i] = e.payload_purged;
        s.audits[i] = n_audit_rows(f, ids[i]);
    }
    return s;
}

/* A dry run lists what would go, changes nothing, and the real run then does just that. */
static void test_purge_dry_run(void **state) {
    fx *f = *state;
    char ids[5][31];
    publish(f, 5, ids);
    consumed(f, 0, ids, 5);
    consumed(f, 1, ids, 3); /* ids[3] and ids[4] lack ledger's receipt */
    obx__retention_cfg c = rcfg(f, 2, 0);
    /* make ids[0] RETAINED already, so the dry run sees both phases */
    obx__ret_result r;
    memset(&r, 0, sizeof r);
    c.replay_window_ms = 1;
    r = run(f, &c);
    assert_int_equal(r.retained, 3);
    assert_int_equal(r.purged, 0);
    obx__ret_result_free(&r);
    f->now += 1;
    c.replay_window_ms = 0;
    consumed(f, 1, ids + 4, 1); /* ids[4] consumed, but behind the gap at ids[3] */
    snap before = take(f, ids, 5);
    c.dry_run = true;
    obx__ret_result dry = run(f, &c);
    snap after = take(f, ids, 5);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(dry.purged, 3);
    assert_int_equal(dry.retained, 1); /* ids[4] would be retained, not purged */
    assert_int_equal(dry.refused, 1);
    assert_true(dry.hole);
    assert_string_equal(dry.hole_event, ids[3]);
    int purge_items = 0;
    for (size_t i = 0; i < dry.n_items; i++) {
        if (dry.items[i].to == OBX__ST_PURGED) {
            purge_items++;
            assert_non_null(strstr(dry.items[i].reason, "would be purged"));
        }
        if (!strcmp(dry.items[i].event_id, ids[4]))
            assert_int_equal(dry.items[i].to, OBX__ST_RETAINED); /* behind the gap: kept */
    }
    assert_int_equal(purge_items, 3);
    json_t *j = obx__ret_result_json(&c, &dry, f->now);
    assert_true(json_is_true(json_object_get(j, "dry_run")));
    assert_int_equal(json_integer_value(json_object_get(j, "purged")), 3);
    json_decref(j);
    c.dry_run = false;
    obx__ret_result real = run(f, &c);
    assert_int_equal(real.purged, dry.purged);
    assert_int_equal(real.retained, dry.retained);
    assert_int_equal(real.refused, dry.refused);
    assert_string_equal(real.hole_event, dry.hole_event);
    obx__ret_result_free(&dry);
    obx__ret_result_free(&real);
    for (int i = 0; i < 3; i++) assert_int_equal(ev(f, ids[i], 0).state, OBX__ST_PURGED);
    assert_int_equal(ev(f, ids[3], 0).state, OBX__ST_PUBLISHED);
    assert_int_equal(ev(f, ids[4], 0).state, OBX__ST_RETAINED);
}

/* `obx purge EVENT_ID` too early: refused with every unmet condition, nothing changed. */
static void test_premature_purge_refused(void **state) {
    fx *f = *state;
    char ids[2][31];
    publish(f, 2, ids);
    consumed(f, 0, ids, 2);
    obx__retention_cfg c = rcfg(f, 2, 60 * MIN_MS);
    int audits = n_audit_rows(f, ids[1]);
    obx__ret_result r;
    memset(&r, 0, sizeof r);
    assert_int_equal(obx__purge_event(f->s, &c, f->now, ids[1], &r), OBX_EREFUSED);
    const char *msg = obx_errmsg();
    assert_non_null(strstr(msg, "critical consumer ledger has not consumed it"));
    assert_non_null(strstr(msg, "the replay window ends at"));
    assert_non_null(strstr(msg, "forced consumer watermark is at older event"));
    assert_non_null(strstr(msg, ids[0]));
    assert_int_equal(r.refused, 1);
    assert_int_equal(r.n_items, 1);
    assert_int_equal(r.items[0].from, r.items[0].to);
    obx__ret_result_free(&r);
    obx__event_row e = ev(f, ids[1], OBX__LOAD_PAYLOAD);
    assert_int_equal(e.state, OBX__ST_PUBLISHED);
    assert_false(e.payload_purged);
    assert_int_equal(n_audit_rows(f, ids[1]), audits);
    /* not published yet: refused for that */
    char p[31];
    enq(f, 9, p);
    memset(&r, 0, sizeof r);
    assert_int_equal(obx__purge_event(f->s, &c, f->now, p, &r), OBX_EREFUSED);
    assert_non_null(strstr(obx_errmsg(), "it is PENDING"));
    obx__ret_result_free(&r);
    memset(&r, 0, sizeof r);
    assert_int_equal(obx__purge_event(f->s, &c, f->now, "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G", &r),
                     OBX_ENOTFOUND);
    assert_int_equal(obx__purge_event(f->s, &c, f->now, "nope", &r), OBX_EINVAL);
    obx__ret_result_free(&r);
    /* every condition met: one event goes, all or nothing, the other stays */
    consumed(f, 1, ids, 2);
    f->now += 60 * MIN_MS;
    memset(&r, 0, sizeof r);
    OK(obx__purge_event(f->s, &c, f->now, ids[0], &r));
    assert_int_equal(r.retained, 1);
    assert_int_equal(r.purged, 1);
    obx__ret_result_free(&r);
    assert_int_equal(ev(f, ids[0], 0).state, OBX__ST_PURGED);
    assert_int_equal(ev(f, ids[1], 0).state, OBX__ST_PUBLISHED);
    memset(&r, 0, sizeof r);
    OK(obx__purge_event(f->s, &c, f->now, ids[0], &r)); /* already purged: nothing to do */
    assert_int_equal(r.purged, 0);
    assert_non_null(strstr(r.items[0].reason, "already PURGED"));
    obx__ret_result_free(&r);
}

/* An older gap holds everything after it; forcing the consumer's watermark releases it. */
static void test_purge_watermark_gap_and_force(void **state) {
    fx *f = *state;
    char ids[3][31];
    publish(f, 3, ids);
    consumed(f, 0, ids, 3);
    consumed(f, 1, ids + 1, 2); /* ledger lacks ids[0] */
    obx__retention_cfg c = rcfg(f, 2, 0);
    obx__ret_result r = run(f, &c);
    assert_int_equal(r.retained, 2);
    assert_int_equal(r.purged, 0);
    assert_string_equal(r.hole_event, ids[0]);
    obx__ret_result_free(&r);
    assert_int_equal(ev(f, ids[2], 0).state, OBX__ST_RETAINED);
    memset(&r, 0, sizeof r);
    assert_int_equal(obx__purge_event(f->s, &c, f->now, ids[2], &r), OBX_EREFUSED);
    assert_non_null(strstr(obx_errmsg(), "forced consumer watermark is at older event"));
    assert_non_null(strstr(obx_errmsg(), "ledger"));
    obx__ret_result_free(&r);
    /* forcing: not into the future, never backwards, only a declared consumer's */
    int64_t pub0 = ev(f, ids[0], 0).published_at;
    assert_int_equal(obx__critical_force(&f->crit[1], f->now + 1, f->now, "ops:test", "x"),
                     OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "in the future"));
    assert_int_equal(obx__critical_force(&f->crit[1], pub0, f->now, "ops:test", ""), OBX_EINVAL);
    OK(obx__critical_force(&f->crit[1], pub0, f->now, "ops:test", "lost in the 2099 incident"));
    assert_int_equal(obx__critical_force(&f->crit[1], pub0 - 1, f->now, "ops:test", "again"),
                     OBX_EREFUSED);
    assert_non_null(strstr(obx_errmsg(), "only moves forward"));
    c = rcfg(f, 2, 0); /* reload the forced watermarks */
    assert_int_equal(f->crit[1].forced, pub0);
    assert_int_equal(f->crit[1].forced_at, f->now);
    assert_int_equal(f->crit[0].forced, 0);
    r = run(f, &c);
    assert_int_equal(r.retained, 1);
    assert_int_equal(r.purged, 3);
    assert_false(r.hole);
    obx__ret_result_free(&r);
    obx__audit_row *a;
    size_t n;
    OK(f->s->m->load_audit(f->s, ids[0], &a, &n));
    bool forced_named = false;
    for (size_t i = 0; i < n; i++)
        forced_named = forced_named || strstr(a[i].reason, "ledger (forced watermark");
    free(a);
    assert_true(forced_named);
}

/* A consumer database restored from an old backup lost its receipts: what is RETAINED is not
 * purged on the strength of the earlier check, and nothing after it either. */
static void test_purge_rechecks_evidence(void **state) {
    fx *f = *state;
    char ids[2][31];
    publish(f, 2, ids);
    consumed(f, 0, ids, 2);
    consumed(f, 1, ids, 2);
    obx__retention_cfg c = rcfg(f, 2, 60 * MIN_MS);
    obx__ret_result r = run(f, &c);
    assert_int_equal(r.retained, 2);
    obx__ret_result_free(&r);
    obx__store *restored;
    OK(factory(&restored)); /* ledger's database, as restored: no receipts */
    obx__store *real = f->crit[1].s;
    f->crit[1].s = restored;
    f->now += 61 * MIN_MS;
    r = run(f, &c);
    assert_int_equal(r.purged, 0);
    assert_int_equal(r.refused, 1);
    assert_true(r.hole);
    assert_string_equal(r.hole_event, ids[0]);
    assert_non_null(strstr(r.items[0].reason, "no longer has a consume receipt"));
    obx__ret_result_free(&r);
    assert_int_equal(ev(f, ids[1], 0).state, OBX__ST_RETAINED);
    f->crit[1].s = real;
    obx__st_close(restored);
    r = run(f, &c);
    assert_int_equal(r.purged, 2);
    obx__ret_result_free(&r);
}

/* Many events, small batches: each step is one bounded transaction; all go. */
static void test_purge_batched(void **state) {
    fx *f = *state;
    int n = many_events;
    char(*ids)[31] = calloc((size_t)n, 31);
    publish(f, n, ids);
    consumed(f, 0, ids, n);
    consumed(f, 1, ids, n);
    obx__retention_cfg c = rcfg(f, 2, 0);
    c.batch = 64;
    c.max_listed = 10;
    obx__purge_cursor cur;
    obx__purge_cursor_init(&cur);
    obx__ret_result r;
    memset(&r, 0, sizeof r);
    int steps = 0;
    int64_t last_r = 0, last_p = 0;
    while (cur.phase < 2) {
        OK(obx__purge_step(f->s, &c, f->now, &cur, &r));
        steps++;
        assert_true(r.retained - last_r <= 64 && r.purged - last_p <= 64); /* bounded */
        last_r = r.retained;
        last_p = r.purged;
    }
    assert_int_equal(r.retained, n);
    assert_int_equal(r.purged, n);
    int per_phase = n / 64 + 1; /* full batches, then the one that comes back short */
    assert_int_equal(steps, 2 * per_phase);
    assert_int_equal(r.batches, steps);
    assert_int_equal(r.n_items, 10);
    assert_int_equal(r.items_dropped, 2 * n - 10);
    obx__ret_result_free(&r);
    obx__store_stats st;
    OK(f->s->m->read->stats(f->s, &st));
    assert_int_equal(st.by_state[OBX__ST_PURGED], n);
    assert_int_equal(st.by_state[OBX__ST_PUBLISHED] + st.by_state[OBX__ST_RETAINED], 0);
    for (int i = 0; i < n; i += n / 7)
        assert_int_equal(audit_rows(f, ids[i], OBX__ST_RETAINED, OBX__ST_PURGED), 1);
    free(ids);
}

typedef struct purger_arg {
    obx__store *s;
    obx__retention_cfg c;
    int64_t now;
    obx__ret_result r;
    obx_err e;
} purger_arg;

static void *purger_thread(void *p) {
    purger_arg *a = p;
    a->e = obx__purge_run(a->s, &a->c, a->now, &a->r);
    return NULL;
}

/* Two purgers at once: every event is purged exactly once (one audit row each). */
static void test_purge_concurrent(void **state) {
    fx *f = *state;
    int n = 300;
    char(*ids)[31] = calloc((size_t)n, 31);
    publish(f, n, ids);
    consumed(f, 0, ids, n);
    consumed(f, 1, ids, n);
    purger_arg a[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        memset(&a[i], 0, sizeof a[i]);
        OK(obx__st_open(obx_store_url(f->s), &a[i].s));
        a[i].c = rcfg(f, 2, 0);
        a[i].c.batch = 16;
        a[i].c.who = i ? "purger-b" : "purger-a";
        a[i].now = f->now;
    }
    /* each purger reads the consumers through its own connections */
    obx__critical own[2][2];
    obx__store *cs[2][2];
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            OK(obx__st_open(obx_store_url(f->cdb[k]), &cs[i][k]));
            own[i][k] = f->crit[k];
            own[i][k].s = cs[i][k];
        }
    for (int i = 0; i < 2; i++) {
        a[i].c.consumers = own[i];
        pthread_create(&t[i], NULL, purger_thread, &a[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        if (a[i].e) fail_msg("purger %d: %s", i, obx_errname(a[i].e));
    }
    assert_int_equal(a[0].r.purged + a[1].r.purged, n);
    assert_int_equal(a[0].r.retained + a[1].r.retained, n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(ev(f, ids[i], 0).state, OBX__ST_PURGED);
        assert_int_equal(audit_rows(f, ids[i], OBX__ST_RETAINED, OBX__ST_PURGED), 1);
        assert_int_equal(audit_rows(f, ids[i], OBX__ST_PUBLISHED, OBX__ST_RETAINED), 1);
    }
    for (int i = 0; i < 2; i++) {
        obx__ret_result_free(&a[i].r);
        obx__st_close(a[i].s);
        for (int k = 0; k < 2; k++) obx__st_close(cs[i][k]);
    }
    free(ids);
}

/* No critical consumer declared: nothing is retained or purged, an ACK alone never suffices. */
static void test_purge_needs_critical_consumers(void **state) {
    fx *f = *state;
    char ids[1][31];
    publish(f, 1, ids);
    obx__retention_cfg c = rcfg(f, 0, 0);
    obx__ret_result r;
    memset(&r, 0, sizeof r);
    assert_int_equal(obx__purge_run(f->s, &c, f->now, &r), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "an ACK alone never purges"));
    assert_int_equal(obx__purge_event(f->s, &c, f->now, ids[0], &r), OBX_ECONFIG);
    obx__ret_result_free(&r);
    assert_int_equal(ev(f, ids[0], 0).state, OBX__ST_PUBLISHED);
}

/* The purge-before-watermark mutation removes the evidence guard: the same premature purge the
 * tests above refuse goes through, so those tests are what catches it. */
static void test_mutation_purge_before_watermark(void **state) {
    fx *f = *state;
    char ids[1][31];
    publish(f, 1, ids);
    obx__retention_cfg c = rcfg(f, 2, 0);
    obx_err e = obx__mutation_set("purge-before-watermark");
    if (e == OBX_EUNSUPPORTED) { /* a normal build has no mutations */
        assert_non_null(strstr(obx_errmsg(), "OBX_MUTATIONS"));
        return;
    }
    OK(e);
    obx__ret_result r;
    memset(&r, 0, sizeof r);
    e = obx__purge_run(f->s, &c, f->now, &r);
    OK(obx__mutation_set("none"));
    OK(e);
    assert_int_equal(r.purged, 1);
    obx__ret_result_free(&r);
    assert_int_equal(ev(f, ids[0], 0).state, OBX__ST_PURGED);
}

static const struct CMUnitTest tests[] = {
    OBX_T_CASE(test_audit_clean),
    OBX_T_CASE(test_audit_pending_overdue),
    OBX_T_CASE(test_audit_unconsumed),
    OBX_T_CASE(test_audit_bypass),
    OBX_T_CASE(test_audit_unknown_overdue),
    OBX_T_CASE(test_audit_quarantines),
    OBX_T_CASE(test_audit_parked),
    OBX_T_CASE(test_purge_after_evidence),
    OBX_T_CASE(test_purge_checks_evidence),
    OBX_T_CASE(test_purge_replay_window),
    OBX_T_CASE(test_purge_dry_run),
    OBX_T_CASE(test_premature_purge_refused),
    OBX_T_CASE(test_purge_watermark_gap_and_force),
    OBX_T_CASE(test_purge_rechecks_evidence),
    OBX_T_CASE(test_purge_batched),
    OBX_T_CASE(test_purge_concurrent),
    OBX_T_CASE(test_purge_needs_critical_consumers),
    OBX_T_CASE(test_mutation_purge_before_watermark),
};

int retention_suite_run(const char *label, store_factory f, int many) {
    factory = f;
    if (many > 0) many_events = many;
    return OBX_T_RUN_IN_TMPDIR(label, tests, tmpdir, "ret");
}
