/*
 * kafka_mock.c — librdkafka's in-process mock cluster behind obx's public API, so that
 * `obx demo --broker kafka` and tests can run a real Kafka-protocol cluster with no server:
 * other processes (relays, consumers, kcat) reach it through its bootstrap address for as long
 * as the process that started it keeps it.
 */
#include "core/core.h"
#include "obx_test.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdlib.h>
#include <string.h>

struct obx_kafka_mock {
    rd_kafka_t *rk;
    rd_kafka_mock_cluster_t *mc;
};

obx_err obx_kafka_mock_start(int brokers, const char *topic, int partitions, char *bootstraps,
                             size_t cap, obx_kafka_mock **out) {
    if (!out || !bootstraps || !cap) return obx__fail(OBX_EINVAL, "kafka mock: NULL argument");
    if (brokers < 1 || brokers > 9)
        return obx__fail(OBX_EINVAL, "brokers: %d outside 1..9", brokers);
    obx__clear_error();
    *out = NULL;
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "2", NULL, 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return obx__fail(OBX_EBROKER, "kafka mock: %s", err);
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, brokers);
    if (!mc) {
        rd_kafka_destroy(rk);
        return obx__fail(OBX_EBROKER, "kafka mock: cannot create the cluster");
    }
    if (topic && *topic) {
        rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(
            mc, topic, partitions > 0 ? partitions : 8, brokers < 3 ? brokers : 3);
        if (e) {
            rd_kafka_mock_cluster_destroy(mc);
            rd_kafka_destroy(rk);
            return obx__fail(OBX_EBROKER, "kafka mock: topic %s: %s", topic, rd_kafka_err2str(e));
        }
    }
    obx_kafka_mock *m = calloc(1, sizeof *m);
    if (!m) {
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(rk);
        return obx__fail(OBX_ENOMEM, "kafka mock: out of memory");
    }
    m->rk = rk;
    m->mc = mc;
    if (obx__strlcpy(bootstraps, rd_kafka_mock_cluster_bootstraps(mc), cap) >= cap) {
        obx_kafka_mock_stop(m);
        return obx__fail(OBX_ETOOBIG, "kafka mock: bootstrap list longer than %zu bytes", cap - 1);
    }
    *out = m;
    return OBX_OK;
}

void obx_kafka_mock_stop(obx_kafka_mock *m) {
    if (!m) return;
    rd_kafka_mock_cluster_destroy(m->mc);
    rd_kafka_destroy(m->rk);
    free(m);
}
