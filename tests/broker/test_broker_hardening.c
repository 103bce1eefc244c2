/*
 * test_broker_hardening.c — the Kafka backend against hostile configuration and a destination
 * that does not exist, on librdkafka's in-process mock cluster (no server).
 *
 *   missing topic   the engine's definite-rejection path: the event is REJECTED (backoff, then
 *                   PARKED) with the broker's reason, and the rest of its batch is published
 *                   (before, a metadata failure left the whole batch CLAIMED, failing forever);
 *   SASL/SCRAM      security.protocol / sasl.* properties reach librdkafka, secrets may come
 *                   from ${ENV} or ${file:PATH}; the mock cluster speaks neither SASL nor TLS,
 *                   so what is tested is what it allows: the client tries SCRAM (the failure
 *                   names the mechanism), a missing variable is a configuration error naming
 *                   the property, and no message ever shows the password;
 *   TLS             a CA file that does not exist is refused naming ssl.ca.location; TLS to a
 *                   plaintext listener fails at the handshake, with that said.
 * Real SASL_SSL clusters: docs/security.md and docs/kafka.md.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"

#include "engine/engine_int.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static rd_kafka_t *mock_rk;
static rd_kafka_mock_cluster_t *mc;
static char boot[512];

static int cluster_up(void **st) {
    (void)st;
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "log_level", "0", err, sizeof err);
    mock_rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!mock_rk) return -1;
    mc = rd_kafka_mock_cluster_new(mock_rk, 1);
    if (!mc) return -1;
    obx__strlcpy(boot, rd_kafka_mock_cluster_bootstraps(mc), sizeof boot);
    return 0;
}

static int cluster_down(void **st) {
    (void)st;
    if (mc) rd_kafka_mock_cluster_destroy(mc);
    if (mock_rk) rd_kafka_destroy(mock_rk);
    mc = NULL;
    mock_rk = NULL;
    return 0;
}

static obx_err try_open(const char *const *props, size_t n, obx__broker **b) {
    char url[600];
    snprintf(url, sizeof url, "kafka://%s", boot);
    *b = NULL;
    return obx__br_open(url, props, n, b);
}

static void test_missing_topic_rejected(void **st) {
    (void)st;
    assert_int_equal(rd_kafka_mock_topic_create(mc, "orders", 2, 1), 0);
    /* the mock creates any topic a metadata request names, unless told it does not exist */
    rd_kafka_mock_topic_set_error(mc, "no-such-topic", RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
    obx__store *s;
    OK(obx__st_open("sqlite::memory:", &s));
    OK(obx_store_init(s));
    int64_t now = obx__wall_ms();
    obx__broker *b;
    const char *props[] = {"topic.metadata.propagation.max.ms=200", "obx.open.timeout.ms=3000"};
    OK(try_open(props, 2, &b));
    char cluster[OBX_NAME_MAX + 1];
    OK(obx__br_cluster_id(b, cluster, sizeof cluster));
    char ids[2][OBX_EVENT_ID_LEN + 1];
    obx_t_missing_topic(s, now, cluster, ids);
    obx__engine e;
    obx_t_engine_backoff(&e, s, b, 50, 100, 0);
    size_t sent = 0, n = 0;
    OK(obx__engine_dispatch(&e, now, &sent));
    assert_int_equal(sent, 1); /* the good one went; the missing topic did not hold it up */
    for (int i = 0; i < 100 && e.st.accepted < 1; i++) OK(obx__engine_poll(&e, now, 100, &n));
    obx_t_missing_topic_backoff(s, ids);
    obx__audit_row *a;
    size_t na;
    OK(s->m->load_audit(s, ids[0], &a, &na));
    int named = 0;
    for (size_t i = 0; i < na; i++)
        named += a[i].to == OBX__ST_PENDING && strstr(a[i].reason, "no-such-topic") &&
                 strstr(a[i].reason, "Unknown topic");
    free(a);
    assert_int_equal(named, 1);
    obx_t_missing_topic_parks(&e, s, now + 1000, ids[0]);
    obx__br_close(b);
    obx__st_close(s);
}

static void test_sasl_scram_properties(void **st) {
    (void)st;
    const char *pw = "Pl4nted-Kafka-Pw";
    setenv("OBX_T_KAFKA_PW", pw, 1);
    unsetenv("OBX_T_KAFKA_MISSING");
    obx__broker *b = NULL;
    /* the password from the environment reaches the client, which tries SCRAM: the mock has no
     * SASL, so the handshake fails — and says so — without showing the password */
    const char *scram[] = {"security.protocol=SASL_PLAINTEXT", "sasl.mechanisms=SCRAM-SHA-256",
                           "sasl.username=obx", "sasl.password=${OBX_T_KAFKA_PW}",
                           "obx.open.timeout.ms=1500"};
    obx_err e = try_open(scram, 5, &b);
    assert_int_not_equal(e, OBX_OK);
    assert_int_not_equal(e, OBX_ECONFIG);
    if (!strstr(obx_errmsg(), "SASL")) fail_msg("no SASL in: %s", obx_errmsg());
    assert_null(strstr(obx_errmsg(), pw));
    /* a variable that is not set is a configuration error naming property and variable */
    const char *missing[] = {"security.protocol=SASL_PLAINTEXT", "sasl.mechanisms=SCRAM-SHA-512",
                             "sasl.password=${OBX_T_KAFKA_MISSING}"};
    assert_int_equal(try_open(missing, 3, &b), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "sasl.password"));
    assert_non_null(strstr(obx_errmsg(), "${OBX_T_KAFKA_MISSING}"));
    /* from a file (a mounted secret): it is read, and the open gets as far as the handshake */
    char path[] = "/tmp/obx-kafka-pw-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, pw, strlen(pw)), (ssize_t)strlen(pw));
    close(fd);
    char prop[128];
    snprintf(prop, sizeof prop, "sasl.password=${file:%s}", path);
    const char *file[] = {"security.protocol=SASL_PLAINTEXT", "sasl.mechanisms=SCRAM-SHA-256",
                          "sasl.username=obx", prop, "obx.open.timeout.ms=1500"};
    e = try_open(file, 5, &b);
    assert_int_not_equal(e, OBX_ECONFIG);
    assert_null(strstr(obx_errmsg(), pw));
    unlink(path);
}

static void test_tls_properties(void **st) {
    (void)st;
    obx__broker *b = NULL;
    const char *no_ca[] = {"security.protocol=SSL", "ssl.ca.location=/nonexistent/ca.pem"};
    assert_int_equal(try_open(no_ca, 2, &b), OBX_ECONFIG);
    if (!strstr(obx_errmsg(), "ssl.ca.location")) fail_msg("not named: %s", obx_errmsg());
    /* TLS to the mock's plaintext listener: refused at the handshake, with that said */
    const char *tls[] = {"security.protocol=SSL", "obx.open.timeout.ms=1500"};
    obx_err e = try_open(tls, 2, &b);
    assert_int_not_equal(e, OBX_OK);
    if (!strstr(obx_errmsg(), "SSL")) fail_msg("no SSL in: %s", obx_errmsg());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_missing_topic_rejected, cluster_up, cluster_down),
        cmocka_unit_test_setup_teardown(test_sasl_scram_properties, cluster_up, cluster_down),
        cmocka_unit_test_setup_teardown(test_tls_properties, cluster_up, cluster_down),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
