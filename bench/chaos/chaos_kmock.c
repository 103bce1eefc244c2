/*
 * chaos_kmock.c — owns the Kafka-protocol cluster of the chaos soak (scripts/chaos.sh) and
 * injects its faults. librdkafka's mock cluster lives inside one process; the relays, the
 * consumers and the verifier's kcat are other processes that reach it through its bootstrap
 * list. This program creates the cluster and the topics, prints
 *     bootstraps HOST:PORT,HOST:PORT,...
 * on stdout, then executes one fault command per line of stdin and answers "ok CMD" or
 * "err CMD: why" on stdout:
 *     down B                  broker B (1..N) stops answering: connections are closed
 *     up B                    broker B back
 *     leader TOPIC PART B     partition leader moves to broker B (-1: no leader)
 *     error B ERRNAME [N]     broker B answers its next N (1) Produce requests with ERRNAME
 *                             (a librdkafka error name without RD_KAFKA_RESP_ERR_, e.g.
 *                             NOT_LEADER_FOR_PARTITION), after appending nothing
 *     delay B RTT_MS [N]      broker B answers its next N (1) Produce requests RTT_MS late,
 *                             having stored the messages: with RTT_MS past the producer's
 *                             message.timeout.ms the ACK is lost (POSSIBLY_PERSISTED)
 *     quit                    (or end of input) destroys the cluster and exits
 * Broker-level error stacks only: a broker-level stack shadows cluster-level pushes for the
 * same API on that broker (librdkafka 2.0), so mixing the two would drop faults silently.
 *
 *   chaos_kmock [--brokers N] [--topic NAME:PARTITIONS]...
 */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API_PRODUCE 0 /* Kafka protocol API key (librdkafka keeps RD_KAFKAP_* private) */

static int err_by_name(const char *name, rd_kafka_resp_err_t *out) {
    const struct rd_kafka_err_desc *d;
    size_t n;
    rd_kafka_get_err_descs(&d, &n);
    for (size_t i = 0; i < n; i++)
        if (d[i].name && !strcmp(d[i].name, name)) {
            *out = d[i].code;
            return 0;
        }
    return -1;
}

static void reply(const char *cmd, const char *err) {
    if (err)
        printf("err %s: %s\n", cmd, err);
    else
        printf("ok %s\n", cmd);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int brokers = 3;
    const char *topics[16];
    int ntopics = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--brokers") && i + 1 < argc)
            brokers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--topic") && i + 1 < argc && ntopics < 16)
            topics[ntopics++] = argv[++i];
        else {
            fprintf(stderr, "usage: chaos_kmock [--brokers N] [--topic NAME:PARTITIONS]...\n");
            return 2;
        }
    }
    if (brokers < 1 || brokers > 9) {
        fprintf(stderr, "chaos_kmock: --brokers: %d outside 1..9\n", brokers);
        return 2;
    }
    char errstr[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "2", NULL, 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (!rk) {
        fprintf(stderr, "chaos_kmock: %s\n", errstr);
        return 1;
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, brokers);
    if (!mc) {
        fprintf(stderr, "chaos_kmock: cannot create the mock cluster\n");
        return 1;
    }
    for (int i = 0; i < ntopics; i++) {
        char name[256];
        snprintf(name, sizeof name, "%s", topics[i]);
        char *colon = strchr(name, ':');
        int parts = colon ? atoi(colon + 1) : 8;
        if (colon) *colon = '\0';
        rd_kafka_resp_err_t e =
            rd_kafka_mock_topic_create(mc, name, parts > 0 ? parts : 8, brokers < 3 ? brokers : 3);
        if (e) {
            fprintf(stderr, "chaos_kmock: topic %s: %s\n", name, rd_kafka_err2str(e));
            return 1;
        }
    }
    printf("bootstraps %s\n", rd_kafka_mock_cluster_bootstraps(mc));
    fflush(stdout);
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = '\0';
        char verb[32] = "", a[256] = "", b[64] = "", c[64] = "";
        int n = sscanf(line, "%31s %255s %63s %63s", verb, a, b, c);
        if (n < 1) continue;
        rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR_NO_ERROR;
        if (!strcmp(verb, "quit")) break;
        if (!strcmp(verb, "down") && n == 2)
            e = rd_kafka_mock_broker_set_down(mc, atoi(a));
        else if (!strcmp(verb, "up") && n == 2)
            e = rd_kafka_mock_broker_set_up(mc, atoi(a));
        else if (!strcmp(verb, "leader") && n == 4)
            e = rd_kafka_mock_partition_set_leader(mc, a, atoi(b), atoi(c));
        else if (!strcmp(verb, "error") && n >= 3) {
            rd_kafka_resp_err_t code;
            if (err_by_name(b, &code)) {
                reply(line, "unknown error name");
                continue;
            }
            int cnt = n == 4 ? atoi(c) : 1;
            for (int k = 0; k < cnt && !e; k++)
                e = rd_kafka_mock_broker_push_request_error_rtts(mc, atoi(a), API_PRODUCE, 1, code,
                                                                 0);
        } else if (!strcmp(verb, "delay") && n >= 3) {
            int cnt = n == 4 ? atoi(c) : 1;
            for (int k = 0; k < cnt && !e; k++)
                e = rd_kafka_mock_broker_push_request_error_rtts(
                    mc, atoi(a), API_PRODUCE, 1, RD_KAFKA_RESP_ERR_NO_ERROR, atoi(b));
        } else {
            reply(line, "unknown command or wrong arguments");
            continue;
        }
        reply(line, e ? rd_kafka_err2str(e) : NULL);
    }
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
    return 0;
}
