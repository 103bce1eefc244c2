/*
 * conformance.c — the broker conformance suite (see conformance.h): cluster identity,
 * partitioning, send/poll receipts that echo the attempt's identity and digests, per-partition
 * offsets, lookup (FOUND, and NOT_FOUND only where authoritative and after quiet time), scan,
 * and the consumer side (headers parsed, position committed only by ack, redelivery after a
 * restart without ack).
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
#include <time.h>
#include <unistd.h>

static const broker_env *E;

typedef struct bx {
    char url[1024];
    char topic[64];
    char consume[128];
    obx__broker *b;
} bx;

static int seqno;

void test_msg_init(test_msg *tm, const char *topic, const char *key, int seq) {
    memset(tm, 0, sizeof *tm);
    obx__envelope *e = &tm->env;
    obx_event_id_new(0, e->event_id);
    e->envelope_gen = 1;
    strcpy(e->aggregate_type, "order");
    snprintf(e->aggregate_id, sizeof e->aggregate_id, "o-%d", seq);
    e->aggregate_version = seq;
    strcpy(e->event_type, "order.created.v1");
    snprintf(tm->payload, sizeof tm->payload, "{\"order\":%d}", seq);
    obx_sha256_digest(tm->payload, strlen(tm->payload), e->payload_digest);
    obx_sha256_digest("schema", 6, e->payload_schema);
    strcpy(e->tenant, "tenant-7");
    e->occurred_at = 1700000000000 + seq;
    strcpy(e->correlation_id, "corr-1");
    strcpy(e->traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    obx__dest *d = &tm->dest;
    strcpy(d->cluster, "c");
    obx__strlcpy(d->topic, topic, sizeof d->topic);
    obx__strlcpy(d->routing_key, key, sizeof d->routing_key);
    strcpy(d->algorithm, "murmur2");
    d->route_gen = 1;
    strcpy(d->serializer, "raw");
    strcpy(d->durability, "persistent");
    strcpy(d->required_acks, "all");
    obx__dest_digest(d, tm->dest_digest);
    char id[31];
    obx_event_id_new(0, id);
    snprintf(tm->attempt_id, sizeof tm->attempt_id, "att-%s", id + 4);
    tm->msg = (obx__msg){.env = &tm->env,
                         .dest = &tm->dest,
                         .dest_digest = tm->dest_digest,
                         .attempt_id = tm->attempt_id,
                         .attempt_gen = 1,
                         .partition = 0,
                         .payload = tm->payload,
                         .payload_len = strlen(tm->payload)};
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int setup(void **state) {
    bx *x = calloc(1, sizeof *x);
    snprintf(x->topic, sizeof x->topic, "conf-%d-%d", (int)getpid(), ++seqno);
    snprintf(x->consume, sizeof x->consume, E->consume_fmt ? E->consume_fmt : "%s", x->topic);
    if (E->fresh(E->user, x->topic, 4, x->url, sizeof x->url) != OBX_OK) {
        fprintf(stderr, "broker env: %s\n", obx_errmsg());
        free(x);
        return -1;
    }
    if (obx__br_open(x->url, E->props, E->n_props, &x->b) != OBX_OK) {
        fprintf(stderr, "open %s: %s\n", x->url, obx_errmsg());
        free(x);
        return -1;
    }
    *state = x;
    return 0;
}

static int teardown(void **state) {
    bx *x = *state;
    obx__br_close(x->b);
    if (E->release) E->release(E->user);
    free(x);
    return 0;
}

/* Polls until n outcomes arrived (or ~30 s). */
static size_t wait_outcomes(obx__broker *b, obx__outcome *out, size_t n) {
    size_t got = 0;
    for (int i = 0; i < 3000 && got < n; i++) {
        size_t k = 0;
        OK(obx__br_poll(b, now_ms(), 10, out + got, n - got, &k));
        got += k;
        if (!k) usleep(10000);
    }
    return got;
}

static void test_identity_and_partitions(void **state) {
    bx *x = *state;
    char c1[OBX_NAME_MAX + 1], c2[OBX_NAME_MAX + 1];
    OK(obx__br_cluster_id(x->b, c1, sizeof c1));
    OK(obx__br_cluster_id(x->b, c2, sizeof c2));
    assert_true(c1[0] != '\0');
    assert_string_equal(c1, c2);
    test_msg tm;
    test_msg_init(&tm, x->topic, "tenant-7.order.o-42", 1);
    int32_t p1 = -1, p2 = -1;
    OK(obx__br_partition_for(x->b, &tm.dest, &p1));
    OK(obx__br_partition_for(x->b, &tm.dest, &p2));
    assert_true(p1 >= 0);
    assert_int_equal(p1, p2); /* stable */
    assert_int_equal(x->b->m->in_flight(x->b), 0);
}

static void test_send_receipts(void **state) {
    bx *x = *state;
    enum { N = 6 };
    test_msg tm[N];
    obx__msg msgs[N];
    char cluster[OBX_NAME_MAX + 1];
    OK(obx__br_cluster_id(x->b, cluster, sizeof cluster));
    for (int i = 0; i < N; i++) {
        test_msg_init(&tm[i], x->topic, i < 3 ? "key-same" : "key-other", i);
        OK(obx__br_partition_for(x->b, &tm[i].dest, &tm[i].msg.partition));
        msgs[i] = tm[i].msg;
    }
    OK(obx__br_send(x->b, msgs, N, now_ms()));
    obx__outcome out[N];
    assert_int_equal(wait_outcomes(x->b, out, N), N);
    int64_t last_same = -1;
    for (int k = 0; k < N; k++) {
        int i = -1;
        for (int j = 0; j < N; j++)
            if (!strcmp(out[k].attempt_id, tm[j].attempt_id)) i = j;
        assert_true(i >= 0);
        if (out[k].kind != OBX__OUT_ACK)
            fail_msg("outcome %s: %s", obx__outcome_kind_name(out[k].kind), out[k].reason);
        assert_string_equal(out[k].event_id, tm[i].env.event_id);
        assert_int_equal(out[k].envelope_gen, 1);
        assert_string_equal(out[k].payload_digest, tm[i].env.payload_digest);
        assert_string_equal(out[k].dest_digest, tm[i].dest_digest);
        assert_string_equal(out[k].cluster, cluster);
        assert_string_equal(out[k].topic, x->topic);
        assert_int_equal(out[k].partition, tm[i].msg.partition);
        assert_true(out[k].offset >= 0);
        if (i < 3) { /* same key, same partition: offsets increase in send order */
            assert_true(out[k].offset > last_same);
            last_same = out[k].offset;
        }
    }
    assert_int_equal(x->b->m->in_flight(x->b), 0);
}

/* Sends test message 1 of key (into tm) to x's topic, to the partition the broker picks, and
 * waits for its outcome (into out); the time it was sent. */
static int64_t send_one(bx *x, test_msg *tm, const char *key, obx__outcome *out) {
    test_msg_init(tm, x->topic, key, 1);
    OK(obx__br_partition_for(x->b, &tm->dest, &tm->msg.partition));
    int64_t t0 = now_ms();
    OK(obx__br_send(x->b, &tm->msg, 1, t0));
    assert_int_equal(wait_outcomes(x->b, out, 1), 1);
    return t0;
}

static void test_lookup(void **state) {
    bx *x = *state;
    unsigned caps = obx__br_caps(x->b); /* per handle: AMQP has lookup only with a stream */
    test_msg tm, absent;
    obx__outcome out;
    int64_t t0 = send_one(x, &tm, "key-l", &out);
    test_msg_init(&absent, x->topic, "key-l", 2);
    assert_int_equal(out.kind, OBX__OUT_ACK);
    obx__lookup_req q = {.dest = &tm.dest,
                         .dest_digest = tm.dest_digest,
                         .partition = tm.msg.partition,
                         .event_id = tm.env.event_id,
                         .envelope_gen = 1,
                         .since = t0 - 1000,
                         .now = now_ms()};
    q.quiet_until = t0 + x->b->m->quiet_time_ms(x->b);
    obx__lookup_res r;
    if (caps & (OBX__BCAP_LOOKUP_AUTHORITATIVE | OBX__BCAP_LOOKUP_BEST_EFFORT)) {
        OK(obx__br_lookup(x->b, &q, &r));
        if (r.kind != OBX__LOOKUP_FOUND) fail_msg("lookup: %d %s", r.kind, r.reason);
        assert_string_equal(r.found.attempt_id, tm.attempt_id);
        assert_string_equal(r.found.payload_digest, tm.env.payload_digest);
        assert_string_equal(r.found.dest_digest, tm.dest_digest);
        assert_int_equal(r.found.partition, out.partition);
        assert_int_equal(r.found.offset, out.offset);
    }
    /* an event that was never sent */
    q.event_id = absent.env.event_id;
    q.quiet_until = now_ms() + 3600000; /* quiet time not passed: never authoritative */
    OK(obx__br_lookup(x->b, &q, &r));
    assert_int_not_equal(r.kind, OBX__LOOKUP_FOUND);
    assert_int_not_equal(r.kind, OBX__LOOKUP_NOT_FOUND);
    /* the reason reaches operators (inspect, trace): times in ISO-8601, never epoch ms */
    if (obx_t_has_epoch_ms(r.reason)) fail_msg("lookup reason with epoch ms: %s", r.reason);
    q.quiet_until = q.now = now_ms();
    OK(obx__br_lookup(x->b, &q, &r));
    assert_int_not_equal(r.kind, OBX__LOOKUP_FOUND);
    if (caps & OBX__BCAP_LOOKUP_AUTHORITATIVE)
        assert_int_equal(r.kind, OBX__LOOKUP_NOT_FOUND);
    else
        assert_int_equal(r.kind, OBX__LOOKUP_CANNOT_TELL);
}

typedef struct {
    const char *want;
    int seen;
} scan_ctx;

static int on_scan(void *user, const char *event_id, int32_t p, int64_t o, int64_t ts) {
    (void)p;
    (void)o;
    (void)ts;
    scan_ctx *c = user;
    if (!strcmp(event_id, c->want)) c->seen++;
    return 0;
}

static void test_scan(void **state) {
    bx *x = *state;
    if (!(obx__br_caps(x->b) & OBX__BCAP_SCAN)) skip();
    test_msg tm;
    obx__outcome out;
    int64_t t0 = send_one(x, &tm, "key-s", &out);
    scan_ctx c = {tm.env.event_id, 0};
    OK(x->b->m->scan(x->b, x->topic, t0 - 60000, on_scan, &c));
    assert_int_equal(c.seen, 1);
}

/* Consumes until n deliveries, or until nothing more came for 2 s after the first one, or
 * ~20 s in all. */
static size_t consume(obx__broker *b, obx__delivery *out, size_t n) {
    size_t got = 0;
    int idle = 0;
    for (int i = 0; i < 400 && got < n && (got == 0 || idle < 40); i++) {
        size_t k = 0;
        OK(b->m->consume_poll(b, 50, out + got, n - got, &k));
        got += k;
        idle = k ? 0 : idle + 1;
        if (!k) usleep(50000);
    }
    return got;
}

/* Sends n messages tm[0..n) of key to x's topic, each to the partition the broker picks, and
 * waits for their n outcomes (into out). */
static void send_key(bx *x, test_msg *tm, obx__outcome *out, int n, const char *key) {
    for (int i = 0; i < n; i++) {
        test_msg_init(&tm[i], x->topic, key, i);
        OK(obx__br_partition_for(x->b, &tm[i].dest, &tm[i].msg.partition));
        OK(obx__br_send(x->b, &tm[i].msg, 1, now_ms()));
    }
    assert_int_equal(wait_outcomes(x->b, out, n), n);
}

/* A new connection consuming x's source as a member of group; the caller closes it. */
static obx__broker *consumer(bx *x, const char *group) {
    const char *topics[] = {x->consume};
    obx__broker *c;
    OK(obx__br_open(x->url, E->props, E->n_props, &c));
    OK(c->m->consume_open(c, group, topics, 1));
    return c;
}

static void test_consume(void **state) {
    bx *x = *state;
    if (!(x->b->m->caps & OBX__BCAP_CONSUME)) skip();
    obx__broker *c1 = consumer(x, "conf-group");
    enum { N = 4 };
    test_msg tm[N];
    obx__outcome out[N];
    send_key(x, tm, out, N, "key-c");
    obx__delivery d[N];
    assert_int_equal(consume(c1, d, N), N);
    for (int i = 0; i < N; i++) {
        assert_string_equal(d[i].header_error, "");
        assert_string_equal(d[i].env.event_id, tm[i].env.event_id); /* same key: in order */
        assert_int_equal(d[i].env.envelope_gen, 1);
        assert_string_equal(d[i].env.event_type, "order.created.v1");
        assert_string_equal(d[i].env.tenant, "tenant-7");
        assert_string_equal(d[i].env.payload_digest, tm[i].env.payload_digest);
        assert_string_equal(d[i].env.correlation_id, "corr-1");
        assert_string_equal(d[i].env.traceparent, tm[i].env.traceparent);
        assert_string_equal(d[i].env.aggregate_id, tm[i].env.aggregate_id);
        assert_string_equal(d[i].dest_digest, tm[i].dest_digest);
        assert_string_equal(d[i].attempt_id, tm[i].attempt_id);
        assert_int_equal(d[i].payload_len, strlen(tm[i].payload));
        assert_memory_equal(d[i].payload, tm[i].payload, d[i].payload_len);
    }
    /* ack the first two only, then "restart" the consumer: the last two come again */
    OK(c1->m->consume_ack(c1, &d[0]));
    OK(c1->m->consume_ack(c1, &d[1]));
    for (int i = 0; i < N; i++) obx__delivery_free(&d[i]);
    obx__br_close(c1);
    obx__broker *c2 = consumer(x, "conf-group");
    size_t got = consume(c2, d, N);
    assert_int_equal(got, 2);
    assert_string_equal(d[0].env.event_id, tm[2].env.event_id);
    assert_string_equal(d[1].env.event_id, tm[3].env.event_id);
    OK(c2->m->consume_ack(c2, &d[0]));
    OK(c2->m->consume_ack(c2, &d[1]));
    obx__delivery_free(&d[0]);
    obx__delivery_free(&d[1]);
    obx__br_close(c2);
}

/* A redelivery after the first delivery of a batch was taken alone (the others already on
 * their way from the broker): each message comes once more, in order, from the failed one on,
 * and every ack is taken. RabbitMQ's basic.recover once raced the deliveries on the wire: they
 * were handed out after it as live ones, before their own redeliveries (7 deliveries for 4, out
 * of order), and their acks closed the channel (unknown delivery tag). */
static void test_consume_redeliver_order(void **state) {
    bx *x = *state;
    if (!(x->b->m->caps & OBX__BCAP_CONSUME) || !x->b->m->consume_redeliver) skip();
    enum { N = 4 };
    test_msg tm[N];
    obx__outcome out[N];
    send_key(x, tm, out, N, "key-r");
    obx__broker *c = consumer(x, "conf-redeliver");
    obx__delivery d[2 * N];
    assert_int_equal(consume(c, d, 1), 1);
    assert_string_equal(d[0].env.event_id, tm[0].env.event_id);
    usleep(200000); /* the rest of the batch reaches the consumer meanwhile */
    OK(c->m->consume_redeliver(c, &d[0]));
    obx__delivery_free(&d[0]);
    size_t got = consume(c, d, 2 * N);
    for (size_t i = 0; i < got; i++) {
        if (i < N) assert_string_equal(d[i].env.event_id, tm[i].env.event_id);
        OK(c->m->consume_ack(c, &d[i]));
    }
    assert_int_equal(got, N);
    /* a poll after the acks: the channel still up, nothing more */
    size_t k = 0;
    OK(c->m->consume_poll(c, 300, d + N, N, &k));
    assert_int_equal(k, 0);
    for (size_t i = 0; i < got; i++) obx__delivery_free(&d[i]);
    obx__br_close(c);
    /* all acknowledged: a new consumer gets nothing */
    c = consumer(x, "conf-redeliver");
    OK(c->m->consume_poll(c, 1000, d, N, &k));
    assert_int_equal(k, 0);
    obx__br_close(c);
}

int broker_conformance_run(const broker_env *env) {
    E = env;
    const struct CMUnitTest tests[] = {
        OBX_T_CASE(test_identity_and_partitions),
        OBX_T_CASE(test_send_receipts),
        OBX_T_CASE(test_lookup),
        OBX_T_CASE(test_scan),
        OBX_T_CASE(test_consume),
        OBX_T_CASE(test_consume_redeliver_order),
    };
    return _cmocka_run_group_tests(env->label, tests, sizeof tests / sizeof tests[0], NULL, NULL);
}
