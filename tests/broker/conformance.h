/*
 * conformance.h — the broker conformance suite every broker backend must pass against its real
 * server (or, for Kafka, librdkafka's in-process mock cluster).
 */
#ifndef OBX_TEST_BROKER_CONFORMANCE_H
#define OBX_TEST_BROKER_CONFORMANCE_H

#include "broker/broker.h"

typedef struct broker_env {
    const char *label;
    /* Prepares a fresh, empty cluster (or namespace) for one test and writes the URL that
     * reaches it. The topic (AMQP: exchange) `topic` must exist afterwards with `partitions`
     * partitions where the backend has partitions, and `consume_from` (AMQP: a queue bound to
     * the exchange; others: the topic) must receive what is published to it. */
    obx_err (*fresh)(void *user, const char *topic, int partitions, char *url, size_t cap);
    /* Releases what fresh() created (may be NULL). */
    void (*release)(void *user);
    /* Extra backend properties for obx__br_open (may be NULL/0). */
    const char *const *props;
    size_t n_props;
    void *user;
    /* What the consumer subscribes to for topic T: "%s" = T (Kafka, log) or a queue name. */
    const char *consume_fmt;
} broker_env;

/* Runs every conformance test; returns the number of failed tests (cmocka). */
int broker_conformance_run(const broker_env *env);

/* Builds a message for tests (payload, envelope and destination owned by tm). */
typedef struct test_msg {
    obx__envelope env;
    obx__dest dest;
    char dest_digest[OBX_DIGEST_LEN + 1];
    char attempt_id[OBX_EVENT_ID_LEN + 1];
    char payload[64];
    obx__msg msg;
} test_msg;

void test_msg_init(test_msg *tm, const char *topic, const char *key, int seq);

#endif
