/*
 * test_broker_kafka.c — the Kafka backend against librdkafka's in-process mock cluster (a
 * Kafka-protocol broker; a fresh 3-broker cluster per test, because in the mock a broker-level
 * error stack shadows later cluster-level pushes for the same API on that broker).
 *
 *   test_broker_kafka conformance   the broker conformance suite
 *   test_broker_kafka backend       Kafka-specific tests: murmur2 agreement with librdkafka,
 *                                   configuration ownership and secrets, cluster identity,
 *                                   delivery-report mapping under injected faults (lost ACK ->
 *                                   UNKNOWN -> lookup FOUND; broker down -> NOT_SENT; unknown
 *                                   topic / partition / too large -> REJECT), NOT_FOUND only
 *                                   after the quiet time then a same-partition retry,
 *                                   duplicates from idempotent retries, bounded lookups, a
 *                                   consumer group with a rebalance and a lost commit, and kcat
 *                                   reading the obx headers.
 *   (no argument: both)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/support.h"

#include "broker/conformance.h"
#include "obx_test.h"

#include <dirent.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Kafka protocol API keys (librdkafka keeps its RD_KAFKAP_* names private). */
enum { API_PRODUCE = 0, API_OFFSET_COMMIT = 8 };

/* ---- the mock cluster ------------------------------------------------------------------------ */

static rd_kafka_t *mock_rk;
static rd_kafka_mock_cluster_t *mc;
static char boot[512];

static void cluster_up(void) {
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "log_level", "3", err, sizeof err);
    mock_rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    assert_non_null(mock_rk);
    mc = rd_kafka_mock_cluster_new(mock_rk, 3);
    assert_non_null(mc);
    obx__strlcpy(boot, rd_kafka_mock_cluster_bootstraps(mc), sizeof boot);
}

static void cluster_down(void) {
    if (mc) rd_kafka_mock_cluster_destroy(mc);
    if (mock_rk) rd_kafka_destroy(mock_rk);
    mc = NULL;
    mock_rk = NULL;
}

static void topic(const char *name, int partitions) {
    assert_int_equal(rd_kafka_mock_topic_create(mc, name, partitions, 3), 0);
    /* leaders pinned so that tests know which broker to fault */
    for (int p = 0; p < partitions; p++)
        assert_int_equal(rd_kafka_mock_partition_set_leader(mc, name, p, 1), 0);
}

/* The mock cluster auto-creates every topic a Metadata request names (it implements Metadata up
 * to v2 only, so it never sees AllowAutoTopicCreation=false). A topic error makes its Metadata
 * answer what a broker without auto-creation answers. */
static void no_such_topic(const char *name) {
    rd_kafka_mock_topic_set_error(mc, name, RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
}

static obx_err env_fresh(void *user, const char *t, int partitions, char *url, size_t cap) {
    (void)user;
    cluster_up();
    topic(t, partitions);
    snprintf(url, cap, "kafka://%s", boot);
    return OBX_OK;
}

static void env_release(void *user) {
    (void)user;
    cluster_down();
}

/* ---- helpers ----------------------------------------------------------------------------------
 */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Opens the backend on the current mock cluster with the query q and props. */
static obx__broker *open_kafka(const char *q, const char *const *props, size_t n) {
    char url[1024];
    snprintf(url, sizeof url, "kafka://%s%s%s", boot, q && *q ? "?" : "", q ? q : "");
    obx__broker *b = NULL;
    OK(obx__br_open(url, props, n, &b));
    return b;
}

static obx_err try_open(const char *q, const char *const *props, size_t n, obx__broker **b) {
    char url[1024];
    snprintf(url, sizeof url, "kafka://%s%s%s", boot, q && *q ? "?" : "", q ? q : "");
    *b = NULL;
    return obx__br_open(url, props, n, b);
}

/* Polls until n outcomes arrived or timeout_ms passed; returns how many. */
static size_t wait_outcomes(obx__broker *b, obx__outcome *out, size_t n, int timeout_ms) {
    size_t got = 0;
    int64_t end = now_ms() + timeout_ms;
    while (got < n && now_ms() < end) {
        size_t k = 0;
        OK(obx__br_poll(b, now_ms(), 100, out + got, n - got, &k));
        got += k;
    }
    return got;
}

static obx__outcome send_wait(obx__broker *b, test_msg *tm, int timeout_ms) {
    OK(obx__br_send(b, &tm->msg, 1, now_ms()));
    obx__outcome o;
    memset(&o, 0, sizeof o);
    if (wait_outcomes(b, &o, 1, timeout_ms) != 1) fail_msg("no outcome within %d ms", timeout_ms);
    assert_string_equal(o.attempt_id, tm->attempt_id);
    assert_string_equal(o.event_id, tm->env.event_id);
    assert_int_equal(b->m->in_flight(b), 0);
    return o;
}

static obx__lookup_req lookup_req(test_msg *tm, int64_t since, int64_t quiet_until) {
    return (obx__lookup_req){.dest = &tm->dest,
                             .dest_digest = tm->dest_digest,
                             .partition = tm->msg.partition,
                             .event_id = tm->env.event_id,
                             .envelope_gen = tm->env.envelope_gen,
                             .since = since,
                             .quiet_until = quiet_until,
                             .now = now_ms()};
}

static void expect_kind(const obx__outcome *o, obx__outcome_kind k) {
    if (o->kind != k)
        fail_msg("expected %s, got %s: %s", obx__outcome_kind_name(k),
                 obx__outcome_kind_name(o->kind), o->reason);
}

static int setup(void **st) {
    (void)st;
    cluster_up();
    return 0;
}

static int teardown(void **st) {
    (void)st;
    cluster_down();
    return 0;
}

/* ---- TCP_NODELAY on broker connections ------------------------------------------------------- */

static int port_of(const struct sockaddr_storage *sa) {
    if (sa->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)sa)->sin_port);
    if (sa->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    return -1;
}

static bool in_list(const char *bootstraps, int port) {
    char want[16];
    snprintf(want, sizeof want, ":%d", port);
    for (const char *p = strstr(bootstraps, want); p; p = strstr(p + 1, want))
        if (p[strlen(want)] == ',' || p[strlen(want)] == '\0') return true;
    return false;
}

/* This process's connected TCP sockets whose peer (peer_side) or own (!peer_side) port is a
 * broker of the list: how many have TCP_NODELAY on and off. The sockets are read from the
 * kernel, not from obx or librdkafka. */
static void count_nodelay(const char *bootstraps, bool peer_side, int *on, int *off) {
    *on = *off = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        int fd = atoi(de->d_name);
        struct sockaddr_storage me, peer;
        socklen_t ml = sizeof me, pl = sizeof peer;
        if (fd <= 2 || fd == dirfd(d) || getsockname(fd, (struct sockaddr *)&me, &ml) ||
            getpeername(fd, (struct sockaddr *)&peer, &pl))
            continue; /* not a connected socket */
        int port = port_of(peer_side ? &peer : &me);
        if (port < 0 || !in_list(bootstraps, port)) continue;
        int v = 0;
        socklen_t vl = sizeof v;
        assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &vl), 0);
        if (v)
            (*on)++;
        else
            (*off)++;
    }
    closedir(d);
}

/* Nagle's algorithm is off on the producer's broker connections unless the user turns it back
 * on: with requests pipelined to a broker it held each small request back until the previous
 * one was acknowledged (docs/performance.md, section 2). Before the default, every connection
 * counted here had Nagle on. */
static void test_nagle_off_by_default(void **st) {
    (void)st;
    topic("nagle", 2);
    for (int user_on = 0; user_on < 2; user_on++) {
        const char *props[] = {"socket.nagle.disable=false"};
        obx__broker *b = open_kafka(NULL, props, user_on ? 1 : 0);
        test_msg tm;
        test_msg_init(&tm, "nagle", "k", 1);
        expect_kind((obx__outcome[]){send_wait(b, &tm, 10000)}, OBX__OUT_ACK);
        int on, off;
        count_nodelay(boot, true, &on, &off);
        if (user_on) {
            if (off == 0 || on != 0)
                fail_msg("user's Nagle: %d connections without, %d with", off, on);
        } else if (on == 0 || off != 0) {
            fail_msg("default: %d connections with TCP_NODELAY, %d without", on, off);
        }
        obx__br_close(b);
    }
}

/* obx_kafka_mock's brokers answer without Nagle, as real Kafka brokers do: the connections it
 * accepts carry TCP_NODELAY (set on its listeners, which Linux copies to accepted sockets). */
static void test_mock_accepts_nodelay(void **st) {
    (void)st;
    obx_kafka_mock *m = NULL;
    char mboot[512];
    OK(obx_kafka_mock_start(3, "orders", 2, mboot, sizeof mboot, &m));
    int port = atoi(strrchr(strtok(mboot, ","), ':') + 1);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
    char one_port[32];
    snprintf(one_port, sizeof one_port, "127.0.0.1:%d", port);
    int on = 0, off = 0;
    for (int i = 0; i < 200 && on + off == 0; i++) { /* the mock's thread accepts it */
        usleep(10000);
        count_nodelay(one_port, false, &on, &off);
    }
    /* own port == the broker's: the accepted side; our client socket has its peer there */
    if (on != 1 || off != 0)
        fail_msg("accepted connections: %d with TCP_NODELAY, %d without", on, off);
    close(c);
    obx_kafka_mock_stop(m);
}

/* The handle's wake_fd turns readable when a delivery report is waiting, and poll clears it:
 * the relay waits for outcomes and for its store's wake-up in one poll(2) (relay.c, idle_wait).
 * Five sends in turn: each report signals after the previous poll served the queue, so a
 * signal is never spent before its report. Before: no such descriptor (-1). */
static void test_wake_fd_signals_outcomes(void **st) {
    (void)st;
    topic("wake", 1);
    obx__broker *b = open_kafka(NULL, NULL, 0);
    int fd = obx__br_wake_fd(b);
    if (fd < 0) fail_msg("the Kafka handle has no wake descriptor");
    assert_int_equal(obx__br_wake_fd(b), fd); /* one per handle */
    obx__outcome o[4];
    size_t n = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (int i = 0; i < 5; i++) {
        OK(obx__br_poll(b, now_ms(), 0, o, 4, &n));
        assert_int_equal(n, 0);
        if (poll(&p, 1, 0) != 0) fail_msg("round %d: readable with nothing to collect", i);
        test_msg tm;
        test_msg_init(&tm, "wake", "k", 1);
        OK(obx__br_send(b, &tm.msg, 1, now_ms()));
        if (poll(&p, 1, 10000) != 1) fail_msg("round %d: no signal within 10 s of the send", i);
        OK(obx__br_poll(b, now_ms(), 0, o, 4, &n));
        assert_int_equal(n, 1);
        expect_kind(&o[0], OBX__OUT_ACK);
        assert_string_equal(o[0].attempt_id, tm.attempt_id);
    }
    obx__br_close(b);
}

/* ---- partitioner ------------------------------------------------------------------------------
 */

/* obx's murmur2 placement equals librdkafka's murmur2 partitioner (and so Java's default
 * partitioner) for many keys and partition counts, and Kafka's Java test vectors. */
static void test_murmur2_agrees(void **st) {
    (void)st;
    static const struct {
        const char *key;
        int32_t h;
    } java[] = {{"21", -973932308},
                {"foobar", -790332482},
                {"a-little-bit-long-string", -985981536},
                {"a-little-bit-longer-string", -1486304829},
                {"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
                {"abc", 479470107}};
    for (size_t i = 0; i < sizeof java / sizeof java[0]; i++)
        assert_int_equal((int32_t)obx__murmur2(java[i].key, strlen(java[i].key)), java[i].h);
    char err[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, rd_kafka_conf_new(), err, sizeof err);
    assert_non_null(rk);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, "murmur", NULL);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int checked = 0;
    for (int i = 0; i < 20000; i++) {
        char key[80];
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t len = i < 64 ? (size_t)i : x % 70;
        for (size_t k = 0; k < len; k++) key[k] = (char)(33 + (x >> (k % 56)) % 94);
        key[len] = '\0';
        if (i % 3 == 0) snprintf(key, sizeof key, "tenant-%d.order.o-%d", i % 17, i);
        int32_t n = 1 + (int32_t)(x % 97);
        int32_t want = rd_kafka_msg_partitioner_murmur2(rkt, key, strlen(key), n, NULL, NULL);
        assert_int_equal(obx__partition("murmur2", key, n), want);
        checked++;
    }
    assert_int_equal(checked, 20000);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
}

typedef struct {
    int32_t partition;
    int done;
} dr_seen;

static void raw_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    dr_seen *s = m->_private;
    s->partition = m->err ? -1 : m->partition;
    s->done = 1;
}

/* partition_for (metadata partition count + murmur2) puts keys where a plain librdkafka
 * producer with partitioner=murmur2 puts them on the same topic. */
static void test_partition_for_matches_producer(void **st) {
    (void)st;
    topic("placement", 7);
    obx__broker *b = open_kafka(NULL, NULL, 0);
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    assert_int_equal(rd_kafka_conf_set(c, "bootstrap.servers", boot, err, sizeof err), 0);
    assert_int_equal(rd_kafka_conf_set(c, "partitioner", "murmur2", err, sizeof err), 0);
    rd_kafka_conf_set_dr_msg_cb(c, raw_dr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    assert_non_null(rk);
    enum { N = 40 };
    dr_seen seen[N];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof key, "tenant-%d.order.%d", i % 5, i);
        assert_int_equal(
            rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("placement"), RD_KAFKA_V_KEY(key, strlen(key)),
                              RD_KAFKA_V_VALUE("x", 1), RD_KAFKA_V_OPAQUE(&seen[i]),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
            0);
    }
    assert_int_equal(rd_kafka_flush(rk, 10000), 0);
    rd_kafka_poll(rk, 0);
    for (int i = 0; i < N; i++) {
        test_msg tm;
        char key[32];
        snprintf(key, sizeof key, "tenant-%d.order.%d", i % 5, i);
        test_msg_init(&tm, "placement", key, i);
        int32_t p = -1;
        OK(obx__br_partition_for(b, &tm.dest, &p));
        assert_true(seen[i].done);
        assert_int_equal(p, seen[i].partition);
    }
    rd_kafka_destroy(rk);
    obx__br_close(b);
}

/* ---- configuration and identity ---------------------------------------------------------------
 */

static void expect_refused(const char *prop, const char *name) {
    const char *props[] = {prop};
    obx__broker *b;
    assert_int_equal(try_open(NULL, props, 1, &b), OBX_ECONFIG);
    if (!strstr(obx_errmsg(), name))
        fail_msg("'%s': message does not name it: %s", prop, obx_errmsg());
}

static void test_config_owned_and_secrets(void **st) {
    (void)st;
    topic("cfg", 2);
    expect_refused("enable.idempotence=false", "enable.idempotence");
    expect_refused("acks=1", "acks");
    expect_refused("request.required.acks=0", "request.required.acks");
    expect_refused("enable.auto.commit=true", "enable.auto.commit");
    expect_refused("consumer.enable.auto.offset.store=true", "enable.auto.offset.store");
    expect_refused("partitioner=random", "partitioner");
    expect_refused("max.in.flight=6", "max.in.flight");
    expect_refused("producer.max.in.flight.requests.per.connection=10",
                   "max.in.flight.requests.per.connection");
    expect_refused("bootstrap.servers=elsewhere:9092", "bootstrap.servers");
    expect_refused("transactional.id=t1", "transactional.id");
    expect_refused("group.id=g", "group.id");
    expect_refused("delivery.timeout.ms=0", "delivery.timeout.ms");
    expect_refused("no.such.property=1", "no.such.property");
    expect_refused("obx.lookup.timeout.ms=soon", "obx.lookup.timeout.ms");
    expect_refused("obx.nonsense=1", "obx.nonsense");
    /* the value obx sets anyway is accepted, and ordinary properties pass through */
    const char *fine[] = {"acks=all",
                          "enable.idempotence=true",
                          "max.in.flight=5",
                          "linger.ms=2",
                          "producer.compression.codec=lz4",
                          "consumer.fetch.wait.max.ms=50",
                          "message.timeout.ms=4000",
                          "request.timeout.ms=1500"};
    obx__broker *b = NULL;
    OK(try_open(NULL, fine, sizeof fine / sizeof fine[0], &b));
    assert_int_equal(b->m->quiet_time_ms(b), 5500); /* message.timeout.ms + request.timeout.ms */
    obx__br_close(b);
    /* secrets never appear in a message: not in the URL, not when malformed, not when bad */
    const char *secret = "hunter2-s3cr3t";
    char q[128];
    snprintf(q, sizeof q, "sasl.password=%s", secret);
    assert_int_equal(try_open(q, NULL, 0, &b), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "sasl.password"));
    assert_null(strstr(obx_errmsg(), secret));
    char p1[128], p2[128];
    snprintf(p1, sizeof p1, "sasl.password%s", secret); /* '=' forgotten */
    const char *bad1[] = {p1};
    assert_int_equal(try_open(NULL, bad1, 1, &b), OBX_ECONFIG);
    assert_null(strstr(obx_errmsg(), secret));
    snprintf(p2, sizeof p2, "ssl.key.password=%s", secret);
    const char *bad2[] = {p2, "security.protocol=not-a-protocol"};
    assert_int_equal(try_open(NULL, bad2, 2, &b), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "security.protocol"));
    assert_null(strstr(obx_errmsg(), secret));
    /* a password property is accepted as a property (plaintext cluster: unused) */
    const char *ok_secret[] = {p2};
    OK(try_open(NULL, ok_secret, 1, &b));
    assert_null(strstr(b->url_redacted, secret));
    obx__br_close(b);
}

static void test_cluster_identity(void **st) {
    (void)st;
    topic("ident", 2);
    /* default identity: the Kafka cluster ID */
    obx__broker *b = open_kafka(NULL, NULL, 0);
    char id[OBX_NAME_MAX + 1];
    OK(obx__br_cluster_id(b, id, sizeof id));
    assert_true(strncmp(id, "mockCluster", 11) == 0);
    obx__br_close(b);
    /* a logical name, with the right expected ID: receipts carry the logical name */
    char q[256];
    snprintf(q, sizeof q, "cluster=kafka-prod&cluster_id=%s", id);
    b = open_kafka(q, NULL, 0);
    char name[OBX_NAME_MAX + 1];
    OK(obx__br_cluster_id(b, name, sizeof name));
    assert_string_equal(name, "kafka-prod");
    test_msg tm;
    test_msg_init(&tm, "ident", "k", 1);
    OK(obx__br_partition_for(b, &tm.dest, &tm.msg.partition));
    obx__outcome o = send_wait(b, &tm, 10000);
    expect_kind(&o, OBX__OUT_ACK);
    assert_string_equal(o.cluster, "kafka-prod");
    obx__br_close(b);
    /* a different expected ID is refused at open, with both IDs in the message */
    assert_int_equal(try_open("cluster=kafka-prod&cluster_id=someOtherCluster", NULL, 0, &b),
                     OBX_EREFUSED);
    assert_non_null(strstr(obx_errmsg(), "someOtherCluster"));
    assert_non_null(strstr(obx_errmsg(), id));
    const char *props[] = {"obx.cluster.id=someOtherCluster"};
    assert_int_equal(try_open(NULL, props, 1, &b), OBX_EREFUSED);
    /* unreachable brokers: a bounded open that says so */
    const char *quick[] = {"obx.open.timeout.ms=300"};
    int64_t t0 = now_ms();
    assert_int_equal(obx__br_open("kafka://127.0.0.1:1", quick, 1, &b), OBX_EBROKER);
    assert_true(now_ms() - t0 < 5000);
    assert_non_null(strstr(obx_errmsg(), "cluster ID"));
    /* partition_for on a topic that does not exist: a definite answer (the engine rejects) */
    no_such_topic("no-such-topic");
    b = open_kafka(NULL, NULL, 0);
    test_msg_init(&tm, "no-such-topic", "k", 1);
    int32_t p;
    assert_int_equal(obx__br_partition_for(b, &tm.dest, &p), OBX_ENOTFOUND);
    assert_non_null(strstr(obx_errmsg(), "no-such-topic"));
    obx__br_close(b);
}

/* ---- delivery reports under faults ------------------------------------------------------------
 */

/* The ACK is lost (the leader answers after 8 s, the message times out at 3 s): UNKNOWN,
 * possibly persisted; the message is in the log and lookup finds it with this attempt. */
static void test_lost_ack_unknown_then_found(void **st) {
    (void)st;
    topic("lost", 4);
    const char *props[] = {"message.timeout.ms=3000"};
    obx__broker *b = open_kafka(NULL, props, 1);
    test_msg tm;
    test_msg_init(&tm, "lost", "key-lost", 1);
    OK(obx__br_partition_for(b, &tm.dest, &tm.msg.partition));
    assert_int_equal(rd_kafka_mock_broker_push_request_error_rtts(mc, 1, API_PRODUCE, 1,
                                                                  RD_KAFKA_RESP_ERR_NO_ERROR, 8000),
                     0);
    int64_t t0 = now_ms();
    obx__outcome o = send_wait(b, &tm, 10000);
    expect_kind(&o, OBX__OUT_UNKNOWN);
    assert_non_null(strstr(o.reason, "possibly persisted"));
    assert_string_equal(o.payload_digest, tm.env.payload_digest);
    assert_string_equal(o.dest_digest, tm.dest_digest);
    obx__lookup_req q = lookup_req(&tm, t0, t0 + b->m->quiet_time_ms(b));
    obx__lookup_res r;
    OK(obx__br_lookup(b, &q, &r));
    if (r.kind != OBX__LOOKUP_FOUND) fail_msg("lookup: %d %s", r.kind, r.reason);
    assert_string_equal(r.found.attempt_id, tm.attempt_id);
    assert_int_equal(r.found.envelope_gen, 1);
    assert_string_equal(r.found.payload_digest, tm.env.payload_digest);
    assert_string_equal(r.found.dest_digest, tm.dest_digest);
    assert_int_equal(r.found.partition, tm.msg.partition);
    assert_int_equal(r.found.offset, 0);
    assert_true(r.found.broker_ts >= t0 - 1000);
    /* another envelope generation of the same event is another target: not this one */
    q.envelope_gen = 2;
    OK(obx__br_lookup(b, &q, &r));
    assert_int_not_equal(r.kind, OBX__LOOKUP_FOUND);
    obx__br_close(b);
}

/* Evidence is the bytes (issue 46, item 2): a copy with the event's headers and another body is
 * not the event's message (counted as corrupt, never FOUND), and the lookup considers every copy
 * of the event ID in its window: the genuine copy after it is the receipt. */
static void test_lookup_hashes_every_copy(void **st) {
    (void)st;
    topic("forged", 1);
    obx__broker *b = open_kafka(NULL, NULL, 0);
    test_msg tm;
    test_msg_init(&tm, "forged", "key-forged", 1);
    OK(obx__br_partition_for(b, &tm.dest, &tm.msg.partition));
    char genuine[sizeof tm.payload];
    strcpy(genuine, tm.payload);
    strcpy(tm.payload, "{\"order\":\"forged\"}"); /* the headers still name the real one */
    tm.msg.payload_len = strlen(tm.payload);
    int64_t t0 = now_ms();
    obx__outcome o = send_wait(b, &tm, 10000);
    expect_kind(&o, OBX__OUT_ACK);
    obx__lookup_req q = lookup_req(&tm, t0, t0);
    q.payload_digest = tm.env.payload_digest;
    obx__lookup_res r;
    OK(obx__br_lookup(b, &q, &r));
    if (r.kind == OBX__LOOKUP_FOUND) fail_msg("a forged body was FOUND: %s", r.reason);
    assert_int_equal(r.n_bad, 1);
    assert_int_equal(r.bad.offset, 0);
    assert_string_not_equal(r.bad.payload_digest, tm.env.payload_digest);
    assert_non_null(strstr(r.bad.reason, "corrupt copy"));
    strcpy(tm.payload, genuine);
    tm.msg.payload_len = strlen(tm.payload);
    o = send_wait(b, &tm, 10000);
    expect_kind(&o, OBX__OUT_ACK);
    q.now = now_ms();
    OK(obx__br_lookup(b, &q, &r));
    if (r.kind != OBX__LOOKUP_FOUND) fail_msg("lookup: %d %s", r.kind, r.reason);
    assert_int_equal(r.found.offset, 1);
    assert_string_equal(r.found.payload_digest, tm.env.payload_digest);
    assert_int_equal(r.n_bad, 1);
    obx__br_close(b);
}

/* Transient request errors are retried inside the producer; the outcome is one ACK. */
static void test_transient_errors_retried(void **st) {
    (void)st;
    topic("retry", 2);
    obx__broker *b = open_kafka(NULL, NULL, 0);
    test_msg tm;
    test_msg_init(&tm, "retry", "k", 1);
    OK(obx__br_partition_for(b, &tm.dest, &tm.msg.partition));
    rd_kafka_mock_push_request_errors(mc, API_PRODUCE, 3, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
                                      RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
                                      RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS);
    obx__outcome o = send_wait(b, &tm, 20000);
    expect_kind(&o, OBX__OUT_ACK);
    assert_int_equal(o.offset, 0);
    obx__br_close(b);
}

/* The partition leader is down before the send: the message never leaves the producer and
 * times out NOT_PERSISTED -> NOT_SENT. Lookups meanwhile cannot tell (bounded). */
static void test_broker_down_not_sent(void **st) {
    (void)st;
    topic("down", 2);
    const char *props[] = {"message.timeout.ms=1500", "obx.lookup.timeout.ms=1500"};
    obx__broker *b = open_kafka(NULL, props, 2);
    test_msg tm;
    test_msg_init(&tm, "down", "k", 1);
    OK(obx__br_partition_for(b, &tm.dest, &tm.msg.partition));
    assert_int_equal(rd_kafka_mock_broker_set_down(mc, 1), 0);
    int64_t t0 = now_ms();
    obx__outcome o = send_wait(b, &tm, 10000);
    expect_kind(&o, OBX__OUT_NOT_SENT);
    assert_non_null(strstr(o.reason, "not persisted"));
    obx__lookup_req q = lookup_req(&tm, t0, t0);
    obx__lookup_res r;
    int64_t l0 = now_ms();
    OK(obx__br_lookup(b, &q, &r));
    assert_int_equal(r.kind, OBX__LOOKUP_CANNOT_TELL);
    assert_true(now_ms() - l0 < 6000);
    obx__br_close(b);
}

static obx__outcome send_to(obx__broker *b, const char *t, int32_t partition, size_t payload_len) {
    test_msg tm;
    test_msg_init(&tm, t, "k", 1);
    tm.msg.partition = partition;
    char *big = NULL;
    if (payload_len) {
        big = malloc(payload_len);
        memset(big, 'x', payload_len);
        tm.msg.payload = big;
        tm.msg.payload_len = payload_len;
    }
    obx__outcome o = send_wait(b, &tm, 15000);
    free(big);
    return o;
}

/* Definite errors: unknown topic, unknown partition, too large (client limit and a broker
 * MESSAGE_TOO_LARGE answer) -> REJECT; nothing was appended. */
static void test_definite_errors_reject(void **st) {
    (void)st;
    topic("rej", 2);
    const char *props[] = {"topic.metadata.propagation.max.ms=500", "message.max.bytes=20000"};
    no_such_topic("no-such-topic");
    obx__broker *b = open_kafka(NULL, props, 2);
    obx__outcome o = send_to(b, "no-such-topic", 0, 0);
    expect_kind(&o, OBX__OUT_REJECT);
    assert_non_null(strstr(o.reason, "UNKNOWN_TOPIC"));
    assert_non_null(strstr(o.reason, "not persisted"));
    o = send_to(b, "rej", 9, 0);
    expect_kind(&o, OBX__OUT_REJECT);
    assert_non_null(strstr(o.reason, "UNKNOWN_PARTITION"));
    o = send_to(b, "rej", 0, 50000);
    expect_kind(&o, OBX__OUT_REJECT);
    assert_non_null(strstr(o.reason, "MSG_SIZE_TOO_LARGE"));
    rd_kafka_mock_push_request_errors(mc, API_PRODUCE, 1, RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
    o = send_to(b, "rej", 1, 0);
    expect_kind(&o, OBX__OUT_REJECT);
    assert_non_null(strstr(o.reason, "not persisted"));
    int64_t lo = -1, hi = -1;
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", boot, err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    for (int p = 0; p < 2; p++) {
        assert_int_equal(rd_kafka_query_watermark_offsets(rk, "rej", p, &lo, &hi, 5000), 0);
        assert_int_equal(hi, 0); /* nothing appended */
    }
    rd_kafka_destroy(rk);
    obx__br_close(b);
}

/* An attempt that never reached the log: lookup says CANNOT_TELL before its quiet time and
 * NOT_FOUND after it; the retry goes to the same pinned partition and is then found. */
static void test_not_found_after_quiet_then_retry(void **st) {
    (void)st;
    topic("quiet", 4);
    const char *props[] = {"message.timeout.ms=1500", "request.timeout.ms=500"};
    obx__broker *b = open_kafka(NULL, props, 2);
    int64_t quiet = b->m->quiet_time_ms(b);
    assert_int_equal(quiet, 2000);
    test_msg tm;
    test_msg_init(&tm, "quiet", "tenant-7.order.o-9", 1);
    OK(obx__br_partition_for(b, &tm.dest, &tm.msg.partition));
    int32_t pinned = tm.msg.partition;
    /* some traffic on the partition that is not this event */
    for (int i = 0; i < 3; i++) {
        test_msg other;
        test_msg_init(&other, "quiet", "tenant-7.order.o-9", 10 + i);
        other.msg.partition = pinned;
        expect_kind((obx__outcome[]){send_wait(b, &other, 10000)}, OBX__OUT_ACK);
    }
    /* the leader refuses every Produce with a retriable error until the message times out */
    for (int i = 0; i < 5; i++)
        rd_kafka_mock_push_request_errors(
            mc, API_PRODUCE, 10, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS);
    int64_t t0 = now_ms();
    OK(obx__br_send(b, &tm.msg, 1, t0));
    /* before the quiet time: not found is never authoritative */
    obx__lookup_req q = lookup_req(&tm, t0, t0 + quiet);
    obx__lookup_res r;
    OK(b->m->lookup(b, &q, &r));
    assert_true(now_ms() < t0 + quiet);
    if (r.kind != OBX__LOOKUP_CANNOT_TELL) fail_msg("lookup: %d %s", r.kind, r.reason);
    assert_non_null(strstr(r.reason, "quiet time"));
    obx__outcome o;
    assert_int_equal(wait_outcomes(b, &o, 1, 10000), 1);
    expect_kind(&o, OBX__OUT_NOT_SENT);
    rd_kafka_mock_clear_request_errors(mc, API_PRODUCE);
    while (now_ms() < t0 + quiet) usleep(50000);
    q.now = now_ms();
    OK(obx__br_lookup(b, &q, &r));
    if (r.kind != OBX__LOOKUP_NOT_FOUND) fail_msg("lookup: %d %s", r.kind, r.reason);
    /* the retry: a new attempt, same frozen destination and pinned partition */
    char id[31];
    obx_event_id_new(0, id);
    snprintf(tm.attempt_id, sizeof tm.attempt_id, "att-%s", id + 4);
    tm.msg.attempt_gen = 2;
    o = send_wait(b, &tm, 10000);
    expect_kind(&o, OBX__OUT_ACK);
    assert_int_equal(o.partition, pinned);
    assert_int_equal(o.offset, 3);
    q.now = now_ms();
    OK(obx__br_lookup(b, &q, &r));
    assert_int_equal(r.kind, OBX__LOOKUP_FOUND);
    assert_string_equal(r.found.attempt_id, tm.attempt_id);
    assert_int_equal(r.found.offset, 3);
    obx__br_close(b);
}

typedef struct {
    const char *want;
    int64_t offsets[8];
    int n;
    int others;
} scan_ctx;

static int on_scan(void *user, const char *event_id, int32_t p, int64_t off, int64_t ts) {
    (void)p;
    (void)ts;
    scan_ctx *c = user;
    if (!strcmp(event_id, c->want) && c->n < 8)
        c->offsets[c->n++] = off;
    else
        c->others++;
    return 0;
}

/* A lost ACK followed by librdkafka's own retry of the same idempotent batch: the mock stores
 * it twice (real Kafka drops the retry). One outcome (ACK); the broker holds two copies with
 * the same attempt; lookup returns the first. */
static void test_idempotent_retry_duplicates(void **st) {
    (void)st;
    topic("dups", 1);
    const char *props[] = {"socket.timeout.ms=1000", "message.timeout.ms=20000"};
    obx__broker *b = open_kafka(NULL, props, 2);
    test_msg tm;
    test_msg_init(&tm, "dups", "k", 1);
    tm.msg.partition = 0;
    assert_int_equal(rd_kafka_mock_broker_push_request_error_rtts(mc, 1, API_PRODUCE, 1,
                                                                  RD_KAFKA_RESP_ERR_NO_ERROR, 3000),
                     0);
    int64_t t0 = now_ms();
    obx__outcome o = send_wait(b, &tm, 30000);
    expect_kind(&o, OBX__OUT_ACK);
    scan_ctx c = {tm.env.event_id, {0}, 0, 0};
    OK(b->m->scan(b, "dups", t0 - 1000, on_scan, &c));
    assert_int_equal(c.n, 2); /* duplicates at the broker */
    assert_int_equal(c.others, 0);
    obx__lookup_req q = lookup_req(&tm, t0, t0);
    obx__lookup_res r;
    OK(obx__br_lookup(b, &q, &r));
    assert_int_equal(r.kind, OBX__LOOKUP_FOUND);
    assert_int_equal(r.found.offset, c.offsets[0] < c.offsets[1] ? c.offsets[0] : c.offsets[1]);
    assert_string_equal(r.found.attempt_id, tm.attempt_id);
    obx__br_close(b);
}

/* Lookups are bounded: over obx.lookup.max.messages the answer is CANNOT_TELL, never
 * NOT_FOUND. */
static void test_lookup_bounded(void **st) {
    (void)st;
    topic("bound", 1);
    const char *props[] = {"obx.lookup.max.messages=5"};
    obx__broker *b = open_kafka(NULL, props, 1);
    enum { N = 12 };
    test_msg tm[N];
    obx__msg m[N];
    int64_t t0 = now_ms();
    for (int i = 0; i < N; i++) {
        test_msg_init(&tm[i], "bound", "k", i);
        m[i] = tm[i].msg;
    }
    OK(obx__br_send(b, m, N, t0));
    obx__outcome o[N];
    assert_int_equal(wait_outcomes(b, o, N, 10000), N);
    obx__lookup_req q = lookup_req(&tm[N - 1], t0, t0);
    obx__lookup_res r;
    OK(obx__br_lookup(b, &q, &r)); /* the 12th message is past the budget */
    assert_int_equal(r.kind, OBX__LOOKUP_CANNOT_TELL);
    assert_non_null(strstr(r.reason, "max.messages"));
    q = lookup_req(&tm[2], t0, t0);
    OK(obx__br_lookup(b, &q, &r));
    assert_int_equal(r.kind, OBX__LOOKUP_FOUND);
    assert_int_equal(r.found.offset, 2);
    obx__br_close(b);
}

/* The reader's fetch bounds are defaults that never refuse a user's producer limits: a
 * message.max.bytes over 1 MiB (set for every client) left lookups working. (A fixed
 * fetch.max.bytes of 1 MiB made librdkafka refuse to create the reader: "`fetch.max.bytes` must
 * be >= `message.max.bytes`", and every lookup failed.) */
static void test_lookup_large_message_limit(void **st) {
    (void)st;
    topic("big", 1);
    const char *props[] = {"message.max.bytes=2000000"};
    obx__broker *b = open_kafka(NULL, props, 1);
    test_msg tm;
    test_msg_init(&tm, "big", "k", 1);
    int64_t t0 = now_ms();
    obx__outcome o = send_wait(b, &tm, 10000);
    expect_kind(&o, OBX__OUT_ACK);
    obx__lookup_req q = lookup_req(&tm, t0, t0);
    obx__lookup_res r;
    OK(obx__br_lookup(b, &q, &r));
    if (r.kind != OBX__LOOKUP_FOUND) fail_msg("lookup: %d %s", r.kind, r.reason);
    obx__br_close(b);
}

/* ---- consumer group ----------------------------------------------------------------------------
 */

static const char *const group_props[] = {"consumer.session.timeout.ms=6000",
                                          "consumer.heartbeat.interval.ms=500"};

/* Committed offsets of group g for topic t partitions 0..n-1 (-1: none). */
static void committed(const char *g, const char *t, int n, int64_t *out) {
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", boot, err, sizeof err);
    rd_kafka_conf_set(c, "group.id", g, err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    for (int p = 0; p < n; p++) rd_kafka_topic_partition_list_add(l, t, p);
    assert_int_equal(rd_kafka_committed(rk, l, 10000), 0);
    for (int p = 0; p < n; p++) out[p] = l->elems[p].offset < 0 ? -1 : l->elems[p].offset;
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
}

enum { RB_PARTS = 4, RB_PER = 6, RB_N = RB_PARTS * RB_PER, RB_ACKED = 3 };

typedef struct {
    int count[RB_PARTS][RB_PER];
    char event[RB_PARTS][RB_PER][OBX_EVENT_ID_LEN + 1];
} seen_map;

static void record(seen_map *s, const obx__delivery *d) {
    assert_true(d->partition >= 0 && d->partition < RB_PARTS);
    assert_true(d->offset >= 0 && d->offset < RB_PER);
    assert_string_equal(d->header_error, "");
    s->count[d->partition][d->offset]++;
    if (s->event[d->partition][d->offset][0])
        assert_string_equal(s->event[d->partition][d->offset], d->env.event_id);
    else
        obx__strlcpy(s->event[d->partition][d->offset], d->env.event_id, OBX_EVENT_ID_LEN + 1);
}

/* A consumer reads everything, acks the first RB_ACKED offsets of each partition, loses one
 * more commit (the broker refuses it) and holds the rest unacked; a second consumer joins.
 * After the rebalance exactly the unacked offsets are redelivered (with their event IDs, for
 * the inbox to dedupe), nothing acked comes back, an ack for a partition that moved is refused
 * and commits nothing, and committed offsets only ever move by acks. */
static void test_group_rebalance_and_lost_commit(void **st) {
    (void)st;
    topic("rb", RB_PARTS);
    obx__broker *p = open_kafka(NULL, NULL, 0);
    test_msg tm[RB_N];
    obx__msg m[RB_N];
    for (int i = 0; i < RB_N; i++) {
        test_msg_init(&tm[i], "rb", "k", i);
        tm[i].msg.partition = i % RB_PARTS;
        m[i] = tm[i].msg;
    }
    OK(obx__br_send(p, m, RB_N, now_ms()));
    obx__outcome o[RB_N];
    assert_int_equal(wait_outcomes(p, o, RB_N, 10000), RB_N);
    obx__br_close(p);

    const char *topics[] = {"rb"};
    obx__broker *a = open_kafka(NULL, group_props, 2);
    OK(a->m->consume_open(a, "g-rb", topics, 1));
    obx__delivery first[RB_N];
    size_t got = 0;
    for (int64_t end = now_ms() + 20000; got < RB_N && now_ms() < end;) {
        size_t k = 0;
        OK(a->m->consume_poll(a, 100, first + got, RB_N - got, &k));
        got += k;
    }
    assert_int_equal(got, RB_N);
    seen_map s1, s2;
    memset(&s1, 0, sizeof s1);
    memset(&s2, 0, sizeof s2);
    for (size_t i = 0; i < got; i++) record(&s1, &first[i]);
    int64_t c[RB_PARTS];
    committed("g-rb", "rb", RB_PARTS, c);
    for (int i = 0; i < RB_PARTS; i++) assert_int_equal(c[i], -1); /* no ack, no commit */
    for (size_t i = 0; i < got; i++)
        if (first[i].offset < RB_ACKED) OK(a->m->consume_ack(a, &first[i]));
    /* the commit of partition 0 offset RB_ACKED is lost: the broker refuses it */
    rd_kafka_mock_push_request_errors(mc, API_OFFSET_COMMIT, 1,
                                      RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE);
    for (size_t i = 0; i < got; i++)
        if (first[i].partition == 0 && first[i].offset == RB_ACKED)
            assert_int_equal(a->m->consume_ack(a, &first[i]), OBX_EBROKER);
    committed("g-rb", "rb", RB_PARTS, c);
    for (int i = 0; i < RB_PARTS; i++) assert_int_equal(c[i], RB_ACKED);

    /* a second consumer joins: rebalance */
    obx__broker *bb = open_kafka(NULL, group_props, 2);
    OK(bb->m->consume_open(bb, "g-rb", topics, 1));
    int b_parts = 0; /* bitmask of partitions B received */
    int want = RB_PARTS * (RB_PER - RB_ACKED), have = 0;
    for (int64_t end = now_ms() + 30000; have < want && now_ms() < end;) {
        obx__delivery d[8];
        size_t k = 0;
        OK(a->m->consume_poll(a, 50, d, 8, &k));
        for (size_t i = 0; i < k; i++) {
            record(&s2, &d[i]);
            obx__delivery_free(&d[i]);
        }
        size_t kb = 0;
        OK(bb->m->consume_poll(bb, 50, d, 8, &kb));
        for (size_t i = 0; i < kb; i++) {
            record(&s2, &d[i]);
            b_parts |= 1 << d[i].partition;
            OK(bb->m->consume_ack(bb, &d[i])); /* B's database commit done: ack */
            obx__delivery_free(&d[i]);
        }
        have = 0;
        for (int pp = 0; pp < RB_PARTS; pp++)
            for (int off = RB_ACKED; off < RB_PER; off++) have += s2.count[pp][off] > 0;
    }
    assert_int_equal(have, want); /* every unacked offset came again */
    for (int pp = 0; pp < RB_PARTS; pp++) {
        for (int off = 0; off < RB_ACKED; off++) assert_int_equal(s2.count[pp][off], 0);
        for (int off = RB_ACKED; off < RB_PER; off++)
            assert_string_equal(s2.event[pp][off], s1.event[pp][off]); /* same event IDs */
    }
    assert_true(b_parts != 0 && b_parts != (1 << RB_PARTS) - 1); /* the partitions were split */
    /* A acks a first-pass delivery of a partition that moved to B: refused, not committed */
    committed("g-rb", "rb", RB_PARTS, c);
    int moved = -1;
    for (int pp = 0; pp < RB_PARTS && moved < 0; pp++)
        if (b_parts & (1 << pp)) moved = pp;
    int64_t before = c[moved];
    for (size_t i = 0; i < got; i++)
        if (first[i].partition == moved && first[i].offset == RB_PER - 1)
            assert_int_equal(a->m->consume_ack(a, &first[i]), OBX_ESTALE);
    committed("g-rb", "rb", RB_PARTS, c);
    assert_int_equal(c[moved], before);
    for (int pp = 0; pp < RB_PARTS; pp++)
        assert_int_equal(c[pp], (b_parts & (1 << pp)) ? RB_PER : RB_ACKED);
    for (size_t i = 0; i < got; i++) obx__delivery_free(&first[i]);
    obx__br_close(bb);
    obx__br_close(a);
}

/* A message without obx headers is still delivered, with header_error set (the inbox parks
 * it). */
static void test_consume_bad_headers(void **st) {
    (void)st;
    topic("bad", 1);
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", boot, err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    assert_int_equal(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("bad"), RD_KAFKA_V_PARTITION(0),
                                       RD_KAFKA_V_VALUE("plain", 5),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
                     0);
    assert_int_equal(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("bad"), RD_KAFKA_V_PARTITION(0),
                                       RD_KAFKA_V_VALUE("half", 4),
                                       RD_KAFKA_V_HEADER(OBX__H_EVENT_ID, "evt-not-a-ulid", -1),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
                     0);
    assert_int_equal(rd_kafka_flush(rk, 10000), 0);
    rd_kafka_destroy(rk);
    obx__broker *b = open_kafka(NULL, group_props, 2);
    const char *topics[] = {"bad"};
    OK(b->m->consume_open(b, "g-bad", topics, 1));
    obx__delivery d[2];
    memset(d, 0, sizeof d);
    size_t got = 0;
    for (int64_t end = now_ms() + 20000; got < 2 && now_ms() < end;) {
        size_t k = 0;
        OK(b->m->consume_poll(b, 100, d + got, 2 - got, &k));
        got += k;
    }
    assert_int_equal(got, 2);
    assert_non_null(strstr(d[0].header_error, "no headers"));
    assert_int_equal(d[0].payload_len, 5);
    assert_memory_equal(d[0].payload, "plain", 5);
    if (!strstr(d[1].header_error, "evt-not-a-ulid"))
        fail_msg("header_error: %s", d[1].header_error);
    OK(b->m->consume_ack(b, &d[1]));
    int64_t cm[1];
    committed("g-bad", "bad", 1, cm);
    assert_int_equal(cm[0], 2);
    obx__delivery_free(&d[0]);
    obx__delivery_free(&d[1]);
    obx__br_close(b);
}

/* A consumer subscribed to a topic the cluster does not have consumes nothing: obx says so,
 * through its log (obx_log_set), once per missing topic and not for one that exists (issue 50). */
static char log_seen[4096];
static void log_capture(int level, const char *component, const char *msg, void *user) {
    (void)user;
    size_t l = strlen(log_seen);
    snprintf(log_seen + l, sizeof log_seen - l, "%d %s %s\n", level, component, msg);
}

static void test_consume_missing_topic_warns(void **st) {
    (void)st;
    topic("present", 1);
    log_seen[0] = '\0';
    obx_log_set(log_capture, NULL);
    obx__broker *b = open_kafka(NULL, group_props, 2);
    const char *topics[] = {"present", "nosuchtopic"};
    OK(b->m->consume_open(b, "g-missing", topics, 2));
    obx__br_close(b);
    obx_log_set(NULL, NULL);
    if (!strstr(log_seen, "2 kafka ") || !strstr(log_seen, "topic 'nosuchtopic' does not exist"))
        fail_msg("no warning about the missing topic: %s", log_seen);
    if (strstr(log_seen, "topic 'present'"))
        fail_msg("a warning about a topic that exists: %s", log_seen);
}

/* ---- interoperability --------------------------------------------------------------------------
 */

/* kcat (a separate process, its own librdkafka) reads the topic from the mock cluster's
 * bootstrap address and sees the obx headers. */
static void test_kcat_reads_headers(void **st) {
    (void)st;
    topic("interop", 2);
    obx__broker *b = open_kafka(NULL, NULL, 0);
    test_msg tm;
    test_msg_init(&tm, "interop", "tenant-7.order.o-1", 1);
    OK(obx__br_partition_for(b, &tm.dest, &tm.msg.partition));
    expect_kind((obx__outcome[]){send_wait(b, &tm, 10000)}, OBX__OUT_ACK);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "kcat -C -b '%s' -t interop -o beginning -e -q -f 'key=%%k partition=%%p "
             "headers=%%h payload=%%s\\n' 2>&1",
             boot);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    int rc = pclose(f);
    if (rc != 0) fail_msg("kcat exited with %d: %s", rc, out);
    char want[256];
    snprintf(want, sizeof want, "obx-event-id=%s", tm.env.event_id);
    if (!strstr(out, want)) fail_msg("kcat output lacks '%s': %s", want, out);
    snprintf(want, sizeof want, "obx-attempt-id=%s", tm.attempt_id);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "obx-payload-digest=%s", tm.env.payload_digest);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "obx-envelope-gen=1"));
    assert_non_null(strstr(out, "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736"));
    snprintf(want, sizeof want, "key=tenant-7.order.o-1 partition=%d", (int)tm.msg.partition);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "payload={\"order\":1}"));
    obx__br_close(b);
}

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "all";
    int failed = 0;
    if (!strcmp(which, "all") || !strcmp(which, "conformance")) {
        /* The mock group coordinator waits session.timeout.ms - 1 s after a member leaves
         * before it lets the next one in (rdkafka_mock_cgrp.c); 6 s is Kafka's minimum. */
        broker_env env = {.label = "broker conformance: kafka (mock cluster)",
                          .fresh = env_fresh,
                          .release = env_release,
                          .props = group_props,
                          .n_props = 2};
        failed += broker_conformance_run(&env);
    }
    if (!strcmp(which, "all") || !strcmp(which, "backend")) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_murmur2_agrees),
            OBX_T_CASE(test_partition_for_matches_producer),
            OBX_T_CASE(test_config_owned_and_secrets),
            OBX_T_CASE(test_nagle_off_by_default),
            cmocka_unit_test(test_mock_accepts_nodelay),
            OBX_T_CASE(test_wake_fd_signals_outcomes),
            OBX_T_CASE(test_cluster_identity),
            OBX_T_CASE(test_lost_ack_unknown_then_found),
            OBX_T_CASE(test_lookup_hashes_every_copy),
            OBX_T_CASE(test_transient_errors_retried),
            OBX_T_CASE(test_broker_down_not_sent),
            OBX_T_CASE(test_definite_errors_reject),
            OBX_T_CASE(test_not_found_after_quiet_then_retry),
            OBX_T_CASE(test_idempotent_retry_duplicates),
            OBX_T_CASE(test_lookup_bounded),
            OBX_T_CASE(test_lookup_large_message_limit),
            OBX_T_CASE(test_group_rebalance_and_lost_commit),
            OBX_T_CASE(test_consume_bad_headers),
            OBX_T_CASE(test_consume_missing_topic_warns),
            OBX_T_CASE(test_kcat_reads_headers),
        };
        failed += cmocka_run_group_tests_name("kafka backend", tests, NULL, NULL);
    }
    return failed;
}
