/*
 * test_ops.c — operations, white box on SQLite: histograms, the statistics cache, consumer
 * lag over the window, the status and trace documents (UNKNOWN with attempts, PARKED,
 * quarantined receipts, a critical consumer's receipt, audit and poison, an unreachable one
 * shown redacted), /metrics rendered from a running relay (consumer outcome counters and the
 * handler histogram fed by the consume audit cursor), configuration redaction, and the
 * consumer test kit on a correct, a broken and an in-process-dedupe handler.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"

#include "drivers/drivers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const obx_consumer_test *obx_kit_good(void);
const obx_consumer_test *obx_kit_broken(void);
const obx_consumer_test *obx_kit_inproc_dedupe(void);

typedef struct fx {
    char dir[64];
    char url[128], curl[128];
    obx__store *s, *c; /* outbox, consumer database */
    int64_t now;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    assert_int_equal(obx_t_tmpdir(f->dir, sizeof f->dir, "ops"), 0);
    snprintf(f->url, sizeof f->url, "sqlite:%s/outbox.db", f->dir);
    snprintf(f->curl, sizeof f->curl, "sqlite:%s/consumer.db", f->dir);
    OK(obx__st_open(f->url, &f->s));
    OK(obx_store_init(f->s));
    OK(obx__st_open(f->curl, &f->c));
    OK(obx_store_init(f->c));
    f->now = obx__wall_ms();
    obx_route r = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    OK(obx__route_set_at(f->s, &r, f->now, NULL));
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    obx__st_close(f->s);
    obx__st_close(f->c);
    assert_int_equal(obx_t_rmdir(f->dir), 0);
    free(f);
    return 0;
}

static void enq(fx *f, const char *agg, const char *corr, char id[31]) {
    obx_t_enq(f->s, f->now, "order.created.v1", agg, corr, "{\"x\":1}", id);
}

static obx__event_row load1(fx *f, const char *id) { return obx_t_ev(f->s, id, 0); }

/* Moves an event along the table (as the engine would, without a broker). */
static void move(fx *f, const char *id, obx__state to, const char *attempt_id) {
    obx__event_row r = load1(f, id);
    obx__event_update u = {&r, r.state, r.claim_gen};
    r.state = to;
    if (to == OBX__ST_CLAIMED) r.claim_gen++;
    if (to == OBX__ST_PUBLISHED) r.published_at = f->now;
    if (to == OBX__ST_DISPATCH_UNKNOWN) r.unknown_since = f->now - 5000;
    if (to == OBX__ST_PARKED) r.rejections = r.max_attempts;
    if (attempt_id) strcpy(r.attempt_id, attempt_id);
    bool ok = false;
    OK(obx__st_begin(f->s));
    OK(obx__st_update_events(f->s, &u, 1, &ok));
    OK(obx__st_commit(f->s));
    assert_true(ok);
}

static void attempt(fx *f, const char *id, const char *aid, obx__attempt_state st,
                    const char *detail) {
    obx__event_row r = load1(f, id);
    obx__attempt_row a;
    memset(&a, 0, sizeof a);
    strcpy(a.attempt_id, aid);
    strcpy(a.event_id, id);
    a.envelope_gen = 1;
    a.attempt_gen = 1;
    a.claim_gen = r.claim_gen;
    strcpy(a.owner, "relay-x/d0");
    strcpy(a.dest_digest, r.dest_digest);
    a.state = st;
    a.started_at = f->now - 6000;
    a.offset_before = -1;
    strcpy(a.detail, detail);
    OK(obx__st_begin(f->s));
    OK(obx__st_insert_attempts(f->s, &a, 1));
    OK(obx__st_commit(f->s));
}

/* ---- histograms, cache, lag ------------------------------------------------------------------ */

static void test_histogram(void **state) {
    (void)state;
    obx__hist h, sum;
    obx__hist_init(&h, obx__handler_le);
    assert_true(h.n > 10 && h.n <= OBX__HIST_MAX);
    obx__hist_observe(&h, 0.0001); /* on the first bound: le is inclusive */
    obx__hist_observe(&h, 0.003);  /* (0.0025, 0.005] */
    obx__hist_observe(&h, 1000.0); /* above every bound: +Inf */
    assert_int_equal(h.bucket[0], 1);
    assert_int_equal(h.bucket[5], 1);
    assert_true(h.le[5] == 0.005);
    assert_int_equal(h.bucket[h.n], 1);
    assert_int_equal(h.count, 3);
    assert_true(h.sum > 1000.003 && h.sum < 1000.0032);
    obx__hist_init(&sum, obx__handler_le);
    obx__hist_add(&sum, &h);
    obx__hist_add(&sum, &h);
    assert_int_equal(sum.count, 6);
    assert_int_equal(sum.bucket[5], 2);
    obx__hist_init(&h, obx__unknown_resolution_le);
    bool has900 = false;
    for (size_t i = 0; i < h.n; i++) has900 |= h.le[i] == 900;
    assert_true(has900); /* the 15-minute target is a bucket bound */
}

static void test_stats_cache(void **state) {
    fx *f = *state;
    char a[31];
    enq(f, "o-1", "", a);
    obx__stats_cache c = {0};
    obx__store_stats st;
    int64_t age;
    OK(obx__stats_get(&c, f->s, &st, &age));
    assert_int_equal(st.by_state[OBX__ST_PENDING], 1);
    /* a count that took a second to make is reused for up to 60 s */
    c.cost_ms = 1000;
    enq(f, "o-2", "", a);
    OK(obx__stats_get(&c, f->s, &st, &age));
    assert_int_equal(st.by_state[OBX__ST_PENDING], 1);
    /* a cheap one is fresh at once */
    c.cost_ms = 0;
    c.at_ms -= 1;
    OK(obx__stats_get(&c, f->s, &st, &age));
    assert_int_equal(st.by_state[OBX__ST_PENDING], 2);
    assert_true(age <= 1);
}

static void put_receipt(fx *f, const char *consumer, const char *id, const char *topic) {
    obx__inbox_row r;
    memset(&r, 0, sizeof r);
    strcpy(r.consumer_id, consumer);
    strcpy(r.event_id, id);
    strcpy(r.payload_digest, "sha256:0");
    strcpy(r.event_type, "order.created.v1");
    strcpy(r.tenant, "t1");
    strcpy(r.outcome, "APPLIED");
    strcpy(r.result, "order projected");
    strcpy(r.topic, topic);
    r.consumed_at = f->now;
    r.duration_us = 1500;
    obx__watermark_row w = {.partition = 0, .offset = 1, .committed_at = f->now - 2000};
    strcpy(w.consumer_id, consumer);
    strcpy(w.topic, topic);
    strcpy(w.event_id, id);
    OK(obx__st_begin(f->c));
    OK(f->c->m->inbox->inbox_put(f->c, &r));
    OK(f->c->m->inbox->watermark_put(f->c, &w));
    OK(obx__st_commit(f->c));
}

static void test_consumer_lag(void **state) {
    fx *f = *state;
    obx_route r = {.event_type = "payment.done.v1", .cluster = "local", .topic = "payments"};
    OK(obx__route_set_at(f->s, &r, f->now, NULL));
    char ids[4][31], pay[31];
    for (int i = 0; i < 4; i++) {
        char agg[16];
        snprintf(agg, sizeof agg, "o-%d", i);
        enq(f, agg, "", ids[i]);
        move(f, ids[i], OBX__ST_CLAIMED, NULL);
        move(f, ids[i], OBX__ST_SENDING, NULL);
        f->now += 10; /* published one after the other */
        move(f, ids[i], OBX__ST_PUBLISHED, NULL);
    }
    obx_event ev = obx_t_event("payment.done.v1", "payment", "p-1", "t1", "{}");
    obx_enqueue_result er;
    OK(obx__enqueue_at(f->s, &ev, f->now, NULL, &er));
    strcpy(pay, er.event_id);
    move(f, pay, OBX__ST_CLAIMED, NULL);
    move(f, pay, OBX__ST_SENDING, NULL);
    move(f, pay, OBX__ST_PUBLISHED, NULL);
    obx__published_ref *recent;
    size_t n;
    OK(f->s->m->read->recent_published(f->s, OBX__LAG_WINDOW, &recent, &n));
    assert_int_equal(n, 5);
    obx__consumer_lag lag;
    /* no watermark yet: every published event counts */
    OK(obx__consumer_lag_of(f->c, "proj", recent, n, &lag));
    assert_int_equal(lag.missing, 5);
    assert_int_equal(lag.window, 5);
    assert_int_equal(lag.last_commit_at, 0);
    /* consumed the first two orders: its topic is orders, the payment is not its business */
    put_receipt(f, "proj", ids[0], "orders");
    put_receipt(f, "proj", ids[1], "orders");
    OK(obx__consumer_lag_of(f->c, "proj", recent, n, &lag));
    assert_int_equal(lag.window, 4);
    assert_int_equal(lag.missing, 2);
    assert_int_equal(lag.oldest_missing_at, load1(f, ids[2]).published_at);
    assert_int_equal(lag.last_commit_at, f->now - 2000);
    free(recent);
}

/* ---- status and trace -------------------------------------------------------------------------
 */

static void test_status_and_trace(void **state) {
    fx *f = *state;
    char unk[31], parked[31], pub[31];
    enq(f, "o-u", "corr-1", unk);
    enq(f, "o-p", "corr-1", parked);
    enq(f, "o-ok", "<b>corr-2</b>", pub);
    move(f, unk, OBX__ST_CLAIMED, NULL);
    attempt(f, unk, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3A", OBX__AT_UNKNOWN, "UNKNOWN: ack timed out");
    move(f, unk, OBX__ST_SENDING, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3A");
    move(f, unk, OBX__ST_DISPATCH_UNKNOWN, NULL);
    move(f, parked, OBX__ST_CLAIMED, NULL);
    attempt(f, parked, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3B", OBX__AT_REJECTED, "REJECT: unknown topic");
    move(f, parked, OBX__ST_SENDING, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3B");
    move(f, parked, OBX__ST_PARKED, NULL);
    move(f, pub, OBX__ST_CLAIMED, NULL);
    move(f, pub, OBX__ST_SENDING, NULL);
    move(f, pub, OBX__ST_PUBLISHED, NULL);
    obx__receipt_row rc =
        obx_t_receipt(pub, "att-01J9ZQ4X5Y6Z7A8B9C0D1E2F3C", OBX__RK_QUARANTINED, f->now);
    strcpy(rc.reason, "payload digest differs");
    OK(obx__st_begin(f->s));
    OK(obx__st_insert_receipts(f->s, &rc, 1));
    OK(obx__st_commit(f->s));
    /* the critical consumer applied the published one and parked the parked one as poison */
    put_receipt(f, "proj", pub, "orders");
    obx__consume_audit_row ca = {.at = f->now, .duration_us = 1500};
    strcpy(ca.consumer_id, "proj");
    strcpy(ca.event_id, pub);
    strcpy(ca.outcome, "APPLIED");
    strcpy(ca.detail, "order projected");
    obx__poison_row p;
    memset(&p, 0, sizeof p);
    strcpy(p.consumer_id, "proj");
    strcpy(p.event_id, parked);
    strcpy(p.state, "PARKED");
    p.failures = 5;
    strcpy(p.last_error, "handler failed");
    strcpy(p.topic, "orders");
    p.parked_at = p.updated_at = f->now;
    OK(obx__st_begin(f->c));
    OK(f->c->m->inbox->consume_audit_put(f->c, &ca, 1));
    OK(f->c->m->inbox->poison_put(f->c, &p));
    OK(obx__st_commit(f->c));

    char bad[160];
    snprintf(bad, sizeof bad, "gone=postgres://obx:s3cret-pw@127.0.0.1:1/x");
    char good[160];
    snprintf(good, sizeof good, "proj=%s", f->curl);
    const char *consumers[] = {good, bad};
    obx_ops_options o = {.consumers = consumers, .n_consumers = 2};
    char *out;
    OK(obx_status(f->s, &o, &out));
    assert_null(strstr(out, "s3cret-pw"));
    json_t *j = json_loads(out, 0, NULL);
    obx_free(out);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "states"), "PARKED")),
                     1);
    json_t *lists = json_object_get(j, "lists");
    json_t *u = json_array_get(json_object_get(lists, "unknown"), 0);
    assert_string_equal(json_string_value(json_object_get(u, "event_id")), unk);
    json_t *ua = json_array_get(json_object_get(u, "attempts"), 0);
    assert_string_equal(json_string_value(json_object_get(ua, "state")), "UNKNOWN");
    json_t *pk = json_array_get(json_object_get(lists, "parked"), 0);
    assert_string_equal(json_string_value(json_object_get(pk, "event_id")), parked);
    assert_string_equal(json_string_value(json_object_get(pk, "last_reason")),
                        "REJECT: unknown topic");
    json_t *q = json_array_get(json_object_get(lists, "quarantined"), 0);
    assert_string_equal(json_string_value(json_object_get(q, "event_id")), pub);
    assert_true(json_integer_value(
                    json_object_get(json_object_get(j, "unknown"), "oldest_age_ms")) >= 5000);
    json_t *cs = json_object_get(j, "consumers");
    assert_int_equal(json_array_size(cs), 2);
    json_t *c0 = json_array_get(cs, 0), *c1 = json_array_get(cs, 1);
    assert_true(json_is_true(json_object_get(c0, "up")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(c0, "lag"), "events")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(c0, "poison"), "parked")),
                     1);
    assert_false(json_is_true(json_object_get(c1, "up")));
    assert_string_equal(json_string_value(json_object_get(c1, "url")),
                        "postgres://obx:***@127.0.0.1:1/x");
    json_decref(j);

    /* trace by correlation: both events of corr-1, oldest first, with the consumer's view */
    OK(obx_trace(f->s, NULL, "corr-1", &o, &out));
    assert_null(strstr(out, "s3cret-pw"));
    j = json_loads(out, 0, NULL);
    obx_free(out);
    json_t *evs = json_object_get(j, "events");
    assert_int_equal(json_array_size(evs), 2);
    json_t *e1 = json_array_get(evs, 1);
    assert_string_equal(json_string_value(json_object_get(e1, "event_id")), parked);
    json_t *pc = json_array_get(json_object_get(e1, "consumers"), 0);
    assert_true(json_is_null(json_object_get(pc, "receipt")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(pc, "poison"), "state")),
                        "PARKED");
    assert_non_null(json_object_get(json_array_get(json_object_get(e1, "consumers"), 1), "error"));
    json_decref(j);
    /* trace by event ID (hostile correlation kept as data) with the consume receipt and audit */
    OK(obx_trace(f->s, pub, NULL, &o, &out));
    j = json_loads(out, 0, NULL);
    obx_free(out);
    json_t *e0 = json_array_get(json_object_get(j, "events"), 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(e0, "envelope"), "correlation_id")),
        "<b>corr-2</b>");
    json_t *c = json_array_get(json_object_get(e0, "consumers"), 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(c, "receipt"), "outcome")), "APPLIED");
    assert_int_equal(json_array_size(json_object_get(c, "audit")), 1);
    json_decref(j);
    /* nothing found, bad input */
    assert_int_equal(obx_trace(f->s, "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3H", NULL, NULL, &out),
                     OBX_ENOTFOUND);
    assert_int_equal(obx_trace(f->s, NULL, "no-such-corr", NULL, &out), OBX_ENOTFOUND);
    assert_int_equal(obx_trace(f->s, "not-an-id", NULL, NULL, &out), OBX_EINVAL);
    assert_int_equal(obx_trace(f->s, NULL, NULL, NULL, &out), OBX_EINVAL);
    const char *malformed[] = {"no-equals-sign"};
    obx_ops_options mo = {.consumers = malformed, .n_consumers = 1};
    assert_int_equal(obx_status(f->s, &mo, &out), OBX_ECONFIG);
}

/* ---- /metrics from a running relay ------------------------------------------------------------
 */

static int64_t metric(const char *text, const char *series) {
    char key[256];
    snprintf(key, sizeof key, "\n%s ", series);
    const char *p = strstr(text, key);
    return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* Starts a relay on the fixture's outbox and a log broker beside it, with poll_ms and further
 * settings sets[0..n) (KEY=VALUE pairs as key, value). */
static obx_relay *start_relay(fx *f, const char *poll_ms, const char *const *sets, int n) {
    char broker[160];
    snprintf(broker, sizeof broker, "log:%s/broker.db", f->dir);
    obx_config *cfg;
    OK(obx_config_new(&cfg));
    OK(obx_config_set(cfg, "db", f->url));
    OK(obx_config_set(cfg, "broker", broker));
    OK(obx_config_set(cfg, "relay.poll_ms", poll_ms));
    OK(obx_config_set(cfg, "relay.drain_ms", "100"));
    OK(obx_config_set(cfg, "log.level", "error"));
    for (int i = 0; i + 1 < n; i += 2) OK(obx_config_set(cfg, sets[i], sets[i + 1]));
    obx_relay *r;
    OK(obx_relay_start(cfg, &r));
    obx_config_free(cfg);
    return r;
}

/* This relay's metrics now, as a NUL-terminated text in b. */
static const char *render(obx_relay *r, fx *f, obx__metrics *m, obx__buf *b) {
    obx__buf_free(b);
    OK(obx__metrics_render(m, obx__relay_view_of(r), f->s, b));
    obx__buf_put(b, "", 1);
    return (const char *)b->data;
}

/* A relay's metrics renderer for a test: the consumer set it reports on, the renderer and the
 * buffer its scrapes go to. Closed, with the relay, by scrape_close. */
typedef struct {
    obx__consumer_set cs;
    obx__metrics *m;
    obx__buf b;
} scrape;

static void scrape_open(scrape *sc, const char *const *decls, int n) {
    memset(sc, 0, sizeof *sc);
    OK(obx__consumer_set_init(&sc->cs, decls, n));
    OK(obx__metrics_new(&sc->cs, &sc->m));
}

/* Frees the renderer, then stops, waits for and closes r. */
static void scrape_close(scrape *sc, obx_relay *r) {
    obx__buf_free(&sc->b);
    obx__metrics_free(sc->m);
    obx__consumer_set_free(&sc->cs);
    obx_relay_stop(r);
    OK(obx_relay_wait(r));
    obx_relay_close(r);
}

static void test_metrics_render(void **state) {
    fx *f = *state;
    char id[31];
    enq(f, "o-m", "corr-m", id);
    char good[160];
    snprintf(good, sizeof good, "proj=%s", f->curl);
    obx_relay *r = start_relay(f, "10", NULL, 0);
    for (int i = 0; i < 300 && load1(f, id).state != OBX__ST_PUBLISHED; i++) usleep(10000);
    assert_int_equal(load1(f, id).state, OBX__ST_PUBLISHED);
    const char *decls[] = {good};
    scrape sc;
    scrape_open(&sc, decls, 1);
    for (int i = 0; i < 300; i++) { /* the relay publishes its counters as it loops */
        if (metric(render(r, f, sc.m, &sc.b), "obx_publish_latency_seconds_count") == 1) break;
        usleep(10000);
    }
    const char *t = (const char *)sc.b.data;
    assert_int_equal(metric(t, "obx_up"), 1);
    assert_int_equal(metric(t, "obx_events{state=\"PUBLISHED\"}"), 1);
    assert_int_equal(metric(t, "obx_publish_latency_seconds_count"), 1);
    assert_int_equal(metric(t, "obx_publish_latency_seconds_bucket{le=\"+Inf\"}"), 1);
    assert_int_equal(metric(t, "obx_published_total"), 1);
    assert_int_equal(metric(t, "obx_consumer_up{consumer=\"proj\"}"), 1);
    assert_int_equal(metric(t, "obx_consumer_lag_events{consumer=\"proj\"}"), 1);
    /* the first scrape put the cursor at the consume audit's end: what follows is counted */
    obx__consume_audit_row ca[4];
    const char *outcome[] = {"FAILED", "APPLIED", "DUPLICATE", "RETRY_SCHEDULED"};
    for (int i = 0; i < 4; i++) {
        memset(&ca[i], 0, sizeof ca[i]);
        ca[i].at = f->now;
        strcpy(ca[i].consumer_id, "proj");
        strcpy(ca[i].event_id, id);
        strcpy(ca[i].outcome, outcome[i]);
        ca[i].duration_us = 3000; /* 3 ms: the (0.0025, 0.005] bucket */
    }
    OK(obx__st_begin(f->c));
    OK(obx__st_consume_audit_put(f->c, ca, 4));
    /* a retry that came due 5 s ago and that no consumer has run */
    int32_t nf = 0;
    OK(obx__st_failure_bump(f->c, "proj", "evt-01JB00000000000000000000RT", "boom", f->now,
                            obx__wall_ms() - 5000, &nf));
    OK(obx__st_commit(f->c));
    put_receipt(f, "proj", id, "orders");
    t = render(r, f, sc.m, &sc.b);
    assert_int_equal(
        metric(t, "obx_consumer_messages_total{consumer=\"proj\",outcome=\"APPLIED\"}"), 1);
    assert_int_equal(metric(t, "obx_consumer_messages_total{consumer=\"proj\",outcome=\"FAILED\"}"),
                     1);
    assert_int_equal(
        metric(t, "obx_consumer_messages_total{consumer=\"proj\",outcome=\"DUPLICATE\"}"), 1);
    assert_int_equal(metric(t, "obx_consumer_messages_total{consumer=\"proj\",outcome=\"OTHER\"}"),
                     0);
    assert_int_equal(metric(t, "obx_consumer_retries_scheduled_total{consumer=\"proj\"}"), 1);
    long due = metric(t, "obx_consumer_retry_oldest_due_seconds{consumer=\"proj\"}");
    assert_true(due >= 4 && due < 60);
    assert_int_equal(
        metric(t, "obx_consumer_handler_duration_seconds_bucket{consumer=\"proj\",le=\"0.0025\"}"),
        0);
    assert_int_equal(
        metric(t, "obx_consumer_handler_duration_seconds_bucket{consumer=\"proj\",le=\"0.005\"}"),
        1);
    assert_int_equal(metric(t, "obx_consumer_lag_events{consumer=\"proj\"}"), 0);
    /* read once: a third scrape counts nothing new */
    assert_int_equal(metric(render(r, f, sc.m, &sc.b),
                            "obx_consumer_messages_total{consumer=\"proj\",outcome=\"APPLIED\"}"),
                     1);
    scrape_close(&sc, r);
}

/* Waits until every event in ids is PUBLISHED and dispatcher 0 and 1 together claimed `claimed`
 * events (the relay publishes its counters as it loops); the text of the last scrape. */
static const char *wait_claimed(obx_relay *r, fx *f, obx__metrics *m, obx__buf *b,
                                int64_t claimed) {
    const char *t = NULL;
    for (int i = 0; i < 1000; i++) {
        t = render(r, f, m, b);
        if (metric(t, "obx_dispatcher_claimed_total{dispatcher=\"0\"}") +
                metric(t, "obx_dispatcher_claimed_total{dispatcher=\"1\"}") ==
            claimed)
            return t;
        usleep(10000);
    }
    fail_msg("dispatchers did not claim %lld events: %s", (long long)claimed, t);
    return t;
}

/* Dispatchers beyond the first claim only during a backlog (claim_due in src/drivers/relay.c):
 * events that come one at a time are all claimed by dispatcher 0; a backlog of many batches
 * brings dispatcher 1 in. Counted by obx_dispatcher_claimed_total. */
static void test_dispatchers_below_backlog(void **state) {
    fx *f = *state;
    char id[31];
    const char *const sets[] = {"relay.dispatchers", "2", "relay.batch", "5"};
    obx_relay *r = start_relay(f, "5", sets, 4);
    scrape sc;
    scrape_open(&sc, NULL, 0);
    for (int i = 0; i < 30; i++) {
        char agg[16];
        snprintf(agg, sizeof agg, "o-%d", i);
        enq(f, agg, "corr-d", id);
        for (int k = 0; k < 500 && load1(f, id).state != OBX__ST_PUBLISHED; k++) usleep(2000);
        assert_int_equal(load1(f, id).state, OBX__ST_PUBLISHED);
    }
    const char *t = wait_claimed(r, f, sc.m, &sc.b, 30);
    assert_int_equal(metric(t, "obx_dispatcher_claimed_total{dispatcher=\"0\"}"), 30);
    assert_int_equal(metric(t, "obx_dispatcher_claimed_total{dispatcher=\"1\"}"), 0);
    /* 400 events committed at once: 80 batches */
    OK(obx__st_begin(f->s));
    for (int i = 0; i < 400; i++) {
        char agg[16];
        snprintf(agg, sizeof agg, "b-%d", i);
        enq(f, agg, "corr-b", id);
    }
    OK(obx__st_commit(f->s));
    t = wait_claimed(r, f, sc.m, &sc.b, 430);
    assert_true(metric(t, "obx_dispatcher_claimed_total{dispatcher=\"1\"}") > 0);
    /* claimed is counted when the claim commits, PUBLISHED comes with the ACK */
    for (int k = 0; k < 1000 && load1(f, id).state != OBX__ST_PUBLISHED; k++) usleep(10000);
    assert_int_equal(load1(f, id).state, OBX__ST_PUBLISHED);
    scrape_close(&sc, r);
}

/* A claim that took less than a whole batch held everything committed before it began, so the
 * dispatcher claims again only with a new reason: a wake-up, outcomes applied (a key's next event
 * may be free), relay.poll_ms. It used to claim once more straight after every send, and at
 * 1,000 commits/s a quarter of its claims found nothing (docs/performance.md, section 2).
 * Three events wait, their ACKs come 300 ms late, polling is 4 s: one claim takes them, one
 * follows their outcomes, none in between. Counted by obx_dispatcher_claims_total. */
static void test_no_claim_after_partial_batch(void **state) {
    fx *f = *state;
    char id[3][31];
    for (int i = 0; i < 3; i++) {
        char agg[16];
        snprintf(agg, sizeof agg, "p-%d", i);
        enq(f, agg, "corr-p", id[i]);
    }
    char broker[200];
    snprintf(broker, sizeof broker, "log:%s/broker.db?delay_ack=1&delay_ack_ms=300", f->dir);
    const char *const sets[] = {"relay.dispatchers", "1", "relay.batch", "5", "broker", broker};
    obx_relay *r = start_relay(f, "4000", sets, 6);
    scrape sc;
    scrape_open(&sc, NULL, 0);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 300 && load1(f, id[i]).state != OBX__ST_PUBLISHED; k++) usleep(10000);
        assert_int_equal(load1(f, id[i]).state, OBX__ST_PUBLISHED);
    }
    const char *t = render(r, f, sc.m, &sc.b);
    for (int k = 0; k < 100 && metric(t, "obx_dispatcher_claims_total{dispatcher=\"0\"}") < 2;
         k++) {
        usleep(10000);
        t = render(r, f, sc.m, &sc.b);
    }
    usleep(300000); /* a claim straight after the send would be counted by now */
    t = render(r, f, sc.m, &sc.b);
    assert_int_equal(metric(t, "obx_dispatcher_claimed_total{dispatcher=\"0\"}"), 3);
    assert_int_equal(metric(t, "obx_dispatcher_claims_total{dispatcher=\"0\"}"), 2);
    assert_int_equal(metric(t, "obx_dispatcher_empty_claims_total{dispatcher=\"0\"}"), 1);
    scrape_close(&sc, r);
}

static void test_config_redaction(void **state) {
    (void)state;
    obx_config *c;
    OK(obx_config_new(&c));
    OK(obx_config_set(c, "audit.critical_consumers",
                      "proj=postgres://obx:hunter2@db:5432/c,other=sqlite:/tmp/c.db"));
    char *js;
    OK(obx_config_dump(c, &js));
    assert_null(strstr(js, "hunter2"));
    assert_non_null(strstr(js, "proj=postgres://obx:***@db:5432/c"));
    obx_free(js);
    char *raw;
    OK(obx_config_get(c, "audit.critical_consumers", &raw)); /* for tools that connect */
    assert_string_equal(raw, "proj=postgres://obx:hunter2@db:5432/c\nother=sqlite:/tmp/c.db");
    obx_free(raw);
    OK(obx_config_set(c, "audit.critical_consumers", "bad id=sqlite:/tmp/x.db"));
    obx_relay *r;
    assert_int_equal(obx_relay_start(c, &r), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "consumer ID"));
    obx_config_free(c);
}

/* ---- the consumer test kit ---------------------------------------------------------------------
 */

/* Runs the kit; returns the names of the failed scenarios, space separated. */
static char *kit(const obx_consumer_test *t, int *bad) {
    char *out;
    OK(obx_consumer_test_run(t, &out, bad));
    json_t *j = json_loads(out, 0, NULL);
    obx_free(out);
    static char failed[256];
    failed[0] = '\0';
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(j, "scenarios"), i, s) {
        if (json_is_true(json_object_get(s, "ok"))) continue;
        if (failed[0]) strcat(failed, " ");
        strcat(failed, json_string_value(json_object_get(s, "scenario")));
    }
    assert_int_equal(json_array_size(json_object_get(j, "scenarios")), 7);
    json_decref(j);
    return failed;
}

static void test_kit_good(void **state) {
    (void)state;
    int bad = -1;
    assert_string_equal(kit(obx_kit_good(), &bad), "");
    assert_int_equal(bad, 0);
}

static void test_kit_broken(void **state) {
    (void)state;
    int bad = 0;
    assert_string_equal(kit(obx_kit_broken(), &bad),
                        "lost-commit reordering older-contract foreign-tenant poison");
    assert_int_equal(bad, 5);
    /* declaring contracts and tenants lets the inbox refuse those two before the handler */
    obx_consumer_test t = *obx_kit_broken();
    const char *types[] = {"order.created.v1"}, *tenants[] = {"tenant-1"};
    t.event_types = types;
    t.n_event_types = 1;
    t.tenants = tenants;
    t.n_tenants = 1;
    assert_string_equal(kit(&t, &bad), "lost-commit reordering poison");
}

static void test_kit_inproc_dedupe(void **state) {
    (void)state;
    int bad = 0;
    /* the set remembers the crashed run (the effect is lost) and the poison message's first,
     * failed run (its redelivery is then "applied" with no effect instead of being parked) */
    assert_string_equal(kit(obx_kit_inproc_dedupe(), &bad), "lost-commit poison");
}

/* The duplicate scenario fails when the inbox does not dedupe (the test-only mutation): the
 * kit would catch a consumer that bypasses the inbox. */
static void test_kit_duplicate_scenario_can_fail(void **state) {
    (void)state;
    obx_err e = obx__mutation_set("skip-inbox-dedupe");
    if (e == OBX_EUNSUPPORTED) skip(); /* a build without -DOBX_MUTATIONS=ON */
    OK(e);
    int bad = 0;
    char *failed = kit(obx_kit_broken(), &bad);
    OK(obx__mutation_set(NULL));
    assert_non_null(strstr(failed, "duplicate"));
}

static void test_kit_bad_specs(void **state) {
    (void)state;
    char *out;
    obx_consumer_test t = *obx_kit_good();
    t.max_failures = 1;
    assert_int_equal(obx_consumer_test_run(&t, &out, NULL), OBX_EINVAL);
    t = *obx_kit_good();
    obx_message one = {
        .event_type = "order.created.v2", .tenant = "t", .payload = "{}", .payload_len = 2};
    t.samples = &one;
    t.n_samples = 1;
    assert_int_equal(obx_consumer_test_run(&t, &out, NULL), OBX_EINVAL);
    t = *obx_kit_good();
    t.handler = NULL;
    assert_int_equal(obx_consumer_test_run(&t, &out, NULL), OBX_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_histogram),
        OBX_T_CASE(test_stats_cache),
        OBX_T_CASE(test_consumer_lag),
        OBX_T_CASE(test_status_and_trace),
        OBX_T_CASE(test_metrics_render),
        OBX_T_CASE(test_dispatchers_below_backlog),
        OBX_T_CASE(test_no_claim_after_partial_batch),
        cmocka_unit_test(test_config_redaction),
        cmocka_unit_test(test_kit_good),
        cmocka_unit_test(test_kit_broken),
        cmocka_unit_test(test_kit_inproc_dedupe),
        cmocka_unit_test(test_kit_duplicate_scenario_can_fail),
        cmocka_unit_test(test_kit_bad_specs),
    };
    return cmocka_run_group_tests_name("operations", tests, NULL, NULL);
}
