/*
 * test_broker_log.c — the local log broker: the broker conformance suite, then its fault
 * knobs (drop/lose/delay ACK, reject, duplicate append, down, lookup_down, lost commits).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/support.h"

#include "broker/conformance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

obx_err obx__log_broker_set(obx__broker *base, const char *knob, const char *value);
void obx__log_broker_rewind(obx__broker *base);

static char dir[64];
static int n_files;

static obx_err fresh(void *user, const char *topic, int partitions, char *url, size_t cap) {
    (void)user;
    (void)topic;
    snprintf(url, cap, "log:%s/b%d.db?partitions=%d&cluster=conf", dir, ++n_files, partitions);
    return OBX_OK;
}

static obx__broker *open_log(const char *query) {
    char url[256];
    snprintf(url, sizeof url, "log:%s/k%d.db?seed=7%s", dir, ++n_files, query);
    obx__broker *b;
    OK(obx__br_open(url, NULL, 0, &b));
    return b;
}

static size_t poll_at(obx__broker *b, int64_t now, obx__outcome *o, size_t cap) {
    size_t n = 0;
    OK(obx__br_poll(b, now, 0, o, cap, &n));
    return n;
}

static void send_one(obx__broker *b, test_msg *tm, int seq, int64_t now) {
    test_msg_init(tm, "orders", "k", seq);
    OK(obx__br_partition_for(b, &tm->dest, &tm->msg.partition));
    OK(obx__br_send(b, &tm->msg, 1, now));
}

static void test_knobs_ack(void **st) {
    (void)st;
    obx__broker *b = open_log("&delay_ack=1&delay_ack_ms=500");
    test_msg tm;
    obx__outcome o[4];
    send_one(b, &tm, 1, 1000);
    assert_int_equal(poll_at(b, 1000, o, 4), 0); /* delayed */
    assert_int_equal(b->m->in_flight(b), 1);
    assert_int_equal(poll_at(b, 1500, o, 4), 1);
    assert_int_equal(o[0].kind, OBX__OUT_ACK);
    OK(obx__log_broker_set(b, "delay_ack", "0"));
    OK(obx__log_broker_set(b, "drop_ack", "1"));
    OK(obx__log_broker_set(b, "ack_timeout_ms", "300"));
    send_one(b, &tm, 2, 2000);
    assert_int_equal(poll_at(b, 2299, o, 4), 0);
    assert_int_equal(poll_at(b, 2300, o, 4), 1);
    assert_int_equal(o[0].kind, OBX__OUT_UNKNOWN); /* but appended: lookup finds it */
    obx__lookup_req q = {.dest = &tm.dest,
                         .partition = tm.msg.partition,
                         .event_id = tm.env.event_id,
                         .envelope_gen = 1,
                         .now = 3000};
    obx__lookup_res r;
    OK(obx__br_lookup(b, &q, &r));
    assert_int_equal(r.kind, OBX__LOOKUP_FOUND);
    assert_string_equal(r.found.attempt_id, tm.attempt_id);
    OK(obx__log_broker_set(b, "drop_ack", "0"));
    OK(obx__log_broker_set(b, "lose_ack", "1"));
    send_one(b, &tm, 3, 4000);
    assert_int_equal(poll_at(b, 999999, o, 4), 0); /* never */
    assert_int_equal(b->m->in_flight(b), 0);
    q.event_id = tm.env.event_id;
    OK(obx__br_lookup(b, &q, &r));
    assert_int_equal(r.kind, OBX__LOOKUP_FOUND);
    assert_int_equal(obx__log_broker_set(b, "drop_ack", "2"), OBX_EURL);
    assert_int_equal(obx__log_broker_set(b, "bogus", "1"), OBX_EURL);
    obx__br_close(b);
}

static void test_knobs_reject_dup_down(void **st) {
    (void)st;
    obx__broker *b = open_log("&reject=1");
    test_msg tm;
    obx__outcome o[4];
    send_one(b, &tm, 1, 1000);
    assert_int_equal(poll_at(b, 1000, o, 4), 1);
    assert_int_equal(o[0].kind, OBX__OUT_REJECT);
    obx__lookup_req q = {.dest = &tm.dest,
                         .partition = tm.msg.partition,
                         .event_id = tm.env.event_id,
                         .envelope_gen = 1,
                         .now = 3000};
    obx__lookup_res r;
    OK(obx__br_lookup(b, &q, &r));
    assert_int_equal(r.kind, OBX__LOOKUP_NOT_FOUND); /* a rejection appends nothing */
    OK(obx__log_broker_set(b, "reject", "0"));
    OK(obx__log_broker_set(b, "dup", "1"));
    send_one(b, &tm, 2, 1000);
    assert_int_equal(poll_at(b, 1000, o, 4), 1);
    assert_int_equal(o[0].kind, OBX__OUT_ACK);
    const char *topics[] = {"orders"};
    OK(b->m->consume_open(b, "g", topics, 1));
    obx__delivery d[4];
    size_t n = 0;
    OK(b->m->consume_poll(b, 0, d, 4, &n));
    assert_int_equal(n, 2); /* stored twice */
    assert_string_equal(d[0].env.event_id, d[1].env.event_id);
    obx__delivery_free(&d[0]);
    obx__delivery_free(&d[1]);
    OK(obx__log_broker_set(b, "dup", "0"));
    OK(obx__log_broker_set(b, "down", "1"));
    send_one(b, &tm, 3, 1000);
    assert_int_equal(poll_at(b, 1000, o, 4), 1);
    assert_int_equal(o[0].kind, OBX__OUT_NOT_SENT);
    OK(obx__br_lookup(b, &q, &r));
    assert_int_equal(r.kind, OBX__LOOKUP_CANNOT_TELL);
    OK(obx__log_broker_set(b, "down", "0"));
    OK(obx__log_broker_set(b, "lookup_down", "1"));
    OK(obx__br_lookup(b, &q, &r));
    assert_int_equal(r.kind, OBX__LOOKUP_CANNOT_TELL);
    obx__br_close(b);
}

/* An attempt past its deadline is not appended (NOT_SENT); its reason names the deadline in
 * ISO-8601 UTC, as every human-facing time is (inspect and trace print reasons verbatim). */
static void test_deadline_reason(void **st) {
    (void)st;
    obx__broker *b = open_log("");
    test_msg tm;
    test_msg_init(&tm, "orders", "k", 1);
    OK(obx__br_partition_for(b, &tm.dest, &tm.msg.partition));
    tm.msg.deadline = INT64_C(1796690755849); /* 2026-12-08T00:45:55.849Z */
    OK(obx__br_send(b, &tm.msg, 1, OBX_T_NOW));
    obx__outcome o[2];
    assert_int_equal(poll_at(b, OBX_T_NOW, o, 2), 1);
    assert_int_equal(o[0].kind, OBX__OUT_NOT_SENT);
    if (!strstr(o[0].reason, "2026-12-08T00:45:55.849Z") || strstr(o[0].reason, "1796690755849"))
        fail_msg("reason: %s", o[0].reason);
    obx__br_close(b);
}

static void test_lost_commit(void **st) {
    (void)st;
    obx__broker *b = open_log("&lose_commit=1");
    test_msg tm;
    obx__outcome o[2];
    send_one(b, &tm, 1, 1000);
    assert_int_equal(poll_at(b, 1000, o, 2), 1);
    const char *topics[] = {"orders"};
    OK(b->m->consume_open(b, "g", topics, 1));
    obx__delivery d[2];
    size_t n = 0;
    OK(b->m->consume_poll(b, 0, d, 2, &n));
    assert_int_equal(n, 1);
    OK(b->m->consume_ack(b, &d[0])); /* "succeeds", but the position is lost */
    obx__delivery_free(&d[0]);
    obx__log_broker_rewind(b);
    OK(b->m->consume_poll(b, 0, d, 2, &n));
    assert_int_equal(n, 1); /* redelivered */
    obx__delivery_free(&d[0]);
    obx__br_close(b);
}

static void test_cluster_identity(void **st) {
    (void)st;
    char url[256];
    snprintf(url, sizeof url, "log:%s/id.db?cluster=east", dir);
    obx__broker *b;
    OK(obx__br_open(url, NULL, 0, &b));
    obx__br_close(b);
    snprintf(url, sizeof url, "log:%s/id.db?cluster=west", dir);
    assert_int_equal(obx__br_open(url, NULL, 0, &b), OBX_EBROKER);
    assert_non_null(strstr(obx_errmsg(), "is cluster 'east'"));
    snprintf(url, sizeof url, "log:%s/id.db?partitions=0", dir);
    assert_int_equal(obx__br_open(url, NULL, 0, &b), OBX_EURL);
}

static void test_partitioner(void **st) {
    (void)st;
    /* Kafka's murmur2 (Java Utils.murmur2 / librdkafka), known values */
    assert_int_equal(obx__murmur2("", 0), 0x106e08d9);
    assert_int_equal(obx__partition("murmur2", "", 1), 0);
    for (int n = 1; n < 40; n++) {
        int32_t p = obx__partition("murmur2", "tenant-7.order.o-42", n);
        assert_true(p >= 0 && p < n);
        assert_int_equal(p, obx__partition("murmur2", "tenant-7.order.o-42", n));
        p = obx__partition("fnv1a", "tenant-7.order.o-42", n);
        assert_true(p >= 0 && p < n);
    }
    assert_int_equal(obx__partition("none", "x", 8), 0);
}

/* The registry's check is generated from broker.h's lists: each required method, and each
 * method a declared capability needs, refused by name when NULL; the real table passes. */
static void test_methods_check(void **state) {
    (void)state;
    const obx__broker_methods *real = &obx__log_broker_methods;
    OK(obx__broker_methods_check(real));
    assert_true(real->caps & OBX__BCAP_CONSUME);
    assert_true(real->caps & OBX__BCAP_SCAN);
    int n = 0;
#define NULL_ONE_(meth)                                                                            \
    do {                                                                                           \
        obx__broker_methods m = *real;                                                             \
        m.meth = NULL;                                                                             \
        assert_int_equal(obx__broker_methods_check(&m), OBX_EINTERNAL);                            \
        if (!strstr(obx_errmsg(), #meth)) fail_msg("no method name in: %s", obx_errmsg());         \
        n++;                                                                                       \
    } while (0);
    OBX__BROKER_REQUIRED(NULL_ONE_)
    OBX__BROKER_CONSUME_REQUIRED(NULL_ONE_)
    NULL_ONE_(scan)
#undef NULL_ONE_
    assert_int_equal(n, 14);
    obx__broker_methods m = *real;
    m.version++;
    assert_int_equal(obx__broker_methods_check(&m), OBX_EINTERNAL);
    m = *real; /* optional methods may be absent */
    m.caps_of = NULL;
    m.contract = NULL;
    m.consume_release = NULL;
    OK(obx__broker_methods_check(&m));
}

int main(void) {
    if (obx_t_tmpdir(dir, sizeof dir, "logb")) return 1;
    broker_env env = {.label = "broker conformance: log", .fresh = fresh};
    int failed = broker_conformance_run(&env);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_knobs_ack),        cmocka_unit_test(test_knobs_reject_dup_down),
        cmocka_unit_test(test_lost_commit),      cmocka_unit_test(test_deadline_reason),
        cmocka_unit_test(test_cluster_identity), cmocka_unit_test(test_partitioner),
        cmocka_unit_test(test_methods_check),
    };
    failed += cmocka_run_group_tests(tests, NULL, NULL);
    if (obx_t_rmdir(dir)) failed++;
    return failed;
}
