/*
 * bench_kafka.c — produce rate on librdkafka's mock cluster (3 brokers, 8 partitions), 512-byte
 * payloads, idempotent with acks=all: a plain librdkafka producer without headers, the same
 * with the 14 obx headers, and the obx Kafka backend (send + poll until every outcome is back).
 * Not a test (nothing is asserted); run by hand:  build/tests/bench_kafka [messages]
 * Numbers from one run are comparable with each other only (the machine is shared and noisy).
 */
#include "broker/broker.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PARTS = 8, PAYLOAD = 512, POOL = 1024 };

static long acked;

static void dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (!m->err) acked++;
}

static double raw_rate(const char *boot, long n, bool headers) {
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if (rd_kafka_conf_set(c, "bootstrap.servers", boot, err, sizeof err) ||
        rd_kafka_conf_set(c, "enable.idempotence", "true", err, sizeof err) ||
        rd_kafka_conf_set(c, "acks", "all", err, sizeof err)) {
        fprintf(stderr, "conf: %s\n", err);
        exit(1);
    }
    rd_kafka_conf_set_dr_msg_cb(c, dr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) exit(1);
    static char payload[PAYLOAD];
    memset(payload, 'p', sizeof payload);
    acked = 0;
    int64_t t0 = obx__mono_ms();
    for (long i = 0; i < n; i++) {
        char key[48];
        snprintf(key, sizeof key, "tenant-%ld.order.o-%ld", i % 7, i % 5000);
        rd_kafka_headers_t *h = NULL;
        if (headers) {
            h = rd_kafka_headers_new(14);
            static const char *names[] = {
                OBX__H_EVENT_ID,    OBX__H_ENVELOPE_GEN,   OBX__H_ATTEMPT_ID,
                OBX__H_ATTEMPT_GEN, OBX__H_PAYLOAD_DIGEST, OBX__H_DEST_DIGEST,
                OBX__H_EVENT_TYPE,  OBX__H_TENANT,         OBX__H_AGGREGATE,
                OBX__H_OCCURRED_AT, OBX__H_PAYLOAD_SCHEMA, OBX__H_CORRELATION_ID,
                OBX__H_TRACEPARENT, OBX__H_CAUSATION_ID};
            for (int k = 0; k < 14; k++)
                rd_kafka_header_add(h, names[k], -1,
                                    "sha256:0123456789abcdef0123456789abcdef0123456789abcdef", -1);
        }
        int32_t p = obx__partition("murmur2", key, PARTS);
        for (;;) {
            rd_kafka_resp_err_t e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC("bench"), RD_KAFKA_V_PARTITION(p),
                RD_KAFKA_V_KEY(key, strlen(key)), RD_KAFKA_V_VALUE(payload, sizeof payload),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
            if (!e) break;
            if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                fprintf(stderr, "produce: %s\n", rd_kafka_err2str(e));
                exit(1);
            }
            rd_kafka_poll(rk, 10);
        }
        if (i % 512 == 511) rd_kafka_poll(rk, 0); /* serve reports per batch, as obx does */
    }
    rd_kafka_flush(rk, 60000);
    int64_t ms = obx__mono_ms() - t0;
    rd_kafka_destroy(rk);
    if (acked != n) fprintf(stderr, "raw: only %ld of %ld acknowledged\n", acked, n);
    return (double)n * 1000.0 / (double)(ms ? ms : 1);
}

typedef struct tmsg {
    obx__envelope env;
    obx__dest dest;
    char dest_digest[OBX_DIGEST_LEN + 1];
    char attempt_id[OBX_EVENT_ID_LEN + 1];
} tmsg;

static double obx_rate(const char *boot, long n) {
    char url[600];
    snprintf(url, sizeof url, "kafka://%s", boot);
    obx__broker *b;
    if (obx__br_open(url, NULL, 0, &b)) {
        fprintf(stderr, "open: %s\n", obx_errmsg());
        exit(1);
    }
    static char payload[PAYLOAD];
    memset(payload, 'p', sizeof payload);
    tmsg *pool = calloc(POOL, sizeof *pool);
    obx__msg *m = calloc(POOL, sizeof *m);
    obx__outcome *out = calloc(4096, sizeof *out);
    if (!pool || !m || !out) exit(1);
    for (int i = 0; i < POOL; i++) {
        tmsg *t = &pool[i];
        obx_event_id_new(0, t->env.event_id);
        t->env.envelope_gen = 1;
        strcpy(t->env.aggregate_type, "order");
        snprintf(t->env.aggregate_id, sizeof t->env.aggregate_id, "o-%d", i);
        strcpy(t->env.event_type, "order.created.v1");
        obx_sha256_digest(payload, sizeof payload, t->env.payload_digest);
        strcpy(t->env.tenant, "tenant-7");
        strcpy(t->env.correlation_id, "corr");
        strcpy(t->env.traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        strcpy(t->dest.topic, "bench");
        snprintf(t->dest.routing_key, sizeof t->dest.routing_key, "tenant-%d.order.o-%d", i % 7, i);
        strcpy(t->dest.algorithm, "murmur2");
        obx__dest_digest(&t->dest, t->dest_digest);
        snprintf(t->attempt_id, sizeof t->attempt_id, "att-%s", t->env.event_id + 4);
        m[i] = (obx__msg){&t->env, &t->dest, t->dest_digest, t->attempt_id,
                          1,       0,        payload,        sizeof payload};
        if (obx__br_partition_for(b, &t->dest, &m[i].partition)) exit(1);
    }
    long sent = 0, done = 0, ok = 0;
    int64_t t0 = obx__mono_ms();
    while (done < n) {
        if (sent < n && b->m->in_flight(b) < 50000) {
            size_t k = (size_t)(n - sent < 512 ? n - sent : 512);
            if (obx__br_send(b, m + (sent % POOL < POOL - 512 ? sent % POOL : 0), k,
                             obx__wall_ms()))
                exit(1);
            sent += (long)k;
        }
        size_t got = 0;
        if (obx__br_poll(b, obx__wall_ms(), sent < n ? 0 : 100, out, 4096, &got)) exit(1);
        for (size_t i = 0; i < got; i++) ok += out[i].kind == OBX__OUT_ACK;
        done += (long)got;
    }
    int64_t ms = obx__mono_ms() - t0;
    if (ok != n) fprintf(stderr, "obx: only %ld of %ld ACK\n", ok, n);
    obx__br_close(b);
    free(pool);
    free(m);
    free(out);
    return (double)n * 1000.0 / (double)(ms ? ms : 1);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "log_level", "3", err, sizeof err);
    rd_kafka_t *mrk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(mrk, 3);
    rd_kafka_mock_topic_create(mc, "bench", PARTS, 3);
    const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
    printf("%ld messages of %d bytes, %d partitions, idempotent, acks=all\n", n, PAYLOAD, PARTS);
    for (int round = 1; round <= 3; round++) { /* interleaved: the machine is noisy */
        printf("round %d\n", round);
        printf("  librdkafka, no headers   %9.0f msgs/s\n", raw_rate(boot, n, false));
        printf("  librdkafka, 14 headers   %9.0f msgs/s\n", raw_rate(boot, n, true));
        printf("  obx kafka backend        %9.0f msgs/s\n", obx_rate(boot, n));
    }
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(mrk);
    return 0;
}
